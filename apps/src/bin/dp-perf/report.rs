//! perftest-shaped output: the same columns and JSON keys, plus p99.99.

use crate::args::Args;
use crate::bw::Bw;
use hdrhistogram::Histogram;
use std::io::Write;
use std::time::{Duration, Instant};

const RULE: &str = "---------------------------------------------------------------------------------------";

/// Prints the table header for the test kind.
pub fn header(args: &Args) {
    if args.json {
        return;
    }
    println!("{RULE}");
    if args.test.is_lat() {
        println!(
            " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec]   99.99% percentile[usec]"
        );
    } else {
        let unit = if args.gbits { "Gb/sec" } else { "MB/sec" };
        println!(" #bytes     #iterations    BW peak[{unit}]    BW average[{unit}]   MsgRate[Mpps]");
    }
}

fn bw_unit(args: &Args, bytes_per_sec: f64) -> f64 {
    if args.gbits {
        bytes_per_sec * 8.0 / 1e9
    } else {
        bytes_per_sec / (1 << 20) as f64
    }
}

/// One bandwidth line.
pub fn bw(args: &Args, size: u64, r: &Bw) {
    let avg = r.iters as f64 / r.secs;
    let (peak_bw, avg_bw) = (bw_unit(args, r.peak * size as f64), bw_unit(args, avg * size as f64));
    if args.json {
        println!(
            "{{\"test\":\"{:?}\",\"MsgSize\":{size},\"n_iterations\":{},\"BW_peak\":{peak_bw:.2},\"BW_average\":{avg_bw:.2},\"MsgRate\":{:.6},\"unit\":\"{}\"}}",
            args.test,
            r.iters,
            avg / 1e6,
            if args.gbits { "Gb/sec" } else { "MB/sec" }
        );
    } else {
        println!(" {size:<10} {:<16} {peak_bw:<18.2} {avg_bw:<20.2} {:.6}", r.iters, avg / 1e6);
    }
}

/// One latency line (microseconds).
pub fn lat(args: &Args, size: u64, h: &Histogram<u64>) {
    let us = |ns: u64| ns as f64 / 1000.0;
    let q = |p: f64| us(h.value_at_quantile(p));
    let (min, max, typ, avg, sd) = (us(h.min()), us(h.max()), q(0.5), h.mean() / 1000.0, h.stdev() / 1000.0);
    if args.json {
        println!(
            "{{\"test\":\"{:?}\",\"MsgSize\":{size},\"n_iterations\":{},\"t_min\":{min:.2},\"t_max\":{max:.2},\"t_typical\":{typ:.2},\"t_avg\":{avg:.2},\"t_stdev\":{sd:.2},\"99%\":{:.2},\"99.9%\":{:.2},\"99.99%\":{:.2}}}",
            args.test,
            h.len(),
            q(0.99),
            q(0.999),
            q(0.9999)
        );
    } else {
        println!(
            " {size:<7} {:<11} {min:<14.2} {max:<14.2} {typ:<16.2} {avg:<14.2} {sd:<15.2} {:<22.2} {:<24.2} {:.2}",
            h.len(),
            q(0.99),
            q(0.999),
            q(0.9999)
        );
    }
}

/// Appends the histogram in HdrHistogram's percentile-distribution text format (values in
/// microseconds), which HdrHistogram's plotters read.
pub fn write_histogram(path: &std::path::Path, size: u64, h: &Histogram<u64>) -> std::io::Result<()> {
    let mut f = std::fs::OpenOptions::new().create(true).append(true).open(path)?;
    writeln!(f, "# dp-perf message size {size} bytes")?;
    writeln!(f, "{:>12} {:>14} {:>10} {:>14}\n", "Value", "Percentile", "TotalCount", "1/(1-Percentile)")?;
    for v in h.iter_quantiles(4) {
        let p = v.quantile_iterated_to();
        let inv = if p < 1.0 { format!("{:.2}", 1.0 / (1.0 - p)) } else { "inf".into() };
        writeln!(
            f,
            "{:>12.3} {:>14.12} {:>10} {:>14}",
            v.value_iterated_to() as f64 / 1000.0,
            p,
            v.count_since_last_iteration(),
            inv
        )?;
    }
    writeln!(f, "#[Mean = {:.3}, StdDeviation = {:.3}]", h.mean() / 1000.0, h.stdev() / 1000.0)?;
    writeln!(f, "#[Max = {:.3}, Total count = {}]", h.max() as f64 / 1000.0, h.len())?;
    Ok(())
}

/// A progress line on stderr for runs longer than a few seconds.
pub struct Progress {
    start: Instant,
    last: Instant,
}

impl Progress {
    /// Starts timing.
    pub fn new(start: Instant) -> Progress {
        Progress { start, last: start }
    }

    /// Prints progress at most every 2 s, after the first 3 s.
    pub fn tick(&mut self, now: Instant, done: u64, total: u64) {
        if now.duration_since(self.start) < Duration::from_secs(3)
            || now.duration_since(self.last) < Duration::from_secs(2)
        {
            return;
        }
        self.last = now;
        let el = now.duration_since(self.start).as_secs_f64();
        if total == u64::MAX {
            eprintln!("dp-perf: {el:.0} s, {done} operations, {:.3} Mops/s", done as f64 / el / 1e6);
        } else {
            eprintln!("dp-perf: {:.0}% ({done}/{total}) after {el:.0} s", done as f64 * 100.0 / total as f64);
        }
    }
}

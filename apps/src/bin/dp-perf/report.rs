//! perftest-shaped output: the same columns and JSON keys, plus p99.99.

use crate::args::{Args, Conn, Mode, Test};
use crate::bw::Bw;
use hdrhistogram::Histogram;
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

const RULE: &str = "---------------------------------------------------------------------------------------";

/// Latency percentiles of one run, in nanoseconds (also what the client sends the server).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Lat {
    /// Samples.
    pub n: u64,
    /// Minimum.
    pub min: f64,
    /// Maximum.
    pub max: f64,
    /// Median (perftest's t_typical).
    pub typical: f64,
    /// Mean.
    pub avg: f64,
    /// Standard deviation.
    pub stdev: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
    /// 99.99th percentile.
    pub p9999: f64,
}

impl Lat {
    /// The summary of a histogram of nanosecond samples.
    pub fn of(h: &Histogram<u64>) -> Lat {
        let q = |p: f64| h.value_at_quantile(p) as f64;
        Lat {
            n: h.len(),
            min: h.min() as f64,
            max: h.max() as f64,
            typical: q(0.5),
            avg: h.mean(),
            stdev: h.stdev(),
            p99: q(0.99),
            p999: q(0.999),
            p9999: q(0.9999),
        }
    }

    /// Space-separated fields, for the control connection.
    pub fn to_wire(self) -> String {
        let s = self;
        format!("{} {} {} {} {} {} {} {} {}", s.n, s.min, s.max, s.typical, s.avg, s.stdev, s.p99, s.p999, s.p9999)
    }

    /// Parses [`Lat::to_wire`]'s output.
    pub fn from_wire(text: &str) -> Option<Lat> {
        let v: Vec<f64> = text.split(' ').map(str::parse).collect::<Result<_, _>>().ok()?;
        let [n, min, max, typical, avg, stdev, p99, p999, p9999] = v[..] else { return None };
        Some(Lat { n: n as u64, min, max, typical, avg, stdev, p99, p999, p9999 })
    }
}

impl Bw {
    /// Space-separated fields, for the control connection.
    pub fn to_wire(self) -> String {
        format!("{} {} {} {}", self.iters, self.ops, self.secs, self.peak)
    }

    /// Parses [`Bw::to_wire`]'s output.
    pub fn from_wire(text: &str) -> Option<Bw> {
        let mut it = text.split(' ');
        let b = Bw {
            iters: it.next()?.parse().ok()?,
            ops: it.next()?.parse().ok()?,
            secs: it.next()?.parse().ok()?,
            peak: it.next()?.parse().ok()?,
        };
        (it.next().is_none() && b.secs > 0.0).then_some(b)
    }
}

/// Facts about the run for the header and JSON's `test_info`.
pub struct Info {
    /// Device name (`rxe0`, `shm:FABRIC`).
    pub device: String,
    /// Provider name.
    pub provider: &'static str,
    /// `Ethernet` (RoCE), `IB`, or `shm`.
    pub link: &'static str,
    /// Path MTU in bytes.
    pub mtu: u32,
    /// Inline threshold in effect.
    pub inline: u32,
    /// Outstanding reads/atomics per QP (read and atomic tests).
    pub out_reads: u32,
}

/// Where results go: the table on stdout and/or JSON lines.
pub struct Report {
    json: Option<Box<dyn Write>>,
    table: bool,
    info: Info,
}

impl Report {
    /// Opens the JSON destination (truncating a file, as perftest does) and prints the header.
    pub fn new(args: &Args, info: Info) -> std::io::Result<Report> {
        let (json, table): (Option<Box<dyn Write>>, bool) = match args.json_path() {
            None => (None, true),
            Some(p) if p == Path::new("-") => (Some(Box::new(std::io::stdout())), false),
            Some(p) => (Some(Box::new(std::fs::File::create(&p)?)), true),
        };
        let r = Report { json, table, info };
        if r.table {
            r.header(args);
        }
        Ok(r)
    }

    fn header(&self, args: &Args) {
        let i = &self.info;
        println!("{RULE}");
        println!("                    {}", title(args.test, args.post_list));
        println!(
            " Provider: {}  Device: {}  Link type: {}  MTU: {}  Connection: {:?}  QPs: {}  SRQ: {}",
            i.provider,
            i.device,
            i.link,
            i.mtu,
            args.conn,
            args.qps,
            if args.use_srq { "ON" } else { "OFF" }
        );
        println!(
            " TX depth: {}  RX depth: {}  CQ moderation: {}  Post list: {}  Inline: {}  Exchange: {}",
            args.tx_depth,
            args.rx_depth,
            args.cq_mod,
            args.post_list,
            i.inline,
            exchange(args)
        );
        if args.bidirectional {
            println!(" Bidirectional: both ends send -n messages per QP; the rates are the sum of both directions");
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

    /// One bandwidth line (and JSON object).
    pub fn bw(&mut self, args: &Args, size: u64, r: &Bw) -> std::io::Result<()> {
        let avg = r.ops as f64 / r.secs;
        let (peak_bw, avg_bw) = (bw_unit(args, r.peak * size as f64), bw_unit(args, avg * size as f64));
        if self.table {
            println!(" {size:<10} {:<16} {peak_bw:<18.2} {avg_bw:<20.2} {:.6}", r.iters, avg / 1e6);
        }
        let results = format!(
            "\"MsgSize\":{size},\"n_iterations\":{},\"BW_peak\":{peak_bw:.2},\"BW_average\":{avg_bw:.2},\"MsgRate\":{:.6}",
            r.iters,
            avg / 1e6
        );
        self.json_line(args, &results)
    }

    /// One latency line (microseconds; and JSON object, which also carries the median in
    /// nanoseconds, `t_typical_ns`: perftest's two decimals of a microsecond are 10 ns steps,
    /// a sixth of an 8-byte shm latency).
    pub fn lat(&mut self, args: &Args, size: u64, l: &Lat) -> std::io::Result<()> {
        let us = |ns: f64| ns / 1000.0;
        let (min, max, typ, avg, sd) = (us(l.min), us(l.max), us(l.typical), us(l.avg), us(l.stdev));
        let (p99, p999, p9999) = (us(l.p99), us(l.p999), us(l.p9999));
        if self.table {
            println!(
                " {size:<7} {:<11} {min:<14.2} {max:<14.2} {typ:<16.2} {avg:<14.2} {sd:<15.2} {p99:<22.2} {p999:<24.2} {p9999:.2}",
                l.n
            );
        }
        let results = format!(
            "\"MsgSize\":{size},\"n_iterations\":{},\"t_min\":{min:.2},\"t_max\":{max:.2},\"t_typical\":{typ:.2},\"t_avg\":{avg:.2},\"t_stdev\":{sd:.2},\"percentile_99\":{p99:.2},\"percentile_99.9\":{p999:.2},\"percentile_99.99\":{p9999:.2},\"t_typical_ns\":{:.0}",
            l.n, l.typical
        );
        self.json_line(args, &results)
    }

    /// Writes `{"test_info":{...},"results":{...}}` on one line.
    fn json_line(&mut self, args: &Args, results: &str) -> std::io::Result<()> {
        let Some(out) = self.json.as_mut() else { return Ok(()) };
        let i = &self.info;
        let mut info = format!(
            "\"test\":\"{}\",\"Provider\":\"{}\",\"Dual_port\":\"OFF\",\"Device\":\"{}\",\"Number_of_qps\":{},\"Transport_type\":\"{}\",\"Connection_type\":\"{:?}\",\"Using_SRQ\":\"{}\"",
            title(args.test, args.post_list).replace(' ', "_"),
            i.provider,
            json_escape(&i.device),
            args.qps,
            if i.provider == "shm" { "shm" } else { "IB" },
            args.conn,
            if args.use_srq { "ON" } else { "OFF" },
        );
        if !args.test.is_lat() {
            info += &format!(",\"TX_depth\":{},\"CQ_Moderation\":{}", args.tx_depth, args.cq_mod);
            if args.post_list > 1 {
                info += &format!(",\"Post_List\":{}", args.post_list);
            }
        }
        if args.test.is_send() {
            info += &format!(",\"RX_depth\":{}", args.rx_depth);
        }
        if args.bidirectional {
            // Only with -b, so that one-way results keep perftest's keys exactly.
            info += ",\"Bidirectional\":\"ON\"";
        }
        info += &format!(",\"Mtu\":{},\"Link_type\":\"{}\",\"GID_index\":{}", i.mtu, i.link, args.gid_index);
        if matches!(args.test, Test::read_bw | Test::read_lat | Test::atomic_bw | Test::atomic_lat) {
            info += &format!(",\"Outstand_reads\":{}", i.out_reads);
        } else {
            info += &format!(",\"Max_inline_data\":{}", i.inline);
        }
        info += &format!(",\"rdma_cm_QPs\":\"OFF\",\"Data_ex_method\":\"{}\"", exchange(args));
        writeln!(out, "{{\"test_info\":{{{info}}},\"results\":{{{results}}}}}")?;
        out.flush()
    }
}

/// perftest's test title: "Send BW Test", "RDMA Write Latency Test", "Atomic FETCH_AND_ADD ...".
fn title(test: Test, post_list: u32) -> String {
    let verb = match test {
        Test::send_bw | Test::send_lat => "Send",
        Test::write_bw | Test::write_lat => "RDMA Write",
        Test::read_bw | Test::read_lat => "RDMA Read",
        Test::atomic_bw | Test::atomic_lat => "Atomic FETCH_AND_ADD",
    };
    let kind = if test.is_lat() {
        "Latency"
    } else if post_list > 1 {
        "Post List BW"
    } else {
        "BW"
    };
    format!("{verb} {kind} Test")
}

/// How the ends exchanged their addresses.
fn exchange(args: &Args) -> &'static str {
    match args.mode() {
        Mode::Loopback => "loopback",
        _ => "Ethernet",
    }
}

fn json_escape(s: &str) -> String {
    s.chars().flat_map(|c| if c == '"' || c == '\\' { vec!['\\', c] } else { vec![c] }).collect()
}

fn bw_unit(args: &Args, bytes_per_sec: f64) -> f64 {
    if args.gbits {
        bytes_per_sec * 8.0 / 1e9
    } else {
        bytes_per_sec / (1 << 20) as f64
    }
}

/// The largest UD message for a path MTU (UD cannot fragment).
pub fn ud_max(conn: Conn, mtu: u32) -> u64 {
    if conn == Conn::UD {
        mtu as u64
    } else {
        u64::MAX
    }
}

/// Appends the histogram in HdrHistogram's percentile-distribution text format (values in
/// microseconds), which HdrHistogram's plotters read.
pub fn write_histogram(path: &Path, size: u64, h: &Histogram<u64>) -> std::io::Result<()> {
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
        self.print(now, done, total);
    }

    #[cold]
    fn print(&self, now: Instant, done: u64, total: u64) {
        let el = now.duration_since(self.start).as_secs_f64();
        if total == u64::MAX {
            eprintln!("dp-perf: {el:.0} s, {done} operations, {:.3} Mops/s", done as f64 / el / 1e6);
        } else {
            eprintln!("dp-perf: {:.0}% ({done}/{total}) after {el:.0} s", done as f64 * 100.0 / total as f64);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_survive_the_wire() {
        let b = Bw { iters: 10, ops: 20, secs: 0.5, peak: 123.25 };
        assert_eq!(Bw::from_wire(&b.to_wire()), Some(b));
        assert_eq!(Bw::from_wire("1 2 0 4"), None, "zero seconds");
        assert_eq!(Bw::from_wire("1 2 x 4"), None);
        let l = Lat { n: 5, min: 1.0, max: 9.5, typical: 2.0, avg: 3.25, stdev: 0.5, p99: 8.0, p999: 9.0, p9999: 9.5 };
        assert_eq!(Lat::from_wire(&l.to_wire()), Some(l));
        assert_eq!(Lat::from_wire("1 2 3"), None);
    }

    #[test]
    fn perftest_titles() {
        assert_eq!(title(Test::send_bw, 1), "Send BW Test");
        assert_eq!(title(Test::write_lat, 1), "RDMA Write Latency Test");
        assert_eq!(title(Test::atomic_bw, 32), "Atomic FETCH_AND_ADD Post List BW Test");
    }
}

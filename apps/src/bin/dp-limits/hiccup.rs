//! `hiccup`: how often, and for how long, a pinned busy-polling thread stops running on
//! these cores (jHiccup's idea). A worker of an open-loop pipeline delays every message that
//! arrives while it is stopped, so these stalls are the floor of a pipeline's tail latency on
//! this machine: a p99 made of them belongs to the machine (hypervisor, interrupts, other
//! tasks), not to the runtime.
//!
//! One thread per core (`--core` and `--peer-core`), each reading the clock in a tight loop
//! and recording every gap between two reads longer than [`MIN_GAP_NS`].

use super::pin;
use hdrhistogram::Histogram;
use std::time::{Duration, Instant};

/// Gaps shorter than this are the loop itself (a clock read takes tens of ns).
const MIN_GAP_NS: u64 = 1_000;

/// One core's result.
struct CoreGaps {
    core: usize,
    gaps: Histogram<u64>,
    /// Nanoseconds lost in gaps of at least [`MIN_GAP_NS`].
    lost_ns: u64,
}

fn watch(core: usize, dur: Duration) -> CoreGaps {
    pin(core);
    let mut gaps = Histogram::<u64>::new_with_bounds(MIN_GAP_NS, 60_000_000_000, 3).expect("histogram bounds");
    let mut lost_ns = 0;
    let start = Instant::now();
    let mut last = start;
    loop {
        let now = Instant::now();
        let gap = now.duration_since(last).as_nanos() as u64;
        if gap >= MIN_GAP_NS {
            gaps.record(gap.min(gaps.high())).ok();
            lost_ns += gap;
        }
        last = now;
        if now.duration_since(start) >= dur {
            return CoreGaps { core, gaps, lost_ns };
        }
    }
}

/// Watches both cores for `secs` seconds and prints, per core, the gaps per second above
/// 10 us, 100 us and 1 ms, the longest, and the share of the time lost.
pub fn run(core: usize, peer: usize, json: bool, secs: f64) {
    if !(secs > 0.0 && secs <= 3600.0) {
        eprintln!("dp-limits: hiccup needs 0 < --duration <= 3600 seconds");
        std::process::exit(2);
    }
    let dur = Duration::from_secs_f64(secs);
    let t = std::thread::spawn(move || watch(peer, dur));
    let mine = watch(core, dur);
    let theirs = t.join().expect("peer thread");
    let mut rows = Vec::new();
    for g in [mine, theirs] {
        let above = |ns: u64| {
            g.gaps.iter_recorded().filter(|v| v.value_iterated_to() >= ns).map(|v| v.count_at_value()).sum::<u64>()
        };
        let per_s = |ns: u64| above(ns) as f64 / secs;
        let (max_us, lost) = (g.gaps.max() as f64 / 1e3, g.lost_ns as f64 / (secs * 1e9));
        if json {
            rows.push(format!(
                "{{\"core\":{},\"per_s_10us\":{:.2},\"per_s_100us\":{:.2},\"per_s_1ms\":{:.2},\"max_us\":{max_us:.1},\"lost\":{lost:.6}}}",
                g.core,
                per_s(10_000),
                per_s(100_000),
                per_s(1_000_000)
            ));
        } else {
            println!(
                "core {}: gaps per second >= 10 us {:.1}, >= 100 us {:.1}, >= 1 ms {:.2}; longest {max_us:.1} us; time lost {:.4}%",
                g.core,
                per_s(10_000),
                per_s(100_000),
                per_s(1_000_000),
                lost * 100.0
            );
        }
    }
    if json {
        println!("{{\"test\":\"hiccup\",\"seconds\":{secs},\"cores\":[{}]}}", rows.join(","));
    }
}

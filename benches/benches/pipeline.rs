//! End-to-end benchmark of the echo pipeline (`config/examples/echo.toml` with the source
//! unpaced): doorbell batch 1 vs 32, reporting messages/s and doorbells per message.
//!
//! A plain `main` (harness = false), not criterion: each variant is one multi-second run of
//! two pinned workers, which criterion's sampling would repeat for minutes.
//!
//!     cargo bench -p dataplane-benches --bench pipeline [-- SECONDS]

use dataplane_apps::runner::{self, RunOptions};
use dataplane_config::{Config, ValidationEnv};
use std::sync::atomic::AtomicBool;
use std::time::Duration;

fn main() {
    let secs: f64 = std::env::args().skip(1).find_map(|a| a.parse().ok()).unwrap_or(2.0);
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../config/examples/echo.toml");
    let text = std::fs::read_to_string(path).expect("read echo.toml");
    // Unpaced and unlimited: measure what the pipeline can carry. A short RNR timer (10 us
    // instead of 0.64 ms), because an unpaced source overruns the echo's SRQ and the sender
    // then waits out RNR NAKs (there is no credit-based flow control yet).
    let text = text
        .replace("rate = 100_000 ", "rate = \"max\"")
        .replace("duration = \"10s\"", "")
        .replace("peer = \"server-qp\"", "peer = \"server-qp\"\nmin_rnr_timer = 1")
        .replace("peer = \"client-qp\"", "peer = \"client-qp\"\nmin_rnr_timer = 1");
    let cfg = Config::from_str(&text, path).expect("parse");
    if let Err(e) = cfg.validate(&ValidationEnv::detect()) {
        eprintln!("{e}");
        std::process::exit(1);
    }
    let stop = AtomicBool::new(false);
    println!("echo pipeline, 64 B, source unpaced, {secs} s per run");
    println!(
        "{:>14} {:>14} {:>14} {:>12} {:>8} {:>10}",
        "doorbell_batch", "msgs/s (rx)", "doorbells/msg", "p50 rtt ns", "leaked", "gaps"
    );
    for batch in [1u32, 32] {
        let opts = RunOptions {
            duration: Some(Duration::from_secs_f64(secs)),
            doorbell_batch: Some(batch),
            fabric: Some(format!("bench-pipeline-{}-{batch}", std::process::id())),
            no_pin: false,
            no_stats: false,
        };
        let r = runner::run(&cfg, &dataplane_apps::stages::Registry::new(), &opts, &stop).unwrap_or_else(|e| {
            eprintln!("{e}");
            std::process::exit(1)
        });
        let (tx, db): (u64, u64) = r.workers.iter().fold((0, 0), |(t, d), w| (t + w.tx_msgs, d + w.doorbells));
        let sink = r.workers.iter().flat_map(|w| &w.stages).find(|s| s.kind == "sink").expect("sink");
        let p50 = dataplane_apps::report::latency(sink).map_or(0, |l| l.1);
        println!(
            "{:>14} {:>14.0} {:>14.4} {:>12} {:>8} {:>10}",
            batch,
            sink.msgs_in as f64 / r.elapsed.as_secs_f64(),
            db as f64 / tx.max(1) as f64,
            p50,
            dataplane_apps::report::total_leaked(&r),
            dataplane_apps::report::total_gaps(&r)
        );
    }
}

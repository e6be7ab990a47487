//! `dp-limits copy` reports the fastest of its slot layouts: a limit taken from one layout
//! (a ring streaming through memory) did not bound a transport reusing cached buffers.

// Shared JSON helpers; this test uses a few of them.
#[allow(dead_code)]
mod support;

use std::process::Command;
use support::Json;

#[test]
fn copy_reports_the_best_of_its_layouts() {
    // Unpinned cores may be shared: only the bookkeeping is checked, not the speed.
    let out = Command::new(env!("CARGO_BIN_EXE_dp-limits"))
        .args(["--json", "copy", "-s", "4096", "-n", "2000", "--slots", "64"])
        .output()
        .expect("run dp-limits");
    assert!(out.status.success(), "dp-limits failed: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let j = Json::parse(text.lines().last().expect("a JSON line")).unwrap();
    // Every layout `copy` runs (dp-limits' `LAYOUTS`): a list missing one made this test
    // flaky once session 23 added the batched layouts, which win some runs.
    let layouts =
        ["ring", "ring-padded", "cached-16", "cached-16-padded", "cached-64-batch-32", "cached-64-batch-32-padded"];
    let each: Vec<f64> = layouts.iter().map(|l| j.get("layouts_MBs").get(l).num()).collect();
    assert!(each.iter().all(|&v| v > 0.0), "every layout ran: {each:?}");
    let best = each.iter().cloned().fold(0.0, f64::max);
    let reported = j.get("BW_average").num();
    // Both printed with two decimals.
    assert!((reported - best).abs() < 0.01, "BW_average {reported} is the best layout's {best} ({each:?})");
    let named = layouts.iter().position(|l| *l == j.get("layout").str()).expect("a known layout");
    assert!((each[named] - best).abs() < 0.01, "the named layout is the fastest");
}

/// Runs `dp-limits --json ARGS` and returns its last line as JSON, asserting it succeeded.
fn limits_json(args: &[&str]) -> Json {
    let out = Command::new(env!("CARGO_BIN_EXE_dp-limits")).arg("--json").args(args).output().expect("run dp-limits");
    assert!(out.status.success(), "dp-limits {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    Json::parse(text.lines().last().expect("a JSON line")).unwrap()
}

#[test]
fn fifo_streams_deliver_every_message_in_order() {
    // The receiver checks each message's sequence number, length and immediate and exits
    // non-zero on the first wrong one; post lists that do not divide the count and a FIFO
    // wrapping many times (512 cells, a send queue of 16) are both covered.
    // The last: more messages in flight than the FIFO's 512 cells, so senders wait for their
    // lap.
    for (size, list, depth) in [("8", "1", "128"), ("48", "7", "16"), ("20", "32", "128"), ("8", "32", "2048")] {
        let args = ["fifo-bw", "-s", size, "-n", "20000", "-l", list, "-t", depth];
        let j = limits_json(&args);
        assert_eq!(j.get("iters").num(), 20000.0);
        assert_eq!(j.get("MsgSize").num(), size.parse::<f64>().unwrap());
        assert!(j.get("MsgRate").num() > 0.0, "a rate was measured");
    }
}

#[test]
fn fifo_ping_pong_reports_its_latency() {
    let j = limits_json(&["fifo-lat", "-n", "2000"]);
    let (min, p50, p99) = (j.get("min_ns").num(), j.get("p50_ns").num(), j.get("p99_ns").num());
    assert!(min >= 1.0 && min <= p50 && p50 <= p99, "ordered percentiles: {min} {p50} {p99}");
}

#[test]
fn fifo_refuses_sizes_a_cell_cannot_carry() {
    for size in ["4", "49"] {
        let out = Command::new(env!("CARGO_BIN_EXE_dp-limits"))
            .args(["fifo-bw", "-s", size, "-n", "10"])
            .output()
            .expect("run dp-limits");
        assert_eq!(out.status.code(), Some(2), "size {size}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("8 to 48 bytes"), "size {size}");
    }
}

#[test]
fn hiccup_reports_both_cores() {
    let j = limits_json(&["hiccup", "-D", "0.2"]);
    assert_eq!(j.get("seconds").num(), 0.2);
    let cores = j.get("cores").arr();
    assert_eq!(cores.len(), 2);
    for (i, want) in [0.0, 1.0].into_iter().enumerate() {
        let c = &cores[i];
        assert_eq!(c.get("core").num(), want);
        let (a, b, d) = (c.get("per_s_10us").num(), c.get("per_s_100us").num(), c.get("per_s_1ms").num());
        assert!(a >= b && b >= d && d >= 0.0, "longer gaps are a subset of shorter ones: {a} {b} {d}");
        let lost = c.get("lost").num();
        // A share of the watched time (more than 1 only if the thread was starved past the
        // end of the watch, as a loaded CI machine may do; a unit slip would be far off).
        assert!((0.0..10.0).contains(&lost), "a share of the time: {lost}");
    }
}

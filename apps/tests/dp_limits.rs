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
    let layouts = ["ring", "ring-padded", "cached-16", "cached-16-padded"];
    let each: Vec<f64> = layouts.iter().map(|l| j.get("layouts_MBs").get(l).num()).collect();
    assert!(each.iter().all(|&v| v > 0.0), "every layout ran: {each:?}");
    let best = each.iter().cloned().fold(0.0, f64::max);
    let reported = j.get("BW_average").num();
    // Both printed with two decimals.
    assert!((reported - best).abs() < 0.01, "BW_average {reported} is the best layout's {best} ({each:?})");
    let named = layouts.iter().position(|l| *l == j.get("layout").str()).expect("a known layout");
    assert!((each[named] - best).abs() < 0.01, "the named layout is the fastest");
}

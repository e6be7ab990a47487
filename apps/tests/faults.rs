//! Fault injection in `cargo test`: a few trials of tools/fault-inject (signals delivered to
//! either side of a pipeline, dp-perf or shm-pingpong pair) and one shm-vandal run per target
//! against an echo pipeline, with fixed seeds. The larger runs are CI's (docs/reliability.md).
//!
//! Every property holds in the signal trials: no crash, no hang, signals honoured, a clear
//! sentence on error, the next run on the same fabric works, and no file left behind. (The
//! vandal runs may leave files: a truncated fabric and its stats segment, docs/reliability.md.)

use std::path::Path;
use std::process::Command;

/// Runs tools/fault-inject with `args`; returns its stdout after checking the final line says
/// `expected` trials passed and none failed.
fn fault_inject(args: &[&str], expected: usize) -> String {
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_dataplane")).parent().expect("binary directory");
    // shm-vandal is not a dependency of this test target by name, so check it was built too.
    assert!(Path::new(env!("CARGO_BIN_EXE_shm-vandal")).exists());
    let tool = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tools/fault-inject");
    let out = Command::new("python3")
        .arg(&tool)
        .arg("--bin-dir")
        .arg(bin_dir)
        .args(args)
        .output()
        .expect("run python3 tools/fault-inject");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let last = stdout.lines().last().unwrap_or_default();
    assert!(
        out.status.success() && last.starts_with(&format!("{expected} passed, 0 failed")),
        "fault-inject {args:?}: {}\n{stdout}\n{stderr}",
        out.status
    );
    stdout
}

#[test]
fn signals_to_either_side_end_both_cleanly() {
    let out = fault_inject(&["-n", "6", "--seed", "7", "--stop-secs", "1", "-v"], 6);
    assert!(out.contains("files left after both sides were gone: 0"), "{out}");
    // The table covers what was run: one row per signal drawn.
    assert!(out.contains("worst survivor exit"), "{out}");
}

#[test]
fn garbage_in_a_live_fabric_never_crashes_the_victim() {
    let out = fault_inject(&["--vandal-only", "--vandal-seeds", "1", "--seed", "3", "--victim-secs", "2"], 6);
    // truncate is the documented SIGBUS hazard: reported as KNOWN, not as a pass.
    for target in ["header", "rings", "seq", "cqe", "lock", "mr", "truncate"] {
        assert!(out.contains(&format!("vandal {target:<8} seed 3")), "{target} not run:\n{out}");
    }
}

//! `dp-perf` runs every test on `shm` and prints perftest's JSON keys with sane values.

use std::process::Command;

fn run(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_dp-perf")).args(args).output().expect("run dp-perf");
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

fn number(line: &str, key: &str) -> f64 {
    let pat = format!("\"{key}\":");
    let at = line.find(&pat).unwrap_or_else(|| panic!("no {key} in {line}")) + pat.len();
    let end = line[at..].find([',', '}']).unwrap() + at;
    line[at..end].parse().unwrap_or_else(|_| panic!("{key} is not a number in {line}"))
}

#[test]
fn bandwidth_tests_report_perftest_keys() {
    for test in ["send_bw", "write_bw", "read_bw", "atomic_bw"] {
        let (ok, out, err) = run(&[
            test,
            "--loopback",
            "-s",
            "64",
            "-n",
            "20000",
            "-l",
            "8",
            "--out_json",
            "--core",
            "-1",
            "--peer-core",
            "-1",
        ]);
        assert!(ok, "{test}: {err}");
        let line = out.lines().find(|l| l.starts_with('{')).unwrap_or_else(|| panic!("{test}: no JSON in {out}"));
        assert_eq!(number(line, "n_iterations"), 20000.0, "{line}");
        let size = if test == "atomic_bw" { 8.0 } else { 64.0 };
        assert_eq!(number(line, "MsgSize"), size, "{line}");
        assert!(number(line, "MsgRate") > 0.0 && number(line, "BW_average") > 0.0, "{line}");
        assert!(number(line, "BW_peak") >= number(line, "BW_average") * 0.99, "{line}");
    }
}

#[test]
fn latency_tests_report_percentiles_in_order() {
    for test in ["send_lat", "write_lat", "read_lat", "atomic_lat"] {
        let (ok, out, err) =
            run(&[test, "--loopback", "-n", "5000", "--out_json", "--core", "-1", "--peer-core", "-1"]);
        assert!(ok, "{test}: {err}");
        let line = out.lines().find(|l| l.starts_with('{')).unwrap_or_else(|| panic!("{test}: no JSON in {out}"));
        assert_eq!(number(line, "n_iterations"), 5000.0);
        let (min, typ, p99, p999, max) = (
            number(line, "t_min"),
            number(line, "t_typical"),
            number(line, "99%"),
            number(line, "99.9%"),
            number(line, "t_max"),
        );
        assert!(min > 0.0 && min <= typ && typ <= p99 && p99 <= p999 && p999 <= max, "{line}");
    }
}

#[test]
fn size_sweep_and_histogram_file() {
    let hist = std::env::temp_dir().join(format!("dp-perf-hist-{}.txt", std::process::id()));
    let (ok, out, err) = run(&[
        "write_lat",
        "--loopback",
        "-a",
        "-n",
        "200",
        "--histogram",
        hist.to_str().unwrap(),
        "--core",
        "-1",
        "--peer-core",
        "-1",
    ]);
    assert!(ok, "{err}");
    let rows: Vec<&str> =
        out.lines().filter(|l| l.trim_start().chars().next().is_some_and(|c| c.is_ascii_digit())).collect();
    assert_eq!(rows.len(), 23, "sizes 2..2^23: {out}");
    let h = std::fs::read_to_string(&hist).unwrap();
    assert_eq!(h.matches("# dp-perf message size").count(), 23);
    assert!(h.contains("Percentile") && h.contains("#[Mean ="));
    let _ = std::fs::remove_file(hist);
}

#[test]
fn refused_combinations_say_why() {
    let (ok, _, err) = run(&["read_bw", "--loopback", "-c", "UC"]);
    assert!(!ok && err.contains("not supported on UC"), "{err}");
    let (ok, _, err) = run(&["send_bw", "--provider", "rdma", "--loopback"]);
    assert!(!ok && err.contains("rdma"), "{err}");
    let (ok, _, err) = run(&["send_bw"]);
    assert!(!ok && err.contains("--loopback"), "{err}");
}

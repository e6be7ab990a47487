//! End-to-end tests of live stats: `dataplane run` exports its counters while it runs,
//! `dpctl` reads them (moving), the segment disappears when the run ends (also on Ctrl-C),
//! a killed run leaves a stale segment that `dpctl` reports and cleans, and `--no-stats`
//! exports nothing.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};
use support::Json;

fn example(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../config/examples").join(name)
}

/// A `dataplane run` child, killed (and its fabric removed) if the test fails before it ends.
struct Run {
    child: Option<Child>,
    pid: u32,
    fabric: String,
}

impl Run {
    /// Starts the echo example on fabric `fabric`, unpinned (two cores may be shared), with
    /// `extra` arguments and segments in `dir`.
    fn start(fabric: &str, dir: &Path, extra: &[&str]) -> Run {
        let child = Command::new(env!("CARGO_BIN_EXE_dataplane"))
            .args(["run", example("echo.toml").to_str().unwrap(), "--no-pin", "--json", "--fabric", fabric])
            .args(extra)
            .env("DATAPLANE_STATS_DIR", dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start dataplane run");
        Run { pid: child.id(), child: Some(child), fabric: fabric.into() }
    }

    fn child(&mut self) -> &mut Child {
        self.child.as_mut().expect("running")
    }

    /// Waits until `dpctl stats --pid PID --json` succeeds; returns its JSON.
    fn wait_for_segment(&mut self, dir: &Path) -> Json {
        let t0 = Instant::now();
        loop {
            let out = dpctl(dir, &["stats", "--pid", &self.pid.to_string(), "--json"]);
            if out.status.success() {
                return parse(&out);
            }
            if let Ok(Some(status)) = self.child().try_wait() {
                panic!("dataplane run ended ({status}) before its segment appeared: {}", stderr(&out));
            }
            assert!(t0.elapsed() < Duration::from_secs(20), "no segment after 20 s: {}", stderr(&out));
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits for the run to end (at most `limit`) and returns its output.
    fn finish(&mut self, limit: Duration) -> Output {
        let t0 = Instant::now();
        while self.child().try_wait().expect("wait").is_none() {
            assert!(t0.elapsed() < limit, "dataplane run did not end within {limit:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
        self.child.take().expect("running").wait_with_output().expect("output")
    }

    fn signal(&self, sig: libc::c_int) {
        // SAFETY: FFI; signals our own child, not reaped yet (its pid cannot have been reused).
        assert_eq!(unsafe { libc::kill(self.pid as libc::pid_t, sig) }, 0);
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        // A killed run cannot remove its fabric.
        let _ = dataplane::mem::Region::unlink_name(&self.fabric);
    }
}

fn dpctl(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_dpctl")).args(args).env("DATAPLANE_STATS_DIR", dir).output().expect("run dpctl")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn parse(o: &Output) -> Json {
    let s = stdout(o);
    Json::parse(s.trim()).unwrap_or_else(|e| panic!("dpctl output is not one JSON object ({e}): {s}"))
}

fn worker<'a>(j: &'a Json, name: &str) -> &'a Json {
    let ws = j.get("workers").arr();
    ws.iter().find(|w| w.get("name").str() == name).unwrap_or_else(|| panic!("no worker {name} in {j:?}"))
}

fn names(list: &[Json]) -> Vec<&str> {
    list.iter().map(|x| x.get("name").str()).collect()
}

fn dev_shm() -> PathBuf {
    PathBuf::from("/dev/shm")
}

fn segment_file(dir: &Path, fabric: &str, pid: u32) -> PathBuf {
    dir.join(format!("dataplane-stats.{fabric}.{pid}"))
}

#[test]
fn dpctl_stats_shows_the_counters_of_a_running_pipeline_moving() {
    let fabric = format!("test-dpctl-{}", std::process::id());
    let dir = dev_shm();
    let mut run = Run::start(&fabric, &dir, &["--duration", "4s"]);
    let pid = run.pid;
    let first = run.wait_for_segment(&dir);
    let file = segment_file(&dir, &fabric, pid);
    let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&file).expect("segment").permissions());
    assert_eq!(mode & 0o777, 0o600, "{}", file.display());

    std::thread::sleep(Duration::from_millis(500));
    let second = parse(&dpctl(&dir, &["stats", "--pid", &pid.to_string(), "--json"]));
    for j in [&first, &second] {
        assert_eq!(j.get("name").str(), fabric);
        assert_eq!(j.get("pid").num(), pid as f64);
        assert_eq!(j.get("state").str(), "running");
        assert_eq!(names(j.get("workers").arr()), ["client", "server"], "the workers of echo.toml");
        assert_eq!(names(worker(j, "client").get("qps").arr()), ["client-qp"]);
        assert_eq!(names(worker(j, "client").get("stages").arr()), ["pacer", "rtt"]);
        assert_eq!(names(worker(j, "server").get("stages").arr()), ["echo"]);
    }
    for w in ["client", "server"] {
        let (a, b) = (worker(&first, w), worker(&second, w));
        assert!(b.get("loops").num() > a.get("loops").num(), "{w}: loops did not move: {a:?} -> {b:?}");
        assert!(b.get("tx_msgs").num() > a.get("tx_msgs").num(), "{w}: tx did not move: {a:?} -> {b:?}");
        assert!(b.get("rx_msgs").num() > a.get("rx_msgs").num(), "{w}: rx did not move");
    }
    let rtt = &worker(&second, "client").get("stages").arr()[1];
    let lat = rtt.get("latency_ns");
    assert!(lat.get("count").num() > 0.0 && lat.get("p50").num() > 0.0, "sink latency exported: {rtt:?}");
    assert!(lat.get("p50").num() <= lat.get("p99").num() && lat.get("p99").num() <= lat.get("max").num());

    // By name, and as a table.
    let by_name = parse(&dpctl(&dir, &["stats", &fabric, "--json"]));
    assert_eq!(by_name.get("pid").num(), pid as f64);
    let text = dpctl(&dir, &[&pid.to_string()]);
    let table = stdout(&text);
    assert!(text.status.success(), "{}", stderr(&text));
    assert!(table.starts_with(&format!("pipeline {fabric}  pid {pid}  running")), "{table}");
    for row in ["\nclient ", "\nserver ", "\nclient-qp ", "\nrtt ", "busy%", "db/msg", "p50 / p99"] {
        assert!(table.contains(row), "no {row:?} in:\n{table}");
    }

    // watch: rates over the interval.
    let w = dpctl(&dir, &["watch", "--pid", &pid.to_string(), "-i", "200ms", "-n", "2", "--json"]);
    assert!(w.status.success(), "{}", stderr(&w));
    let frames: Vec<Json> = stdout(&w).lines().map(|l| Json::parse(l).expect("one JSON object per line")).collect();
    assert_eq!(frames.len(), 2, "{}", stdout(&w));
    let dt = frames[1].get("interval_s").num();
    assert!((0.15..2.0).contains(&dt), "interval {dt}");
    assert!(worker(&frames[1], "client").get("rates").get("tx_msgs").num() > 0.0, "{:?}", frames[1]);

    let out = run.finish(Duration::from_secs(30));
    assert!(out.status.success(), "dataplane run: {}\n{}", stdout(&out), stderr(&out));
    assert!(!file.exists(), "the segment is removed at exit: {}", file.display());
    let gone = dpctl(&dir, &["stats", "--pid", &pid.to_string()]);
    assert_eq!(gone.status.code(), Some(1));
    assert!(stderr(&gone).contains(&format!("no stats segment for pid {pid}")), "{}", stderr(&gone));
}

/// A directory of its own (the default /dev/shm is shared with other runs).
fn private_dir(test: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("dpctl-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn ctrl_c_ends_the_run_and_removes_the_segment() {
    let dir = private_dir("sigint");
    let fabric = format!("test-dpctl-int-{}", std::process::id());
    let mut run = Run::start(&fabric, &dir, &[]);
    let pid = run.pid;
    run.wait_for_segment(&dir);
    assert!(segment_file(&dir, &fabric, pid).exists());
    run.signal(libc::SIGINT);
    let out = run.finish(Duration::from_secs(30));
    let summary = stdout(&out);
    assert!(summary.contains("\"interrupted\":true"), "{summary}\n{}", stderr(&out));
    assert!(!segment_file(&dir, &fabric, pid).exists(), "the segment is removed after Ctrl-C");
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "nothing left in {}", dir.display());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_killed_run_leaves_a_stale_segment_that_dpctl_reports_and_cleans() {
    let dir = private_dir("stale");
    let fabric = format!("test-dpctl-kill-{}", std::process::id());
    let mut run = Run::start(&fabric, &dir, &[]);
    let pid = run.pid;
    run.wait_for_segment(&dir);
    run.signal(libc::SIGKILL);
    let _ = run.finish(Duration::from_secs(10));
    assert!(segment_file(&dir, &fabric, pid).exists(), "SIGKILL cannot clean up");

    let list = dpctl(&dir, &["list"]);
    assert!(stdout(&list).contains("STALE") && stdout(&list).contains(&fabric), "{}", stdout(&list));
    // A dead process has no uptime: "up N s" would keep growing after it died.
    assert!(stdout(&list).contains(&format!("dead (pid {pid} gone)")), "{}", stdout(&list));
    assert!(!stdout(&list).contains(" up "), "uptime shown for a dead process: {}", stdout(&list));
    let listed = parse(&dpctl(&dir, &["list", "--json"]));
    assert_eq!(listed.get("segments").arr()[0].get("uptime_s"), &Json::Null, "{listed:?}");
    let none = dpctl(&dir, &["stats"]);
    assert_eq!(none.status.code(), Some(1));
    assert!(stderr(&none).contains("no running pipeline") && stderr(&none).contains("1 stale"), "{}", stderr(&none));
    let old = dpctl(&dir, &["stats", "--pid", &pid.to_string(), "--json"]);
    assert_eq!(parse(&old).get("alive"), &Json::Bool(false), "a stale segment can still be read");

    let clean = dpctl(&dir, &["clean"]);
    assert!(clean.status.success() && stdout(&clean).contains("removed"), "{}", stdout(&clean));
    assert!(!segment_file(&dir, &fabric, pid).exists());
    assert!(stdout(&dpctl(&dir, &["list"])).contains("no stats segments"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn no_stats_runs_without_a_segment() {
    let dir = private_dir("nostats");
    let fabric = format!("test-dpctl-nostats-{}", std::process::id());
    let mut run = Run::start(&fabric, &dir, &["--duration", "1500ms", "--no-stats"]);
    std::thread::sleep(Duration::from_millis(700));
    assert!(run.child().try_wait().unwrap().is_none(), "the run is still going");
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "no segment with --no-stats");
    let out = run.finish(Duration::from_secs(30));
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("\"drained\":true"), "{}", stdout(&out));
    std::fs::remove_dir_all(&dir).unwrap();
}

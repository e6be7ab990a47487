//! `dpctl prom` and `dpctl serve` against a running pipeline, the text checked by a real
//! Prometheus parser: `promtool check metrics` (Debian's `prometheus` package), else Python's
//! `prometheus_client` parser. Without either the test says so and passes, except under CI
//! (`CI=true`), where a missing parser is a failure.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A child process killed when the test ends (and the run's fabric removed).
struct Proc {
    child: Child,
    fabric: Option<String>,
}

impl Drop for Proc {
    fn drop(&mut self) {
        // SIGTERM first: a pipeline then removes its own stats segment and fabric.
        // SAFETY: FFI; signals our own child, whose pid it still is (not yet reaped).
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let end = Instant::now() + Duration::from_secs(5);
        while self.child.try_wait().ok().flatten().is_none() && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(f) = &self.fabric {
            let _ = dataplane::mem::Region::unlink_name(f);
            let _ = std::fs::remove_file(format!("/dev/shm/dataplane-stats.{f}.{}", self.child.id()));
        }
    }
}

fn dpctl(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_dpctl")).args(args).env("DATAPLANE_STATS_DIR", dir).output().expect("run dpctl")
}

/// Which real parser is installed: `Some(true)` promtool, `Some(false)` prometheus_client.
fn parser() -> Option<bool> {
    let ok = |cmd: &mut Command| cmd.stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok_and(|s| s.success());
    if ok(Command::new("promtool").arg("--version")) {
        return Some(true);
    }
    ok(Command::new("python3").args(["-c", "import prometheus_client.parser"])).then_some(false)
}

/// Runs the real parser on `text`: `Err` with its complaint if it refuses it.
fn validate(promtool: bool, text: &str) -> Result<(), String> {
    let mut cmd = if promtool {
        let mut c = Command::new("promtool");
        c.args(["check", "metrics"]);
        c
    } else {
        let mut c = Command::new("python3");
        let script = "import sys\nfrom prometheus_client.parser import text_string_to_metric_families as p\n\
                      n = len(list(p(sys.stdin.read())))\nassert n > 0, 'no families'\n";
        c.args(["-c", script]);
        c
    };
    let mut child = cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("parser");
    child.stdin.take().expect("stdin").write_all(text.as_bytes()).expect("write to the parser");
    let out = child.wait_with_output().expect("parser output");
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    if out.status.success() {
        Ok(())
    } else {
        Err(said)
    }
}

/// The value of the one sample whose line starts with `series` (name and labels).
fn sample(text: &str, series: &str) -> f64 {
    let hits: Vec<&str> =
        text.lines().filter(|l| l.starts_with(series) && l[series.len()..].starts_with(' ')).collect();
    assert_eq!(hits.len(), 1, "one sample {series} in:\n{text}");
    hits[0].rsplit_once(' ').unwrap().1.parse().unwrap_or_else(|e| panic!("{}: {e}", hits[0]))
}

fn http_get(addr: &str, request: &str) -> String {
    let mut s = TcpStream::connect(addr).expect("connect to dpctl serve");
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).expect("read the response");
    out
}

/// Checks one exposition of the echo example's pipeline on `fabric`.
fn check(promtool: Option<bool>, text: &str, fabric: &str, pid: u32, what: &str) {
    if let Some(p) = promtool {
        validate(p, text).unwrap_or_else(|e| panic!("the parser refuses {what}: {e}\n{text}"));
    }
    let w = format!("pipeline=\"{fabric}\",pid=\"{pid}\",worker=\"client\"");
    assert_eq!(sample(text, &format!("dataplane_up{{pipeline=\"{fabric}\",pid=\"{pid}\"}}")), 1.0, "{what}");
    assert!(sample(text, &format!("dataplane_worker_tx_msgs_total{{{w}}}")) > 0.0, "{what}: client sent nothing");
    assert!(sample(text, &format!("dataplane_qp_tx_msgs_total{{{w},qp=\"client-qp\"}}")) > 0.0, "{what}");
    let rtt = format!("{w},stage=\"rtt\",kind=\"sink\"");
    let count = sample(text, &format!("dataplane_stage_latency_seconds_count{{{rtt}}}"));
    assert!(count > 0.0, "{what}: no latency samples");
    assert_eq!(sample(text, &format!("dataplane_stage_latency_seconds_bucket{{{rtt},le=\"+Inf\"}}")), count, "{what}");
    let max = sample(text, &format!("dataplane_stage_latency_max_seconds{{{rtt}}}"));
    assert!(max > 0.0 && max < 60.0, "{what}: max latency {max} s");
}

#[test]
fn dpctl_prom_and_serve_expose_a_running_pipeline_that_a_real_parser_accepts() {
    let promtool = parser();
    match promtool {
        Some(p) => {
            // The parser must be able to refuse: an unterminated label value.
            assert!(validate(p, "# TYPE x_total counter\nx_total{a=\"b} 1\n").is_err(), "the parser accepts anything");
        }
        None if std::env::var("CI").is_ok_and(|v| v == "true") => {
            panic!(
                "CI: no Prometheus parser (apt-get install prometheus for promtool, or pip install prometheus-client)"
            )
        }
        None => eprintln!("NOT VALIDATED by a parser: neither promtool nor python3 prometheus_client is installed"),
    }
    let fabric = format!("test-prom-{}", std::process::id());
    let dir = PathBuf::from("/dev/shm");
    let example = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../config/examples/echo.toml");
    let child = Command::new(env!("CARGO_BIN_EXE_dataplane"))
        .args(["run", example.to_str().unwrap(), "--no-pin", "--fabric", &fabric, "--duration", "3s"])
        .env("DATAPLANE_STATS_DIR", &dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start dataplane run");
    let mut run = Proc { child, fabric: Some(fabric.clone()) };
    let pid = run.child.id();

    // `dpctl prom NAME` fails until the segment is there and has latency samples.
    let t0 = Instant::now();
    let text = loop {
        let out = dpctl(&dir, &["prom", &fabric]);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let sampled = |l: &str| l.starts_with("dataplane_stage_latency_seconds_count{") && !l.ends_with(" 0");
        if out.status.success() && text.lines().any(sampled) {
            break text;
        }
        assert!(
            run.child.try_wait().unwrap().is_none(),
            "dataplane run ended first: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "no exposition after 20 s: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    check(promtool, &text, &fabric, pid, "dpctl prom");

    let serve = Command::new(env!("CARGO_BIN_EXE_dpctl"))
        .args(["serve", &fabric, "--listen", "127.0.0.1:0"])
        .env("DATAPLANE_STATS_DIR", &dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start dpctl serve");
    let mut serve = Proc { child: serve, fabric: None };
    let mut first = String::new();
    BufReader::new(serve.child.stdout.take().unwrap()).read_line(&mut first).expect("dpctl serve's address");
    let addr = first.split("http://").nth(1).and_then(|r| r.split('/').next()).unwrap_or_else(|| panic!("{first}"));

    let resp = http_get(addr, "GET /metrics HTTP/1.1\r\nHost: test\r\n\r\n");
    let (head, body) = resp.split_once("\r\n\r\n").unwrap_or_else(|| panic!("no head: {resp}"));
    assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
    assert!(head.contains("Content-Type: text/plain; version=0.0.4; charset=utf-8"), "{head}");
    assert!(head.contains(&format!("Content-Length: {}", body.len())), "{head}");
    check(promtool, body, &fabric, pid, "dpctl serve's /metrics");

    assert!(http_get(addr, "GET / HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404 "), "other paths: 404");
    assert!(http_get(addr, "NONSENSE\r\n\r\n").starts_with("HTTP/1.1 400 "), "garbage: 400");
    let huge = format!("GET /metrics HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(20_000));
    assert!(http_get(addr, &huge).starts_with("HTTP/1.1 431 "), "oversized head: 431");
    assert!(serve.child.try_wait().unwrap().is_none(), "dpctl serve survives bad requests");
    let resp = http_get(addr, "GET /metrics HTTP/1.0\r\n\r\n");
    assert!(resp.starts_with("HTTP/1.1 200 OK\r\n"), "still serving after bad requests: {resp}");
}

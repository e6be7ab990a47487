//! `shm-pingpong` notices when its peer process dies: the survivor exits within seconds with
//! one sentence, and the fabric file goes with the last user.

use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::{Child, ChildStderr, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

fn fabric_file(fabric: &str) -> PathBuf {
    PathBuf::from(format!("/dev/shm/dataplane.{fabric}"))
}

/// Starts a long run on `fabric` and returns it with the server's pid (from its header line).
fn start(fabric: &str) -> (Child, u32) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_shm-pingpong"))
        .args(["--fabric", fabric, "--core", "-1", "--peer-core", "-1", "--huge", "never"])
        .args(["-n", "1000000000", "-m", "1000000000"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn shm-pingpong");
    let mut lines = BufReader::new(c.stdout.take().expect("stdout")).lines();
    let header = lines.next().expect("a header line").expect("read");
    let pid = header.rsplit("server pid ").next().and_then(|p| p.trim().parse().ok());
    let pid = pid.unwrap_or_else(|| panic!("no server pid in {header:?}"));
    std::thread::spawn(move || lines.for_each(drop)); // keep the pipe open and drained
    (c, pid)
}

/// Reads `stderr` to its end (every holder of the pipe exited) within `limit`.
fn stderr_within(mut stderr: ChildStderr, limit: Duration) -> Option<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        let _ = tx.send(s);
    });
    rx.recv_timeout(limit).ok()
}

fn signal(pid: u32, sig: libc::c_int) {
    // SAFETY: kill(2) with a pid this test started; no memory is involved.
    let r = unsafe { libc::kill(pid as libc::pid_t, sig) };
    assert_eq!(r, 0, "signal {sig} to {pid}");
}

fn kill9(pid: u32) {
    signal(pid, libc::SIGKILL);
}

#[test]
fn the_client_notices_its_server_died() {
    let fabric = format!("test-pingpong-srv-{}", std::process::id());
    let (mut client, server) = start(&fabric);
    std::thread::sleep(Duration::from_millis(500)); // into the latency phase
    kill9(server);
    let t0 = Instant::now();
    let err = stderr_within(client.stderr.take().expect("stderr"), Duration::from_secs(10));
    let status = client.try_wait().expect("try_wait");
    if err.is_none() {
        let _ = client.kill();
    }
    let _ = client.wait();
    let left = fabric_file(&fabric).exists();
    let _ = std::fs::remove_file(fabric_file(&fabric));
    let err = err.expect("the client still running 10 s after its server was killed");
    assert!(err.contains(&format!("the server process (pid {server}) ended mid-test")), "{err}");
    assert!(status.is_none_or(|s| !s.success()), "the client succeeded: {err}");
    assert!(t0.elapsed() < Duration::from_secs(10));
    assert!(!left, "{} left behind", fabric_file(&fabric).display());
}

#[test]
fn the_orphaned_server_notices_its_client_died_and_removes_the_fabric() {
    let fabric = format!("test-pingpong-cli-{}", std::process::id());
    let (mut client, server) = start(&fabric);
    std::thread::sleep(Duration::from_millis(500));
    let stderr = client.stderr.take().expect("stderr"); // the server writes here too
                                                        // The server is stopped until the client is reaped (as a shell would): an unreaped zombie
                                                        // still counts as a fabric user, and the server would race the reaping.
    signal(server, libc::SIGSTOP);
    client.kill().expect("kill -9 the client");
    client.wait().expect("reap the client");
    signal(server, libc::SIGCONT);
    let err = stderr_within(stderr, Duration::from_secs(10));
    if err.is_none() {
        kill9(server);
    }
    let t0 = Instant::now(); // the file goes just before the server's stderr closes
    while fabric_file(&fabric).exists() && t0.elapsed() < Duration::from_secs(1) {
        std::thread::sleep(Duration::from_millis(10));
    }
    let left = fabric_file(&fabric).exists();
    let _ = std::fs::remove_file(fabric_file(&fabric)); // before any assertion can fail
    let err = err.expect("the server still running 10 s after its client was killed");
    assert!(err.contains(&format!("the client process (pid {}) died mid-test", client.id())), "{err}");
    assert!(!left, "{} left behind", fabric_file(&fabric).display());
}

/// SIGTERM or Ctrl-C ends a side through its destructors, with a sentence: the default action
/// used to end it where it stood, leaving the fabric file when it was the last user (found by
/// tools/fault-inject).
#[test]
fn sigterm_ends_the_client_with_a_sentence_and_no_file_left() {
    let fabric = format!("test-pingpong-term-{}", std::process::id());
    let (mut client, _server) = start(&fabric);
    std::thread::sleep(Duration::from_millis(500));
    signal(client.id(), libc::SIGTERM);
    let err = stderr_within(client.stderr.take().expect("stderr"), Duration::from_secs(10));
    if err.is_none() {
        let _ = client.kill();
    }
    let status = client.wait().expect("wait");
    let t0 = Instant::now(); // the server child may be the last user: give it its exit
    while fabric_file(&fabric).exists() && t0.elapsed() < Duration::from_secs(2) {
        std::thread::sleep(Duration::from_millis(10));
    }
    let left = fabric_file(&fabric).exists();
    let _ = std::fs::remove_file(fabric_file(&fabric));
    let err = err.expect("the client still running 10 s after SIGTERM");
    assert_eq!(status.code(), Some(1), "not ended by its own error path: {status}; {err}");
    assert!(err.contains("stopped by SIGINT or SIGTERM"), "{err}");
    assert!(!left, "{} left behind", fabric_file(&fabric).display());
}

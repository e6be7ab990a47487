//! Remote peers on the `shm` provider: `config/examples/remote-server.toml` and
//! `remote-client.toml` run as two `dataplane run` processes on this host, exchange their QP
//! endpoints over TCP (listen / peer) and echo traffic over one shm fabric. The client's
//! summary must show traffic, no sequence gap and no leaked buffer; the server must stop on
//! its own when the client's process ends.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_dataplane"))
}

/// A TCP port free right now on 127.0.0.1.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// An example with `edits` applied (each `from` must occur), written to a temp file whose
/// name starts with `tag` (tests run in parallel).
fn example_with(tag: &str, name: &str, edits: &[(&str, &str)]) -> PathBuf {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../config/examples").join(name);
    let mut text = std::fs::read_to_string(&src).unwrap();
    for (from, to) in edits {
        assert!(text.contains(from), "{name}: `{from}` not found");
        text = text.replace(from, to);
    }
    let dir = std::env::temp_dir().join(format!("dataplane-remote-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(format!("{tag}-{name}"));
    std::fs::write(&p, text).unwrap();
    p
}

fn spawn(file: &Path, fabric: &str, extra: &[&str]) -> Child {
    bin()
        .args(["run", file.to_str().unwrap(), "--json", "--no-pin", "--fabric", fabric])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits for `child` at most `limit`, killing it after; returns its output.
fn wait(mut child: Child, limit: Duration, what: &str) -> Output {
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!("{what} still running after {limit:?}; stderr: {}", String::from_utf8_lossy(&out.stderr));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

/// The integer after the first `"key":` in `json`.
fn field(json: &str, key: &str) -> u64 {
    let pat = format!("\"{key}\":");
    let i = json.find(&pat).unwrap_or_else(|| panic!("no {key} in {json}")) + pat.len();
    json[i..].chars().take_while(|c| c.is_ascii_digit()).collect::<String>().parse().unwrap()
}

/// The `"msgs"` of the stage of `kind`.
fn stage_msgs(json: &str, kind: &str) -> u64 {
    let pat = format!("\"kind\":\"{kind}\",\"msgs\":");
    let i = json.find(&pat).unwrap_or_else(|| panic!("no {kind} stage in {json}")) + pat.len();
    json[i..].chars().take_while(|c| c.is_ascii_digit()).collect::<String>().parse().unwrap()
}

fn clean(out: &Output, what: &str) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{what}: exit {:?}\nstdout: {stdout}\nstderr: {stderr}", out.status);
    assert!(stdout.starts_with('{') && stdout.ends_with('}'), "{what}: not one JSON object: {stdout}");
    assert_eq!(field(&stdout, "leaked"), 0, "{what}: leaked buffers: {stdout}");
    assert!(stdout.contains("\"drained\":true"), "{what}: drain incomplete: {stdout}");
    stdout
}

/// Runs the remote pair with `server_edits` / `client_edits` applied; checks both summaries
/// and returns the number of echoed messages the client's sink received.
fn run_pair(tag: &str, server_edits: &[(&str, &str)], client_edits: &[(&str, &str)]) -> u64 {
    let port = free_port().to_string();
    let addr = format!("127.0.0.1:{port}");
    let mut s_edits = vec![("127.0.0.1:7470", addr.as_str())];
    s_edits.extend_from_slice(server_edits);
    let mut c_edits = vec![("127.0.0.1:7470", addr.as_str())];
    c_edits.extend_from_slice(client_edits);
    let server_cfg = example_with(tag, "remote-server.toml", &s_edits);
    let client_cfg = example_with(tag, "remote-client.toml", &c_edits);
    let fabric = format!("test-remote-{tag}-{}", std::process::id());
    let server = spawn(&server_cfg, &fabric, &[]);
    // The client retries its connection until the server listens.
    let client = spawn(&client_cfg, &fabric, &["--duration", "2s"]);
    let c = wait(client, Duration::from_secs(60), "client");
    let s = wait(server, Duration::from_secs(30), "server (should stop when the client leaves)");
    let server_said = String::from_utf8_lossy(&s.stderr).into_owned();
    let cj = clean(&c, &format!("client (server's stderr: {server_said})"));
    let sj = clean(&s, "server");
    let stderr = String::from_utf8_lossy(&s.stderr);
    assert!(stderr.contains(&format!("the remote peer at {addr} closed its connection")), "server: {stderr}");
    assert_eq!(field(&cj, "gaps"), 0, "client: sequence gaps: {cj}");
    let got = stage_msgs(&cj, "sink");
    assert!(got > 0, "client: the sink received nothing: {cj}");
    assert_eq!(stage_msgs(&sj, "echo"), got, "server echoed {sj}\nclient received {cj}");
    got
}

#[test]
fn remote_pair_over_shm_rc_echoes_without_loss() {
    run_pair("rc", &[], &[]);
}

#[test]
fn remote_pair_over_shm_ud_echoes_without_loss() {
    // UD: the address handle comes from the exchanged LID/GID, the destination from the QPN.
    // Paced low: UD drops what arrives while the SRQ is empty.
    let ud = ("\nlisten = ", "\ntransport = \"ud\"\nlisten = ");
    run_pair("ud", &[ud], &[("\npeer = ", "\ntransport = \"ud\"\npeer = "), ("rate = 50_000", "rate = 2_000")]);
}

#[test]
fn listen_address_in_use_is_a_clear_error() {
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let cfg = example_with("busy", "remote-server.toml", &[("127.0.0.1:7470", &addr)]);
    let out =
        wait(spawn(&cfg, &format!("test-remote-busy-{}", std::process::id()), &[]), Duration::from_secs(30), "server");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains(&format!("qp server-qp: cannot listen on {addr}:")), "{stderr}");
}

/// A peer process killed during the endpoint exchange: the surviving side says the peer closed
/// the connection (its process ended or was killed), not that the QP counts may differ. The
/// peer is a shell that connected, sent its one connection message, read the server's answer
/// and waits (as a client does while it brings its QPs up); SIGKILL closes its socket as it
/// would a `dataplane` client's. (A peer killed with the answer unread resets the connection
/// instead: the unit tests in `exchange.rs` cover both.)
#[test]
fn a_peer_killed_during_the_exchange_is_reported_as_gone() {
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let cfg = example_with("killed", "remote-server.toml", &[("127.0.0.1:7470", &addr)]);
    let server = spawn(&cfg, &format!("test-remote-killed-{}", std::process::id()), &[]);
    let msg = dataplane::conn::encode(&dataplane::verbs::Endpoint { lid: 0, qpn: 0x0010_0001, psn: 1, gid: [0; 16] });
    let msg_file = cfg.with_extension("msg");
    std::fs::write(&msg_file, msg).unwrap();
    // Retries until the server listens, sends the message, reads the answer, waits to be killed.
    let script = format!(
        "until exec 3<>/dev/tcp/127.0.0.1/{port}; do sleep 0.05; done 2>/dev/null; cat {} >&3; \
         head -c {} <&3 >/dev/null; sleep 60",
        msg_file.display(),
        dataplane::conn::MSG_LEN
    );
    let mut peer = Command::new("bash").args(["-c", &script]).stderr(Stdio::null()).spawn().unwrap();
    // Long enough for the exchange to reach the peer's wait; were it slower, the kill would
    // still end it with the same report (a reset or an end of file mid-exchange).
    std::thread::sleep(Duration::from_millis(500));
    peer.kill().unwrap();
    let _ = peer.wait();
    let out = wait(server, Duration::from_secs(30), "server");
    let _ = std::fs::remove_file(&msg_file);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("the remote peer closed the connection before the exchange finished"), "{stderr}");
    assert!(!stderr.contains("number of QPs"), "misleading hint: {stderr}");
}

#[test]
fn the_survivor_of_a_killed_peer_does_not_wait_out_the_drain() {
    let port = free_port().to_string();
    let addr = format!("127.0.0.1:{port}");
    let server_cfg = example_with("survivor", "remote-server.toml", &[("127.0.0.1:7470", addr.as_str())]);
    let client_cfg = example_with("survivor", "remote-client.toml", &[("127.0.0.1:7470", addr.as_str())]);
    let fabric = format!("test-remote-survivor-{}", std::process::id());
    let mut server = spawn(&server_cfg, &fabric, &[]);
    let client = spawn(&client_cfg, &fabric, &["--duration", "60s"]);
    // Both up (their live-stats segments appear before the exchange), traffic for a while,
    // then the server dies without a word.
    let up = |pid: u32| PathBuf::from(format!("/dev/shm/dataplane-stats.{fabric}.{pid}"));
    let start = Instant::now();
    while !(up(server.id()).exists() && up(client.id()).exists()) && start.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(1500));
    server.kill().unwrap();
    let killed = Instant::now();
    let _ = server.wait();
    // A killed process cannot remove its live-stats segment (`dpctl clean` would).
    let _ = std::fs::remove_file(up(server.id()));
    let c = wait(client, Duration::from_secs(30), "client after its server was killed");
    let took = killed.elapsed();
    let json = String::from_utf8_lossy(&c.stdout);
    let stderr = String::from_utf8_lossy(&c.stderr);
    assert!(stderr.contains("closed its connection"), "{stderr}");
    assert!(json.contains("\"peer_gone\":true"), "{json}");
    // Nothing more can come back: the drain ends once the counters stop (100 ms), not at its
    // 10 s deadline.
    assert!(took < Duration::from_secs(5), "the client took {took:?} to end; stderr: {stderr}");
    let _ = std::fs::remove_file(format!("/dev/shm/dataplane.{fabric}"));
}

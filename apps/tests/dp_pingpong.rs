//! `dp-pingpong` on the shm provider, ours against ours: event mode (`-e`) and the `--srq`
//! QP-count check.

use std::net::TcpListener;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A TCP port nobody listens on right now.
fn free_port() -> String {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port().to_string()
}

fn spawn(port: &str, extra: &[&str], server: Option<&str>) -> Child {
    let fabric = format!("test-dp-pingpong-{}-{port}", std::process::id());
    Command::new(env!("CARGO_BIN_EXE_dp-pingpong"))
        .args(["--provider", "shm", "--fabric", &fabric, "-p", port])
        .args(extra)
        .args(server)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn dp-pingpong")
}

/// Waits for `c` at most `limit`; kills it and fails the test if it is still running.
fn wait_within(mut c: Child, limit: Duration, who: &str) -> Output {
    let t0 = Instant::now();
    while c.try_wait().expect("try_wait").is_none() {
        if t0.elapsed() > limit {
            let _ = c.kill();
            let out = c.wait_with_output().expect("output");
            panic!("{who} still running after {limit:?}: {}", String::from_utf8_lossy(&out.stderr));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    c.wait_with_output().expect("output")
}

/// Server and client with the same `extra` flags (and `client_extra` on the client only).
fn pair(extra: &[&str], client_extra: &[&str]) -> (Output, Output) {
    let port = free_port();
    let server = spawn(&port, extra, None);
    std::thread::sleep(Duration::from_millis(300)); // listening
    let client = spawn(&port, &[extra, client_extra].concat(), Some("127.0.0.1"));
    let c = wait_within(client, Duration::from_secs(60), "client");
    let s = wait_within(server, Duration::from_secs(10), "server");
    (s, c)
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn event_mode_runs_on_shm() {
    for extra in [&["-e", "-n", "2000"][..], &["-e", "--srq", "-q", "3", "-n", "500"][..]] {
        let (s, c) = pair(extra, &[]);
        for (who, o) in [("server", &s), ("client", &c)] {
            assert!(o.status.success(), "{extra:?} {who}: {}", text(&o.stderr));
            let iters = extra[extra.len() - 1];
            assert!(text(&o.stdout).contains(&format!("{iters} iters in")), "{extra:?} {who}: {}", text(&o.stdout));
        }
    }
}

#[test]
fn srq_qp_counts_that_differ_are_named_on_both_sides() {
    let (s, c) = pair(&["--srq", "-n", "100"], &["-q", "2"]);
    assert!(!s.status.success() && !c.status.success());
    let (se, ce) = (text(&s.stderr), text(&c.stderr));
    assert!(se.contains("peer has 2 QPs, -q is 16 (give both sides the same -q)"), "server: {se}");
    assert!(ce.contains("peer has 16 QPs, -q is 2 (give both sides the same -q)"), "client: {ce}");
}

/// `--xrc` (`ibv_xsrq_pingpong`): one client, then three. With three, the server sends client
/// i's messages on the connection of client (i + count) % 3, so every client's XRC_RECV QP
/// delivers into the SRQs of the other clients' processes (one domain, `/tmp/xrc_domain`):
/// each side counts exactly its messages (the server 3 x n) and says success, in event mode
/// too.
#[test]
fn xrc_pingpong_one_and_three_clients() {
    for (clients, extra) in [(1usize, &["--xrc", "-n", "200", "-s", "64"][..]), (3, &["--xrc", "-e", "-n", "40"][..])] {
        let port = free_port();
        let n: usize = extra[extra.iter().position(|a| *a == "-n").unwrap() + 1].parse().unwrap();
        let server = spawn(&port, &[extra, &["--clients", &clients.to_string()]].concat(), None);
        std::thread::sleep(Duration::from_millis(300));
        let cs: Vec<_> = (0..clients)
            .map(|_| {
                let c = spawn(&port, extra, Some("127.0.0.1"));
                std::thread::sleep(Duration::from_millis(100));
                c
            })
            .collect();
        let outs: Vec<_> = cs.into_iter().map(|c| wait_within(c, Duration::from_secs(60), "client")).collect();
        let s = wait_within(server, Duration::from_secs(30), "server");
        for (who, o, msgs) in std::iter::once(("server", &s, clients * n)).chain(outs.iter().map(|o| ("client", o, n)))
        {
            let out = text(&o.stdout);
            assert!(o.status.success(), "{clients} clients, {who}: {}{out}", text(&o.stderr));
            assert!(out.contains(&format!("{msgs} messages in")) && out.ends_with("success\n"), "{who}: {out}");
        }
    }
}

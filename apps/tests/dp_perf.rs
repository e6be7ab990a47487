//! `dp-perf` runs every test on `shm` (both ends in one process, and client and server in two
//! processes) and prints perftest's JSON keys with sane values; bad runs fail with a sentence.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

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
            "--out_json_file",
            "-",
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
            run(&[test, "--loopback", "-n", "5000", "--out_json_file", "-", "--core", "-1", "--peer-core", "-1"]);
        assert!(ok, "{test}: {err}");
        let line = out.lines().find(|l| l.starts_with('{')).unwrap_or_else(|| panic!("{test}: no JSON in {out}"));
        assert_eq!(number(line, "n_iterations"), 5000.0);
        let (min, typ, p99, p999, p9999, max) = (
            number(line, "t_min"),
            number(line, "t_typical"),
            number(line, "percentile_99"),
            number(line, "percentile_99.9"),
            number(line, "percentile_99.99"),
            number(line, "t_max"),
        );
        assert!(min > 0.0 && min <= typ && typ <= p99 && p99 <= p999 && p999 <= p9999 && p9999 <= max, "{line}");
        // The median in nanoseconds is t_typical before its rounding to 0.01 us.
        let typ_ns = number(line, "t_typical_ns");
        assert!(typ_ns > 0.0 && (typ_ns / 1000.0 - typ).abs() <= 0.0051, "{line}");
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
    let (ok, _, err) = run(&["send_lat", "--loopback", "-q", "2"]);
    assert!(!ok && err.contains("latency tests use one QP"), "{err}");
    let (ok, _, err) = run(&["send_bw", "somehost", "--loopback"]);
    assert!(!ok && err.contains("cannot be used with"), "{err}");
    let (ok, _, err) = run(&["send_lat", "--histogram", "h.txt"]);
    assert!(!ok && err.contains("the client measures"), "{err}");
    let (ok, _, err) = run(&["send_lat", "--loopback", "-b"]);
    assert!(!ok && err.contains("one way only"), "{err}");
    let (ok, _, err) = run(&["send_bw", "--loopback", "-b", "-D", "1"]);
    assert!(!ok && err.contains("with -n only"), "{err}");
    let (ok, _, err) = run(&["send_bw", "--loopback", "-b", "-c", "UD"]);
    assert!(!ok && err.contains("reliable transports only"), "{err}");
}

/// `-b` (and in two processes, `client_and_server_in_two_processes`): both ends send and
/// receive at once. A run ends only when each end's receive half
/// has taken the other's `-n` messages per QP (a missing direction would leave it waiting
/// until the progress timeout fails it), with RQs and with an SRQ over several QPs, on RC
/// and XRC.
#[test]
fn bidirectional_send_bw_moves_both_ways() {
    for extra in [&["-c", "RC"][..], &["-c", "RC", "-q", "3", "--use-srq", "-l", "4"], &["-c", "XRC", "-q", "2"]] {
        let mut args =
            vec!["send_bw", "--loopback", "-b", "-s", "32", "-n", "30000", "--out_json_file", "-", "--core", "-1"];
        args.extend_from_slice(&["--peer-core", "-1"]);
        args.extend_from_slice(extra);
        let (ok, out, err) = run(&args);
        assert!(ok, "{extra:?}: {err}");
        let line = out.lines().find(|l| l.starts_with('{')).unwrap_or_else(|| panic!("{extra:?}: no JSON in {out}"));
        assert!(line.contains("\"Bidirectional\":\"ON\""), "{line}");
        assert_eq!(number(line, "n_iterations"), 30000.0, "iterations stay per direction: {line}");
        assert!(number(line, "MsgRate") > 0.0, "{line}");
    }
    let (ok, out, _) =
        run(&["send_bw", "--loopback", "-n", "1000", "--out_json_file", "-", "--core", "-1", "--peer-core", "-1"]);
    assert!(ok && !out.contains("Bidirectional"), "one-way runs keep perftest's keys: {out}");
}

// Client and server in two processes on one shm fabric, over the TCP exchange.

fn dp_perf(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_dp-perf"));
    c.args(args).stdout(Stdio::piped()).stderr(Stdio::piped());
    c
}

/// A TCP port nobody listens on right now.
fn free_port() -> String {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port().to_string()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Waits for `c` at most `limit`; kills it and fails the test if it is still running.
fn wait_within(mut c: Child, limit: Duration, who: &str) -> Output {
    let t0 = Instant::now();
    while c.try_wait().expect("try_wait").is_none() {
        if t0.elapsed() > limit {
            let _ = c.kill();
            let mut err = String::new();
            c.stderr.take().map(|mut s| s.read_to_string(&mut err));
            panic!("{who} still running after {limit:?} (stderr: {err})");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    c.wait_with_output().expect("output")
}

fn json_lines(out: &str) -> Vec<&str> {
    out.lines().filter(|l| l.starts_with('{')).collect()
}

#[test]
fn client_and_server_in_two_processes() {
    for (test, extra) in [
        ("send_bw", &["-q", "2", "-l", "4"][..]),
        ("write_lat", &[][..]),
        ("read_bw", &[][..]),
        ("atomic_lat", &[][..]),
        ("send_lat", &["-c", "UD"][..]),
        ("send_bw", &["-c", "XRC", "-q", "2", "-l", "4"][..]),
        ("write_bw", &["-c", "XRC"][..]),
        ("read_lat", &["-c", "XRC"][..]),
        ("atomic_bw", &["-c", "XRC"][..]),
        ("send_bw", &["-b", "-q", "2", "-l", "4"][..]),
        ("send_bw", &["-b", "-c", "XRC", "-q", "2"][..]),
    ] {
        let port = free_port();
        let fabric = format!("dp-perf-test-{}-{port}", std::process::id());
        let server = dp_perf(&[test, "-p", &port, "--out_json_file", "-"]).spawn().expect("spawn server");
        let mut cargs = vec![test, "127.0.0.1", "-p", &port, "-s", "64", "-n", "3000", "--fabric", &fabric];
        cargs.extend_from_slice(&["--out_json_file", "-"]);
        cargs.extend_from_slice(extra);
        let client = dp_perf(&cargs).spawn().expect("spawn client");
        let c = wait_within(client, Duration::from_secs(60), "client");
        let s = wait_within(server, Duration::from_secs(10), "server");
        assert!(c.status.success(), "{test} client: {}", text(&c.stderr));
        assert!(s.status.success(), "{test} server: {}", text(&s.stderr));
        let (cout, sout) = (text(&c.stdout), text(&s.stdout));
        let (cj, sj) = (json_lines(&cout), json_lines(&sout));
        assert_eq!(cj.len(), 1, "{test}: client JSON: {cout}");
        assert_eq!(sj.len(), 1, "{test}: server JSON: {sout}");
        let size = if test.starts_with("atomic") { 8.0 } else { 64.0 };
        for line in [cj[0], sj[0]] {
            assert_eq!(number(line, "MsgSize"), size, "{line}");
            assert_eq!(number(line, "n_iterations"), 3000.0, "{line}");
            assert!(line.contains("\"Data_ex_method\":\"Ethernet\""), "{line}");
            if extra.contains(&"XRC") {
                assert!(line.contains("\"Connection_type\":\"XRC\""), "{line}");
            }
            // -b: the server took it from the client and both print the sum of both ways.
            assert_eq!(line.contains("\"Bidirectional\":\"ON\""), extra.contains(&"-b"), "{line}");
        }
        // The server took the client's parameters and printed the client's numbers.
        let key = if test.ends_with("_lat") { "t_typical" } else { "BW_average" };
        assert_eq!(number(cj[0], key), number(sj[0], key), "{test}");
        assert!(number(cj[0], key) > 0.0, "{}", cj[0]);
        if test == "send_bw" {
            assert!(sj[0].contains("\"Number_of_qps\":2"), "{}", sj[0]);
            assert_eq!(sj[0].contains("\"Post_List\":4"), extra.contains(&"4"), "{}", sj[0]);
        }
    }
}

#[test]
fn mismatched_parameters_are_refused_by_name() {
    let port = free_port();
    let server = dp_perf(&["write_bw", "-p", &port, "-s", "4096"]).spawn().expect("spawn server");
    let client = dp_perf(&["write_bw", "127.0.0.1", "-p", &port, "-s", "8"]).spawn().expect("spawn client");
    let c = wait_within(client, Duration::from_secs(30), "client");
    let s = wait_within(server, Duration::from_secs(10), "server");
    assert!(!c.status.success() && !s.status.success());
    for err in [text(&c.stderr), text(&s.stderr)] {
        assert!(err.contains("-s/-a differs: the client has 8, this server 4096"), "{err}");
    }
    let port = free_port();
    let server = dp_perf(&["write_bw", "-p", &port]).spawn().expect("spawn server");
    let client = dp_perf(&["read_bw", "127.0.0.1", "-p", &port]).spawn().expect("spawn client");
    let c = wait_within(client, Duration::from_secs(30), "client");
    wait_within(server, Duration::from_secs(10), "server");
    assert!(text(&c.stderr).contains("the client runs read_bw, this server write_bw"), "{}", text(&c.stderr));
}

#[test]
fn a_dead_peer_is_an_error_within_seconds() {
    // The server dies in the middle of a long run: the client says so instead of hanging.
    let port = free_port();
    let mut server = dp_perf(&["send_lat", "-p", &port]).spawn().expect("spawn server");
    let mut client = dp_perf(&["send_lat", "127.0.0.1", "-p", &port, "-D", "60"]).spawn().expect("spawn client");
    // Killed only once the two are connected and measuring: the client prints its results'
    // header then (a fixed sleep raced a server slow to start on a loaded 2-core CI machine,
    // and the client reported the refused connection instead). The reader drains the rest.
    let out = client.stdout.take().expect("client stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufRead::lines(std::io::BufReader::new(out)).map_while(Result::ok) {
            if line.contains("#bytes") {
                let _ = tx.send(());
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(30)).expect("the client never started measuring");
    std::thread::sleep(Duration::from_millis(200));
    // The client is stopped until the server is reaped (as a shell would): a zombie's pid
    // still counts as a live fabric user, and the client (the last one) would leave the
    // fabric file behind if it won the race with the reaping.
    signal(client.id(), libc::SIGSTOP);
    server.kill().expect("kill server");
    server.wait().expect("reap server");
    signal(client.id(), libc::SIGCONT);
    let t0 = Instant::now();
    let c = wait_within(client, Duration::from_secs(10), "client");
    assert!(!c.status.success(), "client succeeded after its server died");
    let err = text(&c.stderr);
    assert!(err.contains("closed the connection") || err.contains("completion"), "{err}");
    assert!(t0.elapsed() < Duration::from_secs(5), "took {:?}", t0.elapsed());
    // Nobody listening: the client gives up after --peer-timeout.
    let c = dp_perf(&["send_bw", "127.0.0.1", "-p", &free_port(), "--peer-timeout", "0.5"]).output().expect("run");
    assert!(!c.status.success() && text(&c.stderr).contains("cannot connect to 127.0.0.1"), "{}", text(&c.stderr));
}

/// A fake client: connects to a server on `port` (retrying while it starts), writes `bytes`
/// (ignoring write errors: the server may hang up first) and returns the server's reply.
fn hostile_client(port: &str, bytes: &[u8]) -> String {
    let t0 = Instant::now();
    let mut s = loop {
        match std::net::TcpStream::connect(format!("127.0.0.1:{port}")) {
            Ok(s) => break s,
            Err(e) if t0.elapsed() > Duration::from_secs(10) => panic!("connecting to the server: {e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    s.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    let _ = s.write_all(bytes);
    let mut reply = String::new();
    let _ = s.read_to_string(&mut reply);
    reply
}

#[test]
fn the_server_refuses_hostile_client_lines() {
    // Sizes the command line would refuse, one of which overflows the slot arithmetic.
    for size in ["4294967296", "18446744073709551615"] {
        let port = free_port();
        let server = dp_perf(&["send_bw", "-p", &port]).spawn().expect("spawn server");
        let line = format!(
            "dp-perf/1 test=send_bw provider=shm conn=RC sizes={size} iters=10 duration=none qps=1 tx_depth=128 \
             rx_depth=512 cq_mod=100 post_list=1 inline=auto srq=0 fabric=dp-perf-{port}\n"
        );
        let reply = hostile_client(&port, line.as_bytes());
        let s = wait_within(server, Duration::from_secs(10), "server");
        let err = text(&s.stderr);
        assert!(!s.status.success() && !err.contains("panicked"), "{err}");
        assert!(err.contains(&format!("the client sent sizes={size}: a message is at most 4 GiB - 1")), "{err}");
        assert!(reply.starts_with("error ") && reply.contains("at most 4 GiB - 1"), "reply: {reply:?}");
    }
    // A line without end: refused after the cap, not buffered.
    let port = free_port();
    let server = dp_perf(&["send_bw", "-p", &port]).spawn().expect("spawn server");
    let reply = hostile_client(&port, &vec![b'a'; 64 << 20]);
    let s = wait_within(server, Duration::from_secs(10), "server");
    let err = text(&s.stderr);
    assert!(!s.status.success() && err.contains("sent a line longer than 4096 bytes"), "{err}");
    assert!(reply.is_empty() || reply.contains("longer than 4096 bytes"), "reply: {reply:?}");
}

fn signal(pid: u32, sig: libc::c_int) {
    // SAFETY: kill(2) on a child this test started; no memory is involved.
    assert_eq!(unsafe { libc::kill(pid as libc::pid_t, sig) }, 0, "signal {sig} to {pid}");
}

fn fabric_file(fabric: &str) -> std::path::PathBuf {
    std::path::PathBuf::from(format!("/dev/shm/dataplane.{fabric}"))
}

/// A server waiting for its client ends on SIGTERM or SIGINT, saying why (it used to wait on:
/// std's accept retries EINTR).
#[test]
fn a_waiting_server_stops_on_sigterm_and_sigint() {
    for sig in [libc::SIGTERM, libc::SIGINT] {
        let port = free_port();
        let server = dp_perf(&["send_lat", "-p", &port]).spawn().expect("spawn server");
        std::thread::sleep(Duration::from_millis(300)); // into its wait
        signal(server.id(), sig);
        let out = wait_within(server, Duration::from_secs(10), "signalled server");
        assert!(!out.status.success());
        let err = text(&out.stderr);
        assert!(err.contains("stopped by SIGINT or SIGTERM while waiting for a client"), "{err}");
    }
}

#[test]
fn the_survivor_of_a_killed_peer_removes_the_fabric_file() {
    // Either side killed mid-run: the other ends with an error, through its destructors, so
    // the fabric file goes with it.
    for kill_server in [true, false] {
        let port = free_port();
        let fabric = format!("dp-perf-kill-{}-{port}", std::process::id());
        let mut server = dp_perf(&["send_lat", "-p", &port]).spawn().expect("spawn server");
        let mut client = dp_perf(&["send_lat", "127.0.0.1", "-p", &port, "-D", "60", "--fabric", &fabric])
            .spawn()
            .expect("spawn client");
        let t0 = Instant::now();
        while !fabric_file(&fabric).exists() && t0.elapsed() < Duration::from_secs(20) {
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(Duration::from_millis(1000)); // into the traffic
        let (victim, survivor) = if kill_server { (&mut server, client) } else { (&mut client, server) };
        // The survivor is stopped until the victim is reaped: an unreaped zombie still counts
        // as a fabric user, and the survivor would race the reaping (the shell's, here ours).
        signal(survivor.id(), libc::SIGSTOP);
        victim.kill().expect("kill");
        victim.wait().expect("reap");
        signal(survivor.id(), libc::SIGCONT);
        let out = wait_within(survivor, Duration::from_secs(10), "survivor");
        assert!(!out.status.success(), "the survivor succeeded after its peer died");
        let err = text(&out.stderr);
        assert!(err.contains("closed the connection") || err.contains("completion"), "{err}");
        let left = fabric_file(&fabric).exists();
        let _ = std::fs::remove_file(fabric_file(&fabric));
        assert!(!left, "kill_server={kill_server}: {} left behind ({err})", fabric_file(&fabric).display());
    }
}

//! End-to-end tests of the `dataplane` binary: each example pipeline runs for a short time
//! and reports traffic, no sequence gaps and no leaked buffers; `check` reports bad files
//! with file:line:column and exit status 1.

use std::path::PathBuf;
use std::process::Command;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_dataplane"))
}

fn example(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../config/examples").join(name)
}

/// The integer after the first `"key":` in `json`.
fn field(json: &str, key: &str) -> u64 {
    let pat = format!("\"{key}\":");
    let i = json.find(&pat).unwrap_or_else(|| panic!("no {key} in {json}")) + pat.len();
    json[i..].chars().take_while(|c| c.is_ascii_digit()).collect::<String>().parse().unwrap()
}

/// Messages received by every sink stage.
fn sink_msgs(json: &str) -> Vec<u64> {
    json.match_indices("\"kind\":\"sink\",\"msgs\":")
        .map(|(i, p)| json[i + p.len()..].chars().take_while(|c| c.is_ascii_digit()).collect::<String>())
        .map(|s| s.parse().unwrap())
        .collect()
}

fn run_example(name: &str, sinks: usize) {
    let fabric = format!("test-{}-{}", name.trim_end_matches(".toml"), std::process::id());
    let out = bin()
        .args(["run", example(name).to_str().unwrap(), "--duration", "1s", "--json", "--fabric", &fabric])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{name}: exit {:?}\nstdout: {stdout}\nstderr: {stderr}", out.status);
    let json = stdout.trim();
    assert!(json.starts_with('{') && json.ends_with('}'), "{name}: not one JSON object: {json}");
    assert_eq!(field(json, "gaps"), 0, "{name}: sequence gaps: {json}");
    assert_eq!(field(json, "leaked"), 0, "{name}: leaked buffers: {json}");
    assert!(json.contains("\"drained\":true"), "{name}: drain incomplete: {json}");
    let msgs = sink_msgs(json);
    assert_eq!(msgs.len(), sinks, "{name}: sinks: {json}");
    assert!(msgs.iter().all(|&m| m > 0), "{name}: a sink received nothing: {json}");
}

#[test]
fn echo_example_runs_clean() {
    run_example("echo.toml", 1);
}

#[test]
fn forward_chain_example_runs_clean() {
    run_example("forward-chain.toml", 1);
}

#[test]
fn fanout_example_runs_clean() {
    run_example("fanout.toml", 3);
}

#[test]
fn check_accepts_the_examples() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../config/examples");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("toml") {
            continue;
        }
        let out = bin().args(["check", path.to_str().unwrap()]).output().unwrap();
        assert!(out.status.success(), "{}: {}", path.display(), String::from_utf8_lossy(&out.stderr));
        n += 1;
    }
    assert!(n >= 8, "only {n} examples in {}", dir.display());
}

#[test]
fn ud_loopback_echo_runs_clean() {
    // echo.toml with UD QPs: every message carries the GRH area in front of its payload on
    // receive, and every send goes through the address handle of its peer.
    let text = std::fs::read_to_string(example("echo.toml"))
        .unwrap()
        .replace("peer = \"server-qp\"", "peer = \"server-qp\"\ntransport = \"ud\"")
        .replace("peer = \"client-qp\"", "peer = \"client-qp\"\ntransport = \"ud\"")
        .replace("rate = 100_000", "rate = 5_000")
        // UD loses what arrives while no receive is posted: with other tests' unpinned busy
        // workers on the same two cores, give the receivers 800 ms of slack and let idle
        // workers yield.
        .replace("core = 0\n", "core = 0\nsrq_depth = 4096\ncq_depth = 8192\nidle = \"backoff\"\n")
        .replace("core = 1\n", "core = 1\nsrq_depth = 4096\ncq_depth = 8192\nidle = \"backoff\"\n");
    assert_eq!(text.matches("transport = \"ud\"").count(), 2);
    let p = temp_file("ud-echo.toml", &text);
    let fabric = format!("test-ud-echo-{}", std::process::id());
    let out = bin()
        .args(["run", p.to_str().unwrap(), "--duration", "1s", "--json", "--no-pin", "--fabric", &fabric])
        .output()
        .unwrap();
    let json = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "exit {:?}: {json} {}", out.status, String::from_utf8_lossy(&out.stderr));
    assert_eq!(field(&json, "gaps"), 0, "{json}");
    assert_eq!(field(&json, "leaked"), 0, "{json}");
    let msgs = sink_msgs(&json);
    assert!(msgs.len() == 1 && msgs[0] > 0, "{json}");
    // 64-byte messages: the GRH area is not counted as payload.
    let want = format!("\"kind\":\"sink\",\"msgs\":{},\"bytes\":{},", msgs[0], msgs[0] * 64);
    assert!(json.contains(&want), "want {want} in {json}");
}

#[test]
fn echo_with_receive_queues_of_their_own_runs_clean() {
    // echo.toml with `use_srq = false`: each QP receives through a queue of its own (RC
    // here, UD below), which the workers post and refill; the run must carry traffic both
    // ways and give every buffer back, the flushed receives included.
    for transport in ["rc", "ud"] {
        let own = format!("use_srq = false\nrecv_depth = 256\ntransport = \"{transport}\"");
        let text = std::fs::read_to_string(example("echo.toml"))
            .unwrap()
            .replace("peer = \"server-qp\"", &format!("peer = \"server-qp\"\n{own}"))
            .replace("peer = \"client-qp\"", &format!("peer = \"client-qp\"\n{own}"))
            .replace("rate = 100_000", "rate = 5_000");
        assert_eq!(text.matches("use_srq = false").count(), 2);
        let p = temp_file(&format!("own-rq-{transport}.toml"), &text);
        let fabric = format!("test-own-rq-{transport}-{}", std::process::id());
        let out = bin()
            .args(["run", p.to_str().unwrap(), "--duration", "1s", "--json", "--no-pin", "--fabric", &fabric])
            .output()
            .unwrap();
        let json = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{transport}: exit {:?}: {json} {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(field(&json, "gaps"), 0, "{transport}: {json}");
        assert_eq!(field(&json, "leaked"), 0, "{transport}: {json}");
        let msgs = sink_msgs(&json);
        assert!(msgs.len() == 1 && msgs[0] > 1000, "{transport}: {json}");
    }
}

fn temp_file(name: &str, text: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("dataplane-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

#[test]
fn check_reports_a_typo_with_file_line_column_and_exits_1() {
    let p = temp_file("typo.toml", "[[workers]]\nname = \"w\"\ncores = 0\n");
    let out = bin().args(["check", p.to_str().unwrap()]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let want = format!("{}:3:1", p.display());
    assert!(stderr.contains(&want), "want {want} in: {stderr}");
    assert!(stderr.contains("cores"), "{stderr}");
}

#[test]
fn run_refuses_a_bad_file_with_exit_1() {
    let p = temp_file("bad-core.toml", "[[workers]]\nname = \"w\"\ncore = 4096\n");
    let out = bin().args(["run", p.to_str().unwrap(), "--duration", "1s"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(&format!("{}:3:", p.display())), "{stderr}");
}

#[test]
fn rdma_provider_that_cannot_open_says_why_with_exit_1() {
    // No such device here, whether or not this machine has RDMA.
    let text = std::fs::read_to_string(example("echo-rdma.toml"))
        .unwrap()
        .replace("device = \"rxe0\"", "device = \"no-such-dev0\"");
    let p = temp_file("rdma.toml", &text);
    let out = bin().args(["run", p.to_str().unwrap(), "--duration", "1s"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.starts_with("dataplane: cannot open the rdma provider: "), "{stderr}");
}

#[test]
fn fabric_flag_with_rdma_is_refused() {
    let out = bin().args(["run", example("echo-rdma.toml").to_str().unwrap(), "--fabric", "x"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("--fabric names an shm fabric; this pipeline uses the rdma provider"), "{stderr}");
}

#[test]
fn check_refuses_what_the_shm_device_or_fabric_cannot_hold() {
    let echo = std::fs::read_to_string(example("echo.toml")).unwrap();
    let both = |depth: &str| {
        echo.replace("core = 0\n", &format!("core = 0\ncq_depth = {depth}\n"))
            .replace("core = 1\n", &format!("core = 1\ncq_depth = {depth}\n"))
    };
    // Above the device's max_cqe: named with its location, at check instead of at run.
    let p = temp_file("cq-too-deep.toml", &both("2147483648"));
    let out = bin().args(["check", p.to_str().unwrap()]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let want = format!(
        "{}:18:12: workers[0].cq_depth: 2147483648 is above what the shm device supports (max_cqe = 1048576)",
        p.display()
    );
    assert!(stderr.contains(&want), "want {want} in: {stderr}");
    // Within the device's limits, but two send CQs of 192 MiB (64 MiB of CQEs, 128 MiB of
    // message-queue cells) and two receive CQs of 64 MiB (CQEs only: the workers' receive CQs
    // have no message queue) do not fit the default fabric_size.
    let p = temp_file("cq-too-big.toml", &both("1048576"));
    let file = p.to_str().unwrap();
    for args in [&["check", file][..], &["run", file, "--fabric", "never-created"][..]] {
        let out = bin().args(args).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(stderr.contains("provider.fabric_size: fabric_size 64M is too small"), "{args:?}: {stderr}");
        assert!(stderr.contains("set fabric_size = \"511M\" or more"), "{args:?}: {stderr}");
    }
    assert!(!PathBuf::from("/dev/shm/dataplane.never-created").exists());
    // The size it asks for is enough.
    let p = temp_file(
        "cq-fits.toml",
        &both("1048576").replace("fabric = \"echo-demo\"", "fabric = \"echo-demo\"\nfabric_size = \"511M\""),
    );
    let out = bin().args(["check", p.to_str().unwrap()]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // A QP nobody reads: echo.toml without its echo stage.
    let i = echo.find("[[stages]]\nname = \"echo\"").unwrap();
    let j = i + echo[i..].find("\n\n").unwrap();
    let p = temp_file("no-echo.toml", &(echo[..i].to_owned() + &echo[j..]));
    let out = bin().args(["check", p.to_str().unwrap()]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("qps[1]: qp `server-qp` receives what stage `pacer` sends"), "{stderr}");
}

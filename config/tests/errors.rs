//! Every error names its file, line, column and field, with a message and a hint.

mod common;
use common::*;
use dataplane_config::{Config, ErrorKind, PageSize, ValidationEnv};

#[test]
fn base_is_valid() {
    assert!(errors(BASE).is_empty(), "{:?}", errors(BASE));
}

#[test]
fn unknown_field_suggests_the_closest() {
    let e = one_error(&base_with("core = 1\n", "core = 1\npoll_burts = 64\n"));
    assert_eq!(e.kind, ErrorKind::UnknownField);
    assert_eq!(e.line_column(), Some((8, 1)));
    assert_eq!(e.field, "workers[1].poll_burts");
    assert_eq!(e.message, "unknown field `poll_burts`, did you mean `poll_burst`?");
    assert!(e.to_string().starts_with(
        "pipeline.toml:8:1: workers[1].poll_burts: unknown field `poll_burts`, did you mean `poll_burst`?; hint: known fields here: `name`, `core`, "
    ), "{e}");
}

#[test]
fn unknown_value_suggests_the_closest() {
    let e = one_error(&base_with("core = 1\n", "core = 1\nidle = \"spinn\"\n"));
    assert_eq!(e.kind, ErrorKind::UnknownVariant);
    assert_eq!(e.line_column(), Some((8, 8)));
    assert_eq!(
        e.to_string(),
        "pipeline.toml:8:8: workers[1].idle: unknown value \"spinn\", did you mean \"spin\"?; hint: expected one of \"spin\", \"spin-then-pause\", \"backoff\""
    );
}

#[test]
fn wrong_type() {
    let e = one_error(&base_with("core = 1\n", "core = \"one\"\n"));
    assert_eq!(e.kind, ErrorKind::WrongType);
    assert_eq!(
        e.to_string(),
        "pipeline.toml:7:8: workers[1].core: invalid type: string \"one\", expected a non-negative integer; hint: write numbers without quotes, e.g. `core = 1`"
    );
}

#[test]
fn missing_required_field() {
    let e = one_error(&base_with("core = 1\n", ""));
    assert_eq!(e.kind, ErrorKind::MissingField);
    // Located at the table's header.
    assert_eq!(e.line_column(), Some((5, 1)));
    assert_eq!(e.field, "workers[1]");
    assert_eq!(e.message, "missing required field `core`");
}

#[test]
fn toml_syntax_error() {
    let e = one_error(&BASE.replacen("[[workers]]\n", "[[workers]\n", 1));
    assert_eq!(e.kind, ErrorKind::Syntax);
    assert_eq!(e.line_column(), Some((1, 10)));
    assert_eq!(e.field, "");
    assert!(e.to_string().starts_with("pipeline.toml:1:10: invalid table header; expected `.`, `]]`"), "{e}");
}

#[test]
fn core_that_does_not_exist() {
    let e = one_error(&base_with("core = 1\n", "core = 64\n"));
    assert_eq!(e.kind, ErrorKind::Resource);
    assert_eq!(
        e.to_string(),
        "pipeline.toml:7:8: workers[1].core: core 64 does not exist (this machine has cores 0-1); hint: pick one of 0-1; `lscpu` or `nproc` shows the cores"
    );
}

#[test]
fn core_used_twice() {
    let e = one_error(&base_with("core = 1\n", "core = 0\n"));
    assert_eq!(e.kind, ErrorKind::Duplicate);
    assert_eq!(
        e.to_string(),
        "pipeline.toml:7:8: workers[1].core: core 0 is already used by worker `w0` (at 3:8); hint: each busy-polling worker needs a core of its own; free cores: 1"
    );
}

#[test]
fn dangling_stage_reference() {
    let e = one_error(&base_with("output = \"a\"\n", "output = \"aa\"\n"));
    assert_eq!(e.kind, ErrorKind::Dangling);
    assert_eq!(
        e.to_string(),
        "pipeline.toml:23:10: stages[0].output: output `aa` is neither a qp nor a stage; hint: did you mean `a`?"
    );
}

#[test]
fn dangling_worker_reference() {
    let e = one_error(&base_with("worker = \"w1\"\nkind = \"echo\"", "worker = \"w2\"\nkind = \"echo\""));
    assert_eq!(e.kind, ErrorKind::Dangling);
    assert_eq!(
        e.to_string(),
        "pipeline.toml:27:10: stages[1].worker: worker `w2` does not exist; hint: did you mean `w0`?"
    );
}

#[test]
fn cycle_in_stage_wiring() {
    let text = format!(
        "{BASE}
[[stages]]
name = \"f1\"
worker = \"w0\"
kind = \"forward\"
input = \"f2\"
output = \"f2\"

[[stages]]
name = \"f2\"
worker = \"w0\"
kind = \"forward\"
input = \"f1\"
output = \"f1\"
"
    );
    let e = one_error(&text);
    assert_eq!(e.kind, ErrorKind::Cycle);
    // Reported where the loop closes: f2's output (line 49).
    assert_eq!(
        e.to_string(),
        "pipeline.toml:49:10: stages[4].output: stage wiring forms a cycle: f1 -> f2 -> f1; hint: stage links must not loop, or messages circulate forever; for a round trip, go through a qp pair"
    );
}

#[test]
fn stage_feeding_itself_is_a_cycle() {
    let text = format!(
        "{BASE}
[[stages]]
name = \"loop\"
worker = \"w0\"
kind = \"forward\"
input = \"loop\"
output = \"loop\"
"
    );
    let errs = errors(&text);
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert_eq!(errs[0].kind, ErrorKind::Cycle);
    assert_eq!(errs[0].line_column(), Some((42, 10)));
    assert!(errs[0].message.ends_with("cycle: loop -> loop"), "{}", errs[0]);
}

#[test]
fn watermark_above_depth() {
    let e = one_error(&base_with("core = 0\n", "core = 0\nsrq_low_watermark = 2048\n"));
    assert_eq!(e.kind, ErrorKind::Invalid);
    assert_eq!(
        e.to_string(),
        "pipeline.toml:4:21: workers[0].srq_low_watermark: srq_low_watermark 2048 must be below srq_depth 1024; hint: the worker refills the SRQ when fewer than srq_low_watermark buffers remain posted; a quarter of the depth (256) is a good start"
    );
}

#[test]
fn watermark_blames_the_depth_when_only_the_depth_was_written() {
    let e = one_error(&base_with("core = 0\n", "core = 0\nsrq_depth = 200\n"));
    assert_eq!(e.line_column(), Some((4, 13)));
    assert_eq!(e.field, "workers[0].srq_depth");
    assert_eq!(e.message, "srq_low_watermark 256 must be below srq_depth 200");
}

#[test]
fn doorbell_batch_above_send_depth() {
    let e = one_error(&base_with("core = 0\n", "core = 0\ndoorbell_batch = 256\n"));
    assert_eq!(e.kind, ErrorKind::Invalid);
    assert_eq!(
        e.to_string(),
        "pipeline.toml:4:18: workers[0].doorbell_batch: doorbell batch 256 exceeds send_depth 128 of qp `a`; hint: a batch must fit in the send queue: lower doorbell_batch to at most 128, or raise the qp's send_depth"
    );
}

#[test]
fn signal_interval_needs_twice_the_depth() {
    let e = one_error(&base_with("peer = \"b\"\n", "peer = \"b\"\nsignal_interval = 100\n"));
    assert_eq!(
        e.to_string(),
        "pipeline.toml:13:19: qps[0].signal_interval: signal interval 100 needs send_depth >= 200 (two intervals in flight), but qp `a` has send_depth 128; hint: lower the signal interval to at most 64, or raise send_depth to 200"
    );
}

#[test]
fn rnr_retry_out_of_range() {
    let e = one_error(&base_with("peer = \"b\"\n", "peer = \"b\"\nrnr_retry = 8\n"));
    assert_eq!(e.line_column(), Some((13, 13)));
    assert_eq!(e.field, "qps[0].rnr_retry");
    assert_eq!(e.message, "rnr_retry 8 is out of range: expected 0-7, where 7 retries forever");
}

#[test]
fn parameters_of_another_kind() {
    let e = one_error(&base_with("input = \"b\"\n", "input = \"b\"\nrate = 1000\n"));
    assert_eq!(
        e.to_string(),
        "pipeline.toml:30:8: stages[1].rate: `rate` applies only to kind = \"source\"; hint: remove it from this echo stage"
    );
}

#[test]
fn asymmetric_rc_peers() {
    let text = base_with("peer = \"a\"\n", "");
    let errs = errors(&text);
    let lines: Vec<String> = errs.iter().map(|e| e.to_string()).collect();
    assert_eq!(
        lines,
        [
            "pipeline.toml:12:8: qps[0].peer: rc qp `a` peers with `b`, but `b` has no peer; hint: an rc connection has two ends: set peer = \"a\" on qp `b`",
            "pipeline.toml:15:8: qps[1]: rc qp `b` has no peer; hint: set peer = \"<qp name>\" for a loopback, peer = \"host:port\" to connect to a remote process, or listen = \"host:port\" to wait for one",
        ]
    );
}

/// BASE with qp `b` listening for a remote peer and qp `a` connecting to one: two processes'
/// halves in one file (lines 12 and 17).
fn remote_base() -> String {
    base_with("peer = \"b\"\n", "peer = \"10.0.0.2:7000\"\n").replacen(
        "peer = \"a\"\n",
        "listen = \"0.0.0.0:7000\"\n",
        1,
    )
}

#[test]
fn remote_peer_and_listen_are_valid() {
    let text = remote_base();
    assert!(errors(&text).is_empty(), "{:?}", errors(&text));
    let c = dataplane_config::Config::from_str(&text, "pipeline.toml").unwrap();
    assert_eq!(c.qps[1].listen_addr(), Some(("0.0.0.0", 7000)));
    assert_eq!(c.qps[0].peer(), Some(dataplane_config::Peer::Remote { host: "10.0.0.2", port: 7000 }));
}

#[test]
fn peer_and_listen_together() {
    let e = one_error(&remote_base().replacen(
        "peer = \"10.0.0.2:7000\"\n",
        "peer = \"10.0.0.2:7000\"\nlisten = \"[::]:7001\"\n",
        1,
    ));
    assert_eq!(
        e.to_string(),
        "pipeline.toml:13:10: qps[0].listen: qp `a` has both `peer` and `listen`; hint: a qp either connects to its peer (`peer`) or waits for a remote one to connect (`listen`): remove one"
    );
}

#[test]
fn listen_without_a_port() {
    let e = one_error(&remote_base().replacen("\"0.0.0.0:7000\"", "\"0.0.0.0\"", 1));
    assert_eq!(
        e.to_string(),
        "pipeline.toml:17:10: qps[1].listen: listen address `0.0.0.0` has no port; hint: write \"host:port\": \"0.0.0.0:7000\" for every IPv4 address, \"[::]:7000\" for IPv6"
    );
}

#[test]
fn listen_with_a_bad_port_or_no_host() {
    let e = one_error(&remote_base().replacen("\"0.0.0.0:7000\"", "\"0.0.0.0:70000\"", 1));
    assert_eq!(e.line_column(), Some((17, 10)));
    assert_eq!(e.field, "qps[1].listen");
    assert_eq!(e.message, "peer `0.0.0.0:70000` has an invalid port `70000` (expected 1-65535)");
    let e = one_error(&remote_base().replacen("\"0.0.0.0:7000\"", "\":7000\"", 1));
    assert_eq!(e.message, "peer `:7000` has no host");
}

#[test]
fn remote_peer_with_a_bad_port() {
    let e = one_error(&remote_base().replacen("10.0.0.2:7000", "10.0.0.2:0", 1));
    assert_eq!(
        e.to_string(),
        "pipeline.toml:12:8: qps[0].peer: peer `10.0.0.2:0` has an invalid port `0` (expected 1-65535); hint: write a qp name, or \"host:port\" (\"[::1]:7000\" for IPv6)"
    );
}

#[test]
fn ud_echo_needs_a_peer_to_reply_to() {
    // qp `b` becomes UD without peer; `a` then peers with a UD qp (one error), and the echo
    // on `b` has nobody to reply to (the other).
    let text = base_with("peer = \"a\"\n", "transport = \"ud\"\n");
    let lines: Vec<String> = errors(&text).iter().map(|e| e.to_string()).collect();
    assert_eq!(
        lines,
        [
            "pipeline.toml:12:8: qps[0].peer: qp `a` is rc but its peer `b` is ud; hint: both ends of a connection use the same transport",
            "pipeline.toml:29:9: stages[1].input: echo stage `echo` replies on ud qp `b`, which has no peer to send to; hint: set peer (or listen) on qp `b`: a ud qp sends every message to its peer",
        ]
    );
}

#[test]
fn stage_on_the_wrong_worker_for_its_qp() {
    let e = one_error(&base_with("worker = \"w0\"\nkind = \"sink\"", "worker = \"w1\"\nkind = \"sink\""));
    assert_eq!(
        e.to_string(),
        "pipeline.toml:35:9: stages[2].input: qp `a` is owned by worker `w0`, but stage `sink` runs on worker `w1`; hint: a worker polls and posts only its own qps: move the stage to `w0` or the qp to `w1`"
    );
}

#[test]
fn hugepages_required_but_missing() {
    let text = format!("[memory]\nhugepages = \"require\"\n\n{BASE}");
    let env = ValidationEnv::with_cores([0, 1]).with_free_hugepages(PageSize::Huge2M, 4);
    let errs = errors_in(&text, &env);
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert_eq!(
        errs[0].to_string(),
        "pipeline.toml:2:13: memory.hugepages: buffer pools need 32 MiB of 2M huge pages (16 pages) but only 4 are free; hint: reserve 12 more pages (raise /sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages), shrink the pools, or set hugepages = \"prefer\""
    );
}

#[test]
fn memory_beyond_what_is_available() {
    let env = ValidationEnv::with_cores([0, 1]).with_mem_available(48 << 20);
    let errs = errors_in(BASE, &env);
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert_eq!(errs[0].kind, ErrorKind::Resource);
    assert_eq!(
        errs[0].message,
        "buffer pools (32 MiB) and the shm fabric (64 MiB) need 96 MiB of memory but only 48 MiB is available"
    );
}

#[test]
fn all_errors_are_reported_in_file_order() {
    let text = BASE
        .replacen("core = 1\n", "core = 9\n", 1)
        .replacen("peer = \"b\"\n", "peer = \"b\"\nrnr_retry = 9\n", 1)
        .replacen("output = \"a\"\n", "output = \"zz\"\n", 1);
    let errs = errors(&text);
    let fields: Vec<&str> = errs.iter().map(|e| e.field.as_str()).collect();
    assert_eq!(fields, ["workers[1].core", "qps[0].rnr_retry", "stages[0].output"]);
    let all = Config::from_str(&text, "pipeline.toml").unwrap().validate(&env()).unwrap_err().to_string();
    assert_eq!(all.lines().count(), 3);
}

#[test]
fn duplicate_names() {
    let e = one_error(&base_with("name = \"sink\"\n", "name = \"src\"\n"));
    assert_eq!(e.kind, ErrorKind::Duplicate);
    assert_eq!(
        e.to_string(),
        "pipeline.toml:32:8: stages[2].name: duplicate name `src`, already used by stages[0] (at 20:8); hint: QPs and stages share one namespace; names must be unique"
    );
}

#[test]
fn io_error_names_the_file() {
    let err = Config::from_file("/nonexistent/pipeline.toml").unwrap_err();
    assert_eq!(err.len(), 1);
    assert_eq!(err.0[0].kind, ErrorKind::Io);
    assert!(err.to_string().starts_with("/nonexistent/pipeline.toml: cannot read the file: "));
}

#[test]
fn a_qp_that_receives_but_that_no_stage_reads_is_an_error() {
    // BASE without its echo stage: `b` receives what `src` sends on `a`, and nobody polls it.
    let text = base_with("[[stages]]\nname = \"echo\"\nworker = \"w1\"\nkind = \"echo\"\ninput = \"b\"\n\n", "");
    let e = one_error(&text);
    assert_eq!(e.kind, ErrorKind::Invalid);
    assert_eq!(e.field, "qps[1]");
    assert_eq!(e.line_column(), Some((15, 8)), "at the QP's name: {e}");
    assert_eq!(
        e.message,
        "qp `b` receives what stage `src` sends on its peer `a`, but no stage reads it (no stage has input = \"b\")"
    );
    // The examples' one-way paths (fanout's publisher QPs) need no reader; minus one of its
    // sinks, fanout.toml loses that subscriber's messages.
    let fanout = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/fanout.toml")).unwrap();
    let sink_c = fanout.find("[[stages]]\nname = \"sink-c\"").expect("fanout.toml has sink-c");
    let end = fanout[sink_c + 1..].find("[[").map_or(fanout.len(), |i| sink_c + 1 + i);
    let e = one_error(&(fanout[..sink_c].to_owned() + &fanout[end..]));
    assert_eq!(e.field, "qps[5]", "{e}");
    assert!(e.message.starts_with("qp `rx-c` receives what stage `fan` sends on its peer `to-c`"), "{e}");
}

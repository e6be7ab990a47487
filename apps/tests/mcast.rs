//! Multicast in a pipeline: a UD QP whose `peer` is a group sends each message once, and every
//! QP that joined the group (`mcast`) receives its own copy; a failed join stops the start
//! with an error naming the QP and the group.

use dataplane_apps::runner::{self, RunOptions, RunReport};
use dataplane_apps::stages::Registry;
use std::sync::atomic::AtomicBool;

const PIPELINE: &str = r#"[[workers]]
name = "w0"
core = 0
idle = "backoff"

[[workers]]
name = "w1"
core = 1
idle = "backoff"

[[qps]]
name = "pub"
worker = "w0"
transport = "ud"
peer = "ff0e::1:1"

[[qps]]
name = "sub1"
worker = "w1"
transport = "ud"
mcast = "ff0e::1:1"

[[qps]]
name = "sub2"
worker = "w1"
transport = "ud"
mcast = "ff0e::1:1"

[[stages]]
name = "src"
worker = "w0"
kind = "source"
output = "pub"
count = 10

[[stages]]
name = "sink1"
worker = "w1"
kind = "sink"
input = "sub1"

[[stages]]
name = "sink2"
worker = "w1"
kind = "sink"
input = "sub2"
"#;

fn run(text: &str, tag: &str) -> Result<RunReport, String> {
    let dir = std::env::temp_dir().join(format!("dp-mcast-{}-{tag}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("mcast.toml");
    std::fs::write(&path, text).unwrap();
    let reg = Registry::new();
    let cfg = reg.load(&path).unwrap_or_else(|e| panic!("{e}"));
    let opts = RunOptions {
        fabric: Some(format!("mcast-{}-{tag}", std::process::id())),
        no_pin: true,
        no_stats: true,
        duration: None,
        doorbell_batch: None,
    };
    let r = runner::run(&cfg, &reg, &opts, &AtomicBool::new(false));
    let _ = std::fs::remove_dir_all(dir);
    r
}

/// The source's 10 messages are posted once each on `pub` and arrive on both subscribers.
#[test]
fn a_send_to_the_group_reaches_every_subscriber() {
    let r = run(PIPELINE, "two").unwrap_or_else(|e| panic!("{e}"));
    let qps: Vec<_> = r.workers.iter().flat_map(|w| &w.qps).collect();
    let q = |name: &str| qps.iter().find(|q| q.name == name).unwrap();
    assert_eq!(q("pub").tx_msgs, 10, "one post per message, not one per member");
    assert_eq!((q("sub1").rx_msgs, q("sub2").rx_msgs), (10, 10));
    let stages: Vec<_> = r.workers.iter().flat_map(|w| &w.stages).collect();
    for sink in ["sink1", "sink2"] {
        let s = stages.iter().find(|s| s.name == sink).unwrap();
        assert_eq!((s.msgs_in, s.report.gaps), (10, 0), "{sink}");
    }
    assert_eq!(r.pools.iter().map(|p| p.leaked).sum::<usize>(), 0);
}

/// A join the provider refuses (here: 33 QPs for a group of at most 32 on shm) stops the
/// start, naming the QP and the group.
#[test]
fn a_refused_join_names_the_qp_and_the_group() {
    // Room in w1's CQ for 33 QPs' send queues.
    let mut text = PIPELINE.replace("core = 1\n", "core = 1\ncq_depth = 8192\n");
    for i in 3..=33 {
        text += &format!("\n[[qps]]\nname = \"sub{i}\"\nworker = \"w1\"\ntransport = \"ud\"\nmcast = \"ff0e::1:1\"\n");
        text += &format!("\n[[stages]]\nname = \"sink{i}\"\nworker = \"w1\"\nkind = \"sink\"\ninput = \"sub{i}\"\n");
    }
    let err = run(&text, "full").unwrap_err();
    assert!(err.starts_with("qp sub33: join multicast group ff0e::1:1: "), "{err}");
    assert!(err.contains("ENOMEM") && err.contains("max_mcast_qp_attach"), "{err}");
}

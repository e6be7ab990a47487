//! `mcast` on a pipeline QP: the runner joins the QP to its group right after creating it,
//! and a failure to join stops the start with an error naming the QP and the group.

use dataplane_apps::runner::{self, RunOptions};
use dataplane_apps::stages::Registry;
use std::sync::atomic::AtomicBool;

const PIPELINE: &str = r#"[[workers]]
name = "w0"
core = 0

[[workers]]
name = "w1"
core = 1

[[qps]]
name = "pub"
worker = "w0"
transport = "ud"
peer = "sub"

[[qps]]
name = "sub"
worker = "w1"
transport = "ud"
peer = "pub"
mcast = "ff0e::1:1"

[[stages]]
name = "src"
worker = "w0"
kind = "source"
output = "pub"
count = 10

[[stages]]
name = "sink"
worker = "w1"
kind = "sink"
input = "sub"
"#;

/// On shm, whose fabric has no multicast groups yet, the join is refused (EOPNOTSUPP) and the
/// run does not start: the runner called `attach_mcast` for `sub` and reported its failure.
#[test]
fn the_runner_joins_the_group_of_a_ud_qp() {
    let dir = std::env::temp_dir().join(format!("dp-mcast-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("mcast.toml");
    std::fs::write(&path, PIPELINE).unwrap();
    let reg = Registry::new();
    let cfg = reg.load(&path).unwrap_or_else(|e| panic!("{e}"));
    let opts = RunOptions {
        fabric: Some(format!("mcast-{}", std::process::id())),
        no_pin: true,
        no_stats: true,
        duration: None,
        doorbell_batch: None,
    };
    let err = runner::run(&cfg, &reg, &opts, &AtomicBool::new(false)).unwrap_err();
    assert!(err.starts_with("qp sub: join multicast group ff0e::1:1: "), "{err}");
    assert!(err.contains("EOPNOTSUPP"), "{err}");
}

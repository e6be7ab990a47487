//! `config/reference.toml` lists every field at its default; it must parse, validate, and
//! agree with the defaults in code.

mod common;
use common::env;
use dataplane_config::*;

fn reference() -> Config {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/reference.toml");
    let config = Config::from_file(path).unwrap_or_else(|e| panic!("{e}"));
    config.validate(&env()).unwrap_or_else(|e| panic!("{e}"));
    config
}

#[test]
fn reference_parses_and_validates() {
    reference();
}

#[test]
fn reference_values_are_the_defaults() {
    let c = reference();
    let d = Config::default();
    assert_eq!(c.provider, d.provider);
    assert_eq!(c.memory, d.memory);
    assert_eq!(c.memory, MemoryConfig::default());

    let workers: Vec<WorkerConfig> = vec![WorkerConfig::new("w0", 0), WorkerConfig::new("w1", 1)];
    assert_eq!(c.workers, workers);

    let qp = |name: &str, worker: &str, peer: &str| QpConfig { peer: Some(peer.into()), ..QpConfig::new(name, worker) };
    assert_eq!(
        c.qps,
        vec![
            qp("to-echo", "w0", "echo-in"),
            qp("echo-in", "w1", "to-echo"),
            qp("to-fwd", "w0", "fwd-in"),
            qp("fwd-in", "w1", "to-fwd"),
        ]
    );

    let stage = |name: &str, worker: &str, kind, input: Option<&str>, output: Option<&str>| StageConfig {
        input: input.map(Located::from),
        output: output.map(Located::from),
        ..StageConfig::new(name, worker, kind)
    };
    let mut fan = stage("fan", "w0", StageKind::Fanout, Some("seq"), None);
    fan.outputs = Located::new(vec!["to-echo".into(), "to-fwd".into()]);
    assert_eq!(
        c.stages,
        vec![
            stage("src", "w0", StageKind::Source, None, Some("seq")),
            stage("seq", "w0", StageKind::Sequencer, Some("src"), Some("fan")),
            fan,
            stage("echo", "w1", StageKind::Echo, Some("echo-in"), None),
            stage("fwd", "w1", StageKind::Forward, Some("fwd-in"), Some("end")),
            stage("end", "w1", StageKind::Sink, Some("fwd"), None),
            stage("rtt", "w0", StageKind::Sink, Some("to-echo"), None),
        ]
    );
}

#[test]
fn reference_writes_every_field_explicitly() {
    // Every field of the first worker, QP (except the optional signal_interval) and pool is
    // written, so the file really is a reference and not a lucky parse of defaults.
    let c = reference();
    let w = &c.workers[0];
    for (name, explicit) in [
        ("pool", w.pool.is_explicit()),
        ("idle", w.idle.is_explicit()),
        ("spin_count", w.spin_count.is_explicit()),
        ("cq_depth", w.cq_depth.is_explicit()),
        ("poll_burst", w.poll_burst.is_explicit()),
        ("srq_depth", w.srq_depth.is_explicit()),
        ("srq_low_watermark", w.srq_low_watermark.is_explicit()),
        ("recv_buffer_size", w.recv_buffer_size.is_explicit()),
        ("doorbell_batch", w.doorbell_batch.is_explicit()),
        ("signal_interval", w.signal_interval.is_explicit()),
    ] {
        assert!(explicit, "workers[0].{name} is not in reference.toml");
    }
    let q = &c.qps[0];
    for (name, explicit) in [
        ("transport", q.transport.is_explicit()),
        ("send_depth", q.send_depth.is_explicit()),
        ("recv_depth", q.recv_depth.is_explicit()),
        ("max_inline", q.max_inline.is_explicit()),
        ("min_rnr_timer", q.min_rnr_timer.is_explicit()),
        ("rnr_retry", q.rnr_retry.is_explicit()),
        ("retry_cnt", q.retry_cnt.is_explicit()),
        ("timeout", q.timeout.is_explicit()),
        ("use_srq", q.use_srq.is_explicit()),
    ] {
        assert!(explicit, "qps[0].{name} is not in reference.toml");
    }
    let p = &c.memory.pools[0];
    assert!(p.buffer_size.is_explicit() && p.count.is_explicit() && p.cache_size.is_explicit());
    assert!(c.memory.hugepages.is_explicit() && c.memory.page_size.is_explicit());
    assert!(c.provider.kind.is_explicit() && c.provider.fabric.is_explicit());
    assert!(c.provider.fabric_size.is_explicit());
    let src = &c.stages[0];
    assert!(src.rate.is_explicit() && src.message_size.is_explicit());
    assert!(src.count.is_explicit() && src.duration.is_explicit());
    let sink = &c.stages[5];
    assert!(sink.verify_sequence.is_explicit() && sink.histogram.is_explicit());
}

#[test]
fn reference_rdma_block_matches_the_defaults() {
    // The rdma fields are commented out in reference.toml (they are errors with kind = "shm");
    // uncommented, with kind = "rdma" and the shm fields removed, they give the defaults.
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/reference.toml")).unwrap();
    let mut out = String::new();
    for line in text.lines() {
        let line = match line {
            l if l.starts_with("kind = \"shm\"") => "kind = \"rdma\"",
            l if l.starts_with("fabric") => continue,
            l if l.starts_with("# port = ") || l.starts_with("# gid_index = ") => &l[2..],
            l => l,
        };
        out.push_str(line);
        out.push('\n');
    }
    let c = Config::from_str(&out, "reference-rdma.toml").unwrap_or_else(|e| panic!("{e}"));
    c.validate(&env()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(*c.provider.kind, ProviderKind::Rdma);
    assert!(c.provider.port.is_explicit() && c.provider.gid_index.is_explicit());
    assert_eq!(*c.provider.port, defaults::PORT);
    assert_eq!(*c.provider.gid_index, defaults::GID_INDEX);
    assert_eq!(c.provider.device, None);
}

#[test]
fn defaults_in_code_match_the_documented_ones() {
    let w = WorkerConfig::new("w", 0);
    assert_eq!(*w.poll_burst, 32);
    assert_eq!(*w.idle, IdlePolicy::Spin);
    let q = QpConfig::new("q", "w");
    assert_eq!((*q.rnr_retry, *q.min_rnr_timer, *q.send_depth), (7, 12, 128));
    let p = ProviderConfig::default();
    assert_eq!((*p.port, *p.gid_index), (1, 0));
    assert_eq!(*p.kind, ProviderKind::Shm);
    let m = MemoryConfig::default();
    assert_eq!(*m.hugepages, HugepagePolicy::Prefer);
    assert_eq!(m.pools, vec![PoolConfig::new("default")]);
}

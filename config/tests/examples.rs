//! Every pipeline in `config/examples/` parses and validates on a 2-core machine.

mod common;
use dataplane_config::{Config, Peer, ProviderKind, StageKind};

#[test]
fn every_example_validates_on_two_cores() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/examples");
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("toml") {
            continue;
        }
        let config = Config::from_file(&path).unwrap_or_else(|e| panic!("{e}"));
        config.validate(&common::env()).unwrap_or_else(|e| panic!("{e}"));
        for w in &config.workers {
            assert!(*w.core <= 1, "{}: core {} on a 2-core machine", path.display(), *w.core);
        }
        names.push(path.file_name().unwrap().to_string_lossy().into_owned());
    }
    names.sort();
    assert_eq!(
        names,
        [
            "echo-rdma.toml",
            "echo.toml",
            "fanout.toml",
            "forward-chain.toml",
            "l2fwd.toml",
            "remote-client-rdma.toml",
            "remote-client.toml",
            "remote-server-rdma.toml",
            "remote-server.toml"
        ]
    );
}

#[test]
fn echo_example_is_a_paced_shm_loopback() {
    let c = Config::from_file(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/echo.toml")).unwrap();
    assert_eq!(c.provider.kind.as_str(), "shm");
    let src = c.stages.iter().find(|s| *s.kind == StageKind::Source).unwrap();
    assert_eq!(src.rate.to_string(), "100000 msgs/s");
    assert!(c.stages.iter().any(|s| *s.kind == StageKind::Echo));
}

fn example(name: &str) -> Config {
    Config::from_file(format!("{}/examples/{name}", env!("CARGO_MANIFEST_DIR"))).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn echo_rdma_mirrors_echo_on_rxe0() {
    let (shm, rdma) = (example("echo.toml"), example("echo-rdma.toml"));
    assert_eq!(*rdma.provider.kind, ProviderKind::Rdma);
    assert_eq!(rdma.provider.device.as_deref().map(String::as_str), Some("rxe0"));
    assert_eq!(*rdma.provider.gid_index, 1);
    let names = |c: &Config| -> Vec<(String, String)> {
        c.qps.iter().map(|q| (q.name.to_string(), q.peer.as_deref().cloned().unwrap_or_default())).collect()
    };
    assert_eq!(names(&shm), names(&rdma));
    let stages = |c: &Config| -> Vec<(String, StageKind)> {
        c.stages.iter().map(|s| (s.name.to_string(), s.kind.value.clone())).collect()
    };
    assert_eq!(stages(&shm), stages(&rdma));
}

#[test]
fn remote_pairs_name_each_others_address() {
    for (server, client, kind) in [
        ("remote-server.toml", "remote-client.toml", ProviderKind::Shm),
        ("remote-server-rdma.toml", "remote-client-rdma.toml", ProviderKind::Rdma),
    ] {
        let (s, c) = (example(server), example(client));
        assert_eq!((*s.provider.kind, *c.provider.kind), (kind, kind), "{server} / {client}");
        let listen = s.qps[0].listen_addr().unwrap_or_else(|| panic!("{server}: no listen"));
        assert_eq!(c.qps[0].peer(), Some(Peer::Remote { host: listen.0, port: listen.1 }), "{client}");
        assert!(c.stages.iter().any(|st| *st.kind == StageKind::Source), "{client}");
        assert!(c.stages.iter().any(|st| *st.kind == StageKind::Sink && *st.verify_sequence), "{client}");
        assert!(s.stages.iter().any(|st| *st.kind == StageKind::Echo), "{server}");
    }
}

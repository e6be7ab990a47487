//! The `xdp` provider in a pipeline file: `interfaces`, `raw_packet` QPs and their `port`;
//! every mistake is an error naming the file, line, column and field.

mod common;
use common::*;
use dataplane_config::{Config, ProviderKind, Transport};

/// A two-port forwarder; `qp2` is the text of the second QP's extra lines.
fn l2fwd(provider: &str, qp2: &str) -> String {
    format!(
        "[provider]\n{provider}\n\n[[workers]]\nname = \"w\"\ncore = 0\n\n\
         [[qps]]\nname = \"p1\"\nworker = \"w\"\ntransport = \"raw_packet\"\n\n\
         [[qps]]\nname = \"p2\"\nworker = \"w\"\n{qp2}\n\
         [[stages]]\nname = \"f\"\nworker = \"w\"\nkind = \"forward\"\ninput = \"p1\"\noutput = \"p2\"\n"
    )
}

const XDP: &str = "kind = \"xdp\"\ninterfaces = [\"veth0\", \"veth1\"]";

#[test]
fn two_port_forwarder_validates() {
    let text = l2fwd(XDP, "transport = \"raw_packet\"\nport = 2\n");
    assert!(errors(&text).is_empty(), "{:?}", errors(&text));
    let cfg = Config::from_str(&text, "pipeline.toml").unwrap();
    assert_eq!(*cfg.provider.kind, ProviderKind::Xdp);
    assert_eq!(cfg.provider.interfaces.as_deref().map(Vec::len), Some(2));
    assert_eq!(*cfg.qps[1].transport, Transport::RawPacket);
    assert_eq!(cfg.qps[1].port.as_deref().copied(), Some(2));
}

#[test]
fn port_beyond_the_interfaces() {
    let e = one_error(&l2fwd(XDP, "transport = \"raw_packet\"\nport = 3\n"));
    assert_eq!(
        e.to_string(),
        "pipeline.toml:18:8: qps[1].port: port 3 does not exist: the xdp device has ports 1..=2 (provider.interfaces); hint: ports are numbered from 1, in the order of provider.interfaces"
    );
}

#[test]
fn xdp_has_raw_packet_qps_only() {
    let errs = errors(&l2fwd(XDP, "transport = \"ud\"\n"));
    let e = errs.iter().find(|e| e.field == "qps[1].transport").unwrap_or_else(|| panic!("{errs:?}"));
    assert_eq!(e.message, "qp `p2` is ud; the xdp provider has raw_packet QPs only");
    assert!(e.to_string().starts_with("pipeline.toml:17:13: "), "{e}");
}

#[test]
fn raw_packet_runs_on_xdp_and_on_the_shm_switch_not_in_rdma_pipelines() {
    let shm = l2fwd("kind = \"shm\"", "transport = \"raw_packet\"\n");
    assert!(errors(&shm).is_empty(), "{:?}", errors(&shm));
    let e = one_error(&l2fwd("kind = \"shm\"", "transport = \"raw_packet\"\nport = 1\n"));
    assert_eq!(e.field, "qps[1].port");
    assert_eq!(e.message, "`port` picks an interface of the xdp provider; the shm provider has one switch");
    let errs = errors(&l2fwd("kind = \"rdma\"", "transport = \"raw_packet\"\n"));
    assert_eq!(errs.len(), 2, "{errs:?}");
    assert_eq!(errs[0].message, "qp `p1` is raw_packet, which the rdma provider does not run in pipelines");
    assert_eq!(errs[0].field, "qps[0].transport");
}

#[test]
fn xdp_needs_interfaces_and_refuses_other_kinds_fields() {
    let e = one_error(&l2fwd("kind = \"xdp\"", "transport = \"raw_packet\"\n"));
    assert_eq!(e.field, "provider.interfaces");
    assert_eq!(e.message, "kind = \"xdp\" needs `interfaces`");
    let errs = errors(&l2fwd(&format!("{XDP}\ndevice = \"mlx5_0\""), "transport = \"raw_packet\"\n"));
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert_eq!(errs[0].field, "provider.device");
    let errs = errors(&l2fwd("kind = \"shm\"\ninterfaces = [\"eth0\"]", "transport = \"rc\"\npeer = \"p1\"\n"));
    assert!(errs.iter().any(|e| e.field == "provider.interfaces"), "{errs:?}");
    let e = one_error(&l2fwd("kind = \"xdp\"\ninterfaces = [\"no/slash\"]", "transport = \"raw_packet\"\n"));
    assert_eq!(e.message, "`no/slash` is not an interface name (1-15 characters, no `/` or space)");
}

#[test]
fn raw_packet_qp_has_no_peer() {
    let e = one_error(&l2fwd(XDP, "transport = \"raw_packet\"\npeer = \"p1\"\n"));
    assert_eq!(e.field, "qps[1].peer");
    assert!(e.message.starts_with("raw_packet qp `p2` has `peer`"), "{e}");
}

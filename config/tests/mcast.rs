//! `mcast` on a QP: a UD QP joins a multicast group; anything else is an error naming the
//! file, line, column and field.

mod common;
use common::*;
use dataplane_config::Config;

/// BASE with both QPs UD (peers of each other) and `a` given `mcast = <group>` on line 14.
fn ud_pair_with_mcast(group: &str) -> String {
    base_with("peer = \"b\"\n", &format!("peer = \"b\"\ntransport = \"ud\"\nmcast = \"{group}\"\n")).replacen(
        "peer = \"a\"\n",
        "peer = \"a\"\ntransport = \"ud\"\n",
        1,
    )
}

#[test]
fn ud_qp_joins_a_group() {
    let text = ud_pair_with_mcast("ff0e::1:1");
    assert!(errors(&text).is_empty(), "{:?}", errors(&text));
    let cfg = Config::from_str(&text, "pipeline.toml").unwrap();
    let mut want = [0u8; 16];
    (want[0], want[1], want[13], want[15]) = (0xff, 0x0e, 1, 1);
    assert_eq!(cfg.qps[0].mcast_gid(), Some(want));
    assert_eq!(cfg.qps[1].mcast_gid(), None);
}

#[test]
fn rc_qp_cannot_join() {
    let e = one_error(&base_with("peer = \"b\"\n", "peer = \"b\"\nmcast = \"ff0e::1:1\"\n"));
    assert_eq!(
        e.to_string(),
        "pipeline.toml:13:9: qps[0].mcast: qp `a` is rc; only a ud qp can join a multicast group; hint: set transport = \"ud\" on this qp, or remove `mcast`"
    );
}

#[test]
fn group_must_be_an_ipv6_multicast_address() {
    let e = one_error(&ud_pair_with_mcast("fe80::1"));
    assert_eq!(
        e.to_string(),
        "pipeline.toml:14:9: qps[0].mcast: `fe80::1` is not a multicast address (ff00::/8); hint: write an IPv6 multicast address, e.g. mcast = \"ff0e::1:1\""
    );
    let e = one_error(&ud_pair_with_mcast("239.1.1.1"));
    assert_eq!(e.field, "qps[0].mcast");
    assert_eq!(e.message, "`239.1.1.1` is not an IPv6 address");
}

#[test]
fn ud_qp_sends_to_a_group_named_as_its_peer() {
    // `a` sends to the group; `b` joins it (and answers `a` directly).
    let text = base_with("peer = \"b\"\n", "peer = \"ff0e::1:1\"\ntransport = \"ud\"\n").replacen(
        "peer = \"a\"\n",
        "peer = \"a\"\ntransport = \"ud\"\nmcast = \"ff0e::1:1\"\n",
        1,
    );
    assert!(errors(&text).is_empty(), "{:?}", errors(&text));
    let cfg = Config::from_str(&text, "pipeline.toml").unwrap();
    let mut want = [0u8; 16];
    (want[0], want[1], want[13], want[15]) = (0xff, 0x0e, 1, 1);
    assert_eq!(cfg.qps[0].peer(), Some(dataplane_config::Peer::Group(want)));
}

#[test]
fn rc_qp_cannot_send_to_a_group() {
    // (`b`, the other end, is then reported as not peered back.)
    let e = errors(&base_with("peer = \"b\"\n", "peer = \"ff0e::1:1\"\n")).remove(0);
    assert_eq!(
        e.to_string(),
        "pipeline.toml:12:8: qps[0].peer: rc qp `a` has a multicast group as its peer (`ff0e::1:1`); hint: only a ud qp sends to a multicast group: set transport = \"ud\""
    );
}

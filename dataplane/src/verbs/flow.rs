//! Steering rules for RAW_PACKET QPs (`ibv_create_flow(3)`): which received frames a QP gets.

/// One steering rule: a frame matches when every field that is `Some` matches (a rule with
/// no field set matches every frame, like `IBV_FLOW_ATTR_ALL_DEFAULT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct FlowSpec {
    /// Destination MAC address (`IBV_FLOW_SPEC_ETH` `dst_mac`).
    pub dst_mac: Option<[u8; 6]>,
    /// EtherType after any VLAN tag (`IBV_FLOW_SPEC_ETH` `ether_type`).
    pub ether_type: Option<u16>,
    /// IPv4 protocol / IPv6 next header (`IBV_FLOW_SPEC_IPV4_EXT` `proto`).
    pub ip_proto: Option<u8>,
    /// TCP or UDP destination port (`IBV_FLOW_SPEC_TCP`/`_UDP` `dst_port`).
    pub dst_port: Option<u16>,
    /// Lower wins when two rules of different QPs match the same frame (`ibv_flow_attr.priority`).
    pub priority: u16,
}

impl FlowSpec {
    /// Whether a frame with headers `k` matches every field this rule sets (the `xdp`
    /// provider's steering; `shm` matches its rules in the fabric's own table).
    pub fn matches(&self, k: &crate::net::frame::FrameKey) -> bool {
        let mac = |m: &[u8; 6]| m.iter().fold(0u64, |a, &b| a << 8 | u64::from(b));
        self.dst_mac.is_none_or(|m| mac(&m) == k.dst_mac)
            && self.ether_type.is_none_or(|e| e == k.ether_type)
            && self.ip_proto.is_none_or(|p| k.ip_proto == Some(p))
            && self.dst_port.is_none_or(|p| k.dst_port == Some(p))
    }
}

/// A rule installed on a QP, returned by `Qp::create_flow` and given back to `destroy_flow`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FlowId(pub u32);

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

/// A rule installed on a QP, returned by `Qp::create_flow` and given back to `destroy_flow`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FlowId(pub u32);

//! Packet stages for pipelines on RAW_PACKET QPs (provider `xdp`, or the `shm` fabric's
//! software switch), registered by the `dataplane` binary next to the built-in kinds
//! ([`register`]):
//!
//! | kind | endpoints | what it does |
//! |---|---|---|
//! | `parse` | input, 1-2 outputs | checks every header length ([`dataplane::net::headers`]), counts frames per protocol; malformed frames to output 1 or dropped, counted per reason |
//! | `acl` | input, 1-2 outputs | first-match pass/drop rules on EtherType, protocol, IPv4/IPv6 prefixes, port ranges; denied frames to output 1 or dropped |
//! | `mac-swap` | input, 1 output | swaps destination and source MACs (testpmd's `macswap`) |
//! | `ipv4-router` | input, 1-16 outputs | longest-prefix match, TTL and checksum, next-hop MACs ([`dataplane::net::route`]) |
//! | `pcap-writer` | input, 0-1 output | writes each frame to a pcap file, passes it on |
//! | `pcap-reader` | source | replays a pcap file's frames (`loops`, `rate`) |
//!
//! ```toml
//! [[stages]]
//! name = "filter"
//! worker = "w"
//! kind = "acl"
//! input = "parse"
//! outputs = ["route", "denied-capture"]   # output 1: what the rules deny
//! [stages.params]
//! default = "drop"
//! rules = [
//!   { action = "drop", src = "10.1.0.66/32" },
//!   { action = "pass", proto = "udp", dst = "10.2.0.0/24", dst_port = "5000-5999" },
//!   { action = "pass", ether_type = "arp" },
//! ]
//! ```
//!
//! Every parameter is checked by `dataplane check` (file, line and column of the `params`
//! table, the rule and field named); see `config/examples/packet/`.

mod capture;
mod forward;
mod inspect;

pub use capture::{PcapReplay, PcapTap};
pub use forward::{Ipv4Router, MacSwap};
pub use inspect::{Acl, Parse, MAX_RULES};

use crate::stages::{Registry, RegistryError};
use dataplane_config::KindShape;
use serde::Deserialize;

/// A kind without parameters.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NoParams {}

/// Registers the packet stage kinds in `r`.
///
/// # Errors
/// [`RegistryError::Duplicate`] if `r` already has a kind of one of these names.
pub fn register(r: &mut Registry) -> Result<(), RegistryError> {
    r.register("mac-swap", KindShape::filter(), "swaps each frame's destination and source MACs", |_: NoParams, _| {
        Ok(Box::new(MacSwap))
    })?;
    r.register(
        "ipv4-router",
        KindShape::filter().outputs(1, 16),
        "IPv4 longest-prefix-match forwarding: TTL, checksum, next-hop MACs; one output per port",
        |p: forward::RouterParams, spec| Ok(Box::new(p.build(spec.outputs())?)),
    )?;
    r.register(
        "parse",
        KindShape::filter().outputs(1, 2),
        "checks Ethernet/VLAN/ARP/IPv4/IPv6/TCP/UDP/ICMP headers, counts per protocol; malformed to output 1 or dropped",
        |p: inspect::ParseParams, _| Ok(Box::new(Parse::new(&p))),
    )?;
    r.register(
        "acl",
        KindShape::filter().outputs(1, 2),
        "first-match pass/drop rules (ether_type, proto, src, dst, src_port, dst_port); denied to output 1 or dropped",
        |p: inspect::AclParams, _| Ok(Box::new(Acl::new(&p)?)),
    )?;
    r.register(
        "pcap-writer",
        KindShape::filter().outputs(0, 1),
        "writes each frame to a pcap file (path, snaplen, buffer_bytes), then passes it on",
        |p: capture::WriterParams, spec| Ok(Box::new(PcapTap::new(p, &capture::base_dir(spec.config))?)),
    )?;
    r.register(
        "pcap-reader",
        KindShape::source(),
        "replays the frames of a pcap file (path, loops, rate)",
        |p: capture::ReaderParams, spec| {
            Ok(Box::new(PcapReplay::new(p, &capture::base_dir(spec.config), *spec.worker.poll_burst as usize)?))
        },
    )?;
    Ok(())
}

//! Network wire formats shared by the packet paths (RAW_PACKET QPs, the `xdp` provider and the
//! packet stages): the Internet checksum, frame headers (a quick key for steering, a checked
//! parse for stages), TCP segmentation offload, IPv4 routing, pcap files.

pub mod checksum;
pub mod frame;
pub mod headers;
pub mod pcap;
pub mod route;
pub mod tso;

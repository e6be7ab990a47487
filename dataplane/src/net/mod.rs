//! Network wire formats shared by the packet paths (RAW_PACKET QPs, the `xdp` provider and the
//! packet stages): the Internet checksum, frame headers, TCP segmentation offload.

pub mod checksum;
pub mod frame;
pub mod pcap;
pub mod route;
pub mod tso;

//! Network wire formats shared by the packet paths (RAW_PACKET QPs, the `xdp` provider and the
//! packet stages): the Internet checksum now, header parsers next to it.

pub mod checksum;

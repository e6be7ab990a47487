//! A checked parse of a frame's headers for the packet stages (`parse`, `acl`): Ethernet, up
//! to two VLAN tags, ARP, IPv4, IPv6, TCP, UDP and ICMP/ICMPv6, every length field checked
//! against the bytes there are. Where [`super::frame::FrameKey`] reads what steering needs and
//! stops quietly at a short frame, this says why a frame is malformed ([`Malformed`]), so that
//! a stage can count and drop it instead of acting on a header that is not there.
//!
//! What is checked, per layer:
//! - Ethernet: 14 bytes; each VLAN tag (0x8100, 0x88a8) 4 more.
//! - IPv4 (RFC 791): version 4, IHL >= 5 and within the frame, total length >= IHL*4 and
//!   within the frame (Ethernet padding after it is allowed), and, on request, the header
//!   checksum. A fragment other than the first has no transport header.
//! - IPv6 (RFC 8200): version 6, 40 bytes, payload length within the frame. Extension headers
//!   are not walked: the next header is taken as the transport protocol, and a frame whose
//!   next header is an extension is classified by that number (no ports).
//! - TCP: 20 bytes, data offset >= 5 and within the IP payload. UDP: 8 bytes, length field
//!   >= 8 and within the IP payload. ICMP / ICMPv6: 4 bytes.

use super::checksum;

/// Why a frame is not a well-formed packet. Named for the summary's drop counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Malformed {
    /// Shorter than an Ethernet header (or than a VLAN tag it announces).
    ShortEthernet = 0,
    /// An IPv4 EtherType with fewer than 20 bytes after it, or a version other than 4.
    BadIpv4Header,
    /// An IHL below 5, or an IHL or total length beyond the frame.
    BadIpv4Length,
    /// The IPv4 header checksum does not verify (checked only when asked).
    BadIpv4Checksum,
    /// An IPv6 EtherType with fewer than 40 bytes after it, a version other than 6, or a
    /// payload length beyond the frame.
    BadIpv6Header,
    /// A TCP header cut short, or a data offset below 5 or beyond the IP payload.
    BadTcpHeader,
    /// A UDP header cut short, or a length field below 8 or beyond the IP payload.
    BadUdpHeader,
    /// An ICMP header cut short.
    BadIcmpHeader,
}

impl Malformed {
    /// Every reason, in counter order.
    pub const ALL: [Malformed; 8] = [
        Malformed::ShortEthernet,
        Malformed::BadIpv4Header,
        Malformed::BadIpv4Length,
        Malformed::BadIpv4Checksum,
        Malformed::BadIpv6Header,
        Malformed::BadTcpHeader,
        Malformed::BadUdpHeader,
        Malformed::BadIcmpHeader,
    ];

    /// The counter name in run summaries.
    pub fn name(self) -> &'static str {
        match self {
            Malformed::ShortEthernet => "drop_short_ethernet",
            Malformed::BadIpv4Header => "drop_bad_ipv4_header",
            Malformed::BadIpv4Length => "drop_bad_ipv4_length",
            Malformed::BadIpv4Checksum => "drop_bad_ipv4_checksum",
            Malformed::BadIpv6Header => "drop_bad_ipv6_header",
            Malformed::BadTcpHeader => "drop_bad_tcp_header",
            Malformed::BadUdpHeader => "drop_bad_udp_header",
            Malformed::BadIcmpHeader => "drop_bad_icmp_header",
        }
    }
}

/// The network layer of a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Network {
    /// Not IP or ARP: the EtherType is in [`Headers::ether_type`].
    Other,
    /// ARP (no further checks: its length depends on the hardware type).
    Arp,
    /// IPv4.
    Ipv4 {
        /// Source address.
        src: [u8; 4],
        /// Destination address.
        dst: [u8; 4],
        /// Time to live.
        ttl: u8,
        /// A fragment other than the first (then there is no transport header).
        later_fragment: bool,
    },
    /// IPv6.
    Ipv6 {
        /// Source address.
        src: [u8; 16],
        /// Destination address.
        dst: [u8; 16],
        /// Hop limit.
        hop_limit: u8,
    },
}

/// The transport layer of an IP packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// No transport header (not IP, a later fragment) or a protocol not parsed here.
    None,
    /// TCP.
    Tcp {
        /// Source port.
        src_port: u16,
        /// Destination port.
        dst_port: u16,
        /// The flags byte (FIN 0x01, SYN 0x02, RST 0x04, PSH 0x08, ACK 0x10...).
        flags: u8,
    },
    /// UDP.
    Udp {
        /// Source port.
        src_port: u16,
        /// Destination port.
        dst_port: u16,
    },
    /// ICMP (over IPv4) or ICMPv6.
    Icmp {
        /// Message type.
        kind: u8,
        /// Message code.
        code: u8,
    },
}

/// A frame's headers, every one within the frame ([`Headers::parse`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Headers {
    /// Destination MAC.
    pub dst_mac: [u8; 6],
    /// Source MAC.
    pub src_mac: [u8; 6],
    /// VLAN tags crossed (0-2).
    pub vlans: u8,
    /// The EtherType after the VLAN tags.
    pub ether_type: u16,
    /// Offset of the network header.
    pub l3: usize,
    /// The network layer.
    pub network: Network,
    /// IPv4 protocol or IPv6 next header (`None` when not IP).
    pub ip_proto: Option<u8>,
    /// Offset of the transport header (meaningful when `transport` is not `None`).
    pub l4: usize,
    /// The transport layer.
    pub transport: Transport,
}

/// EtherType of IPv4.
pub const ETHER_IPV4: u16 = 0x0800;
/// EtherType of IPv6.
pub const ETHER_IPV6: u16 = 0x86dd;
/// EtherType of ARP.
pub const ETHER_ARP: u16 = 0x0806;

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

impl Headers {
    /// Parses `f`, a whole frame. With `verify_ipv4_checksum` an IPv4 header whose checksum
    /// does not verify is [`Malformed::BadIpv4Checksum`]. Never reads outside `f`.
    pub fn parse(f: &[u8], verify_ipv4_checksum: bool) -> Result<Headers, Malformed> {
        if f.len() < 14 {
            return Err(Malformed::ShortEthernet);
        }
        let mut h = Headers {
            dst_mac: f[0..6].try_into().expect("6 bytes"),
            src_mac: f[6..12].try_into().expect("6 bytes"),
            vlans: 0,
            ether_type: be16(f, 12),
            l3: 14,
            network: Network::Other,
            ip_proto: None,
            l4: 0,
            transport: Transport::None,
        };
        while matches!(h.ether_type, 0x8100 | 0x88a8) && h.vlans < 2 {
            if f.len() < h.l3 + 4 {
                return Err(Malformed::ShortEthernet);
            }
            h.ether_type = be16(f, h.l3 + 2);
            h.l3 += 4;
            h.vlans += 1;
        }
        let l3 = h.l3;
        // The IP packet's end: its length field, within the frame (padding may follow).
        let end = match h.ether_type {
            ETHER_ARP => {
                h.network = Network::Arp;
                return Ok(h);
            }
            ETHER_IPV4 => {
                if f.len() < l3 + 20 || f[l3] >> 4 != 4 {
                    return Err(Malformed::BadIpv4Header);
                }
                let ihl = usize::from(f[l3] & 0x0f) * 4;
                let total = usize::from(be16(f, l3 + 2));
                if ihl < 20 || total < ihl || f.len() < l3 + total {
                    return Err(Malformed::BadIpv4Length);
                }
                if verify_ipv4_checksum && checksum::finish(checksum::accumulate(0, &f[l3..l3 + ihl])) != 0 {
                    return Err(Malformed::BadIpv4Checksum);
                }
                let frag_offset = be16(f, l3 + 6) & 0x1fff;
                h.network = Network::Ipv4 {
                    src: f[l3 + 12..l3 + 16].try_into().expect("4 bytes"),
                    dst: f[l3 + 16..l3 + 20].try_into().expect("4 bytes"),
                    ttl: f[l3 + 8],
                    later_fragment: frag_offset != 0,
                };
                h.ip_proto = Some(f[l3 + 9]);
                h.l4 = l3 + ihl;
                if frag_offset != 0 {
                    return Ok(h);
                }
                l3 + total
            }
            ETHER_IPV6 => {
                if f.len() < l3 + 40 || f[l3] >> 4 != 6 || f.len() < l3 + 40 + usize::from(be16(f, l3 + 4)) {
                    return Err(Malformed::BadIpv6Header);
                }
                h.network = Network::Ipv6 {
                    src: f[l3 + 8..l3 + 24].try_into().expect("16 bytes"),
                    dst: f[l3 + 24..l3 + 40].try_into().expect("16 bytes"),
                    hop_limit: f[l3 + 7],
                };
                h.ip_proto = Some(f[l3 + 6]);
                h.l4 = l3 + 40;
                l3 + 40 + usize::from(be16(f, l3 + 4))
            }
            _ => return Ok(h),
        };
        let (l4, room) = (h.l4, end - h.l4);
        h.transport = match h.ip_proto {
            Some(6) => {
                let data_offset = if room >= 20 { usize::from(f[l4 + 12] >> 4) * 4 } else { 0 };
                if data_offset < 20 || data_offset > room {
                    return Err(Malformed::BadTcpHeader);
                }
                Transport::Tcp { src_port: be16(f, l4), dst_port: be16(f, l4 + 2), flags: f[l4 + 13] }
            }
            Some(17) => {
                let len = if room >= 8 { usize::from(be16(f, l4 + 4)) } else { 0 };
                if len < 8 || len > room {
                    return Err(Malformed::BadUdpHeader);
                }
                Transport::Udp { src_port: be16(f, l4), dst_port: be16(f, l4 + 2) }
            }
            Some(1) | Some(58) => {
                if room < 4 {
                    return Err(Malformed::BadIcmpHeader);
                }
                Transport::Icmp { kind: f[l4], code: f[l4 + 1] }
            }
            _ => Transport::None,
        };
        Ok(h)
    }

    /// The transport ports (source, destination), for TCP and UDP.
    pub fn ports(&self) -> Option<(u16, u16)> {
        match self.transport {
            Transport::Tcp { src_port, dst_port, .. } | Transport::Udp { src_port, dst_port } => {
                Some((src_port, dst_port))
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::frame::fill_ip_checksums;

    /// An Ethernet + IPv4 + UDP frame with `payload` bytes of data, checksums filled.
    pub(crate) fn udp4(payload: usize) -> Vec<u8> {
        let mut f = vec![2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1, 0x08, 0x00];
        let total = (20 + 8 + payload) as u16;
        f.extend_from_slice(&[0x45, 0, (total >> 8) as u8, total as u8, 0, 1, 0x40, 0, 64, 17, 0, 0]);
        f.extend_from_slice(&[10, 0, 0, 1, 10, 0, 0, 2]);
        let ulen = (8 + payload) as u16;
        f.extend_from_slice(&[0x30, 0x39, 0x00, 0x35, (ulen >> 8) as u8, ulen as u8, 0, 0]);
        f.extend(std::iter::repeat_n(0xab, payload));
        fill_ip_checksums(&mut f);
        f
    }

    #[test]
    fn a_udp_frame_parses_with_addresses_ports_and_ttl() {
        let h = Headers::parse(&udp4(5), true).unwrap();
        assert_eq!((h.ether_type, h.vlans, h.l3, h.l4), (ETHER_IPV4, 0, 14, 34));
        assert_eq!(h.network, Network::Ipv4 { src: [10, 0, 0, 1], dst: [10, 0, 0, 2], ttl: 64, later_fragment: false });
        assert_eq!((h.ip_proto, h.ports()), (Some(17), Some((12345, 53))));
    }

    #[test]
    fn ethernet_padding_after_the_ip_packet_is_allowed() {
        let mut f = udp4(0);
        f.resize(60, 0);
        assert!(Headers::parse(&f, true).is_ok());
    }

    #[test]
    fn every_cut_of_a_frame_is_refused_with_its_layer() {
        let f = udp4(4);
        for n in 0..f.len() {
            let why = Headers::parse(&f[..n], false).unwrap_err();
            let want = match n {
                0..14 => Malformed::ShortEthernet,
                14..34 => Malformed::BadIpv4Header,
                _ => Malformed::BadIpv4Length, // the total length reaches past the cut
            };
            assert_eq!(why, want, "cut at {n}");
        }
    }

    #[test]
    fn bad_fields_are_named() {
        let mut f = udp4(4);
        f[14] = 0x44;
        assert_eq!(Headers::parse(&f, false), Err(Malformed::BadIpv4Length), "IHL 4");
        let mut f = udp4(4);
        f[24] ^= 1;
        assert_eq!(Headers::parse(&f, true), Err(Malformed::BadIpv4Checksum));
        assert!(Headers::parse(&f, false).is_ok(), "checksum not verified unless asked");
        let mut f = udp4(4);
        f[38..40].copy_from_slice(&7u16.to_be_bytes());
        assert_eq!(Headers::parse(&f, false), Err(Malformed::BadUdpHeader), "UDP length 7");
        let mut f = udp4(4);
        f[38..40].copy_from_slice(&13u16.to_be_bytes());
        assert_eq!(Headers::parse(&f, false), Err(Malformed::BadUdpHeader), "UDP length past the IP payload");
    }

    #[test]
    fn a_later_fragment_has_no_transport_header() {
        let mut f = udp4(4);
        f[20] = 0x00;
        f[21] = 0x10; // fragment offset 16 (x 8 bytes)
        let h = Headers::parse(&f, false).unwrap();
        assert_eq!(h.transport, Transport::None);
        assert!(matches!(h.network, Network::Ipv4 { later_fragment: true, .. }));
    }

    #[test]
    fn tcp_over_vlan_ipv6_and_icmp_parse() {
        let mut f = vec![2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1, 0x81, 0x00, 0x00, 0x07, 0x86, 0xdd];
        f.extend_from_slice(&[0x60, 0, 0, 0, 0, 20, 6, 63]);
        f.extend_from_slice(&[0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
        f.extend_from_slice(&[0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
        f.extend_from_slice(&[0x1f, 0x90, 0x00, 0x50, 0, 0, 0, 1, 0, 0, 0, 0, 0x50, 0x12, 0xff, 0xff, 0, 0, 0, 0]);
        let h = Headers::parse(&f, false).unwrap();
        assert_eq!((h.vlans, h.ether_type, h.l4), (1, ETHER_IPV6, 58));
        assert_eq!(h.transport, Transport::Tcp { src_port: 8080, dst_port: 80, flags: 0x12 });
        f[70] = 0xf0; // data offset 15 words: past the 20-byte payload
        assert_eq!(Headers::parse(&f, false), Err(Malformed::BadTcpHeader));

        let mut f = udp4(0);
        f.truncate(34);
        f.extend_from_slice(&[8, 0, 0, 0, 0, 1, 0, 1]);
        f[16..18].copy_from_slice(&28u16.to_be_bytes());
        f[23] = 1;
        assert_eq!(Headers::parse(&f, false).unwrap().transport, Transport::Icmp { kind: 8, code: 0 });
    }
}

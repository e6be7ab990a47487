//! Ethernet frame headers as the packet paths read them: [`FrameKey`] (MACs, VLAN tags,
//! IPv4/IPv6, TCP/UDP ports and header offsets) and [`fill_ip_checksums`], the software
//! `IBV_SEND_IP_CSUM`. Used by RAW_PACKET QPs on `shm` (steering, checksum offload, TSO) and
//! meant for the `xdp` provider and the packet stages.

use super::checksum;

/// The header fields of an Ethernet frame that steering, checksums and segmentation need,
/// read from its first bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FrameKey {
    /// Destination MAC, its 6 bytes big-endian in the low 48 bits.
    pub dst_mac: u64,
    /// EtherType after any VLAN tags.
    pub ether_type: u16,
    /// IPv4 protocol or IPv6 next header, for IP frames.
    pub ip_proto: Option<u8>,
    /// TCP or UDP destination port.
    pub dst_port: Option<u16>,
    /// Offset of the IP header, for IP frames.
    pub l3: Option<usize>,
    /// Offset of the TCP or UDP header, when the frame has one.
    pub l4: Option<usize>,
}

impl FrameKey {
    /// Parses Ethernet, up to two VLAN tags (802.1Q / 802.1ad), IPv4 (IHL) or IPv6 (fixed
    /// header; extension headers are not walked: their next header is the protocol seen) and
    /// the TCP/UDP ports, within `hdr` (the frame or its first bytes). Fields beyond `hdr`
    /// stay unset; nothing is read out of bounds.
    pub fn parse(hdr: &[u8]) -> FrameKey {
        let mut k = FrameKey::default();
        if hdr.len() < 14 {
            return k;
        }
        k.dst_mac = hdr[..6].iter().fold(0u64, |a, &b| a << 8 | u64::from(b));
        let mut at = 12;
        let mut et = u16::from_be_bytes([hdr[at], hdr[at + 1]]);
        for _ in 0..2 {
            if (et == 0x8100 || et == 0x88a8) && hdr.len() >= at + 6 {
                at += 4;
                et = u16::from_be_bytes([hdr[at], hdr[at + 1]]);
            }
        }
        k.ether_type = et;
        let l3 = at + 2;
        let (proto, l4) = match et {
            // A header that is not version 4 with IHL >= 5 (or version 6) is not parsed as
            // IP: with IHL 0 the "TCP header" would be the IP header itself, and a checksum
            // offload would write into the addresses (found by the `packet` fuzz target).
            0x0800 if hdr.len() >= l3 + 20 && hdr[l3] >> 4 == 4 && hdr[l3] & 0x0f >= 5 => {
                (hdr[l3 + 9], l3 + usize::from(hdr[l3] & 0x0f) * 4)
            }
            0x86dd if hdr.len() >= l3 + 40 && hdr[l3] >> 4 == 6 => (hdr[l3 + 6], l3 + 40),
            _ => return k,
        };
        k.l3 = Some(l3);
        k.ip_proto = Some(proto);
        if matches!(proto, 6 | 17) && hdr.len() >= l4 + 4 {
            k.l4 = Some(l4);
            k.dst_port = Some(u16::from_be_bytes([hdr[l4 + 2], hdr[l4 + 3]]));
        }
        k
    }

    /// Whether the destination MAC is a group address (multicast or broadcast: I/G bit set).
    pub fn is_group(&self) -> bool {
        self.dst_mac & (1 << 40) != 0
    }
}

/// `IBV_SEND_IP_CSUM` in software: fills the IPv4 header checksum and the TCP or UDP checksum
/// (over IPv4 or IPv6) of `frame` in place. Frames that are not IP, or whose headers do not fit
/// the frame, are left as they are (a NIC sends them unchanged too).
pub fn fill_ip_checksums(frame: &mut [u8]) {
    let k = FrameKey::parse(frame);
    let (Some(l3), Some(proto)) = (k.l3, k.ip_proto) else { return };
    let l4_end = match k.ether_type {
        0x0800 => {
            let ihl = usize::from(frame[l3] & 0x0f) * 4;
            if ihl < 20 || frame.len() < l3 + ihl {
                return;
            }
            let c = checksum::ipv4_header(&frame[l3..l3 + ihl]);
            frame[l3 + 10..l3 + 12].copy_from_slice(&c.to_be_bytes());
            (l3 + usize::from(u16::from_be_bytes([frame[l3 + 2], frame[l3 + 3]]))).min(frame.len())
        }
        _ => (l3 + 40 + usize::from(u16::from_be_bytes([frame[l3 + 4], frame[l3 + 5]]))).min(frame.len()),
    };
    let Some(l4) = k.l4 else { return };
    let at = match proto {
        6 => l4 + 16,
        17 => l4 + 6,
        _ => return,
    };
    if at + 2 > l4_end {
        return;
    }
    frame[at..at + 2].fill(0);
    let seg = &frame[l4..l4_end];
    let c = if k.ether_type == 0x0800 {
        let src: [u8; 4] = frame[l3 + 12..l3 + 16].try_into().expect("4 bytes");
        let dst: [u8; 4] = frame[l3 + 16..l3 + 20].try_into().expect("4 bytes");
        checksum::l4_ipv4(src, dst, proto, seg)
    } else {
        let src: [u8; 16] = frame[l3 + 8..l3 + 24].try_into().expect("16 bytes");
        let dst: [u8; 16] = frame[l3 + 24..l3 + 40].try_into().expect("16 bytes");
        checksum::l4_ipv6(&src, &dst, proto, seg)
    };
    let c = if proto == 17 { checksum::udp_wire(c) } else { c };
    frame[at..at + 2].copy_from_slice(&c.to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn udp4(vlan: bool) -> Vec<u8> {
        let mut f = vec![0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 2, 0, 0, 0, 0, 1];
        if vlan {
            f.extend_from_slice(&[0x81, 0x00, 0x00, 0x07]);
        }
        f.extend_from_slice(&[0x08, 0x00]);
        let ip = [0x45, 0, 0, 28 + 4, 0, 1, 0, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2];
        f.extend_from_slice(&ip);
        f.extend_from_slice(&[0x30, 0x39, 0x12, 0x34, 0, 12, 0, 0, b'a', b'b', b'c', b'd']);
        f
    }

    #[test]
    fn parse_reads_mac_ethertype_through_vlan_proto_and_port() {
        for vlan in [false, true] {
            let k = FrameKey::parse(&udp4(vlan));
            assert_eq!(k.dst_mac, 0xffff_ffff_ffff);
            assert!(k.is_group());
            assert_eq!((k.ether_type, k.ip_proto, k.dst_port), (0x0800, Some(17), Some(0x1234)));
        }
        // Truncated: no field beyond the bytes given, no panic.
        for n in 0..udp4(true).len() {
            let _ = FrameKey::parse(&udp4(true)[..n]);
        }
    }

    /// Found by the `packet` fuzz target: an IPv4 header with IHL 0 made the L4 header start
    /// at the IP header, and IP_CSUM wrote a "UDP checksum" into the source address.
    #[test]
    fn ipv4_with_ihl_below_5_or_another_version_is_not_ip() {
        for first in [0x40u8, 0x44, 0x05, 0x65] {
            let mut f = udp4(false);
            f[14] = first;
            let k = FrameKey::parse(&f);
            assert_eq!((k.l3, k.l4, k.ip_proto, k.dst_port), (None, None, None, None), "{first:#x}");
            let before = f.clone();
            fill_ip_checksums(&mut f);
            assert_eq!(f, before, "{first:#x}: a frame that is not IP is sent unchanged");
        }
        let mut f = udp4(false);
        f[14] = 0x46; // IHL 6: 4 bytes of options
        f.splice(34..34, [1, 1, 1, 1]);
        assert_eq!(FrameKey::parse(&f).l4, Some(38));
    }

    #[test]
    fn ip_csum_fills_header_and_udp_checksums_that_verify() {
        let mut f = udp4(false);
        fill_ip_checksums(&mut f);
        assert_eq!(checksum::finish(checksum::accumulate(0, &f[14..34])), 0, "IPv4 header verifies");
        assert_eq!(checksum::l4_ipv4([10, 0, 0, 1], [10, 0, 0, 2], 17, &f[34..]), 0, "UDP verifies");
    }
}

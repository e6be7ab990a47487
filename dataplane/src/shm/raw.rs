//! RAW_PACKET QPs on the shm fabric: a software L2 switch steered by flow rules
//! (`ibv_create_flow(3)`), and `IBV_SEND_IP_CSUM` done by the sender's CPU.
//!
//! A RAW_PACKET send is one Ethernet frame (its gather list, 14 bytes at least). The switch
//! reads the frame's headers ([`FrameKey`]) and looks for the rules of the fabric's flow table
//! that match: a frame to a unicast MAC goes to the QP of the best matching rule (lowest
//! `priority`, then the oldest slot), a frame to a multicast or broadcast MAC to every QP
//! with a matching rule (once each). The sending QP never gets its own frame back. A frame
//! lands at offset 0 of the receive buffer (no GRH), its completion is RECV with `byte_len` the
//! frame's length; a target without a posted receive drops it (Ethernet: no RNR), as does a
//! frame no rule matches. The table is in the fabric, so QPs of every process share the
//! switch.

use super::fabric::Fabric;
use super::layout::{FlowSlot, MAX_FLOWS};
use crate::net::checksum;
use crate::verbs::{Errno, Error, FlowId, FlowSpec, QpType, Result};
use std::sync::atomic::Ordering;

const F_MAC: u32 = 1;
const F_ETHER: u32 = 1 << 1;
const F_PROTO: u32 = 1 << 2;
const F_PORT: u32 = 1 << 3;

/// The header fields of a frame the switch steers on, read from its first bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct FrameKey {
    pub dst_mac: u64,
    pub ether_type: u16,
    pub ip_proto: Option<u8>,
    pub dst_port: Option<u16>,
    /// Offsets of the IP header and of the TCP/UDP header, when the frame has them.
    pub l3: Option<usize>,
    pub l4: Option<usize>,
}

impl FrameKey {
    /// Parses Ethernet, up to two VLAN tags (802.1Q / 802.1ad), IPv4 (IHL) or IPv6 (fixed
    /// header; extension headers are not walked: their next header is the protocol seen) and
    /// the TCP/UDP ports, within `hdr` (the frame or its first bytes). Fields beyond `hdr`
    /// stay unset; nothing is read out of bounds.
    pub(crate) fn parse(hdr: &[u8]) -> FrameKey {
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
            0x0800 if hdr.len() >= l3 + 20 => (hdr[l3 + 9], l3 + usize::from(hdr[l3] & 0x0f) * 4),
            0x86dd if hdr.len() >= l3 + 40 => (hdr[l3 + 6], l3 + 40),
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
    fn is_group(&self) -> bool {
        self.dst_mac & (1 << 40) != 0
    }
}

fn mac_u64(mac: &[u8; 6]) -> u64 {
    mac.iter().fold(0u64, |a, &b| a << 8 | u64::from(b))
}

/// Whether rule `s` (read now) matches `k`, and its priority.
fn matches(s: &FlowSlot, k: &FrameKey) -> bool {
    let fields = s.fields.load(Ordering::Relaxed);
    (fields & F_MAC == 0 || s.dst_mac.load(Ordering::Relaxed) == k.dst_mac)
        && (fields & F_ETHER == 0 || s.ether_type.load(Ordering::Relaxed) == u32::from(k.ether_type))
        && (fields & F_PROTO == 0 || k.ip_proto.is_some_and(|p| s.ip_proto.load(Ordering::Relaxed) == u32::from(p)))
        && (fields & F_PORT == 0 || k.dst_port.is_some_and(|p| s.dst_port.load(Ordering::Relaxed) == u32::from(p)))
}

/// The QPs frame `k` from QP `sender` goes to: at most `out.len()`, each once. Returns how
/// many were written to `out`.
pub(crate) fn targets(f: &Fabric, k: &FrameKey, sender: u32, out: &mut [u32]) -> usize {
    let hwm = (f.flow_header().hwm.load(Ordering::Acquire) as usize).min(MAX_FLOWS);
    let mut best: Option<(u32, u32)> = None; // (priority, qpn)
    let mut n = 0;
    for i in 0..hwm {
        let s = f.flow_slot(i);
        let qpn = s.qpn.load(Ordering::Acquire);
        if qpn == 0 || qpn == sender || !matches(s, k) {
            continue;
        }
        if k.is_group() {
            if n < out.len() && !out[..n].contains(&qpn) {
                out[n] = qpn;
                n += 1;
            }
        } else {
            let p = s.priority.load(Ordering::Relaxed);
            if best.is_none_or(|(bp, _)| p < bp) {
                best = Some((p, qpn));
            }
        }
    }
    if let Some((_, qpn)) = best {
        out[0] = qpn;
        n = 1;
    }
    n
}

/// `ibv_create_flow` on a shm QP.
///
/// Errors: `EINVAL` on a QP that is not RAW_PACKET; `ENOMEM` when the fabric's
/// [`MAX_FLOWS`] rules are in use; `ETIMEDOUT` when the control-path lock is wedged.
pub(super) fn create_flow(f: &Fabric, qpn: u32, qp_type: QpType, spec: &FlowSpec) -> Result<FlowId> {
    if qp_type != QpType::RawPacket {
        return Err(Error::new(
            Errno::EINVAL,
            format!("create_flow: QP {qpn:#x} is {qp_type:?}; steering rules are for RAW_PACKET QPs"),
        ));
    }
    let _l = f.lock()?;
    let Some(i) = (0..MAX_FLOWS).find(|&i| f.flow_slot(i).qpn.load(Ordering::Relaxed) == 0) else {
        return Err(Error::new(
            Errno::ENOMEM,
            format!("create_flow: all {MAX_FLOWS} steering rules of the fabric are in use"),
        ));
    };
    let s = f.flow_slot(i);
    let mut fields = 0;
    if let Some(m) = spec.dst_mac {
        fields |= F_MAC;
        s.dst_mac.store(mac_u64(&m), Ordering::Relaxed);
    }
    if let Some(e) = spec.ether_type {
        fields |= F_ETHER;
        s.ether_type.store(u32::from(e), Ordering::Relaxed);
    }
    if let Some(p) = spec.ip_proto {
        fields |= F_PROTO;
        s.ip_proto.store(u32::from(p), Ordering::Relaxed);
    }
    if let Some(p) = spec.dst_port {
        fields |= F_PORT;
        s.dst_port.store(u32::from(p), Ordering::Relaxed);
    }
    s.fields.store(fields, Ordering::Relaxed);
    s.priority.store(u32::from(spec.priority), Ordering::Relaxed);
    let gen = s.gen.fetch_add(1, Ordering::Relaxed).wrapping_add(1) & 0x00ff_ffff;
    let h = f.flow_header();
    if h.hwm.load(Ordering::Relaxed) <= i as u32 {
        h.hwm.store(i as u32 + 1, Ordering::Release);
    }
    // Published last: a sender that sees the owner sees the rule.
    s.qpn.store(qpn, Ordering::Release);
    Ok(FlowId(gen << 8 | i as u32))
}

/// `ibv_destroy_flow` on a shm QP.
///
/// Errors: `EINVAL` for an id that is not a live rule of this QP.
pub(super) fn destroy_flow(f: &Fabric, qpn: u32, id: FlowId) -> Result<()> {
    let i = (id.0 & 0xff) as usize;
    let _l = f.lock()?;
    let s = f.flow_slot(i);
    if s.qpn.load(Ordering::Relaxed) != qpn || s.gen.load(Ordering::Relaxed) & 0x00ff_ffff != id.0 >> 8 {
        return Err(Error::new(Errno::EINVAL, format!("destroy_flow: {id:?} is not a steering rule of QP {qpn:#x}")));
    }
    s.qpn.store(0, Ordering::Release);
    Ok(())
}

/// Removes every rule of `qpn` (the QP is being destroyed). Call with the lock held.
pub(super) fn destroy_all(f: &Fabric, qpn: u32) {
    let hwm = (f.flow_header().hwm.load(Ordering::Relaxed) as usize).min(MAX_FLOWS);
    for i in 0..hwm {
        let s = f.flow_slot(i);
        if s.qpn.load(Ordering::Relaxed) == qpn {
            s.qpn.store(0, Ordering::Release);
        }
    }
}

/// `IBV_SEND_IP_CSUM` in software: fills the IPv4 header checksum and the TCP or UDP checksum
/// (over IPv4 or IPv6) of `frame` in place. Frames that are not IP, or whose headers do not fit
/// the frame, are left as they are (a NIC sends them unchanged too).
pub(crate) fn fill_ip_checksums(frame: &mut [u8]) {
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

    #[test]
    fn ip_csum_fills_header_and_udp_checksums_that_verify() {
        let mut f = udp4(false);
        fill_ip_checksums(&mut f);
        assert_eq!(checksum::finish(checksum::accumulate(0, &f[14..34])), 0, "IPv4 header verifies");
        assert_eq!(checksum::l4_ipv4([10, 0, 0, 1], [10, 0, 0, 2], 17, &f[34..]), 0, "UDP verifies");
    }
}

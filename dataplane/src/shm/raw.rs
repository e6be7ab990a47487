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
use crate::net::frame::FrameKey;
use crate::verbs::{Errno, Error, FlowId, FlowSpec, QpType, Result};
use std::sync::atomic::Ordering;

const F_MAC: u32 = 1;
const F_ETHER: u32 = 1 << 1;
const F_PROTO: u32 = 1 << 2;
const F_PORT: u32 = 1 << 3;

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

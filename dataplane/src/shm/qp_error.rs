//! Moving a QP to ERROR in the fabric's QP table (any process may: the sender that found
//! the error, or the owner), with what the verbs spec says follows: its receive queue is
//! flushed, or, on an SRQ, its owner gets `IBV_EVENT_QP_LAST_WQE_REACHED`.

use super::complete::{cq_ring, push_recv_status};
use super::fabric::Fabric;
use super::layout::*;
use super::recvq::{self, RecvEntry, MAX_SGE};
use crate::verbs::*;
use std::sync::atomic::Ordering;

/// Moves QP `idx` to ERROR (unless in RESET) and flushes its receive queue (any process may
/// do this: the sender that found the error, or the owner). QPs on an SRQ get
/// `IBV_EVENT_QP_LAST_WQE_REACHED` instead.
pub(crate) fn to_error(f: &Fabric, idx: usize, qpn: u32) {
    if mark_error(f, idx, qpn) {
        after_error(f, idx, qpn);
    }
}

/// The state change of [`to_error`] alone: true if this call moved QP `idx` (still `qpn`)
/// to ERROR, in which case the caller must run [`after_error`]. Split so that a send queue
/// failing a WQE can change the state before it writes the error completion: whoever polls
/// that completion then reads ERROR (`ibv_query_qp` after an error CQE), even when another
/// thread's poll ran the retry timer that failed it.
pub(crate) fn mark_error(f: &Fabric, idx: usize, qpn: u32) -> bool {
    let s = f.qp_slot(idx);
    if s.qpn.load(Ordering::Acquire) != qpn {
        return false;
    }
    let mut cur = s.state.load(Ordering::Acquire);
    loop {
        if cur == QpState::Error as u32 || cur == QpState::Reset as u32 {
            return false;
        }
        match s.state.compare_exchange(cur, QpState::Error as u32, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return true,
            Err(c) => cur = c,
        }
    }
}

/// What follows a QP's move to ERROR ([`mark_error`]): its receive queue flushed, or on an
/// SRQ the last-WQE event.
pub(crate) fn after_error(f: &Fabric, idx: usize, qpn: u32) {
    let s = f.qp_slot(idx);
    let ctx = s.ctx.load(Ordering::Relaxed) as usize;
    // XRC QPs have no receive queue to flush (their SRQs belong to the domain, not to them).
    if QpType::from_u8(s.qp_type.load(Ordering::Relaxed) as u8).is_some_and(QpType::is_xrc) {
        return;
    }
    if s.srqn.load(Ordering::Relaxed) != 0 {
        f.post_event(ctx, super::EVENT_QP_LAST_WQE, qpn);
    } else {
        flush_rq(f, s, qpn);
    }
}

/// Completes every request in QP `qpn`'s receive queue with a flush error.
pub(crate) fn flush_rq(f: &Fabric, s: &QpSlot, qpn: u32) {
    let cap = s.rq_cap.load(Ordering::Relaxed) as usize;
    let sge = s.rq_sge.load(Ordering::Relaxed).min(MAX_SGE as u32);
    let Ok(rq) = f.recv_ring(s.rq_off.load(Ordering::Relaxed), cap, sge) else { return };
    let Some(cq) = cq_ring(f, s.recv_cqn.load(Ordering::Relaxed)) else { return };
    let cqn = s.recv_cqn.load(Ordering::Relaxed);
    // The connected sender may be popping with plain stores (`shm::solo`): end that first.
    super::solo::revoke(&rq);
    let mut e = RecvEntry::default();
    let mut cq_head = 0;
    while recvq::pop(&rq, &mut e) {
        push_recv_status(f, &cq, &mut cq_head, cqn, qpn, e.wr_id, WcStatus::WrFlushErr);
    }
}

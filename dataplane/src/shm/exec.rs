//! Execution: what a posted WR does, one function per transport, run on the poster's CPU
//! right after the doorbell (`doorbell.rs`) accepted it. `exec_wr` runs RC, UC and XRC
//! operations (SEND, WRITE, READ, atomics, memory windows), `exec_ud` and `exec_mcast`
//! datagrams, `exec_raw` RAW_PACKET frames through the L2 switch. The responder's side is here
//! too: `deliver` takes a receive request at the destination (`dest.rs`), places the bytes
//! (`place.rs`) and writes the receiver's completion (`complete.rs`), or decides RNR (RC, no
//! receive posted), the silent drop (UC, UD) or the error that moves both QPs to ERROR (a
//! receive too small, a bad receive SGE); `tm_match` runs tag matching.
//!
//! An `Outcome::Block` sends the WR back to the doorbell's pending queue. Every address and
//! length that comes from shared memory (a peer's receive request, an rkey) is checked against
//! the MR table and the fabric bounds before a byte moves.

use super::complete::{after_push, push_cqe_to, push_inline_recv_to, Cqe};
use super::dest::*;
use super::fabric::{atomic_u64_at, Fabric};
use super::layout::*;
use super::mr::mr_lookup;
use super::place::*;
use super::qp_error::to_error;
use super::recvq::{RecvEntry, MAX_SGE};
use super::sq::{BlockKind, Held, SqState};
use super::wire::INLINE_CQE_MAX;
use crate::net::frame::FrameKey;
use crate::verbs::*;
use std::sync::atomic::Ordering;

/// What `deliver` needs to know about the sending QP.
#[derive(Clone, Copy)]
pub(crate) struct Sender {
    pub(crate) qp_type: QpType,
    pub(crate) qpn: u32,
    pub(crate) lid: u16,
}

impl Sender {
    pub(crate) fn of(st: &SqState) -> Sender {
        Sender { qp_type: st.qp_type, qpn: st.qpn, lid: st.lid }
    }
}

pub(crate) enum Outcome {
    /// Executed: the sender's status and byte count.
    Done(WcStatus, u32),
    /// Must wait.
    Block(BlockKind),
}

/// No receive request was taken: RC waits (RNR), UC/UD drop. Unless the target's receive
/// ring is corrupt (a cell or index a peer scribbled, [`Ring::stalled`]): then the responder
/// QP goes to ERROR and an RC requester gets REM_OP_ERR ("a malformed WQE on the Receive
/// Queue", ibv_poll_cq(3)), rather than waiting for a receive that cannot come.
///
/// The check is here, on the cold path, rather than a three-way result from the take: that
/// cost 8 instructions per message on the hot path (callgrind, `profile_post_poll`).
#[cold]
#[inline(never)]
pub(crate) fn no_receive(f: &Fabric, d: &DestView, reliable: bool) -> Outcome {
    let ring = match (&d.srq, &d.rq) {
        (Some(srq), _) => Some(&srq.ring),
        (None, rq) => rq.as_ref(),
    };
    if ring.is_some_and(|r| r.stalled()) {
        return Outcome::Done(responder_failed(f, d, reliable, WcStatus::RemOpErr), 0);
    }
    if reliable {
        Outcome::Block(BlockKind::Rnr)
    } else {
        Outcome::Done(WcStatus::Success, 0)
    }
}

#[inline]
pub(crate) fn push_recv_wc(f: &Fabric, d: &DestView, wc: &WorkCompletion, solicited: bool) {
    let mut seen = d.cq_head.get();
    push_cqe_to(f, &d.cq, &mut seen, d.cqn, d.cq_channel, &Cqe { wc: *wc, retire: None, solicited });
    d.cq_head.set(seen);
}

/// [`push_recv_wc`] of a SEND of at most `INLINE_CQE_MAX` bytes: the bytes ride in the CQE
/// and the receiver's poll copies them to `dst`, the receive buffer the caller checked
/// (`recv_dst`). `src` as for `copy_translated`.
#[inline(always)]
pub(crate) fn push_recv_wc_inline(
    f: &Fabric,
    d: &DestView,
    wc: &WorkCompletion,
    dst: *mut u8,
    src: *const u8,
    solicited: bool,
) {
    let mut seen = d.cq_head.get();
    // `dst` came from `MrView::translate`, so it lies in the arena: its offset is exact.
    let dst_off = (dst as u64).wrapping_sub(f.base_addr());
    push_inline_recv_to(f, &d.cq, &mut seen, d.cqn, d.cq_channel, wc, dst_off, src, solicited);
    d.cq_head.set(seen);
}

/// Completes held fast-path SENDs ([`Held`]) in the order they were claimed: releases
/// each receive request's cell (first, so that a receiver that sees the completion can post
/// into it again), places the bytes (in the CQE when they fit, else into the checked buffer)
/// and publishes the CQE; then the senders' completions of the signaled ones (after every
/// copy: each frees its send buffer). Empties `held`.
#[inline(always)]
pub(crate) fn publish_held(f: &Fabric, held: &mut Held) {
    if !held.is_empty() {
        publish_held_now(f, held);
    }
}

/// [`publish_held`]'s work, out of line: most posts hold nothing.
#[inline(never)]
fn publish_held_now(f: &Fabric, held: &mut Held) {
    let n = std::mem::take(&mut held.len);
    let Some(d) = held.dest else { return };
    for h in &held.msgs[..n] {
        d.rq.release(h.rq_pos);
        let wc = WorkCompletion {
            wr_id: h.wr_id,
            opcode: WcOpcode::Recv,
            byte_len: h.byte_len,
            imm_data: h.imm_data,
            wc_flags: if h.with_imm { WcFlags::WITH_IMM } else { WcFlags::empty() },
            qp_num: d.qp_num,
            src_qp: d.src_qp,
            slid: d.slid,
            ..Default::default()
        };
        let src = f.at(h.src_off);
        let len = h.byte_len as usize;
        if len <= INLINE_CQE_MAX {
            d.cq.publish_inline_recv(h.cq_pos, &wc, h.dst_off, src);
        } else {
            // Both offsets came from pointers checked for `len` bytes (`recv_dst` and the
            // sender's MR or the fabric, `post_fast`).
            copy_translated(src, f.at(h.dst_off), len);
            d.cq.publish(h.cq_pos, &wc, None);
        }
        // A claimed cell is always published: no overrun here.
        after_push(f, d.cqn, d.channel, true, h.solicited);
    }
    // Every held copy is done: the senders' completions may show (`HeldSend`).
    for s in &held.sends[..std::mem::take(&mut held.n_sends)] {
        let wc = WorkCompletion { wr_id: s.wr_id, opcode: WcOpcode::Send, qp_num: d.src_qp, ..Default::default() };
        d.send_cq.publish(s.pos, &wc, Some(s.wqe));
        after_push(f, d.send_cqn, d.send_channel, true, false);
    }
}

/// Delivers message `m`, which consumes a receive request (SEND family, WRITE_WITH_IMM).
pub(crate) fn deliver(f: &Fabric, st: Sender, rx: &mut RecvEntry, d: &DestView, m: Incoming<'_>) -> Outcome {
    let reliable = st.qp_type.is_reliable();
    // Tag matching: a matched message lands headerless in its tagged buffer; anything else
    // continues below into a plain SRQ buffer, whole.
    let mut tm_view = None;
    if let Some(tm) = d.srq.and_then(|s| s.tm).filter(|_| m.place_data) {
        match tm_match(f, st, rx, d, &tm, m) {
            TmOutcome::Matched => return Outcome::Done(WcStatus::Success, 0),
            // As on the plain path below: the responder QP goes to ERROR, the requester gets
            // the remote status.
            TmOutcome::Failed(remote) => return Outcome::Done(responder_failed(f, d, reliable, remote), 0),
            TmOutcome::Unexpected => tm_view = Some(tm),
            TmOutcome::NoTag => {}
        }
    }
    if !take_recv(f, d, rx) {
        return no_receive(f, d, reliable);
    }
    Outcome::Done(deliver_taken(f, st, rx, d, m, tm_view.as_ref()), 0)
}

/// The part of [`deliver`] after the receive request `rx` was taken: checks its buffers,
/// places the message, writes the receiver's completion (an error one if the buffers do not
/// fit) and returns the sender's status. `tm_view`: the tag-matching SRQ when the message is
/// an unexpected tagged one.
#[inline]
pub(crate) fn deliver_taken(
    f: &Fabric,
    st: Sender,
    rx: &RecvEntry,
    d: &DestView,
    m: Incoming<'_>,
    tm_view: Option<&super::tm::TmView>,
) -> WcStatus {
    match place_taken(f, st, rx, d, m, tm_view) {
        Ok(()) => WcStatus::Success,
        Err(remote) => responder_failed(f, d, st.qp_type.is_reliable(), remote),
    }
}

/// [`deliver_taken`] up to the receiver's completion: `Err` carries the status a failed
/// placement gives the requester, and the caller runs [`responder_failed`] (or, holding
/// more of the QP's receive requests, defers its flush, `drain::general`).
#[inline]
pub(crate) fn place_taken(
    f: &Fabric,
    st: Sender,
    rx: &RecvEntry,
    d: &DestView,
    m: Incoming<'_>,
    tm_view: Option<&super::tm::TmView>,
) -> std::result::Result<(), WcStatus> {
    let Incoming { wr, src, total, grh, place_data } = m;
    let mut wc = WorkCompletion {
        wr_id: rx.wr_id,
        opcode: if wr.opcode == WrOpcode::RdmaWriteWithImm { WcOpcode::RecvRdmaWithImm } else { WcOpcode::Recv },
        qp_num: d.qpn,
        src_qp: st.qpn,
        slid: st.lid,
        ..Default::default()
    };
    if wr.opcode.has_imm() {
        wc.imm_data = wr.imm_data;
        wc.wc_flags |= WcFlags::WITH_IMM;
    } else if wr.opcode == WrOpcode::SendWithInv {
        wc.imm_data = wr.imm_data;
        wc.wc_flags |= WcFlags::WITH_INV;
    }
    if let Some(tm) = tm_view {
        tm.count_unexpected(f);
        wc.wc_flags |= WcFlags::TM_SYNC_REQ;
    }
    // Requests from an SRQ are checked against the SRQ's PD, which may differ from the QP's.
    let pd = d.srq.map_or(d.pd, |s| s.pd);
    // A small SEND or SEND_WITH_IMM into a plain buffer of one SGE rides in the CQE, as on the
    // fast path (`doorbell::post_fast`): a WQE retried after an RNR NAK lands as it would
    // have without one.
    if let ([s], None, true, None, 1) = (src, grh, place_data, tm_view, rx.n) {
        let small = total as usize <= INLINE_CQE_MAX && matches!(wr.opcode, WrOpcode::Send | WrOpcode::SendWithImm);
        if let Some(dst) = recv_dst(f, pd, &rx.sges[0], total as usize).filter(|_| small) {
            wc.byte_len = total as u32;
            push_recv_wc_inline(f, d, &wc, dst, s.ptr, wr.flags.contains(SendFlags::SOLICITED));
            return Ok(());
        }
    }
    // Nearly every receive request has one SGE: resolve it into a one-segment array rather
    // than zeroing room for MAX_SGE on every message.
    let status = if rx.n <= 1 { place::<1>(f, pd, rx, &m, &mut wc) } else { place::<MAX_SGE>(f, pd, rx, &m, &mut wc) };
    // One push for both outcomes: a single call site lets it inline, and the completion's
    // fields go straight into the CQ cell.
    if let Err((local, _)) = status {
        wc.status = local;
        wc.byte_len = 0;
    }
    push_recv_wc(f, d, &wc, wr.flags.contains(SendFlags::SOLICITED));
    status.map_err(|(_, remote)| remote)
}

/// A message failed in the responder's receive queue (a corrupt ring, a tagged or plain buffer
/// that does not fit): a connected (RC, UC) responder QP goes to ERROR and an RC requester gets
/// `remote`; UD and RAW_PACKET responders only drop the message, and the requester of anything
/// but RC sees success. Returns the requester's status.
#[cold]
pub(crate) fn responder_failed(f: &Fabric, d: &DestView, reliable: bool, remote: WcStatus) -> WcStatus {
    if d.qp_type.is_connected() {
        to_error(f, d.idx, d.qpn);
    }
    if reliable {
        remote
    } else {
        WcStatus::Success
    }
}

pub(crate) enum TmOutcome {
    /// Delivered into a tagged buffer.
    Matched,
    /// Matched, but the tagged buffer could not take the message (too small, or its MR is
    /// gone): the receiver got the local error, and this is the requester's status.
    Failed(WcStatus),
    /// A tagged message that matched nothing (or arrived while matching was off).
    Unexpected,
    /// No tag header: a plain message.
    NoTag,
}

/// Matches a SEND against a tag-matching SRQ's list. Kept out of line: inlined, its buffers
/// and header parsing made `deliver`'s frame several times larger for every plain message.
#[inline(never)]
pub(crate) fn tm_match(
    f: &Fabric,
    st: Sender,
    rx: &mut RecvEntry,
    d: &DestView,
    tm: &super::tm::TmView,
    m: Incoming<'_>,
) -> TmOutcome {
    let (src, total, solicited) = (m.src, m.total, m.wr.flags.contains(SendFlags::SOLICITED));
    if total < TMH_LEN as u64 {
        return TmOutcome::NoTag;
    }
    let mut hdr = [0u8; TMH_LEN];
    gather_prefix(src, &mut hdr);
    let tmh = match Tmh::from_bytes(&hdr) {
        Some(h) if h.op != TmhOp::NoTag => h,
        _ => return TmOutcome::NoTag,
    };
    // Only eager messages are matched here; rendezvous headers are delivered as unexpected.
    if tmh.op != TmhOp::Eager {
        return TmOutcome::Unexpected;
    }
    match tm.take_match(f, tmh.tag, rx) {
        Ok(true) => {}
        Ok(false) => return TmOutcome::Unexpected,
        // The tag list's lock is wedged (held by a live process for seconds): the responder
        // cannot match, as with a corrupt receive queue.
        Err(_) => return TmOutcome::Failed(WcStatus::RemOpErr),
    }
    let pd = d.srq.map_or(d.pd, |s| s.pd);
    let payload = total - TMH_LEN as u64;
    let mut wc = WorkCompletion {
        wr_id: rx.wr_id,
        opcode: WcOpcode::TmRecv,
        qp_num: d.qpn,
        src_qp: st.qpn,
        slid: st.lid,
        imm_data: tmh.app_ctx,
        wc_flags: WcFlags::TM_MATCH,
        ..Default::default()
    };
    let mut dst = [Seg::default(); MAX_SGE];
    // The same statuses as `place` gives a plain receive request.
    let outcome = match resolve_recv(f, pd, rx, &mut dst) {
        None => (WcStatus::LocProtErr, TmOutcome::Failed(WcStatus::RemOpErr)),
        Some((_, cap)) if cap < payload => (WcStatus::LocLenErr, TmOutcome::Failed(WcStatus::RemInvReqErr)),
        Some((n, _)) => {
            let mut body = [Seg::default(); MAX_SGE];
            let nb = skip_prefix(src, TMH_LEN, &mut body);
            copy_sg(&body[..nb], &dst[..n], 0);
            wc.byte_len = payload as u32;
            wc.wc_flags |= WcFlags::TM_DATA_VALID;
            (WcStatus::Success, TmOutcome::Matched)
        }
    };
    wc.status = outcome.0;
    push_recv_wc(f, d, &wc, solicited);
    outcome.1
}

/// Runs one WQE. `src` are its local segments (gather list, or scatter list for READ and
/// atomics), `total` their length.
pub(crate) fn exec_wr(f: &Fabric, st: &mut SqState, wr: &SendWr, src: &[Seg], total: u64) -> Outcome {
    let reliable = st.qp_type.is_reliable();
    let lost = if reliable { Outcome::Block(BlockKind::Unreachable) } else { Outcome::Done(WcStatus::Success, 0) };
    if st.qp_type == QpType::Ud {
        return exec_ud(f, st, wr, src, total);
    }
    if st.qp_type == QpType::RawPacket {
        return exec_raw(f, st, wr, src, total);
    }
    // Memory-management operations run on the local "NIC" only.
    match wr.opcode {
        WrOpcode::LocalInv => {
            let ok = super::mr::invalidate(f, st.pd, wr.imm_data);
            return Outcome::Done(if ok { WcStatus::Success } else { WcStatus::MwBindErr }, 0);
        }
        WrOpcode::BindMw => {
            let b = wr.bind_info();
            let ok = super::mr::bind_mw(f, st.pd, &b);
            return Outcome::Done(if ok { WcStatus::Success } else { WcStatus::MwBindErr }, 0);
        }
        _ => {}
    }
    let sender = Sender::of(st);
    let Some(d) = dest(f, &mut st.dest, st.dest_qpn) else { return lost };
    let ds = f.qp_slot(d.idx);
    let state = QpState::from_u8(ds.state.load(Ordering::Acquire) as u8).unwrap_or(QpState::Error);
    if !state.receives() || ds.dest_qpn.load(Ordering::Relaxed) != st.qpn || d.qp_type != st.qp_type.peer_type() {
        return lost;
    }
    // XRC: the request names the SRQ it lands in, which must be an XRC SRQ of the target
    // QP's domain. Otherwise the responder rejects it as an invalid request: its QP goes to
    // ERROR and the requester completes with REM_INV_REQ_ERR, as for any RC request the
    // responder cannot accept (IB spec 9.7.5.2.2; rxe's class C errors do the same).
    let d = if st.qp_type == QpType::XrcSend {
        match xrc_dest(f, &mut st.xrc_dest, d, wr.remote_srqn) {
            Some(x) => x,
            None => return Outcome::Done(responder_failed(f, d, true, WcStatus::RemInvReqErr), 0),
        }
    } else {
        d
    };
    let fail = |s: WcStatus| Outcome::Done(if reliable { s } else { WcStatus::Success }, 0);
    // One-sided operations to a dead owner are unanswered requests (`lost`): RC retries,
    // finds the owner dead (`handle_block`) and completes with RETRY_EXC_ERR; UC drops them.
    match wr.opcode {
        WrOpcode::Send | WrOpcode::SendWithImm => deliver(f, sender, &mut st.rx, d, Incoming::sent(wr, src, total)),
        WrOpcode::SendWithInv => {
            // The rkey must name a window of the responder's PD, else the responder rejects
            // the request before placing anything.
            if !mr_lookup(f, wr.imm_data).is_some_and(|m| m.window && m.pd == d.pd) {
                return fail(WcStatus::RemInvReqErr);
            }
            let out = deliver(f, sender, &mut st.rx, d, Incoming::sent(wr, src, total));
            if matches!(out, Outcome::Done(WcStatus::Success, _)) {
                super::mr::invalidate(f, d.pd, wr.imm_data);
            }
            out
        }
        WrOpcode::RdmaWrite | WrOpcode::RdmaWriteWithImm => {
            if d.owner_died() {
                return lost;
            }
            let Some(mr) = remote_mr(f, d, wr, AccessFlags::REMOTE_WRITE) else { return fail(WcStatus::RemAccessErr) };
            let Some(p) = mr.translate(f, wr.remote_addr, total) else { return fail(WcStatus::RemAccessErr) };
            if wr.opcode == WrOpcode::RdmaWriteWithImm {
                // The immediate needs a receive: check for one before any byte lands, so an
                // RNR retry does not write twice.
                if !d.has_recv() {
                    return if reliable { Outcome::Block(BlockKind::Rnr) } else { Outcome::Done(WcStatus::Success, 0) };
                }
            }
            copy_sg(src, &[Seg { ptr: p, len: total as usize }], 0);
            if wr.opcode == WrOpcode::RdmaWriteWithImm {
                let m = Incoming { place_data: false, ..Incoming::sent(wr, src, total) };
                return deliver(f, sender, &mut st.rx, d, m);
            }
            Outcome::Done(WcStatus::Success, 0)
        }
        WrOpcode::RdmaRead => {
            if d.owner_died() {
                return lost;
            }
            let Some(mr) = remote_mr(f, d, wr, AccessFlags::REMOTE_READ) else { return fail(WcStatus::RemAccessErr) };
            let Some(p) = mr.translate(f, wr.remote_addr, total) else { return fail(WcStatus::RemAccessErr) };
            copy_sg(&[Seg { ptr: p, len: total as usize }], src, 0);
            Outcome::Done(WcStatus::Success, total as u32)
        }
        WrOpcode::AtomicCmpAndSwp | WrOpcode::AtomicFetchAndAdd => {
            if d.owner_died() {
                return lost;
            }
            if wr.remote_addr % 8 != 0 {
                return fail(WcStatus::RemInvReqErr);
            }
            let Some(mr) = remote_mr(f, d, wr, AccessFlags::REMOTE_ATOMIC) else {
                return fail(WcStatus::RemAccessErr);
            };
            let Some(a) = mr.fabric_offset(wr.remote_addr, 8).and_then(|off| atomic_u64_at(f, off)) else {
                return fail(WcStatus::RemAccessErr);
            };
            let old = if wr.opcode == WrOpcode::AtomicFetchAndAdd {
                a.fetch_add(wr.compare_add, Ordering::AcqRel)
            } else {
                a.compare_exchange(wr.compare_add, wr.swap, Ordering::AcqRel, Ordering::Acquire).unwrap_or_else(|v| v)
            };
            let bytes = old.to_ne_bytes();
            copy_sg(&[Seg { ptr: bytes.as_ptr() as *mut u8, len: 8 }], src, 0);
            Outcome::Done(WcStatus::Success, 8)
        }
        // Rejected at post time.
        _ => Outcome::Done(WcStatus::LocQpOpErr, 0),
    }
}

pub(crate) fn exec_ud(f: &Fabric, st: &mut SqState, wr: &SendWr, src: &[Seg], total: u64) -> Outcome {
    if wr.ud.ah.0 & AH_MCAST != 0 {
        return exec_mcast(f, st, wr, src, total);
    }
    let dropped = Outcome::Done(WcStatus::Success, 0);
    let sender = Sender::of(st);
    let Some(d) = dest(f, &mut st.dest, wr.ud.remote_qpn) else { return dropped };
    let ds = f.qp_slot(d.idx);
    let state = QpState::from_u8(ds.state.load(Ordering::Acquire) as u8).unwrap_or(QpState::Error);
    // A Q_Key with the high bit set means "use the QP's own Q_Key" (IB spec 10.2.4).
    let qkey = if wr.ud.remote_qkey & 0x8000_0000 != 0 { st.qkey } else { wr.ud.remote_qkey };
    if !state.receives() || d.qp_type != QpType::Ud || ds.qkey.load(Ordering::Relaxed) != qkey {
        return dropped;
    }
    let global = wr.ud.ah.0 & AH_GLOBAL != 0;
    let grh = global
        .then(|| grh_bytes(total, &gid(f.fabric_id(), st.lid), &gid(f.fabric_id(), (wr.ud.ah.0 & 0xffff) as u16)));
    let _ = d.lid;
    deliver(f, sender, &mut st.rx, d, Incoming { grh: &Some(grh), ..Incoming::sent(wr, src, total) })
}

/// The largest RAW_PACKET frame: the port MTU plus Ethernet header, two VLAN tags.
pub(crate) const RAW_MAX_FRAME: usize = SHM_MTU as usize + 22;

/// A RAW_PACKET send: one Ethernet frame, switched to the QPs whose steering rules match
/// (`raw::targets`), at offset 0 of each one's receive buffer. With `IBV_SEND_IP_CSUM` the
/// checksums are filled in a copy of the frame first. The sender always completes with
/// success (Ethernet: a frame nobody takes is dropped).
pub(crate) fn exec_raw(f: &Fabric, st: &mut SqState, wr: &SendWr, src: &[Seg], total: u64) -> Outcome {
    let done = Outcome::Done(WcStatus::Success, 0);
    let len = total as usize;
    // The headers the switch steers on are in the first 128 bytes.
    let mut hdr = [0u8; 128];
    gather_prefix(src, &mut hdr[..len.min(128)]);
    let key = FrameKey::parse(&hdr[..len.min(128)]);
    // IP_CSUM: the checksums are filled in a copy (the sender's buffer is not written).
    let mut frame: [u8; RAW_MAX_FRAME];
    let mut one = [Seg::default(); 1];
    let src = if wr.flags.contains(SendFlags::IP_CSUM) {
        frame = [0u8; RAW_MAX_FRAME];
        gather_prefix(src, &mut frame[..len]);
        crate::net::frame::fill_ip_checksums(&mut frame[..len]);
        one[0] = Seg { ptr: frame.as_mut_ptr(), len };
        &one[..]
    } else {
        src
    };
    switch_frame(f, st, wr, &key, src, total);
    done
}

/// Hands one frame (`src`, `total` bytes, headers `key`) to the QPs the flow table steers it
/// to; each consumes a receive or drops the frame.
pub(crate) fn switch_frame(f: &Fabric, st: &mut SqState, wr: &SendWr, key: &FrameKey, src: &[Seg], total: u64) {
    let mut to = [0u32; 16];
    let n = super::raw::targets(f, key, st.qpn, &mut to);
    let sender = Sender::of(st);
    for &qpn in &to[..n] {
        let Some(d) = resolve_dest(f, qpn) else { continue };
        let ds = f.qp_slot(d.idx);
        let state = QpState::from_u8(ds.state.load(Ordering::Acquire) as u8).unwrap_or(QpState::Error);
        if !state.receives() || d.qp_type != QpType::RawPacket {
            continue;
        }
        let _ = deliver(f, sender, &mut st.rx, &d, Incoming::sent(wr, src, total));
    }
}

/// Largest TSO payload (`max_tso`): 256 KiB, what mlx5 devices report.
pub(crate) const MAX_TSO: u32 = 256 << 10;

/// Largest TSO header template (`max_tso_header`).
pub(crate) const MAX_TSO_HEADER: u32 = 256;

/// A UD send to a multicast group (an address handle made for a multicast GID, remote QPN
/// 0xFFFFFF): one copy to every QP attached to the group, each consuming its own receive and
/// finding a GRH whose destination is the group's GID; the sender's own QP gets a copy when it
/// is attached too (NICs loop multicast back unless told not to). A member that is not ready,
/// has another Q_Key or no receive posted drops its copy, as for unicast UD; the sender always
/// completes with success. Out of line: unicast UD and RC/UC never come here.
#[cold]
#[inline(never)]
pub(crate) fn exec_mcast(f: &Fabric, st: &mut SqState, wr: &SendWr, src: &[Seg], total: u64) -> Outcome {
    let done = Outcome::Done(WcStatus::Success, 0);
    // IB multicast packets carry DQPN 0xFFFFFF; a multicast address handle with any other
    // remote QPN reaches no QP.
    if wr.ud.remote_qpn != MCAST_QPN {
        return done;
    }
    let grp = ((wr.ud.ah.0 >> 16) & 0xff) as usize;
    if grp >= super::layout::MAX_MCAST_GRP {
        return done;
    }
    let gen = super::mcast::gen(f, grp);
    let mut cache = st.mcast.take().unwrap_or_else(|| McastDests {
        grp,
        gen: gen.wrapping_sub(1),
        dests: Vec::new(),
        scratch: Vec::new(),
    });
    if cache.grp != grp || cache.gen != gen {
        cache.grp = grp;
        cache.gen = super::mcast::snapshot(f, grp, &mut cache.scratch);
        cache.dests.clear();
        cache.dests.extend(cache.scratch.iter().filter_map(|&q| resolve_dest(f, q)));
    }
    let sender = Sender::of(st);
    let grh = grh_bytes(total, &gid(f.fabric_id(), st.lid), &super::mcast::group_gid(f.mcast_slot(grp)));
    let qkey = if wr.ud.remote_qkey & 0x8000_0000 != 0 { st.qkey } else { wr.ud.remote_qkey };
    for d in &cache.dests {
        let ds = f.qp_slot(d.idx);
        if ds.qpn.load(Ordering::Acquire) != d.qpn {
            continue; // destroyed since the list was read
        }
        let state = QpState::from_u8(ds.state.load(Ordering::Acquire) as u8).unwrap_or(QpState::Error);
        if !state.receives() || d.qp_type != QpType::Ud || ds.qkey.load(Ordering::Relaxed) != qkey {
            continue;
        }
        let _ = deliver(f, sender, &mut st.rx, d, Incoming { grh: &Some(Some(grh)), ..Incoming::sent(wr, src, total) });
    }
    st.mcast = Some(cache);
    done
}

/// The fast path's receive request was not one SGE or did not pass `recv_dst`: the
/// general delivery finishes it (a multi-SGE scatter, or the error completions).
#[cold]
#[inline(never)]
pub(crate) fn deliver_taken_cold(
    f: &Fabric,
    st: Sender,
    rx: &RecvEntry,
    d: &DestView,
    wr: &SendWr,
    src: *mut u8,
    len: usize,
) -> WcStatus {
    deliver_taken(f, st, rx, d, Incoming::sent(wr, &[Seg { ptr: src, len }], len as u64), None)
}

#[cfg(test)]
mod tests {
    use super::{copy_one, LIVENESS_EVERY};

    /// Issue 15, defect 5: RDMA WRITEs to a QP whose owning process is dead went on
    /// succeeding (into a dead process's memory); real RC ends in RETRY_EXC_ERR. The target's
    /// owner pid is set to a process that has exited, as a `kill -9` leaves it.
    #[test]
    fn one_sided_operations_to_a_dead_owner_end_in_retry_exc_err() {
        use crate::shm::layout::{key_index, QP_IDX_BITS};
        use crate::shm::{unit_context, ShmQp};
        use crate::verbs::*;
        use crate::{Context, Cq, Mr, Pd, Qp, QpInitAttr};
        use std::sync::atomic::Ordering;

        let ctx = unit_context("deadowner");
        let pd = ctx.alloc_pd().unwrap();
        let mut cq = ctx.create_cq(16).unwrap();
        let region = ctx.alloc_region(8192).unwrap();
        let mr = pd.reg_mr(&region, 0, 8192, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE).unwrap();
        let attr = QpInitAttr {
            send_cq: &cq,
            recv_cq: &cq,
            srq: None,
            cap: QpCaps::default(),
            qp_type: QpType::Rc,
            sq_sig_all: true,
        };
        let (mut qa, mut qb): (ShmQp, ShmQp) = (pd.create_qp(&attr).unwrap(), pd.create_qp(&attr).unwrap());
        let (na, nb) = (qa.qp_num(), qb.qp_num());
        for (q, dest) in [(&mut qa, nb), (&mut qb, na)] {
            crate::shm::unit_connect(q, dest, AccessFlags::REMOTE_WRITE);
        }
        let mut gone = std::process::Command::new("true").spawn().unwrap();
        gone.wait().unwrap();
        let f = &ctx.inner.fabric;
        f.qp_slot(key_index(qb.qp_num(), QP_IDX_BITS)).pid.store(gone.id(), Ordering::Relaxed);
        let sge = Sge::new(mr.addr(), 8, mr.lkey());
        let mut wc = [WorkCompletion::default(); 1];
        let mut statuses = Vec::new();
        for i in 0..2 * LIVENESS_EVERY as u64 {
            qa.post_send(&SendChain::one(SendWr::write(i, mr.addr() + 4096, mr.rkey()), &[sge])).unwrap();
            while cq.poll(&mut wc).unwrap() == 0 {}
            statuses.push(wc[0].status);
            if wc[0].status != WcStatus::Success {
                break;
            }
        }
        let last = *statuses.last().unwrap();
        assert_eq!(last, WcStatus::RetryExcErr, "{} WRITEs to a dead owner, the last {last:?}", statuses.len());
        assert!(statuses.len() <= LIVENESS_EVERY as usize, "noticed after {} WRITEs", statuses.len());
        assert_eq!(qa.state(), QpState::Error);
    }

    /// The inline small copies agree with `ptr::copy` for every length up to 24 and every
    /// overlap a QP sending to its own buffer can produce (destination before, on, or after
    /// the source).
    #[test]
    fn copy_one_matches_ptr_copy_with_overlap() {
        for n in 0..=24usize {
            for shift in -9i32..=9 {
                let mut a: Vec<u8> = (0..64u8).collect();
                let mut b = a.clone();
                let (src, dst) = (20usize, (20 + shift) as usize);
                let (pa, pb) = (a.as_mut_ptr(), b.as_mut_ptr());
                // SAFETY: both ranges lie inside the 64-byte buffers (20 + 9 + 24 < 64); one raw
                // pointer per buffer, so source and destination may alias as in a real overlap.
                unsafe {
                    copy_one(pa.add(src), pa.add(dst), n);
                    std::ptr::copy(pb.add(src), pb.add(dst), n);
                }
                assert_eq!(a, b, "n = {n}, shift = {shift}");
            }
        }
    }
}

//! The doorbell: executing send WQEs on the poster's CPU.
//!
//! `post_send` validates each WR (errors that "can be detected immediately" return `bad_wr`)
//! and runs it at once: it takes a receive request from the target's RQ or SRQ, copies the
//! gather list into the receive buffers, and writes the receiver's completion and (if
//! signaled) the sender's. A WQE that cannot run yet (RC: no receive posted, or the target not
//! ready) waits in the QP's pending queue with everything behind it, and is retried after the
//! RNR timer or ACK timeout from the send CQ's `poll` or the next `post_send`, until its retry
//! count runs out.
//!
//! Every address and length that comes from shared memory (a peer's receive request, an rkey)
//! is checked against the MR table and the fabric bounds before a byte moves.

use super::cq::{has_channel, push_cqe_to, Cqe};
use super::wire::{CqRing, RecvRing};
use super::fabric::{atomic_u64_at, pid_alive, Fabric};
use super::layout::*;
use super::mr::mr_lookup;
use super::qp::{resolve_local, to_error, SqState, SHM_MTU};
use super::recvq::{self, recv_sge_len, RecvEntry, MAX_SGE};
use super::srq::{srq_view, SrqView};
use crate::net::frame::FrameKey;
use crate::net::tso::TsoPlan;
use crate::verbs::*;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// A contiguous piece of memory in this process.
#[derive(Clone, Copy)]
pub(crate) struct Seg {
    pub ptr: *mut u8,
    pub len: usize,
}

impl Default for Seg {
    fn default() -> Self {
        Seg { ptr: std::ptr::null_mut(), len: 0 }
    }
}

/// Why a WQE waits.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum BlockKind {
    /// The responder had no receive posted (RNR NAK).
    Rnr,
    /// The responder did not answer (absent, not in RTR/RTS, or connected elsewhere).
    Unreachable,
}

/// State of the WQE at the head of the pending queue.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Blocked {
    kind: BlockKind,
    left: u8,
    next_at: Instant,
}

/// The target of a send, resolved from the fabric and cached by the sender.
#[derive(Clone)]
pub(crate) struct DestView {
    qpn: u32,
    idx: usize,
    qp_type: QpType,
    pd: u32,
    lid: u16,
    pid: u32,
    rq: Option<RecvRing>,
    srq: Option<SrqView>,
    cq: CqRing,
    cqn: u32,
    /// Whether the receive CQ has a completion channel (`cq::has_channel`).
    cq_channel: bool,
    /// Our cached view of the receive CQ's consumer position (`cq::push_cqe`).
    cq_head: std::cell::Cell<u64>,
    /// One-sided operations since the owner's liveness was last checked ([`Self::owner_died`]).
    one_sided: std::cell::Cell<u32>,
    /// The owner was found dead ([`Self::owner_died`]).
    owner_dead: std::cell::Cell<bool>,
}

/// One-sided operations between two checks that the target's owning process is alive.
const LIVENESS_EVERY: u32 = 256;

impl DestView {
    /// Whether the target QP's owning process has died, checked once every
    /// [`LIVENESS_EVERY`] calls (one `kill(pid, 0)`; the other calls cost an increment). A
    /// WRITE, READ or atomic needs no receive request, so nothing else notices a dead target:
    /// they went on "succeeding" into a dead process's memory, where real RC ends in
    /// RETRY_EXC_ERR. A dead owner is noticed within that many operations.
    /// Once seen dead, the owner stays dead for this view: the fast path (`post_fast`) may be
    /// the one that notices, and hands the WR to the general path, which must see it too.
    #[inline]
    fn owner_died(&self) -> bool {
        if self.owner_dead.get() {
            return true;
        }
        let n = self.one_sided.get().wrapping_add(1);
        self.one_sided.set(n);
        let dead = n % LIVENESS_EVERY == 0 && owner_gone(self.pid);
        self.owner_dead.set(dead);
        dead
    }

    /// Whether a receive request is posted on this target's RQ or SRQ right now.
    fn has_recv(&self) -> bool {
        match (&self.srq, &self.rq) {
            (Some(s), _) => s.ring.len() > 0,
            (None, Some(r)) => r.len() > 0,
            (None, None) => false,
        }
    }
}

#[cold]
#[inline(never)]
fn owner_gone(pid: u32) -> bool {
    !pid_alive(pid)
}

/// Kept out of line: it runs once per connection, and inlined it made the per-message
/// `dest` a full call with a large frame.
#[cold]
#[inline(never)]
fn resolve_dest(f: &Fabric, qpn: u32) -> Option<DestView> {
    let idx = key_index(qpn, QP_IDX_BITS);
    if idx >= MAX_QP {
        return None;
    }
    let s = f.qp_slot(idx);
    if s.qpn.load(Ordering::Acquire) != qpn {
        return None;
    }
    let qp_type = QpType::from_u8(s.qp_type.load(Ordering::Relaxed) as u8)?;
    let srqn = s.srqn.load(Ordering::Relaxed);
    // An XRC_RECV QP has no queue: each request names its SRQ (`resolve_xrc`).
    let (rq, srq) = if qp_type == QpType::XrcRecv {
        (None, None)
    } else if srqn != 0 {
        (None, Some(srq_view(f, srqn)?))
    } else {
        let sge = s.rq_sge.load(Ordering::Relaxed).min(MAX_SGE as u32);
        let ring = f.recv_ring(s.rq_off.load(Ordering::Relaxed), s.rq_cap.load(Ordering::Relaxed) as usize, sge).ok()?;
        (Some(ring), None)
    };
    // A tag-matching SRQ's receives complete on the SRQ's CQ.
    let cqn = match srq.and_then(|s| s.tm) {
        Some(tm) => tm.cqn,
        None => s.recv_cqn.load(Ordering::Relaxed),
    };
    let cq = super::cq::cq_ring(f, cqn)?;
    let v = DestView {
        qpn,
        idx,
        qp_type,
        pd: s.pd.load(Ordering::Relaxed),
        lid: s.lid.load(Ordering::Relaxed) as u16,
        pid: s.pid.load(Ordering::Relaxed),
        rq,
        srq,
        cq,
        cqn,
        cq_channel: has_channel(f, cqn),
        cq_head: std::cell::Cell::new(0),
        one_sided: std::cell::Cell::new(0),
        owner_dead: std::cell::Cell::new(false),
    };
    (s.qpn.load(Ordering::Acquire) == qpn).then_some(v)
}

/// The cached view of `qpn`, re-resolved when the cache is for another QP or the slot was
/// reused.
///
/// Returns a reference into the cache: the view is a few hundred bytes, and copying it out
/// for every message showed up in instruction profiles.
#[inline]
fn dest<'a>(f: &Fabric, cache: &'a mut Option<DestView>, qpn: u32) -> Option<&'a DestView> {
    let hit = cache.as_ref().is_some_and(|d| d.qpn == qpn && f.qp_slot(d.idx).qpn.load(Ordering::Acquire) == qpn);
    if !hit {
        *cache = resolve_dest(f, qpn);
    }
    cache.as_ref()
}

/// The view of XRC SRQ `srqn` as a message arriving on XRC_RECV QP `tgt` reaches it: `tgt`'s
/// identity (its QPN in the receive completion, its state and access flags) with the SRQ's
/// ring, PD (for receive buffers and rkeys) and CQ. `None` when `srqn` names no XRC SRQ of
/// `tgt`'s domain: no SRQ, a plain or tag-matching one, or one of another domain.
#[cold]
#[inline(never)]
fn resolve_xrc(f: &Fabric, tgt: &DestView, srqn: u32) -> Option<DestView> {
    let xrcd = f.qp_slot(tgt.idx).xrcd.load(Ordering::Relaxed);
    let srq = srq_view(f, srqn)?;
    let ss = f.srq_slot(srq.idx);
    if xrcd == 0 || ss.xrcd.load(Ordering::Relaxed) != xrcd {
        return None;
    }
    let cqn = ss.cqn.load(Ordering::Relaxed);
    let cq = super::cq::cq_ring(f, cqn)?;
    if ss.srqn.load(Ordering::Acquire) != srqn {
        return None;
    }
    let mut v = tgt.clone();
    v.rq = None;
    v.srq = Some(srq);
    v.pd = srq.pd;
    v.cq = cq;
    v.cqn = cqn;
    v.cq_channel = has_channel(f, cqn);
    v.cq_head = std::cell::Cell::new(0);
    Some(v)
}

/// The cached view of XRC SRQ `srqn` behind `tgt` ([`resolve_xrc`]), re-resolved when the
/// cache is for another SRQ or target, or the SRQ's slot was reused.
#[inline]
fn xrc_dest<'a>(f: &Fabric, cache: &'a mut Option<DestView>, tgt: &DestView, srqn: u32) -> Option<&'a DestView> {
    let hit = cache.as_ref().is_some_and(|d| {
        d.qpn == tgt.qpn
            && d.srq.is_some_and(|s| s.srqn == srqn && f.srq_slot(s.idx).srqn.load(Ordering::Acquire) == srqn)
    });
    if !hit {
        *cache = resolve_xrc(f, tgt, srqn);
    }
    cache.as_ref()
}

/// What `deliver` needs to know about the sending QP.
#[derive(Clone, Copy)]
struct Sender {
    qp_type: QpType,
    qpn: u32,
    lid: u16,
}

impl Sender {
    fn of(st: &SqState) -> Sender {
        Sender { qp_type: st.qp_type, qpn: st.qpn, lid: st.lid }
    }
}

enum Outcome {
    /// Executed: the sender's status and byte count.
    Done(WcStatus, u32),
    /// Must wait.
    Block(BlockKind),
}

/// `ptr::copy(src, dst, n)`, with 4 to 16 bytes copied inline: both (possibly overlapping)
/// words are loaded before either is stored, so overlapping ranges come out as with `copy`,
/// and the call into libc's memmove (~20 instructions of an 8-byte SEND) is skipped.
///
/// # Safety
/// As for `ptr::copy`: `src` readable and `dst` writable for `n` bytes.
#[inline(always)]
unsafe fn copy_one(src: *const u8, dst: *mut u8, n: usize) {
    // SAFETY: every access is inside `[src, src + n)` or `[dst, dst + n)` (8 <= n <= 16, or
    // 4 <= n < 8 for the 4-byte words), per the contract; unaligned accesses are used.
    unsafe {
        if (8..=16).contains(&n) {
            let (a, b) = ((src as *const u64).read_unaligned(), (src.add(n - 8) as *const u64).read_unaligned());
            (dst as *mut u64).write_unaligned(a);
            (dst.add(n - 8) as *mut u64).write_unaligned(b);
        } else if (4..8).contains(&n) {
            let (a, b) = ((src as *const u32).read_unaligned(), (src.add(n - 4) as *const u32).read_unaligned());
            (dst as *mut u32).write_unaligned(a);
            (dst.add(n - 4) as *mut u32).write_unaligned(b);
        } else {
            std::ptr::copy(src, dst, n);
        }
    }
}

/// Copies the bytes of `src` into `dst`, skipping the first `skip` bytes of `dst`.
/// The caller has checked that `dst` holds `skip + total(src)` bytes.
#[inline]
fn copy_sg(src: &[Seg], dst: &[Seg], skip: usize) {
    // The common case, one segment into one buffer, without the walk below.
    if let ([s], [d]) = (src, dst) {
        debug_assert!(skip + s.len <= d.len);
        // SAFETY: as below: both ranges were bounds-checked, and the caller checked that `d`
        // holds `skip + s.len` bytes; `copy_one` tolerates overlap.
        unsafe { copy_one(s.ptr, d.ptr.add(skip), s.len) };
        return;
    }
    let (mut di, mut doff) = (0usize, skip);
    while di < dst.len() && doff >= dst[di].len {
        doff -= dst[di].len;
        di += 1;
    }
    for s in src {
        let mut soff = 0;
        while soff < s.len {
            let d = dst[di];
            let n = (s.len - soff).min(d.len - doff);
            // SAFETY: both ranges were bounds-checked against their MRs and the fabric (or are
            // the caller's own inline buffer); `copy` tolerates overlap (a QP sending to its own
            // buffers).
            unsafe { std::ptr::copy(s.ptr.add(soff), d.ptr.add(doff), n) };
            soff += n;
            doff += n;
            if doff == d.len {
                di += 1;
                doff = 0;
            }
        }
    }
}

/// Resolves the receive request's SGEs in the receiver's PD; `None` on a protection error.
/// `out` must hold `rx.n` segments (`N >= rx.n`).
#[inline]
fn resolve_recv<const N: usize>(f: &Fabric, pd: u32, rx: &RecvEntry, out: &mut [Seg; N]) -> Option<(usize, u64)> {
    debug_assert!(rx.n <= N);
    let mut cap = 0u64;
    for (s, o) in rx.sges[..rx.n].iter().zip(out.iter_mut()) {
        let mr = mr_lookup(f, s.lkey).filter(|m| !m.window)?;
        if mr.pd != pd || !mr.access.contains(AccessFlags::LOCAL_WRITE) {
            return None;
        }
        let len = recv_sge_len(s);
        *o = Seg { ptr: mr.translate(f, s.addr, len)?, len: len as usize };
        cap += len;
    }
    Some((rx.n, cap))
}

fn take_recv(f: &Fabric, d: &DestView, rx: &mut RecvEntry) -> bool {
    match (&d.srq, &d.rq) {
        (Some(srq), _) => srq.take(f, rx),
        (None, Some(rq)) => recvq::pop(rq, rx),
        (None, None) => false,
    }
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
fn no_receive(f: &Fabric, d: &DestView, reliable: bool) -> Outcome {
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
fn push_recv_wc(f: &Fabric, d: &DestView, wc: &WorkCompletion, solicited: bool) {
    let mut seen = d.cq_head.get();
    push_cqe_to(f, &d.cq, &mut seen, d.cqn, d.cq_channel, &Cqe { wc: *wc, retire: None, solicited });
    d.cq_head.set(seen);
}

/// The global identifier of `lid` on fabric `fabric_id` (fe80::/64, fabric id, lid).
pub(crate) fn gid(fabric_id: u64, lid: u16) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[0] = 0xfe;
    g[1] = 0x80;
    g[8..14].copy_from_slice(&fabric_id.to_be_bytes()[2..8]);
    g[14..16].copy_from_slice(&lid.to_be_bytes());
    g
}

/// Delivers a message that consumes a receive request (SEND family, WRITE_WITH_IMM).
/// `grh`: UD's 40-byte header area (`Some(bytes)` when a GRH is written, `Some(None)`-like
/// skip when not global).
#[allow(clippy::too_many_arguments)]
fn deliver(
    f: &Fabric,
    st: Sender,
    rx: &mut RecvEntry,
    d: &DestView,
    wr: &SendWr,
    src: &[Seg],
    total: u64,
    grh: &Option<Option<[u8; GRH_LEN]>>,
    place_data: bool,
) -> Outcome {
    let reliable = st.qp_type.is_reliable();
    // Tag matching: a matched message lands headerless in its tagged buffer; anything else
    // continues below into a plain SRQ buffer, whole.
    let mut tm_view = None;
    if let Some(tm) = d.srq.and_then(|s| s.tm).filter(|_| place_data) {
        match tm_match(f, st, rx, d, &tm, src, total, wr.flags.contains(SendFlags::SOLICITED)) {
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
    Outcome::Done(deliver_taken(f, st, rx, d, wr, src, total, grh, place_data, tm_view.as_ref()), 0)
}

/// The part of [`deliver`] after the receive request `rx` was taken: checks its buffers,
/// places the message, writes the receiver's completion (an error one if the buffers do not
/// fit) and returns the sender's status. `tm_view`: the tag-matching SRQ when the message is
/// an unexpected tagged one.
#[allow(clippy::too_many_arguments)]
#[inline]
fn deliver_taken(
    f: &Fabric,
    st: Sender,
    rx: &RecvEntry,
    d: &DestView,
    wr: &SendWr,
    src: &[Seg],
    total: u64,
    grh: &Option<Option<[u8; GRH_LEN]>>,
    place_data: bool,
    tm_view: Option<&super::tm::TmView>,
) -> WcStatus {
    let reliable = st.qp_type.is_reliable();
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
    // Nearly every receive request has one SGE: resolve it into a one-segment array rather
    // than zeroing room for MAX_SGE on every message.
    let status = if rx.n <= 1 {
        place::<1>(f, pd, rx, src, total, grh, place_data, &mut wc)
    } else {
        place::<MAX_SGE>(f, pd, rx, src, total, grh, place_data, &mut wc)
    };
    // One push for both outcomes: a single call site lets it inline, and the completion's
    // fields go straight into the CQ cell.
    if let Err((local, _)) = status {
        wc.status = local;
        wc.byte_len = 0;
    }
    push_recv_wc(f, d, &wc, wr.flags.contains(SendFlags::SOLICITED));
    match status {
        Ok(()) => WcStatus::Success,
        Err((_, remote)) => responder_failed(f, d, reliable, remote),
    }
}

/// A message failed in the responder's receive queue (a corrupt ring, a tagged or plain buffer
/// that does not fit): a connected (RC, UC) responder QP goes to ERROR and an RC requester gets
/// `remote`; UD and RAW_PACKET responders only drop the message, and the requester of anything
/// but RC sees success. Returns the requester's status.
#[cold]
fn responder_failed(f: &Fabric, d: &DestView, reliable: bool, remote: WcStatus) -> WcStatus {
    if d.qp_type.is_connected() {
        to_error(f, d.idx, d.qpn);
    }
    if reliable {
        remote
    } else {
        WcStatus::Success
    }
}

/// Checks the receive request's buffers and copies the message into them (UD: after the GRH
/// area), setting `wc`'s byte count and GRH flag. On failure, the receiver's and the sender's
/// status. `N` must be at least `rx.n`.
#[allow(clippy::too_many_arguments)]
#[inline]
fn place<const N: usize>(
    f: &Fabric,
    pd: u32,
    rx: &RecvEntry,
    src: &[Seg],
    total: u64,
    grh: &Option<Option<[u8; GRH_LEN]>>,
    place_data: bool,
    wc: &mut WorkCompletion,
) -> std::result::Result<(), (WcStatus, WcStatus)> {
    let hdr = if grh.is_some() { GRH_LEN } else { 0 };
    let need = hdr as u64 + if place_data { total } else { 0 };
    let mut dst = [Seg::default(); N];
    match resolve_recv(f, pd, rx, &mut dst) {
        None => Err((WcStatus::LocProtErr, WcStatus::RemOpErr)),
        Some((_, cap)) if cap < need => Err((WcStatus::LocLenErr, WcStatus::RemInvReqErr)),
        Some((n, _)) => {
            if let Some(Some(g)) = grh {
                copy_sg(&[Seg { ptr: g.as_ptr() as *mut u8, len: GRH_LEN }], &dst[..n], 0);
                wc.wc_flags |= WcFlags::GRH;
            }
            if place_data {
                copy_sg(src, &dst[..n], hdr);
                wc.byte_len = need as u32;
            } else {
                wc.byte_len = total as u32;
            }
            Ok(())
        }
    }
}

enum TmOutcome {
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

/// Copies the first `out.len()` bytes of the gather list into `out`.
fn gather_prefix(src: &[Seg], out: &mut [u8]) {
    let mut at = 0;
    for s in src {
        let n = s.len.min(out.len() - at);
        // SAFETY: `s` is a checked local segment of at least `n` bytes; `out` has room.
        unsafe { std::ptr::copy(s.ptr, out[at..].as_mut_ptr(), n) };
        at += n;
        if at == out.len() {
            break;
        }
    }
}

/// The gather list without its first `skip` bytes.
fn skip_prefix(src: &[Seg], mut skip: usize, out: &mut [Seg; MAX_SGE]) -> usize {
    let mut n = 0;
    for s in src {
        if skip >= s.len {
            skip -= s.len;
            continue;
        }
        // SAFETY: `skip < s.len`, so the new start is inside the segment.
        out[n] = Seg { ptr: unsafe { s.ptr.add(skip) }, len: s.len - skip };
        skip = 0;
        n += 1;
    }
    n
}

/// Matches a SEND against a tag-matching SRQ's list. Kept out of line: inlined, its buffers
/// and header parsing made `deliver`'s frame several times larger for every plain message.
#[allow(clippy::too_many_arguments)]
#[inline(never)]
fn tm_match(
    f: &Fabric,
    st: Sender,
    rx: &mut RecvEntry,
    d: &DestView,
    tm: &super::tm::TmView,
    src: &[Seg],
    total: u64,
    solicited: bool,
) -> TmOutcome {
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

/// Checks an rkey for a remote operation on `d`; returns the MR on success.
fn remote_mr(f: &Fabric, d: &DestView, wr: &SendWr, need: AccessFlags) -> Option<super::mr::MrView> {
    let mr = mr_lookup(f, wr.rkey)?;
    let qp_access = AccessFlags::from_bits_truncate(f.qp_slot(d.idx).access.load(Ordering::Relaxed));
    (mr.pd == d.pd && mr.access.contains(need) && qp_access.contains(need)).then_some(mr)
}

/// Runs one WQE. `src` are its local segments (gather list, or scatter list for READ and
/// atomics), `total` their length.
fn exec_wr(f: &Fabric, st: &mut SqState, wr: &SendWr, src: &[Seg], total: u64) -> Outcome {
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
        WrOpcode::Send | WrOpcode::SendWithImm => deliver(f, sender, &mut st.rx, d, wr, src, total, &None, true),
        WrOpcode::SendWithInv => {
            // The rkey must name a window of the responder's PD, else the responder rejects
            // the request before placing anything.
            if !mr_lookup(f, wr.imm_data).is_some_and(|m| m.window && m.pd == d.pd) {
                return fail(WcStatus::RemInvReqErr);
            }
            let out = deliver(f, sender, &mut st.rx, d, wr, src, total, &None, true);
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
                return deliver(f, sender, &mut st.rx, d, wr, src, total, &None, false);
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

fn exec_ud(f: &Fabric, st: &mut SqState, wr: &SendWr, src: &[Seg], total: u64) -> Outcome {
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
    deliver(f, sender, &mut st.rx, d, wr, src, total, &Some(grh), true)
}

/// The largest RAW_PACKET frame: the port MTU plus Ethernet header, two VLAN tags.
const RAW_MAX_FRAME: usize = SHM_MTU as usize + 22;

/// A RAW_PACKET send: one Ethernet frame, switched to the QPs whose steering rules match
/// (`raw::targets`), at offset 0 of each one's receive buffer. With `IBV_SEND_IP_CSUM` the
/// checksums are filled in a copy of the frame first. The sender always completes with
/// success (Ethernet: a frame nobody takes is dropped).
fn exec_raw(f: &Fabric, st: &mut SqState, wr: &SendWr, src: &[Seg], total: u64) -> Outcome {
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
fn switch_frame(f: &Fabric, st: &mut SqState, wr: &SendWr, key: &FrameKey, src: &[Seg], total: u64) {
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
        let _ = deliver(f, sender, &mut st.rx, &d, wr, src, total, &None, true);
    }
}

/// Largest TSO payload (`max_tso`): 256 KiB, what mlx5 devices report.
pub(crate) const MAX_TSO: u32 = 256 << 10;
/// Largest TSO header template (`max_tso_header`).
pub(crate) const MAX_TSO_HEADER: u32 = 256;

/// Checks, accounts and runs a TSO request on a RAW_PACKET QP (`IBV_WR_TSO`): its header
/// template (`hdr`, from [`SendChain::push_tso`]) and payload become frames of at most `mss`
/// payload bytes ([`TsoPlan`]), each switched as a RAW_PACKET send is. One completion (opcode
/// TSO) for the request. RAW_PACKET QPs never wait (no RNR), so nothing is pending behind
/// which the frames could overtake an earlier request.
///
/// Errors (EINVAL unless said, `bad_wr` = `i`, nothing posted): the opcode on a connected
/// QP (the seed table); EOPNOTSUPP on UD (the shm provider segments TCP over Ethernet, which a
/// UD message does not carry); no header, one over [`MAX_TSO_HEADER`], or one
/// [`TsoPlan::new`] refuses; a payload over [`MAX_TSO`]; a header plus MSS over the port MTU
/// + 18; the gather list's own checks; ENOMEM on a full send queue.
#[cold]
#[inline(never)]
#[allow(clippy::too_many_arguments)]
fn post_tso(
    f: &Fabric,
    st: &mut SqState,
    wr: &SendWr,
    sges: &[Sge],
    hdr: Option<&[u8]>,
    i: usize,
    state: &mut QpState,
    retired: &mut u32,
) -> std::result::Result<(), PostError> {
    let einval = |why| PostError::new(Errno::EINVAL, i, why);
    if !WrOpcode::Tso.allowed_on(st.qp_type) {
        return Err(einval("opcode not allowed on this QP type (ibv_post_send(3) table)"));
    }
    if st.qp_type != QpType::RawPacket {
        return Err(PostError::new(
            Errno::EOPNOTSUPP,
            i,
            "TSO on UD QPs is not offered by the shm provider (it segments TCP over Ethernet, on RAW_PACKET QPs)",
        ));
    }
    let Some(hdr) = hdr else {
        return Err(einval("TSO request without a header template (push it with SendChain::push_tso)"));
    };
    if hdr.len() > MAX_TSO_HEADER as usize {
        return Err(einval("TSO header longer than max_tso_header (256)"));
    }
    let mut segs = [Seg::default(); MAX_SGE];
    let (n, total, _) = prepare(f, st, wr, sges, None, i, &mut segs)?;
    if total > u64::from(MAX_TSO) {
        return Err(einval("TSO payload larger than max_tso (256 KiB)"));
    }
    let plan = TsoPlan::new(hdr, wr.tso_mss(), total as usize).map_err(einval)?;
    if plan.header_len() + usize::from(wr.tso_mss()) > RAW_MAX_FRAME {
        return Err(einval("TSO header + MSS larger than the port MTU (4096) + 18 bytes of headers"));
    }
    let Some(wqe) = claim_wqe(st, wr, *state, retired, i)? else { return Ok(()) };
    // Every frame has the template's addresses, EtherType, protocol and ports: one key.
    let key = FrameKey::parse(hdr);
    let mut frame = [0u8; RAW_MAX_FRAME];
    let h = plan.header_len();
    let mut rest = [Seg::default(); MAX_SGE];
    for k in 0..plan.frames() {
        let (off, len) = plan.range(k);
        let m = skip_prefix(&segs[..n], off, &mut rest);
        gather_prefix(&rest[..m], &mut frame[h..h + len]);
        let end = plan.write_frame(hdr, k, &mut frame);
        let one = [Seg { ptr: frame.as_mut_ptr(), len: end }];
        switch_frame(f, st, wr, &key, &one, end as u64);
    }
    finish(f, st, wr, wqe, WcStatus::Success, 0);
    Ok(())
}

/// The 40-byte GRH a UD receiver finds before the payload: version 6, payload length, next
/// header "IBA transport", hop limit 64, source and destination GIDs.
fn grh_bytes(total: u64, sgid: &[u8; 16], dgid: &[u8; 16]) -> [u8; GRH_LEN] {
    let mut g = [0u8; GRH_LEN];
    g[0] = 0x60; // IPv6-style version 6, traffic class and flow label 0
    g[4..6].copy_from_slice(&(total as u16).to_be_bytes());
    g[6] = 0x1b; // next header: IBA transport
    g[7] = 64; // hop limit
    g[8..24].copy_from_slice(sgid);
    g[24..40].copy_from_slice(dgid);
    g
}

/// A send queue's cached view of the members of the multicast group it last sent to.
pub(crate) struct McastDests {
    grp: usize,
    gen: u32,
    dests: Vec<DestView>,
    scratch: Vec<u32>,
}

/// A UD send to a multicast group (an address handle made for a multicast GID, remote QPN
/// 0xFFFFFF): one copy to every QP attached to the group, each consuming its own receive and
/// finding a GRH whose destination is the group's GID; the sender's own QP gets a copy when it
/// is attached too (NICs loop multicast back unless told not to). A member that is not ready,
/// has another Q_Key or no receive posted drops its copy, as for unicast UD; the sender always
/// completes with success. Out of line: unicast UD and RC/UC never come here.
#[cold]
#[inline(never)]
fn exec_mcast(f: &Fabric, st: &mut SqState, wr: &SendWr, src: &[Seg], total: u64) -> Outcome {
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
        let _ = deliver(f, sender, &mut st.rx, d, wr, src, total, &Some(Some(grh)), true);
    }
    st.mcast = Some(cache);
    done
}

/// Marks an AH handle naming a multicast group; bits 16..24 hold the group's slot.
pub(crate) const AH_MCAST: u64 = 1 << 40;
/// Marks an AH handle issued by the shm provider.
pub(crate) const AH_VALID: u64 = 1 << 48;
/// Marks an AH whose attributes ask for a GRH.
pub(crate) const AH_GLOBAL: u64 = 1 << 32;

/// Checks one send WR at post time and resolves its local memory into `segs` (room for
/// `max(1, sges.len())`). Returns the number of segments and the total length.
#[inline(always)]
fn prepare(
    f: &Fabric,
    st: &SqState,
    wr: &SendWr,
    sges: &[Sge],
    inline: Option<&[u8]>,
    i: usize,
    segs: &mut [Seg],
) -> std::result::Result<(usize, u64, bool), PostError> {
    let op = wr.opcode;
    if !op.allowed_on(st.qp_type) {
        return Err(PostError::new(Errno::EINVAL, i, "opcode not allowed on this QP type (ibv_post_send(3) table)"));
    }
    if wr.flags.contains(SendFlags::IP_CSUM) && st.qp_type != QpType::RawPacket {
        return Err(PostError::new(Errno::EINVAL, i, "IBV_SEND_IP_CSUM is offloaded on RAW_PACKET QPs only"));
    }
    let is_inline = wr.flags.contains(SendFlags::INLINE) || inline.is_some();
    // ibv_post_send(3): INLINE is "Valid only for Send and RDMA Write". Refused rather than
    // ignored: for RDMA READ and atomics the local buffer is a destination, and with
    // `push_inline` it would be the chain's own immutable bytes (conformance case
    // inline_only_for_send_and_write).
    if is_inline && !op.inline_allowed() {
        return Err(PostError::new(Errno::EINVAL, i, "IBV_SEND_INLINE is valid only for Send and RDMA Write"));
    }
    let (n, total) = if let Some(bytes) = inline {
        segs[0] = Seg { ptr: bytes.as_ptr() as *mut u8, len: bytes.len() };
        (1, bytes.len() as u64)
    } else {
        if sges.len() > st.max_sge as usize {
            return Err(PostError::new(Errno::EINVAL, i, "more SGEs than the QP's max_send_sge"));
        }
        if is_inline {
            // The L_Key is not checked; the bytes must still be memory this process can read
            // safely: the fabric.
            let mut total = 0u64;
            for (k, s) in sges.iter().enumerate() {
                let Some(off) = f.offset_of(s.addr, s.length as u64) else {
                    return Err(PostError::new(Errno::EINVAL, i, "inline SGE outside the fabric's memory"));
                };
                segs[k] =
                    Seg { ptr: f.ptr(off, s.length as u64).unwrap_or(std::ptr::null_mut()), len: s.length as usize };
                total += s.length as u64;
            }
            (sges.len(), total)
        } else {
            let need_write = matches!(op, WrOpcode::RdmaRead | WrOpcode::AtomicCmpAndSwp | WrOpcode::AtomicFetchAndAdd);
            resolve_local(f, st.pd, sges, need_write, segs).map_err(|r| PostError::new(Errno::EINVAL, i, r))?
        }
    };
    if is_inline && total > st.max_inline as u64 {
        return Err(PostError::new(Errno::EINVAL, i, "inline data longer than the QP's max_inline_data"));
    }
    match op {
        WrOpcode::AtomicCmpAndSwp | WrOpcode::AtomicFetchAndAdd if total != 8 => {
            return Err(PostError::new(Errno::EINVAL, i, "atomic operations need an 8-byte local buffer"));
        }
        _ => {}
    }
    if st.qp_type == QpType::Ud {
        if wr.ud.ah.0 & AH_VALID == 0 {
            return Err(PostError::new(Errno::EINVAL, i, "UD send without a valid address handle"));
        }
        if total > SHM_MTU as u64 {
            return Err(PostError::new(Errno::EINVAL, i, "UD message larger than the path MTU (4096)"));
        }
    } else if st.qp_type == QpType::RawPacket && op != WrOpcode::Tso {
        // (A TSO payload is not a frame: `post_tso` bounds it.)
        if total < 14 {
            return Err(PostError::new(Errno::EINVAL, i, "a RAW_PACKET send must hold an Ethernet header (14 bytes)"));
        }
        if total > RAW_MAX_FRAME as u64 {
            return Err(PostError::new(
                Errno::EINVAL,
                i,
                "frame larger than the port MTU (4096) + 18 bytes of headers",
            ));
        }
    } else if total > 1 << 31 {
        return Err(PostError::new(Errno::EINVAL, i, "message larger than max_msg_sz (2^31)"));
    }
    Ok((n, total, is_inline))
}

/// `ibv_post_send` on the shm provider. See the module docs.
#[inline]
pub(crate) fn post_send(f: &Fabric, st: &mut SqState, chain: &SendChain) -> std::result::Result<(), PostError> {
    let mut state = st.state();
    if !state.accepts_post_send() {
        return Err(PostError::new(
            Errno::EINVAL,
            0,
            "QP is not ready to send (post_send needs RTS, SQD, SQE or ERROR)",
        ));
    }
    if !st.pending.is_empty() {
        // A peer may have moved this QP to ERROR (its message failed in our receive queue)
        // while WQEs wait: flush those before anything posted now, as poll's progress() does,
        // so completions stay in posting order (case flush_after_peer_error_keeps_order).
        st.progress();
        state = st.state();
        if state == QpState::Error {
            st.flush_pending();
        }
    }
    let mut retired = st.slot().sq_retired.load(Ordering::Acquire);
    for (i, wr) in chain.wrs().iter().enumerate() {
        let sges = chain.sges_of(wr);
        let inline = chain.inline_of(wr);
        if let ([sge], None) = (sges, inline) {
            if post_fast::<false>(f, st, wr, sge, &mut state, &mut retired) {
                continue;
            }
        }
        // Most WRs have one SGE (or inline bytes, one segment): their segments fit an array
        // of one, which costs nothing to initialise, unlike room for MAX_SGE. TSO goes out of
        // line with the multi-SGE WRs (kept out of this loop: its call here made LLVM stop
        // inlining the fast path's lookups, +118 instructions per message in chains).
        if sges.len() <= 1 && wr.opcode != WrOpcode::Tso && st.qp_type != QpType::XrcSend {
            post_one::<1>(f, st, wr, sges, inline, i, &mut state, &mut retired)?;
        } else {
            post_many(f, st, wr, sges, inline, chain, i, &mut state, &mut retired)?;
        }
    }
    Ok(())
}

/// The fast path: runs WR `wr` (one SGE, INLINE or not) if it is the common case, an RC or UC
/// (`XRC`: an XRC_SEND) SEND, SEND_WITH_IMM or RDMA_WRITE from an RTS queue with nothing
/// pending, to a ready peer with an RQ or a plain (not tag-matching) SRQ (`XRC`: the XRC SRQ
/// the request names, behind the connected XRC_RECV QP); returns false, having changed
/// nothing, for anything else, which then takes the general path (`post_one`, which also
/// reports every error).
///
/// Every check the general path makes runs here too, in the same order of effect: the WR
/// checks of `prepare` (the opcode is allowed on RC and UC, no IP_CSUM, one SGE within
/// `max_send_sge`, at most 2^31 bytes, the lkey is an MR of our PD covering the bytes — or,
/// INLINE, the bytes lie in the fabric and fit `max_inline_data`), the queue space, the destination checks of `exec_wr`, then the rkey checks of an
/// RDMA WRITE. Only then does anything happen. A SEND's point of no return is taking the
/// receive request: with none posted it returns false (RNR or a UC drop, decided by the
/// general path); a request that is not one SGE, or whose buffer does not fit or fails its
/// checks, is finished by the general code ([`deliver_taken`]), so the receiver sees the
/// same completion either way.
#[inline(always)]
fn post_fast<const XRC: bool>(
    f: &Fabric,
    st: &mut SqState,
    wr: &SendWr,
    sge: &Sge,
    state: &mut QpState,
    retired: &mut u32,
) -> bool {
    let op = wr.opcode;
    let is_send = matches!(op, WrOpcode::Send | WrOpcode::SendWithImm);
    let type_ok = if XRC { st.qp_type == QpType::XrcSend } else { matches!(st.qp_type, QpType::Rc | QpType::Uc) };
    if !(is_send || op == WrOpcode::RdmaWrite)
        || !type_ok
        || *state != QpState::Rts
        || !st.pending.is_empty()
        || st.max_sge == 0
        || wr.flags.contains(SendFlags::IP_CSUM)
        || sge.length > 1 << 31
    {
        return false;
    }
    let len = sge.length as usize;
    // INLINE (valid for all three opcodes here): the bytes are copied now, so the L_Key is not
    // checked, but they must lie in the fabric and fit max_inline_data, as `prepare` requires.
    let src = if wr.flags.contains(SendFlags::INLINE) {
        if sge.length > st.max_inline {
            return false;
        }
        f.offset_of(sge.addr, sge.length as u64).and_then(|off| f.ptr(off, sge.length as u64))
    } else {
        mr_lookup(f, sge.lkey)
            .filter(|m| !m.window && m.pd == st.pd)
            .and_then(|m| m.translate(f, sge.addr, sge.length as u64))
    };
    let Some(src) = src else {
        return false;
    };
    if st.posted.wrapping_sub(*retired) >= st.depth {
        *retired = st.slot().sq_retired.load(Ordering::Acquire);
        if st.posted.wrapping_sub(*retired) >= st.depth {
            return false;
        }
    }
    let Some(d) = dest(f, &mut st.dest, st.dest_qpn) else { return false };
    let ds = f.qp_slot(d.idx);
    let ready = QpState::from_u8(ds.state.load(Ordering::Acquire) as u8).is_some_and(QpState::receives);
    let peer = if XRC { QpType::XrcRecv } else { st.qp_type };
    if !ready || ds.dest_qpn.load(Ordering::Relaxed) != st.qpn || d.qp_type != peer {
        return false;
    }
    // XRC: the SRQ the request names, behind the XRC_RECV QP (a wrong one: the general path
    // reports it).
    let d = if XRC {
        match xrc_dest(f, &mut st.xrc_dest, d, wr.remote_srqn) {
            Some(x) => x,
            None => return false,
        }
    } else {
        d
    };
    let status = if is_send {
        // An SRQ is consumed with the MPMC pop (`SrqView::take`, which also raises the limit
        // event); a tag-matching SRQ goes the general way (it may match the message).
        // (`resolve_dest` gives a target an RQ or an SRQ, never both.)
        let taken = match (&d.rq, &d.srq) {
            (Some(rq), _) => recvq::pop(rq, &mut st.rx),
            (None, Some(srq)) if srq.tm.is_none() => srq_take(f, srq, &mut st.rx),
            _ => return false,
        };
        let pd = d.srq.map_or(d.pd, |s| s.pd);
        if !taken {
            return false;
        }
        if st.rx.n == 1 && place_one(f, pd, &st.rx.sges[0], src, len) {
            let imm = op == WrOpcode::SendWithImm;
            let wc = WorkCompletion {
                wr_id: st.rx.wr_id,
                opcode: WcOpcode::Recv,
                byte_len: len as u32,
                imm_data: if imm { wr.imm_data } else { 0 },
                wc_flags: if imm { WcFlags::WITH_IMM } else { WcFlags::empty() },
                qp_num: d.qpn,
                src_qp: st.qpn,
                slid: st.lid,
                ..Default::default()
            };
            push_recv_wc(f, d, &wc, wr.flags.contains(SendFlags::SOLICITED));
            WcStatus::Success
        } else {
            let sender = Sender { qp_type: st.qp_type, qpn: st.qpn, lid: st.lid };
            deliver_taken_cold(f, sender, &st.rx, d, wr, src, len)
        }
    } else {
        // A dead owner's memory is not written: the general path turns this WR into the
        // unanswered request that ends in RETRY_EXC_ERR.
        if d.owner_died() {
            return false;
        }
        let Some(dst) = remote_mr(f, d, wr, AccessFlags::REMOTE_WRITE)
            .and_then(|m| m.translate(f, wr.remote_addr, sge.length as u64))
        else {
            return false;
        };
        // SAFETY: `src` was checked against our MR and `dst` against the peer's, both for
        // `len` bytes inside the fabric; `copy_one` tolerates overlap.
        unsafe { copy_one(src, dst, len) };
        WcStatus::Success
    };
    let wqe = st.posted;
    st.posted = st.posted.wrapping_add(1);
    finish(f, st, wr, wqe, status, 0);
    if status != WcStatus::Success {
        *state = QpState::Error;
    }
    true
}

/// The fast path for XRC_SEND QPs: [`post_fast`] with the target SRQ named by the request,
/// out of line so that RC and UC posts do not carry it.
#[inline(never)]
fn post_fast_xrc(f: &Fabric, st: &mut SqState, wr: &SendWr, sge: &Sge, state: &mut QpState, retired: &mut u32) -> bool {
    post_fast::<true>(f, st, wr, sge, state, retired)
}

/// `SrqView::take` kept out of line: inlined into the fast path, it made the RQ case ~17
/// instructions dearer per message (callgrind), for register pressure and frame size.
#[inline(never)]
fn srq_take(f: &Fabric, srq: &SrqView, rx: &mut RecvEntry) -> bool {
    srq.take(f, rx)
}

/// Places `len` bytes from `src` into the one-SGE receive request `r`, if its lkey names an
/// MR (not a window) of PD `pd` (the receiving QP's, or its SRQ's) with LOCAL_WRITE whose
/// range holds the SGE, and the SGE holds the message. False, with nothing written, otherwise.
#[inline(always)]
fn place_one(f: &Fabric, pd: u32, r: &Sge, src: *mut u8, len: usize) -> bool {
    let cap = recv_sge_len(r);
    let dst = mr_lookup(f, r.lkey)
        .filter(|m| !m.window && m.pd == pd && m.access.contains(AccessFlags::LOCAL_WRITE))
        .and_then(|m| m.translate(f, r.addr, cap));
    match dst {
        Some(dst) if len as u64 <= cap => {
            // SAFETY: `src` was checked for `len` bytes against the sender's MR, `dst` for
            // `cap >= len` bytes against the receiver's; `copy_one` tolerates overlap.
            unsafe { copy_one(src, dst, len) };
            true
        }
        _ => false,
    }
}

/// The fast path's receive request was not one SGE or did not pass `place_one`: the
/// general delivery finishes it (a multi-SGE scatter, or the error completions).
#[cold]
#[inline(never)]
fn deliver_taken_cold(
    f: &Fabric,
    st: Sender,
    rx: &RecvEntry,
    d: &DestView,
    wr: &SendWr,
    src: *mut u8,
    len: usize,
) -> WcStatus {
    deliver_taken(f, st, rx, d, wr, &[Seg { ptr: src, len }], len as u64, &None, true, None)
}

/// `post_one` for a WR with several SGEs, and TSO requests ([`post_tso`]), out of line to
/// keep the common loop small.
#[allow(clippy::too_many_arguments)]
#[inline(never)]
fn post_many(
    f: &Fabric,
    st: &mut SqState,
    wr: &SendWr,
    sges: &[Sge],
    inline: Option<&[u8]>,
    chain: &SendChain,
    i: usize,
    state: &mut QpState,
    retired: &mut u32,
) -> std::result::Result<(), PostError> {
    if wr.opcode == WrOpcode::Tso {
        return post_tso(f, st, wr, sges, chain.tso_hdr_of(wr), i, state, retired);
    }
    if st.qp_type == QpType::XrcSend {
        if let ([sge], None) = (sges, inline) {
            if post_fast_xrc(f, st, wr, sge, state, retired) {
                return Ok(());
            }
        }
    }
    post_one::<MAX_SGE>(f, st, wr, sges, inline, i, state, retired)
}

/// Takes the next WQE of the send queue for WR `i` (`wr`), after its checks: ENOMEM when the
/// queue is full (`retired` re-read once first); `None` when the QP is in ERROR, the WQE
/// then completed with a flush error.
#[inline(always)]
fn claim_wqe(
    st: &mut SqState,
    wr: &SendWr,
    state: QpState,
    retired: &mut u32,
    i: usize,
) -> std::result::Result<Option<u32>, PostError> {
    if st.posted.wrapping_sub(*retired) >= st.depth {
        *retired = st.slot().sq_retired.load(Ordering::Acquire);
        if st.posted.wrapping_sub(*retired) >= st.depth {
            return Err(PostError::new(Errno::ENOMEM, i, "send queue full (poll completions to free slots)"));
        }
    }
    let wqe = st.posted;
    st.posted = st.posted.wrapping_add(1);
    if state == QpState::Error {
        st.complete(wr, wqe, WcStatus::WrFlushErr, 0);
        return Ok(None);
    }
    Ok(Some(wqe))
}

/// Checks, accounts and runs WR `i` of a chain (the body of `post_send`'s loop). `N` is the
/// room for its local segments: at least 1 and `sges.len()`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn post_one<const N: usize>(
    f: &Fabric,
    st: &mut SqState,
    wr: &SendWr,
    sges: &[Sge],
    inline: Option<&[u8]>,
    i: usize,
    state: &mut QpState,
    retired: &mut u32,
) -> std::result::Result<(), PostError> {
    let mut segs = [Seg::default(); N];
    let (n, total, is_inline) = prepare(f, st, wr, sges, inline, i, &mut segs)?;
    let Some(wqe) = claim_wqe(st, wr, *state, retired, i)? else { return Ok(()) };
    if !st.pending.is_empty() {
        st.enqueue(wr, wqe, sges, is_inline.then_some(&segs[..n]));
        return Ok(());
    }
    match exec_wr(f, st, wr, &segs[..n], total) {
        Outcome::Done(status, len) => {
            finish(f, st, wr, wqe, status, len);
            if status != WcStatus::Success {
                *state = QpState::Error;
            }
        }
        Outcome::Block(kind) => {
            st.enqueue(wr, wqe, sges, is_inline.then_some(&segs[..n]));
            st.blocked = None;
            if !handle_block(f, st, kind) {
                *state = QpState::Error;
            }
        }
    }
    Ok(())
}

/// Completes an executed WQE: its CQE if signaled; on failure an error CQE and ERROR.
#[inline]
fn finish(f: &Fabric, st: &mut SqState, wr: &SendWr, wqe: u32, status: WcStatus, len: u32) {
    if status == WcStatus::Success {
        if st.sig_all || wr.flags.contains(SendFlags::SIGNALED) {
            st.complete(wr, wqe, status, len);
        }
    } else {
        fail(f, st, wr, wqe, status);
    }
}

/// The failure half of `finish`, out of line (rare, and it drags in the flush path).
#[inline(never)]
fn fail(f: &Fabric, st: &mut SqState, wr: &SendWr, wqe: u32, status: WcStatus) {
    st.complete(wr, wqe, status, 0);
    st.enter_error(f);
}

fn block_delay(f: &Fabric, st: &SqState, kind: BlockKind) -> Duration {
    match kind {
        BlockKind::Rnr => {
            let code = st.dest.as_ref().map_or(0, |d| f.qp_slot(d.idx).min_rnr_timer.load(Ordering::Relaxed) as u8);
            Duration::from_nanos(rnr_timer_ns(code))
        }
        // An infinite ACK timeout would hang forever on hardware; here the WQE is retried
        // every millisecond without using up retries.
        BlockKind::Unreachable => Duration::from_nanos(st.timeout_ns.unwrap_or(1_000_000)),
    }
}

/// The WQE at the head of the pending queue could not run. Schedules its retry, or fails it
/// (and flushes the rest) when no retry is left: `rnr_retry`/`retry_cnt` count retries after
/// the first attempt, 7 RNR retries mean forever. Returns false when the head failed.
fn handle_block(f: &Fabric, st: &mut SqState, kind: BlockKind) -> bool {
    let forever =
        (kind == BlockKind::Rnr && st.rnr_retry == 7) || (kind == BlockKind::Unreachable && st.timeout_ns.is_none());
    let left = match st.blocked {
        // This failure was a retry: it used one up.
        Some(b) if b.kind == kind => {
            st.retries += 1;
            if forever {
                b.left
            } else {
                b.left.saturating_sub(1)
            }
        }
        // First failure of this kind for this WQE.
        _ => match kind {
            BlockKind::Rnr => st.rnr_retry,
            BlockKind::Unreachable => st.retry_cnt,
        },
    };
    let peer_dead = st.dest.as_ref().is_some_and(|d| !pid_alive(d.pid));
    if peer_dead || (!forever && left == 0) {
        st.blocked = None;
        if let Some(p) = st.pending.pop_front() {
            let status =
                if kind == BlockKind::Rnr && !peer_dead { WcStatus::RnrRetryExcErr } else { WcStatus::RetryExcErr };
            finish(f, st, &p.wr, p.wqe, status, 0);
        }
        return false;
    }
    st.blocked = Some(Blocked { kind, left, next_at: Instant::now() + block_delay(f, st, kind) });
    true
}

/// Runs pending WQEs in order while the head can make progress.
///
/// An RNR wait ends early when the responder has posted a receive since: a NIC cannot see
/// the responder's queue and must sleep the whole RNR timer, but this one can, and sleeping
/// on with a buffer ready only turns a short burst into a 10 µs+ stall (it made `send_bw`
/// on shm bimodal). The early attempt is not a retry: if it finds the queue empty again
/// (another sender of an SRQ won the request), the wait, its deadline and the retry count
/// stay as they were. So `rnr_retry` still counts timer expiries exactly.
pub(crate) fn run_pending(f: &Fabric, st: &mut SqState) {
    let mut segs = [Seg::default(); MAX_SGE];
    while let Some(p) = st.pending.front().copied() {
        let mut early = false;
        if let Some(b) = st.blocked {
            if Instant::now() < b.next_at {
                if b.kind != BlockKind::Rnr || !st.dest.as_ref().is_some_and(DestView::has_recv) {
                    return;
                }
                early = true;
            }
        }
        let (n, total) = {
            let (sges, inline) = st.pending_parts(&p);
            match inline {
                Some(bytes) => {
                    segs[0] = Seg { ptr: bytes.as_ptr() as *mut u8, len: bytes.len() };
                    (1, bytes.len() as u64)
                }
                None => {
                    let need_write = matches!(
                        p.wr.opcode,
                        WrOpcode::RdmaRead | WrOpcode::AtomicCmpAndSwp | WrOpcode::AtomicFetchAndAdd
                    );
                    let sges: [Sge; MAX_SGE] = std::array::from_fn(|k| sges.get(k).copied().unwrap_or_default());
                    match resolve_local(f, st.pd, &sges[..p.n_sge as usize], need_write, &mut segs) {
                        Ok(v) => v,
                        Err(_) => {
                            st.pending.pop_front();
                            finish(f, st, &p.wr, p.wqe, WcStatus::LocProtErr, 0);
                            return;
                        }
                    }
                }
            }
        };
        match exec_wr(f, st, &p.wr, &segs[..n], total) {
            Outcome::Done(status, len) => {
                st.pending.pop_front();
                st.blocked = None;
                finish(f, st, &p.wr, p.wqe, status, len);
                if status != WcStatus::Success {
                    return;
                }
            }
            Outcome::Block(kind) => {
                if !(early && kind == BlockKind::Rnr) {
                    handle_block(f, st, kind);
                }
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{copy_one, LIVENESS_EVERY};

    /// Issue 15, defect 5: RDMA WRITEs to a QP whose owning process is dead went on
    /// succeeding (into a dead process's memory); real RC ends in RETRY_EXC_ERR. The target's
    /// owner pid is set to a process that has exited, as a `kill -9` leaves it.
    #[test]
    fn one_sided_operations_to_a_dead_owner_end_in_retry_exc_err() {
        use crate::mem::HugePolicy;
        use crate::shm::layout::{key_index, QP_IDX_BITS};
        use crate::shm::{Shm, ShmConfig, ShmQp};
        use crate::verbs::*;
        use crate::{Context, Cq, Mr, Pd, Provider, Qp, QpInitAttr};
        use std::sync::atomic::Ordering;

        let cfg = ShmConfig {
            fabric: format!("unit-deadowner-{}", std::process::id()),
            size: 16 << 20,
            huge: HugePolicy::Never,
        };
        let ctx = Shm::open(&cfg).unwrap();
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
            q.modify(&QpAttr { state: QpState::Init, access: AccessFlags::REMOTE_WRITE, ..Default::default() })
                .unwrap();
            q.modify(&QpAttr { state: QpState::Rtr, dest_qp_num: dest, ..Default::default() }).unwrap();
            q.modify(&QpAttr { state: QpState::Rts, ..Default::default() }).unwrap();
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

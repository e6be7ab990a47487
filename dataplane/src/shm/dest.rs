//! Destination: resolving where a send goes. A QP number to the target's receive queue or
//! SRQ and its receive CQ (`resolve_dest`, cached per sender in a [`DestView`] and checked
//! for liveness every [`LIVENESS_EVERY`] one-sided operations), an XRC SRQ number through
//! the connected XRC_RECV QP (`resolve_xrc`), an rkey to the remote MR (`remote_mr`), an
//! address handle's encoding (`AH_*`) and a port's GID (`gid`). Taking a receive request off
//! the target's queue (`take_recv`, `srq_take_held`, and for a post list's SENDs `doorbell::srq_take`) is the destination's last step.

use super::complete::has_channel;
use super::fabric::{pid_alive, Fabric};
use super::layout::*;
use super::mr::mr_lookup;
use super::recvq::{self, RecvEntry, MAX_SGE};
use super::srq::{srq_view, SrqView};
use super::wire::{CqRing, RecvRing};
use crate::verbs::*;
use std::sync::atomic::Ordering;

/// The target of a send, resolved from the fabric and cached by the sender.
#[derive(Clone)]
pub(crate) struct DestView {
    pub(crate) qpn: u32,
    pub(crate) idx: usize,
    /// The target's slot (`f.qp_slot(idx)`), kept mapped by the view's holder, as `rq` is.
    pub(crate) slot: super::fabric::SlotRef<QpSlot>,
    pub(crate) qp_type: QpType,
    pub(crate) pd: u32,
    pub(crate) lid: u16,
    pub(crate) pid: u32,
    pub(crate) rq: Option<RecvRing>,
    pub(crate) srq: Option<SrqView>,
    pub(crate) cq: CqRing,
    pub(crate) cqn: u32,
    /// Whether the receive CQ has a completion channel (`complete::has_channel`).
    pub(crate) cq_channel: bool,
    /// The receive CQ's message queue, when small SENDs to this target go through it: an
    /// RC target with its own RQ whose CQ has one (`shm::drain`).
    pub(crate) mq: Option<super::msgq::MsgQueue>,
    /// Our cached view of the receive CQ's consumer position (`complete::push_cqe`).
    pub(crate) cq_head: std::cell::Cell<u64>,
    /// One-sided operations since the owner's liveness was last checked ([`Self::owner_died`]).
    pub(crate) one_sided: std::cell::Cell<u32>,
    /// The owner was found dead ([`Self::owner_died`]).
    pub(crate) owner_dead: std::cell::Cell<bool>,
    /// The sender's state of `rq`'s single-consumer mode (`shm::solo`).
    pub(crate) solo: std::cell::Cell<recvq::Solo>,
}

/// One-sided operations between two checks that the target's owning process is alive.
pub(crate) const LIVENESS_EVERY: u32 = 256;

impl DestView {
    /// Whether the target QP's owning process has died, checked once every
    /// [`LIVENESS_EVERY`] calls (one `kill(pid, 0)`; the other calls cost an increment). A
    /// WRITE, READ or atomic needs no receive request, so nothing else notices a dead target:
    /// they went on "succeeding" into a dead process's memory, where real RC ends in
    /// RETRY_EXC_ERR. A dead owner is noticed within that many operations.
    /// Once seen dead, the owner stays dead for this view: the fast path (`post_fast`) may be
    /// the one that notices, and hands the WR to the general path, which must see it too.
    #[inline]
    pub(crate) fn owner_died(&self) -> bool {
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
    pub(crate) fn has_recv(&self) -> bool {
        match (&self.srq, &self.rq) {
            (Some(s), _) => s.ring.len() > 0,
            (None, Some(r)) => r.len() > 0,
            (None, None) => false,
        }
    }
}

#[cold]
#[inline(never)]
pub(crate) fn owner_gone(pid: u32) -> bool {
    !pid_alive(pid)
}

/// Kept out of line: it runs once per connection, and inlined it made the per-message
/// `dest` a full call with a large frame.
#[cold]
#[inline(never)]
pub(crate) fn resolve_dest(f: &Fabric, qpn: u32) -> Option<DestView> {
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
        let ring =
            f.recv_ring(s.rq_off.load(Ordering::Relaxed), s.rq_cap.load(Ordering::Relaxed) as usize, sge).ok()?;
        (Some(ring), None)
    };
    // A tag-matching SRQ's receives complete on the SRQ's CQ.
    let cqn = match srq.and_then(|s| s.tm) {
        Some(tm) => tm.cqn,
        None => s.recv_cqn.load(Ordering::Relaxed),
    };
    let cq = super::complete::cq_ring(f, cqn)?;
    let cq_channel = has_channel(f, cqn);
    let mq = if qp_type == QpType::Rc && rq.is_some() && !cq_channel { super::complete::cq_msgq(f, cqn) } else { None };
    let v = DestView {
        qpn,
        idx,
        slot: f.qp_slot_ref(idx),
        qp_type,
        pd: s.pd.load(Ordering::Relaxed),
        lid: s.lid.load(Ordering::Relaxed) as u16,
        pid: s.pid.load(Ordering::Relaxed),
        rq,
        srq,
        cq,
        cqn,
        cq_channel,
        mq,
        cq_head: std::cell::Cell::new(0),
        one_sided: std::cell::Cell::new(0),
        owner_dead: std::cell::Cell::new(false),
        solo: std::cell::Cell::new(recvq::Solo::Untried),
    };
    (s.qpn.load(Ordering::Acquire) == qpn).then_some(v)
}

/// The cached view of `qpn`, re-resolved when the cache is for another QP or the slot was
/// reused.
///
/// Returns a reference into the cache: the view is a few hundred bytes, and copying it out
/// for every message showed up in instruction profiles.
#[inline(always)]
pub(crate) fn dest<'a>(f: &Fabric, cache: &'a mut Option<DestView>, qpn: u32) -> Option<&'a DestView> {
    let hit = cache.as_ref().is_some_and(|d| d.qpn == qpn && d.slot.get().qpn.load(Ordering::Acquire) == qpn);
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
pub(crate) fn resolve_xrc(f: &Fabric, tgt: &DestView, srqn: u32) -> Option<DestView> {
    let xrcd = f.qp_slot(tgt.idx).xrcd.load(Ordering::Relaxed);
    let srq = srq_view(f, srqn)?;
    let ss = f.srq_slot(srq.idx);
    if xrcd == 0 || ss.xrcd.load(Ordering::Relaxed) != xrcd {
        return None;
    }
    let cqn = ss.cqn.load(Ordering::Relaxed);
    let cq = super::complete::cq_ring(f, cqn)?;
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
    v.mq = None;
    v.cq_head = std::cell::Cell::new(0);
    Some(v)
}

/// The cached view of XRC SRQ `srqn` behind `tgt` ([`resolve_xrc`]), re-resolved when the
/// cache is for another SRQ or target, or the SRQ's slot was reused.
#[inline]
pub(crate) fn xrc_dest<'a>(
    f: &Fabric,
    cache: &'a mut Option<DestView>,
    tgt: &DestView,
    srqn: u32,
) -> Option<&'a DestView> {
    let hit = cache.as_ref().is_some_and(|d| {
        d.qpn == tgt.qpn
            && d.srq.is_some_and(|s| s.srqn == srqn && f.srq_slot(s.idx).srqn.load(Ordering::Acquire) == srqn)
    });
    if !hit {
        *cache = resolve_xrc(f, tgt, srqn);
    }
    cache.as_ref()
}

/// Checks an rkey for a remote operation on `d`; returns the MR on success.
pub(crate) fn remote_mr(f: &Fabric, d: &DestView, wr: &SendWr, need: AccessFlags) -> Option<super::mr::MrView> {
    let mr = mr_lookup(f, wr.rkey)?;
    let qp_access = AccessFlags::from_bits_truncate(f.qp_slot(d.idx).access.load(Ordering::Relaxed));
    (mr.pd == d.pd && mr.access.contains(need) && qp_access.contains(need)).then_some(mr)
}

pub(crate) fn take_recv(f: &Fabric, d: &DestView, rx: &mut RecvEntry) -> bool {
    match (&d.srq, &d.rq) {
        (Some(srq), _) => srq.take(f, rx),
        (None, Some(rq)) => recvq::pop(rq, rx),
        (None, None) => false,
    }
}

/// `SrqView::take_held` kept out of line: inlined into the fast path, the take made the RQ
/// case ~17 instructions dearer per message (callgrind), for register pressure and frame
/// size.
#[inline(never)]
pub(crate) fn srq_take_held(f: &Fabric, srq: &SrqView, rx: &mut RecvEntry) -> Option<u64> {
    srq.take_held(f, rx)
}

/// A send queue's cached view of the members of the multicast group it last sent to.
pub(crate) struct McastDests {
    pub(crate) grp: usize,
    pub(crate) gen: u32,
    pub(crate) dests: Vec<DestView>,
    pub(crate) scratch: Vec<u32>,
}

/// Marks an AH handle naming a multicast group; bits 16..24 hold the group's slot.
pub(crate) const AH_MCAST: u64 = 1 << 40;

/// Marks an AH handle issued by the shm provider.
pub(crate) const AH_VALID: u64 = 1 << 48;

/// Marks an AH whose attributes ask for a GRH.
pub(crate) const AH_GLOBAL: u64 = 1 << 32;

/// The global identifier of `lid` on fabric `fabric_id` (fe80::/64, fabric id, lid).
pub(crate) fn gid(fabric_id: u64, lid: u16) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[0] = 0xfe;
    g[1] = 0x80;
    g[8..14].copy_from_slice(&fabric_id.to_be_bytes()[2..8]);
    g[14..16].copy_from_slice(&lid.to_be_bytes());
    g
}

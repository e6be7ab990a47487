//! The completion stage: pushes a CQE into any CQ of the fabric (ours or a peer's, in any
//! process), with the overrun and the completion channel's notification that follow a push,
//! and resolves a CQ number to its ring (`cq_ring`) or its message queue (`cq_msgq`). Every
//! stage above it that completes a work request (execution, the drainer, the send queue,
//! flushes, tag matching) comes here; the CQ object (`cq.rs`, the owner's poll) sits on top
//! of the stack with the QP object. [`CqShared`] is the part of a CQ its producers hold.

use super::fabric::Fabric;
use super::layout::*;
use super::msgq::{MsgQueue, ALIGN};
use super::wire::CqRing;
use super::CtxInner;
use crate::verbs::{WcOpcode, WcStatus, WorkCompletion};
use crossbeam_utils::CachePadded;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

/// A CQE as it travels through the ring: a [`WorkCompletion`] plus the send-queue index it
/// retires (send completions only).
#[derive(Clone, Copy, Default)]
pub(crate) struct Cqe {
    pub wc: WorkCompletion,
    /// `Some(i)`: this completes send WQE `i` of `wc.qp_num`, retiring it and all before it.
    pub retire: Option<u32>,
    /// The message had IBV_SEND_SOLICITED (decides solicited-only notification; not stored).
    pub solicited: bool,
}

/// The part of a CQ that producers (QPs) hold.
pub(crate) struct CqShared {
    pub(crate) ctx: Arc<CtxInner>,
    pub(crate) idx: usize,
    pub(crate) cqn: u32,
    pub(crate) ring: CqRing,
    /// The ring's arena range, freed when the last holder drops.
    pub(crate) ring_off: u64,
    pub(crate) ring_len: u64,
    /// Whether the CQ has a completion channel (see [`has_channel`]).
    pub(crate) has_channel: bool,
    /// The CQ's message queue (`shm::drain`), and its arena range.
    pub(crate) mq: Option<MsgQueue>,
    pub(crate) mq_range: (u64, u64),
    /// Receive CQs whose message queues this CQ's QPs (as their send CQ) have sent into: an
    /// empty poll helps drain them now and then ([`HELP_EVERY`]), so that a sender's
    /// completions come even when its receiver does not poll. 0: a free entry.
    pub(crate) help: [AtomicU32; HELP_SLOTS],
    /// Keeps the completion channel alive while the CQ may signal it.
    pub(crate) _channel: Option<Arc<super::channel::ChannelInner>>,
    /// Polls of this CQ that returned completions (written by its one poller, `ShmCq::poll`,
    /// with a plain load and store). A QP whose receive CQ this is compares it at each post:
    /// unchanged means it received nothing since its previous post, the mark of a sender
    /// that streams rather than answers (`drain::Mode::Auto`). In its own line: the poller
    /// writes it, a poster on another thread may read it.
    pub(crate) polled: CachePadded<AtomicU64>,
}

impl Drop for CqShared {
    fn drop(&mut self) {
        let f = &self.ctx.fabric;
        let s = f.cq_slot(self.idx);
        // A wedged fabric (its lock held by a live stranger): leave the slot, do not hang.
        if let Ok(l) = f.lock() {
            if s.cqn.load(Ordering::Relaxed) == self.cqn {
                s.cqn.store(0, Ordering::Release);
            }
            drop(l);
        }
        f.free(self.ring_off, self.ring_len);
        if self.mq_range.1 != 0 {
            f.free(self.mq_range.0, self.mq_range.1);
        }
    }
}

/// Receive CQs a send CQ remembers for helping ([`CqShared::help`]). A sender whose CQ has
/// no free entry still sends through the queue; its completions then wait for the
/// receiver's poll, or for a later WQE of its own that waits for them (which helps).
pub(crate) const HELP_SLOTS: usize = 8;

/// Empty polls of a send CQ between two helping drains: rare enough that a busy receiver
/// never sees a helper contend for its queue's lock, often enough that a lone thread polling
/// its send CQ (single-threaded loopback code) gets its completion within microseconds.
pub(crate) const HELP_EVERY: u32 = 64;

impl CqShared {
    pub(crate) fn fabric(&self) -> &Fabric {
        &self.ctx.fabric
    }

    /// Remembers receive CQ `cqn`'s queue as one this CQ's polls help drain (cold: once per
    /// QP and destination).
    #[cold]
    pub(crate) fn add_help(&self, cqn: u32) {
        if self.help.iter().any(|h| h.load(Ordering::Relaxed) == cqn) {
            return;
        }
        for h in &self.help {
            if h.compare_exchange(0, cqn, Ordering::Relaxed, Ordering::Relaxed).is_ok() {
                return;
            }
        }
    }
}

/// Pushes a CQE into the CQ `cqn` of the fabric (any process). A full CQ is an overrun: the CQ
/// enters error and its owner gets `IBV_EVENT_CQ_ERR`.
///
/// Inlined so that callers building the CQE write its fields straight into the ring cell;
/// notification and overrun are out of line.
///
/// `head_seen` is the producer's cached view of the CQ's consumer position
/// ([`Ring::push_tracked`]): a QP keeps one per CQ it completes into; a one-off producer
/// (flush, tag-matching ops) passes a fresh 0, which costs one read of the head.
#[inline]
pub(crate) fn push_cqe(f: &Fabric, ring: &CqRing, head_seen: &mut u64, cqn: u32, cqe: &Cqe) {
    push_cqe_to(f, ring, head_seen, cqn, has_channel(f, cqn), cqe);
}

/// Pushes the error completion `status` of receive request `wr_id` of QP `qpn` into CQ
/// `cqn`'s `ring` (a flushed or failed receive: no length, no immediate). One builder for
/// the paths that fail receive requests outside a delivery (queue flush, a run's rest).
pub(crate) fn push_recv_status(
    f: &Fabric,
    ring: &CqRing,
    head_seen: &mut u64,
    cqn: u32,
    qpn: u32,
    wr_id: u64,
    status: WcStatus,
) {
    let wc = WorkCompletion { wr_id, status, opcode: WcOpcode::Recv, qp_num: qpn, ..Default::default() };
    push_cqe(f, ring, head_seen, cqn, &Cqe { wc, retire: None, solicited: false });
}

/// Whether CQ `cqn` has a completion channel. Fixed from its creation (set before the CQ
/// number is published, never changed while the CQ exists), so producers that hold a CQ for
/// long (a QP's send CQ, a sender's cached destination) look it up once.
pub(crate) fn has_channel(f: &Fabric, cqn: u32) -> bool {
    let idx = key_index(cqn, CQ_IDX_BITS);
    idx < MAX_CQ && f.cq_slot(idx).chan_off.load(Ordering::Relaxed) != 0
}

/// [`push_cqe`] with the CQ's [`has_channel`] known to the caller.
#[inline(always)]
pub(crate) fn push_cqe_to(f: &Fabric, ring: &CqRing, head_seen: &mut u64, cqn: u32, channel: bool, cqe: &Cqe) {
    let pushed = ring.push(head_seen, &cqe.wc, cqe.retire);
    after_push(f, cqn, channel, pushed, cqe.solicited || cqe.wc.status != WcStatus::Success);
}

/// What follows a push into CQ `cqn` (`channel`: it has a completion channel): when the CQE
/// went in, the channel's notification if it is armed for it (`urgent`: the CQE is
/// solicited or an error, which also wakes a solicited-only arming); when the CQ was full,
/// its overrun. Only a CQ with a channel can signal: busy-polled CQs skip the fence in
/// `signal_if_armed`.
#[inline(always)]
pub(crate) fn after_push(f: &Fabric, cqn: u32, channel: bool, pushed: bool, urgent: bool) {
    if !pushed {
        overrun(f, cqn);
    } else if channel {
        signal_if_armed(f, cqn, urgent);
    }
}

/// [`push_cqe_to`] of a successful receive completion that carries its payload, read from
/// `src` (`CqRing::push_inline_recv`, whose contract `src` keeps); `solicited` as in [`Cqe`].
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn push_inline_recv_to(
    f: &Fabric,
    ring: &CqRing,
    head_seen: &mut u64,
    cqn: u32,
    channel: bool,
    wc: &WorkCompletion,
    dst_off: u64,
    src: *const u8,
    solicited: bool,
) {
    let pushed = ring.push_inline_recv(head_seen, wc, dst_off, src);
    after_push(f, cqn, channel, pushed, solicited);
}

/// After a push into a CQ with a channel: notifies it if armed for this CQE (`urgent`: the
/// CQE is solicited or an error, which also wakes a solicited-only arming).
#[inline(never)]
fn signal_if_armed(f: &Fabric, cqn: u32, urgent: bool) {
    let idx = key_index(cqn, CQ_IDX_BITS);
    if idx >= MAX_CQ {
        return;
    }
    // Pairs with the fence in `req_notify`: either the poller's re-poll sees this CQE or we
    // see its arming.
    std::sync::atomic::fence(Ordering::SeqCst);
    let s = f.cq_slot(idx);
    let armed = s.armed.load(Ordering::Relaxed);
    if armed != 0 && (armed == ARM_NEXT || urgent) {
        notify(f, s, cqn);
    }
}

/// A push found CQ `cqn` full: it enters error, and its owner gets the event once.
#[cold]
fn overrun(f: &Fabric, cqn: u32) {
    if let Some(s) = live_slot(f, cqn) {
        if s.overrun.swap(1, Ordering::AcqRel) == 0 {
            f.post_event(s.ctx.load(Ordering::Relaxed) as usize, super::EVENT_CQ_ERR, cqn);
        }
    }
}

/// Arming values of `CqSlot::armed`.
pub(crate) const ARM_NEXT: u32 = 1;
pub(crate) const ARM_SOLICITED: u32 = 2;

#[cold]
fn notify(f: &Fabric, s: &CqSlot, cqn: u32) {
    if s.armed.swap(0, Ordering::AcqRel) == 0 || s.cqn.load(Ordering::Acquire) != cqn {
        return;
    }
    if let Some(ch) = super::channel::ChannelView::attach(f, s.chan_off.load(Ordering::Relaxed)) {
        ch.signal(cqn);
    }
}

/// The slot of CQ `cqn` if that CQ is live now (index in range, slot holding this very
/// number, read with Acquire so the slot's other fields published before it are visible).
/// Callers that go on to read offsets re-check `cqn` afterwards: the CQ may be destroyed
/// and its slot reused in between.
pub(crate) fn live_slot(f: &Fabric, cqn: u32) -> Option<&CqSlot> {
    let idx = key_index(cqn, CQ_IDX_BITS);
    if idx >= MAX_CQ {
        return None;
    }
    let s = f.cq_slot(idx);
    (s.cqn.load(Ordering::Acquire) == cqn).then_some(s)
}

/// Resolves CQ `cqn` to a ring view (for pushing completions of a remote QP).
pub(crate) fn cq_ring(f: &Fabric, cqn: u32) -> Option<CqRing> {
    let s = live_slot(f, cqn)?;
    let (off, cap) = (s.ring_off.load(Ordering::Relaxed), s.cap.load(Ordering::Relaxed));
    let r = CqRing::new(f.ring(off, cap as usize, CQE_STRIDE).ok()?)?;
    (s.cqn.load(Ordering::Acquire) == cqn).then_some(r)
}

/// Largest queue a CQ slot may name: a corrupt `mq_cells` must not make a huge view.
const MAX_CELLS: u32 = 1 << 20;

/// The message queue of CQ `cqn`, if it has one.
pub(crate) fn cq_msgq(f: &Fabric, cqn: u32) -> Option<MsgQueue> {
    let s = live_slot(f, cqn)?;
    let (off, cells) = (s.mq_off.load(Ordering::Relaxed), s.mq_cells.load(Ordering::Relaxed));
    if off == 0 || !cells.is_power_of_two() || !(2..=MAX_CELLS).contains(&cells) {
        return None;
    }
    let p = f.ptr(off, MsgQueue::bytes(cells as usize) as u64)?;
    if p as usize % ALIGN != 0 {
        return None;
    }
    // SAFETY: `Fabric::ptr` checked that the range lies inside the mapped arena, which stays
    // mapped while the fabric (held by every caller's context) lives; it is aligned (checked)
    // and the CQ's creator initialised a queue of `cells` cells there before publishing the
    // CQ number (a peer that scribbled the slot can only make us read arena bytes as cells,
    // which the queue's masked indexing keeps inside the range).
    let q = unsafe { MsgQueue::attach(p, cells as usize) };
    (s.cqn.load(Ordering::Acquire) == cqn).then_some(q)
}

//! The completion queue object: an MPSC ring in the fabric (any sender, local or in another
//! process, pushes CQEs into it through the completion stage, `complete.rs`) that its owner
//! creates, polls (draining its message queue too, `drain.rs`), arms and destroys. It sits
//! on top of the stack beside the QP object.

use super::complete::{cq_msgq, cq_ring, CqShared, ARM_NEXT, ARM_SOLICITED, HELP_EVERY, HELP_SLOTS};
use super::drain::{self, DrainCache, Got};
use super::fabric::Fabric;
use super::layout::*;
use super::msgq::{self, MsgQueue};
use super::ring::Ring;
use super::wire::CqRing;
use super::CtxInner;
use crate::verbs::{Errno, Error, Result, WorkCompletion};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// A completion queue of the `shm` provider.
pub struct ShmCq {
    pub(crate) shared: Arc<CqShared>,
    /// The drainer's cache for this CQ's message queue.
    pub(crate) drain: DrainCache,
    /// Empty polls since the last helping drain ([`HELP_EVERY`]).
    empty_polls: u32,
    /// Each helped queue's `head` as the last check saw it ([`ShmCq::help_drain`]).
    help_seen: [u64; HELP_SLOTS],
}

impl ShmCq {
    pub(crate) fn create(ctx: &Arc<CtxInner>, cqe: u32) -> Result<ShmCq> {
        Self::create_with(ctx, cqe, None, true)
    }

    /// A CQ of at least `cqe` entries, notifying `channel`; `queue`: with the message queue
    /// of receiver-side delivery (when `drain::Mode` has one and there is no channel), else
    /// without it, so that every SEND completing here is delivered by its sender
    /// (`Context::create_cq_sender_side`).
    pub(crate) fn create_with(
        ctx: &Arc<CtxInner>,
        cqe: u32,
        channel: Option<&super::channel::ShmCompChannel>,
        queue: bool,
    ) -> Result<ShmCq> {
        let max = ctx.caps.max_cqe;
        if cqe == 0 || cqe > max {
            return Err(Error::new(Errno::EINVAL, format!("CQ size {cqe} must be 1..={max}")));
        }
        let f = &ctx.fabric;
        let cap = cqe.next_power_of_two() as usize;
        let ring_len = Ring::bytes(cap, CQE_STRIDE) as u64;
        let ring_off = f.alloc(ring_len)?;
        // (`CqRing::new` accepts every CQE_STRIDE ring: asserted in wire.rs.)
        let made = f.init_ring(ring_off, cap, CQE_STRIDE).and_then(|r| {
            CqRing::new(r).ok_or_else(|| Error::new(Errno::EINVAL, "CQE_STRIDE cells cannot hold a CQE"))
        });
        let ring = match made {
            Ok(r) => r,
            Err(e) => {
                f.free(ring_off, ring_len);
                return Err(e);
            }
        };
        // A message queue for receiver-side delivery (`drain::Mode`; not with a channel, whose
        // waiters would have to drain it). As many cells as the CQ has entries.
        let mq_range = if queue && drain::mode() != drain::Mode::Off && channel.is_none() {
            let len = MsgQueue::bytes(cap.max(2)) as u64;
            match f.alloc(len) {
                Ok(off) => (off, len),
                Err(e) => {
                    f.free(ring_off, ring_len);
                    return Err(e);
                }
            }
        } else {
            (0, 0)
        };
        // The allocator's words are shared (a corrupt peer can make it hand out anything), so
        // the range is checked against the mapping before the queue is written there.
        let mq_ptr = f.ptr(mq_range.0, mq_range.1).filter(|p| mq_range.1 != 0 && *p as usize % msgq::ALIGN == 0);
        if mq_range.1 != 0 && mq_ptr.is_none() {
            f.free(ring_off, ring_len);
            return Err(Error::new(Errno::ENOMEM, "the fabric's allocator gave a range outside its arena"));
        }
        let mq = mq_ptr.map(|p| {
            // SAFETY: `ptr` checked that `len` bytes at `p` lie inside the mapping, and `p` is
            // aligned to ALIGN (checked); nobody else sees them until the CQ number is
            // published below; the mapping lives while the fabric does, and the CQ keeps it.
            unsafe { MsgQueue::init(p, cap.max(2)) }
        });
        let free_all = |f: &Fabric| {
            f.free(ring_off, ring_len);
            if mq_range.1 != 0 {
                f.free(mq_range.0, mq_range.1);
            }
        };
        let l = match f.lock() {
            Ok(l) => l,
            Err(e) => {
                free_all(f);
                return Err(e);
            }
        };
        let claimed = f.claim_slot(
            MAX_CQ,
            |i| {
                let s = f.cq_slot(i);
                (&s.cqn, &s.gen, s.pid.load(Ordering::Relaxed))
            },
            "CQ",
        );
        let (idx, gen) = match claimed {
            Ok(v) => v,
            Err(e) => {
                drop(l);
                free_all(f);
                return Err(e);
            }
        };
        let cqn = make_key(gen, idx, CQ_IDX_BITS);
        let s = f.cq_slot(idx);
        s.ctx.store(ctx.idx as u32, Ordering::Relaxed);
        s.pid.store(f.pid(), Ordering::Relaxed);
        s.cap.store(cap as u32, Ordering::Relaxed);
        s.ring_off.store(ring_off, Ordering::Relaxed);
        s.overrun.store(0, Ordering::Relaxed);
        s.armed.store(0, Ordering::Relaxed);
        s.chan_off.store(channel.map_or(0, |c| c.inner.off), Ordering::Relaxed);
        s.mq_off.store(mq_range.0, Ordering::Relaxed);
        s.mq_cells.store(if mq.is_some() { cap.max(2) as u32 } else { 0 }, Ordering::Relaxed);
        s.cqn.store(cqn, Ordering::Release);
        drop(l);
        Ok(ShmCq {
            shared: Arc::new(CqShared {
                ctx: ctx.clone(),
                idx,
                cqn,
                ring,
                ring_off,
                ring_len,
                has_channel: channel.is_some(),
                mq,
                mq_range,
                help: Default::default(),
                _channel: channel.map(|c| c.inner.clone()),
                polled: Default::default(),
            }),
            drain: DrainCache::default(),
            empty_polls: 0,
            help_seen: [u64::MAX; HELP_SLOTS],
        })
    }

    /// The CQ number.
    pub fn cqn(&self) -> u32 {
        self.shared.cqn
    }

    /// Completions waiting to be polled.
    pub fn len(&self) -> usize {
        self.shared.ring.ring().len() as usize
    }

    /// Whether no completion is waiting.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Pops CQEs from `sh`'s ring into `wc[n..]`; returns the new count.
#[inline(always)]
fn pop_ring(sh: &CqShared, wc: &mut [WorkCompletion], mut n: usize) -> usize {
    let f = sh.fabric();
    while let Some(out) = wc.get_mut(n) {
        let Some(retire) = sh.ring.pop(out, |off, src, n| super::place::place_inline(f, off, src, n)) else {
            break;
        };
        if let Some(i) = retire {
            f.retire_send(out.qp_num, i);
        }
        n += 1;
    }
    n
}

impl ShmCq {
    /// Helps drain the queues in [`CqShared::help`] whose receiver is away: a message waits
    /// at a `head` that has not moved since the last check, [`HELP_EVERY`] empty polls ago.
    /// A receiver that drains is left alone (a helper taking its lock would move the lock's
    /// and the messages' lines to this core and back: in a ping-pong that cost more than
    /// the whole message). A stale entry, whose CQ is gone, resolves to nothing.
    #[cold]
    #[inline(never)]
    fn help_drain(&mut self) {
        let sh = &*self.shared;
        let f = sh.fabric();
        for (h, seen) in sh.help.iter().zip(&mut self.help_seen) {
            let cqn = h.load(Ordering::Relaxed);
            let Some(q) = (cqn != 0).then(|| cq_msgq(f, cqn)).flatten() else { continue };
            let head = q.acked();
            if head == *seen {
                drain::help(f, &q, cqn);
            }
            *seen = q.acked();
        }
    }

    /// The owner's drain of its message queue, straight into `wc[*n..]`, under the drain
    /// lock `dr`. Returns true when a queued message was completed into the ring by the
    /// general delivery (the caller pops the ring again before going on, so completions keep
    /// the queue's order), false when the queue is empty or `wc` full.
    ///
    /// The lock is taken per poll that finds the queue ready (one CAS) and released at the
    /// poll's end. Keeping it across polls would save that CAS, but a lock kept by a CQ its
    /// thread no longer polls stops every helper, and single-threaded code that polls B's
    /// receive CQ once and then only A's send CQ would wait forever (docs/shm-provider.md,
    /// "Receiver-side delivery").
    #[inline(never)]
    fn drain_into(&mut self, dr: &mut msgq::Drain, wc: &mut [WorkCompletion], n: &mut usize) -> bool {
        let sh = &*self.shared;
        let f = sh.fabric();
        while *n < wc.len() {
            let Some(m) = dr.poll() else {
                if self.drain.holds_run() {
                    // Only a scribbled queue (`DrainCache::abandon_run`).
                    self.drain.abandon_run(f);
                    return true;
                }
                return false;
            };
            // Each message of a run takes one completion (`Got::Wc`), so `room` keeps the run
            // within `wc`.
            match drain::take(f, sh.cqn, &mut self.drain, dr, wc.len() - *n, m, &mut wc[*n]) {
                Got::Wc => *n += 1,
                Got::Ring => {
                    if self.drain.holds_run() {
                        self.finish_run_in_ring(dr);
                    }
                    return true;
                }
            }
        }
        false
    }

    /// A message of a held run went to the ring (the general delivery): the rest of the run
    /// goes there too, after it, so this QP's receive completions stay in order (the poll
    /// returns the ring's before any later message's).
    #[cold]
    #[inline(never)]
    fn finish_run_in_ring(&mut self, dr: &mut msgq::Drain) {
        let sh = &*self.shared;
        let f = sh.fabric();
        // The CQ being polled has its ring; were it missing, the run would still be consumed.
        // The run's messages were written before it was claimed (`Drain::peek_run`).
        drain::take_into_ring(f, sh.cqn, &mut self.drain, dr, cq_ring(f, sh.cqn).as_ref(), true);
    }

    /// `poll`'s result for `n` completions: an empty poll's checks, or the count of polls
    /// that found something.
    #[inline(always)]
    fn polled(&mut self, n: usize) -> Result<usize> {
        if n == 0 {
            return self.poll_empty();
        }
        // This poll is the counter's only writer (`&mut self`): no locked instruction.
        let polled = &self.shared.polled;
        polled.store(polled.load(Ordering::Relaxed).wrapping_add(1), Ordering::Relaxed);
        Ok(n)
    }

    /// The rest of `poll` when the message queue has a message: under its drain lock, the
    /// ring again (a helper may have pushed queued messages into it: its order comes first),
    /// then the queue, then the ring again whenever a queued message was completed into it.
    /// Out of line, so that a poll the ring alone answers saves no registers for it.
    #[inline(never)]
    fn poll_queue(&mut self, wc: &mut [WorkCompletion], mut n: usize) -> Result<usize> {
        let Some(q) = self.shared.mq else { return self.polled(n) };
        let Some(mut d) = q.try_drain() else { return self.polled(n) };
        loop {
            n = pop_ring(&self.shared, wc, n);
            if n == wc.len() || !self.drain_into(&mut d, wc, &mut n) {
                break;
            }
        }
        drop(d);
        self.polled(n)
    }

    /// A poll that found nothing: now and then it helps drain the queues this CQ's QPs
    /// sent into ([`ShmCq::help_drain`]; what it delivers, the next poll finds), and it
    /// reports an overrun.
    #[inline(never)]
    fn poll_empty(&mut self) -> Result<usize> {
        if self.shared.help[0].load(Ordering::Relaxed) != 0 {
            self.empty_polls = self.empty_polls.wrapping_add(1);
            if self.empty_polls % HELP_EVERY == 0 {
                self.help_drain();
            }
        }
        let sh = &*self.shared;
        if sh.fabric().cq_slot(sh.idx).overrun.load(Ordering::Relaxed) != 0 {
            return Err(Error::new(
                Errno::EIO,
                format!("CQ {} overran (more completions than entries) and is in error", sh.cqn),
            ));
        }
        Ok(0)
    }
}

impl crate::provider::Cq for ShmCq {
    #[inline]
    fn poll(&mut self, wc: &mut [WorkCompletion]) -> Result<usize> {
        super::retry::progress_waiting();
        // The ring first; the message queue (`poll_queue`, out of line) only when it has a
        // message and `wc` has room.
        let n = pop_ring(&self.shared, wc, 0);
        if n < wc.len() && self.shared.mq.as_ref().is_some_and(|q| q.ready()) {
            return self.poll_queue(wc, n);
        }
        self.polled(n)
    }

    /// Inlined into the caller's loop: with nothing in the ring and nothing ready in the
    /// message queue (the two checks `poll`'s first pass makes, as cheaply), an empty poll
    /// is a few loads and `poll_empty`'s call instead of `poll`'s whole frame (a worker's
    /// idle loop 319 -> 247 instructions); a poll that finds something pays the check
    /// again in `poll` (~20 instructions). Measured with `tools/bench-ab`, 11 rounds: the echo
    /// pipeline's latency 0.957x and rate 1.047x; `dp-perf send_lat`, when `poll` itself
    /// worked this way, 1.014x (docs/benchmarks.md, session 39).
    #[inline]
    fn poll_busy(&mut self, wc: &mut [WorkCompletion]) -> Result<usize> {
        let sh = &*self.shared;
        if !sh.ring.has_next() && sh.mq.as_ref().is_none_or(|q| !q.ready()) {
            super::retry::progress_waiting();
            return self.poll_empty();
        }
        self.poll(wc)
    }

    fn depth(&self) -> u32 {
        self.shared.ring.ring().capacity() as u32
    }

    fn req_notify(&mut self, solicited_only: bool) -> Result<()> {
        let s = self.shared.fabric().cq_slot(self.shared.idx);
        s.armed.store(if solicited_only { ARM_SOLICITED } else { ARM_NEXT }, Ordering::Relaxed);
        // Pairs with the fence in `push_cqe` (see there).
        std::sync::atomic::fence(Ordering::SeqCst);
        Ok(())
    }
}

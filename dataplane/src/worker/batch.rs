//! The doorbell batcher: one reusable [`SendChain`] per QP, posted with one doorbell per loop
//! (or as soon as it holds `doorbell_batch` requests), with selective signaling.
//!
//! Every posted WR gets `wr_id` = its sequence number on the QP and its buffer is pushed on
//! the QP's in-flight ring. One WR in `signal_interval` is SIGNALED; when its completion is
//! polled, it and every earlier WR of the QP are done (verbs completes a QP's sends in order),
//! so their buffers go back to the pool.
//!
//! Sends of at most `max_inline` bytes carry the INLINE flag (the device copies the bytes at
//! post time instead of reading the buffer by DMA); their buffers still wait for the
//! completion, which keeps the accounting the same for both kinds. A UD QP's sends all go to
//! its one destination (`set_dest`).

use super::stats::{QpStats, WorkerCounters};
use crate::mem::{Buf, PoolCache};
use crate::provider::Qp;
use crate::verbs::{SendChain, SendFlags, SendWr, Sge, UdDest, WcStatus, WorkCompletion};
use std::collections::VecDeque;

/// Sends of one QP: the chain being gathered and the buffers in flight.
pub struct SendBatch<Q: Qp> {
    pub(crate) qp: Q,
    chain: SendChain,
    /// Buffers of posted WRs not yet known complete, oldest first, followed by the `pending`
    /// buffers of the chain being gathered: one ring, so a post moves no entry.
    bufs: VecDeque<Buf>,
    /// Entries at the back of `bufs` not yet posted (= WRs in `chain`).
    pending: usize,
    /// Bytes of the pending WRs.
    pending_bytes: u64,
    /// Length of the last SEND gathered (the size a warm pass runs dry: [`SendBatch::warm`]).
    last_len: u32,
    /// Pending WRs carrying `SIGNALED`.
    pending_signaled: u64,
    /// Sequence number + 1 of the newest WR carrying `SIGNALED` (pending or posted; 0: none).
    last_signaled: u64,
    /// Sequence number + 1 of the newest posted WR carrying `SIGNALED` (0: none).
    posted_signaled: u64,
    /// Sequence number of the next WR to post (= wr_id).
    next_seq: u64,
    /// Sequence number of the oldest WR in `bufs`.
    done_seq: u64,
    since_signal: u32,
    signal_interval: u32,
    batch: u32,
    depth: u32,
    lkey: u32,
    max_inline: u32,
    /// Destination of every send (UD); all zero on connected QPs, which ignore it.
    dest: UdDest,
    pub(crate) stats: QpStats,
}

impl<Q: Qp> SendBatch<Q> {
    /// A batcher for `qp` with a send queue of `depth`, posting at `batch` WRs and signaling
    /// one in `signal_interval`.
    pub fn new(qp: Q, depth: u32, batch: u32, signal_interval: u32, lkey: u32) -> SendBatch<Q> {
        let depth = depth.max(1);
        SendBatch {
            qp,
            chain: SendChain::with_capacity(depth as usize, depth as usize),
            bufs: VecDeque::with_capacity(depth as usize),
            pending: 0,
            pending_bytes: 0,
            last_len: 0,
            pending_signaled: 0,
            last_signaled: 0,
            posted_signaled: 0,
            next_seq: 0,
            done_seq: 0,
            since_signal: 0,
            signal_interval: signal_interval.clamp(1, depth),
            batch: batch.clamp(1, depth),
            depth,
            lkey,
            max_inline: 0,
            dest: UdDest::default(),
            stats: QpStats::new(),
        }
    }

    /// Sends of at most `bytes` go INLINE (0: none). At most the QP's `max_inline_data`.
    pub fn set_max_inline(&mut self, bytes: u32) {
        self.max_inline = bytes;
    }

    /// The destination of every later send (UD QPs).
    pub fn set_dest(&mut self, dest: UdDest) {
        self.dest = dest;
    }

    /// Free send-queue slots (not in flight and not gathered).
    #[inline]
    pub fn room(&self) -> usize {
        self.depth as usize - self.bufs.len()
    }

    /// Whether a posted SIGNALED WR has not completed yet: its completion is still to come
    /// on the send CQ. With none, a poll of the send CQ can only find error completions of
    /// unsignaled WRs (the worker then polls it less often, [`super::Worker::step`]).
    #[inline]
    pub fn awaits_completion(&self) -> bool {
        self.posted_signaled > self.done_seq
    }

    /// Buffers posted and not yet released.
    pub fn inflight(&self) -> usize {
        self.bufs.len() - self.pending
    }

    /// Adds a SEND of the `len` bytes at offset `off` of `buf` to the chain; posts the chain
    /// when it reaches the doorbell batch. The caller checked [`room`](Self::room); `false`
    /// (and the buffer back to the caller's responsibility) if there was none.
    #[inline]
    pub fn push(&mut self, buf: Buf, off: u32, len: u32, w: &WorkerCounters, cache: &mut PoolCache) -> bool {
        if self.room() == 0 {
            return false;
        }
        let seq = self.next_seq + self.pending as u64;
        self.since_signal += 1;
        let mut wr = SendWr::send(seq);
        wr.ud = self.dest;
        if self.since_signal >= self.signal_interval {
            wr = wr.signaled();
            self.since_signal = 0;
            self.pending_signaled += 1;
            self.last_signaled = seq + 1;
        }
        if len <= self.max_inline {
            wr.flags |= SendFlags::INLINE;
        }
        self.chain.push(wr, &[Sge::new(buf.addr() + u64::from(off), len, self.lkey)]);
        self.bufs.push_back(buf);
        self.pending += 1;
        self.pending_bytes += u64::from(len);
        self.last_len = len;
        if self.pending >= self.batch as usize {
            self.flush(w, cache);
        }
        true
    }

    /// A dry run of a SEND at `addr` of the length this QP last sent (0 before its first)
    /// ([`Qp::warm_send`]): the provider's post path runs as far as it can without posting,
    /// to keep its code and lines in this core's caches while the worker idles. Nothing when
    /// WRs are gathered (they are posted at the end of the loop). The WR is built the way
    /// [`push`](Self::push) builds one, in the chain's own storage (cleared after), so nothing
    /// allocates.
    #[cold]
    #[inline(never)]
    pub fn warm(&mut self, addr: u64) {
        if self.pending != 0 {
            return;
        }
        let len = self.last_len;
        let mut wr = SendWr::send(self.next_seq);
        wr.ud = self.dest;
        if len <= self.max_inline {
            wr.flags |= SendFlags::INLINE;
        }
        self.chain.push(wr, &[Sge::new(addr, len, self.lkey)]);
        self.qp.warm_send(&self.chain);
        self.chain.clear();
    }

    /// Posts the gathered chain with one doorbell. Buffers of trailing unsignaled WRs come
    /// back with the next signaled completion, or at teardown ([`release_all`](Self::release_all)).
    ///
    /// The worker calls this for every QP in every loop, most of them with nothing gathered:
    /// that check is inlined into the loop, the post is not (LLVM kept the whole function out
    /// of line, a call and its register saves per QP per idle loop).
    #[inline(always)]
    pub fn flush(&mut self, w: &WorkerCounters, cache: &mut PoolCache) {
        if self.pending != 0 {
            self.post_pending(w, cache);
        }
    }

    /// [`flush`](Self::flush) of a non-empty chain.
    #[inline(never)]
    fn post_pending(&mut self, w: &WorkerCounters, cache: &mut PoolCache) {
        let n = self.pending;
        let (bytes, signaled) = (self.pending_bytes, self.pending_signaled);
        self.pending = 0;
        self.pending_bytes = 0;
        self.pending_signaled = 0;
        match self.qp.post_send(&self.chain) {
            Ok(()) => {
                self.next_seq += n as u64;
                self.posted_signaled = self.last_signaled;
                self.stats.tx_msgs.add(n as u64);
                self.stats.tx_bytes.add(bytes);
                self.stats.doorbells.add(1);
                self.stats.signaled.add(signaled);
                w.tx_msgs.add(n as u64);
                w.tx_bytes.add(bytes);
                w.doorbells.add(1);
                w.batches.add(1);
            }
            Err(e) => {
                // Requests before bad_wr went out; the rest are returned to the pool.
                let ok = e.bad_wr.min(n);
                self.next_seq += ok as u64;
                // A signaled WR past bad_wr was not posted (its sequence number is reused):
                // count the last posted WR as the one awaited, which errs on polling more.
                self.last_signaled = self.last_signaled.min(self.next_seq);
                self.posted_signaled = self.last_signaled;
                let failed = (n - ok) as u64;
                for b in self.bufs.drain(self.bufs.len() - (n - ok)..) {
                    let _ = cache.put(b);
                }
                self.stats.errors.add(failed);
                w.errors.add(failed);
                if ok > 0 {
                    self.stats.doorbells.add(1);
                    w.doorbells.add(1);
                }
            }
        }
        self.chain.clear();
    }

    /// Handles a send completion of this QP: releases the buffers of it and every earlier WR
    /// to `cache`.
    #[inline]
    pub fn complete(&mut self, wc: &WorkCompletion, w: &WorkerCounters, cache: &mut PoolCache) {
        self.complete_into(wc, w, cache, |_| 0);
    }

    /// [`complete`](Self::complete) that first offers the released buffers to `keep`, which
    /// returns how many of each slice it took, from its start (the worker's receive refill:
    /// [`super::srq::RecvBuffers::keep_spares`]); the rest go to `cache`.
    #[inline]
    pub fn complete_into(
        &mut self,
        wc: &WorkCompletion,
        w: &WorkerCounters,
        cache: &mut PoolCache,
        mut keep: impl FnMut(&[Buf]) -> usize,
    ) {
        match wc.status {
            WcStatus::Success | WcStatus::WrFlushErr => {}
            WcStatus::RnrRetryExcErr => {
                self.stats.rnr.add(1);
                w.rnr.add(1);
            }
            _ => {
                self.stats.errors.add(1);
                w.errors.add(1);
            }
        }
        if wc.wr_id < self.done_seq || wc.wr_id >= self.next_seq {
            return; // not one of ours (or already released): ignore
        }
        // The buffers of WRs done_seq..=wr_id, the oldest held, go back in one `put_many`
        // per slice of the deque (the cache's count is then published once per completion,
        // not per buffer).
        let k = ((wc.wr_id - self.done_seq + 1) as usize).min(self.bufs.len());
        let (front, back) = self.bufs.as_slices();
        let (front, back) =
            if k <= front.len() { (&front[..k], &back[..0]) } else { (front, &back[..k - front.len()]) };
        let kept = keep(front);
        let _ = cache.put_many(&front[kept..]);
        let kept = keep(back);
        let _ = cache.put_many(&back[kept..]);
        self.bufs.drain(..k);
        self.done_seq = wc.wr_id + 1;
    }

    /// Returns every buffer still held (after the QP was moved to ERROR and its CQ drained:
    /// remaining WRs completed unsignaled).
    pub fn release_all(&mut self, cache: &mut PoolCache) {
        for b in self.bufs.drain(..) {
            let _ = cache.put(b);
        }
        self.pending = 0;
        self.pending_bytes = 0;
        self.pending_signaled = 0;
        self.done_seq = self.next_seq;
        self.chain.clear();
    }
}

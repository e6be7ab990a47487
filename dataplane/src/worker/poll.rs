//! One iteration of the busy-poll loop.

use super::srq::Level;
use super::stats::{LatencyBuckets, StageCounters};
use super::{StageSlot, Worker};
use crate::mem::{BufferPool, PoolCache};
use crate::pipeline::{Clock, Handler, LocalQueue, Msg, StageCx, Target};
use crate::provider::{Context, Cq, Provider, Qp};
use crate::verbs::{AsyncEventKind, WcStatus};
use std::cell::Cell;
use std::sync::atomic::Ordering;

/// Loops between checks of asynchronous events.
const EVENT_PERIOD: u64 = 256;

/// Loops between polls of the send CQ while no QP awaits a signaled completion. Such a
/// poll can only find the error completions of unsignaled WRs (a QP gone to ERROR); an
/// empty poll of the `shm` CQ reads words other cores write (the ring's next entry, the
/// message queue's state, the help and overrun words), the largest part of an idle loop, so
/// a worker waiting for its next receive skips it. Errors still show within this many loops
/// (a few microseconds), and a poll that found completions is followed by another in the
/// next loop, so a burst of flushed WRs is drained at the usual pace.
pub(crate) const SEND_CQ_IDLE_PERIOD: u64 = 64;

impl<P: Provider> Worker<P> {
    /// Runs one loop iteration: poll send completions (freeing buffers) while a signaled
    /// send awaits one (one loop in 64 otherwise), poll up to `poll_burst` receives (no more
    /// than every send queue can take), run the sources, hand messages to stages, post one
    /// chain per QP, refill the SRQ, count, idle if nothing happened. Returns whether it did
    /// any work.
    #[inline]
    pub fn step(&mut self) -> bool {
        let stats = &*self.stats;
        let mut work = 0usize;
        // The iteration's receive time, read lazily by the first stage that asks for it
        // (`StageCx::rx_time_ns`).
        let rx_ns = Cell::new(0u64);

        // 1. Send completions: release the buffers of completed WRs. Skipped while nothing
        // signaled is in flight, but for one loop in SEND_CQ_IDLE_PERIOD.
        let mut scq_found = false;
        // The address and length of a message received alone in step 3 (see step 6).
        let mut lone = None;
        if self.scq_awaited || self.loops % SEND_CQ_IDLE_PERIOD == 0 {
            let n = self.scq.poll_busy(&mut self.wc).unwrap_or_else(|_| {
                stats.errors.add(1);
                0
            });
            // Completed sends' buffers go straight to the next refills, as many as the SRQ
            // and the QPs' own receive queues miss, rather than through the pool.
            let missing = if n == 0 { 0 } else { self.srq.missing() + self.own_queues_missing() };
            let recv = &mut self.recv;
            for wc in &self.wc[..n] {
                if let Some(i) = self.qp_nums.iter().position(|&q| q == wc.qp_num) {
                    self.batches[i].complete_into(wc, stats, &mut self.cache, |b| recv.keep_spares(b, missing));
                }
            }
            work += n;
            scq_found = n > 0;
        }

        // 2. Room: a generated message yields at most one send per QP it can reach, so a
        // source emits no more than the smallest room among those QPs.
        let batches = &self.batches;
        let room_of = |qps: &[u16]| qps.iter().map(|&q| batches[q as usize].room()).min().unwrap_or(usize::MAX);

        // 3. Receives, handed straight to the stage bound to their QP (not through the local
        // queue: one push and pop per message saved). Receives are always drained (a sink must
        // never wait on a send queue, or two workers waiting on each other's RNR would
        // deadlock); what the stages send to a full QP waits in the local queue, whose free
        // space bounds the burst.
        let stopping = self.ctl.stop_sources.load(Ordering::Relaxed);
        let budget = if self.queue.is_empty() { self.empty_budget } else { self.receive_budget() };
        if budget > 0 {
            let n = self.rcq.poll_busy(&mut self.wc[..budget]).unwrap_or_else(|_| {
                stats.errors.add(1);
                0
            });
            let env = StageEnv { pool: &self.pool, clock: &self.clock, rx_ns: &rx_ns, stopping, max_len: self.max_msg };
            // Summed over the burst and added once: a counter update is a load and a store to
            // memory another process may map, not worth doing per message.
            let (mut rx_msgs, mut rx_bytes) = (0u64, 0u64);
            let (own_rqs, mut srq_taken) = (!self.rq_qps.is_empty(), 0u32);
            // The stage handling the current run of receives and its context, built once per
            // run rather than once per message (a burst usually feeds one stage).
            let (stages, cache, queue) = (&mut self.stages, &mut self.cache, &mut self.queue);
            let mut cur: Option<(u16, &mut dyn Handler, StageCx<'_>)> = None;
            for i in 0..n {
                let wc = self.wc[i];
                let Some(buf) = self.recv.take(wc.wr_id) else {
                    stats.errors.add(1);
                    continue;
                };
                let q = self.qp_nums.iter().position(|&q| q == wc.qp_num);
                // The queue the buffer left: the SRQ, or the QP's own (looked up only when
                // some QP has one).
                srq_taken += 1;
                if own_rqs {
                    if let Some(level) = q.and_then(|q| self.rq_levels[q].as_mut()) {
                        level.received();
                        srq_taken -= 1;
                        // Flushed: its QP is in ERROR, and refilling it would only feed the
                        // flush.
                        if wc.status == WcStatus::WrFlushErr {
                            level.stop();
                        }
                    }
                }
                let stage = q.and_then(|q| self.qp_stage[q]);
                // UD receives start with the 40-byte GRH area, which is not payload.
                let off = q.map_or(0, |q| self.qp_rx_off[q]);
                match (wc.status, q, stage) {
                    (WcStatus::Success, Some(q), Some(s))
                        if wc.byte_len <= self.max_msg && wc.byte_len >= u32::from(off) =>
                    {
                        let len = wc.byte_len - u32::from(off);
                        rx_msgs += 1;
                        rx_bytes += u64::from(len);
                        self.batches[q].stats.rx_msgs.add(1);
                        self.batches[q].stats.rx_bytes.add(u64::from(len));
                        let m = Msg { buf, off, len, qp: q as u16 };
                        if !matches!(cur, Some((c, ..)) if c == s) {
                            let StageSlot { handler, outputs, stats: counters, latency, .. } = &mut stages[s as usize];
                            let cx = env.cx(outputs, counters, latency.as_deref(), 0, cache, queue);
                            cur = Some((s, &mut **handler, cx));
                        }
                        let Some((_, handler, cx)) = &mut cur else { unreachable!("set above") };
                        cx.stats.msgs_in.add(1);
                        cx.stats.bytes_in.add(u64::from(len));
                        handler.on_message(m, cx);
                    }
                    (status, q, _) => {
                        if status != WcStatus::WrFlushErr {
                            stats.errors.add(1);
                            if let Some(q) = q {
                                self.batches[q].stats.errors.add(1);
                            }
                        }
                        // The context holds the cache: end it (a rare path).
                        cur = None;
                        let _ = cache.put(buf);
                    }
                }
            }
            stats.rx_msgs.add(rx_msgs);
            stats.rx_bytes.add(rx_bytes);
            self.srq.received(srq_taken);
            lone = (n == 1).then_some((self.wc[0].wr_id, self.wc[0].byte_len));
            work += n;
        }
        // Messages handed on below (some made by the sources) are a new burst.
        rx_ns.set(0);

        // 4. Sources.
        let env = StageEnv { pool: &self.pool, clock: &self.clock, rx_ns: &rx_ns, stopping, max_len: self.max_msg };
        for (s, qps, done) in &mut self.sources {
            // Stages handling receives above may also have used these QPs: count what waits
            // in the queue against the room.
            let room = room_of(qps).saturating_sub(self.queue.len());
            let st = &mut self.stages[*s as usize];
            let made = env.poll(st, room, &mut self.cache, &mut self.queue);
            if made == 0 && !*done && st.handler.done() {
                *done = true;
                self.ctl.sources_done.fetch_add(1, Ordering::Release);
            }
            work += made;
        }

        // 5. Hand messages on until the queue is empty (stage chains run in this loop) or only
        // messages for full send queues remain (they wait, in order, for the next loop).
        let mut deferred = 0;
        while deferred < self.queue.len() {
            let Some((t, m)) = self.queue.pop() else { break };
            match t {
                Target::Qp(q) => {
                    let b = &mut self.batches[q as usize];
                    if b.room() == 0 {
                        // Cannot fail: the entry was just popped.
                        let _ = self.queue.push(t, m);
                        deferred += 1;
                        continue;
                    }
                    b.push(m.buf, u32::from(m.off), m.len, stats, &mut self.cache);
                }
                Target::Stage(s) => {
                    // Received messages were counted by their first stage in step 3; a
                    // stage further down the chain counts what it is handed here.
                    let st = &mut self.stages[s as usize];
                    st.stats.msgs_in.add(1);
                    st.stats.bytes_in.add(m.len as u64);
                    env.on_message(st, m, &mut self.cache, &mut self.queue);
                }
            }
            deferred = 0;
        }

        // 6. One doorbell per QP with gathered sends; whether the next loop polls the send CQ
        // (a poll that found completions may have left more: poll again).
        let mut awaited = scq_found;
        for b in &mut self.batches {
            b.flush(stats, &mut self.cache);
            awaited |= b.awaits_completion();
        }
        self.scq_awaited = awaited;
        // The buffer the next receive lands in, warmed while the worker waits for it (after
        // the posts above: off the path from a receive to its reply). After a lone message
        // only: when receives come in bursts, the next one is likely being written already
        // (by the peer, for a payload past the CQE's), and a prefetch for writing would pull
        // its lines away mid-copy (1 KiB echo unpaced: -3% when done after every burst).
        if let Some((addr, len)) = lone {
            self.recv.prefetch_next(addr, len);
        }

        // 7. SRQ: refill below the watermark, or when its limit event fired; own receive
        // queues below theirs.
        self.loops += 1;
        if self.loops % EVENT_PERIOD == 0 {
            while let Some(ev) = self.ctx.poll_async_event() {
                if ev.kind == AsyncEventKind::SrqLimitReached {
                    self.ctl.note_srq_event(ev.element);
                }
            }
            if self.ctl.take_srq_event(self.srq.srq_num()) {
                stats.srq_limit_events.add(1);
                self.srq.on_limit_event();
            }
        }
        if self.srq.maybe_refill(&mut self.recv, &mut self.cache, stats) {
            work += 1;
        }
        if !self.rq_qps.is_empty() {
            work += self.refill_own_queues();
        }

        // 8. Count; idle if nothing happened. (`stats` again: `refill_own_queues` borrowed
        // the whole worker.)
        let stats = &*self.stats;
        stats.loops.add(1);
        if work > 0 {
            stats.busy_loops.add(1);
            self.idle.busy();
            true
        } else {
            stats.idle_loops.add(1);
            if self.idle.idle() {
                self.warm();
            }
            false
        }
    }
}

impl<P: Provider> Worker<P> {
    /// Receives one loop may take: no more than the completion array holds, nor than the
    /// local queue has room for if each fans out to every stage output.
    #[inline]
    pub(crate) fn receive_budget(&self) -> usize {
        self.wc.len().min(self.queue.free() / self.fan)
    }

    /// A warm pass (`keep_warm`): a dry run of a send on every QP ([`SendBatch::warm`]), of
    /// the size the QP last sent, from the first buffer of the pool (only its address is
    /// used: a dry run reads no payload).
    #[cold]
    #[inline(never)]
    fn warm(&mut self) {
        let addr = self.pool.base_addr();
        for b in &mut self.batches {
            b.warm(addr);
        }
    }

    /// Buffers the QPs' own receive queues miss (0 if none has one).
    #[inline]
    fn own_queues_missing(&self) -> usize {
        self.rq_qps.iter().filter_map(|&q| self.rq_levels[q as usize].as_ref()).map(Level::missing).sum()
    }

    /// Step 7 for the QPs with a receive queue of their own: each below its watermark or a
    /// top-up batch short is refilled through its QP (out of line: most workers have none).
    /// Returns the refills made.
    #[inline(never)]
    fn refill_own_queues(&mut self) -> usize {
        let stats = &*self.stats;
        let mut work = 0;
        for &q in &self.rq_qps {
            let Some(level) = self.rq_levels[q as usize].as_mut().filter(|l| l.due()) else { continue };
            let qp = &mut self.batches[q as usize].qp;
            let res = self
                .recv
                .refill(level, &mut self.cache, stats, |a, len, lkey, c| qp.post_recv_buffers(a, len, lkey, c));
            work += usize::from(res != Ok(0));
        }
        work
    }
}

/// What every stage of a worker sees in one loop; builds each handler call's [`StageCx`] (one
/// place, for received messages, messages between stages and sources alike).
struct StageEnv<'a> {
    pool: &'a BufferPool,
    clock: &'a Clock,
    rx_ns: &'a Cell<u64>,
    stopping: bool,
    max_len: u32,
}

impl<'a> StageEnv<'a> {
    /// The context of a stage with these outputs, counters and histogram over the worker's
    /// cache and queue (`room`: what a source may emit; 0 for a stage handling messages).
    #[inline]
    fn cx<'b>(
        &self,
        outputs: &'b [Target],
        stats: &'b StageCounters,
        latency: Option<&'b LatencyBuckets>,
        room: usize,
        cache: &'b mut PoolCache,
        queue: &'b mut LocalQueue,
    ) -> StageCx<'b>
    where
        'a: 'b,
    {
        StageCx {
            pool: self.pool,
            cache,
            queue,
            outputs,
            stats,
            latency,
            clock: self.clock,
            rx_ns: self.rx_ns,
            room,
            stopping: self.stopping,
            max_len: self.max_len,
        }
    }

    /// Calls `f` with stage `st`'s handler and its context.
    #[inline]
    fn run<R>(
        &self,
        st: &mut StageSlot,
        room: usize,
        cache: &mut PoolCache,
        queue: &mut LocalQueue,
        f: impl FnOnce(&mut dyn Handler, &mut StageCx<'_>) -> R,
    ) -> R {
        // The handler is borrowed mutably and the rest of the slot shared: split the borrow.
        let StageSlot { handler, outputs, stats, latency, .. } = st;
        let mut cx = self.cx(outputs, stats, latency.as_deref(), room, cache, queue);
        f(&mut **handler, &mut cx)
    }

    /// Hands `m` to stage `st`.
    #[inline]
    fn on_message(&self, st: &mut StageSlot, m: Msg, cache: &mut PoolCache, queue: &mut LocalQueue) {
        self.run(st, 0, cache, queue, |h, cx| h.on_message(m, cx));
    }

    /// Lets source `st` generate up to `room` messages; returns how many it made.
    #[inline]
    fn poll(&self, st: &mut StageSlot, room: usize, cache: &mut PoolCache, queue: &mut LocalQueue) -> usize {
        self.run(st, room, cache, queue, |h, cx| h.poll(cx))
    }
}

//! One iteration of the busy-poll loop.

use super::Worker;
use crate::pipeline::{Msg, StageCx, Target};
use crate::provider::{Context, Cq, Provider};
use crate::verbs::{AsyncEventKind, WcStatus};
use std::sync::atomic::Ordering;

/// Loops between checks of asynchronous events.
const EVENT_PERIOD: u64 = 256;

impl<P: Provider> Worker<P> {
    /// Runs one loop iteration: poll send completions (freeing buffers), poll up to
    /// `poll_burst` receives (no more than every send queue can take), run the sources, hand
    /// messages to stages, post one chain per QP, refill the SRQ, count, idle if nothing
    /// happened. Returns whether it did any work.
    #[inline]
    pub fn step(&mut self) -> bool {
        let stats = &*self.stats;
        let mut work = 0usize;

        // 1. Send completions: release the buffers of completed WRs.
        let n = self.scq.poll(&mut self.wc).unwrap_or_else(|_| {
            stats.errors.add(1);
            0
        });
        for wc in &self.wc[..n] {
            if let Some(i) = self.qp_nums.iter().position(|&q| q == wc.qp_num) {
                self.batches[i].complete(wc, stats, &mut self.cache);
            }
        }
        work += n;

        // 2. Room: a generated message yields at most one send per QP it can reach, so a
        // source emits no more than the smallest room among those QPs.
        let batches = &self.batches;
        let room_of = |qps: &[u16]| qps.iter().map(|&q| batches[q as usize].room()).min().unwrap_or(usize::MAX);

        // 3. Receives, handed to the stage bound to their QP.
        // Receives are always drained (a sink must never wait on a send queue, or two workers
        // waiting on each other's RNR would deadlock); messages whose QP is full wait in the
        // local queue, whose free space bounds the burst.
        let budget = self.wc.len().min(self.queue.free() / self.fan);
        if budget > 0 {
            let n = self.rcq.poll(&mut self.wc[..budget]).unwrap_or_else(|_| {
                stats.errors.add(1);
                0
            });
            for i in 0..n {
                let wc = self.wc[i];
                let Some(buf) = self.srq.take(wc.wr_id) else {
                    stats.errors.add(1);
                    continue;
                };
                let q = self.qp_nums.iter().position(|&q| q == wc.qp_num);
                let stage = q.and_then(|q| self.qp_stage[q]);
                // UD receives start with the 40-byte GRH area, which is not payload.
                let off = q.map_or(0, |q| self.qp_rx_off[q]);
                match (wc.status, q, stage) {
                    (WcStatus::Success, Some(q), Some(s))
                        if wc.byte_len <= self.max_msg && wc.byte_len >= u32::from(off) =>
                    {
                        let len = wc.byte_len - u32::from(off);
                        stats.rx_msgs.add(1);
                        stats.rx_bytes.add(len as u64);
                        self.batches[q].stats.rx_msgs.add(1);
                        self.batches[q].stats.rx_bytes.add(len as u64);
                        let st = &self.stages[s as usize];
                        st.stats.msgs_in.add(1);
                        st.stats.bytes_in.add(len as u64);
                        let m = Msg { buf, off, len, qp: q as u16 };
                        if let Err(m) = self.queue.push(Target::Stage(s), m) {
                            stats.dropped.add(1);
                            let _ = self.cache.put(m.buf);
                        }
                    }
                    (status, q, _) => {
                        if status != WcStatus::WrFlushErr {
                            stats.errors.add(1);
                            if let Some(q) = q {
                                self.batches[q].stats.errors.add(1);
                            }
                        }
                        let _ = self.cache.put(buf);
                    }
                }
            }
            work += n;
        }

        // 4. Sources.
        let stopping = self.ctl.stop_sources.load(Ordering::Relaxed);
        for (s, qps) in &self.sources {
            // Receives polled above may also use these QPs: count them against the room.
            let room = room_of(qps).saturating_sub(self.queue.len());
            let st = &mut self.stages[*s as usize];
            let mut cx = StageCx {
                pool: &self.pool,
                cache: &mut self.cache,
                queue: &mut self.queue,
                outputs: &st.outputs,
                stats: &st.stats,
                latency: st.latency.as_deref(),
                clock: &self.clock,
                room,
                stopping,
                max_len: self.max_msg,
            };
            work += st.handler.poll(&mut cx);
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
                    let st = &mut self.stages[s as usize];
                    if m.qp == u16::MAX {
                        st.stats.msgs_in.add(1);
                        st.stats.bytes_in.add(m.len as u64);
                    }
                    let mut cx = StageCx {
                        pool: &self.pool,
                        cache: &mut self.cache,
                        queue: &mut self.queue,
                        outputs: &st.outputs,
                        stats: &st.stats,
                        latency: st.latency.as_deref(),
                        clock: &self.clock,
                        room: 0,
                        stopping,
                        max_len: self.max_msg,
                    };
                    st.handler.on_message(m, &mut cx);
                }
            }
            deferred = 0;
        }

        // 6. One doorbell per QP with gathered sends.
        for b in &mut self.batches {
            b.flush(stats, &mut self.cache);
        }

        // 7. SRQ: refill below the watermark, or when its limit event fired.
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
        if self.srq.maybe_refill(&mut self.cache, stats) {
            work += 1;
        }

        // 8. Count; idle if nothing happened.
        stats.loops.add(1);
        if work > 0 {
            stats.busy_loops.add(1);
            self.idle.busy();
            true
        } else {
            stats.idle_loops.add(1);
            self.idle.idle();
            false
        }
    }
}

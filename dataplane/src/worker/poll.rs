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

        // 2. Room: each received or generated message yields at most one send per QP.
        let mut room = self.batches.iter().map(|b| b.room()).min().unwrap_or(usize::MAX);

        // 3. Receives, handed to the stage bound to their QP.
        let budget = room.min(self.wc.len());
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
                match (wc.status, q, stage) {
                    (WcStatus::Success, Some(q), Some(s)) if wc.byte_len <= self.max_msg => {
                        let len = wc.byte_len;
                        stats.rx_msgs.add(1);
                        stats.rx_bytes.add(len as u64);
                        self.batches[q].stats.rx_msgs.add(1);
                        self.batches[q].stats.rx_bytes.add(len as u64);
                        let st = &self.stages[s as usize];
                        st.stats.msgs_in.add(1);
                        st.stats.bytes_in.add(len as u64);
                        let m = Msg { buf, len, qp: q as u16 };
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
            room -= n;
            work += n;
        }

        // 4. Sources.
        let stopping = self.ctl.stop_sources.load(Ordering::Relaxed);
        for &s in &self.sources {
            let st = &mut self.stages[s as usize];
            let mut cx = StageCx {
                pool: &self.pool,
                cache: &mut self.cache,
                queue: &mut self.queue,
                outputs: &st.outputs,
                stats: &st.stats,
                clock: &self.clock,
                room,
                stopping,
                max_len: self.max_msg,
            };
            let made = st.handler.poll(&mut cx);
            room = room.saturating_sub(made);
            work += made;
        }

        // 5. Hand messages on until the queue is empty (stage chains run in this loop).
        while let Some((t, m)) = self.queue.pop() {
            match t {
                Target::Qp(q) => {
                    let (buf, len) = (m.buf, m.len);
                    if !self.batches[q as usize].push(buf, len, stats, &mut self.cache) {
                        stats.dropped.add(1);
                        let _ = self.cache.put(buf);
                    }
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
                        clock: &self.clock,
                        room,
                        stopping,
                        max_len: self.max_msg,
                    };
                    st.handler.on_message(m, &mut cx);
                }
            }
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

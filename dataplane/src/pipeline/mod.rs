//! Stages: the [`Handler`] trait for user code and the built-in handlers.
//!
//! A stage runs on one worker. The worker hands it each message that arrives on its input (a
//! QP's receive completion, or another stage of the same worker) together with a
//! [`StageCx`], through which the handler reads and writes the message bytes and sends the
//! message on (to one of its outputs, back on the QP it came from) or drops it. Messages are
//! pool buffers: passing one on moves the buffer (zero copy); nothing allocates.
//!
//! Message layout of the built-ins: bytes 0..8 the sequence number, 8..16 the send time in
//! nanoseconds since the pipeline's [`Clock`] base (little endian), the rest padding.

mod builtins;
pub mod histogram;

pub use builtins::{Echo, Fanout, Forward, Sequencer, Sink, Source, SourceLimits};
pub use histogram::LogLinearHistogram;

use crate::mem::{Buf, BufferPool, PoolCache};
use crate::worker::fifo::Fifo;
use crate::worker::stats::LatencyBuckets;
pub use crate::worker::stats::{StageCounters, StageStats};
use std::cell::Cell;

/// Offset of the sequence number in a message.
pub const SEQ_OFFSET: usize = 0;
/// Offset of the send timestamp in a message.
pub const TS_OFFSET: usize = 8;
/// Bytes of the built-ins' header (sequence number and timestamp).
pub const HEADER_LEN: usize = 16;

/// A shared time base: timestamps are nanoseconds since the clock was made, comparable across
/// workers of one process (clones share the base).
///
/// Read from the CPU's invariant time-stamp counter when it has one (`quanta`: calibrated
/// against CLOCK_MONOTONIC once per process, then `rdtsc` and a multiply-shift), and from
/// CLOCK_MONOTONIC through the vDSO otherwise. Each read waits for the loads before it
/// (`after_prior_loads`), as the vDSO's does: 18.8 ns a read on this VM against 23.5 ns for
/// `clock_gettime` (9.6 ns unordered, which made the echo pipeline's latency read ~17% low: a
/// sink's read ran ahead of the message's own bytes). The counter runs at the calibrated rate,
/// not NTP's: it may drift from CLOCK_MONOTONIC by a few parts per million (4-5 ppm measured
/// here over 500 ms), nothing for a latency and below what a pacing source or a run's
/// duration can notice.
#[derive(Debug, Clone)]
pub struct Clock {
    counter: quanta::Clock,
    base: u64,
}

impl Clock {
    /// A clock starting now (the first one of a process calibrates the counter: ~1 ms).
    pub fn new() -> Clock {
        let counter = quanta::Clock::new();
        let base = counter.raw();
        Clock { counter, base }
    }

    /// Nanoseconds since the base (0 for a read that, on another core, lands before it).
    #[inline]
    pub fn now_ns(&self) -> u64 {
        after_prior_loads();
        self.now_ns_unordered()
    }

    /// [`Clock::now_ns`] without the fence: the counter may be read before earlier loads
    /// complete, so the reading can be early by up to a cache miss. Half the cost (10 vs 19
    /// ns on the development VM, where a paced source reads the clock every loop): for
    /// pacing, and for a send time, which it can only make look earlier (a latency measured
    /// from it errs long, never short). Never for an arrival time.
    #[inline]
    pub fn now_ns_unordered(&self) -> u64 {
        self.counter.delta_as_nanos(self.base, self.counter.raw())
    }

    /// Busy-waits `ns` nanoseconds on the counter: no syscall, no yield, so a pinned thread
    /// spaces out its samples (a paced latency test, a profile's pause) without leaving the
    /// core. The loop reads unordered (pacing only) and has no PAUSE hint: a PAUSE costs up
    /// to ~140 cycles on recent Intel cores, which would make the wait end late by as much.
    #[inline]
    pub fn spin_for(&self, ns: u64) {
        let until = self.now_ns().saturating_add(ns);
        while self.now_ns_unordered() < until {}
    }
}

/// Holds the next counter read until every earlier load has completed, as the vDSO's
/// `clock_gettime` does (`rdtsc_ordered`). A bare `rdtsc` may execute before the loads ahead
/// of it: a sink's read, taken while the message's own bytes are still crossing cores, would
/// end the sample up to a cache miss early and under-report latency.
#[inline(always)]
fn after_prior_loads() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: LFENCE has no operands and no memory-safety precondition; the SSE2 feature it
    // needs is part of the x86_64 baseline.
    unsafe {
        std::arch::x86_64::_mm_lfence()
    };
}

/// Messages a source pacing itself to `rate` per second has due `elapsed_ns` after its first
/// (which is due at once); saturates at `u64::MAX`. The built-in `source` and the packet
/// apps' pcap replay pace with it.
#[inline]
pub fn due_at_rate(elapsed_ns: u64, rate: u64) -> u64 {
    // In 64 bits while the product fits (a source at 100k msg/s for 51 hours): a division
    // by a constant is then a multiply, where the 128-bit one is a call to `__udivti3`
    // between the source's clock read and its post (docs/benchmarks.md, session 32).
    let due = match elapsed_ns.checked_mul(rate) {
        Some(p) => p / 1_000_000_000,
        None => u64::try_from(u128::from(elapsed_ns) * u128::from(rate) / 1_000_000_000).unwrap_or(u64::MAX),
    };
    due.saturating_add(1)
}

/// When message `index` (0-based) of a source pacing itself to `rate` per second is due, in
/// nanoseconds after its first: the first elapsed time at which [`due_at_rate`] exceeds
/// `index` (`u64::MAX` if never).
#[inline]
pub fn due_time_ns(index: u64, rate: u64) -> u64 {
    if rate == 0 {
        return u64::MAX;
    }
    // In 64 bits while the product fits, as in `due_at_rate` (one `div`, no `__udivti3`).
    match index.checked_mul(1_000_000_000) {
        Some(p) => p.div_ceil(rate),
        None => u64::try_from((u128::from(index) * 1_000_000_000).div_ceil(u128::from(rate))).unwrap_or(u64::MAX),
    }
}

/// The schedule of a source pacing itself to `rate` messages per second (0: unpaced): how many
/// messages it may emit now. The built-in `source` and the packet apps' pcap replay use it.
/// Between due times a check is one comparison: the next message's [`due_time_ns`] is kept
/// with the count it was computed for, so the 128-bit divisions run only after messages went
/// out, not on every loop of an idle worker.
#[derive(Debug, Clone, Copy)]
pub struct Pacer {
    rate: u64,
    /// The message count `next_due_ns` belongs to.
    next: u64,
    next_due_ns: u64,
}

impl Pacer {
    /// A schedule of `rate` messages per second (0: unpaced), the first due at once.
    pub fn new(rate: u64) -> Pacer {
        Pacer { rate, next: 0, next_due_ns: 0 }
    }

    /// Messages that may go out `elapsed_ns` after the first was due, `done` having gone out:
    /// what [`due_at_rate`] has due beyond `done` (`u64::MAX` when unpaced).
    #[inline]
    pub fn allowed(&mut self, elapsed_ns: u64, done: u64) -> u64 {
        if self.rate == 0 {
            return u64::MAX;
        }
        if done != self.next {
            self.next = done;
            self.next_due_ns = due_time_ns(done, self.rate);
        }
        if elapsed_ns < self.next_due_ns {
            return 0;
        }
        due_at_rate(elapsed_ns, self.rate).saturating_sub(done)
    }
}

impl Default for Clock {
    fn default() -> Self {
        Clock::new()
    }
}

/// A message owned by a stage: a pool buffer, where its payload starts in it and the
/// payload's length. The payload starts at 0, except for messages received on a UD QP, whose
/// first 40 bytes hold the GRH area.
///
/// Not `Copy` or `Clone`: a handler must pass each message on exactly once (send, reply or
/// drop). A message forgotten by a handler is a leaked buffer, which shutdown reports.
#[derive(Debug)]
pub struct Msg {
    pub(crate) buf: Buf,
    /// Offset of the payload in the buffer.
    pub(crate) off: u16,
    pub(crate) len: u32,
    /// Index of the worker QP it arrived on (`u16::MAX`: made locally).
    pub(crate) qp: u16,
}

impl Msg {
    /// Payload length in bytes.
    pub fn len(&self) -> usize {
        self.len as usize
    }

    /// Whether the payload is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Index (in its worker) of the QP the message arrived on, if it arrived on one.
    pub fn input_qp(&self) -> Option<usize> {
        (self.qp != u16::MAX).then_some(self.qp as usize)
    }
}

/// Where a stage's output goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// Posted as a SEND on the worker's QP with this index.
    Qp(u16),
    /// Handed to the worker's stage with this index.
    Stage(u16),
}

/// What a handler reports at shutdown beyond its counters.
#[derive(Debug, Default, Clone)]
pub struct StageReport {
    /// Sequence numbers missing (sinks with `verify_sequence`).
    pub gaps: u64,
    /// Sequence numbers seen twice or out of order.
    pub duplicates: u64,
    /// Latencies in nanoseconds (sinks with a histogram).
    pub latency: Option<hdrhistogram::Histogram<u64>>,
    /// Anything else the stage wants in the summary, by name (e.g. a feed handler's book
    /// digest): printed after the stage table and as `"values"` in the JSON summary.
    pub values: Vec<(&'static str, u64)>,
}

/// The work queue of one worker: messages waiting to be posted to a QP or handled by a
/// stage. Fixed capacity, allocated once.
pub(crate) struct LocalQueue {
    q: Fifo<(Target, Msg)>,
}

impl LocalQueue {
    pub(crate) fn new(cap: usize) -> LocalQueue {
        LocalQueue { q: Fifo::new(cap) }
    }

    #[inline]
    pub(crate) fn push(&mut self, t: Target, m: Msg) -> Result<(), Msg> {
        self.q.push((t, m)).map_err(|(_, m)| m)
    }

    #[inline]
    pub(crate) fn free(&self) -> usize {
        self.q.free()
    }

    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.q.len() == 0
    }

    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.q.len()
    }

    #[inline]
    pub(crate) fn pop(&mut self) -> Option<(Target, Msg)> {
        self.q.pop()
    }
}

/// What a handler may do with messages while it runs.
pub struct StageCx<'a> {
    pub(crate) pool: &'a BufferPool,
    pub(crate) cache: &'a mut PoolCache,
    pub(crate) queue: &'a mut LocalQueue,
    pub(crate) outputs: &'a [Target],
    pub(crate) stats: &'a StageCounters,
    pub(crate) latency: Option<&'a LatencyBuckets>,
    pub(crate) clock: &'a Clock,
    /// The loop iteration's receive time, 0 until [`StageCx::rx_time_ns`] first reads it.
    pub(crate) rx_ns: &'a Cell<u64>,
    pub(crate) room: usize,
    pub(crate) stopping: bool,
    pub(crate) max_len: u32,
}

impl StageCx<'_> {
    /// The message's payload.
    #[inline]
    pub fn bytes(&self, m: &Msg) -> &[u8] {
        // SAFETY: the buffer is in the pool's mapped range and `len` fits in it (checked when
        // the message was made); this stage owns the buffer (it came out of a completion or
        // the cache), so no peer or DMA engine writes it until it is posted again; `off + len`
        // was checked against the buffer size when the message was made.
        unsafe { std::slice::from_raw_parts(self.pool.ptr_of(m.buf).add(m.off as usize), m.len as usize) }
    }

    /// The message's payload, writable.
    #[inline]
    pub fn bytes_mut(&mut self, m: &mut Msg) -> &mut [u8] {
        // SAFETY: as in `bytes`; `&mut Msg` makes this the only view of the buffer.
        unsafe { std::slice::from_raw_parts_mut(self.pool.ptr_of(m.buf).add(m.off as usize), m.len as usize) }
    }

    /// The largest message [`alloc`](Self::alloc) makes: the pool's buffer size.
    #[inline]
    pub fn max_len(&self) -> usize {
        self.max_len as usize
    }

    /// Number of outputs of this stage.
    pub fn outputs(&self) -> usize {
        self.outputs.len()
    }

    /// Sends `m` to output `i` (a QP or the next stage). A bad index drops the message.
    #[inline]
    pub fn send(&mut self, i: usize, m: Msg) {
        match self.outputs.get(i) {
            Some(&t) => self.to(t, m),
            None => self.drop_msg(m),
        }
    }

    /// Sends `m` back on the QP it arrived on (dropped if it was made locally).
    #[inline]
    pub fn reply(&mut self, m: Msg) {
        match m.input_qp() {
            Some(q) => self.to(Target::Qp(q as u16), m),
            None => self.drop_msg(m),
        }
    }

    #[inline]
    fn to(&mut self, t: Target, m: Msg) {
        let len = m.len as u64;
        match self.queue.push(t, m) {
            Ok(()) => {
                self.stats.msgs_out.add(1);
                self.stats.bytes_out.add(len);
            }
            Err(m) => self.drop_msg(m),
        }
    }

    /// Consumes `m`: its buffer goes back to the pool.
    #[inline]
    pub fn drop_msg(&mut self, m: Msg) {
        self.stats.dropped.add(1);
        let _ = self.cache.put(m.buf);
    }

    /// A new message of `len` bytes (at most the pool's buffer size), from the worker's pool
    /// cache; `None` when the pool is empty or `len` is too large.
    #[inline]
    pub fn alloc(&mut self, len: usize) -> Option<Msg> {
        if len > self.max_len as usize {
            return None;
        }
        let buf = self.cache.get()?;
        Some(Msg { buf, off: 0, len: len as u32, qp: u16::MAX })
    }

    /// Sets `m`'s payload length to `len` (shorter, or longer up to the end of its buffer:
    /// the bytes past the old length are whatever the buffer held). Returns `false`, leaving
    /// `m` unchanged, if `len` does not fit in the buffer. Lets a stage build a message of a
    /// size it learns while writing it, or rewrite one in place into a longer one.
    #[inline]
    pub fn set_len(&self, m: &mut Msg, len: usize) -> bool {
        if len > (self.max_len as usize).saturating_sub(m.off as usize) {
            return false;
        }
        m.len = len as u32;
        true
    }

    /// A copy of `m`'s payload at the start of a new buffer.
    #[inline]
    pub fn copy(&mut self, m: &Msg) -> Option<Msg> {
        let mut c = self.alloc(m.len())?;
        // SAFETY: both buffers are owned by this stage and distinct; `m.off + m.len` fits in
        // its buffer (checked when it was made) and `m.len` in the new one (`alloc`).
        unsafe {
            std::ptr::copy_nonoverlapping(self.pool.ptr_of(m.buf).add(m.off as usize), self.pool.ptr_of(c.buf), m.len())
        };
        c.qp = m.qp;
        Some(c)
    }

    /// Nanoseconds since the pipeline's clock base: a fresh (fenced) read of the clock, ~19
    /// ns on the development VM.
    #[inline]
    pub fn now_ns(&self) -> u64 {
        self.clock.now_ns()
    }

    /// [`Clock::now_ns_unordered`]: an unfenced read, ~10 ns, that may be early by up to a
    /// cache miss. For a source's pacing and send stamps; a receive time takes
    /// [`StageCx::now_ns`] or [`StageCx::rx_time_ns`].
    #[inline]
    pub fn now_ns_unordered(&self) -> u64 {
        self.clock.now_ns_unordered()
    }

    /// When the worker took in the burst of messages it is handing out, in nanoseconds since
    /// the clock base: the clock is read at the first call for a burst and every later call
    /// for it returns that reading. A loop iteration has two bursts: the messages received
    /// from the CQ, and those handed on between stages after the sources ran (so a message a
    /// source stamped is never stamped as received before it). A stage that timestamps arrivals
    /// (the sink's latency) reads the clock once per burst of receives instead of once per
    /// message; a message handled later in a burst is stamped with the burst's time, as a
    /// NIC stamps the packets of one poll. Use [`now_ns`](Self::now_ns) for the time an
    /// action happens (a send that must carry the current time).
    #[inline]
    pub fn rx_time_ns(&self) -> u64 {
        match self.rx_ns.get() {
            0 => {
                // 0 means "not read yet"; a reading of 0 (the base's own tick) is stored as 1.
                let t = self.clock.now_ns().max(1);
                self.rx_ns.set(t);
                t
            }
            t => t,
        }
    }

    /// Messages a source may emit in this loop without overflowing a send queue it reaches
    /// (0 for stages handling a message: their budget was applied when receiving).
    #[inline]
    pub fn room(&self) -> usize {
        self.room
    }

    /// Whether the pipeline is shutting down (sources stop generating).
    #[inline]
    pub fn stopping(&self) -> bool {
        self.stopping
    }

    /// The stage's counters.
    pub fn stats(&self) -> &StageCounters {
        self.stats
    }

    /// Records a latency in the stage's live histogram, if it has one (stages whose
    /// [`Handler::records_latency`] is true, when the pipeline exports live stats): one
    /// relaxed counter update, no allocation.
    #[inline]
    pub fn record_latency(&self, ns: u64) {
        if let Some(h) = self.latency {
            h.record(ns);
        }
    }
}

/// User code of a stage. Called on the worker's thread, in its busy loop: it must not
/// block, allocate or take locks.
pub trait Handler: Send {
    /// A message arrived on the stage's input.
    fn on_message(&mut self, msg: Msg, cx: &mut StageCx<'_>);

    /// Called once per worker loop for stages without input (sources): generate up to
    /// `cx.room()` messages; returns how many were generated.
    fn poll(&mut self, _cx: &mut StageCx<'_>) -> usize {
        0
    }

    /// Whether this stage generates messages on its own (then [`poll`](Self::poll) is called).
    fn is_source(&self) -> bool {
        false
    }

    /// For sources: whether the stage will generate nothing more (a count reached, a file
    /// replayed). Asked when [`poll`](Self::poll) made nothing; once every source of the
    /// pipeline is done and the traffic has settled, a run without a duration ends.
    fn done(&self) -> bool {
        false
    }

    /// Whether the handler sends messages back on the QP they arrived on
    /// ([`StageCx::reply`]); the worker then counts that QP in its back-pressure.
    fn replies(&self) -> bool {
        false
    }

    /// Whether the stage calls [`StageCx::record_latency`] (then an exporter gives it a live
    /// latency histogram).
    fn records_latency(&self) -> bool {
        false
    }

    /// Called once on the worker's thread before its loop starts: where a stage opens what a
    /// run needs and `check` must not touch (a capture file to write). An `Err` stops the
    /// pipeline before it runs, with the message. Off the hot path; may block and allocate.
    fn start(&mut self) -> Result<(), String> {
        Ok(())
    }

    /// Called once on the worker's thread when its loop has ended, before
    /// [`report`](Self::report): where a stage that buffers output (a capture file) writes
    /// the rest out. Off the hot path; may block.
    fn finish(&mut self) {}

    /// Called once at shutdown, off the hot path.
    fn report(&self) -> StageReport {
        StageReport::default()
    }
}

/// Reads the little-endian `u64` at `off` of `b` (0 if out of range).
#[inline]
pub fn read_u64(b: &[u8], off: usize) -> u64 {
    b.get(off..off + 8).map_or(0, |s| u64::from_le_bytes(s.try_into().unwrap_or([0; 8])))
}

/// Writes `v` little-endian at `off` of `b` (nothing if out of range).
#[inline]
pub fn write_u64(b: &mut [u8], off: usize, v: u64) {
    if let Some(s) = b.get_mut(off..off + 8) {
        s.copy_from_slice(&v.to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn pacing_counts_the_first_message_due_at_once_and_saturates() {
        use super::due_at_rate;
        assert_eq!(due_at_rate(0, 1000), 1);
        assert_eq!(due_at_rate(999_999, 1000), 1);
        assert_eq!(due_at_rate(1_000_000, 1000), 2);
        assert_eq!(due_at_rate(1_000_000_000, 1000), 1001);
        assert_eq!(due_at_rate(u64::MAX, u64::MAX), u64::MAX);
    }

    /// The 64-bit paths of `due_at_rate` and `due_time_ns` give what the 128-bit formulas
    /// give, on both sides of the products' overflow and at the extremes.
    #[test]
    fn pacing_in_64_bits_matches_the_128_bit_formulas() {
        use super::{due_at_rate, due_time_ns};
        let wide_due = |e: u64, r: u64| {
            u64::try_from(u128::from(e) * u128::from(r) / 1_000_000_000).unwrap_or(u64::MAX).saturating_add(1)
        };
        let wide_time =
            |i: u64, r: u64| u64::try_from((u128::from(i) * 1_000_000_000).div_ceil(u128::from(r))).unwrap_or(u64::MAX);
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let rates = [1u64, 3, 1000, 100_000, 999_999_937, 1_000_000_000, 3_000_000_000, u64::MAX];
        for &r in &rates {
            let edge = u64::MAX / r; // the largest elapsed time whose product fits
            for e in [0, 1, 999_999_999, 1_000_000_000, edge.saturating_sub(1), edge, edge.saturating_add(1), u64::MAX]
            {
                assert_eq!(due_at_rate(e, r), wide_due(e, r), "due_at_rate({e}, {r})");
            }
            let edge = u64::MAX / 1_000_000_000;
            for i in [0, 1, 2, 999, edge - 1, edge, edge + 1, u64::MAX] {
                assert_eq!(due_time_ns(i, r), wide_time(i, r), "due_time_ns({i}, {r})");
            }
        }
        for _ in 0..100_000 {
            let (e, r) = (next() >> (next() % 64), next() >> (next() % 64));
            assert_eq!(due_at_rate(e, r), wide_due(e, r), "due_at_rate({e}, {r})");
            if r != 0 {
                assert_eq!(due_time_ns(e, r), wide_time(e, r), "due_time_ns({e}, {r})");
            }
        }
    }

    /// `due_time_ns(i, r)` is the first elapsed time at which message `i` is due: at it,
    /// `due_at_rate` counts more than `i` messages, one nanosecond before it no more than `i`.
    #[test]
    fn a_message_is_due_exactly_at_its_due_time() {
        use super::{due_at_rate, due_time_ns};
        for rate in [1, 3, 7, 1000, 100_000, 999_999_937, 1_000_000_000, 3_000_000_000] {
            for i in [0u64, 1, 2, 3, 10, 999, 1_000_001, 123_456_789] {
                let t = due_time_ns(i, rate);
                if t == u64::MAX {
                    continue;
                }
                assert!(due_at_rate(t, rate) > i, "rate {rate}: message {i} not due at {t} ns");
                if t > 0 {
                    assert!(due_at_rate(t - 1, rate) <= i, "rate {rate}: message {i} already due at {} ns", t - 1);
                }
            }
        }
        assert_eq!(due_time_ns(0, 1000), 0);
        assert_eq!(due_time_ns(1, 1000), 1_000_000);
        assert_eq!(due_time_ns(u64::MAX, 1), u64::MAX);
        assert_eq!(due_time_ns(5, 0), u64::MAX);
    }

    /// A pacer allows exactly what `due_at_rate` has due beyond what went out, whether or not
    /// its cached due time is current; unpaced, everything.
    #[test]
    fn a_pacer_allows_what_is_due() {
        use super::{due_at_rate, Pacer};
        let rate = 1000;
        let mut p = Pacer::new(rate);
        let mut done = 0;
        for elapsed in (0..5_000_000u64).step_by(333_333) {
            let want = due_at_rate(elapsed, rate).saturating_sub(done);
            assert_eq!(p.allowed(elapsed, done), want, "{elapsed} ns, {done} out");
            done += want.min(2);
        }
        assert_eq!(p.allowed(0, 7), 0, "nothing due yet: message 7 is due at 7 ms");
        assert_eq!(Pacer::new(0).allowed(0, 1 << 40), u64::MAX);
    }
}

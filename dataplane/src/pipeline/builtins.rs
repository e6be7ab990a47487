//! The built-in handlers: echo, forward, fanout, sink, source, sequencer.

use super::LogLinearHistogram;
use super::{read_u64, write_u64, Handler, Msg, StageCx, StageReport, HEADER_LEN, SEQ_OFFSET, TS_OFFSET};

/// Sends every message back on the QP it came from.
#[derive(Debug, Default)]
pub struct Echo;

impl Handler for Echo {
    #[inline]
    fn on_message(&mut self, msg: Msg, cx: &mut StageCx<'_>) {
        cx.reply(msg);
    }

    fn replies(&self) -> bool {
        true
    }
}

/// Passes every message to output 0.
#[derive(Debug, Default)]
pub struct Forward;

impl Handler for Forward {
    #[inline]
    fn on_message(&mut self, msg: Msg, cx: &mut StageCx<'_>) {
        cx.send(0, msg);
    }
}

/// Copies every message to each output (the original goes to the last one).
#[derive(Debug, Default)]
pub struct Fanout;

impl Handler for Fanout {
    #[inline]
    fn on_message(&mut self, msg: Msg, cx: &mut StageCx<'_>) {
        let n = cx.outputs();
        for i in 0..n.saturating_sub(1) {
            match cx.copy(&msg) {
                Some(c) => cx.send(i, c),
                None => cx.stats().dropped.add(1),
            }
        }
        cx.send(n.saturating_sub(1), msg);
    }
}

/// Stamps every message with the next global sequence number and passes it to output 0.
#[derive(Debug, Default)]
pub struct Sequencer {
    next: u64,
}

impl Handler for Sequencer {
    #[inline]
    fn on_message(&mut self, mut msg: Msg, cx: &mut StageCx<'_>) {
        let seq = self.next;
        self.next += 1;
        write_u64(cx.bytes_mut(&mut msg), SEQ_OFFSET, seq);
        cx.send(0, msg);
    }
}

/// Consumes messages; checks sequence numbers and records latency from their timestamps to
/// their burst's receive time ([`StageCx::rx_time_ns`]: one clock read per burst, not per
/// message).
pub struct Sink {
    verify: bool,
    expected: u64,
    gaps: u64,
    duplicates: u64,
    hist: Option<LogLinearHistogram>,
}

impl Sink {
    /// A sink; `verify` checks sequence numbers, `histogram` records latencies (1 ns to 60 s,
    /// 3 significant digits, in a [`LogLinearHistogram`]: allocated here, never on the hot
    /// path).
    pub fn new(verify: bool, histogram: bool) -> Sink {
        let hist = histogram.then(|| LogLinearHistogram::new(60_000_000_000));
        Sink { verify, expected: 0, gaps: 0, duplicates: 0, hist }
    }
}

impl Handler for Sink {
    #[inline]
    fn on_message(&mut self, msg: Msg, cx: &mut StageCx<'_>) {
        let b = cx.bytes(&msg);
        if b.len() >= HEADER_LEN {
            let (seq, ts) = (read_u64(b, SEQ_OFFSET), read_u64(b, TS_OFFSET));
            if self.verify {
                if seq == self.expected {
                    self.expected += 1;
                } else if seq > self.expected {
                    self.gaps += seq - self.expected;
                    cx.stats().gaps.add(seq - self.expected);
                    self.expected = seq + 1;
                } else {
                    self.duplicates += 1;
                    cx.stats().duplicates.add(1);
                }
            }
            if let Some(h) = &mut self.hist {
                let lat = cx.rx_time_ns().saturating_sub(ts).max(1);
                // Values above the bound are clamped; recording never allocates.
                h.record(lat);
                cx.record_latency(lat);
            }
        }
        cx.drop_msg(msg);
    }

    fn records_latency(&self) -> bool {
        self.hist.is_some()
    }

    fn report(&self) -> StageReport {
        StageReport {
            gaps: self.gaps,
            duplicates: self.duplicates,
            latency: self.hist.as_ref().map(LogLinearHistogram::to_hdr),
            values: Vec::new(),
        }
    }
}

/// Limits of a source.
#[derive(Debug, Clone, Copy, Default)]
pub struct SourceLimits {
    /// Messages per second; 0 = as fast as the queues allow.
    pub rate: u64,
    /// Stop after this many messages; 0 = no limit.
    pub count: u64,
    /// Stop after this many nanoseconds; 0 = no limit.
    pub duration_ns: u64,
}

/// Generates sequence-numbered, timestamped messages of a fixed size to output 0.
pub struct Source {
    size: usize,
    limits: SourceLimits,
    start_ns: Option<u64>,
    sent: u64,
    pacer: super::Pacer,
    burst: usize,
    finished: bool,
}

impl Source {
    /// A source of `size`-byte messages (at least [`HEADER_LEN`]), at most `burst` per loop.
    pub fn new(size: usize, limits: SourceLimits, burst: usize) -> Source {
        Source {
            size: size.max(HEADER_LEN),
            limits,
            start_ns: None,
            sent: 0,
            pacer: super::Pacer::new(limits.rate),
            burst: burst.max(1),
            finished: false,
        }
    }

    /// Messages generated so far.
    pub fn sent(&self) -> u64 {
        self.sent
    }
}

impl Handler for Source {
    fn on_message(&mut self, msg: Msg, cx: &mut StageCx<'_>) {
        cx.drop_msg(msg);
    }

    fn is_source(&self) -> bool {
        true
    }

    fn done(&self) -> bool {
        self.finished
    }

    #[inline]
    fn poll(&mut self, cx: &mut StageCx<'_>) -> usize {
        if cx.stopping() {
            return 0;
        }
        // Read every loop while paced: the unfenced read (pacing, and a send stamp that can
        // only make the sink's latency err long).
        let now = cx.now_ns_unordered();
        let start = *self.start_ns.get_or_insert(now);
        let elapsed = now - start;
        let l = self.limits;
        if (l.duration_ns != 0 && elapsed >= l.duration_ns) || (l.count != 0 && self.sent >= l.count) {
            self.finished = true;
            return 0;
        }
        let allowed = self.pacer.allowed(elapsed, self.sent);
        if allowed == 0 {
            return 0;
        }
        let mut n = (cx.room().min(self.burst) as u64).min(allowed);
        if l.count != 0 {
            n = n.min(l.count - self.sent);
        }
        let mut made = 0;
        for _ in 0..n {
            let Some(mut m) = cx.alloc(self.size) else { break };
            let b = cx.bytes_mut(&mut m);
            write_u64(b, SEQ_OFFSET, self.sent);
            write_u64(b, TS_OFFSET, now);
            self.sent += 1;
            made += 1;
            cx.send(0, m);
        }
        // Counted once per call, not per message: a counter update is a load and a store to
        // memory another process may map.
        cx.stats().msgs_in.add(made as u64);
        cx.stats().bytes_in.add(made as u64 * self.size as u64);
        made
    }
}

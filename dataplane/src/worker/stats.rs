//! Per-worker and per-QP counters.
//!
//! Plain structs of relaxed atomics, each on its own cache line, written by one worker and
//! read by anyone (the runner's summary, later a shared-memory exporter). They hold no
//! pointer, so a later issue can place them in a shared-memory segment unchanged.

use crossbeam_utils::CachePadded;
use std::sync::atomic::{AtomicU64, Ordering};

/// A counter written by one thread and read by others.
#[derive(Debug, Default)]
#[repr(transparent)]
pub struct Counter(AtomicU64);

impl Counter {
    /// Adds `n` (single writer: a load and a store, no read-modify-write).
    #[inline]
    pub fn add(&self, n: u64) {
        // Relaxed: a statistic; the single writer owns the value.
        self.0.store(self.0.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
    }

    /// The current value (a snapshot).
    #[inline]
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Counters of one QP.
#[derive(Debug, Default)]
#[repr(C)]
pub struct QpCounters {
    /// Messages received on this QP.
    pub rx_msgs: Counter,
    /// Bytes received on this QP.
    pub rx_bytes: Counter,
    /// Messages sent on this QP.
    pub tx_msgs: Counter,
    /// Bytes sent on this QP.
    pub tx_bytes: Counter,
    /// Chains posted (one doorbell each).
    pub doorbells: Counter,
    /// Send WRs posted with `SIGNALED`.
    pub signaled: Counter,
    /// Completions with RNR retries exhausted.
    pub rnr: Counter,
    /// Error completions and failed posts.
    pub errors: Counter,
}

/// Padded per-QP counters.
pub type QpStats = CachePadded<QpCounters>;

/// Counters of one worker.
#[derive(Debug, Default)]
#[repr(C)]
pub struct WorkerCounters {
    /// Loop iterations.
    pub loops: Counter,
    /// Iterations that found work.
    pub busy_loops: Counter,
    /// Iterations that found nothing and ran the idle policy.
    pub idle_loops: Counter,
    /// Messages received (all QPs).
    pub rx_msgs: Counter,
    /// Bytes received (all QPs).
    pub rx_bytes: Counter,
    /// Messages sent (all QPs).
    pub tx_msgs: Counter,
    /// Bytes sent (all QPs).
    pub tx_bytes: Counter,
    /// Chains posted: doorbells rung (send side).
    pub doorbells: Counter,
    /// Send chains: same as doorbells for sends; kept apart for receive posts.
    pub batches: Counter,
    /// SRQ refills (one chained `post_srq_recv` each).
    pub srq_refills: Counter,
    /// Receive buffers posted by refills.
    pub srq_posted: Counter,
    /// SRQ limit events seen.
    pub srq_limit_events: Counter,
    /// Completions with RNR retries exhausted.
    pub rnr: Counter,
    /// Error completions, failed posts, messages dropped for lack of room or buffers.
    pub errors: Counter,
    /// Messages dropped because a queue or the pool was full.
    pub dropped: Counter,
}

/// Padded per-worker counters.
pub type WorkerStats = CachePadded<WorkerCounters>;

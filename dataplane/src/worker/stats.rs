//! Per-worker, per-QP and per-stage counters, the sinks' latency buckets, and where they live.
//!
//! Every counter block is a `#[repr(C)]` struct of [`Counter`]s (relaxed atomics, one writer:
//! the worker thread) holding no pointer, so the same block works on the heap or inside a
//! shared-memory segment that another process reads. A worker reaches each block through a
//! [`Slot`]: a pointer plus an owner keeping the memory alive. [`Slot::new`] puts the block on
//! the heap (cache-line padded); [`Slot::in_words`] puts it in caller-provided memory, e.g. the
//! live-stats segment of `dataplane run`. Either way a counter update is the same relaxed load
//! and store through one pointer.

use crate::pipeline::histogram::{log_linear_index, log_linear_lowest};
use crossbeam_utils::CachePadded;
use std::any::Any;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

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

    /// Raises the value to `v` if it is smaller (single writer).
    #[inline]
    pub fn max(&self, v: u64) {
        if v > self.0.load(Ordering::Relaxed) {
            self.0.store(v, Ordering::Relaxed);
        }
    }

    /// The current value (a snapshot).
    #[inline]
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }

    /// Overwrites the value (the single writer, e.g. when the block moves).
    #[inline]
    pub fn set(&self, v: u64) {
        self.0.store(v, Ordering::Relaxed);
    }
}

/// A block of counters that may live in shared memory.
///
/// # Safety
///
/// Implementors must be exactly [`WORDS`](Self::WORDS) [`Counter`]s laid out contiguously
/// (`#[repr(C)]`, no padding, no other field), so that any `WORDS` aligned, zero-initialised or
/// previously written `u64` words are a valid value of the type.
pub unsafe trait CounterBlock: Default + Send + Sync + 'static {
    /// Number of 8-byte counters in the block.
    const WORDS: usize;

    /// The block as a slice of counters.
    fn counters(&self) -> &[Counter] {
        // SAFETY: by the trait's contract `Self` is `WORDS` contiguous `Counter`s.
        unsafe { std::slice::from_raw_parts((self as *const Self).cast::<Counter>(), Self::WORDS) }
    }

    /// Copies every counter of `other` into `self` (setup only: moving a block).
    fn copy_from(&self, other: &Self) {
        for (a, b) in self.counters().iter().zip(other.counters()) {
            a.set(b.get());
        }
    }
}

/// Declares a counter block: the struct, its [`CounterBlock`] impl and `FIELDS`, the field
/// names in layout order (what the live-stats exporter and `dpctl` print).
macro_rules! counter_block {
    ($(#[$m:meta])* pub struct $name:ident { $($(#[$fm:meta])* $f:ident,)* }) => {
        $(#[$m])*
        #[derive(Debug, Default)]
        #[repr(C)]
        pub struct $name {
            $($(#[$fm])* pub $f: Counter,)*
        }

        impl $name {
            /// Field names, in layout order.
            pub const FIELDS: &'static [&'static str] = &[$(stringify!($f)),*];
        }

        // SAFETY: a `#[repr(C)]` struct whose fields are all `Counter` (a transparent
        // `AtomicU64`): FIELDS.len() contiguous 8-byte words, checked below.
        unsafe impl CounterBlock for $name {
            const WORDS: usize = $name::FIELDS.len();
        }

        const _: () = assert!(std::mem::size_of::<$name>() == 8 * $name::FIELDS.len());
    };
}

counter_block! {
    /// Counters of one QP.
    pub struct QpCounters {
        /// Messages received on this QP.
        rx_msgs,
        /// Bytes received on this QP.
        rx_bytes,
        /// Messages sent on this QP.
        tx_msgs,
        /// Bytes sent on this QP.
        tx_bytes,
        /// Chains posted (one doorbell each).
        doorbells,
        /// Send WRs posted with `SIGNALED`.
        signaled,
        /// Completions with RNR retries exhausted.
        rnr,
        /// Error completions and failed posts.
        errors,
    }
}

counter_block! {
    /// Counters of one worker.
    pub struct WorkerCounters {
        /// Loop iterations.
        loops,
        /// Iterations that found work.
        busy_loops,
        /// Iterations that found nothing and ran the idle policy.
        idle_loops,
        /// Messages received (all QPs).
        rx_msgs,
        /// Bytes received (all QPs).
        rx_bytes,
        /// Messages sent (all QPs).
        tx_msgs,
        /// Bytes sent (all QPs).
        tx_bytes,
        /// Chains posted: doorbells rung (send side).
        doorbells,
        /// Send chains: same as doorbells for sends; kept apart for receive posts.
        batches,
        /// Receive refills, one post call each: of the SRQ, and of the QPs' own receive
        /// queues (`use_srq = false`; the name is kept for the exported keys).
        srq_refills,
        /// Receive buffers posted by refills (SRQ and own queues alike).
        srq_posted,
        /// SRQ limit events seen.
        srq_limit_events,
        /// Completions with RNR retries exhausted.
        rnr,
        /// Error completions, failed posts, messages dropped for lack of room or buffers.
        errors,
        /// Messages dropped because a queue or the pool was full.
        dropped,
    }
}

counter_block! {
    /// Counters of one stage.
    pub struct StageCounters {
        /// Messages handed to the stage (or generated, for a source).
        msgs_in,
        /// Their bytes.
        bytes_in,
        /// Messages the stage passed on.
        msgs_out,
        /// Their bytes.
        bytes_out,
        /// Messages the stage dropped on purpose (sinks count consumed messages here).
        dropped,
        /// Sequence numbers missing, as the stage counts them (sinks with `verify_sequence`,
        /// feed handlers).
        gaps,
        /// Sequence numbers seen twice or out of order.
        duplicates,
    }
}

/// Sub-buckets per power of two of [`LatencyBuckets`] (as a power of two): 16, so a bucket
/// spans at most 1/16 = 6.25 % of its values.
pub const LATENCY_SUB_BITS: u32 = 4;
/// Values from 2^`LATENCY_MAX_BITS` on go to the last bucket (2^40 ns is about 18 minutes).
pub const LATENCY_MAX_BITS: u32 = 40;
/// Number of buckets of [`LatencyBuckets`].
pub const LATENCY_BUCKETS: usize = ((LATENCY_MAX_BITS - LATENCY_SUB_BITS + 1) << LATENCY_SUB_BITS) as usize;

/// A fixed log-linear latency histogram of relaxed counters, written by one stage (a sink)
/// and readable live: values below 16 have one bucket each, above that each power of two is
/// split in 16 equal buckets. Recording is a leading-zero count, two shifts and one counter
/// update (plus the maximum): no allocation, no branch on the histogram's state.
#[derive(Debug)]
#[repr(C)]
pub struct LatencyBuckets {
    /// The largest value recorded.
    pub max: Counter,
    /// Number of values per bucket ([`bucket_of`](Self::bucket_of)).
    pub buckets: [Counter; LATENCY_BUCKETS],
}

impl Default for LatencyBuckets {
    fn default() -> Self {
        LatencyBuckets { max: Counter::default(), buckets: std::array::from_fn(|_| Counter::default()) }
    }
}

// SAFETY: `#[repr(C)]` of one `Counter` and an array of `Counter`s: 1 + LATENCY_BUCKETS
// contiguous words, checked below.
unsafe impl CounterBlock for LatencyBuckets {
    const WORDS: usize = 1 + LATENCY_BUCKETS;
}

const _: () = assert!(std::mem::size_of::<LatencyBuckets>() == 8 * (1 + LATENCY_BUCKETS));

impl LatencyBuckets {
    /// The bucket of value `v`.
    #[inline]
    pub fn bucket_of(v: u64) -> usize {
        log_linear_index(v.min((1 << LATENCY_MAX_BITS) - 1), LATENCY_SUB_BITS)
    }

    /// The values of bucket `i`, inclusive (`lo`, `hi`).
    pub fn bucket_range(i: usize) -> (u64, u64) {
        (log_linear_lowest(i, LATENCY_SUB_BITS), log_linear_lowest(i + 1, LATENCY_SUB_BITS) - 1)
    }

    /// Records one value.
    #[inline]
    pub fn record(&self, v: u64) {
        self.buckets[Self::bucket_of(v)].add(1);
        self.max.max(v);
    }
}

/// Memory that holds counter blocks for as long as the value lives: the trait an exporter's
/// mapping implements so that [`Slot::in_words`] can place blocks in it.
///
/// # Safety
///
/// [`words`](Self::words) must return the same slice (same address and length) every time,
/// valid for as long as `self` lives, and that memory must only ever be accessed atomically
/// (by this process or any other).
pub unsafe trait StableWords: Send + Sync + 'static {
    /// The memory, as 8-byte words.
    fn words(&self) -> &[AtomicU64];
}

/// Where a counter block lives: a pointer to it and the owner that keeps its memory alive
/// (the heap allocation, or a shared-memory mapping). Dereferences to the block.
pub struct Slot<T: CounterBlock> {
    ptr: NonNull<T>,
    _owner: Arc<dyn Any + Send + Sync>,
}

impl<T: CounterBlock> Slot<T> {
    /// A zeroed block on the heap, alone on its cache line(s).
    pub fn new() -> Slot<T> {
        let owner = Arc::new(CachePadded::new(T::default()));
        let ptr = NonNull::from(&**owner);
        Slot { ptr, _owner: owner }
    }

    /// The block at word `word` of `owner`'s memory; `None` if it does not fit.
    pub fn in_words<O: StableWords>(owner: &Arc<O>, word: usize) -> Option<Slot<T>> {
        let words = owner.words();
        let end = word.checked_add(T::WORDS)?;
        let block = words.get(word..end)?;
        // `AtomicU64` has the alignment of `Counter`, hence of `T` (a struct of counters).
        let ptr = NonNull::from(&block[0]).cast::<T>();
        Some(Slot { ptr, _owner: owner.clone() })
    }
}

impl<T: CounterBlock> Default for Slot<T> {
    fn default() -> Self {
        Slot::new()
    }
}

impl<T: CounterBlock> Clone for Slot<T> {
    fn clone(&self) -> Self {
        Slot { ptr: self.ptr, _owner: self._owner.clone() }
    }
}

impl<T: CounterBlock> std::ops::Deref for Slot<T> {
    type Target = T;

    #[inline]
    fn deref(&self) -> &T {
        // SAFETY: `ptr` points at `T::WORDS` words inside memory that `_owner` keeps alive
        // and in place (a heap `Arc`, or a `StableWords` owner by its contract); any bit
        // pattern is a valid `T` (`CounterBlock`'s contract) and all access is atomic.
        unsafe { self.ptr.as_ref() }
    }
}

impl<T: CounterBlock + std::fmt::Debug> std::fmt::Debug for Slot<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        (**self).fmt(f)
    }
}

// SAFETY: the block is only accessed through atomics (`T: Sync`), and the owner is
// `Send + Sync`; the raw pointer is what makes the compiler unsure.
unsafe impl<T: CounterBlock> Send for Slot<T> {}
// SAFETY: as for `Send`.
unsafe impl<T: CounterBlock> Sync for Slot<T> {}

/// A worker's counters.
pub type WorkerStats = Slot<WorkerCounters>;
/// A QP's counters.
pub type QpStats = Slot<QpCounters>;
/// A stage's counters.
pub type StageStats = Slot<StageCounters>;

/// The counter blocks of one worker, by name: what an exporter needs to lay out its memory.
#[derive(Debug, Clone)]
pub struct StatsShape {
    /// Worker name.
    pub name: String,
    /// Pinned core.
    pub core: Option<usize>,
    /// QP names, in the worker's order.
    pub qps: Vec<String>,
    /// Stages, in the worker's order.
    pub stages: Vec<StageShape>,
}

/// One stage of a [`StatsShape`].
#[derive(Debug, Clone)]
pub struct StageShape {
    /// Stage name.
    pub name: String,
    /// Kind (`"sink"`, `"echo"`, ..., or a registered kind's name).
    pub kind: String,
    /// Whether the stage records latency (then it gets a [`LatencyBuckets`] block).
    pub latency: bool,
}

/// New homes for a worker's counter blocks, matching its [`StatsShape`]
/// (`Worker::move_stats`).
#[derive(Debug)]
pub struct WorkerSlots {
    /// The worker's counters.
    pub worker: Slot<WorkerCounters>,
    /// One per QP.
    pub qps: Vec<Slot<QpCounters>>,
    /// One per stage.
    pub stages: Vec<Slot<StageCounters>>,
    /// One per stage: `Some` for the stages whose shape says `latency`.
    pub latency: Vec<Option<Slot<LatencyBuckets>>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_contiguous_and_cover_their_values() {
        let mut next = 0u64;
        for i in 0..LATENCY_BUCKETS {
            let (lo, hi) = LatencyBuckets::bucket_range(i);
            assert_eq!(lo, next, "bucket {i} starts where {} ended", i.max(1) - 1);
            assert!(hi >= lo);
            assert_eq!(LatencyBuckets::bucket_of(lo), i);
            assert_eq!(LatencyBuckets::bucket_of(hi), i);
            if lo >= 16 {
                assert!((hi - lo + 1) * 16 <= lo, "bucket {i} [{lo}, {hi}] is wider than 1/16 of its values");
            }
            next = hi + 1;
        }
        assert_eq!(next, 1 << LATENCY_MAX_BITS);
        assert_eq!(LatencyBuckets::bucket_of(u64::MAX), LATENCY_BUCKETS - 1);
    }

    #[test]
    fn record_counts_and_keeps_the_max() {
        let h = LatencyBuckets::default();
        for v in [1, 1000, 1001, 5_000_000] {
            h.record(v);
        }
        assert_eq!(h.buckets.iter().map(Counter::get).sum::<u64>(), 4);
        assert_eq!(h.buckets[1].get(), 1);
        assert_eq!(h.buckets[LatencyBuckets::bucket_of(1000)].get(), 2);
        assert_eq!(h.max.get(), 5_000_000);
    }

    struct Words(Box<[AtomicU64]>);
    // SAFETY: a boxed slice never moves and lives as long as `self`; accessed atomically only.
    unsafe impl StableWords for Words {
        fn words(&self) -> &[AtomicU64] {
            &self.0
        }
    }

    #[test]
    fn a_slot_in_words_writes_those_words_and_refuses_to_overrun() {
        let mem = Arc::new(Words((0..20).map(|_| AtomicU64::new(0)).collect()));
        let s = Slot::<QpCounters>::in_words(&mem, 4).expect("fits");
        s.tx_msgs.add(7);
        assert_eq!(mem.0[4 + 2].load(Ordering::Relaxed), 7, "tx_msgs is the third word");
        assert!(Slot::<QpCounters>::in_words(&mem, 13).is_none(), "8 words from 13 overrun 20");
        assert!(Slot::<QpCounters>::in_words(&mem, usize::MAX).is_none());
        let heap = Slot::<QpCounters>::new();
        heap.tx_msgs.add(3);
        s.copy_from(&heap);
        assert_eq!(s.tx_msgs.get(), 3);
    }
}

//! Fixed-size buffer pools with per-worker caches.
//!
//! A [`BufferPool`] carves `count` buffers of `buf_size` bytes (rounded up to
//! [`CACHE_LINE`]) out of a memory range, usually a [`Region`](super::Region) that is also
//! registered as an MR, so a buffer goes straight into an [`Sge`]. Buffers are named by a
//! small `Copy` handle, [`Buf`]; the pool never dereferences the memory and never hands it out
//! as a Rust slice (peers and DMA engines may write it at any time, see
//! [`MemRegion`]).
//!
//! # Structure
//!
//! - The **shared free list** is a bounded multi-producer multi-consumer ring of `u32`
//!   indices after Dmitry Vyukov's design: every slot carries a sequence number that says
//!   whether it is ready to be written or read for a given lap, and the two positions are
//!   claimed with a compare-and-swap. Both sides claim a whole batch of contiguous slots with
//!   one CAS. The ring is sized to the next power of two `>= count` and can never overflow,
//!   because every index is in at most one place at a time (see *Double free* below). It
//!   allocates nothing after construction. As with Vyukov's queue (and DPDK's `rte_ring`), a
//!   thread preempted between claiming a slot and publishing it makes the other side wait at
//!   that slot: `get` then reports the slot as not yet available, `put` spins (and yields the
//!   CPU after a while) until the slot is released, so no buffer is ever dropped.
//! - A **[`PoolCache`]** is a per-worker stack of indices. `get`/`put` touch only the cache's
//!   own memory (plus the buffer's state word, below) until the stack runs empty or full;
//!   then it moves half its capacity from or to the ring in one batch. The most recently
//!   freed buffers, still warm in this core's cache, are handed out first. A cache is `Send`
//!   but not `Sync`; dropping it returns its buffers to the ring.
//! - **Accounting.** Every cache publishes how many buffers it holds through its own
//!   cache-line padded atomic, registered with the pool when the cache is created (the only
//!   lock, taken at creation, drop and by [`BufferPool::outstanding`]). So
//!   `available = in ring + in caches` and `outstanding = count - available`. Both are
//!   snapshots: exact when no thread is moving buffers, approximate (off by the buffers in
//!   flight) while they are.
//!
//! # Double free (always checked)
//!
//! Each buffer has a 32-bit state word: even while the buffer is free (in the ring or a
//! cache), odd while a user holds it. A [`Buf`] carries the state value it was handed out
//! with (its *tag*). Handing a buffer out is a plain relaxed load and store (the getter owns
//! the index exclusively, having popped it); returning it is **one compare-and-swap** from
//! the tag to tag + 1. Returning it twice, or returning a stale copy of the handle after the
//! buffer was freed and handed out again, fails that CAS and yields `EINVAL` "buffer N
//! returned twice" without touching the free list. Because the cost is a single atomic
//! operation on a word that normally only the owning core touches, the check is always on.
//! Limits: the tag wraps after 2^31 uses of one buffer, and a handle rebuilt with
//! [`BufferPool::index_of_addr`] takes the buffer's *current* tag, so it is valid only when
//! the caller really owns the buffer (as when mapping its own completion back).
//!
//! # Foreign buffers
//!
//! A [`Buf`] also carries its address; `put` checks the index is in range and the address is
//! this pool's address for that index, so a handle from another pool is `EINVAL`, never
//! memory corruption.

use crate::provider::MemRegion;
use crate::verbs::{Errno, Error, Result, Sge};
use crossbeam_utils::CachePadded;
use std::cell::Cell;
use std::fmt;
use std::marker::PhantomData;
use std::ptr::NonNull;
// Under `--cfg loom` (the model-checking build, docs/reliability.md) the ring's atomics are
// loom's, so `loom::model` explores every interleaving of the tests at the end of this file.
#[cfg(loom)]
use loom::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
#[cfg(not(loom))]
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// Buffer sizes are rounded up to this many bytes, and a pool's base must be aligned to it,
/// so every buffer starts on its own cache line.
pub const CACHE_LINE: usize = 64;

/// Indices moved to or from the ring per call by the pool-level batch operations (sized so
/// the staging array lives on the stack).
const CHUNK: usize = 64;

/// Spins on a slot held by a preempted thread before yielding the CPU.
#[cfg_attr(loom, allow(dead_code))] // loom builds always yield
const SPINS_BEFORE_YIELD: u32 = 128;

/// A handle to one buffer of a [`BufferPool`].
///
/// Only the pool creates handles. It holds the buffer's index, its address (as SGEs want it)
/// and the generation tag the double-free check uses; it is 16 bytes and `Copy`, but copying
/// it does not copy ownership: return each buffer once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Buf {
    addr: u64,
    index: u32,
    tag: u32,
}

impl Buf {
    /// The buffer's index in its pool, `0..count`.
    pub fn index(self) -> u32 {
        self.index
    }

    /// The buffer's start address, for an [`Sge`] or a work request id.
    pub fn addr(self) -> u64 {
        self.addr
    }

    /// The generation tag the handle was issued with (odd: a held buffer's).
    pub(crate) fn tag(self) -> u32 {
        self.tag
    }
}

/// Why [`Inner::release`] refused a handle (its error is built from this, out of line).
#[derive(Debug, Clone, Copy)]
enum Reject {
    /// The index is out of range, or the address is not this pool's for that index.
    Foreign,
    /// The handle's tag is even: it was issued for a free buffer.
    FreeHandle,
    /// The state word no longer holds the handle's tag: freed already (or since reissued).
    LostRace,
}

/// One ring slot: the lap-stamped sequence number and the index it carries.
///
/// For position `p` (which maps to slot `p & mask`), `seq == p` means the slot is free for
/// the producer of `p`; `seq == p + 1` means it holds the value for the consumer of `p`; the
/// consumer then sets `seq = p + capacity`, freeing it for the producer of the next lap.
struct Slot {
    seq: AtomicUsize,
    // An atomic only so the ring needs no `unsafe`: its accesses are relaxed (plain moves)
    // and ordered by `seq`.
    val: AtomicU32,
}

/// Bounded MPMC ring of buffer indices (Vyukov), with batch claims.
struct Ring {
    slots: Box<[Slot]>,
    mask: usize,
    /// Next position to read.
    head: CachePadded<AtomicUsize>,
    /// Next position to write.
    tail: CachePadded<AtomicUsize>,
}

impl Ring {
    /// A ring holding the indices `0..count`.
    fn new_full(count: u32) -> Ring {
        let count = count as usize;
        let cap = count.next_power_of_two();
        let slots = (0..cap)
            .map(|i| Slot {
                // Positions 0..count are published; the rest are free for their first lap.
                seq: AtomicUsize::new(if i < count { i + 1 } else { i }),
                val: AtomicU32::new(i as u32),
            })
            .collect();
        Ring {
            slots,
            mask: cap - 1,
            head: CachePadded::new(AtomicUsize::new(0)),
            tail: CachePadded::new(AtomicUsize::new(count)),
        }
    }

    fn slot(&self, pos: usize) -> &Slot {
        &self.slots[pos & self.mask]
    }

    /// Indices in the ring (a snapshot).
    fn len(&self) -> usize {
        // Relaxed: a statistic; no memory is accessed based on it.
        let head = self.head.load(Ordering::Relaxed);
        let tail = self.tail.load(Ordering::Relaxed);
        tail.wrapping_sub(head).min(self.slots.len())
    }

    /// Pops up to `out.len()` indices; returns how many. 0 means empty, or that the next
    /// index is still being published by a concurrent `push_many`.
    fn pop_many(&self, out: &mut [u32]) -> usize {
        if out.is_empty() {
            return 0;
        }
        // Relaxed: `head` is only a claim counter. The data is ordered by each slot's `seq`,
        // and a stale value is caught by the CAS below.
        let mut pos = self.head.load(Ordering::Relaxed);
        loop {
            // Count the contiguous slots published for positions pos, pos+1, ...
            let mut n = 0;
            let mut first_seq = 0;
            while n < out.len() {
                // Acquire: pairs with the producer's Release store of `seq`, so its store of
                // `val` is visible to the read below.
                let seq = self.slot(pos.wrapping_add(n)).seq.load(Ordering::Acquire);
                if seq != pos.wrapping_add(n).wrapping_add(1) {
                    if n == 0 {
                        first_seq = seq;
                    }
                    break;
                }
                n += 1;
            }
            if n == 0 {
                let diff = first_seq.wrapping_sub(pos.wrapping_add(1)) as isize;
                // Relaxed: as above.
                let now = self.head.load(Ordering::Relaxed);
                if diff < 0 && now == pos {
                    // The slot at `head` is not published: empty (or a put in progress).
                    return 0;
                }
                // Another consumer took `pos` already: retry from the current head.
                pos = now;
                continue;
            }
            // Relaxed on success and failure: the CAS only decides who owns positions
            // pos..pos+n. Nobody else can claim them once it succeeds, and their slots
            // cannot be reused before we release them below, so the values checked above are
            // still ours. (Positions are 64-bit and never wrap in practice, so no ABA.)
            match self.head.compare_exchange_weak(pos, pos.wrapping_add(n), Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => {
                    for (i, o) in out[..n].iter_mut().enumerate() {
                        let p = pos.wrapping_add(i);
                        let slot = self.slot(p);
                        // Relaxed: made visible by the Acquire load of `seq` above.
                        *o = slot.val.load(Ordering::Relaxed);
                        // Release: orders our read of `val` before the next producer (who
                        // acquires this `seq`) overwrites it.
                        slot.seq.store(p.wrapping_add(self.mask).wrapping_add(1), Ordering::Release);
                    }
                    return n;
                }
                Err(cur) => pos = cur,
            }
        }
    }

    /// Pushes every index in `vals`. Never fails: the ring can hold every index of the pool
    /// at once, and each index is in at most one place; at worst this waits for a preempted
    /// consumer to release a slot it has claimed.
    fn push_many(&self, vals: &[u32]) {
        let mut done = 0;
        let mut spins = 0u32;
        // Relaxed: claim counter only, as in `pop_many`.
        let mut pos = self.tail.load(Ordering::Relaxed);
        while done < vals.len() {
            let want = vals.len() - done;
            // Count the contiguous slots free for positions pos, pos+1, ...
            let mut n = 0;
            let mut first_seq = 0;
            while n < want {
                // Acquire: pairs with the previous consumer's Release store, so its read of
                // the old `val` happens before our overwrite.
                let seq = self.slot(pos.wrapping_add(n)).seq.load(Ordering::Acquire);
                if seq != pos.wrapping_add(n) {
                    if n == 0 {
                        first_seq = seq;
                    }
                    break;
                }
                n += 1;
            }
            if n == 0 {
                let diff = first_seq.wrapping_sub(pos) as isize;
                if diff < 0 {
                    // The slot still holds the previous lap's value: a consumer has claimed
                    // it but not released it yet (the ring cannot really be full). Wait.
                    spins += 1;
                    wait_for_slot(spins);
                }
                // Relaxed: as above.
                pos = self.tail.load(Ordering::Relaxed);
                continue;
            }
            // Relaxed: the CAS only decides ownership of positions pos..pos+n (see
            // `pop_many`); publication is by the Release stores of `seq` below.
            match self.tail.compare_exchange_weak(pos, pos.wrapping_add(n), Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => {
                    for (i, &v) in vals[done..done + n].iter().enumerate() {
                        let p = pos.wrapping_add(i);
                        let slot = self.slot(p);
                        // Relaxed: published by the Release store of `seq` just after.
                        slot.val.store(v, Ordering::Relaxed);
                        // Release: makes `val` visible to the consumer that acquires `seq`.
                        slot.seq.store(p.wrapping_add(1), Ordering::Release);
                    }
                    done += n;
                    pos = pos.wrapping_add(n);
                    spins = 0;
                }
                Err(cur) => pos = cur,
            }
        }
    }
}

/// One wait of `push_many` for a slot a preempted consumer still holds: spin a while, then
/// yield. (Under loom every wait yields, so the model checker can schedule the consumer.)
#[inline]
fn wait_for_slot(spins: u32) {
    #[cfg(loom)]
    {
        let _ = spins;
        loom::thread::yield_now();
    }
    #[cfg(not(loom))]
    if spins < SPINS_BEFORE_YIELD {
        std::hint::spin_loop();
    } else {
        std::thread::yield_now();
    }
}

/// A cache's published buffer count, on its own cache line.
type CacheCount = Arc<CachePadded<AtomicUsize>>;

struct Inner {
    /// Start of the first buffer (aligned to `CACHE_LINE`). Never dereferenced by the pool.
    base: NonNull<u8>,
    /// Bytes per buffer (a multiple of `CACHE_LINE`, at most `u32::MAX`).
    stride: usize,
    /// `log2(stride)` when the stride is a power of two (the usual 2 KiB, 4 KiB...): an
    /// address maps back to its index with a shift, not a division (20-40 cycles, once per
    /// received message in a worker).
    stride_shift: Option<u32>,
    count: u32,
    /// Offset of `base` in the backing region (0 for a raw range).
    region_offset: usize,
    /// Per-buffer state: even = free, odd = held by a user (see the module docs).
    states: Box<[AtomicU32]>,
    ring: Ring,
    /// Published counts of the live caches.
    caches: Mutex<Vec<CacheCount>>,
    /// Keeps the backing region mapped (`from_region`).
    _backing: Option<Box<dyn Send + Sync>>,
}

// SAFETY: `base` is only used for address arithmetic; the pool never reads or writes the
// memory. Everything else in `Inner` is `Send + Sync`. The constructors' contracts keep the
// range mapped for as long as any handle to `Inner` exists.
unsafe impl Send for Inner {}
// SAFETY: as above.
unsafe impl Sync for Inner {}

impl Inner {
    fn base_addr(&self) -> u64 {
        self.base.as_ptr() as u64
    }

    fn addr_of_index(&self, index: u32) -> u64 {
        self.base_addr() + index as u64 * self.stride as u64
    }

    /// Hands out `index`, which the caller has just popped and so owns exclusively.
    #[inline]
    fn acquire(&self, index: u32) -> Buf {
        let state = &self.states[index as usize];
        // Relaxed load and store, no RMW: only the owner of a free index moves it from even
        // to odd, and a concurrent `release` CAS (a double free of an older handle) expects
        // an odd value, so it fails whichever value it reads. The buffer's contents were
        // handed over by the ring (Acquire) or by this thread's own cache.
        let tag = state.load(Ordering::Relaxed).wrapping_add(1);
        debug_assert!(tag & 1 == 1, "free buffer {index} had an odd state");
        state.store(tag, Ordering::Relaxed);
        Buf { addr: self.addr_of_index(index), index, tag }
    }

    /// Checks `buf` and marks it free; returns its index, which the caller must then put in
    /// a cache or the ring.
    #[inline]
    fn release(&self, buf: Buf) -> Result<u32> {
        self.release_fast(buf).map_err(|why| self.rejected(buf, why))
    }

    /// [`release`](Self::release) with the reason for a refusal as a small code: the error
    /// (a formatted message) is built out of line by [`rejected`](Self::rejected), so a good
    /// `put` builds nothing for it. The sink's `put`, out of line before, is now inlined
    /// there at 30 instructions instead of 55 (callgrind, `profile_pipeline`, session 32).
    #[inline(always)]
    fn release_fast(&self, buf: Buf) -> std::result::Result<u32, Reject> {
        if buf.index >= self.count || buf.addr != self.addr_of_index(buf.index) {
            return Err(Reject::Foreign);
        }
        if buf.tag & 1 == 0 {
            return Err(Reject::FreeHandle);
        }
        // Relaxed: the CAS only has to be atomic, so that exactly one of several returns of
        // the same handle wins. Ownership of the buffer's memory passes to the next user
        // through the ring's Release/Acquire or through this thread's cache, not through the
        // state word.
        match self.states[buf.index as usize].compare_exchange(
            buf.tag,
            buf.tag.wrapping_add(1),
            Ordering::Relaxed,
            Ordering::Relaxed,
        ) {
            Ok(_) => Ok(buf.index),
            Err(_) => Err(Reject::LostRace),
        }
    }

    /// The error for a refused [`release`](Self::release).
    #[cold]
    #[inline(never)]
    fn rejected(&self, buf: Buf, why: Reject) -> Error {
        match why {
            Reject::Foreign => self.foreign(buf),
            Reject::FreeHandle => Error::new(
                Errno::EINVAL,
                format!("buffer {} returned twice (the handle is for a free buffer)", buf.index),
            ),
            Reject::LostRace => Error::new(
                Errno::EINVAL,
                format!(
                    "buffer {} returned twice (already free, or freed and handed out again \
                     since this handle was issued)",
                    buf.index
                ),
            ),
        }
    }

    #[cold]
    fn foreign(&self, buf: Buf) -> Error {
        Error::new(
            Errno::EINVAL,
            format!(
                "buffer {} at {:#x} does not belong to this pool ({} buffers of {} bytes at {:#x})",
                buf.index,
                buf.addr,
                self.count,
                self.stride,
                self.base_addr()
            ),
        )
    }

    fn caches(&self) -> MutexGuard<'_, Vec<CacheCount>> {
        // A panic while holding the lock cannot leave the Vec inconsistent (push/remove).
        self.caches.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Returns the valid buffers of `bufs` to the ring; reports the first invalid one.
    fn put_many_to_ring(&self, bufs: &[Buf]) -> Result<()> {
        let mut first_err = None;
        let mut stage = [0u32; CHUNK];
        let mut n = 0;
        for &b in bufs {
            match self.release(b) {
                Ok(i) => {
                    stage[n] = i;
                    n += 1;
                    if n == CHUNK {
                        self.ring.push_many(&stage);
                        n = 0;
                    }
                }
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        self.ring.push_many(&stage[..n]);
        first_err.map_or(Ok(()), Err)
    }
}

/// A pool of `count` fixed-size buffers; see the [module docs](self) for the design.
///
/// Cheap to clone: clones share the pool. The pool is `Send + Sync`; its own
/// [`get`](Self::get)/[`put`](Self::put) go straight to the shared ring, while a worker
/// should use a [`PoolCache`] from [`cache`](Self::cache).
#[derive(Clone)]
pub struct BufferPool {
    inner: Arc<Inner>,
}

impl BufferPool {
    /// Carves `count` buffers of `buf_size` bytes (rounded up to [`CACHE_LINE`]) from the
    /// `len` bytes at `base`. Every buffer starts free.
    ///
    /// Errors (`EINVAL`): a null or misaligned `base` (it must be aligned to
    /// [`CACHE_LINE`]), `buf_size` 0 or above `u32::MAX` once rounded (a buffer must fit one
    /// SGE), `count` 0 or above `u32::MAX`, or buffers that do not fit in `len` bytes.
    ///
    /// # Safety
    ///
    /// `base..base + len` must be memory mapped readable and writable in this process that
    /// stays mapped, and is not used for anything but these buffers, until this pool, every
    /// clone of it and every [`PoolCache`] of it are dropped. The pool itself never accesses
    /// the memory; the contract is what makes the pointers it hands out usable.
    pub unsafe fn new(base: *mut u8, len: usize, buf_size: usize, count: usize) -> Result<Self> {
        Self::build(base, len, buf_size, count, 0, None)
    }

    /// Carves `count` buffers of `buf_size` bytes (rounded up to [`CACHE_LINE`]) from
    /// `region`, starting `offset` bytes in. The pool keeps the region alive.
    ///
    /// Errors (`EINVAL`): `offset` past the end of the region or not making the first
    /// buffer [`CACHE_LINE`]-aligned, and the errors of [`BufferPool::new`].
    pub fn from_region<R: MemRegion + ?Sized + 'static>(
        region: Arc<R>,
        offset: usize,
        buf_size: usize,
        count: usize,
    ) -> Result<Self> {
        let len = region.len();
        if offset > len {
            return Err(Error::new(
                Errno::EINVAL,
                format!("buffer pool offset {offset} is past the end of the region ({len} bytes)"),
            ));
        }
        // Stays inside the mapping (offset <= len), so no wrapping happens.
        let base = region.as_ptr().wrapping_add(offset);
        // The region is moved into the pool, so it outlives every handle to the pool: that
        // is the contract of `new` for `base..base + len - offset`.
        Self::build(base, len - offset, buf_size, count, offset, Some(Box::new(region)))
    }

    fn build(
        base: *mut u8,
        len: usize,
        buf_size: usize,
        count: usize,
        region_offset: usize,
        backing: Option<Box<dyn Send + Sync>>,
    ) -> Result<Self> {
        let inval = |msg: String| Err(Error::new(Errno::EINVAL, msg));
        let Some(base) = NonNull::new(base) else {
            return inval("buffer pool base is null".into());
        };
        if base.as_ptr() as usize % CACHE_LINE != 0 {
            return inval(format!("buffer pool base {:p} is not aligned to {CACHE_LINE} bytes", base.as_ptr()));
        }
        if buf_size == 0 {
            return inval("buffer size must be > 0".into());
        }
        if count == 0 {
            return inval("buffer count must be > 0".into());
        }
        let Ok(count32) = u32::try_from(count) else {
            return inval(format!("buffer count {count} exceeds {}", u32::MAX));
        };
        let stride = match buf_size.checked_next_multiple_of(CACHE_LINE) {
            Some(s) if s <= u32::MAX as usize => s,
            _ => {
                return inval(format!(
                    "buffer size {buf_size} exceeds {} once rounded to {CACHE_LINE} bytes \
                     (a buffer must fit one SGE)",
                    u32::MAX
                ))
            }
        };
        match stride.checked_mul(count) {
            Some(need) if need <= len => {}
            need => {
                return inval(format!(
                    "{count} buffers of {stride} bytes ({buf_size} rounded up to \
                     {CACHE_LINE}) need {} bytes, the range has {len}",
                    need.map_or_else(|| "more than usize::MAX".into(), |n| n.to_string())
                ))
            }
        }
        let states = (0..count).map(|_| AtomicU32::new(0)).collect();
        Ok(BufferPool {
            inner: Arc::new(Inner {
                base,
                stride,
                stride_shift: stride.is_power_of_two().then(|| stride.trailing_zeros()),
                count: count32,
                region_offset,
                states,
                ring: Ring::new_full(count32),
                caches: Mutex::new(Vec::new()),
                _backing: backing,
            }),
        })
    }

    /// Number of buffers.
    pub fn count(&self) -> usize {
        self.inner.count as usize
    }

    /// Bytes per buffer: the requested size rounded up to [`CACHE_LINE`] (fits a `u32`).
    pub fn buf_size(&self) -> usize {
        self.inner.stride
    }

    /// Address of the first buffer.
    pub fn base_addr(&self) -> u64 {
        self.inner.base_addr()
    }

    /// Bytes the buffers span: `count * buf_size`.
    pub fn span(&self) -> usize {
        self.inner.stride * self.count()
    }

    /// Offset of the first buffer in the region given to [`from_region`](Self::from_region)
    /// (0 for [`new`](Self::new)): register `region_offset()..region_offset() + span()` to
    /// cover every buffer.
    pub fn region_offset(&self) -> usize {
        self.inner.region_offset
    }

    /// Address of `buf` (same as [`Buf::addr`]).
    pub fn addr_of(&self, buf: Buf) -> u64 {
        buf.addr
    }

    /// Offset of `buf` from the pool's first buffer.
    ///
    /// Panics if `buf`'s index is out of range for this pool.
    pub fn offset_of(&self, buf: Buf) -> usize {
        assert!(buf.index < self.inner.count, "buffer {} is not in this pool", buf.index);
        buf.index as usize * self.inner.stride
    }

    /// Pointer to the start of `buf`, derived from the pool's base pointer. Reading or
    /// writing through it is up to the caller (the memory may be shared with peers).
    ///
    /// Panics if `buf`'s index is out of range for this pool.
    pub fn ptr_of(&self, buf: Buf) -> *mut u8 {
        // In bounds of the range given at construction (offset_of checks the index).
        self.inner.base.as_ptr().wrapping_add(self.offset_of(buf))
    }

    /// A scatter/gather entry covering all of `buf`, for an MR with `lkey`.
    pub fn sge(&self, buf: Buf, lkey: u32) -> Sge {
        // stride <= u32::MAX is checked at construction.
        Sge::new(buf.addr, self.inner.stride as u32, lkey)
    }

    /// Maps the start address of a buffer (e.g. from a completion's `wr_id` or an SGE) back
    /// to its handle. `None` for an address outside the pool or not at the start of a buffer.
    ///
    /// The handle gets the buffer's current tag, so it is valid for [`put`](Self::put) only
    /// if the caller owns the buffer; for a free buffer `put` reports a double free.
    pub fn index_of_addr(&self, addr: u64) -> Option<Buf> {
        let index = self.index_at(addr)?;
        // Relaxed: the owner of the buffer last stored this value itself, or received the
        // buffer through a synchronizing hand-off.
        let tag = self.inner.states[index as usize].load(Ordering::Relaxed);
        Some(Buf { addr, index, tag })
    }

    /// The index of the buffer starting at `addr` (`0..count`), without reading its state;
    /// `None` as for [`index_of_addr`](Self::index_of_addr). Why: the state words of a pool
    /// shared by several workers lie 16 to a cache line, which the other workers write as
    /// they take and return their own buffers; a worker that kept the tag of a handle it
    /// lent out ([`crate::worker::srq::RecvBuffers`], per received message) rebuilds the
    /// handle with `handle_at` (crate-private) and reads no line another core writes
    /// (the echo pipeline on one shared pool: ~10 ns of each one-way trip, session 44).
    #[inline]
    pub fn index_at(&self, addr: u64) -> Option<u32> {
        let off = addr.checked_sub(self.base_addr())?;
        let stride = self.inner.stride as u64;
        if off >= self.span() as u64 {
            return None;
        }
        let (index, rem) = match self.inner.stride_shift {
            Some(shift) => (off >> shift, off & (stride - 1)),
            None => (off / stride, off % stride),
        };
        if rem != 0 {
            return None;
        }
        Some(index as u32)
    }

    /// Hints the CPU to fetch the first `len` bytes of buffer `index` (at least one cache
    /// line, at most 16, never past the buffer) into this core's cache for writing
    /// (PREFETCHW), ahead of a receive that will write them and a stage that will read them
    /// (`RecvBuffers::prefetch_next`). A hint: nothing for an index out of range or on other
    /// architectures.
    #[inline]
    pub(crate) fn prefetch_for_write(&self, index: u32, len: usize) {
        if index >= self.inner.count {
            return;
        }
        let start = self.inner.base.as_ptr().wrapping_add(index as usize * self.inner.stride);
        let lines = len.min(self.inner.stride).div_ceil(CACHE_LINE).clamp(1, 16);
        for k in 0..lines {
            super::prefetch_for_write(start.wrapping_add(k * CACHE_LINE));
        }
    }

    /// The handle of buffer `index` (`< count`) issued with `tag`: a handle its holder took
    /// apart and keeps the tag of. `put` checks it as any other handle.
    #[inline]
    pub(crate) fn handle_at(&self, index: u32, tag: u32) -> Buf {
        Buf { addr: self.inner.addr_of_index(index), index, tag }
    }

    /// Takes one buffer from the shared ring; `None` when it is empty (buffers may still sit
    /// in caches).
    pub fn get(&self) -> Option<Buf> {
        let mut i = [0u32; 1];
        (self.inner.ring.pop_many(&mut i) == 1).then(|| self.inner.acquire(i[0]))
    }

    /// Fills `out` from the shared ring as far as it can; returns how many were taken.
    pub fn get_many(&self, out: &mut [Buf]) -> usize {
        let mut stage = [0u32; CHUNK];
        let mut n = 0;
        while n < out.len() {
            let want = (out.len() - n).min(CHUNK);
            let got = self.inner.ring.pop_many(&mut stage[..want]);
            for (o, &i) in out[n..n + got].iter_mut().zip(&stage[..got]) {
                *o = self.inner.acquire(i);
            }
            n += got;
            if got < want {
                break;
            }
        }
        n
    }

    /// Returns `buf` to the shared ring.
    ///
    /// Errors (`EINVAL`): a buffer of another pool, or one returned twice (the free list is
    /// left untouched).
    pub fn put(&self, buf: Buf) -> Result<()> {
        let i = self.inner.release(buf)?;
        self.inner.ring.push_many(&[i]);
        Ok(())
    }

    /// Returns every valid buffer of `bufs` to the shared ring. If some are invalid (as for
    /// [`put`](Self::put)), the others are still returned and the error names the first.
    pub fn put_many(&self, bufs: &[Buf]) -> Result<()> {
        self.inner.put_many_to_ring(bufs)
    }

    /// A per-worker cache holding up to `capacity` buffers (at least 1), which it refills
    /// from and flushes to the ring `capacity / 2` at a time (at least 1). It starts empty.
    pub fn cache(&self, capacity: usize) -> PoolCache {
        let capacity = capacity.max(1);
        let published: CacheCount = Arc::new(CachePadded::new(AtomicUsize::new(0)));
        self.inner.caches().push(published.clone());
        PoolCache {
            pool: self.inner.clone(),
            stack: vec![0; capacity].into_boxed_slice(),
            len: 0,
            batch: (capacity / 2).max(1),
            published,
            _not_sync: PhantomData,
        }
    }

    /// Free buffers: in the ring or in a cache (a snapshot, see the module docs).
    pub fn available(&self) -> usize {
        let cached: usize = self
            .inner
            .caches()
            .iter()
            // Relaxed: statistics only.
            .map(|c| c.load(Ordering::Relaxed))
            .sum();
        (self.inner.ring.len() + cached).min(self.count())
    }

    /// Buffers held by users: neither in the ring nor in any cache (a snapshot).
    pub fn outstanding(&self) -> usize {
        self.count() - self.available()
    }
}

impl fmt::Debug for BufferPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BufferPool")
            .field("base", &self.inner.base)
            .field("buf_size", &self.inner.stride)
            .field("count", &self.inner.count)
            .field("available", &self.available())
            .finish()
    }
}

/// A per-worker cache of a [`BufferPool`]'s free buffers.
///
/// Owned by one thread at a time (`Send`, not `Sync`). [`get`](Self::get) and
/// [`put`](Self::put) take no lock and never allocate; they touch the cache's own memory and
/// the buffer's state word, and go to the shared ring once per `capacity / 2` buffers.
/// Dropping the cache returns its buffers to the pool.
pub struct PoolCache {
    pool: Arc<Inner>,
    /// Free indices; the top (`stack[len - 1]`) is the most recently freed.
    stack: Box<[u32]>,
    len: usize,
    batch: usize,
    published: CacheCount,
    /// Not `Sync`: `get`/`put` take `&mut self` anyway, but the cache is meant for one
    /// worker.
    _not_sync: PhantomData<Cell<()>>,
}

impl PoolCache {
    /// Buffers in the cache.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the cache holds no buffers.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Most buffers the cache holds.
    pub fn capacity(&self) -> usize {
        self.stack.len()
    }

    /// Buffers moved per refill or flush.
    pub fn batch(&self) -> usize {
        self.batch
    }

    #[inline]
    fn publish(&self) {
        // Relaxed: a statistic read by `BufferPool::available`; no data depends on it.
        self.published.store(self.len, Ordering::Relaxed);
    }

    /// Takes a batch from the ring into the (empty) cache; false if the ring had none.
    #[cold]
    fn refill(&mut self) -> bool {
        debug_assert_eq!(self.len, 0);
        self.len = self.pool.ring.pop_many(&mut self.stack[..self.batch]);
        self.len > 0
    }

    /// Sends the oldest batch of the (full) cache to the ring, keeping the warm ones.
    #[cold]
    fn flush(&mut self) {
        let b = self.batch.min(self.len);
        self.pool.ring.push_many(&self.stack[..b]);
        self.stack.copy_within(b..self.len, 0);
        self.len -= b;
    }

    /// Takes a buffer; `None` when the cache and the shared ring are empty.
    #[inline]
    pub fn get(&mut self) -> Option<Buf> {
        if self.len == 0 && !self.refill() {
            return None;
        }
        self.len -= 1;
        self.publish();
        Some(self.pool.acquire(self.stack[self.len]))
    }

    /// Fills `out` as far as the cache and the ring allow; returns how many were taken.
    pub fn get_many(&mut self, out: &mut [Buf]) -> usize {
        let mut n = 0;
        while n < out.len() {
            if self.len == 0 && !self.refill() {
                break;
            }
            let take = self.len.min(out.len() - n);
            for o in &mut out[n..n + take] {
                self.len -= 1;
                *o = self.pool.acquire(self.stack[self.len]);
            }
            n += take;
        }
        self.publish();
        n
    }

    /// Appends up to `n` buffers to `out`, as far as the cache and the ring allow, in the
    /// order [`get`](Self::get) would hand them out; returns how many were appended. One
    /// length check per batch instead of one per buffer, and the count is published once:
    /// what a refill of a receive queue wants. Allocates only if `out` lacks the capacity.
    pub fn get_into(&mut self, out: &mut Vec<Buf>, n: usize) -> usize {
        let start = out.len();
        let mut want = n;
        while want > 0 {
            if self.len == 0 && !self.refill() {
                break;
            }
            let take = self.len.min(want);
            let pool = &self.pool;
            // The top of the stack first, as `get` pops it.
            out.extend(self.stack[self.len - take..self.len].iter().rev().map(|&i| pool.acquire(i)));
            self.len -= take;
            want -= take;
        }
        self.publish();
        out.len() - start
    }

    /// Returns `buf` to the cache (flushing a batch to the ring if the cache is full).
    ///
    /// Errors (`EINVAL`): a buffer of another pool, or one returned twice; nothing changes.
    #[inline]
    pub fn put(&mut self, buf: Buf) -> Result<()> {
        // `release_fast` and the cold `rejected` here, not `release`: through `release`'s
        // `map_err` LLVM lays this out worse, +13 instructions per echoed message in
        // `profile_pipeline` (2,037 -> 2,050, chains of 32; measured in session 32).
        match self.pool.release_fast(buf) {
            Ok(i) => {
                self.push(i);
                self.publish();
                Ok(())
            }
            Err(why) => Err(self.pool.rejected(buf, why)),
        }
    }

    #[inline]
    fn push(&mut self, index: u32) {
        if self.len == self.stack.len() {
            self.flush();
        }
        self.stack[self.len] = index;
        self.len += 1;
    }

    /// Returns every valid buffer of `bufs`. If some are invalid (as for
    /// [`put`](Self::put)), the others are still returned and the error names the first.
    pub fn put_many(&mut self, bufs: &[Buf]) -> Result<()> {
        let mut first_err = None;
        for &b in bufs {
            match self.pool.release(b) {
                Ok(i) => self.push(i),
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        self.publish();
        first_err.map_or(Ok(()), Err)
    }

    /// Returns every cached buffer to the shared ring.
    pub fn drain(&mut self) {
        self.pool.ring.push_many(&self.stack[..self.len]);
        self.len = 0;
        self.publish();
    }
}

impl Drop for PoolCache {
    fn drop(&mut self) {
        self.drain();
        let mut caches = self.pool.caches();
        if let Some(at) = caches.iter().position(|c| Arc::ptr_eq(c, &self.published)) {
            caches.swap_remove(at);
        }
    }
}

impl fmt::Debug for PoolCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PoolCache")
            .field("len", &self.len)
            .field("capacity", &self.stack.len())
            .field("batch", &self.batch)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::{HugePolicy, Region};
    use std::collections::HashSet;

    fn region_pool(buf_size: usize, count: usize) -> BufferPool {
        let region = Region::anonymous(buf_size.next_multiple_of(64) * count, HugePolicy::Never).unwrap();
        BufferPool::from_region(Arc::new(region), 0, buf_size, count).unwrap()
    }

    /// Takes every buffer from the ring and checks each index comes out exactly once.
    fn drain_all(pool: &BufferPool) -> Vec<Buf> {
        let mut seen = HashSet::new();
        let mut all = Vec::new();
        while let Some(b) = pool.get() {
            assert!(seen.insert(b.index()), "index {} handed out twice", b.index());
            all.push(b);
        }
        all
    }

    #[test]
    fn handles_are_small_and_thread_safe() {
        fn send_sync<T: Send + Sync>() {}
        fn send<T: Send>() {}
        send_sync::<BufferPool>();
        send_sync::<Buf>();
        send::<PoolCache>();
        assert_eq!(std::mem::size_of::<Buf>(), 16);
    }

    #[repr(C, align(64))]
    #[derive(Clone, Copy)]
    struct Line([u8; 64]);

    #[test]
    fn raw_range_and_parameter_errors() {
        let mut mem = vec![Line([0; 64]); 16];
        let base = mem.as_mut_ptr().cast::<u8>();
        let len = mem.len() * 64;
        // SAFETY: `mem` outlives every pool built here.
        let new = |b: *mut u8, l, s, c| unsafe { BufferPool::new(b, l, s, c) };
        let p = new(base, len, 100, 8).unwrap();
        assert_eq!(p.buf_size(), 128);
        assert_eq!(p.span(), 1024);
        assert_eq!(p.region_offset(), 0);
        assert_eq!(p.base_addr(), base as u64);
        let fits = new(base, len, 1, 16).unwrap();
        assert_eq!(fits.buf_size(), 64);

        let cases: [(*mut u8, usize, usize, usize, &str); 7] = [
            (base, len, 100, 9, "need 1152 bytes, the range has 1024"),
            (base, len, 0, 1, "size must be > 0"),
            (base, len, 64, 0, "count must be > 0"),
            (base, len, 64, u32::MAX as usize + 1, "exceeds"),
            (base, len, usize::MAX - 3, 1, "fit one SGE"),
            (base.wrapping_add(8), len - 64, 64, 1, "not aligned"),
            (std::ptr::null_mut(), len, 64, 1, "null"),
        ];
        for (b, l, s, c, msg) in cases {
            let e = new(b, l, s, c).unwrap_err();
            assert_eq!(e.errno, Errno::EINVAL, "{e}");
            assert!(e.msg.contains(msg), "{e}");
        }
    }

    #[test]
    fn from_region_offset_errors() {
        let r = Arc::new(Region::anonymous(4096, HugePolicy::Never).unwrap());
        let e = BufferPool::from_region(r.clone(), 5000, 64, 1).unwrap_err();
        assert!(e.msg.contains("past the end"), "{e}");
        let e = BufferPool::from_region(r.clone(), 32, 64, 1).unwrap_err();
        assert!(e.msg.contains("not aligned"), "{e}");
        let e = BufferPool::from_region(r.clone(), 64, 64, 64).unwrap_err();
        assert!(e.msg.contains("the range has 4032"), "{e}");
        let p = BufferPool::from_region(r, 64, 64, 63).unwrap();
        assert_eq!(p.region_offset(), 64);
    }

    #[test]
    fn get_put_exhaustion_and_outstanding() {
        let pool = region_pool(100, 8);
        assert_eq!((pool.count(), pool.available(), pool.outstanding()), (8, 8, 0));
        let bufs: Vec<Buf> = (0..8).map(|_| pool.get().unwrap()).collect();
        assert_eq!(pool.get(), None);
        assert_eq!((pool.available(), pool.outstanding()), (0, 8));
        let idx: HashSet<u32> = bufs.iter().map(|b| b.index()).collect();
        assert_eq!(idx, (0..8).collect());
        pool.put(bufs[3]).unwrap();
        assert_eq!(pool.outstanding(), 7);
        let again = pool.get().unwrap();
        assert_eq!(again.index(), 3);
        assert_ne!(again, bufs[3], "a new generation gets a new tag");
        pool.put_many(&bufs[..3]).unwrap();
        pool.put_many(&bufs[4..]).unwrap();
        pool.put(again).unwrap();
        assert_eq!((pool.available(), pool.outstanding()), (8, 0));

        let mut out = [bufs[0]; 5];
        assert_eq!(pool.get_many(&mut out), 5);
        assert_eq!(pool.outstanding(), 5);
        let mut rest = [bufs[0]; 5];
        assert_eq!(pool.get_many(&mut rest), 3);
        assert_eq!(pool.get_many(&mut rest), 0);
        pool.put_many(&out).unwrap();
        pool.put_many(&rest[..3]).unwrap();
        assert_eq!(drain_all(&pool).len(), 8);
    }

    #[test]
    fn cache_refills_and_flushes_in_batches() {
        let pool = region_pool(64, 64);
        let mut c = pool.cache(8);
        assert_eq!((c.capacity(), c.batch(), c.len()), (8, 4, 0));
        let a = c.get().unwrap();
        // One refill of 4; one handed out.
        assert_eq!(c.len(), 3);
        assert_eq!((pool.available(), pool.outstanding()), (63, 1));
        let mut held = vec![a];
        for _ in 0..3 {
            held.push(c.get().unwrap());
        }
        assert_eq!(c.len(), 0);
        held.push(c.get().unwrap());
        assert_eq!(c.len(), 3, "second refill");
        // Fill the cache to capacity, then one more put flushes the oldest batch.
        let extra: Vec<Buf> = (0..4).map(|_| pool.get().unwrap()).collect();
        for b in held.drain(..).chain(extra) {
            c.put(b).unwrap();
        }
        assert_eq!(c.len(), 3 + 9 - 4, "flushed one batch of 4 on the 6th put");
        assert_eq!((pool.available(), pool.outstanding()), (64, 0));
        // The warmest buffer (last put) comes back first.
        let last = c.get().unwrap();
        c.put(last).unwrap();
        let again = c.get().unwrap();
        assert_eq!(again.index(), last.index());
        let mut many = [again; 20];
        assert_eq!(c.get_many(&mut many), 20);
        assert_eq!(pool.outstanding(), 21);
        c.put_many(&many).unwrap();
        c.put(again).unwrap();
        assert_eq!(pool.outstanding(), 0);
        assert!(c.len() <= c.capacity());
    }

    #[test]
    fn get_into_hands_out_what_get_would_across_refills_and_stops_when_empty() {
        // Two identical pools and caches: one drained with `get`, one with `get_into`.
        let (p1, p2) = (region_pool(64, 24), region_pool(64, 24));
        let (mut c1, mut c2) = (p1.cache(8), p2.cache(8));
        // Warm both caches the same way so the order is not just the ring's.
        let warm: Vec<_> = (0..3).map(|_| (c1.get().unwrap(), c2.get().unwrap())).collect();
        for (a, b) in warm.into_iter().rev() {
            c1.put(a).unwrap();
            c2.put(b).unwrap();
        }
        let by_get: Vec<u32> = (0..10).map(|_| c1.get().unwrap().index()).collect();
        let mut out = Vec::with_capacity(32);
        assert_eq!(c2.get_into(&mut out, 10), 10, "crosses at least one ring refill");
        assert_eq!(out.iter().map(|b| b.index()).collect::<Vec<_>>(), by_get);
        assert_eq!((c2.len(), p2.outstanding()), (c1.len(), p1.outstanding()));
        // Appends after what `out` holds; stops at the pool's 24 buffers.
        assert_eq!(c2.get_into(&mut out, 100), 14);
        assert_eq!((out.len(), p2.available()), (24, 0));
        assert_eq!(c2.get_into(&mut out, 1), 0);
        // Every buffer handed out exactly once, each one returnable once.
        let mut idx: Vec<u32> = out.iter().map(|b| b.index()).collect();
        idx.sort_unstable();
        assert_eq!(idx, (0..24).collect::<Vec<_>>());
        c2.put_many(&out).unwrap();
        assert!(c2.put(out[0]).is_err(), "returned twice");
        assert_eq!(p2.outstanding(), 0);
    }

    #[test]
    fn dropping_a_cache_returns_its_buffers() {
        let pool = region_pool(64, 32);
        let mut c = pool.cache(16);
        let b = c.get().unwrap();
        assert_eq!(c.len(), 7);
        assert_eq!(pool.available(), 31);
        drop(c);
        assert_eq!((pool.available(), pool.outstanding()), (31, 1));
        // The held buffer can go back through another cache or the pool.
        let mut c2 = pool.cache(4);
        c2.put(b).unwrap();
        assert_eq!(pool.outstanding(), 0);
        drop(c2);
        assert_eq!(drain_all(&pool).len(), 32);
    }

    #[test]
    fn double_free_and_foreign_buffers_are_errors() {
        let pool = region_pool(64, 4);
        let other = region_pool(64, 16);
        let mut c = pool.cache(4);
        let b = c.get().unwrap();
        c.put(b).unwrap();
        let e = c.put(b).unwrap_err();
        assert_eq!(e.errno, Errno::EINVAL);
        assert!(e.msg.contains(&format!("buffer {} returned twice", b.index())), "{e}");
        let e = pool.put(b).unwrap_err();
        assert!(e.msg.contains("returned twice"), "{e}");
        // A stale handle after the buffer was handed out again.
        let all: Vec<Buf> = (0..4).map(|_| c.get().unwrap()).collect();
        assert!(c.put(b).unwrap_err().msg.contains("returned twice"));
        // Foreign: index out of range, and in range but another pool's address.
        let others: Vec<Buf> = (0..16).map(|_| other.get().unwrap()).collect();
        let (near, far) = (others[1], others[9]);
        assert_eq!((near.index(), far.index()), (1, 9));
        let e = c.put(far).unwrap_err();
        assert!(e.msg.contains("does not belong to this pool"), "{e}");
        assert!(pool.put(near).unwrap_err().msg.contains("does not belong"));
        // A handle rebuilt from the address of a free buffer is rejected too.
        c.put_many(&all).unwrap();
        let free = pool.index_of_addr(pool.addr_of(b)).unwrap();
        assert!(c.put(free).unwrap_err().msg.contains("returned twice"));
        // put_many returns the valid ones and reports the bad one.
        let two: Vec<Buf> = (0..2).map(|_| c.get().unwrap()).collect();
        let e = c.put_many(&[two[0], far, two[1]]).unwrap_err();
        assert!(e.msg.contains("does not belong"), "{e}");
        let e = pool.put_many(&[two[0]]).unwrap_err();
        assert!(e.msg.contains("returned twice"), "{e}");
        drop(c);
        // Nothing was corrupted: every index exactly once.
        assert_eq!((pool.available(), pool.outstanding()), (4, 0));
        assert_eq!(drain_all(&pool).len(), 4);
    }

    #[test]
    fn addresses_round_trip_and_garbage_is_rejected() {
        // A power-of-two stride (mapped back with a shift) and another one (a division).
        for (size, stride) in [(100usize, 128u64), (150, 192)] {
            let pool = region_pool(size, 10);
            assert_eq!(pool.buf_size() as u64, stride);
            let base = pool.base_addr();
            let bufs: Vec<Buf> = (0..10).map(|_| pool.get().unwrap()).collect();
            for &b in &bufs {
                let addr = pool.addr_of(b);
                assert_eq!(addr, b.addr());
                assert_eq!(addr, base + pool.offset_of(b) as u64);
                assert_eq!(pool.offset_of(b) as u64, u64::from(b.index()) * stride);
                assert_eq!(pool.ptr_of(b) as u64, addr);
                assert_eq!(pool.index_of_addr(addr), Some(b));
                assert_eq!(pool.index_of_addr(addr + 64), None);
                let sge = pool.sge(b, 7);
                assert_eq!((sge.addr, sge.length, sge.lkey), (addr, stride as u32, 7));
            }
            let end = base + 10 * stride;
            for bad in [0, base - stride, base - 1, base + 1, base + 64, base + stride - 1, end, end + stride, u64::MAX]
            {
                assert_eq!(pool.index_of_addr(bad), None, "stride {stride}: {bad:#x}");
            }
            // A handle rebuilt from an owned buffer's address can be returned.
            for &b in &bufs {
                pool.put(pool.index_of_addr(b.addr()).unwrap()).unwrap();
            }
            assert_eq!(pool.outstanding(), 0);
        }
    }

    #[test]
    fn real_region_backing_is_usable_and_kept_alive() {
        let region = Arc::new(Region::anonymous(1 << 16, HugePolicy::Never).unwrap());
        let pool = BufferPool::from_region(region.clone(), 4096, 1000, 32).unwrap();
        assert_eq!(pool.base_addr(), region.addr(4096));
        let mut c = pool.cache(8);
        let b = c.get().unwrap();
        region.write(pool.region_offset() + pool.offset_of(b), b"hello");
        drop(region);
        // The pool keeps the mapping alive.
        let mut out = [0u8; 5];
        // SAFETY: the buffer is 1024 bytes inside a mapping the pool keeps alive, and this
        // thread holds the buffer.
        unsafe { std::ptr::copy_nonoverlapping(pool.ptr_of(b), out.as_mut_ptr(), 5) };
        assert_eq!(&out, b"hello");
        c.put(b).unwrap();
        drop(c);
        drop(pool);
    }

    #[test]
    fn multi_thread_churn_loses_and_duplicates_nothing() {
        use std::sync::mpsc;
        const THREADS: usize = 4;
        const ITERS: usize = 100_000;
        let pool = region_pool(64, 1024);
        let (txs, rxs): (Vec<_>, Vec<_>) = (0..THREADS).map(|_| mpsc::channel::<(Buf, u64)>()).unzip();
        let mut rxs: Vec<Option<_>> = rxs.into_iter().map(Some).collect();
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let pool = pool.clone();
                let tx = txs[(t + 1) % THREADS].clone();
                let rx = rxs[t].take().unwrap();
                std::thread::spawn(move || {
                    let mut c = pool.cache(32);
                    let check = |b: Buf, mark: u64| {
                        // SAFETY: the buffer is held by this thread (handed over through the
                        // pool or the channel, both synchronizing); 64-byte aligned.
                        let got = unsafe { pool.ptr_of(b).cast::<u64>().read() };
                        assert_eq!(got, mark, "buffer {} was written by someone else", b.index());
                    };
                    let mut many = [Buf { addr: 0, index: 0, tag: 0 }; 8];
                    for i in 0..ITERS {
                        while let Ok((b, mark)) = rx.try_recv() {
                            check(b, mark);
                            c.put(b).unwrap();
                        }
                        if i % 64 == 0 {
                            let n = c.get_many(&mut many);
                            c.put_many(&many[..n]).unwrap();
                        }
                        let Some(b) = (if i % 16 == 0 { pool.get() } else { c.get() }) else {
                            std::thread::yield_now();
                            continue;
                        };
                        let mark = ((t as u64) << 32) | i as u64;
                        // SAFETY: as in `check`.
                        unsafe { pool.ptr_of(b).cast::<u64>().write(mark) };
                        check(b, mark);
                        if i % 4 == 0 {
                            tx.send((b, mark)).unwrap();
                        } else if i % 16 == 1 {
                            pool.put(b).unwrap();
                        } else {
                            c.put(b).unwrap();
                        }
                    }
                    drop(tx);
                    // Our sender-side neighbour may still be running: take whatever it sends
                    // until it hangs up.
                    for (b, mark) in rx {
                        check(b, mark);
                        c.put(b).unwrap();
                    }
                })
            })
            .collect();
        drop(txs);
        for h in handles {
            h.join().unwrap();
        }
        assert_eq!(pool.outstanding(), 0);
        assert_eq!(pool.available(), pool.count());
        let all = drain_all(&pool);
        assert_eq!(all.len(), pool.count());
        assert_eq!(pool.outstanding(), pool.count());
        pool.put_many(&all).unwrap();
        assert_eq!(pool.available(), pool.count());
    }
}

/// Model checking of the pool's MPMC ring with loom: every interleaving (up to loom's
/// preemption bound) of concurrent batch pops and pushes, checking that no index is lost or
/// handed out twice. Run: `tools/loom.sh` (`RUSTFLAGS="--cfg loom" cargo test --release -p
/// dataplane --lib loom`).
#[cfg(all(test, loom))]
mod loom_tests {
    use super::Ring;
    use loom::sync::Arc;
    use loom::thread;

    /// Drains `ring` and returns what it held, sorted.
    fn drain(ring: &Ring) -> Vec<u32> {
        let mut all = Vec::new();
        let mut out = [0u32; 8];
        loop {
            let n = ring.pop_many(&mut out);
            if n == 0 {
                break;
            }
            all.extend_from_slice(&out[..n]);
        }
        all.sort_unstable();
        all
    }

    #[test]
    fn loom_two_consumers_returning_buffers_lose_and_duplicate_nothing() {
        loom::model(|| {
            let ring = Arc::new(Ring::new_full(2));
            let workers: Vec<_> = (0..2)
                .map(|_| {
                    let r = ring.clone();
                    thread::spawn(move || {
                        let mut got = [0u32; 1];
                        if r.pop_many(&mut got) == 1 {
                            r.push_many(&got);
                        }
                    })
                })
                .collect();
            for w in workers {
                w.join().unwrap();
            }
            assert_eq!(drain(&ring), [0, 1]);
        });
    }

    #[test]
    fn loom_batch_claims_race_a_batch_push() {
        loom::model(|| {
            // Capacity 4 holding 3: one thread takes a batch of 2 and gives it back while the
            // other takes up to 2; what the second keeps is returned after the join.
            let ring = Arc::new(Ring::new_full(3));
            let r = ring.clone();
            let a = thread::spawn(move || {
                let mut got = [0u32; 2];
                let n = r.pop_many(&mut got);
                r.push_many(&got[..n]);
            });
            let mut kept = [0u32; 2];
            let n = ring.pop_many(&mut kept);
            a.join().unwrap();
            ring.push_many(&kept[..n]);
            assert_eq!(drain(&ring), [0, 1, 2]);
        });
    }
}

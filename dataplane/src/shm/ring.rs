//! A bounded lock-free ring in shared memory, used for receive queues, SRQs, CQs and event
//! queues. A ring follows one of two protocols, fixed by what it is used for:
//!
//! - **Freeing** (Vyukov's MPMC queue; event and channel rings, the control path): each cell
//!   starts with a sequence number. A producer may fill cell `pos & mask` when its sequence
//!   equals `pos`; it publishes the payload by storing `pos + 1` (Release). A consumer may take
//!   it when the sequence equals `pos + 1`; it frees the cell by storing `pos + capacity`
//!   (Release). `head`/`tail` claims use Relaxed CAS: they only pick a position, the cell
//!   sequence carries the synchronisation. [`Ring::push`], [`Ring::pop`].
//! - **Head-tracked** (CQs: many producers, one consumer): producers publish cells exactly
//!   as above, but the consumer never writes a cell. It only advances `head` (Release), and a
//!   producer learns that a cell is free from `head`, which it re-reads only when its cached
//!   copy (`head_seen`, process-local, one per producer) says the ring is full. So a CQE's
//!   cache line moves once, producer to consumer, instead of three times (the producer
//!   reading the sequence the consumer wrote, upgrading the line to write it, the consumer
//!   writing it back), and `head` stays in the consumer's cache. [`Ring::push_tracked`],
//!   [`Ring::pop_single_tracked`]. Mixing the two protocols on one ring would be a bug.
//!
//!   Receive queues keep the freeing protocol, on purpose. Their consumers are the senders
//!   and their producer the owner, which keeps the ring full of posted requests; tracked,
//!   the owner would have to re-read `head` on every repost (the ring is always "full" by a
//!   stale view), and the sender's CAS on `head` would then wait for that line to come back
//!   on every message. Measured: 8-byte `send_lat` went from 0.2/0.6 µs (the two host
//!   placements) to 0.3/0.9 µs, so it was reverted. A connected QP's receive queue may
//!   instead be held by its one sender, which then claims with a plain store to `head`
//!   ([`Ring::pop_solo`], `shm::solo`).
//!
//! The Acquire load of the sequence on the consumer side orders the payload bytes after it.
//!
//! Trust boundary: a peer can write anything into the shared header and cells. The local
//! [`Ring`] view keeps its own copy of the mask and stride (never re-read from shared memory),
//! and every index is masked, so a hostile value can stall the ring but never move an access
//! outside it. Nor can it hold a caller forever: every loop that re-reads shared words gives
//! up after [`MAX_REREADS`] attempts that made no progress, reporting the ring stalled
//! ([`Pop::Stalled`]) or full. A healthy ring never comes near the bound: each re-read means
//! another thread moved `head` or `tail` meanwhile. The count lives on the retry branch only,
//! so the first attempt (nearly every call) costs what it did.

// Under `--cfg loom` (tools/loom.sh) the ring's words are loom's atomics, so `loom::model`
// explores the interleavings of the protocols above (the `loom_tests` at the end). The same
// code runs: a loom atomic is bigger than 8 bytes, so the payload starts at `SEQ_LEN`.
#[cfg(loom)]
use loom::sync::atomic::{AtomicU64, Ordering};
#[cfg(not(loom))]
use std::sync::atomic::{AtomicU64, Ordering};

use super::cell::{CellMut, CellRef};

/// Bytes of a cell before its payload: the sequence word (8, or a loom atomic's size).
const SEQ_LEN: usize = std::mem::size_of::<AtomicU64>().next_multiple_of(8);

/// Shared header of a ring: producer and consumer positions on their own cache lines. The
/// consumer's line also holds the words of the single-consumer mode of a connected QP's
/// receive queue (`shm::solo`), which only the consumers touch.
#[repr(C, align(128))]
pub(crate) struct RingHeader {
    head: AtomicU64,
    /// [`SOLO_FREE`], [`SOLO_HELD`] or [`SOLO_SHARED`].
    solo: AtomicU64,
    /// 1 while the solo consumer is inside [`Ring::pop_solo`].
    solo_busy: AtomicU64,
    /// The solo consumer's process id (written once, when it takes the mode).
    solo_pid: AtomicU64,
    _pad0: [u8; 96],
    tail: AtomicU64,
    _pad1: [u8; 120],
}

/// No consumer has taken the single-consumer mode yet: every pop so far was a CAS.
pub(crate) const SOLO_FREE: u64 = 0;
/// One consumer took the mode ([`Ring::solo_claim`]) and moves `head` with plain stores.
pub(crate) const SOLO_HELD: u64 = 1;
/// The mode was revoked ([`Ring::solo_revoke`]): every pop is a CAS, for the ring's life.
pub(crate) const SOLO_SHARED: u64 = 2;

/// Re-reads of a shared position after which a ring operation gives up. A re-read happens
/// only when another producer or consumer won the race for the cell (so `head`/`tail` moved)
/// or when the ring's words are inconsistent (a corrupt or hostile peer); 65,536 lost races in
/// a row do not happen on a healthy ring, and the bound costs well under a millisecond.
pub(crate) const MAX_REREADS: u32 = 1 << 16;

/// How long a bounded push's producer waits for a consumer to free a cell it claimed
/// ([`Ring::wait_held_cell`]): far longer than the few instructions between the two, unless
/// that consumer was descheduled (a scheduler tick is a few ms) or died.
pub(crate) const HELD_CELL_PATIENCE: std::time::Duration = std::time::Duration::from_millis(100);

/// Bytes the header occupies before the first cell.
pub(crate) const RING_HEADER_LEN: usize = std::mem::size_of::<RingHeader>();

/// Process-local view of a ring living in shared memory.
#[derive(Clone, Copy)]
pub(crate) struct Ring {
    hdr: *const RingHeader,
    cells: *mut u8,
    mask: u64,
    stride: usize,
}

// SAFETY: the ring is accessed only through atomics and raw copies guarded by the sequence
// protocol above; the mapping outlives every view (views are held next to an Arc<Fabric>).
unsafe impl Send for Ring {}
// SAFETY: as above.
unsafe impl Sync for Ring {}

/// Result of a pop on a ring.
pub(crate) enum Pop {
    /// Got an entry (its payload was copied out).
    Item,
    /// No entry ready.
    Empty,
    /// The ring's shared words are inconsistent (a cell's sequence stays ahead of `head`):
    /// gave up after [`MAX_REREADS`] re-reads. Only a corrupt or hostile writer causes it.
    Stalled,
}

impl Ring {
    /// Bytes needed for a ring of `cap` cells of `stride` bytes (stride includes the 8-byte
    /// sequence).
    pub(crate) fn bytes(cap: usize, stride: usize) -> usize {
        RING_HEADER_LEN + cap * stride
    }

    /// Initialises a ring at `base` (only the creator calls this, before publishing it).
    ///
    /// # Safety
    /// `base` must point to `Ring::bytes(cap, stride)` writable bytes aligned to 128, not yet
    /// visible to any other thread or process; `cap` a power of two; `stride` a multiple of 8
    /// and at least 8.
    pub(crate) unsafe fn init(base: *mut u8, cap: usize, stride: usize) -> Ring {
        debug_assert!(cap.is_power_of_two() && stride >= SEQ_LEN && stride % 8 == 0);
        let hdr = base as *mut RingHeader;
        // SAFETY: per the contract, the header is ours to initialise and nobody else sees it
        // yet, so its words are written as fresh atomics (not stored into: under loom an atomic
        // must be created before it is used).
        unsafe {
            std::ptr::write(&raw mut (*hdr).head, AtomicU64::new(0));
            std::ptr::write(&raw mut (*hdr).solo, AtomicU64::new(SOLO_FREE));
            std::ptr::write(&raw mut (*hdr).solo_busy, AtomicU64::new(0));
            std::ptr::write(&raw mut (*hdr).solo_pid, AtomicU64::new(0));
            std::ptr::write(&raw mut (*hdr).tail, AtomicU64::new(0));
        }
        // SAFETY: the cells follow the header inside the range of the contract.
        let cells = unsafe { base.add(RING_HEADER_LEN) };
        for i in 0..cap {
            // SAFETY: cell i is inside the range given by the contract and 8-byte aligned;
            // unpublished, as above.
            unsafe { std::ptr::write(cells.add(i * stride) as *mut AtomicU64, AtomicU64::new(i as u64)) };
        }
        // SAFETY: the range given by the contract.
        unsafe { Ring::attach(base, cap, stride) }
    }

    /// A view of an initialised ring.
    ///
    /// # Safety
    /// As for [`Ring::init`], and the ring must stay mapped while the view is used.
    pub(crate) unsafe fn attach(base: *mut u8, cap: usize, stride: usize) -> Ring {
        Ring {
            hdr: base as *const RingHeader,
            // SAFETY: the cells follow the header inside the range of the contract.
            cells: unsafe { base.add(RING_HEADER_LEN) },
            mask: cap as u64 - 1,
            stride,
        }
    }

    fn hdr(&self) -> &RingHeader {
        // SAFETY: `hdr` points into a live mapping (constructor contract); the header holds
        // only atomics.
        unsafe { &*self.hdr }
    }

    fn cell(&self, pos: u64) -> (*mut u8, &AtomicU64) {
        // SAFETY: `pos & mask` < cap, so the cell is inside the ring; the sequence is the
        // cell's first, 8-byte aligned word.
        unsafe {
            let c = self.cells.add((pos & self.mask) as usize * self.stride);
            (c.add(SEQ_LEN), &*(c as *const AtomicU64))
        }
    }

    /// A consumer's view of the cell at `pos`: its payload and how far its sequence (Acquire:
    /// a published cell's payload stores are visible) is from "published for this lap"
    /// (`pos + 1`): 0 published, negative not yet (empty), positive a lap ahead (another
    /// consumer took it, or a scribbled word).
    #[inline(always)]
    fn consumer_lag(&self, pos: u64) -> (*mut u8, i64) {
        let (payload, seq) = self.cell(pos);
        (payload, seq.load(Ordering::Acquire).wrapping_sub(pos.wrapping_add(1)) as i64)
    }

    /// The payload of a cell this producer was given by the protocol, as a write handle.
    #[inline(always)]
    fn writable(&self, payload: *mut u8) -> CellMut<'_> {
        // SAFETY: `payload` comes from `cell`, so `payload_len` bytes lie inside the ring's
        // mapping, which outlives `self`; the caller won the cell (CAS or single producer).
        unsafe { CellMut::new(payload, self.payload_len()) }
    }

    /// The payload of a cell this consumer was given by the protocol, as a read handle.
    #[inline(always)]
    fn readable(&self, payload: *mut u8) -> CellRef<'_> {
        // SAFETY: as in `writable`; the caller claimed the published cell.
        unsafe { CellRef::new(payload, self.payload_len()) }
    }

    /// Capacity in entries.
    pub(crate) fn capacity(&self) -> u64 {
        self.mask + 1
    }

    /// Whether `other` is a view of the same ring (the same header).
    #[inline(always)]
    pub(crate) fn same(&self, other: &Ring) -> bool {
        std::ptr::eq(self.hdr, other.hdr)
    }

    /// Payload bytes per cell.
    pub(crate) fn payload_len(&self) -> usize {
        self.stride - SEQ_LEN
    }

    /// Positions consumed so far (`head`, Acquire): a receive queue's sender that reserves
    /// requests ahead of their consumption (`shm::drain`) starts counting from it.
    #[inline]
    pub(crate) fn head_pos(&self) -> u64 {
        self.hdr().head.load(Ordering::Acquire)
    }

    /// Positions claimed by the producer so far (`tail`, Acquire). On a receive queue a
    /// position below it is posted or being posted: its cell is published a few
    /// instructions after `tail` moves ([`Ring::push_single`]).
    #[inline]
    pub(crate) fn tail_pos(&self) -> u64 {
        self.hdr().tail.load(Ordering::Acquire)
    }

    /// Entries currently queued (approximate under concurrency; exact when quiescent).
    pub(crate) fn len(&self) -> u64 {
        let tail = self.hdr().tail.load(Ordering::Acquire);
        let head = self.hdr().head.load(Ordering::Acquire);
        tail.wrapping_sub(head).min(self.capacity())
    }

    /// Appends an entry whose payload `fill` writes. Returns false (and changes nothing) when
    /// the ring is full.
    #[inline]
    pub(crate) fn push(&self, fill: impl FnOnce(CellMut<'_>)) -> bool {
        let hdr = self.hdr();
        let mut pos = hdr.tail.load(Ordering::Relaxed);
        let mut rereads = 0u32;
        loop {
            let (payload, seq) = self.cell(pos);
            let s = seq.load(Ordering::Acquire);
            let dif = s.wrapping_sub(pos) as i64;
            if dif == 0 {
                match hdr.tail.compare_exchange_weak(pos, pos.wrapping_add(1), Ordering::Relaxed, Ordering::Relaxed) {
                    Ok(_) => {
                        fill(self.writable(payload));
                        seq.store(pos.wrapping_add(1), Ordering::Release);
                        return true;
                    }
                    Err(cur) => pos = cur,
                }
            } else if dif < 0 {
                return false;
            } else {
                pos = hdr.tail.load(Ordering::Relaxed);
            }
            // Stalled (see the module docs): reads as full, as a scribbled cell does in
            // `push_single`.
            rereads += 1;
            if rereads >= MAX_REREADS {
                return false;
            }
        }
    }

    /// Appends an entry when this caller is the only producer (no CAS on `tail`). Returns
    /// false (and changes nothing) when the ring is full.
    ///
    /// Callers must guarantee no concurrent `push`/`push_single` on this ring (receive
    /// queues: only their owner's `&mut` post pushes). Consumers are unaffected: they
    /// synchronise on the cell sequence, which is published with Release as in `push`; `tail`
    /// is advanced before the payload is written, as `push`'s CAS does, so `len()` reads the
    /// same as with `push`. A cell whose sequence is not `pos` (full, or scribbled by a
    /// hostile peer) reads as full.
    #[inline]
    pub(crate) fn push_single(&self, fill: impl FnOnce(CellMut<'_>)) -> bool {
        let hdr = self.hdr();
        let pos = hdr.tail.load(Ordering::Relaxed);
        let (payload, seq) = self.cell(pos);
        if seq.load(Ordering::Acquire) != pos {
            return false;
        }
        hdr.tail.store(pos.wrapping_add(1), Ordering::Relaxed);
        fill(self.writable(payload));
        seq.store(pos.wrapping_add(1), Ordering::Release);
        true
    }

    /// [`Ring::push_single`] that also refuses when `limit` entries are already queued and
    /// not yet claimed by a consumer (`tail - head >= limit`). SRQs use it with a ring twice
    /// their `max_wr` (see `shm/srq.rs`): a consumer claims a cell (CAS on `head`) and frees it
    /// (its sequence store) a few instructions later, and if it is descheduled in between
    /// while other consumers go on, that one cell stays full. On a ring of exactly `max_wr`
    /// cells the producer would then meet it `max_wr` posts later and report the queue full
    /// although fewer than `max_wr` requests are outstanding. With twice the cells, the count
    /// of unclaimed requests bounds the queue at `limit`, and a cell still held is met only
    /// if its consumer stayed descheduled while the others claimed `limit` more; the caller
    /// then waits for it with [`Ring::wait_held_cell`] and pushes again.
    ///
    /// `head_seen` is the producer's cached `head` (as in the head-tracked protocol): it is
    /// re-read (Acquire: a fresh `head` means those cells' claims happened) only when the
    /// cached view says `limit` are queued, so a post does not pull `head`'s line, which every
    /// consumer writes, on each call.
    #[inline]
    pub(crate) fn push_single_bounded(&self, limit: u64, head_seen: &mut u64, fill: impl FnOnce(CellMut<'_>)) -> bool {
        let pos = self.hdr().tail.load(Ordering::Relaxed);
        if pos.wrapping_sub(*head_seen) >= limit {
            *head_seen = self.hdr().head.load(Ordering::Acquire);
            // A `head` beyond `tail` is corrupt (a hostile peer): reads as full, like a
            // scribbled cell does.
            if pos.wrapping_sub(*head_seen) >= limit {
                return false;
            }
        }
        self.push_single(fill)
    }

    /// [`Ring::push_single_bounded`] of up to `n` entries, the `k`-th written by `fill(k, ..)`,
    /// stopping at the first `k` that `admit(k)` refuses (asked before its cell is claimed:
    /// nothing of it is written): returns how many were pushed, in order (fewer than `n` when
    /// `admit`, the bound or a cell not yet free stops it; the caller retries or reports the
    /// rest). Each cell is claimed and published as `push_single` does (`tail` moved just
    /// before its payload is written, its sequence stored with Release after), so consumers
    /// see exactly what a loop of `push_single_bounded` would show them; only the producer's
    /// own checks are shared: the bound is checked once for the run, and the call made once.
    /// `admit` lets a caller whose entries pass a check one by one (`recvq::post_list`'s run
    /// of one MR) check each as it pushes it instead of scanning them first.
    #[inline]
    pub(crate) fn push_run_while(
        &self,
        limit: u64,
        head_seen: &mut u64,
        n: usize,
        mut admit: impl FnMut(usize) -> bool,
        mut fill: impl FnMut(usize, CellMut<'_>),
    ) -> usize {
        let hdr = self.hdr();
        let pos = hdr.tail.load(Ordering::Relaxed);
        // Room under the bound; a `head` beyond `tail` (corrupt) leaves none, as in
        // `push_single_bounded`. With `limit` at `u64::MAX` (cells only) `head` is not read.
        let room = |head: u64| limit.saturating_sub(pos.wrapping_sub(head));
        let mut max = room(*head_seen);
        if max < n as u64 {
            *head_seen = hdr.head.load(Ordering::Acquire);
            max = room(*head_seen);
        }
        let n = (n as u64).min(max);
        let mut k = 0;
        while k < n {
            let p = pos.wrapping_add(k);
            if !admit(k as usize) {
                break;
            }
            let (payload, seq) = self.cell(p);
            if seq.load(Ordering::Acquire) != p {
                break;
            }
            hdr.tail.store(p.wrapping_add(1), Ordering::Relaxed);
            fill(k as usize, self.writable(payload));
            seq.store(p.wrapping_add(1), Ordering::Release);
            k += 1;
        }
        k as usize
    }

    /// After [`Ring::push_single_bounded`] refused: whether that was a cell a consumer has
    /// claimed and not yet freed, and it is free now (push again). The count said fewer than
    /// `limit` (< capacity) requests unclaimed, so the cell's last request was claimed; its
    /// consumer was descheduled between its claim and its free, a few instructions apart,
    /// while other consumers took `limit` more (seen on the 2-core VM with 16 QPs on one SRQ,
    /// the poster's own CQ polls progressing the other QPs' sends: about 1 run in 6 of
    /// `dp-perf send_bw --use-srq -q 16` failed with ENOMEM). The queue is not full, so
    /// refusing would break `ibv_post_srq_recv`'s contract: wait for the free, up to
    /// [`HELD_CELL_PATIENCE`]. A consumer that died between claim and free never frees it:
    /// then false, and the queue has lost that cell for good. False at once when the refusal
    /// was the count, or the cell holds anything but a claimed request (a hostile peer's
    /// scribble). Called on the refusal path only, so the push itself is unchanged.
    #[cold]
    #[inline(never)]
    pub(crate) fn wait_held_cell(&self, limit: u64, head_seen: &mut u64) -> bool {
        if limit >= self.capacity() {
            return false;
        }
        let hdr = self.hdr();
        let pos = hdr.tail.load(Ordering::Relaxed);
        *head_seen = hdr.head.load(Ordering::Acquire);
        if pos.wrapping_sub(*head_seen) >= limit {
            return false;
        }
        let seq = self.cell(pos).1;
        let held = pos.wrapping_sub(self.capacity()).wrapping_add(1);
        #[cfg(not(loom))]
        let deadline = std::time::Instant::now() + HELD_CELL_PATIENCE;
        let mut spins = 0u32;
        loop {
            let s = seq.load(Ordering::Acquire);
            if s == pos {
                return true;
            }
            if s != held {
                return false;
            }
            spins += 1;
            #[cfg(loom)]
            {
                if spins > 2 {
                    return false;
                }
                loom::thread::yield_now();
            }
            #[cfg(not(loom))]
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                if spins % 64 == 0 && std::time::Instant::now() >= deadline {
                    return false;
                }
                std::thread::yield_now();
            }
        }
    }

    /// Takes the oldest entry, letting `read` copy its payload out. Safe for many consumers.
    /// [`Pop::Stalled`] when the ring's words stay inconsistent for [`MAX_REREADS`] re-reads.
    #[inline]
    pub(crate) fn pop(&self, read: impl FnOnce(CellRef<'_>)) -> Pop {
        match self.pop_held(read) {
            Ok(pos) => {
                self.release(pos);
                Pop::Item
            }
            Err(p) => p,
        }
    }

    /// [`Ring::pop`] that keeps the cell: claims and reads the oldest entry and returns its
    /// position, which the caller must hand to [`Ring::release`] (until then producers cannot
    /// reuse the cell; a receive queue's poster waits for it as for any held cell, see
    /// [`Ring::wait_held_cell`]). `Err` is what `pop` would have returned. A sender releases
    /// the receive requests of a chain after all its claims, as it publishes their CQEs
    /// ([`Ring::claim_tracked`]).
    #[inline(always)]
    pub(crate) fn pop_held(&self, read: impl FnOnce(CellRef<'_>)) -> Result<u64, Pop> {
        // A run of one: with `max` 1 the run loop is dead code, so this is the single claim.
        self.pop_run(1, read).map(|(pos, _)| pos)
    }

    /// [`Ring::pop_held`] of a run: claims the oldest entry and up to `max - 1` published
    /// entries after it with one CAS on `head`, reads the first, and returns its position and
    /// the run's length `k` (at least 1). The caller holds cells `pos..pos + k`: it reads the
    /// others with [`Ring::read_held`] and must hand each to [`Ring::release`]; it claims
    /// only as many as it will certainly use, since a claim cannot be given back.
    ///
    /// Why one CAS: a drainer delivering a burst of messages to one receive queue paid a
    /// locked instruction per message, and a locked instruction waits for the store buffer
    /// (the previous message's payload and completion stores) to drain.
    ///
    /// The run's cells are checked (Acquire load of each sequence) before the CAS. A cell
    /// published for this lap keeps its sequence until a consumer that claimed it frees it,
    /// and claiming it means moving `head` past it, which makes our CAS fail: so after a
    /// successful CAS every cell of the run is ours and published, and the Acquire loads
    /// order the producer's payload stores before our reads of them.
    #[inline(always)]
    pub(crate) fn pop_run(&self, max: u64, read: impl FnOnce(CellRef<'_>)) -> Result<(u64, u64), Pop> {
        let hdr = self.hdr();
        // Not `clamp`: it has a panic path (min > max) the hot loop need not carry.
        let max = max.max(1).min(self.mask + 1);
        let mut pos = hdr.head.load(Ordering::Relaxed);
        let mut rereads = 0u32;
        loop {
            let (payload, dif) = self.consumer_lag(pos);
            if dif == 0 {
                let mut k = 1;
                while k < max {
                    let p = pos.wrapping_add(k);
                    if self.cell(p).1.load(Ordering::Acquire) != p.wrapping_add(1) {
                        break;
                    }
                    k += 1;
                }
                match hdr.head.compare_exchange_weak(pos, pos.wrapping_add(k), Ordering::Relaxed, Ordering::Relaxed) {
                    Ok(_) => {
                        read(self.readable(payload));
                        return Ok((pos, k));
                    }
                    Err(cur) => pos = cur,
                }
            } else if dif < 0 {
                return Err(Pop::Empty);
            } else {
                pos = hdr.head.load(Ordering::Relaxed);
            }
            if rereads == MAX_REREADS {
                return Err(Pop::Stalled);
            }
            rereads += 1;
        }
    }

    /// Takes the single-consumer mode for process `pid`: from now on this consumer may pop
    /// with [`Ring::pop_solo`], without a locked instruction, until a revocation. False if
    /// the mode was taken or revoked before (the caller pops with CAS, as every other
    /// consumer). The caller must be the only consumer that ever pops outside the CAS
    /// protocol, and must order its pops after every other consumer's (`shm::solo`).
    pub(crate) fn solo_claim(&self, pid: u32) -> bool {
        let h = self.hdr();
        let won = h.solo.compare_exchange(SOLO_FREE, SOLO_HELD, Ordering::AcqRel, Ordering::Relaxed).is_ok();
        if won {
            // Before any `solo_busy` store of ours, so a revoker that sees us busy sees it.
            h.solo_pid.store(u64::from(pid), Ordering::Relaxed);
        }
        won
    }

    /// [`Ring::pop_held`] for the consumer that took the single-consumer mode
    /// ([`Ring::solo_claim`]): claims the oldest entry with a plain store to `head`. `None`
    /// if the mode was revoked (nothing was claimed: pop with [`Ring::pop_held`]).
    ///
    /// The protocol (an asymmetric Dekker, as userspace RCU's): this consumer raises
    /// `solo_busy`, then reads `solo`; a revoker writes `solo`, then makes every thread of
    /// every registered process run a full barrier (`membarrier`, `shm::solo`), then waits
    /// for `solo_busy` to fall. Either our read of `solo` comes after that barrier, and sees
    /// the revocation, or our `solo_busy` store came before it, and the revoker sees it and
    /// waits for the Release store that lowers it, after our move of `head`. Only a compiler
    /// fence is needed on this side: the barrier the revoker forces stands in for the
    /// hardware fence between our store and load.
    #[inline(always)]
    pub(crate) fn pop_solo(&self, read: impl FnOnce(CellRef<'_>)) -> Option<Result<u64, Pop>> {
        let h = self.hdr();
        h.solo_busy.store(1, Ordering::Relaxed);
        std::sync::atomic::compiler_fence(Ordering::SeqCst);
        if h.solo.load(Ordering::Acquire) != SOLO_HELD {
            h.solo_busy.store(0, Ordering::Release);
            return None;
        }
        let pos = h.head.load(Ordering::Relaxed);
        let (payload, dif) = self.consumer_lag(pos);
        let got = if dif == 0 {
            h.head.store(pos.wrapping_add(1), Ordering::Relaxed);
            read(self.readable(payload));
            Ok(pos)
        } else if dif < 0 {
            Err(Pop::Empty)
        } else {
            // Ahead of `head + 1` with no other consumer: only a scribbled word does that.
            Err(Pop::Stalled)
        };
        // Release: a revoker that reads 0 here (Acquire) sees our `head`.
        h.solo_busy.store(0, Ordering::Release);
        Some(got)
    }

    /// Ends the single-consumer mode for good (first step of a revocation, `shm::solo`):
    /// true if a consumer may have taken the mode (the caller must then run the barrier and
    /// wait while [`Ring::solo_busy`]), false if none ever did, in which case none ever will.
    pub(crate) fn solo_revoke(&self) -> bool {
        self.hdr().solo.swap(SOLO_SHARED, Ordering::AcqRel) != SOLO_FREE
    }

    /// The single-consumer mode word ([`SOLO_FREE`], [`SOLO_HELD`], [`SOLO_SHARED`]).
    #[cfg(test)]
    pub(crate) fn solo_mode(&self) -> u64 {
        self.hdr().solo.load(Ordering::Relaxed)
    }

    /// Raises the solo consumer's flag as a holder stuck inside a pop would (tests).
    #[cfg(test)]
    pub(crate) fn raise_solo_busy_for_test(&self) {
        self.hdr().solo_busy.store(1, Ordering::Relaxed);
    }

    /// Whether the solo consumer is inside [`Ring::pop_solo`] (Acquire: once false, its
    /// move of `head` is visible), and its process id (0 if not yet visible: read after the
    /// revocation's barrier, a busy holder's id always is).
    pub(crate) fn solo_busy(&self) -> (bool, u32) {
        let h = self.hdr();
        let busy = h.solo_busy.load(Ordering::Acquire) != 0;
        (busy, h.solo_pid.load(Ordering::Relaxed) as u32)
    }

    /// Hands back the end of a run this consumer claimed ([`Ring::pop_run`]): the cells
    /// `from..end` it holds and has neither read for use nor released. Moves `head` back from
    /// `end` to `from` if it is still `end`, that is, if no consumer claimed after the run;
    /// false (nothing changed) otherwise, and the caller keeps the cells.
    ///
    /// Why this is safe although `head` otherwise only grows: the cells `from..end` kept the
    /// sequence of a published entry (only a release changes it, and the producer writes a
    /// cell only after its release), so after the move they are exactly published entries
    /// nobody claimed, as before the run was claimed. A consumer that read `head` before and
    /// checks cells from there either finds `head` moved (its CAS fails) or at the very value
    /// it read, with those cells still published: its claim is then of valid entries, as if
    /// the run had never been claimed. Hand-backs nest like a stack (each needs `head` at its
    /// own `end`). The producer may have read the higher `head` for its bound
    /// ([`Ring::push_single_bounded`]): the queue then holds up to `end - from` more than the
    /// bound for a moment; it never writes a cell that is not free.
    #[inline]
    pub(crate) fn unclaim(&self, from: u64, end: u64) -> bool {
        from == end || self.hdr().head.compare_exchange(end, from, Ordering::Relaxed, Ordering::Relaxed).is_ok()
    }

    /// Reads cell `pos` of a run [`Ring::pop_run`] gave this consumer (not yet released).
    #[inline(always)]
    pub(crate) fn read_held(&self, pos: u64, read: impl FnOnce(CellRef<'_>)) {
        read(self.readable(self.cell(pos).0));
    }

    /// Frees cell `pos`, which [`Ring::pop_held`] gave this consumer, for the producers' next lap.
    #[inline]
    pub(crate) fn release(&self, pos: u64) {
        let (_, seq) = self.cell(pos);
        seq.store(pos.wrapping_add(self.mask + 1), Ordering::Release);
    }

    /// Whether consumers are stuck on this ring: the cell at `head` keeps a sequence ahead of
    /// `head + 1` (which on a healthy ring means another consumer took it and `head` is about
    /// to move) for [`MAX_REREADS`] re-reads. Only a corrupt or hostile writer makes it true;
    /// it is what made [`Ring::pop`] report [`Pop::Stalled`]. For a consumer that found no
    /// entry, on its cold path: an empty or ready ring answers after one read.
    pub(crate) fn stalled(&self) -> bool {
        let hdr = self.hdr();
        let mut pos = hdr.head.load(Ordering::Relaxed);
        for _ in 0..MAX_REREADS {
            let s = self.cell(pos).1.load(Ordering::Acquire);
            if s.wrapping_sub(pos.wrapping_add(1)) as i64 <= 0 {
                return false;
            }
            pos = hdr.head.load(Ordering::Relaxed);
        }
        true
    }

    /// Hints the CPU to fetch the cell at position `head + ahead` into this core's cache.
    /// Receive rings use it: the sender consuming request `k` prefetches `k + 1`, which the
    /// receiver wrote long ago (a full ring of posted receives), so the next message does not
    /// wait for that cache line to cross cores on its critical path. A hint only: it reads
    /// nothing and cannot fault.
    ///
    /// Fetched for writing (PREFETCHW): the consumer always writes the cell (its release
    /// stores the sequence), and a line fetched shared would need a second trip for
    /// ownership when that store comes, before the message's next locked instruction (the
    /// CQ claim) can go. CPUs without PREFETCHW run it as a NOP.
    #[inline]
    pub(crate) fn prefetch(&self, ahead: u64) {
        let pos = self.hdr().head.load(Ordering::Relaxed).wrapping_add(ahead);
        let (_, seq) = self.cell(pos);
        crate::mem::prefetch_for_write(seq as *const AtomicU64);
    }

    /// Whether cell `pos` is free under the head-tracked protocol: `pos - head < capacity`.
    /// `head_seen` is this producer's cached consumer position; it is re-read (Acquire, which
    /// orders the consumer's reads of the old payload before our writes) only when the cached
    /// value says full. A stale cache only underestimates the room: `head` never moves back.
    ///
    /// `pos` itself may be stale (a `tail` read before other producers pushed and the consumer
    /// took their entries): a fresh `head` beyond it means exactly that, not a full ring, so
    /// `pos` is re-read from `tail` (which is never behind `head`). Were `head` still beyond
    /// the fresh `tail`, the header is corrupt (hostile peer): that reads as full, so it can
    /// stall the ring, never make a producer overwrite a cell a consumer has not passed.
    #[inline]
    fn room_at(&self, pos: &mut u64, head_seen: &mut u64) -> bool {
        if pos.wrapping_sub(*head_seen) < self.capacity() {
            return true;
        }
        let hdr = self.hdr();
        *head_seen = hdr.head.load(Ordering::Acquire);
        if (head_seen.wrapping_sub(*pos) as i64) > 0 {
            *pos = hdr.tail.load(Ordering::Relaxed);
            if (head_seen.wrapping_sub(*pos) as i64) > 0 {
                return false;
            }
        }
        pos.wrapping_sub(*head_seen) < self.capacity()
    }

    /// Head-tracked push for many producers (CQs: any QP in any process completes into them).
    /// Returns false (and changes nothing) when the ring is full. Never reads a cell.
    #[inline]
    pub(crate) fn push_tracked(&self, head_seen: &mut u64, fill: impl FnOnce(CellMut<'_>)) -> bool {
        match self.claim_tracked(head_seen) {
            Some(pos) => {
                self.publish_claimed(pos, fill);
                true
            }
            None => false,
        }
    }

    /// The first half of [`Ring::push_tracked`]: claims the next cell (CAS on `tail`) without
    /// writing it; `None` when the ring is full. The claimer must publish the cell with
    /// [`Ring::publish_claimed`]: until then the consumer stops at it. A sender defers the
    /// publication of a chain's CQEs until every claim of the chain is made, so that no
    /// claim (a locked instruction, which waits for every earlier store to complete) waits
    /// for the stores into another core's cache lines that writing a CQE makes.
    #[inline]
    pub(crate) fn claim_tracked(&self, head_seen: &mut u64) -> Option<u64> {
        let hdr = self.hdr();
        let mut pos = hdr.tail.load(Ordering::Relaxed);
        let mut rereads = 0u32;
        loop {
            if !self.room_at(&mut pos, head_seen) {
                return None;
            }
            // The claim only picks a position: the cell's sequence (Release, when published)
            // publishes.
            match hdr.tail.compare_exchange_weak(pos, pos.wrapping_add(1), Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return Some(pos),
                Err(cur) => pos = cur,
            }
            // Only a peer rewriting `tail` without end keeps the CAS failing: reads as full
            // (the CQ then overruns into error).
            rereads += 1;
            if rereads >= MAX_REREADS {
                return None;
            }
        }
    }

    /// Writes and publishes cell `pos`, which [`Ring::claim_tracked`] gave this producer.
    #[inline]
    pub(crate) fn publish_claimed(&self, pos: u64, fill: impl FnOnce(CellMut<'_>)) {
        let (payload, seq) = self.cell(pos);
        fill(self.writable(payload));
        seq.store(pos.wrapping_add(1), Ordering::Release);
    }

    /// Whether [`Ring::pop_single_tracked`] would find an entry now: its own check, nothing
    /// claimed or read. For the only consumer, whose `head` no one else moves, so a true
    /// answer stays true until it pops.
    #[inline(always)]
    pub(crate) fn next_published(&self) -> bool {
        self.published_head(self.hdr()).is_some()
    }

    /// The single consumer's `head` and its cell's payload, if that cell is published: two
    /// loads (`head`, then the cell's sequence, Acquire so the payload reads come after).
    #[inline(always)]
    fn published_head(&self, hdr: &RingHeader) -> Option<(u64, *mut u8)> {
        let pos = hdr.head.load(Ordering::Relaxed);
        let (payload, seq) = self.cell(pos);
        (seq.load(Ordering::Acquire) == pos.wrapping_add(1)).then_some((pos, payload))
    }

    /// Head-tracked pop when this caller is the only consumer (the CQ's `&mut` poll).
    /// Always inlined: with the queue's drain as a second caller (`ShmCq::drain_into`), LLVM
    /// made it a call, +40 instructions per message at batch 1 (`profile_post_poll`).
    #[inline(always)]
    pub(crate) fn pop_single_tracked(&self, read: impl FnOnce(CellRef<'_>)) -> Pop {
        let hdr = self.hdr();
        let Some((pos, payload)) = self.published_head(hdr) else {
            return Pop::Empty;
        };
        read(self.readable(payload));
        // Release: the payload reads above come before any producer reuses the cell.
        hdr.head.store(pos.wrapping_add(1), Ordering::Release);
        Pop::Item
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hostile peer's writes into a receive ring (issue 15, defect 1): the sender delivering
    /// into it must fail the message with REM_OP_ERR, not spin in `Ring::pop` forever. The
    /// poster runs on its own thread so that the regression fails the test instead of hanging it.
    mod hostile_receive_ring {
        use crate::shm::layout::{key_index, recv_stride, QP_IDX_BITS};
        use crate::shm::{unit_context, Shm, ShmContext, ShmQp, ShmSrq};
        use crate::verbs::*;
        use crate::{Context, Cq, Mr, Pd, Provider, Qp, QpInitAttr};
        use std::sync::atomic::{AtomicU64, Ordering};
        use std::time::{Duration, Instant};

        /// Sends one 8-byte message from `qa` on another thread; the sender's completion
        /// status, or a panic if it took longer than 10 s.
        fn send_one(ctx: &ShmContext, pd: &<Shm as Provider>::Pd, qa: ShmQp, scq: <Shm as Provider>::Cq) -> WcStatus {
            let region = ctx.alloc_region(4096).unwrap();
            let mr = pd.reg_mr(&region, 0, 4096, AccessFlags::LOCAL_WRITE).unwrap();
            let sge = Sge::new(mr.addr(), 8, mr.lkey());
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                let (mut qa, mut scq) = (qa, scq);
                let _ = qa.post_send(&SendChain::one(SendWr::send(1).signaled(), &[sge]));
                let mut wc = [WorkCompletion::default(); 1];
                let end = Instant::now() + Duration::from_secs(5);
                while Instant::now() < end {
                    if scq.poll(&mut wc).unwrap_or(0) == 1 {
                        let _ = tx.send(wc[0].status);
                        return;
                    }
                }
            });
            let status = rx.recv_timeout(Duration::from_secs(10)).expect("post_send spun on a corrupt receive ring");
            drop((mr, region));
            status
        }

        fn open(t: &str) -> (ShmContext, <Shm as Provider>::Pd, <Shm as Provider>::Cq, <Shm as Provider>::Cq) {
            let ctx = unit_context(&format!("hostile-{t}"));
            let pd = ctx.alloc_pd().unwrap();
            let (scq, rcq) = (ctx.create_cq(16).unwrap(), ctx.create_cq(16).unwrap());
            (ctx, pd, scq, rcq)
        }

        fn qp(
            pd: &<Shm as Provider>::Pd,
            scq: &<Shm as Provider>::Cq,
            rcq: &<Shm as Provider>::Cq,
            srq: Option<&ShmSrq>,
        ) -> ShmQp {
            let attr = QpInitAttr {
                send_cq: scq,
                recv_cq: rcq,
                srq,
                cap: QpCaps::default(),
                qp_type: QpType::Rc,
                sq_sig_all: false,
            };
            pd.create_qp(&attr).unwrap()
        }

        #[test]
        fn every_srq_cell_sequence_far_ahead_fails_the_sender() {
            let (ctx, pd, scq, rcq) = open("srq");
            let srq = pd.create_srq(&SrqAttr { max_wr: 8, max_sge: 1, srq_limit: 0 }).unwrap();
            let (mut qa, mut qb) = (qp(&pd, &scq, &rcq, None), qp(&pd, &scq, &rcq, Some(&srq)));
            crate::shm::unit_connect(&mut qa, qb.qp_num(), AccessFlags::empty());
            crate::shm::unit_connect(&mut qb, qa.qp_num(), AccessFlags::empty());
            let ring = srq.shared.ring;
            for i in 0..ring.capacity() {
                ring.cell(i).1.store(1 << 62, Ordering::Relaxed);
            }
            assert_eq!(send_one(&ctx, &pd, qa, scq), WcStatus::RemOpErr);
            assert_eq!(qb.state(), QpState::Error, "the responder with the corrupt queue is in ERROR");
        }

        #[test]
        fn rq_head_at_the_top_of_u64_fails_the_sender() {
            let (ctx, pd, scq, rcq) = open("rq");
            let (mut qa, mut qb) = (qp(&pd, &scq, &rcq, None), qp(&pd, &scq, &rcq, None));
            crate::shm::unit_connect(&mut qa, qb.qp_num(), AccessFlags::empty());
            crate::shm::unit_connect(&mut qb, qa.qp_num(), AccessFlags::empty());
            let f = &ctx.inner.fabric;
            let s = f.qp_slot(key_index(qb.qp_num(), QP_IDX_BITS));
            let ring = f
                .ring(
                    s.rq_off.load(Ordering::Relaxed),
                    s.rq_cap.load(Ordering::Relaxed) as usize,
                    recv_stride(s.rq_sge.load(Ordering::Relaxed)),
                )
                .unwrap();
            // SAFETY: `head` is the header's first word, an AtomicU64 inside the mapped ring.
            unsafe { &*(ring.hdr as *const AtomicU64) }.store(u64::MAX, Ordering::Relaxed);
            assert_eq!(send_one(&ctx, &pd, qa, scq), WcStatus::RemOpErr);
            assert_eq!(qb.state(), QpState::Error);
        }
    }

    #[repr(C, align(128))]
    struct Buf([u8; 4096]);

    /// A producer whose `tail` read is stale (others pushed, the consumer took everything)
    /// and whose cached `head` says full must look again, not report the CQ full: that would
    /// put a healthy CQ into overrun error.
    #[test]
    fn tracked_push_with_a_stale_position_is_not_full() {
        let mut b = Box::new(Buf([0; 4096]));
        // SAFETY: the buffer is big enough for 4 cells of 16 bytes and private to the test.
        let r = unsafe { Ring::init(b.0.as_mut_ptr(), 4, 16) };
        let mut other = 0;
        for i in 0..6u64 {
            // SAFETY: the payload has 8 bytes.
            assert!(r.push_tracked(&mut other, |mut c| c.put(0, &i)));
            assert!(matches!(r.pop_single_tracked(|_| {}), Pop::Item));
        }
        // Read at tail 5 with head 1 cached: 5 - 1 = capacity, "full" by that view.
        let (mut pos, mut seen) = (5u64, 1u64);
        assert!(r.room_at(&mut pos, &mut seen), "empty ring reported full");
        assert_eq!((pos, seen), (6, 6), "position and head re-read");
        // And a head beyond the tail (corrupt header) reads as full, without looping.
        r.hdr().head.store(100, Ordering::Relaxed);
        let (mut pos, mut seen) = (6u64, 0u64);
        assert!(!r.room_at(&mut pos, &mut seen));
    }

    /// Cell sequences a peer set far ahead of every position: pop reports the ring stalled
    /// and push reports it full, each after a bounded number of re-reads, instead of looping.
    #[test]
    fn scribbled_sequences_stall_pop_and_push_without_looping() {
        let mut b = Box::new(Buf([0; 4096]));
        // SAFETY: the buffer is big enough for 4 cells of 16 bytes and private to the test.
        let r = unsafe { Ring::init(b.0.as_mut_ptr(), 4, 16) };
        assert!(!r.stalled(), "an empty ring is not stalled");
        for i in 0..4 {
            r.cell(i).1.store(1 << 62, Ordering::Relaxed);
        }
        assert!(matches!(r.pop(|_| unreachable!()), Pop::Stalled));
        assert!(r.stalled());
        assert!(!r.push(|_| unreachable!()));
    }

    /// A consumer descheduled between claiming a cell and freeing it while another consumer
    /// goes on: on a ring of exactly `limit` cells the producer meets the held cell and
    /// refuses with no request unclaimed (the SRQ bug the fan-out pipeline hit); the bounded
    /// push over twice the cells takes `limit` more and then refuses on the count, not on the
    /// held cell; and when the others have taken those too, the producer waits for the held
    /// cell to be freed (the `dp-perf send_bw --use-srq -q 16` failure, about 1 run in 6)
    /// instead of refusing with the queue not full.
    // Real threads and a wall-clock patience: not a loom model (tools/loom.sh builds this
    // module with `--cfg loom`, where the patience does not exist).
    #[cfg(not(loom))]
    #[test]
    fn a_consumer_descheduled_mid_pop_does_not_make_a_bounded_ring_full() {
        // Claims the cell at `head` like `pop` does, without freeing it.
        fn claim_without_free(r: &Ring) {
            let h = r.hdr().head.load(Ordering::Relaxed);
            assert_eq!(r.cell(h).1.load(Ordering::Acquire), h + 1, "a published cell");
            r.hdr().head.store(h + 1, Ordering::Relaxed);
        }
        let fill = |i: u64| move |mut c: CellMut<'_>| c.put(0, &i);
        // The old shape: 4 cells for 4 requests.
        let mut b = Box::new(Buf([0; 4096]));
        // SAFETY: the buffer is big enough for 4 cells of 16 bytes and private to the test.
        let exact = unsafe { Ring::init(b.0.as_mut_ptr(), 4, 16) };
        for i in 0..4 {
            assert!(exact.push_single(fill(i)));
        }
        claim_without_free(&exact);
        for _ in 0..3 {
            assert!(matches!(exact.pop(|_| {}), Pop::Item));
        }
        assert!(!exact.push_single(fill(9)), "the held cell blocks the exact ring");

        // SAFETY: as above, 8 cells of 16 bytes.
        let r = unsafe { Ring::init(b.0.as_mut_ptr(), 8, 16) };
        let mut seen = 0;
        for i in 0..4 {
            assert!(r.push_single_bounded(4, &mut seen, fill(i)));
        }
        assert!(!r.push_single_bounded(4, &mut seen, fill(9)), "4 unclaimed: full at the limit");
        claim_without_free(&r);
        for _ in 0..3 {
            assert!(matches!(r.pop(|_| {}), Pop::Item));
        }
        for i in 4..8 {
            assert!(r.push_single_bounded(4, &mut seen, fill(i)), "push {i} refused with {} queued", r.len());
        }
        assert!(!r.push_single_bounded(4, &mut seen, fill(9)), "the count bounds it again");
        assert!(!r.wait_held_cell(4, &mut seen), "refused on the count: no wait");
        assert_eq!(r.len(), 4);
        // The others take the 4 queued: the next push needs the held cell (position 8, the
        // cell of position 0), and is refused. Nobody frees it: the wait gives up after the
        // patience.
        for _ in 0..4 {
            assert!(matches!(r.pop(|_| {}), Pop::Item));
        }
        assert!(!r.push_single_bounded(4, &mut seen, fill(8)), "the held cell");
        let t = std::time::Instant::now();
        assert!(!r.wait_held_cell(4, &mut seen), "a cell never freed");
        assert!(t.elapsed() >= HELD_CELL_PATIENCE);
        // Its consumer frees it 20 ms into the wait: the wait says so, the push succeeds.
        let start = std::time::Instant::now();
        std::thread::scope(|sc| {
            sc.spawn(|| {
                std::thread::sleep(std::time::Duration::from_millis(20));
                // What `pop` stores after reading: position 0 + capacity.
                r.cell(0).1.store(8, Ordering::Release);
            });
            assert!(r.wait_held_cell(4, &mut seen), "waited for the held cell");
        });
        assert!(start.elapsed() >= std::time::Duration::from_millis(20));
        assert!(r.push_single_bounded(4, &mut seen, fill(8)));
        assert!(matches!(r.pop(|c| assert_eq!(c.get::<u64>(0), 8)), Pop::Item));
        // A ring bounded by its cells alone (a QP's receive queue) never waits: full is full.
        assert!(!r.wait_held_cell(u64::MAX, &mut seen));
        // A head beyond the tail (a hostile peer) reads as full.
        r.hdr().head.store(100, Ordering::Relaxed);
        let mut seen = 0;
        assert!(!r.push_single_bounded(4, &mut seen, fill(9)));
    }

    /// `pop_run` claims the published entries at `head`, at most `max`, with one move of
    /// `head`; the run's cells stay held (a push cannot reuse them) until released.
    #[test]
    fn pop_run_claims_what_is_published_and_holds_it() {
        let mut b = Box::new(Buf([0; 4096]));
        // SAFETY: the buffer is big enough for 4 cells of 16 bytes and private to the test.
        let r = unsafe { Ring::init(b.0.as_mut_ptr(), 4, 16) };
        for v in 1..=3u64 {
            assert!(r.push(|mut c| c.put(0, &v)));
        }
        let mut first = 0u64;
        let Ok((pos, k)) = r.pop_run(8, |c| first = c.get(0)) else { panic!("a ready ring") };
        assert_eq!((pos, k, first, r.head_pos()), (0, 3, 1, 3));
        let mut third = 0u64;
        r.read_held(2, |c| third = c.get(0));
        assert_eq!(third, 3);
        assert!(matches!(r.pop_run(8, |_| ()), Err(Pop::Empty)));
        assert!(r.push(|mut c| c.put(0, &4u64)), "the fourth cell is free");
        assert!(!r.push(|mut c| c.put(0, &5u64)), "the held first cell is not");
        for p in 0..3 {
            r.release(p);
        }
        assert!(r.push(|mut c| c.put(0, &5u64)));
        let Ok((pos, k)) = r.pop_run(1, |c| first = c.get(0)) else { panic!("a ready ring") };
        assert_eq!((pos, k, first), (3, 1, 4), "max 1 claims one");
    }

    /// `push_run_while` pushes in order what `push_single_bounded` would, one at a
    /// time: it stops at the bound (re-reading a stale cached `head` first), at a cell a
    /// consumer still holds, and at a corrupt `head`; it never reads `head` with no bound.
    #[test]
    fn run_push_stops_where_single_pushes_would() {
        let mut b = Box::new(Buf([0; 4096]));
        // SAFETY: the buffer is big enough for 8 cells of 16 bytes and private to the test.
        let r = unsafe { Ring::init(b.0.as_mut_ptr(), 8, 16) };
        let vals = [10u64, 11, 12, 13, 14, 15];
        let put = |i: usize, mut c: CellMut<'_>| c.put(0, &vals[i]);
        let mut seen = 0;
        assert_eq!(r.push_run_while(4, &mut seen, 6, |_| true, put), 4, "the bound stops it");
        assert_eq!(r.push_run_while(4, &mut seen, 1, |_| true, put), 0);
        for want in 10..12u64 {
            assert!(matches!(r.pop(|c| assert_eq!(c.get::<u64>(0), want)), Pop::Item));
        }
        // The cached head is stale (0): the push re-reads it and finds room for 2.
        assert_eq!(r.push_run_while(4, &mut seen, 6, |_| true, put), 2);
        assert_eq!((seen, r.len()), (2, 4));
        for want in [12u64, 13, 10, 11] {
            assert!(matches!(r.pop(|c| assert_eq!(c.get::<u64>(0), want)), Pop::Item));
        }
        // Positions 6..8 are free, position 8 (cell 0) is held by a consumer that claimed it
        // and has not freed it: no bound, the cells stop the run at 2.
        let h = r.hdr().head.load(Ordering::Relaxed);
        assert_eq!(h, 6);
        r.cell(0).1.store(1, Ordering::Release);
        let mut never = 0;
        assert_eq!(r.push_run_while(u64::MAX, &mut never, 6, |_| true, put), 2);
        assert_eq!((never, r.hdr().head.load(Ordering::Relaxed)), (0, 6), "no bound: head not read");
        r.cell(0).1.store(8, Ordering::Release);
        assert_eq!(r.push_run_while(u64::MAX, &mut never, 1, |_| true, put), 1, "freed, it is pushed");
        // A head beyond the tail (a hostile peer) reads as full under a bound.
        r.hdr().head.store(100, Ordering::Relaxed);
        let mut seen = 0;
        assert_eq!(r.push_run_while(4, &mut seen, 3, |_| true, put), 0);
    }

    #[test]
    fn fifo_full_empty_and_wrap() {
        let mut b = Box::new(Buf([0; 4096]));
        // SAFETY: the buffer is big enough for 4 cells of 16 bytes and private to the test.
        let r = unsafe { Ring::init(b.0.as_mut_ptr(), 4, 16) };
        for round in 0..3u64 {
            for i in 0..4u64 {
                // SAFETY: the payload has 8 bytes.
                assert!(r.push(|mut c| c.put(0, &(round * 10 + i))));
            }
            assert!(!r.push(|_| unreachable!()));
            assert_eq!(r.len(), 4);
            for i in 0..4u64 {
                let mut v = 0;
                // SAFETY: the payload has 8 bytes.
                assert!(matches!(r.pop(|c| v = c.get(0)), Pop::Item));
                assert_eq!(v, round * 10 + i);
            }
            assert!(matches!(r.pop(|_| unreachable!()), Pop::Empty));
        }
    }

    #[test]
    fn single_producer_push_fills_wraps_and_reports_full() {
        let mut b = Box::new(Buf([0; 4096]));
        // SAFETY: the buffer is big enough for 4 cells of 16 bytes and private to the test.
        let r = unsafe { Ring::init(b.0.as_mut_ptr(), 4, 16) };
        for round in 0..3u64 {
            for i in 0..4u64 {
                // SAFETY: the payload has 8 bytes.
                assert!(r.push_single(|mut c| c.put(0, &(round * 10 + i))));
            }
            assert!(!r.push_single(|_| unreachable!()), "a full ring must refuse without writing");
            assert_eq!(r.len(), 4);
            for i in 0..4u64 {
                let mut v = 0;
                // SAFETY: the payload has 8 bytes.
                assert!(matches!(r.pop(|c| v = c.get(0)), Pop::Item));
                assert_eq!(v, round * 10 + i);
            }
            assert_eq!(r.len(), 0);
        }
    }

    #[test]
    fn single_producer_many_consumers_lose_nothing() {
        let mut b = Box::new(Buf([0; 4096]));
        // SAFETY: 64 cells × 16 bytes + header fit in 4096 bytes.
        let r = unsafe { Ring::init(b.0.as_mut_ptr(), 64, 16) };
        const N: u64 = 40_000;
        let taken: Vec<Vec<u64>> = std::thread::scope(|s| {
            let consumers: Vec<_> = (0..3)
                .map(|_| {
                    s.spawn(move || {
                        let mut got = Vec::new();
                        // Stop after the sentinel (one per consumer) arrives.
                        loop {
                            let mut v = 0u64;
                            // SAFETY: 8-byte payload.
                            match r.pop(|c| v = c.get(0)) {
                                Pop::Item if v == u64::MAX => break got,
                                Pop::Item => got.push(v),
                                Pop::Empty => std::hint::spin_loop(),
                                Pop::Stalled => panic!("a healthy ring under contention reported stalled"),
                            }
                        }
                    })
                })
                .collect();
            for i in (0..N).chain([u64::MAX; 3]) {
                // SAFETY: 8-byte payload.
                while !r.push_single(|mut c| c.put(0, &i)) {
                    std::hint::spin_loop();
                }
            }
            consumers.into_iter().map(|c| c.join().unwrap()).collect()
        });
        let mut all: Vec<u64> = taken.iter().flatten().copied().collect();
        for t in &taken {
            assert!(t.windows(2).all(|w| w[0] < w[1]), "each consumer sees entries in order");
        }
        all.sort_unstable();
        assert_eq!(all, (0..N).collect::<Vec<_>>(), "every entry taken exactly once");
    }

    #[test]
    fn many_producers_one_consumer_lose_nothing() {
        let mut b = Box::new(Buf([0; 4096]));
        let base = b.0.as_mut_ptr();
        // SAFETY: 64 cells × 16 bytes + header fit in 4096 bytes.
        let r = unsafe { Ring::init(base, 64, 16) };
        const N: u64 = 20_000;
        let mut seen = vec![0u32; 4];
        std::thread::scope(|s| {
            for t in 0..4u64 {
                s.spawn(move || {
                    let mut seen = 0;
                    for i in 0..N {
                        // SAFETY: 8-byte payload.
                        while !r.push_tracked(&mut seen, |mut c| c.put(0, &(t << 32 | i))) {
                            std::hint::spin_loop();
                        }
                    }
                });
            }
            let mut next = [0u64; 4];
            let mut got = 0;
            while got < 4 * N {
                let mut v = 0u64;
                // SAFETY: 8-byte payload.
                if let Pop::Item = r.pop_single_tracked(|c| v = c.get(0)) {
                    let t = (v >> 32) as usize;
                    assert_eq!(v & 0xffff_ffff, next[t], "per-producer order");
                    next[t] += 1;
                    seen[t] += 1;
                    got += 1;
                }
            }
        });
        assert_eq!(seen, vec![N as u32; 4]);
    }
}

/// Model checking of the ring's three protocols with loom: every interleaving (up to
/// `LOOM_MAX_PREEMPTIONS`) of small producer/consumer runs, checking that every entry is
/// taken exactly once and that no payload is read while it is written. Payloads go through
/// loom's `UnsafeCell` (one per cell, found from the payload pointer the ring hands out), so
/// loom reports a payload access the cell's sequence does not order — a consumer reading a
/// cell before its producer published it, or a producer reusing a cell a consumer has not
/// finished. Run: `tools/loom.sh`.
#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::cell::UnsafeCell;
    use loom::sync::atomic::AtomicUsize;
    use loom::sync::Arc;
    use loom::thread;

    const STRIDE: usize = SEQ_LEN.next_multiple_of(8) + 8;

    /// A ring over its own 128-aligned memory, with a loom cell per ring cell for payloads.
    struct Model {
        base: *mut u8,
        layout: std::alloc::Layout,
        ring: Ring,
        slots: Vec<UnsafeCell<u64>>,
        taken: Vec<AtomicUsize>,
    }

    // SAFETY: the raw memory is only reached through the ring's atomics and the loom cells.
    unsafe impl Send for Model {}
    // SAFETY: as above.
    unsafe impl Sync for Model {}

    impl Model {
        fn new(cap: usize, values: usize) -> Arc<Model> {
            let layout = std::alloc::Layout::from_size_align(Ring::bytes(cap, STRIDE), 128).unwrap();
            // SAFETY: a non-zero size.
            let base = unsafe { std::alloc::alloc_zeroed(layout) };
            // SAFETY: fresh memory of the right size and alignment, private until shared below.
            let ring = unsafe { Ring::init(base, cap, STRIDE) };
            Arc::new(Model {
                base,
                layout,
                ring,
                slots: (0..cap).map(|_| UnsafeCell::new(0)).collect(),
                taken: (0..values).map(|_| AtomicUsize::new(0)).collect(),
            })
        }

        /// The cell a payload pointer belongs to.
        fn slot(&self, p: *const u8) -> &UnsafeCell<u64> {
            let cells = self.base as usize + RING_HEADER_LEN;
            &self.slots[(p as usize - cells - SEQ_LEN) / STRIDE]
        }

        fn fill(&self, v: u64) -> impl FnOnce(CellMut<'_>) + '_ {
            move |c| self.slot(c.as_ptr()).with_mut(|x| unsafe { *x = v })
        }

        /// Records a taken value; each must be taken once.
        fn take(&self, c: CellRef<'_>) {
            let v = self.slot(c.as_ptr()).with(|x| unsafe { *x });
            assert_eq!(self.taken[v as usize].fetch_add(1, Ordering::Relaxed), 0, "value {v} taken twice");
        }

        fn all_taken_once(&self) {
            for (v, t) in self.taken.iter().enumerate() {
                assert_eq!(t.load(Ordering::Relaxed), 1, "value {v} taken {} times", t.load(Ordering::Relaxed));
            }
        }
    }

    impl Drop for Model {
        fn drop(&mut self) {
            // SAFETY: allocated in `new` with this layout; no view outlives the model.
            unsafe { std::alloc::dealloc(self.base, self.layout) };
        }
    }

    /// Ends a model: after every thread joined, pushes what they could not (`push`) and
    /// takes everything left (`pop`), one after the other, so every value goes through.
    fn finish(m: &Model, pending: Vec<u64>, push: impl Fn(&Model, u64) -> bool, pop: impl Fn(&Model) -> Pop) {
        let mut pending = pending;
        loop {
            while matches!(pop(m), Pop::Item) {}
            let Some(v) = pending.pop() else { break };
            assert!(push(m, v), "a drained ring refused a push");
        }
        m.all_taken_once();
    }

    /// Spawns `threads` consumers that each `pop` singly `pops` times, none waiting (an
    /// empty pop counts); a stalled pop fails the model.
    fn spawn_poppers(m: &Arc<Model>, threads: usize, pops: usize) -> Vec<thread::JoinHandle<()>> {
        (0..threads)
            .map(|_| {
                let m = m.clone();
                thread::spawn(move || {
                    for _ in 0..pops {
                        assert!(!matches!(m.ring.pop(|p| m.take(p)), Pop::Stalled), "a healthy ring stalled");
                    }
                })
            })
            .collect()
    }

    fn join(threads: Vec<thread::JoinHandle<()>>) {
        for t in threads {
            t.join().unwrap();
        }
    }

    /// A receive queue / SRQ: one producer (`push_single_bounded`, the owner's post; limit 1
    /// over 2 cells, so cells are reused) racing two consumers (`pop`, senders on two threads).
    /// No thread waits: a refused push or an empty pop is retried after the join.
    #[test]
    fn loom_srq_one_producer_two_consumers() {
        loom::model(|| {
            let m = Model::new(2, 3);
            let consumers = spawn_poppers(&m, 2, 2);
            let mut head_seen = 0;
            let pending: Vec<u64> =
                (0..3).filter(|&v| !m.ring.push_single_bounded(1, &mut head_seen, m.fill(v))).collect();
            join(consumers);
            finish(&m, pending, |m, v| m.ring.push_single_bounded(1, &mut 0, m.fill(v)), |m| m.ring.pop(|p| m.take(p)));
        });
    }

    /// An SRQ refilled in runs: one producer (`push_run_while`, the worker's
    /// refill: runs of up to three under a bound of 2 over 2 cells) racing two consumers
    /// (`pop`). What a run does not push is pushed after the join, one at a time.
    #[test]
    fn loom_srq_run_producer_two_consumers() {
        loom::model(|| {
            let m = Model::new(2, 4);
            let consumers = spawn_poppers(&m, 2, 2);
            let mut head_seen = 0;
            let mut next = 0u64;
            for want in [3usize, 3] {
                let left = (4 - next as usize).min(want);
                let base = next;
                next +=
                    m.ring.push_run_while(2, &mut head_seen, left, |_| true, |i, c| m.fill(base + i as u64)(c)) as u64;
            }
            let pending: Vec<u64> = (next..4).rev().collect();
            join(consumers);
            finish(&m, pending, |m, v| m.ring.push_single_bounded(2, &mut 0, m.fill(v)), |m| m.ring.pop(|p| m.take(p)));
        });
    }

    /// A sender that claims a run of two and hands the second back (`unclaim`, a post list
    /// whose later SEND failed its checks), racing a consumer that pops singly and the
    /// producer (`push_single_bounded` with no bound beyond the cells): every value is taken
    /// once, by whoever gets it, whether the hand-back succeeded or its cell was flushed (here:
    /// taken by the runner itself, as `return_run` completes it). Five preemptions, not
    /// loom.sh's three: a hand-back that moved `head` unconditionally lost a value only in
    /// an interleaving with four (checked by planting that bug).
    #[test]
    fn loom_run_handed_back_races_a_consumer() {
        let mut model = loom::model::Builder::new();
        model.preemption_bound = Some(5);
        model.check(|| {
            let m = Model::new(2, 3);
            let runner = {
                let m = m.clone();
                thread::spawn(move || {
                    if let Ok((pos, k)) = m.ring.pop_run(2, |p| m.take(p)) {
                        m.ring.release(pos);
                        if k == 2 && !m.ring.unclaim(pos + 1, pos + 2) {
                            m.ring.read_held(pos + 1, |p| m.take(p));
                            m.ring.release(pos + 1);
                        }
                    }
                })
            };
            let single = spawn_poppers(&m, 1, 1);
            let mut head_seen = 0;
            let pending: Vec<u64> =
                (0..3).filter(|&v| !m.ring.push_single_bounded(u64::MAX, &mut head_seen, m.fill(v))).collect();
            runner.join().unwrap();
            join(single);
            finish(
                &m,
                pending,
                |m, v| m.ring.push_single_bounded(u64::MAX, &mut 0, m.fill(v)),
                |m| m.ring.pop(|p| m.take(p)),
            );
            // And the ring is whole: every position pushed was consumed, none twice.
            assert_eq!((m.ring.head_pos(), m.ring.tail_pos()), (3, 3));
        });
    }

    /// A receive queue drained in runs: one producer (`push_single_bounded` with no bound
    /// beyond the cells, as a QP's RQ; three values over two cells) racing a consumer that
    /// claims runs of up to two (`pop_run`, the drainer) and one that pops singly (a sender
    /// on the sender-side path).
    #[test]
    fn loom_rq_run_consumer_and_single_consumer() {
        fn pop_run(m: &Model) -> Pop {
            match m.ring.pop_run(2, |p| m.take(p)) {
                Ok((pos, k)) => {
                    for i in 1..k {
                        m.ring.read_held(pos + i, |p| m.take(p));
                    }
                    for i in 0..k {
                        m.ring.release(pos + i);
                    }
                    Pop::Item
                }
                Err(p) => p,
            }
        }
        loom::model(|| {
            let m = Model::new(2, 3);
            let runner = {
                let m = m.clone();
                thread::spawn(move || {
                    for _ in 0..2 {
                        assert!(!matches!(pop_run(&m), Pop::Stalled), "a healthy ring stalled");
                    }
                })
            };
            let single = spawn_poppers(&m, 1, 1);
            let mut head_seen = 0;
            let pending: Vec<u64> =
                (0..3).filter(|&v| !m.ring.push_single_bounded(u64::MAX, &mut head_seen, m.fill(v))).collect();
            runner.join().unwrap();
            join(single);
            finish(&m, pending, |m, v| m.ring.push_single_bounded(u64::MAX, &mut 0, m.fill(v)), pop_run);
        });
    }

    /// A CQ: two producers (`push_tracked`, each with its own cached head) racing the single
    /// consumer (`pop_single_tracked`, the poll), four values over two cells.
    #[test]
    fn loom_cq_two_producers_one_consumer() {
        loom::model(|| {
            let m = Model::new(2, 4);
            let producers: Vec<_> = (0..2u64)
                .map(|t| {
                    let m = m.clone();
                    thread::spawn(move || {
                        let mut head_seen = 0;
                        [2 * t, 2 * t + 1]
                            .into_iter()
                            .filter(|&v| !m.ring.push_tracked(&mut head_seen, m.fill(v)))
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            for _ in 0..2 {
                let _ = m.ring.pop_single_tracked(|p| m.take(p));
            }
            let pending: Vec<u64> = producers.into_iter().flat_map(|p| p.join().unwrap()).collect();
            finish(
                &m,
                pending,
                |m, v| m.ring.push_tracked(&mut 0, m.fill(v)),
                |m| m.ring.pop_single_tracked(|p| m.take(p)),
            );
        });
    }

    /// An event ring: the freeing protocol, two producers (`push`) racing two consumers
    /// (`pop`), three values over two cells.
    #[test]
    fn loom_mpmc_two_producers_two_consumers() {
        loom::model(|| {
            let m = Model::new(2, 3);
            let producer = {
                let m = m.clone();
                thread::spawn(move || [0u64, 1].into_iter().filter(|&v| !m.ring.push(m.fill(v))).collect::<Vec<_>>())
            };
            let consumer = {
                let m = m.clone();
                thread::spawn(move || {
                    let _ = m.ring.pop(|p| m.take(p));
                })
            };
            let mut pending = Vec::new();
            if !m.ring.push(m.fill(2)) {
                pending.push(2);
            }
            let _ = m.ring.pop(|p| m.take(p));
            consumer.join().unwrap();
            pending.extend(producer.join().unwrap());
            finish(&m, pending, |m, v| m.ring.push(m.fill(v)), |m| m.ring.pop(|p| m.take(p)));
        });
    }
}

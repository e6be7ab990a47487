//! The message queue of receiver-side delivery (docs/shm-provider.md, "Next design step"): a
//! bounded queue of 128-byte cells in the receiver's memory, written by any number of senders
//! and drained by one drainer at a time, in which a small message crosses cores as one cache
//! line.
//!
//! The protocol (Vyukov's bounded queue with lap claims, the shape of UCX posix's FIFO):
//! - A sender claims `n` consecutive positions of a post list with one `fetch_add` on `tail`
//!   ([`MsgQueue::claim`]). A position is its own from then on, so per message it needs no
//!   further locked instruction.
//! - Cell `pos % cells` is free for position `pos` once every position of the previous lap
//!   was drained: `pos < head + cells`, `head` being what drainers published
//!   ([`MsgQueue::write`] checks it against the sender's cached copy of `head`, re-read with
//!   one Acquire load only when the copy says no, and refuses otherwise, so the caller
//!   decides whether to wait or park: `post_send` must not block). The sender writes the
//!   header and payload words (Relaxed) and publishes with a Release store of `pos + 1` to
//!   the cell's sequence word.
//! - A drainer takes the queue's drain lock for a burst ([`MsgQueue::try_drain`]: one CAS;
//!   any thread of any process mapping the queue may drain, so that a sender can deliver
//!   for a receiver that does not poll, as a responder NIC would). It reads the cell at
//!   `head` once its sequence is `head + 1` (Acquire, which orders the payload loads after
//!   it), and writes nothing to the cell. When the burst ends ([`Drain`] dropped) it
//!   publishes `head` (Release: its reads of the cells come first) and releases the lock:
//!   once per burst, not per message. That store both acknowledges the messages
//!   ([`MsgQueue::acked`]) and frees their cells for the next lap.
//!
//! Why cells are freed through `head` and not each by its own sequence word (Vyukov's
//! `seq = pos + cells`, which this queue did until session 34): that store was the drainer's
//! only write to a line the sender writes next, so every message cost the drainer a
//! read-for-ownership of a remote line, and the locked instruction that follows in the drain
//! (the receive queue's `head` CAS, `recvq::pop_held`) waited for it: half of that function's
//! samples sat on the CAS (`perf`, `send_bw -l 32`). Without it a message's cell crosses
//! cores once per lap instead of twice; `send_bw -l 32` 1.065x, `-l 1` 1.10x, `-b` 1.12x
//! (bench-ab, 9 rounds; docs/benchmarks.md, session 34). The price: cells free once per burst rather
//! than once per message, which a queue as deep as its CQ does not feel.
//!
//! Why lap claims and not credits (a sender checking a cached `head` before it claims): with
//! several senders a credit check and a claim would race, and session 17 measured lap
//! claims as fast or faster with one sender too: see docs/shm-provider.md, "Its ceiling,
//! measured". The cached `head` of `write` is checked after the claim, for a position that
//! is already the sender's own, so it races with nobody.
//!
//! Trust boundary: a peer can write any word of the header or the cells. The local view keeps
//! its own copy of the mask (never re-read from shared memory) and every index is masked, so
//! a hostile word can stall the queue or garble a message but never move an access outside
//! it; a length above [`PAYLOAD_MAX`] reads as [`PAYLOAD_MAX`].
//!
//! Not here yet (the transport built on it must add them): skipping the cell of a sender that
//! claimed and died (a claim that is never written stops the drainer at it; docs/shm-provider.md
//! plans per-process claim records checked against the fabric's liveness test, since a
//! timeout alone would race a writer that is only slow), recovering the drain lock of a
//! drainer that died, and payloads larger than a cell.

#[cfg(loom)]
use loom::sync::atomic::{AtomicU64, Ordering};
#[cfg(not(loom))]
use std::sync::atomic::{AtomicU64, Ordering};

/// Payload words a cell carries after its sequence and header words.
pub const PAYLOAD_WORDS: usize = 6;

/// Payload bytes a cell carries.
pub const PAYLOAD_MAX: usize = PAYLOAD_WORDS * 8;

/// One cell: a message in one cache line, padded to a pair (larger under loom, whose atomics
/// are larger). The pad is there for the adjacent-line prefetcher, which moves 128-byte pairs
/// of lines: with 64-byte cells a receiver reading message `k` pulled in the line its sender
/// was about to write message `k + 1` into, and the sender's store then had to take it back.
/// `send_bw -l 32` 8 B: 1.08x with the pad in the VM's fast placement, 1.34-1.40x in its slow
/// one (`tools/bench-ab`, 7-9 rounds; `-l 1` and `send_lat` unchanged), at twice the queue's
/// memory. The loss was largest when the sender is quick (a hot source buffer, as perftest
/// reuses one page).
#[repr(C, align(128))]
struct Cell {
    /// `pos + 1` once the message of position `pos` is written, kept until the next lap's
    /// message replaces it (`i`, never a `pos + 1` of this cell, before the first lap).
    seq: AtomicU64,
    /// Length in the low 16 bits, the sender's tag in the next 16, immediate in the high 32.
    hdr: AtomicU64,
    data: [AtomicU64; PAYLOAD_WORDS],
}

/// The shared positions, each on its own pair of cache lines (the adjacent-line prefetcher
/// pulls lines in pairs).
#[repr(C, align(128))]
struct Header {
    /// Positions claimed by senders.
    tail: AtomicU64,
    _pad0: [u8; 120],
    /// Messages drained, published once per burst.
    head: AtomicU64,
    /// The drain lock: 1 while a drainer holds it. On `head`'s line: only drainers write both.
    lock: AtomicU64,
    _pad1: [u8; 112],
}

/// Alignment the memory of a queue needs.
pub const ALIGN: usize = 128;

/// A process-local view of a message queue in shared memory: what a sender uses.
#[derive(Clone, Copy, Debug)]
pub struct MsgQueue {
    hdr: *const Header,
    cells: *const Cell,
    mask: u64,
}

// SAFETY: the queue is reached only through atomics; whoever made the view keeps the mapping
// alive for as long as it is used (the `init`/`attach` contract).
unsafe impl Send for MsgQueue {}
// SAFETY: as above.
unsafe impl Sync for MsgQueue {}

/// Why [`MsgQueue::write`] wrote nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Busy {
    /// The cell still holds the message of the previous lap: the receiver has not consumed
    /// it yet. Try again later (the transport bounds the wait with its RNR timer).
    NotFree,
}

/// A message as read out of a cell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delivered {
    /// Its position in the queue.
    pub pos: u64,
    /// Payload length in bytes, at most [`PAYLOAD_MAX`].
    pub len: u32,
    /// The tag the sender wrote (the transport names the receiving QP with it).
    pub tag: u16,
    /// The immediate the sender wrote.
    pub imm: u32,
    /// The cell's payload words: the first `len.div_ceil(8)` are the message's; the rest are
    /// whatever the cell holds (its sender's padding, zero from this module's writers).
    pub words: [u64; PAYLOAD_WORDS],
}

impl Delivered {
    /// Copies the payload into `dst`; returns the bytes copied (the payload's length, or
    /// `dst`'s if it is shorter).
    pub fn copy_to(&self, dst: &mut [u8]) -> usize {
        let n = (self.len as usize).min(dst.len());
        for (out, w) in dst[..n].chunks_mut(8).zip(self.words) {
            out.copy_from_slice(&w.to_le_bytes()[..out.len()]);
        }
        n
    }
}

impl MsgQueue {
    /// Bytes a queue of `cells` cells occupies.
    pub fn bytes(cells: usize) -> usize {
        std::mem::size_of::<Header>() + cells * std::mem::size_of::<Cell>()
    }

    /// Initialises a queue of `cells` cells at `base`, empty (`head` and `tail` 0).
    ///
    /// # Safety
    /// `base` must point to [`MsgQueue::bytes`]`(cells)` writable bytes aligned to [`ALIGN`],
    /// not yet visible to any other thread or process, that stay mapped for as long as any
    /// view of the queue is used.
    ///
    /// # Panics
    /// If `cells` is not a power of two of at least 2 (kept from the per-cell freeing, where
    /// with one cell "written for position `p`" and "free for position `p + 1`" were the same
    /// sequence word; a queue of one cell serves nobody anyway).
    pub unsafe fn init(base: *mut u8, cells: usize) -> MsgQueue {
        assert!(cells.is_power_of_two() && cells >= 2, "a message queue's size must be a power of two, at least 2");
        let hdr = base as *mut Header;
        let first = base.wrapping_add(std::mem::size_of::<Header>()) as *mut Cell;
        // SAFETY: per the contract, the memory is ours to initialise, aligned and large enough
        // for the header and `cells` cells, and nobody else sees it yet; the words are written
        // as fresh atomics (under loom an atomic must be created before it is used).
        unsafe {
            std::ptr::write(
                hdr,
                Header {
                    tail: AtomicU64::new(0),
                    _pad0: [0; 120],
                    head: AtomicU64::new(0),
                    lock: AtomicU64::new(0),
                    _pad1: [0; 112],
                },
            );
            for i in 0..cells {
                std::ptr::write(
                    first.add(i),
                    Cell {
                        seq: AtomicU64::new(i as u64),
                        hdr: AtomicU64::new(0),
                        data: std::array::from_fn(|_| AtomicU64::new(0)),
                    },
                );
            }
        }
        MsgQueue { hdr, cells: first, mask: cells as u64 - 1 }
    }

    /// A view of a queue another thread or process initialised at `base` (its own mapping
    /// of the same memory).
    ///
    /// # Safety
    /// As [`init`](Self::init), except that the memory must hold a queue of `cells` cells
    /// that [`init`](Self::init) initialised (through any mapping).
    pub unsafe fn attach(base: *mut u8, cells: usize) -> MsgQueue {
        assert!(cells.is_power_of_two() && cells >= 2, "a message queue's size must be a power of two, at least 2");
        let first = base.wrapping_add(std::mem::size_of::<Header>()) as *const Cell;
        MsgQueue { hdr: base as *const Header, cells: first, mask: cells as u64 - 1 }
    }

    /// Cells in the queue.
    pub fn capacity(&self) -> u64 {
        self.mask + 1
    }

    fn header(&self) -> &Header {
        // SAFETY: `init`/`attach` made `hdr` point to an initialised header that stays mapped
        // while the view is used.
        unsafe { &*self.hdr }
    }

    fn cell(&self, pos: u64) -> &Cell {
        // SAFETY: the index is masked with our own copy of the mask, so it is within the
        // `cells` cells `init`/`attach` vouched for.
        unsafe { &*self.cells.add((pos & self.mask) as usize) }
    }

    /// Claims `n` consecutive positions (a post list's messages); returns the first. Each
    /// claimed position must then be written, in any order: the receiver stops at a
    /// position that is claimed but unwritten.
    #[inline]
    pub fn claim(&self, n: u64) -> u64 {
        // Relaxed: the claim only picks positions; each cell's sequence word carries the
        // synchronisation.
        self.header().tail.fetch_add(n, Ordering::Relaxed)
    }

    /// Writes a message of `len` bytes (the first `len.div_ceil(8)` of `words`, little-endian,
    /// are its bytes; the rest of `words` is stored too and never read; a length above
    /// [`PAYLOAD_MAX`], or above what `words` holds, is cut to it, so no byte of an earlier
    /// message is ever read as this one's) with `tag` and immediate `imm` at
    /// claimed position `pos`, and publishes it. Refuses, writing nothing, while the cell
    /// still holds the previous lap's message (undrained, or drained in a burst that has not
    /// ended).
    ///
    /// `acked` is the caller's copy of the queue's `head` (start it at 0, and never carry it
    /// to another queue: a copy above the real `head` would let a write overwrite an unread
    /// message): re-read only when it says the cell is not free, so that a sender whose
    /// queue keeps up reads no line the drainer writes.
    #[inline]
    pub fn write(&self, pos: u64, acked: &mut u64, len: u32, tag: u16, imm: u32, words: &[u64]) -> Result<(), Busy> {
        let mut all = [0u64; PAYLOAD_WORDS];
        let n = words.len().min(PAYLOAD_WORDS);
        all[..n].copy_from_slice(&words[..n]);
        self.write_words(pos, acked, len.min(n as u32 * 8), tag, imm, all)
    }

    /// [`write`](Self::write) of a whole cell's words, passed by value: a sender's post
    /// keeps them in registers up to the cell's stores. Through a slice they were stored to
    /// the stack and loaded back (a reference needs memory), six stores per queued SEND,
    /// and every store a post makes waits in the store buffer behind the previous cell's,
    /// a line the receiver holds (docs/benchmarks.md, session 57).
    #[inline(always)]
    pub fn write_words(
        &self,
        pos: u64,
        acked: &mut u64,
        len: u32,
        tag: u16,
        imm: u32,
        words: [u64; PAYLOAD_WORDS],
    ) -> Result<(), Busy> {
        if pos >= acked.wrapping_add(self.capacity()) {
            // Acquire: pairs with the drainer's Release publication of `head`, so its reads
            // of the previous lap's messages happen before our stores below overwrite them.
            *acked = self.acked();
            if pos >= acked.wrapping_add(self.capacity()) {
                return Err(Busy::NotFree);
            }
        }
        let c = self.cell(pos);
        let len = len.min(PAYLOAD_MAX as u32);
        c.hdr.store(u64::from(len) | (u64::from(tag) << 16) | (u64::from(imm) << 32), Ordering::Relaxed);
        // Every word is stored (unrolled stores instead of a loop over `len`); the receiver
        // reads only the first `len.div_ceil(8)`, so words past the message are never read
        // as its bytes.
        for (d, w) in c.data.iter().zip(words) {
            d.store(w, Ordering::Relaxed);
        }
        // Release: the header and payload stores above are visible to whoever sees this.
        c.seq.store(pos + 1, Ordering::Release);
        Ok(())
    }

    /// Messages drained (as of the last drain burst's end): every position below it was
    /// delivered. A sender's acknowledgement.
    #[inline]
    pub fn acked(&self) -> u64 {
        // Acquire: pairs with the drainer's Release publication.
        self.header().head.load(Ordering::Acquire)
    }

    /// Whether the message at the last published head is written: a hint read without the
    /// lock (two loads), so that a poll finding nothing costs no locked instruction. It can
    /// say false while a drainer is mid-burst (that drainer delivers what there is); when it
    /// says true, the head's message was written and not yet taken when it looked.
    #[inline]
    pub fn ready(&self) -> bool {
        let head = self.header().head.load(Ordering::Relaxed);
        self.cell(head).seq.load(Ordering::Relaxed) == head + 1
    }

    /// Takes the drain lock for a burst; `None` if another drainer holds it (it will deliver
    /// what is there). The lock is released, and `head` published, when the [`Drain`] drops.
    ///
    /// A drainer that dies holding the lock stops delivery; nothing here recovers it yet.
    #[inline]
    pub fn try_drain(&self) -> Option<Drain> {
        let h = self.header();
        // Acquire: the previous drainer's cell frees and its `head` come before our reads.
        h.lock.compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed).ok()?;
        // Relaxed: only a lock holder writes `head`, and the lock's Acquire ordered the last
        // holder's store before this load.
        let head = h.head.load(Ordering::Relaxed);
        Some(Drain { q: *self, head, start: head })
    }
}

/// A drain burst: the holder of a queue's drain lock. Dropping it publishes `head` and
/// releases the lock.
#[derive(Debug)]
pub struct Drain {
    q: MsgQueue,
    head: u64,
    start: u64,
}

impl Drain {
    /// The next position to be delivered.
    pub fn head(&self) -> u64 {
        self.head
    }

    /// Takes the message at the head if it is written: reads it and advances (the cell is
    /// freed for the next lap when `head` is published, [`Drain::publish`] or the drop).
    /// `None` if the head position is not written yet (none was claimed, or its sender is
    /// still writing it).
    #[inline]
    pub fn poll(&mut self) -> Option<Delivered> {
        let pos = self.head;
        let c = self.q.cell(pos);
        // Acquire: the header and payload loads below see what the sender wrote before its
        // Release publication.
        if c.seq.load(Ordering::Acquire) != pos + 1 {
            return None;
        }
        // The cell is not written: it is freed with `head` (`publish`), whose Release orders
        // these loads before the next lap's sender can see it free.
        self.head = pos + 1;
        Some(self.read(pos))
    }

    /// The message at `pos` again: one this burst took with [`poll`](Self::poll), whose
    /// cell stays as it is until `head` is published. For a drainer's cold paths, which
    /// take the position rather than the message: a message passed to a function that is
    /// not inlined lives in memory, and was stored there on every delivery (session 57).
    #[inline]
    pub fn reread(&self, pos: u64) -> Delivered {
        debug_assert!(pos.wrapping_sub(self.start) < self.head.wrapping_sub(self.start), "not taken in this burst");
        self.read(pos)
    }

    /// Reads the written cell at `pos` (its sequence word already checked).
    #[inline(always)]
    fn read(&self, pos: u64) -> Delivered {
        let c = self.q.cell(pos);
        let hdr = c.hdr.load(Ordering::Relaxed);
        let len = (hdr as u32 & 0xFFFF).min(PAYLOAD_MAX as u32);
        // All six words, whatever the length: six plain loads of the line just read, where
        // loading only the message's took a chain of compares and branches per message
        // (session 57). The words past the message are never used as its bytes.
        let words: [u64; PAYLOAD_WORDS] = std::array::from_fn(|k| c.data[k].load(Ordering::Relaxed));
        Delivered { pos, len, tag: (hdr >> 16) as u16, imm: (hdr >> 32) as u32, words }
    }

    /// How many written messages follow the head (those the next `poll`s return), at most
    /// `max`, before the first for which `same(tag, first payload word)` is false. They stay
    /// as they are until this burst's `head` is published past them, so the next `poll`s
    /// return exactly them: a drainer sizes a batch by it (one claim of receive requests
    /// for a run of messages to one QP, `drain::take`).
    #[inline]
    pub fn peek_run(&self, max: u64, same: impl Fn(u16, u64) -> bool) -> u64 {
        let mut k = 0;
        while k < max {
            let pos = self.head + k;
            let c = self.q.cell(pos);
            // Acquire, as in `poll`.
            if c.seq.load(Ordering::Acquire) != pos + 1 {
                break;
            }
            let hdr = c.hdr.load(Ordering::Relaxed);
            if !same((hdr >> 16) as u16, c.data[0].load(Ordering::Relaxed)) {
                break;
            }
            k += 1;
        }
        k
    }

    /// Publishes `head` to senders now, keeping the lock: for a drainer that holds the lock
    /// across many bursts (an owner polling often) and acknowledges once per burst.
    #[inline]
    pub fn publish(&mut self) {
        if self.head != self.start {
            self.start = self.head;
            // Release: every delivered message's reads happen before a sender sees it acked,
            // and so before the next lap's sender overwrites its cell (`write`).
            self.q.header().head.store(self.head, Ordering::Release);
        }
    }
}

impl Drop for Drain {
    fn drop(&mut self) {
        self.publish();
        // Release: the next drainer sees our `head` and frees.
        self.q.header().lock.store(0, Ordering::Release);
    }
}

/// A queue over its own aligned heap memory, for the tests and the loom models.
#[cfg(test)]
mod test_mem {
    use super::{MsgQueue, ALIGN};

    pub(super) struct Mem {
        base: *mut u8,
        layout: std::alloc::Layout,
        pub(super) q: MsgQueue,
    }

    // SAFETY: the memory is only reached through the queue's atomics.
    unsafe impl Send for Mem {}
    // SAFETY: as above.
    unsafe impl Sync for Mem {}

    impl Mem {
        pub(super) fn new(cells: usize) -> Mem {
            let layout = std::alloc::Layout::from_size_align(MsgQueue::bytes(cells), ALIGN).unwrap();
            // SAFETY: a non-zero size.
            let base = unsafe { std::alloc::alloc_zeroed(layout) };
            assert!(!base.is_null());
            // SAFETY: fresh memory of the right size and alignment, private until shared.
            let q = unsafe { MsgQueue::init(base, cells) };
            Mem { base, layout, q }
        }

        #[cfg(not(loom))]
        pub(super) fn arc(cells: usize) -> std::sync::Arc<Mem> {
            std::sync::Arc::new(Mem::new(cells))
        }
    }

    impl Drop for Mem {
        fn drop(&mut self) {
            // SAFETY: allocated in `new` with this layout; no view outlives `self`.
            unsafe { std::alloc::dealloc(self.base, self.layout) }
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::test_mem::Mem;
    use super::*;

    #[test]
    fn a_message_comes_out_as_it_went_in_and_frees_its_cell_for_the_next_lap() {
        let m = Mem::arc(2);
        assert_eq!(m.q.try_drain().unwrap().poll(), None, "an empty queue delivers nothing");
        let msg = b"hello, receiver-side delivery!";
        let mut words = [0u64; PAYLOAD_WORDS];
        for (w, c) in words.iter_mut().zip(msg.chunks(8)) {
            let mut b = [0u8; 8];
            b[..c.len()].copy_from_slice(c);
            *w = u64::from_le_bytes(b);
        }
        let p = m.q.claim(3);
        assert_eq!(p, 0);
        m.q.write(0, &mut 0, msg.len() as u32, 0xABCD, 7, &words).unwrap();
        m.q.write(1, &mut 0, 8, 0, 8, &[11]).unwrap();
        assert_eq!(
            m.q.write(2, &mut 0, 8, 0, 9, &[12]),
            Err(Busy::NotFree),
            "position 2 needs cell 0's first lap consumed"
        );
        let mut rx = m.q.try_drain().unwrap();
        let d = rx.poll().unwrap();
        assert_eq!((d.pos, d.len, d.tag, d.imm), (0, msg.len() as u32, 0xABCD, 7), "the tag travels beside the length");
        let mut buf = [0u8; 64];
        assert_eq!(d.copy_to(&mut buf), msg.len());
        assert_eq!(&buf[..msg.len()], msg);
        assert_eq!(m.q.acked(), 0, "nothing is acknowledged before the burst ends");
        assert_eq!(
            m.q.write(2, &mut 0, 8, 0, 9, &[12]),
            Err(Busy::NotFree),
            "read, but its cell is freed only when the burst publishes head"
        );
        assert!(m.q.try_drain().is_none(), "one drainer at a time");
        drop(rx);
        assert_eq!(m.q.acked(), 1);
        m.q.write(2, &mut 0, 8, 0, 9, &[12]).unwrap();
        let mut rx = m.q.try_drain().unwrap();
        assert_eq!(rx.poll().map(|d| (d.pos, d.words[0], d.imm)), Some((1, 11, 8)));
        assert_eq!(rx.poll().map(|d| (d.pos, d.words[0], d.imm)), Some((2, 12, 9)));
        assert_eq!(rx.poll(), None);
        drop(rx);
        assert_eq!(m.q.acked(), 3);
    }

    #[test]
    fn ready_says_whether_the_head_holds_a_message() {
        let m = Mem::arc(2);
        assert!(!m.q.ready());
        let p = m.q.claim(2);
        m.q.write(p + 1, &mut 0, 8, 0, 0, &[2]).unwrap();
        assert!(!m.q.ready(), "the head position is claimed, not written");
        m.q.write(p, &mut 0, 8, 0, 0, &[1]).unwrap();
        assert!(m.q.ready());
        let mut rx = m.q.try_drain().unwrap();
        rx.poll().unwrap();
        rx.poll().unwrap();
        drop(rx);
        assert!(!m.q.ready(), "all delivered");
    }

    #[test]
    fn a_claimed_but_unwritten_position_holds_back_the_ones_after_it() {
        let m = Mem::arc(4);
        let p = m.q.claim(2);
        m.q.write(p + 1, &mut 0, 8, 0, 0, &[2]).unwrap();
        assert_eq!(
            m.q.try_drain().unwrap().poll(),
            None,
            "position 0 is claimed, not written: delivery stays in order"
        );
        m.q.write(p, &mut 0, 8, 0, 0, &[1]).unwrap();
        let mut rx = m.q.try_drain().unwrap();
        assert_eq!(rx.poll().map(|d| d.words[0]), Some(1));
        assert_eq!(rx.poll().map(|d| d.words[0]), Some(2));
    }

    #[test]
    #[should_panic(expected = "at least 2")]
    fn a_queue_of_one_cell_is_refused() {
        // With one cell, "written for position p" and "free for position p + 1" would be the
        // same sequence word (the loom model found the overwrite).
        let _ = Mem::new(1);
    }

    #[test]
    fn hostile_lengths_are_cut_to_a_cell() {
        let m = Mem::arc(2);
        m.q.claim(1);
        m.q.write(0, &mut 0, u32::MAX, 0, 0, &[1; PAYLOAD_WORDS]).unwrap();
        let d = m.q.try_drain().unwrap().poll().unwrap();
        assert_eq!(d.len as usize, PAYLOAD_MAX);
        let mut small = [0u8; 5];
        assert_eq!(d.copy_to(&mut small), 5, "a short destination bounds the copy");
        // A length beyond the words given is cut to them: the cell's older words (the
        // previous lap's message) are never read as this one's.
        m.q.claim(1);
        m.q.write(1, &mut 0, 40, 0, 0, &[7, 8]).unwrap();
        let d = m.q.try_drain().unwrap().poll().unwrap();
        assert_eq!((d.len, d.words[0], d.words[1]), (16, 7, 8));
    }

    #[test]
    fn a_drainer_holding_the_lock_acknowledges_with_publish() {
        let m = Mem::arc(4);
        let mut rx = m.q.try_drain().unwrap();
        for v in 0..2u64 {
            let p = m.q.claim(1);
            m.q.write(p, &mut 0, 8, 0, 0, &[v]).unwrap();
            assert_eq!(rx.poll().map(|d| d.words[0]), Some(v));
            rx.publish();
            assert_eq!(m.q.acked(), v + 1, "acknowledged while the lock is held");
            assert!(m.q.try_drain().is_none());
        }
        drop(rx);
        assert!(m.q.try_drain().is_some(), "released on drop");
        assert_eq!(m.q.acked(), 2);
    }

    #[test]
    fn each_drain_burst_resumes_where_the_last_one_ended() {
        let m = Mem::arc(4);
        for v in 0..3u64 {
            let p = m.q.claim(1);
            m.q.write(p, &mut 0, 8, 0, 0, &[v]).unwrap();
        }
        let mut rx = m.q.try_drain().unwrap();
        rx.poll().unwrap();
        rx.poll().unwrap();
        drop(rx);
        // Another drainer (another thread, or a sender helping) takes over from there.
        let mut rx = m.q.try_drain().unwrap();
        assert_eq!(rx.head(), 2);
        assert_eq!(rx.poll().map(|d| d.words[0]), Some(2));
    }

    /// Several senders with post lists and two drainers competing for the lock, a small
    /// queue so that laps wrap thousands of times: every position is delivered once, each
    /// sender's messages in its claim order, their words intact.
    #[test]
    fn many_senders_and_two_drainers_lose_nothing_and_keep_each_senders_order() {
        const SENDERS: u64 = 3;
        const PER: u64 = 20_000;
        const TOTAL: u64 = SENDERS * PER;
        let m = Mem::arc(8);
        let senders: Vec<_> = (0..SENDERS)
            .map(|s| {
                let m = m.clone();
                std::thread::spawn(move || {
                    let (mut i, mut acked) = (0, 0);
                    while i < PER {
                        let k = (1 + i % 5).min(PER - i);
                        let p = m.q.claim(k);
                        for j in 0..k {
                            let v = i + j;
                            let words = [s, v, !v, v.rotate_left(17), 0, 0];
                            while m.q.write(p + j, &mut acked, 32, 0, s as u32, &words).is_err() {
                                std::thread::yield_now();
                            }
                        }
                        i += k;
                    }
                })
            })
            .collect();
        let drainers: Vec<_> = (0..2)
            .map(|_| {
                let m = m.clone();
                std::thread::spawn(move || {
                    let mut got = Vec::new();
                    while m.q.acked() < TOTAL {
                        let Some(mut rx) = m.q.try_drain() else {
                            std::thread::yield_now();
                            continue;
                        };
                        // Bursts of up to 16, then the lock goes back.
                        for _ in 0..16 {
                            let Some(d) = rx.poll() else { break };
                            assert_eq!(d.len, 32);
                            assert_eq!(u64::from(d.imm), d.words[0]);
                            assert_eq!((d.words[2], d.words[3]), (!d.words[1], d.words[1].rotate_left(17)), "torn");
                            got.push((d.pos, d.words[0], d.words[1]));
                        }
                        drop(rx);
                        std::thread::yield_now();
                    }
                    got
                })
            })
            .collect();
        for t in senders {
            t.join().unwrap();
        }
        let mut all: Vec<_> = drainers.into_iter().flat_map(|t| t.join().unwrap()).collect();
        all.sort_unstable();
        assert_eq!(all.len() as u64, TOTAL, "every position delivered once");
        let mut next = [0u64; SENDERS as usize];
        for (i, &(pos, s, v)) in all.iter().enumerate() {
            assert_eq!(pos, i as u64, "positions delivered once each");
            assert_eq!(next[s as usize], v, "sender {s}'s messages out of order");
            next[s as usize] += 1;
        }
        assert_eq!(m.q.acked(), TOTAL);
        assert_eq!(m.q.try_drain().unwrap().poll(), None);
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::test_mem::Mem;
    use super::*;
    use loom::sync::Arc;
    use loom::thread;

    /// One attempt to write `v` at `pos`; the value back if the cell was not free.
    fn try_send(q: &MsgQueue, pos: u64, v: u64) -> Option<(u64, u64)> {
        q.write(pos, &mut 0, 16, 0, v as u32, &[v, !v]).err().map(|_| (pos, v))
    }

    /// Checks one delivered message and records its value.
    fn check(d: Delivered, want_pos: u64, seen: &mut Vec<u64>) {
        assert_eq!(d.pos, want_pos, "delivered out of position order");
        assert_eq!(d.words[1], !d.words[0], "torn message");
        assert_eq!(u64::from(d.imm), d.words[0]);
        seen.push(d.words[0]);
    }

    /// A drainer that tries two bursts of one message while the senders run (taking what is
    /// ready, never waiting); returns the values it took.
    fn poll_twice(q: MsgQueue) -> Vec<u64> {
        let mut seen = Vec::new();
        for _ in 0..2 {
            if let Some(mut rx) = q.try_drain() {
                let want = rx.head();
                if let Some(d) = rx.poll() {
                    check(d, want, &mut seen);
                }
            }
        }
        seen
    }

    /// Ends a model after every thread joined (no thread ever waits, as loom needs): writes
    /// what the senders could not, lowest position first, each after draining what is
    /// ready, then drains the rest.
    fn finish(m: &Mem, mut pending: Vec<(u64, u64)>, seen: &mut Vec<u64>) {
        let drain_all = |seen: &mut Vec<u64>| {
            let mut rx = m.q.try_drain().expect("every other drainer has joined");
            while let Some(d) = rx.poll() {
                let want = rx.head() - 1;
                check(d, want, seen);
            }
        };
        pending.sort_unstable();
        for (pos, v) in pending {
            drain_all(seen);
            assert!(try_send(&m.q, pos, v).is_none(), "a drained queue refused position {pos}");
        }
        drain_all(seen);
    }

    /// Two senders into a queue of two cells, one posting a list of two, the receiver
    /// polling as they write, so the third position's lap races the first's consumption:
    /// each message is delivered once, whole, in position order, and acknowledged.
    #[test]
    fn loom_msgq_two_senders_two_cells() {
        loom::model(|| {
            let m = Arc::new(Mem::new(2));
            let ts: Vec<_> = [vec![1u64, 2], vec![3]]
                .into_iter()
                .map(|vs| {
                    let m = m.clone();
                    thread::spawn(move || {
                        let p = m.q.claim(vs.len() as u64);
                        vs.iter().zip(p..).filter_map(|(&v, pos)| try_send(&m.q, pos, v)).collect::<Vec<_>>()
                    })
                })
                .collect();
            let mut seen = poll_twice(m.q);
            let pending: Vec<_> = ts.into_iter().flat_map(|t| t.join().unwrap()).collect();
            finish(&m, pending, &mut seen);
            let (one, two) = (seen.iter().position(|&v| v == 1), seen.iter().position(|&v| v == 2));
            assert!(one < two, "a post list is delivered in its order: {seen:?}");
            seen.sort_unstable();
            assert_eq!(seen, [1, 2, 3], "each message once");
            assert_eq!(m.q.acked(), 3);
        });
    }

    /// One sender's post list of three through two cells: the third write finds its cell
    /// free only once the first message was consumed, and never overwrites it.
    #[test]
    fn loom_msgq_post_list_laps_two_cells() {
        loom::model(|| {
            let m = Arc::new(Mem::new(2));
            let m2 = m.clone();
            // The receiver polls on its own thread while this one posts.
            let r = thread::spawn(move || poll_twice(m2.q));
            let p = m.q.claim(3);
            let pending: Vec<_> = [try_send(&m.q, p, 5), try_send(&m.q, p + 1, 6), try_send(&m.q, p + 2, 7)]
                .into_iter()
                .flatten()
                .collect();
            let mut seen = r.join().unwrap();
            finish(&m, pending, &mut seen);
            assert_eq!(seen, [5, 6, 7], "in post order, each once");
        });
    }

    /// Two drainers racing for the lock while a sender posts a list of two: each message is
    /// delivered by exactly one of them, and `head` ends acknowledging both.
    #[test]
    fn loom_msgq_two_drainers() {
        loom::model(|| {
            let m = Arc::new(Mem::new(2));
            let drainers: Vec<_> = (0..2)
                .map(|_| {
                    let m = m.clone();
                    thread::spawn(move || {
                        let mut seen = Vec::new();
                        if let Some(mut rx) = m.q.try_drain() {
                            for _ in 0..2 {
                                let want = rx.head();
                                if let Some(d) = rx.poll() {
                                    check(d, want, &mut seen);
                                }
                            }
                        }
                        seen
                    })
                })
                .collect();
            let p = m.q.claim(2);
            let pending: Vec<_> = [try_send(&m.q, p, 5), try_send(&m.q, p + 1, 6)].into_iter().flatten().collect();
            assert!(pending.is_empty(), "two cells hold a list of two without a lap");
            let mut seen: Vec<_> = drainers.into_iter().flat_map(|t| t.join().unwrap()).collect();
            finish(&m, Vec::new(), &mut seen);
            seen.sort_unstable();
            assert_eq!(seen, [5, 6], "each message once");
            assert_eq!(m.q.acked(), 2);
        });
    }
}

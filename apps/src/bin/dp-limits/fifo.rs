//! `fifo-lat` and `fifo-bw`: the receiver-side delivery design of docs/shm-provider.md ("Next
//! design step") reduced to the work it cannot avoid, so that what it can reach on this
//! machine is measured before the provider is rebuilt around it.
//!
//! The queue is the product's own: `dataplane::shm::msgq` (64-byte cells in the receiver's
//! memory, lap claims, `head` published once per burst; its protocol and memory orderings are
//! documented there and model-checked by tools/loom.sh). Per post list the sender claims its
//! positions with one `fetch_add` and writes each cell, packing the payload into words once
//! per list. The receiver takes the message at its head, takes its own receive request from
//! a local ring (no trust boundary, nothing to re-check), copies the payload into the posted
//! buffer, writes the work completion into the caller's array, and after each poll publishes
//! `head` once: the senders' acknowledgements in one word. It holds the queue's drain lock
//! for the whole run (the owner keeping the lock while it polls; taking it per poll cost
//! 5 ns of latency, docs/shm-provider.md). One cell line crosses cores per message, plus
//! `head` once per burst.
//!
//! Left out, because they cost the same in any design: the verbs checks a post does on its
//! own lines (opcode, QP state, lkey: one load each) and the send completion's own entry.
//! Left out because this is a measurement, not the transport: payloads above [`PAYLOAD_MAX`]
//! (an offset into the sender's MR the receiver copies from), RNR timers, more than one
//! sender in the runs (there are two cores).
//!
//! Session 17 also measured a second way of learning that a cell is free, a sender's cached
//! copy of `head` (credits, exact for one sender only); lap claims were as fast or faster on
//! every row (docs/shm-provider.md, "Its ceiling, measured"), so only they remain.

use super::pin;
use dataplane::shm::msgq::{self, Drain, MsgQueue, PAYLOAD_MAX, PAYLOAD_WORDS};
use hdrhistogram::Histogram;
use std::alloc::Layout;
use std::collections::VecDeque;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Instant;

/// A message queue over its own aligned heap memory (both threads of the run share it).
pub struct Fifo {
    base: *mut u8,
    layout: Layout,
    q: MsgQueue,
}

// SAFETY: the memory is only reached through the queue's atomics, and it is freed only when
// the last `Arc<Fifo>` goes, after both threads stopped using it.
unsafe impl Send for Fifo {}
// SAFETY: as above.
unsafe impl Sync for Fifo {}

impl Fifo {
    /// A FIFO of `cells` cells (a power of two, at least 2).
    pub fn new(cells: usize) -> Fifo {
        let layout = Layout::from_size_align(MsgQueue::bytes(cells), msgq::ALIGN).expect("FIFO layout");
        // SAFETY: the size is non-zero (a header and at least one cell).
        let base = unsafe { std::alloc::alloc_zeroed(layout) };
        if base.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        // SAFETY: fresh memory of the queue's size and alignment, private until this returns,
        // and freed only in `drop`.
        let q = unsafe { MsgQueue::init(base, cells) };
        Fifo { base, layout, q }
    }
}

impl Drop for Fifo {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout; no view of the queue outlives `self`.
        unsafe { std::alloc::dealloc(self.base, self.layout) }
    }
}

/// The sending side.
pub struct Sender<'a> {
    q: &'a MsgQueue,
    /// Our copy of the queue's `head` (`MsgQueue::write`).
    acked: u64,
}

impl<'a> Sender<'a> {
    /// A sender on `fifo`.
    pub fn new(fifo: &'a Fifo) -> Sender<'a> {
        Sender { q: &fifo.q, acked: 0 }
    }

    /// Posts `count` messages of `payload` (at most [`PAYLOAD_MAX`] bytes) as one post list,
    /// the first word of message `k` replaced by `first + k` (a sequence number the receiver
    /// checks). Claims the positions at once and waits for each claimed cell to be free for
    /// its lap (the transport bounds that wait by its RNR timer).
    #[inline]
    pub fn post(&mut self, payload: &[u8], first: u64, count: u64, imm: u32) {
        // The payload as the cell's words, once per post list (word 0 is each message's
        // sequence number, set below).
        let mut words = [0u64; PAYLOAD_WORDS];
        for (w, chunk) in words.iter_mut().zip(payload.chunks(8)) {
            let mut b = [0u8; 8];
            b[..chunk.len()].copy_from_slice(chunk);
            *w = u64::from_le_bytes(b);
        }
        let pos = self.q.claim(count);
        for k in 0..count {
            words[0] = first + k;
            while self.q.write(pos + k, &mut self.acked, payload.len() as u32, 0, imm, &words).is_err() {
                std::hint::spin_loop();
            }
        }
    }

    /// Messages the receiver has consumed (the send completions), re-read from its `head`.
    pub fn acked(&mut self) -> u64 {
        self.q.acked()
    }
}

/// A work completion as the receiver's poll writes it.
#[derive(Clone, Copy, Default, Debug)]
pub struct Wc {
    /// The receive request's id.
    pub wr_id: u64,
    /// Bytes placed.
    pub byte_len: u32,
    /// Immediate data.
    pub imm: u32,
}

/// The receiving side: the queue's drain lock, held for the whole run (the only drainer
/// here: the "owner keeps the lock while it polls" of docs/shm-provider.md), and a local
/// ring of posted receive buffers.
pub struct Receiver<'a> {
    /// A view of `fifo`'s memory: the lifetime below keeps the FIFO alive while it is used.
    rx: Drain,
    _fifo: PhantomData<&'a Fifo>,
    /// Posted receive requests in order; a request's id is its buffer's index.
    posted: VecDeque<u64>,
    bufs: Vec<[u8; PAYLOAD_MAX]>,
}

impl<'a> Receiver<'a> {
    /// A receiver on `fifo` with `depth` receive buffers, all posted.
    pub fn new(fifo: &'a Fifo, depth: usize) -> Receiver<'a> {
        let posted = (0..depth as u64).collect();
        let rx = fifo.q.try_drain().expect("the FIFO's only drainer");
        Receiver { rx, _fifo: PhantomData, posted, bufs: vec![[0; PAYLOAD_MAX]; depth] }
    }

    /// Re-posts buffer `wr_id` (local: a push on the ring, nothing crosses cores).
    #[inline]
    pub fn post_recv(&mut self, wr_id: u64) {
        self.posted.push_back(wr_id);
    }

    /// The first payload word of the buffer `wr_id` names.
    pub fn first_word(&self, wr_id: u64) -> u64 {
        let b = &self.bufs[wr_id as usize];
        u64::from_le_bytes(b[..8].try_into().expect("8 bytes"))
    }

    /// Polls up to `wc.len()` messages; returns how many completions it wrote, and publishes
    /// `head` (the senders' acknowledgements) once if any. A message with no posted receive
    /// stays in the FIFO.
    #[inline]
    pub fn poll(&mut self, wc: &mut [Wc]) -> usize {
        let mut n = 0;
        while n < wc.len() {
            let Some(&wr_id) = self.posted.front() else { break };
            let Some(d) = self.rx.poll() else { break };
            self.posted.pop_front();
            let len = d.copy_to(&mut self.bufs[wr_id as usize]);
            wc[n] = Wc { wr_id, byte_len: len as u32, imm: d.imm };
            n += 1;
        }
        self.rx.publish();
        n
    }
}

fn check_size(size: usize) {
    if !(8..=PAYLOAD_MAX).contains(&size) {
        eprintln!("dp-limits: fifo tests carry 8 to {PAYLOAD_MAX} bytes in a cell (-s {size})");
        std::process::exit(2);
    }
}

/// The immediate every test message carries.
const IMM: u32 = 0x1234_5678;

/// Exits with a message if a completion is not the one expected (sequence number in the
/// first payload word, length, immediate): the transport lost, duplicated, reordered or
/// corrupted a message.
fn check(rx: &Receiver<'_>, wc: &Wc, want: u64, size: usize) {
    let got = rx.first_word(wc.wr_id);
    if got != want || wc.byte_len as usize != size || wc.imm != IMM {
        eprintln!("dp-limits: fifo delivered {wc:?} with message {got} where {want} of {size} B was due");
        std::process::exit(1);
    }
}

/// Ping-pong through two FIFOs: one-way latency (half round trip), each sample timed with
/// the TSC as `pingpong` and `dp-perf send_lat` time theirs.
pub fn lat(core: usize, peer: usize, json: bool, size: usize, iters: u64) {
    check_size(size);
    let (to_peer, to_us) = (Arc::new(Fifo::new(256)), Arc::new(Fifo::new(256)));
    let (a, b) = (to_peer.clone(), to_us.clone());
    let warm = iters / 10 + 1000;
    let total = warm + iters;
    let payload = vec![0x5au8; size];
    let p2 = payload.clone();
    let t = std::thread::spawn(move || {
        pin(peer);
        let (mut rx, mut tx) = (Receiver::new(&a, 64), Sender::new(&b));
        let mut wc = [Wc::default(); 1];
        for i in 0..total {
            while rx.poll(&mut wc) == 0 {}
            check(&rx, &wc[0], i, size);
            rx.post_recv(wc[0].wr_id);
            tx.post(&p2, i, 1, IMM);
        }
    });
    pin(core);
    let (mut rx, mut tx) = (Receiver::new(&to_us, 64), Sender::new(&to_peer));
    let mut wc = [Wc::default(); 1];
    // The TSC, read as dp-perf's latency tests read it (unfenced start, fenced end), so the
    // limit and the transport pay the same clock cost per sample.
    let clock = dataplane::pipeline::Clock::new();
    let mut hist = Histogram::<u64>::new_with_bounds(1, 10_000_000_000, 3).expect("histogram bounds");
    let mut start = Instant::now();
    for i in 0..total {
        if i == warm {
            start = Instant::now();
        }
        let t0 = clock.now_ns_unordered();
        tx.post(&payload, i, 1, IMM);
        while rx.poll(&mut wc) == 0 {}
        if i >= warm {
            hist.record((clock.now_ns().saturating_sub(t0) / 2).max(1)).ok();
        }
        check(&rx, &wc[0], i, size);
        rx.post_recv(wc[0].wr_id);
    }
    let avg = start.elapsed().as_nanos() as f64 / iters as f64 / 2.0;
    t.join().expect("peer thread");
    let (min, p50, p99) = (hist.min(), hist.value_at_quantile(0.5), hist.value_at_quantile(0.99));
    if json {
        println!(
            "{{\"test\":\"fifo-lat\",\"MsgSize\":{size},\"iters\":{iters},\"min_ns\":{min},\"p50_ns\":{p50},\"p99_ns\":{p99},\"avg_ns\":{avg:.1}}}"
        );
    } else {
        println!(
            "message FIFO ping-pong, {size} B, cores {core}->{peer}: {iters} round trips, half round trip ns: min {min} p50 {p50} p99 {p99} avg {avg:.1}"
        );
    }
}

/// One direction, post lists of `post_list`: messages/s from the first post to the last
/// acknowledgement (as `dp-perf send_bw` ends at its last send completion). At most
/// `tx_depth` messages are unacknowledged (dp-perf's send queue depth); the receiver polls
/// bursts of 32 and re-posts each buffer at once, as dp-perf's receiver does.
pub fn bw(core: usize, peer: usize, json: bool, size: usize, iters: u64, post_list: u64, tx_depth: u64) {
    check_size(size);
    if post_list == 0 || post_list > tx_depth || iters == 0 {
        eprintln!("dp-limits: fifo-bw needs 1 <= --post-list <= --tx-depth and --iters >= 1");
        std::process::exit(2);
    }
    // 512 receive buffers, as dp-perf's default receive depth; the FIFO as deep.
    let fifo = Arc::new(Fifo::new(512));
    let f2 = fifo.clone();
    let t = std::thread::spawn(move || {
        pin(peer);
        let mut rx = Receiver::new(&f2, 512);
        let mut wc = [Wc::default(); 32];
        let mut got = 0u64;
        while got < iters {
            let n = rx.poll(&mut wc);
            for w in &wc[..n] {
                check(&rx, w, got, size);
                got += 1;
                rx.post_recv(w.wr_id);
            }
        }
    });
    pin(core);
    let payload = vec![0x5au8; size];
    let mut tx = Sender::new(&fifo);
    let start = Instant::now();
    let (mut sent, mut acked) = (0u64, 0u64);
    while sent < iters {
        let k = post_list.min(iters - sent);
        // The send queue's room: refresh the acknowledgements only when it is used up.
        if sent + k - acked > tx_depth {
            acked = tx.acked();
            continue;
        }
        tx.post(&payload, sent, k, IMM);
        sent += k;
    }
    while acked < iters {
        acked = tx.acked();
    }
    let secs = start.elapsed().as_secs_f64();
    t.join().expect("receiver thread");
    let mpps = iters as f64 / secs / 1e6;
    let mbs = (size as u64 * iters) as f64 / secs / (1 << 20) as f64;
    if json {
        println!(
            "{{\"test\":\"fifo-bw\",\"MsgSize\":{size},\"iters\":{iters},\"post_list\":{post_list},\"MsgRate\":{mpps:.6},\"BW_average\":{mbs:.2}}}"
        );
    } else {
        println!(
            "message FIFO, {size} B, post list {post_list}, cores {core}->{peer}: {iters} messages, {mpps:.3} Mpps, {mbs:.2} MB/s"
        );
    }
}

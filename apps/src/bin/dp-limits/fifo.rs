//! `fifo-lat` and `fifo-bw`: the receiver-side delivery design of docs/shm-provider.md ("Next
//! design step") reduced to the work it cannot avoid, so that what it can reach on this
//! machine is measured before the provider is rebuilt around it.
//!
//! A message FIFO per receiver, in the receiver's memory: 64-byte cells, each a sequence
//! word, a header word (length, immediate) and up to [`PAYLOAD_MAX`] payload bytes. Per post
//! list the sender claims its cells with one `fetch_add` on the FIFO's `tail`, writes each
//! cell and publishes it with a Release store of its sequence word. The receiver polls the
//! cell at its `head`: Acquire load of the sequence word, takes its own receive request from
//! a local ring (no trust boundary, nothing to re-check), copies the payload into the posted
//! buffer, writes the work completion into the caller's array, and after the burst publishes
//! `head` once: the senders' acknowledgements (send completions) in one word. One cell line
//! crosses cores per message, plus `head` once per burst.
//!
//! How a sender knows its claimed cell is free ([`Claim`]):
//! - [`Claim::Lap`] (the default): it waits until the cell's sequence word equals the
//!   position, which the receiver stores (`pos + cells`) after reading the cell (Vyukov's
//!   bounded queue). Any number of senders; one more store per message, on a line the
//!   receiver holds anyway.
//! - [`Claim::Credits`]: it keeps a cached copy of `head` and re-reads it only when the
//!   copy says the FIFO is full. Exact for one sender only (a check and a claim by two
//!   would race).
//!
//! Left out, because they cost the same in any design: the verbs checks a post does on its
//! own lines (opcode, QP state, lkey: one load each) and the send completion's own entry.
//! Left out because this is a measurement, not the transport: payloads above [`PAYLOAD_MAX`]
//! (an offset into the sender's MR the receiver copies from), RNR timers, more than one
//! sender in the runs (there are two cores).

use super::{pin, Line};
use hdrhistogram::Histogram;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// Payload bytes a cell carries after its sequence and header words.
pub const PAYLOAD_MAX: usize = 48;

/// Payload words per cell.
const WORDS: usize = PAYLOAD_MAX / 8;

/// One FIFO cell: a cache line.
#[repr(C, align(64))]
struct Cell {
    /// `pos + 1` once the message at position `pos` is written (Release).
    seq: AtomicU64,
    /// Length in the low 32 bits, immediate in the high 32.
    hdr: AtomicU64,
    data: [AtomicU64; WORDS],
}

/// How senders learn that a cell is free.
#[derive(Clone, Copy, PartialEq, Eq, Debug, clap::ValueEnum)]
pub enum Claim {
    /// A cached copy of the receiver's `head`, re-read when it says the FIFO is full: one
    /// sender only (a check and a claim by two would race).
    Credits,
    /// The claimed cell's own sequence word (Vyukov): any number of senders.
    Lap,
}

/// A receiver's message FIFO.
pub struct Fifo {
    claim: Claim,
    /// Positions claimed by senders (`fetch_add`).
    tail: Line,
    /// Messages the receiver consumed: credits and acknowledgements.
    head: Line,
    cells: Box<[Cell]>,
    mask: u64,
}

impl Fifo {
    /// A FIFO of `cells` cells (a power of two) whose senders claim cells as `claim` says.
    pub fn new(cells: usize, claim: Claim) -> Fifo {
        assert!(cells.is_power_of_two(), "FIFO size must be a power of two");
        let mask = cells as u64 - 1;
        // With laps, cell `i` starts free for position `i`; with credits the word only ever
        // holds `pos + 1` of the message in it, and 0 (no message) at first.
        let first_seq = |i: u64| if claim == Claim::Lap { i } else { 0 };
        let cells = (0..cells as u64)
            .map(|i| Cell { seq: AtomicU64::new(first_seq(i)), hdr: AtomicU64::new(0), data: Default::default() })
            .collect();
        Fifo { claim, tail: Line::default(), head: Line::default(), cells, mask }
    }
}

/// The sending side: a cached copy of the receiver's `head`.
pub struct Sender<'a> {
    fifo: &'a Fifo,
    head_seen: u64,
    /// Messages posted (equal to the FIFO's `tail` with one sender).
    posted: u64,
}

impl<'a> Sender<'a> {
    /// A sender on `fifo`.
    pub fn new(fifo: &'a Fifo) -> Sender<'a> {
        Sender { fifo, head_seen: 0, posted: 0 }
    }

    /// Posts `count` messages of `payload` (at most [`PAYLOAD_MAX`] bytes) as one post list,
    /// the first word of message `k` replaced by `first + k` (a sequence number the receiver
    /// checks). With [`Claim::Credits`], returns false, posting nothing, when the FIFO lacks
    /// `count` free cells (a real transport's RNR); with [`Claim::Lap`] it waits for each
    /// claimed cell instead (the transport would bound that wait by its RNR timer).
    #[inline]
    pub fn post(&mut self, payload: &[u8], first: u64, count: u64, imm: u32) -> bool {
        let cap = self.fifo.mask + 1;
        let lap = self.fifo.claim == Claim::Lap;
        if !lap && self.posted + count - self.head_seen > cap {
            self.head_seen = self.fifo.head.0.load(Ordering::Acquire);
            if self.posted + count - self.head_seen > cap {
                return false;
            }
        }
        // The payload as the cell's words, once per post list (word 0 is each message's
        // sequence number, written below).
        let mut words = [0u64; WORDS];
        for (w, chunk) in words.iter_mut().zip(payload.chunks(8)) {
            let mut b = [0u8; 8];
            b[..chunk.len()].copy_from_slice(chunk);
            *w = u64::from_le_bytes(b);
        }
        let n_words = payload.len().div_ceil(8);
        let pos = self.fifo.tail.0.fetch_add(count, Ordering::Relaxed);
        let hdr = payload.len() as u64 | (u64::from(imm) << 32);
        for k in 0..count {
            let c = &self.fifo.cells[((pos + k) & self.fifo.mask) as usize];
            if lap {
                while c.seq.load(Ordering::Acquire) != pos + k {
                    std::hint::spin_loop();
                }
            }
            c.hdr.store(hdr, Ordering::Relaxed);
            c.data[0].store(first + k, Ordering::Relaxed);
            for (d, &v) in c.data[1..n_words].iter().zip(&words[1..n_words]) {
                d.store(v, Ordering::Relaxed);
            }
            c.seq.store(pos + k + 1, Ordering::Release);
        }
        self.posted += count;
        true
    }

    /// Messages the receiver has consumed (the send completions), re-read from its `head`.
    pub fn acked(&mut self) -> u64 {
        self.head_seen = self.fifo.head.0.load(Ordering::Acquire);
        self.head_seen
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

/// The receiving side: the FIFO's consumer and a local ring of posted receive buffers.
pub struct Receiver<'a> {
    fifo: &'a Fifo,
    head: u64,
    /// Posted receive requests in order; a request's id is its buffer's index.
    posted: VecDeque<u64>,
    bufs: Vec<[u8; PAYLOAD_MAX]>,
}

impl<'a> Receiver<'a> {
    /// A receiver on `fifo` with `depth` receive buffers, all posted.
    pub fn new(fifo: &'a Fifo, depth: usize) -> Receiver<'a> {
        let posted = (0..depth as u64).collect();
        Receiver { fifo, head: 0, posted, bufs: vec![[0; PAYLOAD_MAX]; depth] }
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

    /// Polls up to `wc.len()` messages; returns how many completions it wrote. A message
    /// with no posted receive stays in the FIFO (the sender's credits stop it).
    #[inline]
    pub fn poll(&mut self, wc: &mut [Wc]) -> usize {
        let mut n = 0;
        while n < wc.len() {
            let c = &self.fifo.cells[(self.head & self.fifo.mask) as usize];
            if c.seq.load(Ordering::Acquire) != self.head + 1 {
                break;
            }
            let Some(wr_id) = self.posted.pop_front() else { break };
            let hdr = c.hdr.load(Ordering::Relaxed);
            // A length above a cell's payload (a corrupt writer) is clamped to it.
            let len = (hdr as u32 as usize).min(PAYLOAD_MAX);
            let dst = &mut self.bufs[wr_id as usize];
            for (w, out) in dst[..len].chunks_mut(8).enumerate() {
                let v = c.data[w].load(Ordering::Relaxed).to_le_bytes();
                out.copy_from_slice(&v[..out.len()]);
            }
            wc[n] = Wc { wr_id, byte_len: len as u32, imm: (hdr >> 32) as u32 };
            if self.fifo.claim == Claim::Lap {
                // Free for the next lap's sender (Release: our reads of it come first).
                c.seq.store(self.head + self.fifo.mask + 1, Ordering::Release);
            }
            n += 1;
            self.head += 1;
        }
        if n > 0 {
            self.fifo.head.0.store(self.head, Ordering::Release);
        }
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
/// `Instant` as `pingpong` and `dp-perf send_lat` time theirs.
pub fn lat(core: usize, peer: usize, json: bool, size: usize, iters: u64, claim: Claim) {
    check_size(size);
    let (to_peer, to_us) = (Arc::new(Fifo::new(256, claim)), Arc::new(Fifo::new(256, claim)));
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
            while !tx.post(&p2, i, 1, IMM) {}
        }
    });
    pin(core);
    let (mut rx, mut tx) = (Receiver::new(&to_us, 64), Sender::new(&to_peer));
    let mut wc = [Wc::default(); 1];
    let mut hist = Histogram::<u64>::new_with_bounds(1, 10_000_000_000, 3).expect("histogram bounds");
    let mut start = Instant::now();
    for i in 0..total {
        if i == warm {
            start = Instant::now();
        }
        let t0 = Instant::now();
        while !tx.post(&payload, i, 1, IMM) {}
        while rx.poll(&mut wc) == 0 {}
        if i >= warm {
            hist.record((t0.elapsed().as_nanos() as u64 / 2).max(1)).ok();
        }
        check(&rx, &wc[0], i, size);
        rx.post_recv(wc[0].wr_id);
    }
    let avg = start.elapsed().as_nanos() as f64 / iters as f64 / 2.0;
    t.join().expect("peer thread");
    let (min, p50, p99) = (hist.min(), hist.value_at_quantile(0.5), hist.value_at_quantile(0.99));
    if json {
        println!(
            "{{\"test\":\"fifo-lat\",\"claim\":\"{claim:?}\",\"MsgSize\":{size},\"iters\":{iters},\"min_ns\":{min},\"p50_ns\":{p50},\"p99_ns\":{p99},\"avg_ns\":{avg:.1}}}"
        );
    } else {
        println!(
            "message FIFO ({claim:?}) ping-pong, {size} B, cores {core}->{peer}: {iters} round trips, half round trip ns: min {min} p50 {p50} p99 {p99} avg {avg:.1}"
        );
    }
}

/// One direction, post lists of `post_list`: messages/s from the first post to the last
/// acknowledgement (as `dp-perf send_bw` ends at its last send completion). At most
/// `tx_depth` messages are unacknowledged (dp-perf's send queue depth); the receiver polls
/// bursts of 32 and re-posts each buffer at once, as dp-perf's receiver does.
#[allow(clippy::too_many_arguments)]
pub fn bw(core: usize, peer: usize, json: bool, size: usize, iters: u64, post_list: u64, tx_depth: u64, claim: Claim) {
    check_size(size);
    if post_list == 0 || post_list > tx_depth || iters == 0 {
        eprintln!("dp-limits: fifo-bw needs 1 <= --post-list <= --tx-depth and --iters >= 1");
        std::process::exit(2);
    }
    // 512 receive buffers, as dp-perf's default receive depth; the FIFO as deep.
    let fifo = Arc::new(Fifo::new(512, claim));
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
        if tx.post(&payload, sent, k, IMM) {
            sent += k;
        }
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
            "{{\"test\":\"fifo-bw\",\"claim\":\"{claim:?}\",\"MsgSize\":{size},\"iters\":{iters},\"post_list\":{post_list},\"MsgRate\":{mpps:.6},\"BW_average\":{mbs:.2}}}"
        );
    } else {
        println!(
            "message FIFO ({claim:?}), {size} B, post list {post_list}, cores {core}->{peer}: {iters} messages, {mpps:.3} Mpps, {mbs:.2} MB/s"
        );
    }
}

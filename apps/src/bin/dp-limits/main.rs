//! `dp-limits`: the physical limits of moving data between two cores of this machine, measured
//! the way `dp-perf` measures itself, so `tools/bench-peers` can quote every tool as a ratio of
//! what the hardware allows.
//!
//! - `pingpong`: one cache line bounced between two pinned threads. Each side spins on the
//!   other's line; one round trip is two cache-line transfers. Reported as half the round trip
//!   (perftest's convention), each sample timed from the TSC like `dp-perf` times its own
//!   (`dataplane::pipeline::Clock`: unfenced start, fenced end), so the timer's cost is in both.
//! - `copy`: a plain `memcpy` transport between two pinned threads. The producer copies each
//!   message from its private buffer into a slot of a ring and publishes it; the consumer sees
//!   the publication, reads the message's first word and returns the slot. That is the data
//!   movement of a `send_bw` test with no protocol at all. How fast it goes depends on how the
//!   slots are laid out and reused (a ring larger than the caches streams to memory; slots
//!   4 KiB apart alias in the store buffer; a publication per message is a cache-line
//!   transfer the next message's stores wait behind, where a post list publishes once), and
//!   a transport is free to pick the best layout, so `copy` runs several layouts
//!   ([`LAYOUTS`]) and reports the fastest: the bandwidth any shared-memory transport moving
//!   the same bytes between the same cores can at best approach.

mod fifo;
mod hiccup;

use clap::{Parser, Subcommand};
use hdrhistogram::Histogram;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

#[derive(Parser, Debug)]
#[command(about = "Core-to-core limits of this machine: cache-line ping-pong latency and memcpy bandwidth")]
struct Args {
    #[command(subcommand)]
    test: Test,
    /// Core of the measuring thread.
    #[arg(long, default_value_t = 0, global = true)]
    core: usize,
    /// Core of the peer thread.
    #[arg(long, default_value_t = 1, global = true)]
    peer_core: usize,
    /// Print one JSON object instead of the text line.
    #[arg(long, global = true)]
    json: bool,
}

#[derive(Subcommand, Debug)]
enum Test {
    /// Cache-line ping-pong: one-way latency (half round trip) in ns.
    Pingpong {
        /// Round trips.
        #[arg(short = 'n', long, default_value_t = 1_000_000)]
        iters: u64,
        /// Nanoseconds the measuring thread waits (spinning on the clock, touching neither
        /// line) before each round trip: the limit of a paced pipeline, whose message finds
        /// both sides idle (0: back to back, as `dp-perf send_lat`).
        #[arg(long, default_value_t = 0)]
        gap_ns: u64,
    },
    /// memcpy transport through a ring of slots: bandwidth in MB/s (2^20 bytes, as perftest),
    /// the best of several slot layouts.
    Copy {
        /// Message size in bytes.
        #[arg(short = 's', long, default_value_t = 4096)]
        size: usize,
        /// Messages per layout.
        #[arg(short = 'n', long, default_value_t = 2_000_000)]
        iters: u64,
        /// Slots of the largest ring (dp-perf's receive depth is 512).
        #[arg(long, default_value_t = 512)]
        slots: usize,
    },
    /// Message-FIFO ping-pong (the receiver-side delivery design, reduced to its data
    /// movement): one-way latency in ns.
    FifoLat {
        /// Message size in bytes (8 to 48: one cell).
        #[arg(short = 's', long, default_value_t = 8)]
        size: usize,
        /// Round trips.
        #[arg(short = 'n', long, default_value_t = 1_000_000)]
        iters: u64,
    },
    /// Stalls of a pinned busy-polling thread on each of the two cores (the floor of an
    /// open-loop pipeline's tail latency here).
    Hiccup {
        /// Seconds to watch.
        #[arg(short = 'D', long, default_value_t = 5.0)]
        duration: f64,
    },
    /// Message-FIFO stream, one direction: messages/s.
    FifoBw {
        /// Message size in bytes (8 to 48: one cell).
        #[arg(short = 's', long, default_value_t = 8)]
        size: usize,
        /// Messages.
        #[arg(short = 'n', long, default_value_t = 5_000_000)]
        iters: u64,
        /// Messages per post (one claim, one doorbell).
        #[arg(short = 'l', long, default_value_t = 1)]
        post_list: u64,
        /// Unacknowledged messages at most (dp-perf's send queue depth).
        #[arg(short = 't', long, default_value_t = 128)]
        tx_depth: u64,
    },
}

/// One cache line (128 bytes: the adjacent-line prefetcher pairs lines) holding a counter.
#[repr(align(128))]
#[derive(Default)]
struct Line(AtomicU64);

fn pin(core: usize) {
    if !core_affinity::set_for_current(core_affinity::CoreId { id: core }) {
        eprintln!("dp-limits: cannot pin to core {core}");
        std::process::exit(1);
    }
}

fn main() {
    dataplane_apps::logging::init();
    let args = Args::parse();
    match args.test {
        Test::Pingpong { iters, gap_ns } => pingpong(&args, iters, gap_ns),
        Test::Copy { size, iters, slots } => copy(&args, size, iters, slots),
        Test::Hiccup { duration } => hiccup::run(args.core, args.peer_core, args.json, duration),
        Test::FifoLat { size, iters } => fifo::lat(args.core, args.peer_core, args.json, size, iters),
        Test::FifoBw { size, iters, post_list, tx_depth } => {
            fifo::bw(args.core, args.peer_core, args.json, size, iters, post_list, tx_depth)
        }
    }
}

fn pingpong(args: &Args, iters: u64, gap_ns: u64) {
    let ping = Arc::new(Line::default());
    let pong = Arc::new(Line::default());
    let (p2, q2, peer) = (ping.clone(), pong.clone(), args.peer_core);
    let warm = if gap_ns == 0 { iters / 10 + 1000 } else { 100 };
    let total = warm + iters;
    let t = std::thread::spawn(move || {
        pin(peer);
        for i in 1..=total {
            // Acquire/Release: the same pairing a NIC's producer/consumer indices need.
            while p2.0.load(Ordering::Acquire) != i {
                std::hint::spin_loop();
            }
            q2.0.store(i, Ordering::Release);
        }
    });
    pin(args.core);
    // The TSC, read as dp-perf's latency tests read it (unfenced start, fenced end), so the
    // limit and the transport pay the same clock cost per sample.
    let clock = dataplane::pipeline::Clock::new();
    let mut hist = Histogram::<u64>::new_with_bounds(1, 10_000_000_000, 3).expect("histogram bounds");
    let mut start = Instant::now();
    for i in 1..=total {
        if i == warm + 1 {
            start = Instant::now();
        }
        if gap_ns != 0 {
            clock.spin_for(gap_ns);
        }
        let t0 = clock.now_ns_unordered();
        ping.0.store(i, Ordering::Release);
        while pong.0.load(Ordering::Acquire) != i {
            std::hint::spin_loop();
        }
        if i > warm {
            hist.record((clock.now_ns().saturating_sub(t0) / 2).max(1)).ok();
        }
    }
    // With a gap, the average is of the histogram (the wall time holds the gaps).
    let avg = if gap_ns == 0 { start.elapsed().as_nanos() as f64 / iters as f64 / 2.0 } else { hist.mean() };
    t.join().expect("peer thread");
    let (min, p50, p99) = (hist.min(), hist.value_at_quantile(0.5), hist.value_at_quantile(0.99));
    if args.json {
        println!("{{\"test\":\"pingpong\",\"iters\":{iters},\"gap_ns\":{gap_ns},\"min_ns\":{min},\"p50_ns\":{p50},\"p99_ns\":{p99},\"avg_ns\":{avg:.1}}}");
    } else {
        println!(
            "cache-line ping-pong, cores {}->{}: {iters} round trips {gap_ns} ns apart, half round trip ns: min {min} p50 {p50} p99 {p99} avg {avg:.1}",
            args.core, args.peer_core
        );
    }
}

/// A layout of the copy ring: how many slots (at most `--slots`) and the padding between
/// them.
struct Layout {
    name: &'static str,
    /// Slots, capped by `--slots`; 0: `--slots` itself.
    slots: usize,
    /// Bytes added to each slot's 64-byte-rounded size (64: consecutive slots of a 4 KiB
    /// message no longer sit 4 KiB apart, which aliases in the store buffer).
    pad: usize,
    /// Messages per publication (1: every message; more: once per batch, as a post list
    /// rings one doorbell, and the consumer frees a batch at once). At most half the slots.
    batch: usize,
}

/// The layouts `copy` tries: one slot per receive, `--slots` of them (dp-perf's before it
/// cycled through a page as perftest does, `--cycle-buffer 0`), and rings
/// small enough to stay in the caches, so the same lines are reused as perftest reuses its
/// buffers.
/// The batched ones publish as `dp-perf -l 32` posts (session 23: with its copies on the
/// receiver's core, `dp-perf` 4 KiB outran the per-message layouts whenever cache-line
/// transfers were slow, so those no longer bounded it).
const LAYOUTS: [Layout; 6] = [
    Layout { name: "ring", slots: 0, pad: 0, batch: 1 },
    Layout { name: "ring-padded", slots: 0, pad: 64, batch: 1 },
    Layout { name: "cached-16", slots: 16, pad: 0, batch: 1 },
    Layout { name: "cached-16-padded", slots: 16, pad: 64, batch: 1 },
    Layout { name: "cached-64-batch-32", slots: 64, pad: 0, batch: 32 },
    Layout { name: "cached-64-batch-32-padded", slots: 64, pad: 64, batch: 32 },
];

fn copy(args: &Args, size: usize, iters: u64, slots: usize) {
    if size == 0 || slots == 0 || iters == 0 {
        eprintln!("dp-limits: --size, --iters and --slots must be at least 1");
        std::process::exit(2);
    }
    let runs: Vec<(&Layout, f64)> = LAYOUTS
        .iter()
        .map(|l| {
            let n = if l.slots == 0 { slots } else { l.slots.min(slots) };
            let batch = l.batch.min(n / 2).max(1);
            (l, copy_once(args, size, iters, n, size.div_ceil(64) * 64 + l.pad, batch))
        })
        .collect();
    let (best, secs) = runs.iter().min_by(|a, b| a.1.total_cmp(&b.1)).expect("at least one layout");
    let mbs = |secs: f64| (size as u64 * iters) as f64 / secs / (1 << 20) as f64;
    let mpps = iters as f64 / secs / 1e6;
    if args.json {
        let each: Vec<String> = runs.iter().map(|(l, s)| format!("\"{}\":{:.2}", l.name, mbs(*s))).collect();
        println!(
            "{{\"test\":\"copy\",\"MsgSize\":{size},\"iters\":{iters},\"BW_average\":{:.2},\"MsgRate\":{mpps:.6},\
             \"layout\":\"{}\",\"layouts_MBs\":{{{}}}}}",
            mbs(*secs),
            best.name,
            each.join(",")
        );
    } else {
        for (l, s) in &runs {
            println!("  layout {:18} {:10.2} MB/s", l.name, mbs(*s));
        }
        println!(
            "memcpy transport, cores {}->{}: {size} B x {iters}: best layout {}: {:.2} MB/s, {mpps:.3} Mpps",
            args.core,
            args.peer_core,
            best.name,
            mbs(*secs)
        );
    }
}

/// One run of the copy transport through `slots` slots `stride` bytes apart, publishing every
/// `batch` messages (and the last); returns seconds.
fn copy_once(args: &Args, size: usize, iters: u64, slots: usize, stride: usize, batch: usize) -> f64 {
    // The ring: `slots` message slots; `head` counts messages published, `tail` consumed.
    let ring: Arc<Vec<AtomicU64>> = Arc::new((0..slots * stride / 8).map(|_| AtomicU64::new(0)).collect());
    let head = Arc::new(Line::default());
    let tail = Arc::new(Line::default());
    let (r2, h2, t2, peer) = (ring.clone(), head.clone(), tail.clone(), args.peer_core);
    let consumer = std::thread::spawn(move || {
        pin(peer);
        let mut sum = 0u64;
        let mut i = 0;
        while i < iters {
            let mut published = h2.0.load(Ordering::Acquire);
            while published <= i {
                std::hint::spin_loop();
                published = h2.0.load(Ordering::Acquire);
            }
            // Read each message's first word (as a receiver checks a header), then free the
            // slots: one store for what the publication covered.
            while i < published {
                sum = sum.wrapping_add(r2[(i as usize % slots) * stride / 8].load(Ordering::Relaxed));
                i += 1;
            }
            t2.0.store(i, Ordering::Release);
        }
        sum
    });
    pin(args.core);
    let src = vec![0x5au8; size];
    let base = ring.as_ptr() as *mut u8;
    let start = Instant::now();
    for i in 0..iters {
        while i - tail.0.load(Ordering::Acquire) >= slots as u64 {
            std::hint::spin_loop();
        }
        let slot = (i as usize % slots) * stride;
        // SAFETY: `slot + size <= slots * stride` (`stride >= size`), inside the ring's
        // allocation; the consumer does not read this slot until `head` (Release, below) says
        // it was written, and we do not write it again until `tail` (Acquire, above) says the
        // consumer is done with it.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), base.add(slot), size) };
        if (i + 1) % batch as u64 == 0 || i + 1 == iters {
            head.0.store(i + 1, Ordering::Release);
        }
    }
    consumer.join().map(|_| start.elapsed().as_secs_f64()).expect("consumer thread")
}

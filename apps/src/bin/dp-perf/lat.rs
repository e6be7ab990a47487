//! Latency tests. send_lat and write_lat are ping-pongs reported as half the round trip;
//! read_lat and atomic_lat are one-sided and reported as the full round trip, as perftest does.

use crate::args::{Args, Test};
use crate::bw::{aim, wr_for};
use crate::live::{Live, Res};
use crate::setup::{slot_index, End, Remote};
use dataplane::pipeline::Clock;
use dataplane::verbs::*;
use dataplane::{Cq, MemRegion, Provider, Qp, Srq};
use hdrhistogram::Histogram;
use std::time::{Duration, Instant};

/// Reposts receive `i` through `c`, a chain the caller keeps (one allocation per run, not
/// one per message: the server's repost runs between two pings).
fn post_recv<P: Provider>(e: &mut End<P>, c: &mut RecvChain, i: u64) -> Res<()> {
    c.clear();
    c.push(RecvWr::new(i), &[e.recv_sge(i)]);
    match e.srq.as_mut() {
        Some(s) => s.post_recv(c),
        None => e.qps[0].post_recv(c),
    }
    .map_err(|err| format!("post_recv: {err}"))
}

/// Receive side of send_lat (both ends): `rx-depth` receives, before the peer may send.
pub fn post_initial_recvs<P: Provider>(e: &mut End<P>, args: &Args) -> Res<()> {
    let mut c = RecvChain::with_capacity(1, 1);
    for i in 0..args.rx_depth as u64 {
        post_recv(e, &mut c, i)?;
    }
    Ok(())
}

/// Waits for one receive; `None` when the peer asked to stop.
fn wait_recv<P: Provider>(e: &mut End<P>, live: &mut Live) -> Res<Option<WorkCompletion>> {
    let mut wc = [WorkCompletion::default()];
    loop {
        if e.rcq.poll(&mut wc).map_err(|err| format!("poll: {err}"))? == 1 {
            if !wc[0].is_ok() {
                return Err(format!("receive completion: {}", wc[0].status));
            }
            live.progress();
            return Ok(Some(wc[0]));
        }
        if live.idle()? {
            return Ok(None);
        }
    }
}

/// Posts `chain` (one WR, aimed by the caller) and reaps send completions without waiting;
/// a full send queue is drained first.
fn post_one<P: Provider>(e: &mut End<P>, chain: &SendChain, live: &mut Live) -> Res<()> {
    loop {
        match e.qps[0].post_send(chain) {
            Ok(()) => return Ok(()),
            Err(err) if err.errno == Errno::ENOMEM => {
                if !reap(e)? {
                    live.idle()?;
                }
            }
            Err(err) => return Err(format!("post_send: {err}")),
        }
    }
}

/// A chain of the one WR a latency test posts, built once: each iteration only re-aims it
/// ([`aim`]: wr_id, remote slot, SIGNALED), as perftest reuses its WR. Rebuilding it per
/// message (a `SendWr` from its default, pushed into the cleared chain) put ~36 instructions
/// into `post_one` and more into its caller, on the critical path of every hop: `send_lat`
/// read ~5% lower without it (docs/benchmarks.md, session 33).
fn lat_chain(wr: SendWr, sge: Sge) -> SendChain {
    let mut chain = SendChain::with_capacity(1, 1);
    chain.push(wr, &[sge]);
    chain
}

/// Aims the chain's WR (see [`lat_chain`]) at operation `i`.
#[inline]
fn aim_one(chain: &mut SendChain, i: u64, remote: &Remote, signaled: bool) {
    aim(&mut chain.wrs_mut()[0], i, i, remote, signaled);
}

/// Polls the send CQ once; whether anything completed.
fn reap<P: Provider>(e: &mut End<P>) -> Res<bool> {
    let mut wc = [WorkCompletion::default(); 16];
    let n = e.scq.poll(&mut wc).map_err(|err| format!("poll: {err}"))?;
    if let Some(w) = wc[..n].iter().find(|w| !w.is_ok()) {
        return Err(format!("send completion: {}", w.status));
    }
    Ok(n > 0)
}

/// The sequence byte written at the end of message `i` (never 0, so a fresh buffer differs).
fn seq_byte(i: u64) -> u8 {
    (i % 255) as u8 + 1
}

fn last_byte(region: &impl MemRegion, size: u64) -> u8 {
    let last = size as usize - 1;
    let word = region.read_volatile_u64(last & !7);
    (word >> ((last & 7) * 8)) as u8
}

/// Server side of send_lat / write_lat (receives already posted): answers each ping until the
/// client stops.
pub fn serve<P: Provider>(
    test: Test,
    args: &Args,
    size: u64,
    inline: u32,
    s: &mut End<P>,
    c: &Remote,
    live: &mut Live,
) -> Res<()> {
    let mut rchain = RecvChain::with_capacity(1, 1);
    // (`slot_index`: the signal test is a mask for a power of two, not a division on the
    // path from the ping to the reply.)
    let cq_mod = args.cq_mod as u64;
    let dest = s.dests[0];
    match test {
        Test::send_lat => {
            let mut chain = lat_chain(wr_for(test, 0, 0, size, inline, dest, c), s.sge(0, size));
            let mut i = 0u64;
            while let Some(w) = wait_recv(s, live)? {
                // Answer first, then repost: the reply is the critical path, and rx_depth
                // receives stay posted, so the next ping always finds one.
                aim_one(&mut chain, i, c, slot_index(i + 1, cq_mod) == 0);
                post_one(s, &chain, live)?;
                post_recv(s, &mut rchain, w.wr_id)?;
                reap(s)?;
                i += 1;
            }
            Ok(())
        }
        Test::write_lat => {
            let mut chain = lat_chain(wr_for(test, 0, 0, size, inline, dest, c), s.sge(1, size));
            let mut i = 0u64;
            loop {
                let want = seq_byte(i);
                while last_byte(&s.region, size) != want {
                    if live.idle()? {
                        return Ok(());
                    }
                }
                live.progress();
                // Reply from slot 1 into the client's slot 0 (we poll our slot 0).
                s.region.fill(s.slot as usize + size as usize - 1, 1, want);
                aim_one(&mut chain, 0, c, slot_index(i + 1, cq_mod) == 0);
                post_one(s, &chain, live)?;
                reap(s)?;
                i += 1;
            }
        }
        _ => Ok(()), // one-sided tests need nothing from the server
    }
}

/// Client side (receives already posted for send_lat): `iterations` samples (or `-D`
/// seconds' worth) in nanoseconds, half or full round trip.
pub fn run_client<P: Provider>(
    test: Test,
    args: &Args,
    size: u64,
    inline: u32,
    c: &mut End<P>,
    s: &Remote,
    live: &mut Live,
) -> Res<Histogram<u64>> {
    let iters = if args.duration.is_some() { u64::MAX } else { args.iterations() };
    let deadline = args.duration.map(|d| Instant::now() + Duration::from_secs_f64(d));
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).expect("constant histogram bounds");
    let mut rchain = RecvChain::with_capacity(1, 1);
    let cq_mod = args.cq_mod as u64;
    let dest = c.dests[0];
    // The WR each test posts (atomics and READs land 8 or `size` bytes; send and write_lat
    // send from slot 0 and 1 as the server expects).
    let (slot, len, inl) = match test {
        Test::send_lat => (0, size, inline),
        Test::write_lat => (1, size, inline),
        Test::atomic_lat => (0, 8, 0),
        _ => (0, size, 0),
    };
    let mut chain = lat_chain(wr_for(test, 0, 0, size, inl, dest, s), c.sge(slot, len));
    let start = Instant::now();
    let mut progress = crate::report::Progress::new(start);
    let mut wc = [WorkCompletion::default()];
    // Samples are read from the TSC (`Clock`), as perftest (`get_cycles`) and ucx_perftest
    // do: `Instant::now` is a vDSO call of ~25 ns on this VM, about half of which lands
    // inside each sample. The start is read unfenced (read early, it only lengthens the
    // sample); the end is fenced behind the loads that saw the reply.
    let clock = Clock::new();
    for i in 0..iters {
        if args.gap_ns != 0 {
            clock.spin_for(args.gap_ns);
        }
        let t0 = clock.now_ns_unordered();
        let sample = match test {
            Test::send_lat => {
                aim_one(&mut chain, i, s, slot_index(i + 1, cq_mod) == 0);
                post_one(c, &chain, live)?;
                let Some(w) = wait_recv(c, live)? else {
                    return Err("send_lat: stopped while waiting for a reply".into());
                };
                // The sample ends at the reply's completion; reposting is bookkeeping.
                let ns = clock.now_ns().saturating_sub(t0) / 2;
                post_recv(c, &mut rchain, w.wr_id)?;
                reap(c)?;
                ns
            }
            Test::write_lat => {
                let want = seq_byte(i);
                // Send from slot 1 into the server's slot 0; the echo lands in our slot 0.
                c.region.fill(c.slot as usize + size as usize - 1, 1, want);
                aim_one(&mut chain, 0, s, slot_index(i + 1, cq_mod) == 0);
                post_one(c, &chain, live)?;
                while last_byte(&c.region, size) != want {
                    live.idle()?;
                }
                live.progress();
                let ns = clock.now_ns().saturating_sub(t0) / 2;
                reap(c)?;
                ns
            }
            _ => {
                aim_one(&mut chain, i, s, true);
                post_one(c, &chain, live)?;
                while c.scq.poll(&mut wc).map_err(|e| format!("poll: {e}"))? == 0 {
                    live.idle()?;
                }
                live.progress();
                let ns = clock.now_ns().saturating_sub(t0);
                if !wc[0].is_ok() {
                    return Err(format!("completion: {}", wc[0].status));
                }
                ns
            }
        };
        hist.record(sample.max(1)).ok();
        if i % 1024 == 0 {
            let now = Instant::now();
            progress.tick(now, i, iters);
            if deadline.is_some_and(|d| now >= d) {
                break;
            }
        }
    }
    Ok(hist)
}

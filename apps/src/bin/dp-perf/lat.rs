//! Latency tests. send_lat and write_lat are ping-pongs reported as half the round trip;
//! read_lat and atomic_lat are one-sided and reported as the full round trip, as perftest does.

use crate::args::{Args, Test};
use crate::bw::wr_for;
use crate::setup::{End, Remote};
use dataplane::verbs::*;
use dataplane::{Cq, MemRegion, Qp, Srq};
use hdrhistogram::Histogram;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

fn post_recv(e: &mut End, i: u64) {
    let c = RecvChain::one(i, &[e.recv_sge(i)]);
    match e.srq.as_mut() {
        Some(s) => s.post_recv(&c),
        None => e.qp.post_recv(&c),
    }
    .unwrap_or_else(|err| crate::fail("post_recv", err));
}

fn wait_recv(e: &mut End, stop: &AtomicBool) -> Option<WorkCompletion> {
    let mut wc = [WorkCompletion::default()];
    loop {
        if e.rcq.poll(&mut wc).unwrap_or_else(|err| crate::fail("poll", err)) == 1 {
            if !wc[0].is_ok() {
                crate::fail("receive", wc[0].status);
            }
            return Some(wc[0]);
        }
        if stop.load(Ordering::Acquire) {
            return None;
        }
    }
}

/// Posts one WR (signaled every cq-mod, always for one-sided tests) and reaps send
/// completions without waiting.
fn post_one(e: &mut End, chain: &mut SendChain, wr: SendWr, sge: Sge, signal: bool) {
    chain.clear();
    chain.push(if signal { wr.signaled() } else { wr }, &[sge]);
    loop {
        match e.qp.post_send(chain) {
            Ok(()) => break,
            Err(err) if err.errno == Errno::ENOMEM => reap(e),
            Err(err) => crate::fail("post_send", err),
        }
    }
}

fn reap(e: &mut End) {
    let mut wc = [WorkCompletion::default(); 16];
    let n = e.scq.poll(&mut wc).unwrap_or_else(|err| crate::fail("poll", err));
    if let Some(w) = wc[..n].iter().find(|w| !w.is_ok()) {
        crate::fail("send completion", w.status);
    }
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

/// Server side of send_lat / write_lat: answers each ping until `stop`.
pub fn serve(test: Test, args: &Args, size: u64, s: &mut End, c: &Remote, stop: &AtomicBool) {
    let inline = args.inline_size();
    let mut chain = SendChain::with_capacity(1, 1);
    let cq_mod = args.cq_mod as u64;
    match test {
        Test::send_lat => {
            for i in 0..args.rx_depth as u64 {
                post_recv(s, i);
            }
            let mut i = 0u64;
            while let Some(w) = wait_recv(s, stop) {
                post_recv(s, w.wr_id);
                let wr = wr_for(test, i, size, inline, s, c);
                post_one(s, &mut chain, wr, s.sge(0, size), (i + 1) % cq_mod == 0);
                reap(s);
                i += 1;
            }
        }
        Test::write_lat => {
            let mut i = 0u64;
            loop {
                let want = seq_byte(i);
                while last_byte(&s.region, size) != want {
                    if stop.load(Ordering::Acquire) {
                        return;
                    }
                }
                // Reply from slot 1 into the client's slot 0 (we poll our slot 0).
                s.region.fill(s.slot as usize + size as usize - 1, 1, want);
                let wr = wr_for(test, 0, size, inline, s, c);
                post_one(s, &mut chain, wr, s.sge(1, size), (i + 1) % cq_mod == 0);
                reap(s);
                i += 1;
            }
        }
        _ => {} // one-sided tests need nothing from the server
    }
}

/// Client side: `iters` samples in nanoseconds (half or full round trip).
pub fn run_client(test: Test, args: &Args, size: u64, c: &mut End, s: &Remote, stop: &AtomicBool) -> Histogram<u64> {
    let iters = args.iterations();
    let inline = args.inline_size();
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).expect("histogram bounds");
    let mut chain = SendChain::with_capacity(1, 1);
    let cq_mod = args.cq_mod as u64;
    let start = Instant::now();
    let mut progress = crate::report::Progress::new(start);
    if test == Test::send_lat {
        for i in 0..args.rx_depth as u64 {
            post_recv(c, i);
        }
    }
    let mut wc = [WorkCompletion::default()];
    for i in 0..iters {
        let t0 = Instant::now();
        let sample = match test {
            Test::send_lat => {
                let wr = wr_for(test, i, size, inline, c, s);
                post_one(c, &mut chain, wr, c.sge(0, size), (i + 1) % cq_mod == 0);
                let w = wait_recv(c, stop).expect("not stopped");
                post_recv(c, w.wr_id);
                let ns = t0.elapsed().as_nanos() as u64 / 2;
                reap(c);
                ns
            }
            Test::write_lat => {
                let want = seq_byte(i);
                // Send from slot 1 into the server's slot 0; the echo lands in our slot 0.
                c.region.fill(c.slot as usize + size as usize - 1, 1, want);
                let wr = wr_for(test, 0, size, inline, c, s);
                post_one(c, &mut chain, wr, c.sge(1, size), (i + 1) % cq_mod == 0);
                while last_byte(&c.region, size) != want {}
                let ns = t0.elapsed().as_nanos() as u64 / 2;
                reap(c);
                ns
            }
            _ => {
                let len = if test == Test::atomic_lat { 8 } else { size };
                let wr = wr_for(test, i, size, 0, c, s);
                post_one(c, &mut chain, wr, c.sge(0, len), true);
                while c.scq.poll(&mut wc).unwrap_or_else(|e| crate::fail("poll", e)) == 0 {}
                if !wc[0].is_ok() {
                    crate::fail("completion", wc[0].status);
                }
                t0.elapsed().as_nanos() as u64
            }
        };
        hist.record(sample.max(1)).ok();
        if i % 4096 == 0 {
            progress.tick(Instant::now(), i, iters);
        }
    }
    hist
}

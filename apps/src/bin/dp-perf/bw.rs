//! Bandwidth / message-rate tests: the client keeps up to `tx-depth` WRs outstanding, posts
//! `post_list` per doorbell, signals every `cq-mod`th; the server receives (send_bw) or stays
//! passive (write/read/atomic).

use crate::args::{Args, Test};
use crate::setup::{ud_dest, End, Remote};
use dataplane::verbs::*;
use dataplane::{Cq, Qp, Srq};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Result of one bandwidth run.
pub struct Bw {
    /// Completed operations.
    pub iters: u64,
    /// Seconds from the first post to the last completion.
    pub secs: f64,
    /// Best rate over any window of at least 1 ms (operations per second).
    pub peak: f64,
}

/// The work request for operation `i`.
pub fn wr_for(test: Test, i: u64, size: u64, inline: u32, client: &End, server: &Remote) -> SendWr {
    let remote = server.addr(i);
    let rkey = server.rkey;
    let mut wr = match test {
        Test::send_bw | Test::send_lat => SendWr::send(i),
        Test::write_bw | Test::write_lat => SendWr::write(i, remote, rkey),
        Test::read_bw | Test::read_lat => SendWr::read(i, remote, rkey),
        Test::atomic_bw | Test::atomic_lat => SendWr::fetch_add(i, server.base(), rkey, 1),
    };
    if let Some((ah, qpn)) = ud_dest(client) {
        wr = wr.to(ah, qpn, crate::setup::QKEY);
    }
    if size <= inline as u64 && wr.opcode.inline_allowed() {
        wr = wr.inline();
    }
    wr
}

/// Server side of send_bw: keeps receives posted until `stop`, returns how many arrived.
pub fn serve_recv(e: &mut End, args: &Args, stop: &AtomicBool) -> u64 {
    let depth = args.rx_depth as u64;
    let mut chain = RecvChain::with_capacity(64, 64);
    let mut post = |e: &mut End, ids: &mut dyn Iterator<Item = u64>| {
        chain.clear();
        for i in ids {
            chain.push(RecvWr::new(i), &[e.recv_sge(i)]);
        }
        let r = match e.srq.as_mut() {
            Some(s) => s.post_recv(&chain),
            None => e.qp.post_recv(&chain),
        };
        r.unwrap_or_else(|err| crate::fail("post_recv", err));
    };
    for start in (0..depth).step_by(64) {
        post(e, &mut (start..(start + 64).min(depth)));
    }
    let mut wc = [WorkCompletion::default(); 64];
    let mut got = 0;
    loop {
        let n = e.rcq.poll(&mut wc).unwrap_or_else(|err| crate::fail("poll", err));
        if n == 0 {
            if stop.load(Ordering::Acquire) {
                return got;
            }
            continue;
        }
        if let Some(w) = wc[..n].iter().find(|w| !w.is_ok()) {
            crate::fail("receive", w.status);
        }
        got += n as u64;
        post(e, &mut wc[..n].iter().map(|w| w.wr_id));
    }
}

/// Client side: runs `iters` operations (or until `duration`).
pub fn run_client(test: Test, args: &Args, size: u64, c: &mut End, s: &Remote) -> Bw {
    let iters = if args.duration.is_some() { u64::MAX } else { args.iterations() };
    let deadline = args.duration.map(|d| Instant::now() + Duration::from_secs_f64(d));
    let (pl, cq_mod, depth) = (args.post_list as u64, args.cq_mod as u64, args.tx_depth as u64);
    let inline = args.inline_size();
    let mut chain = SendChain::with_capacity(pl as usize, pl as usize);
    let mut wc = [WorkCompletion::default(); 64];
    let (mut posted, mut done) = (0u64, 0u64);
    let mut limit = iters;
    let start = Instant::now();
    let (mut mark_t, mut mark_n, mut peak) = (start, 0u64, 0f64);
    let mut progress = crate::report::Progress::new(start);
    while done < limit {
        while posted < limit && posted - done + pl <= depth {
            let k = pl.min(limit - posted);
            chain.clear();
            for j in 0..k {
                let i = posted + j;
                let mut wr = wr_for(test, i, size, inline, c, s);
                if (i + 1) % cq_mod == 0 || i + 1 == limit || j + 1 == k && k < pl {
                    wr = wr.signaled();
                }
                let len = if matches!(test, Test::atomic_bw) { 8 } else { size };
                chain.push(wr, &[c.sge(i, len)]);
            }
            match c.qp.post_send(&chain) {
                Ok(()) => posted += k,
                Err(e) if e.errno == Errno::ENOMEM && e.bad_wr == 0 => break,
                Err(e) => crate::fail("post_send", e),
            }
        }
        let n = c.scq.poll(&mut wc).unwrap_or_else(|e| crate::fail("poll", e));
        for w in &wc[..n] {
            if !w.is_ok() {
                crate::fail("send completion", w.status);
            }
            done = done.max(w.wr_id + 1);
        }
        if n > 0 {
            let now = Instant::now();
            let dt = now.duration_since(mark_t);
            if dt >= Duration::from_millis(1) {
                peak = peak.max((done - mark_n) as f64 / dt.as_secs_f64());
                (mark_t, mark_n) = (now, done);
                progress.tick(now, done, limit);
                if deadline.is_some_and(|d| now >= d) && limit == u64::MAX {
                    limit = posted; // stop posting; drain what is in flight
                }
            }
        }
    }
    let secs = start.elapsed().as_secs_f64();
    if std::env::var_os("DP_PERF_DEBUG").is_some() {
        eprintln!("dp-perf: {} send-queue retries (RNR or unreachable)", c.qp.retries());
    }
    let avg = done as f64 / secs;
    Bw { iters: done, secs, peak: peak.max(avg) }
}

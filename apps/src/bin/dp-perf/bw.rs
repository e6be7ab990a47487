//! Bandwidth / message-rate tests: the client keeps up to `tx-depth` WRs outstanding on each
//! QP, posts `post_list` per doorbell, signals every `cq-mod`th; the server receives (send_bw)
//! or stays passive (write/read/atomic).

use crate::args::{Args, Test};
use crate::live::{Live, Res};
use crate::setup::{slot_index, End, Remote, QKEY};
use dataplane::verbs::*;
use dataplane::{Cq, Provider, Qp, Srq};
use std::time::{Duration, Instant};

/// Result of one bandwidth run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bw {
    /// Completed operations per QP (perftest's `#iterations`).
    pub iters: u64,
    /// Completed operations over all QPs.
    pub ops: u64,
    /// Seconds from the first post to the last completion.
    pub secs: f64,
    /// Best rate over any window of at least 1 ms (operations per second).
    pub peak: f64,
}

impl Bw {
    /// Both directions of a `-b` run as one, as perftest reports them: operations and peaks
    /// summed, over the longer of the two times; `iters` stays per direction.
    pub fn both_ways(&self, other: &Bw) -> Bw {
        Bw {
            iters: self.iters,
            ops: self.ops + other.ops,
            secs: self.secs.max(other.secs),
            peak: self.peak + other.peak,
        }
    }
}

/// QP index in the top 16 bits of a wr_id, the per-QP sequence number below.
const QP_SHIFT: u32 = 48;

/// The wr_id of operation `i` of QP `q`.
pub fn wr_id(q: usize, i: u64) -> u64 {
    (q as u64) << QP_SHIFT | i
}

/// Splits a wr_id into (QP index, sequence number).
pub fn split_wr_id(id: u64) -> (usize, u64) {
    ((id >> QP_SHIFT) as usize, id & ((1 << QP_SHIFT) - 1))
}

/// The work request for operation `i` (`id` its wr_id) towards `server`; `dest` is the UD
/// destination of the QP (`None` for connected QPs).
pub fn wr_for(
    test: Test,
    id: u64,
    i: u64,
    size: u64,
    inline: u32,
    dest: Option<(AhHandle, u32)>,
    server: &Remote,
) -> SendWr {
    let (remote, rkey) = (server.addr(i), server.rkey);
    let mut wr = match test {
        Test::send_bw | Test::send_lat => SendWr::send(id),
        Test::write_bw | Test::write_lat => SendWr::write(id, remote, rkey),
        Test::read_bw | Test::read_lat => SendWr::read(id, remote, rkey),
        Test::atomic_bw | Test::atomic_lat => SendWr::fetch_add(id, server.base(), rkey, 1),
    };
    if let Some((ah, qpn)) = dest {
        wr = wr.to(ah, qpn, QKEY);
    }
    // XRC: the SRQ the request lands in (ignored on other QP types).
    wr = wr.xrc_srqn(server.srqn);
    if size <= inline as u64 && wr.opcode.inline_allowed() {
        wr = wr.inline();
    }
    wr
}

/// Re-aims `wr`, built by [`wr_for`] for another operation of the same test, QP and size, at
/// operation `i` (`id` its wr_id): what differs between them is the wr_id, the remote slot
/// of an RDMA WRITE or READ (read off the WR's opcode), and whether it is signaled.
pub fn aim(wr: &mut SendWr, id: u64, i: u64, server: &Remote, signaled: bool) {
    wr.wr_id = id;
    if matches!(wr.opcode, WrOpcode::RdmaWrite | WrOpcode::RdmaRead) {
        wr.remote_addr = server.addr(i);
    }
    wr.flags.set(SendFlags::SIGNALED, signaled);
}

/// Receive side of send tests: posts `rx-depth` receives on each QP (or on the SRQ), before
/// the peer is told to start. Receive wr_ids carry the QP index, as sends do.
pub fn post_initial_recvs<P: Provider>(e: &mut End<P>, args: &Args) -> Res<()> {
    let depth = args.rx_depth as u64;
    let mut chain = RecvChain::with_capacity(64, 64);
    let targets = if e.srq.is_some() { 1 } else { e.qps.len() };
    for q in 0..targets {
        for start in (0..depth).step_by(64) {
            chain.clear();
            for i in start..(start + 64).min(depth) {
                chain.push(RecvWr::new(wr_id(q, i)), &[e.recv_sge(i)]);
            }
            post_recvs(e, q, &chain)?;
        }
    }
    Ok(())
}

fn post_recvs<P: Provider>(e: &mut End<P>, q: usize, chain: &RecvChain) -> Res<()> {
    let r = match e.srq.as_mut() {
        Some(s) => s.post_recv(chain),
        None => e.qps[q].post_recv(chain),
    };
    r.map_err(|err| format!("post_recv: {err}"))
}

/// The receiving half of send_bw: polls the receive CQ and reposts each consumed receive.
pub struct Receiver {
    chains: Vec<RecvChain>,
    wc: [WorkCompletion; 64],
    /// Messages received so far.
    pub got: u64,
    /// Whether this end's sends wait for the first message from the peer: a server process
    /// learns that the client's QP can receive (it is connected once it sends) that way.
    pub hold_sends: bool,
}

impl Receiver {
    /// For `e`'s QPs (or its SRQ), whose receives [`post_initial_recvs`] posted.
    pub fn new<P: Provider>(e: &End<P>) -> Receiver {
        let targets = if e.srq.is_some() { 1 } else { e.qps.len() };
        let chains = (0..targets).map(|_| RecvChain::with_capacity(64, 64)).collect();
        Receiver { chains, wc: [WorkCompletion::default(); 64], got: 0, hold_sends: false }
    }

    /// One poll of the receive CQ; reposts what it consumed. Returns the messages it took.
    pub fn poll<P: Provider>(&mut self, e: &mut End<P>) -> Res<usize> {
        let n = e.rcq.poll(&mut self.wc).map_err(|err| format!("poll: {err}"))?;
        if n == 0 {
            return Ok(0);
        }
        self.got += n as u64;
        let last = self.chains.len() - 1;
        for w in &self.wc[..n] {
            if !w.is_ok() {
                return Err(format!("receive completion: {}", w.status));
            }
            let (q, i) = split_wr_id(w.wr_id);
            self.chains[q.min(last)].push(RecvWr::new(w.wr_id), &[e.recv_sge(i)]);
        }
        for (q, chain) in self.chains.iter_mut().enumerate() {
            if !chain.is_empty() {
                post_recvs(e, q, chain)?;
                chain.clear();
            }
        }
        Ok(n)
    }
}

/// Server side of send_bw (receives already posted): reposts each consumed receive until the
/// client stops; returns how many arrived.
pub fn serve_recv<P: Provider>(e: &mut End<P>, live: &mut Live) -> Res<u64> {
    let mut rx = Receiver::new(e);
    loop {
        if rx.poll(e)? == 0 {
            if live.idle()? {
                return Ok(rx.got);
            }
            continue;
        }
        live.progress();
    }
}

/// Client side: `iterations` operations per QP (or until `-D` seconds have passed). With
/// `rx` (`-b`, send_bw) it also receives the peer's `iterations` messages per QP in the same
/// loop, reposting each receive, and ends once they all arrived too.
pub fn run_client<P: Provider>(
    args: &Args,
    size: u64,
    inline: u32,
    c: &mut End<P>,
    s: &Remote,
    live: &mut Live,
    mut rx: Option<&mut Receiver>,
) -> Res<Bw> {
    let test = args.test;
    let nq = c.qps.len();
    let per_qp = if args.duration.is_some() { u64::MAX } else { args.iterations() };
    let deadline = args.duration.map(|d| Instant::now() + Duration::from_secs_f64(d));
    let (pl, cq_mod, depth) = (args.post_list as u64, args.cq_mod as u64, args.tx_depth as u64);
    let len = if test == Test::atomic_bw { 8 } else { size };
    // One chain per QP, built once and re-aimed in place for every full post list, as
    // perftest posts its prepared `ibv_send_wr` lists: rebuilding each WR per post cost the
    // sender ~35 instructions per message (a quarter of its time at 8 B, `perf`), charged to
    // the transport under test. A chain holding fewer than `pl` WRs (none yet, or a shorter
    // tail list) is built afresh.
    let mut chains: Vec<SendChain> = (0..nq).map(|_| SendChain::with_capacity(pl as usize, pl as usize)).collect();
    let mut wc = [WorkCompletion::default(); 64];
    let (mut posted, mut done, mut limit) = (vec![0u64; nq], vec![0u64; nq], vec![per_qp; nq]);
    let mut total = 0u64;
    let start = Instant::now();
    let (mut mark_t, mut mark_n, mut peak) = (start, 0u64, 0f64);
    let mut progress = crate::report::Progress::new(start);
    let goal = per_qp.saturating_mul(nq as u64);
    loop {
        let hold = rx.as_ref().is_some_and(|r| r.hold_sends && r.got == 0);
        let mut finished = !hold;
        for q in 0..nq {
            finished &= done[q] >= limit[q];
            while !hold && posted[q] < limit[q] && posted[q] - done[q] + pl <= depth {
                let k = pl.min(limit[q] - posted[q]);
                // Every cq_mod-th and the last: completions retire everything before them.
                // (`slot_index`: a mask for the usual power of two, not a division per WR,
                // which showed in `perf` of the sender at `-l 32`, session 57.)
                let signaled = |i: u64| slot_index(i + 1, cq_mod) == 0 || i + 1 == limit[q];
                let chain = &mut chains[q];
                if k == pl && chain.len() == pl as usize {
                    for j in 0..k as usize {
                        let i = posted[q] + j as u64;
                        aim(&mut chain.wrs_mut()[j], wr_id(q, i), i, s, signaled(i));
                        chain.sges_mut(j)[0].addr = c.addr(i);
                    }
                } else {
                    chain.clear();
                    for j in 0..k {
                        let i = posted[q] + j;
                        let mut wr = wr_for(test, wr_id(q, i), i, size, inline, c.dests[q], s);
                        if signaled(i) {
                            wr = wr.signaled();
                        }
                        chain.push(wr, &[c.sge(i, len)]);
                    }
                }
                match c.qps[q].post_send(chain) {
                    Ok(()) => posted[q] += k,
                    Err(e) if e.errno == Errno::ENOMEM && e.bad_wr == 0 => break,
                    Err(e) => return Err(format!("post_send: {e}")),
                }
            }
        }
        let got = match rx.as_deref_mut() {
            Some(r) => r.poll(c)?,
            None => 0,
        };
        if finished && rx.as_ref().is_none_or(|r| r.got >= goal) {
            break;
        }
        let n = c.scq.poll(&mut wc).map_err(|e| format!("poll: {e}"))?;
        if n == 0 {
            if got == 0 {
                live.idle()?;
            } else {
                live.progress();
            }
            continue;
        }
        live.progress();
        for w in &wc[..n] {
            if !w.is_ok() {
                return Err(format!("send completion: {}", w.status));
            }
            let (q, i) = split_wr_id(w.wr_id);
            if let Some(d) = done.get_mut(q) {
                total += (i + 1).saturating_sub(*d);
                *d = (*d).max(i + 1);
            }
        }
        let now = Instant::now();
        let dt = now.duration_since(mark_t);
        if dt >= Duration::from_millis(1) {
            peak = peak.max((total - mark_n) as f64 / dt.as_secs_f64());
            (mark_t, mark_n) = (now, total);
            progress.tick(now, total, goal);
            if deadline.is_some_and(|d| now >= d) && limit[0] == u64::MAX {
                // Stop at the next signaled WR of each QP, so the last one posted completes.
                for q in 0..nq {
                    limit[q] = posted[q].next_multiple_of(cq_mod).max(1);
                }
            }
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let avg = total as f64 / secs;
    Ok(Bw { iters: total / nq as u64, ops: total, secs, peak: peak.max(avg) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_aimed_wr_is_the_wr_built_for_its_operation() {
        let mem = dataplane::conn::RemoteMem { rkey: 7, addr: 0x10_000, len: 4 * 4160 };
        let server = Remote::new(&mem, 4160).unwrap();
        for test in [Test::send_bw, Test::write_bw, Test::read_bw, Test::atomic_bw] {
            for (inline, signaled) in [(0, false), (236, true)] {
                // Built for operation 1 with the other signaled flag, aimed at operation 6
                // (another slot, as posts cycle).
                let mut wr = wr_for(test, wr_id(2, 1), 1, 64, inline, None, &server);
                if !signaled {
                    wr = wr.signaled();
                }
                aim(&mut wr, wr_id(2, 6), 6, &server, signaled);
                let mut want = wr_for(test, wr_id(2, 6), 6, 64, inline, None, &server);
                if signaled {
                    want = want.signaled();
                }
                assert_eq!(wr, want, "{test:?} inline {inline} signaled {signaled}");
            }
        }
    }

    #[test]
    fn wr_ids_carry_the_qp() {
        assert_eq!(split_wr_id(wr_id(0, 77)), (0, 77));
        assert_eq!(split_wr_id(wr_id(15, (1 << 40) + 3)), (15, (1 << 40) + 3));
    }
}

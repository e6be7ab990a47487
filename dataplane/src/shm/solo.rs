//! The single-consumer mode of a connected QP's receive queue: its connected sender claims
//! requests with a plain store to the ring's `head` instead of a CAS.
//!
//! Why: a lone RC SEND's post ran three locked instructions, and on the development host a
//! locked instruction on the critical path of a one-way trip is several percent of it (an
//! unsound throwaway that made this CAS a plain store read `send_lat` 0.953x, 215 -> 205 ns;
//! docs/benchmarks.md, session 47). The issue's own idea: "a receive entry the sender can
//! claim with one plain load when the RQ has a single producer and a single consumer".
//!
//! Who consumes an RC or UC receive queue:
//! - its connected sender, on the send queue's paths (`doorbell`, `exec`), which the send
//!   queue's lock orders one after the other (`sq_lock`);
//! - the drainer of the receive CQ's message queue, for the SENDs that sender queued
//!   (`drain`). The sender pops again only once they are all drained (`MqState::settle`: an
//!   Acquire load of the queue's `head`, which the drainer publishes with Release after its
//!   pops), and its queued messages are published after its earlier pops: the two never
//!   overlap, and each sees the other's `head`;
//! - whoever flushes it (`qp_error::flush_rq`: the owner or a sender that found the QP in
//!   error) or empties it (`ShmQp` on RESET): any thread of any process, at any time.
//!
//! So only the last kind races the sender, and it is rare: those revoke the mode first
//! ([`revoke`]). The sender takes the mode once per connection ([`Ring::solo_claim`], a CAS)
//! and pops with [`Ring::pop_solo`] while it holds; after a revocation every pop is a CAS for
//! the ring's life. The revocation is an asymmetric Dekker (described at `pop_solo`): the
//! sender's side has no fence, and the revoker makes every thread of every process that may
//! hold the mode run one with `membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED)` (0.3 us on the
//! development VM; the non-expedited command, 12 ms, is the fallback). A process takes the
//! mode only if it registered for that command ([`enabled`]), so every holder is covered.
//!
//! `DATAPLANE_SHM_SOLO=0` turns the mode off for a process (every pop a CAS, as before).
//! Not model-checked by loom, which has no asymmetric fence; `tests` race a holder against
//! revokers on real threads.

use super::fabric::pid_alive;
use super::ring::{Ring, HELD_CELL_PATIENCE};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// How long a revocation waits for a holder's flag to fall ([`revoke`]): the ring's own
/// patience for a consumer between its claim and its free.
const REVOKE_PATIENCE: Duration = HELD_CELL_PATIENCE;

/// `membarrier` commands (linux/membarrier.h).
const CMD_QUERY: libc::c_int = 0;
const CMD_GLOBAL: libc::c_int = 1;
const CMD_GLOBAL_EXPEDITED: libc::c_int = 1 << 1;
const CMD_REGISTER_GLOBAL_EXPEDITED: libc::c_int = 1 << 2;

fn membarrier(cmd: libc::c_int) -> libc::c_long {
    // SAFETY: membarrier takes two integers and touches no memory of ours.
    unsafe { libc::syscall(libc::SYS_membarrier, cmd, 0 as libc::c_uint, 0 as libc::c_int) }
}

/// Whether this process may hold the mode: it registered for
/// `MEMBARRIER_CMD_GLOBAL_EXPEDITED` (once per process, when it opens its first context),
/// and `DATAPLANE_SHM_SOLO` is not `0`.
pub(crate) fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        if std::env::var("DATAPLANE_SHM_SOLO").is_ok_and(|v| v == "0") {
            return false;
        }
        let both = libc::c_long::from(CMD_GLOBAL_EXPEDITED | CMD_REGISTER_GLOBAL_EXPEDITED);
        let q = membarrier(CMD_QUERY);
        q >= 0 && q & both == both && membarrier(CMD_REGISTER_GLOBAL_EXPEDITED) == 0
    })
}

/// Ends `ring`'s single-consumer mode before a pop by anyone but its holder: afterwards the
/// holder pops with CAS, and a pop of its that was under way is complete (its `head` is
/// visible to the caller). Returns at once when no one ever held the mode.
///
/// A holder that died inside a pop is not waited for, nor one whose flag stays up past
/// [`REVOKE_PATIENCE`] (a pop is a few instructions: only a holder descheduled that long,
/// or a peer scribbling the flag, keeps it up; the trust boundary of `ring.rs` says no
/// shared word may hold a caller forever). Past that bound a holder still inside its pop
/// could take the request the caller takes next, as a consumer descheduled between a claim
/// and its free can make a bounded post wait and fail (`Ring::wait_held_cell`).
#[cold]
pub(crate) fn revoke(ring: &Ring) {
    if !ring.solo_revoke() {
        return;
    }
    barrier();
    let deadline = Instant::now() + REVOKE_PATIENCE;
    loop {
        let (busy, pid) = ring.solo_busy();
        // A holder id of 0 is not visible yet: the holder is alive and just took the mode.
        if !busy || (pid != 0 && !pid_alive(pid)) || Instant::now() >= deadline {
            return;
        }
        std::thread::yield_now();
    }
}

/// A full memory barrier on every running thread of every process that may hold a mode.
/// Falls back to the non-expedited command; were both refused, no process could have
/// registered either ([`enabled`] needs the first), so there is no holder to order against.
fn barrier() {
    if membarrier(CMD_GLOBAL_EXPEDITED) != 0 {
        let _ = membarrier(CMD_GLOBAL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shm::ring::{Pop, SOLO_FREE, SOLO_HELD, SOLO_SHARED};
    use crate::shm::{unit_context, Shm};
    use crate::verbs::*;
    use crate::{Context, Cq, Mr, Pd, Provider, Qp, QpInitAttr};
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

    #[repr(C, align(128))]
    struct Buf([u8; 4096]);

    /// The mode needs `membarrier` (Linux 4.16); where a kernel lacks it the provider pops
    /// with CAS, and this says so rather than letting the tests below pass vacuously.
    fn require_membarrier() {
        let off = std::env::var("DATAPLANE_SHM_SOLO").is_ok_and(|v| v == "0");
        assert!(off || enabled(), "membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED) is unavailable on this kernel");
    }

    /// A holder popping with plain stores, a revoker that ends the mode at a different point of
    /// the stream in each round and then pops with CAS, and one producer: every entry is
    /// taken exactly once, in order by each consumer. A revoker that does not wait for the
    /// holder's flag fails it (3 runs of 3 with that bug seeded); a revoker without the
    /// barrier did not (3 runs): that window is a store buffer's few nanoseconds once per
    /// round, and its ordering rests on the argument at `Ring::pop_solo` and on membarrier's
    /// documented guarantee.
    #[test]
    fn a_revocation_mid_stream_neither_loses_nor_duplicates() {
        require_membarrier();
        const N: u64 = 20_000;
        for round in 0..16u64 {
            let mut b = Box::new(Buf([0; 4096]));
            // SAFETY: 64 cells of 16 bytes and the header fit in the 4096 aligned bytes.
            let r = unsafe { Ring::init(b.0.as_mut_ptr(), 64, 16) };
            assert!(r.solo_claim(std::process::id()));
            assert!(!r.solo_claim(std::process::id()), "the mode has one holder");
            let taken_by_holder = AtomicU64::new(0);
            let revoked = AtomicBool::new(false);
            let (held, cas) = std::thread::scope(|s| {
                let holder = s.spawn(|| {
                    let mut got = Vec::new();
                    let mut solo = true;
                    loop {
                        let mut v = 0u64;
                        // SAFETY (both pops): 8-byte payloads.
                        let item = if solo {
                            match r.pop_solo(|c| v = c.get(0)) {
                                Some(Ok(pos)) => {
                                    r.release(pos);
                                    true
                                }
                                Some(Err(Pop::Empty)) => false,
                                Some(Err(_)) => panic!("a healthy ring stalled"),
                                None => {
                                    solo = false;
                                    false
                                }
                            }
                        } else {
                            matches!(r.pop(|c| v = c.get(0)), Pop::Item)
                        };
                        if item {
                            if v == u64::MAX {
                                return (got, solo);
                            }
                            got.push(v);
                            taken_by_holder.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                });
                let revoker = s.spawn(|| {
                    let at = (round + 1) * N / 40;
                    while taken_by_holder.load(Ordering::Relaxed) < at {
                        std::hint::spin_loop();
                    }
                    revoke(&r);
                    revoked.store(true, Ordering::Release);
                    let mut got = Vec::new();
                    loop {
                        let mut v = 0u64;
                        // SAFETY: 8-byte payload.
                        if let Pop::Item = r.pop(|c| v = c.get(0)) {
                            if v == u64::MAX {
                                return got;
                            }
                            got.push(v);
                        }
                    }
                });
                for i in (0..N).chain([u64::MAX; 2]) {
                    // Half the stream waits for the revocation, so that it always comes
                    // mid-stream (on two cores the revoker may not run for a whole slice).
                    while i == N / 2 && !revoked.load(Ordering::Acquire) {
                        std::thread::yield_now();
                    }
                    // SAFETY: 8-byte payload.
                    while !r.push_single(|mut c| c.put(0, &i)) {
                        std::hint::spin_loop();
                    }
                }
                (holder.join().unwrap(), revoker.join().unwrap())
            });
            let (held, still_solo) = held;
            assert!(!still_solo, "the holder saw the revocation");
            assert_eq!(r.solo_mode(), SOLO_SHARED);
            for t in [&held, &cas] {
                assert!(t.windows(2).all(|w| w[0] < w[1]), "each consumer takes entries in order");
            }
            let mut all: Vec<u64> = held.iter().chain(&cas).copied().collect();
            all.sort_unstable();
            assert_eq!(all.len() as u64, N, "round {round}: every entry taken once");
            assert!(all.iter().copied().eq(0..N), "round {round}: every entry taken once");
            drop(b);
        }
    }

    /// A revocation of a ring nobody ever held returns at once, and nobody can take it after.
    #[test]
    fn a_ring_revoked_before_any_holder_stays_shared() {
        let mut b = Box::new(Buf([0; 4096]));
        // SAFETY: as above.
        let r = unsafe { Ring::init(b.0.as_mut_ptr(), 64, 16) };
        assert_eq!(r.solo_mode(), SOLO_FREE);
        revoke(&r);
        assert!(!r.solo_claim(1));
        // SAFETY: 8-byte payload.
        assert!(r.pop_solo(|c| assert_eq!(c.get::<u64>(0), 0)).is_none(), "no plain-store pop after a revocation");
        drop(b);
    }

    /// A flag left up (a peer scribbling it, with a live process id) holds a revocation no
    /// longer than the patience bound.
    #[test]
    fn a_flag_stuck_up_does_not_hold_a_revoker_forever() {
        let mut b = Box::new(Buf([0; 4096]));
        // SAFETY: as above.
        let r = unsafe { Ring::init(b.0.as_mut_ptr(), 64, 16) };
        assert!(r.solo_claim(std::process::id()));
        r.raise_solo_busy_for_test();
        let t = Instant::now();
        revoke(&r);
        assert!(t.elapsed() >= REVOKE_PATIENCE && t.elapsed() < REVOKE_PATIENCE * 20);
        assert_eq!(r.solo_mode(), SOLO_SHARED);
        drop(b);
    }

    /// End to end: a connected sender's first SEND takes its target's receive queue's mode;
    /// moving the target to ERROR revokes it and flushes exactly the requests the sender did
    /// not take.
    #[test]
    fn a_connected_sender_takes_the_mode_and_the_flush_ends_it() {
        require_membarrier();
        let ctx = unit_context("solo-e2e");
        let pd = ctx.alloc_pd().unwrap();
        let (mut scq, mut rcq) = (ctx.create_cq(64).unwrap(), ctx.create_cq(64).unwrap());
        let attr = |cq| QpInitAttr {
            send_cq: cq,
            recv_cq: cq,
            srq: None,
            cap: QpCaps { max_send_wr: 16, max_recv_wr: 16, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 0 },
            qp_type: QpType::Rc,
            sq_sig_all: false,
        };
        let mut qa = pd.create_qp(&attr(&scq)).unwrap();
        let mut qb = pd.create_qp(&attr(&rcq)).unwrap();
        let (na, nb) = (qa.qp_num(), qb.qp_num());
        crate::shm::unit_connect(&mut qa, nb, AccessFlags::empty());
        crate::shm::unit_connect(&mut qb, na, AccessFlags::empty());
        let region = ctx.alloc_region(4096).unwrap();
        let mr = pd.reg_mr(&region, 0, 4096, AccessFlags::LOCAL_WRITE).unwrap();
        for i in 0..4u64 {
            let sge = [Sge::new(mr.addr() + 1024 + 64 * i, 64, mr.lkey())];
            qb.post_recv(&RecvChain::one(i, &sge)).unwrap();
        }
        assert_eq!(qb.rq_solo_mode(), Some(SOLO_FREE));
        let mut wc = [WorkCompletion::default(); 8];
        for i in 0..2u64 {
            let sge = [Sge::new(mr.addr(), 8, mr.lkey())];
            qa.post_send(&SendChain::one(SendWr::send(i).signaled(), &sge)).unwrap();
        }
        // Both delivered (with every SEND queued, `DATAPLANE_SHM_MSGQ=all`, the receiver's
        // poll delivers them), then both senders' completions.
        let (mut got, mut sent) = (Vec::new(), 0);
        let end = Instant::now() + Duration::from_secs(10);
        while (got.len() < 2 || sent < 2) && Instant::now() < end {
            let n = rcq.poll(&mut wc).unwrap();
            got.extend(wc[..n].iter().map(|w| (w.wr_id, w.status)));
            let n = <Shm as Provider>::Cq::poll(&mut scq, &mut wc).unwrap();
            assert!(wc[..n].iter().all(|w| w.status == WcStatus::Success));
            sent += n;
        }
        assert_eq!((got.len(), sent), (2, 2), "both SENDs completed on both sides");
        // The sender-side path takes the mode; queued SENDs are taken by the drainer (CAS).
        let queued = crate::shm::drain::mode() == crate::shm::drain::Mode::All;
        let want = if enabled() && !queued { SOLO_HELD } else { SOLO_FREE };
        assert_eq!(qb.rq_solo_mode(), Some(want), "the connected sender took the mode");
        qb.modify(&QpAttr { state: QpState::Error, ..Default::default() }).unwrap();
        assert_eq!(qb.rq_solo_mode(), Some(SOLO_SHARED), "the flush revoked it");
        let n = rcq.poll(&mut wc).unwrap();
        got.extend(wc[..n].iter().map(|w| (w.wr_id, w.status)));
        assert_eq!(
            got,
            [(0, WcStatus::Success), (1, WcStatus::Success), (2, WcStatus::WrFlushErr), (3, WcStatus::WrFlushErr)]
        );
        drop((qa, qb, mr, region));
    }
}

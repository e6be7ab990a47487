//! Receive requests: validation at post time, and their encoding in RQ/SRQ ring cells.

use super::fabric::Fabric;
use super::mr::{mr_lookup, MrCache, MrView};
use super::wire::RecvRing;
use crate::verbs::{AccessFlags, Errno, PostError, RecvChain, Sge};
use std::cell::Cell;

pub(crate) use super::wire::{RecvEntry, MAX_SGE};

/// Receive SGE length 0 means 2^31 bytes (ibv_post_srq_recv notes).
#[inline]
pub(crate) fn recv_sge_len(sge: &Sge) -> u64 {
    if sge.length == 0 {
        1 << 31
    } else {
        sge.length as u64
    }
}

/// Checks one receive request: SGE count, and each SGE's lkey, PD, LOCAL_WRITE right and
/// bounds.
pub(crate) fn validate(f: &Fabric, pd: u32, max_sge: u32, sges: &[Sge], i: usize) -> Result<(), PostError> {
    validate_with(f, pd, max_sge, sges, i, &mut None)
}

/// [`validate`], reusing the MR of the last lkey that passed the key, PD and LOCAL_WRITE
/// checks in the same post call (`last`): a chain's SGEs usually share one MR, and the
/// lookup is most of the cost. Only the per-SGE bounds check runs again. This changes no
/// outcome: a post call is not atomic against a concurrent deregistration anyway (it is as if
/// the deregistration came after the call), and the sender re-checks every receive SGE
/// against the MR table before placing a byte.
#[inline]
fn validate_with(
    f: &Fabric,
    pd: u32,
    max_sge: u32,
    sges: &[Sge],
    i: usize,
    last: &mut Option<(u32, MrView)>,
) -> Result<(), PostError> {
    if sges.len() > max_sge as usize {
        return Err(PostError::new(Errno::EINVAL, i, "more SGEs than the queue's max_sge"));
    }
    for s in sges {
        validate_sge(f, pd, s, i, last)?;
    }
    Ok(())
}

/// The per-SGE part of [`validate_with`].
#[inline(always)]
fn validate_sge(f: &Fabric, pd: u32, s: &Sge, i: usize, last: &mut Option<(u32, MrView)>) -> Result<(), PostError> {
    let mr = match *last {
        Some((key, mr)) if key == s.lkey => mr,
        _ => {
            let Some(mr) = mr_lookup(f, s.lkey).filter(|m| !m.window) else {
                return Err(PostError::new(Errno::EINVAL, i, "unknown lkey"));
            };
            if mr.pd != pd {
                return Err(PostError::new(Errno::EINVAL, i, "lkey belongs to another protection domain"));
            }
            if !mr.access.contains(AccessFlags::LOCAL_WRITE) {
                return Err(PostError::new(Errno::EINVAL, i, "receive buffer MR lacks LOCAL_WRITE"));
            }
            *last = Some((s.lkey, mr));
            mr
        }
    };
    if mr.translate(f, s.addr, recv_sge_len(s)).is_none() {
        // Length 0 is the special 2^31; say so, since a caller who meant "no bytes" would
        // otherwise look for a wrong address.
        let why = if s.length == 0 {
            "SGE outside its memory region (its length 0 was read as 2^31 bytes, as verbs define it for receives)"
        } else {
            "SGE outside its memory region"
        };
        return Err(PostError::new(Errno::EINVAL, i, why));
    }
    Ok(())
}

/// [`validate_sge`] of a lone request's SGE, with its MR view kept across posts in `lkeys`
/// (`MrCache`, session 55): while the receiver posts from one MR, the key, PD, window and
/// LOCAL_WRITE checks are one epoch load; the bounds are checked per SGE. Anything the
/// cache does not vouch for goes through `validate_sge`, which also words the error.
#[inline(always)]
fn validate_kept(f: &Fabric, pd: u32, s: &Sge, lkeys: &mut MrCache) -> Result<(), PostError> {
    let ok = |m: &MrView| !m.window && m.pd == pd && m.access.contains(AccessFlags::LOCAL_WRITE);
    match lkeys.get(f, s.lkey, ok) {
        Some(mr) if mr.translate(f, s.addr, recv_sge_len(s)).is_some() => Ok(()),
        _ => validate_refused(f, pd, s),
    }
}

/// [`validate_kept`]'s refusal: the full checks, out of line, for the error they report.
#[cold]
#[inline(never)]
fn validate_refused(f: &Fabric, pd: u32, s: &Sge) -> Result<(), PostError> {
    validate_sge(f, pd, s, 0, &mut None)
}

/// How many requests a receive ring may hold, from its producer's side: SRQ rings are twice
/// their `max_wr` and count unclaimed requests against it ([`Ring::push_single_bounded`]);
/// a QP's own receive queue is bounded by its cells alone. With the producer's MR view
/// (`lkeys`), all the producer keeps between posts.
pub(crate) struct RecvBound {
    /// Requests queued and not yet claimed that make the queue full (`u64::MAX`: only the
    /// cells bound it).
    pub(crate) limit: u64,
    /// The producer's cached copy of the ring's `head`.
    pub(crate) head_seen: u64,
    /// The last lkey a lone request passed the checks with (an MR of the queue's PD with
    /// LOCAL_WRITE, not a window), kept across posts ([`validate_kept`]).
    pub(crate) lkeys: MrCache,
}

impl RecvBound {
    /// No bound beyond the ring's cells (a QP's receive queue: one sender consumes it at a
    /// time, so its cells free in order).
    pub(crate) fn cells() -> RecvBound {
        RecvBound { limit: u64::MAX, head_seen: 0, lkeys: MrCache::default() }
    }

    /// At most `max_wr` requests not yet claimed (a ring of twice `max_wr` cells: SRQs, UD
    /// and RAW_PACKET RQs).
    pub(crate) fn unclaimed(max_wr: u32) -> RecvBound {
        RecvBound { limit: u64::from(max_wr), head_seen: 0, lkeys: MrCache::default() }
    }
}

/// Validates and pushes every request of `chain`; stops at the first failure. The caller is
/// the ring's only producer (the owning QP's or SRQ's `post_recv`, which takes `&mut self`).
///
/// Requests of one SGE (nearly all) take a straight-line version of the same checks and a
/// push that writes one SGE without the loops.
#[inline(always)]
pub(crate) fn post(
    f: &Fabric,
    ring: &RecvRing,
    bound: &mut RecvBound,
    pd: u32,
    max_sge: u32,
    chain: &RecvChain,
) -> Result<(), PostError> {
    // One request of one SGE (a receiver reposting what it just consumed): checked and
    // pushed without the loop, 217 -> 196 instructions per `post_recv` (callgrind). A full
    // ring goes on to the loop, which checks it again and waits for a held cell or reports
    // ENOMEM. The loop is out of line and this part inlined into `post_recv`: a lone post's
    // frame no longer saves registers for the loop (batch 1: 1,077 -> 1,050 instructions
    // per message, session 54; with `post` itself left out of line, an out-of-line loop had
    // cost +4).
    if let ([wr], 1..) = (chain.wrs(), max_sge) {
        if let [s] = chain.sges_of(wr) {
            validate_kept(f, pd, s, &mut bound.lkeys)?;
            if push_one(ring, bound, wr.wr_id, s) {
                return Ok(());
            }
        }
    }
    post_list(f, ring, bound, pd, max_sge, chain)
}

/// [`post`] of anything but one request of one SGE that fits: each request checked and
/// pushed in turn.
#[inline(never)]
fn post_list(
    f: &Fabric,
    ring: &RecvRing,
    bound: &mut RecvBound,
    pd: u32,
    max_sge: u32,
    chain: &RecvChain,
) -> Result<(), PostError> {
    let mut last = None;
    let wrs = chain.wrs();
    let mut i = 0;
    while let Some(wr) = wrs.get(i) {
        let sges = chain.sges_of(wr);
        let pushed = if let ([s], 1..) = (sges, max_sge) {
            validate_sge(f, pd, s, i, &mut last)?;
            // The requests after it that `validate_sge` would pass with the same MR go with
            // it in one ring call: one SGE of the same lkey and length, checked as it is
            // pushed with two compares against the MR's range for that length
            // (`MrView::addr_range` is exactly what `translate` accepts for one length), the
            // ring's bound read once (`push_requests`).
            if let Some((lo, hi)) = last.as_ref().and_then(|(_, mr)| run_range(f, chain, i, s, mr)) {
                let rest = &wrs[i..];
                let n = ring.push_requests(bound.limit, &mut bound.head_seen, rest.len(), |k| {
                    match chain.sges_of(&rest[k]) {
                        [t] if k == 0 || (t.lkey == s.lkey && t.length == s.length && (lo..=hi).contains(&t.addr)) => {
                            Some((rest[k].wr_id, *t))
                        }
                        _ => None,
                    }
                });
                // None pushed: the queue is full, or its next cell is still held; the
                // one-at-a-time push below waits for a held cell or reports ENOMEM.
                if n > 0 {
                    i += n;
                    continue;
                }
            }
            push_one(ring, bound, wr.wr_id, s)
        } else {
            validate_with(f, pd, max_sge, sges, i, &mut last)?;
            push(ring, bound, wr.wr_id, sges)
        };
        if !pushed && !retry_held(ring, bound, |b| push(ring, b, wr.wr_id, sges)) {
            return Err(PostError::new(Errno::ENOMEM, i, "receive queue full"));
        }
        i += 1;
    }
    Ok(())
}

/// The addresses MR `mr` accepts for SGEs of `s`'s length (`MrView::addr_range`), when
/// request `i + 1` of `chain` has one SGE of `s`'s lkey and length (a run of one MR may
/// follow request `i`, whose SGE `s` passed `validate_sge` with `mr`); `None` otherwise,
/// without computing the range.
#[inline(always)]
fn run_range(f: &Fabric, chain: &RecvChain, i: usize, s: &Sge, mr: &MrView) -> Option<(u64, u64)> {
    let next = chain.wrs().get(i + 1)?;
    if !matches!(chain.sges_of(next), [t] if t.lkey == s.lkey && t.length == s.length) {
        return None;
    }
    mr.addr_range(f, recv_sge_len(s))
}

/// A refused push: pushes again if the refusal was a cell a consumer claimed and had not freed
/// yet, once it is freed ([`super::ring::Ring::wait_held_cell`]).
#[cold]
#[inline(never)]
fn retry_held(ring: &RecvRing, bound: &mut RecvBound, push: impl FnOnce(&mut RecvBound) -> bool) -> bool {
    ring.wait_held_cell(bound.limit, &mut bound.head_seen) && push(bound)
}

/// [`post`] of one single-SGE request per address (`len` bytes of MR `lkey`, the address as
/// `wr_id`), without a chain: the same checks in the same order, so the same errors and
/// `bad_wr` (the MR's key, PD and LOCAL_WRITE are looked up once, as `post` does for a chain
/// whose SGEs share an lkey; the bounds are checked per address).
#[allow(clippy::too_many_arguments)]
pub(crate) fn post_buffers(
    f: &Fabric,
    ring: &RecvRing,
    bound: &mut RecvBound,
    pd: u32,
    max_sge: u32,
    addrs: &[u64],
    len: u32,
    lkey: u32,
) -> Result<(), PostError> {
    if max_sge == 0 && !addrs.is_empty() {
        return Err(PostError::new(Errno::EINVAL, 0, "more SGEs than the queue's max_sge"));
    }
    match post_buffers_from(f, ring, bound, pd, addrs, len, lkey) {
        Err(e) if e.errno == Errno::ENOMEM => {
            let mut e = e;
            // As in `post`: a cell a consumer still holds; once it is freed, the rest.
            while ring.wait_held_cell(bound.limit, &mut bound.head_seen) {
                match post_buffers_from(f, ring, bound, pd, &addrs[e.bad_wr..], len, lkey) {
                    Err(mut again) => {
                        again.bad_wr += e.bad_wr;
                        if again.errno != Errno::ENOMEM {
                            return Err(again);
                        }
                        e = again;
                    }
                    Ok(()) => return Ok(()),
                }
            }
            Err(e)
        }
        r => r,
    }
}

/// The body of [`post_buffers`] (`bad_wr` is the index in `addrs`): the first address is
/// checked as `post` checks an SGE (lkey, PD, LOCAL_WRITE, bounds: its error, if any, is
/// `post`'s); the MR's range of valid addresses for `len` bytes then checks the others with
/// two compares each, and the run of valid ones is pushed in one ring call. The outcome is
/// `post`'s: the requests before the first failure are posted, in order, and `bad_wr` is
/// that failure's index (EINVAL for an address outside the MR, ENOMEM for a full queue,
/// whichever comes first).
#[inline]
fn post_buffers_from(
    f: &Fabric,
    ring: &RecvRing,
    bound: &mut RecvBound,
    pd: u32,
    addrs: &[u64],
    len: u32,
    lkey: u32,
) -> Result<(), PostError> {
    let Some(&first) = addrs.first() else { return Ok(()) };
    let mut last = None;
    validate_sge(f, pd, &Sge::new(first, len, lkey), 0, &mut last)?;
    // `first` passed, so its MR is in `last` and the range is not empty (were it either,
    // every address would go the per-SGE way below).
    let cap = recv_sge_len(&Sge::new(first, len, lkey));
    let (lo, hi) = last.and_then(|(_, mr)| mr.addr_range(f, cap)).unwrap_or((1, 0));
    let in_range = |a: u64| (lo..=hi).contains(&a);
    // Each address checked as it is pushed (`Ring::push_run_while`); the push stops at the
    // first the range refuses, or when the queue is full.
    let valid = ring.push_buffers(bound.limit, &mut bound.head_seen, addrs, len, lkey, in_range);
    if addrs.get(valid).is_some_and(|&a| in_range(a)) {
        return Err(PostError::new(Errno::ENOMEM, valid, "receive queue full"));
    }
    // From the first address the range refused on, one at a time as `post` does: the same
    // check gives `post`'s error (and were the range ever narrower than `translate`, the
    // outcome would still be `post`'s).
    for (i, &addr) in addrs.iter().enumerate().skip(valid) {
        let s = Sge::new(addr, len, lkey);
        validate_sge(f, pd, &s, i, &mut last)?;
        if !push_one(ring, bound, addr, &s) {
            return Err(PostError::new(Errno::ENOMEM, i, "receive queue full"));
        }
    }
    Ok(())
}

/// [`push`] for a request of one SGE.
#[inline(always)]
fn push_one(ring: &RecvRing, bound: &mut RecvBound, wr_id: u64, s: &Sge) -> bool {
    ring.push_one(bound.limit, &mut bound.head_seen, wr_id, s)
}

/// Pushes one request (already validated). False if the ring is full.
///
/// An RQ or SRQ ring has exactly one producer: the process-local handle that owns it, whose
/// `post_recv` takes `&mut self`. Senders, flushes and drains in any process only consume.
/// So the push claims its position with a plain store (`Ring::push_single`), not a CAS.
#[inline]
pub(crate) fn push(ring: &RecvRing, bound: &mut RecvBound, wr_id: u64, sges: &[Sge]) -> bool {
    ring.push(bound.limit, &mut bound.head_seen, wr_id, sges)
}

/// Takes the oldest request. The SGE count read from shared memory is clamped to what the
/// cell can hold, so a corrupt cell cannot make us read past it. A stalled ring
/// ([`Pop::Stalled`](super::ring::Pop::Stalled), corrupt) reads as empty here; a sender tells the two apart on its cold
/// path (`Ring::stalled`). The cell stays held until `Ring::release` (`Ring::pop_held`).
#[inline]
pub(crate) fn pop_held(ring: &RecvRing, out: &mut RecvEntry) -> Option<u64> {
    prefetch_next(ring, ring.pop_held(out).ok())
}

/// After a pop that took a request: the next one is usually posted already, so fetch its
/// line now, off the next message's critical path.
#[inline(always)]
fn prefetch_next<T>(ring: &RecvRing, got: Option<T>) -> Option<T> {
    if got.is_some() {
        ring.prefetch(0);
    }
    got
}

/// The connected sender's state of a receive queue's single-consumer mode (`shm::solo`),
/// cached in its view of the target (`DestView::solo`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub(crate) enum Solo {
    /// Not tried yet: the next pop tries to take the mode.
    #[default]
    Untried,
    /// Ours: pops are plain stores until a revocation.
    Held,
    /// Taken by another consumer, revoked, or off in this process: pops are CAS.
    Shared,
}

/// [`pop_held`] for a connected QP's sender: with the queue's single-consumer mode (`solo`,
/// which the first call tries to take) a plain store to `head` instead of a CAS.
///
/// Only the held mode's pop and the shared mode's CAS are inline: the first call's claim
/// and a revocation seen are out of line ([`pop_held_solo_cold`]), so the post's fast path
/// (into which this inlines) carries no more than the check of `solo`.
#[inline(always)]
pub(crate) fn pop_held_solo(ring: &RecvRing, solo: &Cell<Solo>, out: &mut RecvEntry) -> Option<u64> {
    match solo.get() {
        Solo::Held => match ring.pop_solo(out) {
            Some(got) => prefetch_next(ring, got.ok()),
            None => pop_held_solo_cold(ring, solo, out),
        },
        Solo::Shared => pop_held(ring, out),
        Solo::Untried => pop_held_solo_cold(ring, solo, out),
    }
}

/// [`pop_held_solo`]'s rare cases: the first pop of a connection, which tries to take the
/// mode, and the first after a revocation, which pops with CAS from then on.
#[cold]
#[inline(never)]
fn pop_held_solo_cold(ring: &RecvRing, solo: &Cell<Solo>, out: &mut RecvEntry) -> Option<u64> {
    let held = solo.get() == Solo::Untried && super::solo::enabled() && ring.solo_claim(std::process::id());
    solo.set(if held { Solo::Held } else { Solo::Shared });
    if held {
        if let Some(got) = ring.pop_solo(out) {
            return prefetch_next(ring, got.ok());
        }
        solo.set(Solo::Shared);
    }
    pop_held(ring, out)
}

/// [`pop_held`] of a run of up to `max` requests, claimed with one CAS
/// ([`super::ring::Ring::pop_run`]): the first is read into `out`; returns its position and
/// the run's length. The caller reads the others (`RecvRing::read_held`) and releases each.
#[inline]
pub(crate) fn pop_run(ring: &RecvRing, max: u64, out: &mut RecvEntry) -> Option<(u64, u64)> {
    // The request after the run.
    prefetch_next(ring, ring.pop_run(max, out).ok())
}

/// [`pop_held`] and the cell's release at once.
#[inline]
pub(crate) fn pop(ring: &RecvRing, out: &mut RecvEntry) -> bool {
    match pop_held(ring, out) {
        Some(pos) => {
            ring.release(pos);
            true
        }
        None => false,
    }
}

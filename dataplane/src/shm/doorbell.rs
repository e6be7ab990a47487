//! The doorbell: the top of the send path. `post_send` validates each WR (errors that "can be
//! detected immediately" return `bad_wr` with nothing changed) and runs it at once through
//! the stages below (`exec` -> `dest` -> `place` -> `cq`). A one-SGE RC/UC/XRC SEND or WRITE
//! takes `post_fast`, everything else `post_many`. A WQE that cannot run yet (RC: no receive
//! posted, or the target not ready) waits in the QP's pending queue with everything behind
//! it, and is retried after the RNR timer or ACK timeout (`run_pending`, from the send CQ's
//! `poll`, a channel wait, or the next `post_send`), until its retry count runs out.

use super::complete::after_push;
use super::dest::*;
use super::drain::{self, F_IMM, F_REF, F_SIGNALED, F_SOLICITED, META_WORDS, MQ_PAYLOAD_MAX, MQ_REF_MAX};
use super::exec::*;
use super::fabric::{pid_alive, pid_alive_recently, Fabric};
use super::layout::*;
use super::msgq::{MsgQueue, PAYLOAD_WORDS};
use super::place::*;
use super::recvq::{self, RecvEntry, MAX_SGE};
use super::sq::{BlockKind, Blocked, HeldDest, HeldRecv, HeldSend, MqSend, SqState, SrqRun, MAX_HELD};
use super::srq::SrqView;
use super::wire::RecvRing;
use super::wire::INLINE_CQE_MAX;
use crate::net::frame::FrameKey;
use crate::net::tso::TsoPlan;
use crate::verbs::*;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Checks one send WR at post time and resolves its local memory into `segs` (room for
/// `max(1, sges.len())`). Returns the number of segments and the total length.
#[inline(always)]
pub(crate) fn prepare(
    f: &Fabric,
    st: &SqState,
    wr: &SendWr,
    sges: &[Sge],
    inline: Option<&[u8]>,
    i: usize,
    segs: &mut [Seg],
) -> std::result::Result<(usize, u64, bool), PostError> {
    let op = wr.opcode;
    if !op.allowed_on(st.qp_type) {
        return Err(PostError::new(Errno::EINVAL, i, "opcode not allowed on this QP type (ibv_post_send(3) table)"));
    }
    if wr.flags.contains(SendFlags::IP_CSUM) && st.qp_type != QpType::RawPacket {
        return Err(PostError::new(Errno::EINVAL, i, "IBV_SEND_IP_CSUM is offloaded on RAW_PACKET QPs only"));
    }
    let is_inline = wr.flags.contains(SendFlags::INLINE) || inline.is_some();
    // ibv_post_send(3): INLINE is "Valid only for Send and RDMA Write". Refused rather than
    // ignored: for RDMA READ and atomics the local buffer is a destination, and with
    // `push_inline` it would be the chain's own immutable bytes (conformance case
    // inline_only_for_send_and_write).
    if is_inline && !op.inline_allowed() {
        return Err(PostError::new(Errno::EINVAL, i, "IBV_SEND_INLINE is valid only for Send and RDMA Write"));
    }
    let (n, total) = if let Some(bytes) = inline {
        segs[0] = Seg { ptr: bytes.as_ptr() as *mut u8, len: bytes.len() };
        (1, bytes.len() as u64)
    } else {
        if sges.len() > st.max_sge as usize {
            return Err(PostError::new(Errno::EINVAL, i, "more SGEs than the QP's max_send_sge"));
        }
        if is_inline {
            // The L_Key is not checked; the bytes must still be memory this process can read
            // safely: the fabric.
            let mut total = 0u64;
            for (k, s) in sges.iter().enumerate() {
                let Some(off) = f.offset_of(s.addr, s.length as u64) else {
                    return Err(PostError::new(Errno::EINVAL, i, "inline SGE outside the fabric's memory"));
                };
                segs[k] =
                    Seg { ptr: f.ptr(off, s.length as u64).unwrap_or(std::ptr::null_mut()), len: s.length as usize };
                total += s.length as u64;
            }
            (sges.len(), total)
        } else {
            let need_write = matches!(op, WrOpcode::RdmaRead | WrOpcode::AtomicCmpAndSwp | WrOpcode::AtomicFetchAndAdd);
            resolve_local(f, st.pd, sges, need_write, segs).map_err(|r| PostError::new(Errno::EINVAL, i, r))?
        }
    };
    if is_inline && total > st.max_inline as u64 {
        return Err(PostError::new(Errno::EINVAL, i, "inline data longer than the QP's max_inline_data"));
    }
    match op {
        WrOpcode::AtomicCmpAndSwp | WrOpcode::AtomicFetchAndAdd if total != 8 => {
            return Err(PostError::new(Errno::EINVAL, i, "atomic operations need an 8-byte local buffer"));
        }
        _ => {}
    }
    if st.qp_type == QpType::Ud {
        if wr.ud.ah.0 & AH_VALID == 0 {
            return Err(PostError::new(Errno::EINVAL, i, "UD send without a valid address handle"));
        }
        if total > SHM_MTU as u64 {
            return Err(PostError::new(Errno::EINVAL, i, "UD message larger than the path MTU (4096)"));
        }
    } else if st.qp_type == QpType::RawPacket && op != WrOpcode::Tso {
        // (A TSO payload is not a frame: `post_tso` bounds it.)
        if total < 14 {
            return Err(PostError::new(Errno::EINVAL, i, "a RAW_PACKET send must hold an Ethernet header (14 bytes)"));
        }
        if total > RAW_MAX_FRAME as u64 {
            return Err(PostError::new(
                Errno::EINVAL,
                i,
                "frame larger than the port MTU (4096) + 18 bytes of headers",
            ));
        }
    } else if total > 1 << 31 {
        return Err(PostError::new(Errno::EINVAL, i, "message larger than max_msg_sz (2^31)"));
    }
    Ok((n, total, is_inline))
}

/// `ibv_post_send` on the shm provider. See the module docs.
#[inline]
pub(crate) fn post_send(f: &Fabric, st: &mut SqState, chain: &SendChain) -> std::result::Result<(), PostError> {
    if st.mq_auto {
        // Streaming: nothing arrived on our receive CQ since our previous post (one load of
        // a counter its poller keeps; `drain::Mode::Auto`).
        let polled = st.recv_cq.polled.load(Ordering::Relaxed);
        st.mq_stream = polled == st.recv_polled_seen;
        st.recv_polled_seen = polled;
    }
    // A lone SEND that will be queued (`post_fast`'s condition) runs in a function of its own,
    // before anything else here: what the post list's loop keeps across its WRs is then not
    // spilled for it (every store a lone queued post makes is time, session 26). It checks
    // the state itself, and does nothing when it returns false.
    if let [wr] = chain.wrs() {
        if (st.mq.last != 0 || st.mq_every || st.mq_stream) && post_lone(f, st, wr, chain) {
            return Ok(());
        }
    }
    if chain.wrs().len() == 1 {
        post_list::<false>(f, st, chain)
    } else {
        post_list::<true>(f, st, chain)
    }
}

/// [`post_send`] of anything but a lone queued SEND: the checks of the queue's state, then
/// each WR of the chain through the fast path or the general one. Out of line, so that a
/// lone queued SEND's caller saves no registers for it.
///
/// `RUNS`: whether the chain may have several SENDs to an SRQ, which then claim their
/// requests together (`srq_take`). A chain of one WR runs a copy without that code: a
/// ping-pong's post read 2-3% slower in `dp-perf send_lat` with it (bench-ab, session 41),
/// for a few instructions and the layout.
#[inline(never)]
fn post_list<const RUNS: bool>(f: &Fabric, st: &mut SqState, chain: &SendChain) -> std::result::Result<(), PostError> {
    let mut state = st.state();
    if !state.accepts_post_send() {
        return Err(PostError::new(
            Errno::EINVAL,
            0,
            "QP is not ready to send (post_send needs RTS, SQD, SQE or ERROR)",
        ));
    }
    if !st.pending.is_empty() && !st.dry {
        // A peer may have moved this QP to ERROR (its message failed in our receive queue)
        // while WQEs wait: flush those before anything posted now, as poll's progress() does,
        // so completions stay in posting order (case flush_after_peer_error_keeps_order).
        progress(st);
        state = st.state();
        if state == QpState::Error {
            st.flush_pending();
        }
    }
    let mut retired = st.slot().sq_retired.load(Ordering::Acquire);
    let last = chain.wrs().len().saturating_sub(1);
    let mut seen = ListSeen::default();
    for (i, wr) in chain.wrs().iter().enumerate() {
        let sges = chain.sges_of(wr);
        let inline = chain.inline_of(wr);
        if let ([sge], None) = (sges, inline) {
            // Hold a SEND's receiver-side stores while more WRs follow (`HeldRecv`), and the
            // last one's when others are held (`post_fast`); a post of one WR gains nothing
            // from it. The SENDs after it that certainly take an SRQ request (`sends_ahead`)
            // may have theirs claimed with its own (`srq_take`).
            let ahead = |max| if RUNS { sends_ahead(chain, i + 1, max) } else { 0 };
            // (A post of one WR has nothing to remember: a fresh `ListSeen` is folded away.)
            let seen = if RUNS { &mut seen } else { &mut ListSeen::default() };
            if post_fast::<false>(f, st, wr, sge, &mut state, &mut retired, last - i, !RUNS, seen, ahead) {
                continue;
            }
        }
        if !RUNS && st.dry {
            // (`warm_send`, a post of one WR: the general path is not run dry.)
            return Ok(());
        }
        // The general path may change what `seen` vouches for (a failed delivery moves the
        // target to ERROR, an RNR retry re-resolves it): the next fast WR checks it all again.
        seen = ListSeen::default();
        // Everything below completes in posting order after the held SENDs, and after the
        // queued ones (whose unused claims must be written for the drainer to reach them).
        settle::<RUNS>(f, st);
        // Most WRs have one SGE (or inline bytes, one segment): their segments fit an array
        // of one, which costs nothing to initialise, unlike room for MAX_SGE. TSO goes out of
        // line with the multi-SGE WRs (kept out of this loop: its call here made LLVM stop
        // inlining the fast path's lookups, +118 instructions per message in chains).
        if sges.len() <= 1 && wr.opcode != WrOpcode::Tso && st.qp_type != QpType::XrcSend {
            post_one::<1>(f, st, wr, sges, inline, i, &mut state, &mut retired)?;
        } else {
            post_many(f, st, wr, sges, inline, chain, i, &mut state, &mut retired)?;
        }
    }
    settle::<RUNS>(f, st);
    Ok(())
}

/// Ends what the fast path left open: the held SENDs' stores published, the queued ones'
/// unused claims written (`mq_close`), and (`RUNS`) the SRQ requests a run claimed for WRs
/// that did not take them handed back (`return_run`), with the run's scan forgotten.
#[inline(always)]
fn settle<const RUNS: bool>(f: &Fabric, st: &mut SqState) {
    publish_held(f, &mut st.held);
    mq_close(f, st);
    if RUNS {
        st.run.shaped = 0;
        if st.run.left > 0 {
            return_run(f, &mut st.run, &mut st.rx);
        }
    }
}

/// Most SRQ requests one CAS claims for a post list's SENDs (`srq_take`): as many as one
/// post holds (`MAX_HELD`).
const MAX_RUN: usize = MAX_HELD;

/// The longest run of at most `max` WRs of `chain` from WR `from` on that reach the fast
/// path's take of a receive request whenever the WR before them did, unless something
/// fails (`srq_take`): SENDs or SEND_WITH_IMMs of one SGE (INLINE or not), without
/// IP_CSUM.
/// (The QP's state, the target and the send queue's room are the same for all of them; the
/// caller bounds `max` by that room.) Only the WRs' shape is checked, a few instructions
/// each: an SGE that fails its MR checks ends the run in `post_fast`, and the requests
/// claimed for the WRs after it go back (`return_run`).
#[inline(always)]
fn sends_ahead(chain: &SendChain, from: usize, max: usize) -> usize {
    chain
        .wrs()
        .iter()
        .skip(from)
        .take(max)
        .take_while(|wr| {
            matches!(wr.opcode, WrOpcode::Send | WrOpcode::SendWithImm)
                && wr.is_one_sge()
                && !wr.flags.contains(SendFlags::IP_CSUM)
        })
        .count()
}

/// The request a SEND to `srq` takes when it has none of a run yet, out of line (inlined
/// into the fast path, a take made the RQ case ~17 instructions dearer per message): when up
/// to `max_ahead` SENDs follow in the post list (as many as `ahead` says reach their take:
/// `sends_ahead`), a run of requests for it and them, claimed with one CAS
/// (`SrqView::take_run_held`), whose rest `run` keeps for them; else one request
/// (`SrqView::take_held`). A locked instruction per message, which also waits for the
/// previous message's stores to drain, became one per run. Returns the request's position
/// (read into `rx`), or `None` if the SRQ has none.
///
/// No run is claimed for a target with a message queue: the later SENDs could go through it
/// instead. A run left over from another SRQ (the target changed during the post) is handed
/// back first. Requests left over when a SEND of the run does not reach its take (a WR
/// that fails its checks, a target that left RTR/RTS during the post, a failed delivery
/// that put the QP in ERROR) are handed back at the end of the post (`return_run`).
#[inline(never)]
fn srq_take(
    f: &Fabric,
    srq: &SrqView,
    d: &DestView,
    run: &mut SrqRun,
    rx: &mut RecvEntry,
    max_ahead: usize,
    ahead: impl FnOnce(usize) -> usize,
) -> Option<u64> {
    if run.left > 0 {
        return_run(f, run, rx);
    }
    let max = max_ahead.min(MAX_RUN - 1);
    let ahead = match run.shaped {
        _ if max == 0 || d.mq.is_some() => 0,
        0 | 1 => ahead(max),
        known => (known as usize - 1).min(max),
    };
    if ahead == 0 {
        // (`take_held`: the single claim, without the run's loop.)
        run.shaped = 0;
        return srq.take_held(f, rx);
    }
    let (pos, k) = srq.take_run_held(f, 1 + ahead as u64, rx)?;
    // What the scan found beyond this claim, for the next SEND's (WRs `k..=ahead` from here).
    run.shaped = (ahead as u64 + 1 - k) as u32;
    if k > 1 {
        if !run.dest.as_ref().is_some_and(|r| r.qpn == d.qpn && run.srqn == srq.srqn) {
            run.dest = Some(d.clone());
        }
        run.srqn = srq.srqn;
        run.next = pos.wrapping_add(1);
        run.left = (k - 1) as u32;
    }
    Some(pos)
}

/// Hands back the requests of `run` no SEND used (see [`srq_take`]), at the end of the post
/// or before a WR goes the general way: `Ring::unclaim` puts them back at the head of the
/// SRQ, as if never claimed; if another consumer claimed after them meanwhile, they are
/// completed on the target's CQ with IBV_WC_WR_FLUSH_ERR, as a NIC completes the requests
/// it fetched for a QP that went to ERROR, rather than lost. Only after a failure or a
/// concurrent change mid-post. (The SRQ's limit event, checked at the claim, may have fired
/// for requests that went back: an event a little early, never a missed one.)
#[cold]
#[inline(never)]
fn return_run(f: &Fabric, run: &mut SrqRun, rx: &mut RecvEntry) {
    let left = std::mem::take(&mut run.left);
    let Some(d) = &run.dest else { return };
    let Some(srq) = &d.srq else { return };
    if srq.ring.unclaim(run.next, run.next.wrapping_add(u64::from(left))) {
        return;
    }
    for k in 0..u64::from(left) {
        let pos = run.next.wrapping_add(k);
        srq.ring.read_held(pos, rx);
        srq.ring.release(pos);
        let wc = WorkCompletion {
            wr_id: rx.wr_id,
            status: WcStatus::WrFlushErr,
            opcode: WcOpcode::Recv,
            qp_num: d.qpn,
            ..Default::default()
        };
        push_recv_wc(f, d, &wc, false);
    }
}

/// What [`post_fast`] checked for the earlier WRs of one post list, and does not read again
/// while the list's WRs keep taking the fast path (`post_list` forgets it when one does not).
///
/// A post list is one doorbell: a NIC reads its WQEs as one burst and resolves the
/// connection once. The target's liveness, state and connection (shared lines the peer
/// writes) are read for the first WR; a change made by another thread during the post lands
/// as if just after it, as it could have per WR. An lkey is checked for the first WR that
/// names it (`SqState::lkeys`, which keeps it across posts too; deregistering an MR that a
/// post in flight uses is the caller's error, as on a NIC); each WR's bytes are still
/// checked against it (`MrView::translate`).
#[derive(Default)]
pub(crate) struct ListSeen {
    /// `dest` found the cached target alive, and the target receives, is connected to this QP
    /// and is of its type.
    dest_ok: bool,
    /// `SqState::lkeys` vouched for its key during this list (`MrCache::again`).
    mr_ok: bool,
}

/// A post of one WR with one SGE (not inline) through [`post_fast`], in a function of its
/// own; false, with nothing done, when the fast path does not take it.
#[inline(never)]
fn post_lone(f: &Fabric, st: &mut SqState, wr: &SendWr, chain: &SendChain) -> bool {
    let ([sge], None) = (chain.sges_of(wr), chain.inline_of(wr)) else { return false };
    // `post_fast` takes only an RTS queue with nothing pending; anything else returns false.
    let mut state = st.state();
    let mut retired = st.slot().sq_retired.load(Ordering::Acquire);
    if !post_fast::<false>(f, st, wr, sge, &mut state, &mut retired, 0, true, &mut ListSeen::default(), |_| 0) {
        return false;
    }
    settle::<false>(f, st);
    true
}

/// A dry run of [`post_send`] for `chain`, one WR (`Qp::warm_send`; any other chain does
/// nothing): the same functions, with `SqState::dry` set, so that the machine code a post
/// runs is the code warmed, not a copy. The fast path returns at its point of no return,
/// before the message queue, the receive request's claim and the CQE, having only read; a
/// WR it does not take ends the run (`post_list` does not run the general path dry), the
/// pending WQEs' progress is skipped, and the streaming check's state is put back after.
/// Nothing is posted and nothing changes but the QP's cached destination view (which a post
/// would make the same) and the caches.
#[inline(never)]
pub(crate) fn warm_send(f: &Fabric, st: &mut SqState, chain: &SendChain) {
    // Only a post of one WR has the dry stop (`post_fast`'s `lone`).
    if chain.len() != 1 {
        return;
    }
    // The streaming check's state is put back rather than tested for `dry` on every post.
    let (seen, stream) = (st.recv_polled_seen, st.mq_stream);
    st.dry = true;
    let _ = post_send(f, st, chain);
    st.dry = false;
    (st.recv_polled_seen, st.mq_stream) = (seen, stream);
}

/// The fast path: runs WR `wr` (one SGE, INLINE or not) if it is the common case, an RC or UC
/// (`XRC`: an XRC_SEND) SEND, SEND_WITH_IMM or RDMA_WRITE from an RTS queue with nothing
/// pending, to a ready peer with an RQ or a plain (not tag-matching) SRQ (`XRC`: the XRC SRQ
/// the request names, behind the connected XRC_RECV QP); returns false, having changed
/// nothing, for anything else, which then takes the general path (`post_one`, which also
/// reports every error).
///
/// Every check the general path makes runs here too, in the same order of effect: the WR
/// checks of `prepare` (the opcode is allowed on RC and UC, no IP_CSUM, one SGE within
/// `max_send_sge`, at most 2^31 bytes, the lkey is an MR of our PD covering the bytes — or,
/// INLINE, the bytes lie in the fabric and fit `max_inline_data`), the queue space, the destination checks of `exec_wr`, then the rkey checks of an
/// RDMA WRITE. Only then does anything happen. A SEND's point of no return is taking the
/// receive request: with none posted it returns false (RNR or a UC drop, decided by the
/// general path); a request that is not one SGE, or whose buffer does not fit or fails its
/// checks, is finished by the general code ([`deliver_taken`]), so the receiver sees the
/// same completion either way.
///
/// `lone`: the WR is a post of its own (not part of a longer chain), the only case a dry run
/// (`SqState::dry`, [`warm_send`]) takes; a chain's WRs skip that test (a constant false
/// there, folded away).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn post_fast<const XRC: bool>(
    f: &Fabric,
    st: &mut SqState,
    wr: &SendWr,
    sge: &Sge,
    state: &mut QpState,
    retired: &mut u32,
    rest: usize,
    lone: bool,
    seen: &mut ListSeen,
    ahead: impl FnOnce(usize) -> usize,
) -> bool {
    let hold = rest > 0;
    let op = wr.opcode;
    let is_send = matches!(op, WrOpcode::Send | WrOpcode::SendWithImm);
    let type_ok = if XRC { st.qp_type == QpType::XrcSend } else { matches!(st.qp_type, QpType::Rc | QpType::Uc) };
    if !(is_send || op == WrOpcode::RdmaWrite)
        || !type_ok
        || *state != QpState::Rts
        || !st.pending.is_empty()
        || st.max_sge == 0
        || wr.flags.contains(SendFlags::IP_CSUM)
        || sge.length > 1 << 31
    {
        return false;
    }
    let len = sge.length as usize;
    // INLINE (valid for all three opcodes here): the bytes are copied now, so the L_Key is not
    // checked, but they must lie in the fabric and fit max_inline_data, as `prepare` requires.
    let src = if wr.flags.contains(SendFlags::INLINE) {
        if sge.length > st.max_inline {
            return false;
        }
        f.offset_of(sge.addr, sge.length as u64).and_then(|off| f.ptr(off, sge.length as u64))
    } else {
        let mr = match st.lkeys.again(sge.lkey) {
            Some(m) if seen.mr_ok => m,
            _ => {
                let pd = st.pd;
                let Some(m) = st.lkeys.get(f, sge.lkey, |m| !m.window && m.pd == pd) else { return false };
                seen.mr_ok = true;
                m
            }
        };
        mr.translate(f, sge.addr, sge.length as u64)
    };
    let Some(src) = src else {
        return false;
    };
    if st.posted.wrapping_sub(*retired) >= st.depth {
        *retired = st.slot().sq_retired.load(Ordering::Acquire);
        if st.posted.wrapping_sub(*retired) >= st.depth {
            return false;
        }
    }
    let d = if seen.dest_ok {
        let Some(d) = st.dest.as_ref() else { return false };
        d
    } else {
        let Some(d) = dest(f, &mut st.dest, st.dest_qpn) else { return false };
        let ds = d.slot.get();
        let ready = QpState::from_u8(ds.state.load(Ordering::Acquire) as u8).is_some_and(QpState::receives);
        let peer = if XRC { QpType::XrcRecv } else { st.qp_type };
        if !ready || ds.dest_qpn.load(Ordering::Relaxed) != st.qpn || d.qp_type != peer {
            return false;
        }
        seen.dest_ok = true;
        d
    };
    // XRC: the SRQ the request names, behind the XRC_RECV QP (a wrong one: the general path
    // reports it).
    let d = if XRC {
        match xrc_dest(f, &mut st.xrc_dest, d, wr.remote_srqn) {
            Some(x) => x,
            None => return false,
        }
    } else {
        d
    };
    // The end of a dry run (`warm_send`): everything above only read; the receive request
    // the next SEND takes is fetched, as a take leaves it.
    if lone && st.dry {
        match (&d.rq, &d.srq) {
            (Some(rq), _) => rq.prefetch(0),
            (None, Some(srq)) => srq.ring.prefetch(0),
            _ => {}
        }
        return true;
    }
    // An RC SEND to a target whose receive CQ has a message queue goes through it, if it is
    // part of a post list, follows queued ones, or is a lone post of a streaming QP (or
    // `Mode::All`): its receiver (or a helper) delivers it (`post_mq`). Any other lone post
    // stays here, where the sender does the receiver's work and the receiver's poll is short
    // (`drain::Mode`). Up to 32 bytes ride in the cell; a longer one (up to `MQ_REF_MAX`)
    // goes by reference, the cell naming its bytes for the drainer to copy, unless INLINE
    // (the caller may reuse those bytes once the post returns).
    if !XRC
        && is_send
        && (len <= MQ_PAYLOAD_MAX || (len <= MQ_REF_MAX && !wr.flags.contains(SendFlags::INLINE)))
        && (rest > 0 || st.mq.last != 0 || st.mq_every || st.mq_stream)
        && !st.send_cq.has_channel
    {
        if let (Some(q), Some(rq)) = (d.mq, &d.rq) {
            // The switch and the reservation read the target's RQ here, where the view
            // is borrowed from the destination cache (a copy per message showed in
            // instruction profiles).
            if st.mq.dest != d.qpn || st.mq.cqn != d.cqn {
                mq_switch(&mut st.mq, &st.send_cq, d.qpn, d.cqn, q);
            }
            if !mq_reserve(&mut st.mq, rq) {
                return false;
            }
            // (`post_mq` reads the queue itself, from `st.dest`.)
            let idx = d.idx;
            if len > MQ_PAYLOAD_MAX {
                return post_mq_ref(f, st, wr, src, len, idx, rest);
            }
            return post_mq::<false>(f, st, wr, src, len, idx, rest);
        }
    }
    // Anything else this QP posts waits until the SENDs it queued are drained, or it would
    // overtake them (its completion, or its bytes, first): the general path parks it.
    if !st.mq.settle() {
        return false;
    }
    // A held SEND's completion is written with its held stores (`HeldSend`), not below.
    let mut held_now = false;
    let status = if is_send {
        // An SRQ is consumed with the MPMC pop (`SrqView::take`, which also raises the limit
        // event); a tag-matching SRQ goes the general way (it may match the message).
        // (`resolve_dest` gives a target an RQ or an SRQ, never both.)
        let (rq, taken) = match (&d.rq, &d.srq) {
            // The connected sender: the queue's single-consumer mode (`shm::solo`).
            (Some(rq), _) => (&**rq, recvq::pop_held_solo(rq, &d.solo, &mut st.rx)),
            (None, Some(srq)) if srq.tm.is_none() => {
                let run = &mut st.run;
                let taken = if run.left > 0 && run.srqn == srq.srqn {
                    // The next request of the run an earlier SEND of this post claimed.
                    let pos = run.next;
                    srq.ring.read_held(pos, &mut st.rx);
                    run.next = pos.wrapping_add(1);
                    run.left -= 1;
                    Some(pos)
                } else if rest == 0 && run.left == 0 {
                    // Nothing follows: one request, as a lone post takes it.
                    srq_take_held(f, srq, &mut st.rx)
                } else {
                    // The WRs after this one that may share its claim: not past the send
                    // queue's room (this WR has a WQE: `room >= 1`).
                    let room = st.depth.wrapping_sub(st.posted.wrapping_sub(*retired)) as usize;
                    srq_take(f, srq, d, run, &mut st.rx, rest.min(room.saturating_sub(1)), ahead)
                };
                (&*srq.ring, taken)
            }
            _ => return false,
        };
        let pd = d.srq.map_or(d.pd, |s| s.pd);
        let Some(rq_pos) = taken else {
            return false;
        };
        let dst = if st.rx.n == 1 { recv_dst_kept(f, pd, &st.rx.sges[0], len, &mut st.recv_lkeys) } else { None };
        if let Some(dst) = dst {
            let imm = op == WrOpcode::SendWithImm;
            let solicited = wr.flags.contains(SendFlags::SOLICITED);
            // Hold the receiver-side stores until the chain's claims are made (`HeldRecv`);
            // XRC (out of line), a lone post and a CQ that is full (its overrun) do them now.
            // The chain's last WR is held too when others are: its completion, written now,
            // would free their buffers before their bytes are copied (a completion implies
            // those of the unsignaled WRs before it).
            let claimed = if XRC || (!hold && st.held.is_empty()) {
                None
            } else {
                let mut seen = d.cq_head.get();
                let c = d.cq.claim(&mut seen);
                d.cq_head.set(seen);
                c
            };
            if let Some(cq_pos) = claimed {
                // A signaled SEND's own completion: its cell is claimed now, with the
                // receiver's, and published after the copy (`HeldSend`). A full send CQ
                // overruns now, as `finish` would.
                let wqe = st.posted;
                let mut send = None;
                if st.sig_all || wr.flags.contains(SendFlags::SIGNALED) {
                    let mut seen = st.send_cq_head.get();
                    let pos = st.send_cq.ring.claim(&mut seen);
                    st.send_cq_head.set(seen);
                    match pos {
                        Some(pos) => send = Some(HeldSend { pos, wr_id: wr.wr_id, wqe }),
                        None => after_push(f, st.send_cq.cqn, st.send_cq.has_channel, false, false),
                    }
                }
                let held = &mut st.held;
                if held.len == MAX_HELD || (held.len > 0 && !held.dest.is_some_and(|h| h.goes_to(rq, &d.cq))) {
                    publish_held(f, held);
                }
                if held.len == 0 {
                    held.dest = Some(HeldDest {
                        rq: *rq,
                        cq: d.cq,
                        cqn: d.cqn,
                        channel: d.cq_channel,
                        qp_num: d.qpn,
                        src_qp: st.qpn,
                        slid: st.lid,
                        send_cq: st.send_cq.ring,
                        send_cqn: st.send_cq.cqn,
                        send_channel: st.send_cq.has_channel,
                    });
                }
                let base = f.base_addr();
                held.msgs[held.len] = HeldRecv {
                    wr_id: st.rx.wr_id,
                    rq_pos,
                    cq_pos,
                    // Both pointers lie in the fabric (checked against MRs or the arena).
                    dst_off: (dst as u64).wrapping_sub(base),
                    src_off: (src as u64).wrapping_sub(base),
                    byte_len: len as u32,
                    imm_data: if imm { wr.imm_data } else { 0 },
                    with_imm: imm,
                    solicited,
                };
                held.len += 1;
                // Added after the publication above, which must not complete this SEND
                // before its copy. (`sends` has room for every held message.)
                if let Some(send) = send {
                    held.sends[held.n_sends] = send;
                    held.n_sends += 1;
                }
                held_now = true;
            } else {
                // Not held (a lone post, XRC, or a full receive CQ): what is held completes
                // first, for the same reason.
                publish_held(f, &mut st.held);
                let wc = WorkCompletion {
                    wr_id: st.rx.wr_id,
                    opcode: WcOpcode::Recv,
                    byte_len: len as u32,
                    imm_data: if imm { wr.imm_data } else { 0 },
                    wc_flags: if imm { WcFlags::WITH_IMM } else { WcFlags::empty() },
                    qp_num: d.qpn,
                    src_qp: st.qpn,
                    slid: st.lid,
                    ..Default::default()
                };
                rq.release(rq_pos);
                // Small payloads ride in the CQE (scatter-to-CQE): the receiver's poll
                // places them, so only the CQE's line crosses cores.
                if len <= INLINE_CQE_MAX {
                    push_recv_wc_inline(f, d, &wc, dst, src, solicited);
                } else {
                    copy_translated(src, dst, len);
                    push_recv_wc(f, d, &wc, solicited);
                }
            }
            WcStatus::Success
        } else {
            // The general delivery writes completions now: the held ones go first (and their
            // requests are released before this one, so cells free in ring order).
            publish_held(f, &mut st.held);
            rq.release(rq_pos);
            let sender = Sender { qp_type: st.qp_type, qpn: st.qpn, lid: st.lid };
            deliver_taken_cold(f, sender, &st.rx, d, wr, src, len)
        }
    } else {
        // A dead owner's memory is not written: the general path turns this WR into the
        // unanswered request that ends in RETRY_EXC_ERR.
        if d.owner_died() {
            return false;
        }
        let Some(dst) = remote_mr(f, d, wr, AccessFlags::REMOTE_WRITE)
            .and_then(|m| m.translate(f, wr.remote_addr, sge.length as u64))
        else {
            return false;
        };
        // A WRITE's bytes must not become visible before the held SENDs ahead of it.
        publish_held(f, &mut st.held);
        // `src` was checked against our MR and `dst` against the peer's, both for `len` bytes.
        copy_translated(src, dst, len);
        WcStatus::Success
    };
    let wqe = st.posted;
    st.posted = st.posted.wrapping_add(1);
    if !held_now {
        finish(f, st, wr, wqe, status, 0);
    }
    if status != WcStatus::Success {
        *state = QpState::Error;
        // The failed delivery may have moved the target to ERROR too.
        *seen = ListSeen::default();
    }
    true
}

/// Whether one of the target's posted receive requests is left for a queued SEND to
/// reserve (`post_mq` takes it). Changes only our cached counts.
///
/// The reservation is a count: the target is an RC QP connected to us, so we are the only
/// sender consuming its RQ, and our count of reserved requests (from the RQ's `head` when
/// nothing of ours is in flight) against a cached copy of its `tail` (re-read only when the
/// copy says none is left) tells whether a request is there, without a locked instruction.
#[inline(always)]
fn mq_reserve(m: &mut MqSend, rq: &RecvRing) -> bool {
    if m.last == 0 {
        // Nothing of ours is in flight: the RQ's consumed position is where we start.
        m.rq_next = rq.head_pos();
    }
    if m.rq_tail.wrapping_sub(m.rq_next) as i64 <= 0 {
        m.rq_tail = rq.tail_pos();
        if m.rq_tail.wrapping_sub(m.rq_next) as i64 <= 0 {
            return false;
        }
    }
    true
}

/// Receiver-side delivery of an RC SEND (`shm::drain`), once [`mq_reserve`] found a
/// receive request to reserve: claims a cell of the target's receive CQ's queue and writes
/// the message there (one cache line; `REF`: a payload above 32 bytes, by reference); the
/// drainer takes the request, places the bytes and writes both completions. Called by
/// `post_fast` after every check of the general path (a target with no request left goes to
/// the general path, which decides RNR after the queued SENDs are drained).
#[inline(always)]
fn post_mq<const REF: bool>(
    f: &Fabric,
    st: &mut SqState,
    wr: &SendWr,
    src: *mut u8,
    len: usize,
    idx: usize,
    rest: usize,
) -> bool {
    // SENDs held by this post list's earlier WRs (`HeldRecv`) must be published first: the
    // drainer may deliver this one at once.
    publish_held(f, &mut st.held);
    let wqe = st.posted;
    let mut flags = 0;
    if st.sig_all || wr.flags.contains(SendFlags::SIGNALED) {
        flags |= F_SIGNALED;
    }
    if wr.opcode == WrOpcode::SendWithImm {
        flags |= F_IMM;
    }
    if wr.flags.contains(SendFlags::SOLICITED) {
        flags |= F_SOLICITED;
    }
    if REF {
        flags |= F_REF;
    }
    let (words, cell_len) = mq_words::<REF>(f, st.qpn, wqe, wr, src, len);
    let tag = drain::tag(idx, flags);
    let imm = if flags & F_IMM != 0 { wr.imm_data } else { 0 };
    // The target's queue, read here from its view (`post_fast` found it there) rather than
    // carried from `post_fast`: its three words lived on the stack across the checks
    // between (three stores per queued SEND, session 57).
    let Some(q) = st.dest.as_ref().and_then(|d| d.mq) else { return false };
    // One claim for the rest of the post list: a locked instruction per message would wait
    // for the previous message's cell stores, each a line the receiver holds (the round
    // trip session 14 measured). Positions the list does not use are written as no-ops
    // (`mq_close`).
    let m = &mut st.mq;
    let pos = if m.claim_next != m.claim_end {
        m.claim_next += 1;
        m.claim_next - 1
    } else {
        let n = (rest as u64 + 1).min(MQ_CLAIM_MAX).min(q.capacity() / 2).max(1);
        let p = q.claim(n);
        m.claim_next = p + 1;
        m.claim_end = p + n;
        p
    };
    // The claimed cell is ours and must be written. It is busy only while the previous lap's
    // message is undrained (more messages queued than the CQ has entries): drain it ourselves
    // if nobody is (`drain::help`), then write.
    // The retry loop is out of line: around its call the words would live on the stack,
    // and every store a lone post makes waits behind the previous cell's (session 26). It
    // rebuilds the words and finds the queue in `st.dest` rather than taking them: as its
    // arguments they were stored to the stack on every post, thirteen stores (session 57).
    if q.write_words(pos, &mut st.mq.acked, cell_len as u32, tag, imm, words).is_err()
        && !mq_write_waiting::<REF>(f, st, wr, wqe, pos, (tag, imm), src, len)
    {
        return true;
    }
    let m = &mut st.mq;
    m.rq_next = m.rq_next.wrapping_add(1);
    m.last = pos + 1;
    st.posted = st.posted.wrapping_add(1);
    true
}

/// The words of a queued SEND's cell and its length in bytes ([`post_mq`]): the sender
/// (QP `qpn`, WQE `wqe`) and `wr_id`, then the payload of `len` bytes at `src`, or with
/// `REF` its fabric offset and length.
#[inline(always)]
fn mq_words<const REF: bool>(
    f: &Fabric,
    qpn: u32,
    wqe: u32,
    wr: &SendWr,
    src: *mut u8,
    len: usize,
) -> ([u64; PAYLOAD_WORDS], usize) {
    // `src` was translated for `len` bytes (our MR, or the fabric for INLINE), `post_fast`;
    // a larger payload stays there and the cell carries its fabric offset (`F_REF`).
    let ([p0, p1, p2, p3], cell_len) = if REF {
        ([(src as u64).wrapping_sub(f.base_addr()), len as u64, 0, 0], META_WORDS * 8 + 16)
    } else {
        (read_translated_words(src, len), META_WORDS * 8 + len)
    };
    ([drain::meta(qpn, wqe), wr.wr_id, p0, p1, p2, p3], cell_len)
}

/// [`post_mq`]'s write of a cell found busy: waits for it to be drained (draining it if
/// nobody is) and writes. False if the receiver's process died with the queue full: nothing
/// will drain it, so the WQE ends as a send to a dead peer does (RETRY_EXC_ERR, ERROR) and
/// the claims are dropped with the queue.
#[cold]
#[inline(never)]
#[allow(clippy::too_many_arguments)]
fn mq_write_waiting<const REF: bool>(
    f: &Fabric,
    st: &mut SqState,
    wr: &SendWr,
    wqe: u32,
    pos: u64,
    (tag, imm): (u16, u32),
    src: *mut u8,
    len: usize,
) -> bool {
    let (words, cell_len) = mq_words::<REF>(f, st.qpn, wqe, wr, src, len);
    let len = cell_len as u32;
    // `post_mq` found the queue in the target's view, `st.dest` (never an XRC target
    // here), which nothing changed since.
    if let Some((q, cqn, pid)) = st.dest.as_ref().and_then(|d| Some((d.mq?, d.cqn, d.pid))) {
        let mut waited = 0;
        loop {
            if q.write_words(pos, &mut st.mq.acked, len, tag, imm, words).is_ok() {
                return true;
            }
            if !mq_wait(f, &q, cqn, pid, &mut waited) {
                break;
            }
        }
    }
    // The receiver died with its queue full (or, which cannot happen, the queue is gone).
    mq_abandon(st);
    st.posted = st.posted.wrapping_add(1);
    fail(f, st, wr, wqe, WcStatus::RetryExcErr);
    false
}

/// [`post_mq`] of a payload by reference (more than a cell holds), out of line: inlined
/// beside the payload-in-cell case it cost every small SEND instructions (+12 per message in
/// chains of 32).
#[inline(never)]
fn post_mq_ref(f: &Fabric, st: &mut SqState, wr: &SendWr, src: *mut u8, len: usize, idx: usize, rest: usize) -> bool {
    post_mq::<true>(f, st, wr, src, len, idx, rest)
}

/// Forgets this QP's queued SENDs and open claims: their queue's receiver is gone.
#[cold]
fn mq_abandon(st: &mut SqState) {
    let m = &mut st.mq;
    m.claim_next = m.claim_end;
    m.last = 0;
}

/// Most positions one claim of a post list takes.
const MQ_CLAIM_MAX: u64 = 32;

/// Writes the positions this QP claimed and did not use as no-ops (`drain::F_NOP`): the
/// drainer stops at a claimed, unwritten position. Runs when a post list ends, or before a
/// WR of it that does not take the queue.
#[inline(always)]
pub(crate) fn mq_close(f: &Fabric, st: &mut SqState) {
    if st.mq.claim_next != st.mq.claim_end {
        mq_close_now(f, st);
    }
}

#[cold]
#[inline(never)]
fn mq_close_now(f: &Fabric, st: &mut SqState) {
    let Some(q) = st.mq.q else { return };
    let (cqn, pid) = (st.mq.cqn, st.dest.as_ref().map_or(0, |d| d.pid));
    let mut waited = 0;
    while st.mq.claim_next != st.mq.claim_end {
        let pos = st.mq.claim_next;
        while q.write(pos, &mut st.mq.acked, 0, drain::tag(0, drain::F_NOP), 0, &[]).is_err() {
            if !mq_wait(f, &q, cqn, pid, &mut waited) {
                mq_abandon(st);
                return;
            }
        }
        st.mq.claim_next += 1;
        st.mq.last = pos + 1;
    }
}

/// A new destination for queued SENDs: fresh counts, and our send CQ remembers its queue
/// for helping (`CqShared::add_help`).
#[cold]
#[inline(never)]
fn mq_switch(m: &mut MqSend, send_cq: &super::complete::CqShared, qpn: u32, cqn: u32, q: MsgQueue) {
    // (`mq_close` ran at the end of the last post list, so no claim is left open.)
    *m = MqSend { dest: qpn, cqn, q: Some(q), ..Default::default() };
    send_cq.add_help(cqn);
}

/// The queue was full at our claimed cell: help drain it, or let its drainer run. Returns
/// false when the queue's owner (`pid`) has died and nobody can drain it (a dead drainer may
/// hold its lock); checked every 1,024 waits (`waited` counts them).
#[cold]
#[inline(never)]
fn mq_wait(f: &Fabric, q: &MsgQueue, cqn: u32, pid: u32, waited: &mut u32) -> bool {
    if !drain::help(f, q, cqn) {
        std::thread::yield_now();
    }
    *waited += 1;
    !(*waited % 1024 == 0 && pid != 0 && !pid_alive(pid))
}

/// The fast path for XRC_SEND QPs: [`post_fast`] with the target SRQ named by the request,
/// out of line so that RC and UC posts do not carry it.
#[inline(never)]
pub(crate) fn post_fast_xrc(
    f: &Fabric,
    st: &mut SqState,
    wr: &SendWr,
    sge: &Sge,
    state: &mut QpState,
    retired: &mut u32,
) -> bool {
    post_fast::<true>(f, st, wr, sge, state, retired, 0, false, &mut ListSeen::default(), |_| 0)
}

/// `post_one` for a WR with several SGEs, and TSO requests ([`post_tso`]), out of line to
/// keep the common loop small.
#[allow(clippy::too_many_arguments)]
#[inline(never)]
pub(crate) fn post_many(
    f: &Fabric,
    st: &mut SqState,
    wr: &SendWr,
    sges: &[Sge],
    inline: Option<&[u8]>,
    chain: &SendChain,
    i: usize,
    state: &mut QpState,
    retired: &mut u32,
) -> std::result::Result<(), PostError> {
    if wr.opcode == WrOpcode::Tso {
        return post_tso(f, st, wr, sges, chain.tso_hdr_of(wr), i, state, retired);
    }
    if st.qp_type == QpType::XrcSend {
        if let ([sge], None) = (sges, inline) {
            if post_fast_xrc(f, st, wr, sge, state, retired) {
                return Ok(());
            }
        }
    }
    post_one::<MAX_SGE>(f, st, wr, sges, inline, i, state, retired)
}

/// Takes the next WQE of the send queue for WR `i` (`wr`), after its checks: ENOMEM when the
/// queue is full (`retired` re-read once first); `None` when the QP is in ERROR, the WQE
/// then completed with a flush error.
#[inline(always)]
pub(crate) fn claim_wqe(
    st: &mut SqState,
    wr: &SendWr,
    state: QpState,
    retired: &mut u32,
    i: usize,
) -> std::result::Result<Option<u32>, PostError> {
    if st.posted.wrapping_sub(*retired) >= st.depth {
        *retired = st.slot().sq_retired.load(Ordering::Acquire);
        if st.posted.wrapping_sub(*retired) >= st.depth {
            return Err(PostError::new(Errno::ENOMEM, i, "send queue full (poll completions to free slots)"));
        }
    }
    let wqe = st.posted;
    st.posted = st.posted.wrapping_add(1);
    if state == QpState::Error {
        st.complete(wr, wqe, WcStatus::WrFlushErr, 0);
        return Ok(None);
    }
    Ok(Some(wqe))
}

/// Checks, accounts and runs WR `i` of a chain (the body of `post_send`'s loop). `N` is the
/// room for its local segments: at least 1 and `sges.len()`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(crate) fn post_one<const N: usize>(
    f: &Fabric,
    st: &mut SqState,
    wr: &SendWr,
    sges: &[Sge],
    inline: Option<&[u8]>,
    i: usize,
    state: &mut QpState,
    retired: &mut u32,
) -> std::result::Result<(), PostError> {
    let mut segs = [Seg::default(); N];
    let (n, total, is_inline) = prepare(f, st, wr, sges, inline, i, &mut segs)?;
    let Some(wqe) = claim_wqe(st, wr, *state, retired, i)? else { return Ok(()) };
    if !st.pending.is_empty() {
        st.enqueue(wr, wqe, sges, is_inline.then_some(&segs[..n]));
        return Ok(());
    }
    if !st.mq.settle() {
        // SENDs this QP queued are not all drained: this WQE waits for them (`run_pending`).
        st.enqueue(wr, wqe, sges, is_inline.then_some(&segs[..n]));
        st.blocked = Some(Blocked { kind: BlockKind::Drain, left: 0, next_at: Instant::now() });
        return Ok(());
    }
    match exec_wr(f, st, wr, &segs[..n], total) {
        Outcome::Done(status, len) => {
            finish(f, st, wr, wqe, status, len);
            if status != WcStatus::Success {
                *state = QpState::Error;
            }
        }
        Outcome::Block(kind) => {
            st.enqueue(wr, wqe, sges, is_inline.then_some(&segs[..n]));
            st.blocked = None;
            if !handle_block(f, st, kind) {
                *state = QpState::Error;
            }
        }
    }
    Ok(())
}

/// Completes an executed WQE: its CQE if signaled; on failure an error CQE and ERROR.
#[inline]
pub(crate) fn finish(f: &Fabric, st: &mut SqState, wr: &SendWr, wqe: u32, status: WcStatus, len: u32) {
    if status == WcStatus::Success {
        if st.sig_all || wr.flags.contains(SendFlags::SIGNALED) {
            st.complete(wr, wqe, status, len);
        }
    } else {
        fail(f, st, wr, wqe, status);
    }
}

/// The failure half of `finish`, out of line (rare, and it drags in the flush path).
#[inline(never)]
pub(crate) fn fail(f: &Fabric, st: &mut SqState, wr: &SendWr, wqe: u32, status: WcStatus) {
    // ERROR first, then the completion (Release, in the CQ push): a poller that sees the
    // error CQE reads the QP in ERROR, whichever thread ran the retry timer (the flake of
    // case unreachable_peer_retry_exc, session 34). The receive queue's flush and the rest
    // of the send queue's follow the completion, as before.
    let moved = super::qp_error::mark_error(f, st.idx, st.qpn);
    st.complete(wr, wqe, status, 0);
    if moved {
        super::qp_error::after_error(f, st.idx, st.qpn);
    }
    st.flush_pending();
}

pub(crate) fn block_delay(f: &Fabric, st: &SqState, kind: BlockKind) -> Duration {
    match kind {
        BlockKind::Rnr => {
            let code = st.dest.as_ref().map_or(0, |d| f.qp_slot(d.idx).min_rnr_timer.load(Ordering::Relaxed) as u8);
            Duration::from_nanos(rnr_timer_ns(code))
        }
        // An infinite ACK timeout would hang forever on hardware; here the WQE is retried
        // every millisecond without using up retries.
        BlockKind::Unreachable => Duration::from_nanos(st.timeout_ns.unwrap_or(1_000_000)),
        BlockKind::Drain => Duration::ZERO,
    }
}

/// The WQE at the head of the pending queue could not run. Schedules its retry, or fails it
/// (and flushes the rest) when no retry is left: `rnr_retry`/`retry_cnt` count retries after
/// the first attempt, 7 RNR retries mean forever. Returns false when the head failed.
pub(crate) fn handle_block(f: &Fabric, st: &mut SqState, kind: BlockKind) -> bool {
    let forever =
        (kind == BlockKind::Rnr && st.rnr_retry == 7) || (kind == BlockKind::Unreachable && st.timeout_ns.is_none());
    let left = match st.blocked {
        // This failure was a retry: it used one up.
        Some(b) if b.kind == kind => {
            st.retries += 1;
            if forever {
                b.left
            } else {
                b.left.saturating_sub(1)
            }
        }
        // First failure of this kind for this WQE.
        _ => match kind {
            BlockKind::Rnr => st.rnr_retry,
            BlockKind::Unreachable => st.retry_cnt,
            BlockKind::Drain => 0,
        },
    };
    let now = Instant::now();
    let exhausted = !forever && left == 0;
    // Whether the responder's process died: asked of the kernel when the WQE fails anyway
    // (its status must say which failure it was), else answered from this process's checks
    // of the last millisecond (`pid_alive_recently`: a storm of RNR retries made one system
    // call each).
    let peer_dead =
        st.dest.as_ref().is_some_and(|d| if exhausted { !pid_alive(d.pid) } else { !pid_alive_recently(d.pid, now) });
    if peer_dead || exhausted {
        st.blocked = None;
        if let Some(p) = st.pending.pop_front() {
            let status =
                if kind == BlockKind::Rnr && !peer_dead { WcStatus::RnrRetryExcErr } else { WcStatus::RetryExcErr };
            finish(f, st, &p.wr, p.wqe, status, 0);
        }
        return false;
    }
    st.blocked = Some(Blocked { kind, left, next_at: now + block_delay(f, st, kind) });
    true
}

/// Runs pending WQEs in order while the head can make progress.
///
/// An RNR wait ends early when the responder has posted a receive since: a NIC cannot see
/// the responder's queue and must sleep the whole RNR timer, but this one can, and sleeping
/// on with a buffer ready only turns a short burst into a 10 µs+ stall (it made `send_bw`
/// on shm bimodal). The early attempt is not a retry: if it finds the queue empty again
/// (another sender of an SRQ won the request), the wait, its deadline and the retry count
/// stay as they were. So `rnr_retry` still counts timer expiries exactly.
pub(crate) fn run_pending(f: &Fabric, st: &mut SqState, now: Instant) {
    let mut segs = [Seg::default(); MAX_SGE];
    while let Some(p) = st.pending.front().copied() {
        if st.blocked.is_some_and(|b| b.kind == BlockKind::Drain) {
            if !st.mq.settle() {
                // Deliver them ourselves if their receiver is not draining right now.
                if let Some(q) = st.mq.q {
                    drain::help(f, &q, st.mq.cqn);
                }
                if !st.mq.settle() {
                    return;
                }
            }
            st.blocked = None;
        }
        let mut early = false;
        if let Some(b) = st.blocked {
            if now < b.next_at {
                if b.kind != BlockKind::Rnr || !st.dest.as_ref().is_some_and(DestView::has_recv) {
                    return;
                }
                early = true;
            }
        }
        let (n, total) = {
            let (sges, inline) = st.pending_parts(&p);
            match inline {
                Some(bytes) => {
                    segs[0] = Seg { ptr: bytes.as_ptr() as *mut u8, len: bytes.len() };
                    (1, bytes.len() as u64)
                }
                None => {
                    let need_write = matches!(
                        p.wr.opcode,
                        WrOpcode::RdmaRead | WrOpcode::AtomicCmpAndSwp | WrOpcode::AtomicFetchAndAdd
                    );
                    let sges: [Sge; MAX_SGE] = std::array::from_fn(|k| sges.get(k).copied().unwrap_or_default());
                    match resolve_local(f, st.pd, &sges[..p.n_sge as usize], need_write, &mut segs) {
                        Ok(v) => v,
                        Err(_) => {
                            st.pending.pop_front();
                            finish(f, st, &p.wr, p.wqe, WcStatus::LocProtErr, 0);
                            return;
                        }
                    }
                }
            }
        };
        match exec_wr(f, st, &p.wr, &segs[..n], total) {
            Outcome::Done(status, len) => {
                st.pending.pop_front();
                st.blocked = None;
                finish(f, st, &p.wr, p.wqe, status, len);
                if status != WcStatus::Success {
                    return;
                }
            }
            Outcome::Block(kind) => {
                if !(early && kind == BlockKind::Rnr) {
                    handle_block(f, st, kind);
                }
                return;
            }
        }
    }
}

/// Retries the head of the pending queue if its timer expired; runs what follows.
pub(crate) fn progress(st: &mut SqState) {
    progress_at(st, Instant::now());
}

/// [`progress`] with the time already read (`now`, to compare with the retry timer): a CQ
/// poll that progresses up to 16 queues reads the clock once for all.
pub(crate) fn progress_at(st: &mut SqState, now: Instant) {
    if st.state() == QpState::Error {
        st.flush_pending();
        return;
    }
    let f = st.ctx.fabric.clone();
    run_pending(&f, st, now);
    if st.pending.is_empty() {
        st.set_pending_registered(false);
    }
}

/// Checks, accounts and runs a TSO request on a RAW_PACKET QP (`IBV_WR_TSO`): its header
/// template (`hdr`, from [`SendChain::push_tso`]) and payload become frames of at most `mss`
/// payload bytes ([`TsoPlan`]), each switched as a RAW_PACKET send is. One completion (opcode
/// TSO) for the request. RAW_PACKET QPs never wait (no RNR), so nothing is pending behind
/// which the frames could overtake an earlier request.
///
/// Errors (EINVAL unless said, `bad_wr` = `i`, nothing posted): the opcode on a connected
/// QP (the seed table); EOPNOTSUPP on UD (the shm provider segments TCP over Ethernet, which a
/// UD message does not carry); no header, one over [`MAX_TSO_HEADER`], or one
/// [`TsoPlan::new`] refuses; a payload over [`MAX_TSO`]; a header plus MSS over the port MTU
/// + 18; the gather list's own checks; ENOMEM on a full send queue.
#[cold]
#[inline(never)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn post_tso(
    f: &Fabric,
    st: &mut SqState,
    wr: &SendWr,
    sges: &[Sge],
    hdr: Option<&[u8]>,
    i: usize,
    state: &mut QpState,
    retired: &mut u32,
) -> std::result::Result<(), PostError> {
    let einval = |why| PostError::new(Errno::EINVAL, i, why);
    if !WrOpcode::Tso.allowed_on(st.qp_type) {
        return Err(einval("opcode not allowed on this QP type (ibv_post_send(3) table)"));
    }
    if st.qp_type != QpType::RawPacket {
        return Err(PostError::new(
            Errno::EOPNOTSUPP,
            i,
            "TSO on UD QPs is not offered by the shm provider (it segments TCP over Ethernet, on RAW_PACKET QPs)",
        ));
    }
    let Some(hdr) = hdr else {
        return Err(einval("TSO request without a header template (push it with SendChain::push_tso)"));
    };
    if hdr.len() > MAX_TSO_HEADER as usize {
        return Err(einval("TSO header longer than max_tso_header (256)"));
    }
    let mut segs = [Seg::default(); MAX_SGE];
    let (n, total, _) = prepare(f, st, wr, sges, None, i, &mut segs)?;
    if total > u64::from(MAX_TSO) {
        return Err(einval("TSO payload larger than max_tso (256 KiB)"));
    }
    let plan = TsoPlan::new(hdr, wr.tso_mss(), total as usize).map_err(einval)?;
    if plan.header_len() + usize::from(wr.tso_mss()) > RAW_MAX_FRAME {
        return Err(einval("TSO header + MSS larger than the port MTU (4096) + 18 bytes of headers"));
    }
    let Some(wqe) = claim_wqe(st, wr, *state, retired, i)? else { return Ok(()) };
    // Every frame has the template's addresses, EtherType, protocol and ports: one key.
    let key = FrameKey::parse(hdr);
    let mut frame = [0u8; RAW_MAX_FRAME];
    let h = plan.header_len();
    let mut rest = [Seg::default(); MAX_SGE];
    for k in 0..plan.frames() {
        let (off, len) = plan.range(k);
        let m = skip_prefix(&segs[..n], off, &mut rest);
        gather_prefix(&rest[..m], &mut frame[h..h + len]);
        let end = plan.write_frame(hdr, k, &mut frame);
        let one = [Seg { ptr: frame.as_mut_ptr(), len: end }];
        switch_frame(f, st, wr, &key, &one, end as u64);
    }
    finish(f, st, wr, wqe, WcStatus::Success, 0);
    Ok(())
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::shm::{unit_context, Shm, ShmContext, ShmQp, ShmSrq};
    use crate::{Context, Cq, Mr, Pd, Provider, Qp, QpInitAttr, Srq};

    type Parts = (ShmContext, <Shm as Provider>::Pd, <Shm as Provider>::Cq, ShmSrq, ShmQp, ShmQp);

    /// An RC QP `qa` connected to `qb`, which receives through an SRQ holding requests
    /// 0..6 (8 bytes each, the wr_id their index).
    fn setup(t: &str) -> (Parts, <Shm as Provider>::Mr) {
        let ctx = unit_context(&format!("doorbell-{t}"));
        let pd = ctx.alloc_pd().unwrap();
        let (scq, rcq) = (ctx.create_cq(16).unwrap(), ctx.create_cq(16).unwrap());
        let mut srq = pd.create_srq(&SrqAttr { max_wr: 8, max_sge: 1, srq_limit: 0 }).unwrap();
        let region = ctx.alloc_region(4096).unwrap();
        let mr = pd.reg_mr(&region, 0, 4096, AccessFlags::LOCAL_WRITE).unwrap();
        for i in 0..6u64 {
            srq.post_recv(&RecvChain::one(i, &[Sge::new(mr.addr() + i * 8, 8, mr.lkey())])).unwrap();
        }
        let qp = |srq: Option<&ShmSrq>| {
            let attr = QpInitAttr {
                send_cq: &scq,
                recv_cq: &rcq,
                srq,
                cap: QpCaps::default(),
                qp_type: QpType::Rc,
                sq_sig_all: false,
            };
            pd.create_qp(&attr).unwrap()
        };
        let (mut qa, mut qb) = (qp(None), qp(Some(&srq)));
        let (na, nb) = (qa.qp_num(), qb.qp_num());
        for (q, dest) in [(&mut qa, nb), (&mut qb, na)] {
            crate::shm::unit_connect(q, dest, AccessFlags::empty());
        }
        ((ctx, pd, rcq, srq, qa, qb), mr)
    }

    /// Claims a run of 3 of `qa`'s target SRQ as `srq_take` does for a post list of three
    /// SENDs, uses the first, and (`other`) lets another consumer take the next request
    /// before the run's two others are handed back; returns the first's wr_id.
    fn claim_three_and_return(f: &Fabric, qa: &ShmQp, other: bool) -> u64 {
        let mut g = qa.sq.lock();
        let st: &mut SqState = &mut g;
        let d = dest(f, &mut st.dest, st.dest_qpn).expect("the connected target").clone();
        let srq = d.srq.expect("a target on an SRQ");
        let (pos, k) = srq.take_run_held(f, 3, &mut st.rx).expect("requests posted");
        assert_eq!(k, 3);
        let first = st.rx.wr_id;
        srq.ring.release(pos);
        st.run = SrqRun { next: pos + 1, left: 2, srqn: srq.srqn, shaped: 0, dest: Some(d) };
        if other {
            let mut rx = RecvEntry::default();
            assert!(srq.take(f, &mut rx), "another consumer takes the request after the run");
            assert_eq!(rx.wr_id, first + 3);
        }
        return_run(f, &mut st.run, &mut st.rx);
        assert_eq!(st.run.left, 0);
        first
    }

    /// The requests of a run that no SEND used go back to the head of the SRQ when nobody
    /// claimed after them: the next messages take them, in order, and nothing else shows.
    #[test]
    fn a_run_left_over_goes_back_to_the_srq() {
        let ((ctx, _pd, mut rcq, _srq, mut qa, _qb), mr) = setup("back");
        let f = &*ctx.inner.fabric;
        assert_eq!(claim_three_and_return(f, &qa, false), 0);
        let mut c = SendChain::new();
        for i in 0..3 {
            c.push(SendWr::send(i), &[Sge::new(mr.addr() + 512, 4, mr.lkey())]);
        }
        qa.post_send(&c).unwrap();
        let mut wc = [WorkCompletion::default(); 8];
        let n = rcq.poll(&mut wc).unwrap();
        let got: Vec<_> = wc[..n].iter().map(|w| (w.wr_id, w.status)).collect();
        assert_eq!(got, [(1, WcStatus::Success), (2, WcStatus::Success), (3, WcStatus::Success)]);
    }

    /// A dry run (`Qp::warm_send`) posts nothing and changes nothing, whatever it is given:
    /// WRs the fast path takes (SEND, INLINE SEND, RDMA WRITE with any rkey), WRs only the
    /// general path runs (two SGEs, RDMA READ, a bad lkey), an empty chain, and a QP in ERROR,
    /// where a real post would be flushed. Afterwards no completion shows, no WQE was used,
    /// and the SRQ still serves its six requests to real SENDs, in order.
    #[test]
    fn a_dry_run_posts_nothing() {
        let sge_of = |mr: &<Shm as Provider>::Mr| Sge::new(mr.addr() + 512, 4, mr.lkey());
        let chains = |mr: &<Shm as Provider>::Mr| {
            let sge = sge_of(mr);
            vec![
                SendChain::one(SendWr::send(1).signaled(), &[sge]),
                SendChain::one(SendWr::send(2).inline(), &[sge]),
                SendChain::one(SendWr::write(3, 0x1000, 0x77).signaled(), &[sge]),
                SendChain::one(SendWr::read(4, 0x1000, 0x77).signaled(), &[sge]),
                SendChain::one(SendWr::send(5).signaled(), &[sge, sge]),
                SendChain::one(SendWr::send(6).signaled(), &[Sge::new(mr.addr(), 4, 0xdead)]),
                SendChain::new(),
                SendChain::one(SendWr::send(7), &[sge]).push(SendWr::send(8), &[sge]).clone(),
            ]
        };
        let mut wc = [WorkCompletion::default(); 8];
        let ((_ctx, _pd, mut rcq, _srq, mut qa, _qb), mr) = setup("dry");
        for c in &chains(&mr) {
            qa.warm_send(c);
        }
        assert_eq!(rcq.poll(&mut wc).unwrap(), 0);
        let posted_dry = |qa: &ShmQp| {
            let g = qa.sq.lock();
            (g.posted, g.pending.len(), g.dry)
        };
        assert_eq!(posted_dry(&qa), (0, 0, false));
        for i in 0..6 {
            qa.post_send(&SendChain::one(SendWr::send(10 + i), &[sge_of(&mr)])).unwrap();
        }
        let n = rcq.poll(&mut wc).unwrap();
        let got: Vec<_> = wc[..n].iter().map(|w| (w.wr_id, w.status)).collect();
        assert_eq!(got, (0..6).map(|i| (i, WcStatus::Success)).collect::<Vec<_>>());

        let ((_ctx, _pd, mut rcq, _srq, mut qa, _qb), mr) = setup("dry-error");
        qa.modify(&QpAttr { state: QpState::Error, ..Default::default() }).unwrap();
        for c in &chains(&mr) {
            qa.warm_send(c);
        }
        assert_eq!(posted_dry(&qa), (0, 0, false), "nothing flushed in ERROR");
        assert_eq!(rcq.poll(&mut wc).unwrap(), 0);
    }

    /// When another consumer claimed after the run, its requests cannot go back: they are
    /// completed on the target's CQ with IBV_WC_WR_FLUSH_ERR (not lost), their cells freed,
    /// and the SRQ serves the next message from the request after the other's.
    #[test]
    fn a_run_left_over_behind_another_claim_is_flushed() {
        let ((ctx, _pd, mut rcq, mut srq, mut qa, qb), mr) = setup("flush");
        let f = &*ctx.inner.fabric;
        assert_eq!(claim_three_and_return(f, &qa, true), 0);
        let mut wc = [WorkCompletion::default(); 8];
        let n = rcq.poll(&mut wc).unwrap();
        let got: Vec<_> = wc[..n].iter().map(|w| (w.wr_id, w.status, w.opcode, w.qp_num)).collect();
        let flushed = |id| (id, WcStatus::WrFlushErr, WcOpcode::Recv, qb.qp_num());
        assert_eq!(got, [flushed(1), flushed(2)]);
        qa.post_send(&SendChain::one(SendWr::send(9), &[Sge::new(mr.addr() + 512, 4, mr.lkey())])).unwrap();
        let n = rcq.poll(&mut wc).unwrap();
        assert_eq!((n, wc[0].wr_id, wc[0].status), (1, 4, WcStatus::Success));
        // Every cell was freed: the SRQ takes a full max_wr of requests again (5 is queued).
        for i in 0..7u64 {
            srq.post_recv(&RecvChain::one(100 + i, &[Sge::new(mr.addr(), 8, mr.lkey())])).unwrap();
        }
    }
}

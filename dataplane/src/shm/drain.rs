//! Receiver-side delivery (docs/shm-provider.md, "Receiver-side delivery"): an RC SEND of up
//! to 64 KiB travels as one cell of its receive CQ's message queue (`shm::msgq`), its
//! payload in the cell (at most 32 bytes) or named by it ([`F_REF`]), and whoever drains
//! that queue (the CQ's own poll, or a sender helping a receiver that does not poll) takes
//! the receive request, places the bytes and writes both completions. This module is the
//! drainer's side: the cell's record ([`tag`], [`meta`]), one message's delivery (`take`)
//! and the helpers' drain (`help`); a CQ's queue is found by `complete::cq_msgq`. The
//! sender's side is `doorbell::post_mq`.
//!
//! Which SENDs take it is [`Mode`] (`DATAPLANE_SHM_MSGQ`; by default those of post lists and
//! the lone SENDs of a QP that streams).
//! A CQ with a completion channel gets no queue (the channel's wake-ups would have to drain
//! too; not built).

use super::complete::{cq_ring, has_channel, push_cqe_to, push_recv_status, Cqe};
use super::dest::{dest, DestView};
use super::exec::{place_taken, responder_failed, Sender};
use super::fabric::Fabric;
use super::layout::*;
use super::mr::MrView;
use super::msgq::{Delivered, Drain, MsgQueue, PAYLOAD_WORDS};
use super::place::{copy_translated, recv_dst_in, write_translated_payload, Incoming, Seg};
use super::qp_error::{after_error, mark_error, to_error};
use super::recvq::{self, RecvEntry};
use super::wire::{CqRing, RecvRing};
use crate::verbs::*;
use std::sync::atomic::Ordering;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Words of a cell before the payload: the sender's QP number and WQE index, then `wr_id`.
pub(crate) const META_WORDS: usize = 2;

/// Payload bytes a queued SEND carries (the rest of the cell).
pub(crate) const MQ_PAYLOAD_MAX: usize = (PAYLOAD_WORDS - META_WORDS) * 8;

/// Largest SEND queued by reference ([`F_REF`]): its cell names the bytes in the sender's
/// memory and the drainer copies them. Larger ones stay on the sender's path, where one
/// `poll` never copies more than this per message.
pub(crate) const MQ_REF_MAX: usize = 64 << 10;

/// Bits of a cell's tag that name the receiving QP's slot (the rest are [`F_SIGNALED`]...).
const TAG_IDX_BITS: u32 = QP_IDX_BITS;
/// The sender wants a completion (IBV_SEND_SIGNALED or `sq_sig_all`).
pub(crate) const F_SIGNALED: u16 = 1;
/// SEND_WITH_IMM: the cell's immediate is the message's.
pub(crate) const F_IMM: u16 = 2;
/// IBV_SEND_SOLICITED.
pub(crate) const F_SOLICITED: u16 = 4;
/// No message: a position a post list claimed and did not use (`doorbell::mq_close`).
pub(crate) const F_NOP: u16 = 8;
/// The payload is not in the cell: the first payload word is its fabric offset in the
/// sender's registered memory (checked at post), the second its length (a SEND of more than
/// [`MQ_PAYLOAD_MAX`] bytes, at most [`MQ_REF_MAX`]). The drainer copies it from there, so
/// the copy runs on the receiver's core, as a NIC's DMA runs beside the host's cores; the
/// sender's buffer is in use until its send completion, as with any SEND.
pub(crate) const F_REF: u16 = 16;

const _: () = assert!(MAX_QP <= 1 << TAG_IDX_BITS && TAG_IDX_BITS + 5 <= 16);

/// The tag of a cell: the receiving QP's slot and the flags.
#[inline(always)]
pub(crate) fn tag(dst_idx: usize, flags: u16) -> u16 {
    dst_idx as u16 | flags << TAG_IDX_BITS
}

/// The first metadata word: the sender's QP number and the WQE's index.
#[inline(always)]
pub(crate) fn meta(src_qpn: u32, wqe: u32) -> u64 {
    u64::from(src_qpn) | u64::from(wqe) << 32
}

/// Which SENDs take receiver-side delivery, from `DATAPLANE_SHM_MSGQ` (read once per
/// process): `0` none (CQs get no queue), `all` every small RC SEND, `lists` the SENDs of
/// post lists of two or more WRs and every later one of a QP with queued SENDs in flight
/// (they must not be overtaken), anything else (the default, `Auto`) those and also the
/// lone SENDs of a QP that received nothing since its previous post.
///
/// Why a lone SEND of a QP that receives stays on the sender-side path: a queued message
/// moves the request's take and checks to the receiver's poll, which is the critical path
/// of a ping-pong (`send_lat` 8 B: 0.14 vs 0.17 us). A QP that posts again without having
/// received anything is streaming: there the receiver doing its own half of the work is
/// what raises the rate (`send_bw -l 1`: 1.1-1.3x, docs/shm-provider.md), and a post list
/// pays one claim for all its messages.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Mode {
    Off,
    Lists,
    Auto,
    All,
}

/// The process's [`Mode`] (unit tests set it per thread).
pub(crate) fn mode() -> Mode {
    static MODE: OnceLock<Mode> = OnceLock::new();
    #[cfg(test)]
    if let Some(m) = tests::FORCE.with(|f| f.get()) {
        return m;
    }
    *MODE.get_or_init(|| match std::env::var("DATAPLANE_SHM_MSGQ").as_deref() {
        Ok("0") => Mode::Off,
        Ok("all") => Mode::All,
        Ok("lists") => Mode::Lists,
        _ => Mode::Auto,
    })
}

/// The sender of a queued message as its drainer needs it: identity and send CQ.
struct TxView {
    qpn: u32,
    idx: usize,
    lid: u16,
    cq: Option<CqRing>,
    cqn: u32,
    channel: bool,
    head: u64,
}

/// What a drainer keeps between messages: the last receiving QP and sender it resolved, the
/// receive request being taken, and the run of requests it holds. Each use re-checks the
/// slot's key (one load).
#[derive(Default)]
pub(crate) struct DrainCache {
    rx: Option<DestView>,
    tx: Option<TxView>,
    entry: RecvEntry,
    /// The next request of the held run (a position in `rx`'s receive queue).
    held: u64,
    /// Requests of the run still held: the next `held_left` messages of the queue are the
    /// run's (`take`), and no drainer stops before they are delivered.
    held_left: u64,
    /// A message of the run failed in its receive request and moved the run's QP (slot,
    /// number) to ERROR: the rest of the run is flushed, then the QP's receive queue
    /// (`general`, `flush_held`).
    flush_after_run: Option<(usize, u32)>,
    /// The receive MR the run's first message was placed with, and its lkey: the run's
    /// other messages whose request names that lkey skip its lookup (their bounds are
    /// checked each). Set by the first message of each run.
    run_mr: Option<(u32, MrView)>,
}

/// Where a message's receive completion went.
pub(crate) enum Got {
    /// Into the caller's `out`.
    Wc,
    /// Into the CQ's ring (the general delivery wrote it), or nowhere (the message was
    /// dropped: its receiving QP is gone or not receiving).
    Ring,
}

impl DrainCache {
    /// Whether this drainer holds receive requests for the next messages of its queue: it
    /// must deliver them (`take`) before it lets the queue go.
    #[inline(always)]
    pub(crate) fn holds_run(&self) -> bool {
        self.held_left != 0
    }

    /// The queue ran out of messages while this drainer held a run's requests. Its messages
    /// were written when the run was claimed, and cells stay as they are until the burst's
    /// `head` is published, so only a peer scribbling on the queue's sequence words causes
    /// this. The held requests complete with GENERAL_ERR, in order, into their CQ's ring,
    /// and the run ends: holding them would give them to the next messages, which may be
    /// another QP's.
    #[cold]
    #[inline(never)]
    pub(crate) fn abandon_run(&mut self, f: &Fabric) {
        let left = std::mem::take(&mut self.held_left);
        let Some(d) = self.rx.clone() else { return };
        let Some(rq) = d.rq else { return };
        let cq = cq_ring(f, d.cqn);
        let mut cq_head = 0;
        for i in 0..left {
            let pos = self.held.wrapping_add(i);
            rq.read_held(pos, &mut self.entry);
            rq.release(pos);
            if let Some(cq) = &cq {
                push_recv_status(f, cq, &mut cq_head, d.cqn, d.qpn, self.entry.wr_id, WcStatus::GeneralErr);
            }
        }
        self.end_run(f);
    }

    /// After a run's last request: the flush of its QP's receive queue that a failure in
    /// the run deferred (`general`), if any.
    fn end_run(&mut self, f: &Fabric) {
        if let Some((idx, qpn)) = self.flush_after_run.take() {
            after_error(f, idx, qpn);
        }
    }

    fn tx(&mut self, f: &Fabric, qpn: u32) -> Option<&mut TxView> {
        let idx = key_index(qpn, QP_IDX_BITS);
        let hit = self.tx.as_ref().is_some_and(|t| t.qpn == qpn && f.qp_slot(t.idx).qpn.load(Ordering::Acquire) == qpn);
        if !hit {
            self.tx = resolve_tx(f, qpn, idx);
        }
        self.tx.as_mut()
    }
}

#[cold]
#[inline(never)]
fn resolve_tx(f: &Fabric, qpn: u32, idx: usize) -> Option<TxView> {
    if idx >= MAX_QP {
        return None;
    }
    let s = f.qp_slot(idx);
    if s.qpn.load(Ordering::Acquire) != qpn {
        return None;
    }
    let cqn = s.send_cqn.load(Ordering::Relaxed);
    Some(TxView {
        qpn,
        idx,
        lid: s.lid.load(Ordering::Relaxed) as u16,
        cq: cq_ring(f, cqn),
        cqn,
        channel: has_channel(f, cqn),
        head: 0,
    })
}

/// The sender's completion of a queued message: `status`, retiring WQE `wqe`.
#[inline]
fn complete_send(f: &Fabric, t: &mut TxView, wr_id: u64, wqe: u32, status: WcStatus) {
    let Some(cq) = &t.cq else { return };
    let cqe = Cqe {
        wc: WorkCompletion { wr_id, status, opcode: WcOpcode::Send, qp_num: t.qpn, ..Default::default() },
        retire: Some(wqe),
        solicited: false,
    };
    push_cqe_to(f, cq, &mut t.head, t.cqn, t.channel, &cqe);
}

/// A queued message's cell decoded once (its layout: [`meta`], `wr_id`, payload; [`tag`]): who
/// sent it, for which QP slot, with which flags, and the payload words it carries.
struct Msg {
    /// Its position in the queue (the cold paths read the cell again from it: `cold`).
    at: u64,
    /// The sender's QP number.
    src_qpn: u32,
    /// The sender's WQE index (retired by its send completion).
    wqe: u32,
    /// The sender's `wr_id`.
    wr_id: u64,
    /// The receiving QP's slot index.
    idx: usize,
    /// `F_*` flags.
    flags: u16,
    /// Payload length in bytes (at most [`MQ_PAYLOAD_MAX`], or [`MQ_REF_MAX`] with
    /// [`F_REF`]).
    len: usize,
    /// With [`F_REF`]: the payload's fabric offset.
    src_off: u64,
    /// Immediate data (meaningful with `F_IMM`).
    imm: u32,
    /// The cell's words (payload after the [`META_WORDS`]), by value: held by reference,
    /// the message was built on the stack for every delivery (session 57).
    words: [u64; PAYLOAD_WORDS],
}

impl Msg {
    /// Decodes a cell known to carry its payload (`REF` false: the [`F_REF`] flag is not
    /// looked at) or that may not.
    #[inline(always)]
    fn decode_as<const REF: bool>(m: Delivered) -> Msg {
        let flags = m.tag >> TAG_IDX_BITS;
        // A peer's words: a length by reference is cut to what a sender may queue.
        let (len, src_off) = if REF && flags & F_REF != 0 {
            ((m.words[META_WORDS + 1] as usize).min(MQ_REF_MAX), m.words[META_WORDS])
        } else {
            ((m.len as usize).saturating_sub(META_WORDS * 8).min(MQ_PAYLOAD_MAX), 0)
        };
        Msg {
            at: m.pos,
            src_qpn: m.words[0] as u32,
            wqe: (m.words[0] >> 32) as u32,
            wr_id: m.words[1],
            idx: (m.tag & ((1 << TAG_IDX_BITS) - 1)) as usize,
            flags,
            len,
            src_off,
            imm: m.imm,
            words: m.words,
        }
    }

    /// With [`F_REF`], the payload in the fabric: `None` if the range is not inside the
    /// arena (a corrupt or hostile cell); `Some(None)` for a payload in the cell.
    #[inline(always)]
    fn by_ref(&self, f: &Fabric) -> Option<Option<*mut u8>> {
        if self.flags & F_REF == 0 {
            return Some(None);
        }
        f.ptr(self.src_off, self.len as u64).map(Some)
    }
}

/// Delivers queued message `m` of CQ `cqn`'s queue (`dr`'s, just polled): takes the
/// receiving QP's request, places the bytes, writes the receive completion into `out` (or,
/// when anything is not the common case, lets the general delivery write it into the ring)
/// and the sender's completion into its send CQ.
///
/// `room`: how many of the queue's next messages, this one included, the caller will
/// certainly hand to `take` before it lets the queue go (the completions it has room for;
/// with fewer than 2 no run is claimed). When the messages after `m` go to the same QP from
/// the same sender, `m`'s request and theirs are claimed with one CAS (a run, [`recvq::pop_run`]);
/// while [`DrainCache::holds_run`], the caller must go on calling `take` for the next
/// messages (and, after a [`Got::Ring`], push the completions of the rest of the run to the
/// ring, in order, as [`help`] does).
#[inline(always)]
pub(crate) fn take(
    f: &Fabric,
    cqn: u32,
    c: &mut DrainCache,
    dr: &Drain,
    room: usize,
    m: Delivered,
    out: &mut WorkCompletion,
) -> Got {
    if c.held_left != 0 {
        return take_held(f, cqn, c, dr, m, out);
    }
    // A payload in the cell is the loop's common case; the others (a NOP, a payload by
    // reference) go out of line, where their extra words cost the small messages nothing
    // (inlined together, the drain counted +19 instructions per 8-byte message).
    if (m.tag >> TAG_IDX_BITS) & (F_NOP | F_REF) != 0 {
        return take_other(f, cqn, c, dr, m.pos, out);
    }
    take_as::<false>(f, cqn, c, dr, room, m, out)
}

/// [`take`] for a NOP or a payload by reference: the message at `pos`, which `dr` took
/// (read again here: passed by value it was stored on the stack on every delivery).
#[inline(never)]
fn take_other(f: &Fabric, cqn: u32, c: &mut DrainCache, dr: &Drain, pos: u64, out: &mut WorkCompletion) -> Got {
    let m = dr.reread(pos);
    if (m.tag >> TAG_IDX_BITS) & F_NOP != 0 {
        return Got::Ring;
    }
    take_as::<true>(f, cqn, c, dr, 1, m, out)
}

/// How many receive requests to claim for message `m` (its run, [`take`]): 1 and the
/// messages after it, at most `room - 1`, that [`take_held`] can deliver with what was
/// checked for `m`: to the same QP slot, from the same sender, with their payload in the
/// cell (no NOP, no reference, which take other paths).
#[inline(always)]
fn run_len(dr: &Drain, room: usize, m: &Msg) -> u64 {
    if room < 2 {
        return 1;
    }
    let (idx, src) = (m.idx as u16, m.src_qpn);
    1 + dr.peek_run(room as u64 - 1, |tag, w0| {
        tag & ((1 << TAG_IDX_BITS) - 1) == idx && (tag >> TAG_IDX_BITS) & (F_NOP | F_REF) == 0 && w0 as u32 == src
    })
}

/// A message of the run this drainer holds ([`take`]): its checks were the first message's
/// (the receiving QP, its state and CQ, its sender), made before the run's claim; it is
/// delivered into the next held request, as one that was already on its way when the QP
/// changed would be.
#[inline(always)]
fn take_held(f: &Fabric, cqn: u32, c: &mut DrainCache, dr: &Drain, m: Delivered, out: &mut WorkCompletion) -> Got {
    let m = Msg::decode_as::<false>(m);
    let pos = c.held;
    c.held = pos.wrapping_add(1);
    c.held_left -= 1;
    // `run_len` and the claim left `rx` as the run's QP, with a receive queue.
    let Some((d, rq)) = c.rx.as_ref().and_then(|d| Some((d, d.rq.as_ref()?))) else { return Got::Ring };
    rq.read_held(pos, &mut c.entry);
    if c.flush_after_run.is_some() {
        rq.release(pos);
        return cold(f, cqn, c, dr, m.at, Cold::FlushHeld);
    }
    if !place(f, d.pd, rq, pos, &c.entry, &m, None, &mut c.run_mr) {
        return cold(f, cqn, c, dr, m.at, Cold::General);
    }
    let rx_qpn = d.qpn;
    complete(f, c, rx_qpn, &m, out)
}

/// A message of a run after one whose receive request failed (`general`): its QP is in
/// ERROR, so its request (`c.entry`, released) completes with a flush error and the sender's
/// WQE fails as one sent to a responder in error ([`take_cold`]'s). After the run's last, the
/// rest of the QP's receive queue is flushed: the receive completions stay in request order,
/// which flushing the queue at the failure (it starts after the run) would have broken.
#[cold]
#[inline(never)]
fn flush_held(f: &Fabric, c: &mut DrainCache, m: &Msg) -> Got {
    if let Some(d) = &c.rx {
        if let Some(cq) = cq_ring(f, d.cqn) {
            push_recv_status(f, &cq, &mut 0, d.cqn, d.qpn, c.entry.wr_id, WcStatus::WrFlushErr);
        }
    }
    fail_sender(f, c, m, None);
    if c.held_left == 0 {
        c.end_run(f);
    }
    Got::Ring
}

/// Places `m`'s payload (`src`, or the cell's words) into the request `entry` taken at `pos`
/// of `rq` and releases it; false (released too) when the request is not the common case:
/// not one SGE that holds the message in PD `pd` (the general delivery decides). `run_mr`:
/// the MR a message before it in the same run passed the checks with (`DrainCache::run_mr`).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn place(
    f: &Fabric,
    pd: u32,
    rq: &RecvRing,
    pos: u64,
    entry: &RecvEntry,
    m: &Msg,
    src: Option<*mut u8>,
    run_mr: &mut Option<(u32, MrView)>,
) -> bool {
    let dst = if entry.n == 1 { recv_dst_in(f, pd, &entry.sges[0], m.len, run_mr) } else { None };
    let Some(dst) = dst else {
        rq.release(pos);
        return false;
    };
    match src {
        // The sender checked `src` against its MR for `len` bytes (and `by_ref` against the
        // arena), `recv_dst` checked `dst` against the receive MR.
        Some(src) => copy_translated(src, dst, m.len),
        None => {
            let w = &m.words;
            write_translated_payload(
                dst,
                [w[META_WORDS], w[META_WORDS + 1], w[META_WORDS + 2], w[META_WORDS + 3]],
                m.len,
            )
        }
    }
    rq.release(pos);
    true
}

/// The completions of a placed message: the receive one into `out`, the sender's (if it
/// asked) into its send CQ.
#[inline(always)]
fn complete(f: &Fabric, c: &mut DrainCache, rx_qpn: u32, m: &Msg, out: &mut WorkCompletion) -> Got {
    let imm = m.flags & F_IMM != 0;
    let (src_qpn, len, wr_id) = (m.src_qpn, m.len, c.entry.wr_id);
    let Some(t) = c.tx(f, src_qpn) else {
        // The sender is gone: its message still arrives, as one already on the wire would.
        *out = recv_wc(wr_id, len, imm, m.imm, rx_qpn, src_qpn, 0);
        return Got::Wc;
    };
    *out = recv_wc(wr_id, len, imm, m.imm, rx_qpn, src_qpn, t.lid);
    if m.flags & F_SIGNALED != 0 {
        complete_send(f, t, m.wr_id, m.wqe, WcStatus::Success);
    }
    Got::Wc
}

/// The delivery of [`take`]; `REF`: the payload may be by reference ([`F_REF`]), and no run
/// is claimed; `dr`: the burst that took `m` (a run is sized from it).
#[inline(always)]
fn take_as<const REF: bool>(
    f: &Fabric,
    cqn: u32,
    c: &mut DrainCache,
    dr: &Drain,
    room: usize,
    m: Delivered,
    out: &mut WorkCompletion,
) -> Got {
    let m = Msg::decode_as::<REF>(m);
    let (src_qpn, idx) = (m.src_qpn, m.idx);
    let src = if REF {
        match m.by_ref(f) {
            Some(src) => src,
            None => return cold(f, cqn, c, dr, m.at, Cold::BadRef),
        }
    } else {
        None
    };
    // The cached receiving QP, if the cell names it and its slot still holds it (one load).
    let hit = c.rx.as_ref().is_some_and(|d| d.idx == idx && f.qp_slot(idx).qpn.load(Ordering::Acquire) == d.qpn);
    let d = if hit {
        c.rx.as_ref()
    } else {
        let qpn = f.qp_slot(idx.min(MAX_QP - 1)).qpn.load(Ordering::Acquire);
        dest(f, &mut c.rx, qpn)
    };
    let Some(d) = d else { return cold(f, cqn, c, dr, m.at, Cold::Take) };
    let s = f.qp_slot(d.idx);
    let receives = QpState::from_u8(s.state.load(Ordering::Acquire) as u8).is_some_and(QpState::receives);
    // By reference: the ring view is several words, and a copy per message showed in
    // instruction profiles.
    let Some(rq) = d.rq.as_ref().filter(|_| receives && d.cqn == cqn && s.dest_qpn.load(Ordering::Relaxed) == src_qpn)
    else {
        return cold(f, cqn, c, dr, m.at, Cold::Take);
    };
    let pos = if !REF {
        let Some((pos, k)) = recvq::pop_run(rq, run_len(dr, room, &m), &mut c.entry) else {
            return cold(f, cqn, c, dr, m.at, Cold::Take);
        };
        c.held = pos.wrapping_add(1);
        c.held_left = k - 1;
        pos
    } else {
        match recvq::pop_held(rq, &mut c.entry) {
            Some(pos) => pos,
            None => return cold(f, cqn, c, dr, m.at, Cold::Take),
        }
    };
    // A new run (or a lone message): its receive MR is looked up afresh.
    c.run_mr = None;
    if !place(f, d.pd, rq, pos, &c.entry, &m, src, &mut c.run_mr) {
        return cold(f, cqn, c, dr, m.at, Cold::General);
    }
    let rx_qpn = d.qpn;
    complete(f, c, rx_qpn, &m, out)
}

#[inline(always)]
fn recv_wc(wr_id: u64, len: usize, imm: bool, imm_data: u32, qpn: u32, src_qp: u32, slid: u16) -> WorkCompletion {
    WorkCompletion {
        wr_id,
        opcode: WcOpcode::Recv,
        byte_len: len as u32,
        imm_data: if imm { imm_data } else { 0 },
        wc_flags: if imm { WcFlags::WITH_IMM } else { WcFlags::empty() },
        qp_num: qpn,
        src_qp,
        slid,
        ..Default::default()
    }
}

/// The payload words of a cell as bytes (native order: the sender filled them the same way).
#[inline(always)]
fn payload_bytes(words: &[u64; PAYLOAD_WORDS]) -> [u8; MQ_PAYLOAD_MAX] {
    let mut b = [0u8; MQ_PAYLOAD_MAX];
    for (o, w) in b.chunks_exact_mut(8).zip(&words[META_WORDS..]) {
        o.copy_from_slice(&w.to_ne_bytes());
    }
    b
}

/// How long a drainer waits for a reserved receive request whose cell its poster has claimed
/// but not yet published (a few instructions, unless the poster was descheduled).
const REQUEST_PATIENCE: Duration = Duration::from_millis(100);

/// Which cold path [`cold`] takes a message to.
#[derive(Clone, Copy)]
enum Cold {
    /// [`take_cold`]: no request taken (the general delivery decides: RNR, a drop, an
    /// error).
    Take,
    /// [`general`]: a request taken that the fast placement does not handle.
    General,
    /// [`bad_ref`]: a payload by reference outside the arena.
    BadRef,
    /// [`flush_held`]: a held request of a run after a failed one.
    FlushHeld,
}

/// The entry of the drain's cold paths: the message at queue position `at`, which burst `dr`
/// took, decoded again from its cell (unchanged until `head` is published). The fast path
/// hands over the position, not the decoded message: a message whose address a call that is
/// not inlined takes lives in memory, and was stored there on every delivery (13 stores,
/// session 57). Decoded as one that may be by reference (`F_REF`), which reads every other
/// message as the fast path did.
#[cold]
#[inline(never)]
fn cold(f: &Fabric, cqn: u32, c: &mut DrainCache, dr: &Drain, at: u64, path: Cold) -> Got {
    let m = Msg::decode_as::<true>(dr.reread(at));
    match path {
        Cold::Take => take_cold(f, cqn, c, &m),
        Cold::General => general(f, c, &m),
        Cold::BadRef => bad_ref(f, c, &m),
        Cold::FlushHeld => flush_held(f, c, &m),
    }
}

/// Everything but the common case: the receiving QP gone, not receiving or not connected
/// to the sender; its request not yet published, or not one SGE that holds the message.
#[cold]
#[inline(never)]
fn take_cold(f: &Fabric, cqn: u32, c: &mut DrainCache, m: &Msg) -> Got {
    let src_qpn = m.src_qpn;
    let qpn = f.qp_slot(m.idx.min(MAX_QP - 1)).qpn.load(Ordering::Acquire);
    let d = dest(f, &mut c.rx, qpn).filter(|d| d.cqn == cqn && d.rq.is_some()).cloned();
    let s = d.as_ref().map(|d| f.qp_slot(d.idx));
    let ready = s.is_some_and(|s| {
        QpState::from_u8(s.state.load(Ordering::Acquire) as u8).is_some_and(QpState::receives)
            && s.dest_qpn.load(Ordering::Relaxed) == src_qpn
    });
    let (Some(d), true) = (d, ready) else {
        // Nobody answers: as a requester whose responder is gone or in error, the sender's
        // QP ends in RETRY_EXC_ERR and ERROR, unless it is in ERROR already (its later
        // WQEs flush).
        fail_sender(f, c, m, None);
        return Got::Ring;
    };
    let Some(rq) = d.rq else { return Got::Ring };
    let deadline = Instant::now() + REQUEST_PATIENCE;
    let pos = loop {
        if let Some(p) = recvq::pop_held(&rq, &mut c.entry) {
            break Some(p);
        }
        if Instant::now() >= deadline {
            break None;
        }
        std::hint::spin_loop();
    };
    match pos {
        Some(p) => {
            rq.release(p);
            general(f, c, m)
        }
        None => {
            // The reserved request never appeared: the queue is corrupt (a scribbled ring).
            let status = responder_failed(f, &d, true, WcStatus::RemOpErr);
            fail_sender(f, c, m, Some(status));
            Got::Ring
        }
    }
}

/// The request in `c.entry` (taken) is not the common case: the general delivery checks it,
/// places the message or writes the error completions, into the CQ's ring.
#[cold]
#[inline(never)]
fn general(f: &Fabric, c: &mut DrainCache, m: &Msg) -> Got {
    let (src_qpn, flags, len) = (m.src_qpn, m.flags, m.len);
    let Some(d) = c.rx.clone() else { return Got::Ring };
    let lid = c.tx(f, src_qpn).map_or(0, |t| t.lid);
    let wr = if flags & F_IMM != 0 { SendWr::send_with_imm(m.wr_id, m.imm) } else { SendWr::send(m.wr_id) };
    let wr = wr.flags(if flags & F_SOLICITED != 0 { SendFlags::SOLICITED } else { SendFlags::empty() });
    let mut payload = payload_bytes(&m.words);
    let src = match m.by_ref(f) {
        Some(Some(p)) => [Seg { ptr: p, len }],
        Some(None) => [Seg { ptr: payload.as_mut_ptr(), len }],
        None => return bad_ref(f, c, m),
    };
    let sender = Sender { qp_type: QpType::Rc, qpn: src_qpn, lid };
    let status = match place_taken(f, sender, &c.entry, &d, Incoming::sent(&wr, &src, len as u64), None) {
        Ok(()) => WcStatus::Success,
        // More of the QP's requests are held (a run): they are flushed first, then its
        // queue (`flush_held`).
        Err(remote) if c.held_left != 0 => {
            if mark_error(f, d.idx, d.qpn) {
                c.flush_after_run = Some((d.idx, d.qpn));
            }
            remote
        }
        Err(remote) => responder_failed(f, &d, true, remote),
    };
    if status == WcStatus::Success {
        if flags & F_SIGNALED != 0 {
            if let Some(t) = c.tx(f, src_qpn) {
                complete_send(f, t, m.wr_id, m.wqe, WcStatus::Success);
            }
        }
    } else {
        fail_sender(f, c, m, Some(status));
    }
    Got::Ring
}

/// A cell by reference whose range is not inside the arena (a corrupt or hostile sender):
/// nothing is delivered and no receive request is used; the sender's WQE fails as one whose
/// responder found the request invalid.
#[cold]
#[inline(never)]
fn bad_ref(f: &Fabric, c: &mut DrainCache, m: &Msg) -> Got {
    fail_sender(f, c, m, Some(WcStatus::RemInvReqErr));
    Got::Ring
}

/// The sender's WQE of message `m` failed with `status` (`None`: its responder did not
/// answer): an error completion, whether signaled or not, and its QP to ERROR. A sender
/// already in ERROR gets a flush instead: its later WQEs after the first error.
#[cold]
fn fail_sender(f: &Fabric, c: &mut DrainCache, m: &Msg, status: Option<WcStatus>) {
    let Some(t) = c.tx(f, m.src_qpn) else { return };
    let in_error = f.qp_slot(t.idx).state.load(Ordering::Acquire) == QpState::Error as u32;
    let status = if in_error { WcStatus::WrFlushErr } else { status.unwrap_or(WcStatus::RetryExcErr) };
    complete_send(f, t, m.wr_id, m.wqe, status);
    if !in_error {
        to_error(f, t.idx, t.qpn);
    }
}

/// Drains CQ `cqn`'s queue `q` for a receiver that is not polling it now, if no one else is
/// draining: every message's receive completion goes into the CQ's ring, after whatever is
/// there. Senders call it (a send CQ's poll that found nothing, a WQE waiting for its
/// queued predecessors, a full queue). Returns whether it drained anything.
#[cold]
#[inline(never)]
pub(crate) fn help(f: &Fabric, q: &MsgQueue, cqn: u32) -> bool {
    if !q.ready() {
        return false;
    }
    let Some(mut dr) = q.try_drain() else { return false };
    let Some(ring) = cq_ring(f, cqn) else { return false };
    take_into_ring(f, cqn, &mut DrainCache::default(), &mut dr, Some(&ring), false)
}

/// Takes `dr`'s messages with [`take`] and pushes their completions into CQ `cqn`'s `ring`,
/// in order: all of them, or with `run_only` those of the run `c` holds. A run the queue
/// cannot finish is abandoned ([`DrainCache::abandon_run`]). With no `ring` (a CQ being
/// destroyed) the messages are still consumed. Returns whether it took any message.
pub(crate) fn take_into_ring(
    f: &Fabric,
    cqn: u32,
    c: &mut DrainCache,
    dr: &mut Drain,
    ring: Option<&CqRing>,
    run_only: bool,
) -> bool {
    let channel = has_channel(f, cqn);
    let mut head = 0;
    let mut any = false;
    while !run_only || c.holds_run() {
        let Some(m) = dr.poll() else {
            if c.holds_run() {
                c.abandon_run(f);
            }
            break;
        };
        any = true;
        let mut wc = WorkCompletion::default();
        // Every message goes into the ring, in order: any run will do.
        if let (Got::Wc, Some(ring)) = (take(f, cqn, c, dr, usize::MAX, m, &mut wc), ring) {
            push_cqe_to(f, ring, &mut head, cqn, channel, &Cqe { wc, retire: None, solicited: false });
        }
    }
    any
}

#[cfg(test)]
pub(crate) mod tests {
    use crate::shm::{unit_context, ShmCq, ShmQp};
    use crate::verbs::*;
    use crate::{Context, Cq, Mr, Pd, Qp, QpInitAttr};

    thread_local! {
        /// The [`super::Mode`] of CQs and QPs this thread creates (`None`: the process's).
        pub(crate) static FORCE: std::cell::Cell<Option<super::Mode>> = const { std::cell::Cell::new(None) };
    }

    /// Polls `cq` until it yields one completion (at most `tries` polls).
    fn poll_one(cq: &mut ShmCq, tries: u32) -> Option<WorkCompletion> {
        let mut wc = [WorkCompletion::default(); 1];
        for _ in 0..tries {
            if cq.poll(&mut wc).unwrap() == 1 {
                return Some(wc[0]);
            }
        }
        None
    }

    /// An RC pair A -> B with queues on: A's send CQ `sa`, B's receive CQ `rb`, and one
    /// 4 KiB MR.
    struct Pair {
        _ctx: crate::shm::ShmContext,
        a: ShmQp,
        b: ShmQp,
        sa: ShmCq,
        ra: ShmCq,
        rb: ShmCq,
        mr: crate::shm::ShmMr,
        /// The PD and region of `mr`, for a test's other MRs.
        pd: crate::shm::ShmPd,
        region: <crate::shm::Shm as crate::provider::Provider>::Region,
    }

    fn pair(name: &str) -> Pair {
        pair_in(name, super::Mode::All)
    }

    /// [`pair`] with its CQs and QPs in `mode`.
    fn pair_in(name: &str, mode: super::Mode) -> Pair {
        pair_with(name, mode, false)
    }

    /// [`pair_in`]; `shared`: A sends into B's receive CQ `rb` (`sa` unused), so one CQ
    /// gets both completions of each message.
    fn pair_with(name: &str, mode: super::Mode, shared: bool) -> Pair {
        FORCE.with(|f| f.set(Some(mode)));
        let ctx = unit_context(name);
        let pd = ctx.alloc_pd().unwrap();
        let (sa, ra, sb, rb) = (
            ctx.create_cq(64).unwrap(),
            ctx.create_cq(64).unwrap(),
            ctx.create_cq(64).unwrap(),
            ctx.create_cq(64).unwrap(),
        );
        let region = ctx.alloc_region(4096).unwrap();
        let mr = pd.reg_mr(&region, 0, 4096, AccessFlags::LOCAL_WRITE).unwrap();
        let attr = |s, r| QpInitAttr {
            send_cq: s,
            recv_cq: r,
            srq: None,
            cap: QpCaps::default(),
            qp_type: QpType::Rc,
            sq_sig_all: false,
        };
        let (mut a, mut b): (ShmQp, ShmQp) =
            (pd.create_qp(&attr(if shared { &rb } else { &sa }, &ra)).unwrap(), pd.create_qp(&attr(&sb, &rb)).unwrap());
        let (na, nb) = (a.qp_num(), b.qp_num());
        for (q, dest) in [(&mut a, nb), (&mut b, na)] {
            crate::shm::unit_connect(q, dest, AccessFlags::empty());
        }
        FORCE.with(|f| f.set(None));
        Pair { _ctx: ctx, a, b, sa, ra, rb, mr, pd, region }
    }

    /// `Mode::Auto`: a QP that posts again without having received anything streams, and
    /// its lone SEND takes the queue; its first one, with nothing to compare, does not.
    #[test]
    fn auto_queues_the_lone_sends_of_a_streaming_qp() {
        let mut p = pair_in("mq-auto-stream", super::Mode::Auto);
        let q = p.rb.shared.mq.expect("the receive CQ has a queue");
        for i in 0..3 {
            p.b.post_recv(&RecvChain::one(i, &[Sge::new(p.mr.addr() + 1024 + i * 64, 64, p.mr.lkey())])).unwrap();
        }
        let send = |p: &mut Pair, id| {
            p.a.post_send(&SendChain::one(SendWr::send(id).signaled(), &[Sge::new(p.mr.addr(), 8, p.mr.lkey())]))
                .unwrap()
        };
        send(&mut p, 10);
        assert!(!q.ready() && p.rb.len() == 1, "the first lone SEND is delivered by its sender");
        send(&mut p, 11);
        assert!(q.ready(), "the second, with nothing received in between, is queued");
        send(&mut p, 12);
        let ids: Vec<u64> = (0..3).filter_map(|_| poll_one(&mut p.rb, 10)).map(|w| w.wr_id).collect();
        assert_eq!(ids, [0, 1, 2], "receive completions in posting order");
        let sent: Vec<u64> = (0..3).filter_map(|_| poll_one(&mut p.sa, 10)).map(|w| w.wr_id).collect();
        assert_eq!(sent, [10, 11, 12], "send completions in posting order");
    }

    /// `Mode::Auto`: a QP that received since its previous post answers (a ping-pong), and
    /// its lone SEND keeps the sender-side path, whose receiver's poll is short.
    #[test]
    fn auto_keeps_the_sender_side_path_for_a_qp_that_receives() {
        let mut p = pair_in("mq-auto-answer", super::Mode::Auto);
        let q = p.rb.shared.mq.expect("the receive CQ has a queue");
        let sge = |p: &Pair, at| Sge::new(p.mr.addr() + at, 64, p.mr.lkey());
        for i in 0..2 {
            p.b.post_recv(&RecvChain::one(i, &[sge(&p, 1024 + i * 64)])).unwrap();
        }
        p.a.post_recv(&RecvChain::one(50, &[sge(&p, 2048)])).unwrap();
        p.a.post_send(&SendChain::one(SendWr::send(10), &[Sge::new(p.mr.addr(), 8, p.mr.lkey())])).unwrap();
        assert_eq!(poll_one(&mut p.rb, 10).map(|w| w.wr_id), Some(0));
        // B answers; A's poll of its receive CQ finds the answer before A posts again.
        p.b.post_send(&SendChain::one(SendWr::send(20), &[Sge::new(p.mr.addr(), 8, p.mr.lkey())])).unwrap();
        assert_eq!(poll_one(&mut p.ra, 10).map(|w| w.wr_id), Some(50));
        p.a.post_send(&SendChain::one(SendWr::send(11), &[Sge::new(p.mr.addr(), 8, p.mr.lkey())])).unwrap();
        assert!(!q.ready() && p.rb.len() == 1, "the answer's SEND was delivered by its sender");
        assert_eq!(poll_one(&mut p.rb, 10).map(|w| w.wr_id), Some(1));
    }

    fn write_bytes(mr: &crate::shm::ShmMr, at: u64, bytes: &[u8]) {
        // SAFETY: `at + bytes.len()` lies inside the 4 KiB MR this test owns; nothing else
        // touches those bytes now.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), (mr.addr() + at) as *mut u8, bytes.len()) }
    }

    fn read_bytes(mr: &crate::shm::ShmMr, at: u64, n: usize) -> Vec<u8> {
        // SAFETY: as in `write_bytes`.
        unsafe { std::slice::from_raw_parts((mr.addr() + at) as *const u8, n).to_vec() }
    }

    /// A small SEND travels as a cell of B's receive CQ's queue, not as a CQE in its ring,
    /// and B's poll delivers it: bytes, immediate, ids; A's completion comes after.
    #[test]
    fn a_small_send_is_queued_and_delivered_by_the_receivers_poll() {
        let mut p = pair("mq-basic");
        let q = p.rb.shared.mq.expect("the receive CQ has a queue");
        p.b.post_recv(&RecvChain::one(77, &[Sge::new(p.mr.addr() + 1024, 64, p.mr.lkey())])).unwrap();
        write_bytes(&p.mr, 0, b"queued, not pushed!");
        let wr = SendWr::send_with_imm(5, 0xfeed).signaled();
        p.a.post_send(&SendChain::one(wr, &[Sge::new(p.mr.addr(), 19, p.mr.lkey())])).unwrap();
        assert!(q.ready(), "the message waits in the queue");
        assert_eq!(p.rb.len(), 0, "nothing was pushed into the ring");
        let wc = poll_one(&mut p.rb, 10).expect("the receiver's poll delivers it");
        assert_eq!((wc.wr_id, wc.status, wc.byte_len, wc.imm_data), (77, WcStatus::Success, 19, 0xfeed));
        assert!(wc.wc_flags.contains(WcFlags::WITH_IMM));
        assert_eq!((wc.qp_num, wc.src_qp), (p.b.qp_num(), p.a.qp_num()));
        assert_eq!(read_bytes(&p.mr, 1024, 19), b"queued, not pushed!");
        let sc = poll_one(&mut p.sa, 10).expect("the drainer completed the send");
        assert_eq!((sc.wr_id, sc.status, sc.opcode, sc.qp_num), (5, WcStatus::Success, WcOpcode::Send, p.a.qp_num()));
        assert_eq!(q.acked(), 1);
    }

    /// More lone SENDs queued than the receive CQ's queue has cells (64), with the receiver
    /// not polling: a sender whose claimed cell still holds the previous lap's message
    /// drains the queue itself (into the receiver's ring) and then writes it. Every message
    /// arrives once, in order, with its own bytes.
    #[test]
    fn a_sender_finding_its_cell_busy_drains_the_queue_and_writes() {
        let mut p = pair("mq-full");
        let q = p.rb.shared.mq.expect("the receive CQ has a queue");
        let n = 96u64;
        for i in 0..n {
            p.b.post_recv(&RecvChain::one(i, &[Sge::new(p.mr.addr() + 1024 + i * 16, 16, p.mr.lkey())])).unwrap();
            write_bytes(&p.mr, i * 8, &(0x5eed_0000_0000_0000 | i).to_ne_bytes());
        }
        for i in 0..n {
            let wr = if i + 1 == n { SendWr::send(1000 + i).signaled() } else { SendWr::send(1000 + i) };
            p.a.post_send(&SendChain::one(wr, &[Sge::new(p.mr.addr() + i * 8, 8, p.mr.lkey())])).unwrap();
        }
        assert_eq!(p.rb.len(), 64, "the first lap was drained into the ring by the sender");
        assert!(q.ready(), "the rest waits in the queue");
        for i in 0..n {
            let wc = poll_one(&mut p.rb, 10).unwrap_or_else(|| panic!("receive completion {i}"));
            assert_eq!((wc.wr_id, wc.status, wc.byte_len), (i, WcStatus::Success, 8), "message {i}");
            let got = read_bytes(&p.mr, 1024 + i * 16, 8);
            assert_eq!(got, (0x5eed_0000_0000_0000 | i).to_ne_bytes(), "bytes of message {i}");
        }
        assert!(poll_one(&mut p.rb, 10).is_none(), "no message twice");
        let sc = poll_one(&mut p.sa, 10).expect("the signaled last SEND completes");
        assert_eq!((sc.wr_id, sc.status), (1000 + n - 1, WcStatus::Success));
    }

    /// [`a_sender_finding_its_cell_busy_drains_the_queue_and_writes`] with SENDs longer than
    /// a cell holds (40 bytes, by reference: `F_REF`): the busy cell's wait rebuilds the
    /// cell's words from the WR (`doorbell::mq_write_waiting`), and each message still
    /// arrives once, in order, with its own bytes. The send buffers overlap (message `i` is
    /// bytes `8i..8i + 40` of a pattern), so that 72 of them fit the test's MR.
    #[test]
    fn a_sender_finding_its_cell_busy_writes_a_send_by_reference() {
        let mut p = pair("mq-full-ref");
        let (n, len) = (72u64, 40usize);
        let pattern: Vec<u8> =
            (0..(n as usize * 8 + len)).map(|k| (k as u8).wrapping_mul(29).wrapping_add(3)).collect();
        write_bytes(&p.mr, 0, &pattern);
        for i in 0..n {
            let at = p.mr.addr() + 1024 + i * len as u64;
            p.b.post_recv(&RecvChain::one(i, &[Sge::new(at, len as u32, p.mr.lkey())])).unwrap();
        }
        for i in 0..n {
            let wr = if i + 1 == n { SendWr::send(1000 + i).signaled() } else { SendWr::send(1000 + i) };
            p.a.post_send(&SendChain::one(wr, &[Sge::new(p.mr.addr() + i * 8, len as u32, p.mr.lkey())])).unwrap();
        }
        assert_eq!(p.rb.len(), 64, "the first lap was drained into the ring by the sender");
        for i in 0..n {
            let wc = poll_one(&mut p.rb, 10).unwrap_or_else(|| panic!("receive completion {i}"));
            assert_eq!((wc.wr_id, wc.status, wc.byte_len), (i, WcStatus::Success, len as u32), "message {i}");
            let got = read_bytes(&p.mr, 1024 + i * len as u64, len);
            assert_eq!(got, &pattern[i as usize * 8..i as usize * 8 + len], "bytes of message {i}");
        }
        assert!(poll_one(&mut p.rb, 10).is_none(), "no message twice");
        let sc = poll_one(&mut p.sa, 10).expect("the signaled last SEND completes");
        assert_eq!((sc.wr_id, sc.status), (1000 + n - 1, WcStatus::Success));
    }

    /// Single-threaded code that polls only the sender's CQ still gets its completion: the
    /// send CQ's empty polls help drain; the receive completion then waits in B's ring.
    #[test]
    fn polling_only_the_send_cq_drains_for_a_receiver_that_does_not_poll() {
        let mut p = pair("mq-help");
        p.b.post_recv(&RecvChain::one(1, &[Sge::new(p.mr.addr() + 1024, 64, p.mr.lkey())])).unwrap();
        p.a.post_send(&SendChain::one(SendWr::send(9).signaled(), &[Sge::new(p.mr.addr(), 8, p.mr.lkey())])).unwrap();
        let sc = poll_one(&mut p.sa, 10 * super::super::complete::HELP_EVERY).expect("a helping drain ran");
        assert_eq!((sc.wr_id, sc.status), (9, WcStatus::Success));
        assert_eq!(p.rb.len(), 1, "the receive completion went into the ring");
        assert_eq!(poll_one(&mut p.rb, 1).map(|w| w.wr_id), Some(1));
    }

    /// A WR that does not take the queue (an INLINE SEND too long for a cell: its bytes
    /// cannot go by reference) waits for the queued SENDs before it: receive and send
    /// completions keep the posting order.
    #[test]
    fn a_long_send_waits_for_the_queued_ones_before_it() {
        let mut p = pair("mq-order");
        for i in 0..3 {
            let sge = Sge::new(p.mr.addr() + 1024 + i * 256, 256, p.mr.lkey());
            p.b.post_recv(&RecvChain::one(100 + i, &[sge])).unwrap();
        }
        let mut chain = SendChain::new();
        for (i, len) in [(0u64, 8u32), (1, 60), (2, 16)] {
            let wr = if len > 32 { SendWr::send(i).signaled().inline() } else { SendWr::send(i).signaled() };
            chain.push(wr, &[Sge::new(p.mr.addr(), len, p.mr.lkey())]);
        }
        p.a.post_send(&chain).unwrap();
        let mut recv = Vec::new();
        let mut sent = Vec::new();
        for _ in 0..100_000 {
            if let Some(w) = poll_one(&mut p.rb, 1) {
                recv.push((w.wr_id, w.byte_len));
            }
            if let Some(w) = poll_one(&mut p.sa, 1) {
                sent.push(w.wr_id);
            }
            if recv.len() == 3 && sent.len() == 3 {
                break;
            }
        }
        assert_eq!(recv, [(100, 8), (101, 60), (102, 16)]);
        assert_eq!(sent, [0, 1, 2]);
    }

    /// Posts a receive of `room` bytes at offset `buf` of the MR (its first `check` bytes
    /// set to 0xEE), sends the first `len` bytes of `src` (written at offset 0) as one SEND,
    /// and checks that it waited in the queue, then placed exactly its bytes and nothing
    /// after them, with both completions.
    fn queue_and_check(p: &mut Pair, src: &[u8], len: u32, buf: u64, room: u32, check: usize) {
        let q = p.rb.shared.mq.expect("the receive CQ has a queue");
        write_bytes(&p.mr, buf, &vec![0xEE; check]);
        p.b.post_recv(&RecvChain::one(u64::from(len), &[Sge::new(p.mr.addr() + buf, room, p.mr.lkey())])).unwrap();
        let wr = SendWr::send(1000 + u64::from(len)).signaled();
        p.a.post_send(&SendChain::one(wr, &[Sge::new(p.mr.addr(), len, p.mr.lkey())])).unwrap();
        assert!(q.ready(), "length {len}: the message waits in the queue");
        let wc = poll_one(&mut p.rb, 10).expect("the receiver's poll delivers it");
        assert_eq!((wc.wr_id, wc.status, wc.byte_len), (u64::from(len), WcStatus::Success, len));
        let got = read_bytes(&p.mr, buf, check);
        assert_eq!(&got[..len as usize], &src[..len as usize], "length {len}: the message's bytes");
        assert!(got[len as usize..].iter().all(|&b| b == 0xEE), "length {len}: nothing after the message");
        let sc = poll_one(&mut p.sa, 10).expect("the sender's completion");
        assert_eq!((sc.wr_id, sc.status), (1000 + u64::from(len), WcStatus::Success));
    }

    /// Every payload length a cell carries (0 to 32 bytes, in both halves of the inline
    /// copies' size classes) places exactly its bytes: the cell's words after the message
    /// (the sender stores all six) never reach the buffer, whose next byte stays as it was.
    #[test]
    fn queued_sends_of_every_length_place_exactly_their_bytes() {
        let mut p = pair("mq-lengths");
        let src: Vec<u8> = (0..32u8).map(|i| i.wrapping_mul(37).wrapping_add(1)).collect();
        write_bytes(&p.mr, 0, &src);
        for len in 0..=super::MQ_PAYLOAD_MAX as u32 {
            queue_and_check(&mut p, &src, len, 1024, 64, 64);
        }
    }

    /// SENDs longer than a cell go by reference (`F_REF`): the drainer copies exactly their
    /// bytes from the sender's buffer, and nothing after them.
    #[test]
    fn larger_sends_go_by_reference_and_place_exactly_their_bytes() {
        let mut p = pair("mq-ref");
        let src: Vec<u8> = (0..2000u32).map(|i| (i.wrapping_mul(131) % 251) as u8).collect();
        write_bytes(&p.mr, 0, &src);
        for len in [33u32, 40, 63, 64, 65, 200, 1000, 2000] {
            queue_and_check(&mut p, &src, len, 2048, 2040, 2048);
        }
    }

    /// A SEND by reference into a receive buffer too small for it fails as the general path
    /// fails it, and the buffer is not written.
    #[test]
    fn a_send_by_reference_into_a_short_buffer_fails_both_sides() {
        let mut p = pair("mq-ref-short");
        write_bytes(&p.mr, 1024, &[0xEE; 256]);
        send_into_short_buffer(&mut p, 100, 200);
        assert!(read_bytes(&p.mr, 1024 + 100, 156).iter().all(|&b| b == 0xEE), "nothing past the buffer");
    }

    /// Posts a receive of `room` bytes at offset 1024 of the MR (`wr_id` 1), sends `len`
    /// bytes (more than `room`) unsignaled (`wr_id` 2), and checks that both sides fail as the
    /// general path fails them: LOC_LEN_ERR for the receiver, REM_INV_REQ_ERR for the sender,
    /// both QPs in ERROR.
    fn send_into_short_buffer(p: &mut Pair, room: u32, len: u32) {
        p.b.post_recv(&RecvChain::one(1, &[Sge::new(p.mr.addr() + 1024, room, p.mr.lkey())])).unwrap();
        p.a.post_send(&SendChain::one(SendWr::send(2), &[Sge::new(p.mr.addr(), len, p.mr.lkey())])).unwrap();
        let rc = poll_one(&mut p.rb, 10).expect("receive completion");
        assert_eq!((rc.wr_id, rc.status), (1, WcStatus::LocLenErr));
        let sc = poll_one(&mut p.sa, 10).expect("the unsignaled send's error completion");
        assert_eq!((sc.wr_id, sc.status), (2, WcStatus::RemInvReqErr));
        assert_eq!((p.a.state(), p.b.state()), (QpState::Error, QpState::Error));
    }

    /// A cell by reference that names bytes outside the arena (a hostile or corrupt sender)
    /// delivers nothing and uses no receive request: its sender's WQE fails.
    #[test]
    fn a_cell_naming_memory_outside_the_arena_delivers_nothing() {
        let mut p = pair("mq-ref-hostile");
        let q = p.rb.shared.mq.expect("the receive CQ has a queue");
        write_bytes(&p.mr, 1024, &[0xEE; 64]);
        p.b.post_recv(&RecvChain::one(1, &[Sge::new(p.mr.addr() + 1024, 64, p.mr.lkey())])).unwrap();
        let idx = super::super::layout::key_index(p.b.qp_num(), super::super::layout::QP_IDX_BITS);
        for off in [u64::MAX - 8, 0] {
            let pos = q.claim(1);
            let words = [super::meta(p.a.qp_num(), 0), 9, off, 40, 0, 0];
            q.write(pos, &mut 0, 32, super::tag(idx, super::F_REF | super::F_SIGNALED), 0, &words).unwrap();
            assert!(poll_one(&mut p.rb, 10).is_none(), "offset {off:#x}: nothing delivered");
        }
        assert!(read_bytes(&p.mr, 1024, 64).iter().all(|&b| b == 0xEE), "the receive buffer is untouched");
        let sc = poll_one(&mut p.sa, 10).expect("the sender's error completion");
        assert_eq!((sc.wr_id, sc.status), (9, WcStatus::RemInvReqErr));
    }

    /// A queued SEND into a receive buffer too small for it fails as the general path fails
    /// it: LOC_LEN_ERR for the receiver, REM_INV_REQ_ERR for the sender, both QPs in ERROR.
    #[test]
    fn a_queued_send_into_a_short_buffer_fails_both_sides() {
        send_into_short_buffer(&mut pair("mq-short"), 4, 8);
    }

    /// Polls `cq` with room for 16 until `n` completions came: (`wr_id`, status) in order.
    fn poll_n(cq: &mut ShmCq, n: usize) -> Vec<(u64, WcStatus)> {
        let mut wc = [WorkCompletion::default(); 16];
        let mut got = Vec::new();
        for _ in 0..100_000 {
            let k = cq.poll(&mut wc).unwrap();
            got.extend(wc[..k].iter().map(|w| (w.wr_id, w.status)));
            if got.len() >= n {
                break;
            }
        }
        got
    }

    /// Posts receives `0..8` (64 bytes each, `short`: that one 4 bytes) and a post list of
    /// six signaled 8-byte SENDs (`wr_id` 100 + i, bytes `i` repeated), all queued: one poll
    /// finds them together, a run to one QP.
    fn run_of_six(p: &mut Pair, short: Option<u64>) {
        for i in 0..8u64 {
            let room = if Some(i) == short { 4 } else { 64 };
            p.b.post_recv(&RecvChain::one(i, &[Sge::new(p.mr.addr() + 1024 + i * 64, room, p.mr.lkey())])).unwrap();
        }
        let mut chain = SendChain::new();
        for i in 0..6u64 {
            write_bytes(&p.mr, i * 8, &[i as u8 + 1; 8]);
            chain.push(SendWr::send(100 + i).signaled(), &[Sge::new(p.mr.addr() + i * 8, 8, p.mr.lkey())]);
        }
        p.a.post_send(&chain).unwrap();
    }

    /// A run of queued SENDs to one QP (its receive requests claimed together) lands in
    /// order, each message in its own request, in one poll.
    #[test]
    fn a_run_of_queued_sends_lands_in_order() {
        let mut p = pair("mq-run");
        run_of_six(&mut p, None);
        let ok = |ids: std::ops::Range<u64>| ids.map(|i| (i, WcStatus::Success)).collect::<Vec<_>>();
        assert_eq!(poll_n(&mut p.rb, 6), ok(0..6));
        for i in 0..6u64 {
            assert_eq!(read_bytes(&p.mr, 1024 + i * 64, 8), [i as u8 + 1; 8], "message {i}'s bytes");
        }
        assert_eq!(poll_n(&mut p.sa, 6), ok(100..106));
        // The two requests left serve the next messages.
        let mut chain = SendChain::new();
        for i in 0..2u64 {
            chain.push(SendWr::send(200 + i).signaled(), &[Sge::new(p.mr.addr(), 8, p.mr.lkey())]);
        }
        p.a.post_send(&chain).unwrap();
        assert_eq!(poll_n(&mut p.rb, 2), ok(6..8));
    }

    /// A message of a run that the general delivery places (an empty SEND into a request of
    /// no SGE: its completion goes into the ring) keeps its place: the run's later messages
    /// follow it through the ring, so the poll returns all of them in order.
    #[test]
    fn a_run_message_placed_by_the_general_delivery_keeps_its_place() {
        let mut p = pair("mq-run-general");
        let sges = |i: u64| if i == 1 { vec![] } else { vec![Sge::new(p.mr.addr() + 1024 + i * 64, 64, p.mr.lkey())] };
        let posts: Vec<_> = (0..4u64).map(|i| RecvChain::one(i, &sges(i))).collect();
        for r in &posts {
            p.b.post_recv(r).unwrap();
        }
        let mut chain = SendChain::new();
        for i in 0..4u64 {
            write_bytes(&p.mr, i * 8, &[i as u8 + 1; 8]);
            let len = if i == 1 { 0 } else { 8 };
            chain.push(SendWr::send(100 + i).signaled(), &[Sge::new(p.mr.addr() + i * 8, len, p.mr.lkey())]);
        }
        p.a.post_send(&chain).unwrap();
        let mut wc = [WorkCompletion::default(); 16];
        let mut got = Vec::new();
        for _ in 0..100_000 {
            let k = p.rb.poll(&mut wc).unwrap();
            got.extend(wc[..k].iter().map(|w| (w.wr_id, w.status, w.byte_len)));
            if got.len() >= 4 {
                break;
            }
        }
        let ok = WcStatus::Success;
        assert_eq!(got, [(0, ok, 8), (1, ok, 0), (2, ok, 8), (3, ok, 8)]);
        for i in [0u64, 2, 3] {
            assert_eq!(read_bytes(&p.mr, 1024 + i * 64, 8), [i as u8 + 1; 8], "message {i}'s bytes");
        }
    }

    /// A run's message that goes to the ring while the ring also holds the sender's
    /// completions (one CQ for both sides): the poll that fills `wc` from the ring must not
    /// let the queue go with requests still held (a helper draining next would take the
    /// requests after them for the run's messages). Every poll ends holding none, and
    /// every completion comes, each side in order.
    #[test]
    fn a_poll_never_ends_holding_a_run() {
        let mut p = pair_with("mq-run-shared", super::Mode::All, true);
        for i in 0..4u64 {
            let sges = if i == 1 { vec![] } else { vec![Sge::new(p.mr.addr() + 1024 + i * 64, 64, p.mr.lkey())] };
            p.b.post_recv(&RecvChain::one(i, &sges)).unwrap();
        }
        let mut chain = SendChain::new();
        for i in 0..4u64 {
            let len = if i == 1 { 0 } else { 8 };
            chain.push(SendWr::send(100 + i).signaled(), &[Sge::new(p.mr.addr() + i * 8, len, p.mr.lkey())]);
        }
        p.a.post_send(&chain).unwrap();
        let mut wc = [WorkCompletion::default(); 4];
        let (mut recv, mut sent) = (Vec::new(), Vec::new());
        for _ in 0..100_000 {
            let k = p.rb.poll(&mut wc).unwrap();
            assert!(!p.rb.drain.holds_run(), "a poll returned holding receive requests");
            for w in &wc[..k] {
                assert_eq!(w.status, WcStatus::Success, "{w:?}");
                if w.opcode == WcOpcode::Recv {
                    recv.push(w.wr_id)
                } else {
                    sent.push(w.wr_id)
                }
            }
            if recv.len() + sent.len() >= 8 {
                break;
            }
        }
        assert_eq!((recv, sent), (vec![0, 1, 2, 3], vec![100, 101, 102, 103]));
    }

    /// A run whose messages vanish from the queue (only a scribbling peer does that) ends:
    /// its held requests fail with GENERAL_ERR, in order, and the queue's next messages take
    /// the requests after them, none of the run's. (Here the run's last two messages stay
    /// in the queue, as if the scribble had hidden them only from the drainer's `poll`.)
    #[test]
    fn an_abandoned_run_fails_its_requests_in_order() {
        let mut p = pair("mq-run-abandon");
        for i in 0..5u64 {
            p.b.post_recv(&RecvChain::one(i, &[Sge::new(p.mr.addr() + 1024 + i * 64, 64, p.mr.lkey())])).unwrap();
        }
        let q = p.rb.shared.mq.expect("the receive CQ has a queue");
        let idx = super::super::layout::key_index(p.b.qp_num(), super::super::layout::QP_IDX_BITS);
        for i in 0..3u64 {
            let pos = q.claim(1);
            let words = [super::meta(p.a.qp_num(), i as u32), 100 + i, i, 0, 0, 0];
            q.write(pos, &mut 0, 24, super::tag(idx, 0), 0, &words).unwrap();
        }
        let (f, cqn) = (p.rb.shared.fabric(), p.rb.shared.cqn);
        let mut dr = q.try_drain().expect("nobody else drains");
        let m = dr.poll().expect("a message");
        let mut c = super::DrainCache::default();
        let mut wc = WorkCompletion::default();
        assert!(matches!(super::take(f, cqn, &mut c, &dr, 3, m, &mut wc), super::Got::Wc));
        assert_eq!((wc.wr_id, wc.status), (0, WcStatus::Success));
        assert!(c.holds_run(), "room 3: a run of 3");
        c.abandon_run(f);
        assert!(!c.holds_run());
        drop(dr);
        let got = poll_n(&mut p.rb, 4);
        let (ok, err) = (WcStatus::Success, WcStatus::GeneralErr);
        assert_eq!(got, [(1, err), (2, err), (3, ok), (4, ok)]);
        assert_eq!(read_bytes(&p.mr, 1024 + 3 * 64, 8), 1u64.to_ne_bytes(), "the next message went to request 3");
    }

    /// A request of a run that does not fit its message fails it (LOC_LEN_ERR, the QP to
    /// ERROR) and the requests after it flush in order: the run's, then the rest of the
    /// queue's. The sender sees its messages before the failure succeed, the failed one
    /// REM_INV_REQ_ERR and the rest flushed, as with one claim per message.
    #[test]
    fn a_short_request_in_a_run_flushes_the_rest_in_order() {
        let mut p = pair("mq-run-short");
        run_of_six(&mut p, Some(2));
        let flush = WcStatus::WrFlushErr;
        let (ok, len, inv) = (WcStatus::Success, WcStatus::LocLenErr, WcStatus::RemInvReqErr);
        assert_eq!(
            poll_n(&mut p.rb, 8),
            [(0, ok), (1, ok), (2, len), (3, flush), (4, flush), (5, flush), (6, flush), (7, flush)]
        );
        assert_eq!(poll_n(&mut p.sa, 6), [(100, ok), (101, ok), (102, inv), (103, flush), (104, flush), (105, flush)]);
        assert_eq!((p.a.state(), p.b.state()), (QpState::Error, QpState::Error));
    }

    /// A run whose receive requests alternate between two MRs over the same bytes is placed
    /// request by request with each one's own MR: with the second MR deregistered after the
    /// requests were posted, its first request fails as the general delivery fails it
    /// (its bytes untouched, though the first MR covers them) and the rest of the run is
    /// flushed; the messages before it land.
    #[test]
    fn a_run_looks_up_each_requests_own_mr() {
        let mut p = pair("mq-run-mrs");
        let other = p.pd.reg_mr(&p.region, 0, 4096, AccessFlags::LOCAL_WRITE).unwrap();
        write_bytes(&p.mr, 1024, &[0xEE; 512]);
        for i in 0..6u64 {
            let key = if i % 2 == 0 { p.mr.lkey() } else { other.lkey() };
            p.b.post_recv(&RecvChain::one(i, &[Sge::new(p.mr.addr() + 1024 + i * 64, 64, key)])).unwrap();
        }
        drop(other);
        let mut chain = SendChain::new();
        for i in 0..4u64 {
            write_bytes(&p.mr, i * 8, &[i as u8 + 1; 8]);
            chain.push(SendWr::send(100 + i).signaled(), &[Sge::new(p.mr.addr() + i * 8, 8, p.mr.lkey())]);
        }
        p.a.post_send(&chain).unwrap();
        let got = poll_n(&mut p.rb, 6);
        assert_eq!(got[0], (0, WcStatus::Success));
        assert_eq!(got[1], (1, WcStatus::LocProtErr), "{got:?}");
        assert!(got[2..].iter().all(|&(_, s)| s == WcStatus::WrFlushErr), "{got:?}");
        assert_eq!(read_bytes(&p.mr, 1024, 8), [1; 8], "message 0 lands");
        assert!(read_bytes(&p.mr, 1024 + 64, 64).iter().all(|&b| b == 0xEE), "request 1's bytes untouched");
        assert_eq!(poll_n(&mut p.sa, 4)[0], (100, WcStatus::Success));
    }

    /// A run's MR is not kept past the run: after a run placed into an MR's requests, the MR
    /// is deregistered, and the next run into its remaining requests fails at the first.
    #[test]
    fn a_runs_mr_is_looked_up_again_by_the_next_run() {
        let mut p = pair("mq-run-mr-again");
        let other = p.pd.reg_mr(&p.region, 0, 4096, AccessFlags::LOCAL_WRITE).unwrap();
        for i in 0..4u64 {
            p.b.post_recv(&RecvChain::one(i, &[Sge::new(p.mr.addr() + 1024 + i * 64, 64, other.lkey())])).unwrap();
        }
        let send_two = |p: &mut Pair, first: u64| {
            let mut chain = SendChain::new();
            for i in first..first + 2 {
                chain.push(SendWr::send(100 + i).signaled(), &[Sge::new(p.mr.addr(), 8, p.mr.lkey())]);
            }
            p.a.post_send(&chain).unwrap();
        };
        send_two(&mut p, 0);
        assert_eq!(poll_n(&mut p.rb, 2), [(0, WcStatus::Success), (1, WcStatus::Success)]);
        drop(other);
        send_two(&mut p, 2);
        assert_eq!(poll_n(&mut p.rb, 2), [(2, WcStatus::LocProtErr), (3, WcStatus::WrFlushErr)]);
    }

    /// With no receive posted, nothing is queued (RNR at post time): the SEND waits and is
    /// delivered once a receive is posted.
    #[test]
    fn no_receive_posted_is_rnr_at_post_time() {
        let mut p = pair("mq-rnr");
        let q = p.rb.shared.mq.unwrap();
        p.a.post_send(&SendChain::one(SendWr::send(3).signaled(), &[Sge::new(p.mr.addr(), 8, p.mr.lkey())])).unwrap();
        assert!(!q.ready(), "nothing queued without a reserved request");
        assert!(poll_one(&mut p.sa, 10).is_none());
        p.b.post_recv(&RecvChain::one(4, &[Sge::new(p.mr.addr() + 1024, 64, p.mr.lkey())])).unwrap();
        let mut got = (None, None);
        for _ in 0..1_000_000 {
            if got.0.is_none() {
                got.0 = poll_one(&mut p.sa, 1).map(|w| (w.wr_id, w.status));
            }
            if got.1.is_none() {
                got.1 = poll_one(&mut p.rb, 1).map(|w| (w.wr_id, w.status));
            }
            if got.0.is_some() && got.1.is_some() {
                break;
            }
        }
        assert_eq!(got, (Some((3, WcStatus::Success)), Some((4, WcStatus::Success))));
    }
}

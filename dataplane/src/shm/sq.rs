//! The send queue's state: WQE numbering, the pending queue of WQEs waiting behind an RNR
//! or a retry (with their SGEs or inline bytes copied), the cached destination, and the
//! sender's own completions (`complete`). The doorbell and the execution stages work on it;
//! it calls only downward (completion, the QP table).

use super::complete::{push_cqe_to, CqShared, Cqe};
use super::dest::{DestView, McastDests};
use super::fabric::Fabric;
use super::layout::*;
use super::mr::MrCache;
use super::place::{gather_prefix, Seg};
use super::recvq::RecvEntry;
use super::retry::{self, Waiter};
use super::CtxInner;
use crate::verbs::*;
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Instant;

/// Why a WQE waits.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum BlockKind {
    /// The responder had no receive posted (RNR NAK).
    Rnr,
    /// The responder did not answer (absent, not in RTR/RTS, or connected elsewhere).
    Unreachable,
    /// SENDs this QP queued for receiver-side delivery (`shm::drain`) are not all drained:
    /// a WQE that goes another way waits for them, so it cannot overtake them. Uses no
    /// retries; progress helps drain.
    Drain,
}

/// The sender's side of receiver-side delivery for one destination (`doorbell::post_mq`).
#[derive(Clone, Copy, Default)]
pub(crate) struct MqSend {
    /// The destination QP these counts are for (0: none yet).
    pub(crate) dest: u32,
    /// Its receive CQ, whose queue `q` is.
    pub(crate) cqn: u32,
    pub(crate) q: Option<super::msgq::MsgQueue>,
    /// One past the queue position of our last queued SEND; 0 when all are known drained.
    pub(crate) last: u64,
    /// The next request of the destination's RQ we reserve (its RQ position).
    pub(crate) rq_next: u64,
    /// Our cached copy of the RQ's `tail`: requests below it are posted (or being posted).
    pub(crate) rq_tail: u64,
    /// Queue positions this post list claimed and has not written yet: `[claim_next,
    /// claim_end)` (`doorbell::post_mq`, `doorbell::mq_close`).
    pub(crate) claim_next: u64,
    pub(crate) claim_end: u64,
    /// Our copy of the queue's published `head` (`MsgQueue::write`'s `acked`): re-read only
    /// when a claimed cell looks busy. Reset with the rest by `mq_switch` (a copy from
    /// another queue could be above this one's `head`).
    pub(crate) acked: u64,
}

impl MqSend {
    /// Whether SENDs we queued may still be undrained (reads the queue's `head` unless we
    /// know they are drained); forgets them once they are.
    #[inline]
    pub(crate) fn settle(&mut self) -> bool {
        if self.last == 0 {
            return true;
        }
        match self.q {
            Some(q) if q.acked() < self.last => false,
            _ => {
                self.last = 0;
                true
            }
        }
    }
}

/// State of the WQE at the head of the pending queue.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Blocked {
    pub(crate) kind: BlockKind,
    pub(crate) left: u8,
    pub(crate) next_at: Instant,
}

/// Most SENDs of one `post_send` whose remote stores wait at once ([`HeldRecv`]).
pub(crate) const MAX_HELD: usize = 32;

/// A fast-path SEND whose receive request and receive CQE cell are claimed, and whose stores
/// into the receiver's memory (the CQE, the request's release, the bytes of a message too
/// long to ride in the CQE) wait until the chain's claims are made (`doorbell::post_send`,
/// `exec::publish_held`). Why: each claim is a locked instruction, which waits until every
/// earlier store has completed, and a store into a line the receiver's core holds completes
/// only after a round trip to that core. Made in the order of the claims, the chain's
/// messages waited one round trip each (60-70% of the sender's time in `dp-perf send_bw
/// -l 32` sat on the CAS of the receiver's CQ tail, `perf` on this VM); held, a chain waits
/// about once. Addresses are fabric offsets (the rings' views are `Send`, pointers are not).
///
/// The sender's own completion of a signaled SEND waits with them ([`HeldSend`]).
///
/// Only what differs between the messages of a chain is kept here; the rings and the
/// completion's constant fields are [`HeldDest`], once per chain (copying them per message
/// was most of what holding cost in chains).
#[derive(Clone, Copy, Default)]
pub(crate) struct HeldRecv {
    /// The receive request (its `wr_id`) and its cell, to release.
    pub(crate) wr_id: u64,
    pub(crate) rq_pos: u64,
    /// The claimed cell of the receiver's CQ.
    pub(crate) cq_pos: u64,
    /// Fabric offsets of the checked receive buffer and of the message's bytes.
    pub(crate) dst_off: u64,
    pub(crate) src_off: u64,
    /// The message's length.
    pub(crate) byte_len: u32,
    /// SEND_WITH_IMM's immediate (`with_imm`), in network order as posted.
    pub(crate) imm_data: u32,
    pub(crate) with_imm: bool,
    /// The SEND was SOLICITED.
    pub(crate) solicited: bool,
}

/// The sender's own completion of a held signaled SEND ([`HeldRecv`]): it tells the
/// application that the send buffer may be reused, so it must not show before the bytes are
/// copied out of it (another thread may poll the send CQ while this one posts; case
/// `a_buffer_reused_after_its_send_completion_does_not_change_the_message`). Its cell of the
/// send CQ is claimed with the others (the locked instructions stay before the stores into
/// the receiver's lines) and published after the held copies. Kept apart from `HeldRecv`:
/// most SENDs of a post list are unsignaled, and three more fields written per message cost
/// the echo pipeline 15 instructions per SEND (callgrind).
#[derive(Clone, Copy, Default)]
pub(crate) struct HeldSend {
    /// The claimed cell of the send CQ.
    pub(crate) pos: u64,
    /// The SEND's `wr_id`, and its WQE number (which the CQE retires).
    pub(crate) wr_id: u64,
    pub(crate) wqe: u32,
}

/// Where the held SENDs of one post go (an RC or UC QP sends to one peer): the receive queue
/// (or SRQ) ring, the receive CQ, and the receive completions' fields that no message changes.
#[derive(Clone, Copy)]
pub(crate) struct HeldDest {
    pub(crate) rq: super::ring::Ring,
    pub(crate) cq: super::wire::CqRing,
    pub(crate) cqn: u32,
    /// The CQ has a completion channel.
    pub(crate) channel: bool,
    /// The receiving QP, the sending QP and its LID, as the completion reports them.
    pub(crate) qp_num: u32,
    pub(crate) src_qp: u32,
    pub(crate) slid: u16,
    /// The sender's send CQ (its ring, number and whether it has a channel), for the
    /// completions of signaled SENDs.
    pub(crate) send_cq: super::wire::CqRing,
    pub(crate) send_cqn: u32,
    pub(crate) send_channel: bool,
}

impl HeldDest {
    /// Whether messages taken from `rq` and completed into `cq` belong with these (the
    /// constant fields follow from the rings and the sender). Always within one post but for
    /// a destination re-resolved mid-chain (its QP destroyed and its number reused).
    #[inline(always)]
    pub(crate) fn goes_to(&self, rq: &super::ring::Ring, cq: &super::wire::CqRing) -> bool {
        self.rq.same(rq) && self.cq.ring().same(cq.ring())
    }
}

/// Receive requests of the target's SRQ claimed with one CAS for the SENDs that follow in
/// the current post list (`doorbell::srq_take`); none between calls. Each of those SENDs
/// takes the next one where it would have taken a request of its own.
pub(crate) struct SrqRun {
    /// Position of the next claimed request in the SRQ's ring.
    pub(crate) next: u64,
    /// Claimed requests not yet used.
    pub(crate) left: u32,
    /// The number of the SRQ they belong to.
    pub(crate) srqn: u32,
    /// The WRs from the one after the run on (that WR included) that `sends_ahead` found
    /// to have a SEND's shape when it sized the last claim, which got fewer requests than it
    /// asked for; 0 or 1: unknown past that WR. Spares a post list a scan per claim while
    /// its SRQ has only a few requests at a time. 0 between calls.
    pub(crate) shaped: u32,
    /// The target as it was at the claim: the SRQ the requests came from, and the CQ where
    /// requests left over are flushed (`doorbell::return_run`).
    pub(crate) dest: Option<DestView>,
}

/// The SENDs of the current `post_send` whose remote stores wait ([`HeldRecv`]), all to
/// `dest`; empty between calls. A fixed array: pushing is a store and an increment.
pub(crate) struct Held {
    /// Valid while `len > 0`.
    pub(crate) dest: Option<HeldDest>,
    pub(crate) msgs: [HeldRecv; MAX_HELD],
    pub(crate) len: usize,
    /// The signaled ones' completions, in posting order.
    pub(crate) sends: [HeldSend; MAX_HELD],
    pub(crate) n_sends: usize,
}

impl Held {
    /// Nothing held.
    pub(crate) fn new() -> Held {
        Held {
            dest: None,
            msgs: [HeldRecv::default(); MAX_HELD],
            len: 0,
            sends: [HeldSend::default(); MAX_HELD],
            n_sends: 0,
        }
    }

    /// Whether nothing is held.
    #[inline(always)]
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// A WQE waiting behind an RNR or a retry.
#[derive(Clone, Copy)]
pub(crate) struct Pending {
    pub wr: SendWr,
    pub wqe: u32,
    pub n_sge: u32,
    /// Bytes of inline data stored in the slot's inline buffer.
    pub inline_len: Option<u32>,
}

pub(crate) struct SqState {
    pub(crate) ctx: Arc<CtxInner>,
    pub(crate) send_cq: Arc<CqShared>,
    /// Our cached view of the send CQ's consumer position (`complete::push_cqe`).
    pub(crate) send_cq_head: std::cell::Cell<u64>,
    pub(crate) qpn: u32,
    /// A dry run of the post path is under way (`doorbell::warm_send`): the fast path stops
    /// before its first change, and nothing else runs.
    pub(crate) dry: bool,
    pub(crate) idx: usize,
    /// Our QP's slot (`slot`), kept mapped by `ctx`.
    pub(crate) slot_ref: super::fabric::SlotRef<QpSlot>,
    pub(crate) qp_type: QpType,
    pub(crate) pd: u32,
    pub(crate) lid: u16,
    pub(crate) sig_all: bool,
    pub(crate) depth: u32,
    pub(crate) max_sge: u32,
    pub(crate) max_inline: u32,
    pub(crate) posted: u32,
    pub(crate) dest_qpn: u32,
    pub(crate) qkey: u32,
    pub(crate) retry_cnt: u8,
    pub(crate) rnr_retry: u8,
    pub(crate) timeout_ns: Option<u64>,
    pub(crate) pending: VecDeque<Pending>,
    pub(crate) pend_sges: Vec<Sge>,
    pub(crate) pend_inline: Vec<u8>,
    pub(crate) blocked: Option<Blocked>,
    /// Retries made after RNR NAKs and missing responders (for stats).
    pub(crate) retries: u64,
    pub(crate) registered_pending: bool,
    /// This send queue's own cell, for the process-wide waiting list.
    pub(crate) me: Weak<dyn Waiter>,
    /// Where this queue is in that list while registered (`retry::set_waiting`).
    pub(crate) waiting_at: retry::ListPos,
    pub(crate) dest: Option<DestView>,
    /// XRC_SEND: the target XRC SRQ last sent to, seen through the connected XRC_RECV QP.
    pub(crate) xrc_dest: Option<DestView>,
    /// Members of the multicast group last sent to (UD only; built on the first such send).
    pub(crate) mcast: Option<McastDests>,
    /// Scratch receive entry (kept here to stay off the stack in the hot path).
    pub(crate) rx: RecvEntry,
    /// SENDs of the current `post_send` whose remote stores wait ([`Held`]); empty between
    /// calls.
    pub(crate) held: Held,
    /// SRQ requests claimed ahead for the rest of the current post list ([`SrqRun`]).
    pub(crate) run: SrqRun,
    /// Receiver-side delivery to the connected destination.
    pub(crate) mq: MqSend,
    /// Every small SEND takes it (`drain::Mode::All`), not only post lists'.
    pub(crate) mq_every: bool,
    /// Lone SENDs take it while this QP streams (`drain::Mode::Auto`).
    pub(crate) mq_auto: bool,
    /// This QP's receive CQ, whose [`CqShared::polled`] tells whether it received since
    /// its previous post.
    pub(crate) recv_cq: Arc<CqShared>,
    /// `recv_cq.polled` at our previous post.
    pub(crate) recv_polled_seen: u64,
    /// Set by each `post_send` (`Mode::Auto`): nothing was received since the previous
    /// post, so a lone SEND takes the queue.
    pub(crate) mq_stream: bool,
    /// The last send lkey that passed the fast path's checks (an MR of `pd`, not a window),
    /// kept across posts.
    pub(crate) lkeys: MrCache,
    /// The last receive lkey a message of ours landed in (an MR with LOCAL_WRITE, not a
    /// window; its PD is checked per message), kept across posts (`place::recv_dst`).
    pub(crate) recv_lkeys: MrCache,
}

// SAFETY: SqState holds Arcs and raw views of shared memory (pointers into the fabric's
// mapping, which lives as long as the `ctx` Arc it also holds), all usable from any thread;
// its user serialises access (`sq_lock::OwnerLock`).
unsafe impl Send for SqState {}

impl SqState {
    pub(crate) fn fabric(&self) -> &Fabric {
        &self.ctx.fabric
    }

    pub(crate) fn slot(&self) -> &QpSlot {
        self.slot_ref.get()
    }

    pub(crate) fn state(&self) -> QpState {
        QpState::from_u8(self.slot().state.load(Ordering::Acquire) as u8).unwrap_or(QpState::Error)
    }

    /// Pushes a completion for send WQE `wqe` into our send CQ.
    #[inline(always)]
    pub(crate) fn complete(&self, wr: &SendWr, wqe: u32, status: WcStatus, byte_len: u32) {
        let cqe = Cqe {
            wc: WorkCompletion {
                wr_id: wr.wr_id,
                status,
                opcode: wr.opcode.wc_opcode(),
                byte_len,
                qp_num: self.qpn,
                ..Default::default()
            },
            retire: Some(wqe),
            solicited: false,
        };
        let mut seen = self.send_cq_head.get();
        let cq = &*self.send_cq;
        push_cqe_to(self.fabric(), &cq.ring, &mut seen, cq.cqn, cq.has_channel, &cqe);
        self.send_cq_head.set(seen);
    }

    pub(crate) fn set_pending_registered(&mut self, on: bool) {
        if on != self.registered_pending {
            self.registered_pending = on;
            retry::set_waiting(&self.me, &self.waiting_at, on);
        }
    }

    /// Stores a WQE at the back of the pending queue, copying its SGEs (or inline bytes).
    pub(crate) fn enqueue(&mut self, wr: &SendWr, wqe: u32, src: &[Sge], inline: Option<&[Seg]>) {
        let slot = (wqe % self.depth) as usize;
        let inline_len = inline.map(|segs| {
            // Their total was checked against max_inline_data, so it fits this slot's buffer
            // (a slice index, so a wrong total panics instead of writing past it).
            let total: usize = segs.iter().map(|s| s.len).sum();
            let at = slot * self.max_inline as usize;
            gather_prefix(segs, &mut self.pend_inline[at..at + total]);
            total as u32
        });
        let m = self.max_sge as usize;
        let n = if inline.is_some() { 0 } else { src.len() };
        self.pend_sges[slot * m..slot * m + n].copy_from_slice(&src[..n]);
        self.pending.push_back(Pending { wr: *wr, wqe, n_sge: n as u32, inline_len });
        self.set_pending_registered(true);
    }

    pub(crate) fn pending_parts(&self, p: &Pending) -> (&[Sge], Option<&[u8]>) {
        let slot = (p.wqe % self.depth) as usize;
        let m = self.max_sge as usize;
        let sges = &self.pend_sges[slot * m..slot * m + p.n_sge as usize];
        let inline = p.inline_len.map(|l| {
            let mi = self.max_inline as usize;
            &self.pend_inline[slot * mi..slot * mi + l as usize]
        });
        (sges, inline)
    }

    /// Completes every pending WQE with a flush error.
    pub(crate) fn flush_pending(&mut self) {
        while let Some(p) = self.pending.pop_front() {
            self.complete(&p.wr, p.wqe, WcStatus::WrFlushErr, 0);
        }
        self.blocked = None;
        self.set_pending_registered(false);
    }
}

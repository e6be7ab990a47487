//! Queue pairs of the `shm` provider: the state machine, `post_recv`, and `post_send`, whose
//! doorbell executes the chain on the poster's CPU (see [`super::doorbell`]).
//!
//! The send queue is private to the owning process. Its slots are accounted like hardware's:
//! a WQE occupies its slot from `post_send` until a completion of it (or of a later WQE of the
//! same QP) is polled, so selective signaling fills the queue exactly as on a real NIC.

use super::complete::CqShared;
use super::fabric::Fabric;
use super::layout::*;
use super::mr::PdInner;
use super::qp_error::{flush_rq, to_error};
use super::recvq::{self, RecvEntry};
use super::retry::Waiter;
use super::ring::Ring;
use super::sq::{BlockKind, Blocked, SqState, SrqRun};
use super::sq_lock::{OwnerLock, Waits};
use super::srq::SrqShared;
use super::wire::RecvRing;
use crate::verbs::*;
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// A queue pair of the `shm` provider.
pub struct ShmQp {
    pub(crate) sq: Arc<SqCell>,
    rq: Option<(RecvRing, u64, u64)>,
    /// How `post_recv` bounds the RQ: by its cells (RC/UC), or, on UD and RAW_PACKET RQs
    /// (twice `max_recv_wr` cells), by the requests not yet claimed (as SRQs; see `ShmSrq`).
    rq_bound: recvq::RecvBound,
    /// Keeps the SRQ alive while this QP may take from it.
    _srq: Option<Arc<SrqShared>>,
    recv_cq: Arc<CqShared>,
    pd: Arc<PdInner>,
    idx: usize,
    /// Our slot (`slot`), kept mapped by `pd`'s context.
    slot_ref: super::fabric::SlotRef<QpSlot>,
    qpn: u32,
    qp_type: QpType,
    caps: QpCaps,
}

/// The send queue, shared between the QP handle (posting) and the CQ polls that progress
/// its waiting WQEs (`retry`): the handle's posts skip the lock while nothing waits in it
/// (`sq_lock`).
pub(crate) type SqCell = OwnerLock<SqState>;

impl Waits for SqState {
    /// WQEs wait behind an RNR or a retry: the queue is in the process's waiting list.
    fn waiting(&self) -> bool {
        self.registered_pending
    }
}

/// How long past its RNR timer a send must wait before a thread other than its owner
/// retries it (`retry::progress_waiting`): the owner retries it on time when it polls, and
/// early as soon as the responder posts a receive.
const FOREIGN_RNR_GRACE: Duration = Duration::from_micros(100);

impl Waiter for SqCell {
    /// Progress from a CQ poll: skipped if the queue's lock is held (its owner is posting
    /// and progresses the queue itself) or if nothing waits in it (`sq_lock`). A `foreign` caller leaves a send waiting behind an RNR to its owner
    /// until the wait is [`FOREIGN_RNR_GRACE`] overdue.
    fn try_progress(&self, foreign: bool, now: Instant) {
        if let Some(mut g) = self.try_lock_open() {
            let owners = |b: Blocked| b.kind == BlockKind::Rnr && now < b.next_at + FOREIGN_RNR_GRACE;
            if foreign && g.blocked.is_some_and(owners) {
                return;
            }
            super::doorbell::progress_at(&mut g, now);
        }
    }
}

impl ShmQp {
    pub(crate) fn create(pd: &Arc<PdInner>, attr: &crate::QpInitAttr<'_, super::Shm>) -> Result<ShmQp> {
        if attr.qp_type == QpType::XrcRecv {
            return Err(Error::new(
                Errno::EINVAL,
                "an XRC_RECV QP belongs to an XRC domain, not a PD: create it with Xrcd::create_recv_qp",
            ));
        }
        Self::create_in(pd, attr, 0)
    }

    /// Creates a QP; `xrcd` is the domain of an XRC_RECV QP (0 for every other type).
    pub(crate) fn create_in(pd: &Arc<PdInner>, attr: &crate::QpInitAttr<'_, super::Shm>, xrcd: u32) -> Result<ShmQp> {
        let ctx = &pd.ctx;
        let f = &ctx.fabric;
        let caps = ctx.caps;
        let c = attr.cap;
        let send_cq = &attr.send_cq.shared;
        let recv_cq = &attr.recv_cq.shared;
        if !Arc::ptr_eq(&send_cq.ctx.fabric, f) || !Arc::ptr_eq(&recv_cq.ctx.fabric, f) {
            return Err(Error::new(Errno::EINVAL, "CQ belongs to another fabric"));
        }
        if c.max_send_wr == 0 || c.max_send_wr > caps.max_qp_wr {
            return Err(Error::new(
                Errno::EINVAL,
                format!("max_send_wr {} must be 1..={}", c.max_send_wr, caps.max_qp_wr),
            ));
        }
        if c.max_send_sge > caps.max_sge || c.max_recv_sge > caps.max_sge {
            return Err(Error::new(Errno::EINVAL, format!("max_send_sge/max_recv_sge must be <= {}", caps.max_sge)));
        }
        if c.max_inline_data > caps.max_inline_data {
            return Err(Error::new(
                Errno::EINVAL,
                format!("max_inline_data {} is above the device's {}", c.max_inline_data, caps.max_inline_data),
            ));
        }
        let xrc = attr.qp_type.is_xrc();
        if xrc && attr.srq.is_some() {
            return Err(Error::new(
                Errno::EINVAL,
                "an XRC QP takes no SRQ at creation: its requests name an XRC SRQ (SendWr::xrc_srqn)",
            ));
        }
        let srq = match attr.srq {
            _ if xrc => None,
            Some(s) => {
                if !Arc::ptr_eq(&s.shared.ctx.fabric, f) {
                    return Err(Error::new(Errno::EINVAL, "SRQ belongs to another fabric"));
                }
                Some(s.shared.clone())
            }
            None => {
                if c.max_recv_wr == 0 || c.max_recv_wr > caps.max_qp_wr {
                    return Err(Error::new(
                        Errno::EINVAL,
                        format!("max_recv_wr {} must be 1..={} without an SRQ", c.max_recv_wr, caps.max_qp_wr),
                    ));
                }
                None
            }
        };
        let rq_sge = c.max_recv_sge.max(1);
        // UD and RAW_PACKET RQs have senders on any thread, so one descheduled mid-take can
        // hold a cell while others go on: twice the cells, bounded by the count (as SRQs).
        let many_senders = matches!(attr.qp_type, QpType::Ud | QpType::RawPacket);
        // A connected QP's ring has a cell to spare (`own_recv_cells`).
        let max_recv_wr = if many_senders {
            c.max_recv_wr.next_power_of_two()
        } else {
            own_recv_cells(c.max_recv_wr, caps.max_qp_wr)
        };
        let rq = match srq {
            _ if xrc => None,
            Some(_) => None,
            None => {
                let cap = max_recv_wr as usize * if many_senders { 2 } else { 1 };
                let stride = recv_stride(rq_sge);
                let len = Ring::bytes(cap, stride) as u64;
                let off = f.alloc(len)?;
                match f.init_recv_ring(off, cap, rq_sge) {
                    Ok(r) => Some((r, off, len)),
                    Err(e) => {
                        f.free(off, len);
                        return Err(e);
                    }
                }
            }
        };
        let free_rq = |rq: &Option<(RecvRing, u64, u64)>| {
            if let Some((_, off, len)) = rq {
                f.free(*off, *len);
            }
        };
        let l = f.lock()?;
        let claimed = f.claim_slot(
            MAX_QP,
            |i| {
                let s = f.qp_slot(i);
                (&s.qpn, &s.gen, s.pid.load(Ordering::Relaxed))
            },
            "QP",
        );
        let (idx, gen) = match claimed {
            Ok(v) => v,
            Err(e) => {
                drop(l);
                free_rq(&rq);
                return Err(e);
            }
        };
        let qpn = make_key(gen, idx, QP_IDX_BITS);
        let s = f.qp_slot(idx);
        s.state.store(QpState::Reset as u32, Ordering::Relaxed);
        s.qp_type.store(attr.qp_type as u32, Ordering::Relaxed);
        s.ctx.store(ctx.idx as u32, Ordering::Relaxed);
        s.pid.store(f.pid(), Ordering::Relaxed);
        s.pd.store(pd.pdn, Ordering::Relaxed);
        // (An XRC_RECV QP's is its domain's idle CQ: its messages complete on their SRQ's.)
        s.recv_cqn.store(recv_cq.cqn, Ordering::Relaxed);
        s.send_cqn.store(send_cq.cqn, Ordering::Relaxed);
        s.srqn.store(srq.as_ref().map_or(0, |s| s.srqn), Ordering::Relaxed);
        let (rq_off, rq_cap) = rq.as_ref().map_or((0, 0), |(r, off, _)| (*off, r.capacity() as u32));
        s.rq_off.store(rq_off, Ordering::Relaxed);
        s.rq_cap.store(rq_cap, Ordering::Relaxed);
        s.rq_sge.store(rq_sge, Ordering::Relaxed);
        s.qkey.store(0, Ordering::Relaxed);
        s.dest_qpn.store(0, Ordering::Relaxed);
        s.min_rnr_timer.store(0, Ordering::Relaxed);
        s.access.store(0, Ordering::Relaxed);
        s.lid.store(ctx.lid as u32, Ordering::Relaxed);
        s.xrcd.store(xrcd, Ordering::Relaxed);
        s.sq_retired.store(0, Ordering::Relaxed);
        s.qpn.store(qpn, Ordering::Release);
        drop(l);

        let depth = c.max_send_wr;
        let max_sge = c.max_send_sge.max(1);
        let max_inline = c.max_inline_data;
        let st = SqState {
            send_cq_head: std::cell::Cell::new(0),
            ctx: ctx.clone(),
            send_cq: send_cq.clone(),
            qpn,
            dry: false,
            idx,
            slot_ref: f.qp_slot_ref(idx),
            qp_type: attr.qp_type,
            pd: pd.pdn,
            lid: ctx.lid,
            sig_all: attr.sq_sig_all,
            depth,
            max_sge,
            max_inline,
            posted: 0,
            dest_qpn: 0,
            qkey: 0,
            retry_cnt: 7,
            rnr_retry: 7,
            timeout_ns: None,
            pending: VecDeque::with_capacity(depth as usize),
            pend_sges: vec![Sge::default(); depth as usize * max_sge as usize],
            pend_inline: vec![0; depth as usize * max_inline as usize],
            blocked: None,
            retries: 0,
            registered_pending: false,
            me: Weak::<SqCell>::new(),
            waiting_at: Default::default(),
            dest: None,
            xrc_dest: None,
            mcast: None,
            rx: RecvEntry::default(),
            run: SrqRun { next: 0, left: 0, srqn: 0, shaped: 0, dest: None },
            held: super::sq::Held::new(),
            mq: Default::default(),
            mq_every: super::drain::mode() == super::drain::Mode::All,
            mq_auto: super::drain::mode() == super::drain::Mode::Auto,
            recv_cq: recv_cq.clone(),
            recv_polled_seen: u64::MAX,
            mq_stream: false,
            lkeys: Default::default(),
            recv_lkeys: Default::default(),
        };
        let sq = Arc::new_cyclic(|me: &Weak<SqCell>| {
            let mut st = st;
            st.me = me.clone();
            SqCell::new(st)
        });
        let rq_caps = if rq.is_some() { max_recv_wr } else { 0 };
        let rq_bound = if many_senders { recvq::RecvBound::unclaimed(max_recv_wr) } else { recvq::RecvBound::cells() };
        Ok(ShmQp {
            sq,
            rq,
            rq_bound,
            _srq: srq,
            recv_cq: recv_cq.clone(),
            pd: pd.clone(),
            idx,
            slot_ref: f.qp_slot_ref(idx),
            qpn,
            qp_type: attr.qp_type,
            caps: QpCaps {
                max_send_wr: depth,
                max_recv_wr: rq_caps,
                max_send_sge: max_sge,
                max_recv_sge: rq_sge,
                max_inline_data: max_inline,
            },
        })
    }

    fn slot(&self) -> &QpSlot {
        self.slot_ref.get()
    }

    fn drain_rq_silently(&self) {
        if let Some((rq, _, _)) = &self.rq {
            // As `qp_error::flush_rq`: the connected sender's plain-store pops end first.
            super::solo::revoke(rq);
            let mut e = RecvEntry::default();
            while recvq::pop(rq, &mut e) {}
        }
    }
}

impl Drop for ShmQp {
    fn drop(&mut self) {
        let f = self.pd.ctx.fabric.clone();
        {
            let mut g = self.sq.lock();
            g.set_pending_registered(false);
            g.pending.clear();
        }
        // A wedged fabric (its lock held by a live stranger): leave the slot, do not hang.
        if let Ok(l) = f.lock() {
            let s = f.qp_slot(self.idx);
            if s.qpn.load(Ordering::Relaxed) == self.qpn {
                s.state.store(QpState::Reset as u32, Ordering::Release);
                s.qpn.store(0, Ordering::Release);
            }
            if self.qp_type == QpType::Ud {
                super::mcast::detach_all(&f, self.qpn);
            }
            if self.qp_type == QpType::RawPacket {
                super::raw::destroy_all(&f, self.qpn);
            }
            drop(l);
        }
        if let Some((_, off, len)) = self.rq {
            f.free(off, len);
        }
    }
}

fn check_port(port: u8) -> Result<()> {
    if port != 1 {
        return Err(Error::new(Errno::EINVAL, format!("port {port} does not exist (the shm device has port 1)")));
    }
    Ok(())
}

impl crate::provider::Qp for ShmQp {
    fn qp_num(&self) -> u32 {
        self.qpn
    }

    fn attach_mcast(&mut self, gid: &[u8; 16], lid: u16) -> Result<()> {
        super::mcast::attach(&self.pd.ctx.fabric, self.qpn, self.qp_type, gid, lid)
    }

    fn detach_mcast(&mut self, gid: &[u8; 16], lid: u16) -> Result<()> {
        super::mcast::detach(&self.pd.ctx.fabric, self.qpn, self.qp_type, gid, lid)
    }

    fn create_flow(&mut self, spec: &crate::verbs::FlowSpec) -> Result<crate::verbs::FlowId> {
        super::raw::create_flow(&self.pd.ctx.fabric, self.qpn, self.qp_type, spec)
    }

    fn destroy_flow(&mut self, id: crate::verbs::FlowId) -> Result<()> {
        super::raw::destroy_flow(&self.pd.ctx.fabric, self.qpn, id)
    }

    fn qp_type(&self) -> QpType {
        self.qp_type
    }

    fn state(&self) -> QpState {
        QpState::from_u8(self.slot().state.load(Ordering::Acquire) as u8).unwrap_or(QpState::Error)
    }

    fn caps(&self) -> QpCaps {
        self.caps
    }

    fn endpoint(&self, gid_index: u8) -> Result<Endpoint> {
        let gid = super::gid_of(&self.pd.ctx, 1, gid_index)?;
        Ok(Endpoint { lid: self.pd.ctx.lid, qpn: self.qpn, psn: 0, gid })
    }

    fn modify(&mut self, attr: &QpAttr) -> Result<()> {
        use QpState::*;
        let cur = self.state();
        let to = attr.state;
        cur.check_transition(to, self.qpn)?;
        let s = self.slot();
        let mut g = self.sq.lock();
        match (cur, to) {
            (_, Reset) => {
                g.pending.clear();
                g.set_pending_registered(false);
                g.blocked = None;
                g.posted = 0;
                g.dest = None;
                g.xrc_dest = None;
                s.sq_retired.store(0, Ordering::Release);
                drop(g);
                self.drain_rq_silently();
                s.state.store(Reset as u32, Ordering::Release);
                return Ok(());
            }
            (_, Error) => {
                drop(g);
                let f = self.pd.ctx.fabric.clone();
                to_error(&f, self.idx, self.qpn);
                if cur == Reset {
                    s.state.store(Error as u32, Ordering::Release);
                }
                self.sq.lock().flush_pending();
                return Ok(());
            }
            (Reset, Init) | (Init, Init) => {
                check_port(attr.port_num)?;
                if attr.pkey_index != 0 {
                    return Err(crate::verbs::Error::new(
                        Errno::EINVAL,
                        format!("pkey_index {} is out of range (table has 1 entry)", attr.pkey_index),
                    ));
                }
                s.access.store(attr.access.bits(), Ordering::Relaxed);
                if self.qp_type == QpType::Ud {
                    s.qkey.store(attr.qkey, Ordering::Relaxed);
                    g.qkey = attr.qkey;
                }
            }
            (Init, Rtr) => {
                if ![256, 512, 1024, 2048, 4096].contains(&attr.path_mtu) {
                    return Err(crate::verbs::Error::new(
                        Errno::EINVAL,
                        format!("path_mtu {} must be 256, 512, 1024, 2048 or 4096", attr.path_mtu),
                    ));
                }
                if self.qp_type.is_connected() {
                    if attr.dest_qp_num == 0 {
                        return Err(crate::verbs::Error::new(Errno::EINVAL, "RTR of a connected QP needs dest_qp_num"));
                    }
                    if attr.min_rnr_timer > 31 {
                        return Err(crate::verbs::Error::new(
                            Errno::EINVAL,
                            format!("min_rnr_timer {} must be 0..=31", attr.min_rnr_timer),
                        ));
                    }
                    s.dest_qpn.store(attr.dest_qp_num, Ordering::Relaxed);
                    s.min_rnr_timer.store(attr.min_rnr_timer as u32, Ordering::Relaxed);
                    g.dest_qpn = attr.dest_qp_num;
                    g.dest = None;
                    g.xrc_dest = None;
                }
            }
            (Rtr, Rts) | (Rts, Rts) | (Sqd, Rts) | (Sqe, Rts) | (Rts, Sqd) | (Sqd, Sqd) => {
                if to == Rts && cur == Rtr && self.qp_type.is_reliable() {
                    if attr.retry_cnt > 7 || attr.rnr_retry > 7 {
                        return Err(crate::verbs::Error::new(
                            Errno::EINVAL,
                            format!("retry_cnt {} and rnr_retry {} must be 0..=7", attr.retry_cnt, attr.rnr_retry),
                        ));
                    }
                    g.retry_cnt = attr.retry_cnt;
                    g.rnr_retry = attr.rnr_retry;
                    g.timeout_ns = ack_timeout_ns(attr.timeout);
                }
            }
            _ => unreachable!("can_transition admitted {cur:?} -> {to:?}"),
        }
        drop(g);
        // A peer may have moved us to ERROR meanwhile: only move from the state we checked.
        s.state.compare_exchange(cur as u32, to as u32, Ordering::AcqRel, Ordering::Acquire).map(|_| ()).map_err(
            |now| {
                crate::verbs::Error::new(
                    Errno::EINVAL,
                    format!("QP {:#x} changed state to {:?} during modify", self.qpn, QpState::from_u8(now as u8)),
                )
            },
        )
    }

    fn post_send(&mut self, chain: &SendChain) -> std::result::Result<(), PostError> {
        let f = &self.pd.ctx.fabric;
        // SAFETY: `&mut self`: this handle, the cell's only poster, is used by no one else.
        let mut g = unsafe { self.sq.lock_owner() };
        super::doorbell::post_send(f, &mut g, chain)
    }

    fn warm_send(&mut self, chain: &SendChain) {
        let f = &self.pd.ctx.fabric;
        // SAFETY: as in `post_send`.
        let mut g = unsafe { self.sq.lock_owner() };
        super::doorbell::warm_send(f, &mut g, chain)
    }

    fn post_recv(&mut self, chain: &RecvChain) -> std::result::Result<(), PostError> {
        self.post_to_rq(|f, rq, bound, pd, max_sge| recvq::post(f, rq, bound, pd, max_sge, chain))
    }

    fn post_recv_buffers(
        &mut self,
        addrs: &[u64],
        len: u32,
        lkey: u32,
        _scratch: &mut RecvChain,
    ) -> std::result::Result<(), PostError> {
        self.post_to_rq(|f, rq, bound, pd, max_sge| recvq::post_buffers(f, rq, bound, pd, max_sge, addrs, len, lkey))
    }
}

impl ShmQp {
    /// `post_recv`'s checks of the QP (it has a receive queue of its own and is out of
    /// RESET), then `post` into that queue, then the flush of what it posted if the QP is in
    /// ERROR (or went there meanwhile).
    #[inline]
    fn post_to_rq(
        &mut self,
        post: impl FnOnce(&Fabric, &RecvRing, &mut recvq::RecvBound, u32, u32) -> std::result::Result<(), PostError>,
    ) -> std::result::Result<(), PostError> {
        let Some((rq, _, _)) = &self.rq else {
            let why = if self.qp_type.is_xrc() {
                "an XRC QP has no receive queue: post receives to the XRC SRQ"
            } else {
                "QP is attached to an SRQ: use post_srq_recv"
            };
            return Err(PostError::new(Errno::EINVAL, 0, why));
        };
        let state = crate::provider::Qp::state(self);
        if !state.accepts_post_recv() {
            return Err(PostError::new(Errno::EINVAL, 0, "QP is in RESET"));
        }
        let f = &self.pd.ctx.fabric;
        post(f, rq, &mut self.rq_bound, self.pd.pdn, self.caps.max_recv_sge)?;
        if state == QpState::Error || crate::provider::Qp::state(self) == QpState::Error {
            flush_rq(f, self.slot(), self.qpn);
        }
        Ok(())
    }

    /// Retries this QP's send queue has made (after RNR NAKs or an unresponsive target).
    pub fn retries(&self) -> u64 {
        self.sq.lock().retries
    }

    /// Receive requests posted and not yet consumed (0 with an SRQ).
    pub fn recv_queued(&self) -> usize {
        self.rq.as_ref().map_or(0, |(r, _, _)| r.len() as usize)
    }

    /// The CQ receive completions go to.
    pub fn recv_cqn(&self) -> u32 {
        self.recv_cq.cqn
    }

    /// The QP's own receive queue's single-consumer mode word (`shm::solo`), for tests.
    #[cfg(test)]
    pub(crate) fn rq_solo_mode(&self) -> Option<u64> {
        self.rq.as_ref().map(|(rq, _, _)| rq.solo_mode())
    }
}

#[cfg(test)]
mod tests {
    use crate::shm::unit_context;
    use crate::verbs::{QpCaps, QpType};
    use crate::{Context, Pd, QpInitAttr};

    /// A connected QP's own RQ has a cell to spare (`own_recv_cells`) and reports its cells;
    /// UD keeps its power of two (its ring is twice that, bounded by the count); the device's
    /// `max_qp_wr` bounds the cells.
    #[test]
    fn an_rc_rq_has_a_cell_to_spare_and_reports_it() {
        use crate::Qp;
        let ctx = unit_context("rq-spare");
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(8).unwrap();
        let max = ctx.caps().max_qp_wr;
        for (qp_type, asked, cells) in [
            (QpType::Rc, 1, 2),
            (QpType::Rc, 500, 512),
            (QpType::Rc, 512, 1024),
            (QpType::Uc, 8, 16),
            (QpType::Rc, max, max),
            (QpType::Ud, 512, 512),
        ] {
            let cap = QpCaps { max_recv_wr: asked, ..QpCaps::default() };
            let attr = QpInitAttr { send_cq: &cq, recv_cq: &cq, srq: None, cap, qp_type, sq_sig_all: false };
            let qp = pd.create_qp(&attr).unwrap();
            assert_eq!(qp.caps().max_recv_wr, cells, "{qp_type:?} asking for {asked}");
            assert_eq!(
                qp.rq.as_ref().unwrap().0.capacity(),
                u64::from(cells) * if qp_type == QpType::Ud { 2 } else { 1 }
            );
        }
    }
}

//! Shared receive queues: an MPMC ring of receive requests that any QP attached to it (in any
//! process) consumes, with the limit event.

use super::fabric::Fabric;
use super::layout::*;
use super::recvq;
use super::ring::Ring;
use super::tm::{self, TmView};
use super::wire::RecvRing;
use super::CtxInner;
use crate::verbs::{Errno, Error, OpsChain, PostError, RecvChain, Result, SrqAttr, SrqAttrMask, TmCaps};
use std::sync::atomic::Ordering;
use std::sync::Arc;

pub(crate) struct SrqShared {
    pub(crate) ctx: Arc<CtxInner>,
    pub(crate) idx: usize,
    pub(crate) srqn: u32,
    pub(crate) pd: u32,
    /// Twice `max_wr` cells (see [`ShmSrq`]).
    pub(crate) ring: RecvRing,
    /// Requests the SRQ holds and reports as its `max_wr`: the next power of two above the
    /// requested `max_wr` (`layout::own_recv_cells`: a receiver that keeps what it asked for
    /// posted stays below the count, so its posts do not read `head`, which every take writes).
    pub(crate) max_wr: u32,
    pub(crate) max_sge: u32,
    ring_off: u64,
    ring_len: u64,
    /// Tag list of a tag-matching SRQ, with its arena range.
    pub(crate) tm: Option<(TmView, u64, u64)>,
    /// `max_ops` of a tag-matching SRQ.
    tm_max_ops: u32,
    /// An XRC SRQ's CQ, kept alive while the SRQ may complete on it (its domain and CQ number
    /// are in the slot, where senders read them).
    _xrc_cq: Option<Arc<super::complete::CqShared>>,
}

impl Drop for SrqShared {
    fn drop(&mut self) {
        let f = &self.ctx.fabric;
        // A wedged fabric (its lock held by a live stranger): leave the slot, do not hang.
        if let Ok(l) = f.lock() {
            let s = f.srq_slot(self.idx);
            if s.srqn.load(Ordering::Relaxed) == self.srqn {
                s.srqn.store(0, Ordering::Release);
            }
            drop(l);
        }
        f.free(self.ring_off, self.ring_len);
        if let Some((_, off, len)) = self.tm {
            f.free(off, len);
        }
    }
}

/// A shared receive queue of the `shm` provider.
///
/// Its ring has twice `max_wr` cells, and a post counts the requests not yet claimed by a
/// sender against `max_wr` (`recvq::RecvBound`). Senders of several threads consume an
/// SRQ at once, and one descheduled between claiming a cell and freeing it would otherwise
/// make the ring refuse posts (ENOMEM) with fewer than `max_wr` requests outstanding, once
/// the others had gone round it (seen: the fan-out pipeline on a loaded 2-core machine, its
/// receiver refused with 530 of 1024 posted).
pub struct ShmSrq {
    pub(crate) shared: Arc<SrqShared>,
    bound: recvq::RecvBound,
}

impl ShmSrq {
    pub(crate) fn create(ctx: &Arc<CtxInner>, pd: u32, attr: &SrqAttr) -> Result<ShmSrq> {
        Self::create_with(ctx, pd, attr, None, 0, None)
    }

    /// An XRC SRQ of domain `xrcd` whose receives complete on `cq`.
    pub(crate) fn create_xrc(
        ctx: &Arc<CtxInner>,
        pd: u32,
        attr: &SrqAttr,
        xrcd: u32,
        cq: Arc<super::complete::CqShared>,
    ) -> Result<ShmSrq> {
        Self::create_with(ctx, pd, attr, None, 0, Some((xrcd, cq)))
    }

    /// A tag-matching SRQ whose list operations and tagged receives complete on `cqn`.
    pub(crate) fn create_tm(ctx: &Arc<CtxInner>, pd: u32, attr: &SrqAttr, tm: &TmCaps, cqn: u32) -> Result<ShmSrq> {
        if tm.max_num_tags == 0 || tm.max_num_tags > tm::MAX_TAGS {
            return Err(Error::new(
                Errno::EINVAL,
                format!("max_num_tags {} must be 1..={}", tm.max_num_tags, tm::MAX_TAGS),
            ));
        }
        if tm.max_ops == 0 || tm.max_ops > tm::MAX_TM_OPS {
            return Err(Error::new(Errno::EINVAL, format!("max_ops {} must be 1..={}", tm.max_ops, tm::MAX_TM_OPS)));
        }
        Self::create_with(ctx, pd, attr, Some((tm.max_num_tags, cqn)), tm.max_ops, None)
    }

    fn create_with(
        ctx: &Arc<CtxInner>,
        pd: u32,
        attr: &SrqAttr,
        tm: Option<(u32, u32)>,
        tm_max_ops: u32,
        xrc: Option<(u32, Arc<super::complete::CqShared>)>,
    ) -> Result<ShmSrq> {
        let caps = ctx.caps;
        if attr.max_wr == 0 || attr.max_wr > caps.max_srq_wr {
            return Err(Error::new(
                Errno::EINVAL,
                format!("SRQ max_wr {} must be 1..={}", attr.max_wr, caps.max_srq_wr),
            ));
        }
        if attr.max_sge == 0 || attr.max_sge > caps.max_srq_sge {
            return Err(Error::new(
                Errno::EINVAL,
                format!("SRQ max_sge {} must be 1..={}", attr.max_sge, caps.max_srq_sge),
            ));
        }
        let f = &ctx.fabric;
        let max_wr = super::layout::own_recv_cells(attr.max_wr, caps.max_srq_wr);
        let cap = 2 * max_wr as usize;
        let stride = recv_stride(attr.max_sge);
        let ring_len = Ring::bytes(cap, stride) as u64;
        let ring_off = f.alloc(ring_len)?;
        let ring = match f.init_recv_ring(ring_off, cap, attr.max_sge) {
            Ok(r) => r,
            Err(e) => {
                f.free(ring_off, ring_len);
                return Err(e);
            }
        };
        let tm = match tm {
            None => None,
            Some((max_tags, cqn)) => {
                let len = tm::bytes(max_tags, attr.max_sge);
                let off = match f.alloc(len) {
                    Ok(o) => o,
                    Err(e) => {
                        f.free(ring_off, ring_len);
                        return Err(e);
                    }
                };
                match TmView::init(f, off, max_tags, attr.max_sge, cqn) {
                    Some(v) => Some((v, off, len)),
                    None => {
                        f.free(ring_off, ring_len);
                        f.free(off, len);
                        return Err(Error::new(Errno::EFAULT, "tag list outside the fabric arena"));
                    }
                }
            }
        };
        let l = f.lock()?;
        let claimed = f.claim_slot(
            MAX_SRQ,
            |i| {
                let s = f.srq_slot(i);
                (&s.srqn, &s.gen, s.pid.load(Ordering::Relaxed))
            },
            "SRQ",
        );
        let (idx, gen) = match claimed {
            Ok(v) => v,
            Err(e) => {
                drop(l);
                f.free(ring_off, ring_len);
                if let Some((_, off, len)) = tm {
                    f.free(off, len);
                }
                return Err(e);
            }
        };
        let srqn = make_key(gen, idx, SRQ_IDX_BITS);
        let s = f.srq_slot(idx);
        s.ctx.store(ctx.idx as u32, Ordering::Relaxed);
        s.pid.store(f.pid(), Ordering::Relaxed);
        s.pd.store(pd, Ordering::Relaxed);
        s.cap.store(cap as u32, Ordering::Relaxed);
        s.max_sge.store(attr.max_sge, Ordering::Relaxed);
        s.ring_off.store(ring_off, Ordering::Relaxed);
        // `srq_limit` is "irrelevant for ibv_create_srq" (verbs.h): the limit is armed only by
        // modify_srq with IBV_SRQ_LIMIT.
        s.limit.store(0, Ordering::Relaxed);
        s.tm_off.store(tm.as_ref().map_or(0, |t| t.1), Ordering::Relaxed);
        s.xrcd.store(xrc.as_ref().map_or(0, |x| x.0), Ordering::Relaxed);
        s.cqn.store(xrc.as_ref().map_or(0, |x| x.1.cqn), Ordering::Relaxed);
        s.srqn.store(srqn, Ordering::Release);
        drop(l);
        Ok(ShmSrq {
            shared: Arc::new(SrqShared {
                ctx: ctx.clone(),
                idx,
                srqn,
                pd,
                ring,
                max_wr,
                max_sge: attr.max_sge,
                ring_off,
                ring_len,
                tm,
                tm_max_ops,
                _xrc_cq: xrc.map(|x| x.1),
            }),
            bound: recvq::RecvBound::unclaimed(max_wr),
        })
    }

    /// Requests currently posted and not yet consumed.
    pub fn len(&self) -> usize {
        self.shared.ring.len() as usize
    }

    /// Whether no request is posted.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A view of SRQ `srqn` as a consumer (a sender delivering to a QP attached to it) sees it.
#[derive(Clone, Copy)]
pub(crate) struct SrqView {
    pub srqn: u32,
    pub idx: usize,
    pub pd: u32,
    pub ring: RecvRing,
    /// The tag list of a tag-matching SRQ.
    pub tm: Option<TmView>,
}

pub(crate) fn srq_view(f: &Fabric, srqn: u32) -> Option<SrqView> {
    let idx = key_index(srqn, SRQ_IDX_BITS);
    if idx >= MAX_SRQ {
        return None;
    }
    let s = f.srq_slot(idx);
    if s.srqn.load(Ordering::Acquire) != srqn {
        return None;
    }
    let cap = s.cap.load(Ordering::Relaxed) as usize;
    let max_sge = s.max_sge.load(Ordering::Relaxed).min(recvq::MAX_SGE as u32);
    let ring = f.recv_ring(s.ring_off.load(Ordering::Relaxed), cap, max_sge).ok()?;
    let pd = s.pd.load(Ordering::Relaxed);
    let tm = match s.tm_off.load(Ordering::Relaxed) {
        0 => None,
        off => Some(TmView::attach(f, off)?),
    };
    (s.srqn.load(Ordering::Acquire) == srqn).then_some(SrqView { srqn, idx, pd, ring, tm })
}

impl SrqView {
    /// Takes a request; fires the limit event (once) when the count drops below the armed
    /// limit.
    #[inline]
    pub(crate) fn take(&self, f: &Fabric, out: &mut recvq::RecvEntry) -> bool {
        match self.take_held(f, out) {
            Some(pos) => {
                self.ring.release(pos);
                true
            }
            None => false,
        }
    }

    /// [`SrqView::take`] that keeps the request's cell held until `Ring::release`
    /// (`recvq::pop_held`); returns its position.
    #[inline]
    pub(crate) fn take_held(&self, f: &Fabric, out: &mut recvq::RecvEntry) -> Option<u64> {
        let pos = recvq::pop_held(&self.ring, out)?;
        self.after_take(f);
        Some(pos)
    }

    /// [`SrqView::take_held`] of a run of up to `max` requests claimed with one CAS
    /// ([`recvq::pop_run`]): the first is read into `out`; returns its position and the
    /// run's length. The caller must use every request of the run or hand it back
    /// (`Ring::unclaim`; see `doorbell::srq_take` and `doorbell::return_run`), read the
    /// others with `RecvRing::read_held` and release each. The limit is checked once, after
    /// the whole run.
    #[inline]
    pub(crate) fn take_run_held(&self, f: &Fabric, max: u64, out: &mut recvq::RecvEntry) -> Option<(u64, u64)> {
        let run = recvq::pop_run(&self.ring, max, out)?;
        self.after_take(f);
        Some(run)
    }

    /// Fires the limit event (once) if the requests left are fewer than the armed limit.
    #[inline(always)]
    fn after_take(&self, f: &Fabric) {
        let s = f.srq_slot(self.idx);
        let limit = s.limit.load(Ordering::Relaxed);
        if limit != 0
            && self.ring.len() < limit as u64
            && s.limit.compare_exchange(limit, 0, Ordering::AcqRel, Ordering::Relaxed).is_ok()
        {
            f.post_event(s.ctx.load(Ordering::Relaxed) as usize, super::EVENT_SRQ_LIMIT, self.srqn);
        }
    }
}

impl crate::provider::Srq for ShmSrq {
    fn srq_num(&self) -> u32 {
        self.shared.srqn
    }

    fn post_recv(&mut self, chain: &RecvChain) -> std::result::Result<(), PostError> {
        let sh = &*self.shared;
        recvq::post(&sh.ctx.fabric, &sh.ring, &mut self.bound, sh.pd, sh.max_sge, chain)
    }

    fn post_recv_buffers(
        &mut self,
        addrs: &[u64],
        len: u32,
        lkey: u32,
        _scratch: &mut RecvChain,
    ) -> std::result::Result<(), PostError> {
        let sh = &*self.shared;
        recvq::post_buffers(&sh.ctx.fabric, &sh.ring, &mut self.bound, sh.pd, sh.max_sge, addrs, len, lkey)
    }

    fn modify(&mut self, attr: &SrqAttr, mask: SrqAttrMask) -> Result<()> {
        if mask.contains(SrqAttrMask::MAX_WR) {
            return Err(Error::new(Errno::EOPNOTSUPP, "the shm provider cannot resize an SRQ"));
        }
        if mask.contains(SrqAttrMask::LIMIT) {
            let cap = self.shared.max_wr;
            if attr.srq_limit > cap {
                return Err(Error::new(Errno::EINVAL, format!("SRQ limit {} is above max_wr {cap}", attr.srq_limit)));
            }
            let f = &self.shared.ctx.fabric;
            f.srq_slot(self.shared.idx).limit.store(attr.srq_limit, Ordering::Release);
        }
        Ok(())
    }

    fn post_ops(&mut self, chain: &mut OpsChain) -> std::result::Result<(), PostError> {
        let sh = &*self.shared;
        let Some((tm, _, _)) = &sh.tm else {
            return Err(PostError::new(Errno::EINVAL, 0, "post_srq_ops on an SRQ that is not tag-matching"));
        };
        tm::post_ops(&sh.ctx.fabric, tm, sh.pd, sh.tm_max_ops, chain)
    }

    fn query(&self) -> Result<SrqAttr> {
        let sh = &*self.shared;
        let s = sh.ctx.fabric.srq_slot(sh.idx);
        Ok(SrqAttr { max_wr: sh.max_wr, max_sge: sh.max_sge, srq_limit: s.limit.load(Ordering::Acquire) })
    }
}

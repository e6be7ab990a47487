//! Tag matching in software: the tag list of a tag-matching SRQ lives in the fabric, and the
//! sender's CPU matches an incoming tagged message against it, as a NIC's matching engine
//! would.
//!
//! The list is guarded by a pid lock word (stolen from a dead holder): matching must pick
//! the oldest matching entry and consume it exactly once across all senders, which a short
//! critical section does simply. A word held by a live process for
//! [`LOCK_PATIENCE`](super::fabric::LOCK_PATIENCE) (hung, or a stray write) fails the
//! operation instead of waiting forever. Tag matching is its own path; plain SRQs never touch
//! it.

use super::complete::{cq_ring, push_cqe, Cqe};
use super::fabric::{pid_lock, Fabric, LockStuck};
use super::recvq::{self, MAX_SGE};
use crate::verbs::*;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Most list operations one `post_srq_ops` may carry on `shm`.
pub(crate) const MAX_TM_OPS: u32 = 256;
/// Most tags a list may hold (handles keep the index in 16 bits).
pub(crate) const MAX_TAGS: u32 = 4096;

#[repr(C, align(64))]
pub(crate) struct TmHeader {
    lock: AtomicU32,
    /// Unexpected messages the "device" delivered.
    hw_cnt: AtomicU32,
    /// Unexpected messages software said it handled (TAG_SYNC / IBV_OPS_TM_SYNC).
    sw_cnt: AtomicU32,
    max_tags: AtomicU32,
    max_sge: AtomicU32,
    cqn: AtomicU32,
    next_seq: AtomicU64,
}

const ENTRY_HDR: usize = 48;
const FREE: u32 = 0;
const VALID: u32 = 1;

/// One tag entry: state, generation, age, tag, mask, wr_id, SGE count, SGEs.
#[repr(C)]
struct Entry {
    state: AtomicU32,
    gen: AtomicU32,
    seq: AtomicU64,
    tag: AtomicU64,
    mask: AtomicU64,
    wr_id: AtomicU64,
    n_sge: AtomicU32,
    _pad: u32,
}

const _: () = assert!(std::mem::size_of::<Entry>() == ENTRY_HDR);

/// One scatter entry of a tag entry (the SGEs follow the entry's header).
#[repr(C)]
struct EntrySge {
    addr: AtomicU64,
    length: AtomicU32,
    lkey: AtomicU32,
}

const SGE_LEN: usize = std::mem::size_of::<EntrySge>();
const _: () = assert!(SGE_LEN == 16);

fn stride(max_sge: u32) -> usize {
    ENTRY_HDR + SGE_LEN * max_sge as usize
}

/// Bytes of the tag list of an SRQ.
pub(crate) fn bytes(max_tags: u32, max_sge: u32) -> u64 {
    (std::mem::size_of::<TmHeader>() + max_tags as usize * stride(max_sge)) as u64
}

/// Process-local view of a tag list, geometry checked once against the fabric.
#[derive(Clone, Copy)]
pub(crate) struct TmView {
    base: *mut u8,
    max_tags: u32,
    max_sge: u32,
    pub(crate) cqn: u32,
}

// SAFETY: the view points into the fabric mapping, which outlives it (held next to an
// Arc<Fabric>); all fields it touches are atomics accessed under the list lock.
unsafe impl Send for TmView {}
// SAFETY: as above.
unsafe impl Sync for TmView {}

impl TmView {
    /// Initialises a list at `off` (creator only, before the SRQ is published).
    pub(crate) fn init(f: &Fabric, off: u64, max_tags: u32, max_sge: u32, cqn: u32) -> Option<TmView> {
        let base = f.ptr(off, bytes(max_tags, max_sge))?;
        let v = TmView { base, max_tags, max_sge, cqn };
        let h = v.hdr();
        for w in [&h.lock, &h.hw_cnt, &h.sw_cnt] {
            w.store(0, Ordering::Relaxed);
        }
        h.max_tags.store(max_tags, Ordering::Relaxed);
        h.max_sge.store(max_sge, Ordering::Relaxed);
        h.cqn.store(cqn, Ordering::Relaxed);
        h.next_seq.store(0, Ordering::Relaxed);
        for i in 0..max_tags as usize {
            v.entry(i).state.store(FREE, Ordering::Relaxed);
            v.entry(i).gen.store(0, Ordering::Relaxed);
        }
        Some(v)
    }

    /// A view of the list at `off`, after bounds-checking the geometry read from the fabric.
    pub(crate) fn attach(f: &Fabric, off: u64) -> Option<TmView> {
        let hp = f.ptr(off, std::mem::size_of::<TmHeader>() as u64)?;
        // SAFETY: the header range is inside the arena (checked); it holds only atomics.
        let h = unsafe { &*(hp as *const TmHeader) };
        let (max_tags, max_sge) = (h.max_tags.load(Ordering::Relaxed), h.max_sge.load(Ordering::Relaxed));
        if max_tags > MAX_TAGS || max_sge as usize > MAX_SGE {
            return None;
        }
        let base = f.ptr(off, bytes(max_tags, max_sge))?;
        Some(TmView { base, max_tags, max_sge, cqn: h.cqn.load(Ordering::Relaxed) })
    }

    fn hdr(&self) -> &TmHeader {
        // SAFETY: `base` starts a checked range holding the header; atomics only.
        unsafe { &*(self.base as *const TmHeader) }
    }

    fn entry(&self, i: usize) -> &Entry {
        debug_assert!(i < self.max_tags as usize);
        // SAFETY: i < max_tags, and the checked range holds max_tags entries after the header.
        unsafe { &*(self.base.add(std::mem::size_of::<TmHeader>() + i * stride(self.max_sge)) as *const Entry) }
    }

    fn sge(&self, i: usize, k: usize) -> &EntrySge {
        debug_assert!(k < self.max_sge as usize);
        // SAFETY: SGE k < max_sge of entry i < max_tags lies inside the checked range, 8-byte
        // aligned (entries and their header are multiples of 8); atomics only.
        unsafe {
            &*(self.base.add(std::mem::size_of::<TmHeader>() + i * stride(self.max_sge) + ENTRY_HDR + k * SGE_LEN)
                as *const EntrySge)
        }
    }

    fn in_sync(&self) -> bool {
        let h = self.hdr();
        h.hw_cnt.load(Ordering::Relaxed) == h.sw_cnt.load(Ordering::Relaxed)
    }

    /// Finds and consumes the oldest entry matching `tag` (if matching is on). Copies its
    /// buffers into `out`. Fails when the list's lock stays held by a live process.
    pub(crate) fn take_match(
        &self,
        f: &Fabric,
        tag: u64,
        out: &mut recvq::RecvEntry,
    ) -> std::result::Result<bool, LockStuck> {
        let _l = pid_lock(&self.hdr().lock, f.pid())?;
        if !self.in_sync() {
            return Ok(false);
        }
        let mut best: Option<(usize, u64)> = None;
        for i in 0..self.max_tags as usize {
            let e = self.entry(i);
            if e.state.load(Ordering::Relaxed) != VALID {
                continue;
            }
            if tag & e.mask.load(Ordering::Relaxed) == e.tag.load(Ordering::Relaxed) {
                let seq = e.seq.load(Ordering::Relaxed);
                if best.is_none_or(|(_, s)| seq < s) {
                    best = Some((i, seq));
                }
            }
        }
        let Some((i, _)) = best else { return Ok(false) };
        let e = self.entry(i);
        out.wr_id = e.wr_id.load(Ordering::Relaxed);
        out.n = (e.n_sge.load(Ordering::Relaxed) as usize).min(self.max_sge as usize);
        for k in 0..out.n {
            let e = self.sge(i, k);
            out.sges[k] = Sge::new(
                e.addr.load(Ordering::Relaxed),
                e.length.load(Ordering::Relaxed),
                e.lkey.load(Ordering::Relaxed),
            );
        }
        // Consumed: the handle goes stale (a TAG_DEL of it gets IBV_WC_TM_ERR).
        e.gen.fetch_add(1, Ordering::Relaxed);
        e.state.store(FREE, Ordering::Relaxed);
        Ok(true)
    }

    /// Counts one unexpected message; returns whether software must now sync. A wedged lock
    /// loses the count (the message itself is delivered).
    pub(crate) fn count_unexpected(&self, f: &Fabric) -> bool {
        let Ok(_l) = pid_lock(&self.hdr().lock, f.pid()) else { return false };
        self.hdr().hw_cnt.fetch_add(1, Ordering::Relaxed);
        true
    }
}

/// Why a list operation failed on a wedged lock.
const TM_LOCK_STUCK: &str = "the tag list's lock stayed held by a live process for 5 s (hung, or a stray write \
     into the fabric); the SRQ is unusable";

/// Completion of a list operation on the SRQ's CQ.
fn complete(f: &Fabric, v: &TmView, wr: &OpsWr, status: WcStatus, sync_req: bool) {
    let Some(ring) = cq_ring(f, v.cqn) else { return };
    let opcode = match wr.opcode {
        OpsOpcode::TagAdd => WcOpcode::TmAdd,
        OpsOpcode::TagDel => WcOpcode::TmDel,
        OpsOpcode::TagSync => WcOpcode::TmSync,
    };
    let mut wc = WorkCompletion { wr_id: wr.wr_id, status, opcode, ..Default::default() };
    if sync_req {
        wc.wc_flags |= WcFlags::TM_SYNC_REQ;
    }
    push_cqe(f, &ring, &mut 0, v.cqn, &Cqe { wc, retire: None, solicited: false });
}

/// `ibv_post_srq_ops` on a tag-matching SRQ of protection domain `pd`.
pub(crate) fn post_ops(
    f: &Fabric,
    v: &TmView,
    pd: u32,
    max_ops: u32,
    chain: &mut OpsChain,
) -> std::result::Result<(), PostError> {
    let mut sges = [Sge::default(); MAX_SGE];
    for i in 0..chain.len() {
        // List operations complete synchronously here, so the only ones outstanding are
        // those of this call.
        if i >= max_ops as usize {
            return Err(PostError::new(Errno::ENOMEM, i, "more list operations than max_ops"));
        }
        let wr = chain.wrs()[i];
        let n = chain.sges(i).len();
        if n > v.max_sge as usize {
            return Err(PostError::new(Errno::EINVAL, i, "more SGEs than the SRQ's max_sge"));
        }
        sges[..n].copy_from_slice(chain.sges(i));
        let mut status = WcStatus::Success;
        let h = v.hdr();
        let stuck = |_| PostError::new(Errno::ETIMEDOUT, i, TM_LOCK_STUCK);
        let lock = pid_lock(&h.lock, f.pid()).map_err(stuck)?;
        match wr.opcode {
            OpsOpcode::TagAdd => {
                drop(lock);
                recvq::validate(f, pd, v.max_sge, &sges[..n], i)?;
                let lock = pid_lock(&h.lock, f.pid()).map_err(stuck)?;
                let Some(idx) = (0..v.max_tags as usize).find(|&k| v.entry(k).state.load(Ordering::Relaxed) == FREE)
                else {
                    return Err(PostError::new(Errno::ENOMEM, i, "tag list full (max_num_tags entries in use)"));
                };
                let e = v.entry(idx);
                let gen = e.gen.load(Ordering::Relaxed) & 0xffff;
                e.seq.store(h.next_seq.fetch_add(1, Ordering::Relaxed), Ordering::Relaxed);
                e.tag.store(wr.tag, Ordering::Relaxed);
                e.mask.store(wr.mask, Ordering::Relaxed);
                e.wr_id.store(wr.recv_wr_id, Ordering::Relaxed);
                e.n_sge.store(n as u32, Ordering::Relaxed);
                for (k, s) in sges[..n].iter().enumerate() {
                    let e = v.sge(idx, k);
                    e.addr.store(s.addr, Ordering::Relaxed);
                    e.length.store(s.length, Ordering::Relaxed);
                    e.lkey.store(s.lkey, Ordering::Relaxed);
                }
                e.state.store(VALID, Ordering::Relaxed);
                chain.wrs_mut()[i].handle = gen << 16 | idx as u32;
                drop(lock);
            }
            OpsOpcode::TagDel => {
                let idx = (wr.handle & 0xffff) as usize;
                if idx >= v.max_tags as usize {
                    return Err(PostError::new(Errno::EINVAL, i, "TAG_DEL of a handle no TAG_ADD returned"));
                }
                let e = v.entry(idx);
                if e.state.load(Ordering::Relaxed) == VALID && e.gen.load(Ordering::Relaxed) & 0xffff == wr.handle >> 16
                {
                    e.gen.fetch_add(1, Ordering::Relaxed);
                    e.state.store(FREE, Ordering::Relaxed);
                } else {
                    // Consumed by a message (or already deleted): "Operation may fail due to
                    // concurrent tag consumption".
                    status = WcStatus::TmErr;
                }
                drop(lock);
            }
            OpsOpcode::TagSync => drop(lock),
        }
        let lock = pid_lock(&h.lock, f.pid()).map_err(stuck)?;
        if wr.flags.contains(OpsFlags::TM_SYNC) {
            h.sw_cnt.store(wr.unexpected_cnt, Ordering::Relaxed);
        }
        let sync_req = !v.in_sync();
        drop(lock);
        if wr.flags.contains(OpsFlags::SIGNALED) || status != WcStatus::Success {
            complete(f, v, &wr, status, sync_req);
        }
    }
    Ok(())
}

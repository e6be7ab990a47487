//! Protection domains, fabric memory regions, registered MRs and key lookup.

use super::fabric::{Fabric, SlotRef};
use super::layout::*;
use super::CtxInner;
use crate::verbs::{AccessFlags, Errno, Error, Result};
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

/// A protection domain of the `shm` provider.
pub struct ShmPd {
    pub(crate) inner: Arc<PdInner>,
}

pub(crate) struct PdInner {
    pub(crate) ctx: Arc<CtxInner>,
    pub(crate) pdn: u32,
}

/// Memory carved from a fabric's arena: every attached process can map it, so it can be
/// registered and used as a peer's DMA target. Cloning shares the same bytes.
#[derive(Clone)]
pub struct ShmRegion {
    pub(crate) inner: Arc<RegionInner>,
}

pub(crate) struct RegionInner {
    ctx: Arc<CtxInner>,
    pub(crate) off: u64,
    len: u64,
    ptr: *mut u8,
}

// SAFETY: the bytes are shared DMA memory, never exposed as references (see MemRegion).
unsafe impl Send for RegionInner {}
// SAFETY: as above.
unsafe impl Sync for RegionInner {}

impl ShmRegion {
    pub(crate) fn alloc(ctx: &Arc<CtxInner>, len: usize) -> Result<ShmRegion> {
        if len == 0 {
            return Err(Error::new(Errno::EINVAL, "region length must be > 0"));
        }
        let off = ctx.fabric.alloc(len as u64)?;
        let ptr = ctx
            .fabric
            .ptr(off, len as u64)
            .ok_or_else(|| Error::new(Errno::EFAULT, "arena range outside the fabric"))?;
        // SAFETY: freshly allocated arena bytes, ours alone until published by registration.
        unsafe { std::ptr::write_bytes(ptr, 0, len) };
        Ok(ShmRegion { inner: Arc::new(RegionInner { ctx: ctx.clone(), off, len: len as u64, ptr }) })
    }

    /// Offset of the region in its fabric.
    pub fn fabric_offset(&self) -> u64 {
        self.inner.off
    }
}

impl Drop for RegionInner {
    fn drop(&mut self) {
        self.ctx.fabric.free(self.off, self.len);
    }
}

impl crate::provider::MemRegion for ShmRegion {
    fn as_ptr(&self) -> *mut u8 {
        self.inner.ptr
    }
    fn len(&self) -> usize {
        self.inner.len as usize
    }
}

/// A registered memory region of the `shm` provider.
pub struct ShmMr {
    pd: Arc<PdInner>,
    _region: ShmRegion,
    idx: usize,
    key: u32,
    va: u64,
    len: u64,
}

impl ShmMr {
    pub(crate) fn register(
        pd: &Arc<PdInner>,
        region: &ShmRegion,
        offset: usize,
        len: usize,
        access: AccessFlags,
    ) -> Result<ShmMr> {
        let f = &pd.ctx.fabric;
        if !Arc::ptr_eq(&region.inner.ctx.fabric, &pd.ctx.fabric) {
            return Err(Error::new(Errno::EINVAL, "region belongs to another fabric"));
        }
        if len == 0 || offset.checked_add(len).is_none_or(|e| e as u64 > region.inner.len) {
            return Err(Error::new(
                Errno::EINVAL,
                format!("MR range {offset}+{len} is empty or outside the {}-byte region", region.inner.len),
            ));
        }
        if access.intersects(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC)
            && !access.contains(AccessFlags::LOCAL_WRITE)
        {
            return Err(Error::new(
                Errno::EINVAL,
                "REMOTE_WRITE and REMOTE_ATOMIC require LOCAL_WRITE (ibv_reg_mr(3))",
            ));
        }
        let off = region.inner.off + offset as u64;
        let va = region.inner.ptr as u64 + offset as u64;
        let _l = f.lock()?;
        let (idx, gen) = claim_mr_slot(f)?;
        let key = mr_key(gen, idx, 0);
        let s = f.mr_slot(idx);
        s.kind.store(KIND_MR, Ordering::Relaxed);
        s.pd.store(pd.pdn, Ordering::Relaxed);
        s.ctx.store(pd.ctx.idx as u32, Ordering::Relaxed);
        s.access.store(access.bits(), Ordering::Relaxed);
        s.va.store(va, Ordering::Relaxed);
        s.off.store(off, Ordering::Relaxed);
        s.len.store(len as u64, Ordering::Relaxed);
        s.key.store(key, Ordering::Release);
        changed(s);
        Ok(ShmMr { pd: pd.clone(), _region: region.clone(), idx, key, va, len: len as u64 })
    }
}

impl Drop for ShmMr {
    fn drop(&mut self) {
        let f = &self.pd.ctx.fabric;
        // A wedged fabric (its lock held by a live stranger): leave the slot, do not hang.
        let Ok(_l) = f.lock() else { return };
        let s = f.mr_slot(self.idx);
        if s.key.load(Ordering::Relaxed) == self.key {
            s.key.store(0, Ordering::Release);
            changed(s);
        }
    }
}

impl crate::provider::Mr for ShmMr {
    fn lkey(&self) -> u32 {
        self.key
    }
    fn rkey(&self) -> u32 {
        self.key
    }
    fn addr(&self) -> u64 {
        self.va
    }
    fn len(&self) -> usize {
        self.len as usize
    }
}

/// Claims a free slot of the MR table (shared by MRs and windows) under the fabric lock the
/// caller holds. Slots are reclaimed with their context: the owner's pid is found through it.
fn claim_mr_slot(f: &Fabric) -> Result<(usize, u32)> {
    f.claim_slot(
        MAX_MR,
        |i| {
            let s = f.mr_slot(i);
            let ctx = s.ctx.load(Ordering::Relaxed) as usize;
            let pid = if ctx < MAX_CTX { f.ctx_slot(ctx).pid.load(Ordering::Relaxed) } else { 0 };
            (&s.key, &s.gen, pid)
        },
        "MR/MW",
    )
}

/// Ends a change of MR slot `s` (under the fabric lock, after its last store): bumps its
/// epoch, so that every [`MrCache`] holding a view of it looks it up again. Release: a cache
/// that reads the new epoch then reads the slot as changed.
fn changed(s: &MrSlot) {
    s.epoch.fetch_add(1, Ordering::Release);
}

/// One key's [`MrView`], kept across posts (a QP's send lkeys, the receive lkeys its
/// messages land in, a receive queue's lkeys) and used again while the slot's epoch
/// (`MrSlot::epoch`) reads what it read when the view was taken: one load instead of
/// [`mr_lookup`]'s seven and its checks. Only views that passed the owner's constant checks
/// are kept (`MrCache::get`'s `ok`), so a hit skips those too.
///
/// The view is still the key's registration while the epoch is unchanged: every change of
/// the slot (deregistration, a new registration in it, a window's bind or invalidation)
/// bumps the epoch after its last store, and the epoch is read before the key and fields
/// when the view is taken (`fill`): a view read after a change therefore holds that change's
/// epoch or a later one, never an earlier one. A post that races a deregistration of its MR
/// may still use it, as one that started just before would have (the caller's error, as on a
/// NIC); a post after `ibv_dereg_mr` returned never does. The key's own 12-bit generation
/// could not vouch for this: 4,095 re-registrations of a slot between two posts make a stale
/// key match again.
pub(crate) struct MrCache {
    /// The key of `view`.
    key: u32,
    /// The slot's epoch `view` was taken at; `u64::MAX` (an epoch no slot reaches) while
    /// the cache holds nothing.
    epoch: u64,
    /// The key's slot, whose epoch a hit compares (held, like the cache, next to what keeps
    /// the fabric mapped); [`NO_SLOT`] while empty.
    slot: SlotRef<MrSlot>,
    /// The key's view, which passed the checks of the `get` that took it.
    view: MrView,
}

/// The slot an empty [`MrCache`] reads: its epoch (0) is never the empty cache's (`u64::MAX`),
/// so an empty cache misses whatever key it is asked for, key 0 included.
static NO_SLOT: MrSlot = MrSlot {
    key: AtomicU32::new(0),
    pd: AtomicU32::new(0),
    ctx: AtomicU32::new(0),
    access: AtomicU32::new(0),
    va: AtomicU64::new(0),
    off: AtomicU64::new(0),
    len: AtomicU64::new(0),
    gen: AtomicU32::new(0),
    kind: AtomicU32::new(0),
    epoch: AtomicU64::new(0),
};

impl Default for MrCache {
    fn default() -> MrCache {
        let view = MrView { pd: 0, access: AccessFlags::empty(), va: 0, off: 0, len: 0, window: true, idx: 0 };
        MrCache { key: 0, epoch: u64::MAX, slot: SlotRef::from_static(&NO_SLOT), view }
    }
}

impl MrCache {
    /// Key `key`'s view, from the cache while its slot is unchanged, else looked up
    /// ([`mr_lookup`]) and kept if `ok` accepts it; `None` for an unknown key or one that
    /// `ok` refuses. `ok` must be the same check at every call on one cache (it is not run on
    /// a hit). A reference: copying the view out cost ~10 instructions a call.
    #[inline(always)]
    pub(crate) fn get(&mut self, f: &Fabric, key: u32, ok: impl Fn(&MrView) -> bool) -> Option<&MrView> {
        if key == self.key && self.slot.get().epoch.load(Ordering::Acquire) == self.epoch {
            return Some(&self.view);
        }
        self.fill(f, key, ok)
    }

    /// The view [`MrCache::get`] last returned for `key`, without reading the slot's epoch:
    /// for the later WRs of the post list whose first WR's `get` vouched for it (the list is
    /// one doorbell; a change during it lands as if after it).
    #[inline(always)]
    pub(crate) fn again(&self, key: u32) -> Option<&MrView> {
        (key == self.key).then_some(&self.view)
    }

    /// [`MrCache::get`]'s miss: the epoch, then the lookup (see the type's docs for why in
    /// that order). Out of line: a hit's caller keeps no registers for it.
    #[inline(never)]
    fn fill(&mut self, f: &Fabric, key: u32, ok: impl Fn(&MrView) -> bool) -> Option<&MrView> {
        let idx = mr_key_index(key);
        if idx >= MAX_MR {
            return None;
        }
        let slot = f.mr_slot_ref(idx);
        let epoch = slot.get().epoch.load(Ordering::Acquire);
        let v = mr_lookup(f, key).filter(|v| ok(v))?;
        *self = MrCache { key, epoch, slot, view: v };
        Some(&self.view)
    }
}

/// A consistent snapshot of an MR slot.
#[derive(Clone, Copy)]
pub(crate) struct MrView {
    pub pd: u32,
    pub access: AccessFlags,
    va: u64,
    off: u64,
    len: u64,
    /// A memory window: usable as an rkey, never as an lkey.
    pub window: bool,
    idx: usize,
}

pub(crate) const KIND_MR: u32 = 0;
pub(crate) const KIND_MW: u32 = 1;

/// Looks up key `key` (an lkey or rkey). `None` for unknown or stale keys.
#[inline(always)]
pub(crate) fn mr_lookup(f: &Fabric, key: u32) -> Option<MrView> {
    let idx = mr_key_index(key);
    if key == 0 || idx >= MAX_MR {
        return None;
    }
    let s = f.mr_slot(idx);
    if s.key.load(Ordering::Acquire) != key {
        return None;
    }
    let v = MrView {
        pd: s.pd.load(Ordering::Relaxed),
        access: AccessFlags::from_bits_truncate(s.access.load(Ordering::Relaxed)),
        va: s.va.load(Ordering::Relaxed),
        off: s.off.load(Ordering::Relaxed),
        len: s.len.load(Ordering::Relaxed),
        window: s.kind.load(Ordering::Relaxed) == KIND_MW,
        idx,
    };
    fence(Ordering::Acquire);
    (s.key.load(Ordering::Relaxed) == key).then_some(v)
}

impl MrView {
    /// Pointer to `[addr, addr+len)` in this process, if the range is inside the MR (and the
    /// MR inside the fabric). ZERO_BASED MRs take offsets instead of addresses.
    #[inline(always)]
    pub(crate) fn translate(&self, f: &Fabric, addr: u64, len: u64) -> Option<*mut u8> {
        let rel = if self.access.contains(AccessFlags::ZERO_BASED) { addr } else { addr.checked_sub(self.va)? };
        if rel.checked_add(len)? > self.len {
            return None;
        }
        f.ptr(self.off + rel, len)
    }

    /// The addresses `addr` for which [`MrView::translate`]`(f, addr, len)` is `Some`, as an
    /// inclusive range; `None` when there are none. A batch of buffers of one length in one
    /// MR (a worker's receive refill) is then checked with two compares per address.
    pub(crate) fn addr_range(&self, f: &Fabric, len: u64) -> Option<(u64, u64)> {
        // `translate` takes `rel` with `rel + len <= self.len` and `f.ptr(self.off + rel, len)`.
        let (f_lo, f_hi) = f.offset_range(len)?;
        let rel_lo = f_lo.saturating_sub(self.off);
        let rel_hi = self.len.checked_sub(len)?.min(f_hi.checked_sub(self.off)?);
        if rel_lo > rel_hi {
            return None;
        }
        let base = if self.access.contains(AccessFlags::ZERO_BASED) { 0 } else { self.va };
        // Saturating at the top: an address above `base + rel_hi` does not exist then.
        Some((base.checked_add(rel_lo)?, base.saturating_add(rel_hi)))
    }

    /// Fabric offset of `addr` (for remote atomics), if `[addr, addr+len)` is inside the MR.
    pub(crate) fn fabric_offset(&self, addr: u64, len: u64) -> Option<u64> {
        let rel = if self.access.contains(AccessFlags::ZERO_BASED) { addr } else { addr.checked_sub(self.va)? };
        if rel.checked_add(len)? > self.len {
            return None;
        }
        Some(self.off + rel)
    }
}

/// A type-2 memory window of the `shm` provider: an rkey onto part of an MR, bound and
/// invalidated through the send queue (BIND_MW, LOCAL_INV, SEND_WITH_INV).
pub struct ShmMw {
    pd: Arc<PdInner>,
    idx: usize,
}

impl ShmMw {
    pub(crate) fn alloc(pd: &Arc<PdInner>) -> Result<ShmMw> {
        let f = &pd.ctx.fabric;
        let _l = f.lock()?;
        let (idx, gen) = claim_mr_slot(f)?;
        let s = f.mr_slot(idx);
        s.kind.store(KIND_MW, Ordering::Relaxed);
        s.pd.store(pd.pdn, Ordering::Relaxed);
        s.ctx.store(pd.ctx.idx as u32, Ordering::Relaxed);
        s.access.store(0, Ordering::Relaxed);
        s.len.store(0, Ordering::Relaxed);
        s.key.store(mr_key(gen, idx, 0), Ordering::Release);
        changed(s);
        Ok(ShmMw { pd: pd.clone(), idx })
    }

    /// The window's current rkey (its low 8 bits change with each bind the consumer chooses).
    pub fn rkey(&self) -> u32 {
        self.pd.ctx.fabric.mr_slot(self.idx).key.load(Ordering::Acquire)
    }
}

impl Drop for ShmMw {
    fn drop(&mut self) {
        let f = &self.pd.ctx.fabric;
        // As for `ShmMr`.
        let Ok(_l) = f.lock() else { return };
        let s = f.mr_slot(self.idx);
        if s.kind.load(Ordering::Relaxed) == KIND_MW && s.pd.load(Ordering::Relaxed) == self.pd.pdn {
            s.key.store(0, Ordering::Release);
            changed(s);
        }
    }
}

/// Binds window `mw_rkey` (in PD `pd`) to `[addr, addr+len)` of MR `mr_lkey` with `access`,
/// giving it rkey `new_rkey`. Returns false on any violation (IBV_WC_MW_BIND_ERR).
pub(crate) fn bind_mw(f: &Fabric, pd: u32, b: &crate::verbs::MwBindInfo) -> bool {
    let (mw_rkey, new_rkey, mr_lkey, addr, len, access) =
        (b.mw_rkey, b.new_rkey, b.mr_lkey, b.addr, b.length, b.access);
    let Some(mw) = mr_lookup(f, mw_rkey) else { return false };
    let Some(mr) = mr_lookup(f, mr_lkey) else { return false };
    if !mw.window || mr.window || mw.pd != pd || mr.pd != pd || mr_key_index(new_rkey) != mw.idx || new_rkey == 0 {
        return false;
    }
    if !mr.access.contains(AccessFlags::MW_BIND) || mr.fabric_offset(addr, len).is_none() {
        return false;
    }
    if access.intersects(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC)
        && !mr.access.contains(AccessFlags::LOCAL_WRITE)
    {
        return false;
    }
    let off = mr.fabric_offset(addr, len).unwrap_or(0);
    let s = f.mr_slot(mw.idx);
    // A wedged fabric fails the bind (MW_BIND_ERR) rather than hang the poster.
    let Ok(_l) = f.lock() else { return false };
    if s.key.load(Ordering::Relaxed) != mw_rkey {
        return false;
    }
    // Unpublish, rewrite, publish under the new key (readers re-check the key).
    s.key.store(0, Ordering::Relaxed);
    fence(Ordering::Release);
    s.va.store(addr, Ordering::Relaxed);
    s.off.store(off, Ordering::Relaxed);
    s.len.store(len, Ordering::Relaxed);
    s.access.store(
        (access & (AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC)).bits(),
        Ordering::Relaxed,
    );
    s.key.store(new_rkey, Ordering::Release);
    changed(s);
    true
}

/// Invalidates window `rkey` of PD `pd` (LOCAL_INV, SEND_WITH_INV): it keeps its key but grants
/// nothing until bound again. False if `rkey` is not a valid window of `pd`.
pub(crate) fn invalidate(f: &Fabric, pd: u32, rkey: u32) -> bool {
    let Some(mw) = mr_lookup(f, rkey) else { return false };
    if !mw.window || mw.pd != pd {
        return false;
    }
    let s = f.mr_slot(mw.idx);
    // As in `bind_mw`.
    let Ok(_l) = f.lock() else { return false };
    if s.key.load(Ordering::Relaxed) != rkey {
        return false;
    }
    s.len.store(0, Ordering::Release);
    s.access.store(0, Ordering::Release);
    changed(s);
    true
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// `addr_range` is exactly the set of addresses `translate` accepts, at every edge: the
    /// MR's ends, the fabric's tables and its end, ZERO_BASED offsets, lengths longer than
    /// the MR, and MRs whose records point outside the fabric (a corrupt table).
    #[test]
    fn addr_range_is_what_translate_accepts() {
        let ctx = crate::shm::unit_context("mr-addr-range");
        let f = &*ctx.inner.fabric;
        let (f_lo, f_hi) = f.offset_range(0).unwrap();
        let size = f_hi;
        let mut views = Vec::new();
        for zero in [false, true] {
            let access = if zero { AccessFlags::ZERO_BASED } else { AccessFlags::LOCAL_WRITE };
            for (va, off, len) in [
                (0x7000_0000u64, f_lo, 4096u64),
                (0x7000_0000, size - 4096, 4096),
                (0x7000_0000, size - 100, 4096),
                (0x7000_0000, f_lo - 64, 4096),
                (0, f_lo + 128, 1 << 20),
                (u64::MAX - 1000, f_lo, 4096),
                (0x1000, u64::MAX - 10, 64),
            ] {
                views.push(MrView { pd: 1, access, va, off, len, window: false, idx: 0 });
            }
        }
        for mr in &views {
            for len in [1u64, 64, 4095, 4096, 4097, 1 << 31] {
                let range = mr.addr_range(f, len);
                let base = if mr.access.contains(AccessFlags::ZERO_BASED) { 0 } else { mr.va };
                let mut probes = vec![0, 1, u64::MAX, u64::MAX - len];
                for edge in [base, base.wrapping_add(mr.len).wrapping_sub(len), base.wrapping_add(mr.len)] {
                    for d in [-65i64, -64, -1, 0, 1, 64] {
                        probes.push(edge.wrapping_add_signed(d));
                    }
                }
                if let Some((lo, hi)) = range {
                    probes.extend([lo, hi, lo.wrapping_sub(1), hi.wrapping_add(1)]);
                }
                for a in probes {
                    // `translate` adds the MR's offset unchecked: the table's sane values only.
                    if mr.off.checked_add(mr.len).is_none() {
                        assert!(range.is_none_or(|(lo, hi)| a < lo || a > hi) || mr.translate(f, a, len).is_some());
                        continue;
                    }
                    let inside = range.is_some_and(|(lo, hi)| lo <= a && a <= hi);
                    assert_eq!(
                        inside,
                        mr.translate(f, a, len).is_some(),
                        "addr {a:#x} len {len} mr {:?}",
                        (mr.va, mr.off, mr.len, mr.access)
                    );
                }
            }
        }
    }

    /// `MrCache` never hands out a view of a slot that changed since it took it: not after
    /// a deregistration, not after a new registration in the slot, and not after 4,095 of
    /// them, when the new MR's key is the old one again (the key's 12-bit generation wraps)
    /// but its range is another: a cache checked by the key alone would return the old range.
    #[test]
    fn mr_cache_follows_every_change_of_the_slot() {
        use crate::provider::{Context, Mr, Pd};
        let ctx = crate::shm::unit_context("mr-cache");
        let f = &*ctx.inner.fabric;
        let pd = ctx.alloc_pd().unwrap();
        let region = ctx.alloc_region(8192).unwrap();
        let mut cache = MrCache::default();
        let any = |_: &MrView| true;
        assert!(cache.get(f, 0, any).is_none(), "key 0 names no MR, even in an empty cache");
        let first = pd.reg_mr(&region, 0, 4096, AccessFlags::LOCAL_WRITE).unwrap();
        let key = first.lkey();
        assert_eq!(cache.get(f, key, any).map(|v| v.len), Some(4096));
        assert_eq!(cache.get(f, key, any).map(|v| v.len), Some(4096), "a hit");
        drop(first);
        assert!(cache.get(f, key, any).is_none(), "deregistered");
        assert!(cache.again(key).is_some(), "`again` does not read the slot: one post list only");
        // Register in the same slot until the key comes back, with another length.
        let mut n = 0;
        let again = loop {
            let mr = pd.reg_mr(&region, 0, 8192, AccessFlags::LOCAL_WRITE).unwrap();
            n += 1;
            if mr.lkey() == key {
                break mr;
            }
            assert!(n < 5000, "the key did not come back");
        };
        assert_eq!(n, 4095, "the key's generation wraps after 4,095 registrations of one slot");
        assert_eq!(cache.get(f, key, any).map(|v| v.len), Some(8192), "the new registration, not the old view");
        // A view `ok` refuses is not kept.
        let mut other = MrCache::default();
        assert!(other.get(f, key, |v| v.len == 4096).is_none());
        assert!(other.again(key).is_none());
        drop(again);
        assert!(cache.get(f, key, any).is_none());
    }
}

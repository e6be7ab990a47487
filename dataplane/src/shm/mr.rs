//! Protection domains, fabric memory regions, registered MRs and key lookup.

use super::fabric::Fabric;
use super::layout::*;
use super::CtxInner;
use crate::verbs::{AccessFlags, Errno, Error, Result};
use std::sync::atomic::{fence, Ordering};
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
        let _l = f.lock();
        let (idx, gen) = f.claim_slot(
            MAX_MR,
            |i| {
                let s = f.mr_slot(i);
                // MRs are reclaimed with their context: the pid is checked through it.
                let ctx = s.ctx.load(Ordering::Relaxed) as usize;
                let pid = if ctx < MAX_CTX { f.ctx_slot(ctx).pid.load(Ordering::Relaxed) } else { 0 };
                (&s.key, &s.gen, pid)
            },
            "MR",
        )?;
        let key = make_key(gen, idx, MR_IDX_BITS);
        let s = f.mr_slot(idx);
        s.pd.store(pd.pdn, Ordering::Relaxed);
        s.ctx.store(pd.ctx.idx as u32, Ordering::Relaxed);
        s.access.store(access.bits(), Ordering::Relaxed);
        s.va.store(va, Ordering::Relaxed);
        s.off.store(off, Ordering::Relaxed);
        s.len.store(len as u64, Ordering::Relaxed);
        s.key.store(key, Ordering::Release);
        Ok(ShmMr { pd: pd.clone(), _region: region.clone(), idx, key, va, len: len as u64 })
    }
}

impl Drop for ShmMr {
    fn drop(&mut self) {
        let f = &self.pd.ctx.fabric;
        let _l = f.lock();
        let s = f.mr_slot(self.idx);
        if s.key.load(Ordering::Relaxed) == self.key {
            s.key.store(0, Ordering::Release);
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

/// A consistent snapshot of an MR slot.
#[derive(Clone, Copy)]
pub(crate) struct MrView {
    pub pd: u32,
    pub access: AccessFlags,
    va: u64,
    off: u64,
    len: u64,
}

/// Looks up key `key` (an lkey or rkey). `None` for unknown or stale keys.
#[inline]
pub(crate) fn mr_lookup(f: &Fabric, key: u32) -> Option<MrView> {
    let idx = key_index(key, MR_IDX_BITS);
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
    };
    fence(Ordering::Acquire);
    (s.key.load(Ordering::Relaxed) == key).then_some(v)
}

impl MrView {
    /// Pointer to `[addr, addr+len)` in this process, if the range is inside the MR (and the
    /// MR inside the fabric). ZERO_BASED MRs take offsets instead of addresses.
    #[inline]
    pub(crate) fn translate(&self, f: &Fabric, addr: u64, len: u64) -> Option<*mut u8> {
        let rel = if self.access.contains(AccessFlags::ZERO_BASED) { addr } else { addr.checked_sub(self.va)? };
        if rel.checked_add(len)? > self.len {
            return None;
        }
        f.ptr(self.off + rel, len)
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

//! The four AF_XDP rings, single-producer single-consumer queues shared with the kernel.
//!
//! Each ring is a mapping with a producer index, a consumer index, a flags word and a power of
//! two of descriptors. We produce into the fill and TX rings and consume the RX and
//! completion rings. Memory orderings (as `libxdp`'s `xsk.h`): the producer writes its
//! descriptors, then publishes the producer index with a release store; the consumer reads
//! the producer index with an acquire load before reading descriptors, and hands slots back
//! with a release store of the consumer index after it has read them. Each side caches the
//! other's index and re-reads it only when the cache says empty (or full).

use super::sys::{RingMap, XdpRingOffset};
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU32, Ordering};

/// A mapped ring of `T` descriptors (`u64` UMEM addresses for fill and completion,
/// [`super::sys::XdpDesc`] for RX and TX).
pub struct Ring<T: Copy> {
    /// Kept for its lifetime: the pointers below are into it.
    _map: RingMap,
    producer: *const AtomicU32,
    consumer: *const AtomicU32,
    flags: *const AtomicU32,
    desc: *mut T,
    mask: u32,
    /// Our own index (producer index for a producer ring, consumer index for a consumer ring).
    local: u32,
    /// The other side's index as last read.
    cached: u32,
    _t: PhantomData<T>,
}

// SAFETY: the ring's pointers are into `map`, which it owns; the ring is used by one thread
// at a time (its owner holds it behind `&mut`).
unsafe impl<T: Copy + Send> Send for Ring<T> {}

impl<T: Copy> Ring<T> {
    /// A ring we produce into (fill, TX): `size` entries (a power of two) in `map` at
    /// offsets `off`.
    ///
    /// Panics if the offsets put the indexes or descriptors outside the mapping (the kernel
    /// gave them; a mismatch is a bug here, not bad input).
    pub fn producer(map: RingMap, off: &XdpRingOffset, size: u32) -> Ring<T> {
        let mut r = Self::new(map, off, size);
        r.local = r.prod().load(Ordering::Relaxed);
        r.cached = r.cons().load(Ordering::Relaxed);
        r
    }

    /// A ring we consume (RX, completion); as [`producer`](Self::producer).
    pub fn consumer(map: RingMap, off: &XdpRingOffset, size: u32) -> Ring<T> {
        let mut r = Self::new(map, off, size);
        r.local = r.cons().load(Ordering::Relaxed);
        r.cached = r.prod().load(Ordering::Relaxed);
        r
    }

    fn new(map: RingMap, off: &XdpRingOffset, size: u32) -> Ring<T> {
        assert!(size.is_power_of_two());
        let end = off.desc as usize + size as usize * std::mem::size_of::<T>();
        assert!(end <= map.len() && off.producer as usize + 4 <= map.len() && off.consumer as usize + 4 <= map.len());
        let base = map.base();
        // SAFETY: the offsets are inside the mapping (checked above) and 4-byte aligned (the
        // kernel lays the indexes out on their own cache lines).
        let (producer, consumer, flags, desc) = unsafe {
            (
                base.add(off.producer as usize) as *const AtomicU32,
                base.add(off.consumer as usize) as *const AtomicU32,
                base.add(off.flags as usize) as *const AtomicU32,
                base.add(off.desc as usize) as *mut T,
            )
        };
        Ring { _map: map, producer, consumer, flags, desc, mask: size - 1, local: 0, cached: 0, _t: PhantomData }
    }

    fn prod(&self) -> &AtomicU32 {
        // SAFETY: points into `self.map` (checked in `new`), which lives as long as `self`.
        unsafe { &*self.producer }
    }

    fn cons(&self) -> &AtomicU32 {
        // SAFETY: as in `prod`.
        unsafe { &*self.consumer }
    }

    /// Number of entries.
    pub fn size(&self) -> u32 {
        self.mask + 1
    }

    /// Whether the kernel asked for a wake-up syscall (`XDP_RING_NEED_WAKEUP`).
    pub fn needs_wakeup(&self) -> bool {
        // SAFETY: as in `prod`.
        unsafe { &*self.flags }.load(Ordering::Relaxed) & super::sys::XDP_RING_NEED_WAKEUP != 0
    }

    // ---- producer side (fill, TX) ----

    /// Free slots we may produce into (re-reading the consumer index only when needed).
    pub fn free(&mut self, want: u32) -> u32 {
        let mut free = self.size() - self.local.wrapping_sub(self.cached);
        if free < want {
            self.cached = self.cons().load(Ordering::Acquire);
            free = self.size() - self.local.wrapping_sub(self.cached);
        }
        free
    }

    /// Writes `v` into the next slot. The caller checked [`free`](Self::free); nothing is
    /// visible to the kernel until [`publish`](Self::publish).
    pub fn push(&mut self, v: T) {
        debug_assert!(self.size() - self.local.wrapping_sub(self.cached) > 0);
        let i = (self.local & self.mask) as usize;
        // SAFETY: `i` is below the ring size, so inside the descriptors (checked in `new`).
        unsafe { self.desc.add(i).write(v) };
        self.local = self.local.wrapping_add(1);
    }

    /// Makes the pushed entries visible to the kernel (release: the descriptors first).
    pub fn publish(&mut self) {
        self.prod().store(self.local, Ordering::Release);
    }

    /// Entries produced that the kernel has not consumed yet (re-reads its index).
    pub fn in_flight(&mut self) -> u32 {
        self.cached = self.cons().load(Ordering::Acquire);
        self.local.wrapping_sub(self.cached)
    }

    // ---- consumer side (RX, completion) ----

    /// Entries ready to consume (re-reading the producer index only when the cache is empty).
    pub fn ready(&mut self) -> u32 {
        let mut n = self.cached.wrapping_sub(self.local);
        if n == 0 {
            self.cached = self.prod().load(Ordering::Acquire);
            n = self.cached.wrapping_sub(self.local);
        }
        n
    }

    /// Reads the `k`-th ready entry (`k < ready()`).
    pub fn peek(&self, k: u32) -> T {
        let i = (self.local.wrapping_add(k) & self.mask) as usize;
        // SAFETY: `i` is below the ring size, inside the descriptors (checked in `new`).
        unsafe { self.desc.add(i).read() }
    }

    /// Hands `n` consumed entries back to the kernel (release: after reading them).
    pub fn release(&mut self, n: u32) {
        self.local = self.local.wrapping_add(n);
        self.cons().store(self.local, Ordering::Release);
    }
}

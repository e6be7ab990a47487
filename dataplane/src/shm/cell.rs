//! Ring cells as this process sees them: a [`CellMut`] for the producer that owns a cell
//! until it publishes it, a [`CellRef`] for the consumer that claimed it. Only `ring.rs`
//! makes them (a pointer into the ring and the payload's length); records of [`Plain`] data
//! go in and out whole, checked against that length ([`CellMut::put`], [`CellRef::get`]) or,
//! from a typed ring whose construction proved the fit, unchecked (`wire.rs`). The bottom
//! of the `shm` stack: it imports nothing of it.

use std::marker::PhantomData;
use std::mem::size_of;

/// Plain data that may be copied into and out of shared memory.
///
/// # Safety
/// The type is `#[repr(C)]`, has no padding bytes (its padding is explicit fields), and every
/// bit pattern of its size is a valid value.
pub(crate) unsafe trait Plain: Copy {}

// SAFETY: integers: no padding, every bit pattern valid.
unsafe impl Plain for u8 {}
// SAFETY: as above.
unsafe impl Plain for u16 {}
// SAFETY: as above.
unsafe impl Plain for u32 {}
// SAFETY: as above.
unsafe impl Plain for u64 {}

/// `ptr::copy(src, dst, n)`, with 4 to 32 bytes copied inline: both (possibly overlapping)
/// words are loaded before either is stored, so overlapping ranges come out as with `copy`,
/// and the call into libc's memmove (~20 instructions of an 8-byte SEND) is skipped.
///
/// # Safety
/// As for `ptr::copy`: `src` readable and `dst` writable for `n` bytes.
#[inline(always)]
pub(crate) unsafe fn copy_one(src: *const u8, dst: *mut u8, n: usize) {
    // SAFETY: every access is inside `[src, src + n)` or `[dst, dst + n)` (16 < n <= 32 for
    // the 16-byte words, 8 <= n <= 16 for the 8-byte ones, 4 <= n < 8 for the 4-byte ones),
    // per the contract; unaligned accesses are used.
    unsafe {
        if (17..=32).contains(&n) {
            let (a, b) = ((src as *const u128).read_unaligned(), (src.add(n - 16) as *const u128).read_unaligned());
            (dst as *mut u128).write_unaligned(a);
            (dst.add(n - 16) as *mut u128).write_unaligned(b);
        } else if (8..=16).contains(&n) {
            let (a, b) = ((src as *const u64).read_unaligned(), (src.add(n - 8) as *const u64).read_unaligned());
            (dst as *mut u64).write_unaligned(a);
            (dst.add(n - 8) as *mut u64).write_unaligned(b);
        } else if (4..8).contains(&n) {
            let (a, b) = ((src as *const u32).read_unaligned(), (src.add(n - 4) as *const u32).read_unaligned());
            (dst as *mut u32).write_unaligned(a);
            (dst.add(n - 4) as *mut u32).write_unaligned(b);
        } else {
            std::ptr::copy(src, dst, n);
        }
    }
}

/// Whether a `T` at byte `off` lies inside a payload of `len` bytes.
#[inline(always)]
pub(crate) fn fits<T>(off: usize, len: usize) -> bool {
    size_of::<T>() <= len && off <= len - size_of::<T>()
}

/// The payload of a ring cell that this producer owns until it publishes the cell.
pub(crate) struct CellMut<'a> {
    p: *mut u8,
    len: usize,
    _cell: PhantomData<&'a mut [u8]>,
}

impl CellMut<'_> {
    /// # Safety
    /// `p` is valid for writes of `len` bytes for the handle's lifetime, and the ring's
    /// protocol gives the caller the cell (no other writer while the handle lives, except a
    /// hostile peer, whose writes can change values but not move an access out of the cell).
    #[inline(always)]
    pub(crate) unsafe fn new(p: *mut u8, len: usize) -> Self {
        CellMut { p, len, _cell: PhantomData }
    }

    /// Writes `v` at byte `off` of the payload. A record that does not fit is not written (a
    /// bug in the caller's layout, never a peer's doing: offsets and lengths here are this
    /// process's own; debug builds panic).
    #[inline(always)]
    pub(crate) fn put<T: Plain>(&mut self, off: usize, v: &T) {
        self.put_with(off, || *v)
    }

    /// [`CellMut::put`] of the record `make` builds, called only once the record is known to
    /// fit. Building it inside the check lets the compiler write its fields straight into the
    /// cell: built before (an argument), it goes through the stack, which measured 46 more
    /// instructions per message in `profile_post_poll` for the two CQEs of a message.
    #[inline(always)]
    pub(crate) fn put_with<T: Plain>(&mut self, off: usize, make: impl FnOnce() -> T) {
        debug_assert!(fits::<T>(off, self.len), "record outside its cell");
        if fits::<T>(off, self.len) {
            // SAFETY: checked above to lie inside the payload, which `new`'s contract makes
            // writable; unaligned because payloads are only 8-byte aligned.
            unsafe { (self.p.add(off) as *mut T).write_unaligned(make()) }
        }
    }

    /// [`CellMut::put_with`] without the check.
    ///
    /// # Safety
    /// A `T` at byte `off` lies inside the payload (a ring whose stride guarantees it, such
    /// as [`CqRing`]'s).
    #[inline(always)]
    pub(crate) unsafe fn put_unchecked<T: Plain>(&mut self, off: usize, make: impl FnOnce() -> T) {
        debug_assert!(fits::<T>(off, self.len), "record outside its cell");
        // SAFETY: inside the payload per the contract, writable per `new`'s.
        unsafe { (self.p.add(off) as *mut T).write_unaligned(make()) }
    }

    /// Copies `n` bytes from `src` to byte `off` of the payload (`copy_one`).
    ///
    /// # Safety
    /// `[off, off + n)` lies inside the payload, and `src` is readable for `n` bytes.
    #[inline(always)]
    pub(crate) unsafe fn put_bytes_unchecked(&mut self, off: usize, src: *const u8, n: usize) {
        debug_assert!(off <= self.len && n <= self.len - off, "bytes outside their cell");
        // SAFETY: inside the payload per the contract, writable per `new`'s; `src` readable
        // per the contract.
        unsafe { copy_one(src, self.p.add(off), n) }
    }

    /// Where the payload starts (the loom model maps it to its own cells).
    #[cfg(loom)]
    pub(crate) fn as_ptr(&self) -> *const u8 {
        self.p
    }
}

/// The payload of a ring cell that this consumer has claimed.
pub(crate) struct CellRef<'a> {
    p: *const u8,
    len: usize,
    _cell: PhantomData<&'a [u8]>,
}

impl CellRef<'_> {
    /// # Safety
    /// `p` is valid for reads of `len` bytes for the handle's lifetime, and the ring's
    /// protocol has given the caller the cell.
    #[inline(always)]
    pub(crate) unsafe fn new(p: *const u8, len: usize) -> Self {
        CellRef { p, len, _cell: PhantomData }
    }

    /// Reads the record at byte `off` of the payload; all zeros if it does not fit (as
    /// [`CellMut::put`]).
    #[inline(always)]
    pub(crate) fn get<T: Plain>(&self, off: usize) -> T {
        // SAFETY: all zeros is a bit pattern, so a `T` (`Plain`).
        self.get_with(off, |v| v).unwrap_or_else(|| unsafe { std::mem::zeroed() })
    }

    /// Hands the record at byte `off` to `use_it`, or returns `None` if it does not fit (as
    /// [`CellMut::put`]). Decoding inside the check reads the fields straight from the cell
    /// (see [`CellMut::put_with`]).
    #[inline(always)]
    pub(crate) fn get_with<T: Plain, R>(&self, off: usize, use_it: impl FnOnce(T) -> R) -> Option<R> {
        debug_assert!(fits::<T>(off, self.len), "record outside its cell");
        if fits::<T>(off, self.len) {
            // SAFETY: inside the payload (checked above), readable per `new`'s contract; any
            // bit pattern is a `T` (`Plain`).
            Some(use_it(unsafe { (self.p.add(off) as *const T).read_unaligned() }))
        } else {
            None
        }
    }

    /// [`CellRef::get`] without the check.
    ///
    /// # Safety
    /// As [`CellMut::put_unchecked`].
    #[inline(always)]
    pub(crate) unsafe fn get_unchecked<T: Plain>(&self, off: usize) -> T {
        debug_assert!(fits::<T>(off, self.len), "record outside its cell");
        // SAFETY: inside the payload per the contract, readable per `new`'s; any bit pattern
        // is a `T` (`Plain`).
        unsafe { (self.p.add(off) as *const T).read_unaligned() }
    }

    /// Where the payload starts (typed decoders in `wire.rs` read fields from it; the loom
    /// model maps it to its own cells).
    pub(crate) fn as_ptr(&self) -> *const u8 {
        self.p
    }

    /// Payload bytes of the cell.
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

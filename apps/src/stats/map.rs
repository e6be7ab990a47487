//! Mapping a live-stats segment: the only `unsafe` of the live stats on the apps side.
//!
//! The writer maps its new file read-write ([`Mapping`]) and hands the workers counter blocks
//! inside it ([`StableWords`]); a reader maps a segment read-only ([`ReadOnly`]) and can only
//! load words by index, bounds-checked, so a corrupt offset is an error, never an
//! out-of-bounds read. Every access on either side is atomic: a reader in another process sees
//! each counter whole (relaxed loads of single-writer relaxed stores).
//!
//! One hazard remains outside our control: if a process with write access truncates the file
//! while it is mapped, touching the lost pages raises SIGBUS. The segment is mode 0600 (only
//! its owner can do that) and the writer never truncates it; it only unlinks it, which keeps
//! existing mappings valid.

use dataplane::worker::stats::StableWords;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

/// A shared mapping of the first `len` bytes of a file, as 8-byte words.
struct Raw {
    ptr: NonNull<AtomicU64>,
    bytes: usize,
}

impl Raw {
    fn map(file: &File, bytes: usize, writable: bool) -> io::Result<Raw> {
        if bytes < 8 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "a mapping needs at least one word"));
        }
        let prot = if writable { libc::PROT_READ | libc::PROT_WRITE } else { libc::PROT_READ };
        // SAFETY: FFI; a fresh mapping chosen by the kernel (no address hint, so nothing of
        // ours is replaced), of an open file descriptor; the result is checked below.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), bytes, prot, libc::MAP_SHARED, file.as_raw_fd(), 0) };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        // mmap returns page-aligned memory, so it is aligned for `AtomicU64`.
        let ptr = NonNull::new(p.cast::<AtomicU64>()).ok_or_else(|| io::Error::other("mmap returned null"))?;
        Ok(Raw { ptr, bytes })
    }

    fn words(&self) -> &[AtomicU64] {
        // SAFETY: the mapping is `bytes` long, page-aligned, lives until `drop` and never
        // moves; it is only accessed through atomics (this module hands out no other view).
        // Any bit pattern is a valid `AtomicU64`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.bytes / 8) }
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `map`; no reference into it outlives
        // `self` (slices borrow `self`; counter slots hold an `Arc` of the owner).
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.bytes) };
    }
}

// SAFETY: the mapping is plain shared memory accessed only through atomics; moving or
// sharing the handle between threads is as safe as sharing a `[AtomicU64]`.
unsafe impl Send for Raw {}
// SAFETY: as for `Send`.
unsafe impl Sync for Raw {}

/// The writer's read-write mapping of its segment.
pub(crate) struct Mapping(Raw);

impl Mapping {
    /// Maps the first `bytes` bytes of `file` (opened read-write, at least that long).
    pub(crate) fn create(file: &File, bytes: usize) -> io::Result<Mapping> {
        Raw::map(file, bytes, true).map(Mapping)
    }

    /// Stores `v` at word `i` (relaxed; the header is published by the release store of the
    /// magic). Out of range: nothing (the writer only stores inside its own plan).
    pub(crate) fn store(&self, i: usize, v: u64, order: Ordering) {
        if let Some(w) = self.0.words().get(i) {
            w.store(v, order);
        }
    }

    /// Loads word `i` (0 out of range).
    pub(crate) fn load(&self, i: usize) -> u64 {
        self.0.words().get(i).map_or(0, |w| w.load(Ordering::Relaxed))
    }
}

// SAFETY: `Raw::words` returns the same mapping every time, valid until the `Mapping` drops,
// and this module only accesses it atomically.
unsafe impl StableWords for Mapping {
    fn words(&self) -> &[AtomicU64] {
        self.0.words()
    }
}

/// A reader's read-only mapping of a segment: word loads by index, nothing else.
pub(crate) struct ReadOnly(Raw);

impl ReadOnly {
    /// Maps the first `bytes` bytes of `file` (opened read-only) for reading.
    pub(crate) fn open(file: &File, bytes: usize) -> io::Result<ReadOnly> {
        Raw::map(file, bytes, false).map(ReadOnly)
    }

    /// Number of words mapped.
    pub(crate) fn len(&self) -> usize {
        self.0.words().len()
    }

    /// Word `i` with `order` (a relaxed or acquire load: atomic loads of read-only memory of
    /// the native word size are plain loads), or `None` past the end.
    pub(crate) fn load(&self, i: usize, order: Ordering) -> Option<u64> {
        self.0.words().get(i).map(|w| w.load(order))
    }
}

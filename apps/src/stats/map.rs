//! Mapping a live-stats segment: the only `unsafe` of the live stats on the apps side.
//!
//! The writer maps its new file read-write ([`Mapping`]) and hands the workers counter blocks
//! inside it ([`StableWords`]). A reader does not map it: it reads the file with `pread` into
//! a private copy ([`ReadOnly::read`], [`Words`]) and loads words from that copy by index,
//! bounds-checked, so a corrupt offset is an error, never an out-of-bounds read.
//!
//! Why a copy and not a mapping: if anyone with write access truncates the file while it is
//! mapped, touching the lost pages raises SIGBUS, and `dpctl` died of it. A read of a cut
//! file just comes back short. The price: a counter is copied by the kernel, not loaded
//! atomically, so a value being stored during the copy could in principle read torn (the
//! kernel copies aligned words whole in practice); these are display values, never inputs
//! to the run. The system call also orders the copy after the writer's release store of the
//! magic, as the acquire load of a mapping did.
//!
//! The writer's own mapping keeps the hazard: truncating a live segment (mode 0600, so only
//! its owner can) makes the pipeline's next counter store raise SIGBUS. The writer never
//! truncates it; it only unlinks it, which keeps mappings valid.

use dataplane::worker::stats::StableWords;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

/// A shared mapping of the first `len` bytes of a file, as 8-byte words.
struct Raw {
    ptr: NonNull<AtomicU64>,
    bytes: usize,
}

impl Raw {
    fn map(file: &File, bytes: usize) -> io::Result<Raw> {
        if bytes < 8 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "a mapping needs at least one word"));
        }
        let prot = libc::PROT_READ | libc::PROT_WRITE;
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
        Raw::map(file, bytes).map(Mapping)
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

/// A reader's handle on a segment: the file and how many bytes of it to read.
pub(crate) struct ReadOnly {
    file: File,
    bytes: usize,
}

impl ReadOnly {
    /// A reader of the first `bytes` bytes of `file` (opened read-only).
    pub(crate) fn open(file: File, bytes: usize) -> ReadOnly {
        ReadOnly { file, bytes }
    }

    /// The words of the file now: fewer than at open when it has been cut short since.
    pub(crate) fn read(&self) -> io::Result<Words> {
        let mut buf = vec![0u8; self.bytes];
        let mut got = 0;
        while got < buf.len() {
            match self.file.read_at(&mut buf[got..], got as u64) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        let words = buf[..got - got % 8]
            .chunks_exact(8)
            .map(|c| u64::from_ne_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
            .collect();
        Ok(Words { words, short: got < self.bytes })
    }
}

/// A private copy of a segment's words: loads by index, nothing else.
#[derive(Default)]
pub(crate) struct Words {
    words: Vec<u64>,
    short: bool,
}

impl Words {
    /// Number of words read.
    pub(crate) fn len(&self) -> usize {
        self.words.len()
    }

    /// Whether the file was shorter than expected (cut short while the reader had it open).
    pub(crate) fn short(&self) -> bool {
        self.short
    }

    /// Word `i`, or `None` past the end.
    pub(crate) fn load(&self, i: usize) -> Option<u64> {
        self.words.get(i).copied()
    }
}

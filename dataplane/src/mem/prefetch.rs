//! The write-intent prefetch hint shared by the receive rings (`shm::ring`) and the buffer
//! pool: the one place its inline assembly lives.

/// Hints the CPU to fetch the cache line holding `p` into this core's cache for writing
/// (PREFETCHW; a NOP on CPUs without it, nothing on other architectures). A hint only: it
/// reads and writes nothing and cannot fault, whatever `p` is, so it is safe to call.
///
/// Inline assembly rather than `_mm_prefetch`: its `_MM_HINT_ET0` compiles to `prefetcht0`
/// without the `prfchw` target feature (docs/benchmarks.md, sessions 27 and 31).
#[inline(always)]
pub(crate) fn prefetch_for_write<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch has no architectural effect: no load or store that could race, no
    // fault on any address, no register or flag changed.
    unsafe {
        std::arch::asm!("prefetchw [{0}]", in(reg) p, options(nostack, preserves_flags, readonly));
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

//! SIGINT and SIGTERM as a flag: the default action would end a process without its
//! destructors (leaving a fabric file or a stats segment when it was the last user), so every
//! program of the project installs this handler and ends its waits when the flag is set.

use std::sync::atomic::{AtomicBool, Ordering};

/// Set by SIGINT or SIGTERM (after [`install`]). Public so that it can be handed to
/// [`crate::runner::run`] as its interrupt flag.
pub static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_stop_signal(_: libc::c_int) {
    // Async-signal-safe: one atomic store.
    STOP.store(true, Ordering::Relaxed);
}

/// Makes SIGINT and SIGTERM set [`STOP`] instead of ending the process. Without SA_RESTART, so
/// a blocking call (accept, read) returns EINTR and its caller sees the flag.
pub fn install() {
    // SAFETY: FFI; the handler only performs an atomic store, which is async-signal-safe, and
    // the sigaction struct is fully initialized (zeroed, then the handler and mask set).
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_stop_signal as extern "C" fn(libc::c_int) as usize;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGINT, &sa, std::ptr::null_mut());
        libc::sigaction(libc::SIGTERM, &sa, std::ptr::null_mut());
    }
}

/// Whether SIGINT or SIGTERM arrived since [`install`].
#[inline]
pub fn stopped() -> bool {
    STOP.load(Ordering::Relaxed)
}

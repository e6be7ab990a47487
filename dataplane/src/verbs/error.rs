//! Errors that carry errno meaning, as the verbs return them.
//!
//! Every verb in rdma-core returns an errno value on failure; [`Errno`] keeps that meaning so a
//! caller can match on it and so the `rdma` provider can pass the kernel's value through
//! unchanged. [`Error`] adds a sentence saying what was wrong, built only on the slow path (post
//! paths return [`PostError`], which carries no string and never allocates).

use std::fmt;

/// An errno value as a verb returns it.
///
/// Any raw value can be carried, so the `rdma` provider passes the kernel's errno through
/// unchanged ([`Errno::from_raw`]); the constants name the values the verbs document, and a
/// caller matches on them (`e.errno == Errno::EINVAL`, or in a pattern).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Errno(i32);

/// The symbol (`EINVAL`), as the enum this type replaced printed it, so failed assertions on
/// errno values stay readable; `Errno(71)` for a value without a constant here.
impl fmt::Debug for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(name) => f.write_str(name),
            None => write!(f, "Errno({})", self.0),
        }
    }
}

/// Declares each named errno once: its constant and its symbol come from the same line.
macro_rules! errnos {
    ($($(#[doc = $doc:literal])* $name:ident,)*) => {
        impl Errno {
            $(
                $(#[doc = $doc])*
                pub const $name: Errno = Errno(libc::$name);
            )*

            /// The errno symbol, e.g. `Some("EINVAL")`; `None` for a value without a constant
            /// here (it still displays, as its number and the C library's text).
            pub fn name(self) -> Option<&'static str> {
                match self.0 {
                    $(libc::$name => Some(stringify!($name)),)*
                    _ => None,
                }
            }
        }
    };
}

errnos! {
    /// Operation not permitted.
    EPERM,
    /// No such file or directory (missing fabric, device file).
    ENOENT,
    /// Interrupted system call.
    EINTR,
    /// I/O error (a CQ in error, a dead peer).
    EIO,
    /// Try again: nothing available now (no async event, no completion to wait for).
    EAGAIN,
    /// Out of memory, or a queue is full.
    ENOMEM,
    /// Permission denied.
    EACCES,
    /// Bad address: a buffer or handle that does not belong to this object.
    EFAULT,
    /// Resource busy (an object still in use, e.g. a CQ with QPs attached).
    EBUSY,
    /// Already exists.
    EEXIST,
    /// No such device.
    ENODEV,
    /// Invalid argument: a bad value in a work request or an attribute.
    EINVAL,
    /// No space left (fabric arena exhausted).
    ENOSPC,
    /// Function not implemented (a kernel without InfiniBand).
    ENOSYS,
    /// Operation not supported by this provider or device.
    EOPNOTSUPP,
    /// Timed out.
    ETIMEDOUT,
}

impl Errno {
    /// The raw errno value.
    pub fn raw(self) -> i32 {
        self.0
    }

    /// The errno for a raw value, unchanged whether or not it has a constant here.
    pub fn from_raw(v: i32) -> Errno {
        Errno(v)
    }
}

impl fmt::Display for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(name) => f.write_str(name),
            // e.g. "Protocol error (os error 71)": the number and what the C library calls it.
            None => write!(f, "{}", std::io::Error::from_raw_os_error(self.0)),
        }
    }
}

/// A failed control-path verb: the errno and a sentence naming what was wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{errno}: {msg}")]
pub struct Error {
    /// The errno meaning of the failure.
    pub errno: Errno,
    /// What was wrong and, where there is one, what to do about it.
    pub msg: String,
}

impl Error {
    /// Builds an error from an errno and a message.
    pub fn new(errno: Errno, msg: impl Into<String>) -> Error {
        Error { errno, msg: msg.into() }
    }
}

/// Result of a control-path verb.
pub type Result<T> = std::result::Result<T, Error>;

/// Why a post failed: the errno, the index of the first work request that failed (`bad_wr`),
/// and which check rejected it.
///
/// Work requests before `bad_wr` were posted; the failing one and every one after it were not,
/// and the queue is exactly as if the call had been made with only the requests before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PostError {
    /// errno meaning: `EINVAL` (bad value in the WR or wrong QP state), `ENOMEM` (queue full),
    /// `EFAULT` (a handle from another object).
    pub errno: Errno,
    /// Index into the chain of the first work request that was not posted.
    pub bad_wr: usize,
    /// Which check failed, for the error message (static: posting never allocates).
    pub reason: &'static str,
}

impl PostError {
    /// Builds a post error for the WR at `bad_wr`.
    pub fn new(errno: Errno, bad_wr: usize, reason: &'static str) -> PostError {
        PostError { errno, bad_wr, reason }
    }
}

impl fmt::Display for PostError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} at work request {}: {}", self.errno, self.bad_wr, self.reason)
    }
}

impl std::error::Error for PostError {}

impl From<PostError> for Error {
    fn from(e: PostError) -> Error {
        Error::new(e.errno, e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn from_raw_passes_an_unknown_errno_through_unchanged() {
        // EPROTO has no constant here; the kernel's value must survive, not turn into EIO.
        let e = Errno::from_raw(libc::EPROTO);
        assert_eq!(e.raw(), libc::EPROTO);
        assert_ne!(e, Errno::EIO);
        assert_eq!(e.name(), None);
        assert_eq!(format!("{e:?}"), format!("Errno({})", libc::EPROTO));
        assert_eq!(e.to_string(), std::io::Error::from_raw_os_error(libc::EPROTO).to_string());
    }

    #[test]
    fn named_errnos_round_trip_with_their_symbol() {
        for (e, raw, name) in [
            (Errno::EINVAL, libc::EINVAL, "EINVAL"),
            (Errno::EOPNOTSUPP, libc::EOPNOTSUPP, "EOPNOTSUPP"),
            (Errno::ETIMEDOUT, libc::ETIMEDOUT, "ETIMEDOUT"),
        ] {
            assert_eq!(Errno::from_raw(raw), e);
            assert_eq!(e.raw(), raw);
            assert_eq!(e.name(), Some(name));
            assert_eq!(e.to_string(), name);
            assert_eq!(format!("{e:?}"), name);
        }
    }

    #[test]
    fn error_display_names_errno_and_message() {
        assert_eq!(Error::new(Errno::EINVAL, "bad max_wr").to_string(), "EINVAL: bad max_wr");
        let kernel = Error::new(Errno::from_raw(libc::EPROTO), "ibv_modify_qp failed");
        assert!(kernel.to_string().contains(&format!("os error {}", libc::EPROTO)), "{kernel}");
    }
}

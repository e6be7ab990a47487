//! Errors that carry errno meaning, as the verbs return them.
//!
//! Every verb in rdma-core returns an errno value on failure; [`Errno`] keeps that meaning so a
//! caller can match on it and so the `rdma` provider can pass the kernel's value through
//! unchanged. [`Error`] adds a sentence saying what was wrong, built only on the slow path (post
//! paths return [`PostError`], which carries no string and never allocates).

use std::fmt;

/// The errno values the verbs use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(i32)]
pub enum Errno {
    /// Operation not permitted.
    EPERM = libc::EPERM,
    /// No such file or directory (missing fabric, device file).
    ENOENT = libc::ENOENT,
    /// Interrupted system call.
    EINTR = libc::EINTR,
    /// I/O error (a CQ in error, a dead peer).
    EIO = libc::EIO,
    /// Try again: nothing available now (no async event, no completion to wait for).
    EAGAIN = libc::EAGAIN,
    /// Out of memory, or a queue is full.
    ENOMEM = libc::ENOMEM,
    /// Permission denied.
    EACCES = libc::EACCES,
    /// Bad address: a buffer or handle that does not belong to this object.
    EFAULT = libc::EFAULT,
    /// Resource busy (an object still in use, e.g. a CQ with QPs attached).
    EBUSY = libc::EBUSY,
    /// Already exists.
    EEXIST = libc::EEXIST,
    /// No such device.
    ENODEV = libc::ENODEV,
    /// Invalid argument: a bad value in a work request or an attribute.
    EINVAL = libc::EINVAL,
    /// No space left (fabric arena exhausted).
    ENOSPC = libc::ENOSPC,
    /// Function not implemented (a kernel without InfiniBand).
    ENOSYS = libc::ENOSYS,
    /// Operation not supported by this provider or device.
    EOPNOTSUPP = libc::EOPNOTSUPP,
    /// Timed out.
    ETIMEDOUT = libc::ETIMEDOUT,
}

impl Errno {
    /// The raw errno value.
    pub fn raw(self) -> i32 {
        self as i32
    }

    /// Maps a raw errno value; unknown values become `EIO`.
    pub fn from_raw(v: i32) -> Errno {
        use Errno::*;
        [
            EPERM, ENOENT, EINTR, EIO, EAGAIN, ENOMEM, EACCES, EFAULT, EBUSY, EEXIST, ENODEV, EINVAL, ENOSPC, ENOSYS,
            EOPNOTSUPP, ETIMEDOUT,
        ]
        .into_iter()
        .find(|e| e.raw() == v)
        .unwrap_or(EIO)
    }

    /// The errno symbol, e.g. `"EINVAL"`.
    pub fn name(self) -> &'static str {
        use Errno::*;
        match self {
            EPERM => "EPERM",
            ENOENT => "ENOENT",
            EINTR => "EINTR",
            EIO => "EIO",
            EAGAIN => "EAGAIN",
            ENOMEM => "ENOMEM",
            EACCES => "EACCES",
            EFAULT => "EFAULT",
            EBUSY => "EBUSY",
            EEXIST => "EEXIST",
            ENODEV => "ENODEV",
            EINVAL => "EINVAL",
            ENOSPC => "ENOSPC",
            ENOSYS => "ENOSYS",
            EOPNOTSUPP => "EOPNOTSUPP",
            ETIMEDOUT => "ETIMEDOUT",
        }
    }
}

impl fmt::Display for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
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

/// Shorthand for building an [`Error`] with `format!` arguments.
#[macro_export]
macro_rules! verr {
    ($errno:ident, $($arg:tt)*) => {
        $crate::verbs::Error::new($crate::verbs::Errno::$errno, format!($($arg)*))
    };
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

//! The one `tracing` subscriber every binary installs, so that the library's warnings (huge
//! pages not used, a peer gone, ...) reach the user.
//!
//! Without a subscriber `tracing::warn!` is dropped silently; each binary calls [`init`] first
//! thing in `main`.

use tracing_subscriber::filter::{EnvFilter, LevelFilter};

/// Installs a formatting subscriber on stderr: warnings and errors by default, `RUST_LOG`
/// (e.g. `RUST_LOG=debug`, `RUST_LOG=dataplane::shm=trace`) to change it, ANSI colours only
/// when stderr is a terminal (no escape codes in redirected logs).
///
/// A second call, or a call after another subscriber was set, does nothing: a test harness or
/// an embedding program may already have installed its own.
pub fn init() {
    let builder = EnvFilter::builder().with_default_directive(LevelFilter::WARN.into());
    let filter = builder.from_env().unwrap_or_else(|e| {
        // No subscriber yet to report through; a misspelt RUST_LOG must not hide warnings.
        eprintln!("RUST_LOG ignored ({e}); showing warnings and errors");
        EnvFilter::builder().with_default_directive(LevelFilter::WARN.into()).parse_lossy("")
    });
    let tty = std::io::IsTerminal::is_terminal(&std::io::stderr());
    // `try_init` rather than `init`: a subscriber already set is not an error worth a panic.
    let _ = tracing_subscriber::fmt().with_writer(std::io::stderr).with_ansi(tty).with_env_filter(filter).try_init();
}

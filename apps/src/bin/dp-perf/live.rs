//! Liveness for every wait of the data path: a poll that finds nothing calls [`Live::idle`],
//! which every 1024 calls (a few microseconds of spinning) looks at the shared flags and the
//! clock. So no wait can hang: a peer that finished stops the server's loops, a dead peer or a
//! broken control connection (seen by the control thread) fails the run with its reason, and
//! on the client a wait without any progress for `--peer-timeout` fails the run (a lost UD/UC
//! message, a stuck peer).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// State shared between the test threads and the control thread of one message size.
#[derive(Default)]
pub struct Shared {
    /// The client finished: the server's loops return.
    pub stop: AtomicBool,
    /// Why the run cannot go on (set once, by the control thread).
    dead: OnceLock<String>,
}

impl Shared {
    /// Records why the run cannot go on; the test threads fail with it at their next check.
    pub fn kill(&self, why: String) {
        let _ = self.dead.set(why);
    }

    /// The reason recorded by [`Shared::kill`], if any.
    pub fn dead(&self) -> Option<&str> {
        self.dead.get().map(String::as_str)
    }

    /// Asks the server's loops to return.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Release);
    }
}

/// Checks done while waiting; one per waiting thread.
pub struct Live<'a> {
    shared: &'a Shared,
    /// Give up after this long without progress (`None`: wait for `stop`).
    timeout: Option<Duration>,
    what: &'static str,
    idle: u32,
    moved: bool,
    last: Instant,
}

impl<'a> Live<'a> {
    /// A waiter that fails after `timeout` without progress; `what` names the wait in the
    /// error ("no send completion", "no reply from the server").
    pub fn with_timeout(shared: &'a Shared, timeout: Duration, what: &'static str) -> Live<'a> {
        Live { shared, timeout: Some(timeout), what, idle: 0, moved: false, last: Instant::now() }
    }

    /// A waiter that waits until the peer says stop (the server's side).
    pub fn until_stop(shared: &'a Shared, what: &'static str) -> Live<'a> {
        Live { shared, timeout: None, what, idle: 0, moved: false, last: Instant::now() }
    }

    /// Something completed: the no-progress clock restarts at the next check.
    #[inline]
    pub fn progress(&mut self) {
        self.moved = true;
    }

    /// A poll found nothing. Returns true when the peer asked to stop; fails the run (exit 1
    /// with the reason) when the peer is dead or nothing progressed for the timeout.
    #[inline]
    pub fn idle(&mut self) -> bool {
        self.idle = self.idle.wrapping_add(1);
        if self.idle % 1024 != 0 {
            return false;
        }
        self.check()
    }

    #[cold]
    fn check(&mut self) -> bool {
        if let Some(why) = self.shared.dead() {
            crate::fail(self.what, why);
        }
        if self.shared.stop.load(Ordering::Acquire) {
            return true;
        }
        let now = Instant::now();
        if std::mem::take(&mut self.moved) {
            self.last = now;
        } else if let Some(t) = self.timeout {
            if now.duration_since(self.last) > t {
                crate::fail(
                    self.what,
                    format!(
                        "nothing for {:.1} s (a lost UD/UC message is not retransmitted, or the peer is \
                         stuck; --peer-timeout sets this limit)",
                        t.as_secs_f64()
                    ),
                );
            }
        }
        false
    }
}

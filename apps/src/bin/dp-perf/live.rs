//! Liveness for every wait of the data path: a poll that finds nothing calls [`Live::idle`],
//! which every 1024 calls (a few microseconds of spinning) looks at the shared flags and the
//! clock. So no wait can hang: a peer that finished stops the server's loops, a dead peer or a
//! broken control connection (seen by the control thread) fails the run with its reason, and
//! on the client a wait without any progress for `--peer-timeout` fails the run (a lost UD/UC
//! message, a stuck peer). A failure is an `Err` that the test thread returns up to `main`,
//! never an exit from inside the loop: destructors must run (the last context of an shm
//! fabric removes its file).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// A data-path result: `Err` is the sentence saying why the run cannot go on.
pub type Res<T> = Result<T, String>;

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

    /// A poll found nothing. `Ok(true)` when the peer asked to stop; `Err` with the reason
    /// when the peer is dead or nothing progressed for the timeout.
    #[inline]
    pub fn idle(&mut self) -> Result<bool, String> {
        self.idle = self.idle.wrapping_add(1);
        if self.idle % 1024 != 0 {
            return Ok(false);
        }
        self.check()
    }

    #[cold]
    fn check(&mut self) -> Result<bool, String> {
        self.verdict(Instant::now()).map_err(|why| format!("{}: {why}", self.what))
    }

    /// What the checks conclude at `now`: `Ok(true)` to stop, `Ok(false)` to keep waiting,
    /// `Err` with the reason to give up.
    fn verdict(&mut self, now: Instant) -> Result<bool, String> {
        if let Some(why) = self.shared.dead() {
            return Err(why.to_owned());
        }
        if dataplane_apps::signals::stopped() {
            return Err("stopped by SIGINT or SIGTERM".into());
        }
        if self.shared.stop.load(Ordering::Acquire) {
            return Ok(true);
        }
        if std::mem::take(&mut self.moved) {
            self.last = now;
        } else if let Some(t) = self.timeout {
            if now.duration_since(self.last) > t {
                return Err(format!(
                    "nothing for {:.1} s (a lost UD/UC message is not retransmitted, or the peer is stuck; \
                     --peer-timeout plus 1 s per MB between completions sets this limit)",
                    t.as_secs_f64()
                ));
            }
        }
        Ok(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_progress_for_the_timeout_is_fatal_and_progress_resets_it() {
        let sh = Shared::default();
        let mut l = Live::with_timeout(&sh, Duration::from_millis(100), "test");
        let t0 = l.last;
        assert_eq!(l.verdict(t0 + Duration::from_millis(50)), Ok(false));
        l.progress();
        assert_eq!(l.verdict(t0 + Duration::from_millis(150)), Ok(false), "progress restarted the clock");
        let e = l.verdict(t0 + Duration::from_millis(300)).unwrap_err();
        assert!(e.contains("nothing for 0.1 s"), "{e}");
    }

    #[test]
    fn stop_and_death_come_from_the_shared_state() {
        let sh = Shared::default();
        let mut l = Live::until_stop(&sh, "test");
        let later = l.last + Duration::from_secs(3600);
        assert_eq!(l.verdict(later), Ok(false), "the server side has no progress limit");
        sh.stop();
        assert_eq!(l.verdict(later), Ok(true));
        sh.kill("peer closed the connection".into());
        assert_eq!(l.verdict(later), Err("peer closed the connection".into()));
        let sh = Shared::default();
        sh.stop();
        let mut l = Live::until_stop(&sh, "test");
        let calls = (1..=4096).find(|_| l.idle() == Ok(true));
        assert_eq!(calls, Some(1024), "the flags are read every 1024 idle polls");
    }
}

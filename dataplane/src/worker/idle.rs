//! What a worker does when a loop found nothing (Aeron's idle strategies).

use crossbeam_utils::Backoff;

/// The idle policy of a worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IdleKind {
    /// Busy-poll, nothing between polls. Lowest latency.
    ///
    /// No spin-loop hint either: on the development VM's CPU a PAUSE takes 25 ns, half of a
    /// server worker's idle loop, and without it the echo pipeline's one-way latency fell
    /// from 195 to 166 ns (`tools/bench-ab`, docs/benchmarks.md, session 24). The hint is
    /// for a sibling hyperthread's sake: `SpinThenPause` with a `spin_count` gives it.
    #[default]
    Spin,
    /// Spin for `spin_count` empty loops, then a burst of CPU pause instructions per loop.
    SpinThenPause,
    /// Spin for `spin_count` empty loops, then crossbeam's exponential [`Backoff`] (which
    /// ends up yielding the CPU).
    Backoff,
}

/// Idle state of one worker.
pub struct Idle {
    kind: IdleKind,
    spin_count: u32,
    empty: u32,
    backoff: Backoff,
    /// Empty loops between two warm passes (`u64::MAX` for none: never reached).
    warm_period: u64,
    /// Empty loops left until the next warm pass.
    warm_in: u64,
}

impl Idle {
    /// A policy; `spin_count` empty loops pass before pausing or backing off; one in
    /// `keep_warm` empty loops (0: none) asks for a warm pass ([`Idle::idle`]).
    pub fn new(kind: IdleKind, spin_count: u32, keep_warm: u32) -> Idle {
        let warm_period = if keep_warm == 0 { u64::MAX } else { u64::from(keep_warm) };
        Idle { kind, spin_count, empty: 0, backoff: Backoff::new(), warm_period, warm_in: warm_period }
    }

    /// A loop did work: back to full speed.
    #[inline]
    pub fn busy(&mut self) {
        if self.empty != 0 {
            self.empty = 0;
            self.backoff.reset();
        }
    }

    /// A loop found nothing. Returns whether the worker should run a warm pass now: every
    /// `keep_warm` empty loops, counted across busy ones. A countdown (a decrement and a
    /// test on the idle loop's path, no division), which with `keep_warm = 0` starts at
    /// `u64::MAX` and never ends.
    #[inline]
    pub fn idle(&mut self) -> bool {
        self.empty = self.empty.saturating_add(1);
        self.warm_in -= 1;
        let warm = self.warm_in == 0;
        if warm {
            self.warm_in = self.warm_period;
        }
        match self.kind {
            IdleKind::Spin => {}
            IdleKind::SpinThenPause => {
                if self.empty > self.spin_count {
                    for _ in 0..32 {
                        std::hint::spin_loop();
                    }
                } else {
                    std::hint::spin_loop();
                }
            }
            IdleKind::Backoff => {
                if self.empty > self.spin_count {
                    self.backoff.snooze();
                } else {
                    std::hint::spin_loop();
                }
            }
        }
        warm
    }
}

#[cfg(test)]
mod tests {
    use super::{Idle, IdleKind};

    /// A warm pass is asked for every `keep_warm` empty loops, counted across busy ones, and
    /// never with 0.
    #[test]
    fn a_warm_pass_every_keep_warm_empty_loops() {
        let mut idle = Idle::new(IdleKind::Spin, 10, 3);
        let asked: Vec<bool> = (0..9).map(|_| idle.idle()).collect();
        assert_eq!(asked, [false, false, true, false, false, true, false, false, true]);
        idle.idle();
        idle.busy();
        assert_eq!((idle.idle(), idle.idle()), (false, true), "the count goes on across busy loops");
        let mut off = Idle::new(IdleKind::Spin, 10, 0);
        assert!((0..100_000).all(|_| !off.idle()));
    }
}

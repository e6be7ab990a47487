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
}

impl Idle {
    /// A policy; `spin_count` empty loops pass before pausing or backing off.
    pub fn new(kind: IdleKind, spin_count: u32) -> Idle {
        Idle { kind, spin_count, empty: 0, backoff: Backoff::new() }
    }

    /// A loop did work: back to full speed.
    #[inline]
    pub fn busy(&mut self) {
        if self.empty != 0 {
            self.empty = 0;
            self.backoff.reset();
        }
    }

    /// A loop found nothing.
    #[inline]
    pub fn idle(&mut self) {
        self.empty = self.empty.saturating_add(1);
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
    }
}

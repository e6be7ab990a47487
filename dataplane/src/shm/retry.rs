//! The retry registry: send queues of this process with WQEs waiting behind an RNR or a
//! retry. A NIC retries on its own; here the poster's CPU must, so every CQ poll and channel
//! wait in the process progresses them. The CQ calls this registry, never the QP module
//! (which registers its send queues here), so the stack stays one-way.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, Weak};

/// A send queue that can be progressed from outside its owner's post (the QP module's
/// `SqCell`).
pub(crate) trait Waiter: Send + Sync {
    /// Runs what is due in the queue, unless its owner is posting right now (it progresses
    /// the queue itself then).
    fn try_progress(&self);
}

/// Send queues of this process with WQEs waiting behind an RNR or a retry. Every CQ poll in
/// the process (whichever CQ: a pingpong waits on its receive CQ) progresses them.
/// `WAITING_COUNT` keeps the check to one load when nothing waits.
static WAITING: Mutex<Vec<Weak<dyn Waiter>>> = Mutex::new(Vec::new());
static WAITING_COUNT: AtomicU32 = AtomicU32::new(0);

/// Adds (`on`) or removes a send queue from the registry. Control path: a send starts or
/// stops waiting.
pub(crate) fn set_waiting(w: &Weak<dyn Waiter>, on: bool) {
    let mut list = WAITING.lock().unwrap_or_else(|e| e.into_inner());
    if on {
        list.push(w.clone());
    } else {
        list.retain(|x| !x.ptr_eq(w));
    }
    WAITING_COUNT.store(list.len() as u32, Ordering::Release);
}

/// Whether some send queue of this process has WQEs waiting behind an RNR or a retry (they
/// progress only when the process polls a CQ or waits on a completion channel).
#[inline]
pub(crate) fn sends_waiting() -> bool {
    WAITING_COUNT.load(Ordering::Relaxed) != 0
}

/// Send queues one CQ poll progresses at most, taken round robin from where the thread's last
/// poll stopped. A poll that walked every waiting queue cost O(waiting queues): with 256 QPs
/// sending into one SRQ, most waiting behind an RNR, each empty poll took microseconds
/// (a `try_lock`, an `Arc` upgrade and a clock read per queue), and `dp-perf send_bw
/// --use-srq -q 256` fell to a tenth of the 16-QP rate. A NIC's retry engine does not scan
/// every QP per completion either. With the budget, each queue is visited every
/// `waiting / 16` polls, which at busy-poll rates is well inside the shortest RNR timer.
pub(crate) const POLL_BUDGET: usize = 16;

/// Progresses up to [`POLL_BUDGET`] waiting send queues of the process (skipping those being
/// posted to): what a CQ poll does.
#[inline]
pub(crate) fn progress_waiting() {
    if WAITING_COUNT.load(Ordering::Relaxed) != 0 {
        progress_waiting_slow(POLL_BUDGET);
    }
}

/// Progresses every waiting send queue of the process: what a completion channel's waiter
/// does each time it wakes to retry (it may sleep a millisecond between two).
pub(crate) fn progress_all_waiting() {
    if WAITING_COUNT.load(Ordering::Relaxed) != 0 {
        progress_waiting_slow(usize::MAX);
    }
}

thread_local! {
    /// Reused list of waiting send queues: progress runs on the busy-poll path whenever a send
    /// waits on RNR, so after warm-up it must not allocate.
    static SCRATCH: std::cell::RefCell<Vec<Arc<dyn Waiter>>> = const { std::cell::RefCell::new(Vec::new()) };
    /// Where this thread's next budgeted progress starts in the waiting list.
    static CURSOR: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

#[cold]
fn progress_waiting_slow(budget: usize) {
    SCRATCH.with(|scratch| {
        let Ok(mut cells) = scratch.try_borrow_mut() else { return };
        {
            let list = WAITING.lock().unwrap_or_else(|e| e.into_inner());
            let n = list.len();
            if n == 0 {
                return;
            }
            let take = n.min(budget);
            let start = CURSOR.get() % n;
            cells.extend((0..take).filter_map(|k| list[(start + k) % n].upgrade()));
            CURSOR.set((start + take) % n);
        }
        // The list lock is released: progress may deregister a queue (which takes it).
        for c in cells.iter() {
            c.try_progress();
        }
        cells.clear();
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::thread::ThreadId;

    /// Counts the progress calls made by the test's own thread (the registry is process-wide:
    /// other tests' CQ polls may visit these queues too, and their queues may be in the list).
    struct Counting {
        owner: ThreadId,
        n: AtomicUsize,
    }

    impl Waiter for Counting {
        fn try_progress(&self) {
            if std::thread::current().id() == self.owner {
                self.n.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// A poll progresses at most `POLL_BUDGET` waiting queues, round robin, so every one of 40
    /// waiting queues is reached by a few polls; a channel waiter progresses each once.
    #[test]
    fn polls_progress_a_bounded_share_round_robin_and_channel_waits_all() {
        let me = std::thread::current().id();
        let qs: Vec<Arc<Counting>> =
            (0..40).map(|_| Arc::new(Counting { owner: me, n: AtomicUsize::new(0) })).collect();
        let weak: Vec<Weak<dyn Waiter>> = qs.iter().map(|q| Arc::downgrade(q) as Weak<dyn Waiter>).collect();
        for w in &weak {
            set_waiting(w, true);
        }
        let visits = || qs.iter().map(|q| q.n.load(Ordering::Relaxed)).collect::<Vec<_>>();
        let total = || visits().iter().sum::<usize>();
        let mut polls = 0;
        while visits().contains(&0) {
            let before = total();
            progress_waiting();
            assert!(total() - before <= POLL_BUDGET, "one poll progressed more than the budget");
            polls += 1;
            assert!(polls < 1000, "polls never reached every waiting queue: {:?}", visits());
        }
        let before = visits();
        progress_all_waiting();
        assert!(visits().iter().zip(&before).all(|(a, b)| a - b == 1), "a channel wait visits every queue once");
        for w in &weak {
            set_waiting(w, false);
        }
    }
}

//! The retry registry: send queues of this process with WQEs waiting behind an RNR or a
//! retry. A NIC retries on its own; here the poster's CPU must, so every CQ poll and channel
//! wait in the process progresses them. The CQ calls this registry, never the QP module
//! (which registers its send queues here), so the stack stays one-way.

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Instant;

/// A send queue that can be progressed from outside its owner's post (the QP module's
/// `SqCell`).
pub(crate) trait Waiter: Send + Sync {
    /// Runs what is due in the queue, unless its owner is posting right now (it progresses
    /// the queue itself then). `foreign`: the caller is not the thread that queued the
    /// waiting WQEs, and should only step in for an owner that stopped polling (see
    /// [`progress_waiting`]). `now`: the time, read once by the caller for every queue it
    /// visits.
    fn try_progress(&self, foreign: bool, now: Instant);
}

/// Send queues of this process with WQEs waiting behind an RNR or a retry, each with the
/// thread that queued them ([`thread_token`]) and its position holder. Every CQ poll in the
/// process (whichever CQ: a pingpong waits on its receive CQ) progresses them.
/// `WAITING_COUNT` keeps the check to one load when nothing waits.
static WAITING: Mutex<Vec<Listed>> = Mutex::new(Vec::new());
static WAITING_COUNT: AtomicU32 = AtomicU32::new(0);

/// An entry of the waiting list: the queue, the thread that queued its waiting WQEs, and its
/// position holder.
type Listed = (Weak<dyn Waiter>, u64, ListPos);

/// A registered queue's index in the waiting list, so that leaving it is a `swap_remove`
/// rather than a search: with 256 QPs starting and stopping to wait thousands of times a
/// second, the search (`retain` over every entry, under the lock) was 7.6% of `dp-perf
/// send_bw -b --use-srq -q 256` (`perf`, session 29). Written only under the list's lock.
#[derive(Clone, Default)]
pub(crate) struct ListPos(Arc<AtomicUsize>);

/// Hands out thread tokens.
static NEXT_TOKEN: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// This thread's token: which thread queued a waiting send.
    static TOKEN: u64 = NEXT_TOKEN.fetch_add(1, Ordering::Relaxed);
}

/// The calling thread's token (never 0).
fn thread_token() -> u64 {
    TOKEN.with(|t| *t)
}

/// Adds (`on`, owned by the calling thread: the one whose post queued the waiting WQE) or
/// removes a send queue from the registry; `at` holds its position while it is listed. The
/// caller calls it only when the queue's state changes (on, then off, ...).
pub(crate) fn set_waiting(w: &Weak<dyn Waiter>, at: &ListPos, on: bool) {
    let mut list = WAITING.lock().unwrap_or_else(|e| e.into_inner());
    // Relaxed: the positions are read and written only under the list's lock.
    if on {
        at.0.store(list.len(), Ordering::Relaxed);
        list.push((w.clone(), thread_token(), at.clone()));
    } else {
        let at_i = at.0.load(Ordering::Relaxed);
        // (The position is always right; the search is only a guard against a stale one.)
        let i = if list.get(at_i).is_some_and(|(x, ..)| x.ptr_eq(w)) {
            Some(at_i)
        } else {
            list.iter().position(|(x, ..)| x.ptr_eq(w))
        };
        if let Some(i) = i {
            list.swap_remove(i);
            if let Some((_, _, moved)) = list.get(i) {
                moved.0.store(i, Ordering::Relaxed);
            }
        }
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

/// Other threads' queues a poll visits at most, besides up to [`POLL_BUDGET`] of its own
/// thread's ([`progress_waiting`]: they are visited only to catch an owner that stopped
/// polling, and most such visits do nothing), so that they do not use up the budget of the
/// poller's own queues.
pub(crate) const FOREIGN_BUDGET: usize = 2;

/// Entries of the waiting list one poll reads at most per round robin.
const WALK: usize = 4 * POLL_BUDGET;

/// Progresses up to [`POLL_BUDGET`] waiting send queues of this thread and up to
/// [`FOREIGN_BUDGET`] of other threads (skipping those being posted to): what a CQ poll
/// does. Queues another thread owns are visited as `foreign`: the queue then runs only a
/// retry that is overdue (`SqCell`'s `try_progress`), because
/// its owner, polling its own CQs, retries it on time, and a second thread retrying it
/// delivers into the same receive queue and CQ from another core. With 256 QPs into one
/// SRQ, the receiving thread did that much of the senders' delivery on their behalf, and
/// the two threads fought over the SRQ's ring (`dp-perf send_bw --use-srq -q 256`,
/// docs/benchmarks.md, session 28). An owner that stopped polling (it posts from one thread
/// and polls from another) still gets its sends retried, late by at most the grace.
#[inline]
pub(crate) fn progress_waiting() {
    if WAITING_COUNT.load(Ordering::Relaxed) != 0 {
        progress_waiting_slow(POLL_BUDGET, false);
    }
}

/// Progresses every waiting send queue of the process, each as if its owner did: what a
/// completion channel's waiter does each time it wakes to retry (it may sleep a millisecond
/// between two, so no owner is polling on time).
pub(crate) fn progress_all_waiting() {
    if WAITING_COUNT.load(Ordering::Relaxed) != 0 {
        progress_waiting_slow(usize::MAX, true);
    }
}

thread_local! {
    /// Reused list of waiting send queues: progress runs on the busy-poll path whenever a send
    /// waits on RNR, so after warm-up it must not allocate.
    static SCRATCH: std::cell::RefCell<Vec<(Arc<dyn Waiter>, bool)>> = const { std::cell::RefCell::new(Vec::new()) };
    /// Where this thread's next budgeted progress looks for its own queues in the waiting
    /// list, and where it looks for other threads' queues.
    static OWN_CURSOR: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    static FOREIGN_CURSOR: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// `as_owner`: visit every queue as its owner would (a channel waiter), not only this
/// thread's.
#[cold]
fn progress_waiting_slow(budget: usize, as_owner: bool) {
    let me = thread_token();
    SCRATCH.with(|scratch| {
        let Ok(mut cells) = scratch.try_borrow_mut() else { return };
        {
            let list = WAITING.lock().unwrap_or_else(|e| e.into_inner());
            let n = list.len();
            if n == 0 {
                return;
            }
            // Two round robins, each from where this thread's last poll stopped: up to
            // `budget` of this thread's queues, and up to `FOREIGN_BUDGET` of other threads'.
            // Each walks at most `WALK` entries (reading owners is cheap; upgrading and
            // locking is not), and resumes right after the last queue it took, so a queue of
            // its kind is never passed over.
            let walk = if as_owner { n } else { n.min(WALK) };
            for (is_foreign, cursor, cap) in [(false, &OWN_CURSOR, budget), (true, &FOREIGN_CURSOR, FOREIGN_BUDGET)] {
                if is_foreign && as_owner {
                    break;
                }
                let start = cursor.get() % n;
                let (mut taken, mut resume) = (0, start + walk);
                for k in 0..walk {
                    if taken == cap {
                        resume = start + k;
                        break;
                    }
                    let (w, owner, _) = &list[(start + k) % n];
                    if (!as_owner && *owner != me) != is_foreign {
                        continue;
                    }
                    taken += 1;
                    if let Some(c) = w.upgrade() {
                        cells.push((c, is_foreign));
                    }
                }
                cursor.set(resume % n);
            }
        }
        // The list lock is released: progress may deregister a queue (which takes it).
        let now = Instant::now();
        for (c, foreign) in cells.iter() {
            c.try_progress(*foreign, now);
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
        /// Of those, the calls that said the caller is not the queue's owner.
        foreign: AtomicUsize,
    }

    impl Counting {
        fn new(owner: ThreadId) -> Arc<Counting> {
            Arc::new(Counting { owner, n: AtomicUsize::new(0), foreign: AtomicUsize::new(0) })
        }
    }

    impl Waiter for Counting {
        fn try_progress(&self, foreign: bool, _now: Instant) {
            if std::thread::current().id() == self.owner {
                self.n.fetch_add(1, Ordering::Relaxed);
                self.foreign.fetch_add(usize::from(foreign), Ordering::Relaxed);
            }
        }
    }

    /// Queues as the tests register them: the counting queues, their weak handles and their
    /// position holders.
    type Queues = (Vec<Arc<Counting>>, Vec<Weak<dyn Waiter>>, Vec<ListPos>);

    /// `n` counting queues owned by this thread, their weak handles and position holders.
    fn queues(n: usize) -> Queues {
        let me = std::thread::current().id();
        let qs: Vec<Arc<Counting>> = (0..n).map(|_| Counting::new(me)).collect();
        let weak = qs.iter().map(|q| Arc::downgrade(q) as Weak<dyn Waiter>).collect();
        (qs, weak, (0..n).map(|_| ListPos::default()).collect())
    }

    /// Registers (`on`) or removes every queue of `weak`, with its position holder.
    fn set_all(weak: &[Weak<dyn Waiter>], pos: &[ListPos], on: bool) {
        weak.iter().zip(pos).for_each(|(w, p)| set_waiting(w, p, on));
    }

    /// A poll progresses at most `POLL_BUDGET` waiting queues, round robin, so every one of 40
    /// waiting queues is reached by a few polls; a channel waiter progresses each once.
    #[test]
    fn polls_progress_a_bounded_share_round_robin_and_channel_waits_all() {
        let (qs, weak, pos) = queues(40);
        set_all(&weak, &pos, true);
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
        set_all(&weak, &pos, false);
    }

    /// A queue registered by another thread is visited as foreign by a poll here, one this
    /// thread registered is not, and a channel wait visits both as their owner.
    #[test]
    fn a_poll_visits_other_threads_queues_as_foreign() {
        let me = std::thread::current().id();
        let (mine, theirs) = (Counting::new(me), Counting::new(me));
        let w_mine: Weak<dyn Waiter> = Arc::downgrade(&mine) as Weak<dyn Waiter>;
        let w_theirs: Weak<dyn Waiter> = Arc::downgrade(&theirs) as Weak<dyn Waiter>;
        let (p_mine, p_theirs) = (ListPos::default(), ListPos::default());
        set_waiting(&w_mine, &p_mine, true);
        let (w, p) = (w_theirs.clone(), p_theirs.clone());
        std::thread::spawn(move || set_waiting(&w, &p, true)).join().unwrap();
        let mut polls = 0;
        while mine.n.load(Ordering::Relaxed) == 0 || theirs.n.load(Ordering::Relaxed) == 0 {
            progress_waiting();
            polls += 1;
            assert!(polls < 10_000, "polls never reached both queues");
        }
        assert_eq!(mine.foreign.load(Ordering::Relaxed), 0, "this thread's queue was visited as foreign");
        assert_eq!(
            theirs.foreign.load(Ordering::Relaxed),
            theirs.n.load(Ordering::Relaxed),
            "another thread's queue was visited as its owner"
        );
        let before = (mine.foreign.load(Ordering::Relaxed), theirs.foreign.load(Ordering::Relaxed));
        progress_all_waiting();
        let after = (mine.foreign.load(Ordering::Relaxed), theirs.foreign.load(Ordering::Relaxed));
        assert_eq!(before, after, "a channel wait visited a queue as foreign");
        set_waiting(&w_mine, &p_mine, false);
        set_waiting(&w_theirs, &p_theirs, false);
    }

    /// Leaving the list from the middle, the end and the front keeps every other queue
    /// findable at its recorded position (the `swap_remove` moves the last one).
    #[test]
    fn positions_follow_swap_removes() {
        let (_qs, weak, pos) = queues(5);
        set_all(&weak, &pos, true);
        let listed = |k: usize| {
            let list = WAITING.lock().unwrap();
            let at = pos[k].0.load(Ordering::Relaxed);
            list.get(at).is_some_and(|(x, ..)| x.ptr_eq(&weak[k]))
        };
        let mut gone = Vec::new();
        for g in [2, 4, 0] {
            set_waiting(&weak[g], &pos[g], false);
            gone.push(g);
            for k in (0..5).filter(|k| !gone.contains(k)) {
                assert!(listed(k), "queue {k} is not at its recorded position after {g} left");
            }
            let list = WAITING.lock().unwrap();
            assert!(!list.iter().any(|(x, ..)| x.ptr_eq(&weak[g])), "queue {g} is still listed");
        }
        for k in [1, 3] {
            set_waiting(&weak[k], &pos[k], false);
        }
    }

    /// Other threads' queues take at most `FOREIGN_BUDGET` of a poll, and every one of them
    /// is still reached: the foreign round robin resumes after the last queue it took.
    #[test]
    fn other_threads_queues_take_a_small_share_and_none_is_starved() {
        let (qs, weak, pos) = queues(20);
        let (w, p) = (weak.clone(), pos.clone());
        std::thread::spawn(move || set_all(&w, &p, true)).join().unwrap();
        let total = || qs.iter().map(|q| q.n.load(Ordering::Relaxed)).sum::<usize>();
        let mut polls = 0;
        while qs.iter().any(|q| q.n.load(Ordering::Relaxed) == 0) {
            let before = total();
            progress_waiting();
            assert!(total() - before <= FOREIGN_BUDGET, "one poll visited more than FOREIGN_BUDGET foreign queues");
            polls += 1;
            assert!(polls < 1000, "a foreign queue was never reached");
        }
        set_all(&weak, &pos, false);
    }
}

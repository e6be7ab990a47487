//! The send queue's lock ([`OwnerLock`]): a spin flag for every user but the poster, who
//! skips it while no other thread has anything to do in the queue.
//!
//! A send queue has two kinds of users. Its QP handle posts to it (and queries and modifies
//! it: one thread at a time, `&mut self`). CQ polls anywhere in the process progress the WQEs
//! that wait in it behind an RNR or a retry (`retry`), which only happens while the queue is
//! listed as waiting. Everyone takes `busy`, an uncontended spin flag, as rdma-core's
//! providers take a spinlock in `ibv_post_send`, except the handle's posts while the queue is
//! *closed* (nothing waits in it): they take no locked instruction. Taking the flag (a
//! locked read-modify-write, a full barrier) was ~5 ns of every post's critical path
//! (bench-ab 9 rounds, session 47: `dp-perf send_lat` 0.977, post list 1 rate 1.058, the
//! echo pipeline's latency 0.991).
//!
//! Why that is safe. `open` changes only while `busy` is held, and at rest it equals the
//! value's [`Waits::waiting`]:
//! - a progress ([`OwnerLock::try_lock_open`]) takes `busy`, then enters the value only if
//!   the queue is open; finding it closed, it lets go having read nothing but the two flags;
//! - the owner ([`OwnerLock::lock_owner`]) enters without `busy` only after reading `open ==
//!   false` (Acquire, pairing with the Release that closed it: every write of the last
//!   holder's section precedes that store, and the holder writes nothing after it). From
//!   then on no one else can open the queue: a progress finds it closed, and the handle's
//!   other methods, the only other users, cannot run during a post;
//! - a post that leaves WQEs waiting opens the queue as it ends, under `busy` (Release), so
//!   the progress that then enters sees everything the post wrote.
//!
//! `tools/loom.sh` model-checks it (`loom_tests`: an owner posting, opening and closing the
//! queue, against a progress, with loom's cell reporting any access of the value that the
//! flags do not order). It reports a seeded bug (the owner opening the queue without
//! `busy`); it does not report the close weakened to Relaxed, so that ordering rests on the
//! argument above.

#[cfg(loom)]
use loom::cell::UnsafeCell;
#[cfg(loom)]
use loom::sync::atomic::{AtomicBool, Ordering};
#[cfg(not(loom))]
use std::cell::UnsafeCell;
#[cfg(not(loom))]
use std::sync::atomic::{AtomicBool, Ordering};

/// What the lock needs to know of the value it guards.
pub(crate) trait Waits {
    /// Whether other threads have work in it (WQEs waiting for a CQ poll's progress).
    fn waiting(&self) -> bool;
}

/// A value (the send queue's state) behind the two-way lock of the module docs.
pub(crate) struct OwnerLock<T> {
    busy: AtomicBool,
    /// Whether threads other than the owner's may enter the value (see the module docs).
    open: AtomicBool,
    value: UnsafeCell<T>,
}

// SAFETY: the value is only reached through a guard, by a holder of `busy` (Acquire on take,
// Release on give) or by the owner while the queue is closed, when no other thread enters it
// (module docs); `T: Send` lets it be used from whichever thread holds it.
unsafe impl<T: Send> Sync for OwnerLock<T> {}

/// Access to the value; lets go when dropped (opening or closing the queue as the value
/// then says).
pub(crate) struct Guard<'a, T: Waits> {
    lock: &'a OwnerLock<T>,
    /// Taken by the owner without `busy` (the queue was closed).
    light: bool,
    /// loom's record of the access, ended before the flags let go.
    #[cfg(loom)]
    access: Option<loom::cell::MutPtr<T>>,
}

impl<T: Waits> Guard<'_, T> {
    #[cfg(not(loom))]
    fn ptr(&self) -> *mut T {
        self.lock.value.get()
    }

    #[cfg(loom)]
    fn ptr(&self) -> *mut T {
        self.access.as_ref().expect("a live guard").with(|p| p)
    }
}

impl<T: Waits> std::ops::Deref for Guard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the guard holds `busy`, or is the owner's on a closed queue: no other
        // reference to the value exists either way (module docs; loom checks it).
        unsafe { &*self.ptr() }
    }
}

impl<T: Waits> std::ops::DerefMut for Guard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in `deref`; `&mut self` makes this the guard's only reference.
        unsafe { &mut *self.ptr() }
    }
}

impl<T: Waits> Drop for Guard<'_, T> {
    fn drop(&mut self) {
        let waiting = self.waiting();
        #[cfg(loom)]
        drop(self.access.take());
        if self.light {
            // WQEs now wait: open the queue to the progress of CQ polls, under `busy` (a
            // progress holding it meanwhile found the queue closed and touched nothing).
            if waiting {
                self.lock.take_busy();
                self.lock.open.store(true, Ordering::Relaxed);
                self.lock.busy.store(false, Ordering::Release);
            }
        } else {
            // Release: an owner that reads the queue closed sees this section's writes.
            self.lock.open.store(waiting, Ordering::Release);
            self.lock.busy.store(false, Ordering::Release);
        }
    }
}

impl<T: Waits> OwnerLock<T> {
    /// `value`, closed and free (it must not be [`Waits::waiting`]).
    pub(crate) fn new(value: T) -> OwnerLock<T> {
        debug_assert!(!value.waiting(), "a new queue has nothing waiting");
        OwnerLock { busy: AtomicBool::new(false), open: AtomicBool::new(false), value: UnsafeCell::new(value) }
    }

    fn guard(&self, light: bool) -> Guard<'_, T> {
        Guard {
            lock: self,
            light,
            #[cfg(loom)]
            access: Some(self.value.get_mut()),
        }
    }

    /// Takes `busy` if it is free (a failed attempt writes nothing).
    #[inline]
    fn try_take_busy(&self) -> bool {
        self.busy.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).is_ok()
    }

    #[inline]
    fn take_busy(&self) {
        while !self.try_take_busy() {
            // (Under loom a spin must yield, or the model never lets the holder run.)
            #[cfg(loom)]
            loom::thread::yield_now();
            #[cfg(not(loom))]
            std::hint::spin_loop();
        }
    }

    /// The value, for any user: waits for `busy`.
    #[inline]
    pub(crate) fn lock(&self) -> Guard<'_, T> {
        self.take_busy();
        self.guard(false)
    }

    /// The value, for the owner's posts: without a locked instruction while the queue is
    /// closed, else as [`lock`](Self::lock).
    ///
    /// # Safety
    /// No other use of the value but a progress ([`try_lock_open`](Self::try_lock_open))
    /// may overlap this guard's life: the caller is a `&mut self` method of the value's one
    /// owner (the QP handle), whose other methods are the value's only other users.
    #[inline]
    pub(crate) unsafe fn lock_owner(&self) -> Guard<'_, T> {
        if self.open.load(Ordering::Acquire) {
            return self.lock();
        }
        self.guard(true)
    }

    /// The value, for a progress from a CQ poll: `None` if someone holds it, or if the queue
    /// is closed (nothing waits in it, and its owner may be posting without `busy`).
    pub(crate) fn try_lock_open(&self) -> Option<Guard<'_, T>> {
        if !self.try_take_busy() {
            return None;
        }
        // (Relaxed: `open` changes only under `busy`, which the Acquire above ordered.)
        if !self.open.load(Ordering::Relaxed) {
            self.busy.store(false, Ordering::Release);
            return None;
        }
        Some(self.guard(false))
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Queue {
        waiting: bool,
    }

    impl Waits for Queue {
        fn waiting(&self) -> bool {
            self.waiting
        }
    }

    fn flags(l: &OwnerLock<Queue>) -> (bool, bool) {
        (l.busy.load(Ordering::Relaxed), l.open.load(Ordering::Relaxed))
    }

    #[test]
    fn failed_try_lock_keeps_the_holders_lock() {
        let l = OwnerLock::new(Queue::default());
        // A holder that leaves WQEs waiting opens the queue.
        l.lock().waiting = true;
        assert_eq!(flags(&l), (false, true));
        let held = l.lock();
        assert!(l.try_lock_open().is_none());
        assert_eq!(flags(&l), (true, true), "a failed try_lock released the holder's lock");
        drop(held);
        assert!(l.try_lock_open().is_some());
        assert_eq!(flags(&l), (false, true));
    }

    #[test]
    fn a_closed_queue_is_not_entered_by_progress_and_is_posted_to_without_the_flag() {
        let l = OwnerLock::new(Queue::default());
        // Closed (nothing waits): the owner's guard does not take `busy`, and a progress lets
        // go at once, leaving the flag free and the queue closed.
        // SAFETY: no other user of the lock in this test.
        let g = unsafe { l.lock_owner() };
        assert_eq!(flags(&l), (false, false), "the owner took the flag of a closed queue");
        assert!(l.try_lock_open().is_none(), "a progress entered a closed queue");
        assert_eq!(flags(&l), (false, false), "a progress that found the queue closed kept the flag");
        drop(g);
        assert_eq!(flags(&l), (false, false));
        // A post that leaves WQEs waiting opens the queue as it ends...
        // SAFETY: as above.
        let mut g = unsafe { l.lock_owner() };
        g.waiting = true;
        drop(g);
        assert_eq!(flags(&l), (false, true), "waiting WQEs left the queue closed");
        // ...and the owner then takes the flag like everyone else.
        // SAFETY: as above.
        let g = unsafe { l.lock_owner() };
        assert_eq!(flags(&l), (true, true), "the owner entered an open queue without the flag");
        assert!(l.try_lock_open().is_none());
        drop(g);
        // A progress that drains it closes it.
        let mut g = l.try_lock_open().expect("an open, free queue");
        g.waiting = false;
        drop(g);
        assert_eq!(flags(&l), (false, false));
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::sync::Arc;
    use loom::thread;

    /// A send queue's state as the lock sees it: WQEs waiting, and a count every user bumps
    /// (a plain field: loom's cell reports any two accesses the flags do not order).
    struct Queue {
        waiting: u32,
        touched: u32,
    }

    impl Waits for Queue {
        fn waiting(&self) -> bool {
            self.waiting > 0
        }
    }

    /// The owner posts twice (the first post leaves a WQE waiting, the second finds it still
    /// there or drained), while a CQ poll's progress tries twice to drain it.
    #[test]
    fn loom_owner_posts_while_a_progress_drains() {
        loom::model(|| {
            let l = Arc::new(OwnerLock::new(Queue { waiting: 0, touched: 0 }));
            let poller = {
                let l = l.clone();
                thread::spawn(move || {
                    let mut entered = 0;
                    for _ in 0..2 {
                        if let Some(mut g) = l.try_lock_open() {
                            assert!(g.waiting > 0, "a progress entered a queue with nothing waiting");
                            g.waiting -= 1;
                            g.touched += 1;
                            entered += 1;
                        }
                    }
                    entered
                })
            };
            for post in 0..2 {
                // SAFETY: this thread is the lock's only owner.
                let mut g = unsafe { l.lock_owner() };
                g.touched += 1;
                if post == 0 {
                    g.waiting += 1;
                }
            }
            let entered = poller.join().unwrap();
            let g = l.lock();
            assert_eq!(g.touched, 2 + entered);
            assert_eq!(g.waiting, 1 - entered);
        });
    }
}

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

/// Progresses every waiting send queue of the process (skipping those being posted to).
#[inline]
pub(crate) fn progress_waiting() {
    if WAITING_COUNT.load(Ordering::Relaxed) != 0 {
        progress_waiting_slow();
    }
}

thread_local! {
    /// Reused list of waiting send queues: progress runs on the busy-poll path whenever a send
    /// waits on RNR, so after warm-up it must not allocate.
    static SCRATCH: std::cell::RefCell<Vec<Arc<dyn Waiter>>> = const { std::cell::RefCell::new(Vec::new()) };
}

#[cold]
fn progress_waiting_slow() {
    SCRATCH.with(|scratch| {
        let Ok(mut cells) = scratch.try_borrow_mut() else { return };
        cells.extend(WAITING.lock().unwrap_or_else(|e| e.into_inner()).iter().filter_map(Weak::upgrade));
        // The list lock is released: progress may deregister a queue (which takes it).
        for c in cells.iter() {
            c.try_progress();
        }
        cells.clear();
    });
}

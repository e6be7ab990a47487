//! Completion channels: where armed CQs signal their completion events, and where a thread can
//! sleep until one comes (`ibv_get_cq_event`), across processes.
//!
//! A channel is a block in the fabric: a 32-bit event counter that waiters sleep on with a
//! shared (not process-private) futex, and a ring of CQ numbers. Signalling is the slow path
//! (only an armed CQ does it, once per arming); the busy-poll path never sleeps or wakes.

use super::fabric::Fabric;
use super::layout::EVENT_STRIDE;
use super::ring::{Pop, Ring, RING_HEADER_LEN};
use super::wire::EventRecord;
use super::CtxInner;
use crate::verbs::{Errno, Error, Result};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const CAP: usize = 256;
const WORD_LEN: u64 = 128;

fn bytes() -> u64 {
    WORD_LEN + Ring::bytes(CAP, EVENT_STRIDE) as u64
}

/// A view of a channel block, checked against the fabric.
pub(crate) struct ChannelView<'a> {
    word: &'a AtomicU32,
    ring: Ring,
}

impl<'a> ChannelView<'a> {
    pub(crate) fn attach(f: &'a Fabric, off: u64) -> Option<ChannelView<'a>> {
        if off == 0 {
            return None;
        }
        let p = f.ptr(off, bytes())?;
        if off % 128 != 0 {
            return None;
        }
        // SAFETY: the block is inside the arena (checked) and 128-aligned; its first word is
        // only accessed atomically.
        let word = unsafe { &*(p as *const AtomicU32) };
        let ring = f.ring(off + WORD_LEN, CAP, EVENT_STRIDE).ok()?;
        Some(ChannelView { word, ring })
    }

    /// Queues an event for CQ `cqn` and wakes every waiter.
    pub(crate) fn signal(&self, cqn: u32) {
        self.ring.push(|mut c| c.put(0, &EventRecord { kind: cqn, element: 0 }));
        self.word.fetch_add(1, Ordering::Release);
        // SAFETY: FUTEX_WAKE on a 4-byte aligned word of a shared mapping; no pointer is
        // dereferenced by the kernel beyond the word.
        unsafe { libc::syscall(libc::SYS_futex, self.word as *const AtomicU32, libc::FUTEX_WAKE, i32::MAX) };
    }

    fn pop(&self) -> Option<u32> {
        let mut cqn = 0;
        match self.ring.pop(|c| cqn = c.get::<EventRecord>(0).kind) {
            Pop::Item => Some(cqn),
            // A corrupt ring: no event (a waiter wakes on the timeout it chose).
            Pop::Empty | Pop::Stalled => None,
        }
    }
}

pub(crate) struct ChannelInner {
    ctx: Arc<CtxInner>,
    pub(crate) off: u64,
}

impl Drop for ChannelInner {
    fn drop(&mut self) {
        self.ctx.fabric.free(self.off, bytes());
    }
}

/// A completion channel of the `shm` provider (`struct ibv_comp_channel`).
pub struct ShmCompChannel {
    pub(crate) inner: Arc<ChannelInner>,
}

/// How often a channel wait wakes to retry this process's waiting sends (see
/// [`ShmCompChannel::get_cq_event`]): below the shortest ACK timeout anyone sets, and far above
/// a futex round trip.
const RETRY_TICK: Duration = Duration::from_millis(1);

impl ShmCompChannel {
    pub(crate) fn inner_ctx(&self) -> &CtxInner {
        &self.inner.ctx
    }

    pub(crate) fn create(ctx: &Arc<CtxInner>) -> Result<ShmCompChannel> {
        let f = &ctx.fabric;
        let off = f.alloc(bytes())?;
        let p = f.ptr(off, WORD_LEN).ok_or_else(|| Error::new(Errno::EFAULT, "channel outside the arena"))?;
        // SAFETY: a fresh, unpublished block inside the arena.
        unsafe { (*(p as *const AtomicU32)).store(0, Ordering::Relaxed) };
        f.init_ring(off + WORD_LEN, CAP, EVENT_STRIDE)?;
        debug_assert!(WORD_LEN as usize >= std::mem::size_of::<u32>() && RING_HEADER_LEN % 128 == 0);
        Ok(ShmCompChannel { inner: Arc::new(ChannelInner { ctx: ctx.clone(), off }) })
    }

    /// `ibv_get_cq_event`: waits until an armed CQ of this channel signals, for at most
    /// `timeout` (`None`: forever). Returns the CQ number, or `None` on timeout. Events need no
    /// acknowledgement.
    ///
    /// While some send queue of this process waits behind an RNR or an unready target, the
    /// wait wakes every `RETRY_TICK` (1 ms) to retry it: on `shm` the poster's CPU is the NIC, and a
    /// process asleep on its channel would otherwise never resend (a peer that posts its
    /// receive, or brings its QP up, only after our send arrived would wait forever).
    pub fn get_cq_event(&self, timeout: Option<Duration>) -> Result<Option<u32>> {
        let f = &self.inner.ctx.fabric;
        let ch = ChannelView::attach(f, self.inner.off).ok_or_else(|| Error::new(Errno::EFAULT, "corrupt channel"))?;
        let end = timeout.map(|t| Instant::now() + t);
        loop {
            let seen = ch.word.load(Ordering::Acquire);
            if let Some(cqn) = ch.pop() {
                return Ok(Some(cqn));
            }
            super::retry::progress_all_waiting();
            if let Some(cqn) = ch.pop() {
                return Ok(Some(cqn));
            }
            let left = match end {
                Some(e) => match e.checked_duration_since(Instant::now()) {
                    Some(l) if !l.is_zero() => Some(l),
                    _ => return Ok(None),
                },
                None => None,
            };
            let left =
                if super::retry::sends_waiting() { Some(left.map_or(RETRY_TICK, |l| l.min(RETRY_TICK))) } else { left };
            let ts =
                left.map(|l| libc::timespec { tv_sec: l.as_secs() as libc::time_t, tv_nsec: l.subsec_nanos() as _ });
            let tsp = ts.as_ref().map_or(std::ptr::null(), |t| t as *const libc::timespec);
            // SAFETY: FUTEX_WAIT on a word of the shared mapping with a valid (or null) timeout;
            // it returns at once if the word changed since `seen` (no lost wake-up).
            let r = unsafe { libc::syscall(libc::SYS_futex, ch.word as *const AtomicU32, libc::FUTEX_WAIT, seen, tsp) };
            if r != 0 {
                let e = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
                if !matches!(e, libc::EAGAIN | libc::EINTR | libc::ETIMEDOUT) {
                    return Err(Error::new(Errno::from_raw(e), "futex wait on the completion channel failed"));
                }
            }
        }
    }
}

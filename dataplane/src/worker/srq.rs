//! Receive buffers: the worker's SRQ and the QPs' own receive queues kept filled.
//!
//! Each receive queue has a [`Level`] (how many buffers it should hold, and when to top it
//! up); [`RecvBuffers`] posts buffers from the worker's [`PoolCache`] to any of them with one
//! call (one doorbell: a chained post on providers without a faster way, one ring write on
//! `shm`) and keeps the bookkeeping common to all: a posted buffer's `wr_id` is its address,
//! so a receive completion maps back to its buffer ([`BufferPool::index_at`]), and the tags
//! of the handles posted (per pool buffer, 0 when not posted) rebuild the handle without
//! reading the pool's shared state and let shutdown return the buffers still sitting in a
//! queue (an SRQ is not flushed when its QPs enter ERROR). The [`Replenisher`] is the SRQ's
//! level, its limit event and the SRQ itself; a QP's own receive queue is posted through its
//! QP.

use super::stats::WorkerCounters;
use crate::mem::{Buf, BufferPool, PoolCache};
use crate::provider::Srq;
use crate::verbs::{PostError, RecvChain, SrqAttr, SrqAttrMask};

/// How full one receive queue is kept: `depth` buffers, refilled below `low` or as soon as
/// a top-up batch is missing ([`Level::set_top_up`]).
#[derive(Debug, Clone)]
pub struct Level {
    depth: u32,
    low: u32,
    /// Missing buffers that trigger a top-up before the low watermark.
    top_up: u32,
    posted: u32,
    /// Pool index of the buffer this queue was given last ([`NO_NEXT`] before the first
    /// refill): the next refill's first buffer is consumed after it.
    last: u32,
}

impl Level {
    /// A queue of `depth` buffers, refilled below `low` (at most `depth - 1`).
    pub fn new(depth: u32, low: u32) -> Level {
        let low = low.min(depth.saturating_sub(1));
        Level { depth, low, top_up: Level::max_top_up(depth, low), posted: 0, last: NO_NEXT }
    }

    /// The largest top-up batch: `depth - low + 1` (missing that many is being below `low`),
    /// but at most `depth`, so that a queue with a watermark of 0 (a depth of 1 gets one:
    /// `low < depth`) is refilled once empty rather than never; at least 1 (a level of depth
    /// 0 is never due all the same: nothing is ever missing).
    fn max_top_up(depth: u32, low: u32) -> u32 {
        (depth - low + 1).min(depth).max(1)
    }

    /// Tops the queue up as soon as `n` buffers are missing (at least 1; at most
    /// `depth - low + 1`, the default: refill only below the watermark; with a watermark of
    /// 0, at most `depth`: refill once empty).
    ///
    /// Why: a refill takes its buffers from the worker's [`PoolCache`], and the receives
    /// return them one by one. A swing larger than the cache's batch overflows the cache on
    /// the way back and pulls from the shared ring on the way out, so every buffer crosses
    /// the pool's ring (the echo pipeline: 768-buffer refills through a 256-buffer cache,
    /// ~130 instructions per echoed message in the ring). Topping up in cache-sized batches
    /// keeps the buffers in the cache, and keeps the queue fuller.
    pub fn set_top_up(&mut self, n: u32) {
        self.top_up = n.clamp(1, Level::max_top_up(self.depth, self.low));
    }

    /// Buffers currently posted.
    pub fn posted(&self) -> u32 {
        self.posted
    }

    /// Buffers missing: what the next refill posts (0 once stopped).
    #[inline]
    pub fn missing(&self) -> usize {
        self.depth.saturating_sub(self.posted) as usize
    }

    /// One posted buffer was received (or flushed).
    #[inline]
    pub fn received(&mut self) {
        self.posted = self.posted.saturating_sub(1);
    }

    /// Whether a refill is due: below the low watermark, or a top-up batch missing.
    #[inline]
    pub fn due(&self) -> bool {
        self.posted < self.low || self.depth.saturating_sub(self.posted) >= self.top_up
    }

    /// The queue's QP is in ERROR (a receive came back flushed): everything posted to it
    /// will be flushed, so it is never refilled again (else each refill would come straight
    /// back flushed, loop after loop, until teardown).
    pub fn stop(&mut self) {
        *self = Level { posted: self.posted, ..Level::new(0, 0) };
    }
}

/// [`Posted::next`] of a buffer whose successor in its queue is not posted yet.
const NO_NEXT: u32 = u32::MAX;

/// What the worker keeps per pool buffer while it sits in one of its receive queues.
#[derive(Debug, Clone, Copy)]
struct Posted {
    /// The tag of the posted handle; 0 when the buffer is not posted.
    tag: u32,
    /// The pool index of the buffer posted right after it on the same queue ([`NO_NEXT`]
    /// if none yet): the one the queue's next receive lands in, since a receive queue (an
    /// SRQ too) is consumed in posting order. A hint for [`RecvBuffers::prefetch_next`]
    /// only, never a handle: a buffer re-posted elsewhere in between costs one useless
    /// prefetch.
    next: u32,
}

/// The worker's receive buffers while they are posted, on whichever queue.
pub struct RecvBuffers {
    /// Scratch for providers that post a refill as a chain.
    chain: RecvChain,
    /// The addresses of the buffers of a refill, posted in one call.
    addrs: Vec<u64>,
    /// The buffers of `addrs`, in order (so the bookkeeping after the post need not map each
    /// `wr_id` back to its buffer).
    bufs: Vec<Buf>,
    buf_len: u32,
    lkey: u32,
    pool: BufferPool,
    /// Per pool buffer: the tag of its handle while posted on one of the worker's receive
    /// queues, 0 otherwise (a held buffer's tag is odd), and the buffer posted after it.
    /// Kept here so that a receive maps its `wr_id` back to the handle without reading the
    /// pool's state word, a line other workers of a shared pool write
    /// ([`BufferPool::index_at`]).
    posted: Vec<Posted>,
    /// Buffers of completed sends kept for the next refill ([`keep_spares`](Self::keep_spares)),
    /// still the worker's: the refill posts them without a trip through the pool (a
    /// `PoolCache::put`'s double-free CAS and a `get`'s state update each).
    spare: Vec<Buf>,
}

impl RecvBuffers {
    /// Buffers of `buf_len` bytes of `pool` (registered with `lkey`), posted at most
    /// `max_batch` per refill (the deepest queue: the arrays are sized for it here, so that
    /// refills never allocate).
    pub fn new(buf_len: u32, lkey: u32, pool: &BufferPool, max_batch: u32) -> RecvBuffers {
        let n = max_batch as usize;
        RecvBuffers {
            chain: RecvChain::with_capacity(n, n),
            addrs: Vec::with_capacity(n),
            bufs: Vec::with_capacity(n),
            buf_len,
            lkey,
            posted: vec![Posted { tag: 0, next: NO_NEXT }; pool.count()],
            pool: pool.clone(),
            spare: Vec::with_capacity(n),
        }
    }

    /// Makes room for refills of up to `max_batch` buffers (a queue that deep was added).
    pub fn reserve(&mut self, max_batch: u32) {
        let n = max_batch as usize;
        if n > self.addrs.capacity() {
            self.addrs.reserve_exact(n);
            self.bufs.reserve_exact(n);
            self.spare.reserve_exact(n - self.spare.len());
            self.chain = RecvChain::with_capacity(n, n);
        }
    }

    /// Keeps the first of `bufs` (buffers of the worker's completed sends, still acquired
    /// from the pool) for the next refill, as many as `missing` (what the receive queues
    /// lack: the next refills will post that many) leaves room for beyond the spares already
    /// kept; returns how many it kept. The caller returns the others to the pool. Bounded by
    /// what the queues miss, spares never hold buffers the worker will not post soon (a
    /// worker that only sends keeps none), and never allocate (`spare` holds the deepest
    /// queue's refill).
    #[inline]
    pub fn keep_spares(&mut self, bufs: &[Buf], missing: usize) -> usize {
        let room = missing.min(self.spare.capacity()).saturating_sub(self.spare.len());
        let k = bufs.len().min(room);
        self.spare.extend_from_slice(&bufs[..k]);
        k
    }

    /// A receive completed: the buffer at `addr` left its queue. Returns its handle, or
    /// `None` for an address the worker did not post.
    #[inline]
    pub fn take(&mut self, addr: u64) -> Option<Buf> {
        let index = self.pool.index_at(addr)?;
        let tag = std::mem::take(&mut self.posted.get_mut(index as usize)?.tag);
        (tag != 0).then(|| self.pool.handle_at(index, tag))
    }

    /// The pool index of the buffer posted after the one at `addr` on its queue ([`NO_NEXT`]
    /// if none, or for an address the worker did not post). It stays readable once the
    /// buffer is [`take`](Self::take)n, until the buffer is posted again.
    fn next_after(&self, addr: u64) -> u32 {
        self.pool.index_at(addr).and_then(|i| self.posted.get(i as usize)).map_or(NO_NEXT, |p| p.next)
    }

    /// Fetches the buffer the queue of the one just received at `addr` fills next into this
    /// core's cache, for writing: the lines `len` bytes cover (the received message's length,
    /// the best guess of the next one's), at least one and at most 16. The worker calls it
    /// after a message that arrived alone (`Worker::step`), before any refill.
    ///
    /// Why: a queue of `depth` buffers hands each one out `depth` receives after it was
    /// posted, so the line a receive writes (the `shm` CQ copies a small payload there when
    /// it is polled; a NIC or a peer's copy writes it) and the stage then reads has left
    /// this core's caches meanwhile: with the default SRQ of 1,024 buffers of 2 KiB, a
    /// miss on each side of the echo pipeline's round trip (one-way 255 ns against 239 with
    /// an SRQ of 256, session 45). Fetched now, between messages, it is warm when the next
    /// one lands, as DDIO makes a NIC's writes land in the last-level cache.
    #[inline]
    pub fn prefetch_next(&self, addr: u64, len: u32) {
        let next = self.next_after(addr);
        if let Some(p) = self.posted.get(next as usize) {
            self.pool.prefetch_for_write(next, len as usize);
            // And the line `take` reads for it, from this worker's own memory: a plain load,
            // kept (`black_box`) though its value is not used.
            std::hint::black_box(p.tag);
        }
    }

    /// Posts the buffers `level` misses (as many as the cache gives) with one call of `post`
    /// (`addrs`, `len`, `lkey`, scratch chain: [`Srq::post_recv_buffers`] or
    /// [`crate::provider::Qp::post_recv_buffers`]). Returns how many were posted (0 when the
    /// cache had none), or the post's error, counted in `w.errors`: what it posted before the
    /// failure (`bad_wr` buffers) stays posted, the rest goes back to the cache.
    pub fn refill(
        &mut self,
        level: &mut Level,
        cache: &mut PoolCache,
        w: &WorkerCounters,
        post: impl FnOnce(&[u64], u32, u32, &mut RecvChain) -> Result<(), PostError>,
    ) -> Result<usize, PostError> {
        let want = (level.depth - level.posted.min(level.depth)) as usize;
        self.addrs.clear();
        self.bufs.clear();
        // Within the capacities reserved in `new` (`want <= depth <= max_batch`): no allocation.
        // The spares first (the newest, as a cache hands out its warmest), then the cache.
        let spared = self.spare.len().min(want);
        self.bufs.extend(self.spare.drain(self.spare.len() - spared..).rev());
        let n = spared + cache.get_into(&mut self.bufs, want - spared);
        if n == 0 {
            return Ok(0);
        }
        self.addrs.extend(self.bufs.iter().map(|b| b.addr()));
        let res = post(&self.addrs, self.buf_len, self.lkey, &mut self.chain);
        let ok = match &res {
            Ok(()) => n,
            Err(e) => {
                w.errors.add(1);
                e.bad_wr.min(n)
            }
        };
        if let (Some(first), Some(last)) = (self.bufs[..ok].first(), self.bufs[..ok].last()) {
            // The queue's order: its previous last buffer, then these in posting order.
            if let Some(p) = self.posted.get_mut(level.last as usize) {
                p.next = first.index();
            }
            for pair in self.bufs[..ok].windows(2) {
                self.posted[pair[0].index() as usize] = Posted { tag: pair[0].tag(), next: pair[1].index() };
            }
            self.posted[last.index() as usize] = Posted { tag: last.tag(), next: NO_NEXT };
            level.last = last.index();
        }
        for &buf in &self.bufs[ok..] {
            let _ = cache.put(buf);
        }
        level.posted += ok as u32;
        if ok > 0 {
            w.srq_refills.add(1);
            w.srq_posted.add(ok as u64);
        }
        res.map(|()| ok)
    }

    /// Returns every buffer still posted (at shutdown, when no more receives can land), and
    /// the spares.
    pub fn release_all(&mut self, cache: &mut PoolCache) {
        for buf in self.spare.drain(..) {
            let _ = cache.put(buf);
        }
        for (index, p) in self.posted.iter_mut().enumerate() {
            if p.tag != 0 {
                let _ = cache.put(self.pool.handle_at(index as u32, std::mem::take(&mut p.tag)));
            }
        }
    }
}

/// Keeps the worker's SRQ filled, once a QP receives through it ([`Replenisher::activate`]).
pub struct Replenisher<S: Srq> {
    pub(crate) srq: S,
    /// The SRQ's level; one of depth 0 (never due) until a QP receives through it.
    level: Level,
    /// The level it gets then (`activate`). Until then the SRQ is left empty: its buffers
    /// would be missing from the pool, which the config sizes for the queues in use. (A
    /// level of depth 0 rather than a flag: the loop's check stays `limit_hit || due`.)
    inactive: Option<Level>,
    /// Set by the SRQ limit event; cleared by the refill it triggers.
    limit_hit: bool,
}

impl<S: Srq> Replenisher<S> {
    /// A replenisher of `srq` holding `depth` buffers, refilled below `low`.
    pub fn new(srq: S, depth: u32, low: u32) -> Self {
        Replenisher { srq, level: Level::new(0, 0), inactive: Some(Level::new(depth, low)), limit_hit: false }
    }

    /// See [`Level::set_top_up`].
    pub fn set_top_up(&mut self, n: u32) {
        self.inactive.as_mut().unwrap_or(&mut self.level).set_top_up(n);
    }

    /// Receives currently posted.
    pub fn posted(&self) -> u32 {
        self.level.posted
    }

    /// The SRQ number (to match limit events).
    pub fn srq_num(&self) -> u32 {
        self.srq.srq_num()
    }

    /// A QP receives through the SRQ: fill it now, and keep it filled from here on.
    pub fn activate(&mut self, bufs: &mut RecvBuffers, cache: &mut PoolCache, w: &WorkerCounters) {
        if let Some(level) = self.inactive.take() {
            self.level = level;
            self.refill(bufs, cache, w);
        }
    }

    /// Arms the SRQ limit event at the low watermark (`ibv_modify_srq`); the event is a
    /// second trigger next to the worker's own count.
    pub fn arm(&mut self) {
        if self.level.low > 0 {
            let attr = SrqAttr { max_wr: self.level.depth, max_sge: 1, srq_limit: self.level.low };
            // Providers without limit events still work: the count below is the primary trigger.
            let _ = self.srq.modify(&attr, SrqAttrMask::LIMIT);
        }
    }

    /// The SRQ limit event fired.
    pub fn on_limit_event(&mut self) {
        self.limit_hit = true;
    }

    /// Buffers the SRQ misses: what its next refill posts (0 while inactive or stopped).
    #[inline]
    pub fn missing(&self) -> usize {
        self.level.missing()
    }

    /// `n` receives through the SRQ completed (their buffers came back through
    /// [`RecvBuffers::take`]).
    #[inline]
    pub fn received(&mut self, n: u32) {
        self.level.posted = self.level.posted.saturating_sub(n);
    }

    /// Whether [`Replenisher::maybe_refill`] would post (a QP uses the SRQ, and it is below
    /// its watermark, a top-up batch short, or its limit event fired).
    #[inline]
    pub fn wants_refill(&self) -> bool {
        self.limit_hit || self.level.due()
    }

    /// Refills to `depth` with one post if under the low watermark, the limit event fired, or
    /// at least the top-up batch is missing ([`Level::set_top_up`]). Returns whether it posted.
    #[inline]
    pub fn maybe_refill(&mut self, bufs: &mut RecvBuffers, cache: &mut PoolCache, w: &WorkerCounters) -> bool {
        if !self.wants_refill() {
            return false;
        }
        self.refill(bufs, cache, w)
    }

    /// Posts `depth - posted` buffers (as many as the pool gives) in one
    /// [`Srq::post_recv_buffers`] call.
    pub fn refill(&mut self, bufs: &mut RecvBuffers, cache: &mut PoolCache, w: &WorkerCounters) -> bool {
        // The limit needs arming again only if it may have fired (the count went below it, or
        // its event came): a fired limit is disarmed, an unfired one stays armed. A top-up
        // above the watermark leaves it alone, which on `rdma` saves an `ibv_modify_srq`
        // (a system call) per top-up.
        let rearm = self.limit_hit || self.level.posted < self.level.low;
        let srq = &mut self.srq;
        let before = self.level.posted;
        let res = bufs.refill(&mut self.level, cache, w, |a, len, lkey, c| srq.post_recv_buffers(a, len, lkey, c));
        if res == Ok(0) {
            return false;
        }
        self.limit_hit = false;
        if self.level.posted > before && rearm {
            self.arm();
        }
        true
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::verbs::{AccessFlags, QpCaps, QpType};
    use crate::worker::stats::WorkerStats;
    use crate::{Context, Mr, Pd, Qp, QpInitAttr};
    use std::sync::Arc;

    type Keep =
        (crate::shm::ShmContext, <crate::shm::Shm as crate::Provider>::Pd, <crate::shm::Shm as crate::Provider>::Mr);

    /// A replenisher of depth 64, low watermark 16, over a 256-buffer pool on a fresh fabric
    /// (its SRQ holds 512: the `take`s here are bookkeeping only, every posted buffer stays in
    /// it).
    fn setup(name: &str) -> (Replenisher<crate::shm::ShmSrq>, RecvBuffers, PoolCache, WorkerStats, Keep) {
        let ctx = crate::shm::unit_context(name);
        let pd = ctx.alloc_pd().unwrap();
        let region = Arc::new(ctx.alloc_region(256 * 64).unwrap());
        let mr = pd.reg_mr(&*region, 0, 256 * 64, AccessFlags::LOCAL_WRITE).unwrap();
        let pool = BufferPool::from_region(region, 0, 64, 256).unwrap();
        let srq = pd.create_srq(&SrqAttr { max_wr: 512, max_sge: 1, srq_limit: 0 }).unwrap();
        let r = Replenisher::new(srq, 64, 16);
        let bufs = RecvBuffers::new(64, mr.lkey(), &pool, 64);
        (r, bufs, pool.cache(64), WorkerStats::new(), (ctx, pd, mr))
    }

    /// Marks `n` posted buffers as received (the bookkeeping of a receive completion).
    fn take_n(r: &mut Replenisher<crate::shm::ShmSrq>, bufs: &mut RecvBuffers, n: usize) {
        let posted: Vec<u64> = (0..bufs.pool.count() as u64)
            .map(|i| bufs.pool.base_addr() + i * bufs.pool.buf_size() as u64)
            .filter(|&a| bufs.pool.index_at(a).is_some_and(|i| bufs.posted[i as usize].tag != 0))
            .take(n)
            .collect();
        assert_eq!(posted.len(), n);
        for a in posted {
            assert!(bufs.take(a).is_some());
            r.received(1);
        }
    }

    #[test]
    fn by_default_refills_only_below_the_low_watermark() {
        let (mut r, mut b, mut cache, w, _keep) = setup("srq-low");
        assert!(!r.maybe_refill(&mut b, &mut cache, &w), "filled an SRQ no QP uses");
        assert_eq!(r.posted(), 0);
        r.activate(&mut b, &mut cache, &w);
        assert_eq!(r.posted(), 64);
        take_n(&mut r, &mut b, 48);
        assert!(!r.maybe_refill(&mut b, &mut cache, &w), "refilled at 16 posted, not below 16");
        take_n(&mut r, &mut b, 1);
        assert!(r.maybe_refill(&mut b, &mut cache, &w));
        assert_eq!(r.posted(), 64);
    }

    #[test]
    fn tops_up_once_a_batch_is_missing() {
        let (mut r, mut b, mut cache, w, _keep) = setup("srq-top-up");
        r.set_top_up(8);
        r.activate(&mut b, &mut cache, &w);
        assert_eq!(r.posted(), 64);
        take_n(&mut r, &mut b, 7);
        assert!(!r.maybe_refill(&mut b, &mut cache, &w), "topped up with 7 missing, the batch is 8");
        take_n(&mut r, &mut b, 1);
        assert!(r.maybe_refill(&mut b, &mut cache, &w));
        assert_eq!(r.posted(), 64);
        // A top-up above the watermark leaves the SRQ limit as it is (here disarmed by hand,
        // as a fired limit is); a refill below the watermark arms it again.
        r.srq.modify(&SrqAttr { max_wr: 64, max_sge: 1, srq_limit: 0 }, SrqAttrMask::LIMIT).unwrap();
        take_n(&mut r, &mut b, 8);
        assert!(r.maybe_refill(&mut b, &mut cache, &w));
        assert_eq!(r.srq.query().unwrap().srq_limit, 0, "a top-up re-armed the limit");
        take_n(&mut r, &mut b, 49);
        assert!(r.maybe_refill(&mut b, &mut cache, &w));
        assert_eq!(r.srq.query().unwrap().srq_limit, 16, "a refill below the watermark did not re-arm");
        // A batch above `depth - low + 1` is clamped to it: the watermark still rules.
        r.set_top_up(1000);
        take_n(&mut r, &mut b, 48);
        assert!(!r.maybe_refill(&mut b, &mut cache, &w));
        take_n(&mut r, &mut b, 1);
        assert!(r.maybe_refill(&mut b, &mut cache, &w));
        assert_eq!(r.posted(), 64);
    }

    /// A receive's `wr_id` maps back to the very handle the refill posted (from the tag kept
    /// at post time, not the pool's state word), once, and only for an address the worker
    /// posted.
    #[test]
    fn take_rebuilds_the_posted_handle_and_refuses_other_addresses() {
        let (mut r, mut b, mut cache, w, _keep) = setup("srq-take");
        r.activate(&mut b, &mut cache, &w);
        let (base, stride, count) = (b.pool.base_addr(), b.pool.buf_size() as u64, b.pool.count() as u64);
        let (posted, free): (Vec<u64>, Vec<u64>) = (0..count)
            .map(|i| base + i * stride)
            .partition(|&a| b.posted[b.pool.index_at(a).unwrap() as usize].tag != 0);
        assert_eq!(posted.len(), 64);
        assert!(b.take(free[0]).is_none(), "a buffer that was not posted");
        assert!(b.take(posted[0] + 8).is_none(), "an address inside a posted buffer");
        assert!(b.take(base + count * stride).is_none(), "an address past the pool");
        assert!(b.take(base - stride).is_none(), "an address before the pool");
        let h = b.take(posted[0]).unwrap();
        assert_eq!(h.addr(), posted[0]);
        assert!(b.take(posted[0]).is_none(), "taken twice");
        // The handle is the one the refill posted (its tag passes the double-free check once).
        cache.put(h).unwrap();
        assert!(cache.put(h).is_err(), "a stale handle was accepted");
        // Shutdown returns the 63 still posted: every buffer is then in the cache or the ring.
        b.release_all(&mut cache);
        assert_eq!(b.pool.available(), count as usize);
    }

    /// A taken buffer names the one its queue fills next (`prefetch_next`'s hint): the
    /// buffer posted after it, across refills, and within the posted part of a refill whose
    /// post failed part-way; none after the last one posted.
    #[test]
    fn take_names_the_next_buffer_in_posting_order() {
        let (_r, mut b, mut cache, w, _keep) = setup("srq-next");
        let mut order: Vec<u64> = Vec::new();
        let mut level = Level::new(8, 0);
        let mut post = |level: &mut Level, b: &mut RecvBuffers, order: &mut Vec<u64>, ok: usize| {
            b.refill(level, &mut cache, &w, |a, _, _, _| {
                order.extend_from_slice(&a[..ok.min(a.len())]);
                match ok < a.len() {
                    true => Err(PostError::new(crate::verbs::Errno::ENOMEM, ok, "full")),
                    false => Ok(()),
                }
            })
        };
        assert_eq!(post(&mut level, &mut b, &mut order, 8), Ok(8));
        let index = |b: &RecvBuffers, a: u64| b.pool.index_at(a).unwrap();
        // The first three received, in order: each names the next one posted.
        for k in 0..3 {
            assert!(b.take(order[k]).is_some());
            level.received();
            assert_eq!(b.next_after(order[k]), index(&b, order[k + 1]), "buffer {k}");
        }
        // A refill of 3 whose post takes only 2: the queue's last buffer leads to them.
        assert!(post(&mut level, &mut b, &mut order, 2).is_err());
        assert_eq!(order.len(), 10);
        for k in 3..10 {
            assert!(b.take(order[k]).is_some(), "buffer {k} was posted");
            let want = if k + 1 < order.len() { index(&b, order[k + 1]) } else { NO_NEXT };
            assert_eq!(b.next_after(order[k]), want, "buffer {k}");
        }
    }

    /// Spares (buffers of completed sends kept by `keep_spares`) never exceed what the queues
    /// miss, the next refill posts them before taking any from the cache, and shutdown
    /// returns those left to the pool.
    #[test]
    fn spares_are_bounded_by_what_is_missing_and_posted_first() {
        let (mut r, mut b, mut cache, w, _keep) = setup("srq-spares");
        r.activate(&mut b, &mut cache, &w);
        take_n(&mut r, &mut b, 20);
        assert_eq!(r.missing(), 20);
        // Ten buffers "sent" and completed: the queue misses 20, but the caller said 4.
        let sent: Vec<Buf> = (0..10).map(|_| cache.get().unwrap()).collect();
        assert_eq!(b.keep_spares(&sent, 4), 4);
        assert_eq!(b.keep_spares(&sent[4..], 4), 0, "spares beyond what is missing");
        assert_eq!(b.keep_spares(&sent[4..6], r.missing()), 2);
        let in_cache = cache.len();
        r.refill(&mut b, &mut cache, &w);
        assert_eq!(r.posted(), 64);
        assert_eq!(cache.len(), in_cache - 14, "the refill took 14 from the cache, 6 from the spares");
        for buf in &sent[..6] {
            assert!(b.take(buf.addr()).is_some(), "spare {} was not posted", buf.index());
        }
        for &buf in &sent[6..] {
            cache.put(buf).unwrap();
        }
        // Left over at shutdown: back to the pool with the posted ones.
        let more: Vec<Buf> = (0..3).map(|_| cache.get().unwrap()).collect();
        assert_eq!(b.keep_spares(&more, 64), 3);
        b.release_all(&mut cache);
        for buf in more {
            assert!(cache.put(buf).is_err(), "spare {} was not returned", buf.index());
        }
    }

    /// A queue with a watermark of 0 (`recv_depth = 1`, whose watermark `depth / 2` is 0, or
    /// `srq_low_watermark = 0`) is refilled once empty, whatever top-up batch it was given.
    /// (It was never due again: "below 0" cannot happen, and the top-up batch was clamped to
    /// `depth + 1`; the echo pipeline with `recv_depth = 1` stopped after one message.)
    #[test]
    fn a_queue_with_watermark_zero_is_refilled_once_empty() {
        for (depth, top_up) in [(1, 32), (1, 1), (64, 1000)] {
            let mut level = Level::new(depth, 0);
            level.set_top_up(top_up);
            level.posted = depth;
            for _ in 0..depth {
                assert!(!level.due() || top_up < depth, "due with buffers posted (depth {depth})");
                level.received();
            }
            assert!(level.due(), "an empty queue of depth {depth}, batch {top_up}, is not due");
        }
        assert!(!Level::new(0, 0).due(), "a level of depth 0 must never be due");
    }

    /// A QP's own receive queue through the same bookkeeping: the refill posts on the QP
    /// (its ring holds what the level says), four messages received through it come back
    /// once each and are topped up by the next refill (a refill before they were received
    /// would find the ring full: ENOMEM), and a refused post (a QP attached to an SRQ has no
    /// queue of its own: EINVAL) counts an error and leaves every buffer in the cache.
    #[test]
    fn fills_a_qps_own_receive_queue() {
        use crate::verbs::{ConnectOpts, PeerAddr, SendChain, SendWr, Sge, WcOpcode, WorkCompletion};
        use crate::Cq;
        let (_r, mut b, mut cache, w, keep) = setup("rq-level");
        let (ctx, pd, mr) = &keep;
        let mut cq = ctx.create_cq(64).unwrap();
        let caps = QpCaps { max_send_wr: 8, max_recv_wr: 32, max_recv_sge: 1, ..Default::default() };
        let attr =
            QpInitAttr { send_cq: &cq, recv_cq: &cq, srq: None, cap: caps, qp_type: QpType::Rc, sq_sig_all: false };
        let (mut qp, mut tx) = (pd.create_qp(&attr).unwrap(), pd.create_qp(&attr).unwrap());
        qp.bring_up_to_init(&ConnectOpts::default()).unwrap();
        let mut level = Level::new(32, 8);
        level.set_top_up(4);
        let got = b.refill(&mut level, &mut cache, &w, |a, len, lkey, c| qp.post_recv_buffers(a, len, lkey, c));
        assert_eq!((got, level.posted(), qp.recv_queued()), (Ok(32), 32, 32));

        let to = |qpn| PeerAddr { qpn, psn: 0, ah: Default::default() };
        qp.connect(&to(tx.qp_num()), &ConnectOpts::default()).unwrap();
        tx.connect(&to(qp.qp_num()), &ConnectOpts::default()).unwrap();
        // Four 8-byte SENDs from the start of the region (the pool's buffer 0, not posted:
        // the cache hands out others first).
        let mut chain = SendChain::with_capacity(4, 4);
        for i in 0..4 {
            chain.push(SendWr::send(i), &[Sge::new(mr.addr() + 64 * 255, 8, mr.lkey())]);
        }
        tx.post_send(&chain).unwrap();
        let mut wc = [WorkCompletion::default(); 8];
        let mut received = Vec::new();
        while received.len() < 4 {
            let n = cq.poll(&mut wc).unwrap();
            received.extend(wc[..n].iter().filter(|c| c.opcode == WcOpcode::Recv).map(|c| c.wr_id));
        }
        assert_eq!(qp.recv_queued(), 28);
        for &a in &received[..3] {
            assert!(b.take(a).is_some());
            assert!(b.take(a).is_none(), "a buffer came back twice");
            level.received();
        }
        assert!(!level.due(), "refill due with 3 missing, the batch is 4");
        assert!(b.take(received[3]).is_some());
        level.received();
        assert!(level.due());
        let got = b.refill(&mut level, &mut cache, &w, |a, len, lkey, c| qp.post_recv_buffers(a, len, lkey, c));
        assert_eq!((got, level.posted(), qp.recv_queued()), (Ok(4), 32, 32));
        // Stopped (its QP went to ERROR): never due again, however many come back.
        let mut stopped = level.clone();
        stopped.stop();
        for _ in 0..32 {
            assert!(!stopped.due());
            stopped.received();
        }
        assert_eq!((stopped.posted(), stopped.due()), (0, false));

        let srq = pd.create_srq(&SrqAttr { max_wr: 8, max_sge: 1, srq_limit: 0 }).unwrap();
        let attr = QpInitAttr {
            send_cq: &cq,
            recv_cq: &cq,
            srq: Some(&srq),
            cap: caps,
            qp_type: QpType::Rc,
            sq_sig_all: false,
        };
        let mut on_srq = pd.create_qp(&attr).unwrap();
        on_srq.bring_up_to_init(&Default::default()).unwrap();
        let mut level = Level::new(4, 0);
        let (errors, free) = (w.errors.get(), cache.len());
        let got = b.refill(&mut level, &mut cache, &w, |a, len, lkey, c| on_srq.post_recv_buffers(a, len, lkey, c));
        assert_eq!(got.map_err(|e| (e.errno, e.bad_wr)), Err((crate::verbs::Errno::EINVAL, 0)));
        assert_eq!((level.posted(), cache.len(), w.errors.get()), (0, free, errors + 1));
    }
}

//! The SRQ replenisher: keeps the worker's shared receive queue between its low watermark
//! and its depth, refilling it with one [`Srq::post_recv_buffers`] call (one doorbell: a
//! chained `post_srq_recv` on providers without a faster way, one ring write on `shm`).
//!
//! A posted buffer's `wr_id` is its address, so a receive completion maps back to its buffer
//! ([`BufferPool::index_of_addr`]). A bitmap of the buffers posted lets shutdown return the
//! ones still sitting in the SRQ (an SRQ is not flushed when its QPs enter ERROR).

use super::stats::WorkerCounters;
use crate::mem::{Buf, BufferPool, PoolCache};
use crate::provider::Srq;
use crate::verbs::{RecvChain, SrqAttr, SrqAttrMask};

/// Keeps one SRQ filled.
pub struct Replenisher<S: Srq> {
    pub(crate) srq: S,
    /// Scratch for providers that post a refill as a chain ([`Srq::post_recv_buffers`]).
    chain: RecvChain,
    /// The addresses of the buffers of a refill, posted in one call.
    addrs: Vec<u64>,
    /// The buffers of `addrs`, in order (so the bookkeeping after the post need not map each
    /// `wr_id` back to its buffer).
    bufs: Vec<Buf>,
    depth: u32,
    low: u32,
    /// Missing buffers that trigger a top-up before the low watermark ([`Self::set_top_up`]).
    top_up: u32,
    posted: u32,
    buf_len: u32,
    lkey: u32,
    pool: BufferPool,
    /// One bit per pool buffer: set while posted on this SRQ.
    bits: Vec<u64>,
    /// Set by the SRQ limit event; cleared by the refill it triggers.
    limit_hit: bool,
}

impl<S: Srq> Replenisher<S> {
    /// A replenisher of `srq` holding `depth` buffers of `buf_len` bytes, refilled below
    /// `low`.
    pub fn new(srq: S, depth: u32, low: u32, buf_len: u32, lkey: u32, pool: &BufferPool) -> Self {
        Replenisher {
            srq,
            chain: RecvChain::with_capacity(depth as usize, depth as usize),
            addrs: Vec::with_capacity(depth as usize),
            bufs: Vec::with_capacity(depth as usize),
            depth,
            low: low.min(depth.saturating_sub(1)),
            top_up: depth - low.min(depth.saturating_sub(1)) + 1,
            posted: 0,
            buf_len,
            lkey,
            bits: vec![0; pool.count().div_ceil(64)],
            pool: pool.clone(),
            limit_hit: false,
        }
    }

    /// Tops the SRQ up as soon as `n` buffers are missing (at least 1; at most
    /// `depth - low + 1`, the default: refill only below the watermark).
    ///
    /// Why: a refill takes its buffers from the worker's [`PoolCache`], and the receives
    /// return them one by one. A swing larger than the cache's batch overflows the cache on
    /// the way back and pulls from the shared ring on the way out, so every buffer crosses
    /// the pool's ring (the echo pipeline: 768-buffer refills through a 256-buffer cache,
    /// ~130 instructions per echoed message in the ring). Topping up in cache-sized batches
    /// keeps the buffers in the cache, and keeps the SRQ fuller.
    pub fn set_top_up(&mut self, n: u32) {
        self.top_up = n.clamp(1, self.depth - self.low + 1);
    }

    /// Receives currently posted.
    pub fn posted(&self) -> u32 {
        self.posted
    }

    /// The SRQ number (to match limit events).
    pub fn srq_num(&self) -> u32 {
        self.srq.srq_num()
    }

    /// Arms the SRQ limit event at the low watermark (`ibv_modify_srq`); the event is a
    /// second trigger next to the worker's own count.
    pub fn arm(&mut self) {
        if self.low > 0 {
            let attr = SrqAttr { max_wr: self.depth, max_sge: 1, srq_limit: self.low };
            // Providers without limit events still work: the count below is the primary trigger.
            let _ = self.srq.modify(&attr, SrqAttrMask::LIMIT);
        }
    }

    /// The SRQ limit event fired.
    pub fn on_limit_event(&mut self) {
        self.limit_hit = true;
    }

    /// A receive completed: the buffer at `addr` left the SRQ. Returns its handle, or `None`
    /// for an address this replenisher did not post.
    #[inline]
    pub fn take(&mut self, addr: u64) -> Option<Buf> {
        let buf = self.pool.index_of_addr(addr)?;
        let (w, b) = (buf.index() as usize / 64, buf.index() % 64);
        if self.bits[w] & (1 << b) == 0 {
            return None;
        }
        self.bits[w] &= !(1 << b);
        self.posted -= 1;
        Some(buf)
    }

    /// Refills to `depth` with one post if under the low watermark, the limit event fired, or
    /// at least the top-up batch is missing ([`Self::set_top_up`]). Returns whether it posted.
    #[inline]
    pub fn maybe_refill(&mut self, cache: &mut PoolCache, w: &WorkerCounters) -> bool {
        if self.posted >= self.low && !self.limit_hit && self.depth - self.posted < self.top_up {
            return false;
        }
        self.refill(cache, w)
    }

    /// Posts `depth - posted` buffers (as many as the pool gives) in one
    /// [`Srq::post_recv_buffers`] call.
    pub fn refill(&mut self, cache: &mut PoolCache, w: &WorkerCounters) -> bool {
        // The limit needs arming again only if it may have fired (the count went below it, or
        // its event came): a fired limit is disarmed, an unfired one stays armed. A top-up
        // above the watermark leaves it alone, which on `rdma` saves an `ibv_modify_srq`
        // (a system call) per top-up.
        let rearm = self.limit_hit || self.posted < self.low;
        let want = self.depth - self.posted;
        self.addrs.clear();
        self.bufs.clear();
        // Within the capacities reserved in `new` (`want <= depth`): no allocation.
        let n = cache.get_into(&mut self.bufs, want as usize);
        if n == 0 {
            return false;
        }
        self.addrs.extend(self.bufs.iter().map(|b| b.addr()));
        let ok = match self.srq.post_recv_buffers(&self.addrs, self.buf_len, self.lkey, &mut self.chain) {
            Ok(()) => n,
            Err(e) => {
                w.errors.add(1);
                e.bad_wr.min(n)
            }
        };
        for &buf in &self.bufs[..ok] {
            let idx = buf.index() as usize;
            self.bits[idx / 64] |= 1 << (idx % 64);
        }
        for &buf in &self.bufs[ok..] {
            let _ = cache.put(buf);
        }
        self.posted += ok as u32;
        self.limit_hit = false;
        if ok > 0 {
            w.srq_refills.add(1);
            w.srq_posted.add(ok as u64);
            if rearm {
                self.arm();
            }
        }
        true
    }

    /// Returns every buffer still posted (at shutdown, when no more receives can land).
    pub fn release_all(&mut self, cache: &mut PoolCache) {
        let (base, stride) = (self.pool.base_addr(), self.pool.buf_size() as u64);
        for (wi, word) in self.bits.iter_mut().enumerate() {
            while *word != 0 {
                let b = word.trailing_zeros() as usize;
                *word &= !(1 << b);
                if let Some(buf) = self.pool.index_of_addr(base + (wi * 64 + b) as u64 * stride) {
                    let _ = cache.put(buf);
                }
            }
        }
        self.posted = 0;
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::verbs::AccessFlags;
    use crate::worker::stats::WorkerStats;
    use crate::{Context, Mr, Pd};
    use std::sync::Arc;

    /// A replenisher of depth 64, low watermark 16, over a 256-buffer pool on a fresh fabric
    /// (its SRQ holds 512: the `take`s here are bookkeeping only, every posted buffer stays in
    /// it).
    fn setup(name: &str) -> (Replenisher<crate::shm::ShmSrq>, PoolCache, WorkerStats, impl Sized) {
        let ctx = crate::shm::unit_context(name);
        let pd = ctx.alloc_pd().unwrap();
        let region = Arc::new(ctx.alloc_region(256 * 64).unwrap());
        let mr = pd.reg_mr(&*region, 0, 256 * 64, AccessFlags::LOCAL_WRITE).unwrap();
        let pool = BufferPool::from_region(region, 0, 64, 256).unwrap();
        let srq = pd.create_srq(&SrqAttr { max_wr: 512, max_sge: 1, srq_limit: 0 }).unwrap();
        let r = Replenisher::new(srq, 64, 16, 64, mr.lkey(), &pool);
        (r, pool.cache(64), WorkerStats::new(), (ctx, pd, mr))
    }

    /// Marks `n` posted buffers as received (the bookkeeping of a receive completion).
    fn take_n(r: &mut Replenisher<crate::shm::ShmSrq>, n: usize) {
        let posted: Vec<u64> = (0..r.pool.count() as u64)
            .map(|i| r.pool.base_addr() + i * r.pool.buf_size() as u64)
            .filter(|&a| {
                r.pool.index_of_addr(a).is_some_and(|b| r.bits[b.index() as usize / 64] & (1 << (b.index() % 64)) != 0)
            })
            .take(n)
            .collect();
        assert_eq!(posted.len(), n);
        for a in posted {
            assert!(r.take(a).is_some());
        }
    }

    #[test]
    fn by_default_refills_only_below_the_low_watermark() {
        let (mut r, mut cache, w, _keep) = setup("srq-low");
        assert!(r.refill(&mut cache, &w));
        assert_eq!(r.posted(), 64);
        take_n(&mut r, 48);
        assert!(!r.maybe_refill(&mut cache, &w), "refilled at 16 posted, not below 16");
        take_n(&mut r, 1);
        assert!(r.maybe_refill(&mut cache, &w));
        assert_eq!(r.posted(), 64);
    }

    #[test]
    fn tops_up_once_a_batch_is_missing() {
        let (mut r, mut cache, w, _keep) = setup("srq-top-up");
        r.set_top_up(8);
        assert!(r.refill(&mut cache, &w));
        take_n(&mut r, 7);
        assert!(!r.maybe_refill(&mut cache, &w), "topped up with 7 missing, the batch is 8");
        take_n(&mut r, 1);
        assert!(r.maybe_refill(&mut cache, &w));
        assert_eq!(r.posted(), 64);
        // A top-up above the watermark leaves the SRQ limit as it is (here disarmed by hand,
        // as a fired limit is); a refill below the watermark arms it again.
        r.srq.modify(&SrqAttr { max_wr: 64, max_sge: 1, srq_limit: 0 }, SrqAttrMask::LIMIT).unwrap();
        take_n(&mut r, 8);
        assert!(r.maybe_refill(&mut cache, &w));
        assert_eq!(r.srq.query().unwrap().srq_limit, 0, "a top-up re-armed the limit");
        take_n(&mut r, 49);
        assert!(r.maybe_refill(&mut cache, &w));
        assert_eq!(r.srq.query().unwrap().srq_limit, 16, "a refill below the watermark did not re-arm");
        // A batch above `depth - low + 1` is clamped to it: the watermark still rules.
        r.set_top_up(1000);
        take_n(&mut r, 48);
        assert!(!r.maybe_refill(&mut cache, &w));
        take_n(&mut r, 1);
        assert!(r.maybe_refill(&mut cache, &w));
        assert_eq!(r.posted(), 64);
    }
}

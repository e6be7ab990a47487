//! The hot-path pieces one at a time, on the `shm` provider: SRQ replenish (one chained
//! post), buffer pool get/put (shared ring and per-worker cache), and CQ poll in bursts.
//! Each reports time per element (per receive request, buffer or completion) and elements/s.
//! Only the measured operation is timed (`iter_custom`); the setup that makes it possible
//! (consuming the SRQ, filling the CQ) runs between timings.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use dataplane::mem::{Buf, BufferPool};
use dataplane::verbs::{RecvChain, RecvWr, WorkCompletion};
use dataplane::{Context, Cq, Qp, Srq};
use dataplane_benches::{send_chain, Loopback};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Receives consumed by `n` 8-byte SENDs to the SRQ side, completions polled.
fn consume(lb: &mut Loopback, chain: &dataplane::verbs::SendChain, wc: &mut [WorkCompletion]) {
    lb.a.post_send(chain).expect("post_send");
    let mut got = 0;
    while got < chain.len() {
        got += lb.bcq.poll(&mut wc[..chain.len() - got]).expect("poll");
    }
    while lb.acq.poll(&mut wc[..1]).expect("poll") == 0 {}
}

fn srq_replenish(c: &mut Criterion) {
    let mut g = c.benchmark_group("shm_srq_replenish");
    let mut lb = Loopback::with_srq("bench-srq");
    let mut wc = [WorkCompletion::default(); 64];
    for batch in [1usize, 8, 32, 64] {
        let chain = send_chain(&lb, batch);
        let mut rchain = RecvChain::with_capacity(batch, batch);
        g.throughput(Throughput::Elements(batch as u64));
        g.bench_with_input(BenchmarkId::new("chain", batch), &batch, |b, _| {
            b.iter_custom(|iters| {
                let mut t = Duration::ZERO;
                for _ in 0..iters {
                    consume(&mut lb, &chain, &mut wc);
                    rchain.clear();
                    for i in 0..batch as u64 {
                        rchain.push(RecvWr::new(i), &[lb.recv_sge(i)]);
                    }
                    let t0 = Instant::now();
                    lb.srq.as_mut().expect("srq").post_recv(&rchain).expect("post_srq_recv");
                    t += t0.elapsed();
                }
                t
            });
        });
    }
    g.finish();
}

fn pool(c: &mut Criterion) {
    let mut g = c.benchmark_group("buffer_pool_get_put");
    let lb = Loopback::new("bench-pool");
    let region = Arc::new(lb.ctx.alloc_region(4 << 20).expect("region"));
    let pool = BufferPool::from_region(region, 0, 2048, 1024).expect("pool");
    // get_many overwrites the slice; seed it with real handles, returned at once.
    let mut bufs: Vec<Buf> = (0..64).map(|_| pool.get().expect("buffer")).collect();
    pool.put_many(&bufs).expect("put");
    for n in [1usize, 32] {
        g.throughput(Throughput::Elements(n as u64));
        g.bench_with_input(BenchmarkId::new("shared_ring", n), &n, |b, &n| {
            b.iter(|| {
                let got = pool.get_many(&mut bufs[..n]);
                pool.put_many(&bufs[..got]).expect("put");
            });
        });
        let mut cache = pool.cache(256);
        g.bench_with_input(BenchmarkId::new("worker_cache", n), &n, |b, &n| {
            b.iter(|| {
                let got = cache.get_many(&mut bufs[..n]);
                cache.put_many(&bufs[..got]).expect("put");
            });
        });
        cache.drain();
    }
    g.finish();
}

fn cq_poll(c: &mut Criterion) {
    let mut g = c.benchmark_group("shm_cq_poll_burst");
    let mut lb = Loopback::new("bench-cq");
    let mut wc = [WorkCompletion::default(); 64];
    let mut rchain = RecvChain::with_capacity(64, 64);
    for burst in [1usize, 16, 32, 64] {
        // 64 messages make 64 receive completions on b's CQ; polled `burst` at a time.
        let chain = send_chain(&lb, 64);
        g.throughput(Throughput::Elements(64));
        g.bench_with_input(BenchmarkId::new("burst", burst), &burst, |b, &burst| {
            b.iter_custom(|iters| {
                let mut t = Duration::ZERO;
                for _ in 0..iters {
                    lb.a.post_send(&chain).expect("post_send");
                    while lb.acq.poll(&mut wc[..1]).expect("poll") == 0 {}
                    rchain.clear();
                    let t0 = Instant::now();
                    let mut got = 0;
                    while got < 64 {
                        got += lb.bcq.poll(&mut wc[..burst]).expect("poll");
                    }
                    t += t0.elapsed();
                    for i in 0..64u64 {
                        rchain.push(RecvWr::new(i), &[lb.recv_sge(i)]);
                    }
                    lb.b.post_recv(&rchain).expect("post_recv");
                }
                t
            });
        });
    }
    g.finish();
}

criterion_group!(benches, srq_replenish, pool, cq_poll);
criterion_main!(benches);

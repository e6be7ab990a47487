//! post+poll of 8-byte SENDs on the `shm` provider, one thread, for chains of 1, 8, 32 and 64
//! WRs per doorbell. Throughput is in messages; criterion reports time per chain and
//! elements/s (messages/s).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use dataplane::verbs::{RecvChain, WorkCompletion};
use dataplane_benches::{round, send_chain, Loopback};

fn post_poll(c: &mut Criterion) {
    let mut g = c.benchmark_group("shm_send_8B_post_poll");
    let mut lb = Loopback::new("bench-post-poll");
    let mut rchain = RecvChain::with_capacity(64, 64);
    let mut wc = [WorkCompletion::default(); 64];
    for batch in [1usize, 8, 32, 64] {
        let chain = send_chain(&lb, batch);
        g.throughput(Throughput::Elements(batch as u64));
        g.bench_with_input(BenchmarkId::new("batch", batch), &batch, |b, _| {
            b.iter(|| round(&mut lb, &chain, &mut rchain, &mut wc));
        });
    }
    g.finish();
}

criterion_group!(benches, post_poll);
criterion_main!(benches);

//! A fixed amount of echo-pipeline work, for instruction profiles of the runtime:
//! `valgrind --tool=callgrind target/release/examples/profile_pipeline MESSAGES [BURST]`.
//!
//! The pipeline of `config/examples/echo.toml` with an unpaced source of 16-byte messages:
//! worker `client` runs source -> QP `c` and `c` -> sink (sequence check and latency
//! histogram), worker `server` runs QP `s` -> echo -> `s`. Both workers are stepped
//! alternately on this one thread (no pinning, no second thread), so the instruction count is
//! deterministic: (Ir(B) - Ir(A)) / (B - A) for two message counts A < B is the runtime's
//! instructions per message, verbs included, setup excluded.
//!
//! BURST (default 32) is how many messages the source makes per loop. With 1, every loop
//! carries one message each way, as at a paced rate: the count per message is then the
//! latency path's (every per-loop cost paid by one message), where 32 gives the rate's.
//!
//! IDLE (third argument, default 0): after the messages, each worker runs IDLE more loops
//! that find nothing to do, the loop a paced pipeline spins in between messages (its length
//! is how late a worker notices a message, on average half of it):
//! (Ir(IDLE = B) - Ir(IDLE = A)) / (2 (B - A)) is one idle loop's instructions.
//!
//! RATE (fourth argument, default 0: unpaced): the source's messages per second. Paced, the
//! run takes MESSAGES / RATE seconds and prints the sink's round-trip percentiles: the
//! latency of the whole path on one core, without a core-to-core transfer, which shows what
//! the time between messages costs (docs/benchmarks.md, session 37: on the development VM the
//! round trip's median p50 over 9 runs grows from 763 ns at 1M msg/s to 921 ns at 100k and
//! 1,043 ns at 10k, the same code path).
//!
//! PAUSE (fifth argument, ns, default 0): with a paced RATE, after a loop pair in which the
//! sink received a message and none is in flight, spin on the clock for PAUSE ns without
//! stepping. The gap between messages is then mostly spent outside the pipeline's code, so
//! comparing PAUSE 0 with PAUSE close to the gap tells whether the idle loops themselves (what
//! they train the branch predictors to, the lines they touch) slow the next message
//! (session 38: they do not).
//!
//! RECV_DEPTH (sixth argument, default 0): each QP receives through a receive queue of its
//! own of that many buffers (the config's `use_srq = false`) instead of the worker's SRQ.
//!
//! KEEP_WARM (seventh argument, default 0: off, unlike the config's 128, so that the counts
//! stay comparable with earlier sessions'): the workers' `keep_warm`. With 1 every idle loop
//! runs a warm pass, so IDLE's count minus the count with 0 is one pass's instructions.

use dataplane::mem::{BufferPool, HugePolicy};
use dataplane::pipeline::{Clock, Echo, Sink, Source, SourceLimits, Target};
use dataplane::shm::{Shm, ShmConfig};
use dataplane::verbs::AccessFlags;
use dataplane::worker::idle::IdleKind;
use dataplane::worker::{Control, QpParams, Worker, WorkerParams};
use dataplane::{Context, Mr, Pd, Provider};
use std::sync::Arc;

/// Message size of the unpaced source (the 16 B pipeline row).
const MSG_SIZE: usize = 16;

type Ctx = Arc<<Shm as Provider>::Context>;

/// A worker with the config schema's defaults (`config/src/schema.rs`), unpinned, and the
/// registration of its pool (which must outlive it).
fn worker(
    name: &str,
    ctx: &Ctx,
    pd: &<Shm as Provider>::Pd,
    ctl: &Arc<Control>,
    clock: Clock,
    keep_warm: u32,
) -> Worked {
    let (size, count) = (2048usize, 16384usize);
    let region = ctx.alloc_region(size * count + 64).expect("region");
    let mr = pd.reg_mr(&region, 0, size * count + 64, AccessFlags::LOCAL_WRITE).expect("reg_mr");
    let off = (64 - (mr.addr() % 64) as usize) % 64;
    let pool = BufferPool::from_region(Arc::new(region), off, size, count).expect("pool");
    let params = WorkerParams {
        name: name.into(),
        core: None,
        poll_burst: 32,
        doorbell_batch: 16,
        cq_depth: 4096,
        srq_depth: 1024,
        srq_low_watermark: 256,
        recv_buffer_size: 2048,
        idle: IdleKind::Spin,
        spin_count: 1000,
        keep_warm,
        cache_size: 256,
    };
    let w = Worker::<Shm>::new(params, ctx.clone(), pd, pool, mr.lkey(), ctl.clone(), clock).expect("worker");
    (w, mr)
}

/// A worker and the MR of its pool.
type Worked = (Worker<Shm>, <Shm as Provider>::Mr);

fn main() {
    let messages: u64 = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(100_000);
    let burst: usize = std::env::args().nth(2).and_then(|a| a.parse().ok()).filter(|&b| b > 0).unwrap_or(32);
    let idle: u64 = std::env::args().nth(3).and_then(|a| a.parse().ok()).unwrap_or(0);
    let fabric = format!("profile-pipeline-{}", std::process::id());
    let ctx = Arc::new(Shm::open(&ShmConfig { fabric, size: 128 << 20, huge: HugePolicy::Never }).expect("open"));
    let pd = ctx.alloc_pd().expect("pd");
    let ctl = Arc::new(Control::new());
    let clock = Clock::new();
    let keep_warm: u32 = std::env::args().nth(7).and_then(|a| a.parse().ok()).unwrap_or(0);
    let (mut client, _client_mr) = worker("client", &ctx, &pd, &ctl, clock.clone(), keep_warm);
    let (mut server, _server_mr) = worker("server", &ctx, &pd, &ctl, clock.clone(), keep_warm);
    let recv_depth: Option<u32> = std::env::args().nth(6).and_then(|a| a.parse().ok()).filter(|&n| n > 0);
    let qp = |n: &str| QpParams { name: n.into(), min_rnr_timer: 1, max_inline: 64, recv_depth, ..QpParams::default() };
    let c = client.add_qp(&pd, qp("client-qp")).expect("qp");
    let s = server.add_qp(&pd, qp("server-qp")).expect("qp");
    let (cn, sn) = (client.qp_num(c), server.qp_num(s));
    client.connect(c, sn).expect("connect");
    server.connect(s, cn).expect("connect");
    let rate: u64 = std::env::args().nth(4).and_then(|a| a.parse().ok()).unwrap_or(0);
    let limits = SourceLimits { rate, count: messages, duration_ns: 0 };
    client.add_stage("src", "source", Box::new(Source::new(MSG_SIZE, limits, burst)), vec![Target::Qp(c as u16)], None);
    client.add_stage("rtt", "sink", Box::new(Sink::new(true, true)), vec![], Some(c));
    server.add_stage("echo", "echo", Box::new(Echo), vec![], Some(s));

    let (cstats, mut steps) = (client.stats(), 0u64);
    // Bounded: a pipeline that stops moving ends the run with an error instead of hanging (a
    // paced one gets the loops of its run's length, at 10 ns a loop pair at the most).
    let paced_loops = messages.saturating_mul(100_000_000).checked_div(rate).unwrap_or(0);
    let pause_ns: u64 = std::env::args().nth(5).and_then(|a| a.parse().ok()).unwrap_or(0);
    // The sink's count at the last pause: one pause per message.
    let mut seen = 0;
    while cstats.rx_msgs.get() < messages && steps < 100 * messages + 1_000_000 + paced_loops {
        client.step();
        server.step();
        steps += 1;
        if pause_ns != 0 && cstats.rx_msgs.get() != seen && cstats.rx_msgs.get() == cstats.tx_msgs.get() {
            seen = cstats.rx_msgs.get();
            clock.spin_for(pause_ns);
        }
    }
    // Let the last completions and the SRQ refills settle, so the loops counted below find
    // nothing at all to do: until a loop pair in which neither worker did any work (`step`
    // says whether it did), bounded.
    let mut settle = 0u32;
    while client.step() | server.step() {
        settle += 1;
        if settle == 1_000_000 {
            eprintln!("error: the workers still found work after {settle} loop pairs past the last message");
            std::process::exit(1);
        }
    }
    let sstats = server.stats();
    let busy = (cstats.busy_loops.get(), sstats.busy_loops.get());
    for _ in 0..idle {
        client.step();
        server.step();
    }
    // Checked, or the idle count would be a mix of idle and busy loops.
    if (cstats.busy_loops.get(), sstats.busy_loops.get()) != busy {
        eprintln!("error: a worker found work during the {idle} idle loops");
        std::process::exit(1);
    }
    client.teardown();
    server.teardown();
    let r = client.report();
    let sink = r.stages.iter().find(|s| s.kind == "sink").expect("sink");
    println!("{} messages echoed in {steps} loop pairs, {} gaps", sink.msgs_in, sink.report.gaps);
    if let (true, Some(h)) = (rate != 0, &sink.report.latency) {
        let q = |p: f64| h.value_at_quantile(p);
        println!("round trip ns at {rate} msg/s: p10 {} p50 {} p90 {} p99 {}", q(0.1), q(0.5), q(0.9), q(0.99));
    }
    if sink.msgs_in != messages || sink.report.gaps != 0 {
        eprintln!("error: expected {messages} messages without gaps");
        std::process::exit(1);
    }
}

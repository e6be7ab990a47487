//! The worker's steady-state loop allocates nothing: a counting global allocator watches
//! `Worker::step` on this thread for many iterations after a warm-up, with traffic flowing
//! (source -> QP a ==rc==> QP b -> echo -> QP b ==rc==> QP a -> sink, all on one worker), with
//! its counters moved out of the heap into external memory as for live stats (`move_stats`),
//! the sink recording into its live latency histogram.

use dataplane::mem::{BufferPool, HugePolicy};
use dataplane::pipeline::{Clock, Echo, Sink, Source, SourceLimits, Target};
use dataplane::shm::{Shm, ShmConfig};
use dataplane::verbs::AccessFlags;
use dataplane::worker::idle::IdleKind;
use dataplane::worker::stats::{CounterBlock, LatencyBuckets, QpCounters, Slot, StableWords, StageCounters};
use dataplane::worker::stats::{WorkerCounters, WorkerSlots};
use dataplane::worker::{Control, QpParams, Worker, WorkerParams};
use dataplane::{Context, Mr, Pd, Provider};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    static WATCH: Cell<bool> = const { Cell::new(false) };
}

fn note() {
    if WATCH.with(|w| w.get()) {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
    }
}

// SAFETY: forwards every call to the system allocator unchanged; it only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note();
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        note();
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note();
        // SAFETY: same contract as ours.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Memory outside the worker for its counters, like the live-stats segment.
struct Words(Box<[AtomicU64]>);

// SAFETY: a boxed slice never moves and lives as long as `self`; only accessed atomically.
unsafe impl StableWords for Words {
    fn words(&self) -> &[AtomicU64] {
        &self.0
    }
}

/// Moves `w`'s counters into one `Words` block; returns the sink's latency histogram.
fn move_counters(w: &mut Worker<Shm>) -> Slot<LatencyBuckets> {
    let shape = w.stats_shape();
    let (nq, ns) = (shape.qps.len(), shape.stages.len());
    let words = WorkerCounters::WORDS + nq * QpCounters::WORDS + ns * (StageCounters::WORDS + LatencyBuckets::WORDS);
    let mem = Arc::new(Words((0..words).map(|_| AtomicU64::new(0)).collect()));
    let mut at = 0;
    let mut take = |n: usize| {
        at += n;
        at - n
    };
    let worker = Slot::in_words(&mem, take(WorkerCounters::WORDS)).unwrap();
    let qps = (0..nq).map(|_| Slot::in_words(&mem, take(QpCounters::WORDS)).unwrap()).collect();
    let stages = (0..ns).map(|_| Slot::in_words(&mem, take(StageCounters::WORDS)).unwrap()).collect();
    let latency: Vec<_> = shape
        .stages
        .iter()
        .map(|s| s.latency.then(|| Slot::<LatencyBuckets>::in_words(&mem, take(LatencyBuckets::WORDS)).unwrap()))
        .collect();
    let sink = latency.iter().flatten().next().expect("the sink records latency").clone();
    w.move_stats(WorkerSlots { worker, qps, stages, latency }).unwrap();
    sink
}

#[test]
fn steady_state_loop_does_not_allocate() {
    let name = format!("noalloc-{}", std::process::id());
    let ctx = Arc::new(Shm::open(&ShmConfig { fabric: name, size: 32 << 20, huge: HugePolicy::Never }).unwrap());
    let pd = ctx.alloc_pd().unwrap();
    let (size, count) = (256usize, 4096usize);
    let region = ctx.alloc_region(size * count + 64).unwrap();
    let mr = pd.reg_mr(&region, 0, size * count + 64, AccessFlags::LOCAL_WRITE).unwrap();
    let off = (64 - (mr.addr() % 64) as usize) % 64;
    let pool = BufferPool::from_region(Arc::new(region), off, size, count).unwrap();
    let params = WorkerParams {
        name: "w".into(),
        core: None,
        poll_burst: 32,
        doorbell_batch: 16,
        cq_depth: 2048,
        srq_depth: 512,
        srq_low_watermark: 128,
        recv_buffer_size: 256,
        idle: IdleKind::Spin,
        spin_count: 100,
        keep_warm: 0,
        cache_size: 256,
    };
    let ctl = Arc::new(Control::new());
    let mut w = Worker::<Shm>::new(params, ctx.clone(), &pd, pool.clone(), mr.lkey(), ctl, Clock::new()).unwrap();
    let qp = |n: &str| QpParams {
        name: n.into(),
        send_depth: 128,
        signal_interval: 16,
        min_rnr_timer: 1,
        rnr_retry: 7,
        retry_cnt: 7,
        timeout: 14,
        ..QpParams::default()
    };
    let a = w.add_qp(&pd, qp("a")).unwrap();
    let b = w.add_qp(&pd, qp("b")).unwrap();
    let (qa, qb) = (w.qp_num(a), w.qp_num(b));
    w.connect(a, qb).unwrap();
    w.connect(b, qa).unwrap();
    let src = Source::new(64, SourceLimits::default(), 32);
    w.add_stage("src", "source", Box::new(src), vec![Target::Qp(a as u16)], None);
    w.add_stage("echo", "echo", Box::new(Echo), vec![], Some(b));
    w.add_stage("sink", "sink", Box::new(Sink::new(true, true)), vec![], Some(a));
    let hist = move_counters(&mut w);

    for _ in 0..20_000 {
        w.step();
    }
    // The counter works: one watched allocation is seen.
    WATCH.with(|x| x.set(true));
    drop(std::hint::black_box(Box::new(1u64)));
    WATCH.with(|x| x.set(false));
    assert!(ALLOCS.swap(0, Ordering::Relaxed) >= 1, "the counting allocator must see a watched allocation");

    let before = w.stats().rx_msgs.get();
    WATCH.with(|x| x.set(true));
    for _ in 0..50_000 {
        w.step();
    }
    WATCH.with(|x| x.set(false));
    let allocs = ALLOCS.load(Ordering::Relaxed);
    let moved = w.stats().rx_msgs.get() - before;
    assert!(moved > 10_000, "traffic must flow during the measurement (moved {moved})");
    assert_eq!(allocs, 0, "{allocs} allocations in 50000 steady-state loop iterations");
    let recorded: u64 = hist.buckets.iter().map(|c| c.get()).sum();
    assert!(recorded >= moved / 4, "the sink records into its live histogram ({recorded} of {moved})");

    w.teardown();
    let r = w.report();
    let sink = r.stages.iter().find(|s| s.name == "sink").unwrap();
    assert_eq!(sink.report.gaps, 0);
    assert!(sink.msgs_in > 0);
    drop(w);
    assert_eq!(pool.outstanding(), 0, "every buffer is back in the pool");
}

//! Worker behaviour outside the hot path: a failed pin is an error (and stops the pipeline);
//! a worker run on its own thread until stopped returns every buffer; a send chain the QP
//! refuses returns its buffers and send-queue room; the pipeline clock counts from its base;
//! a batch awaits a completion only for a posted signaled send; a paced source keeps its
//! schedule; a burst of receives is stamped once; QPs with receive queues of their own are
//! kept filled.

use dataplane::mem::{BufferPool, HugePolicy};
use dataplane::pipeline::{
    due_at_rate, read_u64, Clock, Echo, Handler, Msg, Sink, Source, SourceLimits, StageCx, Target, SEQ_OFFSET,
    TS_OFFSET,
};
use dataplane::shm::{Shm, ShmConfig, ShmContext, ShmMr, ShmPd};
use dataplane::verbs::AccessFlags;
use dataplane::worker::idle::IdleKind;
use dataplane::worker::{Control, QpParams, Worker, WorkerParams};
use dataplane::{Context, Mr, Pd, Provider};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

type Setup = (Arc<ShmContext>, ShmPd, ShmMr, BufferPool, Worker<Shm>, Arc<Control>);

/// The source's limits of most tests: 10,000 messages, unpaced.
const TEN_THOUSAND: SourceLimits = SourceLimits { rate: 0, count: 10_000, duration_ns: 0 };

/// A fabric of its own for `test` (32 MiB, no hugepages) with `count` 256-byte buffers in one
/// registered region, the first at `off` bytes, a cache line boundary.
fn small_pool(test: &str, count: usize) -> (ShmContext, ShmPd, ShmMr, BufferPool, usize) {
    let name = format!("worker-{test}-{}", std::process::id());
    let ctx = Shm::open(&ShmConfig { fabric: name, size: 32 << 20, huge: HugePolicy::Never }).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let size = 256usize;
    let region = ctx.alloc_region(size * count + 64).unwrap();
    let mr = pd.reg_mr(&region, 0, size * count + 64, AccessFlags::LOCAL_WRITE).unwrap();
    let off = (64 - (mr.addr() % 64) as usize) % 64;
    let pool = BufferPool::from_region(Arc::new(region), off, size, count).unwrap();
    (ctx, pd, mr, pool, off)
}

fn setup(test: &str, core: Option<usize>) -> Setup {
    setup_with(test, core, false, TEN_THOUSAND)
}

fn setup_with(test: &str, core: Option<usize>, dropper: bool, limits: SourceLimits) -> Setup {
    setup_on(test, core, dropper, limits, Arc::new(Control::new()))
}

/// [`setup_with`] on a given control block (several workers of one run share theirs).
fn setup_on(test: &str, core: Option<usize>, dropper: bool, limits: SourceLimits, ctl: Arc<Control>) -> Setup {
    setup_queues(test, core, dropper, limits, ctl, None, 0)
}

/// [`setup_on`] with the QPs receiving through queues of their own of `recv_depth` buffers
/// (`QpParams::recv_depth`; `None`: the worker's SRQ) and a warm pass every `keep_warm` idle
/// loops (0: none).
fn setup_queues(
    test: &str,
    core: Option<usize>,
    dropper: bool,
    limits: SourceLimits,
    ctl: Arc<Control>,
    recv_depth: Option<u32>,
    keep_warm: u32,
) -> Setup {
    let (ctx, pd, mr, pool, _) = small_pool(test, 2048);
    let ctx = Arc::new(ctx);
    let params = WorkerParams {
        name: "w".into(),
        core,
        poll_burst: 32,
        doorbell_batch: 8,
        cq_depth: 1024,
        srq_depth: 256,
        srq_low_watermark: 64,
        recv_buffer_size: 256,
        idle: IdleKind::Backoff,
        spin_count: 10,
        keep_warm,
        cache_size: 64,
    };
    let mut w =
        Worker::<Shm>::new(params, ctx.clone(), &pd, pool.clone(), mr.lkey(), ctl.clone(), Clock::new()).unwrap();
    let qp = |n: &str| QpParams {
        name: n.into(),
        send_depth: 64,
        signal_interval: 8,
        min_rnr_timer: 1,
        rnr_retry: 7,
        retry_cnt: 7,
        timeout: 14,
        recv_depth,
        ..QpParams::default()
    };
    let a = w.add_qp(&pd, qp("a")).unwrap();
    let b = w.add_qp(&pd, qp("b")).unwrap();
    let (qa, qb) = (w.qp_num(a), w.qp_num(b));
    w.connect(a, qb).unwrap();
    w.connect(b, qa).unwrap();
    let first = if dropper { Target::Stage(3) } else { Target::Qp(a as u16) };
    w.add_stage("src", "source", Box::new(Source::new(32, limits, 16)), vec![first], None);
    w.add_stage("echo", "echo", Box::new(Echo), vec![], Some(b));
    w.add_stage("sink", "sink", Box::new(Sink::new(true, true)), vec![], Some(a));
    if dropper {
        w.add_stage("drop", "user", Box::new(DropEveryTenth), vec![Target::Qp(a as u16)], None);
    }
    (ctx, pd, mr, pool, w, ctl)
}

/// User code: drops the messages whose sequence number ends in 5, forwards the others.
struct DropEveryTenth;

impl Handler for DropEveryTenth {
    fn on_message(&mut self, msg: Msg, cx: &mut StageCx<'_>) {
        if read_u64(cx.bytes(&msg), SEQ_OFFSET) % 10 == 5 {
            cx.drop_msg(msg);
        } else {
            cx.send(0, msg);
        }
    }
}

fn run_until(w: Worker<Shm>, ctl: &Control, rx: u64) -> dataplane::worker::WorkerReport {
    let stats = w.stats();
    let h = std::thread::spawn(move || w.run());
    let t0 = std::time::Instant::now();
    while t0.elapsed() < Duration::from_secs(20) && stats.rx_msgs.get() < rx {
        std::thread::sleep(Duration::from_millis(20));
    }
    ctl.stop_sources.store(true, Ordering::Release);
    std::thread::sleep(Duration::from_millis(100));
    ctl.stop.store(true, Ordering::Release);
    h.join().unwrap().unwrap()
}

#[test]
fn a_user_handler_between_stages_and_the_sink_counts_the_gaps() {
    let (_ctx, _pd, _mr, pool, w, ctl) = setup_with("gaps", None, true, TEN_THOUSAND);
    let r = run_until(w, &ctl, 18_000);
    let sink = r.stages.iter().find(|s| s.name == "sink").unwrap();
    assert_eq!(sink.msgs_in, 9_000, "{r:?}");
    assert_eq!(sink.report.gaps, 1_000);
    assert_eq!(sink.report.duplicates, 0);
    let user = r.stages.iter().find(|s| s.name == "drop").unwrap();
    assert_eq!((user.msgs_in, user.msgs_out, user.dropped), (10_000, 9_000, 1_000));
    assert!(sink.report.latency.as_ref().is_some_and(|h| h.len() == 9_000));
    assert_eq!(pool.outstanding(), 0);
}

#[test]
fn a_failed_pin_is_an_error_and_stops_the_pipeline() {
    let (_ctx, _pd, _mr, pool, w, ctl) = setup("pin", Some(1 << 20));
    let e = w.run().unwrap_err();
    assert!(e.to_string().contains("cannot pin"), "{e}");
    assert!(ctl.stop.load(Ordering::Acquire));
    assert_eq!(pool.outstanding(), 0);
}

#[test]
fn workers_told_to_start_together_wait_for_each_other() {
    // Two workers of one run, each a whole loopback pipeline: the first started must not
    // send until the second has pinned itself and started its stages.
    let ctl = Arc::new(Control::new());
    ctl.start_together(2);
    let (_c1, _p1, _m1, pool1, w1, _) = setup_on("together-1", None, false, TEN_THOUSAND, ctl.clone());
    let (_c2, _p2, _m2, pool2, w2, _) = setup_on("together-2", None, false, TEN_THOUSAND, ctl.clone());
    let (s1, s2) = (w1.stats(), w2.stats());
    let h1 = std::thread::spawn(move || w1.run());
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(s1.tx_msgs.get(), 0, "the first worker sent before the second started");
    let h2 = std::thread::spawn(move || w2.run());
    let t0 = std::time::Instant::now();
    while t0.elapsed() < Duration::from_secs(20) && (s1.rx_msgs.get() < 20_000 || s2.rx_msgs.get() < 20_000) {
        std::thread::sleep(Duration::from_millis(20));
    }
    ctl.stop_sources.store(true, Ordering::Release);
    std::thread::sleep(Duration::from_millis(100));
    ctl.stop.store(true, Ordering::Release);
    for (h, pool) in [(h1, pool1), (h2, pool2)] {
        let r = h.join().unwrap().unwrap();
        let sink = r.stages.iter().find(|s| s.name == "sink").unwrap();
        assert_eq!(sink.msgs_in, 10_000, "every message came back: {r:?}");
        assert_eq!(pool.outstanding(), 0, "no buffer leaked");
    }
}

#[test]
fn a_worker_waiting_for_the_others_to_start_leaves_when_the_run_stops() {
    let ctl = Arc::new(Control::new());
    ctl.start_together(2);
    let (_ctx, _pd, _mr, pool, w, _) = setup_on("together-stop", None, false, TEN_THOUSAND, ctl.clone());
    let stats = w.stats();
    let h = std::thread::spawn(move || w.run());
    std::thread::sleep(Duration::from_millis(100));
    ctl.stop.store(true, Ordering::Release);
    let r = h.join().unwrap().unwrap();
    assert_eq!((stats.tx_msgs.get(), r.tx_msgs), (0, 0), "nothing was sent");
    assert_eq!(pool.outstanding(), 0);
}

#[test]
fn a_worker_thread_runs_until_stopped_and_returns_every_buffer() {
    let (_ctx, _pd, _mr, pool, w, ctl) = setup("run", None);
    let stats = w.stats();
    let h = std::thread::spawn(move || w.run());
    let t0 = std::time::Instant::now();
    while t0.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(20));
        if stats.rx_msgs.get() >= 20_000 {
            break;
        }
    }
    ctl.stop_sources.store(true, Ordering::Release);
    std::thread::sleep(Duration::from_millis(100));
    ctl.stop.store(true, Ordering::Release);
    let r = h.join().unwrap().unwrap();
    let sink = r.stages.iter().find(|s| s.name == "sink").unwrap();
    assert_eq!(sink.msgs_in, 10_000, "every message came back: {r:?}");
    assert_eq!(sink.report.gaps, 0);
    assert_eq!(r.qps.iter().map(|q| q.doorbells).sum::<u64>(), r.doorbells);
    assert!(r.doorbells < r.tx_msgs, "sends are batched ({} doorbells for {} msgs)", r.doorbells, r.tx_msgs);
    assert_eq!(pool.outstanding(), 0, "no buffer leaked");
}

/// QPs with receive queues of their own (`use_srq = false`): the worker posts their buffers
/// when it adds them and leaves its SRQ empty while no QP uses it (the pool is sized for the
/// queues in use), then refills each queue as it drains. 10,000 messages through 64-buffer
/// queues need ~150 refills of each: without them the sender would wait on RNR and the sink
/// would fall short. Every buffer comes back at the end. A QP added later on the SRQ fills
/// it then.
#[test]
fn own_receive_queues_carry_the_traffic_and_return_every_buffer() {
    let ctl = Arc::new(Control::new());
    let (_ctx, pd, _mr, pool, mut w, _) = setup_queues("own-rq", None, false, TEN_THOUSAND, ctl.clone(), Some(64), 0);
    let stats = w.stats();
    assert_eq!(stats.srq_posted.get(), 128, "posted: 64 per QP, none on the unused SRQ");
    let c = w.add_qp(&pd, QpParams { name: "c".into(), ..QpParams::default() }).unwrap();
    assert_eq!(stats.srq_posted.get(), 128 + 256, "the first QP on the SRQ filled it (srq_depth 256)");
    let r = run_until(w, &ctl, 20_000);
    let sink = r.stages.iter().find(|s| s.name == "sink").unwrap();
    assert_eq!((sink.msgs_in, sink.report.gaps), (10_000, 0), "{:?}", r.qps);
    assert!(r.srq_refills > 100, "{} refills for 20,000 receives through 64-buffer queues", r.srq_refills);
    assert_eq!((r.qps[c].rx_msgs, r.errors), (0, 0), "{:?}", r.qps);
    assert_eq!(pool.outstanding(), 0, "no buffer leaked");
}

/// A chain the QP refuses (here: not yet connected, so `post_send` fails at its first WR)
/// gives every gathered buffer back to the pool and frees the send-queue room it held; the
/// counters say so.
#[test]
fn a_refused_chain_returns_its_buffers_and_room() {
    use dataplane::verbs::{QpAttr, QpCaps, QpState, QpType};
    use dataplane::worker::batch::SendBatch;
    use dataplane::worker::stats::WorkerStats;
    use dataplane::{Qp, QpInitAttr};

    let (ctx, pd, mr, pool, _) = small_pool("refused", 64);
    let cq = ctx.create_cq(64).unwrap();
    let cap = QpCaps { max_send_wr: 16, max_recv_wr: 16, ..Default::default() };
    let attr = QpInitAttr::<Shm> { send_cq: &cq, recv_cq: &cq, srq: None, cap, qp_type: QpType::Rc, sq_sig_all: false };
    let mut qp = pd.create_qp(&attr).unwrap();
    qp.modify(&QpAttr { state: QpState::Init, ..Default::default() }).unwrap();
    let mut cache = pool.cache(16);
    let w = WorkerStats::new();
    // Doorbell batch 8: the eighth push posts the chain, which the INIT QP refuses.
    let mut batch = SendBatch::new(qp, 16, 8, 4, mr.lkey());
    for i in 0..8 {
        let buf = cache.get().expect("a buffer");
        assert!(batch.push(buf, 0, 32, &w, &mut cache), "push {i}");
    }
    assert_eq!(batch.inflight(), 0, "nothing was posted");
    assert_eq!(batch.room(), 16, "the refused WRs free their room");
    assert_eq!(w.errors.get(), 8, "each refused WR is an error");
    assert_eq!(w.tx_msgs.get(), 0);
    drop(cache);
    assert_eq!(pool.outstanding(), 0, "every buffer is back in the pool");
}

/// A batch awaits a completion exactly while a posted SIGNALED send has not been completed
/// (the worker polls its send CQ only then, and one loop in 64 otherwise): not for unsignaled
/// sends, not for a gathered chain not yet posted, and no more once the signaled completion
/// is handed back.
#[test]
fn a_batch_awaits_a_completion_only_for_a_posted_signaled_send() {
    use dataplane::verbs::{ConnectOpts, PeerAddr, QpCaps, QpType, RecvChain, RecvWr, Sge, WorkCompletion};
    use dataplane::worker::batch::SendBatch;
    use dataplane::worker::stats::WorkerStats;
    use dataplane::{Cq, Qp, QpInitAttr};

    let (ctx, pd, mr, pool, off) = small_pool("awaits", 64);
    let (mut scq, rcq) = (ctx.create_cq(64).unwrap(), ctx.create_cq(64).unwrap());
    let cap = QpCaps { max_send_wr: 16, max_recv_wr: 16, ..Default::default() };
    let mk = |cq| {
        pd.create_qp(&QpInitAttr { send_cq: cq, recv_cq: cq, srq: None, cap, qp_type: QpType::Rc, sq_sig_all: false })
    };
    let (mut a, mut b) = (mk(&scq).unwrap(), mk(&rcq).unwrap());
    let (ea, eb) = (a.endpoint(0).unwrap(), b.endpoint(0).unwrap());
    let opts = ConnectOpts { min_rnr_timer: 1, ..Default::default() };
    b.bring_up_to_init(&opts).unwrap();
    let mut recv = RecvChain::with_capacity(8, 8);
    for i in 0..8 {
        recv.push(RecvWr::new(i), &[Sge::new(mr.addr() + off as u64, 64, mr.lkey())]);
    }
    b.post_recv(&recv).unwrap();
    a.connect(&PeerAddr::from_endpoint(&eb, 1, 0), &opts).unwrap();
    b.connect(&PeerAddr::from_endpoint(&ea, 1, 0), &opts).unwrap();
    let mut cache = pool.cache(16);
    let w = WorkerStats::new();
    // Posted only by `flush` (doorbell batch = depth), one WR in 4 signaled.
    let mut batch = SendBatch::new(a, 16, 16, 4, mr.lkey());
    let push = |batch: &mut SendBatch<_>, cache: &mut dataplane::mem::PoolCache, n: usize| {
        for _ in 0..n {
            let buf = cache.get().expect("a buffer");
            assert!(batch.push(buf, 0, 8, &w, cache));
        }
    };
    push(&mut batch, &mut cache, 4);
    assert!(!batch.awaits_completion(), "WRs 0-3 gathered (3 signaled), none posted");
    batch.flush(&w, &mut cache);
    assert_eq!(batch.inflight(), 4);
    assert!(batch.awaits_completion(), "WR 3 is signaled and posted");
    let mut wc = [WorkCompletion::default(); 4];
    let t = std::time::Instant::now();
    let n = loop {
        let n = scq.poll(&mut wc).unwrap();
        if n > 0 || t.elapsed() > Duration::from_secs(5) {
            break n;
        }
    };
    assert_eq!((n, wc[0].wr_id), (1, 3), "one completion, of the signaled WR");
    batch.complete(&wc[0], &w, &mut cache);
    assert!(!batch.awaits_completion(), "its completion was handed back");
    assert_eq!(batch.inflight(), 0, "and it released every WR up to it");
    push(&mut batch, &mut cache, 3);
    batch.flush(&w, &mut cache);
    assert_eq!(batch.inflight(), 3);
    assert!(!batch.awaits_completion(), "WRs 4-6 posted, none signaled");
    assert_eq!(scq.poll(&mut wc).unwrap(), 0, "and none completes");
    batch.release_all(&mut cache);
    drop(cache);
    assert_eq!(pool.outstanding(), 0);
}

/// The pipeline clock (the invariant TSC calibrated against CLOCK_MONOTONIC, or
/// CLOCK_MONOTONIC itself) counts nanoseconds from its creation, as `Instant` does, within the
/// calibration's error, and a clone read on another thread continues the same count.
#[test]
fn the_clock_counts_nanoseconds_since_its_base() {
    let (clock, start) = (Clock::new(), std::time::Instant::now());
    let t0 = clock.now_ns();
    std::thread::sleep(Duration::from_millis(20));
    let t1 = clock.now_ns();
    let real = start.elapsed().as_nanos() as u64;
    // 0.1% of slack for the counter's calibrated rate (a few ppm in practice).
    assert!(t1 >= t0 + 19_980_000, "20 ms slept: {t0} -> {t1}");
    // The clock was created just before `start`.
    assert!(t1 <= real + real / 1000 + 1_000_000, "the clock ({t1} ns) does not run ahead of Instant ({real} ns)");
    let other = clock.clone();
    let t2 = std::thread::spawn(move || other.now_ns()).join().unwrap();
    assert!(t2 >= t1, "a clone on another thread reads {t2} ns after this thread read {t1} ns");
    assert!(t2 < t1 + 1_000_000_000, "a clone keeps the base: {t2} ns vs {t1} ns");
}

/// `Clock::spin_for` waits at least what it is asked, on the clock and by `Instant`
/// (within the counter's calibration error), and a zero wait returns at once.
#[test]
fn spin_for_waits_at_least_the_time_asked() {
    let clock = Clock::new();
    for ns in [0u64, 1_000, 200_000, 5_000_000] {
        let (t0, start) = (clock.now_ns(), std::time::Instant::now());
        clock.spin_for(ns);
        let (on_clock, real) = (clock.now_ns() - t0, start.elapsed().as_nanos() as u64);
        assert!(on_clock >= ns, "spin_for({ns}) returned after {on_clock} ns on the clock");
        assert!(real + real / 1000 + 100 >= ns, "spin_for({ns}) returned after {real} ns by Instant");
    }
}

/// A paced source keeps its schedule: never ahead of `due_at_rate` (its `Pacer` skips the
/// check between due times), and, stepped without pause, not far behind it.
#[test]
fn a_paced_source_keeps_its_schedule() {
    let rate = 10_000;
    let limits = SourceLimits { rate, count: 0, duration_ns: 0 };
    let (_ctx, _pd, _mr, pool, mut w, _ctl) = setup_with("paced", None, false, limits);
    let t0 = std::time::Instant::now();
    w.step();
    // The source's schedule starts at its first poll, inside that first step.
    let first = t0.elapsed();
    let mut last = first;
    while last < Duration::from_millis(100) {
        last = t0.elapsed();
        w.step();
    }
    let end = t0.elapsed();
    w.teardown();
    let r = w.report();
    let sent = r.stages.iter().find(|s| s.name == "src").unwrap().msgs_in;
    let most = due_at_rate(end.as_nanos() as u64, rate);
    assert!(sent <= most, "{sent} messages sent, at most {most} due after {end:?}");
    // The last poll came at least `last - first` into the schedule. Half of what was due by
    // then: a preempted test thread catches up 16 messages a loop, so only a stall fails.
    let due = due_at_rate((last - first).as_nanos() as u64, rate);
    assert!(sent >= due / 2, "{sent} messages sent, {due} due after {:?}", last - first);
    assert_eq!(pool.outstanding(), 0);
}

/// Warm passes post nothing: a worker running one after every idle loop (`keep_warm = 1`)
/// with a paced source (most loops idle), through the SRQ and through receive queues of the
/// QPs' own, delivers each message once, in order, sends exactly what the source and the
/// echo sent, and returns every buffer.
#[test]
fn warm_passes_post_nothing() {
    for recv_depth in [None, Some(64)] {
        let limits = SourceLimits { rate: 50_000, count: 500, duration_ns: 0 };
        let ctl = Arc::new(Control::new());
        let (_ctx, _pd, _mr, pool, mut w, _) = setup_queues("warm", None, false, limits, ctl, recv_depth, 1);
        let t0 = std::time::Instant::now();
        let stats = w.stats();
        while stats.rx_msgs.get() < 1_000 && t0.elapsed() < Duration::from_secs(20) {
            w.step();
        }
        // 10,000 idle loops past the last message, each with its warm pass: counted from
        // here, since a starved thread may have found traffic on every loop until now (the
        // bound only stops a worker that never goes idle).
        let idle0 = stats.idle_loops.get();
        for _ in 0..100_000 {
            if stats.idle_loops.get() - idle0 >= 10_000 {
                break;
            }
            w.step();
        }
        let idle = stats.idle_loops.get() - idle0;
        assert!(idle >= 10_000, "{recv_depth:?}: only {idle} of 100,000 loops past the last message were idle");
        w.teardown();
        let r = w.report();
        let sink = r.stages.iter().find(|s| s.name == "sink").unwrap();
        assert_eq!((sink.msgs_in, sink.report.gaps, sink.report.duplicates), (500, 0, 0), "{recv_depth:?}: {r:?}");
        assert_eq!((stats.tx_msgs.get(), stats.rx_msgs.get(), stats.errors.get()), (1_000, 1_000, 0), "{recv_depth:?}");
        assert_eq!(pool.outstanding(), 0);
    }
}

/// What [`Probe`] saw of one message: the source's stamp, the burst's receive time, a fresh
/// clock read.
type Seen = (u64, u64, u64);

/// User code: records each message's timestamp, `rx_time_ns` and `now_ns`, then drops it.
struct Probe(Arc<std::sync::Mutex<Vec<Seen>>>);

impl Handler for Probe {
    fn on_message(&mut self, msg: Msg, cx: &mut StageCx<'_>) {
        let ts = read_u64(cx.bytes(&msg), TS_OFFSET);
        let (rx, now) = (cx.rx_time_ns(), cx.now_ns());
        self.0.lock().unwrap().push((ts, rx, now));
        cx.drop_msg(msg);
    }
}

/// `rx_time_ns` reads the clock once per burst, and never stamps a message as received before
/// its source stamped it: one worker runs a source through a QP into a probe (bursts of
/// receives) and a second source straight into another probe (messages made after the
/// receive burst of the same loop was stamped).
#[test]
fn a_burst_is_stamped_once_and_never_before_its_messages() {
    let (_ctx, pd, _mr, pool, mut w, _ctl) = setup_with("rxtime", None, false, TEN_THOUSAND);
    let (via_qp, local) = (Arc::new(std::sync::Mutex::new(Vec::new())), Arc::new(std::sync::Mutex::new(Vec::new())));
    // The QP pair of `setup_with` runs src -> a -> b -> echo -> b -> a -> sink; a third pair
    // feeds the first probe, and a source feeds the second directly.
    let qp = |n: &str| QpParams { name: n.into(), send_depth: 64, signal_interval: 8, ..QpParams::default() };
    let (c, d) = (w.add_qp(&pd, qp("c")).unwrap(), w.add_qp(&pd, qp("d")).unwrap());
    let (qc, qd) = (w.qp_num(c), w.qp_num(d));
    w.connect(c, qd).unwrap();
    w.connect(d, qc).unwrap();
    w.add_stage("probe-qp", "user", Box::new(Probe(via_qp.clone())), vec![], Some(d));
    w.add_stage("src-qp", "source", Box::new(Source::new(32, TEN_THOUSAND, 16)), vec![Target::Qp(c as u16)], None);
    let local_probe = w.add_stage("probe-local", "user", Box::new(Probe(local.clone())), vec![], None);
    w.add_stage(
        "src-local",
        "source",
        Box::new(Source::new(32, TEN_THOUSAND, 16)),
        vec![Target::Stage(local_probe as u16)],
        None,
    );
    let t0 = std::time::Instant::now();
    while (via_qp.lock().unwrap().len() < 10_000 || local.lock().unwrap().len() < 10_000)
        && t0.elapsed() < Duration::from_secs(20)
    {
        w.step();
    }
    w.teardown();
    for (name, seen) in [("via a QP", &via_qp), ("from a local source", &local)] {
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 10_000, "{name}: messages seen");
        for &(ts, rx, now) in seen.iter() {
            assert!(ts <= rx && rx <= now, "{name}: stamped {ts}, burst received {rx}, handled {now}");
        }
        // Up to 32 messages a loop: far fewer readings than messages.
        let mut times: Vec<u64> = seen.iter().map(|s| s.1).collect();
        times.dedup();
        assert!(times.len() <= seen.len() / 4, "{name}: {} receive times for {} messages", times.len(), seen.len());
    }
    assert_eq!(pool.outstanding(), 0);
}

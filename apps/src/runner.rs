//! Brings a pipeline up from its config, runs it, shuts it down gracefully and reports.
//!
//! Bring-up (off the hot path): open the provider, carve each pool from provider memory and
//! register it, build each worker (CQs, SRQ filled from the pool), create and connect the
//! QPs (a local `peer` is a QP of this pipeline on the same device or fabric; remote peers are
//! reached through the out-of-band exchange, [`crate::exchange`]), attach the stages, then
//! start one pinned thread per worker. Values the device cannot do are refused first
//! ([`crate::limits`]).
//!
//! A pipeline with remote peers also stops when one of them ends (its exchange connection
//! closes). Shutdown: stop the sources, wait until every message sent has been received and the
//! workers are quiet (drain), stop the workers (each moves its QPs to ERROR, drains its CQs
//! and returns every buffer), then check that every pool has all its buffers back.

use crate::exchange::{self, Route};
use crate::limits;
use crate::stages::Registry;
use crate::stats;
use dataplane::mem::{BufferPool, HugePolicy, PageSize as MemPage};
use dataplane::pipeline::{Clock, Handler, Target};
use dataplane::rdma::{Rdma, RdmaConfig};
use dataplane::shm::{Shm, ShmConfig};
use dataplane::verbs::{AccessFlags, QpType};
use dataplane::worker::idle::IdleKind;
use dataplane::worker::stats::{QpStats, WorkerStats};
use dataplane::worker::{Control, PeerAddr, QpParams, Worker, WorkerParams, WorkerReport};
use dataplane::xdp::{Xdp, XdpConfig};
use dataplane::{Context, Mr, Pd, Provider};
use dataplane_config::{Config, HugepagePolicy, IdlePolicy, PageSize, Peer, ProviderKind, StageKind, Transport};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long to run.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Stop after this long; `None`: when interrupted, or when every source has reached its
    /// limit and the pipeline went quiet.
    pub duration: Option<Duration>,
    /// Overrides every worker's `doorbell_batch` (benchmarks).
    pub doorbell_batch: Option<u32>,
    /// Overrides the fabric name (tests running side by side).
    pub fabric: Option<String>,
    /// Runs without pinning (tests on machines with fewer cores).
    pub no_pin: bool,
    /// Does not export live stats (no segment for `dpctl`).
    pub no_stats: bool,
}

/// A pool's buffer accounting after shutdown.
#[derive(Debug, Clone)]
pub struct PoolReport {
    /// Pool name.
    pub name: String,
    /// Buffers in the pool.
    pub count: usize,
    /// Buffers not returned (leaked).
    pub leaked: usize,
}

/// Everything a run produced.
#[derive(Debug, Clone)]
pub struct RunReport {
    /// Wall time from start until the sources were stopped.
    pub elapsed: Duration,
    /// Whether the drain finished (every sent message received) before its deadline.
    pub drained: bool,
    /// How long the drain took.
    pub drain_time: Duration,
    /// Per worker, with their QPs and stages.
    pub workers: Vec<WorkerReport>,
    /// Per pool.
    pub pools: Vec<PoolReport>,
    /// Whether the run ended because of Ctrl-C.
    pub interrupted: bool,
    /// Whether a remote peer left (its exchange connection closed) before or during the
    /// drain; the drain then ends as soon as nothing moves.
    pub peer_gone: bool,
    /// Messages sent on RC QPs and not received back when the drain ended (0 when drained).
    pub lost_in_flight: u64,
    /// The device's own counters at the end of the run (`Context::device_counters`: the
    /// `xdp` ports' frames and drops; empty on `shm` and `rdma`).
    pub device: Vec<(String, u64)>,
}

/// Runs the (validated) pipeline `cfg`, its stages made by `registry`. `interrupt` is set by
/// the Ctrl-C handler.
pub fn run(cfg: &Config, registry: &Registry, opts: &RunOptions, interrupt: &AtomicBool) -> Result<RunReport, String> {
    match *cfg.provider.kind {
        ProviderKind::Rdma => {
            if opts.fabric.is_some() {
                return Err("--fabric names an shm fabric; this pipeline uses the rdma provider".into());
            }
            let p = &cfg.provider;
            let rcfg = RdmaConfig {
                device: p.device.as_ref().map(|d| d.as_str().to_owned()),
                port: *p.port,
                gid_index: *p.gid_index,
            };
            run_on::<Rdma>(&rcfg, cfg, registry, opts, interrupt)
        }
        ProviderKind::Xdp => {
            if opts.fabric.is_some() {
                return Err("--fabric names an shm fabric; this pipeline uses the xdp provider".into());
            }
            let names: Vec<&str> =
                cfg.provider.interfaces.as_ref().map(|i| i.iter().map(String::as_str).collect()).unwrap_or_default();
            run_on::<Xdp>(&XdpConfig::ports(&names), cfg, registry, opts, interrupt)
        }
        ProviderKind::Shm => {
            let fabric = opts.fabric.clone().unwrap_or_else(|| cfg.provider.fabric.as_str().to_owned());
            let page = match *cfg.memory.page_size {
                PageSize::Huge2M => MemPage::Huge2M,
                PageSize::Huge1G => MemPage::Huge1G,
            };
            let huge = match *cfg.memory.hugepages {
                HugepagePolicy::Require => HugePolicy::Require(page),
                HugepagePolicy::Prefer => HugePolicy::Prefer(page),
                HugepagePolicy::Never => HugePolicy::Never,
            };
            // The same figure `check` tested the pipeline against.
            let size = limits::shm_fabric_bytes(cfg) as usize;
            run_on::<Shm>(&ShmConfig { fabric, size, huge }, cfg, registry, opts, interrupt)
        }
    }
}

struct Built<P: Provider> {
    workers: Vec<Worker<P>>,
    /// QP name → (worker index, QP index in the worker).
    qps: HashMap<String, (usize, usize)>,
}

/// Builds and runs the pipeline on provider `P`.
pub fn run_on<P: Provider>(
    pcfg: &P::Config,
    cfg: &Config,
    registry: &Registry,
    opts: &RunOptions,
    interrupt: &AtomicBool,
) -> Result<RunReport, String>
where
    Worker<P>: Send,
    P::Pd: Sync,
{
    let ctx = Arc::new(P::open(pcfg).map_err(|e| format!("cannot open the {} provider: {e}", P::NAME))?);
    // The port and GID index of every route (the shm port is 1 and has one GID).
    let route = match *cfg.provider.kind {
        ProviderKind::Rdma => Route { port: *cfg.provider.port, gid_index: *cfg.provider.gid_index },
        ProviderKind::Shm | ProviderKind::Xdp => Route { port: 1, gid_index: 0 },
    };
    let device = match &cfg.provider.device {
        Some(d) => format!("device {}", d.as_str()),
        None => format!("the {} device", P::NAME),
    };
    let mtu = ctx.port_attr(route.port).map_err(|e| format!("{device}: port {}: {e}", route.port))?.active_mtu;
    let fit = limits::fit(cfg, &ctx.caps(), mtu, &device)?;
    for n in &fit.notes {
        eprintln!("dataplane: {n}");
    }
    let pd = ctx.alloc_pd().map_err(|e| format!("alloc_pd: {e}"))?;
    let ctl = Arc::new(Control::new());
    let clock = Clock::new();

    // Pools: one registered region each.
    let mut pools: HashMap<&str, (BufferPool, P::Mr)> = HashMap::new();
    for p in &cfg.memory.pools {
        let (size, count) = (p.buffer_size.bytes() as usize, *p.count as usize);
        let len = size.div_ceil(64) * 64 * count + 64;
        let region =
            ctx.alloc_region(len).map_err(|e| format!("pool {}: cannot allocate {len} bytes: {e}", *p.name))?;
        let mr = pd
            .reg_mr(&region, 0, len, AccessFlags::LOCAL_WRITE)
            .map_err(|e| format!("pool {}: reg_mr: {e}", *p.name))?;
        let off = (64 - (mr.addr() % 64) as usize) % 64;
        let pool = BufferPool::from_region(Arc::new(region), off, size, count)
            .map_err(|e| format!("pool {}: {e}", *p.name))?;
        pools.insert(p.name.as_str(), (pool, mr));
    }

    let mut b = build::<P>(cfg, registry, opts, &ctx, &pd, &pools, &ctl, clock, route, &fit)?;
    // Live stats: the workers' counters move into a shared-memory segment that dpctl reads
    // (before the remote exchange, which may wait for the other side: dpctl sees it start).
    let name = opts.fabric.as_deref().unwrap_or(cfg.provider.fabric.as_str());
    let segment =
        if opts.no_stats { None } else { Some(stats::export::export(&mut b.workers, &stats::stats_dir(), name)?) };
    let links = exchange::connect_remote::<P>(cfg, &pd, &mut b.workers, &b.qps, route, interrupt)?;
    let stats: Vec<WorkerStats> = b.workers.iter().map(|w| w.stats()).collect();
    // The drain waits for what a reliable transport delivers: messages on RC QPs. A UD
    // datagram or an Ethernet frame may be lost (no receive posted, as on a NIC), so UD and
    // RAW_PACKET QPs are not waited for.
    let reliable: Vec<QpStats> = cfg
        .qps
        .iter()
        .filter(|q| *q.transport == Transport::Rc)
        .filter_map(|q| b.qps.get(q.name.as_str()).map(|&(w, i)| b.workers[w].qp_stats(i)))
        .collect();

    // Start: the workers begin their loops together (a source must not send into a peer
    // whose thread is still being pinned).
    ctl.start_together(b.workers.len());
    let start = Instant::now();
    let mut handles = Vec::new();
    for w in b.workers {
        let name = w.name().to_owned();
        let h = std::thread::Builder::new()
            .name(format!("dp-{name}"))
            .spawn(move || w.run())
            .map_err(|e| format!("cannot start worker {name}: {e}"))?;
        handles.push(h);
    }

    // Run.
    // Without sources (the listening side of a remote pair), only a duration, Ctrl-C or the
    // remote peer leaving ends the run.
    // A source of a registered kind may say it is done (a replayed file at its end): when
    // every source has, the run ends as a limited one does.
    let mut sources =
        cfg.stages.iter().filter(|s| registry.get(s.kind.as_str()).is_some_and(|k| !k.shape.input)).peekable();
    let n_sources = sources.clone().count();
    let all_limited = sources.peek().is_some()
        && sources.all(|s| *s.kind == StageKind::Source && (*s.count != 0 || !s.duration.is_zero()));
    let all_done = || n_sources > 0 && ctl.sources_done.load(Ordering::Acquire) >= n_sources;
    let total = |stats: &[WorkerStats]| -> (u64, u64) {
        stats.iter().fold((0, 0), |(t, r), s| (t + s.tx_msgs.get(), r + s.rx_msgs.get()))
    };
    let in_flight =
        || -> (u64, u64) { reliable.iter().fold((0, 0), |(t, r), s| (t + s.tx_msgs.get(), r + s.rx_msgs.get())) };
    let mut last = (0, 0);
    let mut quiet_since = Instant::now();
    let mut interrupted = false;
    let mut peer_gone = false;
    loop {
        std::thread::sleep(Duration::from_millis(10));
        if ctl.stop.load(Ordering::Acquire) || handles.iter().any(|h| h.is_finished()) {
            break; // a worker failed (e.g. could not pin)
        }
        if interrupt.load(Ordering::Relaxed) {
            interrupted = true;
            break;
        }
        if let Some(addr) = links.closed() {
            eprintln!("dataplane: the remote peer at {addr} closed its connection; stopping");
            peer_gone = true;
            break;
        }
        if let Some(d) = opts.duration {
            if start.elapsed() >= d {
                break;
            }
            continue;
        }
        let now = total(&stats);
        if now != last {
            last = now;
            quiet_since = Instant::now();
        } else if (all_limited || all_done()) && now.0 > 0 && quiet_since.elapsed() > Duration::from_millis(300) {
            break;
        }
    }
    let elapsed = start.elapsed();

    // Drain: sources stop; wait until every message sent was received and nothing moves.
    ctl.stop_sources.store(true, Ordering::Release);
    if let Some(s) = &segment {
        s.set_state(stats::layout::State::Draining);
    }
    let drain_start = Instant::now();
    let deadline = drain_start + Duration::from_secs(10);
    let mut drained = false;
    let mut last = (u64::MAX, 0);
    let mut stable = 0;
    while Instant::now() < deadline && !ctl.stop.load(Ordering::Acquire) {
        std::thread::sleep(Duration::from_millis(20));
        let (now, reliable_now) = (total(&stats), in_flight());
        stable = if now == last { stable + 1 } else { 0 };
        last = now;
        if reliable_now.0 == reliable_now.1 && stable >= 2 {
            drained = true;
            break;
        }
        // A remote peer that left answers nothing more: once the counters stop moving, what
        // is still in flight is lost; waiting out the deadline would not bring it back.
        if (peer_gone || links.closed().is_some()) && stable >= 5 {
            peer_gone = true;
            break;
        }
    }
    let drain_time = drain_start.elapsed();
    ctl.stop.store(true, Ordering::Release);

    let mut workers = Vec::new();
    let mut errors = Vec::new();
    for h in handles {
        match h.join() {
            Ok(Ok(r)) => workers.push(r),
            Ok(Err(e)) => errors.push(e.to_string()),
            Err(_) => errors.push("a worker thread panicked".to_string()),
        }
    }
    if !errors.is_empty() {
        return Err(errors.join("\n"));
    }
    let pools = cfg
        .memory
        .pools
        .iter()
        .filter_map(|p| pools.get(p.name.as_str()).map(|(pool, _)| (p, pool)))
        .map(|(p, pool)| PoolReport {
            name: p.name.as_str().to_owned(),
            count: pool.count(),
            leaked: pool.outstanding(),
        })
        .collect();
    let lost = if drained {
        0
    } else {
        {
            let n = in_flight();
            n.0.saturating_sub(n.1)
        }
    };
    let device = ctx.device_counters();
    Ok(RunReport { elapsed, drained, drain_time, workers, pools, interrupted, peer_gone, lost_in_flight: lost, device })
}

#[allow(clippy::too_many_arguments)]
fn build<P: Provider>(
    cfg: &Config,
    registry: &Registry,
    opts: &RunOptions,
    ctx: &Arc<P::Context>,
    pd: &P::Pd,
    pools: &HashMap<&str, (BufferPool, P::Mr)>,
    ctl: &Arc<Control>,
    clock: Clock,
    route: Route,
    fit: &limits::Fit,
) -> Result<Built<P>, String> {
    let mut workers = Vec::new();
    let widx: HashMap<&str, usize> = cfg.workers.iter().enumerate().map(|(i, w)| (w.name.as_str(), i)).collect();
    for w in &cfg.workers {
        let (pool, mr) =
            pools.get(w.pool.as_str()).ok_or_else(|| format!("worker {}: no pool {}", *w.name, *w.pool))?;
        let pcfg = cfg.pool(w.pool.as_str()).ok_or("pool vanished")?;
        let params = WorkerParams {
            name: w.name.as_str().to_owned(),
            core: (!opts.no_pin).then_some(*w.core),
            poll_burst: *w.poll_burst,
            doorbell_batch: opts.doorbell_batch.unwrap_or(*w.doorbell_batch),
            cq_depth: *w.cq_depth,
            srq_depth: *w.srq_depth,
            srq_low_watermark: *w.srq_low_watermark,
            recv_buffer_size: w.recv_buffer_size.bytes() as u32,
            idle: match *w.idle {
                IdlePolicy::Spin => IdleKind::Spin,
                IdlePolicy::SpinThenPause => IdleKind::SpinThenPause,
                IdlePolicy::Backoff => IdleKind::Backoff,
            },
            spin_count: *w.spin_count,
            keep_warm: *w.keep_warm,
            cache_size: *pcfg.cache_size,
        };
        let worker = Worker::<P>::new(params, ctx.clone(), pd, pool.clone(), mr.lkey(), ctl.clone(), clock.clone())
            .map_err(|e| format!("worker {}: {e}", *w.name))?;
        workers.push(worker);
    }

    // QPs.
    let mut qidx: HashMap<&str, (usize, usize)> = HashMap::new();
    for (j, q) in cfg.qps.iter().enumerate() {
        let name = q.name.as_str();
        let wi = *widx.get(q.worker.as_str()).ok_or_else(|| format!("qp {name}: no worker {}", *q.worker))?;
        let wcfg = &cfg.workers[wi];
        let params = QpParams {
            name: name.to_owned(),
            transport: match *q.transport {
                Transport::Rc => QpType::Rc,
                Transport::Ud => QpType::Ud,
                Transport::RawPacket => QpType::RawPacket,
            },
            port: q.port.as_ref().map_or(1, |p| **p),
            max_inline: fit.max_inline.get(j).copied().unwrap_or(0),
            send_depth: *q.send_depth,
            signal_interval: q.effective_signal_interval(wcfg),
            min_rnr_timer: *q.min_rnr_timer,
            rnr_retry: *q.rnr_retry,
            retry_cnt: *q.retry_cnt,
            timeout: *q.timeout,
            recv_depth: (!*q.use_srq).then_some(*q.recv_depth),
        };
        let i = workers[wi].add_qp(pd, params).map_err(|e| format!("qp {name}: {e}"))?;
        if let Some(gid) = q.mcast_gid() {
            let group = std::net::Ipv6Addr::from(gid);
            workers[wi].attach_mcast(i, &gid).map_err(|e| format!("qp {name}: join multicast group {group}: {e}"))?;
        }
        qidx.insert(name, (wi, i));
    }
    for q in &cfg.qps {
        let (wi, i) = qidx[q.name.as_str()];
        if let Some(Peer::Local(peer)) = q.peer() {
            let (pw, pi) = *qidx.get(peer).ok_or_else(|| format!("qp {}: no peer QP {peer}", *q.name))?;
            // The peer is on this device: the route leads back to our own port.
            let ep = workers[pw].endpoint(pi, route.gid_index).map_err(|e| format!("qp {peer}: endpoint: {e}"))?;
            let addr: PeerAddr = route.to(&ep);
            workers[wi].connect_to(pd, i, &addr).map_err(|e| format!("qp {}: connect to {peer}: {e}", *q.name))?;
        }
        if let Some(Peer::Group(gid)) = q.peer() {
            let addr = PeerAddr::mcast_group(gid, 1, route.gid_index);
            let group = std::net::Ipv6Addr::from(gid);
            workers[wi]
                .connect_to(pd, i, &addr)
                .map_err(|e| format!("qp {}: send to multicast group {group}: {e}", *q.name))?;
        }
    }

    // Stages: indices first (links refer forward), then handlers.
    let mut sidx: HashMap<&str, (usize, usize)> = HashMap::new();
    let mut per_worker = vec![0usize; workers.len()];
    for s in &cfg.stages {
        let wi = *widx.get(s.worker.as_str()).ok_or_else(|| format!("stage {}: no worker {}", *s.name, *s.worker))?;
        sidx.insert(s.name.as_str(), (wi, per_worker[wi]));
        per_worker[wi] += 1;
    }
    for (si, s) in cfg.stages.iter().enumerate() {
        let (wi, _) = sidx[s.name.as_str()];
        let target = |ep: &str| -> Result<Target, String> {
            if let Some(&(w, i)) = qidx.get(ep) {
                if w != wi {
                    return Err(format!("stage {}: QP {ep} belongs to another worker", *s.name));
                }
                return Ok(Target::Qp(i as u16));
            }
            match sidx.get(ep) {
                Some(&(w, i)) if w == wi => Ok(Target::Stage(i as u16)),
                Some(_) => Err(format!(
                    "stage {}: stage {ep} runs on another worker; link workers through a pair of QPs",
                    *s.name
                )),
                None => Err(format!("stage {}: no endpoint {ep}", *s.name)),
            }
        };
        let outputs = s.destinations().map(|d| target(d.as_str())).collect::<Result<Vec<_>, _>>()?;
        let input_qp = match s.input.as_deref() {
            Some(ep) => match target(ep)? {
                Target::Qp(q) => Some(q as usize),
                Target::Stage(_) => None,
            },
            None => None,
        };
        let handler: Box<dyn Handler> = registry.build(cfg, si).map_err(|e| e.to_string())?;
        workers[wi].add_stage(s.name.as_str(), s.kind.as_str(), handler, outputs, input_qp);
    }
    let qps = qidx.into_iter().map(|(n, at)| (n.to_owned(), at)).collect();
    Ok(Built { workers, qps })
}

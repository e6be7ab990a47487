//! The pinned busy-poll worker.
//!
//! A [`Worker`] owns a send CQ and a receive CQ, one SRQ ([`srq::Replenisher`]), its QPs
//! (each with a [`batch::SendBatch`], and receiving through the SRQ or a receive queue of its
//! own, both filled through [`srq::RecvBuffers`]), a [`PoolCache`] and its stages. [`Worker::run`] pins
//! the thread with `core_affinity` (a failed pin is an error) and loops ([`Worker::step`],
//! in `poll.rs`) until the [`Control`] says stop, then tears down: QPs to ERROR, CQs drained,
//! every buffer back to the pool.
//!
//! The steady-state loop allocates nothing, takes no lock and makes no system call: every
//! array is sized at construction (`tests/no_alloc.rs` counts allocations to prove it).

pub mod batch;
pub(crate) mod fifo;
pub mod idle;
mod poll;
pub mod srq;
pub mod stats;

use crate::mem::{BufferPool, PoolCache};
use crate::pipeline::{Clock, Handler, LocalQueue, StageReport, Target};
use crate::provider::{Context, Cq, Pd, Provider, Qp, QpInitAttr};
use crate::verbs::{
    AhAttr, ConnectOpts, Endpoint, Errno, Error, QpAttr, QpCaps, QpState, QpType, Result, SrqAttr, UdDest,
    WorkCompletion, GRH_LEN,
};
use batch::SendBatch;
use idle::{Idle, IdleKind};
use srq::{Level, RecvBuffers, Replenisher};
use stats::{
    CounterBlock, LatencyBuckets, QpCounters, Slot, StageShape, StageStats, StatsShape, WorkerCounters, WorkerSlots,
    WorkerStats,
};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;

/// Shared run control of a pipeline's workers.
#[derive(Debug)]
pub struct Control {
    /// Sources stop generating.
    pub stop_sources: AtomicBool,
    /// Workers leave their loops and tear down.
    pub stop: AtomicBool,
    /// Sources that said they will generate nothing more ([`Handler::done`]), over all
    /// workers: when it reaches the number of sources and the counters rest, a run without a
    /// duration ends.
    pub sources_done: AtomicUsize,
    /// SRQ numbers whose limit event fired, for the worker owning them (events of one
    /// context may be read by any of its workers). 0 = empty slot.
    srq_events: [AtomicU32; 32],
    /// Workers of this run that have pinned themselves and started their stages.
    started: AtomicUsize,
    /// How many workers start together ([`Control::start_together`]); 0: none waits.
    together: AtomicUsize,
}

impl Default for Control {
    fn default() -> Self {
        Control {
            stop_sources: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            sources_done: AtomicUsize::new(0),
            srq_events: std::array::from_fn(|_| AtomicU32::new(0)),
            started: AtomicUsize::new(0),
            together: AtomicUsize::new(0),
        }
    }
}

impl Control {
    /// A fresh control block.
    pub fn new() -> Control {
        Control::default()
    }

    /// Makes the next `workers` calls of [`Worker::run`] on this control block start their
    /// loops together: each pins its thread and starts its stages, then waits until all have
    /// (or the run stops). Without it a source on a worker that is up first sends into a
    /// peer whose thread is still being moved to its core or whose stages are still
    /// starting (a user stage loading a file), and every message sent meanwhile waits for
    /// it: the tail of a latency histogram then measures start-up, not the pipeline.
    pub fn start_together(&self, workers: usize) {
        self.together.store(workers, Ordering::Release);
    }

    /// Counts this worker as started and waits for the others ([`Control::start_together`])
    /// or for the run to stop. Yields while it waits: start-up is not the hot path, and
    /// workers may share cores.
    fn wait_for_start(&self) {
        self.started.fetch_add(1, Ordering::AcqRel);
        let want = self.together.load(Ordering::Acquire);
        while self.started.load(Ordering::Acquire) < want && !self.stop.load(Ordering::Acquire) {
            std::thread::yield_now();
        }
    }

    fn note_srq_event(&self, srqn: u32) {
        for s in &self.srq_events {
            if s.load(Ordering::Relaxed) == srqn {
                return;
            }
        }
        for s in &self.srq_events {
            if s.compare_exchange(0, srqn, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
                return;
            }
        }
    }

    /// Every worker calls this every `EVENT_PERIOD` loops, nearly always with no event: a
    /// plain load first, so that the shared slots are not taken exclusive (a failed
    /// compare-exchange is still a locked write access) and bounced between the workers' cores.
    fn take_srq_event(&self, srqn: u32) -> bool {
        self.srq_events.iter().any(|s| {
            s.load(Ordering::Relaxed) == srqn
                && s.compare_exchange(srqn, 0, Ordering::AcqRel, Ordering::Relaxed).is_ok()
        })
    }
}

/// Settings of one worker.
#[derive(Debug, Clone)]
pub struct WorkerParams {
    /// Name, for reports.
    pub name: String,
    /// Core to pin to; `None` leaves the thread unpinned (tests).
    pub core: Option<usize>,
    /// Completions taken per poll.
    pub poll_burst: u32,
    /// Send WRs per doorbell at most.
    pub doorbell_batch: u32,
    /// Entries of each CQ.
    pub cq_depth: u32,
    /// Receive buffers kept posted on the SRQ.
    pub srq_depth: u32,
    /// Refill below this many.
    pub srq_low_watermark: u32,
    /// Bytes of each posted receive buffer.
    pub recv_buffer_size: u32,
    /// Idle policy.
    pub idle: IdleKind,
    /// Empty loops before the idle policy pauses or backs off.
    pub spin_count: u32,
    /// Buffers in the worker's pool cache.
    pub cache_size: u32,
    /// Empty loops between two warm passes, dry runs of a send on every QP that keep the
    /// post path in the core's caches between sparse messages (0: none; `keep_warm` in the
    /// config, docs/runtime.md).
    pub keep_warm: u32,
}

/// The top-up batch of every receive queue of a worker: its cache's batch, not below 32
/// buffers per post (why: [`srq::Level::set_top_up`]).
fn top_up_batch(cache: &PoolCache) -> u32 {
    cache.batch().max(32) as u32
}

/// Q_Key of the runtime's UD QPs (the one `ibv_ud_pingpong` uses).
pub const UD_QKEY: u32 = 0x1111_1111;

/// Settings of one QP.
#[derive(Debug, Clone)]
pub struct QpParams {
    /// Name, for reports.
    pub name: String,
    /// RC, UD or RAW_PACKET (UC is not used by the runtime).
    pub transport: QpType,
    /// The device port the QP is bound to (1-based; RAW_PACKET QPs on a multi-port `xdp`
    /// device pick their interface with it).
    pub port: u8,
    /// Send queue entries.
    pub send_depth: u32,
    /// One send in this many is signaled.
    pub signal_interval: u32,
    /// RNR NAK timer code (RTR).
    pub min_rnr_timer: u8,
    /// RNR retries, 7 = forever (RTS).
    pub rnr_retry: u8,
    /// Transport retries (RTS).
    pub retry_cnt: u8,
    /// ACK timeout code (RTS).
    pub timeout: u8,
    /// Sends of at most this many bytes are posted INLINE (0: never). Must not exceed the
    /// device's `max_inline_data` (the runner clamps it).
    pub max_inline: u32,
    /// `None`: the QP receives through the worker's SRQ. `Some(n)`: through a receive queue
    /// of its own, kept at `n` posted buffers (topped up in batches of the pool cache's, as
    /// the SRQ is). Its traffic then cannot take the other QPs' buffers, and with one QP per
    /// worker, which gains nothing from sharing, it is a little faster on `shm` (a sender
    /// takes the request without the SRQ's out-of-line take and limit check; the echo
    /// pipeline's latency at 100k msg/s 0.92-0.96x, docs/benchmarks.md, session 40).
    pub recv_depth: Option<u32>,
}

impl Default for QpParams {
    /// An RC QP with the config schema's defaults.
    fn default() -> Self {
        QpParams {
            name: String::new(),
            transport: QpType::Rc,
            port: 1,
            send_depth: 128,
            signal_interval: 16,
            min_rnr_timer: 12,
            rnr_retry: 7,
            retry_cnt: 7,
            timeout: 14,
            max_inline: 0,
            recv_depth: None,
        }
    }
}

/// Where a QP's peer is (the provider API's bring-up address).
pub use crate::verbs::PeerAddr;

pub(crate) struct StageSlot {
    pub(crate) name: String,
    pub(crate) kind: String,
    pub(crate) handler: Box<dyn Handler>,
    pub(crate) outputs: Vec<Target>,
    pub(crate) stats: StageStats,
    /// Live latency histogram, when exported (`Worker::move_stats`) and the handler records.
    pub(crate) latency: Option<Slot<LatencyBuckets>>,
}

/// A snapshot of one QP's counters.
#[derive(Debug, Clone, Default)]
pub struct QpReport {
    /// QP name.
    pub name: String,
    /// Messages received.
    pub rx_msgs: u64,
    /// Bytes received.
    pub rx_bytes: u64,
    /// Messages sent.
    pub tx_msgs: u64,
    /// Bytes sent.
    pub tx_bytes: u64,
    /// Doorbells rung.
    pub doorbells: u64,
    /// Signaled WRs.
    pub signaled: u64,
    /// RNR retry-exceeded completions.
    pub rnr: u64,
    /// Errors.
    pub errors: u64,
}

/// What a stage did.
#[derive(Debug, Clone, Default)]
pub struct StageSummary {
    /// Stage name.
    pub name: String,
    /// Kind (`"sink"`, `"echo"`, ..., or a registered kind's name).
    pub kind: String,
    /// Messages in (generated, for sources).
    pub msgs_in: u64,
    /// Bytes in.
    pub bytes_in: u64,
    /// Messages passed on.
    pub msgs_out: u64,
    /// Bytes passed on.
    pub bytes_out: u64,
    /// Messages consumed or dropped.
    pub dropped: u64,
    /// Handler-specific results.
    pub report: StageReport,
}

/// What a worker did, returned by [`Worker::run`].
#[derive(Debug, Clone, Default)]
pub struct WorkerReport {
    /// Worker name.
    pub name: String,
    /// Pinned core.
    pub core: Option<usize>,
    /// Loop iterations, busy and idle.
    pub loops: u64,
    /// Loops that found work.
    pub busy_loops: u64,
    /// Loops that idled.
    pub idle_loops: u64,
    /// Messages received.
    pub rx_msgs: u64,
    /// Bytes received.
    pub rx_bytes: u64,
    /// Messages sent.
    pub tx_msgs: u64,
    /// Bytes sent.
    pub tx_bytes: u64,
    /// Send doorbells.
    pub doorbells: u64,
    /// Receive refills: of the SRQ and of the QPs' own receive queues.
    pub srq_refills: u64,
    /// SRQ limit events handled.
    pub srq_limit_events: u64,
    /// RNR retry-exceeded completions.
    pub rnr: u64,
    /// Errors.
    pub errors: u64,
    /// Messages dropped for lack of room.
    pub dropped: u64,
    /// Per QP.
    pub qps: Vec<QpReport>,
    /// Per stage.
    pub stages: Vec<StageSummary>,
}

/// A worker, generic over the provider (monomorphized: no dynamic dispatch on the verbs path).
pub struct Worker<P: Provider> {
    pub(crate) params: WorkerParams,
    pub(crate) ctx: Arc<P::Context>,
    pub(crate) scq: P::Cq,
    /// Whether some QP awaits the completion of a signaled send (`SendBatch::awaits_completion`,
    /// as of the end of the last loop): when not, the send CQ is polled one loop in
    /// [`SEND_CQ_IDLE_PERIOD`](poll::SEND_CQ_IDLE_PERIOD) only.
    pub(crate) scq_awaited: bool,
    pub(crate) rcq: P::Cq,
    pub(crate) srq: Replenisher<P::Srq>,
    /// Every receive buffer the worker has posted, on the SRQ or a QP's own queue.
    pub(crate) recv: RecvBuffers,
    /// Each QP's own receive queue's level (`None`: it receives through the SRQ).
    pub(crate) rq_levels: Vec<Option<Level>>,
    /// The QPs with a receive queue of their own (the refill loop's list).
    pub(crate) rq_qps: Vec<u16>,
    pub(crate) batches: Vec<SendBatch<P::Qp>>,
    pub(crate) qp_params: Vec<QpParams>,
    pub(crate) qp_nums: Vec<u32>,
    /// Bytes in front of the payload of each QP's receives (UD: the 40-byte GRH area).
    pub(crate) qp_rx_off: Vec<u16>,
    /// Address handles of UD destinations, kept alive as long as the QPs sending to them.
    ahs: Vec<P::Ah>,
    /// Stage fed by each QP's receives.
    pub(crate) qp_stage: Vec<Option<u16>>,
    pub(crate) stages: Vec<StageSlot>,
    /// Sources, each with the QPs its messages can reach (its back-pressure set).
    pub(crate) sources: Vec<(u16, Vec<u16>, bool)>,
    /// Input QP of each stage (for handlers that reply).
    pub(crate) stage_input: Vec<Option<u16>>,
    /// Queue entries one received message can create at most (sum of stage outputs).
    pub(crate) fan: usize,
    /// The receive budget of a loop that starts with the local queue empty (most loops):
    /// computed once here, so the loop divides by `fan` only when the queue holds messages.
    pub(crate) empty_budget: usize,
    pub(crate) pool: BufferPool,
    pub(crate) cache: PoolCache,
    pub(crate) queue: LocalQueue,
    pub(crate) wc: Vec<WorkCompletion>,
    pub(crate) idle: Idle,
    pub(crate) stats: WorkerStats,
    pub(crate) ctl: Arc<Control>,
    pub(crate) clock: Clock,
    pub(crate) lkey: u32,
    pub(crate) loops: u64,
    pub(crate) max_msg: u32,
}

impl<P: Provider> Worker<P> {
    /// Creates the worker's CQs and SRQ on `pd` and fills the SRQ from `pool` (registered with
    /// `lkey`).
    pub fn new(
        params: WorkerParams,
        ctx: Arc<P::Context>,
        pd: &P::Pd,
        pool: BufferPool,
        lkey: u32,
        ctl: Arc<Control>,
        clock: Clock,
    ) -> Result<Worker<P>> {
        let p = &params;
        if p.recv_buffer_size as usize > pool.buf_size() {
            return Err(Error::new(
                Errno::EINVAL,
                format!(
                    "worker {}: recv_buffer_size {} is larger than the pool's buffers ({} bytes)",
                    p.name,
                    p.recv_buffer_size,
                    pool.buf_size()
                ),
            ));
        }
        let scq = ctx.create_cq(p.cq_depth)?;
        // Sender-side delivery into the receive CQ (`Context::create_cq_sender_side`): a
        // worker's peers are usually workers too, each as busy sending as receiving, and
        // handing this worker their delivery work made the echo pipeline slower. A streaming
        // peer outside the runtime then does the delivery itself, as it does for SRQ targets.
        // (Only a QP with a receive queue of its own could take the other way on `shm`.)
        let rcq = ctx.create_cq_sender_side(p.cq_depth)?;
        let srq = pd.create_srq(&SrqAttr { max_wr: p.srq_depth, max_sge: 1, srq_limit: 0 })?;
        let cache = pool.cache(p.cache_size as usize);
        let stats = WorkerStats::new();
        // Filled when the first QP that receives through it is added (`add_qp`).
        let mut srq = Replenisher::new(srq, p.srq_depth, p.srq_low_watermark);
        srq.set_top_up(top_up_batch(&cache));
        let recv = RecvBuffers::new(p.recv_buffer_size, lkey, &pool, p.srq_depth);
        let burst = p.poll_burst.max(1) as usize;
        Ok(Worker {
            idle: Idle::new(p.idle, p.spin_count, p.keep_warm),
            wc: vec![WorkCompletion::default(); burst],
            queue: LocalQueue::new(0),
            max_msg: pool.buf_size() as u32,
            params,
            ctx,
            scq,
            scq_awaited: true,
            rcq,
            srq,
            recv,
            rq_levels: Vec::new(),
            rq_qps: Vec::new(),
            batches: Vec::new(),
            qp_params: Vec::new(),
            qp_nums: Vec::new(),
            qp_rx_off: Vec::new(),
            ahs: Vec::new(),
            qp_stage: Vec::new(),
            stages: Vec::new(),
            sources: Vec::new(),
            stage_input: Vec::new(),
            fan: 1,
            empty_budget: 0,
            pool,
            cache,
            stats,
            ctl,
            clock,
            lkey,
            loops: 0,
        })
    }

    /// The worker's name.
    pub fn name(&self) -> &str {
        &self.params.name
    }

    /// The worker's live counters. (A handle taken before [`move_stats`](Self::move_stats)
    /// keeps showing the old block.)
    pub fn stats(&self) -> WorkerStats {
        self.stats.clone()
    }

    /// QP `i`'s counters (shared: they keep counting while the worker runs).
    pub fn qp_stats(&self, i: usize) -> stats::QpStats {
        self.batches[i].stats.clone()
    }

    /// The worker's counter blocks by name, for an exporter to lay out its memory.
    pub fn stats_shape(&self) -> StatsShape {
        StatsShape {
            name: self.params.name.clone(),
            core: self.params.core,
            qps: self.qp_params.iter().map(|q| q.name.clone()).collect(),
            stages: self
                .stages
                .iter()
                .map(|s| StageShape {
                    name: s.name.clone(),
                    kind: s.kind.clone(),
                    latency: s.handler.records_latency(),
                })
                .collect(),
        }
    }

    /// Moves every counter block to `to` (e.g. into a shared-memory segment), carrying the
    /// current values over, and gives the latency-recording stages their histograms. Call it
    /// after the QPs and stages are added and before [`run`](Self::run); `to` must match
    /// [`stats_shape`](Self::stats_shape) (else `EINVAL`).
    pub fn move_stats(&mut self, to: WorkerSlots) -> Result<()> {
        let n = self.stages.len();
        if to.qps.len() != self.batches.len() || to.stages.len() != n || to.latency.len() != n {
            return Err(Error::new(
                Errno::EINVAL,
                format!(
                    "worker {}: {} QP and {} stage slots for {} QPs and {} stages",
                    self.params.name,
                    to.qps.len(),
                    to.stages.len(),
                    self.batches.len(),
                    n
                ),
            ));
        }
        to.worker.copy_from(&self.stats);
        self.stats = to.worker;
        for (b, slot) in self.batches.iter_mut().zip(to.qps) {
            slot.copy_from(&b.stats);
            b.stats = slot;
        }
        for ((st, slot), lat) in self.stages.iter_mut().zip(to.stages).zip(to.latency) {
            slot.copy_from(&st.stats);
            st.stats = slot;
            st.latency = lat.filter(|_| st.handler.records_latency());
        }
        Ok(())
    }

    /// Creates a QP on the worker's CQs, receiving through the SRQ or (`qp.recv_depth`) a
    /// receive queue of its own, which is filled here; returns its index. An RC QP is left in
    /// INIT until [`connect`](Self::connect_to); a UD QP is brought to RTS at once (it
    /// receives from anyone) and gets its destination from [`connect_to`](Self::connect_to);
    /// a RAW_PACKET QP is brought to RTS on port `qp.port` with one steering rule that
    /// matches every frame (it receives all of its port's traffic; its sends are whole
    /// frames).
    pub fn add_qp(&mut self, pd: &P::Pd, qp: QpParams) -> Result<usize> {
        if !matches!(qp.transport, QpType::Rc | QpType::Ud | QpType::RawPacket) {
            return Err(Error::new(
                Errno::EINVAL,
                format!("qp {}: the runtime uses RC, UD and RAW_PACKET QPs only", qp.name),
            ));
        }
        if qp.recv_depth == Some(0) {
            return Err(Error::new(
                Errno::EINVAL,
                format!("qp {}: a receive queue of its own needs recv_depth >= 1", qp.name),
            ));
        }
        let cap = QpCaps {
            max_send_wr: qp.send_depth,
            max_recv_wr: qp.recv_depth.unwrap_or(0),
            max_recv_sge: u32::from(qp.recv_depth.is_some()),
            max_inline_data: qp.max_inline,
            ..Default::default()
        };
        let attr = QpInitAttr::<P> {
            send_cq: &self.scq,
            recv_cq: &self.rcq,
            srq: if qp.recv_depth.is_some() { None } else { Some(&self.srq.srq) },
            cap,
            qp_type: qp.transport,
            sq_sig_all: false,
        };
        let mut q = pd.create_qp(&attr)?;
        // UD is ready at once (its destination travels with each send); RC waits in INIT for
        // its peer ([`Self::connect_to`]).
        let ud = qp.transport == QpType::Ud;
        let opts = ConnectOpts { qkey: UD_QKEY, port_num: qp.port.max(1), ..Default::default() };
        match qp.transport {
            QpType::Ud => q.ready(&opts)?,
            QpType::RawPacket => {
                q.ready(&opts)?;
                q.create_flow(&crate::verbs::FlowSpec::default())?;
            }
            _ => q.bring_up_to_init(&opts)?,
        }
        let depth = q.caps().max_send_wr.min(qp.send_depth).max(1);
        // Receive buffers, before any peer can send: the QP's own queue (RC waits in INIT,
        // where posting receives is allowed), or the SRQ if it is the first QP using it.
        let level = match qp.recv_depth {
            Some(n) => {
                let mut level = Level::new(n, n / 2);
                level.set_top_up(top_up_batch(&self.cache));
                self.recv.reserve(n);
                self.recv
                    .refill(&mut level, &mut self.cache, &self.stats, |a, len, lkey, c| {
                        q.post_recv_buffers(a, len, lkey, c)
                    })
                    .map_err(|e| Error::new(e.errno, format!("qp {}: posting its receive buffers: {e}", qp.name)))?;
                self.rq_qps.push(self.batches.len() as u16);
                Some(level)
            }
            None => {
                self.srq.activate(&mut self.recv, &mut self.cache, &self.stats);
                None
            }
        };
        self.rq_levels.push(level);
        self.qp_nums.push(q.qp_num());
        self.qp_rx_off.push(if ud { GRH_LEN as u16 } else { 0 });
        self.qp_stage.push(None);
        let mut batch = SendBatch::new(q, depth, self.params.doorbell_batch, qp.signal_interval, self.lkey);
        batch.set_max_inline(qp.max_inline);
        self.batches.push(batch);
        self.qp_params.push(qp);
        Ok(self.batches.len() - 1)
    }

    /// QP number of QP `i`.
    pub fn qp_num(&self, i: usize) -> u32 {
        self.qp_nums[i]
    }

    /// QP `i`'s identity for the out-of-band exchange, with GID `gid_index` of its port.
    pub fn endpoint(&self, i: usize, gid_index: u8) -> Result<Endpoint> {
        self.batches[i].qp.endpoint(gid_index)
    }

    /// Joins UD QP `i` to the multicast group `gid` ([`Qp::attach_mcast`] with MLID 0, as
    /// on RoCE, where the MLID is unused).
    pub fn attach_mcast(&mut self, i: usize, gid: &[u8; 16]) -> Result<()> {
        self.batches[i].qp.attach_mcast(gid, 0)
    }

    /// Connects RC QP `i` to QP `dest_qpn` of the same shm fabric (INIT → RTR → RTS), with
    /// no route: enough for `shm`, where QP numbers are fabric-wide. On `rdma` use
    /// [`connect_to`](Self::connect_to) with the peer's GID.
    pub fn connect(&mut self, i: usize, dest_qpn: u32) -> Result<()> {
        self.connect_rc(i, &PeerAddr { qpn: dest_qpn, psn: 0, ah: AhAttr { port_num: 1, ..Default::default() } })
    }

    /// Connects QP `i` to `peer`: RC goes INIT → RTR (with the peer's QPN, PSN and route, at
    /// the port's active MTU) → RTS; UD gets an address handle created on `pd` from the route,
    /// and sends every message to the peer's QPN with [`UD_QKEY`].
    pub fn connect_to(&mut self, pd: &P::Pd, i: usize, peer: &PeerAddr) -> Result<()> {
        if self.qp_params[i].transport == QpType::Ud {
            let ah = pd.create_ah(&peer.ah)?;
            let dest = UdDest { ah: crate::provider::Ah::handle(&ah), remote_qpn: peer.qpn, remote_qkey: UD_QKEY };
            self.ahs.push(ah);
            self.batches[i].set_dest(dest);
            return Ok(());
        }
        self.connect_rc(i, peer)
    }

    fn connect_rc(&mut self, i: usize, peer: &PeerAddr) -> Result<()> {
        let p = &self.qp_params[i];
        let port = if peer.ah.port_num == 0 { 1 } else { peer.ah.port_num };
        let opts = ConnectOpts {
            port_num: port,
            path_mtu: self.ctx.port_attr(port)?.active_mtu,
            min_rnr_timer: p.min_rnr_timer,
            rnr_retry: p.rnr_retry,
            retry_cnt: p.retry_cnt,
            timeout: p.timeout,
            ..Default::default()
        };
        self.batches[i].qp.connect(peer, &opts)
    }

    /// Adds a stage; `input_qp` binds a QP's receives to it. Returns its index.
    pub fn add_stage(
        &mut self,
        name: &str,
        kind: &str,
        handler: Box<dyn Handler>,
        outputs: Vec<Target>,
        input_qp: Option<usize>,
    ) -> usize {
        let idx = self.stages.len();
        if let Some(q) = input_qp {
            self.qp_stage[q] = Some(idx as u16);
        }
        self.stage_input.push(input_qp.map(|q| q as u16));
        self.stages.push(StageSlot {
            name: name.into(),
            kind: kind.into(),
            handler,
            outputs,
            stats: StageStats::new(),
            latency: None,
        });
        self.compute_reach();
        // Sized for a burst fanned out to every output of every stage.
        let outs: usize = self.stages.iter().map(|s| s.outputs.len().max(1)).sum();
        let cap = (self.params.poll_burst.max(1) as usize + 1) * outs * 2 + 64;
        self.fan = outs;
        self.queue = LocalQueue::new(cap);
        self.empty_budget = self.receive_budget();
        idx
    }

    /// QPs reachable from stage `s` (its outputs, transitively; its input QP if it replies).
    fn reach(&self, s: usize, seen: &mut Vec<bool>, out: &mut Vec<u16>) {
        if seen[s] {
            return;
        }
        seen[s] = true;
        let st = &self.stages[s];
        if st.handler.replies() {
            if let Some(q) = self.stage_input[s] {
                if !out.contains(&q) {
                    out.push(q);
                }
            }
        }
        for t in &st.outputs {
            match *t {
                Target::Qp(q) => {
                    if !out.contains(&q) {
                        out.push(q);
                    }
                }
                Target::Stage(t) if (t as usize) < self.stages.len() => self.reach(t as usize, seen, out),
                Target::Stage(_) => {}
            }
        }
    }

    /// Recomputes the back-pressure sets (setup only).
    fn compute_reach(&mut self) {
        let n = self.stages.len();
        self.sources.clear();
        for s in 0..n {
            if !self.stages[s].handler.is_source() {
                continue;
            }
            let mut out = Vec::new();
            self.reach(s, &mut vec![false; n], &mut out);
            if self.stages[s].handler.is_source() {
                self.sources.push((s as u16, out, false));
            }
        }
    }

    /// Runs the worker on the current thread: pins it, loops until [`Control::stop`], tears
    /// down, returns the report. A failed pin stops the whole pipeline and is an error.
    pub fn run(mut self) -> Result<WorkerReport> {
        if let Some(core) = self.params.core {
            // core_affinity panics for ids beyond the CPU set: check the id is allowed first.
            let allowed = core_affinity::get_core_ids().unwrap_or_default();
            let why = if !allowed.iter().any(|c| c.id == core) {
                let list: Vec<String> = allowed.iter().map(|c| c.id.to_string()).collect();
                Some(format!("core {core} is not available to this process (allowed: {})", list.join(",")))
            } else if !core_affinity::set_for_current(core_affinity::CoreId { id: core }) {
                Some(format!("sched_setaffinity to core {core} failed"))
            } else {
                None
            };
            if let Some(why) = why {
                self.ctl.stop.store(true, Ordering::Release);
                self.teardown();
                return Err(Error::new(
                    Errno::EINVAL,
                    format!("worker {}: cannot pin the thread: {why}", self.params.name),
                ));
            }
        }
        let started = self
            .stages
            .iter_mut()
            .try_for_each(|st| st.handler.start().map_err(|why| format!("stage {}: {why}", st.name)));
        if let Err(why) = started {
            self.ctl.stop.store(true, Ordering::Release);
            self.teardown();
            return Err(Error::new(Errno::EINVAL, format!("worker {}: {why}", self.params.name)));
        }
        self.ctl.wait_for_start();
        while !self.ctl.stop.load(Ordering::Acquire) {
            for _ in 0..64 {
                self.step();
            }
        }
        self.teardown();
        for st in &mut self.stages {
            st.handler.finish();
        }
        Ok(self.report())
    }

    /// Moves every QP to ERROR, drains both CQs and returns every buffer the worker holds.
    pub fn teardown(&mut self) {
        for b in &mut self.batches {
            b.flush(&self.stats, &mut self.cache);
        }
        for b in &mut self.batches {
            let _ = b.qp.modify(&QpAttr { state: QpState::Error, ..Default::default() });
        }
        let mut quiet = 0;
        while quiet < 3 {
            let mut any = false;
            let n = self.scq.poll(&mut self.wc).unwrap_or(0);
            for wc in &self.wc[..n] {
                if let Some(i) = self.qp_nums.iter().position(|&q| q == wc.qp_num) {
                    self.batches[i].complete(wc, &self.stats, &mut self.cache);
                }
            }
            any |= n > 0;
            let n = self.rcq.poll(&mut self.wc).unwrap_or(0);
            for wc in &self.wc[..n] {
                if let Some(buf) = self.recv.take(wc.wr_id) {
                    let _ = self.cache.put(buf);
                }
            }
            any |= n > 0;
            quiet = if any { 0 } else { quiet + 1 };
        }
        for b in &mut self.batches {
            b.release_all(&mut self.cache);
        }
        self.recv.release_all(&mut self.cache);
        while let Some((_, m)) = self.queue.pop() {
            let _ = self.cache.put(m.buf);
        }
    }

    /// A snapshot of the counters and the stages' reports.
    pub fn report(&self) -> WorkerReport {
        let s: &WorkerCounters = &self.stats;
        WorkerReport {
            name: self.params.name.clone(),
            core: self.params.core,
            loops: s.loops.get(),
            busy_loops: s.busy_loops.get(),
            idle_loops: s.idle_loops.get(),
            rx_msgs: s.rx_msgs.get(),
            rx_bytes: s.rx_bytes.get(),
            tx_msgs: s.tx_msgs.get(),
            tx_bytes: s.tx_bytes.get(),
            doorbells: s.doorbells.get(),
            srq_refills: s.srq_refills.get(),
            srq_limit_events: s.srq_limit_events.get(),
            rnr: s.rnr.get(),
            errors: s.errors.get(),
            dropped: s.dropped.get(),
            qps: self
                .batches
                .iter()
                .zip(&self.qp_params)
                .map(|(b, p)| {
                    let c: &QpCounters = &b.stats;
                    QpReport {
                        name: p.name.clone(),
                        rx_msgs: c.rx_msgs.get(),
                        rx_bytes: c.rx_bytes.get(),
                        tx_msgs: c.tx_msgs.get(),
                        tx_bytes: c.tx_bytes.get(),
                        doorbells: c.doorbells.get(),
                        signaled: c.signaled.get(),
                        rnr: c.rnr.get(),
                        errors: c.errors.get(),
                    }
                })
                .collect(),
            stages: self
                .stages
                .iter()
                .map(|st| StageSummary {
                    name: st.name.clone(),
                    kind: st.kind.clone(),
                    msgs_in: st.stats.msgs_in.get(),
                    bytes_in: st.stats.bytes_in.get(),
                    msgs_out: st.stats.msgs_out.get(),
                    bytes_out: st.stats.bytes_out.get(),
                    dropped: st.stats.dropped.get(),
                    report: st.handler.report(),
                })
                .collect(),
        }
    }
}

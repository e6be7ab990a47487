//! The data model: one struct per TOML table, with documented defaults.
//!
//! Every struct denies unknown fields. Scalar fields are [`Located`], so validation can point
//! at the offending value; `Located<T>` dereferences to `T`, so consumers read `*w.core` or
//! `w.cq_depth.value`.

use crate::located::Located;
use crate::source::Source;
use crate::units::{ByteSize, HumanDuration, Rate};
use serde::Deserialize;

/// The documented default of every field, in one place.
pub mod defaults {
    use super::*;

    /// `provider.kind`.
    pub const PROVIDER_KIND: ProviderKind = ProviderKind::Shm;
    /// `provider.fabric`.
    pub const FABRIC: &str = "dataplane";
    /// `provider.fabric_size`: 64 MiB.
    pub const FABRIC_SIZE: ByteSize = ByteSize::mib(64);
    /// `provider.port`.
    pub const PORT: u8 = 1;
    /// `provider.gid_index`.
    pub const GID_INDEX: u8 = 0;

    /// `memory.hugepages`.
    pub const HUGEPAGES: HugepagePolicy = HugepagePolicy::Prefer;
    /// `memory.page_size`.
    pub const PAGE_SIZE: PageSize = PageSize::Huge2M;
    /// Name of the pool that exists when `[[memory.pools]]` is absent, and `workers[].pool`.
    pub const POOL: &str = "default";
    /// `memory.pools[].buffer_size`: 2 KiB.
    pub const POOL_BUFFER_SIZE: ByteSize = ByteSize::kib(2);
    /// `memory.pools[].count`.
    pub const POOL_COUNT: u32 = 16384;
    /// `memory.pools[].cache_size`.
    pub const POOL_CACHE_SIZE: u32 = 256;

    /// `workers[].idle`.
    pub const IDLE: IdlePolicy = IdlePolicy::Spin;
    /// `workers[].spin_count`.
    pub const SPIN_COUNT: u32 = 1000;
    /// `workers[].keep_warm`.
    pub const KEEP_WARM: u32 = 128;
    /// `workers[].cq_depth`.
    pub const CQ_DEPTH: u32 = 4096;
    /// `workers[].poll_burst`.
    pub const POLL_BURST: u32 = 32;
    /// `workers[].srq_depth`.
    pub const SRQ_DEPTH: u32 = 1024;
    /// `workers[].srq_low_watermark`.
    pub const SRQ_LOW_WATERMARK: u32 = 256;
    /// `workers[].recv_buffer_size`: 2 KiB.
    pub const RECV_BUFFER_SIZE: ByteSize = ByteSize::kib(2);
    /// `workers[].doorbell_batch`.
    pub const DOORBELL_BATCH: u32 = 16;
    /// `workers[].signal_interval`.
    pub const SIGNAL_INTERVAL: u32 = 16;

    /// `qps[].transport`.
    pub const TRANSPORT: Transport = Transport::Rc;
    /// `qps[].send_depth`.
    pub const SEND_DEPTH: u32 = 128;
    /// `qps[].recv_depth`.
    pub const RECV_DEPTH: u32 = 512;
    /// `qps[].max_inline`: 64 bytes.
    pub const MAX_INLINE: u32 = 64;
    /// `qps[].min_rnr_timer`: 12 = 0.64 ms (IB encoding).
    pub const MIN_RNR_TIMER: u8 = 12;
    /// `qps[].rnr_retry`: 7 = retry forever.
    pub const RNR_RETRY: u8 = 7;
    /// `qps[].retry_cnt`.
    pub const RETRY_CNT: u8 = 7;
    /// `qps[].timeout`: 14 = 4.096 us * 2^14, about 67 ms.
    pub const TIMEOUT: u8 = 14;
    /// `qps[].use_srq`.
    pub const USE_SRQ: bool = true;

    /// `stages[].rate` (source).
    pub const RATE: Rate = Rate::Max;
    /// `stages[].message_size` (source): 64 bytes.
    pub const MESSAGE_SIZE: ByteSize = ByteSize(64);
    /// `stages[].count` (source): 0 = no limit.
    pub const COUNT: u64 = 0;
    /// `stages[].duration` (source): 0 = no limit.
    pub const DURATION: HumanDuration = HumanDuration::secs(0);
    /// `stages[].verify_sequence` (sink).
    pub const VERIFY_SEQUENCE: bool = false;
    /// `stages[].histogram` (sink).
    pub const HISTOGRAM: bool = true;
}

/// Smallest message a source may send: an 8-byte sequence number and an 8-byte timestamp.
pub const MIN_MESSAGE_SIZE: u64 = 16;

/// Bytes a UD receive buffer needs in front of the payload for the Global Routing Header.
pub const UD_GRH_BYTES: u64 = 40;

/// Per-field serde default functions (private; the values live in [`defaults`]).
mod d {
    use super::defaults as v;
    use super::*;

    macro_rules! fns {
        ($($name:ident: $t:ty = $e:expr;)*) => {
            $(pub(super) fn $name() -> Located<$t> { Located::new($e) })*
        };
    }

    fns! {
        pool: String = v::POOL.to_owned();
        pool_buffer_size: ByteSize = v::POOL_BUFFER_SIZE;
        pool_count: u32 = v::POOL_COUNT;
        pool_cache_size: u32 = v::POOL_CACHE_SIZE;
        idle: IdlePolicy = v::IDLE;
        spin_count: u32 = v::SPIN_COUNT;
        keep_warm: u32 = v::KEEP_WARM;
        cq_depth: u32 = v::CQ_DEPTH;
        poll_burst: u32 = v::POLL_BURST;
        srq_depth: u32 = v::SRQ_DEPTH;
        srq_low_watermark: u32 = v::SRQ_LOW_WATERMARK;
        recv_buffer_size: ByteSize = v::RECV_BUFFER_SIZE;
        doorbell_batch: u32 = v::DOORBELL_BATCH;
        signal_interval: u32 = v::SIGNAL_INTERVAL;
        transport: Transport = v::TRANSPORT;
        send_depth: u32 = v::SEND_DEPTH;
        recv_depth: u32 = v::RECV_DEPTH;
        max_inline: u32 = v::MAX_INLINE;
        min_rnr_timer: u8 = v::MIN_RNR_TIMER;
        rnr_retry: u8 = v::RNR_RETRY;
        retry_cnt: u8 = v::RETRY_CNT;
        timeout: u8 = v::TIMEOUT;
        use_srq: bool = v::USE_SRQ;
        rate: Rate = v::RATE;
        message_size: ByteSize = v::MESSAGE_SIZE;
        count: u64 = v::COUNT;
        duration: HumanDuration = v::DURATION;
        verify_sequence: bool = v::VERIFY_SEQUENCE;
        histogram: bool = v::HISTOGRAM;
    }

    pub(super) fn pools() -> Vec<PoolConfig> {
        vec![PoolConfig::new(v::POOL)]
    }
}

/// A whole pipeline: the root of the TOML file.
///
/// ```toml
/// [provider]     # which verbs engine runs the pipeline
/// [memory]       # huge pages and buffer pools
/// [[workers]]    # pinned busy-poll threads, one per core
/// [[qps]]        # queue pairs, each owned by one worker
/// [[stages]]     # message handlers, each running on one worker
/// ```
///
/// QPs and stages are top-level arrays that name their worker, rather than tables nested
/// inside `[[workers]]`: stages and peers refer to QPs across workers by one flat name, and
/// TOML's nested arrays of tables (`[[workers.qps]]`) silently attach to whichever worker
/// came last, an easy mistake to make and a hard one to see.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The verbs provider. Default: `shm` with its defaults.
    #[serde(default)]
    pub provider: ProviderConfig,
    /// Huge pages and buffer pools. Default: prefer 2M huge pages, one pool `"default"`.
    #[serde(default)]
    pub memory: MemoryConfig,
    /// Worker threads. Default: none (validation requires at least one).
    #[serde(default)]
    pub workers: Vec<WorkerConfig>,
    /// Queue pairs. Default: none.
    #[serde(default)]
    pub qps: Vec<QpConfig>,
    /// Stages. Default: none (validation requires at least one).
    #[serde(default)]
    pub stages: Vec<StageConfig>,
    /// The file this configuration was read from (path and text), used to locate errors.
    /// Empty for configurations built in code.
    #[serde(skip)]
    pub source: Source,
}

/// Which verbs engine to use.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProviderKind {
    /// The software NIC over shared memory (threads and processes of one host).
    #[default]
    Shm,
    /// rdma-core's libibverbs: real NICs and Soft-RoCE.
    Rdma,
    /// AF_XDP on Linux interfaces: RAW_PACKET QPs only (packet pipelines).
    Xdp,
}

impl ProviderKind {
    /// The TOML spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            ProviderKind::Shm => "shm",
            ProviderKind::Rdma => "rdma",
            ProviderKind::Xdp => "xdp",
        }
    }
}

/// `[provider]`: the verbs engine and its settings.
///
/// Fields belong to one kind: `fabric` and `fabric_size` to `shm`, `device`, `port` and
/// `gid_index` to `rdma`, `interfaces` to `xdp`. Setting a field of the other kind is an error, so a pipeline never
/// silently ignores what its author wrote.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProviderConfig {
    /// `"shm"`, `"rdma"` or `"xdp"`. Default: `"shm"`.
    pub kind: Located<ProviderKind>,
    /// shm: name of the shared fabric; processes that use the same name share one software
    /// NIC, different names run side by side. Letters, digits, `-`, `_`, `.`.
    /// Default: `"dataplane"`.
    pub fabric: Located<String>,
    /// shm: size of the fabric's shared segment (queue rings, completion queues).
    /// At least 1M. Default: `"64M"`.
    pub fabric_size: Located<ByteSize>,
    /// rdma: device name as `ibv_devices` prints it (`mlx5_0`, `rxe0`).
    /// Default: absent, meaning the first device found.
    pub device: Option<Located<String>>,
    /// rdma: port number, from 1. Default: `1`.
    pub port: Located<u8>,
    /// rdma: GID table index (RoCE v2 is often 1 or 3; `show_gids` lists them). Default: `0`.
    pub gid_index: Located<u8>,
    /// xdp: the Linux interfaces (queue 0 of each) that are the device's ports 1, 2, ...;
    /// a raw_packet QP picks one with its `port`. Required for xdp.
    pub interfaces: Option<Located<Vec<String>>>,
}

impl Default for ProviderConfig {
    fn default() -> Self {
        ProviderConfig {
            kind: Located::new(defaults::PROVIDER_KIND),
            fabric: Located::new(defaults::FABRIC.to_owned()),
            fabric_size: Located::new(defaults::FABRIC_SIZE),
            device: None,
            port: Located::new(defaults::PORT),
            gid_index: Located::new(defaults::GID_INDEX),
            interfaces: None,
        }
    }
}

/// Whether memory must, may, or must not come from huge pages.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HugepagePolicy {
    /// Huge pages or fail at start (and in validation, when too few are free).
    Require,
    /// Huge pages when available, else base pages with one warning.
    #[default]
    Prefer,
    /// Base pages only.
    Never,
}

impl HugepagePolicy {
    /// The TOML spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            HugepagePolicy::Require => "require",
            HugepagePolicy::Prefer => "prefer",
            HugepagePolicy::Never => "never",
        }
    }
}

/// A huge page size.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Deserialize)]
pub enum PageSize {
    /// 2 MiB pages, written `"2M"`.
    #[default]
    #[serde(rename = "2M")]
    Huge2M,
    /// 1 GiB pages, written `"1G"`.
    #[serde(rename = "1G")]
    Huge1G,
}

impl PageSize {
    /// Size in bytes.
    pub fn bytes(self) -> u64 {
        match self {
            PageSize::Huge2M => 2 << 20,
            PageSize::Huge1G => 1 << 30,
        }
    }

    /// The TOML spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            PageSize::Huge2M => "2M",
            PageSize::Huge1G => "1G",
        }
    }

    /// The sysfs directory with this size's counters.
    pub fn sysfs_dir(self) -> &'static str {
        match self {
            PageSize::Huge2M => "/sys/kernel/mm/hugepages/hugepages-2048kB",
            PageSize::Huge1G => "/sys/kernel/mm/hugepages/hugepages-1048576kB",
        }
    }
}

/// `[memory]`: huge pages and buffer pools.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MemoryConfig {
    /// `"require"`, `"prefer"` or `"never"`. Default: `"prefer"`.
    pub hugepages: Located<HugepagePolicy>,
    /// `"2M"` or `"1G"`; unused with `hugepages = "never"`. Default: `"2M"`.
    pub page_size: Located<PageSize>,
    /// Buffer pools (`[[memory.pools]]`). Default: one pool named `"default"` with the pool
    /// defaults; writing any `[[memory.pools]]` replaces it.
    pub pools: Vec<PoolConfig>,
}

impl Default for MemoryConfig {
    fn default() -> Self {
        MemoryConfig {
            hugepages: Located::new(defaults::HUGEPAGES),
            page_size: Located::new(defaults::PAGE_SIZE),
            pools: d::pools(),
        }
    }
}

/// `[[memory.pools]]`: a pool of fixed-size message buffers in one registered region.
///
/// Workers take their receive buffers (SRQ and plain RQs) and send buffers from the pool they
/// name in `workers[].pool`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolConfig {
    /// Pool name, unique among pools. Required.
    pub name: Located<String>,
    /// Size of each buffer. Default: `"2K"`.
    #[serde(default = "d::pool_buffer_size")]
    pub buffer_size: Located<ByteSize>,
    /// Number of buffers. Must cover every worker using the pool (see validation).
    /// Default: `16384`.
    #[serde(default = "d::pool_count")]
    pub count: Located<u32>,
    /// Buffers each worker keeps in its private cache (DPDK mempool style), at most `count`.
    /// Default: `256`.
    #[serde(default = "d::pool_cache_size")]
    pub cache_size: Located<u32>,
}

impl PoolConfig {
    /// A pool with this name and the defaults.
    pub fn new(name: &str) -> Self {
        PoolConfig {
            name: name.into(),
            buffer_size: d::pool_buffer_size(),
            count: d::pool_count(),
            cache_size: d::pool_cache_size(),
        }
    }

    /// Bytes of buffer memory: `buffer_size * count`.
    pub fn bytes(&self) -> u64 {
        self.buffer_size.bytes().saturating_mul(u64::from(*self.count))
    }
}

/// What a worker does when a poll finds nothing (Aeron's idle strategies).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum IdlePolicy {
    /// Busy-poll without pause: lowest latency, one core at 100%.
    #[default]
    Spin,
    /// Spin for `spin_count` empty polls, then execute a CPU pause between polls.
    SpinThenPause,
    /// Spin for `spin_count` empty polls, then back off exponentially (crossbeam `Backoff`),
    /// trading tail latency for CPU.
    Backoff,
}

impl IdlePolicy {
    /// The TOML spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            IdlePolicy::Spin => "spin",
            IdlePolicy::SpinThenPause => "spin-then-pause",
            IdlePolicy::Backoff => "backoff",
        }
    }
}

/// `[[workers]]`: a thread pinned to one core that owns its QPs, one CQ, one SRQ and a cache
/// of its pool, and runs its stages in a busy-poll loop.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerConfig {
    /// Worker name, unique among workers; QPs and stages refer to it. Required.
    pub name: Located<String>,
    /// CPU core to pin to; must exist and be used by no other worker. Required.
    pub core: Located<usize>,
    /// Buffer pool for receive and send buffers. Default: `"default"`.
    #[serde(default = "d::pool")]
    pub pool: Located<String>,
    /// `"spin"`, `"spin-then-pause"` or `"backoff"`. Default: `"spin"`.
    #[serde(default = "d::idle")]
    pub idle: Located<IdlePolicy>,
    /// Empty polls before `spin-then-pause` pauses or `backoff` backs off; unused by `spin`.
    /// Default: `1000`.
    #[serde(default = "d::spin_count")]
    pub spin_count: Located<u32>,
    /// Empty polls between two warm passes: dry runs of a send on each of the worker's QPs,
    /// which keep the post path's code and memory in the core's caches while messages are
    /// sparse (a message arriving during a pass waits for its end, a few tens of ns); `0`
    /// turns them off. Only the `shm` provider has a dry run; on the others a pass does
    /// nothing. Default: `128`.
    #[serde(default = "d::keep_warm")]
    pub keep_warm: Located<u32>,
    /// Entries of the worker's completion queue, shared by all its QPs and its SRQ. Must hold
    /// every completion that can be outstanding (see validation). Default: `4096`.
    #[serde(default = "d::cq_depth")]
    pub cq_depth: Located<u32>,
    /// Completions taken per `poll_cq` call, 1 to `cq_depth`. Default: `32`.
    #[serde(default = "d::poll_burst")]
    pub poll_burst: Located<u32>,
    /// Receive buffers posted to the worker's shared receive queue (used by QPs with
    /// `use_srq = true`). Default: `1024`.
    #[serde(default = "d::srq_depth")]
    pub srq_depth: Located<u32>,
    /// Refill threshold: when fewer than this many buffers remain posted on the SRQ, the
    /// worker refills it to `srq_depth` with one chained post. Below `srq_depth`.
    /// Default: `256`.
    #[serde(default = "d::srq_low_watermark")]
    pub srq_low_watermark: Located<u32>,
    /// Bytes of each posted receive buffer (SRQ and plain receive queues); at most the
    /// pool's `buffer_size`. UD receives need 40 bytes more than the message for the GRH.
    /// Default: `"2K"`.
    #[serde(default = "d::recv_buffer_size")]
    pub recv_buffer_size: Located<ByteSize>,
    /// Doorbell batching: send WRs collected per QP before one doorbell rings (a loop also
    /// rings at its end). At most every owned QP's `send_depth`. Default: `16`.
    #[serde(default = "d::doorbell_batch")]
    pub doorbell_batch: Located<u32>,
    /// Selective signaling: one send in this many asks for a completion; QPs inherit it
    /// unless they set their own. `send_depth` must be at least twice it. Default: `16`.
    #[serde(default = "d::signal_interval")]
    pub signal_interval: Located<u32>,
}

impl WorkerConfig {
    /// A worker with this name and core and the defaults.
    pub fn new(name: &str, core: usize) -> Self {
        WorkerConfig {
            name: name.into(),
            core: Located::new(core),
            pool: d::pool(),
            idle: d::idle(),
            spin_count: d::spin_count(),
            keep_warm: d::keep_warm(),
            cq_depth: d::cq_depth(),
            poll_burst: d::poll_burst(),
            srq_depth: d::srq_depth(),
            srq_low_watermark: d::srq_low_watermark(),
            recv_buffer_size: d::recv_buffer_size(),
            doorbell_batch: d::doorbell_batch(),
            signal_interval: d::signal_interval(),
        }
    }
}

/// QP transport type.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    /// Reliable connected: ordered, acknowledged, one peer.
    #[default]
    Rc,
    /// Unreliable datagram: messages up to the path MTU, any peer.
    Ud,
    /// Whole Ethernet frames on an interface (provider `xdp`) or on the shm fabric's software
    /// switch: no peer; every frame that arrives on the QP's port is received (one catch-all
    /// steering rule), and what a stage sends on it goes out as a frame.
    #[serde(rename = "raw_packet")]
    RawPacket,
}

impl Transport {
    /// The TOML spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Transport::Rc => "rc",
            Transport::Ud => "ud",
            Transport::RawPacket => "raw_packet",
        }
    }
}

/// Where a QP's peer is.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Peer<'a> {
    /// A QP of this pipeline (in-process or same-fabric loopback), by name.
    Local(&'a str),
    /// A remote process, reached for the out-of-band QP exchange at `host:port` over TCP.
    Remote {
        /// Host name or address (IPv6 without brackets).
        host: &'a str,
        /// TCP port.
        port: u16,
    },
    /// UD only: a multicast group (an IPv6 address in `ff00::/8`, e.g. `"ff0e::1:1"`); every
    /// message goes to the group's members (remote QPN 0xFFFFFF), one copy each.
    Group([u8; 16]),
}

/// `[[qps]]`: a queue pair owned by one worker, connected to a peer.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QpConfig {
    /// QP name, unique among QPs and stages (they share the endpoint namespace). Required.
    pub name: Located<String>,
    /// Owning worker: the only thread that posts to and polls this QP. Required.
    pub worker: Located<String>,
    /// `"rc"`, `"ud"` or `"raw_packet"` (providers `xdp`, which has no other, and `shm`, whose
    /// software switch carries frames between the fabric's raw QPs). Default: `"rc"`.
    #[serde(default = "d::transport")]
    pub transport: Located<Transport>,
    /// Send queue entries. At least `doorbell_batch` and twice the signal interval.
    /// Default: `128`.
    #[serde(default = "d::send_depth")]
    pub send_depth: Located<u32>,
    /// Receive queue entries, used only when `use_srq = false`. Default: `512`.
    #[serde(default = "d::recv_depth")]
    pub recv_depth: Located<u32>,
    /// Largest payload sent inline in the WQE (no DMA read); clamped to the device's
    /// capability at start. 0 disables inlining. Default: `64`.
    #[serde(default = "d::max_inline")]
    pub max_inline: Located<u32>,
    /// Selective signaling interval for this QP. Default: absent, meaning the owning worker's
    /// `signal_interval`.
    #[serde(default)]
    pub signal_interval: Option<Located<u32>>,
    /// RC: minimum RNR NAK timer, IB encoding 0-31 (0 = 655.36 ms, 1 = 0.01 ms,
    /// 12 = 0.64 ms, 31 = 491.52 ms). Default: `12`.
    #[serde(default = "d::min_rnr_timer")]
    pub min_rnr_timer: Located<u8>,
    /// RC: retries after "receiver not ready", 0-7, 7 = retry forever. Default: `7`.
    #[serde(default = "d::rnr_retry")]
    pub rnr_retry: Located<u8>,
    /// RC: retries after a transport timeout, 0-7. Default: `7`.
    #[serde(default = "d::retry_cnt")]
    pub retry_cnt: Located<u8>,
    /// RC: local ACK timeout, 4.096 us * 2^timeout, 0-31 (0 = wait forever).
    /// Default: `14` (about 67 ms).
    #[serde(default = "d::timeout")]
    pub timeout: Located<u8>,
    /// The peer: the name of another QP of this pipeline (loopback, in-process or over the
    /// same fabric), or `"host:port"` of the remote side's out-of-band TCP exchange
    /// (`"[::1]:7000"` for IPv6; its QP has `listen` on that address; the connection is
    /// retried for 30 s). An RC QP needs a peer or `listen` (a local peer is symmetric: the
    /// named QP must name this one back); for UD it is the destination of every send, and may
    /// be a multicast group written as an IPv6 address in `ff00::/8` (`peer = "ff0e::1:1"`):
    /// every message then reaches each QP that joined the group (`mcast`).
    /// Default: absent.
    #[serde(default)]
    pub peer: Option<Located<String>>,
    /// `"host:port"` to listen on for the remote side's out-of-band TCP exchange
    /// (`"0.0.0.0:7000"`, `"[::]:7000"`): the QP waits for one connection there and learns its
    /// peer from it. The other side names this address in its `peer`. QPs of one file that
    /// listen on the same address share one connection and are matched with the remote QPs
    /// naming that address in file order. Exclusive with `peer`; an RC QP needs one of the two.
    /// Default: absent.
    #[serde(default)]
    pub listen: Option<Located<String>>,
    /// Receive through the owning worker's SRQ instead of a private receive queue of
    /// `recv_depth` buffers, which the worker posts and refills itself. A queue of its own
    /// keeps one QP's traffic from taking the buffers of the others, and with one or two QPs
    /// per worker it is a little faster on `shm` (the echo pipeline at 100k msg/s: round-trip
    /// p50 0.92-0.96x of the SRQ's). Default: `true`.
    #[serde(default = "d::use_srq")]
    pub use_srq: Located<bool>,
    /// UD only: the multicast group this QP joins (`ibv_attach_mcast`) once it is created,
    /// written as an IPv6 address in `ff00::/8`, e.g. `"ff0e::1:1"`: every message sent to
    /// the group then lands in this QP's receive queue too. Default: absent.
    #[serde(default)]
    pub mcast: Option<Located<String>>,
    /// raw_packet only: the device port (1-based: the position in `provider.interfaces`)
    /// the QP sends and receives on. Default: absent, meaning port 1.
    #[serde(default)]
    pub port: Option<Located<u8>>,
}

/// Parses a multicast group written as an IPv6 address in `ff00::/8` (`"ff0e::1:1"`) into
/// its GID bytes; the error says what is wrong with it.
pub fn parse_mcast_group(text: &str) -> Result<[u8; 16], String> {
    let addr: std::net::Ipv6Addr = text.parse().map_err(|_| format!("`{text}` is not an IPv6 address"))?;
    if !addr.is_multicast() {
        return Err(format!("`{text}` is not a multicast address (ff00::/8)"));
    }
    Ok(addr.octets())
}

impl QpConfig {
    /// A QP with this name and worker and the defaults (no peer).
    pub fn new(name: &str, worker: &str) -> Self {
        QpConfig {
            name: name.into(),
            worker: worker.into(),
            transport: d::transport(),
            send_depth: d::send_depth(),
            recv_depth: d::recv_depth(),
            max_inline: d::max_inline(),
            signal_interval: None,
            min_rnr_timer: d::min_rnr_timer(),
            rnr_retry: d::rnr_retry(),
            retry_cnt: d::retry_cnt(),
            timeout: d::timeout(),
            peer: None,
            listen: None,
            use_srq: d::use_srq(),
            mcast: None,
            port: None,
        }
    }

    /// The multicast group's GID (the 16 bytes of the address in `mcast`), or `None` when
    /// absent or malformed (validation reports those).
    pub fn mcast_gid(&self) -> Option<[u8; 16]> {
        parse_mcast_group(self.mcast.as_ref()?.as_str()).ok()
    }

    /// The parsed `peer`, or `None` when absent or malformed (validation reports those).
    pub fn peer(&self) -> Option<Peer<'_>> {
        parse_peer(self.peer.as_ref()?.as_str()).ok()
    }

    /// The parsed `listen` address, or `None` when absent or malformed (validation reports
    /// those).
    pub fn listen_addr(&self) -> Option<(&str, u16)> {
        parse_listen(self.listen.as_ref()?.as_str()).ok()
    }

    /// The signal interval in effect: this QP's, else its worker's.
    pub fn effective_signal_interval(&self, worker: &WorkerConfig) -> u32 {
        self.signal_interval.as_ref().map_or(*worker.signal_interval, |s| **s)
    }
}

/// Parses a `peer` value: `"host:port"` (contains `:`) or a local QP name.
pub(crate) fn parse_peer(text: &str) -> Result<Peer<'_>, String> {
    // A bare IPv6 multicast address is a group, not "host:port" (it has colons too).
    if let Ok(addr) = text.parse::<std::net::Ipv6Addr>() {
        if addr.is_multicast() {
            return Ok(Peer::Group(addr.octets()));
        }
    }
    let Some((host, port)) = text.rsplit_once(':') else {
        return Ok(Peer::Local(text));
    };
    let host = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
    if host.is_empty() {
        return Err(format!("peer `{}` has no host", text.escape_debug()));
    }
    match port.parse::<u16>() {
        Ok(port) if port != 0 => Ok(Peer::Remote { host, port }),
        _ => Err(format!(
            "peer `{}` has an invalid port `{}` (expected 1-65535)",
            text.escape_debug(),
            port.escape_debug()
        )),
    }
}

/// Parses a `listen` value: `"host:port"`, `"[v6 address]:port"`, with a port 1-65535.
pub(crate) fn parse_listen(text: &str) -> Result<(&str, u16), String> {
    match parse_peer(text)? {
        Peer::Remote { host, port } => Ok((host, port)),
        Peer::Local(_) => Err(format!("listen address `{}` has no port", text.escape_debug())),
        Peer::Group(_) => Err(format!("listen address `{}` is a multicast group", text.escape_debug())),
    }
}

/// What a stage does with messages: one of the six built-in kinds, or a kind that the program
/// running the pipeline registered (a user stage, e.g. `kind = "book"`).
///
/// Any string parses; whether a [`StageKind::User`] kind exists is decided at validation,
/// against the kinds the program registered ([`crate::ValidationEnv::with_kinds`]), so that an
/// unknown kind is reported with the registered ones.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum StageKind {
    /// Sends every message back on the QP it came from. Needs `input` (a QP); no `output`.
    Echo,
    /// Passes every message to `output`. Needs `input` and `output`.
    Forward,
    /// Copies every message to each of `outputs`. Needs `input` and `outputs`.
    Fanout,
    /// Consumes messages, counting them, optionally checking sequence numbers and recording
    /// latencies. Needs `input`; no `output`.
    Sink,
    /// Generates timestamped, sequence-numbered messages at `rate`. Needs `output`; no
    /// `input`.
    Source,
    /// Stamps each message with the next sequence number and passes it to `output`. Needs
    /// `input` and `output`.
    Sequencer,
    /// A kind registered by the program (its endpoints follow the [`KindShape`] it was
    /// registered with; its parameters are the stage's `params` table).
    User(String),
}

impl StageKind {
    /// The built-in kinds, in the order they are listed to users.
    pub const BUILTIN: [StageKind; 6] = [
        StageKind::Echo,
        StageKind::Forward,
        StageKind::Fanout,
        StageKind::Sink,
        StageKind::Source,
        StageKind::Sequencer,
    ];

    /// The kind a TOML string names: a built-in, else a user kind.
    pub fn parse(name: &str) -> StageKind {
        StageKind::BUILTIN.into_iter().find(|k| k.as_str() == name).unwrap_or_else(|| StageKind::User(name.to_owned()))
    }

    /// The TOML spelling.
    pub fn as_str(&self) -> &str {
        match self {
            StageKind::Echo => "echo",
            StageKind::Forward => "forward",
            StageKind::Fanout => "fanout",
            StageKind::Sink => "sink",
            StageKind::Source => "source",
            StageKind::Sequencer => "sequencer",
            StageKind::User(name) => name,
        }
    }

    /// Whether this is one of the built-in kinds.
    pub fn is_builtin(&self) -> bool {
        !matches!(self, StageKind::User(_))
    }

    /// The endpoints a built-in kind takes (`None` for user kinds: their registration says).
    pub fn builtin_shape(&self) -> Option<KindShape> {
        Some(match self {
            StageKind::Echo => KindShape::sink(),
            StageKind::Forward | StageKind::Sequencer => KindShape::filter(),
            StageKind::Fanout => KindShape::filter().outputs(1, usize::MAX),
            StageKind::Sink => KindShape::sink(),
            StageKind::Source => KindShape::source(),
            StageKind::User(_) => return None,
        })
    }

    /// Whether this kind receives messages (needs `input`). User kinds: see their
    /// [`KindShape`].
    pub fn has_input(&self) -> bool {
        !matches!(self, StageKind::Source)
    }
}

impl<'de> Deserialize<'de> for StageKind {
    fn deserialize<D: serde::Deserializer<'de>>(de: D) -> Result<Self, D::Error> {
        let name = String::deserialize(de)?;
        if name.is_empty() {
            return Err(serde::de::Error::custom("invalid value: an empty stage kind, expected a kind name"));
        }
        Ok(StageKind::parse(&name))
    }
}

/// The endpoints a stage kind takes: whether it has an `input`, and how many outputs
/// (`output = "x"` counts as one, `outputs = [...]` as its length). Built-in kinds have fixed
/// shapes; a user kind declares its shape when it is registered, and validation checks every
/// stage of that kind against it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KindShape {
    /// The stage takes messages from an `input` (required); `false`: it generates them (a
    /// source: `input` is refused, and the stage is polled every loop).
    pub input: bool,
    /// Fewest outputs.
    pub min_outputs: usize,
    /// Most outputs (`usize::MAX`: no limit).
    pub max_outputs: usize,
}

impl KindShape {
    /// An input and exactly one output (a filter or transform).
    pub const fn filter() -> KindShape {
        KindShape { input: true, min_outputs: 1, max_outputs: 1 }
    }

    /// An input and no output (consumes messages, or replies on its input QP).
    pub const fn sink() -> KindShape {
        KindShape { input: true, min_outputs: 0, max_outputs: 0 }
    }

    /// No input, exactly one output (generates messages).
    pub const fn source() -> KindShape {
        KindShape { input: false, min_outputs: 1, max_outputs: 1 }
    }

    /// The same shape with between `min` and `max` outputs.
    pub const fn outputs(self, min: usize, max: usize) -> KindShape {
        KindShape { min_outputs: min, max_outputs: max, ..self }
    }
}

/// The `params` table of a stage, kept as the span it was read from: its contents are
/// deserialized into the registered kind's own type by [`crate::Config::stage_params`], which
/// re-reads that part of the file so that errors point at the exact key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ParamsTable;

impl<'de> Deserialize<'de> for ParamsTable {
    fn deserialize<D: serde::Deserializer<'de>>(de: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = ParamsTable;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a table")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<ParamsTable, A::Error> {
                while map.next_entry::<serde::de::IgnoredAny, serde::de::IgnoredAny>()?.is_some() {}
                Ok(ParamsTable)
            }
        }
        de.deserialize_map(V)
    }
}

/// `[[stages]]`: a message handler running on one worker.
///
/// Endpoints (`input`, `output`, `outputs`) name a QP or another stage. A QP endpoint must be
/// owned by the stage's worker; an input QP feeds exactly one stage. A link between two stages
/// is written on both ends: if stage `a` sends to stage `b`, then `b` has `input = "a"`. Stage
/// links must not form a cycle.
///
/// Kind-specific parameters (`rate`, `message_size`, `count`, `duration` for `source`;
/// `verify_sequence`, `histogram` for `sink`; `outputs` for `fanout`) are rejected on other
/// kinds.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StageConfig {
    /// Stage name, unique among QPs and stages. Required.
    pub name: Located<String>,
    /// Worker that runs this stage. Required.
    pub worker: Located<String>,
    /// `"echo"`, `"forward"`, `"fanout"`, `"sink"`, `"source"` or `"sequencer"`. Required.
    pub kind: Located<StageKind>,
    /// Where messages come from: a QP (its receive completions) or a stage. Required by every
    /// kind but `source`, which must not have one. Default: absent.
    #[serde(default)]
    pub input: Option<Located<String>>,
    /// Where messages go: a QP (posted as sends) or a stage. Required by `forward`,
    /// `sequencer` and `source`; rejected on `echo` (it replies on its input), `sink` and
    /// `fanout` (which uses `outputs`). Default: absent.
    #[serde(default)]
    pub output: Option<Located<String>>,
    /// fanout: the endpoints every message is copied to, at least one, no repeats.
    /// Default: `[]`.
    #[serde(default)]
    pub outputs: Located<Vec<Located<String>>>,
    /// source: messages per second, or `"max"`. Default: `"max"`.
    #[serde(default = "d::rate")]
    pub rate: Located<Rate>,
    /// source: bytes per message, at least 16 (sequence number and timestamp).
    /// Default: `64`.
    #[serde(default = "d::message_size")]
    pub message_size: Located<ByteSize>,
    /// source: stop after this many messages; 0 = no limit. Exclusive with `duration`.
    /// Default: `0`.
    #[serde(default = "d::count")]
    pub count: Located<u64>,
    /// source: stop after this long, e.g. `"10s"`; `"0s"` = no limit. Exclusive with `count`.
    /// Default: `"0s"`.
    #[serde(default = "d::duration")]
    pub duration: Located<HumanDuration>,
    /// sink: check that sequence numbers arrive in order without gaps, counting the gaps.
    /// Default: `false`.
    #[serde(default = "d::verify_sequence")]
    pub verify_sequence: Located<bool>,
    /// sink: record one-way latency from the source's timestamps in an HdrHistogram.
    /// Default: `true`.
    #[serde(default = "d::histogram")]
    pub histogram: Located<bool>,
    /// User kinds: the stage's parameters, a table deserialized into the type the kind was
    /// registered with (e.g. `params = { depth = 10 }`, or a `[stages.params]` table after the
    /// stage's `[[stages]]` header). Refused on built-in kinds, which take their parameters as
    /// fields. Default: absent (the kind's type is read from an empty table).
    #[serde(default)]
    pub params: Option<Located<ParamsTable>>,
}

impl StageConfig {
    /// A stage with this name, worker and kind, no endpoints, and the defaults.
    pub fn new(name: &str, worker: &str, kind: StageKind) -> Self {
        StageConfig {
            name: name.into(),
            worker: worker.into(),
            kind: Located::new(kind),
            input: None,
            output: None,
            outputs: Located::default(),
            rate: d::rate(),
            message_size: d::message_size(),
            count: d::count(),
            duration: d::duration(),
            verify_sequence: d::verify_sequence(),
            histogram: d::histogram(),
            params: None,
        }
    }

    /// Every endpoint this stage sends to: `output` and `outputs`.
    pub fn destinations(&self) -> impl Iterator<Item = &Located<String>> {
        self.output.iter().chain(self.outputs.iter())
    }
}

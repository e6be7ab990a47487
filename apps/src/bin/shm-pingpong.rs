//! `shm-pingpong`: two processes on one `shm` fabric. Measures the round trip of one message
//! (reported as half round trip, like perftest) and the message rate of a sender posting
//! chains of `--post-list` SENDs with one doorbell each.
//!
//! With no `--role`, it starts the server as a child process of itself, pinned to
//! `--peer-core`, and runs the client pinned to `--core`.
//!
//! Each side watches the other while it waits (see [`Peer`]): when the peer process dies, the
//! survivor says so in one sentence and exits 1 through its destructors, so the last one out
//! removes the fabric file.

use clap::Parser;
use dataplane::mem::HugePolicy;
use dataplane::shm::{Shm, ShmConfig, ShmContext};
use dataplane::verbs::*;
use dataplane::{Context, Cq, MemRegion, Mr, Pd, Provider, Qp, QpInitAttr};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Parser, Debug)]
#[command(about = "Two-process pingpong over the shm software NIC: latency and message rate")]
struct Args {
    /// Message size in bytes.
    #[arg(short = 's', long, default_value_t = 8)]
    size: u32,
    /// Round trips for the latency test.
    #[arg(short = 'n', long, default_value_t = 200_000)]
    iters: u64,
    /// Messages for the rate test.
    #[arg(short = 'm', long, default_value_t = 2_000_000)]
    messages: u64,
    /// SENDs per doorbell in the rate test (perftest's --post_list).
    #[arg(short = 'l', long = "post-list", default_value_t = 32)]
    post_list: u32,
    /// Core for this process (-1: do not pin).
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    core: i64,
    /// Core for the peer process (-1: do not pin).
    #[arg(long, default_value_t = 1, allow_negative_numbers = true)]
    peer_core: i64,
    /// Fabric name (default: pingpong-PID, PID being this process id).
    #[arg(long)]
    fabric: Option<String>,
    /// Huge pages for the fabric: require, prefer or never.
    #[arg(long, default_value = "prefer")]
    huge: String,
    #[arg(long, hide = true)]
    role: Option<String>,
    #[arg(long, hide = true)]
    peer_qpn: Option<u32>,
}

const RQ_DEPTH: u32 = 4096;
const SLOT: usize = 4096;

struct End {
    ctx: ShmContext,
    region: <Shm as Provider>::Region,
    mr: <Shm as Provider>::Mr,
    scq: <Shm as Provider>::Cq,
    rcq: <Shm as Provider>::Cq,
    qp: <Shm as Provider>::Qp,
    rchain: RecvChain,
}

/// An error sentence; returned up to `main`, so destructors run (they remove the fabric file).
type Res<T> = std::result::Result<T, String>;

/// `what: e` as an error.
fn fail<T>(what: &str, e: impl std::fmt::Display) -> Res<T> {
    Err(format!("{what}: {e}"))
}

/// Turns an error into `what: error`.
fn err_in<E: std::fmt::Display>(what: &'static str) -> impl Fn(E) -> String {
    move |e| format!("{what}: {e}")
}

/// How often a waiting side looks at its peer (a cold path: one clock read per 1024 empty
/// polls, one process check per period).
const PEER_CHECK: Duration = Duration::from_millis(100);

/// The other process, watched while waiting so a dead peer ends the wait instead of spinning
/// forever: the client watches its server child (`try_wait`, which also reaps it: a zombie's
/// pid would still look alive to the fabric), the server watches its parent (an orphan is
/// re-parented, so a changed parent pid means the client died).
enum Who {
    Server(Child),
    Client(u32),
}

/// A [`Who`] with the rate limit of its checks.
struct Peer {
    who: Who,
    spins: u32,
    next: Instant,
}

impl Peer {
    fn new(who: Who) -> Peer {
        Peer { who, spins: 0, next: Instant::now() + PEER_CHECK }
    }

    /// Called on every empty poll; an error once the peer process is gone.
    #[inline]
    fn idle(&mut self) -> Res<()> {
        self.spins = self.spins.wrapping_add(1);
        if self.spins % 1024 != 0 {
            return Ok(());
        }
        self.check()
    }

    #[cold]
    fn check(&mut self) -> Res<()> {
        let now = Instant::now();
        if now < self.next {
            return Ok(());
        }
        self.next = now + PEER_CHECK;
        if dataplane_apps::signals::stopped() {
            return Err("stopped by SIGINT or SIGTERM; giving up".into());
        }
        match &mut self.who {
            Who::Server(child) => match child.try_wait() {
                Ok(None) => Ok(()),
                Ok(Some(status)) => {
                    Err(format!("the server process (pid {}) ended mid-test ({status}); giving up", child.id()))
                }
                Err(e) => Err(format!("watching the server process (pid {}): {e}", child.id())),
            },
            Who::Client(pid) if std::os::unix::process::parent_id() != *pid => {
                Err(format!("the client process (pid {pid}) died mid-test; giving up"))
            }
            Who::Client(_) => Ok(()),
        }
    }
}

fn pin(core: i64) -> Res<()> {
    if core < 0 {
        return Ok(());
    }
    let ok = core_affinity::set_for_current(core_affinity::CoreId { id: core as usize });
    if !ok {
        return fail("pinning", format!("cannot pin to core {core} (this machine has {} cores)", num_cores()));
    }
    Ok(())
}

fn num_cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

fn huge_policy(s: &str) -> Res<HugePolicy> {
    match s {
        "require" => Ok(HugePolicy::Require(dataplane::mem::PageSize::Huge2M)),
        "prefer" => Ok(HugePolicy::Prefer(dataplane::mem::PageSize::Huge2M)),
        "never" => Ok(HugePolicy::Never),
        other => fail("--huge", format!("{other:?} is not one of require, prefer, never")),
    }
}

impl End {
    fn open(fabric: &str, huge: HugePolicy) -> Res<End> {
        let ctx =
            Shm::open(&ShmConfig { fabric: fabric.into(), size: 128 << 20, huge }).map_err(err_in("open fabric"))?;
        let pd = ctx.alloc_pd().map_err(err_in("alloc_pd"))?;
        let len = SLOT * (RQ_DEPTH as usize + 64);
        let region = ctx.alloc_region(len).map_err(err_in("alloc_region"))?;
        let mr = pd.reg_mr(&region, 0, len, AccessFlags::LOCAL_WRITE).map_err(err_in("reg_mr"))?;
        let scq = ctx.create_cq(1024).map_err(err_in("create_cq"))?;
        let rcq = ctx.create_cq(RQ_DEPTH * 2).map_err(err_in("create_cq"))?;
        let cap = QpCaps { max_send_wr: 512, max_recv_wr: RQ_DEPTH, max_inline_data: 256, ..Default::default() };
        let attr = QpInitAttr { send_cq: &scq, recv_cq: &rcq, srq: None, cap, qp_type: QpType::Rc, sq_sig_all: false };
        let mut qp = pd.create_qp(&attr).map_err(err_in("create_qp"))?;
        // INIT now, to post the receives before the peer's QPN is known.
        qp.bring_up_to_init(&ConnectOpts::default()).map_err(err_in("modify INIT"))?;
        let mut e = End { ctx, region, mr, scq, rcq, qp, rchain: RecvChain::with_capacity(64, 64) };
        e.post_recvs((0..RQ_DEPTH as u64).collect::<Vec<_>>().as_slice())?;
        Ok(e)
    }

    fn connect(&mut self, peer: u32) -> Res<()> {
        // shm QP numbers are fabric-wide: no route needed beyond the port.
        let peer = PeerAddr { qpn: peer, psn: 0, ah: AhAttr { port_num: 1, ..Default::default() } };
        let opts = ConnectOpts { min_rnr_timer: 1, rnr_retry: 7, ..Default::default() };
        self.qp.connect(&peer, &opts).map_err(err_in("connect"))
    }

    /// Posts receives for the given slots, in chains of up to 64 (one doorbell each).
    fn post_recvs(&mut self, slots: &[u64]) -> Res<()> {
        for chunk in slots.chunks(64) {
            self.rchain.clear();
            for &s in chunk {
                let sge = Sge::new(
                    self.mr.addr() + (64 + s as usize % RQ_DEPTH as usize) as u64 * SLOT as u64,
                    SLOT as u32,
                    self.mr.lkey(),
                );
                self.rchain.push(RecvWr::new(s), &[sge]);
            }
            self.qp.post_recv(&self.rchain).map_err(err_in("post_recv"))?;
        }
        Ok(())
    }
}

/// Polls for receive completions and reposts their buffers; returns how many arrived. An
/// empty poll is an idle moment of `peer`'s watch.
fn drain_recv(e: &mut End, wc: &mut [WorkCompletion], slots: &mut Vec<u64>, peer: &mut Peer) -> Res<usize> {
    let n = e.rcq.poll(wc).map_err(err_in("poll"))?;
    if n == 0 {
        peer.idle()?;
        return Ok(0);
    }
    slots.clear();
    for w in &wc[..n] {
        if w.status != WcStatus::Success {
            return fail("receive", w.status);
        }
        slots.push(w.wr_id);
    }
    e.post_recvs(slots)?;
    Ok(n)
}

fn drain_send(e: &mut End, wc: &mut [WorkCompletion]) -> Res<()> {
    let n = e.scq.poll(wc).map_err(err_in("poll"))?;
    if let Some(w) = wc[..n].iter().find(|w| w.status != WcStatus::Success) {
        return fail("send", w.status);
    }
    Ok(())
}

fn main() {
    dataplane_apps::logging::init();
    let args = Args::parse();
    dataplane_apps::signals::install();
    let r = match args.role.as_deref() {
        Some("server") => server(&args),
        None => client(&args),
        Some(r) => fail("--role", r),
    };
    // Everything is dropped by now: the fabric file is gone if this side was the last user.
    if let Err(e) = r {
        eprintln!("shm-pingpong: {e}");
        std::process::exit(1);
    }
}

/// Echoes every message back (latency phase), then counts the rate phase and acks its end.
fn server(args: &Args) -> Res<()> {
    // Recorded first: if the client is already gone, the parent differs from the start.
    let mut peer = Peer::new(Who::Client(std::os::unix::process::parent_id()));
    pin(args.core)?;
    let Some(fabric) = args.fabric.clone() else { return fail("server", "needs --fabric") };
    let mut e = End::open(&fabric, huge_policy(&args.huge)?)?;
    println!("QPN {}", e.qp.qp_num());
    std::io::stdout().flush().map_err(|err| format!("telling the client the QPN: {err}"))?;
    let Some(peer_qpn) = args.peer_qpn else { return fail("server", "needs --peer-qpn") };
    e.connect(peer_qpn)?;
    let mut wc = vec![WorkCompletion::default(); 64];
    let mut swc = vec![WorkCompletion::default(); 64];
    let mut slots = Vec::with_capacity(64);
    let mut chain = SendChain::with_capacity(1, 1);
    let reply = SendWr::send(0).signaled();
    // Latency phase: echo `iters` messages.
    let mut n = 0;
    while n < args.iters {
        let got = drain_recv(&mut e, &mut wc, &mut slots, &mut peer)?;
        for _ in 0..got {
            chain.clear();
            chain.push(reply, &[Sge::new(e.mr.addr(), args.size, e.mr.lkey())]);
            e.qp.post_send(&chain).map_err(err_in("post_send"))?;
            drain_send(&mut e, &mut swc)?;
        }
        n += got as u64;
    }
    // Rate phase: count, then ack.
    let mut n = 0;
    while n < args.messages {
        n += drain_recv(&mut e, &mut wc, &mut slots, &mut peer)? as u64;
    }
    chain.clear();
    chain.push(reply, &[Sge::new(e.mr.addr(), 8, e.mr.lkey())]);
    e.qp.post_send(&chain).map_err(err_in("post_send"))?;
    drain_send(&mut e, &mut swc)?;
    // Keep the fabric until the client is done reading.
    std::thread::sleep(Duration::from_millis(100));
    Ok(())
}

fn client(args: &Args) -> Res<()> {
    if args.size as usize > SLOT {
        return fail("-s", format!("size {} is above {SLOT}", args.size));
    }
    if args.post_list == 0 || args.post_list > 256 {
        return fail("--post-list", "must be 1..=256");
    }
    let fabric = args.fabric.clone().unwrap_or_else(|| format!("pingpong-{}", std::process::id()));
    let huge = huge_policy(&args.huge)?;
    let mut e = End::open(&fabric, huge)?;
    let exe = std::env::current_exe().map_err(|err| format!("finding this program to start the server: {err}"))?;
    let mut child = Command::new(exe)
        .args(["--role", "server", "--fabric", &fabric, "--huge", &args.huge])
        .args(["--core", &args.peer_core.to_string(), "--peer-qpn", &e.qp.qp_num().to_string()])
        .args(["-s", &args.size.to_string(), "-n", &args.iters.to_string(), "-m", &args.messages.to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|err| format!("starting the server process: {err}"))?;
    let Some(stdout) = child.stdout.take() else { return fail("server", "no stdout pipe") };
    let server_pid = child.id();
    let mut peer = Peer::new(Who::Server(child));
    let mut out = BufReader::new(stdout).lines();
    let peer_qpn: u32 = loop {
        match out.next() {
            Some(Ok(l)) if l.starts_with("QPN ") => {
                break l[4..].trim().parse().map_err(|err| format!("server QPN {l:?}: {err}"))?
            }
            Some(Ok(_)) => continue,
            _ => return fail("server", "exited before telling its QPN"),
        }
    };
    pin(args.core)?;
    e.connect(peer_qpn)?;
    let backing = match e.ctx.backing() {
        b if b.is_huge() => "huge pages".to_string(),
        b => format!("4 KiB pages ({})", b.fallback_reason().unwrap_or("huge pages not requested")),
    };
    println!(
        "shm-pingpong: fabric {:?}, {}, client core {}, server core {}, server pid {server_pid}",
        e.ctx.fabric_name(),
        backing,
        args.core,
        args.peer_core
    );
    std::io::stdout().flush().map_err(|err| format!("stdout: {err}"))?;
    e.region.fill(0, args.size as usize, 0x5a);

    let mut wc = vec![WorkCompletion::default(); 64];
    let mut swc = vec![WorkCompletion::default(); 64];
    let mut slots = Vec::with_capacity(64);
    let mut chain = SendChain::with_capacity(args.post_list as usize, args.post_list as usize);
    let sge = Sge::new(e.mr.addr(), args.size, e.mr.lkey());

    // Latency: one message in flight.
    let mut hist = hdrhistogram::Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3)
        .map_err(|err| format!("histogram: {err}"))?;
    let warmup = args.iters / 10;
    for i in 0..args.iters {
        let t0 = Instant::now();
        chain.clear();
        chain.push(SendWr::send(i).signaled(), &[sge]);
        e.qp.post_send(&chain).map_err(err_in("post_send"))?;
        while drain_recv(&mut e, &mut wc, &mut slots, &mut peer)? == 0 {}
        let rtt = t0.elapsed().as_nanos() as u64;
        drain_send(&mut e, &mut swc)?;
        if i >= warmup {
            hist.record((rtt / 2).max(1)).ok();
        }
    }
    println!(
        "latency  {:>5} B  {} round trips  half-RTT ns: min {}  p50 {}  p99 {}  p99.9 {}  max {}",
        args.size,
        hist.len(),
        hist.min(),
        hist.value_at_quantile(0.5),
        hist.value_at_quantile(0.99),
        hist.value_at_quantile(0.999),
        hist.max()
    );

    // Rate: chains of post_list SENDs, one signaled per chain (selective signaling).
    let pl = args.post_list as u64;
    let t0 = Instant::now();
    let mut sent = 0u64;
    let mut doorbells = 0u64;
    while sent < args.messages {
        let k = pl.min(args.messages - sent);
        chain.clear();
        for j in 0..k {
            let wr = if j == k - 1 { SendWr::send(sent + j).signaled() } else { SendWr::send(sent + j) };
            chain.push(wr, &[sge]);
        }
        loop {
            match e.qp.post_send(&chain) {
                Ok(()) => break,
                Err(err) if err.errno == Errno::ENOMEM && err.bad_wr == 0 => {
                    // The send queue is full: only a live peer drains it.
                    peer.idle()?;
                    drain_send(&mut e, &mut swc)?
                }
                Err(err) => return fail("post_send", err),
            }
        }
        doorbells += 1;
        sent += k;
        drain_send(&mut e, &mut swc)?;
    }
    while drain_recv(&mut e, &mut wc, &mut slots, &mut peer)? == 0 {
        drain_send(&mut e, &mut swc)?;
    }
    let secs = t0.elapsed().as_secs_f64();
    println!(
        "rate     {:>5} B  {} messages  post list {}  {:.2} Mmsg/s  {:.1} ns/msg  {:.3} doorbells/msg",
        args.size,
        args.messages,
        args.post_list,
        args.messages as f64 / secs / 1e6,
        secs * 1e9 / args.messages as f64,
        doorbells as f64 / args.messages as f64
    );
    let Who::Server(mut child) = peer.who else { return Ok(()) };
    let status = child.wait().map_err(|err| format!("waiting for the server: {err}"))?;
    if !status.success() {
        return fail("server", status);
    }
    Ok(())
}

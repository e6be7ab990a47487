//! `shm-pingpong`: two processes on one `shm` fabric. Measures the round trip of one message
//! (reported as half round trip, like perftest) and the message rate of a sender posting
//! chains of `--post-list` SENDs with one doorbell each.
//!
//! With no `--role`, it starts the server as a child process of itself, pinned to
//! `--peer-core`, and runs the client pinned to `--core`.

use clap::Parser;
use dataplane::mem::HugePolicy;
use dataplane::shm::{Shm, ShmConfig, ShmContext};
use dataplane::verbs::*;
use dataplane::{Context, Cq, MemRegion, Mr, Pd, Provider, Qp, QpInitAttr};
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
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
    /// Fabric name (default: pingpong-<pid>).
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

fn fail(what: &str, e: impl std::fmt::Display) -> ! {
    eprintln!("shm-pingpong: {what}: {e}");
    std::process::exit(1)
}

fn pin(core: i64) {
    if core < 0 {
        return;
    }
    let ok = core_affinity::set_for_current(core_affinity::CoreId { id: core as usize });
    if !ok {
        fail("pinning", format!("cannot pin to core {core} (this machine has {} cores)", num_cores()));
    }
}

fn num_cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

fn huge_policy(s: &str) -> HugePolicy {
    match s {
        "require" => HugePolicy::Require(dataplane::mem::PageSize::Huge2M),
        "prefer" => HugePolicy::Prefer(dataplane::mem::PageSize::Huge2M),
        "never" => HugePolicy::Never,
        other => fail("--huge", format!("{other:?} is not one of require, prefer, never")),
    }
}

impl End {
    fn open(fabric: &str, huge: HugePolicy) -> End {
        let ctx = Shm::open(&ShmConfig { fabric: fabric.into(), size: 128 << 20, huge })
            .unwrap_or_else(|e| fail("open fabric", e));
        let pd = ctx.alloc_pd().unwrap_or_else(|e| fail("alloc_pd", e));
        let len = SLOT * (RQ_DEPTH as usize + 64);
        let region = ctx.alloc_region(len).unwrap_or_else(|e| fail("alloc_region", e));
        let mr = pd.reg_mr(&region, 0, len, AccessFlags::LOCAL_WRITE).unwrap_or_else(|e| fail("reg_mr", e));
        let scq = ctx.create_cq(1024).unwrap_or_else(|e| fail("create_cq", e));
        let rcq = ctx.create_cq(RQ_DEPTH * 2).unwrap_or_else(|e| fail("create_cq", e));
        let cap = QpCaps { max_send_wr: 512, max_recv_wr: RQ_DEPTH, max_inline_data: 256, ..Default::default() };
        let attr = QpInitAttr { send_cq: &scq, recv_cq: &rcq, srq: None, cap, qp_type: QpType::Rc, sq_sig_all: false };
        let mut qp = pd.create_qp(&attr).unwrap_or_else(|e| fail("create_qp", e));
        qp.modify(&QpAttr { state: QpState::Init, ..Default::default() }).unwrap_or_else(|e| fail("modify INIT", e));
        let mut e = End { ctx, region, mr, scq, rcq, qp, rchain: RecvChain::with_capacity(64, 64) };
        e.post_recvs((0..RQ_DEPTH as u64).collect::<Vec<_>>().as_slice());
        e
    }

    fn connect(&mut self, peer: u32) {
        let rtr = QpAttr { state: QpState::Rtr, dest_qp_num: peer, min_rnr_timer: 1, ..Default::default() };
        self.qp.modify(&rtr).unwrap_or_else(|e| fail("modify RTR", e));
        let rts = QpAttr { state: QpState::Rts, rnr_retry: 7, ..Default::default() };
        self.qp.modify(&rts).unwrap_or_else(|e| fail("modify RTS", e));
    }

    /// Posts receives for the given slots, in chains of up to 64 (one doorbell each).
    fn post_recvs(&mut self, slots: &[u64]) {
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
            self.qp.post_recv(&self.rchain).unwrap_or_else(|e| fail("post_recv", e));
        }
    }
}

/// Waits for receive completions; reposts their buffers. Returns how many arrived.
fn drain_recv(e: &mut End, wc: &mut [WorkCompletion], slots: &mut Vec<u64>) -> usize {
    let n = e.rcq.poll(wc).unwrap_or_else(|err| fail("poll", err));
    slots.clear();
    for w in &wc[..n] {
        if w.status != WcStatus::Success {
            fail("receive", w.status);
        }
        slots.push(w.wr_id);
    }
    if n > 0 {
        e.post_recvs(slots);
    }
    n
}

fn drain_send(e: &mut End, wc: &mut [WorkCompletion]) {
    let n = e.scq.poll(wc).unwrap_or_else(|err| fail("poll", err));
    if let Some(w) = wc[..n].iter().find(|w| w.status != WcStatus::Success) {
        fail("send", w.status);
    }
}

fn main() {
    dataplane_apps::logging::init();
    let args = Args::parse();
    match args.role.as_deref() {
        Some("server") => server(&args),
        None => client(&args),
        Some(r) => fail("--role", r),
    }
}

/// Echoes every message back (latency phase), then counts the rate phase and acks its end.
fn server(args: &Args) {
    pin(args.core);
    let fabric = args.fabric.clone().unwrap_or_else(|| fail("server", "needs --fabric"));
    let mut e = End::open(&fabric, huge_policy(&args.huge));
    println!("QPN {}", e.qp.qp_num());
    std::io::stdout().flush().unwrap();
    e.connect(args.peer_qpn.unwrap_or_else(|| fail("server", "needs --peer-qpn")));
    let mut wc = vec![WorkCompletion::default(); 64];
    let mut swc = vec![WorkCompletion::default(); 64];
    let mut slots = Vec::with_capacity(64);
    let mut chain = SendChain::with_capacity(1, 1);
    let reply = SendWr::send(0).signaled();
    // Latency phase: echo `iters` messages.
    let mut n = 0;
    while n < args.iters {
        let got = drain_recv(&mut e, &mut wc, &mut slots);
        for _ in 0..got {
            chain.clear();
            chain.push(reply, &[Sge::new(e.mr.addr(), args.size, e.mr.lkey())]);
            e.qp.post_send(&chain).unwrap_or_else(|err| fail("post_send", err));
            drain_send(&mut e, &mut swc);
        }
        n += got as u64;
    }
    // Rate phase: count, then ack.
    let mut n = 0;
    while n < args.messages {
        n += drain_recv(&mut e, &mut wc, &mut slots) as u64;
    }
    chain.clear();
    chain.push(reply, &[Sge::new(e.mr.addr(), 8, e.mr.lkey())]);
    e.qp.post_send(&chain).unwrap_or_else(|err| fail("post_send", err));
    drain_send(&mut e, &mut swc);
    // Keep the fabric until the client is done reading.
    std::thread::sleep(Duration::from_millis(100));
}

fn client(args: &Args) {
    if args.size as usize > SLOT {
        fail("-s", format!("size {} is above {SLOT}", args.size));
    }
    if args.post_list == 0 || args.post_list > 256 {
        fail("--post-list", "must be 1..=256");
    }
    let fabric = args.fabric.clone().unwrap_or_else(|| format!("pingpong-{}", std::process::id()));
    let huge = huge_policy(&args.huge);
    let mut e = End::open(&fabric, huge);
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--role", "server", "--fabric", &fabric, "--huge", &args.huge])
        .args(["--core", &args.peer_core.to_string(), "--peer-qpn", &e.qp.qp_num().to_string()])
        .args(["-s", &args.size.to_string(), "-n", &args.iters.to_string(), "-m", &args.messages.to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|err| fail("starting the server process", err));
    let mut out = BufReader::new(child.stdout.take().unwrap()).lines();
    let peer: u32 = loop {
        match out.next() {
            Some(Ok(l)) if l.starts_with("QPN ") => {
                break l[4..].trim().parse().unwrap_or_else(|err| fail("server QPN", err))
            }
            Some(Ok(_)) => continue,
            _ => fail("server", "exited before telling its QPN"),
        }
    };
    pin(args.core);
    e.connect(peer);
    let backing = match e.ctx.backing() {
        b if b.is_huge() => "huge pages".to_string(),
        b => format!("4 KiB pages ({})", b.fallback_reason().unwrap_or("huge pages not requested")),
    };
    println!(
        "shm-pingpong: fabric {:?}, {}, client core {}, server core {}",
        e.ctx.fabric_name(),
        backing,
        args.core,
        args.peer_core
    );
    e.region.fill(0, args.size as usize, 0x5a);

    let mut wc = vec![WorkCompletion::default(); 64];
    let mut swc = vec![WorkCompletion::default(); 64];
    let mut slots = Vec::with_capacity(64);
    let mut chain = SendChain::with_capacity(args.post_list as usize, args.post_list as usize);
    let sge = Sge::new(e.mr.addr(), args.size, e.mr.lkey());

    // Latency: one message in flight.
    let mut hist = hdrhistogram::Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).unwrap();
    let warmup = args.iters / 10;
    for i in 0..args.iters {
        let t0 = Instant::now();
        chain.clear();
        chain.push(SendWr::send(i).signaled(), &[sge]);
        e.qp.post_send(&chain).unwrap_or_else(|err| fail("post_send", err));
        while drain_recv(&mut e, &mut wc, &mut slots) == 0 {}
        let rtt = t0.elapsed().as_nanos() as u64;
        drain_send(&mut e, &mut swc);
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
                Err(err) if err.errno == Errno::ENOMEM && err.bad_wr == 0 => drain_send(&mut e, &mut swc),
                Err(err) => fail("post_send", err),
            }
        }
        doorbells += 1;
        sent += k;
        drain_send(&mut e, &mut swc);
    }
    while drain_recv(&mut e, &mut wc, &mut slots) == 0 {
        drain_send(&mut e, &mut swc);
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
    let status = child.wait().unwrap_or_else(|err| fail("waiting for the server", err));
    if !status.success() {
        fail("server", status);
    }
}

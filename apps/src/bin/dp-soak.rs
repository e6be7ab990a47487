//! `dp-soak`: two processes on one `shm` fabric exchanging every RC operation at full rate for
//! a given time, with every byte, sequence number, READ result and atomic result checked
//! (issue 15, item 6; docs/reliability.md, "Soak").
//!
//! The client starts the server as a child process of itself (like `shm-pingpong`). Both
//! derive the whole traffic from `--seed`: the kind and length of the n-th message that
//! consumes a receive (SEND, SEND_WITH_IMM or RDMA_WRITE_WITH_IMM), so the server knows what
//! must arrive and checks opcode, immediate, length and every payload byte. Between them the
//! client runs RDMA WRITEs read back by RDMA READs (the READ must return what was written),
//! FETCH_AND_ADDs and CMP_AND_SWPs on two words of the server's memory that only it touches
//! (each result must equal the value it expects). The server's SRQ is starved at random moments
//! (its receives held back for 1-3 ms), so the client meets RNR and retries.
//!
//! At the end the client sends the number of receive-consuming messages; the server answers
//! with what it received, checked and found wrong, and both report RSS at start and end. Exit
//! status 0 only with 0 lost, 0 corrupted, 0 failed completions and RSS growth within
//! `--rss-slack-mib`. `--corrupt-at N` flips one payload byte of message N on the client
//! (after the server's expectation is fixed): the run must then fail, which shows the checker
//! can.

use clap::Parser;
use dataplane::mem::HugePolicy;
use dataplane::shm::{Shm, ShmConfig, ShmContext};
use dataplane::verbs::*;
use dataplane::{Context, Cq, MemRegion, Mr, Pd, Provider, Qp, QpInitAttr, Srq};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Parser, Debug)]
#[command(about = "Soak test over the shm software NIC: every RC opcode, every byte checked")]
struct Args {
    /// How long the client sends, in seconds.
    #[arg(long, default_value_t = 10.0)]
    duration: f64,
    /// Seed of the traffic (kinds, lengths, payloads, starvation); printed, so a run can be
    /// repeated.
    #[arg(long)]
    seed: Option<u64>,
    /// Largest message in bytes (at least 16).
    #[arg(long, default_value_t = 4096)]
    max_size: u32,
    /// Work requests per doorbell (one chain), 1..=32.
    #[arg(long, default_value_t = 16)]
    chain: u32,
    /// Allowed RSS growth of either process from start to end, in MiB.
    #[arg(long, default_value_t = 8)]
    rss_slack_mib: u64,
    /// Flip one payload byte of receive-consuming message N (tests that the checker fails).
    #[arg(long)]
    corrupt_at: Option<u64>,
    /// Fabric name (default: soak-PID, PID being this process id).
    #[arg(long)]
    fabric: Option<String>,
    #[arg(long, hide = true)]
    role: Option<String>,
    #[arg(long, hide = true)]
    peer_qpn: Option<u32>,
}

/// An error sentence, returned up to `main` so destructors run (they remove the fabric file).
type Res<T> = std::result::Result<T, String>;

fn err_in<E: std::fmt::Display>(what: &'static str) -> impl Fn(E) -> String {
    move |e| format!("{what}: {e}")
}

/// Receive buffers on the server (SRQ depth), each `SLOT` bytes.
const SRQ_DEPTH: u32 = 512;
const SLOT: usize = 4096;
/// Slots of the server's WRITE_WITH_IMM area: more than SRQ_DEPTH, so a slot is not written
/// again before the server checked it (each such write consumes a receive, and receives are
/// reposted only after the check).
const IMM_SLOTS: usize = 1024;
/// Slots of the WRITE/READ area (touched by the client only).
const RW_SLOTS: usize = 64;
/// Server region layout.
const RECV_OFF: usize = 0;
const IMM_OFF: usize = RECV_OFF + SRQ_DEPTH as usize * SLOT;
const RW_OFF: usize = IMM_OFF + IMM_SLOTS * SLOT;
const ATOMIC_OFF: usize = RW_OFF + RW_SLOTS * SLOT;
const SERVER_LEN: usize = ATOMIC_OFF + 4096;
/// Client region: per chain position, a source slot and a read-back slot.
const MAX_CHAIN: usize = 32;
const CLIENT_LEN: usize = 2 * MAX_CHAIN * SLOT + 4096;
/// The end marker: a SEND whose first word is this and second the count of messages.
const END_MAGIC: u64 = 0x454e_445f_534f_414b;

/// splitmix64: the traffic's only source of randomness.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// What receive-consuming message `n` is, derived from the seed on both sides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Send,
    SendImm,
    WriteImm,
}

fn kind_of(seed: u64, n: u64) -> Kind {
    match mix(seed ^ n.wrapping_mul(3)) % 3 {
        0 => Kind::Send,
        1 => Kind::SendImm,
        _ => Kind::WriteImm,
    }
}

fn len_of(seed: u64, n: u64, max: u32) -> usize {
    16 + (mix(seed ^ n.wrapping_mul(5) ^ 0x55) % u64::from(max - 15)) as usize
}

/// Payload byte `i` of message `n`: the sequence number in the first 8 bytes, then a pattern
/// that differs per message and per position.
fn fill(seed: u64, n: u64, buf: &mut [u8]) {
    buf[..8].copy_from_slice(&n.to_le_bytes());
    let k = mix(seed ^ n) as u8;
    for (i, b) in buf[8..].iter_mut().enumerate() {
        *b = k.wrapping_add(i as u8).wrapping_mul(31) ^ (i >> 8) as u8;
    }
}

/// The first byte where `got` differs from message `n`'s payload, if any.
fn check(seed: u64, n: u64, got: &[u8], scratch: &mut Vec<u8>) -> Option<usize> {
    scratch.resize(got.len(), 0);
    fill(seed, n, scratch);
    got.iter().zip(scratch.iter()).position(|(a, b)| a != b)
}

/// VmRSS of this process in KiB.
fn rss_kib() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn open(fabric: &str, len: usize) -> Res<(ShmContext, <Shm as Provider>::Pd, <Shm as Provider>::Region)> {
    let ctx = Shm::open(&ShmConfig { fabric: fabric.into(), size: 96 << 20, huge: HugePolicy::Never })
        .map_err(err_in("open fabric"))?;
    let pd = ctx.alloc_pd().map_err(err_in("alloc_pd"))?;
    let region = ctx.alloc_region(len).map_err(err_in("alloc_region"))?;
    Ok((ctx, pd, region))
}

fn connect(qp: &mut <Shm as Provider>::Qp, peer: u32) -> Res<()> {
    let peer = PeerAddr { qpn: peer, psn: 0, ah: AhAttr { port_num: 1, ..Default::default() } };
    // rnr_retry 7: retry for ever while the server starves its SRQ; a small RNR timer keeps the
    // rate up.
    let opts = ConnectOpts {
        min_rnr_timer: 1,
        rnr_retry: 7,
        access: AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC,
        ..Default::default()
    };
    qp.connect(&peer, &opts).map_err(err_in("connect"))
}

fn main() {
    dataplane_apps::logging::init();
    dataplane_apps::signals::install();
    let args = Args::parse();
    let r = match args.role.as_deref() {
        Some("server") => server(&args),
        None => client(&args),
        Some(r) => Err(format!("--role {r}: unknown")),
    };
    if let Err(e) = r {
        eprintln!("dp-soak: {e}");
        std::process::exit(1);
    }
}

/// What the server counted, sent back to the client as one line.
#[derive(Debug, Default)]
struct Tally {
    msgs: u64,
    bytes: u64,
    corrupt: u64,
    bad_status: u64,
    starvations: u64,
}

fn server(args: &Args) -> Res<()> {
    let parent = std::os::unix::process::parent_id();
    let seed = args.seed.ok_or("server: needs --seed")?;
    let fabric = args.fabric.clone().ok_or("server: needs --fabric")?;
    let (ctx, pd, region) = open(&fabric, SERVER_LEN)?;
    let access =
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC;
    let mr = pd.reg_mr(&region, 0, SERVER_LEN, access).map_err(err_in("reg_mr"))?;
    let scq = ctx.create_cq(64).map_err(err_in("create_cq"))?;
    let mut rcq = ctx.create_cq(SRQ_DEPTH * 2).map_err(err_in("create_cq"))?;
    let mut srq =
        pd.create_srq(&SrqAttr { max_wr: SRQ_DEPTH, max_sge: 1, srq_limit: 0 }).map_err(err_in("create_srq"))?;
    let cap = QpCaps { max_send_wr: 16, max_recv_wr: 0, ..Default::default() };
    let attr =
        QpInitAttr { send_cq: &scq, recv_cq: &rcq, srq: Some(&srq), cap, qp_type: QpType::Rc, sq_sig_all: false };
    let mut qp = pd.create_qp(&attr).map_err(err_in("create_qp"))?;
    let mut chain = RecvChain::with_capacity(64, 64);
    let slot_sge = |s: u64| Sge::new(mr.addr() + (RECV_OFF + s as usize * SLOT) as u64, SLOT as u32, mr.lkey());
    let mut repost = |srq: &mut <Shm as Provider>::Srq, slots: &[u64]| -> Res<()> {
        for c in slots.chunks(64) {
            chain.clear();
            for &s in c {
                chain.push(RecvWr::new(s), &[slot_sge(s)]);
            }
            srq.post_recv(&chain).map_err(err_in("post_srq_recv"))?;
        }
        Ok(())
    };
    repost(&mut srq, &(0..u64::from(SRQ_DEPTH)).collect::<Vec<_>>())?;
    // The two atomic words start at 0, as the client assumes.
    region.fill(ATOMIC_OFF, 16, 0);
    println!("QPN {} ADDR {} RKEY {}", qp.qp_num(), mr.addr(), mr.rkey());
    std::io::stdout().flush().map_err(err_in("stdout"))?;
    let peer = args.peer_qpn.ok_or("server: needs --peer-qpn")?;
    connect(&mut qp, peer)?;
    // RSS is taken once every receive slot and WRITE_WITH_IMM slot has been used (first use
    // touches pages); growth after that is a leak. A run too short for it uses the end value.
    let mut rss_start = None;

    let mut t = Tally::default();
    let mut wc = vec![WorkCompletion::default(); 64];
    let mut held: Vec<u64> = Vec::with_capacity(SRQ_DEPTH as usize);
    let mut scratch = Vec::with_capacity(SLOT);
    let mut buf = vec![0u8; SLOT];
    let mut starve_until: Option<Instant> = None;
    let mut next_starve = mix(seed ^ 0xdead) % 18_000 + 2_000;
    let mut spins = 0u32;
    let expected_total = loop {
        let n = rcq.poll(&mut wc).map_err(err_in("poll"))?;
        if n == 0 {
            spins = spins.wrapping_add(1);
            if spins % 4096 == 0 {
                if dataplane_apps::signals::stopped() {
                    return Err("stopped by SIGINT or SIGTERM".into());
                }
                if std::os::unix::process::parent_id() != parent {
                    return Err(format!("the client (pid {parent}) died mid-run"));
                }
            }
        }
        let mut end = None;
        for w in &wc[..n] {
            if w.status != WcStatus::Success {
                t.bad_status += 1;
                held.push(w.wr_id);
                continue;
            }
            let slot = RECV_OFF + w.wr_id as usize * SLOT;
            if w.opcode == WcOpcode::Recv && w.byte_len == 16 {
                region.read(slot, &mut buf[..16]);
                if u64::from_le_bytes(buf[..8].try_into().expect("8 bytes")) == END_MAGIC {
                    end = Some(u64::from_le_bytes(buf[8..16].try_into().expect("8 bytes")));
                    held.push(w.wr_id);
                    continue;
                }
            }
            let m = t.msgs;
            let (kind, len) = (kind_of(seed, m), len_of(seed, m, args.max_size));
            let want_op = if kind == Kind::WriteImm { WcOpcode::RecvRdmaWithImm } else { WcOpcode::Recv };
            let want_imm = kind != Kind::Send;
            let ok_shape = w.opcode == want_op
                && w.byte_len as usize == len
                && w.wc_flags.contains(WcFlags::WITH_IMM) == want_imm
                && (!want_imm || w.imm_data == m as u32);
            let at = if kind == Kind::WriteImm { IMM_OFF + (m as usize % IMM_SLOTS) * SLOT } else { slot };
            region.read(at, &mut buf[..len]);
            if !ok_shape || check(seed, m, &buf[..len], &mut scratch).is_some() {
                t.corrupt += 1;
                if t.corrupt <= 3 {
                    eprintln!(
                        "dp-soak server: message {m} ({kind:?}, {len} B) arrived as {:?} {} B imm {:#x} flags {:?}{}",
                        w.opcode,
                        w.byte_len,
                        w.imm_data,
                        w.wc_flags,
                        check(seed, m, &buf[..len], &mut scratch)
                            .map_or(String::new(), |i| format!(", byte {i} differs"))
                    );
                }
            }
            t.msgs += 1;
            t.bytes += len as u64;
            held.push(w.wr_id);
            if rss_start.is_none() && t.msgs == 4 * IMM_SLOTS as u64 {
                rss_start = Some(rss_kib());
            }
        }
        // Starvation: now and then hold every consumed receive back for 1-3 ms.
        if starve_until.is_none() && t.msgs >= next_starve {
            let ms = 1 + mix(seed ^ t.msgs) % 3;
            starve_until = Some(Instant::now() + Duration::from_millis(ms));
            next_starve = t.msgs + mix(seed ^ t.msgs ^ 0xbeef) % 18_000 + 2_000;
            t.starvations += 1;
        }
        if starve_until.is_some_and(|u| Instant::now() >= u) {
            starve_until = None;
        }
        if starve_until.is_none() && !held.is_empty() {
            repost(&mut srq, &held)?;
            held.clear();
        }
        if let Some(total) = end {
            break total;
        }
    };
    let rss_end = rss_kib();
    let rss_start = rss_start.unwrap_or(rss_end);
    println!(
        "SERVER msgs {} bytes {} corrupt {} bad_status {} starvations {} expected {} rss_start_kib {} rss_end_kib {}",
        t.msgs, t.bytes, t.corrupt, t.bad_status, t.starvations, expected_total, rss_start, rss_end
    );
    std::io::stdout().flush().map_err(err_in("stdout"))?;
    // Keep the fabric until the client has read the line.
    std::thread::sleep(Duration::from_millis(100));
    Ok(())
}

/// Client-side counts.
#[derive(Debug, Default)]
struct Counts {
    sends: u64,
    writes: u64,
    reads: u64,
    atomics: u64,
    bytes: u64,
    errors: u64,
    read_mismatch: u64,
    atomic_mismatch: u64,
}

/// What a posted WR must produce, checked at its completion.
#[derive(Clone, Copy)]
enum Expect {
    None,
    /// A READ of `len` bytes into read-back slot `pos`, which must equal RW message `n`.
    Read {
        pos: usize,
        n: u64,
        len: usize,
    },
    /// An atomic whose 8-byte result (at `pos`) must be `old`.
    Atomic {
        pos: usize,
        old: u64,
    },
}

/// Polls the client's send CQ until `wc` is full (every WR the client posts is signaled, so
/// `wc.len()` is the number of WRs it waits for). Every 4,096 empty polls it checks for
/// SIGINT/SIGTERM and for the server having exited, and `when` says in that error what the
/// client was waiting for.
fn wait_sends(scq: &mut <Shm as Provider>::Cq, wc: &mut [WorkCompletion], child: &mut Child, when: &str) -> Res<()> {
    let mut done = 0;
    let mut spins = 0u32;
    while done < wc.len() {
        let n = scq.poll(&mut wc[done..]).map_err(err_in("poll"))?;
        done += n;
        if n == 0 {
            spins = spins.wrapping_add(1);
            if spins % 4096 == 0 {
                if dataplane_apps::signals::stopped() {
                    return Err("stopped by SIGINT or SIGTERM".into());
                }
                if let Ok(Some(s)) = child.try_wait() {
                    return Err(format!("the server process ended {when} ({s})"));
                }
            }
        }
    }
    Ok(())
}

fn client(args: &Args) -> Res<()> {
    if !(16..=SLOT as u32).contains(&args.max_size) {
        return Err(format!("--max-size {} must be 16..={SLOT}", args.max_size));
    }
    if !(1..=MAX_CHAIN as u32).contains(&args.chain) {
        return Err(format!("--chain {} must be 1..={MAX_CHAIN}", args.chain));
    }
    if !(args.duration > 0.0 && args.duration.is_finite()) {
        return Err(format!("--duration {} must be a positive number of seconds", args.duration));
    }
    let seed = args.seed.unwrap_or_else(|| mix(std::process::id() as u64 ^ rss_kib()));
    let fabric = args.fabric.clone().unwrap_or_else(|| format!("soak-{}", std::process::id()));
    let (ctx, pd, region) = open(&fabric, CLIENT_LEN)?;
    let mr = pd.reg_mr(&region, 0, CLIENT_LEN, AccessFlags::LOCAL_WRITE).map_err(err_in("reg_mr"))?;
    let mut scq = ctx.create_cq(256).map_err(err_in("create_cq"))?;
    let rcq = ctx.create_cq(16).map_err(err_in("create_cq"))?;
    let cap = QpCaps { max_send_wr: 128, max_recv_wr: 1, ..Default::default() };
    let attr = QpInitAttr { send_cq: &scq, recv_cq: &rcq, srq: None, cap, qp_type: QpType::Rc, sq_sig_all: false };
    let mut qp = pd.create_qp(&attr).map_err(err_in("create_qp"))?;
    qp.bring_up_to_init(&ConnectOpts::default()).map_err(err_in("modify INIT"))?;

    let exe = std::env::current_exe().map_err(err_in("finding this program to start the server"))?;
    let mut child: Child = Command::new(exe)
        .args(["--role", "server", "--fabric", &fabric, "--seed", &seed.to_string()])
        .args(["--max-size", &args.max_size.to_string(), "--peer-qpn", &qp.qp_num().to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .map_err(err_in("starting the server process"))?;
    let stdout = child.stdout.take().ok_or("server: no stdout pipe")?;
    let mut lines = BufReader::new(stdout).lines();
    let hello = lines.next().and_then(|l| l.ok()).ok_or("the server exited before telling its QPN")?;
    let f: Vec<&str> = hello.split_whitespace().collect();
    let (peer_qpn, raddr, rkey) = match f.as_slice() {
        ["QPN", q, "ADDR", a, "RKEY", k] => (
            q.parse::<u32>().map_err(err_in("server QPN"))?,
            a.parse::<u64>().map_err(err_in("server address"))?,
            k.parse::<u32>().map_err(err_in("server rkey"))?,
        ),
        _ => return Err(format!("the server said {hello:?}")),
    };
    connect(&mut qp, peer_qpn)?;
    println!(
        "dp-soak: seed {seed}, fabric {fabric:?}, {} s, messages up to {} B, chains of {}",
        args.duration, args.max_size, args.chain
    );
    // RSS is taken after a warm-up (the first second, or a tenth of a shorter run): by then
    // every buffer has been touched once, so growth after it is a leak, not first use.
    let warm_up = Instant::now() + Duration::from_secs_f64((args.duration / 10.0).min(1.0));
    let mut rss_start = None;

    let lkey = mr.lkey();
    let src = |i: usize| (i * SLOT) as u64;
    let back = |i: usize| ((MAX_CHAIN + i) * SLOT) as u64;
    let mut c = Counts::default();
    let mut chain = SendChain::with_capacity(MAX_CHAIN, MAX_CHAIN);
    let mut expect = [Expect::None; MAX_CHAIN];
    let mut wc = vec![WorkCompletion::default(); MAX_CHAIN];
    let mut scratch = Vec::with_capacity(SLOT);
    let mut buf = vec![0u8; SLOT];
    let (mut faa, mut cas) = (0u64, 0u64); // the two atomic words' values, as only we change them
    let mut m = 0u64; // receive-consuming messages sent
    let mut rw = 0u64; // WRITE/READ pairs
    let mut op = 0u64;
    let deadline = Instant::now() + Duration::from_secs_f64(args.duration);
    let mut last_check = Instant::now();
    while Instant::now() < deadline {
        chain.clear();
        let mut i = 0;
        while i < args.chain as usize {
            op += 1;
            let r = mix(seed ^ op.wrapping_mul(7) ^ 0xc0ffee) % 10;
            let base = mr.addr();
            if r < 6 {
                // A receive-consuming message.
                let (kind, len) = (kind_of(seed, m), len_of(seed, m, args.max_size));
                fill(seed, m, &mut buf[..len]);
                if args.corrupt_at == Some(m) {
                    buf[len / 2] ^= 0x01;
                }
                region.write(src(i) as usize, &buf[..len]);
                let sge = Sge::new(base + src(i), len as u32, lkey);
                let wr = match kind {
                    Kind::Send => SendWr::send(i as u64),
                    Kind::SendImm => SendWr::send_with_imm(i as u64, m as u32),
                    Kind::WriteImm => SendWr::write_with_imm(
                        i as u64,
                        raddr + (IMM_OFF + (m as usize % IMM_SLOTS) * SLOT) as u64,
                        rkey,
                        m as u32,
                    ),
                };
                chain.push(wr.signaled(), &[sge]);
                expect[i] = Expect::None;
                c.sends += 1;
                c.bytes += len as u64;
                m += 1;
                i += 1;
            } else if r < 8 && i + 2 <= args.chain as usize {
                // WRITE then READ back the same bytes (RC executes them in order).
                let len = len_of(seed, rw ^ (1 << 63), args.max_size);
                fill(seed, rw ^ (1 << 62), &mut buf[..len]);
                region.write(src(i) as usize, &buf[..len]);
                let at = raddr + (RW_OFF + (rw as usize % RW_SLOTS) * SLOT) as u64;
                chain.push(SendWr::write(i as u64, at, rkey).signaled(), &[Sge::new(base + src(i), len as u32, lkey)]);
                expect[i] = Expect::None;
                region.fill(back(i + 1) as usize, len, 0);
                chain.push(
                    SendWr::read(i as u64 + 1, at, rkey).signaled(),
                    &[Sge::new(base + back(i + 1), len as u32, lkey)],
                );
                expect[i + 1] = Expect::Read { pos: back(i + 1) as usize, n: rw ^ (1 << 62), len };
                c.writes += 1;
                c.reads += 1;
                c.bytes += 2 * len as u64;
                rw += 1;
                i += 2;
            } else {
                let pos = back(i) as usize;
                if r == 8 {
                    let add = mix(op) % 1000 + 1;
                    chain.push(
                        SendWr::fetch_add(i as u64, raddr + ATOMIC_OFF as u64, rkey, add).signaled(),
                        &[Sge::new(base + pos as u64, 8, lkey)],
                    );
                    expect[i] = Expect::Atomic { pos, old: faa };
                    faa = faa.wrapping_add(add);
                } else {
                    let new = mix(op ^ 0xa5);
                    chain.push(
                        SendWr::cmp_swap(i as u64, raddr + ATOMIC_OFF as u64 + 8, rkey, cas, new).signaled(),
                        &[Sge::new(base + pos as u64, 8, lkey)],
                    );
                    expect[i] = Expect::Atomic { pos, old: cas };
                    cas = new;
                }
                c.atomics += 1;
                i += 1;
            }
        }
        qp.post_send(&chain).map_err(|e| format!("post_send: {e}"))?;
        // Every WR is signaled: wait for the whole chain, then check what it returned.
        wait_sends(&mut scq, &mut wc[..i], &mut child, "mid-run")?;
        for w in &wc[..i] {
            if w.status != WcStatus::Success {
                c.errors += 1;
                return Err(format!(
                    "completion of WR {} failed: {:?} (after {} messages)",
                    w.wr_id, w.status, c.sends
                ));
            }
            match expect[w.wr_id as usize] {
                Expect::None => {}
                Expect::Read { pos, n, len } => {
                    region.read(pos, &mut buf[..len]);
                    if check(seed, n, &buf[..len], &mut scratch).is_some() {
                        c.read_mismatch += 1;
                    }
                }
                Expect::Atomic { pos, old } => {
                    region.read(pos, &mut buf[..8]);
                    if u64::from_ne_bytes(buf[..8].try_into().expect("8 bytes")) != old {
                        c.atomic_mismatch += 1;
                    }
                }
            }
        }
        if rss_start.is_none() && Instant::now() >= warm_up {
            rss_start = Some(rss_kib());
        }
        if last_check.elapsed() > Duration::from_millis(200) {
            last_check = Instant::now();
            if let Ok(Some(s)) = child.try_wait() {
                return Err(format!("the server process ended mid-run ({s})"));
            }
        }
    }
    // The end marker, with the number of receive-consuming messages.
    let mut end = [0u8; 16];
    end[..8].copy_from_slice(&END_MAGIC.to_le_bytes());
    end[8..].copy_from_slice(&m.to_le_bytes());
    region.write(0, &end);
    chain.clear();
    chain.push(SendWr::send(0).signaled(), &[Sge::new(mr.addr(), 16, lkey)]);
    qp.post_send(&chain).map_err(|e| format!("post_send: {e}"))?;
    // Wait for the marker's completion before waiting for the report: posted into a starved
    // SRQ it waits out RNR NAKs, and on shm only this process's CQ polls retry it (no hidden
    // threads). Blocked on the report instead, the client once hung CI with the marker never
    // sent and the server polling for it.
    wait_sends(&mut scq, &mut wc[..1], &mut child, "before the end marker was delivered")?;
    if wc[0].status != WcStatus::Success {
        return Err(format!("the end marker's completion failed: {:?}", wc[0].status));
    }
    let rss_end = rss_kib();
    let rss_start = rss_start.unwrap_or(rss_end);
    let line = lines.next().and_then(|l| l.ok()).ok_or("the server exited without its report")?;
    let status = child.wait().map_err(err_in("waiting for the server"))?;
    let v: Vec<&str> = line.split_whitespace().collect();
    let num = |k: &str| -> u64 {
        v.iter().position(|w| *w == k).and_then(|i| v.get(i + 1)?.parse().ok()).unwrap_or(u64::MAX)
    };
    let (got, corrupt, bad, starv) = (num("msgs"), num("corrupt"), num("bad_status"), num("starvations"));
    let (srss0, srss1) = (num("rss_start_kib"), num("rss_end_kib"));
    let lost = m.saturating_sub(got);
    let slack = args.rss_slack_mib * 1024;
    let grew = |a: u64, b: u64| b.saturating_sub(a) > slack;
    println!(
        "dp-soak: client sent {} receive-consuming messages, {} WRITE+READ pairs, {} atomics, {:.1} MB; {} errors, {} READ and {} atomic mismatches",
        c.sends, c.writes, c.atomics, c.bytes as f64 / 1e6, c.errors, c.read_mismatch, c.atomic_mismatch
    );
    println!(
        "dp-soak: server received {got}, lost {lost}, corrupted {corrupt}, failed completions {bad}, SRQ starved {starv} times"
    );
    println!("dp-soak: RSS KiB client {rss_start} -> {rss_end}, server {srss0} -> {srss1} (slack {slack})");
    let mut bad_things = Vec::new();
    if !status.success() {
        bad_things.push(format!("the server exited with {status}"));
    }
    if lost > 0 || got != m {
        bad_things.push(format!("{lost} lost ({got} of {m} received)"));
    }
    if corrupt > 0 || c.read_mismatch > 0 || c.atomic_mismatch > 0 {
        bad_things.push(format!(
            "{corrupt} corrupted messages, {} READ and {} atomic mismatches",
            c.read_mismatch, c.atomic_mismatch
        ));
    }
    if bad > 0 || c.errors > 0 {
        bad_things.push(format!("{} failed completions", bad + c.errors));
    }
    if grew(rss_start, rss_end) || grew(srss0, srss1) {
        bad_things.push("RSS grew beyond the slack".into());
    }
    drop(ctx);
    if bad_things.is_empty() {
        println!("dp-soak: ok");
        Ok(())
    } else {
        Err(bad_things.join("; "))
    }
}

//! `dp-pingpong`: the RC pingpong of rdma-core's `ibv_rc_pingpong`, on the `rdma` provider,
//! with its flags and its out-of-band exchange ([`dataplane::conn`]), so either side can be
//! rdma-core's program.
//!
//! Server: `dp-pingpong -d rxe1 -g 1`; client: `dp-pingpong -d rxe0 -g 1 SERVER`.
//! RC, UD with `--ud` (against `ibv_ud_pingpong`), or `-q` RC QPs on one SRQ with `--srq`
//! (against `ibv_srq_pingpong`). Flags of `ibv_rc_pingpong`: `-p -d -i -g -s -m -r -n`, and
//! `-c` (`--chk`, RC only): the received buffer is validated the way rdma-core does it; `-e`
//! (`--events`): wait for completion events on a completion channel instead of busy-polling.
//!
//! `--xrc`: XRC_SEND/XRC_RECV QPs into one XRC SRQ per process, compatible with
//! `ibv_xsrq_pingpong` (see `xrc.rs`; its `-c N` is `--clients N` here, as `-c` is `--chk`,
//! and its `-n` defaults to 5 there, 1000 here).
//!
//! `--provider shm` runs the same program on the shared-memory device (both processes on one
//! fabric, `--fabric`), so it can be tested without an RDMA device.

use clap::{Parser, ValueEnum};
use dataplane::conn;
use dataplane::mem::HugePolicy;
use dataplane::rdma::{Rdma, RdmaConfig};
use dataplane::shm::{Shm, ShmCompChannel, ShmConfig};
use dataplane::verbs::*;
use dataplane::{Context, Cq, MemRegion, Mr, Pd, Provider, Qp, QpInitAttr, Srq};
use std::net::TcpListener;
use std::time::{Duration, Instant};

mod xrc;

#[derive(Parser, Debug)]
#[command(about = "RC pingpong compatible with rdma-core's ibv_rc_pingpong")]
struct Args {
    /// TCP port of the exchange.
    #[arg(short = 'p', long, default_value_t = 18515)]
    port: u16,
    /// RDMA device (default: the first one).
    #[arg(short = 'd', long = "ib-dev")]
    ib_dev: Option<String>,
    /// Port of the device.
    #[arg(short = 'i', long = "ib-port", default_value_t = 1)]
    ib_port: u8,
    /// GID index (RoCE needs one; on rxe, 1 is RoCE v2 over IPv4).
    #[arg(short = 'g', long = "gid-idx", default_value_t = 0)]
    gid_idx: u8,
    /// Message size in bytes.
    #[arg(short = 's', long, default_value_t = 4096)]
    size: u32,
    /// Path MTU in bytes (256..4096; the port's active MTU if larger).
    #[arg(short = 'm', long, default_value_t = 1024)]
    mtu: u32,
    /// Receives kept posted.
    #[arg(short = 'r', long = "rx-depth", default_value_t = 500)]
    rx_depth: u32,
    /// Round trips.
    #[arg(short = 'n', long, default_value_t = 1000)]
    iters: u64,
    /// UD instead of RC, compatible with `ibv_ud_pingpong` (Q_Key 0x11111111, receives with a
    /// 40-byte GRH area in front of the payload; the size must fit the port MTU).
    #[arg(long, conflicts_with = "srq")]
    ud: bool,
    /// RC QPs sharing one SRQ, compatible with `ibv_srq_pingpong` (`-q` QPs).
    #[arg(long)]
    srq: bool,
    /// XRC: XRC_SEND and XRC_RECV QPs and an XRC SRQ, compatible with `ibv_xsrq_pingpong`
    /// (`-n` is then the number of messages per client).
    #[arg(long, conflicts_with_all = ["ud", "srq", "chk"])]
    xrc: bool,
    /// Clients the `--xrc` server takes (`ibv_xsrq_pingpong -c`).
    #[arg(long, default_value_t = 1, requires = "xrc")]
    clients: u32,
    /// Number of QPs with `--srq`.
    #[arg(short = 'q', long = "num-qp", default_value_t = 16)]
    num_qp: u32,
    /// Validate the received buffer, as `ibv_rc_pingpong --chk` does: both buffers start
    /// filled with 0x7b; the client sets the first byte of every page of its message to 0
    /// before sending; the server checks after the run that those bytes arrived ("invalid
    /// data in page N" for each that did not, and a failure exit).
    #[arg(short = 'c', long = "chk", conflicts_with_all = ["ud", "srq"])]
    chk: bool,
    /// Sleep on a completion channel until the CQ signals, instead of busy-polling (rdma-core's
    /// `-e`): arm the CQ, wait for its event, re-arm, then poll what completed.
    #[arg(short = 'e', long = "events")]
    events: bool,
    /// Provider: `rdma` (rdma-core's devices, the default) or `shm` (the shared-memory device).
    #[arg(long, value_enum, default_value = "rdma")]
    provider: ProviderKind,
    /// shm: the fabric both processes open (default: dp-pingpong-PORT, PORT being the TCP port).
    #[arg(long)]
    fabric: Option<String>,
    /// Server to connect to (none: be the server).
    server: Option<String>,
}

/// `--provider`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
#[allow(non_camel_case_types)]
enum ProviderKind {
    /// rdma-core's libibverbs.
    rdma,
    /// The shared-memory software NIC (processes of one host).
    shm,
}

/// What differs between the providers: opening the device, and the completion channel of
/// `-e`.
trait Device: Provider {
    /// A completion channel.
    type Channel;
    /// Opens the device `a` names.
    fn open_dev(a: &Args) -> Result<Self::Context>;
    /// Creates a completion channel and a CQ of `cqe` entries that signals it.
    fn cq_with_channel(ctx: &Self::Context, cqe: u32) -> Result<(Self::Cq, Self::Channel)>;
    /// Waits for the next event of `ch` (`ibv_get_cq_event`, and its acknowledgement).
    fn wait_event(ch: &Self::Channel) -> Result<()>;
}

/// Longest wait for one completion event: a peer that is gone is an error, not a hang.
const EVENT_TIMEOUT: Duration = Duration::from_secs(60);

impl Device for Shm {
    type Channel = ShmCompChannel;

    fn open_dev(a: &Args) -> Result<Self::Context> {
        let fabric = a.fabric.clone().unwrap_or_else(|| format!("dp-pingpong-{}", a.port));
        Shm::open(&ShmConfig { fabric, size: 64 << 20, huge: HugePolicy::default() })
    }

    fn cq_with_channel(ctx: &Self::Context, cqe: u32) -> Result<(Self::Cq, Self::Channel)> {
        let ch = ctx.create_comp_channel()?;
        Ok((ctx.create_cq_with_channel(cqe, &ch)?, ch))
    }

    fn wait_event(ch: &Self::Channel) -> Result<()> {
        match ch.get_cq_event(Some(EVENT_TIMEOUT))? {
            Some(_) => Ok(()), // one CQ: no need to look at which; shm events need no ack
            None => Err(Error::new(
                Errno::ETIMEDOUT,
                format!("no completion event for {} s (is the peer alive?)", EVENT_TIMEOUT.as_secs()),
            )),
        }
    }
}

impl Device for Rdma {
    type Channel = std::convert::Infallible;

    fn open_dev(a: &Args) -> Result<Self::Context> {
        Rdma::open(&RdmaConfig { device: a.ib_dev.clone(), port: a.ib_port, gid_index: a.gid_idx })
    }

    fn cq_with_channel(_: &Self::Context, _: u32) -> Result<(Self::Cq, Self::Channel)> {
        Err(Error::new(
            Errno::EOPNOTSUPP,
            "-e: the rdma provider has no completion-channel wrapper yet (ibv_create_comp_channel); \
             -e runs with --provider shm",
        ))
    }

    fn wait_event(ch: &Self::Channel) -> Result<()> {
        match *ch {}
    }
}

const RECV_WRID: u64 = 1;
const SEND_WRID: u64 = 2;
/// Connection messages `ibv_srq_pingpong` exchanges whatever its `-q` (its `MAX_QP`).
const SRQ_PP_MSGS: usize = 256;
/// Q_Key of `ibv_ud_pingpong`.
const UD_QKEY: u32 = 0x1111_1111;

/// The QPs `ibv_srq_pingpong`'s peer announced: its connection messages for unused QPs are
/// all zero.
fn peer_qps(remotes: &[Endpoint]) -> usize {
    remotes.iter().filter(|r| r.qpn != 0).count()
}

/// With `--srq`, both sides must run the same number of QPs: QP i talks to the peer's QP i,
/// and a missing one would be an all-zero route (EINVAL deep in `modify_qp`).
fn check_peer_qps(remotes: &[Endpoint], nq: usize) -> Result<()> {
    match peer_qps(remotes) {
        n if n == nq => Ok(()),
        n => Err(Error::new(Errno::EINVAL, format!("peer has {n} QPs, -q is {nq} (give both sides the same -q)"))),
    }
}

fn run<P: Device>(a: &Args) -> Result<()> {
    if a.xrc {
        return xrc::run::<P>(a);
    }
    if a.size == 0 || a.rx_depth == 0 || a.iters == 0 {
        return Err(Error::new(Errno::EINVAL, "size, rx-depth and iters must be > 0"));
    }
    let ctx = P::open_dev(a)?;
    let pd = ctx.alloc_pd()?;
    let grh = if a.ud { GRH_LEN as u32 } else { 0 };
    let buf_len = (a.size + grh) as usize;
    let region = ctx.alloc_region(buf_len)?;
    // rdma-core's pingpongs start from a buffer of 0x7b, which `--chk` relies on.
    region.fill(0, buf_len, 0x7b);
    let mr = pd.reg_mr(&region, 0, buf_len, AccessFlags::LOCAL_WRITE)?;
    let nq = if a.srq { a.num_qp.clamp(1, SRQ_PP_MSGS as u32) as usize } else { 1 };
    let (mut cq, channel) = if a.events {
        let (mut cq, ch) = P::cq_with_channel(&ctx, a.rx_depth + nq as u32)?;
        cq.req_notify(false)?; // armed before anything can complete, as rdma-core does
        (cq, Some(ch))
    } else {
        (ctx.create_cq(a.rx_depth + nq as u32)?, None)
    };
    let mut srq =
        if a.srq { Some(pd.create_srq(&SrqAttr { max_wr: a.rx_depth, max_sge: 1, srq_limit: 0 })?) } else { None };
    let cap = QpCaps {
        max_send_wr: 1,
        max_recv_wr: if a.srq { 0 } else { a.rx_depth },
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let mut qps = Vec::with_capacity(nq);
    for _ in 0..nq {
        let mut qp = pd.create_qp(&QpInitAttr {
            send_cq: &cq,
            recv_cq: &cq,
            srq: srq.as_ref(),
            cap,
            qp_type: if a.ud { QpType::Ud } else { QpType::Rc },
            sq_sig_all: false,
        })?;
        // INIT now, to post the receives before the exchange.
        qp.bring_up_to_init(&ConnectOpts { port_num: a.ib_port, qkey: UD_QKEY, ..Default::default() })?;
        qps.push(qp);
    }
    let sge = Sge::new(mr.addr() + u64::from(grh), a.size, mr.lkey());
    let recv = RecvChain::one(RECV_WRID, &[Sge::new(mr.addr(), a.size + grh, mr.lkey())]);
    let mut post_recv = |qps: &mut Vec<P::Qp>| -> Result<()> {
        let r = match srq.as_mut() {
            Some(srq) => srq.post_recv(&recv),
            None => qps[0].post_recv(&recv),
        };
        r.map_err(|e| Error::new(e.errno, format!("post_recv: {e}")))
    };
    for _ in 0..a.rx_depth {
        post_recv(&mut qps)?;
    }
    let base_psn = std::process::id() & 0xff_ffff;
    let psn = |i: usize| (base_psn + i as u32 * 0x1000) & 0xff_ffff;
    let mut locals = Vec::with_capacity(nq);
    for (i, qp) in qps.iter_mut().enumerate() {
        if a.ud {
            qp.ready(&ConnectOpts { sq_psn: psn(i), ..Default::default() })?;
        }
        let mut local = qp.endpoint(a.gid_idx)?;
        local.psn = psn(i);
        println!(
            "  local address:  LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}, GID {}",
            local.lid,
            local.qpn,
            local.psn,
            gid_str(&local.gid)
        );
        locals.push(local);
    }
    let ah_attr = |r: &Endpoint| AhAttr {
        dlid: r.lid,
        is_global: r.gid != [0; 16],
        dgid: r.gid,
        sgid_index: a.gid_idx,
        hop_limit: 1,
        port_num: a.ib_port,
        ..Default::default()
    };
    let connect = |qps: &mut Vec<P::Qp>, remotes: &[Endpoint]| -> Result<()> {
        if a.ud {
            return Ok(());
        }
        for (i, (qp, r)) in qps.iter_mut().zip(remotes).enumerate() {
            // rdma-core's pingpongs' attributes: RNR timer 12, timeout 14, 7 retries.
            let peer = PeerAddr { qpn: r.qpn, psn: r.psn, ah: ah_attr(r) };
            let opts = ConnectOpts { port_num: a.ib_port, path_mtu: a.mtu, sq_psn: psn(i), ..Default::default() };
            qp.connect(&peer, &opts)?;
        }
        Ok(())
    };
    // ibv_srq_pingpong always exchanges MAX_QP (256) messages, unused ones zero.
    let mut wire = locals.clone();
    if a.srq {
        wire.resize(SRQ_PP_MSGS.max(nq), Endpoint::default());
    }
    let mut remotes = match &a.server {
        Some(host) => {
            let r = conn::client_exchange_many(host, a.port, &wire)?;
            if a.srq {
                check_peer_qps(&r, nq)?;
            }
            connect(&mut qps, &r)?;
            r
        }
        None => {
            let l = TcpListener::bind(("0.0.0.0", a.port))
                .map_err(|e| Error::new(Errno::EIO, format!("cannot listen on port {}: {e}", a.port)))?;
            // On a -q mismatch this side still answers (so the client sees it too), connects
            // nothing, and reports the mismatch rather than the client's hang-up that follows.
            let mut mismatch = None;
            let r = conn::server_exchange_many(&l, &wire, |r| match check_peer_qps(r, nq) {
                Err(e) if a.srq => {
                    mismatch = Some(e);
                    Ok(())
                }
                _ => connect(&mut qps, r),
            });
            match (r, mismatch) {
                (_, Some(e)) => return Err(e),
                (r, None) => r?,
            }
        }
    };
    remotes.truncate(nq);
    for r in &remotes {
        println!(
            "  remote address: LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}, GID {}",
            r.lid,
            r.qpn,
            r.psn,
            gid_str(&r.gid)
        );
    }

    let ah = if a.ud { Some(pd.create_ah(&ah_attr(&remotes[0]))?) } else { None };
    let mut wr = SendWr::send(SEND_WRID).signaled();
    if let Some(ah) = &ah {
        wr = wr.to(dataplane::Ah::handle(ah), remotes[0].qpn, UD_QKEY);
    }
    let send = SendChain::one(wr, &[sge]);
    let post_send = |qp: &mut P::Qp| qp.post_send(&send).map_err(|e| Error::new(e.errno, format!("post_send: {e}")));
    let page = page_size();
    if a.chk && a.server.is_some() {
        for off in (0..a.size as usize).step_by(page) {
            region.write(off, &[0]);
        }
    }
    let start = Instant::now();
    let (mut scnt, mut rcnt) = (0u64, 0u64);
    let mut posted_recvs = a.rx_depth;
    let mut pending = vec![RECV_WRID; nq];
    if a.server.is_some() {
        for (qp, p) in qps.iter_mut().zip(&mut pending) {
            post_send(qp)?;
            *p |= SEND_WRID;
        }
    }
    let mut wc = [WorkCompletion::default(); 16];
    let mut n = 0;
    while rcnt < a.iters || scnt < a.iters {
        if let (Some(ch), 0) = (&channel, n) {
            // The last poll found the CQ empty: sleep until it signals, re-arm, then poll
            // (a completion between the re-arm and the poll is seen by the poll; one after it
            // signals again).
            P::wait_event(ch)?;
            cq.req_notify(false)?;
        }
        n = cq.poll(&mut wc)?;
        for w in &wc[..n] {
            if w.status != WcStatus::Success {
                return Err(Error::new(
                    Errno::EIO,
                    format!("completion with status {} for wr_id {}", w.status.as_str(), w.wr_id),
                ));
            }
            let Some(i) = qps.iter().position(|q| q.qp_num() == w.qp_num) else {
                return Err(Error::new(Errno::EIO, format!("completion for unknown QP {:#x}", w.qp_num)));
            };
            match w.wr_id {
                SEND_WRID => scnt += 1,
                RECV_WRID => {
                    rcnt += 1;
                    posted_recvs -= 1;
                    if posted_recvs <= nq as u32 + a.rx_depth / 2 {
                        while posted_recvs < a.rx_depth {
                            post_recv(&mut qps)?;
                            posted_recvs += 1;
                        }
                    }
                }
                other => return Err(Error::new(Errno::EIO, format!("completion for unknown wr_id {other}"))),
            }
            pending[i] &= !w.wr_id;
            if pending[i] == 0 && scnt < a.iters {
                post_send(&mut qps[i])?;
                pending[i] = RECV_WRID | SEND_WRID;
            }
        }
    }
    let secs = start.elapsed().as_secs_f64();
    if a.chk && a.server.is_none() {
        let mut invalid = 0;
        for off in (0..a.size as usize).step_by(page) {
            let mut b = [0u8];
            region.read(off, &mut b);
            if b[0] != 0 {
                println!("invalid data in page {}", off / page);
                invalid += 1;
            }
        }
        if invalid > 0 {
            return Err(Error::new(Errno::EIO, format!("--chk: {invalid} page(s) of the received buffer are invalid")));
        }
    }
    let bytes = a.size as u64 * a.iters * 2;
    println!("{bytes} bytes in {secs:.2} seconds = {:.2} Mbit/sec", bytes as f64 * 8.0 / secs / 1e6);
    println!("{} iters in {secs:.2} seconds = {:.2} usec/iter", a.iters, secs * 1e6 / a.iters as f64);
    drop(qps);
    drop(ah);
    Ok(())
}

/// The system page size (`--chk` marks one byte per page, as rdma-core does).
fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions; it returns -1 on error, handled below.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(n).ok().filter(|&n| n > 0).unwrap_or(4096)
}

fn gid_str(g: &[u8; 16]) -> String {
    g.chunks(2).map(|c| format!("{:02x}{:02x}", c[0], c[1])).collect::<Vec<_>>().join(":")
}

fn main() {
    dataplane_apps::logging::init();
    let args = Args::parse();
    let r = match args.provider {
        ProviderKind::rdma => run::<Rdma>(&args),
        ProviderKind::shm => run::<Shm>(&args),
    };
    if let Err(e) = r {
        eprintln!("dp-pingpong: {e}");
        std::process::exit(1);
    }
}

//! Provider-generic scaffolding for the conformance suite: nodes, connected QP pairs, and
//! polling with a liveness deadline (a hang fails the test instead of stalling CI; it is not a
//! timing assertion).

use dataplane::verbs::*;
use dataplane::{Context, Cq, MemRegion, Mr, Pd, Provider, Qp, QpInitAttr};
use std::time::{Duration, Instant};

/// How the suite opens devices of one provider.
pub trait Harness: 'static {
    /// The provider under test.
    type P: Provider;
    /// The device config for node `node` (0 or 1) of test `test`.
    fn config(test: &str, node: usize) -> <Self::P as Provider>::Config;
    /// GID index to use.
    fn gid_index() -> u8 {
        0
    }
    /// Why a case cannot pass on this provider, if it cannot (printed; the case is then not
    /// run and says so by name).
    /// The multicast group the mcast cases use: ff0e::1:1 by default; RoCE v2 over IPv4 (the
    /// rdma harness's GID index 1) needs an IPv4-mapped group.
    fn mcast_gid() -> [u8; 16] {
        [0xff, 0x0e, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1]
    }
    fn unsupported(_case: &str) -> Option<&'static str> {
        None
    }
    /// Whether the provider finds bad local SGEs (unknown lkey, lkey of another PD, range
    /// outside its MR, receive MR without LOCAL_WRITE) at post time — `shm`: EINVAL and
    /// `bad_wr`, as the seed allows ("the first failure that can be detected immediately") —
    /// or only when the WQE executes, as a completion error (mlx5, rxe). Cases accept either,
    /// according to this.
    fn sge_checked_at_post() -> bool {
        true
    }
}

pub type Ctx<H> = <<H as Harness>::P as Provider>::Context;
pub type PdOf<H> = <<H as Harness>::P as Provider>::Pd;
pub type MrOf<H> = <<H as Harness>::P as Provider>::Mr;
pub type CqOf<H> = <<H as Harness>::P as Provider>::Cq;
pub type QpOf<H> = <<H as Harness>::P as Provider>::Qp;
pub type SrqOf<H> = <<H as Harness>::P as Provider>::Srq;
pub type RegionOf<H> = <<H as Harness>::P as Provider>::Region;

/// Liveness deadline for anything the suite waits for.
pub const DEADLINE: Duration = Duration::from_secs(20);

/// One "host": a context with a PD, a registered buffer and two CQs.
pub struct Node<H: Harness> {
    pub ctx: Ctx<H>,
    pub pd: PdOf<H>,
    pub region: RegionOf<H>,
    pub mr: MrOf<H>,
    pub scq: CqOf<H>,
    pub rcq: CqOf<H>,
}

/// Size of each node's registered buffer.
pub const BUF: usize = 1 << 20;

impl<H: Harness> Node<H> {
    pub fn open(test: &str, node: usize) -> Node<H> {
        Self::open_with(
            test,
            node,
            AccessFlags::LOCAL_WRITE
                | AccessFlags::REMOTE_WRITE
                | AccessFlags::REMOTE_READ
                | AccessFlags::REMOTE_ATOMIC,
        )
    }

    pub fn open_with(test: &str, node: usize, access: AccessFlags) -> Node<H> {
        let ctx = H::P::open(&H::config(test, node)).expect("open device");
        let pd = ctx.alloc_pd().expect("alloc_pd");
        let region = ctx.alloc_region(BUF).expect("alloc_region");
        let mr = pd.reg_mr(&region, 0, BUF, access).expect("reg_mr");
        let scq = ctx.create_cq(256).expect("create_cq");
        let rcq = ctx.create_cq(256).expect("create_cq");
        Node { ctx, pd, region, mr, scq, rcq }
    }

    /// Address of byte `off` of the buffer.
    pub fn addr(&self, off: usize) -> u64 {
        self.mr.addr() + off as u64
    }

    /// An SGE over `len` bytes at `off`.
    pub fn sge(&self, off: usize, len: u32) -> Sge {
        Sge::new(self.addr(off), len, self.mr.lkey())
    }

    pub fn qp(&self, qp_type: QpType, cap: QpCaps, srq: Option<&SrqOf<H>>, sig_all: bool) -> QpOf<H> {
        self.try_qp(qp_type, cap, srq, sig_all).expect("create_qp")
    }

    pub fn try_qp(&self, qp_type: QpType, cap: QpCaps, srq: Option<&SrqOf<H>>, sig_all: bool) -> Result<QpOf<H>> {
        self.pd.create_qp(&QpInitAttr {
            send_cq: &self.scq,
            recv_cq: &self.rcq,
            srq,
            cap,
            qp_type,
            sq_sig_all: sig_all,
        })
    }

    pub fn write(&self, off: usize, data: &[u8]) {
        self.region.write(off, data)
    }

    pub fn read(&self, off: usize, len: usize) -> Vec<u8> {
        let mut v = vec![0; len];
        self.region.read(off, &mut v);
        v
    }
}

/// Connection parameters used by `connect`.
#[derive(Clone, Copy)]
pub struct ConnOpts {
    pub rnr_retry: u8,
    pub retry_cnt: u8,
    pub min_rnr_timer: u8,
    pub timeout: u8,
    pub access: AccessFlags,
}

impl Default for ConnOpts {
    fn default() -> Self {
        ConnOpts {
            rnr_retry: 7,
            retry_cnt: 7,
            min_rnr_timer: 1,
            timeout: 14,
            access: AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC,
        }
    }
}

pub fn to_init<Q: Qp>(qp: &mut Q, qkey: u32, access: AccessFlags) {
    qp.modify(&QpAttr { state: QpState::Init, qkey, access, ..Default::default() }).expect("RESET->INIT");
}

/// The route the cases use to reach `remote`: global (RoCE needs the GRH), one hop, port 1.
pub fn peer_addr(remote: &Endpoint) -> PeerAddr {
    let ah =
        AhAttr { dlid: remote.lid, is_global: true, dgid: remote.gid, port_num: 1, hop_limit: 1, ..Default::default() };
    PeerAddr { qpn: remote.qpn, psn: remote.psn, ah }
}

impl ConnOpts {
    /// The provider API's bring-up options for these.
    pub fn connect_opts(&self) -> ConnectOpts {
        ConnectOpts {
            access: self.access,
            min_rnr_timer: self.min_rnr_timer,
            timeout: self.timeout,
            retry_cnt: self.retry_cnt,
            rnr_retry: self.rnr_retry,
            ..Default::default()
        }
    }
}

/// Moves `qp` to RTR towards `remote` only (cases that look at RTR itself; everything else
/// uses [`bring_up`]).
pub fn to_rtr<Q: Qp>(qp: &mut Q, remote: &Endpoint, o: &ConnOpts) {
    let peer = peer_addr(remote);
    qp.modify(&QpAttr {
        state: QpState::Rtr,
        dest_qp_num: peer.qpn,
        rq_psn: peer.psn,
        ah: peer.ah,
        min_rnr_timer: o.min_rnr_timer,
        ..Default::default()
    })
    .expect("INIT->RTR");
}

/// RTR -> RTS with `o`'s timeout and retries.
pub fn to_rts<Q: Qp>(qp: &mut Q, o: &ConnOpts) {
    qp.modify(&QpAttr {
        state: QpState::Rts,
        rnr_retry: o.rnr_retry,
        retry_cnt: o.retry_cnt,
        timeout: o.timeout,
        ..Default::default()
    })
    .expect("RTR->RTS");
}

/// Brings `qp` (RESET or INIT) to RTS towards `remote`: `Qp::connect`, the provider API's
/// one-call bring-up.
pub fn bring_up<Q: Qp>(qp: &mut Q, remote: &Endpoint, o: &ConnOpts) {
    qp.connect(&peer_addr(remote), &o.connect_opts()).expect("connect (RESET/INIT -> RTS)");
}

/// Brings two connected QPs (RC or UC) to RTS, pointing at each other.
pub fn connect<H: Harness>(a: &mut QpOf<H>, b: &mut QpOf<H>, o: &ConnOpts) {
    let (ea, eb) = (a.endpoint(H::gid_index()).unwrap(), b.endpoint(H::gid_index()).unwrap());
    bring_up(a, &eb, o);
    bring_up(b, &ea, o);
}

/// Brings a UD QP to RTS with `qkey`.
pub fn ud_ready<Q: Qp>(qp: &mut Q, qkey: u32) {
    qp.ready(&ConnectOpts { qkey, ..Default::default() }).expect("ready (RESET/INIT -> RTS)");
}

/// Polls until `n` completions arrived (or the liveness deadline passes: test failure).
pub fn poll_n<C: Cq>(cq: &mut C, n: usize) -> Vec<WorkCompletion> {
    poll_n_or_say(cq, n, String::new)
}

/// [`poll_n`], whose failure also says `what` (evaluated only then): what the test can still
/// read at that point, such as the QPs' states, tells a requester that stalled from
/// completions that were lost.
pub fn poll_n_or_say<C: Cq>(cq: &mut C, n: usize, what: impl Fn() -> String) -> Vec<WorkCompletion> {
    let mut out = Vec::with_capacity(n);
    let mut wc = [WorkCompletion::default(); 32];
    let end = Instant::now() + DEADLINE;
    while out.len() < n {
        let got = cq.poll(&mut wc[..(n - out.len()).min(32)]).expect("poll_cq");
        out.extend_from_slice(&wc[..got]);
        if got == 0 {
            assert!(
                Instant::now() < end,
                "waited {DEADLINE:?} for {n} completions, got {}: {out:?} {}",
                out.len(),
                what()
            );
            std::thread::yield_now();
        }
    }
    out
}

/// Polls once more for a short while and asserts nothing arrives.
pub fn assert_no_completion<C: Cq>(cq: &mut C) {
    let mut wc = [WorkCompletion::default(); 8];
    let end = Instant::now() + Duration::from_millis(50);
    while Instant::now() < end {
        let got = cq.poll(&mut wc).expect("poll_cq");
        assert_eq!(got, 0, "unexpected completion {:?}", &wc[..got]);
        std::thread::yield_now();
    }
}

/// Posts one receive of `len` bytes at `off` on a QP.
pub fn recv<H: Harness>(qp: &mut QpOf<H>, node: &Node<H>, wr_id: u64, off: usize, len: u32) {
    qp.post_recv(&RecvChain::one(wr_id, &[node.sge(off, len)])).expect("post_recv");
}

/// Posts one signaled SEND of `len` bytes at `off`.
pub fn send<H: Harness>(qp: &mut QpOf<H>, node: &Node<H>, wr_id: u64, off: usize, len: u32) {
    qp.post_send(&SendChain::one(SendWr::send(wr_id).signaled(), &[node.sge(off, len)])).expect("post_send");
}

/// An RC (or UC) pair on two nodes with default caps, connected.
pub struct Pair<H: Harness> {
    pub a: Node<H>,
    pub b: Node<H>,
    pub qa: QpOf<H>,
    pub qb: QpOf<H>,
}

pub fn pair<H: Harness>(test: &str, qp_type: QpType, cap: QpCaps, o: ConnOpts) -> Pair<H> {
    let a = Node::<H>::open(test, 0);
    let b = Node::<H>::open(test, 1);
    let mut qa = a.qp(qp_type, cap, None, false);
    let mut qb = b.qp(qp_type, cap, None, false);
    connect::<H>(&mut qa, &mut qb, &o);
    Pair { a, b, qa, qb }
}

pub fn rc_pair<H: Harness>(test: &str) -> Pair<H> {
    pair::<H>(test, QpType::Rc, QpCaps { max_send_sge: 4, max_recv_sge: 4, ..Default::default() }, ConnOpts::default())
}

// ---- Helpers added for the cases (cases.rs). ----

pub type AhOf<H> = <<H as Harness>::P as Provider>::Ah;

/// Q_Key the UD cases use.
pub const QKEY: u32 = 0x1111_2222;

/// Polls one completion.
pub fn poll_one<C: Cq>(cq: &mut C) -> WorkCompletion {
    poll_n(cq, 1)[0]
}

/// Asserts a post failed with `errno` at work request `bad_wr`.
#[track_caller]
pub fn expect_post_err(r: std::result::Result<(), PostError>, errno: Errno, bad_wr: usize) {
    match r {
        Ok(()) => panic!("post succeeded; expected {errno} at work request {bad_wr}"),
        Err(e) => assert_eq!((e.errno, e.bad_wr), (errno, bad_wr), "unexpected post error: {e}"),
    }
}

/// A connected pair with explicit caps, options and `sq_sig_all` on both QPs.
pub fn pair_full<H: Harness>(test: &str, qp_type: QpType, cap: QpCaps, o: ConnOpts, sig_all: bool) -> Pair<H> {
    let a = Node::<H>::open(test, 0);
    let b = Node::<H>::open(test, 1);
    let mut qa = a.qp(qp_type, cap, None, sig_all);
    let mut qb = b.qp(qp_type, cap, None, sig_all);
    connect::<H>(&mut qa, &mut qb, &o);
    Pair { a, b, qa, qb }
}

/// An RC pair with 4 SGEs per request and connection options `o`.
pub fn rc_pair_with<H: Harness>(test: &str, o: ConnOpts) -> Pair<H> {
    pair::<H>(test, QpType::Rc, QpCaps { max_send_sge: 4, max_recv_sge: 4, ..Default::default() }, o)
}

/// Moves both QPs of a pair to RESET and connects them again (fresh PSNs on both sides).
pub fn reconnect<H: Harness>(p: &mut Pair<H>, o: &ConnOpts) {
    let reset = QpAttr { state: QpState::Reset, ..Default::default() };
    p.qa.modify(&reset).expect("->RESET");
    p.qb.modify(&reset).expect("->RESET");
    connect::<H>(&mut p.qa, &mut p.qb, o);
}

/// An address handle on `from` for the port of `to`.
pub fn ah_to<H: Harness>(from: &Node<H>, to: &Endpoint, global: bool) -> Result<AhOf<H>> {
    from.pd.create_ah(&AhAttr {
        dlid: to.lid,
        is_global: global,
        dgid: to.gid,
        port_num: 1,
        hop_limit: 64,
        ..Default::default()
    })
}

/// Two UD QPs at RTS on two nodes (Q_Key [`QKEY`]) and a global AH from `a` to `b`.
pub struct UdPair<H: Harness> {
    pub a: Node<H>,
    pub b: Node<H>,
    pub qa: QpOf<H>,
    pub qb: QpOf<H>,
    pub ah: AhOf<H>,
}

pub fn ud_pair<H: Harness>(test: &str) -> UdPair<H> {
    let a = Node::<H>::open(test, 0);
    let b = Node::<H>::open(test, 1);
    let cap = QpCaps { max_send_sge: 4, max_recv_sge: 4, ..Default::default() };
    let mut qa = a.qp(QpType::Ud, cap, None, false);
    let mut qb = b.qp(QpType::Ud, cap, None, false);
    ud_ready(&mut qa, QKEY);
    ud_ready(&mut qb, QKEY);
    let ah = ah_to::<H>(&a, &qb.endpoint(H::gid_index()).unwrap(), true).expect("create_ah");
    UdPair { a, b, qa, qb, ah }
}

/// A signaled UD SEND work request to `qpn` with `qkey` through `ah`.
pub fn ud_send_wr<H: Harness>(ah: &AhOf<H>, qpn: u32, qkey: u32, wr_id: u64) -> SendWr {
    SendWr::send(wr_id).to(dataplane::Ah::handle(ah), qpn, qkey).signaled()
}

/// Every asynchronous event available now.
pub fn events_now<H: Harness>(ctx: &Ctx<H>) -> Vec<AsyncEvent> {
    std::iter::from_fn(|| ctx.poll_async_event()).collect()
}

/// Waits for an event of `kind` (liveness deadline); returns it and any other events seen.
pub fn wait_event<H: Harness>(ctx: &Ctx<H>, kind: AsyncEventKind) -> (AsyncEvent, Vec<AsyncEvent>) {
    let end = Instant::now() + DEADLINE;
    let mut others = Vec::new();
    loop {
        match ctx.poll_async_event() {
            Some(e) if e.kind == kind => return (e, others),
            Some(e) => others.push(e),
            None => {
                assert!(Instant::now() < end, "waited {DEADLINE:?} for async event {kind:?}; saw {others:?}");
                std::thread::yield_now();
            }
        }
    }
}

/// A byte pattern derived from `seed`, `len` bytes long.
pub fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| seed.wrapping_mul(31).wrapping_add(i as u8).wrapping_mul(7) ^ 0x5a).collect()
}

/// Posts a one-WR chain whose only fault is a bad local SGE and checks it is refused: EINVAL at
/// bad_wr 0 where SGEs are checked at post time, else a completion error (the pair is then
/// reconnected so the case can go on).
#[track_caller]
pub fn expect_bad_local_sge<H: Harness>(p: &mut Pair<H>, c: &SendChain) {
    let r = p.qa.post_send(c);
    if H::sge_checked_at_post() {
        expect_post_err(r, Errno::EINVAL, 0);
    } else {
        r.expect("post_send (SGEs are checked when the WQE executes)");
        let s = poll_one(&mut p.a.scq);
        assert_ne!(s.status, WcStatus::Success, "a bad local SGE completed successfully");
        reconnect::<H>(p, &ConnOpts::default());
    }
}

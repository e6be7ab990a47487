//! XRC: the XRC_SEND column of the `ibv_post_send(3)` opcode table, `remote_srqn` routing,
//! the domain check, and the SRQ notes on an XRC SRQ.
//!
//! The layout of every case is `ibv_xsrq_pingpong`'s: node `a` has an XRC_SEND QP; node `b`
//! has an XRC domain, XRC SRQs in it (on `b`'s PD, completing on a CQ of `b`), and an XRC_RECV
//! QP of that domain connected to `a`'s XRC_SEND QP.

use crate::harness::*;
use dataplane::verbs::*;
use dataplane::{Context, Mr, Pd, Provider, Qp, Srq, Xrcd};

pub type XrcdOf<H> = <<H as Harness>::P as Provider>::Xrcd;

const RX: usize = 64 << 10;

/// One XRC connection into an XRC SRQ. Fields drop in order: QPs, SRQ, domain, nodes.
pub struct XrcConn<H: Harness> {
    pub qs: QpOf<H>,
    pub qr: QpOf<H>,
    pub srq: SrqOf<H>,
    pub xrcd: XrcdOf<H>,
    pub a: Node<H>,
    pub b: Node<H>,
}

fn srq_attr(max_wr: u32) -> SrqAttr {
    SrqAttr { max_wr, max_sge: 1, srq_limit: 0 }
}

/// An XRC_SEND QP on `a` connected to a new XRC_RECV QP of `xrcd` (on `b`).
fn xrc_qps<H: Harness>(a: &Node<H>, xrcd: &XrcdOf<H>) -> (QpOf<H>, QpOf<H>) {
    let mut qs = a.qp(QpType::XrcSend, QpCaps { max_send_sge: 4, ..Default::default() }, None, false);
    let mut qr = xrcd.create_recv_qp().expect("create XRC_RECV QP");
    assert_eq!((qs.qp_type(), qr.qp_type()), (QpType::XrcSend, QpType::XrcRecv));
    connect::<H>(&mut qs, &mut qr, &ConnOpts::default());
    (qs, qr)
}

fn xrc_conn<H: Harness>(t: &str, max_wr: u32) -> XrcConn<H> {
    let a = Node::<H>::open(t, 0);
    let b = Node::<H>::open(t, 1);
    let xrcd = b.ctx.open_xrcd().expect("open_xrcd");
    let srq = b.pd.create_srq_xrc(&srq_attr(max_wr), &xrcd, &b.rcq).expect("create XRC SRQ");
    let (qs, qr) = xrc_qps::<H>(&a, &xrcd);
    XrcConn { qs, qr, srq, xrcd, a, b }
}

fn post_srq<H: Harness>(srq: &mut SrqOf<H>, b: &Node<H>, wr_id: u64, off: usize, len: u32) {
    srq.post_recv(&RecvChain::one(wr_id, &[b.sge(off, len)])).expect("post_srq_recv");
}

/// The seed table's XRC_SEND column, written out independently of the model: every opcode
/// but TSO.
fn seed_xrc_send_allows(op: WrOpcode) -> bool {
    use WrOpcode::*;
    match op {
        Send | SendWithImm | RdmaWrite | RdmaWriteWithImm | RdmaRead | AtomicCmpAndSwp | AtomicFetchAndAdd
        | LocalInv | BindMw | SendWithInv => true,
        Tso => false,
    }
}

/// ibv_post_send(3) opcode table, XRC_SEND column. What the column refuses (TSO) fails at post
/// time with EINVAL and bad_wr behind a good SEND, which is delivered. SEND, SEND_WITH_IMM,
/// RDMA_WRITE, RDMA_WRITE_WITH_IMM, RDMA_READ and both atomics work through the XRC_RECV QP:
/// receives come from the XRC SRQ and complete on its CQ with `qp_num` the XRC_RECV QP's;
/// one-sided operations reach memory of the SRQ's PD. (LOCAL_INV, BIND_MW and SEND_WITH_INV
/// need memory windows, an shm-only API here: `xrc_memory_window_opcodes`.)
pub fn xrc_send_opcode_column<H: Harness>(t: &str) {
    let mut x = xrc_conn::<H>(t, 64);
    let srqn = x.srq.srq_num();
    let tgt = x.qr.qp_num();
    let (base, rkey0) = (x.b.addr(0), x.b.mr.rkey());
    let remote = move |off: usize| (base + off as u64, rkey0);
    let mut n = 0u64;
    for op in WrOpcode::ALL.into_iter().filter(|op| !seed_xrc_send_allows(*op)) {
        post_srq(&mut x.srq, &x.b, n, RX + n as usize * 128, 128);
        let mut bad = SendWr::with_opcode(1000 + n, op).xrc_srqn(srqn);
        (bad.remote_addr, bad.rkey) = remote(RX);
        let mut c = SendChain::new();
        c.push(SendWr::send(n).signaled().xrc_srqn(srqn), &[x.a.sge(0, 8)]);
        c.push(bad, &[x.a.sge(64, 8)]);
        let e = x.qs.post_send(&c).expect_err(op.name());
        assert_eq!((e.errno, e.bad_wr), (Errno::EINVAL, 1), "{} on XRC_SEND: {e}", op.name());
        let s = poll_one(&mut x.a.scq);
        assert_eq!((s.wr_id, s.status), (n, WcStatus::Success));
        let r = poll_one(&mut x.b.rcq);
        assert_eq!((r.wr_id, r.status, r.byte_len, r.qp_num), (n, WcStatus::Success, 8, tgt), "{}", op.name());
        n += 1;
    }
    assert_eq!(n, 1, "the XRC_SEND column refuses TSO only");

    // SEND and SEND_WITH_IMM consume an SRQ receive.
    for (i, op) in [WrOpcode::Send, WrOpcode::SendWithImm].into_iter().enumerate() {
        let id = 10 + i as u64;
        post_srq(&mut x.srq, &x.b, id, RX + 4096, 128);
        x.a.write(0, &pattern(id as u8, 32));
        let mut wr = SendWr::with_opcode(id, op).signaled().xrc_srqn(srqn);
        wr.imm_data = 0xfeed_0000 | id as u32;
        x.qs.post_send(&SendChain::one(wr, &[x.a.sge(0, 32)])).unwrap_or_else(|e| panic!("{}: {e}", op.name()));
        let s = poll_one(&mut x.a.scq);
        assert_eq!((s.wr_id, s.status, s.opcode), (id, WcStatus::Success, WcOpcode::Send), "{}", op.name());
        let r = poll_one(&mut x.b.rcq);
        assert_eq!((r.wr_id, r.status, r.opcode, r.qp_num), (id, WcStatus::Success, WcOpcode::Recv, tgt));
        assert_eq!(r.wc_flags.contains(WcFlags::WITH_IMM), op == WrOpcode::SendWithImm);
        if op == WrOpcode::SendWithImm {
            assert_eq!(r.imm_data, wr.imm_data);
        }
        assert_eq!(x.b.read(RX + 4096, 32), pattern(id as u8, 32), "{}", op.name());
    }

    // RDMA_WRITE lands in memory of the SRQ's PD and consumes no receive.
    x.a.write(256, &pattern(20, 64));
    let (addr, rkey) = remote(RX + 8192);
    x.qs.post_send(&SendChain::one(SendWr::write(20, addr, rkey).signaled().xrc_srqn(srqn), &[x.a.sge(256, 64)]))
        .expect("RDMA_WRITE");
    let s = poll_one(&mut x.a.scq);
    assert_eq!((s.wr_id, s.status, s.opcode), (20, WcStatus::Success, WcOpcode::RdmaWrite));
    assert_eq!(x.b.read(RX + 8192, 64), pattern(20, 64));
    assert_no_completion(&mut x.b.rcq);

    // RDMA_WRITE_WITH_IMM lands and consumes one.
    post_srq(&mut x.srq, &x.b, 21, RX + 4096, 128);
    x.a.write(256, &pattern(21, 64));
    let wr = SendWr::write_with_imm(21, addr, rkey, 0xabcd).signaled().xrc_srqn(srqn);
    x.qs.post_send(&SendChain::one(wr, &[x.a.sge(256, 64)])).expect("RDMA_WRITE_WITH_IMM");
    assert_eq!(poll_one(&mut x.a.scq).status, WcStatus::Success);
    let r = poll_one(&mut x.b.rcq);
    assert_eq!((r.wr_id, r.opcode, r.imm_data, r.qp_num), (21, WcOpcode::RecvRdmaWithImm, 0xabcd, tgt));
    assert_eq!(x.b.read(RX + 8192, 64), pattern(21, 64));

    // RDMA_READ brings the target's bytes back.
    x.b.write(RX + 12288, &pattern(22, 48));
    let (addr, rkey) = remote(RX + 12288);
    x.qs.post_send(&SendChain::one(SendWr::read(22, addr, rkey).signaled().xrc_srqn(srqn), &[x.a.sge(512, 48)]))
        .expect("RDMA_READ");
    let s = poll_one(&mut x.a.scq);
    assert_eq!((s.wr_id, s.status, s.opcode, s.byte_len), (22, WcStatus::Success, WcOpcode::RdmaRead, 48));
    assert_eq!(x.a.read(512, 48), pattern(22, 48));

    // Both atomics on an aligned word of the target.
    x.b.write(RX + 16384, &40u64.to_ne_bytes());
    let (addr, rkey) = remote(RX + 16384);
    let fa = SendWr::fetch_add(23, addr, rkey, 2).signaled().xrc_srqn(srqn);
    x.qs.post_send(&SendChain::one(fa, &[x.a.sge(1024, 8)])).expect("FETCH_AND_ADD");
    let s = poll_one(&mut x.a.scq);
    assert_eq!((s.wr_id, s.status, s.opcode), (23, WcStatus::Success, WcOpcode::FetchAdd));
    assert_eq!(x.a.read(1024, 8), 40u64.to_ne_bytes());
    let cs = SendWr::cmp_swap(24, addr, rkey, 42, 7).signaled().xrc_srqn(srqn);
    x.qs.post_send(&SendChain::one(cs, &[x.a.sge(1032, 8)])).expect("CMP_AND_SWP");
    let s = poll_one(&mut x.a.scq);
    assert_eq!((s.wr_id, s.status, s.opcode), (24, WcStatus::Success, WcOpcode::CompSwap));
    assert_eq!(x.a.read(1032, 8), 42u64.to_ne_bytes());
    assert_eq!(x.b.read(RX + 16384, 8), 7u64.to_ne_bytes());
    assert_no_completion(&mut x.b.rcq);
    assert_eq!((x.qs.state(), x.qr.state()), (QpState::Rts, QpState::Rts));
}

/// `wr.qp_type.xrc.remote_srqn` picks the SRQ: one XRC_SEND QP sends alternately to two XRC
/// SRQs of the domain, each with its own CQ, and every message lands in a buffer of the SRQ it
/// named and completes on that SRQ's CQ. A second XRC connection (another XRC_SEND QP and
/// XRC_RECV QP) into the same SRQ shares its receives, and its completions carry its own
/// XRC_RECV QP's number: one SRQ serves every sender.
pub fn xrc_remote_srqn_routes_between_two_srqs<H: Harness>(t: &str) {
    let mut x = xrc_conn::<H>(t, 64);
    let mut cq2 = x.b.ctx.create_cq(64).expect("create_cq");
    let mut srq2 = x.b.pd.create_srq_xrc(&srq_attr(64), &x.xrcd, &cq2).expect("second XRC SRQ");
    let (s1, s2) = (x.srq.srq_num(), srq2.srq_num());
    assert_ne!(s1, s2);
    for i in 0..5u64 {
        post_srq(&mut x.srq, &x.b, 100 + i, RX + i as usize * 256, 256);
        post_srq(&mut srq2, &x.b, 200 + i, RX + 8192 + i as usize * 256, 256);
    }
    for i in 0..10u64 {
        x.a.write(i as usize * 64, &pattern(i as u8, 64));
        let srqn = if i % 2 == 0 { s1 } else { s2 };
        let wr = SendWr::send(i).signaled().xrc_srqn(srqn);
        x.qs.post_send(&SendChain::one(wr, &[x.a.sge(i as usize * 64, 64)])).expect("post_send");
    }
    assert_eq!(poll_n(&mut x.a.scq, 10).iter().filter(|w| w.is_ok()).count(), 10);
    let tgt = x.qr.qp_num();
    let landed = [(poll_n(&mut x.b.rcq, 5), 100, RX, 0u64), (poll_n(&mut cq2, 5), 200, RX + 8192, 1)];
    for (got, base, off, parity) in landed {
        for (k, w) in got.iter().enumerate() {
            assert_eq!((w.wr_id, w.status, w.qp_num, w.byte_len), (base + k as u64, WcStatus::Success, tgt, 64));
            let sent = 2 * k as u64 + parity;
            assert_eq!(x.b.read(off + k * 256, 64), pattern(sent as u8, 64), "message {sent} in the wrong SRQ");
        }
    }
    assert_no_completion(&mut x.b.rcq);
    assert_no_completion(&mut cq2);
    // A second connection into the first SRQ.
    let (mut qs2, qr2) = xrc_qps::<H>(&x.a, &x.xrcd);
    post_srq(&mut x.srq, &x.b, 300, RX + 16384, 256);
    x.a.write(4096, b"second sender");
    qs2.post_send(&SendChain::one(SendWr::send(30).signaled().xrc_srqn(s1), &[x.a.sge(4096, 13)])).unwrap();
    assert!(poll_one(&mut x.a.scq).is_ok());
    let r = poll_one(&mut x.b.rcq);
    assert_eq!((r.wr_id, r.qp_num, r.byte_len), (300, qr2.qp_num(), 13));
    assert_ne!(qr2.qp_num(), tgt);
    assert_eq!(x.b.read(RX + 16384, 13), b"second sender");
    assert_no_completion(&mut cq2);
}

/// Moves both halves of an XRC connection to RESET and connects them again.
fn reconnect_xrc<H: Harness>(qs: &mut QpOf<H>, qr: &mut QpOf<H>) {
    let reset = QpAttr { state: QpState::Reset, ..Default::default() };
    qs.modify(&reset).expect("XRC_SEND -> RESET");
    qr.modify(&reset).expect("XRC_RECV -> RESET");
    connect::<H>(qs, qr, &ConnOpts::default());
}

/// A request may only land in an XRC SRQ of the XRC_RECV QP's domain. Naming an XRC SRQ of
/// another domain, a plain SRQ, or a number that names no SRQ is an invalid request: the
/// requester completes with REM_INV_REQ_ERR and its QP goes to ERROR, the target QP too, and
/// the named SRQ gives up nothing. After a reconnect, the SRQ of the right domain works.
pub fn xrc_srq_of_other_domain_refused<H: Harness>(t: &str) {
    let mut x = xrc_conn::<H>(t, 16);
    let mut cq2 = x.b.ctx.create_cq(16).expect("create_cq");
    let xrcd2 = x.b.ctx.open_xrcd().expect("second open_xrcd");
    let mut other = x.b.pd.create_srq_xrc(&srq_attr(16), &xrcd2, &cq2).expect("XRC SRQ of another domain");
    let mut plain = x.b.pd.create_srq(&srq_attr(16)).expect("plain SRQ");
    post_srq(&mut other, &x.b, 1, RX, 64);
    post_srq(&mut plain, &x.b, 2, RX + 64, 64);
    let gone = {
        let s = x.b.pd.create_srq_xrc(&srq_attr(4), &x.xrcd, &cq2).expect("XRC SRQ");
        s.srq_num()
    };
    for (what, srqn) in [("another domain", other.srq_num()), ("a plain SRQ", plain.srq_num()), ("no SRQ", gone)] {
        let wr = SendWr::send(7).signaled().xrc_srqn(srqn);
        x.qs.post_send(&SendChain::one(wr, &[x.a.sge(0, 8)])).expect("post_send");
        let s = poll_one(&mut x.a.scq);
        assert_eq!((s.wr_id, s.status), (7, WcStatus::RemInvReqErr), "{what}");
        assert_eq!(x.qs.state(), QpState::Error, "{what}: requester");
        assert_eq!(x.qr.state(), QpState::Error, "{what}: target");
        assert_no_completion(&mut cq2);
        assert_no_completion(&mut x.b.rcq);
        reconnect_xrc::<H>(&mut x.qs, &mut x.qr);
    }
    // The SRQs named wrongly still hold their requests: a connection of their own domain gets
    // them (the plain SRQ is not reachable over XRC at all).
    let (mut qs2, qr2) = xrc_qps::<H>(&x.a, &xrcd2);
    qs2.post_send(&SendChain::one(SendWr::send(8).signaled().xrc_srqn(other.srq_num()), &[x.a.sge(0, 8)])).unwrap();
    assert!(poll_one(&mut x.a.scq).is_ok());
    let r = poll_one(&mut cq2);
    assert_eq!((r.wr_id, r.status, r.qp_num), (1, WcStatus::Success, qr2.qp_num()));
    // And the right SRQ works on the reconnected pair.
    post_srq(&mut x.srq, &x.b, 3, RX + 128, 64);
    x.qs.post_send(&SendChain::one(SendWr::send(9).signaled().xrc_srqn(x.srq.srq_num()), &[x.a.sge(0, 8)])).unwrap();
    assert!(poll_one(&mut x.a.scq).is_ok());
    assert_eq!(poll_one(&mut x.b.rcq).wr_id, 3);
}

/// The notes of ibv_post_srq_recv(3) hold on an XRC SRQ: the limit event fires once when the
/// count drops below the armed limit (element: the SRQ number) and disarms; RDMA_WRITE consumes
/// no receive while RDMA_WRITE_WITH_IMM and SEND do; a chain stops at its first bad request
/// (EINVAL, bad_wr) with the ones before it posted and none after; a full SRQ refuses with
/// ENOMEM at exactly max_wr.
pub fn xrc_srq_follows_the_srq_notes<H: Harness>(t: &str) {
    let mut x = xrc_conn::<H>(t, 16);
    let srqn = x.srq.srq_num();
    let send = |x: &mut XrcConn<H>, id: u64| {
        x.qs.post_send(&SendChain::one(SendWr::send(id).signaled().xrc_srqn(srqn), &[x.a.sge(0, 8)])).unwrap();
    };
    // Limit.
    for i in 0..8 {
        post_srq(&mut x.srq, &x.b, i, RX + i as usize * 64, 64);
    }
    x.srq.modify(&SrqAttr { srq_limit: 4, ..srq_attr(0) }, SrqAttrMask::LIMIT).expect("arm limit");
    for i in 0..4 {
        send(&mut x, i);
    }
    assert_eq!(poll_n(&mut x.b.rcq, 4).len(), 4);
    assert_eq!(poll_n(&mut x.a.scq, 4).len(), 4);
    let limits = |ev: &[AsyncEvent]| ev.iter().filter(|e| e.kind == AsyncEventKind::SrqLimitReached).count();
    assert_eq!(limits(&events_now::<H>(&x.b.ctx)), 0, "fired at 4 posted, limit 4");
    send(&mut x, 4);
    poll_one(&mut x.b.rcq);
    poll_one(&mut x.a.scq);
    let (e, _) = wait_event::<H>(&x.b.ctx, AsyncEventKind::SrqLimitReached);
    assert_eq!(e.element, srqn);
    assert_eq!(x.srq.query().unwrap().srq_limit, 0, "the limit disarms when it fires");
    for i in 5..8 {
        send(&mut x, i);
    }
    assert_eq!(poll_n(&mut x.b.rcq, 3).iter().map(|w| w.wr_id).collect::<Vec<_>>(), [5, 6, 7]);
    poll_n(&mut x.a.scq, 3);
    assert_eq!(limits(&events_now::<H>(&x.b.ctx)), 0, "fired twice");

    // Which opcodes consume a receive: a WRITE does not; the SEND after it takes the request.
    post_srq(&mut x.srq, &x.b, 50, RX, 64);
    let (addr, rkey) = (x.b.addr(RX + 4096), x.b.mr.rkey());
    x.qs.post_send(&SendChain::one(SendWr::write(51, addr, rkey).signaled().xrc_srqn(srqn), &[x.a.sge(0, 8)])).unwrap();
    assert!(poll_one(&mut x.a.scq).is_ok());
    assert_no_completion(&mut x.b.rcq);
    send(&mut x, 52);
    assert!(poll_one(&mut x.a.scq).is_ok());
    assert_eq!(poll_one(&mut x.b.rcq).wr_id, 50);

    // A chain stops at its first bad request (two SGEs on an SRQ of max_sge 1).
    let mut c = RecvChain::new();
    c.push(RecvWr::new(60), &[x.b.sge(RX, 64)]);
    c.push(RecvWr::new(61), &[x.b.sge(RX + 64, 32), x.b.sge(RX + 96, 32)]);
    c.push(RecvWr::new(62), &[x.b.sge(RX + 128, 64)]);
    expect_post_err(x.srq.post_recv(&c), Errno::EINVAL, 1);
    send(&mut x, 63);
    assert!(poll_one(&mut x.a.scq).is_ok());
    assert_eq!(poll_one(&mut x.b.rcq).wr_id, 60);
    // Nothing else was posted: the next SEND waits (RNR) until a receive comes.
    send(&mut x, 64);
    assert_no_completion(&mut x.b.rcq);
    post_srq(&mut x.srq, &x.b, 65, RX, 64);
    assert_eq!(poll_one(&mut x.b.rcq).wr_id, 65);
    assert!(poll_one(&mut x.a.scq).is_ok());

    // Full at exactly max_wr.
    let max = x.srq.query().unwrap().max_wr as u64;
    let mut c = RecvChain::new();
    for i in 0..max + 1 {
        c.push(RecvWr::new(100 + i), &[x.b.sge(RX + (i as usize % 64) * 64, 64)]);
    }
    expect_post_err(x.srq.post_recv(&c), Errno::ENOMEM, max as usize);
    expect_post_err(x.srq.post_recv(&RecvChain::one(999, &[x.b.sge(RX, 64)])), Errno::ENOMEM, 0);
}

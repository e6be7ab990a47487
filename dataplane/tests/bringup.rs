//! `Qp::connect` and `Qp::ready`: the whole RESET -> RTS bring-up in one call, on `shm`.

use dataplane::mem::HugePolicy;
use dataplane::shm::{Shm, ShmConfig};
use dataplane::verbs::*;
use dataplane::{Context, Cq, Mr, Pd, Provider, Qp, QpInitAttr};
use std::time::{Duration, Instant};

type P = Shm;

fn open(name: &str) -> <P as Provider>::Context {
    let cfg = ShmConfig { fabric: format!("{name}-{}", std::process::id()), size: 8 << 20, huge: HugePolicy::Never };
    P::open(&cfg).expect("open")
}

fn poll_one(cq: &mut <P as Provider>::Cq) -> WorkCompletion {
    let mut wc = [WorkCompletion::default(); 1];
    let end = Instant::now() + Duration::from_secs(5);
    while Instant::now() < end {
        if cq.poll(&mut wc).unwrap() == 1 {
            return wc[0];
        }
    }
    panic!("no completion within 5 s");
}

#[test]
fn connect_brings_an_rc_pair_to_rts_and_it_carries_a_message() {
    let ctx = open("bringup-rc");
    let pd = ctx.alloc_pd().unwrap();
    let region = ctx.alloc_region(4096).unwrap();
    let mr = pd.reg_mr(&region, 0, 4096, AccessFlags::LOCAL_WRITE).unwrap();
    let (mut acq, mut bcq) = (ctx.create_cq(16).unwrap(), ctx.create_cq(16).unwrap());
    let cap = QpCaps { max_send_wr: 8, max_recv_wr: 8, ..Default::default() };
    let mk = |cq| {
        pd.create_qp(&QpInitAttr { send_cq: cq, recv_cq: cq, srq: None, cap, qp_type: QpType::Rc, sq_sig_all: true })
    };
    let (mut a, mut b) = (mk(&acq).unwrap(), mk(&bcq).unwrap());
    let (ea, eb) = (a.endpoint(0).unwrap(), b.endpoint(0).unwrap());
    let opts = ConnectOpts { min_rnr_timer: 1, ..Default::default() };
    // b goes to INIT first to post its receive: connect starts from INIT too.
    b.bring_up_to_init(&opts).unwrap();
    let mut recv = RecvChain::with_capacity(1, 1);
    recv.push(RecvWr::new(7), &[Sge::new(mr.addr() + 64, 64, mr.lkey())]);
    b.post_recv(&recv).unwrap();
    a.connect(&PeerAddr::from_endpoint(&eb, 1, 0), &opts).unwrap();
    b.connect(&PeerAddr::from_endpoint(&ea, 1, 0), &opts).unwrap();
    assert_eq!((a.state(), b.state()), (QpState::Rts, QpState::Rts));
    let mut send = SendChain::with_capacity(1, 1);
    send.push(SendWr::send(1), &[Sge::new(mr.addr(), 8, mr.lkey())]);
    a.post_send(&send).unwrap();
    assert_eq!(poll_one(&mut acq).status, WcStatus::Success);
    let wc = poll_one(&mut bcq);
    assert_eq!((wc.status, wc.wr_id, wc.byte_len), (WcStatus::Success, 7, 8));
    // Connecting again, from RTS, is refused and says why.
    let e = a.connect(&PeerAddr::from_endpoint(&eb, 1, 0), &opts).unwrap_err();
    assert_eq!(e.errno, Errno::EINVAL);
    assert!(e.msg.contains("RESET or INIT"), "{e}");
}

#[test]
fn ready_brings_a_ud_qp_to_rts_and_each_helper_refuses_the_other_type() {
    let ctx = open("bringup-ud");
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16).unwrap();
    let cap = QpCaps { max_send_wr: 8, max_recv_wr: 8, ..Default::default() };
    let mk = |t| pd.create_qp(&QpInitAttr { send_cq: &cq, recv_cq: &cq, srq: None, cap, qp_type: t, sq_sig_all: true });
    let mut ud = mk(QpType::Ud).unwrap();
    let e = ud.connect(&PeerAddr::default(), &ConnectOpts::default()).unwrap_err();
    assert_eq!(e.errno, Errno::EINVAL);
    assert_eq!(ud.state(), QpState::Reset, "a refused connect changes nothing");
    ud.ready(&ConnectOpts { qkey: 0x1111_1111, ..Default::default() }).unwrap();
    assert_eq!(ud.state(), QpState::Rts);
    let mut rc = mk(QpType::Rc).unwrap();
    assert_eq!(rc.ready(&ConnectOpts::default()).unwrap_err().errno, Errno::EINVAL);
    assert_eq!(rc.state(), QpState::Reset);
}

#[test]
fn a_refused_transition_is_named_with_the_devices_errno() {
    let ctx = open("bringup-bad");
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16).unwrap();
    let cap = QpCaps { max_send_wr: 8, max_recv_wr: 8, ..Default::default() };
    let mut qp = pd
        .create_qp(&QpInitAttr { send_cq: &cq, recv_cq: &cq, srq: None, cap, qp_type: QpType::Rc, sq_sig_all: true })
        .unwrap();
    // Port 200 does not exist: INIT fails, and the message says it was RESET -> INIT.
    let e = qp.connect(&PeerAddr::default(), &ConnectOpts { port_num: 200, ..Default::default() }).unwrap_err();
    assert_eq!(e.errno, Errno::EINVAL);
    assert!(e.msg.starts_with("RESET -> INIT: "), "{e}");
    // An MTU no port has: RTR fails, named with the peer's QPN.
    let peer = PeerAddr { qpn: 77, ..Default::default() };
    let e = qp.connect(&peer, &ConnectOpts { path_mtu: 12345, ..Default::default() }).unwrap_err();
    assert!(e.msg.starts_with("connect to QP 77: INIT -> RTR: "), "{e}");
    assert_eq!(qp.state(), QpState::Init, "the QP stays in the state it reached");
}

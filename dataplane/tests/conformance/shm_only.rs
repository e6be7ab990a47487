//! Cases that need a view only the `shm` provider gives (it counts retries exactly).

use crate::harness::*;
use crate::ShmHarness;
use dataplane::verbs::*;
use dataplane::Qp;

/// `rnr_retry = n` (n < 7) means n retries after the first attempt, then RNR_RETRY_EXC_ERR.
#[test]
fn rnr_retry_count_is_exact() {
    for n in [0u8, 1, 3] {
        let t = format!("rnr-exact-{n}");
        let o = ConnOpts { rnr_retry: n, min_rnr_timer: 1, ..Default::default() };
        let mut p = pair::<ShmHarness>(&t, QpType::Rc, QpCaps::default(), o);
        send(&mut p.qa, &p.a, 1, 0, 8);
        let wc = poll_n(&mut p.a.scq, 1)[0];
        assert_eq!(wc.status, WcStatus::RnrRetryExcErr);
        assert_eq!(p.qa.retries(), n as u64, "rnr_retry = {n}");
        assert_eq!(p.qa.state(), QpState::Error);
    }
}

/// `retry_cnt = n` means n retries when the responder never answers, then RETRY_EXC_ERR.
#[test]
fn retry_cnt_is_exact() {
    for n in [0u8, 2] {
        let t = format!("retry-exact-{n}");
        let mut a = Node::<ShmHarness>::open(&t, 0);
        let mut qa = a.qp(QpType::Rc, QpCaps::default(), None, false);
        let o = ConnOpts { retry_cnt: n, timeout: 1, ..Default::default() };
        to_init(&mut qa, 0, o.access);
        // A QPN that names no QP on this fabric.
        to_rtr(&mut qa, &Endpoint { qpn: 0x00ff_fff0, ..Default::default() }, &o);
        to_rts(&mut qa, &o);
        send(&mut qa, &a, 1, 0, 8);
        let wc = poll_n(&mut a.scq, 1)[0];
        assert_eq!(wc.status, WcStatus::RetryExcErr);
        assert_eq!(qa.retries(), n as u64, "retry_cnt = {n}");
    }
}

mod channels {
    use crate::harness::*;
    use dataplane::mem::HugePolicy;
    use dataplane::shm::{Shm, ShmCompChannel, ShmConfig};
    use dataplane::verbs::*;
    use dataplane::{Context, Cq, Mr, Pd, Provider, Qp, QpInitAttr};
    use std::time::Duration;

    type P = Shm;

    struct Setup {
        _ctx: <P as Provider>::Context,
        ch: ShmCompChannel,
        scq: <P as Provider>::Cq,
        rcq: <P as Provider>::Cq,
        mr: <P as Provider>::Mr,
        qa: <P as Provider>::Qp,
        qb: <P as Provider>::Qp,
        _region: <P as Provider>::Region,
    }

    fn setup(t: &str) -> Setup {
        let cfg =
            ShmConfig { fabric: format!("conf-{t}-{}", std::process::id()), size: 16 << 20, huge: HugePolicy::Never };
        let ctx = P::open(&cfg).unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let region = ctx.alloc_region(65536).unwrap();
        let mr = pd.reg_mr(&region, 0, 65536, AccessFlags::LOCAL_WRITE).unwrap();
        let ch = ctx.create_comp_channel().unwrap();
        let scq = ctx.create_cq(64).unwrap();
        let rcq = ctx.create_cq_with_channel(64, &ch).unwrap();
        let mk = |recv: &<P as Provider>::Cq| {
            let attr = QpInitAttr {
                send_cq: &scq,
                recv_cq: recv,
                srq: None,
                cap: QpCaps::default(),
                qp_type: QpType::Rc,
                sq_sig_all: false,
            };
            pd.create_qp(&attr).unwrap()
        };
        let (mut qa, mut qb) = (mk(&scq), mk(&rcq));
        crate::harness::connect::<crate::ShmHarness>(&mut qa, &mut qb, &ConnOpts::default());
        for i in 0..8 {
            qb.post_recv(&RecvChain::one(i, &[Sge::new(mr.addr() + 4096 + i * 64, 64, mr.lkey())])).unwrap();
        }
        Setup { _ctx: ctx, ch, scq, rcq, mr, qa, qb, _region: region }
    }

    impl Setup {
        fn send(&mut self, flags: SendFlags) {
            let wr = SendWr::send(1).signaled().flags(flags);
            self.qa.post_send(&SendChain::one(wr, &[Sge::new(self.mr.addr(), 8, self.mr.lkey())])).unwrap();
            assert!(poll_n(&mut self.scq, 1)[0].is_ok());
        }
    }

    const SHORT: Option<Duration> = Some(Duration::from_millis(50));

    /// ibv_req_notify_cq: an armed CQ signals its channel once for the next completion; an
    /// unarmed one does not; the event names the CQ.
    #[test]
    fn armed_cq_signals_once() {
        let mut s = setup("chan-once");
        s.send(SendFlags::empty());
        assert_eq!(s.ch.get_cq_event(SHORT).unwrap(), None, "not armed: no event");
        assert_eq!(poll_n(&mut s.rcq, 1).len(), 1);
        s.rcq.req_notify(false).unwrap();
        s.send(SendFlags::empty());
        assert_eq!(s.ch.get_cq_event(SHORT).unwrap(), Some(s.rcq.cqn()));
        s.send(SendFlags::empty());
        assert_eq!(s.ch.get_cq_event(SHORT).unwrap(), None, "one event per arming");
        assert_eq!(poll_n(&mut s.rcq, 2).len(), 2);
    }

    /// ibv_post_send(3) "IBV_SEND_SOLICITED Set the solicited event indicator": a CQ armed with
    /// solicited_only ignores plain receives and fires on a solicited one.
    #[test]
    fn solicited_only_waits_for_a_solicited_message() {
        let mut s = setup("chan-solicited");
        s.rcq.req_notify(true).unwrap();
        s.send(SendFlags::empty());
        assert_eq!(s.ch.get_cq_event(SHORT).unwrap(), None);
        s.send(SendFlags::SOLICITED);
        assert_eq!(s.ch.get_cq_event(SHORT).unwrap(), Some(s.rcq.cqn()));
        assert_eq!(poll_n(&mut s.rcq, 2).len(), 2);
    }

    /// Solicited-only arming also fires for an unsuccessful completion (flush on ERROR).
    #[test]
    fn solicited_only_fires_on_error_completion() {
        let mut s = setup("chan-error");
        s.rcq.req_notify(true).unwrap();
        s.qb.modify(&QpAttr { state: QpState::Error, ..Default::default() }).unwrap();
        assert_eq!(s.ch.get_cq_event(SHORT).unwrap(), Some(s.rcq.cqn()));
        assert_eq!(poll_n(&mut s.rcq, 8)[0].status, WcStatus::WrFlushErr);
    }

    /// A thread sleeping in get_cq_event is woken by a completion produced by another thread.
    #[test]
    fn sleeping_waiter_is_woken() {
        let mut s = setup("chan-wake");
        s.rcq.req_notify(false).unwrap();
        let cqn = s.rcq.cqn();
        std::thread::scope(|sc| {
            let ch = &s.ch;
            let waiter = sc.spawn(move || ch.get_cq_event(Some(Duration::from_secs(20))).unwrap());
            std::thread::sleep(Duration::from_millis(20));
            let wr = SendWr::send(1);
            s.qa.post_send(&SendChain::one(wr, &[Sge::new(s.mr.addr(), 8, s.mr.lkey())])).unwrap();
            assert_eq!(waiter.join().unwrap(), Some(cqn));
        });
    }
}

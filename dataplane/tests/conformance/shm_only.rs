//! Cases that need a view only the `shm` provider gives (it counts retries exactly).

use crate::harness::*;
use crate::ShmHarness;
use dataplane::verbs::*;
use dataplane::{Mr, Qp};

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

/// A software NIC can see the responder's queue: an RNR wait ends as soon as a receive is
/// posted, not when the RNR timer expires (docs/shm-provider.md), and that early attempt is
/// not counted as a retry. The timer here is code 0, 655 ms: delivery long before it shows
/// the wait was cut short; `retries() == 0` shows nothing was counted.
#[test]
fn rnr_wait_ends_when_a_receive_is_posted() {
    const RX: usize = 64 << 10;
    let o = ConnOpts { rnr_retry: 1, min_rnr_timer: 0, ..Default::default() };
    let mut p = rc_pair_with::<ShmHarness>("rnr-early", o);
    p.a.write(0, b"no sleep");
    send(&mut p.qa, &p.a, 1, 0, 8);
    assert_no_completion(&mut p.a.scq);
    let posted = std::time::Instant::now();
    recv(&mut p.qb, &p.b, 9, RX, 64);
    let s = poll_one(&mut p.a.scq);
    let waited = posted.elapsed();
    assert_eq!((s.wr_id, s.status), (1, WcStatus::Success));
    assert!(waited < std::time::Duration::from_millis(300), "waited {waited:?}: the 655 ms RNR timer ran out");
    assert_eq!(p.qa.retries(), 0, "the early attempt is not a retry");
    let r = poll_one(&mut p.b.rcq);
    assert_eq!((r.wr_id, r.status, r.byte_len), (9, WcStatus::Success, 8));
    assert_eq!(p.b.read(RX, 8), b"no sleep");
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
        bring_up(&mut qa, &Endpoint { qpn: 0x00ff_fff0, ..Default::default() }, &o);
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
        // Both CQs on the channel: a CQ signals only when armed, and only the retry case arms
        // the send CQ.
        let scq = ctx.create_cq_with_channel(64, &ch).unwrap();
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
    /// On `shm` the poster's CPU is the NIC: a send waiting behind an RNR is retried by the
    /// process's CQ polls, and also while it sleeps on a completion channel (it wakes every
    /// millisecond while such a send waits). Without the latter, a process that sends and then
    /// sleeps until its reply arrives would never resend to a peer that posts its receive
    /// later (seen in dp-pingpong --xrc -e). Here nothing polls a CQ after the receive is
    /// posted: only the sleeping waiter can deliver the send and so get its own event.
    #[test]
    fn sleeping_waiter_resends_after_rnr() {
        let mut s = setup("chan-retry");
        for _ in 0..8 {
            s.send(SendFlags::empty());
        }
        assert_eq!(poll_n(&mut s.rcq, 8).len(), 8, "the 8 pre-posted receives are used up");
        s.scq.req_notify(false).unwrap();
        let wr = SendWr::send(2).signaled();
        s.qa.post_send(&SendChain::one(wr, &[Sge::new(s.mr.addr(), 8, s.mr.lkey())])).unwrap();
        assert_eq!(s.ch.get_cq_event(SHORT).unwrap(), None, "RNR: qb has no receive");
        let scqn = s.scq.cqn();
        std::thread::scope(|sc| {
            let ch = &s.ch;
            let waiter = sc.spawn(move || ch.get_cq_event(Some(Duration::from_secs(20))).unwrap());
            std::thread::sleep(Duration::from_millis(50));
            s.qb.post_recv(&RecvChain::one(9, &[Sge::new(s.mr.addr() + 8192, 64, s.mr.lkey())])).unwrap();
            assert_eq!(waiter.join().unwrap(), Some(scqn), "the waiter resent and saw its send complete");
        });
        let wc = poll_n(&mut s.scq, 1)[0];
        assert_eq!((wc.wr_id, wc.status), (2, WcStatus::Success));
        let r = poll_n(&mut s.rcq, 1)[0];
        assert_eq!((r.wr_id, r.status), (9, WcStatus::Success));
    }
}

mod windows {
    use crate::harness::*;
    use crate::ShmHarness;
    use dataplane::verbs::*;
    use dataplane::{Mr, Qp};

    type H = ShmHarness;

    const ALL: AccessFlags = AccessFlags::LOCAL_WRITE
        .union(AccessFlags::REMOTE_WRITE)
        .union(AccessFlags::REMOTE_READ)
        .union(AccessFlags::MW_BIND);

    /// A fresh RC QP on each node, connected to each other.
    fn rc_qps(x: &Node<H>, y: &Node<H>) -> (QpOf<H>, QpOf<H>) {
        let (mut qx, mut qy) =
            (x.qp(QpType::Rc, QpCaps::default(), None, false), y.qp(QpType::Rc, QpCaps::default(), None, false));
        connect::<H>(&mut qx, &mut qy, &ConnOpts::default());
        (qx, qy)
    }

    fn post_one(qp: &mut QpOf<H>, wr: SendWr, sges: &[Sge]) {
        qp.post_send(&SendChain::one(wr.signaled(), sges)).expect("post");
    }

    /// BIND_MW opens a window onto part of an MR under a new rkey: a remote WRITE inside it
    /// lands; one outside it is a remote access error; the MR's own rkey is unaffected.
    #[test]
    fn bind_mw_grants_exactly_the_window() {
        let mut a = Node::<H>::open_with("mw-bind", 0, ALL);
        let mut b = Node::<H>::open_with("mw-bind", 1, ALL);
        let (mut qa, mut qb) = rc_qps(&a, &b);
        let mw = b.pd.alloc_mw().unwrap();
        let new = inc_rkey(mw.rkey());
        let bind = MwBind {
            new_rkey: new,
            mr_lkey: b.mr.lkey(),
            addr: b.addr(8192),
            length: 64,
            access: AccessFlags::REMOTE_WRITE,
        };
        post_one(&mut qb, SendWr::bind_mw(1, mw.rkey(), bind), &[]);
        let wc = poll_n(&mut b.scq, 1)[0];
        assert_eq!((wc.status, wc.opcode), (WcStatus::Success, WcOpcode::BindMw));
        assert_eq!(mw.rkey(), new);
        a.write(0, b"through the window");
        post_one(&mut qa, SendWr::write(2, b.addr(8192), new), &[a.sge(0, 18)]);
        assert!(poll_n(&mut a.scq, 1)[0].is_ok());
        assert_eq!(b.read(8192, 18), b"through the window");
    }

    /// A write past the window's end fails with REM_ACCESS_ERR and changes nothing.
    #[test]
    fn window_bounds_are_enforced() {
        let mut a = Node::<H>::open_with("mw-bounds", 0, ALL);
        let mut b = Node::<H>::open_with("mw-bounds", 1, ALL);
        let (mut qa, mut qb) = rc_qps(&a, &b);
        let mw = b.pd.alloc_mw().unwrap();
        let new = inc_rkey(mw.rkey());
        let bind = MwBind {
            new_rkey: new,
            mr_lkey: b.mr.lkey(),
            addr: b.addr(8192),
            length: 64,
            access: AccessFlags::REMOTE_WRITE,
        };
        post_one(&mut qb, SendWr::bind_mw(1, mw.rkey(), bind), &[]);
        assert!(poll_n(&mut b.scq, 1)[0].is_ok());
        b.write(8192 + 64, &[0xee; 8]);
        post_one(&mut qa, SendWr::write(2, b.addr(8192 + 60), new), &[a.sge(0, 8)]);
        assert_eq!(poll_n(&mut a.scq, 1)[0].status, WcStatus::RemAccessErr);
        assert_eq!(b.read(8192 + 64, 8), vec![0xee; 8]);
    }

    /// LOCAL_INV revokes a window; SEND_WITH_INV revokes the target's window on arrival and the
    /// receiver's completion carries WITH_INV and the rkey.
    #[test]
    fn local_inv_and_send_with_inv_revoke_windows() {
        let mut a = Node::<H>::open_with("mw-inv", 0, ALL);
        let mut b = Node::<H>::open_with("mw-inv", 1, ALL);
        let (mut qa, mut qb) = rc_qps(&a, &b);
        let mw = b.pd.alloc_mw().unwrap();
        let (lkey, waddr) = (b.mr.lkey(), b.addr(8192));
        let bind = move |rkey| MwBind {
            new_rkey: rkey,
            mr_lkey: lkey,
            addr: waddr,
            length: 64,
            access: AccessFlags::REMOTE_WRITE,
        };
        // Bind, then invalidate remotely with SEND_WITH_INV.
        let k1 = inc_rkey(mw.rkey());
        post_one(&mut qb, SendWr::bind_mw(1, mw.rkey(), bind(k1)), &[]);
        assert!(poll_n(&mut b.scq, 1)[0].is_ok());
        qb.post_recv(&RecvChain::one(7, &[b.sge(0, 64)])).unwrap();
        post_one(&mut qa, SendWr::send_with_inv(2, k1), &[a.sge(0, 8)]);
        assert!(poll_n(&mut a.scq, 1)[0].is_ok());
        let r = poll_n(&mut b.rcq, 1)[0];
        assert!(r.wc_flags.contains(WcFlags::WITH_INV));
        assert_eq!((r.imm_data, r.wr_id), (k1, 7));
        // The window is revoked: a QP error follows a write through it, so use a fresh pair.
        let (mut qa2, mut qb2) = rc_qps(&a, &b);
        post_one(&mut qa2, SendWr::write(3, b.addr(8192), k1), &[a.sge(0, 8)]);
        assert_eq!(poll_n(&mut a.scq, 1)[0].status, WcStatus::RemAccessErr);
        // Rebind, then LOCAL_INV on the owner's side.
        let k2 = inc_rkey(k1);
        post_one(&mut qb2, SendWr::bind_mw(4, k1, bind(k2)), &[]);
        assert!(poll_n(&mut b.scq, 1)[0].is_ok());
        post_one(&mut qb2, SendWr::local_inv(5, k2), &[]);
        let wc = poll_n(&mut b.scq, 1)[0];
        assert_eq!((wc.status, wc.opcode), (WcStatus::Success, WcOpcode::LocalInv));
        let (mut qa3, _qb3) = rc_qps(&a, &b);
        post_one(&mut qa3, SendWr::write(6, b.addr(8192), k2), &[a.sge(0, 8)]);
        assert_eq!(poll_n(&mut a.scq, 1)[0].status, WcStatus::RemAccessErr);
    }

    /// Binding onto an MR registered without MW_BIND, a window of another PD, or invalidating
    /// a plain MR's key: IBV_WC_MW_BIND_ERR ("memory management operation error").
    #[test]
    fn bad_binds_and_invalidations_fail() {
        let mut b = Node::<H>::open_with("mw-bad", 0, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE);
        let a = Node::<H>::open_with("mw-bad", 1, ALL);
        let (mut qb, _qa) = rc_qps(&b, &a);
        let mw = b.pd.alloc_mw().unwrap();
        let bind = MwBind {
            new_rkey: inc_rkey(mw.rkey()),
            mr_lkey: b.mr.lkey(),
            addr: b.addr(0),
            length: 64,
            access: AccessFlags::REMOTE_WRITE,
        };
        post_one(&mut qb, SendWr::bind_mw(1, mw.rkey(), bind), &[]);
        assert_eq!(poll_n(&mut b.scq, 1)[0].status, WcStatus::MwBindErr, "MR without MW_BIND");
        assert_eq!(qb.state(), QpState::Error);
        let (mut qb2, _qa2) = rc_qps(&b, &a);
        post_one(&mut qb2, SendWr::local_inv(2, b.mr.rkey()), &[]);
        assert_eq!(poll_n(&mut b.scq, 1)[0].status, WcStatus::MwBindErr, "a plain MR cannot be invalidated");
        // A window's rkey is never an lkey.
        let (mut qb3, _qa3) = rc_qps(&b, &a);
        let e = qb3.post_send(&SendChain::one(SendWr::send(3), &[Sge::new(b.addr(0), 8, mw.rkey())])).unwrap_err();
        assert_eq!(e.errno, Errno::EINVAL);
    }
}

/// A receive SGE of length 0 means 2^31 bytes (srq notes); over a small MR the post is refused,
/// and the reason says the length was read as 2^31, so a caller who meant "no bytes" is not
/// sent looking for a bad address. A too-long nonzero length keeps the plain message.
#[test]
fn zero_length_recv_sge_refusal_names_the_2g_reading() {
    let b = Node::<ShmHarness>::open("recv-zero-len-reason", 0);
    let mut qb = b.qp(QpType::Rc, QpCaps::default(), None, false);
    to_init(&mut qb, 0, AccessFlags::empty());
    let zero = Sge::new(b.addr(0), 0, b.mr.lkey());
    let e = qb.post_recv(&RecvChain::one(1, &[zero])).expect_err("a 2^31-byte SGE over a small MR");
    assert_eq!((e.errno, e.bad_wr), (Errno::EINVAL, 0), "{e}");
    assert!(e.reason.contains("length 0 was read as 2^31 bytes"), "{e}");
    let long = Sge::new(b.addr(0), b.mr.len() as u32 + 1, b.mr.lkey());
    let e = qb.post_recv(&RecvChain::one(2, &[long])).expect_err("an SGE past its MR");
    assert_eq!(e.reason, "SGE outside its memory region", "{e}");
}

/// The shm fabric's multicast limits (docs/shm-provider.md, "Multicast"): 32 QPs per group,
/// the 33rd attach is ENOMEM naming the limit; a detach frees a place.
#[test]
fn mcast_group_holds_32_qps_then_enomem() {
    const MGID: [u8; 16] = [0xff, 0x0e, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x42, 0, 1];
    let a = Node::<ShmHarness>::open("mcast-limit", 0);
    let mut qps: Vec<_> = (0..33).map(|_| a.qp(QpType::Ud, QpCaps::default(), None, false)).collect();
    for q in &mut qps[..32] {
        q.attach_mcast(&MGID, 0).expect("attach within the limit");
    }
    let e = qps[32].attach_mcast(&MGID, 0).unwrap_err();
    assert_eq!(e.errno, Errno::ENOMEM);
    assert!(e.msg.contains("max_mcast_qp_attach"), "{e}");
    qps[0].detach_mcast(&MGID, 0).unwrap();
    qps[32].attach_mcast(&MGID, 0).expect("a detach frees a place");
}

/// Issue 17's TSO check by a parser nobody here wrote: the 46 frames of a 64 KiB TSO request
/// written to a pcap file and read back by `tcpdump -r -nn -vv -S`, which must see 46 TCP
/// segments with correct checksums whose sequence ranges tile the 64 KiB exactly. tcpdump is
/// required (CI installs it); without it the test fails saying so.
#[test]
fn tso_frames_read_back_by_tcpdump() {
    use dataplane::net::pcap::PcapWriter;
    let payload: Vec<u8> = (0..65536u32).map(|i| (i.wrapping_mul(2654435761) >> 24) as u8).collect();
    let frames = crate::cases::tso_frames::<ShmHarness>("tso-tcpdump", &payload, 1448);
    let path = std::env::temp_dir().join(format!("dataplane-tso-{}.pcap", std::process::id()));
    let mut w = PcapWriter::new(std::fs::File::create(&path).unwrap()).unwrap();
    for (i, f) in frames.iter().enumerate() {
        w.write_frame(std::time::Duration::new(1_700_000_000, i as u32 * 1000), f).unwrap();
    }
    w.into_inner().unwrap();
    let out = std::process::Command::new("tcpdump")
        .args(["-r", path.to_str().unwrap(), "-nn", "-vv", "-S"])
        .output()
        .unwrap_or_else(|e| panic!("tcpdump is needed to check TSO frames (apt-get install tcpdump): {e}"));
    let _ = std::fs::remove_file(&path);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "tcpdump failed: {}", String::from_utf8_lossy(&out.stderr));
    assert!(!text.contains("bad cksum") && !text.contains("incorrect"), "tcpdump found a bad checksum:\n{text}");
    // "... 10.0.0.1.12345 > 10.0.0.2.80: Flags [.], cksum 0x1a2b (correct), seq 1000:2448, ..."
    let segs: Vec<&str> = text.lines().filter(|l| l.contains("10.0.0.1.12345 > 10.0.0.2.80")).collect();
    assert_eq!(segs.len(), 46, "tcpdump saw {} TCP segments:\n{text}", segs.len());
    let mut next = 1000u64;
    for l in &segs {
        assert!(l.contains("(correct)"), "checksum not reported correct: {l}");
        let range = l.split("seq ").nth(1).and_then(|r| r.split(',').next()).unwrap_or_else(|| panic!("no seq in {l}"));
        let (a, b) = range.split_once(':').unwrap_or_else(|| panic!("seq range {range}"));
        let (a, b): (u64, u64) = (a.parse().unwrap(), b.parse().unwrap());
        assert_eq!(a, next, "segments tile the stream: {l}");
        assert!(b - a <= 1448, "no segment over the MSS: {l}");
        next = b;
    }
    assert_eq!(next, 1000 + 65536, "the segments cover the 64 KiB");
    // tcpdump's flags: W = CWR, F = FIN, P = PSH, "." = ACK.
    assert!(segs[0].contains("Flags [.W]"), "CWR|ACK on the first: {}", segs[0]);
    assert!(segs[1..45].iter().all(|l| l.contains("Flags [.]")), "ACK alone in the middle");
    assert!(segs[45].contains("Flags [FP.]"), "FIN|PSH|ACK on the last: {}", segs[45]);
}

/// XRC QPs on `shm`: how they are made and what they refuse. An XRC_RECV QP belongs to a
/// domain, so `Pd::create_qp` refuses that type; an XRC QP takes no SRQ at creation; neither
/// half has a receive queue (post_recv: EINVAL); nothing can be posted to send on XRC_RECV
/// (EINVAL, bad_wr 0); `ready()` (the UD bring-up) refuses both halves; an XRC SRQ of another
/// fabric's domain is refused.
#[test]
fn xrc_qp_creation_and_queue_rules() {
    use dataplane::{Context, Pd, Srq, Xrcd};
    type H = ShmHarness;
    let a = Node::<H>::open("xrc-rules", 0);
    let b = Node::<H>::open("xrc-rules", 1);
    let xrcd = b.ctx.open_xrcd().unwrap();
    assert!(b.ctx.caps().xrc);
    let e = b.try_qp(QpType::XrcRecv, QpCaps::default(), None, false).err().expect("XRC_RECV from a PD");
    assert_eq!(e.errno, Errno::EINVAL, "{e}");
    let srq = b.pd.create_srq_xrc(&SrqAttr { max_wr: 8, max_sge: 1, srq_limit: 0 }, &xrcd, &b.rcq).unwrap();
    let e = a.try_qp(QpType::XrcSend, QpCaps::default(), Some(&srq), false).err().expect("XRC_SEND with an SRQ");
    assert_eq!(e.errno, Errno::EINVAL, "{e}");
    let mut qs = a.qp(QpType::XrcSend, QpCaps::default(), None, false);
    let mut qr = xrcd.create_recv_qp().unwrap();
    assert_eq!(qs.caps().max_recv_wr, 0);
    for q in [&mut qs, &mut qr] {
        let e = q.ready(&ConnectOpts::default()).unwrap_err();
        assert_eq!(e.errno, Errno::EINVAL, "{e}");
    }
    connect::<H>(&mut qs, &mut qr, &ConnOpts::default());
    for q in [&mut qs, &mut qr] {
        let e = q.post_recv(&RecvChain::one(1, &[b.sge(0, 8)])).unwrap_err();
        assert_eq!((e.errno, e.bad_wr), (Errno::EINVAL, 0), "{e}");
        assert!(e.reason.contains("XRC"), "{e}");
    }
    let e = qr.post_send(&SendChain::one(SendWr::send(1), &[b.sge(0, 8)])).unwrap_err();
    assert_eq!((e.errno, e.bad_wr), (Errno::EINVAL, 0), "{e}");
    let other = Node::<H>::open("xrc-rules-other-fabric", 0);
    let foreign = other.ctx.open_xrcd().unwrap();
    let e = b.pd.create_srq_xrc(&SrqAttr { max_wr: 8, max_sge: 1, srq_limit: 0 }, &foreign, &b.rcq).err();
    assert_eq!(e.expect("XRC SRQ in another fabric's domain").errno, Errno::EINVAL);
    let _ = srq.srq_num();
}

/// The last three cells of the XRC_SEND column: LOCAL_INV and BIND_MW run on the XRC_SEND QP's
/// own side (windows of its PD), and SEND_WITH_INV invalidates a window of the target SRQ's PD
/// on arrival, the receive completing WITH_INV on the SRQ's CQ.
#[test]
fn xrc_memory_window_opcodes() {
    use dataplane::{Context, Mr, Pd, Srq, Xrcd};
    type H = ShmHarness;
    let all = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ | AccessFlags::MW_BIND;
    let mut a = Node::<H>::open_with("xrc-mw", 0, all);
    let mut b = Node::<H>::open_with("xrc-mw", 1, all);
    let xrcd = b.ctx.open_xrcd().unwrap();
    let mut srq = b.pd.create_srq_xrc(&SrqAttr { max_wr: 8, max_sge: 1, srq_limit: 0 }, &xrcd, &b.rcq).unwrap();
    let mut qs = a.qp(QpType::XrcSend, QpCaps::default(), None, false);
    let mut qr = xrcd.create_recv_qp().unwrap();
    connect::<H>(&mut qs, &mut qr, &ConnOpts::default());
    let srqn = srq.srq_num();
    let post = |qs: &mut QpOf<H>, wr: SendWr, sges: &[Sge]| {
        qs.post_send(&SendChain::one(wr.signaled().xrc_srqn(srqn), sges)).expect("post_send");
    };
    // BIND_MW, then LOCAL_INV, on the sender's own window.
    let mw = a.pd.alloc_mw().unwrap();
    let k1 = inc_rkey(mw.rkey());
    let bind = MwBind {
        new_rkey: k1,
        mr_lkey: a.mr.lkey(),
        addr: a.addr(8192),
        length: 64,
        access: AccessFlags::REMOTE_WRITE,
    };
    post(&mut qs, SendWr::bind_mw(1, mw.rkey(), bind), &[]);
    let wc = poll_one(&mut a.scq);
    assert_eq!((wc.status, wc.opcode), (WcStatus::Success, WcOpcode::BindMw));
    assert_eq!(mw.rkey(), k1);
    post(&mut qs, SendWr::local_inv(2, k1), &[]);
    let wc = poll_one(&mut a.scq);
    assert_eq!((wc.status, wc.opcode), (WcStatus::Success, WcOpcode::LocalInv));
    // SEND_WITH_INV of a window of the target's PD: bound by a plain RC QP on `b`.
    let bmw = b.pd.alloc_mw().unwrap();
    let (mut qb, _qc) = {
        let c = Node::<H>::open_with("xrc-mw", 2, all);
        let (mut x, mut y) =
            (b.qp(QpType::Rc, QpCaps::default(), None, false), c.qp(QpType::Rc, QpCaps::default(), None, false));
        connect::<H>(&mut x, &mut y, &ConnOpts::default());
        (x, (y, c))
    };
    let kb = inc_rkey(bmw.rkey());
    let bind = MwBind {
        new_rkey: kb,
        mr_lkey: b.mr.lkey(),
        addr: b.addr(8192),
        length: 64,
        access: AccessFlags::REMOTE_WRITE,
    };
    qb.post_send(&SendChain::one(SendWr::bind_mw(3, bmw.rkey(), bind).signaled(), &[])).unwrap();
    assert!(poll_one(&mut b.scq).is_ok());
    srq.post_recv(&RecvChain::one(40, &[b.sge(0, 64)])).unwrap();
    post(&mut qs, SendWr::send_with_inv(4, kb), &[a.sge(0, 8)]);
    assert!(poll_one(&mut a.scq).is_ok());
    let r = poll_one(&mut b.rcq);
    assert_eq!((r.wr_id, r.qp_num, r.imm_data), (40, qr.qp_num(), kb));
    assert!(r.wc_flags.contains(WcFlags::WITH_INV));
    // The window is gone: a write through it is refused.
    post(&mut qs, SendWr::write(5, b.addr(8192), kb), &[a.sge(0, 8)]);
    assert_eq!(poll_one(&mut a.scq).status, WcStatus::RemAccessErr);
}

/// ibv_post_send(3): once a send's completion is polled, its buffer may be reused, and so may
/// those of the unsignaled sends posted before it (a completion implies theirs). On `shm`
/// the poster's CPU does the receiver's copy, and in a post list it holds the receiver-side
/// stores of a SEND until the later WRs have claimed their cells (`HeldRecv`); its own
/// completion, and any later one, must wait for that copy too. Here one thread posts lists
/// of two SENDs (both signaled, or only the second) while a second thread polls the send CQ
/// and overwrites each first buffer as soon as a completion that frees it shows: the
/// receiver must still get the bytes as they were when posted.
#[test]
fn a_buffer_reused_after_its_send_completion_does_not_change_the_message() {
    use dataplane::{Cq, MemRegion, Pd, Srq};
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::Instant;
    /// The first SEND's bytes (more than a CQE carries, so they are copied to the buffer),
    /// the second's (long enough to keep the poster busy after the first completion), and
    /// where node b receives them.
    const FIRST: usize = 32 << 10;
    const SECOND: usize = 64 << 10;
    const RX: usize = 512 << 10;
    const ROUNDS: u64 = 500;
    // UC and RC to a receive queue, and RC to an SRQ (the pipeline's receive side; a list
    // to an RC receive queue may go through its message queue instead of holding).
    // With `selective`, only the second SEND is signaled (the usual pattern: one completion
    // for a list), and its completion frees both buffers.
    let kinds = [(QpType::Uc, false), (QpType::Rc, false), (QpType::Rc, true)];
    for ((t, use_srq), selective) in kinds.into_iter().flat_map(|k| [(k, false), (k, true)]) {
        let test = format!(
            "reuse-after-wc-{t:?}-{}{}",
            if use_srq { "srq" } else { "rq" },
            if selective { "-selective" } else { "" }
        );
        // The completion after which the poller overwrites the first buffer: wr_id % 2.
        let trigger = u64::from(selective);
        let caps = QpCaps { max_send_wr: 64, max_recv_wr: 64, ..QpCaps::default() };
        let (mut a, mut b) = (Node::<ShmHarness>::open(&test, 0), Node::<ShmHarness>::open(&test, 1));
        let mut srq = use_srq.then(|| b.pd.create_srq(&SrqAttr { max_wr: 64, max_sge: 1, srq_limit: 0 }).unwrap());
        let mut qa = a.qp(t, caps, None, false);
        let mut qb = b.qp(t, caps, srq.as_ref(), false);
        connect::<ShmHarness>(&mut qa, &mut qb, &ConnOpts::default());
        let b = &mut b;
        let mut post_recv = |rx: &RecvChain| match &mut srq {
            Some(srq) => srq.post_recv(rx).expect("post_srq_recv"),
            None => qb.post_recv(rx).expect("post_recv"),
        };
        let Node { scq, region, mr, .. } = &mut a;
        let (lkey, base) = (mr.lkey(), mr.addr());
        // Rounds whose first buffer the poller has overwritten (after the completion).
        let scribbled = AtomicU64::new(0);
        std::thread::scope(|sc| {
            let (region, scribbled) = (&*region, &scribbled);
            sc.spawn(move || {
                let mut wc = [WorkCompletion::default(); 4];
                // A liveness bound from the last completion, not from the start: under
                // ThreadSanitizer the rounds take over a minute.
                let mut end = Instant::now() + DEADLINE;
                while scribbled.load(Ordering::Relaxed) < ROUNDS && Instant::now() < end {
                    let n = scq.poll(&mut wc).expect("poll the send CQ");
                    if n > 0 {
                        end = Instant::now() + DEADLINE;
                    }
                    for w in &wc[..n] {
                        assert_eq!(w.status, WcStatus::Success, "{w:?}");
                        if w.wr_id % 2 == trigger {
                            region.write(0, &[0xee; FIRST]);
                            scribbled.fetch_add(1, Ordering::Release);
                        }
                    }
                }
            });
            let mut bad = 0;
            for r in 0..ROUNDS {
                let want = pattern(r as u8, FIRST);
                region.write(0, &want);
                post_recv(&RecvChain::one(2 * r, &[b.sge(RX, FIRST as u32)]));
                post_recv(&RecvChain::one(2 * r + 1, &[b.sge(RX + FIRST, SECOND as u32)]));
                let mut c = SendChain::with_capacity(2, 2);
                let first = if selective { SendWr::send(2 * r) } else { SendWr::send(2 * r).signaled() };
                c.push(first, &[Sge::new(base, FIRST as u32, lkey)]);
                c.push(SendWr::send(2 * r + 1).signaled(), &[Sge::new(base + FIRST as u64, SECOND as u32, lkey)]);
                qa.post_send(&c).expect("post_send");
                let wcs = poll_n(&mut b.rcq, 2);
                assert_eq!((wcs[0].wr_id, wcs[0].status), (2 * r, WcStatus::Success));
                if b.read(RX, FIRST) != want {
                    bad += 1;
                }
                // The next round rewrites the buffer only after this round's scribble.
                let end = Instant::now() + DEADLINE;
                while scribbled.load(Ordering::Acquire) <= r {
                    assert!(Instant::now() < end, "{test}: the send completion of round {r} never came");
                    std::hint::spin_loop();
                }
            }
            assert_eq!(bad, 0, "{test}: {bad} of {ROUNDS} messages carried bytes written after their send completed");
        });
    }
}

/// `Cq::poll_busy`, the worker's poll (an empty CQ answered by a cheap check of the ring and
/// the message queue), returns what `poll` returns: nothing on an empty CQ, a lone SEND the
/// sender wrote into the receiver's ring, the SENDs of a post list (queued in the message
/// queue, which the receiver's poll drains), the sender's completions, in order.
#[test]
fn poll_busy_returns_what_poll_returns() {
    use dataplane::Cq;
    let mut p = rc_pair::<ShmHarness>("poll-busy");
    let mut wc = [WorkCompletion::default(); 16];
    assert_eq!(p.b.rcq.poll_busy(&mut wc).unwrap(), 0, "nothing posted");
    assert_eq!(p.a.scq.poll_busy(&mut wc).unwrap(), 0, "nothing sent");
    for i in 0..4 {
        recv(&mut p.qb, &p.b, 100 + i, 64 * i as usize, 64);
    }
    assert_eq!(p.b.rcq.poll_busy(&mut wc).unwrap(), 0, "receives posted, nothing sent");
    send(&mut p.qa, &p.a, 1, 0, 8);
    let mut c = SendChain::new();
    for i in 2..5u64 {
        c.push(SendWr::send(i).signaled(), &[p.a.sge(0, 8)]);
    }
    p.qa.post_send(&c).unwrap();
    // The sender delivered (or queued) everything before `post_send` returned: a bounded
    // number of polls finds it all.
    fn busy_n(cq: &mut CqOf<ShmHarness>, n: usize) -> Vec<WorkCompletion> {
        let (mut got, mut wc) = (Vec::new(), [WorkCompletion::default(); 16]);
        for _ in 0..1000 {
            let k = cq.poll_busy(&mut wc).unwrap();
            got.extend_from_slice(&wc[..k]);
            if got.len() >= n {
                break;
            }
        }
        got
    }
    let got: Vec<_> = busy_n(&mut p.b.rcq, 4).iter().map(|w| (w.wr_id, w.status, w.byte_len)).collect();
    assert_eq!(got, (100..104).map(|id| (id, WcStatus::Success, 8)).collect::<Vec<_>>());
    assert_eq!(p.b.rcq.poll_busy(&mut wc).unwrap(), 0, "all four taken");
    let sent: Vec<_> = busy_n(&mut p.a.scq, 4).iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(sent, (1..5).map(|id| (id, WcStatus::Success)).collect::<Vec<_>>());
}

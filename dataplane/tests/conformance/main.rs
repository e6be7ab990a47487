//! The conformance suite: the verbs semantics of rdma-core's man pages (`ibv_post_send(3)`,
//! `ibv_post_recv(3)`, `ibv_post_srq_recv(3)` and its notes), one case per rule, generic over
//! the provider. docs/conformance.md lists each seed sentence and the case that checks it.
//!
//! Every case runs on `shm` here; the `rdma` provider instantiates the same cases inside the
//! Soft-RoCE VM.

mod atomics_two_process;
mod cases;
mod harness;
mod post_list;
mod shm_only;
mod two_process;
mod xrc;

use harness::Harness;

/// Runs the suite on the `shm` provider; each test gets its own fabric.
pub struct ShmHarness;

impl Harness for ShmHarness {
    type P = dataplane::shm::Shm;
    fn config(test: &str, _node: usize) -> dataplane::shm::ShmConfig {
        dataplane::shm::ShmConfig {
            fabric: format!("conf-{test}-{}", std::process::id()),
            size: 16 << 20,
            huge: dataplane::mem::HugePolicy::Never,
        }
    }
}

/// Instantiates every case for one harness.
macro_rules! suite {
    ($h:ty; $($case:ident),* $(,)?) => {
        $(
            #[test]
            fn $case() {
                if let Some(why) = <$h as Harness>::unsupported(stringify!($case)) {
                    println!("conformance case {} NOT RUN on this provider: {why}", stringify!($case));
                    return;
                }
                crate::cases::$case::<$h>(stringify!($case));
            }
        )*
    };
}

mod shm {
    use super::*;
    include!("case_list.rs");
}

/// Runs the suite on the `rdma` provider, inside `tools/rxe-vm` (Soft-RoCE): node 0 opens the
/// first device of `RXE_DEVS` (default `rxe0`), node 1 the second (default `rxe1`), port 1,
/// GID index 1 (RoCE v2 over IPv4). Enabled only with `DP_CONFORMANCE_RDMA=1`; otherwise every
/// case says NOT RUN.
pub struct RdmaHarness;

impl RdmaHarness {
    fn enabled() -> bool {
        std::env::var("DP_CONFORMANCE_RDMA").is_ok_and(|v| v == "1")
    }
}

impl Harness for RdmaHarness {
    type P = dataplane::rdma::Rdma;
    fn config(_test: &str, node: usize) -> dataplane::rdma::RdmaConfig {
        let devs = std::env::var("RXE_DEVS").unwrap_or_else(|_| "rxe0 rxe1".into());
        let mut it = devs.split([' ', ',']).filter(|s| !s.is_empty());
        let d0 = it.next().unwrap_or("rxe0").to_owned();
        let d1 = it.next().map(str::to_owned).unwrap_or_else(|| d0.clone());
        dataplane::rdma::RdmaConfig { device: Some(if node == 0 { d0 } else { d1 }), port: 1, gid_index: 1 }
    }
    fn gid_index() -> u8 {
        1
    }
    fn mcast_gid() -> [u8; 16] {
        std::net::Ipv4Addr::new(239, 1, 1, 1).to_ipv6_mapped().octets()
    }
    fn unsupported(case: &str) -> Option<&'static str> {
        if !Self::enabled() {
            return Some("set DP_CONFORMANCE_RDMA=1 inside tools/rxe-vm (tools/rxe-vm/conformance.sh)");
        }
        rdma_unsupported(case)
    }
    fn sge_checked_at_post() -> bool {
        false
    }
}

/// Why the RAW_PACKET cases cannot run on rxe (checked: its create_qp answers EOPNOTSUPP).
const RXE_NO_RAW: &str = "Soft-RoCE (rxe) has no RAW_PACKET QPs: ibv_create_qp(IBV_QPT_RAW_PACKET) answers EOPNOTSUPP \
     (the rdma provider says so naming the device)";

/// Why the XRC cases cannot run on rxe.
const RXE_NO_XRC: &str = "Soft-RoCE (rxe) has no XRC: IBV_DEVICE_XRC is not in its device_cap_flags, so open_xrcd and \
     XRC QPs are refused with EOPNOTSUPP naming the device (checked by xrc_refused_naming_the_device)";

/// Why the cases that fill an RC receive queue to its granted `max_recv_wr` cannot run on rxe
/// (seen in the VM, session 56: a list of 33 on an RC QP granted 32 all posted).
const RXE_RQ_ROUNDED_UP: &str =
    "rxe rounds its receive queue up to a power of two, so it is not full at the granted max_recv_wr";

/// Cases that cannot pass on rxe, with the reason.
fn rdma_unsupported(case: &str) -> Option<&'static str> {
    RDMA_UNSUPPORTED.iter().find(|(c, _)| *c == case).map(|(_, why)| *why)
}

/// The post-list cases whose WR 3 fails rxe's SGE check when the WQE executes: in 3 of
/// about 15 clean-clone CI runs (sessions 15 and 18), rxe delivered WRs 0-2 and then neither
/// completed anything nor left RTS (docs/rdma-provider.md). They run on `shm`, which checks
/// SGEs at post time; on `rdma` the other post-list cases still run. (Session 41's
/// srq_requests_behind_a_bad_send_stay_posted, whose WR 2 has the bad lkey, stalled the
/// same way in the VM: one send completion of four in 20 s.)
const RXE_STALLS_AFTER_LOCAL_PROT_ERR: &str = "rxe (Linux 6.1) intermittently stalls after the local protection \
     error of a WR in a post list (WR 3 of the post-list cases: receiver has WRs 0-2, no send completion, both QPs \
     stay RTS, 3 CI runs of ~15; WR 2 of the SRQ case: 1 send completion of 4 in 20 s); not a verdict on the \
     provider, so not run here";

/// Case name and why it cannot pass on the `rdma` provider over rxe.
const RDMA_UNSUPPORTED: &[(&str, &str)] = &[
    ("raw_packet_opcode_column", RXE_NO_RAW),
    ("raw_packet_frames_land_at_offset_0_steered_by_mac", RXE_NO_RAW),
    ("raw_packet_steering_fields_and_priority", RXE_NO_RAW),
    ("raw_packet_broadcast_reaches_every_matching_qp", RXE_NO_RAW),
    ("raw_packet_ip_csum", RXE_NO_RAW),
    ("raw_packet_too_small_buffer_fails_that_receive_only", RXE_NO_RAW),
    (
        "recv_queue_full_enomem_ud_and_raw",
        "rxe rounds its receive queue up to a power of two, so it is not full at the granted max_recv_wr (as for \
         recv_queue_full_enomem; seen in the VM: a chain of 9 on a UD QP granted 8 all posted); RAW_PACKET: no such \
         QPs on rxe",
    ),
    ("raw_packet_tso_64k_arrives_as_mss_frames", RXE_NO_RAW),
    ("raw_packet_tso_refusals", RXE_NO_RAW),
    ("xrc_send_opcode_column", RXE_NO_XRC),
    ("xrc_remote_srqn_routes_between_two_srqs", RXE_NO_XRC),
    ("xrc_srq_of_other_domain_refused", RXE_NO_XRC),
    ("xrc_srq_follows_the_srq_notes", RXE_NO_XRC),
    (
        "raw_packet_flow_on_other_qp_types_einval",
        "the rdma provider has no ibv_create_flow binding yet (create_flow is EOPNOTSUPP there)",
    ),
    (
        "mcast_send_reaches_every_member",
        "multicast delivery between rxe0 and rxe1 in the VM does not arrive (tried with the IPv4-mapped group \
         ::ffff:239.1.1.1 on GID index 1, with and without an IP-level join of 239.1.1.1 on both veth ends: the \
         send leaves rxe0, no member on rxe1 completes); RoCE multicast is normally joined through rdma_cm \
         (rdma_join_multicast), which the project does not use. Attach/detach are checked on rdma; delivery on shm",
    ),
    (
        "mcast_detach_stops_delivery",
        "needs multicast delivery between rxe0 and rxe1, which does not arrive in the VM (see \
         mcast_send_reaches_every_member)",
    ),
    (
        "tm_matched_message_lands_headerless",
        "rxe has no tag matching (no TM caps): ibv_post_srq_ops is mlx5-only; checked by tm_refused_without_tm_caps",
    ),
    (
        "tm_unexpected_lands_whole_and_asks_for_sync",
        "rxe has no tag matching (no TM caps): ibv_post_srq_ops is mlx5-only; checked by tm_refused_without_tm_caps",
    ),
    (
        "tm_phase_sync_gates_matching",
        "rxe has no tag matching (no TM caps): ibv_post_srq_ops is mlx5-only; checked by tm_refused_without_tm_caps",
    ),
    (
        "tm_delete_live_and_consumed_tags",
        "rxe has no tag matching (no TM caps): ibv_post_srq_ops is mlx5-only; checked by tm_refused_without_tm_caps",
    ),
    (
        "tm_list_full_and_ops_limit",
        "rxe has no tag matching (no TM caps): ibv_post_srq_ops is mlx5-only; checked by tm_refused_without_tm_caps",
    ),
    (
        "tm_bad_handle_and_plain_srq",
        "rxe has no tag matching (no TM caps): ibv_post_srq_ops is mlx5-only; checked by tm_refused_without_tm_caps",
    ),
    (
        "tm_matched_buffer_error_fails_the_sender",
        "rxe has no tag matching (no TM caps): ibv_post_srq_ops is mlx5-only; checked by tm_refused_without_tm_caps",
    ),
    (
        "tm_oldest_entry_matches_first",
        "rxe has no tag matching (no TM caps): ibv_post_srq_ops is mlx5-only; checked by tm_refused_without_tm_caps",
    ),
    (
        "ud_grh_and_offset",
        "RoCE v2 over IPv4 (rxe GID index 1) puts the IPv4 header in bytes 20..40 of the 40-byte GRH area, \
         not a GRH with the source GID",
    ),
    (
        "recv_buffer_too_small",
        "rxe completes the sender with REM_OP_ERR where ibv_poll_cq(3) and mlx5 give REM_INV_REQ_ERR",
    ),
    (
        "flush_after_peer_error_keeps_order",
        "rxe completes the sender with REM_OP_ERR where ibv_poll_cq(3) and mlx5 give REM_INV_REQ_ERR",
    ),
    (
        "srq_zero_sge_request_takes_only_empty_message",
        "rxe completes the sender with REM_OP_ERR where ibv_poll_cq(3) and mlx5 give REM_INV_REQ_ERR",
    ),
    (
        "post_list_with_a_receive_too_small_fails_as_one_by_one",
        "rxe completes the sender with REM_OP_ERR where ibv_poll_cq(3) and mlx5 give REM_INV_REQ_ERR",
    ),
    ("ud_recv_too_small_len_err", "rxe completes a too-small UD receive with LOC_QP_OP_ERR, not LOC_LEN_ERR"),
    (
        "modify_to_error_flushes_recvs",
        "rxe (Linux 6.1) flushes only the receives queued when the QP enters ERROR; one posted later never \
         completes",
    ),
    ("post_list_stops_at_a_refused_wr", RXE_STALLS_AFTER_LOCAL_PROT_ERR),
    ("srq_requests_behind_a_bad_send_stay_posted", RXE_STALLS_AFTER_LOCAL_PROT_ERR),
    ("post_list_checks_each_sge_of_a_shared_mr", RXE_STALLS_AFTER_LOCAL_PROT_ERR),
    (
        "send_queue_full_enomem",
        "rxe rounds its send queue up to a power of two, so it is not full at the granted max_send_wr",
    ),
    ("recv_queue_full_enomem", RXE_RQ_ROUNDED_UP),
    ("recv_list_longer_than_the_queue_stops_at_enomem", RXE_RQ_ROUNDED_UP),
];

mod rdma {
    use super::*;
    // Shadows the crate-level `suite!` so that case_list.rs (written for ShmHarness)
    // instantiates every case for RdmaHarness.
    macro_rules! suite {
        ($_shm:ty; $($case:ident),* $(,)?) => {
            $(
                #[test]
                fn $case() {
                    if let Some(why) = RdmaHarness::unsupported(stringify!($case)) {
                        println!("conformance case {} NOT RUN on rdma: {why}", stringify!($case));
                        return;
                    }
                    crate::cases::$case::<RdmaHarness>(stringify!($case));
                }
            )*
        };
    }
    include!("case_list.rs");

    /// On rxe (inside tools/rxe-vm), creating a RAW_PACKET QP fails with EOPNOTSUPP and a sentence
    /// naming the device; elsewhere NOT RUN.
    #[test]
    fn raw_packet_qp_is_refused_naming_the_device() {
        if !RdmaHarness::enabled() {
            println!("conformance case raw_packet_qp_is_refused_naming_the_device NOT RUN on rdma: set DP_CONFORMANCE_RDMA=1 inside tools/rxe-vm (tools/rxe-vm/conformance.sh)");
            return;
        }
        let a = crate::harness::Node::<RdmaHarness>::open("raw-refused", 0);
        let e = a
            .try_qp(dataplane::verbs::QpType::RawPacket, Default::default(), None, false)
            .err()
            .expect("rxe gave a RAW_PACKET QP");
        assert_eq!(e.errno, dataplane::verbs::Errno::EOPNOTSUPP, "{e}");
        assert!(e.msg.contains("does not give RAW_PACKET QPs") && e.msg.contains("rxe"), "{e}");
    }

    /// On rxe (inside tools/rxe-vm), which lacks IBV_DEVICE_XRC, opening an XRC domain and
    /// creating an XRC_SEND QP fail with EOPNOTSUPP and a sentence naming the device; elsewhere
    /// NOT RUN.
    #[test]
    fn xrc_refused_naming_the_device() {
        use dataplane::Context;
        if !RdmaHarness::enabled() {
            println!("conformance case xrc_refused_naming_the_device NOT RUN on rdma: set DP_CONFORMANCE_RDMA=1 inside tools/rxe-vm (tools/rxe-vm/conformance.sh)");
            return;
        }
        let a = crate::harness::Node::<RdmaHarness>::open("xrc-refused", 0);
        assert!(!a.ctx.caps().xrc, "rxe reports IBV_DEVICE_XRC: run the XRC cases instead");
        let e = a.ctx.open_xrcd().err().expect("rxe opened an XRC domain");
        assert_eq!(e.errno, dataplane::verbs::Errno::EOPNOTSUPP, "{e}");
        assert!(e.msg.contains("XRC not supported by device rxe"), "{e}");
        let e = a
            .try_qp(dataplane::verbs::QpType::XrcSend, Default::default(), None, false)
            .err()
            .expect("rxe gave an XRC_SEND QP");
        assert_eq!(e.errno, dataplane::verbs::Errno::EOPNOTSUPP, "{e}");
        assert!(e.msg.contains("XRC not supported by device rxe"), "{e}");
    }
}

/// Runs the RAW_PACKET cases on the `xdp` provider over a veth pair (`dpxa` for node 0,
/// `dpxb` for node 1, IPv6 off so that the kernel sends nothing on them) in a network
/// namespace of the case's own: the test thread unshares its network namespace (a
/// per-thread operation), so cases run in parallel without sharing interfaces and the pair
/// vanishes with the thread. Needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN, CAP_BPF); enabled with
/// `DP_CONFORMANCE_XDP=1`, which `.ci/run` sets, so that CI fails loudly when it cannot.
/// Otherwise every case says NOT RUN.
pub struct XdpHarness;

impl XdpHarness {
    fn enabled() -> bool {
        std::env::var("DP_CONFORMANCE_XDP").is_ok_and(|v| v == "1")
    }

    fn ip(args: &[&str]) {
        let out = std::process::Command::new("ip")
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("xdp conformance needs iproute2 (`ip`): {e}"));
        assert!(out.status.success(), "ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
    }

    /// A fresh network namespace for this thread, with the veth pair up in it.
    pub fn fresh_netns_with_pair() {
        // SAFETY: unshare(2) takes no pointers; CLONE_NEWNET affects the calling thread only.
        let r = unsafe { libc::unshare(libc::CLONE_NEWNET) };
        assert_eq!(r, 0, "unshare(CLONE_NEWNET): {} (the xdp cases need root)", std::io::Error::last_os_error());
        // No IPv6 on the new links: the kernel would send router solicitations and MLD
        // reports on them, which rules matching every frame would then receive. /proc/sys/net
        // is that of the opening thread's namespace.
        std::fs::write("/proc/sys/net/ipv6/conf/default/disable_ipv6", "1")
            .unwrap_or_else(|e| panic!("disabling IPv6 in the case's namespace: {e}"));
        // Children forked by this thread (ip) inherit its namespace.
        Self::ip(&["link", "add", "dpxa", "type", "veth", "peer", "name", "dpxb"]);
        for i in ["dpxa", "dpxb"] {
            Self::ip(&["link", "set", i, "up"]);
        }
        let v6 = std::process::Command::new("ip").args(["-6", "addr", "show", "dev", "dpxa"]).output().unwrap();
        assert!(v6.stdout.is_empty(), "dpxa has IPv6 addresses: {}", String::from_utf8_lossy(&v6.stdout));
    }
}

impl Harness for XdpHarness {
    type P = dataplane::xdp::Xdp;
    fn config(test: &str, node: usize) -> dataplane::xdp::XdpConfig {
        let _ = test;
        if node == 0 {
            Self::fresh_netns_with_pair();
        }
        let mut c = dataplane::xdp::XdpConfig::new(if node == 0 { "dpxa" } else { "dpxb" });
        c.frames = 256;
        c
    }
    fn unsupported(case: &str) -> Option<&'static str> {
        if !Self::enabled() {
            return Some(
                "set DP_CONFORMANCE_XDP=1 as root (it creates veth pairs and loads an XDP program); .ci/run does",
            );
        }
        XDP_UNSUPPORTED.iter().find(|(c, _)| *c == case).map(|(_, why)| *why)
    }
}

/// RAW_PACKET cases that cannot run on `xdp`, with the reason.
const XDP_UNSUPPORTED: &[(&str, &str)] = &[
    (
        "raw_packet_flow_on_other_qp_types_einval",
        "the xdp provider has RAW_PACKET QPs only: there is no UD or RC QP to refuse a rule on",
    ),
    ("recv_queue_full_enomem_ud_and_raw", "the xdp provider has RAW_PACKET QPs only (the case also needs UD)"),
];

mod xdp {
    use super::*;
    suite!(XdpHarness;
        raw_packet_opcode_column,
        raw_packet_frames_land_at_offset_0_steered_by_mac,
        raw_packet_steering_fields_and_priority,
        raw_packet_broadcast_reaches_every_matching_qp,
        raw_packet_ip_csum,
        raw_packet_too_small_buffer_fails_that_receive_only,
        raw_packet_tso_64k_arrives_as_mss_frames,
        raw_packet_tso_refusals,
        raw_packet_flow_on_other_qp_types_einval,
        recv_queue_full_enomem_ud_and_raw,
    );

    use dataplane::verbs::{Errno, FlowSpec, QpType, RecvChain, SendChain, SendWr};
    use dataplane::{Provider, Qp};

    /// veth has no zero-copy AF_XDP: `Auto` falls back to copy mode and says so; a second
    /// context on the same queue is refused with EBUSY naming the interface; the port counts
    /// what it received, delivered and dropped (no receive posted, no rule).
    #[test]
    fn xdp_on_veth_copy_mode_busy_queue_and_counters() {
        if let Some(why) = XdpHarness::unsupported("xdp_on_veth_copy_mode_busy_queue_and_counters") {
            println!("conformance case xdp_on_veth_copy_mode_busy_queue_and_counters NOT RUN on this provider: {why}");
            return;
        }
        let mut a = crate::harness::Node::<XdpHarness>::open("xdp-veth", 0);
        let mut b = crate::harness::Node::<XdpHarness>::open("xdp-veth", 1);
        assert!(!a.ctx.zero_copy(1), "veth has no zero-copy AF_XDP; Auto must have fallen back to copy mode");
        let e = dataplane::xdp::Xdp::open(&dataplane::xdp::XdpConfig::new("dpxb"))
            .err()
            .expect("a second socket on dpxb queue 0");
        assert_eq!(e.errno, Errno::EBUSY, "{e}");
        assert!(e.msg.contains("dpxb"), "{e}");
        let mut qa = a.qp(QpType::RawPacket, Default::default(), None, false);
        let mut qb = b.qp(QpType::RawPacket, Default::default(), None, false);
        crate::harness::ud_ready(&mut qa, 0);
        crate::harness::ud_ready(&mut qb, 0);
        qb.create_flow(&FlowSpec { ether_type: Some(0x88b5), ..Default::default() }).unwrap();
        let mut f = vec![0x02, 0, 0, 0, 0, 1, 0x02, 0, 0, 0, 0, 2, 0x88, 0xb5];
        f.resize(60, 0xab);
        a.write(0, &f);
        let send = |qa: &mut <dataplane::xdp::Xdp as Provider>::Qp, a: &mut crate::harness::Node<XdpHarness>, id| {
            qa.post_send(&SendChain::one(SendWr::send(id).signaled(), &[a.sge(0, 60)])).unwrap();
            assert!(crate::harness::poll_one(&mut a.scq).is_ok());
        };
        send(&mut qa, &mut a, 1); // no receive posted at qb: dropped
        qb.post_recv(&RecvChain::one(7, &[b.sge(4096, 128)])).unwrap();
        send(&mut qa, &mut a, 2); // delivered
        let r = crate::harness::poll_one(&mut b.rcq);
        assert_eq!((r.wr_id, r.byte_len), (7, 60));
        assert_eq!(b.read(4096, 60), f);
        f[12] = 0x08; // EtherType 0x08b5: no rule
        a.write(0, &f);
        send(&mut qa, &mut a, 3);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let c = loop {
            crate::harness::assert_no_completion(&mut b.rcq);
            let c = b.ctx.counters(1).unwrap();
            if c.rx_frames >= 3 || std::time::Instant::now() > deadline {
                break c;
            }
        };
        assert_eq!((c.rx_frames, c.rx_delivered, c.rx_no_recv, c.rx_no_rule), (3, 1, 1, 1), "{c:?}");
        assert_eq!(a.ctx.counters(1).unwrap().tx_frames, 3);
    }

    /// Two interfaces as ports 1 and 2 of one context, QPs bound to each at INIT, both on
    /// one SRQ: a frame sent by the port-1 QP out of dpxa arrives on dpxb and lands in an SRQ
    /// buffer through the port-2 QP (not the port-1 QP, though its rule matches too: steering
    /// is per port); the SRQ's limit event fires once (ibv_modify_srq(3)); port 3 does not
    /// exist (EINVAL at INIT).
    #[test]
    fn xdp_two_ports_one_srq() {
        use dataplane::verbs::{
            AccessFlags, AsyncEventKind, ConnectOpts, QpAttr, QpCaps, QpState, SrqAttr, SrqAttrMask,
        };
        use dataplane::{Context, MemRegion, Mr, Pd, QpInitAttr, Srq};
        if let Some(why) = XdpHarness::unsupported("xdp_two_ports_one_srq") {
            println!("conformance case xdp_two_ports_one_srq NOT RUN on this provider: {why}");
            return;
        }
        XdpHarness::fresh_netns_with_pair();
        let mut cfg = dataplane::xdp::XdpConfig::ports(&["dpxa", "dpxb"]);
        cfg.frames = 256;
        let ctx = dataplane::xdp::Xdp::open(&cfg).expect("open dpxa + dpxb");
        assert_eq!(ctx.ifname(2), Some("dpxb"));
        let pd = ctx.alloc_pd().unwrap();
        let region = ctx.alloc_region(1 << 16).unwrap();
        let mr = pd.reg_mr(&region, 0, 1 << 16, AccessFlags::LOCAL_WRITE).unwrap();
        let mut scq = ctx.create_cq(64).unwrap();
        let mut rcq = ctx.create_cq(64).unwrap();
        let mut srq = pd.create_srq(&SrqAttr { max_wr: 8, max_sge: 1, srq_limit: 0 }).unwrap();
        let attr = QpInitAttr::<dataplane::xdp::Xdp> {
            send_cq: &scq,
            recv_cq: &rcq,
            srq: Some(&srq),
            cap: QpCaps { max_recv_wr: 0, ..Default::default() },
            qp_type: QpType::RawPacket,
            sq_sig_all: true,
        };
        let mk = |port: u8| {
            let mut q = pd.create_qp(&attr).unwrap();
            q.ready(&ConnectOpts { port_num: port, ..Default::default() }).unwrap();
            q
        };
        let (mut q1, mut q2) = (mk(1), mk(2));
        let mut q3 = pd.create_qp(&attr).unwrap();
        let e = q3.modify(&QpAttr { state: QpState::Init, port_num: 3, ..Default::default() }).unwrap_err();
        assert_eq!(e.errno, Errno::EINVAL, "{e}");
        assert!(e.msg.contains("port 3"), "{e}");
        for q in [&mut q1, &mut q2] {
            q.create_flow(&FlowSpec { ether_type: Some(0x88b5), ..Default::default() }).unwrap();
        }
        for i in 0..4u64 {
            srq.post_recv(&RecvChain::one(
                100 + i,
                &[dataplane::verbs::Sge::new(mr.addr() + 4096 + i * 256, 256, mr.lkey())],
            ))
            .unwrap();
        }
        srq.modify(&SrqAttr { srq_limit: 4, ..Default::default() }, SrqAttrMask::LIMIT).unwrap();
        let mut f = vec![0x02, 0, 0, 0, 0, 9, 0x02, 0, 0, 0, 0, 8, 0x88, 0xb5];
        f.resize(64, 0x5a);
        region.write(0, &f);
        q1.post_send(&SendChain::one(SendWr::send(1), &[dataplane::verbs::Sge::new(mr.addr(), 64, mr.lkey())]))
            .unwrap();
        let s = crate::harness::poll_one(&mut scq);
        assert_eq!((s.wr_id, s.qp_num), (1, q1.qp_num()));
        let r = crate::harness::poll_one(&mut rcq);
        assert_eq!((r.wr_id, r.qp_num, r.byte_len), (100, q2.qp_num(), 64), "arrived on port 2, through q2");
        let mut got = vec![0u8; 64];
        region.read(4096, &mut got);
        assert_eq!(got, f);
        crate::harness::assert_no_completion(&mut rcq);
        let ev = ctx.poll_async_event().expect("the SRQ limit event");
        assert_eq!((ev.kind, ev.element), (AsyncEventKind::SrqLimitReached, srq.srq_num()));
        assert!(ctx.poll_async_event().is_none(), "once");
        assert_eq!(srq.query().unwrap().srq_limit, 0, "disarmed");
        let e = q2.post_recv(&RecvChain::one(1, &[dataplane::verbs::Sge::new(mr.addr(), 8, mr.lkey())])).unwrap_err();
        assert_eq!(e.errno, Errno::EINVAL, "post_recv on a QP with an SRQ");
    }

    /// Opening an interface that does not exist is ENODEV naming it (no root needed).
    #[test]
    fn xdp_missing_interface_is_enodev() {
        let e = dataplane::xdp::Xdp::open(&dataplane::xdp::XdpConfig::new("dpx-nonesuch")).err().expect("opened");
        assert_eq!(e.errno, Errno::ENODEV, "{e}");
        assert!(e.msg.contains("dpx-nonesuch"), "{e}");
    }
}

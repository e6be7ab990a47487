//! The cases. Each names the seed rule it checks in its doc comment; docs/conformance.md maps
//! every seed sentence to its cases.
//!
//! Conventions: `a`/`qa` is the requester, `b`/`qb` the responder. Offsets below 64 KiB of a
//! node's buffer are send sources, receive buffers start at 64 KiB unless a case says
//! otherwise. Nothing here measures time: waits are bounded only by the harness's liveness
//! deadline.

use crate::harness::*;
use dataplane::verbs::*;
use dataplane::{Context, Cq, MemRegion, Mr, Pd, Qp, Srq};

pub use crate::post_list::*;
pub use crate::xrc::*;

/// Receive buffers start here in a node's buffer.
const RX: usize = 64 << 10;

// ------------------------------------------------------------------------------------------
// ibv_post_send(3)
// ------------------------------------------------------------------------------------------

/// ibv_post_send(3)/ibv_post_recv(3): a SEND lands in the posted receive buffer; both sides
/// get a successful completion with their `wr_id`.
pub fn send_recv_basic<H: Harness>(t: &str) {
    let mut p = rc_pair::<H>(t);
    p.a.write(0, b"hello, verbs");
    recv(&mut p.qb, &p.b, 77, 100, 64);
    send(&mut p.qa, &p.a, 42, 0, 12);
    let s = poll_n(&mut p.a.scq, 1)[0];
    assert_eq!((s.status, s.opcode, s.wr_id, s.qp_num), (WcStatus::Success, WcOpcode::Send, 42, p.qa.qp_num()));
    let r = poll_n(&mut p.b.rcq, 1)[0];
    assert_eq!(
        (r.status, r.opcode, r.wr_id, r.byte_len, r.qp_num),
        (WcStatus::Success, WcOpcode::Recv, 77, 12, p.qb.qp_num())
    );
    assert!(!r.wc_flags.contains(WcFlags::WITH_IMM));
    assert_eq!(p.b.read(100, 12), b"hello, verbs");
}

/// ibv_post_send(3): "It stops processing WRs from this list at the first failure (that can be
/// detected immediately while requests are being posted), and returns this failing WR through
/// bad_wr." A 3-WR chain whose WR 1 has an unknown lkey: EINVAL at 1, WR 0 is delivered, WR 2
/// is not. (Where lkeys are checked only at execution — mlx5, rxe — WR 1 completes with an
/// error instead and WR 2 is flushed; the receiver still gets exactly one message.)
pub fn send_chain_stops_at_first_bad_wr<H: Harness>(t: &str) {
    let mut p = rc_pair::<H>(t);
    for i in 0..3 {
        recv(&mut p.qb, &p.b, 100 + i, RX + i as usize * 64, 64);
    }
    p.a.write(0, b"first");
    let mut c = SendChain::new();
    c.push(SendWr::send(1).signaled(), &[p.a.sge(0, 5)]);
    c.push(SendWr::send(2).signaled(), &[Sge::new(p.a.addr(0), 5, p.a.mr.lkey() ^ 0x00ab_c000)]);
    c.push(SendWr::send(3).signaled(), &[p.a.sge(0, 5)]);
    if !H::sge_checked_at_post() {
        p.qa.post_send(&c).unwrap();
        let s = poll_n(&mut p.a.scq, 3);
        assert_eq!((s[0].wr_id, s[0].status), (1, WcStatus::Success));
        assert_eq!((s[1].wr_id, s[2].wr_id, s[2].status), (2, 3, WcStatus::WrFlushErr));
        assert_ne!(s[1].status, WcStatus::Success);
        assert_eq!(poll_one(&mut p.b.rcq).wr_id, 100);
        assert_no_completion(&mut p.b.rcq);
        return;
    }
    expect_post_err(p.qa.post_send(&c), Errno::EINVAL, 1);
    let s = poll_one(&mut p.a.scq);
    assert_eq!((s.wr_id, s.status), (1, WcStatus::Success));
    let r = poll_one(&mut p.b.rcq);
    assert_eq!((r.wr_id, r.status, r.byte_len), (100, WcStatus::Success, 5));
    assert_eq!(p.b.read(RX, 5), b"first");
    assert_no_completion(&mut p.b.rcq);
    assert_no_completion(&mut p.a.scq);
    // A post-time failure changes nothing: the QP still works and RR 101 is next.
    send(&mut p.qa, &p.a, 4, 0, 5);
    assert_eq!(poll_one(&mut p.b.rcq).wr_id, 101);
    assert_eq!(poll_one(&mut p.a.scq).wr_id, 4);
}

/// ibv_post_send(3): bad_wr names the first failing WR; when it is the first of the chain
/// nothing is posted at all. (The fault is a bad num_sge, found at post time by every
/// provider; a bad lkey where SGEs are checked at post time.)
pub fn send_bad_first_wr_posts_nothing<H: Harness>(t: &str) {
    let mut p = rc_pair::<H>(t);
    recv(&mut p.qb, &p.b, 100, RX, 64);
    let too_many = vec![p.a.sge(0, 8); p.qa.caps().max_send_sge as usize + 1];
    let mut c = SendChain::new();
    c.push(SendWr::send(1).signaled(), &too_many);
    c.push(SendWr::send(2).signaled(), &[p.a.sge(0, 8)]);
    expect_post_err(p.qa.post_send(&c), Errno::EINVAL, 0);
    if H::sge_checked_at_post() {
        let mut c = SendChain::new();
        c.push(SendWr::send(3).signaled(), &[Sge::new(p.a.addr(0), 8, 0xdead_beef)]);
        c.push(SendWr::send(4).signaled(), &[p.a.sge(0, 8)]);
        expect_post_err(p.qa.post_send(&c), Errno::EINVAL, 0);
    }
    assert_no_completion(&mut p.b.rcq);
    assert_no_completion(&mut p.a.scq);
    assert_eq!(p.qa.state(), QpState::Rts);
}

/// Fills in the fields an opcode needs so that only the opcode/QP-type rule can reject it.
fn wr_for<H: Harness>(op: WrOpcode, wr_id: u64, remote: (u64, u32), ud: Option<(&AhOf<H>, u32)>) -> SendWr {
    let mut wr = SendWr::with_opcode(wr_id, op);
    (wr.remote_addr, wr.rkey) = remote;
    if let Some((ah, qpn)) = ud {
        wr = wr.to(dataplane::Ah::handle(ah), qpn, QKEY);
    }
    wr
}

/// The seed's opcode table (UD, UC, RC and RAW_PACKET columns), written out independently of
/// the model.
fn seed_table_allows(op: WrOpcode, t: QpType) -> bool {
    use WrOpcode::*;
    let (ud, uc, rc, raw) = match op {
        Send => (true, true, true, true),
        SendWithImm => (true, true, true, false),
        RdmaWrite | RdmaWriteWithImm => (false, true, true, false),
        RdmaRead | AtomicCmpAndSwp | AtomicFetchAndAdd => (false, false, true, false),
        LocalInv | BindMw | SendWithInv => (false, true, true, false),
        Tso => (true, false, false, true),
    };
    match t {
        QpType::Ud => ud,
        QpType::Uc => uc,
        QpType::Rc => rc,
        QpType::RawPacket => raw,
        QpType::XrcSend | QpType::XrcRecv => unreachable!("the XRC column is xrc::seed_xrc_send_allows"),
    }
}

/// Posts every forbidden opcode of `qt` behind a good SEND in a chain: EINVAL at bad_wr 1 and
/// the SEND delivered; then SEND and SEND_WITH_IMM alone work.
fn opcode_column<H: Harness>(
    qt: QpType,
    qa: &mut QpOf<H>,
    a: &mut Node<H>,
    qb: &mut QpOf<H>,
    b: &mut Node<H>,
    ud: Option<(&AhOf<H>, u32)>,
) {
    let hdr = if qt == QpType::Ud { GRH_LEN } else { 0 };
    let remote = (b.addr(RX), b.mr.rkey());
    let good = |wr_id: u64, op: WrOpcode| {
        let mut wr = wr_for::<H>(op, wr_id, remote, ud).signaled();
        wr.imm_data = 0xc0de_0000 | wr_id as u32;
        wr
    };
    let mut n = 0u64;
    for op in WrOpcode::ALL {
        if seed_table_allows(op, qt) {
            continue;
        }
        qb.post_recv(&RecvChain::one(n, &[b.sge(RX + n as usize * 128, 128)])).unwrap();
        let mut c = SendChain::new();
        c.push(good(n, WrOpcode::Send), &[a.sge(0, 8)]);
        c.push(wr_for::<H>(op, 1000 + n, remote, ud), &[a.sge(64, 8)]);
        let e = qa.post_send(&c).expect_err(op.name());
        assert_eq!((e.errno, e.bad_wr), (Errno::EINVAL, 1), "{} on {qt:?}: {e}", op.name());
        let s = poll_one(&mut a.scq);
        assert_eq!((s.wr_id, s.status), (n, WcStatus::Success), "{} on {qt:?}", op.name());
        let r = poll_one(&mut b.rcq);
        assert_eq!((r.wr_id, r.status, r.byte_len), (n, WcStatus::Success, hdr as u32 + 8), "{}", op.name());
        n += 1;
    }
    assert!(n > 0);
    for op in [WrOpcode::Send, WrOpcode::SendWithImm] {
        qb.post_recv(&RecvChain::one(n, &[b.sge(RX + n as usize * 128, 128)])).unwrap();
        qa.post_send(&SendChain::one(good(n, op), &[a.sge(0, 8)])).unwrap_or_else(|e| panic!("{}: {e}", op.name()));
        let s = poll_one(&mut a.scq);
        assert_eq!((s.wr_id, s.status, s.opcode), (n, WcStatus::Success, WcOpcode::Send));
        let r = poll_one(&mut b.rcq);
        assert_eq!((r.wr_id, r.status, r.opcode), (n, WcStatus::Success, WcOpcode::Recv));
        assert_eq!(r.wc_flags.contains(WcFlags::WITH_IMM), op == WrOpcode::SendWithImm);
        n += 1;
    }
    assert_no_completion(&mut b.rcq);
}

/// ibv_post_send(3): "Each QP Transport Service Type supports a specific set of opcodes, as
/// shown in the following table" — UD column: only SEND, SEND_WITH_IMM (and TSO) are allowed;
/// every other opcode fails at post time with EINVAL and bad_wr.
pub fn send_opcode_table_ud<H: Harness>(t: &str) {
    let UdPair { mut a, mut b, mut qa, mut qb, ah } = ud_pair::<H>(t);
    let qpn = qb.qp_num();
    opcode_column::<H>(QpType::Ud, &mut qa, &mut a, &mut qb, &mut b, Some((&ah, qpn)));
}

/// ibv_post_send(3) opcode table, UC column: RDMA_READ and the atomics (and TSO) are not
/// allowed on UC; SEND and SEND_WITH_IMM are.
pub fn send_opcode_table_uc<H: Harness>(t: &str) {
    let cap = QpCaps { max_send_sge: 4, max_recv_sge: 4, ..Default::default() };
    let Pair { mut a, mut b, mut qa, mut qb } = pair::<H>(t, QpType::Uc, cap, ConnOpts::default());
    opcode_column::<H>(QpType::Uc, &mut qa, &mut a, &mut qb, &mut b, None);
}

/// ibv_post_send(3) opcode table, RC column: everything but TSO is allowed; TSO fails with
/// EINVAL; SEND and SEND_WITH_IMM work.
pub fn send_opcode_table_rc<H: Harness>(t: &str) {
    let Pair { mut a, mut b, mut qa, mut qb } = rc_pair::<H>(t);
    opcode_column::<H>(QpType::Rc, &mut qa, &mut a, &mut qb, &mut b, None);
}

/// ibv_post_send(3) opcode table: TSO is allowed on UD, but only where the device offloads
/// segmentation; the `shm` provider does not (EOPNOTSUPP at post time, QP unaffected).
/// LOCAL_INV, BIND_MW and SEND_WITH_INV are exercised with memory windows in
/// `shm_only::windows`.
pub fn send_unimplemented_opcodes_refused<H: Harness>(t: &str) {
    let mut u = ud_pair::<H>(&format!("{t}-ud"));
    let qpn = u.qb.qp_num();
    let tso = wr_for::<H>(WrOpcode::Tso, 9, (u.b.addr(RX), u.b.mr.rkey()), Some((&u.ah, qpn)));
    let e = u.qa.post_send(&SendChain::one(tso, &[u.a.sge(0, 8)])).expect_err("TSO was accepted");
    assert_eq!(e.bad_wr, 0);
    assert_no_completion(&mut u.a.scq);
    assert_eq!(u.qa.state(), QpState::Rts);
}

/// ibv_post_send(3): post_send returns ENOMEM when the send queue is full; the failing WR and
/// the rest of the chain are not posted. A send WQE's slot frees only when its completion, or
/// that of a later WQE of the QP, is polled (hardware semantics with selective signaling).
pub fn send_queue_full_enomem<H: Harness>(t: &str) {
    let cap = QpCaps { max_send_wr: 4, max_recv_sge: 1, ..Default::default() };
    let mut p = pair_full::<H>(t, QpType::Rc, cap, ConnOpts::default(), false);
    let depth = p.qa.caps().max_send_wr as u64;
    assert!(depth >= 2);
    for i in 0..2 * depth + 2 {
        recv(&mut p.qb, &p.b, 100 + i, RX + i as usize * 64, 64);
    }
    // depth-1 unsignaled, then a chain [signaled, one more]: the second does not fit.
    for i in 0..depth - 1 {
        p.qa.post_send(&SendChain::one(SendWr::send(i), &[p.a.sge(0, 8)])).unwrap();
    }
    let mut c = SendChain::new();
    c.push(SendWr::send(depth - 1).signaled(), &[p.a.sge(0, 8)]);
    c.push(SendWr::send(99).signaled(), &[p.a.sge(0, 8)]);
    expect_post_err(p.qa.post_send(&c), Errno::ENOMEM, 1);
    expect_post_err(p.qa.post_send(&SendChain::one(SendWr::send(98), &[p.a.sge(0, 8)])), Errno::ENOMEM, 0);
    let got = poll_n(&mut p.b.rcq, depth as usize);
    assert_eq!(got.iter().map(|w| w.wr_id).collect::<Vec<_>>(), (100..100 + depth).collect::<Vec<_>>());
    assert_no_completion(&mut p.b.rcq);
    // Polling the one signaled completion frees every slot up to it.
    let s = poll_one(&mut p.a.scq);
    assert_eq!((s.wr_id, s.status), (depth - 1, WcStatus::Success));
    let mut c = SendChain::new();
    for i in 0..depth {
        let wr = SendWr::send(200 + i);
        c.push(if i == depth - 1 { wr.signaled() } else { wr }, &[p.a.sge(0, 8)]);
    }
    p.qa.post_send(&c).expect("queue accepts again after the completion was polled");
    assert_eq!(poll_n(&mut p.b.rcq, depth as usize).len(), depth as usize);
    assert_eq!(poll_one(&mut p.a.scq).wr_id, 200 + depth - 1);
}

/// ibv_post_send(3): "IBV_SEND_SIGNALED Set the completion notification indicator. Relevant
/// only if QP was created with sq_sig_all=0": unsignaled WRs give no completion, signaled ones
/// do.
pub fn send_selective_signaling<H: Harness>(t: &str) {
    let mut p = pair_full::<H>(t, QpType::Rc, QpCaps::default(), ConnOpts::default(), false);
    let mut c = SendChain::new();
    for i in 0..6u64 {
        recv(&mut p.qb, &p.b, 100 + i, RX + i as usize * 64, 64);
        let wr = SendWr::send(i);
        c.push(if i % 3 == 1 { wr.signaled() } else { wr }, &[p.a.sge(0, 8)]);
    }
    p.qa.post_send(&c).unwrap();
    assert_eq!(poll_n(&mut p.b.rcq, 6).len(), 6);
    let s = poll_n(&mut p.a.scq, 2);
    assert_eq!(
        s.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [(1, WcStatus::Success), (4, WcStatus::Success)]
    );
    assert_no_completion(&mut p.a.scq);
}

/// ibv_post_send(3): with sq_sig_all=1 every WR completes, SIGNALED or not.
pub fn send_sig_all_signals_every_wr<H: Harness>(t: &str) {
    let mut p = pair_full::<H>(t, QpType::Rc, QpCaps::default(), ConnOpts::default(), true);
    let mut c = SendChain::new();
    for i in 0..4u64 {
        recv(&mut p.qb, &p.b, 100 + i, RX + i as usize * 64, 64);
        c.push(SendWr::send(i), &[p.a.sge(0, 8)]);
    }
    p.qa.post_send(&c).unwrap();
    let s = poll_n(&mut p.a.scq, 4);
    assert_eq!(s.iter().map(|w| w.wr_id).collect::<Vec<_>>(), [0, 1, 2, 3]);
    assert!(s.iter().all(|w| w.status == WcStatus::Success && w.opcode == WcOpcode::Send));
    assert_no_completion(&mut p.a.scq);
}

/// ibv_post_send(3) (SIGNALED is only a request for success completions): an unsignaled WR
/// that fails still generates a completion, with its error and wr_id.
pub fn send_failed_unsignaled_wr_completes<H: Harness>(t: &str) {
    let mut p = rc_pair::<H>(t);
    let wr = SendWr::write(0xbad, p.b.addr(RX), p.b.mr.rkey() ^ 0x0f0f_0000);
    p.qa.post_send(&SendChain::one(wr, &[p.a.sge(0, 8)])).unwrap();
    let s = poll_one(&mut p.a.scq);
    assert_eq!((s.wr_id, s.status), (0xbad, WcStatus::RemAccessErr));
    assert_eq!(p.qa.state(), QpState::Error);
}

/// ibv_post_send(3)/ibv_post_recv(3): "wr_id: User defined WR ID" — returned unchanged in the
/// completion, every 64-bit value included, repeated values too.
pub fn wr_id_round_trip<H: Harness>(t: &str) {
    let mut p = rc_pair::<H>(t);
    // srq notes: wr_id "is a completely application specific ... it can be [any] value" —
    // duplicates included.
    let ids = [0u64, u64::MAX, 0x0123_4567_89ab_cdef, 1 << 63, 0x8000_0000, 0, u64::MAX];
    for (i, id) in ids.iter().enumerate() {
        recv(&mut p.qb, &p.b, !id, RX + i * 64, 64);
    }
    let mut c = SendChain::new();
    for id in ids {
        c.push(SendWr::send(id).signaled(), &[p.a.sge(0, 4)]);
    }
    p.qa.post_send(&c).unwrap();
    let s: Vec<u64> = poll_n(&mut p.a.scq, ids.len()).iter().map(|w| w.wr_id).collect();
    let r: Vec<u64> = poll_n(&mut p.b.rcq, ids.len()).iter().map(|w| w.wr_id).collect();
    assert_eq!(s, ids);
    assert_eq!(r, ids.iter().map(|i| !i).collect::<Vec<_>>());
}

/// ibv_post_send(3): "imm_data: Immediate data" of SEND_WITH_IMM reaches the receiver's
/// completion with IBV_WC_WITH_IMM; a plain SEND carries no immediate flag.
pub fn send_with_imm_delivers_imm<H: Harness>(t: &str) {
    let mut p = rc_pair::<H>(t);
    for i in 0..3 {
        recv(&mut p.qb, &p.b, i, RX + i as usize * 64, 64);
    }
    let mut c = SendChain::new();
    c.push(SendWr::send_with_imm(1, 0xdead_beef).signaled(), &[p.a.sge(0, 8)]);
    c.push(SendWr::send(2).signaled(), &[p.a.sge(0, 8)]);
    c.push(SendWr::send_with_imm(3, 0).signaled(), &[]);
    p.qa.post_send(&c).unwrap();
    let r = poll_n(&mut p.b.rcq, 3);
    assert_eq!((r[0].opcode, r[0].imm_data, r[0].byte_len), (WcOpcode::Recv, 0xdead_beef, 8));
    assert!(r[0].wc_flags.contains(WcFlags::WITH_IMM));
    assert!(!r[1].wc_flags.contains(WcFlags::WITH_IMM));
    assert_eq!((r[2].imm_data, r[2].byte_len), (0, 0));
    assert!(r[2].wc_flags.contains(WcFlags::WITH_IMM), "an immediate of 0 is still an immediate");
    assert!(poll_n(&mut p.a.scq, 3).iter().all(|w| w.status == WcStatus::Success));
}

/// ibv_post_send(3): "However, if the IBV_SEND_INLINE flag was set, the buffer can be reused
/// immediately after the call returns." The send waits (no receive posted yet) while the
/// source buffer and the chain are overwritten; the receiver still gets the original bytes.
pub fn inline_buffer_reusable_at_once<H: Harness>(t: &str) {
    let mut p = rc_pair::<H>(t);
    let orig = pattern(1, 48);
    p.a.write(0, &orig);
    let mut c = SendChain::new();
    c.push(SendWr::send(1).signaled().inline(), &[p.a.sge(0, 16), p.a.sge(16, 32)]);
    let mut data = pattern(2, 40);
    c.push_inline(SendWr::send(2).signaled(), &data);
    p.qa.post_send(&c).unwrap();
    p.a.write(0, &[0u8; 48]);
    data.fill(0);
    c.clear();
    c.push_inline(SendWr::send(3), &[0xee; 40]);
    recv(&mut p.qb, &p.b, 10, RX, 64);
    recv(&mut p.qb, &p.b, 11, RX + 64, 64);
    // Sender first: on shm the RNR retry runs in the sender's poll.
    assert!(poll_n(&mut p.a.scq, 2).iter().all(|w| w.status == WcStatus::Success));
    let r = poll_n(&mut p.b.rcq, 2);
    assert_eq!(
        (r[0].status, r[0].byte_len, r[1].status, r[1].byte_len),
        (WcStatus::Success, 48, WcStatus::Success, 40)
    );
    assert_eq!(p.b.read(RX, 48), orig);
    assert_eq!(p.b.read(RX + 64, 40), pattern(2, 40));
}

/// ibv_post_send(3): "IBV_SEND_INLINE ... The L_Key will not be checked." An inline SGE with a
/// bogus lkey (address inside this process's registered memory) is accepted and delivered.
pub fn inline_lkey_not_checked<H: Harness>(t: &str) {
    let mut p = rc_pair::<H>(t);
    let data = pattern(3, 24);
    p.a.write(512, &data);
    recv(&mut p.qb, &p.b, 1, RX, 64);
    recv(&mut p.qb, &p.b, 2, RX + 64, 64);
    let mut c = SendChain::new();
    c.push(SendWr::send(1).signaled().inline(), &[Sge::new(p.a.addr(512), 24, 0xdead_beef)]);
    c.push(SendWr::send(2).signaled().inline(), &[Sge::new(p.a.addr(512), 24, 0)]);
    p.qa.post_send(&c).expect("inline with a bogus lkey");
    let r = poll_n(&mut p.b.rcq, 2);
    assert!(r.iter().all(|w| w.status == WcStatus::Success && w.byte_len == 24));
    assert_eq!(p.b.read(RX, 24), data);
    assert_eq!(p.b.read(RX + 64, 24), data);
}

/// ibv_post_send(3)/ibv_create_qp(3): inline data longer than the QP's max_inline_data is
/// rejected at post time (EINVAL, bad_wr); exactly max_inline_data is accepted.
pub fn inline_longer_than_max_inline_einval<H: Harness>(t: &str) {
    let cap = QpCaps { max_inline_data: 64, ..Default::default() };
    let mut p = pair::<H>(t, QpType::Rc, cap, ConnOpts::default());
    let m = p.qa.caps().max_inline_data as usize;
    assert!((64..4096).contains(&m));
    recv(&mut p.qb, &p.b, 1, RX, 8192);
    recv(&mut p.qb, &p.b, 2, RX + 8192, 8192);
    let mut c = SendChain::new();
    c.push_inline(SendWr::send(1).signaled(), &pattern(4, m));
    c.push_inline(SendWr::send(2).signaled(), &pattern(4, m + 1));
    expect_post_err(p.qa.post_send(&c), Errno::EINVAL, 1);
    let mut c = SendChain::new();
    c.push(SendWr::send(3).signaled().inline(), &[p.a.sge(0, m as u32 + 1)]);
    expect_post_err(p.qa.post_send(&c), Errno::EINVAL, 0);
    let r = poll_one(&mut p.b.rcq);
    assert_eq!((r.wr_id, r.byte_len), (1, m as u32));
    assert_eq!(p.b.read(RX, m), pattern(4, m));
    assert_no_completion(&mut p.b.rcq);
}

/// ibv_post_send(3): "IBV_SEND_INLINE ... Valid only for Send and RDMA Write." INLINE on an
/// RDMA READ or an atomic (whose local buffer is a destination) is rejected at post time.
pub fn inline_only_for_send_and_write<H: Harness>(t: &str) {
    let mut p = rc_pair::<H>(t);
    let rkey = p.b.mr.rkey();
    let read = SendWr::read(1, p.b.addr(RX), rkey).signaled().inline();
    expect_post_err(p.qa.post_send(&SendChain::one(read, &[p.a.sge(0, 16)])), Errno::EINVAL, 0);
    let mut c = SendChain::new();
    c.push_inline(SendWr::fetch_add(2, p.b.addr(RX), rkey, 1).signaled(), &[0u8; 8]);
    expect_post_err(p.qa.post_send(&c), Errno::EINVAL, 0);
    let cas = SendWr::cmp_swap(3, p.b.addr(RX), rkey, 0, 1).signaled().inline();
    expect_post_err(p.qa.post_send(&SendChain::one(cas, &[p.a.sge(0, 8)])), Errno::EINVAL, 0);
    assert_eq!(p.b.read(RX, 8), [0u8; 8], "the rejected atomics did not run");
    // RDMA WRITE with INLINE is valid.
    p.a.write(0, b"inline-w");
    let w = SendWr::write(4, p.b.addr(RX + 64), rkey).signaled().inline();
    p.qa.post_send(&SendChain::one(w, &[p.a.sge(0, 8)])).unwrap();
    assert_eq!(poll_one(&mut p.a.scq).status, WcStatus::Success);
    assert_eq!(p.b.read(RX + 64, 8), b"inline-w");
}

/// ibv_post_send(3): "IBV_SEND_IP_CSUM ... Valid only when device_cap_flags in device_attr
/// indicates current QP is supported by checksum offload." On a device without checksum
/// offload the WR fails with EINVAL.
pub fn ip_csum_without_offload_einval<H: Harness>(t: &str) {
    let mut u = ud_pair::<H>(t);
    let qpn = u.qb.qp_num();
    recv(&mut u.qb, &u.b, 1, RX, 256);
    let wr = ud_send_wr::<H>(&u.ah, qpn, QKEY, 1).flags(SendFlags::IP_CSUM);
    let r = u.qa.post_send(&SendChain::one(wr, &[u.a.sge(0, 64)]));
    if u.a.ctx.caps().ip_csum {
        r.expect("IP_CSUM on a device with checksum offload");
    } else {
        expect_post_err(r, Errno::EINVAL, 0);
        assert_no_completion(&mut u.b.rcq);
        let mut p = rc_pair::<H>(&format!("{t}-rc"));
        let wr = SendWr::send(2).signaled().flags(SendFlags::IP_CSUM);
        expect_post_err(p.qa.post_send(&SendChain::one(wr, &[p.a.sge(0, 8)])), Errno::EINVAL, 0);
    }
}

/// ibv_post_send(3) (state rules of ibv_modify_qp(3)): a QP accepts sends only from RTS on;
/// posting in RESET, INIT or RTR fails with EINVAL and sends nothing.
pub fn post_send_before_rts_einval<H: Harness>(t: &str) {
    let a = Node::<H>::open(t, 0);
    let mut b = Node::<H>::open(t, 1);
    let mut qa = a.qp(QpType::Rc, QpCaps::default(), None, false);
    let mut qb = b.qp(QpType::Rc, QpCaps::default(), None, false);
    let o = ConnOpts::default();
    let (ea, eb) = (qa.endpoint(H::gid_index()).unwrap(), qb.endpoint(H::gid_index()).unwrap());
    to_init(&mut qb, 0, o.access);
    bring_up(&mut qb, &ea, &o);
    recv(&mut qb, &b, 1, RX, 64);
    let c = SendChain::one(SendWr::send(1).signaled(), &[a.sge(0, 8)]);
    expect_post_err(qa.post_send(&c), Errno::EINVAL, 0);
    to_init(&mut qa, 0, o.access);
    expect_post_err(qa.post_send(&c), Errno::EINVAL, 0);
    to_rtr(&mut qa, &eb, &o);
    expect_post_err(qa.post_send(&c), Errno::EINVAL, 0);
    assert_no_completion(&mut b.rcq);
    to_rts(&mut qa, &o);
    qa.post_send(&c).expect("post_send in RTS");
    assert_eq!(poll_one(&mut b.rcq).status, WcStatus::Success);
}

/// ibv_post_send(3): "num_sge: Size of the s/g array" may not exceed the QP's max_send_sge:
/// EINVAL at post time.
pub fn send_too_many_sges_einval<H: Harness>(t: &str) {
    let mut p = rc_pair::<H>(t);
    let n = p.qa.caps().max_send_sge as usize;
    recv(&mut p.qb, &p.b, 1, RX, 4096);
    let sges: Vec<Sge> = (0..n + 1).map(|i| p.a.sge(i * 8, 8)).collect();
    let mut c = SendChain::new();
    c.push(SendWr::send(1).signaled(), &sges[..n]);
    c.push(SendWr::send(2).signaled(), &sges);
    expect_post_err(p.qa.post_send(&c), Errno::EINVAL, 1);
    assert_eq!(poll_one(&mut p.b.rcq).byte_len, 8 * n as u32);
    assert_no_completion(&mut p.b.rcq);
}

/// ibv_post_send(3): an SGE must lie inside the memory region of its lkey ("addr: Start
/// address of the local memory buffer", "lkey: Key of the local Memory Region"); one that
/// crosses either end of its MR fails at post time with EINVAL (or, where SGEs are checked at
/// execution, completes with an error).
pub fn send_sge_outside_mr_einval<H: Harness>(t: &str) {
    let mut p = rc_pair::<H>(t);
    let sub = p.a.pd.reg_mr(&p.a.region, 4096, 4096, AccessFlags::LOCAL_WRITE).unwrap();
    let k = sub.lkey();
    recv(&mut p.qb, &p.b, 1, RX, 8192);
    for (i, sge) in [
        Sge::new(sub.addr() + 4096 - 8, 16, k),
        Sge::new(sub.addr() - 8, 16, k),
        Sge::new(sub.addr() + 4096, 1, k),
        Sge::new(p.a.addr(BUF - 4), 8, p.a.mr.lkey()),
    ]
    .into_iter()
    .enumerate()
    {
        expect_bad_local_sge(&mut p, &SendChain::one(SendWr::send(i as u64).signaled(), &[sge]));
    }
    if !H::sge_checked_at_post() {
        // The pair was reconnected through RESET, which discarded the posted receive.
        recv(&mut p.qb, &p.b, 2, RX, 8192);
    }
    // Exactly the MR is fine.
    p.qa.post_send(&SendChain::one(SendWr::send(9).signaled(), &[Sge::new(sub.addr(), 4096, k)])).unwrap();
    assert_eq!(poll_one(&mut p.b.rcq).byte_len, 4096);
}

/// ibv_post_send(3): "lkey: Key of the local Memory Region" — of this QP's protection domain;
/// an lkey of another PD fails with EINVAL (or, where SGEs are checked at execution, completes
/// with an error).
pub fn send_lkey_of_other_pd_einval<H: Harness>(t: &str) {
    let mut p = rc_pair::<H>(t);
    let pd2 = p.a.ctx.alloc_pd().unwrap();
    let other = pd2.reg_mr(&p.a.region, 0, 4096, AccessFlags::LOCAL_WRITE).unwrap();
    recv(&mut p.qb, &p.b, 1, RX, 64);
    expect_bad_local_sge(
        &mut p,
        &SendChain::one(SendWr::send(1).signaled(), &[Sge::new(other.addr(), 8, other.lkey())]),
    );
    assert_no_completion(&mut p.b.rcq);
}

/// ibv_post_send(3)/ibv_post_srq_recv notes: the message is the concatenation of the gather
/// list, and "The maximum message size that it can serve is the sum of all of the memory
/// buffers length in the scatter/gather list": 3 send SGEs land across 2 receive SGEs, byte
/// exact, nothing written past the receive list.
pub fn send_gather_scatter_multi_sge<H: Harness>(t: &str) {
    let mut p = rc_pair::<H>(t);
    let (x, y, z) = (pattern(5, 5), pattern(6, 7), pattern(7, 20));
    p.a.write(100, &x);
    p.a.write(3000, &y);
    p.a.write(9000, &z);
    p.b.region.fill(RX, 8192, 0xcc);
    p.qb.post_recv(&RecvChain::one(1, &[p.b.sge(RX + 1000, 10), p.b.sge(RX + 3000, 22)])).unwrap();
    let sges = [p.a.sge(100, 5), p.a.sge(3000, 7), p.a.sge(9000, 20)];
    p.qa.post_send(&SendChain::one(SendWr::send(1).signaled(), &sges)).unwrap();
    let r = poll_one(&mut p.b.rcq);
    assert_eq!((r.status, r.byte_len), (WcStatus::Success, 32));
    let msg: Vec<u8> = [x, y, z].concat();
    assert_eq!(p.b.read(RX + 1000, 10), msg[..10]);
    assert_eq!(p.b.read(RX + 3000, 22), msg[10..]);
    assert_eq!(p.b.read(RX + 1010, 8), [0xcc; 8], "canary after the first receive SGE");
    assert_eq!(p.b.read(RX + 3022, 8), [0xcc; 8], "canary after the second receive SGE");
    assert_eq!(p.b.read(RX + 992, 8), [0xcc; 8], "canary before the first receive SGE");
}

/// ibv_post_send(3)/ibv_post_srq_recv notes: "num_sge ... If this size is 0, this indicates
/// that the message size is 0": a SEND with no SGE delivers a 0-byte message, which a receive
/// request with no SGE accepts.
pub fn send_zero_length<H: Harness>(t: &str) {
    let mut p = rc_pair::<H>(t);
    recv(&mut p.qb, &p.b, 1, RX, 64);
    p.qb.post_recv(&RecvChain::one(2, &[])).unwrap();
    p.qa.post_send(&SendChain::one(SendWr::send(1).signaled(), &[])).unwrap();
    p.qa.post_send(&SendChain::one(SendWr::send_with_imm(2, 7).signaled(), &[])).unwrap();
    let r = poll_n(&mut p.b.rcq, 2);
    assert_eq!((r[0].wr_id, r[0].status, r[0].byte_len), (1, WcStatus::Success, 0));
    assert_eq!((r[1].wr_id, r[1].status, r[1].byte_len, r[1].imm_data), (2, WcStatus::Success, 0, 7));
    assert!(poll_n(&mut p.a.scq, 2).iter().all(|w| w.status == WcStatus::Success));
}

/// ibv_post_recv(3)/srq notes ("all of the WRs ... should be able to handle the maximum
/// message"): a message longer than the receive buffer fails — the receiver gets
/// IBV_WC_LOC_LEN_ERR, the RC sender IBV_WC_REM_INV_REQ_ERR, both QPs go to ERROR and the
/// receiver's other receives are flushed.
pub fn recv_buffer_too_small<H: Harness>(t: &str) {
    let mut p = rc_pair::<H>(t);
    recv(&mut p.qb, &p.b, 1, RX, 8);
    recv(&mut p.qb, &p.b, 2, RX + 64, 64);
    p.a.write(0, &pattern(8, 16));
    p.b.region.fill(RX + 8, 8, 0xcc);
    send(&mut p.qa, &p.a, 1, 0, 16);
    let s = poll_one(&mut p.a.scq);
    assert_eq!((s.wr_id, s.status), (1, WcStatus::RemInvReqErr));
    let r = poll_n(&mut p.b.rcq, 2);
    assert_eq!((r[0].wr_id, r[0].status), (1, WcStatus::LocLenErr));
    assert_eq!((r[1].wr_id, r[1].status), (2, WcStatus::WrFlushErr));
    assert_eq!(p.b.read(RX + 8, 8), [0xcc; 8], "nothing written past the receive buffer");
    assert_eq!(p.qa.state(), QpState::Error);
    assert_eq!(p.qb.state(), QpState::Error);
}

/// ibv_post_send(3) ("posts the linked list of work requests ... to the send queue"): a queue
/// is FIFO — 1000 messages of one QP arrive in posting order, each byte intact.
pub fn send_in_order_1000<H: Harness>(t: &str) {
    let mut p = rc_pair::<H>(t);
    const WINDOW: u64 = 50;
    let mut c = SendChain::new();
    for w in 0..1000 / WINDOW {
        let mut rc = RecvChain::new();
        for k in 0..WINDOW {
            rc.push(RecvWr::new(k), &[p.b.sge(RX + k as usize * 64, 64)]);
        }
        p.qb.post_recv(&rc).unwrap();
        c.clear();
        for k in 0..WINDOW {
            let seq = w * WINDOW + k;
            let mut msg = seq.to_le_bytes().to_vec();
            msg.extend(pattern(seq as u8, 24));
            p.a.write(k as usize * 64, &msg);
            c.push(SendWr::send(seq).signaled(), &[p.a.sge(k as usize * 64, 32)]);
        }
        p.qa.post_send(&c).unwrap();
        let r = poll_n(&mut p.b.rcq, WINDOW as usize);
        for (k, wc) in r.iter().enumerate() {
            let seq = w * WINDOW + k as u64;
            assert_eq!((wc.status, wc.wr_id, wc.byte_len), (WcStatus::Success, k as u64, 32), "message {seq}");
            let got = p.b.read(RX + k * 64, 32);
            assert_eq!(u64::from_le_bytes(got[..8].try_into().unwrap()), seq, "out of order");
            assert_eq!(got[8..], pattern(seq as u8, 24));
        }
        let s = poll_n(&mut p.a.scq, WINDOW as usize);
        assert!(s.iter().enumerate().all(|(k, wc)| wc.wr_id == w * WINDOW + k as u64 && wc.is_ok()));
    }
}

// ------------------------------------------------------------------------------------------
// ibv_post_recv(3)
// ------------------------------------------------------------------------------------------

/// ibv_post_recv(3): "It stops processing WRs from this list at the first failure ... and
/// returns this failing WR through bad_wr." Requests before it are posted (proved by
/// delivering into them), it and those after are not — for an unknown lkey (where SGEs are
/// checked at post time) and for num_sge above the QP's max_recv_sge.
pub fn recv_chain_stops_at_first_bad<H: Harness>(t: &str) {
    let mut p = rc_pair::<H>(t);
    let mut c = RecvChain::new();
    c.push(RecvWr::new(1), &[p.b.sge(RX, 64)]);
    if H::sge_checked_at_post() {
        c.push(RecvWr::new(2), &[Sge::new(p.b.addr(RX + 64), 64, p.b.mr.lkey() ^ 0x0055_5000)]);
        c.push(RecvWr::new(3), &[p.b.sge(RX + 128, 64)]);
        expect_post_err(p.qb.post_recv(&c), Errno::EINVAL, 1);
    } else {
        p.qb.post_recv(&c).unwrap();
    }
    let n = p.qb.caps().max_recv_sge as usize;
    let too_many: Vec<Sge> = (0..n + 1).map(|i| p.b.sge(RX + 4096 + i * 64, 64)).collect();
    let mut c = RecvChain::new();
    c.push(RecvWr::new(4), &[p.b.sge(RX + 192, 64)]);
    c.push(RecvWr::new(5), &too_many);
    c.push(RecvWr::new(6), &[p.b.sge(RX + 256, 64)]);
    expect_post_err(p.qb.post_recv(&c), Errno::EINVAL, 1);
    recv(&mut p.qb, &p.b, 7, RX + 320, 64);
    let mut s = SendChain::new();
    for i in 0..3 {
        s.push(SendWr::send(i).signaled(), &[p.a.sge(0, 8)]);
    }
    p.qa.post_send(&s).unwrap();
    assert!(poll_n(&mut p.a.scq, 3).iter().all(|w| w.is_ok()));
    let r = poll_n(&mut p.b.rcq, 3);
    assert_eq!(r.iter().map(|w| w.wr_id).collect::<Vec<_>>(), [1, 4, 7]);
    assert!(r.iter().all(|w| w.is_ok()));
}

/// ibv_post_recv(3): a full receive queue fails the post with ENOMEM and changes nothing:
/// exactly max_recv_wr requests fit, the chain stops at the one that does not, and exactly
/// that many messages are received.
pub fn recv_queue_full_enomem<H: Harness>(t: &str) {
    let cap = QpCaps { max_recv_wr: 8, ..Default::default() };
    let mut p = pair::<H>(t, QpType::Rc, cap, ConnOpts::default());
    let n = p.qb.caps().max_recv_wr as u64;
    assert!((8..=64).contains(&n));
    for i in 0..n - 1 {
        recv(&mut p.qb, &p.b, i, RX + i as usize * 64, 64);
    }
    let mut c = RecvChain::new();
    c.push(RecvWr::new(n - 1), &[p.b.sge(RX + (n as usize - 1) * 64, 64)]);
    c.push(RecvWr::new(1000), &[p.b.sge(RX + n as usize * 64, 64)]);
    expect_post_err(p.qb.post_recv(&c), Errno::ENOMEM, 1);
    expect_post_err(p.qb.post_recv(&RecvChain::one(1001, &[p.b.sge(RX, 64)])), Errno::ENOMEM, 0);
    let mut s = SendChain::new();
    for i in 0..n {
        s.push(SendWr::send(i).signaled(), &[p.a.sge(0, 8)]);
    }
    p.qa.post_send(&s).unwrap();
    assert_eq!(poll_n(&mut p.a.scq, n as usize).len(), n as usize);
    let r = poll_n(&mut p.b.rcq, n as usize);
    assert_eq!(r.iter().map(|w| w.wr_id).collect::<Vec<_>>(), (0..n).collect::<Vec<_>>());
    assert_no_completion(&mut p.b.rcq);
}

/// ibv_post_recv(3)'s ENOMEM on the unconnected QP types, whose receive queues senders on any
/// thread consume: exactly max_recv_wr requests fit, the one after fails with `bad_wr` at it;
/// after a message takes one, one more fits again.
pub fn recv_queue_full_enomem_ud_and_raw<H: Harness>(t: &str) {
    let a = Node::<H>::open(t, 0);
    for qt in [QpType::Ud, QpType::RawPacket] {
        let cap = QpCaps { max_recv_wr: 8, ..Default::default() };
        let mut q = match a.try_qp(qt, cap, None, false) {
            Ok(q) => q,
            // rxe: no RAW_PACKET QPs (rdma::raw_packet_qp_is_refused_naming_the_device).
            Err(e) if qt == QpType::RawPacket && e.errno == Errno::EOPNOTSUPP => {
                println!("recv_queue_full_enomem_ud_and_raw: RAW_PACKET part NOT RUN: {e}");
                continue;
            }
            Err(e) => panic!("create_qp {qt:?}: {e}"),
        };
        ud_ready(&mut q, QKEY);
        let n = q.caps().max_recv_wr as u64;
        assert!((8..=64).contains(&n), "{qt:?}: max_recv_wr {n}");
        let mut c = RecvChain::new();
        for i in 0..n {
            c.push(RecvWr::new(i), &[a.sge(RX + i as usize * 64, 64)]);
        }
        c.push(RecvWr::new(1000), &[a.sge(RX, 64)]);
        expect_post_err(q.post_recv(&c), Errno::ENOMEM, n as usize);
        expect_post_err(q.post_recv(&RecvChain::one(1001, &[a.sge(RX, 64)])), Errno::ENOMEM, 0);
    }
}

/// ibv_post_recv(3): "If the QP qp is associated with a shared receive queue, you must use the
/// function ibv_post_srq_recv(), and not ibv_post_recv(), since the QP's own receive queue
/// will not be used." post_recv on such a QP fails with EINVAL.
pub fn recv_on_srq_qp_einval<H: Harness>(t: &str) {
    let b = Node::<H>::open(t, 0);
    let srq = b.pd.create_srq(&SrqAttr { max_wr: 16, max_sge: 1, srq_limit: 0 }).unwrap();
    let mut qb = b.qp(QpType::Rc, QpCaps { max_recv_wr: 0, ..Default::default() }, Some(&srq), false);
    to_init(&mut qb, 0, AccessFlags::empty());
    expect_post_err(qb.post_recv(&RecvChain::one(1, &[b.sge(RX, 64)])), Errno::EINVAL, 0);
}

/// ibv_post_recv(3) (QP state rules): receives may be posted from INIT on ("a QP in RESET
/// accepts nothing"): EINVAL in RESET; in INIT accepted, and the request is used once the
/// QP is connected.
pub fn recv_in_reset_einval_init_ok<H: Harness>(t: &str) {
    let a = Node::<H>::open(t, 0);
    let mut b = Node::<H>::open(t, 1);
    let mut qa = a.qp(QpType::Rc, QpCaps::default(), None, false);
    let mut qb = b.qp(QpType::Rc, QpCaps::default(), None, false);
    expect_post_err(qb.post_recv(&RecvChain::one(1, &[b.sge(RX, 64)])), Errno::EINVAL, 0);
    let o = ConnOpts::default();
    to_init(&mut qb, 0, o.access);
    qb.post_recv(&RecvChain::one(2, &[b.sge(RX, 64)])).expect("post_recv in INIT");
    connect::<H>(&mut qa, &mut qb, &o);
    let mut a = a;
    send(&mut qa, &a, 5, 0, 8);
    assert_eq!(poll_one(&mut a.scq).status, WcStatus::Success);
    let r = poll_one(&mut b.rcq);
    assert_eq!((r.wr_id, r.status), (2, WcStatus::Success));
}

/// ibv_post_recv(3)/ibv_reg_mr(3): a receive buffer is written by the device, so its MR needs
/// IBV_ACCESS_LOCAL_WRITE; without it the post fails with EINVAL. (Where SGEs are checked
/// only at execution, the message that uses it completes with an error instead.)
pub fn recv_mr_without_local_write_einval<H: Harness>(t: &str) {
    let mut p = rc_pair::<H>(t);
    let ro = p.b.pd.reg_mr(&p.b.region, RX, 4096, AccessFlags::REMOTE_READ).unwrap();
    if !H::sge_checked_at_post() {
        p.qb.post_recv(&RecvChain::one(1, &[Sge::new(ro.addr(), 64, ro.lkey())])).unwrap();
        send(&mut p.qa, &p.a, 1, 0, 8);
        assert_ne!(poll_one(&mut p.a.scq).status, WcStatus::Success);
        assert_ne!(poll_one(&mut p.b.rcq).status, WcStatus::Success);
        return;
    }
    expect_post_err(p.qb.post_recv(&RecvChain::one(1, &[Sge::new(ro.addr(), 64, ro.lkey())])), Errno::EINVAL, 0);
    let mut srq = p.b.pd.create_srq(&srq_attr(4, 1)).unwrap();
    expect_post_err(srq.post_recv(&RecvChain::one(1, &[Sge::new(ro.addr(), 64, ro.lkey())])), Errno::EINVAL, 0);
    // Nothing was posted: the SEND finds no receive (it waits on RNR) and nothing completes.
    send(&mut p.qa, &p.a, 1, 0, 8);
    assert_no_completion(&mut p.b.rcq);
    assert_no_completion(&mut p.a.scq);
}

/// ibv_post_recv(3) and ibv_post_srq_recv(3): "the actual data of the incoming message will
/// start at an offset of 40 bytes into the buffer(s) in the scatter list"; with a global AH
/// the GRH is there (IBV_WC_GRH) — its source GID (bytes 8..24) is the sender's port GID and
/// its destination GID (24..40) the receiver's; byte_len counts the 40 bytes; src_qp is the
/// sender's QPN.
pub fn ud_grh_and_offset<H: Harness>(t: &str) {
    let mut u = ud_pair::<H>(t);
    let qpn = u.qb.qp_num();
    let data = pattern(9, 100);
    u.a.write(0, &data);
    u.b.region.fill(RX, 4096, 0xcc);
    recv(&mut u.qb, &u.b, 1, RX, 40 + 100);
    u.qa.post_send(&SendChain::one(ud_send_wr::<H>(&u.ah, qpn, QKEY, 1), &[u.a.sge(0, 100)])).unwrap();
    assert_eq!(poll_one(&mut u.a.scq).status, WcStatus::Success);
    let r = poll_one(&mut u.b.rcq);
    assert_eq!((r.status, r.opcode, r.byte_len, r.src_qp), (WcStatus::Success, WcOpcode::Recv, 140, u.qa.qp_num()));
    assert!(r.wc_flags.contains(WcFlags::GRH));
    assert_eq!(u.b.read(RX + 40, 100), data);
    assert_eq!(u.b.read(RX + 8, 16), u.a.ctx.gid(1, H::gid_index()).unwrap(), "GRH source GID");
    assert_eq!(u.b.read(RX + 24, 16), u.b.ctx.gid(1, H::gid_index()).unwrap(), "GRH destination GID");
    assert_eq!(u.b.read(RX + 140, 8), [0xcc; 8]);
    // Without a GRH (a non-global AH, where the link allows one) the data still starts at 40.
    if let Ok(ah) = ah_to::<H>(&u.a, &u.qb.endpoint(H::gid_index()).unwrap(), false) {
        recv(&mut u.qb, &u.b, 2, RX + 1024, 40 + 100);
        u.qa.post_send(&SendChain::one(ud_send_wr::<H>(&ah, qpn, QKEY, 2), &[u.a.sge(0, 100)])).unwrap();
        assert_eq!(poll_one(&mut u.a.scq).status, WcStatus::Success);
        let r = poll_one(&mut u.b.rcq);
        assert_eq!((r.status, r.byte_len), (WcStatus::Success, 140));
        assert!(!r.wc_flags.contains(WcFlags::GRH));
        assert_eq!(u.b.read(RX + 1024 + 40, 100), data);
    }
}

/// srq notes: "For UD QP, an extra 40 bytes should be added to the RR buffers" — a UD receive
/// buffer smaller than 40 + the message fails with IBV_WC_LOC_LEN_ERR at the receiver, while
/// the unreliable sender completes successfully.
pub fn ud_recv_too_small_len_err<H: Harness>(t: &str) {
    let mut u = ud_pair::<H>(t);
    let qpn = u.qb.qp_num();
    u.b.region.fill(RX, 4096, 0xcc);
    recv(&mut u.qb, &u.b, 1, RX, 100);
    u.qa.post_send(&SendChain::one(ud_send_wr::<H>(&u.ah, qpn, QKEY, 1), &[u.a.sge(0, 100)])).unwrap();
    assert_eq!(poll_one(&mut u.a.scq).status, WcStatus::Success);
    let r = poll_one(&mut u.b.rcq);
    assert_eq!((r.wr_id, r.status), (1, WcStatus::LocLenErr));
    assert_eq!(u.b.read(RX + 100, 8), [0xcc; 8], "nothing written past the receive buffer");
}

/// ibv_post_send(3) (UD: one message is one packet): a UD message longer than the port's
/// active MTU fails at post time with EINVAL; exactly the MTU is delivered.
pub fn ud_larger_than_mtu_einval<H: Harness>(t: &str) {
    let mut u = ud_pair::<H>(t);
    let qpn = u.qb.qp_num();
    let port = u.a.ctx.port_attr(1).unwrap();
    // srq notes: "Verify that the logical port state of the RDMA device is IBV_PORT_ACTIVE".
    assert_eq!(port.state, PortState::Active);
    let mtu = port.active_mtu;
    assert!(mtu >= 256 && (mtu as usize) < RX);
    recv(&mut u.qb, &u.b, 1, RX, 40 + mtu + 64);
    let wr = ud_send_wr::<H>(&u.ah, qpn, QKEY, 1);
    expect_post_err(u.qa.post_send(&SendChain::one(wr, &[u.a.sge(0, mtu + 1)])), Errno::EINVAL, 0);
    assert_no_completion(&mut u.b.rcq);
    u.qa.post_send(&SendChain::one(wr, &[u.a.sge(0, mtu)])).unwrap();
    assert_eq!(poll_one(&mut u.a.scq).status, WcStatus::Success);
    assert_eq!(poll_one(&mut u.b.rcq).byte_len, 40 + mtu);
}

/// ibv_post_send(3): "ah: Address handle (AH) for the remote node address" — a UD send
/// without a valid AH fails at post time with EINVAL.
pub fn ud_without_valid_ah_einval<H: Harness>(t: &str) {
    let mut u = ud_pair::<H>(t);
    let qpn = u.qb.qp_num();
    recv(&mut u.qb, &u.b, 1, RX, 256);
    let wr = SendWr::send(1).signaled().to(AhHandle::default(), qpn, QKEY);
    expect_post_err(u.qa.post_send(&SendChain::one(wr, &[u.a.sge(0, 8)])), Errno::EINVAL, 0);
    assert_no_completion(&mut u.b.rcq);
}

/// ibv_post_send(3): "remote_qkey: Q_Key number of the destination QP" — a UD message with the
/// wrong Q_Key is silently dropped by the receiver (the sender completes successfully) and
/// consumes no receive request.
pub fn ud_wrong_qkey_dropped<H: Harness>(t: &str) {
    let mut u = ud_pair::<H>(t);
    let qpn = u.qb.qp_num();
    recv(&mut u.qb, &u.b, 1, RX, 256);
    u.qa.post_send(&SendChain::one(ud_send_wr::<H>(&u.ah, qpn, QKEY ^ 1, 1), &[u.a.sge(0, 8)])).unwrap();
    assert_eq!(poll_one(&mut u.a.scq).status, WcStatus::Success);
    assert_no_completion(&mut u.b.rcq);
    u.qa.post_send(&SendChain::one(ud_send_wr::<H>(&u.ah, qpn, QKEY, 2), &[u.a.sge(0, 8)])).unwrap();
    assert_eq!(poll_one(&mut u.a.scq).status, WcStatus::Success);
    let r = poll_one(&mut u.b.rcq);
    assert_eq!((r.wr_id, r.status), (1, WcStatus::Success), "the receive request was still there");
}

/// ibv_post_recv(3) (UD is unreliable: no RNR): a UD message arriving when no receive is
/// posted is dropped — the sender succeeds, and a receive posted later does not get it.
pub fn ud_no_recv_dropped<H: Harness>(t: &str) {
    let mut u = ud_pair::<H>(t);
    let qpn = u.qb.qp_num();
    u.a.write(0, b"dropped!");
    u.qa.post_send(&SendChain::one(ud_send_wr::<H>(&u.ah, qpn, QKEY, 1), &[u.a.sge(0, 8)])).unwrap();
    assert_eq!(poll_one(&mut u.a.scq).status, WcStatus::Success);
    recv(&mut u.qb, &u.b, 1, RX, 256);
    assert_no_completion(&mut u.b.rcq);
    u.a.write(0, b"arrived!");
    u.qa.post_send(&SendChain::one(ud_send_wr::<H>(&u.ah, qpn, QKEY, 2), &[u.a.sge(0, 8)])).unwrap();
    assert_eq!(poll_one(&mut u.a.scq).status, WcStatus::Success);
    assert_eq!(poll_one(&mut u.b.rcq).status, WcStatus::Success);
    assert_eq!(u.b.read(RX + 40, 8), b"arrived!");
}

/// srq notes: "The entries in the list can specify memory blocks that were registered by
/// different Memory Regions." One receive request scattering into two MRs.
pub fn recv_sges_from_different_mrs<H: Harness>(t: &str) {
    let mut p = rc_pair::<H>(t);
    let region2 = p.b.ctx.alloc_region(8192).unwrap();
    region2.fill(0, 8192, 0xcc);
    let mr2 = p.b.pd.reg_mr(&region2, 4096, 4096, AccessFlags::LOCAL_WRITE).unwrap();
    let data = pattern(10, 20);
    p.a.write(0, &data);
    p.qb.post_recv(&RecvChain::one(1, &[p.b.sge(RX, 8), Sge::new(mr2.addr() + 100, 64, mr2.lkey())])).unwrap();
    send(&mut p.qa, &p.a, 1, 0, 20);
    assert_eq!(poll_one(&mut p.a.scq).status, WcStatus::Success);
    assert_eq!(poll_one(&mut p.b.rcq).byte_len, 20);
    assert_eq!(p.b.read(RX, 8), data[..8]);
    let mut got = [0u8; 12];
    region2.read(4096 + 100, &mut got);
    assert_eq!(got, data[8..]);
}

// ------------------------------------------------------------------------------------------
// ibv_post_srq_recv(3) and its notes
// ------------------------------------------------------------------------------------------

fn srq_attr(max_wr: u32, max_sge: u32) -> SrqAttr {
    SrqAttr { max_wr, max_sge, srq_limit: 0 }
}

/// A receiving node with an SRQ, plus helpers to attach RC QPs to it and connect senders.
struct SrqSide<H: Harness> {
    b: Node<H>,
    srq: SrqOf<H>,
}

impl<H: Harness> SrqSide<H> {
    fn new(t: &str, node: usize, max_wr: u32) -> SrqSide<H> {
        let b = Node::<H>::open(t, node);
        let srq = b.pd.create_srq(&srq_attr(max_wr, 4)).expect("create_srq");
        SrqSide { b, srq }
    }

    fn qp(&self, qt: QpType) -> QpOf<H> {
        self.b.qp(qt, QpCaps { max_recv_wr: 0, ..Default::default() }, Some(&self.srq), false)
    }

    /// Posts receive `wr_id` of `len` bytes at `off`.
    fn post(&mut self, wr_id: u64, off: usize, len: u32) {
        let sge = self.b.sge(off, len);
        self.srq.post_recv(&RecvChain::one(wr_id, &[sge])).expect("post_srq_recv");
    }
}

/// A sender node with one RC QP connected to `qb` (options `o`).
fn sender_to<H: Harness>(t: &str, node: usize, qb: &mut QpOf<H>, o: &ConnOpts) -> (Node<H>, QpOf<H>) {
    let a = Node::<H>::open(t, node);
    let mut qa = a.qp(QpType::Rc, QpCaps::default(), None, false);
    connect::<H>(&mut qa, qb, o);
    (a, qa)
}

/// srq notes: "The RDMA device will take one of those Work Requests as soon as an incoming
/// opcode to a QP, which is associated with this SRQ, will consume a Receive Request" and "a RR
/// will be fetched from the head of SRQ": two RC QPs, connected to two different senders,
/// consume one SRQ's requests in posting order.
pub fn srq_shared_by_qps_of_two_senders<H: Harness>(t: &str) {
    let mut s = SrqSide::<H>::new(t, 0, 16);
    let (mut qb1, mut qb2) = (s.qp(QpType::Rc), s.qp(QpType::Rc));
    let o = ConnOpts::default();
    let (mut a1, mut qa1) = sender_to::<H>(t, 1, &mut qb1, &o);
    let (mut a2, mut qa2) = sender_to::<H>(t, 2, &mut qb2, &o);
    for i in 0..4 {
        s.post(i, RX + i as usize * 64, 64);
    }
    for i in 0..4u64 {
        let (a, qa, qpn) =
            if i % 2 == 0 { (&mut a1, &mut qa1, qb1.qp_num()) } else { (&mut a2, &mut qa2, qb2.qp_num()) };
        a.write(0, &[i as u8 + 1; 16]);
        send(qa, a, i, 0, 16);
        assert_eq!(poll_one(&mut a.scq).status, WcStatus::Success);
        let r = poll_one(&mut s.b.rcq);
        assert_eq!((r.wr_id, r.status, r.qp_num, r.byte_len), (i, WcStatus::Success, qpn, 16), "message {i}");
        assert_eq!(s.b.read(RX + i as usize * 64, 16), [i as u8 + 1; 16]);
    }
    assert_no_completion(&mut s.b.rcq);
}

/// ibv_post_srq_recv notes: "ibv_post_srq_recv() can be called whether any QP is associated
/// with the SRQ or not and regardless to the state of the QPs which are associated with it."
pub fn srq_post_without_qp_and_in_any_qp_state<H: Harness>(t: &str) {
    let mut s = SrqSide::<H>::new(t, 0, 16);
    s.post(0, RX, 64);
    let mut qb = s.qp(QpType::Rc);
    s.post(1, RX + 64, 64);
    to_init(&mut qb, 0, ConnOpts::default().access);
    s.post(2, RX + 128, 64);
    let mut q_err = s.qp(QpType::Rc);
    q_err.modify(&QpAttr { state: QpState::Error, ..Default::default() }).unwrap();
    s.post(3, RX + 192, 64);
    let (mut a, mut qa) = sender_to::<H>(t, 1, &mut qb, &ConnOpts::default());
    s.post(4, RX + 256, 64);
    let mut c = SendChain::new();
    for i in 0..5 {
        c.push(SendWr::send(i).signaled(), &[a.sge(0, 8)]);
    }
    qa.post_send(&c).unwrap();
    assert!(poll_n(&mut a.scq, 5).iter().all(|w| w.is_ok()));
    let r = poll_n(&mut s.b.rcq, 5);
    assert_eq!(r.iter().map(|w| w.wr_id).collect::<Vec<_>>(), [0, 1, 2, 3, 4]);
    assert!(r.iter().all(|w| w.is_ok() && w.qp_num == qb.qp_num()));
}

/// ibv_post_srq_recv notes: "If the QP is in REST, INIT or ERROR state, incoming messages won't
/// be processed and no RR will be fetched from the SRQ." An RC sender aimed at such a QP
/// gets no answer (IBV_WC_RETRY_EXC_ERR with retry_cnt 1 and a short timeout), the QP gets no
/// completion, and afterwards a QP in RTS on the same SRQ still finds every request, in order.
pub fn srq_not_fetched_in_reset_init_error<H: Harness>(t: &str) {
    let mut s = SrqSide::<H>::new(t, 0, 16);
    s.post(0, RX, 64);
    s.post(1, RX + 64, 64);
    let fast = ConnOpts { retry_cnt: 1, timeout: 1, ..Default::default() };
    for (k, state) in [QpState::Reset, QpState::Init, QpState::Error].into_iter().enumerate() {
        let mut qb = s.qp(QpType::Rc);
        let mut a = Node::<H>::open(t, 1 + k);
        let mut qa = a.qp(QpType::Rc, QpCaps::default(), None, false);
        let eb = qb.endpoint(H::gid_index()).unwrap();
        match state {
            QpState::Reset => {}
            QpState::Init => to_init(&mut qb, 0, fast.access),
            _ => {
                let ea = qa.endpoint(H::gid_index()).unwrap();
                to_init(&mut qb, 0, fast.access);
                bring_up(&mut qb, &ea, &fast);
                qb.modify(&QpAttr { state: QpState::Error, ..Default::default() }).unwrap();
            }
        }
        assert_eq!(qb.state(), state);
        to_init(&mut qa, 0, fast.access);
        bring_up(&mut qa, &eb, &fast);
        send(&mut qa, &a, 7, 0, 8);
        let w = poll_one(&mut a.scq);
        assert_eq!((w.wr_id, w.status), (7, WcStatus::RetryExcErr), "responder in {state:?}");
        assert_no_completion(&mut s.b.rcq);
    }
    let mut qc = s.qp(QpType::Rc);
    let (mut d, mut qd) = sender_to::<H>(t, 4, &mut qc, &ConnOpts::default());
    send(&mut qd, &d, 1, 0, 8);
    send(&mut qd, &d, 2, 0, 8);
    assert_eq!(poll_n(&mut d.scq, 2).iter().filter(|w| w.is_ok()).count(), 2);
    let r = poll_n(&mut s.b.rcq, 2);
    assert_eq!(r.iter().map(|w| (w.wr_id, w.qp_num)).collect::<Vec<_>>(), [(0, qc.qp_num()), (1, qc.qp_num())]);
}

/// srq notes: "for SRQ you can use the LIMIT mechanism that will create an affiliated
/// asynchronous event when the number of WRs in an SRQ drops below a specific value." The
/// event fires once (element = SRQ number) when the count drops below the armed limit, the
/// limit reads 0 afterwards (disarmed), and re-arming makes it fire again.
pub fn srq_limit_event_once_and_rearm<H: Harness>(t: &str) {
    let mut s = SrqSide::<H>::new(t, 0, 16);
    let mut qb = s.qp(QpType::Rc);
    let (mut a, mut qa) = sender_to::<H>(t, 1, &mut qb, &ConnOpts::default());
    let limits = |ev: &[AsyncEvent]| ev.iter().filter(|e| e.kind == AsyncEventKind::SrqLimitReached).count();
    let mut next = 0u64;
    for round in 0..2 {
        for i in 0..8 {
            s.post(100 * round + i, RX + i as usize * 64, 64);
        }
        s.srq.modify(&SrqAttr { srq_limit: 4, ..srq_attr(0, 0) }, SrqAttrMask::LIMIT).unwrap();
        assert_eq!(s.srq.query().unwrap().srq_limit, 4);
        // 8 -> 4 posted: not below the limit yet.
        for _ in 0..4 {
            send(&mut qa, &a, next, 0, 8);
            next += 1;
        }
        assert_eq!(poll_n(&mut s.b.rcq, 4).len(), 4);
        assert_eq!(poll_n(&mut a.scq, 4).len(), 4);
        assert_eq!(limits(&events_now::<H>(&s.b.ctx)), 0, "round {round}: fired at 4 posted, limit 4");
        // 4 -> 3: fires, once.
        send(&mut qa, &a, next, 0, 8);
        next += 1;
        poll_one(&mut s.b.rcq);
        poll_one(&mut a.scq);
        let (e, _) = wait_event::<H>(&s.b.ctx, AsyncEventKind::SrqLimitReached);
        assert_eq!(e.element, s.srq.srq_num());
        assert_eq!(s.srq.query().unwrap().srq_limit, 0, "the limit disarms when it fires");
        // 3 -> 0: disarmed, no more events.
        for _ in 0..3 {
            send(&mut qa, &a, next, 0, 8);
            next += 1;
        }
        assert_eq!(poll_n(&mut s.b.rcq, 3).len(), 3);
        assert_eq!(poll_n(&mut a.scq, 3).len(), 3);
        assert_eq!(limits(&events_now::<H>(&s.b.ctx)), 0, "round {round}: fired twice");
    }
}

/// ibv_modify_srq(3) (srq notes: the limit is a count of WRs in the SRQ): arming a limit above
/// the SRQ's max_wr fails with EINVAL and leaves the limit unchanged; max_wr itself is
/// accepted. (ibv_create_srq ignores srq_limit, so creation is not checked.)
pub fn srq_limit_above_max_wr_einval<H: Harness>(t: &str) {
    let b = Node::<H>::open(t, 0);
    let mut srq = b.pd.create_srq(&srq_attr(16, 1)).unwrap();
    let max = srq.query().unwrap().max_wr;
    assert!(max >= 16);
    let e = srq.modify(&SrqAttr { srq_limit: max + 1, ..srq_attr(0, 0) }, SrqAttrMask::LIMIT).unwrap_err();
    assert_eq!(e.errno, Errno::EINVAL);
    assert_eq!(srq.query().unwrap().srq_limit, 0);
    srq.modify(&SrqAttr { srq_limit: max, ..srq_attr(0, 0) }, SrqAttrMask::LIMIT).expect("limit == max_wr");
    assert_eq!(srq.query().unwrap().srq_limit, max);
}

/// ibv_create_srq(3) (srq notes: "There is a limit to the maximum number of outstanding WRs
/// for an SRQ. This value was specified when the SRQ was created."): an SRQ with max_wr 0 or
/// max_sge 0, or above the device's limits, cannot be created (EINVAL).
pub fn srq_create_bad_sizes_einval<H: Harness>(t: &str) {
    let b = Node::<H>::open(t, 0);
    let caps = b.ctx.caps();
    for (wr, sge) in [(0, 1), (16, 0), (caps.max_srq_wr + 1, 1), (16, caps.max_srq_sge + 1)] {
        let e = b.pd.create_srq(&srq_attr(wr, sge)).err().unwrap_or_else(|| panic!("max_wr {wr} max_sge {sge}"));
        assert_eq!(e.errno, Errno::EINVAL, "max_wr {wr} max_sge {sge}");
    }
}

/// ibv_post_srq_recv notes: "ENOMEM SRQ is full" and "On failure no change will be done to the
/// SRQ or the QPs that are associated with it and bad_wr points to the RR that failed to be
/// posted": exactly max_wr requests fit, the chain stops at the first that does not, and
/// exactly max_wr messages are received.
pub fn srq_full_enomem<H: Harness>(t: &str) {
    let mut s = SrqSide::<H>::new(t, 0, 8);
    let n = s.srq.query().unwrap().max_wr as u64;
    assert!((8..=64).contains(&n));
    for i in 0..n - 1 {
        s.post(i, RX + i as usize * 64, 64);
    }
    let mut c = RecvChain::new();
    c.push(RecvWr::new(n - 1), &[s.b.sge(RX + (n as usize - 1) * 64, 64)]);
    c.push(RecvWr::new(1000), &[s.b.sge(RX, 64)]);
    expect_post_err(s.srq.post_recv(&c), Errno::ENOMEM, 1);
    let mut qb = s.qp(QpType::Rc);
    let (mut a, mut qa) = sender_to::<H>(t, 1, &mut qb, &ConnOpts::default());
    let mut sc = SendChain::new();
    for i in 0..n {
        sc.push(SendWr::send(i).signaled(), &[a.sge(0, 8)]);
    }
    qa.post_send(&sc).unwrap();
    assert_eq!(poll_n(&mut a.scq, n as usize).iter().filter(|w| w.is_ok()).count(), n as usize);
    let r = poll_n(&mut s.b.rcq, n as usize);
    assert_eq!(r.iter().map(|w| w.wr_id).collect::<Vec<_>>(), (0..n).collect::<Vec<_>>());
    assert_no_completion(&mut s.b.rcq);
}

/// ibv_post_srq_recv(3): "It stops processing WRs from this list at the first failure" and the
/// notes: "If there is a failure in one of the WRs because ... one of the attributes in the WR
/// is bad, it stops immediately and return the pointer to that WR." Checked for num_sge above
/// max_sge and, where SGEs are checked at post time, an unknown lkey, an SGE outside its MR and
/// an lkey of another PD.
pub fn srq_chain_stops_at_first_bad<H: Harness>(t: &str) {
    let mut s = SrqSide::<H>::new(t, 0, 64);
    let pd2 = s.b.ctx.alloc_pd().unwrap();
    let other = pd2.reg_mr(&s.b.region, 0, 4096, AccessFlags::LOCAL_WRITE).unwrap();
    let max_sge = s.srq.query().unwrap().max_sge as usize;
    let too_many: Vec<Sge> = (0..max_sge + 1).map(|i| s.b.sge(RX + 8192 + i * 64, 64)).collect();
    let bads: [Vec<Sge>; 4] = [
        too_many,
        vec![Sge::new(s.b.addr(RX), 64, s.b.mr.lkey() ^ 0x0077_7000)],
        vec![s.b.sge(BUF - 32, 64)],
        vec![Sge::new(other.addr(), 64, other.lkey())],
    ];
    let n_bad = if H::sge_checked_at_post() { bads.len() } else { 1 };
    let mut good = 0u64;
    for (k, bad) in bads[..n_bad].iter().enumerate() {
        let mut c = RecvChain::new();
        c.push(RecvWr::new(good), &[s.b.sge(RX + good as usize * 64, 64)]);
        c.push(RecvWr::new(1000 + k as u64), bad);
        c.push(RecvWr::new(2000 + k as u64), &[s.b.sge(RX, 64)]);
        expect_post_err(s.srq.post_recv(&c), Errno::EINVAL, 1);
        good += 1;
    }
    let mut qb = s.qp(QpType::Rc);
    let (mut a, mut qa) = sender_to::<H>(t, 1, &mut qb, &ConnOpts::default());
    let mut sc = SendChain::new();
    for i in 0..good {
        sc.push(SendWr::send(i).signaled(), &[a.sge(0, 8)]);
    }
    qa.post_send(&sc).unwrap();
    assert_eq!(poll_n(&mut a.scq, good as usize).iter().filter(|w| w.is_ok()).count(), good as usize);
    let r = poll_n(&mut s.b.rcq, good as usize);
    assert_eq!(r.iter().map(|w| w.wr_id).collect::<Vec<_>>(), (0..good).collect::<Vec<_>>());
    assert_no_completion(&mut s.b.rcq);
}

/// `Srq::post_recv_buffers` (the replenisher's refill: one single-SGE receive per address,
/// the address as `wr_id`) is `ibv_post_srq_recv` of that chain: it stops at the first bad
/// address with `bad_wr` its index and the ones before it posted (where SGEs are checked at
/// post time), an unknown lkey fails the first, a full SRQ gives ENOMEM at the first that
/// does not fit, and the receives are consumed in order into the right buffers.
pub fn srq_post_recv_buffers_is_post_recv_of_its_chain<H: Harness>(t: &str) {
    let mut s = SrqSide::<H>::new(t, 0, 8);
    let n = s.srq.query().unwrap().max_wr as usize;
    let lkey = s.b.mr.lkey();
    let mut scratch = RecvChain::new();
    let mut posted: Vec<u64> = Vec::new();
    if H::sge_checked_at_post() {
        let addrs = [s.b.addr(RX), s.b.addr(RX + 64), s.b.addr(BUF - 32), s.b.addr(RX + 128)];
        expect_post_err(s.srq.post_recv_buffers(&addrs, 64, lkey, &mut scratch), Errno::EINVAL, 2);
        posted.extend(&addrs[..2]);
        let r = s.srq.post_recv_buffers(&[s.b.addr(RX + 128)], 64, lkey ^ 0x0077_7000, &mut scratch);
        expect_post_err(r, Errno::EINVAL, 0);
    }
    let more: Vec<u64> = (posted.len()..n + 1).map(|i| s.b.addr(RX + i * 64)).collect();
    expect_post_err(s.srq.post_recv_buffers(&more, 64, lkey, &mut scratch), Errno::ENOMEM, n - posted.len());
    posted.extend(&more[..n - posted.len()]);
    let mut qb = s.qp(QpType::Rc);
    let (mut a, mut qa) = sender_to::<H>(t, 1, &mut qb, &ConnOpts::default());
    let mut sc = SendChain::new();
    for i in 0..n {
        a.write(i * 16, &[i as u8 + 1; 16]);
        sc.push(SendWr::send(i as u64).signaled(), &[a.sge(i * 16, 16)]);
    }
    qa.post_send(&sc).unwrap();
    assert_eq!(poll_n(&mut a.scq, n).iter().filter(|w| w.is_ok()).count(), n);
    let r = poll_n(&mut s.b.rcq, n);
    assert_eq!(r.iter().map(|w| w.wr_id).collect::<Vec<_>>(), posted);
    for (i, &addr) in posted.iter().enumerate() {
        assert_eq!(s.b.read((addr - s.b.addr(0)) as usize, 16), [i as u8 + 1; 16], "buffer {i}");
    }
    assert_no_completion(&mut s.b.rcq);
}

/// The sequence of the srq notes' "Which operations will consume RRs?": Send, Send with
/// Immediate and RDMA Write with immediate consume one each; RDMA Write consumes none. The
/// WRITE_WITH_IMM data lands at remote_addr (not in the RR's buffer) and the completion is
/// IBV_WC_RECV_RDMA_WITH_IMM with the immediate and the written length.
fn consumption_sequence<H: Harness>(
    a: &mut Node<H>,
    qa: &mut QpOf<H>,
    b: &mut Node<H>,
    post_rr: &mut dyn FnMut(&Node<H>, u64),
) {
    b.region.fill(RX, 4096, 0);
    for i in 0..4 {
        post_rr(b, 100 + i);
    }
    let rkey = b.mr.rkey();
    let mut go = |qa: &mut QpOf<H>, wr: SendWr, data: &[u8]| {
        a.write(0, data);
        qa.post_send(&SendChain::one(wr.signaled(), &[a.sge(0, data.len() as u32)])).unwrap();
        let s = poll_one(&mut a.scq);
        assert_eq!((s.wr_id, s.status), (wr.wr_id, WcStatus::Success), "{}", wr.opcode.name());
    };
    go(qa, SendWr::write(1, b.addr(RX + 8192), rkey), b"write-01");
    assert_no_completion(&mut b.rcq);
    assert_eq!(b.read(RX + 8192, 8), b"write-01");
    go(qa, SendWr::write_with_imm(2, b.addr(RX + 9000), rkey, 0x1234_5678), b"wimm-002");
    let r = poll_one(&mut b.rcq);
    assert_eq!(
        (r.wr_id, r.status, r.opcode, r.imm_data, r.byte_len),
        (100, WcStatus::Success, WcOpcode::RecvRdmaWithImm, 0x1234_5678, 8)
    );
    assert!(r.wc_flags.contains(WcFlags::WITH_IMM));
    assert_eq!(b.read(RX + 9000, 8), b"wimm-002");
    assert_eq!(b.read(RX, 64), [0u8; 64], "WRITE_WITH_IMM data does not go to the RR buffer");
    go(qa, SendWr::write(3, b.addr(RX + 8200), rkey), b"write-03");
    assert_no_completion(&mut b.rcq);
    go(qa, SendWr::send_with_imm(4, 0xabcd), b"simm-004");
    let r = poll_one(&mut b.rcq);
    assert_eq!((r.wr_id, r.opcode, r.imm_data, r.byte_len), (101, WcOpcode::Recv, 0xabcd, 8));
    assert!(r.wc_flags.contains(WcFlags::WITH_IMM));
    go(qa, SendWr::send(5), b"send-005");
    let r = poll_one(&mut b.rcq);
    assert_eq!((r.wr_id, r.opcode, r.byte_len), (102, WcOpcode::Recv, 8));
    assert!(!r.wc_flags.contains(WcFlags::WITH_IMM));
    // Exactly three were consumed: the fourth request is still next.
    go(qa, SendWr::send(6), b"send-006");
    assert_eq!(poll_one(&mut b.rcq).wr_id, 103);
    assert_no_completion(&mut b.rcq);
}

/// srq notes, "Which operations will consume RRs?" — on a QP's own receive queue.
pub fn recv_consumed_by_send_imm_and_write_imm_only<H: Harness>(t: &str) {
    let Pair { mut a, mut b, mut qa, mut qb } = rc_pair::<H>(t);
    let mut post = |b: &Node<H>, id: u64| {
        qb.post_recv(&RecvChain::one(id, &[b.sge(RX + (id as usize - 100) * 64, 64)])).unwrap();
    };
    consumption_sequence::<H>(&mut a, &mut qa, &mut b, &mut post);
}

/// srq notes, "Which operations will consume RRs?" — on an SRQ.
pub fn srq_consumed_by_send_imm_and_write_imm_only<H: Harness>(t: &str) {
    let SrqSide { mut b, mut srq } = SrqSide::<H>::new(t, 0, 16);
    let mut qb = b.qp(QpType::Rc, QpCaps { max_recv_wr: 0, ..Default::default() }, Some(&srq), false);
    let (mut a, mut qa) = sender_to::<H>(t, 1, &mut qb, &ConnOpts::default());
    let mut post = |b: &Node<H>, id: u64| {
        srq.post_recv(&RecvChain::one(id, &[b.sge(RX + (id as usize - 100) * 64, 64)])).unwrap();
    };
    consumption_sequence::<H>(&mut a, &mut qa, &mut b, &mut post);
}

/// srq notes: "length: The length of the buffer in bytes. The value 0 is a special value and is
/// equal to 2^{31} bytes" — so a receive SGE of length 0 over an MR smaller than 2 GiB is
/// outside its MR: EINVAL, on an SRQ and on a QP's receive queue. (Where SGEs are checked only
/// at execution the post succeeds and a message into it fails; that variant is the
/// deregistered-MR case's check, so this case needs post-time SGE checks.)
pub fn recv_sge_length_zero_is_2g<H: Harness>(t: &str) {
    if !H::sge_checked_at_post() {
        println!("recv_sge_length_zero_is_2g: not applicable, SGEs are checked at execution");
        return;
    }
    let mut s = SrqSide::<H>::new(t, 0, 16);
    assert!((s.b.mr.len() as u64) < 1 << 31);
    let zero = Sge::new(s.b.addr(RX), 0, s.b.mr.lkey());
    expect_post_err(s.srq.post_recv(&RecvChain::one(1, &[zero])), Errno::EINVAL, 0);
    let mut qb = s.b.qp(QpType::Rc, QpCaps::default(), None, false);
    to_init(&mut qb, 0, AccessFlags::empty());
    expect_post_err(qb.post_recv(&RecvChain::one(1, &[zero])), Errno::EINVAL, 0);
}

/// srq notes: "num_sge ... If this size is 0, this indicates that the message size is 0": an
/// SRQ request without SGEs takes a 0-byte message, and a 1-byte message into it fails with
/// IBV_WC_LOC_LEN_ERR.
pub fn srq_zero_sge_request_takes_only_empty_message<H: Harness>(t: &str) {
    let mut s = SrqSide::<H>::new(t, 0, 16);
    s.srq.post_recv(&RecvChain::one(1, &[])).unwrap();
    s.srq.post_recv(&RecvChain::one(2, &[])).unwrap();
    let mut qb = s.qp(QpType::Rc);
    let (mut a, mut qa) = sender_to::<H>(t, 1, &mut qb, &ConnOpts::default());
    qa.post_send(&SendChain::one(SendWr::send(1).signaled(), &[])).unwrap();
    assert_eq!(poll_one(&mut a.scq).status, WcStatus::Success);
    let r = poll_one(&mut s.b.rcq);
    assert_eq!((r.wr_id, r.status, r.byte_len), (1, WcStatus::Success, 0));
    send(&mut qa, &a, 2, 0, 1);
    assert_eq!(poll_one(&mut a.scq).status, WcStatus::RemInvReqErr);
    let r = poll_one(&mut s.b.rcq);
    assert_eq!((r.wr_id, r.status), (2, WcStatus::LocLenErr));
}

/// An SRQ (`s`, six requests of the given lengths at `RX + 64 i`, ids 0 to 5) shared by two
/// RC QPs (`qb1`, `qb2`), each connected to its own sender (`a1` on `qa1`, `a2` on `qa2`).
/// Fields drop in order: each QP before its node, the SRQ's QPs before the SRQ.
struct TwoSendersOnSrq<H: Harness> {
    qa2: QpOf<H>,
    a2: Node<H>,
    qa1: QpOf<H>,
    a1: Node<H>,
    qb2: QpOf<H>,
    qb1: QpOf<H>,
    s: SrqSide<H>,
}

impl<H: Harness> TwoSendersOnSrq<H> {
    fn new(t: &str, lens: [u32; 6]) -> Self {
        let mut s = SrqSide::<H>::new(t, 0, 16);
        for (i, len) in (0..).zip(lens) {
            s.post(i, RX + i as usize * 64, len);
        }
        let (mut qb1, mut qb2) = (s.qp(QpType::Rc), s.qp(QpType::Rc));
        let o = ConnOpts::default();
        let (a1, qa1) = sender_to::<H>(t, 1, &mut qb1, &o);
        let (a2, qa2) = sender_to::<H>(t, 2, &mut qb2, &o);
        TwoSendersOnSrq { s, qb1, qb2, a1, qa1, a2, qa2 }
    }

    /// The SENDs a post list on `qa1` ran first are done; checks that the receiver got
    /// requests 0 and 1 only, on `qb1`, then that two SENDs on `qa2` take requests 2 and 3:
    /// the SRQ kept them. With `second_fails`, request 1's completion is a receive error
    /// (its buffer was too small: LOC_LEN_ERR on `shm` and mlx5, LOC_QP_OP_ERR on rxe).
    fn next_requests_go_to_the_second_qp(&mut self, second_fails: bool) {
        let (n1, n2) = (self.qb1.qp_num(), self.qb2.qp_num());
        let r = poll_n(&mut self.s.b.rcq, 2);
        let got: Vec<_> = r.iter().map(|w| (w.wr_id, w.qp_num)).collect();
        assert_eq!(got, [(0, n1), (1, n1)]);
        assert_eq!(r[0].status, WcStatus::Success);
        if second_fails {
            assert!([WcStatus::LocLenErr, WcStatus::LocQpOpErr].contains(&r[1].status), "{:?}", r[1]);
        } else {
            assert_eq!(r[1].status, WcStatus::Success);
        }
        assert_no_completion(&mut self.s.b.rcq);
        let mut c = SendChain::new();
        for i in 0..2 {
            c.push(SendWr::send(10 + i).signaled(), &[self.a2.sge(0, 16)]);
        }
        self.qa2.post_send(&c).unwrap();
        assert!(poll_n(&mut self.a2.scq, 2).iter().all(|w| w.is_ok()));
        let r = poll_n(&mut self.s.b.rcq, 2);
        let got: Vec<_> = r.iter().map(|w| (w.wr_id, w.status, w.qp_num)).collect();
        assert_eq!(got, [(2, WcStatus::Success, n2), (3, WcStatus::Success, n2)], "the SRQ kept requests 2 and 3");
        assert_no_completion(&mut self.s.b.rcq);
    }
}

/// ibv_post_send(3) ("bad_wr ... the first Work Request that its processing failed"; the
/// ones after it are not posted) with the srq notes' "a RR will be fetched from the head of
/// SRQ" only as "an incoming opcode ... will consume a RR": a post list of four SENDs to an
/// SRQ whose third WR has a bad lkey consumes the requests of the two before it, and the
/// next two requests go to the next messages, here another QP's. Where SGEs are checked at
/// execution the third fails as a completion and the fourth is flushed; the receiver sees
/// the same. (On `shm` the list's SENDs claim their requests with one CAS: those of the WRs
/// that did not run go back to the SRQ.)
pub fn srq_requests_behind_a_bad_send_stay_posted<H: Harness>(t: &str) {
    let mut p = TwoSendersOnSrq::<H>::new(t, [64; 6]);
    let (a1, qa1) = (&mut p.a1, &mut p.qa1);
    let mut c = SendChain::new();
    for i in 0..4u64 {
        let sge = if i == 2 { Sge::new(a1.addr(0), 16, a1.mr.lkey() ^ 0x0077_7000) } else { a1.sge(0, 16) };
        c.push(SendWr::send(i).signaled(), &[sge]);
    }
    let posted = qa1.post_send(&c);
    if H::sge_checked_at_post() {
        expect_post_err(posted, Errno::EINVAL, 2);
        assert!(poll_n(&mut a1.scq, 2).iter().all(|w| w.is_ok()));
    } else {
        posted.unwrap();
        let w = poll_n(&mut a1.scq, 4);
        assert_eq!(w.iter().map(|w| w.wr_id).collect::<Vec<_>>(), [0, 1, 2, 3]);
        assert!(w[0].is_ok() && w[1].is_ok() && !w[2].is_ok(), "{w:?}");
        assert_eq!(w[3].status, WcStatus::WrFlushErr);
    }
    assert_no_completion(&mut a1.scq);
    p.next_requests_go_to_the_second_qp(false);
}

/// The same from the receiver's side (srq notes: the requests are fetched one per incoming
/// message; a receive that cannot hold its message completes with an error, and the QP, in
/// ERROR, fetches no more): a post list of four 16-byte SENDs to an SRQ whose
/// second request holds 8 bytes ends with that request's LOC_LEN_ERR; the sender's second
/// WR fails with a remote error and the two after it are flushed; requests 2 and 3 stay in
/// the SRQ for another QP's messages.
pub fn srq_requests_behind_a_failed_receive_stay_posted<H: Harness>(t: &str) {
    let mut p = TwoSendersOnSrq::<H>::new(t, [64, 8, 64, 64, 64, 64]);
    let (a1, qa1) = (&mut p.a1, &mut p.qa1);
    let mut c = SendChain::new();
    for i in 0..4u64 {
        c.push(SendWr::send(i).signaled(), &[a1.sge(0, 16)]);
    }
    qa1.post_send(&c).unwrap();
    let w = poll_n(&mut a1.scq, 4);
    assert_eq!(w.iter().map(|w| w.wr_id).collect::<Vec<_>>(), [0, 1, 2, 3]);
    // The requester's status for the responder's length error: REM_INV_REQ on `shm` (and
    // mlx5), REM_OP on rxe.
    let remote = [WcStatus::RemInvReqErr, WcStatus::RemOpErr];
    assert!(w[0].is_ok() && remote.contains(&w[1].status), "{w:?}");
    assert!(w[2..].iter().all(|w| w.status == WcStatus::WrFlushErr), "{w:?}");
    assert_no_completion(&mut a1.scq);
    p.next_requests_go_to_the_second_qp(true);
}

/// srq notes: "What will happen if I will deregister an MR that is used by an outstanding WR?
/// When processing a WR, if one of the MRs that are specified in the WR isn't valid, a Work
/// Completion with error will be generated." No byte is written through the dead MR.
pub fn srq_mr_deregistered_while_outstanding<H: Harness>(t: &str) {
    let mut s = SrqSide::<H>::new(t, 0, 16);
    let mr2 = s.b.pd.reg_mr(&s.b.region, RX, 4096, AccessFlags::LOCAL_WRITE).unwrap();
    s.srq.post_recv(&RecvChain::one(1, &[Sge::new(mr2.addr(), 64, mr2.lkey())])).unwrap();
    drop(mr2);
    let mut qb = s.qp(QpType::Rc);
    let (mut a, mut qa) = sender_to::<H>(t, 1, &mut qb, &ConnOpts::default());
    a.write(0, &[0xab; 16]);
    send(&mut qa, &a, 1, 0, 16);
    let w = poll_one(&mut a.scq);
    assert_ne!(w.status, WcStatus::Success, "the sender must not see success");
    let r = poll_one(&mut s.b.rcq);
    assert_eq!(r.wr_id, 1);
    assert_ne!(r.status, WcStatus::Success);
    assert_eq!(s.b.read(RX, 16), [0u8; 16], "nothing written through a deregistered MR");
}

/// The same rule for a QP's own RQ (srq notes: "When processing a WR, if one of the MRs that
/// are specified in the WR isn't valid, a Work Completion with error will be generated"): an
/// 8-byte SEND whose one-SGE receive lost its MR after posting completes with an error on
/// both sides and writes nothing. On `shm` this is the fast path's fallback after it took the
/// receive request.
pub fn rq_mr_deregistered_while_outstanding<H: Harness>(t: &str) {
    let mut p = rc_pair::<H>(t);
    let mr2 = p.b.pd.reg_mr(&p.b.region, RX, 4096, AccessFlags::LOCAL_WRITE).unwrap();
    p.qb.post_recv(&RecvChain::one(1, &[Sge::new(mr2.addr(), 64, mr2.lkey())])).unwrap();
    drop(mr2);
    p.a.write(0, &[0xab; 8]);
    send(&mut p.qa, &p.a, 1, 0, 8);
    let w = poll_one(&mut p.a.scq);
    assert_eq!(w.wr_id, 1);
    assert_ne!(w.status, WcStatus::Success, "the sender must not see success");
    let r = poll_one(&mut p.b.rcq);
    assert_eq!(r.wr_id, 1);
    assert_ne!(r.status, WcStatus::Success);
    assert_eq!(p.b.read(RX, 8), [0u8; 8], "nothing written through a deregistered MR");
}

/// ibv_post_recv(3) (the message is scattered over the request's SGEs in order): one 8-byte
/// SGE sent into a receive of two 4-byte SGEs fills both, and nothing around them. On `shm`
/// a one-SGE SEND takes the fast path, which hands a multi-SGE receive to the general scatter.
pub fn send_one_sge_into_two_sge_recv<H: Harness>(t: &str) {
    let mut p = rc_pair::<H>(t);
    let msg = pattern(9, 8);
    p.a.write(0, &msg);
    p.b.region.fill(RX, 4096, 0xcc);
    p.qb.post_recv(&RecvChain::one(1, &[p.b.sge(RX + 100, 4), p.b.sge(RX + 200, 4)])).unwrap();
    send(&mut p.qa, &p.a, 1, 0, 8);
    let r = poll_one(&mut p.b.rcq);
    assert_eq!((r.wr_id, r.status, r.byte_len, r.opcode), (1, WcStatus::Success, 8, WcOpcode::Recv));
    assert_eq!(poll_one(&mut p.a.scq).status, WcStatus::Success);
    assert_eq!(p.b.read(RX + 100, 4), msg[..4]);
    assert_eq!(p.b.read(RX + 200, 4), msg[4..]);
    assert_eq!(p.b.read(RX + 104, 4), [0xcc; 4], "canary after the first receive SGE");
    assert_eq!(p.b.read(RX + 204, 4), [0xcc; 4], "canary after the second receive SGE");
}

/// ibv_post_srq_recv(3): "If a WR is being posted to a UD QP, the Global Routing Header (GRH) of
/// the incoming message will be placed in the first 40 bytes of the buffer(s)" — for UD QPs
/// taking their receives from an SRQ too.
pub fn ud_over_srq_data_at_40<H: Harness>(t: &str) {
    let mut s = SrqSide::<H>::new(t, 0, 16);
    let mut qb = s.qp(QpType::Ud);
    ud_ready(&mut qb, QKEY);
    let mut a = Node::<H>::open(t, 1);
    let mut qa = a.qp(QpType::Ud, QpCaps::default(), None, false);
    ud_ready(&mut qa, QKEY);
    let ah = ah_to::<H>(&a, &qb.endpoint(H::gid_index()).unwrap(), true).unwrap();
    let data = pattern(11, 64);
    a.write(0, &data);
    s.post(5, RX, 40 + 64);
    qa.post_send(&SendChain::one(ud_send_wr::<H>(&ah, qb.qp_num(), QKEY, 1), &[a.sge(0, 64)])).unwrap();
    assert_eq!(poll_one(&mut a.scq).status, WcStatus::Success);
    let r = poll_one(&mut s.b.rcq);
    assert_eq!(
        (r.wr_id, r.status, r.byte_len, r.src_qp, r.qp_num),
        (5, WcStatus::Success, 104, qa.qp_num(), qb.qp_num())
    );
    assert!(r.wc_flags.contains(WcFlags::GRH));
    assert_eq!(s.b.read(RX + 40, 64), data);
}

// ------------------------------------------------------------------------------------------
// QP state machine, RNR, retries, flush
// ------------------------------------------------------------------------------------------

/// srq notes ("Wait enough time, maybe a Work Completion will eventually be generated";
/// architecture: an empty RQ leaves the WR pending, retried up to rnr_retry, 7 = forever): a
/// SEND to a QP with no receive posted does not complete while the responder has none, and
/// completes successfully once one is posted.
pub fn rnr_then_success<H: Harness>(t: &str) {
    let o = ConnOpts { rnr_retry: 7, min_rnr_timer: 1, ..Default::default() };
    let mut p = rc_pair_with::<H>(t, o);
    p.a.write(0, b"patience");
    send(&mut p.qa, &p.a, 1, 0, 8);
    assert_no_completion(&mut p.a.scq);
    assert_no_completion(&mut p.b.rcq);
    recv(&mut p.qb, &p.b, 9, RX, 64);
    let s = poll_one(&mut p.a.scq);
    assert_eq!((s.wr_id, s.status), (1, WcStatus::Success));
    let r = poll_one(&mut p.b.rcq);
    assert_eq!((r.wr_id, r.status, r.byte_len), (9, WcStatus::Success, 8));
    assert_eq!(p.b.read(RX, 8), b"patience");
}

/// RNR retries exhausted (rnr_retry 1): IBV_WC_RNR_RETRY_EXC_ERR, the QP enters ERROR, and every
/// WR posted behind it — and after it, signaled or not — completes with IBV_WC_WR_FLUSH_ERR,
/// in posting order (errors always generate a completion).
pub fn rnr_retry_exhausted_flushes_rest<H: Harness>(t: &str) {
    let o = ConnOpts { rnr_retry: 1, min_rnr_timer: 1, ..Default::default() };
    let mut p = rc_pair_with::<H>(t, o);
    let mut c = SendChain::new();
    c.push(SendWr::send(1).signaled(), &[p.a.sge(0, 8)]);
    c.push(SendWr::send(2), &[p.a.sge(0, 8)]);
    c.push(SendWr::send(3).signaled(), &[p.a.sge(0, 8)]);
    p.qa.post_send(&c).unwrap();
    let s = poll_n(&mut p.a.scq, 3);
    assert_eq!(
        s.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [(1, WcStatus::RnrRetryExcErr), (2, WcStatus::WrFlushErr), (3, WcStatus::WrFlushErr)]
    );
    assert_eq!(p.qa.state(), QpState::Error);
    p.qa.post_send(&SendChain::one(SendWr::send(4), &[p.a.sge(0, 8)])).expect("post_send in ERROR is accepted");
    let s = poll_one(&mut p.a.scq);
    assert_eq!((s.wr_id, s.status), (4, WcStatus::WrFlushErr));
    recv(&mut p.qb, &p.b, 1, RX, 64);
    assert_no_completion(&mut p.b.rcq);
    assert_no_completion(&mut p.a.scq);
}

/// ibv_modify_qp(3) to ERROR: every posted receive completes with IBV_WC_WR_FLUSH_ERR and its
/// wr_id, in order; a receive (or send) posted in ERROR is accepted and flushed too.
pub fn modify_to_error_flushes_recvs<H: Harness>(t: &str) {
    let mut p = rc_pair::<H>(t);
    for i in 7..10 {
        recv(&mut p.qb, &p.b, i, RX + i as usize * 64, 64);
    }
    p.qb.modify(&QpAttr { state: QpState::Error, ..Default::default() }).unwrap();
    assert_eq!(p.qb.state(), QpState::Error);
    let r = poll_n(&mut p.b.rcq, 3);
    assert_eq!(
        r.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        (7..10).map(|i| (i, WcStatus::WrFlushErr)).collect::<Vec<_>>()
    );
    recv(&mut p.qb, &p.b, 10, RX, 64);
    let r = poll_one(&mut p.b.rcq);
    assert_eq!((r.wr_id, r.status), (10, WcStatus::WrFlushErr));
    p.qb.post_send(&SendChain::one(SendWr::send(11), &[p.b.sge(0, 8)])).unwrap();
    let s = poll_one(&mut p.b.scq);
    assert_eq!((s.wr_id, s.status), (11, WcStatus::WrFlushErr));
    assert_no_completion(&mut p.b.rcq);
}

/// ibv_modify_qp(3) state machine: RESET→RTR, RESET→RTS, INIT→RTS, RTS→INIT and ERROR→RTS fail
/// with EINVAL and leave the state unchanged; ERROR→RESET→INIT→RTR→RTS works and the QP
/// carries traffic again.
pub fn invalid_transitions_einval<H: Harness>(t: &str) {
    let a = Node::<H>::open(t, 0);
    let mut b = Node::<H>::open(t, 1);
    let mut qa = a.qp(QpType::Rc, QpCaps::default(), None, false);
    let mut qb = b.qp(QpType::Rc, QpCaps::default(), None, false);
    let o = ConnOpts::default();
    let eb = qb.endpoint(H::gid_index()).unwrap();
    let ah = AhAttr { dlid: eb.lid, is_global: true, dgid: eb.gid, port_num: 1, hop_limit: 1, ..Default::default() };
    let rtr = QpAttr { state: QpState::Rtr, dest_qp_num: eb.qpn, ah, min_rnr_timer: 1, ..Default::default() };
    let rts = QpAttr { state: QpState::Rts, ..Default::default() };
    let init = QpAttr { state: QpState::Init, access: o.access, ..Default::default() };
    let bad = |qp: &mut QpOf<H>, attr: &QpAttr, from: QpState| {
        let e = qp.modify(attr).expect_err("forbidden transition");
        assert_eq!(e.errno, Errno::EINVAL, "{from:?} -> {:?}", attr.state);
        assert_eq!(qp.state(), from);
    };
    bad(&mut qa, &rtr, QpState::Reset);
    bad(&mut qa, &rts, QpState::Reset);
    qa.modify(&init).unwrap();
    bad(&mut qa, &rts, QpState::Init);
    qa.modify(&rtr).unwrap();
    qa.modify(&rts).unwrap();
    bad(&mut qa, &init, QpState::Rts);
    qa.modify(&QpAttr { state: QpState::Error, ..Default::default() }).unwrap();
    bad(&mut qa, &rts, QpState::Error);
    bad(&mut qa, &init, QpState::Error);
    qa.modify(&QpAttr { state: QpState::Reset, ..Default::default() }).unwrap();
    assert_eq!(qa.state(), QpState::Reset);
    qa.modify(&init).unwrap();
    assert_eq!(qa.state(), QpState::Init);
    let ea = qa.endpoint(H::gid_index()).unwrap();
    to_init(&mut qb, 0, o.access);
    bring_up(&mut qb, &ea, &o);
    qa.modify(&rtr).unwrap();
    qa.modify(&rts).unwrap();
    recv(&mut qb, &b, 1, RX, 64);
    let mut a = a;
    send(&mut qa, &a, 1, 0, 8);
    assert_eq!(poll_one(&mut a.scq).status, WcStatus::Success);
    assert_eq!(poll_one(&mut b.rcq).status, WcStatus::Success);
}

/// ibv_create_qp(3)/ibv_create_cq(3): zero-depth queues are refused with EINVAL — a send queue
/// of 0, a receive queue of 0 without an SRQ, a CQ of 0 — as are depths above the device's
/// limits; a receive queue of 0 with an SRQ is fine (the QP's own RQ is not used).
pub fn zero_depth_queues_einval<H: Harness>(t: &str) {
    let b = Node::<H>::open(t, 0);
    let caps = b.ctx.caps();
    let bad_caps = [
        QpCaps { max_send_wr: 0, ..Default::default() },
        QpCaps { max_recv_wr: 0, ..Default::default() },
        QpCaps { max_send_wr: caps.max_qp_wr + 1, ..Default::default() },
        QpCaps { max_send_sge: caps.max_sge + 1, ..Default::default() },
    ];
    for cap in bad_caps {
        let e = b.try_qp(QpType::Rc, cap, None, false).err().unwrap_or_else(|| panic!("{cap:?} accepted"));
        assert_eq!(e.errno, Errno::EINVAL, "{cap:?}");
    }
    for cqe in [0, caps.max_cqe + 1] {
        assert_eq!(b.ctx.create_cq(cqe).err().expect("bad CQ size").errno, Errno::EINVAL, "cqe {cqe}");
    }
    let srq = b.pd.create_srq(&srq_attr(16, 1)).unwrap();
    b.try_qp(QpType::Rc, QpCaps { max_recv_wr: 0, ..Default::default() }, Some(&srq), false)
        .expect("max_recv_wr 0 with an SRQ");
}

/// RC reliability (IBV_WC_RETRY_EXC_ERR): a QP whose destination QP does not exist gets no
/// answer; with retry_cnt 1 and a short ACK timeout the SEND fails with RETRY_EXC_ERR and the
/// QP enters ERROR.
pub fn unreachable_peer_retry_exc<H: Harness>(t: &str) {
    let mut a = Node::<H>::open(t, 0);
    let b = Node::<H>::open(t, 1);
    let gone = {
        let q = b.qp(QpType::Rc, QpCaps::default(), None, false);
        q.endpoint(H::gid_index()).unwrap()
    };
    let mut qa = a.qp(QpType::Rc, QpCaps::default(), None, false);
    let o = ConnOpts { retry_cnt: 1, timeout: 1, ..Default::default() };
    to_init(&mut qa, 0, o.access);
    bring_up(&mut qa, &gone, &o);
    send(&mut qa, &a, 1, 0, 8);
    let s = poll_one(&mut a.scq);
    assert_eq!((s.wr_id, s.status), (1, WcStatus::RetryExcErr));
    assert_eq!(qa.state(), QpState::Error);
}

/// Completion order after an error raised by the peer: a SEND waits for a receive (RNR); then
/// the peer's too-long message puts this QP into ERROR (LOC_LEN_ERR). The waiting SEND and a
/// SEND posted afterwards both complete with IBV_WC_WR_FLUSH_ERR, in posting order (a send
/// queue is FIFO; "errors always generate a completion").
pub fn flush_after_peer_error_keeps_order<H: Harness>(t: &str) {
    let mut p = rc_pair::<H>(t);
    send(&mut p.qa, &p.a, 1, 0, 8);
    recv(&mut p.qa, &p.a, 50, RX, 4);
    send(&mut p.qb, &p.b, 60, 0, 16);
    assert_eq!(poll_one(&mut p.b.scq).status, WcStatus::RemInvReqErr);
    assert_eq!(poll_one(&mut p.a.rcq).status, WcStatus::LocLenErr);
    assert_eq!(p.qa.state(), QpState::Error);
    p.qa.post_send(&SendChain::one(SendWr::send(2).signaled(), &[p.a.sge(0, 8)])).unwrap();
    let s = poll_n(&mut p.a.scq, 2);
    assert_eq!(
        s.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [(1, WcStatus::WrFlushErr), (2, WcStatus::WrFlushErr)]
    );
}

// ------------------------------------------------------------------------------------------
// RDMA WRITE/READ and atomics
// ------------------------------------------------------------------------------------------

/// ibv_post_send(3) opcodes on RC with a correct rkey: RDMA_WRITE places the bytes at
/// remote_addr; RDMA_READ copies remote bytes into the local scatter list (byte_len = length);
/// FETCH_AND_ADD returns the old value and adds; CMP_AND_SWP swaps only when equal and
/// returns the old value either way.
pub fn rdma_write_read_atomics<H: Harness>(t: &str) {
    let mut p = rc_pair::<H>(t);
    let rkey = p.b.mr.rkey();
    let data = pattern(12, 64);
    p.a.write(0, &data);
    let go = |wr: SendWr, sge: Sge, p: &mut Pair<H>| -> WorkCompletion {
        p.qa.post_send(&SendChain::one(wr.signaled(), &[sge])).unwrap();
        let s = poll_one(&mut p.a.scq);
        assert_eq!((s.wr_id, s.status), (wr.wr_id, WcStatus::Success), "{}", wr.opcode.name());
        s
    };
    let s = go(SendWr::write(1, p.b.addr(RX + 100), rkey), p.a.sge(0, 64), &mut p);
    assert_eq!(s.opcode, WcOpcode::RdmaWrite);
    assert_eq!(p.b.read(RX + 100, 64), data);
    let remote = pattern(13, 16);
    p.b.write(RX + 1000, &remote);
    let s = go(SendWr::read(2, p.b.addr(RX + 1000), rkey), p.a.sge(2000, 16), &mut p);
    assert_eq!((s.opcode, s.byte_len), (WcOpcode::RdmaRead, 16));
    assert_eq!(p.a.read(2000, 16), remote);
    let word = RX + 4096;
    p.b.write(word, &5u64.to_ne_bytes());
    let s = go(SendWr::fetch_add(3, p.b.addr(word), rkey, 3), p.a.sge(3000, 8), &mut p);
    assert_eq!((s.opcode, s.byte_len), (WcOpcode::FetchAdd, 8));
    assert_eq!(p.a.read(3000, 8), 5u64.to_ne_bytes());
    assert_eq!(p.b.read(word, 8), 8u64.to_ne_bytes());
    let s = go(SendWr::cmp_swap(4, p.b.addr(word), rkey, 8, 100), p.a.sge(3008, 8), &mut p);
    assert_eq!(s.opcode, WcOpcode::CompSwap);
    assert_eq!(p.a.read(3008, 8), 8u64.to_ne_bytes());
    assert_eq!(p.b.read(word, 8), 100u64.to_ne_bytes());
    go(SendWr::cmp_swap(5, p.b.addr(word), rkey, 7, 1), p.a.sge(3016, 8), &mut p);
    assert_eq!(p.a.read(3016, 8), 100u64.to_ne_bytes());
    assert_eq!(p.b.read(word, 8), 100u64.to_ne_bytes(), "no swap when the compare fails");
    assert_no_completion(&mut p.b.rcq);
}

/// ibv_post_send(3): "rkey: Key of the remote Memory Region" — a wrong rkey gives
/// IBV_WC_REM_ACCESS_ERR, the QP enters ERROR, and no remote byte changes; the same for READ
/// and atomics.
pub fn rdma_bad_rkey_rem_access<H: Harness>(t: &str) {
    let mut p = rc_pair::<H>(t);
    let o = ConnOpts::default();
    let bad = p.b.mr.rkey() ^ 0x0033_3000;
    p.a.write(0, &[0xab; 16]);
    for wr in [
        SendWr::write(1, p.b.addr(RX), bad),
        SendWr::read(2, p.b.addr(RX), bad),
        SendWr::fetch_add(3, p.b.addr(RX), bad, 1),
        SendWr::cmp_swap(4, p.b.addr(RX), bad, 0, 9),
    ] {
        let len = if wr.opcode == WrOpcode::RdmaWrite || wr.opcode == WrOpcode::RdmaRead { 16 } else { 8 };
        p.qa.post_send(&SendChain::one(wr.signaled(), &[p.a.sge(0, len)])).unwrap();
        let s = poll_one(&mut p.a.scq);
        assert_eq!((s.wr_id, s.status), (wr.wr_id, WcStatus::RemAccessErr), "{}", wr.opcode.name());
        assert_eq!(p.qa.state(), QpState::Error);
        assert_eq!(p.b.read(RX, 16), [0u8; 16]);
        assert_eq!(p.a.read(0, 16), [0xab; 16], "{}: local buffer untouched", wr.opcode.name());
        reconnect::<H>(&mut p, &o);
    }
}

/// ibv_reg_mr(3) access flags as enforced by the responder: an RDMA WRITE into an MR without
/// IBV_ACCESS_REMOTE_WRITE, a READ of one without REMOTE_READ and an atomic on one without
/// REMOTE_ATOMIC all fail with IBV_WC_REM_ACCESS_ERR and change nothing.
pub fn rdma_missing_remote_access_rem_access<H: Harness>(t: &str) {
    let mut p = rc_pair::<H>(t);
    let o = ConnOpts::default();
    let lw = AccessFlags::LOCAL_WRITE;
    let no_write = p.b.pd.reg_mr(&p.b.region, RX, 4096, lw | AccessFlags::REMOTE_READ).unwrap();
    let no_read = p.b.pd.reg_mr(&p.b.region, RX, 4096, lw | AccessFlags::REMOTE_WRITE).unwrap();
    let no_atomic =
        p.b.pd.reg_mr(&p.b.region, RX, 4096, lw | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ).unwrap();
    p.a.write(0, &[0xab; 16]);
    for (wr, len) in [
        (SendWr::write(1, no_write.addr(), no_write.rkey()), 16),
        (SendWr::read(2, no_read.addr(), no_read.rkey()), 16),
        (SendWr::fetch_add(3, no_atomic.addr(), no_atomic.rkey(), 1), 8),
    ] {
        p.qa.post_send(&SendChain::one(wr.signaled(), &[p.a.sge(0, len)])).unwrap();
        let s = poll_one(&mut p.a.scq);
        assert_eq!((s.wr_id, s.status), (wr.wr_id, WcStatus::RemAccessErr), "{}", wr.opcode.name());
        assert_eq!(p.b.read(RX, 16), [0u8; 16]);
        assert_eq!(p.a.read(0, 16), [0xab; 16]);
        reconnect::<H>(&mut p, &o);
    }
    // With the right flag the same MR works.
    p.qa.post_send(&SendChain::one(SendWr::read(4, no_write.addr(), no_write.rkey()).signaled(), &[p.a.sge(0, 16)]))
        .unwrap();
    assert_eq!(poll_one(&mut p.a.scq).status, WcStatus::Success);
}

/// Remote bounds (ibv_post_send(3): "remote_addr: Start address of remote memory buffer" of
/// the MR named by rkey): WRITE, READ and atomics that reach past either end of the MR fail with
/// IBV_WC_REM_ACCESS_ERR, and no byte outside the MR changes — canaries just past its end and
/// before its start (same region, outside the MR) stay intact, and so do the in-range bytes.
pub fn rdma_out_of_bounds_rem_access<H: Harness>(t: &str) {
    let mut p = rc_pair::<H>(t);
    let o = ConnOpts::default();
    let base = RX + 65536;
    let all =
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC;
    let mr = p.b.pd.reg_mr(&p.b.region, base, 4096, all).unwrap();
    p.b.region.fill(base - 64, 64, 0xcc);
    p.b.region.fill(base + 4096, 64, 0xcc);
    p.a.write(0, &[0xab; 32]);
    let (lo, hi, k) = (mr.addr(), mr.addr() + 4096, mr.rkey());
    for (wr, len) in [
        (SendWr::write(1, hi - 8, k), 16),
        (SendWr::write(2, lo - 8, k), 16),
        (SendWr::write(3, hi, k), 1),
        (SendWr::read(4, hi - 8, k), 16),
        (SendWr::fetch_add(5, hi, k, 1), 8),
        (SendWr::cmp_swap(6, lo - 8, k, 0, 1), 8),
    ] {
        p.qa.post_send(&SendChain::one(wr.signaled(), &[p.a.sge(0, len)])).unwrap();
        let s = poll_one(&mut p.a.scq);
        assert_eq!((s.wr_id, s.status), (wr.wr_id, WcStatus::RemAccessErr), "{}", wr.opcode.name());
        assert_eq!(p.b.read(base - 64, 64), [0xcc; 64], "canary before the MR");
        assert_eq!(p.b.read(base + 4096, 64), [0xcc; 64], "canary after the MR");
        assert_eq!(p.b.read(base, 4096), vec![0u8; 4096], "in-range bytes of a failed WR");
        reconnect::<H>(&mut p, &o);
    }
    // Exactly up to the end is in bounds.
    p.qa.post_send(&SendChain::one(SendWr::write(7, hi - 16, k).signaled(), &[p.a.sge(0, 16)])).unwrap();
    assert_eq!(poll_one(&mut p.a.scq).status, WcStatus::Success);
    assert_eq!(p.b.read(base + 4096 - 16, 16), [0xab; 16]);
    assert_eq!(p.b.read(base + 4096, 64), [0xcc; 64]);
}

/// ibv_post_send(3)/ibv_post_recv(3) RETURN VALUE ("returns 0 on success, or the value of errno
/// on failure"): garbage arguments — huge addresses, length u32::MAX, lkey 0xffffffff, 100
/// SGEs, out-of-range attributes — give errors (at post time or as error completions), never
/// a panic or a crash, and leave a healthy QP healthy.
pub fn garbage_arguments_never_panic<H: Harness>(t: &str) {
    let mut p = rc_pair::<H>(t);
    let lkey = p.a.mr.lkey();
    let junk_sges = [
        Sge::new(u64::MAX - 3, u32::MAX, 0xffff_ffff),
        Sge::new(u64::MAX - 3, 16, lkey),
        Sge::new(p.a.addr(0), u32::MAX, lkey),
        Sge::new(0, 16, lkey),
        Sge::new(p.a.addr(0), 16, 0),
    ];
    // Where SGEs are checked only at execution, junk SGEs are the device's to reject (and could
    // fault a user-space provider reading them); only shm-style providers get them here.
    let n_junk = if H::sge_checked_at_post() { junk_sges.len() } else { 0 };
    for sge in &junk_sges[..n_junk] {
        let sge = *sge;
        let r = p.qa.post_send(&SendChain::one(SendWr::send(1).signaled(), &[sge]));
        assert_eq!(r.map_err(|e| e.errno), Err(Errno::EINVAL), "send {sge:?}");
        let r = p.qb.post_recv(&RecvChain::one(1, &[sge]));
        assert_eq!(r.map_err(|e| e.errno), Err(Errno::EINVAL), "recv {sge:?}");
    }
    let hundred = vec![p.a.sge(0, 8); 100];
    assert!(p.qa.post_send(&SendChain::one(SendWr::send(1), &hundred)).is_err());
    assert!(p.qb.post_recv(&RecvChain::one(1, &hundred)).is_err());
    let mut srq = p.b.pd.create_srq(&srq_attr(4, 1)).unwrap();
    assert!(srq.post_recv(&RecvChain::one(1, &hundred)).is_err());
    if H::sge_checked_at_post() {
        assert!(srq.post_recv(&RecvChain::one(1, &[junk_sges[0]])).is_err());
    }
    // Atomics need an 8-byte local buffer: refused at post, or failed at execution.
    let faa = SendWr::fetch_add(1, p.b.addr(RX), p.b.mr.rkey(), 1).signaled();
    if p.qa.post_send(&SendChain::one(faa, &[p.a.sge(0, 4)])).is_ok() {
        assert_ne!(poll_one(&mut p.a.scq).status, WcStatus::Success);
        reconnect::<H>(&mut p, &ConnOpts::default());
    }
    // Control path.
    assert!(p.a.ctx.port_attr(200).is_err());
    assert!(p.a.ctx.gid(1, 200).is_err());
    assert!(p.a.ctx.create_cq(u32::MAX).is_err());
    assert!(p.a.pd.create_srq(&srq_attr(u32::MAX, u32::MAX)).is_err());
    assert!(p.a.pd.reg_mr(&p.a.region, BUF, 1, AccessFlags::LOCAL_WRITE).is_err());
    assert!(p.a.pd.reg_mr(&p.a.region, 0, usize::MAX, AccessFlags::LOCAL_WRITE).is_err());
    assert!(p.a.pd.reg_mr(&p.a.region, 0, 0, AccessFlags::LOCAL_WRITE).is_err());
    let mut q = p.a.qp(QpType::Rc, QpCaps::default(), None, false);
    assert!(q.modify(&QpAttr { state: QpState::Init, port_num: 200, ..Default::default() }).is_err());
    q.modify(&QpAttr { state: QpState::Init, ..Default::default() }).unwrap();
    let eb = p.qb.endpoint(H::gid_index()).unwrap();
    assert!(q
        .modify(&QpAttr { state: QpState::Rtr, dest_qp_num: eb.qpn, path_mtu: 12345, ..Default::default() })
        .is_err());
    assert!(q
        .modify(&QpAttr { state: QpState::Rtr, dest_qp_num: eb.qpn, min_rnr_timer: 200, ..Default::default() })
        .is_err());
    assert_eq!(q.state(), QpState::Init);
    // The pair is untouched by all of the above.
    assert_eq!((p.qa.state(), p.qb.state()), (QpState::Rts, QpState::Rts));
    recv(&mut p.qb, &p.b, 9, RX, 64);
    send(&mut p.qa, &p.a, 9, 0, 8);
    assert_eq!(poll_one(&mut p.a.scq).status, WcStatus::Success);
    assert_eq!(poll_one(&mut p.b.rcq).wr_id, 9);
    // Remote garbage is detected by the responder: an error completion, not a crash.
    for wr in [
        SendWr::write(10, u64::MAX - 3, 0xffff_ffff),
        SendWr::write(11, u64::MAX - 3, p.b.mr.rkey()),
        SendWr::read(12, 0, p.b.mr.rkey()),
        SendWr::fetch_add(13, p.b.addr(RX) + 3, p.b.mr.rkey(), 1),
    ] {
        let len = if wr.opcode == WrOpcode::AtomicFetchAndAdd { 8 } else { 16 };
        if p.qa.post_send(&SendChain::one(wr.signaled(), &[p.a.sge(0, len)])).is_ok() {
            assert_ne!(poll_one(&mut p.a.scq).status, WcStatus::Success, "{}", wr.opcode.name());
        }
        reconnect::<H>(&mut p, &ConnOpts::default());
    }
}

/// ibv_post_send(3): "addr: Start address of the local memory buffer or number of bytes from the
/// start of the MR for MRs which are IBV_ZERO_BASED" — for gather, scatter and remote
/// addresses alike; a ZERO_BASED offset past the MR's length is outside it.
pub fn sge_zero_based_mr<H: Harness>(t: &str) {
    let mut p = rc_pair::<H>(t);
    let lw = AccessFlags::LOCAL_WRITE | AccessFlags::ZERO_BASED;
    let za = match p.a.pd.reg_mr(&p.a.region, 8192, 4096, lw) {
        Err(e) if e.errno == Errno::EOPNOTSUPP => {
            println!("sge_zero_based_mr: not applicable, the device has no zero-based MRs");
            return;
        }
        r => r.expect("reg_mr ZERO_BASED"),
    };
    let zb = p.b.pd.reg_mr(&p.b.region, RX + 8192, 4096, lw | AccessFlags::REMOTE_WRITE).unwrap();
    let data = pattern(14, 16);
    p.a.write(8192 + 100, &data);
    p.qb.post_recv(&RecvChain::one(1, &[Sge::new(200, 16, zb.lkey())])).unwrap();
    p.qa.post_send(&SendChain::one(SendWr::send(1).signaled(), &[Sge::new(100, 16, za.lkey())])).unwrap();
    assert_eq!(poll_one(&mut p.a.scq).status, WcStatus::Success);
    assert_eq!(poll_one(&mut p.b.rcq).byte_len, 16);
    assert_eq!(p.b.read(RX + 8192 + 200, 16), data);
    let w = SendWr::write(2, 300, zb.rkey()).signaled();
    p.qa.post_send(&SendChain::one(w, &[Sge::new(100, 16, za.lkey())])).unwrap();
    assert_eq!(poll_one(&mut p.a.scq).status, WcStatus::Success);
    assert_eq!(p.b.read(RX + 8192 + 300, 16), data);
    expect_bad_local_sge(&mut p, &SendChain::one(SendWr::send(3).signaled(), &[Sge::new(4090, 16, za.lkey())]));
}

/// srq notes: "If the QP is in RTR, RTS, SQD or SQE state, incoming messages will be processed
/// and RRs will be fetched from the SRQ if needed." A QP only in RTR (never moved to RTS) and a
/// QP moved to SQD both receive from the SRQ. (SQE is entered only by a send error on UC/UD
/// and cannot be reached deterministically.)
pub fn srq_fetched_in_rtr_and_sqd<H: Harness>(t: &str) {
    let mut s = SrqSide::<H>::new(t, 0, 16);
    s.post(1, RX, 64);
    s.post(2, RX + 64, 64);
    let o = ConnOpts::default();
    // RTR only.
    let mut qb = s.qp(QpType::Rc);
    let mut a = Node::<H>::open(t, 1);
    let mut qa = a.qp(QpType::Rc, QpCaps::default(), None, false);
    let (ea, eb) = (qa.endpoint(H::gid_index()).unwrap(), qb.endpoint(H::gid_index()).unwrap());
    to_init(&mut qb, 0, o.access);
    to_rtr(&mut qb, &ea, &o);
    to_init(&mut qa, 0, o.access);
    bring_up(&mut qa, &eb, &o);
    assert_eq!(qb.state(), QpState::Rtr);
    send(&mut qa, &a, 1, 0, 8);
    assert_eq!(poll_one(&mut a.scq).status, WcStatus::Success);
    let r = poll_one(&mut s.b.rcq);
    assert_eq!((r.wr_id, r.status, r.qp_num), (1, WcStatus::Success, qb.qp_num()));
    // SQD.
    let mut qc = s.qp(QpType::Rc);
    let (mut c, mut qd) = sender_to::<H>(t, 2, &mut qc, &o);
    qc.modify(&QpAttr { state: QpState::Sqd, ..Default::default() }).expect("RTS->SQD");
    send(&mut qd, &c, 2, 0, 8);
    assert_eq!(poll_one(&mut c.scq).status, WcStatus::Success);
    let r = poll_one(&mut s.b.rcq);
    assert_eq!((r.wr_id, r.status, r.qp_num), (2, WcStatus::Success, qc.qp_num()));
}

/// srq notes: "Can I (re)use the Receive Request after ibv_post_srq_recv() returned? Yes. This
/// verb translates the Receive Request ... and you can (re)use both the Receive Request and the
/// s/g list within it." Changing or clearing the chain after the post does not change what was
/// posted.
pub fn srq_recv_request_reusable_after_post<H: Harness>(t: &str) {
    let mut s = SrqSide::<H>::new(t, 0, 16);
    let mut c = RecvChain::new();
    c.push(RecvWr::new(1), &[s.b.sge(RX, 64)]);
    c.push(RecvWr::new(2), &[s.b.sge(RX + 64, 64)]);
    s.srq.post_recv(&c).unwrap();
    c.wrs_mut()[0].wr_id = 99;
    c.clear();
    c.push(RecvWr::new(3), &[s.b.sge(RX + 128, 64)]);
    s.srq.post_recv(&c).unwrap();
    let mut qb = s.qp(QpType::Rc);
    let (mut a, mut qa) = sender_to::<H>(t, 1, &mut qb, &ConnOpts::default());
    for i in 0..3u8 {
        a.write(0, &[i + 1; 8]);
        send(&mut qa, &a, i as u64, 0, 8);
        assert_eq!(poll_one(&mut a.scq).status, WcStatus::Success);
    }
    let r = poll_n(&mut s.b.rcq, 3);
    assert_eq!(r.iter().map(|w| w.wr_id).collect::<Vec<_>>(), [1, 2, 3]);
    for i in 0..3 {
        assert_eq!(s.b.read(RX + i * 64, 8), [i as u8 + 1; 8]);
    }
}

// ---------------------------------------------------------------------------------------------
// ibv_post_srq_ops(3): tag matching.

struct Tm<H: Harness> {
    a: Node<H>,
    b: Node<H>,
    qa: QpOf<H>,
    qb: QpOf<H>,
    srq: SrqOf<H>,
}

fn tm_setup<H: Harness>(t: &str, max_num_tags: u32, max_ops: u32) -> Tm<H> {
    let a = Node::<H>::open(t, 0);
    let b = Node::<H>::open(t, 1);
    let srq = b
        .pd
        .create_srq_tm(&SrqAttr { max_wr: 16, max_sge: 1, srq_limit: 0 }, &TmCaps { max_num_tags, max_ops }, &b.rcq)
        .expect("create_srq_tm");
    let mut qb = b.qp(QpType::Rc, QpCaps::default(), Some(&srq), false);
    let mut qa = a.qp(QpType::Rc, QpCaps::default(), None, false);
    connect::<H>(&mut qa, &mut qb, &ConnOpts::default());
    Tm { a, b, qa, qb, srq }
}

impl<H: Harness> Tm<H> {
    /// Sends a tagged eager message: TMH then `payload`.
    fn send_tagged(&mut self, wr_id: u64, tag: u64, app_ctx: u32, payload: &[u8]) {
        let mut msg = Tmh::eager(tag, app_ctx).to_bytes().to_vec();
        msg.extend_from_slice(payload);
        self.a.write(0, &msg);
        send(&mut self.qa, &self.a, wr_id, 0, msg.len() as u32);
        assert!(poll_n(&mut self.a.scq, 1)[0].is_ok());
    }

    /// TAG_ADD of a 256-byte buffer at `off`; returns the handle.
    fn add(&mut self, wr_id: u64, recv_wr_id: u64, tag: u64, mask: u64, off: usize) -> u32 {
        let mut c = OpsChain::new();
        c.push(OpsWr::add(wr_id, recv_wr_id, tag, mask).signaled(), &[self.b.sge(off, 256)]);
        self.srq.post_ops(&mut c).expect("TAG_ADD");
        let wc = poll_n(&mut self.b.rcq, 1)[0];
        assert_eq!((wc.status, wc.opcode, wc.wr_id), (WcStatus::Success, WcOpcode::TmAdd, wr_id));
        c.wrs()[0].handle
    }

    fn plain(&mut self, wr_id: u64, off: usize) {
        self.srq.post_recv(&RecvChain::one(wr_id, &[self.b.sge(off, 256)])).expect("post_srq_recv");
    }
}

/// ibv_post_srq_ops(3): "Incoming message considered matching if TMH.tag & entry.mask ==
/// entry.tag"; a matched message lands without its header in the tagged buffer (TM_RECV with
/// TM_MATCH and TM_DATA_VALID, the TAG_ADD's `recv_wr_id`).
pub fn tm_matched_message_lands_headerless<H: Harness>(t: &str) {
    let mut s = tm_setup::<H>(t, 4, 8);
    s.add(1, 500, 0x1230, 0xfff0, 4096);
    s.send_tagged(9, 0x1234, 77, b"tagged payload");
    let wc = poll_n(&mut s.b.rcq, 1)[0];
    assert_eq!((wc.status, wc.opcode, wc.wr_id, wc.byte_len), (WcStatus::Success, WcOpcode::TmRecv, 500, 14));
    assert!(wc.wc_flags.contains(WcFlags::TM_MATCH | WcFlags::TM_DATA_VALID), "{:?}", wc.wc_flags);
    assert_eq!(s.b.read(4096, 14), b"tagged payload");
}

/// ibv_post_srq_ops(3): a tag that does not match under the entry's mask is not consumed; the
/// message is unexpected and lands whole (header included) in a plain SRQ buffer, with
/// IBV_WC_TM_SYNC_REQ "asking for IBV_WR_TAG_SYNC".
pub fn tm_unexpected_lands_whole_and_asks_for_sync<H: Harness>(t: &str) {
    let mut s = tm_setup::<H>(t, 4, 8);
    s.add(1, 500, 0x1230, 0xffff, 4096);
    s.plain(600, 8192);
    s.send_tagged(9, 0x9999, 5, b"nobody wants me");
    let wc = poll_n(&mut s.b.rcq, 1)[0];
    assert_eq!((wc.status, wc.opcode, wc.wr_id), (WcStatus::Success, WcOpcode::Recv, 600));
    assert_eq!(wc.byte_len as usize, TMH_LEN + 15);
    assert!(wc.wc_flags.contains(WcFlags::TM_SYNC_REQ));
    let head: [u8; TMH_LEN] = s.b.read(8192, TMH_LEN).try_into().unwrap();
    assert_eq!(Tmh::from_bytes(&head), Some(Tmh::eager(0x9999, 5)));
    assert_eq!(s.b.read(8192 + TMH_LEN, 15), b"nobody wants me");
}

/// ibv_post_srq_ops(3) phase synchronisation: after an unexpected message, matching is off
/// ("coherent only if all unexpected messages received by HW [are] completely processed in
/// SW") until a TAG_SYNC carries the right `unexpected_cnt`; list-op completions carry
/// TM_SYNC_REQ meanwhile.
pub fn tm_phase_sync_gates_matching<H: Harness>(t: &str) {
    let mut s = tm_setup::<H>(t, 4, 8);
    s.plain(600, 8192);
    s.plain(601, 8192 + 512);
    s.send_tagged(9, 0x42, 0, b"first"); // unexpected #1
    assert_eq!(poll_n(&mut s.b.rcq, 1)[0].wr_id, 600);
    // Adding a tag now: the op completes but asks for sync.
    let mut c = OpsChain::new();
    c.push(OpsWr::add(2, 700, 0x42, u64::MAX).signaled(), &[s.b.sge(4096, 256)]);
    s.srq.post_ops(&mut c).unwrap();
    let add = poll_n(&mut s.b.rcq, 1)[0];
    assert_eq!((add.opcode, add.status), (WcOpcode::TmAdd, WcStatus::Success));
    assert!(add.wc_flags.contains(WcFlags::TM_SYNC_REQ), "out of sync: {:?}", add.wc_flags);
    // Matching is off: the same tag goes unexpected again (#2).
    s.send_tagged(10, 0x42, 0, b"second");
    let wc = poll_n(&mut s.b.rcq, 1)[0];
    assert_eq!((wc.opcode, wc.wr_id), (WcOpcode::Recv, 601));
    // Software says it handled both; matching resumes.
    let mut c = OpsChain::new();
    c.push(OpsWr::sync(3, 2).signaled(), &[]);
    s.srq.post_ops(&mut c).unwrap();
    let sync = poll_n(&mut s.b.rcq, 1)[0];
    assert_eq!((sync.opcode, sync.status), (WcOpcode::TmSync, WcStatus::Success));
    assert!(!sync.wc_flags.contains(WcFlags::TM_SYNC_REQ));
    s.send_tagged(11, 0x42, 0, b"third");
    let wc = poll_n(&mut s.b.rcq, 1)[0];
    assert_eq!((wc.opcode, wc.wr_id, wc.byte_len), (WcOpcode::TmRecv, 700, 5));
    assert_eq!(s.b.read(4096, 5), b"third");
}

/// ibv_post_srq_ops(3): "IBV_WR_TAG_DEL removes previously added tag entry ... Operation may
/// fail due to concurrent tag consumption - in this case IBV_WC_TM_ERR status will be returned".
pub fn tm_delete_live_and_consumed_tags<H: Harness>(t: &str) {
    let mut s = tm_setup::<H>(t, 4, 8);
    let live = s.add(1, 500, 0x1, u64::MAX, 4096);
    let eaten = s.add(2, 501, 0x2, u64::MAX, 4096 + 512);
    s.send_tagged(9, 0x2, 0, b"x");
    assert_eq!(poll_n(&mut s.b.rcq, 1)[0].wr_id, 501);
    let mut c = OpsChain::new();
    c.push(OpsWr::del(3, live).signaled(), &[]);
    c.push(OpsWr::del(4, eaten).signaled(), &[]);
    s.srq.post_ops(&mut c).unwrap();
    let wcs = poll_n(&mut s.b.rcq, 2);
    assert_eq!((wcs[0].wr_id, wcs[0].opcode, wcs[0].status), (3, WcOpcode::TmDel, WcStatus::Success));
    assert_eq!((wcs[1].wr_id, wcs[1].opcode, wcs[1].status), (4, WcOpcode::TmDel, WcStatus::TmErr));
    // The deleted tag no longer matches: a message for it is unexpected.
    s.plain(600, 8192);
    s.send_tagged(10, 0x1, 0, b"y");
    assert_eq!(poll_n(&mut s.b.rcq, 1)[0].opcode, WcOpcode::Recv);
}

/// ibv_post_srq_ops(3): "Size of tag matching list is limited by max_num_tags" (ENOMEM and
/// bad_wr at the first add that does not fit) and the list operations of one call by max_ops.
pub fn tm_list_full_and_ops_limit<H: Harness>(t: &str) {
    let mut s = tm_setup::<H>(t, 2, 3);
    let mut c = OpsChain::new();
    for i in 0..3u64 {
        c.push(OpsWr::add(i, 100 + i, i, u64::MAX), &[s.b.sge(4096 + 512 * i as usize, 256)]);
    }
    let e = s.srq.post_ops(&mut c).unwrap_err();
    assert_eq!((e.errno, e.bad_wr), (Errno::ENOMEM, 2));
    // The two that fit were added: their tags match.
    s.send_tagged(9, 1, 0, b"one");
    assert_eq!(poll_n(&mut s.b.rcq, 1)[0].wr_id, 101);
    let mut c = OpsChain::new();
    for i in 0..4u64 {
        c.push(OpsWr::sync(i, 0), &[]);
    }
    let e = s.srq.post_ops(&mut c).unwrap_err();
    assert_eq!((e.errno, e.bad_wr), (Errno::ENOMEM, 3), "max_ops = 3");
}

/// ibv_post_srq_ops(3): the handle of a TAG_DEL must be one TAG_ADD returned (EINVAL
/// otherwise); ops on a plain SRQ are EINVAL.
pub fn tm_bad_handle_and_plain_srq<H: Harness>(t: &str) {
    let mut s = tm_setup::<H>(t, 2, 4);
    let mut c = OpsChain::new();
    c.push(OpsWr::del(1, 0xffff), &[]);
    assert_eq!(s.srq.post_ops(&mut c).unwrap_err().errno, Errno::EINVAL);
    let mut plain = s.b.pd.create_srq(&SrqAttr { max_wr: 4, max_sge: 1, srq_limit: 0 }).unwrap();
    let mut c = OpsChain::new();
    c.push(OpsWr::sync(1, 0), &[]);
    assert!(plain.post_ops(&mut c).is_err());
}

/// A matched tagged buffer that cannot take the message fails as a plain receive request
/// does (ibv_poll_cq(3), docs/shm-provider.md): too small, the receiver gets LOC_LEN_ERR and
/// the RC requester REM_INV_REQ_ERR; its MR deregistered after TAG_ADD, LOC_PROT_ERR and
/// REM_OP_ERR. Both QPs go to ERROR. (The requester used to see success, both QPs in RTS.)
pub fn tm_matched_buffer_error_fails_the_sender<H: Harness>(t: &str) {
    let mut s = tm_setup::<H>(t, 4, 8);
    s.add(1, 500, 0x7, u64::MAX, 4096);
    let mut msg = Tmh::eager(0x7, 0).to_bytes().to_vec();
    msg.extend_from_slice(&pattern(3, 300));
    s.a.write(0, &msg);
    send(&mut s.qa, &s.a, 9, 0, msg.len() as u32);
    let w = poll_one(&mut s.a.scq);
    let r = poll_one(&mut s.b.rcq);
    assert_eq!((r.wr_id, r.opcode, r.status), (500, WcOpcode::TmRecv, WcStatus::LocLenErr));
    assert_eq!((w.wr_id, w.status), (9, WcStatus::RemInvReqErr), "a 300-byte payload into 256 bytes");
    assert_eq!((s.qa.state(), s.qb.state()), (QpState::Error, QpState::Error));

    let mut s = tm_setup::<H>(&format!("{t}-dereg"), 4, 8);
    let mr2 = s.b.pd.reg_mr(&s.b.region, 4096, 4096, AccessFlags::LOCAL_WRITE).unwrap();
    let mut c = OpsChain::new();
    c.push(OpsWr::add(1, 501, 0x8, u64::MAX).signaled(), &[Sge::new(mr2.addr(), 256, mr2.lkey())]);
    s.srq.post_ops(&mut c).expect("TAG_ADD");
    assert!(poll_one(&mut s.b.rcq).is_ok());
    drop(mr2);
    let mut msg = Tmh::eager(0x8, 0).to_bytes().to_vec();
    msg.extend_from_slice(&[0xab; 16]);
    s.a.write(0, &msg);
    send(&mut s.qa, &s.a, 10, 0, msg.len() as u32);
    let w = poll_one(&mut s.a.scq);
    let r = poll_one(&mut s.b.rcq);
    assert_eq!((r.wr_id, r.opcode, r.status), (501, WcOpcode::TmRecv, WcStatus::LocProtErr));
    assert_eq!((w.wr_id, w.status), (10, WcStatus::RemOpErr));
    assert_eq!((s.qa.state(), s.qb.state()), (QpState::Error, QpState::Error));
    assert_eq!(s.b.read(4096, 16), [0u8; 16], "nothing written through a deregistered MR");
}

/// Tag matching consumes the oldest matching entry first.
pub fn tm_oldest_entry_matches_first<H: Harness>(t: &str) {
    let mut s = tm_setup::<H>(t, 4, 8);
    s.add(1, 500, 0x10, 0xf0, 4096);
    s.add(2, 501, 0x10, 0xf0, 4096 + 512);
    s.send_tagged(9, 0x15, 0, b"a");
    s.send_tagged(10, 0x16, 0, b"b");
    let wcs = poll_n(&mut s.b.rcq, 2);
    assert_eq!((wcs[0].wr_id, wcs[1].wr_id), (500, 501));
    assert_eq!((s.b.read(4096, 1), s.b.read(4096 + 512, 1)), (b"a".to_vec(), b"b".to_vec()));
}

/// RNR retries are the responder's NIC's business, not the requester's application's: a SEND
/// that found no receive is delivered once one is posted, even if the sender never polls its
/// send CQ (a pingpong waits on its receive CQ only).
pub fn rnr_retry_progresses_without_polling_the_send_cq<H: Harness>(t: &str) {
    let mut p = rc_pair::<H>(t);
    p.a.write(0, b"late");
    send(&mut p.qa, &p.a, 1, 0, 4);
    assert_no_completion(&mut p.b.rcq);
    recv(&mut p.qb, &p.b, 2, 256, 64);
    let wc = poll_n(&mut p.b.rcq, 1)[0];
    assert_eq!((wc.status, wc.wr_id, wc.byte_len), (WcStatus::Success, 2, 4));
    assert_eq!(p.b.read(256, 4), b"late");
}

/// Tag matching only where the device reports TM caps (docs/conformance.md, tag matching): elsewhere creating a
/// tag-matching SRQ fails with EOPNOTSUPP and a sentence naming tag matching.
pub fn tm_refused_without_tm_caps<H: Harness>(t: &str) {
    let b = Node::<H>::open(t, 0);
    let r = b.pd.create_srq_tm(
        &SrqAttr { max_wr: 8, max_sge: 1, srq_limit: 0 },
        &TmCaps { max_num_tags: 4, max_ops: 4 },
        &b.rcq,
    );
    if b.ctx.caps().max_num_tags == 0 {
        let e = r.err().expect("a device without TM caps refuses a tag-matching SRQ");
        assert_eq!(e.errno, Errno::EOPNOTSUPP);
        assert!(e.msg.contains("tag matching"), "{e}");
    } else {
        assert!(r.is_ok(), "a device with TM caps creates a tag-matching SRQ");
    }
}

/// ibv_post_send(3) table, UC column: RDMA_WRITE and RDMA_WRITE_WITH_IMM are allowed on UC and
/// work: the data lands at the remote address; the immediate consumes a receive there
/// (IBV_WC_RECV_RDMA_WITH_IMM).
pub fn uc_rdma_write_and_write_with_imm<H: Harness>(t: &str) {
    let mut p = pair::<H>(t, QpType::Uc, QpCaps::default(), ConnOpts::default());
    let rkey = p.b.mr.rkey();
    let data = pattern(21, 48);
    p.a.write(0, &data);
    p.qa.post_send(&SendChain::one(SendWr::write(1, p.b.addr(RX + 512), rkey).signaled(), &[p.a.sge(0, 48)])).unwrap();
    let s = poll_one(&mut p.a.scq);
    assert_eq!((s.wr_id, s.status, s.opcode), (1, WcStatus::Success, WcOpcode::RdmaWrite));
    assert_eq!(p.b.read(RX + 512, 48), data);
    recv(&mut p.qb, &p.b, 7, RX, 64);
    let wr = SendWr::write_with_imm(2, p.b.addr(RX + 1024), rkey, 0x1234).signaled();
    p.qa.post_send(&SendChain::one(wr, &[p.a.sge(0, 48)])).unwrap();
    assert!(poll_one(&mut p.a.scq).is_ok());
    let r = poll_one(&mut p.b.rcq);
    assert_eq!((r.wr_id, r.status, r.opcode, r.imm_data), (7, WcStatus::Success, WcOpcode::RecvRdmaWithImm, 0x1234));
    assert!(r.wc_flags.contains(WcFlags::WITH_IMM));
    assert_eq!(p.b.read(RX + 1024, 48), data);
}

/// ibv_post_send(3) "IBV_SEND_FENCE Set the fence indicator": a fenced WR starts only after
/// the prior RDMA READ completed, so a WRITE of the buffer the READ fills carries the read data.
pub fn fence_orders_after_prior_read<H: Harness>(t: &str) {
    let mut p = rc_pair::<H>(t);
    let rkey = p.b.mr.rkey();
    let remote = pattern(33, 32);
    p.b.write(RX + 2048, &remote);
    p.a.write(512, &[0u8; 32]);
    let mut c = SendChain::new();
    c.push(SendWr::read(1, p.b.addr(RX + 2048), rkey), &[p.a.sge(512, 32)]);
    c.push(SendWr::write(2, p.b.addr(RX + 4096), rkey).flags(SendFlags::FENCE).signaled(), &[p.a.sge(512, 32)]);
    p.qa.post_send(&c).unwrap();
    let s = poll_one(&mut p.a.scq);
    assert_eq!((s.wr_id, s.status), (2, WcStatus::Success));
    assert_eq!(p.b.read(RX + 4096, 32), remote, "the fenced WRITE sent what the READ fetched");
}

/// A multicast GID (ff0e::1:1) and a unicast one (fe80::1) for the multicast cases.
const MGID: [u8; 16] = [0xff, 0x0e, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1];
const UNICAST_GID: [u8; 16] = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];

/// ibv_attach_mcast(3): "Only QPs of Transport Service Type IBV_QPT_UD may be attached to
/// multicast groups" — an RC or UC QP gets EINVAL, as the kernel's ib_attach_mcast returns,
/// for attach and detach; so does a UD QP given a GID outside ff00::/8.
pub fn mcast_attach_non_ud_or_unicast_gid_einval<H: Harness>(t: &str) {
    let a = Node::<H>::open(t, 0);
    for qt in [QpType::Rc, QpType::Uc] {
        let mut q = a.qp(qt, QpCaps::default(), None, false);
        assert_eq!(q.attach_mcast(&MGID, 0xc001).unwrap_err().errno, Errno::EINVAL, "attach on {qt:?}");
        assert_eq!(q.detach_mcast(&MGID, 0xc001).unwrap_err().errno, Errno::EINVAL, "detach on {qt:?}");
    }
    let mut ud = a.qp(QpType::Ud, QpCaps::default(), None, false);
    assert_eq!(ud.attach_mcast(&UNICAST_GID, 0xc001).unwrap_err().errno, Errno::EINVAL);
    assert_eq!(ud.detach_mcast(&UNICAST_GID, 0xc001).unwrap_err().errno, Errno::EINVAL);
}

/// ibv_attach_mcast(3): a UD QP attaches in any state (here RESET and RTS); "If a QP is
/// attached to the same multicast group multiple times" it is not an error; detaching a
/// group the QP is not in is EINVAL (rxe and the kernel core).
pub fn mcast_attach_any_state_twice_then_detach<H: Harness>(t: &str) {
    let a = Node::<H>::open(t, 0);
    let mut q = a.qp(QpType::Ud, QpCaps::default(), None, false);
    q.attach_mcast(&MGID, 0xc001).expect("attach in RESET");
    q.attach_mcast(&MGID, 0xc001).expect("attach the same group again");
    ud_ready(&mut q, QKEY);
    q.detach_mcast(&MGID, 0xc001).expect("detach in RTS");
    assert_eq!(q.detach_mcast(&MGID, 0xc001).unwrap_err().errno, Errno::EINVAL, "detach of a group not attached");
}

/// A UD QP at RTS attached to the harness's multicast group, with one receive of `len` bytes posted at `off`.
fn mcast_member<H: Harness>(node: &Node<H>, off: usize, len: u32) -> QpOf<H> {
    let mut q = node.qp(QpType::Ud, QpCaps::default(), None, false);
    ud_ready(&mut q, QKEY);
    q.attach_mcast(&H::mcast_gid(), 0xc001).expect("attach_mcast");
    recv::<H>(&mut q, node, off as u64, off, len);
    q
}

/// An address handle on `from` naming the harness's multicast group (global: a multicast GID needs a GRH).
fn mcast_ah<H: Harness>(from: &Node<H>) -> AhOf<H> {
    from.pd
        .create_ah(&AhAttr {
            dlid: 0xc001,
            is_global: true,
            dgid: H::mcast_gid(),
            port_num: 1,
            hop_limit: 64,
            ..Default::default()
        })
        .expect("create_ah for a multicast GID")
}

/// ibv_attach_mcast(3): after attaching, "the QP will receive messages sent to the multicast
/// group". One UD send to the group (remote QPN 0xFFFFFF, the IB multicast QPN) reaches each
/// of two attached QPs — each consumes its own receive and finds a GRH whose source is the
/// sender's GID and whose destination is the group's — and not a QP of the same port that did
/// not attach. The sender completes once.
pub fn mcast_send_reaches_every_member<H: Harness>(t: &str) {
    let mut a = Node::<H>::open(t, 0);
    let mut b = Node::<H>::open(t, 1);
    let mut qa = a.qp(QpType::Ud, QpCaps::default(), None, false);
    ud_ready(&mut qa, QKEY);
    let m1 = mcast_member::<H>(&b, RX, 40 + 256);
    let m2 = mcast_member::<H>(&b, RX + 4096, 40 + 256);
    let mut outsider = b.qp(QpType::Ud, QpCaps::default(), None, false);
    ud_ready(&mut outsider, QKEY);
    recv::<H>(&mut outsider, &b, 3, RX + 8192, 40 + 256);
    let ah = mcast_ah::<H>(&a);
    let data = pattern(21, 200);
    a.write(0, &data);
    qa.post_send(&SendChain::one(ud_send_wr::<H>(&ah, 0xff_ffff, QKEY, 7), &[a.sge(0, 200)])).unwrap();
    assert_eq!(poll_one(&mut a.scq).status, WcStatus::Success);
    let mut got = poll_n(&mut b.rcq, 2);
    got.sort_by_key(|w| w.wr_id);
    let members = [(RX, m1.qp_num()), (RX + 4096, m2.qp_num())];
    for (w, (off, qpn)) in got.iter().zip(members) {
        assert_eq!((w.status, w.opcode, w.byte_len), (WcStatus::Success, WcOpcode::Recv, 240), "{w:?}");
        assert_eq!((w.wr_id, w.qp_num, w.src_qp), (off as u64, qpn, qa.qp_num()), "{w:?}");
        assert!(w.wc_flags.contains(WcFlags::GRH));
        assert_eq!(b.read(off + 40, 200), data, "payload at {off}");
        assert_eq!(b.read(off + 8, 16), a.ctx.gid(1, H::gid_index()).unwrap(), "GRH source GID");
        assert_eq!(b.read(off + 24, 16), H::mcast_gid(), "GRH destination GID is the group's");
    }
    assert_no_completion(&mut b.rcq);
}

/// ibv_detach_mcast(3): after detaching, the QP no longer receives the group's messages; the
/// members still attached do. A QP that is destroyed leaves its groups too.
pub fn mcast_detach_stops_delivery<H: Harness>(t: &str) {
    let mut a = Node::<H>::open(t, 0);
    let mut b = Node::<H>::open(t, 1);
    let mut qa = a.qp(QpType::Ud, QpCaps::default(), None, false);
    ud_ready(&mut qa, QKEY);
    let mut leaver = mcast_member::<H>(&b, RX, 40 + 64);
    let stayer = mcast_member::<H>(&b, RX + 4096, 40 + 64);
    let gone = mcast_member::<H>(&b, RX + 8192, 40 + 64);
    leaver.detach_mcast(&H::mcast_gid(), 0xc001).expect("detach_mcast");
    drop(gone);
    let ah = mcast_ah::<H>(&a);
    qa.post_send(&SendChain::one(ud_send_wr::<H>(&ah, 0xff_ffff, QKEY, 1), &[a.sge(0, 64)])).unwrap();
    assert_eq!(poll_one(&mut a.scq).status, WcStatus::Success);
    let w = poll_one(&mut b.rcq);
    assert_eq!((w.status, w.qp_num, w.wr_id), (WcStatus::Success, stayer.qp_num(), (RX + 4096) as u64));
    assert_no_completion(&mut b.rcq);
    // The leaver's receive is still posted: a unicast send to it lands there.
    let uah = ah_to::<H>(&a, &leaver.endpoint(H::gid_index()).unwrap(), true).expect("create_ah");
    qa.post_send(&SendChain::one(ud_send_wr::<H>(&uah, leaver.qp_num(), QKEY, 2), &[a.sge(0, 64)])).unwrap();
    assert_eq!(poll_one(&mut a.scq).status, WcStatus::Success);
    let w = poll_one(&mut b.rcq);
    assert_eq!((w.qp_num, w.wr_id), (leaver.qp_num(), RX as u64));
}

/// An Ethernet frame to `dst`: IPv4 + UDP to `port` when `ether_type` is 0x0800 (checksums
/// left 0), else `ether_type` and 46 bytes of payload. Its bytes differ with `tag`.
fn frame(dst: [u8; 6], ether_type: u16, proto: u8, port: u16, tag: u8) -> Vec<u8> {
    let mut f = dst.to_vec();
    f.extend_from_slice(&[0x02, 0, 0, 0, 0, 0x0a]);
    f.extend_from_slice(&ether_type.to_be_bytes());
    if ether_type == 0x0800 {
        let l4_len: u16 = if proto == 6 { 20 + 10 } else { 8 + 10 };
        let total = 20 + l4_len;
        f.extend_from_slice(&[0x45, 0, (total >> 8) as u8, total as u8, 0, 1, 0, 0, 64, proto, 0, 0]);
        f.extend_from_slice(&[10, 0, 0, 1, 10, 0, 0, 2]);
        f.extend_from_slice(&[0x30, 0x39, (port >> 8) as u8, port as u8]);
        if proto == 6 {
            f.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 0, 0x50, 0x18, 0xff, 0xff, 0, 0, 0, 0]);
        } else {
            f.extend_from_slice(&[(l4_len >> 8) as u8, l4_len as u8, 0, 0]);
        }
        f.extend((0..10).map(|i| tag.wrapping_add(i)));
    } else {
        f.extend((0..46).map(|i| tag.wrapping_add(i)));
    }
    f
}

const MAC1: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
const MAC2: [u8; 6] = [0x02, 0, 0, 0, 0, 0x02];
const BCAST: [u8; 6] = [0xff; 6];

/// A RAW_PACKET QP at RTS (no remote: frames carry their addresses).
fn raw_qp<H: Harness>(node: &Node<H>) -> QpOf<H> {
    let cap = QpCaps { max_send_sge: 2, max_recv_sge: 1, ..Default::default() };
    let mut q = node.qp(QpType::RawPacket, cap, None, false);
    ud_ready(&mut q, 0);
    q
}

/// Sends `f` (written at `off` of `node`'s buffer) on `q` with `flags`, signaled; checks the
/// sender's completion.
fn send_frame<H: Harness>(q: &mut QpOf<H>, node: &mut Node<H>, off: usize, f: &[u8], flags: SendFlags) {
    node.write(off, f);
    let wr = SendWr::send(off as u64).flags(flags).signaled();
    q.post_send(&SendChain::one(wr, &[node.sge(off, f.len() as u32)])).expect("post_send of a frame");
    let s = poll_one(&mut node.scq);
    assert_eq!((s.wr_id, s.status), (off as u64, WcStatus::Success));
}

/// ibv_post_send(3), RAW_PACKET column: SEND only (TSO aside); every other opcode is refused
/// at post with EINVAL and `bad_wr` at it, the SEND before it in the chain goes out.
pub fn raw_packet_opcode_column<H: Harness>(t: &str) {
    let mut a = Node::<H>::open(t, 0);
    let mut b = Node::<H>::open(t, 1);
    let mut qa = raw_qp::<H>(&a);
    let mut qb = raw_qp::<H>(&b);
    qb.create_flow(&FlowSpec { dst_mac: Some(MAC1), ..Default::default() }).expect("create_flow");
    let f = frame(MAC1, 0x88b5, 0, 0, 1);
    a.write(0, &f);
    let mut n = 0u64;
    for op in WrOpcode::ALL {
        if op == WrOpcode::Tso || seed_table_allows(op, QpType::RawPacket) {
            continue;
        }
        qb.post_recv(&RecvChain::one(n, &[b.sge(RX + n as usize * 128, 128)])).unwrap();
        let mut c = SendChain::new();
        c.push(SendWr::send(n).signaled(), &[a.sge(0, f.len() as u32)]);
        c.push(wr_for::<H>(op, 1000 + n, (b.addr(RX), b.mr.rkey()), None), &[a.sge(256, 8)]);
        let e = qa.post_send(&c).expect_err(op.name());
        assert_eq!((e.errno, e.bad_wr), (Errno::EINVAL, 1), "{} on RAW_PACKET: {e}", op.name());
        assert_eq!(poll_one(&mut a.scq).wr_id, n, "{}: the SEND before it went out", op.name());
        let r = poll_one(&mut b.rcq);
        assert_eq!((r.wr_id, r.status, r.byte_len), (n, WcStatus::Success, f.len() as u32), "{}", op.name());
        n += 1;
    }
    assert_no_completion(&mut b.rcq);
}

/// ibv_create_flow(3) steering and the RAW_PACKET receive rules: a frame lands whole at offset 0
/// of the receive buffer (no GRH), `byte_len` is its length, and it goes to the QP whose rule
/// matches its destination MAC, not to the other; a frame no rule matches goes nowhere.
pub fn raw_packet_frames_land_at_offset_0_steered_by_mac<H: Harness>(t: &str) {
    let mut a = Node::<H>::open(t, 0);
    let mut b = Node::<H>::open(t, 1);
    let mut qa = raw_qp::<H>(&a);
    let (mut q1, mut q2) = (raw_qp::<H>(&b), raw_qp::<H>(&b));
    q1.create_flow(&FlowSpec { dst_mac: Some(MAC1), ..Default::default() }).unwrap();
    q2.create_flow(&FlowSpec { dst_mac: Some(MAC2), ..Default::default() }).unwrap();
    b.region.fill(RX, 8192, 0xcc);
    recv::<H>(&mut q1, &b, 1, RX, 2048);
    recv::<H>(&mut q2, &b, 2, RX + 4096, 2048);
    let f1 = frame(MAC1, 0x0800, 17, 7, 10);
    send_frame(&mut qa, &mut a, 0, &f1, SendFlags::empty());
    let r = poll_one(&mut b.rcq);
    assert_eq!((r.wr_id, r.qp_num, r.status, r.opcode), (1, q1.qp_num(), WcStatus::Success, WcOpcode::Recv));
    assert_eq!(r.byte_len, f1.len() as u32);
    assert!(!r.wc_flags.contains(WcFlags::GRH), "no GRH on RAW_PACKET");
    assert_eq!(b.read(RX, f1.len()), f1, "the frame at offset 0, unchanged");
    assert_eq!(b.read(RX + f1.len(), 8), [0xcc; 8], "nothing written past it");
    // No rule for this MAC: dropped, the sender still completes.
    send_frame(&mut qa, &mut a, 512, &frame([0x02, 9, 9, 9, 9, 9], 0x0800, 17, 7, 11), SendFlags::empty());
    assert_no_completion(&mut b.rcq);
    let f2 = frame(MAC2, 0x86dd, 0, 0, 12);
    send_frame(&mut qa, &mut a, 1024, &f2, SendFlags::empty());
    let r = poll_one(&mut b.rcq);
    assert_eq!((r.wr_id, r.qp_num, r.byte_len), (2, q2.qp_num(), f2.len() as u32));
    assert_eq!(b.read(RX + 4096, f2.len()), f2);
}

/// Steering on EtherType, IP protocol and destination port, and rule priority: the lower
/// `priority` wins a frame both rules match; destroying the rule hands its frames to the
/// other; a stale rule id is EINVAL; a frame of another EtherType matches neither.
pub fn raw_packet_steering_fields_and_priority<H: Harness>(t: &str) {
    let mut a = Node::<H>::open(t, 0);
    let mut b = Node::<H>::open(t, 1);
    let mut qa = raw_qp::<H>(&a);
    let (mut q1, mut q2) = (raw_qp::<H>(&b), raw_qp::<H>(&b));
    let udp5000 = FlowSpec {
        ether_type: Some(0x0800),
        ip_proto: Some(17),
        dst_port: Some(5000),
        priority: 1,
        ..Default::default()
    };
    let id = q1.create_flow(&udp5000).unwrap();
    q2.create_flow(&FlowSpec { ether_type: Some(0x0800), priority: 2, ..Default::default() }).unwrap();
    for i in 0..4 {
        recv::<H>(&mut q1, &b, 10 + i, RX + i as usize * 512, 512);
        recv::<H>(&mut q2, &b, 20 + i, RX + 4096 + i as usize * 512, 512);
    }
    let to = |f: Vec<u8>, a: &mut Node<H>, b: &mut Node<H>, qa: &mut QpOf<H>| -> Option<u32> {
        send_frame(qa, a, 0, &f, SendFlags::empty());
        let mut wc = [WorkCompletion::default(); 4];
        let deadline = std::time::Instant::now() + std::time::Duration::from_millis(200);
        while std::time::Instant::now() < deadline {
            let n = b.rcq.poll(&mut wc).unwrap();
            if n > 0 {
                assert_eq!(n, 1, "one copy of a unicast frame");
                return Some(wc[0].qp_num);
            }
        }
        None
    };
    assert_eq!(
        to(frame(MAC1, 0x0800, 17, 5000, 1), &mut a, &mut b, &mut qa),
        Some(q1.qp_num()),
        "both match: priority 1 wins"
    );
    assert_eq!(to(frame(MAC1, 0x0800, 17, 6000, 2), &mut a, &mut b, &mut qa), Some(q2.qp_num()), "other port");
    assert_eq!(to(frame(MAC1, 0x0800, 6, 5000, 3), &mut a, &mut b, &mut qa), Some(q2.qp_num()), "TCP, not UDP");
    assert_eq!(to(frame(MAC1, 0x0806, 0, 0, 4), &mut a, &mut b, &mut qa), None, "ARP matches no rule");
    q1.destroy_flow(id).unwrap();
    assert_eq!(q1.destroy_flow(id).unwrap_err().errno, Errno::EINVAL, "a destroyed rule");
    assert_eq!(to(frame(MAC1, 0x0800, 17, 5000, 5), &mut a, &mut b, &mut qa), Some(q2.qp_num()), "q1's rule is gone");
    // Priority, not age: a newer rule with a lower priority takes the frames of an older one.
    q1.create_flow(&FlowSpec { ether_type: Some(0x0800), priority: 0, ..Default::default() }).unwrap();
    assert_eq!(
        to(frame(MAC1, 0x0800, 17, 7000, 6), &mut a, &mut b, &mut qa),
        Some(q1.qp_num()),
        "a newer rule of priority 0 wins over the older one of priority 2"
    );
}

/// A frame to the broadcast (or a multicast) MAC reaches every QP with a matching rule, each
/// once, but not the QP that sent it.
pub fn raw_packet_broadcast_reaches_every_matching_qp<H: Harness>(t: &str) {
    let mut a = Node::<H>::open(t, 0);
    let mut b = Node::<H>::open(t, 1);
    let mut qa = raw_qp::<H>(&a);
    qa.create_flow(&FlowSpec::default()).unwrap();
    recv::<H>(&mut qa, &a, 99, RX, 512);
    let (mut q1, mut q2) = (raw_qp::<H>(&b), raw_qp::<H>(&b));
    q1.create_flow(&FlowSpec { dst_mac: Some(BCAST), ..Default::default() }).unwrap();
    q1.create_flow(&FlowSpec { ether_type: Some(0x0800), ..Default::default() }).unwrap();
    q2.create_flow(&FlowSpec::default()).unwrap();
    recv::<H>(&mut q1, &b, 1, RX, 512);
    recv::<H>(&mut q1, &b, 2, RX + 512, 512);
    recv::<H>(&mut q2, &b, 3, RX + 1024, 512);
    send_frame(&mut qa, &mut a, 0, &frame(BCAST, 0x0800, 17, 1, 7), SendFlags::empty());
    let mut got: Vec<u32> = poll_n(&mut b.rcq, 2).iter().map(|w| w.qp_num).collect();
    got.sort();
    let mut want = vec![q1.qp_num(), q2.qp_num()];
    want.sort();
    assert_eq!(got, want, "one copy per QP, though q1 has two matching rules");
    assert_no_completion(&mut b.rcq);
    assert_no_completion(&mut a.rcq);
}

/// ibv_post_send(3), IBV_SEND_IP_CSUM: "Offload the IPv4 and TCP/UDP checksum calculation" —
/// the frames arrive with a valid IPv4 header checksum and a valid UDP or TCP checksum (the
/// sender left them 0); the flag is EINVAL on a QP that is not RAW_PACKET.
pub fn raw_packet_ip_csum<H: Harness>(t: &str) {
    use dataplane::net::checksum;
    let mut a = Node::<H>::open(t, 0);
    let mut b = Node::<H>::open(t, 1);
    let mut qa = raw_qp::<H>(&a);
    let mut qb = raw_qp::<H>(&b);
    qb.create_flow(&FlowSpec { dst_mac: Some(MAC1), ..Default::default() }).unwrap();
    for (i, proto) in [17u8, 6].into_iter().enumerate() {
        let f = frame(MAC1, 0x0800, proto, 53, i as u8);
        let off = RX + i * 512;
        recv::<H>(&mut qb, &b, i as u64, off, 512);
        send_frame(&mut qa, &mut a, 0, &f, SendFlags::IP_CSUM);
        let r = poll_one(&mut b.rcq);
        assert_eq!(r.byte_len, f.len() as u32);
        let got = b.read(off, f.len());
        assert_eq!(checksum::finish(checksum::accumulate(0, &got[14..34])), 0, "IPv4 header checksum");
        assert_ne!(got[24..26], [0, 0]);
        assert_eq!(checksum::l4_ipv4([10, 0, 0, 1], [10, 0, 0, 2], proto, &got[34..]), 0, "L4 checksum ({proto})");
        assert_eq!(a.read(0, f.len()), f, "the sender's buffer is not written");
    }
    // The UD half, where the provider has UD QPs (`xdp` has RAW_PACKET QPs only).
    let mut ud = match a.try_qp(QpType::Ud, QpCaps::default(), None, false) {
        Ok(q) => q,
        Err(e) if e.errno == Errno::EOPNOTSUPP => return,
        Err(e) => panic!("create_qp(UD): {e}"),
    };
    ud_ready(&mut ud, QKEY);
    let ah = ah_to::<H>(&a, &qb.endpoint(H::gid_index()).unwrap_or(Endpoint::default()), true);
    if let Ok(ah) = ah {
        let wr = ud_send_wr::<H>(&ah, 1, QKEY, 1).flags(SendFlags::IP_CSUM | SendFlags::SIGNALED);
        expect_post_err(ud.post_send(&SendChain::one(wr, &[a.sge(0, 8)])), Errno::EINVAL, 0);
    }
}

/// Ethernet + IPv4 + TCP header template for TSO: 10.0.0.1:12345 -> 10.0.0.2:80, IPv4 id
/// 0x1000, sequence 1000, flags CWR|PSH|ACK|FIN, a 12-byte option block (NOP NOP timestamp).
fn tso_template(dst: [u8; 6]) -> Vec<u8> {
    let mut h = dst.to_vec();
    h.extend_from_slice(&[0x02, 0, 0, 0, 0, 0x0a, 0x08, 0x00]);
    h.extend_from_slice(&[0x45, 0, 0, 0, 0x10, 0x00, 0x40, 0, 64, 6, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2]);
    h.extend_from_slice(&[0x30, 0x39, 0x00, 0x50, 0, 0, 0x03, 0xe8, 0, 0, 0, 1, 0x80, 0x99, 0xff, 0xff, 0, 0, 0, 0]);
    h.extend_from_slice(&[1, 1, 8, 10, 0, 0, 0, 1, 0, 0, 0, 2]);
    h
}

/// The frames a 64 KiB TSO request arrives as on `qb`'s receives, in order: posts them,
/// sends `payload` (at offset 128 KiB of `a`'s buffer) as one IBV_WR_TSO with MSS `mss`,
/// checks the sender's one completion (opcode TSO) and returns each frame's bytes.
pub fn tso_frames<H: Harness>(t: &str, payload: &[u8], mss: u16) -> Vec<Vec<u8>> {
    let mut a = Node::<H>::open(t, 0);
    let mut b = Node::<H>::open(t, 1);
    let cap = QpCaps { max_send_sge: 2, max_recv_sge: 1, max_recv_wr: 128, ..Default::default() };
    let mut qa = a.qp(QpType::RawPacket, cap, None, false);
    ud_ready(&mut qa, 0);
    let mut qb = b.qp(QpType::RawPacket, cap, None, false);
    ud_ready(&mut qb, 0);
    qb.create_flow(&FlowSpec { dst_mac: Some(MAC1), ..Default::default() }).unwrap();
    let n = payload.len().div_ceil(mss as usize).max(1);
    for i in 0..n + 1 {
        recv::<H>(&mut qb, &b, i as u64, RX + i * 2048, 2048);
    }
    const PAY: usize = 128 << 10;
    a.write(PAY, payload);
    // Two SGEs, cut off an MSS boundary, so frames gather across them.
    let cut = payload.len() / 3;
    let sges = [a.sge(PAY, cut as u32), a.sge(PAY + cut, (payload.len() - cut) as u32)];
    let mut c = SendChain::new();
    c.push_tso(SendWr::tso(7, mss).signaled(), &tso_template(MAC1), &sges);
    qa.post_send(&c).expect("post_send of a TSO request");
    let s = poll_one(&mut a.scq);
    assert_eq!((s.wr_id, s.status, s.opcode), (7, WcStatus::Success, WcOpcode::Tso));
    assert_no_completion(&mut a.scq);
    let got = poll_n(&mut b.rcq, n);
    assert_no_completion(&mut b.rcq);
    got.iter()
        .enumerate()
        .map(|(i, w)| {
            assert_eq!(
                (w.wr_id, w.status, w.opcode),
                (i as u64, WcStatus::Success, WcOpcode::Recv),
                "frame {i} in order"
            );
            b.read(RX + i * 2048, w.byte_len as usize)
        })
        .collect()
}

/// ibv_post_send(3), IBV_WR_TSO on RAW_PACKET: a 64 KiB TCP payload posted as one request
/// arrives as 46 frames of MSS 1448 (the last 376 bytes), each a valid frame a receiver
/// accepts: IPv4 total length and header checksum, id +1 per frame, TCP sequence advancing
/// by the bytes before it, FIN/PSH on the last frame only, CWR on the first only, TCP
/// checksum over the pseudo-header; the payloads rebuild the request's.
pub fn raw_packet_tso_64k_arrives_as_mss_frames<H: Harness>(t: &str) {
    use dataplane::net::checksum;
    let payload: Vec<u8> = (0..65536u32).map(|i| (i ^ (i >> 8)) as u8).collect();
    let frames = tso_frames::<H>(t, &payload, 1448);
    assert_eq!(frames.len(), 46);
    let hdr = tso_template(MAC1);
    let mut joined = Vec::new();
    for (k, f) in frames.iter().enumerate() {
        let last = k == 45;
        let len = if last { 65536 - 45 * 1448 } else { 1448 };
        assert_eq!(f.len(), hdr.len() + len, "frame {k} length");
        assert_eq!(f[..12], hdr[..12], "MACs");
        assert_eq!(u16::from_be_bytes([f[16], f[17]]) as usize, f.len() - 14, "IPv4 total length of frame {k}");
        assert_eq!(u16::from_be_bytes([f[18], f[19]]), 0x1000 + k as u16, "IPv4 id of frame {k}");
        assert_eq!(checksum::finish(checksum::accumulate(0, &f[14..34])), 0, "IPv4 header checksum of frame {k}");
        assert_eq!(checksum::l4_ipv4([10, 0, 0, 1], [10, 0, 0, 2], 6, &f[34..]), 0, "TCP checksum of frame {k}");
        let seq = u32::from_be_bytes(f[38..42].try_into().unwrap());
        assert_eq!(seq, 1000 + (k * 1448) as u32, "TCP sequence of frame {k}");
        let flags = f[47];
        assert_eq!(flags & 0x09, if last { 0x09 } else { 0 }, "FIN|PSH of frame {k}");
        assert_eq!(flags & 0x80, if k == 0 { 0x80 } else { 0 }, "CWR of frame {k}");
        assert_eq!(flags & 0x10, 0x10, "ACK of frame {k}");
        assert_eq!(f[54..66], hdr[54..66], "TCP options copied");
        joined.extend_from_slice(&f[hdr.len()..]);
    }
    assert!(joined == payload, "the frames' payloads rebuild the 64 KiB");
}

/// IBV_WR_TSO is refused at post, `bad_wr` at it and nothing sent: on RC (not in the seed
/// table's RC column: EINVAL), without a header template, with one that is not TCP, with an
/// MSS of 0, or a header + MSS over the port MTU (EINVAL); on UD the shm provider says
/// EOPNOTSUPP (its choice, stated in docs/conformance.md).
pub fn raw_packet_tso_refusals<H: Harness>(t: &str) {
    let mut a = Node::<H>::open(t, 0);
    let mut qa = raw_qp::<H>(&a);
    let hdr = tso_template(MAC1);
    let sge = [a.sge(0, 4000)];
    let post = |q: &mut QpOf<H>, wr: SendWr, hdr: Option<&[u8]>| {
        let mut c = SendChain::new();
        match hdr {
            Some(h) => c.push_tso(wr, h, &sge),
            None => c.push(wr, &sge),
        };
        q.post_send(&c)
    };
    expect_post_err(post(&mut qa, SendWr::tso(1, 1448).signaled(), None), Errno::EINVAL, 0);
    let mut udp = hdr.clone();
    udp[23] = 17;
    expect_post_err(post(&mut qa, SendWr::tso(2, 1448).signaled(), Some(&udp)), Errno::EINVAL, 0);
    expect_post_err(post(&mut qa, SendWr::tso(3, 0).signaled(), Some(&hdr)), Errno::EINVAL, 0);
    expect_post_err(post(&mut qa, SendWr::tso(4, 9000).signaled(), Some(&hdr)), Errno::EINVAL, 0);
    assert_no_completion(&mut a.scq);
    // The RC and UD rows, where the provider has such QPs (`xdp` has RAW_PACKET QPs only).
    let mut rc = match a.try_qp(QpType::Rc, QpCaps::default(), None, false) {
        Ok(q) => q,
        Err(e) if e.errno == Errno::EOPNOTSUPP => return,
        Err(e) => panic!("create_qp(RC): {e}"),
    };
    rc.modify(&QpAttr { state: QpState::Init, ..Default::default() }).unwrap();
    expect_post_err(post(&mut rc, SendWr::tso(5, 1448), Some(&hdr)), Errno::EINVAL, 0);
    let mut ud = a.qp(QpType::Ud, QpCaps::default(), None, false);
    ud_ready(&mut ud, QKEY);
    let e = post(&mut ud, SendWr::tso(6, 1448), Some(&hdr)).expect_err("TSO on UD");
    assert_eq!(e.bad_wr, 0);
    assert!(matches!(e.errno, Errno::EOPNOTSUPP | Errno::EINVAL), "TSO on UD: {e}");
    assert_no_completion(&mut a.scq);
}

/// ibv_create_flow(3) on a QP that is not RAW_PACKET: EINVAL.
pub fn raw_packet_flow_on_other_qp_types_einval<H: Harness>(t: &str) {
    let a = Node::<H>::open(t, 0);
    for qt in [QpType::Rc, QpType::Uc, QpType::Ud] {
        let mut q = a.qp(qt, QpCaps::default(), None, false);
        assert_eq!(q.create_flow(&FlowSpec::default()).unwrap_err().errno, Errno::EINVAL, "{qt:?}");
    }
}

/// A frame larger than the receive buffer: the receiver's completion is LOC_LEN_ERR and, as on
/// UD (an unconnected QP), the QP stays usable: the next frame that fits arrives.
pub fn raw_packet_too_small_buffer_fails_that_receive_only<H: Harness>(t: &str) {
    let mut a = Node::<H>::open(t, 0);
    let mut b = Node::<H>::open(t, 1);
    let mut qa = raw_qp::<H>(&a);
    let mut qb = raw_qp::<H>(&b);
    qb.create_flow(&FlowSpec { dst_mac: Some(MAC1), ..Default::default() }).unwrap();
    recv::<H>(&mut qb, &b, 1, RX, 32);
    recv::<H>(&mut qb, &b, 2, RX + 4096, 512);
    let f = frame(MAC1, 0x0800, 17, 9, 3);
    send_frame(&mut qa, &mut a, 0, &f, SendFlags::empty());
    let r = poll_one(&mut b.rcq);
    assert_eq!((r.wr_id, r.status), (1, WcStatus::LocLenErr));
    send_frame(&mut qa, &mut a, 512, &f, SendFlags::empty());
    let r = poll_one(&mut b.rcq);
    assert_eq!((r.wr_id, r.status, r.byte_len), (2, WcStatus::Success, f.len() as u32));
    assert_eq!(qb.state(), QpState::Rts);
}

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
/// is not.
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
/// nothing is posted at all.
pub fn send_bad_first_wr_posts_nothing<H: Harness>(t: &str) {
    let mut p = rc_pair::<H>(t);
    recv(&mut p.qb, &p.b, 100, RX, 64);
    let mut c = SendChain::new();
    c.push(SendWr::send(1).signaled(), &[Sge::new(p.a.addr(0), 8, 0xdead_beef)]);
    c.push(SendWr::send(2).signaled(), &[p.a.sge(0, 8)]);
    expect_post_err(p.qa.post_send(&c), Errno::EINVAL, 0);
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

/// The seed's opcode table (UD, UC, RC columns), written out independently of the model.
fn seed_table_allows(op: WrOpcode, t: QpType) -> bool {
    use WrOpcode::*;
    let (ud, uc, rc) = match op {
        Send | SendWithImm => (true, true, true),
        RdmaWrite | RdmaWriteWithImm => (false, true, true),
        RdmaRead | AtomicCmpAndSwp | AtomicFetchAndAdd => (false, false, true),
        LocalInv | BindMw | SendWithInv => (false, true, true),
        Tso => (true, false, false),
    };
    match t {
        QpType::Ud => ud,
        QpType::Uc => uc,
        QpType::Rc => rc,
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

/// ibv_post_send(3) opcode table: LOCAL_INV, BIND_MW and SEND_WITH_INV are allowed on UC/RC
/// and TSO on UD, but the `shm` provider does not implement them yet (EOPNOTSUPP). Until it
/// does, this case only requires that posting them is refused at post time (never accepted
/// and silently mis-executed) and that the QP is unaffected.
pub fn send_unimplemented_opcodes_refused<H: Harness>(t: &str) {
    let mut p = rc_pair::<H>(t);
    for op in [WrOpcode::LocalInv, WrOpcode::BindMw, WrOpcode::SendWithInv] {
        let wr = wr_for::<H>(op, 9, (p.b.addr(RX), p.b.mr.rkey()), None).signaled();
        let r = p.qa.post_send(&SendChain::one(wr, &[p.a.sge(0, 8)]));
        if let Err(e) = r {
            assert_eq!(e.bad_wr, 0);
        } else {
            panic!("{} was accepted but is not implemented", op.name());
        }
    }
    let mut u = ud_pair::<H>(&format!("{t}-ud"));
    let qpn = u.qb.qp_num();
    let tso = wr_for::<H>(WrOpcode::Tso, 9, (u.b.addr(RX), u.b.mr.rkey()), Some((&u.ah, qpn)));
    assert!(u.qa.post_send(&SendChain::one(tso, &[u.a.sge(0, 8)])).is_err(), "TSO was accepted");
    assert_no_completion(&mut p.a.scq);
    assert_no_completion(&mut u.a.scq);
    assert_eq!(p.qa.state(), QpState::Rts);
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
/// completion, every 64-bit value included.
pub fn wr_id_round_trip<H: Harness>(t: &str) {
    let mut p = rc_pair::<H>(t);
    let ids = [0u64, u64::MAX, 0x0123_4567_89ab_cdef, 1 << 63, 0x8000_0000];
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
    to_rtr(&mut qb, &ea, &o);
    to_rts(&mut qb, &o);
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
/// crosses either end of its MR fails at post time with EINVAL.
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
        let r = p.qa.post_send(&SendChain::one(SendWr::send(i as u64).signaled(), &[sge]));
        expect_post_err(r, Errno::EINVAL, 0);
    }
    // Exactly the MR is fine.
    p.qa.post_send(&SendChain::one(SendWr::send(9).signaled(), &[Sge::new(sub.addr(), 4096, k)])).unwrap();
    assert_eq!(poll_one(&mut p.b.rcq).byte_len, 4096);
}

/// ibv_post_send(3): "lkey: Key of the local Memory Region" — of this QP's protection domain;
/// an lkey of another PD fails with EINVAL.
pub fn send_lkey_of_other_pd_einval<H: Harness>(t: &str) {
    let mut p = rc_pair::<H>(t);
    let pd2 = p.a.ctx.alloc_pd().unwrap();
    let other = pd2.reg_mr(&p.a.region, 0, 4096, AccessFlags::LOCAL_WRITE).unwrap();
    recv(&mut p.qb, &p.b, 1, RX, 64);
    let r = p.qa.post_send(&SendChain::one(SendWr::send(1).signaled(), &[Sge::new(other.addr(), 8, other.lkey())]));
    expect_post_err(r, Errno::EINVAL, 0);
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
/// delivering into them), it and those after are not — for an unknown lkey and for num_sge
/// above the QP's max_recv_sge.
pub fn recv_chain_stops_at_first_bad<H: Harness>(t: &str) {
    let mut p = rc_pair::<H>(t);
    let mut c = RecvChain::new();
    c.push(RecvWr::new(1), &[p.b.sge(RX, 64)]);
    c.push(RecvWr::new(2), &[Sge::new(p.b.addr(RX + 64), 64, p.b.mr.lkey() ^ 0x0055_5000)]);
    c.push(RecvWr::new(3), &[p.b.sge(RX + 128, 64)]);
    expect_post_err(p.qb.post_recv(&c), Errno::EINVAL, 1);
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
/// IBV_ACCESS_LOCAL_WRITE; without it the post fails with EINVAL.
pub fn recv_mr_without_local_write_einval<H: Harness>(t: &str) {
    let mut p = rc_pair::<H>(t);
    let ro = p.b.pd.reg_mr(&p.b.region, RX, 4096, AccessFlags::REMOTE_READ).unwrap();
    expect_post_err(p.qb.post_recv(&RecvChain::one(1, &[Sge::new(ro.addr(), 64, ro.lkey())])), Errno::EINVAL, 0);
    let b = &p.b;
    let srq = b.pd.create_srq(&SrqAttr { max_wr: 4, max_sge: 1, srq_limit: 0 }).unwrap();
    let mut srq = srq;
    expect_post_err(srq.post_recv(&RecvChain::one(1, &[Sge::new(ro.addr(), 64, ro.lkey())])), Errno::EINVAL, 0);
    send(&mut p.qa, &p.a, 1, 0, 8);
    assert_no_completion(&mut p.b.rcq);
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
    let mtu = u.a.ctx.port_attr(1).unwrap().active_mtu;
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

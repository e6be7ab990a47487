//! Two processes on one fabric: the parent sends 1,000,000 messages of varying size over RC,
//! the child checks every byte and sequence number and echoes each message back, and the
//! parent checks every byte of the echoes. The child is this same test binary, started with
//! `--exact two_process::child --include-ignored` and its instructions in the environment.

use crate::harness::{bring_up, to_init, ConnOpts, DEADLINE};
use dataplane::mem::HugePolicy;
use dataplane::shm::{Shm, ShmConfig};
use dataplane::verbs::*;
use dataplane::{Context, Cq, MemRegion, Mr, Pd, Provider, Qp, QpInitAttr};
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::Instant;

const MESSAGES: u64 = 1_000_000;
const MAX_LEN: usize = 256;
const SLOTS: usize = 128;
const WINDOW: u64 = 64;

/// Length of message `seq`: 8..=256 bytes.
fn len_of(seq: u64) -> usize {
    8 + (seq.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 56) as usize % (MAX_LEN - 7)
}

/// Fills `buf` with message `seq`: its sequence number, then bytes derived from it.
fn fill(seq: u64, buf: &mut [u8]) {
    buf[..8].copy_from_slice(&seq.to_le_bytes());
    let mut x = seq ^ 0xa5a5_5a5a_dead_beef;
    for b in &mut buf[8..] {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
}

struct End {
    _ctx: <Shm as Provider>::Context,
    region: <Shm as Provider>::Region,
    mr: <Shm as Provider>::Mr,
    scq: <Shm as Provider>::Cq,
    rcq: <Shm as Provider>::Cq,
    qp: <Shm as Provider>::Qp,
}

fn open_end(fabric: &str) -> End {
    let cfg = ShmConfig { fabric: fabric.into(), size: 16 << 20, huge: HugePolicy::Never };
    let ctx = Shm::open(&cfg).expect("open fabric");
    let pd = ctx.alloc_pd().unwrap();
    let region = ctx.alloc_region(2 * SLOTS * MAX_LEN).unwrap();
    let mr = pd.reg_mr(&region, 0, 2 * SLOTS * MAX_LEN, AccessFlags::LOCAL_WRITE).unwrap();
    let scq = ctx.create_cq(512).unwrap();
    let rcq = ctx.create_cq(512).unwrap();
    let cap = QpCaps { max_send_wr: 256, max_recv_wr: SLOTS as u32, ..Default::default() };
    let qp = pd
        .create_qp(&QpInitAttr { send_cq: &scq, recv_cq: &rcq, srq: None, cap, qp_type: QpType::Rc, sq_sig_all: true })
        .unwrap();
    let mut qp = qp;
    to_init(&mut qp, 0, AccessFlags::empty());
    End { _ctx: ctx, region, mr, scq, rcq, qp }
}

impl End {
    fn connect(&mut self, remote_qpn: u32) {
        let o = ConnOpts::default();
        let remote = Endpoint { qpn: remote_qpn, ..Default::default() };
        bring_up(&mut self.qp, &remote, &o);
    }

    /// Receive slot `i` (second half of the region; the first half is for sends).
    fn recv_sge(&self, i: usize) -> Sge {
        Sge::new(self.mr.addr() + ((SLOTS + i) * MAX_LEN) as u64, MAX_LEN as u32, self.mr.lkey())
    }

    fn post_recv(&mut self, i: usize) {
        let sge = self.recv_sge(i);
        self.qp.post_recv(&RecvChain::one(i as u64, &[sge])).expect("post_recv");
    }

    /// Sends `data` from send slot `slot`.
    fn send(&mut self, chain: &mut SendChain, slot: usize, wr_id: u64, data: &[u8]) {
        let off = slot * MAX_LEN;
        self.region.write(off, data);
        chain.clear();
        chain.push(SendWr::send(wr_id), &[Sge::new(self.mr.addr() + off as u64, data.len() as u32, self.mr.lkey())]);
        self.qp.post_send(chain).expect("post_send");
    }

    /// Received message in receive slot `i` of `len` bytes.
    fn received(&self, i: usize, len: usize, out: &mut [u8]) {
        self.region.read((SLOTS + i) * MAX_LEN, &mut out[..len]);
    }
}

fn check(seq: u64, got: &[u8], want: &mut [u8; MAX_LEN]) {
    let len = len_of(seq);
    assert_eq!(got.len(), len, "message {seq}: length");
    fill(seq, &mut want[..len]);
    assert!(got == &want[..len], "message {seq}: payload differs");
}

/// The peer process: receives, verifies, echoes.
#[test]
#[ignore = "peer process of two_process::one_million_messages_between_two_processes, which starts it"]
fn child() {
    let fabric = std::env::var("DP_2P_FABRIC").expect("started by the parent test");
    let parent_qpn: u32 = std::env::var("DP_2P_QPN").unwrap().parse().unwrap();
    let mut e = open_end(&fabric);
    for i in 0..SLOTS {
        e.post_recv(i);
    }
    println!("QPN {}", e.qp.qp_num());
    std::io::stdout().flush().unwrap();
    e.connect(parent_qpn);
    let (mut wc, mut scratch) = ([WorkCompletion::default(); 32], [WorkCompletion::default(); 32]);
    let (mut buf, mut want) = ([0u8; MAX_LEN], [0u8; MAX_LEN]);
    let mut chain = SendChain::with_capacity(1, 1);
    let mut next = 0u64;
    let end = Instant::now() + DEADLINE * 10;
    while next < MESSAGES {
        let n = e.rcq.poll(&mut wc).unwrap();
        for w in &wc[..n] {
            assert_eq!(w.status, WcStatus::Success, "child receive {next}: {w:?}");
            let slot = w.wr_id as usize;
            e.received(slot, w.byte_len as usize, &mut buf);
            let seq = u64::from_le_bytes(buf[..8].try_into().unwrap());
            assert_eq!(seq, next, "child: out of order");
            check(seq, &buf[..w.byte_len as usize], &mut want);
            e.post_recv(slot);
            e.send(&mut chain, slot % SLOTS, seq, &buf[..w.byte_len as usize]);
            next += 1;
        }
        let ns = e.scq.poll(&mut scratch).unwrap();
        for s in &scratch[..ns] {
            assert_eq!(s.status, WcStatus::Success, "child send: {s:?}");
        }
        assert!(Instant::now() < end, "child stalled at message {next}");
    }
    println!("OK {next}");
}

/// Two processes exchange 1,000,000 messages over RC through one fabric, every byte checked.
#[test]
fn one_million_messages_between_two_processes() {
    let fabric = format!("conf-2p-{}", std::process::id());
    let mut e = open_end(&fabric);
    for i in 0..SLOTS {
        e.post_recv(i);
    }
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "two_process::child", "--include-ignored", "--nocapture", "--test-threads=1"])
        .env("DP_2P_FABRIC", &fabric)
        .env("DP_2P_QPN", e.qp.qp_num().to_string())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn peer process");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let child_qpn: u32 = loop {
        let l = lines.next().expect("peer exited before printing its QPN").unwrap();
        // libtest prints "test two_process::child ... " before the child's own output.
        if let Some(q) = l.split("QPN ").nth(1) {
            break q.trim().parse().unwrap();
        }
    };
    e.connect(child_qpn);

    let (mut wc, mut scratch) = ([WorkCompletion::default(); 32], [WorkCompletion::default(); 32]);
    let (mut msg, mut buf, mut want) = ([0u8; MAX_LEN], [0u8; MAX_LEN], [0u8; MAX_LEN]);
    let mut chain = SendChain::with_capacity(1, 1);
    let (mut sent, mut echoed, mut bytes) = (0u64, 0u64, 0u64);
    let end = Instant::now() + DEADLINE * 10;
    while echoed < MESSAGES {
        while sent < MESSAGES && sent - echoed < WINDOW {
            let len = len_of(sent);
            fill(sent, &mut msg[..len]);
            e.send(&mut chain, (sent % SLOTS as u64) as usize, sent, &msg[..len]);
            sent += 1;
        }
        let n = e.rcq.poll(&mut wc).unwrap();
        for w in &wc[..n] {
            assert_eq!(w.status, WcStatus::Success, "parent receive: {w:?}");
            let slot = w.wr_id as usize;
            e.received(slot, w.byte_len as usize, &mut buf);
            let seq = u64::from_le_bytes(buf[..8].try_into().unwrap());
            assert_eq!(seq, echoed, "parent: echoes out of order");
            check(seq, &buf[..w.byte_len as usize], &mut want);
            bytes += w.byte_len as u64;
            e.post_recv(slot);
            echoed += 1;
        }
        let ns = e.scq.poll(&mut scratch).unwrap();
        for s in &scratch[..ns] {
            assert_eq!(s.status, WcStatus::Success, "parent send: {s:?}");
        }
        if Instant::now() > end {
            let _ = child.kill();
            panic!("stalled: sent {sent}, echoed {echoed}");
        }
    }
    let rest: Vec<String> = lines.map_while(|l| l.ok()).collect();
    let status = child.wait().unwrap();
    assert!(status.success(), "peer process failed: {status}; output: {rest:?}");
    assert!(rest.iter().any(|l| l.ends_with(&format!("OK {MESSAGES}"))), "peer did not confirm: {rest:?}");
    assert_eq!(echoed, MESSAGES);
    assert!(bytes > MESSAGES * 8);
}

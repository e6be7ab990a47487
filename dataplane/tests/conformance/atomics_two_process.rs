//! Two processes hammer one 8-byte counter with FETCH_AND_ADD and CMP_AND_SWP from several QPs
//! each; the final value is exact, because `shm` atomics are real atomic instructions on the
//! target's memory, atomic across processes.

use crate::harness::{bring_up, to_init, ConnOpts, DEADLINE};
use dataplane::mem::HugePolicy;
use dataplane::shm::{Shm, ShmConfig};
use dataplane::verbs::*;
use dataplane::{Context, Cq, MemRegion, Mr, Pd, Provider, Qp, QpInitAttr};
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::Instant;

const QPS: usize = 2;
const FAA: u64 = 20_000;
const CAS: u64 = 5_000;

struct Side {
    _ctx: <Shm as Provider>::Context,
    _pd: <Shm as Provider>::Pd,
    region: <Shm as Provider>::Region,
    mr: <Shm as Provider>::Mr,
    cq: <Shm as Provider>::Cq,
    qps: Vec<<Shm as Provider>::Qp>,
}

fn side(fabric: &str, n: usize) -> Side {
    let ctx = Shm::open(&ShmConfig { fabric: fabric.into(), size: 16 << 20, huge: HugePolicy::Never }).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let region = ctx.alloc_region(4096).unwrap();
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_ATOMIC;
    let mr = pd.reg_mr(&region, 0, 4096, access).unwrap();
    let cq = ctx.create_cq(64).unwrap();
    let qps = (0..n)
        .map(|_| {
            let attr = QpInitAttr {
                send_cq: &cq,
                recv_cq: &cq,
                srq: None,
                cap: QpCaps { max_send_wr: 16, max_recv_wr: 1, ..Default::default() },
                qp_type: QpType::Rc,
                sq_sig_all: true,
            };
            let mut qp = pd.create_qp(&attr).unwrap();
            to_init(&mut qp, 0, AccessFlags::REMOTE_ATOMIC);
            qp
        })
        .collect();
    Side { _ctx: ctx, _pd: pd, region, mr, cq, qps }
}

fn connect(qp: &mut <Shm as Provider>::Qp, peer: u32) {
    let o = ConnOpts::default();
    bring_up(qp, &Endpoint { qpn: peer, ..Default::default() }, &o);
}

/// One atomic on `qp`, waiting for its completion; returns the old value.
fn atomic(s: &mut Side, q: usize, wr: SendWr) -> u64 {
    let sge = Sge::new(s.mr.addr() + 64 + 8 * q as u64, 8, s.mr.lkey());
    s.qps[q].post_send(&SendChain::one(wr, &[sge])).expect("post atomic");
    let mut wc = [WorkCompletion::default()];
    let end = Instant::now() + DEADLINE;
    while s.cq.poll(&mut wc).unwrap() == 0 {
        assert!(Instant::now() < end, "atomic did not complete");
    }
    assert_eq!(wc[0].status, WcStatus::Success, "{:?}", wc[0]);
    let mut b = [0u8; 8];
    s.region.read(64 + 8 * q, &mut b);
    u64::from_ne_bytes(b)
}

/// Each of `s`'s QPs does FAA(+1) FAA times and a CAS-increment loop CAS times, round robin.
fn hammer(s: &mut Side, addr: u64, rkey: u32) {
    for i in 0..FAA {
        for q in 0..QPS {
            atomic(s, q, SendWr::fetch_add(i, addr, rkey, 1));
        }
    }
    for q in 0..QPS {
        let mut seen = atomic(s, q, SendWr::cmp_swap(0, addr, rkey, 0, 0));
        let mut done = 0;
        while done < CAS {
            let old = atomic(s, q, SendWr::cmp_swap(1, addr, rkey, seen, seen + 1));
            if old == seen {
                seen += 1;
                done += 1;
            } else {
                seen = old;
            }
        }
    }
}

/// The peer process.
#[test]
#[ignore = "peer process of atomics_two_process::two_processes_hammer_one_counter, which starts it"]
fn child() {
    let fabric = std::env::var("DP_AT_FABRIC").expect("started by the parent test");
    let servers: Vec<u32> = std::env::var("DP_AT_QPNS").unwrap().split(',').map(|q| q.parse().unwrap()).collect();
    let addr: u64 = std::env::var("DP_AT_ADDR").unwrap().parse().unwrap();
    let rkey: u32 = std::env::var("DP_AT_RKEY").unwrap().parse().unwrap();
    let mut s = side(&fabric, QPS);
    let qpns: Vec<String> = s.qps.iter().map(|q| q.qp_num().to_string()).collect();
    println!("QPNS {}", qpns.join(","));
    std::io::stdout().flush().unwrap();
    for (qp, peer) in s.qps.iter_mut().zip(&servers) {
        connect(qp, *peer);
    }
    hammer(&mut s, addr, rkey);
    println!("DONE");
}

/// Issue 7: two processes, two QPs each, FETCH_AND_ADD and CMP_AND_SWP on one counter.
#[test]
fn two_processes_hammer_one_counter() {
    let fabric = format!("conf-atomics-{}", std::process::id());
    // Responder QPs for the child's requesters, and a local requester/responder set.
    let mut target = side(&fabric, 2 * QPS);
    let mut me = side(&fabric, QPS);
    let counter = target.mr.addr();
    let rkey = target.mr.rkey();
    target.region.write(0, &0u64.to_ne_bytes());
    let server_qpns: Vec<String> = target.qps[..QPS].iter().map(|q| q.qp_num().to_string()).collect();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "atomics_two_process::child", "--include-ignored", "--nocapture", "--test-threads=1"])
        .env("DP_AT_FABRIC", &fabric)
        .env("DP_AT_QPNS", server_qpns.join(","))
        .env("DP_AT_ADDR", counter.to_string())
        .env("DP_AT_RKEY", rkey.to_string())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn peer");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let child_qpns: Vec<u32> = loop {
        let l = lines.next().expect("peer exited early").unwrap();
        if let Some(q) = l.split("QPNS ").nth(1) {
            break q.trim().split(',').map(|x| x.parse().unwrap()).collect();
        }
    };
    for (i, peer) in child_qpns.iter().enumerate() {
        connect(&mut target.qps[i], *peer);
    }
    for i in 0..QPS {
        let (mine, theirs) = (me.qps[i].qp_num(), target.qps[QPS + i].qp_num());
        connect(&mut target.qps[QPS + i], mine);
        connect(&mut me.qps[i], theirs);
    }
    hammer(&mut me, counter, rkey);
    let rest: Vec<String> = lines.map_while(|l| l.ok()).collect();
    assert!(child.wait().unwrap().success(), "peer failed: {rest:?}");
    assert!(rest.iter().any(|l| l.ends_with("DONE")), "{rest:?}");
    let mut b = [0u8; 8];
    target.region.read(0, &mut b);
    assert_eq!(u64::from_ne_bytes(b), 2 * QPS as u64 * (FAA + CAS));
}

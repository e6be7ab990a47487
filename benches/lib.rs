//! Shared setup for the benchmarks: a connected RC pair on one `shm` fabric, in one thread.

use dataplane::mem::HugePolicy;
use dataplane::shm::{Shm, ShmConfig};
use dataplane::verbs::*;
use dataplane::{Context, Cq, Mr, Pd, Provider, Qp, QpInitAttr, Srq};

type P = Shm;

/// Two RC QPs connected to each other, with receive buffers posted on `b`.
pub struct Loopback {
    /// The context (kept alive).
    pub ctx: <P as Provider>::Context,
    /// Sender QP.
    pub a: <P as Provider>::Qp,
    /// Receiver QP.
    pub b: <P as Provider>::Qp,
    /// Sender's CQ.
    pub acq: <P as Provider>::Cq,
    /// Receiver's CQ.
    pub bcq: <P as Provider>::Cq,
    /// Registered memory.
    pub mr: <P as Provider>::Mr,
    /// The memory.
    pub region: <P as Provider>::Region,
    /// `b`'s SRQ, when built with [`Loopback::with_srq`].
    pub srq: Option<<P as Provider>::Srq>,
    /// Bytes per message: the send buffer's and each receive slot's size.
    pub size: u32,
}

/// Receive buffers posted on `b`.
pub const DEPTH: u32 = 1024;

impl Loopback {
    /// Builds the pair on a fresh fabric named `name`.
    pub fn new(name: &str) -> Loopback {
        Self::build(name, false, 8)
    }

    /// Like [`Loopback::new`], with receive slots (and [`Loopback::send_sge`]) of `size`
    /// bytes (at least 8, at most 64 KiB).
    pub fn with_size(name: &str, size: u32) -> Loopback {
        Self::with_size_srq(name, size, false)
    }

    /// Like [`Loopback::new`], but `b` receives through an SRQ (`DEPTH` requests posted).
    pub fn with_srq(name: &str) -> Loopback {
        Self::build(name, true, 8)
    }

    /// [`Loopback::with_size`] and [`Loopback::with_srq`] at once.
    pub fn with_size_srq(name: &str, size: u32, use_srq: bool) -> Loopback {
        Self::build(name, use_srq, size.clamp(8, 64 << 10))
    }

    fn build(name: &str, use_srq: bool, size: u32) -> Loopback {
        // The send buffer, then DEPTH receive slots of `size` (at least 64) bytes.
        let bytes = (size.max(64) as usize * (DEPTH as usize + 1)).next_power_of_two().max(1 << 20);
        let fabric = format!("{name}-{}", std::process::id());
        let cfg = ShmConfig { fabric, size: (32 << 20) + 2 * bytes, huge: HugePolicy::default() };
        let ctx = P::open(&cfg).expect("open");
        let pd = ctx.alloc_pd().unwrap();
        let region = ctx.alloc_region(bytes).unwrap();
        let mr = pd.reg_mr(&region, 0, bytes, AccessFlags::LOCAL_WRITE).unwrap();
        let acq = ctx.create_cq(DEPTH).unwrap();
        let bcq = ctx.create_cq(DEPTH).unwrap();
        let cap = QpCaps { max_send_wr: DEPTH, max_recv_wr: DEPTH, ..Default::default() };
        let srq = use_srq.then(|| pd.create_srq(&SrqAttr { max_wr: DEPTH, max_sge: 1, srq_limit: 0 }).unwrap());
        let mk = |cq: &<P as Provider>::Cq, srq: Option<&<P as Provider>::Srq>| {
            pd.create_qp(&QpInitAttr { send_cq: cq, recv_cq: cq, srq, cap, qp_type: QpType::Rc, sq_sig_all: false })
                .unwrap()
        };
        let (mut a, mut b) = (mk(&acq, None), mk(&bcq, srq.as_ref()));
        let (qa, qb) = (a.qp_num(), b.qp_num());
        // shm QP numbers are fabric-wide: the route is just the port.
        let to = |qpn| PeerAddr { qpn, psn: 0, ah: AhAttr { port_num: 1, ..Default::default() } };
        a.connect(&to(qb), &ConnectOpts::default()).unwrap();
        b.connect(&to(qa), &ConnectOpts::default()).unwrap();
        let mut lb = Loopback { ctx, a, b, acq, bcq, mr, region, srq, size };
        let mut rc = RecvChain::with_capacity(DEPTH as usize, DEPTH as usize);
        for i in 0..DEPTH as u64 {
            rc.push(RecvWr::new(i), &[lb.recv_sge(i)]);
        }
        match lb.srq.as_mut() {
            Some(s) => s.post_recv(&rc).unwrap(),
            None => lb.b.post_recv(&rc).unwrap(),
        }
        lb
    }

    /// The receive buffer of slot `i` (`max(size, 64)` bytes each, after the send buffer).
    pub fn recv_sge(&self, i: u64) -> Sge {
        let slot = u64::from(self.size.max(64));
        Sge::new(self.mr.addr() + slot + (i % DEPTH as u64) * slot, slot as u32, self.mr.lkey())
    }

    /// The send SGE: `size` bytes (8 unless built by [`Loopback::with_size`]).
    pub fn send_sge(&self) -> Sge {
        Sge::new(self.mr.addr(), self.size, self.mr.lkey())
    }
}

/// One round of `chain.len()` messages: post the chain (one doorbell), poll the receiver's
/// completions, repost their buffers in one chain (to the SRQ, if `b` has one), poll the
/// sender's completion.
pub fn round(lb: &mut Loopback, chain: &SendChain, rchain: &mut RecvChain, wc: &mut [WorkCompletion]) {
    lb.a.post_send(chain).expect("post_send");
    let mut got = 0;
    rchain.clear();
    while got < chain.len() {
        let n = lb.bcq.poll(&mut wc[..chain.len() - got]).expect("poll");
        for w in &wc[..n] {
            debug_assert!(w.is_ok());
            rchain.push(RecvWr::new(w.wr_id), &[lb.recv_sge(w.wr_id)]);
        }
        got += n;
    }
    match lb.srq.as_mut() {
        Some(s) => s.post_recv(rchain).expect("post_srq_recv"),
        None => lb.b.post_recv(rchain).expect("post_recv"),
    }
    while lb.acq.poll(&mut wc[..1]).expect("poll") == 0 {}
}

/// A chain of `n` 8-byte SENDs, the last one signaled.
pub fn send_chain(lb: &Loopback, n: usize) -> SendChain {
    let mut c = SendChain::with_capacity(n, n);
    for i in 0..n {
        let wr = if i + 1 == n { SendWr::send(i as u64).signaled() } else { SendWr::send(i as u64) };
        c.push(wr, &[lb.send_sge()]);
    }
    c
}

//! The NIC of the `xdp` provider: one AF_XDP socket per port (a port is one queue of one
//! interface), shared by the RAW_PACKET QPs bound to that port at INIT (`port_num`), as a
//! multi-port NIC shares its ports among QPs.
//!
//! Sends of every QP go out through its port's TX ring; frames received on a port are
//! steered to that port's QPs by their flow rules (`ibv_create_flow(3)`: the lowest
//! `priority` for a unicast destination, every matching QP once for a group address) and
//! copied into the receive request at the head of each target's queue (its own, or its SRQ).
//! Completions are made when a CQ is polled: the poll is the NIC's engine (poll mode, no
//! hidden thread), as on `shm`.
//!
//! The whole device is behind one lock, taken once per post list and once per poll; workers
//! that own a context each never contend on it. A lock-free split (per-QP TX rings through
//! `XDP_SHARED_UMEM`) is the next step for many threads on one interface.

use super::socket::Xsk;
use super::sys::{self, XdpDesc};
use crate::net::frame::{fill_ip_checksums, FrameKey};
use crate::net::tso::TsoPlan;
use crate::verbs::{
    AccessFlags, AsyncEvent, AsyncEventKind, Errno, Error, FlowId, FlowSpec, PostError, QpCaps, QpState, RecvChain,
    Result, SendChain, SendFlags, SendWr, Sge, SrqAttr, WcOpcode, WcStatus, WorkCompletion, WrOpcode,
};
use std::collections::VecDeque;

/// Most SGEs of one request.
pub const MAX_SGE: usize = 4;
/// Most bytes of inline data.
pub const MAX_INLINE: u32 = 256;
/// Largest TSO payload (`max_tso`).
pub const MAX_TSO: u32 = 256 << 10;
/// Largest TSO header template (`max_tso_header`).
pub const MAX_TSO_HEADER: u32 = 256;
/// Most received frames handled per port and poll, so one poll stays short under a flood.
const RX_BUDGET: u32 = 256;

/// A registered memory region.
struct MrEntry {
    lkey: u32,
    pd: u32,
    addr: u64,
    len: u64,
    access: AccessFlags,
}

/// A posted receive request.
#[derive(Clone, Copy)]
struct RecvEntry {
    wr_id: u64,
    n: u8,
    sges: [Sge; MAX_SGE],
}

impl RecvEntry {
    fn new(wr_id: u64, sges: &[Sge]) -> RecvEntry {
        let mut e = RecvEntry { wr_id, n: sges.len() as u8, sges: [Sge::default(); MAX_SGE] };
        e.sges[..sges.len()].copy_from_slice(sges);
        e
    }
}

/// A QP's state in the device.
struct QpEntry {
    qpn: u32,
    pd: u32,
    state: QpState,
    send_cq: usize,
    recv_cq: usize,
    sig_all: bool,
    caps: QpCaps,
    rq: VecDeque<RecvEntry>,
    /// Sends posted and not yet completed.
    sq_used: u32,
    /// The port (index) it sends and receives on, chosen at INIT.
    link: usize,
    /// The SRQ (index) its receives come from.
    srq: Option<usize>,
}

/// A CQ's queue of completions.
struct CqEntry {
    q: VecDeque<WorkCompletion>,
    depth: u32,
    overrun: bool,
    /// Owners: the CQ handle and each QP that completes on it.
    refs: u32,
}

/// A shared receive queue.
struct SrqEntry {
    srqn: u32,
    pd: u32,
    rq: VecDeque<RecvEntry>,
    max_wr: u32,
    max_sge: u32,
    limit: u32,
    /// Owners: the SRQ handle and each QP attached to it.
    refs: u32,
}

/// What a send frame in flight belongs to.
#[derive(Clone, Copy, Default)]
struct TxMeta {
    /// QP index + 1 (0: none).
    qp: usize,
    qpn: u32,
    wr_id: u64,
    signaled: bool,
    /// The request's last frame (a TSO request has several): it completes the request.
    last: bool,
    opcode: WcOpcode,
}

/// A steering rule, in creation order.
struct FlowEntry {
    id: u32,
    qp: usize,
    spec: FlowSpec,
}

/// Counters of one port, for `dpctl` and tests.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PortCounters {
    /// Frames received from the interface.
    pub rx_frames: u64,
    /// Frames delivered to a receive request (a broadcast counts once per QP).
    pub rx_delivered: u64,
    /// Frames no rule matched.
    pub rx_no_rule: u64,
    /// Frames dropped at a QP with no posted receive (Ethernet has no RNR).
    pub rx_no_recv: u64,
    /// Frames sent.
    pub tx_frames: u64,
    /// Doorbells (`sendto` kicks).
    pub tx_kicks: u64,
}

/// One port: an AF_XDP socket and its send frames.
struct Link {
    xsk: Xsk,
    free_tx: Vec<u64>,
    tx_meta: Vec<TxMeta>,
    /// Largest frame (the interface MTU plus 14 bytes of Ethernet and 4 of a VLAN tag,
    /// within one UMEM frame).
    max_frame: u32,
    counters: PortCounters,
}

impl Link {
    fn new(xsk: Xsk, mtu: u32) -> Link {
        let n = xsk.frames / 2;
        let base = xsk.tx_base();
        let fs = u64::from(xsk.frame_size);
        let free_tx = (0..u64::from(n)).rev().map(|k| base + k * fs).collect();
        let max_frame = (mtu + 18).min(xsk.frame_size);
        Link {
            xsk,
            free_tx,
            tx_meta: vec![TxMeta::default(); n as usize],
            max_frame,
            counters: PortCounters::default(),
        }
    }

    /// The TX doorbell, when the kernel wants one (always in copy mode).
    fn kick(&mut self) {
        if self.xsk.tx.needs_wakeup() || !self.xsk.zero_copy {
            self.counters.tx_kicks += 1;
            // A hard error (the interface went away) shows as frames that never complete.
            let _ = sys::kick_tx(&self.xsk.fd);
        }
    }

    /// Takes a free send frame of at least `len` bytes: its UMEM address and bytes.
    fn take_frame(&mut self, len: usize) -> Option<(u64, &mut [u8])> {
        let addr = self.free_tx.pop()?;
        let dst = self.xsk.frame_ptr(addr, len).expect("send frames lie in the UMEM and len <= max_frame");
        // SAFETY: a send frame off the free list: no one else reads or writes it until the
        // completion ring returns it; `len` bytes of it lie in the UMEM (checked).
        Some((addr, unsafe { std::slice::from_raw_parts_mut(dst, len) }))
    }

    /// Puts send frame `addr` (`len` bytes) on the TX ring for `meta`.
    fn queue(&mut self, addr: u64, len: usize, meta: TxMeta) {
        let k = ((addr - self.xsk.tx_base()) / u64::from(self.xsk.frame_size)) as usize;
        self.tx_meta[k] = meta;
        self.xsk.tx.push(XdpDesc { addr, len: len as u32, options: 0 });
    }
}

/// The device: every port, QP, CQ, SRQ, MR and rule of one context.
pub struct Port {
    links: Vec<Link>,
    mrs: Vec<Option<MrEntry>>,
    mr_gen: u32,
    qps: Vec<Option<QpEntry>>,
    cqs: Vec<Option<CqEntry>>,
    srqs: Vec<Option<SrqEntry>>,
    flows: Vec<FlowEntry>,
    flow_gen: u32,
    qpn_base: u32,
    events: VecDeque<AsyncEvent>,
}

fn post_err(errno: Errno, i: usize, why: &'static str) -> PostError {
    PostError::new(errno, i, why)
}

/// First free slot of `v`, growing it if none.
fn slot<T>(v: &mut Vec<Option<T>>) -> usize {
    match v.iter().position(Option::is_none) {
        Some(i) => i,
        None => {
            v.push(None);
            v.len() - 1
        }
    }
}

impl Port {
    /// A device over `xsks` (one per port, each with its interface's MTU); QP and SRQ
    /// numbers start above `qpn_base`.
    pub fn new(xsks: Vec<(Xsk, u32)>, qpn_base: u32) -> Port {
        Port {
            links: xsks.into_iter().map(|(x, mtu)| Link::new(x, mtu)).collect(),
            mrs: Vec::new(),
            mr_gen: 0,
            qps: Vec::new(),
            cqs: Vec::new(),
            srqs: Vec::new(),
            flows: Vec::new(),
            flow_gen: 0,
            qpn_base,
            events: VecDeque::new(),
        }
    }

    /// Number of ports.
    pub fn ports(&self) -> usize {
        self.links.len()
    }

    /// Whether port `link`'s socket is bound zero-copy.
    pub fn zero_copy(&self, link: usize) -> bool {
        self.links[link].xsk.zero_copy
    }

    /// Send frames of the smallest port: the most sends one QP may have in flight.
    pub fn send_frames(&self) -> u32 {
        self.links.iter().map(|l| l.xsk.frames / 2).min().unwrap_or(0)
    }

    /// Largest frame port `link` sends.
    pub fn max_frame(&self, link: usize) -> u32 {
        self.links[link].max_frame
    }

    /// Port `link`'s counters.
    pub fn counters(&self, link: usize) -> PortCounters {
        self.links[link].counters
    }

    /// The kernel's drop counters of port `link`'s socket.
    pub fn statistics(&self, link: usize) -> std::io::Result<sys::XdpStatistics> {
        self.links[link].xsk.statistics()
    }

    /// The next asynchronous event (an SRQ limit reached).
    pub fn next_event(&mut self) -> Option<AsyncEvent> {
        self.events.pop_front()
    }

    // ---- memory ----

    /// Registers `[addr, addr + len)` for PD `pd`; returns the lkey (= rkey).
    pub fn reg_mr(&mut self, pd: u32, addr: u64, len: u64, access: AccessFlags) -> Result<u32> {
        let i = slot(&mut self.mrs);
        if i >= 0xffff {
            self.mrs.truncate(0xffff);
            return Err(Error::new(Errno::ENOMEM, "reg_mr: all 65535 MRs of the device are in use"));
        }
        self.mr_gen = self.mr_gen.wrapping_add(1) & 0xffff;
        let lkey = self.mr_gen << 16 | (i as u32 + 1);
        self.mrs[i] = Some(MrEntry { lkey, pd, addr, len, access });
        Ok(lkey)
    }

    /// Deregisters `lkey`.
    pub fn dereg_mr(&mut self, lkey: u32) {
        let i = (lkey & 0xffff) as usize;
        if let Some(s) = i.checked_sub(1).and_then(|i| self.mrs.get_mut(i)) {
            if s.as_ref().is_some_and(|m| m.lkey == lkey) {
                *s = None;
            }
        }
    }

    fn mr(&self, lkey: u32) -> Option<&MrEntry> {
        let i = ((lkey & 0xffff) as usize).checked_sub(1)?;
        self.mrs.get(i)?.as_ref().filter(|m| m.lkey == lkey)
    }

    /// Checks that `sge` lies in an MR of PD `pd` (with LOCAL_WRITE if `write`).
    fn check_sge(&self, pd: u32, sge: &Sge, write: bool) -> std::result::Result<(), &'static str> {
        let m = self.mr(sge.lkey).ok_or("unknown lkey")?;
        if m.pd != pd {
            return Err("lkey of an MR of another PD");
        }
        let end = sge.addr.checked_add(u64::from(sge.length)).ok_or("SGE outside its MR")?;
        if sge.addr < m.addr || end > m.addr + m.len {
            return Err("SGE outside its MR");
        }
        if write && !m.access.contains(AccessFlags::LOCAL_WRITE) {
            return Err("receive MR without LOCAL_WRITE");
        }
        Ok(())
    }

    /// Whether `s` lies in some MR of the device (any PD): inline sends are not checked
    /// against their PD, but must read memory this process registered.
    fn in_any_mr(&self, s: &Sge) -> bool {
        let end = s.addr.checked_add(u64::from(s.length));
        self.mrs.iter().flatten().any(|m| s.addr >= m.addr && end.is_some_and(|e| e <= m.addr + m.len))
    }

    // ---- CQs and SRQs ----

    /// Creates a CQ of `depth` entries; returns its index.
    pub fn create_cq(&mut self, depth: u32) -> usize {
        let i = slot(&mut self.cqs);
        self.cqs[i] = Some(CqEntry { q: VecDeque::with_capacity(depth as usize), depth, overrun: false, refs: 1 });
        i
    }

    /// One owner of CQ `cq` less; the entry goes with the last.
    pub fn destroy_cq(&mut self, cq: usize) {
        if let Some(c) = self.cqs[cq].as_mut() {
            c.refs -= 1;
            if c.refs == 0 {
                self.cqs[cq] = None;
            }
        }
    }

    /// Creates an SRQ; returns its index and number.
    pub fn create_srq(&mut self, pd: u32, max_wr: u32, max_sge: u32) -> (usize, u32) {
        let i = slot(&mut self.srqs);
        let srqn = self.qpn_base + 0x8000 + i as u32;
        let rq = VecDeque::with_capacity(max_wr as usize);
        self.srqs[i] = Some(SrqEntry { srqn, pd, rq, max_wr, max_sge, limit: 0, refs: 1 });
        (i, srqn)
    }

    /// One owner of SRQ `srq` less; the entry goes with the last.
    pub fn destroy_srq(&mut self, srq: usize) {
        if let Some(x) = self.srqs[srq].as_mut() {
            x.refs -= 1;
            if x.refs == 0 {
                self.srqs[srq] = None;
            }
        }
    }

    fn srq(&mut self, srq: usize) -> &mut SrqEntry {
        self.srqs[srq].as_mut().expect("an SRQ handle outlives its entry")
    }

    /// `ibv_modify_srq` with `LIMIT`: arms the limit event. Errors: `EINVAL` above `max_wr`.
    pub fn arm_srq_limit(&mut self, srq: usize, limit: u32) -> Result<()> {
        let x = self.srq(srq);
        if limit > x.max_wr {
            return Err(Error::new(Errno::EINVAL, format!("srq_limit {limit} above max_wr {}", x.max_wr)));
        }
        x.limit = limit;
        Ok(())
    }

    /// `ibv_query_srq`.
    pub fn query_srq(&mut self, srq: usize) -> SrqAttr {
        let x = self.srq(srq);
        SrqAttr { max_wr: x.max_wr, max_sge: x.max_sge, srq_limit: x.limit }
    }

    /// `ibv_post_srq_recv` on SRQ `srq`.
    pub fn post_srq_recv(&mut self, srq: usize, chain: &RecvChain) -> std::result::Result<(), PostError> {
        let (pd, max_sge, max_wr) = {
            let x = self.srq(srq);
            (x.pd, x.max_sge, x.max_wr)
        };
        for (i, (wr, sges)) in chain.iter().enumerate() {
            if sges.len() > max_sge as usize {
                return Err(post_err(Errno::EINVAL, i, "more SGEs than the SRQ's max_sge"));
            }
            for sg in sges {
                self.check_sge(pd, sg, true).map_err(|r| post_err(Errno::EINVAL, i, r))?;
            }
            let x = self.srq(srq);
            if x.rq.len() >= max_wr as usize {
                return Err(post_err(Errno::ENOMEM, i, "SRQ full"));
            }
            x.rq.push_back(RecvEntry::new(wr.wr_id, sges));
        }
        Ok(())
    }

    // ---- QPs ----

    /// Creates a RAW_PACKET QP in RESET on CQs `send_cq`/`recv_cq` and SRQ `srq`; returns
    /// its index and number.
    pub fn create_qp(
        &mut self,
        pd: u32,
        (send_cq, recv_cq): (usize, usize),
        srq: Option<usize>,
        caps: QpCaps,
        sig_all: bool,
    ) -> (usize, u32) {
        let i = slot(&mut self.qps);
        let qpn = self.qpn_base + i as u32 + 1;
        let rq = VecDeque::with_capacity(if srq.is_some() { 0 } else { caps.max_recv_wr as usize });
        let state = QpState::Reset;
        self.qps[i] = Some(QpEntry { qpn, pd, state, send_cq, recv_cq, sig_all, caps, rq, sq_used: 0, link: 0, srq });
        for cq in [send_cq, recv_cq] {
            if let Some(c) = self.cqs[cq].as_mut() {
                c.refs += 1;
            }
        }
        if let Some(x) = srq.and_then(|x| self.srqs[x].as_mut()) {
            x.refs += 1;
        }
        (i, qpn)
    }

    /// Destroys QP `qp` and its rules; its frames in flight complete to nobody.
    pub fn destroy_qp(&mut self, qp: usize) {
        let Some(q) = self.qps[qp].take() else { return };
        self.flows.retain(|f| f.qp != qp);
        for l in &mut self.links {
            for m in &mut l.tx_meta {
                if m.qp == qp + 1 {
                    m.qp = 0;
                }
            }
        }
        self.destroy_cq(q.send_cq);
        self.destroy_cq(q.recv_cq);
        if let Some(x) = q.srq {
            self.destroy_srq(x);
        }
    }

    fn qp(&mut self, qp: usize) -> &mut QpEntry {
        self.qps[qp].as_mut().expect("a QP handle outlives its entry")
    }

    /// The QP's state.
    pub fn qp_state(&mut self, qp: usize) -> QpState {
        self.qp(qp).state
    }

    /// Binds QP `qp` to port `link` (at RESET -> INIT).
    pub fn set_link(&mut self, qp: usize, link: usize) {
        self.qp(qp).link = link;
    }

    /// Moves QP `qp` to `to` (the caller checked the transition). Entering ERROR flushes the
    /// QP's own posted receives; entering RESET drops them.
    pub fn set_state(&mut self, qp: usize, to: QpState) {
        let e = self.qp(qp);
        e.state = to;
        match to {
            QpState::Error => {
                let (qpn, cq) = (e.qpn, e.recv_cq);
                while let Some(r) = self.qp(qp).rq.pop_front() {
                    self.complete(cq, flush_wc(r.wr_id, qpn, WcOpcode::Recv));
                }
            }
            QpState::Reset => e.rq.clear(),
            _ => {}
        }
    }

    /// Installs rule `spec` for QP `qp`.
    pub fn create_flow(&mut self, qp: usize, spec: &FlowSpec) -> Result<FlowId> {
        if self.flows.len() >= 4096 {
            return Err(Error::new(Errno::ENOMEM, "create_flow: all 4096 steering rules of the device are in use"));
        }
        self.flow_gen = self.flow_gen.wrapping_add(1);
        let id = self.flow_gen;
        self.flows.push(FlowEntry { id, qp, spec: *spec });
        Ok(FlowId(id))
    }

    /// Removes rule `id` of QP `qp`.
    pub fn destroy_flow(&mut self, qp: usize, id: FlowId) -> Result<()> {
        match self.flows.iter().position(|f| f.id == id.0 && f.qp == qp) {
            Some(i) => {
                self.flows.remove(i);
                Ok(())
            }
            None => Err(Error::new(Errno::EINVAL, format!("destroy_flow: {id:?} is not a steering rule of this QP"))),
        }
    }

    // ---- completions ----

    fn complete(&mut self, cq: usize, wc: WorkCompletion) {
        if let Some(c) = self.cqs.get_mut(cq).and_then(Option::as_mut) {
            if c.q.len() >= c.depth as usize {
                c.overrun = true;
            } else {
                c.q.push_back(wc);
            }
        }
    }

    /// Progresses the device, then moves up to `wc.len()` completions of CQ `cq` into `wc`.
    ///
    /// Errors: `EIO` once the CQ overran (as a NIC's CQ error).
    pub fn poll(&mut self, cq: usize, wc: &mut [WorkCompletion]) -> Result<usize> {
        // Frames are taken off the RX rings no faster than the caller takes completions: as
        // many as it asks for, less what this CQ already holds (see `progress`). A poll
        // either returns waiting completions or delivers new frames, so every CQ that is
        // polled makes progress, whatever other CQs hold.
        let waiting = self.cqs[cq].as_ref().map_or(0, |c| c.q.len());
        self.progress(wc.len().min(RX_BUDGET as usize).saturating_sub(waiting) as u32);
        let c = self.cqs[cq].as_mut().expect("a CQ handle outlives its entry");
        if c.overrun {
            return Err(Error::new(Errno::EIO, "CQ overrun: more completions than its depth were pending"));
        }
        let n = wc.len().min(c.q.len());
        for (w, v) in wc.iter_mut().zip(c.q.drain(..n)) {
            *w = v;
        }
        Ok(n)
    }

    /// Runs the NIC: on every port, reaps sent frames, delivers received ones (giving their
    /// frames back to the fill ring), and kicks TX again while the kernel left frames behind.
    ///
    /// At most `rx_budget` frames are delivered (the caller's room): delivering ahead of the
    /// consumer uses up receive requests (an SRQ's, typically) that it has not had the chance
    /// to replenish, and drops frames that the kernel's RX ring would have held meanwhile.
    /// Seen before this bound: about 20,000 drops at `rx_no_recv` in a 3 s iperf3 through the
    /// L2 forwarder (its worker polls its send CQ and its receive CQ each loop; both polls
    /// delivered up to 256 frames per port while it took 32 completions), each one a TCP
    /// retransmit; after it, none.
    pub fn progress(&mut self, mut rx_budget: u32) {
        for li in 0..self.links.len() {
            let n = self.links[li].xsk.comp.ready();
            for k in 0..n {
                let addr = self.links[li].xsk.comp.peek(k);
                self.sent(li, addr);
            }
            if n > 0 {
                self.links[li].xsk.comp.release(n);
            }
            let n = self.links[li].xsk.rx.ready().min(rx_budget);
            rx_budget -= n;
            if n > 0 {
                let fs = u64::from(self.links[li].xsk.frame_size);
                // Room for every frame taken: the kernel consumed each from the fill ring
                // before it filled it (this refreshes our view of its consumer index).
                let room = self.links[li].xsk.fill.free(n);
                debug_assert!(room >= n);
                for k in 0..n {
                    let d = self.links[li].xsk.rx.peek(k);
                    self.received(li, d);
                    self.links[li].xsk.fill.push(d.addr - d.addr % fs);
                }
                let l = &mut self.links[li];
                l.xsk.rx.release(n);
                l.xsk.fill.publish();
            }
            let l = &mut self.links[li];
            if l.xsk.fill.needs_wakeup() {
                sys::kick_rx(&l.xsk.fd);
            }
            if l.xsk.tx.in_flight() > 0 {
                l.kick();
            }
        }
    }

    /// A send frame of port `li` came back on the completion ring.
    fn sent(&mut self, li: usize, addr: u64) {
        let l = &mut self.links[li];
        let fs = u64::from(l.xsk.frame_size);
        let Some(k) = addr.checked_sub(l.xsk.tx_base()).map(|o| (o / fs) as usize) else { return };
        let Some(m) = l.tx_meta.get(k).copied() else { return };
        l.tx_meta[k] = TxMeta::default();
        l.free_tx.push(l.xsk.tx_base() + k as u64 * fs);
        l.counters.tx_frames += 1;
        let Some(qi) = m.qp.checked_sub(1) else { return };
        let Some(q) = self.qps[qi].as_mut() else { return };
        if !m.last {
            return;
        }
        q.sq_used -= 1;
        if m.signaled {
            let cq = q.send_cq;
            let wc = WorkCompletion {
                wr_id: m.wr_id,
                status: WcStatus::Success,
                opcode: m.opcode,
                qp_num: m.qpn,
                ..Default::default()
            };
            self.complete(cq, wc);
        }
    }

    /// A frame arrived on port `li`: steer it and copy it into each target's receive request.
    fn received(&mut self, li: usize, d: XdpDesc) {
        self.links[li].counters.rx_frames += 1;
        let len = d.len as usize;
        let Some(src) = self.links[li].xsk.frame_ptr(d.addr, len) else { return };
        // SAFETY: the frame is inside the UMEM (checked by `frame_ptr`) and is ours until it
        // goes back to the fill ring; nothing writes it meanwhile.
        let frame = unsafe { std::slice::from_raw_parts(src as *const u8, len) };
        let key = FrameKey::parse(frame);
        let mut targets = [0usize; 64];
        let n = self.targets(li, &key, &mut targets);
        if n == 0 {
            self.links[li].counters.rx_no_rule += 1;
        }
        for &qi in &targets[..n] {
            self.deliver(li, qi, frame);
        }
    }

    /// The QPs of port `li` a frame with `key` goes to.
    fn targets(&self, li: usize, key: &FrameKey, out: &mut [usize]) -> usize {
        let live = |f: &&FlowEntry| {
            self.qps[f.qp].as_ref().is_some_and(|q| q.link == li && q.state.receives()) && f.spec.matches(key)
        };
        if key.is_group() {
            let mut n = 0;
            for f in self.flows.iter().filter(live) {
                if n < out.len() && !out[..n].contains(&f.qp) {
                    out[n] = f.qp;
                    n += 1;
                }
            }
            n
        } else {
            // The lowest priority wins; among equals, the oldest rule (`min_by_key` keeps the
            // first of equal keys).
            match self.flows.iter().filter(live).min_by_key(|f| f.spec.priority) {
                Some(f) => {
                    out[0] = f.qp;
                    1
                }
                None => 0,
            }
        }
    }

    /// Copies `frame` (received on port `li`) into the next receive request of QP `qi`.
    fn deliver(&mut self, li: usize, qi: usize, frame: &[u8]) {
        let (qpn, cq, qp_pd, srq) = {
            let q = self.qps[qi].as_ref().expect("targets are live QPs");
            (q.qpn, q.recv_cq, q.pd, q.srq)
        };
        // The receive request, and the PD that checks its buffers (the SRQ's, for an SRQ).
        let (taken, pd) = match srq {
            None => (self.qp(qi).rq.pop_front(), qp_pd),
            Some(x) => {
                let e = self.srq(x);
                let r = e.rq.pop_front();
                let pd = e.pd;
                if r.is_some() && e.limit > 0 && (e.rq.len() as u32) < e.limit {
                    // ibv_modify_srq(3): the event fires once, then the limit is disarmed.
                    e.limit = 0;
                    let ev = AsyncEvent { kind: AsyncEventKind::SrqLimitReached, element: e.srqn };
                    self.events.push_back(ev);
                }
                (r, pd)
            }
        };
        let Some(r) = taken else {
            self.links[li].counters.rx_no_recv += 1;
            return;
        };
        let sges = &r.sges[..r.n as usize];
        let room: u64 = sges.iter().map(|s| u64::from(s.length)).sum();
        let mut wc = WorkCompletion { wr_id: r.wr_id, opcode: WcOpcode::Recv, qp_num: qpn, ..Default::default() };
        if room < frame.len() as u64 {
            wc.status = WcStatus::LocLenErr;
        } else if sges.iter().any(|s| self.check_sge(pd, s, true).is_err()) {
            // The MR was deregistered (or its key reused) since the request was posted.
            wc.status = WcStatus::LocProtErr;
        } else {
            let mut at = 0;
            for s in sges {
                let k = (s.length as usize).min(frame.len() - at);
                // SAFETY: the destination lies in a live MR of the request's PD (checked just
                // above under the device lock, which deregistration also takes), i.e. in a
                // mapped region this process registered; the source is the UMEM frame.
                unsafe { std::ptr::copy_nonoverlapping(frame[at..].as_ptr(), s.addr as *mut u8, k) };
                at += k;
                if at == frame.len() {
                    break;
                }
            }
            wc.status = WcStatus::Success;
            wc.byte_len = frame.len() as u32;
            self.links[li].counters.rx_delivered += 1;
        }
        self.complete(cq, wc);
    }

    // ---- posting ----

    /// `ibv_post_recv` on QP `qp`.
    pub fn post_recv(&mut self, qp: usize, chain: &RecvChain) -> std::result::Result<(), PostError> {
        let (pd, state, caps, srq, qpn, cq) = {
            let q = self.qp(qp);
            (q.pd, q.state, q.caps, q.srq, q.qpn, q.recv_cq)
        };
        if srq.is_some() {
            return Err(post_err(Errno::EINVAL, 0, "QP is attached to an SRQ: use post_srq_recv"));
        }
        if !state.accepts_post_recv() {
            return Err(post_err(Errno::EINVAL, 0, "QP is in RESET"));
        }
        for (i, (wr, sges)) in chain.iter().enumerate() {
            if sges.len() > caps.max_recv_sge as usize {
                return Err(post_err(Errno::EINVAL, i, "more SGEs than the QP's max_recv_sge"));
            }
            for s in sges {
                self.check_sge(pd, s, true).map_err(|r| post_err(Errno::EINVAL, i, r))?;
            }
            if self.qp(qp).rq.len() >= caps.max_recv_wr as usize {
                return Err(post_err(Errno::ENOMEM, i, "receive queue full"));
            }
            if state == QpState::Error {
                self.complete(cq, flush_wc(wr.wr_id, qpn, WcOpcode::Recv));
            } else {
                self.qp(qp).rq.push_back(RecvEntry::new(wr.wr_id, sges));
            }
        }
        Ok(())
    }

    /// `ibv_post_send` on QP `qp`: each request is checked, copied into a send frame of its
    /// port's UMEM and put on the TX ring; one doorbell for the list.
    pub fn post_send(&mut self, qp: usize, chain: &SendChain) -> std::result::Result<(), PostError> {
        let r = self.post_send_inner(qp, chain);
        let li = self.qp(qp).link;
        let l = &mut self.links[li];
        l.xsk.tx.publish();
        l.kick();
        r
    }

    fn post_send_inner(&mut self, qp: usize, chain: &SendChain) -> std::result::Result<(), PostError> {
        let (pd, state, caps, sig_all, qpn, send_cq, li) = {
            let q = self.qp(qp);
            (q.pd, q.state, q.caps, q.sig_all, q.qpn, q.send_cq, q.link)
        };
        if !state.accepts_post_send() {
            return Err(post_err(Errno::EINVAL, 0, "QP is not ready to send (post_send needs RTS, SQD, SQE or ERROR)"));
        }
        for (i, wr) in chain.wrs().iter().enumerate() {
            let sges = chain.sges_of(wr);
            let inline = chain.inline_of(wr);
            if !wr.opcode.allowed_on(crate::verbs::QpType::RawPacket) {
                return Err(post_err(Errno::EINVAL, i, "opcode not allowed on this QP type (ibv_post_send(3) table)"));
            }
            let is_inline = wr.flags.contains(SendFlags::INLINE) || inline.is_some();
            if is_inline && wr.opcode == WrOpcode::Tso {
                return Err(post_err(Errno::EINVAL, i, "IBV_SEND_INLINE is valid only for Send and RDMA Write"));
            }
            if sges.len() > caps.max_send_sge as usize {
                return Err(post_err(Errno::EINVAL, i, "more SGEs than the QP's max_send_sge"));
            }
            let total: u64 = match inline {
                Some(b) => b.len() as u64,
                None => {
                    for s in sges {
                        // Inline SGEs are not checked against the PD, but must be memory
                        // registered on this device (memory this process can read).
                        if is_inline && !self.in_any_mr(s) {
                            return Err(post_err(Errno::EINVAL, i, "inline SGE outside registered memory"));
                        }
                        if !is_inline {
                            self.check_sge(pd, s, false).map_err(|r| post_err(Errno::EINVAL, i, r))?;
                        }
                    }
                    sges.iter().map(|s| u64::from(s.length)).sum()
                }
            };
            if is_inline && total > u64::from(caps.max_inline_data) {
                return Err(post_err(Errno::EINVAL, i, "inline data longer than the QP's max_inline_data"));
            }
            let signaled = sig_all || wr.flags.contains(SendFlags::SIGNALED);
            if wr.opcode == WrOpcode::Tso {
                self.post_tso(qp, li, chain, wr, total, signaled, i)?;
                continue;
            }
            if total < 14 {
                return Err(post_err(Errno::EINVAL, i, "a RAW_PACKET send must hold an Ethernet header (14 bytes)"));
            }
            if total > u64::from(self.links[li].max_frame) {
                return Err(post_err(Errno::EINVAL, i, "frame larger than the interface MTU + 18 bytes of headers"));
            }
            if state == QpState::Error {
                self.complete(send_cq, flush_wc(wr.wr_id, qpn, WcOpcode::Send));
                continue;
            }
            if self.qp(qp).sq_used >= caps.max_send_wr {
                return Err(post_err(Errno::ENOMEM, i, "send queue full"));
            }
            let l = &mut self.links[li];
            if l.xsk.tx.free(1) == 0 {
                return Err(post_err(Errno::ENOMEM, i, "send queue full (the port's TX ring is full)"));
            }
            let Some((addr, frame)) = l.take_frame(total as usize) else {
                return Err(post_err(Errno::ENOMEM, i, "send queue full (every send frame of the port is in flight)"));
            };
            match inline {
                Some(b) => frame.copy_from_slice(b),
                None => gather(sges, 0, frame),
            }
            if wr.flags.contains(SendFlags::IP_CSUM) {
                fill_ip_checksums(frame);
            }
            let meta = TxMeta { qp: qp + 1, qpn, wr_id: wr.wr_id, signaled, last: true, opcode: WcOpcode::Send };
            l.queue(addr, total as usize, meta);
            self.qp(qp).sq_used += 1;
        }
        Ok(())
    }

    /// One `IBV_WR_TSO` request (`wr` at index `i` of `chain`, its SGEs checked, `total`
    /// payload bytes) on port `li`: segmented in software ([`TsoPlan`]) into frames behind
    /// copies of the header template, each in its own send frame; the last frame's
    /// completion completes the request.
    #[allow(clippy::too_many_arguments)]
    fn post_tso(
        &mut self,
        qp: usize,
        li: usize,
        chain: &SendChain,
        wr: &SendWr,
        total: u64,
        signaled: bool,
        i: usize,
    ) -> std::result::Result<(), PostError> {
        let einval = |why| post_err(Errno::EINVAL, i, why);
        let Some(hdr) = chain.tso_hdr_of(wr) else {
            return Err(einval("TSO request without a header template (push it with SendChain::push_tso)"));
        };
        if hdr.len() > MAX_TSO_HEADER as usize {
            return Err(einval("TSO header longer than max_tso_header (256)"));
        }
        if total > u64::from(MAX_TSO) {
            return Err(einval("TSO payload larger than max_tso (256 KiB)"));
        }
        let plan = TsoPlan::new(hdr, wr.tso_mss(), total as usize).map_err(einval)?;
        if plan.header_len() + usize::from(wr.tso_mss()) > self.links[li].max_frame as usize {
            return Err(einval("TSO header + MSS larger than the interface MTU + 18 bytes of headers"));
        }
        let (qpn, caps) = {
            let q = self.qp(qp);
            (q.qpn, q.caps)
        };
        if self.qp(qp).sq_used >= caps.max_send_wr {
            return Err(post_err(Errno::ENOMEM, i, "send queue full"));
        }
        let sges = chain.sges_of(wr);
        let n = plan.frames();
        let l = &mut self.links[li];
        if l.free_tx.len() < n || (l.xsk.tx.free(n as u32) as usize) < n {
            return Err(post_err(Errno::ENOMEM, i, "send queue full (not enough send frames for this TSO request)"));
        }
        let h = plan.header_len();
        for k in 0..n {
            let (off, len) = plan.range(k);
            let (addr, frame) = l.take_frame(h + len).expect("counted above");
            gather(sges, off, &mut frame[h..]);
            let end = plan.write_frame(hdr, k, frame);
            let meta = TxMeta { qp: qp + 1, qpn, wr_id: wr.wr_id, signaled, last: k + 1 == n, opcode: WcOpcode::Tso };
            l.queue(addr, end, meta);
        }
        self.qp(qp).sq_used += 1;
        Ok(())
    }
}

/// Copies bytes `[off, off + out.len())` of the concatenation of `sges` into `out`.
fn gather(sges: &[Sge], mut off: usize, out: &mut [u8]) {
    let mut at = 0;
    for s in sges {
        let l = s.length as usize;
        if off >= l {
            off -= l;
            continue;
        }
        let k = (l - off).min(out.len() - at);
        // SAFETY: the SGE lies in memory registered on this device (checked at post, under
        // the device lock that deregistration takes); `off + k <= l`.
        unsafe { std::ptr::copy_nonoverlapping((s.addr as *const u8).add(off), out[at..].as_mut_ptr(), k) };
        at += k;
        off = 0;
        if at == out.len() {
            break;
        }
    }
}

fn flush_wc(wr_id: u64, qpn: u32, opcode: WcOpcode) -> WorkCompletion {
    WorkCompletion { wr_id, status: WcStatus::WrFlushErr, opcode, qp_num: qpn, ..Default::default() }
}

//! The NIC of the `xdp` provider: one AF_XDP socket per context, shared by every RAW_PACKET
//! QP of the context as one port of a switch.
//!
//! Sends of every QP go out through the socket's TX ring; received frames are steered to
//! QPs by their flow rules (`ibv_create_flow(3)`: the lowest `priority` for a unicast
//! destination, every matching QP once for a group address) and copied into the receive
//! request at the head of each target's queue. Completions are made when a CQ is polled: the
//! poll is the NIC's engine (poll mode, no hidden thread), as on `shm`.
//!
//! The whole port is behind one lock, taken once per post list and once per poll; workers
//! that own a context each never contend on it. A lock-free split (per-QP TX rings through
//! `XDP_SHARED_UMEM`) is the next step for many threads on one interface.

use super::socket::Xsk;
use super::sys::{self, XdpDesc};
use crate::net::frame::{fill_ip_checksums, FrameKey};
use crate::net::tso::TsoPlan;
use crate::verbs::{
    AccessFlags, Errno, Error, FlowId, FlowSpec, PostError, QpCaps, QpState, RecvChain, Result, SendChain, SendFlags,
    Sge, WcFlags, WcOpcode, WcStatus, WorkCompletion, WrOpcode,
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
/// Received frames handled per poll, so one poll stays short under a flood.
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

/// A QP's state in the port.
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
}

/// A CQ's queue of completions.
struct CqEntry {
    q: VecDeque<WorkCompletion>,
    depth: u32,
    overrun: bool,
    /// Owners: the CQ handle and each QP that completes on it.
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

/// Counters of the port, for `dpctl` and tests.
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

/// The port: the socket and every QP, CQ, MR and rule of one context.
pub struct Port {
    xsk: Xsk,
    free_tx: Vec<u64>,
    tx_meta: Vec<TxMeta>,
    mrs: Vec<Option<MrEntry>>,
    mr_gen: u32,
    qps: Vec<Option<QpEntry>>,
    cqs: Vec<Option<CqEntry>>,
    flows: Vec<FlowEntry>,
    flow_gen: u32,
    qpn_base: u32,
    /// Largest frame (the interface MTU plus 14 bytes of Ethernet and 4 of a VLAN tag,
    /// within one UMEM frame).
    pub max_frame: u32,
    counters: PortCounters,
}

fn post_err(errno: Errno, i: usize, why: &'static str) -> PostError {
    PostError::new(errno, i, why)
}

impl Port {
    /// A port over `xsk`; QP numbers start above `qpn_base`.
    pub fn new(xsk: Xsk, mtu: u32, qpn_base: u32) -> Port {
        let n = xsk.frames / 2;
        let base = xsk.tx_base();
        let fs = u64::from(xsk.frame_size);
        let free_tx = (0..u64::from(n)).rev().map(|k| base + k * fs).collect();
        let max_frame = (mtu + 18).min(xsk.frame_size);
        Port {
            xsk,
            free_tx,
            tx_meta: vec![TxMeta::default(); n as usize],
            mrs: Vec::new(),
            mr_gen: 0,
            qps: Vec::new(),
            cqs: Vec::new(),
            flows: Vec::new(),
            flow_gen: 0,
            qpn_base,
            max_frame,
            counters: PortCounters::default(),
        }
    }

    /// Whether the socket is bound zero-copy.
    pub fn zero_copy(&self) -> bool {
        self.xsk.zero_copy
    }

    /// Frames that may be in flight on the send side.
    pub fn send_frames(&self) -> u32 {
        self.xsk.frames / 2
    }

    /// The port's counters.
    pub fn counters(&self) -> PortCounters {
        self.counters
    }

    /// The kernel's drop counters of the socket.
    pub fn statistics(&self) -> std::io::Result<sys::XdpStatistics> {
        self.xsk.statistics()
    }

    // ---- resources ----

    /// Registers `[addr, addr + len)` for PD `pd`; returns the lkey (= rkey).
    pub fn reg_mr(&mut self, pd: u32, addr: u64, len: u64, access: AccessFlags) -> Result<u32> {
        let i = match self.mrs.iter().position(Option::is_none) {
            Some(i) => i,
            None if self.mrs.len() < 0xffff => {
                self.mrs.push(None);
                self.mrs.len() - 1
            }
            None => return Err(Error::new(Errno::ENOMEM, "reg_mr: all 65535 MRs of the device are in use")),
        };
        self.mr_gen = self.mr_gen.wrapping_add(1) & 0xffff;
        let lkey = self.mr_gen << 16 | (i as u32 + 1);
        self.mrs[i] = Some(MrEntry { lkey, pd, addr, len, access });
        Ok(lkey)
    }

    /// Deregisters `lkey`.
    pub fn dereg_mr(&mut self, lkey: u32) {
        let i = (lkey & 0xffff) as usize;
        if let Some(slot) = i.checked_sub(1).and_then(|i| self.mrs.get_mut(i)) {
            if slot.as_ref().is_some_and(|m| m.lkey == lkey) {
                *slot = None;
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

    /// Creates a CQ of `depth` entries; returns its index.
    pub fn create_cq(&mut self, depth: u32) -> usize {
        let e = CqEntry { q: VecDeque::with_capacity(depth as usize), depth, overrun: false, refs: 1 };
        match self.cqs.iter().position(Option::is_none) {
            Some(i) => {
                self.cqs[i] = Some(e);
                i
            }
            None => {
                self.cqs.push(Some(e));
                self.cqs.len() - 1
            }
        }
    }

    /// One more owner of CQ `cq` (a QP completing on it).
    pub fn retain_cq(&mut self, cq: usize) {
        if let Some(c) = self.cqs[cq].as_mut() {
            c.refs += 1;
        }
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

    /// Creates a RAW_PACKET QP in RESET; returns its index and number.
    pub fn create_qp(&mut self, pd: u32, send_cq: usize, recv_cq: usize, caps: QpCaps, sig_all: bool) -> (usize, u32) {
        let i = match self.qps.iter().position(Option::is_none) {
            Some(i) => i,
            None => {
                self.qps.push(None);
                self.qps.len() - 1
            }
        };
        let qpn = self.qpn_base + i as u32 + 1;
        self.qps[i] = Some(QpEntry {
            qpn,
            pd,
            state: QpState::Reset,
            send_cq,
            recv_cq,
            sig_all,
            caps,
            rq: VecDeque::with_capacity(caps.max_recv_wr as usize),
            sq_used: 0,
        });
        (i, qpn)
    }

    /// Destroys QP `qp` and its rules; its frames in flight complete to nobody.
    pub fn destroy_qp(&mut self, qp: usize) {
        self.qps[qp] = None;
        self.flows.retain(|f| f.qp != qp);
        for m in &mut self.tx_meta {
            if m.qp == qp + 1 {
                m.qp = 0;
            }
        }
    }

    fn qp(&mut self, qp: usize) -> &mut QpEntry {
        self.qps[qp].as_mut().expect("a QP handle outlives its port entry")
    }

    /// The QP's state.
    pub fn qp_state(&mut self, qp: usize) -> QpState {
        self.qp(qp).state
    }

    /// Moves QP `qp` to `to` (the caller checked the transition). Entering ERROR flushes the
    /// posted receives; entering RESET drops them.
    pub fn set_state(&mut self, qp: usize, to: QpState) {
        let e = self.qp(qp);
        e.state = to;
        match to {
            QpState::Error => {
                let (qpn, cq) = (e.qpn, e.recv_cq);
                let flushed: Vec<u64> = e.rq.drain(..).map(|r| r.wr_id).collect();
                for wr_id in flushed {
                    self.complete(cq, flush_wc(wr_id, qpn, WcOpcode::Recv));
                }
            }
            QpState::Reset => e.rq.clear(),
            _ => {}
        }
    }

    /// Installs rule `spec` for QP `qp`.
    pub fn create_flow(&mut self, qp: usize, spec: &FlowSpec) -> Result<FlowId> {
        if self.flows.len() >= 4096 {
            return Err(Error::new(Errno::ENOMEM, "create_flow: all 4096 steering rules of the port are in use"));
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

    /// Progresses the port, then moves up to `wc.len()` completions of CQ `cq` into `wc`.
    ///
    /// Errors: `EIO` once the CQ overran (as a NIC's CQ error).
    pub fn poll(&mut self, cq: usize, wc: &mut [WorkCompletion]) -> Result<usize> {
        self.progress();
        let c = self.cqs[cq].as_mut().expect("a CQ handle outlives its port entry");
        if c.overrun {
            return Err(Error::new(Errno::EIO, "CQ overrun: more completions than its depth were pending"));
        }
        let n = wc.len().min(c.q.len());
        for (w, v) in wc.iter_mut().zip(c.q.drain(..n)) {
            *w = v;
        }
        Ok(n)
    }

    /// Runs the NIC: reaps sent frames, delivers received ones, kicks TX if the kernel left
    /// frames behind.
    pub fn progress(&mut self) {
        let n = self.xsk.comp.ready();
        for k in 0..n {
            let addr = self.xsk.comp.peek(k);
            self.sent(addr);
        }
        if n > 0 {
            self.xsk.comp.release(n);
        }
        let n = self.xsk.rx.ready().min(RX_BUDGET);
        if n > 0 {
            let fs = u64::from(self.xsk.frame_size);
            // Room for every frame taken: the kernel consumed each from the fill ring before
            // it could fill it (this refreshes our view of its consumer index).
            let room = self.xsk.fill.free(n);
            debug_assert!(room >= n);
            for k in 0..n {
                let d = self.xsk.rx.peek(k);
                self.received(d);
                // The frame goes back to the fill ring (sized to hold every receive frame).
                self.xsk.fill.push(d.addr - d.addr % fs);
            }
            self.xsk.rx.release(n);
            self.xsk.fill.publish();
        }
        if self.xsk.fill.needs_wakeup() {
            sys::kick_rx(&self.xsk.fd);
        }
        if self.xsk.tx.in_flight() > 0 {
            self.kick();
        }
    }

    fn kick(&mut self) {
        if self.xsk.tx.needs_wakeup() || !self.xsk.zero_copy {
            self.counters.tx_kicks += 1;
            // A hard error (the interface went away) shows as frames that never complete.
            let _ = sys::kick_tx(&self.xsk.fd);
        }
    }

    /// A send frame came back on the completion ring.
    fn sent(&mut self, addr: u64) {
        let fs = u64::from(self.xsk.frame_size);
        let Some(k) = addr.checked_sub(self.xsk.tx_base()).map(|o| (o / fs) as usize) else { return };
        let Some(m) = self.tx_meta.get(k).copied() else { return };
        self.tx_meta[k] = TxMeta::default();
        self.free_tx.push(self.xsk.tx_base() + k as u64 * fs);
        self.counters.tx_frames += 1;
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

    /// A frame arrived: steer it and copy it into each target's receive request.
    fn received(&mut self, d: XdpDesc) {
        self.counters.rx_frames += 1;
        let len = d.len as usize;
        let Some(src) = self.xsk.frame_ptr(d.addr, len) else { return };
        // SAFETY: the frame is inside the UMEM (checked by `frame_ptr`) and is ours until it
        // goes back to the fill ring; nothing writes it meanwhile.
        let frame = unsafe { std::slice::from_raw_parts(src as *const u8, len) };
        let key = FrameKey::parse(frame);
        let mut targets = [0usize; 64];
        let n = self.targets(&key, &mut targets);
        if n == 0 {
            self.counters.rx_no_rule += 1;
        }
        for &qi in &targets[..n] {
            self.deliver(qi, frame);
        }
    }

    /// The QPs a frame with `key` goes to.
    fn targets(&self, key: &FrameKey, out: &mut [usize]) -> usize {
        let live = |f: &&FlowEntry| self.qps[f.qp].as_ref().is_some_and(|q| q.state.receives()) && f.spec.matches(key);
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
            // The lowest priority wins; among equals, the oldest rule.
            match self.flows.iter().filter(live).min_by_key(|f| f.spec.priority) {
                Some(f) => {
                    out[0] = f.qp;
                    1
                }
                None => 0,
            }
        }
    }

    fn deliver(&mut self, qi: usize, frame: &[u8]) {
        let (qpn, cq, pd) = {
            let q = self.qps[qi].as_ref().expect("targets are live QPs");
            (q.qpn, q.recv_cq, q.pd)
        };
        let Some(r) = self.qps[qi].as_mut().and_then(|q| q.rq.pop_front()) else {
            self.counters.rx_no_recv += 1;
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
                // SAFETY: the destination lies in a live MR of this QP's PD (checked just
                // above under the port lock, which deregistration also takes), i.e. in a
                // mapped region this process registered; the source is the UMEM frame.
                unsafe { std::ptr::copy_nonoverlapping(frame[at..].as_ptr(), s.addr as *mut u8, k) };
                at += k;
                if at == frame.len() {
                    break;
                }
            }
            wc.status = WcStatus::Success;
            wc.byte_len = frame.len() as u32;
            self.counters.rx_delivered += 1;
        }
        wc.wc_flags = WcFlags::empty();
        self.complete(cq, wc);
    }

    // ---- posting ----

    /// `ibv_post_recv` on QP `qp`.
    pub fn post_recv(&mut self, qp: usize, chain: &RecvChain) -> std::result::Result<(), PostError> {
        let (pd, state, caps) = {
            let q = self.qp(qp);
            (q.pd, q.state, q.caps)
        };
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
            let q = self.qp(qp);
            if q.rq.len() >= caps.max_recv_wr as usize {
                return Err(post_err(Errno::ENOMEM, i, "receive queue full"));
            }
            if state == QpState::Error {
                let (qpn, cq) = (q.qpn, q.recv_cq);
                self.complete(cq, flush_wc(wr.wr_id, qpn, WcOpcode::Recv));
            } else {
                let mut e = RecvEntry { wr_id: wr.wr_id, n: sges.len() as u8, sges: [Sge::default(); MAX_SGE] };
                e.sges[..sges.len()].copy_from_slice(sges);
                q.rq.push_back(e);
            }
        }
        Ok(())
    }

    /// `ibv_post_send` on QP `qp`: each request is checked, copied into a send frame of the
    /// UMEM and put on the TX ring; one doorbell for the list.
    pub fn post_send(&mut self, qp: usize, chain: &SendChain) -> std::result::Result<(), PostError> {
        let r = self.post_send_inner(qp, chain);
        self.xsk.tx.publish();
        self.kick();
        r
    }

    fn post_send_inner(&mut self, qp: usize, chain: &SendChain) -> std::result::Result<(), PostError> {
        let (pd, state, caps, sig_all, qpn, send_cq) = {
            let q = self.qp(qp);
            (q.pd, q.state, q.caps, q.sig_all, q.qpn, q.send_cq)
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
            if sges.len() > caps.max_send_sge as usize {
                return Err(post_err(Errno::EINVAL, i, "more SGEs than the QP's max_send_sge"));
            }
            let total: u64 = match inline {
                Some(b) => b.len() as u64,
                None => {
                    for s in sges {
                        // Inline SGEs are not checked against the PD, but must be memory
                        // registered on this device (memory this process can read).
                        let ok = if is_inline {
                            self.mr(s.lkey).is_some() || self.mrs.iter().flatten().any(|m| in_mr(m, s))
                        } else {
                            self.check_sge(pd, s, false).is_ok()
                        };
                        if !ok {
                            let why = if is_inline {
                                "inline SGE outside registered memory"
                            } else {
                                "bad SGE (lkey, PD or bounds)"
                            };
                            return Err(post_err(Errno::EINVAL, i, why));
                        }
                    }
                    sges.iter().map(|s| u64::from(s.length)).sum()
                }
            };
            if is_inline && total > u64::from(caps.max_inline_data) {
                return Err(post_err(Errno::EINVAL, i, "inline data longer than the QP's max_inline_data"));
            }
            if wr.opcode == WrOpcode::Tso {
                if is_inline {
                    return Err(post_err(Errno::EINVAL, i, "IBV_SEND_INLINE is valid only for Send and RDMA Write"));
                }
                let signaled = sig_all || wr.flags.contains(SendFlags::SIGNALED);
                self.post_tso(qp, chain, wr, sges, total, signaled, i)?;
                continue;
            }
            if total < 14 {
                return Err(post_err(Errno::EINVAL, i, "a RAW_PACKET send must hold an Ethernet header (14 bytes)"));
            }
            if total > u64::from(self.max_frame) {
                return Err(post_err(Errno::EINVAL, i, "frame larger than the interface MTU + 18 bytes of headers"));
            }
            let signaled = sig_all || wr.flags.contains(SendFlags::SIGNALED);
            if state == QpState::Error {
                self.complete(send_cq, flush_wc(wr.wr_id, qpn, WcOpcode::Send));
                continue;
            }
            if self.qp(qp).sq_used >= caps.max_send_wr {
                return Err(post_err(Errno::ENOMEM, i, "send queue full"));
            }
            if self.xsk.tx.free(1) == 0 {
                return Err(post_err(Errno::ENOMEM, i, "send queue full (the port's TX ring is full)"));
            }
            let Some(addr) = self.free_tx.pop() else {
                return Err(post_err(Errno::ENOMEM, i, "send queue full (every send frame of the port is in flight)"));
            };
            let dst = self.xsk.frame_ptr(addr, total as usize).expect("send frames lie in the UMEM");
            // SAFETY: `dst` is a send frame of the UMEM that no one else uses until the
            // completion ring returns it (it came off the free list); `total` fits it.
            let frame = unsafe { std::slice::from_raw_parts_mut(dst, total as usize) };
            match inline {
                Some(b) => frame.copy_from_slice(b),
                None => {
                    let mut at = 0;
                    for s in sges {
                        let k = s.length as usize;
                        // SAFETY: the source lies in memory registered on this device
                        // (checked above, under the port lock that deregistration takes).
                        unsafe { std::ptr::copy_nonoverlapping(s.addr as *const u8, frame[at..].as_mut_ptr(), k) };
                        at += k;
                    }
                }
            }
            if wr.flags.contains(SendFlags::IP_CSUM) {
                fill_ip_checksums(frame);
            }
            let k = ((addr - self.xsk.tx_base()) / u64::from(self.xsk.frame_size)) as usize;
            self.tx_meta[k] = TxMeta { qp: qp + 1, qpn, wr_id: wr.wr_id, signaled, last: true, opcode: WcOpcode::Send };
            self.xsk.tx.push(XdpDesc { addr, len: total as u32, options: 0 });
            self.qp(qp).sq_used += 1;
        }
        Ok(())
    }
}

impl Port {
    /// One `IBV_WR_TSO` request (`wr` at index `i`, its SGEs checked, `total` payload bytes):
    /// segmented in software ([`TsoPlan`]) into frames behind copies of the header template,
    /// each in its own send frame; the last frame's completion completes the request.
    #[allow(clippy::too_many_arguments)]
    fn post_tso(
        &mut self,
        qp: usize,
        chain: &SendChain,
        wr: &crate::verbs::SendWr,
        sges: &[Sge],
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
        if plan.header_len() + usize::from(wr.tso_mss()) > self.max_frame as usize {
            return Err(einval("TSO header + MSS larger than the interface MTU + 18 bytes of headers"));
        }
        let (qpn, caps) = {
            let q = self.qp(qp);
            (q.qpn, q.caps)
        };
        if self.qp(qp).sq_used >= caps.max_send_wr {
            return Err(post_err(Errno::ENOMEM, i, "send queue full"));
        }
        let n = plan.frames();
        if self.free_tx.len() < n || (self.xsk.tx.free(n as u32) as usize) < n {
            return Err(post_err(Errno::ENOMEM, i, "send queue full (not enough send frames for this TSO request)"));
        }
        let h = plan.header_len();
        let fs = u64::from(self.xsk.frame_size);
        for k in 0..n {
            let (off, len) = plan.range(k);
            let addr = self.free_tx.pop().expect("counted above");
            let dst = self.xsk.frame_ptr(addr, h + len).expect("send frames lie in the UMEM");
            // SAFETY: a send frame off the free list, ours until the completion ring returns
            // it; `h + len` fits it (header + MSS <= max_frame <= frame size, checked above).
            let frame = unsafe { std::slice::from_raw_parts_mut(dst, h + len) };
            gather(sges, off, &mut frame[h..]);
            let end = plan.write_frame(hdr, k, frame);
            let last = k + 1 == n;
            let slot = ((addr - self.xsk.tx_base()) / fs) as usize;
            self.tx_meta[slot] = TxMeta { qp: qp + 1, qpn, wr_id: wr.wr_id, signaled, last, opcode: WcOpcode::Tso };
            self.xsk.tx.push(XdpDesc { addr, len: end as u32, options: 0 });
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
        // the port lock that deregistration takes); `off + k <= l`.
        unsafe { std::ptr::copy_nonoverlapping((s.addr as *const u8).add(off), out[at..].as_mut_ptr(), k) };
        at += k;
        off = 0;
        if at == out.len() {
            break;
        }
    }
}

fn in_mr(m: &MrEntry, s: &Sge) -> bool {
    s.addr >= m.addr && s.addr.checked_add(u64::from(s.length)).is_some_and(|e| e <= m.addr + m.len)
}

fn flush_wc(wr_id: u64, qpn: u32, opcode: WcOpcode) -> WorkCompletion {
    WorkCompletion { wr_id, status: WcStatus::WrFlushErr, opcode, qp_num: qpn, ..Default::default() }
}

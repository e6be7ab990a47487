//! The `xdp` provider: RAW_PACKET QPs on real Linux interfaces through AF_XDP.
//!
//! One context is one queue of each of its interfaces (`XdpConfig::interfaces`, `queue`),
//! which are its ports 1, 2, ...: opening it attaches, on each, a six-instruction XDP program (`bpf.rs`) that redirects the queue's frames to an
//! AF_XDP socket (`socket.rs`) whose UMEM is hugepage-backed memory of the project, bound
//! zero-copy where the driver can and in copy mode otherwise (veth), as `XdpMode::Auto`
//! chooses and [`XdpContext::zero_copy`] reports. Each socket is a port of a small switch
//! (`port.rs`): a RAW_PACKET QP sends through the port it was bound to at INIT, and frames
//! received on a port go to its QPs whose flow rules match, as on a NIC with
//! `ibv_create_flow`.
//!
//! Semantics follow the seed table's RAW_PACKET column: SEND only (with `IBV_SEND_IP_CSUM`
//! done in software, `INLINE` up to `max_inline_data`), frames land at offset 0 of the
//! receive buffer with no GRH, a QP without a posted receive drops the frame (Ethernet has no
//! RNR), `IBV_WR_TSO` segmented in software, SRQs shared by QPs of any port. Not here yet:
//! completion channels, async events (each refused with its
//! errno). docs/xdp-provider.md has the design and its measurements.

mod bpf;
mod port;
mod ring;
mod socket;
pub mod sys;

pub use port::PortCounters;
pub use socket::XdpMode;

use crate::mem::{HugePolicy, Region};
use crate::provider::{Ah, Context, Cq, MemRegion, Mr, Pd, Provider, Qp, QpInitAttr, Srq, Xrcd};
use crate::verbs::{
    AccessFlags, AhAttr, AhHandle, AsyncEvent, DeviceCaps, Endpoint, Errno, Error, FlowId, FlowSpec, PortAttr,
    PortState, PostError, QpAttr, QpCaps, QpState, QpType, RecvChain, Result, SendChain, SrqAttr, SrqAttrMask,
    WorkCompletion,
};
use port::Port;
use socket::{Xsk, XskSizes};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// The `xdp` provider.
pub struct Xdp;

/// How to open an `xdp` device: one queue of each of one or more interfaces, which become
/// its ports 1, 2, ... (a QP picks its port at INIT, `port_num`).
#[derive(Debug, Clone)]
pub struct XdpConfig {
    /// Interface names (`eth0`, `veth0`), port 1 first.
    pub interfaces: Vec<String>,
    /// Queue of each interface (0 on veth).
    pub queue: u32,
    /// UMEM frames per port (a power of two >= 64); half receive, half send.
    pub frames: u32,
    /// Bytes per UMEM frame, 2048 or 4096: bounds the largest frame.
    pub frame_size: u32,
    /// Zero-copy, copy, or the best the driver has.
    pub mode: XdpMode,
}

impl XdpConfig {
    /// Queue 0 of `ifname` as the one port, with 4096 frames of 2048 bytes, mode `Auto`.
    pub fn new(ifname: &str) -> XdpConfig {
        Self::ports(&[ifname])
    }

    /// Queue 0 of each of `ifnames` as ports 1, 2, ...; the other settings as [`new`](Self::new).
    pub fn ports(ifnames: &[&str]) -> XdpConfig {
        XdpConfig {
            interfaces: ifnames.iter().map(|s| (*s).to_owned()).collect(),
            queue: 0,
            frames: 4096,
            frame_size: 2048,
            mode: XdpMode::Auto,
        }
    }
}

/// Distinguishes contexts in QP numbers (each context numbers its QPs from its base).
static NEXT_CTX: AtomicU32 = AtomicU32::new(1);

/// One port's interface.
struct Iface {
    name: String,
    mac: [u8; 6],
    mtu: u32,
    redirect: bpf::Redirect,
}

struct CtxInner {
    port: Mutex<Port>,
    // Dropped after the device (fields drop in order): the sockets close, then the
    // programs detach.
    ifaces: Vec<Iface>,
    queue: u32,
    next_pd: AtomicU32,
}

impl CtxInner {
    /// The device, locked. A poisoned lock (a panic while holding it) is taken over: the
    /// device's state is updated only at points where it is consistent.
    fn port(&self) -> MutexGuard<'_, Port> {
        self.port.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Port `port` (1-based) as an index. Errors: `EINVAL` naming the ports.
    fn link(&self, port: u8) -> Result<usize> {
        let n = self.ifaces.len();
        match usize::from(port) {
            p @ 1.. if p <= n => Ok(p - 1),
            _ => Err(Error::new(Errno::EINVAL, format!("xdp: port {port} does not exist (ports 1..={n})"))),
        }
    }
}

impl Drop for CtxInner {
    fn drop(&mut self) {
        for i in &self.ifaces {
            let _ = i.redirect.clear(self.queue);
        }
    }
}

/// An open `xdp` device: one queue of each of its interfaces.
pub struct XdpContext {
    inner: Arc<CtxInner>,
}

impl XdpContext {
    /// Whether port `port`'s socket is bound zero-copy (`false`: copy mode).
    pub fn zero_copy(&self, port: u8) -> bool {
        self.inner.link(port).is_ok_and(|l| self.inner.port().zero_copy(l))
    }

    /// The MAC address of port `port`'s interface (1-based; `None` for no such port).
    pub fn mac(&self, port: u8) -> Option<[u8; 6]> {
        self.inner.link(port).ok().map(|l| self.inner.ifaces[l].mac)
    }

    /// The interface name of port `port`.
    pub fn ifname(&self, port: u8) -> Option<&str> {
        self.inner.link(port).ok().map(|l| self.inner.ifaces[l].name.as_str())
    }

    /// Port `port`'s counters (frames received, delivered, dropped by reason, sent, doorbells).
    pub fn counters(&self, port: u8) -> Result<PortCounters> {
        let l = self.inner.link(port)?;
        Ok(self.inner.port().counters(l))
    }

    /// The kernel's drop counters of port `port`'s socket (`XDP_STATISTICS`).
    pub fn kernel_statistics(&self, port: u8) -> Result<sys::XdpStatistics> {
        let l = self.inner.link(port)?;
        self.inner.port().statistics(l).map_err(|e| Error::new(Errno::EIO, format!("XDP_STATISTICS: {e}")))
    }
}

fn open_iface(cfg: &XdpConfig, name: &str) -> Result<(Iface, Xsk)> {
    let ifindex =
        sys::if_index(name).map_err(|e| Error::new(Errno::ENODEV, format!("xdp: no interface {name:?}: {e}")))?;
    let mac = sys::if_hwaddr(name)
        .map_err(|e| Error::new(Errno::EINVAL, format!("xdp: {name} has no Ethernet address: {e}")))?;
    let mtu = sys::if_mtu(name).map_err(|e| Error::new(Errno::ENODEV, format!("xdp: {name}: SIOCGIFMTU: {e}")))?;
    let errno = |m: &str| {
        if m.contains("Operation not permitted") {
            Errno::EPERM
        } else if m.contains("busy") {
            Errno::EBUSY
        } else {
            Errno::EINVAL
        }
    };
    let redirect = bpf::Redirect::attach(ifindex, cfg.queue + 1)
        .map_err(|m| Error::new(errno(&m), format!("xdp: {name}: {m}")))?;
    let sizes = XskSizes { frames: cfg.frames, frame_size: cfg.frame_size };
    let xsk =
        Xsk::open(name, ifindex, cfg.queue, sizes, cfg.mode).map_err(|m| Error::new(errno(&m), format!("xdp: {m}")))?;
    redirect
        .set(cfg.queue, &xsk.fd)
        .map_err(|e| Error::new(Errno::EINVAL, format!("xdp: {name}: XSKMAP update: {e}")))?;
    Ok((Iface { name: name.to_owned(), mac, mtu, redirect }, xsk))
}

impl Provider for Xdp {
    const NAME: &'static str = "xdp";
    type Config = XdpConfig;
    type Context = XdpContext;
    type Pd = XdpPd;
    type Mr = XdpMr;
    type Cq = XdpCq;
    type Qp = XdpQp;
    type Srq = XdpSrq;
    type Ah = XdpAh;
    type Region = XdpRegion;
    type Xrcd = XdpXrcd;

    /// Opens queue `cfg.queue` of each of `cfg.interfaces`.
    ///
    /// Errors: `ENODEV` for an interface that does not exist; `EINVAL` for bad sizes or no
    /// interface; `EPERM` without `CAP_NET_ADMIN`/`CAP_BPF` (run as root); `EBUSY` when
    /// another XDP program or AF_XDP socket holds an interface's queue; each naming the step.
    fn open(cfg: &XdpConfig) -> Result<XdpContext> {
        if cfg.interfaces.is_empty() || cfg.interfaces.len() > 16 {
            return Err(Error::new(Errno::EINVAL, "xdp: give 1 to 16 interfaces"));
        }
        let mut ifaces = Vec::new();
        let mut xsks = Vec::new();
        for name in &cfg.interfaces {
            let (i, x) = open_iface(cfg, name)?;
            xsks.push((x, i.mtu));
            ifaces.push(i);
        }
        let base = NEXT_CTX.fetch_add(1, Ordering::Relaxed) << 16;
        Ok(XdpContext {
            inner: Arc::new(CtxInner {
                port: Mutex::new(Port::new(xsks, base)),
                ifaces,
                queue: cfg.queue,
                next_pd: AtomicU32::new(1),
            }),
        })
    }
}

impl Context<Xdp> for XdpContext {
    fn caps(&self) -> DeviceCaps {
        let port = self.inner.port();
        let frames = port.send_frames();
        let max_frame = (0..port.ports()).map(|l| port.max_frame(l)).min().unwrap_or(0);
        drop(port);
        DeviceCaps {
            max_qp: 4096,
            max_qp_wr: frames,
            max_sge: port::MAX_SGE as u32,
            max_inline_data: port::MAX_INLINE,
            max_cq: 4096,
            max_cqe: 1 << 20,
            max_mr: 0xffff,
            max_mr_size: 1 << 46,
            max_pd: 1 << 20,
            max_msg_size: max_frame,
            max_srq: 4096,
            max_srq_wr: 1 << 16,
            max_srq_sge: port::MAX_SGE as u32,
            raw_ip_csum: true,
            max_tso: port::MAX_TSO,
            max_tso_header: port::MAX_TSO_HEADER,
            ..Default::default()
        }
    }

    fn port_attr(&self, port: u8) -> Result<PortAttr> {
        let i = &self.inner.ifaces[self.inner.link(port)?];
        let up = sys::if_running(&i.name);
        Ok(PortAttr {
            state: if up { PortState::Active } else { PortState::Down },
            active_mtu: i.mtu,
            max_mtu: i.mtu,
            lid: 0,
            gid_tbl_len: 1,
        })
    }

    /// GID 0: the interface's IPv6 link-local address (EUI-64 of its MAC), as RoCE names a port.
    fn gid(&self, port: u8, index: u8) -> Result<[u8; 16]> {
        let l = self.inner.link(port)?;
        if index != 0 {
            return Err(Error::new(Errno::EINVAL, format!("xdp: no GID {index} on port {port} (one GID: 0)")));
        }
        let m = self.inner.ifaces[l].mac;
        Ok([0xfe, 0x80, 0, 0, 0, 0, 0, 0, m[0] ^ 2, m[1], m[2], 0xff, 0xfe, m[3], m[4], m[5]])
    }

    fn alloc_pd(&self) -> Result<XdpPd> {
        Ok(XdpPd { ctx: self.inner.clone(), pdn: self.inner.next_pd.fetch_add(1, Ordering::Relaxed) })
    }

    fn create_cq(&self, cqe: u32) -> Result<XdpCq> {
        if cqe == 0 || cqe > 1 << 20 {
            return Err(Error::new(Errno::EINVAL, format!("create_cq: {cqe} entries (1..=1048576)")));
        }
        let idx = self.inner.port().create_cq(cqe);
        Ok(XdpCq { ctx: self.inner.clone(), idx, depth: cqe })
    }

    fn alloc_region(&self, len: usize) -> Result<XdpRegion> {
        Ok(XdpRegion { inner: Arc::new(Region::anonymous(len, HugePolicy::default())?), len })
    }

    fn poll_async_event(&self) -> Option<AsyncEvent> {
        self.inner.port().next_event()
    }

    /// Per port `p<N>.<interface>.`: `zero_copy` (1, or 0 in copy mode), `rx_frames`,
    /// `rx_delivered`, `rx_no_rule`, `rx_no_recv`, `tx_frames`, `tx_kicks`, and the kernel's `XDP_STATISTICS` as `kernel_rx_dropped`,
    /// `kernel_rx_ring_full`, `kernel_rx_fill_ring_empty`, `kernel_rx_invalid_descs`,
    /// `kernel_tx_invalid_descs`, `kernel_tx_ring_empty`.
    fn device_counters(&self) -> Vec<(String, u64)> {
        let port = self.inner.port();
        let mut out = Vec::new();
        for (l, i) in self.inner.ifaces.iter().enumerate() {
            let p = format!("p{}.{}.", l + 1, i.name);
            let c = port.counters(l);
            for (k, v) in [
                // The bind mode XdpMode::Auto got: 1 zero-copy, 0 copy (veth).
                ("zero_copy", u64::from(port.zero_copy(l))),
                ("rx_frames", c.rx_frames),
                ("rx_delivered", c.rx_delivered),
                ("rx_no_rule", c.rx_no_rule),
                ("rx_no_recv", c.rx_no_recv),
                ("tx_frames", c.tx_frames),
                ("tx_kicks", c.tx_kicks),
            ] {
                out.push((format!("{p}{k}"), v));
            }
            if let Ok(s) = port.statistics(l) {
                for (k, v) in [
                    ("kernel_rx_dropped", s.rx_dropped),
                    ("kernel_rx_ring_full", s.rx_ring_full),
                    ("kernel_rx_fill_ring_empty", s.rx_fill_ring_empty_descs),
                    ("kernel_rx_invalid_descs", s.rx_invalid_descs),
                    ("kernel_tx_invalid_descs", s.tx_invalid_descs),
                    ("kernel_tx_ring_empty", s.tx_ring_empty_descs),
                ] {
                    out.push((format!("{p}{k}"), v));
                }
            }
        }
        out
    }
}

/// Memory registrable on an `xdp` device (hugepage-backed when huge pages are free).
pub struct XdpRegion {
    inner: Arc<Region>,
    len: usize,
}

impl MemRegion for XdpRegion {
    fn as_ptr(&self) -> *mut u8 {
        self.inner.as_ptr()
    }
    fn len(&self) -> usize {
        self.len
    }
}

/// A protection domain of an `xdp` device.
pub struct XdpPd {
    ctx: Arc<CtxInner>,
    pdn: u32,
}

impl Pd<Xdp> for XdpPd {
    fn reg_mr(&self, region: &XdpRegion, offset: usize, len: usize, access: AccessFlags) -> Result<XdpMr> {
        if len == 0 || offset.checked_add(len).is_none_or(|e| e > region.len) {
            return Err(Error::new(
                Errno::EINVAL,
                format!("reg_mr: [{offset}, +{len}) is outside the {} byte region", region.len),
            ));
        }
        if access.intersects(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC)
            && !access.contains(AccessFlags::LOCAL_WRITE)
        {
            return Err(Error::new(Errno::EINVAL, "reg_mr: REMOTE_WRITE and REMOTE_ATOMIC need LOCAL_WRITE"));
        }
        let addr = region.addr(offset);
        let lkey = self.ctx.port().reg_mr(self.pdn, addr, len as u64, access)?;
        Ok(XdpMr { ctx: self.ctx.clone(), _region: region.inner.clone(), lkey, addr, len })
    }

    /// Creates a RAW_PACKET QP (on port 1 until INIT names another). Errors: `EOPNOTSUPP`
    /// for other QP types; `EINVAL` for CQs or an SRQ of another context, zero depths, or
    /// depths and SGEs above the caps.
    fn create_qp(&self, attr: &QpInitAttr<'_, Xdp>) -> Result<XdpQp> {
        if attr.qp_type != QpType::RawPacket {
            return Err(Error::new(
                Errno::EOPNOTSUPP,
                format!("the xdp provider has RAW_PACKET QPs only ({:?} asked)", attr.qp_type),
            ));
        }
        let same = |c: &Arc<CtxInner>| Arc::ptr_eq(c, &self.ctx);
        if !same(&attr.send_cq.ctx) || !same(&attr.recv_cq.ctx) || attr.srq.is_some_and(|x| !same(&x.ctx)) {
            return Err(Error::new(Errno::EINVAL, "create_qp: a CQ or SRQ of another device"));
        }
        let c = attr.cap;
        let mut port = self.ctx.port();
        let max_wr = port.send_frames();
        let recv_ok = attr.srq.is_some() || (1..=1 << 16).contains(&c.max_recv_wr);
        if c.max_send_wr == 0 || c.max_send_wr > max_wr || !recv_ok {
            return Err(Error::new(
                Errno::EINVAL,
                format!(
                    "create_qp: max_send_wr {} (1..={max_wr}), max_recv_wr {} (1..=65536 without an SRQ)",
                    c.max_send_wr, c.max_recv_wr
                ),
            ));
        }
        if c.max_send_sge as usize > port::MAX_SGE
            || c.max_recv_sge as usize > port::MAX_SGE
            || c.max_inline_data > port::MAX_INLINE
        {
            return Err(Error::new(
                Errno::EINVAL,
                format!("create_qp: at most {} SGEs and {} inline bytes", port::MAX_SGE, port::MAX_INLINE),
            ));
        }
        let caps = QpCaps { max_send_sge: c.max_send_sge.max(1), max_recv_sge: c.max_recv_sge.max(1), ..c };
        let cqs = (attr.send_cq.idx, attr.recv_cq.idx);
        let (idx, qpn) = port.create_qp(self.pdn, cqs, attr.srq.map(|x| x.idx), caps, attr.sq_sig_all);
        drop(port);
        Ok(XdpQp { ctx: self.ctx.clone(), idx, qpn, caps })
    }

    /// Creates an SRQ. Errors: `EINVAL` for `max_wr` 0 or above 65536, `max_sge` 0 or above
    /// the caps.
    fn create_srq(&self, attr: &SrqAttr) -> Result<XdpSrq> {
        if !(1..=1 << 16).contains(&attr.max_wr) || !(1..=port::MAX_SGE as u32).contains(&attr.max_sge) {
            return Err(Error::new(
                Errno::EINVAL,
                format!(
                    "create_srq: max_wr {} (1..=65536), max_sge {} (1..={})",
                    attr.max_wr,
                    attr.max_sge,
                    port::MAX_SGE
                ),
            ));
        }
        let (idx, srqn) = self.ctx.port().create_srq(self.pdn, attr.max_wr, attr.max_sge);
        Ok(XdpSrq { ctx: self.ctx.clone(), idx, srqn })
    }

    fn create_ah(&self, _attr: &AhAttr) -> Result<XdpAh> {
        Err(Error::new(
            Errno::EOPNOTSUPP,
            "the xdp provider has no address handles (RAW_PACKET frames carry their own)",
        ))
    }
}

/// A registered memory region of an `xdp` device.
pub struct XdpMr {
    ctx: Arc<CtxInner>,
    _region: Arc<Region>,
    lkey: u32,
    addr: u64,
    len: usize,
}

impl Mr for XdpMr {
    fn lkey(&self) -> u32 {
        self.lkey
    }
    fn rkey(&self) -> u32 {
        self.lkey
    }
    fn addr(&self) -> u64 {
        self.addr
    }
    fn len(&self) -> usize {
        self.len
    }
}

impl Drop for XdpMr {
    fn drop(&mut self) {
        self.ctx.port().dereg_mr(self.lkey);
    }
}

/// A completion queue of an `xdp` device. Polling it runs the port (sent frames reaped,
/// received frames steered and copied).
pub struct XdpCq {
    ctx: Arc<CtxInner>,
    idx: usize,
    depth: u32,
}

impl Drop for XdpCq {
    fn drop(&mut self) {
        self.ctx.port().destroy_cq(self.idx);
    }
}

impl Cq for XdpCq {
    fn poll(&mut self, wc: &mut [WorkCompletion]) -> Result<usize> {
        self.ctx.port().poll(self.idx, wc)
    }
    fn depth(&self) -> u32 {
        self.depth
    }
}

/// A RAW_PACKET QP of an `xdp` device.
pub struct XdpQp {
    ctx: Arc<CtxInner>,
    idx: usize,
    qpn: u32,
    caps: QpCaps,
}

impl Drop for XdpQp {
    fn drop(&mut self) {
        self.ctx.port().destroy_qp(self.idx);
    }
}

impl Qp for XdpQp {
    fn qp_num(&self) -> u32 {
        self.qpn
    }
    fn qp_type(&self) -> QpType {
        QpType::RawPacket
    }
    fn state(&self) -> QpState {
        self.ctx.port().qp_state(self.idx)
    }
    fn caps(&self) -> QpCaps {
        self.caps
    }
    fn endpoint(&self, gid_index: u8) -> Result<Endpoint> {
        let ctx = XdpContext { inner: self.ctx.clone() };
        Ok(Endpoint { lid: 0, qpn: self.qpn, psn: 0, gid: ctx.gid(1, gid_index)? })
    }
    fn modify(&mut self, attr: &QpAttr) -> Result<()> {
        let mut port = self.ctx.port();
        let from = port.qp_state(self.idx);
        from.check_transition(attr.state, self.qpn)?;
        if attr.state == QpState::Init && from == QpState::Reset {
            // Port 0 (unset) means port 1, as in the bring-up helpers.
            let link = self
                .ctx
                .link(attr.port_num.max(1))
                .map_err(|e| Error::new(e.errno, format!("modify QP {:#x}: {}", self.qpn, e.msg)))?;
            port.set_link(self.idx, link);
        }
        port.set_state(self.idx, attr.state);
        Ok(())
    }
    fn post_send(&mut self, chain: &SendChain) -> std::result::Result<(), PostError> {
        self.ctx.port().post_send(self.idx, chain)
    }
    fn post_recv(&mut self, chain: &RecvChain) -> std::result::Result<(), PostError> {
        self.ctx.port().post_recv(self.idx, chain)
    }
    fn attach_mcast(&mut self, _gid: &[u8; 16], _lid: u16) -> Result<()> {
        Err(Error::new(Errno::EINVAL, format!("attach_mcast: QP {:#x} is RAW_PACKET; multicast groups are for UD QPs (steer group MACs with create_flow)", self.qpn)))
    }
    fn detach_mcast(&mut self, _gid: &[u8; 16], _lid: u16) -> Result<()> {
        Err(Error::new(Errno::EINVAL, format!("detach_mcast: QP {:#x} is RAW_PACKET", self.qpn)))
    }
    fn create_flow(&mut self, spec: &FlowSpec) -> Result<FlowId> {
        self.ctx.port().create_flow(self.idx, spec)
    }
    fn destroy_flow(&mut self, id: FlowId) -> Result<()> {
        self.ctx.port().destroy_flow(self.idx, id)
    }
}

/// A shared receive queue of an `xdp` device: the receives of every QP created on it.
pub struct XdpSrq {
    ctx: Arc<CtxInner>,
    idx: usize,
    srqn: u32,
}

impl Drop for XdpSrq {
    fn drop(&mut self) {
        self.ctx.port().destroy_srq(self.idx);
    }
}

impl Srq for XdpSrq {
    fn srq_num(&self) -> u32 {
        self.srqn
    }
    fn post_recv(&mut self, chain: &RecvChain) -> std::result::Result<(), PostError> {
        self.ctx.port().post_srq_recv(self.idx, chain)
    }
    /// Arms the limit; a resize is EOPNOTSUPP.
    fn modify(&mut self, attr: &SrqAttr, mask: SrqAttrMask) -> Result<()> {
        if mask.contains(SrqAttrMask::MAX_WR) {
            return Err(Error::new(Errno::EOPNOTSUPP, "xdp: SRQs cannot be resized"));
        }
        if mask.contains(SrqAttrMask::LIMIT) {
            self.ctx.port().arm_srq_limit(self.idx, attr.srq_limit)?;
        }
        Ok(())
    }
    fn query(&self) -> Result<SrqAttr> {
        Ok(self.ctx.port().query_srq(self.idx))
    }
}

/// Address handles do not exist on `xdp` (frames carry their addresses); no values.
pub enum XdpAh {}

impl Ah for XdpAh {
    fn handle(&self) -> AhHandle {
        match *self {}
    }
}

/// XRC does not exist on `xdp`; no values.
pub enum XdpXrcd {}

impl Xrcd<Xdp> for XdpXrcd {
    fn create_recv_qp(&self) -> Result<XdpQp> {
        match *self {}
    }
}

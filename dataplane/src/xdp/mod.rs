//! The `xdp` provider: RAW_PACKET QPs on real Linux interfaces through AF_XDP.
//!
//! One context is one queue of one interface (`XdpConfig::ifname`, `queue`): opening it
//! attaches a six-instruction XDP program ([`bpf`]) that redirects the queue's frames to an
//! AF_XDP socket ([`socket`]) whose UMEM is hugepage-backed memory of the project, bound
//! zero-copy where the driver can and in copy mode otherwise (veth), as `XdpMode::Auto`
//! chooses and [`XdpContext::zero_copy`] reports. The socket is the port of a small switch
//! ([`port`]): every RAW_PACKET QP of the context sends through it, and received frames go
//! to the QPs whose flow rules match, as on a NIC with `ibv_create_flow`.
//!
//! Semantics follow the seed table's RAW_PACKET column: SEND only (with `IBV_SEND_IP_CSUM`
//! done in software, `INLINE` up to `max_inline_data`), frames land at offset 0 of the
//! receive buffer with no GRH, a QP without a posted receive drops the frame (Ethernet has no
//! RNR), `IBV_WR_TSO` segmented in software. Not here yet: SRQs, completion channels, async events (each refused with its
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

/// How to open an `xdp` device: one queue of one interface.
#[derive(Debug, Clone)]
pub struct XdpConfig {
    /// Interface name (`eth0`, `veth0`).
    pub ifname: String,
    /// Queue of the interface (0 on veth).
    pub queue: u32,
    /// UMEM frames (a power of two >= 64); half receive, half send.
    pub frames: u32,
    /// Bytes per UMEM frame, 2048 or 4096: bounds the largest frame.
    pub frame_size: u32,
    /// Zero-copy, copy, or the best the driver has.
    pub mode: XdpMode,
}

impl XdpConfig {
    /// Queue 0 of `ifname` with 4096 frames of 2048 bytes, mode `Auto`.
    pub fn new(ifname: &str) -> XdpConfig {
        XdpConfig { ifname: ifname.to_owned(), queue: 0, frames: 4096, frame_size: 2048, mode: XdpMode::Auto }
    }
}

/// Distinguishes contexts in QP numbers (each context numbers its QPs from its base).
static NEXT_CTX: AtomicU32 = AtomicU32::new(1);

struct CtxInner {
    ifname: String,
    mac: [u8; 6],
    mtu: u32,
    port: Mutex<Port>,
    // Dropped after the port (fields drop in order): the socket leaves the map, then the
    // program detaches.
    redirect: bpf::Redirect,
    queue: u32,
    next_pd: AtomicU32,
}

impl CtxInner {
    /// The port, locked. A poisoned lock (a panic while holding it) is taken over: the port's
    /// state is updated only at points where it is consistent.
    fn port(&self) -> MutexGuard<'_, Port> {
        self.port.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Drop for CtxInner {
    fn drop(&mut self) {
        let _ = self.redirect.clear(self.queue);
    }
}

/// An open `xdp` device: one queue of one interface.
pub struct XdpContext {
    inner: Arc<CtxInner>,
}

impl XdpContext {
    /// Whether the socket is bound zero-copy (`false`: copy mode).
    pub fn zero_copy(&self) -> bool {
        self.inner.port().zero_copy()
    }

    /// The interface's MAC address.
    pub fn mac(&self) -> [u8; 6] {
        self.inner.mac
    }

    /// The interface's name.
    pub fn ifname(&self) -> &str {
        &self.inner.ifname
    }

    /// The port's counters (frames received, delivered, dropped by reason, sent, doorbells).
    pub fn counters(&self) -> PortCounters {
        self.inner.port().counters()
    }

    /// The kernel's drop counters of the socket (`XDP_STATISTICS`).
    pub fn kernel_statistics(&self) -> Result<sys::XdpStatistics> {
        self.inner.port().statistics().map_err(|e| Error::new(Errno::EIO, format!("XDP_STATISTICS: {e}")))
    }
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

    /// Opens queue `cfg.queue` of interface `cfg.ifname`.
    ///
    /// Errors: `ENODEV` for an interface that does not exist; `EINVAL` for bad sizes;
    /// `EPERM` without `CAP_NET_ADMIN`/`CAP_BPF` (run as root); `EBUSY` when another XDP
    /// program or AF_XDP socket holds the interface's queue; each naming the step.
    fn open(cfg: &XdpConfig) -> Result<XdpContext> {
        let ifindex = sys::if_index(&cfg.ifname)
            .map_err(|e| Error::new(Errno::ENODEV, format!("xdp: no interface {:?}: {e}", cfg.ifname)))?;
        let mac = sys::if_hwaddr(&cfg.ifname)
            .map_err(|e| Error::new(Errno::EINVAL, format!("xdp: {} has no Ethernet address: {e}", cfg.ifname)))?;
        let mtu = sys::if_mtu(&cfg.ifname)
            .map_err(|e| Error::new(Errno::ENODEV, format!("xdp: {}: SIOCGIFMTU: {e}", cfg.ifname)))?;
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
            .map_err(|m| Error::new(errno(&m), format!("xdp: {}: {m}", cfg.ifname)))?;
        let sizes = XskSizes { frames: cfg.frames, frame_size: cfg.frame_size };
        let xsk = Xsk::open(&cfg.ifname, ifindex, cfg.queue, sizes, cfg.mode)
            .map_err(|m| Error::new(errno(&m), format!("xdp: {m}")))?;
        redirect
            .set(cfg.queue, &xsk.fd)
            .map_err(|e| Error::new(Errno::EINVAL, format!("xdp: {}: XSKMAP update: {e}", cfg.ifname)))?;
        let base = NEXT_CTX.fetch_add(1, Ordering::Relaxed) << 16;
        let port = Port::new(xsk, mtu, base);
        Ok(XdpContext {
            inner: Arc::new(CtxInner {
                ifname: cfg.ifname.clone(),
                mac,
                mtu,
                port: Mutex::new(port),
                redirect,
                queue: cfg.queue,
                next_pd: AtomicU32::new(1),
            }),
        })
    }
}

impl Context<Xdp> for XdpContext {
    fn caps(&self) -> DeviceCaps {
        let frames = self.inner.port().send_frames();
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
            max_msg_size: self.inner.port().max_frame,
            raw_ip_csum: true,
            max_tso: port::MAX_TSO,
            max_tso_header: port::MAX_TSO_HEADER,
            ..Default::default()
        }
    }

    fn port_attr(&self, port: u8) -> Result<PortAttr> {
        if port != 1 {
            return Err(Error::new(Errno::EINVAL, format!("xdp: port {port} does not exist (one port: 1)")));
        }
        let up = sys::if_running(&self.inner.ifname);
        Ok(PortAttr {
            state: if up { PortState::Active } else { PortState::Down },
            active_mtu: self.inner.mtu,
            max_mtu: self.inner.mtu,
            lid: 0,
            gid_tbl_len: 1,
        })
    }

    /// GID 0: the interface's IPv6 link-local address (EUI-64 of its MAC), as RoCE names a port.
    fn gid(&self, port: u8, index: u8) -> Result<[u8; 16]> {
        if port != 1 || index != 0 {
            return Err(Error::new(Errno::EINVAL, format!("xdp: no GID {index} on port {port}")));
        }
        let m = self.inner.mac;
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
        None
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

    /// Creates a RAW_PACKET QP. Errors: `EOPNOTSUPP` for other QP types and for an SRQ;
    /// `EINVAL` for CQs of another context, zero depths, or depths and SGEs above the caps.
    fn create_qp(&self, attr: &QpInitAttr<'_, Xdp>) -> Result<XdpQp> {
        if attr.qp_type != QpType::RawPacket {
            return Err(Error::new(
                Errno::EOPNOTSUPP,
                format!("the xdp provider has RAW_PACKET QPs only ({:?} asked)", attr.qp_type),
            ));
        }
        if attr.srq.is_some() {
            return Err(Error::new(Errno::EOPNOTSUPP, "the xdp provider has no SRQs yet"));
        }
        if !Arc::ptr_eq(&attr.send_cq.ctx, &self.ctx) || !Arc::ptr_eq(&attr.recv_cq.ctx, &self.ctx) {
            return Err(Error::new(Errno::EINVAL, "create_qp: a CQ of another device"));
        }
        let c = attr.cap;
        let mut port = self.ctx.port();
        let max_wr = port.send_frames();
        if c.max_send_wr == 0 || c.max_recv_wr == 0 || c.max_send_wr > max_wr || c.max_recv_wr > 1 << 16 {
            return Err(Error::new(
                Errno::EINVAL,
                format!(
                    "create_qp: max_send_wr {} (1..={max_wr}), max_recv_wr {} (1..=65536)",
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
        let (idx, qpn) = port.create_qp(self.pdn, attr.send_cq.idx, attr.recv_cq.idx, caps, attr.sq_sig_all);
        drop(port);
        Ok(XdpQp { ctx: self.ctx.clone(), idx, qpn, caps, _cqs: (attr.send_cq.keep(), attr.recv_cq.keep()) })
    }

    fn create_srq(&self, _attr: &SrqAttr) -> Result<XdpSrq> {
        Err(Error::new(Errno::EOPNOTSUPP, "the xdp provider has no SRQs yet"))
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

/// Keeps a CQ's port entry alive while a QP uses it.
struct CqKeep {
    ctx: Arc<CtxInner>,
    idx: usize,
}

impl XdpCq {
    fn keep(&self) -> Arc<CqKeep> {
        // The QP holds a second owner of the entry; the entry goes when both are gone.
        self.ctx.port().retain_cq(self.idx);
        Arc::new(CqKeep { ctx: self.ctx.clone(), idx: self.idx })
    }
}

impl Drop for CqKeep {
    fn drop(&mut self) {
        self.ctx.port().destroy_cq(self.idx);
    }
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
    _cqs: (Arc<CqKeep>, Arc<CqKeep>),
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
        if attr.state == QpState::Init && from == QpState::Reset && attr.port_num > 1 {
            return Err(Error::new(
                Errno::EINVAL,
                format!("modify QP {:#x}: port {} does not exist", self.qpn, attr.port_num),
            ));
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

/// SRQs are not implemented on `xdp` yet ([`Pd::create_srq`] says so); this type has no
/// values.
pub enum XdpSrq {}

impl Srq for XdpSrq {
    fn srq_num(&self) -> u32 {
        match *self {}
    }
    fn post_recv(&mut self, _chain: &RecvChain) -> std::result::Result<(), PostError> {
        match *self {}
    }
    fn modify(&mut self, _attr: &SrqAttr, _mask: SrqAttrMask) -> Result<()> {
        match *self {}
    }
    fn query(&self) -> Result<SrqAttr> {
        match *self {}
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

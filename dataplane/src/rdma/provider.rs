//! The `rdma` provider: the [`crate::Provider`] traits on rdma-core's libibverbs.
//!
//! Structure mirrors `shm`: each object owns an `Arc` of what it points into (a QP holds its
//! PD, CQs and SRQ; an MR holds its PD and memory; everything holds the context), so no
//! libibverbs handle is destroyed while another one still refers to it.
//!
//! Hot paths (`post_send`, `post_recv`, `poll`) call the provider's function pointers in
//! `ibv_context::ops` directly (see [`super::loader`]) and do not allocate: each QP/SRQ keeps a
//! scratch array of `ibv_send_wr`/`ibv_recv_wr`/`ibv_sge` that grows only when a chain is
//! longer than any before, and a whole chain goes to the device in one call (one doorbell).
//!
//! Conventions that differ from C:
//! - `imm_data` is carried as the raw 32-bit value (no byte swap on either side), so a value
//!   posted is the value received.
//! - An [`AhAttr::sgid_index`] of 0 on a global route means "the config's `gid_index`".
//! - [`crate::Srq::srq_num`] and the `element` of SRQ/CQ events are the kernel object handle
//!   (`ibv_srq::handle`, `ibv_cq::handle`), which is unique per context.

use std::ffi::c_int;
use std::ptr::{self, NonNull};
use std::sync::Arc;

use super::device::{list_devices, open_device_by_name, DeviceContext};
use super::loader::{self, Verbs};
use super::sys;
use crate::mem::{HugePolicy, Region};
use crate::provider::{MemRegion, QpInitAttr};
use crate::verbs::*;

/// The `rdma` provider (rdma-core's libibverbs, loaded at run time).
#[derive(Debug, Clone, Copy)]
pub struct Rdma;

/// How to open an `rdma` device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RdmaConfig {
    /// Device name (`mlx5_0`, `rxe0`); `None` takes the first device listed.
    pub device: Option<String>,
    /// Port number (1-based).
    pub port: u8,
    /// GID index used for endpoints and global routes (RoCE v2 over IPv4 is usually 1 on rxe).
    pub gid_index: u8,
}

impl Default for RdmaConfig {
    fn default() -> Self {
        RdmaConfig { device: None, port: 1, gid_index: 0 }
    }
}

fn last_errno() -> Errno {
    Errno::from_raw(std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO))
}

fn os_err(what: &str) -> Error {
    let e = std::io::Error::last_os_error();
    Error::new(Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)), format!("{what} failed: {e}"))
}

fn rc_err(what: &str, rc: c_int) -> Error {
    let rc = if rc < 0 { -rc } else { rc };
    Error::new(Errno::from_raw(rc), format!("{what} failed: {}", std::io::Error::from_raw_os_error(rc)))
}

fn mtu_bytes(m: sys::ibv_mtu) -> u32 {
    match m {
        sys::IBV_MTU_256 => 256,
        sys::IBV_MTU_512 => 512,
        sys::IBV_MTU_1024 => 1024,
        sys::IBV_MTU_2048 => 2048,
        sys::IBV_MTU_4096 => 4096,
        _ => 0,
    }
}

/// The largest path MTU that is at most `bytes` (256 at least).
fn mtu_enum(bytes: u32) -> sys::ibv_mtu {
    match bytes {
        0..=511 => sys::IBV_MTU_256,
        512..=1023 => sys::IBV_MTU_512,
        1024..=2047 => sys::IBV_MTU_1024,
        2048..=4095 => sys::IBV_MTU_2048,
        _ => sys::IBV_MTU_4096,
    }
}

pub(crate) struct CtxInner {
    dev: DeviceContext,
    v: &'static Verbs,
    caps: DeviceCaps,
    port: u8,
    gid_index: u8,
}

impl CtxInner {
    fn ptr(&self) -> *mut sys::ibv_context {
        self.dev.as_ptr()
    }

    fn port_attr(&self, port: u8) -> Result<sys::ibv_port_attr> {
        // SAFETY: all-zero is a valid ibv_port_attr (plain integers).
        let mut pa: sys::ibv_port_attr = unsafe { std::mem::zeroed() };
        // SAFETY: the context is live; `pa` is writable.
        let rc = unsafe { self.v.query_port_attr(self.ptr(), port, &mut pa) };
        if rc != 0 {
            return Err(Error::new(
                Errno::EINVAL,
                format!("port {port} of {} does not exist or cannot be queried (errno {rc})", self.dev.name()),
            ));
        }
        Ok(pa)
    }

    fn gid(&self, port: u8, index: u8) -> Result<[u8; 16]> {
        let pa = self.port_attr(port)?;
        if i32::from(index) >= pa.gid_tbl_len {
            return Err(Error::new(
                Errno::EINVAL,
                format!(
                    "GID index {index} is out of range: port {port} of {} has {} GIDs (see `ibv_devinfo -v`)",
                    self.dev.name(),
                    pa.gid_tbl_len
                ),
            ));
        }
        // SAFETY: all-zero is a valid ibv_gid.
        let mut gid: sys::ibv_gid = unsafe { std::mem::zeroed() };
        // SAFETY: the context is live; `gid` is writable.
        let rc = unsafe { (self.v.query_gid)(self.ptr(), port, c_int::from(index), &mut gid) };
        if rc != 0 {
            return Err(os_err("ibv_query_gid"));
        }
        // SAFETY: every bit pattern of the union is a valid `raw`.
        let raw = unsafe { gid.raw };
        if raw == [0; 16] {
            return Err(Error::new(
                Errno::EINVAL,
                format!(
                    "GID index {index} of port {port} of {} is empty: give the netdev an IP address or pick \
                     another index (see `ibv_devinfo -v`)",
                    self.dev.name()
                ),
            ));
        }
        Ok(raw)
    }
}

/// An open `rdma` device.
pub struct RdmaContext {
    inner: Arc<CtxInner>,
}

impl RdmaContext {
    /// The device name.
    pub fn name(&self) -> &str {
        self.inner.dev.name()
    }

    /// The port this context was opened for.
    pub fn port(&self) -> u8 {
        self.inner.port
    }

    /// The GID index used for endpoints and global routes.
    pub fn gid_index(&self) -> u8 {
        self.inner.gid_index
    }
}

fn probe_caps(v: &'static Verbs, ctx: *mut sys::ibv_context) -> Result<DeviceCaps> {
    // SAFETY: all-zero is a valid ibv_device_attr_ex (integers and arrays).
    let mut a: sys::ibv_device_attr_ex = unsafe { std::mem::zeroed() };
    // SAFETY: `ctx` is live; `a` is writable; no input.
    let rc = unsafe { v.query_device_ex(ctx, ptr::null(), &mut a) };
    if rc != 0 {
        return Err(rc_err("ibv_query_device_ex", rc));
    }
    let o = &a.orig_attr;
    let u = |x: c_int| u32::try_from(x).unwrap_or(0);
    Ok(DeviceCaps {
        max_qp: u(o.max_qp),
        max_qp_wr: u(o.max_qp_wr),
        max_sge: u(o.max_sge),
        max_inline_data: 0,
        max_cq: u(o.max_cq),
        max_cqe: u(o.max_cqe),
        max_mr: u(o.max_mr),
        max_mr_size: o.max_mr_size,
        max_pd: u(o.max_pd),
        max_srq: u(o.max_srq),
        max_srq_wr: u(o.max_srq_wr),
        max_srq_sge: u(o.max_srq_sge),
        max_msg_size: 0,
        max_qp_rd_atom: u(o.max_qp_rd_atom),
        atomics: o.atomic_cap != sys::IBV_ATOMIC_NONE,
        max_num_tags: a.tm_caps.max_num_tags,
        ip_csum: false,
        raw_ip_csum: false,
        // The device's TSO size is reported, but this provider does not post IBV_WR_TSO yet
        // (EOPNOTSUPP; no RAW_PACKET QP exists on Soft-RoCE to test it against).
        max_tso: 0,
        max_tso_header: 0,
        xrc: o.device_cap_flags & sys::IBV_DEVICE_XRC != 0,
    })
}

/// The largest inline size the device grants an RC QP (it is not in `ibv_device_attr`): asks
/// for decreasing sizes on a throw-away QP.
fn probe_inline(v: &'static Verbs, ctx: *mut sys::ibv_context) -> u32 {
    // SAFETY: `ctx` is live; every object created here is destroyed before returning.
    unsafe {
        let pd = (v.alloc_pd)(ctx);
        if pd.is_null() {
            return 0;
        }
        let cq = (v.create_cq)(ctx, 4, ptr::null_mut(), ptr::null_mut(), 0);
        let mut best = 0;
        if !cq.is_null() {
            for want in [1024u32, 512, 256, 128, 64] {
                let mut ia: sys::ibv_qp_init_attr = std::mem::zeroed();
                ia.send_cq = cq;
                ia.recv_cq = cq;
                ia.cap = sys::ibv_qp_cap {
                    max_send_wr: 1,
                    max_recv_wr: 1,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: want,
                };
                ia.qp_type = sys::IBV_QPT_RC;
                let qp = (v.create_qp)(pd, &mut ia);
                if !qp.is_null() {
                    best = ia.cap.max_inline_data.max(want);
                    (v.destroy_qp)(qp);
                    break;
                }
            }
            (v.destroy_cq)(cq);
        }
        (v.dealloc_pd)(pd);
        best
    }
}

impl crate::Provider for Rdma {
    const NAME: &'static str = "rdma";
    type Config = RdmaConfig;
    type Context = RdmaContext;
    type Pd = RdmaPd;
    type Mr = RdmaMr;
    type Cq = RdmaCq;
    type Qp = RdmaQp;
    type Srq = RdmaSrq;
    type Ah = RdmaAh;
    type Region = RdmaRegion;
    type Xrcd = RdmaXrcd;

    fn open(cfg: &RdmaConfig) -> Result<RdmaContext> {
        let name = match &cfg.device {
            Some(n) => n.clone(),
            None => list_devices()?.into_iter().next().map(|d| d.name).ok_or_else(|| {
                Error::new(Errno::ENODEV, "no RDMA device found; load a driver (e.g. `rdma link add rxe0 ...`)")
            })?,
        };
        let dev = open_device_by_name(&name)?;
        let v = dev.verbs();
        let ctx = dev.as_ptr();
        let mut caps = probe_caps(v, ctx)?;
        caps.max_inline_data = probe_inline(v, ctx);
        // SAFETY: `ctx` is live; `async_fd` is a descriptor it owns, set non-blocking so that
        // `poll_async_event` never blocks (ibv_get_async_event(3) allows this).
        unsafe {
            let fd = (*ctx).async_fd;
            let fl = libc::fcntl(fd, libc::F_GETFL);
            if fl < 0 || libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK) < 0 {
                return Err(os_err("setting the async event fd non-blocking"));
            }
        }
        let inner = CtxInner { dev, v, caps, port: cfg.port, gid_index: cfg.gid_index };
        let pa = inner.port_attr(cfg.port).map_err(|_| {
            Error::new(
                Errno::EINVAL,
                format!("port {} does not exist on {name} (ports are numbered from 1; see `ibv_devinfo`)", cfg.port),
            )
        })?;
        if pa.state != sys::IBV_PORT_ACTIVE {
            return Err(Error::new(
                Errno::ENODEV,
                format!(
                    "port {} of {name} is not active (state {}): bring its network interface up \
                     (`ip link set DEV up`) and check `ibv_devinfo`",
                    cfg.port, pa.state
                ),
            ));
        }
        inner.gid(cfg.port, cfg.gid_index)?;
        let mut inner = inner;
        inner.caps.max_msg_size = pa.max_msg_sz;
        Ok(RdmaContext { inner: Arc::new(inner) })
    }
}

fn port_state(s: sys::ibv_port_state) -> PortState {
    match s {
        sys::IBV_PORT_INIT => PortState::Init,
        sys::IBV_PORT_ARMED => PortState::Armed,
        sys::IBV_PORT_ACTIVE => PortState::Active,
        _ => PortState::Down,
    }
}

pub(crate) struct XrcdInner {
    ctx: Arc<CtxInner>,
    xrcd: NonNull<sys::ibv_xrcd>,
    /// A PD and a one-entry CQ that the domain's XRC_RECV QPs hold, as every QP here holds a
    /// PD and CQs (the device gives an XRC_RECV QP neither; nothing completes on the CQ).
    pd: Arc<PdInner>,
    cq: Arc<CqInner>,
}

// SAFETY: the domain pointer is only passed to libibverbs, whose calls are thread-safe.
unsafe impl Send for XrcdInner {}
// SAFETY: as above.
unsafe impl Sync for XrcdInner {}

impl Drop for XrcdInner {
    fn drop(&mut self) {
        // SAFETY: SRQs and QPs of the domain hold this Arc, so none is left; closed once.
        let rc = unsafe { loader::close_xrcd(self.xrcd.as_ptr()) };
        if rc != 0 {
            tracing::warn!(rc, "ibv_close_xrcd failed");
        }
    }
}

/// An XRC domain on an `rdma` device (`ibv_open_xrcd`), on devices that report
/// `IBV_DEVICE_XRC`. Soft-RoCE does not: there `open_xrcd` is EOPNOTSUPP naming the device.
/// This path follows rdma-core's `ibv_xsrq_pingpong`; it has not run on an XRC-capable NIC
/// here (none was at hand), only its refusal has (in the Soft-RoCE VM).
pub struct RdmaXrcd {
    inner: Arc<XrcdInner>,
}

impl crate::Xrcd<Rdma> for RdmaXrcd {
    fn create_recv_qp(&self) -> Result<RdmaQp> {
        let x = &self.inner;
        RdmaQp::create_xrc(&x.pd, &x.cq, QpCaps::default(), Some(x), false)
    }
}

impl RdmaContext {
    /// EOPNOTSUPP naming the device, unless it reports XRC.
    fn check_xrc(&self) -> Result<()> {
        if self.inner.caps.xrc {
            return Ok(());
        }
        Err(Error::new(
            Errno::EOPNOTSUPP,
            format!("XRC not supported by device {} (IBV_DEVICE_XRC is not in its capabilities)", self.name()),
        ))
    }

    /// `ibv_open_xrcd` with `fd` (-1: a domain of no file) and `O_CREAT`.
    fn open_xrcd_fd(&self, fd: c_int) -> Result<RdmaXrcd> {
        self.check_xrc()?;
        let pd = crate::Context::alloc_pd(self)?.inner;
        let cq = crate::Context::create_cq(self, 1)?.inner.clone();
        let mut attr = sys::ibv_xrcd_init_attr {
            comp_mask: sys::IBV_XRCD_INIT_ATTR_FD | sys::IBV_XRCD_INIT_ATTR_OFLAGS,
            fd,
            oflags: libc::O_CREAT,
        };
        // SAFETY: the context is live; `attr` is a valid init attribute.
        let xrcd = unsafe { loader::open_xrcd(self.inner.ptr(), &mut attr) }
            .map_err(|rc| rc_err(&format!("ibv_open_xrcd on {}", self.name()), rc))?;
        Ok(RdmaXrcd { inner: Arc::new(XrcdInner { ctx: self.inner.clone(), xrcd, pd, cq }) })
    }
}

impl crate::Context<Rdma> for RdmaContext {
    fn caps(&self) -> DeviceCaps {
        self.inner.caps
    }

    fn open_xrcd(&self) -> Result<RdmaXrcd> {
        self.open_xrcd_fd(-1)
    }

    fn open_xrcd_file(&self, file: &std::fs::File) -> Result<RdmaXrcd> {
        use std::os::fd::AsRawFd;
        self.open_xrcd_fd(file.as_raw_fd())
    }

    fn port_attr(&self, port: u8) -> Result<PortAttr> {
        let pa = self.inner.port_attr(port)?;
        Ok(PortAttr {
            state: port_state(pa.state),
            active_mtu: mtu_bytes(pa.active_mtu),
            max_mtu: mtu_bytes(pa.max_mtu),
            lid: pa.lid,
            gid_tbl_len: u32::try_from(pa.gid_tbl_len).unwrap_or(0),
        })
    }

    fn gid(&self, port: u8, index: u8) -> Result<[u8; 16]> {
        self.inner.gid(port, index)
    }

    fn alloc_pd(&self) -> Result<RdmaPd> {
        // SAFETY: the context is live.
        let pd = unsafe { (self.inner.v.alloc_pd)(self.inner.ptr()) };
        let pd = NonNull::new(pd).ok_or_else(|| os_err("ibv_alloc_pd"))?;
        Ok(RdmaPd { inner: Arc::new(PdInner { ctx: self.inner.clone(), pd }) })
    }

    fn create_cq(&self, cqe: u32) -> Result<RdmaCq> {
        let max = self.inner.caps.max_cqe;
        if cqe == 0 || cqe > max {
            return Err(Error::new(Errno::EINVAL, format!("CQ size {cqe} is outside 1..={max} (device cap max_cqe)")));
        }
        // SAFETY: the context is live; no channel, no vector.
        let cq =
            unsafe { (self.inner.v.create_cq)(self.inner.ptr(), cqe as c_int, ptr::null_mut(), ptr::null_mut(), 0) };
        let cq = NonNull::new(cq).ok_or_else(|| os_err("ibv_create_cq"))?;
        // SAFETY: `cq` is live.
        let depth = u32::try_from(unsafe { (*cq.as_ptr()).cqe }).unwrap_or(cqe);
        Ok(RdmaCq {
            inner: Arc::new(CqInner { ctx: self.inner.clone(), cq, depth }),
            // SAFETY: all-zero is a valid ibv_wc.
            scratch: vec![unsafe { std::mem::zeroed() }; POLL_BURST],
        })
    }

    fn alloc_region(&self, len: usize) -> Result<RdmaRegion> {
        Ok(RdmaRegion { inner: Arc::new(Region::anonymous(len, HugePolicy::default())?), len })
    }

    fn poll_async_event(&self) -> Option<AsyncEvent> {
        let v = self.inner.v;
        loop {
            // SAFETY: all-zero is a valid ibv_async_event.
            let mut ev: sys::ibv_async_event = unsafe { std::mem::zeroed() };
            // SAFETY: the context is live and its async fd is non-blocking (set at open).
            if unsafe { (v.get_async_event)(self.inner.ptr(), &mut ev) } != 0 {
                return None;
            }
            // SAFETY: the union member read is the one `event_type` says is valid, and the
            // object it points to is alive until the event is acked (just below).
            let (kind, element) = unsafe {
                match ev.event_type {
                    sys::IBV_EVENT_SRQ_LIMIT_REACHED => {
                        (Some(AsyncEventKind::SrqLimitReached), (*ev.element.srq).handle)
                    }
                    sys::IBV_EVENT_SRQ_ERR => (Some(AsyncEventKind::SrqErr), (*ev.element.srq).handle),
                    sys::IBV_EVENT_QP_LAST_WQE_REACHED => {
                        (Some(AsyncEventKind::QpLastWqeReached), (*ev.element.qp).qp_num)
                    }
                    sys::IBV_EVENT_QP_FATAL | sys::IBV_EVENT_QP_REQ_ERR | sys::IBV_EVENT_QP_ACCESS_ERR => {
                        (Some(AsyncEventKind::QpFatal), (*ev.element.qp).qp_num)
                    }
                    sys::IBV_EVENT_COMM_EST => (Some(AsyncEventKind::CommEst), (*ev.element.qp).qp_num),
                    sys::IBV_EVENT_CQ_ERR => (Some(AsyncEventKind::CqErr), (*ev.element.cq).handle),
                    sys::IBV_EVENT_DEVICE_FATAL => (Some(AsyncEventKind::DeviceFatal), 0),
                    sys::IBV_EVENT_PORT_ACTIVE => (Some(AsyncEventKind::PortActive), ev.element.port_num as u32),
                    sys::IBV_EVENT_PORT_ERR => (Some(AsyncEventKind::PortErr), ev.element.port_num as u32),
                    _ => (None, 0),
                }
            };
            // SAFETY: `ev` came from ibv_get_async_event and is acked exactly once.
            unsafe { (v.ack_async_event)(&mut ev) };
            if let Some(kind) = kind {
                return Some(AsyncEvent { kind, element });
            }
        }
    }
}

/// Memory for `rdma` MRs: a private mapping, on huge pages where available.
#[derive(Clone)]
pub struct RdmaRegion {
    inner: Arc<Region>,
    /// The length asked for (the mapping may be longer: rounded up to the page size).
    len: usize,
}

impl RdmaRegion {
    /// What backs the memory (huge pages or the fallback, and why).
    pub fn backing(&self) -> &crate::mem::RegionBacking {
        self.inner.backing()
    }
}

impl MemRegion for RdmaRegion {
    fn as_ptr(&self) -> *mut u8 {
        self.inner.as_ptr()
    }
    fn len(&self) -> usize {
        self.len
    }
}

pub(crate) struct PdInner {
    ctx: Arc<CtxInner>,
    pd: NonNull<sys::ibv_pd>,
}

// SAFETY: libibverbs objects may be used from any thread; this wrapper only hands the pointer
// to verbs calls, which are thread-safe for PDs.
unsafe impl Send for PdInner {}
// SAFETY: as above.
unsafe impl Sync for PdInner {}

impl Drop for PdInner {
    fn drop(&mut self) {
        // SAFETY: every object created on the PD holds this Arc, so none is left.
        let rc = unsafe { (self.ctx.v.dealloc_pd)(self.pd.as_ptr()) };
        if rc != 0 {
            tracing::warn!(rc, "ibv_dealloc_pd failed");
        }
    }
}

/// A protection domain of an `rdma` device.
pub struct RdmaPd {
    inner: Arc<PdInner>,
}

/// A registered memory region.
pub struct RdmaMr {
    pd: Arc<PdInner>,
    _region: Arc<Region>,
    mr: NonNull<sys::ibv_mr>,
    lkey: u32,
    rkey: u32,
    addr: u64,
    len: usize,
}

// SAFETY: the MR is only read (keys cached) and deregistered once on drop.
unsafe impl Send for RdmaMr {}
// SAFETY: as above.
unsafe impl Sync for RdmaMr {}

impl Drop for RdmaMr {
    fn drop(&mut self) {
        // SAFETY: registered by this PD's library, deregistered exactly once; the memory
        // (`_region`) is still mapped.
        let rc = unsafe { (self.pd.ctx.v.dereg_mr)(self.mr.as_ptr()) };
        if rc != 0 {
            tracing::warn!(rc, "ibv_dereg_mr failed");
        }
    }
}

impl crate::Mr for RdmaMr {
    fn lkey(&self) -> u32 {
        self.lkey
    }
    fn rkey(&self) -> u32 {
        self.rkey
    }
    fn addr(&self) -> u64 {
        self.addr
    }
    fn len(&self) -> usize {
        self.len
    }
}

/// Number of completions taken per `ibv_poll_cq` call at most.
const POLL_BURST: usize = 64;

pub(crate) struct CqInner {
    ctx: Arc<CtxInner>,
    cq: NonNull<sys::ibv_cq>,
    depth: u32,
}

// SAFETY: the CQ pointer is only passed to libibverbs, whose CQ calls are thread-safe.
unsafe impl Send for CqInner {}
// SAFETY: as above.
unsafe impl Sync for CqInner {}

impl Drop for CqInner {
    fn drop(&mut self) {
        // SAFETY: QPs using this CQ hold this Arc, so none is left; destroyed once.
        let rc = unsafe { (self.ctx.v.destroy_cq)(self.cq.as_ptr()) };
        if rc != 0 {
            tracing::warn!(rc, "ibv_destroy_cq failed");
        }
    }
}

/// A completion queue of an `rdma` device.
pub struct RdmaCq {
    inner: Arc<CqInner>,
    scratch: Vec<sys::ibv_wc>,
}

impl RdmaCq {
    /// The CQ's handle, as in `CqErr` events.
    pub fn handle(&self) -> u32 {
        // SAFETY: the CQ is live.
        unsafe { (*self.inner.cq.as_ptr()).handle }
    }
}

fn wc_opcode(op: sys::ibv_wc_opcode) -> WcOpcode {
    match op {
        0..=7 => WcOpcode::from_u8(op as u8).unwrap_or_default(),
        sys::IBV_WC_RECV => WcOpcode::Recv,
        sys::IBV_WC_RECV_RDMA_WITH_IMM => WcOpcode::RecvRdmaWithImm,
        sys::IBV_WC_TM_ADD => WcOpcode::TmAdd,
        sys::IBV_WC_TM_DEL => WcOpcode::TmDel,
        sys::IBV_WC_TM_SYNC => WcOpcode::TmSync,
        sys::IBV_WC_TM_RECV => WcOpcode::TmRecv,
        sys::IBV_WC_TM_NO_TAG => WcOpcode::TmNoTag,
        _ => WcOpcode::default(),
    }
}

fn convert_wc(w: &sys::ibv_wc) -> WorkCompletion {
    WorkCompletion {
        wr_id: w.wr_id,
        status: WcStatus::from_u8(u8::try_from(w.status).unwrap_or(u8::MAX)),
        opcode: wc_opcode(w.opcode),
        vendor_err: w.vendor_err,
        byte_len: w.byte_len,
        // SAFETY: both union members are plain u32.
        imm_data: unsafe { w.__bindgen_anon_1.imm_data },
        qp_num: w.qp_num,
        src_qp: w.src_qp,
        wc_flags: WcFlags::from_bits_truncate(w.wc_flags),
        pkey_index: w.pkey_index,
        slid: w.slid,
        sl: w.sl,
        dlid_path_bits: w.dlid_path_bits,
    }
}

impl crate::Cq for RdmaCq {
    fn poll(&mut self, wc: &mut [WorkCompletion]) -> Result<usize> {
        let n = wc.len().min(self.scratch.len());
        if n == 0 {
            return Ok(0);
        }
        // SAFETY: the CQ is live; `scratch` has room for `n` entries.
        let got = unsafe { loader::poll_cq(self.inner.cq.as_ptr(), n as c_int, self.scratch.as_mut_ptr()) };
        if got < 0 {
            return Err(Error::new(Errno::EIO, format!("ibv_poll_cq failed ({got}): the CQ is in error")));
        }
        let got = got as usize;
        for (dst, src) in wc.iter_mut().zip(&self.scratch[..got]) {
            *dst = convert_wc(src);
        }
        Ok(got)
    }

    fn depth(&self) -> u32 {
        self.inner.depth
    }
}

pub(crate) struct SrqInner {
    pd: Arc<PdInner>,
    srq: NonNull<sys::ibv_srq>,
    /// An XRC SRQ's domain and CQ, kept alive while it lives.
    _xrc: Option<(Arc<XrcdInner>, Arc<CqInner>)>,
}

// SAFETY: the SRQ pointer is only passed to libibverbs, whose SRQ calls are thread-safe.
unsafe impl Send for SrqInner {}
// SAFETY: as above.
unsafe impl Sync for SrqInner {}

impl Drop for SrqInner {
    fn drop(&mut self) {
        // SAFETY: QPs using this SRQ hold this Arc, so none is left; destroyed once.
        let rc = unsafe { (self.pd.ctx.v.destroy_srq)(self.srq.as_ptr()) };
        if rc != 0 {
            tracing::warn!(rc, "ibv_destroy_srq failed");
        }
    }
}

/// Preallocated receive work requests: filled from a [`RecvChain`] and linked with `next`.
struct RecvScratch {
    wrs: Vec<sys::ibv_recv_wr>,
    sges: Vec<sys::ibv_sge>,
}

// SAFETY: the raw pointers inside point into the scratch's own vectors and are only used
// during one post call by the owner (`&mut self`).
unsafe impl Send for RecvScratch {}
// SAFETY: as above; shared references never touch the pointers.
unsafe impl Sync for RecvScratch {}

impl RecvScratch {
    fn new(wrs: usize, sges: usize) -> RecvScratch {
        // SAFETY: all-zero is a valid ibv_recv_wr (null pointers) and ibv_sge.
        let (wr, sge) = unsafe { (std::mem::zeroed::<sys::ibv_recv_wr>(), std::mem::zeroed::<sys::ibv_sge>()) };
        RecvScratch { wrs: vec![wr; wrs.max(1)], sges: vec![sge; sges.max(1)] }
    }

    /// Fills the scratch from the first `n` requests of `chain`; returns the list head.
    fn fill(&mut self, chain: &RecvChain, n: usize) -> *mut sys::ibv_recv_wr {
        let nsge: usize = chain.wrs()[..n].iter().map(|w| w.num_sge()).sum();
        if n > self.wrs.len() {
            // SAFETY: all-zero is valid (see `new`).
            self.wrs.resize(n, unsafe { std::mem::zeroed() });
        }
        if nsge > self.sges.len() {
            // SAFETY: as above.
            self.sges.resize(nsge, unsafe { std::mem::zeroed() });
        }
        let wrs = self.wrs.as_mut_ptr();
        let sges = self.sges.as_mut_ptr();
        let mut s = 0;
        for (i, (wr, list)) in chain.iter().take(n).enumerate() {
            for (k, g) in list.iter().enumerate() {
                self.sges[s + k] = sys::ibv_sge { addr: g.addr, length: g.length, lkey: g.lkey };
            }
            let next = if i + 1 < n { wrs.wrapping_add(i + 1) } else { ptr::null_mut() };
            self.wrs[i] = sys::ibv_recv_wr {
                wr_id: wr.wr_id,
                next,
                sg_list: if list.is_empty() { ptr::null_mut() } else { sges.wrapping_add(s) },
                num_sge: list.len() as c_int,
            };
            s += list.len();
        }
        wrs
    }

    fn index_of(&self, bad: *mut sys::ibv_recv_wr) -> usize {
        let base = self.wrs.as_ptr() as usize;
        ((bad as usize).saturating_sub(base) / std::mem::size_of::<sys::ibv_recv_wr>()).min(self.wrs.len())
    }
}

/// The first request of `chain` with more than `max_sge` SGEs, as the error to return after
/// posting the requests before it.
fn check_recv_chain(chain: &RecvChain, max_sge: u32) -> Option<PostError> {
    chain
        .wrs()
        .iter()
        .position(|wr| wr.num_sge() > max_sge as usize)
        .map(|i| PostError::new(Errno::EINVAL, i, "too many SGEs"))
}

/// A shared receive queue of an `rdma` device.
pub struct RdmaSrq {
    inner: Arc<SrqInner>,
    /// What `srq_num` answers: `ibv_get_srq_num` for an XRC SRQ (what peers name), the
    /// handle otherwise.
    srqn: u32,
    max_wr: u32,
    max_sge: u32,
    scratch: RecvScratch,
}

impl crate::Srq for RdmaSrq {
    fn srq_num(&self) -> u32 {
        self.srqn
    }

    fn post_recv(&mut self, chain: &RecvChain) -> std::result::Result<(), PostError> {
        if chain.is_empty() {
            return Ok(());
        }
        let first_bad = check_recv_chain(chain, self.max_sge);
        let n = first_bad.map_or(chain.len(), |e| e.bad_wr);
        if n == 0 {
            return first_bad.map_or(Ok(()), Err);
        }
        let head = self.scratch.fill(chain, n);
        let mut bad = ptr::null_mut();
        // SAFETY: the SRQ is live; the list is NULL-terminated and points into the scratch,
        // which outlives the call.
        let rc = unsafe { loader::post_srq_recv(self.inner.srq.as_ptr(), head, &mut bad) };
        if rc != 0 {
            return Err(PostError::new(Errno::from_raw(rc), self.scratch.index_of(bad), "ibv_post_srq_recv failed"));
        }
        first_bad.map_or(Ok(()), Err)
    }

    fn modify(&mut self, attr: &SrqAttr, mask: SrqAttrMask) -> Result<()> {
        if mask.contains(SrqAttrMask::LIMIT) && attr.srq_limit > self.max_wr {
            return Err(Error::new(
                Errno::EINVAL,
                format!("srq_limit {} is above the SRQ's max_wr {}", attr.srq_limit, self.max_wr),
            ));
        }
        let mut a = sys::ibv_srq_attr { max_wr: attr.max_wr, max_sge: attr.max_sge, srq_limit: attr.srq_limit };
        let mut m = 0;
        if mask.contains(SrqAttrMask::MAX_WR) {
            m |= sys::IBV_SRQ_MAX_WR;
        }
        if mask.contains(SrqAttrMask::LIMIT) {
            m |= sys::IBV_SRQ_LIMIT;
        }
        // SAFETY: the SRQ is live; `a` is a valid attribute struct.
        let rc = unsafe { (self.inner.pd.ctx.v.modify_srq)(self.inner.srq.as_ptr(), &mut a, m as c_int) };
        if rc != 0 {
            return Err(rc_err("ibv_modify_srq", rc));
        }
        if mask.contains(SrqAttrMask::MAX_WR) {
            self.max_wr = a.max_wr.max(attr.max_wr);
        }
        Ok(())
    }

    fn query(&self) -> Result<SrqAttr> {
        let mut a = sys::ibv_srq_attr { max_wr: 0, max_sge: 0, srq_limit: 0 };
        // SAFETY: the SRQ is live; `a` is writable.
        let rc = unsafe { (self.inner.pd.ctx.v.query_srq)(self.inner.srq.as_ptr(), &mut a) };
        if rc != 0 {
            return Err(rc_err("ibv_query_srq", rc));
        }
        Ok(SrqAttr { max_wr: a.max_wr, max_sge: a.max_sge, srq_limit: a.srq_limit })
    }
}

/// An address handle for UD sends.
pub struct RdmaAh {
    pd: Arc<PdInner>,
    ah: NonNull<sys::ibv_ah>,
}

// SAFETY: the AH is immutable after creation and destroyed once.
unsafe impl Send for RdmaAh {}
// SAFETY: as above.
unsafe impl Sync for RdmaAh {}

impl Drop for RdmaAh {
    fn drop(&mut self) {
        // SAFETY: created by this PD's library, destroyed exactly once.
        let rc = unsafe { (self.pd.ctx.v.destroy_ah)(self.ah.as_ptr()) };
        if rc != 0 {
            tracing::warn!(rc, "ibv_destroy_ah failed");
        }
    }
}

impl crate::Ah for RdmaAh {
    fn handle(&self) -> AhHandle {
        AhHandle(self.ah.as_ptr() as u64)
    }
}

fn ah_attr(ctx: &CtxInner, a: &AhAttr) -> sys::ibv_ah_attr {
    // SAFETY: all-zero is a valid ibv_ah_attr.
    let mut s: sys::ibv_ah_attr = unsafe { std::mem::zeroed() };
    s.dlid = a.dlid;
    s.sl = a.sl;
    s.port_num = if a.port_num == 0 { ctx.port } else { a.port_num };
    if a.is_global {
        s.is_global = 1;
        s.grh.dgid = sys::ibv_gid { raw: a.dgid };
        s.grh.sgid_index = if a.sgid_index == 0 { ctx.gid_index } else { a.sgid_index };
        s.grh.hop_limit = a.hop_limit.max(1);
    }
    s
}

impl crate::Pd<Rdma> for RdmaPd {
    fn reg_mr(&self, region: &RdmaRegion, offset: usize, len: usize, access: AccessFlags) -> Result<RdmaMr> {
        if len == 0 || offset.checked_add(len).is_none_or(|e| e > region.len()) {
            return Err(Error::new(
                Errno::EINVAL,
                format!("MR range {offset}+{len} is empty or outside the region of {} bytes", region.len()),
            ));
        }
        if access.intersects(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC)
            && !access.contains(AccessFlags::LOCAL_WRITE)
        {
            return Err(Error::new(Errno::EINVAL, "REMOTE_WRITE and REMOTE_ATOMIC need LOCAL_WRITE"));
        }
        let v = self.inner.ctx.v;
        let addr = region.addr(offset);
        let flags = (access - AccessFlags::ZERO_BASED).bits();
        let mr = if access.contains(AccessFlags::ZERO_BASED) {
            let f = v.reg_mr_iova2.ok_or_else(|| {
                Error::new(Errno::EOPNOTSUPP, "ZERO_BASED MRs need libibverbs with ibv_reg_mr_iova2 (rdma-core 29+)")
            })?;
            // SAFETY: the PD is live; the range is inside the region (checked), which the MR
            // keeps mapped through `_region`.
            unsafe { f(self.inner.pd.as_ptr(), addr as *mut _, len, 0, flags) }
        } else {
            // SAFETY: as above.
            unsafe { v.register_mr(self.inner.pd.as_ptr(), addr as *mut _, len, flags) }
        };
        let mr = NonNull::new(mr).ok_or_else(|| os_err("ibv_reg_mr"))?;
        // SAFETY: `mr` is live.
        let (lkey, rkey) = unsafe { ((*mr.as_ptr()).lkey, (*mr.as_ptr()).rkey) };
        Ok(RdmaMr { pd: self.inner.clone(), _region: region.inner.clone(), mr, lkey, rkey, addr, len })
    }

    fn create_qp(&self, attr: &QpInitAttr<'_, Rdma>) -> Result<RdmaQp> {
        if attr.qp_type.is_xrc() {
            let ctx = &self.inner.ctx;
            if !ctx.caps.xrc {
                return Err(Error::new(
                    Errno::EOPNOTSUPP,
                    format!(
                        "{:?} QP: XRC not supported by device {} (IBV_DEVICE_XRC is not in its capabilities)",
                        attr.qp_type,
                        ctx.dev.name()
                    ),
                ));
            }
            if attr.qp_type == QpType::XrcRecv || attr.srq.is_some() {
                return Err(Error::new(
                    Errno::EINVAL,
                    "an XRC_RECV QP comes from its domain (Xrcd::create_recv_qp); an XRC_SEND QP takes no SRQ",
                ));
            }
            if !Arc::ptr_eq(&attr.send_cq.inner.ctx, ctx) {
                return Err(Error::new(Errno::EINVAL, "the send CQ belongs to another device context"));
            }
            return RdmaQp::create_xrc(&self.inner, &attr.send_cq.inner, attr.cap, None, attr.sq_sig_all);
        }
        RdmaQp::create(&self.inner, attr)
    }

    fn create_srq(&self, attr: &SrqAttr) -> Result<RdmaSrq> {
        let caps = &self.inner.ctx.caps;
        if attr.max_wr == 0 || attr.max_wr > caps.max_srq_wr {
            return Err(Error::new(
                Errno::EINVAL,
                format!("SRQ max_wr {} is outside 1..={} (device cap max_srq_wr)", attr.max_wr, caps.max_srq_wr),
            ));
        }
        if attr.max_sge == 0 || attr.max_sge > caps.max_srq_sge {
            return Err(Error::new(
                Errno::EINVAL,
                format!("SRQ max_sge {} is outside 1..={} (device cap max_srq_sge)", attr.max_sge, caps.max_srq_sge),
            ));
        }
        let mut ia = sys::ibv_srq_init_attr {
            srq_context: ptr::null_mut(),
            attr: sys::ibv_srq_attr { max_wr: attr.max_wr, max_sge: attr.max_sge, srq_limit: 0 },
        };
        // SAFETY: the PD is live; `ia` is a valid init attribute.
        let srq = unsafe { (self.inner.ctx.v.create_srq)(self.inner.pd.as_ptr(), &mut ia) };
        let srq = NonNull::new(srq).ok_or_else(|| os_err("ibv_create_srq"))?;
        let max_sge = ia.attr.max_sge.max(attr.max_sge);
        let mut srq = RdmaSrq {
            // SAFETY: the SRQ is live.
            srqn: unsafe { (*srq.as_ptr()).handle },
            inner: Arc::new(SrqInner { pd: self.inner.clone(), srq, _xrc: None }),
            max_wr: ia.attr.max_wr.max(attr.max_wr),
            max_sge,
            scratch: RecvScratch::new(16, 16 * max_sge as usize),
        };
        if let Ok(q) = crate::Srq::query(&srq) {
            srq.max_wr = q.max_wr;
        }
        Ok(srq)
    }

    fn create_srq_xrc(&self, attr: &SrqAttr, xrcd: &RdmaXrcd, cq: &RdmaCq) -> Result<RdmaSrq> {
        let ctx = &self.inner.ctx;
        if !Arc::ptr_eq(&xrcd.inner.ctx, ctx) || !Arc::ptr_eq(&cq.inner.ctx, ctx) {
            return Err(Error::new(Errno::EINVAL, "the XRC domain or the CQ belongs to another device context"));
        }
        let caps = &ctx.caps;
        if attr.max_wr == 0 || attr.max_wr > caps.max_srq_wr || attr.max_sge == 0 || attr.max_sge > caps.max_srq_sge {
            return Err(Error::new(
                Errno::EINVAL,
                format!(
                    "XRC SRQ max_wr {} / max_sge {} outside 1..={} / 1..={} (device caps)",
                    attr.max_wr, attr.max_sge, caps.max_srq_wr, caps.max_srq_sge
                ),
            ));
        }
        // SAFETY: all-zero is a valid ibv_srq_init_attr_ex (null pointers, zero fields).
        let mut ia: sys::ibv_srq_init_attr_ex = unsafe { std::mem::zeroed() };
        ia.attr = sys::ibv_srq_attr { max_wr: attr.max_wr, max_sge: attr.max_sge, srq_limit: 0 };
        ia.comp_mask = sys::IBV_SRQ_INIT_ATTR_TYPE
            | sys::IBV_SRQ_INIT_ATTR_PD
            | sys::IBV_SRQ_INIT_ATTR_XRCD
            | sys::IBV_SRQ_INIT_ATTR_CQ;
        ia.srq_type = sys::IBV_SRQT_XRC;
        ia.pd = self.inner.pd.as_ptr();
        ia.xrcd = xrcd.inner.xrcd.as_ptr();
        ia.cq = cq.inner.cq.as_ptr();
        // SAFETY: the context, PD, domain and CQ are live (the new SRQ holds their Arcs).
        let srq = unsafe { loader::create_srq_ex(ctx.ptr(), &mut ia) }
            .map_err(|rc| rc_err("ibv_create_srq_ex (IBV_SRQT_XRC)", rc))?;
        let inner =
            Arc::new(SrqInner { pd: self.inner.clone(), srq, _xrc: Some((xrcd.inner.clone(), cq.inner.clone())) });
        let mut srqn = 0u32;
        // SAFETY: the SRQ is live; `srqn` is writable.
        let rc = unsafe { loader::get_srq_num(srq.as_ptr(), &mut srqn) };
        if rc != 0 {
            return Err(rc_err("ibv_get_srq_num", rc)); // `inner` destroys the SRQ
        }
        let max_sge = ia.attr.max_sge.max(attr.max_sge);
        Ok(RdmaSrq {
            inner,
            srqn,
            max_wr: ia.attr.max_wr.max(attr.max_wr),
            max_sge,
            scratch: RecvScratch::new(16, 16 * max_sge as usize),
        })
    }

    fn create_ah(&self, attr: &AhAttr) -> Result<RdmaAh> {
        let mut a = ah_attr(&self.inner.ctx, attr);
        // SAFETY: the PD is live; `a` is a valid attribute struct.
        let ah = unsafe { (self.inner.ctx.v.create_ah)(self.inner.pd.as_ptr(), &mut a) };
        let ah = NonNull::new(ah).ok_or_else(|| {
            let e = os_err("ibv_create_ah");
            Error::new(e.errno, format!("{} (RoCE needs is_global with a valid GID)", e.msg))
        })?;
        Ok(RdmaAh { pd: self.inner.clone(), ah })
    }
}

pub(crate) struct QpInner {
    pd: Arc<PdInner>,
    qp: NonNull<sys::ibv_qp>,
    _send_cq: Arc<CqInner>,
    _recv_cq: Arc<CqInner>,
    _srq: Option<Arc<SrqInner>>,
    /// An XRC_RECV QP's domain.
    _xrcd: Option<Arc<XrcdInner>>,
}

// SAFETY: the QP pointer is only passed to libibverbs, whose QP calls are thread-safe.
unsafe impl Send for QpInner {}
// SAFETY: as above.
unsafe impl Sync for QpInner {}

impl Drop for QpInner {
    fn drop(&mut self) {
        // SAFETY: destroyed exactly once, before the CQs/SRQ/PD it holds.
        let rc = unsafe { (self.pd.ctx.v.destroy_qp)(self.qp.as_ptr()) };
        if rc != 0 {
            tracing::warn!(rc, "ibv_destroy_qp failed");
        }
    }
}

/// Preallocated send work requests, as [`RecvScratch`] for sends.
struct SendScratch {
    wrs: Vec<sys::ibv_send_wr>,
    sges: Vec<sys::ibv_sge>,
}

// SAFETY: as for RecvScratch.
unsafe impl Send for SendScratch {}
// SAFETY: as for RecvScratch.
unsafe impl Sync for SendScratch {}

fn wr_opcode(op: WrOpcode) -> sys::ibv_wr_opcode {
    match op {
        WrOpcode::Send => sys::IBV_WR_SEND,
        WrOpcode::SendWithImm => sys::IBV_WR_SEND_WITH_IMM,
        WrOpcode::RdmaWrite => sys::IBV_WR_RDMA_WRITE,
        WrOpcode::RdmaWriteWithImm => sys::IBV_WR_RDMA_WRITE_WITH_IMM,
        WrOpcode::RdmaRead => sys::IBV_WR_RDMA_READ,
        WrOpcode::AtomicCmpAndSwp => sys::IBV_WR_ATOMIC_CMP_AND_SWP,
        WrOpcode::AtomicFetchAndAdd => sys::IBV_WR_ATOMIC_FETCH_AND_ADD,
        WrOpcode::LocalInv => sys::IBV_WR_LOCAL_INV,
        WrOpcode::BindMw => sys::IBV_WR_BIND_MW,
        WrOpcode::SendWithInv => sys::IBV_WR_SEND_WITH_INV,
        WrOpcode::Tso => sys::IBV_WR_TSO,
    }
}

impl SendScratch {
    fn new(wrs: usize, sges: usize) -> SendScratch {
        // SAFETY: all-zero is a valid ibv_send_wr (null pointers, zero unions) and ibv_sge.
        let (wr, sge) = unsafe { (std::mem::zeroed::<sys::ibv_send_wr>(), std::mem::zeroed::<sys::ibv_sge>()) };
        SendScratch { wrs: vec![wr; wrs.max(1)], sges: vec![sge; sges.max(1)] }
    }

    /// Fills the scratch from the first `n` requests of `chain`; returns the list head.
    fn fill(&mut self, chain: &SendChain, n: usize) -> *mut sys::ibv_send_wr {
        let nsge: usize = chain.wrs()[..n].iter().map(|w| w.num_sge().max(1)).sum();
        if n > self.wrs.len() {
            // SAFETY: all-zero is valid (see `new`).
            self.wrs.resize(n, unsafe { std::mem::zeroed() });
        }
        if nsge > self.sges.len() {
            // SAFETY: as above.
            self.sges.resize(nsge, unsafe { std::mem::zeroed() });
        }
        let wrs = self.wrs.as_mut_ptr();
        let sges = self.sges.as_mut_ptr();
        let mut s = 0;
        for (i, wr) in chain.wrs()[..n].iter().enumerate() {
            let (sg_list, num) = match chain.inline_of(wr) {
                Some([]) => (ptr::null_mut(), 0),
                Some(data) => {
                    self.sges[s] = sys::ibv_sge { addr: data.as_ptr() as u64, length: data.len() as u32, lkey: 0 };
                    s += 1;
                    (sges.wrapping_add(s - 1), 1)
                }
                None => {
                    let list = chain.sges_of(wr);
                    for (k, g) in list.iter().enumerate() {
                        self.sges[s + k] = sys::ibv_sge { addr: g.addr, length: g.length, lkey: g.lkey };
                    }
                    let p = if list.is_empty() { ptr::null_mut() } else { sges.wrapping_add(s) };
                    s += list.len();
                    (p, list.len())
                }
            };
            // SAFETY: all-zero is valid (see `new`).
            let mut w: sys::ibv_send_wr = unsafe { std::mem::zeroed() };
            w.wr_id = wr.wr_id;
            w.next = if i + 1 < n { wrs.wrapping_add(i + 1) } else { ptr::null_mut() };
            w.sg_list = sg_list;
            w.num_sge = num as c_int;
            w.opcode = wr_opcode(wr.opcode);
            w.send_flags = wr.flags.bits();
            w.__bindgen_anon_1.imm_data = wr.imm_data;
            w.qp_type.xrc.remote_srqn = wr.remote_srqn;
            match wr.opcode {
                WrOpcode::AtomicCmpAndSwp | WrOpcode::AtomicFetchAndAdd => {
                    w.wr.atomic = sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_2 {
                        remote_addr: wr.remote_addr,
                        compare_add: wr.compare_add,
                        swap: wr.swap,
                        rkey: wr.rkey,
                    };
                }
                WrOpcode::SendWithInv => w.__bindgen_anon_1.invalidate_rkey = wr.rkey,
                _ if wr.ud.ah.0 != 0 => {
                    w.wr.ud = sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_3 {
                        ah: wr.ud.ah.0 as *mut sys::ibv_ah,
                        remote_qpn: wr.ud.remote_qpn,
                        remote_qkey: wr.ud.remote_qkey,
                    };
                }
                _ => {
                    w.wr.rdma =
                        sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 { remote_addr: wr.remote_addr, rkey: wr.rkey };
                }
            }
            self.wrs[i] = w;
        }
        wrs
    }

    fn index_of(&self, bad: *mut sys::ibv_send_wr) -> usize {
        let base = self.wrs.as_ptr() as usize;
        ((bad as usize).saturating_sub(base) / std::mem::size_of::<sys::ibv_send_wr>()).min(self.wrs.len())
    }
}

/// A queue pair of an `rdma` device.
pub struct RdmaQp {
    inner: Arc<QpInner>,
    qp_type: QpType,
    qpn: u32,
    caps: QpCaps,
    has_srq: bool,
    /// Active MTU of the port at creation (the limit of a UD message).
    mtu: u32,
    /// State as last set by `modify`; the device may have moved it to ERROR since (see
    /// [`crate::Qp::state`], which asks the device).
    state: QpState,
    send: SendScratch,
    recv: RecvScratch,
    /// Groups this QP is attached to (GID, MLID): detached before the QP is destroyed, since
    /// the kernel refuses to destroy an attached QP (EBUSY).
    mcast: Vec<([u8; 16], u16)>,
}

impl Drop for RdmaQp {
    fn drop(&mut self) {
        for (gid, lid) in std::mem::take(&mut self.mcast) {
            let g = sys::ibv_gid { raw: gid };
            // SAFETY: the QP is live (its Arc is held by self); `g` outlives the call.
            let rc = unsafe { (self.ctx().v.detach_mcast)(self.inner.qp.as_ptr(), &g, lid) };
            if rc != 0 {
                tracing::warn!(rc, "ibv_detach_mcast before destroying the QP failed");
            }
        }
    }
}

fn too_big(what: &str, v: u32, cap: &str, max: u32) -> Error {
    Error::new(Errno::EINVAL, format!("QP {what} {v} is above the device cap {cap} = {max}"))
}

impl RdmaQp {
    fn create(pd: &Arc<PdInner>, attr: &QpInitAttr<'_, Rdma>) -> Result<RdmaQp> {
        let caps = &pd.ctx.caps;
        let c = attr.cap;
        if c.max_send_wr > caps.max_qp_wr {
            return Err(too_big("max_send_wr", c.max_send_wr, "max_qp_wr", caps.max_qp_wr));
        }
        if c.max_recv_wr > caps.max_qp_wr {
            return Err(too_big("max_recv_wr", c.max_recv_wr, "max_qp_wr", caps.max_qp_wr));
        }
        if c.max_send_sge > caps.max_sge {
            return Err(too_big("max_send_sge", c.max_send_sge, "max_sge", caps.max_sge));
        }
        if c.max_recv_sge > caps.max_sge {
            return Err(too_big("max_recv_sge", c.max_recv_sge, "max_sge", caps.max_sge));
        }
        if c.max_inline_data > caps.max_inline_data {
            return Err(too_big("max_inline_data", c.max_inline_data, "max_inline_data", caps.max_inline_data));
        }
        if c.max_send_wr == 0 || (attr.srq.is_none() && c.max_recv_wr == 0) {
            return Err(Error::new(Errno::EINVAL, "QP depths must be > 0 (max_recv_wr may be 0 only with an SRQ)"));
        }
        if !Arc::ptr_eq(&attr.send_cq.inner.ctx, &pd.ctx) || !Arc::ptr_eq(&attr.recv_cq.inner.ctx, &pd.ctx) {
            return Err(Error::new(Errno::EINVAL, "the CQs belong to another device context"));
        }
        let qp_type = match attr.qp_type {
            QpType::Rc => sys::IBV_QPT_RC,
            QpType::Uc => sys::IBV_QPT_UC,
            QpType::Ud => sys::IBV_QPT_UD,
            QpType::RawPacket => sys::IBV_QPT_RAW_PACKET,
            QpType::XrcSend | QpType::XrcRecv => unreachable!("refused above"),
        };
        let mut ia = sys::ibv_qp_init_attr {
            qp_context: ptr::null_mut(),
            send_cq: attr.send_cq.inner.cq.as_ptr(),
            recv_cq: attr.recv_cq.inner.cq.as_ptr(),
            srq: attr.srq.map_or(ptr::null_mut(), |s| s.inner.srq.as_ptr()),
            cap: sys::ibv_qp_cap {
                max_send_wr: c.max_send_wr,
                max_recv_wr: if attr.srq.is_some() { 0 } else { c.max_recv_wr },
                max_send_sge: c.max_send_sge.max(1),
                max_recv_sge: if attr.srq.is_some() { 0 } else { c.max_recv_sge.max(1) },
                max_inline_data: c.max_inline_data,
            },
            qp_type,
            sq_sig_all: c_int::from(attr.sq_sig_all),
        };
        let mtu = mtu_bytes(pd.ctx.port_attr(pd.ctx.port)?.active_mtu);
        // SAFETY: the PD, CQs and SRQ are live (their Arcs are held by the new QP).
        let qp = unsafe { (pd.ctx.v.create_qp)(pd.pd.as_ptr(), &mut ia) };
        let qp = NonNull::new(qp).ok_or_else(|| {
            let errno = last_errno();
            if attr.qp_type == QpType::RawPacket && matches!(errno, Errno::EOPNOTSUPP | Errno::EINVAL | Errno::EPERM) {
                // rxe answers EOPNOTSUPP; mlx5 needs CAP_NET_RAW (EPERM).
                return Error::new(
                    errno,
                    format!(
                        "device {} does not give RAW_PACKET QPs here (ibv_create_qp: {errno}): Soft-RoCE has \
                         none; on a NIC that has them (mlx5) the process needs CAP_NET_RAW",
                        pd.ctx.dev.name()
                    ),
                );
            }
            Error::new(errno, format!("ibv_create_qp failed ({errno}) for caps {c:?}"))
        })?;
        // SAFETY: `qp` is live.
        let qpn = unsafe { (*qp.as_ptr()).qp_num };
        let granted = QpCaps {
            max_send_wr: ia.cap.max_send_wr,
            max_recv_wr: ia.cap.max_recv_wr,
            max_send_sge: ia.cap.max_send_sge.max(c.max_send_sge),
            max_recv_sge: ia.cap.max_recv_sge.max(c.max_recv_sge),
            max_inline_data: ia.cap.max_inline_data.max(c.max_inline_data),
        };
        let pre = (granted.max_send_wr as usize).clamp(1, 64);
        let pre_r = (granted.max_recv_wr as usize).clamp(1, 64);
        Ok(RdmaQp {
            inner: Arc::new(QpInner {
                pd: pd.clone(),
                qp,
                _send_cq: attr.send_cq.inner.clone(),
                _recv_cq: attr.recv_cq.inner.clone(),
                _srq: attr.srq.map(|s| s.inner.clone()),
                _xrcd: None,
            }),
            qp_type: attr.qp_type,
            qpn,
            caps: granted,
            has_srq: attr.srq.is_some(),
            mtu,
            state: QpState::Reset,
            send: SendScratch::new(pre, pre * granted.max_send_sge.max(1) as usize),
            recv: RecvScratch::new(pre_r, pre_r * granted.max_recv_sge.max(1) as usize),
            mcast: Vec::new(),
        })
    }

    /// An XRC_SEND QP (`xrcd` None: PD `pd`, send CQ `cq`, caps `c`) or an XRC_RECV QP of
    /// `xrcd` (no PD, CQ or queue at the device; `pd` and `cq` are the domain's, held only),
    /// through `ibv_create_qp_ex` as `ibv_xsrq_pingpong` creates them.
    fn create_xrc(
        pd: &Arc<PdInner>,
        cq: &Arc<CqInner>,
        c: QpCaps,
        xrcd: Option<&Arc<XrcdInner>>,
        sig_all: bool,
    ) -> Result<RdmaQp> {
        let caps = &pd.ctx.caps;
        // SAFETY: all-zero is a valid ibv_qp_init_attr_ex (null pointers, zero fields).
        let mut ia: sys::ibv_qp_init_attr_ex = unsafe { std::mem::zeroed() };
        let qp_type = match xrcd {
            None => {
                if c.max_send_wr == 0 || c.max_send_wr > caps.max_qp_wr {
                    return Err(too_big("max_send_wr", c.max_send_wr, "max_qp_wr", caps.max_qp_wr));
                }
                ia.qp_type = sys::IBV_QPT_XRC_SEND;
                ia.send_cq = cq.cq.as_ptr();
                ia.cap = sys::ibv_qp_cap {
                    max_send_wr: c.max_send_wr,
                    max_recv_wr: 0,
                    max_send_sge: c.max_send_sge.max(1),
                    max_recv_sge: 0,
                    max_inline_data: c.max_inline_data,
                };
                ia.sq_sig_all = c_int::from(sig_all);
                ia.comp_mask = sys::IBV_QP_INIT_ATTR_PD;
                ia.pd = pd.pd.as_ptr();
                QpType::XrcSend
            }
            Some(x) => {
                ia.qp_type = sys::IBV_QPT_XRC_RECV;
                ia.comp_mask = sys::IBV_QP_INIT_ATTR_XRCD;
                ia.xrcd = x.xrcd.as_ptr();
                QpType::XrcRecv
            }
        };
        let mtu = mtu_bytes(pd.ctx.port_attr(pd.ctx.port)?.active_mtu);
        // SAFETY: the context, PD, CQ and domain are live (the new QP holds their Arcs).
        let qp = unsafe { loader::create_qp_ex(pd.ctx.v, pd.ctx.ptr(), &mut ia) }
            .map_err(|rc| rc_err(&format!("ibv_create_qp_ex ({qp_type:?})"), rc))?;
        // SAFETY: `qp` is live.
        let qpn = unsafe { (*qp.as_ptr()).qp_num };
        let granted = QpCaps {
            max_send_wr: ia.cap.max_send_wr,
            max_recv_wr: 0,
            max_send_sge: ia.cap.max_send_sge,
            max_recv_sge: 0,
            max_inline_data: ia.cap.max_inline_data,
        };
        let pre = (granted.max_send_wr as usize).clamp(1, 64);
        Ok(RdmaQp {
            inner: Arc::new(QpInner {
                pd: pd.clone(),
                qp,
                _send_cq: cq.clone(),
                _recv_cq: cq.clone(),
                _srq: None,
                _xrcd: xrcd.cloned(),
            }),
            qp_type,
            qpn,
            caps: granted,
            has_srq: false,
            mtu,
            state: QpState::Reset,
            send: SendScratch::new(pre, pre * granted.max_send_sge.max(1) as usize),
            recv: RecvScratch::new(1, 1),
            mcast: Vec::new(),
        })
    }

    fn ctx(&self) -> &CtxInner {
        &self.inner.pd.ctx
    }

    /// Why request `i` (`wr`) of `chain` must be refused at post time, if it must.
    #[inline]
    fn check_send(&self, chain: &SendChain, wr: &SendWr, i: usize) -> Option<PostError> {
        let err = |why| Some(PostError::new(Errno::EINVAL, i, why));
        if !wr.opcode.allowed_on(self.qp_type) {
            return err("opcode not allowed on this QP type");
        }
        if matches!(wr.opcode, WrOpcode::LocalInv | WrOpcode::BindMw | WrOpcode::SendWithInv | WrOpcode::Tso) {
            return Some(PostError::new(Errno::EOPNOTSUPP, i, "opcode not implemented by the rdma provider"));
        }
        let caps = &self.ctx().caps;
        let csum = if self.qp_type == QpType::RawPacket { caps.raw_ip_csum } else { caps.ip_csum };
        if wr.flags.contains(SendFlags::IP_CSUM) && !csum {
            return err("IP_CSUM without checksum offload");
        }
        let inline = chain.inline_of(wr);
        if inline.is_none() && wr.num_sge() > self.caps.max_send_sge as usize {
            return err("too many SGEs");
        }
        let len: u64 = match inline {
            Some(d) => d.len() as u64,
            None => chain.sges_of(wr).iter().map(|g| u64::from(g.length)).sum(),
        };
        if wr.flags.contains(SendFlags::INLINE) {
            if !wr.opcode.inline_allowed() {
                return err("INLINE is valid only for SEND and RDMA WRITE");
            }
            if len > u64::from(self.caps.max_inline_data) {
                return err("inline data longer than max_inline_data");
            }
        }
        if self.qp_type == QpType::Ud {
            if wr.ud.ah.0 == 0 {
                return err("UD send without an address handle");
            }
            if len > u64::from(self.mtu) {
                return err("UD message longer than the path MTU");
            }
        }
        None
    }
}

fn qp_state_of(s: sys::ibv_qp_state) -> QpState {
    match s {
        sys::IBV_QPS_RESET => QpState::Reset,
        sys::IBV_QPS_INIT => QpState::Init,
        sys::IBV_QPS_RTR => QpState::Rtr,
        sys::IBV_QPS_RTS => QpState::Rts,
        sys::IBV_QPS_SQD => QpState::Sqd,
        sys::IBV_QPS_SQE => QpState::Sqe,
        _ => QpState::Error,
    }
}

fn qp_state_to(s: QpState) -> sys::ibv_qp_state {
    match s {
        QpState::Reset => sys::IBV_QPS_RESET,
        QpState::Init => sys::IBV_QPS_INIT,
        QpState::Rtr => sys::IBV_QPS_RTR,
        QpState::Rts => sys::IBV_QPS_RTS,
        QpState::Sqd => sys::IBV_QPS_SQD,
        QpState::Sqe => sys::IBV_QPS_SQE,
        QpState::Error => sys::IBV_QPS_ERR,
    }
}

impl crate::Qp for RdmaQp {
    fn qp_num(&self) -> u32 {
        self.qpn
    }

    fn attach_mcast(&mut self, gid: &[u8; 16], lid: u16) -> Result<()> {
        crate::provider::check_mcast_attach("attach_mcast", self.qpn, self.qp_type, gid)?;
        let g = sys::ibv_gid { raw: *gid };
        // SAFETY: the QP is live; `g` is a valid GID that outlives the call.
        let rc = unsafe { (self.ctx().v.attach_mcast)(self.inner.qp.as_ptr(), &g, lid) };
        if rc != 0 {
            return Err(rc_err("ibv_attach_mcast", rc));
        }
        if !self.mcast.contains(&(*gid, lid)) {
            self.mcast.push((*gid, lid));
        }
        Ok(())
    }

    fn detach_mcast(&mut self, gid: &[u8; 16], lid: u16) -> Result<()> {
        crate::provider::check_mcast_attach("detach_mcast", self.qpn, self.qp_type, gid)?;
        let g = sys::ibv_gid { raw: *gid };
        // SAFETY: the QP is live; `g` is a valid GID that outlives the call.
        let rc = unsafe { (self.ctx().v.detach_mcast)(self.inner.qp.as_ptr(), &g, lid) };
        if rc != 0 {
            return Err(rc_err("ibv_detach_mcast", rc));
        }
        self.mcast.retain(|m| *m != (*gid, lid));
        Ok(())
    }

    fn qp_type(&self) -> QpType {
        self.qp_type
    }

    fn state(&self) -> QpState {
        // SAFETY: all-zero is a valid ibv_qp_attr / ibv_qp_init_attr.
        let (mut a, mut ia): (sys::ibv_qp_attr, sys::ibv_qp_init_attr) = unsafe { std::mem::zeroed() };
        // SAFETY: the QP is live; `a` and `ia` are writable.
        let rc =
            unsafe { (self.ctx().v.query_qp)(self.inner.qp.as_ptr(), &mut a, sys::IBV_QP_STATE as c_int, &mut ia) };
        if rc != 0 {
            return self.state;
        }
        qp_state_of(a.qp_state)
    }

    fn caps(&self) -> QpCaps {
        self.caps
    }

    fn endpoint(&self, gid_index: u8) -> Result<Endpoint> {
        let ctx = self.ctx();
        let gid = ctx.gid(ctx.port, gid_index)?;
        let lid = ctx.port_attr(ctx.port)?.lid;
        Ok(Endpoint { lid, qpn: self.qpn, psn: 0, gid })
    }

    fn modify(&mut self, attr: &QpAttr) -> Result<()> {
        use QpState::*;
        let cur = self.state();
        let to = attr.state;
        cur.check_transition(to, self.qpn)?;
        if cur == Reset && to == Error {
            // The kernel's state table has no RESET -> ERROR; go through INIT.
            self.modify(&QpAttr { state: Init, ..Default::default() })?;
        }
        let cur = if cur == Reset && to == Error { Init } else { cur };
        let ctx = self.ctx();
        // SAFETY: all-zero is a valid ibv_qp_attr.
        let mut a: sys::ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = qp_state_to(to);
        let mut mask = sys::IBV_QP_STATE;
        let rd_atom = ctx.caps.max_qp_rd_atom.clamp(1, 16) as u8;
        match (cur, to) {
            (Reset | Init, Init) => {
                a.port_num = if attr.port_num == 0 { ctx.port } else { attr.port_num };
                a.pkey_index = attr.pkey_index;
                mask |= sys::IBV_QP_PORT | sys::IBV_QP_PKEY_INDEX;
                if self.qp_type == QpType::Ud {
                    a.qkey = attr.qkey;
                    mask |= sys::IBV_QP_QKEY;
                } else {
                    a.qp_access_flags = attr.access.bits();
                    mask |= sys::IBV_QP_ACCESS_FLAGS;
                }
            }
            (Init, Rtr) if self.qp_type != QpType::Ud => {
                let active = mtu_bytes(ctx.port_attr(ctx.port)?.active_mtu);
                let mtu = if attr.path_mtu == 0 || attr.path_mtu > active { active } else { attr.path_mtu };
                a.path_mtu = mtu_enum(mtu);
                a.dest_qp_num = attr.dest_qp_num;
                a.rq_psn = attr.rq_psn & 0xff_ffff;
                a.ah_attr = ah_attr(ctx, &attr.ah);
                mask |= sys::IBV_QP_AV | sys::IBV_QP_PATH_MTU | sys::IBV_QP_DEST_QPN | sys::IBV_QP_RQ_PSN;
                // The responder's attributes: RC and XRC_RECV (the kernel refuses them on
                // XRC_SEND, as ibv_xsrq_pingpong's masks show).
                if matches!(self.qp_type, QpType::Rc | QpType::XrcRecv) {
                    a.min_rnr_timer = attr.min_rnr_timer;
                    a.max_dest_rd_atomic = if attr.max_dest_rd_atomic == 0 { rd_atom } else { attr.max_dest_rd_atomic };
                    mask |= sys::IBV_QP_MIN_RNR_TIMER | sys::IBV_QP_MAX_DEST_RD_ATOMIC;
                }
            }
            (Rtr, Rts) => {
                a.sq_psn = attr.sq_psn & 0xff_ffff;
                mask |= sys::IBV_QP_SQ_PSN;
                if self.qp_type == QpType::XrcRecv {
                    a.timeout = attr.timeout;
                    mask |= sys::IBV_QP_TIMEOUT;
                }
                if self.qp_type.is_reliable() {
                    a.timeout = attr.timeout;
                    a.retry_cnt = attr.retry_cnt;
                    a.rnr_retry = attr.rnr_retry;
                    a.max_rd_atomic = if attr.max_rd_atomic == 0 { rd_atom } else { attr.max_rd_atomic };
                    mask |= sys::IBV_QP_TIMEOUT
                        | sys::IBV_QP_RETRY_CNT
                        | sys::IBV_QP_RNR_RETRY
                        | sys::IBV_QP_MAX_QP_RD_ATOMIC;
                }
            }
            _ => {}
        }
        // SAFETY: the QP is live; `a` is a valid attribute struct for `mask`.
        let rc = unsafe { (ctx.v.modify_qp)(self.inner.qp.as_ptr(), &mut a, mask as c_int) };
        if rc != 0 {
            let e = rc_err("ibv_modify_qp", rc);
            return Err(crate::verbs::Error::new(e.errno, format!("QP {:#x} {cur:?} -> {to:?}: {}", self.qpn, e.msg)));
        }
        self.state = to;
        Ok(())
    }

    fn post_send(&mut self, chain: &SendChain) -> std::result::Result<(), PostError> {
        if chain.is_empty() {
            return Ok(());
        }
        if !self.state.accepts_post_send() {
            return Err(PostError::new(Errno::EINVAL, 0, "QP is not in RTS, SQD, SQE or ERROR"));
        }
        // The first request that can be refused now; the ones before it are still posted.
        let mut first_bad = None;
        for (i, wr) in chain.wrs().iter().enumerate() {
            if let Some(e) = self.check_send(chain, wr, i) {
                first_bad = Some(e);
                break;
            }
        }
        let n = first_bad.map_or(chain.len(), |e| e.bad_wr);
        if n == 0 {
            return Err(first_bad.unwrap_or(PostError::new(Errno::EINVAL, 0, "empty chain")));
        }
        let head = self.send.fill(chain, n);
        let mut bad = ptr::null_mut();
        // SAFETY: the QP is live; the list is NULL-terminated and points into the scratch and
        // the chain (inline bytes), both alive for the call; AH pointers come from live
        // `RdmaAh`s the caller holds.
        let rc = unsafe { loader::post_send(self.inner.qp.as_ptr(), head, &mut bad) };
        if rc != 0 {
            return Err(PostError::new(Errno::from_raw(rc), self.send.index_of(bad), "ibv_post_send failed"));
        }
        first_bad.map_or(Ok(()), Err)
    }

    fn post_recv(&mut self, chain: &RecvChain) -> std::result::Result<(), PostError> {
        if chain.is_empty() {
            return Ok(());
        }
        if self.has_srq {
            return Err(PostError::new(Errno::EINVAL, 0, "QP takes its receives from an SRQ"));
        }
        if self.qp_type.is_xrc() {
            return Err(PostError::new(
                Errno::EINVAL,
                0,
                "an XRC QP has no receive queue: post receives to the XRC SRQ",
            ));
        }
        if !self.state.accepts_post_recv() {
            return Err(PostError::new(Errno::EINVAL, 0, "QP is in RESET"));
        }
        let first_bad = check_recv_chain(chain, self.caps.max_recv_sge);
        let n = first_bad.map_or(chain.len(), |e| e.bad_wr);
        if n == 0 {
            return first_bad.map_or(Ok(()), Err);
        }
        let head = self.recv.fill(chain, n);
        let mut bad = ptr::null_mut();
        // SAFETY: the QP is live; the list is NULL-terminated and points into the scratch.
        let rc = unsafe { loader::post_recv(self.inner.qp.as_ptr(), head, &mut bad) };
        if rc != 0 {
            return Err(PostError::new(Errno::from_raw(rc), self.recv.index_of(bad), "ibv_post_recv failed"));
        }
        first_bad.map_or(Ok(()), Err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Provider;

    /// Without a device (these build machines: no InfiniBand in the kernel), `open` fails with
    /// the same sentence as `list_devices`, never a panic.
    #[test]
    fn open_without_device_says_why() {
        if let Err(e) = list_devices() {
            let got = Rdma::open(&RdmaConfig::default()).err().expect("no device, but open succeeded");
            assert_eq!(got, e);
            let named = RdmaConfig { device: Some("nonexistent0".into()), ..Default::default() };
            assert_eq!(Rdma::open(&named).err().map(|e| e.errno), Some(e.errno));
        }
    }

    #[test]
    fn mtu_conversions_round_trip() {
        for b in [256, 512, 1024, 2048, 4096] {
            assert_eq!(mtu_bytes(mtu_enum(b)), b);
        }
        assert_eq!(mtu_bytes(mtu_enum(1500)), 1024);
        assert_eq!(mtu_bytes(0), 0);
    }

    #[test]
    fn wc_opcodes_map_recv_values() {
        assert_eq!(wc_opcode(sys::IBV_WC_RECV), WcOpcode::Recv);
        assert_eq!(wc_opcode(sys::IBV_WC_RECV_RDMA_WITH_IMM), WcOpcode::RecvRdmaWithImm);
        assert_eq!(wc_opcode(sys::IBV_WC_RDMA_READ), WcOpcode::RdmaRead);
        assert_eq!(wc_opcode(9999), WcOpcode::Send);
    }
}

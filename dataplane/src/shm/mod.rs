//! The `shm` provider: a software NIC over shared memory, for threads and processes of one
//! host.
//!
//! A *fabric* is a named shared mapping (`/dev/hugepages/dataplane.NAME` on a hugetlbfs mount,
//! else `/dev/shm/dataplane.NAME`) that every process using it maps. It holds the object
//! tables (QPs, CQs, SRQs, MRs), their rings, and the memory that is registered: memory for
//! MRs comes from [`crate::Context::alloc_region`], which carves it from the fabric, so a peer
//! process can write into it. Opening a fabric that does not exist creates it; the last
//! context to close removes it; one left behind by crashed processes is replaced.
//!
//! There is no helper thread: the poster's CPU is the DMA engine (see `exec.rs`). Layout and
//! trust rules are in `layout.rs` and `ring.rs`; the design is explained in
//! docs/shm-provider.md.

mod cell;
mod channel;
mod complete;
mod cq;
mod dest;
mod doorbell;
mod drain;
mod exec;
mod fabric;
mod layout;
mod mcast;
mod mr;
pub mod msgq;
mod place;
mod qp;
mod qp_error;
mod raw;
mod recvq;
mod retry;
mod ring;
pub mod sizing;
mod solo;
mod sq;
mod sq_lock;
mod srq;
mod tm;
mod wire;
mod xrc;

pub use channel::ShmCompChannel;
pub use cq::ShmCq;
pub use mr::{ShmMr, ShmMw, ShmPd, ShmRegion};
pub use qp::ShmQp;
pub use srq::ShmSrq;
pub use xrc::ShmXrcd;

use crate::mem::HugePolicy;
use crate::verbs::*;
use fabric::Fabric;
use std::sync::Arc;

pub(crate) const EVENT_SRQ_LIMIT: u32 = 1;
pub(crate) const EVENT_CQ_ERR: u32 = 2;
pub(crate) const EVENT_QP_LAST_WQE: u32 = 3;

/// The `shm` provider.
#[derive(Debug, Clone, Copy)]
pub struct Shm;

/// How to open an `shm` device: which fabric, and how to create it if it does not exist.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShmConfig {
    /// Fabric name (like DPDK's `--file-prefix`): processes using the same name talk to each
    /// other; different names are independent instances side by side.
    pub fabric: String,
    /// Size of the fabric in bytes, if this open creates it (tables take about 2 MiB; the
    /// rest holds rings and registered memory).
    pub size: usize,
    /// Huge page policy for the fabric's memory.
    pub huge: HugePolicy,
}

impl Default for ShmConfig {
    fn default() -> Self {
        ShmConfig { fabric: "default".into(), size: 64 << 20, huge: HugePolicy::default() }
    }
}

impl ShmConfig {
    /// A config for fabric `name` with the default size and huge page policy.
    pub fn named(name: impl Into<String>) -> ShmConfig {
        ShmConfig { fabric: name.into(), ..Default::default() }
    }
}

pub(crate) struct CtxInner {
    pub(crate) fabric: Arc<Fabric>,
    pub(crate) idx: usize,
    pub(crate) lid: u16,
    pub(crate) caps: DeviceCaps,
}

impl Drop for CtxInner {
    fn drop(&mut self) {
        self.fabric.free_ctx(self.idx);
    }
}

/// An open `shm` device: one port of a fabric.
pub struct ShmContext {
    inner: Arc<CtxInner>,
}

impl ShmContext {
    /// The fabric's name.
    pub fn fabric_name(&self) -> &str {
        self.inner.fabric.name()
    }

    /// What backs the fabric's memory (huge pages or the fallback, and why).
    pub fn backing(&self) -> &crate::mem::RegionBacking {
        self.inner.fabric.region().backing()
    }

    /// This context's LID on the fabric.
    pub fn lid(&self) -> u16 {
        self.inner.lid
    }

    /// Bytes of the fabric's mapping.
    pub fn fabric_size(&self) -> u64 {
        self.inner.fabric.size()
    }

    /// `ibv_create_comp_channel`: a channel armed CQs signal and threads can wait on.
    pub fn create_comp_channel(&self) -> Result<ShmCompChannel> {
        ShmCompChannel::create(&self.inner)
    }

    /// `ibv_create_cq` with a completion channel: after `req_notify`, the CQ signals `channel`.
    pub fn create_cq_with_channel(&self, cqe: u32, channel: &ShmCompChannel) -> Result<ShmCq> {
        if !Arc::ptr_eq(&channel.inner_ctx().fabric, &self.inner.fabric) {
            return Err(Error::new(Errno::EINVAL, "channel belongs to another fabric"));
        }
        ShmCq::create_with(&self.inner, cqe, Some(channel), true)
    }
}

fn shm_caps(fabric_size: u64) -> DeviceCaps {
    DeviceCaps {
        max_qp: layout::MAX_QP as u32,
        max_qp_wr: 1 << 15,
        max_sge: recvq::MAX_SGE as u32,
        max_inline_data: 1024,
        max_cq: layout::MAX_CQ as u32,
        max_cqe: 1 << 20,
        max_mr: layout::MAX_MR as u32,
        max_mr_size: fabric_size,
        max_pd: 1 << 16,
        max_srq: layout::MAX_SRQ as u32,
        max_srq_wr: 1 << 15,
        max_srq_sge: recvq::MAX_SGE as u32,
        max_msg_size: 1 << 31,
        max_qp_rd_atom: 16,
        atomics: true,
        max_num_tags: tm::MAX_TAGS,
        ip_csum: false,
        raw_ip_csum: true,
        max_tso: exec::MAX_TSO,
        max_tso_header: exec::MAX_TSO_HEADER,
        xrc: true,
    }
}

pub(crate) fn gid_of(ctx: &CtxInner, port: u8, index: u8) -> Result<[u8; 16]> {
    if port != 1 {
        return Err(Error::new(Errno::EINVAL, format!("port {port} does not exist (the shm device has port 1)")));
    }
    if index != 0 {
        return Err(Error::new(Errno::EINVAL, format!("GID index {index} is out of range (the shm port has 1 GID)")));
    }
    Ok(dest::gid(ctx.fabric.fabric_id(), ctx.lid))
}

impl crate::Provider for Shm {
    const NAME: &'static str = "shm";
    type Config = ShmConfig;
    type Context = ShmContext;
    type Pd = ShmPd;
    type Mr = ShmMr;
    type Cq = ShmCq;
    type Qp = ShmQp;
    type Srq = ShmSrq;
    type Ah = ShmAh;
    type Region = ShmRegion;
    type Xrcd = ShmXrcd;

    fn open(cfg: &ShmConfig) -> Result<ShmContext> {
        let (fabric, idx) = Fabric::open(&cfg.fabric, cfg.size, cfg.huge)?;
        // The single-consumer mode's registration (once per process): with other threads
        // running it waits for an RCU grace period (~8 ms here), which a first post must
        // not pay.
        solo::enabled();
        let caps = shm_caps(fabric.size());
        Ok(ShmContext { inner: Arc::new(CtxInner { fabric, idx, lid: idx as u16 + 1, caps }) })
    }
}

impl crate::Context<Shm> for ShmContext {
    fn caps(&self) -> DeviceCaps {
        self.inner.caps
    }

    fn port_attr(&self, port: u8) -> Result<PortAttr> {
        if port != 1 {
            return Err(Error::new(Errno::EINVAL, format!("port {port} does not exist (the shm device has port 1)")));
        }
        Ok(PortAttr {
            state: PortState::Active,
            active_mtu: layout::SHM_MTU,
            max_mtu: layout::SHM_MTU,
            lid: self.inner.lid,
            gid_tbl_len: 1,
        })
    }

    fn gid(&self, port: u8, index: u8) -> Result<[u8; 16]> {
        gid_of(&self.inner, port, index)
    }

    fn alloc_pd(&self) -> Result<ShmPd> {
        Ok(ShmPd { inner: Arc::new(mr::PdInner { ctx: self.inner.clone(), pdn: self.inner.fabric.next_pd() }) })
    }

    fn create_cq(&self, cqe: u32) -> Result<ShmCq> {
        ShmCq::create(&self.inner, cqe)
    }

    /// Without the message queue of receiver-side delivery: SENDs to QPs receiving here
    /// take the sender-side path (the echo pipeline with `use_srq = false`, 16 B at 100k
    /// msg/s: round-trip p50 565-569 ns with the queue, 448-463 without, in 3 and 4 runs;
    /// docs/benchmarks.md, session 40).
    fn create_cq_sender_side(&self, cqe: u32) -> Result<ShmCq> {
        ShmCq::create_with(&self.inner, cqe, None, false)
    }

    fn alloc_region(&self, len: usize) -> Result<ShmRegion> {
        ShmRegion::alloc(&self.inner, len)
    }

    fn open_xrcd(&self) -> Result<ShmXrcd> {
        ShmXrcd::open(&self.inner, None)
    }

    fn open_xrcd_file(&self, file: &std::fs::File) -> Result<ShmXrcd> {
        ShmXrcd::open(&self.inner, Some(xrc::id_of_file(file)?))
    }

    fn poll_async_event(&self) -> Option<AsyncEvent> {
        let ring = self.inner.fabric.event_ring(self.inner.idx)?;
        let mut ev = wire::EventRecord::default();
        let got = ring.pop(|c| ev = c.get(0));
        let (kind, element) = (ev.kind, ev.element);
        if !matches!(got, ring::Pop::Item) {
            return None;
        }
        let kind = match kind {
            EVENT_SRQ_LIMIT => AsyncEventKind::SrqLimitReached,
            EVENT_CQ_ERR => AsyncEventKind::CqErr,
            EVENT_QP_LAST_WQE => AsyncEventKind::QpLastWqeReached,
            _ => AsyncEventKind::DeviceFatal,
        };
        Some(AsyncEvent { kind, element })
    }
}

impl crate::Pd<Shm> for ShmPd {
    fn reg_mr(&self, region: &ShmRegion, offset: usize, len: usize, access: AccessFlags) -> Result<ShmMr> {
        ShmMr::register(&self.inner, region, offset, len, access)
    }

    fn create_qp(&self, attr: &crate::QpInitAttr<'_, Shm>) -> Result<ShmQp> {
        ShmQp::create(&self.inner, attr)
    }

    fn create_srq(&self, attr: &SrqAttr) -> Result<ShmSrq> {
        ShmSrq::create(&self.inner.ctx, self.inner.pdn, attr)
    }

    fn create_srq_xrc(&self, attr: &SrqAttr, xrcd: &ShmXrcd, cq: &ShmCq) -> Result<ShmSrq> {
        if !Arc::ptr_eq(&cq.shared.ctx.fabric, &self.inner.ctx.fabric) {
            return Err(Error::new(Errno::EINVAL, "CQ belongs to another fabric"));
        }
        if !Arc::ptr_eq(&xrcd.ctx.fabric, &self.inner.ctx.fabric) {
            return Err(Error::new(Errno::EINVAL, "XRC domain belongs to another fabric"));
        }
        ShmSrq::create_xrc(&self.inner.ctx, self.inner.pdn, attr, xrcd.id, cq.shared.clone())
    }

    fn create_srq_tm(&self, attr: &SrqAttr, tm: &TmCaps, cq: &ShmCq) -> Result<ShmSrq> {
        if !Arc::ptr_eq(&cq.shared.ctx.fabric, &self.inner.ctx.fabric) {
            return Err(Error::new(Errno::EINVAL, "CQ belongs to another fabric"));
        }
        ShmSrq::create_tm(&self.inner.ctx, self.inner.pdn, attr, tm, cq.shared.cqn)
    }

    fn create_ah(&self, attr: &AhAttr) -> Result<ShmAh> {
        if attr.port_num != 1 {
            return Err(Error::new(
                Errno::EINVAL,
                format!("port {} does not exist (the shm device has port 1)", attr.port_num),
            ));
        }
        if attr.is_global && attr.sgid_index != 0 {
            return Err(Error::new(Errno::EINVAL, format!("sgid_index {} is out of range", attr.sgid_index)));
        }
        let mut h = dest::AH_VALID | attr.dlid as u64;
        if attr.is_global {
            h |= dest::AH_GLOBAL;
            if crate::provider::is_mcast_gid(&attr.dgid) {
                let grp = mcast::group_for_ah(&self.inner.ctx.fabric, &attr.dgid, attr.dlid)?;
                h |= dest::AH_MCAST | (grp as u64) << 16;
            }
        }
        Ok(ShmAh { handle: AhHandle(h) })
    }
}

impl ShmPd {
    /// `ibv_alloc_mw(IBV_MW_TYPE_2)`: a memory window, bound with a BIND_MW work request.
    pub fn alloc_mw(&self) -> Result<ShmMw> {
        ShmMw::alloc(&self.inner)
    }
}

/// An address handle of the `shm` provider (the destination's LID; QPNs are fabric-wide).
pub struct ShmAh {
    handle: AhHandle,
}

impl crate::Ah for ShmAh {
    fn handle(&self) -> AhHandle {
        self.handle
    }
}

/// A context on a fresh 16 MiB fabric without huge pages, for a unit test: the fabric is
/// named `unit-<name>-<pid>`, so tests running at once do not share one.
#[cfg(test)]
pub(crate) fn unit_context(name: &str) -> ShmContext {
    let cfg =
        ShmConfig { fabric: format!("unit-{name}-{}", std::process::id()), size: 16 << 20, huge: HugePolicy::Never };
    <Shm as crate::Provider>::open(&cfg).expect("open a unit-test fabric")
}

/// Moves a unit test's connected QP through INIT (with `access`), RTR (to `dest`) and RTS.
#[cfg(test)]
pub(crate) fn unit_connect(qp: &mut ShmQp, dest: u32, access: crate::verbs::AccessFlags) {
    use crate::verbs::{QpAttr, QpState};
    use crate::Qp;
    qp.modify(&QpAttr { state: QpState::Init, access, ..Default::default() }).unwrap();
    qp.modify(&QpAttr { state: QpState::Rtr, dest_qp_num: dest, ..Default::default() }).unwrap();
    qp.modify(&QpAttr { state: QpState::Rts, ..Default::default() }).unwrap();
}

//! Both ends of a test on one `shm` fabric: a client and a server, each with its own context
//! ("port"), PD, memory, CQs and QP, connected to each other.

use crate::args::{Args, Conn};
use dataplane::mem::{HugePolicy, PageSize};
use dataplane::shm::{Shm, ShmConfig};
use dataplane::verbs::*;
use dataplane::{Ah, Context, Mr, Pd, Provider, Qp, QpInitAttr};

type P = Shm;

/// One end of a test.
pub struct End {
    /// The context (objects hold it alive too; kept for clarity of ownership).
    _ctx: <P as Provider>::Context,
    /// Memory: `slots` message buffers of `size` bytes (plus UD's GRH area).
    pub region: <P as Provider>::Region,
    /// Its registration.
    pub mr: <P as Provider>::Mr,
    /// Send CQ.
    pub scq: <P as Provider>::Cq,
    /// Receive CQ.
    pub rcq: <P as Provider>::Cq,
    /// The QP.
    pub qp: <P as Provider>::Qp,
    /// SRQ, with --use-srq.
    pub srq: Option<<P as Provider>::Srq>,
    /// UD: address handle of the peer.
    pub ah: Option<<P as Provider>::Ah>,
    /// UD: the peer's QPN.
    pub peer_qpn: u32,
    /// Bytes per buffer slot.
    pub slot: u64,
    /// Number of slots.
    pub slots: u64,
    _pd: <P as Provider>::Pd,
}

/// Q_Key used for UD.
pub const QKEY: u32 = 0x1111_1111;

impl End {
    /// Address of slot `i`.
    pub fn addr(&self, i: u64) -> u64 {
        self.mr.addr() + (i % self.slots) * self.slot
    }

    /// SGE over `len` bytes of slot `i`.
    pub fn sge(&self, i: u64, len: u64) -> Sge {
        Sge::new(self.addr(i), len as u32, self.mr.lkey())
    }

    /// A receive SGE of slot `i` (room for UD's GRH).
    pub fn recv_sge(&self, i: u64) -> Sge {
        Sge::new(self.addr(i), self.slot as u32, self.mr.lkey())
    }
}

fn open_end(args: &Args, fabric: &str, size: u64, slots: u64, srq: bool) -> Result<End> {
    let huge = if args.hugepages { HugePolicy::Require(PageSize::Huge2M) } else { HugePolicy::default() };
    let slot = (size + GRH_LEN as u64).next_multiple_of(64).max(64);
    let mem = slot * slots;
    let fabric_size = ((mem * 2 + (16 << 20)) as usize).next_multiple_of(2 << 20);
    let ctx = P::open(&ShmConfig { fabric: fabric.into(), size: fabric_size, huge })?;
    let pd = ctx.alloc_pd()?;
    let region = ctx.alloc_region(mem as usize)?;
    let access =
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC;
    let mr = pd.reg_mr(&region, 0, mem as usize, access)?;
    let scq = ctx.create_cq(args.tx_depth.max(64))?;
    let rcq = ctx.create_cq(args.rx_depth.max(64))?;
    let srq =
        if srq { Some(pd.create_srq(&SrqAttr { max_wr: args.rx_depth, max_sge: 1, srq_limit: 0 })?) } else { None };
    let qp_type = match args.conn {
        Conn::RC => QpType::Rc,
        Conn::UC => QpType::Uc,
        Conn::UD => QpType::Ud,
    };
    let cap = QpCaps {
        max_send_wr: args.tx_depth,
        max_recv_wr: args.rx_depth,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: args.inline_size(),
    };
    let attr = QpInitAttr { send_cq: &scq, recv_cq: &rcq, srq: srq.as_ref(), cap, qp_type, sq_sig_all: false };
    let mut qp = pd.create_qp(&attr)?;
    let remote = AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC;
    qp.modify(&QpAttr { state: QpState::Init, qkey: QKEY, access: remote, ..Default::default() })?;
    Ok(End { _ctx: ctx, region, mr, scq, rcq, qp, srq, ah: None, peer_qpn: 0, slot, slots, _pd: pd })
}

fn to_rts(e: &mut End, peer: &Endpoint) -> Result<()> {
    let rtr =
        QpAttr { state: QpState::Rtr, dest_qp_num: peer.qpn, min_rnr_timer: 1, path_mtu: 4096, ..Default::default() };
    e.qp.modify(&rtr)?;
    e.qp.modify(&QpAttr { state: QpState::Rts, rnr_retry: 7, ..Default::default() })?;
    if e.qp.qp_type() == QpType::Ud {
        let ah = e._pd.create_ah(&AhAttr {
            dlid: peer.lid,
            is_global: true,
            dgid: peer.gid,
            port_num: 1,
            ..Default::default()
        })?;
        e.ah = Some(ah);
        e.peer_qpn = peer.qpn;
    }
    Ok(())
}

/// Builds and connects the two ends for one message size.
pub fn pair(args: &Args, size: u64) -> Result<(End, End)> {
    let fabric = format!("dp-perf-{}", std::process::id());
    let slots = (args.rx_depth.max(args.tx_depth) as u64).max(2);
    let mut client = open_end(args, &fabric, size, slots, false)?;
    let mut server = open_end(args, &fabric, size, slots, args.use_srq)?;
    let (ec, es) = (client.qp.endpoint(0)?, server.qp.endpoint(0)?);
    to_rts(&mut client, &es)?;
    to_rts(&mut server, &ec)?;
    Ok((client, server))
}

/// What one end needs to know about the other's memory: the out-of-band data.
#[derive(Clone, Copy)]
pub struct Remote {
    base: u64,
    /// The peer's rkey.
    pub rkey: u32,
    slot: u64,
    slots: u64,
}

impl Remote {
    /// The peer's buffer descriptor.
    pub fn of(e: &End) -> Remote {
        Remote { base: e.mr.addr(), rkey: e.mr.rkey(), slot: e.slot, slots: e.slots }
    }

    /// Address of the peer's slot `i`.
    pub fn addr(&self, i: u64) -> u64 {
        self.base + (i % self.slots) * self.slot
    }

    /// The peer's first byte (the atomic target).
    pub fn base(&self) -> u64 {
        self.base
    }
}

/// The UD destination of `e`'s peer (zeroed for connected QPs).
pub fn ud_dest(e: &End) -> Option<(AhHandle, u32)> {
    e.ah.as_ref().map(|a| (a.handle(), e.peer_qpn))
}

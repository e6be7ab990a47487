//! One end of a test, generic over the provider: memory, CQs, `-q` QPs (and an SRQ), brought
//! to RTS towards the other end's endpoints. [`Backend`] holds the little that differs between
//! providers: how to open the device and what to call it.

use crate::args::{Args, Conn, Mode};
use dataplane::conn::RemoteMem;
use dataplane::mem::{HugePolicy, PageSize};
use dataplane::rdma::{Rdma, RdmaConfig};
use dataplane::shm::{Shm, ShmConfig};
use dataplane::verbs::*;
use dataplane::{Ah, Context, Mr, Pd, Provider, Qp, QpInitAttr, Srq, Xrcd};

/// Q_Key used for UD.
pub const QKEY: u32 = 0x1111_1111;

/// Registered memory per end is capped near this (a large `--cycle-buffer`, or 0 with deep
/// queues, gets fewer slots, reused round robin).
const MEM_CAP: u64 = 64 << 20;

/// What differs between providers. The objects of one end move to its test thread.
pub trait Backend:
    Provider<Region: Send, Mr: Send, Cq: Send, Qp: Send, Srq: Send, Ah: Send, Pd: Send, Xrcd: Send, Context: Sync>
{
    /// Minimum RNR NAK timer code for RC receivers: shm retries in software, so the shortest
    /// (10 µs); rdma uses perftest's 12 (0.64 ms).
    const RNR_TIMER: u8;
    /// The path MTU when it is known without opening the device (opening an rdma device
    /// costs: it probes the inline limit with throw-away QPs).
    const KNOWN_MTU: Option<u32>;
    /// Opens the device for the whole run. `mem` is the largest memory one end registers (the
    /// shm fabric holds both ends', whether in one process or two).
    fn open_dev(args: &Args, mem: u64) -> Result<Self::Context>;
    /// Device name for the report.
    fn dev_name(ctx: &Self::Context) -> String;
    /// Checks `--use_hugepages` on memory from `alloc_region`.
    fn check_huge(region: &Self::Region) -> std::result::Result<(), String>;
}

impl Backend for Shm {
    const RNR_TIMER: u8 = 1;
    const KNOWN_MTU: Option<u32> = Some(4096);

    fn open_dev(args: &Args, mem: u64) -> Result<Self::Context> {
        let huge = if args.hugepages { HugePolicy::Require(PageSize::Huge2M) } else { HugePolicy::default() };
        // Both ends' memory plus tables and rings (generous: a few MiB per QP).
        let rings = (16 << 20) + (4 << 20) * args.qps as u64;
        let size = (mem * 2 + rings).next_multiple_of(2 << 20);
        Shm::open(&ShmConfig { fabric: shm_fabric(args), size: size as usize, huge })
    }

    fn dev_name(ctx: &Self::Context) -> String {
        format!("shm:{}", ctx.fabric_name())
    }

    fn check_huge(_: &Self::Region) -> std::result::Result<(), String> {
        Ok(()) // the fabric was opened with HugePolicy::Require
    }
}

impl Backend for Rdma {
    const RNR_TIMER: u8 = 12;
    const KNOWN_MTU: Option<u32> = None;

    fn open_dev(args: &Args, _: u64) -> Result<Self::Context> {
        Rdma::open(&RdmaConfig { device: args.dev.clone(), port: args.ib_port, gid_index: args.gid_index })
    }

    fn dev_name(ctx: &Self::Context) -> String {
        ctx.name().to_owned()
    }

    fn check_huge(region: &Self::Region) -> std::result::Result<(), String> {
        let b = region.backing();
        if b.is_huge() {
            return Ok(());
        }
        Err(format!("--use_hugepages: no huge pages for the buffers ({})", b.fallback_reason().unwrap_or("none free")))
    }
}

/// The shm fabric name: `--fabric`, else one per process (loopback) or per TCP port (both
/// processes of a client/server pair derive the same one).
pub fn shm_fabric(args: &Args) -> String {
    match (&args.fabric, args.mode()) {
        (Some(f), _) => f.clone(),
        (None, Mode::Loopback) => format!("dp-perf-{}", std::process::id()),
        (None, _) => format!("dp-perf-{}", args.tcp_port),
    }
}

/// Bytes per buffer slot for messages of `size` (room for UD's GRH, 64-byte aligned).
/// Checked: the size may come from a client over the network.
pub fn slot_len(size: u64) -> std::result::Result<u64, String> {
    size.checked_add(GRH_LEN as u64)
        .and_then(|n| n.checked_next_multiple_of(64))
        .ok_or_else(|| format!("a {size}-byte message does not fit a buffer slot"))
}

/// Number of slots of `slot` bytes. As perftest: messages whose slot fits twice in
/// `--cycle-buffer` cycle through it (`cycle_buffer / slot` slots), larger ones reuse one
/// buffer (two slots here: `send_lat` sends from slot 1 into the peer's slot 0). Both peer
/// tools reuse a few hot buffers like this (perftest's `increase_loc_addr` within the page,
/// ucx_perftest's single send and receive buffer), so a bandwidth measures the transport,
/// not how far a ring of 512 distinct buffers streams out of the caches.
/// `--cycle-buffer 0`: one slot per queue entry, at most [`MEM_CAP`] bytes.
pub fn slot_count(args: &Args, slot: u64) -> u64 {
    let slot = slot.max(1);
    let want = match args.cycle_buffer {
        0 => args.rx_depth.max(args.tx_depth) as u64,
        cb if slot.saturating_mul(2) <= cb => cb / slot,
        _ => 1,
    };
    want.min(MEM_CAP / slot).max(2)
}

/// Slot of operation `i` among `slots`, round robin. Every message's address goes through
/// it on both sides, and a 64-bit division costs tens of cycles: slot counts are powers of
/// two by default (the queue depths), which take a mask.
#[inline]
pub fn slot_index(i: u64, slots: u64) -> u64 {
    if slots.is_power_of_two() {
        i & (slots - 1)
    } else {
        i % slots
    }
}

/// Bytes of `slots` slots of `slot` bytes, if they can be addressed here.
pub fn slots_mem(slot: u64, slots: u64) -> std::result::Result<u64, String> {
    slot.checked_mul(slots)
        .filter(|&m| usize::try_from(m).is_ok())
        .ok_or_else(|| format!("{slots} slots of {slot} bytes do not fit the address space"))
}

/// One end of a test.
pub struct End<P: Provider> {
    /// Memory: `slots` message buffers of `slot` bytes.
    pub region: P::Region,
    /// Its registration.
    pub mr: P::Mr,
    /// Send CQ of all QPs.
    pub scq: P::Cq,
    /// Receive CQ of all QPs.
    pub rcq: P::Cq,
    /// The QPs (XRC: the XRC_SEND QPs).
    pub qps: Vec<P::Qp>,
    /// XRC: the XRC_RECV QPs, one per QP, that the peer's XRC_SEND QPs connect to.
    tgts: Vec<P::Qp>,
    /// SRQ, with --use-srq; with XRC, always: the XRC SRQ every message lands in.
    pub srq: Option<P::Srq>,
    /// XRC: the domain of the SRQ and the XRC_RECV QPs.
    xrcd: Option<P::Xrcd>,
    /// XRC: the peer's SRQ number, which every request names (0 otherwise).
    pub peer_srqn: u32,
    /// UD: destination (address handle, QPN) of each QP's peer.
    pub dests: Vec<Option<(AhHandle, u32)>>,
    /// Bytes per buffer slot.
    pub slot: u64,
    /// Number of slots.
    pub slots: u64,
    ahs: Vec<P::Ah>,
    psn: u32,
    pd: P::Pd,
}

impl<P: Backend> End<P> {
    /// Creates the resources for messages of `size` and brings the QPs to INIT.
    /// `server` selects the receive side's SRQ (--use-srq).
    pub fn open(ctx: &P::Context, args: &Args, size: u64, inline: u32, server: bool) -> Result<End<P>> {
        let inval = |e: String| Error::new(Errno::EINVAL, e);
        let slot = slot_len(size).map_err(inval)?;
        let slots = slot_count(args, slot);
        let mem = slots_mem(slot, slots).map_err(inval)? as usize;
        let pd = ctx.alloc_pd()?;
        let region = ctx.alloc_region(mem)?;
        if args.hugepages {
            P::check_huge(&region).map_err(|e| Error::new(Errno::ENOMEM, e))?;
        }
        let access = AccessFlags::LOCAL_WRITE
            | AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_READ
            | AccessFlags::REMOTE_ATOMIC;
        let mr = pd.reg_mr(&region, 0, mem, access)?;
        let nq = args.qps;
        let scq = ctx.create_cq(args.tx_depth.saturating_mul(nq).max(64))?;
        let xrc = args.conn == Conn::XRC;
        let one_rq = xrc || (server && args.use_srq);
        let rcq = ctx.create_cq(args.rx_depth.saturating_mul(if one_rq { 1 } else { nq }).max(64))?;
        let srq_attr = SrqAttr { max_wr: args.rx_depth, max_sge: 1, srq_limit: 0 };
        let xrcd = if xrc { Some(ctx.open_xrcd()?) } else { None };
        let srq = match &xrcd {
            Some(d) => Some(pd.create_srq_xrc(&srq_attr, d, &rcq)?),
            None if server && args.use_srq => Some(pd.create_srq(&srq_attr)?),
            None => None,
        };
        let qp_type = match args.conn {
            Conn::RC => QpType::Rc,
            Conn::UC => QpType::Uc,
            Conn::UD => QpType::Ud,
            Conn::XRC => QpType::XrcSend,
        };
        let cap = QpCaps {
            max_send_wr: args.tx_depth,
            max_recv_wr: if srq.is_some() { 0 } else { args.rx_depth },
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: inline,
        };
        let remote = AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC;
        // INIT now (receives are posted before the exchange); connect() finishes the bring-up.
        let init = ConnectOpts { port_num: args.ib_port, qkey: QKEY, access: remote, ..Default::default() };
        let mut qps = Vec::with_capacity(nq as usize);
        let mut tgts = Vec::new();
        let qp_srq = if xrc { None } else { srq.as_ref() };
        for _ in 0..nq {
            let attr = QpInitAttr { send_cq: &scq, recv_cq: &rcq, srq: qp_srq, cap, qp_type, sq_sig_all: false };
            let mut qp = pd.create_qp(&attr)?;
            qp.bring_up_to_init(&init)?;
            qps.push(qp);
            if let Some(d) = &xrcd {
                let mut t = d.create_recv_qp()?;
                t.bring_up_to_init(&init)?;
                tgts.push(t);
            }
        }
        let psn = (std::process::id().wrapping_mul(2654435761) ^ size as u32) & 0xff_ffff;
        let dests = vec![None; nq as usize];
        Ok(End {
            region,
            mr,
            scq,
            rcq,
            qps,
            tgts,
            srq,
            xrcd,
            peer_srqn: 0,
            dests,
            slot,
            slots,
            ahs: Vec::new(),
            psn,
            pd,
        })
    }

    /// How many endpoint messages this end exchanges: one per QP; with XRC, one per XRC_SEND
    /// QP, one per XRC_RECV QP, and one more whose QPN field carries the XRC SRQ's number.
    pub fn wire_len(&self) -> usize {
        if self.xrcd.is_some() {
            2 * self.qps.len() + 1
        } else {
            self.qps.len()
        }
    }

    fn psn_of(&self, q: usize) -> u32 {
        (self.psn + q as u32 * 0x1000) & 0xff_ffff
    }

    /// The QPs' identities for the exchange.
    pub fn endpoints(&self, gid_index: u8) -> Result<Vec<Endpoint>> {
        let mut out = Vec::with_capacity(self.qps.len());
        for (q, qp) in self.qps.iter().enumerate() {
            let mut ep = qp.endpoint(gid_index)?;
            ep.psn = self.psn_of(q);
            out.push(ep);
        }
        if self.xrcd.is_some() {
            for (q, t) in self.tgts.iter().enumerate() {
                let mut ep = t.endpoint(gid_index)?;
                ep.psn = self.psn_of(q);
                out.push(ep);
            }
            let srqn = self.srq.as_ref().map_or(0, |s| s.srq_num());
            out.push(Endpoint { qpn: srqn, ..Default::default() });
        }
        Ok(out)
    }

    /// The memory the peer may target.
    pub fn mem(&self) -> RemoteMem {
        RemoteMem { rkey: self.mr.rkey(), addr: self.mr.addr(), len: self.slot * self.slots }
    }

    /// Brings QP `q` to RTS towards `peers[q]` (UD: makes an address handle for each peer).
    pub fn connect(&mut self, args: &Args, peers: &[Endpoint]) -> Result<()> {
        if peers.len() != self.wire_len() {
            return Err(Error::new(
                Errno::EINVAL,
                format!("the peer sent {} endpoints, this end expects {}", peers.len(), self.wire_len()),
            ));
        }
        let nq = self.qps.len();
        // XRC: our XRC_SEND QP q connects to the peer's XRC_RECV QP q, our XRC_RECV QP q to the
        // peer's XRC_SEND QP q.
        let (sends, rest) = peers.split_at(nq);
        if self.xrcd.is_some() {
            self.peer_srqn = rest[nq].qpn;
        }
        for (q, peer) in sends.iter().enumerate() {
            let peer = if self.xrcd.is_some() { &rest[q] } else { peer };
            let addr = PeerAddr::from_endpoint(peer, args.ib_port, args.gid_index);
            let opts = ConnectOpts {
                port_num: args.ib_port,
                path_mtu: 4096, // the rdma provider lowers it to the port's active MTU
                sq_psn: self.psn_of(q),
                min_rnr_timer: P::RNR_TIMER,
                rnr_retry: 7,
                max_rd_atomic: 0,      // the device's maximum
                max_dest_rd_atomic: 0, // the device's maximum
                ..Default::default()
            };
            let qp = &mut self.qps[q];
            if qp.qp_type() == QpType::Ud {
                qp.ready(&opts)?;
            } else {
                qp.connect(&addr, &opts)?;
            }
            if let Some(t) = self.tgts.get_mut(q) {
                t.connect(&PeerAddr::from_endpoint(&sends[q], args.ib_port, args.gid_index), &opts)?;
            }
            if qp.qp_type() == QpType::Ud {
                let a = self.pd.create_ah(&addr.ah)?;
                self.dests[q] = Some((a.handle(), peer.qpn));
                self.ahs.push(a);
            }
        }
        Ok(())
    }
}

impl<P: Provider> End<P> {
    /// Address of slot `i`.
    pub fn addr(&self, i: u64) -> u64 {
        self.mr.addr() + slot_index(i, self.slots) * self.slot
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

/// What one end needs to know about the other's memory.
#[derive(Clone, Copy)]
pub struct Remote {
    base: u64,
    /// The peer's rkey.
    pub rkey: u32,
    slot: u64,
    slots: u64,
    /// XRC: the peer's SRQ, named by every request (0 otherwise).
    pub srqn: u32,
}

impl Remote {
    /// The peer's memory as exchanged, cut in slots of `slot` bytes (the same cut the peer
    /// made). Errors when it does not hold one slot.
    pub fn new(m: &RemoteMem, slot: u64) -> std::result::Result<Remote, String> {
        if m.len < slot || slot == 0 {
            return Err(format!("the peer's buffer ({} bytes) is smaller than one message slot ({slot})", m.len));
        }
        Ok(Remote { base: m.addr, rkey: m.rkey, slot, slots: m.len / slot, srqn: 0 })
    }

    /// This remote, its requests naming XRC SRQ `srqn` ([`End::peer_srqn`]).
    pub fn with_srqn(mut self, srqn: u32) -> Remote {
        self.srqn = srqn;
        self
    }

    /// Address of the peer's slot `i`.
    pub fn addr(&self, i: u64) -> u64 {
        self.base + slot_index(i, self.slots) * self.slot
    }

    /// The peer's first byte (the atomic target, 8-byte aligned).
    pub fn base(&self) -> u64 {
        self.base
    }
}

#[cfg(test)]
mod tests {
    use super::{slot_count, slot_index, slot_len, MEM_CAP};
    use crate::args::Args;
    use clap::Parser;

    fn args(extra: &[&str]) -> Args {
        Args::try_parse_from([&["dp-perf", "send_bw"], extra].concat()).unwrap()
    }

    /// perftest's rule: a message whose slot fits twice in the cycle buffer cycles through
    /// it, a larger one reuses one buffer (two slots: `send_lat` needs slots 0 and 1); 0 gives
    /// one slot per queue entry, capped by memory.
    #[test]
    fn slots_cycle_through_the_page_as_perftest_does() {
        let page = args(&[]);
        assert_eq!(page.cycle_buffer, 4096);
        let slot = |size| slot_len(size).unwrap();
        assert_eq!(slot(8), 64);
        assert_eq!(slot_count(&page, slot(8)), 64, "8 B: 64-byte steps through the page");
        assert_eq!(slot_count(&page, slot(64)), 32);
        assert_eq!(slot_count(&page, slot(2048)), 2, "2048 B plus the GRH room no longer fits twice");
        assert_eq!(slot_count(&page, slot(4096)), 2);
        assert_eq!(slot_count(&page, slot(1 << 23)), 2);
        let old = args(&["--cycle-buffer", "0"]);
        assert_eq!(slot_count(&old, slot(8)), 512, "one per queue entry (-r 512)");
        assert_eq!(slot_count(&old, slot(1 << 23)), MEM_CAP / slot(1 << 23));
        let huge = args(&["--cycle-buffer", "1099511627776"]);
        assert_eq!(slot_count(&huge, slot(8)), MEM_CAP / 64, "capped by memory");
    }

    #[test]
    fn slot_index_is_the_remainder_for_every_slot_count() {
        for slots in [1u64, 2, 3, 7, 64, 100, 512, 4096] {
            for i in [0u64, 1, 5, 63, 64, 511, 512, 1000, u64::MAX] {
                assert_eq!(slot_index(i, slots), i % slots, "i {i} slots {slots}");
            }
        }
    }
}

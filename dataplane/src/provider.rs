//! The provider trait family: one verbs semantics, several engines.
//!
//! A [`Provider`] names the concrete types of one engine (`shm`, `rdma`). Code that must run
//! on either is generic over `P: Provider` and is monomorphized per provider, so the hot path
//! has no dynamic dispatch and no branch on the provider (docs/runtime.md, "Stages": the only
//! indirect call is at the user-code boundary).
//!
//! Resources are reference counted the way rust-ibverbs does it: a QP keeps its CQs, SRQ and
//! PD alive, an MR keeps its PD and memory alive, so no handle can outlive what it points into.

use crate::verbs::{
    AccessFlags, AhAttr, AhHandle, AsyncEvent, ConnectOpts, DeviceCaps, Endpoint, Errno, Error, FlowId, FlowSpec,
    PeerAddr, PortAttr, PostError, QpAttr, QpCaps, QpState, QpType, RecvChain, Result, SendChain, SrqAttr, SrqAttrMask,
    WorkCompletion,
};
use crate::verbs::{OpsChain, TmCaps};

/// An engine that implements the verbs.
pub trait Provider: Sized + 'static {
    /// Short name used in configs and messages (`"shm"`, `"rdma"`).
    const NAME: &'static str;
    /// How to open a device of this provider.
    type Config: Clone + Send + Sync + std::fmt::Debug;
    /// An open device (`struct ibv_context`).
    type Context: Context<Self>;
    /// A protection domain.
    type Pd: Pd<Self>;
    /// A registered memory region.
    type Mr: Mr;
    /// A completion queue.
    type Cq: Cq;
    /// A queue pair.
    type Qp: Qp;
    /// A shared receive queue.
    type Srq: Srq;
    /// An address handle (UD destinations).
    type Ah: Ah;
    /// Memory that can be registered with this provider.
    type Region: MemRegion;
    /// An XRC domain (`struct ibv_xrcd`).
    type Xrcd: Xrcd<Self>;

    /// Opens the device described by `cfg`.
    ///
    /// Errors: `ENOENT`/`ENODEV` when the device or fabric does not exist, `ENOSYS` when the
    /// kernel has no RDMA support, `EINVAL` for a bad config.
    fn open(cfg: &Self::Config) -> Result<Self::Context>;
}

/// An open device.
pub trait Context<P: Provider>: Send + Sync {
    /// The device's limits (`ibv_query_device_ex`).
    fn caps(&self) -> DeviceCaps;
    /// Attributes of `port` (1-based). Errors: `EINVAL` for a port that does not exist.
    fn port_attr(&self, port: u8) -> Result<PortAttr>;
    /// The GID at `index` of `port`. Errors: `EINVAL` for an index out of range.
    fn gid(&self, port: u8, index: u8) -> Result<[u8; 16]>;
    /// Allocates a protection domain. Errors: `ENOMEM`.
    fn alloc_pd(&self) -> Result<P::Pd>;
    /// Creates a CQ with at least `cqe` entries. Errors: `EINVAL` for 0 or more than
    /// `max_cqe`, `ENOMEM`.
    fn create_cq(&self, cqe: u32) -> Result<P::Cq>;
    /// [`Context::create_cq`] for a receive CQ whose poller is as busy sending as receiving
    /// (a pipeline worker's): where a provider can move the delivery of the messages that
    /// complete here onto the poller (`shm`'s receiver-side delivery, which takes load off a
    /// streaming sender), it leaves that work with the senders instead, since handing it to
    /// a busy poller makes neither side faster. The same errors; the default is `create_cq`.
    fn create_cq_sender_side(&self, cqe: u32) -> Result<P::Cq> {
        self.create_cq(cqe)
    }
    /// Allocates `len` bytes of memory this provider can register (shared with peer processes
    /// where the provider needs that). Errors: `ENOMEM`/`ENOSPC`.
    fn alloc_region(&self, len: usize) -> Result<P::Region>;
    /// Returns the next asynchronous event, if any (non-blocking `ibv_get_async_event`; events
    /// need no ack).
    fn poll_async_event(&self) -> Option<AsyncEvent>;
    /// Opens a new XRC domain (`ibv_open_xrcd` without an inode: a domain of this context's
    /// own). XRC SRQs ([`Pd::create_srq_xrc`]) and XRC_RECV QPs ([`Xrcd::create_recv_qp`])
    /// belong to one; a message on an XRC connection may only land in an SRQ of the domain of
    /// the XRC_RECV QP it arrives on.
    ///
    /// Errors: `EOPNOTSUPP` where the device has no XRC ([`DeviceCaps::xrc`]), naming the
    /// device; `ENOMEM`.
    fn open_xrcd(&self) -> Result<P::Xrcd> {
        Err(Error::new(Errno::EOPNOTSUPP, format!("XRC not supported by this {} device", P::NAME)))
    }
    /// Opens the XRC domain of `file` (`ibv_open_xrcd` with its descriptor and `O_CREAT`):
    /// every context, in any process, that opens a domain with the same file (the same inode)
    /// gets the same domain, so an XRC_RECV QP of one process may hand messages to an XRC SRQ
    /// of another (`ibv_xsrq_pingpong` opens `/tmp/xrc_domain`).
    ///
    /// Errors: as [`open_xrcd`](Self::open_xrcd); the errno of `fstat` for a file that cannot be examined.
    fn open_xrcd_file(&self, file: &std::fs::File) -> Result<P::Xrcd> {
        let _ = file;
        self.open_xrcd()
    }
    /// Counters of the device itself rather than of a QP or CQ, by name, for run summaries
    /// (`xdp`: per port, frames received, delivered and dropped by reason, and the kernel's
    /// AF_XDP drop counters). Off the hot path: it may allocate and lock. Default: none.
    fn device_counters(&self) -> Vec<(String, u64)> {
        Vec::new()
    }
}

/// An XRC domain (`struct ibv_xrcd`): the scope in which XRC_RECV QPs hand messages to XRC SRQs.
pub trait Xrcd<P: Provider> {
    /// Creates an XRC_RECV QP in this domain, in RESET (`ibv_create_qp_ex` with
    /// `IBV_QPT_XRC_RECV` and the XRCD). It has no PD, CQs or queues of its own: bring it up
    /// with [`Qp::connect`] to the peer's XRC_SEND QP; what arrives on it lands in the XRC SRQ
    /// each request names, and completes on that SRQ's CQ with `qp_num` this QP's number.
    ///
    /// Errors: `ENOMEM` when no QP is left.
    fn create_recv_qp(&self) -> Result<P::Qp>;
}

/// Attributes for creating a QP (`struct ibv_qp_init_attr`).
pub struct QpInitAttr<'a, P: Provider> {
    /// CQ for send completions.
    pub send_cq: &'a P::Cq,
    /// CQ for receive completions.
    pub recv_cq: &'a P::Cq,
    /// SRQ to take receives from; `post_recv` on the QP is then an error.
    pub srq: Option<&'a P::Srq>,
    /// Requested capacities.
    pub cap: QpCaps,
    /// Transport.
    pub qp_type: QpType,
    /// Every send WR generates a completion (otherwise only those with `SIGNALED`).
    pub sq_sig_all: bool,
}

/// A protection domain.
pub trait Pd<P: Provider> {
    /// Registers `len` bytes of `region` starting at `offset`.
    ///
    /// Errors: `EINVAL` for a range outside the region, a zero length, or REMOTE_WRITE /
    /// REMOTE_ATOMIC without LOCAL_WRITE; `ENOMEM` when the MR table is full.
    fn reg_mr(&self, region: &P::Region, offset: usize, len: usize, access: AccessFlags) -> Result<P::Mr>;
    /// Creates a QP in RESET.
    ///
    /// Errors: `EINVAL` for zero depths without an SRQ, depths or SGEs above the device caps,
    /// or CQs/SRQ of another device; `ENOMEM` when no QP is left.
    fn create_qp(&self, attr: &QpInitAttr<'_, P>) -> Result<P::Qp>;
    /// Creates an SRQ. `attr.srq_limit` is ignored, as in `ibv_create_srq`: arm the limit with
    /// [`Srq::modify`]. Errors: `EINVAL` for `max_wr`/`max_sge` of 0 or above the caps.
    fn create_srq(&self, attr: &SrqAttr) -> Result<P::Srq>;
    /// Creates an address handle for UD sends. Errors: `EINVAL` for a bad port or GID.
    fn create_ah(&self, attr: &AhAttr) -> Result<P::Ah>;
    /// Creates an XRC SRQ (`ibv_create_srq_ex` with `IBV_SRQT_XRC`) of domain `xrcd` whose
    /// receives complete on `cq`. Its number ([`Srq::srq_num`]) is what a peer's XRC_SEND
    /// requests name; its PD (this one) checks both its receive buffers and the rkeys of RDMA
    /// and atomic requests that name it. `attr.srq_limit` is ignored, as in `create_srq`.
    ///
    /// Errors: `EOPNOTSUPP` where the device has no XRC; `EINVAL` for `max_wr`/`max_sge` of 0
    /// or above the caps, or a CQ or XRCD of another device.
    fn create_srq_xrc(&self, attr: &SrqAttr, xrcd: &P::Xrcd, cq: &P::Cq) -> Result<P::Srq> {
        let _ = (attr, xrcd, cq);
        Err(crate::verbs::Error::new(
            crate::verbs::Errno::EOPNOTSUPP,
            format!("XRC not supported by this {} device", P::NAME),
        ))
    }
    /// Creates a tag-matching SRQ (`ibv_create_srq_ex` with `IBV_SRQT_TM`) whose list
    /// operations and receives complete on `cq`. Errors: `EOPNOTSUPP` where the device has no
    /// tag matching; `EINVAL` for `max_num_tags`/`max_ops` of 0 or above the device's.
    fn create_srq_tm(&self, attr: &SrqAttr, tm: &TmCaps, cq: &P::Cq) -> Result<P::Srq> {
        let _ = (attr, tm, cq);
        Err(crate::verbs::Error::new(
            crate::verbs::Errno::EOPNOTSUPP,
            format!("tag matching not supported by this {} device", P::NAME),
        ))
    }
}

/// A registered memory region.
pub trait Mr {
    /// Local key, for SGEs.
    fn lkey(&self) -> u32;
    /// Remote key, for peers' RDMA and atomic operations.
    fn rkey(&self) -> u32;
    /// Start address in this process (the value SGEs and remote addresses use).
    fn addr(&self) -> u64;
    /// Length in bytes.
    fn len(&self) -> usize;
    /// Whether the MR is empty (never true for a registered MR).
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A completion queue.
pub trait Cq {
    /// Fills `wc` with up to `wc.len()` completions and returns how many. Also makes progress
    /// on work waiting in the providers' software paths (RNR retries on `shm`).
    ///
    /// Errors: `EIO` when the CQ overran and is in error.
    fn poll(&mut self, wc: &mut [WorkCompletion]) -> Result<usize>;
    /// [`poll`](Self::poll) for a busy loop that polls many times for each completion it
    /// finds (a worker's loop over its CQs and stages): same results and errors, but a
    /// provider may answer an empty CQ more cheaply here, at a small cost to a poll that
    /// finds something. A caller spinning on one CQ for the next completion (a latency
    /// test) wants [`poll`](Self::poll), whose found path is the shorter. Defaults to it.
    #[inline]
    fn poll_busy(&mut self, wc: &mut [WorkCompletion]) -> Result<usize> {
        self.poll(wc)
    }
    /// Number of entries.
    fn depth(&self) -> u32;
    /// `ibv_req_notify_cq`: arm the CQ to signal its completion channel once, on the next
    /// completion (or, with `solicited_only`, the next one from a message sent with
    /// `IBV_SEND_SOLICITED` or an unsuccessful one). Re-arm after each event, then poll once
    /// more to catch completions that raced the arming. Errors: `EOPNOTSUPP` where the provider
    /// has no completion events.
    fn req_notify(&mut self, solicited_only: bool) -> Result<()> {
        let _ = solicited_only;
        Err(crate::verbs::Error::new(crate::verbs::Errno::EOPNOTSUPP, "completion events not supported"))
    }
}

/// `e` with the bring-up step it happened in before its message; the errno is kept.
fn in_step(e: Error, step: &str) -> Error {
    Error::new(e.errno, format!("{step}: {}", e.msg))
}

/// Whether `gid` is a multicast GID: `ff00::/8`, or an IPv4-mapped multicast address
/// (`::ffff:224.0.0.0/4`, RoCE v2 over IPv4), as the kernel's `rdma_is_multicast_addr`.
pub fn is_mcast_gid(gid: &[u8; 16]) -> bool {
    let v4_mapped = gid[..10] == [0; 10] && gid[10..12] == [0xff, 0xff];
    gid[0] == 0xff || (v4_mapped && gid[12] & 0xf0 == 0xe0)
}

/// The checks every provider makes before `attach_mcast`/`detach_mcast`, those the kernel
/// makes in `ib_attach_mcast`: only a UD QP joins a group, and only a multicast GID names one.
/// `verb` names the call in the error.
pub fn check_mcast_attach(verb: &str, qpn: u32, qp_type: QpType, gid: &[u8; 16]) -> Result<()> {
    if qp_type != QpType::Ud {
        return Err(Error::new(
            Errno::EINVAL,
            format!("{verb}: QP {qpn:#x} is {qp_type:?}; only a UD QP can join a multicast group"),
        ));
    }
    if !is_mcast_gid(gid) {
        return Err(Error::new(
            Errno::EINVAL,
            format!(
                "{verb}: {} is not a multicast GID (ff00::/8 or ::ffff:224.0.0.0/4)",
                std::net::Ipv6Addr::from(*gid)
            ),
        ));
    }
    Ok(())
}

/// A queue pair.
pub trait Qp {
    /// QP number.
    fn qp_num(&self) -> u32;
    /// Transport type.
    fn qp_type(&self) -> QpType;
    /// Current state (it may have moved to ERROR on its own).
    fn state(&self) -> QpState;
    /// Capacities actually granted.
    fn caps(&self) -> QpCaps;
    /// This QP's identity for the out-of-band exchange, using GID `gid_index` of its port.
    fn endpoint(&self, gid_index: u8) -> Result<Endpoint>;
    /// `ibv_modify_qp`. Errors: `EINVAL` for a transition the state machine forbids or a
    /// missing/invalid attribute.
    fn modify(&mut self, attr: &QpAttr) -> Result<()>;
    /// Posts a chain of send WRs with one doorbell (`ibv_post_send`).
    ///
    /// Errors, with `bad_wr` the first request not posted: `EINVAL` (QP not in RTS/SQD/SQE/
    /// ERROR, opcode not allowed on this QP type, flag not valid for the opcode, too many
    /// SGEs, inline data too long, unknown lkey, SGE outside its MR, message too long);
    /// `ENOMEM` (send queue full).
    fn post_send(&mut self, chain: &SendChain) -> std::result::Result<(), PostError>;
    /// Runs the post path for `chain`, one WR (any other chain does nothing), as far as it
    /// goes without changing anything (its checks, the MR and destination lookups), then
    /// stops: nothing is posted and no state, counter or completion changes, whatever the WR
    /// or the QP's state. A worker calls it while it idles, so that the code and the lines of
    /// a post stay in this core's caches between sparse messages (`keep_warm`,
    /// docs/runtime.md). The default does nothing: `shm` implements it (for the WRs its fast
    /// path takes: RC/UC SEND, SEND_WITH_IMM, RDMA_WRITE of one SGE); a NIC's post (`rdma`,
    /// `xdp`) has no dry run.
    fn warm_send(&mut self, _chain: &SendChain) {}
    /// Posts a chain of receive WRs (`ibv_post_recv`).
    ///
    /// Errors, with `bad_wr`: `EINVAL` (QP in RESET, QP attached to an SRQ, too many SGEs,
    /// unknown lkey, SGE outside its MR, MR without LOCAL_WRITE); `ENOMEM` (queue full).
    fn post_recv(&mut self, chain: &RecvChain) -> std::result::Result<(), PostError>;
    /// Posts one receive of one SGE per address in `addrs` on this QP's own receive queue:
    /// `len` bytes of the MR `lkey` each, the address as its `wr_id` (what a replenisher
    /// posts). Exactly [`Qp::post_recv`] of that chain: the same checks, errors and `bad_wr`
    /// (the index in `addrs`), nothing after the first failure posted. The default builds the
    /// chain in `scratch` (reused, so it allocates only while growing) and posts it; `shm`
    /// skips the chain and checks the MR once for all the addresses, as
    /// [`Srq::post_recv_buffers`] does.
    fn post_recv_buffers(
        &mut self,
        addrs: &[u64],
        len: u32,
        lkey: u32,
        scratch: &mut RecvChain,
    ) -> std::result::Result<(), PostError> {
        scratch.set_buffers(addrs, len, lkey);
        self.post_recv(scratch)
    }
    /// Attaches this QP to the multicast group `gid` (MGID) / `lid` (MLID), as
    /// `ibv_attach_mcast(3)`: afterwards a UD send to the group delivers a copy here. A QP in
    /// any state may attach. Attaching to a group the QP is already in succeeds and it still
    /// receives one copy per message, as the man page says.
    ///
    /// Errors: `EINVAL` for a QP that is not UD or a GID outside `ff00::/8` (see
    /// [`check_mcast_attach`]); `ENOMEM` when the provider's group table is full;
    /// `EOPNOTSUPP` where the provider has no multicast.
    fn attach_mcast(&mut self, gid: &[u8; 16], lid: u16) -> Result<()>;
    /// Detaches this QP from the multicast group `gid` / `lid`, as `ibv_detach_mcast(3)`.
    ///
    /// Errors: `EINVAL` as for [`attach_mcast`](Self::attach_mcast), and for a group this QP
    /// is not attached to (what the kernel returns for rxe).
    fn detach_mcast(&mut self, gid: &[u8; 16], lid: u16) -> Result<()>;

    /// Installs a steering rule on a RAW_PACKET QP (`ibv_create_flow(3)`): received frames that
    /// match `spec` are delivered to this QP's receive queue.
    ///
    /// Errors: `EINVAL` on a QP that is not RAW_PACKET; `ENOMEM` when the rule table is full;
    /// `EOPNOTSUPP` where the provider or device has no flow steering (the default).
    fn create_flow(&mut self, spec: &FlowSpec) -> Result<FlowId> {
        let _ = spec;
        Err(Error::new(Errno::EOPNOTSUPP, format!("QP {:#x}: this provider has no flow steering", self.qp_num())))
    }
    /// Removes a rule installed by [`create_flow`](Self::create_flow) (`ibv_destroy_flow(3)`).
    ///
    /// Errors: `EINVAL` for a rule this QP does not own; `EOPNOTSUPP` as for `create_flow`.
    fn destroy_flow(&mut self, id: FlowId) -> Result<()> {
        let _ = id;
        Err(Error::new(Errno::EOPNOTSUPP, format!("QP {:#x}: this provider has no flow steering", self.qp_num())))
    }

    /// Connects an RC, UC or XRC QP to `peer` and makes it ready to send (an XRC_SEND QP
    /// connects to the peer's XRC_RECV QP and back, as `ibv_xsrq_pingpong` does): RESET → INIT (port,
    /// P_Key, access of `opts`) → RTR (the peer's QPN, PSN and route; MTU and RNR timer of
    /// `opts`) → RTS (send PSN, timeout and retries of `opts`). A QP already in INIT (e.g.
    /// to post receives before connecting) starts from there. The one call to make after the
    /// out-of-band exchange, on either side; see [`PeerAddr::from_endpoint`].
    ///
    /// Errors: `EINVAL` on a UD QP (use [`ready`](Self::ready)), on a QP in another state than
    /// RESET or INIT, or for an attribute the device refuses (the failing transition is named;
    /// the QP stays in the state it reached).
    fn connect(&mut self, peer: &PeerAddr, opts: &ConnectOpts) -> Result<()> {
        if !self.qp_type().is_connected() {
            return Err(Error::new(
                Errno::EINVAL,
                format!("connect: a {:?} QP has no peer; bring it up with ready()", self.qp_type()),
            ));
        }
        self.bring_up_to_init(opts)?;
        let rtr = QpAttr {
            state: QpState::Rtr,
            dest_qp_num: peer.qpn,
            rq_psn: peer.psn,
            ah: peer.ah,
            path_mtu: opts.path_mtu,
            min_rnr_timer: opts.min_rnr_timer,
            max_dest_rd_atomic: opts.max_dest_rd_atomic,
            ..Default::default()
        };
        self.modify(&rtr).map_err(|e| in_step(e, &format!("connect to QP {}: INIT -> RTR", peer.qpn)))?;
        let rts = QpAttr {
            state: QpState::Rts,
            sq_psn: opts.sq_psn,
            timeout: opts.timeout,
            retry_cnt: opts.retry_cnt,
            rnr_retry: opts.rnr_retry,
            max_rd_atomic: opts.max_rd_atomic,
            ..Default::default()
        };
        self.modify(&rts).map_err(|e| in_step(e, &format!("connect to QP {}: RTR -> RTS", peer.qpn)))
    }

    /// Makes a UD (or RAW_PACKET-like, connectionless) QP ready to send and receive: RESET →
    /// INIT (port, P_Key, Q_Key of `opts`) → RTR → RTS (send PSN of `opts`). A QP already in
    /// INIT starts from there. Destinations travel with each send (`UdDest`).
    ///
    /// Errors: `EINVAL` on an RC, UC or XRC QP (use [`connect`](Self::connect)), on a QP in
    /// another state than RESET or INIT, or for an attribute the device refuses.
    fn ready(&mut self, opts: &ConnectOpts) -> Result<()> {
        if self.qp_type().is_connected() {
            return Err(Error::new(
                Errno::EINVAL,
                format!("ready: a {:?} QP needs its peer; bring it up with connect()", self.qp_type()),
            ));
        }
        self.bring_up_to_init(opts)?;
        self.modify(&QpAttr { state: QpState::Rtr, ..Default::default() })
            .map_err(|e| in_step(e, "ready: INIT -> RTR"))?;
        self.modify(&QpAttr { state: QpState::Rts, sq_psn: opts.sq_psn, ..Default::default() })
            .map_err(|e| in_step(e, "ready: RTR -> RTS"))
    }

    /// RESET → INIT with the INIT attributes of `opts`; nothing for a QP already in INIT.
    /// Errors: `EINVAL` for any other state. Used by [`connect`](Self::connect) and
    /// [`ready`](Self::ready).
    fn bring_up_to_init(&mut self, opts: &ConnectOpts) -> Result<()> {
        match self.state() {
            QpState::Init => Ok(()),
            QpState::Reset => {
                let init = QpAttr {
                    state: QpState::Init,
                    port_num: opts.port_num,
                    pkey_index: opts.pkey_index,
                    access: opts.access,
                    qkey: opts.qkey,
                    ..Default::default()
                };
                self.modify(&init).map_err(|e| in_step(e, "RESET -> INIT"))
            }
            s => Err(Error::new(Errno::EINVAL, format!("bring-up needs a QP in RESET or INIT; this one is in {s:?}"))),
        }
    }
}

/// A shared receive queue.
pub trait Srq {
    /// SRQ number.
    fn srq_num(&self) -> u32;
    /// Posts receive WRs (`ibv_post_srq_recv`); same errors as [`Qp::post_recv`].
    fn post_recv(&mut self, chain: &RecvChain) -> std::result::Result<(), PostError>;
    /// Posts one receive of one SGE per address in `addrs`: `len` bytes of the MR `lkey`
    /// each, the address as its `wr_id` (what a replenisher posts). Exactly
    /// [`Srq::post_recv`] of that chain: the same checks, errors and `bad_wr` (the index in
    /// `addrs`), nothing after the first failure posted. The default builds the chain in
    /// `scratch` (reused, so it allocates only while growing) and posts it; `shm` skips the
    /// chain and checks the MR once for all the addresses.
    fn post_recv_buffers(
        &mut self,
        addrs: &[u64],
        len: u32,
        lkey: u32,
        scratch: &mut RecvChain,
    ) -> std::result::Result<(), PostError> {
        scratch.set_buffers(addrs, len, lkey);
        self.post_recv(scratch)
    }
    /// `ibv_modify_srq`: arm the limit or resize. Errors: `EINVAL` for a limit above
    /// `max_wr`, `EOPNOTSUPP` for a resize the provider cannot do.
    fn modify(&mut self, attr: &SrqAttr, mask: SrqAttrMask) -> Result<()>;
    /// `ibv_query_srq`: the current attributes (`srq_limit` 0 once the event fired).
    fn query(&self) -> Result<SrqAttr>;
    /// `ibv_post_srq_ops`: TAG_ADD / TAG_DEL / TAG_SYNC on a tag-matching SRQ; TAG_ADD
    /// handles are written back into `chain`. Errors, with `bad_wr`: `EINVAL` (not a TM SRQ,
    /// bad SGEs, a handle never returned), `ENOMEM` (tag list full, more ops than `max_ops`),
    /// `EOPNOTSUPP` where the provider has no tag matching.
    fn post_ops(&mut self, chain: &mut OpsChain) -> std::result::Result<(), PostError> {
        let _ = chain;
        Err(PostError::new(crate::verbs::Errno::EOPNOTSUPP, 0, "tag matching not supported by this device"))
    }
}

/// An address handle.
pub trait Ah {
    /// The handle to put in [`crate::verbs::UdDest`].
    fn handle(&self) -> AhHandle;
}

/// Memory a provider can register: a mapped range of bytes that peers (and the provider's
/// DMA engine) may write at any time, so it is never handed out as a Rust slice.
pub trait MemRegion: Send + Sync {
    /// Start of the mapping in this process.
    fn as_ptr(&self) -> *mut u8;
    /// Length in bytes.
    fn len(&self) -> usize;
    /// Whether the region is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Address of byte `offset`, as SGEs want it.
    fn addr(&self, offset: usize) -> u64 {
        self.as_ptr() as u64 + offset as u64
    }
    /// Copies `data` into the region at `offset`. Panics if the range is outside the region
    /// (a programming error, like slice indexing).
    fn write(&self, offset: usize, data: &[u8]) {
        assert!(offset.checked_add(data.len()).is_some_and(|e| e <= self.len()), "write outside region");
        // SAFETY: the range is inside the mapping (checked above); the bytes may be written
        // concurrently by a peer, which is the nature of DMA memory and is why no reference
        // to them is ever formed.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.as_ptr().add(offset), data.len()) }
    }
    /// Copies bytes at `offset` out of the region into `out`. Panics if outside the region.
    fn read(&self, offset: usize, out: &mut [u8]) {
        assert!(offset.checked_add(out.len()).is_some_and(|e| e <= self.len()), "read outside region");
        // SAFETY: as in `write`.
        unsafe { std::ptr::copy_nonoverlapping(self.as_ptr().add(offset), out.as_mut_ptr(), out.len()) }
    }
    /// Reads the aligned 8 bytes at `offset` with a volatile load, for polling memory a peer
    /// writes (RDMA WRITE ping-pong). Panics if outside the region or not 8-byte aligned.
    fn read_volatile_u64(&self, offset: usize) -> u64 {
        assert!(offset % 8 == 0 && offset.checked_add(8).is_some_and(|e| e <= self.len()), "bad poll offset");
        // SAFETY: inside the mapping and aligned (checked); volatile so each call really reads
        // the memory a peer may be writing.
        unsafe { std::ptr::read_volatile(self.as_ptr().add(offset) as *const u64) }
    }
    /// Fills `len` bytes at `offset` with `byte`. Panics if outside the region.
    fn fill(&self, offset: usize, len: usize, byte: u8) {
        assert!(offset.checked_add(len).is_some_and(|e| e <= self.len()), "fill outside region");
        // SAFETY: as in `write`.
        unsafe { std::ptr::write_bytes(self.as_ptr().add(offset), byte, len) }
    }
}

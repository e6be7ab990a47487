//! Device capabilities, port attributes, and asynchronous events.

/// What a device can do (the parts of `struct ibv_device_attr_ex` the dataplane uses).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DeviceCaps {
    /// Maximum QPs.
    pub max_qp: u32,
    /// Maximum outstanding work requests per queue.
    pub max_qp_wr: u32,
    /// Maximum scatter/gather entries per send or receive request.
    pub max_sge: u32,
    /// Maximum inline data per send request.
    pub max_inline_data: u32,
    /// Maximum CQs.
    pub max_cq: u32,
    /// Maximum entries per CQ.
    pub max_cqe: u32,
    /// Maximum MRs.
    pub max_mr: u32,
    /// Largest MR in bytes.
    pub max_mr_size: u64,
    /// Maximum PDs.
    pub max_pd: u32,
    /// Maximum SRQs.
    pub max_srq: u32,
    /// Maximum outstanding requests per SRQ.
    pub max_srq_wr: u32,
    /// Maximum scatter/gather entries per SRQ request.
    pub max_srq_sge: u32,
    /// Largest message in bytes.
    pub max_msg_size: u32,
    /// Outstanding RDMA reads/atomics per QP.
    pub max_qp_rd_atom: u32,
    /// Whether atomics are supported (and are atomic across the whole device).
    pub atomics: bool,
    /// Tag matching: maximum tags per SRQ (0 = no tag matching).
    pub max_num_tags: u32,
    /// Whether `IBV_SEND_IP_CSUM` is offloaded on UD QPs (`IBV_DEVICE_UD_IP_CSUM`).
    pub ip_csum: bool,
    /// Whether `IBV_SEND_IP_CSUM` is offloaded on RAW_PACKET QPs (`IBV_DEVICE_RAW_IP_CSUM`,
    /// `IBV_RAW_PACKET_CAP_IP_CSUM`).
    pub raw_ip_csum: bool,
    /// Largest payload of one `IBV_WR_TSO` request in bytes (`ibv_tso_caps.max_tso`; 0: no
    /// TSO).
    pub max_tso: u32,
    /// Largest TSO header template (`tso.hdr_sz`) a QP takes (`max_tso_header`).
    pub max_tso_header: u32,
    /// Whether the device has XRC domains, XRC SRQs and XRC QPs (`IBV_DEVICE_XRC`).
    pub xrc: bool,
}

/// State of a port (`enum ibv_port_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PortState {
    /// Link down.
    #[default]
    Down,
    /// Initializing.
    Init,
    /// Armed.
    Armed,
    /// Active: traffic can flow.
    Active,
}

/// Port attributes (`struct ibv_port_attr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PortAttr {
    /// Logical state.
    pub state: PortState,
    /// Active MTU in bytes.
    pub active_mtu: u32,
    /// Maximum MTU in bytes.
    pub max_mtu: u32,
    /// Port LID (InfiniBand) or 0 (RoCE).
    pub lid: u16,
    /// Number of GID table entries.
    pub gid_tbl_len: u32,
}

/// Kind of an asynchronous event (`enum ibv_event_type`, the ones a dataplane acts on).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AsyncEventKind {
    /// An SRQ's posted-request count dropped below its armed limit (`element` = SRQ number).
    SrqLimitReached,
    /// An SRQ entered error.
    SrqErr,
    /// A QP entered error because of a local work-queue catastrophic error.
    QpFatal,
    /// A QP with an SRQ left the receiving states and no more WQEs will be consumed.
    QpLastWqeReached,
    /// A CQ overran (`element` = CQ number).
    CqErr,
    /// The connection of a QP was established.
    CommEst,
    /// The device failed.
    DeviceFatal,
    /// A port went active.
    PortActive,
    /// A port went down.
    PortErr,
}

/// An asynchronous event, with the number of the object it concerns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AsyncEvent {
    /// What happened.
    pub kind: AsyncEventKind,
    /// SRQ, QP or CQ number, or port number.
    pub element: u32,
}

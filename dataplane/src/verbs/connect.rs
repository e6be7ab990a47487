//! QP bring-up: what the RESET → INIT → RTR → RTS transitions need besides the peer, and the
//! peer's address. [`Qp::connect`](crate::Qp::connect) and [`Qp::ready`](crate::Qp::ready)
//! use them to do the whole sequence in one call, as rust-ibverbs' `handshake` does, so that
//! no program writes the four `modify` calls by hand.

use super::{AccessFlags, AhAttr, Endpoint, QpAttr};

/// Where a QP's peer is: what RC/UC's RTR needs (QPN, PSN, route), or what a UD send
/// carries. Built from the peer's [`Endpoint`] (learned over the out-of-band exchange) with
/// [`PeerAddr::from_endpoint`], or by hand.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PeerAddr {
    /// The peer QP's number.
    pub qpn: u32,
    /// The peer's starting packet sequence number (RC: this QP's expected receive PSN).
    pub psn: u32,
    /// The route to the peer's port (RoCE: `is_global` with its GID; `port_num` is the local
    /// port, `sgid_index` the local GID index).
    pub ah: AhAttr,
}

impl PeerAddr {
    /// The address of multicast group `gid` (a GID in `ff00::/8`), sent to from local `port`
    /// with GID `sgid_index`: a global route to the group and the multicast QPN 0xFFFFFF, so
    /// each send reaches every QP attached to the group (`Qp::attach_mcast`).
    pub fn mcast_group(gid: [u8; 16], port: u8, sgid_index: u8) -> PeerAddr {
        PeerAddr {
            qpn: MCAST_QPN,
            psn: 0,
            ah: AhAttr { is_global: true, dgid: gid, sgid_index, hop_limit: 64, port_num: port, ..Default::default() },
        }
    }

    /// The address of the QP at `ep`, reached from local `port` with GID `sgid_index`: global
    /// when the peer has a GID (RoCE needs it; hop limit 64 so routed RoCE v2 works too), by
    /// LID otherwise (InfiniBand), as rdma-core's pingpongs build it.
    pub fn from_endpoint(ep: &Endpoint, port: u8, sgid_index: u8) -> PeerAddr {
        let global = ep.gid != [0; 16];
        PeerAddr {
            qpn: ep.qpn,
            psn: ep.psn,
            ah: AhAttr {
                dlid: ep.lid,
                is_global: global,
                dgid: ep.gid,
                sgid_index,
                hop_limit: if global { 64 } else { 0 },
                sl: 0,
                port_num: port,
            },
        }
    }
}

/// The attributes of the bring-up transitions that are not the peer's (INIT: port, P_Key
/// index, access, Q_Key; RTR: path MTU, RNR timer, responder resources; RTS: send PSN,
/// timeout, retry counts, initiator depth). The defaults are rdma-core's pingpongs': port 1,
/// MTU 1024, RNR timer 12 (0.64 ms), timeout 14 (67 ms), 7 retries, RNR retries forever.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectOpts {
    /// Local port (INIT).
    pub port_num: u8,
    /// P_Key index (INIT).
    pub pkey_index: u16,
    /// Remote access this QP allows (INIT, RC/UC).
    pub access: AccessFlags,
    /// Q_Key (INIT, UD).
    pub qkey: u32,
    /// Path MTU in bytes, at most the port's active MTU (RTR, RC/UC).
    pub path_mtu: u32,
    /// This QP's send PSN (RTS); the peer's [`PeerAddr::psn`] is its receive PSN.
    pub sq_psn: u32,
    /// Minimum RNR NAK timer code (RTR, RC).
    pub min_rnr_timer: u8,
    /// Local ACK timeout code (RTS, RC).
    pub timeout: u8,
    /// Transport retries (RTS, RC).
    pub retry_cnt: u8,
    /// RNR retries, 7 = forever (RTS, RC).
    pub rnr_retry: u8,
    /// Outstanding RDMA reads/atomics as initiator (RTS, RC).
    pub max_rd_atomic: u8,
    /// Outstanding RDMA reads/atomics as target (RTR, RC).
    pub max_dest_rd_atomic: u8,
}

impl Default for ConnectOpts {
    /// The defaults of [`QpAttr`], so that a one-call bring-up and hand-written `modify`
    /// calls start from the same values.
    fn default() -> Self {
        let a = QpAttr::default();
        ConnectOpts {
            port_num: a.port_num,
            pkey_index: a.pkey_index,
            access: a.access,
            qkey: a.qkey,
            path_mtu: a.path_mtu,
            sq_psn: a.sq_psn,
            min_rnr_timer: a.min_rnr_timer,
            timeout: a.timeout,
            retry_cnt: a.retry_cnt,
            rnr_retry: a.rnr_retry,
            max_rd_atomic: a.max_rd_atomic,
            max_dest_rd_atomic: a.max_dest_rd_atomic,
        }
    }
}

/// The destination QPN of a multicast send (IB: DQPN 0xFFFFFF).
pub const MCAST_QPN: u32 = 0x00ff_ffff;

//! Queue pair types, states, the state machine, and creation/modify attributes.

use super::access::AccessFlags;

/// Transport service type (`enum ibv_qp_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(u8)]
pub enum QpType {
    /// Reliable connected.
    #[default]
    Rc = 2,
    /// Unreliable connected.
    Uc = 3,
    /// Unreliable datagram.
    Ud = 4,
    /// Raw Ethernet frames (`IBV_QPT_RAW_PACKET`): SEND only, receives are whole frames at
    /// offset 0 of the buffer (no GRH), steered to the QP by flow rules ([`crate::verbs::FlowSpec`]).
    RawPacket = 8,
    /// The sending half of an XRC connection (`IBV_QPT_XRC_SEND`, the "INI" QP): takes RC's
    /// opcodes, has no receive queue, and names the target SRQ in every request
    /// ([`crate::verbs::SendWr::xrc_srqn`]).
    XrcSend = 9,
    /// The receiving half of an XRC connection (`IBV_QPT_XRC_RECV`, the "TGT" QP): belongs to an
    /// XRC domain, not a PD; has no send or receive queue of its own, and hands each message to
    /// the XRC SRQ of its domain that the request names.
    XrcRecv = 10,
}

impl QpType {
    /// Decodes the on-fabric byte.
    pub fn from_u8(v: u8) -> Option<QpType> {
        match v {
            2 => Some(QpType::Rc),
            3 => Some(QpType::Uc),
            4 => Some(QpType::Ud),
            8 => Some(QpType::RawPacket),
            9 => Some(QpType::XrcSend),
            10 => Some(QpType::XrcRecv),
            _ => None,
        }
    }

    /// Whether the QP is connected to exactly one remote QP (RC, UC, and both XRC halves).
    pub fn is_connected(self) -> bool {
        matches!(self, QpType::Rc | QpType::Uc | QpType::XrcSend | QpType::XrcRecv)
    }

    /// Whether requests are acknowledged and retried (RC and XRC): an error reaches the
    /// requester's completion, an absent receive is an RNR wait rather than a drop.
    pub fn is_reliable(self) -> bool {
        matches!(self, QpType::Rc | QpType::XrcSend)
    }

    /// Whether this is one of the two XRC QP types.
    pub fn is_xrc(self) -> bool {
        matches!(self, QpType::XrcSend | QpType::XrcRecv)
    }

    /// The type of the QP at the other end of a connection of this type: XRC_SEND talks to
    /// XRC_RECV and back; RC and UC talk to their own kind.
    pub fn peer_type(self) -> QpType {
        match self {
            QpType::XrcSend => QpType::XrcRecv,
            QpType::XrcRecv => QpType::XrcSend,
            t => t,
        }
    }
}

/// Queue pair state (`enum ibv_qp_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
#[repr(u8)]
pub enum QpState {
    /// Just created or reset: accepts nothing.
    #[default]
    Reset = 0,
    /// Initialized: receives may be posted, nothing is processed.
    Init = 1,
    /// Ready to receive: incoming messages are processed.
    Rtr = 2,
    /// Ready to send.
    Rts = 3,
    /// Send queue drained.
    Sqd = 4,
    /// Send queue error.
    Sqe = 5,
    /// Error: every outstanding and new request completes with a flush error.
    Error = 6,
}

impl QpState {
    /// Decodes the on-fabric byte.
    #[inline]
    pub fn from_u8(v: u8) -> Option<QpState> {
        use QpState::*;
        Some(match v {
            0 => Reset,
            1 => Init,
            2 => Rtr,
            3 => Rts,
            4 => Sqd,
            5 => Sqe,
            6 => Error,
            _ => return None,
        })
    }

    /// Whether an incoming message is processed (and an SRQ receive fetched) in this state
    /// (SRQ notes: "RTR, RTS, SQD or SQE").
    pub fn receives(self) -> bool {
        matches!(self, QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe)
    }

    /// Whether `post_recv` is accepted: every state but RESET (in ERROR it is flushed).
    pub fn accepts_post_recv(self) -> bool {
        self != QpState::Reset
    }

    /// Whether `post_send` is accepted: RTS, SQD, SQE (queued) and ERROR (flushed).
    pub fn accepts_post_send(self) -> bool {
        matches!(self, QpState::Rts | QpState::Sqd | QpState::Sqe | QpState::Error)
    }

    /// `Ok` if `ibv_modify_qp` may move QP `qpn` from `self` to `to`, else `EINVAL` naming the
    /// transition (see [`QpState::can_transition`]).
    pub fn check_transition(self, to: QpState, qpn: u32) -> super::Result<()> {
        if self.can_transition(to) {
            Ok(())
        } else {
            Err(super::Error::new(
                super::Errno::EINVAL,
                format!("QP {qpn:#x}: transition {self:?} -> {to:?} is not allowed"),
            ))
        }
    }

    /// Whether the transition `self -> to` is one `ibv_modify_qp` allows (IB spec 10.3.1):
    /// any state to RESET or ERROR; RESET→INIT; INIT→INIT/RTR; RTR→RTS; RTS→RTS/SQD;
    /// SQD→RTS/SQD; SQE→RTS.
    pub fn can_transition(self, to: QpState) -> bool {
        use QpState::*;
        matches!(
            (self, to),
            (_, Reset)
                | (_, Error)
                | (Reset, Init)
                | (Init, Init)
                | (Init, Rtr)
                | (Rtr, Rts)
                | (Rts, Rts)
                | (Rts, Sqd)
                | (Sqd, Rts)
                | (Sqd, Sqd)
                | (Sqe, Rts)
        )
    }
}

/// Queue capacities requested at creation and reported back (`struct ibv_qp_cap`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpCaps {
    /// Outstanding send work requests.
    pub max_send_wr: u32,
    /// Outstanding receive work requests (ignored with an SRQ).
    pub max_recv_wr: u32,
    /// Scatter/gather entries per send work request.
    pub max_send_sge: u32,
    /// Scatter/gather entries per receive work request.
    pub max_recv_sge: u32,
    /// Bytes that may be sent inline.
    pub max_inline_data: u32,
}

impl Default for QpCaps {
    fn default() -> Self {
        QpCaps { max_send_wr: 128, max_recv_wr: 512, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 64 }
    }
}

/// Network identity of a QP as exchanged out of band (rc_pingpong's `LID:QPN:PSN:GID`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Endpoint {
    /// Local identifier of the port (InfiniBand; 0 on RoCE).
    pub lid: u16,
    /// QP number.
    pub qpn: u32,
    /// Starting packet sequence number.
    pub psn: u32,
    /// Global identifier (RoCE address).
    pub gid: [u8; 16],
}

/// Address vector for a UD destination or a connected QP's remote (`struct ibv_ah_attr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AhAttr {
    /// Destination LID.
    pub dlid: u16,
    /// Whether a GRH is sent (RoCE: always).
    pub is_global: bool,
    /// Destination GID.
    pub dgid: [u8; 16],
    /// Local GID index used as source.
    pub sgid_index: u8,
    /// Hop limit of the GRH.
    pub hop_limit: u8,
    /// Service level.
    pub sl: u8,
    /// Local port.
    pub port_num: u8,
}

/// Attributes for `ibv_modify_qp`. `state` is always applied; other fields are applied when
/// the transition needs them (INIT: port, pkey, access, qkey; RTR: dest, psn, mtu, rnr timer;
/// RTS: sq psn, timeout, retry counts).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpAttr {
    /// The state to move to.
    pub state: QpState,
    /// Physical port (INIT).
    pub port_num: u8,
    /// P_Key index (INIT).
    pub pkey_index: u16,
    /// Remote access allowed to this QP (INIT, RC/UC).
    pub access: AccessFlags,
    /// Q_Key (INIT, UD).
    pub qkey: u32,
    /// Remote QP number (RTR, RC/UC).
    pub dest_qp_num: u32,
    /// Remote address (RTR, RC/UC).
    pub ah: AhAttr,
    /// Path MTU in bytes: 256, 512, 1024, 2048 or 4096 (RTR).
    pub path_mtu: u32,
    /// Expected receive PSN (RTR).
    pub rq_psn: u32,
    /// Send PSN (RTS).
    pub sq_psn: u32,
    /// Minimum RNR NAK timer code, 0..=31 (RTR; IB encoding, 0 = 655.36 ms).
    pub min_rnr_timer: u8,
    /// Local ACK timeout code: 4.096 µs × 2^timeout, 0 = infinite (RTS).
    pub timeout: u8,
    /// Transport retries, 0..=7 (RTS).
    pub retry_cnt: u8,
    /// RNR retries, 0..=7 where 7 means forever (RTS).
    pub rnr_retry: u8,
    /// Outstanding RDMA reads/atomics as initiator (RTS).
    pub max_rd_atomic: u8,
    /// Outstanding RDMA reads/atomics as target (RTR).
    pub max_dest_rd_atomic: u8,
}

impl Default for QpAttr {
    fn default() -> Self {
        QpAttr {
            state: QpState::Reset,
            port_num: 1,
            pkey_index: 0,
            access: AccessFlags::empty(),
            qkey: 0,
            dest_qp_num: 0,
            ah: AhAttr::default(),
            path_mtu: 1024,
            rq_psn: 0,
            sq_psn: 0,
            min_rnr_timer: 12,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            max_rd_atomic: 1,
            max_dest_rd_atomic: 1,
        }
    }
}

/// Converts an IB RNR timer code (0..=31) to nanoseconds (IB spec table 45).
pub fn rnr_timer_ns(code: u8) -> u64 {
    // Codes 1..=31 in units of 10 µs; code 0 is the largest, 655.36 ms.
    const UNITS_10US: [u32; 32] = [
        65536, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072,
        4096, 6144, 8192, 12288, 16384, 24576, 32768, 49152,
    ];
    UNITS_10US[(code & 31) as usize] as u64 * 10_000
}

/// Converts an IB local ACK timeout code to nanoseconds: 4.096 µs × 2^code; 0 means infinite.
pub fn ack_timeout_ns(code: u8) -> Option<u64> {
    match code {
        0 => None,
        c => Some(4096u64 << (c.min(31) as u32)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rnr_table_matches_ib_spec() {
        assert_eq!(rnr_timer_ns(1), 10_000); // 0.01 ms
        assert_eq!(rnr_timer_ns(12), 640_000); // 0.64 ms
        assert_eq!(rnr_timer_ns(31), 491_520_000); // 491.52 ms
        assert_eq!(rnr_timer_ns(0), 655_360_000); // 655.36 ms
    }

    #[test]
    fn state_byte_round_trips() {
        for v in 0..=255u8 {
            match QpState::from_u8(v) {
                Some(s) => assert_eq!(s as u8, v),
                None => assert!(v > QpState::Error as u8),
            }
        }
    }

    #[test]
    fn transitions() {
        use QpState::*;
        assert!(Reset.can_transition(Init));
        assert!(!Reset.can_transition(Rtr));
        assert!(!Init.can_transition(Rts));
        assert!(Rts.can_transition(Error));
        assert!(Error.can_transition(Reset));
        assert!(!Error.can_transition(Rts));
    }
}

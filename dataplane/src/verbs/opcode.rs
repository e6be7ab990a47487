//! Send opcodes, completion opcodes, and the opcode × QP-type table of `ibv_post_send(3)`.

use super::qp::QpType;

/// Operation of a send work request (`enum ibv_wr_opcode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(u8)]
pub enum WrOpcode {
    /// Send: consumes a receive request at the target.
    #[default]
    Send = 0,
    /// Send with a 32-bit immediate delivered in the receiver's completion.
    SendWithImm,
    /// Write into remote memory; consumes no receive.
    RdmaWrite,
    /// Write into remote memory and deliver an immediate; consumes a receive at the target.
    RdmaWriteWithImm,
    /// Read from remote memory.
    RdmaRead,
    /// 64-bit compare and swap on remote memory.
    AtomicCmpAndSwp,
    /// 64-bit fetch and add on remote memory.
    AtomicFetchAndAdd,
    /// Invalidate a local memory key.
    LocalInv,
    /// Bind a type-2 memory window.
    BindMw,
    /// Send, and invalidate a remote key at the target.
    SendWithInv,
    /// TCP segmentation offload (UD and raw packet QPs).
    Tso,
}

impl WrOpcode {
    /// Every opcode, in `ibv_wr_opcode` order of the seed table.
    pub const ALL: [WrOpcode; 11] = [
        WrOpcode::Send,
        WrOpcode::SendWithImm,
        WrOpcode::RdmaWrite,
        WrOpcode::RdmaWriteWithImm,
        WrOpcode::RdmaRead,
        WrOpcode::AtomicCmpAndSwp,
        WrOpcode::AtomicFetchAndAdd,
        WrOpcode::LocalInv,
        WrOpcode::BindMw,
        WrOpcode::SendWithInv,
        WrOpcode::Tso,
    ];

    /// Whether the seed table of `ibv_post_send(3)` allows this opcode on this QP type.
    ///
    /// | opcode | UD | UC | RC | XRC_SEND | RAW_PACKET |
    /// |---|---|---|---|---|---|
    /// | SEND | X | X | X | X | X |
    /// | SEND_WITH_IMM | X | X | X | X |  |
    /// | RDMA_WRITE, RDMA_WRITE_WITH_IMM |  | X | X | X |  |
    /// | RDMA_READ, atomics |  |  | X | X |  |
    /// | LOCAL_INV, BIND_MW, SEND_WITH_INV |  | X | X | X |  |
    /// | TSO | X |  |  |  | X |
    ///
    /// RAW_PACKET takes SEND (with or without `IBV_SEND_IP_CSUM`) and TSO only. An XRC_RECV
    /// QP has no send queue: nothing is allowed on it.
    pub fn allowed_on(self, qp_type: QpType) -> bool {
        use QpType::*;
        use WrOpcode::*;
        if qp_type == XrcRecv {
            return false;
        }
        match self {
            Send => true,
            SendWithImm => !matches!(qp_type, RawPacket),
            RdmaWrite | RdmaWriteWithImm | LocalInv | BindMw | SendWithInv => {
                matches!(qp_type, Uc | Rc | XrcSend)
            }
            RdmaRead | AtomicCmpAndSwp | AtomicFetchAndAdd => matches!(qp_type, Rc | XrcSend),
            Tso => matches!(qp_type, Ud | RawPacket),
        }
    }

    /// Whether this operation consumes a receive request at the target (SRQ notes: Send, Send
    /// with Immediate, RDMA Write with immediate; Send with Invalidate is a Send).
    pub fn consumes_recv(self) -> bool {
        matches!(self, WrOpcode::Send | WrOpcode::SendWithImm | WrOpcode::RdmaWriteWithImm | WrOpcode::SendWithInv)
    }

    /// Whether the work request carries an immediate value.
    pub fn has_imm(self) -> bool {
        matches!(self, WrOpcode::SendWithImm | WrOpcode::RdmaWriteWithImm)
    }

    /// Whether `IBV_SEND_INLINE` is valid ("Valid only for Send and RDMA Write").
    pub fn inline_allowed(self) -> bool {
        matches!(
            self,
            WrOpcode::Send
                | WrOpcode::SendWithImm
                | WrOpcode::SendWithInv
                | WrOpcode::RdmaWrite
                | WrOpcode::RdmaWriteWithImm
        )
    }

    /// Whether `IBV_SEND_SOLICITED` is valid ("Valid only for Send and RDMA Write with
    /// immediate").
    pub fn solicited_allowed(self) -> bool {
        matches!(self, WrOpcode::Send | WrOpcode::SendWithImm | WrOpcode::SendWithInv | WrOpcode::RdmaWriteWithImm)
    }

    /// The completion opcode the requester sees for this operation.
    pub fn wc_opcode(self) -> WcOpcode {
        match self {
            WrOpcode::Send | WrOpcode::SendWithImm | WrOpcode::SendWithInv => WcOpcode::Send,
            WrOpcode::RdmaWrite | WrOpcode::RdmaWriteWithImm => WcOpcode::RdmaWrite,
            WrOpcode::RdmaRead => WcOpcode::RdmaRead,
            WrOpcode::AtomicCmpAndSwp => WcOpcode::CompSwap,
            WrOpcode::AtomicFetchAndAdd => WcOpcode::FetchAdd,
            WrOpcode::LocalInv => WcOpcode::LocalInv,
            WrOpcode::BindMw => WcOpcode::BindMw,
            WrOpcode::Tso => WcOpcode::Tso,
        }
    }

    /// rdma-core's name, e.g. `"IBV_WR_SEND"`.
    pub fn name(self) -> &'static str {
        match self {
            WrOpcode::Send => "IBV_WR_SEND",
            WrOpcode::SendWithImm => "IBV_WR_SEND_WITH_IMM",
            WrOpcode::RdmaWrite => "IBV_WR_RDMA_WRITE",
            WrOpcode::RdmaWriteWithImm => "IBV_WR_RDMA_WRITE_WITH_IMM",
            WrOpcode::RdmaRead => "IBV_WR_RDMA_READ",
            WrOpcode::AtomicCmpAndSwp => "IBV_WR_ATOMIC_CMP_AND_SWP",
            WrOpcode::AtomicFetchAndAdd => "IBV_WR_ATOMIC_FETCH_AND_ADD",
            WrOpcode::LocalInv => "IBV_WR_LOCAL_INV",
            WrOpcode::BindMw => "IBV_WR_BIND_MW",
            WrOpcode::SendWithInv => "IBV_WR_SEND_WITH_INV",
            WrOpcode::Tso => "IBV_WR_TSO",
        }
    }
}

/// Operation of a completion (`enum ibv_wc_opcode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(u8)]
pub enum WcOpcode {
    /// A send completed (requester side).
    #[default]
    Send = 0,
    /// An RDMA write completed (requester side).
    RdmaWrite,
    /// An RDMA read completed.
    RdmaRead,
    /// A compare-and-swap completed.
    CompSwap,
    /// A fetch-and-add completed.
    FetchAdd,
    /// A memory window bind completed.
    BindMw,
    /// A local invalidate completed.
    LocalInv,
    /// A TSO send completed.
    Tso,
    /// A receive request was consumed by a send (responder side).
    Recv,
    /// A receive request was consumed by an RDMA write with immediate.
    RecvRdmaWithImm,
    /// Tag-matching: a tag was added.
    TmAdd,
    /// Tag-matching: a tag was deleted.
    TmDel,
    /// Tag-matching: a sync operation completed.
    TmSync,
    /// Tag-matching: a tagged message landed in a tagged buffer.
    TmRecv,
    /// Tag-matching: no-tag message.
    TmNoTag,
}

impl WcOpcode {
    /// Whether this completion belongs to a receive queue (`opcode & IBV_WC_RECV`).
    pub fn is_recv(self) -> bool {
        matches!(self, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm | WcOpcode::TmRecv | WcOpcode::TmNoTag)
    }

    /// Decodes the on-ring byte; unknown values are `None`.
    #[inline]
    pub fn from_u8(v: u8) -> Option<WcOpcode> {
        use WcOpcode::*;
        Some(match v {
            0 => Send,
            1 => RdmaWrite,
            2 => RdmaRead,
            3 => CompSwap,
            4 => FetchAdd,
            5 => BindMw,
            6 => LocalInv,
            7 => Tso,
            8 => Recv,
            9 => RecvRdmaWithImm,
            10 => TmAdd,
            11 => TmDel,
            12 => TmSync,
            13 => TmRecv,
            14 => TmNoTag,
            _ => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wc_opcode_byte_round_trips_and_rejects_unknown() {
        for v in 0..=255u8 {
            match WcOpcode::from_u8(v) {
                Some(op) => assert_eq!(op as u8, v),
                None => assert!(v > WcOpcode::TmNoTag as u8),
            }
        }
    }

    #[test]
    fn seed_table_rows() {
        use QpType::*;
        // The five columns of the seed table, in its order.
        let allowed = |op: WrOpcode| [Ud, Uc, Rc, XrcSend, RawPacket].map(|t| op.allowed_on(t));
        assert_eq!(allowed(WrOpcode::Send), [true, true, true, true, true]);
        assert_eq!(allowed(WrOpcode::SendWithImm), [true, true, true, true, false]);
        assert_eq!(allowed(WrOpcode::RdmaWrite), [false, true, true, true, false]);
        assert_eq!(allowed(WrOpcode::RdmaWriteWithImm), [false, true, true, true, false]);
        assert_eq!(allowed(WrOpcode::RdmaRead), [false, false, true, true, false]);
        assert_eq!(allowed(WrOpcode::AtomicCmpAndSwp), [false, false, true, true, false]);
        assert_eq!(allowed(WrOpcode::AtomicFetchAndAdd), [false, false, true, true, false]);
        assert_eq!(allowed(WrOpcode::LocalInv), [false, true, true, true, false]);
        assert_eq!(allowed(WrOpcode::BindMw), [false, true, true, true, false]);
        assert_eq!(allowed(WrOpcode::SendWithInv), [false, true, true, true, false]);
        assert_eq!(allowed(WrOpcode::Tso), [true, false, false, false, true]);
        // The receiving half of XRC has no send queue.
        assert!(WrOpcode::ALL.iter().all(|op| !op.allowed_on(XrcRecv)));
    }

    #[test]
    fn receive_consuming_opcodes_are_the_srq_notes_list() {
        let consuming: Vec<_> = WrOpcode::ALL.into_iter().filter(|o| o.consumes_recv()).collect();
        assert_eq!(
            consuming,
            [WrOpcode::Send, WrOpcode::SendWithImm, WrOpcode::RdmaWriteWithImm, WrOpcode::SendWithInv]
        );
    }
}

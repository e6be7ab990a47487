//! Work completions (`struct ibv_wc`) and their status codes.

use super::opcode::WcOpcode;

/// Completion status (`enum ibv_wc_status`), with rdma-core's numbering.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(u8)]
pub enum WcStatus {
    /// The operation completed successfully.
    #[default]
    Success = 0,
    /// Local length error: a receive buffer too small, or a send larger than allowed.
    LocLenErr,
    /// Local QP operation error.
    LocQpOpErr,
    /// Local EE context operation error.
    LocEecOpErr,
    /// Local protection error: an SGE outside its MR or with a bad lkey.
    LocProtErr,
    /// Flushed: the QP was in (or entered) the ERROR state.
    WrFlushErr,
    /// Memory window bind error.
    MwBindErr,
    /// Bad response.
    BadRespErr,
    /// Local access error.
    LocAccessErr,
    /// Remote invalid request: the responder could not accept the message (e.g. too long).
    RemInvReqErr,
    /// Remote access error: bad rkey, out of bounds, or the MR lacks the access right.
    RemAccessErr,
    /// Remote operation error: the responder failed to complete the operation.
    RemOpErr,
    /// Transport retries exhausted: the responder did not answer.
    RetryExcErr,
    /// RNR retries exhausted: the responder had no receive posted.
    RnrRetryExcErr,
    /// Local RDD violation.
    LocRddViolErr,
    /// Remote invalid RD request.
    RemInvRdReqErr,
    /// Remote aborted.
    RemAbortErr,
    /// Invalid EE context number.
    InvEecnErr,
    /// Invalid EE context state.
    InvEecStateErr,
    /// Fatal error.
    FatalErr,
    /// Response timeout.
    RespTimeoutErr,
    /// General error.
    GeneralErr,
    /// Tag-matching error (e.g. deleting a consumed tag).
    TmErr,
    /// Tag-matching rendezvous incomplete.
    TmRndvIncomplete,
}

impl WcStatus {
    /// rdma-core's `ibv_wc_status_str` text.
    pub fn as_str(self) -> &'static str {
        use WcStatus::*;
        match self {
            Success => "success",
            LocLenErr => "local length error",
            LocQpOpErr => "local QP operation error",
            LocEecOpErr => "local EE context operation error",
            LocProtErr => "local protection error",
            WrFlushErr => "Work Request Flushed Error",
            MwBindErr => "memory management operation error",
            BadRespErr => "bad response error",
            LocAccessErr => "local access error",
            RemInvReqErr => "remote invalid request error",
            RemAccessErr => "remote access error",
            RemOpErr => "remote operation error",
            RetryExcErr => "transport retry counter exceeded",
            RnrRetryExcErr => "RNR retry counter exceeded",
            LocRddViolErr => "local RDD violation error",
            RemInvRdReqErr => "remote invalid RD request",
            RemAbortErr => "aborted error",
            InvEecnErr => "invalid EE context number",
            InvEecStateErr => "invalid EE context state",
            FatalErr => "fatal error",
            RespTimeoutErr => "response timeout error",
            GeneralErr => "general error",
            TmErr => "TM error",
            TmRndvIncomplete => "TM rendezvous incomplete",
        }
    }

    /// Decodes the on-ring byte; unknown values are `GeneralErr` (a corrupt ring entry never
    /// passes as success).
    pub fn from_u8(v: u8) -> WcStatus {
        use WcStatus::*;
        [
            Success,
            LocLenErr,
            LocQpOpErr,
            LocEecOpErr,
            LocProtErr,
            WrFlushErr,
            MwBindErr,
            BadRespErr,
            LocAccessErr,
            RemInvReqErr,
            RemAccessErr,
            RemOpErr,
            RetryExcErr,
            RnrRetryExcErr,
            LocRddViolErr,
            RemInvRdReqErr,
            RemAbortErr,
            InvEecnErr,
            InvEecStateErr,
            FatalErr,
            RespTimeoutErr,
            GeneralErr,
            TmErr,
            TmRndvIncomplete,
        ]
        .get(v as usize)
        .copied()
        .unwrap_or(GeneralErr)
    }
}

impl std::fmt::Display for WcStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

bitflags::bitflags! {
    /// Completion flags (`enum ibv_wc_flags`).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct WcFlags: u32 {
        /// A GRH is present in the first 40 bytes of the receive buffer (UD).
        const GRH = 1;
        /// `imm_data` is valid.
        const WITH_IMM = 1 << 1;
        /// The IP checksum was verified.
        const IP_CSUM_OK = 1 << 2;
        /// `invalidated_rkey` is valid.
        const WITH_INV = 1 << 3;
        /// Tag matching asks software to sync its unexpected count.
        const TM_SYNC_REQ = 1 << 4;
        /// The message matched a tag.
        const TM_MATCH = 1 << 5;
        /// The whole tagged payload is in the buffer.
        const TM_DATA_VALID = 1 << 6;
    }
}

/// A work completion (`struct ibv_wc`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WorkCompletion {
    /// The `wr_id` of the work request this completes.
    pub wr_id: u64,
    /// Outcome.
    pub status: WcStatus,
    /// Operation (valid only when `status` is success, as in verbs).
    pub opcode: WcOpcode,
    /// Provider-specific error detail.
    pub vendor_err: u32,
    /// Bytes received (receive completions; for UD it includes the 40-byte GRH area).
    pub byte_len: u32,
    /// Immediate data (with `WITH_IMM`) or invalidated rkey (with `WITH_INV`).
    pub imm_data: u32,
    /// Local QP number the completion belongs to.
    pub qp_num: u32,
    /// Source QP number (UD receives).
    pub src_qp: u32,
    /// Flags.
    pub wc_flags: WcFlags,
    /// P_Key index (GSI).
    pub pkey_index: u16,
    /// Source LID.
    pub slid: u16,
    /// Service level.
    pub sl: u8,
    /// Destination LID path bits.
    pub dlid_path_bits: u8,
}

impl WorkCompletion {
    /// Whether the completion reports success.
    pub fn is_ok(&self) -> bool {
        self.status == WcStatus::Success
    }
}

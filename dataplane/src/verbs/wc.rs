//! Work completions (`struct ibv_wc`) and their status codes.

use super::opcode::WcOpcode;

/// Declares [`WcStatus`] from one line per status: variant, rdma-core's number, and
/// `ibv_wc_status_str`'s text, so the three cannot drift apart.
macro_rules! wc_statuses {
    ($($(#[$attr:meta])* $name:ident = $raw:literal => $text:literal,)*) => {
        /// Completion status (`enum ibv_wc_status`), with rdma-core's numbering.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
        #[repr(u8)]
        pub enum WcStatus {
            $($(#[$attr])* $name = $raw,)*
        }

        impl WcStatus {
            /// rdma-core's `ibv_wc_status_str` text.
            pub fn as_str(self) -> &'static str {
                match self {
                    $(WcStatus::$name => $text,)*
                }
            }

            /// Decodes the on-ring byte; unknown values are `GeneralErr` (a corrupt ring entry
            /// never passes as success).
            pub fn from_u8(v: u8) -> WcStatus {
                match v {
                    $($raw => WcStatus::$name,)*
                    _ => WcStatus::GeneralErr,
                }
            }
        }
    };
}

wc_statuses! {
    /// The operation completed successfully.
    #[default]
    Success = 0 => "success",
    /// Local length error: a receive buffer too small, or a send larger than allowed.
    LocLenErr = 1 => "local length error",
    /// Local QP operation error.
    LocQpOpErr = 2 => "local QP operation error",
    /// Local EE context operation error.
    LocEecOpErr = 3 => "local EE context operation error",
    /// Local protection error: an SGE outside its MR or with a bad lkey.
    LocProtErr = 4 => "local protection error",
    /// Flushed: the QP was in (or entered) the ERROR state.
    WrFlushErr = 5 => "Work Request Flushed Error",
    /// Memory window bind error.
    MwBindErr = 6 => "memory management operation error",
    /// Bad response.
    BadRespErr = 7 => "bad response error",
    /// Local access error.
    LocAccessErr = 8 => "local access error",
    /// Remote invalid request: the responder could not accept the message (e.g. too long).
    RemInvReqErr = 9 => "remote invalid request error",
    /// Remote access error: bad rkey, out of bounds, or the MR lacks the access right.
    RemAccessErr = 10 => "remote access error",
    /// Remote operation error: the responder failed to complete the operation.
    RemOpErr = 11 => "remote operation error",
    /// Transport retries exhausted: the responder did not answer.
    RetryExcErr = 12 => "transport retry counter exceeded",
    /// RNR retries exhausted: the responder had no receive posted.
    RnrRetryExcErr = 13 => "RNR retry counter exceeded",
    /// Local RDD violation.
    LocRddViolErr = 14 => "local RDD violation error",
    /// Remote invalid RD request.
    RemInvRdReqErr = 15 => "remote invalid RD request",
    /// Remote aborted.
    RemAbortErr = 16 => "aborted error",
    /// Invalid EE context number.
    InvEecnErr = 17 => "invalid EE context number",
    /// Invalid EE context state.
    InvEecStateErr = 18 => "invalid EE context state",
    /// Fatal error.
    FatalErr = 19 => "fatal error",
    /// Response timeout.
    RespTimeoutErr = 20 => "response timeout error",
    /// General error.
    GeneralErr = 21 => "general error",
    /// Tag-matching error (e.g. deleting a consumed tag).
    TmErr = 22 => "TM error",
    /// Tag-matching rendezvous incomplete.
    TmRndvIncomplete = 23 => "TM rendezvous incomplete",
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn from_u8_decodes_every_status_to_its_own_number() {
        for v in 0..=u8::MAX {
            let s = WcStatus::from_u8(v);
            if v <= WcStatus::TmRndvIncomplete as u8 {
                assert_eq!(s as u8, v, "{s:?}");
            } else {
                assert_eq!(s, WcStatus::GeneralErr, "byte {v}");
            }
        }
    }

    #[test]
    fn status_text_is_rdma_cores() {
        assert_eq!(WcStatus::default(), WcStatus::Success);
        assert_eq!(WcStatus::WrFlushErr.to_string(), "Work Request Flushed Error");
        assert_eq!(WcStatus::from_u8(13).as_str(), "RNR retry counter exceeded");
    }
}

//! Shared receive queue attributes (`struct ibv_srq_attr`).

/// SRQ attributes, at creation and for `modify_srq`/`query_srq`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SrqAttr {
    /// Maximum outstanding receive requests.
    pub max_wr: u32,
    /// Maximum scatter/gather entries per request.
    pub max_sge: u32,
    /// Limit: when the number of posted requests drops below it, the SRQ raises
    /// `IBV_EVENT_SRQ_LIMIT_REACHED` once and disarms (0 = disarmed).
    pub srq_limit: u32,
}

impl Default for SrqAttr {
    fn default() -> Self {
        SrqAttr { max_wr: 1024, max_sge: 1, srq_limit: 0 }
    }
}

bitflags::bitflags! {
    /// Which attributes `modify_srq` changes (`enum ibv_srq_attr_mask`).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct SrqAttrMask: u32 {
        /// Resize the SRQ (only where the device supports it).
        const MAX_WR = 1;
        /// Arm the limit event with `srq_limit`.
        const LIMIT = 1 << 1;
    }
}

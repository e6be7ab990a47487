//! Tag matching (`ibv_post_srq_ops(3)`): operations on a tag-matching SRQ's list, and the tag
//! header (TMH) senders put at the start of tagged messages.
//!
//! A tagged buffer is added with TAG_ADD (the provider returns a handle), removed with TAG_DEL
//! (which fails with `IBV_WC_TM_ERR` if a message consumed it first), and TAG_SYNC reports how
//! many unexpected messages software has handled. A message matches an entry when
//! `TMH.tag & entry.mask == entry.tag`. A message that matches nothing lands whole in a plain
//! SRQ buffer; matching then stays off until software's count of handled unexpected messages
//! equals the device's (phase synchronisation).

use super::wr::Sge;

/// Limits of a tag-matching SRQ (`struct ibv_tm_cap`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TmCaps {
    /// Entries the tag list can hold.
    pub max_num_tags: u32,
    /// List operations one `post_srq_ops` may carry.
    pub max_ops: u32,
}

/// Operation of an ops work request (`enum ibv_ops_wr_opcode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OpsOpcode {
    /// Add a tagged buffer; the provider writes its handle back into the request.
    #[default]
    TagAdd,
    /// Remove the entry named by `handle`.
    TagDel,
    /// Only update the unexpected-message count.
    TagSync,
}

bitflags::bitflags! {
    /// Flags of an ops work request (`enum ibv_ops_flags`).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct OpsFlags: u32 {
        /// Generate a completion (TM_ADD / TM_DEL / TM_SYNC) on the SRQ's CQ.
        const SIGNALED = 1;
        /// `unexpected_cnt` carries software's count of handled unexpected messages.
        const TM_SYNC = 1 << 1;
    }
}

/// An ops work request (`struct ibv_ops_wr`); its SGEs (TAG_ADD) live in the [`OpsChain`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OpsWr {
    /// User-defined ID of the list operation's own completion.
    pub wr_id: u64,
    /// Operation.
    pub opcode: OpsOpcode,
    /// Flags.
    pub flags: OpsFlags,
    /// Unexpected messages handled by software (with `TM_SYNC`).
    pub unexpected_cnt: u32,
    /// TAG_DEL: the entry to remove. TAG_ADD: written by the provider.
    pub handle: u32,
    /// TAG_ADD: `wr_id` of the receive completion when a message lands in this buffer.
    pub recv_wr_id: u64,
    /// TAG_ADD: the tag.
    pub tag: u64,
    /// TAG_ADD: the mask; a message matches when `tmh.tag & mask == tag`.
    pub mask: u64,
    sge_start: u32,
    num_sge: u32,
}

impl OpsWr {
    /// A TAG_ADD of a buffer for messages whose tag masked by `mask` equals `tag`.
    pub fn add(wr_id: u64, recv_wr_id: u64, tag: u64, mask: u64) -> OpsWr {
        OpsWr { wr_id, opcode: OpsOpcode::TagAdd, recv_wr_id, tag, mask, ..Default::default() }
    }

    /// A TAG_DEL of entry `handle`.
    pub fn del(wr_id: u64, handle: u32) -> OpsWr {
        OpsWr { wr_id, opcode: OpsOpcode::TagDel, handle, ..Default::default() }
    }

    /// A TAG_SYNC reporting `unexpected_cnt` handled unexpected messages.
    pub fn sync(wr_id: u64, unexpected_cnt: u32) -> OpsWr {
        OpsWr { wr_id, opcode: OpsOpcode::TagSync, unexpected_cnt, flags: OpsFlags::TM_SYNC, ..Default::default() }
    }

    /// Adds flags.
    pub fn flags(mut self, f: OpsFlags) -> OpsWr {
        self.flags |= f;
        self
    }

    /// Adds `IBV_OPS_SIGNALED`.
    pub fn signaled(self) -> OpsWr {
        self.flags(OpsFlags::SIGNALED)
    }

    /// Sets `unexpected_cnt` with `IBV_OPS_TM_SYNC`.
    pub fn synced(mut self, unexpected_cnt: u32) -> OpsWr {
        self.unexpected_cnt = unexpected_cnt;
        self.flags(OpsFlags::TM_SYNC)
    }
}

super::wr::chain!(
    /// A list of ops work requests posted with one call. `post_srq_ops` writes TAG_ADD handles
    /// back into it (read them with [`OpsChain::wrs`] after posting).
    OpsChain,
    OpsWr
);

impl OpsChain {
    fn reset_extra(_: &mut OpsWr) {}
}

/// Operation in a tag header (`enum ibv_tmh_op`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum TmhOp {
    /// Untagged message on a tag-matching QP.
    NoTag = 0,
    /// Rendezvous: a remote buffer descriptor follows the header.
    Rndv = 1,
    /// Rendezvous finish.
    Fin = 2,
    /// Eager message.
    Eager = 3,
}

/// Bytes of a tag header.
pub const TMH_LEN: usize = 16;

/// The tag header at the start of a tagged message (`struct ibv_tmh`): opcode, 3 reserved
/// bytes, `app_ctx` and `tag`, big-endian on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tmh {
    /// Operation.
    pub op: TmhOp,
    /// Application context, delivered with the match.
    pub app_ctx: u32,
    /// The tag.
    pub tag: u64,
}

impl Tmh {
    /// An eager header for `tag`.
    pub fn eager(tag: u64, app_ctx: u32) -> Tmh {
        Tmh { op: TmhOp::Eager, app_ctx, tag }
    }

    /// Wire bytes.
    pub fn to_bytes(self) -> [u8; TMH_LEN] {
        let mut b = [0u8; TMH_LEN];
        b[0] = self.op as u8;
        b[4..8].copy_from_slice(&self.app_ctx.to_be_bytes());
        b[8..16].copy_from_slice(&self.tag.to_be_bytes());
        b
    }

    /// Parses wire bytes; `None` for an unknown opcode.
    pub fn from_bytes(b: &[u8; TMH_LEN]) -> Option<Tmh> {
        let op = match b[0] {
            0 => TmhOp::NoTag,
            1 => TmhOp::Rndv,
            2 => TmhOp::Fin,
            3 => TmhOp::Eager,
            _ => return None,
        };
        Some(Tmh {
            op,
            app_ctx: u32::from_be_bytes(b[4..8].try_into().expect("4 bytes")),
            tag: u64::from_be_bytes(b[8..16].try_into().expect("8 bytes")),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tmh_round_trips() {
        let h = Tmh::eager(0x0102_0304_0506_0708, 0xaabb_ccdd);
        let b = h.to_bytes();
        assert_eq!(b[0], 3);
        assert_eq!(&b[8..16], &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(Tmh::from_bytes(&b), Some(h));
        let mut bad = b;
        bad[0] = 9;
        assert_eq!(Tmh::from_bytes(&bad), None);
    }

    #[test]
    fn ops_chain_keeps_each_requests_sges_and_its_capacity() {
        let mut c = OpsChain::with_capacity(2, 1);
        c.push(OpsWr::add(1, 10, 0xab, !0), &[Sge::new(0x1000, 64, 7)]);
        c.push(OpsWr::del(2, 5), &[]);
        assert_eq!(c.len(), 2);
        assert_eq!(c.sges(0), &[Sge::new(0x1000, 64, 7)]);
        assert_eq!(c.sges(1), &[]);
        c.wrs_mut()[0].handle = 42;
        assert_eq!(c.iter().map(|(w, s)| (w.handle, s.len())).collect::<Vec<_>>(), [(42, 1), (5, 0)]);
        c.clear();
        assert!(c.is_empty());
    }
}

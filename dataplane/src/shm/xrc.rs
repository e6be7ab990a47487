//! XRC domains of the `shm` provider.
//!
//! A domain is a number from the fabric's PD counter (so no PD and no domain share one), or,
//! for a domain opened with a file, a number derived from the file's device and inode with the
//! top bit set (the counter never gets there), so every process opening it agrees. XRC
//! SRQs store it in their slot, XRC_RECV QPs in theirs; a sender on an XRC_SEND QP delivers
//! into the SRQ its request names only when the two numbers agree (`exec::xrc_dest`).
//!
//! An XRC_RECV QP has no PD and no CQ of its own, but the QP machinery wants both: the domain
//! holds a private PD number (no MR can belong to it) and a one-entry CQ nothing completes on,
//! and lends them to the QPs it creates.

use super::cq::ShmCq;
use super::mr::PdInner;
use super::qp::ShmQp;
use super::{CtxInner, Shm};
use crate::verbs::{Errno, Error, QpCaps, QpType, Result};
use crate::QpInitAttr;
use std::sync::Arc;

/// An XRC domain of the `shm` provider (`ibv_open_xrcd`).
pub struct ShmXrcd {
    pub(crate) id: u32,
    pub(crate) ctx: Arc<CtxInner>,
    /// The PD lent to this domain's XRC_RECV QPs.
    pd: Arc<PdInner>,
    /// The CQ lent to them: nothing ever completes on it.
    cq: ShmCq,
}

impl ShmXrcd {
    /// A new domain of this context's own (`id` None), or the one of a file's inode.
    pub(crate) fn open(ctx: &Arc<CtxInner>, id: Option<u32>) -> Result<ShmXrcd> {
        let f = &ctx.fabric;
        let cq = ShmCq::create(ctx, 1)?;
        let pd = Arc::new(PdInner { ctx: ctx.clone(), pdn: f.next_pd() });
        Ok(ShmXrcd { id: id.unwrap_or_else(|| f.next_pd()), ctx: ctx.clone(), pd, cq })
    }

    /// The domain number of the file with this device and inode: FNV-1a of the two, with the
    /// top bit set (PD-counter numbers stay below 2^31).
    pub(crate) fn file_id(dev: u64, ino: u64) -> u32 {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in dev.to_le_bytes().into_iter().chain(ino.to_le_bytes()) {
            h = (h ^ b as u64).wrapping_mul(0x100_0000_01b3);
        }
        0x8000_0000 | ((h ^ (h >> 32)) as u32 & 0x7fff_ffff)
    }

    /// The domain's number (what its SRQs and XRC_RECV QPs carry in the fabric).
    pub fn id(&self) -> u32 {
        self.id
    }
}

/// The domain number of `file` ([`ShmXrcd::file_id`] of its device and inode).
pub(crate) fn id_of_file(file: &std::fs::File) -> Result<u32> {
    use std::os::unix::fs::MetadataExt;
    let m = file.metadata().map_err(|e| {
        Error::new(
            Errno::from_raw(e.raw_os_error().unwrap_or(libc::EBADF)),
            format!("open_xrcd: cannot stat the file: {e}"),
        )
    })?;
    Ok(ShmXrcd::file_id(m.dev(), m.ino()))
}

impl crate::Xrcd<Shm> for ShmXrcd {
    fn create_recv_qp(&self) -> Result<ShmQp> {
        let attr = QpInitAttr::<Shm> {
            send_cq: &self.cq,
            recv_cq: &self.cq,
            srq: None,
            // No queue of its own: one send slot keeps the QP machinery's invariants (nothing
            // can be posted: every opcode is refused on XRC_RECV).
            cap: QpCaps { max_send_wr: 1, max_recv_wr: 0, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 0 },
            qp_type: QpType::XrcRecv,
            sq_sig_all: false,
        };
        ShmQp::create_in(&self.pd, &attr, self.id)
    }
}

#[cfg(test)]
mod tests {
    use super::ShmXrcd;

    #[test]
    fn file_ids_are_stable_distinct_and_above_the_counter() {
        let a = ShmXrcd::file_id(2049, 131);
        assert_eq!(a, ShmXrcd::file_id(2049, 131));
        assert_ne!(a, ShmXrcd::file_id(2049, 132));
        assert_ne!(a, ShmXrcd::file_id(2050, 131));
        assert!(a >= 0x8000_0000);
    }
}

//! XRC domains of the `shm` provider.
//!
//! A domain is a number from the fabric's PD counter (so no PD and no domain share one). XRC
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
use crate::verbs::{QpCaps, QpType, Result};
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
    pub(crate) fn open(ctx: &Arc<CtxInner>) -> Result<ShmXrcd> {
        let f = &ctx.fabric;
        let cq = ShmCq::create(ctx, 1)?;
        let pd = Arc::new(PdInner { ctx: ctx.clone(), pdn: f.next_pd() });
        Ok(ShmXrcd { id: f.next_pd(), ctx: ctx.clone(), pd, cq })
    }

    /// The domain's number (what its SRQs and XRC_RECV QPs carry in the fabric).
    pub fn id(&self) -> u32 {
        self.id
    }
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

//! What an shm device and its fabric can hold, known without opening one: for checks made
//! before a run (`dataplane check`), so that a pipeline the device cannot hold is refused with
//! the field to change instead of failing at bring-up.

use super::layout::{own_recv_cells, recv_stride, CQE_STRIDE, TABLES};
use super::msgq::MsgQueue;
use super::ring::Ring;
use crate::verbs::DeviceCaps;

/// The limits an shm context on a fabric of `fabric_size` bytes reports (its `caps()`).
pub fn caps(fabric_size: u64) -> DeviceCaps {
    super::shm_caps(fabric_size)
}

/// The active MTU of the shm port, in bytes.
pub fn port_mtu() -> u32 {
    super::layout::SHM_MTU
}

/// Bytes at the start of every fabric taken by its object tables (not available to rings and
/// memory).
pub fn tables_bytes() -> u64 {
    TABLES.end as u64
}

/// Fabric bytes one allocation of `len` bytes takes (the arena allocates in 128-byte units).
pub fn alloc_bytes(len: u64) -> u64 {
    len.div_ceil(128).saturating_mul(128)
}

/// Fabric bytes of a CQ of `cqe` entries: its ring of 64-byte CQEs and, as every CQ without
/// a completion channel has one (the runtime's workers' CQs), the message queue of
/// receiver-side delivery, a 128-byte cell per entry (`shm::msgq`).
pub fn cq_bytes(cqe: u32) -> u64 {
    let cap = u64::from(cqe).next_power_of_two() as usize;
    cq_ring_bytes(cqe).saturating_add(alloc_bytes(MsgQueue::bytes(cap.max(2)) as u64))
}

/// Fabric bytes of a CQ of `cqe` entries without a message queue: its ring of 64-byte CQEs
/// alone (a runtime worker's receive CQ, `Context::create_cq_sender_side`).
pub fn cq_ring_bytes(cqe: u32) -> u64 {
    let cap = u64::from(cqe).next_power_of_two() as usize;
    alloc_bytes(Ring::bytes(cap, CQE_STRIDE) as u64)
}

/// Fabric bytes of the ring of a connected QP's own receive queue created with `max_wr`
/// entries (its cells: `own_recv_cells`, one to spare) of `max_sge` scatter entries each.
pub fn recv_queue_bytes(max_wr: u32, max_sge: u32) -> u64 {
    recv_ring_bytes(u64::from(own_recv_cells(max_wr, super::shm_caps(0).max_qp_wr)), max_sge)
}

/// Fabric bytes of an SRQ created with `max_wr` entries of `max_sge` scatter entries each:
/// its ring has twice its reported `max_wr` cells (`own_recv_cells`; why twice:
/// [`crate::shm::ShmSrq`]).
pub fn srq_bytes(max_wr: u32, max_sge: u32) -> u64 {
    recv_ring_bytes(2 * u64::from(own_recv_cells(max_wr, super::shm_caps(0).max_srq_wr)), max_sge)
}

/// Fabric bytes of the ring of a UD or RAW_PACKET QP's own receive queue of `max_wr`
/// entries: twice `max_wr` rounded up to a power of two, as an SRQ's, without the spare.
pub fn unconnected_recv_queue_bytes(max_wr: u32, max_sge: u32) -> u64 {
    recv_ring_bytes(2 * u64::from(max_wr).next_power_of_two(), max_sge)
}

/// Fabric bytes of a receive ring of `cells` requests of `max_sge` scatter entries each.
fn recv_ring_bytes(cells: u64, max_sge: u32) -> u64 {
    alloc_bytes(Ring::bytes(cells as usize, recv_stride(max_sge)) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shm::{Shm, ShmConfig};
    use crate::{Context, Provider};

    #[test]
    fn the_figures_match_an_open_device() {
        let name = format!("unit-sizing-{}", std::process::id());
        let ctx = Shm::open(&ShmConfig { fabric: name, size: 8 << 20, huge: Default::default() }).unwrap();
        let open = ctx.caps();
        assert_eq!(caps(open.max_mr_size), open);
        assert_eq!(port_mtu(), ctx.port_attr(1).unwrap().active_mtu);
        assert_eq!(cq_bytes(1000), cq_bytes(1024), "rings are powers of two");
        assert!(cq_bytes(1 << 20) >= 192 << 20, "64-byte CQEs and 128-byte queue cells");
        assert!(cq_bytes(u32::MAX) > cq_bytes(1 << 31), "no overflow at the top of the range");
    }

    /// `cq_bytes` is what creating a CQ takes from a fresh fabric's arena (its bump pointer
    /// moves by exactly that much), or, with the message queues off
    /// (`DATAPLANE_SHM_MSGQ=0`), no more than that.
    #[test]
    fn a_cq_takes_what_cq_bytes_says() {
        let name = format!("unit-sizing-cq-{}", std::process::id());
        let ctx = Shm::open(&ShmConfig { fabric: name, size: 8 << 20, huge: Default::default() }).unwrap();
        let bump = || ctx.inner.fabric.hdr().arena_bump.load(std::sync::atomic::Ordering::Relaxed);
        // Kept until the end: a freed CQ's space goes back to the bump pointer.
        let mut cqs = Vec::new();
        for cqe in [1, 100, 1024] {
            let before = bump();
            cqs.push(ctx.create_cq(cqe).unwrap());
            let took = bump() - before;
            if crate::shm::drain::mode() == crate::shm::drain::Mode::Off {
                assert!(took <= cq_bytes(cqe), "{cqe} entries took {took}");
            } else {
                assert_eq!(took, cq_bytes(cqe), "{cqe} entries");
            }
        }
        drop(cqs);
        let before = bump();
        let cq = ctx.create_cq_sender_side(1000).unwrap();
        assert_eq!(bump() - before, cq_ring_bytes(1000), "a CQ without a queue");
        drop(cq);
    }

    /// `srq_bytes` is what creating an SRQ takes from the arena, spare cells included
    /// (`own_recv_cells`: 512 asked for is a ring of 2,048 cells).
    #[test]
    fn an_srq_takes_what_srq_bytes_says() {
        use crate::verbs::SrqAttr;
        use crate::Pd;
        let name = format!("unit-sizing-srq-{}", std::process::id());
        let ctx = Shm::open(&ShmConfig { fabric: name, size: 8 << 20, huge: Default::default() }).unwrap();
        let bump = || ctx.inner.fabric.hdr().arena_bump.load(std::sync::atomic::Ordering::Relaxed);
        let pd = ctx.alloc_pd().unwrap();
        let mut srqs = Vec::new();
        for max_wr in [1, 500, 512] {
            let before = bump();
            srqs.push(pd.create_srq(&SrqAttr { max_wr, max_sge: 1, srq_limit: 0 }).unwrap());
            assert_eq!(bump() - before, srq_bytes(max_wr, 1), "{max_wr} requests");
        }
        assert!(srq_bytes(512, 1) >= 2048 * 64);
    }
}

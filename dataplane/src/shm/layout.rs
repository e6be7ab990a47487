//! The byte layout of a fabric: a header, fixed tables of object slots, then an arena for
//! rings and user memory. Everything is addressed by offsets from the fabric's start, because
//! every process maps the fabric at its own address.
//!
//! Every field a peer can read is an atomic. A slot is published by storing its key (QPN, CQN,
//! SRQN, MR key) last with Release; readers load the key with Acquire, read the fields, and
//! check the key again (a seqlock without the odd/even bit: keys carry a generation, so a slot
//! freed and reused in between shows a different key).

use std::sync::atomic::{AtomicU32, AtomicU64};

/// "dpfabric" in ASCII.
pub(crate) const MAGIC: u64 = 0x6470_6661_6272_6963;
/// Layout version; a fabric of another version is refused.
pub(crate) const VERSION: u32 = 9;

/// Contexts (attached "ports") per fabric.
pub(crate) const MAX_CTX: usize = 64;
/// QPs per fabric (QPN = generation << 10 | index).
pub(crate) const MAX_QP: usize = 1024;
/// CQs per fabric.
pub(crate) const MAX_CQ: usize = 1024;
/// SRQs per fabric.
pub(crate) const MAX_SRQ: usize = 256;
/// MRs per fabric (key = generation << 12 | index).
pub(crate) const MAX_MR: usize = 4096;
// The QP and MR tables are indexed through a mask (`Fabric::qp_slot`, `Fabric::mr_slot`).
const _: () = assert!(MAX_QP.is_power_of_two() && MAX_MR.is_power_of_two());
/// Multicast groups per fabric (`max_mcast_grp`).
pub(crate) const MAX_MCAST_GRP: usize = 64;
/// QPs attached to one multicast group (`max_mcast_qp_attach`).
pub(crate) const MAX_MCAST_QP_ATTACH: usize = 32;
/// Steering rules of RAW_PACKET QPs per fabric (`ibv_create_flow`).
pub(crate) const MAX_FLOWS: usize = 256;
/// Free-list entries of the arena allocator.
pub(crate) const MAX_EXTENTS: usize = 1024;
/// Entries in each context's async event ring.
pub(crate) const EVENT_RING_CAP: usize = 256;

pub(crate) const QP_IDX_BITS: u32 = 10;
pub(crate) const CQ_IDX_BITS: u32 = 10;
pub(crate) const SRQ_IDX_BITS: u32 = 8;

/// A free range of the arena.
#[repr(C)]
pub(crate) struct Extent {
    pub off: AtomicU64,
    pub len: AtomicU64,
}

/// The fabric header.
#[repr(C, align(128))]
pub(crate) struct Header {
    pub magic: AtomicU64,
    pub version: AtomicU32,
    /// Set when the fabric is being torn down: attachers must retry.
    pub dead: AtomicU32,
    pub size: AtomicU64,
    /// Random identity, used in GIDs.
    pub fabric_id: AtomicU64,
    /// pid of the process holding the control-path lock, 0 when free.
    pub lock: AtomicU32,
    /// Contexts ever attached (a fabric with some, none alive, is stale).
    pub ctx_ever: AtomicU32,
    pub next_pd: AtomicU32,
    pub n_extents: AtomicU32,
    pub arena_start: AtomicU64,
    pub arena_bump: AtomicU64,
    pub arena_end: AtomicU64,
    pub extents: [Extent; MAX_EXTENTS],
}

/// An attached context (one "port" of the fabric).
#[repr(C, align(64))]
pub(crate) struct CtxSlot {
    pub pid: AtomicU32,
    pub gen: AtomicU32,
    /// Offset of the async event ring.
    pub events_off: AtomicU64,
}

/// A QP as its peers see it. The first line is read by remote senders; `sq_retired` is written
/// by the owner's CQ poll and sits on its own line.
#[repr(C, align(128))]
pub(crate) struct QpSlot {
    pub qpn: AtomicU32,
    pub state: AtomicU32,
    pub qp_type: AtomicU32,
    pub ctx: AtomicU32,
    pub pid: AtomicU32,
    pub pd: AtomicU32,
    pub recv_cqn: AtomicU32,
    pub srqn: AtomicU32,
    pub rq_off: AtomicU64,
    pub rq_cap: AtomicU32,
    pub rq_sge: AtomicU32,
    pub qkey: AtomicU32,
    pub dest_qpn: AtomicU32,
    pub min_rnr_timer: AtomicU32,
    pub access: AtomicU32,
    pub lid: AtomicU32,
    pub gen: AtomicU32,
    /// XRC domain of an XRC_RECV QP (0 for every other type).
    pub xrcd: AtomicU32,
    /// The send CQ: where a drainer of this QP's queued messages writes their completions
    /// (`shm::drain`).
    pub send_cqn: AtomicU32,
    pub _pad: [u8; 48],
    pub sq_retired: AtomicU32,
}

/// A CQ.
#[repr(C, align(64))]
pub(crate) struct CqSlot {
    pub cqn: AtomicU32,
    pub ctx: AtomicU32,
    pub pid: AtomicU32,
    pub cap: AtomicU32,
    pub ring_off: AtomicU64,
    /// Set when a producer found the CQ full: the CQ is in error.
    pub overrun: AtomicU32,
    pub gen: AtomicU32,
    /// `req_notify_cq` arming: 0 none, 1 next completion, 2 next solicited (or error) one.
    pub armed: AtomicU32,
    /// Cells of the CQ's message queue (`shm::msgq`; 0: none).
    pub mq_cells: AtomicU32,
    /// Offset of the completion channel (0: none).
    pub chan_off: AtomicU64,
    /// Offset of the CQ's message queue (0: none).
    pub mq_off: AtomicU64,
}

/// An SRQ.
#[repr(C, align(64))]
pub(crate) struct SrqSlot {
    pub srqn: AtomicU32,
    pub ctx: AtomicU32,
    pub pid: AtomicU32,
    pub pd: AtomicU32,
    pub cap: AtomicU32,
    pub max_sge: AtomicU32,
    pub ring_off: AtomicU64,
    /// Armed limit (0 = disarmed).
    pub limit: AtomicU32,
    pub gen: AtomicU32,
    /// Offset of the tag list (tag-matching SRQs), 0 for plain SRQs.
    pub tm_off: AtomicU64,
    /// XRC domain of an XRC SRQ (0: not an XRC SRQ).
    pub xrcd: AtomicU32,
    /// The CQ an XRC SRQ's receives complete on (its QPs have none).
    pub cqn: AtomicU32,
}

/// A memory region.
#[repr(C, align(64))]
pub(crate) struct MrSlot {
    pub key: AtomicU32,
    pub pd: AtomicU32,
    pub ctx: AtomicU32,
    pub access: AtomicU32,
    /// Address of the first byte in the registering process.
    pub va: AtomicU64,
    /// Offset of the first byte in the fabric.
    pub off: AtomicU64,
    pub len: AtomicU64,
    pub gen: AtomicU32,
    /// 0: a registered MR; 1: a type-2 memory window (rkey only, bound by BIND_MW).
    pub kind: AtomicU32,
    /// Bumped (Release, under the fabric lock) at the end of every change of this slot:
    /// registration, deregistration, a window's allocation, bind, invalidation and release.
    /// Unlike the key's 12-bit generation it never wraps in practice, so a view of the slot
    /// taken at one epoch is still the slot's content while the epoch reads the same
    /// (`mr::MrCache`; VERSION 9).
    pub epoch: AtomicU64,
}

/// A multicast group: its GID and the QPNs attached to it. Written under the control-path
/// lock; senders read it without the lock (`gen` tells them their cached member list is stale).
#[repr(C, align(64))]
pub(crate) struct McastSlot {
    /// The group GID's first 8 bytes, big-endian; 0 = free slot (a multicast GID starts with
    /// 0xff, so a group's is never 0). Stored last, with Release, when a group is created.
    pub gid_hi: AtomicU64,
    /// The GID's last 8 bytes, big-endian.
    pub gid_lo: AtomicU64,
    /// The MLID given at the first attach (kept for `dpctl`-style inspection; delivery matches
    /// on the GID, as RoCE does).
    pub mlid: AtomicU32,
    /// Bumped (Release) after every change of `members`.
    pub gen: AtomicU32,
    /// Attached QPNs; 0 = empty cell.
    pub members: [AtomicU32; MAX_MCAST_QP_ATTACH],
}

/// The flow table's header: how many slots have ever been used (senders scan only those).
#[repr(C, align(64))]
pub(crate) struct FlowHeader {
    /// One past the highest slot ever installed; only grows (under the control-path lock).
    pub hwm: AtomicU32,
}

/// A steering rule of a RAW_PACKET QP. Written under the control-path lock; `qpn` is stored
/// last (Release) when a rule is installed and cleared first when it is removed.
#[repr(C, align(64))]
pub(crate) struct FlowSlot {
    /// Owning QPN; 0 = free slot.
    pub qpn: AtomicU32,
    /// Matched fields: bit 0 destination MAC, 1 EtherType, 2 IP protocol, 3 destination port.
    pub fields: AtomicU32,
    /// Destination MAC in the low 48 bits (big-endian order of the 6 bytes).
    pub dst_mac: AtomicU64,
    pub ether_type: AtomicU32,
    pub ip_proto: AtomicU32,
    pub dst_port: AtomicU32,
    pub priority: AtomicU32,
    /// Bumped at every install of this slot: part of the `FlowId`, so a stale id is refused.
    pub gen: AtomicU32,
}

/// MR and MW keys: generation (12 bits), slot index (12 bits), and the low 8 "key" bits that
/// consumers may change when rebinding a window (`ibv_inc_rkey`).
pub(crate) fn mr_key(gen: u32, idx: usize, key8: u8) -> u32 {
    ((gen - 1) % 0xfff + 1) << 20 | (idx as u32) << 8 | key8 as u32
}

/// The slot index of an MR/MW key.
pub(crate) fn mr_key_index(key: u32) -> usize {
    ((key >> 8) & 0xfff) as usize
}

/// MTU of the shm "link": the largest UD message.
pub(crate) const SHM_MTU: u32 = 4096;

/// A receive request in an RQ/SRQ ring: `wr_id`, SGE count, then SGEs as (addr, length, lkey).
pub(crate) const RECV_HDR_LEN: usize = 16;
/// Bytes per receive SGE in a ring cell.
pub(crate) const RECV_SGE_LEN: usize = 16;

/// Ring cell stride (8-byte sequence + payload) for receive requests with `max_sge` SGEs,
/// rounded up to whole cache lines: at 40 bytes (one SGE) three cells in eight straddled two
/// lines, and a full receive queue's poster, writing the cell just behind the one the sender
/// takes (`tail` = `head` + capacity - 1), shared that line with it.
pub(crate) fn recv_stride(max_sge: u32) -> usize {
    (8 + RECV_HDR_LEN + RECV_SGE_LEN * max_sge.max(1) as usize).next_multiple_of(64)
}

/// Cells of a connected QP's own receive ring (RC, UC) for `max_recv_wr` requested: the next
/// power of two above it, at least one more than asked for, and what the QP reports as its
/// `max_recv_wr` (`ibv_create_qp` may report more than requested). Bounded by `max_qp_wr`
/// (a power of two), where there is no spare cell. An SRQ's `max_wr` is rounded the same way
/// (bounded by `max_srq_wr`; its ring is twice that, see `ShmSrq`).
///
/// Why the spare cell (session 43): a receiver that keeps exactly as many requests posted as
/// the ring has cells (`dp-perf send_lat -r 512`, perftest's default, into a ring of 512)
/// writes each repost into the cell the sender released last, and the ping-pong's one-way
/// latency was 270-290 ns; with one cell to spare (`-r 511` in 512, or 512 in 1024) the
/// repost writes a cell released one message earlier and it was 185-192 ns. Checking the
/// limit on that just-released cell instead (a ring of twice the cells) was as slow, and the
/// consumer's `head` slower still (315-368 ns); the mechanism was not pinned down (no
/// hardware counters on the VM). So the ring gets the spare cell and reports it.
pub(crate) fn own_recv_cells(max_recv_wr: u32, max_qp_wr: u32) -> u32 {
    // Bounded before rounding: `next_power_of_two` above 2^31 overflows (a request not yet
    // checked against the device, `sizing`). Same result: the bound is a power of two.
    max_recv_wr.saturating_add(1).min(max_qp_wr.next_power_of_two()).next_power_of_two()
}

/// CQ ring cells are one cache line: 8-byte sequence + 56-byte CQE.
pub(crate) const CQE_STRIDE: usize = 64;
/// Event ring cells: sequence + kind + element.
pub(crate) const EVENT_STRIDE: usize = 16;

/// Offsets of the tables, from the fabric start.
pub(crate) struct Tables {
    pub ctx: usize,
    pub qp: usize,
    pub cq: usize,
    pub srq: usize,
    pub mr: usize,
    pub mcast: usize,
    pub flow: usize,
    pub end: usize,
}

/// Where each table lives.
pub(crate) const fn tables() -> Tables {
    const fn align(x: usize, a: usize) -> usize {
        x.div_ceil(a) * a
    }
    let ctx = align(std::mem::size_of::<Header>(), 4096);
    let qp = align(ctx + MAX_CTX * std::mem::size_of::<CtxSlot>(), 4096);
    let cq = align(qp + MAX_QP * std::mem::size_of::<QpSlot>(), 4096);
    let srq = align(cq + MAX_CQ * std::mem::size_of::<CqSlot>(), 4096);
    let mr = align(srq + MAX_SRQ * std::mem::size_of::<SrqSlot>(), 4096);
    let mcast = align(mr + MAX_MR * std::mem::size_of::<MrSlot>(), 4096);
    let flow = align(mcast + MAX_MCAST_GRP * std::mem::size_of::<McastSlot>(), 4096);
    let end = align(flow + std::mem::size_of::<FlowHeader>() + MAX_FLOWS * std::mem::size_of::<FlowSlot>(), 2 << 20);
    Tables { ctx, qp, cq, srq, mr, mcast, flow, end }
}

/// The table offsets, computed once at compile time.
pub(crate) const TABLES: Tables = tables();

/// Builds a key from a generation and an index.
pub(crate) fn make_key(gen: u32, idx: usize, bits: u32) -> u32 {
    (gen << bits) | idx as u32
}

/// The index part of a key.
pub(crate) fn key_index(key: u32, bits: u32) -> usize {
    (key & ((1 << bits) - 1)) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_have_the_intended_sizes() {
        // Two lines: peers read the first, the owner's poll writes `sq_retired` on the second.
        assert_eq!(std::mem::size_of::<QpSlot>(), 256);
        assert_eq!(std::mem::offset_of!(QpSlot, sq_retired), 128);
        assert_eq!(std::mem::size_of::<CqSlot>(), 64);
        assert_eq!(std::mem::size_of::<SrqSlot>(), 64);
        assert_eq!(std::mem::size_of::<MrSlot>(), 64);
        assert_eq!(std::mem::offset_of!(MrSlot, epoch), 48);
        assert_eq!(std::mem::size_of::<CtxSlot>(), 64);
        assert_eq!(std::mem::size_of::<McastSlot>(), 192);
        let t = tables();
        assert!(t.end <= 4 << 20, "tables take {} bytes", t.end);
        // apps/src/bin/shm-vandal.rs mirrors these offsets (and VERSION): change both together.
        assert_eq!((t.qp, t.cq, t.srq, t.mr, t.end), (24_576, 286_720, 352_256, 368_640, 2 << 20));
        assert_eq!((t.mcast, t.flow), (630_784, 643_072));
        assert_eq!(std::mem::size_of::<FlowSlot>(), 64);
    }

    /// A spare cell above every request, up to the device's bound, without overflow for a
    /// request not yet checked against it.
    #[test]
    fn own_recv_cells_rounds_above_the_request_within_the_bound() {
        let max = 1 << 15;
        for (asked, cells) in [(0, 1), (1, 2), (2, 4), (500, 512), (511, 512), (512, 1024), (max - 1, max), (max, max)]
        {
            assert_eq!(own_recv_cells(asked, max), cells, "{asked}");
        }
        assert_eq!(own_recv_cells(u32::MAX, max), max);
        assert_eq!(own_recv_cells(3_000_000_000, max), max);
    }
}

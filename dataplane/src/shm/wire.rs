//! The records that cross processes inside ring cells, as `#[repr(C)]` types, and the typed
//! rings that carry them.
//!
//! A ring hands its producer a `CellMut` and its consumer a `CellRef` (`cell.rs`): a pointer
//! to the cell's payload and the payload's length. Records go in and out of a cell whole, so
//! no other module computes a byte offset into shared memory or holds an `unsafe` block to
//! touch a cell:
//!
//! - on the hot path through typed rings, [`CqRing`] (CQEs) and [`RecvRing`] (receive
//!   requests), whose constructors check once that their cells hold the record; their
//!   accesses then need no per-record check (measured: per-record checks cost 60
//!   instructions per message in `profile_post_poll`, and reading a CQE whole instead of
//!   field by field another 12);
//! - elsewhere (async and channel events) through `CellMut::put` and `CellRef::get`, each
//!   access checked against the payload's length.
//!
//! | record | ring | bytes |
//! |---|---|---|
//! | [`CqeRecord`] | a CQ | 48 of the 56-byte payload |
//! | [`CqeInline`] (a receive completion carrying its payload) | a CQ | 56 |
//! | [`RecvHeader`] + [`SgeRecord`] × n | a receive queue or SRQ | 16 + 16 n |
//! | [`EventRecord`] | a context's async events, a completion channel | 8 |
//!
//! Every field is an integer, so every bit pattern a peer can write is a value: decoding
//! (for example `CqeRecord::decode_in`) decides what an unknown status or opcode means. The
//! layout is part of the fabric's layout version (`layout::VERSION`).

#[cfg(test)]
use super::cell::CellMut;
use super::cell::{fits, CellRef, Plain};
use super::ring::{Pop, Ring};
use crate::verbs::{Sge, WcFlags, WcOpcode, WcStatus, WorkCompletion};
use std::mem::size_of;

/// A completion as it lies in a CQ cell: a [`WorkCompletion`] with the send-queue index it
/// retires (send completions only).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct CqeRecord {
    pub wr_id: u64,
    pub byte_len: u32,
    pub imm_data: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    /// The send WQE this completion retires, valid when `has_retire` is 1.
    pub retire: u32,
    pub wc_flags: u32,
    pub slid: u16,
    pub status: u8,
    pub opcode: u8,
    pub sl: u8,
    pub dlid_path_bits: u8,
    pub pkey_index: u16,
    pub vendor_err: u32,
    pub has_retire: u8,
    pub _pad: [u8; 3],
}

// SAFETY: repr(C), integers only, no implicit padding (the size check below).
unsafe impl Plain for CqeRecord {}
const _: () = assert!(size_of::<CqeRecord>() == 48);
const _: () = assert!(super::layout::CQE_STRIDE - 8 >= size_of::<CqeRecord>());

impl CqeRecord {
    /// The record of `wc`, retiring send WQE `retire` if given.
    #[inline(always)]
    pub(crate) fn of(wc: &WorkCompletion, retire: Option<u32>) -> CqeRecord {
        CqeRecord {
            wr_id: wc.wr_id,
            byte_len: wc.byte_len,
            imm_data: wc.imm_data,
            qp_num: wc.qp_num,
            src_qp: wc.src_qp,
            retire: retire.unwrap_or(0),
            wc_flags: wc.wc_flags.bits(),
            slid: wc.slid,
            status: wc.status as u8,
            opcode: wc.opcode as u8,
            sl: wc.sl,
            dlid_path_bits: wc.dlid_path_bits,
            pkey_index: wc.pkey_index,
            vendor_err: wc.vendor_err,
            has_retire: retire.is_some() as u8,
            _pad: [0; 3],
        }
    }

    /// Decodes the record at the start of `cell` into `wc` (the caller's array slot) and
    /// returns the send WQE it retires, if any. The bytes come from a possibly hostile peer:
    /// an unknown opcode reads as a GeneralErr completion, unknown flag bits are dropped.
    /// Field by field from the cell: read whole first, the record went through the stack (12
    /// instructions more per message in `profile_post_poll`).
    ///
    /// # Safety
    /// A `CqeRecord` lies at the start of the payload.
    #[inline(always)]
    unsafe fn decode_in(cell: &CellRef<'_>, wc: &mut WorkCompletion) -> Option<u32> {
        debug_assert!(fits::<CqeRecord>(0, cell.len()), "record outside its cell");
        let r = cell.as_ptr() as *const CqeRecord;
        macro_rules! field {
            ($f:ident) => {
                // SAFETY: the field lies inside the record, which lies inside the payload
                // (contract); unaligned because payloads are only 8-byte aligned.
                unsafe { std::ptr::addr_of!((*r).$f).read_unaligned() }
            };
        }
        let opcode = WcOpcode::from_u8(field!(opcode));
        *wc = WorkCompletion {
            wr_id: field!(wr_id),
            byte_len: field!(byte_len),
            imm_data: field!(imm_data),
            qp_num: field!(qp_num),
            src_qp: field!(src_qp),
            wc_flags: WcFlags::from_bits_truncate(field!(wc_flags)),
            slid: field!(slid),
            status: if opcode.is_none() { WcStatus::GeneralErr } else { WcStatus::from_u8(field!(status)) },
            opcode: opcode.unwrap_or_default(),
            sl: field!(sl),
            dlid_path_bits: field!(dlid_path_bits),
            pkey_index: field!(pkey_index),
            vendor_err: field!(vendor_err),
        };
        (field!(has_retire) != 0).then(|| field!(retire))
    }
}

/// Most payload bytes a receive completion carries inside its CQE ([`CqeInline`]).
pub(crate) const INLINE_CQE_MAX: usize = 20;

/// The value of [`CqeRecord::opcode`] that marks a cell as holding a [`CqeInline`] (no
/// [`WcOpcode`] has it: an old reader decodes it as an unknown opcode, a GeneralErr).
const KIND_INLINE_RECV: u8 = 0xFF;

/// A successful receive completion of a SEND of at most [`INLINE_CQE_MAX`] bytes that carries
/// the payload itself (scatter-to-CQE, as mlx5 does for small messages): the sender checked
/// the receive request's buffer and writes its fabric offset here instead of copying the
/// bytes into it; the receiver's poll copies them there before it returns the completion.
/// The message then moves one cache line between the two cores (the CQE's) instead of two or
/// three (the CQE, the buffer's line written by the sender, then read by the receiver).
/// `kind` lies where [`CqeRecord::opcode`] does and tells the two apart.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct CqeInline {
    pub wr_id: u64,
    pub byte_len: u32,
    pub imm_data: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    /// Fabric offset of the receive buffer (checked by the sender against the receiver's MR,
    /// and by the poll against the fabric).
    pub dst_off: u64,
    pub slid: u16,
    /// Bit 0: the message carried an immediate (`WcFlags::WITH_IMM`).
    pub flags: u8,
    /// [`KIND_INLINE_RECV`].
    pub kind: u8,
    pub data: [u8; INLINE_CQE_MAX],
}

// SAFETY: repr(C), integers and a byte array only, no implicit padding (the checks below).
unsafe impl Plain for CqeInline {}
const _: () = assert!(size_of::<CqeInline>() == 56);
const _: () = assert!(std::mem::offset_of!(CqeInline, kind) == std::mem::offset_of!(CqeRecord, opcode));
const _: () = assert!(std::mem::offset_of!(CqeInline, data) + INLINE_CQE_MAX == 56);
const _: () = assert!(super::layout::CQE_STRIDE - 8 >= size_of::<CqeInline>());

impl CqeInline {
    /// Decodes the record into `wc`, first handing its payload to `place` (the buffer's
    /// fabric offset, the bytes' address inside the cell and their count; false if it cannot
    /// take them). A length beyond the record or a refused placement (bytes a corrupt peer
    /// wrote) reads as a GeneralErr completion. Field by field, as `CqeRecord::decode_in`.
    ///
    /// # Safety
    /// A `CqeInline` lies at the start of the payload.
    #[inline(always)]
    unsafe fn decode_in(
        cell: &CellRef<'_>,
        wc: &mut WorkCompletion,
        place: impl FnOnce(u64, *const u8, usize) -> bool,
    ) {
        debug_assert!(fits::<CqeInline>(0, cell.len()), "record outside its cell");
        let r = cell.as_ptr() as *const CqeInline;
        macro_rules! field {
            ($f:ident) => {
                // SAFETY: the field lies inside the record, which lies inside the payload
                // (contract); unaligned because payloads are only 8-byte aligned.
                unsafe { std::ptr::addr_of!((*r).$f).read_unaligned() }
            };
        }
        let len = field!(byte_len);
        // SAFETY: the data field lies inside the record (contract).
        let data = unsafe { std::ptr::addr_of!((*r).data) } as *const u8;
        let placed = len as usize <= INLINE_CQE_MAX && place(field!(dst_off), data, len as usize);
        *wc = WorkCompletion {
            wr_id: field!(wr_id),
            byte_len: len,
            imm_data: field!(imm_data),
            qp_num: field!(qp_num),
            src_qp: field!(src_qp),
            slid: field!(slid),
            opcode: WcOpcode::Recv,
            wc_flags: if field!(flags) & 1 != 0 { WcFlags::WITH_IMM } else { WcFlags::empty() },
            status: if placed { WcStatus::Success } else { WcStatus::GeneralErr },
            ..WorkCompletion::default()
        };
    }
}

/// A CQ's ring: a head-tracked [`Ring`] whose cells are known, from its construction, to
/// hold a [`CqeRecord`] or a [`CqeInline`], so pushing and polling a completion (twice per message) need no
/// per-record bounds check. (Checked per record, the two checks measured 40 instructions per
/// message in `profile_post_poll`: the record could no longer be written straight into the
/// cell.)
#[derive(Clone, Copy)]
pub(crate) struct CqRing(Ring);

impl CqRing {
    /// Wraps `ring` if its cells hold a [`CqeRecord`] (CQ rings are made with
    /// `layout::CQE_STRIDE`, whose payload does: asserted above).
    pub(crate) fn new(ring: Ring) -> Option<CqRing> {
        let record = size_of::<CqeRecord>().max(size_of::<CqeInline>());
        (ring.payload_len() >= record).then_some(CqRing(ring))
    }

    /// The ring underneath (capacity, queued entries).
    pub(crate) fn ring(&self) -> &Ring {
        &self.0
    }

    /// Pushes the completion `wc`, retiring send WQE `retire` if given (head-tracked protocol:
    /// [`Ring::push_tracked`]). False if the CQ is full.
    #[inline(always)]
    pub(crate) fn push(&self, head_seen: &mut u64, wc: &WorkCompletion, retire: Option<u32>) -> bool {
        // SAFETY: every cell of this ring holds a CqeRecord (`new`).
        self.0.push_tracked(head_seen, |mut c| unsafe { c.put_unchecked(0, || CqeRecord::of(wc, retire)) })
    }

    /// Pushes the successful receive completion `wc` of a SEND of `wc.byte_len <=`
    /// [`INLINE_CQE_MAX`] bytes with the bytes themselves, read from `src`, for the poll to
    /// copy into the receive buffer at fabric offset `dst_off` ([`CqeInline`]). False if the
    /// CQ is full.
    ///
    /// `src` must be readable for `wc.byte_len` bytes: a pointer `MrView::translate` (or
    /// `Fabric::ptr`) returned for at least that many, as for `place::copy_translated`.
    #[inline(always)]
    pub(crate) fn push_inline_recv(
        &self,
        head_seen: &mut u64,
        wc: &WorkCompletion,
        dst_off: u64,
        src: *const u8,
    ) -> bool {
        match self.0.claim_tracked(head_seen) {
            Some(pos) => {
                self.publish_inline_recv(pos, wc, dst_off, src);
                true
            }
            None => false,
        }
    }

    /// Claims the next cell for a completion to publish later ([`Ring::claim_tracked`]);
    /// `None` if the CQ is full.
    #[inline(always)]
    pub(crate) fn claim(&self, head_seen: &mut u64) -> Option<u64> {
        self.0.claim_tracked(head_seen)
    }

    /// [`CqRing::push`] into cell `pos`, claimed with [`CqRing::claim`].
    #[inline(always)]
    pub(crate) fn publish(&self, pos: u64, wc: &WorkCompletion, retire: Option<u32>) {
        // SAFETY: every cell of this ring holds a CqeRecord (`new`).
        self.0.publish_claimed(pos, |mut c| unsafe { c.put_unchecked(0, || CqeRecord::of(wc, retire)) })
    }

    /// [`CqRing::push_inline_recv`] into cell `pos`, claimed with [`CqRing::claim`]; `src` as
    /// there.
    #[inline(always)]
    pub(crate) fn publish_inline_recv(&self, pos: u64, wc: &WorkCompletion, dst_off: u64, src: *const u8) {
        let len = (wc.byte_len as usize).min(INLINE_CQE_MAX);
        let flags = wc.wc_flags.contains(WcFlags::WITH_IMM) as u8;
        self.0.publish_claimed(pos, |mut c| {
            use std::mem::offset_of;
            macro_rules! put {
                ($f:ident, $v:expr) => {
                    // SAFETY: every cell of this ring holds a CqeInline (`new`), so each of
                    // its fields lies inside the payload.
                    unsafe { c.put_unchecked(offset_of!(CqeInline, $f), || $v) }
                };
            }
            put!(wr_id, wc.wr_id);
            put!(byte_len, len as u32);
            put!(imm_data, wc.imm_data);
            put!(qp_num, wc.qp_num);
            put!(src_qp, wc.src_qp);
            put!(dst_off, dst_off);
            put!(slid, wc.slid);
            put!(flags, flags);
            put!(kind, KIND_INLINE_RECV);
            // SAFETY: `data` holds `len <= INLINE_CQE_MAX` bytes inside the payload (`new`);
            // `src` is readable for `wc.byte_len >= len` bytes (the contract above).
            unsafe { c.put_bytes_unchecked(offset_of!(CqeInline, data), src, len) };
        })
    }

    /// Whether [`CqRing::pop`] would find a completion now (the CQ's only consumer: see
    /// [`Ring::next_published`]).
    #[inline(always)]
    pub(crate) fn has_next(&self) -> bool {
        self.0.next_published()
    }

    /// Polls the oldest completion into `wc` (the CQ's only consumer:
    /// [`Ring::pop_single_tracked`]); a [`CqeInline`]'s payload goes to `place` first (the
    /// receive buffer's fabric offset, the bytes' address in the cell, valid only during the
    /// call, and their count; false if it cannot take them). `None` if
    /// the CQ is empty; `Some(retire)` with the send WQE it retires otherwise.
    #[inline(always)]
    pub(crate) fn pop(
        &self,
        wc: &mut WorkCompletion,
        place: impl FnOnce(u64, *const u8, usize) -> bool,
    ) -> Option<Option<u32>> {
        let mut retire = None;
        let read = |c: CellRef<'_>| {
            // SAFETY: every cell holds a CqeRecord and a CqeInline (`new`), and both have
            // their kind byte at this offset.
            let kind: u8 = unsafe { c.get_unchecked(std::mem::offset_of!(CqeRecord, opcode)) };
            if kind == KIND_INLINE_RECV {
                // SAFETY: as above.
                unsafe { CqeInline::decode_in(&c, wc, place) }
            } else {
                // SAFETY: as above.
                retire = unsafe { CqeRecord::decode_in(&c, wc) };
            }
        };
        match self.0.pop_single_tracked(read) {
            Pop::Item => Some(retire),
            // (`pop_single_tracked` never stalls: it does not loop.)
            Pop::Empty | Pop::Stalled => None,
        }
    }
}

/// The head of a receive request in an RQ or SRQ cell; `n_sge` [`SgeRecord`]s follow.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct RecvHeader {
    pub wr_id: u64,
    pub n_sge: u32,
    pub _pad: u32,
}

/// One scatter entry of a receive request (`struct ibv_sge`'s fields).
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct SgeRecord {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

// SAFETY: repr(C), integers only, no implicit padding (the size checks below).
unsafe impl Plain for RecvHeader {}
// SAFETY: as above.
unsafe impl Plain for SgeRecord {}
const _: () = assert!(size_of::<RecvHeader>() == super::layout::RECV_HDR_LEN);
const _: () = assert!(size_of::<SgeRecord>() == super::layout::RECV_SGE_LEN);

/// Most scatter entries a receive request can carry.
pub(crate) const MAX_SGE: usize = 16;

/// A receive request taken off a ring.
#[derive(Clone, Copy)]
pub(crate) struct RecvEntry {
    pub wr_id: u64,
    pub n: usize,
    pub sges: [Sge; MAX_SGE],
}

impl Default for RecvEntry {
    fn default() -> Self {
        RecvEntry { wr_id: 0, n: 0, sges: [Sge::default(); MAX_SGE] }
    }
}

/// Scatter entries a cell of `payload_len` bytes holds (at most [`MAX_SGE`]).
pub(crate) fn recv_capacity(payload_len: usize) -> usize {
    (payload_len.saturating_sub(size_of::<RecvHeader>()) / size_of::<SgeRecord>()).min(MAX_SGE)
}

/// A receive queue's or SRQ's ring: a [`Ring`] whose cells are known, from its construction,
/// to hold a [`RecvHeader`] and `sge_cap` [`SgeRecord`]s (at least one), so a request is
/// written and read with one check of its SGE count instead of one per record (which
/// measured 21 instructions per message in `profile_post_poll`).
#[derive(Clone, Copy)]
pub(crate) struct RecvRing {
    ring: Ring,
    sge_cap: usize,
}

impl std::ops::Deref for RecvRing {
    type Target = Ring;
    fn deref(&self) -> &Ring {
        &self.ring
    }
}

impl RecvRing {
    /// Wraps `ring` if its cells hold a request of at least one SGE (receive rings are made
    /// with `layout::recv_stride(max_sge)`, which does).
    pub(crate) fn new(ring: Ring) -> Option<RecvRing> {
        let sge_cap = recv_capacity(ring.payload_len());
        (sge_cap >= 1).then_some(RecvRing { ring, sge_cap })
    }

    /// Pushes request `wr_id` with `sges` as [`Ring::push_single_bounded`] does; false if the
    /// queue is full or the cells cannot hold that many SGEs (a post validated against the
    /// queue's `max_sge` never has more).
    #[inline(always)]
    pub(crate) fn push(&self, limit: u64, head_seen: &mut u64, wr_id: u64, sges: &[Sge]) -> bool {
        if sges.len() > self.sge_cap {
            return false;
        }
        self.ring.push_single_bounded(limit, head_seen, |mut c| {
            // SAFETY: the header and `sges.len()` <= `sge_cap` SGEs fit every cell (`new`).
            unsafe {
                c.put_unchecked(0, || RecvHeader { wr_id, n_sge: sges.len() as u32, _pad: 0 });
                for (k, s) in sges.iter().enumerate() {
                    let at = size_of::<RecvHeader>() + k * size_of::<SgeRecord>();
                    c.put_unchecked(at, || SgeRecord { addr: s.addr, length: s.length, lkey: s.lkey });
                }
            }
        })
    }

    /// [`RecvRing::push`] of a request of one SGE (nearly all): every cell holds one.
    #[inline(always)]
    pub(crate) fn push_one(&self, limit: u64, head_seen: &mut u64, wr_id: u64, s: &Sge) -> bool {
        self.ring.push_single_bounded(limit, head_seen, |mut c| {
            // SAFETY: the header and one SGE fit every cell (`new`).
            unsafe {
                c.put_unchecked(0, || RecvHeader { wr_id, n_sge: 1, _pad: 0 });
                c.put_unchecked(size_of::<RecvHeader>(), || SgeRecord { addr: s.addr, length: s.length, lkey: s.lkey });
            }
        })
    }

    /// [`RecvRing::push_one`] of one request per address of `addrs` (`len` bytes of MR
    /// `lkey` each, the address as `wr_id`), through [`Ring::push_run_while`], up to the
    /// first address `admit` refuses: returns how many were pushed.
    #[inline]
    pub(crate) fn push_buffers(
        &self,
        limit: u64,
        head_seen: &mut u64,
        addrs: &[u64],
        len: u32,
        lkey: u32,
        admit: impl Fn(u64) -> bool,
    ) -> usize {
        self.push_requests(limit, head_seen, addrs.len(), |i| {
            admit(addrs[i]).then(|| (addrs[i], Sge::new(addrs[i], len, lkey)))
        })
    }

    /// [`RecvRing::push_one`] of up to `n` requests of one SGE each, the `i`-th `request(i)`
    /// (its `wr_id` and SGE), through [`Ring::push_run_while`]: stops at the first `None`
    /// (asked before that request's cell is claimed); returns how many were pushed, in order.
    #[inline(always)]
    pub(crate) fn push_requests(
        &self,
        limit: u64,
        head_seen: &mut u64,
        n: usize,
        mut request: impl FnMut(usize) -> Option<(u64, Sge)>,
    ) -> usize {
        let next = std::cell::Cell::new((0u64, Sge::default()));
        let admit = |i| request(i).map(|r| next.set(r)).is_some();
        self.ring.push_run_while(limit, head_seen, n, admit, |_, mut c| {
            let (wr_id, s) = next.get();
            // SAFETY: the header and one SGE fit every cell (`new`).
            unsafe {
                c.put_unchecked(0, || RecvHeader { wr_id, n_sge: 1, _pad: 0 });
                c.put_unchecked(size_of::<RecvHeader>(), || SgeRecord { addr: s.addr, length: s.length, lkey: s.lkey });
            }
        })
    }

    /// Takes the oldest request into `out` ([`Ring::pop_held`], many consumers) and returns
    /// its position: the cell stays held until [`Ring::release`]. The SGE count a peer wrote
    /// is clamped to what the cells hold, so a corrupt count cannot make the read leave the
    /// cell.
    #[inline(always)]
    pub(crate) fn pop_held(&self, out: &mut RecvEntry) -> Result<u64, Pop> {
        self.ring.pop_held(|c| self.read(c, out))
    }

    /// [`RecvRing::pop_held`] for the holder of the ring's single-consumer mode
    /// ([`Ring::pop_solo`]): `None` if the mode was revoked.
    #[inline(always)]
    pub(crate) fn pop_solo(&self, out: &mut RecvEntry) -> Option<Result<u64, Pop>> {
        self.ring.pop_solo(|c| self.read(c, out))
    }

    /// [`RecvRing::pop_held`] of a run of up to `max` requests ([`Ring::pop_run`]): reads the
    /// first into `out` and returns its position and the run's length; the others are read
    /// with [`RecvRing::read_held`], and each must be released.
    #[inline(always)]
    pub(crate) fn pop_run(&self, max: u64, out: &mut RecvEntry) -> Result<(u64, u64), Pop> {
        self.ring.pop_run(max, |c| self.read(c, out))
    }

    /// Reads request `pos` of a run this consumer holds ([`RecvRing::pop_run`]) into `out`.
    #[inline(always)]
    pub(crate) fn read_held(&self, pos: u64, out: &mut RecvEntry) {
        self.ring.read_held(pos, |c| self.read(c, out))
    }

    /// Copies a claimed request out of its cell.
    #[inline(always)]
    fn read(&self, c: CellRef<'_>, out: &mut RecvEntry) {
        let cap = self.sge_cap;
        // SAFETY: the header and `cap` SGEs fit every cell (`new`); `n` is clamped to `cap`.
        unsafe {
            let h: RecvHeader = c.get_unchecked(0);
            out.wr_id = h.wr_id;
            out.n = (h.n_sge as usize).min(cap);
            for k in 0..out.n {
                let at = size_of::<RecvHeader>() + k * size_of::<SgeRecord>();
                out.sges[k] = c.get_unchecked::<SgeRecord>(at).into();
            }
        }
    }
}

impl From<SgeRecord> for Sge {
    #[inline(always)]
    fn from(s: SgeRecord) -> Sge {
        Sge { addr: s.addr, length: s.length, lkey: s.lkey }
    }
}

/// An async event (a context's event ring: the kind and the object it names) or a
/// completion-channel event (`kind` is the CQ number, `element` unused).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct EventRecord {
    pub kind: u32,
    pub element: u32,
}

// SAFETY: repr(C), two u32, no padding.
unsafe impl Plain for EventRecord {}
const _: () = assert!(super::layout::EVENT_STRIDE - 8 >= size_of::<EventRecord>());

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cqe_survives_the_round_trip() {
        let wc = WorkCompletion {
            wr_id: u64::MAX - 3,
            byte_len: 77,
            imm_data: 0xdead_beef,
            qp_num: 9,
            src_qp: 10,
            wc_flags: WcFlags::WITH_IMM | WcFlags::GRH,
            slid: 3,
            status: WcStatus::RemAccessErr,
            opcode: WcOpcode::RecvRdmaWithImm,
            sl: 1,
            dlid_path_bits: 2,
            pkey_index: 5,
            vendor_err: 6,
        };
        let mut buf = [0u8; 56];
        // SAFETY: a local buffer of 56 bytes.
        let mut cell = unsafe { CellMut::new(buf.as_mut_ptr(), buf.len()) };
        cell.put(0, &CqeRecord::of(&wc, Some(41)));
        // SAFETY: as above.
        let cell = unsafe { CellRef::new(buf.as_ptr(), buf.len()) };
        let mut back = WorkCompletion::default();
        // SAFETY: 56 bytes hold a CqeRecord.
        assert_eq!(unsafe { CqeRecord::decode_in(&cell, &mut back) }, Some(41));
        assert_eq!(back, wc);
    }

    #[test]
    fn a_hostile_cqe_decodes_to_an_error_and_a_hostile_sge_count_stays_in_the_cell() {
        let buf = [0xffu8; 56];
        // SAFETY: a local buffer of 56 bytes.
        let cell = unsafe { CellRef::new(buf.as_ptr(), buf.len()) };
        let mut wc = WorkCompletion::default();
        // SAFETY: 56 bytes hold a CqeRecord.
        let _ = unsafe { CqeRecord::decode_in(&cell, &mut wc) };
        assert_eq!(wc.status, WcStatus::GeneralErr);

        // n_sge = 0xffffffff in a ring whose cells have room for 2 SGEs.
        #[repr(C, align(128))]
        struct Mem([u64; 64]);
        let mut mem = Box::new(Mem([0; 64]));
        // SAFETY: 512 private bytes aligned to 128, enough for the header and two cells of
        // 8 + 48 bytes.
        let ring = unsafe { Ring::init(mem.0.as_mut_ptr() as *mut u8, 2, 8 + 48) };
        let recv = RecvRing::new(ring).unwrap();
        assert!(recv.push(2, &mut 0, 7, &[Sge::default(); 2]));
        assert!(!recv.push(2, &mut 0, 8, &[Sge::default(); 3]), "more SGEs than the cells hold");
        // A peer rewrites the count (the payload starts after the header and the sequence).
        mem.0[crate::shm::ring::RING_HEADER_LEN / 8 + 2] = u64::MAX;
        let mut out = RecvEntry::default();
        assert!(recv.pop_held(&mut out).is_ok());
        assert_eq!(out.n, 2);
    }

    /// Private memory for a small ring, aligned as the fabric's rings are.
    #[repr(C, align(128))]
    struct RingMem([u64; 128]);

    /// A CQ ring of four 64-byte cells in `mem`.
    fn cq_ring(mem: &mut RingMem) -> CqRing {
        assert!(crate::shm::ring::RING_HEADER_LEN + 4 * 64 <= std::mem::size_of::<RingMem>());
        // SAFETY: 1 KiB of private memory aligned to 128, which holds the ring header and four
        // cells of 8 + 56 bytes (asserted), alive as long as the test uses the ring.
        let ring = unsafe { Ring::init(mem.0.as_mut_ptr() as *mut u8, 4, super::super::layout::CQE_STRIDE) };
        CqRing::new(ring).unwrap()
    }

    /// Scatter-to-CQE: the bytes of a small receive ride in the CQE and reach the buffer's
    /// offset only through the poll's `place`, with the completion's fields intact; a plain
    /// CQE in the same ring still decodes as before.
    #[test]
    fn an_inline_receive_cqe_carries_its_bytes_to_the_poll() {
        let mut mem = Box::new(RingMem([0; 128]));
        let cq = cq_ring(&mut mem);
        let payload: Vec<u8> = (1..=INLINE_CQE_MAX as u8).collect();
        for len in [0usize, 1, 4, 8, 15, 16, 17, 20] {
            let wc = WorkCompletion {
                wr_id: 1000 + len as u64,
                byte_len: len as u32,
                imm_data: 0xabcd,
                wc_flags: WcFlags::WITH_IMM,
                qp_num: 7,
                src_qp: 8,
                slid: 9,
                opcode: WcOpcode::Recv,
                ..Default::default()
            };
            let mut head_seen = 0;
            assert!(cq.push_inline_recv(&mut head_seen, &wc, 4096 + len as u64, payload.as_ptr()));
            let mut placed = None;
            let mut back = WorkCompletion::default();
            let got = cq.pop(&mut back, |off, src, n| {
                // SAFETY: `pop` hands the CQE's bytes, readable for `n` bytes during the call.
                placed = Some((off, unsafe { std::slice::from_raw_parts(src, n) }.to_vec()));
                true
            });
            assert_eq!(got, Some(None), "a receive CQE retires nothing");
            assert_eq!(back, wc, "{len} bytes");
            assert_eq!(placed, Some((4096 + len as u64, payload[..len].to_vec())), "{len} bytes");
        }
        // The same ring still carries plain CQEs.
        let wc = WorkCompletion { wr_id: 5, opcode: WcOpcode::Send, ..Default::default() };
        assert!(cq.push(&mut 0, &wc, Some(3)));
        let mut back = WorkCompletion::default();
        assert_eq!(cq.pop(&mut back, |_, _, _| panic!("a plain CQE has no payload")), Some(Some(3)));
        assert_eq!(back, wc);
    }

    /// A corrupt inline CQE (a length past the record, or a buffer the poll refuses) is an
    /// error completion, and nothing is placed for a bad length.
    #[test]
    fn a_corrupt_inline_cqe_is_an_error_completion() {
        let mut mem = Box::new(RingMem([0; 128]));
        let cq = cq_ring(&mut mem);
        let wc = WorkCompletion { wr_id: 1, byte_len: 8, opcode: WcOpcode::Recv, ..Default::default() };
        let bytes = [0u8; 8];
        assert!(cq.push_inline_recv(&mut 0, &wc, 64, bytes.as_ptr()));
        let mut back = WorkCompletion::default();
        assert!(cq.pop(&mut back, |_, _, _| false).is_some());
        assert_eq!((back.wr_id, back.status), (1, WcStatus::GeneralErr), "the poll refused the buffer");

        assert!(cq.push_inline_recv(&mut 0, &wc, 64, bytes.as_ptr()));
        // A peer rewrites the length (the second cell's payload: after the ring header, the
        // first cell and the second cell's sequence word).
        let word = (crate::shm::ring::RING_HEADER_LEN + 64 + 8 + std::mem::offset_of!(CqeInline, byte_len)) / 8;
        mem.0[word] = (mem.0[word] & !0xffff_ffff) | (INLINE_CQE_MAX as u64 + 1);
        assert!(cq.pop(&mut back, |_, _, _| panic!("a length past the record is not placed")).is_some());
        assert_eq!(back.status, WcStatus::GeneralErr);
    }

    #[test]
    #[cfg_attr(debug_assertions, should_panic(expected = "record outside its cell"))]
    fn a_record_that_does_not_fit_is_refused() {
        let mut buf = [7u8; 40];
        // SAFETY: a local buffer of 40 bytes.
        let mut cell = unsafe { CellMut::new(buf.as_mut_ptr(), buf.len()) };
        cell.put(0, &CqeRecord::default());
        assert_eq!(buf, [7u8; 40], "nothing written");
    }
}

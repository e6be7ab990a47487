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

/// A CQ's ring: a head-tracked [`Ring`] whose cells are known, from its construction, to
/// hold a [`CqeRecord`], so pushing and polling a completion (twice per message) need no
/// per-record bounds check. (Checked per record, the two checks measured 40 instructions per
/// message in `profile_post_poll`: the record could no longer be written straight into the
/// cell.)
#[derive(Clone, Copy)]
pub(crate) struct CqRing(Ring);

impl CqRing {
    /// Wraps `ring` if its cells hold a [`CqeRecord`] (CQ rings are made with
    /// `layout::CQE_STRIDE`, whose payload does: asserted above).
    pub(crate) fn new(ring: Ring) -> Option<CqRing> {
        (ring.payload_len() >= size_of::<CqeRecord>()).then_some(CqRing(ring))
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

    /// Polls the oldest completion into `wc` (the CQ's only consumer:
    /// [`Ring::pop_single_tracked`]). `None` if the CQ is empty; `Some(retire)` with the send
    /// WQE it retires otherwise.
    #[inline(always)]
    pub(crate) fn pop(&self, wc: &mut WorkCompletion) -> Option<Option<u32>> {
        let mut retire = None;
        // SAFETY: as in `push`.
        match self.0.pop_single_tracked(|c| retire = unsafe { CqeRecord::decode_in(&c, wc) }) {
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

    /// Takes the oldest request into `out` ([`Ring::pop`], many consumers). The SGE count a
    /// peer wrote is clamped to what the cells hold, so a corrupt count cannot make the read
    /// leave the cell.
    #[inline(always)]
    pub(crate) fn pop(&self, out: &mut RecvEntry) -> Pop {
        let cap = self.sge_cap;
        self.ring.pop(|c| {
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
        })
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
        assert!(matches!(recv.pop(&mut out), Pop::Item));
        assert_eq!(out.n, 2);
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

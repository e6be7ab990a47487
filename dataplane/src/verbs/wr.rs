//! Work requests and the reusable chains that carry them to one doorbell.
//!
//! A C program links `ibv_send_wr`s with `next` pointers; here a [`SendChain`] (or
//! [`RecvChain`]) holds the requests and their scatter/gather entries in two reusable arrays.
//! One `post_send(&chain)` is one doorbell. `clear()` keeps the capacity, so a worker that
//! builds a chain per loop allocates only while warming up. `bad_wr` in a [`PostError`] is an
//! index into the chain.
//!
//! [`PostError`]: super::PostError

use super::opcode::WrOpcode;

/// A scatter/gather entry (`struct ibv_sge`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(C)]
pub struct Sge {
    /// Start address in the poster's address space (or the offset for ZERO_BASED regions).
    pub addr: u64,
    /// Length in bytes. In a receive request, 0 means 2^31 bytes (SRQ notes).
    pub length: u32,
    /// Local key of the memory region the buffer was registered with.
    pub lkey: u32,
}

impl Sge {
    /// Builds an entry.
    pub fn new(addr: u64, length: u32, lkey: u32) -> Sge {
        Sge { addr, length, lkey }
    }
}

bitflags::bitflags! {
    /// Properties of a send work request (`enum ibv_send_flags`).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct SendFlags: u32 {
        /// Wait for prior RDMA READs and atomics to complete first (RC).
        const FENCE = 1;
        /// Generate a completion (only meaningful when the QP has `sq_sig_all = false`).
        const SIGNALED = 1 << 1;
        /// Raise a solicited event at the receiver (Send, Write with immediate).
        const SOLICITED = 1 << 2;
        /// Copy the gather list into the request now: buffers are reusable on return and the
        /// L_Key is not checked (Send and RDMA Write).
        const INLINE = 1 << 3;
        /// Offload IPv4 and TCP/UDP checksums (only where the device supports it).
        const IP_CSUM = 1 << 4;
    }
}

/// Opaque handle of an address handle, as a provider issued it (`struct ibv_ah *`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct AhHandle(pub u64);

/// Destination of a UD send (`wr.ud`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct UdDest {
    /// Address handle for the remote node.
    pub ah: AhHandle,
    /// Destination QP number.
    pub remote_qpn: u32,
    /// Destination Q_Key.
    pub remote_qkey: u32,
}

/// What a BIND_MW binds (`struct ibv_mw_bind_info` plus the new rkey).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MwBind {
    /// The rkey the window gets: the same window with new low 8 bits ([`inc_rkey`]).
    pub new_rkey: u32,
    /// The MR the window opens onto (registered with MW_BIND).
    pub mr_lkey: u32,
    /// First byte of the window.
    pub addr: u64,
    /// Bytes of the window.
    pub length: u64,
    /// Remote rights granted (REMOTE_READ / REMOTE_WRITE / REMOTE_ATOMIC).
    pub access: super::AccessFlags,
}

/// A BIND_MW request's fields, as read back from a [`SendWr`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MwBindInfo {
    /// The window's rkey before the bind.
    pub mw_rkey: u32,
    /// The rkey after the bind.
    pub new_rkey: u32,
    /// The MR.
    pub mr_lkey: u32,
    /// First byte.
    pub addr: u64,
    /// Bytes.
    pub length: u64,
    /// Rights.
    pub access: super::AccessFlags,
}

/// `ibv_inc_rkey`: the same window with the next value of the consumer-owned low 8 bits.
pub fn inc_rkey(rkey: u32) -> u32 {
    (rkey & !0xff) | (rkey.wrapping_add(1) & 0xff)
}

/// A send work request (`struct ibv_send_wr` without `next` and `sg_list`: the chain holds
/// those).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SendWr {
    /// User-defined ID returned in the completion.
    pub wr_id: u64,
    /// Operation.
    pub opcode: WrOpcode,
    /// Send flags.
    pub flags: SendFlags,
    /// Immediate data for `*_WITH_IMM`, or the rkey to invalidate for `SEND_WITH_INV`.
    pub imm_data: u32,
    /// Remote address for RDMA and atomic operations.
    pub remote_addr: u64,
    /// Remote key for RDMA and atomic operations.
    pub rkey: u32,
    /// Compare operand (CMP_AND_SWP) or addend (FETCH_AND_ADD).
    pub compare_add: u64,
    /// Swap operand (CMP_AND_SWP).
    pub swap: u64,
    /// Destination of a UD send.
    pub ud: UdDest,
    /// `qp_type.xrc.remote_srqn`: the XRC SRQ at the target that an XRC_SEND request goes to
    /// (ignored on other QP types). Set it with [`SendWr::xrc_srqn`].
    pub remote_srqn: u32,
    sge_start: u32,
    num_sge: u32,
    inline_start: u32,
    inline_len: u32,
    /// `tso.hdr_sz` of a TSO request (its header is in the chain at `inline_start`).
    tso_hdr_len: u16,
    /// `tso.mss` of a TSO request.
    tso_mss: u16,
}

impl SendWr {
    /// Whether the request has exactly one SGE and no inline bytes in its chain.
    #[inline(always)]
    pub(crate) fn is_one_sge(&self) -> bool {
        self.num_sge == 1 && self.inline_len == 0
    }

    /// A SEND.
    pub fn send(wr_id: u64) -> SendWr {
        SendWr { wr_id, opcode: WrOpcode::Send, ..Default::default() }
    }

    /// This request sent on an XRC_SEND QP to the target's XRC SRQ `srqn`
    /// (`wr.qp_type.xrc.remote_srqn`), e.g. `SendWr::send(id).xrc_srqn(srqn)`.
    pub fn xrc_srqn(mut self, srqn: u32) -> SendWr {
        self.remote_srqn = srqn;
        self
    }

    /// A SEND_WITH_IMM carrying `imm`.
    pub fn send_with_imm(wr_id: u64, imm: u32) -> SendWr {
        SendWr { wr_id, opcode: WrOpcode::SendWithImm, imm_data: imm, ..Default::default() }
    }

    /// An RDMA_WRITE to `remote_addr` under `rkey`.
    pub fn write(wr_id: u64, remote_addr: u64, rkey: u32) -> SendWr {
        SendWr { wr_id, opcode: WrOpcode::RdmaWrite, remote_addr, rkey, ..Default::default() }
    }

    /// An RDMA_WRITE_WITH_IMM to `remote_addr` under `rkey`.
    pub fn write_with_imm(wr_id: u64, remote_addr: u64, rkey: u32, imm: u32) -> SendWr {
        SendWr { wr_id, opcode: WrOpcode::RdmaWriteWithImm, remote_addr, rkey, imm_data: imm, ..Default::default() }
    }

    /// An RDMA_READ from `remote_addr` under `rkey`.
    pub fn read(wr_id: u64, remote_addr: u64, rkey: u32) -> SendWr {
        SendWr { wr_id, opcode: WrOpcode::RdmaRead, remote_addr, rkey, ..Default::default() }
    }

    /// An ATOMIC_FETCH_AND_ADD of `add` on the 8 bytes at `remote_addr`.
    pub fn fetch_add(wr_id: u64, remote_addr: u64, rkey: u32, add: u64) -> SendWr {
        SendWr { wr_id, opcode: WrOpcode::AtomicFetchAndAdd, remote_addr, rkey, compare_add: add, ..Default::default() }
    }

    /// An ATOMIC_CMP_AND_SWP: if the 8 bytes at `remote_addr` equal `compare`, store `swap`.
    pub fn cmp_swap(wr_id: u64, remote_addr: u64, rkey: u32, compare: u64, swap: u64) -> SendWr {
        SendWr {
            wr_id,
            opcode: WrOpcode::AtomicCmpAndSwp,
            remote_addr,
            rkey,
            compare_add: compare,
            swap,
            ..Default::default()
        }
    }

    /// A SEND_WITH_INV that invalidates the target's memory window `rkey` on arrival.
    pub fn send_with_inv(wr_id: u64, rkey: u32) -> SendWr {
        SendWr { wr_id, opcode: WrOpcode::SendWithInv, imm_data: rkey, ..Default::default() }
    }

    /// A LOCAL_INV of the local memory window `rkey`.
    pub fn local_inv(wr_id: u64, rkey: u32) -> SendWr {
        SendWr { wr_id, opcode: WrOpcode::LocalInv, imm_data: rkey, ..Default::default() }
    }

    /// A BIND_MW of type-2 window `mw_rkey` (see [`MwBind`]). The bind fields travel in the
    /// request's remote-op fields; read them back with [`SendWr::bind_info`].
    pub fn bind_mw(wr_id: u64, mw_rkey: u32, b: MwBind) -> SendWr {
        SendWr {
            wr_id,
            opcode: WrOpcode::BindMw,
            imm_data: mw_rkey,
            rkey: b.new_rkey,
            remote_addr: b.addr,
            compare_add: b.length,
            swap: (b.mr_lkey as u64) << 32 | b.access.bits() as u64,
            ..Default::default()
        }
    }

    /// The bind information of a BIND_MW request.
    pub fn bind_info(&self) -> MwBindInfo {
        MwBindInfo {
            mw_rkey: self.imm_data,
            new_rkey: self.rkey,
            mr_lkey: (self.swap >> 32) as u32,
            addr: self.remote_addr,
            length: self.compare_add,
            access: super::AccessFlags::from_bits_truncate(self.swap as u32),
        }
    }

    /// A TSO send (`IBV_WR_TSO`, RAW_PACKET QPs): the payload of its gather list goes out as
    /// frames of at most `mss` bytes, each behind a copy of the header given to
    /// [`SendChain::push_tso`], fixed for its place in the TCP stream (see
    /// [`crate::net::tso`]).
    pub fn tso(wr_id: u64, mss: u16) -> SendWr {
        SendWr { wr_id, opcode: WrOpcode::Tso, tso_mss: mss, ..Default::default() }
    }

    /// `tso.mss` of a TSO request.
    pub fn tso_mss(&self) -> u16 {
        self.tso_mss
    }

    /// Any opcode, all other fields zero.
    pub fn with_opcode(wr_id: u64, opcode: WrOpcode) -> SendWr {
        SendWr { wr_id, opcode, ..Default::default() }
    }

    /// Sets the UD destination.
    pub fn to(mut self, ah: AhHandle, remote_qpn: u32, remote_qkey: u32) -> SendWr {
        self.ud = UdDest { ah, remote_qpn, remote_qkey };
        self
    }

    /// Adds send flags.
    pub fn flags(mut self, flags: SendFlags) -> SendWr {
        self.flags |= flags;
        self
    }

    /// Adds `IBV_SEND_SIGNALED`.
    pub fn signaled(self) -> SendWr {
        self.flags(SendFlags::SIGNALED)
    }

    /// Adds `IBV_SEND_INLINE`.
    pub fn inline(self) -> SendWr {
        self.flags(SendFlags::INLINE)
    }

    /// Number of scatter/gather entries (set by the chain).
    pub fn num_sge(&self) -> usize {
        self.num_sge as usize
    }
}

/// A receive work request (`struct ibv_recv_wr` without `next` and `sg_list`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RecvWr {
    /// User-defined ID returned in the completion.
    pub wr_id: u64,
    sge_start: u32,
    num_sge: u32,
}

impl RecvWr {
    /// A receive request; its buffers are given to [`RecvChain::push`].
    pub fn new(wr_id: u64) -> RecvWr {
        RecvWr { wr_id, ..Default::default() }
    }

    /// Number of scatter/gather entries (set by the chain).
    pub fn num_sge(&self) -> usize {
        self.num_sge as usize
    }
}

/// Declares a chain type: requests of type `$wr` (which has `sge_start` / `num_sge` fields)
/// with their SGEs in one shared array. [`SendChain`], [`RecvChain`] and
/// [`OpsChain`](super::OpsChain) all come from it; each also defines `reset_extra`, which
/// clears per-request state a plain `push` must not carry over.
macro_rules! chain {
    ($(#[$doc:meta])* $name:ident, $wr:ty) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Default)]
        pub struct $name {
            wrs: Vec<$wr>,
            sges: Vec<Sge>,
            inline: Vec<u8>,
        }

        impl $name {
            /// An empty chain.
            pub fn new() -> Self {
                Self::default()
            }

            /// An empty chain with room for `wrs` requests and `sges` entries, so that pushing
            /// up to those numbers never allocates.
            pub fn with_capacity(wrs: usize, sges: usize) -> Self {
                Self { wrs: Vec::with_capacity(wrs), sges: Vec::with_capacity(sges), inline: Vec::new() }
            }

            /// Empties the chain, keeping its capacity.
            pub fn clear(&mut self) {
                self.wrs.clear();
                self.sges.clear();
                self.inline.clear();
            }

            /// Appends `wr` with its scatter/gather list (copied into the chain).
            pub fn push(&mut self, mut wr: $wr, sges: &[Sge]) -> &mut Self {
                wr.sge_start = self.sges.len() as u32;
                wr.num_sge = sges.len() as u32;
                Self::reset_extra(&mut wr);
                self.sges.extend_from_slice(sges);
                self.wrs.push(wr);
                self
            }

            /// Number of work requests.
            pub fn len(&self) -> usize {
                self.wrs.len()
            }

            /// Whether the chain has no work request.
            pub fn is_empty(&self) -> bool {
                self.wrs.is_empty()
            }

            /// The work requests, in posting order.
            pub fn wrs(&self) -> &[$wr] {
                &self.wrs
            }

            /// Mutable access to the work requests (their SGE lists stay as pushed).
            pub fn wrs_mut(&mut self) -> &mut [$wr] {
                &mut self.wrs
            }

            /// The scatter/gather list of the request at `i`.
            pub fn sges(&self, i: usize) -> &[Sge] {
                let wr = &self.wrs[i];
                &self.sges[wr.sge_start as usize..(wr.sge_start + wr.num_sge) as usize]
            }

            /// The scatter/gather list of the request at `i`, writable: a chain built once can
            /// be re-aimed between posts (new addresses, same number of entries), as verbs
            /// users rewrite `sg_list` in place.
            pub fn sges_mut(&mut self, i: usize) -> &mut [Sge] {
                let wr = &self.wrs[i];
                &mut self.sges[wr.sge_start as usize..(wr.sge_start + wr.num_sge) as usize]
            }

            /// The scatter/gather list of `wr`, which must belong to this chain.
            pub fn sges_of(&self, wr: &$wr) -> &[Sge] {
                &self.sges[wr.sge_start as usize..(wr.sge_start + wr.num_sge) as usize]
            }

            /// Iterates over `(request, its SGE list)` pairs.
            pub fn iter(&self) -> impl Iterator<Item = (&$wr, &[Sge])> + '_ {
                self.wrs.iter().map(move |wr| (wr, self.sges_of(wr)))
            }
        }
    };
}

pub(super) use chain;

chain!(
    /// A list of send work requests posted with one doorbell.
    SendChain,
    SendWr
);
chain!(
    /// A list of receive work requests posted with one doorbell.
    RecvChain,
    RecvWr
);

impl SendChain {
    fn reset_extra(wr: &mut SendWr) {
        wr.inline_len = 0;
        wr.tso_hdr_len = 0;
    }

    /// Appends TSO request `wr` ([`SendWr::tso`]) with its header template `hdr` (`tso.hdr`,
    /// copied into the chain now, as the NIC copies it into the WQE) and its payload's gather
    /// list. A template longer than 65,535 bytes is cut there (`hdr_sz` is 16 bits; the
    /// provider refuses anything above its `max_tso_header` anyway).
    pub fn push_tso(&mut self, mut wr: SendWr, hdr: &[u8], sges: &[Sge]) -> &mut Self {
        let hdr = &hdr[..hdr.len().min(usize::from(u16::MAX))];
        wr.inline_start = self.inline.len() as u32;
        self.inline.extend_from_slice(hdr);
        self.push(wr, sges);
        // `push` cleared the header length (a plain push carries none): set it on this one.
        if let Some(w) = self.wrs.last_mut() {
            w.tso_hdr_len = hdr.len() as u16;
        }
        self
    }

    /// The TSO header template of `wr` if it was pushed with [`SendChain::push_tso`].
    pub fn tso_hdr_of(&self, wr: &SendWr) -> Option<&[u8]> {
        match wr.tso_hdr_len {
            0 => None,
            n => Some(&self.inline[wr.inline_start as usize..wr.inline_start as usize + usize::from(n)]),
        }
    }

    /// Appends `wr` carrying `data` inline: the bytes are copied into the chain now, so the
    /// caller's buffer is free at once and no L_Key is involved (`IBV_SEND_INLINE`). The
    /// provider rejects data longer than the QP's `max_inline_data`.
    pub fn push_inline(&mut self, mut wr: SendWr, data: &[u8]) -> &mut Self {
        wr.flags |= SendFlags::INLINE;
        wr.sge_start = self.sges.len() as u32;
        wr.num_sge = 0;
        wr.inline_start = self.inline.len() as u32;
        wr.inline_len = data.len() as u32;
        // Marks "inline bytes present" even for zero-length data.
        if data.is_empty() {
            wr.inline_len = u32::MAX;
        }
        self.inline.extend_from_slice(data);
        self.wrs.push(wr);
        self
    }

    /// The inline bytes of `wr` if it was pushed with [`SendChain::push_inline`].
    #[inline]
    pub fn inline_of(&self, wr: &SendWr) -> Option<&[u8]> {
        match wr.inline_len {
            0 => None,
            u32::MAX => Some(&[]),
            n => Some(&self.inline[wr.inline_start as usize..(wr.inline_start + n) as usize]),
        }
    }

    /// A chain holding one request.
    pub fn one(wr: SendWr, sges: &[Sge]) -> SendChain {
        let mut c = SendChain::with_capacity(1, sges.len());
        c.push(wr, sges);
        c
    }
}

impl RecvChain {
    fn reset_extra(_: &mut RecvWr) {}

    /// A chain holding one request.
    pub fn one(wr_id: u64, sges: &[Sge]) -> RecvChain {
        let mut c = RecvChain::with_capacity(1, sges.len());
        c.push(RecvWr::new(wr_id), sges);
        c
    }

    /// Replaces the chain's requests with one receive of one SGE per address in `addrs`:
    /// `len` bytes of the MR `lkey`, the address as its `wr_id` (what a replenisher posts;
    /// the providers' default `post_recv_buffers`). Allocates only while the chain grows.
    pub fn set_buffers(&mut self, addrs: &[u64], len: u32, lkey: u32) {
        self.clear();
        for &a in addrs {
            self.push(RecvWr::new(a), &[Sge::new(a, len, lkey)]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_keeps_sges_per_request_and_reuses_capacity() {
        let mut c = SendChain::with_capacity(4, 8);
        c.push(SendWr::send(1), &[Sge::new(1, 2, 3)]);
        c.push(SendWr::send(2), &[Sge::new(4, 5, 6), Sge::new(7, 8, 9)]);
        c.push(SendWr::send(3), &[]);
        assert_eq!(c.len(), 3);
        assert_eq!(c.sges(1), &[Sge::new(4, 5, 6), Sge::new(7, 8, 9)]);
        assert_eq!(c.sges(2), &[]);
        let cap = (c.wrs.capacity(), c.sges.capacity());
        c.clear();
        assert!(c.is_empty());
        assert_eq!((c.wrs.capacity(), c.sges.capacity()), cap);
    }
}

//! Placement: moving a message's bytes. A send's gather list is resolved to segments of this
//! process (`resolve_local`), a receive request to segments of the receiver's registered
//! memory (`resolve_recv`, every address checked against the MR table and the fabric), and
//! the bytes are copied across (`copy_sg`, `place`, `recv_dst` + `copy_translated`), or, for a
//! small SEND, carried in the CQE and placed by the receiver's poll (`place_inline`). The last stage before the
//! completion; it calls only the MR table and the receive-request codec.

pub(crate) use super::cell::copy_one;
use super::fabric::Fabric;
use super::mr::{mr_lookup, MrCache, MrView};
use super::recvq::{recv_sge_len, RecvEntry, MAX_SGE};
use crate::verbs::*;

/// A contiguous piece of memory in this process.
#[derive(Clone, Copy)]
pub(crate) struct Seg {
    pub ptr: *mut u8,
    pub len: usize,
}

impl Default for Seg {
    fn default() -> Self {
        Seg { ptr: std::ptr::null_mut(), len: 0 }
    }
}

/// Copies the bytes of `src` into `dst`, skipping the first `skip` bytes of `dst`.
/// The caller has checked that `dst` holds `skip + total(src)` bytes.
#[inline]
pub(crate) fn copy_sg(src: &[Seg], dst: &[Seg], skip: usize) {
    // The common case, one segment into one buffer, without the walk below.
    if let ([s], [d]) = (src, dst) {
        debug_assert!(skip + s.len <= d.len);
        // SAFETY: as below: both ranges were bounds-checked, and the caller checked that `d`
        // holds `skip + s.len` bytes; `copy_one` tolerates overlap.
        unsafe { copy_one(s.ptr, d.ptr.add(skip), s.len) };
        return;
    }
    let (mut di, mut doff) = (0usize, skip);
    while di < dst.len() && doff >= dst[di].len {
        doff -= dst[di].len;
        di += 1;
    }
    for s in src {
        let mut soff = 0;
        while soff < s.len {
            let d = dst[di];
            let n = (s.len - soff).min(d.len - doff);
            // SAFETY: both ranges were bounds-checked against their MRs and the fabric (or are
            // the caller's own inline buffer); `copy` tolerates overlap (a QP sending to its own
            // buffers).
            unsafe { std::ptr::copy(s.ptr.add(soff), d.ptr.add(doff), n) };
            soff += n;
            doff += n;
            if doff == d.len {
                di += 1;
                doff = 0;
            }
        }
    }
}

/// Resolves the receive request's SGEs in the receiver's PD; `None` on a protection error.
/// `out` must hold `rx.n` segments (`N >= rx.n`).
#[inline]
pub(crate) fn resolve_recv<const N: usize>(
    f: &Fabric,
    pd: u32,
    rx: &RecvEntry,
    out: &mut [Seg; N],
) -> Option<(usize, u64)> {
    debug_assert!(rx.n <= N);
    let mut cap = 0u64;
    for (s, o) in rx.sges[..rx.n].iter().zip(out.iter_mut()) {
        let mr = mr_lookup(f, s.lkey).filter(|m| !m.window)?;
        if mr.pd != pd || !mr.access.contains(AccessFlags::LOCAL_WRITE) {
            return None;
        }
        let len = recv_sge_len(s);
        *o = Seg { ptr: mr.translate(f, s.addr, len)?, len: len as usize };
        cap += len;
    }
    Some((rx.n, cap))
}

/// A message as it reaches the receive request it consumes (`exec::deliver` and what
/// follows it): the WR that carries it (opcode, immediate, flags), its bytes (`src`, `total`
/// in all), UD's GRH area and whether the bytes land in the receive buffer.
#[derive(Clone, Copy)]
pub(crate) struct Incoming<'a> {
    pub(crate) wr: &'a SendWr,
    pub(crate) src: &'a [Seg],
    pub(crate) total: u64,
    /// UD's 40-byte header area: `Some(Some(bytes))` written (a global route), `Some(None)`
    /// skipped; `None` on any other transport.
    pub(crate) grh: &'a Option<Option<[u8; GRH_LEN]>>,
    /// False for a WRITE_WITH_IMM, whose bytes went to the rkey's memory: the receive request
    /// only completes (with the byte count).
    pub(crate) place_data: bool,
}

impl<'a> Incoming<'a> {
    /// `wr`'s bytes with no GRH area, placed in the receive buffer: a SEND on RC, UC or XRC,
    /// a RAW_PACKET frame.
    pub(crate) fn sent(wr: &'a SendWr, src: &'a [Seg], total: u64) -> Incoming<'a> {
        Incoming { wr, src, total, grh: &None, place_data: true }
    }
}

/// Checks the receive request's buffers and copies the message `m` into them (UD: after the
/// GRH area), setting `wc`'s byte count and GRH flag. On failure, the receiver's and the
/// sender's status. `N` must be at least `rx.n`.
#[inline]
pub(crate) fn place<const N: usize>(
    f: &Fabric,
    pd: u32,
    rx: &RecvEntry,
    m: &Incoming<'_>,
    wc: &mut WorkCompletion,
) -> std::result::Result<(), (WcStatus, WcStatus)> {
    let Incoming { src, total, grh, place_data, .. } = *m;
    let hdr = if grh.is_some() { GRH_LEN } else { 0 };
    let need = hdr as u64 + if place_data { total } else { 0 };
    let mut dst = [Seg::default(); N];
    match resolve_recv(f, pd, rx, &mut dst) {
        None => Err((WcStatus::LocProtErr, WcStatus::RemOpErr)),
        Some((_, cap)) if cap < need => Err((WcStatus::LocLenErr, WcStatus::RemInvReqErr)),
        Some((n, _)) => {
            if let Some(Some(g)) = grh {
                copy_sg(&[Seg { ptr: g.as_ptr() as *mut u8, len: GRH_LEN }], &dst[..n], 0);
                wc.wc_flags |= WcFlags::GRH;
            }
            if place_data {
                copy_sg(src, &dst[..n], hdr);
                wc.byte_len = need as u32;
            } else {
                wc.byte_len = total as u32;
            }
            Ok(())
        }
    }
}

/// The receive buffer of the one-SGE request `r` for a message of `len` bytes: `r`'s lkey
/// names an MR (not a window) of PD `pd` (the receiving QP's, or its SRQ's) with LOCAL_WRITE
/// whose range holds the SGE, and the SGE holds the message. `None` otherwise. The caller
/// either copies (`copy_translated`) or hands the bytes to the receiver's poll in the CQE
/// (`CqRing::push_inline_recv`).
///
/// The MR is looked up for every request here (the general path's). The fast path keeps
/// it across posts instead ([`recv_dst_kept`]); the receiver's drain reuses it within one
/// run of queued messages ([`recv_dst_in`], session 51).
#[inline(always)]
pub(crate) fn recv_dst(f: &Fabric, pd: u32, r: &Sge, len: usize) -> Option<*mut u8> {
    recv_dst_in(f, pd, r, len, &mut None)
}

/// [`recv_dst`] with the lkey's MR view kept across the sender's posts in `mrs` (its
/// `SqState::recv_lkeys`, session 55): while the receiver posts its buffers from one MR, a
/// message checks the slot's epoch instead of looking the MR up (`MrCache`). The same
/// checks and the same outcome: the window and LOCAL_WRITE checks passed when the view was
/// taken, the PD (the target's, which may change with the target) is checked per message.
///
/// (Session 12 reused the MR within a sender's post list and read `dp-perf send_bw` 15-25%
/// slower, cause unknown, on another host; see docs/benchmarks.md, session 55, for this
/// one's measurement.)
#[inline(always)]
pub(crate) fn recv_dst_kept(f: &Fabric, pd: u32, r: &Sge, len: usize, mrs: &mut MrCache) -> Option<*mut u8> {
    let cap = recv_sge_len(r);
    if len as u64 > cap {
        return None;
    }
    let mr = mrs.get(f, r.lkey, |m| !m.window && m.access.contains(AccessFlags::LOCAL_WRITE))?;
    if mr.pd != pd {
        return None;
    }
    mr.translate(f, r.addr, cap)
}

/// `recv_dst` within a run of queued messages: `run_mr` holds the MR (and its lkey) an
/// earlier request of the run passed the checks with, reused when this request names the
/// same lkey, and replaced by the one looked up otherwise. A run is claimed and delivered
/// within one poll, as a post list is one doorbell: an MR deregistered meanwhile counts as
/// deregistered after it. With `&mut None` (as `recv_dst` passes) it is the plain lookup.
#[inline(always)]
pub(crate) fn recv_dst_in(
    f: &Fabric,
    pd: u32,
    r: &Sge,
    len: usize,
    run_mr: &mut Option<(u32, MrView)>,
) -> Option<*mut u8> {
    let cap = recv_sge_len(r);
    if len as u64 > cap {
        return None;
    }
    let mr = match *run_mr {
        Some((key, mr)) if key == r.lkey => mr,
        _ => {
            let mr = mr_lookup(f, r.lkey)
                .filter(|m| !m.window && m.pd == pd && m.access.contains(AccessFlags::LOCAL_WRITE))?;
            *run_mr = Some((r.lkey, mr));
            mr
        }
    };
    mr.translate(f, r.addr, cap)
}

/// The poll's side of a receive completion that carries its payload (`CqeInline`): copies
/// `n` bytes from `src` (inside the CQE's cell) to fabric offset `off`, the receive buffer the
/// sender checked. False, writing nothing, if the range is not inside the fabric's arena (a
/// corrupt CQE: the completion then reads as an error).
#[inline(always)]
pub(crate) fn place_inline(f: &Fabric, off: u64, src: *const u8, n: usize) -> bool {
    match f.ptr(off, n as u64) {
        Some(dst) => {
            // SAFETY: `ptr` checked `[off, off + n)` to lie inside the mapped arena, and `src`
            // is readable for `n` bytes (the claimed CQE cell, `CqRing::pop`); `copy_one`
            // tolerates overlap (only a corrupt offset pointing into the CQ ring makes one).
            unsafe { copy_one(src, dst, n) };
            true
        }
        None => false,
    }
}

/// Copies `len` bytes between two ranges that were translated through the MR table for at
/// least `len` bytes each (the sender's lkey, and the target's rkey or receive lkey), as
/// every `Seg` is. Overlap is allowed (a loopback QP may write into its own buffer).
#[inline(always)]
pub(crate) fn copy_translated(src: *mut u8, dst: *mut u8, len: usize) {
    // SAFETY: both ranges are inside the fabric and hold `len` bytes (the contract above,
    // kept by every caller: they pass pointers `MrView::translate` returned for `len`
    // bytes); `copy_one` tolerates overlap.
    unsafe { copy_one(src, dst, len) }
}

/// Reads `len` (at most 32) bytes from `src`, a range translated through the MR table (or
/// checked against the fabric) for at least that many bytes, into four words in native
/// byte order (the bytes after `len` are zero): a queued message's payload, read straight
/// into the words of its cell (`doorbell::post_mq`).
///
/// The words are built from loads alone, never through a buffer on the stack: a lone
/// queued SEND's stores wait in the store buffer behind the previous message's cell (a line
/// the receiver holds), so every store a post makes is time (session 26: 40 more stores
/// per post made `send_bw -l 1` 0.80x, 40 more ALU instructions 0.99x).
#[inline(always)]
pub(crate) fn read_translated_words(src: *const u8, len: usize) -> [u64; 4] {
    let len = len.min(32);
    // SAFETY: `src` is readable for `len` bytes (the contract above).
    unsafe {
        [payload_word(src, len, 0), payload_word(src, len, 1), payload_word(src, len, 2), payload_word(src, len, 3)]
    }
}

/// Word `i` of a payload of `len` (at most 32) bytes at `src`: bytes `8i..8i + 8` if they
/// are all in it, the last `len - 8i` of them otherwise (zero-filled above), zero past the
/// end.
///
/// # Safety
/// `src` readable for `len` bytes.
#[inline(always)]
unsafe fn payload_word(src: *const u8, len: usize, i: usize) -> u64 {
    let at = 8 * i;
    if len >= at + 8 {
        // SAFETY: `[src + at, src + at + 8)` is inside the `len` readable bytes.
        unsafe { (src.add(at) as *const u64).read_unaligned() }
    } else if len <= at {
        0
    } else if len >= 8 {
        // The 8 bytes ending at `len`: the last `len - at` are this word's.
        // SAFETY: `[src + len - 8, src + len)` is inside the range (`len >= 8`).
        let t = unsafe { (src.add(len - 8) as *const u64).read_unaligned() };
        let drop = 8 * (8 - (len - at));
        if cfg!(target_endian = "little") {
            t >> drop
        } else {
            t << drop
        }
    } else {
        // SAFETY: `src` is readable for `len` (1 to 7) bytes.
        unsafe { short_word(src, len) }
    }
}

/// The first `len` (1 to 7) bytes at `src` as a word in native byte order, the rest zero.
///
/// # Safety
/// `src` readable for `len` bytes.
#[inline(always)]
unsafe fn short_word(src: *const u8, len: usize) -> u64 {
    // SAFETY: every load lies inside `[src, src + len)`: two overlapping 4-byte loads cover 4
    // to 7 bytes, single bytes cover 1 to 3.
    let le = unsafe {
        if len >= 4 {
            let lo = u32::from_le((src as *const u32).read_unaligned());
            let hi = u32::from_le((src.add(len - 4) as *const u32).read_unaligned());
            u64::from(lo) | u64::from(hi) << (8 * (len - 4))
        } else {
            let mut v = u64::from(src.read());
            if len >= 2 {
                v |= u64::from(src.add(1).read()) << 8;
            }
            if len == 3 {
                v |= u64::from(src.add(2).read()) << 16;
            }
            v
        }
    };
    // `le` has byte `k` of the payload at bits `8k`: that is the native word's memory order
    // on a little-endian machine, and swapped into it on a big-endian one.
    u64::from_le(le)
}

/// Writes the first `len` bytes of `words` (native byte order; `len` is cut to what they
/// hold) to `dst`, a receive buffer translated through the MR table for at least `len`
/// bytes (`recv_dst`): a queued message's payload placed by its drainer.
#[inline(always)]
pub(crate) fn write_translated_words(dst: *mut u8, words: &[u64], len: usize) {
    let len = len.min(std::mem::size_of_val(words));
    // SAFETY: `dst` is writable for `len` bytes (the contract above); `words` is readable
    // for `len` bytes (cut to its size above); `copy_one` is `ptr::copy` with inline small
    // lengths.
    unsafe { super::cell::copy_one(words.as_ptr() as *const u8, dst, len) }
}

/// [`write_translated_words`] of four payload words passed by value (at most 32 bytes), with
/// stores from registers: whole words, then the tail as one store of the 8 bytes ending at
/// `len` (or, below 8 bytes, stores of 4, 2 and 1 bytes), never a byte past `len`. Through a
/// slice the words had to be in memory, and the drainer built each message on the stack
/// for it (session 57). Big-endian machines take the slice version.
#[inline(always)]
pub(crate) fn write_translated_payload(dst: *mut u8, w: [u64; 4], len: usize) {
    if cfg!(target_endian = "big") {
        return write_translated_words(dst, &w, len);
    }
    let len = len.min(32);
    let (k, rem) = (len / 8, len % 8);
    // SAFETY: `dst` is writable for `len` bytes (`write_translated_words`' contract); every
    // store below lies in `[dst, dst + len)`: word `i` when `8 (i + 1) <= len`, the tail's
    // 8 bytes at `len - 8` when `len >= 8`, the short stores inside `[0, rem)` when `len < 8`.
    unsafe {
        let put = |at: usize, v: u64| (dst.add(at) as *mut u64).write_unaligned(v);
        if k >= 1 {
            put(0, w[0]);
        }
        if k >= 2 {
            put(8, w[1]);
        }
        if k >= 3 {
            put(16, w[2]);
        }
        if k >= 4 {
            put(24, w[3]);
        }
        if rem == 0 {
            return;
        }
        // The word holding the tail's bytes (byte `j` of the payload is byte `j % 8` of word
        // `j / 8`, little-endian).
        let hi = match k {
            0 => w[0],
            1 => w[1],
            2 => w[2],
            _ => w[3],
        };
        if k > 0 {
            // Bytes `len - 8 .. len`: the top `8 - rem` bytes of word `k - 1`, then the low
            // `rem` bytes of word `k`.
            let lo = match k {
                1 => w[0],
                2 => w[1],
                _ => w[2],
            };
            let s = 8 * rem as u32;
            put(len - 8, (lo >> s) | (hi << (64 - s)));
            return;
        }
        // Fewer than 8 bytes, all in `hi`'s low bytes: overlapping stores of 4, 2 or 1.
        if rem >= 4 {
            (dst as *mut u32).write_unaligned(hi as u32);
            (dst.add(rem - 4) as *mut u32).write_unaligned((hi >> (8 * (rem - 4))) as u32);
        } else if rem >= 2 {
            (dst as *mut u16).write_unaligned(hi as u16);
            (dst.add(rem - 2) as *mut u16).write_unaligned((hi >> (8 * (rem - 2))) as u16);
        } else {
            dst.write(hi as u8);
        }
    }
}

/// Copies the first `out.len()` bytes of the gather list into `out`.
pub(crate) fn gather_prefix(src: &[Seg], out: &mut [u8]) {
    let mut at = 0;
    for s in src {
        let n = s.len.min(out.len() - at);
        // SAFETY: `s` is a checked local segment of at least `n` bytes; `out` has room.
        unsafe { std::ptr::copy(s.ptr, out[at..].as_mut_ptr(), n) };
        at += n;
        if at == out.len() {
            break;
        }
    }
}

/// The gather list without its first `skip` bytes.
pub(crate) fn skip_prefix(src: &[Seg], mut skip: usize, out: &mut [Seg; MAX_SGE]) -> usize {
    let mut n = 0;
    for s in src {
        if skip >= s.len {
            skip -= s.len;
            continue;
        }
        // SAFETY: `skip < s.len`, so the new start is inside the segment.
        out[n] = Seg { ptr: unsafe { s.ptr.add(skip) }, len: s.len - skip };
        skip = 0;
        n += 1;
    }
    n
}

/// The 40-byte GRH a UD receiver finds before the payload: version 6, payload length, next
/// header "IBA transport", hop limit 64, source and destination GIDs.
pub(crate) fn grh_bytes(total: u64, sgid: &[u8; 16], dgid: &[u8; 16]) -> [u8; GRH_LEN] {
    let mut g = [0u8; GRH_LEN];
    g[0] = 0x60; // IPv6-style version 6, traffic class and flow label 0
    g[4..6].copy_from_slice(&(total as u16).to_be_bytes());
    g[6] = 0x1b; // next header: IBA transport
    g[7] = 64; // hop limit
    g[8..24].copy_from_slice(sgid);
    g[24..40].copy_from_slice(dgid);
    g
}

/// Resolves local SGEs for a send into segments of this process (`out` holds at least
/// `sges.len()`); used at post time and again when a pending WQE runs.
#[inline]
pub(crate) fn resolve_local(
    f: &Fabric,
    pd: u32,
    sges: &[Sge],
    need_write: bool,
    out: &mut [Seg],
) -> std::result::Result<(usize, u64), &'static str> {
    let mut total = 0u64;
    for (k, s) in sges.iter().enumerate() {
        let Some(mr) = mr_lookup(f, s.lkey).filter(|m| !m.window) else { return Err("unknown lkey") };
        if mr.pd != pd {
            return Err("lkey belongs to another protection domain");
        }
        if need_write && !mr.access.contains(AccessFlags::LOCAL_WRITE) {
            return Err("RDMA READ/atomic target MR lacks LOCAL_WRITE");
        }
        let Some(p) = mr.translate(f, s.addr, s.length as u64) else { return Err("SGE outside its memory region") };
        out[k] = Seg { ptr: p, len: s.length as usize };
        total += s.length as u64;
    }
    Ok((sges.len(), total))
}

#[cfg(test)]
mod tests {
    use super::{read_translated_words, write_translated_payload, write_translated_words};

    /// Every length a cell carries reads back byte for byte, with zeros after the payload,
    /// from a buffer that ends where the payload ends (no load may go past it).
    #[test]
    fn payload_words_hold_exactly_the_payload() {
        for len in 0..=32usize {
            let src: Vec<u8> = (0..len as u8).map(|b| b.wrapping_mul(37).wrapping_add(1)).collect();
            let words = read_translated_words(src.as_ptr(), len);
            let mut bytes = [0u8; 32];
            for (o, w) in bytes.chunks_exact_mut(8).zip(words) {
                o.copy_from_slice(&w.to_ne_bytes());
            }
            assert_eq!(&bytes[..len], &src[..], "payload of {len} bytes");
            assert!(bytes[len..].iter().all(|&b| b == 0), "bytes after a payload of {len}");
            let mut back = vec![0xEEu8; len + 1];
            write_translated_words(back.as_mut_ptr(), &words, len);
            assert_eq!(&back[..len], &src[..], "placed payload of {len} bytes");
            assert_eq!(back[len], 0xEE, "byte after a placed payload of {len}");
            let mut regs = vec![0xEEu8; len + 1];
            write_translated_payload(regs.as_mut_ptr(), words, len);
            assert_eq!(&regs[..len], &src[..], "payload of {len} bytes placed from registers");
            assert_eq!(regs[len], 0xEE, "byte after a payload of {len} placed from registers");
        }
    }
}

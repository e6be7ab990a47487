//! TCP segmentation offload in software (`IBV_WR_TSO`): one work request carries a TCP/IP
//! header template (`tso.hdr`, `hdr_sz`) and a payload; the device sends it as frames of at
//! most `mss` payload bytes, each behind a copy of the header fixed for its place in the
//! stream. What is fixed per frame follows what NICs and Linux GSO do:
//!
//! - IPv4: total length, identification (the template's, plus the frame's index) and the
//!   header checksum; IPv6: payload length;
//! - TCP: sequence number (the template's, plus the bytes before the frame), FIN and PSH
//!   only on the last frame, CWR only on the first, and the checksum over the pseudo-header,
//!   header and payload.
//!
//! The template must be Ethernet (up to two VLAN tags), IPv4 without options that fragment
//! (no MF, offset 0) or IPv6 with TCP as its next header, and TCP with its options; `hdr_sz`
//! must end exactly where the TCP header does. [`TsoPlan::new`] says which rule a template
//! breaks. Used by the `shm` provider's RAW_PACKET QPs, and meant for `xdp`.

use super::frame::{fill_ip_checksums, FrameKey};

/// TCP flag bits in the 14th byte of the TCP header.
const FIN: u8 = 0x01;
const PSH: u8 = 0x08;
const CWR: u8 = 0x80;

/// How one TSO request becomes frames: the header template's offsets and the segment size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TsoPlan {
    l3: usize,
    l4: usize,
    hdr_len: usize,
    ipv4: bool,
    mss: usize,
    payload: usize,
}

impl TsoPlan {
    /// Checks the header template `hdr` of a request with `payload` bytes cut at `mss`.
    /// The error says what is wrong with the template (the provider reports it as EINVAL).
    pub fn new(hdr: &[u8], mss: u16, payload: usize) -> Result<TsoPlan, &'static str> {
        if mss == 0 {
            return Err("TSO with an MSS of 0");
        }
        let k = FrameKey::parse(hdr);
        let (Some(l3), Some(l4)) = (k.l3, k.l4) else {
            return Err("TSO header is not Ethernet + IPv4/IPv6 + TCP");
        };
        if k.ip_proto != Some(6) {
            return Err("TSO header's IP protocol is not TCP");
        }
        let ipv4 = k.ether_type == 0x0800;
        if ipv4 {
            let frag = u16::from_be_bytes([hdr[l3 + 6], hdr[l3 + 7]]);
            if frag & 0x3fff != 0 {
                return Err("TSO header is an IPv4 fragment (MF set or offset not 0)");
            }
            if usize::from(hdr[l3] & 0x0f) < 5 {
                return Err("TSO header's IPv4 IHL is below 5");
            }
        }
        if hdr.len() < l4 + 20 {
            return Err("TSO header ends inside the TCP header");
        }
        let doff = usize::from(hdr[l4 + 12] >> 4) * 4;
        if doff < 20 || l4 + doff != hdr.len() {
            return Err("TSO hdr_sz does not end where the TCP header (data offset) ends");
        }
        Ok(TsoPlan { l3, l4, hdr_len: hdr.len(), ipv4, mss: usize::from(mss), payload })
    }

    /// Frames the request becomes: one per `mss` bytes of payload, at least one.
    pub fn frames(&self) -> usize {
        self.payload.div_ceil(self.mss).max(1)
    }

    /// The header template's length (`hdr_sz`).
    pub fn header_len(&self) -> usize {
        self.hdr_len
    }

    /// The payload range of frame `k`: (offset in the payload, length).
    pub fn range(&self, k: usize) -> (usize, usize) {
        let off = k * self.mss;
        (off, self.mss.min(self.payload.saturating_sub(off)))
    }

    /// Builds frame `k` in `out` (which must hold `header_len() + range(k).1` bytes, its
    /// payload already in place after the header's room): copies the template, fixes the
    /// lengths, IPv4 id, TCP sequence and flags, then both checksums. Returns the frame's
    /// length.
    pub fn write_frame(&self, hdr: &[u8], k: usize, out: &mut [u8]) -> usize {
        let (off, len) = self.range(k);
        let n = self.hdr_len + len;
        let (l3, l4) = (self.l3, self.l4);
        out[..self.hdr_len].copy_from_slice(&hdr[..self.hdr_len]);
        if self.ipv4 {
            out[l3 + 2..l3 + 4].copy_from_slice(&((n - l3) as u16).to_be_bytes());
            let id = u16::from_be_bytes([hdr[l3 + 4], hdr[l3 + 5]]).wrapping_add(k as u16);
            out[l3 + 4..l3 + 6].copy_from_slice(&id.to_be_bytes());
        } else {
            out[l3 + 4..l3 + 6].copy_from_slice(&((n - l3 - 40) as u16).to_be_bytes());
        }
        let seq = u32::from_be_bytes([hdr[l4 + 4], hdr[l4 + 5], hdr[l4 + 6], hdr[l4 + 7]]).wrapping_add(off as u32);
        out[l4 + 4..l4 + 8].copy_from_slice(&seq.to_be_bytes());
        let mut flags = hdr[l4 + 13];
        if k + 1 != self.frames() {
            flags &= !(FIN | PSH);
        }
        if k != 0 {
            flags &= !CWR;
        }
        out[l4 + 13] = flags;
        fill_ip_checksums(&mut out[..n]);
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::checksum;

    /// Ethernet + IPv4 (id 0x1000) + TCP (seq 1000, flags CWR|PSH|FIN|ACK, 12 bytes of options).
    fn tcp4() -> Vec<u8> {
        let mut h = vec![2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1, 0x08, 0x00];
        h.extend_from_slice(&[0x45, 0, 0, 0, 0x10, 0x00, 0x40, 0, 64, 6, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2]);
        h.extend_from_slice(&[
            0x30,
            0x39,
            0x00,
            0x50,
            0,
            0,
            0x03,
            0xe8,
            0,
            0,
            0,
            1,
            0x80,
            0x80 | 0x10 | 0x09,
            0xff,
            0xff,
        ]);
        h.extend_from_slice(&[0, 0, 0, 0, 1, 1, 8, 10, 0, 0, 0, 1, 0, 0, 0, 2]);
        h
    }

    fn tcp6() -> Vec<u8> {
        let mut h = vec![2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1, 0x86, 0xdd];
        h.extend_from_slice(&[0x60, 0, 0, 0, 0, 0, 6, 64]);
        h.extend_from_slice(&[0x20, 1, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
        h.extend_from_slice(&[0x20, 1, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
        h.extend_from_slice(&[
            0x30, 0x39, 0x00, 0x50, 0xff, 0xff, 0xff, 0xf0, 0, 0, 0, 1, 0x50, 0x18, 0xff, 0xff, 0, 0, 0, 0,
        ]);
        h
    }

    /// Segments `payload` behind `hdr` and checks every frame as a receiver would.
    fn check(hdr: &[u8], payload: &[u8], mss: u16) {
        let p = TsoPlan::new(hdr, mss, payload.len()).unwrap();
        let mut joined = Vec::new();
        let k0 = FrameKey::parse(hdr);
        let (l3, l4) = (k0.l3.unwrap(), k0.l4.unwrap());
        let seq0 = u32::from_be_bytes(hdr[l4 + 4..l4 + 8].try_into().unwrap());
        for k in 0..p.frames() {
            let (off, len) = p.range(k);
            let mut f = vec![0u8; p.header_len() + len];
            f[p.header_len()..].copy_from_slice(&payload[off..off + len]);
            let n = p.write_frame(hdr, k, &mut f);
            assert_eq!(n, f.len());
            assert!(len <= mss as usize && (len == mss as usize || k + 1 == p.frames()));
            let seg = &f[l4..];
            if p.ipv4 {
                assert_eq!(usize::from(u16::from_be_bytes([f[l3 + 2], f[l3 + 3]])), n - l3, "IPv4 total length");
                assert_eq!(u16::from_be_bytes([f[l3 + 4], f[l3 + 5]]), 0x1000 + k as u16, "IPv4 id");
                assert_eq!(checksum::finish(checksum::accumulate(0, &f[l3..l4])), 0, "IPv4 header checksum verifies");
                let (s, d) = (f[l3 + 12..l3 + 16].try_into().unwrap(), f[l3 + 16..l3 + 20].try_into().unwrap());
                assert_eq!(checksum::l4_ipv4(s, d, 6, seg), 0, "TCP checksum verifies");
            } else {
                assert_eq!(usize::from(u16::from_be_bytes([f[l3 + 4], f[l3 + 5]])), n - l3 - 40, "IPv6 length");
                let (s, d) = (f[l3 + 8..l3 + 24].try_into().unwrap(), f[l3 + 24..l3 + 40].try_into().unwrap());
                assert_eq!(checksum::l4_ipv6(&s, &d, 6, seg), 0, "TCP checksum verifies");
            }
            let seq = u32::from_be_bytes(f[l4 + 4..l4 + 8].try_into().unwrap());
            assert_eq!(seq, seq0.wrapping_add(off as u32), "sequence of frame {k}");
            let (flags, tflags) = (f[l4 + 13], hdr[l4 + 13]);
            let last = k + 1 == p.frames();
            assert_eq!(flags & (FIN | PSH), if last { tflags & (FIN | PSH) } else { 0 }, "FIN/PSH of frame {k}");
            assert_eq!(flags & CWR, if k == 0 { tflags & CWR } else { 0 }, "CWR of frame {k}");
            assert_eq!(flags & 0x10, tflags & 0x10, "ACK kept");
            joined.extend_from_slice(&f[p.header_len()..]);
        }
        assert_eq!(joined, payload, "the frames' payloads rebuild the request's");
    }

    #[test]
    fn a_64k_payload_becomes_mss_frames_that_verify_over_ipv4_and_ipv6() {
        let payload: Vec<u8> = (0..65536u32).map(|i| (i * 7 + i / 251) as u8).collect();
        let p = TsoPlan::new(&tcp4(), 1448, payload.len()).unwrap();
        assert_eq!(p.frames(), 46);
        assert_eq!(p.range(45), (45 * 1448, 65536 - 45 * 1448));
        check(&tcp4(), &payload, 1448);
        check(&tcp6(), &payload, 1440);
        // The sequence wraps (the IPv6 template starts 16 bytes below 2^32).
        check(&tcp6(), &payload[..100], 7);
        check(&tcp4(), &payload[..1448], 1448);
        check(&tcp4(), &[], 1448);
    }

    #[test]
    fn templates_that_cannot_be_segmented_are_refused_with_the_reason() {
        let h = tcp4();
        assert!(TsoPlan::new(&h, 0, 10).unwrap_err().contains("MSS of 0"));
        assert!(TsoPlan::new(&h[..h.len() - 4], 1000, 10).unwrap_err().contains("data offset"));
        assert!(TsoPlan::new(&h[..40], 1000, 10).unwrap_err().contains("inside the TCP header"));
        let mut udp = h.clone();
        udp[14 + 9] = 17;
        assert!(TsoPlan::new(&udp, 1000, 10).unwrap_err().contains("not TCP"));
        let mut frag = h.clone();
        frag[14 + 6] = 0x20; // MF
        assert!(TsoPlan::new(&frag, 1000, 10).unwrap_err().contains("fragment"));
        let mut arp = h.clone();
        arp[12..14].copy_from_slice(&[0x08, 0x06]);
        assert!(TsoPlan::new(&arp, 1000, 10).unwrap_err().contains("not Ethernet"));
    }
}

//! The Internet checksum (RFC 1071) and its incremental update (RFC 1624).
//!
//! Used by `IBV_SEND_IP_CSUM` offload in software (IPv4 header and TCP/UDP checksums), by TSO
//! segmentation, and by the router stage's TTL decrement. All functions take the bytes as they
//! are on the wire (big-endian 16-bit words) and return the checksum in host order, ready for
//! `to_be_bytes()`.

/// Adds `data` to a running ones'-complement sum of big-endian 16-bit words (an odd last byte
/// is padded with zero, RFC 1071 §4.1). Fold and invert the result with [`finish`].
#[inline]
pub fn accumulate(mut sum: u32, data: &[u8]) -> u32 {
    let mut chunks = data.chunks_exact(2);
    for w in &mut chunks {
        sum = add_folded(sum, u32::from(u16::from_be_bytes([w[0], w[1]])));
    }
    if let [last] = chunks.remainder() {
        sum = add_folded(sum, u32::from(*last) << 8);
    }
    sum
}

/// Adds without letting the 32-bit accumulator overflow (carries are folded back in).
#[inline]
fn add_folded(sum: u32, v: u32) -> u32 {
    let (s, carry) = sum.overflowing_add(v);
    s + u32::from(carry)
}

/// Folds a running sum to 16 bits and returns its ones' complement: the checksum field value.
#[inline]
pub fn finish(mut sum: u32) -> u16 {
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// Checksum of an IPv4 header (`hdr` is the whole header, IHL*4 bytes); the checksum field
/// (bytes 10..12) is skipped, so it need not be zeroed first.
pub fn ipv4_header(hdr: &[u8]) -> u16 {
    let head = &hdr[..hdr.len().min(10)];
    let tail = hdr.get(12..).unwrap_or(&[]);
    finish(accumulate(accumulate(0, head), tail))
}

/// TCP or UDP checksum over IPv4: pseudo-header (source, destination, zero, protocol, L4
/// length) plus the segment. The segment's own checksum field must be zero.
///
/// For UDP pass the result through [`udp_wire`] (a computed 0 is sent as 0xFFFF).
pub fn l4_ipv4(src: [u8; 4], dst: [u8; 4], protocol: u8, segment: &[u8]) -> u16 {
    let mut sum = accumulate(0, &src);
    sum = accumulate(sum, &dst);
    sum = add_folded(sum, u32::from(protocol));
    sum = add_folded(sum, segment.len() as u32);
    finish(accumulate(sum, segment))
}

/// TCP or UDP checksum over IPv6 (RFC 8200 §8.1 pseudo-header). The segment's own checksum
/// field must be zero. For UDP pass the result through [`udp_wire`] (mandatory over IPv6).
pub fn l4_ipv6(src: &[u8; 16], dst: &[u8; 16], next_header: u8, segment: &[u8]) -> u16 {
    let mut sum = accumulate(0, src);
    sum = accumulate(sum, dst);
    let len = segment.len() as u32;
    sum = add_folded(sum, len >> 16);
    sum = add_folded(sum, len & 0xffff);
    sum = add_folded(sum, u32::from(next_header));
    finish(accumulate(sum, segment))
}

/// UDP's rule: a computed checksum of 0 is transmitted as 0xFFFF (0 means "no checksum").
#[inline]
pub fn udp_wire(csum: u16) -> u16 {
    if csum == 0 {
        0xffff
    } else {
        csum
    }
}

/// Incremental update (RFC 1624 eqn. 3): the new checksum after one 16-bit word of the covered
/// data changed from `old_word` to `new_word`, without re-reading the packet.
#[inline]
pub fn update16(csum: u16, old_word: u16, new_word: u16) -> u16 {
    let sum = u32::from(!csum) + u32::from(!old_word) + u32::from(new_word);
    finish(sum)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The worked example of an IPv4 header checksum (20-byte header, checksum 0xB861).
    const HDR: [u8; 20] = [
        0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0xb8, 0x61, 0xc0, 0xa8, 0x00, 0x01, 0xc0, 0xa8,
        0x00, 0xc7,
    ];

    #[test]
    fn ipv4_header_checksum_matches_the_known_value_and_verifies_to_zero() {
        assert_eq!(ipv4_header(&HDR), 0xb861);
        // A receiver sums the header including its checksum: the result folds to 0xFFFF.
        assert_eq!(finish(accumulate(0, &HDR)), 0);
    }

    #[test]
    fn odd_length_pads_the_last_byte_with_zero() {
        assert_eq!(finish(accumulate(0, &[0x12, 0x34, 0x56])), finish(accumulate(0, &[0x12, 0x34, 0x56, 0x00])));
    }

    #[test]
    fn udp_over_ipv4_checksum_verifies() {
        let (src, dst) = ([10, 0, 0, 1], [10, 0, 0, 2]);
        let mut seg = vec![0x30, 0x39, 0x00, 0x35, 0x00, 0x0d, 0x00, 0x00, b'h', b'e', b'l', b'l', b'o'];
        let c = udp_wire(l4_ipv4(src, dst, 17, &seg));
        seg[6..8].copy_from_slice(&c.to_be_bytes());
        // With the checksum in place the same sum over pseudo-header + segment is 0.
        assert_eq!(l4_ipv4(src, dst, 17, &seg), 0);
    }

    #[test]
    fn tcp_over_ipv6_checksum_verifies() {
        let src = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
        let dst = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2];
        let mut seg = vec![0u8; 20 + 7];
        seg[12] = 5 << 4;
        seg[20..].copy_from_slice(b"payload");
        let c = l4_ipv6(&src, &dst, 6, &seg);
        seg[16..18].copy_from_slice(&c.to_be_bytes());
        assert_eq!(l4_ipv6(&src, &dst, 6, &seg), 0);
    }

    #[test]
    fn incremental_update_equals_recomputation_for_a_ttl_decrement() {
        let mut hdr = HDR;
        for _ in 0..64 {
            let old = u16::from_be_bytes([hdr[8], hdr[9]]);
            let csum = u16::from_be_bytes([hdr[10], hdr[11]]);
            hdr[8] -= 1;
            let new = u16::from_be_bytes([hdr[8], hdr[9]]);
            let updated = update16(csum, old, new);
            assert_eq!(updated, ipv4_header(&hdr));
            hdr[10..12].copy_from_slice(&updated.to_be_bytes());
        }
    }
}

//! Big-endian field access for the exchange protocols (ITCH, MoldUDP64 and OUCH are all
//! big endian). Readers return `None` past the end: every decoder checks bounds.

/// `n` bytes at `off` of `b`, if they are all there.
#[inline]
fn field<const N: usize>(b: &[u8], off: usize) -> Option<[u8; N]> {
    b.get(off..off.checked_add(N)?)?.try_into().ok()
}

/// The big-endian `u16` at `off`.
#[inline]
pub fn u16_at(b: &[u8], off: usize) -> Option<u16> {
    field::<2>(b, off).map(u16::from_be_bytes)
}

/// The big-endian `u32` at `off`.
#[inline]
pub fn u32_at(b: &[u8], off: usize) -> Option<u32> {
    field::<4>(b, off).map(u32::from_be_bytes)
}

/// The big-endian `u64` at `off`.
#[inline]
pub fn u64_at(b: &[u8], off: usize) -> Option<u64> {
    field::<8>(b, off).map(u64::from_be_bytes)
}

/// The big-endian 48-bit integer at `off` (ITCH timestamps).
#[inline]
pub fn u48_at(b: &[u8], off: usize) -> Option<u64> {
    let f = field::<6>(b, off)?;
    Some(f.iter().fold(0u64, |v, &x| (v << 8) | u64::from(x)))
}

/// A cursor writing big-endian fields into a buffer it was told is large enough (callers
/// check the length once, before encoding; a write past the end panics in debug and is a
/// bug, never input-driven).
#[allow(clippy::len_without_is_empty)] // a cursor, not a collection
pub struct Writer<'a> {
    b: &'a mut [u8],
    at: usize,
}

impl<'a> Writer<'a> {
    /// A writer at the start of `b`.
    pub fn new(b: &'a mut [u8]) -> Writer<'a> {
        Writer { b, at: 0 }
    }

    /// Bytes written.
    pub fn len(&self) -> usize {
        self.at
    }

    /// Appends raw bytes.
    #[inline]
    pub fn bytes(&mut self, v: &[u8]) -> &mut Self {
        self.b[self.at..self.at + v.len()].copy_from_slice(v);
        self.at += v.len();
        self
    }

    /// Appends one byte.
    #[inline]
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.bytes(&[v])
    }

    /// Appends a big-endian `u16`.
    #[inline]
    pub fn u16(&mut self, v: u16) -> &mut Self {
        self.bytes(&v.to_be_bytes())
    }

    /// Appends a big-endian `u32`.
    #[inline]
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.bytes(&v.to_be_bytes())
    }

    /// Appends a big-endian `u64`.
    #[inline]
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.bytes(&v.to_be_bytes())
    }

    /// Appends the low 48 bits of `v`, big endian.
    #[inline]
    pub fn u48(&mut self, v: u64) -> &mut Self {
        self.bytes(&v.to_be_bytes()[2..])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_bounds() {
        let mut b = [0u8; 21];
        let n = Writer::new(&mut b).u8(7).u16(0x0102).u32(0x0304_0506).u48(0x0708_090a_0b0c).u64(1).len();
        assert_eq!(n, 21);
        assert_eq!((b[0], u16_at(&b, 1), u32_at(&b, 3)), (7, Some(0x0102), Some(0x0304_0506)));
        assert_eq!(u48_at(&b, 7), Some(0x0708_090a_0b0c));
        assert_eq!(u64_at(&b, 13), Some(1));
        assert_eq!(u64_at(&b, 14), None, "past the end");
        assert_eq!(u64_at(&b, usize::MAX), None, "no overflow");
    }
}

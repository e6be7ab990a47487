//! Frames to a pcap file (the classic libpcap format: microsecond timestamps, Ethernet link
//! type), which tcpdump, Wireshark and every packet tool read. For the packet paths' tests and
//! captures; not on any hot path (it writes through `std::io::Write`).

use std::io::{self, Write};
use std::time::Duration;

/// `LINKTYPE_ETHERNET`.
const LINKTYPE_ETHERNET: u32 = 1;
/// Bytes of a frame kept in a record; longer frames are cut (their `orig_len` says so).
pub const SNAPLEN: u32 = 65_535;

/// Writes a pcap stream: the file header on creation, then one record per frame.
pub struct PcapWriter<W: Write> {
    out: W,
}

impl<W: Write> PcapWriter<W> {
    /// Starts a capture on `out` (writes the 24-byte file header: magic 0xa1b2c3d4 in this
    /// host's byte order, version 2.4, snap length [`SNAPLEN`], Ethernet).
    pub fn new(mut out: W) -> io::Result<Self> {
        let mut h = Vec::with_capacity(24);
        h.extend_from_slice(&0xa1b2_c3d4u32.to_ne_bytes());
        h.extend_from_slice(&2u16.to_ne_bytes());
        h.extend_from_slice(&4u16.to_ne_bytes());
        h.extend_from_slice(&0i32.to_ne_bytes()); // thiszone
        h.extend_from_slice(&0u32.to_ne_bytes()); // sigfigs
        h.extend_from_slice(&SNAPLEN.to_ne_bytes());
        h.extend_from_slice(&LINKTYPE_ETHERNET.to_ne_bytes());
        out.write_all(&h)?;
        Ok(PcapWriter { out })
    }

    /// Appends `frame`, captured at `ts` (since the Unix epoch).
    pub fn write_frame(&mut self, ts: Duration, frame: &[u8]) -> io::Result<()> {
        let kept = frame.len().min(SNAPLEN as usize);
        let mut r = [0u8; 16];
        r[0..4].copy_from_slice(&(ts.as_secs() as u32).to_ne_bytes());
        r[4..8].copy_from_slice(&ts.subsec_micros().to_ne_bytes());
        r[8..12].copy_from_slice(&(kept as u32).to_ne_bytes());
        r[12..16].copy_from_slice(&(frame.len() as u32).to_ne_bytes());
        self.out.write_all(&r)?;
        self.out.write_all(&frame[..kept])
    }

    /// Flushes and returns the writer.
    pub fn into_inner(mut self) -> io::Result<W> {
        self.out.flush()?;
        Ok(self.out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_and_records_have_the_libpcap_layout() {
        let mut w = PcapWriter::new(Vec::new()).unwrap();
        w.write_frame(Duration::new(7, 5_000), &[1, 2, 3]).unwrap();
        let v = w.into_inner().unwrap();
        assert_eq!(v.len(), 24 + 16 + 3);
        let u32_at = |i: usize| u32::from_ne_bytes(v[i..i + 4].try_into().unwrap());
        assert_eq!((u32_at(0), u32_at(16), u32_at(20)), (0xa1b2_c3d4, SNAPLEN, 1));
        assert_eq!((u32_at(24), u32_at(28), u32_at(32), u32_at(36)), (7, 5, 3, 3));
        assert_eq!(v[40..], [1, 2, 3]);
    }
}

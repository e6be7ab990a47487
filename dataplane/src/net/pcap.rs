//! Frames to a pcap file (the classic libpcap format: microsecond timestamps, Ethernet link
//! type), which tcpdump, Wireshark and every packet tool read. For the packet paths' tests and
//! captures; not on any hot path (it writes through `std::io::Write`).

use std::io::{self, Write};
use std::time::Duration;

/// `LINKTYPE_ETHERNET`.
const LINKTYPE_ETHERNET: u32 = 1;
/// Bytes of a frame kept in a record by default; longer frames are cut (their `orig_len`
/// says so).
pub const SNAPLEN: u32 = 65_535;

/// Writes a pcap stream: the file header on creation, then one record per frame.
pub struct PcapWriter<W: Write> {
    out: W,
    snaplen: u32,
}

impl<W: Write> PcapWriter<W> {
    /// Starts a capture on `out` (writes the 24-byte file header: magic 0xa1b2c3d4 in this
    /// host's byte order, version 2.4, snap length [`SNAPLEN`], Ethernet).
    pub fn new(out: W) -> io::Result<Self> {
        Self::with_snaplen(out, SNAPLEN)
    }

    /// As [`new`](Self::new), keeping at most `snaplen` bytes of each frame (1..=[`SNAPLEN`]; a
    /// value out of range is taken as [`SNAPLEN`]).
    pub fn with_snaplen(mut out: W, snaplen: u32) -> io::Result<Self> {
        let snaplen = if (1..=SNAPLEN).contains(&snaplen) { snaplen } else { SNAPLEN };
        let mut h = Vec::with_capacity(24);
        h.extend_from_slice(&0xa1b2_c3d4u32.to_ne_bytes());
        h.extend_from_slice(&2u16.to_ne_bytes());
        h.extend_from_slice(&4u16.to_ne_bytes());
        h.extend_from_slice(&0i32.to_ne_bytes()); // thiszone
        h.extend_from_slice(&0u32.to_ne_bytes()); // sigfigs
        h.extend_from_slice(&snaplen.to_ne_bytes());
        h.extend_from_slice(&LINKTYPE_ETHERNET.to_ne_bytes());
        out.write_all(&h)?;
        Ok(PcapWriter { out, snaplen })
    }

    /// Appends `frame`, captured at `ts` (since the Unix epoch): one 16-byte record header
    /// and the frame's first snap-length bytes, through `out` (no allocation of its own).
    pub fn write_frame(&mut self, ts: Duration, frame: &[u8]) -> io::Result<()> {
        let kept = frame.len().min(self.snaplen as usize);
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

/// A pcap file read whole ([`PcapFile::parse`]): classic libpcap format, microsecond
/// (0xa1b2c3d4) or nanosecond (0xa1b23c4d) timestamps, in either byte order, Ethernet link
/// type. (pcapng, what Wireshark saves by default, is not read: `tcpdump -r in.pcapng -w
/// out.pcap` converts it.)
#[derive(Debug, Clone)]
pub struct PcapFile<'a> {
    data: &'a [u8],
    records: Vec<Record>,
}

/// One record of a [`PcapFile`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record {
    /// Capture time since the Unix epoch.
    pub ts: Duration,
    /// The frame's length on the wire (`orig_len`); the bytes kept may be fewer.
    pub orig_len: u32,
    offset: usize,
    len: usize,
}

impl Record {
    /// Where the kept bytes lie in the file's data (what [`PcapFile::frame`] slices): for a
    /// caller that keeps the data and indexes the frames itself.
    pub fn range(&self) -> std::ops::Range<usize> {
        self.offset..self.offset + self.len
    }
}

/// The largest record a file may hold (`incl_len`): 256 KiB, libpcap's own maximum snap length.
pub const MAX_RECORD: u32 = 262_144;

impl<'a> PcapFile<'a> {
    /// Reads the header and indexes every record of `data` (a whole file). The error says what
    /// is wrong and at which byte: not a pcap file (the magic), a link type other than
    /// Ethernet, a record cut short or longer than [`MAX_RECORD`].
    pub fn parse(data: &'a [u8]) -> Result<PcapFile<'a>, String> {
        if data.len() < 24 {
            return Err(format!("{} bytes: shorter than a pcap file header (24)", data.len()));
        }
        let magic = [data[0], data[1], data[2], data[3]];
        let (le, nanos) = match magic {
            [0xd4, 0xc3, 0xb2, 0xa1] => (true, false),
            [0xa1, 0xb2, 0xc3, 0xd4] => (false, false),
            [0x4d, 0x3c, 0xb2, 0xa1] => (true, true),
            [0xa1, 0xb2, 0x3c, 0x4d] => (false, true),
            [0x0a, 0x0d, 0x0d, 0x0a] => {
                return Err("a pcapng file: convert it with `tcpdump -r IN -w OUT` (classic pcap)".into())
            }
            _ => return Err(format!("magic {magic:02x?} at byte 0: not a pcap file")),
        };
        let u32_at = |i: usize| {
            let b = [data[i], data[i + 1], data[i + 2], data[i + 3]];
            if le {
                u32::from_le_bytes(b)
            } else {
                u32::from_be_bytes(b)
            }
        };
        let link = u32_at(20) & 0x0fff_ffff; // the top bits carry the FCS length
        if link != LINKTYPE_ETHERNET {
            return Err(format!("link type {link} at byte 20: only Ethernet (1) frames can be replayed"));
        }
        let mut records = Vec::new();
        let mut at = 24;
        while at < data.len() {
            let n = records.len();
            if data.len() - at < 16 {
                return Err(format!("record {n} at byte {at}: header cut short ({} of 16 bytes)", data.len() - at));
            }
            let (secs, frac, incl, orig) = (u32_at(at), u32_at(at + 4), u32_at(at + 8), u32_at(at + 12));
            if incl > MAX_RECORD {
                return Err(format!(
                    "record {n} at byte {at}: {incl} bytes, more than a pcap record holds ({MAX_RECORD})"
                ));
            }
            let len = incl as usize;
            if data.len() - at - 16 < len {
                return Err(format!(
                    "record {n} at byte {at}: {len} bytes announced, {} left in the file",
                    data.len() - at - 16
                ));
            }
            let ns = if nanos { frac } else { frac.saturating_mul(1000) };
            let ts = Duration::new(u64::from(secs), 0) + Duration::from_nanos(u64::from(ns));
            records.push(Record { ts, orig_len: orig, offset: at + 16, len });
            at += 16 + len;
        }
        Ok(PcapFile { data, records })
    }

    /// The records, in file order.
    pub fn records(&self) -> &[Record] {
        &self.records
    }

    /// The bytes kept of record `r`.
    pub fn frame(&self, r: &Record) -> &'a [u8] {
        &self.data[r.range()]
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

    #[test]
    fn what_the_writer_writes_the_reader_reads_back() {
        let mut w = PcapWriter::new(Vec::new()).unwrap();
        w.write_frame(Duration::new(7, 5_000), &[1, 2, 3]).unwrap();
        w.write_frame(Duration::new(8, 0), &[4; 70]).unwrap();
        let v = w.into_inner().unwrap();
        let f = PcapFile::parse(&v).unwrap();
        let got: Vec<_> = f.records().iter().map(|r| (r.ts, r.orig_len, f.frame(r).to_vec())).collect();
        assert_eq!(got, [(Duration::new(7, 5_000), 3, vec![1, 2, 3]), (Duration::new(8, 0), 70, vec![4; 70])]);
    }

    #[test]
    fn big_endian_nanosecond_files_are_read() {
        let mut v = vec![0xa1, 0xb2, 0x3c, 0x4d, 0, 2, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0, 0, 0, 1];
        v.extend_from_slice(&[0, 0, 0, 9, 0, 0, 0, 7, 0, 0, 0, 2, 0, 0, 0, 2, 0xaa, 0xbb]);
        let f = PcapFile::parse(&v).unwrap();
        assert_eq!(f.records()[0].ts, Duration::new(9, 7));
        assert_eq!(f.frame(&f.records()[0]), [0xaa, 0xbb]);
    }

    #[test]
    fn damaged_files_are_refused_with_the_byte_that_is_wrong() {
        let mut w = PcapWriter::new(Vec::new()).unwrap();
        w.write_frame(Duration::ZERO, &[1; 10]).unwrap();
        let v = w.into_inner().unwrap();
        assert!(PcapFile::parse(&v[..10]).unwrap_err().contains("shorter than a pcap file header"));
        assert!(PcapFile::parse(&v[..30]).unwrap_err().contains("record 0 at byte 24: header cut short"));
        let e = PcapFile::parse(&v[..45]).unwrap_err();
        assert!(e.contains("record 0 at byte 24: 10 bytes announced, 5 left"), "{e}");
        let mut bad = v.clone();
        bad[0] = 0;
        assert!(PcapFile::parse(&bad).unwrap_err().contains("not a pcap file"));
        let mut bad = v.clone();
        bad[20] = 105; // 802.11
        assert!(PcapFile::parse(&bad).unwrap_err().contains("link type 105"));
        let mut bad = v;
        bad[32..36].copy_from_slice(&u32::MAX.to_ne_bytes());
        assert!(PcapFile::parse(&bad).unwrap_err().contains("more than a pcap record holds"));
    }
}

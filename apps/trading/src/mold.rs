//! MoldUDP64 downstream packets: a 20-byte header (session, 10 ASCII bytes; sequence number
//! of the first message, 8; message count, 2) and the messages, each behind its 2-byte
//! length. A count of 0 is a heartbeat, 0xFFFF the end of the session. Big endian.

use crate::wire::{u16_at, u64_at, Writer};

/// Header bytes.
pub const HEADER_LEN: usize = 20;
/// Message count of an end-of-session packet.
pub const END_OF_SESSION: u16 = 0xFFFF;

/// A packet's header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Session name.
    pub session: [u8; 10],
    /// Sequence number of the first message.
    pub seq: u64,
    /// Messages in the packet (0: heartbeat; [`END_OF_SESSION`]).
    pub count: u16,
}

impl Header {
    /// Reads the header of `b`.
    pub fn decode(b: &[u8]) -> Option<Header> {
        Some(Header { session: b.get(..10)?.try_into().ok()?, seq: u64_at(b, 10)?, count: u16_at(b, 18)? })
    }

    /// Writes the header at the start of `b` (at least [`HEADER_LEN`] bytes).
    pub fn encode(&self, b: &mut [u8]) -> Option<()> {
        let b = b.get_mut(..HEADER_LEN)?;
        Writer::new(b).bytes(&self.session).u64(self.seq).u16(self.count);
        Some(())
    }
}

/// A session name from `name`: at most 10 bytes, space padded.
pub fn session(name: &str) -> [u8; 10] {
    let mut s = [b' '; 10];
    for (d, c) in s.iter_mut().zip(name.bytes()) {
        *d = c;
    }
    s
}

/// Builds a packet in a buffer: header first (count patched at the end), then messages.
pub struct PacketWriter<'a> {
    b: &'a mut [u8],
    len: usize,
    count: u16,
}

impl<'a> PacketWriter<'a> {
    /// A packet of `session` whose first message has sequence number `seq`, in `b`; `None`
    /// if `b` cannot hold the header.
    pub fn new(b: &'a mut [u8], session: [u8; 10], seq: u64) -> Option<PacketWriter<'a>> {
        Header { session, seq, count: 0 }.encode(b)?;
        Some(PacketWriter { b, len: HEADER_LEN, count: 0 })
    }

    /// Appends one message written by `f` into at most `max` bytes (it returns the length it
    /// wrote); `false` if the packet has no room for `max` more bytes.
    pub fn push(&mut self, max: usize, f: impl FnOnce(&mut [u8]) -> Option<usize>) -> bool {
        let Some(room) = self.b.get_mut(self.len + 2..self.len + 2 + max) else { return false };
        let Some(n) = f(room) else { return false };
        self.b[self.len..self.len + 2].copy_from_slice(&(n as u16).to_be_bytes());
        self.len += 2 + n;
        self.count += 1;
        true
    }

    /// Messages so far.
    pub fn count(&self) -> u16 {
        self.count
    }

    /// Patches the count; returns the packet's length.
    pub fn finish(self) -> usize {
        self.b[18..20].copy_from_slice(&self.count.to_be_bytes());
        self.len
    }
}

/// The message blocks of a packet, in order. Stops (with [`Messages::truncated`] set) at a
/// length that runs past the packet.
pub struct Messages<'a> {
    b: &'a [u8],
    at: usize,
    left: u16,
    /// Whether a block ran past the end of the packet (a malformed packet).
    pub truncated: bool,
}

impl<'a> Messages<'a> {
    /// The messages of packet `b` whose header says `count`.
    pub fn new(b: &'a [u8], count: u16) -> Messages<'a> {
        let left = if count == END_OF_SESSION { 0 } else { count };
        Messages { b, at: HEADER_LEN, left, truncated: false }
    }
}

impl<'a> Iterator for Messages<'a> {
    type Item = &'a [u8];
    fn next(&mut self) -> Option<&'a [u8]> {
        if self.left == 0 {
            return None;
        }
        let len = u16_at(self.b, self.at).map(usize::from);
        match len.and_then(|n| self.b.get(self.at + 2..self.at + 2 + n)) {
            Some(m) => {
                self.at += 2 + m.len();
                self.left -= 1;
                Some(m)
            }
            None => {
                self.truncated = true;
                self.left = 0;
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_packet_round_trips() {
        let mut b = [0u8; 64];
        let mut w = PacketWriter::new(&mut b, session("SESSION01"), 42).unwrap();
        assert!(w.push(3, |m| {
            m.copy_from_slice(b"abc");
            Some(3)
        }));
        assert!(w.push(8, |m| {
            m[..1].copy_from_slice(b"d");
            Some(1)
        }));
        assert!(!w.push(64, |_| Some(0)), "no room for 64 more bytes");
        let len = w.finish();
        assert_eq!(len, 20 + 5 + 3);
        let h = Header::decode(&b[..len]).unwrap();
        assert_eq!((h.seq, h.count, &h.session), (42, 2, b"SESSION01 "));
        let msgs: Vec<&[u8]> = Messages::new(&b[..len], h.count).collect();
        assert_eq!(msgs, [&b"abc"[..], &b"d"[..]]);
    }

    #[test]
    fn a_block_past_the_end_is_truncation_not_a_read_past_it() {
        let mut b = [0u8; 24];
        Header { session: session("S"), seq: 1, count: 2 }.encode(&mut b).unwrap();
        b[20..22].copy_from_slice(&100u16.to_be_bytes());
        let mut it = Messages::new(&b, 2);
        assert_eq!(it.next(), None);
        assert!(it.truncated);
        assert_eq!(Header::decode(&b[..19]), None);
    }
}

//! The messages the trading stages pass to each other inside a worker (not on any wire):
//! a top-of-book change from the book stage to the strategy, and an order intent from the
//! strategy to the gateway. Both are 32 bytes, little endian, and both carry the ITCH
//! timestamp of the feed message that caused them, from which the gateway measures
//! tick-to-trade.

use crate::book::Top;
use crate::itch::Side;

/// Bytes of an event.
pub const EVENT_LEN: usize = 32;

fn get<const N: usize>(b: &[u8], off: usize) -> Option<[u8; N]> {
    b.get(off..off + N)?.try_into().ok()
}

/// A top-of-book change of one instrument.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TopChange {
    /// Instrument (stock locate).
    pub locate: u16,
    /// The new top (a missing side has price 0, shares 0).
    pub top: Top,
    /// ITCH timestamp of the message that changed it.
    pub itch_ts: u64,
}

impl TopChange {
    /// Writes the event into `b` (at least [`EVENT_LEN`] bytes).
    pub fn encode(&self, b: &mut [u8]) -> Option<()> {
        let b = b.get_mut(..EVENT_LEN)?;
        let (bp, bq) = self.top.bid.unwrap_or((0, 0));
        let (ap, aq) = self.top.ask.unwrap_or((0, 0));
        b[0..2].copy_from_slice(&self.locate.to_le_bytes());
        b[2..4].fill(0);
        b[4..8].copy_from_slice(&bp.to_le_bytes());
        b[8..12].copy_from_slice(&ap.to_le_bytes());
        b[12..16].copy_from_slice(&(bq.min(u64::from(u32::MAX)) as u32).to_le_bytes());
        b[16..20].copy_from_slice(&(aq.min(u64::from(u32::MAX)) as u32).to_le_bytes());
        b[20..24].fill(0);
        b[24..32].copy_from_slice(&self.itch_ts.to_le_bytes());
        Some(())
    }

    /// Reads an event.
    pub fn decode(b: &[u8]) -> Option<TopChange> {
        let side = |p: u32, q: u32| (q > 0).then_some((p, u64::from(q)));
        let bp = u32::from_le_bytes(get(b, 4)?);
        let ap = u32::from_le_bytes(get(b, 8)?);
        let bq = u32::from_le_bytes(get(b, 12)?);
        let aq = u32::from_le_bytes(get(b, 16)?);
        Some(TopChange {
            locate: u16::from_le_bytes(get(b, 0)?),
            top: Top { bid: side(bp, bq), ask: side(ap, aq) },
            itch_ts: u64::from_le_bytes(get(b, 24)?),
        })
    }
}

/// An order the strategy wants sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Intent {
    /// Instrument.
    pub locate: u16,
    /// Side.
    pub side: Side,
    /// Limit price.
    pub price: u32,
    /// Shares.
    pub shares: u32,
    /// ITCH timestamp of the feed message behind it.
    pub itch_ts: u64,
}

impl Intent {
    /// Writes the intent into `b` (at least [`EVENT_LEN`] bytes).
    pub fn encode(&self, b: &mut [u8]) -> Option<()> {
        let b = b.get_mut(..EVENT_LEN)?;
        b.fill(0);
        b[0..2].copy_from_slice(&self.locate.to_le_bytes());
        b[2] = self.side.byte();
        b[4..8].copy_from_slice(&self.price.to_le_bytes());
        b[8..12].copy_from_slice(&self.shares.to_le_bytes());
        b[24..32].copy_from_slice(&self.itch_ts.to_le_bytes());
        Some(())
    }

    /// Reads an intent.
    pub fn decode(b: &[u8]) -> Option<Intent> {
        Some(Intent {
            locate: u16::from_le_bytes(get(b, 0)?),
            side: Side::from_byte(*b.get(2)?)?,
            price: u32::from_le_bytes(get(b, 4)?),
            shares: u32::from_le_bytes(get(b, 8)?),
            itch_ts: u64::from_le_bytes(get(b, 24)?),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_round_trip() {
        let mut b = [0u8; 32];
        let t = TopChange { locate: 3, top: Top { bid: Some((100, 5)), ask: None }, itch_ts: 77 };
        t.encode(&mut b).unwrap();
        assert_eq!(TopChange::decode(&b), Some(t));
        let i = Intent { locate: 2, side: Side::Sell, price: 9, shares: 100, itch_ts: 1 };
        i.encode(&mut b).unwrap();
        assert_eq!(Intent::decode(&b), Some(i));
        assert_eq!(Intent::decode(&b[..31]), None);
    }
}

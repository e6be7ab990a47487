//! NASDAQ OUCH 4.2 order entry: the inbound Enter Order message and the outbound Accepted and
//! Executed messages, with their exact layouts (big endian, prices with 4 implied decimals).
//!
//! Enter Order (49 bytes): type `O` 0, order token 1 (14), side 15, shares 16 (4), stock
//! 20 (8), price 28 (4), time in force 32 (4), firm 36 (4), display 40, capacity 41,
//! intermarket sweep 42, minimum quantity 43 (4), cross type 47, customer type 48.
//! Outbound messages start with an 8-byte timestamp: Accepted (66 bytes): timestamp 0,
//! type `A` 8, token 9 (14), side 23, shares 24, stock 28, price 36, time in force 40, firm
//! 44, display 48, order reference number 49 (8), capacity 57, intermarket sweep 58, minimum
//! quantity 59, cross type 63, order state 64, BBO weight 65. Executed (40 bytes): timestamp
//! 0, type `E` 8, token 9, executed shares 23, execution price 27, liquidity flag 31, match
//! number 32 (8).

use crate::itch::Side;
use crate::wire::{u32_at, u64_at, Writer};

/// Enter Order length.
pub const ENTER_ORDER_LEN: usize = 49;
/// Accepted length.
pub const ACCEPTED_LEN: usize = 66;
/// Executed length.
pub const EXECUTED_LEN: usize = 40;

/// An order token: 14 alphanumeric bytes (here the gateway's order count in decimal digits).
pub type Token = [u8; 14];

/// The token of order number `n`: 14 decimal digits, zero padded (no formatting machinery:
/// this runs on the hot path).
pub fn token(mut n: u64) -> Token {
    let mut t = [b'0'; 14];
    for d in t.iter_mut().rev() {
        *d = b'0' + (n % 10) as u8;
        n /= 10;
    }
    t
}

/// An Enter Order message (immediate-or-cancel, agency, no minimum quantity).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EnterOrder {
    /// Client's token.
    pub token: Token,
    /// Side.
    pub side: Side,
    /// Shares.
    pub shares: u32,
    /// Symbol.
    pub stock: [u8; 8],
    /// Limit price.
    pub price: u32,
    /// Firm.
    pub firm: [u8; 4],
}

impl EnterOrder {
    /// Encodes at the start of `out`; `None` if shorter than [`ENTER_ORDER_LEN`].
    pub fn encode(&self, out: &mut [u8]) -> Option<usize> {
        let out = out.get_mut(..ENTER_ORDER_LEN)?;
        let mut w = Writer::new(out);
        w.u8(b'O').bytes(&self.token).u8(self.side.byte()).u32(self.shares).bytes(&self.stock).u32(self.price);
        // Time in force 0 (immediate or cancel), firm, display `Y`, capacity `A` (agency),
        // intermarket sweep `N`, minimum quantity 0, cross type `N`, customer type `R`.
        w.u32(0).bytes(&self.firm).u8(b'Y').u8(b'A').u8(b'N').u32(0).u8(b'N').u8(b'R');
        Some(ENTER_ORDER_LEN)
    }

    /// Decodes from `b`.
    pub fn decode(b: &[u8]) -> Option<EnterOrder> {
        let b = b.get(..ENTER_ORDER_LEN)?;
        if b[0] != b'O' {
            return None;
        }
        Some(EnterOrder {
            token: b[1..15].try_into().ok()?,
            side: Side::from_byte(b[15])?,
            shares: u32_at(b, 16)?,
            stock: b[20..28].try_into().ok()?,
            price: u32_at(b, 28)?,
            firm: b[36..40].try_into().ok()?,
        })
    }
}

/// Encodes the Accepted message for `o` (order state `L`, live) with the exchange's
/// `order_ref` and `timestamp`.
pub fn accepted(o: &EnterOrder, order_ref: u64, timestamp: u64, out: &mut [u8]) -> Option<usize> {
    let out = out.get_mut(..ACCEPTED_LEN)?;
    let mut w = Writer::new(out);
    w.u64(timestamp).u8(b'A').bytes(&o.token).u8(o.side.byte()).u32(o.shares).bytes(&o.stock).u32(o.price);
    w.u32(0).bytes(&o.firm).u8(b'Y').u64(order_ref).u8(b'A').u8(b'N').u32(0).u8(b'N').u8(b'L').u8(b' ');
    Some(ACCEPTED_LEN)
}

/// Encodes the Executed message for `shares` of `o` at `price`.
pub fn executed(
    o: &EnterOrder,
    shares: u32,
    price: u32,
    match_number: u64,
    timestamp: u64,
    out: &mut [u8],
) -> Option<usize> {
    let out = out.get_mut(..EXECUTED_LEN)?;
    Writer::new(out).u64(timestamp).u8(b'E').bytes(&o.token).u32(shares).u32(price).u8(b'R').u64(match_number);
    Some(EXECUTED_LEN)
}

/// An outbound message, as the gateway's session reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outbound {
    /// Accepted: the token and the exchange's order reference.
    Accepted {
        /// Token.
        token: Token,
        /// Exchange order reference.
        order_ref: u64,
        /// Shares accepted.
        shares: u32,
    },
    /// Executed: the token and the shares executed.
    Executed {
        /// Token.
        token: Token,
        /// Shares.
        shares: u32,
        /// Price.
        price: u32,
    },
}

impl Outbound {
    /// Decodes an Accepted or Executed message.
    pub fn decode(b: &[u8]) -> Option<Outbound> {
        match b.get(8)? {
            b'A' if b.len() >= ACCEPTED_LEN => Some(Outbound::Accepted {
                token: b[9..23].try_into().ok()?,
                order_ref: u64_at(b, 49)?,
                shares: u32_at(b, 24)?,
            }),
            b'E' if b.len() >= EXECUTED_LEN => Some(Outbound::Executed {
                token: b[9..23].try_into().ok()?,
                shares: u32_at(b, 23)?,
                price: u32_at(b, 27)?,
            }),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::itch::symbol;

    fn order() -> EnterOrder {
        EnterOrder {
            token: token(42),
            side: Side::Buy,
            shares: 300,
            stock: symbol("DP0001"),
            price: 1_000_100,
            firm: *b"DPLN",
        }
    }

    #[test]
    fn enter_order_round_trips_at_the_spec_offsets() {
        let o = order();
        let mut b = [0u8; 64];
        assert_eq!(o.encode(&mut b), Some(49));
        assert_eq!(&b[1..15], b"00000000000042");
        assert_eq!(b[15], b'B');
        assert_eq!(&b[16..20], &300u32.to_be_bytes());
        assert_eq!(&b[20..28], b"DP0001  ");
        assert_eq!(&b[36..40], b"DPLN");
        assert_eq!(EnterOrder::decode(&b[..49]), Some(o));
        assert_eq!(EnterOrder::decode(&b[..48]), None);
    }

    #[test]
    fn accepted_and_executed_decode() {
        let o = order();
        let mut b = [0u8; 80];
        assert_eq!(accepted(&o, 77, 5, &mut b), Some(66));
        assert_eq!(b[8], b'A');
        assert_eq!(Outbound::decode(&b[..66]), Some(Outbound::Accepted { token: o.token, order_ref: 77, shares: 300 }));
        assert_eq!(executed(&o, 100, 1_000_000, 3, 6, &mut b), Some(40));
        assert_eq!(
            Outbound::decode(&b[..40]),
            Some(Outbound::Executed { token: o.token, shares: 100, price: 1_000_000 })
        );
        assert_eq!(Outbound::decode(&b[..39]), None);
        assert_eq!(token(u64::MAX / 1000)[0], b'0' + ((u64::MAX / 1000) / 10u64.pow(13) % 10) as u8);
    }
}

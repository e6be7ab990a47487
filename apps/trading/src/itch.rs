//! NASDAQ TotalView-ITCH 5.0 messages: the seven this application uses, encoded and decoded
//! with their exact wire layouts (big endian; prices are integers with 4 implied decimals;
//! timestamps are nanoseconds, 6 bytes).
//!
//! Every message starts with the same 11 bytes: message type (1), stock locate (2), tracking
//! number (2), timestamp (6). Lengths: System Event 12, Add Order (no MPID) 36, Order
//! Executed 31, Order Cancel 23, Order Delete 19, Order Replace 35, Trade (non-cross) 44.

use crate::wire::{u16_at, u32_at, u48_at, u64_at, Writer};

/// Bytes of the common header.
pub const HEADER_LEN: usize = 11;
/// The longest message this module encodes (Trade).
pub const MAX_LEN: usize = 44;

/// Buy or sell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Side {
    /// `B`.
    Buy,
    /// `S`.
    Sell,
}

impl Side {
    /// The wire byte.
    pub fn byte(self) -> u8 {
        match self {
            Side::Buy => b'B',
            Side::Sell => b'S',
        }
    }

    /// From the wire byte.
    pub fn from_byte(b: u8) -> Option<Side> {
        match b {
            b'B' => Some(Side::Buy),
            b'S' => Some(Side::Sell),
            _ => None,
        }
    }
}

/// The fields of one ITCH message (header fields apart).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Body {
    /// `S` System Event: `O` start of messages, `S` start of system hours, `Q` start of
    /// market hours, `M` end of market hours, `E` end of system hours, `C` end of messages.
    SystemEvent {
        /// The event code.
        code: u8,
    },
    /// `A` Add Order, no MPID attribution.
    AddOrder {
        /// Order reference number, unique for the day.
        order_ref: u64,
        /// Side.
        side: Side,
        /// Shares.
        shares: u32,
        /// Symbol, space padded.
        stock: [u8; 8],
        /// Price (4 implied decimals).
        price: u32,
    },
    /// `E` Order Executed.
    OrderExecuted {
        /// The order.
        order_ref: u64,
        /// Shares executed.
        shares: u32,
        /// Match number.
        match_number: u64,
    },
    /// `X` Order Cancel (partial).
    OrderCancel {
        /// The order.
        order_ref: u64,
        /// Shares removed.
        shares: u32,
    },
    /// `D` Order Delete.
    OrderDelete {
        /// The order.
        order_ref: u64,
    },
    /// `U` Order Replace: the original order is gone, the new one takes its side.
    OrderReplace {
        /// The original order.
        original_ref: u64,
        /// The new order's reference.
        new_ref: u64,
        /// The new order's shares.
        shares: u32,
        /// The new order's price.
        price: u32,
    },
    /// `P` Trade (non-cross): an execution against a non-displayed order; no book change.
    Trade {
        /// Order reference (0 in practice for non-displayed orders).
        order_ref: u64,
        /// Side.
        side: Side,
        /// Shares.
        shares: u32,
        /// Symbol.
        stock: [u8; 8],
        /// Price.
        price: u32,
        /// Match number.
        match_number: u64,
    },
}

/// One ITCH message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Message {
    /// Stock locate: the instrument's index for the day (0 for system messages).
    pub locate: u16,
    /// Tracking number.
    pub tracking: u16,
    /// Nanoseconds (this application: since the pipeline's clock base, the feed's send time).
    pub timestamp: u64,
    /// Type-specific fields.
    pub body: Body,
}

/// Why a message could not be decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecodeError {
    /// Shorter than its type's length.
    Short,
    /// A type this module does not decode (counted and skipped by the handler).
    UnknownType(u8),
    /// A side byte other than `B`/`S`.
    BadSide,
}

impl Body {
    /// The message type byte.
    pub fn type_byte(&self) -> u8 {
        match self {
            Body::SystemEvent { .. } => b'S',
            Body::AddOrder { .. } => b'A',
            Body::OrderExecuted { .. } => b'E',
            Body::OrderCancel { .. } => b'X',
            Body::OrderDelete { .. } => b'D',
            Body::OrderReplace { .. } => b'U',
            Body::Trade { .. } => b'P',
        }
    }

    /// The encoded length of a message of this type.
    pub fn wire_len(&self) -> usize {
        wire_len(self.type_byte()).unwrap_or(0)
    }
}

/// The length of a message of type `t`, for the types this module knows.
pub fn wire_len(t: u8) -> Option<usize> {
    Some(match t {
        b'S' => 12,
        b'A' => 36,
        b'E' => 31,
        b'X' => 23,
        b'D' => 19,
        b'U' => 35,
        b'P' => 44,
        _ => return None,
    })
}

impl Message {
    /// Encodes into the start of `out`; returns the length, or `None` if `out` is too short.
    pub fn encode(&self, out: &mut [u8]) -> Option<usize> {
        let len = self.body.wire_len();
        let out = out.get_mut(..len)?;
        let mut w = Writer::new(out);
        w.u8(self.body.type_byte()).u16(self.locate).u16(self.tracking).u48(self.timestamp);
        match self.body {
            Body::SystemEvent { code } => w.u8(code),
            Body::AddOrder { order_ref, side, shares, stock, price } => {
                w.u64(order_ref).u8(side.byte()).u32(shares).bytes(&stock).u32(price)
            }
            Body::OrderExecuted { order_ref, shares, match_number } => w.u64(order_ref).u32(shares).u64(match_number),
            Body::OrderCancel { order_ref, shares } => w.u64(order_ref).u32(shares),
            Body::OrderDelete { order_ref } => w.u64(order_ref),
            Body::OrderReplace { original_ref, new_ref, shares, price } => {
                w.u64(original_ref).u64(new_ref).u32(shares).u32(price)
            }
            Body::Trade { order_ref, side, shares, stock, price, match_number } => {
                w.u64(order_ref).u8(side.byte()).u32(shares).bytes(&stock).u32(price).u64(match_number)
            }
        };
        debug_assert_eq!(w.len(), len);
        Some(len)
    }

    /// Decodes one message from the start of `b` (which may be longer).
    pub fn decode(b: &[u8]) -> Result<Message, DecodeError> {
        let t = *b.first().ok_or(DecodeError::Short)?;
        let len = wire_len(t).ok_or(DecodeError::UnknownType(t))?;
        let b = b.get(..len).ok_or(DecodeError::Short)?;
        // Every offset below is inside `len` bytes, checked once above; `?` cannot fail.
        let s = DecodeError::Short;
        let stock = |off: usize| -> Result<[u8; 8], DecodeError> { b[off..off + 8].try_into().map_err(|_| s) };
        let side = |off: usize| Side::from_byte(b[off]).ok_or(DecodeError::BadSide);
        let body = match t {
            b'S' => Body::SystemEvent { code: b[11] },
            b'A' => Body::AddOrder {
                order_ref: u64_at(b, 11).ok_or(s)?,
                side: side(19)?,
                shares: u32_at(b, 20).ok_or(s)?,
                stock: stock(24)?,
                price: u32_at(b, 32).ok_or(s)?,
            },
            b'E' => Body::OrderExecuted {
                order_ref: u64_at(b, 11).ok_or(s)?,
                shares: u32_at(b, 19).ok_or(s)?,
                match_number: u64_at(b, 23).ok_or(s)?,
            },
            b'X' => Body::OrderCancel { order_ref: u64_at(b, 11).ok_or(s)?, shares: u32_at(b, 19).ok_or(s)? },
            b'D' => Body::OrderDelete { order_ref: u64_at(b, 11).ok_or(s)? },
            b'U' => Body::OrderReplace {
                original_ref: u64_at(b, 11).ok_or(s)?,
                new_ref: u64_at(b, 19).ok_or(s)?,
                shares: u32_at(b, 27).ok_or(s)?,
                price: u32_at(b, 31).ok_or(s)?,
            },
            _ => Body::Trade {
                order_ref: u64_at(b, 11).ok_or(s)?,
                side: side(19)?,
                shares: u32_at(b, 20).ok_or(s)?,
                stock: stock(24)?,
                price: u32_at(b, 32).ok_or(s)?,
                match_number: u64_at(b, 36).ok_or(s)?,
            },
        };
        Ok(Message {
            locate: u16_at(b, 1).ok_or(s)?,
            tracking: u16_at(b, 3).ok_or(s)?,
            timestamp: u48_at(b, 5).ok_or(s)?,
            body,
        })
    }
}

/// An 8-byte, space-padded ITCH symbol from `name` (truncated to 8 bytes).
pub fn symbol(name: &str) -> [u8; 8] {
    let mut s = [b' '; 8];
    for (d, c) in s.iter_mut().zip(name.bytes()) {
        *d = c;
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all() -> Vec<Body> {
        let stock = symbol("DP0001");
        vec![
            Body::SystemEvent { code: b'O' },
            Body::AddOrder { order_ref: 1, side: Side::Buy, shares: 100, stock, price: 1_000_100 },
            Body::OrderExecuted { order_ref: 1, shares: 40, match_number: 9 },
            Body::OrderCancel { order_ref: 1, shares: 10 },
            Body::OrderDelete { order_ref: 1 },
            Body::OrderReplace { original_ref: 1, new_ref: 2, shares: 300, price: 999_900 },
            Body::Trade { order_ref: 0, side: Side::Sell, shares: 5, stock, price: 1_000_000, match_number: 10 },
        ]
    }

    #[test]
    fn every_type_round_trips_at_its_spec_length() {
        let lens = [12, 36, 31, 23, 19, 35, 44];
        for (body, len) in all().into_iter().zip(lens) {
            let m = Message { locate: 3, tracking: 7, timestamp: 0x1234_5678_9abc, body };
            let mut b = [0u8; MAX_LEN];
            assert_eq!(m.encode(&mut b), Some(len));
            assert_eq!(Message::decode(&b[..len]), Ok(m));
            // One byte short of the spec length is refused, never read past.
            assert_eq!(Message::decode(&b[..len - 1]), Err(DecodeError::Short));
        }
    }

    #[test]
    fn add_order_matches_the_spec_offsets() {
        let m = Message {
            locate: 0x0102,
            tracking: 0,
            timestamp: 5,
            body: Body::AddOrder {
                order_ref: 0x0a,
                side: Side::Sell,
                shares: 0x64,
                stock: symbol("AAPL"),
                price: 0x00f4_2400,
            },
        };
        let mut b = [0u8; 36];
        m.encode(&mut b).unwrap();
        assert_eq!(b[0], b'A');
        assert_eq!(&b[1..3], &[1, 2]);
        assert_eq!(&b[5..11], &[0, 0, 0, 0, 0, 5]);
        assert_eq!(b[18], 0x0a);
        assert_eq!(b[19], b'S');
        assert_eq!(&b[24..32], b"AAPL    ");
        assert_eq!(&b[32..36], &[0, 0xf4, 0x24, 0]);
    }

    #[test]
    fn unknown_types_and_sides_are_errors() {
        assert_eq!(Message::decode(&[b'Z'; 40]), Err(DecodeError::UnknownType(b'Z')));
        assert_eq!(Message::decode(&[]), Err(DecodeError::Short));
        let mut b = [0u8; 36];
        Message {
            locate: 1,
            tracking: 0,
            timestamp: 0,
            body: Body::AddOrder { order_ref: 1, side: Side::Buy, shares: 1, stock: symbol("X"), price: 1 },
        }
        .encode(&mut b)
        .unwrap();
        b[19] = b'?';
        assert_eq!(Message::decode(&b), Err(DecodeError::BadSide));
    }
}

//! Price-level order books for every instrument of a feed, rebuilt from ITCH order messages.
//!
//! Sized once, at construction, for the price band and the number of live orders the feed
//! can have: applying a message never allocates (orders live in a `HashMap` created with
//! its final capacity; levels are arrays indexed by price tick). A message naming an unknown
//! order (after a gap) or a price outside the band is counted and skipped, so the book stays
//! consistent with what it has seen.

use crate::itch::{Body, Message, Side};
use std::collections::HashMap;

/// The price band of every instrument: `levels` ticks of `tick` from `min_price`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Band {
    /// Lowest price (4 implied decimals).
    pub min_price: u32,
    /// Price step.
    pub tick: u32,
    /// Number of price levels.
    pub levels: u32,
}

impl Band {
    /// The level index of `price`, if it is on the band's grid.
    #[inline]
    pub fn index(&self, price: u32) -> Option<usize> {
        let off = price.checked_sub(self.min_price)?;
        (off % self.tick == 0 && off / self.tick < self.levels).then_some((off / self.tick) as usize)
    }

    /// The price of level `i`.
    #[inline]
    pub fn price(&self, i: usize) -> u32 {
        self.min_price + i as u32 * self.tick
    }
}

/// Best bid and offer of one instrument: (price, shares) per side, `None` for an empty side.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Top {
    /// Best bid.
    pub bid: Option<(u32, u64)>,
    /// Best offer.
    pub ask: Option<(u32, u64)>,
}

#[derive(Debug, Clone, Copy)]
struct Order {
    locate: u16,
    side: Side,
    level: u32,
    shares: u32,
}

/// One side's levels: shares per level, and the best level (highest bid, lowest ask).
struct Ladder {
    qty: Vec<u64>,
    best: Option<usize>,
}

impl Ladder {
    fn new(levels: usize) -> Ladder {
        Ladder { qty: vec![0; levels], best: None }
    }

    fn add(&mut self, i: usize, n: u64, bid: bool) {
        self.qty[i] += n;
        let better = match self.best {
            None => true,
            Some(b) => (bid && i > b) || (!bid && i < b),
        };
        if better {
            self.best = Some(i);
        }
    }

    fn remove(&mut self, i: usize, n: u64, bid: bool) {
        self.qty[i] = self.qty[i].saturating_sub(n);
        if self.qty[i] == 0 && self.best == Some(i) {
            // The best level emptied: the next one is further from the spread.
            self.best = if bid {
                self.qty[..i].iter().rposition(|&q| q > 0)
            } else {
                self.qty[i + 1..].iter().position(|&q| q > 0).map(|p| p + i + 1)
            };
        }
    }
}

/// Counters of what [`Books::apply`] skipped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Skipped {
    /// Messages naming an order the book does not have (or adding one it already has).
    pub unknown_order: u64,
    /// Orders priced off the band's grid, or an instrument past the configured count.
    pub off_band: u64,
    /// Order table full (more live orders than configured).
    pub full: u64,
}

/// The books of instruments `1..=instruments` (ITCH stock locates).
pub struct Books {
    band: Band,
    orders: HashMap<u64, Order>,
    max_orders: usize,
    /// Per instrument: bids then asks.
    sides: Vec<(Ladder, Ladder)>,
    /// What was skipped.
    pub skipped: Skipped,
}

impl Books {
    /// Books for `instruments` instruments on `band`, holding up to `max_orders` live orders.
    pub fn new(instruments: u16, band: Band, max_orders: usize) -> Books {
        let sides =
            (0..instruments).map(|_| (Ladder::new(band.levels as usize), Ladder::new(band.levels as usize))).collect();
        Books { band, orders: HashMap::with_capacity(max_orders), max_orders, sides, skipped: Skipped::default() }
    }

    /// Live orders.
    pub fn orders(&self) -> usize {
        self.orders.len()
    }

    /// The top of instrument `locate`'s book.
    pub fn top(&self, locate: u16) -> Top {
        let Some((bids, asks)) = self.sides.get((locate as usize).wrapping_sub(1)) else { return Top::default() };
        let at = |l: &Ladder| l.best.map(|i| (self.band.price(i), l.qty[i]));
        Top { bid: at(bids), ask: at(asks) }
    }

    fn ladder(&mut self, locate: u16, side: Side) -> Option<&mut Ladder> {
        let (b, a) = self.sides.get_mut((locate as usize).wrapping_sub(1))?;
        Some(if side == Side::Buy { b } else { a })
    }

    fn take(&mut self, order_ref: u64, shares: Option<u32>) {
        let Some(o) = self.orders.get_mut(&order_ref) else {
            self.skipped.unknown_order += 1;
            return;
        };
        let n = shares.map_or(o.shares, |s| s.min(o.shares));
        o.shares -= n;
        let (locate, side, level, gone) = (o.locate, o.side, o.level as usize, o.shares == 0);
        if gone {
            self.orders.remove(&order_ref);
        }
        if let Some(l) = self.ladder(locate, side) {
            l.remove(level, u64::from(n), side == Side::Buy);
        }
    }

    fn add(&mut self, order_ref: u64, locate: u16, side: Side, shares: u32, price: u32) {
        let Some(level) = self.band.index(price).filter(|_| (1..=self.sides.len()).contains(&(locate as usize))) else {
            self.skipped.off_band += 1;
            return;
        };
        if self.orders.contains_key(&order_ref) {
            self.skipped.unknown_order += 1;
            return;
        }
        if self.orders.len() >= self.max_orders {
            self.skipped.full += 1;
            return;
        }
        self.orders.insert(order_ref, Order { locate, side, level: level as u32, shares });
        if let Some(l) = self.ladder(locate, side) {
            l.add(level, u64::from(shares), side == Side::Buy);
        }
    }

    /// Applies one message; returns the instrument whose book it changed, if any.
    pub fn apply(&mut self, m: &Message) -> Option<u16> {
        match m.body {
            Body::AddOrder { order_ref, side, shares, price, .. } => {
                self.add(order_ref, m.locate, side, shares, price);
            }
            Body::OrderExecuted { order_ref, shares, .. } | Body::OrderCancel { order_ref, shares } => {
                self.take(order_ref, Some(shares));
            }
            Body::OrderDelete { order_ref } => self.take(order_ref, None),
            Body::OrderReplace { original_ref, new_ref, shares, price } => {
                let Some(&o) = self.orders.get(&original_ref) else {
                    self.skipped.unknown_order += 1;
                    return None;
                };
                self.take(original_ref, None);
                self.add(new_ref, o.locate, o.side, shares, price);
            }
            Body::SystemEvent { .. } | Body::Trade { .. } => return None,
        }
        Some(m.locate)
    }

    /// A digest of every book: FNV-1a over (instrument, side, price, shares) of each non-empty
    /// level in price order, then the number of live orders. Equal books give equal digests.
    pub fn digest(&self) -> u64 {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        let mut eat = |v: u64| {
            for b in v.to_le_bytes() {
                h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
            }
        };
        for (i, (bids, asks)) in self.sides.iter().enumerate() {
            for (s, l) in [(0u64, bids), (1, asks)] {
                for (lvl, &q) in l.qty.iter().enumerate().filter(|(_, &q)| q > 0) {
                    eat(i as u64);
                    eat(s);
                    eat(u64::from(self.band.price(lvl)));
                    eat(q);
                }
            }
        }
        eat(self.orders.len() as u64);
        h
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::itch::symbol;

    const BAND: Band = Band { min_price: 900_000, tick: 100, levels: 2001 };

    fn msg(locate: u16, body: Body) -> Message {
        Message { locate, tracking: 0, timestamp: 0, body }
    }

    fn add(r: u64, side: Side, shares: u32, price: u32) -> Message {
        msg(1, Body::AddOrder { order_ref: r, side, shares, stock: symbol("X"), price })
    }

    #[test]
    fn levels_and_best_prices_follow_the_orders() {
        let mut b = Books::new(2, BAND, 16);
        b.apply(&add(1, Side::Buy, 100, 1_000_000));
        b.apply(&add(2, Side::Buy, 50, 1_000_100));
        b.apply(&add(3, Side::Sell, 70, 1_000_300));
        assert_eq!(b.top(1), Top { bid: Some((1_000_100, 50)), ask: Some((1_000_300, 70)) });
        // Partial execution, then the best bid is deleted: the next level shows.
        b.apply(&msg(1, Body::OrderExecuted { order_ref: 2, shares: 20, match_number: 1 }));
        assert_eq!(b.top(1).bid, Some((1_000_100, 30)));
        b.apply(&msg(1, Body::OrderDelete { order_ref: 2 }));
        assert_eq!(b.top(1).bid, Some((1_000_000, 100)));
        // Replace moves the order (same side) to a new price and size.
        b.apply(&msg(1, Body::OrderReplace { original_ref: 3, new_ref: 4, shares: 10, price: 1_000_200 }));
        assert_eq!(b.top(1).ask, Some((1_000_200, 10)));
        // Cancel all of it: the side is empty.
        b.apply(&msg(1, Body::OrderCancel { order_ref: 4, shares: 10 }));
        assert_eq!(b.top(1).ask, None);
        assert_eq!(b.orders(), 1);
        assert_eq!(b.top(2), Top::default());
        assert_eq!(b.skipped, Skipped::default());
    }

    #[test]
    fn unknown_orders_and_off_band_prices_are_counted_and_skipped() {
        let mut b = Books::new(1, BAND, 2);
        b.apply(&msg(1, Body::OrderDelete { order_ref: 9 }));
        b.apply(&add(1, Side::Buy, 1, 1_000_050)); // off the tick grid
        b.apply(&msg(2, Body::AddOrder { order_ref: 2, side: Side::Buy, shares: 1, stock: [0; 8], price: 1_000_000 }));
        b.apply(&add(3, Side::Buy, 1, 1_000_000));
        b.apply(&add(4, Side::Buy, 1, 1_000_000));
        b.apply(&add(5, Side::Buy, 1, 1_000_000)); // table full (2)
        assert_eq!(b.skipped, Skipped { unknown_order: 1, off_band: 2, full: 1 });
        assert_eq!(b.top(1).bid, Some((1_000_000, 2)));
    }

    #[test]
    fn the_digest_sees_every_level() {
        let (mut a, mut b) = (Books::new(1, BAND, 8), Books::new(1, BAND, 8));
        a.apply(&add(1, Side::Buy, 100, 1_000_000));
        b.apply(&add(1, Side::Buy, 100, 1_000_000));
        assert_eq!(a.digest(), b.digest());
        b.apply(&msg(1, Body::OrderCancel { order_ref: 1, shares: 1 }));
        assert_ne!(a.digest(), b.digest());
    }
}

//! A seeded order-flow model: the ITCH messages of a day on `instruments` stocks, the same for
//! the same seed and parameters (so a book rebuilt offline can be compared with the one the
//! pipeline built).
//!
//! Each instrument has a fixed mid price in the band's middle; new orders rest 1-8 ticks
//! behind it on their side (so the book never crosses, and its top moves as levels fill and
//! empty); live orders are executed, partly cancelled, deleted or
//! replaced at random; now and then a non-displayed trade prints. The first message is a
//! System Event `O` (start of messages). Allocation happens only at construction.

use crate::book::Band;
use crate::itch::{Body, Message, Side};

/// The symbol of instrument `locate`: `DP` and four digits (`DP0001`), space padded.
pub fn symbol_of(locate: u16) -> [u8; 8] {
    let mut s = *b"DP0000  ";
    let mut n = locate % 10_000;
    for d in s[2..6].iter_mut().rev() {
        *d = b'0' + (n % 10) as u8;
        n /= 10;
    }
    s
}

/// splitmix64: small, fast, and good enough for a traffic model.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }
}

/// The model's parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SimParams {
    /// Seed.
    pub seed: u64,
    /// Instruments (stock locates 1..=instruments).
    pub instruments: u16,
    /// Price band of every instrument.
    pub band: Band,
    /// Live orders the model keeps at most (it deletes instead of adding beyond).
    pub max_live: usize,
}

#[derive(Debug, Clone, Copy)]
struct Live {
    order_ref: u64,
    locate: u16,
    side: Side,
    shares: u32,
}

/// The generator.
pub struct Sim {
    p: SimParams,
    rng: Rng,
    /// Per instrument: mid level index.
    mids: Vec<u32>,
    live: Vec<Live>,
    next_ref: u64,
    next_match: u64,
    started: bool,
}

impl Sim {
    /// A model with these parameters.
    pub fn new(p: SimParams) -> Sim {
        let n = p.instruments.max(1);
        Sim {
            rng: Rng::new(p.seed),
            // Instruments spread over the band's middle half, a few ticks apart.
            mids: (0..u32::from(n)).map(|i| p.band.levels / 4 + (i * 7) % (p.band.levels / 2).max(1)).collect(),
            live: Vec::with_capacity(p.max_live),
            next_ref: 1,
            next_match: 1,
            started: false,
            p: SimParams { instruments: n, ..p },
        }
    }

    /// The symbol of instrument `locate`.
    pub fn symbol(&self, locate: u16) -> [u8; 8] {
        symbol_of(locate)
    }

    fn price(&mut self, locate: u16, side: Side) -> u32 {
        let mid = self.mids[locate as usize - 1];
        let off = 1 + self.rng.below(8) as u32;
        let lvl = match side {
            Side::Buy => mid.saturating_sub(off),
            Side::Sell => (mid + off).min(self.p.band.levels - 1),
        };
        self.p.band.price(lvl as usize)
    }

    /// The next message, stamped `timestamp`.
    pub fn next(&mut self, timestamp: u64) -> Message {
        let mut m = Message { locate: 0, tracking: 0, timestamp, body: Body::SystemEvent { code: b'O' } };
        if !self.started {
            self.started = true;
            return m;
        }
        let r = self.rng.below(100);
        let want_add = self.live.len() < 16 || (r < 45 && self.live.len() < self.p.max_live);
        if want_add {
            let locate = 1 + self.rng.below(u64::from(self.p.instruments)) as u16;
            let side = if self.rng.below(2) == 0 { Side::Buy } else { Side::Sell };
            let shares = 100 * (1 + self.rng.below(10) as u32);
            let price = self.price(locate, side);
            let order_ref = self.next_ref;
            self.next_ref += 1;
            self.live.push(Live { order_ref, locate, side, shares });
            m.locate = locate;
            m.body = Body::AddOrder { order_ref, side, shares, stock: self.symbol(locate), price };
            return m;
        }
        let k = self.rng.below(self.live.len() as u64) as usize;
        let o = self.live[k];
        m.locate = o.locate;
        let what = self.rng.below(100);
        m.body = if what < 25 {
            // Execute part or all of it.
            let shares = 1 + self.rng.below(u64::from(o.shares)) as u32;
            self.next_match += 1;
            if shares == o.shares {
                self.live.swap_remove(k);
            } else {
                self.live[k].shares -= shares;
            }
            Body::OrderExecuted { order_ref: o.order_ref, shares, match_number: self.next_match }
        } else if what < 45 && o.shares > 1 {
            let shares = 1 + self.rng.below(u64::from(o.shares - 1)) as u32;
            self.live[k].shares -= shares;
            Body::OrderCancel { order_ref: o.order_ref, shares }
        } else if what < 75 {
            self.live.swap_remove(k);
            Body::OrderDelete { order_ref: o.order_ref }
        } else if what < 92 {
            let new_ref = self.next_ref;
            self.next_ref += 1;
            let shares = 100 * (1 + self.rng.below(10) as u32);
            let price = self.price(o.locate, o.side);
            self.live[k] = Live { order_ref: new_ref, shares, ..o };
            Body::OrderReplace { original_ref: o.order_ref, new_ref, shares, price }
        } else {
            self.next_match += 1;
            let price = self.price(o.locate, o.side);
            Body::Trade {
                order_ref: 0,
                side: o.side,
                shares: 100,
                stock: self.symbol(o.locate),
                price,
                match_number: self.next_match,
            }
        };
        m
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::book::Books;

    fn params(seed: u64) -> SimParams {
        SimParams { seed, instruments: 4, band: Band { min_price: 900_000, tick: 100, levels: 2001 }, max_live: 4096 }
    }

    #[test]
    fn the_same_seed_gives_the_same_day() {
        let (mut a, mut b, mut c) = (Sim::new(params(1)), Sim::new(params(1)), Sim::new(params(2)));
        let (va, vb, vc): (Vec<_>, Vec<_>, Vec<_>) =
            (0..1000).map(|t| (a.next(t), b.next(t), c.next(t))).fold((vec![], vec![], vec![]), |mut v, x| {
                v.0.push(x.0);
                v.1.push(x.1);
                v.2.push(x.2);
                v
            });
        assert_eq!(va, vb);
        assert_ne!(va, vc);
        assert_eq!(va[0].body, Body::SystemEvent { code: b'O' });
        assert_eq!(&symbol_of(12), b"DP0012  ");
    }

    #[test]
    fn its_messages_are_consistent_with_a_book() {
        // Every execute/cancel/delete/replace names a live order, every price is on the band.
        let p = params(7);
        let mut sim = Sim::new(p);
        let mut books = Books::new(p.instruments, p.band, p.max_live);
        let mut kinds = [0u32; 256];
        for t in 0..200_000 {
            let m = sim.next(t);
            kinds[m.body.type_byte() as usize] += 1;
            books.apply(&m);
        }
        assert_eq!(books.skipped, Default::default());
        for t in [b'A', b'E', b'X', b'D', b'U', b'P', b'S'] {
            assert!(kinds[t as usize] > 0, "no {} message", t as char);
        }
        assert!(books.orders() > 16 && books.orders() <= p.max_live);
    }
}

//! `strategy`: turns top-of-book changes into orders. The rule is deliberately simple: when an
//! instrument's spread is at most `max_spread_ticks` and one side shows at least
//! `imbalance_pct` percent of the other's shares, take the thin side (buy at the offer when bids dominate,
//! sell at the bid when offers do), `order_shares` at a time, at most once per `cooldown_us`
//! per instrument. The change event's buffer becomes the order intent (no copy).

use super::StrategyParams;
use crate::events::{Intent, TopChange};
use crate::itch::Side;
use dataplane::pipeline::{Handler, Msg, StageCx, StageReport};

/// The strategy stage.
pub struct Strategy {
    p: StrategyParams,
    /// Per instrument: when it last sent an order (pipeline clock, ns).
    last_order_ns: Vec<u64>,
    orders: u64,
}

impl Strategy {
    /// A strategy with these parameters.
    pub fn new(p: StrategyParams) -> Strategy {
        Strategy { last_order_ns: vec![0; usize::from(p.instruments) + 1], p, orders: 0 }
    }

    /// The order `c` calls for, if any (`now`: pipeline clock).
    pub fn decide(&mut self, c: &TopChange, now: u64) -> Option<Intent> {
        let ((bp, bq), (ap, aq)) = (c.top.bid?, c.top.ask?);
        if ap <= bp || (ap - bp) > self.p.max_spread_ticks.saturating_mul(self.p.tick) {
            return None;
        }
        let last = self.last_order_ns.get_mut(usize::from(c.locate))?;
        if *last != 0 && now.saturating_sub(*last) < self.p.cooldown_us * 1000 {
            return None;
        }
        let k = u64::from(self.p.imbalance_pct);
        let (side, price) = if bq * 100 >= k * aq {
            (Side::Buy, ap)
        } else if aq * 100 >= k * bq {
            (Side::Sell, bp)
        } else {
            return None;
        };
        *last = now.max(1);
        self.orders += 1;
        Some(Intent { locate: c.locate, side, price, shares: self.p.order_shares, itch_ts: c.itch_ts })
    }
}

impl Handler for Strategy {
    fn on_message(&mut self, mut msg: Msg, cx: &mut StageCx<'_>) {
        let Some(change) = TopChange::decode(cx.bytes(&msg)) else {
            cx.drop_msg(msg);
            return;
        };
        match self.decide(&change, cx.now_ns()) {
            Some(intent) => {
                let _ = intent.encode(cx.bytes_mut(&mut msg));
                cx.send(0, msg);
            }
            None => cx.drop_msg(msg),
        }
    }

    fn report(&self) -> StageReport {
        StageReport { values: vec![("orders", self.orders)], ..Default::default() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::book::Top;

    fn params() -> StrategyParams {
        StrategyParams {
            instruments: 2,
            imbalance_pct: 300,
            max_spread_ticks: 2,
            tick: 100,
            order_shares: 100,
            cooldown_us: 10,
        }
    }

    fn change(bid: (u32, u64), ask: (u32, u64)) -> TopChange {
        TopChange { locate: 1, top: Top { bid: Some(bid), ask: Some(ask) }, itch_ts: 5 }
    }

    #[test]
    fn takes_the_thin_side_of_a_tight_imbalanced_book() {
        let mut s = Strategy::new(params());
        let i = s.decide(&change((1_000_000, 900), (1_000_100, 300)), 1_000).unwrap();
        assert_eq!((i.side, i.price, i.shares, i.itch_ts), (Side::Buy, 1_000_100, 100, 5));
        // Cooldown: 10 us.
        assert_eq!(s.decide(&change((1_000_000, 900), (1_000_100, 300)), 5_000), None);
        let i = s.decide(&change((1_000_000, 100), (1_000_100, 300)), 12_000).unwrap();
        assert_eq!((i.side, i.price), (Side::Sell, 1_000_000));
    }

    #[test]
    fn leaves_wide_balanced_or_one_sided_books_alone() {
        let mut s = Strategy::new(params());
        assert_eq!(s.decide(&change((1_000_000, 900), (1_000_300, 100)), 1), None, "3 ticks wide");
        assert_eq!(s.decide(&change((1_000_000, 200), (1_000_100, 300)), 1), None, "balanced");
        let one_sided = TopChange { locate: 1, top: Top { bid: Some((1, 1)), ask: None }, itch_ts: 0 };
        assert_eq!(s.decide(&one_sided, 1), None);
    }
}

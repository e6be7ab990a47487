//! The trading stages, their parameters (each stage's `params` table) and the registry that
//! adds them to the `dataplane` command line.
//!
//! | kind | shape | what |
//! |---|---|---|
//! | `itch-feed` | source | the exchange's ITCH 5.0 feed in MoldUDP64 packets |
//! | `itch-book` | input, 1 output | feed handler: gaps, ITCH decoding, order books |
//! | `strategy` | input, 1 output | top-of-book changes to order intents |
//! | `ouch-gateway` | input, 1 output | OUCH 4.2 Enter Order; tick-to-trade |
//! | `exchange-sim` | input, 1 output | answers Accepted / Executed |
//! | `order-acks` | input | counts the answers |

mod book;
mod exchange;
mod feed;
mod gateway;
mod strategy;

pub use book::BookStage;
pub use exchange::{Exchange, OrderAcks};
pub use feed::Feed;
pub use gateway::Gateway;
pub use strategy::Strategy;

use crate::book::Band;
use dataplane_apps::stages::{Registry, RegistryError};
use dataplane_config::KindShape;
use serde::Deserialize;
use std::num::{NonZeroU16, NonZeroU64};

/// The price band, shared by the feed and its handlers (they must agree).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BandParams {
    /// Lowest price, with 4 implied decimals. Default: 900000 ($90.00).
    #[serde(default = "d::min_price")]
    pub min_price: u32,
    /// Price step. Default: 100 ($0.01).
    #[serde(default = "d::tick")]
    pub tick: NonZeroU64,
    /// Price levels. Default: 2001 (up to $110.00).
    #[serde(default = "d::levels")]
    pub levels: NonZeroU16,
}

impl Default for BandParams {
    fn default() -> Self {
        BandParams { min_price: d::min_price(), tick: d::tick(), levels: d::levels() }
    }
}

/// The [`Band`] these parameters describe.
pub fn band(p: &BandParams) -> Band {
    Band {
        min_price: p.min_price,
        tick: p.tick.get().min(u64::from(u32::MAX)) as u32,
        levels: u32::from(p.levels.get()),
    }
}

/// `itch-feed` parameters.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FeedParams {
    /// Seed of the order-flow model. Default: 1.
    #[serde(default = "d::seed")]
    pub seed: u64,
    /// Instruments (stock locates 1..=N), at most 1000. Default: 8.
    #[serde(default = "d::instruments")]
    pub instruments: u16,
    /// ITCH messages per second; 0 = as fast as the queues allow. Default: 100000.
    #[serde(default = "d::rate")]
    pub rate: u64,
    /// Stop after this many ITCH messages; 0 = never. Default: 0.
    #[serde(default)]
    pub messages: u64,
    /// ITCH messages per MoldUDP64 packet, 1-32. Default: 4.
    #[serde(default = "d::per_packet")]
    pub per_packet: u16,
    /// Skip every N-th packet (a gap for the subscribers); 0 = none. Default: 0.
    #[serde(default)]
    pub drop_one_in: u64,
    /// MoldUDP64 session, at most 10 characters. Default: "DPDEMO0001".
    #[serde(default = "d::session")]
    pub session: String,
    /// Live orders the model keeps at most. Default: 65536.
    #[serde(default = "d::max_orders")]
    pub max_live: usize,
    /// Price band.
    #[serde(default)]
    pub band: BandParams,
}

/// `itch-book` parameters.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BookParams {
    /// Instruments, as the feed's. Default: 8.
    #[serde(default = "d::instruments")]
    pub instruments: u16,
    /// The session to accept (packets of others are counted and dropped). Default: "DPDEMO0001".
    #[serde(default = "d::session")]
    pub session: String,
    /// Live orders the books hold (sized once). Default: 65536.
    #[serde(default = "d::max_orders")]
    pub max_orders: usize,
    /// Price band, as the feed's.
    #[serde(default)]
    pub band: BandParams,
}

/// `strategy` parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StrategyParams {
    /// Instruments, as the feed's. Default: 8.
    #[serde(default = "d::instruments")]
    pub instruments: u16,
    /// One side must show at least this percentage of the other's shares (more than 100).
    /// Default: 300.
    #[serde(default = "d::imbalance")]
    pub imbalance_pct: u32,
    /// Widest spread traded, in ticks. Default: 2.
    #[serde(default = "d::max_spread")]
    pub max_spread_ticks: u32,
    /// Price step, as the band's. Default: 100.
    #[serde(default = "d::tick_u32")]
    pub tick: u32,
    /// Shares per order. Default: 100.
    #[serde(default = "d::order_shares")]
    pub order_shares: u32,
    /// Least time between two orders on one instrument, in microseconds. Default: 100.
    #[serde(default = "d::cooldown")]
    pub cooldown_us: u64,
}

/// `ouch-gateway` parameters.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GatewayParams {
    /// Firm identifier, at most 4 characters. Default: "DPLN".
    #[serde(default = "d::firm")]
    pub firm: String,
}

/// `exchange-sim` parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExchangeParams {
    /// Fill one order in this many (all its shares, at its price). Default: 2.
    #[serde(default = "d::fill_one_in")]
    pub fill_one_in: NonZeroU64,
}

/// `order-acks` takes no parameters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NoParams {}

mod d {
    use std::num::{NonZeroU16, NonZeroU64};
    pub fn min_price() -> u32 {
        900_000
    }
    pub fn tick() -> NonZeroU64 {
        NonZeroU64::new(100).unwrap_or(NonZeroU64::MIN)
    }
    pub fn tick_u32() -> u32 {
        100
    }
    pub fn levels() -> NonZeroU16 {
        NonZeroU16::new(2001).unwrap_or(NonZeroU16::MIN)
    }
    pub fn seed() -> u64 {
        1
    }
    pub fn instruments() -> u16 {
        8
    }
    pub fn rate() -> u64 {
        100_000
    }
    pub fn per_packet() -> u16 {
        4
    }
    pub fn session() -> String {
        "DPDEMO0001".into()
    }
    pub fn max_orders() -> usize {
        65_536
    }
    pub fn imbalance() -> u32 {
        300
    }
    pub fn max_spread() -> u32 {
        2
    }
    pub fn order_shares() -> u32 {
        100
    }
    pub fn cooldown() -> u64 {
        100
    }
    pub fn firm() -> String {
        "DPLN".into()
    }
    pub fn fill_one_in() -> NonZeroU64 {
        NonZeroU64::new(2).unwrap_or(NonZeroU64::MIN)
    }
}

fn check_instruments(n: u16) -> Result<(), String> {
    if (1..=1000).contains(&n) {
        Ok(())
    } else {
        Err(format!("instruments = {n}: use 1 to 1000"))
    }
}

fn check_session(s: &str) -> Result<(), String> {
    if s.len() <= 10 && s.bytes().all(|b| b.is_ascii_graphic() || b == b' ') {
        Ok(())
    } else {
        Err(format!("session \"{}\": at most 10 printable ASCII characters", s.escape_debug()))
    }
}

/// A registry with the built-in kinds and the six trading kinds.
pub fn registry() -> Result<Registry, RegistryError> {
    let mut r = Registry::new();
    r.register(
        "itch-feed",
        KindShape::source(),
        "ITCH 5.0 feed in MoldUDP64 packets (seeded order flow)",
        |p: FeedParams, spec| {
            check_instruments(p.instruments)?;
            check_session(&p.session)?;
            if !(1..=32).contains(&p.per_packet) {
                return Err(format!("per_packet = {}: use 1 to 32", p.per_packet));
            }
            if p.max_live == 0 {
                return Err("max_live = 0: the model needs room for live orders".into());
            }
            let need = Feed::max_packet(p.per_packet);
            let pool = spec.config.pool(spec.worker.pool.as_str()).map_or(0, |p| p.buffer_size.bytes() as usize);
            if need > pool {
                return Err(format!(
                    "a packet of {} messages takes {need} bytes; the pool's buffers hold {pool}",
                    p.per_packet
                ));
            }
            Ok(Box::new(Feed::new(p, *spec.worker.poll_burst as usize)))
        },
    )?;
    r.register(
        "itch-book",
        KindShape::filter(),
        "feed handler: MoldUDP64 gaps, ITCH decoding, order books",
        |p: BookParams, _| {
            check_instruments(p.instruments)?;
            check_session(&p.session)?;
            if p.max_orders == 0 {
                return Err("max_orders = 0: the books need room for live orders".into());
            }
            Ok(Box::new(BookStage::new(&p)))
        },
    )?;
    r.register("strategy", KindShape::filter(), "top-of-book imbalance to order intents", |p: StrategyParams, _| {
        check_instruments(p.instruments)?;
        if p.imbalance_pct <= 100 {
            return Err(format!(
                "imbalance_pct = {}: more than 100 (one side must outweigh the other)",
                p.imbalance_pct
            ));
        }
        if p.tick == 0 || p.order_shares == 0 {
            return Err("tick and order_shares must be at least 1".into());
        }
        Ok(Box::new(Strategy::new(p)))
    })?;
    r.register(
        "ouch-gateway",
        KindShape::filter(),
        "OUCH 4.2 Enter Order; records tick-to-trade",
        |p: GatewayParams, _| {
            if p.firm.is_empty() || p.firm.len() > 4 || !p.firm.bytes().all(|b| b.is_ascii_alphanumeric()) {
                return Err(format!("firm \"{}\": 1 to 4 letters or digits", p.firm.escape_debug()));
            }
            Ok(Box::new(Gateway::new(&p)?))
        },
    )?;
    r.register(
        "exchange-sim",
        KindShape::filter(),
        "answers OUCH orders with Accepted / Executed",
        |p: ExchangeParams, _| Ok(Box::new(Exchange::new(&p))),
    )?;
    r.register("order-acks", KindShape::sink(), "counts OUCH Accepted / Executed answers", |_: NoParams, _| {
        Ok(Box::new(OrderAcks::default()))
    })?;
    Ok(r)
}

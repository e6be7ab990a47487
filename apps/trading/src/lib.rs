//! # dataplane-trading
//!
//! A trading reference application built on `dataplane`'s user stages: an exchange's
//! NASDAQ TotalView-ITCH 5.0 feed in MoldUDP64 packets, a feed handler that detects gaps and
//! keeps price-level order books, a strategy, an OUCH 4.2 order gateway and an exchange
//! simulator, wired by a TOML pipeline (`config/examples/trading/trading.toml`).
//!
//! The protocol modules ([`itch`], [`mold`], [`ouch`]) encode and decode the exact wire
//! layouts with bounds checks; [`book`] and [`sim`] are plain data structures usable
//! offline (the tests rebuild the books from the same seeded stream and compare digests);
//! [`stages`] holds the handlers and [`stages::registry`].

#![warn(missing_docs)]

pub mod book;
pub mod events;
pub mod itch;
pub mod mold;
pub mod ouch;
pub mod sim;
pub mod stages;
mod wire;

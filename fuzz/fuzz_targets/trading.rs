//! The trading app's wire decoders and the book stage's handling of decoded ITCH messages.
#![no_main]

use dataplane_trading::book::{Band, Books};
use dataplane_trading::{events, itch, mold, ouch};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = ouch::EnterOrder::decode(data);
    let _ = ouch::Outbound::decode(data);
    let _ = events::TopChange::decode(data);
    let _ = events::Intent::decode(data);
    let _ = itch::Message::decode(data);

    // As a MoldUDP64 packet: each message through the book, as the book stage does. A small
    // band and order cap so that the limits (full book, off-grid price) are reached.
    let Some(h) = mold::Header::decode(data) else { return };
    let mut books = Books::new(4, Band { min_price: 10_000, tick: 100, levels: 64 }, 32);
    let mut msgs = mold::Messages::new(data, h.count);
    for m in msgs.by_ref() {
        if let Ok(msg) = itch::Message::decode(m) {
            if let Some(locate) = books.apply(&msg) {
                let _ = books.top(locate);
            }
        }
    }
    let _ = msgs.truncated;
});

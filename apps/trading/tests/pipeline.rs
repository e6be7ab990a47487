//! The trading pipeline end to end on `shm`: the books the feed handler built equal the books
//! rebuilt offline from the same seeded ITCH stream, gaps are counted exactly when the feed
//! drops packets, orders flow to the exchange and back, and no buffer leaks.

use dataplane_apps::runner::{self, RunOptions, RunReport};
use dataplane_config::Config;
use dataplane_trading::book::Books;
use dataplane_trading::sim::{Sim, SimParams};
use dataplane_trading::stages::{self, band, BandParams};
use std::sync::atomic::AtomicBool;
use std::time::Duration;

const MESSAGES: u64 = 150_000;

fn example() -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../config/examples/trading/trading.toml")).unwrap()
}

/// The example with a message limit, a seed, and `extra` feed parameters; market data over
/// RC (`reliable`: back-pressure instead of loss, so the books must match exactly) or UD.
fn pipeline(extra: &str, reliable: bool) -> String {
    let text = example();
    let feed_params = "[stages.params]\nseed = 7\n";
    assert!(text.contains(feed_params));
    // Unpinned test threads share two cores with whatever else runs: workers back off when
    // idle, so that the busy one gets the core (market data is UD: a subscriber that does not
    // run loses packets, which this test would see as gaps).
    text.replace(feed_params, &format!("[stages.params]\nseed = 7\nmessages = {MESSAGES}\n{extra}"))
        .replace("rate = 200_000", "rate = 100_000")
        .replace("core = 0\n", "core = 0\nidle = \"backoff\"\n")
        .replace("core = 1\n", "core = 1\nidle = \"backoff\"\n")
        .replace("transport = \"ud\"", if reliable { "transport = \"rc\"" } else { "transport = \"ud\"" })
        // Over RC the feed has one subscriber, connected: the multicast group becomes a pair.
        .replace("peer = \"ff0e::1:1\"", if reliable { "peer = \"md-sub\"" } else { "peer = \"ff0e::1:1\"" })
        .replace("mcast = \"ff0e::1:1\"", if reliable { "peer = \"md-pub\"" } else { "mcast = \"ff0e::1:1\"" })
}

/// A second subscriber on the trader's worker: its own QP joined to the feed's group and its
/// own book, whose output is discarded.
const SECOND_SUBSCRIBER: &str = r#"
[[qps]]
name = "md-sub2"
worker = "trader"
transport = "ud"
mcast = "ff0e::1:1"

[[stages]]
name = "book2"
worker = "trader"
kind = "itch-book"
input = "md-sub2"
output = "drop2"
params = { instruments = 8, max_orders = 16384 }

[[stages]]
name = "drop2"
worker = "trader"
kind = "sink"
input = "book2"
"#;

fn run(text: &str, tag: &str) -> RunReport {
    let reg = stages::registry().unwrap();
    let dir = std::env::temp_dir().join(format!("dp-trading-{}-{tag}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("trading.toml");
    std::fs::write(&path, text).unwrap();
    let cfg: Config = reg.load(&path).unwrap_or_else(|e| panic!("{e}"));
    let opts = RunOptions {
        // 150 000 messages at 100 000/s, then the drain.
        duration: Some(Duration::from_millis(2500)),
        fabric: Some(format!("trading-test-{}-{tag}", std::process::id())),
        no_pin: true,
        no_stats: true,
        doorbell_batch: None,
    };
    let r = runner::run(&cfg, &reg, &opts, &AtomicBool::new(false)).unwrap();
    let _ = std::fs::remove_dir_all(dir);
    r
}

fn value(r: &RunReport, stage: &str, key: &str) -> u64 {
    let s = r.workers.iter().flat_map(|w| &w.stages).find(|s| s.name == stage).unwrap();
    s.report.values.iter().find(|(k, _)| *k == key).unwrap_or_else(|| panic!("{stage} has no {key}")).1
}

fn gaps(r: &RunReport, stage: &str) -> u64 {
    r.workers.iter().flat_map(|w| &w.stages).find(|s| s.name == stage).unwrap().report.gaps
}

/// The books after `MESSAGES` messages of the model, built without any pipeline.
fn offline_digest() -> u64 {
    let p = SimParams { seed: 7, instruments: 8, band: band(&BandParams::default()), max_live: 2048 };
    let mut sim = Sim::new(p);
    let mut books = Books::new(8, p.band, 16_384);
    for _ in 0..MESSAGES {
        books.apply(&sim.next(0));
    }
    books.digest()
}

/// One test, three runs in turn: two pipelines at once would put four busy threads on the
/// two cores.
#[test]
fn books_equal_the_offline_rebuild_and_gaps_are_counted_exactly() {
    books_equal_the_offline_rebuild();
    dropped_sequence_numbers_are_counted_exactly();
    over_ud_every_message_is_applied_or_counted_missing();
    two_subscribers_of_the_group_each_get_the_whole_feed();
}

/// Multicast: the feed sends each packet once, to group ff0e::1:1; both subscriber QPs joined
/// it and each gets its own copy. Each book accounts for every message (applied or a gap), and
/// a book that missed nothing equals the offline rebuild.
fn two_subscribers_of_the_group_each_get_the_whole_feed() {
    let r = run(&(pipeline("", false) + SECOND_SUBSCRIBER), "mcast2");
    assert_eq!(r.pools.iter().map(|p| p.leaked).sum::<usize>(), 0);
    let sent = r.workers.iter().flat_map(|w| &w.qps).find(|q| q.name == "md-pub").unwrap().tx_msgs;
    for (book, qp) in [("book", "md-sub"), ("book2", "md-sub2")] {
        let (applied, missing) = (value(&r, book, "itch_applied"), gaps(&r, book));
        assert!(applied + missing <= MESSAGES && applied > MESSAGES / 2, "{book}: applied {applied} + gaps {missing}");
        let got = r.workers.iter().flat_map(|w| &w.qps).find(|q| q.name == qp).unwrap().rx_msgs;
        assert!(got > sent / 2 && got <= sent, "{qp} received {got} of {sent} packets");
        if missing == 0 && applied == MESSAGES {
            assert_eq!(value(&r, book, "book_digest"), offline_digest(), "{book}");
        }
    }
}

fn books_equal_the_offline_rebuild() {
    let r = run(&pipeline("", true), "digest");
    assert!(r.drained, "drain incomplete: {}", dataplane_apps::report::text(&r));
    assert_eq!(r.pools.iter().map(|p| p.leaked).sum::<usize>(), 0, "leaked buffers");
    assert_eq!(value(&r, "feed", "itch_messages"), MESSAGES);
    assert_eq!(gaps(&r, "book"), 0);
    assert_eq!(value(&r, "book", "itch_applied"), MESSAGES);
    assert_eq!(value(&r, "book", "unknown_orders"), 0);
    assert_eq!(value(&r, "book", "book_digest"), offline_digest());
    // Orders went out, were all accepted, and one in two was filled.
    let sent = value(&r, "gateway", "orders_sent");
    assert!(sent > 0, "the strategy sent no order");
    assert_eq!(value(&r, "acks", "accepted"), sent);
    assert_eq!(value(&r, "acks", "executed"), sent / 2);
    let lat = r.workers.iter().flat_map(|w| &w.stages).find(|s| s.name == "gateway").unwrap();
    assert_eq!(lat.report.latency.as_ref().map(|h| h.len()), Some(sent), "one tick-to-trade sample per order");
}

fn dropped_sequence_numbers_are_counted_exactly() {
    let r = run(&pipeline("drop_one_in = 10\n", true), "gaps");
    assert!(r.drained, "drain incomplete: {}", dataplane_apps::report::text(&r));
    assert_eq!(r.pools.iter().map(|p| p.leaked).sum::<usize>(), 0);
    let dropped = value(&r, "feed", "dropped_messages");
    assert!(dropped > 0 && value(&r, "feed", "dropped_packets") > 0);
    // Every message the feed numbered but did not send is a gap, including a trailing one
    // (the closing heartbeat carries the next sequence number); nothing else is.
    assert_eq!(gaps(&r, "book"), dropped);
    assert_eq!(value(&r, "book", "itch_applied"), MESSAGES - dropped);
}

/// Market data over UD, as in the example: a subscriber that falls behind loses packets
/// (no receive posted), and the handler must account for every message either way.
fn over_ud_every_message_is_applied_or_counted_missing() {
    let r = run(&pipeline("", false), "ud");
    assert!(r.drained, "UD is not waited for; RC orders drain: {}", dataplane_apps::report::text(&r));
    assert_eq!(r.pools.iter().map(|p| p.leaked).sum::<usize>(), 0);
    let (applied, missing) = (value(&r, "book", "itch_applied"), gaps(&r, "book"));
    // A loss at the very end (the closing heartbeat with it) is the only one nobody can see.
    assert!(applied + missing <= MESSAGES && applied > 0, "applied {applied} + gaps {missing} vs {MESSAGES}");
    if missing == 0 && applied == MESSAGES {
        assert_eq!(value(&r, "book", "book_digest"), offline_digest());
    }
}

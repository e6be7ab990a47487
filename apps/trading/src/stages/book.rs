//! `itch-book`: a feed handler. Takes MoldUDP64 packets from its input (a UD QP joined to the
//! feed), counts gaps and duplicates from their sequence numbers (live, in `dpctl`'s gaps and
//! dups columns), decodes the ITCH messages it has not seen, applies them to the price-level
//! books of every instrument, and sends a top-of-book change event to its output for each
//! message that moved an instrument's best bid or offer.

use super::{band, BookParams};
use crate::book::{Books, Top};
use crate::events::{TopChange, EVENT_LEN};
use crate::itch::Message;
use crate::mold::{self, Header, Messages};
use dataplane::pipeline::{Handler, Msg, StageCx, StageReport};

/// Message blocks located per round.
const SPANS: usize = 64;

/// The book stage.
pub struct BookStage {
    books: Books,
    session: [u8; 10],
    /// Next sequence number expected.
    expected: u64,
    last_top: Vec<Top>,
    gaps: u64,
    duplicates: u64,
    applied: u64,
    malformed: u64,
    unknown_types: u64,
    foreign_session: u64,
    events: u64,
    events_lost: u64,
    end_of_session: bool,
}

impl BookStage {
    /// A handler for the feed described by `p`.
    pub fn new(p: &BookParams) -> BookStage {
        BookStage {
            books: Books::new(p.instruments, band(&p.band), p.max_orders),
            session: mold::session(&p.session),
            expected: 1,
            last_top: vec![Top::default(); usize::from(p.instruments) + 1],
            gaps: 0,
            duplicates: 0,
            applied: 0,
            malformed: 0,
            unknown_types: 0,
            foreign_session: 0,
            events: 0,
            events_lost: 0,
            end_of_session: false,
        }
    }

    /// The books (tests compare their digest with an offline rebuild).
    pub fn books(&self) -> &Books {
        &self.books
    }

    fn on_itch(&mut self, b: &[u8], cx: &mut StageCx<'_>) {
        let m = match Message::decode(b) {
            Ok(m) => m,
            Err(crate::itch::DecodeError::UnknownType(_)) => {
                self.unknown_types += 1;
                return;
            }
            Err(_) => {
                self.malformed += 1;
                return;
            }
        };
        self.applied += 1;
        let Some(locate) = self.books.apply(&m) else { return };
        let top = self.books.top(locate);
        let Some(last) = self.last_top.get_mut(usize::from(locate)) else { return };
        if *last == top {
            return;
        }
        *last = top;
        let Some(mut ev) = cx.alloc(EVENT_LEN) else {
            self.events_lost += 1;
            return;
        };
        let _ = TopChange { locate, top, itch_ts: m.timestamp }.encode(cx.bytes_mut(&mut ev));
        self.events += 1;
        cx.send(0, ev);
    }
}

impl Handler for BookStage {
    fn on_message(&mut self, msg: Msg, cx: &mut StageCx<'_>) {
        let len = msg.len();
        let Some(h) = Header::decode(cx.bytes(&msg)) else {
            self.malformed += 1;
            cx.drop_msg(msg);
            return;
        };
        if h.session != self.session {
            self.foreign_session += 1;
            cx.drop_msg(msg);
            return;
        }
        if h.count == mold::END_OF_SESSION {
            self.end_of_session = true;
        }
        if h.seq > self.expected {
            let missing = h.seq - self.expected;
            self.gaps += missing;
            cx.stats().gaps.add(missing);
            self.expected = h.seq;
        }
        // Messages before `expected` were seen already: skip them, count them.
        let skip = self.expected.saturating_sub(h.seq);
        // Where each block is, found with a short borrow of the packet, so that applying a
        // message can use `cx` (to send events); rounds of SPANS blocks, one for any packet
        // this feed sends.
        let mut spans = [(0usize, 0usize); SPANS];
        let mut done = 0usize;
        let truncated = loop {
            let (found, cut) = {
                let bytes = cx.bytes(&msg);
                let base = bytes.as_ptr() as usize;
                let mut it = Messages::new(&bytes[..len], h.count);
                it.by_ref().take(done).for_each(drop);
                let mut found = 0;
                for (slot, m) in spans.iter_mut().zip(&mut it) {
                    *slot = (m.as_ptr() as usize - base, m.len());
                    found += 1;
                }
                (found, it.truncated)
            };
            for &(off, n) in &spans[..found] {
                if (done as u64) < skip {
                    self.duplicates += 1;
                    cx.stats().duplicates.add(1);
                } else {
                    let mut buf = [0u8; 64];
                    let n = n.min(buf.len());
                    buf[..n].copy_from_slice(&cx.bytes(&msg)[off..off + n]);
                    self.on_itch(&buf[..n], cx);
                    self.expected += 1;
                }
                done += 1;
            }
            if found < SPANS {
                // The blocks ended: normally, or at one that runs past the packet.
                break cut;
            }
        };
        if truncated {
            self.malformed += 1;
        }
        cx.drop_msg(msg);
    }

    fn report(&self) -> StageReport {
        StageReport {
            gaps: self.gaps,
            duplicates: self.duplicates,
            values: vec![
                ("book_digest", self.books.digest()),
                ("live_orders", self.books.orders() as u64),
                ("itch_applied", self.applied),
                ("top_changes", self.events),
                ("top_changes_lost", self.events_lost),
                ("unknown_orders", self.books.skipped.unknown_order),
                ("off_band", self.books.skipped.off_band),
                ("book_full", self.books.skipped.full),
                ("malformed", self.malformed),
                ("unknown_types", self.unknown_types),
                ("foreign_session", self.foreign_session),
            ],
            latency: None,
        }
    }
}

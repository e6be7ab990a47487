//! `itch-feed`: the exchange's market-data publisher. A source stage: the seeded order-flow
//! model's ITCH messages, `per_packet` to a MoldUDP64 packet, at `rate` messages per second,
//! each stamped with its send time (nanoseconds of the pipeline clock, the ITCH timestamp).
//! `drop_one_in = N` skips every N-th packet after numbering it (a gap the subscribers must
//! count). After `messages`, one heartbeat carries the next sequence number, so a gap at the
//! very end is seen too, and the stage stops.

use super::{band, FeedParams};
use crate::itch;
use crate::mold::{self, PacketWriter};
use crate::sim::{Sim, SimParams};
use dataplane::pipeline::{Handler, Msg, StageCx, StageReport};

/// The feed stage.
pub struct Feed {
    sim: Sim,
    session: [u8; 10],
    p: FeedParams,
    /// Next MoldUDP64 sequence number (1-based).
    seq: u64,
    /// Packets numbered so far (sent or dropped on purpose).
    packets: u64,
    /// Packets skipped on purpose, and their messages.
    dropped_packets: u64,
    dropped_msgs: u64,
    start_ns: Option<u64>,
    done: bool,
    burst: usize,
}

impl Feed {
    /// A feed with these parameters, at most `burst` packets per loop.
    pub fn new(p: FeedParams, burst: usize) -> Feed {
        let sim =
            Sim::new(SimParams { seed: p.seed, instruments: p.instruments, band: band(&p.band), max_live: p.max_live });
        Feed {
            sim,
            session: mold::session(&p.session),
            p,
            seq: 1,
            packets: 0,
            dropped_packets: 0,
            dropped_msgs: 0,
            start_ns: None,
            done: false,
            burst: burst.max(1),
        }
    }

    /// Bytes of a full packet.
    pub fn max_packet(per_packet: u16) -> usize {
        mold::HEADER_LEN + usize::from(per_packet) * (2 + itch::MAX_LEN)
    }

    fn sent_msgs(&self) -> u64 {
        self.seq - 1
    }

    /// One packet of `n` messages (or a heartbeat for `n == 0`), sent or dropped.
    fn packet(&mut self, n: u64, now: u64, cx: &mut StageCx<'_>) -> bool {
        let Some(mut m) = cx.alloc(Self::max_packet(self.p.per_packet)) else { return false };
        let seq = self.seq;
        let b = cx.bytes_mut(&mut m);
        let Some(mut w) = PacketWriter::new(b, self.session, seq) else {
            cx.drop_msg(m);
            return false;
        };
        for _ in 0..n {
            let msg = self.sim.next(now);
            if !w.push(itch::MAX_LEN, |out| msg.encode(out)) {
                break;
            }
        }
        let count = u64::from(w.count());
        let len = w.finish();
        cx.set_len(&mut m, len);
        self.seq += count;
        self.packets += 1;
        let drop_it = count > 0 && self.p.drop_one_in != 0 && self.packets % self.p.drop_one_in == 0;
        cx.stats().msgs_in.add(count);
        cx.stats().bytes_in.add(len as u64);
        if drop_it {
            self.dropped_packets += 1;
            self.dropped_msgs += count;
            cx.drop_msg(m);
        } else {
            cx.send(0, m);
        }
        true
    }
}

impl Handler for Feed {
    fn on_message(&mut self, msg: Msg, cx: &mut StageCx<'_>) {
        cx.drop_msg(msg);
    }

    fn is_source(&self) -> bool {
        true
    }

    fn poll(&mut self, cx: &mut StageCx<'_>) -> usize {
        if cx.stopping() || self.done {
            return 0;
        }
        let now = cx.now_ns();
        let start = *self.start_ns.get_or_insert(now);
        let per = u64::from(self.p.per_packet);
        // Messages due by now (the rate counts ITCH messages, not packets).
        let mut due = if self.p.rate == 0 {
            u64::MAX
        } else {
            ((now - start) as u128 * self.p.rate as u128 / 1_000_000_000) as u64 + per
        };
        if self.p.messages != 0 {
            due = due.min(self.p.messages);
        }
        let mut made = 0;
        let room = cx.room().min(self.burst);
        while made < room && self.sent_msgs() < due {
            let n = (due - self.sent_msgs()).min(per);
            if !self.packet(n, now, cx) {
                break;
            }
            made += 1;
        }
        if self.p.messages != 0 && self.sent_msgs() >= self.p.messages && made < room && self.packet(0, now, cx) {
            // The closing heartbeat: it carries the next sequence number.
            self.done = true;
            made += 1;
        }
        made
    }

    fn report(&self) -> StageReport {
        StageReport {
            values: vec![
                ("itch_messages", self.sent_msgs()),
                ("packets", self.packets),
                ("dropped_packets", self.dropped_packets),
                ("dropped_messages", self.dropped_msgs),
            ],
            ..Default::default()
        }
    }
}

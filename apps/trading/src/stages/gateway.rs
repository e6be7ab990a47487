//! `ouch-gateway`: encodes each order intent as an OUCH 4.2 Enter Order message, in the
//! intent's own buffer, and sends it to its output (an RC QP to the exchange). Tick-to-trade
//! is measured here, at the post: the pipeline clock now minus the ITCH timestamp of the feed
//! message behind the order (the feed stamps its send time), into the stage's live latency
//! histogram (dpctl) and a `LogLinearHistogram` (HdrHistogram's buckets, recorded in a few
//! instructions) for the summary.

use super::GatewayParams;
use crate::events::Intent;
use crate::ouch::{self, EnterOrder};
use crate::sim::symbol_of;
use dataplane::pipeline::{Handler, LogLinearHistogram, Msg, StageCx, StageReport};

/// The gateway stage.
pub struct Gateway {
    firm: [u8; 4],
    next_token: u64,
    hist: LogLinearHistogram,
    malformed: u64,
}

impl Gateway {
    /// A gateway with these parameters.
    pub fn new(p: &GatewayParams) -> Result<Gateway, String> {
        let mut firm = [b' '; 4];
        for (d, c) in firm.iter_mut().zip(p.firm.bytes()) {
            *d = c;
        }
        let hist = LogLinearHistogram::new(60_000_000_000);
        Ok(Gateway { firm, next_token: 1, hist, malformed: 0 })
    }
}

impl Handler for Gateway {
    fn on_message(&mut self, mut msg: Msg, cx: &mut StageCx<'_>) {
        let Some(i) = Intent::decode(cx.bytes(&msg)) else {
            self.malformed += 1;
            cx.drop_msg(msg);
            return;
        };
        let order = EnterOrder {
            token: ouch::token(self.next_token),
            side: i.side,
            shares: i.shares,
            stock: symbol_of(i.locate),
            price: i.price,
            firm: self.firm,
        };
        if !cx.set_len(&mut msg, ouch::ENTER_ORDER_LEN) || order.encode(cx.bytes_mut(&mut msg)).is_none() {
            self.malformed += 1;
            cx.drop_msg(msg);
            return;
        }
        self.next_token += 1;
        let t2t = cx.now_ns().saturating_sub(i.itch_ts).max(1);
        // Clamped to the histogram's bound: recording never allocates.
        self.hist.record(t2t);
        cx.record_latency(t2t);
        cx.send(0, msg);
    }

    fn records_latency(&self) -> bool {
        true
    }

    fn report(&self) -> StageReport {
        StageReport {
            latency: Some(self.hist.to_hdr()),
            values: vec![("orders_sent", self.next_token - 1), ("malformed", self.malformed)],
            ..Default::default()
        }
    }
}

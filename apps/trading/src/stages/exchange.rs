//! The other side of the order session. `exchange-sim` answers every OUCH Enter Order it
//! receives with Accepted (in the order's own buffer) and, for one order in `fill_one_in`,
//! an Executed for all its shares at its price. `order-acks` (the gateway's session
//! receiver) reads those answers and counts them.

use super::ExchangeParams;
use crate::ouch::{self, EnterOrder, Outbound};
use dataplane::pipeline::{Handler, Msg, StageCx, StageReport};

/// The exchange simulator stage.
pub struct Exchange {
    fill_one_in: u64,
    orders: u64,
    fills: u64,
    malformed: u64,
    next_match: u64,
}

impl Exchange {
    /// An exchange with these parameters.
    pub fn new(p: &ExchangeParams) -> Exchange {
        Exchange { fill_one_in: p.fill_one_in.get(), orders: 0, fills: 0, malformed: 0, next_match: 1 }
    }
}

impl Handler for Exchange {
    fn on_message(&mut self, mut msg: Msg, cx: &mut StageCx<'_>) {
        let Some(o) = EnterOrder::decode(cx.bytes(&msg)) else {
            self.malformed += 1;
            cx.drop_msg(msg);
            return;
        };
        self.orders += 1;
        let now = cx.now_ns();
        if !cx.set_len(&mut msg, ouch::ACCEPTED_LEN) {
            self.malformed += 1;
            cx.drop_msg(msg);
            return;
        }
        let _ = ouch::accepted(&o, self.orders, now, cx.bytes_mut(&mut msg));
        cx.send(0, msg);
        if self.orders % self.fill_one_in == 0 {
            if let Some(mut e) = cx.alloc(ouch::EXECUTED_LEN) {
                let _ = ouch::executed(&o, o.shares, o.price, self.next_match, now, cx.bytes_mut(&mut e));
                self.next_match += 1;
                self.fills += 1;
                cx.send(0, e);
            }
        }
    }

    fn report(&self) -> StageReport {
        StageReport {
            values: vec![("orders", self.orders), ("fills", self.fills), ("malformed", self.malformed)],
            ..Default::default()
        }
    }
}

/// The order-session receiver: counts Accepted and Executed messages.
#[derive(Default)]
pub struct OrderAcks {
    accepted: u64,
    executed: u64,
    executed_shares: u64,
    malformed: u64,
}

impl Handler for OrderAcks {
    fn on_message(&mut self, msg: Msg, cx: &mut StageCx<'_>) {
        match Outbound::decode(cx.bytes(&msg)) {
            Some(Outbound::Accepted { .. }) => self.accepted += 1,
            Some(Outbound::Executed { shares, .. }) => {
                self.executed += 1;
                self.executed_shares += u64::from(shares);
            }
            None => self.malformed += 1,
        }
        cx.drop_msg(msg);
    }

    fn report(&self) -> StageReport {
        StageReport {
            values: vec![
                ("accepted", self.accepted),
                ("executed", self.executed),
                ("executed_shares", self.executed_shares),
                ("malformed", self.malformed),
            ],
            ..Default::default()
        }
    }
}

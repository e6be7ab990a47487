//! Forwarding stages: `mac-swap` (the reflector of forwarding benchmarks, testpmd's
//! `macswap`) and `ipv4-router` (longest-prefix match with [`dataplane::net::route`]).

use dataplane::net::route::{forward, parse_mac, parse_prefix, Drop, Route, Table};
use dataplane::pipeline::{Handler, Msg, StageCx, StageReport};
use serde::Deserialize;

/// `ipv4-router` parameters.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RouterParams {
    pub(super) routes: Vec<RouteParams>,
}

/// One route of `ipv4-router`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RouteParams {
    /// `a.b.c.d/len`.
    prefix: String,
    /// Index into the stage's outputs.
    output: usize,
    /// Destination MAC of forwarded frames.
    next_hop_mac: String,
    /// Source MAC of forwarded frames (the router's on that output).
    src_mac: String,
}

impl RouterParams {
    /// The router these parameters describe, for a stage with `outputs` outputs; the error
    /// names the route and field that is wrong.
    pub(super) fn build(&self, outputs: usize) -> Result<Ipv4Router, String> {
        let mut routes = Vec::with_capacity(self.routes.len());
        for (i, r) in self.routes.iter().enumerate() {
            let (prefix, len) = parse_prefix(&r.prefix).map_err(|e| format!("routes[{i}].prefix: {e}"))?;
            if r.output >= outputs {
                return Err(format!(
                    "routes[{i}].output = {}: the stage has {outputs} outputs (0..={})",
                    r.output,
                    outputs.saturating_sub(1)
                ));
            }
            let next_hop_mac = parse_mac(&r.next_hop_mac).map_err(|e| format!("routes[{i}].next_hop_mac: {e}"))?;
            let src_mac = parse_mac(&r.src_mac).map_err(|e| format!("routes[{i}].src_mac: {e}"))?;
            routes.push(Route { prefix, len, output: r.output, next_hop_mac, src_mac });
        }
        if routes.is_empty() {
            return Err("routes is empty: every frame would be dropped".into());
        }
        Ok(Ipv4Router::new(Table::new(routes)))
    }
}

/// Swaps destination and source MAC and passes the frame on.
pub struct MacSwap;

impl Handler for MacSwap {
    #[inline]
    fn on_message(&mut self, mut msg: Msg, cx: &mut StageCx<'_>) {
        let f = cx.bytes_mut(&mut msg);
        if f.len() < 12 {
            cx.drop_msg(msg);
            return;
        }
        let mut dst = [0u8; 6];
        dst.copy_from_slice(&f[..6]);
        f.copy_within(6..12, 0);
        f[6..12].copy_from_slice(&dst);
        cx.send(0, msg);
    }
}

/// IPv4 forwarding with drop counters per reason.
pub struct Ipv4Router {
    table: Table,
    forwarded: u64,
    drops: [u64; Drop::ALL.len()],
}

impl Ipv4Router {
    /// A router over `table`.
    pub fn new(table: Table) -> Ipv4Router {
        Ipv4Router { table, forwarded: 0, drops: [0; Drop::ALL.len()] }
    }
}

impl Handler for Ipv4Router {
    #[inline]
    fn on_message(&mut self, mut msg: Msg, cx: &mut StageCx<'_>) {
        match forward(&self.table, cx.bytes_mut(&mut msg)) {
            Ok(out) => {
                self.forwarded += 1;
                cx.send(out, msg);
            }
            Err(why) => {
                self.drops[why as usize] += 1;
                cx.drop_msg(msg);
            }
        }
    }

    fn report(&self) -> StageReport {
        let mut values = vec![("forwarded", self.forwarded)];
        values.extend(Drop::ALL.iter().map(|d| (d.name(), self.drops[*d as usize])));
        StageReport { values, ..Default::default() }
    }
}

//! Packet stages for pipelines on RAW_PACKET QPs (provider `xdp`), registered by the
//! `dataplane` binary next to the built-in kinds ([`register`]):
//!
//! - `mac-swap`: swaps a frame's destination and source MAC addresses and passes it on (the
//!   reflector of forwarding benchmarks, testpmd's `macswap`).
//! - `ipv4-router`: longest-prefix-match IPv4 forwarding ([`dataplane::net::route`]): TTL
//!   decrement with the checksum updated, MACs rewritten for the next hop, one output per
//!   port; drops counted per reason in the run summary.
//!
//! ```toml
//! [[stages]]
//! name = "from-a"
//! worker = "r"
//! kind = "ipv4-router"
//! input = "port1"
//! outputs = ["port1", "port2"]     # route `output` = index here
//! [stages.params]
//! routes = [
//!   { prefix = "10.1.0.0/24", output = 0, next_hop_mac = "02:00:00:00:0a:01", src_mac = "02:00:00:00:00:a1" },
//!   { prefix = "10.2.0.0/24", output = 1, next_hop_mac = "02:00:00:00:0b:01", src_mac = "02:00:00:00:00:b1" },
//! ]
//! ```

use crate::stages::{Registry, RegistryError};
use dataplane::net::route::{forward, parse_mac, parse_prefix, Drop, Route, Table};
use dataplane::pipeline::{Handler, Msg, StageCx, StageReport};
use dataplane_config::KindShape;
use serde::Deserialize;

/// Registers `mac-swap` and `ipv4-router` in `r`.
///
/// # Errors
/// [`RegistryError::Duplicate`] if `r` already has a kind of either name.
pub fn register(r: &mut Registry) -> Result<(), RegistryError> {
    r.register("mac-swap", KindShape::filter(), "swaps each frame's destination and source MACs", |_: NoParams, _| {
        Ok(Box::new(MacSwap))
    })?;
    r.register(
        "ipv4-router",
        KindShape::filter().outputs(1, 16),
        "IPv4 longest-prefix-match forwarding: TTL, checksum, next-hop MACs; one output per port",
        |p: RouterParams, spec| {
            let mut routes = Vec::with_capacity(p.routes.len());
            for (i, r) in p.routes.iter().enumerate() {
                let (prefix, len) = parse_prefix(&r.prefix).map_err(|e| format!("routes[{i}].prefix: {e}"))?;
                if r.output >= spec.outputs() {
                    return Err(format!(
                        "routes[{i}].output = {}: the stage has {} outputs (0..={})",
                        r.output,
                        spec.outputs(),
                        spec.outputs().saturating_sub(1)
                    ));
                }
                let next_hop_mac = parse_mac(&r.next_hop_mac).map_err(|e| format!("routes[{i}].next_hop_mac: {e}"))?;
                let src_mac = parse_mac(&r.src_mac).map_err(|e| format!("routes[{i}].src_mac: {e}"))?;
                routes.push(Route { prefix, len, output: r.output, next_hop_mac, src_mac });
            }
            if routes.is_empty() {
                return Err("routes is empty: every frame would be dropped".into());
            }
            Ok(Box::new(Ipv4Router::new(Table::new(routes))))
        },
    )?;
    Ok(())
}

/// A kind without parameters.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NoParams {}

/// `ipv4-router` parameters.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RouterParams {
    routes: Vec<RouteParams>,
}

/// One route of `ipv4-router`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RouteParams {
    /// `a.b.c.d/len`.
    prefix: String,
    /// Index into the stage's outputs.
    output: usize,
    /// Destination MAC of forwarded frames.
    next_hop_mac: String,
    /// Source MAC of forwarded frames (the router's on that output).
    src_mac: String,
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

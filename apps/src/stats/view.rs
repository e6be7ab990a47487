//! `dpctl`'s output: a table like VPP's `show runtime`, or one JSON object.
//!
//! Both compare a snapshot with a base: for `dpctl stats` the base is the start of the run
//! (all zeros, over the uptime), for `dpctl watch` the previous snapshot (over the interval).
//! Totals are always since the start; rates (`/s`), ratios (`busy%`, `msg/loop`, `db/msg`)
//! and latency percentiles are over the base's span.

use super::read::{Segment, Snapshot, Values};
use crate::json::{number, string};
use dataplane::worker::stats::LatencyBuckets;
use std::fmt::Write;

/// What a view shows: the segment, its current snapshot, and the base it is compared with.
pub struct View<'a> {
    /// The segment.
    pub segment: &'a Segment,
    /// Now.
    pub now: &'a Snapshot,
    /// The previous snapshot (`watch`), or `None` for "since the start".
    pub base: Option<&'a Snapshot>,
    /// Seconds between base and now.
    pub secs: f64,
}

/// Latency percentiles from histogram buckets, in nanoseconds. Each is the upper bound of its
/// bucket (at most 6.25 % above the true value), capped at the maximum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Latency {
    /// Values counted.
    pub count: u64,
    /// Median.
    pub p50: u64,
    /// 99th percentile.
    pub p99: u64,
    /// 99.9th percentile.
    pub p999: u64,
    /// Largest value (for an interval: the upper bound of its highest bucket).
    pub max: u64,
}

/// Percentiles of `buckets`; `None` if empty.
pub fn latency(buckets: &[u64], max: u64) -> Option<Latency> {
    let count: u64 = buckets.iter().sum();
    if count == 0 {
        return None;
    }
    let at = |q: f64| {
        let rank = ((q * count as f64).ceil() as u64).clamp(1, count);
        let mut seen = 0;
        for (i, &n) in buckets.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return LatencyBuckets::bucket_range(i).1.min(max);
            }
        }
        max
    };
    Some(Latency { count, p50: at(0.5), p99: at(0.99), p999: at(0.999), max })
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

/// A block's counters now and at the base (zeros when the base is the start).
struct Pair<'v> {
    now: &'v Values,
    base: Option<&'v Values>,
}

impl Pair<'_> {
    fn total(&self, f: &str) -> u64 {
        self.now.get(f)
    }

    fn delta(&self, f: &str) -> u64 {
        self.now.get(f).wrapping_sub(self.base.map_or(0, |b| b.get(f)))
    }
}

impl View<'_> {
    fn rate(&self, p: &Pair<'_>, f: &str) -> f64 {
        if self.secs > 0.0 {
            p.delta(f) as f64 / self.secs
        } else {
            0.0
        }
    }

    /// The latency of stage `si` of worker `wi` over the view's span.
    fn stage_latency(&self, wi: usize, si: usize) -> Option<Latency> {
        let (max, now) = self.now.workers.get(wi)?.stages.get(si)?.latency.as_ref()?;
        match self.base.and_then(|b| b.workers.get(wi)?.stages.get(si)?.latency.as_ref()) {
            None => latency(now, *max),
            Some((_, before)) => {
                let d: Vec<u64> = now.iter().zip(before).map(|(a, b)| a.wrapping_sub(*b)).collect();
                let top = d.iter().rposition(|&n| n > 0).map_or(0, |i| LatencyBuckets::bucket_range(i).1);
                latency(&d, top.min(*max))
            }
        }
    }

    fn pairs(&self, wi: usize) -> Option<Pair<'_>> {
        let now = &self.now.workers.get(wi)?.counters;
        Some(Pair { now, base: self.base.and_then(|b| b.workers.get(wi)).map(|w| &w.counters) })
    }

    fn span(&self) -> String {
        match self.base {
            None => "rates since the start".into(),
            Some(_) => format!("rates over the last {:.2} s", self.secs),
        }
    }

    /// The human-readable table.
    pub fn text(&self) -> String {
        let h = self.segment.header();
        let mut o = String::new();
        let _ = writeln!(
            o,
            "pipeline {}  pid {}  {}{}  up {:.1} s  ({})  {}",
            h.name,
            h.pid,
            self.now.state.name(),
            if self.segment.alive() { "" } else { " (STALE: the process is gone; final values)" },
            self.now.uptime.as_secs_f64(),
            self.span(),
            self.segment.path().display()
        );
        let _ = writeln!(
            o,
            "{:<12} {:>4} {:>12} {:>6} {:>8} {:>12} {:>10} {:>12} {:>10} {:>11} {:>7} {:>8} {:>5} {:>6} {:>7}",
            "worker",
            "core",
            "loops",
            "busy%",
            "msg/loop",
            "rx msgs",
            "rx/s",
            "tx msgs",
            "tx/s",
            "doorbells",
            "db/msg",
            "refills",
            "rnr",
            "errors",
            "dropped"
        );
        for (wi, w) in self.now.workers.iter().enumerate() {
            let Some(p) = self.pairs(wi) else { continue };
            let busy = p.delta("busy_loops");
            let _ = writeln!(
                o,
                "{:<12} {:>4} {:>12} {:>6.1} {:>8.2} {:>12} {:>10.0} {:>12} {:>10.0} {:>11} {:>7.4} {:>8} {:>5} {:>6} {:>7}",
                w.name,
                w.core.map_or("-".into(), |c| c.to_string()),
                p.total("loops"),
                100.0 * ratio(busy, p.delta("loops")),
                ratio(p.delta("rx_msgs") + p.delta("tx_msgs"), busy),
                p.total("rx_msgs"),
                self.rate(&p, "rx_msgs"),
                p.total("tx_msgs"),
                self.rate(&p, "tx_msgs"),
                p.total("doorbells"),
                ratio(p.delta("doorbells"), p.delta("tx_msgs")),
                p.total("srq_refills"),
                p.total("rnr"),
                p.total("errors"),
                p.total("dropped")
            );
        }
        let _ = writeln!(
            o,
            "{:<12} {:<12} {:>12} {:>10} {:>12} {:>10} {:>14} {:>11} {:>7} {:>10} {:>5} {:>6}",
            "qp",
            "worker",
            "rx msgs",
            "rx/s",
            "tx msgs",
            "tx/s",
            "tx bytes",
            "doorbells",
            "db/msg",
            "signaled",
            "rnr",
            "errors"
        );
        for (wi, w) in self.now.workers.iter().enumerate() {
            for (qi, q) in w.qps.iter().enumerate() {
                let base = self.base.and_then(|b| b.workers.get(wi)?.qps.get(qi)).map(|q| &q.counters);
                let p = Pair { now: &q.counters, base };
                let _ = writeln!(
                    o,
                    "{:<12} {:<12} {:>12} {:>10.0} {:>12} {:>10.0} {:>14} {:>11} {:>7.4} {:>10} {:>5} {:>6}",
                    q.name,
                    w.name,
                    p.total("rx_msgs"),
                    self.rate(&p, "rx_msgs"),
                    p.total("tx_msgs"),
                    self.rate(&p, "tx_msgs"),
                    p.total("tx_bytes"),
                    p.total("doorbells"),
                    ratio(p.delta("doorbells"), p.delta("tx_msgs")),
                    p.total("signaled"),
                    p.total("rnr"),
                    p.total("errors")
                );
            }
        }
        let _ = writeln!(
            o,
            "{:<12} {:<12} {:<10} {:>12} {:>10} {:>12} {:>10} {:>8} {:>6}  latency ns p50 / p99 / p99.9 / max",
            "stage", "worker", "kind", "msgs in", "in/s", "msgs out", "consumed", "gaps", "dups"
        );
        for (wi, w) in self.now.workers.iter().enumerate() {
            for (si, s) in w.stages.iter().enumerate() {
                let base = self.base.and_then(|b| b.workers.get(wi)?.stages.get(si)).map(|s| &s.counters);
                let p = Pair { now: &s.counters, base };
                let lat = match (s.latency.is_some(), self.stage_latency(wi, si)) {
                    (false, _) => "-".to_string(),
                    (true, None) => "(no samples)".to_string(),
                    (true, Some(l)) => format!("{} / {} / {} / {}", l.p50, l.p99, l.p999, l.max),
                };
                let _ = writeln!(
                    o,
                    "{:<12} {:<12} {:<10} {:>12} {:>10.0} {:>12} {:>10} {:>8} {:>6}  {}",
                    s.name,
                    w.name,
                    s.kind,
                    p.total("msgs_in"),
                    self.rate(&p, "msgs_in"),
                    p.total("msgs_out"),
                    p.total("dropped"),
                    p.total("gaps"),
                    p.total("duplicates"),
                    lat
                );
            }
        }
        o
    }

    /// Every field of a block (totals), then `"rates":{field: per second}`.
    fn json_values(&self, o: &mut String, p: &Pair<'_>) {
        for f in p.now.fields {
            let _ = write!(o, ",\"{f}\":{}", p.total(f));
        }
        o.push_str(",\"rates\":{");
        for (i, f) in p.now.fields.iter().enumerate() {
            let _ = write!(o, "{}\"{f}\":{}", if i > 0 { "," } else { "" }, number(self.rate(p, f)));
        }
        o.push('}');
    }

    /// One JSON object: header, then workers with their counters (totals), `rates`, ratios,
    /// and nested `qps` and `stages` (with `latency_ns` for sinks).
    pub fn json(&self) -> String {
        let h = self.segment.header();
        let mut o = String::new();
        let _ = write!(
            o,
            "{{\"segment\":{},\"name\":{},\"pid\":{},\"state\":{},\"alive\":{},\"uptime_s\":{},\"interval_s\":{},\
             \"workers\":[",
            string(&self.segment.path().display().to_string()),
            string(&h.name),
            h.pid,
            string(self.now.state.name()),
            self.segment.alive(),
            number(self.now.uptime.as_secs_f64()),
            number(self.secs)
        );
        for (wi, w) in self.now.workers.iter().enumerate() {
            let Some(p) = self.pairs(wi) else { continue };
            let busy = p.delta("busy_loops");
            let _ = write!(
                o,
                "{}{{\"name\":{},\"core\":{}",
                if wi > 0 { "," } else { "" },
                string(&w.name),
                w.core.map_or("null".into(), |c| c.to_string())
            );
            self.json_values(&mut o, &p);
            let _ = write!(
                o,
                ",\"busy_pct\":{},\"msgs_per_loop\":{},\"doorbells_per_msg\":{},\"qps\":[",
                number(100.0 * ratio(busy, p.delta("loops"))),
                number(ratio(p.delta("rx_msgs") + p.delta("tx_msgs"), busy)),
                number(ratio(p.delta("doorbells"), p.delta("tx_msgs")))
            );
            for (qi, q) in w.qps.iter().enumerate() {
                let base = self.base.and_then(|b| b.workers.get(wi)?.qps.get(qi)).map(|q| &q.counters);
                let p = Pair { now: &q.counters, base };
                let _ = write!(o, "{}{{\"name\":{}", if qi > 0 { "," } else { "" }, string(&q.name));
                self.json_values(&mut o, &p);
                let dpm = ratio(p.delta("doorbells"), p.delta("tx_msgs"));
                let _ = write!(o, ",\"doorbells_per_msg\":{}}}", number(dpm));
            }
            o.push_str("],\"stages\":[");
            for (si, s) in w.stages.iter().enumerate() {
                let base = self.base.and_then(|b| b.workers.get(wi)?.stages.get(si)).map(|s| &s.counters);
                let p = Pair { now: &s.counters, base };
                let _ = write!(
                    o,
                    "{}{{\"name\":{},\"kind\":{}",
                    if si > 0 { "," } else { "" },
                    string(&s.name),
                    string(&s.kind)
                );
                self.json_values(&mut o, &p);
                match self.stage_latency(wi, si) {
                    Some(l) => {
                        let _ = write!(
                            o,
                            ",\"latency_ns\":{{\"count\":{},\"p50\":{},\"p99\":{},\"p999\":{},\"max\":{}}}}}",
                            l.count, l.p50, l.p99, l.p999, l.max
                        );
                    }
                    None => o.push_str(",\"latency_ns\":null}"),
                }
            }
            o.push_str("]}");
        }
        o.push_str("]}");
        o
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dataplane::worker::stats::LATENCY_BUCKETS;

    #[test]
    fn percentiles_are_bucket_upper_bounds_capped_at_the_max() {
        let mut b = vec![0u64; LATENCY_BUCKETS];
        b[LatencyBuckets::bucket_of(1000)] += 98;
        b[LatencyBuckets::bucket_of(50_000)] += 1;
        b[LatencyBuckets::bucket_of(900_000)] += 1;
        let l = latency(&b, 900_123).unwrap();
        assert_eq!(l.count, 100);
        let (lo, hi) = LatencyBuckets::bucket_range(LatencyBuckets::bucket_of(1000));
        assert!(lo <= 1000 && l.p50 == hi && hi < 1064, "p50 {} in [{lo}, {hi}]", l.p50);
        assert!(l.p99 >= 50_000 && l.p99 < 53_200, "p99 {}", l.p99);
        assert_eq!(l.p999, 900_123, "capped at the max");
        assert_eq!(latency(&[0; 4], 0), None);
    }
}

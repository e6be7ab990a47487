//! The run summary: a text table per worker, QP and stage, or one JSON object.

use crate::json::{number as num, string as js};
use crate::runner::RunReport;
use dataplane::worker::StageSummary;
use std::fmt::Write;

fn rate(n: u64, secs: f64) -> f64 {
    if secs > 0.0 {
        n as f64 / secs
    } else {
        0.0
    }
}

fn per(a: u64, b: u64) -> f64 {
    if b > 0 {
        a as f64 / b as f64
    } else {
        0.0
    }
}

/// Latency quantiles of a stage in nanoseconds: (count, p50, p99, p99.9, max).
pub fn latency(s: &StageSummary) -> Option<(u64, u64, u64, u64, u64)> {
    let h = s.report.latency.as_ref()?;
    if h.is_empty() {
        return None;
    }
    Some((h.len(), h.value_at_quantile(0.5), h.value_at_quantile(0.99), h.value_at_quantile(0.999), h.max()))
}

/// Sum of sequence gaps over all sinks.
pub fn total_gaps(r: &RunReport) -> u64 {
    r.workers.iter().flat_map(|w| &w.stages).map(|s| s.report.gaps).sum()
}

/// Sum of leaked buffers over all pools.
pub fn total_leaked(r: &RunReport) -> usize {
    r.pools.iter().map(|p| p.leaked).sum()
}

/// Completions with an error status, over every worker.
pub fn total_errors(r: &RunReport) -> u64 {
    r.workers.iter().map(|w| w.errors).sum()
}

/// The human-readable summary.
pub fn text(r: &RunReport) -> String {
    let secs = r.elapsed.as_secs_f64();
    let mut o = String::new();
    let _ = writeln!(
        o,
        "ran {:.3} s{}, drain {} in {:.3} s",
        secs,
        if r.interrupted { " (interrupted)" } else { "" },
        if r.drained {
            "complete".to_string()
        } else if r.peer_gone {
            format!("INCOMPLETE (the remote peer left; {} messages in flight lost)", r.lost_in_flight)
        } else {
            format!("INCOMPLETE ({} messages still in flight at the deadline)", r.lost_in_flight)
        },
        r.drain_time.as_secs_f64()
    );
    let _ = writeln!(
        o,
        "{:<12} {:>4} {:>12} {:>6} {:>12} {:>12} {:>11} {:>9} {:>8} {:>8} {:>5} {:>6} {:>7}",
        "worker",
        "core",
        "loops",
        "busy%",
        "rx msgs",
        "tx msgs",
        "tx msg/s",
        "db/msg",
        "tx/db",
        "refills",
        "rnr",
        "errors",
        "dropped"
    );
    for w in &r.workers {
        let _ = writeln!(
            o,
            "{:<12} {:>4} {:>12} {:>6.1} {:>12} {:>12} {:>11.0} {:>9.4} {:>8.2} {:>8} {:>5} {:>6} {:>7}",
            w.name,
            w.core.map_or("-".into(), |c| c.to_string()),
            w.loops,
            100.0 * per(w.busy_loops, w.loops),
            w.rx_msgs,
            w.tx_msgs,
            rate(w.tx_msgs, secs),
            per(w.doorbells, w.tx_msgs),
            per(w.tx_msgs, w.doorbells),
            w.srq_refills,
            w.rnr,
            w.errors,
            w.dropped
        );
    }
    let _ = writeln!(
        o,
        "{:<12} {:<12} {:>12} {:>12} {:>12} {:>9} {:>12} {:>8} {:>6}",
        "qp", "worker", "rx msgs", "tx msgs", "tx bytes", "db/msg", "signaled", "rnr", "errors"
    );
    for w in &r.workers {
        for q in &w.qps {
            let _ = writeln!(
                o,
                "{:<12} {:<12} {:>12} {:>12} {:>12} {:>9.4} {:>12} {:>8} {:>6}",
                q.name,
                w.name,
                q.rx_msgs,
                q.tx_msgs,
                q.tx_bytes,
                per(q.doorbells, q.tx_msgs),
                q.signaled,
                q.rnr,
                q.errors
            );
        }
    }
    let _ = writeln!(
        o,
        "{:<12} {:<10} {:>12} {:>11} {:>12} {:>12} {:>6} {:>5}  latency ns p50 / p99 / p99.9 / max",
        "stage", "kind", "msgs in", "msg/s", "bytes in", "msgs out", "gaps", "dups"
    );
    for w in &r.workers {
        for s in &w.stages {
            let lat = latency(s).map_or("-".to_string(), |(_, a, b, c, d)| format!("{a} / {b} / {c} / {d}"));
            let _ = writeln!(
                o,
                "{:<12} {:<10} {:>12} {:>11.0} {:>12} {:>12} {:>6} {:>5}  {}",
                s.name,
                s.kind,
                s.msgs_in,
                rate(s.msgs_in, secs),
                s.bytes_in,
                s.msgs_out,
                s.report.gaps,
                s.report.duplicates,
                lat
            );
        }
    }
    for s in r.workers.iter().flat_map(|w| &w.stages).filter(|s| !s.report.values.is_empty()) {
        let _ = write!(o, "{:<12} {:<10}", s.name, s.kind);
        for (k, v) in &s.report.values {
            let _ = write!(o, " {k} {v}");
        }
        o.push('\n');
    }
    for p in &r.pools {
        let _ = writeln!(
            o,
            "pool {:<10} {} buffers, {} leaked{}",
            p.name,
            p.count,
            p.leaked,
            if p.leaked == 0 { "" } else { "  <-- LEAK" }
        );
    }
    if !r.device.is_empty() {
        o.push_str("device");
        for (k, v) in &r.device {
            let _ = write!(o, " {k} {v}");
        }
        o.push('\n');
    }
    o
}

/// The summary as one JSON object (written by hand: no serde_json dependency).
pub fn json(r: &RunReport) -> String {
    let secs = r.elapsed.as_secs_f64();
    let mut o = String::new();
    let _ = write!(
        o,
        "{{\"elapsed_s\":{},\"interrupted\":{},\"drained\":{},\"drain_s\":{},\"peer_gone\":{},\"lost_in_flight\":{},\"gaps\":{},\"leaked\":{},\"workers\":[",
        num(secs),
        r.interrupted,
        r.drained,
        num(r.drain_time.as_secs_f64()),
        r.peer_gone,
        r.lost_in_flight,
        total_gaps(r),
        total_leaked(r)
    );
    for (wi, w) in r.workers.iter().enumerate() {
        if wi > 0 {
            o.push(',');
        }
        let _ = write!(
            o,
            "{{\"name\":{},\"core\":{},\"loops\":{},\"busy_loops\":{},\"idle_loops\":{},\"rx_msgs\":{},\"rx_bytes\":{},\
             \"tx_msgs\":{},\"tx_bytes\":{},\"tx_msgs_per_s\":{},\"doorbells\":{},\"doorbells_per_msg\":{},\
             \"srq_refills\":{},\"srq_limit_events\":{},\"rnr\":{},\"errors\":{},\"dropped\":{},\"qps\":[",
            js(&w.name),
            w.core.map_or("null".into(), |c| c.to_string()),
            w.loops,
            w.busy_loops,
            w.idle_loops,
            w.rx_msgs,
            w.rx_bytes,
            w.tx_msgs,
            w.tx_bytes,
            num(rate(w.tx_msgs, secs)),
            w.doorbells,
            num(per(w.doorbells, w.tx_msgs)),
            w.srq_refills,
            w.srq_limit_events,
            w.rnr,
            w.errors,
            w.dropped
        );
        for (qi, q) in w.qps.iter().enumerate() {
            if qi > 0 {
                o.push(',');
            }
            let _ = write!(
                o,
                "{{\"name\":{},\"rx_msgs\":{},\"rx_bytes\":{},\"tx_msgs\":{},\"tx_bytes\":{},\"doorbells\":{},\
                 \"doorbells_per_msg\":{},\"signaled\":{},\"rnr\":{},\"errors\":{}}}",
                js(&q.name),
                q.rx_msgs,
                q.rx_bytes,
                q.tx_msgs,
                q.tx_bytes,
                q.doorbells,
                num(per(q.doorbells, q.tx_msgs)),
                q.signaled,
                q.rnr,
                q.errors
            );
        }
        o.push_str("],\"stages\":[");
        for (si, s) in w.stages.iter().enumerate() {
            if si > 0 {
                o.push(',');
            }
            let _ = write!(
                o,
                "{{\"name\":{},\"kind\":{},\"msgs\":{},\"bytes\":{},\"msgs_per_s\":{},\"msgs_out\":{},\"bytes_out\":{},\
                 \"dropped\":{},\"gaps\":{},\"duplicates\":{},",
                js(&s.name),
                js(&s.kind),
                s.msgs_in,
                s.bytes_in,
                num(rate(s.msgs_in, secs)),
                s.msgs_out,
                s.bytes_out,
                s.dropped,
                s.report.gaps,
                s.report.duplicates
            );
            if !s.report.values.is_empty() {
                o.push_str("\"values\":{");
                for (i, (k, v)) in s.report.values.iter().enumerate() {
                    let _ = write!(o, "{}{}:{v}", if i > 0 { "," } else { "" }, js(k));
                }
                o.push_str("},\"latency_ns\":");
            } else {
                o.push_str("\"latency_ns\":");
            }
            match latency(s) {
                Some((n, a, b, c, d)) => {
                    let _ = write!(o, "{{\"count\":{n},\"p50\":{a},\"p99\":{b},\"p999\":{c},\"max\":{d}}}}}");
                }
                None => o.push_str("null}"),
            }
        }
        o.push_str("]}");
    }
    o.push_str("],\"pools\":[");
    for (pi, p) in r.pools.iter().enumerate() {
        if pi > 0 {
            o.push(',');
        }
        let _ = write!(o, "{{\"name\":{},\"count\":{},\"leaked\":{}}}", js(&p.name), p.count, p.leaked);
    }
    o.push_str("],\"device\":{");
    for (i, (k, v)) in r.device.iter().enumerate() {
        let _ = write!(o, "{}{}:{v}", if i > 0 { "," } else { "" }, js(k));
    }
    o.push_str("}}");
    o
}

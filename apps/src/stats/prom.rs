//! The Prometheus text exposition format (version 0.0.4) of running pipelines' counters, for
//! `dpctl prom` and `dpctl serve`.
//!
//! Every counter block field becomes a counter family `dataplane_{worker,qp,stage}_FIELD_total`
//! and each latency-recording stage a histogram `dataplane_stage_latency_seconds`. Labels:
//! `pipeline` (the fabric name) and `pid` on every series, then `worker`, `qp`, `stage` and
//! `kind` where they apply. Each family is written once, with the series of all pipelines
//! under it (the format forbids a family split in two), and a label set appears at most once
//! per family.
//!
//! The histogram's buckets are the live [`LatencyBuckets`] merged to one per power of two:
//! `le` is `2^k - 1` ns (k = 4..=39) in seconds, exact because the recorded values are whole
//! nanoseconds (a value is `<= 2^k - 1` exactly when it is `< 2^k`). The live histogram keeps
//! no sum, so `_sum` is estimated: each value counts as the midpoint of its fine bucket
//! (at most 1/32 off for values of 16 ns and more, exact below).

use super::read::{list, Segment, Snapshot, Values};
use dataplane::worker::stats::{LatencyBuckets, QpCounters, StageCounters, WorkerCounters, LATENCY_SUB_BITS};
use std::collections::HashSet;
use std::fmt::Write;
use std::path::Path;

/// The content type of the exposition, for HTTP responses.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The smallest and largest `k` of the finite `le = 2^k - 1` ns bucket bounds. Values from
/// 2^40 ns on are clamped into the last fine bucket, so no finite bound above 2^39 - 1 is exact.
const LE_BITS: std::ops::RangeInclusive<u32> = LATENCY_SUB_BITS..=39;

/// A label value escaped for the text format: `\` `"` and newline become `\\` `\"` `\n`.
pub fn escape_label(v: &str) -> String {
    let mut o = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => o.push_str("\\\\"),
            '"' => o.push_str("\\\""),
            '\n' => o.push_str("\\n"),
            c => o.push(c),
        }
    }
    o
}

/// A `# HELP` text escaped for the text format: `\` and newline become `\\` and `\n`.
pub fn escape_help(v: &str) -> String {
    v.replace('\\', "\\\\").replace('\n', "\\n")
}

/// A float as the text format writes it (`+Inf`, `-Inf`, `NaN` or the shortest decimal).
fn float(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else {
        format!("{v}")
    }
}

/// One metric family being written: its header, then its series, each label set once.
struct Family {
    name: String,
    text: String,
    seen: HashSet<String>,
}

impl Family {
    fn new(name: &str, kind: &str, help: &str) -> Family {
        let text = format!("# HELP {name} {}\n# TYPE {name} {kind}\n", escape_help(help));
        Family { name: name.into(), text, seen: HashSet::new() }
    }

    /// Adds series `suffix{labels}` (labels already rendered) unless this family has it.
    fn sample(&mut self, suffix: &str, labels: &str, value: &str) {
        let series = if labels.is_empty() { suffix.to_string() } else { format!("{suffix}{{{labels}}}") };
        if self.seen.insert(series.clone()) {
            let _ = writeln!(self.text, "{}{series} {value}", self.name);
        }
    }
}

/// Rendered labels `k="v",...` from pairs.
fn labels(pairs: &[(&str, &str)]) -> String {
    let parts: Vec<String> = pairs.iter().map(|(k, v)| format!("{k}=\"{}\"", escape_label(v))).collect();
    parts.join(",")
}

/// The cumulative buckets of a fine histogram: `(le in ns, values <= le)` per power of two,
/// then the count (the `+Inf` bucket), and the estimated sum in ns.
pub fn cumulative(fine: &[u64]) -> (Vec<(u64, u64)>, u64, f64) {
    let mut out = Vec::with_capacity(LE_BITS.count());
    let (mut seen, mut sum, mut i) = (0u64, 0f64, 0usize);
    for k in LE_BITS {
        let le = (1u64 << k) - 1;
        while i < fine.len() && LatencyBuckets::bucket_range(i).1 <= le {
            seen += fine[i];
            i += 1;
        }
        out.push((le, seen));
    }
    let count: u64 = fine.iter().sum();
    for (j, &n) in fine.iter().enumerate() {
        let (lo, hi) = LatencyBuckets::bucket_range(j);
        sum += n as f64 * (lo as f64 + hi as f64) / 2.0;
    }
    (out, count, sum)
}

/// The exposition of `pipelines` (segments and their snapshots), plus the scrape's own
/// gauge: `unreadable` segment files that were skipped.
pub fn exposition(pipelines: &[(&Segment, &Snapshot)], unreadable: usize) -> String {
    let mut fams: Vec<Family> = Vec::new();
    let mut up = Family::new(
        "dataplane_up",
        "gauge",
        "1 for each pipeline whose process runs (those of processes that are gone are not exported)",
    );
    let mut uptime =
        Family::new("dataplane_uptime_seconds", "gauge", "Time since the pipeline's stats segment was created");
    let mut running = Family::new(
        "dataplane_running",
        "gauge",
        "1 while the workers run with sources generating; 0 while draining (or in a state unknown to dpctl)",
    );
    let mut workers = block_families("worker", WorkerCounters::FIELDS);
    let mut qps = block_families("qp", QpCounters::FIELDS);
    let mut stages = block_families("stage", StageCounters::FIELDS);
    let mut lat = Family::new(
        "dataplane_stage_latency_seconds",
        "histogram",
        "Latency recorded by a stage (a sink's message latency); _sum is estimated from bucket midpoints",
    );
    let mut lat_max =
        Family::new("dataplane_stage_latency_max_seconds", "gauge", "Largest latency recorded by a stage");
    for (seg, snap) in pipelines {
        let h = seg.header();
        let pid = h.pid.to_string();
        let base = [("pipeline", h.name.as_str()), ("pid", pid.as_str())];
        let l = labels(&base);
        up.sample("", &l, if seg.alive() { "1" } else { "0" });
        uptime.sample("", &l, &float(snap.uptime.as_secs_f64()));
        let is_running = matches!(snap.state, super::layout::State::Running);
        running.sample("", &l, if is_running { "1" } else { "0" });
        for w in &snap.workers {
            let wl = [base[0], base[1], ("worker", w.name.as_str())];
            values(&mut workers, &labels(&wl), &w.counters);
            for q in &w.qps {
                let ql = labels(&[wl[0], wl[1], wl[2], ("qp", q.name.as_str())]);
                values(&mut qps, &ql, &q.counters);
            }
            for s in &w.stages {
                let sl = [wl[0], wl[1], wl[2], ("stage", s.name.as_str()), ("kind", s.kind.as_str())];
                values(&mut stages, &labels(&sl), &s.counters);
                if let Some((max, fine)) = &s.latency {
                    let (buckets, count, sum) = cumulative(fine);
                    let ls = labels(&sl);
                    for (le, n) in buckets {
                        let le = float(le as f64 / 1e9);
                        lat.sample("_bucket", &format!("{ls},le=\"{le}\""), &n.to_string());
                    }
                    lat.sample("_bucket", &format!("{ls},le=\"+Inf\""), &count.to_string());
                    lat.sample("_sum", &ls, &float(sum / 1e9));
                    lat.sample("_count", &ls, &count.to_string());
                    lat_max.sample("", &ls, &float(*max as f64 / 1e9));
                }
            }
        }
    }
    let mut scrape = Family::new(
        "dataplane_scrape_unreadable_segments",
        "gauge",
        "Stats segment files of running processes that this scrape could not read (see dpctl list)",
    );
    scrape.sample("", "", &unreadable.to_string());
    fams.extend([up, uptime, running]);
    for block in [workers, qps, stages] {
        fams.extend(block.into_iter().map(|(_, f)| f));
    }
    fams.extend([lat, lat_max, scrape]);
    fams.into_iter().map(|f| f.text).collect()
}

/// The exposition of the live pipelines in `dir`, or only those named `name` and/or of
/// process `pid`; segments of processes that are gone are left out (their counters are
/// frozen), unreadable ones counted in `dataplane_scrape_unreadable_segments`. Also returns
/// how many pipelines it holds.
pub fn scrape(dir: &Path, name: Option<&str>, pid: Option<u32>) -> Result<(String, usize), String> {
    let all = list(dir).map_err(|e| format!("cannot list {}: {e}", dir.display()))?;
    let unreadable = all.iter().filter(|l| l.segment.is_err() && !l.stale()).count();
    let live: Vec<&Segment> = all
        .iter()
        .filter_map(|l| l.segment.as_ref().ok())
        .filter(|s| s.alive())
        .filter(|s| name.is_none_or(|n| s.header().name == n) && pid.is_none_or(|p| s.header().pid == p as u64))
        .collect();
    let snaps: Vec<Snapshot> = live.iter().map(|s| s.snapshot()).collect();
    let pairs: Vec<(&Segment, &Snapshot)> = live.iter().copied().zip(&snaps).collect();
    Ok((exposition(&pairs, unreadable), pairs.len()))
}

/// One counter family per field of a block, `dataplane_{block}_{field}_total`, with its field.
fn block_families(block: &str, fields: &[&'static str]) -> Vec<(&'static str, Family)> {
    fields
        .iter()
        .map(|&f| {
            let help = format!("The {block} counter `{f}` (dataplane::worker::stats, live stats)");
            (f, Family::new(&format!("dataplane_{block}_{f}_total"), "counter", &help))
        })
        .collect()
}

/// Adds the value of each family's field in `v` to that family.
fn values(fams: &mut [(&'static str, Family)], labels: &str, v: &Values) {
    for (field, fam) in fams.iter_mut() {
        fam.sample("", labels, &v.get(field).to_string());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dataplane::worker::stats::LATENCY_BUCKETS;

    #[test]
    fn label_values_and_help_are_escaped() {
        assert_eq!(escape_label(r#"a\b"c"#), r#"a\\b\"c"#);
        assert_eq!(escape_label("x\ny"), "x\\ny");
        assert_eq!(escape_label("plain-name_1.2"), "plain-name_1.2");
        assert_eq!(escape_help("a\\b\nc \"q\""), "a\\\\b\\nc \"q\"", "help keeps quotes");
        assert_eq!(labels(&[("pipeline", "a\"b"), ("pid", "7")]), r#"pipeline="a\"b",pid="7""#);
    }

    #[test]
    fn buckets_are_cumulative_and_the_inf_bucket_is_the_count() {
        let mut fine = vec![0u64; LATENCY_BUCKETS];
        for (v, n) in [(3u64, 2u64), (15, 1), (16, 4), (1000, 5), (1023, 1), (1024, 3), (1 << 45, 2)] {
            fine[LatencyBuckets::bucket_of(v)] += n;
        }
        let (b, count, sum) = cumulative(&fine);
        assert_eq!(count, 18);
        assert_eq!(b.first(), Some(&(15, 3)), "values <= 15 ns: 3 and 15");
        let at = |le: u64| b.iter().find(|x| x.0 == le).map(|x| x.1);
        assert_eq!(at(31), Some(7), "16 joins at le 31");
        assert_eq!(at(1023), Some(13), "1000 and 1023 are <= 1023");
        assert_eq!(at(2047), Some(16), "1024 is not <= 1023 but is <= 2047");
        assert_eq!(b.last(), Some(&((1 << 39) - 1, 16)), "clamped values only in +Inf");
        assert!(b.windows(2).all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1), "increasing: {b:?}");
        assert!(sum >= 2.0 * 3.0 + 15.0 + 4.0 * 16.0, "sum {sum}");
        let empty = cumulative(&[0; LATENCY_BUCKETS]);
        assert!(empty.0.iter().all(|x| x.1 == 0) && empty.1 == 0 && empty.2 == 0.0);
    }

    #[test]
    fn a_family_writes_its_header_once_and_each_series_once() {
        let mut f = Family::new("x_total", "counter", "line1\nline2");
        f.sample("", "a=\"1\"", "5");
        f.sample("", "a=\"1\"", "6");
        f.sample("", "a=\"2\"", "7");
        assert_eq!(
            f.text,
            "# HELP x_total line1\\nline2\n# TYPE x_total counter\nx_total{a=\"1\"} 5\nx_total{a=\"2\"} 7\n"
        );
    }

    #[test]
    fn floats_use_the_format_s_spellings() {
        assert_eq!(float(f64::INFINITY), "+Inf");
        assert_eq!(float(f64::NEG_INFINITY), "-Inf");
        assert_eq!(float(f64::NAN), "NaN");
        assert_eq!(float(1023.0 / 1e9), "0.000001023");
    }

    #[test]
    fn a_live_segment_becomes_one_family_per_name_with_escaped_labels() {
        use crate::stats::export::StatsSegment;
        use dataplane::worker::stats::{StageShape, StatsShape};
        let d = std::env::temp_dir().join(format!("dp-prom-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let st = |name: &str, kind: &str, latency| StageShape { name: name.into(), kind: kind.into(), latency };
        let shape = StatsShape {
            name: "w\"1".into(),
            core: None,
            qps: vec!["q".into()],
            stages: vec![st("src", "source", false), st("rtt", "sink", true)],
        };
        let (seg, slots) = StatsSegment::create(&d, "p\\x", &[shape]).expect("create");
        slots[0].worker.tx_msgs.add(42);
        slots[0].qps[0].rx_bytes.add(9);
        let hist = slots[0].latency[1].as_ref().expect("histogram");
        for v in [500, 700, 3000] {
            hist.record(v);
        }
        let r = Segment::open(seg.path()).expect("open");
        let snap = r.snapshot();
        let text = exposition(&[(&r, &snap), (&r, &snap)], 2);
        let pid = std::process::id();
        let wl = format!("pipeline=\"p\\\\x\",pid=\"{pid}\",worker=\"w\\\"1\"");
        assert!(text.contains(&format!("dataplane_worker_tx_msgs_total{{{wl}}} 42\n")), "{text}");
        assert!(text.contains(&format!("dataplane_qp_rx_bytes_total{{{wl},qp=\"q\"}} 9\n")), "{text}");
        let sl = format!("{wl},stage=\"rtt\",kind=\"sink\"");
        assert!(text.contains(&format!("dataplane_stage_latency_seconds_bucket{{{sl},le=\"0.000000511\"}} 1\n")));
        assert!(text.contains(&format!("dataplane_stage_latency_seconds_bucket{{{sl},le=\"0.000001023\"}} 2\n")));
        assert!(text.contains(&format!("dataplane_stage_latency_seconds_bucket{{{sl},le=\"+Inf\"}} 3\n")));
        assert!(text.contains(&format!("dataplane_stage_latency_seconds_count{{{sl}}} 3\n")));
        assert!(text.contains(&format!("dataplane_stage_latency_max_seconds{{{sl}}} 0.000003\n")));
        assert!(!text.contains("stage=\"src\",kind=\"source\",le="), "no histogram without latency");
        assert!(text.ends_with("dataplane_scrape_unreadable_segments 2\n"), "{text}");
        // The same pipeline twice: every family and every series still once.
        let types: Vec<&str> = text.lines().filter(|l| l.starts_with("# TYPE ")).collect();
        assert_eq!(types.len(), types.iter().collect::<HashSet<_>>().len(), "a family twice");
        let series: Vec<&str> =
            text.lines().filter(|l| !l.starts_with('#')).map(|l| l.rsplit_once(' ').unwrap().0).collect();
        assert_eq!(series.len(), series.iter().collect::<HashSet<_>>().len(), "a series twice");
        drop(seg);
        let _ = std::fs::remove_dir_all(&d);
    }
}

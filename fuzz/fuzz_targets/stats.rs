//! The live-stats segment reader (`dpctl stats`/`watch`): a file of arbitrary bytes, or a real
//! segment with patched bytes, opened, read twice and rendered as the table and as JSON.
#![no_main]

mod patch;

use dataplane::worker::stats::{StageShape, StatsShape};
use dataplane_apps::stats::export::StatsSegment;
use dataplane_apps::stats::read::Segment;
use dataplane_apps::stats::view::View;
use libfuzzer_sys::fuzz_target;
use std::path::PathBuf;
use std::sync::OnceLock;

/// A scratch directory of this process, and a valid segment's bytes.
fn setup() -> &'static (PathBuf, Vec<u8>) {
    static SETUP: OnceLock<(PathBuf, Vec<u8>)> = OnceLock::new();
    SETUP.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("dp-fuzz-stats-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("scratch directory");
        let stage = |name: &str, kind: &str, latency| StageShape { name: name.into(), kind: kind.into(), latency };
        let shapes = [
            StatsShape {
                name: "rx".into(),
                core: Some(0),
                qps: vec!["q0".into()],
                stages: vec![stage("s", "sink", true)],
            },
            StatsShape {
                name: "tx".into(),
                core: None,
                qps: vec!["q1".into(), "q2".into()],
                stages: vec![stage("e", "echo", false), stage("f", "fanout", true)],
            },
        ];
        let (seg, _slots) = StatsSegment::create(&dir, "fuzz", &shapes).expect("template segment");
        let bytes = std::fs::read(seg.path()).expect("read the template segment");
        drop(seg); // removes its file
        (dir, bytes)
    })
}

fuzz_target!(|data: &[u8]| {
    let (dir, template) = setup();
    let Some((&mode, rest)) = data.split_first() else { return };
    let bytes = if mode & 1 == 0 {
        rest.to_vec()
    } else {
        let mut b = template.clone();
        let span = b.len();
        patch::apply(&mut b, span, rest);
        b
    };
    let path = dir.join("segment.stats");
    std::fs::write(&path, &bytes).expect("write the input segment");
    if let Ok(seg) = Segment::open(&path) {
        let _ = seg.worker_names();
        let _ = seg.alive();
        let _ = seg.header();
        let base = seg.snapshot();
        let now = seg.snapshot();
        for (base, secs) in [(None, now.uptime.as_secs_f64()), (Some(&base), 0.0), (Some(&base), 1.5)] {
            let view = View { segment: &seg, now: &now, base, secs };
            let _ = view.text();
            let _ = view.json();
        }
    }
    let _ = std::fs::remove_file(&path);
});

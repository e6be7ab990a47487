//! The segment end to end in one process: what the writer lays out the reader finds, the file
//! is 0600 and goes away with the writer, and every kind of damage is a clear error, never a
//! panic or an out-of-bounds read.

use super::export::StatsSegment;
use super::layout::{self, State};
use super::read::{list, Segment, SegmentError};
use dataplane::worker::stats::{StageShape, StatsShape, WorkerSlots};
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::{Path, PathBuf};

fn shapes() -> Vec<StatsShape> {
    let st = |name: &str, kind: &str, latency| StageShape { name: name.into(), kind: kind.into(), latency };
    vec![
        StatsShape {
            name: "client".into(),
            core: Some(0),
            qps: vec!["client-qp".into()],
            stages: vec![st("pacer", "source", false), st("rtt", "sink", true)],
        },
        StatsShape {
            name: "server".into(),
            core: None,
            qps: vec!["server-qp".into()],
            stages: vec![st("echo", "echo", false)],
        },
    ]
}

/// A fresh directory for one test.
fn dir(test: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("dp-stats-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn create(d: &Path) -> (StatsSegment, Vec<WorkerSlots>) {
    StatsSegment::create(d, "pipe", &shapes()).expect("create")
}

fn poke(path: &Path, word: usize, v: u64) {
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(&v.to_ne_bytes(), (word * 8) as u64).unwrap();
}

fn peek(path: &Path, word: usize) -> u64 {
    let b = std::fs::read(path).unwrap();
    u64::from_ne_bytes(b[word * 8..word * 8 + 8].try_into().unwrap())
}

fn open_err(path: &Path) -> SegmentError {
    Segment::open(path).expect_err("a damaged segment must be refused")
}

#[test]
fn the_reader_sees_what_the_workers_write_and_the_file_is_0600_and_goes_away() {
    let d = dir("roundtrip");
    let (seg, slots) = create(&d);
    let path = seg.path().to_path_buf();
    assert_eq!(path.file_name().unwrap().to_str().unwrap(), format!("dataplane-stats.pipe.{}", std::process::id()));
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "mode {mode:o}");

    slots[0].worker.loops.add(1000);
    slots[0].worker.tx_msgs.add(7);
    slots[1].qps[0].rx_msgs.add(5);
    slots[0].stages[1].dropped.add(3);
    let hist = slots[0].latency[1].as_ref().expect("the sink has a histogram");
    hist.record(1200);
    assert!(slots[0].latency[0].is_none() && slots[1].latency[0].is_none());
    seg.set_state(State::Draining);

    let r = Segment::open(&path).expect("open");
    assert!(r.alive());
    assert_eq!(r.header().name, "pipe");
    assert_eq!(r.header().pid, std::process::id() as u64);
    assert_eq!(r.worker_names(), ["client", "server"]);
    let s = r.snapshot();
    assert_eq!(s.state, State::Draining);
    assert_eq!((s.workers[0].counters.get("loops"), s.workers[0].counters.get("tx_msgs")), (1000, 7));
    assert_eq!(s.workers[0].core, Some(0));
    assert_eq!(s.workers[1].core, None);
    assert_eq!(s.workers[1].qps[0].name, "server-qp");
    assert_eq!(s.workers[1].qps[0].counters.get("rx_msgs"), 5);
    let rtt = &s.workers[0].stages[1];
    assert_eq!((rtt.name.as_str(), rtt.kind.as_str(), rtt.counters.get("dropped")), ("rtt", "sink", 3));
    let (max, buckets) = rtt.latency.as_ref().expect("latency exported");
    assert_eq!((*max, buckets.iter().sum::<u64>()), (1200, 1));
    assert!(s.workers[0].stages[0].latency.is_none());

    drop(seg);
    assert!(!path.exists(), "the writer unlinks its segment");
    // A reader that had it open keeps a valid view; the workers' slots keep the memory.
    slots[0].worker.loops.add(1);
    assert_eq!(r.snapshot().workers[0].counters.get("loops"), 1001);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn a_second_segment_of_the_same_pipeline_in_one_process_is_refused() {
    let d = dir("twice");
    let (_seg, _slots) = create(&d);
    let e = StatsSegment::create(&d, "pipe", &shapes()).expect_err("second create");
    assert!(e.contains("already exports"), "{e}");
    assert_eq!(list(&d).unwrap().len(), 1, "no temporary file left behind");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn truncated_segments_are_refused() {
    let d = dir("truncated");
    let (seg, _slots) = create(&d);
    let path = seg.path().to_path_buf();
    let size = std::fs::metadata(&path).unwrap().len();
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.set_len(size - 8).unwrap();
    match open_err(&path) {
        SegmentError::Truncated { len, need, .. } => assert_eq!((len, need), (size - 8, size)),
        e => panic!("want Truncated, got {e}"),
    }
    f.set_len(100).unwrap();
    let e = open_err(&path);
    assert!(matches!(e, SegmentError::Truncated { len: 100, need: 256, .. }), "{e}");
    assert!(e.to_string().contains("truncated: the file has 100 bytes, 256 are needed"), "{e}");
    f.set_len(0).unwrap();
    assert!(matches!(open_err(&path), SegmentError::Truncated { len: 0, .. }));
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn bad_magic_version_and_schema_are_refused_with_their_reason() {
    let d = dir("magic");
    let (seg, _slots) = create(&d);
    let path = seg.path().to_path_buf();

    poke(&path, layout::H_VERSION, 99);
    let e = open_err(&path);
    assert!(matches!(e, SegmentError::Version { found: 99, .. }), "{e}");
    assert!(e.to_string().contains("layout version 99, but this dpctl reads version 1"), "{e}");
    poke(&path, layout::H_VERSION, layout::VERSION);

    poke(&path, layout::H_SCHEMA, layout::schema_hash() ^ 1);
    let e = open_err(&path);
    assert!(matches!(e, SegmentError::Schema { .. }), "{e}");
    assert!(e.to_string().contains("counters differ"), "{e}");
    poke(&path, layout::H_SCHEMA, layout::schema_hash());

    poke(&path, layout::H_MAGIC, u64::from_le_bytes(*b"NOTSTATS"));
    let e = open_err(&path);
    assert!(matches!(e, SegmentError::BadMagic { .. }), "{e}");
    assert!(e.to_string().starts_with(&format!("{}: not a dataplane stats segment", path.display())), "{e}");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn counts_offsets_and_names_outside_the_file_are_refused() {
    let d = dir("offsets");
    let (seg, _slots) = create(&d);
    let path = seg.path().to_path_buf();
    let size = std::fs::metadata(&path).unwrap().len();
    let qp_table = peek(&path, layout::H_QP_TABLE) as usize / 8;
    let stage_table = peek(&path, layout::H_STAGE_TABLE) as usize / 8;
    let rtt = stage_table + layout::DESC_WORDS; // the client's second stage
    let cases: Vec<(usize, u64, &str)> = vec![
        (layout::H_QP_TABLE, size, "the QP table at offset"),
        (qp_table + layout::D_COUNTERS, size, "extends past the end of the file"),
        (layout::H_WORKER_TABLE, 3, "the worker table at offset 3 is not 8-byte aligned"),
        (layout::H_WORKER_TABLE, 8, "the worker table at offset 8 overlaps the header"),
        (layout::H_STAGE_TABLE, 256, "the stage table at offset 256 overlaps the QP table"),
        (layout::H_QPS, 3, "the stage table at offset 768 overlaps the QP table"),
        (layout::H_WORKERS, 1 << 40, "1099511627776 workers (at most 65536)"),
        (layout::H_STAGES, 65536, "the stage table"),
        (qp_table + layout::D_COUNTERS, size - 8, "QP 0's counters at offset"),
        (qp_table + layout::D_COUNTERS, u64::MAX - 7, "QP 0's counters"),
        (qp_table + layout::D_OWNER, 2, "QP 0 belongs to worker 2, but there are 2"),
        (rtt + layout::D_LATENCY, size - 64, "stage 1's latency histogram"),
        (rtt + layout::D_NAME, u64::from_le_bytes([0xc3, 0x28, 0, 0, 0, 0, 0, 0]), "stage 1's name is not UTF-8"),
        (layout::H_FILE_SIZE, size + 4096, "truncated"),
        (layout::H_FILE_SIZE, size - 8, "the header says"),
    ];
    for (word, bad, want) in cases {
        let good = peek(&path, word);
        poke(&path, word, bad);
        let e = open_err(&path).to_string();
        assert!(e.contains(want), "word {word} = {bad}: want \"{want}\" in: {e}");
        assert!(e.starts_with(&path.display().to_string()), "the error names the file: {e}");
        poke(&path, word, good);
    }
    Segment::open(&path).expect("restored");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn no_value_in_any_header_or_descriptor_word_makes_the_reader_panic() {
    let d = dir("fuzz");
    let (seg, _slots) = create(&d);
    let path = seg.path().to_path_buf();
    let size = std::fs::metadata(&path).unwrap().len();
    let first_block = peek(&path, peek(&path, layout::H_WORKER_TABLE) as usize / 8 + layout::D_COUNTERS);
    let tables = layout::HEADER_WORDS..first_block as usize / 8;
    // Words whose every other value breaks the layout: the reader must refuse them all.
    use layout::*;
    let structural = |w: usize| {
        [H_MAGIC, H_VERSION, H_SCHEMA, H_FILE_SIZE, H_WORKER_TABLE, H_QP_TABLE, H_STAGE_TABLE].contains(&w)
            || (tables.contains(&w) && (w - HEADER_WORDS) % DESC_WORDS == D_COUNTERS)
    };
    let hostile = [0, 1, 7, 8, 255, 256, size - 8, size, size + 8, 1 << 32, 1 << 63, u64::MAX - 7, u64::MAX];
    let mut refused = 0;
    for word in 0..tables.end {
        let good = peek(&path, word);
        for bad in hostile.into_iter().filter(|&b| b != good) {
            poke(&path, word, bad);
            match Segment::open(&path) {
                Ok(s) => {
                    assert!(!structural(word), "word {word} = {bad} was accepted");
                    // Accepted (a name, a count that still fits, a reserved word): reading works.
                    assert_eq!(s.snapshot().workers.len(), 2, "word {word} = {bad}");
                }
                Err(e) => {
                    refused += 1;
                    assert!(e.to_string().starts_with(&path.display().to_string()), "{e}");
                }
            }
        }
        poke(&path, word, good);
    }
    assert!(refused >= 7 * 12 + 7 * 13, "the structural words alone give 175 refusals, got {refused}");
    Segment::open(&path).expect("restored");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn a_segment_of_a_dead_process_is_listed_as_stale() {
    let d = dir("stale");
    let (seg, _slots) = create(&d);
    let path = seg.path().to_path_buf();
    let live = list(&d).unwrap();
    assert_eq!(live.len(), 1);
    assert!(!live[0].stale());
    // A pid above the kernel's maximum (2^22) belongs to no process.
    poke(&path, layout::H_PID, 0x7fff_fff0);
    let listed = list(&d).unwrap();
    assert!(listed[0].segment.as_ref().is_ok_and(|s| !s.alive()));
    assert!(listed[0].stale());
    // Same pid, other start time: a later process that reused the pid.
    poke(&path, layout::H_PID, std::process::id() as u64);
    let t = peek(&path, layout::H_PROC_START);
    poke(&path, layout::H_PROC_START, t + 1);
    assert!(list(&d).unwrap()[0].stale());
    std::fs::remove_dir_all(&d).unwrap();
}

/// Issue 15, defect 3: a live segment cut short (`truncate -s 0`, a full file system) killed a
/// reader that had it mapped with SIGBUS. The reader reads the file instead: the snapshot
/// says it is truncated and the missing counters read 0; opening it again is a clear error.
#[test]
fn a_segment_cut_short_under_a_reader_is_reported_not_a_sigbus() {
    let d = dir("cut-short");
    let (seg, slots) = create(&d);
    let path = seg.path().to_path_buf();
    slots[0].worker.loops.add(42);
    let r = Segment::open(&path).expect("open");
    assert!(!r.snapshot().truncated);
    let full = std::fs::metadata(&path).unwrap().len();
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    file.set_len((layout::HEADER_WORDS * 8) as u64).unwrap();
    let s = r.snapshot();
    assert!(s.truncated, "a cut file must be reported");
    assert_eq!(s.workers[0].counters.get("loops"), 0, "counters past the end read 0");
    assert!(matches!(open_err(&path), SegmentError::Truncated { .. }));
    // Give the writer its pages back before it touches them again (it still has them mapped).
    file.set_len(full).unwrap();
    drop(seg);
    std::fs::remove_dir_all(&d).unwrap();
}

/// Issue 15, item 2: a SIGKILLed run cannot remove its segment; the next run on the host does
/// (when it starts, and when it ends), and never a live writer's segment.
#[test]
fn creating_a_segment_reaps_those_of_dead_writers_only() {
    let d = dir("reap");
    let (live, _slots) = create(&d);
    // A second "process": a segment under another name whose writer is made dead.
    let (dead, _dead_slots) = StatsSegment::create(&d, "reap-victim", &shapes()).expect("create the victim's segment");
    let dead_path = dead.path().to_path_buf();
    poke(&dead_path, layout::H_PID, 0x7fff_fff0);
    std::mem::forget(dead); // as after SIGKILL: no Drop, the file stays
    assert_eq!(super::read::reap_stale(&d), 1);
    assert!(!dead_path.exists(), "the dead writer's segment is reaped");
    assert!(live.path().exists(), "a live writer's segment is never reaped");
    // The same through a new segment's creation.
    let (dead2, _s) = StatsSegment::create(&d, "reap-victim-2", &shapes()).unwrap();
    let dead2_path = dead2.path().to_path_buf();
    poke(&dead2_path, layout::H_PID, 0x7fff_fff0);
    std::mem::forget(dead2);
    let (again, _s) = StatsSegment::create(&d, "reap-next", &shapes()).unwrap();
    assert!(!dead2_path.exists(), "a new run reaps stale segments when it starts");
    drop(again);
    drop(live);
    assert_eq!(std::fs::read_dir(&d).unwrap().count(), 0);
    std::fs::remove_dir_all(&d).unwrap();
}

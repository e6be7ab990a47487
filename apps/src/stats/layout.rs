//! The live-stats segment's layout, shared by the writer (`dataplane run`) and the reader
//! (`dpctl`). Everything is an 8-byte word in the host's byte order (the segment never leaves
//! the host); offsets are in bytes from the start of the file.
//!
//! ```text
//! header       HEADER_WORDS words: magic, version, schema, file size, pid, ..., name
//! workers      n_workers × DESC_WORDS: name, core, counters offset
//! qps          n_qps     × DESC_WORDS: name, worker index, counters offset
//! stages       n_stages  × DESC_WORDS: name, worker index, counters offset, latency offset, kind
//! counters     one block per worker, QP, stage and latency histogram, each 128-byte aligned
//! ```
//!
//! The header and descriptors are written once, before `magic` is stored (release); only the
//! counter blocks (and `state`) change afterwards.

use dataplane::worker::stats::{
    CounterBlock, LatencyBuckets, QpCounters, StageCounters, StatsShape, WorkerCounters, LATENCY_MAX_BITS,
    LATENCY_SUB_BITS,
};

/// The first word: "DPSTATS1" in the host's byte order.
pub const MAGIC: u64 = u64::from_le_bytes(*b"DPSTATS1");
/// Layout version: bump on any change of the header, descriptors or block placement.
pub const VERSION: u64 = 1;
/// Words of the header.
pub const HEADER_WORDS: usize = 32;
/// Words of one descriptor (worker, QP or stage).
pub const DESC_WORDS: usize = 16;
/// Words of a name (64 bytes: config names are at most 64 ASCII characters).
pub const NAME_WORDS: usize = 8;
/// Words of a stage kind (16 bytes).
pub const KIND_WORDS: usize = 2;
/// Counter blocks start on 128-byte boundaries (two cache lines: no false sharing between
/// workers, even with the adjacent-line prefetcher).
pub const BLOCK_ALIGN: usize = 128;
/// Most workers, QPs or stages a segment may describe (a sanity bound for readers).
pub const MAX_ENTRIES: u64 = 1 << 16;
/// "Unpinned" in a worker descriptor's core word.
pub const NO_CORE: u64 = u64::MAX;

/// Header word: [`MAGIC`], stored last with release ordering.
pub const H_MAGIC: usize = 0;
/// Header word: [`VERSION`].
pub const H_VERSION: usize = 1;
/// Header word: [`schema_hash`] of the writer.
pub const H_SCHEMA: usize = 2;
/// Header word: the file's size in bytes.
pub const H_FILE_SIZE: usize = 3;
/// Header word: the writer's process id.
pub const H_PID: usize = 4;
/// Header word: the writer's start time in clock ticks after boot (`/proc/PID/stat` field 22),
/// which tells a live writer from a later process that reused its pid.
pub const H_PROC_START: usize = 5;
/// Header word: when the segment was created, in nanoseconds since the Unix epoch.
pub const H_START_UNIX_NS: usize = 6;
/// Header word: the run's [`State`].
pub const H_STATE: usize = 7;
/// Header word: number of workers.
pub const H_WORKERS: usize = 8;
/// Header word: number of QPs.
pub const H_QPS: usize = 9;
/// Header word: number of stages.
pub const H_STAGES: usize = 10;
/// Header word: offset of the worker descriptors.
pub const H_WORKER_TABLE: usize = 11;
/// Header word: offset of the QP descriptors.
pub const H_QP_TABLE: usize = 12;
/// Header word: offset of the stage descriptors.
pub const H_STAGE_TABLE: usize = 13;
/// Header words: the pipeline's name (its fabric), [`NAME_WORDS`] long.
pub const H_NAME: usize = 16;

/// Descriptor words: the entry's name.
pub const D_NAME: usize = 0;
/// Descriptor word: the worker's core ([`NO_CORE`]), or the owning worker's index.
pub const D_OWNER: usize = 8;
/// Descriptor word: offset of the entry's counter block.
pub const D_COUNTERS: usize = 9;
/// Descriptor word: offset of a stage's latency block, 0 if it has none.
pub const D_LATENCY: usize = 10;
/// Descriptor words: a stage's kind, [`KIND_WORDS`] long.
pub const D_KIND: usize = 11;

/// What the run is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Workers are running (sources generating).
    Running,
    /// Sources stopped; waiting for messages in flight.
    Draining,
    /// A value this reader does not know.
    Unknown(u64),
}

impl State {
    /// The header word.
    pub fn word(self) -> u64 {
        match self {
            State::Running => 1,
            State::Draining => 2,
            State::Unknown(v) => v,
        }
    }

    /// From the header word.
    pub fn from_word(v: u64) -> State {
        match v {
            1 => State::Running,
            2 => State::Draining,
            v => State::Unknown(v),
        }
    }

    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            State::Running => "running",
            State::Draining => "draining",
            State::Unknown(_) => "unknown",
        }
    }
}

/// A hash (FNV-1a) of everything the layout depends on besides [`VERSION`]: the counter field
/// names of each block and the histogram's parameters. A reader built from other sources (a
/// counter added, renamed or moved) refuses the segment instead of misreading it.
pub fn schema_hash() -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |s: &str| {
        for b in s.bytes().chain([0]) {
            h ^= b as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    };
    for (block, fields) in
        [("worker", WorkerCounters::FIELDS), ("qp", QpCounters::FIELDS), ("stage", StageCounters::FIELDS)]
    {
        eat(block);
        fields.iter().for_each(|f| eat(f));
    }
    eat(&format!("latency {LATENCY_SUB_BITS} {LATENCY_MAX_BITS} {}", LatencyBuckets::WORDS));
    eat(&format!("header {HEADER_WORDS} desc {DESC_WORDS} name {NAME_WORDS} kind {KIND_WORDS}"));
    h
}

/// `s` as `words` words: UTF-8 bytes, cut at a character boundary to fit, zero-padded.
pub fn encode_str(s: &str, words: usize) -> Vec<u64> {
    let mut end = s.len().min(words * 8);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    let mut bytes = s.as_bytes()[..end].to_vec();
    bytes.resize(words * 8, 0);
    bytes.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8]))).collect()
}

/// The string in `words` (up to the first NUL); `None` if it is not UTF-8.
pub fn decode_str(words: &[u64]) -> Option<String> {
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8(bytes[..end].to_vec()).ok()
}

/// Where everything of a segment goes (the writer's plan).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// File size in bytes.
    pub size: usize,
    /// Offset of the worker descriptors.
    pub worker_table: usize,
    /// Offset of the QP descriptors.
    pub qp_table: usize,
    /// Offset of the stage descriptors.
    pub stage_table: usize,
    /// Counter block offset of each worker.
    pub workers: Vec<usize>,
    /// Counter block offset of each QP (workers' QPs in order).
    pub qps: Vec<usize>,
    /// Counter block offset of each stage (workers' stages in order).
    pub stages: Vec<usize>,
    /// Latency block offset of each stage that records latency.
    pub latency: Vec<Option<usize>>,
}

impl Plan {
    /// Lays out a segment for workers of these shapes.
    pub fn new(shapes: &[StatsShape]) -> Plan {
        let n_qps: usize = shapes.iter().map(|s| s.qps.len()).sum();
        let n_stages: usize = shapes.iter().map(|s| s.stages.len()).sum();
        let worker_table = HEADER_WORDS * 8;
        let qp_table = worker_table + shapes.len() * DESC_WORDS * 8;
        let stage_table = qp_table + n_qps * DESC_WORDS * 8;
        let mut at = (stage_table + n_stages * DESC_WORDS * 8).next_multiple_of(BLOCK_ALIGN);
        let mut take = |words: usize| {
            let off = at;
            at = (at + words * 8).next_multiple_of(BLOCK_ALIGN);
            off
        };
        let workers = shapes.iter().map(|_| take(WorkerCounters::WORDS)).collect();
        let qps = shapes.iter().flat_map(|s| &s.qps).map(|_| take(QpCounters::WORDS)).collect();
        let stages = shapes.iter().flat_map(|s| &s.stages).map(|_| take(StageCounters::WORDS)).collect();
        let latency =
            shapes.iter().flat_map(|s| &s.stages).map(|s| s.latency.then(|| take(LatencyBuckets::WORDS))).collect();
        Plan { size: at, worker_table, qp_table, stage_table, workers, qps, stages, latency }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_round_trip_and_are_cut_at_a_character_boundary() {
        assert_eq!(decode_str(&encode_str("client-qp", NAME_WORDS)).as_deref(), Some("client-qp"));
        let long = "é".repeat(40); // 80 bytes
        let cut = decode_str(&encode_str(&long, NAME_WORDS)).unwrap();
        assert_eq!(cut, "é".repeat(32));
        assert_eq!(decode_str(&[u64::from_le_bytes([0xff; 8])]), None);
    }

    #[test]
    fn blocks_are_aligned_and_disjoint() {
        use dataplane::worker::stats::StageShape;
        let stage = |l| StageShape { name: "s".into(), kind: "sink".into(), latency: l };
        let shapes = vec![
            StatsShape { name: "a".into(), core: Some(0), qps: vec!["q".into()], stages: vec![stage(true)] },
            StatsShape { name: "b".into(), core: None, qps: vec![], stages: vec![stage(false), stage(true)] },
        ];
        let p = Plan::new(&shapes);
        let mut blocks: Vec<(usize, usize)> = p.workers.iter().map(|&o| (o, WorkerCounters::WORDS)).collect();
        blocks.extend(p.qps.iter().map(|&o| (o, QpCounters::WORDS)));
        blocks.extend(p.stages.iter().map(|&o| (o, StageCounters::WORDS)));
        blocks.extend(p.latency.iter().flatten().map(|&o| (o, LatencyBuckets::WORDS)));
        assert_eq!(blocks.len(), 2 + 1 + 3 + 2);
        blocks.sort();
        assert!(blocks[0].0 >= p.stage_table + 3 * DESC_WORDS * 8);
        for w in blocks.windows(2) {
            assert!(w[0].0 + w[0].1 * 8 <= w[1].0, "{w:?} overlap");
        }
        assert!(blocks.iter().all(|&(o, _)| o % BLOCK_ALIGN == 0));
        let (o, n) = blocks[blocks.len() - 1];
        assert!(o + n * 8 <= p.size);
    }
}

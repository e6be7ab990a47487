//! The reader: opens a segment, validates it completely, and takes snapshots.
//!
//! Validation happens once, at [`Segment::open`]: the file must be at least a header long,
//! carry the magic, this layout version and this build's schema hash, be exactly as long as
//! its header says, and every count, table and counter-block offset must lie inside the file
//! (checked arithmetic: no overflow). A bad segment is a [`SegmentError`] naming the file and
//! what is wrong; reading never panics. The file is read, never mapped (`map.rs` says why): a
//! segment cut short while open is reported ([`Snapshot::truncated`]), never a SIGBUS. Each
//! snapshot is one fresh read of the file: the set is not one instant (a worker may move
//! while it is copied).

use super::layout::{self, decode_str, State};
use super::map::{ReadOnly, Words};
use super::{pid_of_file_name, proc_start_ticks, writer_alive, PREFIX};
use dataplane::worker::stats::{CounterBlock, LatencyBuckets, QpCounters, StageCounters, WorkerCounters};
use std::fmt;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Why a segment cannot be read.
#[derive(Debug)]
pub enum SegmentError {
    /// Opening, sizing or mapping the file failed.
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        err: io::Error,
    },
    /// The file is shorter than its header or than its header says.
    Truncated {
        /// The file.
        path: PathBuf,
        /// Its length.
        len: u64,
        /// The length needed.
        need: u64,
    },
    /// The first word is not the magic.
    BadMagic {
        /// The file.
        path: PathBuf,
    },
    /// Another layout version.
    Version {
        /// The file.
        path: PathBuf,
        /// Its version.
        found: u64,
    },
    /// Same version, but the counters differ from this build's.
    Schema {
        /// The file.
        path: PathBuf,
    },
    /// A count, offset or name is out of bounds or invalid.
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong, and where.
        what: String,
    },
}

impl fmt::Display for SegmentError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SegmentError::Io { path, err } => write!(f, "{}: {err}", path.display()),
            SegmentError::Truncated { path, len, need } => {
                write!(f, "{}: truncated: the file has {len} bytes, {need} are needed", path.display())
            }
            SegmentError::BadMagic { path } => {
                write!(f, "{}: not a dataplane stats segment (bad magic number)", path.display())
            }
            SegmentError::Version { path, found } => write!(
                f,
                "{}: layout version {found}, but this dpctl reads version {}: use the dpctl built with the \
                 dataplane that wrote it",
                path.display(),
                layout::VERSION
            ),
            SegmentError::Schema { path } => write!(
                f,
                "{}: its counters differ from this dpctl's (built from other sources): use the dpctl built with \
                 the dataplane that wrote it",
                path.display()
            ),
            SegmentError::Corrupt { path, what } => write!(f, "{}: corrupt segment: {what}", path.display()),
        }
    }
}

impl std::error::Error for SegmentError {}

/// The header of a segment.
#[derive(Debug, Clone)]
pub struct Header {
    /// The writer's pid.
    pub pid: u64,
    /// The writer's start time (clock ticks after boot).
    pub proc_start: u64,
    /// When the segment was created (ns since the Unix epoch).
    pub start_unix_ns: u64,
    /// The pipeline's name.
    pub name: String,
}

#[derive(Debug, Clone)]
struct WorkerDesc {
    name: String,
    core: Option<u64>,
    counters: usize,
}

#[derive(Debug, Clone)]
struct QpDesc {
    name: String,
    worker: usize,
    counters: usize,
}

#[derive(Debug, Clone)]
struct StageDesc {
    name: String,
    kind: String,
    worker: usize,
    counters: usize,
    latency: Option<usize>,
}

/// An open, validated segment.
pub struct Segment {
    path: PathBuf,
    map: ReadOnly,
    /// The words read at open, which `validate` checked.
    words: Words,
    header: Header,
    workers: Vec<WorkerDesc>,
    qps: Vec<QpDesc>,
    stages: Vec<StageDesc>,
}

impl fmt::Debug for Segment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Segment").field("path", &self.path).field("header", &self.header).finish()
    }
}

/// Counter values of one block, in the block's field order.
#[derive(Debug, Clone)]
pub struct Values {
    /// Field names.
    pub fields: &'static [&'static str],
    /// Values, one per field.
    pub values: Vec<u64>,
}

impl Values {
    /// The value of `field` (0 if there is no such field).
    pub fn get(&self, field: &str) -> u64 {
        self.fields.iter().position(|f| *f == field).and_then(|i| self.values.get(i)).copied().unwrap_or(0)
    }
}

/// A QP in a snapshot.
#[derive(Debug, Clone)]
pub struct QpSnap {
    /// Name.
    pub name: String,
    /// Counters ([`QpCounters::FIELDS`]).
    pub counters: Values,
}

/// A stage in a snapshot.
#[derive(Debug, Clone)]
pub struct StageSnap {
    /// Name.
    pub name: String,
    /// Kind.
    pub kind: String,
    /// Counters ([`StageCounters::FIELDS`]).
    pub counters: Values,
    /// Latency histogram: the maximum and the bucket counts ([`LatencyBuckets`]).
    pub latency: Option<(u64, Vec<u64>)>,
}

/// A worker in a snapshot, with its QPs and stages.
#[derive(Debug, Clone)]
pub struct WorkerSnap {
    /// Name.
    pub name: String,
    /// Pinned core.
    pub core: Option<u64>,
    /// Counters ([`WorkerCounters::FIELDS`]).
    pub counters: Values,
    /// Its QPs.
    pub qps: Vec<QpSnap>,
    /// Its stages.
    pub stages: Vec<StageSnap>,
}

/// All counters of a segment at (about) one moment.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// Time since the segment was created.
    pub uptime: Duration,
    /// What the run was doing.
    pub state: State,
    /// Per worker.
    pub workers: Vec<WorkerSnap>,
    /// The file was shorter than at open (cut short while running, by something other than
    /// its writer) or could not be read: the missing counters read 0.
    pub truncated: bool,
}

type Res<T> = Result<T, SegmentError>;

impl Segment {
    /// Opens and validates the segment at `path`.
    pub fn open(path: &Path) -> Res<Segment> {
        let path = path.to_path_buf();
        let io_err = |err| SegmentError::Io { path: path.clone(), err };
        let file = File::open(&path).map_err(io_err)?;
        let len = file.metadata().map_err(io_err)?.len();
        let need = (layout::HEADER_WORDS * 8) as u64;
        if len < need {
            return Err(SegmentError::Truncated { path, len, need });
        }
        let bytes = usize::try_from(len).map_err(|_| io_err(io::Error::other("file too large to map")))?;
        let map = ReadOnly::open(file, bytes);
        let words = map.read().map_err(io_err)?;
        if words.short() {
            // Cut short between the length check and the read.
            return Err(SegmentError::Truncated { path, len: words.len() as u64 * 8, need: len });
        }
        let mut seg = Segment {
            path,
            map,
            words,
            header: Header { pid: 0, proc_start: 0, start_unix_ns: 0, name: String::new() },
            workers: Vec::new(),
            qps: Vec::new(),
            stages: Vec::new(),
        };
        seg.validate(len)?;
        Ok(seg)
    }

    fn corrupt(&self, what: String) -> SegmentError {
        SegmentError::Corrupt { path: self.path.clone(), what }
    }

    /// Word `i`, relaxed (after the acquire load of the magic in `validate`).
    fn word(&self, i: usize) -> Res<u64> {
        self.words.load(i).ok_or_else(|| self.corrupt(format!("word {i} is past the end")))
    }

    fn string(&self, at: usize, words: usize, what: &str) -> Res<String> {
        let w = (at..at + words).map(|i| self.word(i)).collect::<Res<Vec<u64>>>()?;
        decode_str(&w).ok_or_else(|| self.corrupt(format!("{what} is not UTF-8")))
    }

    /// The word index of a `words`-word block at byte offset `off`, checked against the file
    /// and against what precedes it (`start`: the end of the header or of the tables).
    fn block(&self, off: u64, words: usize, what: &str, start: (u64, &str)) -> Res<usize> {
        let len = self.words.len() as u64 * 8;
        let why = if off % 8 != 0 {
            "is not 8-byte aligned".to_string()
        } else if off < start.0 {
            format!("overlaps {}", start.1)
        } else if off.checked_add(words as u64 * 8).is_none_or(|end| end > len) {
            format!("({words} words) extends past the end of the file ({len} bytes)")
        } else {
            return Ok((off / 8) as usize);
        };
        Err(self.corrupt(format!("{what} at offset {off} {why}")))
    }

    fn validate(&mut self, len: u64) -> Res<()> {
        use layout::*;
        let path = self.path.clone();
        // The read system call ordered the copy after the writer's release store of the
        // magic: with the magic, the header is complete.
        if self.words.load(H_MAGIC) != Some(MAGIC) {
            return Err(SegmentError::BadMagic { path });
        }
        let version = self.word(H_VERSION)?;
        if version != VERSION {
            return Err(SegmentError::Version { path, found: version });
        }
        if self.word(H_SCHEMA)? != schema_hash() {
            return Err(SegmentError::Schema { path });
        }
        let size = self.word(H_FILE_SIZE)?;
        if size > len {
            return Err(SegmentError::Truncated { path, len, need: size });
        }
        if size != len {
            return Err(self.corrupt(format!("the header says {size} bytes, the file has {len}")));
        }
        let count = |h: usize, what: &str| -> Res<usize> {
            let n = self.word(h)?;
            if n > MAX_ENTRIES {
                return Err(self.corrupt(format!("{n} {what} (at most {MAX_ENTRIES})")));
            }
            Ok(n as usize)
        };
        let (nw, nq, ns) = (count(H_WORKERS, "workers")?, count(H_QPS, "QPs")?, count(H_STAGES, "stages")?);
        // The tables follow each other, then the counter blocks: nothing may overlap.
        let header = ((HEADER_WORDS * 8) as u64, "the header");
        let wt = self.block(self.word(H_WORKER_TABLE)?, nw * DESC_WORDS, "the worker table", header)?;
        let after_wt = (((wt + nw * DESC_WORDS) * 8) as u64, "the worker table");
        let qt = self.block(self.word(H_QP_TABLE)?, nq * DESC_WORDS, "the QP table", after_wt)?;
        let after_qt = (((qt + nq * DESC_WORDS) * 8) as u64, "the QP table");
        let st = self.block(self.word(H_STAGE_TABLE)?, ns * DESC_WORDS, "the stage table", after_qt)?;
        let tables = (((st + ns * DESC_WORDS) * 8) as u64, "the descriptor tables");
        self.header = Header {
            pid: self.word(H_PID)?,
            proc_start: self.word(H_PROC_START)?,
            start_unix_ns: self.word(H_START_UNIX_NS)?,
            name: self.string(H_NAME, NAME_WORDS, "the pipeline name")?,
        };
        for i in 0..nw {
            let d = wt + i * DESC_WORDS;
            let what = format!("worker {i}");
            let core = self.word(d + D_OWNER)?;
            self.workers.push(WorkerDesc {
                name: self.string(d + D_NAME, NAME_WORDS, &format!("{what}'s name"))?,
                core: (core != NO_CORE).then_some(core),
                counters: self.block(
                    self.word(d + D_COUNTERS)?,
                    WorkerCounters::WORDS,
                    &format!("{what}'s counters"),
                    tables,
                )?,
            });
        }
        let owner = |seg: &Segment, d: usize, what: &str| -> Res<usize> {
            let w = seg.word(d + D_OWNER)?;
            if w >= nw as u64 {
                return Err(seg.corrupt(format!("{what} belongs to worker {w}, but there are {nw}")));
            }
            Ok(w as usize)
        };
        for i in 0..nq {
            let d = qt + i * DESC_WORDS;
            let what = format!("QP {i}");
            let qp = QpDesc {
                name: self.string(d + D_NAME, NAME_WORDS, &format!("{what}'s name"))?,
                worker: owner(self, d, &what)?,
                counters: self.block(
                    self.word(d + D_COUNTERS)?,
                    QpCounters::WORDS,
                    &format!("{what}'s counters"),
                    tables,
                )?,
            };
            self.qps.push(qp);
        }
        for i in 0..ns {
            let d = st + i * DESC_WORDS;
            let what = format!("stage {i}");
            let lat = self.word(d + D_LATENCY)?;
            let stage = StageDesc {
                name: self.string(d + D_NAME, NAME_WORDS, &format!("{what}'s name"))?,
                kind: self.string(d + D_KIND, KIND_WORDS, &format!("{what}'s kind"))?,
                worker: owner(self, d, &what)?,
                counters: self.block(
                    self.word(d + D_COUNTERS)?,
                    StageCounters::WORDS,
                    &format!("{what}'s counters"),
                    tables,
                )?,
                latency: match lat {
                    0 => None,
                    off => {
                        Some(self.block(off, LatencyBuckets::WORDS, &format!("{what}'s latency histogram"), tables)?)
                    }
                },
            };
            self.stages.push(stage);
        }
        Ok(())
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The header.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// Whether the writer is still running (same pid and start time).
    pub fn alive(&self) -> bool {
        writer_alive(self.header.pid, self.header.proc_start)
    }

    /// Names of the workers, in order.
    pub fn worker_names(&self) -> Vec<&str> {
        self.workers.iter().map(|w| w.name.as_str()).collect()
    }

    fn values(words: &Words, fields: &'static [&'static str], at: usize) -> Values {
        // In bounds of the file as validated at open; a word past the end of a file cut short
        // since reads as 0, never panics.
        let values = (0..fields.len()).map(|i| words.load(at + i).unwrap_or(0)).collect();
        Values { fields, values }
    }

    /// Reads every counter now. A file cut short since it was opened (or unreadable) gives
    /// zeros for what is missing and says so in [`Snapshot::truncated`].
    pub fn snapshot(&self) -> Snapshot {
        let (words, truncated) = match self.map.read() {
            Ok(w) => {
                let short = w.short();
                (w, short)
            }
            Err(_) => (Words::default(), true),
        };
        let words = &words;
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        let uptime = now.saturating_sub(Duration::from_nanos(self.header.start_unix_ns));
        let state = State::from_word(words.load(layout::H_STATE).unwrap_or(0));
        let workers = self
            .workers
            .iter()
            .enumerate()
            .map(|(wi, w)| WorkerSnap {
                name: w.name.clone(),
                core: w.core,
                counters: Self::values(words, WorkerCounters::FIELDS, w.counters),
                qps: self
                    .qps
                    .iter()
                    .filter(|q| q.worker == wi)
                    .map(|q| QpSnap {
                        name: q.name.clone(),
                        counters: Self::values(words, QpCounters::FIELDS, q.counters),
                    })
                    .collect(),
                stages: self
                    .stages
                    .iter()
                    .filter(|s| s.worker == wi)
                    .map(|s| StageSnap {
                        name: s.name.clone(),
                        kind: s.kind.clone(),
                        counters: Self::values(words, StageCounters::FIELDS, s.counters),
                        latency: s.latency.map(|at| {
                            let load = |i| words.load(i).unwrap_or(0);
                            (load(at), (1..LatencyBuckets::WORDS).map(|i| load(at + i)).collect())
                        }),
                    })
                    .collect(),
            })
            .collect();
        Snapshot { uptime, state, workers, truncated }
    }
}

/// A file found by [`list`]: its path and the segment, or why it cannot be read.
#[derive(Debug)]
pub struct Listed {
    /// The file.
    pub path: PathBuf,
    /// The open segment, or the error.
    pub segment: Res<Segment>,
}

impl Listed {
    /// Whether the writer is gone: the header's process (or, for an unreadable file, the pid
    /// in its name) is not running.
    pub fn stale(&self) -> bool {
        match &self.segment {
            Ok(s) => !s.alive(),
            Err(_) => {
                let name = self.path.file_name().and_then(|n| n.to_str()).unwrap_or("");
                pid_of_file_name(name).is_some_and(|pid| proc_start_ticks(pid).is_none())
            }
        }
    }
}

/// The segment files in `dir` whose writer is gone ([`Listed::stale`]), sorted by name.
pub fn stale_segments(dir: &Path) -> io::Result<Vec<PathBuf>> {
    Ok(list(dir)?.into_iter().filter(Listed::stale).map(|l| l.path).collect())
}

/// Removes the segments in `dir` whose writer is gone, and returns how many went. Every run
/// does this when it starts and when it ends, so a pipeline killed with SIGKILL (which cannot
/// remove its own segment) leaves its file only until the next run on the host ends — for
/// example the surviving peer's. A live writer's segment is never touched (its process and
/// start time are checked), and a file that disappears meanwhile is not an error.
pub fn reap_stale(dir: &Path) -> usize {
    let Ok(stale) = stale_segments(dir) else { return 0 };
    stale.iter().filter(|p| std::fs::remove_file(p).is_ok()).count()
}

/// Every segment file in `dir` (names starting with [`PREFIX`]), sorted by name.
pub fn list(dir: &Path) -> io::Result<Vec<Listed>> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_str().is_some_and(|n| n.starts_with(PREFIX)))
        .map(|e| e.path())
        .collect();
    paths.sort();
    Ok(paths.into_iter().map(|p| Listed { segment: Segment::open(&p), path: p }).collect())
}

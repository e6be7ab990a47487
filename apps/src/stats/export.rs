//! The writer: creates a run's segment, moves the workers' counters into it, unlinks it at
//! the end.
//!
//! Creation is atomic for readers: the file is created (mode 0600) under a hidden temporary
//! name, sized, mapped and filled (descriptors, names; `magic` last, with a release store),
//! and only then linked under its final name. A reader can never see a half-written header.

use super::layout::{self, Plan, State};
use super::map::Mapping;
use super::{file_name, proc_start_ticks};
use dataplane::worker::stats::{Slot, StatsShape, WorkerSlots};
use dataplane::worker::Worker;
use dataplane::Provider;
use std::fs::{File, OpenOptions, Permissions};
use std::io;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// A run's live-stats segment. Dropping it unlinks the file (readers that have it mapped
/// keep their view; the memory goes when the last worker's counters and reader are gone).
pub struct StatsSegment {
    map: Arc<Mapping>,
    path: PathBuf,
}

impl std::fmt::Debug for StatsSegment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatsSegment").field("path", &self.path).finish()
    }
}

/// Creates the segment of pipeline `name` in `dir` and moves the counters of `workers` into
/// it. On error nothing is left behind and the workers keep their own counters.
pub fn export<P: Provider>(workers: &mut [Worker<P>], dir: &Path, name: &str) -> Result<StatsSegment, String> {
    let shapes: Vec<StatsShape> = workers.iter().map(|w| w.stats_shape()).collect();
    let (seg, slots) = StatsSegment::create(dir, name, &shapes)?;
    for (w, s) in workers.iter_mut().zip(slots) {
        w.move_stats(s).map_err(|e| format!("stats segment {}: {e}", seg.path.display()))?;
    }
    Ok(seg)
}

static TMP_SEQ: AtomicU64 = AtomicU64::new(0);

impl StatsSegment {
    /// Creates the segment for workers of `shapes` and returns the counter slots inside it,
    /// one [`WorkerSlots`] per shape.
    pub fn create(dir: &Path, name: &str, shapes: &[StatsShape]) -> Result<(StatsSegment, Vec<WorkerSlots>), String> {
        let pid = std::process::id();
        // Segments of runs that were SIGKILLed (see `read::reap_stale`).
        super::read::reap_stale(dir);
        let path = dir.join(file_name(name, pid));
        let tmp = dir.join(format!(".{}.{}.tmp", file_name(name, pid), TMP_SEQ.fetch_add(1, Ordering::Relaxed)));
        let fail = |what: &str, e: io::Error| {
            format!(
                "cannot create the live-stats segment {}: {what}: {e} (set DATAPLANE_STATS_DIR to another \
                 directory, or run with --no-stats)",
                path.display()
            )
        };
        let plan = Plan::new(shapes);
        let file = create_file(&tmp, plan.size).map_err(|e| fail("create", e))?;
        let map = match Mapping::create(&file, plan.size) {
            Ok(m) => Arc::new(m),
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                return Err(fail("mmap", e));
            }
        };
        drop(file); // the mapping keeps the file's pages
        write_tables(&map, &plan, name, shapes);
        if let Err(e) = publish(&tmp, &path, &map) {
            let _ = std::fs::remove_file(&tmp);
            return Err(fail("publish", e));
        }
        let seg = StatsSegment { map, path };
        let slots = seg.slots(&plan, shapes).ok_or_else(|| format!("{}: counter blocks outside the plan", name))?;
        Ok((seg, slots))
    }

    /// The segment's file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Tells readers what the run is doing.
    pub fn set_state(&self, s: State) {
        self.map.store(layout::H_STATE, s.word(), Ordering::Relaxed);
    }

    fn slots(&self, plan: &Plan, shapes: &[StatsShape]) -> Option<Vec<WorkerSlots>> {
        let (mut q, mut s) = (0, 0);
        let mut out = Vec::new();
        for (wi, shape) in shapes.iter().enumerate() {
            let (nq, ns) = (shape.qps.len(), shape.stages.len());
            let worker = Slot::in_words(&self.map, plan.workers[wi] / 8)?;
            let qps = plan.qps[q..q + nq].iter().map(|&o| Slot::in_words(&self.map, o / 8)).collect::<Option<_>>()?;
            let stages =
                plan.stages[s..s + ns].iter().map(|&o| Slot::in_words(&self.map, o / 8)).collect::<Option<_>>()?;
            let latency = plan.latency[s..s + ns]
                .iter()
                .map(|o| o.map(|o| Slot::in_words(&self.map, o / 8).ok_or(())).transpose())
                .collect::<Result<_, _>>()
                .ok()?;
            out.push(WorkerSlots { worker, qps, stages, latency });
            (q, s) = (q + nq, s + ns);
        }
        Some(out)
    }
}

impl Drop for StatsSegment {
    fn drop(&mut self) {
        // Nobody else removes or replaces a live segment (`dpctl clean` and the reaper take
        // stale ones only; `publish` refuses a second one of this process), so the file is ours.
        let _ = std::fs::remove_file(&self.path);
        // And those of peers that died (SIGKILL) while we ran: see `read::reap_stale`.
        if let Some(dir) = self.path.parent() {
            super::read::reap_stale(dir);
        }
    }
}

fn create_file(path: &Path, size: usize) -> io::Result<File> {
    let file = OpenOptions::new().read(true).write(true).create_new(true).mode(0o600).open(path)?;
    // The umask may have removed bits from 0600; set exactly 0600 (no group or other access).
    let res = file.set_permissions(Permissions::from_mode(0o600)).and_then(|()| file.set_len(size as u64));
    if let Err(e) = res {
        let _ = std::fs::remove_file(path);
        return Err(e);
    }
    Ok(file)
}

fn write_tables(map: &Mapping, plan: &Plan, name: &str, shapes: &[StatsShape]) {
    use layout::*;
    let put = |word: usize, v: u64| map.store(word, v, Ordering::Relaxed);
    let put_str = |word: usize, s: &str, words: usize| {
        for (i, w) in encode_str(s, words).into_iter().enumerate() {
            put(word + i, w);
        }
    };
    let pid = std::process::id();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let n_qps: usize = shapes.iter().map(|s| s.qps.len()).sum();
    let n_stages: usize = shapes.iter().map(|s| s.stages.len()).sum();
    put(H_VERSION, VERSION);
    put(H_SCHEMA, schema_hash());
    put(H_FILE_SIZE, plan.size as u64);
    put(H_PID, pid as u64);
    put(H_PROC_START, proc_start_ticks(pid).unwrap_or(0));
    put(H_START_UNIX_NS, now.as_nanos() as u64);
    put(H_STATE, State::Running.word());
    put(H_WORKERS, shapes.len() as u64);
    put(H_QPS, n_qps as u64);
    put(H_STAGES, n_stages as u64);
    put(H_WORKER_TABLE, plan.worker_table as u64);
    put(H_QP_TABLE, plan.qp_table as u64);
    put(H_STAGE_TABLE, plan.stage_table as u64);
    put_str(H_NAME, name, NAME_WORDS);
    let (mut q, mut s) = (0, 0);
    for (wi, shape) in shapes.iter().enumerate() {
        let d = plan.worker_table / 8 + wi * DESC_WORDS;
        put_str(d + D_NAME, &shape.name, NAME_WORDS);
        put(d + D_OWNER, shape.core.map_or(NO_CORE, |c| c as u64));
        put(d + D_COUNTERS, plan.workers[wi] as u64);
        for qp in &shape.qps {
            let d = plan.qp_table / 8 + q * DESC_WORDS;
            put_str(d + D_NAME, qp, NAME_WORDS);
            put(d + D_OWNER, wi as u64);
            put(d + D_COUNTERS, plan.qps[q] as u64);
            q += 1;
        }
        for st in &shape.stages {
            let d = plan.stage_table / 8 + s * DESC_WORDS;
            put_str(d + D_NAME, &st.name, NAME_WORDS);
            put(d + D_OWNER, wi as u64);
            put(d + D_COUNTERS, plan.stages[s] as u64);
            put(d + D_LATENCY, plan.latency[s].unwrap_or(0) as u64);
            put_str(d + D_KIND, &st.kind, KIND_WORDS);
            s += 1;
        }
    }
    // Publish: a reader that sees the magic (acquire) sees everything above.
    map.store(H_MAGIC, MAGIC, Ordering::Release);
}

/// Links the filled file under its final name. A file already there has our pid in its name,
/// so it is either a stale segment of a dead process that had our pid (replaced) or one of
/// ours still in use (another run of the same pipeline in this process: refused).
fn publish(tmp: &Path, path: &Path, map: &Mapping) -> io::Result<()> {
    match std::fs::hard_link(tmp, path) {
        Ok(()) => std::fs::remove_file(tmp),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            if let Ok(seg) = super::read::Segment::open(path) {
                let h = seg.header();
                if h.pid == map.load(layout::H_PID) && h.proc_start == map.load(layout::H_PROC_START) {
                    return Err(io::Error::new(
                        io::ErrorKind::AlreadyExists,
                        "this process already exports a pipeline of that name",
                    ));
                }
            }
            std::fs::rename(tmp, path)
        }
        Err(e) => Err(e),
    }
}

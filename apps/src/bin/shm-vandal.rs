//! `shm-vandal`: a hostile process for testing. It attaches to a running `shm` fabric file
//! (`/dev/shm/dataplane.NAME`) read-write and writes garbage into one chosen part of it (the
//! header, ring indices, ring sequence words, CQEs, the control-path lock word, the MR table),
//! or truncates the file, so a test can check that the victim processes never crash, never
//! spin forever and never touch memory outside their mappings (docs/reliability.md).
//!
//! It knows the fabric layout from `dataplane/src/shm/layout.rs` and `ring.rs` (crate-private
//! there, so mirrored in [`lay`]); before writing anything it checks that layout against the
//! live file (magic, version, size, a published receive queue or SRQ whose ring lies in the
//! arena), so a layout change makes it refuse with a sentence instead of scribbling
//! somewhere meaningless.
//!
//! Exit status: 0 when the garbage was written, 1 with a sentence on stderr otherwise.

use clap::Parser;
use std::fs::OpenOptions;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

#[derive(Parser, Debug)]
#[command(about = "Write garbage into a live shm fabric (a fault-injection test tool)")]
struct Args {
    /// Fabric name (the file is /dev/shm/dataplane.NAME, else /dev/hugepages/dataplane.NAME).
    #[arg(long)]
    fabric: String,
    /// What to damage: header, rings, seq, cqe, lock, mr or truncate.
    #[arg(long)]
    target: String,
    /// Seed of the garbage (the same seed writes the same values at the same places).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Rounds of writes (the victim may repair a word; later rounds write it again).
    #[arg(long, default_value_t = 20)]
    rounds: u32,
    /// Milliseconds between rounds.
    #[arg(long, default_value_t = 25)]
    interval_ms: u64,
    /// Seconds to wait for the fabric file to appear with a published receive queue or SRQ.
    #[arg(long, default_value_t = 10)]
    wait: u64,
}

/// The fabric layout, mirrored from `dataplane::shm::layout` (all offsets from the file's
/// start). Checked against the live file by [`Fabric::check_layout`].
mod lay {
    pub const MAGIC: u64 = 0x6470_6661_6272_6963;
    pub const VERSION: u32 = 9;
    // Header fields.
    pub const H_VERSION: usize = 8;
    pub const H_SIZE: usize = 16;
    pub const H_LOCK: usize = 32;
    /// Header words a vandal may hit (magic .. arena_end), the lock word excluded.
    pub const H_WORDS: [usize; 8] = [0, 8, 16, 24, 40, 48, 56, 64];
    pub const H_EXTENTS: usize = 72;
    pub const MAX_EXTENTS: usize = 1024;
    // Tables.
    pub const QP_TABLE: usize = 24_576;
    pub const QP_SLOT: usize = 256;
    pub const MAX_QP: usize = 1024;
    pub const CQ_TABLE: usize = 286_720;
    pub const CQ_SLOT: usize = 64;
    pub const MAX_CQ: usize = 1024;
    pub const SRQ_TABLE: usize = 352_256;
    pub const SRQ_SLOT: usize = 64;
    pub const MAX_SRQ: usize = 256;
    pub const MR_TABLE: usize = 368_640;
    pub const MR_SLOT: usize = 64;
    pub const MAX_MR: usize = 4096;
    pub const ARENA: usize = 2 << 20;
    // QP slot fields.
    pub const QP_RQ_OFF: usize = 32;
    pub const QP_RQ_CAP: usize = 40;
    pub const QP_RQ_SGE: usize = 44;
    // CQ slot fields.
    pub const CQ_CAP: usize = 12;
    pub const CQ_RING_OFF: usize = 16;
    // SRQ slot fields.
    pub const SRQ_CAP: usize = 16;
    pub const SRQ_MAX_SGE: usize = 20;
    pub const SRQ_RING_OFF: usize = 24;
    // Rings: head at 0, tail at 128, cells from 256, each an 8-byte sequence then payload.
    pub const RING_TAIL: usize = 128;
    pub const RING_CELLS: usize = 256;
    pub const CQE_STRIDE: usize = 64;

    /// Receive-ring cell stride for `max_sge` SGEs.
    pub fn recv_stride(max_sge: u32) -> usize {
        (8 + 16 + 16 * max_sge.clamp(1, 64) as usize).next_multiple_of(64)
    }
}

/// A ring found in the fabric: where it is and its geometry.
#[derive(Clone, Copy, Debug)]
struct RingAt {
    off: usize,
    cap: usize,
    stride: usize,
}

/// The fabric file, mapped read-write.
struct Fabric {
    base: *mut u8,
    len: usize,
    file: std::fs::File,
    path: String,
}

impl Drop for Fabric {
    fn drop(&mut self) {
        // SAFETY: base/len are the mapping made in `open`, unmapped once here.
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

impl Fabric {
    fn open(name: &str) -> Result<Fabric, String> {
        let candidates = [format!("/dev/shm/dataplane.{name}"), format!("/dev/hugepages/dataplane.{name}")];
        let Some(path) = candidates.iter().find(|p| std::path::Path::new(p).exists()) else {
            return Err(format!("no fabric file {} (nor {})", candidates[0], candidates[1]));
        };
        let file = OpenOptions::new().read(true).write(true).open(path).map_err(|e| format!("{path}: {e}"))?;
        let len = file.metadata().map_err(|e| format!("{path}: {e}"))?.len() as usize;
        if len < lay::ARENA {
            return Err(format!("{path}: {len} bytes, smaller than the fabric tables ({} bytes)", lay::ARENA));
        }
        // SAFETY: FFI; a shared read-write mapping of the whole file, checked for failure
        // below. A concurrent truncation by someone else could fault our later accesses; this
        // is a test tool run against fabrics it alone damages.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(format!("{path}: mmap: {}", std::io::Error::last_os_error()));
        }
        Ok(Fabric { base: p.cast(), len, file, path: path.clone() })
    }

    fn u64_at(&self, off: usize) -> &AtomicU64 {
        assert!(off % 8 == 0 && off + 8 <= self.len, "shm-vandal: offset {off} outside the mapping");
        // SAFETY: in bounds and aligned (checked above); the mapping lives as long as `self`;
        // the fabric's words are atomics in every process that maps it.
        unsafe { AtomicU64::from_ptr(self.base.add(off).cast()) }
    }

    fn u32_at(&self, off: usize) -> &AtomicU32 {
        assert!(off % 4 == 0 && off + 4 <= self.len, "shm-vandal: offset {off} outside the mapping");
        // SAFETY: as in `u64_at`.
        unsafe { AtomicU32::from_ptr(self.base.add(off).cast()) }
    }

    /// Whether `[off, off + len)` lies in the arena of this file.
    fn in_arena(&self, off: usize, len: usize) -> bool {
        off >= lay::ARENA && off % 128 == 0 && off.checked_add(len).is_some_and(|e| e <= self.len)
    }

    /// Checks the mirrored layout against the file; `Ok(false)` while no receive ring is published yet.
    fn check_layout(&self) -> Result<bool, String> {
        let magic = self.u64_at(0).load(Ordering::Acquire);
        if magic != lay::MAGIC {
            return Ok(false); // still being created
        }
        let version = self.u32_at(lay::H_VERSION).load(Ordering::Relaxed);
        if version != lay::VERSION {
            return Err(format!("{}: layout version {version}, this vandal knows {}", self.path, lay::VERSION));
        }
        let size = self.u64_at(lay::H_SIZE).load(Ordering::Relaxed);
        if size != self.len as u64 {
            return Err(format!("{}: header says {size} bytes, the file has {}", self.path, self.len));
        }
        Ok(!self.rq_rings().is_empty() || !self.srq_rings().is_empty())
    }

    /// Rings from a table: `(table, slot, count, key field, cap field, off field, stride)`.
    fn rings_in(
        &self,
        table: usize,
        slot: usize,
        n: usize,
        cap_at: usize,
        off_at: usize,
        stride: impl Fn(usize) -> usize,
    ) -> Vec<RingAt> {
        let mut v = Vec::new();
        for i in 0..n {
            let s = table + i * slot;
            if self.u32_at(s).load(Ordering::Acquire) == 0 {
                continue;
            }
            let cap = self.u32_at(s + cap_at).load(Ordering::Relaxed) as usize;
            let off = self.u64_at(s + off_at).load(Ordering::Relaxed) as usize;
            let stride = stride(s);
            if cap.is_power_of_two() && self.in_arena(off, lay::RING_CELLS + cap * stride) {
                v.push(RingAt { off, cap, stride });
            }
        }
        v
    }

    fn rq_rings(&self) -> Vec<RingAt> {
        self.rings_in(lay::QP_TABLE, lay::QP_SLOT, lay::MAX_QP, lay::QP_RQ_CAP, lay::QP_RQ_OFF, |s| {
            lay::recv_stride(self.u32_at(s + lay::QP_RQ_SGE).load(Ordering::Relaxed))
        })
    }

    fn srq_rings(&self) -> Vec<RingAt> {
        self.rings_in(lay::SRQ_TABLE, lay::SRQ_SLOT, lay::MAX_SRQ, lay::SRQ_CAP, lay::SRQ_RING_OFF, |s| {
            lay::recv_stride(self.u32_at(s + lay::SRQ_MAX_SGE).load(Ordering::Relaxed))
        })
    }

    fn cq_rings(&self) -> Vec<RingAt> {
        self.rings_in(lay::CQ_TABLE, lay::CQ_SLOT, lay::MAX_CQ, lay::CQ_CAP, lay::CQ_RING_OFF, |_| lay::CQE_STRIDE)
    }

    /// Indices of published MR slots.
    fn live_mrs(&self) -> Vec<usize> {
        (0..lay::MAX_MR)
            .filter(|i| self.u32_at(lay::MR_TABLE + i * lay::MR_SLOT).load(Ordering::Acquire) != 0)
            .collect()
    }
}

/// splitmix64: a small deterministic generator (no dependency for a test tool).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    /// A hostile value: the extremes that break arithmetic, or random bits.
    fn garbage(&mut self) -> u64 {
        const NASTY: [u64; 6] = [u64::MAX, 1 << 62, 1 << 63, 0, 1, u32::MAX as u64];
        match self.below(3) {
            0 => NASTY[self.below(NASTY.len())],
            _ => self.next(),
        }
    }
}

/// One round of garbage on `target`; returns the words written.
fn vandalize(f: &Fabric, target: &str, rng: &mut Rng) -> Result<usize, String> {
    let mut n = 0;
    match target {
        "header" => {
            for _ in 0..4 {
                f.u64_at(lay::H_WORDS[rng.below(lay::H_WORDS.len())]).store(rng.garbage(), Ordering::Release);
                f.u64_at(lay::H_EXTENTS + 8 * rng.below(2 * lay::MAX_EXTENTS)).store(rng.garbage(), Ordering::Release);
                n += 2;
            }
        }
        "rings" | "seq" => {
            let mut rings = f.rq_rings();
            rings.extend(f.srq_rings());
            rings.extend(f.cq_rings());
            for r in &rings {
                if target == "rings" {
                    let at = if rng.below(2) == 0 { r.off } else { r.off + lay::RING_TAIL };
                    f.u64_at(at).store(rng.garbage(), Ordering::Release);
                    n += 1;
                } else {
                    for _ in 0..r.cap.min(64) {
                        let cell = r.off + lay::RING_CELLS + rng.below(r.cap) * r.stride;
                        f.u64_at(cell).store(rng.garbage(), Ordering::Release);
                        n += 1;
                    }
                }
            }
        }
        "cqe" => {
            for r in f.cq_rings() {
                for _ in 0..r.cap.min(64) {
                    let cell = r.off + lay::RING_CELLS + rng.below(r.cap) * r.stride;
                    for w in (8..lay::CQE_STRIDE).step_by(8) {
                        f.u64_at(cell + w).store(rng.garbage(), Ordering::Release);
                        n += 1;
                    }
                }
            }
        }
        "lock" => {
            // A live pid that will never let go (init), or random bits.
            let v = if rng.below(2) == 0 { 1 } else { rng.next() as u32 };
            f.u32_at(lay::H_LOCK).store(v, Ordering::Release);
            n += 1;
        }
        "mr" => {
            for i in f.live_mrs() {
                let s = lay::MR_TABLE + i * lay::MR_SLOT;
                // key|pd, ctx|access, va, off, len: leave the key word alone half the time so
                // the slot still looks published and its garbage is actually used.
                let first = if rng.below(2) == 0 { 0 } else { 8 };
                for w in (first..40).step_by(8) {
                    f.u64_at(s + w).store(rng.garbage(), Ordering::Release);
                    n += 1;
                }
            }
        }
        other => return Err(format!("--target {other:?}: expected header, rings, seq, cqe, lock, mr or truncate")),
    }
    Ok(n)
}

fn run(args: &Args) -> Result<String, String> {
    const TARGETS: [&str; 7] = ["header", "rings", "seq", "cqe", "lock", "mr", "truncate"];
    if !TARGETS.contains(&args.target.as_str()) {
        return Err(format!("--target {:?}: expected one of {}", args.target, TARGETS.join(", ")));
    }
    let deadline = Instant::now() + Duration::from_secs(args.wait);
    let f = loop {
        match Fabric::open(&args.fabric) {
            Ok(f) if f.check_layout()? => break f,
            Ok(_) | Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Ok(f) => return Err(format!("{}: no published receive queue or SRQ after {} s", f.path, args.wait)),
            Err(e) => return Err(format!("{e} after {} s", args.wait)),
        }
    };
    if args.target == "truncate" {
        let path = f.path.clone();
        f.file.set_len(0).map_err(|e| format!("{path}: truncate: {e}"))?;
        return Ok(format!("truncated {path} to 0 bytes"));
    }
    let mut rng = Rng(args.seed);
    let mut words = 0;
    for round in 0..args.rounds {
        if round > 0 {
            std::thread::sleep(Duration::from_millis(args.interval_ms));
        }
        words += vandalize(&f, &args.target, &mut rng)?;
    }
    Ok(format!("wrote {words} garbage words into the {} of {} in {} rounds", args.target, f.path, args.rounds))
}

fn main() {
    let args = Args::parse();
    match run(&args) {
        Ok(s) => println!("shm-vandal: {s}"),
        Err(e) => {
            eprintln!("shm-vandal: {e}");
            std::process::exit(1);
        }
    }
}

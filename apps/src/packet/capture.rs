//! pcap stages: `pcap-writer` records the frames that pass through it to a pcap file
//! (tcpdump, Wireshark and every packet tool read it), `pcap-reader` replays the frames of a
//! pcap file as a source.
//!
//! A relative `path` is taken from the pipeline file's directory (as `include`s are in most
//! tools), so an example runs from anywhere.
//!
//! Both keep the file off the per-frame path as far as a file allows: the reader reads the
//! whole file when the stage is made (so `check` refuses a damaged one, naming the byte), and
//! the writer copies each record into a buffer of `buffer_bytes` (default 1 MiB) that goes to
//! the file in one `write(2)` when it fills, and at the end of the run. A capture therefore
//! costs a copy per frame and a system call per megabyte: use it to record and debug, not in
//! a forwarding path measured for its rate.

use dataplane::net::pcap::{PcapFile, PcapWriter, SNAPLEN};
use dataplane::pipeline::{Handler, Msg, Pacer, StageCx, StageReport};
use serde::Deserialize;
use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// The directory relative paths are taken from: the pipeline file's.
pub(super) fn base_dir(config: &dataplane_config::Config) -> PathBuf {
    config.source.path().parent().map(Path::to_path_buf).unwrap_or_default()
}

fn one() -> u64 {
    1
}

fn snaplen() -> u32 {
    SNAPLEN
}

fn mib() -> u64 {
    1 << 20
}

/// `pcap-writer` parameters.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct WriterParams {
    /// The file to write (created, or truncated, when the run starts; never by `check`).
    path: PathBuf,
    /// Bytes kept of each frame (default 65535).
    #[serde(default = "snaplen")]
    snaplen: u32,
    /// Bytes buffered before a write (default 1 MiB; 64 KiB to 256 MiB).
    #[serde(default = "mib")]
    buffer_bytes: u64,
}

/// Writes every frame to a pcap file, then passes it to its output (a tap) or drops it (a
/// capture sink, without output).
pub struct PcapTap {
    path: PathBuf,
    snaplen: u32,
    buffer: usize,
    out: Option<PcapWriter<BufWriter<File>>>,
    /// Wall-clock time at the pipeline clock's zero, taken at the first frame.
    wall_base: Option<Duration>,
    written: u64,
    failed: u64,
    error: Option<String>,
}

impl PcapTap {
    /// Checks the parameters without touching the file (this runs during `check` too); a
    /// relative path is taken from `base`.
    pub(super) fn new(mut p: WriterParams, base: &Path) -> Result<PcapTap, String> {
        p.path = base.join(&p.path);
        if !(1..=SNAPLEN).contains(&p.snaplen) {
            return Err(format!("snaplen = {}: keep 1..={SNAPLEN} bytes of each frame", p.snaplen));
        }
        if !(64 << 10..=256 << 20).contains(&p.buffer_bytes) {
            return Err(format!("buffer_bytes = {}: use 65536..=268435456", p.buffer_bytes));
        }
        if p.path.is_dir() {
            return Err(format!("path {}: is a directory", p.path.display()));
        }
        let dir = p.path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
        if !dir.is_dir() {
            return Err(format!("path {}: directory {} does not exist", p.path.display(), dir.display()));
        }
        Ok(PcapTap {
            path: p.path,
            snaplen: p.snaplen,
            buffer: p.buffer_bytes as usize,
            out: None,
            wall_base: None,
            written: 0,
            failed: 0,
            error: None,
        })
    }

    fn fail(&mut self, what: &str, e: std::io::Error) {
        if self.error.is_none() {
            let msg = format!("pcap-writer: {what} {}: {e}", self.path.display());
            eprintln!("dataplane: {msg}");
            self.error = Some(msg);
        }
    }
}

impl Handler for PcapTap {
    fn start(&mut self) -> Result<(), String> {
        let file = File::create(&self.path).map_err(|e| format!("cannot create {}: {e}", self.path.display()))?;
        let w = PcapWriter::with_snaplen(BufWriter::with_capacity(self.buffer, file), self.snaplen)
            .map_err(|e| format!("cannot write {}: {e}", self.path.display()))?;
        self.out = Some(w);
        Ok(())
    }

    #[inline]
    fn on_message(&mut self, msg: Msg, cx: &mut StageCx<'_>) {
        if let Some(w) = &mut self.out {
            let now = cx.now_ns();
            let base = *self.wall_base.get_or_insert_with(|| {
                let wall = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
                wall.saturating_sub(Duration::from_nanos(now))
            });
            match w.write_frame(base + Duration::from_nanos(now), cx.bytes(&msg)) {
                Ok(()) => self.written += 1,
                Err(e) => {
                    // The stream is cut at an unknown point: write nothing more into it.
                    self.out = None;
                    self.failed += 1;
                    self.fail("writing", e);
                }
            }
        } else {
            self.failed += 1;
        }
        if cx.outputs() > 0 {
            cx.send(0, msg);
        } else {
            cx.drop_msg(msg);
        }
    }

    fn finish(&mut self) {
        if let Some(w) = self.out.take() {
            if let Err(e) = w.into_inner() {
                self.fail("flushing", e);
            }
        }
    }

    fn report(&self) -> StageReport {
        StageReport { values: vec![("written", self.written), ("not_written", self.failed)], ..Default::default() }
    }
}

/// `pcap-reader` parameters.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ReaderParams {
    /// The pcap file to replay (read whole when the stage is made).
    path: PathBuf,
    /// Times the file is replayed (default 1; 0: until the run stops).
    #[serde(default = "one")]
    loops: u64,
    /// Frames per second (default 0: as fast as the send queues take them).
    #[serde(default)]
    rate: u64,
}

/// Replays the frames of a pcap file to its output, in file order (timestamps are not
/// followed: `rate` paces the replay).
pub struct PcapReplay {
    data: Vec<u8>,
    /// Byte range of each frame in `data`.
    frames: Vec<(usize, usize)>,
    loops: u64,
    rate: u64,
    burst: usize,
    next: usize,
    loops_done: u64,
    sent: u64,
    too_long: u64,
    start_ns: Option<u64>,
    pacer: Pacer,
}

impl PcapReplay {
    /// Reads and indexes the file (a relative path is taken from `base`); the error names the
    /// file and what is wrong in it.
    pub(super) fn new(mut p: ReaderParams, base: &Path, burst: usize) -> Result<PcapReplay, String> {
        p.path = base.join(&p.path);
        let data = std::fs::read(&p.path).map_err(|e| format!("path {}: {e}", p.path.display()))?;
        let frames: Vec<(usize, usize)> = {
            let file = PcapFile::parse(&data).map_err(|e| format!("path {}: {e}", p.path.display()))?;
            file.records().iter().map(|r| (r.range().start, r.range().len())).collect()
        };
        if frames.is_empty() {
            return Err(format!("path {}: the capture has no frames", p.path.display()));
        }
        Ok(PcapReplay {
            data,
            frames,
            loops: p.loops,
            rate: p.rate,
            burst: burst.max(1),
            next: 0,
            loops_done: 0,
            sent: 0,
            too_long: 0,
            start_ns: None,
            pacer: Pacer::new(p.rate),
        })
    }

    fn finished(&self) -> bool {
        self.loops != 0 && self.loops_done >= self.loops
    }
}

impl Handler for PcapReplay {
    fn on_message(&mut self, msg: Msg, cx: &mut StageCx<'_>) {
        cx.drop_msg(msg);
    }

    fn is_source(&self) -> bool {
        true
    }

    fn done(&self) -> bool {
        self.finished()
    }

    #[inline]
    fn poll(&mut self, cx: &mut StageCx<'_>) -> usize {
        if cx.stopping() || self.finished() {
            return 0;
        }
        let mut n = cx.room().min(self.burst) as u64;
        if self.rate != 0 {
            // Pacing only: the unfenced read.
            let now = cx.now_ns_unordered();
            let elapsed = now - *self.start_ns.get_or_insert(now);
            n = n.min(self.pacer.allowed(elapsed, self.sent + self.too_long));
        }
        // One frame per step, sent or skipped as too long: a file of frames all too long for
        // the pool cannot keep the loop here.
        let mut made = 0;
        for _ in 0..n {
            if self.finished() {
                break;
            }
            let (at, len) = self.frames[self.next];
            if len > cx.max_len() {
                self.too_long += 1;
            } else {
                let Some(mut m) = cx.alloc(len) else { break };
                cx.bytes_mut(&mut m).copy_from_slice(&self.data[at..at + len]);
                cx.stats().msgs_in.add(1);
                cx.stats().bytes_in.add(len as u64);
                cx.send(0, m);
                self.sent += 1;
                made += 1;
            }
            self.next += 1;
            if self.next == self.frames.len() {
                self.next = 0;
                self.loops_done += 1;
            }
        }
        made
    }

    fn report(&self) -> StageReport {
        StageReport {
            values: vec![
                ("replayed", self.sent),
                ("too_long_for_the_pool", self.too_long),
                ("loops_done", self.loops_done),
            ],
            ..Default::default()
        }
    }
}

//! Command line: perftest's flags where they mean the same thing.

use clap::{Parser, ValueEnum};
use std::path::PathBuf;

/// The benchmark to run (perftest's program names without the `ib_` prefix).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
#[allow(non_camel_case_types)]
#[value(rename_all = "snake_case")]
pub enum Test {
    /// SEND bandwidth / message rate.
    send_bw,
    /// SEND ping-pong latency (half round trip).
    send_lat,
    /// RDMA WRITE bandwidth.
    write_bw,
    /// RDMA WRITE ping-pong latency (half round trip).
    write_lat,
    /// RDMA READ bandwidth.
    read_bw,
    /// RDMA READ latency (full round trip, as perftest).
    read_lat,
    /// FETCH_AND_ADD rate.
    atomic_bw,
    /// FETCH_AND_ADD latency (full round trip, as perftest).
    atomic_lat,
}

impl Test {
    /// Whether this is a latency test.
    pub fn is_lat(self) -> bool {
        matches!(self, Test::send_lat | Test::write_lat | Test::read_lat | Test::atomic_lat)
    }

    /// Whether the server takes part in the data path (receives or answers).
    pub fn server_active(self) -> bool {
        matches!(self, Test::send_bw | Test::send_lat | Test::write_lat)
    }

    /// Whether this is an atomic test (8-byte operations).
    pub fn is_atomic(self) -> bool {
        matches!(self, Test::atomic_bw | Test::atomic_lat)
    }

    /// Whether the test uses receives (SEND).
    pub fn is_send(self) -> bool {
        matches!(self, Test::send_bw | Test::send_lat)
    }
}

/// Transport (`-c`). The variants are spelled as perftest's `-c` values (and its JSON
/// `Connection_type`), which clap prints verbatim.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
#[value(rename_all = "verbatim")]
#[allow(clippy::upper_case_acronyms)]
pub enum Conn {
    /// Reliable connected.
    RC,
    /// Unreliable connected.
    UC,
    /// Unreliable datagram.
    UD,
    /// Extended reliable connected: per QP an XRC_SEND QP and an XRC_RECV QP, and one XRC SRQ
    /// per end that every message lands in (perftest's `-c XRC`).
    XRC,
}

/// Provider (`--provider`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
#[allow(non_camel_case_types)]
pub enum ProviderKind {
    /// The shared-memory software NIC (threads or processes of one host).
    shm,
    /// rdma-core's libibverbs (real NICs, Soft-RoCE).
    rdma,
}

/// Where the other end runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Both ends in this process.
    Loopback,
    /// Wait for a client on the TCP port.
    Server,
    /// Connect to the server named on the command line.
    Client,
}

/// perftest's TCP port.
pub const DEFAULT_PORT: u16 = 18515;
/// perftest's JSON file when `--out_json` is given without `--out_json_file`.
pub const DEFAULT_JSON_FILE: &str = "perftest_out.json";

#[derive(Parser, Debug, Clone)]
#[command(
    name = "dp-perf",
    about = "perftest-style benchmarks on dataplane's providers",
    long_about = "perftest-style benchmarks on dataplane's providers.\n\n\
        Server: `dp-perf TEST [-d DEV -i PORT -x GID] [-p TCP_PORT]`; client: the same with the \
        server's host name at the end. Both ends in one process: `--loopback`. The client's test \
        parameters (-s -a -n -D -q -t -r -Q -I -l -c --use-srq -b --fabric) are sent to the server, \
        which takes those it was not given and refuses the run when one it was given differs.",
    version
)]
pub struct Args {
    /// Which test.
    #[arg(value_enum)]
    pub test: Test,
    /// Server to connect to (none: be the server, unless --loopback).
    #[arg(value_name = "SERVER_HOST")]
    pub server: Option<String>,
    /// Provider.
    #[arg(long, value_enum, default_value = "shm")]
    pub provider: ProviderKind,
    /// Run both ends in this process (server thread on --peer-core).
    #[arg(long, conflicts_with = "server")]
    pub loopback: bool,
    /// TCP port of the out-of-band exchange.
    #[arg(short = 'p', long = "port", default_value_t = DEFAULT_PORT)]
    pub tcp_port: u16,
    /// shm: fabric both processes open (default: dp-perf-PORT, PORT being the TCP port; --loopback: dp-perf-PID).
    #[arg(long)]
    pub fabric: Option<String>,
    /// Device name (rdma; default: the first device).
    #[arg(short = 'd', long = "ib-dev")]
    pub dev: Option<String>,
    /// Device port (rdma).
    #[arg(short = 'i', long = "ib-port", default_value_t = 1)]
    pub ib_port: u8,
    /// GID index (rdma; RoCE needs one: 1 is RoCE v2 over IPv4 on rxe).
    #[arg(short = 'x', long = "gid-index", default_value_t = 0)]
    pub gid_index: u8,
    /// Message size in bytes (default: 65536 for bandwidth tests, 2 for latency tests).
    #[arg(short = 's', long)]
    pub size: Option<u64>,
    /// Sweep sizes 2 .. 2^23 (UD: up to the MTU).
    #[arg(short = 'a', long = "all")]
    pub all: bool,
    /// Iterations per QP (default 1000; 5000 for write_bw).
    #[arg(short = 'n', long = "iters")]
    pub iters: Option<u64>,
    /// Run for this many seconds instead of a number of iterations.
    #[arg(short = 'D', long = "duration")]
    pub duration: Option<f64>,
    /// Number of QPs (bandwidth tests).
    #[arg(short = 'q', long = "qp", default_value_t = 1)]
    pub qps: u32,
    /// Send queue depth per QP.
    #[arg(short = 't', long = "tx-depth", default_value_t = 128)]
    pub tx_depth: u32,
    /// Receive queue depth per QP (or of the SRQ).
    #[arg(short = 'r', long = "rx-depth", default_value_t = 512)]
    pub rx_depth: u32,
    /// Bytes of buffer each end cycles its messages through, as perftest's `cycle_buffer` (the
    /// page size): messages of at most half of it go to successive 64-byte-aligned slots
    /// within it, larger ones alternate between two slots. 0: one slot per queue entry
    /// (`max(-t, -r)` of them, at most 64 MiB; dp-perf's layout before session 22).
    #[arg(long = "cycle-buffer", default_value_t = 4096)]
    pub cycle_buffer: u64,
    /// Signal every Nth send (selective signaling).
    #[arg(short = 'Q', long = "cq-mod", default_value_t = 100)]
    pub cq_mod: u32,
    /// Largest message sent inline (default: 236 for send, 220 for write, 188 for UD, 0 for
    /// read/atomic; capped at the device's limit unless given).
    #[arg(short = 'I', long = "inline_size")]
    pub inline: Option<u32>,
    /// WRs per post (doorbell batching); forces cq-mod to this value, as perftest does.
    #[arg(short = 'l', long = "post_list", default_value_t = 1)]
    pub post_list: u32,
    /// Receive through an SRQ (send tests).
    #[arg(long = "use-srq")]
    pub use_srq: bool,
    /// Both ends send and receive at once, as perftest's `-b`: each sends `-n` messages per QP
    /// while it receives the other's; the rates printed are the sum of both directions.
    /// send_bw with -n and RC or XRC only, for now; a server takes it from the client.
    #[arg(short = 'b', long = "bidirectional")]
    pub bidirectional: bool,
    /// Require huge pages for the memory.
    #[arg(long = "use_hugepages")]
    pub hugepages: bool,
    /// Transport.
    #[arg(short = 'c', long = "connection", value_enum, default_value = "RC", ignore_case = true)]
    pub conn: Conn,
    /// Report bandwidth in Gb/s instead of MB/s.
    #[arg(long = "report_gbits")]
    pub gbits: bool,
    /// Write the results as JSON (perftest's keys) to --out_json_file.
    #[arg(long = "out_json")]
    pub out_json: bool,
    /// File for --out_json (default perftest_out.json; `-` prints JSON on stdout instead of
    /// the table). One object per message size, one per line.
    #[arg(long = "out_json_file", value_name = "FILE")]
    pub out_json_file: Option<PathBuf>,
    /// Write the latency histogram (HdrHistogram percentile text) to this file.
    #[arg(long)]
    pub histogram: Option<PathBuf>,
    /// Core for this side's test thread; -1 to not pin (default: 0 with --loopback, else not
    /// pinned).
    #[arg(long, allow_negative_numbers = true)]
    pub core: Option<i64>,
    /// --loopback: core for the server thread; -1 to not pin.
    #[arg(long = "peer-core", default_value_t = 1, allow_negative_numbers = true)]
    pub peer_core: i64,
    /// Latency tests, client side: spin this many nanoseconds before each sample (on the
    /// TSC, outside the sample), so each round trip starts after the path has not run for a
    /// while, as a paced application's message does. 0: back to back, as perftest.
    #[arg(long = "gap-ns", default_value_t = 0)]
    pub gap_ns: u64,
    /// Seconds without a sign of life from the peer (or without progress) before giving up.
    #[arg(long = "peer-timeout", default_value_t = 5.0)]
    pub peer_timeout: f64,
    /// Accepted for perftest compatibility (its CPU-frequency warning); no effect.
    #[arg(short = 'F', long = "CPU-freq")]
    pub cpu_freq: bool,
    /// Command-line ids given explicitly (filled by main from clap's matches).
    #[arg(skip)]
    pub explicit: Vec<String>,
    /// Sizes agreed with the client (server side).
    #[arg(skip)]
    pub agreed_sizes: Option<Vec<u64>>,
}

impl Args {
    /// Where the other end runs.
    pub fn mode(&self) -> Mode {
        match (&self.server, self.loopback) {
            (_, true) => Mode::Loopback,
            (Some(_), false) => Mode::Client,
            (None, false) => Mode::Server,
        }
    }

    /// Whether the flag with clap id `id` was given on the command line.
    pub fn given(&self, id: &str) -> bool {
        self.explicit.iter().any(|e| e == id)
    }

    /// Checks combinations perftest also refuses, with a sentence saying why.
    pub fn check(&mut self) -> Result<(), String> {
        if self.qps == 0 || self.post_list == 0 || self.cq_mod == 0 || self.tx_depth == 0 || self.rx_depth == 0 {
            return Err("-q, --post_list, --cq-mod, --tx-depth and --rx-depth must be at least 1".into());
        }
        if self.gap_ns != 0 && !self.test.is_lat() {
            return Err(format!("--gap-ns {}: only latency tests pause between samples", self.gap_ns));
        }
        if self.qps > 1 && self.test.is_lat() {
            return Err(format!("-q {}: latency tests use one QP (as perftest's)", self.qps));
        }
        if self.iters == Some(0) {
            return Err("-n must be at least 1".into());
        }
        if let Some(s) = self.size {
            Self::check_size(s).map_err(|e| format!("-s {s}: {e}"))?;
        }
        if self.duration.is_some_and(|d| !(d > 0.0 && d.is_finite())) {
            return Err("-D must be a positive number of seconds".into());
        }
        if !(self.peer_timeout > 0.0 && self.peer_timeout.is_finite()) {
            return Err("--peer-timeout must be a positive number of seconds".into());
        }
        if self.post_list > 1 {
            self.cq_mod = self.post_list;
        }
        if self.cq_mod > self.tx_depth {
            return Err(format!(
                "--cq-mod {} is above --tx-depth {}: the send queue would fill unsignaled",
                self.cq_mod, self.tx_depth
            ));
        }
        if self.post_list > self.tx_depth {
            return Err(format!("--post_list {} is above --tx-depth {}", self.post_list, self.tx_depth));
        }
        use Test::*;
        match (self.conn, self.test) {
            (Conn::UD, write_bw | write_lat | read_bw | read_lat | atomic_bw | atomic_lat)
            | (Conn::UC, read_bw | read_lat | atomic_bw | atomic_lat) => {
                return Err(format!(
                    "{:?} is not supported on {:?} (ibv_post_send(3) opcode table)",
                    self.test, self.conn
                ));
            }
            _ => {}
        }
        if self.mode() == Mode::Server && self.histogram.is_some() {
            return Err("--histogram: the client measures the latencies; give it there".into());
        }
        if self.bidirectional {
            if self.test != send_bw {
                return Err(format!("-b: dp-perf runs {:?} one way only (send_bw has -b)", self.test));
            }
            if self.duration.is_some() {
                return Err("-b: with -n only (a receiving end needs the count to expect)".into());
            }
            if matches!(self.conn, Conn::UD | Conn::UC) {
                return Err(format!(
                    "-b: reliable transports only, for now ({:?} drops a message that finds no receive, and an \
                     end counting the messages to expect would wait for it)",
                    self.conn
                ));
            }
        }
        if self.use_srq && !self.test.is_send() {
            return Err("--use-srq applies to send tests only".into());
        }
        Ok(())
    }

    /// The checks of one message size, for `-s` and for each size a client sends.
    pub fn check_size(size: u64) -> Result<(), String> {
        if size == 0 {
            return Err("a message is at least 1 byte".into());
        }
        if size > u32::MAX as u64 {
            return Err("a message is at most 4 GiB - 1 (ibv_sge's length is 32 bits)".into());
        }
        Ok(())
    }

    /// Sizes to run; `ud_max` is the largest UD message (the path MTU).
    pub fn sizes(&self, ud_max: u64) -> Result<Vec<u64>, String> {
        if let Some(s) = &self.agreed_sizes {
            return Ok(s.clone());
        }
        let max = if self.conn == Conn::UD { ud_max } else { 1 << 23 };
        if self.all {
            let lo = if self.test.is_atomic() { 8 } else { 2 };
            return Ok((1..=23).map(|e| 1u64 << e).filter(|s| *s >= lo && *s <= max).collect());
        }
        if self.test.is_atomic() {
            return Ok(vec![8]);
        }
        match self.size {
            Some(s) if self.conn == Conn::UD && s > ud_max => {
                Err(format!("-s {s}: a UD message must fit the path MTU ({ud_max} bytes here)"))
            }
            Some(s) => Ok(vec![s]),
            None => Ok(vec![(if self.test.is_lat() { 2 } else { 65536 }).min(max)]),
        }
    }

    /// Iterations per QP (perftest's defaults).
    pub fn iterations(&self) -> u64 {
        self.iters.unwrap_or(if self.test == Test::write_bw { 5000 } else { 1000 })
    }

    /// Inline threshold: the flag, or perftest's default capped at the device's `max_inline`.
    pub fn inline_size(&self, max_inline: u32) -> u32 {
        self.inline.unwrap_or(
            match (self.test, self.conn) {
                (Test::read_bw | Test::read_lat | Test::atomic_bw | Test::atomic_lat, _) => 0,
                (_, Conn::UD) => 188,
                (Test::send_bw | Test::send_lat, _) => 236,
                _ => 220,
            }
            .min(max_inline),
        )
    }

    /// The JSON destination: `None` (no JSON), `Some("-")` for stdout, or a file.
    pub fn json_path(&self) -> Option<PathBuf> {
        match (&self.out_json_file, self.out_json) {
            (Some(p), _) => Some(p.clone()),
            (None, true) => Some(PathBuf::from(DEFAULT_JSON_FILE)),
            (None, false) => None,
        }
    }

    /// The core of this side's test thread (`None`: not pinned).
    pub fn my_core(&self) -> Option<usize> {
        let c = self.core.unwrap_or(if self.loopback { 0 } else { -1 });
        (c >= 0).then_some(c as usize)
    }
}

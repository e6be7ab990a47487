//! Command line: perftest's flags where they mean the same thing.

use clap::{Parser, ValueEnum};

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
}

/// Transport (`-c`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
#[value(rename_all = "verbatim")]
pub enum Conn {
    /// Reliable connected.
    RC,
    /// Unreliable connected.
    UC,
    /// Unreliable datagram.
    UD,
}

#[derive(Parser, Debug, Clone)]
#[command(name = "dp-perf", about = "perftest-style benchmarks on dataplane's providers", version)]
pub struct Args {
    /// Which test.
    #[arg(value_enum)]
    pub test: Test,
    /// Provider (only `shm` is implemented; `rdma` arrives with issue 4).
    #[arg(long, default_value = "shm")]
    pub provider: String,
    /// Run both ends in this command (server thread on --peer-core). Required for now.
    #[arg(long)]
    pub loopback: bool,
    /// Device name (rdma).
    #[arg(short = 'd', long = "ib-dev")]
    pub dev: Option<String>,
    /// Port (rdma).
    #[arg(short = 'i', long = "ib-port", default_value_t = 1)]
    pub port: u8,
    /// GID index (rdma).
    #[arg(short = 'x', long = "gid-index", default_value_t = 0)]
    pub gid_index: u8,
    /// Message size in bytes (default: 65536 for bandwidth tests, 2 for latency tests).
    #[arg(short = 's', long)]
    pub size: Option<u64>,
    /// Sweep sizes 2 .. 2^23.
    #[arg(short = 'a', long = "all")]
    pub all: bool,
    /// Iterations (default 1000; 5000 for write_bw).
    #[arg(short = 'n', long = "iters")]
    pub iters: Option<u64>,
    /// Run for this many seconds instead of a number of iterations.
    #[arg(short = 'D', long = "duration")]
    pub duration: Option<f64>,
    /// Number of QPs (only 1 is implemented).
    #[arg(short = 'q', long = "qp", default_value_t = 1)]
    pub qps: u32,
    /// Send queue depth.
    #[arg(short = 't', long = "tx-depth", default_value_t = 128)]
    pub tx_depth: u32,
    /// Receive queue depth.
    #[arg(short = 'r', long = "rx-depth", default_value_t = 512)]
    pub rx_depth: u32,
    /// Signal every Nth send (selective signaling).
    #[arg(short = 'Q', long = "cq-mod", default_value_t = 100)]
    pub cq_mod: u32,
    /// Largest message sent inline (default: 236 for send, 220 for write, 188 for UD; 0 for read/atomic).
    #[arg(short = 'I', long = "inline_size")]
    pub inline: Option<u32>,
    /// WRs per post (doorbell batching); forces cq-mod to this value, as perftest does.
    #[arg(short = 'l', long = "post_list", default_value_t = 1)]
    pub post_list: u32,
    /// Receive through an SRQ (send tests).
    #[arg(long = "use-srq")]
    pub use_srq: bool,
    /// Require huge pages for the fabric.
    #[arg(long = "use_hugepages")]
    pub hugepages: bool,
    /// Transport.
    #[arg(short = 'c', long = "connection", value_enum, default_value = "RC", ignore_case = true)]
    pub conn: Conn,
    /// Report bandwidth in Gb/s instead of MB/s.
    #[arg(long = "report_gbits")]
    pub gbits: bool,
    /// Print results as JSON (one object per line, perftest's keys).
    #[arg(long = "out_json")]
    pub json: bool,
    /// Write the latency histogram (HdrHistogram percentile text) to this file.
    #[arg(long)]
    pub histogram: Option<std::path::PathBuf>,
    /// Core for the client (this thread); -1 to not pin.
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    pub core: i64,
    /// Core for the server thread; -1 to not pin.
    #[arg(long = "peer-core", default_value_t = 1, allow_negative_numbers = true)]
    pub peer_core: i64,
}

impl Args {
    /// Checks combinations perftest also refuses, with a sentence saying why.
    pub fn check(&mut self) -> Result<(), String> {
        if self.provider != "shm" {
            return Err(format!(
                "provider {:?}: only shm is implemented in dp-perf so far (rdma: issue 4)",
                self.provider
            ));
        }
        if !self.loopback {
            return Err(
                "client/server over the network needs the out-of-band exchange (issue 4); use --loopback".into()
            );
        }
        if self.qps != 1 {
            return Err("-q: only one QP is implemented so far".into());
        }
        if self.post_list == 0 || self.cq_mod == 0 || self.tx_depth == 0 || self.rx_depth == 0 {
            return Err("--post_list, --cq-mod, --tx-depth and --rx-depth must be at least 1".into());
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
        if self.use_srq && !matches!(self.test, send_bw | send_lat) {
            return Err("--use-srq applies to send tests only".into());
        }
        Ok(())
    }

    /// Sizes to run.
    pub fn sizes(&self) -> Vec<u64> {
        let max = if self.conn == Conn::UD { 4096 } else { 1 << 23 };
        if self.all {
            let lo = if matches!(self.test, Test::atomic_bw | Test::atomic_lat) { 8 } else { 2 };
            (1..=23).map(|e| 1u64 << e).filter(|s| *s >= lo && *s <= max).collect()
        } else if matches!(self.test, Test::atomic_bw | Test::atomic_lat) {
            vec![8]
        } else {
            vec![self.size.unwrap_or(if self.test.is_lat() { 2 } else { 65536 }).min(max)]
        }
    }

    /// Iterations (perftest's defaults).
    pub fn iterations(&self) -> u64 {
        self.iters.unwrap_or(if self.test == Test::write_bw { 5000 } else { 1000 })
    }

    /// Inline threshold.
    pub fn inline_size(&self) -> u32 {
        self.inline.unwrap_or(match (self.test, self.conn) {
            (_, Conn::UD) => 188,
            (Test::send_bw | Test::send_lat, _) => 236,
            (Test::write_bw | Test::write_lat, _) => 220,
            _ => 0,
        })
    }
}

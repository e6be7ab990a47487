//! # dataplane-config
//!
//! The TOML pipeline schema of `dataplane`: parsing, documented defaults, semantic
//! validation, and errors that say where (`file:line:column`), what (the field path, e.g.
//! `workers[1].core`), and how to fix it (a hint).
//!
//! ```
//! use dataplane_config::{Config, ValidationEnv};
//!
//! let text = r#"
//! [[workers]]
//! name = "w0"
//! core = 0
//!
//! [[qps]]
//! name = "a"
//! worker = "w0"
//! peer = "b"
//!
//! [[qps]]
//! name = "b"
//! worker = "w0"
//! peer = "a"
//!
//! [[stages]]
//! name = "src"
//! worker = "w0"
//! kind = "source"
//! output = "a"
//!
//! [[stages]]
//! name = "sink"
//! worker = "w0"
//! kind = "sink"
//! input = "b"
//! "#;
//! let config = Config::from_str(text, "pipeline.toml").unwrap();
//! config.validate(&ValidationEnv::with_cores([0, 1])).unwrap();
//! assert_eq!(*config.workers[0].poll_burst, 32);
//! ```
//!
//! The file has five top-level parts: `[provider]`, `[memory]` (with `[[memory.pools]]`),
//! `[[workers]]`, `[[qps]]` and `[[stages]]`; `config/reference.toml` lists every field with
//! its default, and [`schema`] documents each one.

#![warn(missing_docs)]

mod error;
mod located;
mod params;
mod parse;
pub mod schema;
mod source;
mod units;
mod validate;

pub use error::{ConfigError, ConfigErrors, ErrorKind};
pub use located::Located;
pub use schema::{
    defaults, Config, HugepagePolicy, IdlePolicy, KindShape, MemoryConfig, PageSize, ParamsTable, Peer, PoolConfig,
    ProviderConfig, ProviderKind, QpConfig, StageConfig, StageKind, Transport, WorkerConfig, MIN_MESSAGE_SIZE,
    UD_GRH_BYTES,
};
pub use source::{Location, Source};
pub use units::{ByteSize, HumanDuration, Rate};
pub use validate::{format_cpu_list, parse_cpu_list, ValidationEnv};

use std::path::Path;

impl Config {
    /// Reads and parses a file (no semantic validation: see [`Config::validate`] and
    /// [`Config::load`]).
    pub fn from_file(path: impl AsRef<Path>) -> Result<Config, ConfigErrors> {
        let path = path.as_ref();
        match std::fs::read_to_string(path) {
            Ok(text) => Config::from_str(&text, path),
            Err(e) => Err(ConfigError::new(
                ErrorKind::Io,
                &Source::new(path, ""),
                None,
                "",
                format!("cannot read the file: {e}"),
            )
            .into()),
        }
    }

    /// Parses TOML text; `path` names the file in error messages only.
    ///
    /// Parsing stops at the first syntax or schema error (TOML syntax, unknown field, wrong
    /// type, missing field), so the error list has one entry.
    pub fn from_str(text: &str, path: impl AsRef<Path>) -> Result<Config, ConfigErrors> {
        parse::parse(Source::new(path, text))
    }

    /// Reads, parses and validates a file: what `dataplane check FILE` does.
    pub fn load(path: impl AsRef<Path>, env: &ValidationEnv) -> Result<Config, ConfigErrors> {
        let config = Config::from_file(path)?;
        config.validate(env)?;
        Ok(config)
    }

    /// Checks everything that parses but would fail late or run badly, and returns every
    /// error found (in file order), not just the first.
    ///
    /// Rules:
    /// - **Names**: 1-64 characters of letters, digits, `-`, `_`, `.`; unique among workers,
    ///   among pools, and among QPs and stages together (endpoints name either).
    /// - **References**: a QP's or stage's `worker`, a worker's `pool`, a QP's local `peer`
    ///   and a stage's `input`/`output`/`outputs` must name something that exists (with a
    ///   "did you mean" hint).
    /// - **Provider**: fields of the other kind are rejected; shm `fabric_size` >= 1M; rdma
    ///   `port` >= 1.
    /// - **Cores**: every worker's core is in [`ValidationEnv::cores`] and no two workers
    ///   share one.
    /// - **Worker queues**: `cq_depth`, `srq_depth`, `poll_burst`, `doorbell_batch`,
    ///   `signal_interval` >= 1; `poll_burst <= cq_depth`; `srq_low_watermark < srq_depth`;
    ///   `recv_buffer_size <=` the pool's `buffer_size`; `cq_depth >=` the sum of the send
    ///   depths of its QPs, plus `srq_depth` if any uses the SRQ, plus the `recv_depth` of
    ///   those that do not (a QP in error flushes every outstanding WR as a completion);
    ///   a worker has at least one QP or stage.
    /// - **Batching and signaling**: for every QP, `doorbell_batch <= send_depth` (a batch
    ///   fits in the send queue) and `send_depth >= 2 * signal_interval` (the QP's, else its
    ///   worker's), so the queue never fills with unsignaled WRs that no completion frees.
    /// - **RC attributes**: `min_rnr_timer <= 31`, `rnr_retry <= 7`, `retry_cnt <= 7`,
    ///   `timeout <= 31`.
    /// - **Peers**: an RC QP has a `peer` or a `listen` address, not both (neither may a UD
    ///   QP); a local peer is another QP with the same transport, and for RC names this QP
    ///   back; `host:port` (in `peer` and `listen`) has a host and a port 1-65535.
    /// - **Memory**: each pool has `count >= 1`, `buffer_size >= 64`, `cache_size <= count`,
    ///   and enough buffers for its workers (posted receives + send queues + cache each);
    ///   with `hugepages = "require"` the pools fit in the free huge pages of `page_size`;
    ///   pools (unless in huge pages) plus the shm fabric fit in available memory.
    /// - **Stages**: a kind is built in or registered in [`ValidationEnv::kinds`] (else the
    ///   error lists the known kinds); input/output per kind (see [`StageKind`], and the
    ///   [`KindShape`] of a registered kind); kind-specific parameters only on their kind,
    ///   `params` only on registered kinds (its contents are checked by
    ///   [`Config::stage_params`]); a QP endpoint belongs to the stage's worker; a QP feeds at most one
    ///   stage; stage links are declared on both ends; fanout `outputs` is non-empty without
    ///   repeats; a UD QP used as an output, or as the input of an echo stage, has a peer or
    ///   `listen`; no cycles among stage links.
    /// - **Sources**: `rate` >= 1 or `"max"`; `message_size >= 16`; not both `count` and
    ///   `duration`; the message fits the pool buffers of every stage on its path and the
    ///   receive buffers at every local peer it reaches (+40 bytes GRH for UD), and at most
    ///   4096 bytes on UD.
    /// - **Readers**: a QP whose local peer is written to by a stage (an output, or an echo's
    ///   input) is some stage's `input`; unread, its messages would be lost.
    /// - At least one worker and one stage.
    pub fn validate(&self, env: &ValidationEnv) -> Result<(), ConfigErrors> {
        validate::Validator::run(self, env)
    }

    /// The worker with this name.
    pub fn worker(&self, name: &str) -> Option<&WorkerConfig> {
        self.workers.iter().find(|w| w.name.as_str() == name)
    }

    /// The QP with this name.
    pub fn qp(&self, name: &str) -> Option<&QpConfig> {
        self.qps.iter().find(|q| q.name.as_str() == name)
    }

    /// The stage with this name.
    pub fn stage(&self, name: &str) -> Option<&StageConfig> {
        self.stages.iter().find(|s| s.name.as_str() == name)
    }

    /// The buffer pool with this name.
    pub fn pool(&self, name: &str) -> Option<&PoolConfig> {
        self.memory.pools.iter().find(|p| p.name.as_str() == name)
    }
}

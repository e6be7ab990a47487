//! A program with a stage kind of its own: `sample`, which passes on one message in
//! `keep_one_in` and drops the others, registered next to the built-ins. The program gets the
//! whole `dataplane` command line (`check`, `run`, `kinds`, `--json`, live stats for `dpctl`):
//!
//! ```text
//! cargo run --release -p dataplane-apps --example custom_stage -- run apps/examples/custom-stage.toml --duration 2s
//! cargo run --release -p dataplane-apps --example custom_stage -- kinds
//! ```
//!
//! Its parameters are a `serde` type: `keep_one_in = 0` in the file is refused by `check` at
//! its line and column, like every other config error.

use dataplane::pipeline::{Handler, Msg, StageCx};
use dataplane_apps::stages::{Registry, StageSpec};
use dataplane_config::KindShape;
use serde::Deserialize;
use std::num::NonZeroU64;
use std::process::ExitCode;

/// The `params` table of a `sample` stage.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SampleParams {
    /// Pass on one message in this many (at least 1).
    keep_one_in: NonZeroU64,
}

/// Passes on one message in `every`, to its one output; drops the others (counted in the
/// stage's `dropped` column).
struct Sample {
    every: u64,
    seen: u64,
}

impl Handler for Sample {
    fn on_message(&mut self, msg: Msg, cx: &mut StageCx<'_>) {
        self.seen += 1;
        if self.seen % self.every == 0 {
            cx.send(0, msg);
        } else {
            cx.drop_msg(msg);
        }
    }
}

fn main() -> ExitCode {
    let mut registry = Registry::new();
    let added = registry.register(
        "sample",
        KindShape::filter(),
        "passes on one message in `keep_one_in` (params), drops the others",
        |p: SampleParams, _spec: StageSpec<'_>| Ok(Box::new(Sample { every: p.keep_one_in.get(), seen: 0 })),
    );
    if let Err(e) = added {
        eprintln!("custom_stage: {e}");
        return ExitCode::from(1);
    }
    dataplane_apps::cli::main(registry)
}

//! The `dataplane` command line, as a library function: a program with stage kinds of its own
//! gets the same `check`, `run` and `kinds` commands, summaries, JSON and live stats by
//! calling [`main`] with its [`Registry`].
//!
//! ```no_run
//! use dataplane_apps::{cli, stages::Registry};
//!
//! fn main() -> std::process::ExitCode {
//!     let registry = Registry::new(); // + registry.register("book", ...) for each own kind
//!     cli::main(registry)
//! }
//! ```
//!
//! ```text
//! PROGRAM check FILE
//! PROGRAM run FILE [--duration 5s] [--json] [--doorbell-batch N] [--fabric NAME] [--no-pin] [--no-stats]
//! PROGRAM kinds
//! ```
//!
//! `check` prints every error on its own line (`file:line:column: field: message; hint`)
//! and exits 1 if there is any. `run` brings the pipeline up, runs it until `--duration`,
//! Ctrl-C, or (without `--duration`) until every source reached its limit and the pipeline
//! went quiet; then drains, checks that no buffer leaked and prints the summary. While it runs,
//! its counters are live in `/dev/shm/dataplane-stats.FABRIC.PID` for `dpctl` (removed at the
//! end, also after Ctrl-C or SIGTERM; `--no-stats` skips it). `kinds` lists the stage kinds
//! the program knows. Exit status: 0 on a clean run, 1 on a config or start-up error, 2 when
//! buffers leaked, the drain was incomplete or completions reported errors.

use crate::stages::Registry;
use crate::{report, runner};
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use dataplane_config::{Config, HumanDuration};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Parser, Debug)]
#[command(name = "dataplane", about = "Check or run a TOML dataplane pipeline")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Validate a pipeline file without running it.
    Check {
        /// The pipeline file.
        file: PathBuf,
    },
    /// Run a pipeline and print a summary.
    Run {
        /// The pipeline file.
        file: PathBuf,
        /// Stop after this long (e.g. `5s`, `500ms`).
        #[arg(long)]
        duration: Option<String>,
        /// Print the summary as one JSON object.
        #[arg(long)]
        json: bool,
        /// Override every worker's doorbell_batch.
        #[arg(long)]
        doorbell_batch: Option<u32>,
        /// Override the shm fabric name (pipelines on the shm provider only).
        #[arg(long)]
        fabric: Option<String>,
        /// Do not pin worker threads.
        #[arg(long)]
        no_pin: bool,
        /// Do not export live stats for dpctl (no shared-memory segment).
        #[arg(long)]
        no_stats: bool,
    },
    /// List the stage kinds this program knows, with their endpoints.
    Kinds,
}

/// The file, parsed and checked against the machine, `registry` and (on `shm`) the device's
/// limits and the fabric's size; errors printed.
fn load(registry: &Registry, file: &Path) -> Result<Config, ()> {
    let cfg = registry.load(file).map_err(|errs| {
        for e in errs.iter() {
            eprintln!("{e}");
        }
    })?;
    crate::limits::check_shm(&cfg).map_err(|e| eprintln!("{e}"))?;
    Ok(cfg)
}

/// Runs the `dataplane` command line with the stage kinds of `registry` (the built-ins, and
/// the program's own): parses the process's arguments, does what they say, and returns the
/// exit status (see the module documentation).
pub fn main(registry: Registry) -> ExitCode {
    crate::logging::init();
    // Usage and errors name the program as it was started.
    let bin = std::env::args_os()
        .next()
        .and_then(|a| Path::new(&a).file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "dataplane".into());
    let matches = Cli::command().bin_name(bin.clone()).get_matches();
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(c) => c,
        Err(e) => e.exit(),
    };
    match cli.cmd {
        Cmd::Check { file } => match load(&registry, &file) {
            Ok(_) => {
                println!("{}: ok", file.display());
                ExitCode::SUCCESS
            }
            Err(()) => ExitCode::from(1),
        },
        Cmd::Kinds => {
            print!("{}", kinds_table(&registry));
            ExitCode::SUCCESS
        }
        Cmd::Run { file, duration, json, doorbell_batch, fabric, no_pin, no_stats } => {
            let duration = match duration.as_deref().map(HumanDuration::parse) {
                None => None,
                Some(Ok(d)) => Some(d.0),
                Some(Err(e)) => {
                    eprintln!("{bin}: --duration: {e}");
                    return ExitCode::from(1);
                }
            };
            let Ok(cfg) = load(&registry, &file) else { return ExitCode::from(1) };
            crate::signals::install();
            let opts = runner::RunOptions { duration, doorbell_batch, fabric, no_pin, no_stats };
            match runner::run(&cfg, &registry, &opts, &crate::signals::STOP) {
                Ok(r) => {
                    if json {
                        println!("{}", report::json(&r));
                    } else {
                        print!("{}", report::text(&r));
                    }
                    let errors = report::total_errors(&r);
                    if errors > 0 {
                        eprintln!("{bin}: {errors} completions reported errors (see the errors column)");
                    }
                    if report::total_leaked(&r) > 0 || !r.drained || errors > 0 {
                        return ExitCode::from(2);
                    }
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("{bin}: {e}");
                    ExitCode::from(1)
                }
            }
        }
    }
}

/// `kinds`: one line per kind with its endpoints and what it does.
pub fn kinds_table(registry: &Registry) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    let _ = writeln!(o, "{:<16} {:<9} {:<8} {:<8} about", "kind", "origin", "input", "outputs");
    for k in registry.kinds() {
        let s = k.shape;
        let outputs = match (s.min_outputs, s.max_outputs) {
            (a, b) if a == b => a.to_string(),
            (a, usize::MAX) => format!("{a}+"),
            (a, b) => format!("{a}-{b}"),
        };
        let origin = if k.builtin { "built-in" } else { "program" };
        let input = if s.input { "yes" } else { "no" };
        let _ = writeln!(o, "{:<16} {:<9} {:<8} {:<8} {}", k.name, origin, input, outputs, k.about);
    }
    o
}

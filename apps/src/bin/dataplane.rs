//! `dataplane`: validate (`check`) or run (`run`) a TOML pipeline.
//!
//! ```text
//! dataplane check FILE
//! dataplane run FILE [--duration 5s] [--json] [--doorbell-batch N] [--fabric NAME] [--no-pin] [--no-stats]
//! ```
//!
//! `check` prints every error on its own line (`file:line:column: field: message; hint`)
//! and exits 1 if there is any. `run` brings the pipeline up, runs it until `--duration`,
//! Ctrl-C, or (without `--duration`) until every source reached its limit and the pipeline
//! went quiet; then drains, checks that no buffer leaked and prints the summary. While it runs,
//! its counters are live in `/dev/shm/dataplane-stats.FABRIC.PID` for `dpctl` (removed at the
//! end, also after Ctrl-C or SIGTERM; `--no-stats` skips it). Exit status:
//! 0 on a clean run, 1 on a config or start-up error, 2 when buffers leaked or the drain was
//! incomplete.

use clap::{Parser, Subcommand};
use dataplane_apps::{limits, report, runner};
use dataplane_config::{Config, HumanDuration, ValidationEnv};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};

#[derive(Parser, Debug)]
#[command(name = "dataplane", about = "Run a TOML dataplane pipeline")]
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
}

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigint(_: libc::c_int) {
    // Async-signal-safe: one atomic store.
    INTERRUPTED.store(true, Ordering::Relaxed);
}

/// Ctrl-C and SIGTERM stop the run gracefully (drain, report, remove the stats segment).
fn install_signals() {
    // SAFETY: FFI; the handler only performs an atomic store, which is async-signal-safe, and
    // the sigaction struct is fully initialized (zeroed, then the handler and mask set).
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_sigint as extern "C" fn(libc::c_int) as usize;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGINT, &sa, std::ptr::null_mut());
        libc::sigaction(libc::SIGTERM, &sa, std::ptr::null_mut());
    }
}

fn load(file: &PathBuf) -> Result<Config, ()> {
    Config::load(file, &ValidationEnv::detect()).map_err(|errs| {
        for e in errs.iter() {
            eprintln!("{e}");
        }
    })
}

fn main() {
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Check { file } => match load(&file).map(|cfg| limits::check_shm(&cfg).map_err(|e| eprintln!("{e}"))) {
            Ok(Ok(())) => println!("{}: ok", file.display()),
            Ok(Err(())) | Err(()) => std::process::exit(1),
        },
        Cmd::Run { file, duration, json, doorbell_batch, fabric, no_pin, no_stats } => {
            let duration = match duration.as_deref().map(HumanDuration::parse) {
                None => None,
                Some(Ok(d)) => Some(d.0),
                Some(Err(e)) => {
                    eprintln!("dataplane: --duration: {e}");
                    std::process::exit(1)
                }
            };
            let Ok(cfg) = load(&file) else { std::process::exit(1) };
            if let Err(e) = limits::check_shm(&cfg) {
                eprintln!("dataplane: {e}");
                std::process::exit(1);
            }
            install_signals();
            let opts = runner::RunOptions { duration, doorbell_batch, fabric, no_pin, no_stats };
            match runner::run(&cfg, &opts, &INTERRUPTED) {
                Ok(r) => {
                    if json {
                        println!("{}", report::json(&r));
                    } else {
                        print!("{}", report::text(&r));
                    }
                    if report::total_leaked(&r) > 0 || !r.drained {
                        std::process::exit(2);
                    }
                }
                Err(e) => {
                    eprintln!("dataplane: {e}");
                    std::process::exit(1);
                }
            }
        }
    }
}

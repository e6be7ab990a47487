//! `dp-perf`: perftest-class benchmarks (`send|write|read|atomic` × `bw|lat`) on dataplane's
//! providers (`--provider shm|rdma`), with perftest's flags, columns and JSON keys. The server
//! runs `dp-perf TEST`, the client `dp-perf TEST SERVER_HOST`; they agree on the parameters and
//! exchange QPs and memory over TCP (ctl.rs, `dataplane::conn`). `--loopback` runs both ends
//! in this process on two pinned threads. See docs/dp-perf.md.

mod args;
mod bw;
mod ctl;
mod lat;
mod live;
mod params;
mod report;
mod run;
mod setup;

use args::ProviderKind;
use clap::parser::ValueSource;
use clap::{ArgMatches, CommandFactory, FromArgMatches};

/// Prints `what: err` and exits 1. Only for `main`: everywhere else an error returns up to it,
/// so that destructors run (the shm fabric file is removed by the last context's drop).
fn fail(what: &str, err: impl std::fmt::Display) -> ! {
    eprintln!("dp-perf: {what}: {err}");
    std::process::exit(1)
}

/// Ids of the arguments given on the command line (not defaulted).
pub fn given_ids(m: &ArgMatches) -> Vec<String> {
    m.ids()
        .filter(|id| m.value_source(id.as_str()) == Some(ValueSource::CommandLine))
        .map(|id| id.as_str().to_owned())
        .collect()
}

fn main() {
    dataplane_apps::logging::init();
    // SIGINT/SIGTERM end the run through its error path (waits check the flag; blocking calls
    // return EINTR), so teardown runs and no fabric file is left.
    dataplane_apps::signals::install();
    let m = args::Args::command().get_matches();
    let mut args = args::Args::from_arg_matches(&m).unwrap_or_else(|e| e.exit());
    args.explicit = given_ids(&m);
    if let Err(e) = args.check() {
        fail("arguments", e);
    }
    let r = match args.provider {
        ProviderKind::shm => run::run::<dataplane::shm::Shm>(args),
        ProviderKind::rdma => run::run::<dataplane::rdma::Rdma>(args),
    };
    if let Err(e) = r {
        fail("error", e);
    }
}

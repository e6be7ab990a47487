//! `dataplane`: check or run a TOML pipeline with the built-in stage kinds.
//!
//! The command line is [`dataplane_apps::cli`]; a program with stage kinds of its own calls
//! the same function with its registry (see `apps/examples/custom_stage.rs`).

fn main() -> std::process::ExitCode {
    dataplane_apps::cli::main(dataplane_apps::stages::Registry::new())
}

//! `dataplane`: check or run a TOML pipeline with the built-in stage kinds and the packet
//! stages (`mac-swap`, `ipv4-router`: [`dataplane_apps::packet`]).
//!
//! The command line is [`dataplane_apps::cli`]; a program with stage kinds of its own calls
//! the same function with its registry (see `apps/examples/custom_stage.rs`).

fn main() -> std::process::ExitCode {
    let mut registry = dataplane_apps::stages::Registry::new();
    if let Err(e) = dataplane_apps::packet::register(&mut registry) {
        eprintln!("dataplane: {e}");
        return std::process::ExitCode::FAILURE;
    }
    dataplane_apps::cli::main(registry)
}

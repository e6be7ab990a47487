//! `dataplane-trading`: the `dataplane` command line with the trading stages registered.
//!
//! ```text
//! dataplane-trading run config/examples/trading/trading.toml --duration 5s
//! dataplane-trading kinds
//! ```

use std::process::ExitCode;

fn main() -> ExitCode {
    match dataplane_trading::stages::registry() {
        Ok(r) => dataplane_apps::cli::main(r),
        Err(e) => {
            eprintln!("dataplane-trading: {e}");
            ExitCode::from(1)
        }
    }
}

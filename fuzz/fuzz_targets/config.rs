//! Arbitrary text as a pipeline config: parse, validate on a fixed two-core machine, and
//! re-parse each stage's `params` as a small typed table. Every step must return a value or
//! an error, never panic.
#![no_main]

use dataplane_config::{Config, ValidationEnv};
use libfuzzer_sys::fuzz_target;
use serde::Deserialize;

/// A stand-in for a stage's typed parameters: a few shapes serde has to check.
#[derive(Deserialize)]
#[allow(dead_code)] // read only by serde
struct Params {
    depth: Option<std::num::NonZeroU32>,
    name: Option<String>,
    ratio: Option<f64>,
    list: Option<Vec<u16>>,
}

/// The same, refusing unknown keys (the path stages with `deny_unknown_fields` take).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // read only by serde
struct Strict {
    depth: u32,
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let env = ValidationEnv::with_cores([0, 1]);
    let Ok(cfg) = Config::from_str(text, "fuzz.toml") else { return };
    // Rendering an error walks its spans back into the source text: do it too.
    if let Err(e) = cfg.validate(&env) {
        let _ = e.to_string();
    }
    for i in 0..=cfg.stages.len() {
        if let Err(e) = cfg.stage_params::<Params>(i) {
            let _ = e.to_string();
        }
        if let Err(e) = cfg.stage_params::<Strict>(i) {
            let _ = e.to_string();
        }
    }
});

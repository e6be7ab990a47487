//! Helpers shared by the integration tests (included with `mod common;`).
#![allow(dead_code)]

use dataplane_config::{Config, ConfigError, ValidationEnv};

/// A valid two-worker pipeline. Line numbers matter to the tests:
/// 3 `core = 0`, 7 `core = 1`, 23 `output = "a"` (stage src), 35 `input = "a"` (stage sink).
pub const BASE: &str = r#"[[workers]]
name = "w0"
core = 0

[[workers]]
name = "w1"
core = 1

[[qps]]
name = "a"
worker = "w0"
peer = "b"

[[qps]]
name = "b"
worker = "w1"
peer = "a"

[[stages]]
name = "src"
worker = "w0"
kind = "source"
output = "a"

[[stages]]
name = "echo"
worker = "w1"
kind = "echo"
input = "b"

[[stages]]
name = "sink"
worker = "w0"
kind = "sink"
input = "a"
"#;

/// The environment of the tests: a 2-core machine, memory unknown.
pub fn env() -> ValidationEnv {
    ValidationEnv::with_cores([0, 1])
}

/// `BASE` with `from` replaced by `to` (which must occur exactly once).
pub fn base_with(from: &str, to: &str) -> String {
    assert_eq!(BASE.matches(from).count(), 1, "`{from}` must occur once in BASE");
    BASE.replacen(from, to, 1)
}

/// Parse errors, or else validation errors, of `text` (named `pipeline.toml`).
pub fn errors(text: &str) -> Vec<ConfigError> {
    errors_in(text, &env())
}

/// Same as [`errors`] with a given environment.
pub fn errors_in(text: &str, env: &ValidationEnv) -> Vec<ConfigError> {
    match Config::from_str(text, "pipeline.toml") {
        Err(e) => e.0,
        Ok(c) => c.validate(env).err().map(|e| e.0).unwrap_or_default(),
    }
}

/// The single error of `text`, as a line; fails if there is not exactly one.
pub fn one_error(text: &str) -> ConfigError {
    let errs = errors(text);
    assert_eq!(
        errs.len(),
        1,
        "expected one error, got:\n{}",
        errs.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("\n")
    );
    errs.into_iter().next().unwrap()
}

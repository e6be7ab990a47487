//! A stage kind defined outside the `dataplane` crates (here, in this test crate) runs in a
//! pipeline through the registry, and its parameter errors are located like every other
//! config error.

use dataplane::pipeline::{Handler, Msg, StageCx};
use dataplane_apps::runner::{self, RunOptions};
use dataplane_apps::stages::{Registry, RegistryError};
use dataplane_config::KindShape;
use serde::Deserialize;
use std::num::NonZeroU64;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SampleParams {
    keep_one_in: NonZeroU64,
    #[serde(default)]
    label: String,
}

/// Passes on one message in `every`; counts what it saw in a counter the test reads.
struct Sample {
    every: u64,
    seen: Arc<AtomicU64>,
}

impl Handler for Sample {
    fn on_message(&mut self, msg: Msg, cx: &mut StageCx<'_>) {
        let n = self.seen.fetch_add(1, Ordering::Relaxed) + 1;
        if n % self.every == 0 {
            cx.send(0, msg);
        } else {
            cx.drop_msg(msg);
        }
    }
}

/// A registry with `sample`; `seen` counts its messages, `labels` the labels it was built with.
fn registry(seen: Arc<AtomicU64>, built: Arc<AtomicU64>) -> Registry {
    let mut r = Registry::new();
    r.register("sample", KindShape::filter(), "one in N", move |p: SampleParams, spec| {
        if p.label == "refuse" {
            return Err("label \"refuse\" is refused by the factory".into());
        }
        assert_eq!(spec.outputs(), 1, "the shape was validated before the factory runs");
        built.fetch_add(1, Ordering::Relaxed);
        Ok(Box::new(Sample { every: p.keep_one_in.get(), seen: seen.clone() }))
    })
    .unwrap();
    r
}

const PIPELINE: &str = r#"[provider]
kind = "shm"
fabric = "user-stages"

[[workers]]
name = "client"
core = 0

[[workers]]
name = "server"
core = 1

[[qps]]
name = "client-qp"
worker = "client"
peer = "server-qp"

[[qps]]
name = "server-qp"
worker = "server"
peer = "client-qp"

[[stages]]
name = "pacer"
worker = "client"
kind = "source"
output = "client-qp"
count = 4000

[[stages]]
name = "sampler"
worker = "server"
kind = "sample"
input = "server-qp"
output = "server-qp"
params = { keep_one_in = 4 }

[[stages]]
name = "sink"
worker = "client"
kind = "sink"
input = "client-qp"
"#;

fn write(name: &str, text: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("dp-user-stages-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn a_user_stage_runs_in_a_pipeline() {
    let (seen, built) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let reg = registry(seen.clone(), built.clone());
    let path = write("run.toml", PIPELINE);
    let cfg = reg.load(&path).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(built.load(Ordering::Relaxed), 1, "check builds each user stage once");
    let opts = RunOptions {
        fabric: Some(format!("user-stages-{}", std::process::id())),
        no_pin: true,
        no_stats: true,
        duration: None,
        doorbell_batch: None,
    };
    let report = runner::run(&cfg, &reg, &opts, &AtomicBool::new(false)).unwrap();
    assert!(report.drained);
    assert_eq!(report.pools.iter().map(|p| p.leaked).sum::<usize>(), 0);
    assert_eq!(seen.load(Ordering::Relaxed), 4000, "the user stage saw every message");
    let stage =
        |name: &str| report.workers.iter().flat_map(|w| w.stages.iter()).find(|s| s.name == name).unwrap().clone();
    let sampler = stage("sampler");
    assert_eq!(sampler.kind, "sample");
    assert_eq!((sampler.msgs_in, sampler.msgs_out, sampler.dropped), (4000, 1000, 3000));
    assert_eq!(stage("sink").msgs_in, 1000, "one in four came back");
}

#[test]
fn parameter_errors_name_file_line_and_column() {
    let reg = registry(Arc::default(), Arc::default());
    // A value the user's type refuses: line 36, column 26 (the `0`).
    let path = write("zero.toml", &PIPELINE.replace("keep_one_in = 4", "keep_one_in = 0"));
    let errs = reg.load(&path).unwrap_err();
    assert_eq!(errs.len(), 1, "{errs}");
    let e = &errs.errors()[0];
    assert_eq!(e.field, "stages[1].params.keep_one_in");
    assert_eq!(e.line_column(), Some((36, 26)));
    assert!(e.to_string().starts_with(&format!("{}:36:26: stages[1].params.keep_one_in: ", path.display())), "{e}");
    // A misspelt key, with the closest field suggested.
    let path = write("typo.toml", &PIPELINE.replace("keep_one_in = 4", "keep_one_im = 4"));
    let e = &reg.load(&path).unwrap_err().errors()[0].clone();
    assert_eq!((e.field.as_str(), e.line_column()), ("stages[1].params.keep_one_im", Some((36, 12))));
    assert!(e.message.contains("did you mean `keep_one_in`?"), "{e}");
    // What the factory itself refuses: at the params table.
    let path = write("refuse.toml", &PIPELINE.replace("keep_one_in = 4", "keep_one_in = 4, label = \"refuse\""));
    let e = &reg.load(&path).unwrap_err().errors()[0].clone();
    assert_eq!((e.field.as_str(), e.line_column()), ("stages[1].params", Some((36, 10))));
    assert!(e.message.contains("sample stage `sampler`: label \"refuse\" is refused"), "{e}");
}

#[test]
fn an_unknown_kind_lists_the_registered_ones() {
    let reg = registry(Arc::default(), Arc::default());
    let path = write("unknown.toml", &PIPELINE.replace("kind = \"sample\"", "kind = \"sampel\""));
    let e = &reg.load(&path).unwrap_err().errors()[0].clone();
    assert_eq!(e.line_column(), Some((33, 8)));
    assert_eq!(e.message, "unknown stage kind \"sampel\", did you mean \"sample\"?");
    assert!(e.hint.as_deref().unwrap().ends_with("\"sequencer\", \"sample\""), "{e}");
    // Without the registration (the plain `dataplane` binary), the same file is refused.
    let errs = Registry::new().load(write("plain.toml", PIPELINE)).unwrap_err();
    assert!(errs.errors()[0].message.contains("unknown stage kind \"sample\""), "{errs}");
}

#[test]
fn registration_refuses_taken_and_unwritable_names() {
    let mut reg = Registry::new();
    let f = |_: SampleParams, _: dataplane_apps::stages::StageSpec<'_>| -> dataplane_apps::stages::FactoryResult {
        Err("unused".into())
    };
    assert_eq!(reg.register("echo", KindShape::sink(), "", f).unwrap_err(), RegistryError::Duplicate("echo".into()));
    assert_eq!(reg.register("a b", KindShape::sink(), "", f).unwrap_err(), RegistryError::BadName("a b".into()));
    reg.register("mine", KindShape::sink(), "", f).unwrap();
    assert_eq!(reg.register("mine", KindShape::sink(), "", f).unwrap_err(), RegistryError::Duplicate("mine".into()));
}

#[test]
fn the_plain_binary_lists_the_builtin_kinds() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_dataplane")).arg("kinds").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    for k in ["echo", "forward", "fanout", "sink", "source", "sequencer"] {
        assert!(text.lines().any(|l| l.starts_with(k)), "{k} missing from:\n{text}");
    }
}

//! Every pipeline in `config/examples/` parses and validates on a 2-core machine.

mod common;
use dataplane_config::{Config, StageKind};

#[test]
fn every_example_validates_on_two_cores() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/examples");
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("toml") {
            continue;
        }
        let config = Config::from_file(&path).unwrap_or_else(|e| panic!("{e}"));
        config.validate(&common::env()).unwrap_or_else(|e| panic!("{e}"));
        for w in &config.workers {
            assert!(*w.core <= 1, "{}: core {} on a 2-core machine", path.display(), *w.core);
        }
        names.push(path.file_name().unwrap().to_string_lossy().into_owned());
    }
    names.sort();
    assert_eq!(names, ["echo.toml", "fanout.toml", "forward-chain.toml"]);
}

#[test]
fn echo_example_is_a_paced_shm_loopback() {
    let c = Config::from_file(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/echo.toml")).unwrap();
    assert_eq!(c.provider.kind.as_str(), "shm");
    let src = c.stages.iter().find(|s| *s.kind == StageKind::Source).unwrap();
    assert_eq!(src.rate.to_string(), "100000 msgs/s");
    assert!(c.stages.iter().any(|s| *s.kind == StageKind::Echo));
}

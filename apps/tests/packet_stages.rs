//! The packet stages of the `dataplane` binary (`mac-swap`, `ipv4-router`): listed by
//! `dataplane kinds`, and their parameters checked by `dataplane check` with the file, line
//! and column of the mistake. (Traffic through them runs in tools/xdp/through.sh, as root.)

use std::process::Command;

fn dataplane(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_dataplane")).args(args).output().unwrap();
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

const EXAMPLE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../config/examples/packet/l3router.toml");

#[test]
fn packet_kinds_are_listed() {
    let (ok, text) = dataplane(&["kinds"]);
    assert!(ok, "{text}");
    for k in ["mac-swap", "ipv4-router"] {
        assert!(text.lines().any(|l| l.starts_with(k)), "{k} missing from:\n{text}");
    }
}

#[test]
fn the_router_example_checks() {
    let (ok, text) = dataplane(&["check", EXAMPLE]);
    assert!(ok, "{text}");
}

/// The example with `from` replaced by `to` (once), written to a temporary file.
fn variant(from: &str, to: &str) -> (bool, String) {
    let text = std::fs::read_to_string(EXAMPLE).unwrap();
    assert!(text.contains(from), "{from}");
    let path = std::env::temp_dir().join(format!("l3router-{}-{}.toml", std::process::id(), from.len()));
    std::fs::write(&path, text.replacen(from, to, 1)).unwrap();
    let r = dataplane(&["check", path.to_str().unwrap()]);
    let _ = std::fs::remove_file(&path);
    r
}

#[test]
fn bad_router_parameters_are_refused_with_their_reason() {
    let (ok, text) = variant("prefix = \"10.2.0.0/24\", output = 1", "prefix = \"10.2.0.0/24\", output = 5");
    assert!(!ok);
    assert!(text.contains("routes[1].output = 5: the stage has 2 outputs (0..=1)"), "{text}");
    let (ok, text) = variant("prefix = \"10.1.0.0/24\"", "prefix = \"10.1.0.9/24\"");
    assert!(!ok);
    assert!(text.contains("routes[0].prefix: `10.1.0.9/24` has host bits set"), "{text}");
    let (ok, text) = variant("next_hop_mac = \"02:00:00:00:0a:01\"", "next_hop_mac = \"02:00:00:0a:01\"");
    assert!(!ok);
    assert!(text.contains("routes[0].next_hop_mac"), "{text}");
    let (ok, text) = variant("src_mac = \"02:00:00:00:00:a1\" }", "src_mac = \"02:00:00:00:00:a1\", metric = 1 }");
    assert!(!ok);
    assert!(text.contains("metric"), "{text}");
    assert!(text.contains("l3router-"), "the error names the file: {text}");
}

//! `dp-soak` in cargo test: a short run across every RC opcode must end with 0 lost, 0
//! corrupted, 0 failed completions; and a run that corrupts one payload byte on purpose must
//! fail naming it, so the checker is known to work. The long runs are CI's and
//! docs/reliability.md's.

use std::process::Command;

fn soak(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_dp-soak")).args(args).output().expect("run dp-soak");
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

fn field(text: &str, after: &str) -> u64 {
    let i = text.find(after).unwrap_or_else(|| panic!("no `{after}` in:\n{text}")) + after.len();
    text[i..].trim_start().split(|c: char| !c.is_ascii_digit()).next().unwrap().parse().unwrap()
}

/// The number just before `marker` ("9832 WRITE+READ pairs": 9832).
fn number_before(text: &str, marker: &str) -> u64 {
    let i = text.find(marker).unwrap_or_else(|| panic!("no `{marker}` in:\n{text}"));
    let head = &text[..i];
    let start = head.rfind(|c: char| !c.is_ascii_digit()).map_or(0, |j| j + 1);
    head[start..].parse().unwrap_or_else(|_| panic!("no number before `{marker}` in:\n{text}"))
}

#[test]
fn every_opcode_every_byte_checked_nothing_lost() {
    let (ok, text) = soak(&["--duration", "2", "--seed", "11"]);
    assert!(ok, "{text}");
    assert!(text.contains("dp-soak: ok"), "{text}");
    let sent = field(&text, "client sent");
    assert!(sent > 1000, "too little traffic to mean anything:\n{text}");
    assert_eq!(field(&text, "server received"), sent, "{text}");
    assert!(number_before(&text, " WRITE+READ pairs") > 0, "{text}");
    assert!(number_before(&text, " atomics") > 0, "{text}");
    assert!(text.contains("lost 0, corrupted 0, failed completions 0"), "{text}");
}

#[test]
fn a_corrupted_byte_is_caught() {
    let (ok, text) = soak(&["--duration", "1", "--seed", "5", "--corrupt-at", "300"]);
    assert!(!ok, "a corrupted message went unnoticed:\n{text}");
    assert!(text.contains("message 300") && text.contains("differs"), "{text}");
    assert!(text.contains("1 corrupted messages"), "{text}");
}

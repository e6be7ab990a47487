//! The packet stages of the `dataplane` binary: listed by `dataplane kinds`, their parameters
//! checked by `dataplane check` with the file, line and column of the mistake, and a capture
//! replayed through `parse`, `acl` and `pcap-writer` on the shm switch. (Traffic through the
//! router on real interfaces runs in tools/xdp/through.sh, as root.)

use dataplane::net::pcap::PcapFile;
use dataplane_apps::packet;
use dataplane_apps::runner::{self, RunOptions};
use dataplane_apps::stages::Registry;
use std::process::Command;
use std::sync::atomic::AtomicBool;

fn dataplane(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_dataplane")).args(args).output().unwrap();
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

const EXAMPLE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../config/examples/packet/l3router.toml");

#[test]
fn packet_kinds_are_listed() {
    let (ok, text) = dataplane(&["kinds"]);
    assert!(ok, "{text}");
    for k in ["mac-swap", "ipv4-router", "parse", "acl", "pcap-writer", "pcap-reader"] {
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

const PCAP_ACL: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../config/examples/packet/pcap-acl.toml");
const SAMPLE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../config/examples/packet/sample.pcap");

/// The pcap-acl example with its capture files in a directory of its own.
fn pcap_acl_in(dir: &std::path::Path) -> std::path::PathBuf {
    let text = std::fs::read_to_string(PCAP_ACL)
        .unwrap()
        .replace("\"sample.pcap\"", &format!("{SAMPLE:?}"))
        .replace("/tmp/dataplane-kept.pcap", dir.join("kept.pcap").to_str().unwrap())
        .replace("/tmp/dataplane-denied.pcap", dir.join("denied.pcap").to_str().unwrap());
    let path = dir.join("pcap-acl.toml");
    std::fs::write(&path, text).unwrap();
    path
}

fn frames(path: &std::path::Path) -> Vec<Vec<u8>> {
    let data = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let f = PcapFile::parse(&data).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    f.records().iter().map(|r| f.frame(r).to_vec()).collect()
}

/// The whole packet path without an interface: a pcap replayed through the shm switch,
/// `parse` and `acl`, into two pcap files. Every frame of sample.pcap has its expected fate
/// (make-sample.py): the kept and denied captures hold exactly those frames, byte for byte,
/// in order, and the counters say why each of the others was dropped.
#[test]
fn a_capture_replayed_through_parse_and_acl_splits_as_its_rules_say() {
    let dir = std::env::temp_dir().join(format!("dp-pcap-acl-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut reg = Registry::new();
    packet::register(&mut reg).unwrap();
    let cfg = reg.load(pcap_acl_in(&dir)).unwrap_or_else(|e| panic!("{e}"));
    let opts = RunOptions {
        fabric: Some(format!("pcap-acl-{}", std::process::id())),
        no_pin: true,
        no_stats: true,
        duration: None,
        doorbell_batch: None,
    };
    let report = runner::run(&cfg, &reg, &opts, &AtomicBool::new(false)).unwrap();
    let stage = |name: &str| report.workers.iter().flat_map(|w| w.stages.iter()).find(|s| s.name == name).unwrap();
    let value = |s: &str, v: &str| {
        stage(s).report.values.iter().find(|(n, _)| *n == v).map(|(_, x)| *x).unwrap_or_else(|| panic!("{s}.{v}"))
    };
    assert_eq!(value("replay", "replayed"), 12);
    assert_eq!((value("parse", "drop_bad_ipv4_checksum"), value("parse", "drop_bad_tcp_header")), (1, 1));
    assert_eq!((value("parse", "ipv4"), value("parse", "ipv6"), value("parse", "arp")), (8, 1, 1));
    assert_eq!((stage("acl").msgs_in, value("acl", "passed"), value("acl", "denied")), (10, 6, 4));
    let hits: Vec<u64> = (0..5).map(|i| value("acl", ["rule_0", "rule_1", "rule_2", "rule_3", "rule_4"][i])).collect();
    assert_eq!((hits, value("acl", "no_rule_matched")), (vec![1, 3, 1, 1, 1], 3));
    assert_eq!(report.pools.iter().map(|p| p.leaked).sum::<usize>(), 0);

    let sample = frames(std::path::Path::new(SAMPLE));
    let pick = |idx: &[usize]| idx.iter().map(|&i| sample[i].clone()).collect::<Vec<_>>();
    assert_eq!(frames(&dir.join("kept.pcap")), pick(&[0, 1, 4, 5, 6, 10]), "kept: the frames the rules pass");
    assert_eq!(frames(&dir.join("denied.pcap")), pick(&[2, 3, 7, 11]), "denied: by rule 0 and by default");

    // tcpdump reads what the writer wrote (CI installs it; elsewhere it may be missing).
    match Command::new("tcpdump").arg("-nr").arg(dir.join("kept.pcap")).output() {
        Ok(out) => {
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(out.status.success(), "tcpdump -r: {}", String::from_utf8_lossy(&out.stderr));
            assert_eq!(text.lines().count(), 6, "{text}");
            assert!(text.contains("10.1.0.2.33000 > 10.2.0.9.80: Flags [S]"), "{text}");
        }
        Err(e) if std::env::var_os("CI").is_some() => panic!("tcpdump is needed on CI: {e}"),
        Err(e) => eprintln!("NOT RUN: tcpdump -r on the capture: {e}"),
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_damaged_capture_is_refused_by_check_naming_the_byte() {
    let dir = std::env::temp_dir().join(format!("dp-pcap-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut data = std::fs::read(SAMPLE).unwrap();
    data.truncate(110);
    std::fs::write(dir.join("cut.pcap"), data).unwrap();
    let path = pcap_acl_in(&dir);
    let text = std::fs::read_to_string(&path).unwrap().replace(&format!("{SAMPLE:?}"), "\"cut.pcap\"");
    std::fs::write(&path, text).unwrap();
    let (ok, out) = dataplane(&["check", path.to_str().unwrap()]);
    assert!(!ok);
    assert!(out.contains("pcap-reader stage `replay`: path "), "{out}");
    assert!(out.contains("cut.pcap: record 1 at byte 91: 51 bytes announced, 3 left in the file"), "{out}");
    assert!(!dir.join("kept.pcap").exists(), "check creates no capture file");
    let _ = std::fs::remove_dir_all(&dir);
}

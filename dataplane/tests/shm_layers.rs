//! The `shm` provider's data path is a one-way stack (docs/shm-provider.md, "The stack,
//! top-down"): each stage's file names (`super::stage`) only stages below it, and no set of
//! its modules names each other in a circle. This reads the sources, so a change that
//! makes a stage reach upward fails here rather than in a review.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The stack, top to bottom. A stage may use any stage after it, never one before it.
const STACK: &[&str] = &[
    "doorbell", "drain", "exec", "sq", "dest", "place", "recvq", "complete", "msgq", "fabric", "wire", "ring", "cell",
    "layout",
];

/// `super::name` references of each module of `src/shm` (test modules left out: a unit
/// test may reach anywhere), restricted to names that are modules of `src/shm`.
fn imports() -> BTreeMap<String, BTreeSet<String>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/shm");
    let mut files = BTreeMap::new();
    for e in std::fs::read_dir(&dir).expect("src/shm") {
        let p = e.expect("dir entry").path();
        if p.extension().is_some_and(|x| x == "rs") {
            let name = p.file_stem().expect("stem").to_string_lossy().into_owned();
            files.insert(name, std::fs::read_to_string(&p).expect("source"));
        }
    }
    let modules: BTreeSet<String> = files.keys().filter(|m| *m != "mod").cloned().collect();
    let mut graph = BTreeMap::new();
    for (name, src) in &files {
        if name == "mod" {
            continue;
        }
        let mut deps = BTreeSet::new();
        for line in non_test_lines(src).filter(|l| !l.trim_start().starts_with("//")) {
            let mut rest = line;
            while let Some(i) = rest.find("super::") {
                rest = &rest[i + "super::".len()..];
                let word: String = rest.chars().take_while(|c| c.is_ascii_lowercase() || *c == '_').collect();
                if modules.contains(&word) && word != *name {
                    deps.insert(word);
                }
            }
        }
        graph.insert(name.clone(), deps);
    }
    graph
}

/// The lines of `src` outside its test modules: a `#[cfg(...test...)]` attribute followed by
/// a `mod` item drops that module, to its closing brace (counted; the provider's sources
/// keep braces balanced outside character literals). A test-only attribute on anything else
/// drops nothing, so at worst a test-only import counts as an edge.
fn non_test_lines(src: &str) -> impl Iterator<Item = &str> {
    let lines: Vec<&str> = src.lines().collect();
    let mut keep = Vec::with_capacity(lines.len());
    let mut i = 0;
    while i < lines.len() {
        let t = lines[i].trim_start();
        let next = lines.get(i + 1).map_or("", |l| l.trim_start());
        let is_mod = ["mod ", "pub mod ", "pub(crate) mod "].iter().any(|p| next.starts_with(p));
        if t.starts_with("#[cfg(") && t.contains("test") && is_mod {
            let mut depth = 0i64;
            let mut opened = false;
            i += 1;
            while i < lines.len() {
                for c in lines[i].chars() {
                    match c {
                        '{' => {
                            depth += 1;
                            opened = true;
                        }
                        '}' => depth -= 1,
                        _ => {}
                    }
                }
                i += 1;
                if opened && depth <= 0 {
                    break;
                }
            }
            continue;
        }
        keep.push(lines[i]);
        i += 1;
    }
    keep.into_iter()
}

#[test]
fn each_stage_of_the_stack_names_only_stages_below_it() {
    let graph = imports();
    let mut wrong = Vec::new();
    for (i, stage) in STACK.iter().enumerate() {
        let deps = graph.get(*stage).unwrap_or_else(|| panic!("stage {stage} has no file in src/shm"));
        for up in &STACK[..i] {
            if deps.contains(*up) {
                wrong.push(format!("{stage} -> {up}"));
            }
        }
    }
    assert!(wrong.is_empty(), "stages reaching upward: {wrong:?}");
}

#[test]
fn no_modules_of_the_provider_name_each_other_in_a_circle() {
    let graph = imports();
    // Depth-first search with colours: a grey module reached again closes a circle.
    fn visit<'a>(
        m: &'a str,
        graph: &'a BTreeMap<String, BTreeSet<String>>,
        colour: &mut BTreeMap<&'a str, u8>,
        path: &mut Vec<&'a str>,
    ) -> Option<Vec<String>> {
        match colour.get(m) {
            Some(2) => return None,
            Some(1) => {
                let at = path.iter().position(|p| *p == m).unwrap_or(0);
                let mut cycle: Vec<String> = path[at..].iter().map(|s| s.to_string()).collect();
                cycle.push(m.to_string());
                return Some(cycle);
            }
            _ => {}
        }
        colour.insert(m, 1);
        path.push(m);
        for d in graph.get(m).into_iter().flatten() {
            if let Some(c) = visit(d, graph, colour, path) {
                return Some(c);
            }
        }
        path.pop();
        colour.insert(m, 2);
        None
    }
    let mut colour = BTreeMap::new();
    for m in graph.keys() {
        let mut path = Vec::new();
        if let Some(cycle) = visit(m, &graph, &mut colour, &mut path) {
            panic!("modules of src/shm in a circle: {}", cycle.join(" -> "));
        }
    }
}

#[test]
fn the_reader_sees_the_imports_it_checks() {
    // The checks above mean something only if the parse finds real edges.
    let graph = imports();
    assert!(graph["doorbell"].contains("exec"), "doorbell uses exec: {:?}", graph["doorbell"]);
    assert!(graph["exec"].contains("complete"), "exec uses complete: {:?}", graph["exec"]);
    assert!(!graph["complete"].contains("cq"), "the completion stage does not use the CQ object");
    // Code after a test-only item in the middle of a file is still read (wire.rs has a
    // test-only import above its real ones; drain.rs a test-only branch in `mode`).
    assert!(graph["wire"].contains("ring"), "wire uses ring: {:?}", graph["wire"]);
    assert!(graph["drain"].contains("recvq"), "drain uses recvq: {:?}", graph["drain"]);
    // And test modules are left out, whatever their cfg (msgq has three).
    let msgq = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/shm/msgq.rs")).expect("msgq");
    for m in ["mod test_mem", "mod tests", "mod loom_tests"] {
        assert!(non_test_lines(&msgq).all(|l| !l.contains(m)), "msgq's `{m}` is left out");
    }
    assert!(non_test_lines(&msgq).any(|l| l.contains("pub fn write(")), "msgq's own code is kept");
}

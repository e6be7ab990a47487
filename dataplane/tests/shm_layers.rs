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
        let code = src.split("#[cfg(test)]").next().unwrap_or(src);
        let mut deps = BTreeSet::new();
        for line in code.lines().filter(|l| !l.trim_start().starts_with("//")) {
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
}

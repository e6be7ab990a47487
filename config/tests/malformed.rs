//! No input makes parsing or validation panic, and every error stays on one line.

mod common;
use dataplane_config::{Config, PageSize, ValidationEnv};

fn check(text: &str) {
    let envs = [
        ValidationEnv::with_cores([0, 1]),
        ValidationEnv::with_cores([]).with_free_hugepages(PageSize::Huge2M, 0).with_mem_available(0),
    ];
    let errors = match Config::from_str(text, "fuzz.toml") {
        Err(e) => vec![e],
        Ok(c) => envs.iter().filter_map(|env| c.validate(env).err()).collect(),
    };
    for errs in errors {
        assert!(!errs.is_empty());
        for e in errs.iter() {
            let line = e.to_string();
            assert!(!line.contains('\n') && !line.contains('\r'), "multi-line error: {line:?}");
        }
    }
}

#[test]
fn malformed_inputs_do_not_panic() {
    let nested = "a = ".to_owned() + &"[".repeat(5000);
    let inputs = [
        "",
        "[",
        "[[",
        "=",
        "\u{0}\u{1}\u{7f}",
        "\u{feff}[provider]",
        "workers = 5",
        "workers = [1, 2]",
        "workers = [{}]",
        "[[workers]]\nname = \"w\"\ncore = -1",
        "[[workers]]\nname = \"w\"\ncore = 99999999999999999999999",
        "[[workers]]\nname = \"w\"\ncore = 18446744073709551615",
        "[[workers]]\nname = \"w\"\ncore = 1.5",
        "[[workers]]\nname = \"w\\nx\"\ncore = 0",
        "[[workers]]\nname = \"\"\ncore = 0\ncq_depth = 0\nsrq_depth = 0\npoll_burst = 0",
        "[[workers]]\nname = \"w\"\ncore = 0\nsrq_depth = 4294967295\ncq_depth = 4294967295",
        "[memory]\npage_size = \"3M\"",
        "[memory]\nhugepages = \"require\"\npage_size = \"1G\"\n[[memory.pools]]\nname = \"p\"\nbuffer_size = \"16T\"\ncount = 4294967295",
        "[memory]\npools = []\n[[workers]]\nname = \"w\"\ncore = 0",
        "[provider]\nkind = \"rdma\"\nport = 0\ndevice = \"\"\nfabric = \"x\"",
        "[provider]\nfabric_size = \"999999999999999999999T\"",
        "[provider]\nfabric_size = \"-1\"",
        "[[qps]]\nname = \"a\"\nworker = \"nope\"\npeer = \":\"",
        "[[qps]]\nname = \"a\"\nworker = \"nope\"\nlisten = \":\"\npeer = \"[\"",
        "[[qps]]\nname = \"a\"\nworker = \"nope\"\nlisten = \"[]:99999999999\"\ntransport = \"ud\"",
        "[[qps]]\nname = \"a\"\nworker = \"nope\"\nlisten = \"\u{0}:\u{7f}\"",
        "[[qps]]\nname = \"a\"\nworker = \"w\"\npeer = \"[::1]:99999\"",
        "[[qps]]\nname = \"a\"\nworker = \"w\"\npeer = \"a\"\nsend_depth = 0\nsignal_interval = 0",
        "[[stages]]\nname = \"x\"\nworker = \"y\"\nkind = \"fanout\"\ninput = \"x\"\noutputs = [\"x\", \"x\"]",
        "[[stages]]\nname = \"s\"\nworker = \"w\"\nkind = \"source\"\nrate = 0\nmessage_size = 0\ncount = 1\nduration = \"1h\"",
        "[[stages]]\nname = \"s\"\nworker = \"w\"\nkind = \"source\"\nduration = \"99999999999999999999h\"",
        "[[stages]]\nname = \"s\"\nworker = \"w\"\nkind = \"source\"\nrate = \"fast\"",
        "[[stages]]\nname = \"s\"\nworker = \"w\"\nkind = \"echo\"\ninput = \"s\"\noutput = \"s\"",
        &nested,
    ];
    for text in inputs {
        check(text);
    }
}

#[test]
fn mutations_of_the_reference_do_not_panic() {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/reference.toml")).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    // Drop each line in turn: every field, header and reference goes missing once.
    for skip in 0..lines.len() {
        let mutated: Vec<&str> = lines.iter().enumerate().filter(|&(i, _)| i != skip).map(|(_, l)| *l).collect();
        check(&mutated.join("\n"));
    }
    // Truncate at many points, including inside strings and headers.
    let mut cut = 0;
    while cut < text.len() {
        if text.is_char_boundary(cut) {
            check(&text[..cut]);
        }
        cut += 37;
    }
    // Swap every value for a value of another type.
    for (i, line) in lines.iter().enumerate() {
        if let Some((key, _)) = line.split_once(" = ") {
            for value in ["\"x\"", "-1", "[]", "{}", "true", "0"] {
                let mut mutated = lines.clone();
                let replaced = format!("{key} = {value}");
                mutated[i] = &replaced;
                check(&mutated.join("\n"));
            }
        }
    }
}

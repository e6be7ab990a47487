//! Stage kinds registered by a program: existence, shapes, and `params` read into the
//! program's own types with located errors.

mod common;
use common::*;
use dataplane_config::{Config, ErrorKind, KindShape, ValidationEnv};
use serde::Deserialize;
use std::num::NonZeroU32;

/// BASE with the echo stage replaced by a registered `book` filter between two stages.
fn with_book(params: &str) -> String {
    base_with(
        "[[stages]]\nname = \"echo\"\nworker = \"w1\"\nkind = \"echo\"\ninput = \"b\"\n",
        &format!(
            "[[stages]]\nname = \"echo\"\nworker = \"w1\"\nkind = \"book\"\ninput = \"b\"\noutput = \"b\"\n{params}"
        ),
    )
}

fn env_with_book(shape: KindShape) -> ValidationEnv {
    env().with_kinds([("book", shape)])
}

#[derive(Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
struct Book {
    depth: NonZeroU32,
    #[serde(default)]
    symbol: String,
}

#[test]
fn an_unknown_kind_lists_the_registered_ones() {
    let errs = errors_in(&with_book(""), &env().with_kinds([("bok", KindShape::filter())]));
    assert_eq!(errs.len(), 1, "{errs:?}");
    let e = &errs[0];
    assert_eq!(e.kind, ErrorKind::UnknownVariant);
    assert_eq!(e.field, "stages[1].kind");
    assert_eq!(e.line_column(), Some((28, 8)));
    assert_eq!(
        e.to_string(),
        "pipeline.toml:28:8: stages[1].kind: unknown stage kind \"book\", did you mean \"bok\"?; hint: the kinds this program knows: \"echo\", \"forward\", \"fanout\", \"sink\", \"source\", \"sequencer\", \"bok\""
    );
}

#[test]
fn a_registered_kind_validates() {
    let errs = errors_in(&with_book("params = { depth = 3 }\n"), &env_with_book(KindShape::filter()));
    assert!(errs.is_empty(), "{errs:?}");
}

#[test]
fn the_shape_of_a_registered_kind_is_checked() {
    // A sink-shaped kind given an output.
    let errs = errors_in(&with_book(""), &env_with_book(KindShape::sink()));
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert_eq!(errs[0].field, "stages[1].output");
    assert_eq!(errs[0].line_column(), Some((30, 10)));
    assert!(errs[0].message.contains("book stage `echo` takes no output, and has 1"), "{}", errs[0]);
    // A source-shaped kind given an input.
    let errs = errors_in(&with_book(""), &env_with_book(KindShape::source()));
    assert!(errs.iter().any(|e| e.field == "stages[1].input" && e.message.contains("takes no `input`")), "{errs:?}");
    // Two outputs where at most one is allowed.
    let text = with_book("").replace("output = \"b\"\n", "outputs = [\"b\", \"sink\"]\n");
    let errs = errors_in(&text, &env_with_book(KindShape::filter()));
    assert!(errs.iter().any(|e| e.field == "stages[1].outputs" && e.message.contains("exactly 1 output")), "{errs:?}");
}

#[test]
fn builtin_fields_and_params_stay_where_they_belong() {
    // `rate` on a registered kind.
    let errs = errors_in(&with_book("rate = 100\n"), &env_with_book(KindShape::filter()));
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert_eq!(errs[0].field, "stages[1].rate");
    assert!(errs[0].hint.as_deref().unwrap_or("").contains("`params` table"), "{}", errs[0]);
    // `params` on a built-in kind.
    let e = one_error(&base_with("input = \"b\"\n", "input = \"b\"\nparams = { x = 1 }\n"));
    assert_eq!(e.field, "stages[1].params");
    assert_eq!(e.line_column(), Some((30, 10)));
    assert!(e.message.contains("only to registered stage kinds"), "{e}");
}

#[test]
fn params_are_read_into_the_programs_type() {
    let inline = Config::from_str(&with_book("params = { depth = 3, symbol = \"AAPL\" }\n"), "pipeline.toml").unwrap();
    assert_eq!(
        inline.stage_params::<Book>(1).unwrap(),
        Book { depth: NonZeroU32::new(3).unwrap(), symbol: "AAPL".into() }
    );
    // The same as a [stages.params] table after the stage's header.
    let table = Config::from_str(&with_book("\n[stages.params]\ndepth = 5\n"), "pipeline.toml").unwrap();
    assert_eq!(table.stage_params::<Book>(1).unwrap().depth.get(), 5);
}

#[test]
fn params_errors_are_located_at_the_key() {
    // A value the type refuses (NonZeroU32), in a [stages.params] table: line 33, column 9.
    let cfg = Config::from_str(&with_book("\n[stages.params]\ndepth = 0\n"), "pipeline.toml").unwrap();
    let e = cfg.stage_params::<Book>(1).unwrap_err().0.remove(0);
    assert_eq!(e.field, "stages[1].params.depth");
    assert_eq!(e.line_column(), Some((33, 9)), "{e}");
    assert_eq!(e.kind, ErrorKind::WrongType);
    // An unknown key, inline: the closest known field is suggested.
    let cfg = Config::from_str(&with_book("params = { dept = 3 }\n"), "pipeline.toml").unwrap();
    let e = cfg.stage_params::<Book>(1).unwrap_err().0.remove(0);
    assert_eq!(e.kind, ErrorKind::UnknownField);
    assert_eq!(e.field, "stages[1].params.dept");
    assert_eq!(e.line_column(), Some((31, 12)), "{e}");
    assert!(e.message.contains("did you mean `depth`?"), "{e}");
    // A wrong type.
    let cfg = Config::from_str(&with_book("params = { depth = \"deep\" }\n"), "pipeline.toml").unwrap();
    let e = cfg.stage_params::<Book>(1).unwrap_err().0.remove(0);
    assert_eq!((e.field.as_str(), e.line_column()), ("stages[1].params.depth", Some((31, 20))), "{e}");
    // No params at all: the required field is missing, reported at the stage.
    let cfg = Config::from_str(&with_book(""), "pipeline.toml").unwrap();
    let e = cfg.stage_params::<Book>(1).unwrap_err().0.remove(0);
    assert_eq!(e.kind, ErrorKind::MissingField);
    assert_eq!((e.field.as_str(), e.line_column()), ("stages[1].params", Some((26, 8))), "{e}");
    assert!(e.hint.as_deref().unwrap_or("").contains("`params` table of stage `echo`"), "{e}");
}

#[test]
fn params_of_a_table_type_refuse_other_values() {
    let e = Config::from_str(&with_book("params = 3\n"), "pipeline.toml").unwrap_err().0.remove(0);
    assert_eq!(e.field, "stages[1].params");
    assert_eq!(e.kind, ErrorKind::WrongType);
}

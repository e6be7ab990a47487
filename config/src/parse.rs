//! Parsing: TOML text to [`Config`], with TOML and serde errors turned into located
//! [`ConfigError`]s (field path, line:column, typo suggestions).

use crate::error::{closest, ConfigError, ConfigErrors, ErrorKind};
use crate::schema::Config;
use crate::source::Source;

/// Marker that `serde_spanned` puts into serde paths; not a user-visible key.
const SPANNED_KEY: &str = "$__serde_spanned_private_value";

pub(crate) fn parse(source: Source) -> Result<Config, ConfigErrors> {
    let text = source.text().to_owned();
    let de = toml::Deserializer::new(&text);
    match serde_path_to_error::deserialize::<_, Config>(de) {
        Ok(mut config) => {
            config.source = source;
            Ok(config)
        }
        Err(e) => {
            let path = clean_path(&e.path().to_string());
            let inner = e.into_inner();
            Err(translate(&source, path, inner.message(), inner.span()).into())
        }
    }
}

/// `workers[1].$__serde_spanned_private_value.core` to `workers[1].core`; `.` to ``.
pub(crate) fn clean_path(path: &str) -> String {
    path.split('.')
        .filter(|seg| !seg.is_empty() && *seg != SPANNED_KEY)
        .map(|seg| seg.replace(SPANNED_KEY, ""))
        .collect::<Vec<_>>()
        .join(".")
        .replace(".[", "[")
}

/// The backtick-quoted words of a serde message, in order.
fn quoted(message: &str) -> Vec<&str> {
    message.split('`').skip(1).step_by(2).collect()
}

pub(crate) fn translate(
    source: &Source,
    field: String,
    message: &str,
    span: Option<std::ops::Range<usize>>,
) -> ConfigError {
    let error = |kind, msg: &str| ConfigError::new(kind, source, span.clone(), field.clone(), msg);

    if message.starts_with("unknown field `") {
        let words = quoted(message);
        let unknown = words.first().copied().unwrap_or_default();
        let known = words.get(1..).unwrap_or_default();
        let known_list = known.iter().map(|k| format!("`{k}`")).collect::<Vec<_>>().join(", ");
        let hint = if known.is_empty() {
            "this table takes no fields".to_owned()
        } else {
            format!("known fields here: {known_list}")
        };
        let msg = match closest(unknown, known.iter().copied()) {
            Some(s) => format!("unknown field `{unknown}`, did you mean `{s}`?"),
            None => format!("unknown field `{unknown}`"),
        };
        return error(ErrorKind::UnknownField, &msg).with_hint(hint);
    }

    if message.starts_with("unknown variant `") {
        let words = quoted(message);
        let unknown = words.first().copied().unwrap_or_default();
        let known = words.get(1..).unwrap_or_default();
        let known_list = known.iter().map(|k| format!("\"{k}\"")).collect::<Vec<_>>().join(", ");
        let msg = match closest(unknown, known.iter().copied()) {
            Some(s) => format!("unknown value \"{unknown}\", did you mean \"{s}\"?"),
            None => format!("unknown value \"{unknown}\""),
        };
        return error(ErrorKind::UnknownVariant, &msg).with_hint(format!("expected one of {known_list}"));
    }

    if message.starts_with("missing field `") {
        let words = quoted(message);
        let missing = words.first().copied().unwrap_or_default();
        let msg = format!("missing required field `{missing}`");
        let table = if field.is_empty() { "the file" } else { "this table" };
        return error(ErrorKind::MissingField, &msg).with_hint(format!("add `{missing} = ...` to {table}"));
    }

    if message.starts_with("invalid type: ")
        || message.starts_with("invalid value: ")
        || message.starts_with("invalid length ")
    {
        let (msg, hint) = explain_type_error(message);
        let e = error(ErrorKind::WrongType, &msg);
        return match hint {
            Some(h) => e.with_hint(h),
            None => e,
        };
    }

    if message.starts_with("invalid size ")
        || message.starts_with("invalid duration ")
        || message.starts_with("invalid rate ")
    {
        return error(ErrorKind::WrongType, message);
    }

    // toml's own messages for an enum written as something other than a string.
    if message == "wanted string or table" || message.starts_with("wanted exactly 1 element") {
        return error(ErrorKind::WrongType, "invalid type, expected a string")
            .with_hint("write one of the allowed values as a string in double quotes");
    }

    if message.starts_with("duplicate key") {
        return error(ErrorKind::Duplicate, message)
            .with_hint("a key may appear only once in a table; remove one of them");
    }

    // Everything else comes from the TOML parser itself.
    error(ErrorKind::Syntax, message).with_hint("see https://toml.io/en/v1.0.0 for the syntax")
}

/// Rewrites serde's Rust type names into words, and suggests the usual fix.
fn explain_type_error(message: &str) -> (String, Option<String>) {
    let (head, expected) = match message.rsplit_once(", expected ") {
        Some((h, e)) => (h, e),
        None => return (message.to_owned(), None),
    };
    let words = match expected {
        "u8" => "an integer from 0 to 255",
        "u16" => "an integer from 0 to 65535",
        "u32" => "an integer from 0 to 4294967295",
        "u64" | "usize" => "a non-negative integer",
        "a sequence" => "an array",
        e if e.starts_with("struct ") => "a table",
        other => other,
    };
    // serde's data model names to TOML's.
    let head = head
        .replacen("invalid type: map", "invalid type: table", 1)
        .replacen("invalid type: sequence", "invalid type: array", 1)
        .replacen("invalid type: floating point", "invalid type: float", 1);
    let head = head.as_str();
    let integer = matches!(expected, "u8" | "u16" | "u32" | "u64" | "usize");
    let hint = if head.starts_with("invalid type: string") && integer {
        Some("write numbers without quotes, e.g. `core = 1`".to_owned())
    } else if head.starts_with("invalid type: string") && expected == "a boolean" {
        Some("write `true` or `false` without quotes".to_owned())
    } else if expected == "a sequence" {
        Some(
            "write an array in brackets, e.g. `[\"a\", \"b\"]`, or repeat a `[[table]]` header for an array of tables"
                .to_owned(),
        )
    } else if expected == "a string" && !head.starts_with("invalid type: string") {
        Some("put strings in double quotes, e.g. `name = \"w0\"`".to_owned())
    } else {
        None
    };
    (format!("{head}, expected {words}"), hint)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths() {
        assert_eq!(
            clean_path("workers[1].$__serde_spanned_private_value.core.$__serde_spanned_private_value"),
            "workers[1].core"
        );
        assert_eq!(clean_path("."), "");
        assert_eq!(
            clean_path("stages[0].$__serde_spanned_private_value.outputs.$__serde_spanned_private_value[1].$__serde_spanned_private_value"),
            "stages[0].outputs[1]"
        );
    }
}

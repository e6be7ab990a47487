//! The two JSON primitives the apps' hand-written JSON needs (no serde_json dependency for a
//! few flat objects).

use std::fmt::Write;

/// `s` as a JSON string literal, quoted and escaped.
pub fn string(s: &str) -> String {
    let mut o = String::with_capacity(s.len() + 2);
    o.push('"');
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(o, "\\u{:04x}", c as u32);
            }
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

/// `f` as a JSON number with 6 decimals (0 for NaN and infinities, which JSON cannot carry).
pub fn number(f: f64) -> String {
    if f.is_finite() {
        format!("{f:.6}")
    } else {
        "0".into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_are_escaped_and_numbers_finite() {
        assert_eq!(string("a\"b\\c\n"), "\"a\\\"b\\\\c\\u000a\"");
        assert_eq!(number(1.5), "1.500000");
        assert_eq!(number(f64::NAN), "0");
    }
}

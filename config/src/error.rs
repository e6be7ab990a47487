//! [`ConfigError`] and [`ConfigErrors`]: one-line, located errors.

use crate::source::{Location, Source};
use std::fmt;
use std::ops::Range;
use std::path::PathBuf;

/// What went wrong, broadly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The file could not be read.
    Io,
    /// The text is not valid TOML.
    Syntax,
    /// A key that the schema does not know (usually a typo).
    UnknownField,
    /// A string that is not one of an enum's values (usually a typo).
    UnknownVariant,
    /// A value of the wrong type or out of its type's range (`core = "one"`, `port = 300`).
    WrongType,
    /// A required field is absent.
    MissingField,
    /// A value breaks a rule (a range, a relation between fields, a kind's requirements).
    Invalid,
    /// A name that refers to no worker, pool, QP or stage.
    Dangling,
    /// A name or a core used twice.
    Duplicate,
    /// Stages wired in a loop.
    Cycle,
    /// More than the machine has: cores, huge pages, memory.
    Resource,
}

/// One configuration error, located in its file.
///
/// Displays as one line:
/// `pipeline.toml:12:8: workers[1].core: core 64 does not exist (this machine has cores 0-1); hint: ...`.
/// Parts that are unknown are left out (no `line:column` for a value that was not written in
/// the file, no field for a TOML syntax error).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.one_line())]
pub struct ConfigError {
    /// The broad category.
    pub kind: ErrorKind,
    /// The file, as given to the parser.
    pub file: PathBuf,
    /// Where in the file, when known.
    pub location: Option<Location>,
    /// The field path, e.g. `workers[1].core`; empty for errors about the whole file.
    pub field: String,
    /// What is wrong (one line).
    pub message: String,
    /// How to fix it (one line), when there is something useful to say.
    pub hint: Option<String>,
}

/// Replaces line breaks so that every message stays on one line.
fn flatten(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for (i, line) in text.lines().map(str::trim).filter(|l| !l.is_empty()).enumerate() {
        if i > 0 {
            out.push_str("; ");
        }
        out.push_str(line);
    }
    out.replace('\r', " ")
}

impl ConfigError {
    /// A new error; `span` (byte offsets in `source`) gives the location.
    pub fn new(
        kind: ErrorKind,
        source: &Source,
        span: Option<Range<usize>>,
        field: impl Into<String>,
        message: impl AsRef<str>,
    ) -> Self {
        ConfigError {
            kind,
            file: source.path().to_path_buf(),
            location: span.map(|s| source.location(s.start)),
            field: flatten(&field.into()),
            message: flatten(message.as_ref()),
            hint: None,
        }
    }

    /// Adds a hint.
    pub fn with_hint(mut self, hint: impl AsRef<str>) -> Self {
        let hint = flatten(hint.as_ref());
        self.hint = (!hint.is_empty()).then_some(hint);
        self
    }

    /// `(line, column)`, when known.
    pub fn line_column(&self) -> Option<(usize, usize)> {
        self.location.map(|l| (l.line, l.column))
    }

    fn one_line(&self) -> String {
        let mut s = String::new();
        let file = self.file.display().to_string();
        s.push_str(if file.is_empty() { "<config>" } else { &file });
        if let Some(loc) = self.location {
            s.push_str(&format!(":{loc}"));
        }
        s.push_str(": ");
        if !self.field.is_empty() {
            s.push_str(&self.field);
            s.push_str(": ");
        }
        s.push_str(&self.message);
        if let Some(hint) = &self.hint {
            s.push_str("; hint: ");
            s.push_str(hint);
        }
        s
    }
}

/// All the errors found in one configuration, in file order. Displays one error per line.
#[derive(Debug, Clone, PartialEq, Eq, Default, thiserror::Error)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl ConfigErrors {
    /// The errors.
    pub fn errors(&self) -> &[ConfigError] {
        &self.0
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// How many.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// An iterator over the errors.
    pub fn iter(&self) -> std::slice::Iter<'_, ConfigError> {
        self.0.iter()
    }
}

impl From<ConfigError> for ConfigErrors {
    fn from(e: ConfigError) -> Self {
        ConfigErrors(vec![e])
    }
}

impl From<ConfigErrors> for Vec<ConfigError> {
    fn from(e: ConfigErrors) -> Self {
        e.0
    }
}

impl IntoIterator for ConfigErrors {
    type Item = ConfigError;
    type IntoIter = std::vec::IntoIter<ConfigError>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

impl<'a> IntoIterator for &'a ConfigErrors {
    type Item = &'a ConfigError;
    type IntoIter = std::slice::Iter<'a, ConfigError>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

/// The closest of `candidates` to `word`, if it is close enough to be a likely typo; ties go
/// to the alphabetically first, so the answer does not depend on the candidates' order.
pub(crate) fn closest<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let w = word.to_ascii_lowercase();
    let limit = (w.chars().count() / 3).max(2);
    candidates
        .into_iter()
        .filter(|c| !c.is_empty())
        .map(|c| (edit_distance(&w, &c.to_ascii_lowercase()), c))
        .filter(|&(d, _)| d <= limit)
        .min_by(|a, b| a.cmp(b))
        .map(|(_, c)| c)
}

/// Optimal string alignment distance: insertions, deletions, substitutions and adjacent
/// transpositions each cost 1 (so `burts` is 1 away from `burst`).
pub(crate) fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let (n, m) = (a.len(), b.len());
    let mut d = vec![vec![0usize; m + 1]; n + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, v) in d[0].iter_mut().enumerate() {
        *v = j;
    }
    for i in 1..=n {
        for j in 1..=m {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut v = (d[i - 1][j] + 1).min(d[i][j - 1] + 1).min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                v = v.min(d[i - 2][j - 2] + 1);
            }
            d[i][j] = v;
        }
    }
    d[n][m]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distances() {
        assert_eq!(edit_distance("burts", "burst"), 1);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(closest("burts", ["burst", "core", "name"]), Some("burst"));
        assert_eq!(closest("zzzzzz", ["burst", "core"]), None);
        assert_eq!(closest("spinn", ["spin", "spin-then-pause", "backoff"]), Some("spin"));
    }

    #[test]
    fn display_is_one_line() {
        let src = Source::new("pipeline.toml", "a = 1\n\n[x]\n");
        let e = ConfigError::new(ErrorKind::Invalid, &src, Some(7..8), "x.y", "bad\nthing").with_hint("do\nthis");
        assert_eq!(e.to_string(), "pipeline.toml:3:1: x.y: bad; thing; hint: do; this");
        let e = ConfigError::new(ErrorKind::Syntax, &src, None, "", "broken");
        assert_eq!(e.to_string(), "pipeline.toml: broken");
    }
}

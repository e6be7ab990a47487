//! [`Source`]: the file a configuration came from, and byte offset to line:column mapping.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A 1-based line and column (columns count characters, not bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Location {
    /// Line, from 1.
    pub line: usize,
    /// Column, from 1, in characters.
    pub column: usize,
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.line, self.column)
    }
}

/// The path and text of a configuration file.
#[derive(Debug, Clone, Default)]
pub struct Source {
    path: PathBuf,
    text: Arc<str>,
}

impl Source {
    /// A source named `path` (used in messages only) with this text.
    pub fn new(path: impl AsRef<Path>, text: &str) -> Self {
        Source { path: path.as_ref().to_path_buf(), text: text.into() }
    }

    /// The path given for messages; empty for configurations built in code.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The full text.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// The location of a byte offset (clamped to the text, rounded down to a character).
    pub fn location(&self, offset: usize) -> Location {
        let text: &str = &self.text;
        let mut offset = offset.min(text.len());
        while !text.is_char_boundary(offset) {
            offset -= 1;
        }
        let before = &text[..offset];
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        Location { line: before.matches('\n').count() + 1, column: before[line_start..].chars().count() + 1 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations() {
        let s = Source::new("x.toml", "a = 1\nbé = 2\n");
        assert_eq!(s.location(0), Location { line: 1, column: 1 });
        assert_eq!(s.location(6), Location { line: 2, column: 1 });
        // 'é' is two bytes; offset 10 is the `=`: column 4 in characters.
        assert_eq!(s.location(10), Location { line: 2, column: 4 });
        assert_eq!(s.location(8), Location { line: 2, column: 2 });
        assert_eq!(s.location(1000), Location { line: 3, column: 1 });
    }
}

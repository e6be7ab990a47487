//! [`Located`]: a value plus the byte span it was read from.

use serde::{Deserialize, Deserializer};
use std::fmt;
use std::ops::{Deref, DerefMut, Range};

/// A configuration value together with where it came from in the TOML text.
///
/// `span` is the byte range of the value in the source file, or `None` when the value was
/// not written in the file (a default, or a value built in code). Validation uses it to put
/// `line:column` on semantic errors and to tell an explicit setting from a default.
///
/// `Located<T>` dereferences to `T`, and compares, hashes and prints as `T` alone: two values
/// are equal whatever their spans.
#[derive(Clone, Default)]
pub struct Located<T> {
    /// The value.
    pub value: T,
    /// Byte range of the value in the source text; `None` for defaults.
    pub span: Option<Range<usize>>,
}

impl<T> Located<T> {
    /// A value with no source location (a default, or built in code).
    pub const fn new(value: T) -> Self {
        Located { value, span: None }
    }

    /// A value read from `span` of the source text.
    pub fn with_span(value: T, span: Range<usize>) -> Self {
        Located { value, span: Some(span) }
    }

    /// Whether the value was written in the file (rather than defaulted).
    pub fn is_explicit(&self) -> bool {
        self.span.is_some()
    }

    /// The value, dropping the location.
    pub fn into_inner(self) -> T {
        self.value
    }
}

impl<T> Deref for Located<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.value
    }
}

impl<T> DerefMut for Located<T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.value
    }
}

impl<T> From<T> for Located<T> {
    fn from(value: T) -> Self {
        Located::new(value)
    }
}

impl From<&str> for Located<String> {
    fn from(value: &str) -> Self {
        Located::new(value.to_owned())
    }
}

impl<T: PartialEq> PartialEq for Located<T> {
    fn eq(&self, other: &Self) -> bool {
        self.value == other.value
    }
}

impl<T: Eq> Eq for Located<T> {}

impl<T: std::hash::Hash> std::hash::Hash for Located<T> {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.value.hash(state)
    }
}

impl<T: fmt::Debug> fmt::Debug for Located<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.value.fmt(f)
    }
}

impl<T: fmt::Display> fmt::Display for Located<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.value.fmt(f)
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Located<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let spanned = serde_spanned::Spanned::<T>::deserialize(deserializer)?;
        let span = spanned.span();
        Ok(Located::with_span(spanned.into_inner(), span))
    }
}

//! TOML pipeline schema (see issue 5).

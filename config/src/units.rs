//! Value types with a human-friendly TOML spelling: sizes, durations, rates.

use serde::de::{self, Deserialize, Deserializer, Visitor};
use std::fmt;

/// A size in bytes.
///
/// Written as an integer number of bytes (`2048`) or as a string with a binary suffix:
/// `"2K"`, `"64M"`, `"1G"` (also `"2KiB"`, `"2KB"`, `"512B"`; case-insensitive). All
/// suffixes are powers of 1024, as for huge pages.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ByteSize(pub u64);

impl ByteSize {
    /// `n` KiB.
    pub const fn kib(n: u64) -> Self {
        ByteSize(n << 10)
    }
    /// `n` MiB.
    pub const fn mib(n: u64) -> Self {
        ByteSize(n << 20)
    }
    /// `n` GiB.
    pub const fn gib(n: u64) -> Self {
        ByteSize(n << 30)
    }
    /// The size in bytes.
    pub const fn bytes(self) -> u64 {
        self.0
    }

    /// Parses `"64M"`-style text; see the type's documentation.
    pub fn parse(text: &str) -> Result<Self, String> {
        let t = text.trim();
        let digits_end = t.find(|c: char| !c.is_ascii_digit() && c != '_').unwrap_or(t.len());
        let (num, suffix) = t.split_at(digits_end);
        let num: String = num.chars().filter(|&c| c != '_').collect();
        if num.is_empty() {
            return Err(format!(
                "invalid size `{}`: expected a number of bytes or a number with a suffix K, M, G or T, e.g. \"64M\"",
                text.escape_debug()
            ));
        }
        let n: u64 = num.parse().map_err(|_| format!("invalid size `{}`: number too large", text.escape_debug()))?;
        let shift = match suffix.trim().to_ascii_lowercase().as_str() {
            "" | "b" => 0,
            "k" | "kb" | "kib" => 10,
            "m" | "mb" | "mib" => 20,
            "g" | "gb" | "gib" => 30,
            "t" | "tb" | "tib" => 40,
            _ => {
                return Err(format!(
                    "invalid size `{}`: unknown suffix `{}` (use K, M, G or T)",
                    text.escape_debug(),
                    suffix.trim().escape_debug()
                ))
            }
        };
        n.checked_mul(1u64 << shift)
            .map(ByteSize)
            .ok_or_else(|| format!("invalid size `{}`: too large", text.escape_debug()))
    }
}

impl fmt::Display for ByteSize {
    /// Prints the largest exact binary unit: `2K`, `64M`, `1G`, `1000`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        for (shift, unit) in [(40, "T"), (30, "G"), (20, "M"), (10, "K")] {
            if b != 0 && b % (1u64 << shift) == 0 {
                return write!(f, "{}{}", b >> shift, unit);
            }
        }
        write!(f, "{b}")
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = ByteSize;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a size: a number of bytes or a string such as \"2K\", \"64M\", \"1G\"")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<ByteSize, E> {
                Ok(ByteSize(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<ByteSize, E> {
                u64::try_from(v).map(ByteSize).map_err(|_| E::custom(format!("invalid size {v}: must not be negative")))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<ByteSize, E> {
                ByteSize::parse(v).map_err(E::custom)
            }
        }
        d.deserialize_any(V)
    }
}

/// A duration.
///
/// Written as a string with a unit, `"250us"`, `"10ms"`, `"30s"`, `"5m"`, `"1h"` (also `ns`),
/// or as an integer number of seconds. Zero means "no limit" where a field says so.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HumanDuration(pub std::time::Duration);

impl HumanDuration {
    /// `n` seconds.
    pub const fn secs(n: u64) -> Self {
        HumanDuration(std::time::Duration::from_secs(n))
    }

    /// Whether this is zero.
    pub fn is_zero(&self) -> bool {
        self.0.is_zero()
    }

    /// Parses `"10s"`-style text; see the type's documentation.
    pub fn parse(text: &str) -> Result<Self, String> {
        let t = text.trim();
        let digits_end = t.find(|c: char| !c.is_ascii_digit() && c != '_').unwrap_or(t.len());
        let (num, unit) = t.split_at(digits_end);
        let num: String = num.chars().filter(|&c| c != '_').collect();
        let bad = || {
            format!(
                "invalid duration `{}`: expected a number with a unit ns, us, ms, s, m or h, e.g. \"10s\"",
                text.escape_debug()
            )
        };
        if num.is_empty() {
            return Err(bad());
        }
        let n: u64 = num.parse().map_err(|_| bad())?;
        use std::time::Duration as D;
        let d = match unit.trim() {
            "ns" => Some(D::from_nanos(n)),
            "us" | "µs" => Some(D::from_micros(n)),
            "ms" => Some(D::from_millis(n)),
            "s" | "" => Some(D::from_secs(n)),
            "m" | "min" => n.checked_mul(60).map(D::from_secs),
            "h" => n.checked_mul(3600).map(D::from_secs),
            _ => return Err(bad()),
        };
        d.map(HumanDuration).ok_or_else(|| format!("invalid duration `{}`: too large", text.escape_debug()))
    }
}

impl fmt::Display for HumanDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = self.0;
        if d.subsec_nanos() == 0 {
            write!(f, "{}s", d.as_secs())
        } else if d.as_nanos() % 1_000_000 == 0 {
            write!(f, "{}ms", d.as_millis())
        } else if d.as_nanos() % 1_000 == 0 {
            write!(f, "{}us", d.as_micros())
        } else {
            write!(f, "{}ns", d.as_nanos())
        }
    }
}

impl<'de> Deserialize<'de> for HumanDuration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = HumanDuration;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a duration: a string such as \"500ms\" or \"10s\", or a number of seconds")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<HumanDuration, E> {
                Ok(HumanDuration::secs(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<HumanDuration, E> {
                u64::try_from(v)
                    .map(HumanDuration::secs)
                    .map_err(|_| E::custom(format!("invalid duration {v}: must not be negative")))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<HumanDuration, E> {
                HumanDuration::parse(v).map_err(E::custom)
            }
        }
        d.deserialize_any(V)
    }
}

/// A message rate.
///
/// Written as an integer number of messages per second (`100_000`) or `"max"` (as fast as the
/// queues allow).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Rate {
    /// As fast as the queues allow.
    #[default]
    Max,
    /// This many messages per second.
    PerSecond(u64),
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Rate::Max => f.write_str("max"),
            Rate::PerSecond(n) => write!(f, "{n} msgs/s"),
        }
    }
}

impl<'de> Deserialize<'de> for Rate {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Rate;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a rate: a number of messages per second, or \"max\"")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Rate, E> {
                Ok(Rate::PerSecond(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Rate, E> {
                u64::try_from(v)
                    .map(Rate::PerSecond)
                    .map_err(|_| E::custom(format!("invalid rate {v}: must not be negative")))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Rate, E> {
                if v.trim().eq_ignore_ascii_case("max") {
                    Ok(Rate::Max)
                } else {
                    Err(E::custom(format!(
                        "invalid rate `{}`: expected a number of messages per second or \"max\"",
                        v.escape_debug()
                    )))
                }
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(ByteSize::parse("2K"), Ok(ByteSize(2048)));
        assert_eq!(ByteSize::parse("64MiB"), Ok(ByteSize::mib(64)));
        assert_eq!(ByteSize::parse("1g"), Ok(ByteSize::gib(1)));
        assert_eq!(ByteSize::parse("512"), Ok(ByteSize(512)));
        assert!(ByteSize::parse("12X").is_err());
        assert!(ByteSize::parse("M").is_err());
        assert!(ByteSize::parse("99999999999999999999").is_err());
        assert!(ByteSize::parse("99999999999T").is_err());
        assert_eq!(ByteSize::mib(64).to_string(), "64M");
        assert_eq!(ByteSize(1000).to_string(), "1000");
    }

    #[test]
    fn durations() {
        use std::time::Duration as D;
        assert_eq!(HumanDuration::parse("10s").unwrap().0, D::from_secs(10));
        assert_eq!(HumanDuration::parse("250us").unwrap().0, D::from_micros(250));
        assert_eq!(HumanDuration::parse("2m").unwrap().0, D::from_secs(120));
        assert!(HumanDuration::parse("10 parsecs").is_err());
        assert!(HumanDuration::parse("18446744073709551615h").is_err());
        assert_eq!(HumanDuration::parse("1500ms").unwrap().to_string(), "1500ms");
    }
}

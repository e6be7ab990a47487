//! A user stage's `params` table, deserialized into the type its kind was registered with.
//!
//! Parsing keeps `params` only as a span ([`crate::schema::ParamsTable`]): the config crate
//! does not know the user's types. [`Config::stage_params`] re-reads the file and walks to
//! `stages[i].params` with serde seeds, so the user's type is deserialized straight from the
//! TOML text: a wrong key, a wrong type or a value the type's own `Deserialize` refuses (e.g.
//! `#[serde(try_from = ...)]`, `NonZeroU32`) is reported at its own `file:line:column` with the
//! path `stages[i].params.key`, in the same form as every other config error.

use crate::error::{ConfigError, ConfigErrors, ErrorKind};
use crate::parse::{clean_path, translate};
use crate::schema::Config;
use serde::de::{DeserializeOwned, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserializer;
use std::fmt;
use std::marker::PhantomData;

impl Config {
    /// The `params` table of stage `index`, deserialized into `T`. A stage without `params`
    /// reads `T` from an empty table (so `T`'s serde defaults apply, and a required field is
    /// reported as missing at the stage).
    ///
    /// ```
    /// use dataplane_config::Config;
    /// # let text = "[[workers]]\nname = \"w\"\ncore = 0\n\n[[stages]]\nname = \"b\"\nworker = \"w\"\nkind = \"book\"\ninput = \"q\"\nparams = { depth = 0 }\n";
    /// #[derive(serde::Deserialize)]
    /// #[serde(deny_unknown_fields)]
    /// struct Book { depth: std::num::NonZeroU32 }
    ///
    /// let cfg = Config::from_str(text, "book.toml").unwrap();
    /// let err = cfg.stage_params::<Book>(0).err().unwrap();
    /// assert!(err.to_string().starts_with("book.toml:10:20: stages[0].params.depth: "), "{err}");
    /// ```
    pub fn stage_params<T: DeserializeOwned>(&self, index: usize) -> Result<T, ConfigErrors> {
        let stage = self.stages.get(index).ok_or_else(|| {
            ConfigError::new(ErrorKind::Invalid, &self.source, None, "stages", format!("no stage {index}"))
        })?;
        let field = format!("stages[{index}].params");
        if stage.params.is_none() {
            // No table: T from an empty one, the error (a required field) at the stage's name.
            return toml::from_str::<T>("").map_err(|e| {
                let mut err = translate(&self.source, field.clone(), e.message(), stage.name.span.clone());
                if let Some(hint) = err.hint.as_mut() {
                    *hint = hint.replace("to this table", &format!("to a `params` table of stage `{}`", stage.name));
                }
                err.into()
            });
        }
        let text = self.source.text();
        let mut track = serde_path_to_error::Track::new();
        let de = serde_path_to_error::Deserializer::new(toml::Deserializer::new(text), &mut track);
        match (Walk::<T> { index, _t: PhantomData }).deserialize(de) {
            Ok(Some(v)) => Ok(v),
            // The file changed under us, or the walk missed: say so rather than guess.
            Ok(None) => Err(ConfigError::new(
                ErrorKind::Invalid,
                &self.source,
                stage.params.as_ref().and_then(|p| p.span.clone()),
                field,
                "the `params` table could not be found again in the file",
            )
            .into()),
            Err(e) => {
                let path = clean_path(&track.path().to_string());
                let path = if path.is_empty() { field } else { path };
                Err(translate(&self.source, path, e.message(), e.span()).into())
            }
        }
    }
}

/// Seed for the whole document: finds `stages`, then element `index`, then its `params`.
struct Walk<T> {
    index: usize,
    _t: PhantomData<T>,
}

impl<'de, T: DeserializeOwned> DeserializeSeed<'de> for Walk<T> {
    type Value = Option<T>;
    fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<Option<T>, D::Error> {
        de.deserialize_map(self)
    }
}

impl<'de, T: DeserializeOwned> Visitor<'de> for Walk<T> {
    type Value = Option<T>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a pipeline file")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Option<T>, A::Error> {
        let mut out = None;
        while let Some(key) = map.next_key::<String>()? {
            if key == "stages" {
                out = map.next_value_seed(Stages::<T> { index: self.index, _t: PhantomData })?;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(out)
    }
}

/// Seed for the `stages` array: element `index` is read with [`Stage`], the others skipped.
struct Stages<T> {
    index: usize,
    _t: PhantomData<T>,
}

impl<'de, T: DeserializeOwned> DeserializeSeed<'de> for Stages<T> {
    type Value = Option<T>;
    fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<Option<T>, D::Error> {
        de.deserialize_seq(self)
    }
}

impl<'de, T: DeserializeOwned> Visitor<'de> for Stages<T> {
    type Value = Option<T>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an array of stages")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Option<T>, A::Error> {
        let mut out = None;
        let mut i = 0;
        loop {
            if i == self.index {
                match seq.next_element_seed(Stage::<T>(PhantomData))? {
                    Some(v) => out = v,
                    None => break,
                }
            } else if seq.next_element::<IgnoredAny>()?.is_none() {
                break;
            }
            i += 1;
        }
        Ok(out)
    }
}

/// Seed for one stage table: `params` is read as `T`, the other keys skipped.
struct Stage<T>(PhantomData<T>);

impl<'de, T: DeserializeOwned> DeserializeSeed<'de> for Stage<T> {
    type Value = Option<T>;
    fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<Option<T>, D::Error> {
        de.deserialize_map(self)
    }
}

impl<'de, T: DeserializeOwned> Visitor<'de> for Stage<T> {
    type Value = Option<T>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a stage table")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Option<T>, A::Error> {
        let mut out = None;
        while let Some(key) = map.next_key::<String>()? {
            if key == "params" {
                out = Some(map.next_value::<T>()?);
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(out)
    }
}

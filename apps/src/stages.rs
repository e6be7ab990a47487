//! The stage registry: every stage kind a pipeline file may name, built-in or the program's
//! own, with the factory that makes its [`Handler`].
//!
//! A program that runs pipelines with stages of its own (an appliance: a feed handler, an
//! order book...) registers each kind by name with a [`KindShape`] (its endpoints) and a
//! factory. The factory receives the stage's `params` table deserialized into the program's
//! own `serde` type, so a wrong key, type or value in the file is reported like every other
//! config error (`file:line:column: stages[2].params.depth: ...; hint: ...`), by `check` as
//! well as by `run`. The six built-in kinds are registered the same way by
//! [`Registry::new`]. [`crate::cli::main`] then gives the program the whole `dataplane`
//! command line (`check`, `run`, `kinds`, `--json`, live stats) with its kinds added.
//!
//! ```
//! use dataplane::pipeline::{Handler, Msg, StageCx};
//! use dataplane_apps::stages::Registry;
//! use dataplane_config::KindShape;
//!
//! /// Passes on one message in `keep_one_in`, drops the others.
//! struct Sample { every: u64, seen: u64 }
//!
//! impl Handler for Sample {
//!     fn on_message(&mut self, msg: Msg, cx: &mut StageCx<'_>) {
//!         self.seen += 1;
//!         if self.seen % self.every == 0 { cx.send(0, msg) } else { cx.drop_msg(msg) }
//!     }
//! }
//!
//! #[derive(serde::Deserialize)]
//! #[serde(deny_unknown_fields)]
//! struct SampleParams { keep_one_in: std::num::NonZeroU64 }
//!
//! let mut registry = Registry::new();
//! registry
//!     .register("sample", KindShape::filter(), "passes on one message in `keep_one_in`", |p: SampleParams, _| {
//!         Ok(Box::new(Sample { every: p.keep_one_in.get(), seen: 0 }))
//!     })
//!     .unwrap();
//! assert!(registry.kinds().any(|k| k.name == "sample"));
//! ```

use dataplane::pipeline::{Echo, Fanout, Forward, Handler, Sequencer, Sink, Source, SourceLimits};
use dataplane_config::{
    Config, ConfigError, ConfigErrors, ErrorKind, KindShape, Rate, StageConfig, StageKind, ValidationEnv, WorkerConfig,
};
use serde::de::DeserializeOwned;
use std::path::Path;

/// What a factory gets besides its parameters: the stage's whole configuration (name,
/// endpoints, built-in fields) and its worker's.
#[derive(Debug, Clone, Copy)]
pub struct StageSpec<'a> {
    /// The stage.
    pub stage: &'a StageConfig,
    /// The worker it runs on.
    pub worker: &'a WorkerConfig,
    /// The whole pipeline.
    pub config: &'a Config,
}

impl StageSpec<'_> {
    /// The stage's name.
    pub fn name(&self) -> &str {
        self.stage.name.as_str()
    }

    /// How many outputs the stage has (`output` or `outputs`): the indices a handler may
    /// pass to [`StageCx::send`](dataplane::pipeline::StageCx::send).
    pub fn outputs(&self) -> usize {
        self.stage.destinations().count()
    }
}

/// A factory's refusal: a message about the parameters as a whole (a value out of range for
/// the type was already refused at its key by `serde`).
pub type FactoryResult = Result<Box<dyn Handler>, String>;

type Build = Box<dyn Fn(&Config, usize) -> Result<Box<dyn Handler>, ConfigErrors> + Send + Sync>;

/// One registered kind.
pub struct Kind {
    /// The name `kind = "..."` gives.
    pub name: String,
    /// Its endpoints.
    pub shape: KindShape,
    /// One line on what it does (`dataplane kinds` lists it).
    pub about: String,
    /// Whether it is one of the six built-ins.
    pub builtin: bool,
    build: Build,
}

impl std::fmt::Debug for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kind").field("name", &self.name).field("shape", &self.shape).finish_non_exhaustive()
    }
}

/// Why a kind could not be registered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    /// The name is taken (by a built-in or an earlier registration).
    #[error("stage kind \"{0}\" is already registered")]
    Duplicate(String),
    /// The name is not 1-64 letters, digits, `-`, `_`, `.`.
    #[error("stage kind name \"{0}\" is invalid: use 1-64 letters, digits, '-', '_' or '.'")]
    BadName(String),
}

/// Stage kinds by name: the built-ins and the program's own.
#[derive(Debug)]
pub struct Registry {
    kinds: Vec<Kind>,
}

impl Default for Registry {
    fn default() -> Self {
        Registry::new()
    }
}

impl Registry {
    /// The six built-in kinds.
    pub fn new() -> Registry {
        let mut r = Registry { kinds: Vec::new() };
        let builtin = |kind: StageKind, about: &str, make: fn(StageSpec) -> Box<dyn Handler>| Kind {
            name: kind.as_str().to_owned(),
            shape: kind.builtin_shape().unwrap_or(KindShape::filter()),
            about: about.to_owned(),
            builtin: true,
            build: Box::new(move |cfg: &Config, i: usize| Ok(make(spec(cfg, i)?))),
        };
        r.kinds.push(builtin(StageKind::Echo, "sends every message back on the QP it came from", |_| Box::new(Echo)));
        r.kinds.push(builtin(StageKind::Forward, "passes every message to its output", |_| Box::new(Forward)));
        r.kinds.push(builtin(StageKind::Fanout, "copies every message to each of its outputs", |_| Box::new(Fanout)));
        r.kinds.push(builtin(
            StageKind::Sink,
            "consumes messages: sequence check (verify_sequence), latency histogram (histogram)",
            |s| Box::new(Sink::new(*s.stage.verify_sequence, *s.stage.histogram)),
        ));
        r.kinds.push(builtin(
            StageKind::Source,
            "generates sequence-numbered, timestamped messages (rate, message_size, count, duration)",
            |s| {
                let limits = SourceLimits {
                    rate: match *s.stage.rate {
                        Rate::Max => 0,
                        Rate::PerSecond(n) => n,
                    },
                    count: *s.stage.count,
                    duration_ns: s.stage.duration.0.as_nanos() as u64,
                };
                Box::new(Source::new(s.stage.message_size.bytes() as usize, limits, *s.worker.poll_burst as usize))
            },
        ));
        r.kinds.push(builtin(StageKind::Sequencer, "stamps each message with the next sequence number", |_| {
            Box::new(Sequencer::default())
        }));
        r
    }

    /// Registers kind `name`: stages of that kind must have the endpoints `shape` says, and
    /// are made by `factory` from their `params` table read as `T` (an absent table reads
    /// as an empty one, so `#[serde(default)]` fields apply). `about` is one line for
    /// `dataplane kinds`.
    ///
    /// The factory runs on the thread that brings the pipeline up, once per stage of the
    /// kind, and also during `check` (so that everything it refuses is refused before a
    /// run); the handler it returns then moves to the stage's worker thread. Make refusals
    /// that concern one key part of `T`'s `Deserialize` (e.g. `NonZeroU32`, `try_from`):
    /// those are reported at the key; a factory's `Err` is reported at the `params` table.
    ///
    /// # Errors
    /// [`RegistryError::Duplicate`] if the name is taken, [`RegistryError::BadName`] if it
    /// could not be written in a pipeline file.
    pub fn register<T, F>(
        &mut self,
        name: &str,
        shape: KindShape,
        about: &str,
        factory: F,
    ) -> Result<&mut Registry, RegistryError>
    where
        T: DeserializeOwned + 'static,
        F: Fn(T, StageSpec<'_>) -> FactoryResult + Send + Sync + 'static,
    {
        let valid = (1..=64).contains(&name.len())
            && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
        if !valid {
            return Err(RegistryError::BadName(name.to_owned()));
        }
        if self.get(name).is_some() {
            return Err(RegistryError::Duplicate(name.to_owned()));
        }
        let build = move |cfg: &Config, i: usize| -> Result<Box<dyn Handler>, ConfigErrors> {
            let params = cfg.stage_params::<T>(i)?;
            let s = spec(cfg, i)?;
            factory(params, s).map_err(|msg| {
                let stage = &cfg.stages[i];
                let (field, span) = match &stage.params {
                    Some(p) => (format!("stages[{i}].params"), p.span.clone()),
                    None => (format!("stages[{i}].kind"), stage.kind.span.clone()),
                };
                let msg = format!("{} stage `{}`: {msg}", stage.kind.as_str(), stage.name);
                ConfigError::new(ErrorKind::Invalid, &cfg.source, span, field, msg).into()
            })
        };
        self.kinds.push(Kind {
            name: name.to_owned(),
            shape,
            about: about.to_owned(),
            builtin: false,
            build: Box::new(build),
        });
        Ok(self)
    }

    /// Every kind, built-ins first, then in registration order.
    pub fn kinds(&self) -> impl Iterator<Item = &Kind> {
        self.kinds.iter()
    }

    /// The kind with this name.
    pub fn get(&self, name: &str) -> Option<&Kind> {
        self.kinds.iter().find(|k| k.name == name)
    }

    /// `env` with the registered (non-built-in) kinds added, for [`Config::validate`].
    pub fn env(&self, env: ValidationEnv) -> ValidationEnv {
        env.with_kinds(self.kinds.iter().filter(|k| !k.builtin).map(|k| (k.name.as_str(), k.shape)))
    }

    /// Checks what only the registry can: every stage's parameters read into its kind's type
    /// and accepted by its factory (which is called, and its handler dropped). Call after
    /// [`Config::validate`] with [`Registry::env`]. Returns every error, in file order.
    pub fn check(&self, cfg: &Config) -> Result<(), ConfigErrors> {
        let mut errors = Vec::new();
        for i in 0..cfg.stages.len() {
            if let Err(e) = self.build(cfg, i) {
                errors.extend(e.0);
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(ConfigErrors(errors))
        }
    }

    /// Reads, parses and validates a pipeline file against the machine and this registry:
    /// what `check` does.
    pub fn load(&self, path: impl AsRef<Path>) -> Result<Config, ConfigErrors> {
        let cfg = Config::load(path, &self.env(ValidationEnv::detect()))?;
        self.check(&cfg)?;
        Ok(cfg)
    }

    /// The handler of stage `i` of `cfg`, made by its kind's factory.
    pub fn build(&self, cfg: &Config, i: usize) -> Result<Box<dyn Handler>, ConfigErrors> {
        let stage = cfg.stages.get(i).ok_or_else(|| {
            ConfigError::new(ErrorKind::Invalid, &cfg.source, None, "stages", format!("no stage {i}"))
        })?;
        let kind = self.get(stage.kind.as_str()).ok_or_else(|| {
            ConfigError::new(
                ErrorKind::UnknownVariant,
                &cfg.source,
                stage.kind.span.clone(),
                format!("stages[{i}].kind"),
                format!("stage kind \"{}\" is not registered", stage.kind.as_str()),
            )
        })?;
        (kind.build)(cfg, i)
    }
}

/// The spec of stage `i` (whose worker validation has checked exists).
fn spec(cfg: &Config, i: usize) -> Result<StageSpec<'_>, ConfigErrors> {
    let stage = &cfg.stages[i];
    let worker = cfg.worker(stage.worker.as_str()).ok_or_else(|| {
        ConfigError::new(
            ErrorKind::Dangling,
            &cfg.source,
            stage.worker.span.clone(),
            format!("stages[{i}].worker"),
            format!("worker `{}` does not exist", stage.worker),
        )
    })?;
    Ok(StageSpec { stage, worker, config: cfg })
}

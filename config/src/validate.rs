//! Semantic validation: everything that parses but would fail late, or run badly.
//!
//! See [`Config::validate`](crate::Config::validate) for the list of rules.

use crate::error::{closest, ConfigError, ConfigErrors, ErrorKind};
use crate::located::Located;
use crate::schema::*;
use crate::units::{ByteSize, Rate};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::ops::Range;

/// What the machine offers, against which a configuration is checked.
///
/// [`ValidationEnv::detect`] reads the running machine; tests build one by hand with
/// [`ValidationEnv::with_cores`] and the `with_*` setters. A `None` memory figure means
/// "unknown": the corresponding check is skipped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidationEnv {
    /// Core ids this process may run on. Empty means unknown (core checks are skipped).
    pub cores: Vec<usize>,
    /// Free 2 MiB huge pages.
    pub free_hugepages_2m: Option<u64>,
    /// Free 1 GiB huge pages.
    pub free_hugepages_1g: Option<u64>,
    /// Memory available for new allocations, in bytes (`MemAvailable`).
    pub mem_available: Option<u64>,
    /// Stage kinds registered by the program besides the built-ins, with the endpoints each
    /// takes. A stage whose kind is neither built in nor here is an error.
    pub kinds: BTreeMap<String, KindShape>,
}

impl Default for ValidationEnv {
    /// Same as [`ValidationEnv::detect`].
    fn default() -> Self {
        ValidationEnv::detect()
    }
}

impl ValidationEnv {
    /// The running machine: allowed cores from `/proc/self/status` (`Cpus_allowed_list`, the
    /// `sched_getaffinity` mask), else `0..available_parallelism`; free huge pages from
    /// `/sys/kernel/mm/hugepages`; `MemAvailable` from `/proc/meminfo`.
    pub fn detect() -> Self {
        let cores = std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| {
                s.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:")).and_then(|l| parse_cpu_list(l.trim()))
            })
            .filter(|c| !c.is_empty())
            .unwrap_or_else(|| {
                let n = std::thread::available_parallelism().map_or(1, |n| n.get());
                (0..n).collect()
            });
        let free_pages = |size: PageSize| match std::fs::read_to_string(format!("{}/free_hugepages", size.sysfs_dir()))
        {
            Ok(s) => s.trim().parse().ok(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Some(0),
            Err(_) => None,
        };
        let mem_available = std::fs::read_to_string("/proc/meminfo").ok().and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("MemAvailable:"))
                .and_then(|l| l.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
                .map(|kb| kb.saturating_mul(1024))
        });
        ValidationEnv {
            cores,
            free_hugepages_2m: free_pages(PageSize::Huge2M),
            free_hugepages_1g: free_pages(PageSize::Huge1G),
            mem_available,
            kinds: BTreeMap::new(),
        }
    }

    /// The same environment with these stage kinds registered besides the built-ins (a
    /// program's own stages: see the `dataplane_apps::stages` registry).
    pub fn with_kinds<'a>(mut self, kinds: impl IntoIterator<Item = (&'a str, KindShape)>) -> Self {
        self.kinds.extend(kinds.into_iter().map(|(n, s)| (n.to_owned(), s)));
        self
    }

    /// The endpoints `kind` takes: its built-in shape or its registration; `None` when the
    /// kind is neither.
    pub fn shape_of(&self, kind: &StageKind) -> Option<KindShape> {
        kind.builtin_shape().or_else(|| self.kinds.get(kind.as_str()).copied())
    }

    /// An environment with these cores and unknown memory (memory checks skipped).
    pub fn with_cores(cores: impl IntoIterator<Item = usize>) -> Self {
        let mut cores: Vec<usize> = cores.into_iter().collect();
        cores.sort_unstable();
        cores.dedup();
        ValidationEnv {
            cores,
            free_hugepages_2m: None,
            free_hugepages_1g: None,
            mem_available: None,
            kinds: BTreeMap::new(),
        }
    }

    /// Sets the number of free huge pages of one size.
    pub fn with_free_hugepages(mut self, size: PageSize, pages: u64) -> Self {
        match size {
            PageSize::Huge2M => self.free_hugepages_2m = Some(pages),
            PageSize::Huge1G => self.free_hugepages_1g = Some(pages),
        }
        self
    }

    /// Sets the available memory in bytes.
    pub fn with_mem_available(mut self, bytes: u64) -> Self {
        self.mem_available = Some(bytes);
        self
    }

    /// Free huge pages of this size, when known.
    pub fn free_hugepages(&self, size: PageSize) -> Option<u64> {
        match size {
            PageSize::Huge2M => self.free_hugepages_2m,
            PageSize::Huge1G => self.free_hugepages_1g,
        }
    }
}

/// Parses a kernel CPU list such as `0-3,6,8-9`.
pub fn parse_cpu_list(text: &str) -> Option<Vec<usize>> {
    let mut out = Vec::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) = (a.trim().parse().ok()?, b.trim().parse().ok()?);
                if b < a || b - a > 1 << 16 {
                    return None;
                }
                out.extend(a..=b);
            }
            None => out.push(part.parse().ok()?),
        }
    }
    out.sort_unstable();
    out.dedup();
    Some(out)
}

/// Formats core ids as a kernel CPU list: `0-3,6`.
pub fn format_cpu_list(cores: &[usize]) -> String {
    let mut sorted = cores.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut parts = Vec::new();
    let mut i = 0;
    while i < sorted.len() {
        let start = sorted[i];
        let mut end = start;
        while i + 1 < sorted.len() && sorted[i + 1] == end + 1 {
            i += 1;
            end = sorted[i];
        }
        parts.push(if start == end { start.to_string() } else { format!("{start}-{end}") });
        i += 1;
    }
    parts.join(",")
}

/// Bytes in binary units with one decimal when not exact: `64 MiB`, `1.5 GiB`, `512 B`.
fn human(bytes: u64) -> String {
    const UNITS: [(u32, &str); 4] = [(40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB")];
    for (shift, unit) in UNITS {
        let scale = 1u64 << shift;
        if bytes >= scale {
            return if bytes % scale == 0 {
                format!("{} {unit}", bytes / scale)
            } else {
                format!("{:.1} {unit}", bytes as f64 / scale as f64)
            };
        }
    }
    format!("{bytes} B")
}

/// `a` or `an`, for a kind name.
fn article(word: &str) -> &'static str {
    if word.starts_with(['a', 'e', 'i', 'o', 'u']) {
        "an"
    } else {
        "a"
    }
}

/// The first known span.
fn first_span(spans: &[&Option<Range<usize>>]) -> Option<Range<usize>> {
    spans.iter().find_map(|s| (*s).clone())
}

/// A name a stage endpoint can resolve to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Endpoint {
    Qp(usize),
    Stage(usize),
}

/// A stage-to-stage link, with where it was declared.
#[derive(Debug, Clone)]
struct Link {
    to: usize,
    span: Option<Range<usize>>,
    field: String,
}

pub(crate) struct Validator<'a> {
    cfg: &'a Config,
    env: &'a ValidationEnv,
    errors: Vec<ConfigError>,
    workers: HashMap<&'a str, usize>,
    pools: HashMap<&'a str, usize>,
    qps: HashMap<&'a str, usize>,
    stages: HashMap<&'a str, usize>,
    /// QPs of each worker (by worker index).
    worker_qps: Vec<Vec<usize>>,
}

impl<'a> Validator<'a> {
    pub(crate) fn run(cfg: &'a Config, env: &'a ValidationEnv) -> Result<(), ConfigErrors> {
        let mut v = Validator {
            cfg,
            env,
            errors: Vec::new(),
            workers: HashMap::new(),
            pools: HashMap::new(),
            qps: HashMap::new(),
            stages: HashMap::new(),
            worker_qps: vec![Vec::new(); cfg.workers.len()],
        };
        v.names();
        v.provider();
        v.pools();
        v.workers();
        v.qps();
        v.worker_totals();
        v.pool_totals();
        v.memory_totals();
        v.stages();
        v.cycles();
        v.message_sizes();
        v.unread_qps();
        if cfg.workers.is_empty() {
            v.push(
                ErrorKind::Invalid,
                None,
                "workers".into(),
                "the pipeline has no workers".into(),
                Some("add a [[workers]] table with a `name` and a `core`".into()),
            );
        }
        if cfg.stages.is_empty() {
            v.push(
                ErrorKind::Invalid,
                None,
                "stages".into(),
                "the pipeline has no stages".into(),
                Some("add a [[stages]] table with a `name`, `worker` and `kind`".into()),
            );
        }
        let mut errors = v.errors;
        // File order; errors without a location go last. The sort is stable.
        errors.sort_by_key(|e| (e.location.is_none(), e.location));
        if errors.is_empty() {
            Ok(())
        } else {
            Err(ConfigErrors(errors))
        }
    }

    fn push(
        &mut self,
        kind: ErrorKind,
        span: Option<Range<usize>>,
        field: String,
        message: String,
        hint: Option<String>,
    ) {
        let mut e = ConfigError::new(kind, &self.cfg.source, span, field, message);
        if let Some(h) = hint {
            e = e.with_hint(h);
        }
        self.errors.push(e);
    }

    /// `at 3:8` for a span, or an empty string.
    fn at(&self, span: &Option<Range<usize>>) -> String {
        match span {
            Some(s) => format!(" (at {})", self.cfg.source.location(s.start)),
            None => String::new(),
        }
    }

    fn did_you_mean<'n>(word: &str, names: impl IntoIterator<Item = &'n str>) -> Option<String> {
        closest(word, names).map(|s| format!("did you mean `{s}`?"))
    }

    // ---------------------------------------------------------------- names

    fn check_name(&mut self, what: &str, field: String, name: &Located<String>) {
        let n = name.as_str();
        if n.is_empty() {
            self.push(
                ErrorKind::Invalid,
                name.span.clone(),
                field,
                format!("{what} name is empty"),
                Some("use letters, digits, `-`, `_` and `.`".into()),
            );
        } else if n.len() > 64 || !n.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')) {
            self.push(
                ErrorKind::Invalid,
                name.span.clone(),
                field,
                format!("invalid {what} name \"{}\"", n.escape_debug()),
                Some("names are 1-64 letters, digits, `-`, `_` and `.`".into()),
            );
        }
    }

    fn names(&mut self) {
        let cfg = self.cfg;
        for (i, w) in cfg.workers.iter().enumerate() {
            self.check_name("worker", format!("workers[{i}].name"), &w.name);
            if let Some(&first) = self.workers.get(w.name.as_str()) {
                let at = self.at(&cfg.workers[first].name.span);
                self.push(
                    ErrorKind::Duplicate,
                    w.name.span.clone(),
                    format!("workers[{i}].name"),
                    format!("duplicate worker name `{}`, first defined as workers[{first}]{at}", w.name),
                    Some("worker names must be unique".into()),
                );
            } else {
                self.workers.insert(w.name.as_str(), i);
            }
        }
        for (i, p) in cfg.memory.pools.iter().enumerate() {
            self.check_name("pool", format!("memory.pools[{i}].name"), &p.name);
            if let Some(&first) = self.pools.get(p.name.as_str()) {
                let at = self.at(&cfg.memory.pools[first].name.span);
                self.push(
                    ErrorKind::Duplicate,
                    p.name.span.clone(),
                    format!("memory.pools[{i}].name"),
                    format!("duplicate pool name `{}`, first defined as memory.pools[{first}]{at}", p.name),
                    Some("pool names must be unique".into()),
                );
            } else {
                self.pools.insert(p.name.as_str(), i);
            }
        }
        // QPs and stages share one namespace: endpoints name either.
        for (i, q) in cfg.qps.iter().enumerate() {
            self.check_name("qp", format!("qps[{i}].name"), &q.name);
            if let Some(&first) = self.qps.get(q.name.as_str()) {
                let at = self.at(&cfg.qps[first].name.span);
                self.push(
                    ErrorKind::Duplicate,
                    q.name.span.clone(),
                    format!("qps[{i}].name"),
                    format!("duplicate name `{}`, already used by qps[{first}]{at}", q.name),
                    Some("QPs and stages share one namespace; names must be unique".into()),
                );
            } else {
                self.qps.insert(q.name.as_str(), i);
            }
        }
        for (i, s) in cfg.stages.iter().enumerate() {
            self.check_name("stage", format!("stages[{i}].name"), &s.name);
            let first = if let Some(&j) = self.qps.get(s.name.as_str()) {
                Some((format!("qps[{j}]"), cfg.qps[j].name.span.clone()))
            } else {
                self.stages.get(s.name.as_str()).map(|&j| (format!("stages[{j}]"), cfg.stages[j].name.span.clone()))
            };
            if let Some((what, span)) = first {
                let at = self.at(&span);
                self.push(
                    ErrorKind::Duplicate,
                    s.name.span.clone(),
                    format!("stages[{i}].name"),
                    format!("duplicate name `{}`, already used by {what}{at}", s.name),
                    Some("QPs and stages share one namespace; names must be unique".into()),
                );
            } else {
                self.stages.insert(s.name.as_str(), i);
            }
        }
        for (j, q) in cfg.qps.iter().enumerate() {
            if let Some(&w) = self.workers.get(q.worker.as_str()) {
                self.worker_qps[w].push(j);
            }
        }
    }

    fn endpoint(&self, name: &str) -> Option<Endpoint> {
        self.qps.get(name).map(|&j| Endpoint::Qp(j)).or_else(|| self.stages.get(name).map(|&k| Endpoint::Stage(k)))
    }

    fn endpoint_names(&self) -> impl Iterator<Item = &'a str> + '_ {
        self.qps.keys().chain(self.stages.keys()).copied()
    }

    // ---------------------------------------------------------------- provider

    fn provider(&mut self) {
        let p = &self.cfg.provider;
        let kind = *p.kind;
        let wrong_kind = |field: &str, owner: ProviderKind| {
            (
                format!("provider.{field}"),
                format!("`{field}` applies only to kind = \"{}\"", owner.as_str()),
                format!("remove it, or set kind = \"{}\" (this provider is \"{}\")", owner.as_str(), kind.as_str()),
            )
        };
        let mut foreign: Vec<(Option<Range<usize>>, &str, ProviderKind)> = Vec::new();
        if kind != ProviderKind::Xdp {
            if let Some(i) = &p.interfaces {
                foreign.push((i.span.clone(), "interfaces", ProviderKind::Xdp));
            }
        }
        if kind != ProviderKind::Rdma {
            if let Some(d) = &p.device {
                foreign.push((d.span.clone(), "device", ProviderKind::Rdma));
            }
            if p.port.is_explicit() {
                foreign.push((p.port.span.clone(), "port", ProviderKind::Rdma));
            }
            if p.gid_index.is_explicit() {
                foreign.push((p.gid_index.span.clone(), "gid_index", ProviderKind::Rdma));
            }
        }
        match kind {
            ProviderKind::Xdp => {
                if p.fabric_size.is_explicit() {
                    foreign.push((p.fabric_size.span.clone(), "fabric_size", ProviderKind::Shm));
                }
                let bad = match &p.interfaces {
                    None => Some((None, "kind = \"xdp\" needs `interfaces`".to_owned())),
                    Some(i) if i.is_empty() || i.len() > 16 => {
                        Some((i.span.clone(), format!("{} interfaces: give 1 to 16", i.len())))
                    }
                    Some(i) => {
                        i.iter().find(|n| n.is_empty() || n.len() > 15 || n.contains(['/', ' ', '\0'])).map(|n| {
                            (
                                i.span.clone(),
                                format!("`{n}` is not an interface name (1-15 characters, no `/` or space)"),
                            )
                        })
                    }
                };
                if let Some((span, msg)) = bad {
                    self.push(
                        ErrorKind::Invalid,
                        span.or_else(|| p.kind.span.clone()),
                        "provider.interfaces".into(),
                        msg,
                        Some(
                            "list the Linux interfaces that are ports 1, 2, ...: interfaces = [\"veth0\", \"veth1\"]"
                                .into(),
                        ),
                    );
                }
            }
            ProviderKind::Shm => {
                let fabric = p.fabric.clone();
                self.check_name("fabric", "provider.fabric".into(), &fabric);
                if p.fabric_size.bytes() < ByteSize::mib(1).bytes() {
                    self.push(
                        ErrorKind::Invalid,
                        p.fabric_size.span.clone(),
                        "provider.fabric_size".into(),
                        format!("fabric_size {} is below the minimum of 1M", *p.fabric_size),
                        Some(format!(
                            "the fabric holds every queue ring; the default is \"{}\"",
                            defaults::FABRIC_SIZE
                        )),
                    );
                }
            }
            ProviderKind::Rdma => {
                if p.fabric.is_explicit() {
                    foreign.push((p.fabric.span.clone(), "fabric", ProviderKind::Shm));
                }
                if p.fabric_size.is_explicit() {
                    foreign.push((p.fabric_size.span.clone(), "fabric_size", ProviderKind::Shm));
                }
                if *p.port == 0 {
                    self.push(
                        ErrorKind::Invalid,
                        p.port.span.clone(),
                        "provider.port".into(),
                        "port 0 does not exist: ports are numbered from 1".into(),
                        Some("`ibv_devinfo` lists the ports".into()),
                    );
                }
                if let Some(d) = &p.device {
                    if d.is_empty() {
                        self.push(
                            ErrorKind::Invalid,
                            d.span.clone(),
                            "provider.device".into(),
                            "device name is empty".into(),
                            Some("remove `device` to use the first device, or name one from `ibv_devices`".into()),
                        );
                    }
                }
            }
        }
        for (span, field, owner) in foreign {
            let (f, m, h) = wrong_kind(field, owner);
            self.push(ErrorKind::Invalid, span, f, m, Some(h));
        }
    }

    // ---------------------------------------------------------------- memory

    fn pools(&mut self) {
        let cfg = self.cfg;
        for (i, p) in cfg.memory.pools.iter().enumerate() {
            if p.buffer_size.bytes() < 64 {
                self.push(
                    ErrorKind::Invalid,
                    first_span(&[&p.buffer_size.span, &p.name.span]),
                    format!("memory.pools[{i}].buffer_size"),
                    format!("buffer_size {} is below the minimum of 64 bytes", *p.buffer_size),
                    None,
                );
            }
            if *p.count == 0 {
                self.push(
                    ErrorKind::Invalid,
                    first_span(&[&p.count.span, &p.name.span]),
                    format!("memory.pools[{i}].count"),
                    "a pool needs at least one buffer".into(),
                    None,
                );
            } else if *p.cache_size > *p.count {
                self.push(
                    ErrorKind::Invalid,
                    first_span(&[&p.cache_size.span, &p.count.span, &p.name.span]),
                    format!("memory.pools[{i}].cache_size"),
                    format!("cache_size {} is larger than the pool's count {}", *p.cache_size, *p.count),
                    Some("each worker's cache holds part of the pool; keep it well below count".into()),
                );
            }
        }
    }

    /// Receive and send buffers a worker keeps busy: its SRQ (if any QP uses it), private
    /// receive queues, send queues, and its pool cache.
    fn worker_buffer_need(&self, w: usize) -> (u64, u64) {
        let worker = &self.cfg.workers[w];
        let mut sends = 0u64;
        let mut recvs = 0u64;
        let mut uses_srq = false;
        for &j in &self.worker_qps[w] {
            let q = &self.cfg.qps[j];
            sends += u64::from(*q.send_depth);
            if *q.use_srq {
                uses_srq = true;
            } else {
                recvs += u64::from(*q.recv_depth);
            }
        }
        if uses_srq {
            recvs += u64::from(*worker.srq_depth);
        }
        (sends, recvs)
    }

    fn pool_totals(&mut self) {
        let cfg = self.cfg;
        for (i, p) in cfg.memory.pools.iter().enumerate() {
            if self.pools.get(p.name.as_str()) != Some(&i) || *p.count == 0 {
                continue;
            }
            let mut need = 0u64;
            let mut parts = Vec::new();
            for (w, worker) in cfg.workers.iter().enumerate() {
                if worker.pool.as_str() != p.name.as_str() {
                    continue;
                }
                let (sends, recvs) = self.worker_buffer_need(w);
                let n = sends + recvs + u64::from(*p.cache_size);
                need += n;
                parts.push(format!("`{}` {n}", worker.name));
            }
            if need > u64::from(*p.count) {
                self.push(
                    ErrorKind::Resource,
                    first_span(&[&p.count.span, &p.name.span]),
                    format!("memory.pools[{i}].count"),
                    format!(
                        "pool `{}` has {} buffers but its workers keep up to {need} in use ({}: posted receives, send queues and cache)",
                        p.name,
                        *p.count,
                        parts.join(", ")
                    ),
                    Some(format!("set count = {need} or more, or shrink the queues")),
                );
            }
        }
    }

    fn memory_totals(&mut self) {
        let cfg = self.cfg;
        let m = &cfg.memory;
        let policy = *m.hugepages;
        let page = m.page_size.bytes();
        let round = |b: u64| match policy {
            HugepagePolicy::Never => b,
            _ => b.div_ceil(page).saturating_mul(page),
        };
        let pool_bytes = m.pools.iter().fold(0u64, |acc, p| acc.saturating_add(round(p.bytes())));
        // The pool a memory error points at: the largest one.
        let largest = m.pools.iter().enumerate().max_by_key(|(_, p)| p.bytes());
        let (pool_field, pool_span) = match largest {
            Some((i, p)) => {
                (format!("memory.pools[{i}].count"), first_span(&[&p.count.span, &p.buffer_size.span, &p.name.span]))
            }
            None => ("memory.pools".to_owned(), None),
        };
        let fabric_bytes = match *cfg.provider.kind {
            ProviderKind::Shm => cfg.provider.fabric_size.bytes(),
            ProviderKind::Rdma | ProviderKind::Xdp => 0,
        };

        if policy == HugepagePolicy::Require {
            if let Some(free) = self.env.free_hugepages(*m.page_size) {
                let pages = pool_bytes.div_ceil(page);
                if pages > free {
                    self.push(
                        ErrorKind::Resource,
                        first_span(&[&m.hugepages.span, &pool_span]),
                        "memory.hugepages".into(),
                        format!(
                            "buffer pools need {} of {} huge pages ({pages} pages) but only {free} are free",
                            human(pool_bytes),
                            m.page_size.as_str()
                        ),
                        Some(format!(
                            "reserve {} more pages (raise {}/nr_hugepages), shrink the pools, or set hugepages = \"prefer\"",
                            pages - free,
                            m.page_size.sysfs_dir()
                        )),
                    );
                }
            }
        }
        if let Some(avail) = self.env.mem_available {
            let regular = match policy {
                HugepagePolicy::Require => fabric_bytes,
                _ => pool_bytes.saturating_add(fabric_bytes),
            };
            if regular > avail {
                let what = match (policy, fabric_bytes) {
                    (HugepagePolicy::Require, _) => {
                        format!("the shm fabric ({})", human(fabric_bytes))
                    }
                    (_, 0) => format!("buffer pools ({})", human(pool_bytes)),
                    _ => format!("buffer pools ({}) and the shm fabric ({})", human(pool_bytes), human(fabric_bytes)),
                };
                let (field, span) = if policy == HugepagePolicy::Require || pool_span.is_none() {
                    ("provider.fabric_size".to_owned(), cfg.provider.fabric_size.span.clone())
                } else {
                    (pool_field, pool_span)
                };
                self.push(
                    ErrorKind::Resource,
                    span,
                    field,
                    format!("{what} need {} of memory but only {} is available", human(regular), human(avail)),
                    Some("shrink the pools (count, buffer_size) or the fabric".into()),
                );
            }
        }
    }

    // ---------------------------------------------------------------- workers

    fn workers(&mut self) {
        let cfg = self.cfg;
        let mut used_cores: HashMap<usize, usize> = HashMap::new();
        for (i, w) in cfg.workers.iter().enumerate() {
            let f = |name: &str| format!("workers[{i}].{name}");
            let core = *w.core;
            if !self.env.cores.is_empty() && !self.env.cores.contains(&core) {
                let list = format_cpu_list(&self.env.cores);
                self.push(
                    ErrorKind::Resource,
                    w.core.span.clone(),
                    f("core"),
                    format!("core {core} does not exist (this machine has cores {list})"),
                    Some(format!("pick one of {list}; `lscpu` or `nproc` shows the cores")),
                );
            } else if let Some(&first) = used_cores.get(&core) {
                let free: Vec<usize> =
                    self.env.cores.iter().copied().filter(|c| !cfg.workers.iter().any(|w| *w.core == *c)).collect();
                let hint = if free.is_empty() {
                    "each busy-polling worker needs a core of its own; no core is left, so merge workers".to_owned()
                } else {
                    format!("each busy-polling worker needs a core of its own; free cores: {}", format_cpu_list(&free))
                };
                let at = self.at(&cfg.workers[first].core.span);
                self.push(
                    ErrorKind::Duplicate,
                    w.core.span.clone(),
                    f("core"),
                    format!("core {core} is already used by worker `{}`{at}", cfg.workers[first].name),
                    Some(hint),
                );
            } else {
                used_cores.insert(core, i);
            }

            let pool = self.pools.get(w.pool.as_str()).map(|&p| &cfg.memory.pools[p]);
            if pool.is_none() {
                let hint = Self::did_you_mean(&w.pool, self.pools.keys().copied())
                    .unwrap_or_else(|| "define it with [[memory.pools]]".into());
                self.push(
                    ErrorKind::Dangling,
                    first_span(&[&w.pool.span, &w.name.span]),
                    f("pool"),
                    format!("pool `{}` does not exist", w.pool),
                    Some(hint),
                );
            }

            for (name, value) in [
                ("cq_depth", &w.cq_depth),
                ("srq_depth", &w.srq_depth),
                ("poll_burst", &w.poll_burst),
                ("doorbell_batch", &w.doorbell_batch),
                ("signal_interval", &w.signal_interval),
            ] {
                if **value == 0 {
                    self.push(
                        ErrorKind::Invalid,
                        first_span(&[&value.span, &w.name.span]),
                        f(name),
                        format!("{name} must be at least 1"),
                        None,
                    );
                }
            }
            if *w.poll_burst > *w.cq_depth && *w.cq_depth > 0 {
                self.push(
                    ErrorKind::Invalid,
                    first_span(&[&w.poll_burst.span, &w.cq_depth.span, &w.name.span]),
                    f("poll_burst"),
                    format!("poll_burst {} exceeds cq_depth {}", *w.poll_burst, *w.cq_depth),
                    Some("a poll cannot return more completions than the CQ holds".into()),
                );
            }
            if *w.srq_low_watermark >= *w.srq_depth && *w.srq_depth > 0 {
                let (span, field) = if w.srq_low_watermark.is_explicit() || !w.srq_depth.is_explicit() {
                    (first_span(&[&w.srq_low_watermark.span, &w.name.span]), f("srq_low_watermark"))
                } else {
                    (w.srq_depth.span.clone(), f("srq_depth"))
                };
                self.push(
                    ErrorKind::Invalid,
                    span,
                    field,
                    format!(
                        "srq_low_watermark {} must be below srq_depth {}",
                        *w.srq_low_watermark, *w.srq_depth
                    ),
                    Some(format!(
                        "the worker refills the SRQ when fewer than srq_low_watermark buffers remain posted; a quarter of the depth ({}) is a good start",
                        *w.srq_depth / 4
                    )),
                );
            }
            if let Some(p) = pool {
                if w.recv_buffer_size.bytes() > p.buffer_size.bytes() {
                    self.push(
                        ErrorKind::Invalid,
                        first_span(&[&w.recv_buffer_size.span, &p.buffer_size.span, &w.name.span]),
                        f("recv_buffer_size"),
                        format!(
                            "recv_buffer_size {} exceeds the buffer_size {} of pool `{}`",
                            *w.recv_buffer_size, *p.buffer_size, p.name
                        ),
                        Some("receive buffers are carved from pool buffers; raise the pool's buffer_size".into()),
                    );
                }
            }
            if w.recv_buffer_size.bytes() == 0 {
                self.push(
                    ErrorKind::Invalid,
                    first_span(&[&w.recv_buffer_size.span, &w.name.span]),
                    f("recv_buffer_size"),
                    "recv_buffer_size must be at least 1 byte".into(),
                    None,
                );
            }
        }
    }

    /// CQ sizing and idle workers (needs the QP list per worker).
    fn worker_totals(&mut self) {
        let cfg = self.cfg;
        for (i, w) in cfg.workers.iter().enumerate() {
            let has_stage = cfg.stages.iter().any(|s| s.worker.as_str() == w.name.as_str());
            if self.worker_qps[i].is_empty() && !has_stage {
                self.push(
                    ErrorKind::Invalid,
                    w.name.span.clone(),
                    format!("workers[{i}]"),
                    format!("worker `{}` has no qps and no stages", w.name),
                    Some("remove it, or give it work: an idle pinned worker still burns its core".into()),
                );
            }
            let (sends, recvs) = self.worker_buffer_need(i);
            let need = sends + recvs;
            if *w.cq_depth > 0 && need > u64::from(*w.cq_depth) {
                self.push(
                    ErrorKind::Invalid,
                    first_span(&[&w.cq_depth.span, &w.name.span]),
                    format!("workers[{i}].cq_depth"),
                    format!(
                        "cq_depth {} cannot hold the {need} completions that can be outstanding ({sends} send + {recvs} receive queue entries)",
                        *w.cq_depth
                    ),
                    Some(format!(
                        "set cq_depth = {need} or more: a QP in error flushes every outstanding WR as a completion, and an overrun CQ stops the worker"
                    )),
                );
            }
        }
    }

    // ---------------------------------------------------------------- qps

    fn qps(&mut self) {
        let cfg = self.cfg;
        // Workers already blamed for a too-large doorbell batch / signal interval.
        let mut batch_blamed = HashSet::new();
        let mut signal_blamed = HashSet::new();
        for (j, q) in cfg.qps.iter().enumerate() {
            let f = |name: &str| format!("qps[{j}].{name}");
            let worker_idx = self.workers.get(q.worker.as_str()).copied();
            if worker_idx.is_none() {
                let hint = Self::did_you_mean(&q.worker, self.workers.keys().copied())
                    .unwrap_or_else(|| "define it with [[workers]]".into());
                self.push(
                    ErrorKind::Dangling,
                    q.worker.span.clone(),
                    f("worker"),
                    format!("worker `{}` does not exist", q.worker),
                    Some(hint),
                );
            }
            if *q.send_depth == 0 {
                self.push(
                    ErrorKind::Invalid,
                    first_span(&[&q.send_depth.span, &q.name.span]),
                    f("send_depth"),
                    "send_depth must be at least 1".into(),
                    None,
                );
            }
            if !*q.use_srq && *q.recv_depth == 0 {
                self.push(
                    ErrorKind::Invalid,
                    first_span(&[&q.recv_depth.span, &q.name.span]),
                    f("recv_depth"),
                    "recv_depth must be at least 1 when use_srq = false".into(),
                    None,
                );
            }
            for (name, value, max, what) in [
                ("min_rnr_timer", &q.min_rnr_timer, 31u8, "an IB RNR timer code 0-31 (12 = 0.64 ms)"),
                ("rnr_retry", &q.rnr_retry, 7, "0-7, where 7 retries forever"),
                ("retry_cnt", &q.retry_cnt, 7, "0-7"),
                ("timeout", &q.timeout, 31, "0-31 (4.096 us * 2^timeout, 0 = forever)"),
            ] {
                if **value > max {
                    self.push(
                        ErrorKind::Invalid,
                        value.span.clone(),
                        f(name),
                        format!("{name} {} is out of range: expected {what}", **value),
                        (name == "rnr_retry").then(|| {
                            "use 7 so a receiver that is briefly out of buffers never breaks the connection".to_owned()
                        }),
                    );
                }
            }
            if let Some(s) = &q.signal_interval {
                if **s == 0 {
                    self.push(
                        ErrorKind::Invalid,
                        s.span.clone(),
                        f("signal_interval"),
                        "signal_interval must be at least 1".into(),
                        None,
                    );
                }
            }
            self.peer(j);
            self.mcast(j);
            self.raw_packet(j);

            let Some(wi) = worker_idx else { continue };
            let w = &cfg.workers[wi];
            let depth = *q.send_depth;
            if depth == 0 {
                continue;
            }
            // Doorbell batch: a batch must fit in the send queue.
            let batch = *w.doorbell_batch;
            if batch > depth {
                if w.doorbell_batch.is_explicit() && !q.send_depth.is_explicit() {
                    if batch_blamed.insert(wi) {
                        self.push(
                            ErrorKind::Invalid,
                            w.doorbell_batch.span.clone(),
                            format!("workers[{wi}].doorbell_batch"),
                            format!("doorbell batch {batch} exceeds send_depth {depth} of qp `{}`", q.name),
                            Some(format!("a batch must fit in the send queue: lower doorbell_batch to at most {depth}, or raise the qp's send_depth")),
                        );
                    }
                } else {
                    self.push(
                        ErrorKind::Invalid,
                        first_span(&[&q.send_depth.span, &q.name.span]),
                        f("send_depth"),
                        format!("send_depth {depth} is smaller than the doorbell batch {batch} of worker `{}`", w.name),
                        Some(format!("a batch must fit in the send queue: set send_depth to at least {batch}")),
                    );
                }
            }
            // Selective signaling: two intervals must fit in the send queue, so the queue
            // never fills with unsignaled WRs whose slots no completion will free.
            let interval = q.effective_signal_interval(w);
            if interval > 0 && u64::from(depth) < 2 * u64::from(interval) {
                let msg = format!(
                    "signal interval {interval} needs send_depth >= {} (two intervals in flight), but qp `{}` has send_depth {depth}",
                    2 * u64::from(interval),
                    q.name
                );
                let hint = format!(
                    "lower the signal interval to at most {}, or raise send_depth to {}",
                    depth / 2,
                    2 * u64::from(interval)
                );
                match &q.signal_interval {
                    Some(s) => self.push(ErrorKind::Invalid, s.span.clone(), f("signal_interval"), msg, Some(hint)),
                    None if w.signal_interval.is_explicit() && !q.send_depth.is_explicit() => {
                        if signal_blamed.insert(wi) {
                            self.push(
                                ErrorKind::Invalid,
                                w.signal_interval.span.clone(),
                                format!("workers[{wi}].signal_interval"),
                                msg,
                                Some(hint),
                            );
                        }
                    }
                    None => self.push(
                        ErrorKind::Invalid,
                        first_span(&[&q.send_depth.span, &q.name.span]),
                        f("send_depth"),
                        msg,
                        Some(hint),
                    ),
                }
            }
        }
    }

    /// `raw_packet`: with provider xdp (which has no other transport) or shm (the fabric's
    /// software switch); no peer or listen; `port` only on raw_packet QPs of xdp, within
    /// `provider.interfaces`.
    fn raw_packet(&mut self, j: usize) {
        let cfg = self.cfg;
        let q = &cfg.qps[j];
        let kind = *cfg.provider.kind;
        let xdp = kind == ProviderKind::Xdp;
        let raw = *q.transport == Transport::RawPacket;
        if (raw && kind == ProviderKind::Rdma) || (xdp && !raw) {
            let (msg, help) = if raw {
                (
                    format!("qp `{}` is raw_packet, which the rdma provider does not run in pipelines", q.name),
                    "use the xdp provider (Linux interfaces) or shm (a software switch), or rc or ud",
                )
            } else {
                (
                    format!("qp `{}` is {}; the xdp provider has raw_packet QPs only", q.name, q.transport.as_str()),
                    "set transport = \"raw_packet\"",
                )
            };
            let span = if q.transport.is_explicit() { q.transport.span.clone() } else { q.name.span.clone() };
            self.push(ErrorKind::Invalid, span, format!("qps[{j}].transport"), msg, Some(help.into()));
        }
        if raw {
            for (f, span) in [
                ("peer", q.peer.as_ref().map(|p| p.span.clone())),
                ("listen", q.listen.as_ref().map(|p| p.span.clone())),
            ] {
                if let Some(span) = span {
                    self.push(
                        ErrorKind::Invalid,
                        span,
                        format!("qps[{j}].{f}"),
                        format!("raw_packet qp `{}` has `{f}`: its frames go out of its port, to whatever the frame's MACs name", q.name),
                        Some(format!("remove `{f}`; pick the interface with `port`")),
                    );
                }
            }
        }
        if let Some(port) = &q.port {
            let n = cfg.provider.interfaces.as_ref().map_or(0, |i| i.len());
            let msg = if !raw {
                Some(format!("`port` applies only to raw_packet qps; `{}` is {}", q.name, q.transport.as_str()))
            } else if !xdp {
                Some(format!(
                    "`port` picks an interface of the xdp provider; the {} provider has one switch",
                    kind.as_str()
                ))
            } else if **port == 0 || usize::from(**port) > n {
                Some(format!("port {} does not exist: the xdp device has ports 1..={n} (provider.interfaces)", **port))
            } else {
                None
            };
            if let Some(msg) = msg {
                self.push(
                    ErrorKind::Invalid,
                    port.span.clone(),
                    format!("qps[{j}].port"),
                    msg,
                    Some("ports are numbered from 1, in the order of provider.interfaces".into()),
                );
            }
        }
    }

    /// `mcast`: a UD QP only, and an address in ff00::/8.
    fn mcast(&mut self, j: usize) {
        let q = &self.cfg.qps[j];
        let Some(group) = &q.mcast else { return };
        let field = format!("qps[{j}].mcast");
        if *q.transport != Transport::Ud {
            self.push(
                ErrorKind::Invalid,
                group.span.clone(),
                field,
                format!("qp `{}` is {}; only a ud qp can join a multicast group", q.name, q.transport.as_str()),
                Some("set transport = \"ud\" on this qp, or remove `mcast`".into()),
            );
        } else if let Err(e) = crate::schema::parse_mcast_group(group) {
            self.push(
                ErrorKind::Invalid,
                group.span.clone(),
                field,
                e,
                Some("write an IPv6 multicast address, e.g. mcast = \"ff0e::1:1\"".into()),
            );
        }
    }

    fn peer(&mut self, j: usize) {
        let cfg = self.cfg;
        let q = &cfg.qps[j];
        let field = format!("qps[{j}].peer");
        if let Some(listen) = &q.listen {
            let field = format!("qps[{j}].listen");
            if q.peer.is_some() {
                self.push(
                    ErrorKind::Invalid,
                    listen.span.clone(),
                    field,
                    format!("qp `{}` has both `peer` and `listen`", q.name),
                    Some("a qp either connects to its peer (`peer`) or waits for a remote one to connect (`listen`): remove one".into()),
                );
            } else if let Err(e) = parse_listen(listen) {
                self.push(
                    ErrorKind::Invalid,
                    listen.span.clone(),
                    field,
                    e,
                    Some("write \"host:port\": \"0.0.0.0:7000\" for every IPv4 address, \"[::]:7000\" for IPv6".into()),
                );
            }
            return;
        }
        let Some(peer) = &q.peer else {
            if *q.transport == Transport::Rc {
                self.push(
                    ErrorKind::Invalid,
                    q.name.span.clone(),
                    format!("qps[{j}]"),
                    format!("rc qp `{}` has no peer", q.name),
                    Some("set peer = \"<qp name>\" for a loopback, peer = \"host:port\" to connect to a remote process, or listen = \"host:port\" to wait for one".into()),
                );
            }
            return;
        };
        match parse_peer(peer) {
            Err(e) => self.push(
                ErrorKind::Invalid,
                peer.span.clone(),
                field,
                e,
                Some("write a qp name, or \"host:port\" (\"[::1]:7000\" for IPv6)".into()),
            ),
            Ok(Peer::Remote { .. }) => {}
            Ok(Peer::Group(_)) => {
                if *q.transport != Transport::Ud {
                    self.push(
                        ErrorKind::Invalid,
                        peer.span.clone(),
                        field,
                        format!("rc qp `{}` has a multicast group as its peer (`{}`)", q.name, peer.as_str()),
                        Some("only a ud qp sends to a multicast group: set transport = \"ud\"".into()),
                    );
                }
            }
            Ok(Peer::Local(name)) => {
                if name == q.name.as_str() {
                    self.push(
                        ErrorKind::Invalid,
                        peer.span.clone(),
                        field,
                        format!("qp `{name}` cannot be its own peer"),
                        Some("create a second qp and make the two peers of each other".into()),
                    );
                    return;
                }
                let Some(&k) = self.qps.get(name) else {
                    let msg = if self.stages.contains_key(name) {
                        format!("peer `{name}` is a stage, not a qp")
                    } else {
                        format!("peer `{name}` does not exist")
                    };
                    let hint = Self::did_you_mean(name, self.qps.keys().copied())
                        .unwrap_or_else(|| "a peer names another qp of this file, or \"host:port\"".into());
                    self.push(ErrorKind::Dangling, peer.span.clone(), field, msg, Some(hint));
                    return;
                };
                let other = &cfg.qps[k];
                if *other.transport != *q.transport {
                    self.push(
                        ErrorKind::Invalid,
                        peer.span.clone(),
                        field,
                        format!(
                            "qp `{}` is {} but its peer `{}` is {}",
                            q.name,
                            q.transport.as_str(),
                            other.name,
                            other.transport.as_str()
                        ),
                        Some("both ends of a connection use the same transport".into()),
                    );
                } else if *q.transport == Transport::Rc {
                    let back = other.peer.as_ref().map(|p| p.as_str());
                    if back != Some(q.name.as_str()) {
                        let now = match back {
                            Some(b) => format!("`{}` peers with `{b}`", other.name),
                            None => format!("`{}` has no peer", other.name),
                        };
                        self.push(
                            ErrorKind::Invalid,
                            peer.span.clone(),
                            field,
                            format!("rc qp `{}` peers with `{}`, but {now}", q.name, other.name),
                            Some(format!(
                                "an rc connection has two ends: set peer = \"{}\" on qp `{}`",
                                q.name, other.name
                            )),
                        );
                    }
                }
            }
        }
    }

    // ---------------------------------------------------------------- stages

    fn stages(&mut self) {
        let cfg = self.cfg;
        let mut consumers: HashMap<usize, usize> = HashMap::new();
        for (i, s) in cfg.stages.iter().enumerate() {
            let f = |name: &str| format!("stages[{i}].{name}");
            let kind = s.kind.value.clone();
            let worker_idx = self.workers.get(s.worker.as_str()).copied();
            if worker_idx.is_none() {
                let hint = Self::did_you_mean(&s.worker, self.workers.keys().copied())
                    .unwrap_or_else(|| "define it with [[workers]]".into());
                self.push(
                    ErrorKind::Dangling,
                    s.worker.span.clone(),
                    f("worker"),
                    format!("worker `{}` does not exist", s.worker),
                    Some(hint),
                );
            }
            self.stage_kind_rules(i);

            // input
            if let Some(input) = &s.input {
                match self.endpoint(input) {
                    None => self.dangling_endpoint(f("input"), input, "input"),
                    Some(Endpoint::Qp(j)) => {
                        self.check_owner(i, j, f("input"), input.span.clone());
                        let q = &cfg.qps[j];
                        if kind == StageKind::Echo
                            && *q.transport == Transport::Ud
                            && q.peer.is_none()
                            && q.listen.is_none()
                        {
                            self.push(
                                ErrorKind::Invalid,
                                input.span.clone(),
                                f("input"),
                                format!(
                                    "echo stage `{}` replies on ud qp `{}`, which has no peer to send to",
                                    s.name, q.name
                                ),
                                Some(format!(
                                    "set peer (or listen) on qp `{}`: a ud qp sends every message to its peer",
                                    q.name
                                )),
                            );
                        }
                        if let Some(&other) = consumers.get(&j) {
                            self.push(
                                ErrorKind::Duplicate,
                                input.span.clone(),
                                f("input"),
                                format!("qp `{}` already feeds stage `{}`", cfg.qps[j].name, cfg.stages[other].name),
                                Some("a qp's receives go to exactly one stage; add a fanout stage to copy them".into()),
                            );
                        } else {
                            consumers.insert(j, i);
                        }
                    }
                    Some(Endpoint::Stage(k)) => {
                        if kind == StageKind::Echo {
                            self.push(
                                ErrorKind::Invalid,
                                input.span.clone(),
                                f("input"),
                                format!("an echo stage replies on the qp a message came from, so its input must be a qp, not stage `{}`", input),
                                None,
                            );
                        } else if k != i && !cfg.stages[k].destinations().any(|d| d.as_str() == s.name.as_str()) {
                            let field = if *cfg.stages[k].kind == StageKind::Fanout { "outputs" } else { "output" };
                            self.push(
                                ErrorKind::Invalid,
                                input.span.clone(),
                                f("input"),
                                format!(
                                    "stage `{}` takes input from stage `{}`, which does not send to it",
                                    s.name, input
                                ),
                                Some(format!(
                                    "stage links are written on both ends: add \"{}\" to `{field}` of stage `{}`",
                                    s.name, input
                                )),
                            );
                        }
                    }
                }
            }

            // outputs
            let mut seen: HashMap<&str, Option<Range<usize>>> = HashMap::new();
            for (n, dest) in
                s.output.iter().map(|d| (None, d)).chain(s.outputs.iter().enumerate().map(|(n, d)| (Some(n), d)))
            {
                let field = match n {
                    None => f("output"),
                    Some(n) => format!("stages[{i}].outputs[{n}]"),
                };
                if let Some(prev) = seen.get(dest.as_str()) {
                    let at = self.at(prev);
                    self.push(
                        ErrorKind::Duplicate,
                        dest.span.clone(),
                        field,
                        format!("`{}` is listed twice{at}", dest.as_str()),
                        Some("each message would be sent to it twice; remove the repeat".into()),
                    );
                    continue;
                }
                seen.insert(dest.as_str(), dest.span.clone());
                match self.endpoint(dest) {
                    None => self.dangling_endpoint(field, dest, "output"),
                    Some(Endpoint::Qp(j)) => {
                        self.check_owner(i, j, field.clone(), dest.span.clone());
                        let q = &cfg.qps[j];
                        if *q.transport == Transport::Ud && q.peer.is_none() && q.listen.is_none() {
                            self.push(
                                ErrorKind::Invalid,
                                dest.span.clone(),
                                field,
                                format!("stage `{}` sends on ud qp `{}`, which has no peer to send to", s.name, q.name),
                                Some(format!("set peer (or listen) on qp `{}`", q.name)),
                            );
                        }
                    }
                    Some(Endpoint::Stage(k)) => {
                        let target = &cfg.stages[k];
                        if k != i && target.input.as_ref().map(|x| x.as_str()) != Some(s.name.as_str()) {
                            let now = match &target.input {
                                Some(x) => format!("takes input from `{}`", x.as_str()),
                                None => "has no input".into(),
                            };
                            self.push(
                                ErrorKind::Invalid,
                                dest.span.clone(),
                                field,
                                format!("stage `{}` sends to stage `{}`, which {now}", s.name, target.name),
                                Some(format!(
                                    "stage links are written on both ends: set input = \"{}\" on stage `{}`",
                                    s.name, target.name
                                )),
                            );
                        }
                    }
                }
            }
        }
    }

    fn dangling_endpoint(&mut self, field: String, name: &Located<String>, what: &str) {
        let hint = Self::did_you_mean(name, self.endpoint_names())
            .unwrap_or_else(|| format!("an {what} names a qp or a stage of this file"));
        self.push(
            ErrorKind::Dangling,
            name.span.clone(),
            field,
            format!("{what} `{}` is neither a qp nor a stage", name.as_str()),
            Some(hint),
        );
    }

    fn check_owner(&mut self, stage: usize, qp: usize, field: String, span: Option<Range<usize>>) {
        let s = &self.cfg.stages[stage];
        let q = &self.cfg.qps[qp];
        if q.worker.as_str() != s.worker.as_str()
            && self.workers.contains_key(q.worker.as_str())
            && self.workers.contains_key(s.worker.as_str())
        {
            self.push(
                ErrorKind::Invalid,
                span,
                field,
                format!(
                    "qp `{}` is owned by worker `{}`, but stage `{}` runs on worker `{}`",
                    q.name, q.worker, s.name, s.worker
                ),
                Some(format!(
                    "a worker polls and posts only its own qps: move the stage to `{}` or the qp to `{}`",
                    q.worker, s.worker
                )),
            );
        }
    }

    fn stage_kind_rules(&mut self, i: usize) {
        let s = &self.cfg.stages[i];
        let f = |name: &str| format!("stages[{i}].{name}");
        let kind = s.kind.value.clone();
        let k = kind.as_str();
        if let StageKind::User(name) = &kind {
            self.user_kind_rules(i, name);
        } else {
            if let Some(p) = &s.params {
                self.push(
                    ErrorKind::Invalid,
                    p.span.clone(),
                    f("params"),
                    format!("`params` applies only to registered stage kinds, not to the built-in kind \"{k}\""),
                    Some(format!("a {k} stage takes its parameters as fields of the stage: see config/reference.toml")),
                );
            }
            self.builtin_endpoint_rules(i);
        }
        // Kind-specific parameters.
        let foreign = |owner: StageKind, name: &'static str, span: &Option<Range<usize>>| {
            (owner != kind && span.is_some()).then(|| (name, owner, span.clone()))
        };
        let list = [
            foreign(StageKind::Source, "rate", &s.rate.span),
            foreign(StageKind::Source, "message_size", &s.message_size.span),
            foreign(StageKind::Source, "count", &s.count.span),
            foreign(StageKind::Source, "duration", &s.duration.span),
            foreign(StageKind::Sink, "verify_sequence", &s.verify_sequence.span),
            foreign(StageKind::Sink, "histogram", &s.histogram.span),
        ];
        for (name, owner, span) in list.into_iter().flatten() {
            let hint = if kind.is_builtin() {
                format!("remove it from this {k} stage")
            } else {
                format!("remove it; a {k} stage takes its parameters in its `params` table")
            };
            self.push(
                ErrorKind::Invalid,
                span,
                f(name),
                format!("`{name}` applies only to kind = \"{}\"", owner.as_str()),
                Some(hint),
            );
        }
        if kind == StageKind::Source {
            self.source_rules(i);
        }
    }

    /// A registered kind: it must exist, and its endpoints follow its [`KindShape`].
    fn user_kind_rules(&mut self, i: usize, name: &str) {
        let s = &self.cfg.stages[i];
        let f = |field: &str| format!("stages[{i}].{field}");
        let Some(shape) = self.env.kinds.get(name).copied() else {
            let known: Vec<&str> = StageKind::BUILTIN
                .iter()
                .map(|k| k.as_str())
                .chain(self.env.kinds.keys().map(String::as_str))
                .collect();
            let list = known.iter().map(|k| format!("\"{k}\"")).collect::<Vec<_>>().join(", ");
            let msg = match closest(name, known.iter().copied()) {
                Some(c) => format!("unknown stage kind \"{name}\", did you mean \"{c}\"?"),
                None => format!("unknown stage kind \"{name}\""),
            };
            self.push(
                ErrorKind::UnknownVariant,
                s.kind.span.clone(),
                f("kind"),
                msg,
                Some(format!("the kinds this program knows: {list}")),
            );
            return;
        };
        match (&s.input, shape.input) {
            (None, true) => self.push(
                ErrorKind::Invalid,
                s.name.span.clone(),
                format!("stages[{i}]"),
                format!("{name} stage `{}` needs an `input`", s.name),
                Some("set input = \"<qp or stage name>\"".into()),
            ),
            (Some(input), false) => self.push(
                ErrorKind::Invalid,
                input.span.clone(),
                f("input"),
                format!("a {name} stage generates its messages and takes no `input`"),
                Some("remove `input`".into()),
            ),
            _ => {}
        }
        if let (Some(o), true) = (&s.output, s.outputs.is_explicit()) {
            self.push(
                ErrorKind::Invalid,
                o.span.clone(),
                f("output"),
                "set either `output` or `outputs`, not both".into(),
                Some("`output = \"x\"` is the same as `outputs = [\"x\"]`".into()),
            );
            return;
        }
        let count = s.output.iter().count() + s.outputs.len();
        let (min, max) = (shape.min_outputs, shape.max_outputs);
        let wanted = match (min, max) {
            (0, 0) => "no output".to_owned(),
            (a, b) if a == b => format!("exactly {a} output{}", if a == 1 { "" } else { "s" }),
            (a, usize::MAX) => format!("at least {a} output{}", if a == 1 { "" } else { "s" }),
            (a, b) => format!("{a} to {b} outputs"),
        };
        if count < min || count > max {
            let span = first_span(&[&s.output.as_ref().and_then(|o| o.span.clone()), &s.outputs.span, &s.name.span]);
            let field = if s.outputs.is_explicit() { f("outputs") } else { f("output") };
            let hint = match max {
                0 => "remove `output` and `outputs`".to_owned(),
                1 => "set output = \"<qp or stage name>\"".to_owned(),
                _ => "set outputs = [\"<qp or stage>\", ...]".to_owned(),
            };
            self.push(
                ErrorKind::Invalid,
                span,
                field,
                format!("{name} stage `{}` takes {wanted}, and has {count}", s.name),
                Some(hint),
            );
        }
    }

    /// A built-in kind's required and forbidden endpoints.
    fn builtin_endpoint_rules(&mut self, i: usize) {
        let s = &self.cfg.stages[i];
        let f = |name: &str| format!("stages[{i}].{name}");
        let kind = s.kind.value.clone();
        let k = kind.as_str();
        // Required and forbidden endpoints.
        if kind.has_input() && s.input.is_none() {
            self.push(
                ErrorKind::Invalid,
                s.name.span.clone(),
                format!("stages[{i}]"),
                format!("{k} stage `{}` needs an `input`", s.name),
                Some("set input = \"<qp or stage name>\"".into()),
            );
        }
        if !kind.has_input() {
            if let Some(input) = &s.input {
                self.push(
                    ErrorKind::Invalid,
                    input.span.clone(),
                    f("input"),
                    "a source stage generates its messages and takes no `input`".into(),
                    Some("remove `input`".into()),
                );
            }
        }
        let needs_output = matches!(kind, StageKind::Forward | StageKind::Sequencer | StageKind::Source);
        match (&s.output, needs_output) {
            (None, true) => self.push(
                ErrorKind::Invalid,
                s.name.span.clone(),
                format!("stages[{i}]"),
                format!("{k} stage `{}` needs an `output`", s.name),
                Some("set output = \"<qp or stage name>\"".into()),
            ),
            (Some(o), false) => {
                let hint = match kind {
                    StageKind::Echo => "an echo stage replies on its input qp; remove `output`",
                    StageKind::Fanout => "a fanout stage sends to every name in `outputs = [...]`",
                    _ => "a sink consumes messages; remove `output`",
                };
                self.push(
                    ErrorKind::Invalid,
                    o.span.clone(),
                    f("output"),
                    format!("{} {k} stage takes no `output`", article(k)),
                    Some(hint.into()),
                );
            }
            _ => {}
        }
        if kind == StageKind::Fanout {
            if s.outputs.is_empty() {
                self.push(
                    ErrorKind::Invalid,
                    first_span(&[&s.outputs.span, &s.name.span]),
                    f("outputs"),
                    format!("fanout stage `{}` needs at least one name in `outputs`", s.name),
                    Some("set outputs = [\"<qp or stage>\", ...]".into()),
                );
            }
        } else if s.outputs.is_explicit() {
            self.push(
                ErrorKind::Invalid,
                s.outputs.span.clone(),
                f("outputs"),
                "`outputs` applies only to kind = \"fanout\"".into(),
                Some(format!("use `output` for {} {k} stage, or set kind = \"fanout\"", article(k))),
            );
        }
    }

    /// A source's rate, message size and limits.
    fn source_rules(&mut self, i: usize) {
        let s = &self.cfg.stages[i];
        let f = |name: &str| format!("stages[{i}].{name}");
        if *s.rate == Rate::PerSecond(0) {
            self.push(
                ErrorKind::Invalid,
                s.rate.span.clone(),
                f("rate"),
                "rate 0 would send nothing".into(),
                Some("give messages per second, or \"max\"".into()),
            );
        }
        if s.message_size.bytes() < MIN_MESSAGE_SIZE {
            self.push(
                ErrorKind::Invalid,
                s.message_size.span.clone(),
                f("message_size"),
                format!("message_size {} is below the minimum of {MIN_MESSAGE_SIZE} bytes", s.message_size.bytes()),
                Some("a source message carries an 8-byte sequence number and an 8-byte timestamp".into()),
            );
        }
        if *s.count != 0 && !s.duration.is_zero() {
            self.push(
                ErrorKind::Invalid,
                first_span(&[&s.duration.span, &s.count.span]),
                f("duration"),
                "set either `count` or `duration`, not both".into(),
                Some("count stops after N messages, duration after a time; 0 means no limit".into()),
            );
        }
    }

    /// Stage-to-stage links, from both declarations (`output(s)` and `input`).
    fn links(&self) -> Vec<Vec<Link>> {
        let cfg = self.cfg;
        let mut links: Vec<Vec<Link>> = vec![Vec::new(); cfg.stages.len()];
        for (i, s) in cfg.stages.iter().enumerate() {
            for (n, dest) in s.destinations().enumerate() {
                if let Some(Endpoint::Stage(k)) = self.endpoint(dest) {
                    let field = if s.output.is_some() && n == 0 {
                        format!("stages[{i}].output")
                    } else {
                        format!("stages[{i}].outputs[{}]", n - usize::from(s.output.is_some()))
                    };
                    links[i].push(Link { to: k, span: dest.span.clone(), field });
                }
            }
        }
        // Input-side declarations after all output-side ones, so that a cycle is reported at
        // an `output` where both ends declare the closing link.
        for (i, s) in cfg.stages.iter().enumerate() {
            if let Some(input) = &s.input {
                if let Some(Endpoint::Stage(k)) = self.endpoint(input) {
                    if *s.kind != StageKind::Echo {
                        links[k].push(Link { to: i, span: input.span.clone(), field: format!("stages[{i}].input") });
                    }
                }
            }
        }
        links
    }

    fn cycles(&mut self) {
        let cfg = self.cfg;
        let links = self.links();
        let n = cfg.stages.len();
        // 0 = unvisited, 1 = on the current path, 2 = done. Iterative: no recursion depth.
        let mut state = vec![0u8; n];
        let mut reported: HashSet<BTreeSet<usize>> = HashSet::new();
        for root in 0..n {
            if state[root] != 0 {
                continue;
            }
            let mut stack: Vec<(usize, usize)> = vec![(root, 0)];
            state[root] = 1;
            while let Some(&mut (node, ref mut next)) = stack.last_mut() {
                if let Some(link) = links[node].get(*next) {
                    *next += 1;
                    let to = link.to;
                    match state[to] {
                        0 => {
                            state[to] = 1;
                            stack.push((to, 0));
                        }
                        1 => {
                            let start = stack.iter().position(|&(s, _)| s == to).unwrap_or(0);
                            let members: Vec<usize> = stack[start..].iter().map(|&(s, _)| s).collect();
                            let key: BTreeSet<usize> = members.iter().copied().collect();
                            if reported.insert(key) {
                                let mut path: Vec<&str> =
                                    members.iter().map(|&s| cfg.stages[s].name.as_str()).collect();
                                path.push(cfg.stages[to].name.as_str());
                                let (span, field) = (link.span.clone(), link.field.clone());
                                self.push(
                                    ErrorKind::Cycle,
                                    span,
                                    field,
                                    format!("stage wiring forms a cycle: {}", path.join(" -> ")),
                                    Some("stage links must not loop, or messages circulate forever; for a round trip, go through a qp pair".into()),
                                );
                            }
                        }
                        _ => {}
                    }
                } else {
                    state[node] = 2;
                    stack.pop();
                }
            }
        }
    }

    /// Message sizes along every path from a source: send buffers, receive buffers, UD MTU.
    /// A QP whose peer (in this pipeline) is written to by a stage must be some stage's
    /// `input`: its receive completions are otherwise never polled, so the run loses every
    /// message it sends (or, once the receive queue is empty, counts RNR errors on the
    /// sender). A QP whose peer nobody writes (the way back of a one-way path) needs no reader;
    /// a remote peer's traffic is not known here.
    fn unread_qps(&mut self) {
        let cfg = self.cfg;
        let mut read = vec![false; cfg.qps.len()];
        // QP index -> the first stage that sends on it (echo replies on its input).
        let mut writer: HashMap<usize, usize> = HashMap::new();
        for (k, s) in cfg.stages.iter().enumerate() {
            let input = s.input.as_ref().and_then(|x| self.endpoint(x));
            if let Some(Endpoint::Qp(j)) = input {
                read[j] = true;
                if *s.kind == StageKind::Echo {
                    writer.entry(j).or_insert(k);
                }
            }
            let outputs = s.output.iter().chain(s.outputs.iter());
            for o in outputs {
                if let Some(Endpoint::Qp(j)) = self.endpoint(o) {
                    writer.entry(j).or_insert(k);
                }
            }
        }
        for (j, q) in cfg.qps.iter().enumerate() {
            let Some(Peer::Local(peer)) = q.peer() else { continue };
            let Some(&p) = self.qps.get(peer) else { continue }; // dangling: reported by qps()
            let Some(&k) = writer.get(&p) else { continue };
            if read[j] {
                continue;
            }
            self.push(
                ErrorKind::Invalid,
                first_span(&[&q.name.span]),
                format!("qps[{j}]"),
                format!(
                    "qp `{}` receives what stage `{}` sends on its peer `{peer}`, but no stage reads it (no stage has input = \"{}\")",
                    q.name, cfg.stages[k].name, q.name
                ),
                Some(format!(
                    "add a stage with input = \"{}\" (a sink counts and drops), or stop sending on `{peer}`; unread, its messages are lost",
                    q.name
                )),
            );
        }
    }

    fn message_sizes(&mut self) {
        let cfg = self.cfg;
        let mut consumer: HashMap<usize, usize> = HashMap::new();
        for (i, s) in cfg.stages.iter().enumerate() {
            if let Some(Endpoint::Qp(j)) = s.input.as_ref().and_then(|x| self.endpoint(x)) {
                consumer.entry(j).or_insert(i);
            }
        }
        let mut reported: HashSet<(usize, &'static str)> = HashSet::new();
        for (src, s) in cfg.stages.iter().enumerate() {
            if *s.kind != StageKind::Source {
                continue;
            }
            let size = s.message_size.bytes();
            let field = format!("stages[{src}].message_size");
            let span = first_span(&[&s.message_size.span, &s.name.span]);
            let mut visited = vec![false; cfg.stages.len()];
            let mut todo = vec![src];
            while let Some(i) = todo.pop() {
                if std::mem::replace(&mut visited[i], true) {
                    continue;
                }
                let st = &cfg.stages[i];
                // The sending worker's pool buffers hold the message.
                if let Some(pool) = self
                    .workers
                    .get(st.worker.as_str())
                    .and_then(|&w| self.pools.get(cfg.workers[w].pool.as_str()))
                    .map(|&p| &cfg.memory.pools[p])
                {
                    if size > pool.buffer_size.bytes() && reported.insert((i, "pool")) {
                        self.push(
                            ErrorKind::Invalid,
                            span.clone(),
                            field.clone(),
                            format!(
                                "message_size {} does not fit the {} buffers of pool `{}` used by stage `{}`",
                                *s.message_size, *pool.buffer_size, pool.name, st.name
                            ),
                            Some("raise the pool's buffer_size or lower message_size".into()),
                        );
                    }
                }
                let dests: Vec<&Located<String>> =
                    if *st.kind == StageKind::Echo { st.input.iter().collect() } else { st.destinations().collect() };
                for d in dests {
                    match self.endpoint(d) {
                        Some(Endpoint::Stage(k)) => todo.push(k),
                        Some(Endpoint::Qp(j)) => {
                            let q = &cfg.qps[j];
                            let ud = *q.transport == Transport::Ud;
                            if ud && size > 4096 && reported.insert((j, "mtu")) {
                                self.push(
                                    ErrorKind::Invalid,
                                    span.clone(),
                                    field.clone(),
                                    format!("message_size {} is larger than a UD message can be (the path MTU, at most 4096 bytes) on qp `{}`", *s.message_size, q.name),
                                    Some("lower message_size, or use transport = \"rc\"".into()),
                                );
                            }
                            let Some(Peer::Local(p)) = q.peer() else {
                                continue;
                            };
                            let Some(&pj) = self.qps.get(p) else { continue };
                            let peer = &cfg.qps[pj];
                            let Some(&pw) = self.workers.get(peer.worker.as_str()) else {
                                continue;
                            };
                            let w = &cfg.workers[pw];
                            let need = size + if ud { UD_GRH_BYTES } else { 0 };
                            if need > w.recv_buffer_size.bytes() && reported.insert((pj, "recv")) {
                                let grh = if ud { " plus the 40-byte GRH of UD" } else { "" };
                                self.push(
                                    ErrorKind::Invalid,
                                    span.clone(),
                                    field.clone(),
                                    format!(
                                        "message_size {}{grh} does not fit the {} receive buffers of worker `{}` (qp `{}`)",
                                        *s.message_size, *w.recv_buffer_size, w.name, peer.name
                                    ),
                                    Some(format!("set recv_buffer_size on worker `{}` to at least {need}", w.name)),
                                );
                            }
                            if let Some(&next) = consumer.get(&pj) {
                                todo.push(next);
                            }
                        }
                        None => {}
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists() {
        assert_eq!(parse_cpu_list("0-3,6,8-9"), Some(vec![0, 1, 2, 3, 6, 8, 9]));
        assert_eq!(parse_cpu_list("0"), Some(vec![0]));
        assert_eq!(parse_cpu_list("3-1"), None);
        assert_eq!(parse_cpu_list("x"), None);
        assert_eq!(format_cpu_list(&[0, 1, 2, 3, 6, 8, 9]), "0-3,6,8-9");
        assert_eq!(format_cpu_list(&[1, 0]), "0-1");
        assert_eq!(human(64 << 20), "64 MiB");
        assert_eq!(human(3 << 29), "1.5 GiB");
        assert_eq!(human(100), "100 B");
    }

    #[test]
    fn detect_finds_a_core() {
        assert!(!ValidationEnv::detect().cores.is_empty());
    }
}

//! `dpctl`: live counters of running `dataplane run` pipelines, read from their shared-memory
//! stats segments without slowing them.
//!
//! ```text
//! dpctl [stats] [NAME | PID | PATH] [--pid N] [--json]     counters since the start
//! dpctl watch   [NAME | PID | PATH] [-i 1s] [-n COUNT] [--json]   refreshed, rates per interval
//! dpctl list    [--json]                                  every segment, live or stale (dead pid, no uptime)
//! dpctl clean                                             removes stale segments
//! dpctl prom    [NAME | PID] [--pid N]                    Prometheus text format
//! dpctl serve   [NAME | PID] [--listen 127.0.0.1:9470]    the same over HTTP, GET /metrics
//! ```
//!
//! With no target it picks the only running pipeline (and lists them if there are several).
//! Segments are looked for in `--dir`, else `$DATAPLANE_STATS_DIR`, else `/dev/shm`.
//! Exit status 1 on any error (no such pipeline, a corrupt or mismatched segment).

use clap::{Args, Parser, Subcommand};
use dataplane_apps::json::{number, string};
use dataplane_apps::stats::read::{list, stale_segments, Listed, Segment, Snapshot};
use dataplane_apps::stats::view::View;
use dataplane_apps::stats::{file_name, proc_start_ticks, stats_dir};
use dataplane_apps::stats::{http, prom};
use dataplane_config::HumanDuration;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[derive(Parser, Debug)]
#[command(
    name = "dpctl",
    about = "Live counters of running dataplane pipelines",
    args_conflicts_with_subcommands = true
)]
struct Cli {
    /// Without a command: `stats` of this target.
    #[command(flatten)]
    target: Target,
    /// Directory of the stats segments (default: $DATAPLANE_STATS_DIR, else /dev/shm).
    #[arg(long, global = true)]
    dir: Option<PathBuf>,
    #[command(subcommand)]
    cmd: Option<Cmd>,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Print the counters of a pipeline (totals and rates since its start).
    Stats(Target),
    /// Refresh the counters every interval, with rates over the interval.
    Watch {
        #[command(flatten)]
        target: Target,
        /// Refresh interval (e.g. `1s`, `500ms`).
        #[arg(short, long, default_value = "1s")]
        interval: String,
        /// Stop after this many refreshes (0: until the pipeline ends or Ctrl-C).
        #[arg(short = 'n', long, default_value_t = 0)]
        count: u64,
    },
    /// List the stats segments, live and stale.
    List {
        /// One JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Remove the segments of processes that are gone.
    Clean,
    /// Print the running pipelines' counters and latency histograms in the Prometheus text
    /// format (all of them, or the one named).
    Prom(PromTarget),
    /// Serve `dpctl prom` over HTTP: GET /metrics, scraped afresh on each request.
    Serve {
        #[command(flatten)]
        target: PromTarget,
        /// Address to listen on (port 0: any free port; the address is printed).
        #[arg(long, default_value = "127.0.0.1:9470")]
        listen: String,
    },
}

/// Which pipelines `prom` and `serve` export: all running ones unless narrowed.
#[derive(Args, Debug, Default)]
struct PromTarget {
    /// Only the pipeline of this name (fabric), or this pid.
    target: Option<String>,
    /// Only the pipeline of this process id.
    #[arg(long)]
    pid: Option<u32>,
}

#[derive(Args, Debug, Default)]
struct Target {
    /// The pipeline: its name (fabric), its pid, or a segment file path.
    target: Option<String>,
    /// The pipeline's process id.
    #[arg(long)]
    pid: Option<u32>,
    /// One JSON object (per refresh for `watch`).
    #[arg(long)]
    json: bool,
}

fn main() {
    dataplane_apps::logging::init();
    let cli = Cli::parse();
    let dir = cli.dir.unwrap_or_else(stats_dir);
    let res = match cli.cmd.unwrap_or(Cmd::Stats(cli.target)) {
        Cmd::Stats(t) => stats(&dir, &t),
        Cmd::Watch { target, interval, count } => watch(&dir, &target, &interval, count),
        Cmd::List { json } => list_cmd(&dir, json),
        Cmd::Clean => clean(&dir),
        Cmd::Prom(t) => prom(&dir, &t),
        Cmd::Serve { target, listen } => serve(&dir, &target, &listen),
    };
    if let Err(e) = res {
        eprintln!("dpctl: {e}");
        std::process::exit(1);
    }
}

fn stats(dir: &Path, t: &Target) -> Result<(), String> {
    let seg = select(dir, t)?;
    let now = seg.snapshot();
    let view = View { segment: &seg, now: &now, base: None, secs: now.uptime.as_secs_f64() };
    print!("{}", if t.json { view.json() + "\n" } else { view.text() });
    Ok(())
}

fn watch(dir: &Path, t: &Target, interval: &str, count: u64) -> Result<(), String> {
    let every = HumanDuration::parse(interval).map_err(|e| format!("--interval: {e}"))?.0;
    if every < Duration::from_millis(10) {
        return Err(format!("--interval {interval}: at least 10ms"));
    }
    let seg = select(dir, t)?;
    let clear = !t.json && std::io::stdout().is_terminal();
    let mut out = std::io::stdout();
    let (mut base, mut at): (Option<Snapshot>, Instant) = (None, Instant::now());
    let mut shown = 0;
    loop {
        let now = seg.snapshot();
        let taken = Instant::now();
        let secs = match base {
            None => now.uptime.as_secs_f64(),
            Some(_) => taken.duration_since(at).as_secs_f64(),
        };
        let view = View { segment: &seg, now: &now, base: base.as_ref(), secs };
        let frame = match (t.json, clear) {
            (true, _) => view.json() + "\n",
            (false, true) => format!("\x1b[H\x1b[2J{}", view.text()),
            (false, false) => view.text() + "\n",
        };
        if out.write_all(frame.as_bytes()).and_then(|()| out.flush()).is_err() {
            return Ok(()); // the reader went away (e.g. `| head`)
        }
        shown += 1;
        if count != 0 && shown >= count {
            return Ok(());
        }
        if !seg.alive() {
            eprintln!("dpctl: pipeline {} (pid {}) has ended", seg.header().name, seg.header().pid);
            return Ok(());
        }
        (base, at) = (Some(now), taken);
        std::thread::sleep(every);
    }
}

/// Finds the segment `t` names: a path, a pid, a pipeline name, or nothing (the only live one).
fn select(dir: &Path, t: &Target) -> Result<Segment, String> {
    if let Some(path) = t.target.as_deref().filter(|s| s.contains('/')) {
        return Segment::open(Path::new(path)).map_err(|e| e.to_string());
    }
    let pid = t.pid.or_else(|| t.target.as_deref().and_then(|s| s.parse().ok()));
    let name = t.target.as_deref().filter(|s| s.parse::<u32>().is_err());
    let all = list(dir).map_err(|e| format!("cannot list {}: {e}", dir.display()))?;
    let wanted = |l: &Listed| match &l.segment {
        Ok(s) => pid.is_none_or(|p| s.header().pid == p as u64) && name.is_none_or(|n| s.header().name == n),
        Err(_) => false,
    };
    let (mut found, rest): (Vec<Listed>, Vec<Listed>) = all.into_iter().partition(wanted);
    let what = match (name, pid) {
        (Some(n), Some(p)) => format!("pipeline {n} of pid {p}"),
        (Some(n), None) => format!("pipeline {n}"),
        (None, Some(p)) => format!("pid {p}"),
        (None, None) => "running pipeline".into(),
    };
    if pid.is_none() && found.iter().any(|l| !l.stale()) {
        found.retain(|l| !l.stale()); // by name or none: the live ones
    } else if pid.is_none() && name.is_none() {
        let stale = found.len();
        found.clear();
        if stale > 0 {
            return Err(format!(
                "no running pipeline in {} ({stale} stale segment(s): `dpctl list`, `dpctl clean`)",
                dir.display()
            ));
        }
    }
    match found.len() {
        1 => found.pop().and_then(|l| l.segment.ok()).ok_or_else(|| "internal: lost the segment".into()),
        0 => {
            // Unreadable files that may be the one asked for: say why they were refused.
            let prefix = name.map(|n| file_name(n, 0).strip_suffix('0').unwrap_or_default().to_string());
            let errors: Vec<String> = rest
                .iter()
                .filter_map(|l| {
                    let e = l.segment.as_ref().err()?;
                    let file = l.path.file_name()?.to_str()?;
                    let by_pid = pid.is_none_or(|p| file.ends_with(&format!(".{p}")));
                    let by_name = prefix.as_deref().is_none_or(|p| file.starts_with(p));
                    (by_pid && by_name).then(|| e.to_string())
                })
                .collect();
            match (errors.len(), pid.is_some() || name.is_some()) {
                (0, _) => Err(format!("no stats segment for {what} in {}", dir.display())),
                (1, true) => Err(errors[0].clone()),
                _ => Err(format!(
                    "no readable stats segment for {what} in {}; unreadable:\n  {}",
                    dir.display(),
                    errors.join("\n  ")
                )),
            }
        }
        _ => {
            let lines: Vec<String> = found.iter().map(line).collect();
            let which = if name.is_some() || pid.is_some() { format!("match {what}") } else { "are running".into() };
            Err(format!(
                "{} pipelines {which}; name one (dpctl stats NAME, --pid N or a segment path):\n  {}",
                found.len(),
                lines.join("\n  ")
            ))
        }
    }
}

/// Why a stale segment's writer is not running: gone, or its pid now names another process.
fn dead(pid: u64) -> String {
    let reused = u32::try_from(pid).ok().and_then(proc_start_ticks).is_some();
    if reused {
        format!("dead (pid {pid} now another process)")
    } else {
        format!("dead (pid {pid} gone)")
    }
}

/// One line of `dpctl list`. A stale segment shows no uptime: its start time is known but not
/// when its process died, so "up" would grow for ever.
fn line(l: &Listed) -> String {
    match &l.segment {
        Ok(s) => {
            let h = s.header();
            let snap = s.snapshot();
            let status = if l.stale() {
                format!("STALE {}", dead(h.pid))
            } else {
                format!("{:<9} up {:>9.1} s", snap.state.name(), snap.uptime.as_secs_f64())
            };
            format!(
                "{:<20} pid {:<8} {status}  workers {}  {}",
                h.name,
                h.pid,
                s.worker_names().join(","),
                l.path.display()
            )
        }
        Err(e) => format!("UNREADABLE{}: {e}", if l.stale() { " (stale)" } else { "" }),
    }
}

fn list_cmd(dir: &Path, json: bool) -> Result<(), String> {
    let all = list(dir).map_err(|e| format!("cannot list {}: {e}", dir.display()))?;
    if !json {
        if all.is_empty() {
            println!("no stats segments in {}", dir.display());
        }
        all.iter().for_each(|l| println!("{}", line(l)));
        return Ok(());
    }
    let items: Vec<String> = all
        .iter()
        .map(|l| {
            let path = string(&l.path.display().to_string());
            match &l.segment {
                Ok(s) => {
                    let (h, snap) = (s.header(), s.snapshot());
                    let names: Vec<String> = s.worker_names().iter().map(|n| string(n)).collect();
                    format!(
                        "{{\"path\":{path},\"name\":{},\"pid\":{},\"stale\":{},\"state\":{},\"uptime_s\":{},\
                         \"workers\":[{}]}}",
                        string(&h.name),
                        h.pid,
                        l.stale(),
                        string(snap.state.name()),
                        // Unknown for a dead writer (see `line`).
                        if l.stale() { "null".to_owned() } else { number(snap.uptime.as_secs_f64()) },
                        names.join(",")
                    )
                }
                Err(e) => format!("{{\"path\":{path},\"stale\":{},\"error\":{}}}", l.stale(), string(&e.to_string())),
            }
        })
        .collect();
    println!("{{\"dir\":{},\"segments\":[{}]}}", string(&dir.display().to_string()), items.join(","));
    Ok(())
}

/// The name and pid filters of `t` (a number is a pid).
fn prom_filter(t: &PromTarget) -> (Option<&str>, Option<u32>) {
    let pid = t.pid.or_else(|| t.target.as_deref().and_then(|s| s.parse().ok()));
    (t.target.as_deref().filter(|s| s.parse::<u32>().is_err()), pid)
}

fn prom(dir: &Path, t: &PromTarget) -> Result<(), String> {
    let (name, pid) = prom_filter(t);
    let (text, n) = prom::scrape(dir, name, pid)?;
    if n == 0 && (name.is_some() || pid.is_some()) {
        let what = match (name, pid) {
            (Some(n), Some(p)) => format!("pipeline {n} of pid {p}"),
            (Some(n), None) => format!("pipeline {n}"),
            (None, _) => format!("pid {}", pid.unwrap_or_default()),
        };
        return Err(format!("no running {what} in {}", dir.display()));
    }
    print!("{text}");
    Ok(())
}

fn serve(dir: &Path, t: &PromTarget, listen: &str) -> Result<(), String> {
    let (name, pid) = prom_filter(t);
    let listener = std::net::TcpListener::bind(listen).map_err(|e| format!("--listen {listen}: {e}"))?;
    let addr = listener.local_addr().map_err(|e| format!("--listen {listen}: {e}"))?;
    println!("serving http://{addr}/metrics (stats segments in {})", dir.display());
    let _ = std::io::stdout().flush();
    http::serve(&listener, || prom::scrape(dir, name, pid).map(|(text, _)| text))
}

fn clean(dir: &Path) -> Result<(), String> {
    let stale = stale_segments(dir).map_err(|e| format!("cannot list {}: {e}", dir.display()))?;
    let mut removed = 0;
    for path in &stale {
        std::fs::remove_file(path).map_err(|e| format!("cannot remove {}: {e}", path.display()))?;
        println!("removed {} (its process is gone)", path.display());
        removed += 1;
    }
    if removed == 0 {
        println!("no stale segments in {}", dir.display());
    }
    Ok(())
}

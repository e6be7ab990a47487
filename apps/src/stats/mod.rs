//! Live stats: `dataplane run` exports its workers' counters through a shared-memory segment
//! that `dpctl` reads while the pipeline runs.
//!
//! The workers write their counters straight into the segment: at start-up
//! ([`export::export`]) every counter block of every worker, QP and stage (and a latency
//! histogram per latency-recording sink) is moved into the mapped file, so the hot loop does
//! exactly what it did before, a relaxed load and store per update, only at another address.
//! No thread copies anything. Layout: [`layout`]; mapping (the `unsafe`): `map`; the writer:
//! [`export`]; the reader and its validation: [`read`]; `dpctl`'s tables and JSON: [`view`];
//! the Prometheus text format: [`prom`], served by [`http`] (`dpctl serve`).
//!
//! Segments are files `dataplane-stats.NAME.PID` (NAME: the pipeline's fabric) in
//! `/dev/shm`, or in `$DATAPLANE_STATS_DIR` if set (for both writer and reader), mode 0600.

pub mod export;
pub mod http;
pub mod layout;
mod map;
pub mod prom;
pub mod read;
pub mod view;

use std::path::PathBuf;

/// File name prefix of segments.
pub const PREFIX: &str = "dataplane-stats.";

/// Where segments live: `$DATAPLANE_STATS_DIR`, else `/dev/shm`.
pub fn stats_dir() -> PathBuf {
    std::env::var_os("DATAPLANE_STATS_DIR").filter(|d| !d.is_empty()).map_or("/dev/shm".into(), PathBuf::from)
}

/// The file name of the segment of pipeline `name` in process `pid` (characters other than
/// letters, digits, `-`, `_` and `.` become `_`).
pub fn file_name(name: &str, pid: u32) -> String {
    let safe: String =
        name.chars().map(|c| if c.is_ascii_alphanumeric() || "-_.".contains(c) { c } else { '_' }).collect();
    format!("{PREFIX}{safe}.{pid}")
}

/// The pid at the end of a segment's file name.
pub fn pid_of_file_name(file: &str) -> Option<u32> {
    file.strip_prefix(PREFIX)?.rsplit_once('.')?.1.parse().ok()
}

/// When process `pid` started, in clock ticks after boot (`/proc/PID/stat` field 22); `None`
/// if there is no such process, or it has exited and only waits to be reaped (a zombie: state
/// Z or X), which is as gone as a writer can be.
pub fn proc_start_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Field 2 (comm) is in parentheses and may contain anything: count after the last ')'.
    let mut rest = stat[stat.rfind(')')? + 1..].split_whitespace();
    if matches!(rest.next()?, "Z" | "X") {
        return None;
    }
    rest.nth(18)?.parse().ok()
}

/// Whether a segment's writer (`pid`, started at `start_ticks`) is still running: the pid
/// exists and started at that time (not a later process that reused the pid). A writer that
/// could not read its own start time (0) is judged by its pid alone.
pub fn writer_alive(pid: u64, start_ticks: u64) -> bool {
    let now = u32::try_from(pid).ok().and_then(proc_start_ticks);
    now.is_some_and(|t| t == start_ticks || start_ticks == 0)
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod unit {
    use super::*;

    #[test]
    fn file_names_carry_the_pid_and_only_safe_characters() {
        assert_eq!(file_name("echo-demo", 42), "dataplane-stats.echo-demo.42");
        assert_eq!(file_name("a/b c", 7), "dataplane-stats.a_b_c.7");
        assert_eq!(pid_of_file_name("dataplane-stats.x.y.123"), Some(123));
        assert_eq!(pid_of_file_name("dataplane.x.123"), None);
    }

    #[test]
    fn this_process_is_alive_and_a_wrong_start_time_is_not() {
        let me = std::process::id();
        let t = proc_start_ticks(me).expect("/proc/self/stat");
        assert!(writer_alive(me as u64, t));
        assert!(!writer_alive(me as u64, t + 1), "a reused pid is a different writer");
        assert!(!writer_alive(u64::MAX, t));
    }
}

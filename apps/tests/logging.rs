//! The binaries install a `tracing` subscriber: the library's warnings reach stderr by
//! default, `RUST_LOG` changes the level, and no ANSI escape codes go to a pipe.

use std::path::PathBuf;
use std::process::{Command, Output};

/// The huge-page fallback warning `dataplane::mem::region` logs once.
const HUGE_WARNING: &str = "huge pages not used";

/// Free 1 GiB huge pages; 0 when the kernel has none reserved or does not support the size.
fn free_1g_pages() -> u64 {
    std::fs::read_to_string("/sys/kernel/mm/hugepages/hugepages-1048576kB/free_hugepages")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// The machine's free 1 GiB huge pages, mapped and touched by this process until dropped.
struct HeldPages {
    ptr: *mut libc::c_void,
    len: usize,
}

impl HeldPages {
    fn take_all_1g() -> Option<HeldPages> {
        let n = free_1g_pages() as usize;
        if n == 0 {
            return None;
        }
        let len = n << 30;
        let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_HUGETLB | libc::MAP_POPULATE | (30 << 26);
        // SAFETY: FFI; an anonymous mapping at an address the kernel chooses, unmapped in drop.
        let ptr = unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, flags, -1, 0) };
        assert_ne!(
            ptr,
            libc::MAP_FAILED,
            "could not map the {n} free 1 GiB pages: {}",
            std::io::Error::last_os_error()
        );
        Some(HeldPages { ptr, len })
    }
}

impl Drop for HeldPages {
    fn drop(&mut self) {
        // SAFETY: FFI; the mapping made in `take_all_1g`, not used after this.
        unsafe { libc::munmap(self.ptr, self.len) };
    }
}

/// Runs the echo example for a moment with `hugepages = "prefer"` on 1 GiB pages, which makes
/// huge pages unavailable on any machine that reserved none of that size (1 GiB pages must be
/// reserved explicitly, at boot in practice), so the region falls back and warns.
/// Serializes the tests that hold the free 1 GiB pages.
static HOLDER: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn run_echo_without_huge_pages(tag: &str, rust_log: Option<&str>) -> Output {
    // CI reserves a 1 GiB page for the region tests: hold every free one while the child
    // runs, so that it finds none.
    // One test at a time holds the free 1 GiB pages: two threads taking "all free pages" at
    // once race (one maps them, the other finds them gone).
    let _one = HOLDER.lock().unwrap_or_else(|e| e.into_inner());
    let _held = HeldPages::take_all_1g();
    assert_eq!(
        free_1g_pages(),
        0,
        "this test needs a machine with no free 1 GiB huge pages, so that the fallback warning fires"
    );
    let examples = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../config/examples");
    let echo = std::fs::read_to_string(examples.join("echo.toml")).expect("read echo.toml");
    let dir = std::env::temp_dir().join(format!("dp-logging-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let file = dir.join("echo-1g.toml");
    std::fs::write(&file, format!("{echo}\n[memory]\nhugepages = \"prefer\"\npage_size = \"1G\"\n"))
        .expect("write config");
    let fabric = format!("test-logging-{tag}-{}", std::process::id());
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_dataplane"));
    cmd.args(["run", file.to_str().unwrap(), "--duration", "300ms", "--no-stats", "--fabric", &fabric]);
    cmd.env_remove("RUST_LOG");
    if let Some(level) = rust_log {
        cmd.env("RUST_LOG", level);
    }
    let out = cmd.output().expect("run dataplane");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        out.status.success(),
        "dataplane exited {:?}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

#[test]
fn huge_page_warning_reaches_stderr_without_ansi() {
    let out = run_echo_without_huge_pages("default", None);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let line = stderr.lines().find(|l| l.contains(HUGE_WARNING)).unwrap_or_else(|| {
        panic!("no huge-page warning on stderr:\n{stderr}");
    });
    assert!(line.contains("WARN"), "not logged at WARN level: {line}");
    assert!(line.contains("nr_hugepages"), "the warning lost its fix: {line}");
    assert!(!stderr.contains('\u{1b}'), "ANSI escape codes on a pipe: {stderr:?}");
    assert!(!String::from_utf8_lossy(&out.stdout).contains(HUGE_WARNING), "warning went to stdout");
}

#[test]
fn rust_log_changes_the_level() {
    let out = run_echo_without_huge_pages("error", Some("error"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains(HUGE_WARNING), "RUST_LOG=error still shows warnings:\n{stderr}");
}

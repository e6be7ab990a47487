//! Attaching to a fabric file whose header and tables hold arbitrary bytes, then using it
//! (PD, CQ, QP, SRQ, MR, async events) and detaching: errors are fine, a panic, SIGBUS, SIGSEGV
//! or a hang is not.
//!
//! The input patches a real fabric file (see `patch.rs`), made once by this process, and is
//! written as a sparse file (only the pages that are not zero). Four
//! header words are put back after patching: `magic` and `dead` (otherwise the attach waits
//! 5 s for a creator that never finishes, which is its documented behaviour), and `version`,
//! `size` (refused with an error before anything else is read; unit tests cover those). The
//! lock word is cleared: a live pid there is waited out for `LOCK_PATIENCE` (5 s), which
//! `dataplane/src/shm/fabric.rs`'s tests cover.
#![no_main]

mod patch;

use dataplane::mem::HugePolicy;
use dataplane::shm::{Shm, ShmConfig};
use dataplane::verbs::{AccessFlags, QpCaps, QpType, SrqAttr};
use dataplane::{Context, Pd, Provider, QpInitAttr};
use libfuzzer_sys::fuzz_target;
use std::cell::RefCell;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

const FABRIC_SIZE: usize = 8 << 20;

/// Byte ranges of the header's words (see `dataplane/src/shm/layout.rs`).
const MAGIC: std::ops::Range<usize> = 0..8;
const VERSION_DEAD: std::ops::Range<usize> = 8..16;
const SIZE: std::ops::Range<usize> = 16..24;
const LOCK: std::ops::Range<usize> = 32..36;
const ARENA_START: std::ops::Range<usize> = 48..56;

/// A fresh fabric's bytes, with this process attached as context 0.
fn template() -> &'static Vec<u8> {
    static T: OnceLock<Vec<u8>> = OnceLock::new();
    T.get_or_init(|| {
        let name = format!("fuzz-template-{}", std::process::id());
        let ctx = Shm::open(&cfg(&name)).expect("template fabric");
        let bytes = std::fs::read(format!("/dev/shm/dataplane.{name}")).expect("read the template fabric");
        drop(ctx);
        let _ = std::fs::remove_file(format!("/dev/shm/dataplane.{name}"));
        bytes
    })
}

fn cfg(name: &str) -> ShmConfig {
    ShmConfig { fabric: name.into(), size: FABRIC_SIZE, huge: HugePolicy::Never }
}

/// Bytes per page of the file written for an input.
const PAGE: usize = 4096;

/// The template's pages that hold a non-zero byte. An input's file is written sparse: these
/// pages and the pages its patches touched, the rest left as holes (which read as zeros, as
/// they are in the template). Writing all 8 MiB per input held the target to ~100 inputs/s.
fn template_pages() -> &'static Vec<usize> {
    static P: OnceLock<Vec<usize>> = OnceLock::new();
    P.get_or_init(|| {
        let t = template();
        (0..t.len() / PAGE).filter(|&p| t[p * PAGE..(p + 1) * PAGE].iter().any(|&b| b != 0)).collect()
    })
}

thread_local! {
    /// The patchable prefix of the template, patched in place per input and put back after.
    static PREFIX: RefCell<Vec<u8>> = RefCell::new(Vec::new());
}

fuzz_target!(|data: &[u8]| {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let t = template();
    // The tables and the first rings of the arena (context 0's event ring).
    let arena = u64::from_le_bytes(t[ARENA_START].try_into().unwrap()) as usize;
    let span = arena + (64 << 10);
    PREFIX.with_borrow_mut(|b| {
        if b.is_empty() {
            b.extend_from_slice(&t[..span]);
        }
        let mut touched: Vec<usize> = template_pages().clone();
        for (at, bytes) in patch::patches(span, data) {
            b[at..at + bytes.len()].copy_from_slice(bytes);
            touched.extend(at / PAGE..(at + bytes.len()).div_ceil(PAGE));
        }
        for r in [MAGIC, VERSION_DEAD, SIZE] {
            b[r.clone()].copy_from_slice(&t[r]);
        }
        b[LOCK].fill(0);
        touched.sort_unstable();
        touched.dedup();

        let name = format!("fuzz-{}-{}", std::process::id(), SEQ.fetch_add(1, Ordering::Relaxed));
        let path = format!("/dev/shm/dataplane.{name}");
        write_sparse(&path, t, b, &touched);
        if let Ok(ctx) = Shm::open(&cfg(&name)) {
            exercise(&ctx);
        }
        let _ = std::fs::remove_file(&path);
        for &p in &touched {
            let r = p * PAGE..((p + 1) * PAGE).min(span);
            if r.start < span {
                b[r.clone()].copy_from_slice(&t[r]);
            }
        }
    });
});

/// Writes a fabric file of the template's length holding `pages`, taken from `prefix` where
/// it covers them and from the template after it.
fn write_sparse(path: &str, t: &[u8], prefix: &[u8], pages: &[usize]) {
    let f = std::fs::File::create(path).expect("create the input fabric");
    f.set_len(t.len() as u64).expect("size the input fabric");
    for &p in pages {
        let r = p * PAGE..(p + 1) * PAGE;
        let bytes = if r.end <= prefix.len() { &prefix[r.clone()] } else { &t[r.clone()] };
        f.write_all_at(bytes, r.start as u64).expect("write the input fabric");
    }
}

/// Creates and drops one of each object on the attached fabric.
fn exercise(ctx: &<Shm as Provider>::Context) {
    let _ = ctx.poll_async_event();
    let Ok(pd) = ctx.alloc_pd() else { return };
    let Ok(cq) = ctx.create_cq(16) else { return };
    let cap = QpCaps { max_send_wr: 8, max_recv_wr: 8, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 0 };
    let qp =
        pd.create_qp(&QpInitAttr { send_cq: &cq, recv_cq: &cq, srq: None, cap, qp_type: QpType::Rc, sq_sig_all: true });
    let srq = pd.create_srq(&SrqAttr { max_wr: 8, max_sge: 1, srq_limit: 0 });
    if let Ok(region) = ctx.alloc_region(4096) {
        let _ = pd.reg_mr(&region, 0, 4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE);
    }
    drop((qp, srq));
    let _ = ctx.poll_async_event();
}

//! `dp-perf`: perftest-class benchmarks (`send|write|read|atomic` × `bw|lat`) on dataplane's
//! providers, with perftest's flags, columns and JSON keys. For now both ends run in one
//! command (`--loopback`: server thread on `--peer-core`, client on `--core`) on `shm`.

mod args;
mod bw;
mod lat;
mod report;
mod setup;

use clap::Parser;
use std::sync::atomic::{AtomicBool, Ordering};

/// Prints `what: err` and exits 1.
pub fn fail(what: &str, err: impl std::fmt::Display) -> ! {
    eprintln!("dp-perf: {what}: {err}");
    std::process::exit(1)
}

fn pin(core: i64, who: &str) {
    if core >= 0 && !core_affinity::set_for_current(core_affinity::CoreId { id: core as usize }) {
        let n = std::thread::available_parallelism().map_or(1, |n| n.get());
        fail(who, format!("cannot pin to core {core} (this machine has {n} cores)"));
    }
}

fn main() {
    let mut args = args::Args::parse();
    tracing_subscriber::fmt().with_writer(std::io::stderr).init();
    if let Err(e) = args.check() {
        fail("arguments", e);
    }
    report::header(&args);
    if let Some(p) = &args.histogram {
        let _ = std::fs::remove_file(p);
    }
    for size in args.sizes() {
        let (mut client, mut server) = setup::pair(&args, size).unwrap_or_else(|e| fail("setup", e));
        let stop = AtomicBool::new(false);
        let test = args.test;
        let (to_client, to_server) = (setup::Remote::of(&client), setup::Remote::of(&server));
        std::thread::scope(|sc| {
            let (a, st, c) = (&args, &stop, &to_client);
            let srv = &mut server;
            sc.spawn(move || {
                pin(a.peer_core, "--peer-core");
                match test {
                    args::Test::send_bw => {
                        bw::serve_recv(srv, a, st);
                    }
                    t if t.is_lat() => lat::serve(t, a, size, srv, c, st),
                    _ => {
                        while !st.load(Ordering::Acquire) {
                            std::hint::spin_loop();
                        }
                    }
                }
            });
            pin(args.core, "--core");
            if test.is_lat() {
                let h = lat::run_client(test, &args, size, &mut client, &to_server, &stop);
                stop.store(true, Ordering::Release);
                report::lat(&args, size, &h);
                if let Some(p) = &args.histogram {
                    report::write_histogram(p, size, &h).unwrap_or_else(|e| fail("--histogram", e));
                }
            } else {
                let r = bw::run_client(test, &args, size, &mut client, &to_server);
                stop.store(true, Ordering::Release);
                report::bw(&args, size, &r);
            }
        });
    }
}

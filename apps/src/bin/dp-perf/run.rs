//! The three ways to run a test, generic over the provider: both ends in this process
//! (`--loopback`: two pinned threads), the server (waits for a client on the TCP port), the
//! client (connects to the server, measures, and sends its results to the server).

use crate::args::{Args, Mode, Test};
use crate::bw::{self, Bw};
use crate::ctl::{Ctl, SETUP_TIMEOUT};
use crate::live::{Live, Shared};
use crate::report::{self, Info, Lat, Report};
use crate::setup::{shm_fabric, slot_count, slot_len, slots_mem, Backend, End, Remote};
use crate::{lat, params};
use dataplane::{Context, Provider};
use hdrhistogram::Histogram;
use std::io::ErrorKind;
use std::net::TcpListener;
use std::time::Duration;

/// What the client measured for one size.
enum Outcome {
    Bw(Bw),
    Lat(Histogram<u64>),
}

type Res<T> = Result<T, String>;

fn err(what: &str) -> impl Fn(dataplane::verbs::Error) -> String + '_ {
    move |e| format!("{what}: {e}")
}

/// Runs `args` on provider `P`.
pub fn run<P: Backend>(mut args: Args) -> Res<()> {
    match args.mode() {
        Mode::Loopback => loopback::<P>(&args),
        Mode::Client => client::<P>(&args),
        Mode::Server => server::<P>(&mut args),
    }
}

/// Bytes one end registers for the largest of `sizes`.
fn max_mem(args: &Args, sizes: &[u64]) -> Res<u64> {
    let mut max = 0;
    for &size in sizes {
        let slot = slot_len(size)?;
        max = max.max(slots_mem(slot, slot_count(args, slot))?);
    }
    Ok(max)
}

fn open<P: Backend>(args: &Args, mem: u64) -> Res<P::Context> {
    P::open_dev(args, mem).map_err(|e| format!("{}: opening the device: {e}", P::NAME))
}

/// Opens the device once, sized for the sizes to run (which depend on the MTU with UD).
fn open_sized<P: Backend>(args: &Args) -> Res<(P::Context, Vec<u64>)> {
    let sizes_for = |mtu| args.sizes(report::ud_max(args.conn, mtu));
    match P::KNOWN_MTU {
        Some(mtu) => {
            let sizes = sizes_for(mtu)?;
            Ok((open::<P>(args, max_mem(args, &sizes)?)?, sizes))
        }
        None => {
            let ctx = open::<P>(args, 0)?; // its memory comes later, per size
            let mtu = ctx.port_attr(args.ib_port).map_err(err("port"))?.active_mtu;
            Ok((ctx, sizes_for(mtu)?))
        }
    }
}

/// The facts for the header, and the inline threshold in effect.
fn info<P: Backend>(args: &Args, ctx: &P::Context) -> Res<Info> {
    let port = ctx.port_attr(args.ib_port).map_err(err("port"))?;
    let caps = ctx.caps();
    if args.test.is_atomic() && !caps.atomics {
        return Err(format!("{:?}: device {} does not support atomics", args.test, P::dev_name(ctx)));
    }
    if args.inline.is_some_and(|i| i > caps.max_inline_data) {
        return Err(format!(
            "-I {}: device {} sends at most {} bytes inline",
            args.inline.unwrap_or(0),
            P::dev_name(ctx),
            caps.max_inline_data
        ));
    }
    let link = match (P::NAME, port.lid) {
        ("shm", _) => "shm",
        (_, 0) => "Ethernet",
        _ => "IB",
    };
    Ok(Info {
        device: P::dev_name(ctx),
        provider: P::NAME,
        link,
        mtu: port.active_mtu,
        inline: args.inline_size(caps.max_inline_data),
        out_reads: caps.max_qp_rd_atom.clamp(1, 16),
    })
}

fn pin(core: Option<usize>, flag: &str) -> Res<()> {
    if let Some(c) = core {
        if !core_affinity::set_for_current(core_affinity::CoreId { id: c }) {
            let n = std::thread::available_parallelism().map_or(1, |n| n.get());
            return Err(format!("{flag}: cannot pin to core {c} (this machine has {n} cores)"));
        }
    }
    Ok(())
}

fn peer_timeout(args: &Args) -> Duration {
    Duration::from_secs_f64(args.peer_timeout)
}

/// Receives the side must post before the other may send.
fn prepare<P: Provider>(test: Test, e: &mut End<P>, args: &Args, server: bool) -> Res<()> {
    match test {
        Test::send_bw if server || args.bidirectional => bw::post_initial_recvs(e, args),
        Test::send_lat => lat::post_initial_recvs(e, args),
        _ => Ok(()),
    }
}

/// The server's part of one size; returns how many messages it received (send_bw).
fn serve<P: Provider>(args: &Args, size: u64, inline: u32, s: &mut End<P>, c: &Remote, sh: &Shared) -> Res<u64> {
    let mut live = Live::until_stop(sh, "server");
    match args.test {
        Test::send_bw => bw::serve_recv(s, &mut live),
        Test::send_lat | Test::write_lat => lat::serve(args.test, args, size, inline, s, c, &mut live).map(|()| 0),
        _ => {
            // One-sided: nothing to do but wait for the end, without spinning a core.
            while !live.idle()? {
                std::thread::sleep(Duration::from_micros(200));
            }
            Ok(0)
        }
    }
}

/// How long the client waits without any completion before it gives up: `--peer-timeout`
/// plus the time the bytes between two completions take at 1 MB/s (a floor for slow links such
/// as emulated Soft-RoCE), so only a lost message or a stuck peer reaches it.
fn progress_timeout(args: &Args, size: u64) -> Duration {
    let per_completion = if args.test.is_lat() {
        2 * size
    } else {
        size.saturating_mul(args.cq_mod as u64).saturating_mul(args.qps as u64)
    };
    peer_timeout(args) + Duration::from_secs_f64(per_completion as f64 / 1e6)
}

/// The client's part of one size.
fn measure<P: Provider>(args: &Args, size: u64, inline: u32, c: &mut End<P>, s: &Remote, sh: &Shared) -> Res<Outcome> {
    if args.test.is_lat() {
        let mut live = Live::with_timeout(sh, progress_timeout(args, size), "waiting for a reply or completion");
        lat::run_client(args.test, args, size, inline, c, s, &mut live).map(Outcome::Lat)
    } else {
        measure_bw(args, size, inline, c, s, sh, false).map(Outcome::Bw)
    }
}

/// A bandwidth test's sending end (the client's, and with -b the server's too, receiving
/// the other direction as it sends; `hold`: its sends wait for the peer's first message, as a
/// server process's must).
fn measure_bw<P: Provider>(
    args: &Args,
    size: u64,
    inline: u32,
    c: &mut End<P>,
    s: &Remote,
    sh: &Shared,
    hold: bool,
) -> Res<Bw> {
    let mut live = Live::with_timeout(sh, progress_timeout(args, size), "waiting for send completions");
    let mut rx = args.bidirectional.then(|| {
        let mut r = bw::Receiver::new(c);
        r.hold_sends = hold;
        r
    });
    bw::run_client(args, size, inline, c, s, &mut live, rx.as_mut())
}

fn print(args: &Args, rep: &mut Report, size: u64, o: &Outcome) -> Res<()> {
    let r = match o {
        Outcome::Bw(b) => rep.bw(args, size, b),
        Outcome::Lat(h) => {
            if let Some(p) = &args.histogram {
                report::write_histogram(p, size, h).map_err(|e| format!("--histogram {}: {e}", p.display()))?;
            }
            rep.lat(args, size, &Lat::of(h))
        }
    };
    r.map_err(|e| format!("writing the results: {e}"))
}

fn new_report(args: &Args, info: Info) -> Res<Report> {
    Report::new(args, info).map_err(|e| format!("--out_json_file: {e}"))
}

fn loopback<P: Backend>(args: &Args) -> Res<()> {
    let (cctx, sizes) = open_sized::<P>(args)?;
    let sctx = open::<P>(args, max_mem(args, &sizes)?)?;
    let info = info::<P>(args, &cctx)?;
    let inline = info.inline;
    let mut rep = new_report(args, info)?;
    if let Some(p) = &args.histogram {
        let _ = std::fs::remove_file(p);
    }
    for size in sizes {
        let mut c = End::<P>::open(&cctx, args, size, inline, false).map_err(err("client setup"))?;
        let mut s = End::<P>::open(&sctx, args, size, inline, true).map_err(err("server setup"))?;
        let (ec, es) = (
            c.endpoints(args.gid_index).map_err(err("endpoint"))?,
            s.endpoints(args.gid_index).map_err(err("endpoint"))?,
        );
        s.connect(args, &ec).map_err(err("server connect"))?;
        c.connect(args, &es).map_err(err("client connect"))?;
        let (to_c, to_s) = (
            Remote::new(&c.mem(), c.slot)?.with_srqn(s.peer_srqn),
            Remote::new(&s.mem(), s.slot)?.with_srqn(c.peer_srqn),
        );
        prepare(args.test, &mut s, args, true)?;
        prepare(args.test, &mut c, args, false)?;
        let sh = Shared::default();
        let outcome = std::thread::scope(|sc| {
            let (sh, srv) = (&sh, &mut s);
            let server = args.test.server_active().then(|| {
                sc.spawn(move || {
                    pin(args.peer_core.try_into().ok(), "--peer-core")?;
                    let r = if args.bidirectional {
                        // -b: the server end measures its own direction as the client does.
                        measure_bw(args, size, inline, srv, &to_c, sh, false).map(Some)
                    } else {
                        serve(args, size, inline, srv, &to_c, sh).map(|_| None)
                    };
                    if let Err(why) = &r {
                        sh.kill(format!("the server thread failed: {why}")); // the client must not wait for it
                    }
                    r
                })
            });
            let client = sc.spawn(|| {
                pin(args.my_core(), "--core")?;
                let o = measure(args, size, inline, &mut c, &to_s, sh);
                sh.stop();
                o
            });
            let o = client.join().map_err(|_| "the client thread panicked".to_owned());
            sh.stop(); // also when the client panicked: the server must not wait forever
            let theirs = match server {
                Some(t) => t.join().map_err(|_| "the server thread panicked".to_owned())??,
                None => None,
            };
            match (o??, theirs) {
                (Outcome::Bw(mine), Some(theirs)) => Ok::<_, String>(Outcome::Bw(mine.both_ways(&theirs))),
                (o, _) => Ok(o),
            }
        })?;
        print(args, &mut rep, size, &outcome)?;
    }
    Ok(())
}

fn client<P: Backend>(args: &Args) -> Res<()> {
    let host = args.server.as_deref().unwrap_or("localhost");
    let (ctx, sizes) = open_sized::<P>(args)?;
    let info = info::<P>(args, &ctx)?;
    let inline = info.inline;
    let s = dataplane::conn::connect_retry(host, args.tcp_port, peer_timeout(args)).map_err(|e| e.to_string())?;
    let mut ctl = Ctl::new(s)?;
    ctl.send(&params::to_wire(args, &sizes, &shm_fabric(args)))?;
    ctl.expect("ok", SETUP_TIMEOUT)?;
    let mut rep = new_report(args, info)?;
    if let Some(p) = &args.histogram {
        let _ = std::fs::remove_file(p);
    }
    for size in sizes {
        let r = client_size::<P>(args, &ctx, &mut ctl, size, inline);
        let o = r.inspect_err(|e| ctl.send_error(e))?;
        print(args, &mut rep, size, &o)?;
    }
    ctl.send("bye")
}

fn client_size<P: Backend>(args: &Args, ctx: &P::Context, ctl: &mut Ctl, size: u64, inline: u32) -> Res<Outcome> {
    let mut c = End::<P>::open(ctx, args, size, inline, false).map_err(err("setup"))?;
    prepare(args.test, &mut c, args, false)?;
    ctl.send(&format!("size {size} qps {}", c.qps.len()))?;
    ctl.send_addrs(&c.endpoints(args.gid_index).map_err(err("endpoint"))?, &c.mem())?;
    ctl.expect("ready", SETUP_TIMEOUT)?;
    let (eps, mem) = ctl.recv_addrs(c.wire_len())?;
    c.connect(args, &eps).map_err(err("connect"))?;
    let to_s = Remote::new(&mem, c.slot)?.with_srqn(c.peer_srqn);
    let sh = Shared::default();
    let (o, theirs) = std::thread::scope(|sc| {
        let t = sc.spawn(|| {
            pin(args.my_core(), "--core")?;
            measure(args, size, inline, &mut c, &to_s, &sh)
        });
        let early = ctl.watch(&sh, &t, peer_timeout(args))?;
        let o = t.join().map_err(|_| "the test thread panicked".to_owned())??;
        let mine = match &o {
            Outcome::Bw(b) => format!("bw {}", b.to_wire()),
            Outcome::Lat(h) => format!("lat {}", Lat::of(h).to_wire()),
        };
        Ok::<_, String>((o, ctl.finish(&sh, &mine, early, peer_timeout(args))?))
    })?;
    if let (Test::send_bw, Outcome::Bw(b)) = (args.test, &o) {
        if args.bidirectional {
            // -b: the server sent its own direction's result; the report is the sum.
            let server = theirs.strip_prefix("bw ").and_then(Bw::from_wire);
            let server = server.ok_or_else(|| format!("the server sent unreadable -b results: {theirs:?}"))?;
            return Ok(Outcome::Bw(b.both_ways(&server)));
        }
        if theirs.parse::<u64>().is_ok_and(|got| got < b.ops) {
            eprintln!("dp-perf: the server received {theirs} of {} messages (UD/UC drop what finds no receive)", b.ops);
        }
    }
    Ok(o)
}

fn server<P: Backend>(args: &mut Args) -> Res<()> {
    let l = TcpListener::bind(("0.0.0.0", args.tcp_port))
        .map_err(|e| format!("cannot listen on TCP port {}: {e}", args.tcp_port))?;
    // Polled, not a blocking accept: std's accept retries EINTR, so a blocked server never
    // saw the signal handler's flag and SIGINT or SIGTERM left it waiting.
    l.set_nonblocking(true).map_err(|e| format!("cannot listen on TCP port {}: {e}", args.tcp_port))?;
    eprintln!("dp-perf: waiting for a client on TCP port {} ({})", args.tcp_port, P::NAME);
    let s = loop {
        match l.accept() {
            Ok((s, _)) => break s,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => {
                if dataplane_apps::signals::stopped() {
                    return Err("stopped by SIGINT or SIGTERM while waiting for a client".to_owned());
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => return Err(format!("accepting a client: {e}")),
        }
    };
    s.set_nonblocking(false).map_err(|e| format!("accepting a client: {e}"))?;
    drop(l);
    let mut ctl = Ctl::new(s)?;
    let r = server_run::<P>(args, &mut ctl);
    r.inspect_err(|e| ctl.send_error(e))
}

fn server_run<P: Backend>(args: &mut Args, ctl: &mut Ctl) -> Res<()> {
    let line = ctl.recv(SETUP_TIMEOUT).map_err(|e| format!("parameter line: {e}"))?;
    params::adopt(args, &line).map_err(|e| format!("parameters: {e}"))?;
    let sizes = args.sizes(u64::MAX)?;
    let ctx = open::<P>(args, max_mem(args, &sizes)?)?;
    let info = info::<P>(args, &ctx)?;
    let inline = info.inline;
    ctl.send("ok")?;
    let mut rep = new_report(args, info)?;
    let args = &*args;
    for size in sizes {
        let rest = ctl.expect("size", SETUP_TIMEOUT)?;
        if rest != format!("{size} qps {}", args.qps) {
            return Err(format!("the client announced size {rest:?}, expected {size} qps {}", args.qps));
        }
        let mut s = End::<P>::open(&ctx, args, size, inline, true).map_err(err("setup"))?;
        let (eps, mem) = ctl.recv_addrs(s.wire_len())?;
        s.connect(args, &eps).map_err(err("connect"))?;
        let to_c = Remote::new(&mem, s.slot)?.with_srqn(s.peer_srqn);
        prepare(args.test, &mut s, args, true)?;
        ctl.send("ready")?;
        ctl.send_addrs(&s.endpoints(args.gid_index).map_err(err("endpoint"))?, &s.mem())?;
        let sh = Shared::default();
        let (theirs, mine) = std::thread::scope(|sc| {
            let t = sc.spawn(|| {
                pin(args.my_core(), "--core")?;
                if args.bidirectional {
                    // -b: this end measures its own direction too, its sends held until the
                    // client's first message shows the client's QP connected.
                    let b = measure_bw(args, size, inline, &mut s, &to_c, &sh, true)?;
                    Ok((format!("bw {}", b.to_wire()), Some(b)))
                } else {
                    serve(args, size, inline, &mut s, &to_c, &sh).map(|got| (got.to_string(), None))
                }
            });
            let early = ctl.watch(&sh, &t, peer_timeout(args))?;
            let (line, mine) = t.join().map_err(|_| "the test thread panicked".to_owned())??;
            Ok::<_, String>((ctl.finish(&sh, &line, early, peer_timeout(args))?, mine))
        })?;
        let bad = || format!("the client sent unreadable results: {theirs:?}");
        let r = match theirs.split_once(' ') {
            Some(("bw", b)) => {
                let client = Bw::from_wire(b).ok_or_else(bad)?;
                rep.bw(args, size, &mine.map_or(client, |m| client.both_ways(&m)))
            }
            Some(("lat", l)) => rep.lat(args, size, &Lat::from_wire(l).ok_or_else(bad)?),
            _ => return Err(bad()),
        };
        r.map_err(|e| format!("writing the results: {e}"))?;
    }
    ctl.expect("bye", SETUP_TIMEOUT).map(|_| ())
}

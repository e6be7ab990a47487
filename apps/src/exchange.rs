//! Remote peers: the out-of-band exchange of QP endpoints with another process over TCP
//! ([`dataplane::conn`], the message format of rdma-core's `ibv_rc_pingpong`).
//!
//! Who listens: a QP with `listen = "host:port"` waits for one connection on that address; a
//! QP with `peer = "host:port"` connects to it, retrying for [`CONNECT_WITHIN`]. QPs of one
//! process that listen on (or connect to) the same address share one TCP connection: their
//! endpoints go in file order, one message each (`*_exchange_on`, as `ibv_srq_pingpong` does
//! for its QPs), and the i-th QP of one side pairs with the i-th of the other.
//!
//! Order on each connection: the client sends its endpoints; the listening side reads them,
//! brings its QPs up (RC to RTS; UD gets its address handle) and answers with its own; the
//! client brings its QPs up and sends `done`. Once `done` has passed, both sides can receive,
//! whoever sends first. Every connection is handled on its own thread, so two processes that
//! each listen for the other and connect to the other cannot deadlock.
//!
//! The connections stay open while the pipeline runs: when the remote process ends (or dies),
//! its side closes, and [`Links::closed`] tells the runner, which then stops too.

use dataplane::conn;
use dataplane::verbs::{AhAttr, Endpoint, Errno};
use dataplane::worker::{PeerAddr, Worker};
use dataplane::Provider;
use dataplane_config::{Config, Peer};
use std::collections::HashMap;
use std::io::ErrorKind;
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a QP with a remote `peer` keeps trying to reach the listening side.
pub const CONNECT_WITHIN: Duration = Duration::from_secs(30);
/// How long one read or write of the exchange may wait once connected.
const IO_TIMEOUT: Duration = Duration::from_secs(30);
/// Pause between connection attempts and between polls of a listener.
const RETRY_EVERY: Duration = Duration::from_millis(100);

/// The local port a pipeline's QPs use, and the GID index of their routes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route {
    /// Port number (1 on `shm`).
    pub port: u8,
    /// GID index (0 on `shm`, whose port has one GID).
    pub gid_index: u8,
}

impl Route {
    /// The address of the QP at `ep`: its QPN and PSN, and a route to its port (global when it
    /// has a GID, as RoCE needs; hop limit 64 so routed RoCE v2 works too).
    pub fn to(&self, ep: &Endpoint) -> PeerAddr {
        let global = ep.gid != [0; 16];
        PeerAddr {
            qpn: ep.qpn,
            psn: ep.psn,
            ah: AhAttr {
                dlid: ep.lid,
                is_global: global,
                dgid: ep.gid,
                sgid_index: self.gid_index,
                hop_limit: if global { 64 } else { 0 },
                sl: 0,
                port_num: self.port,
            },
        }
    }
}

/// Which side of a connection this process is.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Side {
    Listen,
    Connect,
}

/// The QPs of this process that share one connection.
#[derive(Debug, Clone)]
struct Group {
    side: Side,
    host: String,
    port: u16,
    /// QP names, in file order.
    qps: Vec<String>,
    /// Their endpoints, same order.
    locals: Vec<Endpoint>,
}

impl Group {
    fn addr(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    fn names(&self) -> String {
        self.qps.join(", ")
    }
}

/// The open connections to remote peers, kept for the run.
#[derive(Debug, Default)]
pub struct Links {
    conns: Vec<(String, TcpStream)>,
}

impl Links {
    /// Whether the pipeline has remote peers.
    pub fn is_empty(&self) -> bool {
        self.conns.is_empty()
    }

    /// The address of a connection whose remote side closed it (its process ended), if any.
    /// Does not block (the streams are non-blocking); called by the runner's control loop.
    pub fn closed(&self) -> Option<&str> {
        let mut b = [0u8; 1];
        self.conns.iter().find_map(|(addr, s)| match s.peek(&mut b) {
            Ok(0) => Some(addr.as_str()),
            Ok(_) => None,
            Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::Interrupted => None,
            Err(_) => Some(addr.as_str()),
        })
    }
}

/// Groups the QPs with a `listen` address or a remote `peer` by address, in file order.
fn plan(cfg: &Config) -> Vec<Group> {
    let mut groups: Vec<Group> = Vec::new();
    for q in &cfg.qps {
        let (side, host, port) = if let Some((host, port)) = q.listen_addr() {
            (Side::Listen, host, port)
        } else if let Some(Peer::Remote { host, port }) = q.peer() {
            (Side::Connect, host, port)
        } else {
            continue;
        };
        match groups.iter_mut().find(|g| g.side == side && g.host == host && g.port == port) {
            Some(g) => g.qps.push(q.name.as_str().to_owned()),
            None => groups.push(Group {
                side,
                host: host.to_owned(),
                port,
                qps: vec![q.name.as_str().to_owned()],
                locals: Vec::new(),
            }),
        }
    }
    groups
}

/// Exchanges endpoints with every remote peer of `cfg` and connects the QPs (`qps`: name →
/// (worker index, QP index)), then returns the open connections. Listening waits until the
/// other side comes (or Ctrl-C, `interrupt`); connecting gives up after [`CONNECT_WITHIN`].
pub fn connect_remote<P: Provider>(
    cfg: &Config,
    pd: &P::Pd,
    workers: &mut [Worker<P>],
    qps: &HashMap<String, (usize, usize)>,
    route: Route,
    interrupt: &AtomicBool,
) -> Result<Links, String>
where
    Worker<P>: Send,
    P::Pd: Sync,
{
    let mut groups = plan(cfg);
    if groups.is_empty() {
        return Ok(Links::default());
    }
    for g in &mut groups {
        for name in &g.qps {
            let &(w, i) = qps.get(name).ok_or_else(|| format!("qp {name}: not created"))?;
            let ep = workers[w].endpoint(i, route.gid_index).map_err(|e| format!("qp {name}: endpoint: {e}"))?;
            g.locals.push(ep);
        }
    }
    // Bind every listener first: an address in use is reported at once, before any wait.
    let mut listeners = Vec::new();
    for g in groups.iter().filter(|g| g.side == Side::Listen) {
        let l = bind(g)?;
        eprintln!("dataplane: qp {}: waiting for the remote peer on {}", g.names(), g.addr());
        listeners.push(Some(l));
    }
    let workers = Mutex::new(workers);
    let connect = |g: &Group, remotes: &[Endpoint]| -> dataplane::verbs::Result<()> {
        let mut ws =
            workers.lock().map_err(|_| dataplane::verbs::Error::new(Errno::EIO, "a worker lock is poisoned"))?;
        for (name, r) in g.qps.iter().zip(remotes) {
            let (w, i) = qps[name];
            ws[w].connect_to(pd, i, &route.to(r)).map_err(|e| {
                dataplane::verbs::Error::new(
                    e.errno,
                    format!("qp {name}: connecting to the remote QP {:#x}: {e}", r.qpn),
                )
            })?;
        }
        Ok(())
    };
    let abort = AtomicBool::new(false);
    let results: Vec<Result<(String, TcpStream), String>> = std::thread::scope(|s| {
        let mut li = listeners.iter_mut();
        let handles: Vec<_> = groups
            .iter()
            .map(|g| {
                let listener = if g.side == Side::Listen { li.next().and_then(Option::take) } else { None };
                let (connect, abort) = (&connect, &abort);
                s.spawn(move || {
                    let r = one(g, listener, connect, interrupt, abort);
                    if r.is_err() {
                        abort.store(true, Ordering::Release);
                    }
                    r
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err("an exchange thread panicked".into()))).collect()
    });
    let mut links = Links::default();
    let mut errors = Vec::new();
    for r in results {
        match r {
            Ok(c) => links.conns.push(c),
            Err(e) => errors.push(e),
        }
    }
    if errors.is_empty() {
        Ok(links)
    } else {
        Err(errors.join("\n"))
    }
}

fn bind(g: &Group) -> Result<TcpListener, String> {
    let addrs: Vec<_> = (g.host.as_str(), g.port)
        .to_socket_addrs()
        .map_err(|e| format!("qp {}: cannot resolve listen address {}: {e}", g.names(), g.addr()))?
        .collect();
    let l =
        TcpListener::bind(&addrs[..]).map_err(|e| format!("qp {}: cannot listen on {}: {e}", g.names(), g.addr()))?;
    l.set_nonblocking(true).map_err(|e| format!("qp {}: listener: {e}", g.names()))?;
    Ok(l)
}

/// One connection: accept or connect, exchange, connect the QPs; returns the open stream.
fn one(
    g: &Group,
    listener: Option<TcpListener>,
    connect: &(dyn Fn(&Group, &[Endpoint]) -> dataplane::verbs::Result<()> + Sync),
    interrupt: &AtomicBool,
    abort: &AtomicBool,
) -> Result<(String, TcpStream), String> {
    let stopped = || interrupt.load(Ordering::Relaxed) || abort.load(Ordering::Acquire);
    let who =
        format!("qp {} ({} {})", g.names(), if g.side == Side::Listen { "listening on" } else { "peer" }, g.addr());
    let mut s = match listener {
        Some(l) => loop {
            match l.accept() {
                Ok((s, _)) => break s,
                Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::Interrupted => {
                    if stopped() {
                        return Err(format!("{who}: stopped while waiting for the remote peer"));
                    }
                    std::thread::sleep(RETRY_EVERY);
                }
                Err(e) => return Err(format!("{who}: accept: {e}")),
            }
        },
        None => {
            let start = Instant::now();
            loop {
                match conn::connect_stream(&g.host, g.port) {
                    Ok(s) => break s,
                    Err(e) if e.errno == Errno::EINVAL => return Err(format!("{who}: {e}")),
                    Err(e) if start.elapsed() >= CONNECT_WITHIN => {
                        return Err(format!(
                            "{who}: the remote peer did not answer within {} s ({e}); start the other side, whose qp has listen = \"...:{}\"",
                            CONNECT_WITHIN.as_secs(),
                            g.port
                        ))
                    }
                    Err(_) if stopped() => return Err(format!("{who}: stopped while connecting")),
                    Err(_) => std::thread::sleep(RETRY_EVERY),
                }
            }
        }
    };
    let io = |e: std::io::Error| format!("{who}: {e}");
    s.set_nonblocking(false).map_err(io)?;
    s.set_read_timeout(Some(IO_TIMEOUT)).map_err(io)?;
    s.set_write_timeout(Some(IO_TIMEOUT)).map_err(io)?;
    s.set_nodelay(true).map_err(io)?;
    let up = |r: &[Endpoint]| connect(g, r);
    let exchanged = match g.side {
        Side::Listen => conn::server_exchange_on(&mut s, &g.locals, up),
        Side::Connect => conn::client_exchange_on(&mut s, &g.locals, up),
    };
    exchanged.map_err(|e| {
        let waited = if e.errno == Errno::EAGAIN {
            format!(" (nothing arrived for {} s)", IO_TIMEOUT.as_secs())
        } else {
            String::new()
        };
        let hint = if e.errno == Errno::EAGAIN || e.msg.contains("closed early") {
            format!(
                "{waited}; do both sides list the same number of QPs for this address (this side: {})?",
                g.qps.len()
            )
        } else {
            String::new()
        };
        format!("{who}: exchange: {e}{hint}")
    })?;
    s.set_nonblocking(true).map_err(io)?;
    Ok((g.addr(), s))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qps_sharing_an_address_form_one_group_in_file_order() {
        let text = r#"
[[workers]]
name = "w"
core = 0

[[qps]]
name = "a"
worker = "w"
listen = "0.0.0.0:7000"

[[qps]]
name = "b"
worker = "w"
peer = "10.0.0.1:7001"

[[qps]]
name = "c"
worker = "w"
listen = "0.0.0.0:7000"

[[qps]]
name = "d"
worker = "w"
peer = "d2"

[[qps]]
name = "d2"
worker = "w"
peer = "d"

[[stages]]
name = "s"
worker = "w"
kind = "sink"
input = "a"
"#;
        let cfg = Config::from_str(text, "p.toml").unwrap();
        let g = plan(&cfg);
        assert_eq!(g.len(), 2);
        assert_eq!(
            (g[0].side.clone(), g[0].addr(), g[0].qps.clone()),
            (Side::Listen, "0.0.0.0:7000".into(), vec!["a".into(), "c".into()])
        );
        assert_eq!(
            (g[1].side.clone(), g[1].addr(), g[1].qps.clone()),
            (Side::Connect, "10.0.0.1:7001".into(), vec!["b".into()])
        );
    }

    #[test]
    fn route_is_global_only_with_a_gid() {
        let r = Route { port: 1, gid_index: 1 };
        let ep = Endpoint { lid: 0, qpn: 0x11, psn: 7, gid: [1; 16] };
        let a = r.to(&ep);
        assert_eq!((a.qpn, a.psn, a.ah.is_global, a.ah.sgid_index, a.ah.port_num), (0x11, 7, true, 1, 1));
        let ib = r.to(&Endpoint { lid: 5, qpn: 1, psn: 0, gid: [0; 16] });
        assert_eq!((ib.ah.is_global, ib.ah.dlid), (false, 5));
    }
}

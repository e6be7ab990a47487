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
use dataplane::verbs::{self, Endpoint, Errno};
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

/// Why the exchange with remote peers failed. `who` names the QPs and the address of the
/// connection ("qp a, b (peer 10.0.0.1:7470)").
///
/// The variants keep apart what the user must do differently: start the other side
/// ([`NoAnswer`](ExchangeError::NoAnswer)), look at the other side's output because it went
/// away ([`PeerClosed`](ExchangeError::PeerClosed)), or compare the two files' QP lists
/// ([`Timeout`](ExchangeError::Timeout), [`Protocol`](ExchangeError::Protocol)).
#[derive(Debug, thiserror::Error)]
pub enum ExchangeError {
    /// A QP of a group was not created (the runner and the plan disagree).
    #[error("qp {qp}: not created")]
    Missing {
        /// The QP.
        qp: String,
    },
    /// A verb on a local QP failed: reading its endpoint, or bringing it up with the remote
    /// endpoint.
    #[error("qp {qp}: {what}: {source}")]
    Local {
        /// The QP.
        qp: String,
        /// What was being done, with the remote QPN where there is one.
        what: String,
        /// The verb's error.
        source: verbs::Error,
    },
    /// The listen address does not resolve or cannot be bound.
    #[error("qp {qps}: cannot listen on {addr}: {source}")]
    Listen {
        /// The QPs listening there.
        qps: String,
        /// The address.
        addr: String,
        /// The resolver's or `bind`'s error.
        source: std::io::Error,
    },
    /// The peer address is not a valid host and port.
    #[error("{who}: {source}")]
    BadAddress {
        /// QPs and address.
        who: String,
        /// What is wrong with it.
        source: verbs::Error,
    },
    /// The listening side did not accept within [`CONNECT_WITHIN`].
    #[error(
        "{who}: the remote peer did not answer within {} s ({source}); start the other side, \
         whose qp has listen = \"...:{port}\"",
        CONNECT_WITHIN.as_secs()
    )]
    NoAnswer {
        /// QPs and address.
        who: String,
        /// The port the other side should listen on.
        port: u16,
        /// The last connection error.
        source: verbs::Error,
    },
    /// Ctrl-C, or another connection of this run failed first.
    #[error("{who}: stopped while {during}")]
    Stopped {
        /// QPs and address.
        who: String,
        /// What was under way.
        during: &'static str,
    },
    /// The remote side closed the connection (end of file, reset, broken pipe) before the
    /// exchange finished: its process ended, failed or was killed.
    #[error(
        "{who}: exchange: {source}; the remote peer closed the connection before the exchange \
         finished: its process ended or was killed (its own output says why)"
    )]
    PeerClosed {
        /// QPs and address.
        who: String,
        /// The socket error.
        source: verbs::Error,
    },
    /// Nothing arrived for the I/O timeout: both sides are waiting to read, which is what two
    /// files with different QP counts for one address do.
    #[error(
        "{who}: exchange: {source} (nothing arrived for {} s); do both sides list the same \
         number of QPs for this address (this side: {qps})?",
        IO_TIMEOUT.as_secs()
    )]
    Timeout {
        /// QPs and address.
        who: String,
        /// QPs of this side on the connection.
        qps: usize,
        /// The socket error.
        source: verbs::Error,
    },
    /// The peer sent something other than the next message expected (e.g. another connection
    /// message where `done` was due: it has more QPs on this address).
    #[error(
        "{who}: exchange: {source}; do both sides list the same number of QPs for this address (this side: {qps})?"
    )]
    Protocol {
        /// QPs and address.
        who: String,
        /// QPs of this side on the connection.
        qps: usize,
        /// The decoding error.
        source: verbs::Error,
    },
    /// Another socket failure.
    #[error("{who}: {source}")]
    Io {
        /// QPs and address.
        who: String,
        /// The error.
        source: verbs::Error,
    },
    /// An exchange thread panicked.
    #[error("an exchange thread panicked")]
    Panicked,
    /// More than one connection failed; one line each.
    #[error("{}", .0.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("\n"))]
    Several(Vec<ExchangeError>),
}

/// The runner reports errors as text for now.
impl From<ExchangeError> for String {
    fn from(e: ExchangeError) -> String {
        e.to_string()
    }
}

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
        PeerAddr::from_endpoint(ep, self.port, self.gid_index)
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
) -> Result<Links, ExchangeError>
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
            let &(w, i) = qps.get(name).ok_or_else(|| ExchangeError::Missing { qp: name.clone() })?;
            let ep = workers[w].endpoint(i, route.gid_index).map_err(|source| ExchangeError::Local {
                qp: name.clone(),
                what: "endpoint".into(),
                source,
            })?;
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
    let connect = |g: &Group, remotes: &[Endpoint]| -> Result<(), ExchangeError> {
        let mut ws = workers.lock().map_err(|_| ExchangeError::Panicked)?;
        for (name, r) in g.qps.iter().zip(remotes) {
            let (w, i) = qps[name];
            ws[w].connect_to(pd, i, &route.to(r)).map_err(|source| ExchangeError::Local {
                qp: name.clone(),
                what: format!("connecting to the remote QP {:#x}", r.qpn),
                source,
            })?;
        }
        Ok(())
    };
    let abort = AtomicBool::new(false);
    let results: Vec<Result<(String, TcpStream), ExchangeError>> = std::thread::scope(|s| {
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
        handles.into_iter().map(|h| h.join().unwrap_or(Err(ExchangeError::Panicked))).collect()
    });
    let mut links = Links::default();
    let mut errors = Vec::new();
    for r in results {
        match r {
            Ok(c) => links.conns.push(c),
            Err(e) => errors.push(e),
        }
    }
    match errors.len() {
        0 => Ok(links),
        1 => Err(errors.remove(0)),
        _ => Err(ExchangeError::Several(errors)),
    }
}

fn bind(g: &Group) -> Result<TcpListener, ExchangeError> {
    let err = |source| ExchangeError::Listen { qps: g.names(), addr: g.addr(), source };
    let addrs: Vec<_> = (g.host.as_str(), g.port).to_socket_addrs().map_err(err)?.collect();
    let l = TcpListener::bind(&addrs[..]).map_err(err)?;
    l.set_nonblocking(true).map_err(err)?;
    Ok(l)
}

/// Brings a group's QPs up with the remote endpoints (shared by the connection threads).
type ConnectQps<'a> = dyn Fn(&Group, &[Endpoint]) -> Result<(), ExchangeError> + Sync + 'a;

/// One connection: accept or connect, exchange, connect the QPs; returns the open stream.
fn one(
    g: &Group,
    listener: Option<TcpListener>,
    connect: &ConnectQps<'_>,
    interrupt: &AtomicBool,
    abort: &AtomicBool,
) -> Result<(String, TcpStream), ExchangeError> {
    let stopped = || interrupt.load(Ordering::Relaxed) || abort.load(Ordering::Acquire);
    let who =
        format!("qp {} ({} {})", g.names(), if g.side == Side::Listen { "listening on" } else { "peer" }, g.addr());
    let mut s = match listener {
        Some(l) => loop {
            match l.accept() {
                Ok((s, _)) => break s,
                Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::Interrupted => {
                    if stopped() {
                        return Err(ExchangeError::Stopped { who, during: "waiting for the remote peer" });
                    }
                    std::thread::sleep(RETRY_EVERY);
                }
                Err(e) => return Err(ExchangeError::Io { who, source: io_error("accept", e) }),
            }
        },
        None => {
            let start = Instant::now();
            loop {
                match conn::connect_stream(&g.host, g.port) {
                    Ok(s) => break s,
                    Err(source) if source.errno == Errno::EINVAL => {
                        return Err(ExchangeError::BadAddress { who, source });
                    }
                    Err(source) if start.elapsed() >= CONNECT_WITHIN => {
                        return Err(ExchangeError::NoAnswer { who, port: g.port, source });
                    }
                    Err(_) if stopped() => return Err(ExchangeError::Stopped { who, during: "connecting" }),
                    Err(_) => std::thread::sleep(RETRY_EVERY),
                }
            }
        }
    };
    let setup = (|| {
        s.set_nonblocking(false)?;
        s.set_read_timeout(Some(IO_TIMEOUT))?;
        s.set_write_timeout(Some(IO_TIMEOUT))?;
        s.set_nodelay(true)
    })();
    setup.map_err(|e| ExchangeError::Io { who: who.clone(), source: io_error("socket options", e) })?;
    // A failure of our own QPs is kept whole; `conn` only needs to know that it failed.
    let mut local = None;
    let up = |r: &[Endpoint]| {
        connect(g, r).map_err(|e| {
            local = Some(e);
            verbs::Error::new(Errno::EIO, "connecting the local QPs failed")
        })
    };
    let exchanged = match g.side {
        Side::Listen => conn::server_exchange_on(&mut s, &g.locals, up),
        Side::Connect => conn::client_exchange_on(&mut s, &g.locals, up),
    };
    if let Some(e) = local {
        return Err(e);
    }
    if let Err(source) = exchanged {
        return Err(classify(who, g.qps.len(), source));
    }
    s.set_nonblocking(true).map_err(|e| ExchangeError::Io { who, source: io_error("socket options", e) })?;
    Ok((g.addr(), s))
}

/// Names the likely cause of a failed exchange from `conn`'s error. `conn` reports an end of
/// file as `EIO` ("peer closed early"), a read timeout as `EAGAIN` and a malformed message as
/// `EINVAL`; a peer killed with our message unread resets the connection (`ECONNRESET`), and
/// a write to a closed one fails with `EPIPE`.
fn classify(who: String, qps: usize, source: verbs::Error) -> ExchangeError {
    match source.errno.raw() {
        libc::EAGAIN => ExchangeError::Timeout { who, qps, source },
        libc::EINVAL => ExchangeError::Protocol { who, qps, source },
        libc::EIO | libc::ECONNRESET | libc::EPIPE => ExchangeError::PeerClosed { who, source },
        _ => ExchangeError::Io { who, source },
    }
}

/// A socket error as a verbs error, keeping its errno.
fn io_error(what: &str, e: std::io::Error) -> verbs::Error {
    verbs::Error::new(Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)), format!("{what}: {e}"))
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

    use std::io::{Read, Write};

    static NOT_STOPPED: AtomicBool = AtomicBool::new(false);

    /// A group of `n` QPs on 127.0.0.1:`port` with made-up endpoints.
    fn group(side: Side, port: u16, n: usize) -> Group {
        Group {
            side,
            host: "127.0.0.1".into(),
            port,
            qps: (0..n).map(|i| format!("q{i}")).collect(),
            locals: (0..n).map(|i| Endpoint { lid: 0, qpn: 0x100 + i as u32, psn: 1, gid: [0; 16] }).collect(),
        }
    }

    fn connect_nothing(_: &Group, _: &[Endpoint]) -> Result<(), ExchangeError> {
        Ok(())
    }

    /// Runs our connecting side against a peer that accepts and then does `peer` with the
    /// connection (dropping it at the end, as the kernel does for a killed process).
    fn client_against(peer: impl FnOnce(TcpStream) + Send + 'static) -> ExchangeError {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let t = std::thread::spawn(move || peer(l.accept().unwrap().0));
        let r = one(&group(Side::Connect, port, 1), None, &connect_nothing, &NOT_STOPPED, &NOT_STOPPED);
        t.join().unwrap();
        r.expect_err("the exchange cannot succeed")
    }

    #[test]
    fn a_peer_that_dies_mid_exchange_is_reported_as_gone_not_as_a_qp_count_mismatch() {
        // The peer read our message and died before answering: end of file.
        let e = client_against(|mut s| {
            let mut msg = [0u8; conn::MSG_LEN];
            s.read_exact(&mut msg).unwrap();
        });
        assert!(matches!(e, ExchangeError::PeerClosed { .. }), "{e:?}");
        let text = e.to_string();
        assert!(text.contains("closed the connection before the exchange finished"), "{text}");
        assert!(!text.contains("number of QPs"), "misleading hint: {text}");
    }

    #[test]
    fn a_peer_killed_with_our_message_unread_is_reported_as_gone() {
        // Closing with unread data makes the kernel reset the connection (ECONNRESET).
        let e = client_against(|s| {
            let mut msg = [0u8; conn::MSG_LEN];
            while s.peek(&mut msg).unwrap() < conn::MSG_LEN {
                std::thread::sleep(Duration::from_millis(1));
            }
        });
        assert!(matches!(e, ExchangeError::PeerClosed { .. }), "{e:?}");
        assert!(!e.to_string().contains("number of QPs"), "misleading hint: {e}");
    }

    #[test]
    fn a_peer_with_more_qps_on_the_address_gets_the_count_hint() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.set_nonblocking(true).unwrap();
        let port = l.local_addr().unwrap().port();
        // The other file lists two QPs for this address, ours one: its second connection
        // message arrives where `done` is due.
        let peer = std::thread::spawn(move || {
            let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
            for ep in group(Side::Connect, port, 2).locals {
                s.write_all(&conn::encode(&ep)).unwrap();
            }
            let mut rest = Vec::new();
            let _ = s.read_to_end(&mut rest);
        });
        let r = one(&group(Side::Listen, port, 1), Some(l), &connect_nothing, &NOT_STOPPED, &NOT_STOPPED);
        let e = r.expect_err("a connection message where done was due");
        peer.join().unwrap();
        assert!(matches!(e, ExchangeError::Protocol { qps: 1, .. }), "{e:?}");
        assert!(e.to_string().contains("same number of QPs for this address (this side: 1)?"), "{e}");
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

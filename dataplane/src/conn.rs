//! Out-of-band connection exchange over TCP, in the format of rdma-core's `ibv_rc_pingpong`
//! family, so our programs can talk to theirs.
//!
//! Each side sends one fixed-size message, `LLLL:QQQQQQ:PPPPPP:GGGG...` (LID as 4 hex digits,
//! QPN and PSN as 6, the GID as 32 hex digits in byte order) followed by a NUL byte: 52 bytes.
//! The client sends first, then reads the server's message, then sends `done\0`; the server
//! reads the client's message, brings its QP up, answers, and waits for `done`.
//!
//! A peer that sends something malformed, or closes early, gets an error, never a panic.
//!
//! Programs with their own exchange (dp-perf) reuse the pieces: the endpoint message on any
//! stream ([`write_endpoint`], [`read_endpoint`]), a memory message for RDMA targets
//! ([`RemoteMem`], 43 bytes `RKEY:ADDR:LEN`), and [`connect_retry`].

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};

use crate::verbs::{Endpoint, Errno, Error, Result};

/// Size of one exchange message (`sizeof "0000:000000:000000:" + 32 hex digits` with its NUL).
pub const MSG_LEN: usize = 52;

/// Encodes `ep` as one exchange message. QPN and PSN are 24-bit values on the wire.
pub fn encode(ep: &Endpoint) -> [u8; MSG_LEN] {
    let mut s = format!("{:04x}:{:06x}:{:06x}:", ep.lid, ep.qpn & 0xff_ffff, ep.psn & 0xff_ffff);
    for b in ep.gid {
        s.push_str(&format!("{b:02x}"));
    }
    let mut out = [0u8; MSG_LEN];
    out[..s.len()].copy_from_slice(s.as_bytes());
    out
}

fn bad(msg: &[u8], why: &str) -> Error {
    let shown: String = msg.iter().take(MSG_LEN).map(|&b| if b.is_ascii_graphic() { b as char } else { '.' }).collect();
    Error::new(Errno::EINVAL, format!("peer sent a malformed connection message ({why}): {shown:?}"))
}

/// Decodes one exchange message. Errors: `EINVAL` for anything that is not exactly the format.
pub fn decode(msg: &[u8]) -> Result<Endpoint> {
    if msg.len() < MSG_LEN - 1 {
        return Err(bad(msg, "too short"));
    }
    let text = &msg[..MSG_LEN - 1];
    if msg.len() >= MSG_LEN && msg[MSG_LEN - 1] != 0 {
        return Err(bad(msg, "not NUL-terminated"));
    }
    if text[4] != b':' || text[11] != b':' || text[18] != b':' {
        return Err(bad(msg, "separators"));
    }
    let hex = |r: std::ops::Range<usize>| -> Result<u32> {
        let s = std::str::from_utf8(&text[r]).map_err(|_| bad(msg, "not ASCII"))?;
        if !s.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad(msg, "not hex"));
        }
        u32::from_str_radix(s, 16).map_err(|_| bad(msg, "not hex"))
    };
    let lid = hex(0..4)? as u16;
    let qpn = hex(5..11)?;
    let psn = hex(12..18)?;
    let mut gid = [0u8; 16];
    for (i, g) in gid.iter_mut().enumerate() {
        *g = hex(19 + 2 * i..21 + 2 * i)? as u8;
    }
    Ok(Endpoint { lid, qpn, psn, gid })
}

fn io_err(what: &str, e: std::io::Error) -> Error {
    let errno = match e.kind() {
        std::io::ErrorKind::UnexpectedEof => Errno::EIO,
        _ => Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)),
    };
    let detail =
        if e.kind() == std::io::ErrorKind::UnexpectedEof { "peer closed early".to_owned() } else { e.to_string() };
    Error::new(errno, format!("{what}: {detail}"))
}

/// Client side: connects to `host:port`, sends `local`, returns the server's endpoint, and
/// sends `done`.
pub fn client_exchange(host: &str, port: u16, local: &Endpoint) -> Result<Endpoint> {
    Ok(client_exchange_many(host, port, std::slice::from_ref(local))?[0])
}

/// Client side for several QPs (`ibv_srq_pingpong`): sends one message per endpoint of
/// `locals`, reads as many from the server, then sends `done`.
pub fn client_exchange_many(host: &str, port: u16, locals: &[Endpoint]) -> Result<Vec<Endpoint>> {
    let mut s = connect_stream(host, port)?;
    client_exchange_on(&mut s, locals, |_| Ok(()))
}

/// Opens the TCP connection of a client exchange: tries every address `host` resolves to.
/// Errors: `EINVAL` when the name does not resolve, `EIO` (with the last reason) when no
/// address accepts.
pub fn connect_stream(host: &str, port: u16) -> Result<TcpStream> {
    let addrs = resolve(host, port)?;
    connect_any(&addrs, None).map_err(|last| cannot_connect(host, port, last))
}

/// The addresses `host:port` resolves to. Errors: `EINVAL` when it does not resolve.
fn resolve(host: &str, port: u16) -> Result<Vec<std::net::SocketAddr>> {
    Ok((host, port)
        .to_socket_addrs()
        .map_err(|e| Error::new(Errno::EINVAL, format!("cannot resolve {host}:{port}: {e}")))?
        .collect())
}

/// Tries each of `addrs` in turn (each within `timeout`, if given); the first connection, or
/// the last failure (`None`: no address).
fn connect_any(
    addrs: &[std::net::SocketAddr],
    timeout: Option<std::time::Duration>,
) -> std::result::Result<TcpStream, Option<std::io::Error>> {
    let mut last = None;
    for a in addrs {
        let r = match timeout {
            Some(t) => TcpStream::connect_timeout(a, t),
            None => TcpStream::connect(a),
        };
        match r {
            Ok(s) => return Ok(s),
            Err(e) => last = Some(e),
        }
    }
    Err(last)
}

/// `EIO` naming `host:port` and the last failure.
fn cannot_connect(host: &str, port: u16, last: Option<std::io::Error>) -> Error {
    let e = last.map_or_else(|| "no address".to_owned(), |e| e.to_string());
    Error::new(Errno::EIO, format!("cannot connect to {host}:{port}: {e}"))
}

/// Client side on an open connection: sends `locals`, reads as many endpoints from the server,
/// calls `connect` with them, then sends `done` (so a server that waits for `done` knows the
/// client's QPs are ready). The stream stays open for the caller.
pub fn client_exchange_on(
    s: &mut TcpStream,
    locals: &[Endpoint],
    connect: impl FnOnce(&[Endpoint]) -> Result<()>,
) -> Result<Vec<Endpoint>> {
    for l in locals {
        s.write_all(&encode(l)).map_err(|e| io_err("sending the connection message", e))?;
    }
    let remotes = read_many(s, locals.len(), "reading the server's connection message")?;
    connect(&remotes)?;
    s.write_all(b"done\0").map_err(|e| io_err("sending done", e))?;
    Ok(remotes)
}

fn read_many(s: &mut TcpStream, n: usize, what: &str) -> Result<Vec<Endpoint>> {
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let mut buf = [0u8; MSG_LEN];
        s.read_exact(&mut buf).map_err(|e| io_err(&format!("{what} ({} of {n})", i + 1), e))?;
        out.push(decode(&buf)?);
    }
    Ok(out)
}

/// Server side: accepts one client on `listener`, reads its endpoint, calls `connect` with it
/// (bring the QP to RTS there, before answering, as the client may send at once), sends
/// `local`, and waits for the client's `done`.
pub fn server_exchange(
    listener: &TcpListener,
    local: &Endpoint,
    connect: impl FnOnce(&Endpoint) -> Result<()>,
) -> Result<Endpoint> {
    Ok(server_exchange_many(listener, std::slice::from_ref(local), |r| connect(&r[0]))?[0])
}

/// Server side for several QPs: reads one message per endpoint of `locals`, calls `connect`
/// with them, sends `locals`, and waits for `done`.
pub fn server_exchange_many(
    listener: &TcpListener,
    locals: &[Endpoint],
    connect: impl FnOnce(&[Endpoint]) -> Result<()>,
) -> Result<Vec<Endpoint>> {
    let (mut s, _) = listener.accept().map_err(|e| io_err("accepting the client", e))?;
    server_exchange_on(&mut s, locals, connect)
}

/// Server side on an accepted connection: reads one message per endpoint of `locals`, calls
/// `connect` with them, sends `locals`, and waits for `done`. The stream stays open for the
/// caller.
pub fn server_exchange_on(
    s: &mut TcpStream,
    locals: &[Endpoint],
    connect: impl FnOnce(&[Endpoint]) -> Result<()>,
) -> Result<Vec<Endpoint>> {
    let remotes = read_many(s, locals.len(), "reading the client's connection message")?;
    connect(&remotes)?;
    for l in locals {
        s.write_all(&encode(l)).map_err(|e| io_err("sending the connection message", e))?;
    }
    let mut done = [0u8; 5];
    s.read_exact(&mut done).map_err(|e| io_err("waiting for done", e))?;
    if &done[..4] != b"done" {
        return Err(bad(&done, "expected done"));
    }
    Ok(remotes)
}

// The exchange of `ibv_xsrq_pingpong` (XRC): one 66-byte message per side,
// `LLLL:RRRRRR:SSSSSS:PPPPPP:QQQQQQ:GGGG...` (LID, the XRC_RECV and XRC_SEND QPNs, the PSN,
// the XRC SRQ number, the GID as 32 hex digits) with a NUL, and `END\0` at the end.

/// What one side of an XRC pingpong tells the other.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct XrcEndpoint {
    /// LID of the port.
    pub lid: u16,
    /// The XRC_RECV QP the peer's XRC_SEND QP connects to.
    pub recv_qpn: u32,
    /// The XRC_SEND QP the peer's XRC_RECV QP connects to.
    pub send_qpn: u32,
    /// PSN the peer's QPs start their receive side at (and ours send with).
    pub psn: u32,
    /// The XRC SRQ the peer's requests name (`remote_srqn`).
    pub srqn: u32,
    /// GID of the port.
    pub gid: [u8; 16],
}

/// Size of one XRC exchange message, with its NUL.
pub const XRC_MSG_LEN: usize = 66;

/// Encodes `ep` as one XRC exchange message. QPNs, PSN and SRQN are 24-bit on the wire.
pub fn encode_xrc(ep: &XrcEndpoint) -> [u8; XRC_MSG_LEN] {
    let m = 0xff_ffff;
    let mut s = format!(
        "{:04x}:{:06x}:{:06x}:{:06x}:{:06x}:",
        ep.lid,
        ep.recv_qpn & m,
        ep.send_qpn & m,
        ep.psn & m,
        ep.srqn & m
    );
    for b in ep.gid {
        s.push_str(&format!("{b:02x}"));
    }
    let mut out = [0u8; XRC_MSG_LEN];
    out[..s.len()].copy_from_slice(s.as_bytes());
    out
}

/// Decodes one XRC exchange message. Errors: `EINVAL` for anything that is not the format.
pub fn decode_xrc(msg: &[u8]) -> Result<XrcEndpoint> {
    if msg.len() != XRC_MSG_LEN || msg[XRC_MSG_LEN - 1] != 0 {
        return Err(bad(msg, "XRC message of the wrong length or not NUL-terminated"));
    }
    if [4, 11, 18, 25, 32].iter().any(|&i| msg[i] != b':') {
        return Err(bad(msg, "XRC message separators"));
    }
    let hex = |r: std::ops::Range<usize>| -> Result<u32> {
        let s = std::str::from_utf8(&msg[r]).map_err(|_| bad(msg, "not ASCII"))?;
        if !s.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad(msg, "not hex"));
        }
        u32::from_str_radix(s, 16).map_err(|_| bad(msg, "not hex"))
    };
    let mut gid = [0u8; 16];
    for (i, g) in gid.iter_mut().enumerate() {
        *g = hex(33 + 2 * i..35 + 2 * i)? as u8;
    }
    Ok(XrcEndpoint {
        lid: hex(0..4)? as u16,
        recv_qpn: hex(5..11)?,
        send_qpn: hex(12..18)?,
        psn: hex(19..25)?,
        srqn: hex(26..32)?,
        gid,
    })
}

/// Writes `ep` as one XRC exchange message to `w`.
pub fn write_xrc(w: &mut impl Write, ep: &XrcEndpoint) -> Result<()> {
    w.write_all(&encode_xrc(ep)).map_err(|e| io_err("sending the XRC connection message", e))
}

/// Reads one XRC exchange message from `r`; errors as [`read_endpoint`].
pub fn read_xrc(r: &mut impl Read) -> Result<XrcEndpoint> {
    let mut buf = [0u8; XRC_MSG_LEN];
    r.read_exact(&mut buf).map_err(|e| io_err("reading the XRC connection message", e))?;
    decode_xrc(&buf)
}

/// Sends `END\0`, the termination message of `ibv_xsrq_pingpong`.
pub fn write_end(w: &mut impl Write) -> Result<()> {
    w.write_all(b"END\0").map_err(|e| io_err("sending the termination message", e))
}

/// Reads the termination message. Errors: `EIO` when the peer closes, `EINVAL` for anything
/// but `END\0`.
pub fn read_end(r: &mut impl Read) -> Result<()> {
    let mut buf = [0u8; 4];
    r.read_exact(&mut buf).map_err(|e| io_err("reading the termination message", e))?;
    if &buf != b"END\0" {
        return Err(bad(&buf, "expected END"));
    }
    Ok(())
}

// Building blocks for programs with their own exchange (dp-perf): the same endpoint message on
// any stream, a memory descriptor message, and a client connect that waits for the server.

/// Memory a peer may target with RDMA READ/WRITE and atomics: what perftest exchanges next to
/// the QP's identity (`rkey`, `vaddr`), plus the length, so the peer can check its offsets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RemoteMem {
    /// Remote key of the memory region.
    pub rkey: u32,
    /// Address of its first byte, as the owner's SGEs and the peer's `remote_addr` use it.
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
}

/// Size of one memory message: `RRRRRRRR:AAAAAAAAAAAAAAAA:LLLLLLLLLLLLLLLL` (rkey as 8 hex
/// digits, address and length as 16) followed by a NUL byte.
pub const MEM_MSG_LEN: usize = 43;

/// Encodes `m` as one memory message.
pub fn encode_mem(m: &RemoteMem) -> [u8; MEM_MSG_LEN] {
    let s = format!("{:08x}:{:016x}:{:016x}", m.rkey, m.addr, m.len);
    let mut out = [0u8; MEM_MSG_LEN];
    out[..s.len()].copy_from_slice(s.as_bytes());
    out
}

/// Decodes one memory message. Errors: `EINVAL` for anything that is not exactly the format.
pub fn decode_mem(msg: &[u8]) -> Result<RemoteMem> {
    if msg.len() != MEM_MSG_LEN {
        return Err(bad(msg, "memory message of the wrong length"));
    }
    if msg[MEM_MSG_LEN - 1] != 0 {
        return Err(bad(msg, "memory message not NUL-terminated"));
    }
    if msg[8] != b':' || msg[25] != b':' {
        return Err(bad(msg, "memory message separators"));
    }
    let hex = |r: std::ops::Range<usize>| -> Result<u64> {
        let s = std::str::from_utf8(&msg[r]).map_err(|_| bad(msg, "not ASCII"))?;
        if !s.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad(msg, "not hex"));
        }
        u64::from_str_radix(s, 16).map_err(|_| bad(msg, "not hex"))
    };
    Ok(RemoteMem { rkey: hex(0..8)? as u32, addr: hex(9..25)?, len: hex(26..42)? })
}

/// Writes `ep` as one exchange message (the rc_pingpong format of [`encode`]) to `w`.
pub fn write_endpoint(w: &mut impl Write, ep: &Endpoint) -> Result<()> {
    w.write_all(&encode(ep)).map_err(|e| io_err("sending a connection message", e))
}

/// Reads one exchange message from `r`. Errors: `EIO` when the peer closes or a read timeout
/// set on the stream expires, `EINVAL` for a malformed message.
pub fn read_endpoint(r: &mut impl Read) -> Result<Endpoint> {
    let mut buf = [0u8; MSG_LEN];
    r.read_exact(&mut buf).map_err(|e| io_err("reading a connection message", e))?;
    decode(&buf)
}

/// Writes `m` as one memory message to `w`.
pub fn write_mem(w: &mut impl Write, m: &RemoteMem) -> Result<()> {
    w.write_all(&encode_mem(m)).map_err(|e| io_err("sending a memory message", e))
}

/// Reads one memory message from `r`; errors as [`read_endpoint`].
pub fn read_mem(r: &mut impl Read) -> Result<RemoteMem> {
    let mut buf = [0u8; MEM_MSG_LEN];
    r.read_exact(&mut buf).map_err(|e| io_err("reading a memory message", e))?;
    decode_mem(&buf)
}

/// Connects to `host:port`, retrying refused connections for up to `patience` (a server
/// started at the same moment may not listen yet). Errors: `EINVAL` for a name that does not
/// resolve, `EIO` naming the last failure once `patience` is spent.
pub fn connect_retry(host: &str, port: u16, patience: std::time::Duration) -> Result<TcpStream> {
    let addrs = resolve(host, port)?;
    let until = std::time::Instant::now() + patience;
    let each = patience.max(std::time::Duration::from_millis(100));
    loop {
        let last = match connect_any(&addrs, Some(each)) {
            Ok(s) => return Ok(s),
            Err(last) => last,
        };
        let refused = last.as_ref().is_some_and(|e| e.kind() == std::io::ErrorKind::ConnectionRefused);
        if !refused || std::time::Instant::now() >= until {
            return Err(cannot_connect(host, port, last));
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xrc_message_round_trips_and_refuses_garbage() {
        let ep = XrcEndpoint { lid: 7, recv_qpn: 0x12345, send_qpn: 0xabcdef, psn: 0x42, srqn: 0x301, gid: [0xfe; 16] };
        let m = encode_xrc(&ep);
        assert_eq!(&m[..33], b"0007:012345:abcdef:000042:000301:");
        assert_eq!(m[XRC_MSG_LEN - 1], 0);
        assert_eq!(decode_xrc(&m).unwrap(), ep);
        let mut bad = m;
        bad[11] = b'-';
        assert_eq!(decode_xrc(&bad).unwrap_err().errno, Errno::EINVAL);
        let mut bad = m;
        bad[40] = b'z';
        assert_eq!(decode_xrc(&bad).unwrap_err().errno, Errno::EINVAL);
        assert_eq!(decode_xrc(&m[..40]).unwrap_err().errno, Errno::EINVAL);
        let mut v = Vec::new();
        write_end(&mut v).unwrap();
        read_end(&mut v.as_slice()).unwrap();
        assert_eq!(read_end(&mut &b"ENF\0"[..]).unwrap_err().errno, Errno::EINVAL);
    }

    #[test]
    fn round_trip_and_exact_format() {
        let ep = Endpoint {
            lid: 0x12,
            qpn: 0x11,
            psn: 0xabcdef,
            gid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 255, 255, 198, 18, 0, 1],
        };
        let m = encode(&ep);
        assert_eq!(&m[..51], b"0012:000011:abcdef:00000000000000000000ffffc6120001");
        assert_eq!(m[51], 0);
        assert_eq!(decode(&m).unwrap(), ep);
    }

    #[test]
    fn garbage_is_an_error() {
        assert!(decode(b"").is_err());
        assert!(decode(&[0xff; MSG_LEN]).is_err());
        let mut m = encode(&Endpoint::default());
        m[4] = b'-';
        assert!(decode(&m).is_err());
        let mut m = encode(&Endpoint::default());
        m[30] = b'z';
        assert!(decode(&m).is_err());
    }

    #[test]
    fn exchange_on_open_streams_pairs_in_order_and_keeps_them_open() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let ep = |qpn| Endpoint { lid: 1, qpn, psn: qpn + 1, gid: [qpn as u8; 16] };
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let client_up = std::sync::Arc::new(AtomicBool::new(false));
        let up = client_up.clone();
        let server = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let got = server_exchange_on(&mut s, &[ep(0x20), ep(0x21)], |r| {
                assert_eq!(r, [ep(0x10), ep(0x11)]);
                Ok(())
            })
            .unwrap();
            // `done` came after the client's connect callback.
            assert!(up.load(Ordering::Acquire));
            let mut b = [0u8; 1];
            s.read_exact(&mut b).unwrap();
            (got, b[0])
        });
        let mut s = connect_stream("127.0.0.1", port).unwrap();
        let got = client_exchange_on(&mut s, &[ep(0x10), ep(0x11)], |r| {
            assert_eq!(r, [ep(0x20), ep(0x21)]);
            client_up.store(true, Ordering::Release);
            Ok(())
        })
        .unwrap();
        assert_eq!(got, [ep(0x20), ep(0x21)]);
        s.write_all(&[7]).unwrap();
        assert_eq!(server.join().unwrap(), (vec![ep(0x10), ep(0x11)], 7));
    }

    #[test]
    fn peer_closing_early_is_an_error() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let t = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut m = [0u8; MSG_LEN];
            s.read_exact(&mut m).unwrap();
            let _ = s.write_all(b"0001:");
        });
        let e = client_exchange("127.0.0.1", port, &Endpoint::default()).unwrap_err();
        assert!(e.msg.contains("peer closed early"), "{e}");
        t.join().unwrap();
    }

    #[test]
    fn memory_message_round_trip_and_garbage() {
        let m = RemoteMem { rkey: 0x1234_abcd, addr: 0x7f00_0000_1000, len: 1 << 23 };
        let b = encode_mem(&m);
        assert_eq!(&b[..42], b"1234abcd:00007f0000001000:0000000000800000");
        assert_eq!(decode_mem(&b).unwrap(), m);
        let mut x = b;
        x[8] = b'-';
        assert!(decode_mem(&x).unwrap_err().msg.contains("separators"));
        let mut x = b;
        x[3] = b'g';
        assert!(decode_mem(&x).unwrap_err().msg.contains("not hex"));
        assert!(decode_mem(&b[..20]).is_err());
    }

    #[test]
    fn endpoint_and_memory_over_any_stream() {
        let ep = Endpoint { lid: 7, qpn: 0x42, psn: 0x123, gid: [3; 16] };
        let m = RemoteMem { rkey: 9, addr: 4096, len: 64 };
        let mut wire = Vec::new();
        write_endpoint(&mut wire, &ep).unwrap();
        write_mem(&mut wire, &m).unwrap();
        assert_eq!(wire.len(), MSG_LEN + MEM_MSG_LEN);
        let mut r = std::io::Cursor::new(wire);
        assert_eq!(read_endpoint(&mut r).unwrap(), ep);
        assert_eq!(read_mem(&mut r).unwrap(), m);
        let e = read_mem(&mut r).unwrap_err();
        assert!(e.msg.contains("peer closed early"), "{e}");
    }

    #[test]
    fn connect_retry_gives_up_with_the_reason() {
        let port = {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        }; // closed again: connections are refused
        let t0 = std::time::Instant::now();
        let e = connect_retry("127.0.0.1", port, std::time::Duration::from_millis(300)).unwrap_err();
        assert!(t0.elapsed() >= std::time::Duration::from_millis(300), "gave up early");
        assert!(e.msg.contains(&format!("cannot connect to 127.0.0.1:{port}")), "{e}");
        assert!(connect_retry("no-such-host.invalid", 1, std::time::Duration::ZERO).is_err());
    }
}

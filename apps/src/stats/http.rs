//! A minimal HTTP/1.1 server on `std::net` for `dpctl serve`: `GET /metrics` (or `HEAD`)
//! answers the exposition, anything else a 4xx status; one request per connection.
//!
//! Scrapers are trusted no more than any peer: a request head is read up to
//! [`MAX_REQUEST`] bytes and for at most [`IO_TIMEOUT`], and bad input gets a status code,
//! never a panic. Connections are served one after another (a scrape is a file read and a
//! few kilobytes of text), so a slow client delays the others by at most the timeout.

use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// Largest request head accepted (request line and headers); larger ones get 431.
pub const MAX_REQUEST: usize = 8192;
/// How long a client may take to send its request or read the response.
pub const IO_TIMEOUT: Duration = Duration::from_secs(5);

/// A response: status line parts, content type, body.
#[derive(Debug, PartialEq, Eq)]
pub struct Response {
    /// Status code.
    pub status: u16,
    /// Reason phrase.
    pub reason: &'static str,
    /// `Content-Type`.
    pub content_type: &'static str,
    /// Body (not sent for `HEAD`).
    pub body: String,
}

impl Response {
    fn plain(status: u16, reason: &'static str, body: &str) -> Response {
        Response { status, reason, content_type: "text/plain; charset=utf-8", body: format!("{body}\n") }
    }
}

/// What a request head asks for, or the response refusing it.
#[derive(Debug, PartialEq, Eq)]
pub enum Request {
    /// `GET` or `HEAD` (true) of the metrics path.
    Metrics {
        /// `HEAD`: headers only.
        head: bool,
    },
    /// Refused, with this response.
    Refused(Response),
}

/// Parses a complete request head (up to the blank line).
pub fn parse(head: &[u8]) -> Request {
    let bad = |why: &str| Request::Refused(Response::plain(400, "Bad Request", why));
    let Ok(text) = std::str::from_utf8(head) else { return bad("request head is not UTF-8") };
    let line = text.split("\r\n").next().unwrap_or("");
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) = (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return bad("malformed request line (want: METHOD PATH HTTP/1.x)");
    };
    if !version.starts_with("HTTP/1.") {
        return Request::Refused(Response::plain(505, "HTTP Version Not Supported", "HTTP/1.x only"));
    }
    let path = target.split('?').next().unwrap_or("");
    if path != "/metrics" {
        return Request::Refused(Response::plain(404, "Not Found", "not found; metrics are at /metrics"));
    }
    match method {
        "GET" => Request::Metrics { head: false },
        "HEAD" => Request::Metrics { head: true },
        _ => Request::Refused(Response::plain(405, "Method Not Allowed", "GET or HEAD only")),
    }
}

/// Reads a request head from `r`: up to and including the blank line, at most [`MAX_REQUEST`]
/// bytes, before `deadline`. `Err` carries the response for a head too large, cut off or late.
pub fn read_head(r: &mut impl Read, deadline: Instant) -> Result<Vec<u8>, Response> {
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    loop {
        if Instant::now() >= deadline {
            return Err(Response::plain(408, "Request Timeout", "request not received in time"));
        }
        let n = match r.read(&mut buf) {
            Ok(0) => return Err(Response::plain(400, "Bad Request", "connection closed inside the request head")),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                return Err(Response::plain(408, "Request Timeout", "request not received in time"))
            }
            Err(e) => return Err(Response::plain(400, "Bad Request", &format!("read: {e}"))),
        };
        // Look for the end from a little before the new bytes (it may straddle two reads).
        let from = head.len().saturating_sub(3);
        head.extend_from_slice(&buf[..n]);
        if let Some(end) = head[from..].windows(4).position(|w| w == b"\r\n\r\n") {
            head.truncate(from + end + 4);
            return Ok(head);
        }
        if head.len() > MAX_REQUEST {
            return Err(Response::plain(431, "Request Header Fields Too Large", "request head over 8 KiB"));
        }
    }
}

/// Writes `resp` (headers only if `head`) and closes the connection.
pub fn write_response(w: &mut impl Write, resp: &Response, head: bool) -> io::Result<()> {
    let mut out = format!(
        "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        resp.status,
        resp.reason,
        resp.content_type,
        resp.body.len()
    );
    if !head {
        out.push_str(&resp.body);
    }
    w.write_all(out.as_bytes())?;
    w.flush()
}

/// Serves one connection: reads the request (in at most `timeout`, however slowly it trickles
/// in), answers `metrics()` (or the error it returns, as 500) for the metrics path, a 4xx
/// status otherwise.
pub fn handle(
    stream: &mut TcpStream,
    metrics: &mut impl FnMut() -> Result<String, String>,
    timeout: Duration,
) -> io::Result<()> {
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    let (resp, head) = match read_head(stream, Instant::now() + timeout).map(|h| parse(&h)) {
        Err(r) | Ok(Request::Refused(r)) => (r, false),
        Ok(Request::Metrics { head }) => match metrics() {
            Ok(body) => (Response { status: 200, reason: "OK", content_type: super::prom::CONTENT_TYPE, body }, head),
            Err(e) => (Response::plain(500, "Internal Server Error", &e), head),
        },
    };
    write_response(stream, &resp, head)?;
    linger(stream);
    Ok(())
}

/// Closes gently: a request refused before it was all read (e.g. 431) leaves bytes unread,
/// and closing on unread bytes sends a reset that can destroy the response before the client
/// reads it. So: end our side, then discard what the client still sends, bounded in bytes
/// and time.
fn linger(stream: &mut TcpStream) {
    let _ = stream.shutdown(std::net::Shutdown::Write);
    let _ = stream.set_read_timeout(Some(Duration::from_millis(200)));
    let mut buf = [0u8; 4096];
    let mut left = 16 * MAX_REQUEST;
    while left > 0 {
        match stream.read(&mut buf) {
            Ok(n) if n > 0 => left = left.saturating_sub(n),
            _ => break,
        }
    }
}

/// Accepts connections on `listener` forever, one at a time; a failed connection is reported
/// on stderr and the server goes on.
pub fn serve(listener: &TcpListener, mut metrics: impl FnMut() -> Result<String, String>) -> ! {
    loop {
        match listener.accept() {
            Ok((mut s, peer)) => {
                if let Err(e) = handle(&mut s, &mut metrics, IO_TIMEOUT) {
                    eprintln!("dpctl serve: {peer}: {e}");
                }
            }
            Err(e) => {
                eprintln!("dpctl serve: accept: {e}");
                // e.g. out of file descriptors: do not spin.
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(head: &str) -> u16 {
        match parse(head.as_bytes()) {
            Request::Metrics { .. } => 200,
            Request::Refused(r) => r.status,
        }
    }

    #[test]
    fn requests_are_routed_and_bad_ones_refused_with_a_status() {
        assert_eq!(parse(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"), Request::Metrics { head: false });
        assert_eq!(parse(b"HEAD /metrics?x=1 HTTP/1.0\r\n\r\n"), Request::Metrics { head: true });
        assert_eq!(status("GET / HTTP/1.1\r\n\r\n"), 404);
        assert_eq!(status("GET /metricsx HTTP/1.1\r\n\r\n"), 404);
        assert_eq!(status("POST /metrics HTTP/1.1\r\n\r\n"), 405);
        assert_eq!(status("GET /metrics HTTP/2\r\n\r\n"), 505);
        assert_eq!(status("GET /metrics\r\n\r\n"), 400);
        assert_eq!(status("GET  /metrics HTTP/1.1\r\n\r\n"), 400);
        assert_eq!(status("\r\n\r\n"), 400);
        assert_eq!(parse(b"GET /\xff HTTP/1.1\r\n\r\n"), parse(b"\xff"), "not UTF-8: 400");
        assert_eq!(status(""), 400);
    }

    #[test]
    fn a_head_is_read_to_its_blank_line_bounded_in_size() {
        let far = Instant::now() + Duration::from_secs(60);
        let req = b"GET /metrics HTTP/1.1\r\nA: b\r\n\r\nbody";
        assert_eq!(read_head(&mut &req[..], far).unwrap(), &req[..req.len() - 4]);
        // Delivered a byte at a time: the end straddles reads.
        struct Drip<'a>(&'a [u8]);
        impl Read for Drip<'_> {
            fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
                let Some((&first, rest)) = self.0.split_first() else { return Ok(0) };
                b[0] = first;
                self.0 = rest;
                Ok(1)
            }
        }
        assert_eq!(read_head(&mut Drip(req), far).unwrap().len(), req.len() - 4);
        let huge = [b'a'; MAX_REQUEST + 10];
        assert_eq!(read_head(&mut &huge[..], far).unwrap_err().status, 431);
        assert_eq!(read_head(&mut &b"GET /metrics HTTP/1.1\r\n"[..], far).unwrap_err().status, 400, "cut off");
        let past = Instant::now() - Duration::from_millis(1);
        assert_eq!(read_head(&mut &req[..], past).unwrap_err().status, 408);
    }

    #[test]
    fn a_connection_gets_the_metrics_a_status_or_a_500_naming_the_failure() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let ask = move |req: &'static [u8]| {
            std::thread::spawn(move || {
                let mut c = TcpStream::connect(addr).unwrap();
                c.write_all(req).unwrap();
                let mut out = String::new();
                c.read_to_string(&mut out).unwrap();
                out
            })
        };
        let mut calls = 0;
        let mut metrics = || {
            calls += 1;
            Ok::<_, String>("m 1\n".to_string())
        };
        let client = ask(b"GET /metrics HTTP/1.1\r\n\r\n");
        handle(&mut l.accept().unwrap().0, &mut metrics, IO_TIMEOUT).unwrap();
        let out = client.join().unwrap();
        assert!(out.starts_with("HTTP/1.1 200 OK\r\n"), "{out}");
        assert!(out.contains("Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n"));
        assert!(out.ends_with("Content-Length: 4\r\nConnection: close\r\n\r\nm 1\n"), "{out}");
        let client = ask(b"GET /other HTTP/1.1\r\n\r\n");
        handle(&mut l.accept().unwrap().0, &mut metrics, IO_TIMEOUT).unwrap();
        assert!(client.join().unwrap().starts_with("HTTP/1.1 404 Not Found\r\n"));
        assert_eq!(calls, 1, "no scrape for a refused request");
        let mut failing = || Err("cannot list /nowhere".to_string());
        let client = ask(b"GET /metrics HTTP/1.1\r\n\r\n");
        handle(&mut l.accept().unwrap().0, &mut failing, IO_TIMEOUT).unwrap();
        let out = client.join().unwrap();
        assert!(out.starts_with("HTTP/1.1 500 ") && out.ends_with("cannot list /nowhere\n"), "{out}");
    }

    #[test]
    fn a_silent_or_trickling_client_gets_408_within_the_timeout() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let timeout = Duration::from_millis(300);
        for trickle in [false, true] {
            let client = std::thread::spawn(move || {
                let mut c = TcpStream::connect(addr).unwrap();
                c.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
                c.write_all(b"GET /met").unwrap();
                let mut out = Vec::new();
                let t0 = Instant::now();
                // Trickling: a byte every 100 ms, each well inside the read timeout.
                while t0.elapsed() < Duration::from_secs(10) {
                    let mut b = [0u8; 256];
                    match c.read(&mut b) {
                        Ok(0) => break,
                        Ok(n) => out.extend_from_slice(&b[..n]),
                        Err(_) if trickle => {
                            let _ = c.write_all(b"x");
                            std::thread::sleep(Duration::from_millis(50));
                        }
                        Err(_) => {}
                    }
                }
                String::from_utf8_lossy(&out).into_owned()
            });
            let t0 = Instant::now();
            let mut metrics = || Ok::<_, String>(String::new());
            handle(&mut l.accept().unwrap().0, &mut metrics, timeout).unwrap();
            let took = t0.elapsed();
            assert!(took < Duration::from_secs(2), "trickle {trickle}: held the server {took:?}");
            let out = client.join().unwrap();
            assert!(out.starts_with("HTTP/1.1 408 Request Timeout\r\n"), "trickle {trickle}: {out}");
        }
    }
}

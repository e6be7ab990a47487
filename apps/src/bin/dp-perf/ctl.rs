//! The control connection between client and server: one TCP stream for the whole run.
//!
//! ```text
//! C: dp-perf/1 test=... (params.rs)          S: ok | error SENTENCE
//! per message size:
//! C: size BYTES qps N, then N endpoint messages and one memory message (dataplane::conn)
//! S: ready, then its N endpoints and memory  (its QPs are at RTS, its receives posted)
//!    ... the test runs; both send "." every 250 ms ...
//! C: end bw|lat RESULTS                       S: end RECEIVED
//! C: bye
//! ```
//! Either side may send `error SENTENCE` instead of its next line; the other prints it. Reads
//! time out, so a dead or stuck peer is an error, never a hang: a closed connection at once,
//! silence after `--peer-timeout` during a test and after [`SETUP_TIMEOUT`] while setting up.

use crate::live::Shared;
use dataplane::conn::{self, RemoteMem};
use dataplane::verbs::Endpoint;
use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::TcpStream;
use std::thread::ScopedJoinHandle;
use std::time::{Duration, Instant};

/// Longest wait for the peer's next setup message (it may be registering large buffers).
pub const SETUP_TIMEOUT: Duration = Duration::from_secs(60);
/// Heartbeat period during a test.
const BEAT: Duration = Duration::from_millis(250);
/// Longest line either side reads (the parameter line is the longest): a peer cannot make
/// this side buffer an endless line.
pub const MAX_LINE: usize = crate::params::MAX_LINE as usize;

/// The control connection.
pub struct Ctl {
    r: BufReader<TcpStream>,
    w: TcpStream,
    /// Host:port of the peer, for messages.
    pub peer: String,
}

impl Ctl {
    /// Wraps a connected stream.
    pub fn new(s: TcpStream) -> Result<Ctl, String> {
        let peer = s.peer_addr().map_or_else(|_| "peer".into(), |a| a.to_string());
        s.set_nodelay(true).map_err(|e| format!("TCP_NODELAY: {e}"))?;
        let w = s.try_clone().map_err(|e| format!("cloning the control socket: {e}"))?;
        Ok(Ctl { r: BufReader::new(s), w, peer })
    }

    /// Sends one line.
    pub fn send(&mut self, line: &str) -> Result<(), String> {
        self.w.write_all(format!("{line}\n").as_bytes()).map_err(|e| format!("sending to {}: {e}", self.peer))
    }

    /// Tells the peer why this side gives up (best effort: it may be gone).
    pub fn send_error(&mut self, why: &str) {
        let _ = self.send(&format!("error {}", why.replace('\n', " ")));
    }

    /// Reads one line, waiting at most `timeout`; an `error` line from the peer is an error.
    pub fn recv(&mut self, timeout: Duration) -> Result<String, String> {
        self.r.get_ref().set_read_timeout(Some(timeout)).map_err(|e| format!("socket timeout: {e}"))?;
        let mut line = String::new();
        match (&mut self.r).take(MAX_LINE as u64 + 1).read_line(&mut line) {
            Ok(0) => Err(format!("{} closed the connection", self.peer)),
            Ok(n) if n > MAX_LINE => Err(too_long(&self.peer)),
            Ok(_) if !line.ends_with('\n') => Err(format!("{} closed the connection mid-line", self.peer)),
            Ok(_) => {
                let line = line.trim_end_matches('\n');
                match line.strip_prefix("error ") {
                    Some(why) => Err(format!("{} reports: {why}", self.peer)),
                    None => Ok(line.to_owned()),
                }
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                Err(format!("{} sent nothing for {:.1} s", self.peer, timeout.as_secs_f64()))
            }
            Err(e) => Err(format!("reading from {}: {e}", self.peer)),
        }
    }

    /// Reads one line that must start with `word`; returns the rest.
    pub fn expect(&mut self, word: &str, timeout: Duration) -> Result<String, String> {
        let line = self.recv(timeout)?;
        match line.strip_prefix(word) {
            Some(rest) if rest.is_empty() || rest.starts_with(' ') => Ok(rest.trim_start().to_owned()),
            _ => Err(format!("{} sent {line:?} where {word:?} was expected (same dp-perf on both sides?)", self.peer)),
        }
    }

    /// Sends this side's endpoints and memory (after a line already sent).
    pub fn send_addrs(&mut self, eps: &[Endpoint], mem: &RemoteMem) -> Result<(), String> {
        for ep in eps {
            conn::write_endpoint(&mut self.w, ep).map_err(|e| e.to_string())?;
        }
        conn::write_mem(&mut self.w, mem).map_err(|e| e.to_string())
    }

    /// Reads `n` endpoints and the memory message.
    pub fn recv_addrs(&mut self, n: usize) -> Result<(Vec<Endpoint>, RemoteMem), String> {
        self.r.get_ref().set_read_timeout(Some(SETUP_TIMEOUT)).map_err(|e| format!("socket timeout: {e}"))?;
        let mut eps = Vec::with_capacity(n);
        for _ in 0..n {
            eps.push(conn::read_endpoint(&mut self.r).map_err(|e| format!("{}: {e}", self.peer))?);
        }
        let mem = conn::read_mem(&mut self.r).map_err(|e| format!("{}: {e}", self.peer))?;
        Ok((eps, mem))
    }

    /// Runs the control side of one test while `test` runs on its own thread, until that
    /// thread is done: sends heartbeats and watches the peer's (a closed connection, an
    /// `error` line or `timeout` of silence kill the run through `shared`). Returns the
    /// peer's `end` payload if it came already; it also sets `shared.stop`.
    pub fn watch<T>(
        &mut self,
        shared: &Shared,
        test: &ScopedJoinHandle<'_, T>,
        timeout: Duration,
    ) -> Result<Option<String>, String> {
        let mut w = Watch::new(timeout);
        let mut next_beat = Instant::now();
        let r: Result<Option<String>, String> = (|| {
            while !test.is_finished() {
                if Instant::now() >= next_beat {
                    self.send(".")?;
                    next_beat = Instant::now() + BEAT;
                }
                self.poll_line(&mut w, shared)?;
            }
            Ok(w.theirs.take())
        })();
        if let Err(why) = &r {
            shared.kill(why.clone());
        }
        r
    }

    /// Sends `end MINE` and returns the peer's `end` payload (`theirs` if it came already).
    pub fn finish(
        &mut self,
        shared: &Shared,
        mine: &str,
        theirs: Option<String>,
        timeout: Duration,
    ) -> Result<String, String> {
        self.send(&format!("end {mine}"))?;
        let mut w = Watch::new(timeout);
        w.theirs = theirs;
        while w.theirs.is_none() {
            self.poll_line(&mut w, shared)?;
        }
        Ok(w.theirs.unwrap_or_default())
    }

    /// Reads what the peer sent within a short wait and acts on it.
    fn poll_line(&mut self, w: &mut Watch, shared: &Shared) -> Result<(), String> {
        if dataplane_apps::signals::stopped() {
            return Err("stopped by SIGINT or SIGTERM".into());
        }
        self.r.get_ref().set_read_timeout(Some(BEAT / 5)).map_err(|e| format!("socket timeout: {e}"))?;
        let room = (MAX_LINE + 1).saturating_sub(w.partial.len()) as u64;
        match (&mut self.r).take(room).read_line(&mut w.partial) {
            Ok(_) if w.partial.len() > MAX_LINE => Err(too_long(&self.peer)),
            Ok(0) => Err(format!("{} closed the connection (did it die?)", self.peer)),
            Ok(_) if w.partial.ends_with('\n') => {
                w.heard = Instant::now();
                let line = std::mem::take(&mut w.partial);
                let line = line.trim_end_matches('\n');
                if let Some(rest) = line.strip_prefix("end") {
                    w.theirs = Some(rest.trim_start().to_owned());
                    shared.stop();
                    Ok(())
                } else if let Some(why) = line.strip_prefix("error ") {
                    Err(format!("{} reports: {why}", self.peer))
                } else if line == "." {
                    Ok(())
                } else {
                    Err(format!("{} sent {line:?} during the test", self.peer))
                }
            }
            Ok(_) => Ok(()), // part of a line; the rest follows
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                if w.heard.elapsed() > w.timeout {
                    return Err(format!(
                        "no sign of life from {} for {:.1} s (--peer-timeout)",
                        self.peer,
                        w.timeout.as_secs_f64()
                    ));
                }
                Ok(())
            }
            Err(e) => Err(format!("reading from {}: {e}", self.peer)),
        }
    }
}

fn too_long(peer: &str) -> String {
    format!("{peer} sent a line longer than {MAX_LINE} bytes (no dp-perf line is that long)")
}

/// What the control side tracks during a test.
struct Watch {
    theirs: Option<String>,
    partial: String,
    heard: Instant,
    timeout: Duration,
}

impl Watch {
    fn new(timeout: Duration) -> Watch {
        Watch { theirs: None, partial: String::new(), heard: Instant::now(), timeout }
    }
}

//! The test parameters both ends must agree on, as the one line the client sends first.
//!
//! The server takes each parameter it was not given on its command line from the client, and
//! refuses the run with a sentence naming the flag when one it was given differs: a server can
//! be started with just the test name, and a mismatch is never silently measured.

use crate::args::{Args, Conn, ProviderKind};
use clap::ValueEnum;

/// First word of the line; a different one means another dp-perf version.
const VERSION: &str = "dp-perf/1";

/// Longest parameter line the server reads (the longest real one, a `-a` sweep of 23 sizes, is
/// about 400 bytes): a client cannot make the server buffer an endless line.
pub const MAX_LINE: u64 = 4096;

/// Largest message the server takes from a client that it was not given itself: the `-a`
/// sweep's top. A client cannot make a server that listens on every address register GBs;
/// larger runs need the same `-s` on the server.
pub const MAX_CLIENT_SIZE: u64 = 1 << 23;

/// The client's line (`sizes` resolved against its device).
pub fn to_wire(a: &Args, sizes: &[u64], fabric: &str) -> String {
    let list: Vec<String> = sizes.iter().map(u64::to_string).collect();
    format!(
        "{VERSION} test={} provider={} conn={:?} sizes={} iters={} duration={} qps={} tx_depth={} rx_depth={} \
         cq_mod={} post_list={} inline={} srq={} bidir={} fabric={fabric}",
        name(a.test),
        name(a.provider),
        a.conn,
        list.join(","),
        a.iterations(),
        a.duration.map_or("none".into(), |d| d.to_string()),
        a.qps,
        a.tx_depth,
        a.rx_depth,
        a.cq_mod,
        a.post_list,
        a.inline.map_or("auto".into(), |v| v.to_string()),
        a.use_srq as u8,
        a.bidirectional as u8,
    )
}

fn name<T: ValueEnum>(v: T) -> String {
    v.to_possible_value().map_or_else(String::new, |p| p.get_name().to_owned())
}

const KEYS: [&str; 15] = [
    "test",
    "provider",
    "conn",
    "sizes",
    "iters",
    "duration",
    "qps",
    "tx_depth",
    "rx_depth",
    "cq_mod",
    "post_list",
    "inline",
    "srq",
    "bidir",
    "fabric",
];

/// Server side: takes the client's `line` into `a` (see the module doc). Errors: one sentence
/// per refused parameter.
pub fn adopt(a: &mut Args, line: &str) -> Result<(), String> {
    let fabric = crate::setup::shm_fabric(a);
    let mut words = line.split(' ');
    let v = words.next().unwrap_or("");
    if v != VERSION {
        return Err(format!("the client speaks {v:?}, this server {VERSION:?} (use the same dp-perf on both sides)"));
    }
    let mut seen = Vec::with_capacity(KEYS.len());
    for w in words {
        let (k, theirs) =
            w.split_once('=').ok_or_else(|| format!("malformed parameter {w:?} from the client (want key=value)"))?;
        if !KEYS.contains(&k) || seen.contains(&k) {
            return Err(format!("unknown or repeated parameter {k:?} from the client (same dp-perf on both sides?)"));
        }
        seen.push(k);
        take(a, k, theirs, &fabric)?;
    }
    if let Some(k) = KEYS.iter().find(|k| !seen.contains(k)) {
        return Err(format!("the client did not send parameter {k:?} (same dp-perf on both sides?)"));
    }
    a.check()
}

fn take(a: &mut Args, key: &str, theirs: &str, fabric: &str) -> Result<(), String> {
    let num = |t: &str| t.parse::<u64>().map_err(|_| format!("the client sent {key}={t:?}, not a number"));
    let num32 = |t: &str| t.parse::<u32>().map_err(|_| format!("the client sent {key}={t:?}, not a number"));
    match key {
        "test" if theirs != name(a.test) => {
            Err(format!("the client runs {theirs}, this server {} (run the same test on both sides)", name(a.test)))
        }
        "provider" if theirs != name(a.provider) => {
            Err(format!("the client uses --provider {theirs}, this server --provider {}", name(a.provider)))
        }
        "test" | "provider" => Ok(()),
        "conn" => {
            let c = Conn::from_str(theirs, true).map_err(|_| format!("the client sent conn={theirs:?}"))?;
            agree(a, &["conn"], "-c", format!("{:?}", a.conn), theirs, |a| a.conn = c)
        }
        "sizes" => {
            let list: Vec<u64> = theirs.split(',').map(num).collect::<Result<_, _>>()?;
            if list.is_empty() {
                return Err(format!("the client sent sizes={theirs:?}"));
            }
            let allowed = a.size.unwrap_or(0).max(MAX_CLIENT_SIZE);
            for &s in &list {
                Args::check_size(s).map_err(|e| format!("the client sent sizes={s}: {e}"))?;
                if s > allowed {
                    return Err(format!(
                        "the client sent sizes={s}: this server takes at most {allowed} bytes from a client (give \
                         the server -s {s} to allow it)"
                    ));
                }
            }
            let cap = list.iter().copied().max().unwrap_or(0);
            let mine = a.sizes(cap).map(|s| s.iter().map(u64::to_string).collect::<Vec<_>>().join(","));
            let mine = mine.unwrap_or_else(|e| e);
            agree(a, &["size", "all"], "-s/-a", mine, theirs, |_| ())?;
            a.agreed_sizes = Some(list); // also when equal: the server's own list may differ by its MTU
            Ok(())
        }
        "iters" => {
            let n = num(theirs)?;
            agree(a, &["iters"], "-n", a.iterations().to_string(), theirs, |a| a.iters = Some(n))
        }
        "duration" => {
            let d = match theirs {
                "none" => None,
                t => Some(t.parse::<f64>().map_err(|_| format!("the client sent duration={t:?}"))?),
            };
            let mine = a.duration.map_or("none".into(), |d| d.to_string());
            agree(a, &["duration"], "-D", mine, theirs, |a| a.duration = d)
        }
        "qps" => {
            let n = num32(theirs)?;
            agree(a, &["qps"], "-q", a.qps.to_string(), theirs, |a| a.qps = n)
        }
        "tx_depth" => {
            let n = num32(theirs)?;
            agree(a, &["tx_depth"], "-t", a.tx_depth.to_string(), theirs, |a| a.tx_depth = n)
        }
        "rx_depth" => {
            let n = num32(theirs)?;
            agree(a, &["rx_depth"], "-r", a.rx_depth.to_string(), theirs, |a| a.rx_depth = n)
        }
        "cq_mod" => {
            let n = num32(theirs)?;
            agree(a, &["cq_mod"], "-Q", a.cq_mod.to_string(), theirs, |a| a.cq_mod = n)
        }
        "post_list" => {
            let n = num32(theirs)?;
            agree(a, &["post_list"], "-l", a.post_list.to_string(), theirs, |a| a.post_list = n)
        }
        "inline" => {
            let v = match theirs {
                "auto" => None,
                t => Some(num32(t)?),
            };
            let mine = a.inline.map_or("auto".into(), |v| v.to_string());
            agree(a, &["inline"], "-I", mine, theirs, |a| a.inline = v)
        }
        "srq" => {
            let on = theirs == "1";
            agree(a, &["use_srq"], "--use-srq", (a.use_srq as u8).to_string(), theirs, |a| a.use_srq = on)
        }
        "bidir" => {
            let on = theirs == "1";
            agree(a, &["bidirectional"], "-b", (a.bidirectional as u8).to_string(), theirs, |a| a.bidirectional = on)
        }
        "fabric" if a.provider == ProviderKind::shm => {
            let f = theirs.to_owned();
            agree(a, &["fabric"], "--fabric", fabric.to_owned(), theirs, |a| a.fabric = Some(f))
        }
        _ => Ok(()), // the fabric of rdma runs: not used
    }
}

/// Takes the client's value unless this side was given another one.
fn agree(
    a: &mut Args,
    ids: &[&str],
    flag: &str,
    mine: String,
    theirs: &str,
    set: impl FnOnce(&mut Args),
) -> Result<(), String> {
    if mine == theirs {
        return Ok(());
    }
    if ids.iter().any(|id| a.given(id)) {
        return Err(format!(
            "{flag} differs: the client has {theirs}, this server {mine} (give the same value on both sides, or \
             leave it out on the server)"
        ));
    }
    set(a);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, FromArgMatches};

    fn parse(argv: &[&str]) -> Args {
        let m = Args::command().try_get_matches_from(argv).unwrap();
        let mut a = Args::from_arg_matches(&m).unwrap();
        a.explicit = crate::given_ids(&m);
        a.check().unwrap();
        a
    }

    #[test]
    fn server_takes_what_it_was_not_given() {
        let c = parse(&["dp-perf", "write_bw", "host", "-s", "8", "-n", "77", "-q", "2", "-l", "4", "-D", "1.5"]);
        let line = to_wire(&c, &c.sizes(u64::MAX).unwrap(), "f");
        let mut s = parse(&["dp-perf", "write_bw"]);
        adopt(&mut s, &line).unwrap();
        assert_eq!(s.sizes(u64::MAX).unwrap(), vec![8]);
        assert_eq!((s.iterations(), s.qps, s.post_list, s.cq_mod, s.duration), (77, 2, 4, 4, Some(1.5)));
        assert_eq!(to_wire(&s, &[8], "f"), line, "both ends now describe the same run");
        // UD: the client's list is capped by its MTU; the server runs exactly that list.
        let c = parse(&["dp-perf", "send_bw", "host", "-c", "UD"]);
        let line = to_wire(&c, &c.sizes(1024).unwrap(), "f");
        let mut s = parse(&["dp-perf", "send_bw"]);
        adopt(&mut s, &line).unwrap();
        assert_eq!(s.sizes(u64::MAX).unwrap(), vec![1024]);
    }

    #[test]
    fn given_values_that_differ_are_refused_by_name() {
        let c = parse(&["dp-perf", "send_bw", "host", "-s", "8"]);
        let line = to_wire(&c, &[8], "f");
        let mut s = parse(&["dp-perf", "send_bw", "-s", "64"]);
        let e = adopt(&mut s, &line).unwrap_err();
        assert!(e.contains("-s/-a differs: the client has 8, this server 64"), "{e}");
        let mut s = parse(&["dp-perf", "send_lat"]);
        assert!(adopt(&mut s, &line).unwrap_err().contains("the client runs send_bw, this server send_lat"));
        let mut s = parse(&["dp-perf", "send_bw", "--provider", "rdma"]);
        assert!(adopt(&mut s, &line).unwrap_err().contains("--provider shm, this server --provider rdma"));
        let mut s = parse(&["dp-perf", "send_bw", "--fabric", "other"]);
        assert!(adopt(&mut s, &line).unwrap_err().contains("--fabric differs"));
    }

    #[test]
    fn hostile_sizes_are_refused_before_anything_is_allocated() {
        let c = parse(&["dp-perf", "send_bw", "host"]);
        let line = to_wire(&c, &[8], "f");
        for (bad, why) in [
            ("4294967296", "at most 4 GiB - 1"),
            ("18446744073709551615", "at most 4 GiB - 1"),
            ("0", "at least 1"),
            ("8,0", "at least 1"),
            ("16777216", "takes at most 8388608 bytes from a client"),
        ] {
            let mut s = parse(&["dp-perf", "send_bw"]);
            let e = adopt(&mut s, &line.replace("sizes=8", &format!("sizes={bad}"))).unwrap_err();
            assert!(e.contains(why), "sizes={bad}: {e}");
            assert!(e.contains("the client sent sizes="), "sizes={bad}: {e}");
        }
        // A server given the larger size itself takes it.
        let c = parse(&["dp-perf", "send_bw", "host", "-s", "16777216"]);
        let mut s = parse(&["dp-perf", "send_bw", "-s", "16777216"]);
        adopt(&mut s, &to_wire(&c, &[16777216], "f")).unwrap();
    }

    #[test]
    fn garbage_lines_are_errors() {
        let mut s = parse(&["dp-perf", "send_bw"]);
        assert!(adopt(&mut s, "hello").unwrap_err().contains("the client speaks \"hello\""));
        assert!(adopt(&mut s, "dp-perf/1 test=send_bw").unwrap_err().contains("did not send"));
        assert!(adopt(&mut s, "dp-perf/1 bogus=1").unwrap_err().contains("unknown or repeated"));
        let c = parse(&["dp-perf", "send_bw", "host"]);
        let line = to_wire(&c, &[8], "f").replace("iters=1000", "iters=lots");
        assert!(adopt(&mut s, &line).unwrap_err().contains("not a number"));
    }
}

//! IPv4 forwarding for the packet stages: a longest-prefix-match table and the per-frame
//! forwarding step of a router (RFC 1812 §5.2/§5.3 in short): check the frame and its IPv4
//! header, drop on TTL expiry, look the destination up, decrement the TTL with an
//! incremental checksum update (RFC 1624), rewrite the Ethernet addresses for the next hop.
//!
//! The table is a list sorted by prefix length, longest first, scanned in order: exact and
//! allocation-free, O(routes) per frame, which is what a few tens of static routes need. A
//! DIR-24-8 table (DPDK's `rte_lpm`) is the step for full tables.

use super::checksum;

/// One route: frames to `prefix/len` leave on `output` toward `next_hop_mac`, from `src_mac`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route {
    /// Network address (host bits zero).
    pub prefix: [u8; 4],
    /// Prefix length, 0..=32.
    pub len: u8,
    /// The stage output (port) the frame leaves on.
    pub output: usize,
    /// Destination MAC written into the frame: the next hop's (or the host's, on a
    /// connected network).
    pub next_hop_mac: [u8; 6],
    /// Source MAC written into the frame: the router's own on that output.
    pub src_mac: [u8; 6],
}

impl Route {
    fn mask(&self) -> u32 {
        if self.len == 0 {
            0
        } else {
            u32::MAX << (32 - u32::from(self.len))
        }
    }
}

/// Parses `"a.b.c.d/len"`; the error says what is wrong (host bits set, length above 32...).
pub fn parse_prefix(s: &str) -> Result<([u8; 4], u8), String> {
    let (a, l) = s.split_once('/').ok_or_else(|| format!("`{s}` is not a prefix (write a.b.c.d/len)"))?;
    let addr: std::net::Ipv4Addr = a.parse().map_err(|_| format!("`{a}` is not an IPv4 address"))?;
    let len: u8 = l.parse().ok().filter(|&l| l <= 32).ok_or_else(|| format!("prefix length `{l}` is not 0..=32"))?;
    let mask = if len == 0 { 0 } else { u32::MAX << (32 - u32::from(len)) };
    if u32::from(addr) & !mask != 0 {
        return Err(format!(
            "`{s}` has host bits set (the network is {}/{len})",
            std::net::Ipv4Addr::from(u32::from(addr) & mask)
        ));
    }
    Ok((addr.octets(), len))
}

/// Parses a MAC address written `02:00:00:00:00:01`.
pub fn parse_mac(s: &str) -> Result<[u8; 6], String> {
    let mut m = [0u8; 6];
    let mut it = s.split(':');
    for b in &mut m {
        *b = it
            .next()
            .filter(|p| p.len() == 2)
            .and_then(|p| u8::from_str_radix(p, 16).ok())
            .ok_or_else(|| format!("`{s}` is not a MAC address (write 02:00:00:00:00:01)"))?;
    }
    if it.next().is_some() {
        return Err(format!("`{s}` is not a MAC address (six bytes)"));
    }
    Ok(m)
}

/// A longest-prefix-match table.
#[derive(Debug, Clone, Default)]
pub struct Table {
    routes: Vec<Route>,
}

impl Table {
    /// A table of `routes` (their order does not matter: the longest prefix wins; of two
    /// routes with the same prefix the first given is kept).
    pub fn new(mut routes: Vec<Route>) -> Table {
        routes.sort_by_key(|r| std::cmp::Reverse(r.len));
        Table { routes }
    }

    /// The route for `dst`: the longest prefix that contains it.
    #[inline]
    pub fn lookup(&self, dst: [u8; 4]) -> Option<&Route> {
        let d = u32::from_be_bytes(dst);
        self.routes.iter().find(|r| d & r.mask() == u32::from_be_bytes(r.prefix))
    }

    /// The routes, longest prefix first.
    pub fn routes(&self) -> &[Route] {
        &self.routes
    }
}

/// Why a frame was not forwarded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drop {
    /// Not IPv4 (ARP, IPv6, VLAN-tagged...): a router of IPv4 frames leaves them alone.
    NotIpv4,
    /// Shorter than its headers say, or a bad version or header length.
    Malformed,
    /// The IPv4 header checksum does not verify.
    BadChecksum,
    /// TTL 0 or 1 on arrival (RFC 1812 §5.3.1: a router sends ICMP Time Exceeded; this one
    /// drops and counts).
    TtlExpired,
    /// No route to the destination.
    NoRoute,
}

impl Drop {
    /// Every reason, in report order.
    pub const ALL: [Drop; 5] = [Drop::NotIpv4, Drop::Malformed, Drop::BadChecksum, Drop::TtlExpired, Drop::NoRoute];

    /// The counter's name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Drop::NotIpv4 => "drop_not_ipv4",
            Drop::Malformed => "drop_malformed",
            Drop::BadChecksum => "drop_bad_checksum",
            Drop::TtlExpired => "drop_ttl_expired",
            Drop::NoRoute => "drop_no_route",
        }
    }
}

/// Forwards Ethernet frame `f` in place: returns the output it leaves on, having decremented
/// its TTL (with the header checksum updated) and rewritten its MAC addresses; or why not,
/// having changed nothing.
#[inline]
pub fn forward(table: &Table, f: &mut [u8]) -> Result<usize, Drop> {
    if f.len() < 14 || f[12..14] != [0x08, 0x00] {
        return Err(if f.len() < 14 { Drop::Malformed } else { Drop::NotIpv4 });
    }
    let ip = &f[14..];
    if ip.len() < 20 || ip[0] >> 4 != 4 {
        return Err(Drop::Malformed);
    }
    let ihl = usize::from(ip[0] & 0x0f) * 4;
    let total = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
    if ihl < 20 || ip.len() < ihl || total < ihl || total > ip.len() {
        return Err(Drop::Malformed);
    }
    if checksum::finish(checksum::accumulate(0, &ip[..ihl])) != 0 {
        return Err(Drop::BadChecksum);
    }
    let ttl = ip[8];
    if ttl <= 1 {
        return Err(Drop::TtlExpired);
    }
    let r = table.lookup([ip[16], ip[17], ip[18], ip[19]]).ok_or(Drop::NoRoute)?;
    let (output, dst, src) = (r.output, r.next_hop_mac, r.src_mac);
    let proto = ip[9];
    let csum = u16::from_be_bytes([ip[10], ip[11]]);
    let csum = checksum::update16(csum, u16::from_be_bytes([ttl, proto]), u16::from_be_bytes([ttl - 1, proto]));
    f[14 + 8] = ttl - 1;
    f[14 + 10..14 + 12].copy_from_slice(&csum.to_be_bytes());
    f[..6].copy_from_slice(&dst);
    f[6..12].copy_from_slice(&src);
    Ok(output)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(p: &str, output: usize) -> Route {
        let (prefix, len) = parse_prefix(p).unwrap();
        Route {
            prefix,
            len,
            output,
            next_hop_mac: [2, 0, 0, 0, 0, output as u8],
            src_mac: [2, 0, 0, 0, 1, output as u8],
        }
    }

    fn frame(dst: [u8; 4], ttl: u8) -> Vec<u8> {
        let mut f = vec![0xff; 12];
        f.extend_from_slice(&[0x08, 0x00]);
        let mut ip = vec![0x45, 0, 0, 28, 0, 1, 0, 0, ttl, 17, 0, 0, 10, 0, 0, 1];
        ip.extend_from_slice(&dst);
        ip.extend_from_slice(&[0x30, 0x39, 0, 53, 0, 8, 0, 0]);
        let c = checksum::ipv4_header(&ip[..20]);
        ip[10..12].copy_from_slice(&c.to_be_bytes());
        f.extend_from_slice(&ip);
        f
    }

    #[test]
    fn longest_prefix_wins_whatever_the_order() {
        let t = Table::new(vec![
            route("0.0.0.0/0", 0),
            route("10.0.0.0/8", 1),
            route("10.1.2.0/24", 2),
            route("10.1.0.0/16", 3),
        ]);
        assert_eq!(t.lookup([10, 1, 2, 3]).map(|r| r.output), Some(2));
        assert_eq!(t.lookup([10, 1, 3, 3]).map(|r| r.output), Some(3));
        assert_eq!(t.lookup([10, 9, 9, 9]).map(|r| r.output), Some(1));
        assert_eq!(t.lookup([192, 0, 2, 1]).map(|r| r.output), Some(0));
        let t = Table::new(vec![route("10.0.0.0/8", 1)]);
        assert_eq!(t.lookup([11, 0, 0, 1]), None);
        assert_eq!(Table::new(vec![route("10.0.0.1/32", 4)]).lookup([10, 0, 0, 1]).map(|r| r.output), Some(4));
    }

    #[test]
    fn forwarding_decrements_ttl_keeps_the_checksum_valid_and_rewrites_macs() {
        let t = Table::new(vec![route("10.2.0.0/16", 1)]);
        for ttl in [2u8, 64, 255] {
            let mut f = frame([10, 2, 0, 7], ttl);
            assert_eq!(forward(&t, &mut f), Ok(1));
            assert_eq!(f[22], ttl - 1);
            assert_eq!(checksum::finish(checksum::accumulate(0, &f[14..34])), 0, "ttl {ttl}: header verifies");
            let fresh = checksum::ipv4_header(&{
                let mut h = f[14..34].to_vec();
                h[10..12].fill(0);
                h
            });
            assert_eq!(u16::from_be_bytes([f[24], f[25]]), fresh, "incremental = recomputed");
            assert_eq!(&f[..6], &[2, 0, 0, 0, 0, 1]);
            assert_eq!(&f[6..12], &[2, 0, 0, 0, 1, 1]);
        }
    }

    #[test]
    fn drops_change_nothing_and_say_why() {
        let t = Table::new(vec![route("10.2.0.0/16", 1)]);
        let cases: [(Vec<u8>, Drop); 6] = [
            (frame([10, 2, 0, 7], 1), Drop::TtlExpired),
            (frame([10, 2, 0, 7], 0), Drop::TtlExpired),
            (frame([10, 3, 0, 7], 64), Drop::NoRoute),
            (
                {
                    let mut f = frame([10, 2, 0, 7], 64);
                    f[12] = 0x86;
                    f[13] = 0xdd;
                    f
                },
                Drop::NotIpv4,
            ),
            (
                {
                    let mut f = frame([10, 2, 0, 7], 64);
                    f[24] ^= 1;
                    f
                },
                Drop::BadChecksum,
            ),
            (
                {
                    let mut f = frame([10, 2, 0, 7], 64);
                    f.truncate(30);
                    f
                },
                Drop::Malformed,
            ),
        ];
        for (mut f, why) in cases {
            let before = f.clone();
            assert_eq!(forward(&t, &mut f), Err(why));
            assert_eq!(f, before, "{why:?}: unchanged");
        }
        assert_eq!(forward(&t, &mut [0u8; 10]), Err(Drop::Malformed));
    }

    #[test]
    fn prefixes_and_macs_parse_with_reasons() {
        assert_eq!(parse_prefix("10.1.0.0/16"), Ok(([10, 1, 0, 0], 16)));
        assert_eq!(parse_prefix("0.0.0.0/0"), Ok(([0; 4], 0)));
        assert!(parse_prefix("10.1.0.1/16").unwrap_err().contains("host bits"));
        assert!(parse_prefix("10.1.0.0/33").unwrap_err().contains("0..=32"));
        assert!(parse_prefix("10.1.0.0").unwrap_err().contains("a.b.c.d/len"));
        assert_eq!(parse_mac("02:00:00:00:0a:01"), Ok([2, 0, 0, 0, 0x0a, 1]));
        assert!(parse_mac("02:00:00:00:0a").is_err());
        assert!(parse_mac("02:00:00:00:0a:01:ff").is_err());
        assert!(parse_mac("2:0:0:0:a:1").is_err());
    }
}

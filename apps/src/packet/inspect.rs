//! Stages that read headers: `parse` (counts frames per protocol, refuses malformed ones) and
//! `acl` (first-match pass/drop rules on EtherType, protocol, addresses and ports). Both read
//! with [`Headers::parse`], which checks every length against the frame; a frame it refuses
//! goes to the stage's second output when it has one (to capture it, say), and is dropped
//! otherwise, counted per reason.

use dataplane::net::headers::{Headers, Malformed, Network, Transport, ETHER_ARP, ETHER_IPV4, ETHER_IPV6};
use dataplane::pipeline::{Handler, Msg, StageCx, StageReport};
use serde::de::{self, Deserializer, Visitor};
use serde::Deserialize;
use std::net::IpAddr;

fn yes() -> bool {
    true
}

/// `parse` parameters.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ParseParams {
    /// Refuse IPv4 headers whose checksum does not verify (default true).
    #[serde(default = "yes")]
    verify_ipv4_checksum: bool,
}

/// What `parse` counts of the frames that parsed (reported under these names).
#[derive(Debug, Default, Clone, Copy)]
struct Classes {
    ipv4: u64,
    ipv6: u64,
    arp: u64,
    other_ethertype: u64,
    tcp: u64,
    udp: u64,
    icmp: u64,
    vlan_tagged: u64,
    /// IPv4 fragments after the first (no transport header of their own).
    fragments: u64,
}

impl Classes {
    fn count(&mut self, h: &Headers) {
        match h.network {
            Network::Ipv4 { later_fragment, .. } => {
                self.ipv4 += 1;
                self.fragments += u64::from(later_fragment);
            }
            Network::Ipv6 { .. } => self.ipv6 += 1,
            Network::Arp => self.arp += 1,
            Network::Other => self.other_ethertype += 1,
        }
        match h.transport {
            Transport::Tcp { .. } => self.tcp += 1,
            Transport::Udp { .. } => self.udp += 1,
            Transport::Icmp { .. } => self.icmp += 1,
            Transport::None => {}
        }
        self.vlan_tagged += u64::from(h.vlans > 0);
    }

    /// The counts with their report names, in a fixed order.
    fn named(&self) -> [(&'static str, u64); 9] {
        [
            ("ipv4", self.ipv4),
            ("ipv6", self.ipv6),
            ("arp", self.arp),
            ("other_ethertype", self.other_ethertype),
            ("tcp", self.tcp),
            ("udp", self.udp),
            ("icmp", self.icmp),
            ("vlan_tagged", self.vlan_tagged),
            ("fragments", self.fragments),
        ]
    }
}

/// Checks and classifies frames: well-formed ones go to output 0, malformed ones to output 1
/// (if the stage has one) or are dropped.
pub struct Parse {
    verify: bool,
    classes: Classes,
    /// Refused frames per reason, indexed by `Malformed as usize`.
    malformed: [u64; Malformed::ALL.len()],
}

impl Parse {
    pub(super) fn new(p: &ParseParams) -> Parse {
        Parse { verify: p.verify_ipv4_checksum, classes: Classes::default(), malformed: [0; Malformed::ALL.len()] }
    }
}

/// Sends a frame that did not parse to output 1, or drops it.
fn refuse(msg: Msg, cx: &mut StageCx<'_>) {
    if cx.outputs() > 1 {
        cx.send(1, msg);
    } else {
        cx.drop_msg(msg);
    }
}

impl Handler for Parse {
    #[inline]
    fn on_message(&mut self, msg: Msg, cx: &mut StageCx<'_>) {
        match Headers::parse(cx.bytes(&msg), self.verify) {
            Ok(h) => {
                self.classes.count(&h);
                cx.send(0, msg);
            }
            Err(why) => {
                self.malformed[why as usize] += 1;
                refuse(msg, cx);
            }
        }
    }

    fn report(&self) -> StageReport {
        let mut values: Vec<_> = self.classes.named().to_vec();
        values.extend(Malformed::ALL.iter().map(|m| (m.name(), self.malformed[*m as usize])));
        StageReport { values, ..Default::default() }
    }
}

/// What a rule does with the frames it matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub(super) enum Action {
    /// To output 0.
    Pass,
    /// To output 1, or dropped.
    #[default]
    Drop,
}

/// A value written as a number or a name (`proto = 17` or `proto = "udp"`; `dst_port = 53`
/// or `dst_port = "1024-65535"`).
#[derive(Debug, Clone)]
pub(super) enum NumOrName {
    Num(u64),
    Name(String),
}

impl<'de> Deserialize<'de> for NumOrName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = NumOrName;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a number or a string")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<NumOrName, E> {
                Ok(NumOrName::Num(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<NumOrName, E> {
                u64::try_from(v).map(NumOrName::Num).map_err(|_| E::custom(format!("{v} is negative")))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<NumOrName, E> {
                Ok(NumOrName::Name(v.to_owned()))
            }
        }
        d.deserialize_any(V)
    }
}

/// `acl` parameters.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct AclParams {
    /// What happens to a frame no rule matches (default `"drop"`).
    #[serde(default)]
    default: Action,
    /// The rules, first match wins.
    rules: Vec<RuleParams>,
}

/// One rule as written; every field given must match (an absent field matches anything).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RuleParams {
    action: Action,
    ether_type: Option<NumOrName>,
    proto: Option<NumOrName>,
    src: Option<String>,
    dst: Option<String>,
    src_port: Option<NumOrName>,
    dst_port: Option<NumOrName>,
}

/// An address prefix of either family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Prefix {
    V4 { addr: u32, mask: u32 },
    V6 { addr: u128, mask: u128 },
}

impl Prefix {
    /// `a.b.c.d/len`, `x::y/len`, or an address alone (all of it).
    fn parse(s: &str) -> Result<Prefix, String> {
        let (a, l) = s.split_once('/').map_or((s, None), |(a, l)| (a, Some(l)));
        let addr: IpAddr = a.parse().map_err(|_| format!("`{a}` is not an IPv4 or IPv6 address"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let len: u32 = match l {
            None => max,
            Some(l) => {
                l.parse().ok().filter(|&n| n <= max).ok_or_else(|| format!("prefix length `{l}` is not 0..={max}"))?
            }
        };
        let p = match addr {
            IpAddr::V4(a) => Prefix::V4 { addr: u32::from(a), mask: u32::MAX.checked_shl(32 - len).unwrap_or(0) },
            IpAddr::V6(a) => Prefix::V6 { addr: u128::from(a), mask: u128::MAX.checked_shl(128 - len).unwrap_or(0) },
        };
        let host_bits = match p {
            Prefix::V4 { addr, mask } => addr & !mask != 0,
            Prefix::V6 { addr, mask } => addr & !mask != 0,
        };
        if host_bits {
            return Err(format!("`{s}` has host bits set"));
        }
        Ok(p)
    }

    fn contains(&self, n: &Network, src: bool) -> bool {
        match (self, n) {
            (Prefix::V4 { addr, mask }, Network::Ipv4 { src: s, dst: d, .. }) => {
                u32::from_be_bytes(if src { *s } else { *d }) & mask == *addr
            }
            (Prefix::V6 { addr, mask }, Network::Ipv6 { src: s, dst: d, .. }) => {
                u128::from_be_bytes(if src { *s } else { *d }) & mask == *addr
            }
            _ => false,
        }
    }
}

/// One rule, checked.
#[derive(Debug, Clone)]
struct Rule {
    action: Action,
    ether_type: Option<u16>,
    proto: Option<u8>,
    src: Option<Prefix>,
    dst: Option<Prefix>,
    src_port: Option<(u16, u16)>,
    dst_port: Option<(u16, u16)>,
}

impl Rule {
    fn parse(r: &RuleParams) -> Result<Rule, String> {
        let ether_type = match &r.ether_type {
            None => None,
            Some(NumOrName::Num(n)) => {
                Some(u16::try_from(*n).map_err(|_| format!("ether_type: {n} is not 0..=65535"))?)
            }
            Some(NumOrName::Name(s)) => Some(match s.as_str() {
                "ipv4" => ETHER_IPV4,
                "ipv6" => ETHER_IPV6,
                "arp" => ETHER_ARP,
                _ => return Err(format!("ether_type: `{s}` is not ipv4, ipv6, arp or a number")),
            }),
        };
        let proto = match &r.proto {
            None => None,
            Some(NumOrName::Num(n)) => Some(u8::try_from(*n).map_err(|_| format!("proto: {n} is not 0..=255"))?),
            Some(NumOrName::Name(s)) => Some(match s.as_str() {
                "icmp" => 1,
                "tcp" => 6,
                "udp" => 17,
                "icmpv6" => 58,
                _ => return Err(format!("proto: `{s}` is not tcp, udp, icmp, icmpv6 or a number")),
            }),
        };
        let port = |f: &str, v: &Option<NumOrName>| -> Result<Option<(u16, u16)>, String> {
            let one = |s: &str| s.trim().parse::<u16>().map_err(|_| format!("{f}: `{s}` is not a port (0-65535)"));
            match v {
                None => Ok(None),
                Some(NumOrName::Num(n)) => {
                    let p = u16::try_from(*n).map_err(|_| format!("{f}: {n} is not a port (0-65535)"))?;
                    Ok(Some((p, p)))
                }
                Some(NumOrName::Name(s)) => {
                    let (a, b) = match s.split_once('-') {
                        Some((a, b)) => (one(a)?, one(b)?),
                        None => (one(s)?, one(s)?),
                    };
                    if a > b {
                        return Err(format!("{f}: `{s}` is an empty range"));
                    }
                    Ok(Some((a, b)))
                }
            }
        };
        let rule = Rule {
            action: r.action,
            ether_type,
            proto,
            src: r.src.as_deref().map(Prefix::parse).transpose().map_err(|e| format!("src: {e}"))?,
            dst: r.dst.as_deref().map(Prefix::parse).transpose().map_err(|e| format!("dst: {e}"))?,
            src_port: port("src_port", &r.src_port)?,
            dst_port: port("dst_port", &r.dst_port)?,
        };
        let ports = rule.src_port.is_some() || rule.dst_port.is_some();
        if ports && rule.proto.is_some_and(|p| p != 6 && p != 17) {
            return Err("a port is given with a protocol other than tcp or udp: the rule could never match".into());
        }
        if let (Some(Prefix::V4 { .. }), Some(Prefix::V6 { .. })) | (Some(Prefix::V6 { .. }), Some(Prefix::V4 { .. })) =
            (rule.src, rule.dst)
        {
            return Err("src and dst are of different address families: the rule could never match".into());
        }
        Ok(rule)
    }

    #[inline]
    fn matches(&self, h: &Headers) -> bool {
        let in_range = |r: Option<(u16, u16)>, p: Option<u16>| match (r, p) {
            (None, _) => true,
            (Some((a, b)), Some(p)) => (a..=b).contains(&p),
            (Some(_), None) => false,
        };
        let ports = h.ports();
        self.ether_type.is_none_or(|e| e == h.ether_type)
            && self.proto.is_none_or(|p| h.ip_proto == Some(p))
            && self.src.is_none_or(|s| s.contains(&h.network, true))
            && self.dst.is_none_or(|d| d.contains(&h.network, false))
            && in_range(self.src_port, ports.map(|p| p.0))
            && in_range(self.dst_port, ports.map(|p| p.1))
    }
}

/// The most rules an `acl` takes (each has its hit counter in the summary).
pub const MAX_RULES: usize = 32;

/// The summary names of the rules' hit counters.
const RULE_HITS: [&str; MAX_RULES] = [
    "rule_0", "rule_1", "rule_2", "rule_3", "rule_4", "rule_5", "rule_6", "rule_7", "rule_8", "rule_9", "rule_10",
    "rule_11", "rule_12", "rule_13", "rule_14", "rule_15", "rule_16", "rule_17", "rule_18", "rule_19", "rule_20",
    "rule_21", "rule_22", "rule_23", "rule_24", "rule_25", "rule_26", "rule_27", "rule_28", "rule_29", "rule_30",
    "rule_31",
];

/// First-match pass/drop rules. Frames that pass go to output 0; frames denied (by a rule,
/// by the default, or because they do not parse) go to output 1 if the stage has one, else
/// are dropped. Rules are scanned in order: a few tens of rules cost a few tens of compares.
pub struct Acl {
    rules: Vec<Rule>,
    default: Action,
    hits: [u64; MAX_RULES],
    passed: u64,
    denied: u64,
    by_default: u64,
    malformed: u64,
}

impl Acl {
    /// The ACL these parameters describe; the error names the rule and field.
    pub(super) fn new(p: &AclParams) -> Result<Acl, String> {
        if p.rules.len() > MAX_RULES {
            return Err(format!("{} rules: an acl stage takes at most {MAX_RULES}", p.rules.len()));
        }
        let rules = p
            .rules
            .iter()
            .enumerate()
            .map(|(i, r)| Rule::parse(r).map_err(|e| format!("rules[{i}].{e}")))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Acl { rules, default: p.default, hits: [0; MAX_RULES], passed: 0, denied: 0, by_default: 0, malformed: 0 })
    }

    /// What the rules do with a frame of headers `h`.
    #[inline]
    fn decide(&mut self, h: &Headers) -> Action {
        for (i, r) in self.rules.iter().enumerate() {
            if r.matches(h) {
                self.hits[i] += 1;
                return r.action;
            }
        }
        self.by_default += 1;
        self.default
    }
}

impl Handler for Acl {
    #[inline]
    fn on_message(&mut self, msg: Msg, cx: &mut StageCx<'_>) {
        let action = match Headers::parse(cx.bytes(&msg), false) {
            Ok(h) => self.decide(&h),
            Err(_) => {
                self.malformed += 1;
                Action::Drop
            }
        };
        if action == Action::Pass {
            self.passed += 1;
            cx.send(0, msg);
        } else {
            self.denied += 1;
            refuse(msg, cx);
        }
    }

    fn report(&self) -> StageReport {
        let mut values = vec![
            ("passed", self.passed),
            ("denied", self.denied),
            ("no_rule_matched", self.by_default),
            ("malformed", self.malformed),
        ];
        values.extend(RULE_HITS.iter().copied().zip(self.hits).take(self.rules.len()));
        StageReport { values, ..Default::default() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(action: Action) -> RuleParams {
        RuleParams { action, ether_type: None, proto: None, src: None, dst: None, src_port: None, dst_port: None }
    }

    /// Ethernet + IPv4 + UDP from 10.0.0.1:`sport` to `dst`:`dport`.
    fn udp(dst: [u8; 4], sport: u16, dport: u16) -> Vec<u8> {
        let mut f = vec![2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1, 0x08, 0x00];
        f.extend_from_slice(&[0x45, 0, 0, 28, 0, 1, 0, 0, 64, 17, 0, 0, 10, 0, 0, 1]);
        f.extend_from_slice(&dst);
        f.extend_from_slice(&sport.to_be_bytes());
        f.extend_from_slice(&dport.to_be_bytes());
        f.extend_from_slice(&[0, 8, 0, 0]);
        f
    }

    #[test]
    fn first_match_wins_and_the_default_takes_the_rest() {
        let mut r0 = rule(Action::Drop);
        r0.src_port = Some(NumOrName::Num(666));
        let mut r1 = rule(Action::Pass);
        r1.proto = Some(NumOrName::Name("udp".into()));
        r1.dst = Some("10.2.0.0/16".into());
        r1.dst_port = Some(NumOrName::Name("5000-5999".into()));
        let mut acl = Acl::new(&AclParams { default: Action::Drop, rules: vec![r0, r1] }).unwrap();
        let mut d = |f: Vec<u8>| acl.decide(&Headers::parse(&f, false).unwrap());
        assert_eq!(d(udp([10, 2, 3, 4], 1, 5000)), Action::Pass);
        assert_eq!(d(udp([10, 2, 3, 4], 1, 5999)), Action::Pass);
        assert_eq!(d(udp([10, 2, 3, 4], 1, 6000)), Action::Drop, "port out of range: default");
        assert_eq!(d(udp([10, 3, 3, 4], 1, 5000)), Action::Drop, "address out of prefix: default");
        assert_eq!(d(udp([10, 2, 3, 4], 666, 5000)), Action::Drop, "rule 0 first");
        assert_eq!((acl.hits[0], acl.hits[1], acl.by_default), (1, 2, 2));
    }

    #[test]
    fn bad_rules_are_refused_with_their_index_and_field() {
        let bad = |f: &dyn Fn(&mut RuleParams)| {
            let mut r = rule(Action::Pass);
            f(&mut r);
            Acl::new(&AclParams { default: Action::Drop, rules: vec![rule(Action::Drop), r] }).err().unwrap()
        };
        assert_eq!(
            bad(&|r| r.proto = Some(NumOrName::Name("sctp".into()))),
            "rules[1].proto: `sctp` is not tcp, udp, icmp, icmpv6 or a number"
        );
        assert_eq!(
            bad(&|r| r.dst_port = Some(NumOrName::Num(70000))),
            "rules[1].dst_port: 70000 is not a port (0-65535)"
        );
        assert_eq!(
            bad(&|r| r.dst_port = Some(NumOrName::Name("9-3".into()))),
            "rules[1].dst_port: `9-3` is an empty range"
        );
        assert_eq!(bad(&|r| r.src = Some("10.0.0.1/8".into())), "rules[1].src: `10.0.0.1/8` has host bits set");
        assert!(bad(&|r| {
            r.proto = Some(NumOrName::Name("icmp".into()));
            r.dst_port = Some(NumOrName::Num(80));
        })
        .contains("could never match"));
        assert!(bad(&|r| {
            r.src = Some("10.0.0.0/8".into());
            r.dst = Some("fe80::/10".into());
        })
        .contains("different address families"));
    }

    #[test]
    fn prefixes_match_their_family_only() {
        let p = Prefix::parse("fe80::/10").unwrap();
        let v6 =
            Network::Ipv6 { src: [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1], dst: [0; 16], hop_limit: 1 };
        assert!(p.contains(&v6, true) && !p.contains(&v6, false));
        let v4 = Network::Ipv4 { src: [10, 0, 0, 1], dst: [10, 0, 0, 2], ttl: 1, later_fragment: false };
        assert!(!p.contains(&v4, true));
        assert!(Prefix::parse("10.0.0.2").unwrap().contains(&v4, false));
        assert!(Prefix::parse("0.0.0.0/0").unwrap().contains(&v4, true));
    }
}

//! Which connections stay on TCP by the operator's word: `sluice smc run --tcp RULE`.
//!
//! A rule is a port (`5432`), a port range (`8000-8099`), an address or network
//! (`10.1.0.0/16`, `fd00::/8`), an address or network with a port or range
//! (`10.1.0.0/16:443`, `[fd00::1]:443`), or a program (`prog:NAME`, the executable's base
//! name). The launcher parses the rules to refuse a bad one with what is accepted, and
//! hands them to the library in `SLUICE_SMC` (`tcp=RULE`, once per rule) in the form
//! they were written; the library parses them again with this same parser.

use std::net::{IpAddr, SocketAddr};

/// One rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Rule {
    /// Addresses (a network: address and prefix length) and ports (an inclusive range;
    /// all ports when `None`). A rule of ports alone has no network.
    Peer {
        /// The network, or `None` for any address.
        net: Option<(IpAddr, u8)>,
        /// The ports, or `None` for any port.
        ports: Option<(u16, u16)>,
    },
    /// A program, by the base name of its executable.
    Program(String),
}

/// What `--tcp` accepts, for error messages.
pub const FORMS: &str = "a port (5432), a port range (8000-8099), an address or network (10.1.0.0/16, fd00::/8), \
     one with a port (10.1.0.0/16:443, [fd00::1]:443) or a program (prog:curl)";

impl Rule {
    /// Parses one rule.
    pub fn parse(s: &str) -> Result<Rule, String> {
        let t = s.trim();
        let bad = |why: &str| Err(format!("{t:?} is not a rule ({why}); a rule is {FORMS}"));
        if let Some(name) = t.strip_prefix("prog:") {
            if name.is_empty() || name.contains('/') || name.len() > 255 {
                return bad("a program is named by its executable's base name");
            }
            return Ok(Rule::Program(name.to_string()));
        }
        if t.is_empty() {
            return bad("empty");
        }
        if t.bytes().all(|b| b.is_ascii_digit() || b == b'-') {
            return match ports(t) {
                Some(p) => Ok(Rule::Peer { net: None, ports: Some(p) }),
                None => bad("ports are 1 to 65535, a range low-high"),
            };
        }
        // An address or network, with a port after it: `[v6]/len:port`, `v4/len:port`.
        let (addr, port) = if let Some(rest) = t.strip_prefix('[') {
            let Some((inside, after)) = rest.split_once(']') else { return bad("an unclosed [") };
            let (inside, after) = match after.split_once(':') {
                Some((len, p)) => (format!("{inside}{len}"), Some(p)),
                None => (format!("{inside}{after}"), None),
            };
            (inside, after)
        } else if t.matches(':').count() == 1 && t.contains('.') {
            let (a, p) = t.split_once(':').expect("one colon");
            (a.to_string(), Some(p))
        } else {
            (t.to_string(), None)
        };
        let ports = match port {
            Some(p) => match ports(p) {
                Some(p) => Some(p),
                None => return bad("ports are 1 to 65535, a range low-high"),
            },
            None => None,
        };
        let (ip, len) = match addr.split_once('/') {
            Some((a, l)) => (a, Some(l)),
            None => (addr.as_str(), None),
        };
        let Ok(ip) = ip.parse::<IpAddr>() else { return bad("not an address") };
        let max = if ip.is_ipv4() { 32 } else { 128 };
        let len = match len.map(str::parse::<u8>) {
            None => max,
            Some(Ok(l)) if l <= max => l,
            Some(_) => return bad("the prefix length is longer than the address"),
        };
        Ok(Rule::Peer { net: Some((ip, len)), ports })
    }

    /// True if a connection with `addr` (the peer, for a client; the local address, for
    /// a listener) falls under the rule. An IPv4 address mapped into IPv6 is taken as
    /// IPv4.
    pub fn covers(&self, addr: SocketAddr) -> bool {
        let Rule::Peer { net, ports } = self else { return false };
        if let Some((lo, hi)) = ports
            && !(*lo..=*hi).contains(&addr.port())
        {
            return false;
        }
        match net {
            None => true,
            Some((net, len)) => within(addr.ip().to_canonical(), *net, *len),
        }
    }
}

/// `5432` or `8000-8099` (1 to 65535, low ≤ high).
fn ports(s: &str) -> Option<(u16, u16)> {
    let (lo, hi) = match s.split_once('-') {
        Some((a, b)) => (a.parse::<u16>().ok()?, b.parse::<u16>().ok()?),
        None => {
            let p = s.parse::<u16>().ok()?;
            (p, p)
        }
    };
    (lo >= 1 && lo <= hi).then_some((lo, hi))
}

/// True if `ip` lies in `net`/`len` (of the same family).
fn within(ip: IpAddr, net: IpAddr, len: u8) -> bool {
    let (a, b, bits) = match (ip, net) {
        (IpAddr::V4(a), IpAddr::V4(b)) => (u128::from(u32::from(a)), u128::from(u32::from(b)), 32),
        (IpAddr::V6(a), IpAddr::V6(b)) => (u128::from(a), u128::from(b), 128),
        _ => return false,
    };
    let shift = bits - u32::from(len);
    shift >= bits || (a >> shift) == (b >> shift)
}

/// A program's rules.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Rules {
    rules: Vec<Rule>,
}

impl Rules {
    /// The most rules a program takes (more are ignored by the library; the launcher
    /// refuses them).
    pub const MAX: usize = 64;

    /// Adds a rule (ignored past [`Rules::MAX`]).
    pub fn push(&mut self, r: Rule) {
        if self.rules.len() < Self::MAX {
            self.rules.push(r);
        }
    }

    /// True without any rule.
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// True if a rule covers `addr` (see [`Rule::covers`]).
    pub fn cover(&self, addr: SocketAddr) -> bool {
        self.rules.iter().any(|r| r.covers(addr))
    }

    /// True if a rule names program `name` (an executable's base name).
    pub fn name_program(&self, name: &str) -> bool {
        self.rules.iter().any(|r| matches!(r, Rule::Program(p) if p == name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn every_form_parses_and_covers_what_it_says() {
        let r = |s: &str| Rule::parse(s).unwrap();
        assert!(r("5432").covers(a("10.0.0.1:5432")) && !r("5432").covers(a("10.0.0.1:5433")));
        assert!(r("8000-8099").covers(a("[::1]:8050")) && !r("8000-8099").covers(a("[::1]:8100")));
        assert!(r("10.1.0.0/16").covers(a("10.1.200.3:80")) && !r("10.1.0.0/16").covers(a("10.2.0.1:80")));
        assert!(r("10.1.2.3").covers(a("10.1.2.3:1")) && !r("10.1.2.3").covers(a("10.1.2.4:1")));
        assert!(r("10.1.0.0/16:443").covers(a("10.1.0.9:443")) && !r("10.1.0.0/16:443").covers(a("10.1.0.9:80")));
        assert!(r("[fd00::1]:443").covers(a("[fd00::1]:443")) && !r("[fd00::1]:443").covers(a("[fd00::2]:443")));
        assert!(r("[fd00::]/8:1-1024").covers(a("[fd12::5]:22")));
        assert!(r("fd00::/8").covers(a("[fdff::1]:9")) && !r("fd00::/8").covers(a("[fe80::1]:9")));
        assert!(r("0.0.0.0/0").covers(a("192.0.2.1:7")) && !r("0.0.0.0/0").covers(a("[2001:db8::1]:7")));
        // An IPv4 peer seen through an IPv6 socket is IPv4's.
        assert!(r("127.0.0.0/8").covers(a("[::ffff:127.0.0.1]:80")));
        assert_eq!(r("prog:curl"), Rule::Program("curl".into()));
        assert!(!r("prog:curl").covers(a("10.0.0.1:80")));
    }

    #[test]
    fn bad_rules_are_refused_saying_what_a_rule_is() {
        for s in [
            "",
            "0",
            "70000",
            "90-80",
            "10.1.0.0/33",
            "fd00::/129",
            "[fd00::1",
            "host.example",
            "prog:",
            "prog:/bin/sh",
            "10.0.0.1:x",
        ] {
            let e = Rule::parse(s).unwrap_err();
            assert!(e.contains("a rule is a port"), "{s}: {e}");
        }
    }

    #[test]
    fn a_set_of_rules_covers_peers_and_names_programs() {
        let mut rs = Rules::default();
        assert!(rs.is_empty() && !rs.cover(a("10.0.0.1:80")));
        rs.push(Rule::parse("80").unwrap());
        rs.push(Rule::parse("prog:psql").unwrap());
        assert!(rs.cover(a("10.0.0.1:80")) && !rs.cover(a("10.0.0.1:81")));
        assert!(rs.name_program("psql") && !rs.name_program("curl"));
        for _ in 0..100 {
            rs.push(Rule::parse("1").unwrap());
        }
        assert_eq!(rs.rules.len(), Rules::MAX);
    }
}

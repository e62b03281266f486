//! Security groups: each port's rules (allow, deny, allow-related), checked, bounded and
//! compiled into classes, and the decision's half that reads them.
//!
//! A rule names a direction (`in`: what the port's guest sends; `out`: what the switch
//! sends to it), an action and what it matches: an EtherType, IPv4/IPv6 source and
//! destination prefixes, a protocol, destination ports (one or a range), an ICMP type. Rules
//! are tried by priority (higher first; equal priorities in the order they were added);
//! the first match decides, else the port's default for that direction (`allow` unless
//! set). Rules and defaults apply to IPv4 and IPv6 frames; another EtherType is only
//! judged by rules that name it.
//!
//! *Compiled*, once per change: every prefix any rule names is an address class (a frame's
//! address is in the class of the longest such prefix that holds it, or in class 0), every
//! port range splits the ports into intervals (a frame's destination port is in the class
//! of its interval). A rule matches a class when the class's prefix (interval) lies inside
//! the rule's: so the classes a frame is in name its first matching rule, and a key that
//! carries the classes decides alike for every frame with it ([`AclExtras`]).

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use crate::ids::PortId;

/// The most rules one port may have.
pub const MAX_RULES_PER_PORT: usize = 4096;
/// The most rules one switch may have, all ports together.
pub const MAX_RULES_PER_SWITCH: usize = 65_536;

/// A rule's direction, in the port's counters' sense.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum Dir {
    /// Frames the port's guest sends into the switch.
    In,
    /// Frames the switch sends to the port.
    Out,
}

/// What a matching rule does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "kebab-case")]
pub enum AclAction {
    /// The frame passes.
    Allow,
    /// The frame is dropped (`acl`).
    Deny,
    /// The frame passes and its connection is remembered: the return traffic passes
    /// without a rule of its own.
    AllowRelated,
}

impl AclAction {
    /// Its name as the CLI and the config file write it.
    pub fn name(self) -> &'static str {
        match self {
            AclAction::Allow => "allow",
            AclAction::Deny => "deny",
            AclAction::AllowRelated => "allow-related",
        }
    }
}

impl fmt::Display for Dir {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Dir::In => "in",
            Dir::Out => "out",
        })
    }
}

/// A rule as it is written (the control protocol's and the config file's form): every
/// field a string or number to check.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct AclRuleSpec {
    /// "in" or "out".
    pub dir: String,
    /// "allow", "deny" or "allow-related".
    pub action: String,
    /// "tcp", "udp", "icmp" or "icmp6"; any when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proto: Option<String>,
    /// Source prefix ("10.0.0.0/8", "fd00::/64"; an address alone is a host prefix).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub src: Option<String>,
    /// Destination prefix.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dst: Option<String>,
    /// Destination port "N" or range "N-M" (tcp and udp).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dport: Option<String>,
    /// ICMP type (icmp and icmp6).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub icmp_type: Option<u8>,
    /// EtherType ("0x0800", "ipv4", "ipv6", "arp" or a number); implied by the prefixes
    /// and the protocol when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ethertype: Option<String>,
    /// Higher first; 0 when absent.
    #[serde(default)]
    pub priority: i32,
}

/// An address prefix, its host bits zero.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Prefix {
    /// The network address.
    pub addr: IpAddr,
    /// Its length in bits.
    pub len: u8,
}

impl Prefix {
    /// Parses "ADDR/LEN" or "ADDR"; the host bits must be zero.
    pub fn parse(s: &str) -> Result<Prefix, String> {
        let (a, l) = match s.split_once('/') {
            Some((a, l)) => (a, Some(l)),
            None => (s, None),
        };
        let addr: IpAddr = a.trim().parse().map_err(|_| format!("{s:?} is not an IPv4 or IPv6 address or prefix"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let len = match l {
            None => max,
            Some(l) => l
                .trim()
                .parse::<u8>()
                .ok()
                .filter(|&n| n <= max)
                .ok_or_else(|| format!("{s:?}: the prefix length must be 0 to {max}"))?,
        };
        let p = Prefix { addr, len };
        if p.masked(addr) != addr {
            return Err(format!("{s:?} has host bits set: write {}", Prefix { addr: p.masked(addr), len }));
        }
        Ok(p)
    }

    /// `a` with the bits past this prefix's length cleared (`a` of the same family).
    fn masked(&self, a: IpAddr) -> IpAddr {
        match a {
            IpAddr::V4(a) => {
                let m = if self.len == 0 { 0 } else { u32::MAX << (32 - u32::from(self.len)) };
                IpAddr::from(std::net::Ipv4Addr::from(u32::from(a) & m))
            }
            IpAddr::V6(a) => {
                let m = if self.len == 0 { 0 } else { u128::MAX << (128 - u32::from(self.len)) };
                IpAddr::from(std::net::Ipv6Addr::from(u128::from(a) & m))
            }
        }
    }

    /// Whether it holds address `a`.
    pub fn contains(&self, a: IpAddr) -> bool {
        a.is_ipv4() == self.addr.is_ipv4() && self.masked(a) == self.addr
    }

    /// Whether every address of `o` is in it.
    pub fn covers(&self, o: &Prefix) -> bool {
        o.len >= self.len && self.contains(o.addr)
    }
}

impl fmt::Display for Prefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

/// A checked rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AclRule {
    /// Its id on its port (unique on the switch; never reused while the switch runs).
    pub id: u32,
    /// Its direction.
    pub dir: Dir,
    /// What it does.
    pub action: AclAction,
    /// Higher first.
    pub priority: i32,
    /// The EtherType it matches; `None`: IPv4 and IPv6.
    pub ethertype: Option<u16>,
    /// The IP protocol number it matches (6, 17, 1, 58).
    pub proto: Option<u8>,
    /// The source prefix.
    pub src: Option<Prefix>,
    /// The destination prefix.
    pub dst: Option<Prefix>,
    /// Destination ports, inclusive.
    pub dport: Option<(u16, u16)>,
    /// The ICMP type.
    pub icmp_type: Option<u8>,
}

/// Why a rule was refused: the field, and what is wrong with it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {why}")]
pub struct AclError {
    /// The field ("dir", "src", "dport", …; "rules" for a bound).
    pub field: &'static str,
    /// What is wrong, and what to write instead.
    pub why: String,
}

fn bad(field: &'static str, why: impl Into<String>) -> AclError {
    AclError { field, why: why.into() }
}

/// Parses a direction ("in", "out").
pub fn parse_dir(s: &str) -> Result<Dir, AclError> {
    match s {
        "in" => Ok(Dir::In),
        "out" => Ok(Dir::Out),
        _ => Err(bad("dir", format!("{s:?} is not a direction: use \"in\" (what the port's guest sends) or \"out\""))),
    }
}

/// Parses an action ("allow", "deny", "allow-related").
pub fn parse_action(s: &str) -> Result<AclAction, AclError> {
    match s {
        "allow" => Ok(AclAction::Allow),
        "deny" => Ok(AclAction::Deny),
        "allow-related" => Ok(AclAction::AllowRelated),
        _ => Err(bad("action", format!("{s:?} is not an action: use allow, deny or allow-related"))),
    }
}

/// Parses a destination port "N" or range "N-M".
pub fn parse_ports(s: &str) -> Result<(u16, u16), AclError> {
    let port = |p: &str| {
        p.trim().parse::<u16>().map_err(|_| bad("dport", format!("{s:?}: {p:?} is not a port number (0 to 65535)")))
    };
    let (lo, hi) = match s.split_once('-') {
        Some((a, b)) => (port(a)?, port(b)?),
        None => {
            let p = port(s)?;
            (p, p)
        }
    };
    if lo > hi {
        return Err(bad("dport", format!("{s:?}: the range's first port is past its last: write {hi}-{lo}")));
    }
    Ok((lo, hi))
}

fn parse_ethertype(s: &str) -> Result<u16, AclError> {
    let t = s.trim().to_ascii_lowercase();
    let v = match t.as_str() {
        "ipv4" | "ip" => Some(0x0800),
        "ipv6" => Some(0x86dd),
        "arp" => Some(0x0806),
        _ => match t.strip_prefix("0x") {
            Some(h) => u16::from_str_radix(h, 16).ok(),
            None => t.parse().ok(),
        },
    };
    v.filter(|&v| v >= 0x0600).ok_or_else(|| {
        bad("ethertype", format!("{s:?} is not an EtherType: write ipv4, ipv6, arp or a number such as 0x88b5"))
    })
}

impl AclRule {
    /// Checks a written rule; `id` is the id it will have.
    pub fn parse(spec: &AclRuleSpec, id: u32) -> Result<AclRule, AclError> {
        let dir = parse_dir(&spec.dir)?;
        let action = parse_action(&spec.action)?;
        let proto = match spec.proto.as_deref() {
            None => None,
            Some("tcp") => Some(6),
            Some("udp") => Some(17),
            Some("icmp") => Some(1),
            Some("icmp6") => Some(58),
            Some(p) => return Err(bad("proto", format!("{p:?} is not a protocol: use tcp, udp, icmp or icmp6"))),
        };
        let prefix = |field, s: &Option<String>| {
            s.as_deref().map(|s| Prefix::parse(s).map_err(|why| bad(field, why))).transpose()
        };
        let src = prefix("src", &spec.src)?;
        let dst = prefix("dst", &spec.dst)?;
        let dport = spec.dport.as_deref().map(parse_ports).transpose()?;
        if dport.is_some() && !matches!(proto, Some(6 | 17)) {
            return Err(bad("dport", "destination ports need --proto tcp or --proto udp"));
        }
        if spec.icmp_type.is_some() && !matches!(proto, Some(1 | 58)) {
            return Err(bad("icmp_type", "an ICMP type needs --proto icmp or --proto icmp6"));
        }
        // The EtherType: written, or implied by the prefixes and the protocol.
        let mut ethertype = spec.ethertype.as_deref().map(parse_ethertype).transpose()?;
        let implied = [
            src.map(|p| (p.addr.is_ipv4(), "src")),
            dst.map(|p| (p.addr.is_ipv4(), "dst")),
            match proto {
                Some(1) => Some((true, "proto")),
                Some(58) => Some((false, "proto")),
                _ => None,
            },
        ];
        for (v4, field) in implied.into_iter().flatten() {
            let t = if v4 { 0x0800 } else { 0x86dd };
            match ethertype {
                Some(e) if e != t => {
                    return Err(bad(
                        field,
                        format!("is {} but the rule is for EtherType {e:#06x} (mixed IPv4 and IPv6?)", family(t)),
                    ));
                }
                _ => ethertype = Some(t),
            }
        }
        if proto.is_some() && !matches!(ethertype, None | Some(0x0800 | 0x86dd)) {
            return Err(bad("proto", "a protocol needs an IPv4 or IPv6 rule"));
        }
        Ok(AclRule {
            id,
            dir,
            action,
            priority: spec.priority,
            ethertype,
            proto,
            src,
            dst,
            dport,
            icmp_type: spec.icmp_type,
        })
    }

    /// The rule as it is written.
    pub fn spec(&self) -> AclRuleSpec {
        AclRuleSpec {
            dir: self.dir.to_string(),
            action: self.action.name().into(),
            proto: self.proto.map(|p| {
                match p {
                    6 => "tcp",
                    17 => "udp",
                    1 => "icmp",
                    _ => "icmp6",
                }
                .into()
            }),
            src: self.src.map(|p| p.to_string()),
            dst: self.dst.map(|p| p.to_string()),
            dport: self.dport.map(|(a, b)| if a == b { a.to_string() } else { format!("{a}-{b}") }),
            icmp_type: self.icmp_type,
            ethertype: self.ethertype.map(|e| format!("{e:#06x}")),
            priority: self.priority,
        }
    }
}

fn family(t: u16) -> &'static str {
    if t == 0x0800 { "IPv4" } else { "IPv6" }
}

/// A frame's connection as the tracker (or the kernel's) saw it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum CtState {
    /// Not tracked: not TCP, UDP or ICMP echo (or not IP).
    #[default]
    Untracked,
    /// No connection yet: the rules decide, and may have it remembered.
    New,
    /// A remembered connection, in the direction it was opened.
    Established,
    /// A remembered connection's return traffic.
    Reply,
    /// A TCP segment other than a SYN with no connection: the rules decide; never
    /// remembered.
    Invalid,
}

/// What a frame's key carries for the security groups (when any port of the switch has
/// rules): its connection state and the classes of what the rules read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct AclExtras {
    /// Its connection's state.
    pub ct: CtState,
    /// The IP protocol (IPv4 and IPv6 frames).
    pub proto: u8,
    /// The class of its source address (0: no prefix holds it).
    pub src: u32,
    /// The class of its destination address.
    pub dst: u32,
    /// The class of its destination port (TCP and UDP).
    pub dport: u32,
    /// Its ICMP type (ICMP and ICMPv6).
    pub icmp_type: u8,
    /// A TCP segment no connection holds (`New` or `Invalid`): its flags that say which
    /// ([`crate::conntrack::MISS_FLAGS`]); else 0. The rules do not read it; a kernel's
    /// key carries it so that the core, not the kernel, tells the two apart.
    pub tcp_flags: u8,
    /// A kernel datapath reads these extras itself and tracks the connections of the
    /// protocols it can ([`crate::conntrack::kernel_tracks`]); else frames these extras
    /// decide go through the core.
    pub kernel: bool,
}

/// One port's rules and defaults, with the hits of each rule.
#[derive(Clone, Debug, Default)]
pub struct PortAcl {
    /// In match order: priority, then the order they were added.
    rules: Vec<AclRule>,
    hits: Vec<u64>,
    default_in: Option<AclAction>,
    default_out: Option<AclAction>,
}

impl PortAcl {
    fn default_for(&self, dir: Dir) -> AclAction {
        match dir {
            Dir::In => self.default_in,
            Dir::Out => self.default_out,
        }
        .unwrap_or(AclAction::Allow)
    }

    fn is_empty(&self) -> bool {
        self.rules.is_empty() && self.default_in.is_none() && self.default_out.is_none()
    }
}

/// A rule of a listing: the rule, its port, its hits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AclListed {
    /// The port's name.
    pub port: String,
    /// The rule.
    pub rule: AclRule,
    /// Frames it decided.
    pub hits: u64,
}

/// The switch's security groups: the rules by port name (a port's rules stay while it is
/// detached), compiled for the attached ports.
#[derive(Clone, Debug, Default)]
pub struct AclTables {
    by_port: BTreeMap<String, PortAcl>,
    next_id: u32,
    /// Slot → the attached port's name.
    names: Vec<Option<String>>,
    /// Slot → port name, for the attached ports that have rules.
    slots: Vec<Option<String>>,
    /// Every prefix a rule names, by family, length and address → its class (index + 1).
    prefixes: Vec<Prefix>,
    prefix_class: HashMap<Prefix, u32>,
    /// The prefix lengths in use, longest first, per family (v4, v6).
    lengths: [Vec<u8>; 2],
    /// The first port of each port class (sorted; class i is `starts[i]..starts[i+1]`).
    starts: Vec<u16>,
    /// The EtherTypes other than IPv4 and IPv6 that some rule names.
    other_types: Vec<u16>,
}

/// What the security groups decided about one frame (part of its verdict).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct AclVerdict {
    /// Some port's rules were read: the verdict holds for this frame's connection state and
    /// classes, which a kernel's key does not carry yet (it sends such frames up).
    pub consulted: bool,
    /// The connection is to be remembered (an `allow-related` rule passed it).
    pub commit: bool,
    /// The rules that decided: (port, position in its match order).
    pub hits: Vec<(PortId, u32)>,
}

impl AclTables {
    /// Whether any port has rules or defaults (else frames carry no [`AclExtras`]).
    pub fn active(&self) -> bool {
        self.slots.iter().any(Option::is_some)
    }

    /// Whether port `id` has rules or defaults.
    pub fn port_has_rules(&self, id: PortId) -> bool {
        self.slots.get(id as usize).is_some_and(Option::is_some)
    }

    /// Rules of the whole switch.
    pub fn len(&self) -> usize {
        self.by_port.values().map(|p| p.rules.len()).sum()
    }

    /// No rules at all.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Adds a rule to port `port`: its id.
    pub fn add(&mut self, port: &str, spec: &AclRuleSpec) -> Result<u32, AclError> {
        let rule = AclRule::parse(spec, self.next_id + 1)?;
        let n = self.by_port.get(port).map_or(0, |p| p.rules.len());
        if n >= MAX_RULES_PER_PORT {
            return Err(bad(
                "rules",
                format!("port {port:?} has {MAX_RULES_PER_PORT} rules, the most a port may have; delete some first"),
            ));
        }
        if self.len() >= MAX_RULES_PER_SWITCH {
            return Err(bad(
                "rules",
                format!("the switch has {MAX_RULES_PER_SWITCH} rules, the most a switch may have; delete some first"),
            ));
        }
        self.next_id += 1;
        let p = self.by_port.entry(port.to_string()).or_default();
        let at = p.rules.partition_point(|r| r.priority >= rule.priority);
        p.rules.insert(at, rule);
        p.hits.insert(at, 0);
        self.compile();
        Ok(self.next_id)
    }

    /// Adds rules to ports all at once (a configuration file's): their ids; on the first
    /// refused, none is added, and the error says which (its index in `rules`).
    pub fn add_all(&mut self, rules: &[(String, AclRuleSpec)]) -> Result<Vec<u32>, (usize, AclError)> {
        let mut trial = self.clone();
        let base = trial.len();
        let mut ids = Vec::with_capacity(rules.len());
        for (i, (port, spec)) in rules.iter().enumerate() {
            let rule = AclRule::parse(spec, trial.next_id + 1).map_err(|e| (i, e))?;
            let p = trial.by_port.entry(port.clone()).or_default();
            if p.rules.len() >= MAX_RULES_PER_PORT {
                let why =
                    format!("port {port:?} would have more than {MAX_RULES_PER_PORT} rules, the most a port may have");
                return Err((i, bad("rules", why)));
            }
            if base + i >= MAX_RULES_PER_SWITCH {
                let why =
                    format!("the switch would have more than {MAX_RULES_PER_SWITCH} rules, the most a switch may have");
                return Err((i, bad("rules", why)));
            }
            trial.next_id += 1;
            ids.push(trial.next_id);
            let at = p.rules.partition_point(|r| r.priority >= rule.priority);
            p.rules.insert(at, rule);
            p.hits.insert(at, 0);
        }
        trial.compile();
        *self = trial;
        Ok(ids)
    }

    /// Forgets every rule and default (ids are never reused).
    pub fn clear(&mut self) {
        self.by_port.clear();
        self.compile();
    }

    /// Deletes rule `id` (of port `port` when given): the port it was on.
    pub fn del(&mut self, port: Option<&str>, id: u32) -> Option<String> {
        let (name, p) = self
            .by_port
            .iter_mut()
            .filter(|(n, _)| port.is_none_or(|w| w == n.as_str()))
            .find(|(_, p)| p.rules.iter().any(|r| r.id == id))?;
        let at = p.rules.iter().position(|r| r.id == id)?;
        p.rules.remove(at);
        p.hits.remove(at);
        let name = name.clone();
        if self.by_port.get(&name).is_some_and(PortAcl::is_empty) {
            self.by_port.remove(&name);
        }
        self.compile();
        Some(name)
    }

    /// Sets port `port`'s default action for `dir` (`allow` or `deny`).
    pub fn set_default(&mut self, port: &str, dir: Dir, action: AclAction) -> Result<(), AclError> {
        if action == AclAction::AllowRelated {
            return Err(bad("action", "a default is allow or deny"));
        }
        let p = self.by_port.entry(port.to_string()).or_default();
        let d = if action == AclAction::Allow { None } else { Some(action) };
        match dir {
            Dir::In => p.default_in = d,
            Dir::Out => p.default_out = d,
        }
        if p.is_empty() {
            self.by_port.remove(port);
        }
        self.compile();
        Ok(())
    }

    /// Port `port`'s default for `dir`.
    pub fn default_of(&self, port: &str, dir: Dir) -> AclAction {
        self.by_port.get(port).map_or(AclAction::Allow, |p| p.default_for(dir))
    }

    /// The ports with rules or defaults.
    pub fn ports(&self) -> impl Iterator<Item = &str> {
        self.by_port.keys().map(String::as_str)
    }

    /// The rules (of port `port`, or all), in match order per port, with their hits.
    pub fn list(&self, port: Option<&str>) -> Vec<AclListed> {
        self.by_port
            .iter()
            .filter(|(n, _)| port.is_none_or(|w| w == n.as_str()))
            .flat_map(|(n, p)| {
                p.rules.iter().zip(&p.hits).map(|(r, &hits)| AclListed { port: n.clone(), rule: r.clone(), hits })
            })
            .collect()
    }

    /// Zeroes every hit counter.
    pub fn reset_hits(&mut self) {
        for p in self.by_port.values_mut() {
            p.hits.iter_mut().for_each(|h| *h = 0);
        }
    }

    /// Port `name` is attached in slot `id` (or, `None`, slot `id` is free now).
    pub fn bind(&mut self, id: PortId, name: Option<&str>) {
        let i = id as usize;
        if self.names.len() <= i {
            self.names.resize(i + 1, None);
            self.slots.resize(i + 1, None);
        }
        self.names[i] = name.map(str::to_string);
        self.slots[i] = name.filter(|n| self.by_port.contains_key(*n)).map(str::to_string);
    }

    /// Counts the hits a verdict names.
    pub fn count(&mut self, hits: &[(PortId, u32)]) {
        for &(id, at) in hits {
            if let Some(Some(n)) = self.slots.get(id as usize)
                && let Some(p) = self.by_port.get_mut(n)
                && let Some(h) = p.hits.get_mut(at as usize)
            {
                *h += 1;
            }
        }
    }

    /// The rules `hits` names (port, position in its match order) as (port name, rule id),
    /// which stay right when other rules come and go: for a datapath that counts the
    /// later frames of a verdict itself and credits them ([`AclTables::credit`]).
    pub fn rule_ids(&self, hits: &[(PortId, u32)]) -> Vec<(String, u32)> {
        hits.iter()
            .filter_map(|&(id, at)| {
                let name = self.slots.get(id as usize)?.as_ref()?;
                Some((name.clone(), self.by_port.get(name)?.rules.get(at as usize)?.id))
            })
            .collect()
    }

    /// Adds `n` hits to rule `id` of port `port`, if it is still there.
    pub fn credit(&mut self, port: &str, id: u32, n: u64) {
        if let Some(p) = self.by_port.get_mut(port)
            && let Some(at) = p.rules.iter().position(|r| r.id == id)
        {
            p.hits[at] += n;
        }
    }

    /// Rebuilds the classes and the slots' bindings after a change of the rules.
    fn compile(&mut self) {
        for (i, s) in self.slots.iter_mut().enumerate() {
            *s = self.names.get(i).cloned().flatten().filter(|n| self.by_port.contains_key(n));
        }
        let mut prefixes: Vec<Prefix> =
            self.by_port.values().flat_map(|p| p.rules.iter().flat_map(|r| [r.src, r.dst])).flatten().collect();
        prefixes.sort_unstable();
        prefixes.dedup();
        self.prefix_class = prefixes.iter().enumerate().map(|(i, &p)| (p, i as u32 + 1)).collect();
        for (f, v4) in [(0, true), (1, false)] {
            let mut l: Vec<u8> = prefixes.iter().filter(|p| p.addr.is_ipv4() == v4).map(|p| p.len).collect();
            l.sort_unstable_by(|a, b| b.cmp(a));
            l.dedup();
            self.lengths[f] = l;
        }
        self.prefixes = prefixes;
        let mut starts = vec![0u16];
        for r in self.by_port.values().flat_map(|p| &p.rules) {
            if let Some((lo, hi)) = r.dport {
                starts.push(lo);
                if hi < u16::MAX {
                    starts.push(hi + 1);
                }
            }
        }
        starts.sort_unstable();
        starts.dedup();
        self.starts = starts;
        let mut t: Vec<u16> = self
            .by_port
            .values()
            .flat_map(|p| &p.rules)
            .filter_map(|r| r.ethertype)
            .filter(|t| !matches!(t, 0x0800 | 0x86dd))
            .collect();
        t.sort_unstable();
        t.dedup();
        self.other_types = t;
    }

    /// Whether rules may judge frames of `ethertype`: IPv4 and IPv6, and the other
    /// EtherTypes some rule names (frames of any other pass every security group alike).
    pub fn judges(&self, ethertype: u16) -> bool {
        matches!(ethertype, 0x0800 | 0x86dd) || self.other_types.contains(&ethertype)
    }

    /// The class of address `a`: the longest prefix a rule names that holds it (0: none).
    pub fn addr_class(&self, a: IpAddr) -> u32 {
        let f = usize::from(!a.is_ipv4());
        for &len in &self.lengths[f] {
            let probe = Prefix { addr: a, len };
            let p = Prefix { addr: probe.masked(a), len };
            if let Some(&c) = self.prefix_class.get(&p) {
                return c;
            }
        }
        0
    }

    /// The class of destination port `p`.
    pub fn port_class(&self, p: u16) -> u32 {
        (self.starts.partition_point(|&s| s <= p) - 1) as u32
    }

    /// Every address class: (class, its prefix), for a datapath that looks them up itself.
    pub fn address_classes(&self) -> impl Iterator<Item = (u32, Prefix)> + '_ {
        self.prefixes.iter().enumerate().map(|(i, &p)| (i as u32 + 1, p))
    }

    /// Every port class: (class, its first and last port).
    pub fn port_classes(&self) -> impl Iterator<Item = (u32, u16, u16)> + '_ {
        self.starts.iter().enumerate().map(|(i, &s)| {
            let end = self.starts.get(i + 1).map_or(u16::MAX, |&n| n - 1);
            (i as u32, s, end)
        })
    }

    /// Whether rule `r` matches a frame of `ethertype` with extras `x`.
    fn matches(&self, r: &AclRule, ethertype: u16, x: &AclExtras) -> bool {
        let ip = matches!(ethertype, 0x0800 | 0x86dd);
        match r.ethertype {
            None if !ip => return false,
            Some(t) if t != ethertype => return false,
            _ => {}
        }
        let class_in = |rule: Option<Prefix>, class: u32| match rule {
            None => true,
            Some(p) => class != 0 && self.prefixes.get(class as usize - 1).is_some_and(|c| p.covers(c)),
        };
        if r.proto.is_some_and(|p| p != x.proto) {
            return false;
        }
        if !class_in(r.src, x.src) || !class_in(r.dst, x.dst) {
            return false;
        }
        if let Some((lo, hi)) = r.dport {
            let Some(&s) = self.starts.get(x.dport as usize) else { return false };
            let e = self.starts.get(x.dport as usize + 1).map_or(u16::MAX, |&n| n - 1);
            if s < lo || e > hi {
                return false;
            }
        }
        r.icmp_type.is_none_or(|t| t == x.icmp_type)
    }

    /// Port `id`'s rules for `dir` on a frame of `ethertype` with extras `x`: the action
    /// and the matching rule's position (`None`: the default).
    pub fn judge(&self, id: PortId, dir: Dir, ethertype: u16, x: &AclExtras) -> Option<(AclAction, Option<u32>)> {
        let n = self.slots.get(id as usize)?.as_ref()?;
        let p = self.by_port.get(n)?;
        for (i, r) in p.rules.iter().enumerate() {
            if r.dir == dir && self.matches(r, ethertype, x) {
                return Some((r.action, Some(i as u32)));
            }
        }
        // (Defaults are for IP frames; another EtherType only meets rules naming it.)
        let ip = matches!(ethertype, 0x0800 | 0x86dd);
        Some((if ip { p.default_for(dir) } else { AclAction::Allow }, None))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(dir: &str, action: &str) -> AclRuleSpec {
        AclRuleSpec { dir: dir.into(), action: action.into(), ..AclRuleSpec::default() }
    }

    #[test]
    fn bad_input_names_the_field() {
        let rows: Vec<(AclRuleSpec, &str)> = vec![
            (spec("sideways", "allow"), "dir"),
            (spec("in", "maybe"), "action"),
            (AclRuleSpec { proto: Some("sctp".into()), ..spec("in", "allow") }, "proto"),
            (AclRuleSpec { src: Some("10.0.0.1/33".into()), ..spec("in", "allow") }, "src"),
            (AclRuleSpec { dst: Some("10.0.0.1/24".into()), ..spec("in", "allow") }, "dst"),
            (AclRuleSpec { dst: Some("nonsense".into()), ..spec("in", "allow") }, "dst"),
            (AclRuleSpec { proto: Some("tcp".into()), dport: Some("90-80".into()), ..spec("in", "allow") }, "dport"),
            (AclRuleSpec { proto: Some("tcp".into()), dport: Some("70000".into()), ..spec("in", "allow") }, "dport"),
            (AclRuleSpec { dport: Some("80".into()), ..spec("in", "allow") }, "dport"),
            (AclRuleSpec { icmp_type: Some(8), ..spec("in", "allow") }, "icmp_type"),
            (
                AclRuleSpec { src: Some("10.0.0.0/8".into()), dst: Some("fd00::/8".into()), ..spec("in", "allow") },
                "dst",
            ),
            (AclRuleSpec { ethertype: Some("0x12".into()), ..spec("in", "allow") }, "ethertype"),
        ];
        for (s, field) in rows {
            let e = AclRule::parse(&s, 1).unwrap_err();
            assert_eq!(e.field, field, "{s:?}: {e}");
        }
        assert_eq!(parse_ports("1000-2000"), Ok((1000, 2000)));
        assert!(Prefix::parse("10.0.0.1/24").unwrap_err().contains("10.0.0.0/24"));
    }

    #[test]
    fn bounds_are_named() {
        let mut t = AclTables::default();
        let s = AclRuleSpec { proto: Some("tcp".into()), dport: Some("22".into()), ..spec("in", "deny") };
        for _ in 0..MAX_RULES_PER_PORT {
            t.add("a", &s).unwrap();
        }
        let e = t.add("a", &s).unwrap_err();
        assert!(e.to_string().contains("4096"), "{e}");
        t.add("b", &s).unwrap();
    }

    #[test]
    fn classes_name_the_first_matching_rule() {
        let mut t = AclTables::default();
        let r = |src: Option<&str>, dport: Option<&str>, action: &str, prio: i32| AclRuleSpec {
            proto: Some("tcp".into()),
            src: src.map(Into::into),
            dport: dport.map(Into::into),
            priority: prio,
            ..spec("in", action)
        };
        let deny_ssh = t.add("p", &r(Some("10.0.0.0/8"), Some("22"), "deny", 10)).unwrap();
        let allow_net = t.add("p", &r(Some("10.1.0.0/16"), Some("20-30"), "allow", 5)).unwrap();
        t.bind(0, Some("p"));
        assert!(deny_ssh < allow_net);
        let x = |t: &AclTables, src: &str, dport: u16| AclExtras {
            ct: CtState::New,
            proto: 6,
            src: t.addr_class(src.parse().unwrap()),
            dst: 0,
            dport: t.port_class(dport),
            ..AclExtras::default()
        };
        let rows = [
            ("10.1.2.3", 22, Some((AclAction::Deny, Some(0)))),
            ("10.1.2.3", 25, Some((AclAction::Allow, Some(1)))),
            ("10.2.2.3", 25, Some((AclAction::Allow, None))),
            ("10.1.2.3", 31, Some((AclAction::Allow, None))),
            ("192.168.0.1", 22, Some((AclAction::Allow, None))),
        ];
        for (src, port, want) in rows {
            assert_eq!(t.judge(0, Dir::In, 0x0800, &x(&t, src, port)), want, "{src}:{port}");
        }
        assert_eq!(t.judge(1, Dir::In, 0x0800, &x(&t, "10.1.2.3", 22)), None, "a port without rules");
        t.set_default("p", Dir::In, AclAction::Deny).unwrap();
        assert_eq!(t.judge(0, Dir::In, 0x0800, &x(&t, "10.2.2.3", 25)), Some((AclAction::Deny, None)));
        assert_eq!(t.judge(0, Dir::In, 0x0806, &x(&t, "10.2.2.3", 25)), Some((AclAction::Allow, None)), "ARP");
        assert_eq!(t.del(None, deny_ssh).as_deref(), Some("p"));
        assert_eq!(t.judge(0, Dir::In, 0x0800, &x(&t, "10.1.2.3", 22)), Some((AclAction::Allow, Some(0))));
    }
}

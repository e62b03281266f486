//! The switch configuration file (TOML) and the port description shared with the CLI.
//!
//! Every refusal names the file, the line and column, and what to change. Unknown keys are
//! refused too, so a misspelt setting never silently falls back to its default.

use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sluice_switch::{SwitchConfig, VlanMode};
use sluice_wire::MacAddr;
use toml::Spanned;

pub use sluice_sys::names::{check_ifname, check_netns_name};
use sluice_sys::paths;

/// A configuration error located in its file.
#[derive(Debug)]
pub struct ConfigError {
    /// The file read.
    pub file: PathBuf,
    /// 1-based line, when known.
    pub line: Option<usize>,
    /// 1-based column, when known.
    pub col: Option<usize>,
    /// What is wrong and what to do.
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let Some(l) = self.line {
            write!(f, ":{l}")?;
            if let Some(c) = self.col {
                write!(f, ":{c}")?;
            }
        }
        write!(f, ": {}", self.message)
    }
}

impl std::error::Error for ConfigError {}

/// The kinds of port sluice can attach.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum PortKind {
    /// A TAP device for a container, namespace or VM.
    #[default]
    Tap,
    /// A host interface (named by the port's name) connecting the switch to the LAN.
    Uplink,
    /// The switch's end of a veth pair whose other end is in a guest's namespace: an
    /// existing pair, or with `netns` one the switch makes (the guest's end named
    /// `ifname`); forwarded by the kernel datapath (`datapath = "kernel"`).
    Veth,
    /// A unix stream socket a program listens on (`path`), carrying frames as QEMU's
    /// `-netdev stream` does; the switch can hold its peer back (user-space datapath).
    Stream,
    /// A VXLAN tunnel (RFC 7348) to other switches over a UDP socket bound to `local`
    /// (user-space datapath).
    Vxlan,
    /// A QEMU guest's virtio-net device over vhost-user (`socket`): the switch reads and
    /// fills the VM's queues in its shared memory; the switch can hold the VM back.
    #[serde(rename = "vhost-user")]
    VhostUser,
}

/// Which datapath executes the switch's forwarding.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DatapathKind {
    /// One user-space thread moves every frame (TAP, uplink ports).
    #[default]
    User,
    /// TC programs forward between veth ports (and to the uplink) in the kernel; the core
    /// in user space decides what they execute and handles the rest.
    Kernel,
}

impl DatapathKind {
    /// As the config file spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            DatapathKind::User => "user",
            DatapathKind::Kernel => "kernel",
        }
    }
}

/// One port, as a `[[port]]` table or `sluice port add` describes it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PortSpec {
    /// Port name; for a TAP, the interface name (1–15 bytes).
    pub name: String,
    /// Kind of port.
    #[serde(rename = "type", default)]
    pub kind: PortKind,
    /// Network namespace (an `ip netns` name) to create the TAP in, or that the uplink's
    /// interface is in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub netns: Option<String>,
    /// MTU; the switch's by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u16>,
    /// Checksum and TSO offloads (GSO frames cross whole). When false the switch cuts GSO
    /// frames and completes checksums for this port in software.
    #[serde(default = "yes")]
    pub offload: bool,
    /// Access port of this VLAN (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vlan: Option<u16>,
    /// Trunk port carrying these VLANs tagged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trunk: Option<Vec<u16>>,
    /// Native VLAN of a trunk: its frames cross untagged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub native: Option<u16>,
    /// Isolated: the port exchanges frames with uplinks only.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub isolated: bool,
    /// Anti-spoofing: the only source MAC address the port may send from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
    /// Anti-spoofing: the only source IP addresses the port's IP packets and ARP may carry;
    /// `"learn"` locks the first address of each family the port uses. In Layer 3 mode,
    /// also the addresses the port is reached at (a guest port without any learns them).
    #[serde(default, skip_serializing_if = "Vec::is_empty", deserialize_with = "one_or_many")]
    pub ips: Vec<String>,
    /// Frames of these EtherTypes from the port are dropped and counted (`filtered`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub drop_ethertypes: Vec<u16>,
    /// The IEEE link-local addresses (01:80:C2:00:00:00 to 0F) whose frames from the port
    /// are forwarded, as full addresses or their last byte (`"0e"`, LLDP); frames to the
    /// others are dropped and counted (`link_local`). Pause (01) and slow protocols (02)
    /// are refused.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub forward_link_local: Vec<String>,
    /// Storm control: broadcast frames a second the port may send (more are dropped,
    /// `storm`); none by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storm_broadcast_pps: Option<u32>,
    /// Storm control: multicast frames a second the port may send.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storm_multicast_pps: Option<u32>,
    /// Storm control: frames of each kind that may come at once (default: a tenth of a
    /// second of the rate, at least 16).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storm_burst: Option<u32>,
    /// Rate limit of what the port's guest sends, in Mbit/s on the wire (0 or absent: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_in: Option<f64>,
    /// Rate limit of what the port's guest is sent, in Mbit/s on the wire.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_out: Option<f64>,
    /// The rate limits' burst, in KiB (default: the larger of 2 × 64 KiB and 0.5 s of
    /// the rate).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<u64>,
    /// Make this port a mirror of these ports: it gets a copy of all their traffic.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mirror: Vec<String>,
    /// Uplink only: up to two backup interfaces (same namespace) that take over, in order,
    /// when the active one is down or loses carrier.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub backups: Vec<String>,
    /// Stream only: the unix socket its peer listens on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<PathBuf>,
    /// VXLAN only: the local underlay address the tunnel's UDP socket is bound to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local: Option<String>,
    /// VXLAN only: remote endpoints (underlay addresses) every flooded frame goes to, and
    /// (with `remotes_only`, the default) the only ones datagrams are accepted from.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub remotes: Vec<String>,
    /// VXLAN only: accept and learn from `remotes` alone (default true); false accepts
    /// any sender on the underlay, learns it as an endpoint and floods to it besides.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remotes_only: Option<bool>,
    /// VXLAN only: the VNI carrying the port's frames (the port is an access port).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vni: Option<u32>,
    /// VXLAN only: a VNI per VLAN (`{ "10" = 5010 }`): the port is a trunk of these VLANs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vni_map: Option<std::collections::BTreeMap<String, u32>>,
    /// VXLAN only: the UDP port, local and remote (default 4789).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dstport: Option<u16>,
    /// VXLAN only: stations and flood lists come from EVPN routes (the switch's `[evpn]`
    /// speaker); nothing is learned from datagrams.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub evpn: bool,
    /// vhost-user only: the unix socket QEMU's `-chardev socket` uses; the switch listens
    /// on it (mode 0600), or connects to it with `client`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socket: Option<PathBuf>,
    /// vhost-user only: QEMU listens on `socket` (`server=on`) and the switch connects,
    /// retrying until it can.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub client: bool,
    /// veth with `netns` only: the name of the pair's end the switch makes inside the
    /// guest's namespace (`eth0`, the CNI runtime's `CNI_IFNAME`); default: the port's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ifname: Option<String>,
    /// IGMP/MLD snooping: whether the port leads to a multicast router (gets every group
    /// frame and every report): `auto` (when a query is heard on it), `always`, `never`.
    #[serde(default, skip_serializing_if = "McastRouterSpec::is_auto")]
    pub mcast_router: McastRouterSpec,
}

/// A port's `mcast_router` setting.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum McastRouterSpec {
    /// A router port while queries are heard on it.
    #[default]
    Auto,
    /// Always a router port.
    Always,
    /// Never a router port.
    Never,
}

impl McastRouterSpec {
    fn is_auto(&self) -> bool {
        *self == McastRouterSpec::Auto
    }

    /// The core's setting.
    pub fn core(self) -> sluice_switch::McastRouter {
        match self {
            McastRouterSpec::Auto => sluice_switch::McastRouter::Auto,
            McastRouterSpec::Always => sluice_switch::McastRouter::Always,
            McastRouterSpec::Never => sluice_switch::McastRouter::Never,
        }
    }
}

/// A VXLAN port's tunnel settings, checked.
#[derive(Clone, Debug, PartialEq)]
pub struct VxlanSettings {
    /// Local underlay address.
    pub local: std::net::IpAddr,
    /// Configured remote endpoints (same family as `local`).
    pub remotes: Vec<std::net::IpAddr>,
    /// Datagrams are accepted from `remotes` alone.
    pub remotes_only: bool,
    /// Which VNI carries which frames.
    pub vnis: sluice_switch::tunnel::VniMap,
    /// UDP port.
    pub dstport: u16,
    /// Stations, flood lists and further endpoints come from EVPN routes; nothing is
    /// learned from datagrams.
    pub evpn: bool,
}

fn yes() -> bool {
    true
}

/// A string or a list of strings (`ips = "learn"` or `ips = ["10.0.0.5", "fd00::5"]`).
fn one_or_many<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
    }
    Ok(match OneOrMany::deserialize(d)? {
        OneOrMany::One(s) => vec![s],
        OneOrMany::Many(v) => v,
    })
}

/// The mask of `forward_link_local` entries: each an IEEE link-local address
/// (01:80:c2:00:00:0e) or its last byte in hex (`0e`, `0x0e`), one bit per last byte.
/// Pause (01) and the slow protocols (02) are refused: no port may forward them.
pub fn link_local_mask(entries: &[String]) -> Result<u16, String> {
    let mut mask = 0u16;
    for e in entries {
        let t = e.trim().to_ascii_lowercase();
        let last = match t.parse::<MacAddr>() {
            Ok(m) if m.0[..5] == [0x01, 0x80, 0xc2, 0, 0] && m.0[5] < 16 => Some(m.0[5]),
            Ok(_) => None,
            Err(_) => u8::from_str_radix(t.strip_prefix("0x").unwrap_or(&t), 16).ok().filter(|&n| n < 16),
        };
        let Some(n) = last else {
            return Err(format!(
                "{e:?} is not an IEEE link-local address: write 01:80:c2:00:00:00 to 01:80:c2:00:00:0f, or its last byte (e.g. \"0e\" for LLDP)"
            ));
        };
        if sluice_switch::LINK_LOCAL_NEVER & (1 << n) != 0 {
            return Err(format!(
                "{e:?} ({}) is never forwarded: a guest's pause or LACP frame would reach the physical switch behind an uplink; leave it out",
                if n == 1 { "pause, IEEE 802.3x" } else { "slow protocols: LACP, marker, OAM" }
            ));
        }
        mask |= 1 << n;
    }
    Ok(mask)
}

/// The most a rate limit may be: 400 Gbit/s.
pub const MAX_RATE_MBIT: f64 = 400_000.0;

/// Rate limits from Mbit/s and a burst in KiB (as the config file and `sluice port set`
/// write them) to bits a second and bytes; 0 or absent: no limit.
pub fn rate_limit(
    rate_in: Option<f64>,
    rate_out: Option<f64>,
    burst_kib: Option<u64>,
) -> Result<sluice_switch::RateLimit, String> {
    let bits = |name: &str, mbit: Option<f64>| -> Result<u64, String> {
        let m = mbit.unwrap_or(0.0);
        if !(0.0..=MAX_RATE_MBIT).contains(&m) || m.is_nan() {
            return Err(format!(
                "{name} = {m} is not a rate: write Mbit/s from 0 (no limit) to {MAX_RATE_MBIT}, e.g. {name} = 100"
            ));
        }
        if m > 0.0 && m < 0.01 {
            return Err(format!("{name} = {m}: the smallest rate is 0.01 Mbit/s (10 kbit/s)"));
        }
        Ok((m * 1e6).round() as u64)
    };
    let (rate_in, rate_out) = (bits("rate_in", rate_in)?, bits("rate_out", rate_out)?);
    let burst = burst_kib.unwrap_or(0);
    if burst > 1 << 30 {
        return Err(format!("burst = {burst} KiB is more than 1 TiB; write KiB, e.g. burst = 256"));
    }
    if burst > 0 && burst < 64 {
        return Err(format!(
            "burst = {burst} KiB is smaller than one 64 KiB GSO frame, which could then never pass; write at least 64"
        ));
    }
    Ok(sluice_switch::RateLimit { rate_in, rate_out, burst: burst * 1024 })
}

fn check_vid(v: u16) -> Result<u16, String> {
    if (1..=4094).contains(&v) { Ok(v) } else { Err(format!("VLAN {v} is out of range: use 1 to 4094")) }
}

impl PortSpec {
    /// A TAP port with default settings.
    pub fn tap(name: &str) -> Self {
        PortSpec {
            name: name.into(),
            kind: PortKind::Tap,
            netns: None,
            mtu: None,
            offload: true,
            vlan: None,
            trunk: None,
            native: None,
            isolated: false,
            mac: None,
            ips: Vec::new(),
            drop_ethertypes: Vec::new(),
            forward_link_local: Vec::new(),
            storm_broadcast_pps: None,
            storm_multicast_pps: None,
            storm_burst: None,
            rate_in: None,
            rate_out: None,
            burst: None,
            mirror: Vec::new(),
            backups: Vec::new(),
            path: None,
            local: None,
            remotes: Vec::new(),
            remotes_only: None,
            vni: None,
            vni_map: None,
            dstport: None,
            evpn: false,
            socket: None,
            client: false,
            ifname: None,
            mcast_router: McastRouterSpec::Auto,
        }
    }

    /// The name of the port's interface inside the guest: `ifname`, or the port's name.
    pub fn guest_ifname(&self) -> &str {
        self.ifname.as_deref().unwrap_or(&self.name)
    }

    /// The settings in which this description and `other` differ (`name`, `ifname` as the
    /// guest sees it, …), as the config file spells them: empty when they describe the
    /// same port.
    pub fn differences(&self, other: &PortSpec) -> Vec<String> {
        let mine = serde_json::to_value(self.normalized()).unwrap_or_default();
        let theirs = serde_json::to_value(other.normalized()).unwrap_or_default();
        let keys: std::collections::BTreeSet<&String> =
            mine.as_object().into_iter().chain(theirs.as_object()).flat_map(|o| o.keys()).collect();
        keys.into_iter().filter(|k| mine.get(k.as_str()) != theirs.get(k.as_str())).cloned().collect()
    }

    /// The description with its defaults written out, for comparing.
    fn normalized(&self) -> PortSpec {
        PortSpec { ifname: Some(self.guest_ifname().to_string()), ..self.clone() }
    }

    /// A VXLAN port's settings, checked (`None` for other kinds, which must not carry them).
    pub fn vxlan(&self) -> Result<Option<VxlanSettings>, String> {
        let n = &self.name;
        let any = self.local.is_some()
            || !self.remotes.is_empty()
            || self.remotes_only.is_some()
            || self.vni.is_some()
            || self.vni_map.is_some()
            || self.dstport.is_some()
            || self.evpn;
        if self.kind != PortKind::Vxlan {
            if any {
                return Err(format!(
                    "port {n:?}: `local`, `remotes`, `remotes_only`, `vni`, `vni_map`, `dstport` and `evpn` apply to vxlan ports only"
                ));
            }
            return Ok(None);
        }
        let Some(local) = &self.local else {
            return Err(format!(
                "port {n:?}: a vxlan port needs `local`, the underlay address of this host its UDP socket binds to (e.g. local = \"192.168.77.1\")"
            ));
        };
        let local: std::net::IpAddr = local
            .parse()
            .map_err(|_| format!("port {n:?}: local {local:?} is not an IPv4 or IPv6 address (no prefix length)"))?;
        if local.is_unspecified() || local.is_multicast() {
            return Err(format!("port {n:?}: local {local} must be one of this host's unicast addresses"));
        }
        let mut remotes = Vec::new();
        for r in &self.remotes {
            let a: std::net::IpAddr =
                r.parse().map_err(|_| format!("port {n:?}: remote {r:?} is not an IPv4 or IPv6 address"))?;
            if a.is_ipv4() != local.is_ipv4() {
                return Err(format!(
                    "port {n:?}: remote {a} is not of local {local}'s family; a tunnel's underlay is IPv4 or IPv6, not both"
                ));
            }
            if a.is_unspecified() || a.is_multicast() || a == local {
                return Err(format!("port {n:?}: remote {a} is not another host's unicast address"));
            }
            if remotes.contains(&a) {
                return Err(format!("port {n:?}: remote {a} is listed twice"));
            }
            remotes.push(a);
        }
        let remotes_only = self.remotes_only.unwrap_or(true);
        if remotes_only && remotes.is_empty() && !self.evpn {
            return Err(format!(
                "port {n:?}: a vxlan port accepts datagrams from its `remotes` only, and lists none; list the other hosts' underlay addresses (remotes = [\"192.168.77.2\"]), let EVPN routes name them (evpn = true), or set remotes_only = false to accept and learn any sender on the underlay"
            ));
        }
        let vni_ok = |v: u32| {
            if v <= sluice_wire::vxlan::VNI_MAX {
                Ok(v)
            } else {
                Err(format!("port {n:?}: VNI {v} is out of range: use 0 to {}", sluice_wire::vxlan::VNI_MAX))
            }
        };
        let vnis = match (self.vni, &self.vni_map) {
            (Some(v), None) => {
                if self.trunk.is_some() {
                    return Err(format!(
                        "port {n:?}: with one `vni` the tunnel is an access port; for a trunk give `vni_map` (a VNI per VLAN)"
                    ));
                }
                sluice_switch::tunnel::VniMap::Single(vni_ok(v)?)
            }
            (None, Some(m)) => {
                let mut pairs = Vec::new();
                for (vlan, &vni) in m {
                    let vid = vlan
                        .parse::<u16>()
                        .ok()
                        .filter(|v| (1..=4094).contains(v))
                        .ok_or_else(|| format!("port {n:?}: vni_map key {vlan:?} is not a VLAN (1 to 4094)"))?;
                    let vni = vni_ok(vni)?;
                    if pairs.iter().any(|p: &(u16, u32)| p.1 == vni) {
                        return Err(format!("port {n:?}: VNI {vni} is mapped to two VLANs"));
                    }
                    pairs.push((vid, vni));
                }
                if pairs.is_empty() {
                    return Err(format!("port {n:?}: vni_map is empty; map at least one VLAN"));
                }
                if self.vlan.is_some() || self.native.is_some() {
                    return Err(format!(
                        "port {n:?}: a vni_map port is a trunk of its VLANs; leave out `vlan` and `native`"
                    ));
                }
                if let Some(t) = &self.trunk {
                    let mut a: Vec<u16> = t.clone();
                    let mut b: Vec<u16> = pairs.iter().map(|p| p.0).collect();
                    a.sort_unstable();
                    b.sort_unstable();
                    if a != b {
                        return Err(format!(
                            "port {n:?}: `trunk` must list the VLANs of `vni_map` (or be left out): {b:?}"
                        ));
                    }
                }
                sluice_switch::tunnel::VniMap::PerVlan(pairs)
            }
            (None, None) => {
                return Err(format!(
                    "port {n:?}: a vxlan port needs `vni` (one VNI for the port's frames) or `vni_map` (a VNI per VLAN)"
                ));
            }
            (Some(_), Some(_)) => return Err(format!("port {n:?}: give `vni` or `vni_map`, not both")),
        };
        let dstport = self.dstport.unwrap_or(sluice_wire::vxlan::VXLAN_PORT);
        if dstport == 0 {
            return Err(format!("port {n:?}: dstport 0 is not a port; leave it out for 4789"));
        }
        Ok(Some(VxlanSettings { local, remotes, remotes_only, vnis, dstport, evpn: self.evpn }))
    }

    /// The port's security settings, checked.
    pub fn policy(&self) -> Result<sluice_switch::PortPolicy, String> {
        let mac = match &self.mac {
            None => None,
            Some(m) => Some(m.parse::<MacAddr>().map_err(|_| {
                format!("port {:?}: mac {m:?} is not a MAC address; write it as 02:00:00:00:00:01", self.name)
            })?),
        };
        if let Some(m) = mac
            && (m.is_multicast() || m.0 == [0; 6])
        {
            return Err(format!("port {:?}: mac {m} is not a station address (group or all-zero)", self.name));
        }
        if self.isolated && self.kind == PortKind::Uplink {
            return Err(format!(
                "port {:?}: an uplink cannot be isolated (isolated ports talk only to uplinks)",
                self.name
            ));
        }
        let learn_ips = self.ips.iter().any(|a| a == "learn");
        let ips = self
            .ips
            .iter()
            .filter(|a| *a != "learn")
            .map(|a| {
                a.parse::<std::net::IpAddr>().map_err(|_| {
                    format!(
                        "port {:?}: ips: {a:?} is not an IPv4 or IPv6 address (no prefix length) or \"learn\"",
                        self.name
                    )
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        if let Some(t) = self.drop_ethertypes.iter().find(|&&t| t < 0x0600) {
            return Err(format!(
                "port {:?}: drop_ethertypes: {t:#06x} is a frame length, not an EtherType (EtherTypes start at 0x0600)",
                self.name
            ));
        }
        Ok(sluice_switch::PortPolicy {
            uplink: self.kind == PortKind::Uplink,
            isolated: self.isolated,
            mac,
            ips,
            learn_ips,
            mirror_of: self.mirror.clone(),
            drop_ethertypes: self.drop_ethertypes.clone(),
            forward_link_local: link_local_mask(&self.forward_link_local)
                .map_err(|e| format!("port {:?}: forward_link_local: {e}", self.name))?,
            storm: self.storm_control()?,
            rate: self.rate_limit()?,
            mcast_router: self.mcast_router.core(),
        })
    }

    /// The port's rate limits, checked, in bits a second.
    fn rate_limit(&self) -> Result<sluice_switch::RateLimit, String> {
        rate_limit(self.rate_in, self.rate_out, self.burst).map_err(|e| format!("port {:?}: {e}", self.name))
    }

    /// The port's storm control, checked: a burst needs a rate to apply to.
    fn storm_control(&self) -> Result<sluice_switch::StormControl, String> {
        let s = sluice_switch::StormControl {
            broadcast_pps: self.storm_broadcast_pps.unwrap_or(0),
            multicast_pps: self.storm_multicast_pps.unwrap_or(0),
            burst: self.storm_burst.unwrap_or(0),
        };
        if s.burst > 0 && s.broadcast_pps == 0 && s.multicast_pps == 0 {
            return Err(format!(
                "port {:?}: storm_burst applies to storm_broadcast_pps and storm_multicast_pps: set one of them (e.g. storm_broadcast_pps = 1000)",
                self.name
            ));
        }
        Ok(s)
    }

    /// Checks `netns` and `ifname`: a namespace by name, or by path for the kinds the switch
    /// makes a device in (TAP, veth); `ifname` for a veth the switch makes in `netns`.
    fn check_guest_side(&self) -> Result<(), String> {
        if let Some(ns) = &self.netns {
            if matches!(self.kind, PortKind::Tap | PortKind::Veth) {
                sluice_sys::netns::check(ns).map_err(|e| format!("port {:?}: {e}", self.name))?;
            } else if sluice_sys::netns::is_path(ns) {
                return Err(format!(
                    "port {:?}: netns {ns:?}: a {} port's namespace is a name under /run/netns (a path is taken by TAP and veth ports)",
                    self.name,
                    format!("{:?}", self.kind).to_lowercase()
                ));
            } else {
                check_netns_name(ns).map_err(|e| format!("port {:?}: {e}", self.name))?;
            }
        }
        let Some(ifname) = &self.ifname else { return Ok(()) };
        check_ifname(ifname).map_err(|e| format!("port {:?}: ifname: {e}", self.name))?;
        if ifname == &self.name {
            return Ok(());
        }
        if self.kind != PortKind::Veth || self.netns.is_none() {
            return Err(format!(
                "port {:?}: `ifname` {ifname:?} names the end of a veth pair the switch makes in the guest's namespace: it applies to veth ports with `netns` (a TAP's device is named by the port)",
                self.name
            ));
        }
        Ok(())
    }

    /// Checks the description and returns its VLAN membership.
    pub fn validate(&self) -> Result<VlanMode, String> {
        check_ifname(&self.name).map_err(|e| format!("port {e}"))?;
        self.check_guest_side()?;
        self.policy()?;
        self.vxlan()?;
        match (self.kind, &self.path) {
            (PortKind::Stream, None) => {
                return Err(format!(
                    "port {:?}: a stream port needs `path`, the unix socket its peer (QEMU's `-netdev stream,server=on`, or `sluice port relay`) listens on",
                    self.name
                ));
            }
            (PortKind::Stream, Some(_)) if self.netns.is_some() => {
                return Err(format!(
                    "port {:?}: a stream port is a unix socket, reached by its path; leave out `netns`",
                    self.name
                ));
            }
            (PortKind::Stream, Some(_)) => {}
            (_, Some(_)) => return Err(format!("port {:?}: `path` applies to stream ports only", self.name)),
            (_, None) => {}
        }
        match (self.kind, &self.socket) {
            (PortKind::VhostUser, None) => {
                return Err(format!(
                    "port {:?}: a vhost-user port needs `socket`, the unix socket QEMU's `-chardev socket,path=…` names (e.g. socket = \"/run/sluice/{}.sock\")",
                    self.name, self.name
                ));
            }
            (PortKind::VhostUser, Some(_)) if self.netns.is_some() => {
                return Err(format!(
                    "port {:?}: a vhost-user port is a unix socket, reached by its path; leave out `netns`",
                    self.name
                ));
            }
            (PortKind::VhostUser, Some(p)) if p.as_os_str().len() >= 108 => {
                return Err(format!(
                    "port {:?}: socket {:?} is longer than a unix socket path may be (107 bytes)",
                    self.name,
                    p.display()
                ));
            }
            (PortKind::VhostUser, Some(_)) => {}
            (_, Some(_)) => {
                return Err(format!("port {:?}: `socket` applies to vhost-user ports only", self.name));
            }
            (_, None) if self.client => {
                return Err(format!("port {:?}: `client` applies to vhost-user ports only", self.name));
            }
            (_, None) => {}
        }
        if !self.backups.is_empty() {
            if self.kind != PortKind::Uplink {
                return Err(format!("port {:?}: `backups` applies to uplink ports only", self.name));
            }
            if self.backups.len() > 2 {
                return Err(format!("port {:?}: at most two backups (three devices in all)", self.name));
            }
            for b in &self.backups {
                check_ifname(b).map_err(|e| format!("port {:?}: backup {e}", self.name))?;
                if *b == self.name || self.backups.iter().filter(|x| *x == b).count() > 1 {
                    return Err(format!("port {:?}: backup {b:?} is listed twice", self.name));
                }
            }
        }
        if let Some(m) = self.mtu
            && !sluice_switch::switch_mtu_range().contains(&m)
        {
            return Err(format!("port {:?}: MTU {m} is out of range: use 68 to 9000", self.name));
        }
        let at = |e: String| format!("port {:?}: {e}", self.name);
        // A VNI per VLAN makes the tunnel a trunk of those VLANs.
        if let Some(VxlanSettings { vnis: sluice_switch::tunnel::VniMap::PerVlan(pairs), .. }) = self.vxlan()?
            && self.trunk.is_none()
        {
            return Ok(VlanMode::Trunk { allowed: pairs.iter().map(|p| p.0).collect(), native: None });
        }
        match (&self.vlan, &self.trunk) {
            (Some(_), Some(_)) => Err(at("set either `vlan` (access port) or `trunk` (trunk port), not both".into())),
            (_, None) if self.native.is_some() => {
                Err(at("`native` applies to trunk ports only; add `trunk = [...]`".into()))
            }
            (v, None) => Ok(VlanMode::Access(check_vid(v.unwrap_or(1)).map_err(at)?)),
            (None, Some(list)) => {
                for &v in list {
                    check_vid(v).map_err(at)?;
                }
                let native = self.native.map(check_vid).transpose().map_err(at)?;
                Ok(VlanMode::Trunk { allowed: list.iter().copied().collect(), native })
            }
        }
    }
}

/// What each port may do, when grants are on (the reference switch's GRANT): which VLANs
/// it may join, and whether it may be promiscuous (a mirror of other ports' traffic).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grants {
    /// Port name → the VLANs it may join.
    pub vlans: std::collections::BTreeMap<String, std::collections::BTreeSet<u16>>,
    /// Ports that may be promiscuous.
    pub promiscuous: std::collections::BTreeSet<String>,
}

/// A `[[class]]` table: a traffic class (docs/config.md, "Traffic classes").
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ClassSpec {
    name: String,
    /// "any", "pcp=N", "dscp=N" or "port=NAME".
    #[serde(rename = "match")]
    matches: String,
    #[serde(default)]
    lossless: Option<bool>,
    queue_len: Option<usize>,
}

impl ClassSpec {
    /// The core's class, or what is wrong with this one.
    fn core(&self, switch_lossless: bool) -> Result<sluice_switch::ClassConfig, String> {
        use sluice_switch::ClassMatch;
        let m = self.matches.trim();
        let (key, value) = m.split_once('=').map(|(k, v)| (k.trim(), v.trim())).unwrap_or((m, ""));
        let number =
            |max: u8| -> Result<u8, String> {
                value.parse::<u8>().ok().filter(|v| *v <= max).ok_or_else(|| {
                    format!("class {:?}: {key} takes a number from 0 to {max}, not {value:?}", self.name)
                })
            };
        let matches = match key {
            "any" if value.is_empty() => ClassMatch::Any,
            "pcp" => ClassMatch::Pcp(number(7)?),
            "dscp" => ClassMatch::Dscp(number(63)?),
            "port" if !value.is_empty() => ClassMatch::Port(value.trim_matches('"').to_string()),
            _ => {
                return Err(format!(
                    "class {:?}: match {:?} is not one of \"any\", \"pcp=0..7\", \"dscp=0..63\", \"port=NAME\"",
                    self.name, self.matches
                ));
            }
        };
        if let Some(q) = self.queue_len
            && !(1..=65536).contains(&q)
        {
            return Err(format!("class {:?}: queue_len {q} is out of range: use 1 to 65536", self.name));
        }
        Ok(sluice_switch::ClassConfig {
            name: self.name.clone(),
            matches,
            lossless: self.lossless.unwrap_or(switch_lossless),
            queue_len: self.queue_len,
        })
    }
}

/// A `[[grant]]` table: `port` may join `vlans`, and be promiscuous if so granted.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Grant {
    /// The port's name.
    pub port: String,
    /// VLANs it may join.
    #[serde(default)]
    pub vlans: Vec<u16>,
    /// It may be a mirror (see other ports' traffic).
    #[serde(default)]
    pub promiscuous: bool,
}

impl PortSpec {
    /// Checks that every VLAN the port joins (access VLAN; trunk list and native) is
    /// granted to it, and promiscuous mode if it is a mirror.
    pub fn check_grants(&self, grants: &Grants) -> Result<(), String> {
        if !self.mirror.is_empty() && !grants.promiscuous.contains(&self.name) {
            return Err(format!(
                "port {:?} is not granted promiscuous mode, which a mirror needs (it sees other ports' traffic); grant it first with `sluice grant add {} --promiscuous` (or `promiscuous = true` in its [[grant]] table)",
                self.name, self.name
            ));
        }
        let grants = &grants.vlans;
        let vlans: Vec<u16> = match self.validate()? {
            VlanMode::Access(v) => vec![v],
            VlanMode::Trunk { allowed, native } => allowed.iter().chain(native).collect(),
        };
        let granted = grants.get(&self.name);
        let missing: Vec<String> =
            vlans.iter().filter(|v| !granted.is_some_and(|g| g.contains(v))).map(|v| v.to_string()).collect();
        if missing.is_empty() {
            return Ok(());
        }
        Err(format!(
            "port {:?} is not granted VLAN {}; grant it first with `sluice grant add {} --vlan {}` (or a [[grant]] table in the switch's config)",
            self.name,
            missing.join(", "),
            self.name,
            missing.join(",")
        ))
    }
}

/// A static MAC table entry.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StaticMac {
    /// The station's address.
    pub mac: String,
    /// Its VLAN (default 1).
    #[serde(default = "one")]
    pub vlan: u16,
    /// The port it is behind.
    pub port: String,
}

fn one() -> u16 {
    1
}

/// Transport mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Ports known by MAC address; any EtherType.
    L2,
    /// Ports known by IP address; the switch answers ARP and neighbour discovery and
    /// forwards IPv4 and IPv6 by destination address.
    L3,
}

impl Mode {
    /// The mode as the config file spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::L2 => "l2",
            Mode::L3 => "l3",
        }
    }

    /// The forwarding core's mode.
    pub fn core(self) -> sluice_switch::Mode {
        match self {
            Mode::L2 => sluice_switch::Mode::L2,
            Mode::L3 => sluice_switch::Mode::L3,
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SwitchFile {
    name: Spanned<String>,
    mode: Option<Spanned<String>>,
    router_mac: Option<Spanned<String>>,
    mtu: Option<Spanned<u16>>,
    mac_aging: Option<Spanned<u64>>,
    lossless: Option<bool>,
    queue_len: Option<Spanned<usize>>,
    hold_len: Option<Spanned<usize>>,
    watchdog_ms: Option<Spanned<u64>>,
    #[serde(default)]
    class: Vec<Spanned<ClassSpec>>,
    batch: Option<Spanned<usize>>,
    mac_table_size: Option<Spanned<usize>>,
    mac_limit_per_port: Option<Spanned<usize>>,
    poll: Option<bool>,
    datapath: Option<Spanned<String>>,
    datapath_nice: Option<Spanned<i32>>,
    socket: Option<PathBuf>,
    metrics_listen: Option<Spanned<String>>,
    monitor_interval: Option<Spanned<String>>,
    monitor_file: Option<Spanned<PathBuf>>,
    monitor_max_mb: Option<Spanned<u64>>,
    #[serde(default)]
    port: Vec<Spanned<PortSpec>>,
    #[serde(default)]
    mac: Vec<Spanned<StaticMac>>,
    grants: Option<bool>,
    #[serde(default)]
    grant: Vec<Spanned<Grant>>,
    vhost_allow_users: Option<Vec<Spanned<NameOrId>>>,
    vhost_allow_groups: Option<Vec<Spanned<NameOrId>>>,
    // The gateway (see `GatewaySettings`).
    gateway: Option<Spanned<String>>,
    gateway6: Option<Spanned<String>>,
    gateway_dns: Option<Spanned<bool>>,
    gateway_dhcp_range: Option<Spanned<String>>,
    gateway_uplink: Option<Spanned<String>>,
    #[serde(default)]
    acl: Vec<Spanned<AclEntry>>,
    conntrack_max: Option<Spanned<usize>>,
    mcast_snooping: Option<bool>,
    mcast_query_interval: Option<Spanned<u64>>,
    mcast_query_response_interval: Option<Spanned<u64>>,
    mcast_membership_interval: Option<Spanned<u64>>,
    evpn: Option<Spanned<EvpnFile>>,
}

/// IGMP/MLD snooping's settings (seconds in the file).
fn snooping(
    f: &SwitchFile,
    s: &mut sluice_switch::SnoopConfig,
    err: &dyn Fn(Option<Range<usize>>, String) -> ConfigError,
) -> Result<(), ConfigError> {
    s.enabled = f.mcast_snooping.unwrap_or(true);
    for (field, target, name) in [
        (&f.mcast_query_interval, &mut s.query_interval_ms, "mcast_query_interval"),
        (&f.mcast_query_response_interval, &mut s.query_response_ms, "mcast_query_response_interval"),
        (&f.mcast_membership_interval, &mut s.membership_ms, "mcast_membership_interval"),
    ] {
        if let Some(v) = field {
            if *v.get_ref() == 0 || *v.get_ref() > 3600 {
                return Err(err(Some(v.span()), format!("{name} is in seconds: use 1 to 3600")));
            }
            *target = v.get_ref() * 1000;
        }
    }
    if s.query_response_ms >= s.query_interval_ms {
        let at = f.mcast_query_response_interval.as_ref().or(f.mcast_query_interval.as_ref()).map(|v| v.span());
        return Err(err(at, "mcast_query_response_interval must be shorter than mcast_query_interval".into()));
    }
    // RFC 3376 §8: robustness 2 × query interval + response interval, unless set.
    if f.mcast_membership_interval.is_none() {
        s.membership_ms = 2 * s.query_interval_ms + s.query_response_ms;
    } else if s.membership_ms <= s.query_interval_ms {
        let at = f.mcast_membership_interval.as_ref().map(|v| v.span());
        return Err(err(
            at,
            "mcast_membership_interval must be longer than mcast_query_interval (members answer each query)".into(),
        ));
    }
    s.other_querier_ms = 2 * s.query_interval_ms + s.query_response_ms / 2;
    Ok(())
}

/// A `[[acl]]` entry: a security-group rule of a port, or (`default = true`) the port's
/// default action for a direction.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AclEntry {
    port: String,
    dir: String,
    action: String,
    #[serde(default)]
    default: bool,
    proto: Option<String>,
    src: Option<String>,
    dst: Option<String>,
    dport: Option<DportValue>,
    icmp_type: Option<u8>,
    ethertype: Option<String>,
    #[serde(default)]
    priority: i32,
}

/// `dport = 22` or `dport = "1000-2000"`.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
enum DportValue {
    Port(u16),
    Range(String),
}

/// The largest connection table a switch may configure (`conntrack_max`).
pub const MAX_CONNTRACK: usize = 1 << 22;

/// The datapath thread's default niceness. The kernel's own switches (bridge, OVS kernel
/// datapath) forward in softirq context, ahead of every task; a user-space switch sharing
/// cores with busy guests needs more than a fair share to keep up with them.
pub const DEFAULT_DATAPATH_NICE: i32 = -10;

/// A validated switch configuration.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Switch name.
    pub name: String,
    /// Transport mode.
    pub mode: Mode,
    /// Core settings.
    pub core: SwitchConfig,
    /// Busy-poll instead of sleeping in epoll (costs a core).
    pub poll: bool,
    /// Which datapath forwards.
    pub datapath: DatapathKind,
    /// Scheduling niceness of the datapath thread.
    pub datapath_nice: i32,
    /// Control socket path.
    pub socket: PathBuf,
    /// Where the Prometheus / OpenMetrics endpoint listens (`None`: it does not).
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// Monitor records from the start (`None`: only after `sluice monitor start`).
    pub monitor: Option<MonitorSettings>,
    /// Ports to attach at start.
    pub ports: Vec<PortSpec>,
    /// Static MAC entries.
    pub macs: Vec<(u16, MacAddr, String)>,
    /// VLAN grants, when enforced (`grants = true`); `None`: any port may join any VLAN.
    pub grants: Option<Grants>,
    /// Who may drive the switch's vhost-user ports besides root and the switch's own user.
    pub vhost_allow: VhostAllow,
    /// The gateway (router, DHCP, router advertisements, masquerade), when `gateway` is set.
    pub gateway: Option<GatewaySettings>,
    /// Security-group rules (`[[acl]]`), by port, in the file's order.
    pub acls: Vec<(String, sluice_switch::acl::AclRuleSpec)>,
    /// Security-group defaults (`[[acl]]` with `default = true`).
    pub acl_defaults: Vec<(String, sluice_switch::acl::Dir, sluice_switch::acl::AclAction)>,
    /// The connection table's size (user-space datapath).
    pub conntrack_max: usize,
    /// EVPN (`[evpn]`): the BGP speaker that announces and receives the stations of the
    /// port with `evpn = true`.
    pub evpn: Option<EvpnSettings>,
}

/// Checks a switch name: 1–32 of letters, digits, `-`, `_`, `.`.
pub fn check_switch_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 32
        && !name.starts_with('.')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
    if ok { Ok(()) } else { Err(format!("switch name {name:?} must be 1 to 32 letters, digits, '-', '_' or '.'")) }
}

/// Reads and validates a configuration file.
pub fn load(path: &Path) -> Result<Settings, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
        file: path.into(),
        line: None,
        col: None,
        message: format!("cannot read the configuration: {e}"),
    })?;
    parse(&text, path)
}

/// Validates configuration text read from `path`.
pub fn parse(text: &str, path: &Path) -> Result<Settings, ConfigError> {
    let err = |span: Option<Range<usize>>, message: String| {
        let (line, col) = match span {
            Some(s) => {
                let (l, c) = line_col(text, s.start);
                (Some(l), Some(c))
            }
            None => (None, None),
        };
        ConfigError { file: path.into(), line, col, message }
    };
    let f: SwitchFile = toml::from_str(text).map_err(|e| err(e.span(), e.message().trim().to_string()))?;

    check_switch_name(f.name.get_ref()).map_err(|m| err(Some(f.name.span()), m))?;
    let mode = match &f.mode {
        None => Mode::L2,
        Some(m) if m.get_ref() == "l2" => Mode::L2,
        Some(m) if m.get_ref() == "l3" => Mode::L3,
        Some(m) => return Err(err(Some(m.span()), format!("unknown mode {:?}; use \"l2\" or \"l3\"", m.get_ref()))),
    };
    let mut core = SwitchConfig { mode: mode.core(), ..SwitchConfig::default() };
    if let Some(r) = &f.router_mac {
        match r.get_ref().parse::<MacAddr>() {
            Ok(m) if !m.is_multicast() && !m.is_zero() => core.router_mac = m,
            _ => {
                return Err(err(
                    Some(r.span()),
                    format!("router_mac {:?} is not a station MAC address; write it as 02:00:00:00:00:01", r.get_ref()),
                ));
            }
        }
    }
    if let Some(m) = &f.mtu {
        if !sluice_switch::switch_mtu_range().contains(m.get_ref()) {
            return Err(err(Some(m.span()), format!("MTU {} is out of range: use 68 to 9000", m.get_ref())));
        }
        core.mtu = *m.get_ref();
    }
    if let Some(a) = &f.mac_aging {
        if *a.get_ref() == 0 || *a.get_ref() > 1_000_000 {
            return Err(err(Some(a.span()), "mac_aging is in seconds: use 1 to 1000000".into()));
        }
        core.aging_ms = a.get_ref() * 1000;
    }
    core.lossless = f.lossless.unwrap_or(false);
    for (field, target, max) in [
        (&f.queue_len, &mut core.queue_len, 65536usize),
        (&f.hold_len, &mut core.hold_len, 65535),
        (&f.batch, &mut core.batch, 1024),
        (&f.mac_table_size, &mut core.fib_max, 1 << 20),
        (&f.mac_limit_per_port, &mut core.port_mac_limit, 1 << 20),
    ] {
        if let Some(v) = field {
            if *v.get_ref() == 0 || *v.get_ref() > max {
                return Err(err(Some(v.span()), format!("value {} is out of range: use 1 to {max}", v.get_ref())));
            }
            *target = *v.get_ref();
        }
    }
    if let Some(w) = &f.watchdog_ms {
        if *w.get_ref() > 3_600_000 {
            return Err(err(Some(w.span()), "watchdog_ms is out of range: use 0 (off) to 3600000".into()));
        }
        core.watchdog_ms = *w.get_ref();
    }
    snooping(&f, &mut core.snoop, &err)?;
    for c in &f.class {
        let class = c.get_ref().core(core.lossless).map_err(|m| err(Some(c.span()), m))?;
        core.classes.push(class);
    }
    if let Err(e) = sluice_switch::class::check(&core.classes) {
        return Err(err(f.class.last().map(|c| c.span()), e.to_string()));
    }
    let metrics_listen = match &f.metrics_listen {
        None => None,
        Some(a) => Some(parse_listen(a.get_ref()).map_err(|m| err(Some(a.span()), m))?),
    };
    let monitor = match (&f.monitor_file, &f.monitor_interval) {
        (None, None) => {
            if let Some(m) = &f.monitor_max_mb {
                return Err(err(Some(m.span()), "monitor_max_mb needs monitor_file".into()));
            }
            None
        }
        (None, Some(i)) => {
            return Err(err(
                Some(i.span()),
                "monitor_interval needs monitor_file, the file the records go to (e.g. monitor_file = \"/var/log/sluice/sw0.monitor\")".into(),
            ));
        }
        (Some(file), interval) => {
            let interval = match interval {
                Some(i) => {
                    parse_interval(i.get_ref()).map_err(|m| err(Some(i.span()), format!("monitor_interval: {m}")))?
                }
                None => std::time::Duration::from_secs(1),
            };
            let max_mb = match &f.monitor_max_mb {
                Some(m) if (1..=1 << 20).contains(m.get_ref()) => *m.get_ref(),
                Some(m) => {
                    return Err(err(
                        Some(m.span()),
                        format!("monitor_max_mb {} is out of range: use 1 to 1048576", m.get_ref()),
                    ));
                }
                None => DEFAULT_MONITOR_MAX_MB,
            };
            Some(MonitorSettings { file: file.get_ref().clone(), interval, max_bytes: max_mb << 20 })
        }
    };
    let datapath_nice = match &f.datapath_nice {
        None => DEFAULT_DATAPATH_NICE,
        Some(n) if (-20..=19).contains(n.get_ref()) => *n.get_ref(),
        Some(n) => {
            return Err(err(Some(n.span()), format!("datapath_nice {} is out of range: use -20 to 19", n.get_ref())));
        }
    };
    let grants = match f.grants {
        Some(true) => {
            let mut g = Grants::default();
            for t in &f.grant {
                for &v in &t.get_ref().vlans {
                    check_vid(v).map_err(|m| err(Some(t.span()), format!("grant for {:?}: {m}", t.get_ref().port)))?;
                }
                if t.get_ref().vlans.is_empty() && !t.get_ref().promiscuous {
                    return Err(err(
                        Some(t.span()),
                        format!(
                            "grant for {:?} grants nothing: give `vlans` or `promiscuous = true`",
                            t.get_ref().port
                        ),
                    ));
                }
                g.vlans.entry(t.get_ref().port.clone()).or_default().extend(t.get_ref().vlans.iter().copied());
                if t.get_ref().promiscuous {
                    g.promiscuous.insert(t.get_ref().port.clone());
                }
            }
            Some(g)
        }
        _ => {
            if let Some(t) = f.grant.first() {
                return Err(err(
                    Some(t.span()),
                    "[[grant]] tables take effect only with `grants = true` at the top of the file".into(),
                ));
            }
            None
        }
    };
    let datapath = match &f.datapath {
        None => DatapathKind::User,
        Some(d) if d.get_ref() == "user" => DatapathKind::User,
        Some(d) if d.get_ref() == "kernel" => DatapathKind::Kernel,
        Some(d) => {
            return Err(err(Some(d.span()), format!("unknown datapath {:?}; use \"user\" or \"kernel\"", d.get_ref())));
        }
    };
    if let Err(m) = check_lossless(datapath, core.lossless || core.classes.iter().any(|c| c.lossless)) {
        let at = f.datapath.as_ref().map(|d| d.span());
        return Err(err(at, m));
    }
    let gateway = gateway_settings(&f, &err)?;
    let evpn = evpn_settings(&f, core.fib_max, &err)?;
    let name = f.name.into_inner();
    let mut ports: Vec<PortSpec> = Vec::new();
    for p in &f.port {
        p.get_ref().validate().map_err(|m| err(Some(p.span()), m))?;
        check_datapath(p.get_ref(), datapath).map_err(|m| err(Some(p.span()), m))?;
        if ports.iter().any(|q| q.name == p.get_ref().name) {
            return Err(err(Some(p.span()), format!("port {:?} is listed twice", p.get_ref().name)));
        }
        if let Some(g) = &grants {
            p.get_ref().check_grants(g).map_err(|m| err(Some(p.span()), m))?;
        }
        if mode == Mode::L3 {
            let mine = p.get_ref().policy().map_err(|m| err(Some(p.span()), m))?.ips;
            for q in &ports {
                if let Some(ip) = q.policy().map_err(|m| err(Some(p.span()), m))?.ips.iter().find(|a| mine.contains(a))
                {
                    return Err(err(
                        Some(p.span()),
                        format!(
                            "port {:?}: {ip} already belongs to port {:?}; in Layer 3 mode an address belongs to one port",
                            p.get_ref().name,
                            q.name
                        ),
                    ));
                }
            }
        }
        ports.push(p.get_ref().clone());
    }
    let mut macs = Vec::new();
    for m in &f.mac {
        let e = m.get_ref();
        let mac: MacAddr = e
            .mac
            .parse()
            .map_err(|_| err(Some(m.span()), format!("{:?} is not a MAC address (aa:bb:cc:dd:ee:ff)", e.mac)))?;
        check_vid(e.vlan).map_err(|x| err(Some(m.span()), x))?;
        if mac.is_multicast() || mac.is_zero() {
            return Err(err(
                Some(m.span()),
                format!("{mac} is not one station's address: a static entry needs a unicast MAC (the first byte even)"),
            ));
        }
        if !ports.iter().any(|p| p.name == e.port) {
            return Err(err(Some(m.span()), format!("MAC entry names port {:?}, which is not configured", e.port)));
        }
        macs.push((e.vlan, mac, e.port.clone()));
    }
    // Security groups: each rule checked where it is written, the bounds counted.
    let mut acls = Vec::new();
    let mut acl_defaults = Vec::new();
    let mut per_port: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    for a in &f.acl {
        use sluice_switch::acl::{self, AclRule, AclRuleSpec};
        let e = a.get_ref();
        let at = |m: String| err(Some(a.span()), format!("[[acl]] of port {:?}: {m}", e.port));
        if e.default {
            let dir = acl::parse_dir(&e.dir).map_err(|x| at(x.to_string()))?;
            let action = acl::parse_action(&e.action).map_err(|x| at(x.to_string()))?;
            if action == acl::AclAction::AllowRelated {
                return Err(at("action: a default is allow or deny".into()));
            }
            acl_defaults.push((e.port.clone(), dir, action));
            continue;
        }
        let spec = AclRuleSpec {
            dir: e.dir.clone(),
            action: e.action.clone(),
            proto: e.proto.clone(),
            src: e.src.clone(),
            dst: e.dst.clone(),
            dport: e.dport.as_ref().map(|d| match d {
                DportValue::Port(p) => p.to_string(),
                DportValue::Range(r) => r.clone(),
            }),
            icmp_type: e.icmp_type,
            ethertype: e.ethertype.clone(),
            priority: e.priority,
        };
        AclRule::parse(&spec, 0).map_err(|x| at(x.to_string()))?;
        let n = per_port.entry(&e.port).or_default();
        *n += 1;
        if *n > acl::MAX_RULES_PER_PORT {
            return Err(at(format!(
                "rules: more than {} rules for one port, the most a port may have",
                acl::MAX_RULES_PER_PORT
            )));
        }
        if acls.len() >= acl::MAX_RULES_PER_SWITCH {
            return Err(at(format!(
                "rules: more than {} rules, the most a switch may have",
                acl::MAX_RULES_PER_SWITCH
            )));
        }
        acls.push((e.port.clone(), spec));
    }
    let conntrack_max = match &f.conntrack_max {
        None => sluice_switch::conntrack::DEFAULT_CT_MAX,
        Some(v) if (1..=MAX_CONNTRACK).contains(v.get_ref()) => *v.get_ref(),
        Some(v) => {
            return Err(err(
                Some(v.span()),
                format!("conntrack_max {} is out of range: use 1 to {MAX_CONNTRACK}", v.get_ref()),
            ));
        }
    };
    Ok(Settings {
        socket: f.socket.unwrap_or_else(|| paths::socket_for(&name)),
        name,
        mode,
        core,
        poll: f.poll.unwrap_or(false),
        datapath,
        datapath_nice,
        metrics_listen,
        monitor,
        ports,
        macs,
        grants,
        acls,
        acl_defaults,
        conntrack_max,
        vhost_allow: VhostAllow {
            users: resolve_ids(&f.vhost_allow_users, "vhost_allow_users", resolve_user, &err)?.unwrap_or_default(),
            groups: resolve_ids(&f.vhost_allow_groups, "vhost_allow_groups", resolve_group, &err)?
                .unwrap_or_else(|| libvirt_qemu_group().into_iter().collect()),
        },
        gateway,
        evpn,
    })
}

/// A user or group as the configuration names it: a name, or a numeric id.
#[derive(Deserialize, Clone, Debug)]
#[serde(untagged)]
enum NameOrId {
    Id(u32),
    Name(String),
}

/// Resolves a list of users or groups (`None`: the setting is absent), naming the line of
/// one the host does not know.
fn resolve_ids(
    list: &Option<Vec<Spanned<NameOrId>>>,
    setting: &str,
    resolve: fn(&str) -> Result<u32, String>,
    err: &dyn Fn(Option<Range<usize>>, String) -> ConfigError,
) -> Result<Option<Vec<u32>>, ConfigError> {
    let Some(list) = list else { return Ok(None) };
    let mut ids = Vec::new();
    for v in list {
        let id = match v.get_ref() {
            NameOrId::Id(id) => *id,
            NameOrId::Name(n) => resolve(n).map_err(|m| err(Some(v.span()), format!("{setting}: {m}")))?,
        };
        if !ids.contains(&id) {
            ids.push(id);
        }
    }
    Ok(Some(ids))
}

/// Who may drive the switch's vhost-user ports (the process on the other side of a
/// port's socket, QEMU) besides root and the switch's own user, who always may: users and
/// groups by id. A peer is let in when its user is listed, or the group it runs in or one
/// of its supplementary groups is.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VhostAllow {
    /// `vhost_allow_users`, resolved (default: none).
    pub users: Vec<u32>,
    /// `vhost_allow_groups`, resolved (default: the group libvirt runs QEMU in, when
    /// libvirt is installed: [`libvirt_qemu_group`]).
    pub groups: Vec<u32>,
}

impl VhostAllow {
    /// The group a server-mode port's socket file is given (mode 0660), so that the
    /// allowed peers can connect at all: the first allowed group, else the primary group
    /// of the first allowed user; `None` (mode 0600) when only root and the switch's user
    /// are allowed.
    pub fn socket_group(&self) -> Option<u32> {
        self.groups.first().copied().or_else(|| self.users.first().and_then(|&u| sluice_sys::user::user_gid(u)))
    }
}

/// The user Debian's libvirt runs QEMU as (`user` in /etc/libvirt/qemu.conf, by default).
pub const LIBVIRT_QEMU_USER: &str = "libvirt-qemu";

/// The group libvirt runs QEMU in, when libvirt is installed (the user `libvirt-qemu`
/// exists): `group` in /etc/libvirt/qemu.conf when it is set, else the group
/// `libvirt-qemu` (Debian's built-in default), else that user's primary group.
pub fn libvirt_qemu_group() -> Option<u32> {
    let (_, primary) = sluice_sys::user::user_ids(LIBVIRT_QEMU_USER)?;
    let conf = std::fs::read("/etc/libvirt/qemu.conf").ok();
    let set = conf.as_deref().and_then(|t| qemu_conf_group(&String::from_utf8_lossy(&t[..t.len().min(1 << 20)])));
    set.and_then(|g| resolve_group(g.strip_prefix('+').unwrap_or(&g)).ok())
        .or_else(|| sluice_sys::user::group_id(LIBVIRT_QEMU_USER))
        .or(Some(primary))
}

/// The value of an active `group = "…"` line of libvirt's qemu.conf.
fn qemu_conf_group(text: &str) -> Option<String> {
    text.lines().filter_map(|l| l.split_once('=')).find(|(k, _)| k.trim() == "group").and_then(|(_, v)| {
        let v = v.trim();
        let v = v.strip_prefix('"')?.strip_suffix('"')?;
        (!v.is_empty()).then(|| v.to_string())
    })
}

/// A user name or numeric uid, as this host knows it.
pub fn resolve_user(s: &str) -> Result<u32, String> {
    if let Ok(id) = s.parse::<u32>() {
        return Ok(id);
    }
    sluice_sys::user::user_ids(s)
        .map(|(uid, _)| uid)
        .ok_or_else(|| format!("no user {s:?} on this host: write a user name from /etc/passwd or a numeric uid"))
}

/// A group name or numeric gid, as this host knows it.
pub fn resolve_group(s: &str) -> Result<u32, String> {
    if let Ok(id) = s.parse::<u32>() {
        return Ok(id);
    }
    sluice_sys::user::group_id(s)
        .ok_or_else(|| format!("no group {s:?} on this host: write a group name from /etc/group or a numeric gid"))
}

/// Monitor records: where, how often, how much at most.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MonitorSettings {
    /// The record file (`FILE.1` holds the one before it).
    pub file: PathBuf,
    /// Between records.
    pub interval: std::time::Duration,
    /// The file is rotated before it passes this size.
    pub max_bytes: u64,
}

/// The size a monitor file is rotated at, in MiB, unless `monitor_max_mb` says otherwise.
pub const DEFAULT_MONITOR_MAX_MB: u64 = 64;

/// Parses an interval: `500ms`, `1s`, `2m`, or a number of seconds; 100 ms to 1 hour.
pub fn parse_interval(s: &str) -> Result<std::time::Duration, String> {
    let t = s.trim();
    let (num, unit) = t.split_at(t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len()));
    let n: f64 = num.parse().map_err(|_| format!("interval {s:?}: write e.g. \"1s\", \"500ms\" or \"2m\""))?;
    let secs = match unit.trim() {
        "ms" => n / 1000.0,
        "" | "s" => n,
        "m" | "min" => n * 60.0,
        u => return Err(format!("interval {s:?}: unknown unit {u:?} (ms, s or m)")),
    };
    if !(0.1..=3600.0).contains(&secs) {
        return Err(format!("interval {s:?} is out of range: use 100ms to 1 hour"));
    }
    Ok(std::time::Duration::from_secs_f64(secs))
}

/// Parses a listening address for the metrics endpoint: `ADDR:PORT` (`[ADDR]:PORT` for
/// IPv6).
pub fn parse_listen(a: &str) -> Result<std::net::SocketAddr, String> {
    a.parse().map_err(|_| {
        format!(
            "metrics_listen {a:?} is not an address and port: write e.g. \"127.0.0.1:9750\" (or \"[::1]:9750\"; \"0.0.0.0:9750\" listens on every interface)"
        )
    })
}

/// Whether a switch can be lossless on this datapath: only in user space. The kernel
/// datapath delivers with no queue to pause, and what it hands up to the core cannot
/// hold back its sender either.
pub fn check_lossless(datapath: DatapathKind, lossless: bool) -> Result<(), String> {
    if lossless && datapath == DatapathKind::Kernel {
        return Err("a lossless switch needs the user-space datapath: the kernel datapath forwards with no queue to pause and cannot hold a sender back; set `datapath = \"user\"` (or `--datapath user`), or leave out `lossless`".into());
    }
    Ok(())
}

/// Whether port `p` can be attached to a switch with this datapath (a switch on the
/// kernel datapath is never lossless: [`check_lossless`]).
pub fn check_datapath(p: &PortSpec, datapath: DatapathKind) -> Result<(), String> {
    if p.kind == PortKind::Uplink && datapath == DatapathKind::Kernel && p.netns.is_some() {
        return Err(format!(
            "port {:?}: on the kernel datapath an uplink's interface must be in the switch's own namespace (the kernel sends to it by interface index); leave out `netns`, or run the switch with datapath = \"user\"",
            p.name
        ));
    }
    if p.kind != PortKind::Veth {
        return Ok(());
    }
    if datapath != DatapathKind::Kernel {
        return Err(format!(
            "port {:?}: veth ports are forwarded by the kernel datapath; set `datapath = \"kernel\"` for the switch (or `--datapath kernel`), or attach the guest with a TAP port",
            p.name
        ));
    }
    Ok(())
}

fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let col = before.rfind('\n').map_or(before.len(), |i| before.len() - i - 1) + 1;
    (line, col)
}

/// `--datapath` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Default)]
pub enum DatapathArg {
    /// One user-space thread moves every frame.
    #[default]
    User,
    /// TC programs forward between veth ports in the kernel.
    Kernel,
}

impl DatapathArg {
    /// The configuration's value.
    pub fn kind(self) -> DatapathKind {
        match self {
            DatapathArg::User => DatapathKind::User,
            DatapathArg::Kernel => DatapathKind::Kernel,
        }
    }
}

/// Parses an `--mtu` value: 68 to 9000 (what the switch accepts), said with the range.
pub fn mtu_arg(s: &str) -> Result<u16, String> {
    let range = sluice_switch::switch_mtu_range();
    match s.parse::<u32>() {
        Ok(m) if (*range.start() as u32..=*range.end() as u32).contains(&m) => Ok(m as u16),
        Ok(m) => Err(format!("MTU {m} is out of range: use {} to {}", range.start(), range.end())),
        Err(_) => Err(format!("{s:?} is not an MTU: use a number from {} to {}", range.start(), range.end())),
    }
}

// ---- The gateway (`gateway = "10.77.0.254/24"`): docs/policy.md, "A gateway". ----

/// A switch's gateway: an address on the host's end of a port of the switch, dnsmasq
/// serving DHCP (and router advertisements) on it, the subnet masqueraded out of the host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GatewaySettings {
    /// The gateway's IPv4 address (the guests' router).
    pub address: std::net::Ipv4Addr,
    /// The subnet's prefix length (8 to 30).
    pub prefix: u8,
    /// An IPv6 address and its /64 for router advertisements (`gateway6`).
    pub v6: Option<(std::net::Ipv6Addr, u8)>,
    /// dnsmasq answers DNS on the gateway's address (forwarding to the host's resolvers).
    pub dns: bool,
    /// The first and last address DHCP hands out.
    pub range: (std::net::Ipv4Addr, std::net::Ipv4Addr),
    /// The device masqueraded out of (`None`: any but the gateway's own).
    pub uplink: Option<String>,
}

impl GatewaySettings {
    /// The subnet's network address.
    pub fn network(&self) -> std::net::Ipv4Addr {
        let mask = u32::MAX << (32 - u32::from(self.prefix));
        (u32::from(self.address) & mask).into()
    }

    /// The subnet as `NETWORK/PREFIX`.
    pub fn subnet(&self) -> String {
        format!("{}/{}", self.network(), self.prefix)
    }
}

/// Reads an IPv4 gateway `ADDR/PREFIX`: a unicast address inside a /8 to /30, neither the
/// subnet's network nor its broadcast address.
pub fn parse_gateway(text: &str) -> Result<(std::net::Ipv4Addr, u8), String> {
    let example = "write it as the gateway's address and the subnet's prefix, e.g. gateway = \"10.77.0.254/24\"";
    let (a, p) = text.split_once('/').ok_or_else(|| format!("gateway {text:?} has no prefix; {example}"))?;
    let addr: std::net::Ipv4Addr =
        a.parse().map_err(|_| format!("gateway {text:?}: {a:?} is not an IPv4 address; {example}"))?;
    let prefix: u8 = p
        .parse()
        .ok()
        .filter(|p| (8..=30).contains(p))
        .ok_or_else(|| format!("gateway {text:?}: the prefix must be 8 to 30; {example}"))?;
    if addr.is_multicast() || addr.is_loopback() || addr.is_unspecified() || addr.is_broadcast() {
        return Err(format!("gateway {text:?} is not a unicast address; {example}"));
    }
    let host = u32::from(addr) & !(u32::MAX << (32 - u32::from(prefix)));
    if host == 0 || host == !(u32::MAX << (32 - u32::from(prefix))) {
        return Err(format!("gateway {text:?} is the subnet's network or broadcast address: give a host address"));
    }
    Ok((addr, prefix))
}

/// The DHCP range when none is given: the addresses of the subnet on the larger side of the
/// gateway (all but the gateway's own when it is the first or last).
fn default_range(addr: std::net::Ipv4Addr, prefix: u8) -> (std::net::Ipv4Addr, std::net::Ipv4Addr) {
    let mask = u32::MAX << (32 - u32::from(prefix));
    let (net, a) = (u32::from(addr) & mask, u32::from(addr));
    let (first, last) = (net + 1, (net | !mask) - 1);
    if a - first >= last - a { (first.into(), (a - 1).into()) } else { ((a + 1).into(), last.into()) }
}

fn gateway_settings(
    f: &SwitchFile,
    err: &dyn Fn(Option<Range<usize>>, String) -> ConfigError,
) -> Result<Option<GatewaySettings>, ConfigError> {
    let Some(g) = &f.gateway else {
        let others = [
            f.gateway6.as_ref().map(|v| ("gateway6", v.span())),
            f.gateway_dns.as_ref().map(|v| ("gateway_dns", v.span())),
            f.gateway_dhcp_range.as_ref().map(|v| ("gateway_dhcp_range", v.span())),
            f.gateway_uplink.as_ref().map(|v| ("gateway_uplink", v.span())),
        ];
        if let Some((key, span)) = others.into_iter().flatten().next() {
            return Err(err(Some(span), format!("{key} needs gateway (e.g. gateway = \"10.77.0.254/24\")")));
        }
        return Ok(None);
    };
    let (address, prefix) = parse_gateway(g.get_ref()).map_err(|m| err(Some(g.span()), m))?;
    let mask = u32::MAX << (32 - u32::from(prefix));
    let inside = |a: std::net::Ipv4Addr| u32::from(a) & mask == u32::from(address) & mask;
    let v6 = match &f.gateway6 {
        None => None,
        Some(v) => {
            let bad = || {
                format!(
                    "gateway6 {:?} is not an IPv6 address with a /64 prefix (router advertisements announce a /64); write e.g. gateway6 = \"fd77::fe/64\"",
                    v.get_ref()
                )
            };
            let (a, p) = v.get_ref().split_once('/').ok_or_else(|| err(Some(v.span()), bad()))?;
            let a: std::net::Ipv6Addr = a.parse().map_err(|_| err(Some(v.span()), bad()))?;
            if p != "64" || a.is_multicast() || a.is_loopback() || a.is_unspecified() {
                return Err(err(Some(v.span()), bad()));
            }
            Some((a, 64))
        }
    };
    let range = match &f.gateway_dhcp_range {
        None => default_range(address, prefix),
        Some(r) => {
            let bad = |why: &str| {
                err(
                    Some(r.span()),
                    format!(
                        "gateway_dhcp_range {:?}: {why}; write FIRST-LAST inside {}/{prefix}, e.g. \"10.77.0.100-10.77.0.199\"",
                        r.get_ref(),
                        std::net::Ipv4Addr::from(u32::from(address) & mask)
                    ),
                )
            };
            let (a, b) = r.get_ref().split_once('-').ok_or_else(|| bad("no '-' between two addresses"))?;
            let a: std::net::Ipv4Addr = a.trim().parse().map_err(|_| bad("the first is not an IPv4 address"))?;
            let b: std::net::Ipv4Addr = b.trim().parse().map_err(|_| bad("the last is not an IPv4 address"))?;
            let (net, bcast) = (u32::from(address) & mask, (u32::from(address) & mask) | !mask);
            if !inside(a) || !inside(b) || u32::from(a) == net || u32::from(b) == bcast {
                return Err(bad("it is not inside the gateway's subnet (network and broadcast addresses excluded)"));
            }
            if u32::from(a) > u32::from(b) {
                return Err(bad("the first address is after the last"));
            }
            if (u32::from(a)..=u32::from(b)).contains(&u32::from(address)) {
                return Err(bad("it holds the gateway's own address"));
            }
            (a, b)
        }
    };
    let uplink = match &f.gateway_uplink {
        None => None,
        Some(u) => {
            let name = u.get_ref();
            let ok = check_ifname(name).is_ok() && name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
            if !ok {
                return Err(err(
                    Some(u.span()),
                    format!(
                        "gateway_uplink {name:?} is not an interface name (1 to 15 letters, digits, '-', '_' or '.'), e.g. gateway_uplink = \"eth0\""
                    ),
                ));
            }
            Some(name.clone())
        }
    };
    let dns = f.gateway_dns.as_ref().is_none_or(|d| *d.get_ref());
    Ok(Some(GatewaySettings { address, prefix, v6, dns, range, uplink }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vxlan_ports_check_their_tunnel_settings_and_name_the_fault() {
        let base = "name = \"sw0\"\n[[port]]\nname = \"vx0\"\ntype = \"vxlan\"\nlocal = \"192.168.77.1\"\nremotes = [\"192.168.77.2\"]\n";
        let s = parse_str(&format!("{base}vni = 5000\n")).unwrap();
        let v = s.ports[0].vxlan().unwrap().unwrap();
        assert_eq!((v.vnis.clone(), v.dstport), (sluice_switch::tunnel::VniMap::Single(5000), 4789));
        let s = parse_str(&format!("{base}vni_map = {{ \"10\" = 5010, \"20\" = 5020 }}\n")).unwrap();
        assert_eq!(s.ports[0].validate().unwrap().to_string(), "trunk 10,20", "a VNI per VLAN makes a trunk");
        for (extra, want) in [
            ("", "needs `vni`"),
            ("vni = 16777216\n", "VNI 16777216 is out of range"),
            ("vni = 1\nvni_map = { \"10\" = 2 }\n", "not both"),
            ("vni_map = { \"10\" = 2, \"20\" = 2 }\n", "mapped to two VLANs"),
            ("vni_map = { \"5000\" = 2 }\n", "not a VLAN"),
            ("vni = 1\ntrunk = [10]\n", "access port"),
        ] {
            let e = parse_str(&format!("{base}{extra}")).unwrap_err();
            assert!(e.message.contains(want), "{extra:?}: {e}");
        }
        let e = parse_str(&base.replace("192.168.77.2", "fd78::2").replace("remotes", "vni = 1\nremotes")).unwrap_err();
        assert!(e.message.contains("family"), "{e}");
        let e = parse_str(&base.replace("local = \"192.168.77.1\"\n", "vni = 1\n")).unwrap_err();
        assert!(e.message.contains("needs `local`"), "{e}");
        let e = parse_str("name = \"sw0\"\n[[port]]\nname = \"t0\"\nvni = 3\n").unwrap_err();
        assert!(e.message.contains("vxlan ports only"), "{e}");
        let v = parse_str(&format!("{base}vni = 5000\n")).unwrap();
        assert_eq!(check_datapath(&v.ports[0], DatapathKind::Kernel), Ok(()), "both datapaths take a tunnel");
        // Only the remotes are heard unless the port says otherwise; then it needs some.
        assert!(v.ports[0].vxlan().unwrap().unwrap().remotes_only);
        let open = base.replace("remotes = [\"192.168.77.2\"]\n", "remotes_only = false\nvni = 1\n");
        let v = parse_str(&open).unwrap();
        assert!(v.ports[0].vxlan().unwrap().unwrap().remotes.is_empty());
        assert!(!v.ports[0].vxlan().unwrap().unwrap().remotes_only);
        let e = parse_str(&base.replace("remotes = [\"192.168.77.2\"]\n", "vni = 1\n")).unwrap_err();
        assert!(e.message.contains("remotes_only = false"), "{e}");
        let e = parse_str("name = \"sw0\"\n[[port]]\nname = \"t0\"\nremotes_only = false\n").unwrap_err();
        assert!(e.message.contains("vxlan ports only"), "{e}");
    }

    #[test]
    fn evpn_settings_come_with_their_port_and_bad_ones_name_the_line() {
        let port = "[[port]]\nname = \"vx0\"\ntype = \"vxlan\"\nlocal = \"192.168.77.1\"\nvni = 5000\nevpn = true\n";
        let ok = format!("name = \"sw0\"\n{port}\n[evpn]\npeers = [\"192.168.77.254\"]\n");
        let s = parse_str(&ok).unwrap();
        let e = s.evpn.unwrap();
        assert_eq!((e.asn, e.port.as_str(), e.max_routes, e.router_id), (DEFAULT_EVPN_ASN, "vx0", 4096, None));
        assert!(s.ports[0].vxlan().unwrap().unwrap().evpn, "no remotes needed");
        let e = parse_str(&format!("name = \"sw0\"\n{port}")).unwrap_err();
        assert!(e.message.contains("no [evpn] table") && e.to_string().contains(":2"), "{e}");
        let e = parse_str("name = \"sw0\"\n[evpn]\npeers = [\"192.168.77.254\"]\n").unwrap_err();
        assert!(e.message.contains("evpn = true"), "{e}");
        let e = parse_str(&ok.replace("peers", "max_routes = 9000\npeers")).unwrap_err();
        assert!(e.message.contains("mac_table_size"), "{e}");
        let e = parse_str(&ok.replace("[\"192.168.77.254\"]", "[\"x\"]")).unwrap_err();
        assert!(e.message.contains("not an IP address") && e.to_string().contains(":9"), "{e}");
        let k = parse_str(&ok.replace("name = \"sw0\"", "name = \"sw0\"\ndatapath = \"kernel\"")).unwrap();
        assert!(k.evpn.is_some(), "either datapath runs an EVPN tunnel");
    }

    #[test]
    fn evpn_duplicate_detection_has_frr_like_defaults_and_bad_keys_name_their_line() {
        use sluice_switch::evpn::DupRule;
        let port = "[[port]]\nname = \"vx0\"\ntype = \"vxlan\"\nlocal = \"192.168.77.1\"\nvni = 5000\nevpn = true\n";
        let ok = format!("name = \"sw0\"\n{port}\n[evpn]\npeers = [\"192.168.77.254\"]\n");
        assert_eq!(parse_str(&ok).unwrap().evpn.unwrap().dup, DupRule::default());
        let set = |keys: &str| parse_str(&format!("{ok}{keys}"));
        let e = set("dup_max_moves = 3\ndup_window = 60\ndup_hold = 0\n").unwrap().evpn.unwrap();
        assert_eq!(e.dup, DupRule { max_moves: 3, window_ms: 60_000, hold_ms: 0 });
        assert_eq!(set("dup_max_moves = 0\n").unwrap().evpn.unwrap().dup.max_moves, 0, "off");
        let e = set("dup_max_moves = 1\n").unwrap_err();
        assert!(e.message.contains("2 to 1000") && e.to_string().contains(":11"), "{e}");
        let e = set("dup_window = 1\ndup_hold = 10\n").unwrap_err();
        assert!(e.message.contains("dup_window") && e.to_string().contains(":11"), "{e}");
        let e = set("dup_hold = 10\n").unwrap_err();
        assert!(e.message.contains("clear-duplicates") && e.to_string().contains(":11"), "{e}");
    }

    #[test]
    fn monitor_settings_parse_with_their_units_and_name_the_line() {
        use std::time::Duration;
        assert_eq!(parse_interval("1s"), Ok(Duration::from_secs(1)));
        assert_eq!(parse_interval("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_interval("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_interval("5"), Ok(Duration::from_secs(5)));
        assert!(parse_interval("10ms").unwrap_err().contains("out of range"));
        assert!(parse_interval("1h").unwrap_err().contains("unknown unit"));
        assert!(parse_interval("soon").is_err());
        let s = parse_str("name = \"sw0\"\nmonitor_file = \"/tmp/m\"\n").unwrap();
        assert_eq!(s.monitor.unwrap().interval, Duration::from_secs(1));
        let e = parse_str("name = \"sw0\"\nmonitor_interval = \"1s\"\n").unwrap_err();
        assert!(e.message.contains("needs monitor_file") && e.to_string().contains(":2"), "{e}");
        let e = parse_str("name = \"sw0\"\nmonitor_file = \"/tmp/m\"\nmonitor_interval = \"1d\"\n").unwrap_err();
        assert!(e.to_string().contains(":3") && e.message.contains("unknown unit"), "{e}");
    }

    fn parse_str(s: &str) -> Result<Settings, ConfigError> {
        parse(s, Path::new("sw.toml"))
    }

    #[test]
    fn vhost_allow_lists_take_names_and_ids_and_name_the_line_of_an_unknown_name() {
        let s = parse_str(
            "name = \"sw0\"\nvhost_allow_users = [\"root\", 1000, \"1000\"]\nvhost_allow_groups = [\"root\", 107]\n",
        )
        .unwrap();
        assert_eq!(s.vhost_allow, VhostAllow { users: vec![0, 1000], groups: vec![0, 107] });
        assert_eq!(s.vhost_allow.socket_group(), Some(0));
        let s = parse_str("name = \"sw0\"\nvhost_allow_users = [\"root\"]\nvhost_allow_groups = []\n").unwrap();
        assert_eq!(s.vhost_allow.socket_group(), Some(0), "the first allowed user's primary group");
        let s = parse_str("name = \"sw0\"\nvhost_allow_groups = []\n").unwrap();
        assert_eq!(s.vhost_allow, VhostAllow::default());
        assert_eq!(s.vhost_allow.socket_group(), None);
        let s = parse_str("name = \"sw0\"\n").unwrap();
        assert_eq!(s.vhost_allow.groups, libvirt_qemu_group().into_iter().collect::<Vec<_>>());
        let e = parse_str("name = \"sw0\"\n\nvhost_allow_users = [\"root\", \"no-such-user-x\"]\n").unwrap_err();
        assert_eq!(e.line, Some(3), "{e}");
        assert!(e.message.starts_with("vhost_allow_users: no user \"no-such-user-x\""), "{e}");
        let e = parse_str("name = \"sw0\"\nvhost_allow_groups = [\"no-such-group-x\"]\n").unwrap_err();
        assert!(e.line == Some(2) && e.message.contains("no group \"no-such-group-x\""), "{e}");
        assert!(parse_str("name = \"sw0\"\nvhost_allow_groups = [-1]\n").is_err());
    }

    #[test]
    fn libvirts_qemu_group_is_read_from_an_active_line_only() {
        let conf = "#group = \"libvirt-qemu\"\n  user = \"libvirt-qemu\"\n";
        assert_eq!(qemu_conf_group(conf), None);
        assert_eq!(qemu_conf_group(&format!("{conf}group = \"kvm\"\n")).as_deref(), Some("kvm"));
        assert_eq!(qemu_conf_group("group=\"+107\"").as_deref(), Some("+107"));
        assert_eq!(qemu_conf_group("group = kvm\n"), None, "libvirt's values are quoted");
    }

    #[test]
    fn layer_3_mode_takes_addresses_or_learns_them_and_refuses_one_address_twice() {
        let s = parse_str(
            "name = \"sw\"\nmode = \"l3\"\nrouter_mac = \"02:00:00:00:99:01\"\n[[port]]\nname = \"a\"\nips = [\"10.0.0.1\", \"fd00::1\"]\n[[port]]\nname = \"b\"\nips = \"learn\"\n",
        )
        .unwrap();
        assert_eq!(s.mode, Mode::L3);
        assert_eq!(s.core.mode, sluice_switch::Mode::L3);
        assert_eq!(s.core.router_mac.to_string(), "02:00:00:00:99:01");
        let b = s.ports[1].policy().unwrap();
        assert!(b.learn_ips && b.ips.is_empty());
        let e = parse_str("name = \"sw\"\nmode = \"l3\"\n[[port]]\nname = \"a\"\nips = [\"10.0.0.1\"]\n[[port]]\nname = \"b\"\nips = [\"10.0.0.2\", \"10.0.0.1\"]\n")
            .unwrap_err();
        assert_eq!(e.line, Some(6), "{e}");
        assert!(e.message.contains("10.0.0.1 already belongs to port \"a\""), "{e}");
        let e = parse_str("name = \"sw\"\nrouter_mac = \"01:00:00:00:00:01\"\n").unwrap_err();
        assert_eq!(e.line, Some(2), "{e}");
        assert!(e.message.contains("router_mac"), "{e}");
    }

    #[test]
    fn a_port_drops_the_ethertypes_its_file_names() {
        let s = parse_str("name = \"sw\"\n[[port]]\nname = \"t0\"\ndrop_ethertypes = [0x88cc, 0x8863]\n").unwrap();
        assert_eq!(s.ports[0].policy().unwrap().drop_ethertypes, [0x88cc, 0x8863]);
        let e = parse_str("name = \"sw\"\n[[port]]\nname = \"t0\"\ndrop_ethertypes = [1500]\n").unwrap_err();
        assert!(e.line.is_some() && e.message.contains("a frame length, not an EtherType"), "{e}");
    }

    #[test]
    fn a_port_forwards_the_link_local_addresses_its_file_names_but_never_pause() {
        let s = parse_str(
            "name = \"sw\"\n[[port]]\nname = \"t0\"\nforward_link_local = [\"01:80:c2:00:00:0e\", \"0\", \"0x03\"]\n",
        )
        .unwrap();
        assert_eq!(s.ports[0].policy().unwrap().forward_link_local, 1 << 0x0e | 1 | 1 << 3);
        for (bad, says) in [
            ("01:80:c2:00:00:01", "pause"),
            ("02", "slow protocols"),
            ("01:80:c2:00:00:10", "not an IEEE link-local address"),
            ("ff:ff:ff:ff:ff:ff", "not an IEEE link-local address"),
            ("lldp", "not an IEEE link-local address"),
        ] {
            let e = parse_str(&format!("name = \"sw\"\n[[port]]\nname = \"t0\"\nforward_link_local = [{bad:?}]\n"))
                .unwrap_err();
            assert_eq!(e.line, Some(2), "{e}");
            assert!(e.message.contains("forward_link_local") && e.message.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn storm_control_is_read_and_a_burst_alone_is_refused() {
        let s =
            parse_str("name = \"sw\"\n[[port]]\nname = \"t0\"\nstorm_broadcast_pps = 500\nstorm_burst = 20\n").unwrap();
        let st = s.ports[0].policy().unwrap().storm;
        assert_eq!((st.broadcast_pps, st.multicast_pps, st.burst), (500, 0, 20));
        let e = parse_str("name = \"sw\"\n[[port]]\nname = \"t0\"\nstorm_burst = 20\n").unwrap_err();
        assert!(e.line == Some(2) && e.message.contains("storm_broadcast_pps"), "{e}");
    }

    #[test]
    fn rate_limits_are_mbit_on_the_wire_and_bad_ones_name_the_setting() {
        let s =
            parse_str("name = \"sw\"\n[[port]]\nname = \"t0\"\nrate_in = 10\nrate_out = 2.5\nburst = 256\n").unwrap();
        let r = s.ports[0].policy().unwrap().rate;
        assert_eq!((r.rate_in, r.rate_out, r.burst), (10_000_000, 2_500_000, 256 * 1024));
        for (bad, says) in [("rate_in = -1", "rate_in"), ("rate_out = 1e9", "rate_out"), ("burst = 8", "64 KiB")] {
            let e = parse_str(&format!("name = \"sw\"\n[[port]]\nname = \"t0\"\n{bad}\n")).unwrap_err();
            assert!(e.line == Some(2) && e.message.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn a_netns_is_a_name_not_a_path() {
        for bad in ["../../tmp/fifo", "..", ""] {
            let e = parse_str(&format!("name = \"sw\"\n[[port]]\nname = \"t0\"\nnetns = {bad:?}\n")).unwrap_err();
            assert_eq!(e.line, Some(2), "{e}");
            assert!(e.message.contains("not a name `ip netns` accepts"), "{bad:?}: {e}");
        }
        assert!(parse_str("name = \"sw\"\n[[port]]\nname = \"t0\"\nnetns = \"blue.2\"\n").is_ok());
    }

    #[test]
    fn ifname_names_the_guest_end_of_a_pair_the_switch_makes() {
        let mut p = PortSpec { kind: PortKind::Veth, netns: Some("/run/netns/cni-1".into()), ..PortSpec::tap("c1") };
        assert_eq!(p.guest_ifname(), "c1");
        p.ifname = Some("eth0".into());
        assert!(p.validate().is_ok());
        for bad in ["", "a/b", "sixteen-bytes-xx"] {
            let e = PortSpec { ifname: Some(bad.into()), ..p.clone() }.validate().unwrap_err();
            assert!(e.contains("ifname"), "{bad:?}: {e}");
        }
        // Only a veth the switch makes in a namespace has a guest end to name.
        for q in [PortSpec { netns: None, ..p.clone() }, PortSpec { kind: PortKind::Tap, ..p.clone() }] {
            let e = q.validate().unwrap_err();
            assert!(e.contains("applies to veth ports with `netns`"), "{e}");
        }
        assert!(PortSpec { ifname: Some("t0".into()), ..PortSpec::tap("t0") }.validate().is_ok());
        // A path is taken where the switch makes the device; other kinds take a name.
        let e = PortSpec { netns: Some("/proc/1/ns/net".into()), ..PortSpec::tap("u0") };
        assert!(e.validate().is_ok());
        let e = PortSpec { kind: PortKind::Uplink, ..e }.validate().unwrap_err();
        assert!(e.contains("a name under /run/netns"), "{e}");
        let e = PortSpec { netns: Some("/run/netns/../x".into()), ..p.clone() }.validate().unwrap_err();
        assert!(e.contains("without `..`"), "{e}");
    }

    #[test]
    fn differences_name_the_settings_with_defaults_written_out() {
        let a = PortSpec { kind: PortKind::Veth, netns: Some("/run/netns/x".into()), ..PortSpec::tap("c1") };
        assert!(a.differences(&PortSpec { ifname: Some("c1".into()), ..a.clone() }).is_empty());
        let b = PortSpec { ifname: Some("eth0".into()), vlan: Some(10), ..a.clone() };
        assert_eq!(a.differences(&b), ["ifname", "vlan"]);
    }

    #[test]
    fn a_full_config_parses() {
        let s = parse_str(
            r#"
name = "sw0"
mode = "l2"
mtu = 8992
mac_aging = 60
lossless = true

[[port]]
name = "tap0"
netns = "blue"
vlan = 10

[[port]]
name = "tap1"
trunk = [10, 20]
native = 1
offload = false

[[mac]]
mac = "02:00:00:00:00:01"
vlan = 10
port = "tap0"
"#,
        )
        .unwrap();
        assert_eq!(s.name, "sw0");
        assert_eq!(s.core.mtu, 8992);
        assert_eq!(s.core.aging_ms, 60_000);
        assert!(s.core.lossless);
        assert_eq!(s.ports.len(), 2);
        assert!(!s.ports[1].offload);
        assert_eq!(s.ports[1].validate().unwrap().to_string(), "trunk 10,20 native 1");
        assert_eq!(s.socket, PathBuf::from("/run/sluice/sw0.sock"));
    }

    #[test]
    fn veth_ports_need_the_kernel_datapath_which_is_never_lossless() {
        let s = parse_str("name = \"sw\"\ndatapath = \"kernel\"\n[[port]]\nname = \"v1\"\ntype = \"veth\"\n").unwrap();
        assert_eq!(s.datapath, DatapathKind::Kernel);
        assert_eq!(s.ports[0].kind, PortKind::Veth);
        let e = parse_str("name = \"sw\"\n[[port]]\nname = \"v1\"\ntype = \"veth\"\n").unwrap_err();
        assert!(e.message.contains("datapath = \"kernel\""), "{e}");
        let e = parse_str(
            "name = \"sw\"\ndatapath = \"kernel\"\nlossless = true\n[[port]]\nname = \"v1\"\ntype = \"veth\"\n",
        )
        .unwrap_err();
        assert!(e.message.contains("a lossless switch needs the user-space datapath"), "{e}");
        assert_eq!(e.line, Some(2), "{e}");
        // With `netns` the switch makes the pair: its guest end named `ifname`.
        let s = parse_str(
            "name = \"sw\"\ndatapath = \"kernel\"\n[[port]]\nname = \"v1\"\ntype = \"veth\"\nnetns = \"/proc/1/ns/net\"\nifname = \"eth0\"\n",
        )
        .unwrap();
        assert_eq!(s.ports[0].guest_ifname(), "eth0");
        let e = parse_str("name = \"sw\"\ndatapath = \"kernal\"\n").unwrap_err();
        assert_eq!(e.line, Some(2), "{e}");
    }

    #[test]
    fn classes_hold_len_and_the_watchdog_are_read_and_bad_ones_name_their_line() {
        let s = parse_str(
            "name = \"sw\"\nlossless = true\nhold_len = 32\nwatchdog_ms = 500\n\
             [[class]]\nname = \"voice\"\nmatch = \"dscp=46\"\nqueue_len = 64\n\
             [[class]]\nname = \"bulk\"\nmatch = \"port=g9\"\nlossless = false\n\
             [[class]]\nname = \"rest\"\nmatch = \"any\"\n",
        )
        .unwrap();
        assert_eq!((s.core.hold_len, s.core.watchdog_ms), (32, 500));
        let c = &s.core.classes;
        assert_eq!(c.len(), 3);
        assert_eq!(
            (c[0].matches.clone(), c[0].lossless, c[0].queue_len),
            (sluice_switch::ClassMatch::Dscp(46), true, Some(64))
        );
        assert_eq!((c[1].matches.clone(), c[1].lossless), (sluice_switch::ClassMatch::Port("g9".into()), false));
        assert!(c[2].lossless, "a class is lossless as the switch unless it says");
        let e = parse_str("name = \"sw\"\n\n[[class]]\nname = \"x\"\nmatch = \"pcp=9\"\n").unwrap_err();
        assert!(e.line.is_some_and(|l| (3..=5).contains(&l)), "{e}");
        assert!(e.message.contains("class \"x\": pcp takes a number from 0 to 7, not \"9\""), "{e}");
        let e = parse_str("name = \"sw\"\n[[class]]\nname = \"x\"\nmatch = \"vlan=3\"\n").unwrap_err();
        assert!(e.message.contains("is not one of"), "{e}");
        let e = parse_str(
            "name = \"sw\"\n[[class]]\nname = \"a\"\nmatch = \"any\"\n[[class]]\nname = \"a\"\nmatch = \"any\"\n",
        )
        .unwrap_err();
        assert!(e.message.contains("two classes are named \"a\""), "{e}");
        let e = parse_str("name = \"sw\"\nhold_len = 0\n").unwrap_err();
        assert_eq!(e.line, Some(2), "{e}");
        let e = parse_str(
            "name = \"sw\"\ndatapath = \"kernel\"\n[[class]]\nname = \"a\"\nmatch = \"any\"\nlossless = true\n",
        )
        .unwrap_err();
        assert!(e.message.contains("a lossless switch needs the user-space datapath"), "{e}");
    }

    #[test]
    fn a_stream_port_needs_its_path_and_only_it_takes_one() {
        let s =
            parse_str("name = \"sw\"\n[[port]]\nname = \"q1\"\ntype = \"stream\"\npath = \"/run/q1.sock\"\n").unwrap();
        assert_eq!((s.ports[0].kind, s.ports[0].path.as_deref()), (PortKind::Stream, Some(Path::new("/run/q1.sock"))));
        let e = parse_str("name = \"sw\"\n[[port]]\nname = \"q1\"\ntype = \"stream\"\n").unwrap_err();
        assert!(e.message.contains("needs `path`"), "{e}");
        let e = parse_str("name = \"sw\"\n[[port]]\nname = \"t1\"\npath = \"/x\"\n").unwrap_err();
        assert!(e.message.contains("`path` applies to stream ports only"), "{e}");
    }

    #[test]
    fn a_vhost_user_port_needs_its_socket_and_only_it_takes_one() {
        let s = parse_str(
            "name = \"sw\"\n[[port]]\nname = \"vm1\"\ntype = \"vhost-user\"\nsocket = \"/run/vm1.sock\"\nclient = true\n",
        )
        .unwrap();
        let p = &s.ports[0];
        assert_eq!(
            (p.kind, p.socket.as_deref(), p.client),
            (PortKind::VhostUser, Some(Path::new("/run/vm1.sock")), true)
        );
        let e = parse_str("name = \"sw\"\n[[port]]\nname = \"vm1\"\ntype = \"vhost-user\"\n").unwrap_err();
        assert!(e.message.contains("needs `socket`"), "{e}");
        assert_eq!(e.line, Some(2), "{e}");
        let e = parse_str("name = \"sw\"\n[[port]]\nname = \"t1\"\nsocket = \"/x\"\n").unwrap_err();
        assert!(e.message.contains("`socket` applies to vhost-user ports only"), "{e}");
        let e = parse_str("name = \"sw\"\n[[port]]\nname = \"t1\"\nclient = true\n").unwrap_err();
        assert!(e.message.contains("`client` applies to vhost-user ports only"), "{e}");
        let e = parse_str("name = \"sw\"\n[[port]]\nname = \"vm1\"\ntype = \"vhostuser\"\n").unwrap_err();
        assert!(e.message.contains("vhost-user"), "the error lists the kinds: {e}");
    }

    #[test]
    fn errors_name_the_line() {
        let e = parse_str("name = \"sw0\"\nmtu = 70000\n").unwrap_err();
        assert_eq!(e.line, Some(2), "{e}");
        let e = parse_str("name = \"sw0\"\nmtu = 9100\n").unwrap_err();
        assert_eq!(e.line, Some(2), "{e}");
        assert!(e.to_string().starts_with("sw.toml:2:"), "{e}");
        let e = parse_str("name = \"sw0\"\nlosless = true\n").unwrap_err();
        assert_eq!(e.line, Some(2), "{e}");
        assert!(e.message.contains("losless"), "{e}");
        let e = parse_str("name = \"sw0\"\n\n[[port]]\nname = \"t0\"\nvlan = 5000\n").unwrap_err();
        assert!(e.line.is_some_and(|l| (3..=5).contains(&l)), "{e}");
        assert!(e.message.contains("5000"), "{e}");
        let e = parse_str("name = \"sw0\"\nmode = \"l7\"\n").unwrap_err();
        assert_eq!(e.line, Some(2));
        let e = parse_str("name = \"sw0\"\n[[port]]\nname = \"t0\"\nvlan = 2\ntrunk = [3]\n").unwrap_err();
        assert!(e.message.contains("not both"), "{e}");
        let e = parse_str("name = \"sw/0\"\n").unwrap_err();
        assert_eq!(e.line, Some(1));
        let e = parse_str(
            "name = \"sw0\"\n[[port]]\nname = \"t0\"\n\n[[mac]]\nmac = \"33:33:00:00:00:01\"\nport = \"t0\"\n",
        )
        .unwrap_err();
        assert!(e.line.is_some_and(|l| (5..=7).contains(&l)) && e.message.contains("unicast"), "{e}");
    }

    #[test]
    fn gateway_settings_default_their_range_and_a_bad_value_names_its_line() {
        let s = parse_str("name = \"sw0\"\ngateway = \"10.77.0.254/24\"\n").unwrap();
        let g = s.gateway.unwrap();
        assert_eq!(g.range, ("10.77.0.1".parse().unwrap(), "10.77.0.253".parse().unwrap()));
        assert!(g.dns && g.v6.is_none() && g.uplink.is_none());
        assert_eq!(g.subnet(), "10.77.0.0/24");
        let s = parse_str("name = \"sw0\"\ngateway = \"10.77.0.1/24\"\ngateway6 = \"fd77::fe/64\"\ngateway_dns = false\ngateway_uplink = \"eth0\"\n").unwrap();
        let g = s.gateway.unwrap();
        assert_eq!(g.range, ("10.77.0.2".parse().unwrap(), "10.77.0.254".parse().unwrap()));
        assert_eq!(g.v6, Some(("fd77::fe".parse().unwrap(), 64)));
        assert!(!g.dns);
        assert_eq!(g.uplink.as_deref(), Some("eth0"));
        let s =
            parse_str("name = \"sw0\"\ngateway = \"10.77.0.1/24\"\ngateway_dhcp_range = \"10.77.0.100-10.77.0.199\"\n")
                .unwrap();
        assert_eq!(s.gateway.unwrap().range.0, "10.77.0.100".parse::<std::net::Ipv4Addr>().unwrap());
        assert!(parse_str("name = \"sw0\"\n").unwrap().gateway.is_none());
        for (line, want) in [
            ("gateway = \"10.77.0.254\"", "no prefix"),
            ("gateway = \"10.77.0.300/24\"", "not an IPv4 address"),
            ("gateway = \"10.77.0.254/31\"", "8 to 30"),
            ("gateway = \"10.77.0.0/24\"", "network or broadcast"),
            ("gateway = \"10.77.0.255/24\"", "network or broadcast"),
            ("gateway = \"224.0.0.1/24\"", "unicast"),
            ("gateway = \"10.77.0.1/24\"\ngateway6 = \"fd77::fe/48\"", "/64"),
            ("gateway = \"10.77.0.1/24\"\ngateway_dhcp_range = \"10.77.1.2-10.77.1.9\"", "not inside"),
            ("gateway = \"10.77.0.1/24\"\ngateway_dhcp_range = \"10.77.0.9-10.77.0.2\"", "after the last"),
            ("gateway = \"10.77.0.5/24\"\ngateway_dhcp_range = \"10.77.0.2-10.77.0.9\"", "gateway's own"),
            ("gateway = \"10.77.0.1/24\"\ngateway_uplink = \"eth0; drop\"", "not an interface name"),
            ("gateway6 = \"fd77::fe/64\"", "needs gateway"),
            ("gateway_uplink = \"eth0\"", "needs gateway"),
        ] {
            let text = format!("name = \"sw0\"\n\n{line}\n");
            let e = parse_str(&text).unwrap_err();
            assert!(e.message.contains(want), "{line:?}: {e}");
            let bad_line = 2 + line.lines().count();
            assert_eq!(e.line, Some(bad_line), "{line:?}: {e}");
        }
    }
    // Security groups.
    #[test]
    fn acl_entries_are_checked_where_they_are_written() {
        let s = parse_str(
            "name = \"sw0\"\nconntrack_max = 100\n[[acl]]\nport = \"a\"\ndir = \"in\"\naction = \"deny\"\nproto = \"tcp\"\ndport = 22\n\
             [[acl]]\nport = \"a\"\ndir = \"out\"\naction = \"deny\"\ndefault = true\n",
        )
        .unwrap();
        assert_eq!(s.acls.len(), 1);
        assert_eq!(s.acls[0].1.dport.as_deref(), Some("22"));
        assert_eq!(s.acl_defaults.len(), 1);
        assert_eq!(s.conntrack_max, 100);
        for (field, value) in [("src", "\"10.0.0.1/33\""), ("dport", "\"90-80\"")] {
            let text = format!(
                "name = \"sw0\"\n\n[[acl]]\nport = \"a\"\ndir = \"in\"\naction = \"deny\"\nproto = \"tcp\"\n{field} = {value}\n"
            );
            let e = parse_str(&text).unwrap_err();
            assert!(e.line.is_some_and(|l| (3..=8).contains(&l)), "{e}");
            assert!(e.message.contains(&format!("{field}:")), "the field is named: {e}");
        }
    }

    #[test]
    fn a_hundred_thousand_acl_rules_are_refused_naming_the_bound() {
        let mut text = String::from("name = \"sw0\"\n");
        for i in 0..100_000u32 {
            text.push_str(&format!(
                "[[acl]]\nport = \"p{}\"\ndir = \"in\"\naction = \"deny\"\nproto = \"tcp\"\ndport = {}\n",
                i / 4000,
                i % 60000 + 1
            ));
        }
        let e = parse_str(&text).unwrap_err();
        assert!(e.message.contains("65536"), "{e}");
        assert!(e.line.is_some(), "{e}");
    }
}

// ---- EVPN (`[evpn]`): docs/evpn.md. ----

/// A switch's EVPN speaker and its sessions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EvpnSettings {
    /// Our AS number (iBGP: the peers' too). Two octets: the route targets are `ASN:VNI`.
    pub asn: u32,
    /// The router id and route distinguishers' address (`None`: the EVPN port's `local`).
    pub router_id: Option<std::net::Ipv4Addr>,
    /// The BGP peers (route reflectors, or the other hosts).
    pub peers: Vec<std::net::IpAddr>,
    /// The TCP port BGP listens on (179).
    pub listen_port: u16,
    /// Which speaker: one the switch starts and supervises, or one already running.
    pub speaker: EvpnSpeaker,
    /// Remote stations installed at most; routes beyond wait, counted.
    pub max_routes: usize,
    /// The EVPN port's name (the vxlan port with `evpn = true`).
    pub port: String,
    /// When a station that keeps moving is duplicate, and how long it stays frozen
    /// (`dup_max_moves`, `dup_window`, `dup_hold`).
    pub dup: sluice_switch::evpn::DupRule,
}

/// Where the EVPN speaker comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EvpnSpeaker {
    /// The switch starts this `gobgpd` (a path, or a name looked up in `PATH`) in the
    /// tunnel's namespace, configures it over its API and restarts it when it dies.
    Spawn(PathBuf),
    /// A `gobgpd` already running, configured by its owner, whose API is this Unix socket:
    /// the switch only announces and withdraws its own routes there.
    Attach(PathBuf),
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct EvpnFile {
    asn: Option<u32>,
    router_id: Option<String>,
    #[serde(default)]
    peers: Vec<String>,
    listen_port: Option<u16>,
    gobgpd: Option<PathBuf>,
    attach: Option<PathBuf>,
    max_routes: Option<usize>,
    dup_max_moves: Option<Spanned<u32>>,
    dup_window: Option<Spanned<u64>>,
    dup_hold: Option<Spanned<u64>>,
}

/// The AS an EVPN switch uses unless told (a private one).
pub const DEFAULT_EVPN_ASN: u32 = 65000;

fn evpn_settings(
    f: &SwitchFile,
    fib_max: usize,
    err: &dyn Fn(Option<Range<usize>>, String) -> ConfigError,
) -> Result<Option<EvpnSettings>, ConfigError> {
    let evpn_ports: Vec<&Spanned<PortSpec>> = f.port.iter().filter(|p| p.get_ref().evpn).collect();
    let Some(e) = &f.evpn else {
        if let Some(p) = evpn_ports.first() {
            return Err(err(
                Some(p.span()),
                format!(
                    "port {:?} has evpn = true but the switch has no [evpn] table; add one naming the BGP peers, e.g. [evpn] peers = [\"192.168.77.254\"]",
                    p.get_ref().name
                ),
            ));
        }
        return Ok(None);
    };
    let at = Some(e.span());
    let v = e.get_ref();
    let port = match evpn_ports.as_slice() {
        [p] => p.get_ref().name.clone(),
        [] => {
            return Err(err(at, "[evpn] needs a vxlan port with evpn = true, whose stations it announces".into()));
        }
        [_, p, ..] => {
            return Err(err(Some(p.span()), "only one port of a switch may have evpn = true".into()));
        }
    };
    let asn = v.asn.unwrap_or(DEFAULT_EVPN_ASN);
    if asn == 0 || asn > 65535 {
        return Err(err(at, format!("[evpn] asn {asn}: use 1 to 65535 (the route targets are ASN:VNI)")));
    }
    let router_id = match &v.router_id {
        None => None,
        Some(r) => Some(r.parse::<std::net::Ipv4Addr>().map_err(|_| {
            err(at.clone(), format!("[evpn] router_id {r:?} is not an IPv4 address (BGP router ids are)"))
        })?),
    };
    let mut peers = Vec::new();
    for p in &v.peers {
        let a: std::net::IpAddr =
            p.parse().map_err(|_| err(at.clone(), format!("[evpn] peer {p:?} is not an IP address")))?;
        if a.is_unspecified() || a.is_multicast() || peers.contains(&a) {
            return Err(err(
                at.clone(),
                format!("[evpn] peer {a} is not another host's unicast address, or is listed twice"),
            ));
        }
        peers.push(a);
    }
    let speaker = match (&v.attach, &v.gobgpd) {
        (Some(_), Some(_)) => {
            return Err(err(
                at,
                "[evpn]: give `attach` (a running speaker's API socket) or `gobgpd` (the one to start), not both"
                    .into(),
            ));
        }
        (Some(a), None) => EvpnSpeaker::Attach(a.clone()),
        (None, g) => EvpnSpeaker::Spawn(g.clone().unwrap_or_else(|| PathBuf::from("gobgpd"))),
    };
    if peers.is_empty() && matches!(speaker, EvpnSpeaker::Spawn(_)) {
        return Err(err(
            at,
            "[evpn] lists no peers; name the route reflectors or other hosts, e.g. peers = [\"192.168.77.254\"]".into(),
        ));
    }
    // (Half the MAC table by default: the rest stays for the local stations.)
    let max_routes = v.max_routes.unwrap_or(fib_max / 2).max(1);
    if max_routes > fib_max {
        return Err(err(
            at,
            format!(
                "[evpn] max_routes {max_routes} is more than the MAC table holds ({fib_max}, mac_table_size): raise mac_table_size or lower max_routes"
            ),
        ));
    }
    let listen_port = v.listen_port.unwrap_or(179);
    let mut dup = sluice_switch::evpn::DupRule::default();
    if let Some(n) = &v.dup_max_moves {
        dup.max_moves = *n.get_ref();
        if dup.max_moves == 1 || dup.max_moves > 1000 {
            return Err(err(
                Some(n.span()),
                format!("[evpn] dup_max_moves {}: use 2 to 1000 moves, or 0 to detect no duplicates", dup.max_moves),
            ));
        }
    }
    if let Some(w) = &v.dup_window {
        let w = (*w.get_ref(), w.span());
        if !(2..=1800).contains(&w.0) {
            return Err(err(Some(w.1), format!("[evpn] dup_window {}: use 2 to 1800 seconds", w.0)));
        }
        dup.window_ms = w.0 * 1000;
    }
    if let Some(h) = &v.dup_hold {
        let h = (*h.get_ref(), h.span());
        if h.0 != 0 && !(30..=3600).contains(&h.0) {
            return Err(err(
                Some(h.1),
                format!(
                    "[evpn] dup_hold {}: use 30 to 3600 seconds, or 0 to hold duplicates until `sluice evpn clear-duplicates`",
                    h.0
                ),
            ));
        }
        dup.hold_ms = h.0 * 1000;
    }
    Ok(Some(EvpnSettings { asn, router_id, peers, listen_port, speaker, max_routes, port, dup }))
}

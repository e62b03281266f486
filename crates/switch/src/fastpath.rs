//! What a kernel datapath may execute for the core, and the changes it must follow
//! (docs/architecture.md, "The kernel datapath").
//!
//! The core stays the only place where forwarding is decided. A kernel datapath executes
//! the part of those decisions that needs no state beyond two tables — the per-port rules
//! ([`FastPort`]) and the MAC table — for frames from stations known on their port (or
//! that the port may not learn: [`FastPort::learn_full`]) to ports it reaches: known
//! unicast to one port, the rest flooded to every port of the VLAN when all of them are
//! the kernel's. It hands every other frame back to be received with [`Switch::ingest`]:
//! learning, floods that reach user space or mirrors, Layer 3 answers, ports it does not
//! reach. The driver fills the kernel's maps
//! from [`Switch::fast_port`] and [`Switch::fast_mac`] for the keys
//! [`Switch::take_fastpath_changes`] reports.
//!
//! [`decide`] is the rule the kernel program applies, written over these tables in Rust, so
//! that tests can hold it against the core's own pipeline: for every frame, the kernel
//! either does exactly what the core would do, or hands the frame up. It is a model of the
//! kernel's C rules for that test only: the core's own decision is [`crate::decide`], and
//! once the kernel executes the core's verdicts this module goes.
//!
//! [`Switch::ingest`]: crate::Switch::ingest
//! [`Switch::fast_port`]: crate::Switch::fast_port
//! [`Switch::fast_mac`]: crate::Switch::fast_mac
//! [`Switch::take_fastpath_changes`]: crate::Switch::take_fastpath_changes

use std::net::IpAddr;

use sluice_wire::MacAddr;

use crate::counters::DropCause;
use crate::switch::PortId;
use crate::vlan::VlanMode;

/// How a port's source IP addresses are checked on the fast path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IpRule {
    /// Any address (no IP anti-spoofing on this port).
    Any,
    /// Only these (and the unspecified address); per family, `None` means frames of that
    /// family go up: the port learns its first address of that family.
    Only {
        /// IPv4 addresses (ARP sender addresses too), or `None`: IPv4 and ARP go up.
        v4: Option<Vec<IpAddr>>,
        /// IPv6 addresses, or `None`: IPv6 goes up.
        v6: Option<Vec<IpAddr>>,
    },
}

/// One port as the kernel datapath sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FastPort {
    /// The handle by which the kernel reaches the port ([`crate::Port::fast_path`]); `None`
    /// for a port in user space (frames to it go up).
    pub target: Option<u32>,
    /// VLAN membership.
    pub vlan: VlanMode,
    /// MTU (IP packet bytes).
    pub mtu: u16,
    /// Exchanges frames with uplinks only.
    pub isolated: bool,
    /// Leads to the LAN.
    pub uplink: bool,
    /// The only source MAC address allowed, if any.
    pub mac: Option<MacAddr>,
    /// Source IP addresses allowed.
    pub ips: IpRule,
    /// An uplink's device address. In Layer 2 mode frames arriving there for it belong to
    /// the host's own stack (the device may be the host's interface too), not to the
    /// switch; in Layer 3 mode it is the switch's own address on the LAN.
    pub dev_mac: Option<MacAddr>,
    /// Layer 3: the MAC address of the guest behind the port, once the core knows it.
    pub guest_mac: Option<MacAddr>,
    /// IPv6 link-local sources pass the IP check (Layer 3: neighbour discovery, MLD and
    /// router solicitations use them).
    pub link_local_ok: bool,
    /// The port that gets a copy of every frame this one receives and is sent (in the
    /// VLANs the mirror is a member of), if any; a mirror in user space makes this port
    /// `slow` instead.
    pub mirror: Option<PortId>,
    /// Every frame from or to this port goes up (it failed, it takes no offloads so GSO
    /// frames must be cut in software, or its mirror is in user space).
    pub slow: bool,
    /// The port failed (its device is gone or refused a frame): Layer 3 picks the first
    /// uplink that has not as the way off the switch.
    pub failed: bool,
    /// Layer 2: the port has as many learned stations behind it as it may. The core
    /// learns no other source there, so a frame from one is forwarded (or flooded) as it
    /// is, counted as `learn_refused`; the kernel can do that itself.
    pub learn_full: bool,
}

/// A key whose kernel entry must be rewritten from the core's state now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FastChange {
    /// A port's rules ([`crate::Switch::fast_port`]; `None` there: the port is gone).
    Port(PortId),
    /// A MAC table entry ([`crate::Switch::fast_mac`]; `None` there: no entry).
    Mac(u16, MacAddr),
    /// Layer 3: which port owns an address ([`crate::Switch::fast_owner`]).
    Owner(IpAddr),
    /// Layer 3: a LAN neighbour's MAC address ([`crate::Switch::fast_neighbour`]).
    Neighbour(u16, IpAddr),
}

/// A MAC table entry as the kernel sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FastMac {
    /// The port behind the address.
    pub port: PortId,
    /// Configured, not learned.
    pub is_static: bool,
}

/// What the kernel does with a frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Hand it to the core.
    Up,
    /// Leave it to the host's stack: it arrived on an uplink for the device's own address.
    Pass,
    /// Drop it, counted at the input with this cause.
    Drop(DropCause),
    /// Send it to this port, tagged with this VLAN id or untagged; the output's MTU is
    /// checked there (an over-MTU frame is counted at the output).
    To {
        /// The output.
        port: PortId,
        /// The 802.1Q tag the frame leaves with, if any (VLAN id and priority).
        tag: Option<(u16, u8)>,
        /// The source is not learned (the input is at its limit): count `learn_refused`.
        refused: bool,
    },
    /// Send a copy to each of these ports (in slot order, with the tag each wants; MTUs
    /// checked as for `To`); counted as flooded at the input.
    Flood {
        /// The outputs and their tags.
        ports: Vec<(PortId, Option<(u16, u8)>)>,
        /// As for `To`.
        refused: bool,
    },
}

/// What the kernel sees of a frame.
#[derive(Clone, Copy, Debug)]
pub struct FrameView {
    /// Destination MAC.
    pub dst: MacAddr,
    /// Source MAC.
    pub src: MacAddr,
    /// The outer 802.1Q tag's TCI, if tagged.
    pub tci: Option<u16>,
    /// The source address the frame claims: `None` for non-IP frames, `Some(None)` for an
    /// IP or ARP frame too short to say (as [`crate::Switch`] reads it).
    pub claimed: Option<Option<IpAddr>>,
}

/// The kernel program's rule, over the tables the core gives it: the frame `f` arriving
/// on `from`. `port` looks up a port's rules (slots `0..slots` are all there are), `mac`
/// the MAC table.
pub fn decide(
    from: PortId,
    f: &FrameView,
    slots: PortId,
    port: impl Fn(PortId) -> Option<FastPort>,
    mac: impl Fn(u16, MacAddr) -> Option<FastMac>,
) -> Verdict {
    let Some(me) = port(from) else { return Verdict::Up };
    // (This rule is Layer 2's: see [`FastPort::dev_mac`].)
    if me.uplink && me.dev_mac == Some(f.dst) {
        return Verdict::Pass;
    }
    if me.slow || me.target.is_none() {
        return Verdict::Up;
    }
    if f.src.is_multicast() {
        return Verdict::Drop(DropCause::Malformed);
    }
    let Some(ing) = me.vlan.ingress(f.tci) else { return Verdict::Drop(DropCause::VlanFilter) };
    if me.mac.is_some_and(|m| m != f.src) {
        return Verdict::Drop(DropCause::SpoofedMac);
    }
    if let IpRule::Only { v4, v6 } = &me.ips
        && let Some(claimed) = f.claimed
    {
        let Some(ip) = claimed else { return Verdict::Drop(DropCause::SpoofedIp) };
        let list = if ip.is_ipv4() { v4 } else { v6 };
        let Some(list) = list else { return Verdict::Up };
        if !ip.is_unspecified() && !list.contains(&ip) {
            return Verdict::Drop(DropCause::SpoofedIp);
        }
    }
    // The source must already be known here — learning and moves are the core's — unless
    // the port may learn no more: then the core would not learn it either (but a source
    // another port locks or has static is the core's to drop).
    let refused = match mac(ing.vid, f.src) {
        Some(e) if e.port == from => false,
        Some(e) if e.is_static => return Verdict::Up,
        _ if me.learn_full => true,
        _ => return Verdict::Up,
    };
    if refused && me.mac.is_none() && (0..slots).any(|id| id != from && port(id).is_some_and(|p| p.mac == Some(f.src)))
    {
        return Verdict::Up;
    }
    let known = if f.dst.is_multicast() { None } else { mac(ing.vid, f.dst) };
    let Some(e) = known else { return flood(from, &me, ing.vid, ing.pcp, refused, slots, port) };
    if e.port == from {
        return Verdict::Drop(DropCause::SamePort);
    }
    let Some(out) = port(e.port) else { return Verdict::Up };
    if out.slow || out.target.is_none() {
        return Verdict::Up;
    }
    let Some(tagged) = out.vlan.egress(ing.vid) else { return Verdict::Drop(DropCause::VlanFilter) };
    // Isolated ports talk to uplinks only.
    if (me.isolated || out.isolated) && !me.uplink && !out.uplink {
        return Verdict::Drop(DropCause::Isolated);
    }
    Verdict::To { port: e.port, tag: tagged.then_some((ing.vid, ing.pcp)), refused }
}

/// A flood from `me` (port `from`) on VLAN `vid`: every other port of the VLAN it may talk
/// to, if the kernel reaches them all and no mirror takes part (else the core floods).
fn flood(
    from: PortId,
    me: &FastPort,
    vid: u16,
    pcp: u8,
    refused: bool,
    slots: PortId,
    port: impl Fn(PortId) -> Option<FastPort>,
) -> Verdict {
    if me.mirror.is_some() {
        return Verdict::Up;
    }
    let mut ports = Vec::new();
    for id in (0..slots).filter(|&id| id != from) {
        let Some(p) = port(id) else { continue };
        let Some(tagged) = p.vlan.egress(vid) else { continue };
        if (me.isolated || p.isolated) && !me.uplink && !p.uplink {
            continue;
        }
        if p.slow || p.target.is_none() || p.mirror.is_some() {
            return Verdict::Up;
        }
        ports.push((id, tagged.then_some((vid, pcp))));
    }
    if ports.is_empty() {
        return Verdict::Drop(DropCause::UnknownPort);
    }
    Verdict::Flood { ports, refused }
}

//! The forwarding decision, made once per frame: a pure function from what a datapath can
//! read of a frame (its [`Key`]) and the switch's tables to what happens to it (a
//! [`Verdict`], plain data). docs/architecture.md, "One brain".
//!
//! Every forwarding rule lives here or in a function this module calls: VLAN admission
//! and egress tagging, isolation, MAC and IP anti-spoofing, the effect of the learning
//! limits on forwarding, the flood plan, Layer 3 routing and its MAC rewrite, each
//! output's MTU, and mirrors. What is not a rule stays with whoever executes the verdict:
//! learning (the core's alone, before it decides), answering ARP and neighbour discovery
//! and waiting for a next hop's address ([`Upcall`]), queues, holds, segmentation.
//!
//! The key holds only what a kernel program can extract with parsing and table lookups:
//! the input's slot, the frame's 802.1Q VLAN id, from a tunnel its VNI and whether its
//! sender is one of the port's endpoints ([`Tunneled`]), its EtherType, the station
//! table's answer for its source relative to the input ([`Station`]) and for its
//! destination ([`Dest`]), and the extras the input's rules ask for ([`Extras`]). A
//! station learned,
//! moved or aged changes an answer in a key, never a verdict; a change of anything this
//! module reads from the tables moves the switch's generation
//! ([`crate::Switch::generation`]).

use std::net::IpAddr;

use sluice_wire::MacAddr;

use crate::acl::{AclAction, AclExtras, AclTables, AclVerdict, CtState, Dir};
use crate::config::{PortPolicy, SwitchConfig};
use crate::counters::DropCause;
use crate::fib::Fib;
use crate::ids::PortId;
use crate::l3::{L3Tables, Mode};
use crate::mdb::{GroupClass, Mdb};
use crate::tunnel::TunnelRules;
use crate::vlan::{Ingress, VlanMode};

/// The station table's answer for a frame's source, relative to the port it came from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Station {
    /// Behind the input (learned there, or its static entry). In Layer 3 mode: the input's
    /// guest, whose address the switch knows.
    Here,
    /// Not in the table.
    #[default]
    Absent,
    /// Learned behind another port.
    Elsewhere,
    /// A static entry of another port: a frame claiming it is dropped (`spoofed_mac`).
    Static,
    /// Locked to another port by its `mac` setting, and not to the input: a frame claiming
    /// it is dropped (`spoofed_mac`).
    Locked,
    /// An address no table learns (all zeroes): frames from it are forwarded as they are.
    Unlearnable,
}

/// The answer for a frame's destination.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Dest {
    /// Multicast (broadcast is [`Dest::Broadcast`], IEEE link-local [`Dest::LinkLocal`]).
    Group,
    /// The input's own address, on an uplink: its device's (Layer 2: the host's own
    /// interface; Layer 3: the switch's address on the LAN).
    Own,
    /// Layer 2: a station the table knows (not aged) behind this port.
    Station(PortId),
    /// Unicast to a station the table does not know (Layer 3: any other unicast address).
    #[default]
    Unknown,
    /// An IEEE link-local address, 01:80:C2:00:00:00 to 0F, by its last byte: group
    /// addresses a bridge does not forward unless told to (`forward_link_local`).
    LinkLocal(u8),
    /// Broadcast (ff:ff:ff:ff:ff:ff): a group of its own for storm control.
    Broadcast,
}

impl Dest {
    /// The class of group address `mac`: [`Dest::LinkLocal`] for 01:80:C2:00:00:00 to 0F,
    /// [`Dest::Broadcast`], else [`Dest::Group`]. The caller checked that it is a group
    /// address.
    pub fn group(mac: MacAddr) -> Dest {
        match mac.0 {
            [0x01, 0x80, 0xc2, 0, 0, n] if n < 16 => Dest::LinkLocal(n),
            [0xff, 0xff, 0xff, 0xff, 0xff, 0xff] => Dest::Broadcast,
            _ => Dest::Group,
        }
    }

    /// Broadcast or multicast, link-local or not.
    pub fn is_group(self) -> bool {
        matches!(self, Dest::Group | Dest::LinkLocal(_) | Dest::Broadcast)
    }
}

/// Which of its input's storm control budgets a forwarded frame is charged to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Storm {
    /// `storm_broadcast_pps`.
    Broadcast,
    /// `storm_multicast_pps`.
    Multicast,
}

/// What Layer 3 mode reads of a frame beyond Layer 2.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct L3Extras {
    /// The frame's addresses can be read: an ARP message for IPv4 over Ethernet, or an IP
    /// header with both addresses.
    pub readable: bool,
    /// The guest port that owns the destination IP address (IP frames).
    pub owner: Option<PortId>,
    /// IPv6: what neighbour discovery reads.
    pub nd: NdFacts,
}

/// What neighbour discovery reads of an IPv6 frame: its next header, ICMPv6 type and
/// whether its hop limit is 255; all zero for other frames.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct NdFacts {
    /// The next header (58: ICMPv6).
    pub proto: u8,
    /// ICMPv6: the message type; 0 for other frames.
    pub icmp6_type: u8,
    /// The hop limit is 255 (neighbour discovery is only that).
    pub hop255: bool,
}

impl NdFacts {
    /// A frame of `ethertype` with these facts is a neighbour solicitation or
    /// advertisement (RFC 4861: ICMPv6 135 or 136, hop limit 255).
    #[inline]
    pub fn resolution(self, ethertype: u16) -> bool {
        ethertype == 0x86dd && self.proto == 58 && self.hop255 && matches!(self.icmp6_type, 135 | 136)
    }
}

/// What the input's rules ask to be read of a frame beyond its headers (the input's
/// mask); `None` where they do not ask, so that keys that decide alike are equal.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Extras {
    /// The exact source MAC address, for an input with a `mac` setting.
    pub src_mac: Option<MacAddr>,
    /// The source address the frame claims, for an input whose source addresses are
    /// checked: `None` for a frame that is neither IP nor ARP, `Some(None)` for one too
    /// short to say, else its IPv4 or IPv6 source or ARP sender address.
    pub src_ip: Option<Option<IpAddr>>,
    /// Layer 3 mode's extras.
    pub l3: Option<L3Extras>,
    /// EVPN's suppression: what neighbour discovery reads, for an input whose address
    /// resolution the core reads (the key's `suppress`).
    pub nd: Option<NdFacts>,
    /// Security groups: the frame's connection state and classes, when any port of the
    /// switch has rules.
    pub acl: Option<AclExtras>,
}

/// Where a frame from a tunnel came from, as the decision reads it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Tunneled {
    /// The datagram's VNI.
    pub vni: u32,
    /// Its sender is one of the port's configured endpoints (a lookup).
    pub endpoint: bool,
}

/// Everything the decision reads of one frame.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Key {
    /// The input port.
    pub port: PortId,
    /// The VLAN id of the 802.1Q tag the frame arrived with (0: a priority tag), or none.
    pub tag: Option<u16>,
    /// From a tunnel: the datagram's origin; `None` from any other port, and for a frame a
    /// datapath took in from a tunnel after applying the tunnel's rules itself (see
    /// [`stage1`]).
    pub tunnel: Option<Tunneled>,
    /// The EtherType after the tag.
    pub ethertype: u16,
    /// The source's station, after learning.
    pub src: Station,
    /// The destination.
    pub dst: Dest,
    /// What the input's rules ask for.
    pub extras: Extras,
    /// IGMP/MLD snooping: for a group frame in Layer 2 mode on a snooping switch, what the
    /// multicast database says of its IP destination ([`GroupClass::Flooded`] otherwise).
    pub group: GroupClass,
    /// EVPN: the input is a port that is no tunnel, on a switch with an EVPN tunnel; its
    /// address resolution (ARP, and neighbour discovery by `extras.nd`) is the core's to
    /// read (it learns the sender's binding, and answers a request from the bindings).
    /// Cleared when the core decides such a frame again.
    pub suppress: bool,
}

/// Why a frame goes to the core's slow work rather than out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Upcall {
    /// Its source (a station, a guest's MAC address or a port's first IP address) is to
    /// be learned; the core learns before it decides, so it decides such frames again.
    Learn,
    /// Address resolution (ARP, neighbour solicitation or advertisement) for the switch to
    /// answer or learn from (Layer 3).
    Neigh,
    /// The MAC address of the guest behind this port is not known yet: the frame waits
    /// for it while the switch asks (Layer 3).
    Resolve(PortId),
    /// An IGMP or MLD message: the core reads it (memberships, queriers), then forwards
    /// it (reports to router ports, queries to every port).
    Snoop,
    /// An ARP message or a neighbour solicitation or advertisement from a local port on a
    /// switch with EVPN (Layer 2): the core learns its sender's address, answers a
    /// request when it holds the target's binding, and decides anything else again, to be
    /// forwarded as before.
    Suppress,
}

/// What happens to a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// The core's slow work.
    Up(Upcall),
    /// Dropped, counted at the input with this cause.
    Drop(DropCause),
    /// Sent to [`Verdict::outputs`].
    Forward,
}

/// One output of a forwarded frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Output {
    /// The port.
    pub port: PortId,
    /// The 802.1Q tag to push (this VLAN id, the frame's own priority), or none: the frame
    /// leaves untagged.
    pub tag: Option<u16>,
    /// The port's MTU: a frame whose measure exceeds it is dropped there (`over_mtu`).
    pub mtu: u16,
    /// A mirror's copy: never holds the frame back, and is not one of its destinations.
    pub mirror: bool,
    /// Layer 3: the source MAC address the copy leaves with (the switch's on that side).
    pub src_mac: Option<MacAddr>,
    /// The port has a `rate_out`: the copy is charged to it (shaped on its way out).
    pub paced: bool,
}

/// Where a routed frame's destination MAC address comes from (Layer 3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NextHop {
    /// This address (the guest behind the output).
    Mac(MacAddr),
    /// The neighbour table's entry for the frame's VLAN and destination IP address; a
    /// frame whose neighbour is not there waits for it.
    Neighbour,
}

/// The decision about one frame: plain data, executed without deciding anything — the
/// executor measures the frame against each output's MTU, rewrites, tags, copies and
/// counts.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Verdict {
    /// What happens.
    pub action: Action,
    /// Forward: the outputs, destinations first (in port order for a flood), then mirror
    /// copies.
    pub outputs: Vec<Output>,
    /// Forward: the destination MAC address to write (Layer 3 unicast).
    pub next_hop: Option<NextHop>,
    /// The host's stack gets the frame too (Layer 2: a frame on an uplink whose device may
    /// be the host's own interface, for the host's address or a group). A user-space
    /// datapath has nothing to do: the host's stack got its own copy.
    pub pass_to_host: bool,
    /// Forward: counted as flooded at the input (else forwarded).
    pub flood: bool,
    /// Count `learn_refused` at the input: its source is one the input may not learn (it
    /// has as many stations as it may).
    pub learn_refused: bool,
    /// Forward: the input's storm control budget the frame is charged to; over it, the
    /// frame is dropped at the input (`storm`) instead.
    pub storm: Option<Storm>,
    /// Forward: charged to the input's `rate_in`; over it, the frame waits (user space)
    /// or is dropped at the input (`rate_limit`, kernel).
    pub meter_in: bool,
    /// What the security groups decided.
    pub acl: AclVerdict,
}

impl Default for Verdict {
    fn default() -> Self {
        Verdict {
            action: Action::Drop(DropCause::UnknownPort),
            outputs: Vec::new(),
            next_hop: None,
            pass_to_host: false,
            flood: false,
            learn_refused: false,
            storm: None,
            meter_in: false,
            acl: AclVerdict::default(),
        }
    }
}

impl Verdict {
    /// Empties it for the next decision (keeping the outputs' memory).
    #[inline]
    fn clear(&mut self) {
        self.action = Action::Drop(DropCause::UnknownPort);
        self.outputs.clear();
        self.next_hop = None;
        self.pass_to_host = false;
        self.flood = false;
        self.learn_refused = false;
        self.storm = None;
        self.meter_in = false;
        self.acl.consulted = false;
        self.acl.commit = false;
        self.acl.hits.clear();
    }

    /// The outputs that are the frame's destinations (not mirror copies).
    pub fn destinations(&self) -> impl Iterator<Item = &Output> + '_ {
        self.outputs.iter().filter(|o| !o.mirror)
    }
}

/// What [`decide`] reads of one port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PortRules {
    pub vlan: VlanMode,
    pub mtu: u16,
    pub policy: PortPolicy,
    /// The mirror port that gets copies of this port's traffic.
    pub mirrored_to: Option<PortId>,
    /// The device's own MAC address, if it has one (an uplink's).
    pub dev_mac: Option<MacAddr>,
    /// Layer 3: the MAC address of the guest behind the port.
    pub guest_mac: Option<MacAddr>,
    /// Why the port's device failed, if it did: it is no longer an output.
    pub failed: Option<String>,
    /// A tunnel's VNIs and whom it takes datagrams from.
    pub tunnel: Option<TunnelRules>,
}

impl PortRules {
    /// Whether the port checks the source IP addresses of its frames.
    pub fn checks_ips(&self) -> bool {
        !self.policy.ips.is_empty() || self.policy.learn_ips
    }

    /// The source MAC address frames leave this port with in Layer 3 mode: the switch's
    /// on this side (an uplink's device address, or the router address).
    pub fn l3_src(&self, router_mac: MacAddr) -> MacAddr {
        match self.dev_mac {
            Some(m) if self.policy.uplink => m,
            _ => router_mac,
        }
    }
}

/// The ports as [`decide`] looks them up, by slot.
pub(crate) trait Ports {
    /// Port `id`'s rules, if it is attached.
    fn rules(&self, id: PortId) -> Option<&PortRules>;
    /// Every attached port's slot and rules, in slot order.
    fn all(&self) -> impl Iterator<Item = (PortId, &PortRules)>;
}

impl Ports for [Option<PortRules>] {
    fn rules(&self, id: PortId) -> Option<&PortRules> {
        self.get(id as usize).and_then(Option::as_ref)
    }
    fn all(&self) -> impl Iterator<Item = (PortId, &PortRules)> {
        self.iter().enumerate().filter_map(|(i, p)| Some((i as PortId, p.as_ref()?)))
    }
}

/// Everything [`decide`] reads besides the key.
pub(crate) struct Tables<'a, P: Ports + ?Sized> {
    /// The mode, the router's MAC address, the learning limit of a port.
    pub cfg: &'a SwitchConfig,
    pub ports: &'a P,
    pub fib: &'a Fib,
    /// Layer 3: which port owns which address.
    pub l3: &'a L3Tables,
    /// The security groups.
    pub acl: &'a AclTables,
    /// IGMP/MLD snooping's memberships and router ports.
    pub mdb: &'a Mdb,
}

impl<P: Ports + ?Sized> Tables<'_, P> {
    /// Layer 2: port `id` has as many learned stations behind it as it may (it is not an
    /// uplink): no other source is learned there, and their frames go on as they are.
    pub fn learn_full(&self, id: PortId, me: &PortRules) -> bool {
        self.cfg.mode == Mode::L2 && !me.policy.uplink && self.fib.learned_on(id) >= self.cfg.port_mac_limit
    }

    /// What every output of a frame of VLAN `vid` shares.
    #[inline]
    fn egress(&self, vid: u16) -> Egress {
        Egress { vid, router: (self.cfg.mode == Mode::L3).then_some(self.cfg.router_mac) }
    }
}

/// What every output of one frame shares: its VLAN, and in Layer 3 mode the router's
/// address (the switch's source address on the guests' side).
struct Egress {
    vid: u16,
    router: Option<MacAddr>,
}

impl Egress {
    /// Output `id` (rules `p`), if it is a member of the frame's VLAN: the egress rule
    /// says whether it leaves tagged.
    #[inline]
    fn output(&self, id: PortId, p: &PortRules, mirror: bool) -> Option<Output> {
        let tagged = p.vlan.egress(self.vid)?;
        Some(Output {
            port: id,
            tag: tagged.then_some(self.vid),
            mtu: p.mtu,
            mirror,
            src_mac: self.router.map(|r| p.l3_src(r)),
            paced: p.policy.rate.rate_out > 0,
        })
    }
}

/// Isolation: isolated ports exchange frames with uplinks only.
#[inline]
fn may_talk(a: &PortPolicy, b: &PortPolicy) -> bool {
    (!a.isolated && !b.isolated) || a.uplink || b.uplink
}

/// What the source-address check decided.
pub(crate) enum SourceCheck {
    Allowed,
    /// Allowed, and the port's first address of its family: to be locked.
    Learn(IpAddr),
    Spoofed,
}

impl PortPolicy {
    /// Checks the source address `src` a frame claims. `link_local_ok` lets IPv6
    /// link-local sources through (Layer 3 mode: neighbour discovery, MLD and router
    /// solicitations use them, and no port is reached at one).
    pub(crate) fn check_source(&self, src: IpAddr, link_local_ok: bool) -> SourceCheck {
        if self.ips.is_empty() && !self.learn_ips {
            return SourceCheck::Allowed;
        }
        let link_local = matches!(src, IpAddr::V6(a) if a.is_unicast_link_local());
        if src.is_unspecified() || (link_local && link_local_ok) || self.ips.contains(&src) {
            return SourceCheck::Allowed;
        }
        if self.learn_ips && !link_local && !self.ips.iter().any(|a| a.is_ipv4() == src.is_ipv4()) {
            return SourceCheck::Learn(src);
        }
        SourceCheck::Spoofed
    }
}

/// A frame its input's checks admit (see [`learning`]): its VLAN, and what it teaches
/// the core.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Admission {
    /// The frame's VLAN.
    pub vid: u16,
    /// The input's first address of this family, to be locked to it.
    pub ip: Option<IpAddr>,
    /// Its source MAC address is to be learned: as a station behind the input (Layer 2),
    /// or as the input's guest (Layer 3).
    pub station: bool,
}

/// A frame admitted by its input: the input's rules, the frame's VLAN, and an address
/// the input is to learn.
struct Admitted<'a> {
    me: &'a PortRules,
    vid: u16,
    learn_ip: Option<IpAddr>,
}

/// Stage 1: the VLAN a frame from port `me` joins, from the tag control it arrived with
/// (`tci`, `None` untagged) and, from a tunnel, its origin — or why it is dropped. A
/// tunnel's datagram from a sender not among its endpoints, when it takes its endpoints'
/// alone, is `unknown_endpoint`; one of a VNI the port does not carry is `vlan_filter`
/// (the VNI is the tunnel's tag); the port's single VNI leaves the frame's own tag to the
/// port's VLAN admission, and a VLAN's VNI gives that VLAN to a frame that crossed
/// untagged (or with a priority tag) — a tag inside a VLAN's VNI is `vlan_filter`.
/// Every datapath says where a tunnel's frame came from (a frame it cannot place is
/// refused before it gets here); without an origin its tag would say its VLAN.
#[inline]
pub(crate) fn stage1(me: &PortRules, tci: Option<u16>, tunnel: Option<Tunneled>) -> Result<Ingress, DropCause> {
    let by_tag = |tci| me.vlan.ingress(tci).ok_or(DropCause::VlanFilter);
    let (Some(t), Some(o)) = (&me.tunnel, tunnel) else { return by_tag(tci) };
    if t.remotes_only && !o.endpoint {
        return Err(DropCause::UnknownEndpoint);
    }
    match t.vnis.vlan_of(o.vni) {
        None => Err(DropCause::VlanFilter),
        Some(None) => by_tag(tci),
        Some(Some(vid)) => match tci {
            None => by_tag(Some(vid)),
            Some(p) if p & 0x0fff == 0 => by_tag(Some((p & 0xf000) | vid)),
            Some(_) => Err(DropCause::VlanFilter),
        },
    }
}

/// The checks that come before learning, in order: the input, its VLAN admission, the
/// link-local addresses it does not forward, the EtherTypes it drops, its MAC lock,
/// (Layer 3: IP frames only, readable), its source addresses, and other ports' locks. A frame that fails one is dropped and teaches
/// nothing.
#[inline]
fn admit<'a, P: Ports + ?Sized>(key: &Key, t: &Tables<'a, P>) -> Result<Admitted<'a>, DropCause> {
    let me = t.ports.rules(key.port).ok_or(DropCause::UnknownPort)?;
    let vid = stage1(me, key.tag.map(|v| v & 0x0fff), key.tunnel)?.vid;
    if let Dest::LinkLocal(n) = key.dst
        && (me.policy.forward_link_local & !crate::config::LINK_LOCAL_NEVER) & (1 << (n & 15)) == 0
    {
        return Err(DropCause::LinkLocal);
    }
    if me.policy.drop_ethertypes.contains(&key.ethertype) {
        return Err(DropCause::Filtered);
    }
    if me.policy.mac.is_some() && me.policy.mac != key.extras.src_mac {
        // Before learning: a forged address must not move the real owner's entry.
        return Err(DropCause::SpoofedMac);
    }
    let mut checks_source = me.checks_ips();
    if t.cfg.mode == Mode::L3 {
        if !matches!(key.ethertype, 0x0800 | 0x0806 | 0x86dd) {
            return Err(DropCause::NotIp);
        }
        if !key.extras.l3.is_some_and(|l| l.readable) {
            return Err(DropCause::Malformed);
        }
        // The LAN's sources are not checked.
        checks_source &= !me.policy.uplink;
    }
    let mut learn_ip = None;
    if checks_source && let Some(claimed) = key.extras.src_ip {
        let Some(src) = claimed else { return Err(DropCause::SpoofedIp) };
        match me.policy.check_source(src, t.cfg.mode == Mode::L3) {
            SourceCheck::Allowed => {}
            SourceCheck::Spoofed => return Err(DropCause::SpoofedIp),
            // In Layer 3 an address one port owns is refused to every other.
            SourceCheck::Learn(ip) if t.cfg.mode == Mode::L3 && t.l3.owner(ip).is_some_and(|o| o != key.port) => {
                return Err(DropCause::SpoofedIp);
            }
            SourceCheck::Learn(ip) => learn_ip = Some(ip),
        }
    }
    if key.src == Station::Locked && !(t.cfg.mode == Mode::L3 && me.policy.uplink) {
        // Another port's locked station: it stays where it is.
        return Err(DropCause::SpoofedMac);
    }
    Ok(Admitted { me, vid, learn_ip })
}

/// What the core is to learn from a frame with key `key` before deciding it, or `None`
/// when the frame fails a check that comes before learning (it teaches nothing). In Layer
/// 2 the station is always offered to the table, which refuses what it must.
#[inline]
pub(crate) fn learning<P: Ports + ?Sized>(key: &Key, t: &Tables<'_, P>) -> Option<Admission> {
    let a = admit(key, t).ok()?;
    // (An EVPN tunnel's stations come from routes, never from its datagrams.)
    let evpn = a.me.tunnel.as_ref().is_some_and(|t| t.evpn);
    let station = (t.cfg.mode == Mode::L2 || !a.me.policy.uplink) && !evpn;
    Some(Admission { vid: a.vid, ip: a.learn_ip, station })
}

/// Decides what happens to the frame with key `key`, into `v` (whose memory is reused).
pub(crate) fn decide<P: Ports + ?Sized>(key: &Key, t: &Tables<'_, P>, v: &mut Verdict) {
    v.clear();
    let Some(me) = t.ports.rules(key.port) else { return };
    if for_the_host(key, me, t, v) {
        return;
    }
    match admit(key, t) {
        Ok(a) => forward(key, &a, t, v),
        Err(cause) => v.action = Action::Drop(cause),
    }
}

/// [`decide`] for a frame its input admitted ([`learning`] said `adm`) once the core
/// learned what it teaches: the same verdict, without checking again what learning does
/// not change.
#[inline]
pub(crate) fn decide_learned<P: Ports + ?Sized>(key: &Key, adm: Admission, t: &Tables<'_, P>, v: &mut Verdict) {
    v.clear();
    let Some(me) = t.ports.rules(key.port) else { return };
    if for_the_host(key, me, t, v) {
        return;
    }
    // (What it taught is learned: its address is the input's now.)
    forward(key, &Admitted { me, vid: adm.vid, learn_ip: None }, t, v);
}

/// Layer 2, an uplink whose device may be the host's own interface: its frames are the
/// host's, and group frames the host's as well as the guests'. True when that is all.
#[inline]
fn for_the_host<P: Ports + ?Sized>(key: &Key, me: &PortRules, t: &Tables<'_, P>, v: &mut Verdict) -> bool {
    if t.cfg.mode != Mode::L2 || !me.policy.uplink || me.dev_mac.is_none() {
        return false;
    }
    match key.dst {
        Dest::Own => {
            v.pass_to_host = true;
            v.action = Action::Forward;
            true
        }
        Dest::Group | Dest::LinkLocal(_) | Dest::Broadcast => {
            v.pass_to_host = true;
            false
        }
        _ => false,
    }
}

/// The rest of the decision about an admitted frame.
#[inline]
fn forward<P: Ports + ?Sized>(key: &Key, a: &Admitted<'_>, t: &Tables<'_, P>, v: &mut Verdict) {
    match t.cfg.mode {
        Mode::L2 => l2(key, a, t, v),
        Mode::L3 => l3(key, a, t, v),
    }
    if v.action == Action::Forward {
        if v.outputs.is_empty() {
            // No port to deliver to (mirrors follow destinations, never replace them).
            v.action = Action::Drop(DropCause::UnknownPort);
            v.flood = false;
            return;
        }
        if t.acl.active() {
            security_groups(key, t, v);
            if v.action != Action::Forward {
                return;
            }
        }
        add_mirrors(key.port, a.vid, t, v);
        v.storm = storm(key.dst, &a.me.policy.storm);
        v.meter_in = a.me.policy.rate.rate_in > 0;
    }
}

/// Storm control: the budget of input rules `s` a forwarded frame to `dst` is charged to.
#[inline]
fn storm(dst: Dest, s: &crate::config::StormControl) -> Option<Storm> {
    match dst {
        Dest::Broadcast if s.broadcast_pps > 0 => Some(Storm::Broadcast),
        Dest::Group | Dest::LinkLocal(_) if s.multicast_pps > 0 => Some(Storm::Multicast),
        _ => None,
    }
}

/// Layer 2: the source's station, then the destination.
#[inline]
fn l2<P: Ports + ?Sized>(key: &Key, a: &Admitted<'_>, t: &Tables<'_, P>, v: &mut Verdict) {
    if a.learn_ip.is_some() {
        v.action = Action::Up(Upcall::Learn);
        return;
    }
    match key.src {
        Station::Here | Station::Unlearnable => {}
        // Another port's static station: it stays where it is.
        Station::Static | Station::Locked => {
            v.action = Action::Drop(DropCause::SpoofedMac);
            return;
        }
        Station::Absent | Station::Elsewhere if t.learn_full(key.port, a.me) => v.learn_refused = true,
        // A full table learns nothing new; the frame goes on as it is.
        Station::Absent if t.fib.is_full() => {}
        Station::Absent | Station::Elsewhere => {
            v.action = Action::Up(Upcall::Learn);
            return;
        }
    }
    if key.dst == Dest::Group && key.group == GroupClass::Control {
        v.action = Action::Up(Upcall::Snoop);
        return;
    }
    // (Read by the key reader: address resolution, not from a tunnel.)
    let resolution = key.ethertype == 0x0806 || key.extras.nd.is_some_and(|n| n.resolution(key.ethertype));
    if key.suppress && resolution && key.tunnel.is_none() {
        v.action = Action::Up(Upcall::Suppress);
        return;
    }
    v.action = Action::Forward;
    match key.dst {
        Dest::Station(p) => unicast(key.port, a, p, t, v),
        Dest::Group => group(key, a, t, v),
        Dest::Unknown | Dest::Own | Dest::LinkLocal(_) | Dest::Broadcast => flood(key.port, a, t, v),
    }
}

/// IGMP/MLD snooping: a registered group to its members and router ports; an
/// unregistered one to router ports while snooping prunes (the Linux bridge's rule with a
/// querier present), flooded before; reports read to router ports; any other group frame
/// flooded.
#[inline]
fn group<P: Ports + ?Sized>(key: &Key, a: &Admitted<'_>, t: &Tables<'_, P>, v: &mut Verdict) {
    let members: &[PortId] = match key.group {
        GroupClass::Set(id) if t.mdb.pruning() => t.mdb.set(id),
        GroupClass::Unregistered | GroupClass::Routers if t.mdb.pruning() || key.group == GroupClass::Routers => &[],
        _ => return flood(key.port, a, t, v),
    };
    let e = t.egress(a.vid);
    for (id, p) in t.ports.all() {
        let wanted = members.binary_search(&id).is_ok() || t.mdb.is_router(id, p.policy.mcast_router);
        if !wanted || id == key.port || p.failed.is_some() || !may_talk(&a.me.policy, &p.policy) {
            continue;
        }
        if let Some(o) = e.output(id, p, false) {
            v.outputs.push(o);
        }
    }
    // (No member and no router port: like a flood with no other port in the VLAN, no
    // port to deliver to.)
}

/// A frame to the station behind port `to`.
#[inline]
fn unicast<P: Ports + ?Sized>(from: PortId, a: &Admitted<'_>, to: PortId, t: &Tables<'_, P>, v: &mut Verdict) {
    if to == from {
        v.action = Action::Drop(DropCause::SamePort);
        return;
    }
    let cause = match t.ports.rules(to) {
        None => DropCause::UnknownPort,
        Some(p) if p.failed.is_some() => DropCause::UnknownPort,
        Some(p) => match t.egress(a.vid).output(to, p, false) {
            None => DropCause::VlanFilter,
            Some(_) if !may_talk(&a.me.policy, &p.policy) => DropCause::Isolated,
            Some(o) => {
                v.outputs.push(o);
                return;
            }
        },
    };
    v.action = Action::Drop(cause);
}

/// Every live port of the frame's VLAN but the input that the input may talk to.
#[inline]
fn flood<P: Ports + ?Sized>(from: PortId, a: &Admitted<'_>, t: &Tables<'_, P>, v: &mut Verdict) {
    v.flood = true;
    let e = t.egress(a.vid);
    for (id, p) in t.ports.all() {
        if id == from || p.failed.is_some() || !may_talk(&a.me.policy, &p.policy) {
            continue;
        }
        if let Some(o) = e.output(id, p, false) {
            v.outputs.push(o);
        }
    }
}

/// Layer 3: the guest's MAC address, address resolution, then routing by destination
/// address.
#[inline]
fn l3<P: Ports + ?Sized>(key: &Key, a: &Admitted<'_>, t: &Tables<'_, P>, v: &mut Verdict) {
    let uplink = a.me.policy.uplink;
    if !uplink && (a.learn_ip.is_some() || key.src != Station::Here) {
        v.action = Action::Up(Upcall::Learn);
        return;
    }
    let l3 = key.extras.l3.unwrap_or_default();
    if key.ethertype == 0x0806 || l3.nd.resolution(key.ethertype) {
        v.action = Action::Up(Upcall::Neigh);
        return;
    }
    v.action = Action::Forward;
    if key.dst.is_group() {
        flood(key.port, a, t, v);
        return;
    }
    // On the LAN the guests all sit behind the uplink's address; frames for other hosts
    // there are none of the switch's business.
    if uplink && key.dst != Dest::Own {
        v.action = Action::Drop(DropCause::NoRoute);
        return;
    }
    match l3.owner {
        Some(p) => {
            unicast(key.port, a, p, t, v);
            if v.action == Action::Forward {
                match t.ports.rules(p).and_then(|r| r.guest_mac) {
                    Some(m) => v.next_hop = Some(NextHop::Mac(m)),
                    None => {
                        v.outputs.clear();
                        v.action = Action::Up(Upcall::Resolve(p));
                    }
                }
            }
        }
        None if uplink => v.action = Action::Drop(DropCause::NoRoute),
        None => {
            // Any address no guest owns is on the LAN, through the first live uplink.
            let e = t.egress(a.vid);
            let up = t
                .ports
                .all()
                .find_map(|(id, p)| (p.policy.uplink && p.failed.is_none()).then(|| e.output(id, p, false)).flatten());
            match up {
                Some(o) => {
                    v.outputs.push(o);
                    v.next_hop = Some(NextHop::Neighbour);
                }
                None => v.action = Action::Drop(DropCause::NoRoute),
            }
        }
    }
}

/// Security groups, on a frame about to be forwarded: the input's `in` rules, then each
/// destination's `out` rules (a destination they refuse is left out; none left: dropped
/// `acl`). A frame of a remembered connection (either way) passes without rules; a new
/// one that an `allow-related` rule passed is to be remembered (`commit`).
#[inline]
fn security_groups<P: Ports + ?Sized>(key: &Key, t: &Tables<'_, P>, v: &mut Verdict) {
    let x = key.extras.acl.unwrap_or_default();
    let any = t.acl.port_has_rules(key.port) || v.outputs.iter().any(|o| t.acl.port_has_rules(o.port));
    if !any || !t.acl.judges(key.ethertype) {
        return;
    }
    v.acl.consulted = true;
    if matches!(x.ct, CtState::Established | CtState::Reply) {
        return;
    }
    let mut related = false;
    if let Some((action, rule)) = t.acl.judge(key.port, Dir::In, key.ethertype, &x) {
        if let Some(r) = rule {
            v.acl.hits.push((key.port, r));
        }
        match action {
            AclAction::Deny => {
                drop_acl(v);
                return;
            }
            AclAction::AllowRelated => related = true,
            AclAction::Allow => {}
        }
    }
    let mut out_related = false;
    let hits = &mut v.acl.hits;
    v.outputs.retain(|o| {
        let Some((action, rule)) = t.acl.judge(o.port, Dir::Out, key.ethertype, &x) else { return true };
        if let Some(r) = rule {
            hits.push((o.port, r));
        }
        out_related |= action == AclAction::AllowRelated;
        action != AclAction::Deny
    });
    if v.outputs.is_empty() {
        drop_acl(v);
        return;
    }
    v.acl.commit = (related || out_related) && x.ct == CtState::New;
}

fn drop_acl(v: &mut Verdict) {
    v.action = Action::Drop(DropCause::Acl);
    v.outputs.clear();
    v.flood = false;
    v.next_hop = None;
}

/// Appends copies for the mirrors of the frame's outputs and then of its input, once
/// each, if they are live members of VLAN `vid` and not the input or an output already.
#[inline]
fn add_mirrors<P: Ports + ?Sized>(from: PortId, vid: u16, t: &Tables<'_, P>, v: &mut Verdict) {
    let real = v.outputs.len();
    for k in 0..=real {
        let p = if k == real { from } else { v.outputs[k].port };
        let Some(m) = t.ports.rules(p).and_then(|r| r.mirrored_to) else { continue };
        if m == from || v.outputs.iter().any(|o| o.port == m) {
            continue;
        }
        if let Some(r) = t.ports.rules(m).filter(|r| r.failed.is_none())
            && let Some(o) = t.egress(vid).output(m, r, true)
        {
            v.outputs.push(o);
        }
    }
}

#[cfg(test)]
mod tests {
    //! Table-driven: a key and tables in, a verdict out, one table per family of rules.

    use super::*;

    const A: MacAddr = MacAddr([2, 0, 0, 0, 0, 0xa]);
    const ROUTER: MacAddr = MacAddr([2, 0, 0, 0, 0, 0xee]);
    const UPLINK_MAC: MacAddr = MacAddr([2, 0, 0, 0, 0, 0xf0]);

    fn access(v: u16) -> VlanMode {
        VlanMode::Access(v)
    }

    fn trunk(allowed: &[u16], native: Option<u16>) -> VlanMode {
        VlanMode::Trunk { allowed: allowed.iter().copied().collect(), native }
    }

    fn port(vlan: VlanMode) -> PortRules {
        PortRules {
            vlan,
            mtu: 1500,
            policy: PortPolicy::default(),
            mirrored_to: None,
            dev_mac: None,
            guest_mac: None,
            failed: None,
            tunnel: None,
        }
    }

    fn with(mut p: PortRules, f: impl FnOnce(&mut PortRules)) -> PortRules {
        f(&mut p);
        p
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    /// A switch's tables: ports by slot (`None`: a free slot), the MAC table (for the
    /// learning limits), the address owners.
    struct World {
        cfg: SwitchConfig,
        ports: Vec<Option<PortRules>>,
        fib: Fib,
        owners: L3Tables,
        acl: AclTables,
        mdb: Mdb,
    }

    impl World {
        fn new(mode: Mode, ports: Vec<Option<PortRules>>) -> Self {
            let cfg = SwitchConfig { mode, router_mac: ROUTER, port_mac_limit: 1024, ..SwitchConfig::default() };
            World {
                cfg,
                ports,
                fib: Fib::new(16, 1000),
                owners: L3Tables::new(16),
                acl: AclTables::default(),
                mdb: Mdb::new(Default::default()),
            }
        }

        fn tables(&self) -> Tables<'_, [Option<PortRules>]> {
            Tables {
                cfg: &self.cfg,
                ports: &self.ports[..],
                fib: &self.fib,
                l3: &self.owners,
                acl: &self.acl,
                mdb: &self.mdb,
            }
        }

        fn l2(ports: Vec<PortRules>) -> Self {
            World::new(Mode::L2, ports.into_iter().map(Some).collect())
        }

        fn l3(ports: Vec<PortRules>) -> Self {
            World::new(Mode::L3, ports.into_iter().map(Some).collect())
        }

        fn decide(&self, key: &Key) -> Verdict {
            let mut v = Verdict { outputs: vec![out(99, None)], ..Verdict::default() };
            decide(key, &self.tables(), &mut v);
            v
        }

        /// Checks every row: (what it shows, key, expected verdict).
        fn check(&self, rows: &[(&str, Key, Verdict)]) {
            for (what, key, want) in rows {
                assert_eq!(&self.decide(key), want, "{what}: {key:?}");
            }
        }
    }

    /// A frame from `port`, its source known there, to `dst`.
    fn key(port: PortId, dst: Dest) -> Key {
        Key {
            port,
            tag: None,
            tunnel: None,
            ethertype: 0x0800,
            src: Station::Here,
            dst,
            extras: Extras::default(),
            group: GroupClass::Flooded,
            suppress: false,
        }
    }

    fn tagged(k: Key, vid: u16) -> Key {
        Key { tag: Some(vid), ..k }
    }

    fn from(k: Key, src: Station) -> Key {
        Key { src, ..k }
    }

    fn out(port: PortId, tag: Option<u16>) -> Output {
        Output { port, tag, mtu: 1500, mirror: false, src_mac: None, paced: false }
    }

    fn fwd(outputs: Vec<Output>) -> Verdict {
        Verdict { action: Action::Forward, outputs, ..Verdict::default() }
    }

    fn flooded(outputs: Vec<Output>) -> Verdict {
        Verdict { flood: true, ..fwd(outputs) }
    }

    fn drop(cause: DropCause) -> Verdict {
        Verdict { action: Action::Drop(cause), ..Verdict::default() }
    }

    fn up(why: Upcall) -> Verdict {
        Verdict { action: Action::Up(why), ..Verdict::default() }
    }

    #[test]
    fn vlan_admission_and_egress_tagging() {
        let w = World::l2(vec![port(access(10)), port(trunk(&[10, 20], Some(1))), port(access(20)), port(access(1))]);
        w.check(&[
            ("access, untagged", key(0, Dest::Station(1)), fwd(vec![out(1, Some(10))])),
            ("access, priority tag only", tagged(key(0, Dest::Station(1)), 0), fwd(vec![out(1, Some(10))])),
            ("access, tagged", tagged(key(0, Dest::Station(1)), 10), drop(DropCause::VlanFilter)),
            ("trunk, allowed", tagged(key(1, Dest::Station(2)), 20), fwd(vec![out(2, None)])),
            ("trunk, not allowed", tagged(key(1, Dest::Station(2)), 30), drop(DropCause::VlanFilter)),
            ("trunk, untagged: native", key(1, Dest::Station(3)), fwd(vec![out(3, None)])),
            ("destination not in the VLAN", key(0, Dest::Station(2)), drop(DropCause::VlanFilter)),
            ("flood within the VLAN", key(2, Dest::Group), flooded(vec![out(1, Some(20))])),
        ]);
        let no_native = World::l2(vec![port(trunk(&[10], None)), port(access(10))]);
        no_native.check(&[("trunk without native, untagged", key(0, Dest::Group), drop(DropCause::VlanFilter))]);
    }

    #[test]
    fn a_tunnels_origin_says_its_vlan_or_drops_it() {
        use crate::tunnel::VniMap;
        let tunnel = |vlan: VlanMode, vnis: VniMap, remotes_only: bool| {
            with(port(vlan), |p| {
                p.tunnel = Some(TunnelRules {
                    vnis,
                    remotes_only,
                    remotes: vec![ip("192.0.2.1")],
                    evpn: false,
                    announced: vec![],
                })
            })
        };
        let w = World::l2(vec![
            tunnel(trunk(&[10], Some(1)), VniMap::Single(5000), true),
            tunnel(trunk(&[10, 20], None), VniMap::PerVlan(vec![(10, 5010), (20, 5020)]), false),
            port(access(1)),
            port(trunk(&[10, 20], None)),
        ]);
        let from = |port: PortId, vni: u32, endpoint: bool| Key {
            tunnel: Some(Tunneled { vni, endpoint }),
            ..key(port, Dest::Group)
        };
        w.check(&[
            ("its VNI, from an endpoint: the port's native VLAN", from(0, 5000, true), flooded(vec![out(2, None)])),
            (
                "tagged inside the port's one VNI: the port's admission",
                tagged(from(0, 5000, true), 10),
                flooded(vec![out(1, Some(10)), out(3, Some(10))]),
            ),
            ("a sender not among its endpoints", from(0, 5000, false), drop(DropCause::UnknownEndpoint)),
            ("a VNI the port does not carry", from(0, 5001, true), drop(DropCause::VlanFilter)),
            ("both: the sender first", from(0, 5001, false), drop(DropCause::UnknownEndpoint)),
            ("a VLAN's VNI, any sender: that VLAN", from(1, 5020, false), flooded(vec![out(3, Some(20))])),
            ("with a priority tag", tagged(from(1, 5010, false), 0), flooded(vec![out(0, Some(10)), out(3, Some(10))])),
            ("with a VLAN's tag inside", tagged(from(1, 5010, false), 10), drop(DropCause::VlanFilter)),
            ("no origin: admitted below, by its tag", tagged(key(1, Dest::Group), 20), flooded(vec![out(3, Some(20))])),
        ]);
    }

    #[test]
    fn link_local_frames_stay_unless_the_input_forwards_them() {
        let lldp = with(port(access(1)), |p| p.policy.forward_link_local = 1 << 0x0e | crate::LINK_LOCAL_NEVER);
        let upl = with(port(access(1)), |p| {
            p.policy.uplink = true;
            p.dev_mac = Some(UPLINK_MAC);
        });
        let w = World::l2(vec![port(access(1)), lldp, upl, port(access(1))]);
        let host = |v: Verdict| Verdict { pass_to_host: true, ..v };
        w.check(&[
            ("a BPDU", key(0, Dest::LinkLocal(0x00)), drop(DropCause::LinkLocal)),
            ("LLDP, not forwarded here", key(0, Dest::LinkLocal(0x0e)), drop(DropCause::LinkLocal)),
            (
                "LLDP from a port that forwards it",
                key(1, Dest::LinkLocal(0x0e)),
                flooded(vec![out(0, None), out(2, None), out(3, None)]),
            ),
            ("pause, whatever the port says", key(1, Dest::LinkLocal(0x01)), drop(DropCause::LinkLocal)),
            ("LACP, whatever the port says", key(1, Dest::LinkLocal(0x02)), drop(DropCause::LinkLocal)),
            (
                "a BPDU from the uplink: the host's alone",
                key(2, Dest::LinkLocal(0x00)),
                host(drop(DropCause::LinkLocal)),
            ),
            ("not admitted: the VLAN first", tagged(key(0, Dest::LinkLocal(0x00)), 7), drop(DropCause::VlanFilter)),
        ]);
        assert_eq!(Dest::group(MacAddr([0x01, 0x80, 0xc2, 0, 0, 0x0f])), Dest::LinkLocal(0x0f));
        assert_eq!(Dest::group(MacAddr([0x01, 0x80, 0xc2, 0, 0, 0x10])), Dest::Group);
        assert_eq!(Dest::group(MacAddr([0x01, 0x80, 0xc2, 0, 1, 0x00])), Dest::Group);
    }

    #[test]
    fn storm_and_rate_limits_mark_what_is_charged() {
        use crate::config::{RateLimit, StormControl};
        let noisy = with(port(access(1)), |p| {
            p.policy.storm = StormControl { broadcast_pps: 10, multicast_pps: 0, burst: 0 };
            p.policy.rate = RateLimit { rate_in: 1_000_000, ..RateLimit::default() };
        });
        let slow = with(port(access(1)), |p| p.policy.rate = RateLimit { rate_out: 1_000_000, ..RateLimit::default() });
        let w = World::l2(vec![noisy, slow, port(access(1))]);
        let charged = |v: Verdict, storm: Option<Storm>, meter_in: bool| Verdict { storm, meter_in, ..v };
        let paced = Output { paced: true, ..out(1, None) };
        w.check(&[
            (
                "a broadcast: storm and rate",
                key(0, Dest::Broadcast),
                charged(flooded(vec![paced, out(2, None)]), Some(Storm::Broadcast), true),
            ),
            (
                "multicast: no budget for it",
                key(0, Dest::Group),
                charged(flooded(vec![paced, out(2, None)]), None, true),
            ),
            ("unicast: rate only", key(0, Dest::Station(2)), charged(fwd(vec![out(2, None)]), None, true)),
            ("a drop is never charged", key(0, Dest::Station(0)), drop(DropCause::SamePort)),
            ("to the limited port: paced", key(2, Dest::Station(1)), fwd(vec![paced])),
        ]);
    }

    #[test]
    fn unicast_to_a_station_and_where_it_cannot_go() {
        let mut ports = vec![Some(port(access(1))), Some(port(access(1))), None];
        ports.push(Some(with(port(access(1)), |p| p.failed = Some("gone".into()))));
        let w = World::new(Mode::L2, ports);
        w.check(&[
            ("known station", key(0, Dest::Station(1)), fwd(vec![out(1, None)])),
            ("behind its own input", key(0, Dest::Station(0)), drop(DropCause::SamePort)),
            ("its port is gone", key(0, Dest::Station(2)), drop(DropCause::UnknownPort)),
            ("its port failed", key(0, Dest::Station(3)), drop(DropCause::UnknownPort)),
            ("unknown: flooded, not to failed ports", key(0, Dest::Unknown), flooded(vec![out(1, None)])),
        ]);
        let alone = World::l2(vec![port(access(1)), port(access(2))]);
        alone.check(&[("nobody else in the VLAN", key(0, Dest::Group), drop(DropCause::UnknownPort))]);
    }

    #[test]
    fn isolated_ports_talk_to_uplinks_only() {
        let iso = |p: PortRules| with(p, |p| p.policy.isolated = true);
        let upl = |p: PortRules| with(p, |p| p.policy.uplink = true);
        let w = World::l2(vec![iso(port(access(1))), port(access(1)), upl(port(access(1))), iso(port(access(1)))]);
        w.check(&[
            ("isolated to a guest", key(0, Dest::Station(1)), drop(DropCause::Isolated)),
            ("a guest to an isolated port", key(1, Dest::Station(3)), drop(DropCause::Isolated)),
            ("isolated to the uplink", key(0, Dest::Station(2)), fwd(vec![out(2, None)])),
            ("the uplink to an isolated port", key(2, Dest::Station(0)), fwd(vec![out(0, None)])),
            ("an isolated port's flood", key(0, Dest::Group), flooded(vec![out(2, None)])),
            ("a guest's flood skips isolated ports", key(1, Dest::Group), flooded(vec![out(2, None)])),
        ]);
    }

    #[test]
    fn mac_anti_spoofing() {
        let locked = with(port(access(1)), |p| p.policy.mac = Some(A));
        let w = World::l2(vec![locked, port(access(1))]);
        let own = |k: Key, m: MacAddr| Key { extras: Extras { src_mac: Some(m), ..Extras::default() }, ..k };
        w.check(&[
            ("from its locked address", own(key(0, Dest::Station(1)), A), fwd(vec![out(1, None)])),
            ("from another", own(key(0, Dest::Station(1)), ROUTER), drop(DropCause::SpoofedMac)),
            (
                "claiming another port's lock",
                from(key(1, Dest::Station(0)), Station::Locked),
                drop(DropCause::SpoofedMac),
            ),
            (
                "claiming another port's static",
                from(key(1, Dest::Station(0)), Station::Static),
                drop(DropCause::SpoofedMac),
            ),
        ]);
    }

    #[test]
    fn ip_anti_spoofing() {
        let ips = with(port(access(1)), |p| p.policy.ips = vec![ip("10.0.0.1"), ip("fd00::1")]);
        let learns = with(port(access(1)), |p| {
            p.policy.learn_ips = true;
            p.policy.ips = vec![ip("10.0.0.2")];
        });
        let w = World::l2(vec![ips, port(access(1)), learns]);
        let claims = |port: PortId, c: Option<Option<IpAddr>>| Key {
            extras: Extras { src_ip: c, ..Extras::default() },
            ..key(port, Dest::Station(1))
        };
        let ok = fwd(vec![out(1, None)]);
        w.check(&[
            ("its address", claims(0, Some(Some(ip("10.0.0.1")))), ok.clone()),
            ("its IPv6 address", claims(0, Some(Some(ip("fd00::1")))), ok.clone()),
            ("unspecified (DHCP, DAD)", claims(0, Some(Some(ip("0.0.0.0")))), ok.clone()),
            ("another address", claims(0, Some(Some(ip("10.0.0.9")))), drop(DropCause::SpoofedIp)),
            ("too short to say", claims(0, Some(None)), drop(DropCause::SpoofedIp)),
            ("not IP", claims(0, None), ok.clone()),
            ("link-local is not special in Layer 2", claims(0, Some(Some(ip("fe80::1")))), drop(DropCause::SpoofedIp)),
            ("first IPv6 address: learned", claims(2, Some(Some(ip("fd00::2")))), up(Upcall::Learn)),
            ("a second IPv4 address", claims(2, Some(Some(ip("10.0.0.3")))), drop(DropCause::SpoofedIp)),
        ]);
    }

    #[test]
    fn the_learning_limits_effect_on_forwarding() {
        let mut w =
            World::l2(vec![port(access(1)), port(access(1)), with(port(access(1)), |p| p.policy.uplink = true)]);
        let refused = |v: Verdict| Verdict { learn_refused: true, ..v };
        w.check(&[
            ("a new source is learned first", from(key(0, Dest::Station(1)), Station::Absent), up(Upcall::Learn)),
            ("so is a moved one", from(key(0, Dest::Station(1)), Station::Elsewhere), up(Upcall::Learn)),
            (
                "all zeroes is never learned",
                from(key(0, Dest::Station(1)), Station::Unlearnable),
                fwd(vec![out(1, None)]),
            ),
        ]);
        // Port 0 at its limit: its new sources go on as they are, counted.
        w.cfg.port_mac_limit = 1;
        w.fib.learn(1, A, 0, 0);
        w.fib.learn(1, ROUTER, 2, 0);
        w.check(&[
            ("new, at the limit", from(key(0, Dest::Station(1)), Station::Absent), refused(fwd(vec![out(1, None)]))),
            (
                "moved, at the limit",
                from(key(0, Dest::Group), Station::Elsewhere),
                refused(flooded(vec![out(1, None), out(2, None)])),
            ),
            (
                "refused and dropped",
                from(key(0, Dest::Station(0)), Station::Absent),
                refused(drop(DropCause::SamePort)),
            ),
            ("an uplink has no limit", from(key(2, Dest::Station(1)), Station::Absent), up(Upcall::Learn)),
        ]);
        // A full table learns nothing new: the frame goes on, not counted as a refusal.
        let mut full = World::l2(vec![port(access(1)), port(access(1))]);
        full.fib = Fib::new(1, 1000);
        full.fib.learn(1, ROUTER, 1, 0);
        full.check(&[("table full", from(key(0, Dest::Station(1)), Station::Absent), fwd(vec![out(1, None)]))]);
    }

    #[test]
    fn outputs_carry_their_mtu_and_mirrors_follow() {
        let w = World::l2(vec![
            with(port(access(1)), |p| p.mirrored_to = Some(3)),
            with(port(access(1)), |p| {
                p.mtu = 9000;
                p.mirrored_to = Some(4);
            }),
            port(access(1)),
            with(port(trunk(&[1], None)), |p| p.mtu = 1400),
            port(access(2)),
        ]);
        let mirror = |port: PortId, tag: Option<u16>, mtu: u16| Output {
            port,
            tag,
            mtu,
            mirror: true,
            src_mac: None,
            paced: false,
        };
        let big = Output { mtu: 9000, ..out(1, None) };
        w.check(&[
            (
                "the output's mirror (not a VLAN member) and the input's",
                key(0, Dest::Station(1)),
                fwd(vec![big, mirror(3, Some(1), 1400)]),
            ),
            (
                "a mirror already an output is not copied twice",
                key(0, Dest::Station(3)),
                fwd(vec![Output { mtu: 1400, tag: Some(1), ..out(3, None) }]),
            ),
            (
                "a frame from the mirror is not copied to it",
                tagged(key(3, Dest::Station(0)), 1),
                fwd(vec![out(0, None)]),
            ),
        ]);
        let lonely = World::l2(vec![with(port(access(1)), |p| p.mirrored_to = Some(1)), port(access(2))]);
        lonely.check(&[("no destination, no copy", key(0, Dest::Group), drop(DropCause::UnknownPort))]);
    }

    #[test]
    fn an_uplink_that_may_be_the_hosts_interface() {
        let upl = with(port(access(1)), |p| {
            p.policy.uplink = true;
            p.dev_mac = Some(UPLINK_MAC);
        });
        let w = World::l2(vec![upl, port(access(1))]);
        let host = |v: Verdict| Verdict { pass_to_host: true, ..v };
        w.check(&[
            ("for the host alone", key(0, Dest::Own), host(fwd(vec![]))),
            ("a group: the host's and the guests'", key(0, Dest::Group), host(flooded(vec![out(1, None)]))),
            ("even when not admitted", tagged(key(0, Dest::Group), 7), host(drop(DropCause::VlanFilter))),
            ("for a guest", key(0, Dest::Station(1)), fwd(vec![out(1, None)])),
        ]);
    }

    #[test]
    fn layer_3_routing_and_rewrite() {
        let guest = |m: Option<MacAddr>, a: &str| {
            with(port(access(1)), |p| {
                p.guest_mac = m;
                p.policy.ips = vec![ip(a)];
            })
        };
        let upl = with(port(access(1)), |p| {
            p.policy.uplink = true;
            p.dev_mac = Some(UPLINK_MAC);
        });
        let mut w =
            World::l3(vec![guest(Some(A), "10.0.0.1"), guest(None, "10.0.0.2"), upl, guest(Some(ROUTER), "10.0.0.4")]);
        for (a, p) in [("10.0.0.1", 0), ("10.0.0.2", 1), ("10.0.0.4", 3)] {
            w.owners.own(ip(a), p);
        }
        let l3 = |port: PortId, ethertype: u16, dst: Dest, x: L3Extras| Key {
            ethertype,
            extras: Extras { src_ip: Some(Some(ip("10.0.0.1"))), l3: Some(x), ..Extras::default() },
            ..key(port, dst)
        };
        let ipv4 = |owner: Option<PortId>| L3Extras { readable: true, owner, ..L3Extras::default() };
        let icmp6 =
            |t: u8| L3Extras { readable: true, nd: NdFacts { proto: 58, icmp6_type: t, hop255: true }, owner: None };
        let to = |port: PortId, src: MacAddr| Output { src_mac: Some(src), ..out(port, None) };
        let routed = |o: Output, hop: NextHop| Verdict { next_hop: Some(hop), ..fwd(vec![o]) };
        let from_lan =
            |owner| Key { extras: Extras { l3: Some(ipv4(owner)), ..Extras::default() }, ..key(2, Dest::Own) };
        w.check(&[
            ("not IP", l3(0, 0x88b5, Dest::Unknown, ipv4(None)), drop(DropCause::NotIp)),
            ("headers cut short", l3(0, 0x0800, Dest::Unknown, L3Extras::default()), drop(DropCause::Malformed)),
            ("ARP is answered", l3(0, 0x0806, Dest::Group, ipv4(None)), up(Upcall::Neigh)),
            ("a solicitation is answered", l3(0, 0x86dd, Dest::Group, icmp6(135)), up(Upcall::Neigh)),
            (
                "a router solicitation is not",
                l3(0, 0x86dd, Dest::Group, icmp6(133)),
                flooded(vec![to(1, ROUTER), to(2, UPLINK_MAC), to(3, ROUTER)]),
            ),
            ("to a guest", l3(0, 0x0800, Dest::Unknown, ipv4(Some(3))), routed(to(3, ROUTER), NextHop::Mac(ROUTER))),
            ("to a guest not heard from", l3(0, 0x0800, Dest::Unknown, ipv4(Some(1))), up(Upcall::Resolve(1))),
            ("to itself", l3(0, 0x0800, Dest::Unknown, ipv4(Some(0))), drop(DropCause::SamePort)),
            ("to the LAN", l3(0, 0x0800, Dest::Unknown, ipv4(None)), routed(to(2, UPLINK_MAC), NextHop::Neighbour)),
            (
                "from a guest not heard from",
                from(l3(0, 0x0800, Dest::Unknown, ipv4(None)), Station::Absent),
                up(Upcall::Learn),
            ),
            ("from the LAN to a guest", from_lan(Some(0)), routed(to(0, ROUTER), NextHop::Mac(A))),
            ("from the LAN to nobody's address", from_lan(None), drop(DropCause::NoRoute)),
            (
                "from the LAN, not to the switch",
                Key { dst: Dest::Unknown, ..from_lan(Some(0)) },
                drop(DropCause::NoRoute),
            ),
        ]);
        let spoof = |c: &str| Key {
            extras: Extras { src_ip: Some(Some(ip(c))), l3: Some(ipv4(None)), ..Extras::default() },
            ..key(0, Dest::Unknown)
        };
        w.ports[0].as_mut().unwrap().policy.learn_ips = true;
        w.ports[0].as_mut().unwrap().policy.ips.clear();
        w.check(&[
            ("an address another port owns", spoof("10.0.0.4"), drop(DropCause::SpoofedIp)),
            ("a link-local source", spoof("fe80::1"), routed(to(2, UPLINK_MAC), NextHop::Neighbour)),
            ("a first address nobody owns", spoof("10.0.0.9"), up(Upcall::Learn)),
        ]);
        w.ports[2] = None;
        w.check(&[("no uplink", spoof("fe80::1"), drop(DropCause::NoRoute))]);
    }

    #[test]
    fn what_is_learned_comes_after_the_checks_that_drop() {
        let w = World::l2(vec![with(port(access(1)), |p| p.policy.learn_ips = true), port(access(1))]);
        let t = w.tables();
        let claims = |c: &str| Key {
            extras: Extras { src_ip: Some(Some(ip(c))), ..Extras::default() },
            ..from(key(0, Dest::Unknown), Station::Absent)
        };
        let learns = |ip: Option<IpAddr>| Some(Admission { vid: 1, ip, station: true });
        assert_eq!(learning(&claims("10.0.0.7"), &t), learns(Some(ip("10.0.0.7"))));
        assert_eq!(learning(&tagged(claims("10.0.0.7"), 5), &t), None, "not admitted");
        assert_eq!(learning(&from(claims("10.0.0.7"), Station::Locked), &t), None, "another port's station");
        assert_eq!(
            learning(&from(key(1, Dest::Unknown), Station::Static), &t),
            learns(None),
            "the table refuses it itself"
        );
        // Once learned, the decision is the one a fresh look at the key gives.
        for k in [claims("10.0.0.7"), from(key(1, Dest::Station(0)), Station::Here)] {
            let mut w2 = World::l2(vec![with(port(access(1)), |p| p.policy.learn_ips = true), port(access(1))]);
            w2.ports[0].as_mut().unwrap().policy.ips.push(ip("10.0.0.7"));
            let adm = learning(&k, &w.tables()).unwrap();
            let mut v = Verdict::default();
            decide_learned(&from(k, Station::Here), adm, &w2.tables(), &mut v);
            assert_eq!(v, w2.decide(&from(k, Station::Here)));
        }
    }

    // Security groups.
    #[test]
    fn security_groups_judge_the_senders_in_and_each_receivers_out_rules() {
        use crate::acl::{AclExtras, AclRuleSpec};
        let mut w = World::l2(vec![
            with(port(access(1)), |p| p.mirrored_to = Some(3)),
            port(access(1)),
            port(access(1)),
            port(access(1)),
        ]);
        for (i, n) in ["a", "b", "c", "m"].iter().enumerate() {
            w.acl.bind(i as PortId, Some(n));
        }
        let rule = |dir: &str, action: &str, dport: &str| AclRuleSpec {
            dir: dir.into(),
            action: action.into(),
            proto: Some("tcp".into()),
            dport: Some(dport.into()),
            ..AclRuleSpec::default()
        };
        w.acl.add("a", &rule("in", "deny", "23")).unwrap();
        w.acl.add("a", &rule("in", "allow-related", "80")).unwrap();
        w.acl.add("c", &rule("out", "deny", "80")).unwrap();
        let tcp = |port: PortId, dst: Dest, dport: u16, ct: CtState| Key {
            extras: Extras {
                acl: Some(AclExtras { ct, proto: 6, dport: w.acl.port_class(dport), ..AclExtras::default() }),
                ..Extras::default()
            },
            ..key(port, dst)
        };
        let judged = |v: Verdict, commit: bool, hits: Vec<(PortId, u32)>| Verdict {
            acl: AclVerdict { consulted: true, commit, hits },
            ..v
        };
        let mirror = Output { mirror: true, ..out(3, None) };
        let rows = [
            (
                "the sender's deny",
                tcp(0, Dest::Station(1), 23, CtState::New),
                judged(drop(DropCause::Acl), false, vec![(0, 0)]),
            ),
            (
                "allow-related: remembered; the mirror still copies",
                tcp(0, Dest::Station(1), 80, CtState::New),
                judged(fwd(vec![out(1, None), mirror]), true, vec![(0, 1)]),
            ),
            (
                "the receiver's out deny",
                tcp(0, Dest::Station(2), 80, CtState::New),
                judged(drop(DropCause::Acl), false, vec![(0, 1), (2, 0)]),
            ),
            (
                "a flood leaves out the port that refuses it",
                tcp(1, Dest::Unknown, 80, CtState::New),
                judged(flooded(vec![out(0, None), out(3, None)]), false, vec![(2, 0)]),
            ),
            (
                "a remembered connection's reply passes without rules",
                tcp(2, Dest::Station(0), 23, CtState::Reply),
                judged(fwd(vec![out(0, None), mirror]), false, vec![]),
            ),
            (
                "invalid: judged, never remembered",
                tcp(0, Dest::Station(1), 80, CtState::Invalid),
                judged(fwd(vec![out(1, None), mirror]), false, vec![(0, 1)]),
            ),
        ];
        for (what, k, want) in rows {
            assert_eq!(w.decide(&k), want, "{what}");
        }
        let plain = World::l2(vec![port(access(1)), port(access(1))]);
        assert_eq!(plain.decide(&key(0, Dest::Station(1))).acl, AclVerdict::default(), "no rules: not consulted");
        let arp = Key { ethertype: 0x0806, ..key(0, Dest::Station(1)) };
        assert_eq!(w.decide(&arp).acl, AclVerdict::default(), "ARP, which no rule names: not consulted");
        w.acl
            .add(
                "b",
                &AclRuleSpec {
                    dir: "out".into(),
                    action: "deny".into(),
                    ethertype: Some("arp".into()),
                    ..AclRuleSpec::default()
                },
            )
            .unwrap();
        assert_eq!(w.decide(&arp).action, Action::Drop(DropCause::Acl), "once a rule names it");
    }
}

//! The core's state and decisions as the executor's map entries (docs/architecture.md,
//! "One brain: the kernel executes the core's verdicts"): a port as its input entry, a
//! station, a lock, the generation; a frame's [`Key`] as the two keys the program extracts
//! ([`abi::AdmitKey`], [`abi::FlowKey`]) and the core's [`Verdict`] as the two verdicts it
//! looks up ([`abi::Admit`], [`abi::Verdict`]).
//!
//! Pure functions, one per conversion: they decide nothing. What the core decided comes in
//! (its key and verdict, [`FastPort`], [`FastMac`]); so does how the kernel reaches each
//! port, from the caller, as a [`Place`] per port (its slot in the maps and its device).
//! The caller writes what they return ([`crate::exec::Executor`]).
//!
//! The invariant kept: for a frame the core read as `key` and whose tables the caller
//! wrote from the same core, the program extracts exactly [`admit_key`] and, once
//! admitted, [`flow_key`] — every extra the input's [`mask`] does not ask for is zero — so
//! that the verdict installed under them is the one it finds. crates/ebpf/tests/
//! differential.rs holds the two sides to it on generated switches and frames.

use std::net::IpAddr;

use sluice_switch::acl::CtState;
use sluice_switch::conntrack::Found;
use sluice_switch::{
    Action, Dest, DropCause, FastMac, FastPort, GroupClass, Key, Mode, NextHop, PortId, Station, Verdict,
};
use sluice_wire::MacAddr;

use crate::abi;

/// How the kernel reaches one port: its slot in the maps, and its device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Place {
    /// The port's slot (below [`abi::MAX_PORTS`]): its counters, and what keys, stations and
    /// owners name it by. Every port has one, a port in user space too.
    pub slot: u16,
    /// The port's device, or `None` when the kernel may not send to it (a port in user
    /// space, or one whose frames must all go through the core): a verdict with an output
    /// to it goes up.
    pub device: Option<Device>,
}

/// A port's device, as the kernel sends to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Device {
    /// Its interface index.
    pub ifindex: u32,
    /// How a frame gets there.
    pub reach: Reach,
}

/// How the kernel sends a frame to a port's device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reach {
    /// A guest's veth, whose peer is in the guest's namespace: the frame itself goes in
    /// with `bpf_redirect_peer`, copies through the device's egress, marked (its egress
    /// program lets only the switch's frames in).
    Guest,
    /// A veth whose peer is in the switch's own namespace (`bpf_redirect_peer` cannot
    /// reach it): out of its egress, marked.
    Veth,
    /// Out of the device, unmarked: an uplink.
    Uplink,
    /// Into a tunnel's VXLAN device, with a tunnel key: to the endpoint the remote table
    /// has the destination behind (a frame to a station not there goes up, and the core's
    /// tunnel port sends it). A flood's copy goes to every endpoint of the tunnel's flood
    /// set in `sluice_flood_eps`, a clone and a key each (no entry: up). A mirror's copy
    /// into a tunnel goes up: the port sends it.
    Tunnel,
}

/// How a frame leaves by a tunnel output: the VNI it is sent in and whether it keeps the
/// 802.1Q tag the core gives it (a tunnel with one VNI carries its trunk's tags inside;
/// one with a VNI per VLAN carries every frame untagged, its VLAN in the VNI).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TunnelOut {
    /// The VNI.
    pub vni: u32,
    /// The frame keeps its tag.
    pub tagged: bool,
}

/// A tunnel port's settings in `sluice_tunnels`: what its outputs are sent with.
pub fn tunnel(local: IpAddr, ttl: u8) -> abi::Tunnel {
    let mut t = abi::Tunnel { ttl, ..abi::Tunnel::default() };
    match local {
        IpAddr::V4(a) => t.local[..4].copy_from_slice(&a.octets()),
        IpAddr::V6(a) => {
            t.local = a.octets();
            t.flags |= abi::TUN_V6;
        }
    }
    t
}

/// A tunnel VNI's flood set `eps` (the endpoints the core's tunnel port sends a flood in
/// that VNI to) as `sluice_flood_eps` holds it; `None` when the kernel cannot send it
/// (none, or more than [`abi::MAX_FLOOD_EPS`]): floods go up, and the port sends them.
pub fn flood_eps(eps: &[IpAddr]) -> Option<abi::FloodEps> {
    if eps.is_empty() || eps.len() > abi::MAX_FLOOD_EPS {
        return None;
    }
    let mut v = abi::FloodEps { n: eps.len() as u32, ..abi::FloodEps::default() };
    for (a, slot) in eps.iter().zip(v.addrs.iter_mut()) {
        match a {
            IpAddr::V4(a) => slot[..4].copy_from_slice(&a.octets()),
            IpAddr::V6(a) => *slot = a.octets(),
        }
    }
    Some(v)
}

/// The input entry `e` of a tunnel's VXLAN device, whose underlay is IPv6 if `v6`: its
/// frames' stage-1 keys carry their origin.
pub fn tunnel_input(mut e: abi::Input, v6: bool) -> abi::Input {
    e.flags |= abi::IN_TUNNEL;
    if v6 {
        e.flags |= abi::IN_TUNNEL_V6;
    }
    e
}

/// Port `p`'s entry in `sluice_inputs` (by its device's ifindex), in slot `slot` of a
/// switch in `mode` whose address on the guests' side is `router_mac`: where its frames'
/// destination is the input's own address (the core's [`Dest::Own`]: an uplink's device
/// address, in Layer 3 the switch's on the LAN), whether the host's stack may take them (a
/// Layer 2 uplink with a device address: the core's `pass_to_host`), and in Layer 3 its
/// guest's address (the core's [`Station::Here`] there).
pub fn input(p: &FastPort, slot: u16, mode: Mode, router_mac: MacAddr) -> abi::Input {
    let mut e = abi::Input { slot: u32::from(slot), ..abi::Input::default() };
    if mode == Mode::L3
        && let Some(g) = p.guest_mac
    {
        e.flags |= abi::IN_GUEST;
        e.guest_mac = g.0;
    }
    let own = match mode {
        Mode::L2 => p.dev_mac,
        Mode::L3 => Some(p.dev_mac.unwrap_or(router_mac)),
    };
    if p.uplink
        && let Some(own) = own
    {
        e.flags |= abi::IN_OWN_MAC;
        e.own_mac = own.0;
        if mode == Mode::L2 {
            e.flags |= abi::IN_HOST;
        }
    }
    e
}

/// What stage 2's key reads of a frame from port `p` on a switch in `mode` (its `X_*`
/// mask): the extras the core's key reader fills in for that port, and no others.
pub fn mask(p: &FastPort, mode: Mode) -> u16 {
    // In Layer 3 mode the LAN's sources are not checked.
    let checked = !(mode == Mode::L3 && p.uplink);
    let mut m = 0;
    if p.mac.is_some() {
        m |= abi::X_SRC_MAC;
    } else if checked {
        // (A port locked to its own address may send from it; another port's lock is
        // asked of the others.)
        m |= abi::X_LOCKS;
    }
    if checked && p.checks_ips {
        m |= abi::X_SRC_IP;
    }
    m |= match mode {
        Mode::L2 => abi::X_DST_STATION,
        Mode::L3 => abi::X_L3 | abi::X_GUEST,
    };
    if p.snoops && mode == Mode::L2 {
        m |= abi::X_GROUP;
    }
    if p.acl {
        m |= abi::X_CT;
    }
    if p.routed && mode == Mode::L2 {
        m |= abi::X_ROUTED;
    }
    if p.suppressed {
        m |= abi::X_ND;
    }
    m
}

/// Stage 1's key of a frame the core read as `key` from the input in slot `slot`: the tag
/// it came with, its destination's class and, from a tunnel, its origin.
pub fn admit_key(key: &Key, slot: u16) -> abi::AdmitKey {
    let (tag, vid) = match key.tag {
        Some(vid) => (abi::TAG_8021Q, vid & 0x0fff),
        None => (abi::TAG_NONE, 0),
    };
    let mut k = abi::AdmitKey { slot, vid, tag, dst: stage1_dst(key.dst), ..abi::AdmitKey::default() };
    if let Some(t) = key.tunnel {
        k.vni = t.vni;
        k.endpoint = u8::from(t.endpoint);
    }
    k
}

fn stage1_dst(d: Dest) -> u8 {
    match d {
        Dest::Group => abi::DST_GROUP,
        Dest::Own => abi::DST_OWN,
        Dest::Station(_) | Dest::Unknown => abi::DST_UNKNOWN,
        Dest::LinkLocal(_) => abi::DST_LINK_LOCAL,
        Dest::Broadcast => abi::DST_BROADCAST,
    }
}

/// Whether verdict `v` gives the frame to the host's stack and to nothing else: the
/// program's `ACT_HOST`, which leaves it uncounted.
fn host_alone(v: &Verdict) -> bool {
    v.pass_to_host && v.action == Action::Forward && v.outputs.is_empty()
}

/// Stage 1's verdict for the frames with `key`'s stage-1 key from port `p` (on a switch in
/// `mode`), made in `generation`, given the core's stage 1 on `key` (`stage1`, the core's
/// own: [`sluice_switch::Switch::stage1`]) and its verdict `v`: the host's alone; dropped
/// by the input's rule, the host's too if `v` says so; up, for a port whose frames all go
/// through the core; else admitted to the frame's VLAN, stage 2 reading what the input's
/// [`mask`] asks.
pub fn admit(v: &Verdict, stage1: Result<u16, DropCause>, p: &FastPort, mode: Mode, generation: u64) -> abi::Admit {
    let mut a = abi::Admit { generation, ..abi::Admit::default() };
    if host_alone(v) {
        a.action = abi::ACT_HOST;
        return a;
    }
    match stage1 {
        Err(c) => {
            a.action = abi::ACT_DROP;
            a.cause = cause(c);
        }
        Ok(_) if p.slow => a.action = abi::ACT_UP,
        Ok(vid) => {
            a.action = abi::ACT_FORWARD;
            a.vlan = vid;
            a.mask = mask(p, mode);
            // (Stage 2's verdict says whether the host takes an admitted frame.)
            return a;
        }
    }
    if v.pass_to_host {
        a.flags |= abi::V_HOST;
    }
    a
}

/// Stage 2's key of a frame the core read as `key`, admitted to `vlan`, as the program
/// extracts it: `None` when a port the key names has no place.
pub fn flow_key(key: &Key, vlan: u16, places: impl Fn(PortId) -> Option<Place>) -> Option<abi::FlowKey> {
    let mut k = abi::FlowKey {
        slot: places(key.port)?.slot,
        vlan,
        ethertype: key.ethertype,
        src: match key.src {
            Station::Absent => abi::SRC_ABSENT,
            Station::Here => abi::SRC_HERE,
            Station::Elsewhere => abi::SRC_ELSEWHERE,
            Station::Static => abi::SRC_STATIC,
            Station::Locked => abi::SRC_LOCKED,
            Station::Unlearnable => abi::SRC_UNLEARNABLE,
        },
        dst: stage1_dst(key.dst),
        ..abi::FlowKey::default()
    };
    if let Dest::Station(p) = key.dst {
        k.dst = abi::DST_STATION;
        k.dst_slot = places(p)?.slot;
    }
    if let Dest::LinkLocal(n) = key.dst {
        k.dst_slot = u16::from(n & 15);
    }
    let x = &key.extras;
    if let Some(m) = x.src_mac {
        k.src_mac = m.0;
    }
    k.claim = match x.src_ip {
        None => abi::CLAIM_NONE,
        Some(None) => abi::CLAIM_SHORT,
        Some(Some(IpAddr::V4(a))) => {
            k.src_ip[..4].copy_from_slice(&a.octets());
            abi::CLAIM_V4
        }
        Some(Some(IpAddr::V6(a))) => {
            k.src_ip = a.octets();
            abi::CLAIM_V6
        }
    };
    if let Some(l3) = x.l3 {
        if l3.readable {
            k.l3 |= abi::L3X_READABLE;
        }
        if let Some(o) = l3.owner {
            k.owner = places(o)?.slot + 1;
        }
    }
    // Neighbour discovery's facts: Layer 3 mode's, or EVPN suppression's.
    if let Some(nd) = x.l3.map(|l3| l3.nd).or(x.nd) {
        if nd.hop255 {
            k.l3 |= abi::L3X_HOP255;
        }
        k.proto = nd.proto;
        k.icmp6_type = nd.icmp6_type;
    }
    // IGMP/MLD snooping: the group's class, as the program reads it (`group_class`).
    let g = match key.group {
        GroupClass::Flooded | GroupClass::Routers => abi::GCLASS_FLOODED,
        GroupClass::Control => abi::GCLASS_CONTROL,
        GroupClass::Unregistered => abi::GCLASS_UNREGISTERED,
        GroupClass::Set(id) => id,
    };
    k.group = g.to_ne_bytes();
    // Security groups: the frame's connection as the kernel's tracker has it (protocols
    // it does not track are not looked up there), its classes.
    if let Some(a) = x.acl.filter(|a| a.kernel) {
        k.ct = if sluice_switch::conntrack::kernel_tracks(a.proto) { cts(a.ct) } else { abi::CTS_UNTRACKED };
        k.ct_flags = a.tcp_flags;
        k.ct_proto = a.proto;
        k.icmp_type = a.icmp_type;
        k.src_class = a.src;
        k.dst_class = a.dst;
        k.dport_class = a.dport;
    }
    Some(k)
}

/// The key's `CTS_*` of the core's connection state `s`.
fn cts(s: CtState) -> u8 {
    match s {
        CtState::Untracked => abi::CTS_UNTRACKED,
        CtState::New | CtState::Invalid => abi::CTS_MISS,
        CtState::Established => abi::CTS_ESTABLISHED,
        CtState::Reply => abi::CTS_REPLY,
    }
}

/// What the kernel's tracker found, as an upcall's tag or a lookup says it (`CTS_*`).
pub fn found(cts: u8) -> Found {
    match cts {
        abi::CTS_MISS => Found::Miss,
        abi::CTS_ESTABLISHED => Found::Original,
        abi::CTS_REPLY => Found::Reply,
        _ => Found::Untracked,
    }
}

/// The program's index of drop cause `c` (its position in [`DropCause::ALL`]).
pub fn cause(c: DropCause) -> u8 {
    DropCause::ALL.iter().position(|&a| a == c).unwrap_or(abi::d::UNKNOWN_PORT) as u8
}

/// Stage 2's verdict: the core's verdict `v` on a frame with key `key`, made in
/// `generation`, with each output's port placed by `places` (a tunnel's VNI by
/// `tunnels`); `teaches`: the core learns from frames with this key
/// ([`sluice_switch::Switch::admits`]). A verdict the program cannot execute as the core
/// would — more than [`abi::MAX_OUTPUTS`] outputs, an output the kernel does not reach, or
/// one security groups made on a connection the kernel does not track (ICMP echo) — goes
/// up.
pub fn verdict(
    key: &Key,
    v: &Verdict,
    generation: u64,
    teaches: bool,
    places: impl Fn(PortId) -> Option<Place>,
    tunnels: impl Fn(PortId, Option<u16>) -> Option<TunnelOut>,
) -> abi::Verdict {
    let mut e = abi::Verdict { generation, ..abi::Verdict::default() };
    if v.pass_to_host {
        e.flags |= abi::V_HOST;
    }
    if teaches {
        e.flags |= abi::V_TEACHES;
    }
    // (A kernel that does not classify frames or track connections: every frame security
    // groups decide goes through the core.)
    let core_tracks = |a: &sluice_switch::acl::AclExtras| {
        !a.kernel || (a.ct != CtState::Untracked && !sluice_switch::conntrack::kernel_tracks(a.proto))
    };
    if v.acl.consulted && key.extras.acl.as_ref().is_some_and(core_tracks) {
        // Decided by a connection the core tracks (ICMP echo): such frames go through it.
        return up(e);
    }
    if v.acl.commit {
        e.ct = abi::CT_COMMIT;
    }
    if !v.acl.hits.is_empty() {
        e.flags |= abi::V_HITS;
    }
    match v.action {
        Action::Up(_) => {
            e.action = abi::ACT_UP;
            return e;
        }
        Action::Drop(c) => {
            e.action = abi::ACT_DROP;
            e.cause = cause(c);
        }
        Action::Forward => e.action = abi::ACT_FORWARD,
    }
    if v.learn_refused {
        e.flags |= abi::V_LEARN_REFUSED;
    }
    if v.meter_in {
        e.flags |= abi::V_METER_IN;
    }
    e.flags |= match v.storm {
        Some(sluice_switch::Storm::Broadcast) => abi::V_STORM_BC,
        Some(sluice_switch::Storm::Multicast) => abi::V_STORM_MC,
        None => 0,
    };
    if v.action != Action::Forward {
        return e;
    }
    if v.outputs.len() > abi::MAX_OUTPUTS {
        return up(e);
    }
    let tunnel = |p: PortId| places(p).and_then(|p| p.device).is_some_and(|d| d.reach == Reach::Tunnel);
    let Some(order) = output_order(v, tunnel) else { return up(e) };
    for (o, out) in order.iter().map(|&i| &v.outputs[i]).zip(e.outputs.iter_mut()) {
        let Some((place, dev)) = places(o.port).and_then(|p| Some((p, p.device?))) else { return up(e) };
        let (kind, marked) = match dev.reach {
            // A paced copy (the port's `rate_out`) leaves through the device's egress, where
            // the daemon's qdisc shapes it: bpf_redirect_peer passes no qdisc.
            Reach::Guest if o.paced => (abi::OUT_EGRESS, true),
            Reach::Guest => (abi::OUT_PEER, true),
            Reach::Veth => (abi::OUT_EGRESS, true),
            Reach::Uplink => (abi::OUT_EGRESS, false),
            Reach::Tunnel => (abi::OUT_TUNNEL, false),
        };
        *out = abi::Output { ifindex: dev.ifindex, slot: place.slot, mtu: o.mtu, kind, ..abi::Output::default() };
        let mut tag = o.tag;
        if dev.reach == Reach::Tunnel {
            let Some(t) = tunnels(o.port, o.tag).filter(|_| !o.mirror && v.next_hop.is_none()) else {
                return up(e);
            };
            out.vni = t.vni;
            // (A flood's copy goes where the port would send it: the station's endpoint
            // if the remote table has it, else every endpoint of the flood set.)
            out.flags |= if v.flood { abi::OF_FLOOD_EPS } else { abi::OF_REMOTE_DST };
            tag = tag.filter(|_| t.tagged);
        }
        if let Some(vid) = tag {
            out.flags |= abi::OF_TAG;
            out.vid = vid;
        }
        if o.mirror {
            out.flags |= abi::OF_MIRROR;
        }
        if marked {
            out.flags |= abi::OF_MARK;
        }
        if let Some(m) = o.src_mac {
            out.flags |= abi::OF_SRC_MAC;
            out.src_mac = m.0;
        }
    }
    e.n_out = v.outputs.len() as u8;
    if v.flood {
        e.flags |= abi::V_FLOOD;
    }
    match v.next_hop {
        None => {}
        Some(NextHop::Mac(m)) => {
            e.next_hop = abi::NH_MAC;
            e.next_mac = m.0;
        }
        Some(NextHop::Neighbour) => e.next_hop = abi::NH_NEIGH,
    }
    e
}

/// The order the kernel executes verdict `v`'s outputs in (indexes into `v.outputs`): the
/// core's, but a flood's copy into a tunnel (`tunnel` says which ports are tunnels; not a
/// mirror's copy) last — the executor sends its copies to each endpoint from a loop of its
/// own once the other outputs have theirs. `None` when a flood goes into more than one
/// tunnel: the core sends it.
pub fn output_order(v: &Verdict, tunnel: impl Fn(PortId) -> bool) -> Option<Vec<usize>> {
    let fanned = |o: &sluice_switch::Output| v.flood && !o.mirror && v.next_hop.is_none() && tunnel(o.port);
    let (mut order, last): (Vec<usize>, Vec<usize>) = (0..v.outputs.len()).partition(|&i| !fanned(&v.outputs[i]));
    if last.len() > 1 {
        return None;
    }
    order.extend(last);
    Some(order)
}

/// A verdict the core is to execute itself: up, the host's copy kept. (`learn_refused` is
/// the core's to count when it takes the frame.)
fn up(e: abi::Verdict) -> abi::Verdict {
    abi::Verdict {
        generation: e.generation,
        action: abi::ACT_UP,
        flags: e.flags & (abi::V_HOST | abi::V_TEACHES),
        ..abi::Verdict::default()
    }
}

/// Layer 2: station table entry `m` (the core's [`FastMac`]) as `sluice_fib` holds it;
/// `None` when its port has no place (the entry is to go: frames to it go up).
pub fn station(m: &FastMac, places: impl Fn(PortId) -> Option<Place>) -> Option<abi::FibVal> {
    Some(abi::FibVal {
        slot: u32::from(places(m.port)?.slot),
        flags: if m.is_static { abi::FIB_STATIC } else { 0 },
        seen_ns: 0,
    })
}

/// Port `p`'s meters in `sluice_meters`, as (kind, meter): its storm control's broadcast
/// and multicast rates and its `rate_in` (a meter of `unit_ps` 0 lets everything pass).
pub fn meters(p: &FastPort) -> [(u32, abi::Meter); 3] {
    let [bc, mc] = p.storm.meters();
    let rate_in = p.rate.meter(p.rate.rate_in);
    let m = |m: sluice_switch::meter::Meter| abi::Meter { unit_ps: m.unit_ps, burst_ns: m.burst_ns, tat: 0 };
    [(abi::METER_STORM_BC, m(bc)), (abi::METER_STORM_MC, m(mc)), (abi::METER_RATE_IN, m(rate_in))]
}

/// Port `p`'s lock in `sluice_locks`, in slot `slot`: its `mac` setting, if it has one.
pub fn lock(p: &FastPort, slot: u16) -> Option<(abi::LockKey, u32)> {
    p.mac.map(|m| (abi::LockKey { mac: m.0, pad: [0; 2] }, u32::from(slot)))
}

/// The executor's settings: verdicts of `generation` are current; misses go up through
/// interface `upcall_ifindex` (0: none, they are dropped as `upcall_lost`), each input
/// within `budget`.
pub fn config(generation: u64, upcall_ifindex: u32, budget: crate::exec::UpcallBudget) -> abi::ExecConfig {
    abi::ExecConfig {
        generation,
        upcall_ifindex,
        upcall_rate: budget.rate,
        upcall_burst: budget.burst,
        ..abi::ExecConfig::default()
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use sluice_switch::{Extras, L3Extras, NdFacts, Output, Upcall};

    use super::*;
    use sluice_switch::acl::AclExtras;

    const A: MacAddr = MacAddr([2, 0, 0, 0, 0, 0xa]);
    const DEV: MacAddr = MacAddr([2, 0, 0, 0, 0, 0xd]);
    const ROUTER: MacAddr = MacAddr([2, 0, 0, 0, 0, 0xee]);

    fn port() -> FastPort {
        FastPort {
            target: Some(7),
            uplink: false,
            mac: None,
            checks_ips: false,
            slow: false,
            failed: false,
            dev_mac: None,
            guest_mac: None,
            storm: sluice_switch::StormControl::default(),
            rate: sluice_switch::RateLimit::default(),
            snoops: false,
            acl: false,
            routed: false,
            suppressed: false,
        }
    }

    fn uplink() -> FastPort {
        FastPort { uplink: true, dev_mac: Some(DEV), ..port() }
    }

    /// Ports 0 to 19 in slots 100 + the port, each a guest's veth 200 + the port; port 9
    /// in user space.
    fn places(p: PortId) -> Option<Place> {
        let device = (p != 9).then_some(Device { ifindex: 200 + p, reach: Reach::Guest });
        (p < 20).then_some(Place { slot: 100 + p as u16, device })
    }

    fn no_tunnels(_: PortId, _: Option<u16>) -> Option<TunnelOut> {
        None
    }

    fn key(port: PortId, dst: Dest) -> Key {
        Key {
            port,
            tag: None,
            ethertype: 0x0800,
            src: Station::Here,
            dst,
            extras: Extras::default(),
            tunnel: None,
            group: Default::default(),
            suppress: false,
        }
    }

    fn out(port: PortId, tag: Option<u16>) -> Output {
        Output { port, tag, mtu: 1500, mirror: false, src_mac: None, paced: false }
    }

    fn forward(outputs: Vec<Output>) -> Verdict {
        Verdict { action: Action::Forward, outputs, ..Verdict::default() }
    }

    #[test]
    fn an_uplinks_own_address_is_the_hosts_in_layer_2_and_the_switchs_in_layer_3() {
        let l2 = input(&uplink(), 3, Mode::L2, ROUTER);
        assert_eq!((l2.slot, l2.flags, l2.own_mac), (3, abi::IN_OWN_MAC | abi::IN_HOST, DEV.0));
        let l3 = input(&FastPort { dev_mac: None, ..uplink() }, 3, Mode::L3, ROUTER);
        assert_eq!((l3.flags, l3.own_mac), (abi::IN_OWN_MAC, ROUTER.0));
        let unknown = input(&port(), 4, Mode::L3, ROUTER);
        assert_eq!((unknown.slot, unknown.flags), (4, 0), "a guest not heard from yet");
        let guest = input(&FastPort { guest_mac: Some(A), ..port() }, 4, Mode::L3, ROUTER);
        assert_eq!((guest.flags, guest.guest_mac), (abi::IN_GUEST, A.0));
        let lan = input(&FastPort { guest_mac: Some(A), ..uplink() }, 3, Mode::L3, ROUTER);
        assert_eq!(lan.flags, abi::IN_OWN_MAC | abi::IN_GUEST, "an uplink locked to its `mac`");
        let l2 = input(&FastPort { guest_mac: Some(A), ..port() }, 4, Mode::L2, ROUTER);
        assert_eq!(l2.flags, 0, "Layer 2 answers sources from the station table");
        let bare = input(&FastPort { dev_mac: None, ..uplink() }, 3, Mode::L2, ROUTER);
        assert_eq!(bare.flags, 0, "no address of its own: nothing is the host's");
    }

    #[test]
    fn a_snooping_switch_reads_the_group_class_and_its_sets_are_not_classes() {
        let p = FastPort { snoops: true, ..port() };
        assert_eq!(mask(&p, Mode::L2) & abi::X_GROUP, abi::X_GROUP);
        assert_eq!(mask(&p, Mode::L3) & abi::X_GROUP, 0, "Layer 3 floods groups");
        assert_eq!(sluice_switch::mdb::FIRST_SET, abi::GCLASS_FIRST_SET);
        let places = |p: PortId| Some(Place { slot: p as u16 + 100, device: None });
        for (class, want) in [
            (GroupClass::Flooded, abi::GCLASS_FLOODED),
            (GroupClass::Control, abi::GCLASS_CONTROL),
            (GroupClass::Unregistered, abi::GCLASS_UNREGISTERED),
            (GroupClass::Set(40), 40),
        ] {
            let k = Key { group: class, ..key(2, Dest::Group) };
            assert_eq!(flow_key(&k, 1, places).unwrap().group, want.to_ne_bytes());
        }
    }

    #[test]
    fn the_mask_asks_what_the_cores_key_reader_reads() {
        let mac = FastPort { mac: Some(A), ..port() };
        let ips = FastPort { checks_ips: true, ..port() };
        assert_eq!(mask(&port(), Mode::L2), abi::X_LOCKS | abi::X_DST_STATION);
        let evpn = FastPort { routed: true, ..port() };
        assert_eq!(mask(&evpn, Mode::L2), abi::X_LOCKS | abi::X_DST_STATION | abi::X_ROUTED, "sources from routes");
        let local = FastPort { suppressed: true, ..port() };
        assert_eq!(mask(&local, Mode::L2), abi::X_LOCKS | abi::X_DST_STATION | abi::X_ND, "resolution the core reads");
        assert_eq!(mask(&mac, Mode::L2), abi::X_SRC_MAC | abi::X_DST_STATION);
        assert_eq!(mask(&ips, Mode::L3), abi::X_LOCKS | abi::X_SRC_IP | abi::X_L3 | abi::X_GUEST);
        let lan = FastPort { checks_ips: true, ..uplink() };
        assert_eq!(mask(&lan, Mode::L3), abi::X_L3 | abi::X_GUEST, "the LAN's sources are not checked");
        assert_eq!(mask(&lan, Mode::L2), abi::X_LOCKS | abi::X_SRC_IP | abi::X_DST_STATION);
    }

    #[test]
    fn stage_1_is_the_tag_and_the_destinations_class() {
        let k = Key { tag: Some(0x0abc), ..key(2, Dest::Station(4)) };
        let a = admit_key(&k, 102);
        assert_eq!(
            (a.slot, a.tag, a.vid, a.dst, a.vni, a.endpoint),
            (102, abi::TAG_8021Q, 0xabc, abi::DST_UNKNOWN, 0, 0)
        );
        let a = admit_key(&key(2, Dest::Own), 102);
        assert_eq!((a.tag, a.vid, a.dst), (abi::TAG_NONE, 0, abi::DST_OWN));
        assert_eq!(admit_key(&Key { tag: Some(0), ..key(2, Dest::Group) }, 1).dst, abi::DST_GROUP);
        assert_eq!(admit_key(&key(2, Dest::LinkLocal(0x0e)), 1).dst, abi::DST_LINK_LOCAL);
        let f = flow_key(&key(2, Dest::LinkLocal(0x0e)), 1, places).unwrap();
        assert_eq!((f.dst, f.dst_slot), (abi::DST_LINK_LOCAL, 0x0e), "the last byte rides in dst_slot");
    }

    #[test]
    fn stage_1_admits_drops_or_leaves_the_frame_to_the_host() {
        let p = port();
        let fwd = forward(vec![out(1, None)]);
        let a = admit(&fwd, Ok(10), &p, Mode::L2, 9);
        assert_eq!((a.generation, a.action, a.vlan, a.mask), (9, abi::ACT_FORWARD, 10, mask(&p, Mode::L2)));
        let a = admit(&fwd, Ok(20), &p, Mode::L2, 9);
        assert_eq!((a.action, a.vlan), (abi::ACT_FORWARD, 20));
        let dropped = Verdict { action: Action::Drop(DropCause::VlanFilter), ..Verdict::default() };
        let a = admit(&dropped, Err(DropCause::VlanFilter), &p, Mode::L2, 9);
        assert_eq!((a.action, a.cause, a.flags), (abi::ACT_DROP, abi::d::VLAN_FILTER as u8, 0));
        let stranger = Verdict { action: Action::Drop(DropCause::UnknownEndpoint), ..Verdict::default() };
        let a = admit(&stranger, Err(DropCause::UnknownEndpoint), &p, Mode::L2, 9);
        assert_eq!((a.action, a.cause), (abi::ACT_DROP, abi::d::UNKNOWN_ENDPOINT as u8));
        let hosts = Verdict { pass_to_host: true, ..dropped };
        let a = admit(&hosts, Err(DropCause::VlanFilter), &p, Mode::L2, 9);
        assert_eq!((a.action, a.flags), (abi::ACT_DROP, abi::V_HOST));
        let mine = Verdict { pass_to_host: true, ..forward(vec![]) };
        assert_eq!(admit(&mine, Ok(10), &uplink(), Mode::L2, 9).action, abi::ACT_HOST);
        let slow = FastPort { slow: true, ..port() };
        assert_eq!(admit(&fwd, Ok(10), &slow, Mode::L2, 9).action, abi::ACT_UP);
    }

    #[test]
    fn stage_2_holds_the_stations_and_only_the_extras_asked() {
        let k = key(2, Dest::Station(4));
        let f = flow_key(&k, 10, places).unwrap();
        let want = abi::FlowKey {
            slot: 102,
            vlan: 10,
            ethertype: 0x0800,
            src: abi::SRC_HERE,
            dst: abi::DST_STATION,
            dst_slot: 104,
            ..abi::FlowKey::default()
        };
        assert_eq!(f, want);
        for (s, want) in [
            (Station::Absent, abi::SRC_ABSENT),
            (Station::Elsewhere, abi::SRC_ELSEWHERE),
            (Station::Static, abi::SRC_STATIC),
            (Station::Locked, abi::SRC_LOCKED),
            (Station::Unlearnable, abi::SRC_UNLEARNABLE),
        ] {
            assert_eq!(flow_key(&Key { src: s, ..k }, 10, places).unwrap().src, want);
        }
        let extras = Extras {
            src_mac: Some(A),
            src_ip: Some(Some(Ipv4Addr::new(10, 0, 0, 1).into())),
            l3: Some(L3Extras {
                readable: true,
                owner: Some(5),
                nd: NdFacts { proto: 58, icmp6_type: 135, hop255: true },
            }),
            acl: None,
            nd: None,
        };
        let f = flow_key(&Key { extras, dst: Dest::Own, ..k }, 10, places).unwrap();
        assert_eq!((f.dst, f.dst_slot, f.src_mac, f.claim), (abi::DST_OWN, 0, A.0, abi::CLAIM_V4));
        assert_eq!(&f.src_ip[..6], &[10, 0, 0, 1, 0, 0]);
        assert_eq!((f.l3, f.owner, f.proto, f.icmp6_type), (abi::L3X_READABLE | abi::L3X_HOP255, 106, 58, 135));
        let nd = Extras { nd: Some(NdFacts { proto: 58, icmp6_type: 136, hop255: true }), ..Extras::default() };
        let f = flow_key(&Key { extras: nd, ..k }, 10, places).unwrap();
        assert_eq!((f.l3, f.proto, f.icmp6_type), (abi::L3X_HOP255, 58, 136), "EVPN's suppression: the facts alone");
        let short = Extras { src_ip: Some(None), ..Extras::default() };
        let f = flow_key(&Key { extras: short, ..k }, 10, places).unwrap();
        assert_eq!((f.claim, f.src_ip), (abi::CLAIM_SHORT, [0; 16]));
        let v6 = Extras { src_ip: Some(Some("fd00::1".parse().unwrap())), ..Extras::default() };
        assert_eq!(flow_key(&Key { extras: v6, ..k }, 10, places).unwrap().claim, abi::CLAIM_V6);
        assert_eq!(flow_key(&key(2, Dest::Station(40)), 10, places), None, "a port with no place");
    }

    #[test]
    fn a_forward_names_each_outputs_device_tag_and_source() {
        let mut v = forward(vec![
            out(1, Some(20)),
            Output { src_mac: Some(ROUTER), mtu: 9000, ..out(2, None) },
            Output { mirror: true, ..out(3, None) },
        ]);
        v.flood = true;
        v.learn_refused = true;
        let e = verdict(
            &Key::default(),
            &v,
            7,
            true,
            |p| {
                let reach = [Reach::Guest, Reach::Veth, Reach::Uplink][p as usize % 3];
                Some(Place { slot: p as u16 + 50, device: Some(Device { ifindex: 300 + p, reach }) })
            },
            no_tunnels,
        );
        assert_eq!((e.generation, e.action, e.n_out, e.next_hop), (7, abi::ACT_FORWARD, 3, abi::NH_NONE));
        assert_eq!(e.flags, abi::V_FLOOD | abi::V_LEARN_REFUSED | abi::V_TEACHES);
        let o = e.outputs;
        assert_eq!(
            (o[0].ifindex, o[0].slot, o[0].kind, o[0].flags, o[0].vid),
            (301, 51, abi::OUT_EGRESS, abi::OF_TAG | abi::OF_MARK, 20)
        );
        assert_eq!((o[1].kind, o[1].flags, o[1].src_mac, o[1].mtu), (abi::OUT_EGRESS, abi::OF_SRC_MAC, ROUTER.0, 9000));
        assert_eq!((o[2].kind, o[2].flags), (abi::OUT_PEER, abi::OF_MIRROR | abi::OF_MARK));
        assert_eq!(o[3], abi::Output::default());
    }

    #[test]
    fn a_paced_output_to_a_guest_leaves_by_its_egress_and_a_charged_verdict_says_so() {
        let mut v = forward(vec![Output { paced: true, ..out(3, None) }, out(6, None)]);
        v.meter_in = true;
        v.storm = Some(sluice_switch::Storm::Multicast);
        let guest =
            |p: PortId| Some(Place { slot: p as u16, device: Some(Device { ifindex: 300 + p, reach: Reach::Guest }) });
        let e = verdict(&Key::default(), &v, 7, false, guest, no_tunnels);
        assert_eq!(e.flags, abi::V_METER_IN | abi::V_STORM_MC);
        assert_eq!((e.outputs[0].kind, e.outputs[0].flags), (abi::OUT_EGRESS, abi::OF_MARK), "through the shaper");
        assert_eq!((e.outputs[1].kind, e.outputs[1].flags), (abi::OUT_PEER, abi::OF_MARK));
    }

    #[test]
    fn next_hops_drops_and_upcalls() {
        let routed = Verdict { next_hop: Some(NextHop::Mac(A)), ..forward(vec![out(1, None)]) };
        let e = verdict(&Key::default(), &routed, 1, false, places, no_tunnels);
        assert_eq!((e.next_hop, e.next_mac), (abi::NH_MAC, A.0));
        let lan = Verdict { next_hop: Some(NextHop::Neighbour), ..forward(vec![out(1, None)]) };
        assert_eq!(verdict(&Key::default(), &lan, 1, false, places, no_tunnels).next_hop, abi::NH_NEIGH);
        let dropped = Verdict {
            action: Action::Drop(DropCause::Isolated),
            learn_refused: true,
            pass_to_host: true,
            ..Verdict::default()
        };
        let e = verdict(&Key::default(), &dropped, 1, false, places, no_tunnels);
        assert_eq!(
            (e.action, e.cause, e.flags),
            (abi::ACT_DROP, abi::d::ISOLATED as u8, abi::V_LEARN_REFUSED | abi::V_HOST)
        );
        let neigh = Verdict { action: Action::Up(Upcall::Neigh), learn_refused: true, ..Verdict::default() };
        let e = verdict(&Key::default(), &neigh, 1, false, places, no_tunnels);
        assert_eq!((e.action, e.flags, e.n_out), (abi::ACT_UP, 0, 0));
    }

    #[test]
    fn what_the_kernel_cannot_send_goes_up() {
        let many = forward((0..17).map(|p| out(p % 8, None)).collect());
        assert_eq!(
            verdict(&Key::default(), &many, 1, false, places, no_tunnels).action,
            abi::ACT_UP,
            "more than 16 outputs"
        );
        let sixteen = forward((0..16).map(|p| out(p % 8, None)).collect());
        assert_eq!(verdict(&Key::default(), &sixteen, 1, false, places, no_tunnels).n_out, 16);
        // Security groups: up when the kernel neither classifies nor tracks, or for a
        // connection only the core tracks (ICMP echo); else the kernel commits.
        let mut acl = forward(vec![out(1, None)]);
        acl.acl.consulted = true;
        acl.acl.commit = true;
        let with = |a: AclExtras| Key {
            extras: sluice_switch::Extras { acl: Some(a), ..Default::default() },
            ..Key::default()
        };
        let tcp = AclExtras { ct: CtState::New, proto: 6, tcp_flags: 0x02, ..AclExtras::default() };
        let run = |k: &Key| verdict(k, &acl, 1, false, places, no_tunnels);
        assert_eq!(run(&with(tcp)).action, abi::ACT_UP, "a kernel that does not track");
        let e = run(&with(AclExtras { kernel: true, ..tcp }));
        assert_eq!((e.action, e.ct), (abi::ACT_FORWARD, abi::CT_COMMIT), "TCP: the kernel commits");
        let echo = AclExtras { kernel: true, ct: CtState::New, proto: 1, icmp_type: 8, ..AclExtras::default() };
        assert_eq!(run(&with(echo)).action, abi::ACT_UP, "ICMP echo: the core's");
        let unreachable = AclExtras { ct: CtState::Untracked, icmp_type: 3, ..echo };
        assert_eq!(run(&with(unreachable)).action, abi::ACT_FORWARD, "no connection: the classes decide");
        // The key as the kernel reads it: a miss with its flags; ICMP never looked up.
        let fk = |a: AclExtras| flow_key(&with(a), 1, places).unwrap();
        let k = fk(AclExtras { kernel: true, ct: CtState::Invalid, tcp_flags: 0x10, src: 3, dst: 4, dport: 5, ..tcp });
        assert_eq!(
            (k.ct, k.ct_flags, k.ct_proto, k.src_class, k.dst_class, k.dport_class),
            (abi::CTS_MISS, 0x10, 6, 3, 4, 5)
        );
        assert_eq!((fk(echo).ct, fk(echo).ct_proto, fk(echo).icmp_type), (abi::CTS_UNTRACKED, 1, 8));
        assert_eq!(fk(AclExtras { ct: CtState::Reply, ..tcp }).ct_proto, 0, "not classified by the kernel: nothing");
        assert_eq!(fk(AclExtras { kernel: true, ct: CtState::Reply, ..tcp }).ct, abi::CTS_REPLY);
        let user = Verdict { pass_to_host: true, flood: true, ..forward(vec![out(1, None), out(9, None)]) };
        let e = verdict(&Key::default(), &user, 1, false, places, no_tunnels);
        assert_eq!((e.action, e.flags, e.n_out), (abi::ACT_UP, abi::V_HOST, 0), "a port in user space");
        assert_eq!(
            verdict(&Key::default(), &forward(vec![out(40, None)]), 1, false, places, no_tunnels).action,
            abi::ACT_UP,
            "no place"
        );
    }

    #[test]
    fn a_tunnel_output_goes_to_where_its_destination_was_heard() {
        let places5 = |p: PortId| {
            let reach = if p == 5 { Reach::Tunnel } else { Reach::Guest };
            Some(Place { slot: p as u16 + 50, device: Some(Device { ifindex: 300 + p, reach }) })
        };
        let per_vlan = |p: PortId, tag: Option<u16>| {
            (p == 5).then_some(())?;
            Some(TunnelOut { vni: 1000 + u32::from(tag?), tagged: false })
        };
        let e = verdict(&Key::default(), &forward(vec![out(5, Some(20))]), 3, false, places5, per_vlan);
        let o = e.outputs[0];
        assert_eq!(
            (o.kind, o.flags, o.vni, o.ifindex),
            (abi::OUT_TUNNEL, abi::OF_REMOTE_DST, 1020, 305),
            "untagged, the VLAN in the VNI"
        );
        let single = |_: PortId, _: Option<u16>| Some(TunnelOut { vni: 7, tagged: true });
        let o = verdict(&Key::default(), &forward(vec![out(5, Some(20))]), 3, false, places5, single).outputs[0];
        assert_eq!((o.flags, o.vid, o.vni), (abi::OF_REMOTE_DST | abi::OF_TAG, 20, 7), "a trunk's tag inside one VNI");
        let flood = Verdict { flood: true, ..forward(vec![out(1, None), out(5, Some(20))]) };
        let e = verdict(&Key::default(), &flood, 3, false, places5, single);
        assert_eq!(
            (e.action, e.n_out, e.outputs[1].flags, e.outputs[1].vni),
            (abi::ACT_FORWARD, 2, abi::OF_FLOOD_EPS | abi::OF_TAG, 7),
            "a flood's copy goes to every endpoint of the flood set"
        );
        let first = Verdict { flood: true, ..forward(vec![out(5, Some(20)), out(1, None), out(2, None)]) };
        let e = verdict(&Key::default(), &first, 3, false, places5, single);
        assert_eq!(
            e.outputs[..3].iter().map(|o| o.ifindex).collect::<Vec<_>>(),
            [301, 302, 305],
            "the tunnel's copies last, the rest in the core's order"
        );
        let mirror = forward(vec![out(1, None), Output { mirror: true, ..out(5, None) }]);
        assert_eq!(verdict(&Key::default(), &mirror, 3, false, places5, single).action, abi::ACT_UP);
        assert_eq!(
            verdict(&Key::default(), &forward(vec![out(5, Some(30))]), 3, false, places5, |_, _| None).action,
            abi::ACT_UP,
            "no VNI"
        );
        let k = Key { tunnel: Some(sluice_switch::Tunneled { vni: 1020, endpoint: true }), ..key(5, Dest::Group) };
        let a = admit_key(&k, 55);
        assert_eq!((a.vni, a.endpoint, a.dst), (1020, 1, abi::DST_GROUP));
        let i = tunnel_input(input(&port(), 55, Mode::L2, ROUTER), true);
        assert_eq!(i.flags, abi::IN_TUNNEL | abi::IN_TUNNEL_V6);
        let eps: Vec<IpAddr> = vec!["192.0.2.1".parse().unwrap(), "fd00::2".parse().unwrap()];
        let f = flood_eps(&eps).expect("two endpoints");
        assert_eq!((f.n, f.addrs[0][..4].to_vec(), f.addrs[1][15], f.addrs[2]), (2, vec![192, 0, 2, 1], 2, [0; 16]));
        assert!(flood_eps(&[]).is_none(), "nowhere: the core's");
        assert!(flood_eps(&vec![eps[0]; abi::MAX_FLOOD_EPS + 1]).is_none(), "too many: the core's");
        let t = tunnel("fd00::1".parse().unwrap(), 64);
        assert_eq!((t.flags, t.ttl, t.local[15]), (abi::TUN_V6, 64, 1));
    }

    #[test]
    fn stations_locks_and_settings() {
        let m = FastMac { port: 3, is_static: true };
        assert_eq!(station(&m, places), Some(abi::FibVal { slot: 103, flags: abi::FIB_STATIC, seen_ns: 0 }));
        assert_eq!(station(&FastMac { port: 40, is_static: false }, places), None);
        assert_eq!(lock(&FastPort { mac: Some(A), ..port() }, 5), Some((abi::LockKey { mac: A.0, pad: [0; 2] }, 5)));
        assert_eq!(lock(&port(), 5), None);
        assert_eq!(
            config(5, 9, crate::exec::UpcallBudget { rate: 7, burst: 8 }),
            abi::ExecConfig {
                generation: 5,
                upcall_ifindex: 9,
                upcall_rate: 7,
                upcall_burst: 8,
                ..abi::ExecConfig::default()
            }
        );
    }

    #[test]
    fn drop_causes_keep_their_index() {
        for (i, c) in DropCause::ALL.iter().enumerate() {
            assert_eq!(usize::from(cause(*c)), i);
        }
    }
}

//! One decision per frame, and it is the one executed: for random switches (Layer 2 and
//! Layer 3; access, trunk and native VLANs; isolation, uplinks, MAC and IP locks, learned
//! addresses, mirrors, learning limits, MTUs, tunnels with one VNI or a VNI per VLAN,
//! open or not) and random frames (from a tunnel: of random VNIs, from its endpoint or a
//! stranger), the verdict the pipeline
//! executed on each frame is what `Switch::verdict` says afterwards for the frame's key
//! with the same tables — and what the switch did is what the verdict says: the input's
//! fate is its action, each output (mirrors included) is offered one copy and nothing
//! else is, each copy leaves with the tag its output was given.

mod common;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use common::*;
use proptest::prelude::*;
use sluice_switch::mem::{MemHandle, mem_port};
use sluice_switch::tunnel::{Origin, TunnelRules, VniMap};
use sluice_switch::{
    Action, DEFAULT_ROUTER_MAC, DropCause, Mode, PortConfig, PortCounters, PortPolicy, Station, Switch, SwitchConfig,
    Upcall, VlanMode,
};
use sluice_wire::MacAddr;
use sluice_wire::neigh::{self, NdFields};

const PORTS: usize = 5;

fn vlan_mode() -> impl Strategy<Value = VlanMode> {
    prop_oneof![
        4 => Just(VlanMode::Access(1)),
        2 => (1u16..4).prop_map(VlanMode::Access),
        2 => (prop::collection::vec(1u16..4, 0..3), prop::option::of(1u16..4))
            .prop_map(|(a, n)| VlanMode::Trunk { allowed: a.into_iter().collect(), native: n }),
    ]
}

fn v4(n: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 0, 0, n + 1)
}

fn v6(n: u8) -> Ipv6Addr {
    Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, u16::from(n) + 1)
}

fn ip(n: u8) -> IpAddr {
    if n < 4 { v4(n).into() } else { v6(n).into() }
}

#[derive(Clone, Debug)]
struct PortSpec {
    vlan: VlanMode,
    isolated: bool,
    uplink: bool,
    mac: Option<u8>,
    ips: Vec<u8>,
    learn_ips: bool,
    mirror_of: Option<usize>,
    small_mtu: bool,
    /// A tunnel: with a VNI per VLAN (VLANs 1 and 2 in VNIs 5001 and 5002; else all in
    /// VNI 5000), taking its endpoint's datagrams only.
    tunnel: Option<(bool, bool)>,
    /// An EtherType the port drops.
    drops: Option<u16>,
}

fn port_spec() -> impl Strategy<Value = PortSpec> {
    (
        vlan_mode(),
        prop::bool::weighted(0.3),
        prop::bool::weighted(0.2),
        prop::option::weighted(0.2, 1u8..6),
        prop::option::weighted(0.3, prop::collection::vec(0u8..8, 0..3)).prop_map(Option::unwrap_or_default),
        prop::bool::weighted(0.2),
        prop::option::weighted(0.15, 0..PORTS),
        prop::bool::weighted(0.1),
        prop::option::weighted(0.25, (any::<bool>(), prop::bool::weighted(0.7))),
        prop::option::weighted(0.15, prop::sample::select(vec![0x0800u16, 0x86dd, 0x0806, 0x88b5])),
    )
        .prop_map(|(vlan, isolated, uplink, mac, ips, learn_ips, mirror_of, small_mtu, tunnel, drops)| PortSpec {
            vlan,
            isolated,
            uplink,
            mac,
            ips,
            learn_ips,
            mirror_of,
            small_mtu,
            tunnel,
            drops,
        })
}

/// The VNIs a frame from a tunnel may come in (5003 none carries).
const VNIS: [u32; 4] = [5000, 5001, 5002, 5003];

fn endpoint(stranger: bool) -> IpAddr {
    if stranger { "192.0.2.66".parse().unwrap() } else { "192.0.2.1".parse().unwrap() }
}

#[derive(Clone, Debug)]
struct Frame {
    from: usize,
    dst: u8,
    src: u8,
    tci: Option<u16>,
    kind: u8,
    sip: u8,
    dip: u8,
    /// From a tunnel: which of [`VNIS`], and whether from a stranger.
    vni: usize,
    stranger: bool,
}

fn frame() -> impl Strategy<Value = Frame> {
    // Mostly each station behind its own port (1 behind p0, …) sending from its own
    // address (10.0.0.1 from p0, …), so that much of the traffic is learned and forwarded;
    // the rest mixes everything.
    let dst = prop_oneof![4 => 1u8..6, 1 => 0u8..8];
    let sip = prop::option::weighted(0.3, 0u8..8);
    let origin = (0..VNIS.len(), prop::bool::weighted(0.2));
    (0..PORTS, dst, prop::option::weighted(0.2, 1u8..6), prop::option::weighted(0.15, 0u16..5), 0u8..6, sip, 0u8..8)
        .prop_flat_map(move |f| (Just(f), origin.clone()))
        .prop_map(|((from, dst, src, tci, kind, sip, dip), (vni, stranger))| Frame {
            from,
            dst,
            src: src.unwrap_or(from as u8 + 1),
            tci,
            kind,
            sip: sip.unwrap_or(from as u8),
            dip,
            vni,
            stranger,
        })
}

fn station(n: u8) -> MacAddr {
    match n {
        0 => MacAddr::BROADCAST,
        6 => MacAddr([0x01, 0, 0x5e, 0, 0, 1]),
        7 => DEFAULT_ROUTER_MAC,
        n => MacAddr(mac(n)),
    }
}

/// A frame's bytes: IPv4 or IPv6 over UDP, an ARP request, a neighbour solicitation, a
/// frame that is not IP, or an IPv4 header cut short.
fn build(f: &Frame) -> Vec<u8> {
    let (dst, src) = (station(f.dst), station(f.src));
    let bytes = match f.kind {
        0 => {
            let mut b = eth(dst.0, src.0, 0x0800, 0);
            b.extend_from_slice(&[0x45, 0, 0, 48, 0, 0, 0x40, 0, 64, 17, 0, 0]);
            b.extend_from_slice(&v4(f.sip).octets());
            b.extend_from_slice(&v4(f.dip).octets());
            b.extend_from_slice(&[0u8; 28]);
            b
        }
        1 => {
            let mut b = eth(dst.0, src.0, 0x86dd, 0);
            b.extend_from_slice(&[0x60, 0, 0, 0, 0, 8, 17, 64]);
            b.extend_from_slice(&v6(f.sip).octets());
            b.extend_from_slice(&v6(f.dip).octets());
            b.extend_from_slice(&[0u8; 8]);
            b
        }
        2 => {
            let mut b = vec![0u8; 64];
            let n = neigh::write_arp(&mut b, 1, dst, src, v4(f.sip), MacAddr::default(), v4(f.dip)).unwrap();
            b.truncate(n);
            b
        }
        3 => {
            let m = NdFields {
                advert: false,
                solicited: false,
                src: v6(f.sip),
                dst: v6(f.dip),
                target: v6(f.dip),
                lla: src,
            };
            let mut b = vec![0u8; 128];
            let n = neigh::write_nd(&mut b, dst, src, &m).unwrap();
            b.truncate(n);
            b
        }
        4 => eth(dst.0, src.0, 0x88b5, 30),
        _ => eth(dst.0, src.0, 0x0800, 10),
    };
    match f.tci {
        Some(t) => tag(&bytes, t),
        None => bytes,
    }
}

fn switch_with(mode: Mode, specs: &[PortSpec], port_mac_limit: usize) -> (Switch, Vec<MemHandle>) {
    let mut sw = Switch::new(SwitchConfig { mode, port_mac_limit, fib_max: 12, ..cfg() }).unwrap();
    let mut handles = Vec::new();
    let mut mirrored = Vec::new();
    let mut owned = Vec::new();
    for (i, p) in specs.iter().enumerate() {
        let (port, h) = mem_port(OFFLOAD);
        if p.uplink {
            h.set_mac(Some(MacAddr([2, 0xee, 0, 0, 0, i as u8])));
        }
        let mut ips: Vec<IpAddr> = p.ips.iter().map(|&n| ip(n)).collect();
        ips.sort();
        ips.dedup();
        // An address belongs to one port in Layer 3 mode.
        if mode == Mode::L3 {
            ips.retain(|a| !owned.contains(a));
            owned.extend(ips.iter().copied());
        }
        // A port has at most one mirror, and none of itself.
        let mirror_of = match p.mirror_of {
            Some(w) if w != i && !mirrored.contains(&w) => {
                mirrored.push(w);
                vec![format!("p{w}")]
            }
            _ => vec![],
        };
        let policy = PortPolicy {
            uplink: p.uplink,
            isolated: p.isolated,
            mac: p.mac.map(|m| MacAddr(mac(m))),
            ips,
            learn_ips: p.learn_ips,
            mirror_of,
            drop_ethertypes: p.drops.into_iter().collect(),
            forward_link_local: 0,
            storm: Default::default(),
            rate: Default::default(),
            mcast_router: Default::default(),
        };
        let mtu = p.small_mtu.then_some(100);
        if let Some((per_vlan, remotes_only)) = p.tunnel {
            let vnis = if per_vlan { VniMap::PerVlan(vec![(1, 5001), (2, 5002)]) } else { VniMap::Single(5000) };
            h.set_tunnel(TunnelRules {
                vnis,
                remotes_only,
                remotes: vec![endpoint(false)],
                evpn: false,
                announced: vec![],
            });
        }
        sw.add_port(PortConfig { name: format!("p{i}"), vlan: p.vlan.clone(), mtu, policy }, Box::new(port)).unwrap();
        handles.push(h);
    }
    (sw, handles)
}

/// The 802.1Q VLAN id a sent frame carries, if any.
fn out_vid(out: &[u8]) -> Option<u16> {
    (u16::from_be_bytes([out[12], out[13]]) == 0x8100).then(|| u16::from_be_bytes([out[14], out[15]]) & 0xfff)
}

fn counters(sw: &Switch) -> Vec<PortCounters> {
    sw.ports().into_iter().map(|p| p.counters).collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn the_verdict_executed_is_the_one_the_core_gives_for_the_key(
        l3 in prop::bool::weighted(0.35),
        specs in prop::collection::vec(port_spec(), PORTS),
        frames in prop::collection::vec(frame(), 1..60),
        limit in prop_oneof![2 => Just(1024usize), 1 => 0usize..3],
    ) {
        let mode = if l3 { Mode::L3 } else { Mode::L2 };
        let (mut sw, handles) = switch_with(mode, &specs, limit);
        for (t, f) in frames.iter().enumerate() {
            let before = counters(&sw);
            let waiting = |sw: &Switch| sw.port_info(f.from as u32).map_or(0, |p| p.resolving);
            let resolving = waiting(&sw);
            let h = &handles[f.from];
            if specs[f.from].tunnel.is_some() {
                h.inject_from(Origin { vni: VNIS[f.vni], sender: endpoint(f.stranger) }, &build(f));
                while sw.on_readable(f.from as u32, t as u64) {}
            } else {
                send(&mut sw, f.from as u32, h, &build(f), t as u64);
            }
            let after = counters(&sw);
            let Some((key, v)) = sw.last_decision() else {
                // Not valid: dropped before it had a key.
                prop_assert_eq!(after[f.from].rx_drops.malformed, before[f.from].rx_drops.malformed + 1);
                continue;
            };
            let (key, v) = (*key, v.clone());
            prop_assert_eq!(key.port, f.from as u32);
            prop_assert_eq!(&sw.verdict(&key), &v, "frame {:?}, key {:?}", f, key);
            // A tunnel learns where a station is only from a frame the core kept it for.
            let remotes = handles[f.from].take_remotes();
            let refused = matches!(
                v.action,
                Action::Drop(DropCause::UnknownEndpoint | DropCause::SpoofedMac | DropCause::SpoofedIp)
            );
            prop_assert!(
                remotes.is_empty() || (matches!(key.src, Station::Here | Station::Unlearnable) && !refused),
                "frame {:?}: {:?} learned, {:?}", f, remotes, v
            );
            prop_assert_eq!(key.tunnel.is_some(), specs[f.from].tunnel.is_some());
            let (b, a) = (&before[f.from], &after[f.from]);
            prop_assert_eq!(a.learn_refused - b.learn_refused, u64::from(v.learn_refused), "frame {:?}", f);
            match v.action {
                Action::Drop(cause) => {
                    prop_assert_eq!(a.rx_drops.get(cause) - b.rx_drops.get(cause), 1, "frame {:?}: {:?}", f, v);
                }
                Action::Up(Upcall::Neigh) => prop_assert_eq!(a.consumed - b.consumed, 1, "frame {:?}", f),
                Action::Up(why) => {
                    let parked = waiting(&sw) > resolving || a.rx_drops.unresolved > b.rx_drops.unresolved;
                    prop_assert!(matches!(why, Upcall::Resolve(_)) && parked, "frame {:?}: {:?} not executed", f, v);
                }
                Action::Forward if v.outputs.is_empty() => prop_assert_eq!(a.consumed - b.consumed, 1),
                Action::Forward => {
                    let moved = (a.forwarded + a.flooded) - (b.forwarded + b.flooded);
                    let parked = waiting(&sw) > resolving || a.rx_drops.unresolved > b.rx_drops.unresolved;
                    prop_assert!(moved == 1 || (v.next_hop.is_some() && parked), "frame {:?}: {:?}", f, v);
                    prop_assert_eq!(a.flooded - b.flooded, u64::from(v.flood && moved == 1));
                }
            }
            // What each port was offered: its copy, if the verdict named it, and what the
            // switch wrote itself (Layer 3: answers, requests). Layer 3 may also release
            // frames that waited for the guest this frame taught (not checked there).
            let placed = v.action == Action::Forward && (a.forwarded + a.flooded) > (b.forwarded + b.flooded);
            for (i, h) in handles.iter().enumerate() {
                let sent = h.take_sent();
                let named = v.outputs.iter().find(|o| o.port == i as u32).filter(|_| placed);
                let offered = after[i].tx_offered - before[i].tx_offered;
                let generated = after[i].generated - before[i].generated;
                if mode == Mode::L2 {
                    prop_assert_eq!(offered, u64::from(named.is_some()) + generated, "frame {:?}: p{}, {:?}", f, i, v);
                }
                if let Some(o) = named
                    && after[i].tx_frames > before[i].tx_frames
                    && generated == 0
                    && mode == Mode::L2
                {
                    prop_assert_eq!(sent.len(), 1);
                    prop_assert_eq!(out_vid(&sent[0].1), o.tag, "frame {:?}: the tag to p{}", f, i);
                }
            }
        }
        assert_conserved(&sw);
    }
}

#[test]
fn learning_a_station_does_not_move_the_generation_and_a_rule_change_does() {
    let mut sw = Switch::new(cfg()).unwrap();
    let a = add(&mut sw, "a", access(1), None, OFFLOAD);
    let b = add(&mut sw, "b", access(1), None, OFFLOAD);
    let g = sw.generation();
    send(&mut sw, a.0, &a.1, &eth(BCAST, mac(1), 0x0800, 50), 0);
    send(&mut sw, b.0, &b.1, &eth(mac(1), mac(2), 0x0800, 50), 1);
    // A station moves from a to b, and ages out.
    send(&mut sw, b.0, &b.1, &eth(BCAST, mac(1), 0x0800, 50), 2);
    sw.expire(10_000_000);
    assert_eq!(sw.generation(), g, "stations are answers in a key, not part of a verdict");
    add(&mut sw, "c", access(1), None, OFFLOAD);
    assert!(sw.generation() > g, "a port attached changes verdicts");
}

#[test]
fn a_port_reaching_its_learning_limit_moves_the_generation() {
    let mut sw = Switch::new(SwitchConfig { port_mac_limit: 2, ..cfg() }).unwrap();
    let a = add(&mut sw, "a", access(1), None, OFFLOAD);
    add(&mut sw, "b", access(1), None, OFFLOAD);
    let g = sw.generation();
    send(&mut sw, a.0, &a.1, &eth(BCAST, mac(1), 0x0800, 50), 0);
    assert_eq!(sw.generation(), g);
    send(&mut sw, a.0, &a.1, &eth(BCAST, mac(2), 0x0800, 50), 0);
    let full = sw.generation();
    assert!(full > g, "a reached its limit");
    send(&mut sw, a.0, &a.1, &eth(BCAST, mac(3), 0x0800, 50), 0);
    assert_eq!(sw.generation(), full, "a refusal changes nothing");
    sw.expire(10_000_000);
    assert!(sw.generation() > full, "a left its limit");
}

#[test]
fn learning_settings_changed_live_take_effect_and_move_the_generation() {
    let mut sw = Switch::new(SwitchConfig { port_mac_limit: 2, ..cfg() }).unwrap();
    let a = add(&mut sw, "a", access(1), None, OFFLOAD);
    add(&mut sw, "b", access(1), None, OFFLOAD);
    for m in 1..=3 {
        send(&mut sw, a.0, &a.1, &eth(BCAST, mac(m), 0x0800, 50), 0);
    }
    assert_eq!(sw.fib().learned_on(a.0), 2, "the limit holds");
    let g = sw.generation();
    sw.set_learning(60_000, 3);
    assert!(sw.generation() > g, "decisions taken under the old limit are taken again");
    assert_eq!((sw.config().aging_ms, sw.config().port_mac_limit, sw.fib().aging_ms()), (60_000, 3, 60_000));
    send(&mut sw, a.0, &a.1, &eth(BCAST, mac(3), 0x0800, 50), 1);
    assert_eq!(sw.fib().learned_on(a.0), 3, "the raised limit lets a third station in");
    sw.expire(60_000 + 10);
    assert_eq!(sw.fib().learned_on(a.0), 0, "the new aging time forgets them");
}

#[test]
fn the_verdict_for_a_key_is_asked_without_a_frame() {
    let mut sw = Switch::new(cfg()).unwrap();
    let a = add(&mut sw, "a", access(1), None, OFFLOAD);
    let b = add(&mut sw, "b", trunk(&[1], None), None, OFFLOAD);
    send(&mut sw, b.0, &b.1, &tag(&eth(BCAST, mac(2), 0x0800, 50), 1), 0);
    send(&mut sw, a.0, &a.1, &eth(mac(2), mac(1), 0x0800, 50), 1);
    let (key, v) = sw.last_decision().map(|(k, v)| (*k, v.clone())).unwrap();
    assert_eq!(key.dst, sluice_switch::Dest::Station(b.0));
    assert_eq!(v.action, Action::Forward);
    assert_eq!(v.outputs.iter().map(|o| (o.port, o.tag)).collect::<Vec<_>>(), vec![(b.0, Some(1))]);
    // Asked again once b has left: nowhere to go.
    sw.remove_port("b").unwrap();
    assert_eq!(sw.verdict(&key).action, Action::Drop(sluice_switch::DropCause::UnknownPort));
}

//! EVPN's ARP suppression in the core: a broadcast ARP request from a local port for an
//! address an EVPN route binds is answered by the switch out of that port and goes no
//! further (not into the tunnel, not to the other ports); one for an address no route
//! binds, and probes, are flooded as before. A local station's ARP messages bind its
//! address to it while it stays behind its port. Neighbour solicitations and
//! advertisements alike, for IPv6.

mod common;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use common::*;
use sluice_switch::mem::{MemHandle, mem_port};
use sluice_switch::tunnel::{TunnelRules, VniMap};
use sluice_switch::{PortConfig, PortPolicy, Switch};
use sluice_wire::MacAddr;
use sluice_wire::neigh::{self, Neigh};

const REMOTE: &str = "192.0.2.1";

fn evpn_tunnel(sw: &mut Switch) -> (u32, MemHandle) {
    let (p, h) = mem_port(NO_OFFLOAD);
    let remote: IpAddr = REMOTE.parse().unwrap();
    h.set_tunnel(TunnelRules {
        vnis: VniMap::Single(5000),
        remotes_only: true,
        remotes: vec![remote],
        evpn: true,
        announced: vec![],
    });
    let cfg = PortConfig { name: "vx".into(), vlan: access(1), mtu: None, policy: PortPolicy::default() };
    (sw.add_port(cfg, Box::new(p)).unwrap(), h)
}

/// A port of a test switch: its id and the handle of its in-memory end.
type Port = (u32, MemHandle);

/// A switch with an EVPN tunnel ([`evpn_tunnel`]) and two local ports, `a` and `b`, in
/// its VLAN.
fn evpn_switch() -> (Switch, Port, Port, Port) {
    let mut sw = Switch::new(cfg()).unwrap();
    let t = evpn_tunnel(&mut sw);
    let a = add(&mut sw, "a", access(1), None, OFFLOAD);
    let b = add(&mut sw, "b", access(1), None, OFFLOAD);
    (sw, t, a, b)
}

fn request(from: u8, sender: Ipv4Addr, target: Ipv4Addr) -> Vec<u8> {
    let mut b = vec![0u8; 64];
    let n = neigh::write_arp(&mut b, 1, MacAddr::BROADCAST, MacAddr(mac(from)), sender, MacAddr::default(), target)
        .unwrap();
    b.truncate(n);
    b
}

#[test]
fn a_request_for_a_bound_address_is_answered_here_and_goes_nowhere_else() {
    let (mut sw, t, a, b) = evpn_switch();
    let (me, bound, unknown) = (Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 50), Ipv4Addr::new(10, 0, 0, 51));
    let far = MacAddr(mac(50));
    assert!(sw.evpn_bind(t.0, 5000, bound.into(), far));
    assert!(!sw.evpn_bind(t.0, 5001, bound.into(), far), "a VNI the port does not carry");

    send(&mut sw, a.0, &a.1, &request(1, me, bound), 0);
    let sent = a.1.take_sent();
    assert_eq!(sent.len(), 1, "answered out of the asker's port");
    let reply = neigh::parse_neigh(&sent[0].1);
    assert_eq!(reply, Some(Neigh::ArpReply { sender_mac: far, sender_ip: bound }), "{:?}", sent[0].1);
    assert_eq!(&sent[0].1[..6], &mac(1), "to the asker");
    assert!(t.1.take_sent().is_empty() && b.1.take_sent().is_empty(), "not flooded");
    assert_eq!(sw.arp_suppressed(), 1);

    // No binding, or a probe: flooded to the tunnel and the other port, as before.
    for f in [request(1, me, unknown), request(1, Ipv4Addr::UNSPECIFIED, bound), request(1, bound, bound)] {
        send(&mut sw, a.0, &a.1, &f, 1);
        assert_eq!((t.1.take_sent().len(), b.1.take_sent().len()), (1, 1), "{f:?}");
        assert!(a.1.take_sent().is_empty());
    }
    // The binding goes: flooded.
    sw.evpn_unbind(t.0, 5000, bound.into());
    send(&mut sw, a.0, &a.1, &request(1, me, bound), 2);
    assert_eq!((t.1.take_sent().len(), sw.arp_suppressed()), (1, 1));
    assert_conserved(&sw);
}

#[test]
fn a_local_stations_arp_messages_bind_its_address_while_it_stays_behind_its_port() {
    let (mut sw, _t, a, b) = evpn_switch();
    let me = Ipv4Addr::new(10, 0, 0, 1);
    send(&mut sw, a.0, &a.1, &request(1, me, Ipv4Addr::new(10, 0, 0, 2)), 0);
    assert_eq!(sw.local_bindings(), [(1, IpAddr::V4(me), MacAddr(mac(1)))]);
    // A probe binds nothing; a station claims at most four addresses.
    send(&mut sw, a.0, &a.1, &request(2, Ipv4Addr::UNSPECIFIED, me), 1);
    for i in 10..20 {
        send(&mut sw, a.0, &a.1, &request(1, Ipv4Addr::new(10, 0, 0, i), me), 2);
    }
    assert_eq!(sw.local_bindings().len(), 4);
    // It moves to another port: its bindings go with its old place, and it binds anew
    // there.
    send(&mut sw, b.0, &b.1, &eth(BCAST, mac(1), 0x88b5, 50), 3);
    assert!(sw.local_bindings().is_empty());
    for i in 30..40 {
        send(&mut sw, b.0, &b.1, &request(1, Ipv4Addr::new(10, 0, 0, i), me), 4);
    }
    assert_eq!(sw.local_bindings().len(), 4);
    assert_conserved(&sw);
}

/// A neighbour solicitation from station `from` at `src` for `target`, to the target's
/// solicited-node group.
fn solicit(from: u8, src: Ipv6Addr, target: Ipv6Addr) -> Vec<u8> {
    let group = neigh::solicited_node(target);
    let m = neigh::NdFields { advert: false, solicited: false, src, dst: group, target, lla: MacAddr(mac(from)) };
    let mut b = vec![0u8; neigh::ND_FRAME_LEN];
    let n = neigh::write_nd(&mut b, neigh::multicast_mac(group), MacAddr(mac(from)), &m).unwrap();
    b.truncate(n);
    b
}

#[test]
fn a_solicitation_for_a_bound_address_is_answered_here_and_goes_nowhere_else() {
    let (mut sw, t, a, b) = evpn_switch();
    let me: Ipv6Addr = "fd00::1".parse().unwrap();
    let (bound, unknown): (Ipv6Addr, Ipv6Addr) = ("fd00::50".parse().unwrap(), "fd00::51".parse().unwrap());
    let far = MacAddr(mac(50));
    assert!(sw.evpn_bind(t.0, 5000, bound.into(), far));

    send(&mut sw, a.0, &a.1, &solicit(1, me, bound), 0);
    let sent = a.1.take_sent();
    assert_eq!(sent.len(), 1, "answered out of the asker's port");
    assert_eq!(
        neigh::parse_neigh(&sent[0].1),
        Some(Neigh::Advert { target: bound, lla: Some(far) }),
        "{:?}",
        sent[0].1
    );
    assert_eq!((&sent[0].1[..6], &sent[0].1[6..12]), (&mac(1)[..], &far.0[..]), "from the bound station to the asker");
    assert_eq!(sent[0].1[14 + 40 + 4] & 0x40, 0x40, "solicited");
    assert!(t.1.take_sent().is_empty() && b.1.take_sent().is_empty(), "not flooded");
    assert_eq!((sw.nd_suppressed(), sw.arp_suppressed()), (1, 0));
    assert_eq!(sw.local_bindings(), [(1, IpAddr::V6(me), MacAddr(mac(1)))], "the asker's address is bound");

    // No binding, or duplicate address detection (from ::): flooded as before.
    for f in [solicit(1, me, unknown), solicit(1, Ipv6Addr::UNSPECIFIED, bound)] {
        send(&mut sw, a.0, &a.1, &f, 1);
        assert_eq!((t.1.take_sent().len(), b.1.take_sent().len()), (1, 1), "{f:?}");
        assert!(a.1.take_sent().is_empty());
    }
    assert_eq!(sw.nd_suppressed(), 1);
    assert_conserved(&sw);
}

#[test]
fn a_local_stations_advertisement_binds_its_address() {
    let (mut sw, _t, a, _b) = evpn_switch();
    let me: Ipv6Addr = "fd00::1".parse().unwrap();
    let m = neigh::NdFields {
        advert: true,
        solicited: false,
        src: me,
        dst: neigh::ALL_NODES,
        target: me,
        lla: MacAddr(mac(1)),
    };
    let mut f = vec![0u8; neigh::ND_FRAME_LEN];
    neigh::write_nd(&mut f, neigh::multicast_mac(neigh::ALL_NODES), MacAddr(mac(1)), &m).unwrap();
    // Learned first (the station is behind the port before its addresses count).
    send(&mut sw, a.0, &a.1, &eth(BCAST, mac(1), 0x88b5, 50), 0);
    send(&mut sw, a.0, &a.1, &f, 1);
    assert_eq!(sw.local_bindings(), [(1, IpAddr::V6(me), MacAddr(mac(1)))]);
    assert_conserved(&sw);
}

//! Layer 3 mode in the forwarding core, with in-memory ports: address resolution answered
//! by the switch on both sides, forwarding by destination address with MAC rewrite, the
//! guests behind the uplink's MAC, and the counters that account for it all.

mod common;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use common::*;
use sluice_switch::mem::{MemHandle, mem_port};
use sluice_switch::{DEFAULT_ROUTER_MAC, Mode, PortConfig, PortPolicy, Switch, SwitchConfig, SwitchError};
use sluice_wire::neigh::{self, NdFields, Neigh};
use sluice_wire::{MacAddr, VnetHdr};

const ROUTER: MacAddr = DEFAULT_ROUTER_MAC;
const UP: MacAddr = MacAddr([0x02, 0xee, 0, 0, 0, 1]);
const UP2: MacAddr = MacAddr([0x02, 0xee, 0, 0, 0, 2]);
const HOST: MacAddr = MacAddr([0x02, 0xaa, 0, 0, 0, 0xc8]);

fn m(n: u8) -> MacAddr {
    MacAddr(mac(n))
}

fn v4(d: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 0, 0, d)
}

fn v6(d: u16) -> Ipv6Addr {
    Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, d)
}

fn arp(op: u16, eth_dst: MacAddr, sha: MacAddr, spa: Ipv4Addr, tpa: Ipv4Addr) -> Vec<u8> {
    let mut b = vec![0u8; 64];
    let n = neigh::write_arp(&mut b, op, eth_dst, sha, spa, MacAddr::default(), tpa).unwrap();
    b.truncate(n);
    b
}

fn nd(advert: bool, eth_dst: MacAddr, eth_src: MacAddr, src: Ipv6Addr, dst: Ipv6Addr, target: Ipv6Addr) -> Vec<u8> {
    let mut b = vec![0u8; 128];
    let f = NdFields { advert, solicited: advert, src, dst, target, lla: eth_src };
    let n = neigh::write_nd(&mut b, eth_dst, eth_src, &f).unwrap();
    b.truncate(n);
    b
}

/// A UDP-sized IPv4 or IPv6 packet (payload bytes only matter for length).
fn ip(dst_mac: MacAddr, src_mac: MacAddr, src: IpAddr, dst: IpAddr) -> Vec<u8> {
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            let mut f = eth(dst_mac.0, src_mac.0, 0x0800, 0);
            let mut h = vec![0x45, 0, 0, 48, 0, 0, 0x40, 0, 64, 17, 0, 0];
            h.extend_from_slice(&s.octets());
            h.extend_from_slice(&d.octets());
            f.extend_from_slice(&h);
            f.extend_from_slice(&[0u8; 28]);
            f
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            let mut f = eth(dst_mac.0, src_mac.0, 0x86dd, 0);
            f.extend_from_slice(&[0x60, 0, 0, 0, 0, 8, 17, 64]);
            f.extend_from_slice(&s.octets());
            f.extend_from_slice(&d.octets());
            f.extend_from_slice(&[0u8; 8]);
            f
        }
        _ => unreachable!(),
    }
}

fn dst_of(f: &[u8]) -> MacAddr {
    MacAddr(f[..6].try_into().unwrap())
}

fn src_of(f: &[u8]) -> MacAddr {
    MacAddr(f[6..12].try_into().unwrap())
}

struct Lab {
    sw: Switch,
    g1: (u32, MemHandle),
    g2: (u32, MemHandle),
    up: (u32, MemHandle),
}

fn l3cfg() -> SwitchConfig {
    SwitchConfig { mode: Mode::L3, ..cfg() }
}

fn port(sw: &mut Switch, name: &str, policy: PortPolicy, dev_mac: Option<MacAddr>) -> (u32, MemHandle) {
    let (p, h) = mem_port(OFFLOAD);
    h.set_mac(dev_mac);
    let id = sw.add_port(PortConfig { name: name.into(), vlan: access(1), mtu: None, policy }, Box::new(p)).unwrap();
    (id, h)
}

fn guest_policy(d: u8) -> PortPolicy {
    PortPolicy { ips: vec![v4(d).into(), v6(u16::from(d)).into()], ..Default::default() }
}

/// Two guests (10.0.0.1/fd00::1 and 10.0.0.2/fd00::2) and an uplink whose device is `UP`.
fn lab() -> Lab {
    let mut sw = Switch::new(l3cfg()).unwrap();
    let g1 = port(&mut sw, "g1", guest_policy(1), None);
    let g2 = port(&mut sw, "g2", guest_policy(2), None);
    let up = port(&mut sw, "up", PortPolicy { uplink: true, ..Default::default() }, Some(UP));
    Lab { sw, g1, g2, up }
}

fn only(h: &MemHandle) -> Vec<u8> {
    let mut sent = h.take_sent();
    assert_eq!(sent.len(), 1, "expected one frame, got {sent:?}");
    sent.pop().unwrap().1
}

#[test]
fn a_guest_asking_for_any_address_gets_the_switchs_mac() {
    let mut l = lab();
    let (g1, h1) = &l.g1;
    send(&mut l.sw, *g1, h1, &arp(1, MacAddr::BROADCAST, m(1), v4(1), v4(2)), 0);
    let reply = only(h1);
    assert_eq!(neigh::parse_neigh(&reply), Some(Neigh::ArpReply { sender_mac: ROUTER, sender_ip: v4(2) }));
    assert_eq!(dst_of(&reply), m(1));
    // A host on the LAN the switch has never heard of: answered too — the switch resolves
    // it when there is something to send.
    send(&mut l.sw, *g1, h1, &arp(1, MacAddr::BROADCAST, m(1), v4(1), v4(200)), 0);
    assert_eq!(neigh::parse_neigh(&only(h1)), Some(Neigh::ArpReply { sender_mac: ROUTER, sender_ip: v4(200) }));
    // Its own address (a gratuitous announcement) is not answered.
    send(&mut l.sw, *g1, h1, &arp(1, MacAddr::BROADCAST, m(1), v4(1), v4(1)), 0);
    assert!(h1.take_sent().is_empty());
    // IPv6: a solicitation for the other guest.
    let ns =
        nd(false, neigh::multicast_mac(neigh::solicited_node(v6(2))), m(1), v6(1), neigh::solicited_node(v6(2)), v6(2));
    send(&mut l.sw, *g1, h1, &ns, 0);
    let na = only(h1);
    assert_eq!(neigh::parse_neigh(&na), Some(Neigh::Advert { target: v6(2), lla: Some(ROUTER) }));
    assert_eq!(dst_of(&na), m(1));
    // Duplicate address detection (source ::) is never answered.
    let dad = nd(
        false,
        neigh::multicast_mac(neigh::solicited_node(v6(7))),
        m(1),
        Ipv6Addr::UNSPECIFIED,
        neigh::solicited_node(v6(7)),
        v6(7),
    );
    send(&mut l.sw, *g1, h1, &dad, 0);
    assert!(h1.take_sent().is_empty());
    // Nothing reached the other ports.
    assert!(l.g2.1.take_sent().is_empty() && l.up.1.take_sent().is_empty());
    let c = l.sw.port_info(*g1).unwrap().counters;
    assert_eq!((c.rx_frames, c.consumed, c.generated), (5, 5, 3));
    assert_conserved(&l.sw);
}

#[test]
fn guest_to_guest_resolves_the_receiver_then_rewrites_both_macs() {
    let mut l = lab();
    let (g1, h1) = l.g1.clone();
    let (g2, h2) = l.g2.clone();
    // g2 has never sent anything: the switch asks it first, in g1's name.
    send(&mut l.sw, g1, &h1, &ip(ROUTER, m(1), v4(1).into(), v4(2).into()), 0);
    let ask = only(&h2);
    assert_eq!(
        neigh::parse_neigh(&ask),
        Some(Neigh::ArpRequest { sender_mac: ROUTER, sender_ip: v4(1), target: v4(2) })
    );
    assert_eq!(l.sw.port_info(g1).unwrap().resolving, 1);
    assert_conserved(&l.sw);
    // Its answer releases the packet, addressed to g2's MAC from the switch's.
    send(&mut l.sw, g2, &h2, &arp(2, ROUTER, m(2), v4(2), v4(1)), 1);
    let f = only(&h2);
    assert_eq!((dst_of(&f), src_of(&f)), (m(2), ROUTER));
    assert_eq!(l.sw.port_info(g1).unwrap().resolving, 0);
    // From now on, straight through, both families.
    send(&mut l.sw, g1, &h1, &ip(ROUTER, m(1), v6(1).into(), v6(2).into()), 2);
    let f = only(&h2);
    assert_eq!((dst_of(&f), src_of(&f)), (m(2), ROUTER));
    // A GSO frame crosses whole: the rewrite touches no checksum.
    let (vnet, frame) = tcp4(ROUTER.0, mac(1), 3000, Some(1448));
    h1.inject(vnet, &frame);
    while l.sw.on_readable(g1, 3) {}
    let (hdr, f) = h2.take_sent().pop().unwrap();
    assert_eq!(hdr.gso_type, VnetHdr::GSO_TCPV4);
    assert_eq!(f[12..], frame[12..]);
    assert_eq!((dst_of(&f), src_of(&f)), (m(2), ROUTER));
    let c = l.sw.port_info(g1).unwrap().counters;
    assert_eq!(c.forwarded, 3);
    assert_conserved(&l.sw);
}

#[test]
fn guests_reach_the_lan_behind_the_uplinks_mac_and_the_lan_reaches_them() {
    let mut l = lab();
    let (g1, h1) = l.g1.clone();
    let (up, hu) = l.up.clone();
    // g1 → LAN host 10.0.0.200: the switch asks on the LAN in g1's name, from the uplink's MAC.
    send(&mut l.sw, g1, &h1, &ip(ROUTER, m(1), v4(1).into(), v4(200).into()), 0);
    let ask = only(&hu);
    assert_eq!(src_of(&ask), UP);
    assert_eq!(neigh::parse_neigh(&ask), Some(Neigh::ArpRequest { sender_mac: UP, sender_ip: v4(1), target: v4(200) }));
    send(&mut l.sw, up, &hu, &arp(2, UP, HOST, v4(200), v4(1)), 1);
    let f = only(&hu);
    assert_eq!((dst_of(&f), src_of(&f)), (HOST, UP));
    // The LAN asks for g1's address: the uplink's MAC answers. For an address no guest
    // owns: silence.
    send(&mut l.sw, up, &hu, &arp(1, MacAddr::BROADCAST, HOST, v4(200), v4(1)), 2);
    assert_eq!(neigh::parse_neigh(&only(&hu)), Some(Neigh::ArpReply { sender_mac: UP, sender_ip: v4(1) }));
    send(&mut l.sw, up, &hu, &arp(1, MacAddr::BROADCAST, HOST, v4(200), v4(99)), 2);
    assert!(hu.take_sent().is_empty());
    // The LAN → g1 (whose MAC the switch knows from its first frame).
    send(&mut l.sw, up, &hu, &ip(UP, HOST, v4(200).into(), v4(1).into()), 3);
    let f = only(&h1);
    assert_eq!((dst_of(&f), src_of(&f)), (m(1), ROUTER));
    // IPv6 both ways: NS out with the uplink's MAC, NA back, packet through.
    send(&mut l.sw, g1, &h1, &ip(ROUTER, m(1), v6(1).into(), v6(200).into()), 4);
    let ask = only(&hu);
    assert_eq!(neigh::parse_neigh(&ask), Some(Neigh::Solicit { src: v6(1), target: v6(200), lla: Some(UP) }));
    assert_eq!(dst_of(&ask), neigh::multicast_mac(neigh::solicited_node(v6(200))));
    send(&mut l.sw, up, &hu, &nd(true, UP, HOST, v6(200), v6(1), v6(200)), 5);
    let f = only(&hu);
    assert_eq!((dst_of(&f), src_of(&f)), (HOST, UP));
    let ns = nd(
        false,
        neigh::multicast_mac(neigh::solicited_node(v6(2))),
        HOST,
        v6(200),
        neigh::solicited_node(v6(2)),
        v6(2),
    );
    send(&mut l.sw, up, &hu, &ns, 6);
    assert_eq!(neigh::parse_neigh(&only(&hu)), Some(Neigh::Advert { target: v6(2), lla: Some(UP) }));
    // Frames on the LAN for another host, and to addresses no guest owns, go nowhere.
    send(&mut l.sw, up, &hu, &ip(m(77), HOST, v4(200).into(), v4(1).into()), 7);
    send(&mut l.sw, up, &hu, &ip(UP, HOST, v4(200).into(), v4(50).into()), 7);
    assert_eq!(l.sw.port_info(up).unwrap().counters.rx_drops.no_route, 2);
    assert!(h1.take_sent().is_empty() && l.g2.1.take_sent().is_empty());
    assert_eq!(l.sw.neighbours().len(), 2);
    assert_conserved(&l.sw);
}

#[test]
fn non_ip_frames_spoofed_sources_and_silent_hosts_are_dropped_and_counted() {
    let mut l = lab();
    let (g1, h1) = l.g1.clone();
    send(&mut l.sw, g1, &h1, &eth(BCAST, mac(1), 0x88b5, 50), 0);
    send(&mut l.sw, g1, &h1, &ip(ROUTER, m(1), v4(9).into(), v4(2).into()), 0);
    send(&mut l.sw, g1, &h1, &arp(1, MacAddr::BROADCAST, m(1), v4(9), v4(2)), 0);
    // Nobody answers for 10.0.0.201: the packet waits, then is dropped.
    send(&mut l.sw, g1, &h1, &ip(ROUTER, m(1), v4(1).into(), v4(201).into()), 0);
    assert_eq!(l.sw.port_info(g1).unwrap().resolving, 1);
    l.sw.expire(1000);
    assert_eq!(l.sw.port_info(g1).unwrap().resolving, 1);
    l.sw.expire(3000);
    let info = l.sw.port_info(g1).unwrap();
    assert_eq!(info.resolving, 0);
    let d = info.counters.rx_drops;
    assert_eq!((d.not_ip, d.spoofed_ip, d.unresolved), (1, 2, 1));
    assert!(h1.take_sent().is_empty() && l.g2.1.take_sent().is_empty());
    assert_eq!(l.up.1.take_sent().len(), 1, "one ARP request for 10.0.0.201");
    assert_conserved(&l.sw);
}

#[test]
fn a_port_without_addresses_learns_its_first_of_each_family_then_locks_them() {
    let mut l = lab();
    let (g3, h3) = port(&mut l.sw, "g3", PortPolicy::default(), None);
    let (up, hu) = l.up.clone();
    send(&mut l.sw, g3, &h3, &arp(1, MacAddr::BROADCAST, m(3), v4(3), v4(200)), 0);
    assert_eq!(h3.take_sent().len(), 1);
    // The LAN can reach it now.
    send(&mut l.sw, up, &hu, &arp(1, MacAddr::BROADCAST, HOST, v4(200), v4(3)), 1);
    assert_eq!(neigh::parse_neigh(&only(&hu)), Some(Neigh::ArpReply { sender_mac: UP, sender_ip: v4(3) }));
    // A second IPv4 address, or one another port owns, is a forgery; a first IPv6 one is
    // learned.
    send(&mut l.sw, g3, &h3, &ip(ROUTER, m(3), v4(4).into(), v4(1).into()), 2);
    send(&mut l.sw, g3, &h3, &ip(ROUTER, m(3), v6(1).into(), v6(2).into()), 2);
    send(&mut l.sw, g3, &h3, &ip(ROUTER, m(3), v6(3).into(), v6(2).into()), 2);
    assert_eq!(l.sw.port_info(g3).unwrap().counters.rx_drops.spoofed_ip, 2);
    let owners: Vec<_> = l.sw.ip_owners().into_iter().filter(|&(_, p)| p == g3).map(|(ip, _)| ip).collect();
    assert_eq!(owners, vec![IpAddr::from(v4(3)), IpAddr::from(v6(3))]);
    // A configured address already owned elsewhere is refused when the port is added.
    let (p, _) = mem_port(OFFLOAD);
    let e = l
        .sw
        .add_port(PortConfig { name: "g4".into(), vlan: access(1), mtu: None, policy: guest_policy(2) }, Box::new(p))
        .unwrap_err();
    assert!(matches!(e, SwitchError::AddressInUse { .. }), "{e}");
    assert!(e.to_string().contains("\"g2\""), "{e}");
    assert_conserved(&l.sw);
}

#[test]
fn after_a_failover_the_uplink_announces_every_guest_address_from_its_new_mac() {
    let mut l = lab();
    let (up, hu) = l.up.clone();
    l.up.1.set_mac(Some(UP2));
    hu.change_device("eth0 lost carrier; now on eth1");
    let mut moved = Vec::new();
    l.sw.tick_ports(|p, what| moved.push(format!("{p}: {what}")));
    assert_eq!(moved, ["up: eth0 lost carrier; now on eth1"]);
    let sent = hu.take_sent();
    let mut got: Vec<_> = sent.iter().map(|(_, f)| (src_of(f), neigh::parse_neigh(f).unwrap())).collect();
    got.sort_by_key(|(_, n)| format!("{n:?}"));
    let garp = |d| (UP2, Neigh::ArpRequest { sender_mac: UP2, sender_ip: v4(d), target: v4(d) });
    let na = |d| (UP2, Neigh::Advert { target: v6(d), lla: Some(UP2) });
    assert_eq!(got, vec![na(1), na(2), garp(1), garp(2)]);
    assert_eq!(l.sw.port_info(up).unwrap().counters.generated, 4);
    assert_conserved(&l.sw);
}

#[test]
fn in_layer_2_a_failover_sends_a_rarp_from_every_station_learned_on_this_side() {
    let mut sw = Switch::new(cfg()).unwrap();
    let (g1, h1) = add(&mut sw, "g1", access(1), None, OFFLOAD);
    let (g2, h2) = add(&mut sw, "g2", access(1), None, OFFLOAD);
    let (up, hu) = port(&mut sw, "up", PortPolicy { uplink: true, ..Default::default() }, Some(UP));
    send(&mut sw, g1, &h1, &eth(BCAST, mac(1), 0x0800, 46), 0);
    send(&mut sw, g2, &h2, &eth(BCAST, mac(2), 0x0800, 46), 0);
    send(&mut sw, up, &hu, &eth(BCAST, HOST.0, 0x0800, 46), 0);
    hu.take_sent();
    hu.change_device("eth0 set down; now on eth1");
    sw.tick_ports(|_, _| {});
    let mut from: Vec<_> =
        hu.take_sent().iter().map(|(_, f)| (u16::from_be_bytes([f[12], f[13]]), src_of(f))).collect();
    from.sort();
    assert_eq!(from, vec![(0x8035, m(1)), (0x8035, m(2))]);
    assert_conserved(&sw);
}

/// Found by the `switch` fuzz target: a reply from a LAN host whose address the full
/// neighbour table cannot take sent the frames waiting for it round and round — each
/// forwarded, parked again at the end of the list, found again — and the switch never
/// returned. Now each waiting frame is tried once per answer and waits on (until its
/// address is learned, or it expires as `unresolved`).
#[test]
fn an_answer_the_full_neighbour_table_cannot_keep_leaves_the_waiting_frame_waiting() {
    let mut sw = Switch::new(SwitchConfig { fib_max: 1, ..l3cfg() }).unwrap();
    let (g1, h1) = port(&mut sw, "g1", guest_policy(1), None);
    let (up, hu) = port(&mut sw, "up", PortPolicy { uplink: true, ..Default::default() }, Some(UP));
    let other = MacAddr([0x02, 0xaa, 0, 0, 0, 0xc9]);
    // Another LAN host asks for g1 first: it takes the table's one place.
    send(&mut sw, up, &hu, &arp(1, MacAddr::BROADCAST, other, v4(201), v4(1)), 0);
    hu.take_sent();
    assert_eq!(sw.neighbours().len(), 1);
    // g1 → 10.0.0.200: parked, asked for.
    send(&mut sw, g1, &h1, &ip(ROUTER, m(1), v4(1).into(), v4(200).into()), 1);
    assert!(neigh::parse_neigh(&only(&hu)).is_some());
    // The answer comes, and the table has no room for it.
    let (tx, rx) = std::sync::mpsc::channel();
    let t = std::thread::spawn(move || {
        send(&mut sw, up, &hu, &arp(2, UP, HOST, v4(200), v4(1)), 2);
        let _ = tx.send(());
        (sw, hu)
    });
    assert!(rx.recv_timeout(std::time::Duration::from_secs(60)).is_ok(), "the switch never returned from the answer");
    let (mut sw, hu) = t.join().unwrap();
    assert!(hu.take_sent().is_empty(), "nowhere to send it yet");
    assert_eq!(sw.neighbours().len(), 1);
    // It waits, and goes as unresolved when its time is up; the counters conserve.
    sw.expire(60_000);
    assert_eq!(sw.port_info(g1).unwrap().counters.rx_drops.unresolved, 1);
    assert_conserved(&sw);
}

#[test]
fn a_neighbour_solicitation_that_does_not_read_is_dropped_not_routed() {
    let mut l = lab();
    let (g1, h1) = &l.g1;
    let group = neigh::solicited_node(v6(2));
    let mut ns = nd(false, neigh::multicast_mac(group), m(1), v6(1), group, v6(2));
    // A checksum that does not verify (RFC 4861, 7.1.1: not a message to act on).
    ns[14 + 40 + 2] ^= 0xff;
    send(&mut l.sw, *g1, h1, &ns, 0);
    assert!(h1.take_sent().is_empty() && l.g2.1.take_sent().is_empty() && l.up.1.take_sent().is_empty());
    let c = l.sw.port_info(*g1).unwrap().counters;
    assert_eq!((c.rx_drops.malformed, c.consumed, c.flooded), (1, 0, 0), "{c:?}");
    assert_conserved(&l.sw);
}

#[test]
fn a_frame_from_the_lan_held_for_a_busy_guest_reaches_it_once_there_is_room() {
    let mut sw = Switch::new(SwitchConfig { lossless: true, ..l3cfg() }).unwrap();
    let g1 = port(&mut sw, "g1", guest_policy(1), None);
    let up = port(&mut sw, "up", PortPolicy { uplink: true, ..Default::default() }, Some(UP));
    // The guest's MAC is known from its first frame.
    send(&mut sw, g1.0, &g1.1, &arp(1, MacAddr::BROADCAST, m(1), v4(1), v4(200)), 0);
    g1.1.take_sent();
    // It takes nothing for a while: its queue (8 frames) fills, the ninth is held.
    g1.1.set_tx_limit(Some(0));
    for t in 0..9 {
        send(&mut sw, up.0, &up.1, &ip(UP, HOST, v4(200).into(), v4(1).into()), t);
    }
    assert_eq!(sw.port_info(up.0).unwrap().held, 1);
    // Room again: the held frame goes on too, its destination as it was decided (its
    // destination MAC already the guest's, which a second look at the frame would take for
    // a frame on the LAN for another host).
    g1.1.set_tx_limit(None);
    sw.on_writable(g1.0);
    let sent = g1.1.take_sent();
    assert_eq!(sent.len(), 9);
    assert!(sent.iter().all(|(_, f)| (dst_of(f), src_of(f)) == (m(1), ROUTER)));
    let c = sw.port_info(up.0).unwrap().counters;
    assert_eq!((c.forwarded, c.rx_drops.no_route), (9, 0), "{c:?}");
    assert_conserved(&sw);
}

//! A tunnel's stage 1 in the core's decision: a datagram's origin (its VNI, whether its
//! sender is one of the port's endpoints) says the frame's VLAN or drops it — an unknown
//! sender as `unknown_endpoint`, a VNI the port does not carry as `vlan_filter` — and a
//! tunnel learns where a station is only when the core, after every check, keeps the
//! station on it: from the frame's sender (user-space datapath), or from what a kernel
//! datapath reports it heard ([`Switch::tunnel_heard`]).

mod common;

use std::net::IpAddr;

use common::*;
use sluice_switch::mem::{MemHandle, mem_port};
use sluice_switch::tunnel::{Origin, TunnelRules, VniMap};
use sluice_switch::{DropCause, PortConfig, PortPolicy, Switch, SwitchConfig, VlanMode};
use sluice_wire::MacAddr;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

const REMOTE: &str = "192.0.2.1";
const STRANGER: &str = "192.0.2.66";

/// Adds a tunnel port `name` of VLAN mode `vlan` carrying `vnis`, whose one configured
/// endpoint is [`REMOTE`].
fn add_tunnel(sw: &mut Switch, name: &str, vlan: VlanMode, vnis: VniMap, remotes_only: bool) -> (u32, MemHandle) {
    let (p, h) = mem_port(NO_OFFLOAD);
    h.set_tunnel(TunnelRules { vnis, remotes_only, remotes: vec![ip(REMOTE)], evpn: false, announced: vec![] });
    let cfg = PortConfig { name: name.into(), vlan, mtu: None, policy: PortPolicy::default() };
    (sw.add_port(cfg, Box::new(p)).unwrap(), h)
}

/// `frame` arrives at tunnel `t` in a datagram of `vni` from `sender`.
fn arrive(sw: &mut Switch, t: &(u32, MemHandle), vni: u32, sender: &str, frame: &[u8], now_ms: u64) {
    t.1.inject_from(Origin { vni, sender: ip(sender) }, frame);
    while sw.on_readable(t.0, now_ms) {}
}

fn drops(sw: &Switch, id: u32, cause: DropCause) -> u64 {
    sw.port_info(id).unwrap().counters.rx_drops.get(cause)
}

#[test]
fn an_unknown_sender_and_a_foreign_vni_are_dropped_and_counted_as_the_kernel_counts_them() {
    let mut sw = Switch::new(cfg()).unwrap();
    let t = add_tunnel(&mut sw, "vx", access(1), VniMap::Single(5000), true);
    let guest = add(&mut sw, "guest", access(1), None, OFFLOAD);
    let f = eth(BCAST, mac(2), 0x88b5, 50);

    arrive(&mut sw, &t, 5000, STRANGER, &f, 0);
    assert_eq!(drops(&sw, t.0, DropCause::UnknownEndpoint), 1);
    arrive(&mut sw, &t, 5001, REMOTE, &f, 1);
    assert_eq!(drops(&sw, t.0, DropCause::VlanFilter), 1, "a VNI the port does not carry");
    arrive(&mut sw, &t, 5001, STRANGER, &f, 2);
    assert_eq!(drops(&sw, t.0, DropCause::UnknownEndpoint), 2, "the sender is looked at first");
    assert!(guest.1.take_sent().is_empty());
    assert_eq!(sw.fib().get(1, MacAddr(mac(2))), None, "nothing learned from them");
    assert!(t.1.take_remotes().is_empty());
    // Each decided by its key: the verdict the switch gives for it now.
    let (key, v) = sw.last_decision().map(|(k, v)| (*k, v.clone())).unwrap();
    assert_eq!(sw.verdict(&key), v);

    arrive(&mut sw, &t, 5000, REMOTE, &f, 3);
    assert_eq!(guest.1.take_sent().len(), 1);
    assert_eq!(t.1.take_remotes(), [(5000, MacAddr(mac(2)), ip(REMOTE))]);
    let c = sw.port_info(t.0).unwrap().counters;
    assert_eq!((c.rx_frames, c.flooded, c.rx_drops.total()), (4, 1, 3));

    // Opened to any sender, a stranger's datagram is taken and the stranger learned.
    let open = add_tunnel(&mut sw, "open", access(1), VniMap::Single(5000), false);
    arrive(&mut sw, &open, 5000, STRANGER, &eth(BCAST, mac(3), 0x88b5, 50), 4);
    assert_eq!(open.1.take_remotes(), [(5000, MacAddr(mac(3)), ip(STRANGER))]);
    assert_conserved(&sw);
}

#[test]
fn a_vlans_vni_gives_its_vlan_to_frames_that_crossed_untagged() {
    let mut sw = Switch::new(cfg()).unwrap();
    let map = VniMap::PerVlan(vec![(10, 5010), (20, 5020)]);
    let t = add_tunnel(&mut sw, "vx", trunk(&[10, 20], None), map, true);
    let trunk_port = add(&mut sw, "trunk", trunk(&[10, 20], None), None, OFFLOAD);
    let v20 = add(&mut sw, "v20", access(20), None, OFFLOAD);

    arrive(&mut sw, &t, 5020, REMOTE, &eth(BCAST, mac(2), 0x88b5, 50), 0);
    let sent = trunk_port.1.take_sent();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].1, tag(&eth(BCAST, mac(2), 0x88b5, 50), 20), "tagged with VNI 5020's VLAN");
    assert_eq!(v20.1.take_sent().len(), 1);
    assert_eq!(sw.fib().get(20, MacAddr(mac(2))).map(|e| e.port), Some(t.0));

    // A frame that carries a VLAN's tag inside a VLAN's VNI is not let in.
    arrive(&mut sw, &t, 5010, REMOTE, &tag(&eth(BCAST, mac(4), 0x88b5, 50), 20), 1);
    assert_eq!(drops(&sw, t.0, DropCause::VlanFilter), 1);
    assert!(trunk_port.1.take_sent().is_empty() && v20.1.take_sent().is_empty());
    // A priority tag is no VLAN's: the VNI's VLAN, the tag gone.
    arrive(&mut sw, &t, 5020, REMOTE, &tag(&eth(BCAST, mac(5), 0x88b5, 50), 0), 2);
    assert_eq!(v20.1.take_sent()[0].1, eth(BCAST, mac(5), 0x88b5, 50));
    assert_conserved(&sw);
}

#[test]
fn a_tunnel_learns_where_a_station_is_only_after_the_cores_checks() {
    let mut sw = Switch::new(SwitchConfig { port_mac_limit: 2, ..cfg() }).unwrap();
    let t = add_tunnel(&mut sw, "vx", access(1), VniMap::Single(5000), true);
    let guest = add_with(&mut sw, "guest", PortPolicy { mac: Some(MacAddr(mac(1))), ..PortPolicy::default() });
    let other = add(&mut sw, "other", access(1), None, OFFLOAD);
    sw.add_static_mac(1, MacAddr(mac(9)), "other").unwrap();

    // Claims on the guest's locked address and on the static station: dropped, and the
    // tunnel is told nothing of them.
    arrive(&mut sw, &t, 5000, REMOTE, &eth(BCAST, mac(1), 0x88b5, 50), 0);
    arrive(&mut sw, &t, 5000, REMOTE, &eth(BCAST, mac(9), 0x88b5, 50), 1);
    assert_eq!(drops(&sw, t.0, DropCause::SpoofedMac), 2);
    assert!(t.1.take_remotes().is_empty(), "a claim taught the tunnel where a station is");
    // Stations the port may learn are learned behind their sender; past the port's limit,
    // the frame goes on and nothing is learned.
    for (n, m) in [3, 4, 5].into_iter().enumerate() {
        arrive(&mut sw, &t, 5000, REMOTE, &eth(BCAST, mac(m), 0x88b5, 50), 2 + n as u64);
    }
    let learned: Vec<MacAddr> = t.1.take_remotes().into_iter().map(|r| r.1).collect();
    assert_eq!(learned, [MacAddr(mac(3)), MacAddr(mac(4))]);
    assert_eq!(sw.port_info(t.0).unwrap().counters.learn_refused, 1);
    assert_eq!(other.1.take_sent().len(), 3);
    let _ = guest;
    assert_conserved(&sw);
}

#[test]
fn what_a_kernel_heard_behind_a_tunnel_is_learned_only_for_the_tunnels_stations() {
    let mut sw = Switch::new(cfg()).unwrap();
    let map = VniMap::PerVlan(vec![(10, 5010)]);
    let t = add_tunnel(&mut sw, "vx", trunk(&[10], None), map, true);
    let guest = add(&mut sw, "guest", access(10), None, OFFLOAD);
    // The core took a frame from station 2 through the tunnel (as a kernel hands it up,
    // with its origin): the station is the tunnel's.
    t.1.inject_from(Origin { vni: 5010, sender: ip(REMOTE) }, &eth(BCAST, mac(2), 0x88b5, 50));
    while sw.on_readable(t.0, 0) {}
    t.1.take_remotes();
    // The guest's own station, heard through the tunnel, is not the tunnel's.
    sw.ingest(1, |buf| {
        let f = eth(BCAST, mac(7), 0x88b5, 50);
        buf[..12].fill(0);
        buf[12..12 + f.len()].copy_from_slice(&f);
        Some((guest.0, f.len()))
    });

    let heard = |sw: &mut Switch, vni, vlan, m, sender| sw.tunnel_heard(t.0, vni, vlan, MacAddr(mac(m)), ip(sender));
    assert!(!heard(&mut sw, 5010, 10, 7, REMOTE), "another port's station");
    assert!(!heard(&mut sw, 5010, 10, 8, REMOTE), "a station the core has not learned");
    assert!(!heard(&mut sw, 5010, 10, 2, STRANGER), "a sender not among the endpoints");
    assert!(!heard(&mut sw, 5099, 10, 2, REMOTE), "a VNI the port does not carry");
    assert!(!heard(&mut sw, 5010, 20, 2, REMOTE), "a VLAN the VNI is not");
    assert!(t.1.take_remotes().is_empty());
    assert!(heard(&mut sw, 5010, 10, 2, REMOTE));
    assert_eq!(t.1.take_remotes(), [(5010, MacAddr(mac(2)), ip(REMOTE))]);
    assert!(!sw.tunnel_heard(guest.0, 5010, 10, MacAddr(mac(7)), ip(REMOTE)), "not a tunnel");
}

#[test]
fn a_tunnel_that_cannot_say_where_a_frame_came_from_has_it_refused() {
    let mut sw = Switch::new(cfg()).unwrap();
    let t = add_tunnel(&mut sw, "vx", access(1), VniMap::Single(5000), false);
    let guest = add(&mut sw, "guest", access(1), None, OFFLOAD);
    send(&mut sw, t.0, &t.1, &eth(BCAST, mac(2), 0x88b5, 50), 0);
    assert_eq!(drops(&sw, t.0, DropCause::Malformed), 1);
    assert!(guest.1.take_sent().is_empty());
    assert_conserved(&sw);
}

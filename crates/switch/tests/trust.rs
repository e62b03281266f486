//! The core's rules against parties that claim what is not theirs: a station locked to a
//! port (its `mac`) or configured static never moves to another port, whatever arrives
//! (a tunnel's remote claiming it, a guest forging it); and a GSO frame a port would send
//! to several places itself (a tunnel's endpoints) costs at most
//! `FLOOD_DATAGRAMS_PER_FRAME` datagrams there. What a port's device refuses below it (a
//! tunnel's socket filter) counts as the port's received frames dropped for that cause.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use common::*;
use sluice_switch::{
    DropCause, FLOOD_DATAGRAMS_PER_FRAME, OutFrame, Port, PortCaps, PortConfig, PortError, PortPolicy, Switch,
    SwitchError, TxOutcome,
};
use sluice_wire::MacAddr;

fn locked(m: u8) -> PortPolicy {
    PortPolicy { mac: Some(MacAddr(mac(m))), ..PortPolicy::default() }
}

#[test]
fn a_locked_station_never_moves_to_another_port() {
    let mut sw = Switch::new(cfg()).unwrap();
    let guest = add_with(&mut sw, "guest", locked(1));
    let tunnel = add(&mut sw, "tunnel", access(1), None, OFFLOAD);
    let other = add(&mut sw, "other", access(1), None, OFFLOAD);
    send(&mut sw, guest.0, &guest.1, &eth(BCAST, mac(1), 0x0800, 50), 0);
    tunnel.1.take_sent();
    other.1.take_sent();

    // The tunnel's remote claims the guest's address: dropped at its input, nothing moves.
    for t in 1..=3 {
        send(&mut sw, tunnel.0, &tunnel.1, &eth(mac(2), mac(1), 0x0800, 50), t);
    }
    let c = sw.port_info(tunnel.0).unwrap().counters;
    assert_eq!((c.rx_drops.spoofed_mac, c.forwarded + c.flooded), (3, 0), "{c:?}");
    assert_eq!(sw.fib().get(1, MacAddr(mac(1))).map(|e| e.port), Some(guest.0));
    assert!(other.1.take_sent().is_empty(), "the forged frames went nowhere");
    // Frames for the guest still reach it.
    send(&mut sw, other.0, &other.1, &eth(mac(1), mac(3), 0x0800, 50), 4);
    assert_eq!(guest.1.take_sent().len(), 1);
    assert!(tunnel.1.take_sent().is_empty());
    // Even once the guest's entry aged out: the lock, not the table, says whose it is.
    sw.expire(10_000_000);
    send(&mut sw, tunnel.0, &tunnel.1, &eth(BCAST, mac(1), 0x0800, 50), 10_000_000);
    assert_eq!(sw.port_info(tunnel.0).unwrap().counters.rx_drops.spoofed_mac, 4);
    assert_eq!(sw.fib().get(1, MacAddr(mac(1))), None);
    assert_conserved(&sw);
}

#[test]
fn frames_refused_below_a_port_count_as_received_and_dropped_there() {
    let mut sw = Switch::new(cfg()).unwrap();
    let tunnel = add(&mut sw, "tunnel", access(1), None, OFFLOAD);
    let other = add(&mut sw, "other", access(1), None, OFFLOAD);
    send(&mut sw, tunnel.0, &tunnel.1, &eth(BCAST, mac(2), 0x0800, 50), 0);
    tunnel.1.refuse_below(DropCause::UnknownEndpoint, 1000);
    sw.tick_ports(|_, what| panic!("no port changed device: {what}"));
    let c = sw.port_info(tunnel.0).unwrap().counters;
    assert_eq!((c.rx_frames, c.rx_drops.unknown_endpoint, c.rx_drops.total()), (1001, 1000, 1000), "{c:?}");
    assert_eq!(c.failovers, 0);
    assert_eq!(other.1.take_sent().len(), 1, "the one frame read went on; nothing else did");
    assert_conserved(&sw);
    // Asked again, the port has nothing new; what it refused before it leaves counts too.
    sw.tick_ports(|_, _| {});
    assert_eq!(sw.port_info(tunnel.0).unwrap().counters.rx_drops.unknown_endpoint, 1000);
    tunnel.1.refuse_below(DropCause::UnknownEndpoint, 5);
    sw.remove_port("tunnel").unwrap();
    assert_eq!(sw.departed().rx_drops.unknown_endpoint, 1005);
    assert_conserved(&sw);
}

#[test]
fn locking_a_station_takes_it_from_where_it_was_learned() {
    let mut sw = Switch::new(cfg()).unwrap();
    let a = add(&mut sw, "a", access(1), None, OFFLOAD);
    send(&mut sw, a.0, &a.1, &eth(BCAST, mac(5), 0x0800, 50), 0);
    assert_eq!(sw.fib().get(1, MacAddr(mac(5))).map(|e| e.port), Some(a.0));
    let b = add_with(&mut sw, "b", locked(5));
    assert_eq!(sw.fib().get(1, MacAddr(mac(5))), None, "forgotten on a");
    send(&mut sw, a.0, &a.1, &eth(BCAST, mac(5), 0x0800, 50), 1);
    assert_eq!(sw.port_info(a.0).unwrap().counters.rx_drops.spoofed_mac, 1);
    // Its port gone, the address is anyone's again.
    sw.remove_port("b").unwrap();
    send(&mut sw, a.0, &a.1, &eth(BCAST, mac(5), 0x0800, 50), 2);
    assert_eq!(sw.fib().get(1, MacAddr(mac(5))).map(|e| e.port), Some(a.0));
    let _ = b;
    assert_conserved(&sw);
}

#[test]
fn a_static_station_never_moves_and_a_locked_one_takes_no_static_entry_elsewhere() {
    let mut sw = Switch::new(cfg()).unwrap();
    let p1 = add(&mut sw, "p1", access(1), None, OFFLOAD);
    let p2 = add(&mut sw, "p2", access(1), None, OFFLOAD);
    let p3 = add_with(&mut sw, "p3", locked(7));
    sw.add_static_mac(1, MacAddr(mac(9)), "p2").unwrap();
    send(&mut sw, p1.0, &p1.1, &eth(mac(3), mac(9), 0x0800, 50), 0);
    assert_eq!(sw.port_info(p1.0).unwrap().counters.rx_drops.spoofed_mac, 1);
    assert!(p2.1.take_sent().is_empty() && p3.1.take_sent().is_empty());
    // From its own port the static station sends as ever.
    send(&mut sw, p2.0, &p2.1, &eth(BCAST, mac(9), 0x0800, 50), 1);
    assert_eq!(p1.1.take_sent().len(), 1);
    assert!(matches!(sw.add_static_mac(1, MacAddr(mac(7)), "p1"), Err(SwitchError::MacLocked { .. })));
    sw.add_static_mac(1, MacAddr(mac(7)), "p3").unwrap();
    assert_conserved(&sw);
}

/// A port without offloads that sends each frame to `fanout` places itself (as a tunnel
/// floods to its endpoints); counts what it is handed.
struct Fanout {
    fanout: usize,
    sent: Arc<AtomicU64>,
}

impl Port for Fanout {
    fn kind(&self) -> &'static str {
        "fanout"
    }
    fn caps(&self) -> PortCaps {
        NO_OFFLOAD
    }
    fn recv(&mut self, _buf: &mut [u8]) -> Result<Option<usize>, PortError> {
        Ok(None)
    }
    fn send(&mut self, _f: &OutFrame<'_>) -> Result<TxOutcome, PortError> {
        self.sent.fetch_add(1, Ordering::Relaxed);
        Ok(TxOutcome::Sent)
    }
    fn fanout(&self, _vlan: u16, dst: MacAddr) -> usize {
        if dst.is_multicast() { self.fanout } else { 1 }
    }
}

fn add_fanout(sw: &mut Switch, name: &str, fanout: usize) -> (u32, Arc<AtomicU64>) {
    let sent = Arc::new(AtomicU64::new(0));
    let port = Fanout { fanout, sent: sent.clone() };
    let id = sw
        .add_port(
            PortConfig { name: name.into(), vlan: access(1), mtu: None, policy: PortPolicy::default() },
            Box::new(port),
        )
        .unwrap();
    (id, sent)
}

#[test]
fn a_gso_flood_costs_a_fanout_port_at_most_the_budget() {
    let mut sw = Switch::new(cfg()).unwrap();
    let guest = add(&mut sw, "guest", access(1), None, OFFLOAD);
    let whole = add(&mut sw, "whole", access(1), None, OFFLOAD);
    let (two, two_sent) = add_fanout(&mut sw, "two", 2);
    let (three, three_sent) = add_fanout(&mut sw, "three", 3);
    // 1,400 bytes in 48-byte segments: 30 segments; to two places 60, to three 90.
    let (vnet, f) = tcp4(BCAST, mac(1), 1400, Some(48));
    const { assert!(30 * 2 <= FLOOD_DATAGRAMS_PER_FRAME && 30 * 3 > FLOOD_DATAGRAMS_PER_FRAME) };
    guest.1.inject(vnet, &f);
    while sw.on_readable(guest.0, 0) {}
    assert_eq!(whole.1.take_sent().len(), 1, "a port with offloads takes it whole");
    assert_eq!(two_sent.load(Ordering::Relaxed), 30, "within the budget: cut and sent");
    assert_eq!(three_sent.load(Ordering::Relaxed), 0, "over the budget: nothing");
    let c = sw.port_info(three).unwrap().counters;
    assert_eq!((c.tx_drops.get(DropCause::GsoLimit), c.tx_frames), (1, 0), "{c:?}");
    assert_eq!(sw.port_info(two).unwrap().counters.tx_segments, 30);

    // Sent to one place (a known station), a frame of many segments costs what it costs
    // any port: it is not multiplied.
    let (vnet, f) = tcp4(mac(2), mac(1), 4800, Some(48));
    guest.1.inject(vnet, &f);
    while sw.on_readable(guest.0, 1) {}
    assert_eq!(three_sent.load(Ordering::Relaxed), 100, "100 segments to one place");
    assert_conserved(&sw);
}

/// An IPv4 frame from `src` claiming source address `ip`.
fn ipv4(dst: [u8; 6], src: [u8; 6], ip: [u8; 4]) -> Vec<u8> {
    let mut f = eth(dst, src, 0x0800, 40);
    f[14] = 0x45;
    f[26..30].copy_from_slice(&ip);
    f
}

#[test]
fn a_frame_dropped_for_another_ports_station_locks_no_address() {
    let mut sw = Switch::new(cfg()).unwrap();
    let p = add_with(&mut sw, "p", PortPolicy { learn_ips: true, ..PortPolicy::default() });
    add_with(&mut sw, "q", locked(5));
    let other = add(&mut sw, "other", access(1), None, OFFLOAD);
    // p claims q's station: dropped, and its address is not p's first one.
    send(&mut sw, p.0, &p.1, &ipv4(BCAST, mac(5), [10, 0, 0, 7]), 0);
    assert_eq!(sw.port_info(p.0).unwrap().counters.rx_drops.spoofed_mac, 1);
    assert!(other.1.take_sent().is_empty());
    // From its own station, the first address it uses is the one it keeps.
    send(&mut sw, p.0, &p.1, &ipv4(BCAST, mac(1), [10, 0, 0, 8]), 1);
    let c = sw.port_info(p.0).unwrap().counters;
    assert_eq!((c.rx_drops.spoofed_ip, c.flooded), (0, 1), "{c:?}");
    send(&mut sw, p.0, &p.1, &ipv4(BCAST, mac(1), [10, 0, 0, 7]), 2);
    assert_eq!(sw.port_info(p.0).unwrap().counters.rx_drops.spoofed_ip, 1, "10.0.0.8 is locked now");
    assert_conserved(&sw);
}

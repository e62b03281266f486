//! The forwarding core's cost per frame, with in-memory ports and nothing else: `cargo bench
//! -p sluice-switch --bench per_frame` (add `-- ROUNDS` for more rounds than 5, and a word
//! to run only the cases whose name has it).
//!
//! Each case sends the same small frame into one port over and over (the port hands it
//! out of memory, the outputs count what they are sent and keep nothing), so what is
//! measured is the switch's own work: reading the frame, learning, deciding, queueing and
//! sending it. The numbers are nanoseconds per frame on one thread, the best of the rounds
//! (the least disturbed by other work on the machine); compare them within one run or
//! between runs made in turn on the same machine. On a machine too busy for that, count
//! instructions instead: `valgrind --tool=callgrind --toggle-collect='*per_frame*pass*'
//! BENCH 1 CASE` runs one case twice (a warm-up and a round) of 200,000 frames each.

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};
use std::time::Instant;

use sluice_switch::mem::{MemHandle, mem_port};
use sluice_switch::{Mode, PortCaps, PortConfig, PortPolicy, Switch, SwitchConfig, VlanMode};
use sluice_wire::{MacAddr, VnetHdr};

const OFFLOAD: PortCaps = PortCaps { offload: true, lossless_input: false };
const FRAMES: u64 = 200_000;

fn mac(n: u8) -> [u8; 6] {
    [0x02, 0, 0, 0, 0, n]
}

/// An IPv4/UDP frame of 60 bytes of payload, tagged with `vid` if given.
fn frame(dst: [u8; 6], src: [u8; 6], sip: [u8; 4], dip: [u8; 4], vid: Option<u16>) -> Vec<u8> {
    let mut f = dst.to_vec();
    f.extend_from_slice(&src);
    if let Some(v) = vid {
        f.extend_from_slice(&[0x81, 0x00]);
        f.extend_from_slice(&v.to_be_bytes());
    }
    f.extend_from_slice(&[0x08, 0x00, 0x45, 0, 0, 88, 0, 0, 0x40, 0, 64, 17, 0, 0]);
    f.extend_from_slice(&sip);
    f.extend_from_slice(&dip);
    f.extend((0..68).map(|i| i as u8));
    f
}

struct Case {
    name: &'static str,
    sw: Switch,
    input: (u32, MemHandle),
    frame: Vec<u8>,
}

fn port(sw: &mut Switch, name: &str, vlan: VlanMode, policy: PortPolicy) -> (u32, MemHandle) {
    let (p, h) = mem_port(OFFLOAD);
    h.stop_recording();
    let id = sw.add_port(PortConfig { name: name.into(), vlan, mtu: None, policy }, Box::new(p)).unwrap();
    (id, h)
}

/// Teaches the switch where station `m` is: one broadcast from it on port `p`.
fn learn(sw: &mut Switch, p: &(u32, MemHandle), m: u8, vid: Option<u16>) {
    p.1.repeat(VnetHdr::default(), &frame([0xff; 6], mac(m), [10, 0, 0, m], [10, 0, 0, 255], vid), 1);
    while sw.on_readable(p.0, 0) {}
}

fn cases() -> Vec<Case> {
    let mut out = Vec::new();
    let v4 = |d: u8| IpAddr::V4(Ipv4Addr::new(10, 0, 0, d));

    // Known unicast between two access ports.
    let mut sw = Switch::new(SwitchConfig::default()).unwrap();
    let a = port(&mut sw, "a", VlanMode::Access(1), PortPolicy::default());
    let b = port(&mut sw, "b", VlanMode::Access(1), PortPolicy::default());
    for i in 0..4 {
        port(&mut sw, &format!("x{i}"), VlanMode::Access(1), PortPolicy::default());
    }
    learn(&mut sw, &b, 2, None);
    let f = frame(mac(2), mac(1), [10, 0, 0, 1], [10, 0, 0, 2], None);
    out.push(Case { name: "l2 unicast", sw, input: a, frame: f });

    // A broadcast to five other ports.
    let mut sw = Switch::new(SwitchConfig::default()).unwrap();
    let a = port(&mut sw, "a", VlanMode::Access(1), PortPolicy::default());
    for i in 0..5 {
        port(&mut sw, &format!("x{i}"), VlanMode::Access(1), PortPolicy::default());
    }
    let f = frame([0xff; 6], mac(1), [10, 0, 0, 1], [10, 0, 0, 255], None);
    out.push(Case { name: "l2 flood x5", sw, input: a, frame: f });

    // Tagged from a trunk to an access port, both guests locked to their MAC and address.
    let mut sw = Switch::new(SwitchConfig::default()).unwrap();
    let trunk = VlanMode::Trunk { allowed: [10, 20].into_iter().collect(), native: Some(1) };
    let lock = |m: u8| PortPolicy { mac: Some(MacAddr(mac(m))), ips: vec![v4(m)], ..PortPolicy::default() };
    let t = port(&mut sw, "t", trunk, PortPolicy::default());
    let b = port(&mut sw, "b", VlanMode::Access(10), lock(2));
    learn(&mut sw, &b, 2, None);
    let f = frame(mac(2), mac(1), [10, 0, 0, 1], [10, 0, 0, 2], Some(10));
    out.push(Case { name: "l2 trunk to locked", sw, input: t, frame: f });

    // Layer 3: a guest to a guest, MAC addresses rewritten.
    let mut sw = Switch::new(SwitchConfig { mode: Mode::L3, ..SwitchConfig::default() }).unwrap();
    let l3 = |d: u8| PortPolicy { ips: vec![v4(d)], ..PortPolicy::default() };
    let a = port(&mut sw, "a", VlanMode::Access(1), l3(1));
    let b = port(&mut sw, "b", VlanMode::Access(1), l3(2));
    learn(&mut sw, &a, 1, None);
    learn(&mut sw, &b, 2, None);
    let router = sluice_switch::DEFAULT_ROUTER_MAC.0;
    let f = frame(router, mac(1), [10, 0, 0, 1], [10, 0, 0, 2], None);
    out.push(Case { name: "l3 routed", sw, input: a, frame: f });
    out
}

/// Nanoseconds per frame for one pass of `FRAMES` frames.
fn pass(c: &mut Case) -> f64 {
    c.input.1.repeat(VnetHdr::default(), &c.frame, FRAMES);
    let start = Instant::now();
    while c.sw.on_readable(black_box(c.input.0), 1) {}
    start.elapsed().as_nanos() as f64 / FRAMES as f64
}

fn main() {
    let rounds: usize = std::env::args().skip(1).find_map(|a| a.parse().ok()).unwrap_or(5);
    let only = std::env::args().skip(1).find(|a| a.parse::<usize>().is_err()).unwrap_or_default();
    let mut cases: Vec<Case> = cases().into_iter().filter(|c| c.name.contains(only.as_str())).collect();
    for c in &mut cases {
        pass(c);
    }
    let mut best = vec![f64::MAX; cases.len()];
    for _ in 0..rounds {
        for (i, c) in cases.iter_mut().enumerate() {
            best[i] = best[i].min(pass(c));
        }
    }
    for (c, b) in cases.iter().zip(&best) {
        let p = c.sw.port_info(c.input.0).unwrap().counters;
        assert!(p.forwarded + p.flooded > 0 && p.rx_drops.total() == 0, "{}: {p:?}", c.name);
        println!("{:<20} {b:7.1} ns/frame", c.name);
    }
}

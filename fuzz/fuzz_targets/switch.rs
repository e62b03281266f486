//! Fuzzes the forwarding core as a guest reaches it: every input is a sequence of raw reads
//! (a virtio-net header and a frame, any bytes at all) arriving on six in-memory ports of a
//! switch in Layer 2 or Layer 3 mode, lossy or lossless, interleaved with the events a
//! datapath drives (outputs draining or filling up, time passing, a port leaving and coming
//! back). Besides "never panics", after every step it checks the accounting rules every
//! frame obeys (docs/stats-json.md): each received frame is forwarded, flooded, consumed,
//! held or dropped under a cause, and each copy offered to an output is sent, queued or
//! dropped — and every frame sent to a port without offloads is a plain frame that fits
//! the port's MTU.

#![no_main]

use std::net::{IpAddr, Ipv4Addr};

use libfuzzer_sys::fuzz_target;
use sluice_switch::mem::{MemHandle, mem_port};
use sluice_switch::{ClassConfig, ClassMatch, Mode, PortCaps, PortConfig, PortPolicy, Switch, SwitchConfig, VlanMode};
use sluice_wire::{MacAddr, VnetHdr};

const OFFLOAD: PortCaps = PortCaps { offload: true, lossless_input: false };
const PLAIN: PortCaps = PortCaps { offload: false, lossless_input: false };

struct Lab {
    sw: Switch,
    ports: Vec<(String, PortConfig, PortCaps, Option<u32>, MemHandle)>,
}

fn v4(d: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 0, 0, d))
}

fn lab(sel: u8) -> Lab {
    let mode = if sel & 1 == 1 { Mode::L3 } else { Mode::L2 };
    let cfg = SwitchConfig {
        mode,
        lossless: sel & 2 == 2,
        queue_len: 4,
        batch: 4,
        fib_max: 16,
        port_mac_limit: 4,
        aging_ms: 1_000,
        // Held lists of 1 to 4 frames, a watchdog that fires within the run, and (some
        // runs) classes by DSCP and PCP, one of them lossy.
        hold_len: 1 + usize::from((sel >> 2) & 3),
        watchdog_ms: 50,
        classes: if sel & 16 == 16 {
            vec![
                ClassConfig { name: "voice".into(), matches: ClassMatch::Dscp(46), lossless: true, queue_len: Some(2) },
                ClassConfig { name: "bulk".into(), matches: ClassMatch::Pcp(1), lossless: false, queue_len: None },
                ClassConfig { name: "rest".into(), matches: ClassMatch::Any, lossless: sel & 2 == 2, queue_len: None },
            ]
        } else {
            Vec::new()
        },
        ..SwitchConfig::default()
    };
    let mut sw = Switch::new(cfg).unwrap();
    let trunk = if mode == Mode::L2 {
        VlanMode::Trunk { allowed: [1, 2, 3].into_iter().collect(), native: Some(1) }
    } else {
        VlanMode::Access(1)
    };
    let specs: Vec<(&str, VlanMode, Option<u16>, PortPolicy, PortCaps, Option<MacAddr>)> = vec![
        ("a", VlanMode::Access(1), None, PortPolicy { ips: vec![v4(1)], ..Default::default() }, OFFLOAD, None),
        ("b", VlanMode::Access(1), Some(1280), PortPolicy::default(), PLAIN, None),
        ("t", trunk, Some(9000), PortPolicy::default(), OFFLOAD, None),
        (
            "i",
            VlanMode::Access(1),
            None,
            PortPolicy {
                isolated: true,
                mac: Some(MacAddr([2, 0, 0, 0, 0, 4])),
                ips: vec![v4(4)],
                ..Default::default()
            },
            PLAIN,
            None,
        ),
        (
            "up",
            VlanMode::Access(1),
            None,
            PortPolicy { uplink: true, ..Default::default() },
            OFFLOAD,
            Some(MacAddr([2, 0xee, 0, 0, 0, 1])),
        ),
        (
            "m",
            VlanMode::Access(1),
            None,
            PortPolicy { mirror_of: vec!["a".into(), "b".into()], ..Default::default() },
            PLAIN,
            None,
        ),
    ];
    let mut ports = Vec::new();
    for (name, vlan, mtu, policy, caps, mac) in specs {
        let cfg = PortConfig { name: name.into(), vlan, mtu, policy };
        let (p, h) = mem_port(caps);
        h.set_mac(mac);
        let id = sw.add_port(cfg.clone(), Box::new(p)).unwrap();
        ports.push((name.to_string(), cfg, caps, Some(id), h));
    }
    Lab { sw, ports }
}

fn check(l: &Lab) {
    if let Err(e) = l.sw.check_accounting() {
        panic!("{e}");
    }
}

fn drain(l: &Lab, at: usize) {
    let (_, cfg, caps, _, h) = &l.ports[at];
    for (vnet, frame) in h.take_sent() {
        if !caps.offload {
            assert!(!vnet.is_gso() && !vnet.needs_csum(), "port {} without offloads got {vnet:?}", cfg.name);
            let mtu = usize::from(cfg.mtu.unwrap_or(1500));
            // Ethernet header and up to two VLAN tags around an MTU-sized packet.
            assert!(frame.len() <= mtu + 14 + 8, "port {} (MTU {mtu}) got a {}-byte frame", cfg.name, frame.len());
        }
    }
}

fuzz_target!(init: {
    // Every run builds a switch whose frame pool is a few MB; keep freed memory in the
    // process so that each run does not fault it in afresh (a 3x faster target).
    // SAFETY: mallopt only tunes glibc's allocator; called once before any run.
    unsafe {
        libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 30);
        libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 30);
    }
}, |data: &[u8]| {
    let Some((&sel, mut rest)) = data.split_first() else { return };
    let mut l = lab(sel);
    let mut now = 0u64;
    // Each step: an op byte, then for a read a 2-byte length and that many bytes.
    while let Some((&op, r)) = rest.split_first() {
        rest = r;
        let at = usize::from(op >> 4) % l.ports.len();
        match op & 0xf {
            0..=7 => {
                let [a, b, r @ ..] = rest else { return };
                let len = usize::from(u16::from_le_bytes([*a, *b])).min(r.len());
                let (bytes, r) = r.split_at(len);
                rest = r;
                let (_, _, _, id, h) = &l.ports[at];
                if let Some(id) = *id {
                    h.inject_raw(bytes);
                    while l.sw.on_readable(id, now) {}
                }
            }
            8 => drain(&l, at),
            9 => l.ports[at].4.set_tx_limit(Some(1)),
            10 => l.ports[at].4.set_tx_limit(None),
            11 => {
                if let Some(id) = l.ports[at].3 {
                    l.sw.on_writable(id);
                }
            }
            12 => {
                now += 700;
                l.sw.expire(now);
            }
            13 => {
                // The port leaves, or comes back.
                let (name, cfg, caps, id, _) = &mut l.ports[at];
                if id.is_some() {
                    l.sw.remove_port(name).unwrap();
                    *id = None;
                } else {
                    // It may not come back: in Layer 3 mode another port may have taken
                    // one of its addresses meanwhile (the switch refuses it, rightly).
                    let (p, h) = mem_port(*caps);
                    if let Ok(new) = l.sw.add_port(cfg.clone(), Box::new(p)) {
                        *id = Some(new);
                        l.ports[at].4 = h;
                    }
                }
            }
            14 => {
                let _ = l.sw.add_static_mac(1, MacAddr([2, 0, 0, 0, 0, op]), &l.ports[at].0.clone());
            }
            _ => {
                let (_, _, _, id, h) = &l.ports[at];
                if let Some(id) = *id {
                    h.inject(VnetHdr::default(), &[0xff; 60]);
                    while l.sw.on_readable(id, now) {}
                }
            }
        }
        check(&l);
    }
    for at in 0..l.ports.len() {
        drain(&l, at);
    }
});

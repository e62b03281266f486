//! Lossless without head-of-line blocking (issue 17), stepped through with in-memory
//! ports: a full output holds back only the frames that go to it, order per input and
//! output holds, the pause watchdog fires and recovers, traffic classes by PCP, DSCP and
//! port, and the counters conserve throughout.

mod common;

use common::*;
use sluice_switch::{ClassConfig, ClassMatch, Switch, SwitchConfig, WatchdogEvent};
use sluice_wire::VnetHdr;

/// A frame to `dst` whose payload length says which it is (`n`).
fn numbered(dst: u8, src: u8, n: usize) -> Vec<u8> {
    eth(mac(dst), mac(src), 0x0800, 60 + n)
}

/// The numbers of the frames a port was sent, in order.
fn numbers(h: &sluice_switch::mem::MemHandle) -> Vec<usize> {
    h.take_sent().iter().map(|(_, f)| f.len() - 14 - 60).collect()
}

/// A lossless switch with ports a, b, c (stations 1, 2, 3 learned) and output queues of 4.
fn abc(extra: SwitchConfig) -> (Switch, Vec<(u32, sluice_switch::mem::MemHandle)>) {
    let mut sw = Switch::new(SwitchConfig { lossless: true, queue_len: 4, ..extra }).unwrap();
    let p: Vec<_> = ["a", "b", "c"].iter().map(|n| add(&mut sw, n, access(1), None, OFFLOAD)).collect();
    for (i, (id, h)) in p.iter().enumerate() {
        send(&mut sw, *id, h, &eth(BCAST, mac(i as u8 + 1), 0x0806, 28), 0);
    }
    for (_, h) in &p {
        h.take_sent();
    }
    (sw, p)
}

#[test]
fn a_full_output_holds_back_only_the_frames_that_go_to_it() {
    let (mut sw, p) = abc(SwitchConfig { hold_len: 64, ..cfg() });
    let (a, b, c) = (&p[0], &p[1], &p[2]);
    b.1.set_tx_limit(Some(0));
    // a sends 40 frames, alternately to b (never drains) and to c.
    for n in 0..40 {
        a.1.inject(VnetHdr::default(), &numbered(if n % 2 == 0 { 2 } else { 3 }, 1, n));
    }
    while sw.on_readable(a.0, 1) {}
    assert_eq!(a.1.pending(), 0, "the input was read to the end: not paused");
    assert_eq!(numbers(&c.1), (0..40).filter(|n| n % 2 == 1).collect::<Vec<_>>(), "c got all of its frames, in order");
    let (ia, ib) = (sw.port_info(a.0).unwrap(), sw.port_info(b.0).unwrap());
    assert_eq!((ib.queued, ia.held), (4, 16), "b's frames wait: 4 in its queue, 16 held at a");
    assert_eq!(ia.counters.pauses, 0);
    assert!(sw.interest(a.0).read);
    assert_eq!(ib.counters.tx_drops.total() + ia.counters.rx_drops.total(), 0, "nothing dropped");
    assert_conserved(&sw);

    // b drains: every frame reaches it, in order.
    b.1.set_tx_limit(None);
    sw.on_writable(b.0);
    assert_eq!(numbers(&b.1), (0..40).filter(|n| n % 2 == 0).collect::<Vec<_>>());
    assert_eq!(sw.port_info(a.0).unwrap().held, 0);
    assert_conserved(&sw);
}

#[test]
fn a_full_held_list_pauses_the_input_until_the_output_drains() {
    let (mut sw, p) = abc(SwitchConfig { hold_len: 3, ..cfg() });
    let (a, b) = (&p[0], &p[1]);
    b.1.set_tx_limit(Some(0));
    for n in 0..10 {
        a.1.inject(VnetHdr::default(), &numbered(2, 1, n));
    }
    while sw.on_readable(a.0, 1) {}
    let ia = sw.port_info(a.0).unwrap();
    assert_eq!((ia.held, ia.counters.pauses, a.1.pending()), (3, 1, 3), "4 queued, 3 held, then paused");
    assert!(!sw.interest(a.0).read);
    b.1.set_tx_limit(None);
    sw.on_writable(b.0);
    assert!(sw.interest(a.0).read, "read again once the held frames moved");
    while sw.on_readable(a.0, 2) {}
    assert_eq!(numbers(&b.1), (0..10).collect::<Vec<_>>());
    assert_conserved(&sw);
}

/// A small deterministic generator (xorshift) for the property test.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

#[test]
fn order_per_input_and_output_holds_and_nothing_is_lost_under_random_fullness() {
    for seed in 1..=40u64 {
        let mut r = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let hold_len = 1 + (r.next() % 8) as usize;
        let (mut sw, p) = abc(SwitchConfig { hold_len, ..cfg() });
        let mut want: [Vec<usize>; 3] = Default::default();
        let mut got: [Vec<usize>; 3] = Default::default();
        let mut n = 0;
        let mut src_of: Vec<u8> = Vec::new();
        for step in 0..400u64 {
            // Outputs fill and drain at random.
            for (i, (id, h)) in p.iter().enumerate() {
                match r.next() % 5 {
                    0 => h.set_tx_limit(Some(0)),
                    1 => {
                        h.set_tx_limit(None);
                        sw.on_writable(*id);
                    }
                    _ => {}
                }
                got[i].extend(numbers(h));
            }
            // Some frames from a random input to a random other station, or a broadcast.
            let from = (r.next() % 3) as usize;
            for _ in 0..r.next() % 6 {
                let to = (from + 1 + (r.next() % 2) as usize) % 3;
                let frame = if r.next().is_multiple_of(10) {
                    for (i, w) in want.iter_mut().enumerate() {
                        if i != from {
                            w.push(n);
                        }
                    }
                    let mut f = numbered(0, from as u8 + 1, n);
                    f[..6].copy_from_slice(&BCAST);
                    f
                } else {
                    want[to].push(n);
                    numbered(to as u8 + 1, from as u8 + 1, n)
                };
                p[from].1.inject(VnetHdr::default(), &frame);
                src_of.push(from as u8);
                n += 1;
            }
            while sw.on_readable(p[from].0, step) {}
            assert_conserved(&sw);
        }
        // Everything drains at the end.
        for _ in 0..50 {
            for (i, (id, h)) in p.iter().enumerate() {
                h.set_tx_limit(None);
                sw.on_writable(*id);
                while sw.on_readable(*id, 500) {}
                got[i].extend(numbers(h));
            }
        }
        for i in 0..3 {
            let mut g = got[i].clone();
            let mut w = want[i].clone();
            // Per output, each input's frames in the order that input sent them (frame
            // numbers grow with time).
            for from in 0..3u8 {
                let mine: Vec<usize> = g.iter().copied().filter(|&x| src_of[x] == from).collect();
                assert!(mine.windows(2).all(|p| p[0] < p[1]), "seed {seed}: output {i}, input {from}: {mine:?}");
            }
            assert_eq!(g.len(), w.len(), "seed {seed}: output {i} got every frame for it, none twice");
            g.sort_unstable();
            w.sort_unstable();
            assert_eq!(g, w, "seed {seed}: output {i}");
        }
        assert_conserved(&sw);
        let drops: u64 = sw.ports().iter().map(|i| i.counters.rx_drops.total() + i.counters.tx_drops.total()).sum();
        assert_eq!(drops, 0, "seed {seed}: lossless");
    }
}

#[test]
fn the_watchdog_declares_a_stuck_output_drops_toward_it_and_recovers_when_it_sends() {
    let (mut sw, p) = abc(SwitchConfig { hold_len: 64, watchdog_ms: 200, ..cfg() });
    let (a, b, c) = (&p[0], &p[1], &p[2]);
    b.1.set_tx_limit(Some(0));
    for n in 0..20 {
        a.1.inject(VnetHdr::default(), &numbered(if n % 2 == 0 { 2 } else { 3 }, 1, n));
    }
    while sw.on_readable(a.0, 1000) {}
    assert_eq!(sw.port_info(a.0).unwrap().held, 6);
    assert_eq!(sw.next_deadline_ms(), Some(1200), "the driver is told when to look");
    let mut events = Vec::new();
    sw.expire(1199);
    sw.take_watchdog_events(|e| events.push(e));
    assert!(events.is_empty(), "not yet");
    sw.expire(1200);
    sw.take_watchdog_events(|e| events.push(e));
    assert_eq!(events, [WatchdogEvent { port: b.0, class: "default".into(), stuck: true }]);
    let (ia, ib) = (sw.port_info(a.0).unwrap(), sw.port_info(b.0).unwrap());
    assert_eq!(ia.held, 0, "the frames held for it went");
    assert_eq!(ib.queued, 1, "one frame is still offered");
    assert_eq!(ib.counters.tx_drops.watchdog, 9, "3 queued behind it and 6 held");
    assert_eq!((ib.classes[0].stuck, ib.classes[0].counters.watchdog_trips), (true, 1));
    assert_eq!(numbers(&c.1).len(), 10, "c got all of its frames");
    assert_conserved(&sw);

    // While stuck, its frames are dropped at once; the input is never held.
    for n in 20..30 {
        a.1.inject(VnetHdr::default(), &numbered(2, 1, n));
    }
    while sw.on_readable(a.0, 1300) {}
    let ib = sw.port_info(b.0).unwrap();
    assert_eq!((sw.port_info(a.0).unwrap().held, ib.counters.tx_drops.watchdog), (0, 19));
    assert_eq!(sw.next_deadline_ms(), None, "nothing to watch while it is declared stuck");
    sw.expire(5000);
    sw.take_watchdog_events(|e| events.push(e));
    assert_eq!(events.len(), 1, "logged once");

    // It sends again: it recovers by itself, and its frames queue and go as before.
    b.1.set_tx_limit(None);
    sw.on_writable(b.0);
    sw.take_watchdog_events(|e| events.push(e));
    assert_eq!(events[1], WatchdogEvent { port: b.0, class: "default".into(), stuck: false });
    assert_eq!(numbers(&b.1), [0]);
    send(&mut sw, a.0, &a.1, &numbered(2, 1, 99), 5001);
    assert_eq!(numbers(&b.1), [99]);
    assert!(!sw.port_info(b.0).unwrap().classes[0].stuck);
    assert_conserved(&sw);
}

#[test]
fn the_watchdog_can_be_turned_off() {
    let (mut sw, p) = abc(SwitchConfig { hold_len: 64, watchdog_ms: 0, ..cfg() });
    p[1].1.set_tx_limit(Some(0));
    for n in 0..10 {
        p[0].1.inject(VnetHdr::default(), &numbered(2, 1, n));
    }
    while sw.on_readable(p[0].0, 0) {}
    sw.expire(1_000_000);
    assert_eq!(sw.next_deadline_ms(), None);
    let ib = sw.port_info(p[1].0).unwrap();
    assert_eq!((ib.queued, ib.counters.tx_drops.total()), (4, 0));
}

/// An IPv4 frame (to station `dst`) with the given TOS byte.
fn ipv4(dst: u8, src: u8, tos: u8) -> Vec<u8> {
    let mut f = eth(mac(dst), mac(src), 0x0800, 40);
    f[14] = 0x45;
    f[15] = tos;
    f
}

/// A priority-tagged (VLAN 0) copy of `frame` with 802.1p priority `pcp`.
fn priority(frame: &[u8], pcp: u8) -> Vec<u8> {
    let mut f = tag(frame, 0);
    f[14] |= pcp << 5;
    f
}

fn class(name: &str, matches: ClassMatch, lossless: bool) -> ClassConfig {
    ClassConfig { name: name.into(), matches, lossless, queue_len: None }
}

#[test]
fn classes_are_taken_by_dscp_pcp_and_port_and_keep_queues_of_their_own() {
    let classes = vec![
        class("voice", ClassMatch::Dscp(46), true),
        class("storage", ClassMatch::Pcp(3), true),
        class("bulk", ClassMatch::Port("c".into()), false),
        class("rest", ClassMatch::Any, true),
    ];
    let (mut sw, p) = abc(SwitchConfig { hold_len: 64, classes, ..cfg() });
    let (a, b, c) = (&p[0], &p[1], &p[2]);
    let rx = |sw: &Switch, id: u32| -> Vec<u64> {
        sw.port_info(id).unwrap().classes.iter().map(|k| k.counters.rx_frames).collect()
    };
    let base = rx(&sw, a.0);
    send(&mut sw, a.0, &a.1, &ipv4(2, 1, 46 << 2), 1);
    send(&mut sw, a.0, &a.1, &priority(&ipv4(2, 1, 0), 3), 1);
    send(&mut sw, a.0, &a.1, &ipv4(2, 1, 0), 1);
    let after = rx(&sw, a.0);
    assert_eq!(after.iter().zip(&base).map(|(x, y)| x - y).collect::<Vec<_>>(), [1, 1, 0, 1]);
    send(&mut sw, c.0, &c.1, &ipv4(2, 3, 0), 1);
    assert_eq!(rx(&sw, c.0)[2], 2, "c's frames are bulk (its ARP too)");
    let ib = sw.port_info(b.0).unwrap();
    let tx: Vec<u64> = ib.classes.iter().map(|k| k.counters.tx_frames).collect();
    // voice and storage: a's; bulk: c's ARP and its frame; rest: a's ARP and its frame.
    assert_eq!(tx, [1, 1, 2, 2]);
    b.1.take_sent();

    // b stops: a's lossless frames wait, c's bulk frames are dropped once bulk's queue is
    // full — in the same output, each class in its own queue.
    b.1.set_tx_limit(Some(0));
    for _ in 0..8 {
        a.1.inject(VnetHdr::default(), &ipv4(2, 1, 0));
        c.1.inject(VnetHdr::default(), &ipv4(2, 3, 0));
    }
    while sw.on_readable(a.0, 2) {}
    while sw.on_readable(c.0, 2) {}
    let ib = sw.port_info(b.0).unwrap();
    let queued: Vec<usize> = ib.classes.iter().map(|k| k.queued).collect();
    assert_eq!(queued, [0, 0, 4, 4]);
    assert_eq!(ib.classes[2].counters.tx_drops.queue_full, 4, "the lossy class drops");
    assert_eq!(ib.classes[3].counters.tx_drops.total(), 0);
    assert_eq!(sw.port_info(a.0).unwrap().held, 4, "the lossless class waits");
    assert_conserved(&sw);
    b.1.set_tx_limit(None);
    sw.on_writable(b.0);
    assert_eq!(b.1.take_sent().len(), 12, "4 bulk, 8 rest");
    assert_conserved(&sw);
}

#[test]
fn bad_classes_are_refused_when_the_switch_is_made() {
    let many = (0..9).map(|i| class(&format!("c{i}"), ClassMatch::Any, true)).collect();
    let e = Switch::new(SwitchConfig { classes: many, ..cfg() }).unwrap_err();
    assert!(e.to_string().contains("at most 8"), "{e}");
    let e = Switch::new(SwitchConfig { classes: vec![class("x", ClassMatch::Pcp(9), true)], ..cfg() }).unwrap_err();
    assert!(e.to_string().contains("pcp 9"), "{e}");
}

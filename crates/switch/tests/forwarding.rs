//! The forwarding core stepped through with in-memory ports: learning, aging, flooding,
//! VLANs, MTU, the lossless rule, malformed input, offloads and counter conservation.

mod common;

use common::*;
use sluice_switch::{Interest, Switch, SwitchConfig};
use sluice_wire::VnetHdr;

fn three_ports() -> (Switch, Vec<(u32, sluice_switch::mem::MemHandle)>) {
    let mut sw = Switch::new(cfg()).unwrap();
    let ports = (1..=3).map(|i| add(&mut sw, &format!("p{i}"), access(1), None, OFFLOAD)).collect();
    (sw, ports)
}

#[test]
fn unknown_unicast_floods_then_learned_reply_is_unicast() {
    let (mut sw, p) = three_ports();
    send(&mut sw, p[0].0, &p[0].1, &eth(mac(2), mac(1), 0x0800, 50), 0);
    assert_eq!(p[1].1.take_sent().len(), 1);
    assert_eq!(p[2].1.take_sent().len(), 1);
    assert!(p[0].1.take_sent().is_empty(), "never back out of the input port");

    send(&mut sw, p[1].0, &p[1].1, &eth(mac(1), mac(2), 0x0800, 50), 1);
    assert_eq!(p[0].1.take_sent().len(), 1);
    assert!(p[2].1.take_sent().is_empty(), "the reply goes to the learned port only");

    send(&mut sw, p[0].0, &p[0].1, &eth(mac(2), mac(1), 0x0800, 50), 2);
    assert_eq!(p[1].1.take_sent().len(), 1);
    assert!(p[2].1.take_sent().is_empty());
    let c = sw.port_info(p[0].0).unwrap().counters;
    assert_eq!((c.flooded, c.forwarded), (1, 1));
    assert_conserved(&sw);
}

#[test]
fn learned_entries_age_out_and_flooding_resumes() {
    let mut sw = Switch::new(SwitchConfig { aging_ms: 1000, ..cfg() }).unwrap();
    let a = add(&mut sw, "a", access(1), None, OFFLOAD);
    let b = add(&mut sw, "b", access(1), None, OFFLOAD);
    let c = add(&mut sw, "c", access(1), None, OFFLOAD);
    send(&mut sw, b.0, &b.1, &eth(BCAST, mac(2), 0x0806, 28), 0);
    a.1.take_sent();
    c.1.take_sent();
    send(&mut sw, a.0, &a.1, &eth(mac(2), mac(1), 0x0800, 50), 900);
    assert!(c.1.take_sent().is_empty(), "mac(2) still known at 900 ms");
    sw.expire(2000);
    assert!(sw.fib().entries().iter().all(|e| e.1 != sluice_wire::MacAddr(mac(2))));
    send(&mut sw, a.0, &a.1, &eth(mac(2), mac(1), 0x0800, 50), 2000);
    assert_eq!(c.1.take_sent().len(), 1, "aged out: flooded again");
}

#[test]
fn static_entry_directs_traffic_without_learning() {
    let (mut sw, p) = three_ports();
    sw.add_static_mac(1, sluice_wire::MacAddr(mac(9)), "p3").unwrap();
    send(&mut sw, p[0].0, &p[0].1, &eth(mac(9), mac(1), 0x0800, 50), 0);
    assert!(p[1].1.take_sent().is_empty());
    assert_eq!(p[2].1.take_sent().len(), 1);
    assert!(sw.add_static_mac(1, sluice_wire::MacAddr(mac(9)), "nope").is_err());
}

#[test]
fn broadcast_reaches_every_other_port_and_any_ethertype_passes() {
    let (mut sw, p) = three_ports();
    for ethertype in [0x0806u16, 0x0800, 0x86dd, 0x88b5, 0x0042] {
        send(&mut sw, p[0].0, &p[0].1, &eth(BCAST, mac(1), ethertype, 46), 0);
        for (_, h) in &p[1..] {
            let sent = h.take_sent();
            assert_eq!(sent.len(), 1, "ethertype {ethertype:#06x}");
            assert_eq!(&sent[0].1[12..14], &ethertype.to_be_bytes());
        }
    }
    send(&mut sw, p[1].0, &p[1].1, &eth(mac(1), mac(2), 0x88b5, 46), 0);
    assert_eq!(p[0].1.take_sent()[0].1, eth(mac(1), mac(2), 0x88b5, 46), "non-IP unicast intact");
    assert_conserved(&sw);
}

#[test]
fn access_ports_keep_vlans_apart() {
    let mut sw = Switch::new(cfg()).unwrap();
    let a10 = add(&mut sw, "a10", access(10), None, OFFLOAD);
    let b10 = add(&mut sw, "b10", access(10), None, OFFLOAD);
    let c20 = add(&mut sw, "c20", access(20), None, OFFLOAD);
    send(&mut sw, a10.0, &a10.1, &eth(BCAST, mac(1), 0x0806, 28), 0);
    assert_eq!(b10.1.take_sent().len(), 1);
    assert!(c20.1.take_sent().is_empty());
    // Unicast to a MAC learned in VLAN 10, from VLAN 20: unknown there, and no other
    // port is in VLAN 20.
    send(&mut sw, c20.0, &c20.1, &eth(mac(1), mac(3), 0x0800, 50), 0);
    assert!(a10.1.take_sent().is_empty());
    assert_eq!(sw.port_info(c20.0).unwrap().counters.rx_drops.unknown_port, 1);
    // A tagged frame on an access port is refused.
    send(&mut sw, a10.0, &a10.1, &tag(&eth(BCAST, mac(1), 0x0806, 28), 20), 0);
    assert!(c20.1.take_sent().is_empty());
    assert_eq!(sw.port_info(a10.0).unwrap().counters.rx_drops.vlan_filter, 1);
    assert_conserved(&sw);
}

#[test]
fn trunk_carries_allowed_vlans_tagged_and_the_native_untagged() {
    let mut sw = Switch::new(cfg()).unwrap();
    let t = add(&mut sw, "trunk", trunk(&[10, 20], Some(1)), None, OFFLOAD);
    let a10 = add(&mut sw, "a10", access(10), None, OFFLOAD);
    let a1 = add(&mut sw, "a1", access(1), None, OFFLOAD);
    let a30 = add(&mut sw, "a30", access(30), None, OFFLOAD);

    // Tagged 10 in → untagged out of the VLAN 10 access port only.
    let plain = eth(BCAST, mac(1), 0x0800, 46);
    send(&mut sw, t.0, &t.1, &tag(&plain, 10), 0);
    assert_eq!(a10.1.take_sent()[0].1, plain);
    assert!(a1.1.take_sent().is_empty() && a30.1.take_sent().is_empty());

    // Access 10 → trunk, tagged 10.
    send(&mut sw, a10.0, &a10.1, &eth(BCAST, mac(2), 0x0800, 46), 0);
    assert_eq!(t.1.take_sent()[0].1, tag(&eth(BCAST, mac(2), 0x0800, 46), 10));

    // Untagged on the trunk is the native VLAN 1, and leaves it untagged.
    send(&mut sw, t.0, &t.1, &plain, 0);
    assert_eq!(a1.1.take_sent()[0].1, plain);
    send(&mut sw, a1.0, &a1.1, &eth(BCAST, mac(4), 0x0800, 46), 0);
    assert_eq!(t.1.take_sent()[0].1, eth(BCAST, mac(4), 0x0800, 46));

    // A VLAN the trunk does not allow: dropped on the way in, never sent out.
    send(&mut sw, t.0, &t.1, &tag(&plain, 30), 0);
    assert!(a30.1.take_sent().is_empty());
    assert_eq!(sw.port_info(t.0).unwrap().counters.rx_drops.vlan_filter, 1);
    send(&mut sw, a30.0, &a30.1, &eth(BCAST, mac(5), 0x0800, 46), 0);
    assert!(t.1.take_sent().is_empty());
    assert_conserved(&sw);
}

#[test]
fn frames_over_the_output_mtu_are_dropped_gso_by_segment_size() {
    let mut sw = Switch::new(SwitchConfig { mtu: 1500, ..cfg() }).unwrap();
    let a = add(&mut sw, "a", access(1), Some(8992), OFFLOAD);
    let b = add(&mut sw, "b", access(1), Some(1492), OFFLOAD);
    send(&mut sw, a.0, &a.1, &eth(BCAST, mac(1), 0x0800, 1492), 0);
    assert_eq!(b.1.take_sent().len(), 1, "exactly the MTU passes");
    send(&mut sw, a.0, &a.1, &eth(BCAST, mac(1), 0x0800, 1493), 0);
    assert!(b.1.take_sent().is_empty());
    assert_eq!(sw.port_info(b.0).unwrap().counters.tx_drops.over_mtu, 1);

    // GSO: 40 bytes of headers + 1452 of segment = 1492 fits, 1453 does not.
    let (v, f) = tcp4(mac(2), mac(1), 20_000, Some(1452));
    a.1.inject(v, &f);
    sw.on_readable(a.0, 0);
    assert_eq!(b.1.take_sent().len(), 1);
    let (v, f) = tcp4(mac(2), mac(1), 20_000, Some(1453));
    a.1.inject(v, &f);
    sw.on_readable(a.0, 0);
    assert!(b.1.take_sent().is_empty());
    assert_eq!(sw.port_info(b.0).unwrap().counters.tx_drops.over_mtu, 2);

    // Jumbo: 8900 bytes of ICMP-sized payload crosses an 8992 port.
    send(&mut sw, b.0, &b.1, &eth(mac(1), mac(2), 0x0800, 1000), 0);
    a.1.take_sent();
    let c = add(&mut sw, "c", access(1), Some(8992), OFFLOAD);
    send(&mut sw, a.0, &a.1, &eth(BCAST, mac(1), 0x0800, 8928), 0);
    assert_eq!(c.1.take_sent()[0].1.len(), 14 + 8928);
    assert_conserved(&sw);
}

fn stuck_output(
    lossless: bool,
) -> (Switch, (u32, sluice_switch::mem::MemHandle), (u32, sluice_switch::mem::MemHandle)) {
    // One held frame per input: zOVN's Algorithm 1 as the seed states it.
    let mut sw = Switch::new(SwitchConfig { lossless, queue_len: 4, batch: 64, hold_len: 1, ..cfg() }).unwrap();
    let a = add(&mut sw, "a", access(1), None, OFFLOAD);
    let b = add(&mut sw, "b", access(1), None, OFFLOAD);
    // Teach the switch where mac(2) is, then make b unable to take frames.
    send(&mut sw, b.0, &b.1, &eth(BCAST, mac(2), 0x0806, 28), 0);
    a.1.take_sent();
    b.1.set_tx_limit(Some(0));
    for i in 0..10 {
        a.1.inject(VnetHdr::default(), &eth(mac(2), mac(1), 0x0800, 100 + i));
    }
    sw.on_readable(a.0, 1);
    (sw, a, b)
}

#[test]
fn lossy_mode_drops_and_counts_when_an_output_is_full() {
    let (sw, a, b) = stuck_output(false);
    let info = sw.port_info(b.0).unwrap();
    assert_eq!(info.queued, 4);
    assert_eq!(info.counters.tx_drops.queue_full, 6);
    assert_eq!(a.1.pending(), 0, "the input was read to the end");
    assert!(sw.interest(b.0).write, "waits for the output to drain");
    assert_conserved(&sw);
}

#[test]
fn lossless_mode_holds_the_input_instead_of_dropping() {
    let (mut sw, a, b) = stuck_output(true);
    let info_b = sw.port_info(b.0).unwrap();
    let info_a = sw.port_info(a.0).unwrap();
    assert_eq!(info_b.queued, 4);
    assert_eq!(info_b.counters.tx_drops.total(), 0);
    assert_eq!(info_a.held, 1);
    assert_eq!(info_a.counters.pauses, 1);
    assert_eq!(a.1.pending(), 5, "the paused input is not read");
    assert_eq!(sw.interest(a.0), Interest { read: false, write: false });
    let mut changes = vec![];
    sw.take_interest_changes(|id, i| changes.push((id, i)));
    assert!(changes.contains(&(a.0, Interest { read: false, write: false })));
    assert_conserved(&sw);

    // The output drains: the held frame moves and the input is read again.
    b.1.set_tx_limit(None);
    sw.on_writable(b.0);
    assert!(sw.interest(a.0).read);
    while a.1.pending() > 0 {
        sw.on_readable(a.0, 2);
    }
    let got: Vec<usize> = b.1.take_sent().iter().map(|(_, f)| f.len() - 14).collect();
    assert_eq!(got, (100..110).collect::<Vec<_>>(), "all ten, in order");
    let c = sw.port_info(b.0).unwrap().counters;
    assert_eq!(c.tx_drops.total(), 0);
    assert_conserved(&sw);
}

#[test]
fn malformed_frames_are_counted_and_dropped() {
    let (mut sw, p) = three_ports();
    let (a, h) = (p[0].0, &p[0].1);
    h.inject_raw(&[0u8; 12 + 10]); // runt
    let mut bad = [0u8; 12];
    VnetHdr { gso_type: 7, gso_size: 1000, ..VnetHdr::default() }.emit(&mut bad);
    let mut raw = bad.to_vec();
    raw.extend(eth(BCAST, mac(1), 0x0800, 100));
    h.inject_raw(&raw); // unknown GSO type
    VnetHdr { flags: VnetHdr::F_NEEDS_CSUM, csum_start: 200, csum_offset: 16, ..VnetHdr::default() }.emit(&mut bad);
    let mut raw = bad.to_vec();
    raw.extend(eth(BCAST, mac(1), 0x0800, 100));
    h.inject_raw(&raw); // checksum offsets beyond the frame
    h.inject_raw(&[0u8; 5]); // shorter than the virtio header
    h.inject(VnetHdr::default(), &eth(BCAST, BCAST, 0x0800, 100)); // group source
    h.inject(VnetHdr::default(), &eth(BCAST, mac(1), 0x0800, 70_000)); // larger than any buffer
    let (mut v, f) = tcp4(mac(2), mac(1), 3000, Some(1000));
    v.gso_type = VnetHdr::GSO_TCPV6; // says IPv6, carries IPv4
    h.inject(v, &f);
    while sw.on_readable(a, 0) {}
    assert_eq!(sw.port_info(a).unwrap().counters.rx_drops.malformed, 7);
    assert!(p[1].1.take_sent().is_empty());
    // The switch still forwards afterwards.
    send(&mut sw, a, h, &eth(BCAST, mac(1), 0x0800, 100), 0);
    assert_eq!(p[1].1.take_sent().len(), 1);
    assert_conserved(&sw);
}

#[test]
fn gso_frames_cross_whole_to_offload_ports_and_are_segmented_for_others() {
    let mut sw = Switch::new(cfg()).unwrap();
    let a = add(&mut sw, "a", access(1), None, OFFLOAD);
    let fast = add(&mut sw, "fast", access(1), None, OFFLOAD);
    let slow = add(&mut sw, "slow", access(1), None, NO_OFFLOAD);
    let (v, f) = tcp4(BCAST, mac(1), 10_000, Some(1448));
    a.1.inject(v, &f);
    sw.on_readable(a.0, 0);

    let whole = fast.1.take_sent();
    assert_eq!(whole.len(), 1);
    assert_eq!(whole[0].0.gso_type, VnetHdr::GSO_TCPV4);
    assert_eq!(whole[0].1, f);
    assert_eq!(sw.port_info(fast.0).unwrap().counters.tx_gso, 1);

    let segs = slow.1.take_sent();
    assert_eq!(segs.len(), 7, "10000 bytes / 1448 per segment");
    let mut seq = 0x1000u32; // the builder's initial sequence number
    let mut total = 0;
    for (vnet, s) in &segs {
        assert_eq!(*vnet, VnetHdr::default(), "segments need no offload");
        assert!(s.len() <= 14 + 1500);
        assert!(tcp4_checksums_ok(s), "segment checksums");
        let this_seq = u32::from_be_bytes(s[38..42].try_into().unwrap());
        assert_eq!(this_seq, seq);
        seq += (s.len() - 54) as u32;
        total += s.len() - 54;
    }
    assert_eq!(total, 10_000);
    let c = sw.port_info(slow.0).unwrap().counters;
    assert_eq!((c.tx_segmented, c.tx_segments, c.tx_frames), (1, 7, 1));
    assert_conserved(&sw);
}

#[test]
fn partial_checksums_are_completed_for_ports_without_offload() {
    let mut sw = Switch::new(cfg()).unwrap();
    let a = add(&mut sw, "a", access(1), None, OFFLOAD);
    let slow = add(&mut sw, "slow", access(1), None, NO_OFFLOAD);
    let fast = add(&mut sw, "fast", access(1), None, OFFLOAD);
    let (v, f) = tcp4(BCAST, mac(1), 500, None);
    a.1.inject(v, &f);
    sw.on_readable(a.0, 0);
    let s = slow.1.take_sent();
    assert!(tcp4_checksums_ok(&s[0].1));
    assert_eq!(s[0].0, VnetHdr::default());
    // The other output gets either the partial frame or the completed one, both valid.
    let (fv, ff) = &fast.1.take_sent()[0];
    assert!(fv.needs_csum() || tcp4_checksums_ok(ff));
}

#[test]
fn a_gso_frame_tagged_on_a_trunk_keeps_correct_offsets() {
    let mut sw = Switch::new(cfg()).unwrap();
    let t = add(&mut sw, "t", trunk(&[10], None), None, OFFLOAD);
    let acc = add(&mut sw, "acc", access(10), None, OFFLOAD);
    let slow = add(&mut sw, "slow", access(10), None, NO_OFFLOAD);
    let (mut v, f) = tcp4(BCAST, mac(1), 5000, Some(1448));
    v.csum_start += 4;
    v.hdr_len += 4;
    t.1.inject(v, &tag(&f, 10));
    sw.on_readable(t.0, 0);
    let (av, af) = &acc.1.take_sent()[0];
    assert_eq!(af, &f, "untagged at the access port");
    assert_eq!((av.csum_start, av.hdr_len), (34, 54));
    assert!(slow.1.take_sent().iter().all(|(_, s)| tcp4_checksums_ok(s)));

    // And back: tag inserted, offsets moved by four.
    acc.1.inject(VnetHdr { csum_start: 34, hdr_len: 54, ..v }, &f);
    sw.on_readable(acc.0, 0);
    let (tv, tf) = &t.1.take_sent()[0];
    assert_eq!(tf, &tag(&f, 10));
    assert_eq!((tv.csum_start, tv.hdr_len), (38, 58));
}

#[test]
fn removing_a_port_forgets_it_and_releases_its_frames() {
    let (mut sw, p) = three_ports();
    send(&mut sw, p[2].0, &p[2].1, &eth(BCAST, mac(3), 0x0806, 28), 0);
    p[2].1.set_tx_limit(Some(0));
    send(&mut sw, p[0].0, &p[0].1, &eth(mac(3), mac(1), 0x0800, 28), 0);
    assert_eq!(sw.port_info(p[2].0).unwrap().queued, 1);
    sw.remove_port("p3").unwrap();
    assert!(sw.remove_port("p3").is_err());
    assert_eq!(sw.departed().tx_drops.unknown_port, 1, "the frame queued for p3");
    assert_conserved(&sw);
    assert!(sw.port_id("p3").is_none());
    send(&mut sw, p[0].0, &p[0].1, &eth(mac(3), mac(1), 0x0800, 28), 0);
    assert_eq!(p[1].1.take_sent().len(), 2, "unknown again: flooded to the remaining port");
    assert!(
        sw.add_port(
            sluice_switch::PortConfig { name: "p1".into(), vlan: access(1), mtu: None, policy: Default::default() },
            Box::new(sluice_switch::mem::mem_port(OFFLOAD).0)
        )
        .is_err()
    );
}

#[test]
fn a_port_whose_device_vanishes_is_failed_and_the_rest_keep_forwarding() {
    let (mut sw, p) = three_ports();
    send(&mut sw, p[2].0, &p[2].1, &eth(BCAST, mac(3), 0x0806, 28), 0);
    send(&mut sw, p[1].0, &p[1].1, &eth(BCAST, mac(2), 0x0806, 28), 0);
    p[2].1.vanish();
    send(&mut sw, p[0].0, &p[0].1, &eth(mac(3), mac(1), 0x0800, 60), 1);
    let info = sw.port_info(p[2].0).unwrap();
    assert!(info.failed.is_some());
    assert_eq!(info.counters.tx_drops.tx_error, 1, "the frame that found it gone");
    assert_eq!(sw.interest(p[2].0), Interest { read: false, write: false });
    // Later frames for it are dropped and counted; broadcasts skip it; others still work.
    send(&mut sw, p[0].0, &p[0].1, &eth(mac(3), mac(1), 0x0800, 60), 2);
    assert_eq!(sw.port_info(p[0].0).unwrap().counters.rx_drops.unknown_port, 1);
    send(&mut sw, p[0].0, &p[0].1, &eth(BCAST, mac(1), 0x0806, 28), 3);
    send(&mut sw, p[0].0, &p[0].1, &eth(mac(2), mac(1), 0x0800, 60), 4);
    assert_eq!(p[1].1.take_sent().len(), 2 + 1, "ARP of p3, the broadcast and the unicast");
    assert!(!sw.on_readable(p[2].0, 5), "a failed port is not read");
    assert_conserved(&sw);
}

#[test]
fn an_isolated_port_reaches_the_uplink_only() {
    use sluice_switch::PortPolicy;
    let mut sw = Switch::new(cfg()).unwrap();
    let up = add_with(&mut sw, "up", PortPolicy { uplink: true, ..Default::default() });
    let iso = add_with(&mut sw, "iso", PortPolicy { isolated: true, ..Default::default() });
    let other = add_with(&mut sw, "other", PortPolicy::default());
    // A broadcast from the isolated port floods to the uplink only.
    send(&mut sw, iso.0, &iso.1, &eth(BCAST, mac(2), 0x0806, 28), 0);
    assert_eq!(up.1.take_sent().len(), 1);
    assert!(other.1.take_sent().is_empty(), "isolated port's flood reached a guest");
    // A broadcast from another guest does not reach the isolated port.
    send(&mut sw, other.0, &other.1, &eth(BCAST, mac(3), 0x0806, 28), 1);
    assert_eq!(up.1.take_sent().len(), 1);
    assert!(iso.1.take_sent().is_empty());
    // Unicast between them (both learned) is dropped and counted; the uplink still talks
    // to both.
    send(&mut sw, other.0, &other.1, &eth(mac(2), mac(3), 0x0800, 50), 2);
    assert!(iso.1.take_sent().is_empty());
    assert_eq!(sw.port_info(other.0).unwrap().counters.rx_drops.isolated, 1);
    send(&mut sw, up.0, &up.1, &eth(mac(2), mac(1), 0x0800, 50), 3);
    assert_eq!(iso.1.take_sent().len(), 1);
    send(&mut sw, iso.0, &iso.1, &eth(mac(1), mac(2), 0x0800, 50), 4);
    assert_eq!(up.1.take_sent().len(), 1);
    assert_conserved(&sw);
}

#[test]
fn a_forged_source_mac_is_dropped_before_it_is_learned() {
    use sluice_switch::PortPolicy;
    let mut sw = Switch::new(cfg()).unwrap();
    let a = add_with(&mut sw, "a", PortPolicy { mac: Some(sluice_wire::MacAddr(mac(1))), ..Default::default() });
    let b = add_with(&mut sw, "b", PortPolicy::default());
    // b announces mac(2); a forges mac(2) as its source.
    send(&mut sw, b.0, &b.1, &eth(BCAST, mac(2), 0x0806, 28), 0);
    a.1.take_sent();
    send(&mut sw, a.0, &a.1, &eth(BCAST, mac(2), 0x0806, 28), 1);
    assert!(b.1.take_sent().is_empty(), "forged frame forwarded");
    assert_eq!(sw.port_info(a.0).unwrap().counters.rx_drops.spoofed_mac, 1);
    assert!(
        sw.fib().entries().iter().any(|e| e.1 == sluice_wire::MacAddr(mac(2)) && e.2.port == b.0),
        "the real owner keeps its entry"
    );
    // Its own address passes.
    send(&mut sw, a.0, &a.1, &eth(BCAST, mac(1), 0x0806, 28), 2);
    assert_eq!(b.1.take_sent().len(), 1);
    assert_conserved(&sw);
}

#[test]
fn source_ips_outside_the_ports_list_are_dropped() {
    use sluice_switch::PortPolicy;
    let mut sw = Switch::new(cfg()).unwrap();
    let ips = vec!["10.0.0.1".parse().unwrap(), "fd00::1".parse().unwrap()];
    let a = add_with(&mut sw, "a", PortPolicy { ips, ..Default::default() });
    let b = add_with(&mut sw, "b", PortPolicy::default());
    let with = |ethertype: u16, at: usize, addr: &[u8]| {
        let mut f = eth(BCAST, mac(1), ethertype, 60);
        f[at..at + addr.len()].copy_from_slice(addr);
        f
    };
    let mut fd00_1 = [0u8; 16];
    fd00_1[0] = 0xfd;
    fd00_1[15] = 1;
    let mut fd00_2 = fd00_1;
    fd00_2[15] = 2;
    let cases: [(Vec<u8>, bool); 8] = [
        (with(0x0800, 26, &[10, 0, 0, 1]), true),
        (with(0x0800, 26, &[10, 0, 0, 2]), false),
        (with(0x0800, 26, &[0, 0, 0, 0]), true),
        (with(0x0806, 28, &[10, 0, 0, 1]), true),
        (with(0x0806, 28, &[10, 0, 0, 9]), false),
        (with(0x86dd, 22, &fd00_1), true),
        (with(0x86dd, 22, &fd00_2), false),
        (eth(BCAST, mac(1), 0x88b5, 60), true),
    ];
    let mut dropped = 0;
    for (i, (f, pass)) in cases.iter().enumerate() {
        send(&mut sw, a.0, &a.1, f, i as u64);
        assert_eq!(b.1.take_sent().len(), usize::from(*pass), "case {i}");
        dropped += u64::from(!pass);
    }
    assert_eq!(sw.port_info(a.0).unwrap().counters.rx_drops.spoofed_ip, dropped);
    assert_conserved(&sw);
}

#[test]
fn a_mirror_gets_a_copy_of_each_frame_its_ports_receive_and_are_sent() {
    use sluice_switch::PortPolicy;
    let mut sw = Switch::new(cfg()).unwrap();
    let a = add_with(&mut sw, "a", PortPolicy::default());
    let b = add_with(&mut sw, "b", PortPolicy::default());
    let c = add_with(&mut sw, "c", PortPolicy::default());
    let m = add_with(&mut sw, "m", PortPolicy { mirror_of: vec!["a".into()], ..Default::default() });
    // Learn b and c.
    send(&mut sw, b.0, &b.1, &eth(BCAST, mac(2), 0x0806, 28), 0);
    send(&mut sw, c.0, &c.1, &eth(BCAST, mac(3), 0x0806, 28), 0);
    for h in [&a.1, &b.1, &c.1, &m.1] {
        h.take_sent();
    }
    // a → b (a receives): one copy; b → a (a is sent): one copy; b → c: none.
    send(&mut sw, a.0, &a.1, &eth(mac(2), mac(1), 0x0800, 50), 1);
    send(&mut sw, b.0, &b.1, &eth(mac(1), mac(2), 0x0800, 50), 2);
    send(&mut sw, b.0, &b.1, &eth(mac(3), mac(2), 0x0800, 50), 3);
    assert_eq!(m.1.take_sent().len(), 2);
    assert_eq!(b.1.take_sent().len(), 1);
    assert_eq!(a.1.take_sent().len(), 1);
    // A second mirror of the same port, or a mirror of itself, is refused.
    let (p, _) = sluice_switch::mem::mem_port(OFFLOAD);
    let policy = PortPolicy { mirror_of: vec!["a".into()], ..Default::default() };
    let e =
        sw.add_port(sluice_switch::PortConfig { name: "m2".into(), vlan: access(1), mtu: None, policy }, Box::new(p));
    assert!(e.unwrap_err().to_string().contains("already has a mirror"));
    // Removing the mirror stops the copies.
    sw.remove_port("m").unwrap();
    send(&mut sw, a.0, &a.1, &eth(mac(2), mac(1), 0x0800, 50), 4);
    assert_eq!(b.1.take_sent().len(), 1);
    assert_conserved(&sw);
}

/// Ports that come and go cost no memory for good: a removed port's queue buffers are
/// given back, and the next port reuses them (an hour of port churn grew the daemon by
/// 17 MB a port before; issue 15).
#[test]
fn ports_that_come_and_go_leave_the_buffer_pool_as_it_was() {
    let mut sw = Switch::new(cfg()).unwrap();
    let (a, ha) = add(&mut sw, "a", access(1), None, OFFLOAD);
    let _b = add(&mut sw, "b", access(1), None, OFFLOAD);
    let before = sw.buffers();
    for i in 0..50 {
        let name = format!("x{i}");
        let (_x, hx) = add(&mut sw, &name, access(1), None, OFFLOAD);
        // Traffic flooded to it meanwhile, some still queued when it goes.
        hx.set_tx_limit(Some(0));
        send(&mut sw, a, &ha, &eth(BCAST, mac(1), 0x0800, 100), i);
        sw.remove_port(&name).unwrap();
    }
    assert_eq!(sw.buffers(), before, "the pool grew with ports that are gone");
    assert_conserved(&sw);
}

#[test]
fn frames_for_an_uplinks_own_address_are_the_hosts_not_the_guests() {
    let mut sw = Switch::new(cfg()).unwrap();
    let (port, uplink) = sluice_switch::mem::mem_port(OFFLOAD);
    uplink.set_mac(Some(sluice_wire::MacAddr(mac(9))));
    let policy = sluice_switch::PortPolicy { uplink: true, ..Default::default() };
    let up = sw
        .add_port(sluice_switch::PortConfig { name: "up".into(), vlan: access(1), mtu: None, policy }, Box::new(port))
        .unwrap();
    let a = add(&mut sw, "a", access(1), None, OFFLOAD);
    let b = add(&mut sw, "b", access(1), None, OFFLOAD);
    // The device may be the host's own interface: a frame to its address is the host's.
    send(&mut sw, up, &uplink, &eth(mac(9), mac(7), 0x0800, 50), 0);
    assert!(a.1.take_sent().is_empty() && b.1.take_sent().is_empty(), "the host's unicast reached a guest");
    let c = sw.port_info(up).unwrap().counters;
    assert_eq!((c.consumed, c.flooded, c.forwarded), (1, 0, 0), "{c:?}");
    // Its group frames are the guests' too.
    send(&mut sw, up, &uplink, &eth(BCAST, mac(7), 0x0800, 50), 1);
    assert_eq!((a.1.take_sent().len(), b.1.take_sent().len()), (1, 1));
    assert_conserved(&sw);
}

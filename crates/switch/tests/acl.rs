//! Security groups on the user-space datapath: rules and the core's connection tracker on
//! frames between memory ports, with the driver's clock.

mod common;

use common::*;
use sluice_switch::acl::{AclAction, AclRuleSpec, Dir};
use sluice_switch::{DropCause, Switch};

/// A TCP/IPv4 frame from `src_ip:sport` to `dst_ip:dport` with `flags`.
fn tcp(src: u8, dst: u8, sport: u16, dport: u16, flags: u8) -> Vec<u8> {
    let mut f = eth(mac(dst), mac(src), 0x0800, 0);
    let mut ip = vec![0x45, 0, 0, 40, 0, 0, 0x40, 0, 64, 6, 0, 0];
    ip.extend_from_slice(&[10, 0, 0, src]);
    ip.extend_from_slice(&[10, 0, 0, dst]);
    f.extend_from_slice(&ip);
    let mut t = vec![0u8; 20];
    t[0..2].copy_from_slice(&sport.to_be_bytes());
    t[2..4].copy_from_slice(&dport.to_be_bytes());
    t[12] = 0x50;
    t[13] = flags;
    f.extend_from_slice(&t);
    f
}

/// An ICMP echo request (type 8) or reply (0) with identifier 7.
fn icmp(src: u8, dst: u8, ty: u8) -> Vec<u8> {
    let mut f = eth(mac(dst), mac(src), 0x0800, 0);
    let mut ip = vec![0x45, 0, 0, 28, 0, 0, 0x40, 0, 64, 1, 0, 0];
    ip.extend_from_slice(&[10, 0, 0, src]);
    ip.extend_from_slice(&[10, 0, 0, dst]);
    f.extend_from_slice(&ip);
    f.extend_from_slice(&[ty, 0, 0, 0, 0, 7, 0, 1]);
    f
}

const SYN: u8 = 0x02;
const SYNACK: u8 = 0x12;
const ACK: u8 = 0x10;

fn rule(dir: &str, action: &str, proto: Option<&str>, dport: Option<&str>) -> AclRuleSpec {
    AclRuleSpec {
        dir: dir.into(),
        action: action.into(),
        proto: proto.map(Into::into),
        dport: dport.map(Into::into),
        ..AclRuleSpec::default()
    }
}

/// Two ports, a (10.0.0.1) and b (10.0.0.2), each having sent once so both are learned.
fn pair() -> (Switch, (u32, sluice_switch::mem::MemHandle), (u32, sluice_switch::mem::MemHandle)) {
    let mut sw = Switch::new(cfg()).unwrap();
    let a = add(&mut sw, "a", access(1), None, OFFLOAD);
    let b = add(&mut sw, "b", access(1), None, OFFLOAD);
    send(&mut sw, a.0, &a.1, &eth(BCAST, mac(1), 0x88b5, 10), 0);
    send(&mut sw, b.0, &b.1, &eth(BCAST, mac(2), 0x88b5, 10), 0);
    a.1.take_sent();
    b.1.take_sent();
    (sw, a, b)
}

#[test]
fn a_denied_port_is_dropped_and_an_allowed_one_passes() {
    let (mut sw, (a, ha), (b, hb)) = pair();
    sw.acl_add("b", &rule("out", "deny", Some("tcp"), Some("22"))).unwrap();
    send(&mut sw, a, &ha, &tcp(1, 2, 40000, 22, SYN), 1);
    assert!(hb.take_sent().is_empty(), "port 22 is denied into b");
    send(&mut sw, a, &ha, &tcp(1, 2, 40000, 80, SYN), 2);
    assert_eq!(hb.take_sent().len(), 1, "port 80 is not");
    assert_eq!(sw.port_info(a).unwrap().counters.rx_drops.get(DropCause::Acl), 1);
    assert_eq!(sw.acl_list(None)[0].hits, 1);
    let _ = b;
    assert_conserved(&sw);
}

#[test]
fn return_traffic_of_an_allowed_connection_passes_without_a_rule() {
    let (mut sw, (a, ha), (b, hb)) = pair();
    // a may open connections to port 80; nothing may come into a otherwise.
    sw.acl_add("a", &rule("in", "allow-related", Some("tcp"), Some("80"))).unwrap();
    sw.acl_default("a", Dir::Out, AclAction::Deny).unwrap();
    // (step, from b?, frame, reaches the other end?)
    let rows: &[(&str, bool, Vec<u8>, bool)] = &[
        ("b opens a connection to a: denied", true, tcp(2, 1, 5000, 80, SYN), false),
        ("a opens one to b", false, tcp(1, 2, 40000, 80, SYN), true),
        ("b's answer: a reply", true, tcp(2, 1, 80, 40000, SYNACK), true),
        ("a's data", false, tcp(1, 2, 40000, 80, ACK), true),
        ("b's data on another connection", true, tcp(2, 1, 80, 40001, ACK), false),
        ("a's ping: allowed by a's default, not remembered", false, icmp(1, 2, 8), true),
        ("b's echo reply: no connection", true, icmp(2, 1, 0), false),
    ];
    for (i, (what, from_b, frame, passes)) in rows.iter().enumerate() {
        let (id, h, other) = if *from_b { (b, &hb, &ha) } else { (a, &ha, &hb) };
        send(&mut sw, id, h, frame, 10 + i as u64);
        assert_eq!(!other.take_sent().is_empty(), *passes, "{what}");
    }
    let l = sw.acl_list(Some("a"));
    assert_eq!(l[0].hits, 1, "the SYN; the rest were the connection's");
    assert_conserved(&sw);
}

#[test]
fn icmp_types_and_echo_tracking() {
    let (mut sw, (a, ha), (b, hb)) = pair();
    let echo = AclRuleSpec { icmp_type: Some(8), ..rule("in", "allow-related", Some("icmp"), None) };
    sw.acl_add("a", &echo).unwrap();
    sw.acl_default("a", Dir::In, AclAction::Deny).unwrap();
    sw.acl_default("a", Dir::Out, AclAction::Deny).unwrap();
    send(&mut sw, a, &ha, &icmp(1, 2, 8), 1);
    assert_eq!(hb.take_sent().len(), 1, "the request");
    send(&mut sw, b, &hb, &icmp(2, 1, 0), 2);
    assert_eq!(ha.take_sent().len(), 1, "its reply");
    send(&mut sw, b, &hb, &icmp(2, 1, 8), 3);
    assert!(ha.take_sent().is_empty(), "b's own request is denied into a");
    send(&mut sw, a, &ha, &icmp(1, 2, 13), 4);
    assert!(hb.take_sent().is_empty(), "a timestamp request: not type 8, denied by a's default");
    assert_conserved(&sw);
}

#[test]
fn a_rule_added_later_stops_new_connections_only() {
    let (mut sw, (a, ha), (b, hb)) = pair();
    sw.acl_add("a", &rule("in", "allow-related", Some("tcp"), None)).unwrap();
    send(&mut sw, a, &ha, &tcp(1, 2, 40000, 5201, SYN), 1);
    send(&mut sw, b, &hb, &tcp(2, 1, 5201, 40000, SYNACK), 2);
    assert_eq!(hb.take_sent().len(), 1);
    let g = sw.generation();
    sw.acl_add("a", &AclRuleSpec { priority: 10, ..rule("in", "deny", Some("tcp"), Some("5201")) }).unwrap();
    assert!(sw.generation() > g, "a rule change is a new generation");
    send(&mut sw, a, &ha, &tcp(1, 2, 40000, 5201, ACK), 3);
    assert_eq!(hb.take_sent().len(), 1, "the running connection goes on");
    send(&mut sw, a, &ha, &tcp(1, 2, 40002, 5201, SYN), 4);
    assert!(hb.take_sent().is_empty(), "a new one is refused");
    assert_conserved(&sw);
}

#[test]
fn a_full_connection_table_drops_ct_full() {
    let (mut sw, (a, ha), (_b, hb)) = pair();
    sw.set_ct_max(2);
    sw.acl_add("a", &rule("in", "allow-related", Some("tcp"), None)).unwrap();
    for p in 0..3u16 {
        send(&mut sw, a, &ha, &tcp(1, 2, 40000 + p, 80, SYN), 1);
    }
    assert_eq!(hb.take_sent().len(), 2);
    assert_eq!(sw.port_info(a).unwrap().counters.rx_drops.get(DropCause::CtFull), 1);
    assert_eq!(sw.ct_stats().full, 1);
    // Unreplied TCP ends after 120 s: room again.
    sw.expire(200_000);
    send(&mut sw, a, &ha, &tcp(1, 2, 40009, 80, SYN), 200_001);
    assert_eq!(hb.take_sent().len(), 1);
    assert_conserved(&sw);
}

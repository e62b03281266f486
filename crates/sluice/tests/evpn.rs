//! EVPN: sluice hosts and a Linux host running FRR find each other's stations over BGP
//! (GoBGP speakers started by the sluice switches, FRR's bgpd as the route reflector and
//! on the Linux host), with real kernel stacks in every guest. Checked against the
//! speakers' own views (FRR's `show evpn mac`, sluice's `evpn show` and `fib show`): routes
//! of both types are exchanged both ways, guests on all three hosts reach each other,
//! known unicast is never flooded, a guest that moves is reached at its new host and its
//! old route is withdrawn, a removed guest's route is withdrawn, and what a peer should not
//! send is counted while forwarding goes on.

mod common;

use std::process::Output;

use common::*;
use serde_json::Value;

/// An EVPN lab of three hosts (two sluice hosts, the last a Linux host with FRR), taken
/// down on drop.
struct EvpnLab {
    name: String,
    guests: Vec<Value>,
}

impl EvpnLab {
    fn up(tag: &str) -> EvpnLab {
        let name = unique(tag);
        let args = ["lab", "up", "--name", &name, "--hosts", "3", "--guests", "1", "--evpn", "--peer-frr", "--json"];
        let o = sluice(&args);
        let mut lab = EvpnLab { name, guests: Vec::new() };
        assert!(o.status.success(), "lab up --evpn: {}", String::from_utf8_lossy(&o.stderr));
        let v: Value = serde_json::from_slice(&o.stdout).expect("lab up --json");
        lab.guests = v["guests"].as_array().cloned().unwrap_or_default();
        assert_eq!(lab.guests.len(), 3, "{v}");
        lab
    }

    /// Guest `g` (`h1g1`)'s namespace and interface.
    fn guest(&self, g: &str) -> (String, String) {
        let x = self.guests.iter().find(|x| x["guest"] == g).unwrap_or_else(|| panic!("no guest {g}"));
        (x["netns"].as_str().unwrap().to_string(), x["tap"].as_str().unwrap().to_string())
    }

    fn exec(&self, g: &str, cmd: &str) -> Output {
        let mut a = vec!["lab", "exec", "--name", &self.name, g, "--"];
        a.extend(cmd.split_whitespace());
        sluice(&a)
    }

    fn switch(&self, h: u8) -> String {
        format!("{}h{h}", self.name)
    }

    fn json(&self, what: &[&str], h: u8) -> Value {
        let sw = self.switch(h);
        let mut a = what.to_vec();
        a.extend(["--json", "--switch", &sw]);
        serde_json::from_str(&sluice_ok(&a)).unwrap()
    }

    /// FRR's answer on the Linux host (h3) to `cmd`.
    fn frr(&self, cmd: &str) -> String {
        let dir = run_dir().join("labs").join(format!("{}-frr-h3", self.name));
        ns_ok(&format!("sluice-{}-h3", self.name), &format!("vtysh --vty_socket {} -c '{cmd}'", dir.display()))
    }

    /// Waits until `from` pings `to`, bounded; true when it did.
    fn reaches(&self, from: &str, to: &str) -> bool {
        wait_for(60, || self.exec(from, &format!("ping -c 1 -W 1 {to}")).status.success())
    }
}

impl Drop for EvpnLab {
    fn drop(&mut self) {
        let _ = sluice(&["lab", "down", "--name", &self.name]);
    }
}

fn tools() -> bool {
    root() && have("gobgpd") && have("vtysh") && have("ping") && std::path::Path::new("/usr/lib/frr/bgpd").is_file()
}

/// The MAC of guest `g`'s interface.
fn mac(lab: &EvpnLab, g: &str) -> String {
    let (ns, iface) = lab.guest(g);
    ns_ok(&ns, &format!("cat /sys/class/net/{iface}/address")).trim().to_string()
}

fn fib_entry(lab: &EvpnLab, h: u8, mac: &str) -> Option<Value> {
    lab.json(&["fib", "show"], h)["entries"].as_array().unwrap().iter().find(|e| e["mac"] == mac).cloned()
}

#[test]
#[ignore = "system tier: needs root, gobgpd and FRR (bgpd, zebra, vtysh); scripts/test.sh runs it"]
fn two_sluice_hosts_and_an_frr_host_exchange_routes_and_never_flood_known_unicast() {
    if !tools() {
        return;
    }
    init();
    let lab = EvpnLab::up("ev");
    // Every pair talks, once the sessions are up and the routes are in.
    for (from, to) in [("h1g1", "10.77.0.2"), ("h1g1", "10.77.0.3"), ("h3g1", "10.77.0.2"), ("h2g1", "10.77.0.1")] {
        assert!(lab.reaches(from, to), "{from} cannot reach {to}");
    }
    let (m1, m2, m3) = (mac(&lab, "h1g1"), mac(&lab, "h2g1"), mac(&lab, "h3g1"));
    // FRR learned the sluice hosts' stations as type-2 routes behind their endpoints.
    let frr = lab.frr("show evpn mac vni 5000");
    for (m, ep) in [(&m1, "192.168.77.1"), (&m2, "192.168.77.2")] {
        let line = frr.lines().find(|l| l.starts_with(m.as_str())).unwrap_or_else(|| panic!("FRR lacks {m}: {frr}"));
        assert!(line.contains("remote") && line.contains(ep), "{line}");
    }
    // And the sluice hosts' flood lists (type 3): "Remote VTEPs" of the VNI.
    let vni = lab.frr("show evpn vni 5000");
    assert!(vni.contains("192.168.77.1") && vni.contains("192.168.77.2"), "{vni}");
    // sluice learned FRR's station from its route, not from datagrams.
    for h in [1, 2] {
        let e = fib_entry(&lab, h, &m3).unwrap_or_else(|| panic!("h{h} lacks {m3}"));
        assert_eq!((e["origin"].as_str(), e["endpoint"].as_str()), (Some("evpn"), Some("192.168.77.3")), "{e}");
    }
    let ev = lab.json(&["evpn", "show"], 1);
    let sent = ev["sent"].as_array().unwrap();
    assert!(sent.iter().any(|r| r["type"] == 2 && r["mac"] == m1.as_str()), "{ev}");
    assert!(sent.iter().any(|r| r["type"] == 3 && r["vni"] == 5000), "{ev}");
    let recv = ev["received"].as_array().unwrap();
    for ep in ["192.168.77.2", "192.168.77.3"] {
        assert!(recv.iter().any(|r| r["type"] == 3 && r["endpoint"] == ep), "no flood route from {ep}: {ev}");
    }
    assert!(ev["peers"].as_array().unwrap().iter().any(|p| p["state"] == "established"), "{ev}");
    // Known unicast is never flooded: h1g1 and h3g1 talk, h2g1 sees none of it.
    let (ns2, if2) = lab.guest("h2g1");
    let listener = listen_raw(&ns2, &if2, 0x0800, 1.0);
    let o = lab.exec("h1g1", "ping -c 20 -i 0.05 -W 1 10.77.0.3");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stdout));
    let seen: Vec<_> = received(listener)
        .into_iter()
        .filter(|(_, f)| f.len() > 33 && f[23] == 1 && (f[26..30] == [10, 77, 0, 1] || f[26..30] == [10, 77, 0, 3]))
        .collect();
    assert!(seen.is_empty(), "h2g1 got {} ICMP frames of a conversation between h1g1 and h3g1", seen.len());
    // Learning is off on the tunnels: every remote station came from a route.
    for h in [1, 2] {
        let fib = lab.json(&["fib", "show"], h);
        for e in fib["entries"].as_array().unwrap().iter().filter(|e| e["port"] == "vx0") {
            assert_eq!(e["origin"], "evpn", "h{h}: {e}");
        }
    }
}

#[test]
#[ignore = "system tier: needs root, gobgpd and FRR (bgpd, zebra, vtysh); scripts/test.sh runs it"]
fn a_guest_that_moves_is_reached_at_its_new_host_and_a_removed_one_is_withdrawn() {
    if !tools() {
        return;
    }
    init();
    let lab = EvpnLab::up("em");
    assert!(lab.reaches("h3g1", "10.77.0.1") && lab.reaches("h3g1", "10.77.0.2"));
    let m1 = mac(&lab, "h1g1");
    // The guest of h1 moves to h2: h1's interface goes down, h2's guest takes its MAC and
    // address, and says so (its first frames).
    let (ns1, if1) = lab.guest("h1g1");
    let (ns2, if2) = lab.guest("h2g1");
    ns_ok(&ns1, &format!("ip link set {if1} down"));
    ns_ok(&ns2, &format!("ip link set {if2} down"));
    ns_ok(&ns2, &format!("ip link set {if2} address {m1}"));
    ns_ok(&ns2, &format!("ip addr flush dev {if2}"));
    ns_ok(&ns2, &format!("ip addr add 10.77.0.1/24 dev {if2}"));
    ns_ok(&ns2, &format!("ip link set {if2} up"));
    ns_sh(&ns2, "ping -c 1 -W 1 10.77.0.3");
    // FRR's host reaches it at its new place, with the move's sequence number.
    assert!(lab.reaches("h3g1", "10.77.0.1"), "the moved guest is not reached");
    assert!(
        wait_for(30, || {
            let frr = lab.frr("show evpn mac vni 5000");
            frr.lines().any(|l| l.starts_with(m1.as_str()) && l.contains("192.168.77.2"))
        }),
        "FRR does not have {m1} behind h2: {}",
        lab.frr("show evpn mac vni 5000")
    );
    let detail = lab.frr(&format!("show evpn mac vni 5000 mac {m1}"));
    assert!(detail.contains("Remote VTEP: 192.168.77.2") || detail.contains("192.168.77.2"), "{detail}");
    // h1 withdrew its route (the higher number took the station) and sends to h2 now.
    assert!(
        wait_for(30, || {
            let ev = lab.json(&["evpn", "show"], 1);
            !ev["sent"].as_array().unwrap().iter().any(|r| r["mac"] == m1.as_str())
        }),
        "h1 still announces {m1}"
    );
    let e = fib_entry(&lab, 1, &m1).expect("h1 knows where the guest went");
    assert_eq!((e["origin"].as_str(), e["endpoint"].as_str()), (Some("evpn"), Some("192.168.77.2")), "{e}");
    let h2 = lab.json(&["evpn", "show"], 2);
    let r = h2["sent"].as_array().unwrap().iter().find(|r| r["mac"] == m1.as_str()).cloned();
    assert!(r.as_ref().is_some_and(|r| r["seq"].as_u64() >= Some(1)), "h2 announces it with a higher number: {h2}");
    // The guest's port is removed at h2: its route is withdrawn everywhere.
    let port2 = lab.json(&["fib", "show"], 2)["entries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["mac"] == m1.as_str())
        .and_then(|e| e["port"].as_str().map(String::from))
        .expect("h2 has the guest");
    sluice_ok(&["port", "del", &port2, "--switch", &lab.switch(2)]);
    assert!(
        wait_for(30, || !lab.frr("show evpn mac vni 5000").contains(m1.as_str())),
        "FRR still lists {m1} after its port went"
    );
    assert!(wait_for(30, || fib_entry(&lab, 1, &m1).is_none()), "h1 still has {m1}");
}

#[test]
#[ignore = "system tier: needs root, gobgpd and FRR (bgpd, zebra, vtysh); scripts/test.sh runs it"]
fn a_session_that_flaps_or_a_speaker_that_dies_does_not_stop_forwarding() {
    if !tools() {
        return;
    }
    init();
    let lab = EvpnLab::up("ef");
    assert!(lab.reaches("h1g1", "10.77.0.2") && lab.reaches("h1g1", "10.77.0.3"));
    let (m1, m2) = (mac(&lab, "h1g1"), mac(&lab, "h2g1"));
    // Every session of the reflector is reset: the routes are withdrawn and sent again.
    let rr_dir = run_dir().join("labs").join(format!("{}-frr-rr", lab.name));
    ns_ok(&format!("sluice-{}-rr", lab.name), &format!("vtysh --vty_socket {} -c 'clear bgp *'", rr_dir.display()));
    // The stations stay installed meanwhile (held stale), so the guests go on talking.
    let e = fib_entry(&lab, 1, &m2).expect("h1 keeps h2's station while the session is reset");
    assert_eq!(e["origin"], "evpn", "{e}");
    let o = lab.exec("h1g1", "ping -c 3 -W 2 10.77.0.2");
    assert!(o.status.success(), "forwarding stopped with the flap: {}", String::from_utf8_lossy(&o.stdout));
    assert!(
        wait_for(60, || {
            let ev = lab.json(&["evpn", "show"], 1);
            ev["peers"].as_array().unwrap().iter().all(|p| p["state"] == "established")
        }),
        "the session did not come back"
    );
    // h1's speaker is killed: the switch starts it again, forwarding goes on, and what h1
    // announced is announced again (FRR's host has h1's guest back behind h1).
    let pid = lab.json(&["evpn", "show"], 1)["speaker"]["pid"].as_u64().expect("the speaker's pid");
    // SAFETY: kill with a pid the switch reported for its child, and a plain signal.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    let o = lab.exec("h1g1", "ping -c 3 -W 2 10.77.0.2");
    assert!(o.status.success(), "forwarding stopped with the speaker: {}", String::from_utf8_lossy(&o.stdout));
    assert!(
        wait_for(60, || {
            let ev = lab.json(&["evpn", "show"], 1);
            ev["speaker"]["restarts"].as_u64() >= Some(1)
                && ev["speaker"]["connected"] == true
                && ev["peers"].as_array().unwrap().iter().any(|p| p["state"] == "established")
        }),
        "the speaker was not started again: {}",
        lab.json(&["evpn", "show"], 1)
    );
    assert!(
        wait_for(60, || lab
            .frr("show evpn mac vni 5000")
            .lines()
            .any(|l| l.starts_with(m1.as_str()) && l.contains("192.168.77.1"))),
        "h1's guest was not announced again: {}",
        lab.frr("show evpn mac vni 5000")
    );
    assert!(lab.reaches("h3g1", "10.77.0.1"));
}

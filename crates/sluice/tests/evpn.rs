//! EVPN: sluice hosts and a Linux host running FRR find each other's stations over BGP
//! (GoBGP speakers started by the sluice switches, FRR's bgpd as the route reflector and
//! on the Linux host), with real kernel stacks in every guest. Checked against the
//! speakers' own views (FRR's `show evpn mac`, sluice's `evpn show` and `fib show`): routes
//! of both types are exchanged both ways, guests on all three hosts reach each other,
//! known unicast is never flooded, a guest that moves is reached at its new host and its
//! old route is withdrawn, a removed guest's route is withdrawn, and what a peer should not
//! send is counted while forwarding goes on. A MAC on two hosts at once is declared
//! duplicate and its number stops rising; an address another host's route binds (FRR's,
//! for its guest) is answered by the switch, its ARP request never crossing the underlay.

mod common;

use std::net::IpAddr;
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
    /// Three hosts, the last Linux with FRR; the sluice hosts on the kernel datapath (the
    /// lab's default: veth guests).
    fn up(tag: &str) -> EvpnLab {
        EvpnLab::with(tag, &["--hosts", "3", "--peer-frr"])
    }

    fn with(tag: &str, hosts: &[&str]) -> EvpnLab {
        let name = unique(tag);
        let mut args = vec!["lab", "up", "--name", &name, "--guests", "1", "--evpn", "--json"];
        args.extend(hosts);
        let o = sluice(&args);
        let mut lab = EvpnLab { name, guests: Vec::new() };
        assert!(o.status.success(), "lab up --evpn: {}", String::from_utf8_lossy(&o.stderr));
        let v: Value = serde_json::from_slice(&o.stdout).expect("lab up --json");
        lab.guests = v["guests"].as_array().cloned().unwrap_or_default();
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
    exchange_routes_and_never_flood_known_unicast(&lab);
    // The kernel forwarded the guests' frames into the tunnel and out of it itself: the
    // routes' stations, endpoints and flood lists are in its tables.
    // Broadcasts from h1's guest: after the first, the kernel replicates them to the VNI's
    // flood list (h2 and h3) itself.
    let _ = lab.exec("h1g1", "ping -b -c 4 -i 0.2 -W 1 10.77.0.255");
    let st = lab.json(&["stats"], 1);
    let port = |name: &str| st["ports"].as_array().unwrap().iter().find(|p| p["name"] == name).cloned().unwrap();
    let vx = port("vx0");
    assert!(vx["kernel"]["forwarded"].as_u64() > Some(20), "the kernel datapath did not forward: {vx}");
    let (_, g1) = lab.guest("h1g1");
    let g1 = port(&g1);
    assert!(g1["kernel"]["flooded"].as_u64() >= Some(1), "no flood replicated in the kernel: {g1}");
}

#[test]
#[ignore = "system tier: needs root, gobgpd and FRR (bgpd, zebra, vtysh); scripts/test.sh runs it"]
fn on_the_user_space_datapath_too_routes_are_exchanged_and_known_unicast_never_flooded() {
    if !tools() {
        return;
    }
    init();
    let lab = EvpnLab::with("eu", &["--hosts", "3", "--peer-frr", "--datapath", "user"]);
    exchange_routes_and_never_flood_known_unicast(&lab);
    let st = lab.json(&["stats"], 1);
    let vx = st["ports"].as_array().unwrap().iter().find(|p| p["name"] == "vx0").cloned().unwrap();
    assert!(vx["kernel"].is_null(), "a user-space datapath: {vx}");
}

/// Routes of both types go both ways between two sluice hosts and FRR's host; the guests
/// reach each other; known unicast is never flooded; every remote station is a route's.
fn exchange_routes_and_never_flood_known_unicast(lab: &EvpnLab) {
    // Every pair talks, once the sessions are up and the routes are in.
    for (from, to) in [("h1g1", "10.77.0.2"), ("h1g1", "10.77.0.3"), ("h3g1", "10.77.0.2"), ("h2g1", "10.77.0.1")] {
        assert!(lab.reaches(from, to), "{from} cannot reach {to}");
    }
    let (m1, m2, m3) = (mac(lab, "h1g1"), mac(lab, "h2g1"), mac(lab, "h3g1"));
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
        let e = fib_entry(lab, h, &m3).unwrap_or_else(|| panic!("h{h} lacks {m3}"));
        assert_eq!((e["origin"].as_str(), e["endpoint"].as_str()), (Some("evpn"), Some("192.168.77.3")), "{e}");
    }
    // (The report is the agent's view, refreshed every second.)
    let full = |ev: &Value| {
        let floods = ev["received"].as_array().unwrap().iter().filter(|r| r["type"] == 3).count();
        floods == 2 && ev["peers"].as_array().unwrap().iter().any(|p| p["state"] == "established")
    };
    assert!(wait_for(30, || full(&lab.json(&["evpn", "show"], 1))), "{}", lab.json(&["evpn", "show"], 1));
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
    // (A sluice host's guest is its switch port of the name the lab's table gives.)
    sluice_ok(&["port", "del", &if2, "--switch", &lab.switch(2)]);
    assert!(
        wait_for(30, || !lab.frr("show evpn mac vni 5000").contains(m1.as_str())),
        "FRR still lists {m1} after its port went"
    );
    assert!(wait_for(30, || fib_entry(&lab, 1, &m1).is_none()), "h1 still has {m1}");
}

/// The highest sequence number host `h` sends or has received for `mac`, and whether it
/// reports `mac` duplicate.
fn seq_and_duplicate(lab: &EvpnLab, h: u8, mac: &str) -> (u64, bool) {
    let ev = lab.json(&["evpn", "show"], h);
    let routes = ev["sent"].as_array().unwrap().iter().chain(ev["received"].as_array().unwrap());
    let seq = routes.filter(|r| r["mac"] == mac).filter_map(|r| r["seq"].as_u64()).max().unwrap_or(0);
    let dup = ev["duplicates"].as_array().unwrap().iter().any(|d| d["mac"] == mac && d["vni"] == 5000);
    (seq, dup)
}

#[test]
#[ignore = "system tier: needs root, gobgpd and FRR (bgpd, zebra, vtysh); scripts/test.sh runs it"]
fn a_mac_on_two_hosts_at_once_is_declared_duplicate_and_its_sequence_number_stops_rising() {
    if !tools() {
        return;
    }
    init();
    let lab = EvpnLab::with("ed", &["--hosts", "2"]);
    assert!(lab.reaches("h1g1", "10.77.0.2"));
    // h2's guest takes h1's guest's MAC: both send, each host takes the station from the
    // other in turn, and each take raises its number.
    let m1 = mac(&lab, "h1g1");
    let (ns2, if2) = lab.guest("h2g1");
    ns_ok(&ns2, &format!("ip link set {if2} down"));
    ns_ok(&ns2, &format!("ip link set {if2} address {m1}"));
    ns_ok(&ns2, &format!("ip link set {if2} up"));
    // (A neighbour that answers nobody: each guest's ARP requests are broadcast from m1.)
    let send = |g: &str| {
        let _ = lab.exec(g, "ping -c 1 -W 1 10.77.0.99");
    };
    let mut flaps = 0;
    let dup_somewhere = || (1..=2).any(|h| seq_and_duplicate(&lab, h, &m1).1);
    while flaps < 40 && !dup_somewhere() {
        send(if flaps % 2 == 0 { "h2g1" } else { "h1g1" });
        flaps += 1;
    }
    let (h1, h2) = (lab.json(&["evpn", "show"], 1), lab.json(&["evpn", "show"], 2));
    assert!(dup_somewhere(), "{m1} moved {flaps} times and is not duplicate: {h1} {h2}");
    // (Once both hosts have each other's last route, they agree on the number.)
    let top = || [seq_and_duplicate(&lab, 1, &m1).0, seq_and_duplicate(&lab, 2, &m1).0];
    assert!(wait_for(10, || top()[0] == top()[1]), "the hosts disagree on {m1}'s number: {:?}", top());
    let before = top()[0];
    assert!(before >= 2, "it moved before it was frozen: {before}");
    let counted = |ev: &Value| ev["counters"]["duplicates"].as_u64().unwrap_or(0);
    assert!(counted(&h1) + counted(&h2) >= 1, "{h1} {h2}");
    // Both guests keep sending: the number no longer rises anywhere.
    for i in 0..8 {
        send(if i % 2 == 0 { "h2g1" } else { "h1g1" });
    }
    assert!(
        !wait_for(3, || top().iter().any(|&s| s > before)),
        "the number rose after {m1} was declared duplicate: {before} then {:?}",
        top()
    );
    assert!(dup_somewhere(), "still frozen (dup_hold is 180 s)");
    // The operator clears it: decided afresh, its guest having spoken there, that host
    // takes it (and the other host, whose moves still count, may declare it duplicate in
    // turn).
    let h = if seq_and_duplicate(&lab, 1, &m1).1 { 1 } else { 2 };
    let out = sluice_ok(&["evpn", "clear-duplicates", "--mac", &m1, "--switch", &lab.switch(h)]);
    assert!(out.contains("1 duplicate station(s) cleared"), "{out}");
    assert!(
        wait_for(10, || !seq_and_duplicate(&lab, h, &m1).1),
        "{m1} is still duplicate on h{h} after it was cleared"
    );
    assert!(wait_for(10, || top().iter().all(|&s| s > before)), "not decided afresh: {:?}", top());
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

/// A rogue BGP speaker on the lab's underlay (192.168.77.50), peering with the reflector:
/// its namespace and gobgpd are the test's, removed on drop.
struct Rogue {
    ns: String,
    gobgpd: std::process::Child,
    api: std::path::PathBuf,
}

impl Rogue {
    fn start(lab: &EvpnLab) -> Rogue {
        let ns = format!("sluice-{}-x", lab.name);
        sh_ok(&format!("ip netns add {ns}"));
        let ul = format!("sluice-{}-ul", lab.name);
        sh_ok(&format!("ip -n {ul} link add ux type veth peer name u0 netns {ns}"));
        sh_ok(&format!("ip -n {ul} link set ux master br0 up"));
        ns_ok(&ns, "ip link set lo up && ip link set u0 up && ip addr add 192.168.77.50/24 dev u0");
        let api = scratch(&format!("rogue-{}", lab.name)).join("gobgp.sock");
        let gobgpd = std::process::Command::new("ip")
            .args(["netns", "exec", &ns, "gobgpd", "--log-level=warn", "--pprof-disable"])
            .arg(format!("--api-hosts=unix://{}", api.display()))
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("gobgpd");
        assert!(wait_for(10, || api.exists()), "the rogue gobgpd opened no API");
        Rogue { ns, gobgpd, api }
    }
}

impl Rogue {
    /// Its speaker, BGP started and peering with the lab's reflector for EVPN.
    async fn speaker(&self) -> sluice_gobgp::Client {
        use sluice_gobgp::api::*;
        let mut c = sluice_gobgp::Client::connect(&self.api).await.expect("the rogue's API");
        c.start_bgp(Global {
            asn: 65000,
            router_id: "192.168.77.50".into(),
            listen_port: -1,
            listen_addresses: vec![],
        })
        .await
        .unwrap();
        let peer = Peer {
            conf: Some(PeerConf { local_asn: 65000, neighbor_address: "192.168.77.254".into(), peer_asn: 65000 }),
            afi_safis: vec![AfiSafi { config: Some(AfiSafiConfig { family: Some(Family::evpn()), enabled: true }) }],
            timers: Some(Timers {
                config: Some(TimersConfig { connect_retry: 1, hold_time: 9, keepalive_interval: 3 }),
            }),
            transport: None,
            state: None,
        };
        c.add_peer(peer).await.unwrap();
        c
    }
}

impl Drop for Rogue {
    fn drop(&mut self) {
        let _ = self.gobgpd.kill();
        let _ = self.gobgpd.wait();
        let _ = sh_ok(&format!("ip netns del {} || true", self.ns));
    }
}

/// Sends `n` VXLAN datagrams (VNI 5000, a broadcast inside) from `ns` to 192.168.77.1.
fn vxlan_datagrams(ns: &str, n: u32) {
    let code = format!(
        "import socket,struct\ns=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\nhdr=struct.pack('!II',0x08000000,5000<<8)\nf=b'\\xff'*6+bytes([2,0x66,0,0,0,0x50])+b'\\x88\\xb5'+b'rogue'*10\nfor i in range({n}): s.sendto(hdr+f,('192.168.77.1',4789))\n"
    );
    let o = std::process::Command::new("ip").args(["netns", "exec", ns, "python3", "-c", &code]).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

#[test]
#[ignore = "system tier: needs root, gobgpd and FRR (bgpd, zebra, vtysh); scripts/test.sh runs it"]
fn a_peer_that_announces_more_stations_than_the_bound_or_the_wrong_ones_is_counted_and_forwarding_goes_on() {
    use sluice_gobgp::api::*;
    use sluice_gobgp::paths::{Origin, mac_path};
    if !tools() {
        return;
    }
    init();
    let lab = EvpnLab::with("eh", &["--hosts", "2"]);
    assert!(lab.reaches("h1g1", "10.77.0.2"));
    let rogue = Rogue::start(&lab);
    let vx = || {
        let st = lab.json(&["stats"], 1);
        st["ports"].as_array().unwrap().iter().find(|p| p["name"] == "vx0").cloned().unwrap()
    };
    let refused = || vx()["counters"]["rx_drops"]["unknown_endpoint"].as_u64().unwrap_or(0);
    // Before it announces anything, its datagrams are refused: it is no endpoint.
    let before = refused();
    vxlan_datagrams(&rogue.ns, 20);
    assert!(wait_for(10, || refused() >= before + 20), "unannounced datagrams not counted: {}", vx());
    // A station configured on h1 (sticky there).
    let (_, port1) = lab.guest("h1g1");
    let pinned = "02:00:00:00:99:01";
    sluice_ok(&["fib", "add", pinned, &port1, "--switch", &lab.switch(1)]);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let origin =
        Origin { asn: 65000, router_id: "192.168.77.50".parse().unwrap(), next_hop: "192.168.77.50".parse().unwrap() };
    let n = 10_000u32;
    let started = std::time::Instant::now();
    rt.block_on(async {
        let mut c = rogue.speaker().await;
        // It claims h1's configured station with a high number, and sends a route with no
        // VNI (label 0).
        c.add_path(mac_path(&origin, 5000, pinned.parse().unwrap(), None, 7, false)).await.unwrap();
        let mut zero = mac_path(&origin, 5000, "02:00:00:00:99:02".parse().unwrap(), None, 0, false);
        let mut nlri: EvpnMacIpAdvertisementRoute =
            from_any(zero.nlri.as_ref().unwrap(), "EVPNMACIPAdvertisementRoute").unwrap();
        nlri.labels = vec![0];
        zero.nlri = Some(any("EVPNMACIPAdvertisementRoute", &nlri));
        c.add_path(zero).await.unwrap();
        // And more stations than h1 installs (its bound: half its MAC table, 4,096).
        for i in 0..n {
            let b = i.to_be_bytes();
            let m = sluice_wire::MacAddr([0x02, 0x55, b[0], b[1], b[2], b[3]]);
            c.add_path(mac_path(&origin, 5000, m, None, 0, false)).await.unwrap();
        }
    });
    eprintln!("announced {n} routes in {:.1} s", started.elapsed().as_secs_f64());
    // h1 installs up to its bound (half its MAC table) and counts the rest; forwarding goes
    // on meanwhile.
    let ok = wait_for(300, || {
        let c = &lab.json(&["evpn", "show"], 1)["counters"];
        c["installed"].as_u64() == Some(4096) && c["waiting"].as_u64().unwrap_or(0) >= u64::from(n) - 4096
    });
    let ev = lab.json(&["evpn", "show"], 1);
    assert!(ok, "h1 did not settle at its bound: {}", ev["counters"]);
    let c = &ev["counters"];
    assert!(c["over_limit"].as_u64() >= Some(u64::from(n) - 4096), "{c}");
    assert!(c["claims_local"].as_u64() >= Some(1), "the claim on a configured station is counted: {c}");
    assert!(c["refused_bad_vni"].as_u64() >= Some(1), "the route with no VNI is counted: {c}");
    let e = fib_entry(&lab, 1, pinned).expect("the configured station");
    assert_eq!((e["origin"].as_str(), e["port"].as_str()), (Some("static"), Some(port1.as_str())), "{e}");
    let o = lab.exec("h1g1", "ping -c 3 -W 2 10.77.0.2");
    assert!(o.status.success(), "forwarding stopped: {}", String::from_utf8_lossy(&o.stdout));
    // Named by routes now, the rogue's datagrams are taken (and flooded as any station's).
    let rx = || vx()["counters"]["rx_frames"].as_u64().unwrap_or(0);
    let (before, rx0) = (refused(), rx());
    vxlan_datagrams(&rogue.ns, 5);
    assert!(wait_for(10, || rx() >= rx0 + 5), "the rogue's datagrams were not taken: {}", vx());
    assert_eq!(refused(), before, "an endpoint that routes name is accepted");
}

/// Whether `frames` (captured on the underlay) hold a VXLAN datagram from h1
/// (192.168.77.1) carrying a broadcast ARP request for `target`. (A unicast one, a guest
/// checking a neighbour it knows, goes to the station, as it should; other hosts flood
/// their own.)
fn arp_in_tunnel(frames: &[(Option<u16>, Vec<u8>)], target: [u8; 4]) -> bool {
    // (Outer Ethernet, IPv4 without options, UDP 4789, VXLAN: the inner frame at 50.)
    frames.iter().any(|(_, f)| {
        f.len() >= 92
            && f[23] == 17
            && f[26..30] == [192, 168, 77, 1]
            && f[36..38] == [0x12, 0xb5]
            && f[50..56] == [0xff; 6]
            && f[62..64] == [0x08, 0x06]
            && f[88..92] == target
    })
}

/// Whether `frames` (captured on the underlay) hold a VXLAN datagram from h1 carrying a
/// neighbour solicitation for `target` to a group (as [`arp_in_tunnel`]).
fn nd_in_tunnel(frames: &[(Option<u16>, Vec<u8>)], target: [u8; 16]) -> bool {
    // (The inner frame at 50: its IPv6 header at 64, ICMPv6 at 104, the target at 112.)
    frames.iter().any(|(_, f)| {
        f.len() >= 128
            && f[23] == 17
            && f[26..30] == [192, 168, 77, 1]
            && f[36..38] == [0x12, 0xb5]
            && f[50..52] == [0x33, 0x33]
            && f[62..64] == [0x86, 0xdd]
            && f[70] == 58
            && f[104] == 135
            && f[112..128] == target
    })
}

/// Whether `frames` (captured on the underlay) hold h1's request for `ip` flooded into
/// the tunnel: a broadcast ARP request, or a neighbour solicitation to a group.
fn request_in_tunnel(frames: &[(Option<u16>, Vec<u8>)], ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(a) => arp_in_tunnel(frames, a.octets()),
        IpAddr::V6(a) => nd_in_tunnel(frames, a.octets()),
    }
}

#[test]
#[ignore = "system tier: needs root, gobgpd and FRR (bgpd, zebra, vtysh); scripts/test.sh runs it"]
fn an_arp_request_or_a_neighbour_solicitation_for_an_address_a_route_binds_is_answered_by_the_switch_and_not_sent_into_the_tunnel()
 {
    use sluice_gobgp::paths::{Origin, mac_path};
    if !tools() {
        return;
    }
    init();
    let lab = EvpnLab::with("es", &["--hosts", "2"]);
    assert!(lab.reaches("h1g1", "10.77.0.2"));
    // Another host announces a station with its address, as FRR does for a host whose
    // address it knows (a MAC-only route and a MAC+IP one).
    let rogue = Rogue::start(&lab);
    let far = "02:00:00:00:77:50";
    let origin =
        Origin { asn: 65000, router_id: "192.168.77.50".parse().unwrap(), next_hop: "192.168.77.50".parse().unwrap() };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let mut c = rogue.speaker().await;
        c.add_path(mac_path(&origin, 5000, far.parse().unwrap(), None, 0, false)).await.unwrap();
        for ip in ["10.77.0.50", "fd77::50"] {
            c.add_path(mac_path(&origin, 5000, far.parse().unwrap(), Some(ip.parse().unwrap()), 0, false))
                .await
                .unwrap();
        }
    });
    // (Installed with its address: the binding is the switch's once that is listed.)
    let bound = |ev: &Value| {
        ev["received"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["mac"] == far && r["status"] == "installed")
            .any(|r| r["ip"] == "10.77.0.50")
            && ev["received"].as_array().unwrap().iter().any(|r| r["mac"] == far && r["ip"] == "fd77::50")
    };
    assert!(wait_for(30, || bound(&lab.json(&["evpn", "show"], 1))), "{}", lab.json(&["evpn", "show"], 1));
    // h1's guest asks for the bound address, by ARP and by neighbour solicitation (the
    // lab's guests have addresses in fd77::/64): the switch answers, nothing crosses the
    // underlay; for an unbound one the request is flooded into the tunnel as before.
    let (ns1, if1) = lab.guest("h1g1");
    let ul = format!("sluice-{}-ul", lab.name);
    for (a, answered) in [("10.77.0.50", true), ("10.77.0.51", false), ("fd77::50", true), ("fd77::51", false)] {
        let ip: IpAddr = a.parse().unwrap();
        let six = if ip.is_ipv6() { "-6 " } else { "" };
        ns_ok(&ns1, &format!("ip {six}neigh flush dev {if1}"));
        // (h1's port of the underlay bridge: all it sends into the tunnel.)
        let underlay = listen_raw(&ul, "u1", 0x0800, 3.0);
        let _ = lab.exec("h1g1", &format!("ping {six}-c 1 -W 1 {a}"));
        let crossed = request_in_tunnel(&received(underlay), ip);
        let neigh = ns_ok(&ns1, &format!("ip {six}neigh show {a} dev {if1}"));
        if answered {
            assert!(neigh.contains(far), "h1g1 did not learn {a} at {far}: {neigh}");
            assert!(!crossed, "the request for {a} crossed the underlay");
        } else {
            assert!(crossed, "the request for {a}, which no route binds, was not flooded into the tunnel");
            assert!(!neigh.contains("lladdr"), "{neigh}");
        }
    }
    for counter in ["arp_suppressed", "nd_suppressed"] {
        let suppressed = || lab.json(&["evpn", "show"], 1)["counters"][counter].as_u64() >= Some(1);
        assert!(wait_for(5, suppressed), "{counter} not counted: {}", lab.json(&["evpn", "show"], 1)["counters"]);
    }
}

#[test]
#[ignore = "system tier: needs root, gobgpd and FRR (bgpd, zebra, vtysh); scripts/test.sh runs it"]
fn addresses_are_bound_both_ways_with_frr_and_arp_for_them_is_answered_by_the_switch() {
    if !tools() {
        return;
    }
    init();
    let lab = EvpnLab::up("ea");
    assert!(lab.reaches("h1g1", "10.77.0.3"));
    let m3 = mac(&lab, "h3g1");
    // The FRR host's bridge gets an address and talks to its guest: zebra learns the
    // guest's address and FRR announces a MAC+IP route for it.
    let h3 = format!("sluice-{}-h3", lab.name);
    ns_ok(&h3, "ip addr add 10.77.0.253/24 dev br0 && ping -c 1 -W 1 10.77.0.3");
    assert!(
        wait_for(30, || lab.frr("show evpn arp-cache vni all").lines().any(|l| l.starts_with("10.77.0.3 "))),
        "FRR did not learn its guest's address: {}",
        lab.frr("show evpn arp-cache vni all")
    );
    let bound = |ev: &Value| {
        ev["received"].as_array().unwrap().iter().any(|r| r["mac"] == m3.as_str() && r["ip"] == "10.77.0.3")
            && ev["counters"]["bindings"].as_u64() >= Some(1)
    };
    assert!(wait_for(30, || bound(&lab.json(&["evpn", "show"], 1))), "{}", lab.json(&["evpn", "show"], 1));
    // h1's guest resolves it: answered by h1's switch, nothing crosses the underlay.
    let (ns1, if1) = lab.guest("h1g1");
    ns_ok(&ns1, &format!("ip neigh flush dev {if1}"));
    let ul = format!("sluice-{}-ul", lab.name);
    let underlay = listen_raw(&ul, "u1", 0x0800, 3.0);
    let o = lab.exec("h1g1", "ping -c 1 -W 1 10.77.0.3");
    let crossed = arp_in_tunnel(&received(underlay), [10, 77, 0, 3]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stdout));
    assert!(!crossed, "h1g1's request for 10.77.0.3 crossed the underlay");
    let neigh = ns_ok(&ns1, &format!("ip neigh show 10.77.0.3 dev {if1}"));
    assert!(neigh.contains(m3.as_str()), "{neigh}");
    let suppressed = || lab.json(&["evpn", "show"], 1)["counters"]["arp_suppressed"].as_u64() >= Some(1);
    assert!(wait_for(5, suppressed), "not counted: {}", lab.json(&["evpn", "show"], 1)["counters"]);
    // The other way: h1's guest's ARP messages bound its address on h1, which announces
    // it; FRR lists it as a remote neighbour behind h1.
    let m1 = mac(&lab, "h1g1");
    let sent =
        |ev: &Value| ev["sent"].as_array().unwrap().iter().any(|r| r["mac"] == m1.as_str() && r["ip"] == "10.77.0.1");
    assert!(wait_for(30, || sent(&lab.json(&["evpn", "show"], 1))), "{}", lab.json(&["evpn", "show"], 1));
    let remote = || {
        lab.frr("show evpn arp-cache vni all")
            .lines()
            .any(|l| l.starts_with("10.77.0.1 ") && l.contains("remote") && l.contains("192.168.77.1"))
    };
    assert!(wait_for(30, remote), "FRR lacks h1g1's address: {}", lab.frr("show evpn arp-cache vni all"));
}

//! The uplink port, through `sluice lab up --lan`: guests and a host on the "LAN" (a
//! namespace behind a veth pair whose other end the switch opens with AF_PACKET) reach each other over IPv4 and IPv6; a
//! 100 MB transfer arrives intact with offloads on (GSO frames whole) and off (cut in
//! software); VLAN tags the kernel strips on the uplink are restored, and guests' frames
//! leave on it tagged.

mod common;

use common::*;

both_datapaths! {
    #[ignore = "system tier: needs root (network namespaces, TAP devices and uplink veths), ping and nc; scripts/test.sh runs it"]
    fn guests_and_the_lan_reach_each_other_and_transfers_arrive_intact(dp: Dp) {
        if !root() {
            return;
        }
        let lab = Lab::on(dp, "upl", &["--guests", "2", "--lan"]);
        let lan = Lan::of(&lab);
        ns_ok(&lab.ns(1), "ping -c 2 -W 2 10.77.0.200");
        ns_ok(&lab.ns(2), "ping -6 -c 2 -W 2 fd77::c8");
        ns_ok(&lan.lan_ns, &format!("ping -c 2 -W 2 {}", lab.ip4(2)));
        ns_ok(&lan.lan_ns, &format!("ping -6 -c 2 -W 2 {}", lab.ip6(1)));

        sluice_ok(&["stats", "reset", "--switch", &lab.name]);
        transfer_100mb(&lab, &lan, 5001);
        let up = lab.port(&lan.port);
        assert_eq!(up["kind"], "uplink", "{up}");
        assert!(up["counters"]["tx_gso"].as_u64().unwrap() > 0, "GSO frames left whole on the uplink: {up}");
        assert_eq!(up["counters"]["tx_segmented"], 0, "{up}");
        if dp == Dp::Kernel {
            // Guest to LAN and back in the kernel, without the core.
            assert_mostly_in_kernel(&lab.port(&lab.tap(1)));
            assert_mostly_in_kernel(&up);
        }
        assert_conserved(&lab.settled_stats());

        // Offloads off on the uplink: the switch cuts the guest's GSO frames itself.
        lan.reattach(&lab, &["--no-offload"]);
        assert!(
            ns_sh(&lan.up_ns, &format!("ip link show {}", lan.port)).status.success(),
            "deleting the port left the interface"
        );
        transfer_cut_for_the_uplink(&lab, &lan, 5002);
    }
}

both_datapaths! {
    #[ignore = "system tier: needs root (network namespaces, TAP devices and uplink veths), python3; scripts/test.sh runs it"]
    fn vlan_tags_cross_the_uplink_both_ways(dp: Dp) {
        if !root() {
            return;
        }
        let mut lab = Lab::on(dp, "uplv", &["--guests", "1", "--lan"]); // g1: access VLAN 1
        let lan = Lan::of(&lab);
        lan.reattach(&lab, &["--trunk", "10", "--native", "1"]);
        let (a10, a10tap) = lab.add_guest("a10", &["--vlan", "10"], None);
        let lanmac = mac_of(&lan.lan_ns, "eth0");
        let payload = b"a tagged frame from the LAN, through the uplink";

        // Tagged 10 from the LAN (the kernel strips the tag before the switch's socket sees
        // it): it reaches the VLAN 10 guest only.
        let l10 = listen_raw(&a10, &a10tap, 0x88b5, 2.5);
        let l1 = listen_raw(&lab.ns(1), &lab.tap(1), 0x88b5, 2.5);
        send_raw(&lan.lan_ns, "eth0", &[frame([0xff; 6], lanmac, Some(10), 0x88b5, payload)]);
        assert_eq!(received(l10), vec![(None, frame([0xff; 6], lanmac, None, 0x88b5, payload))]);
        assert!(received(l1).is_empty(), "VLAN 10 leaked to VLAN 1");

        // From the VLAN 10 guest: tagged 10 on the LAN; from VLAN 1: untagged (native).
        let a10mac = mac_of(&a10, &a10tap);
        let g1mac = mac_of(&lab.ns(1), &lab.tap(1));
        let ll = listen_raw(&lan.lan_ns, "eth0", 0x88b5, 2.5);
        send_raw(&a10, &a10tap, &[frame([0xff; 6], a10mac, None, 0x88b5, payload)]);
        send_raw(&lab.ns(1), &lab.tap(1), &[frame([0xff; 6], g1mac, None, 0x88b5, payload)]);
        let got = received(ll);
        assert!(got.contains(&(Some(10), frame([0xff; 6], a10mac, None, 0x88b5, payload))), "{got:?}");
        assert!(got.contains(&(None, frame([0xff; 6], g1mac, None, 0x88b5, payload))), "{got:?}");
        assert_conserved(&lab.settled_stats());
    }
}

#[test]
#[ignore = "system tier: needs root (network namespaces, TAP devices and uplink veths); scripts/test.sh runs it"]
fn an_uplink_that_does_not_exist_is_refused_with_what_to_do() {
    if !root() {
        return;
    }
    let lab = Lab::up("uplx", &["--guests", "1"]);
    let o = sluice(&["port", "add", "nosuchif0", "--type", "uplink", "--switch", &lab.name]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("no network interface \"nosuchif0\"") && err.contains("--netns"), "{err}");
}

both_datapaths! {
    #[ignore = "system tier: needs root (network namespaces, TAP devices and uplink veths), ping; scripts/test.sh runs it"]
    fn an_isolated_guest_reaches_the_lan_but_no_other_guest(dp: Dp) {
        if !root() {
            return;
        }
        let mut lab = Lab::on(dp, "upli", &["--guests", "1", "--lan"]);
        let lan = Lan::of(&lab);
        let (iso, _) = lab.add_guest("iso", &["--isolated"], Some("10.77.0.11"));
        ns_ok(&iso, "ping -c 2 -W 2 10.77.0.200");
        ns_ok(&lan.lan_ns, "ping -c 2 -W 2 10.77.0.11");
        assert!(!ns_sh(&iso, &format!("ping -c 2 -W 1 {}", lab.ip4(1))).status.success(), "isolated guest reached g1");
        assert!(!ns_sh(&lab.ns(1), "ping -c 2 -W 1 10.77.0.11").status.success(), "g1 reached the isolated guest");
        ns_ok(&lab.ns(1), "ping -c 2 -W 2 10.77.0.200");
        assert_conserved(&lab.settled_stats());
    }
}

both_datapaths! {
    #[ignore = "system tier: needs root (network namespaces, TAP devices and uplink veths), ping; scripts/test.sh runs it"]
    fn a_guest_forging_a_mac_is_dropped_and_counted(dp: Dp) {
        if !root() {
            return;
        }
        let mut lab = Lab::on(dp, "uplm", &["--guests", "1"]);
        let (sp, tap) = lab.add_guest("sp", &["--mac", "02:00:00:00:00:55"], Some("10.77.0.12"));
        ns_ok(&sp, &format!("ip link set dev {tap} address 02:00:00:00:00:55"));
        ns_ok(&sp, &format!("ping -c 2 -W 2 {}", lab.ip4(1)));
        // (Frames the TAP sent with its first, random address before it took the allowed one
        // were already dropped.)
        let before = lab.port(&tap)["counters"]["rx_drops"]["spoofed_mac"].as_u64().unwrap();
        // The guest takes another address: its frames no longer pass.
        ns_ok(&sp, &format!("ip link set dev {tap} address 02:00:00:00:00:66 && ip neigh flush dev {tap}"));
        assert!(!ns_sh(&sp, &format!("ping -c 2 -W 1 {}", lab.ip4(1))).status.success(), "forged MAC passed");
        let dropped = lab.port(&tap)["counters"]["rx_drops"]["spoofed_mac"].as_u64().unwrap();
        assert!(dropped >= before + 2, "forged frames counted: {before} → {dropped}");
        assert_conserved(&lab.settled_stats());
        let o = sluice(&["port", "add", "bad0", "--mac", "zz", "--switch", &lab.name]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && err.contains("not a MAC address"), "{err}");
    }
}

both_datapaths! {
    #[ignore = "system tier: needs root (network namespaces, TAP devices and uplink veths), ping; scripts/test.sh runs it"]
    fn a_guest_forging_an_ip_address_is_dropped_and_counted(dp: Dp) {
        if !root() {
            return;
        }
        let mut lab = Lab::on(dp, "upla", &["--guests", "1"]);
        let (g, tap) = lab.add_guest("ip", &["--ip", "10.77.0.13"], Some("10.77.0.13"));
        ns_ok(&g, &format!("ping -c 2 -W 2 {}", lab.ip4(1)));
        let before = lab.port(&tap)["counters"]["rx_drops"]["spoofed_ip"].as_u64().unwrap();
        ns_ok(&g, &format!("ip addr add 10.77.0.14/24 dev {tap}"));
        assert!(
            !ns_sh(&g, &format!("ping -c 2 -W 1 -I 10.77.0.14 {}", lab.ip4(1))).status.success(),
            "a packet from an address the port is not allowed passed"
        );
        let after = lab.port(&tap)["counters"]["rx_drops"]["spoofed_ip"].as_u64().unwrap();
        assert!(after >= before + 2, "forged packets counted: {before} → {after}");
        ns_ok(&g, &format!("ping -c 1 -W 2 -I 10.77.0.13 {}", lab.ip4(1)));
        assert_conserved(&lab.settled_stats());
        let o = sluice(&["port", "add", "bad1", "--ip", "10.0.0.1/24", "--switch", &lab.name]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && err.contains("not an IPv4 or IPv6 address"), "{err}");
    }
}

#[test]
#[ignore = "system tier: needs root (network namespaces, TAP devices and uplink veths), ping; scripts/test.sh runs it"]
fn lab_up_with_a_lan_builds_the_external_host_and_down_removes_it() {
    if !root() {
        return;
    }
    let lab = Lab::up("lanl", &["--guests", "2", "--lan"]);
    let lan = &lab.state["guests"][2];
    assert_eq!(lan["guest"], "lan", "{}", lab.state);
    let lan_ns = lan["netns"].as_str().unwrap().to_string();
    let up_ns = format!("sluice-{}-up", lab.name);
    assert_eq!(lab.port(lan["tap"].as_str().unwrap())["kind"], "uplink");
    ns_ok(&lab.ns(1), "ping -c 1 -W 2 10.77.0.200");
    ns_ok(&lan_ns, &format!("ping -6 -c 1 -W 2 {}", lab.ip6(2)));
    let out = sluice_ok(&["lab", "exec", "lan", "--name", &lab.name, "--", "ip", "-br", "addr", "show", "eth0"]);
    assert!(out.contains("10.77.0.200/24"), "{out}");
    sluice_ok(&["lab", "down", "--name", &lab.name]);
    for ns in [&lan_ns, &up_ns] {
        assert!(!std::path::Path::new(&format!("/run/netns/{ns}")).exists(), "{ns} left behind");
    }
}

both_datapaths! {
    #[ignore = "system tier: needs root (network namespaces, TAP devices and uplink veths), iperf3; scripts/test.sh runs it"]
    fn traffic_moves_to_a_backup_uplink_when_the_active_one_goes_down(dp: Dp) {
        if !root() {
            return;
        }
        let lab = Lab::on(dp, "uplf", &["--guests", "1", "--lan", "--uplinks", "2"]);
        let lan = Lan::of(&lab);
        let server = ns_spawn(&lan.lan_ns, "timeout 30 iperf3 -s -1");
        assert!(wait_for(10, || ns_sh(&lan.lan_ns, "ss -ltn | grep -q :5201").status.success()));
        let client = ns_spawn(&lab.ns(1), "iperf3 -c 10.77.0.200 -t 8 -i 1 -J");
        std::thread::sleep(std::time::Duration::from_secs(2));
        ns_ok(&lan.up_ns, &format!("ip link set {} down", lan.port));
        let out = client.wait_with_output().unwrap();
        let _ = server.wait_with_output();
        assert!(out.status.success(), "iperf3 failed: {}", String::from_utf8_lossy(&out.stdout));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let intervals = v["intervals"].as_array().unwrap();
        let last = intervals.last().unwrap()["sum"]["bytes"].as_u64().unwrap();
        assert!(
            last > 0,
            "traffic resumed on the backup: {:?}",
            intervals.iter().map(|i| &i["sum"]["bytes"]).collect::<Vec<_>>()
        );
        let up = lab.port(&lan.port);
        assert_eq!(up["counters"]["failovers"], 1, "{up}");
        // The guest was announced through the backup (a RARP from its MAC), before it sent.
        assert!(up["counters"]["generated"].as_u64().unwrap() >= 1, "{up}");
        assert_conserved(&lab.settled_stats());
    }
}

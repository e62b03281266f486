//! Layer 3 mode with real guests and a real LAN host (`sluice lab up --mode l3 --lan`):
//! ping and ping6 both ways, 100 MB transfers intact with offloads on and off, every
//! guest seen on the LAN behind the uplink's MAC, non-IP frames dropped and counted, the
//! guests announced from the backup's MAC after a failover, and a running switch of the
//! other mode refused.

mod common;

use common::*;

fn mac_str(m: [u8; 6]) -> String {
    m.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":")
}

/// The MAC address `ip neigh` in `ns` has for `ip`.
fn neigh_mac(ns: &str, ip: &str) -> Option<String> {
    let out = ns_sh(ns, &format!("ip neigh show {ip}"));
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let mut words = text.split_whitespace();
    words.by_ref().find(|w| *w == "lladdr")?;
    words.next().map(String::from)
}

both_datapaths! {
    #[ignore = "system tier: needs root (network namespaces, TAP devices, and veths with BPF programs for the kernel datapath), ping and nc; scripts/test.sh runs it"]
    fn in_layer_3_guests_and_the_lan_reach_each_other_and_transfers_arrive_intact(dp: Dp) {
        if !root() {
            return;
        }
        let lab = Lab::on(dp, "l3p", &["--guests", "2", "--lan", "--mode", "l3"]);
        assert_eq!(lab.state["mode"], "l3", "{}", lab.state);
        let lan = Lan::of(&lab);
        ns_ok(&lab.ns(1), "ping -c 2 -W 2 10.77.0.200");
        ns_ok(&lab.ns(2), "ping -6 -c 2 -W 2 fd77::c8");
        ns_ok(&lan.lan_ns, &format!("ping -c 2 -W 2 {}", lab.ip4(2)));
        ns_ok(&lan.lan_ns, &format!("ping -6 -c 2 -W 2 {}", lab.ip6(1)));
        ns_ok(&lab.ns(1), &format!("ping -c 2 -W 2 {}", lab.ip4(2)));
        ns_ok(&lab.ns(2), &format!("ping -6 -c 2 -W 2 {}", lab.ip6(1)));
        // The guests learned the switch's MAC for everyone; the switch answered.
        assert_eq!(neigh_mac(&lab.ns(1), "10.77.0.200").as_deref(), Some("02:73:6c:75:69:01"));
        let g1 = lab.port(&lab.tap(1));
        assert!(g1["counters"]["consumed"].as_u64().unwrap() > 0, "{g1}");
        assert!(g1["counters"]["generated"].as_u64().unwrap() > 0, "{g1}");

        sluice_ok(&["stats", "reset", "--switch", &lab.name]);
        transfer_100mb(&lab, &lan, 5011);
        let up = lab.port(&lan.port);
        assert!(up["counters"]["tx_gso"].as_u64().unwrap() > 0, "GSO frames crossed whole: {up}");
        assert_eq!(up["counters"]["tx_segmented"], 0, "{up}");
        if dp == Dp::Kernel {
            // Routed in the kernel, MACs rewritten there, both ways.
            assert_mostly_in_kernel(&lab.port(&lab.tap(1)));
            assert_mostly_in_kernel(&up);
        }
        assert_conserved(&lab.settled_stats());

        lan.reattach(&lab, &["--no-offload"]);
        transfer_cut_for_the_uplink(&lab, &lan, 5012);
    }
}

both_datapaths! {
    #[ignore = "system tier: needs root (network namespaces, TAP devices, and veths with BPF programs for the kernel datapath), ping and tshark; scripts/test.sh runs it"]
    fn in_layer_3_every_guest_is_seen_on_the_lan_with_the_uplinks_mac(dp: Dp) {
        if !root() || !have("tshark") {
            eprintln!("skipped: needs root and tshark");
            return;
        }
        let lab = Lab::on(dp, "l3m", &["--guests", "2", "--lan", "--mode", "l3"]);
        let lan = Lan::of(&lab);
        let up_mac = mac_str(mac_of(&lan.up_ns, &lan.port));
        let g2_mac = mac_str(mac_of(&lab.ns(2), &lab.tap(2)));
        let cap = ns_spawn(
            &lan.lan_ns,
            "timeout 30 tshark -l -q -i eth0 -f 'ip src 10.77.0.2 or ip6 src fd77::2' -a duration:20 -a packets:4 -T fields -e eth.src",
        );
        assert!(wait_for(15, || ns_sh(&lan.lan_ns, "[ $(wc -l < /proc/net/packet) -gt 1 ]").status.success()));
        std::thread::sleep(std::time::Duration::from_millis(500));
        ns_ok(&lab.ns(2), "ping -c 2 -W 2 10.77.0.200");
        ns_ok(&lab.ns(2), "ping -6 -c 2 -W 2 fd77::c8");
        let out = cap.wait_with_output().unwrap();
        let seen: Vec<String> = String::from_utf8_lossy(&out.stdout).lines().map(|l| l.trim().to_string()).collect();
        assert_eq!(seen.len(), 4, "captured {seen:?}");
        assert!(seen.iter().all(|m| *m == up_mac), "g2 ({g2_mac}) seen on the LAN as {seen:?}, want {up_mac}");
        // And the LAN host holds one MAC, the uplink's, for both guests.
        ns_ok(&lan.lan_ns, "ping -c 1 -W 2 10.77.0.1");
        assert_eq!(neigh_mac(&lan.lan_ns, "10.77.0.1"), Some(up_mac.clone()));
        assert_eq!(neigh_mac(&lan.lan_ns, "10.77.0.2"), Some(up_mac));
    }
}

both_datapaths! {
    #[ignore = "system tier: needs root (network namespaces, TAP devices, and veths with BPF programs for the kernel datapath), python3; scripts/test.sh runs it"]
    fn in_layer_3_non_ip_frames_are_dropped_and_counted(dp: Dp) {
        if !root() {
            return;
        }
        let lab = Lab::on(dp, "l3n", &["--guests", "2", "--mode", "l3"]);
        let g1mac = mac_of(&lab.ns(1), &lab.tap(1));
        let l2 = listen_raw(&lab.ns(2), &lab.tap(2), 0x88b5, 2.0);
        send_raw(&lab.ns(1), &lab.tap(1), &vec![frame([0xff; 6], g1mac, None, 0x88b5, b"not IP"); 3]);
        assert!(received(l2).is_empty(), "a non-IP frame crossed a Layer 3 switch");
        let c = &lab.port(&lab.tap(1))["counters"];
        assert!(c["rx_drops"]["not_ip"].as_u64().unwrap() >= 3, "{c}");
        assert_conserved(&lab.settled_stats());
    }
}

both_datapaths! {
    #[ignore = "system tier: needs root (network namespaces, TAP devices, and veths with BPF programs for the kernel datapath), ping; scripts/test.sh runs it"]
    fn after_a_failover_the_lan_learns_the_guests_behind_the_backups_mac(dp: Dp) {
        if !root() {
            return;
        }
        let lab = Lab::on(dp, "l3f", &["--guests", "1", "--lan", "--uplinks", "2", "--mode", "l3"]);
        let lan = Lan::of(&lab);
        let backup = format!("{}2", lan.port);
        ns_ok(&lan.lan_ns, "ping -c 1 -W 2 10.77.0.1");
        assert_eq!(neigh_mac(&lan.lan_ns, "10.77.0.1"), Some(mac_str(mac_of(&lan.up_ns, &lan.port))));
        // Past the kernel's ARP lock time, so the announcement may replace the entry.
        std::thread::sleep(std::time::Duration::from_millis(1200));
        ns_ok(&lan.up_ns, &format!("ip link set {} down", lan.port));
        assert!(wait_for(10, || lab.port(&lan.port)["counters"]["failovers"] == 1), "no failover");
        let want = mac_str(mac_of(&lan.up_ns, &backup));
        // The guest has sent nothing: only the switch's announcement can have told the LAN.
        assert!(
            wait_for(5, || neigh_mac(&lan.lan_ns, "10.77.0.1").as_deref() == Some(&want)),
            "the LAN still has {:?} for 10.77.0.1, want the backup's {want}",
            neigh_mac(&lan.lan_ns, "10.77.0.1")
        );
        ns_ok(&lan.lan_ns, "ping -c 1 -W 2 10.77.0.1");
        assert!(lab.port(&lan.port)["counters"]["generated"].as_u64().unwrap() >= 2, "a gratuitous ARP and an NA");
        assert_conserved(&lab.settled_stats());
    }
}

#[test]
#[ignore = "system tier: needs root (network namespaces and TAP devices); scripts/test.sh runs it"]
fn a_lab_refuses_a_running_switch_of_the_other_mode() {
    if !root() {
        return;
    }
    let lab = Lab::up("l3x", &["--guests", "1"]);
    let other = unique("l3y");
    let o = sluice(&["lab", "up", "--name", &other, "--switch", &lab.name, "--mode", "l3"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "accepted");
    assert!(err.contains("runs in l2 mode") && err.contains("--mode l2"), "{err}");
    assert!(!std::path::Path::new(&format!("/run/netns/sluice-{other}-g1")).exists(), "left a guest behind");
    // The lab's own switch is untouched.
    assert_eq!(lab.stats()["ports"].as_array().unwrap().len(), 1);
}

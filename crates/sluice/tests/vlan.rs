//! VLANs with real guests: access ports keep VLANs apart; a trunk port carries its allowed
//! VLANs tagged and its native VLAN untagged; frames of other VLANs are dropped and counted.

mod common;

use common::*;

both_datapaths! {
    #[ignore = "system tier: needs root (network namespaces, TAP devices, and veths with BPF programs for the kernel datapath), ping; scripts/test.sh runs it"]
    fn access_ports_isolate_vlans(dp: Dp) {
        if !root() {
            return;
        }
        let mut lab = Lab::on(dp, "vacc", &["--guests", "1"]);
        let (a, _) = lab.add_guest("a", &["--vlan", "10"], Some("10.77.0.11"));
        let (_b, _) = lab.add_guest("b", &["--vlan", "10"], Some("10.77.0.12"));
        let (_c, _) = lab.add_guest("c", &["--vlan", "20"], Some("10.77.0.13"));
        ns_ok(&a, "ping -c 2 -W 2 10.77.0.12");
        let o = ns_sh(&a, "ping -c 2 -W 1 10.77.0.13");
        assert!(!o.status.success(), "VLAN 10 reached VLAN 20");
        let o = ns_sh(&a, &format!("ping -c 2 -W 1 {}", lab.ip4(1)));
        assert!(!o.status.success(), "VLAN 10 reached VLAN 1");
        let c = lab.port(&format!("{}-c", lab.name));
        // (The switch's own IGMP/MLD queries aside.)
        let offered = c["counters"]["tx_offered"].as_u64().unwrap() - c["counters"]["generated"].as_u64().unwrap();
        assert_eq!(offered, 0, "nothing of VLAN 10 (ARP, ping) reached the VLAN 20 port: {c}");
        assert_conserved(&lab.settled_stats());
    }
}

both_datapaths! {
    #[ignore = "system tier: needs root (network namespaces, TAP devices, and veths with BPF programs for the kernel datapath), python3; scripts/test.sh runs it"]
    fn trunk_port_with_allowed_list_and_native_vlan(dp: Dp) {
        if !root() {
            return;
        }
        let mut lab = Lab::on(dp, "vtrk", &["--guests", "1"]); // g1: access VLAN 1
        let (t, ttap) = lab.add_guest("t", &["--trunk", "10,20", "--native", "1"], None);
        let (a10, a10tap) = lab.add_guest("a10", &["--vlan", "10"], None);
        let (a30, a30tap) = lab.add_guest("a30", &["--vlan", "30"], None);
        let tmac = mac_of(&t, &ttap);
        let payload = b"tagged frame from a guest on a trunk port...";

        // Tagged VLAN 10 from the trunk: arrives untagged at the VLAN 10 access port only.
        let l10 = listen_raw(&a10, &a10tap, 0x88b5, 2.5);
        let l30 = listen_raw(&a30, &a30tap, 0x88b5, 2.5);
        let l1 = listen_raw(&lab.ns(1), &lab.tap(1), 0x88b5, 2.5);
        send_raw(&t, &ttap, &[frame([0xff; 6], tmac, Some(10), 0x88b5, payload)]);
        let (g10, g30, g1) = (received(l10), received(l30), received(l1));
        assert_eq!(g10, vec![(None, frame([0xff; 6], tmac, None, 0x88b5, payload))]);
        assert!(g30.is_empty() && g1.is_empty(), "VLAN 10 leaked: {g30:?} {g1:?}");

        // Untagged from the trunk: native VLAN 1.
        let l1 = listen_raw(&lab.ns(1), &lab.tap(1), 0x88b5, 2.5);
        let l10 = listen_raw(&a10, &a10tap, 0x88b5, 2.5);
        send_raw(&t, &ttap, &[frame([0xff; 6], tmac, None, 0x88b5, payload)]);
        assert_eq!(received(l1).len(), 1);
        assert!(received(l10).is_empty());

        // Tagged 30 is not allowed on the trunk: dropped and counted.
        let before = lab.port(&ttap)["counters"]["rx_drops"]["vlan_filter"].as_u64().unwrap();
        let l30 = listen_raw(&a30, &a30tap, 0x88b5, 2.0);
        send_raw(&t, &ttap, &[frame([0xff; 6], tmac, Some(30), 0x88b5, payload)]);
        assert!(received(l30).is_empty());
        let after = lab.port(&ttap)["counters"]["rx_drops"]["vlan_filter"].as_u64().unwrap();
        assert_eq!(after, before + 1);

        // From the VLAN 10 access port to the trunk: tagged 10. From VLAN 1: untagged.
        let a10mac = mac_of(&a10, &a10tap);
        let lt = listen_raw(&t, &ttap, 0x88b5, 2.5);
        send_raw(&a10, &a10tap, &[frame([0xff; 6], a10mac, None, 0x88b5, payload)]);
        let g1mac = mac_of(&lab.ns(1), &lab.tap(1));
        send_raw(&lab.ns(1), &lab.tap(1), &[frame([0xff; 6], g1mac, None, 0x88b5, payload)]);
        let got = received(lt);
        assert!(got.contains(&(Some(10), frame([0xff; 6], a10mac, None, 0x88b5, payload))), "{got:?}");
        assert!(got.contains(&(None, frame([0xff; 6], g1mac, None, 0x88b5, payload))), "{got:?}");
        // VLAN 30 traffic never reaches the trunk.
        let lt = listen_raw(&t, &ttap, 0x88b5, 2.0);
        let a30mac = mac_of(&a30, &a30tap);
        send_raw(&a30, &a30tap, &[frame([0xff; 6], a30mac, None, 0x88b5, payload)]);
        assert!(received(lt).is_empty());
        assert_conserved(&lab.settled_stats());
    }
}

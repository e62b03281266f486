//! A port's MTU holds on both datapaths: a frame whose IP packet is larger than the output
//! port's MTU is dropped there (`over_mtu`), and so is a GSO frame whose segments would be
//! — the kernel datapath must not let 64 KB TSO frames slip past the check.

mod common;

use common::*;

both_datapaths! {
    #[ignore = "system tier: needs root (network namespaces, TAP devices, and veths with BPF programs for the kernel datapath), ping and iperf3; scripts/test.sh runs it"]
    fn frames_and_gso_segments_over_the_output_mtu_are_dropped(dp: Dp) {
        if !root() || !have("iperf3") {
            eprintln!("skipped: needs root and iperf3");
            return;
        }
        let mut lab = Lab::on(dp, "mtu", &["--guests", "1", "--mtu", "1500"]);
        // The port allows 1400-byte packets; the guest's own interface says 1500, so its
        // TCP asks for 1460-byte segments, which the switch must refuse to deliver.
        let (ns, tap) = lab.add_guest("small", &["--mtu", "1400"], Some("10.77.0.60"));
        ns_ok(&ns, &format!("ip link set dev {tap} mtu 1500 && ip link set dev {tap} up"));
        let g1 = lab.ns(1);
        assert!(
            wait_for(15, || ns_sh(&g1, "ping -c 1 -W 1 -s 1300 -M do 10.77.0.60").status.success()),
            "1328-byte packets fit the port's MTU of 1400"
        );
        let o = ns_sh(&g1, "ping -c 3 -W 1 -i 0.2 -s 1450 -M do 10.77.0.60");
        assert!(!o.status.success(), "1478-byte packets must not reach a port with an MTU of 1400");
        let before = lab.port(&tap)["counters"].clone();
        assert!(before["tx_drops"]["over_mtu"].as_u64().unwrap() >= 3, "{before}");

        // TCP with TSO: the sender's frames are GSO frames of many 1500-byte segments.
        let server = ns_spawn(&ns, "timeout 20 iperf3 -s -1");
        assert!(wait_for(10, || ns_sh(&ns, "ss -ltn | grep -q :5201").status.success()));
        let _ = ns_sh(&g1, "timeout 12 iperf3 -c 10.77.0.60 -t 3 --connect-timeout 3000");
        let _ = server.wait_with_output();
        let s = lab.stats();
        let p = s["ports"].as_array().unwrap().iter().find(|p| p["name"] == tap.as_str()).unwrap();
        let sender = s["ports"].as_array().unwrap().iter().find(|p| p["name"] == lab.tap(1).as_str()).unwrap();
        let c = &p["counters"];
        assert!(sender["counters"]["rx_gso"].as_u64().unwrap() > 0, "the sender sent GSO frames: {sender}");
        assert_eq!(c["tx_gso"].as_u64().unwrap(), 0, "no GSO frame of 1500-byte segments was delivered: {c}");
        assert!(
            c["tx_drops"]["over_mtu"].as_u64().unwrap() > before["tx_drops"]["over_mtu"].as_u64().unwrap(),
            "GSO frames were dropped as over_mtu: {c}"
        );
        assert_conserved(&s);
    }
}

//! A safe Layer 2: frames to the IEEE link-local addresses (spanning tree, pause, LLDP)
//! stay on the port they came from unless it forwards them, and pause never crosses; a
//! port's broadcast and multicast are held to its storm control rate. Guests in network
//! namespaces send raw frames through both datapaths; the other guests' packet sockets
//! and the switch's counters say what crossed.

mod common;

use common::*;

/// A spanning tree BPDU: to the bridge group address, an 802.3 length and LLC 42 42 03.
fn bpdu(src: [u8; 6]) -> Vec<u8> {
    let mut llc = vec![0x42, 0x42, 0x03, 0, 0, 0, 0, 0];
    llc.resize(38, 0);
    frame([0x01, 0x80, 0xc2, 0, 0, 0], src, None, llc.len() as u16, &llc)
}

/// An IEEE 802.3x pause frame: MAC control (0x8808), opcode 1, the longest pause.
fn pause(src: [u8; 6]) -> Vec<u8> {
    let mut p = vec![0x00, 0x01, 0xff, 0xff];
    p.resize(46, 0);
    frame([0x01, 0x80, 0xc2, 0, 0, 1], src, None, 0x8808, &p)
}

/// An LLDP frame (0x88cc) to the nearest-bridge address; its contents do not matter here.
fn lldp(src: [u8; 6]) -> Vec<u8> {
    frame([0x01, 0x80, 0xc2, 0, 0, 0x0e], src, None, 0x88cc, &[0x02, 0x07, 0x04, 1, 2, 3, 4, 5, 6, 0, 0, 0, 0, 0])
}

fn is_link_local(f: &[u8]) -> bool {
    f[..5] == [0x01, 0x80, 0xc2, 0, 0] && f[5] < 16
}

both_datapaths! {
    #[ignore = "system tier: needs root (network namespaces, TAP devices, and veths with BPF programs for the kernel datapath), python3; scripts/test.sh runs it"]
    fn link_local_frames_stay_on_their_port_unless_it_forwards_them(dp: Dp) {
        if !root() || !have("python3") {
            return;
        }
        let mut lab = Lab::on(dp, "lloc", &["--guests", "2"]);
        let (fns, ftap) = lab.add_guest("f", &["--forward-link-local", "01:80:c2:00:00:0e"], None);
        let g1 = mac_of(&lab.ns(1), &lab.tap(1));
        let f = mac_of(&fns, &ftap);
        let on2 = listen_raw(&lab.ns(2), &lab.tap(2), 0, 3.0);
        let on1 = listen_raw(&lab.ns(1), &lab.tap(1), 0, 3.0);
        // Several of each: the kernel decides the first of a kind in the core, the rest
        // itself.
        let mut from_g1 = Vec::new();
        let mut from_f = Vec::new();
        for _ in 0..5 {
            from_g1.extend([bpdu(g1), pause(g1), lldp(g1)]);
            from_f.extend([lldp(f), pause(f)]);
        }
        send_raw(&lab.ns(1), &lab.tap(1), &from_g1);
        send_raw(&fns, &ftap, &from_f);
        let (got2, got1) = (received(on2), received(on1));

        let link_local_from = |got: &[(Option<u16>, Vec<u8>)], src: [u8; 6]| {
            got.iter().filter(|(_, fr)| fr[6..12] == src && is_link_local(fr)).map(|(_, fr)| fr.clone()).collect::<Vec<_>>()
        };
        assert!(link_local_from(&got2, g1).is_empty(), "a BPDU, pause or LLDP of guest 1 crossed: {got2:?}");
        for (who, got) in [("guest 2", &got2), ("guest 1", &got1)] {
            let ll = link_local_from(got, f);
            assert_eq!(ll.len(), 5, "{who} gets the LLDP the port forwards, and no pause: {ll:?}");
            assert!(ll.iter().all(|fr| fr[5] == 0x0e && fr[12..14] == [0x88, 0xcc]), "{who}: {ll:?}");
        }
        let drops = |tap: &str| lab.port(tap)["counters"]["rx_drops"]["link_local"].as_u64().unwrap_or(0);
        let (t1, t2) = (lab.tap(1), ftap.clone());
        assert!(wait_for(5, || drops(&t1) == 15 && drops(&t2) == 5), "link_local counted at the inputs: {} {}", lab.port(&t1), lab.port(&t2));
        let stats = sluice_ok(&["stats", &t1, "--switch", &lab.name]);
        assert!(stats.contains("link_local"), "`sluice stats` names the cause: {stats}");
        assert_conserved(&lab.settled_stats());
    }
}

both_datapaths! {
    #[ignore = "system tier: needs root (network namespaces, TAP devices, and veths with BPF programs for the kernel datapath), python3; scripts/test.sh runs it"]
    fn a_broadcast_storm_is_cut_to_the_ports_rate_and_unicast_is_not(dp: Dp) {
        if !root() || !have("python3") {
            return;
        }
        const RATE: u64 = 50;
        const BURST: u64 = 10;
        const SENT: u64 = 400;
        let mut lab = Lab::on(dp, "storm", &["--guests", "1"]);
        let (sns, stap) =
            lab.add_guest("s", &["--storm-broadcast-pps", &RATE.to_string(), "--storm-burst", &BURST.to_string()], None);
        let (src, dst) = (mac_of(&sns, &stap), mac_of(&lab.ns(1), &lab.tap(1)));
        let bcast = frame([0xff; 6], src, None, 0x88b5, &[0xbc; 46]);
        let ucast = frame(dst, src, None, 0x88b5, &[0x1c; 46]);
        let l = listen_raw(&lab.ns(1), &lab.tap(1), 0x88b5, 3.0);
        let start = std::time::Instant::now();
        send_raw(&sns, &stap, &vec![bcast.clone(); SENT as usize]);
        let elapsed = start.elapsed().as_secs_f64();
        send_raw(&sns, &stap, &vec![ucast.clone(); 100]);
        let got = received(l);
        let n = |f: &[u8]| got.iter().filter(|(_, g)| g == f).count() as u64;
        let (bc, uc) = (n(&bcast), n(&ucast));
        // The burst, the rate over the time the sender took, and slack: on the kernel
        // datapath the first frames of a key go through the core, which meters them with
        // its own bucket (up to another burst) before the kernel has the verdict.
        let most = BURST + (RATE as f64 * elapsed).ceil() as u64 + BURST + 5;
        eprintln!("{dp:?}: {bc} of {SENT} broadcasts crossed in {elapsed:.3} s (at most {most} allowed)");
        assert!(bc >= BURST.min(SENT) && bc <= most, "{bc} broadcasts crossed, {SENT} sent in {elapsed:.3} s");
        assert_eq!(uc, 100, "unicast is not storm controlled");
        let p = || lab.port(&stap)["counters"]["rx_drops"]["storm"].as_u64().unwrap_or(0);
        assert!(wait_for(5, || p() == SENT - bc), "the rest counted `storm`: {} (want {})", lab.port(&stap), SENT - bc);
        assert_conserved(&lab.settled_stats());
    }
}

//! The software segmentation path: a guest whose port has offloads off receives TCP from
//! a guest that sends 64 KB TSO frames; the switch cuts them, and tshark in the receiving
//! guest finds every IP and TCP checksum correct.

mod common;

use common::*;

both_datapaths! {
    #[ignore = "system tier: needs root (network namespaces, TAP devices, and veths with BPF programs for the kernel datapath), iperf3 and tshark; scripts/test.sh runs it"]
    fn segments_cut_in_software_carry_correct_checksums(dp: Dp) {
        if !root() || !have("tshark") {
            eprintln!("skipped: needs root and tshark");
            return;
        }
        let mut lab = Lab::on(dp, "segm", &["--guests", "1"]);
        let (ns, tap) = lab.add_guest("slow", &["--no-offload"], Some("10.77.0.50"));
        let pcap = scratch(&format!("segm-{}", lab.name)).join("segm.pcap");
        let cap = ns_spawn(
            &ns,
            &format!(
                "timeout 40 tshark -q -i {tap} -f 'tcp port 5201' -a duration:25 -a packets:20000 -w {}",
                pcap.display()
            ),
        );
        // tshark announces nothing reliable on a pipe; wait until its socket is bound.
        assert!(wait_for(15, || ns_sh(&ns, "grep -q . /proc/net/packet && [ $(wc -l < /proc/net/packet) -gt 1 ]")
            .status
            .success()));
        std::thread::sleep(std::time::Duration::from_millis(500));
        let server = ns_spawn(&ns, "timeout 30 iperf3 -s -1");
        assert!(wait_for(10, || ns_sh(&ns, "ss -ltn | grep -q :5201").status.success()));
        ns_ok(&lab.ns(1), "iperf3 -c 10.77.0.50 -n 30M");
        let _ = server.wait_with_output();
        let _ = cap.wait_with_output();
        let fields = sh_ok(&format!(
            "tshark -r {} -o ip.check_checksum:TRUE -o tcp.check_checksum:TRUE -Y 'ip.dst == 10.77.0.50 && tcp.len > 0' -T fields -e ip.checksum.status -e tcp.checksum.status",
            pcap.display()
        ));
        let _ = std::fs::remove_file(&pcap);
        let lines: Vec<&str> = fields.lines().collect();
        assert!(lines.len() > 100, "captured only {} data segments", lines.len());
        let bad: Vec<&&str> = lines.iter().filter(|l| l.split('\t').any(|s| s != "1")).collect();
        assert!(
            bad.is_empty(),
            "{} of {} segments with a checksum not verified good: {:?}",
            bad.len(),
            lines.len(),
            &bad[..bad.len().min(5)]
        );
        let p = lab.port(&tap);
        let c = &p["counters"];
        assert!(c["tx_segmented"].as_u64().unwrap() > 0, "GSO frames were cut for the slow port: {c}");
        assert!(c["tx_segments"].as_u64().unwrap() > c["tx_segmented"].as_u64().unwrap());
        assert_eq!(p["offload"], false);
        assert_conserved(&lab.settled_stats());
    }
}

/// A guest asking for 1-byte segments (a raw socket with a virtio-net header can) gets its
/// frames dropped and counted as `gso_limit`, not cut into one frame per byte for a port
/// without offloads; sensible GSO frames from the same guest are still cut (issue 15).
#[test]
#[ignore = "system tier: needs root (network namespaces and TAP devices), ping and python3; scripts/test.sh runs it"]
fn gso_frames_with_tiny_segments_are_dropped_not_amplified() {
    if !root() {
        return;
    }
    // Guests 1 and 2 with offloads (the sender's kernel passes its GSO frames on whole),
    // the receiver's port without: the switch would cut for it.
    let mut lab = Lab::up("gsoamp", &["--guests", "2"]);
    let (rns, rtap) = lab.add_guest("n", &["--no-offload"], Some("10.77.0.9"));
    let sender = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/gso_send.py");
    let mr = mac_of(&rns, &rtap).iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":");
    let send = |gso: u16, n: u32| {
        ns_ok(&lab.ns(1), &format!("python3 {sender} {} {mr} {} 10.77.0.9 {gso} {n}", lab.tap(1), lab.ip4(1)))
    };
    send(1, 200);
    send(47, 20);
    send(700, 10);
    let g1 = lab.port(&lab.tap(1));
    assert_eq!(g1["counters"]["rx_drops"]["gso_limit"], 220, "{g1}");
    let r = lab.port(&rtap);
    assert_eq!(r["counters"]["tx_segmented"], 10, "the sensible ones are cut: {r}");
    assert_eq!(r["counters"]["tx_segments"], 20, "1,400 bytes in 700-byte segments: {r}");
    ns_ok(&lab.ns(2), &format!("ping -c 2 -W 2 {}", lab.ip4(1)));
    assert_conserved(&lab.settled_stats());
}

//! The software segmentation path: a guest whose port has offloads off receives TCP from
//! a guest that sends 64 KB TSO frames; the switch cuts them, and tshark in the receiving
//! guest finds every IP and TCP checksum correct.

mod common;

use common::*;

both_datapaths! {
    fn segments_cut_in_software_carry_correct_checksums(dp: Dp) {
        if !root() || !have("tshark") {
            eprintln!("skipped: needs root and tshark");
            return;
        }
        let mut lab = Lab::on(dp, "segm", &["--guests", "1"]);
        let (ns, tap) = lab.add_guest("slow", &["--no-offload"], Some("10.77.0.50"));
        let pcap = std::env::temp_dir().join(format!("sluice-segm-{}.pcap", lab.name));
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
        assert_conserved(&lab.stats());
    }
}

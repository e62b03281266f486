//! A hostile guest against the switch (issue 15): a million random and mutated frames, a
//! flood of 100,000 source MACs, GSO frames asking for 1-byte segments — while two other
//! guests move data. The switch stays up, accounts for every frame, keeps its memory and
//! its MAC table bounded, and the others' bytes arrive intact and unheard by the flooder.
//! (How much of their rate they keep is measured by `sluice study run hostile`, not asserted here.)

mod common;

use common::*;
use serde_json::Value;

fn hostile_py() -> &'static str {
    concat!(env!("CARGO_MANIFEST_DIR"), "/tests/hostile.py")
}

fn mac_str(m: [u8; 6]) -> String {
    m.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":")
}

/// Makes guest `g` silent: no addresses, no IPv6, so that every frame its port receives is
/// one the test sent; and lets it send frames up to 9,000 bytes (its port stays at 1,500).
fn silence(lab: &Lab, g: usize) {
    let (ns, dev) = (lab.ns(g), lab.tap(g));
    ns_ok(
        &ns,
        &format!(
            "sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1 && \
             ip addr flush dev {dev} && ip link set {dev} mtu 9000"
        ),
    );
}

/// The daemon's resident memory (kB).
fn daemon_rss_kb(lab: &Lab) -> u64 {
    let pid = lab.stats()["switch"]["pid"].as_u64().unwrap();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// Frames guest `g`'s own side of its link dropped on the way to the switch: a TAP's or a
/// veth's transmit drops, as the guest's kernel counts them.
fn guest_tx_dropped(lab: &Lab, g: usize) -> u64 {
    let out = ns_ok(&lab.ns(g), &format!("cat /sys/class/net/{}/statistics/tx_dropped", lab.tap(g)));
    out.trim().parse().unwrap()
}

fn n(v: &Value) -> u64 {
    v.as_u64().unwrap_or(0)
}

both_datapaths! {
    /// One guest sends 1,000,000 hostile frames (runts, lying lengths, QinQ stacks, frames
    /// over the MTU, multicast sources, random EtherTypes, garbled virtio headers, random
    /// bytes) while two others run iperf3 and a checked transfer.
    #[ignore = "system tier: needs root (network namespaces, TAP devices, and veths with BPF programs for the kernel datapath), ping, nc, iperf3 and python3; scripts/test.sh runs it"]
    fn a_million_hostile_frames_leave_the_switch_up_and_the_others_transfer_intact(dp: Dp) {
        if !root() || !have("iperf3") {
            return;
        }
        let lab = Lab::on(dp, "tort", &["--guests", "3"]);
        silence(&lab, 3);
        let macs = format!("{},{}", mac_str(mac_of(&lab.ns(1), &lab.tap(1))), mac_str(mac_of(&lab.ns(2), &lab.tap(2))));
        ns_ok(&lab.ns(1), &format!("ping -c 2 -W 2 {}", lab.ip4(2)));
        sluice_ok(&["stats", "reset", "--switch", &lab.name]);
        let dropped_before = guest_tx_dropped(&lab, 3);
        let rx_before = match dp {
            Dp::User => 0,
            Dp::Kernel => {
                sh_ok(&format!("cat /sys/class/net/{}/statistics/rx_packets", lab.tap(3))).trim().parse::<u64>().unwrap()
            }
        };
        let rss_before = daemon_rss_kb(&lab);

        // The checked transfer and iperf3, guest 1 to guest 2, while the torture runs.
        let src = scratch(&format!("tort-{}", lab.name)).join("src");
        sh_ok(&format!("head -c 64000000 /dev/urandom > {}", src.display()));
        let want = sh_ok(&format!("sha256sum < {}", src.display()));
        let sink = ns_spawn(&lab.ns(2), "timeout 240 nc -l -N 5001 | sha256sum");
        let server = ns_spawn(&lab.ns(2), "timeout 240 iperf3 -s -1");
        assert!(wait_for(10, || {
            let l = ns_sh(&lab.ns(2), "ss -ltn").stdout;
            let l = String::from_utf8_lossy(&l);
            l.contains(":5001") && l.contains(":5201")
        }));
        let torture = ns_spawn(
            &lab.ns(3),
            &format!("timeout 660 python3 {} torture {} 1000000 15 {macs}", hostile_py(), lab.tap(3)),
        );
        let client = ns_spawn(&lab.ns(1), &format!("timeout 240 iperf3 -c {} -t 8 -J", lab.ip4(2)));
        ns_ok(&lab.ns(1), &format!("timeout 240 nc -N {} 5001 < {}", lab.ip4(2), src.display()));
        let _ = std::fs::remove_file(&src);
        let got = sink.wait_with_output().unwrap();
        assert_eq!(String::from_utf8_lossy(&got.stdout), want, "sha256 of what arrived during the torture");
        let out = client.wait_with_output().unwrap();
        let _ = server.wait_with_output();
        assert!(out.status.success(), "iperf3 failed during the torture: {}", String::from_utf8_lossy(&out.stderr));
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert!(v["error"].is_null(), "{}", v["error"]);
        assert!(n(&v["end"]["sum_received"]["bytes"]) > 0, "iperf3 moved nothing");
        let t = torture.wait_with_output().unwrap();
        assert!(t.status.success(), "hostile.py: {}", String::from_utf8_lossy(&t.stderr));
        let sent: Value = serde_json::from_slice(&t.stdout).unwrap();
        eprintln!("hostile.py: {sent}");

        // The switch is up and every frame is accounted for: every frame guest 3's link took
        // reached the switch, and each it refused (ENOBUFS: it could not queue it) it
        // counted as its own drop; the switch's counters obey their rules.
        let sent_ok = n(&sent["sent"]);
        assert!(sent_ok >= 500_000, "most hostile frames should enter the link: {sent}");
        let port3 = || lab.port(&lab.tap(3));
        if dp == Dp::User {
            assert!(wait_for(30, || n(&port3()["counters"]["rx_frames"]) >= sent_ok), "{}", port3());
            let p3 = port3();
            assert_eq!(n(&p3["counters"]["rx_frames"]), sent_ok, "frames into the switch = frames the link took: {p3}");
        } else {
            // The switch's end of the veth took every frame; the kernel itself discards a
            // few before any TC hook runs (a VLAN tag cut short: skb_vlan_untag fails) and
            // counts them nowhere, so the program sees all but those.
            let took = sh_ok(&format!("cat /sys/class/net/{}/statistics/rx_packets", lab.tap(3)));
            assert_eq!(took.trim().parse::<u64>().unwrap() - rx_before, sent_ok, "the switch's end took them all");
            assert!(
                wait_for(30, || n(&port3()["counters"]["rx_frames"]) >= sent_ok - sent_ok / 1000),
                "all but a few reach the program: {} of {sent_ok}",
                port3()
            );
        }
        let link_drops = guest_tx_dropped(&lab, 3) - dropped_before;
        assert!(link_drops >= n(&sent["refused"]["ENOBUFS"]), "the link counts what it refused: {link_drops} {sent}");
        assert_conserved(&lab.settled_stats());
        // Memory stays bounded: no more than 64 MB grown over a million frames.
        let rss_after = daemon_rss_kb(&lab);
        eprintln!("daemon RSS {rss_before} kB before, {rss_after} kB after; port: {}", port3());
        assert!(rss_after < rss_before + 64 * 1024, "daemon RSS grew from {rss_before} kB to {rss_after} kB");
        // And it still forwards.
        ns_ok(&lab.ns(2), &format!("ping -c 2 -W 2 {}", lab.ip4(1)));
    }
}

both_datapaths! {
    /// One guest floods 100,000 source MACs and another sends GSO frames asking for 1-byte
    /// segments, while two others run iperf3: the table stays at its bounds, the others stay
    /// learned, and none of their unicast reaches the flooder.
    #[ignore = "system tier: needs root (network namespaces, TAP devices, and veths with BPF programs for the kernel datapath), ping, iperf3 and python3; scripts/test.sh runs it"]
    fn a_mac_flood_and_tiny_gso_frames_leave_the_others_learned_and_unheard(dp: Dp) {
        if !root() || !have("iperf3") {
            return;
        }
        let lab = Lab::on(dp, "flood", &["--guests", "4"]);
        silence(&lab, 3);
        let (m1, m2) = (mac_of(&lab.ns(1), &lab.tap(1)), mac_of(&lab.ns(2), &lab.tap(2)));
        ns_ok(&lab.ns(1), &format!("ping -c 2 -W 2 {}", lab.ip4(2)));
        ns_ok(&lab.ns(4), &format!("ping -c 1 -W 2 {}", lab.ip4(2)));
        sluice_ok(&["stats", "reset", "--switch", &lab.name]);

        let server = ns_spawn(&lab.ns(2), "timeout 120 iperf3 -s -1");
        assert!(wait_for(10, || ns_sh(&lab.ns(2), "ss -ltn | grep -q :5201").status.success()));
        let flood = ns_spawn(&lab.ns(3), &format!("timeout 660 python3 {} macflood {} 100000", hostile_py(), lab.tap(3)));
        let gso = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/gso_send.py");
        let tiny = ns_spawn(
            &lab.ns(4),
            &format!("timeout 120 python3 {gso} {} {} {} {} 1 20000", lab.tap(4), mac_str(m2), lab.ip4(4), lab.ip4(2)),
        );
        // The flooder listens for IPv4 while iperf3 runs (its own address is gone, so any
        // IPv4 frame it hears is someone else's).
        let ear = listen_raw(&lab.ns(3), &lab.tap(3), 0x0800, 10.0);
        let client = ns_spawn(&lab.ns(1), &format!("timeout 120 iperf3 -c {} -t 6 -J", lab.ip4(2)));
        let out = client.wait_with_output().unwrap();
        let _ = server.wait_with_output();
        assert!(out.status.success(), "iperf3 failed during the flood: {}", String::from_utf8_lossy(&out.stderr));
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert!(v["error"].is_null(), "{}", v["error"]);
        let f = flood.wait_with_output().unwrap();
        assert!(f.status.success(), "hostile.py: {}", String::from_utf8_lossy(&f.stderr));
        let t = tiny.wait_with_output().unwrap();
        assert!(t.status.success(), "gso_send.py: {}", String::from_utf8_lossy(&t.stderr));

        let heard = received(ear);
        let theirs = heard.iter().filter(|(_, f)| [m1, m2].iter().any(|m| f[..6] == *m || f[6..12] == *m)).count();
        assert_eq!(theirs, 0, "the flooder heard {theirs} of the other guests' frames");

        // (On the kernel datapath the flood's last frames may still wait to go up; those the
        // upcall TAP dropped for a full queue stay in the `upcall` gauge.)
        let port = |st: &Value, g: usize| {
            st["ports"].as_array().unwrap().iter().find(|p| p["name"] == lab.tap(g).as_str()).unwrap().clone()
        };
        let settled = |st: &Value| {
            let waiting: u64 = st["ports"].as_array().unwrap().iter().map(|p| n(&p["upcall"])).sum();
            waiting <= n(&st["kernel"]["upcall_queue_drops"])
        };
        assert!(wait_for(30, || settled(&lab.stats())), "{}", lab.stats());
        let st = lab.stats();
        assert_conserved(&st);
        let fib = sluice_ok(&["fib", "show", "--json", "--switch", &lab.name]);
        let fib: Value = serde_json::from_str(&fib).unwrap();
        let entries = fib["entries"].as_array().unwrap();
        let on = |port: &str| entries.iter().filter(|e| e["port"] == port).count();
        assert!(on(&lab.tap(3)) <= 1024, "the flooder holds at most its share: {}", on(&lab.tap(3)));
        assert!(on(&lab.tap(1)) >= 1 && on(&lab.tap(2)) >= 1, "the others stay learned");
        let p = |g: usize| port(&st, g);
        let p3 = p(3);
        // Every flood frame that reached the switch was refused a place but the first 1,024
        // — or, on the kernel datapath, was one of a burst of a new kind of frame beyond
        // the port's upcall budget, dropped (`upcall_limit`) before the core installed the
        // kind's verdict.
        let rx = n(&p3["counters"]["rx_frames"]) - n(&p3["upcall"]);
        let refused = n(&p3["counters"]["learn_refused"]) + n(&p3["counters"]["rx_drops"]["upcall_limit"]);
        assert!(rx > 10_000 && refused + 1024 >= rx, "{p3}");
        if dp == Dp::Kernel {
            // Once the port was full, the kernel flooded its frames itself: only the first
            // thousand or so (and a few from before the port's rules changed) went up.
            let k = &p3["kernel"];
            assert!(n(&k["flooded"]) > 10_000 && n(&k["upcalls"]) < 20_000, "{p3}");
        }
        let p4 = p(4);
        assert!(n(&p4["counters"]["rx_drops"]["gso_limit"]) > 0, "1-byte segments are refused, not cut: {p4}");
        // The tiny-GSO frames were never cut into 1,400 segments each for guest 2.
        assert!(n(&p(2)["counters"]["tx_segments"]) < 20_000, "{}", p(2));
    }
}

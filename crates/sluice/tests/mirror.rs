//! A mirror port with real guests: it sees a ping between two other guests (the request
//! the watched guest sends and the reply it is sent), and nothing of guests it does not
//! watch.

mod common;

use common::*;

/// IPv4 ICMP frames between `a` and `b` among `frames`.
fn icmp_between(frames: &[(Option<u16>, Vec<u8>)], a: [u8; 4], b: [u8; 4]) -> usize {
    frames
        .iter()
        .filter(|(_, f)| {
            f.len() > 34 && f[23] == 1 && {
                let (s, d) = (&f[26..30], &f[30..34]);
                (s == a && d == b) || (s == b && d == a)
            }
        })
        .count()
}

both_datapaths! {
    #[ignore = "system tier: needs root (network namespaces, TAP devices, and veths with BPF programs for the kernel datapath), ping and python3; scripts/test.sh runs it"]
    fn a_mirror_port_sees_a_ping_between_two_other_guests(dp: Dp) {
        if !root() {
            return;
        }
        let mut lab = Lab::on(dp, "mirr", &["--guests", "3"]);
        let (m, mtap) = lab.add_guest("m", &["--mirror", &lab.tap(1)], None);
        ns_ok(&lab.ns(1), &format!("ping -c 1 -W 2 {}", lab.ip4(2))); // ARP settled
        let l = listen_raw(&m, &mtap, 0x0800, 2.5);
        ns_ok(&lab.ns(1), &format!("ping -c 2 -W 2 {}", lab.ip4(2)));
        ns_ok(&lab.ns(2), &format!("ping -c 2 -W 2 {}", lab.ip4(3)));
        let got = received(l);
        assert_eq!(icmp_between(&got, [10, 77, 0, 1], [10, 77, 0, 2]), 4, "2 requests and 2 replies of g1: {got:?}");
        assert_eq!(icmp_between(&got, [10, 77, 0, 2], [10, 77, 0, 3]), 0, "g2 ↔ g3 is not watched");
        if dp == Dp::Kernel {
            // The copies were made in the kernel: g1's pings were forwarded there.
            let g1 = lab.port(&lab.tap(1));
            assert!(g1["kernel"]["forwarded"].as_u64().unwrap() >= 2, "{g1}");
        }
        assert_conserved(&lab.settled_stats());
        let o = sluice(&["port", "add", "dup-m", "--mirror", &lab.tap(1), "--netns", &m, "--switch", &lab.name]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && err.contains("already has a mirror"), "{err}");
    }
}

//! Rate limits through both datapaths: iperf3 TCP from a guest whose port has `rate_in`,
//! and to one whose port has `rate_out`, settles near the rate (UDP beyond a user-space
//! `rate_out` is counted as the port's tx `rate_limit`),
//! and an unlimited transfer running beside a limited one keeps most of its solo rate.
//!
//! Rates are bits a second on the wire; iperf3 reports TCP goodput. A frame of a full
//! segment is 1,514 bytes for 1,448 of payload (4.4 % headers); the policer (`rate_in`)
//! charges a GSO frame's bytes whole (headers once per up to 64 KiB), the TBF (`rate_out`)
//! every segment's headers. So the goodput expected is between 0.956 × and 1 × the rate:
//! each run must fall within ±10 % of that band, capped by the same run's unlimited
//! baseline (a rate this machine cannot reach is reported, and the baseline is the target).
//! Every number is printed, for the record.

mod common;

use common::*;

/// Goodput in Mbit/s of an iperf3 TCP run from namespace `ns` to `server` port `port`:
/// `secs` measured after 2 s omitted (TCP's start).
fn iperf(ns: &str, server: &str, port: u16, secs: u32) -> f64 {
    let out = ns_ok(ns, &format!("timeout 60 iperf3 -c {server} -p {port} -t {secs} -O 2 -J"));
    let v: serde_json::Value = serde_json::from_str(&out).expect("iperf3 -J");
    v["end"]["sum_received"]["bits_per_second"].as_f64().expect("iperf3's received rate") / 1e6
}

/// An iperf3 server the test started, stopped when dropped (a failed assertion too):
/// SIGTERM, which `timeout` hands on to iperf3.
struct Server(std::process::Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = std::process::Command::new("kill").args(["-TERM", &self.0.id().to_string()]).status();
        let _ = self.0.wait();
    }
}

/// An iperf3 server in `ns` on `port`, ready, bounded to two minutes.
fn server(ns: &str, port: u16) -> Server {
    let s = Server(ns_spawn(ns, &format!("exec timeout 120 iperf3 -s -p {port}")));
    assert!(
        wait_for(10, || ns_sh(ns, &format!("ss -ltn | grep -q :{port}")).status.success()),
        "iperf3 server in {ns} did not listen on {port} within 10 s"
    );
    s
}

/// Checks a limited run: within ±10 % of the goodput band of `rate`, capped by `base`.
fn check(what: &str, rate: f64, got: f64, base: f64) {
    let (lo, hi) = ((rate * 1448.0 / 1514.0).min(base) * 0.9, rate.min(base) * 1.1);
    eprintln!(
        "{what}: limit {rate} Mbit/s, measured {got:.1} Mbit/s goodput (unlimited {base:.0}; allowed {lo:.1}–{hi:.1})"
    );
    if rate > base {
        eprintln!(
            "{what}: {rate} Mbit/s is beyond what this machine reached unlimited ({base:.0}); the target is the baseline"
        );
    }
    assert!((lo..=hi).contains(&got), "{what}: {got:.1} Mbit/s, allowed {lo:.1} to {hi:.1}");
}

both_datapaths! {
    #[ignore = "system tier: needs root (network namespaces, TAP devices, and veths with BPF programs for the kernel datapath), iperf3, tc; scripts/test.sh runs it"]
    fn iperf3_through_a_limited_port_settles_at_the_rate(dp: Dp) {
        if !root() || !have("iperf3") || !have("tc") {
            return;
        }
        let mut lab = Lab::on(dp, "rate", &["--guests", "3"]);
        let rates = [10.0, 100.0, 1000.0];
        let limited_in: Vec<(String, String)> = rates
            .iter()
            .enumerate()
            .map(|(k, r)| {
                let ip = format!("10.77.0.{}", 110 + k);
                lab.add_guest(&format!("i{k}"), &["--rate-in", &r.to_string()], Some(&ip))
            })
            .collect();
        let s1 = server(&lab.ns(1), 5201);
        let s3 = server(&lab.ns(3), 5202);
        let base = iperf(&lab.ns(2), &lab.ip4(1), 5201, 5);
        eprintln!("{dp:?}: unlimited baseline {base:.0} Mbit/s");
        for (r, (ns, _)) in rates.iter().zip(&limited_in) {
            let got = iperf(ns, &lab.ip4(1), 5201, 5);
            check(&format!("{dp:?} rate_in"), *r, got, base);
        }
        // `sluice port set` changes a running port: the 10 Mbit/s port's limit removed, then
        // set to 20.
        let (ns10, tap10) = limited_in[0].clone();
        sluice_ok(&["port", "set", &tap10, "--rate-in", "0", "--switch", &lab.name]);
        let free = iperf(&ns10, &lab.ip4(1), 5201, 3);
        eprintln!("{dp:?}: port set --rate-in 0: {free:.0} Mbit/s");
        assert!(free > 50.0, "the limit was removed, yet {free:.1} Mbit/s");
        sluice_ok(&["port", "set", &tap10, "--rate-in", "20", "--switch", &lab.name]);
        let got = iperf(&ns10, &lab.ip4(1), 5201, 5);
        check(&format!("{dp:?} port set --rate-in 20"), 20.0, got, base);
        sluice_ok(&["port", "set", &tap10, "--rate-in", "10", "--switch", &lab.name]);
        // Transmit drops of the kernel's policer are counted at the input.
        let limited = lab.port(&limited_in[0].1);
        eprintln!("{dp:?}: rate_in 10: rx_drops.rate_limit {}", limited["counters"]["rx_drops"]["rate_limit"]);

        // A limited transfer beside an unlimited one: the unlimited keeps most of its solo
        // rate (the limited port slows no other; generous: the two share 2 cores with
        // iperf3 itself).
        let solo = iperf(&lab.ns(2), &lab.ip4(3), 5202, 5);
        let ns10 = limited_in[0].0.clone();
        let ip1 = lab.ip4(1);
        let beside = std::thread::spawn(move || iperf(&ns10, &ip1, 5201, 6));
        let both = iperf(&lab.ns(2), &lab.ip4(3), 5202, 5);
        let limited_beside = beside.join().unwrap();
        eprintln!("{dp:?}: unlimited alone {solo:.0}, beside a 10 Mbit/s transfer {both:.0} (which made {limited_beside:.1})");
        assert!(both >= 0.5 * solo, "the unlimited transfer fell from {solo:.0} to {both:.0} Mbit/s beside a limited one");

        // rate_out: what the guest is sent is shaped — on the kernel datapath by a TBF on
        // the switch's end of its veth, on the user-space datapath by the switch's own
        // bucket before the port's queue.
        let mut outs = Vec::new();
        for (k, r) in rates.iter().enumerate() {
            let ip = format!("10.77.0.{}", 120 + k);
            let (ns, tap) = lab.add_guest(&format!("o{k}"), &["--rate-out", &r.to_string()], Some(&ip));
            let srv = server(&ns, 5203);
            let got = iperf(&lab.ns(2), &ip, 5203, 5);
            check(&format!("{dp:?} rate_out"), *r, got, base);
            let p = lab.port(&tap);
            eprintln!("{dp:?} rate_out {r}: tx_drops.rate_limit {}", p["counters"]["tx_drops"]["rate_limit"]);
            outs.push(srv);
        }
        // UDP at five times the 100 Mbit/s port's rate (64 streams of 8 Mbit/s): on the
        // user-space datapath the port's queue overflows and its drops are the port's tx
        // `rate_limit`. (On the kernel datapath the TBF's drops are counted the same way,
        // but local senders are held back by their sockets before its queue overflows: the
        // count is printed only.)
        let (ip100, tap100) = ("10.77.0.121".to_string(), format!("{}-o1", lab.name));
        let drops = || lab.port(&tap100)["counters"]["tx_drops"]["rate_limit"].as_u64().unwrap_or(0);
        let before = drops();
        ns_ok(&lab.ns(2), &format!("timeout 30 iperf3 -c {ip100} -p 5203 -u -P 64 -b 8M -t 2 -J"));
        let after = drops();
        eprintln!("{dp:?} rate_out 100, UDP at 512 Mbit/s: tx_drops.rate_limit {before} -> {after}");
        if dp == Dp::User {
            assert!(after > before, "UDP at 5x the rate_out, yet no tx rate_limit drop counted ({before} -> {after})");
        }
        if dp == Dp::Kernel {
            let qdisc = sh_ok(&format!("tc qdisc show dev {}-o0", lab.name));
            assert!(qdisc.contains("tbf"), "the limited veth has its TBF: {qdisc}");
            sluice_ok(&["port", "del", &format!("{}-o0", lab.name), "--switch", &lab.name]);
            let qdisc = sh_ok(&format!("tc qdisc show dev {}-o0", lab.name));
            assert!(!qdisc.contains("tbf"), "the port's TBF went with it: {qdisc}");
        }
        drop(outs);
        drop((s1, s3));
        assert_conserved(&lab.settled_stats());
    }
}

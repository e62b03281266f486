//! `sluice bench` between guests attached to a sluice switch: partition-aggregate with five
//! workers in five namespaces, a request-response run whose CPU split finds the switch, and
//! a server that connects back to its client (client-side `accept`) over IPv6.

mod common;

use common::*;
use serde_json::Value;

struct Servers(Vec<std::process::Child>);

impl Drop for Servers {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn serve_in(ns: &[String]) -> Servers {
    let s = Servers(
        ns.iter()
            .map(|n| {
                std::process::Command::new("ip")
                    .args(["netns", "exec", n, BIN, "bench", "serve"])
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::null())
                    .spawn()
                    .unwrap()
            })
            .collect(),
    );
    for n in ns {
        assert!(wait_for(10, || ns_sh(n, "ss -ltn | grep -q :20000").status.success()), "server in {n}");
    }
    s
}

#[test]
#[ignore = "system tier: needs root (network namespaces and TAP devices); scripts/test.sh runs it"]
fn partition_aggregate_with_five_workers_in_five_namespaces() {
    if !root() {
        return;
    }
    let lab = Lab::up("pa", &["--guests", "6"]);
    let workers: Vec<String> = (2..=6).map(|g| lab.ns(g)).collect();
    let _servers = serve_in(&workers);
    let list = (2..=6).map(|g| lab.ip4(g)).collect::<Vec<_>>().join(",");
    let out = ns_ok(
        &lab.ns(1),
        &format!("{BIN} bench run -m pa --workers {list} --response 4mtu --duration 2 --json --switch {}", lab.name),
    );
    let v: Value = serde_json::from_str(&out).unwrap();
    let r = &v["results"][0];
    let q = r["completion"]["queries"].as_u64().unwrap();
    assert!(q > 0, "{r}");
    assert!(r["completion"]["p99_us"].as_f64().unwrap() >= r["completion"]["p50_us"].as_f64().unwrap());
    assert_eq!(r["conns"], 5);
    assert_eq!(r["client"]["transactions"].as_u64().unwrap(), 5 * q, "one answer per worker per query");
    assert_eq!(r["client"]["transactions"], r["server"]["transactions"]);
    assert_eq!(r["client"]["bytes_received"].as_u64().unwrap(), 5 * q * 6000);
    assert_eq!(r["client"]["bytes_received"], r["server"]["bytes_sent"]);
    assert_eq!(r["client"]["bytes_sent"], r["server"]["bytes_received"]);

    // With background streams from the workers into the aggregator competing with the
    // answers, counts still agree.
    let out = ns_ok(
        &lab.ns(1),
        &format!("{BIN} bench run -m pa --workers {list} --background 3 --duration 2 --json --switch {}", lab.name),
    );
    let v: Value = serde_json::from_str(&out).unwrap();
    let r = &v["results"][0];
    let q = r["completion"]["queries"].as_u64().unwrap();
    assert!(q > 0, "{r}");
    assert_eq!(r["client"]["connections"], 5 + 3);
    assert_eq!(r["client"]["transactions"], r["server"]["transactions"], "{r}");
    assert_eq!(r["client"]["bytes_sent"], r["server"]["bytes_received"], "{r}");
    assert_eq!(r["client"]["bytes_received"], r["server"]["bytes_sent"], "{r}");
    assert!(r["client"]["bytes_received"].as_u64().unwrap() > 5 * q * 3000, "the background streamed in: {r}");

    // A number of queries ends the run before its duration.
    let out = ns_ok(
        &lab.ns(1),
        &format!("{BIN} bench run -m pa --workers {list} --queries 40 --duration 60 --json --switch {}", lab.name),
    );
    let v: Value = serde_json::from_str(&out).unwrap();
    let r = &v["results"][0];
    assert_eq!(r["completion"]["queries"], 40, "{r}");
    assert!(r["duration_s"].as_f64().unwrap() < 60.0, "{r}");
    assert_eq!(r["client"]["transactions"], r["server"]["transactions"], "{r}");
    assert_conserved(&lab.settled_stats());
}

#[test]
#[ignore = "system tier: needs root (network namespaces and TAP devices); scripts/test.sh runs it"]
fn request_response_across_the_switch_agrees_on_both_ends() {
    if !root() {
        return;
    }
    let lab = Lab::up("rrsw", &["--guests", "2"]);
    let _servers = serve_in(&[lab.ns(2)]);
    let out = ns_ok(
        &lab.ns(1),
        &format!(
            "{BIN} bench run --to {} -m rr1c-200x1000 --duration 2 --conns 1,4 --json --switch {}",
            lab.ip4(2),
            lab.name
        ),
    );
    let v: Value = serde_json::from_str(&out).unwrap();
    for r in v["results"].as_array().unwrap() {
        assert_eq!(r["client"]["transactions"], r["server"]["transactions"], "{r}");
        assert_eq!(r["client"]["bytes_sent"], r["server"]["bytes_received"]);
        assert!(r["client"]["transactions"].as_u64().unwrap() > 0);
    }
    let g2 = lab.port(&lab.tap(2));
    assert!(g2["counters"]["tx_frames"].as_u64().unwrap() > 0, "the traffic crossed the switch");
}

#[test]
#[ignore = "system tier: needs root (network namespaces and TAP devices); scripts/test.sh runs it"]
fn the_server_connects_back_across_the_switch_over_ipv6() {
    if !root() {
        return;
    }
    let lab = Lab::up("acc6", &["--guests", "2"]);
    let _servers = serve_in(&[lab.ns(2)]);
    let p = scratch("accept").join("accept.xml");
    std::fs::write(
        &p,
        r#"<profile name="accept-crr"><group nthreads="2"><transaction duration="2s">
<flowop type="accept" options="tcp_nodelay"/><flowop type="write" options="size=64"/>
<flowop type="read" options="size=8k"/><flowop type="disconnect"/>
</transaction></group></profile>"#,
    )
    .unwrap();
    let out = ns_sh(&lab.ns(1), &format!("{BIN} bench run --to [{}] -m {} --json", lab.ip6(2), p.display()));
    let _ = std::fs::remove_file(&p);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_str(&String::from_utf8_lossy(&out.stdout)).unwrap();
    let r = &v["results"][0];
    let t = r["client"]["transactions"].as_u64().unwrap();
    assert!(t > 0, "{r}");
    assert_eq!(r["client"]["connections"].as_u64().unwrap(), t, "one connection per transaction: {r}");
    assert_eq!(r["client"]["connections"], r["server"]["connections"], "{r}");
    assert_eq!(r["client"]["transactions"], r["server"]["transactions"], "{r}");
    assert_eq!(r["client"]["bytes_received"].as_u64().unwrap(), 8192 * t, "{r}");
    assert_conserved(&lab.settled_stats());
}

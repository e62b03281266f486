//! `sluice bench` on loopback: every built-in profile runs and both ends count the same
//! transactions and bytes; rand() sizes stay in range; seed 003's profile runs verbatim;
//! 250 connections; malformed profiles and unreachable or mismatched servers give errors
//! that say what to do.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_sluice");

/// A `sluice bench serve` on a free loopback port, killed on drop.
struct Server {
    child: Child,
    port: u16,
}

/// The port a `sluice bench serve --port 0` names on its first line of stderr (bounded: the
/// line comes at once, or the server failed).
fn server_port(child: &mut Child) -> u16 {
    let err = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut r = BufReader::new(err);
        let mut line = String::new();
        let _ = r.read_line(&mut line);
        let _ = tx.send(line);
        // (Drains the rest, so that the server's later log lines never meet a closed pipe.)
        let _ = std::io::copy(&mut r, &mut std::io::sink());
    });
    let line = rx
        .recv_timeout(std::time::Duration::from_secs(30))
        .expect("the bench server did not say where it listens within 30 s");
    line.split_whitespace()
        .find_map(|w| w.trim_end_matches(';').rsplit_once(':').and_then(|(_, p)| p.parse().ok()))
        .unwrap_or_else(|| panic!("no port in the bench server's first line: {line:?}"))
}

/// A port outside the kernel's ephemeral range (32768–60999 here) that no other test of
/// this binary uses (`n` < 50, one per use): for a profile's fixed data port, or a port
/// known to have no listener.
fn spare_port(n: u16) -> u16 {
    assert!(n < 50);
    10_000 + (std::process::id() % 200) as u16 * 50 + n
}

impl Server {
    fn start() -> Server {
        // Port 0: the server takes one from the kernel and names it (no port picked here and
        // released, for another process to take first).
        let mut child = Command::new(BIN)
            .args(["bench", "serve", "--listen", "127.0.0.1", "--port", "0"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let port = server_port(&mut child);
        Server { child, port }
    }

    fn to(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn bench(args: &[&str]) -> (bool, String, String) {
    let o = Command::new(BIN).arg("bench").args(args).stdin(Stdio::null()).output().unwrap();
    (
        o.status.success(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn run_json(args: &[&str]) -> Vec<Value> {
    let mut a = vec!["run", "--json"];
    a.extend_from_slice(args);
    let (ok, out, err) = bench(&a);
    assert!(ok, "sluice bench {a:?} failed: {err}");
    let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    v["results"].as_array().unwrap().clone()
}

fn assert_counts_agree(r: &Value) {
    let c = &r["client"];
    let s = &r["server"];
    assert!(c["transactions"].as_u64().unwrap() > 0, "{r}");
    assert_eq!(c["transactions"], s["transactions"], "transactions: {r}");
    assert_eq!(c["bytes_sent"], s["bytes_received"], "client→server bytes: {r}");
    assert_eq!(c["bytes_received"], s["bytes_sent"], "server→client bytes: {r}");
    assert_eq!(c["connections"], s["connections"], "connections: {r}");
}

#[test]
fn every_builtin_profile_runs_and_both_ends_agree() {
    let srv = Server::start();
    for p in ["rr-200x1000", "crr-64x8k", "str-20x20m", "rr1c-200x1000", "str-readx30k"] {
        let rs = run_json(&["--to", &srv.to(), "-m", p, "--duration", "1", "--conns", "1,3"]);
        assert_eq!(rs.len(), 2, "{p}");
        for r in &rs {
            assert_counts_agree(r);
            assert!(r["tps"].as_f64().unwrap() > 0.0, "{p}: {r}");
        }
        assert_eq!(rs[1]["conns"], 3);
        // Exact sizes: every transaction moves the profile's bytes.
        let c = &rs[0]["client"];
        let (t, sent, recvd) = (
            c["transactions"].as_u64().unwrap(),
            c["bytes_sent"].as_u64().unwrap(),
            c["bytes_received"].as_u64().unwrap(),
        );
        match p {
            "rr-200x1000" | "rr1c-200x1000" => assert_eq!((sent, recvd), (200 * t, 1000 * t), "{p}"),
            "crr-64x8k" => {
                assert_eq!((sent, recvd), (64 * t, 8192 * t));
                assert_eq!(c["connections"].as_u64().unwrap(), t, "one connection per transaction");
            }
            "str-20x20m" => assert_eq!((sent, recvd), (20 * t, 20 * 1024 * 1024 * t)),
            "str-readx30k" => assert_eq!((sent, recvd), (0, 30 * 1024 * t)),
            _ => unreachable!(),
        }
    }
}

fn write_profile(name: &str, text: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("sluice-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

#[test]
fn rand_sizes_stay_in_range_and_match_on_both_ends() {
    let srv = Server::start();
    let p = write_profile(
        "rand.xml",
        r#"<?xml version="1.0"?>
<profile name="rand">
  <group nthreads="2">
    <transaction iterations="1"><flowop type="connect" options="remotehost=127.0.0.1 protocol=tcp"/></transaction>
    <transaction iterations="400">
      <flowop type="write" options="size=rand(100,200)"/>
      <flowop type="read" options="size=rand(1k,2k)"/>
    </transaction>
    <transaction iterations="1"><flowop type="disconnect"/></transaction>
  </group>
</profile>"#,
    );
    let rs = run_json(&["--to", &srv.to(), "-m", p.to_str().unwrap()]);
    let r = &rs[0];
    assert_counts_agree(r);
    let c = &r["client"];
    assert_eq!(c["transactions"], 800);
    // A connect's port= is the data port the server listens on.
    let port = spare_port(1);
    let text = std::fs::read_to_string(&p).unwrap().replace("protocol=tcp", &format!("protocol=tcp port={port}"));
    let p2 = write_profile("rand-port.xml", &text);
    let rs = run_json(&["--to", &srv.to(), "-m", p2.to_str().unwrap()]);
    assert_counts_agree(&rs[0]);
    let sent = c["bytes_sent"].as_u64().unwrap();
    let recvd = c["bytes_received"].as_u64().unwrap();
    assert!((800 * 100..=800 * 200).contains(&sent), "{sent}");
    assert!((800 * 1024..=800 * 2048).contains(&recvd), "{recvd}");
    assert!(sent != 800 * 100 && sent != 800 * 200, "sizes vary: {sent}");
}

#[test]
fn seed_003_profile_runs_verbatim_with_its_host_replaced() {
    let srv = Server::start();
    let text = r#"<?xml version="1.0"?>
<profile name="TCP_RR">
  <group nprocs="50">
    <!-- if one wants to run threads instead of processes -->
    <!--group nthreads="50"-->
    <transaction iterations="1">
      <flowop type="connect" options="remotehost=127.0.0.1
        protocol=tcp tcp_nodelay" />
    </transaction>
    <transaction duration="300">
      <flowop type="write" options="size=200"/>
      <flowop type="read" options="size=1000"/>
    </transaction>
    <transaction iterations="1">
      <flowop type="disconnect" />
    </transaction>
  </group>
</profile>
"#;
    let p = write_profile("seed003.xml", text);
    let rs = run_json(&["--to", &srv.to(), "-m", p.to_str().unwrap(), "--duration", "2"]);
    let r = &rs[0];
    assert_eq!(r["conns"], 50);
    assert_eq!(r["client"]["connections"], 50);
    assert!(r["duration_s"].as_f64().unwrap() < 30.0, "--duration replaced the 300 s");
    assert_counts_agree(r);
}

#[test]
fn two_hundred_fifty_connections_run() {
    let srv = Server::start();
    let rs = run_json(&["--to", &srv.to(), "-m", "rr-200x1000", "--duration", "1", "--conns", "250"]);
    assert_eq!(rs[0]["client"]["connections"], 250);
    assert_counts_agree(&rs[0]);
}

#[test]
fn table_output_and_per_flowop_averages() {
    let srv = Server::start();
    let (ok, out, err) = bench(&["run", "--to", &srv.to(), "-m", "rr-200x1000", "--duration", "1", "-a"]);
    assert!(ok, "{err}");
    assert!(out.contains("write size=200") && out.contains("read size=1000"), "{out}");
    let (ok, out, _) = bench(&["run", "--to", &srv.to(), "-m", "crr-64x8k", "--duration", "1", "--csv"]);
    assert!(ok);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "{out}");
    assert_eq!(lines[0].split(',').count(), lines[1].split(',').count());
}

#[test]
fn malformed_profiles_name_the_element_and_attribute() {
    let cases = [
        (
            "bad-flowop.xml",
            r#"<profile name="x"><group nthreads="1"><transaction iterations="1"><flowop type="sendfile" options="size=1"/></transaction></group></profile>"#,
            "type",
        ),
        (
            "bad-size.xml",
            r#"<profile name="x"><group nthreads="1"><transaction iterations="1"><flowop type="connect" options="remotehost=h"/><flowop type="write" options="size=lots"/></transaction></group></profile>"#,
            "options",
        ),
        (
            "bad-group.xml",
            r#"<profile name="x"><group><transaction iterations="1"><flowop type="nop"/></transaction></group></profile>"#,
            "group",
        ),
        ("bad-xml.xml", r#"<profile name="x"><group nthreads="1">"#, "xml"),
    ];
    for (name, text, expect) in cases {
        let p = write_profile(name, text);
        let (ok, _, err) = bench(&["run", "--to", "127.0.0.1:1", "-m", p.to_str().unwrap()]);
        assert!(!ok, "{name} accepted");
        assert!(err.contains(expect), "{name}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "one-line message: {err}");
    }
    let (ok, _, err) = bench(&["run", "-m", "no-such-profile"]);
    assert!(!ok && err.contains("rr-200x1000"), "lists the built-ins: {err}");
}

#[test]
fn unreachable_and_mismatched_servers_say_what_to_do() {
    let port = spare_port(2);
    let (ok, _, err) = bench(&["run", "--to", &format!("127.0.0.1:{port}"), "-m", "rr-200x1000", "--duration", "1"]);
    assert!(!ok && err.contains("sluice bench serve"), "{err}");

    // A server that speaks another protocol version.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let fake = std::thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        let mut r = BufReader::new(s.try_clone().unwrap());
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        let mut w = s;
        w.write_all(b"{\"msg\":\"hello\",\"protocol\":99,\"version\":\"9.9.9\",\"pid\":1,\"boot_id\":\"x\"}\n")
            .unwrap();
    });
    let (ok, _, err) = bench(&["run", "--to", &addr.to_string(), "-m", "rr-200x1000", "--duration", "1"]);
    let _ = fake.join();
    assert!(!ok && err.contains("same sluice version") && err.contains("99"), "{err}");

    // Something else on the port (uperf's server uses 20000 too): one that never answers,
    // one that answers in its own protocol. Both are named, neither is waited on forever.
    for answer in [None, Some(&b"\x00\x01uperf\xff\n"[..])] {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let other = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            if let Some(a) = answer {
                s.write_all(a).unwrap();
            }
            // Holds the connection open until the client has given up.
            let _ = done_rx.recv_timeout(std::time::Duration::from_secs(60));
        });
        let (ok, _, err) = bench(&["run", "--to", &addr.to_string(), "-m", "rr-200x1000", "--duration", "1"]);
        drop(done_tx);
        let _ = other.join();
        assert!(!ok && err.contains("is not a sluice bench server") && err.contains("sluice bench serve"), "{err}");
    }
}

#[test]
fn udp_request_response_and_per_datagram_connections() {
    let srv = Server::start();
    let p = write_profile(
        "udp.xml",
        r#"<?xml version="1.0"?>
<profile name="udp-rr">
  <group nthreads="2">
    <transaction iterations="1"><flowop type="connect" options="remotehost=127.0.0.1 protocol=udp"/></transaction>
    <transaction duration="1s">
      <flowop type="write" options="size=200"/>
      <flowop type="read" options="size=1000"/>
    </transaction>
    <transaction iterations="1"><flowop type="disconnect"/></transaction>
  </group>
  <group nthreads="1">
    <transaction iterations="300">
      <flowop type="connect" options="remotehost=127.0.0.1 protocol=udp"/>
      <flowop type="write" options="size=rand(64,512)"/>
      <flowop type="read" options="size=8k"/>
      <flowop type="disconnect"/>
    </transaction>
  </group>
</profile>"#,
    );
    let rs = run_json(&["--to", &srv.to(), "-m", p.to_str().unwrap()]);
    let r = &rs[0];
    assert_counts_agree(r);
    assert_eq!(r["client"]["connections"].as_u64().unwrap(), 2 + 300);
    let too_big = write_profile(
        "udp-big.xml",
        r#"<profile name="x"><group nthreads="1"><transaction iterations="1"><flowop type="connect" options="remotehost=h protocol=udp"/><flowop type="write" options="size=100k"/></transaction></group></profile>"#,
    );
    let (ok, _, err) = bench(&["run", "--to", &srv.to(), "-m", too_big.to_str().unwrap()]);
    assert!(!ok && err.contains("65507"), "{err}");
}

#[test]
fn client_side_accept_has_the_server_connect_back() {
    let srv = Server::start();
    let port = spare_port(3);
    let p = write_profile(
        "accept.xml",
        &format!(
            r#"<?xml version="1.0"?>
<profile name="reverse">
  <group nthreads="3">
    <transaction iterations="1"><flowop type="accept" options="protocol=tcp tcp_nodelay"/></transaction>
    <transaction duration="1s">
      <flowop type="write" options="size=200"/>
      <flowop type="read" options="size=1000"/>
    </transaction>
    <transaction iterations="1"><flowop type="disconnect"/></transaction>
  </group>
  <group nthreads="2">
    <transaction iterations="150">
      <flowop type="accept" options="port={port}"/>
      <flowop type="write" options="size=rand(10,100)"/>
      <flowop type="read" options="size=8k"/>
      <flowop type="disconnect"/>
    </transaction>
  </group>
  <group nthreads="1">
    <transaction iterations="1"><flowop type="accept"/></transaction>
    <transaction duration="1s"><flowop type="read" options="size=30k"/></transaction>
  </group>
</profile>"#
        ),
    );
    let rs = run_json(&["--to", &srv.to(), "-m", p.to_str().unwrap()]);
    let r = &rs[0];
    assert_counts_agree(r);
    // 3 + 1 long-lived connections and one per CRR transaction, each opened by the server.
    assert_eq!(r["client"]["connections"].as_u64().unwrap(), 3 + 2 * 150 + 1, "{r}");

    let mixed = write_profile(
        "accept-mixed.xml",
        r#"<profile name="x"><group nthreads="1"><transaction iterations="2">
<flowop type="connect" options="remotehost=h"/><flowop type="disconnect"/>
<flowop type="accept"/><flowop type="write" options="size=1"/><flowop type="disconnect"/>
</transaction></group></profile>"#,
    );
    let (ok, _, err) = bench(&["run", "--to", &srv.to(), "-m", mixed.to_str().unwrap()]);
    assert!(!ok && err.contains("line 3") && err.contains("separate groups"), "{err}");
    let udp = write_profile(
        "accept-udp.xml",
        r#"<profile name="x"><group nthreads="1"><transaction iterations="1">
<flowop type="accept" options="protocol=udp"/><flowop type="write" options="size=1"/></transaction></group></profile>"#,
    );
    let (ok, _, err) = bench(&["run", "--to", &srv.to(), "-m", udp.to_str().unwrap()]);
    assert!(!ok && err.contains("TCP only"), "{err}");
}

/// uperf reads every time unit that starts with m as milliseconds: such profiles run
/// unchanged, read the same way, with a warning naming the line (issue 15).
#[test]
fn a_uperf_profile_with_m_units_runs_as_uperf_reads_it_and_is_warned_about() {
    let srv = Server::start();
    let p = write_profile(
        "m-units.xml",
        r#"<?xml version="1.0"?>
<profile name="m-units">
  <group nthreads="1">
    <transaction iterations="1"><flowop type="connect" options="remotehost=127.0.0.1 protocol=tcp"/></transaction>
    <transaction duration="1s">
      <flowop type="write" options="size=100"/>
      <flowop type="read" options="size=100"/>
      <flowop type="think" options="duration=1m"/>
    </transaction>
    <transaction iterations="1"><flowop type="disconnect"/></transaction>
  </group>
</profile>"#,
    );
    let (ok, out, err) = bench(&["run", "--to", &srv.to(), "-m", p.to_str().unwrap(), "--json"]);
    assert!(ok, "{err}");
    assert!(err.contains("m-units.xml:8:") && err.contains("1 ms") && err.contains("milliseconds"), "{err}");
    let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    let r = &v["results"][0];
    // A 1 ms think per transaction, not a minute: hundreds of transactions in the second.
    assert!(r["client"]["transactions"].as_u64().unwrap() > 50, "{r}");
}

//! `sluice bench` on loopback: every built-in profile runs and both ends count the same
//! transactions and bytes; rand() sizes stay in range; seed 003's profile runs verbatim;
//! 250 connections; malformed profiles and unreachable or mismatched servers give errors
//! that say what to do. And the server left listening for anyone: a spoofed datagram gets
//! at most a few answers, only the client is answered, a huge count costs nothing, a
//! client that idles gives the server up, a run's size is bounded, and a client that
//! leaves takes its sockets and threads with it.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream, UdpSocket};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

mod common;
use common::scratch;

const BIN: &str = env!("CARGO_BIN_EXE_sluice");

/// A `sluice bench serve` on a free loopback port, killed on drop.
struct Server {
    child: Child,
    port: u16,
    /// What the server has logged (stderr) after its first line.
    log: Arc<Mutex<String>>,
}

/// The port a `sluice bench serve --port 0` names on its first line of stderr (bounded: the
/// line comes at once, or the server failed); the later lines go to `log`.
fn server_port(child: &mut Child, log: Arc<Mutex<String>>) -> u16 {
    let err = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut r = BufReader::new(err);
        let mut line = String::new();
        let _ = r.read_line(&mut line);
        let _ = tx.send(line);
        // (Reads the rest, so that the server's later log lines never meet a closed pipe.)
        let mut line = String::new();
        while r.read_line(&mut line).is_ok_and(|n| n > 0) {
            log.lock().unwrap().push_str(&line);
            line.clear();
        }
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
        let log = Arc::new(Mutex::new(String::new()));
        let port = server_port(&mut child, log.clone());
        Server { child, port, log }
    }

    fn to(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The server's threads now.
    fn threads(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/task", self.child.id())).map(|d| d.count()).unwrap_or(0)
    }

    /// The server's resident memory in KiB.
    fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    }

    fn alive(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    fn log(&self) -> String {
        self.log.lock().unwrap().clone()
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
    let dir = scratch("bench-profiles");
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

/// Waits up to `limit` for `cond`, checking every 50 ms.
fn wait_until(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + limit;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A control connection spoken by hand, as a careless or hostile client would.
struct Control {
    r: BufReader<TcpStream>,
    w: TcpStream,
}

impl Control {
    fn open(srv: &Server) -> Control {
        let s = TcpStream::connect(srv.to()).unwrap();
        // Every answer comes within the server's own deadlines; this only bounds the test.
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        Control { r: BufReader::new(s.try_clone().unwrap()), w: s }
    }

    fn send(&mut self, v: Value) {
        self.w.write_all(format!("{v}\n").as_bytes()).unwrap();
    }

    /// The server's next message; `None` if it closed the connection (or died).
    fn recv(&mut self) -> Option<Value> {
        let mut line = String::new();
        match self.r.read_line(&mut line) {
            Ok(n) if n > 0 => Some(serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"))),
            _ => None,
        }
    }

    fn hello(srv: &Server) -> Control {
        let mut c = Control::open(srv);
        c.send(serde_json::json!({"msg": "hello", "protocol": 2, "version": env!("CARGO_PKG_VERSION")}));
        let h = c.recv().expect("the server answers hello");
        assert_eq!(h["msg"], "hello", "{h}");
        c
    }

    /// Asks for a run of `xml`: `ready` with the ports, or `error` with the message.
    fn run(&mut self, xml: &str) -> Value {
        self.send(serde_json::json!({"msg": "run", "profile_xml": xml}));
        self.recv().expect("the server answers a run request (and is alive)")
    }
}

fn port_of(ready: &Value, i: usize) -> u16 {
    assert_eq!(ready["msg"], "ready", "{ready}");
    ready["ports"][i].as_u64().unwrap() as u16
}

/// Datagrams `u` receives within `limit`.
fn count_datagrams(u: &UdpSocket, limit: Duration) -> usize {
    u.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    let mut buf = vec![0u8; 65_536];
    let end = Instant::now() + limit;
    let mut n = 0;
    while Instant::now() < end {
        if u.recv(&mut buf).is_ok() {
            n += 1;
        }
    }
    n
}

/// The most datagrams the server sends for one it receives (sluice_bench::script::MAX_ANSWERS).
const MAX_ANSWERS: usize = 4;

/// The review's amplification: a UDP profile whose transaction only reads, for ever; the
/// client takes the data port and leaves, and one datagram with a forged source made the
/// server send 60 KB datagrams to that source without end. Now such a profile is refused
/// (and had it run, one datagram would get at most MAX_ANSWERS); in a run that is allowed,
/// a datagram from another address than the client's gets nothing, the client's exactly
/// the one answer its profile asks for.
#[test]
fn a_forged_datagram_gets_at_most_a_few_answers_and_only_the_client_is_answered() {
    let srv = Server::start();
    let mut c = Control::hello(&srv);
    let a = c.run(
        r#"<profile name="amp"><group nthreads="1">
<transaction iterations="1"><flowop type="connect" options="remotehost=127.0.0.1 protocol=udp"/></transaction>
<transaction iterations="18446744073709551615"><flowop type="read" options="size=60000"/></transaction>
</group></profile>"#,
    );
    if a["msg"] == "ready" {
        let port = port_of(&a, 0);
        drop(c);
        let victim = UdpSocket::bind("127.0.0.1:0").unwrap();
        victim.send_to(&[1], ("127.0.0.1", port)).unwrap();
        let got = count_datagrams(&victim, Duration::from_secs(2));
        assert!(got <= MAX_ANSWERS, "one 1-byte datagram was answered with {got} datagrams");
    } else {
        let m = a["message"].as_str().unwrap();
        assert!(m.contains("line 3") && m.contains("must start with a write"), "{m}");
        drop(c);
    }

    let mut c = Control::hello(&srv);
    let a = c.run(
        r#"<profile name="rr"><group nthreads="1">
<transaction iterations="1"><flowop type="connect" options="remotehost=127.0.0.1 protocol=udp"/></transaction>
<transaction iterations="1000000"><flowop type="write" options="size=1"/><flowop type="read" options="size=60000"/></transaction>
</group></profile>"#,
    );
    let port = port_of(&a, 0);
    let stranger = UdpSocket::bind("127.0.0.2:0").unwrap();
    stranger.send_to(&[1], ("127.0.0.1", port)).unwrap();
    assert_eq!(
        count_datagrams(&stranger, Duration::from_secs(1)),
        0,
        "a datagram from another address is not answered"
    );
    let client = UdpSocket::bind("127.0.0.1:0").unwrap();
    client.send_to(&[1], ("127.0.0.1", port)).unwrap();
    assert_eq!(count_datagrams(&client, Duration::from_secs(2)), 1, "the client's request gets its one answer");
    drop(c);
    assert!(
        wait_until(Duration::from_secs(20), || srv.log().contains("ignored 1 data connections and datagrams")),
        "the server logs what it ignored: {}",
        srv.log()
    );
}

/// A flowop count of 10^12 was 10^12 steps in memory and aborted the server; it is a
/// repeat count now and costs nothing, while a UDP read with such a count (a datagram the
/// server would have to answer 10^12 times) is refused naming its line. The server stays
/// up and serves the next client.
#[test]
fn a_huge_flowop_count_costs_nothing_and_is_refused_where_it_would_amplify() {
    let mut srv = Server::start();
    let mut c = Control::hello(&srv);
    let a = c.run(
        r#"<profile name="count"><group nthreads="1"><transaction iterations="1">
<flowop type="connect" options="remotehost=127.0.0.1 protocol=tcp"/>
<flowop type="write" options="size=1 count=1000000000000"/>
<flowop type="disconnect"/></transaction></group></profile>"#,
    );
    assert_eq!(a["msg"], "ready", "{a}");
    assert!(srv.rss_kib() < 256 * 1024, "the server holds {} KiB", srv.rss_kib());
    drop(c);
    let mut c = Control::hello(&srv);
    let a = c.run(
        r#"<profile name="count"><group nthreads="1"><transaction duration="1s">
<flowop type="connect" options="remotehost=127.0.0.1 protocol=udp"/>
<flowop type="write" options="size=1"/>
<flowop type="read" options="size=1000 count=1000000000000"/>
<flowop type="disconnect"/></transaction></group></profile>"#,
    );
    assert_eq!(a["msg"], "error", "{a}");
    let m = a["message"].as_str().unwrap();
    assert!(m.contains("line 4") && m.contains("1000000000000") && m.contains("at most 4"), "{m}");
    drop(c);
    assert!(srv.alive(), "the server is up");
    let rs = run_json(&["--to", &srv.to(), "-m", "rr-200x1000", "--duration", "1"]);
    assert_counts_agree(&rs[0]);
}

/// A client that says hello and then nothing held the server's run for ever: nobody else
/// could run. Now it has CONTROL_WAIT (10 s) for its run request; then the server closes
/// its connection, saying so in its log, and the next client runs. Connections that never
/// say hello cannot fill the server either.
#[test]
fn a_client_that_says_hello_and_idles_gives_the_server_up() {
    let srv = Server::start();
    let mut idle = Control::hello(&srv);
    let silent: Vec<TcpStream> = (0..40).map(|_| TcpStream::connect(srv.to()).unwrap()).collect();
    let t0 = Instant::now();
    loop {
        let (ok, _, err) = bench(&["run", "--to", &srv.to(), "-m", "rr-200x1000", "--duration", "1"]);
        if ok {
            break;
        }
        assert!(err.contains("busy"), "{err}");
        assert!(t0.elapsed() < Duration::from_secs(60), "a client idle after hello still holds the server: {err}");
    }
    // Either way the idle client gives the server up: at its deadline, or as the oldest
    // connection holding no run when the silent ones fill the server's places first.
    let log = srv.log();
    assert!(
        log.contains("sent no run request within 10 s") || log.contains("closed the oldest that held no run"),
        "the log says why: {log}"
    );
    let told = idle.recv();
    assert!(told.as_ref().is_none_or(|m| m["msg"] == "error"), "{told:?}");
    drop(silent);
}

fn groups(n: usize, threads: u32, connect: &str) -> String {
    let g = format!(
        r#"<group nthreads="{threads}"><transaction iterations="1"><flowop type="connect" options="remotehost=127.0.0.1 {connect}"/><flowop type="write" options="size=1"/></transaction></group>
"#
    );
    g.repeat(n)
}

/// A run's size is bounded before anything is opened: at most 1024 groups (uperf's limit)
/// and 10,000 connections, no privileged data port; each refusal names the line. A run
/// whose preparation fails part-way (its second group's port is taken) leaves no listener
/// or thread behind.
#[test]
fn too_many_groups_or_connections_are_refused_and_a_failed_prepare_leaves_nothing() {
    let srv = Server::start();
    let mut c = Control::hello(&srv);
    // At rest, less this control connection's thread (the server has started all its own
    // threads by the time it answers hello).
    let idle = srv.threads() - 1;
    let a = c.run(&format!("<profile name=\"g\">\n{}</profile>", groups(1025, 1, "")));
    assert_eq!(a["msg"], "error", "1025 groups: {}", a["msg"]);
    let m = a["message"].as_str().unwrap();
    assert!(m.contains("line 1026") && m.contains("<group>") && m.contains("at most 1024 groups"), "{m}");
    let a = c.run(&format!("<profile name=\"c\">\n{}</profile>", groups(2, 6000, "")));
    let m = a["message"].as_str().unwrap_or_default();
    assert!(m.contains("line 3") && m.contains("at most 10000 connections"), "{a}");
    let a = c.run(&format!("<profile name=\"p\">\n{}</profile>", groups(1, 1, "port=80")));
    assert!(a["message"].as_str().unwrap_or_default().contains("port=80 is privileged"), "{a}");

    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let xml = format!(
        "<profile name=\"t\">\n{}{}{}</profile>",
        groups(3, 1, ""),
        groups(1, 1, "protocol=udp"),
        groups(1, 1, &format!("port={port}"))
    );
    let a = c.run(&xml);
    assert!(a["message"].as_str().unwrap_or_default().contains(&format!("port {port}")), "{a}");
    // Only this control connection's thread is left.
    assert!(
        wait_until(Duration::from_secs(10), || srv.threads() == idle + 1),
        "{} threads, {} at rest: a failed preparation left threads behind",
        srv.threads(),
        idle
    );
    // And the server is free for a run.
    let a = c.run(&format!("<profile name=\"ok\">\n{}</profile>", groups(2, 1, "")));
    assert_eq!(a["msg"], "ready", "{a}");
}

/// A client that leaves mid-run (its control connection closed, a TCP data connection
/// left open half-way through a request, a UDP peer known): the run ends at once, its
/// threads end, the data connection is closed, and the ports are free again.
#[test]
fn a_client_that_leaves_mid_run_takes_its_sockets_and_threads_with_it() {
    let srv = Server::start();
    let mut c = Control::hello(&srv);
    let idle = srv.threads() - 1;
    let a = c.run(
        r#"<profile name="left"><group nthreads="1">
<transaction iterations="1"><flowop type="connect" options="remotehost=127.0.0.1 protocol=tcp"/></transaction>
<transaction duration="300s"><flowop type="write" options="size=200"/><flowop type="read" options="size=1000"/></transaction>
</group><group nthreads="1">
<transaction iterations="1"><flowop type="connect" options="remotehost=127.0.0.1 protocol=udp"/></transaction>
<transaction duration="300s"><flowop type="write" options="size=20"/><flowop type="read" options="size=100"/></transaction>
</group></profile>"#,
    );
    let (tcp, udp) = (port_of(&a, 0), port_of(&a, 1));
    let mut data = TcpStream::connect(("127.0.0.1", tcp)).unwrap();
    data.write_all(&[0u8; 100]).unwrap();
    let u = UdpSocket::bind("127.0.0.1:0").unwrap();
    u.send_to(&[0u8; 20], ("127.0.0.1", udp)).unwrap();
    assert_eq!(count_datagrams(&u, Duration::from_secs(2)), 1);
    assert!(
        wait_until(Duration::from_secs(10), || srv.threads() >= idle + 4),
        "control, acceptor, UDP loop and connection threads"
    );
    drop(c);
    assert!(
        wait_until(Duration::from_secs(20), || srv.threads() == idle),
        "{} threads, {} at rest: the run outlived its client",
        srv.threads(),
        idle
    );
    assert!(UdpSocket::bind(("127.0.0.1", udp)).is_ok(), "the UDP data port is free again");
    assert!(TcpStream::connect(("127.0.0.1", tcp)).is_err(), "the data listener is closed");
    data.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut b = [0u8; 1];
    assert!(matches!(data.read(&mut b), Ok(0) | Err(_)), "the data connection is closed");
    assert!(srv.log().contains("went away during a run"), "{}", srv.log());
}

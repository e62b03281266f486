//! The control API (docs/api.md): a client of the line protocol keeps working with this
//! daemon (the exact bytes the v1 client sent, answers read in the v1 shapes), JSON-RPC 2.0
//! clients of this and of a newer minor version, and the event subscription on both
//! datapaths.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use common::*;
use serde_json::{Value, json};

/// The answers' shapes as the v1 client (commit b6afd60) read them: only what it required.
mod v1 {
    use serde::Deserialize;

    #[derive(Deserialize)]
    pub struct Response {
        pub ok: bool,
        #[serde(default)]
        pub error: Option<String>,
        #[serde(default)]
        pub data: Option<serde_json::Value>,
    }

    #[derive(Deserialize)]
    #[allow(dead_code)]
    pub struct SwitchSummary {
        pub protocol: u32,
        pub version: String,
        pub name: String,
        pub mode: String,
        pub pid: u32,
        pub lossless: bool,
        pub poll: bool,
        pub mtu: u16,
        pub ports: usize,
    }

    #[derive(Deserialize)]
    #[allow(dead_code)]
    pub struct PortStats {
        pub name: String,
        pub kind: String,
        pub netns: Option<String>,
        pub vlan: String,
        pub mtu: u16,
        pub offload: bool,
        pub queued: usize,
        pub held: usize,
        pub failed: Option<String>,
        pub counters: serde_json::Value,
        pub device_drops: Option<serde_json::Value>,
    }

    #[derive(Deserialize)]
    #[allow(dead_code)]
    pub struct FibSummary {
        pub entries: usize,
        pub max_entries: usize,
        pub aging_s: u64,
        pub moves: u64,
        pub full_refusals: u64,
    }

    #[derive(Deserialize)]
    #[allow(dead_code)]
    pub struct StatsReport {
        pub switch: SwitchSummary,
        pub uptime_s: f64,
        pub counters_age_s: f64,
        pub ports: Vec<PortStats>,
        pub departed: serde_json::Value,
        pub fib: FibSummary,
    }

    #[derive(Deserialize)]
    #[allow(dead_code)]
    pub struct FibEntryReport {
        pub vlan: u16,
        pub mac: String,
        pub port: String,
        #[serde(rename = "static")]
        pub is_static: bool,
        pub age_s: Option<f64>,
    }

    #[derive(Deserialize)]
    #[allow(dead_code)]
    pub struct FibReport {
        pub summary: FibSummary,
        pub entries: Vec<FibEntryReport>,
    }

    #[derive(Deserialize)]
    #[allow(dead_code)]
    pub struct MonitorStatus {
        pub running: bool,
        pub file: Option<String>,
        pub interval_ms: u64,
        pub max_mb: u64,
        pub records: u64,
    }
}

/// A raw connection to a switch's control socket: lines out, lines in (each read bounded).
struct Conn {
    r: BufReader<UnixStream>,
    w: UnixStream,
}

impl Conn {
    fn open(lab: &Lab) -> Conn {
        let s = UnixStream::connect(run_dir().join(format!("{}.sock", lab.name))).expect("the lab's control socket");
        s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
        Conn { w: s.try_clone().unwrap(), r: BufReader::new(s) }
    }

    fn send(&mut self, line: &str) {
        self.w.write_all(format!("{line}\n").as_bytes()).unwrap();
    }

    /// The next line, or `None` when none came within the read timeout (or the end).
    fn line(&mut self) -> Option<Value> {
        let mut l = String::new();
        match self.r.read_line(&mut l) {
            Ok(n) if n > 0 => Some(serde_json::from_str(&l).unwrap_or_else(|e| panic!("{e}: {l}"))),
            _ => None,
        }
    }

    fn ask(&mut self, line: &str) -> Value {
        self.send(line);
        self.line().unwrap_or_else(|| panic!("no answer within 15 s to {line}"))
    }

    fn call(&mut self, id: u64, method: &str, params: Value) -> Value {
        let v = self.ask(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string());
        assert_eq!((&v["jsonrpc"], &v["id"]), (&json!("2.0"), &json!(id)), "{v}");
        v
    }
}

#[test]
#[ignore = "system tier: needs root (network namespaces and TAP devices); scripts/test.sh runs it"]
fn the_v1_clients_exact_requests_are_answered_in_the_v1_shapes() {
    if !root() {
        return;
    }
    let lab = Lab::up("apiv1", &["--guests", "1"]);
    let fixture = include_str!("fixtures/v1_client_requests.txt");
    // (The recorded port names, made unique to this run; same lengths and characters.)
    let tag = format!("{:05}", std::process::id() % 100_000);
    let mut c = Conn::open(&lab);
    let mut answered = 0;
    for line in fixture.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()) {
        let line = line.replace("v1port", &format!("v1{tag}"));
        let cmd = serde_json::from_str::<Value>(&line).unwrap()["cmd"].as_str().unwrap().to_string();
        // The v1 client sent `hello` first on each connection, and checked its version.
        let hello: v1::Response = serde_json::from_value(c.ask(r#"{"cmd":"hello"}"#)).unwrap();
        let s: v1::SwitchSummary = serde_json::from_value(hello.data.unwrap()).unwrap();
        assert_eq!((s.protocol, s.name.as_str()), (1, lab.name.as_str()));
        let r: v1::Response = serde_json::from_value(c.ask(&line)).unwrap();
        assert!(r.ok, "{line}: {:?}", r.error);
        let data = r.data.unwrap_or(Value::Null);
        match cmd.as_str() {
            "port_list" | "stats" => {
                let s: v1::StatsReport = serde_json::from_value(data).unwrap();
                assert!(!s.ports.is_empty() && s.switch.protocol == 1, "{line}");
            }
            "fib_show" => {
                let f: v1::FibReport = serde_json::from_value(data).unwrap();
                assert!(f.entries.iter().any(|e| e.mac == "02:00:00:00:00:01" && e.is_static), "{line}");
            }
            "monitor_status" => {
                let m: v1::MonitorStatus = serde_json::from_value(data).unwrap();
                assert!(!m.running);
            }
            "hello" => assert_eq!(data["protocol"], json!(1)),
            "grant_list" => assert_eq!(data["enforced"], json!(false)),
            _ => assert_eq!(data, Value::Null, "{line}"),
        }
        answered += 1;
    }
    assert_eq!(answered, 14, "every recorded request was sent");
    // A malformed line is still answered in the v1 shape, and the connection stays.
    let r: v1::Response = serde_json::from_value(c.ask(r#"{"cmd":"nosuch"}"#)).unwrap();
    assert!(!r.ok && r.error.unwrap().contains("malformed request"));
    let r: v1::Response = serde_json::from_value(c.ask(r#"{"cmd":"port_del","name":"nosuch0"}"#)).unwrap();
    assert!(!r.ok && r.error.unwrap().contains("no port named"));
}

#[test]
#[ignore = "system tier: needs root (network namespaces and TAP devices); scripts/test.sh runs it"]
fn jsonrpc_clients_of_this_and_a_newer_minor_version_are_answered_with_codes() {
    if !root() {
        return;
    }
    let lab = Lab::up("apirpc", &["--guests", "1"]);
    let mut c = Conn::open(&lab);
    let hello = c.call(1, "hello", json!({}));
    assert_eq!(
        (&hello["result"]["protocol"], &hello["result"]["protocol_minor"]),
        (&json!(2), &json!(sluice_api::proto::PROTOCOL_MINOR)),
        "{hello}"
    );
    // A client of a newer minor version: a param this daemon does not know is ignored.
    let stats = c.call(2, "stats", json!({"port": lab.tap(1), "with_history_of_a_later_minor": true}));
    assert_eq!(stats["result"]["ports"][0]["name"], json!(lab.tap(1)), "{stats}");
    // A request without params is one with none; a string id comes back as it was.
    let v = c.ask(r#"{"jsonrpc":"2.0","id":"list-1","method":"port_list"}"#);
    assert_eq!(v["id"], json!("list-1"));
    assert!(v["result"]["ports"].is_array(), "{v}");
    // Errors, each with its code.
    let code = |v: &Value| v["error"]["code"].as_i64().unwrap_or_else(|| panic!("no error in {v}"));
    assert_eq!(code(&c.call(3, "port_del", json!({"name": "nosuch0"}))), -32001);
    let dup = c.call(4, "port_add", json!({"port": {"name": lab.tap(1)}}));
    assert_eq!(code(&dup), -32002, "{dup}");
    assert_eq!(code(&c.call(5, "nosuch", json!({}))), -32601);
    assert_eq!(code(&c.call(6, "port_del", json!({}))), -32602);
    assert_eq!(code(&c.call(7, "stats", json!([1]))), -32602);
    assert_eq!(code(&c.ask(r#"[{"jsonrpc":"2.0","id":8,"method":"hello"}]"#)), -32600);
    assert_eq!(code(&c.ask(r#"{"jsonrpc":"2.0","id":9,"method":"hel"#)), -32700);
    // A notification is run and not answered: the next line is the next request's answer.
    c.send(r#"{"jsonrpc":"2.0","method":"stats_reset"}"#);
    assert_eq!(c.call(10, "hello", json!({}))["id"], json!(10));
    // Both framings on one connection.
    let v1 = c.ask(r#"{"cmd":"hello"}"#);
    assert_eq!((&v1["ok"], &v1["data"]["protocol"]), (&json!(true), &json!(1)), "{v1}");
    // The CLI speaks JSON-RPC.
    assert!(sluice_ok(&["port", "list", "--switch", &lab.name]).contains(&lab.tap(1)));
    // And socat, as docs/api.md shows.
    assert!(have("socat"));
    let sock = run_dir().join(format!("{}.sock", lab.name));
    let out = sh_ok(&format!(
        "echo '{{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"hello\"}}' | timeout 10 socat -t 5 - UNIX-CONNECT:{}",
        sock.display()
    ));
    let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(v["result"]["name"], json!(lab.name), "{v}");
}

/// Reads notifications from `c` until `f` has seen what it wants (true), at most 15 s;
/// returns every event read.
fn events_until(c: &mut Conn, what: &str, mut f: impl FnMut(&Value) -> bool) -> Vec<Value> {
    let end = Instant::now() + Duration::from_secs(15);
    let mut seen = Vec::new();
    while Instant::now() < end {
        let Some(v) = c.line() else { break };
        assert_eq!(v["method"], json!("event"), "{v}");
        let done = f(&v["params"]);
        seen.push(v["params"].clone());
        if done {
            return seen;
        }
    }
    panic!("waited 15 s for {what}; events seen: {seen:#?}");
}

fn mac_text(m: [u8; 6]) -> String {
    m.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":")
}

both_datapaths! {
    #[ignore = "system tier: needs root (network namespaces, TAP devices, and veths with BPF programs for the kernel datapath), ping; scripts/test.sh runs it"]
    fn subscribers_see_stations_learned_and_ports_going_down(dp: Dp) {
        if !root() {
            return;
        }
        let lab = Lab::on(dp, "apiev", &["--guests", "2"]);
        let (m1, m2) = (mac_text(mac_of(&lab.ns(1), &lab.tap(1))), mac_text(mac_of(&lab.ns(2), &lab.tap(2))));
        ns_ok(&lab.ns(1), &format!("ping -c 1 -W 2 {}", lab.ip4(2)));
        let mut c = Conn::open(&lab);
        let sub = c.call(1, "subscribe", json!({}));
        assert!(sub["result"]["kinds"].as_array().is_some_and(|k| k.len() == 8), "{sub}");
        let mut narrow = Conn::open(&lab);
        let only = narrow.call(1, "subscribe", json!({"kinds": ["port_down"]}));
        assert_eq!(only["result"]["kinds"], json!(["port_down"]), "{only}");
        let bad = Conn::open(&lab).call(1, "subscribe", json!({"kinds": ["nosuch"]}));
        assert_eq!(bad["error"]["code"], json!(-32602), "{bad}");
        // The CLI follows too (its first line once it listens: a static entry added).
        let mut cli = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args(["events", "--switch", &lab.name])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let out = cli.stdout.take().unwrap();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send(l);
            }
        });
        let mut cli_lines = Vec::new();
        let listening = wait_for(15, || {
            sluice_ok(&["fib", "add", "02:00:00:00:00:99", &lab.tap(1), "--switch", &lab.name]);
            sluice_ok(&["fib", "del", "02:00:00:00:00:99", "--switch", &lab.name]);
            cli_lines.extend(rx.try_iter());
            cli_lines.iter().any(|l| l.contains("station_learned") && l.contains("02:00:00:00:00:99 vlan 1"))
        });
        assert!(listening, "`sluice events` printed no static entry in 15 s: {cli_lines:#?}");
        // Learned stations are forgotten, then learned again by the ping.
        for m in [&m1, &m2] {
            sluice_ok(&["fib", "del", m, "--switch", &lab.name]);
        }
        ns_ok(&lab.ns(1), &format!("ping -c 2 -W 2 {}", lab.ip4(2)));
        let learned = |p: &Value, mac: &str, port: &str| {
            p["kind"] == "station_learned" && p["mac"] == mac && p["port"] == port && p["vlan"] == 1
        };
        let (mut got1, mut got2) = (false, false);
        let seen = events_until(&mut c, "both guests' stations learned", |p| {
            got1 |= learned(p, &m1, &lab.tap(1));
            got2 |= learned(p, &m2, &lab.tap(2));
            got1 && got2
        });
        let seqs: Vec<u64> = seen.iter().map(|p| p["seq"].as_u64().unwrap()).collect();
        assert!(seqs.windows(2).all(|w| w[0] < w[1]), "in order: {seqs:?}");
        assert!(seen.iter().any(|p| p["kind"] == "station_removed" && p["mac"] == m1.as_str()), "{seen:#?}");
        // A port deleted: its stations are forgotten, and it goes down.
        sluice_ok(&["port", "del", &lab.tap(2), "--switch", &lab.name]);
        let mut forgot = false;
        let seen = events_until(&mut c, "port_down of the deleted port", |p| {
            forgot |= p["kind"] == "station_removed" && p["mac"] == m2.as_str() && p["port"] == lab.tap(2);
            p["kind"] == "port_down" && p["port"] == lab.tap(2) && p["reason"] == "detached"
        });
        assert!(forgot, "its station forgotten before it went down: {seen:#?}");
        let down = narrow.line().expect("the port_down subscriber's event");
        assert_eq!((&down["params"]["kind"], &down["params"]["port"]), (&json!("port_down"), &json!(lab.tap(2))));
        // The CLI printed the stations too; it ends with Ctrl-C (here: killed).
        assert!(wait_for(10, || {
            cli_lines.extend(rx.try_iter());
            cli_lines.iter().any(|l| l.contains("port_down") && l.contains(&lab.tap(2)))
        }), "{cli_lines:#?}");
        let _ = cli.kill();
        let _ = cli.wait();
        assert!(cli_lines.iter().any(|l| l.contains("station_learned") && l.contains(&m1)), "{cli_lines:#?}");
    }
}

both_datapaths! {
    #[ignore = "system tier: needs root (network namespaces, TAP devices and uplink veths); scripts/test.sh runs it"]
    fn subscribers_see_an_uplink_fail_over(dp: Dp) {
        if !root() {
            return;
        }
        let lab = Lab::on(dp, "apiup", &["--guests", "1", "--lan", "--uplinks", "2"]);
        let lan = Lan::of(&lab);
        let mut c = Conn::open(&lab);
        let sub = c.call(1, "subscribe", json!({"kinds": ["uplink_failover"]}));
        assert_eq!(sub["result"]["kinds"], json!(["uplink_failover"]), "{sub}");
        ns_ok(&lan.up_ns, &format!("ip link set {} down", lan.port));
        let seen = events_until(&mut c, "the uplink's failover", |p| p["kind"] == "uplink_failover");
        let e = seen.last().unwrap();
        assert_eq!(e["port"], json!(lan.port), "{e}");
        assert!(e["what"].as_str().is_some_and(|w| !w.is_empty()), "{e}");
    }
}

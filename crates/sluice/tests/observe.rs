//! Seeing inside the switch (issue 19): the Prometheus / OpenMetrics endpoint read by
//! Prometheus's own Python parser and held against `sluice stats --json`.

mod common;

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use common::*;

/// A switch of the test's own (user-space datapath) with guests `g1` and `g2` on TAPs,
/// IPv6 off in the guests so that nothing but the test's traffic moves the counters.
struct Switch(FileSwitch);

impl std::ops::Deref for Switch {
    type Target = FileSwitch;
    fn deref(&self) -> &FileSwitch {
        &self.0
    }
}

impl Switch {
    fn new(tag: &str, extra: &str) -> Switch {
        Switch::with(tag, extra, &["", ""], Dp::User)
    }

    /// A switch on datapath `dp` with a guest per entry of `ports` (that port's settings):
    /// TAPs on the user-space datapath, veth pairs on the kernel one, `SWITCHtI` at both ends.
    fn with(tag: &str, extra: &str, ports: &[&str], dp: Dp) -> Switch {
        let no_ipv6 = "sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1";
        let sw = Switch(FileSwitch::start(unique(tag), dp, extra, ports, no_ipv6));
        for i in 1..=ports.len() {
            ns_ok(
                &sw.namespaces[i - 1],
                &format!("ip link set {}t{i} up && ip addr add 10.79.0.{i}/24 dev {}t{i}", sw.name, sw.name),
            );
        }
        sw
    }

    fn stats(&self) -> serde_json::Value {
        serde_json::from_str(&sluice_ok(&["stats", "--json", "--switch", &self.name])).unwrap()
    }
}

/// One HTTP GET of `path` at `addr`: (status line, content type, body).
fn get(addr: &str, path: &str) -> (String, String, String) {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(10))).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAccept: application/openmetrics-text\r\n\r\n").unwrap();
    let mut all = String::new();
    s.read_to_string(&mut all).unwrap();
    let (head, body) = all.split_once("\r\n\r\n").unwrap();
    let status = head.lines().next().unwrap().to_string();
    let ctype = head.lines().find_map(|l| l.strip_prefix("Content-Type: ")).unwrap_or_default().to_string();
    (status, ctype, body.to_string())
}

/// True when Debian's Python has Prometheus's client library (python3-prometheus-client);
/// otherwise fails the test saying what to do.
fn have_parser() -> bool {
    let ok = Command::new("/usr/bin/python3")
        .args(["-c", "import prometheus_client.openmetrics.parser"])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        ok,
        "needs /usr/bin/python3 with prometheus_client: apt-get install python3-prometheus-client (scripts/test.sh installs it), or leave out --include-ignored"
    );
    ok
}

/// Every sample of an OpenMetrics text as parsed by prometheus_client: name{labels} value.
fn parse(text: &str) -> std::collections::BTreeMap<String, f64> {
    let script = r#"
import json, sys
from prometheus_client.openmetrics.parser import text_string_to_metric_families
out = {}
for fam in text_string_to_metric_families(sys.stdin.read()):
    for s in fam.samples:
        key = s.name + "{" + ",".join(f"{k}={v}" for k, v in sorted(s.labels.items())) + "}"
        out[key] = s.value
print(json.dumps(out))
"#;
    let mut p = Command::new("/usr/bin/python3")
        .args(["-c", script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    p.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let o = p.wait_with_output().unwrap();
    assert!(
        o.status.success(),
        "the OpenMetrics parser refused the text: {}\n{text}",
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).unwrap()
}

#[test]
#[ignore = "system tier: needs root (network namespaces and TAP devices), ping and python3 with prometheus_client; scripts/test.sh runs it"]
fn the_metrics_endpoint_speaks_openmetrics_and_agrees_with_stats() {
    if !root() || !have("ping") || !have_parser() {
        return;
    }
    // Port 0: the kernel picks one, and `sluice stats` says which.
    let sw = Switch::new("metr", "metrics_listen = \"127.0.0.1:0\"\nmcast_snooping = false");
    let addr = sw.stats()["switch"]["metrics"].as_str().expect("stats names the metrics address").to_string();
    ns_ok(&sw.namespaces[0], "ping -c 5 -i 0.2 -W 5 10.79.0.2");

    let (status, ctype, body) = get(&addr, "/metrics");
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert!(ctype.starts_with("application/openmetrics-text; version=1.0.0"), "{ctype}");
    assert!(body.ends_with("# EOF\n"), "{body}");
    let m = parse(&body);
    let stats = sw.stats();
    let again = parse(&get(&addr, "/metrics").2);
    // Nothing moves the counters now (the guests speak no IPv6): all three reads agree.
    for p in stats["ports"].as_array().unwrap() {
        let port = p["name"].as_str().unwrap();
        let c = &p["counters"];
        for key in ["rx_frames", "rx_bytes", "tx_frames", "tx_bytes", "forwarded", "flooded", "tx_offered"] {
            let sample = format!("sluice_port_{key}_total{{port={port},switch={}}}", sw.name);
            let got = m.get(&sample).unwrap_or_else(|| panic!("no {sample} in\n{body}"));
            assert_eq!(*got, c[key].as_u64().unwrap() as f64, "{sample} against stats {c}");
            assert_eq!(again.get(&sample), Some(got), "{sample} moved between reads");
        }
        assert!(c["rx_frames"].as_u64().unwrap() >= 5, "the pings went through {port}: {c}");
        let drop = format!("sluice_port_rx_drops_total{{cause=over_mtu,port={port},switch={}}}", sw.name);
        assert_eq!(m.get(&drop), Some(&0.0), "drops by cause: {drop}");
        let up = format!("sluice_port_up{{port={port},switch={}}}", sw.name);
        assert_eq!(m.get(&up), Some(&1.0));
        let class = format!("sluice_class_tx_frames_total{{class=default,port={port},switch={}}}", sw.name);
        assert!(m.contains_key(&class), "per-class counters: {class}");
    }
    let fib = format!("sluice_fib_entries{{switch={}}}", sw.name);
    assert_eq!(m.get(&fib), Some(&(stats["fib"]["entries"].as_u64().unwrap() as f64)));
    assert!(m[&format!("sluice_datapath_cpu_seconds_total{{switch={}}}", sw.name)] >= 0.0);
    // The host's shared-memory fast path, summed over its users (zeros until a program ran).
    assert!(m.contains_key("sluice_smc_connections_client_total{}"), "smc counters: {body}");

    // Anything but GET /metrics is refused with a status that says so.
    assert_eq!(get(&addr, "/").0, "HTTP/1.1 404 Not Found");
    let mut s = std::net::TcpStream::connect(&addr).unwrap();
    write!(s, "POST /metrics HTTP/1.1\r\n\r\n").unwrap();
    let mut r = String::new();
    s.read_to_string(&mut r).unwrap();
    assert!(r.starts_with("HTTP/1.1 405"), "{r}");
}

#[test]
#[ignore = "system tier: needs root (network namespaces and TAP devices); scripts/test.sh runs it"]
fn a_metrics_address_that_is_taken_or_malformed_fails_the_start_with_the_reason() {
    if !root() {
        return;
    }
    init();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let dir = scratch("observe-bad");
    let name = unique("mbad");
    for (listen, want) in [(addr.as_str(), "is the port taken"), ("localhost", "sw.toml:3")] {
        let f = dir.join("sw.toml");
        std::fs::write(&f, format!("name = \"{name}\"\ndatapath = \"user\"\nmetrics_listen = \"{listen}\"\n")).unwrap();
        let o = sluice(&["switch", "run", "--config", f.to_str().unwrap()]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && err.contains(want), "{listen}: {err}");
    }
    assert!(!run_dir().join(format!("{name}.sock")).exists(), "no control socket is left behind");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
#[ignore = "system tier: needs root (network namespaces and TAP devices), iperf3; scripts/test.sh runs it"]
fn top_once_shows_the_rate_iperf3_measures() {
    if !root() || !have("iperf3") {
        return;
    }
    let sw = Switch::new("topo", "");
    let server = ns_spawn(&sw.namespaces[1], "timeout 60 iperf3 -s -1 -p 5301");
    assert!(wait_for(10, || ns_sh(&sw.namespaces[1], "ss -ltn | grep -q :5301").status.success()));
    let t0 = unix_now();
    let client = ns_spawn(&sw.namespaces[0], "timeout 60 iperf3 -c 10.79.0.2 -p 5301 -t 10 -i 0.5 -J");
    // Sampled while the stream runs (its bytes are moving through the receiver's port).
    let t2 = format!("{}t2", sw.name);
    let tx = |sw: &Switch| {
        sw.stats()["ports"].as_array().unwrap().iter().find(|p| p["name"] == t2.as_str()).unwrap()["counters"]["tx_bytes"]
            .as_u64()
            .unwrap()
    };
    let start = tx(&sw);
    assert!(wait_for(10, || tx(&sw) > start + 50_000_000), "the stream did not start");
    let a = unix_now();
    let text = sluice_ok(&["top", "--once", "--interval", "3", "--switch", &sw.name]);
    let b = unix_now();
    let out = client.wait_with_output().unwrap();
    // (The server serves one test and ends.)
    let _ = server.wait_with_output();
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).expect("iperf3 -J");
    // iperf3's own rate over the same seconds: its half-second intervals, weighted by how
    // much of each falls within top's window (iperf3 counts from about when it started).
    let (mut bits, mut secs) = (0.0, 0.0);
    for i in j["intervals"].as_array().unwrap() {
        let s = &i["sum"];
        let (from, to) = (t0 + s["start"].as_f64().unwrap(), t0 + s["end"].as_f64().unwrap());
        let overlap = (to.min(b) - from.max(a)).max(0.0);
        bits += s["bits_per_second"].as_f64().unwrap() * overlap;
        secs += overlap;
    }
    assert!(secs > 2.0, "iperf3 ran through top's window: {secs} s of it");
    let iperf = bits / secs;
    // PORT KIND RX-FRAMES/S RX (value unit) TX-FRAMES/S TX (value unit) …
    let row: Vec<&str> =
        text.lines().find(|l| l.trim_start().starts_with(&t2)).expect(&text).split_whitespace().collect();
    let unit = |u: &str| match u {
        "b/s" => 1.0,
        "kb/s" => 1e3,
        "Mb/s" => 1e6,
        "Gb/s" => 1e9,
        _ => panic!("unit {u} in {text}"),
    };
    let top = row[6].parse::<f64>().unwrap() * unit(row[7]);
    // (top counts whole frames, headers too: about 4.5% more than iperf3's payload.)
    let ratio = top / iperf;
    assert!((0.8..=1.2).contains(&ratio), "top says {top:.3e} b/s to {t2}, iperf3 {iperf:.3e}: {ratio:.2}\n{text}");
    assert!(text.contains("datapath CPU"), "{text}");
}

#[test]
#[ignore = "system tier: needs root (network namespaces and TAP devices), ping and tmux; scripts/test.sh runs it"]
fn top_draws_its_live_view_in_a_terminal_and_quits_on_q() {
    if !root() || !have("tmux") {
        return;
    }
    let sw = Switch::new("toptm", "");
    // A tmux server of this test's own (its environment carries the test's run directory).
    let sock = format!("sluice-top-{}", std::process::id());
    struct Server(String);
    impl Drop for Server {
        fn drop(&mut self) {
            let _ = Command::new("tmux").args(["-L", &self.0, "kill-server"]).output();
        }
    }
    let _server = Server(sock.clone());
    let tmux = |args: &[&str]| Command::new("tmux").arg("-L").arg(&sock).args(args).output().unwrap();
    let cmd = format!("{BIN} top --switch {}", sw.name);
    let o = tmux(&["new-session", "-d", "-s", "top", "-x", "160", "-y", "30", &cmd]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    ns_ok(&sw.namespaces[0], "ping -c 3 -i 0.2 -W 5 10.79.0.2");
    let screen = || String::from_utf8_lossy(&tmux(&["capture-pane", "-p", "-t", "top"]).stdout).into_owned();
    let t1 = format!("{}t1", sw.name);
    assert!(
        wait_for(10, || {
            let s = screen();
            s.contains("RX FRAMES/S") && s.contains(&t1) && s.contains("q quits") && s.contains("datapath CPU")
        }),
        "the live view: {}",
        screen()
    );
    let s = screen();
    let row = s.lines().find(|l| l.trim_start().starts_with(&t1)).unwrap();
    assert!(row.contains("tap") && row.contains("b/s"), "a port row: {row}\n{s}");
    tmux(&["send-keys", "-t", "top", "q"]);
    assert!(wait_for(10, || !tmux(&["has-session", "-t", "top"]).status.success()), "q did not quit: {}", screen());
}

fn unix_now() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64()
}

#[test]
#[ignore = "system tier: needs root (network namespaces and TAP devices), iperf3 and python3; scripts/test.sh runs it"]
fn a_monitor_record_reduced_by_report_shows_an_iperf3_burst_where_it_was() {
    if !root() || !have("iperf3") {
        return;
    }
    let sw = Switch::new("moni", "");
    let file = sw.dir.join("sw.monitor");
    let f = file.to_str().unwrap();
    let o = sluice_ok(&["monitor", "start", "--file", f, "--interval", "1s", "--switch", &sw.name]);
    assert!(o.contains("recording every 1000 ms"), "{o}");
    // A 30-second record: 10 quiet records, a 10-second iperf3, 10 quiet records — each
    // quiet span waited for as the switch's own count of records, bounded.
    let records = || -> u64 {
        let s: serde_json::Value =
            serde_json::from_str(&sluice_ok(&["monitor", "status", "--json", "--switch", &sw.name])).unwrap();
        s["records"].as_u64().unwrap()
    };
    assert!(wait_for(20, || records() >= 10), "the first quiet records");
    let server = ns_spawn(&sw.namespaces[1], "timeout 60 iperf3 -s -1 -p 5302");
    assert!(wait_for(10, || ns_sh(&sw.namespaces[1], "ss -ltn | grep -q :5302").status.success()));
    let start = unix_now();
    ns_ok(&sw.namespaces[0], "timeout 60 iperf3 -c 10.79.0.2 -p 5302 -t 10");
    let end = unix_now();
    let _ = server.wait_with_output();
    let after = records();
    assert!(wait_for(20, || records() >= after + 10), "the last quiet records");
    let status: serde_json::Value =
        serde_json::from_str(&sluice_ok(&["monitor", "status", "--json", "--switch", &sw.name])).unwrap();
    assert!(status["running"].as_bool().unwrap() && status["records"].as_u64().unwrap() >= 25, "{status}");
    sluice_ok(&["monitor", "stop", "--switch", &sw.name]);

    let out = sw.dir.join("report");
    let o = sluice_ok(&["report", f, "--out", out.to_str().unwrap()]);
    assert!(o.contains("intervals"), "{o}");
    let csv = std::fs::read_to_string(out.join("intervals.csv")).unwrap();
    let t2 = format!("{}t2", sw.name);
    let (mut inside, mut outside) = (0, 0);
    for l in csv.lines().skip(1) {
        let f: Vec<&str> = l.split(',').collect();
        if f[3] != t2 {
            continue;
        }
        let (t_end, dt, tx): (f64, f64, f64) = (f[0].parse().unwrap(), f[2].parse().unwrap(), f[5].parse().unwrap());
        let t_begin = t_end - dt;
        if t_begin >= start + 1.0 && t_end <= end - 1.0 {
            inside += 1;
            assert!(tx > 50e6, "an interval within the burst carried {tx} b/s to {t2}:\n{csv}");
        } else if t_end <= start - 0.5 || t_begin >= end + 1.0 {
            outside += 1;
            assert!(tx < 1e6, "an interval outside the burst carried {tx} b/s to {t2}:\n{csv}");
        }
    }
    assert!(inside >= 6 && outside >= 12, "{inside} intervals inside the burst, {outside} outside:\n{csv}");
    let md = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(md.contains("| at (s) | in (Mb/s)") && md.contains(&t2), "{md}");
    for chart in ["throughput.png", "cpu.png"] {
        let d =
            png::Decoder::new(std::io::BufReader::new(std::fs::File::open(out.join("charts").join(chart)).unwrap()));
        let r = d.read_info().expect("a PNG");
        assert_eq!((r.info().width, r.info().height), (1000, 420), "{chart}");
    }
    // A record file is not a symbolic link to something else, and its mode is 0600.
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&file).unwrap().permissions().mode() & 0o777, 0o600);
    let link = sw.dir.join("link.monitor");
    std::os::unix::fs::symlink("/etc/passwd", &link).unwrap();
    let o = sluice(&["monitor", "start", "--file", link.to_str().unwrap(), "--switch", &sw.name]);
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("symbolic link"), "{o:?}");
}

/// `sluice capture` on switch `sw` with `args`, stderr to a file; returns once it says it
/// is capturing.
fn start_capture(sw: &Switch, what: &str, args: &[&str]) -> (Child, PathBuf) {
    let err = sw.dir.join(format!("{what}.err"));
    let child = Command::new(BIN)
        .args(["capture", "--switch", &sw.name])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap();
    assert!(
        wait_for(10, || std::fs::read_to_string(&err).unwrap_or_default().contains("capturing")),
        "capture {what} did not start: {}",
        std::fs::read_to_string(&err).unwrap_or_default()
    );
    (child, err)
}

/// Waits (at most 20 s) for a capture to end by itself.
fn finish(c: (Child, PathBuf)) -> String {
    let (mut child, err) = c;
    let ended = wait_for(20, || child.try_wait().unwrap().is_some());
    if !ended {
        let _ = child.kill();
    }
    let _ = child.wait();
    let text = std::fs::read_to_string(&err).unwrap_or_default();
    assert!(ended, "the capture did not end at its count: {text}");
    text
}

both_datapaths! {
    #[ignore = "system tier: needs root (network namespaces, TAP devices, and veths with BPF programs for the kernel datapath), ping and tshark; scripts/test.sh runs it"]
    fn a_capture_holds_the_ping_and_the_tag_a_trunk_port_is_sent(dp: Dp) {
        if !root() || !have("tshark") || !have("ping") {
            return;
        }
        let tag = if dp == Dp::Kernel { "captk" } else { "captu" };
        let sw = Switch::with(tag, "", &["vlan = 10", "vlan = 10", "trunk = [10]"], dp);
        let (t1, t3) = (format!("{}t1", sw.name), format!("{}t3", sw.name));
        let f1 = sw.dir.join("t1.pcap");
        let f3 = sw.dir.join("t3.pcap");
        // The guest's echo requests come in on t1 and the replies go out of it; the ARP
        // request is flooded to the trunk t3, tagged with VLAN 10.
        let c1 = start_capture(&sw, "t1", &[&t1, "-c", "4", "-w", f1.to_str().unwrap(), "icmp"]);
        // (In libpcap's syntax a tagged frame matches `arp` only after `vlan`.)
        let c3 = start_capture(
            &sw,
            "t3",
            &[&t3, "--direction", "out", "-c", "1", "-w", f3.to_str().unwrap(), "vlan", "10", "and", "arp"],
        );
        ns_ok(&sw.namespaces[0], "ip neigh flush all; ping -c 2 -i 0.3 -W 5 10.79.0.2");
        let said = finish(c1);
        assert!(said.contains("4 frame(s) captured"), "{said}");
        finish(c3);
        let icmp = sh_ok(&format!("tshark -r {} -T fields -e icmp.type -e ip.src", f1.display()));
        assert_eq!(
            icmp.lines().collect::<Vec<_>>(),
            ["8\t10.79.0.1", "0\t10.79.0.2", "8\t10.79.0.1", "0\t10.79.0.2"],
            "echo requests in and replies out, as tshark reads them"
        );
        let arp = sh_ok(&format!("tshark -r {} -T fields -e vlan.id -e arp.opcode -e arp.dst.proto_ipv4", f3.display()));
        assert_eq!(arp.trim(), "10\t1\t10.79.0.2", "the trunk is sent the ARP request tagged with VLAN 10");
        // Ctrl-C ends a capture with its file complete, as tcpdump's.
        let f2 = sw.dir.join("t2.pcap");
        let t2 = format!("{}t2", sw.name);
        let (c2, err2) = start_capture(&sw, "t2", &[&t2, "-w", f2.to_str().unwrap()]);
        ns_ok(&sw.namespaces[0], "ping -c 1 -W 5 10.79.0.2");
        sh_ok(&format!("kill -INT {}", c2.id()));
        let said = finish((c2, err2));
        assert!(said.contains("frame(s) captured"), "{said}");
        let n = sh_ok(&format!("tshark -r {} | wc -l", f2.display()));
        assert!(n.trim().parse::<u32>().unwrap() >= 2, "the echo request and reply in a readable file: {n}");
        // The captures over, the kernel datapath forwards the port's frames itself again.
        if dp == Dp::Kernel {
            let forwarded = || {
                sw.stats()["ports"].as_array().unwrap().iter().find(|p| p["name"] == t1.as_str()).unwrap()["kernel"]
                    ["forwarded"]
                    .as_u64()
                    .unwrap_or(0)
            };
            let before = forwarded();
            assert!(
                wait_for(10, || {
                    ns_ok(&sw.namespaces[0], "ping -c 1 -W 5 10.79.0.2");
                    forwarded() > before
                }),
                "the port went back to the kernel"
            );
            // A capture started while the kernel forwards the port's frames sees them: its
            // start makes every cached verdict go back to the core.
            let f4 = sw.dir.join("t1-again.pcap");
            let c4 = start_capture(&sw, "t1 again", &[&t1, "-c", "2", "-w", f4.to_str().unwrap(), "icmp"]);
            ns_ok(&sw.namespaces[0], "ping -c 1 -W 5 10.79.0.2");
            let said = finish(c4);
            assert!(said.contains("2 frame(s) captured"), "{said}");
        }
        // Errors name the fault: a port that is not there, a filter libpcap refuses.
        let o = sluice(&["capture", "--switch", &sw.name, "nope", "-w", "/dev/null"]);
        assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("nope"), "{o:?}");
        let o = sluice(&["capture", "--switch", &sw.name, &t1, "-w", "/dev/null", "tcp", "port", "banana"]);
        assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("capture filter"), "{o:?}");
    }
}

/// Clients that connect to the metrics endpoint and then say nothing, or trickle a request
/// head a byte a second without ever ending it — reconnecting each time they are closed —
/// never keep a scraper out: every scrape is answered 200 within its deadline.
#[test]
#[ignore = "system tier: needs root (network namespaces and TAP devices), python3; scripts/test.sh runs it"]
fn slow_clients_never_keep_a_scraper_from_the_metrics() {
    if !root() || !have("/usr/bin/python3") {
        return;
    }
    let sw = Switch::new("mslow", "metrics_listen = \"127.0.0.1:0\"");
    let addr = sw.stats()["switch"]["metrics"].as_str().expect("stats names the metrics address").to_string();
    let port = addr.rsplit(':').next().unwrap().to_string();
    // 16 silent and 16 trickling clients for 30 s (more than the 16 requests the endpoint
    // answers at once, and eight times the four places it once had).
    let slow = r#"
import socket, sys, threading, time
host, port = sys.argv[1].rsplit(":", 1)
end = time.time() + float(sys.argv[2])
def client(trickle):
    while time.time() < end:
        try:
            s = socket.create_connection((host, int(port)), timeout=2)
        except OSError:
            time.sleep(0.1)
            continue
        s.settimeout(1.0)
        head = b"GET /metrics HTTP/1.1\r\nX-Slow: "
        sent = 0
        while time.time() < end:
            try:
                if trickle:
                    s.send(head[sent:sent + 1] if sent < len(head) else b"a")
                    sent += 1
                if s.recv(1) == b"":
                    break
            except socket.timeout:
                continue
            except OSError:
                break
        s.close()
threads = [threading.Thread(target=client, args=(i % 2 == 0,)) for i in range(32)]
for t in threads:
    t.start()
for t in threads:
    t.join()
"#;
    struct Crowd(std::process::Child);
    impl Drop for Crowd {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _crowd = Crowd(
        Command::new("/usr/bin/python3")
            .args(["-c", slow, &addr, "30"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let established = || {
        let o = sh_ok(&format!("ss -Htn state established '( dport = :{port} )' | wc -l"));
        o.trim().parse::<u32>().unwrap_or(0)
    };
    assert!(wait_for(10, || established() >= 16), "the slow clients did not connect");
    // Scrapes over 12 s: longer than a request head may take, so the slow clients have been
    // cut off and have come back in between.
    let start = std::time::Instant::now();
    let mut scrapes = 0;
    while start.elapsed() < std::time::Duration::from_secs(12) {
        let t = std::time::Instant::now();
        let (status, _, body) = get(&addr, "/metrics");
        assert_eq!(status, "HTTP/1.1 200 OK", "scrape {scrapes} at {:?}: {body}", start.elapsed());
        assert!(body.ends_with("# EOF\n"), "{body}");
        assert!(t.elapsed() < std::time::Duration::from_secs(10), "scrape {scrapes} took {:?}", t.elapsed());
        scrapes += 1;
        std::thread::sleep(std::time::Duration::from_secs(1));
    }
    assert!(scrapes >= 5, "{scrapes} scrapes");
    assert!(established() >= 8, "the slow clients were still there at the end");
}

/// A FIFO, or a name someone else could swap, as the monitor file is refused at once with
/// the reason — by `sluice monitor start` (the control socket keeps answering) and in a
/// switch's configuration (the switch does not start) — instead of hanging the caller.
#[test]
#[ignore = "system tier: needs root (network namespaces and TAP devices); scripts/test.sh runs it"]
fn a_monitor_file_that_is_a_fifo_or_behind_someone_elses_link_is_refused_at_once() {
    if !root() {
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let mkfifo = |p: &std::path::Path| {
        let c = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo {}", p.display());
    };
    // Opening the FIFO for reading lets a writer blocked in open(2) go (old daemons hung there).
    let release = |p: &std::path::Path| {
        use std::os::unix::fs::OpenOptionsExt;
        let _ = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(p);
    };
    /// Runs `sluice ARGS`, at most 15 s; `None` if it had not ended by then.
    fn bounded(args: &[&str]) -> Option<std::process::Output> {
        let mut c = Command::new(BIN).args(args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        if !wait_for(15, || c.try_wait().unwrap().is_some()) {
            let _ = c.kill();
            let _ = c.wait();
            return None;
        }
        Some(c.wait_with_output().unwrap())
    }
    let sw = Switch::new("mfifo", "");
    let fifo = sw.dir.join("m.fifo");
    mkfifo(&fifo);
    let o = bounded(&["monitor", "start", "--file", fifo.to_str().unwrap(), "--switch", &sw.name]);
    release(&fifo);
    let o = o.expect("`sluice monitor start` with a FIFO did not return within 15 s");
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && e.contains("is a FIFO (named pipe), not a regular file"), "{e}");
    let status = bounded(&["monitor", "status", "--json", "--switch", &sw.name]).expect("monitor status hung");
    assert!(status.status.success(), "{status:?}");
    assert!(String::from_utf8_lossy(&status.stdout).contains("\"running\": false"), "{status:?}");
    assert!(bounded(&["port", "list", "--switch", &sw.name]).is_some_and(|o| o.status.success()));

    // A directory others can write (sticky, as /tmp): a link or a directory someone else
    // put there is not gone through.
    let shared = sw.dir.join("shared");
    std::fs::create_dir(&shared).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let elsewhere = sw.dir.join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    std::os::unix::fs::symlink(&elsewhere, shared.join("lnk")).unwrap();
    std::os::unix::fs::lchown(shared.join("lnk"), Some(65534), Some(65534)).unwrap();
    std::fs::create_dir(shared.join("theirs")).unwrap();
    std::os::unix::fs::chown(shared.join("theirs"), Some(65534), Some(65534)).unwrap();
    for (file, want) in [
        (shared.join("lnk/x.monitor"), "symbolic link in a directory others can write"),
        (shared.join("theirs/x.monitor"), "belongs to uid 65534"),
    ] {
        let o = bounded(&["monitor", "start", "--file", file.to_str().unwrap(), "--switch", &sw.name]).unwrap();
        let e = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && e.contains(want), "{}: {e}", file.display());
    }
    assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0, "nothing was written through the link");
    // One of the switch's own there is fine.
    let ok = shared.join("mine.monitor");
    sluice_ok(&["monitor", "start", "--file", ok.to_str().unwrap(), "--interval", "1s", "--switch", &sw.name]);
    sluice_ok(&["monitor", "stop", "--switch", &sw.name]);

    // In a configuration: the switch does not start, and says why.
    let name = unique("mfcfg");
    let dir = scratch(&name);
    let fifo = dir.join("m.fifo");
    mkfifo(&fifo);
    let conf = dir.join("s.toml");
    std::fs::write(
        &conf,
        format!(
            "name = \"{name}\"\ndatapath = \"user\"\nmonitor_file = \"{}\"\nmonitor_interval = \"1s\"\n",
            fifo.display()
        ),
    )
    .unwrap();
    let o = bounded(&["switch", "run", "--config", conf.to_str().unwrap()]);
    release(&fifo);
    if o.is_none() {
        let _ = sluice(&["switch", "stop", "--switch", &name]);
    }
    let o = o.expect("a switch with a FIFO as its monitor file neither started nor failed within 15 s");
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && e.contains("is a FIFO (named pipe), not a regular file"), "{e}");
    assert!(!run_dir().join(format!("{name}.sock")).exists(), "no control socket is left behind");
}

/// On the kernel datapath (frames copied up to the core, taken by the capture in batches)
/// each frame keeps its own time: an echo request and its reply are stamped apart, in order.
#[test]
#[ignore = "system tier: needs root (network namespaces, veths with BPF programs), ping and tshark; scripts/test.sh runs it"]
fn kernel_captures_stamp_each_frame_with_its_own_time() {
    if !root() || !have("tshark") || !have("ping") {
        return;
    }
    let sw = Switch::with("capts", "", &["", ""], Dp::Kernel);
    let t1 = format!("{}t1", sw.name);
    let f = sw.dir.join("stamps.pcap");
    let c = start_capture(&sw, "stamps", &[&t1, "-c", "4", "-w", f.to_str().unwrap(), "icmp"]);
    ns_ok(&sw.namespaces[0], "ping -c 2 -i 0.3 -W 5 10.79.0.2");
    let said = finish(c);
    assert!(said.contains("4 frame(s) captured"), "{said}");
    let out = sh_ok(&format!("tshark -r {} -T fields -e frame.time_epoch -e icmp.type", f.display()));
    // (seconds, nanoseconds) of each record, as tshark reads it.
    let stamps: Vec<((u64, u64), String)> = out
        .lines()
        .map(|l| {
            let (t, kind) = l.split_once('\t').unwrap();
            let (s, frac) = t.split_once('.').unwrap_or((t, "0"));
            let ns = format!("{frac:0<9}")[..9].parse().unwrap();
            ((s.parse().unwrap(), ns), kind.to_string())
        })
        .collect();
    assert_eq!(stamps.iter().map(|s| s.1.as_str()).collect::<Vec<_>>(), ["8", "0", "8", "0"], "{out}");
    for w in stamps.windows(2) {
        assert!(w[0].0 < w[1].0, "each frame stamped after the one before it: {out}");
    }
}

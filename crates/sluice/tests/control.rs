//! The daemon and its CLI: config errors with line numbers, the verbs against a running
//! switch, ports added and removed while traffic flows, labs side by side and cleaned up.

mod common;

use common::*;

#[test]
fn a_bad_config_is_refused_with_its_line_number() {
    let dir = scratch("cfg");
    let f = dir.join("bad.toml");
    std::fs::write(&f, "name = \"bad\"\nmtu = 1500\n\n[[port]]\nname = \"t0\"\nvlan = 4095\n").unwrap();
    let o = sluice(&["switch", "run", "--config", f.to_str().unwrap()]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains(&format!("{}:4", f.display())) || err.contains(&format!("{}:6", f.display())), "{err}");
    assert!(err.contains("4095"), "{err}");
    std::fs::write(&f, "name = \"bad\"\nmtu = 1500\nmac_agign = 30\n").unwrap();
    let o = sluice(&["switch", "run", "--config", f.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains(&format!("{}:3", f.display())) && err.contains("mac_agign"), "{err}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
#[ignore = "system tier: needs root (network namespaces and TAP devices), ping; scripts/test.sh runs it"]
fn cli_verbs_show_ports_fib_and_counters() {
    if !root() {
        return;
    }
    let lab = Lab::up("verbs", &["--guests", "2"]);
    ns_ok(&lab.ns(1), &format!("ping -c 1 -W 2 {}", lab.ip4(2)));
    let list = sluice_ok(&["port", "list", "--switch", &lab.name]);
    assert!(list.contains(&lab.tap(1)) && list.contains("access 1"), "{list}");
    let fib = sluice_ok(&["fib", "show", "--switch", &lab.name]);
    let m1 = mac_of(&lab.ns(1), &lab.tap(1)).iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":");
    assert!(fib.contains(&m1), "learned MAC of g1 in\n{fib}");
    let table = sluice_ok(&["stats", "--switch", &lab.name]);
    assert!(table.contains("RX FRAMES") && table.contains(&lab.tap(2)), "{table}");
    let detail = sluice_ok(&["stats", &lab.tap(1), "--switch", &lab.name]);
    assert!(detail.contains("rx frames"), "{detail}");
    sluice_ok(&["fib", "add", "02:00:00:00:00:99", &lab.tap(2), "--switch", &lab.name]);
    assert!(sluice_ok(&["fib", "show", "--switch", &lab.name]).contains("02:00:00:00:00:99"));
    // Many frames since the lab came up (the ping, ARP, the guests' IPv6 start-up)...
    sh_ok(&format!("ip netns exec {} ping -c 5 -i 0.2 -W 2 {}", lab.ns(1), lab.ip4(2)));
    let before = lab.port(&lab.tap(1))["counters"]["rx_frames"].as_u64().unwrap();
    assert!(before >= 5, "{before}");
    sluice_ok(&["stats", "reset", "--switch", &lab.name]);
    // ...and after the reset only what arrived since (a guest's IPv6 timers may send one).
    let after = lab.port(&lab.tap(1))["counters"]["rx_frames"].as_u64().unwrap();
    assert!(after < before, "rx_frames {before} before the reset, {after} after");
    let o = sluice(&["port", "del", "nosuch", "--switch", &lab.name]);
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("no port named"));
    let o = sluice(&["stats", "--switch", "nosuchswitch"]);
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("no switch is listening"));
    // The control socket is owner-only.
    let sock = run_dir().join(format!("{}.sock", lab.name));
    let mode =
        std::fs::metadata(&sock).map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o777).unwrap();
    assert_eq!(mode, 0o600);
}

both_datapaths! {
    #[ignore = "system tier: needs root (network namespaces, TAP devices, and veths with BPF programs for the kernel datapath), iperf3; scripts/test.sh runs it"]
    fn ports_come_and_go_while_iperf3_runs_between_two_other_guests(dp: Dp) {
        if !root() {
            return;
        }
        let lab = Lab::on(dp, "churn", &["--guests", "2"]);
        let extra_ns = format!("sluice-{}-x", lab.name);
        sh_ok(&format!("ip netns add {extra_ns}"));
        struct Cleanup(String);
        impl Drop for Cleanup {
            fn drop(&mut self) {
                let _ = std::process::Command::new("ip").args(["netns", "del", &self.0]).output();
            }
        }
        let _c = Cleanup(extra_ns.clone());
        let server = ns_spawn(&lab.ns(2), "timeout 40 iperf3 -s -1");
        assert!(wait_for(10, || ns_sh(&lab.ns(2), "ss -ltn | grep -q :5201").status.success()));
        let client = ns_spawn(&lab.ns(1), &format!("iperf3 -c {} -t 6 -i 1 -J", lab.ip4(2)));
        std::thread::sleep(std::time::Duration::from_millis(500));
        for i in 0..6 {
            let tap = format!("{}-x{i}", lab.name);
            sluice_ok(&["port", "add", &tap, "--netns", &extra_ns, "--switch", &lab.name]);
            std::thread::sleep(std::time::Duration::from_millis(300));
            sluice_ok(&["port", "del", &tap, "--switch", &lab.name]);
            std::thread::sleep(std::time::Duration::from_millis(300));
        }
        let out = client.wait_with_output().unwrap();
        let _ = server.wait_with_output();
        assert!(out.status.success(), "iperf3 failed: {}", String::from_utf8_lossy(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert!(v["error"].is_null(), "{}", v["error"]);
        for iv in v["intervals"].as_array().unwrap() {
            let b = iv["sum"]["bytes"].as_u64().unwrap();
            assert!(b > 0, "an interval moved nothing (stall): {iv}");
        }
        let ports = lab.stats()["ports"].as_array().unwrap().len();
        assert_eq!(ports, 2, "the extra ports are gone");
        assert!(!ns_ok(&extra_ns, "ip -o link").contains("-x"), "their TAPs are gone");
        assert_conserved(&lab.settled_stats());
    }
}

#[test]
#[ignore = "system tier: needs root (network namespaces and TAP devices), ping; scripts/test.sh runs it"]
fn two_labs_coexist_and_down_removes_only_their_own() {
    if !root() {
        return;
    }
    let a = Lab::up("coa", &["--guests", "2"]);
    let b = Lab::up("cob", &["--guests", "2"]);
    ns_ok(&a.ns(1), &format!("ping -c 1 -W 2 {}", a.ip4(2)));
    ns_ok(&b.ns(1), &format!("ping -c 1 -W 2 {}", b.ip4(2)));
    let a_ns = [a.ns(1), a.ns(2)];
    let b_name = b.name.clone();
    drop(a);
    let netns = sh_ok("ip netns list");
    assert!(!a_ns.iter().any(|n| netns.contains(n.as_str())), "lab a's namespaces are gone: {netns}");
    assert!(netns.contains(&b.ns(1)), "lab b untouched: {netns}");
    ns_ok(&b.ns(1), &format!("ping -c 1 -W 2 {}", b.ip4(2)));
    let o = sluice(&["lab", "up", "--name", &b_name]);
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("already up"));
}

both_datapaths! {
    #[ignore = "system tier: needs root (network namespaces, TAP devices, and veths with BPF programs for the kernel datapath); scripts/test.sh runs it"]
    fn lab_down_after_the_switch_died_still_cleans_up(dp: Dp) {
        if !root() {
            return;
        }
        let lab = Lab::on(dp, "crash", &["--guests", "2"]);
        let pid = lab.state["switch_pid"].as_u64().unwrap();
        sh_ok(&format!("kill -9 {pid}"));
        assert!(wait_for(5, || !std::path::Path::new(&format!("/proc/{pid}/cmdline")).exists()
            || std::fs::read(format!("/proc/{pid}/cmdline")).map(|c| c.is_empty()).unwrap_or(true)));
        let names = [lab.ns(1), lab.ns(2)];
        let switch = lab.name.clone();
        drop(lab);
        let netns = sh_ok("ip netns list");
        assert!(!names.iter().any(|n| netns.contains(n.as_str())), "{netns}");
        // Nothing of the dead daemon is left: socket, state, and on the kernel datapath
        // its programs (pins) and its upcall TAP.
        assert!(!run_dir().join(format!("{switch}.sock")).exists());
        assert!(!run_dir().join(format!("{switch}.state.json")).exists());
        assert!(!run_dir().join("bpf").join(&switch).exists(), "the kernel datapath's pins are gone");
        let mut h: u32 = 0x811c_9dc5;
        for b in switch.bytes() {
            h = (h ^ u32::from(b)).wrapping_mul(0x0100_0193);
        }
        let tap = format!("su{h:08x}");
        assert!(!ns_sh("", &format!("ip link show {tap}")).status.success(), "the upcall TAP {tap} is gone");
    }
}

#[test]
#[ignore = "system tier: needs root (`sluice demo`: network namespaces, and veths with BPF programs or TAP devices); scripts/test.sh runs it"]
fn the_demo_runs_end_to_end_and_leaves_nothing() {
    if !root() {
        return;
    }
    let name = unique("demo");
    let out = sluice_ok(&["demo", "--megabytes", "100", "--name", &name]);
    for step in ["echoes answered", "arrived intact", "client/server counts agree", "RX FRAMES", "lab removed"] {
        assert!(out.contains(step), "demo output lacks {step:?}:\n{out}");
    }
    // The shared-memory step: the bench's data connections (1 + 10) and its control
    // connection all moved; the only others are closed before their server decided. Other
    // tests may count too, so at least.
    let line = out.lines().find(|l| l.contains("client connections moved to shared memory")).expect("the smc step");
    let n: Vec<u64> = line.split_whitespace().filter_map(|w| w.parse().ok()).collect();
    assert!(n.len() == 3 && n[0] + n[2] == n[1] && n[0] >= 12, "{line}");
    assert!(!sh_ok("ip netns list").contains(&format!("sluice-{name}-")), "the demo's namespaces are gone");
}

/// A switch daemon run from a config file, stopped on drop (and the namespace and
/// directory the test made for it removed).
struct Daemon {
    child: std::process::Child,
    /// How the CLI reaches it: `--switch NAME` or `--socket PATH`.
    target: [String; 2],
    log: std::path::PathBuf,
    ns: Option<String>,
    dir: Option<std::path::PathBuf>,
}

impl Daemon {
    /// `sluice switch run --config CONF`, its log in `log`, reached by `target`.
    fn spawn(conf: &std::path::Path, log: &std::path::Path, target: [&str; 2]) -> Daemon {
        init(); // (the switch must use the tests' run directory)
        let child = std::process::Command::new(BIN)
            .args(["switch", "run", "--config", conf.to_str().unwrap()])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(log).unwrap())
            .spawn()
            .unwrap();
        Daemon { child, target: target.map(String::from), log: log.into(), ns: None, dir: None }
    }

    /// Switch `name` on datapath `dp`, run from a config of `body` (after its name and
    /// datapath) in a directory of its own; returns once it answers.
    fn from_config(dp: Dp, name: &str, body: &str) -> Daemon {
        let dir = scratch(name);
        let conf = dir.join("s.toml");
        let datapath = if dp == Dp::User { "user" } else { "kernel" };
        std::fs::write(&conf, format!("name = \"{name}\"\ndatapath = \"{datapath}\"\n{body}")).unwrap();
        let mut d = Daemon::spawn(&conf, &dir.join("switch.log"), ["--switch", name]);
        d.dir = Some(dir);
        assert!(d.answers(), "the switch did not start: {}", d.log());
        d
    }

    /// Waits until it answers (at most 10 s).
    fn answers(&self) -> bool {
        wait_for(10, || sluice(&["stats", &self.target[0], &self.target[1]]).status.success())
    }

    /// What it logged so far.
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `sluice stats --json` of it.
    fn stats(&self) -> serde_json::Value {
        serde_json::from_str(&sluice_ok(&["stats", "--json", &self.target[0], &self.target[1]])).unwrap()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        // A clean stop removes a kernel datapath's pins; the kill is for a daemon that hangs.
        let _ = sluice(&["switch", "stop", &self.target[0], &self.target[1]]);
        wait_for(10, || self.child.try_wait().is_ok_and(|s| s.is_some()));
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(ns) = &self.ns {
            let _ = std::process::Command::new("ip").args(["netns", "del", ns]).output();
        }
        if let Some(dir) = &self.dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

#[test]
#[ignore = "system tier: needs root (network namespaces and TAP devices); scripts/test.sh runs it"]
fn grants_decide_which_vlans_a_port_may_join() {
    if !root() {
        return;
    }
    let name = unique("grant");
    let conf = run_dir().join(format!("{name}.toml"));
    std::fs::write(
        &conf,
        format!("name = \"{name}\"\ngrants = true\n\n[[grant]]\nport = \"{name}-a\"\nvlans = [10]\n"),
    )
    .unwrap();
    let ns = format!("sluice-{name}-ns");
    sh_ok(&format!("ip netns add {ns}"));
    let mut d = Daemon::spawn(&conf, &run_dir().join(format!("{name}.log")), ["--switch", &name]);
    d.ns = Some(ns.clone());
    assert!(wait_for(10, || run_dir().join(format!("{name}.sock")).exists()));
    let (a, b) = (format!("{name}-a"), format!("{name}-b"));

    let o = sluice(&["port", "add", &a, "--vlan", "20", "--netns", &ns, "--switch", &name]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("not granted VLAN 20") && err.contains("sluice grant add"), "{err}");
    sluice_ok(&["port", "add", &a, "--vlan", "10", "--netns", &ns, "--switch", &name]);
    let o = sluice(&["grant", "del", &a, "--switch", &name]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("attached"), "a grant in use cannot be revoked: {err}");

    sluice_ok(&["grant", "add", &b, "--vlan", "20", "--switch", &name]);
    let o = sluice(&["port", "add", &b, "--trunk", "20,30", "--netns", &ns, "--switch", &name]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("not granted VLAN 30"), "{err}");
    sluice_ok(&["port", "add", &b, "--trunk", "20", "--netns", &ns, "--switch", &name]);

    let v: serde_json::Value =
        serde_json::from_str(&sluice_ok(&["grant", "list", "--json", "--switch", &name])).unwrap();
    assert_eq!(v["enforced"], true);
    assert_eq!(v["grants"][&a], serde_json::json!([10]));
    assert_eq!(v["grants"][&b], serde_json::json!([20]));
    sluice_ok(&["port", "del", &b, "--switch", &name]);
    sluice_ok(&["grant", "del", &b, "--switch", &name]);
    let v: serde_json::Value =
        serde_json::from_str(&sluice_ok(&["grant", "list", "--json", "--switch", &name])).unwrap();
    assert!(v["grants"].get(&b).is_none(), "{v}");

    // A mirror sees other ports' traffic: it needs promiscuous mode granted as well.
    let m = format!("{name}-m");
    sluice_ok(&["grant", "add", &m, "--vlan", "10", "--switch", &name]);
    let o = sluice(&["port", "add", &m, "--vlan", "10", "--mirror", &a, "--netns", &ns, "--switch", &name]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("promiscuous") && err.contains("--promiscuous"), "{err}");
    sluice_ok(&["grant", "add", &m, "--promiscuous", "--switch", &name]);
    sluice_ok(&["port", "add", &m, "--vlan", "10", "--mirror", &a, "--netns", &ns, "--switch", &name]);
    let v: serde_json::Value =
        serde_json::from_str(&sluice_ok(&["grant", "list", "--json", "--switch", &name])).unwrap();
    assert_eq!(v["promiscuous"], serde_json::json!([m.clone()]), "{v}");
    let o = sluice(&["grant", "del", &m, "--promiscuous", "--switch", &name]);
    assert!(!o.status.success(), "promiscuous mode in use was revoked");
    sluice_ok(&["port", "del", &m, "--switch", &name]);
    sluice_ok(&["grant", "del", &m, "--promiscuous", "--switch", &name]);

    // A restart in place keeps the grants as changed at run time, and attaches the ports
    // added at run time again, checked against them.
    let before = sluice_ok(&["grant", "list", "--json", "--switch", &name]);
    let pid = |name: &str| {
        let v: serde_json::Value = serde_json::from_str(&sluice_ok(&["stats", "--json", "--switch", name])).unwrap();
        (v["switch"]["pid"].as_u64().unwrap(), v["switch"]["started_ns"].as_u64().unwrap())
    };
    let (pid_before, started_before) = pid(&name);
    sluice_ok(&["switch", "restart", "--switch", &name]);
    let (pid_after, started_after) = pid(&name);
    assert!(pid_after == pid_before && started_after != started_before, "restarted in place");
    assert_eq!(sluice_ok(&["grant", "list", "--json", "--switch", &name]), before);
    let ports: serde_json::Value =
        serde_json::from_str(&sluice_ok(&["port", "list", "--json", "--switch", &name])).unwrap();
    let names: Vec<&str> = ports["ports"].as_array().unwrap().iter().map(|p| p["name"].as_str().unwrap()).collect();
    assert_eq!(names, [a.as_str()], "the port added at run time is back: {ports}");
}

#[test]
fn grant_tables_without_grants_on_are_refused() {
    let dir = scratch("grant");
    let f = dir.join("g.toml");
    std::fs::write(&f, "name = \"g\"\n\n[[grant]]\nport = \"t0\"\nvlans = [10]\n").unwrap();
    let o = sluice(&["switch", "run", "--config", f.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains(":3") && err.contains("grants = true"), "{err}");
    std::fs::write(&f, "name = \"g\"\ngrants = true\n\n[[port]]\nname = \"t0\"\nvlan = 10\n").unwrap();
    let o = sluice(&["switch", "run", "--config", f.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains(":4") && err.contains("not granted VLAN 10"), "{err}");
    let _ = std::fs::remove_dir_all(dir);
}

both_datapaths! {
    /// More stations than the MAC table holds: the ones beyond it are counted and logged,
    /// never learned, and everything else keeps flowing.
    #[ignore = "system tier: needs root (network namespaces, TAP devices, and veths with BPF programs for the kernel datapath), ping and python3; scripts/test.sh runs it"]
    fn a_full_mac_table_is_counted_and_logged_and_forwarding_goes_on(dp: Dp) {
        if !root() {
            return;
        }
        let name = unique(if dp == Dp::User { "mfu" } else { "mfk" });
        let d = Daemon::from_config(dp, &name, "mac_table_size = 4\n");
        let lab = Lab::on(dp, "full", &["--switch", &name, "--guests", "2"]);
        ns_ok(&lab.ns(1), &format!("ping -c 2 -W 2 {}", lab.ip4(2)));
        // Twelve stations that do not exist, from guest 1: the table has room for two.
        let frames: Vec<Vec<u8>> =
            (0..12u8).map(|i| frame([0xff; 6], [0x02, 0x66, 0, 0, 0, i], None, 0x88b5, b"who am I")).collect();
        send_raw(&lab.ns(1), &lab.tap(1), &frames);
        let fib = || -> serde_json::Value {
            serde_json::from_str(&sluice_ok(&["fib", "show", "--json", "--switch", &name])).unwrap()
        };
        // The core counts each one it is asked to learn. On the kernel datapath that is only
        // those that went up before the core's verdict for such a frame ("forward it, learn
        // nothing": the table is full) was installed; the kernel forwards the rest itself. How
        // many went up depends on how fast they came, so there only one is certain.
        let least = if dp == Dp::User { 10 } else { 1 };
        assert!(
            wait_for(10, || fib()["summary"]["full_refusals"].as_u64().unwrap_or(0) >= least),
            "{}",
            fib()
        );
        assert_eq!(fib()["summary"]["entries"], 4, "{}", fib());
        assert!(wait_for(10, || d.log().contains("the MAC table is full (4 entries)")), "no log line: {}", d.log());
        // The guests, learned before, still reach each other.
        ns_ok(&lab.ns(2), &format!("ping -c 2 -W 2 {}", lab.ip4(1)));
        let stats = d.stats();
        if dp == Dp::Kernel {
            assert_eq!(stats["kernel"]["map_updates_failed"], 0, "the kernel's table is as large as the core's");
        }
        assert_conserved(&stats);
        drop(lab);
    }
}

/// Mistakes a new user makes get an error that names the fault and what to do (issue 15).
#[test]
#[ignore = "system tier: needs root (network namespaces and TAP devices), setpriv; scripts/test.sh runs it"]
fn common_mistakes_are_named_with_what_to_do() {
    if !root() {
        return;
    }
    let err = |o: std::process::Output| {
        assert!(!o.status.success(), "accepted: {}", String::from_utf8_lossy(&o.stdout));
        String::from_utf8_lossy(&o.stderr).into_owned()
    };
    // An MTU out of range says the range.
    let e = err(sluice(&["lab", "up", "--name", "nomtu", "--mtu", "70000"]));
    assert!(e.contains("MTU 70000 is out of range: use 68 to 9000"), "{e}");
    let e = err(sluice(&["port", "add", "x", "--mtu", "20", "--switch", "none"]));
    assert!(e.contains("use 68 to 9000"), "{e}");
    // Lab verbs without root say so (not "no such lab").
    let as_nobody = |args: &[&str]| {
        std::process::Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", BIN])
            .args(args)
            .env("SLUICE_RUN_DIR", run_dir())
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap()
    };
    let e = err(as_nobody(&["lab", "down", "--name", "lab"]));
    assert!(e.contains("needs root") && e.contains("sudo"), "{e}");
    let e = err(as_nobody(&["lab", "up", "--name", "nobody"]));
    assert!(e.contains("needs root"), "{e}");

    let lab = Lab::up("oops", &["--guests", "1"]);
    // A mirror of a port the switch does not have.
    let e = err(sluice(&["port", "add", &format!("{}-m", lab.name), "--mirror", "nosuch", "--switch", &lab.name]));
    assert!(e.contains("no port \"nosuch\"") && e.contains("sluice port list"), "{e}");
    // A static entry for a group address.
    for (mac, kind) in
        [("01:00:5e:00:00:01", "multicast"), ("ff:ff:ff:ff:ff:ff", "broadcast"), ("00:00:00:00:00:00", "zero")]
    {
        let e = err(sluice(&["fib", "add", mac, &lab.tap(1), "--switch", &lab.name]));
        assert!(e.contains(kind) && e.contains("unicast"), "{e}");
    }
    let fib = sluice_ok(&["fib", "show", "--switch", &lab.name]);
    assert!(!fib.contains("01:00:5e:00:00:01"), "{fib}");
}

/// The control socket (issue 15): a `socket =` path that is not a socket is never removed;
/// a socket a killed switch left is named as such and replaced by the next start; a request
/// without end and a crowd of connections are refused while the switch goes on answering.
#[test]
#[ignore = "system tier: needs root (network namespaces and TAP devices); scripts/test.sh runs it"]
fn the_control_socket_refuses_what_is_not_its_own_and_bounds_its_clients() {
    if !root() {
        return;
    }
    use std::io::{BufRead, Write};
    init();
    let name = unique("csock");
    let dir = scratch(&name);
    let sock = dir.join("ctl.sock");
    let conf = dir.join("s.toml");
    std::fs::write(&conf, format!("name = \"{name}\"\nsocket = \"{}\"\ndatapath = \"user\"\n", sock.display()))
        .unwrap();

    // A regular file where the socket should be: refused, and the file is intact.
    std::fs::write(&sock, b"precious").unwrap();
    let o = sluice(&["switch", "run", "--config", conf.to_str().unwrap()]);
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && e.contains("is a regular file, not a control socket"), "{e}");
    assert_eq!(std::fs::read(&sock).unwrap(), b"precious");
    std::fs::remove_file(&sock).unwrap();

    // A socket nobody listens on any more (its switch was killed).
    drop(std::os::unix::net::UnixListener::bind(&sock).unwrap());
    let o = sluice(&["stats", "--socket", sock.to_str().unwrap()]);
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && e.contains("is gone") && e.contains("sluice switch run"), "{e}");
    let mut d = Daemon::spawn(&conf, &dir.join("switch.log"), ["--socket", sock.to_str().unwrap()]);
    d.dir = Some(dir.clone());
    assert!(d.answers(), "the switch did not start over the stale socket");

    // A request line without end: refused, the connection closed.
    let mut c = std::os::unix::net::UnixStream::connect(&sock).unwrap();
    c.set_read_timeout(Some(std::time::Duration::from_secs(30))).unwrap();
    let chunk = vec![b'x'; 64 * 1024];
    for _ in 0..20 {
        if c.write_all(&chunk).is_err() {
            break; // (closed once the limit was reached)
        }
    }
    let mut answer = String::new();
    let _ = std::io::BufReader::new(&c).read_line(&mut answer);
    assert!(answer.contains("request longer than"), "{answer:?}");
    drop(c);
    assert!(sluice(&["stats", "--socket", sock.to_str().unwrap()]).status.success(), "the switch still answers");

    // More connections than it serves at once: the extra one is told to try again.
    let held: Vec<_> = (0..32).map(|_| std::os::unix::net::UnixStream::connect(&sock).unwrap()).collect();
    let extra = std::os::unix::net::UnixStream::connect(&sock).unwrap();
    extra.set_read_timeout(Some(std::time::Duration::from_secs(30))).unwrap();
    let mut answer = String::new();
    let _ = std::io::BufReader::new(&extra).read_line(&mut answer);
    assert!(answer.contains("already serves 32 control connections"), "{answer:?}");
    drop(held);
    assert!(d.answers(), "the switch answers again once the crowd is gone");
    sluice_ok(&["switch", "stop", "--socket", sock.to_str().unwrap()]);
}

both_datapaths! {
    /// One guest sending from many source addresses gets its share of the MAC table and
    /// no more: the rest are counted on its port, the other guests stay learned, and their
    /// unicast never reaches it (issue 15).
    #[ignore = "system tier: needs root (network namespaces, TAP devices, and veths with BPF programs for the kernel datapath), ping and python3; scripts/test.sh runs it"]
    fn a_port_learns_at_most_its_share_of_the_mac_table(dp: Dp) {
        if !root() {
            return;
        }
        let name = unique(if dp == Dp::User { "mlu" } else { "mlk" });
        let d = Daemon::from_config(dp, &name, "mac_table_size = 64\nmac_limit_per_port = 4\n");
        let lab = Lab::on(dp, "share", &["--switch", &name, "--guests", "3"]);
        // The flooder: 100 source addresses.
        let frames: Vec<Vec<u8>> =
            (0..100u8).map(|i| frame([0xff; 6], [0x02, 0x77, 0, 0, 1, i], None, 0x88b5, b"many")).collect();
        send_raw(&lab.ns(1), &lab.tap(1), &frames);
        let port1 = || -> serde_json::Value {
            d.stats()["ports"].as_array().unwrap().iter().find(|p| p["name"] == lab.tap(1)).unwrap().clone()
        };
        assert!(wait_for(10, || port1()["counters"]["learn_refused"].as_u64().unwrap_or(0) >= 96), "{}", port1());
        // (Its own address may hold one of its four places.)
        // The others are learned as ever, and talk without the flooder hearing them.
        ns_ok(&lab.ns(2), &format!("ping -c 2 -W 2 {}", lab.ip4(3)));
        let fib = sluice_ok(&["fib", "show", "--switch", &name]);
        let m = |g: usize| mac_of(&lab.ns(g), &lab.tap(g)).iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":");
        assert!(fib.contains(&m(2)) && fib.contains(&m(3)), "{fib}");
        let on_1 = fib.lines().filter(|l| l.split_whitespace().nth(2) == Some(lab.tap(1).as_str())).count();
        assert_eq!(on_1, 4, "the flooder's port holds its share, no more: {fib}");
        let l = listen_raw(&lab.ns(1), &lab.tap(1), 0x88b6, 2.0);
        let (m2, m3) = (mac_of(&lab.ns(2), &lab.tap(2)), mac_of(&lab.ns(3), &lab.tap(3)));
        send_raw(&lab.ns(2), &lab.tap(2), &vec![frame(m3, m2, None, 0x88b6, b"private"); 10]);
        assert!(received(l).is_empty(), "the flooder heard another guest's unicast");
        assert_conserved(&d.stats());
        drop(lab);
    }
}

/// TAP guests keep their interfaces when their switch dies (the TAPs are persistent): a
/// restart in place and a `kill -9` followed by a new start adopt them again, and a TCP
/// connection between two guests survives both (retransmits, no reset) with every byte
/// intact; a clean stop and `lab down` then leave no TAP behind (issue 15).
#[test]
#[ignore = "system tier: needs root (network namespaces and TAP devices), nc, iperf3 and python3; scripts/test.sh runs it"]
fn a_tcp_connection_between_tap_guests_survives_a_restart_and_a_kill() {
    if !root() || !have("iperf3") {
        return;
    }
    let lab = Lab::up("tapkeep", &["--guests", "2"]);
    let dir = scratch(&format!("tapkeep-{}", lab.name));
    let ifindex = |g: usize| ns_ok(&lab.ns(g), &format!("cat /sys/class/net/{}/ifindex", lab.tap(g)));
    let before = (ifindex(1), ifindex(2));
    // The restart in place adopts the TAPs in the new image; while no switch runs, the
    // guests keep their interfaces.
    let again = transfers_cross_a_restart_and_a_kill(&lab, &dir, || {
        assert_eq!((ifindex(1), ifindex(2)), before, "the guests' TAPs outlive the switch");
    });
    assert_eq!((ifindex(1), ifindex(2)), before, "the same TAPs, adopted");
    assert_conserved(&lab.settled_stats());
    // A clean stop takes the TAPs with it.
    sluice_ok(&["switch", "stop", "--switch", &lab.name]);
    let _ = again.take().wait();
    for g in [1, 2] {
        assert!(!ns_ok(&lab.ns(g), "ip -o link").contains(&lab.tap(g)), "TAP {} is left", lab.tap(g));
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// After a crash, the next run adopts the TAPs of the ports it still has (the same
/// devices) and deletes those of ports gone from its file; a clean stop deletes the rest.
#[test]
#[ignore = "system tier: needs root (network namespaces and TAP devices); scripts/test.sh runs it"]
fn after_a_crash_the_next_run_adopts_its_taps_and_removes_those_no_port_uses() {
    if !root() {
        return;
    }
    let name = unique("tapleft");
    let ns = format!("sluice-{name}");
    sh_ok(&format!("ip netns add {ns}"));
    let (a, b) = (format!("{name}-a"), format!("{name}-b"));
    let port = |p: &str| format!("[[port]]\nname = \"{p}\"\nnetns = \"{ns}\"\n");
    let mut d = Daemon::from_config(Dp::User, &name, &format!("{}{}", port(&a), port(&b)));
    d.ns = Some(ns.clone());
    let ifindex = |p: &str| ns_sh(&ns, &format!("cat /sys/class/net/{p}/ifindex")).stdout;
    let a_before = ifindex(&a);
    assert!(!a_before.is_empty() && !ifindex(&b).is_empty());
    let _ = d.child.kill();
    let _ = d.child.wait();
    assert_eq!(ifindex(&a), a_before, "the TAPs outlive the switch");
    // The next run's file has port a only.
    let conf = d.dir.as_ref().unwrap().join("s.toml");
    std::fs::write(&conf, format!("name = \"{name}\"\ndatapath = \"user\"\n{}", port(&a))).unwrap();
    let again = Daemon::spawn(&conf, &d.dir.as_ref().unwrap().join("again.log"), ["--switch", &name]);
    assert!(again.answers(), "{}", again.log());
    assert_eq!(ifindex(&a), a_before, "port a adopted its TAP");
    assert!(ifindex(&b).is_empty(), "the TAP of port b, gone from the file, is removed");
    drop(again);
    assert!(ifindex(&a).is_empty(), "a clean stop removes the TAP");
}

/// A control request that arrives a byte at a time is closed 10 s after its first byte
/// (not kept for as long as each byte comes within the idle time), while other clients
/// are served meanwhile.
#[test]
#[ignore = "system tier: needs root (network namespaces and TAP devices); scripts/test.sh runs it"]
fn a_request_that_trickles_in_is_closed_at_its_deadline_while_others_are_served() {
    if !root() {
        return;
    }
    use std::io::{Read, Write};
    use std::time::{Duration, Instant};
    let name = unique("trick");
    let d = Daemon::from_config(Dp::User, &name, "");
    let sock = run_dir().join(format!("{name}.sock"));
    let mut c = std::os::unix::net::UnixStream::connect(&sock).unwrap();
    // A whole request, a byte every half second: 40 bytes take 20 s.
    let req = format!("{:<39}\n", r#"{"cmd":"hello"}"#);
    let started = Instant::now();
    let closed = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (mut w, closed) = (c.try_clone().unwrap(), closed.clone());
        std::thread::spawn(move || {
            for b in req.bytes() {
                if closed.load(std::sync::atomic::Ordering::Relaxed) || w.write_all(&[b]).is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(500));
            }
        })
    };
    // Meanwhile others are answered.
    for _ in 0..3 {
        assert!(sluice(&["port", "list", "--switch", &name]).status.success(), "{}", d.log());
        std::thread::sleep(Duration::from_secs(1));
    }
    c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut answer = String::new();
    let _ = c.read_to_string(&mut answer);
    let took = started.elapsed();
    closed.store(true, std::sync::atomic::Ordering::Relaxed);
    writer.join().unwrap();
    assert!(
        answer.contains("did not arrive whole within 10 s") && !answer.contains("\"ok\":true"),
        "the trickled request was answered or not refused ({took:?}): {answer:?}"
    );
    assert!(took < Duration::from_secs(19), "closed before the request was whole ({took:?})");
    assert!(d.answers(), "the switch answers after");
}

/// A stream port attaches only a peer of root's or the switch's user: a listener another
/// user runs is refused, naming its uid.
#[test]
#[ignore = "system tier: needs root (network namespaces and TAP devices), python3 and setpriv; scripts/test.sh runs it"]
fn a_stream_port_refuses_a_peer_of_another_user() {
    // (Debian's Python: the user `nobody` cannot reach one installed under /root.)
    if !root() || !have("setpriv") || !have("/usr/bin/python3") {
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let name = unique("speer");
    let d = Daemon::from_config(Dp::User, &name, "");
    let dir = scratch(&format!("{name}-peer"));
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let theirs = dir.join("nobody");
    std::fs::create_dir(&theirs).unwrap();
    std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
    let listen = r#"
import socket, sys, time
s = socket.socket(socket.AF_UNIX)
s.bind(sys.argv[1]); s.listen(8); s.settimeout(60)
held = []
end = time.time() + 60
while time.time() < end:
    try:
        held.append(s.accept()[0])
    except OSError:
        break
"#;
    struct Listener(std::process::Child);
    impl Drop for Listener {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let spawn = |path: &std::path::Path, as_nobody: bool| {
        let mut cmd = if as_nobody {
            let mut c = std::process::Command::new("setpriv");
            c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3"]);
            c
        } else {
            std::process::Command::new("/usr/bin/python3")
        };
        let child = cmd.args(["-c", listen]).arg(path).stdin(std::process::Stdio::null()).spawn().unwrap();
        assert!(wait_for(10, || path.exists()), "the listener at {} did not start", path.display());
        Listener(child)
    };
    let at = theirs.join("peer.sock");
    let _nobody = spawn(&at, true);
    let o = sluice(&["port", "add", "s1", "--type", "stream", "--path", at.to_str().unwrap(), "--switch", &name]);
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && e.contains("runs as uid 65534") && e.contains("run the peer as"), "{e}");
    assert!(!sluice_ok(&["port", "list", "--switch", &name]).contains("s1"), "nothing was attached");
    // Root's own listener is attached.
    let mine = dir.join("root.sock");
    let _root = spawn(&mine, false);
    sluice_ok(&["port", "add", "s2", "--type", "stream", "--path", mine.to_str().unwrap(), "--switch", &name]);
    assert!(sluice_ok(&["port", "list", "--switch", &name]).contains("s2"));
    drop(d);
}

/// A datapath that never answers (its thread stopped with ptrace): a request is answered
/// "the datapath is busy" after 10 s, other clients are still read, and SIGTERM ends the
/// process within 30 s anyway.
#[test]
#[ignore = "system tier: needs root (network namespaces and TAP devices); scripts/test.sh runs it"]
fn a_datapath_that_never_answers_makes_requests_busy_and_does_not_keep_the_switch_from_stopping() {
    if !root() {
        return;
    }
    use std::time::{Duration, Instant};
    let name = unique("hung");
    let mut d = Daemon::from_config(Dp::User, &name, "");
    let pid = d.child.id() as i32;
    let tid: i32 = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
        .find(|t| std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == "datapath"))
        .and_then(|t| t.file_name().to_str()?.parse().ok())
        .expect("the daemon's datapath thread");
    // SAFETY: ptrace requests on a thread of our own child; no memory of ours is passed.
    let seized = unsafe {
        libc::ptrace(libc::PTRACE_SEIZE, tid, 0, 0) == 0 && libc::ptrace(libc::PTRACE_INTERRUPT, tid, 0, 0) == 0
    };
    assert!(seized, "ptrace: {}", std::io::Error::last_os_error());
    // On the way out (a failed assertion too): the thread goes on, so the switch can stop.
    struct Detach(i32);
    impl Drop for Detach {
        fn drop(&mut self) {
            // SAFETY: as above; fails harmlessly once the thread is gone.
            unsafe { libc::ptrace(libc::PTRACE_DETACH, self.0, 0, 0) };
        }
    }
    let _detach = Detach(tid);
    // Reaps what the stopped thread reports (it stays stopped until the process ends).
    let reap = || {
        let mut st = 0;
        // SAFETY: waitpid on a thread we trace; `st` is a valid out-pointer.
        unsafe { libc::waitpid(tid, &mut st, libc::__WALL | libc::WNOHANG) };
    };
    /// `sluice ARGS` on a thread, bounded by `secs`: its output, or `None`.
    fn bounded(args: Vec<String>, secs: u64) -> Option<std::process::Output> {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(std::process::Command::new(BIN).args(&args).output());
        });
        rx.recv_timeout(Duration::from_secs(secs)).ok().and_then(Result::ok)
    }
    let args = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let t = Instant::now();
    let o = bounded(args(&["port", "list", "--switch", &name]), 25);
    reap();
    let o = o.expect("`port list` against a datapath that never answers did not return within 25 s");
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && e.contains("the datapath is busy"), "after {:?}: {e}", t.elapsed());
    // SIGTERM: the process ends within 30 s though the datapath never takes the stop.
    sh_ok(&format!("kill -TERM {pid}"));
    let t = Instant::now();
    let ended = wait_for(60, || {
        reap();
        d.child.try_wait().unwrap().is_some()
    });
    assert!(ended, "the switch did not end within 60 s of SIGTERM: {}", d.log());
    assert!(t.elapsed() < Duration::from_secs(45), "{:?}", t.elapsed());
    assert!(d.log().contains("did not stop within 30 s"), "{}", d.log());
    assert!(!run_dir().join(format!("{name}.sock")).exists(), "the control socket is removed");
}

//! sluice as a service: `switch check`, a reload (SIGHUP) that changes ports while a
//! transfer between two other guests goes on, a bad file that changes nothing, the
//! readiness states on a `$NOTIFY_SOCKET` the test listens on, ports added at runtime that
//! survive a stop and a start, and logs fit for a pipe (no colour; JSON on request).

mod common;

use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// A switch daemon of the test's, from a config file in a directory of its own, with a
/// notification socket the test listens on. Stopped (and its namespaces deleted) on drop.
struct Service {
    name: String,
    dir: PathBuf,
    conf: PathBuf,
    child: Option<Child>,
    notify: UnixDatagram,
    netns: Vec<String>,
    starts: usize,
}

impl Service {
    /// Switch `name` with config `body` (after its name line); not started.
    fn new(name: &str, body: &str) -> Service {
        let dir = scratch(name);
        let conf = dir.join("switch.toml");
        std::fs::write(&conf, format!("name = \"{name}\"\n{body}")).unwrap();
        let notify = UnixDatagram::bind(dir.join("notify.sock")).unwrap();
        Service { name: name.into(), dir, conf, child: None, notify, netns: vec![], starts: 0 }
    }

    /// A network namespace of the test's, deleted on drop.
    fn netns(&mut self, short: &str) -> String {
        let ns = format!("sluice-{}-{short}", self.name);
        sh_ok(&format!("ip netns add {ns}"));
        self.netns.push(ns.clone());
        ns_ok(&ns, "ip link set lo up");
        ns
    }

    /// Starts `switch run` with `extra` arguments; returns READY=1's datagram once it
    /// arrived.
    fn start(&mut self, extra: &[&str]) -> String {
        self.start_with(extra, &[])
    }

    /// [`Service::start`], with environment variables `env` too.
    fn start_with(&mut self, extra: &[&str], env: &[(&str, &str)]) -> String {
        self.starts += 1;
        let log = std::fs::File::create(self.log_path()).unwrap();
        let child = Command::new(BIN)
            .args(["switch", "run", "--config", self.conf.to_str().unwrap()])
            .args(extra)
            .envs(env.iter().copied())
            .env("NOTIFY_SOCKET", self.dir.join("notify.sock"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.child = Some(child);
        let ready = self.expect("READY=1", 20);
        assert!(ready.contains(&format!("STATUS=switch {}", self.name)), "{ready}");
        ready
    }

    fn log_path(&self) -> PathBuf {
        self.dir.join(format!("switch-{}.log", self.starts))
    }

    /// What the current run logged so far.
    fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// Waits (at most `secs`) for a notification starting with `first`, skipping STATUS-only
    /// ones; fails on any other state. Returns the whole datagram.
    fn expect(&self, first: &str, secs: u64) -> String {
        let end = Instant::now() + Duration::from_secs(secs);
        let mut buf = [0u8; 4096];
        loop {
            let left = end.saturating_duration_since(Instant::now());
            assert!(!left.is_zero(), "no {first} on NOTIFY_SOCKET within {secs} s; the log:\n{}", self.log());
            self.notify.set_read_timeout(Some(left)).unwrap();
            let Ok(n) = self.notify.recv(&mut buf) else { continue };
            let got = String::from_utf8_lossy(&buf[..n]).into_owned();
            if got.starts_with("STATUS=") {
                continue;
            }
            assert!(got.starts_with(first), "expected {first}, got {got:?}; the log:\n{}", self.log());
            return got;
        }
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    /// SIGHUP: RELOADING=1 (with MONOTONIC_USEC), then READY=1, whose status is returned.
    fn reload(&self) -> String {
        sh_ok(&format!("kill -HUP {}", self.pid()));
        let r = self.expect("RELOADING=1", 10);
        assert!(r.contains("\nMONOTONIC_USEC="), "{r}");
        self.expect("READY=1", 30)
    }

    /// `switch stop`: STOPPING=1 arrives and the process ends.
    fn stop(&mut self) {
        sluice_ok(&["switch", "stop", "--switch", &self.name]);
        self.expect("STOPPING=1", 10);
        let mut c = self.child.take().unwrap();
        assert!(wait_for(10, || c.try_wait().is_ok_and(|s| s.is_some())), "the switch did not exit");
    }

    /// SIGTERM: STOPPING=1 arrives once, and the process ends.
    fn terminate(&mut self) {
        sh_ok(&format!("kill -TERM {}", self.pid()));
        self.expect("STOPPING=1", 10);
        let mut c = self.child.take().unwrap();
        assert!(wait_for(10, || c.try_wait().is_ok_and(|s| s.is_some())), "the switch did not exit");
        // (It has exited: whatever it sent is queued here already.)
        self.notify.set_nonblocking(true).unwrap();
        let mut buf = [0u8; 4096];
        while let Ok(n) = self.notify.recv(&mut buf) {
            let got = String::from_utf8_lossy(&buf[..n]);
            assert!(got.starts_with("STATUS="), "after STOPPING=1: {got:?}");
        }
        self.notify.set_nonblocking(false).unwrap();
    }

    /// `port list --json`: (name, VLAN) of each port.
    fn ports(&self) -> Vec<(String, String)> {
        let v: serde_json::Value =
            serde_json::from_str(&sluice_ok(&["port", "list", "--json", "--switch", &self.name])).unwrap();
        v["ports"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| (p["name"].as_str().unwrap().to_string(), p["vlan"].as_str().unwrap().to_string()))
            .collect()
    }

    fn has_port(&self, port: &str) -> bool {
        self.ports().iter().any(|p| p.0 == port)
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = sluice(&["switch", "stop", "--switch", &self.name]);
            wait_for(10, || c.try_wait().is_ok_and(|s| s.is_some()));
            let _ = c.kill();
            let _ = c.wait();
        }
        for ns in &self.netns {
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
        }
        let _ = std::fs::remove_file(run_dir().join("state").join(format!("{}.ports.json", self.name)));
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A `[[port]]` table: a TAP named `name` in namespace `ns`, with `extra` lines.
fn tap(name: &str, ns: &str, extra: &str) -> String {
    format!("[[port]]\nname = \"{name}\"\nnetns = \"{ns}\"\n{extra}")
}

/// Gives the TAP `dev` in `ns` address `ip`/24 and brings it up.
fn address(ns: &str, dev: &str, ip: &str) {
    ns_ok(ns, &format!("ip addr add {ip}/24 dev {dev} && ip link set {dev} up"));
}

#[test]
fn switch_check_takes_a_good_file_and_names_the_line_of_a_bad_one() {
    let dir = scratch("check");
    let good = dir.join("good.toml");
    std::fs::write(
        &good,
        "name = \"chk\"\nmac_aging = 60\n[[port]]\nname = \"t0\"\n[[port]]\nname = \"t1\"\nvlan = 10\n",
    )
    .unwrap();
    let o = sluice(&["switch", "check", good.to_str().unwrap()]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{out}{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(out.lines().count(), 1, "one line: {out}");
    assert!(out.contains("ok") && out.contains("switch chk") && out.contains("2 ports"), "{out}");
    // A bad value on line 6: exit 1, the file and the line named, and what to use.
    let bad = dir.join("bad.toml");
    std::fs::write(&bad, "name = \"chk\"\n[[port]]\nname = \"t0\"\n[[port]]\nname = \"t1\"\nvlan = 4095\n").unwrap();
    let o = sluice(&["switch", "check", bad.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains(&format!("{}:", bad.display())) && err.contains("4095"), "{err}");
    assert!(o.stdout.is_empty());
    // A MAC entry naming a port the file does not have.
    std::fs::write(
        &bad,
        "name = \"chk\"\n[[port]]\nname = \"t0\"\n[[mac]]\nmac = \"02:00:00:00:00:01\"\nport = \"t9\"\n",
    )
    .unwrap();
    let o = sluice(&["switch", "check", bad.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains(&format!("{}:4", bad.display())) && err.contains("t9"), "{err}");
    // A file that is not there.
    let o = sluice(&["switch", "check", dir.join("missing.toml").to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    let _ = std::fs::remove_dir_all(dir);
}

both_datapaths! {
    /// The tentpole: two guests move a fixed number of bytes through the switch with iperf3
    /// while SIGHUP applies a file in which one port is gone, one changed VLAN and one is new;
    /// the transfer ends whole (no reset), the new port forwards, the gone one is gone. A bad
    /// file on the next SIGHUP changes nothing and the switch keeps running; READY, RELOADING
    /// and STOPPING arrive on the notification socket. On the kernel datapath the guests are on
    /// veth pairs.
    #[ignore = "system tier: needs root (network namespaces, TAP devices, and veths with BPF programs for the kernel datapath), iperf3, ping; scripts/test.sh runs it"]
    fn a_reload_under_iperf3_changes_the_ports_the_file_changed_and_nothing_else(dp: Dp) {
        if !root() || !have("iperf3") || !have("ping") {
            return;
        }
        let name = unique(if dp == Dp::User { "svcrl" } else { "svcrk" });
        let mut s = Service::new(&name, "");
        let (g1, g2, gx, ge) = (s.netns("g1"), s.netns("g2"), s.netns("x"), s.netns("e"));
        let [a, b, c, d, e] = ["a", "b", "c", "d", "e"].map(|p| format!("{name}-{p}"));
        let datapath = if dp == Dp::User { "user" } else { "kernel" };
        // A guest's port: a TAP the switch makes in the namespace, or a veth pair made
        // here whose other end is there.
        let table = |p: &str, ns: &str, extra: &str| match dp {
            Dp::User => tap(p, ns, extra),
            Dp::Kernel => format!("[[port]]\nname = \"{p}\"\ntype = \"veth\"\n{extra}"),
        };
        if dp == Dp::Kernel {
            for (p, ns) in [(&a, &g1), (&b, &g2), (&c, &gx), (&d, &gx), (&e, &ge)] {
                sh_ok(&format!("ip link add {p} type veth peer name {p} netns {ns} && ip -n {ns} link set {p} up"));
            }
        }
        let (pa, pb, pc) = (table(&a, &g1, ""), table(&b, &g2, ""), table(&c, &gx, ""));
        let (pd, pd20, pe) = (table(&d, &gx, ""), table(&d, &gx, "vlan = 20\n"), table(&e, &ge, ""));
        let base = format!("name = \"{name}\"\ndatapath = \"{datapath}\"\n{pa}{pb}{pc}{pd}");
        std::fs::write(&s.conf, &base).unwrap();
        s.start(&[]);
        address(&g1, &a, "10.78.0.1");
        address(&g2, &b, "10.78.0.2");
        assert_eq!(s.ports().len(), 4);

        // A transfer of a known size, paced so that it spans the reload.
        const BYTES: u64 = 120 << 20;
        let server = ns_spawn(&g2, "timeout 60 iperf3 -s -1");
        assert!(wait_for(10, || ns_sh(&g2, "ss -ltn | grep -q :5201").status.success()), "iperf3 -s did not listen");
        let client = ns_spawn(&g1, &format!("timeout 60 iperf3 -c 10.78.0.2 -n {BYTES} -b 250M -J"));
        // (Until the transfer is under way: a's first mebibyte has crossed the switch.)
        let crossed = || -> u64 {
            let v: serde_json::Value =
                serde_json::from_str(&sluice_ok(&["stats", "--json", "--switch", &name])).unwrap();
            v["ports"].as_array().unwrap().iter().find(|p| p["name"] == a.as_str()).unwrap()["counters"]["rx_bytes"]
                .as_u64()
                .unwrap_or(0)
        };
        assert!(wait_for(20, || crossed() >= 1 << 20), "the transfer did not start: {}", s.log());

        // c gone, d on VLAN 20, e new (in a namespace of its own, VLAN 1 as a and b).
        let new = format!("name = \"{name}\"\ndatapath = \"{datapath}\"\nmac_aging = 120\n{pa}{pb}{pd20}{pe}");
        std::fs::write(&s.conf, &new).unwrap();
        let status = s.reload();
        assert!(status.contains("reloaded (") && !status.contains("failed"), "{status}\n{}", s.log());

        let out = client.wait_with_output().unwrap();
        let _ = server.wait_with_output();
        assert!(
            out.status.success(),
            "iperf3 failed across the reload: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert!(v["error"].is_null(), "{}", v["error"]);
        // Every byte asked for was sent over one connection that was never reset (iperf3
        // exits 0); the server's count is taken when the client stops, with the last buffer
        // possibly still in flight.
        let sent = v["end"]["sum_sent"]["bytes"].as_u64().unwrap();
        let received = v["end"]["sum_received"]["bytes"].as_u64().unwrap();
        assert!(sent >= BYTES, "the transfer sent {sent} of {BYTES} bytes");
        assert!(received + (1 << 20) >= BYTES, "the server counted {received} of {BYTES} bytes");

        let ports = s.ports();
        assert!(!ports.iter().any(|p| p.0 == c), "port c, gone from the file, is gone: {ports:?}");
        assert!(ports.iter().any(|p| p.0 == d && p.1 == "access 20"), "port d is on VLAN 20 now: {ports:?}");
        assert!(ports.iter().any(|p| p.0 == a && p.1 == "access 1"), "{ports:?}");
        if dp == Dp::User {
            assert!(!ns_ok(&gx, "ip -o link").contains(&c), "port c's TAP is gone");
        }
        address(&ge, &e, "10.78.0.5");
        assert!(
            wait_for(10, || ns_sh(&g1, "ping -c 1 -W 1 10.78.0.5").status.success()),
            "the port the file added forwards: {}",
            s.log()
        );
        let fib: serde_json::Value =
            serde_json::from_str(&sluice_ok(&["fib", "show", "--json", "--switch", &name])).unwrap();
        assert_eq!(fib["summary"]["aging_s"], 120, "the MAC aging time changed live");

        // A bad file: refused with its line, nothing changes, the switch goes on.
        std::fs::write(&s.conf, format!("{new}[[port]]\nname = \"{name}-f\"\nvlan = 5000\n")).unwrap();
        let status = s.reload();
        assert!(status.contains("reload refused") && status.contains(&format!("{}:", s.conf.display())), "{status}");
        assert!(s.log().contains("reload refused, the switch is unchanged"), "{}", s.log());
        assert_eq!(s.ports(), ports, "a bad file changes nothing");
        assert!(ns_sh(&g1, "ping -c 1 -W 2 10.78.0.2").status.success(), "the switch still forwards");
        // A setting that cannot change live is named and kept.
        std::fs::write(&s.conf, new.replace("mac_aging = 120\n", "mac_aging = 120\nqueue_len = 512\n")).unwrap();
        let status = s.reload();
        assert!(status.contains("reloaded (0 changes)"), "{status}");
        assert!(s.log().contains("queue_len (256 now, 512 in the file) cannot change while the switch runs"), "{}", s.log());
        s.stop();
    }
}

/// A port added with `sluice port add` is kept in the state directory and attached again
/// by the next start (after a clean stop, as after a reboot); a reload leaves it alone;
/// `port del` forgets it.
#[test]
#[ignore = "system tier: needs root (network namespaces and TAP devices), ping; scripts/test.sh runs it"]
fn ports_added_at_runtime_survive_a_reload_a_stop_and_a_start() {
    if !root() || !have("ping") {
        return;
    }
    let name = unique("svcpk");
    let mut s = Service::new(&name, "");
    let (g1, g2) = (s.netns("g1"), s.netns("g2"));
    let (a, r) = (format!("{name}-a"), format!("{name}-r"));
    std::fs::write(&s.conf, format!("name = \"{name}\"\n{}", tap(&a, &g1, ""))).unwrap();
    s.start(&[]);
    sluice_ok(&["port", "add", &r, "--netns", &g2, "--vlan", "1", "--switch", &name]);
    sluice_ok(&["fib", "add", "02:00:00:00:00:77", &r, "--switch", &name]);
    let kept = run_dir().join("state").join(format!("{name}.ports.json"));
    let mode = std::fs::metadata(&kept).map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o777);
    assert_eq!(mode.ok(), Some(0o600), "{}", kept.display());
    let dir_mode = std::fs::metadata(kept.parent().unwrap()).unwrap();
    assert_eq!(std::os::unix::fs::PermissionsExt::mode(&dir_mode.permissions()) & 0o777, 0o700);

    // A reload of an unchanged file (asked with `switch reload`) leaves the runtime port
    // alone.
    let said = sluice_ok(&["switch", "reload", "--switch", &name]);
    assert!(said.contains(&format!("pid {}", s.pid())), "{said}");
    s.expect("RELOADING=1", 10);
    let status = s.expect("READY=1", 30);
    assert!(status.contains("reloaded (0 changes)"), "{status}");
    assert!(s.has_port(&r));

    s.stop();
    assert!(kept.exists(), "a clean stop keeps the runtime additions");
    s.start(&[]);
    assert!(s.has_port(&r), "the runtime port is attached again: {}", s.log());
    let fib = sluice_ok(&["fib", "show", "--switch", &name]);
    assert!(fib.contains("02:00:00:00:00:77"), "its static MAC too: {fib}");
    address(&g1, &a, "10.79.0.1");
    address(&g2, &r, "10.79.0.2");
    assert!(
        wait_for(10, || ns_sh(&g1, "ping -c 1 -W 1 10.79.0.2").status.success()),
        "the port forwards again: {}",
        s.log()
    );
    sluice_ok(&["port", "del", &r, "--switch", &name]);
    s.stop();
    s.start(&[]);
    assert!(!s.has_port(&r), "`port del` forgot it");

    // After a reboot a guest's namespace may not be there yet: its port waits, recorded,
    // and `port del` forgets it.
    let gone = s.netns("gone");
    let w = format!("{name}-w");
    sluice_ok(&["port", "add", &w, "--netns", &gone, "--switch", &name]);
    s.stop();
    sh_ok(&format!("ip netns del {gone}"));
    let ready = s.start(&[]);
    assert!(ready.contains("1 added at runtime waiting to be attached again"), "{ready}");
    assert!(!s.has_port(&w));
    assert!(s.log().contains("not attaching again a port added at runtime"), "{}", s.log());
    assert!(std::fs::read_to_string(&kept).unwrap().contains(&w), "it stays recorded");
    sluice_ok(&["port", "del", &w, "--switch", &name]);
    assert!(!kept.exists(), "`port del` forgot the waiting port, the last one kept: no file is left");
    s.stop();
}

/// Logs to a pipe or a file carry no terminal escapes; `--log-format json` (or
/// SLUICE_LOG_FORMAT=json) makes every line a JSON object. (Each switch here is stopped
/// with SIGTERM, which says STOPPING=1 once.)
#[test]
#[ignore = "system tier: needs root (a switch daemon with its control socket in the tests' run directory); scripts/test.sh runs it"]
fn logs_are_plain_when_piped_and_json_lines_on_request() {
    if !root() {
        return;
    }
    let run = |name: &str, args: &[&str], env: &[(&str, &str)]| -> String {
        let mut s = Service::new(name, "");
        s.start_with(args, env);
        s.terminate();
        s.log()
    };
    let plain = run(&unique("svclp"), &[], &[]);
    assert!(plain.contains("switch started") && !plain.contains('\u{1b}'), "{plain:?}");
    for text in [
        run(&unique("svclj"), &["--log-format", "json"], &[]),
        run(&unique("svcle"), &[], &[("SLUICE_LOG_FORMAT", "json")]),
    ] {
        assert!(text.contains("switch started"), "{text}");
        for line in text.lines() {
            let v: serde_json::Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line:?}"));
            assert!(v["level"].is_string() && v["fields"]["message"].is_string(), "{line}");
        }
    }
}

/// The unit file says what docs/service.md and the daemon rely on.
#[test]
fn the_systemd_unit_names_what_the_daemon_uses() {
    let unit = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../dist/systemd/sluice@.service");
    let text = std::fs::read_to_string(&unit).unwrap();
    for want in [
        "Type=notify",
        "ExecStart=/usr/bin/sluice switch run --config /etc/sluice/%i.toml",
        "ExecReload=/bin/kill -HUP $MAINPID",
        "StateDirectory=sluice",
        "RuntimeDirectory=sluice",
        "RuntimeDirectoryPreserve=yes",
        "Restart=on-failure",
    ] {
        assert!(text.lines().any(|l| l == want), "{} lacks {want:?}", unit.display());
    }
    // The run and state directories it names are the ones the binary uses by default.
    assert!(text.contains("/run/sluice") && text.contains("/var/lib/sluice"));
}

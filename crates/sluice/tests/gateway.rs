//! A switch's gateway (`gateway = "10.77.0.254/24"`) with the real dnsmasq, on both
//! datapaths: a guest namespace gets its address by DHCP with busybox's udhcpc, reaches a
//! LAN host behind the uplink, which sees the masqueraded source; dnsmasq killed is started
//! again and counted in `sluice status`; a stop leaves no dnsmasq, no nftables table and no
//! file in the run directory. The switch runs in a namespace of the test's own (standing for
//! the host), so forwarding and the table are that namespace's, never the machine's.

mod common;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use common::*;
use serde_json::Value;

use sluice_lab::host::UDHCPC_SCRIPT;

/// What one test made: namespaces, the daemon, its state directory; all removed on drop.
struct Setup {
    host: String,
    guest: String,
    lan: String,
    switch: String,
    socket: PathBuf,
    daemon: Option<Child>,
    state: PathBuf,
    log: PathBuf,
}

impl Drop for Setup {
    fn drop(&mut self) {
        if let Some(mut d) = self.daemon.take() {
            let _ = Command::new(BIN).args(["switch", "stop", "--socket"]).arg(&self.socket).output();
            if !wait_for(15, || d.try_wait().is_ok_and(|s| s.is_some())) {
                let _ = d.kill();
                let _ = d.wait();
            }
        }
        for ns in [&self.guest, &self.lan, &self.host] {
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
        }
        let _ = std::fs::remove_dir_all(&self.state);
    }
}

impl Setup {
    /// The host namespace with a LAN namespace behind its `lanup` veth (192.168.251.1/24 here,
    /// .2 there), a guest namespace, and the switch running in the host namespace with
    /// gateway 10.77.0.254/24 masqueraded out of `lanup`.
    fn start(dp: Dp, tag: &str) -> Setup {
        let id = std::process::id() % 100_000;
        let k = if dp == Dp::Kernel { "k" } else { "u" };
        let switch = format!("gw{k}{tag}{id}");
        let s = Setup {
            host: format!("sluice-{switch}-h"),
            guest: format!("sluice-{switch}-g"),
            lan: format!("sluice-{switch}-l"),
            socket: run_dir().join(format!("{switch}.sock")),
            daemon: None,
            state: mkdtemp("sluice-gw-state"),
            log: scratch(&switch).join("daemon.log"),
            switch,
        };
        for ns in [&s.host, &s.guest, &s.lan] {
            sh_ok(&format!("ip netns add {ns}"));
            ns_ok(ns, "ip link set lo up");
        }
        sh_ok(&format!("ip -n {} link add lanup type veth peer name eth0 netns {}", s.host, s.lan));
        ns_ok(&s.host, "ip addr add 192.168.251.1/24 dev lanup && ip link set lanup up");
        ns_ok(&s.lan, "ip addr add 192.168.251.2/24 dev eth0 && ip link set eth0 up");
        let port_type = if dp == Dp::Kernel { "veth" } else { "tap" };
        let conf = scratch(&s.switch).join("sw.toml");
        std::fs::write(
            &conf,
            format!(
                "name = \"{}\"\ndatapath = \"{}\"\ngateway = \"10.77.0.254/24\"\ngateway_uplink = \"lanup\"\n\n[[port]]\nname = \"{}-g\"\ntype = \"{port_type}\"\nnetns = \"{}\"\n",
                s.switch,
                if dp == Dp::Kernel { "kernel" } else { "user" },
                s.switch,
                s.guest
            ),
        )
        .unwrap();
        let log = std::fs::File::create(&s.log).unwrap();
        let mut s = s;
        s.daemon = Some(
            Command::new("ip")
                .args(["netns", "exec", &s.host, BIN, "switch", "run", "--config"])
                .arg(&conf)
                .env("SLUICE_STATE_DIR", &s.state)
                .stdin(Stdio::null())
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .unwrap(),
        );
        let up = wait_for(20, || s.status().is_some_and(|v| v["gateway"]["dnsmasq"] == "running"));
        assert!(up, "the switch with a gateway did not answer with dnsmasq running within 20 s: {}", s.log_text());
        s
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `sluice status --json`, once it answers.
    fn status(&self) -> Option<Value> {
        let socket = self.socket.to_str().unwrap();
        let o = sluice(&["status", "--json", "--socket", socket]);
        o.status.success().then(|| serde_json::from_slice(&o.stdout).unwrap())
    }

    /// dnsmasq processes whose command line names this switch's configuration.
    fn dnsmasqs(&self) -> Vec<u32> {
        let conf = format!("--conf-file={}", run_dir().join(&self.switch).join("gateway/dnsmasq.conf").display());
        std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
            .filter(|pid| {
                let c = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
                c.split(|&b| b == 0).any(|a| a == conf.as_bytes())
            })
            .collect()
    }
}

/// Runs udhcpc in `ns` on `ifname` with a script written into a directory of the test's
/// own; returns the address it got.
fn dhcp(ns: &str, ifname: &str) -> String {
    let dir = mkdtemp("sluice-udhcpc");
    let script = dir.join("script");
    std::fs::write(&script, UDHCPC_SCRIPT).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o700)).unwrap();
    let out = ns_sh(ns, &format!("busybox udhcpc -i {ifname} -q -n -t 10 -T 1 -s {}", script.display()));
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        out.status.success(),
        "udhcpc in {ns} got no lease: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let addrs = ns_ok(ns, &format!("ip -4 -o addr show dev {ifname}"));
    let a = addrs.split_whitespace().skip_while(|w| *w != "inet").nth(1).unwrap_or_default().to_string();
    assert!(a.starts_with("10.77.0.") && a.ends_with("/24"), "{a:?} from {addrs}");
    a
}

both_datapaths! {
    #[ignore = "system tier: needs root (network namespaces, TAPs, veths, nftables), dnsmasq (dnsmasq-base), busybox and socat; scripts/test.sh runs it"]
    fn a_guest_gets_an_address_by_dhcp_reaches_the_lan_masqueraded_and_dnsmasq_is_supervised(dp: Dp) {
        if !root() || !have("/usr/sbin/dnsmasq") || !have("busybox") || !have("nft") || !have("socat") {
            return;
        }
        let mut s = Setup::start(dp, "a");
        let ifname = format!("{}-g", s.switch);
        let addr = dhcp(&s.guest, &ifname);
        let route = ns_ok(&s.guest, "ip route show default");
        assert!(route.contains("via 10.77.0.254"), "{route}");
        // The LAN host sees the host's uplink address, not the guest's.
        let mut listener = ns_spawn(&s.lan, "timeout 20 socat -u TCP-LISTEN:7777,reuseaddr SYSTEM:'echo $SOCAT_PEERADDR'");
        let sent = wait_for(10, || ns_sh(&s.guest, "echo hi | timeout 3 socat -u - TCP:192.168.251.2:7777").status.success());
        assert!(sent, "the guest did not reach the LAN host through the gateway: {}", s.log_text());
        let _ = listener.wait();
        let mut seen = String::new();
        std::io::Read::read_to_string(listener.stdout.as_mut().unwrap(), &mut seen).unwrap();
        assert_eq!(seen.trim(), "192.168.251.1", "the LAN host saw {seen:?}, the guest is {addr}");
        let table = ns_ok(&s.host, &format!("nft list table ip sluice-gw-{}", s.switch));
        assert!(table.contains("oifname \"lanup\" masquerade"), "{table}");

        // dnsmasq killed: started again within its back-off (1 s), counted.
        let st = s.status().unwrap();
        let pid = st["gateway"]["pid"].as_u64().expect("dnsmasq's pid in status");
        assert_eq!(st["gateway"]["restarts"], 0, "{st}");
        sh_ok(&format!("kill -9 {pid}"));
        let back = wait_for(15, || {
            s.status().is_some_and(|v| {
                v["gateway"]["dnsmasq"] == "running" && v["gateway"]["restarts"] == 1 && v["gateway"]["pid"] != pid
            })
        });
        assert!(back, "dnsmasq was not started again within 15 s: {:?}\n{}", s.status(), s.log_text());
        let st = s.status().unwrap();
        assert!(st["gateway"]["last_exit"].as_str().unwrap().contains("SIGKILL"), "{st}");
        let text = sluice_ok(&["status", "--socket", s.socket.to_str().unwrap()]);
        assert!(text.contains("10.77.0.254/24") && text.contains("1 restarts"), "{text}");
        assert!(s.log_text().contains("dnsmasq: dnsmasq"), "dnsmasq's stderr is in the daemon's log");
        // A lease from the new dnsmasq too.
        dhcp(&s.guest, &ifname);

        // Stop: no dnsmasq, no table, no file of the gateway's in the run directory.
        let conf_dir = run_dir().join(&s.switch);
        assert!(conf_dir.join("gateway/dnsmasq.conf").is_file());
        sluice_ok(&["switch", "stop", "--socket", s.socket.to_str().unwrap()]);
        let mut d = s.daemon.take().unwrap();
        assert!(wait_for(15, || d.try_wait().is_ok_and(|x| x.is_some())), "the daemon did not exit within 15 s of the stop");
        assert!(s.dnsmasqs().is_empty(), "dnsmasq left running: {:?}", s.dnsmasqs());
        let tables = ns_ok(&s.host, "nft list tables");
        assert!(!tables.contains("sluice-gw"), "{tables}");
        assert!(!conf_dir.exists(), "{} left", conf_dir.display());
        assert!(s.state.join(format!("{}.leases", s.switch)).is_file(), "the leases are kept in the state directory");
    }
}

#[test]
fn a_bad_gateway_names_its_line() {
    let dir = scratch("gateway-check");
    let file = dir.join("bad.toml");
    std::fs::write(&file, "name = \"sw0\"\n\ngateway = \"10.77.0.0/24\"\n").unwrap();
    let o = sluice(&["switch", "check", file.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(err.contains("bad.toml:3:") && err.contains("network or broadcast"), "{err}");
    std::fs::write(&file, "name = \"sw0\"\ngateway_uplink = \"eth0\"\n").unwrap();
    let o = sluice(&["switch", "check", file.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("bad.toml:2:") && err.contains("needs gateway"), "{err}");
}

/// Puts `net.ipv4.ip_forward` of the test's namespace back as it found it (the lab's
/// switch runs there and sets it, as libvirt does).
struct Forwarding(String);

impl Drop for Forwarding {
    fn drop(&mut self) {
        let _ = std::fs::write("/proc/sys/net/ipv4/ip_forward", &self.0);
    }
}

#[test]
#[ignore = "system tier: needs root (network namespaces, TAPs, nftables), dnsmasq (dnsmasq-base) and busybox; scripts/test.sh runs it"]
fn a_lab_with_a_gateway_gives_its_guests_addresses_by_dhcp() {
    if !root() || !have("/usr/sbin/dnsmasq") || !have("busybox") || !have("nft") {
        return;
    }
    let _forwarding = Forwarding(std::fs::read_to_string("/proc/sys/net/ipv4/ip_forward").unwrap());
    let lab = Lab::up("gwlab", &["--guests", "2", "--gateway"]);
    assert_eq!(lab.state["gateway"], "10.77.0.254/24", "{}", lab.state);
    for g in 1..=2 {
        let a = lab.state["guests"][g - 1]["ipv4"].as_str().unwrap();
        let last: u32 = a.trim_start_matches("10.77.0.").trim_end_matches("/24").parse().unwrap();
        assert!((100..=199).contains(&last), "guest {g} has {a}, not an address of the DHCP range");
        let have = ns_ok(&lab.ns(g), "ip -4 -o addr");
        assert!(have.contains(a), "{have}");
        ns_ok(&lab.ns(g), "ping -c 1 -W 2 10.77.0.254");
    }
    let text = sluice_ok(&["lab", "list"]);
    assert!(text.contains("gateway") && text.contains("10.77.0.254/24"), "{text}");
    let st: Value = serde_json::from_str(&sluice_ok(&["status", "--json", "--switch", &lab.name])).unwrap();
    assert_eq!(st["gateway"]["dnsmasq"], "running", "{st}");
}

//! VXLAN tunnel ports (issue 18): sluice switches on different "hosts" (network
//! namespaces joined by an underlay bridge) form one LAN with each other and with a host
//! whose tunnel is the kernel's own `vxlan` device and a Linux bridge — real kernel stacks
//! at both ends, bytes checked, learning checked on both sides. And what a host on the
//! underlay cannot do: a sender not among a tunnel's remotes is neither heard nor sent to,
//! a remote cannot take a locked local station, and one GSO send in a guest cannot leave
//! as more datagrams than the flood budget; on the user-space datapath, a flood from such
//! a sender is dropped in the kernel (the tunnel socket's filter) and never read by the
//! switch.

mod common;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use common::*;

/// Hosts on one underlay: each host a namespace with an underlay address
/// (192.168.77.N/24, fd78::N/64), each with one guest namespace on 10.78.0.N/24,
/// fd79::N/64 behind either a sluice switch or a kernel vxlan device and bridge. Everything
/// is removed on drop.
struct Hosts {
    tag: String,
    namespaces: Vec<String>,
    switches: Vec<(String, Child)>,
    dir: PathBuf,
    /// Open vSwitch run directories of OVS hosts (their daemons are stopped on drop).
    ovs: Vec<PathBuf>,
    /// The sluice hosts run the kernel datapath (guests on veth pairs, the tunnel a vxlan
    /// device fed by the programs); else the user-space one (guests on TAPs, the tunnel a
    /// UDP socket).
    kernel: bool,
}

const VNI: u32 = 5000;

impl Hosts {
    fn new(name: &str, kernel: bool) -> Hosts {
        init();
        let tag = unique(name);
        let dir = mkdtemp(&format!("sluice-vxlan-{tag}-"));
        let mut h = Hosts { tag, namespaces: vec![], switches: vec![], dir, ovs: vec![], kernel };
        let ul = h.ns("ul");
        h.add_ns(&ul);
        ns_ok(&ul, "ip link add br0 type bridge stp_state 0 forward_delay 0 && ip link set br0 up");
        h
    }

    fn ns(&self, role: &str) -> String {
        format!("{}{role}", self.tag)
    }

    fn add_ns(&mut self, ns: &str) {
        sh_ok(&format!("ip netns add {ns} && ip -n {ns} link set lo up"));
        self.namespaces.push(ns.into());
        ns_ok(ns, "sysctl -qw net.ipv6.conf.all.accept_dad=0 net.ipv6.conf.default.accept_dad=0");
    }

    /// Host `i`'s namespace, joined to the underlay (checksums filled in software on its
    /// underlay interface, as a NIC fills them: a veth leaves them to the receiver, and a
    /// user-space tunnel endpoint reads the bytes as they are).
    fn host(&mut self, i: u8) -> String {
        let (h, ul) = (self.ns(&format!("h{i}")), self.ns("ul"));
        self.add_ns(&h);
        sh_ok(&format!("ip -n {ul} link add u{i} type veth peer name u0 netns {h}"));
        sh_ok(&format!("ip -n {ul} link set u{i} master br0 up"));
        ns_ok(
            &h,
            &format!(
                "ip addr add 192.168.77.{i}/24 dev u0 && ip addr add fd78::{i}/64 dev u0 nodad && ip link set u0 up && ethtool -K u0 tx off >/dev/null"
            ),
        );
        h
    }

    fn guest(&self, i: u8) -> String {
        self.ns(&format!("g{i}"))
    }

    fn address_guest(&self, i: u8, dev: &str, mtu: u16) {
        ns_ok(
            &self.guest(i),
            &format!(
                "ip link set {dev} mtu {mtu} up && ip addr add 10.78.0.{i}/24 dev {dev} && ip addr add fd79::{i}/64 dev {dev} nodad"
            ),
        );
    }

    /// Host `i` runs a sluice switch: guest `i` on a TAP, a vxlan port to `remotes` over
    /// the IPv4 underlay, one VNI for the port.
    fn sluice_host(&mut self, i: u8, remotes: &[u8]) {
        let r: Vec<String> = remotes.iter().map(|r| format!("192.168.77.{r}")).collect();
        self.sluice_host_with(i, &format!("192.168.77.{i}"), &r, "", &format!("vni = {VNI}"), 1450);
    }

    /// Host `i` runs a sluice switch: guest `i` on a TAP or (kernel datapath) a veth pair,
    /// both ends named `SWITCHt` (with `guest_port` settings and `mtu`), a vxlan port bound
    /// to `local`, to `remotes`, with `tunnel` settings.
    fn sluice_host_with(&mut self, i: u8, local: &str, remotes: &[String], guest_port: &str, tunnel: &str, mtu: u16) {
        let h = self.host(i);
        let g = self.guest(i);
        self.add_ns(&g);
        let name = format!("{}s{i}", self.tag);
        let remotes: Vec<String> = remotes.iter().map(|r| format!("\"{r}\"")).collect();
        let cfg = self.dir.join(format!("{name}.toml"));
        let (datapath, guest) = if self.kernel {
            sh_ok(&format!("ip link add {name}t type veth peer name {name}t netns {g}"));
            ("kernel", "type = \"veth\"".to_string())
        } else {
            ("user", format!("netns = \"{g}\""))
        };
        std::fs::write(
            &cfg,
            format!(
                "name = \"{name}\"\ndatapath = \"{datapath}\"\n[[port]]\nname = \"{name}t\"\n{guest}\nmtu = {mtu}\n{guest_port}\n[[port]]\nname = \"vx0\"\ntype = \"vxlan\"\nnetns = \"{h}\"\nlocal = \"{local}\"\nremotes = [{}]\n{tunnel}\n",
                remotes.join(", ")
            ),
        )
        .unwrap();
        let log = std::fs::File::create(self.dir.join(format!("{name}.log"))).unwrap();
        let child = Command::new(BIN)
            .args(["switch", "run", "--config", cfg.to_str().unwrap()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.switches.push((name.clone(), child));
        let sock = run_dir().join(format!("{name}.sock"));
        assert!(
            wait_for(10, || sluice(&["port", "list", "--switch", &name]).status.success()),
            "switch {name} did not start ({}): {}",
            sock.display(),
            std::fs::read_to_string(self.dir.join(format!("{name}.log"))).unwrap_or_default()
        );
        self.address_guest(i, &format!("{name}t"), mtu);
    }

    /// Host `i` is plain Linux: a kernel vxlan device (learning, flooding to `remotes`)
    /// and a bridge, guest `i` on a veth.
    fn kernel_host(&mut self, i: u8, remotes: &[u8]) {
        let h = self.host(i);
        let g = self.guest(i);
        self.add_ns(&g);
        ns_ok(
            &h,
            &format!(
                "ip link add vx0 type vxlan id {VNI} local 192.168.77.{i} dstport 4789 && ip link add br0 type bridge stp_state 0 forward_delay 0 && ip link set vx0 master br0 up && ip link set br0 up"
            ),
        );
        for r in remotes {
            ns_ok(&h, &format!("bridge fdb append 00:00:00:00:00:00 dev vx0 dst 192.168.77.{r}"));
        }
        sh_ok(&format!("ip -n {h} link add p0 type veth peer name eth0 netns {g}"));
        ns_ok(&h, "ip link set p0 master br0 up");
        self.address_guest(i, "eth0", 1450);
    }

    /// Host `i` runs Open vSwitch (user-space datapath, daemons of the test's own in a
    /// private directory): a bridge `br-phy` holding the underlay interface and the host's
    /// address (OVS's native tunnels route through it), a bridge `br-int` with a vxlan port
    /// to `remote` and guest `i` on a TAP port.
    fn ovs_host(&mut self, i: u8, remote: u8) {
        let h = self.host(i);
        let g = self.guest(i);
        self.add_ns(&g);
        let d = self.dir.join(format!("ovs{i}"));
        std::fs::create_dir_all(&d).unwrap();
        self.ovs.push(d.clone());
        let d = d.display().to_string();
        let env = format!("OVS_RUNDIR={d} OVS_LOGDIR={d} OVS_DBDIR={d}");
        let vsctl = format!("{env} ovs-vsctl --db=unix:{d}/db.sock --timeout=15");
        sh_ok(&format!(
            "{env} ovsdb-tool create {d}/conf.db /usr/share/openvswitch/vswitch.ovsschema && {env} ovsdb-server {d}/conf.db --remote=punix:{d}/db.sock --pidfile={d}/ovsdb-server.pid --unixctl={d}/ovsdb-server.ctl --log-file={d}/ovsdb-server.log --detach --no-chdir && {vsctl} --no-wait init"
        ));
        sh_ok(&format!(
            "{env} ip netns exec {h} ovs-vswitchd unix:{d}/db.sock --pidfile={d}/ovs-vswitchd.pid --unixctl={d}/ovs-vswitchd.ctl --log-file={d}/ovs-vswitchd.log --detach --no-chdir"
        ));
        ns_ok(&h, "ip addr flush dev u0");
        sh_ok(&format!("{vsctl} add-br br-phy -- set bridge br-phy datapath_type=netdev -- add-port br-phy u0"));
        assert!(wait_for(10, || ns_sh(&h, "ip link show br-phy").status.success()), "OVS made no br-phy");
        ns_ok(&h, &format!("ip addr add 192.168.77.{i}/24 dev br-phy && ip link set br-phy up"));
        sh_ok(&format!(
            "{vsctl} add-br br-int -- set bridge br-int datapath_type=netdev -- add-port br-int vx0 -- set interface vx0 type=vxlan options:remote_ip=192.168.77.{remote} options:local_ip=192.168.77.{i} options:key={VNI} -- add-port br-int gt -- set interface gt type=tap"
        ));
        assert!(wait_for(10, || ns_sh(&h, "ip link show gt").status.success()), "OVS made no TAP port");
        sh_ok(&format!("ip -n {h} link set gt netns {g}"));
        self.address_guest(i, "gt", 1450);
    }

    fn switch(&self, i: u8) -> String {
        format!("{}s{i}", self.tag)
    }

    fn port(&self, i: u8, port: &str) -> serde_json::Value {
        let v: serde_json::Value =
            serde_json::from_str(&sluice_ok(&["stats", "--switch", &self.switch(i), "--json"])).unwrap();
        v["ports"].as_array().unwrap().iter().find(|p| p["name"] == port).unwrap().clone()
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        for (name, c) in &mut self.switches {
            // A clean stop removes a kernel datapath's upcall TAP, pins and tunnel device;
            // the kill is for a switch that hangs.
            let _ = sluice(&["switch", "stop", "--switch", name]);
            wait_for(10, || c.try_wait().is_ok_and(|s| s.is_some()));
            let _ = c.kill();
            let _ = c.wait();
        }
        for d in &self.ovs {
            for daemon in ["ovs-vswitchd", "ovsdb-server"] {
                let _ = Command::new("ovs-appctl")
                    .arg("-t")
                    .arg(d.join(format!("{daemon}.ctl")))
                    .args(["--timeout=10", "exit"])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status();
            }
        }
        for ns in self.namespaces.iter().rev() {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
        // (A guest's veth went with its namespace; the switch removed its tunnel device.)
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A fresh directory of the test's own under the temporary directory (`mkdtemp`: no
/// predictable path as root).
fn mkdtemp(prefix: &str) -> PathBuf {
    let template = std::env::temp_dir().join(format!("{prefix}XXXXXX"));
    let mut buf = std::ffi::CString::new(template.as_os_str().as_encoded_bytes()).unwrap().into_bytes_with_nul();
    // SAFETY: `buf` is a NUL-terminated template ending in XXXXXX that mkdtemp rewrites in
    // place; it outlives the call.
    let p = unsafe { libc::mkdtemp(buf.as_mut_ptr().cast()) };
    assert!(!p.is_null(), "mkdtemp {}: {}", template.display(), std::io::Error::last_os_error());
    buf.pop();
    PathBuf::from(std::ffi::OsString::from(String::from_utf8(buf).unwrap()))
}

/// A VXLAN endpoint of the test's own (`tests/vxlan_endpoint.py`) in namespace `ns`, bound
/// to `local`:4789: it sends each of `sends` (target address, inner frame) in VNI 5000
/// every 100 ms and counts what arrives, until [`endpoint_report`] (at most 60 s). Bound
/// when this returns.
fn endpoint(ns: &str, local: &str, sends: &[(&str, &[u8])], markers: &[&str]) -> Child {
    endpoint_in(ns, local, VNI, sends, markers)
}

/// [`endpoint`], sending in VNI `vni`.
fn endpoint_in(ns: &str, local: &str, vni: u32, sends: &[(&str, &[u8])], markers: &[&str]) -> Child {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/vxlan_endpoint.py");
    let mut args: Vec<String> = vec![script.into(), local.into(), "60".into(), "--stop-on-eof".into()];
    for (to, f) in sends {
        let hex: String = f.iter().map(|b| format!("{b:02x}")).collect();
        args.extend(["--send".into(), to.to_string(), vni.to_string(), hex]);
    }
    for m in markers {
        args.extend(["--marker".into(), m.to_string()]);
    }
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns, "python3"]).args(&args);
    spawn_ready(&mut c, "the test's VXLAN endpoint")
}

/// Stops an [`endpoint`] and returns its count: `{"sent", "received", "markers"}`.
fn endpoint_report(mut c: Child) -> serde_json::Value {
    drop(c.stdin.take());
    let out = c.wait_with_output().unwrap();
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("{e}: {}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
    })
}

fn hex_mac(m: [u8; 6]) -> String {
    m.map(|b| format!("{b:02x}")).join(":")
}

/// `n` MB of random bytes from guest `from` to guest `to` (TCP `port`), sha256 checked.
fn transfer(h: &Hosts, from: u8, to: u8, mb: u32, port: u16) {
    let src = h.dir.join(format!("src{from}{to}"));
    sh_ok(&format!("head -c {}000000 /dev/urandom > {}", mb, src.display()));
    let want = sh_ok(&format!("sha256sum < {}", src.display()));
    let sink = ns_spawn(&h.guest(to), &format!("timeout 120 nc -l -N {port} | sha256sum"));
    assert!(wait_for(10, || ns_sh(&h.guest(to), &format!("ss -ltn | grep -q :{port}")).status.success()));
    ns_ok(&h.guest(from), &format!("timeout 120 nc -N 10.78.0.{to} {port} < {}", src.display()));
    let out = sink.wait_with_output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), want, "sha256 of what arrived at g{to} from g{from}");
    let _ = std::fs::remove_file(src);
}

fn pings(h: &Hosts, from: u8, to: u8) {
    ns_ok(&h.guest(from), &format!("ping -c 2 -W 5 10.78.0.{to}"));
    ns_ok(&h.guest(from), &format!("ping -6 -c 2 -W 5 fd79::{to}"));
}

fn a_sluice_host_and_a_kernel_vxlan_host_are_one_lan_on(kernel: bool) {
    if !root() || !have("ethtool") || !have("nc") || !have("tshark") {
        return;
    }
    let mut h = Hosts::new(if kernel { "vxkk" } else { "vxk" }, kernel);
    h.sluice_host(1, &[2]);
    h.kernel_host(2, &[1]);
    pings(&h, 1, 2);
    pings(&h, 2, 1);

    // Learned on both sides: the kernel's guest behind the sluice switch's tunnel port, the
    // sluice guest behind the kernel's vxlan device, at the sluice host's address.
    let g2_mac = mac_of(&h.guest(2), "eth0").map(|b| format!("{b:02x}")).join(":");
    let g1_mac = mac_of(&h.guest(1), &format!("{}t", h.switch(1))).map(|b| format!("{b:02x}")).join(":");
    let fib = sluice_ok(&["fib", "show", "--switch", &h.switch(1)]);
    assert!(fib.lines().any(|l| l.contains(&g2_mac) && l.contains("vx0") && l.contains("192.168.77.2")), "{fib}");
    let kfdb = ns_ok(&h.ns("h2"), "bridge fdb show dev vx0");
    assert!(kfdb.lines().any(|l| l.contains(&g1_mac) && l.contains("dst 192.168.77.1")), "{kfdb}");

    // 100 MB each way, the guests' TSO frames cut for the tunnel by its port (or by the
    // kernel's device); and the underlay carries no bad checksum, outer or inner.
    let cap = h.dir.join("underlay.pcap");
    let mut tshark = ns_spawn(&h.ns("h2"), &format!("timeout 60 tshark -q -i u0 -c 2000 -w {}", cap.display()));
    assert!(wait_for(10, || ns_sh(&h.ns("h2"), "pgrep -f 'tshark -q -i u0' >/dev/null").status.success()));
    std::thread::sleep(std::time::Duration::from_millis(500));
    transfer(&h, 1, 2, 100, 5601);
    transfer(&h, 2, 1, 100, 5602);
    let _ = tshark.wait();
    let bad = sh_ok(&format!(
        "tshark -r {} -o ip.check_checksum:TRUE -o udp.check_checksum:TRUE -o tcp.check_checksum:TRUE -Y 'ip.checksum.status == 0 || udp.checksum.status == 0 || tcp.checksum.status == 0' | wc -l",
        cap.display()
    ));
    let all = sh_ok(&format!("tshark -r {} -Y 'vxlan && tcp' | wc -l", cap.display()));
    assert!(all.trim().parse::<u32>().unwrap() > 100, "the capture saw the transfer: {all}");
    assert_eq!(bad.trim(), "0", "frames with a bad checksum on the underlay");
    // One inner flow leaves from one outer source port, picked by its hash (not the tunnel
    // port's own).
    let ports = sh_ok(&format!(
        "tshark -r {} -Y 'vxlan && ip.src == 192.168.77.1 && tcp.dstport == 5601' -T fields -e udp.srcport | sort -u",
        cap.display()
    ));
    let ports: Vec<&str> = ports.split_whitespace().collect();
    assert_eq!(ports.len(), 1, "the transfer's datagrams from host 1 came from source ports {ports:?}");
    assert_ne!(ports[0], "4789");
    let vx = h.port(1, "vx0");
    if kernel {
        // The programs forward both ways themselves: the kernel's vxlan device takes the
        // guests' TSO frames whole, and frames from the tunnel go to the guest directly.
        assert!(vx["counters"]["tx_gso"].as_u64().unwrap() > 0, "GSO frames sent whole into the tunnel: {vx}");
        assert!(vx["kernel"]["forwarded"].as_u64().unwrap() > 1000, "forwarded by the kernel from the tunnel: {vx}");
        let g = h.port(1, &format!("{}t", h.switch(1)));
        assert!(g["kernel"]["forwarded"].as_u64().unwrap() > 1000, "forwarded by the kernel into the tunnel: {g}");
    } else {
        // The port takes GSO frames whole and cuts them itself, sending each frame's
        // segments in one call (the checks above found their checksums right).
        assert!(vx["counters"]["tx_gso"].as_u64().unwrap() > 0, "GSO frames handed to the tunnel whole: {vx}");
        assert_eq!(vx["counters"]["tx_segmented"], 0, "none cut by the switch: {vx}");
    }

    // The inner MTU is the underlay's less 50: 1422 bytes of ping payload fit, and a guest
    // whose MTU says more has its frame dropped and counted, not fragmented.
    ns_ok(&h.guest(1), "ping -c 1 -W 5 -M do -s 1422 10.78.0.2");
    ns_ok(&h.guest(1), &format!("ip link set {}t mtu 1500", h.switch(1)));
    if kernel {
        // (A veth drops what its own MTU does not take before the switch sees it.)
        sh_ok(&format!("ip link set {}t mtu 1500", h.switch(1)));
    }
    assert!(!ns_sh(&h.guest(1), "ping -c 1 -W 2 -M do -s 1472 10.78.0.2").status.success());
    let vx = h.port(1, "vx0");
    assert!(vx["counters"]["tx_drops"]["over_mtu"].as_u64().unwrap() >= 1, "counted as over-MTU: {vx}");
    assert_eq!(vx["mtu"], 1450, "{vx}");

    // A restart in place: the tunnel carries on (on the kernel datapath its device is made
    // again, and the new program learns the stations behind it again).
    ns_ok(&h.guest(1), &format!("ip link set {}t mtu 1450", h.switch(1)));
    if kernel {
        sh_ok(&format!("ip link set {}t mtu 1450", h.switch(1)));
    }
    sluice_ok(&["switch", "restart", "--switch", &h.switch(1)]);
    pings(&h, 1, 2);
    pings(&h, 2, 1);
    transfer(&h, 2, 1, 10, 5606);
}

fn two_sluice_hosts_and_a_kernel_host_flood_once_to_each_on(kernel: bool) {
    if !root() || !have("ethtool") || !have("nc") || !have("python3") {
        return;
    }
    let mut h = Hosts::new(if kernel { "vxfk" } else { "vxf" }, kernel);
    h.sluice_host(1, &[2, 3]);
    h.sluice_host(2, &[1, 3]);
    h.kernel_host(3, &[1, 2]);
    pings(&h, 1, 2);
    pings(&h, 3, 2);
    transfer(&h, 1, 2, 100, 5603);

    // One broadcast from g1 reaches g2 and g3 once each, and does not come back.
    let listeners: Vec<Child> =
        [(1u8, format!("{}t", h.switch(1))), (2, format!("{}t", h.switch(2))), (3, "eth0".into())]
            .iter()
            .map(|(i, dev)| listen_raw(&h.guest(*i), dev, 0x88b5, 3.0))
            .collect();
    let src = mac_of(&h.guest(1), &format!("{}t", h.switch(1)));
    send_raw(&h.guest(1), &format!("{}t", h.switch(1)), &[frame([0xff; 6], src, None, 0x88b5, b"once to each host")]);
    let got: Vec<usize> = listeners
        .into_iter()
        .map(|l| received(l).iter().filter(|(_, f)| f.windows(17).any(|w| w == b"once to each host")).count())
        .collect();
    assert_eq!(got, [0, 1, 1], "receptions at g1, g2, g3");
}

fn an_ipv6_underlay_carries_a_vni_per_vlan_on(kernel: bool) {
    if !root() || !have("ethtool") || !have("tshark") {
        return;
    }
    let mut h = Hosts::new(if kernel { "vx6k" } else { "vx6" }, kernel);
    let map = "vni_map = { \"10\" = 5010, \"20\" = 5020 }";
    // Over IPv6 the tunnel costs 70 bytes: 1430 inside a 1500-byte underlay.
    h.sluice_host_with(1, "fd78::1", &["fd78::2".into()], "vlan = 10", map, 1430);
    h.sluice_host_with(2, "fd78::2", &["fd78::1".into()], "vlan = 10", map, 1430);
    assert_eq!(h.port(1, "vx0")["mtu"], 1430);
    assert_eq!(h.port(1, "vx0")["vlan"], "trunk 10,20", "a VNI per VLAN makes the tunnel a trunk");
    let cap = h.dir.join("underlay6.pcap");
    let mut tshark =
        ns_spawn(&h.ns("h2"), &format!("timeout 30 tshark -q -i u0 -c 6 -f 'udp port 4789' -w {}", cap.display()));
    assert!(wait_for(10, || ns_sh(&h.ns("h2"), "pgrep -f 'tshark -q -i u0' >/dev/null").status.success()));
    std::thread::sleep(std::time::Duration::from_millis(500));
    pings(&h, 1, 2);
    pings(&h, 2, 1);
    ns_ok(&h.guest(1), "ping -c 1 -W 5 -M do -s 1402 10.78.0.2");
    let _ = tshark.wait();
    let vnis = sh_ok(&format!("tshark -r {} -T fields -e vxlan.vni -e ipv6.src | sort -u", cap.display()));
    assert!(
        vnis.lines().all(|l| l.starts_with("5010\t")) && vnis.contains("fd78::1"),
        "VLAN 10 travels as VNI 5010 over IPv6: {vnis}"
    );
    let fib = sluice_ok(&["fib", "show", "--switch", &h.switch(1)]);
    let g2_mac = mac_of(&h.guest(2), &format!("{}t", h.switch(2))).map(|b| format!("{b:02x}")).join(":");
    assert!(fib.lines().any(|l| l.contains(&g2_mac) && l.starts_with(" 10") && l.contains("fd78::2")), "{fib}");
}

fn an_open_vswitch_host_is_a_tunnel_endpoint_like_any_other_on(kernel: bool) {
    if !root() || !have("ethtool") || !have("nc") || !have("ovs-vswitchd") {
        return;
    }
    let mut h = Hosts::new(if kernel { "vxok" } else { "vxo" }, kernel);
    h.sluice_host(1, &[2]);
    h.ovs_host(2, 1);
    pings(&h, 1, 2);
    pings(&h, 2, 1);
    transfer(&h, 1, 2, 100, 5604);
    transfer(&h, 2, 1, 100, 5605);
    // Learned on both sides: OVS's guest behind sluice's tunnel port at OVS's address, and
    // sluice's guest on OVS's vxlan port.
    let g2_mac = mac_of(&h.guest(2), "gt").map(|b| format!("{b:02x}")).join(":");
    let g1_mac = mac_of(&h.guest(1), &format!("{}t", h.switch(1))).map(|b| format!("{b:02x}")).join(":");
    let fib = sluice_ok(&["fib", "show", "--switch", &h.switch(1)]);
    assert!(fib.lines().any(|l| l.contains(&g2_mac) && l.contains("vx0") && l.contains("192.168.77.2")), "{fib}");
    let d = h.ovs[0].display().to_string();
    let ofport = sh_ok(&format!("ovs-vsctl --db=unix:{d}/db.sock --timeout=15 get interface vx0 ofport"));
    let fdb = sh_ok(&format!("ovs-appctl -t {d}/ovs-vswitchd.ctl fdb/show br-int"));
    assert!(
        fdb.lines().any(|l| l.contains(&g1_mac) && l.split_whitespace().next() == Some(ofport.trim())),
        "OVS learned sluice's guest on its vxlan port {ofport}: {fdb}"
    );
}

fn an_underlay_host_not_among_the_remotes_is_neither_heard_nor_sent_to_on(kernel: bool) {
    if !root() || !have("ethtool") || !have("python3") {
        return;
    }
    let mut h = Hosts::new(if kernel { "vxuk" } else { "vxu" }, kernel);
    h.sluice_host(1, &[2]);
    h.sluice_host(2, &[1]);
    pings(&h, 1, 2);
    // Host 9 is on the underlay but in no switch's remotes. It claims guest 2's address and
    // a station of its own, and listens for what the tunnel sends it.
    let forger = h.host(9);
    let dev1 = format!("{}t", h.switch(1));
    let (g1, g2) = (mac_of(&h.guest(1), &dev1), mac_of(&h.guest(2), &format!("{}t", h.switch(2))));
    let fresh = [0x02, 0x66, 0, 0, 0, 0x99];
    let claims = [
        frame([0xff; 6], g2, None, 0x88b5, b"forged: g2 is here"),
        frame([0xff; 6], fresh, None, 0x88b5, b"forged: a new station"),
    ];
    let ep = endpoint(
        &forger,
        "192.168.77.9",
        &[("192.168.77.1", &claims[0]), ("192.168.77.1", &claims[1])],
        &["broadcast from g1"],
    );
    let fib = || sluice_ok(&["fib", "show", "--switch", &h.switch(1)]);
    let refused = || h.port(1, "vx0")["counters"]["rx_drops"]["unknown_endpoint"].as_u64().unwrap_or(0);
    assert!(
        wait_for(10, || refused() > 0 || fib().contains(&hex_mac(fresh))),
        "the forged datagrams never reached the switch"
    );
    // Guest 1 pings guest 2 and broadcasts while the forger claims guest 2.
    let ping = ns_sh(&h.guest(1), "ping -c 8 -i 0.25 -W 2 10.78.0.2");
    send_raw(&h.guest(1), &dev1, &vec![frame([0xff; 6], g1, None, 0x88b5, b"broadcast from g1"); 4]);
    let r = endpoint_report(ep);
    assert!(r["sent"].as_u64().unwrap() >= 10, "{r}");
    assert_eq!(r["received"], 0, "the forger received the guests' frames: {r}");
    let out = String::from_utf8_lossy(&ping.stdout);
    assert!(out.contains(" 8 received"), "guest 1's echo requests all reached guest 2: {out}");
    let fib = fib();
    assert!(!fib.contains(&hex_mac(fresh)), "a station learned from the forger: {fib}");
    assert!(
        fib.lines().any(|l| l.contains(&hex_mac(g2)) && l.contains("192.168.77.2")) && !fib.contains("192.168.77.9"),
        "guest 2 stays behind its host: {fib}"
    );
    assert!(refused() >= 10, "the forger's datagrams counted: {}", h.port(1, "vx0"));
    let st: serde_json::Value =
        serde_json::from_str(&sluice_ok(&["stats", "--switch", &h.switch(1), "--json"])).unwrap();
    assert_conserved(&st);
}

fn a_remote_claiming_a_locked_local_station_does_not_move_it_on(kernel: bool) {
    if !root() || !have("ethtool") || !have("python3") {
        return;
    }
    let mut h = Hosts::new(if kernel { "vxlk" } else { "vxl" }, kernel);
    const LOCKED: [u8; 6] = [0x02, 0x78, 0, 0, 0, 0x01];
    let lock = format!("mac = \"{}\"", hex_mac(LOCKED));
    h.sluice_host_with(1, "192.168.77.1", &["192.168.77.2".into()], &lock, &format!("vni = {VNI}"), 1450);
    // Host 2 is a configured remote: the test's own endpoint.
    let remote = h.host(2);
    let (g1ns, dev) = (h.guest(1), format!("{}t", h.switch(1)));
    ns_ok(
        &g1ns,
        &format!("ip link set {dev} down && ip link set {dev} address {} && ip link set {dev} up", hex_mac(LOCKED)),
    );
    assert!(
        wait_for(10, || {
            send_raw(&g1ns, &dev, &[frame([0xff; 6], LOCKED, None, 0x88b5, b"g1 is here")]);
            let fib = sluice_ok(&["fib", "show", "--switch", &h.switch(1)]);
            fib.lines().any(|l| l.contains(&hex_mac(LOCKED)) && l.contains(&dev))
        }),
        "the switch learned guest 1"
    );
    // The remote claims guest 1's address, and sends guest 1 frames, alternately.
    let listener = listen_raw(&g1ns, &dev, 0x88b5, 4.0);
    let sends = [
        frame([0xff; 6], LOCKED, None, 0x88b5, b"the remote claims g1"),
        frame(LOCKED, [0x02, 0x78, 0, 0, 0, 0x99], None, 0x88b5, b"for g1 from the remote"),
    ];
    let ep = endpoint(&remote, "192.168.77.2", &[("192.168.77.1", &sends[0]), ("192.168.77.1", &sends[1])], &[]);
    let got = received(listener);
    let r = endpoint_report(ep);
    let count = |text: &[u8]| got.iter().filter(|(_, f)| f.windows(text.len()).any(|w| w == text)).count();
    let (for_g1, claims) = (count(b"for g1 from the remote"), count(b"the remote claims g1"));
    assert!(for_g1 >= 10, "frames for guest 1 still reach it: {for_g1} of {} ({claims} claims did)", r["sent"]);
    assert_eq!(claims, 0, "the claims went nowhere");
    let fib = sluice_ok(&["fib", "show", "--switch", &h.switch(1)]);
    assert!(fib.lines().any(|l| l.contains(&hex_mac(LOCKED)) && l.contains(&dev)), "guest 1 stays on its port: {fib}");
    let vx = h.port(1, "vx0");
    assert!(vx["counters"]["rx_drops"]["spoofed_mac"].as_u64().unwrap() >= 10, "the claims counted: {vx}");
}

/// A configured remote's datagrams of a VNI the port does not carry: dropped as the
/// port's received frames, `vlan_filter` (the VNI is the tunnel's tag), on both datapaths
/// — not as the tunnel device's drops.
fn a_vni_the_port_does_not_carry_is_its_vlan_filter_drop_on(kernel: bool) {
    if !root() || !have("ethtool") || !have("python3") {
        return;
    }
    let mut h = Hosts::new(if kernel { "vxnk" } else { "vxn" }, kernel);
    h.sluice_host(1, &[2]);
    let remote = h.host(2);
    let (g1ns, dev) = (h.guest(1), format!("{}t", h.switch(1)));
    let stranger = [0x02, 0x79, 0, 0, 0, 0x01];
    let listener = listen_raw(&g1ns, &dev, 0x88b5, 4.0);
    let sends = [frame([0xff; 6], stranger, None, 0x88b5, b"in another VNI")];
    let ep = endpoint_in(&remote, "192.168.77.2", VNI + 1, &[("192.168.77.1", &sends[0])], &[]);
    let counted = || h.port(1, "vx0")["counters"]["rx_drops"]["vlan_filter"].as_u64().unwrap_or(0);
    let arrived = wait_for(10, || counted() >= 10);
    let got = received(listener);
    let r = endpoint_report(ep);
    let vx = h.port(1, "vx0");
    assert!(arrived, "{} datagrams of VNI {} sent, counted: {vx}", r["sent"], VNI + 1);
    assert!(!got.iter().any(|(_, f)| f.windows(14).any(|w| w == b"in another VNI")), "guest 1 got one");
    let fib = sluice_ok(&["fib", "show", "--switch", &h.switch(1)]);
    assert!(!fib.contains(&hex_mac(stranger)), "learned from another VNI: {fib}");
    assert!(vx["counters"]["rx_frames"].as_u64().unwrap() >= counted(), "counted as received: {vx}");
    let st: serde_json::Value =
        serde_json::from_str(&sluice_ok(&["stats", "--switch", &h.switch(1), "--json"])).unwrap();
    assert_conserved(&st);
}

fn a_guests_udp_gso_broadcast_leaves_as_at_most_the_budget_on(kernel: bool) {
    if !root() || !have("ethtool") || !have("python3") || !have("setpriv") {
        return;
    }
    let mut h = Hosts::new(if kernel { "vxgk" } else { "vxg" }, kernel);
    h.sluice_host(1, &[2, 3]);
    let (r2, r3) = (h.host(2), h.host(3));
    for r in [&r2, &r3] {
        // (Host 1 then knows their MAC addresses: nothing waits for ARP below.)
        ns_ok(r, "ping -c 1 -W 5 192.168.77.1");
    }
    let markers = ["QQQQQQQQ", "SSSSSSSS"];
    let eps = [endpoint(&r2, "192.168.77.2", &[], &markers), endpoint(&r3, "192.168.77.3", &[], &markers)];
    // An unprivileged program in guest 1: one 6,000-byte UDP-GSO send of 48-byte segments
    // to the broadcast address (125 segments, to two endpoints: 250 datagrams), then one of
    // 480 bytes (10 segments: 20 datagrams, within the budget).
    let send = "import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\ns.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)\ns.setsockopt(socket.IPPROTO_UDP, 103, 48)\ns.sendto(b'Q' * 6000, ('10.78.0.255', 9))\ns.sendto(b'S' * 480, ('10.78.0.255', 9))\n";
    ns_ok(
        &h.guest(1),
        &format!("setpriv --reuid=nobody --regid=nogroup --clear-groups /usr/bin/python3 -c \"{send}\""),
    );
    let vx = || h.port(1, "vx0");
    // (The tunnel port takes the GSO frame whole and cuts it itself.)
    assert!(wait_for(10, || vx()["counters"]["tx_gso"].as_u64().unwrap() >= 1), "nothing reached the tunnel: {}", vx());
    let reports: Vec<serde_json::Value> = eps.into_iter().map(endpoint_report).collect();
    for r in &reports {
        assert_eq!(r["markers"]["QQQQQQQQ"], 0, "the send over the budget left the switch: {r}");
        assert_eq!(r["markers"]["SSSSSSSS"], 10, "the one within it did, once to each endpoint: {r}");
    }
    let vx = vx();
    assert!(vx["counters"]["tx_drops"]["gso_limit"].as_u64().unwrap() >= 1, "counted: {vx}");
    let g = h.port(1, &format!("{}t", h.switch(1)));
    assert!(g["counters"]["rx_gso"].as_u64().unwrap() >= 2, "the sends arrived as GSO frames: {g}");
}

/// Namespace `ns`'s UDP counter `field` (`InDatagrams`: datagrams its sockets' owners
/// read; `InErrors`: datagrams dropped on their way to a socket), of IPv6 if `v6`.
/// On the kernel datapath, a broadcast from a guest into a tunnel of three remotes is
/// replicated by the kernel: every endpoint receives every frame, and the guest's port
/// sends next to nothing up.
fn a_flood_into_a_tunnel_reaches_every_endpoint_from_the_kernel_on() {
    if !root() || !have("ethtool") || !have("python3") {
        return;
    }
    const FRAMES: usize = 200;
    let mut h = Hosts::new("vxrk", true);
    h.sluice_host(1, &[2, 3, 4]);
    let marker = "arp broadcast from g1";
    let endpoints: Vec<Child> = (2..=4u8)
        .map(|i| {
            let ns = h.host(i);
            endpoint(&ns, &format!("192.168.77.{i}"), &[], &[marker])
        })
        .collect();
    // ARP requests (broadcast), the marker after the ARP message.
    let dev = format!("{}t", h.switch(1));
    let src = mac_of(&h.guest(1), &dev);
    let mut arp = vec![0, 1, 8, 0, 6, 4, 0, 1];
    arp.extend_from_slice(&src);
    arp.extend_from_slice(&[10, 78, 0, 1, 0, 0, 0, 0, 0, 0, 10, 78, 0, 99]);
    arp.extend_from_slice(marker.as_bytes());
    // (The underlay's neighbours first: datagrams to an address not resolved yet wait in
    // a short queue, and a burst overflows it — the underlay's business, not the switch's.)
    for i in 2..=4 {
        ns_ok(&h.ns("h1"), &format!("ping -c 1 -W 5 192.168.77.{i}"));
    }
    // One broadcast first, which goes up (the key has no verdict yet): the core floods it
    // and installs the verdict; then the burst, the kernel's.
    let f = frame([0xff; 6], src, None, 0x0806, &arp);
    send_raw(&h.guest(1), &dev, std::slice::from_ref(&f));
    let flooded = || h.port(1, &dev)["counters"]["flooded"].as_u64().unwrap_or(0);
    assert!(wait_for(10, || flooded() >= 1), "the first broadcast was not flooded: {}", h.port(1, &dev));
    // (In batches: the test's endpoints read with one Python loop each, and a copy the
    // kernel clones takes more of a receive buffer than the frame itself — 600 at once
    // overflowed theirs, counted as the endpoints' RcvbufErrors, none lost by the switch.)
    for _ in 0..FRAMES / 20 {
        send_raw(&h.guest(1), &dev, &vec![f.clone(); 20]);
    }
    let got: Vec<u64> = endpoints
        .into_iter()
        .map(|e| {
            let r = endpoint_report(e);
            r["markers"][marker].as_u64().unwrap_or(0)
        })
        .collect();
    let all = FRAMES as u64 + 1;
    assert_eq!(got, [all; 3], "each endpoint got each broadcast once");
    // The burst the kernel flooded itself, a copy per endpoint: nothing of it went up (what
    // did is the first broadcast and the guest's own few frames: neighbour discovery).
    let g1 = h.port(1, &dev);
    let k = &g1["kernel"];
    let n = |f: &str| k[f].as_u64().unwrap_or(0);
    assert!(n("flooded") >= FRAMES as u64 && n("upcalls") < 20, "{g1}");
    let vx = h.port(1, "vx0");
    // (One frame each given to the tunnel, and the guest's own, flooded by the core.)
    assert!(vx["counters"]["tx_frames"].as_u64().unwrap_or(0) >= all, "{vx}");
    let st: serde_json::Value =
        serde_json::from_str(&sluice_ok(&["stats", "--switch", &h.switch(1), "--json"])).unwrap();
    assert_conserved(&st);
}

/// On the kernel datapath, a tunnel open to any sender (`remotes_only = false`) floods to
/// an endpoint it heard from too: the kernel's flood set is the port's (the configured
/// remotes and the heard endpoint), and the kernel replicates the floods to all three —
/// the heard endpoint gets every one.
fn a_heard_endpoint_gets_the_floods_too_on() {
    if !root() || !have("ethtool") || !have("python3") {
        return;
    }
    const FRAMES: usize = 60;
    let mut h = Hosts::new("vxhk", true);
    let remotes = ["192.168.77.2".to_string(), "192.168.77.3".to_string()];
    h.sluice_host_with(1, "192.168.77.1", &remotes, "", &format!("vni = {VNI}\nremotes_only = false"), 1450);
    let marker = "flood from g1";
    // Host 9 is no configured remote: it says hello (a station of its own) until heard.
    let stranger = [0x02, 0x79, 0, 0, 0, 0x09];
    let hello = frame([0xff; 6], stranger, None, 0x88b5, b"hello from host 9");
    let mut endpoints: Vec<Child> = (2..=3u8)
        .map(|i| {
            let ns = h.host(i);
            endpoint(&ns, &format!("192.168.77.{i}"), &[], &[marker])
        })
        .collect();
    let ns9 = h.host(9);
    endpoints.push(endpoint(&ns9, "192.168.77.9", &[("192.168.77.1", &hello)], &[marker]));
    for i in [2, 3, 9] {
        ns_ok(&h.ns("h1"), &format!("ping -c 1 -W 5 192.168.77.{i}"));
    }
    let fib = || sluice_ok(&["fib", "show", "--switch", &h.switch(1)]);
    assert!(
        wait_for(10, || fib().lines().any(|l| l.contains(&hex_mac(stranger)) && l.contains("192.168.77.9"))),
        "the switch heard host 9's station behind it: {}",
        fib()
    );
    // (The kernel's flood set follows the port's in the same turn of the daemon that
    // learned the station: before `fib show` is answered.)
    let dev = format!("{}t", h.switch(1));
    let src = mac_of(&h.guest(1), &dev);
    let f = frame([0xff; 6], src, None, 0x88b5, marker.as_bytes());
    for _ in 0..FRAMES / 20 {
        send_raw(&h.guest(1), &dev, &vec![f.clone(); 20]);
    }
    let got: Vec<u64> =
        endpoints.into_iter().map(|e| endpoint_report(e)["markers"][marker].as_u64().unwrap_or(0)).collect();
    assert_eq!(got, [FRAMES as u64; 3], "the two remotes and the heard endpoint got each broadcast once");
    let g1 = h.port(1, &dev);
    // (Each endpoint got every broadcast, and the kernel replicated some of them: so its
    // flood set holds the heard endpoint. How many went up instead — a verdict a change of
    // the core's made stale — is no concern here.)
    assert!(g1["kernel"]["flooded"].as_u64() >= Some(1), "the kernel replicated none: {g1}");
}

#[test]
#[ignore = "system tier: needs root (network namespaces, veth underlays, a VXLAN device and BPF), ethtool and python3; scripts/test.sh runs it"]
fn a_heard_endpoint_gets_the_floods_too() {
    a_heard_endpoint_gets_the_floods_too_on()
}

#[test]
#[ignore = "system tier: needs root (network namespaces, veth underlays, a VXLAN device and BPF), ethtool and python3; scripts/test.sh runs it"]
fn a_flood_into_a_tunnel_reaches_every_endpoint_from_the_kernel() {
    a_flood_into_a_tunnel_reaches_every_endpoint_from_the_kernel_on()
}

fn udp_mib(ns: &str, v6: bool, field: &str) -> u64 {
    if v6 {
        let t = ns_ok(ns, "cat /proc/net/snmp6");
        let key = format!("Udp6{field}");
        return t.lines().find_map(|l| l.strip_prefix(key.as_str())?.trim().parse().ok()).unwrap();
    }
    let t = ns_ok(ns, "cat /proc/net/snmp");
    let mut udp = t.lines().filter(|l| l.starts_with("Udp: "));
    let (names, values) = (udp.next().unwrap(), udp.next().unwrap());
    let at = names.split_whitespace().position(|n| n == field).unwrap();
    values.split_whitespace().nth(at).unwrap().parse().unwrap()
}

/// Sends `n` VXLAN datagrams of VNI 5000 (inner broadcasts from made-up stations) from
/// `from` to `to`:4789, as fast as Python can, in namespace `ns`; returns how many were sent.
fn underlay_flood(h: &Hosts, ns: &str, from: &str, to: &str, n: u32) -> Child {
    let script = h.dir.join("flood.py");
    let code = r#"import socket, struct, sys
src, dst, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
s = socket.socket(socket.AF_INET6 if ':' in dst else socket.AF_INET, socket.SOCK_DGRAM)
s.bind((src, 0))
hdr = struct.pack('!II', 0x08000000, 5000 << 8)
sent = 0
for i in range(n):
    inner = bytes([255] * 6 + [2, 0x66, 0, 0, (i >> 8) & 255, i & 255, 0x88, 0xb5]) + b'underlay flood' * 4
    try:
        s.sendto(hdr + inner, (dst, 4789))
        sent += 1
    except OSError:
        pass
print(sent)
"#;
    std::fs::write(&script, code).unwrap();
    ns_spawn(ns, &format!("python3 {} {from} {to} {n}", script.display()))
}

/// User-space datapath: a host on the underlay outside the remotes floods the tunnel's
/// port. Its datagrams are dropped in the kernel by the socket's filter — the switch reads
/// none of them, the namespace's UDP counters say so — and counted as the port's
/// `unknown_endpoint` drops, exactly, and not as the socket's kernel drops; the configured
/// remote's traffic crosses meanwhile.
fn a_flood_from_an_unknown_underlay_host_is_dropped_before_the_switch_reads_it_over(v6: bool) {
    if !root() || !have("ethtool") || !have("python3") {
        return;
    }
    let mut h = Hosts::new(if v6 { "vxd6" } else { "vxd" }, false);
    let (a1, a2, a9) =
        if v6 { ("fd78::1", "fd78::2", "fd78::9") } else { ("192.168.77.1", "192.168.77.2", "192.168.77.9") };
    let mtu = if v6 { 1430 } else { 1450 };
    h.sluice_host_with(1, a1, &[a2.into()], "", &format!("vni = {VNI}"), mtu);
    h.sluice_host_with(2, a2, &[a1.into()], "", &format!("vni = {VNI}"), mtu);
    pings(&h, 1, 2);
    let forger = h.host(9);
    let ping = if v6 { "ping -6" } else { "ping" };
    ns_ok(&forger, &format!("{ping} -c 1 -W 5 {a1}"));
    let h1 = h.ns("h1");
    let vx = || h.port(1, "vx0");
    let refused = || vx()["counters"]["rx_drops"]["unknown_endpoint"].as_u64().unwrap();
    let kernel_drops = || vx()["device_drops"]["from_guest"].as_u64().unwrap();
    let (read0, errors0, refused0, drops0) =
        (udp_mib(&h1, v6, "InDatagrams"), udp_mib(&h1, v6, "InErrors"), refused(), kernel_drops());

    const N: u32 = 20_000;
    let flood = underlay_flood(&h, &forger, a9, a1, N);
    // The configured remote gets through meanwhile.
    pings(&h, 2, 1);
    let out = flood.wait_with_output().unwrap();
    assert!(out.status.success(), "the flood failed: {}", String::from_utf8_lossy(&out.stderr));
    let sent: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    assert!(sent >= u64::from(N) * 9 / 10, "the flood sent {sent} of {N}");
    assert!(
        wait_for(10, || refused() - refused0 >= sent),
        "{} of the {sent} datagrams counted unknown_endpoint: {}",
        refused() - refused0,
        vx()
    );
    let read = udp_mib(&h1, v6, "InDatagrams") - read0;
    assert!(read < 100, "the switch read {read} datagrams while {sent} came from an unknown host");
    assert_eq!(refused() - refused0, sent, "counted exactly: {}", vx());
    assert_eq!(udp_mib(&h1, v6, "InErrors") - errors0, sent, "the kernel dropped them");
    assert_eq!(kernel_drops(), drops0, "not counted again as the socket's drops: {}", vx());
    pings(&h, 1, 2);
    let st: serde_json::Value =
        serde_json::from_str(&sluice_ok(&["stats", "--switch", &h.switch(1), "--json"])).unwrap();
    assert_conserved(&st);
}

#[test]
#[ignore = "system tier: needs root (network namespaces, veth underlays and VXLAN devices), ping, ethtool and python3; scripts/test.sh runs it"]
fn a_flood_from_an_unknown_underlay_host_is_dropped_before_the_switch_reads_it() {
    a_flood_from_an_unknown_underlay_host_is_dropped_before_the_switch_reads_it_over(false);
}

#[test]
#[ignore = "system tier: needs root (network namespaces, veth underlays and VXLAN devices), ping, ethtool and python3; scripts/test.sh runs it"]
fn a_flood_from_an_unknown_underlay_host_is_dropped_before_the_switch_reads_it_over_ipv6() {
    a_flood_from_an_unknown_underlay_host_is_dropped_before_the_switch_reads_it_over(true);
}

#[test]
#[ignore = "system tier: needs root (network namespaces, veth underlays and VXLAN devices), ping and ethtool; scripts/test.sh runs it"]
fn lab_up_with_hosts_makes_one_lan_of_sluice_and_kernel_hosts_and_down_removes_it() {
    if !root() || !have("ethtool") {
        return;
    }
    init();
    let name = format!("vxl{}", std::process::id() % 100_000);
    let up = sluice(&["lab", "up", "--name", &name, "--hosts", "3", "--guests", "1", "--peer-kernel", "--json"]);
    // Taken down whatever happens below.
    struct Down(String);
    impl Drop for Down {
        fn drop(&mut self) {
            let _ = sluice(&["lab", "down", "--name", &self.0]);
        }
    }
    let _down = Down(name.clone());
    assert!(up.status.success(), "{}", String::from_utf8_lossy(&up.stderr));
    let exec = |g: &str, cmd: &str| {
        let mut a = vec!["lab", "exec", "--name", &name, g, "--"];
        a.extend(cmd.split_whitespace());
        sluice_ok(&a)
    };
    // h1 and h2 run sluice, h3 is a kernel vxlan device and bridge: every pair talks.
    exec("h1g1", "ping -c 2 -W 5 10.77.0.2");
    exec("h1g1", "ping -c 2 -W 5 10.77.0.3");
    exec("h3g1", "ping -c 2 -W 5 10.77.0.2");
    exec("h2g1", "ping -6 -c 2 -W 5 fd77::3");
    // Without --name, the lab of hosts is meant (its hosts are labs too; this test
    // process's run directory holds no other lab).
    let o = sluice(&["lab", "exec", "h2g1", "--", "true"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let fib = sluice_ok(&["fib", "show", "--switch", &format!("{name}h1")]);
    assert!(fib.contains("192.168.77.2") && fib.contains("192.168.77.3"), "endpoints of both other hosts: {fib}");
    // The hosts' switches run the kernel datapath (the lab's default), their tunnels too.
    let st: serde_json::Value =
        serde_json::from_str(&sluice_ok(&["stats", "--switch", &format!("{name}h2"), "--json"])).unwrap();
    assert_eq!(st["switch"]["datapath"], "kernel", "{st}");
    let vx = st["ports"].as_array().unwrap().iter().find(|p| p["name"] == "vx0").unwrap();
    assert!(vx["kernel"]["forwarded"].as_u64().unwrap() > 0, "the kernel forwarded from the tunnel: {vx}");
    sluice_ok(&["lab", "down", "--name", &name]);
    let left = sh_ok("ip netns list");
    assert!(!left.contains(&format!("sluice-{name}")), "left behind: {left}");
    assert!(!sluice(&["lab", "list"]).stdout.windows(name.len()).any(|w| w == name.as_bytes()));
}

// Each on both datapaths: the user-space one's tunnel is a UDP socket, the kernel one's a
// vxlan device in external mode fed by the TC programs' tunnel keys.
both_datapaths! {
    #[ignore = "system tier: needs root (network namespaces, veth underlays and VXLAN devices), ping, nc, tshark and ethtool; scripts/test.sh runs it"]
    fn a_sluice_host_and_a_kernel_vxlan_host_are_one_lan(dp: Dp) {
        a_sluice_host_and_a_kernel_vxlan_host_are_one_lan_on(dp == Dp::Kernel)
    }
}

both_datapaths! {
    #[ignore = "system tier: needs root (network namespaces, veth underlays and VXLAN devices), ping, nc, ethtool and python3; scripts/test.sh runs it"]
    fn two_sluice_hosts_and_a_kernel_host_flood_once_to_each(dp: Dp) {
        two_sluice_hosts_and_a_kernel_host_flood_once_to_each_on(dp == Dp::Kernel)
    }
}

both_datapaths! {
    #[ignore = "system tier: needs root (network namespaces, veth underlays and VXLAN devices), ping, tshark and ethtool; scripts/test.sh runs it"]
    fn an_ipv6_underlay_carries_a_vni_per_vlan(dp: Dp) {
        an_ipv6_underlay_carries_a_vni_per_vlan_on(dp == Dp::Kernel)
    }
}

both_datapaths! {
    #[ignore = "system tier: needs root (network namespaces, veth underlays and VXLAN devices), ping, nc, ethtool and Open vSwitch; scripts/test.sh runs it"]
    fn an_open_vswitch_host_is_a_tunnel_endpoint_like_any_other(dp: Dp) {
        an_open_vswitch_host_is_a_tunnel_endpoint_like_any_other_on(dp == Dp::Kernel)
    }
}

both_datapaths! {
    #[ignore = "system tier: needs root (network namespaces, veth underlays and VXLAN devices), ping, ethtool and python3; scripts/test.sh runs it"]
    fn an_underlay_host_not_among_the_remotes_is_neither_heard_nor_sent_to(dp: Dp) {
        an_underlay_host_not_among_the_remotes_is_neither_heard_nor_sent_to_on(dp == Dp::Kernel)
    }
}

both_datapaths! {
    #[ignore = "system tier: needs root (network namespaces, veth underlays and VXLAN devices), ethtool and python3; scripts/test.sh runs it"]
    fn a_remote_claiming_a_locked_local_station_does_not_move_it(dp: Dp) {
        a_remote_claiming_a_locked_local_station_does_not_move_it_on(dp == Dp::Kernel)
    }
}

both_datapaths! {
    #[ignore = "system tier: needs root (network namespaces, veth underlays and VXLAN devices), ethtool and python3; scripts/test.sh runs it"]
    fn a_vni_the_port_does_not_carry_is_its_vlan_filter_drop(dp: Dp) {
        a_vni_the_port_does_not_carry_is_its_vlan_filter_drop_on(dp == Dp::Kernel)
    }
}

both_datapaths! {
    #[ignore = "system tier: needs root (network namespaces, veth underlays and VXLAN devices), ping, ethtool, python3 and setpriv; scripts/test.sh runs it"]
    fn a_guests_udp_gso_broadcast_leaves_as_at_most_the_budget(dp: Dp) {
        a_guests_udp_gso_broadcast_leaves_as_at_most_the_budget_on(dp == Dp::Kernel)
    }
}

//! What only the kernel datapath has: forwarding that outlives its daemon (a restart in
//! place, a `kill -9` and a start), nothing left behind after `switch stop`, a veth deleted
//! behind the switch's back, a veth whose peer is the host's own, TAP and veth guests on
//! one switch, nothing reaching a guest through its veth but the switch's own frames, and
//! nothing reaching the upcall TAP's queue but the kernel datapath's.

mod common;

use common::*;

/// The name of switch `name`'s upcall TAP: `su` and the FNV-1a hash of the name.
fn upcall_tap(name: &str) -> String {
    let mut h: u32 = 0x811c_9dc5;
    for b in name.bytes() {
        h = (h ^ u32::from(b)).wrapping_mul(0x0100_0193);
    }
    format!("su{h:08x}")
}

#[test]
#[ignore = "system tier: needs root (network namespaces, veths and the kernel datapath's BPF programs), nc and python3; scripts/test.sh runs it"]
fn a_transfer_through_the_kernel_datapath_survives_a_restart_and_a_kill_and_stop_leaves_nothing() {
    if !root() {
        return;
    }
    let lab = Lab::on(Dp::Kernel, "rst", &["--guests", "2"]);
    let dir = scratch(&format!("rst-{}", lab.name));
    // The restart in place takes the kernel's state over; the kernel keeps forwarding
    // while no daemon runs.
    let again = transfers_cross_a_restart_and_a_kill(&lab, &dir, || {});
    assert_conserved(&lab.settled_stats());
    // A clean stop leaves nothing: no pins, no bpffs, no upcall TAP.
    sluice_ok(&["switch", "stop", "--switch", &lab.name]);
    let _ = again.take().wait();
    let pins = run_dir().join("bpf").join(&lab.name);
    assert!(!pins.exists(), "{} is left", pins.display());
    let upcall = upcall_tap(&lab.name);
    assert!(!sh_ok("ip -br link").contains(&upcall), "the upcall TAP {upcall} is left");
    // The bpffs is shared by every switch of this run directory (tests run side by side):
    // left mounted only while another switch's pins are on it.
    let bpffs = run_dir().join("bpf");
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
    if mounts.contains(&bpffs.display().to_string()) {
        let others = std::fs::read_dir(&bpffs).map(|d| d.count()).unwrap_or(0);
        assert!(others > 0, "the bpffs is left mounted with nothing on it");
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
#[ignore = "system tier: needs root (network namespaces, veths and the kernel datapath's BPF programs), ping; scripts/test.sh runs it"]
fn a_veth_deleted_behind_the_switchs_back_stops_its_port_and_nothing_else() {
    if !root() {
        return;
    }
    let lab = Lab::on(Dp::Kernel, "vdel", &["--guests", "3"]);
    ns_ok(&lab.ns(1), &format!("ping -c 2 -W 2 {}", lab.ip4(3)));
    sh_ok(&format!("ip link del {}", lab.tap(3)));
    let port = lab.tap(3);
    assert!(wait_for(10, || lab.port(&port)["failed"].is_string()), "the port is reported failed");
    let o = ns_sh(&lab.ns(1), &format!("ping -c 2 -W 1 {}", lab.ip4(3)));
    assert!(!o.status.success());
    ns_ok(&lab.ns(1), &format!("ping -c 2 -W 2 {}", lab.ip4(2)));
    let g1 = lab.port(&lab.tap(1));
    assert!(g1["counters"]["rx_drops"]["unknown_port"].as_u64().unwrap() > 0, "frames for it counted: {g1}");
    assert_conserved(&lab.settled_stats());
    sluice_ok(&["port", "del", &port, "--switch", &lab.name]);
}

#[test]
#[ignore = "system tier: needs root (network namespaces, veths and the kernel datapath's BPF programs), ping; scripts/test.sh runs it"]
fn tap_and_veth_guests_on_one_kernel_switch_reach_each_other() {
    if !root() {
        return;
    }
    let mut lab = Lab::on(Dp::Kernel, "mixd", &["--guests", "1"]);
    // A TAP guest beside the veth guest: frames between them go up and down.
    let ns = format!("sluice-{}-t", lab.name);
    let tap = format!("{}-t", lab.name);
    sh_ok(&format!("ip netns add {ns}"));
    struct Ns(String);
    impl Drop for Ns {
        fn drop(&mut self) {
            let _ = std::process::Command::new("ip").args(["netns", "del", &self.0]).output();
        }
    }
    let _ns = Ns(ns.clone());
    sluice_ok(&["port", "add", &tap, "--netns", &ns, "--switch", &lab.name]);
    ns_ok(
        &ns,
        &format!("ip link set lo up && ip addr add 10.77.0.60/24 dev {tap} && ip addr add fd77::60/64 dev {tap} nodad"),
    );
    ns_ok(&lab.ns(1), "ping -c 2 -W 2 10.77.0.60");
    ns_ok(&ns, &format!("ping -6 -c 2 -W 2 {}", lab.ip6(1)));
    let v = lab.port(&lab.tap(1));
    assert_eq!(v["kind"], "veth");
    assert_eq!(lab.port(&tap)["kind"], "tap");
    assert_conserved(&lab.settled_stats());
    let _ = &mut lab;
}

/// Deletes a veth pair made by a test (either end takes both), even when the test fails.
struct VethPair(String);

impl Drop for VethPair {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip").args(["link", "del", &self.0]).output();
    }
}

#[test]
#[ignore = "system tier: needs root (network namespaces, veths and the kernel datapath's BPF programs), python3; scripts/test.sh runs it"]
fn a_veth_whose_peer_is_in_the_switchs_namespace_is_reached_in_the_kernel() {
    if !root() {
        return;
    }
    let lab = Lab::on(Dp::Kernel, "vhere", &["--guests", "1"]);
    // The peer stays in the switch's (the test's) namespace: bpf_redirect_peer cannot
    // reach it, so the kernel must send to this port as to any device.
    let (port, peer) = (format!("{}-h", lab.name), format!("{}-p", lab.name));
    sh_ok(&format!("ip link add {port} type veth peer name {peer} && ip link set {peer} up"));
    let _pair = VethPair(peer.clone());
    sluice_ok(&["port", "add", &port, "--type", "veth", "--switch", &lab.name]);
    let (g1, g1ns) = (lab.tap(1), lab.ns(1));
    let (gmac, pmac) = (mac_of(&g1ns, &g1), mac_of("", &peer));
    let hex = |m: [u8; 6]| m.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":");
    // Both stations speak once, so the core learns them and the kernel has their entries.
    assert!(wait_for(10, || {
        send_raw("", &peer, &[frame([0xff; 6], pmac, None, 0x88b5, b"host side")]);
        send_raw(&g1ns, &g1, &[frame([0xff; 6], gmac, None, 0x88b5, b"guest")]);
        let fib = sluice_ok(&["fib", "show", "--json", "--switch", &lab.name]);
        fib.contains(&hex(pmac)) && fib.contains(&hex(gmac))
    }));
    let forwarded = |name: &str| lab.port(name)["kernel"]["forwarded"].as_u64().unwrap();
    // The first frame of its kind goes up, and the core installs its verdict in the kernel.
    let l = listen_raw("", &peer, 0x88b5, 2.0);
    send_raw(&g1ns, &g1, &[frame(pmac, gmac, None, 0x88b5, b"the first")]);
    assert_eq!(received(l).iter().filter(|(_, f)| f[..6] == pmac && f[6..12] == gmac).count(), 1);
    let before = forwarded(&g1);
    let l = listen_raw("", &peer, 0x88b5, 3.0);
    send_raw(&g1ns, &g1, &vec![frame(pmac, gmac, None, 0x88b5, b"to the host side"); 20]);
    let got = received(l);
    let mine = got.iter().filter(|(_, f)| f[..6] == pmac && f[6..12] == gmac).count();
    assert_eq!(mine, 20, "every frame reached the peer in the switch's namespace");
    assert!(forwarded(&g1) >= before + 20, "the kernel forwarded them: {}", lab.port(&g1));
    // And back: into the guest's namespace, as for any veth guest.
    let l = listen_raw(&g1ns, &g1, 0x88b5, 3.0);
    send_raw("", &peer, &vec![frame(gmac, pmac, None, 0x88b5, b"to the guest"); 20]);
    let got = received(l);
    assert_eq!(got.iter().filter(|(_, f)| f[6..12] == pmac).count(), 20);
    assert_conserved(&lab.settled_stats());
    // Deleted, its counters (the kernel's part too) join the departed ports' totals.
    sluice_ok(&["port", "del", &port, "--switch", &lab.name]);
    assert_conserved(&lab.settled_stats());
}

#[test]
#[ignore = "system tier: needs root (network namespaces, veths and the kernel datapath's BPF programs), ping, python3 and setpriv; scripts/test.sh runs it"]
fn nothing_but_the_switch_reaches_a_guest_through_its_veth() {
    if !root() || !have("setpriv") {
        return;
    }
    let lab = Lab::on(Dp::Kernel, "egr", &["--guests", "3"]);
    let (g1, g1ns) = (lab.tap(1), lab.ns(1));
    // Guest 1 listens on UDP port 9999 for anything: broadcast or unicast.
    let listen = "import socket, select\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\ns.bind(('0.0.0.0', 9999))\nprint('ready', flush=True)\nn = 0\nwhile select.select([s], [], [], 3)[0]:\n    s.recv(2048)\n    n += 1\nprint(n, flush=True)\n";
    let mut guest = std::process::Command::new("ip")
        .args(["netns", "exec", &g1ns, "python3", "-c", listen])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(guest.stdout.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut out, &mut line).unwrap();
    assert_eq!(line.trim(), "ready");
    // The host's route to guest 1 on its veth, as root could set it (the switch's end has
    // no address, so nothing else would resolve it).
    let gmac = mac_of(&g1ns, &g1).map(|b| format!("{b:02x}")).join(":");
    sh_ok(&format!("ip neigh replace {} lladdr {gmac} dev {g1} nud permanent", lab.ip4(1)));
    let refused = || lab.port(&g1)["counters"]["rx_drops"]["egress_refused"].as_u64().unwrap_or(0);
    let before = refused();
    // An unprivileged user in the switch's namespace binds sockets to the switch's end of
    // guest 1's veth (SO_BINDTODEVICE needs no privilege since Linux 5.7) and sends a
    // broadcast (a rogue DHCP server's way) and a unicast.
    let send = format!(
        "import socket\nfor to in ['255.255.255.255', '{}']:\n    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n    s.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, b'{g1}')\n    s.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)\n    for _ in range(5):\n        s.sendto(b'from the host side', (to, 9999))\n",
        lab.ip4(1)
    );
    let o = std::process::Command::new("setpriv")
        .args(["--reuid=nobody", "--regid=nogroup", "--clear-groups", "/usr/bin/python3", "-c", &send])
        .output()
        .unwrap();
    assert!(o.status.success(), "the unprivileged sender: {}", String::from_utf8_lossy(&o.stderr));
    let mut line = String::new();
    std::io::BufRead::read_line(&mut out, &mut line).unwrap();
    let _ = guest.wait();
    assert_eq!(line.trim(), "0", "datagrams the guest received from the host side");
    assert!(wait_for(5, || refused() >= before + 10), "refused and counted: {}", lab.port(&g1));
    // Everything the switch sends still arrives: unicast in the kernel (into the guest's
    // namespace directly), a flood in the kernel (a clone to one guest, the frame itself to
    // the other), the core's frames through its packet socket (a TAP guest's, which go up
    // and down).
    ns_ok(&g1ns, &format!("ping -c 2 -W 2 {}", lab.ip4(2)));
    ns_ok(&lab.ns(2), &format!("ping -6 -c 2 -W 2 {}", lab.ip6(1)));
    let src = mac_of(&g1ns, &g1);
    let flooded = || lab.port(&g1)["kernel"]["flooded"].as_u64().unwrap();
    // (The first frame of its kind goes up: the core floods it and installs its verdict.)
    let first: Vec<_> = [2, 3].iter().map(|&g| listen_raw(&lab.ns(g), &lab.tap(g), 0x88b5, 2.0)).collect();
    send_raw(&g1ns, &g1, &[frame([0xff; 6], src, None, 0x88b5, b"flooded by the core")]);
    for l in first {
        assert_eq!(received(l).iter().filter(|(_, f)| f[6..12] == src).count(), 1);
    }
    let before = flooded();
    let listeners: Vec<_> = [2, 3].iter().map(|&g| listen_raw(&lab.ns(g), &lab.tap(g), 0x88b5, 2.0)).collect();
    send_raw(&g1ns, &g1, &[frame([0xff; 6], src, None, 0x88b5, b"flooded in the kernel")]);
    for l in listeners {
        let got = received(l);
        assert_eq!(got.iter().filter(|(_, f)| f[6..12] == src).count(), 1, "{got:?}");
    }
    assert!(flooded() > before, "the kernel flooded it: {}", lab.port(&g1));
    let tap = format!("{}-t", lab.name);
    let ns = format!("sluice-{}-t", lab.name);
    sh_ok(&format!("ip netns add {ns}"));
    struct Ns(String);
    impl Drop for Ns {
        fn drop(&mut self) {
            let _ = std::process::Command::new("ip").args(["netns", "del", &self.0]).output();
        }
    }
    let _ns = Ns(ns.clone());
    sluice_ok(&["port", "add", &tap, "--netns", &ns, "--switch", &lab.name]);
    ns_ok(&ns, &format!("ip link set lo up && ip addr add 10.77.0.60/24 dev {tap}"));
    ns_ok(&ns, &format!("ping -c 2 -W 2 {}", lab.ip4(1)));
    assert_conserved(&lab.settled_stats());
}

/// Floods the upcall TAP `tap` as an unprivileged user (`nobody`): UDP to the limited
/// broadcast and the all-hosts group from sockets bound to it (`SO_BINDTODEVICE` needs no
/// privilege since Linux 5.7), until `max` datagrams are sent or its stdin closes (at most
/// two minutes). It prints `flooding` once started and, at its end, how many it sent.
fn flood_as_nobody(tap: &str, max: u64) -> (smc::Killed, std::io::BufReader<std::process::ChildStdout>) {
    let script = format!(
        "import socket, sys, threading, time\n\
         stop = threading.Event()\n\
         threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()\n\
         socks = []\n\
         for to in ['255.255.255.255', '224.0.0.1']:\n    \
             s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n    \
             s.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, b'{tap}')\n    \
             s.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)\n    \
             socks.append((s, (to, 9999)))\n\
         n, end = 0, time.monotonic() + 120\n\
         print('flooding', flush=True)\n\
         while n < {max} and not stop.is_set() and time.monotonic() < end:\n    \
             for s, to in socks:\n        \
                 s.sendto(b'not the kernel datapath', to)\n        \
                 n += 1\n\
         print(n, flush=True)\n"
    );
    let mut child = std::process::Command::new("setpriv")
        .args(["--reuid=nobody", "--regid=nogroup", "--clear-groups", "/usr/bin/python3", "-c", &script])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut out, &mut line).unwrap();
    assert_eq!(line.trim(), "flooding", "the unprivileged sender did not start");
    (smc::Killed(child), out)
}

/// Ends a flood of [`flood_as_nobody`]: how many datagrams it sent.
fn flood_sent(mut flood: smc::Killed, mut out: std::io::BufReader<std::process::ChildStdout>) -> u64 {
    drop(flood.0.stdin.take());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut out, &mut line).unwrap();
    let _ = flood.take().wait();
    line.trim().parse().unwrap_or_else(|_| panic!("the sender's count: {line:?}"))
}

#[test]
#[ignore = "system tier: needs root (network namespaces, veths and the kernel datapath's BPF programs), ping, python3 and setpriv; scripts/test.sh runs it"]
fn only_the_kernel_datapath_reaches_the_upcall_tap() {
    if !root() || !have("setpriv") {
        return;
    }
    let mut lab = Lab::on(Dp::Kernel, "upg", &["--guests", "2"]);
    let tap = upcall_tap(&lab.name);
    let counts = |lab: &Lab| {
        let k = lab.stats()["kernel"].clone();
        (k["upcall_egress_refused"].as_u64().unwrap_or(0), k["upcalls_refused"].as_u64().unwrap())
    };
    let (refused, read_refused) = counts(&lab);
    // While an unprivileged user floods the upcall TAP, the switch works as before: guests
    // reach each other, and a new guest is learned (its first frames go up).
    let (flood, out) = flood_as_nobody(&tap, u64::MAX);
    ns_ok(&lab.ns(1), &format!("ping -c 3 -i 0.2 -W 2 {}", lab.ip4(2)));
    ns_ok(&lab.ns(2), &format!("ping -6 -c 3 -i 0.2 -W 2 {}", lab.ip6(1)));
    let (ns, port) = lab.add_guest("n", &[], Some("10.77.0.50"));
    ns_ok(&ns, &format!("ping -c 3 -i 0.2 -W 2 {}", lab.ip4(1)));
    let mac = mac_of(&ns, &port).map(|b| format!("{b:02x}")).join(":");
    assert!(sluice_ok(&["fib", "show", "--json", "--switch", &lab.name]).contains(&mac), "guest {port} learned");
    ns_ok(&lab.ns(2), "ping -c 3 -i 0.2 -W 2 10.77.0.50");
    let sent = flood_sent(flood, out);
    assert!(sent > 0);
    // Every datagram refused at the TAP's egress and counted; none reached the daemon.
    let (refused_now, read_refused_now) = counts(&lab);
    eprintln!("{sent} datagrams sent through the upcall TAP: {}", lab.stats()["kernel"]);
    assert!(
        refused_now >= refused + sent,
        "{sent} sent, {} refused at the upcall TAP: {}",
        refused_now - refused,
        lab.stats()["kernel"]
    );
    assert_eq!(read_refused_now, read_refused, "frames the daemon read and refused: {}", lab.stats()["kernel"]);
    assert_conserved(&lab.settled_stats());
    // A restart in place keeps the guard: the new daemon takes its link over.
    let pid = lab.stats()["switch"]["pid"].as_u64().unwrap();
    sluice_ok(&["switch", "restart", "--switch", &lab.name]);
    assert_eq!(lab.stats()["switch"]["pid"].as_u64().unwrap(), pid);
    ns_ok(&lab.ns(1), &format!("ping -c 2 -W 2 {}", lab.ip4(2)));
    let (refused, read_refused) = counts(&lab);
    let (flood, out) = flood_as_nobody(&tap, 2000);
    let sent = flood_sent(flood, out);
    let (refused_now, read_refused_now) = counts(&lab);
    assert!(refused_now >= refused + sent, "{sent} sent after the restart: {}", lab.stats()["kernel"]);
    assert_eq!(read_refused_now, read_refused, "after the restart: {}", lab.stats()["kernel"]);
    ns_ok(&ns, &format!("ping -c 2 -W 2 {}", lab.ip4(2)));
}

//! The program in a real kernel, without the daemon: two namespaces on veth pairs, the
//! program on the switch sides, entries written by hand as the core would — frames pass
//! on the fast path, floods stay in the kernel, and a frame the tables cannot decide goes
//! up the upcall interface with its port slot as an outer tag — through the egress program
//! guarding that interface, which refuses and counts whatever else is sent through it.

use std::process::Command;

mod common;

use common::{Bpffs, root};
use sluice_ebpf::{KernelDatapath, abi, tables};
use sluice_switch::{FastPort, IpRule, VlanMode};
use sluice_wire::MacAddr;

fn sh(cmd: &str) -> String {
    let o = Command::new("sh").args(["-c", cmd]).output().unwrap();
    assert!(o.status.success(), "`{cmd}` failed: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

/// Two guest namespaces `T-a`, `T-b` on veths `Ta`/`Tb` (switch sides here), removed on drop.
struct Guests(String);

impl Guests {
    fn new() -> Guests {
        let t = format!("ke{}", std::process::id() % 100_000);
        for g in ["a", "b"] {
            sh(&format!(
                "ip netns add {t}-{g} && ip link add {t}{g} type veth peer name eth0 netns {t}-{g} && \
                 ip link set {t}{g} up && ip -n {t}-{g} link set eth0 up && ip -n {t}-{g} link set lo up && \
                 sysctl -qw net.ipv6.conf.{t}{g}.disable_ipv6=1"
            ));
        }
        sh(&format!("ip -n {t}-a addr add 10.98.0.1/24 dev eth0 && ip -n {t}-b addr add 10.98.0.2/24 dev eth0"));
        Guests(t)
    }

    fn mac(&self, g: &str) -> MacAddr {
        sh(&format!("ip -n {}-{g} -br link show eth0 | awk '{{print $3}}'", self.0)).parse().unwrap()
    }

    fn ifindex(&self, g: &str) -> u32 {
        sh(&format!("cat /sys/class/net/{}{g}/ifindex", self.0)).parse().unwrap()
    }
}

impl Drop for Guests {
    fn drop(&mut self) {
        for g in ["a", "b"] {
            let _ = Command::new("ip").args(["netns", "del", &format!("{}-{g}", self.0)]).output();
            let _ = Command::new("ip").args(["link", "del", &format!("{}{g}", self.0)]).output();
        }
        let _ = Command::new("ip").args(["link", "del", &format!("{}up", self.0)]).output();
    }
}

fn port(ifindex: u32) -> FastPort {
    FastPort {
        target: Some(ifindex),
        vlan: VlanMode::Access(1),
        mtu: 1500,
        isolated: false,
        uplink: false,
        mac: None,
        ips: IpRule::Any,
        slow: false,
        failed: false,
        dev_mac: None,
        guest_mac: None,
        link_local_ok: false,
        mirror: None,
        learn_full: false,
    }
}

#[test]
fn known_unicast_crosses_in_the_kernel_and_the_rest_goes_up() {
    if !root() {
        return;
    }
    let g = Guests::new();
    let pins = Bpffs::new("sluice-ebpf-test");
    let mut dp = KernelDatapath::open(&pins.0, 1024).unwrap();
    let (a, b) = (format!("{}a", g.0), format!("{}b", g.0));
    dp.attach(&a).unwrap();
    dp.attach(&b).unwrap();
    dp.set_port(0, &tables::port_entry(&port(g.ifindex("a")), abi::MODE_L2, None)).unwrap();
    dp.set_port(1, &tables::port_entry(&port(g.ifindex("b")), abi::MODE_L2, None)).unwrap();
    dp.set_mac(1, g.mac("a"), 0, false).unwrap();
    dp.set_mac(1, g.mac("b"), 1, false).unwrap();
    // Neighbours by hand: ARP (broadcast) would go up, and nothing reads the upcalls here.
    sh(&format!("ip -n {t}-a neigh add 10.98.0.2 lladdr {} dev eth0 nud permanent", g.mac("b"), t = g.0));
    sh(&format!("ip -n {t}-b neigh add 10.98.0.1 lladdr {} dev eth0 nud permanent", g.mac("a"), t = g.0));
    let out = sh(&format!("ip netns exec {}-a ping -c 3 -i 0.2 -W 2 10.98.0.2", g.0));
    assert!(out.contains("3 received"), "{out}");
    let ca = dp.counters(0);
    assert!(ca.v[abi::c::FORWARDED] >= 3, "{ca:?}");
    assert_eq!(dp.counters(1).v[abi::c::TX_FRAMES], ca.v[abi::c::FORWARDED]);
    // The program stamped the sources it forwarded from.
    assert!(dp.macs().iter().all(|m| m.4 > 0), "{:?}", dp.macs());

    // An upcall interface (a veth here; its peer's counters show what arrived, besides
    // the ports' `upcalls`).
    let up = format!("{}up", g.0);
    sh(&format!(
        "ip link add {up} type veth peer name {up}p && sysctl -qw net.ipv6.conf.{up}.disable_ipv6=1 && \
         ip link set {up} up && ip link set {up}p up"
    ));
    let upcall = sh(&format!("cat /sys/class/net/{up}/ifindex")).parse().unwrap();
    dp.set_config(upcall, abi::MODE_L2, MacAddr([2, 0, 0, 0, 0, 1]), None, 2).unwrap();
    // Guarded as the daemon guards its upcall TAP: what the program redirects there passes
    // the interface's egress hook (marked), and nothing else does.
    dp.attach_egress(&up).unwrap();
    let went_up = |dp: &KernelDatapath| -> u64 {
        let arrived: u64 = sh(&format!("cat /sys/class/net/{up}p/statistics/rx_packets")).parse().unwrap();
        let sent = dp.counters(0).v[abi::c::UPCALLS] + dp.counters(1).v[abi::c::UPCALLS];
        assert!(arrived >= sent, "{sent} sent up, {arrived} arrived");
        sent
    };

    // A broadcast from a known source: flooded by the kernel to the other port.
    let (before, b_tx) = (went_up(&dp), dp.counters(1).v[abi::c::TX_FRAMES]);
    let _ = Command::new("ip")
        .args(["netns", "exec", &format!("{}-a", g.0), "ping", "-c", "1", "-W", "1", "-b", "10.98.0.255"])
        .output();
    assert!(dp.counters(0).v[abi::c::FLOODED] >= 1, "{:?}", dp.counters(0));
    assert!(dp.counters(1).v[abi::c::TX_FRAMES] > b_tx, "{:?}", dp.counters(1));
    assert_eq!(went_up(&dp), before, "a flood the kernel can do went up");

    // A source the table does not know on its port goes up: learning is the core's.
    dp.del_mac(1, g.mac("a"));
    let before = went_up(&dp);
    let _ = Command::new("ip")
        .args(["netns", "exec", &format!("{}-a", g.0), "ping", "-c", "1", "-W", "1", "10.98.0.2"])
        .output();
    assert!(went_up(&dp) > before, "nothing went up");
    assert!(dp.counters(0).v[abi::c::UPCALLS] >= 1, "{:?}", dp.counters(0));

    // Unless its port may learn no more: then the kernel forwards it unlearned, and b's
    // replies to the unknown address are flooded back to a.
    let full = FastPort { learn_full: true, ..port(g.ifindex("a")) };
    dp.set_port(0, &tables::port_entry(&full, abi::MODE_L2, None)).unwrap();
    let (before, refused) = (went_up(&dp), dp.counters(0).v[abi::c::LEARN_REFUSED]);
    let out = sh(&format!("ip netns exec {}-a ping -c 3 -i 0.2 -W 2 10.98.0.2", g.0));
    assert!(out.contains("3 received"), "{out}");
    assert!(dp.counters(0).v[abi::c::LEARN_REFUSED] >= refused + 3, "{:?}", dp.counters(0));
    assert!(dp.counters(1).v[abi::c::FLOODED] >= 3, "{:?}", dp.counters(1));
    assert_eq!(went_up(&dp), before, "frames of a full port's unlearned sources went up");

    // Datagrams a socket bound to the upcall interface sends are refused at its egress and
    // counted as the switch's; none arrives.
    let arrived = || -> u64 { sh(&format!("cat /sys/class/net/{up}p/statistics/rx_packets")).parse().unwrap() };
    let (before, refused) = (arrived(), dp.switch_counters().v[abi::s::UPCALL_EGRESS_REFUSED]);
    let send = format!(
        "import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\
         s.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, b'{up}')\n\
         s.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)\n\
         for _ in range(10):\n    s.sendto(b'not an upcall', ('255.255.255.255', 9999))\n"
    );
    let o = Command::new("python3").args(["-c", &send]).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(dp.switch_counters().v[abi::s::UPCALL_EGRESS_REFUSED], refused + 10);
    assert_eq!(arrived(), before, "datagrams sent through the upcall interface arrived");
    // The port's own counters are not touched by it; a frame the program hands up still
    // goes through.
    dp.set_port(0, &tables::port_entry(&port(g.ifindex("a")), abi::MODE_L2, None)).unwrap();
    let (before, at_peer) = (went_up(&dp), arrived());
    let _ = Command::new("ip")
        .args(["netns", "exec", &format!("{}-a", g.0), "ping", "-c", "1", "-W", "1", "10.98.0.2"])
        .output();
    assert!(went_up(&dp) > before && arrived() > at_peer, "nothing went up");
}

#[test]
fn a_program_the_verifier_refuses_is_reported_with_its_reason() {
    if !root() {
        return;
    }
    static REJECTED: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/rejected.o"));
    let pins = Bpffs::new("sluice-ebpf-rej");
    let e = KernelDatapath::open_object(REJECTED, &pins.0, 16).err().expect("the verifier refuses it");
    drop(pins);
    let msg = e.to_string();
    assert!(msg.contains("loading the kernel datapath") && msg.contains("verifier said"), "{msg}");
    assert!(msg.contains("invalid access to packet"), "the verifier's own words: {msg}");
}

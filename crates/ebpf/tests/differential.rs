//! Core and kernel never disagree (docs/architecture.md, "One brain: the kernel executes
//! the core's verdicts", *As built: the differential test*).
//!
//! Seeded switches — Layer 2 and 3; access, trunk and native VLANs; isolated ports, ports
//! that drop EtherTypes, `mac` locks, IP rules (given and learned), learning limits, a
//! small MAC table, static stations, mirrors, uplinks with and without a device address,
//! ports that forward some IEEE link-local addresses (pause and LACP among the asked),
//! ports with storm control and rate limits at rates no run reaches (marked verdicts and
//! paced outputs executed alike), security groups (rules by address, protocol, port and
//! ICMP type, allow, deny and allow-related, defaults; each switch's connections in a
//! conntrack zone of its own, the core told of the kernel's tracker),
//! VXLAN tunnel ports (one VNI or one per VLAN, open or to their endpoints alone, IPv4 or
//! IPv6 underlay; EVPN tunnels, whose routes — stations behind announced endpoints, per-VNI
//! flood lists — change every eighth frame) — and seeded frames — unicast to known and unknown stations, group,
//! IEEE link-local (01:80:C2:00:00:00 to 0F, and 10 just past them), to
//! the input's own address; frames of connections (TCP segments with each kind of flags,
//! UDP, ICMP echo) opened, repeated and answered; IGMP and MLD (v1 and v2 reports, done,
//! queries; with and without a hop-by-hop header; good and bad checksums); untagged, tagged
//! and priority-tagged; IPv4, IPv6, ARP, neighbour discovery, other EtherTypes; GSO frames whose segments are sized around each
//! output's MTU; frames cut short, with trailing bytes, with IP options and extension
//! headers; into a tunnel port, from a datagram of a VNI it carries or not, sent by one of
//! its endpoints or a stranger (the kernel's run given the tunnel key a VXLAN device
//! leaves). For each frame:
//!
//! 1. the core (a `Switch` with in-memory ports) receives it and records its key, its
//!    verdict, the copy each port was sent and every port's counters;
//! 2. the kernel's maps are written from the same switch with `sluice_ebpf::convert`, as
//!    the daemon will: the changes the core reports, and the generation;
//! 3. `sluice_exec` runs on the same frame (`BPF_PROG_TEST_RUN`). If the verdicts for the
//!    frame's keys are installed and current, this is a hit and must do what the core did;
//!    else it must be a miss (counted, up). After a miss the verdicts are installed as the
//!    daemon will after an upcall, and it runs again, and must do what the core did;
//! 4. what it did: its return code, the frame it left and its mark, every copy it sent
//!    (device, tag, MAC addresses: one packet socket on every device of the test's
//!    namespace reads them as each device's egress takes them, within the run) and every
//!    counter of every port. A test run carries out no redirect, so the last output's copy
//!    is seen in one more run of the same verdict with `V_HOST`, where every output gets a
//!    clone.
//!
//! Out of a tunnel, known unicast is sent by the kernel to the endpoint its remote table
//! has the destination behind, or goes up when it has none there; a flood's copy into a
//! tunnel (of one to three endpoints) is sent once per endpoint of the tunnel's flood set
//! (or to the one the remote table has the destination behind), counted as one frame; a
//! mirror's copy or a routed frame into a tunnel goes up. The kernel's reports of stations heard behind a
//! tunnel are handed to the core after each frame, as the daemon does (on one switch in
//! three they are left unread); a station the frame taught the core must have been
//! reported. After each frame, every EVPN tunnel's stations in the kernel's remote table
//! and its flood sets must be the core's, as the daemon writes them from the changes the
//! core reports.
//!
//! At the end of each switch the generation moves on in the kernel alone: every frame
//! with a key is then a miss. A frame the core drops before it has a key (not valid, a GSO
//! frame it will not cut) must be dropped by the kernel for the same cause, handed up, or
//! — the host's own — left to the host; never sent anywhere.
//!
//! What a test run cannot show, and how the test reads it instead: its frame is at most a
//! page (frames here are at most 3,600 bytes, so a GSO frame has at most about 70
//! segments: the 1,024-segment bound is beyond reach); it refuses frames shorter than an
//! Ethernet header and untagged IP frames shorter than their IP header (left to the core,
//! and counted); and its GSO frame has a size but no GSO type, which a device's egress
//! refuses: a GSO frame's clones are counted as transmit errors, so for GSO frames the
//! MTU decision of every output is checked from the counters, and the copy of the last
//! output (returned by the run) alone. A frame the kernel could not be given (a
//! checksum to complete past the end of the frame) is not generated.
//!
//! `SLUICE_DIFF_CASES` (default 100,000) and `SLUICE_DIFF_SEED` set the run;
//! `SLUICE_DIFF_SWITCH` runs one switch of it alone. A disagreement prints how to run it
//! again, the switch, the frame (hex) and both sides.

mod common;
mod packet;

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsRawFd, OwnedFd};
use std::process::Command;
use std::time::Instant;

use common::{Bpffs, root};
use sluice_ebpf::abi::{self, c};
use sluice_ebpf::convert::{self, Device, Place, Reach};
use sluice_ebpf::exec::{Executor, Ran, RunCtx, Sizes, UpcallBudget};
use sluice_switch::acl::{AclAction, AclRuleSpec, Dir};
use sluice_switch::conntrack::KernelTracker;
use sluice_switch::mem::{MemHandle, mem_port};
use sluice_switch::tunnel::{self, TunnelRules, VniMap};
use sluice_switch::{
    Action, DEFAULT_ROUTER_MAC, DropCause, FastChange, FastPort, Key, Mode, PortCaps, PortConfig, PortCounters, PortId,
    PortPolicy, Switch, SwitchConfig, Upcall, Verdict, VlanMode,
};
use sluice_switch::{RateLimit, StormControl};
use sluice_wire::neigh::{self, NdFields};
use sluice_wire::{MacAddr, VnetHdr};

/// `TC_ACT_OK`, `TC_ACT_SHOT`, `TC_ACT_REDIRECT`.
const OK: u32 = 0;
const SHOT: u32 = 2;
const REDIRECT: u32 = 7;

const DEFAULT_CASES: u64 = 100_000;
const DEFAULT_SEED: u64 = 0x51ce_d1ff;
/// The most ports a switch has: one switch in 20 has more than a verdict has outputs
/// (its floods go up).
const MAX_SWITCH_PORTS: usize = 20;
const FRAMES_PER_SWITCH: usize = 200;
/// The longest frame a test run takes: a page, less the skb's head and tail room.
const MAX_FRAME: usize = 3600;
/// Each switch's generations in the kernel start this far past the last one's, so that
/// none of its verdicts is ever current again.
const GENERATIONS_PER_SWITCH: u64 = 1 << 32;

const OFFLOAD: PortCaps = PortCaps { offload: true, lossless_input: false };

// ---------------------------------------------------------------------------------------
// A seeded generator.

/// splitmix64: small, fast, and the same sequence from the same seed everywhere.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// In `0..n` (`n` > 0).
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// In `lo..=hi`.
    fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + self.below(hi - lo + 1)
    }

    fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }

    fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len())]
    }
}

// ---------------------------------------------------------------------------------------
// Switches.

#[derive(Clone, Debug)]
struct PortSpec {
    vlan: VlanMode,
    mtu: u16,
    uplink: bool,
    isolated: bool,
    dev_mac: Option<MacAddr>,
    mac: Option<MacAddr>,
    ips: Vec<IpAddr>,
    learn_ips: bool,
    mirror_of: Option<usize>,
    drop_ethertypes: Vec<u16>,
    /// `forward_link_local`: a bit per last byte of 01:80:C2:00:00:0X.
    forward_link_local: u16,
    /// Storm control, at rates no run reaches: marked verdicts must execute as unmarked
    /// ones (the metering itself is exec.rs's and the core's own tests').
    storm: StormControl,
    /// Rate limits, at rates no run reaches: verdicts charged to `rate_in` and paced
    /// outputs (by the device's egress) must deliver as the core does.
    rate: RateLimit,
    reach: Reach,
    slot: u16,
    /// A VXLAN tunnel's port (reached as `Reach::Tunnel`).
    tunnel: Option<TunnelSpec>,
}

/// A tunnel port's rules and its underlay address.
#[derive(Clone, Debug)]
struct TunnelSpec {
    rules: TunnelRules,
    local: IpAddr,
}

/// The VNI a per-VLAN tunnel carries VLAN `vid` in, and the one VNI of a tunnel with one.
fn vni_for(vid: u16) -> u32 {
    5000 + u32::from(vid)
}

/// A tunnel's configured endpoint `n` (1 to 3), one an EVPN tunnel's routes name (4, 5),
/// a stranger (any other `n`), IPv4 or IPv6.
fn endpoint(n: u8, v6: bool) -> IpAddr {
    if v6 { Ipv6Addr::new(0xfd78, 0, 0, 0, 0, 0, 0, n.into()).into() } else { Ipv4Addr::new(192, 0, 2, n).into() }
}

/// A tunnel: one VNI (an access port) or a VNI per VLAN (a trunk of those VLANs, as the
/// daemon makes it), open to any sender or to its endpoints alone, with one to three
/// endpoints, over IPv4 (one in five over IPv6). One in three is an EVPN tunnel, to its
/// endpoints alone, whose routes name two more (4 and 5).
fn gen_tunnel(r: &mut Rng) -> (VlanMode, TunnelSpec) {
    let v6 = r.chance(20);
    let (vlan, vnis) = if r.chance(50) {
        let vid = r.range(1, 3) as u16;
        (VlanMode::Access(vid), VniMap::Single(vni_for(vid)))
    } else {
        let mut vids: Vec<u16> = (1..=4u16).filter(|_| r.chance(50)).collect();
        if vids.is_empty() {
            vids.push(1);
        }
        let pairs = vids.iter().map(|&v| (v, vni_for(v))).collect();
        (VlanMode::Trunk { allowed: vids.into_iter().collect(), native: None }, VniMap::PerVlan(pairs))
    };
    let remotes = (1..=r.range(1, 3) as u8).map(|n| endpoint(n, v6)).collect();
    let evpn = r.chance(33);
    let announced = if evpn { vec![endpoint(4, v6), endpoint(5, v6)] } else { vec![] };
    let rules = TunnelRules { vnis, remotes_only: evpn || r.chance(50), remotes, evpn, announced };
    (vlan, TunnelSpec { rules, local: endpoint(100, v6) })
}

#[derive(Clone, Debug)]
struct SwitchSpec {
    mode: Mode,
    ports: Vec<PortSpec>,
    port_mac_limit: usize,
    fib_max: usize,
    statics: Vec<(u16, MacAddr, usize)>,
    /// The kernel's reports of stations heard behind a tunnel are left unread.
    forget_heard: bool,
    /// Security groups: rules by port index, and defaults.
    acls: Vec<(usize, AclRuleSpec)>,
    acl_defaults: Vec<AclDefault>,
}

/// A port's default action for a direction.
type AclDefault = (usize, Dir, AclAction);

/// Security groups for a switch of `n` ports: rules naming the frames' addresses, ports
/// and ICMP types, allow, deny and allow-related, either way, with priorities; defaults.
fn gen_acls(r: &mut Rng, n: usize) -> (Vec<(usize, AclRuleSpec)>, Vec<AclDefault>) {
    let mut rules = Vec::new();
    for _ in 0..r.range(1, 8) {
        let proto = r.pick(&[None, Some("tcp"), Some("tcp"), Some("udp"), Some("icmp"), Some("icmp6")]);
        let v6 = proto == Some("icmp6") || (proto != Some("icmp") && r.chance(30));
        let prefix = |r: &mut Rng| -> Option<String> {
            r.chance(40).then(|| {
                let k = r.below(n + 2);
                match (v6, r.below(3)) {
                    (false, 0) => format!("{}/32", guest_v4(k)),
                    (false, 1) => "10.0.0.0/29".to_string(),
                    (false, _) => "192.0.2.0/30".to_string(),
                    (true, 0) => format!("{}/128", guest_v6(k)),
                    (true, 1) => "fd00::/125".to_string(),
                    (true, _) => "2001:db8::/126".to_string(),
                }
            })
        };
        let (src, dst) = (prefix(r), prefix(r));
        let typed = proto.is_none() && src.is_none() && dst.is_none() && r.chance(30);
        let ports = matches!(proto, Some("tcp" | "udp")) && r.chance(60);
        let icmp = matches!(proto, Some("icmp" | "icmp6")) && r.chance(60);
        rules.push((
            r.below(n),
            AclRuleSpec {
                dir: r.pick(&["in", "out"]).to_string(),
                action: r.pick(&["allow", "deny", "allow-related", "allow-related"]).to_string(),
                proto: proto.map(str::to_string),
                src,
                dst,
                dport: ports.then(|| r.pick(&["22", "80", "40000", "53", "20-100", "5000-40000"]).to_string()),
                icmp_type: icmp.then(|| r.pick(&[8u8, 0, 3, 128, 129])).filter(|&t| v6 == (t >= 128)),
                ethertype: typed.then(|| r.pick(&["ipv4", "ipv6", "arp"]).to_string()),
                priority: r.below(4) as i32,
            },
        ));
    }
    // Mostly one broad rule that remembers connections, so that replies are seen.
    if r.chance(70) {
        let rule = AclRuleSpec {
            dir: r.pick(&["in", "out"]).to_string(),
            action: "allow-related".to_string(),
            ..AclRuleSpec::default()
        };
        rules.push((r.below(n), rule));
    }
    let mut defaults = Vec::new();
    for _ in 0..r.below(3) {
        defaults.push((r.below(n), r.pick(&[Dir::In, Dir::Out]), r.pick(&[AclAction::Deny, AclAction::Allow])));
    }
    (rules, defaults)
}

/// Station `k`'s address (port `i`'s own station is `i + 1`).
fn station(k: usize) -> MacAddr {
    MacAddr([2, 0, 0, 0, 0, k as u8])
}

fn dev_mac(i: usize) -> MacAddr {
    MacAddr([2, 0xee, 0, 0, 0, i as u8])
}

const GROUPS: [MacAddr; 4] = [
    MacAddr::BROADCAST,
    MacAddr([0x01, 0, 0x5e, 0, 0, 1]),
    MacAddr([0x33, 0x33, 0, 0, 0, 1]),
    MacAddr([0x01, 0x80, 0xc2, 0, 0, 0x0e]),
];

fn guest_v4(n: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 0, 0, n as u8 + 1)
}

fn guest_v6(n: usize) -> Ipv6Addr {
    Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, n as u16 + 1)
}

fn lan_v4(n: usize) -> Ipv4Addr {
    Ipv4Addr::new(192, 0, 2, n as u8 + 1)
}

fn lan_v6(n: usize) -> Ipv6Addr {
    Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, n as u16 + 1)
}

fn gen_switch(r: &mut Rng) -> SwitchSpec {
    let mode = if r.chance(35) { Mode::L3 } else { Mode::L2 };
    let n = if r.chance(5) { r.range(abi::MAX_OUTPUTS + 1, MAX_SWITCH_PORTS) } else { r.range(2, 8) };
    let mut slots: Vec<u16> = Vec::new();
    while slots.len() < n {
        let s = r.below(abi::MAX_PORTS as usize) as u16;
        if !slots.contains(&s) {
            slots.push(s);
        }
    }
    let mut owned: Vec<IpAddr> = Vec::new();
    let mut ports = Vec::new();
    for (i, &slot) in slots.iter().enumerate() {
        // (A big switch floods VLAN 1 to more ports than a verdict has outputs.)
        let big = n > 8;
        let vlan = match r.below(10) {
            _ if big && r.chance(90) => VlanMode::Access(1),
            0..=4 => VlanMode::Access(1),
            5 | 6 => VlanMode::Access(r.range(1, 3) as u16),
            _ => VlanMode::Trunk {
                allowed: (1..=4u16).filter(|_| r.chance(50)).collect(),
                native: r.chance(60).then(|| r.range(1, 4) as u16),
            },
        };
        // Layer 3 wants its way off the switch more often than not.
        let uplink = r.chance(if mode == Mode::L3 && i == 0 { 70 } else { 15 });
        let mut ips: Vec<IpAddr> = Vec::new();
        if r.chance(30) {
            for _ in 0..r.range(1, 2) {
                let k = r.below(n + 2);
                ips.push(if r.chance(50) { guest_v4(k).into() } else { guest_v6(k).into() });
            }
        }
        ips.sort();
        ips.dedup();
        if mode == Mode::L3 && !uplink {
            ips.retain(|a| !owned.contains(a));
            owned.extend(ips.iter().copied());
        }
        ports.push(PortSpec {
            vlan,
            mtu: r.pick(&[1500, 1500, 1500, 100, 576, 1280, 1400, 2000, 3000]),
            uplink,
            isolated: !big && r.chance(25),
            dev_mac: (uplink && r.chance(80)).then(|| dev_mac(i)),
            mac: r.chance(20).then(|| station(r.range(1, 12))),
            ips,
            learn_ips: r.chance(20),
            mirror_of: r.chance(10).then(|| r.below(n)),
            drop_ethertypes: (0..r.pick(&[0, 0, 0, 0, 1, 2]))
                .map(|_| r.pick(&[0x88b5u16, 0x88cc, 0x0800, 0x86dd, 0x0806]))
                .collect(),
            // (Pause and LACP among them at times: the core never forwards those.)
            forward_link_local: if r.chance(30) { r.next() as u16 } else { 0 },
            storm: StormControl {
                broadcast_pps: if r.chance(20) { 1_000_000 } else { 0 },
                multicast_pps: if r.chance(20) { 1_000_000 } else { 0 },
                burst: 1_000_000,
            },
            rate: RateLimit {
                rate_in: if r.chance(20) { 400_000_000_000 } else { 0 },
                rate_out: if r.chance(20) { 400_000_000_000 } else { 0 },
                burst: 1 << 30,
            },
            reach: if uplink {
                Reach::Uplink
            } else if r.chance(30) {
                Reach::Veth
            } else {
                Reach::Guest
            },
            slot,
            tunnel: None,
        });
    }
    // One switch in four (not a big one) has a tunnel port: one of its ports that is no
    // uplink becomes one.
    let inside: Vec<usize> = (0..n).filter(|&i| !ports[i].uplink).collect();
    if n <= 8 && !inside.is_empty() && r.chance(25) {
        let (vlan, t) = gen_tunnel(r);
        let p = &mut ports[r.pick(&inside)];
        (p.vlan, p.reach, p.tunnel) = (vlan, Reach::Tunnel, Some(t));
    }
    let mut statics = Vec::new();
    if mode == Mode::L2 && r.chance(20) {
        for _ in 0..r.range(1, 2) {
            statics.push((r.range(1, 4) as u16, station(r.range(1, 12)), r.below(n)));
        }
    }
    SwitchSpec {
        mode,
        ports,
        port_mac_limit: if r.chance(25) { r.below(4) } else { 1024 },
        fib_max: if r.chance(15) { r.range(2, 10) } else { 8192 },
        statics,
        forget_heard: r.chance(30),
        acls: Vec::new(),
        acl_defaults: Vec::new(),
    }
    .with_acls(r, n)
}

impl SwitchSpec {
    /// One switch in three gets security groups.
    fn with_acls(mut self, r: &mut Rng, n: usize) -> SwitchSpec {
        if r.chance(35) {
            (self.acls, self.acl_defaults) = gen_acls(r, n);
        }
        self
    }
}

/// The switch `spec` describes, following a kernel datapath (it reports every change).
fn build(spec: &SwitchSpec) -> (Switch, Vec<MemHandle>) {
    let cfg = SwitchConfig {
        mode: spec.mode,
        port_mac_limit: spec.port_mac_limit,
        fib_max: spec.fib_max,
        // Nothing ages within a run: the tables are what the frames made them.
        aging_ms: u64::MAX / 4,
        ..SwitchConfig::default()
    };
    let mut sw = Switch::new(cfg).expect("a valid switch");
    let mut handles = Vec::new();
    let mut mirrored = Vec::new();
    for (i, p) in spec.ports.iter().enumerate() {
        let (port, h) = mem_port(OFFLOAD);
        h.set_mac(p.dev_mac);
        h.set_fast_path(Some(1));
        if let Some(t) = &p.tunnel {
            h.set_tunnel(t.rules.clone());
        }
        let mirror_of = match p.mirror_of {
            Some(w) if w != i && !mirrored.contains(&w) => {
                mirrored.push(w);
                vec![format!("p{w}")]
            }
            _ => Vec::new(),
        };
        let policy = PortPolicy {
            uplink: p.uplink,
            isolated: p.isolated,
            mac: p.mac,
            ips: p.ips.clone(),
            learn_ips: p.learn_ips,
            mirror_of,
            drop_ethertypes: p.drop_ethertypes.clone(),
            forward_link_local: p.forward_link_local,
            storm: p.storm,
            rate: p.rate,
            mcast_router: Default::default(),
        };
        let cfg = PortConfig { name: format!("p{i}"), vlan: p.vlan.clone(), mtu: Some(p.mtu), policy };
        sw.add_port(cfg, Box::new(port)).expect("a valid port");
        handles.push(h);
    }
    for &(vlan, mac, port) in &spec.statics {
        // (One another port locks is refused: fine.)
        let _ = sw.add_static_mac(vlan, mac, &format!("p{port}"));
    }
    for (port, rule) in &spec.acls {
        sw.acl_add(&format!("p{port}"), rule).expect("a valid rule");
    }
    for &(port, dir, action) in &spec.acl_defaults {
        sw.acl_default(&format!("p{port}"), dir, action).expect("a valid default");
    }
    sw.follow_fastpath();
    (sw, handles)
}

// ---------------------------------------------------------------------------------------
// Frames.

/// One frame into the switch: its input, virtio header and bytes, and what it is.
#[derive(Clone, Debug)]
struct Case {
    from: usize,
    vnet: VnetHdr,
    bytes: Vec<u8>,
    what: String,
    /// From a tunnel: the datagram's VNI and sender, and whether the sender is one of the
    /// port's endpoints.
    origin: Option<(tunnel::Origin, bool)>,
}

fn eth(dst: MacAddr, src: MacAddr, ethertype: u16) -> Vec<u8> {
    let mut f = Vec::with_capacity(128);
    f.extend_from_slice(&dst.0);
    f.extend_from_slice(&src.0);
    f.extend_from_slice(&ethertype.to_be_bytes());
    f
}

/// `frame` with an 802.1Q tag `tci` after its MAC addresses.
fn tagged(frame: &[u8], tci: u16) -> Vec<u8> {
    let mut f = frame[..12].to_vec();
    f.extend_from_slice(&[0x81, 0x00]);
    f.extend_from_slice(&tci.to_be_bytes());
    f.extend_from_slice(&frame[12..]);
    f
}

/// `frame` without its outer tag, 802.1Q or 802.1ad.
fn strip_outer(frame: &[u8]) -> Vec<u8> {
    if frame.len() >= 18 && matches!(frame[12..14], [0x81, 0x00] | [0x88, 0xa8]) {
        let mut f = frame[..12].to_vec();
        f.extend_from_slice(&frame[16..]);
        f
    } else {
        frame.to_vec()
    }
}

fn pattern(n: usize, salt: usize) -> impl Iterator<Item = u8> {
    (0..n).map(move |i| (i.wrapping_mul(7).wrapping_add(salt)) as u8)
}

/// An IPv4 header for `l4_len` bytes of protocol `proto`, with 4 bytes of options if
/// `options`.
fn ipv4(src: Ipv4Addr, dst: Ipv4Addr, proto: u8, l4_len: usize, options: bool) -> Vec<u8> {
    let ihl = if options { 6 } else { 5 };
    let total = ihl * 4 + l4_len;
    let mut h = vec![0x40 | ihl as u8, 0];
    h.extend_from_slice(&(total as u16).to_be_bytes());
    h.extend_from_slice(&[0x12, 0x34, 0x40, 0, 64, proto, 0, 0]);
    h.extend_from_slice(&src.octets());
    h.extend_from_slice(&dst.octets());
    if options {
        h.extend_from_slice(&[1, 1, 1, 0]);
    }
    let sum = sluice_wire::checksum::fold(sluice_wire::checksum::sum(&h, 0));
    h[10..12].copy_from_slice(&(!sum).to_be_bytes());
    h
}

/// An MLD message from `src`: a v1 report or done, a v2 report joining or leaving, or a
/// general query, for one of [`IP_GROUPS_V6`], with a hop-by-hop header (Router Alert) or
/// without, now and then with a bad checksum.
fn mld(r: &mut Rng, src: MacAddr) -> Vec<u8> {
    let g = r.pick(&IP_GROUPS_V6);
    let all_routers = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 2);
    let (dst, mut m) = match r.pick(&[131u8, 131, 132, 143, 143, 130]) {
        143 => {
            let mut m = vec![143, 0, 0, 0, 0, 0, 0, 1, r.pick(&[4u8, 4, 3]), 0, 0, 0];
            m.extend_from_slice(&g.octets());
            (Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 0x16), m)
        }
        130 => {
            let mut m = vec![130, 0, 0, 0, 0x27, 0x10, 0, 0];
            m.extend_from_slice(&[0; 16]);
            (Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1), m)
        }
        t => {
            let mut m = vec![t, 0, 0, 0, 0, 0, 0, 0];
            m.extend_from_slice(&g.octets());
            (if t == 132 { all_routers } else { g }, m)
        }
    };
    let from = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, r.range(1, 9) as u16);
    let mut pseudo = from.octets().to_vec();
    pseudo.extend_from_slice(&dst.octets());
    pseudo.extend_from_slice(&(m.len() as u32).to_be_bytes());
    pseudo.extend_from_slice(&[0, 0, 0, 58]);
    pseudo.extend_from_slice(&m);
    let c = sluice_wire::checksum::fold(sluice_wire::checksum::sum(&pseudo, 0));
    m[2..4].copy_from_slice(&c.to_be_bytes());
    if r.chance(10) {
        m[3] ^= 1;
    }
    let o = dst.octets();
    let mut f = eth(MacAddr([0x33, 0x33, o[12], o[13], o[14], o[15]]), src, 0x86dd);
    if r.chance(70) {
        f.extend(ipv6(from, dst, 0, 1, 8 + m.len()));
        f.extend_from_slice(&[58, 0, 5, 2, 0, 0, 1, 0]);
    } else {
        f.extend(ipv6(from, dst, 58, 1, m.len()));
    }
    f.extend(m);
    f
}

/// IP groups destinations are drawn from (IGMP/MLD snooping): snooped ones reports join,
/// and link-local ones that always flood.
const IP_GROUPS_V4: [Ipv4Addr; 3] =
    [Ipv4Addr::new(239, 1, 1, 1), Ipv4Addr::new(239, 1, 1, 2), Ipv4Addr::new(224, 0, 0, 251)];
const IP_GROUPS_V6: [Ipv6Addr; 3] = [
    Ipv6Addr::new(0xff0e, 0, 0, 0, 0, 0, 0, 1),
    Ipv6Addr::new(0xff05, 0, 0, 0, 0, 0, 1, 3),
    Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1),
];

/// An IPv6 header for `payload` bytes after it, first header `next`.
fn ipv6(src: Ipv6Addr, dst: Ipv6Addr, next: u8, hops: u8, payload: usize) -> Vec<u8> {
    let mut h = vec![0x60, 0, 0, 0];
    h.extend_from_slice(&(payload as u16).to_be_bytes());
    h.extend_from_slice(&[next, hops]);
    h.extend_from_slice(&src.octets());
    h.extend_from_slice(&dst.octets());
    h
}

/// A TCP header of `len` bytes (20, or more with options) or a UDP header for `data`
/// bytes of payload.
fn l4_header(tcp: bool, len: usize, data: usize) -> Vec<u8> {
    if tcp {
        let mut h = vec![0x13, 0x88, 0x9c, 0x40, 0, 0, 0, 1, 0, 0, 0, 0, ((len / 4) << 4) as u8, 0x18, 0xff, 0xff];
        h.extend_from_slice(&[0, 0, 0, 0]);
        h.extend(std::iter::repeat_n(1u8, len - 20));
        h
    } else {
        let mut h = vec![0x13, 0x88, 0x9c, 0x40];
        h.extend_from_slice(&((8 + data) as u16).to_be_bytes());
        h.extend_from_slice(&[0, 0]);
        h
    }
}

/// What a switch's frames are made of.
struct World<'a> {
    spec: &'a SwitchSpec,
    /// The MTUs of its ports: IP lengths and segments are sized around them.
    mtus: Vec<u16>,
    /// The last connections' frames, for replies.
    recent: std::cell::RefCell<Vec<Conn>>,
}

/// A connection's frame: source and destination address and port, IP protocol.
type Conn = (IpAddr, IpAddr, u16, u16, u8);

impl World<'_> {
    fn n(&self) -> usize {
        self.spec.ports.len()
    }

    /// Port `i`'s own station: its `mac` if it has one.
    fn home(&self, i: usize) -> MacAddr {
        self.spec.ports[i].mac.unwrap_or(station(i + 1))
    }

    fn src_mac(&self, r: &mut Rng, from: usize) -> MacAddr {
        match r.below(100) {
            0..=79 => self.home(from),
            80..=84 => self.home(r.below(self.n())),
            85..=87 => MacAddr([0; 6]),
            88 => r.pick(&GROUPS),
            89..=92 => station(from + 1),
            93..=96 => station(r.range(1, 12)),
            _ => station(from + 1 + self.n()),
        }
    }

    fn dst_mac(&self, r: &mut Rng, from: usize) -> MacAddr {
        let p = &self.spec.ports[from];
        let own = || match p.dev_mac {
            Some(m) if self.spec.mode == Mode::L2 || p.uplink => m,
            _ => DEFAULT_ROUTER_MAC,
        };
        match r.below(100) {
            // Layer 3: guests send to the router, the LAN to the uplink's address.
            0..=49 if self.spec.mode == Mode::L3 => own(),
            0..=39 => self.home(r.below(self.n())),
            40..=54 => r.pick(&GROUPS),
            // IEEE link-local, and the first group address past them.
            55..=59 => MacAddr([0x01, 0x80, 0xc2, 0, 0, r.below(17) as u8]),
            60..=69 => own(),
            70..=79 => station(r.range(1, 12)),
            80..=84 => dev_mac(r.below(self.n())),
            85..=89 => MacAddr([0x33, 0x33, 0xff, 0, 0, r.range(1, 8) as u8]),
            _ => self.home(from),
        }
    }

    /// Port `i`'s own IPv4 address: its first configured one, or the one it learns.
    fn own_v4(&self, i: usize) -> Ipv4Addr {
        self.spec.ports[i]
            .ips
            .iter()
            .find_map(|a| match a {
                IpAddr::V4(a) => Some(*a),
                IpAddr::V6(_) => None,
            })
            .unwrap_or(guest_v4(i))
    }

    fn own_v6(&self, i: usize) -> Ipv6Addr {
        self.spec.ports[i]
            .ips
            .iter()
            .find_map(|a| match a {
                IpAddr::V6(a) => Some(*a),
                IpAddr::V4(_) => None,
            })
            .unwrap_or(guest_v6(i))
    }

    /// A source address: mostly the port's own (the LAN's on an uplink), the rest
    /// anything.
    fn src_v4(&self, r: &mut Rng, from: usize) -> Ipv4Addr {
        let lan = self.spec.ports[from].uplink;
        match r.below(10) {
            0..=6 if lan => lan_v4(r.below(4)),
            0..=6 => self.own_v4(from),
            7 => self.own_v4(r.below(self.n())),
            8 => Ipv4Addr::UNSPECIFIED,
            _ => guest_v4(r.below(self.n() + 2)),
        }
    }

    fn src_v6(&self, r: &mut Rng, from: usize) -> Ipv6Addr {
        let lan = self.spec.ports[from].uplink;
        match r.below(10) {
            0..=5 if lan => lan_v6(r.below(4)),
            0..=5 => self.own_v6(from),
            6 => self.own_v6(r.below(self.n())),
            7 => Ipv6Addr::UNSPECIFIED,
            8 => Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, r.range(1, 9) as u16),
            _ => guest_v6(r.below(self.n() + 2)),
        }
    }

    /// A destination address: mostly another port's, or the LAN's.
    fn dst_v4(&self, r: &mut Rng) -> Ipv4Addr {
        match r.below(12) {
            0..=5 => self.own_v4(r.below(self.n())),
            6..=7 => lan_v4(r.below(4)),
            // IGMP/MLD snooping: groups members join, and a link-local one.
            10..=11 => r.pick(&IP_GROUPS_V4),
            _ => guest_v4(r.below(self.n() + 2)),
        }
    }

    fn dst_v6(&self, r: &mut Rng) -> Ipv6Addr {
        match r.below(12) {
            0..=5 => self.own_v6(r.below(self.n())),
            6..=7 => lan_v6(r.below(4)),
            10..=11 => r.pick(&IP_GROUPS_V6),
            _ => guest_v6(r.below(self.n() + 2)),
        }
    }

    /// An IP packet's length (header included): small, around an output's MTU, or
    /// anything that fits.
    fn ip_len(&self, r: &mut Rng, min: usize) -> usize {
        let len = match r.below(10) {
            0..=4 => r.range(min, min + 150),
            5..=8 => (r.pick(&self.mtus) as usize + r.range(0, 4)).saturating_sub(2),
            _ => r.range(min, MAX_FRAME - 18),
        };
        len.clamp(min, MAX_FRAME - 18)
    }

    fn frame(&self, r: &mut Rng) -> Case {
        let from = r.below(self.n());
        let (dst, src) = (self.dst_mac(r, from), self.src_mac(r, from));
        let salt = r.below(256);
        let mut vnet = VnetHdr::default();
        // (Frames of connections, more often where security groups read them.)
        let pick = match r.below(100) {
            n @ 12..=60 if !self.spec.acls.is_empty() && r.chance(30) => n % 8 + 4,
            n => n,
        };
        let (what, mut f) = match pick {
            0..=3 if r.chance(40) => ("mld", mld(r, src)),
            0..=3 => {
                // IGMP/MLD snooping: a membership report or leave (now and then with a bad
                // checksum), or a query, to a group address and a group MAC address: the
                // core reads it and the members it teaches shape later verdicts.
                let g = r.pick(&IP_GROUPS_V4);
                let kind = r.pick(&[0x16u8, 0x16, 0x17, 0x11, 0x22]);
                let mut m = vec![kind, 0, 0, 0];
                m.extend_from_slice(&g.octets());
                if kind == 0x22 {
                    m[4..8].copy_from_slice(&[0, 0, 0, 1]);
                    m.extend_from_slice(&[r.pick(&[2u8, 3, 4]), 0, 0, 0]);
                    m.extend_from_slice(&g.octets());
                }
                let c = sluice_wire::checksum::fold(sluice_wire::checksum::sum(&m, 0));
                m[2..4].copy_from_slice(&c.to_be_bytes());
                if r.chance(10) {
                    m[3] ^= 1;
                }
                let o = g.octets();
                let mut f = eth(MacAddr([1, 0, 0x5e, o[1] & 0x7f, o[2], o[3]]), src, 0x0800);
                f.extend(ipv4(self.src_v4(r, from), g, 2, m.len(), r.chance(50)));
                f.extend(m);
                ("igmp", f)
            }
            4..=11 => self.connection(r, from, dst, src, salt),
            12..=17 => {
                let (s, d) = (self.src_v4(r, from), self.dst_v4(r));
                let tcp = r.chance(40);
                let opts = r.chance(10);
                let hl = if opts { 24 } else { 20 } + if tcp { 20 } else { 8 };
                let len = self.ip_len(r, hl);
                let mut f = eth(dst, src, 0x0800);
                f.extend(ipv4(s, d, if tcp { 6 } else { 17 }, len - (hl - if tcp { 20 } else { 8 }), opts));
                f.extend(l4_header(tcp, 20, len - hl));
                f.extend(pattern(len - hl, salt));
                ("ipv4", f)
            }
            18..=31 => {
                let (s, d) = (self.src_v6(r, from), self.dst_v6(r));
                let tcp = r.chance(40);
                let hl = 40 + if tcp { 20 } else { 8 };
                let len = self.ip_len(r, hl);
                let mut f = eth(dst, src, 0x86dd);
                f.extend(ipv6(s, d, if tcp { 6 } else { 17 }, r.pick(&[64, 255]), len - 40));
                f.extend(l4_header(tcp, 20, len - hl));
                f.extend(pattern(len - hl, salt));
                ("ipv6", f)
            }
            32..=41 => {
                let (s, d) = (self.src_v6(r, from), self.dst_v6(r));
                if r.chance(50) {
                    let advert = r.chance(40);
                    let m = NdFields { advert, solicited: advert, src: s, dst: d, target: d, lla: src };
                    let mut b = vec![0u8; 128];
                    let n = neigh::write_nd(&mut b, dst, src, &m).expect("room");
                    b.truncate(n);
                    if r.chance(10) {
                        b[21] = 64;
                    }
                    ("neighbour discovery", b)
                } else {
                    let t = r.pick(&[128u8, 129, 130, 131, 132, 133, 134, 135, 136, 143]);
                    let mut f = eth(dst, src, 0x86dd);
                    f.extend(ipv6(s, d, 58, r.pick(&[255, 64, 1]), 24));
                    f.push(t);
                    f.extend(pattern(23, salt));
                    ("icmpv6", f)
                }
            }
            42..=51 => {
                let (s, d) = (self.src_v4(r, from), self.dst_v4(r));
                let op = r.pick(&[1u16, 2, 2, 3]);
                let mut b = vec![0u8; 64];
                let n = neigh::write_arp(&mut b, op, dst, src, s, MacAddr([0; 6]), d).expect("room");
                b.truncate(n);
                if r.chance(10) {
                    b[15] = 6;
                }
                ("arp", b)
            }
            52..=61 => {
                let ethertype = r.pick(&[0x88b5u16, 0x88cc, 0x9000, 0x0842, 0x05dc, 0x88a8, 0x8100, 0x8035]);
                let mut f = eth(dst, src, ethertype);
                if matches!(ethertype, 0x88a8 | 0x8100) {
                    f.extend_from_slice(&(r.range(0, 5) as u16).to_be_bytes());
                    f.extend_from_slice(&0x0800u16.to_be_bytes());
                }
                f.extend(pattern(self.ip_len(r, 0).min(r.range(0, 200)), salt));
                ("other", f)
            }
            62..=81 => {
                let (v, f) = self.gso(r, from, dst, src, salt);
                vnet = v;
                ("gso", f)
            }
            _ => {
                // The input's own stations, to learn them and to be found again.
                let mut f = eth(dst, self.home(from), 0x0800);
                f.extend(ipv4(self.src_v4(r, from), self.dst_v4(r), 17, 8 + 20, false));
                f.extend(l4_header(false, 20, 20));
                f.extend(pattern(20, salt));
                ("ipv4 from home", f)
            }
        };
        let mut what = what.to_string();
        // Mostly what the input takes (untagged or a priority tag on an access port, its
        // VLANs on a trunk), the rest anything.
        let pcp = r.below(8) << 13;
        let dei = if r.chance(10) { 0x1000 } else { 0 };
        let tci = match (&self.spec.ports[from].vlan, r.below(10)) {
            (_, 0) => Some((pcp | dei | r.below(6)) as u16),
            (VlanMode::Access(_), 1) | (VlanMode::Trunk { .. }, 1..=2) => Some((pcp | dei) as u16),
            (VlanMode::Trunk { allowed, .. }, 3..=7) => {
                let vids: Vec<u16> = allowed.iter().collect();
                (!vids.is_empty()).then(|| (pcp | dei) as u16 | r.pick(&vids))
            }
            _ => None,
        };
        if let Some(t) = tci {
            f = tagged(&f, t);
            if vnet.needs_csum() {
                vnet.csum_start += 4;
            }
            if vnet.hdr_len != 0 {
                vnet.hdr_len += 4;
            }
            let _ = write!(what, ", tag {t:#06x}");
        }
        if r.chance(5) {
            let extra = r.range(1, 8);
            f.extend(pattern(extra, 0xaa));
            what.push_str(", trailing bytes");
        }
        if r.chance(8) {
            let cut = r.range(14, f.len());
            f.truncate(cut);
            let _ = write!(what, ", cut to {cut}");
        }
        f.truncate(MAX_FRAME);
        if vnet.validate(f.len()).is_err() {
            // A checksum to complete past the end of a frame cut short: no skb has that (the
            // kernel refuses such a header), so the frame goes without it.
            vnet.flags = 0;
            (vnet.csum_start, vnet.csum_offset) = (0, 0);
            what.push_str(", no checksum offload");
        }
        let mut origin = None;
        if let Some(t) = &self.spec.ports[from].tunnel {
            // (A tunnel's frame comes with no offloads.)
            vnet = VnetHdr::default();
            let v6 = t.local.is_ipv6();
            let carried: Vec<u32> = match &t.rules.vnis {
                VniMap::Single(v) => vec![*v],
                VniMap::PerVlan(m) => m.iter().map(|p| p.1).collect(),
            };
            let vni = if r.chance(85) { r.pick(&carried) } else { vni_for(r.range(1, 9) as u16) + 100 };
            let sender = match r.below(8) {
                0 => endpoint(66, v6),
                1 if t.rules.evpn => endpoint(4, v6),
                _ => endpoint(r.range(1, 2) as u8, v6),
            };
            let known = t.rules.knows(sender);
            let _ = write!(what, ", from a tunnel: VNI {vni} from {sender}");
            origin = Some((tunnel::Origin { vni, sender }, known));
        }
        Case { from, vnet, bytes: f, what, origin }
    }

    /// A frame of a connection, for security groups: TCP (a SYN, SYN-ACK, ACK, FIN or RST),
    /// UDP or ICMP echo over IPv4 or IPv6, between a few addresses and ports, in either
    /// direction (a reply swaps them), so that connections are opened, found and answered.
    fn connection(&self, r: &mut Rng, from: usize, dst: MacAddr, src: MacAddr, salt: usize) -> (&'static str, Vec<u8>) {
        // Half the time the reverse (mostly) or a repeat of a recent one; else mostly
        // between the input's own address and another port's.
        let recent = self.recent.borrow().last().copied().filter(|_| r.chance(50));
        let (a, b, sport, dport, proto, reverse) = match recent {
            Some((a, b, s, d, p)) if r.chance(70) => (b, a, d, s, p, true),
            Some((a, b, s, d, p)) => (a, b, s, d, p, false),
            None => {
                let v6 = r.chance(35);
                let to = r.below(self.n());
                let (a, b): (IpAddr, IpAddr) = match (v6, r.chance(80)) {
                    (false, true) => (self.own_v4(from).into(), self.own_v4(to).into()),
                    (true, true) => (self.own_v6(from).into(), self.own_v6(to).into()),
                    (false, false) => (self.src_v4(r, from).into(), self.dst_v4(r).into()),
                    (true, false) => (self.src_v6(r, from).into(), self.dst_v6(r).into()),
                };
                let (s, d) = (r.pick(&[5000u16, 5001]), r.pick(&[22u16, 80, 53, 40000]));
                let p = match r.below(10) {
                    0..=4 => 6,
                    5..=7 => 17,
                    _ if v6 => 58,
                    _ => 1,
                };
                (a, b, s, d, p, false)
            }
        };
        {
            let mut rec = self.recent.borrow_mut();
            rec.push((a, b, sport, dport, proto));
            if rec.len() > 8 {
                rec.remove(0);
            }
        }
        let data = r.pick(&[0usize, 0, 10, 100]);
        let mut l4 = match proto {
            6 => {
                let flags = if reverse {
                    r.pick(&[0x12u8, 0x12, 0x10, 0x18, 0x11, 0x04])
                } else {
                    r.pick(&[0x02u8, 0x02, 0x10, 0x18, 0x11, 0x04, 0x14])
                };
                let mut h = Vec::with_capacity(20);
                h.extend_from_slice(&sport.to_be_bytes());
                h.extend_from_slice(&dport.to_be_bytes());
                h.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 0, 0x50, flags, 0xff, 0xff, 0, 0, 0, 0]);
                h
            }
            17 => {
                let mut h = Vec::with_capacity(8);
                h.extend_from_slice(&sport.to_be_bytes());
                h.extend_from_slice(&dport.to_be_bytes());
                h.extend_from_slice(&((8 + data) as u16).to_be_bytes());
                h.extend_from_slice(&[0, 0]);
                h
            }
            _ => {
                // ICMP echo: a request, or (mostly, in reverse) its reply; identifier 1.
                let (request, reply) = if proto == 58 { (128u8, 129u8) } else { (8, 0) };
                let t = if reverse == r.chance(80) { request } else { reply };
                vec![t, 0, 0, 0, 0, 1, 0, 1]
            }
        };
        l4.extend(pattern(data, salt));
        let mut f = eth(dst, src, if a.is_ipv6() { 0x86dd } else { 0x0800 });
        match (a, b) {
            (IpAddr::V4(a), IpAddr::V4(b)) => f.extend(ipv4(a, b, proto, l4.len(), false)),
            (IpAddr::V6(a), IpAddr::V6(b)) => f.extend(ipv6(a, b, proto, 64, l4.len())),
            _ => unreachable!("one family"),
        }
        f.extend(l4);
        ("connection", f)
    }

    /// A GSO frame: TCP or UDP over IPv4 or IPv6, its segments sized around an output's
    /// MTU (or too small, or bigger than the frame's payload), sometimes with IP options,
    /// TCP options or an IPv6 extension header.
    fn gso(&self, r: &mut Rng, from: usize, dst: MacAddr, src: MacAddr, salt: usize) -> (VnetHdr, Vec<u8>) {
        let v6 = r.chance(40);
        let tcp = r.chance(70);
        let opts = !v6 && r.chance(15);
        let ext = v6 && r.chance(8);
        let ip_hl = if v6 {
            40
        } else if opts {
            24
        } else {
            20
        };
        let l4_hl = if tcp { if r.chance(20) { 32 } else { 20 } } else { 8 };
        let hl = ip_hl + if ext { 8 } else { 0 } + l4_hl;
        let room = MAX_FRAME - 18 - hl;
        let mtu = r.pick(&self.mtus) as usize;
        let gso = match r.below(10) {
            0 => r.range(1, 47),
            1 => r.range(48, 2000),
            _ => (mtu + r.range(0, 4)).saturating_sub(hl + 2).max(1),
        }
        .min(room);
        let payload = match r.below(4) {
            0 => r.range(1, gso),
            _ => (gso * r.range(1, 4) + r.below(gso)).min(room),
        }
        .max(1);
        let mut f = eth(dst, src, if v6 { 0x86dd } else { 0x0800 });
        let l4_len = l4_hl + payload;
        if v6 {
            let (s, d) = (self.src_v6(r, from), self.dst_v6(r));
            let next = if ext {
                0
            } else if tcp {
                6
            } else {
                17
            };
            f.extend(ipv6(s, d, next, 64, l4_len + if ext { 8 } else { 0 }));
            if ext {
                f.extend_from_slice(&[if tcp { 6 } else { 17 }, 0, 1, 4, 0, 0, 0, 0]);
            }
        } else {
            let (s, d) = (self.src_v4(r, from), self.dst_v4(r));
            f.extend(ipv4(s, d, if tcp { 6 } else { 17 }, l4_len, opts));
        }
        f.extend(l4_header(tcp, l4_hl, payload));
        f.extend(pattern(payload, salt));
        let kind = match (tcp, v6) {
            (true, false) => VnetHdr::GSO_TCPV4,
            (true, true) => VnetHdr::GSO_TCPV6,
            (false, _) => VnetHdr::GSO_UDP_L4,
        };
        let l4_at = 14 + hl - l4_hl;
        let vnet = VnetHdr {
            flags: VnetHdr::F_NEEDS_CSUM,
            gso_type: kind,
            hdr_len: (14 + hl) as u16,
            gso_size: gso as u16,
            csum_start: l4_at as u16,
            csum_offset: if tcp { 16 } else { 6 },
            num_buffers: 0,
        };
        (vnet, f)
    }
}

/// Whether a test run refuses the frame (`BPF_PROG_TEST_RUN` wants an Ethernet header,
/// and an untagged IP packet's header whole): such frames are left to the core alone.
fn test_run_refuses(f: &[u8]) -> bool {
    let et = if f.len() >= 14 { u16::from_be_bytes([f[12], f[13]]) } else { 0 };
    f.len() < 14 || (et == 0x0800 && f.len() < 34) || (et == 0x86dd && f.len() < 54)
}

// ---------------------------------------------------------------------------------------
// The kernel's side: devices, a packet socket on all of them, the executor.

fn sh(cmd: &str) -> String {
    let o = Command::new("sh").args(["-c", cmd]).output().expect("sh runs");
    assert!(o.status.success(), "`{cmd}` failed: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

/// A veth pair `NAME`/`NAMEp`, up, with IPv6 off (so that neither end sends anything of its
/// own) and an MTU no frame of the test exceeds (a veth refuses a frame longer than its
/// peer's MTU, which is not what is tested): the ifindex of `NAME`.
fn veth(name: &str) -> u32 {
    sh(&format!(
        "ip link add {name} type veth peer name {name}p && \
         sysctl -qw net.ipv6.conf.{name}.disable_ipv6=1 net.ipv6.conf.{name}p.disable_ipv6=1 && \
         ip link set {name} mtu 16000 up && ip link set {name}p mtu 16000 up"
    ));
    let line = sh(&format!("ip -o link show dev {name}"));
    line.split(':').next().and_then(|s| s.trim().parse().ok()).expect("an ifindex")
}

/// A frame a device's egress took: the device, and the frame as on the wire (its tag, if
/// the kernel kept it beside the frame, put back in).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Sent {
    ifindex: u32,
    wire: Vec<u8>,
}

/// A packet socket on every device of the namespace that keeps only what the devices
/// send (a classic BPF filter on the packet type). A device's egress hands a frame to it
/// within the call that sent the frame (`dev_queue_xmit`), so what a test run sent is all
/// there when the run returns.
struct Sniffer(OwnedFd);

impl Sniffer {
    fn new() -> Sniffer {
        let fd = packet::packet_socket();
        // ld [pkttype]; jeq PACKET_OUTGOING ? accept : drop.
        let mut prog = [
            libc::sock_filter { code: 0x20, jt: 0, jf: 0, k: 0xffff_f004 },
            libc::sock_filter { code: 0x15, jt: 0, jf: 1, k: libc::PACKET_OUTGOING as u32 },
            libc::sock_filter { code: 0x06, jt: 0, jf: 0, k: 0x0004_0000 },
            libc::sock_filter { code: 0x06, jt: 0, jf: 0, k: 0 },
        ];
        let fprog = libc::sock_fprog { len: prog.len() as u16, filter: prog.as_mut_ptr() };
        let setopt = |level, name, val: *const libc::c_void, len: usize| {
            // SAFETY: `val` points at `len` bytes alive for the call.
            let r = unsafe { libc::setsockopt(fd.as_raw_fd(), level, name, val, len as libc::socklen_t) };
            assert_eq!(r, 0, "setsockopt({level}, {name}): {}", std::io::Error::last_os_error());
        };
        setopt(libc::SOL_SOCKET, libc::SO_ATTACH_FILTER, (&raw const fprog).cast(), std::mem::size_of_val(&fprog));
        let size: libc::c_int = 4 << 20;
        setopt(libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, (&raw const size).cast(), 4);
        let s = Sniffer(fd);
        s.drain();
        s
    }

    /// Everything sent since the last call, in order.
    fn drain(&self) -> Vec<Sent> {
        let mut out = Vec::new();
        loop {
            let p = match packet::recv_packet(&self.0) {
                Ok(p) => p,
                Err(e) => {
                    assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock, "recvmsg: {e}");
                    return out;
                }
            };
            let mut wire = p.frame;
            if let Some((tpid, tci)) = p.tag
                && wire.len() >= 12
            {
                let mut t = tpid.to_be_bytes().to_vec();
                t.extend_from_slice(&tci.to_be_bytes());
                wire.splice(12..12, t);
            }
            out.push(Sent { ifindex: p.ifindex, wire });
        }
    }
}

/// The executor and the devices of the test's namespace, reused by every switch.
struct Kernel {
    ex: Executor,
    /// The switch-side ends of the ports' veths, one per port index.
    devs: Vec<u32>,
    upcall: u32,
    sniffer: Sniffer,
    _pins: Bpffs,
}

impl Kernel {
    fn new() -> Kernel {
        let pins = Bpffs::new("sluice-diff-test");
        let mut ex = Executor::open(&pins.0, Sizes { stations: 8192, verdicts: 16384 }).expect("the executor loads");
        ex.load_tunneled().expect("the tests' program for frames from a tunnel loads");
        let devs = (0..MAX_SWITCH_PORTS).map(|i| veth(&format!("d{i}"))).collect();
        let upcall = veth("upc");
        Kernel { ex, devs, upcall, sniffer: Sniffer::new(), _pins: pins }
    }

    fn counters(&self, slot: u16) -> [u64; c::COUNT] {
        self.ex.counters(u32::from(slot)).v
    }
}

/// A run of the program and what it did.
#[derive(Debug)]
struct Observed {
    ran: Ran,
    /// What the devices were sent, as (port index or `None` for the upcall device, wire
    /// frame).
    sent: Vec<(Option<usize>, Vec<u8>)>,
    /// Every port's counters, as they moved.
    counters: Vec<[u64; c::COUNT]>,
    /// The stations it reported heard behind a tunnel.
    heard: Vec<sluice_ebpf::exec::Heard>,
}

/// What the kernel's maps hold for one switch (what the test wrote, so that it knows
/// whether a frame's verdicts are installed, and can take it all out again).
struct Installed {
    mode: Mode,
    places: Vec<Place>,
    /// Each port's tunnel, if it is one.
    tunnels: Vec<Option<TunnelSpec>>,
    /// The kernel's reports of stations heard behind a tunnel are never handed to the
    /// core (as if the daemon had not read them yet): its remote table stays empty.
    forget_heard: bool,
    gen_base: u64,
    generation: u64,
    admits: HashMap<abi::AdmitKey, abi::Admit>,
    verdicts: HashMap<abi::FlowKey, abi::Verdict>,
    stations: HashSet<(u16, MacAddr)>,
    locks: HashMap<usize, MacAddr>,
    owners: HashSet<IpAddr>,
    neigh: HashSet<(u16, IpAddr)>,
    inputs: HashSet<u32>,
    groups: HashSet<(u16, IpAddr)>,
    /// Security groups: the class set written, and the epoch of the core's classes in it.
    acl_set: u32,
    acl_epoch: Option<u64>,
}

/// The kernel's conntrack as the daemon hands it to the core, but with the core's commits
/// held until the kernel has run the frame: the core decides a frame before the kernel
/// sees it here (a daemon's core, after), and the kernel must find the connection as it
/// was.
struct HeldCommits {
    ct: sluice_ebpf::exec::Conntrack,
    held: std::sync::Arc<std::sync::Mutex<Vec<Vec<u8>>>>,
}

impl KernelTracker for HeldCommits {
    fn lookup(&mut self, frame: &[u8]) -> sluice_switch::conntrack::Found {
        KernelTracker::lookup(&mut self.ct, frame)
    }

    fn commit(&mut self, frame: &[u8]) -> Result<(), sluice_switch::conntrack::CtFull> {
        self.held.lock().expect("not poisoned").push(frame.to_vec());
        Ok(())
    }
}

impl Installed {
    fn place(&self, p: PortId) -> Option<Place> {
        self.places.get(p as usize).copied()
    }

    /// Writes the changes the core reports into the kernel's maps, and the generation.
    fn sync(&mut self, k: &mut Kernel, sw: &mut Switch) {
        let mut changes = Vec::new();
        sw.take_fastpath_changes(|c| changes.push(c));
        let places = |p: PortId| self.places.get(p as usize).copied();
        for ch in changes {
            match ch {
                FastChange::Port(id) => {
                    let i = id as usize;
                    if self.tunnels[i].is_some() {
                        self.sync_tunnel(k, sw, i);
                    }
                    let place = self.places[i];
                    let ifindex = place.device.expect("every port has a device").ifindex;
                    let p = sw.fast_port(id).expect("no port is removed");
                    let mut e = convert::input(&p, place.slot, self.mode, sw.config().router_mac);
                    if let Some(t) = &self.tunnels[i] {
                        e = convert::tunnel_input(e, t.local.is_ipv6());
                    }
                    k.ex.set_input(ifindex, &e).expect("inputs");
                    self.inputs.insert(ifindex);
                    if let Some(old) = self.locks.remove(&i) {
                        k.ex.set_lock(old, None).expect("locks");
                    }
                    if let Some((lk, slot)) = convert::lock(&p, place.slot) {
                        k.ex.set_lock(MacAddr(lk.mac), Some(slot)).expect("locks");
                        self.locks.insert(i, MacAddr(lk.mac));
                    }
                }
                FastChange::Mac(vlan, mac) => {
                    match sw.fast_mac(vlan, mac).and_then(|m| Some((convert::station(&m, places)?, m.is_static))) {
                        Some((v, is_static)) => {
                            k.ex.set_station(vlan, mac, v.slot, is_static).expect("stations");
                            self.stations.insert((vlan, mac));
                        }
                        None => k.ex.remove_station(vlan, mac),
                    }
                }
                FastChange::Owner(ip) => match sw.fast_owner(ip).and_then(places) {
                    Some(p) => {
                        k.ex.set_owner(ip, u32::from(p.slot)).expect("owners");
                        self.owners.insert(ip);
                    }
                    None => k.ex.remove_owner(ip),
                },
                FastChange::Neighbour(vlan, ip) => match sw.fast_neighbour(vlan, ip) {
                    Some(mac) => {
                        k.ex.set_neighbour(vlan, ip, mac).expect("neighbours");
                        self.neigh.insert((vlan, ip));
                    }
                    None => k.ex.remove_neighbour(vlan, ip),
                },
                FastChange::Group(vlan, ip) => {
                    k.ex.set_group(vlan, ip, sw.fast_group(vlan, ip)).expect("mdb");
                    self.groups.insert((vlan, ip));
                }
                FastChange::Remote(id, vni, mac) => {
                    let ifindex = self.places[id as usize].device.expect("every port has a device").ifindex;
                    match sw.fast_remote(id, vni, mac) {
                        Some(ep) => k.ex.set_remote(ifindex, vni, mac, ep).expect("remotes"),
                        None => k.ex.forget_remote(ifindex, vni, mac),
                    }
                }
            }
        }
        self.generation = self.gen_base + sw.generation();
        let cfg = convert::config(self.generation, k.upcall, UpcallBudget { rate: 0, burst: 0 });
        k.ex.configure(cfg.generation, cfg.upcall_ifindex).expect("config");
        // Security groups' classes, as the daemon writes them: a new set, switched to.
        let (acl, epoch) = sw.acl_classes();
        if self.acl_epoch != Some(epoch) {
            self.acl_set += 1;
            let addrs = acl.address_classes().map(|(c, p)| (c, p.addr, p.len));
            k.ex.write_acl_set(self.acl_set, addrs, acl.port_classes().filter(|&(c, _, _)| c != 0)).expect("classes");
            k.ex.use_acl_set(self.generation, self.acl_set).expect("config");
            k.ex.remove_acl_sets_but(self.acl_set);
            self.acl_epoch = Some(epoch);
        }
    }

    /// Tunnel port `i`'s endpoints and flood sets as the daemon writes them when the core
    /// reports the port changed (`KernelSide::sync_endpoints`, `sync_floods`): the core's
    /// tunnel port's.
    fn sync_tunnel(&self, k: &mut Kernel, sw: &Switch, i: usize) {
        {
            let (Some(t), Some(d)) = (&self.tunnels[i], self.places[i].device) else { return };
            for ep in (1..=5).chain([66]).map(|n| endpoint(n, t.local.is_ipv6())) {
                k.ex.remove_endpoint(d.ifindex, ep);
            }
            for ep in sw.tunnel_endpoints(i as PortId) {
                k.ex.set_endpoint(d.ifindex, ep).expect("endpoints");
            }
            let pairs: Vec<(u16, u32)> = match &t.rules.vnis {
                VniMap::Single(v) => vec![(0, *v)],
                VniMap::PerVlan(m) => m.clone(),
            };
            for (vlan, vni) in pairs {
                let eps = sw.tunnel_floods(i as PortId, vlan).and_then(|v| convert::flood_eps(&v));
                k.ex.set_flood(d.ifindex, vni, eps.as_ref()).expect("floods");
            }
        }
    }

    /// The installed, current verdicts a frame with these keys finds: whether it hits.
    fn hits(&self, ak: &abi::AdmitKey, fk: Option<&abi::FlowKey>) -> bool {
        let Some(a) = self.admits.get(ak).filter(|a| a.generation == self.generation) else { return false };
        a.action != abi::ACT_FORWARD
            || fk.and_then(|fk| self.verdicts.get(fk)).is_some_and(|v| v.generation == a.generation)
    }

    fn install(
        &mut self,
        k: &mut Kernel,
        ak: abi::AdmitKey,
        a: abi::Admit,
        flow: Option<(abi::FlowKey, abi::Verdict)>,
    ) {
        k.ex.install_admit(&ak, &a).expect("admits");
        self.admits.insert(ak, a);
        if let Some((fk, v)) = flow {
            k.ex.install(&fk, &v).expect("verdicts");
            self.verdicts.insert(fk, v);
        }
    }

    /// Takes out everything written for this switch.
    fn clear(self, k: &mut Kernel) {
        for ak in self.admits.keys() {
            k.ex.remove_admit(ak);
        }
        for fk in self.verdicts.keys() {
            k.ex.remove_verdict(fk);
        }
        for &(vlan, mac) in &self.stations {
            k.ex.remove_station(vlan, mac);
        }
        for &mac in self.locks.values() {
            k.ex.set_lock(mac, None).expect("locks");
        }
        for &ip in &self.owners {
            k.ex.remove_owner(ip);
        }
        for &(vlan, ip) in &self.neigh {
            k.ex.remove_neighbour(vlan, ip);
        }
        for &(vlan, ip) in &self.groups {
            let _ = k.ex.set_group(vlan, ip, None);
        }
        for &ifindex in &self.inputs {
            k.ex.clear_input(ifindex);
        }
        for (p, t) in self.places.iter().zip(&self.tunnels) {
            if let (Some(d), Some(_)) = (p.device, t) {
                k.ex.clear_tunnel(d.ifindex);
            }
        }
    }

    /// How a frame leaves by tunnel port `p` with the tag the core gives it, as the daemon
    /// has it.
    fn tunnel_out(&self, p: PortId, tag: Option<u16>) -> Option<convert::TunnelOut> {
        let t = self.tunnels.get(p as usize)?.as_ref()?;
        match &t.rules.vnis {
            VniMap::Single(vni) => Some(convert::TunnelOut { vni: *vni, tagged: true }),
            m @ VniMap::PerVlan(_) => {
                Some(convert::TunnelOut { vni: m.vni_of(tag.map(|v| v & 0x0fff))?, tagged: false })
            }
        }
    }

    /// Whether the remote table has station `mac` of `vni` behind tunnel port `p`, heard
    /// from `sender` if given.
    fn remote(&self, k: &Kernel, p: usize, vni: u32, mac: MacAddr, sender: Option<IpAddr>) -> bool {
        let Some(d) = self.places[p].device else { return false };
        let Some(r) = k.ex.remote(d.ifindex, vni, mac) else { return false };
        sender.is_none_or(|s| r.addr == ip16(s))
    }
}

// ---------------------------------------------------------------------------------------
// The core's side.

/// What the core did with one frame.
#[derive(Debug)]
struct CoreSide {
    /// Its key and verdict, if it got as far as a decision.
    decision: Option<(Key, Verdict)>,
    /// Every port's counters, as they moved (in the kernel's layout).
    counters: Vec<[u64; c::COUNT]>,
    /// The frames each port was sent.
    sent: Vec<Vec<Vec<u8>>>,
    /// Whether the frame was placed in its outputs (forwarded or flooded).
    placed: bool,
}

/// Port counters in the kernel's layout (what the kernel counts too).
fn as_kernel(p: &PortCounters) -> [u64; c::COUNT] {
    let mut v = [0u64; c::COUNT];
    v[c::RX_FRAMES] = p.rx_frames;
    v[c::RX_BYTES] = p.rx_bytes;
    v[c::RX_GSO] = p.rx_gso;
    v[c::FORWARDED] = p.forwarded;
    v[c::COPIES] = p.copies;
    v[c::TX_OFFERED] = p.tx_offered;
    v[c::TX_FRAMES] = p.tx_frames;
    v[c::TX_BYTES] = p.tx_bytes;
    v[c::TX_GSO] = p.tx_gso;
    v[c::FLOODED] = p.flooded;
    v[c::LEARN_REFUSED] = p.learn_refused;
    for (i, cause) in DropCause::ALL.iter().enumerate() {
        v[c::RX_DROP + i] = p.rx_drops.get(*cause);
        v[c::TX_DROP + i] = p.tx_drops.get(*cause);
    }
    v
}

fn delta(after: &[u64; c::COUNT], before: &[u64; c::COUNT]) -> [u64; c::COUNT] {
    let mut d = [0u64; c::COUNT];
    for i in 0..c::COUNT {
        d[i] = after[i].wrapping_sub(before[i]);
    }
    d
}

fn core_counters(sw: &Switch) -> Vec<[u64; c::COUNT]> {
    sw.ports().iter().map(|p| as_kernel(&p.counters)).collect()
}

/// An address as the kernel's tables hold it (IPv4 in the first 4 bytes).
fn ip16(a: IpAddr) -> [u8; 16] {
    let mut b = [0u8; 16];
    match a {
        IpAddr::V4(a) => b[..4].copy_from_slice(&a.octets()),
        IpAddr::V6(a) => b = a.octets(),
    }
    b
}

fn core_receives(sw: &mut Switch, handles: &[MemHandle], case: &Case, now_ms: u64) -> CoreSide {
    let before = core_counters(sw);
    match case.origin {
        Some((o, _)) => handles[case.from].inject_from(o, &case.bytes),
        None => handles[case.from].inject(case.vnet, &case.bytes),
    }
    while sw.on_readable(case.from as PortId, now_ms) {}
    let after = core_counters(sw);
    let counters: Vec<_> = after.iter().zip(&before).map(|(a, b)| delta(a, b)).collect();
    let sent = handles.iter().map(|h| h.take_sent().into_iter().map(|(_, f)| f).collect()).collect();
    let input = &counters[case.from];
    CoreSide {
        decision: sw.last_decision().map(|(k, v)| (*k, v.clone())),
        placed: input[c::FORWARDED] + input[c::FLOODED] > 0,
        counters,
        sent,
    }
}

// ---------------------------------------------------------------------------------------
// What the kernel must do, given what the core did.

/// What the kernel is to do with a frame the core decided.
#[derive(Debug)]
struct Expected {
    code: u32,
    /// The frame the run leaves (its outer 802.1Q tag aside, which the program may have put
    /// beside the frame), if it matters.
    frame: Option<Vec<u8>>,
    mark: Option<u32>,
    /// Copies, in order: (port index or `None` for the upcall device, wire frame).
    sent: Vec<(Option<usize>, Vec<u8>)>,
    counters: Vec<[u64; c::COUNT]>,
    /// The last output's copy, seen in a run where it is a clone.
    last: Option<(usize, Vec<u8>)>,
}

/// The frame as the upcall device gets a copy: the input's slot as an outer 802.1ad tag.
fn up_copy(frame: &[u8], slot: u16) -> Vec<u8> {
    let mut w = frame[..12].to_vec();
    w.extend_from_slice(&[0x88, 0xa8]);
    w.extend_from_slice(&(slot & 0x0fff).to_be_bytes());
    w.extend_from_slice(&frame[12..]);
    w
}

/// The frame as the program hands it up (its slot's outer tag aside, which it puts beside
/// the frame): from a tunnel, with its origin in two 802.1Q tags first.
fn up_frame(case: &Case) -> Vec<u8> {
    let Some((o, known)) = case.origin else { return case.bytes.clone() };
    let high = ((o.vni >> 8) & 0xffff) as u16;
    let low = (((o.vni & 0xff) as u16) << 8) | if known { abi::UP_ENDPOINT } else { 0 };
    let mut f = case.bytes[..12].to_vec();
    for t in [high, low] {
        f.extend_from_slice(&[0x81, 0x00]);
        f.extend_from_slice(&t.to_be_bytes());
    }
    f.extend_from_slice(&case.bytes[12..]);
    f
}

/// The kernel goes up with the frame: a hit whose verdict is up, or a miss.
fn expect_up(
    case: &Case,
    inst: &Installed,
    core: &CoreSide,
    input: &abi::Input,
    dst: u8,
    miss: bool,
    host: bool,
) -> Expected {
    let slot = inst.places[case.from].slot;
    let mut counters = vec![[0u64; c::COUNT]; inst.places.len()];
    let rx = &core.counters[case.from];
    let me = &mut counters[case.from];
    for i in [c::RX_FRAMES, c::RX_BYTES, c::RX_GSO] {
        me[i] = rx[i];
    }
    me[c::UPCALLS] = 1;
    me[c::MISSES] = u64::from(miss);
    // A miss on an input whose host may take the frame: a copy up, the frame on.
    let host = host || (miss && input.flags & abi::IN_HOST != 0 && dst != abi::DST_UNKNOWN);
    if host {
        let mut sent = vec![(None, up_copy(&case.bytes, slot))];
        if case.vnet.is_gso() {
            // (A test run's GSO frame has no GSO type: the device refuses its copy, which
            // the program counts as lost on its way up.)
            sent.clear();
            let me = &mut counters[case.from];
            me[c::UPCALLS] = 0;
            me[c::RX_DROP + usize::from(convert::cause(DropCause::UpcallLost))] = 1;
        }
        Expected { code: OK, frame: Some(case.bytes.clone()), mark: Some(0), sent, counters, last: None }
    } else {
        Expected {
            code: REDIRECT,
            frame: Some(up_frame(case)),
            mark: Some(abi::SLUICE_MARK),
            sent: Vec::new(),
            counters,
            last: None,
        }
    }
}

/// What the kernel must do with a frame whose installed verdicts are the core's `v` on
/// `key`; `served`: whether the kernel's tables serve every output the verdict has (an
/// output into a tunnel needs the destination in the remote table; one the conversion
/// cannot give the kernel goes up).
#[allow(clippy::too_many_arguments)]
fn expect_hit(
    k: &Kernel,
    case: &Case,
    inst: &Installed,
    core: &CoreSide,
    key: &Key,
    v: &Verdict,
    input: &abi::Input,
    served: bool,
) -> Expected {
    let n = inst.places.len();
    if v.pass_to_host && v.action == Action::Forward && v.outputs.is_empty() {
        // The host's alone: on to its stack, untouched and uncounted (the core counts its
        // own copy as consumed).
        return Expected {
            code: OK,
            frame: Some(case.bytes.clone()),
            mark: Some(0),
            sent: Vec::new(),
            counters: vec![[0; c::COUNT]; n],
            last: None,
        };
    }
    let dst = convert::admit_key(key, 0).dst;
    let up = match v.action {
        Action::Up(_) => true,
        // (Dropped by security groups on a connection only the core tracks: the core's.)
        Action::Drop(_) => !served,
        // More outputs than a verdict holds, or a next hop the kernel does not know (the
        // core parked the frame): the core's.
        Action::Forward => v.outputs.len() > abi::MAX_OUTPUTS || !core.placed || !served,
    };
    if up {
        return expect_up(case, inst, core, input, dst, false, v.pass_to_host);
    }
    let counters = core.counters.clone();
    let host = v.pass_to_host;
    if let Action::Drop(_) = v.action {
        return Expected {
            code: if host { OK } else { SHOT },
            frame: host.then(|| case.bytes.clone()),
            mark: host.then_some(0),
            sent: Vec::new(),
            counters,
            last: None,
        };
    }
    // Forwarded: each output the core sent a copy to gets the same; the last one gets
    // the frame itself (unless the host takes it on).
    // (A tunnel with a VNI per VLAN sends its frames untagged, the VLAN in the VNI.)
    let copy = |o: &sluice_switch::Output| {
        let w = core.sent[o.port as usize].first()?;
        let untag = inst.tunnel_out(o.port, o.tag).is_some_and(|t| !t.tagged);
        Some(if untag { strip_outer(w) } else { w.clone() })
    };
    let mut sent = Vec::new();
    let last_i = v.outputs.len() - 1;
    let mut last = None;
    let mut frame = None;
    let mut mark = None;
    let mut code = SHOT;
    let mut counters = counters;
    // (In the kernel's order, a flood's copy into a tunnel last; that output sends a copy
    // to each endpoint of the flood set, the last endpoint's being the frame itself.)
    let fv = convert::verdict(key, v, 0, false, |q| inst.place(q), |q, tag| inst.tunnel_out(q, tag));
    let dst = MacAddr(case.bytes[..6].try_into().expect("a whole header"));
    for ((i, o), fo) in kernel_order(inst, v).into_iter().map(|j| &v.outputs[j]).enumerate().zip(&fv.outputs) {
        let Some(w) = copy(o) else { continue };
        for _ in 1..fanout(k, inst, o.port as usize, fo, dst) {
            sent.push((Some(o.port as usize), w.clone()));
        }
        // Where the two differ, by design for now: the core counts the frame it gives a
        // tunnel port (with its VLAN's tag, which a port with a VNI per VLAN takes off
        // before sending it); the kernel counts what the tunnel's device is given.
        let untagged = core.sent[o.port as usize].first().map_or(0, |c| c.len() - w.len());
        counters[o.port as usize][c::TX_BYTES] -= untagged as u64;
        if case.vnet.is_gso() && (i != last_i || host) {
            // A test run cannot give its frame a GSO type (only a size): a device's egress
            // refuses the clone of a GSO frame, which the program counts as a transmit
            // error. Its MTU decision is still seen (over_mtu or not); its copy is not.
            let out = &mut counters[o.port as usize];
            out[c::TX_FRAMES] -= 1;
            out[c::TX_BYTES] -= w.len() as u64;
            out[c::TX_GSO] -= 1;
            out[c::TX_DROP + usize::from(convert::cause(DropCause::TxError))] += 1;
            continue;
        }
        if i == last_i && !host {
            code = REDIRECT;
            frame = Some(w.clone());
            let reach = inst.places[o.port as usize].device.expect("placed").reach;
            mark = Some(if matches!(reach, Reach::Uplink | Reach::Tunnel) { 0 } else { abi::SLUICE_MARK });
            last = Some((o.port as usize, w));
        } else {
            sent.push((Some(o.port as usize), w));
        }
    }
    if host {
        code = OK;
        frame = Some(case.bytes.clone());
        mark = Some(0);
    }
    Expected { code, frame, mark, sent, counters, last }
}

/// Runs the program on the case's frame and reads what it did.
fn run(k: &mut Kernel, inst: &Installed, case: &Case) -> Observed {
    let before: Vec<_> = inst.places.iter().map(|p| k.counters(p.slot)).collect();
    let dev = inst.places[case.from].device.expect("placed");
    let segs = if case.vnet.is_gso() {
        let g = u32::from(case.vnet.gso_size.max(1));
        (case.bytes.len() as u32).div_ceil(g)
    } else {
        0
    };
    let gso_size = if case.vnet.is_gso() { u32::from(case.vnet.gso_size) } else { 0 };
    let tunnel = case.origin.map(|(o, _)| (o.vni, o.sender));
    let ctx = RunCtx { ifindex: dev.ifindex, gso_size, gso_segs: segs, tunnel, ..RunCtx::default() };
    let ran = k.ex.run(&case.bytes, &ctx).expect("a test run");
    // (Drained after every run, so that the ring never fills.)
    let heard = k.ex.take_heard(64);
    let sent = k
        .sniffer
        .drain()
        .into_iter()
        .map(|s| {
            let port = inst.places.iter().position(|p| p.device.is_some_and(|d| d.ifindex == s.ifindex));
            assert!(port.is_some() || s.ifindex == k.upcall, "a frame sent to device {}, no port's", s.ifindex);
            (port, s.wire)
        })
        .collect();
    let counters = inst.places.iter().zip(&before).map(|(p, b)| delta(&k.counters(p.slot), b)).collect();
    Observed { ran, sent, counters, heard }
}

/// Where `obs` differs from `want`, in words; empty when it does not.
fn differences(want: &Expected, obs: &Observed) -> Vec<String> {
    let mut d = Vec::new();
    if obs.ran.code != want.code {
        d.push(format!("return code {} (want {})", obs.ran.code, want.code));
    }
    // (A tag the program put beside the frame is not in what a test run returns.)
    if let Some(f) = &want.frame
        && obs.ran.frame != *f
        && obs.ran.frame != strip_outer(f)
    {
        d.push(format!("left the frame\n      {}\n    want\n      {}", hex(&obs.ran.frame), hex(f)));
    }
    if let Some(m) = want.mark
        && obs.ran.mark != m
    {
        d.push(format!("mark {:#x} (want {m:#x})", obs.ran.mark));
    }
    if obs.sent != want.sent {
        d.push(format!("sent\n{}    want\n{}", sent_list(&obs.sent), sent_list(&want.sent)));
    }
    for (i, (o, w)) in obs.counters.iter().zip(&want.counters).enumerate() {
        let wrong: Vec<String> = (0..c::COUNT)
            .filter(|&j| o[j] != w[j])
            .map(|j| format!("{} {} (want {})", counter_name(j), o[j], w[j]))
            .collect();
        if !wrong.is_empty() {
            d.push(format!("p{i}'s counters: {}", wrong.join(", ")));
        }
    }
    d
}

fn counter_name(i: usize) -> String {
    let names = [
        "rx_frames",
        "rx_bytes",
        "rx_gso",
        "forwarded",
        "copies",
        "upcalls",
        "tx_offered",
        "tx_frames",
        "tx_bytes",
        "tx_gso",
    ];
    match i {
        _ if i < names.len() => names[i].to_string(),
        _ if (c::RX_DROP..c::TX_DROP).contains(&i) => format!("rx_drop.{}", cause_name(i - c::RX_DROP)),
        _ if (c::TX_DROP..c::FLOODED).contains(&i) => format!("tx_drop.{}", cause_name(i - c::TX_DROP)),
        c::FLOODED => "flooded".into(),
        c::LEARN_REFUSED => "learn_refused".into(),
        c::TUN_BAD => "tun_bad".into(),
        c::MISSES => "misses".into(),
        _ => format!("[{i}]"),
    }
}

fn cause_name(i: usize) -> &'static str {
    DropCause::ALL.get(i).map_or("?", |c| c.name())
}

/// Up to 96 bytes in hex (frames differ in their headers; their lengths say the rest).
fn hex(b: &[u8]) -> String {
    let mut s = hex_all(&b[..b.len().min(96)]);
    if b.len() > 96 {
        let _ = write!(s, "… ({} bytes)", b.len());
    }
    s
}

fn hex_all(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn sent_list(s: &[(Option<usize>, Vec<u8>)]) -> String {
    if s.is_empty() {
        return "      nothing\n".into();
    }
    s.iter()
        .map(|(p, w)| {
            let to = p.map_or("the upcall device".to_string(), |p| format!("p{p}"));
            format!("      to {to}: {}\n", hex(w))
        })
        .collect()
}

fn nonzero(counters: &[[u64; c::COUNT]]) -> String {
    let mut s = String::new();
    for (i, v) in counters.iter().enumerate() {
        let f: Vec<String> =
            (0..c::COUNT).filter(|&j| v[j] != 0).map(|j| format!("{} {}", counter_name(j), v[j])).collect();
        if !f.is_empty() {
            let _ = writeln!(s, "      p{i}: {}", f.join(", "));
        }
    }
    if s.is_empty() { "      none\n".into() } else { s }
}

// ---------------------------------------------------------------------------------------
// The run.

/// Where a switch and its frames come from.
#[derive(Clone, Copy, Debug)]
enum Origin {
    /// Switch `index` of the run with this seed.
    Seed { seed: u64, index: u64 },
    /// A regression test of that name.
    Named(&'static str),
}

/// A disagreement: everything needed to see it and to run it again.
struct Report<'a> {
    origin: Origin,
    spec: &'a SwitchSpec,
    case_no: usize,
    case: &'a Case,
    core: &'a CoreSide,
    installed: String,
    step: &'a str,
    obs: &'a Observed,
    want: Option<&'a Expected>,
    why: Vec<String>,
}

impl Report<'_> {
    fn fail(&self) -> ! {
        let mut s = String::new();
        let _ = writeln!(s, "\ncore and kernel disagree: {}", self.step);
        for w in &self.why {
            let _ = writeln!(s, "  - {w}");
        }
        match self.origin {
            Origin::Seed { seed, index } => {
                let _ = writeln!(
                    s,
                    "run it again: SLUICE_DIFF_SEED={seed:#x} SLUICE_DIFF_SWITCH={index} cargo test --release -p sluice-ebpf --test differential"
                );
                let _ = writeln!(s, "switch {index} of seed {seed:#x}: {:#?}", self.spec);
            }
            Origin::Named(name) => {
                let _ = writeln!(s, "run it again: cargo test --release -p sluice-ebpf --test differential {name}");
                let _ = writeln!(s, "switch: {:#?}", self.spec);
            }
        }
        let _ =
            writeln!(s, "frame {} ({}), into p{}, {:?}:", self.case_no, self.case.what, self.case.from, self.case.vnet);
        let _ = writeln!(s, "  {}", hex_all(&self.case.bytes));
        let _ = writeln!(s, "core:");
        match &self.core.decision {
            Some((k, v)) => {
                let _ = writeln!(s, "  key {k:?}\n  verdict {v:?}");
            }
            None => {
                let _ = writeln!(s, "  dropped before it had a key");
            }
        }
        for (i, f) in self.core.sent.iter().enumerate() {
            for w in f {
                let _ = writeln!(s, "  sent to p{i}: {}", hex(w));
            }
        }
        let _ = write!(s, "  counters:\n{}", nonzero(&self.core.counters));
        let _ = writeln!(s, "kernel:\n{}", self.installed);
        let _ = writeln!(
            s,
            "  ran: code {}, mark {:#x}, frame {}",
            self.obs.ran.code,
            self.obs.ran.mark,
            hex(&self.obs.ran.frame)
        );
        let _ = write!(s, "  sent:\n{}", sent_list(&self.obs.sent));
        let _ = write!(s, "  counters:\n{}", nonzero(&self.obs.counters));
        if let Some(w) = self.want {
            let _ = write!(s, "  wanted counters:\n{}", nonzero(&w.counters));
        }
        let _ = writeln!(s, "core and kernel disagree: {}", self.step);
        for w in &self.why {
            let _ = writeln!(s, "  - {w}");
        }
        panic!("{s}");
    }
}

/// The keys and verdicts of a frame the core decided, as installed.
struct Converted {
    input: abi::Input,
    ak: abi::AdmitKey,
    admit: abi::Admit,
    flow: Option<(abi::FlowKey, abi::Verdict)>,
}

fn convert_decision(sw: &Switch, inst: &Installed, from: usize, key: &Key, v: &Verdict) -> Converted {
    let p: FastPort = sw.fast_port(from as PortId).expect("a port");
    let place = inst.places[from];
    let router = sw.config().router_mac;
    let input = convert::input(&p, place.slot, inst.mode, router);
    let ak = convert::admit_key(key, place.slot);
    let admit = convert::admit(v, sw.stage1(key), &p, inst.mode, inst.generation);
    let flow = (admit.action == abi::ACT_FORWARD).then(|| {
        let fk = convert::flow_key(key, admit.vlan, |q| inst.place(q)).expect("every port is placed");
        (
            fk,
            convert::verdict(
                key,
                v,
                inst.generation,
                sw.admits(key),
                |q| inst.place(q),
                |q, tag| inst.tunnel_out(q, tag),
            ),
        )
    });
    Converted { input, ak, admit, flow }
}

/// The kernel's order of verdict `v`'s outputs (a flood's copy into a tunnel last:
/// `convert::output_order`).
fn kernel_order(inst: &Installed, v: &Verdict) -> Vec<usize> {
    let tunnel = |p: PortId| inst.tunnels.get(p as usize).is_some_and(Option::is_some);
    convert::output_order(v, tunnel).unwrap_or_else(|| (0..v.outputs.len()).collect())
}

/// How many copies the kernel sends for output `fo` of a frame to `dst`: a flood's copy
/// into a tunnel goes to the endpoint the remote table has the destination behind, else to
/// each endpoint of the tunnel's flood set — where the core's tunnel port would send it.
fn fanout(k: &Kernel, inst: &Installed, port: usize, fo: &abi::Output, dst: MacAddr) -> usize {
    if fo.kind != abi::OUT_TUNNEL || fo.flags & abi::OF_FLOOD_EPS == 0 {
        return 1;
    }
    if !dst.is_multicast() && inst.remote(k, port, fo.vni, dst, None) {
        return 1;
    }
    inst.places[port].device.and_then(|d| k.ex.flood(d.ifindex, fo.vni)).map_or(0, |f| f.n as usize)
}

/// Whether the kernel's tables serve every output of the core's verdict `v` as converted:
/// not a verdict the conversion sends up (a mirror's copy or a routed frame into a tunnel,
/// a flood into two), nor one into a tunnel to a destination the remote table does not
/// have, nor a flood's copy into a tunnel whose flood set the kernel lacks, or a GSO
/// frame's for several endpoints.
fn served(k: &Kernel, inst: &Installed, case: &Case, v: &Verdict, cv: &Converted) -> bool {
    let Some((_, fv)) = &cv.flow else { return true };
    // (A verdict the conversion hands up: more outputs than it holds, or security groups
    // deciding by a connection only the core tracks.)
    if matches!(v.action, Action::Forward | Action::Drop(_)) && fv.action == abi::ACT_UP {
        return false;
    }
    let dst = MacAddr(case.bytes[..6].try_into().expect("a whole header"));
    kernel_order(inst, v).iter().map(|&i| &v.outputs[i]).zip(&fv.outputs).all(|(o, fo)| {
        let copies = fanout(k, inst, o.port as usize, fo, dst);
        fo.kind != abi::OUT_TUNNEL
            || (fo.flags & abi::OF_REMOTE_DST != 0 && inst.remote(k, o.port as usize, fo.vni, dst, None))
            || (fo.flags & abi::OF_FLOOD_EPS != 0 && copies > 0 && (copies == 1 || !case.vnet.is_gso()))
    })
}

/// Hands the core the stations the kernel reported heard behind a tunnel, as the daemon
/// does (`heard::hand_to_core`): each the core learns goes into the remote table. `due`:
/// the one the frame taught the core.
fn hand_heard(
    k: &mut Kernel,
    inst: &Installed,
    sw: &mut Switch,
    heard: &[sluice_ebpf::exec::Heard],
    due: Option<(u32, MacAddr, IpAddr)>,
    v: &Verdict,
    t: &mut Totals,
) {
    if inst.forget_heard {
        return;
    }
    let mut seen = HashSet::new();
    for h in heard {
        if !seen.insert((h.vni, h.vlan, h.mac, h.sender)) {
            continue;
        }
        let id = inst.places.iter().position(|p| u32::from(p.slot) == h.slot).expect("a report names a port's slot");
        let learned = sw.tunnel_heard(id as PortId, h.vni, h.vlan, h.mac, h.sender);
        if learned {
            k.ex.set_remote(h.ifindex, h.vni, h.mac, h.sender).expect("remotes");
        }
        let taught = due == Some((h.vni, h.mac, h.sender));
        let frame = match v.action {
            _ if taught => "a frame that taught it the core".to_string(),
            Action::Drop(c) => format!("a frame the core dropped ({})", c.name()),
            _ => "a frame that taught the core nothing".into(),
        };
        t.saw(format!(
            "tunnel: a station heard reported, from {frame}, the core {} it",
            if learned { "learns" } else { "refuses" }
        ));
    }
}

fn describe(cv: &Converted) -> String {
    let mut s = format!("  input {:?}\n  admit key {:?}\n  admit {:?}\n", cv.input, cv.ak, cv.admit);
    if let Some((fk, v)) = &cv.flow {
        let _ = writeln!(s, "  flow key {fk:?}");
        let outs: Vec<_> = v.outputs[..usize::from(v.n_out).min(abi::MAX_OUTPUTS)].to_vec();
        let _ = writeln!(
            s,
            "  verdict: generation {}, action {}, cause {}, flags {:#x}, next hop {} {}, outputs {outs:?}",
            v.generation,
            v.action,
            v.cause,
            v.flags,
            v.next_hop,
            MacAddr(v.next_mac)
        );
    }
    s
}

/// Totals of a run.
#[derive(Default)]
struct Totals {
    cases: u64,
    switches: u64,
    hits: u64,
    misses: u64,
    keyless: u64,
    refused: u64,
    stale: u64,
    /// What the cases were, by what the core did with them and what that asked of the
    /// kernel (a case counts in several).
    seen: std::collections::BTreeMap<String, u64>,
}

impl Totals {
    fn saw(&mut self, what: impl Into<String>) {
        *self.seen.entry(what.into()).or_default() += 1;
    }

    /// Counts what a frame from a tunnel or with an output into one asked of the kernel.
    fn tunnelled(&mut self, inst: &Installed, case: &Case, v: &Verdict, core: &CoreSide, served: bool) {
        if let Some((o, known)) = case.origin {
            let carried = inst.tunnels[case.from].as_ref().is_some_and(|t| t.rules.vnis.vlan_of(o.vni).is_some());
            self.saw(format!(
                "tunnel in: from {}, {}",
                if known { "an endpoint" } else { "a stranger" },
                if carried { "a VNI it carries" } else { "a VNI it does not carry" }
            ));
            self.saw(format!(
                "tunnel in: {}",
                match v.action {
                    Action::Forward if !core.placed => "not placed".to_string(),
                    Action::Forward => "forwarded or flooded".into(),
                    Action::Drop(c) => format!("dropped: {}", c.name()),
                    Action::Up(_) => "up".into(),
                }
            ));
        }
        if v.action != Action::Forward || v.outputs.len() > abi::MAX_OUTPUTS || !core.placed {
            return;
        }
        for o in &v.outputs {
            if inst.tunnels[o.port as usize].is_none() {
                continue;
            }
            let endpoints = inst.tunnels[o.port as usize].as_ref().map_or(0, |t| t.rules.remotes.len());
            self.saw(if o.mirror || v.next_hop.is_some() {
                "tunnel out: a mirror's copy or a routed frame, up".to_string()
            } else if v.flood && served {
                format!("tunnel out: a flood, replicated by the kernel (a set of {endpoints} endpoints)")
            } else if v.flood {
                "tunnel out: a flood, up (a GSO frame for several endpoints)".to_string()
            } else if served {
                "tunnel out: sent to the station's endpoint by the kernel".to_string()
            } else {
                "tunnel out: its endpoint not in the remote table, up".to_string()
            });
        }
    }

    /// Counts what the core did with a frame it decided.
    fn decided(&mut self, case: &Case, v: &Verdict, core: &CoreSide) {
        let fate = match v.action {
            Action::Forward if v.pass_to_host && v.outputs.is_empty() => "the host's alone".to_string(),
            Action::Forward if v.outputs.len() > abi::MAX_OUTPUTS => "up: more outputs than a verdict holds".into(),
            Action::Forward if !core.placed => "up: waits for its next hop".into(),
            Action::Forward if v.next_hop.is_some() => "routed".into(),
            Action::Forward if v.flood => "flooded".into(),
            Action::Forward => "forwarded".into(),
            Action::Drop(c) => format!("dropped: {}", c.name()),
            Action::Up(Upcall::Resolve(_)) => "up: Resolve".into(),
            Action::Up(u) => format!("up: {u:?}"),
        };
        if v.acl.consulted {
            self.saw(format!("security groups: {fate}{}", if v.acl.commit { ", a connection remembered" } else { "" }));
        }
        if let Some((k, _)) = core.decision.as_ref().filter(|(k, _)| k.dst == sluice_switch::Dest::Group) {
            let family = if case.bytes.windows(2).nth(12) == Some(&[0x86, 0xdd][..]) { "IPv6" } else { "IPv4" };
            self.saw(match k.group {
                sluice_switch::GroupClass::Set(_) => format!("group: {family}, registered"),
                g => format!("group: {family}, {g:?}"),
            });
        }
        if let Some(a) = core.decision.as_ref().and_then(|(k, _)| k.extras.acl) {
            let whose = if sluice_switch::conntrack::kernel_tracks(a.proto) { "the kernel's" } else { "the core's" };
            self.saw(format!("security groups: connection {:?}, {whose}", a.ct));
        }
        self.saw(fate);
        if v.pass_to_host && !v.outputs.is_empty() {
            self.saw("the host's too");
        }
        if v.learn_refused {
            self.saw("learn_refused");
        }
        if case.bytes.get(12..14) == Some(&[0x81, 0x00][..]) {
            self.saw("arrived tagged");
        }
        if case.vnet.is_gso() {
            self.saw(format!("GSO, {}", if core.placed { "forwarded" } else { "not forwarded" }));
        }
        if !core.placed {
            return;
        }
        for o in &v.outputs {
            let c = &core.counters[o.port as usize];
            self.saw(match o.tag {
                Some(_) => "output: tagged",
                None => "output: untagged",
            });
            if o.mirror {
                self.saw("output: a mirror's copy");
            }
            if o.src_mac.is_some() {
                self.saw("output: source rewritten");
            }
            if c[c::TX_DROP + usize::from(convert::cause(DropCause::OverMtu))] > 0 {
                self.saw("output: over its MTU");
            }
        }
    }
}

/// Runs one switch's frames through both sides; panics on the first disagreement.
fn one_switch(k: &mut Kernel, seed: u64, index: u64, frames: usize, t: &mut Totals) {
    let mut r = Rng(seed ^ index.wrapping_mul(0x2545_f491_4f6c_dd1d));
    let spec = gen_switch(&mut r);
    let mut n = 0;
    check_switch(k, &spec, Origin::Seed { seed, index }, index, t, |w| {
        n += 1;
        (n <= frames).then(|| w.frame(&mut r))
    });
}

/// An EVPN tunnel's routes, as its switch's agent would install them: a few stations
/// behind the endpoints the routes name, each VNI's flood list; changed as frames go by
/// (a station withdrawn, moved to the other endpoint, a flood list shrunk or grown).
struct Routes {
    /// (tunnel port, its VNIs, IPv6 underlay)
    tunnels: Vec<(usize, Vec<u32>, bool)>,
    rng: Rng,
}

impl Routes {
    fn new(spec: &SwitchSpec, index: u64) -> Routes {
        let tunnels = spec
            .ports
            .iter()
            .enumerate()
            .filter_map(|(i, p)| {
                let t = p.tunnel.as_ref().filter(|t| t.rules.evpn)?;
                let vnis = match &t.rules.vnis {
                    VniMap::Single(v) => vec![*v],
                    VniMap::PerVlan(m) => m.iter().map(|p| p.1).collect(),
                };
                Some((i, vnis, t.local.is_ipv6()))
            })
            .collect();
        Routes { tunnels, rng: Rng(index ^ 0xe7b9) }
    }

    /// The first routes: every VNI floods to both route endpoints, and stations 1 to 6
    /// (which frames use too) are behind one of them.
    fn install(&mut self, sw: &mut Switch) {
        for (i, vnis, v6) in self.tunnels.clone() {
            let both = [endpoint(4, v6), endpoint(5, v6)];
            sw.evpn_endpoints(i as PortId, &both);
            for &vni in &vnis {
                sw.evpn_flood(i as PortId, vni, &both);
                for k in 1..=6 {
                    let ep = both[self.rng.below(2)];
                    sw.evpn_install(i as PortId, vni, station(k), ep);
                }
            }
        }
    }

    /// Whether the kernel's tables hold every EVPN tunnel's routes as the core has them: each
    /// station's endpoint in the remote table, each VNI's flood set.
    fn agree(&self, k: &Kernel, inst: &Installed, sw: &Switch) -> Result<(), String> {
        for (i, vnis, _) in &self.tunnels {
            let d = inst.places[*i].device.expect("every port has a device");
            for &vni in vnis {
                for mac in (1..=12).map(station) {
                    let core = sw.fast_remote(*i as PortId, vni, mac).map(ip16);
                    let kernel = k.ex.remote(d.ifindex, vni, mac).map(|r| r.addr);
                    if core != kernel {
                        return Err(format!("VNI {vni} station {mac}: core {core:?}, kernel {kernel:?}"));
                    }
                }
                let vlan = inst.tunnels[*i].as_ref().and_then(|t| t.rules.vnis.vlan_of(vni)).flatten().unwrap_or(0);
                let core = sw.tunnel_floods(*i as PortId, vlan).and_then(|v| convert::flood_eps(&v));
                let kernel = k.ex.flood(d.ifindex, vni);
                if core != kernel {
                    return Err(format!("VNI {vni}: core floods to {core:?}, kernel to {kernel:?}"));
                }
            }
        }
        Ok(())
    }

    /// One change, at random: a station's route withdrawn, moved or added; a flood list
    /// changed.
    fn churn(&mut self, sw: &mut Switch) {
        if self.tunnels.is_empty() {
            return;
        }
        let (i, vnis, v6) = self.tunnels[self.rng.below(self.tunnels.len())].clone();
        let vni = self.rng.pick(&vnis);
        let both = [endpoint(4, v6), endpoint(5, v6)];
        let mac = station(self.rng.range(1, 12));
        match self.rng.below(4) {
            0 => sw.evpn_uninstall(i as PortId, vni, mac),
            1 => sw.evpn_flood(i as PortId, vni, &both[..self.rng.range(0, 2)]),
            _ => {
                sw.evpn_install(i as PortId, vni, mac, both[self.rng.below(2)]);
            }
        }
    }
}

/// Runs the frames `next` gives (from the switch's world, until `None`) through a switch
/// built from `spec` and through the kernel; panics on the first disagreement. `index`
/// sets the kernel's generations apart from every other switch's.
fn check_switch(
    k: &mut Kernel,
    spec: &SwitchSpec,
    origin: Origin,
    index: u64,
    t: &mut Totals,
    mut next: impl FnMut(&World) -> Option<Case>,
) {
    let spec = spec.clone();
    let (mut sw, handles) = build(&spec);
    let places: Vec<Place> = spec
        .ports
        .iter()
        .enumerate()
        .map(|(i, p)| Place { slot: p.slot, device: Some(Device { ifindex: k.devs[i], reach: p.reach }) })
        .collect();
    let mut inst = Installed {
        mode: spec.mode,
        places,
        tunnels: spec.ports.iter().map(|p| p.tunnel.clone()).collect(),
        forget_heard: spec.forget_heard,
        gen_base: (index + 1) * GENERATIONS_PER_SWITCH,
        generation: 0,
        admits: HashMap::new(),
        verdicts: HashMap::new(),
        stations: HashSet::new(),
        locks: HashMap::new(),
        owners: HashSet::new(),
        neigh: HashSet::new(),
        inputs: HashSet::new(),
        groups: HashSet::new(),
        acl_set: (index as u32 + 1) << 12,
        acl_epoch: None,
    };
    // Security groups: the connections of this switch's frames in a zone of its own, the
    // core told of the kernel's tracker (its commits held until the kernel ran the frame).
    let zone = (index % 60_000) as u16 + 1_000;
    k.ex.set_conntrack(zone, sluice_switch::conntrack::kernel_timeouts_ms()).expect("config");
    let held = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let ct = k.ex.conntrack().expect("the conntrack programs");
    sw.set_kernel_tracker(Some(Box::new(HeldCommits { ct, held: held.clone() })));
    let committer = k.ex.conntrack().expect("the conntrack programs");
    // A tunnel's settings and endpoints, as the daemon's `add_tunnel` writes them.
    for (p, t) in inst.places.iter().zip(&inst.tunnels) {
        if let (Some(d), Some(t)) = (p.device, t) {
            k.ex.set_tunnel(d.ifindex, &convert::tunnel(t.local, 64)).expect("tunnels");
        }
    }
    // An EVPN tunnel's routes: stations behind the endpoints they name, and each VNI's
    // flood list (the sync below writes them as the daemon does).
    let mut routes = Routes::new(&spec, index);
    routes.install(&mut sw);
    inst.sync(k, &mut sw);
    let mut mtus: Vec<u16> = spec.ports.iter().map(|p| p.mtu).collect();
    mtus.sort_unstable();
    mtus.dedup();
    let world = World { spec: &spec, mtus, recent: Default::default() };
    let mut now_ms = 1_000;
    let mut keyed: Vec<Case> = Vec::new();
    let mut n = 0;
    while let Some(case) = next(&world) {
        n += 1;
        // The connections the core remembered on the last frame, now that the kernel ran it.
        for f in held.lock().expect("not poisoned").drain(..) {
            committer.commit(&f).expect("a commit");
        }
        // Frames that waited for a next hop's address give up first, so that nothing but
        // this frame moves the counters.
        if sw.ports().iter().any(|p| p.resolving > 0) {
            now_ms += 10_000;
            sw.expire(now_ms);
        }
        now_ms += 1;
        // (What the core told its tunnels of earlier reports is no concern of this frame.)
        for h in &handles {
            let _ = h.take_remotes();
        }
        if n % 8 == 0 {
            routes.churn(&mut sw);
        }
        let core = core_receives(&mut sw, &handles, &case, now_ms);
        inst.sync(k, &mut sw);
        if let Err(why) = routes.agree(k, &inst, &sw) {
            panic!("{origin:?}, frame {n}: the kernel's tunnel tables are not the core's: {why}");
        }
        t.cases += 1;
        // What the core's tunnel port was told the frame teaches (where its source is).
        let taught = handles[case.from].take_remotes();
        if test_run_refuses(&case.bytes) {
            t.refused += 1;
            continue;
        }
        let report = |step: &str, obs: &Observed, want: Option<&Expected>, why: Vec<String>, installed: String| {
            Report { origin, spec: &spec, case_no: n, case: &case, core: &core, installed, step, obs, want, why }.fail()
        };
        let Some((key, v)) = core.decision.clone() else {
            if let Some((obs, why)) = keyless(k, &inst, &sw, &case, &core, t) {
                report(
                    "a frame the core dropped before deciding: the kernel must drop it too, or hand it up",
                    &obs,
                    None,
                    why,
                    String::new(),
                );
            }
            continue;
        };
        keyed.push(case.clone());
        let cv = convert_decision(&sw, &inst, case.from, &key, &v);
        let hit = inst.hits(&cv.ak, cv.flow.as_ref().map(|f| &f.0));
        let served = served(k, &inst, &case, &v, &cv);
        // A station the frame teaches the core is behind its sender, where the kernel's
        // remote table does not have it there: the kernel must report it.
        let due = case.origin.and_then(|(o, _)| {
            let src = MacAddr(case.bytes[6..12].try_into().expect("a whole header"));
            let learns = inst.mode == Mode::L2 && !src.is_zero() && taught.contains(&(o.vni, src, o.sender));
            (learns && !inst.remote(k, case.from, o.vni, src, Some(o.sender))).then_some((o.vni, src, o.sender))
        });
        let obs = run(k, &inst, &case);
        let mut heard = obs.heard.clone();
        if hit {
            t.hits += 1;
        } else {
            t.misses += 1;
            let want = expect_up(&case, &inst, &core, &cv.input, cv.ak.dst, true, false);
            let why = differences(&want, &obs);
            if !why.is_empty() {
                report("the frame's keys have no current verdict: it must miss", &obs, Some(&want), why, describe(&cv));
            }
            inst.install(k, cv.ak, cv.admit, cv.flow);
        }
        let want = expect_hit(k, &case, &inst, &core, &key, &v, &cv.input, served);
        let obs = if hit { obs } else { run(k, &inst, &case) };
        if !hit {
            heard.extend(obs.heard.iter().cloned());
        }
        let why = differences(&want, &obs);
        if !why.is_empty() {
            report("the kernel executed the installed verdict otherwise", &obs, Some(&want), why, describe(&cv));
        }
        t.decided(&case, &v, &core);
        if case.origin.is_some() && spec.ports[case.from].tunnel.as_ref().is_some_and(|t| t.rules.evpn) {
            t.saw(format!("EVPN tunnel in: a source keyed {:?}", key.src));
        }
        t.tunnelled(&inst, &case, &v, &core, served);
        if let Some((vni, mac, sender)) = due
            && !heard.iter().any(|h| (h.vni, h.mac, h.sender) == (vni, mac, sender))
        {
            let why = vec![format!("no report of {mac} in VNI {vni} heard from {sender} (reported: {heard:?})")];
            report(
                "the core learned a station behind a tunnel the kernel did not report",
                &obs,
                None,
                why,
                describe(&cv),
            );
        }
        // A frame the core drops before learning teaches it nothing: the kernel must not
        // report where its source was heard (the core would learn it from the report).
        if let (false, Some((o, _))) = (sw.admits(&key), case.origin) {
            let src = MacAddr(case.bytes[6..12].try_into().expect("a whole header"));
            if heard.iter().any(|h| h.mac == src && h.vni == o.vni && h.sender == o.sender) {
                let why = vec![format!("a report of {src} heard from {} (reported: {heard:?})", o.sender)];
                report(
                    "the kernel reported a station heard from a frame the core drops before learning",
                    &obs,
                    None,
                    why,
                    describe(&cv),
                );
            }
        }
        hand_heard(k, &inst, &mut sw, &heard, due, &v, t);
        // The last output, seen as a clone: the same verdict with every output cloned (not
        // for a GSO frame, whose clones a test run cannot send).
        // (Not for a verdict that committed a connection: the frame is of it now.)
        if let (Some((port, w)), Some((fk, fv)), false) = (&want.last, &cv.flow, case.vnet.is_gso())
            && fv.ct == abi::CT_NONE
        {
            let witness = abi::Verdict { flags: fv.flags | abi::V_HOST, ..*fv };
            k.ex.install(fk, &witness).expect("verdicts");
            let obs = run(k, &inst, &case);
            k.ex.install(fk, fv).expect("verdicts");
            let got = obs.sent.iter().find(|(p, _)| *p == Some(*port));
            if got.map(|(_, g)| g) != Some(w) {
                let why = vec![format!(
                    "the last output, p{port}, got {} (want {})",
                    got.map_or("nothing".into(), |(_, g)| hex(g)),
                    hex(w)
                )];
                report("the last output's copy (seen as a clone)", &obs, None, why, describe(&cv));
            }
        }
    }
    // A new generation in the kernel: every verdict installed is stale, every frame with a
    // key misses.
    k.ex.configure(inst.generation + 1, k.upcall).expect("config");
    for case in keyed.iter().rev().take(24) {
        let core = core_receives_nothing(&inst, case);
        let obs = run(k, &inst, case);
        let input = convert::input(
            &sw.fast_port(case.from as PortId).expect("a port"),
            inst.places[case.from].slot,
            inst.mode,
            sw.config().router_mac,
        );
        let dst = stage1_dst_of(&case.bytes, &input);
        let want = expect_up(case, &inst, &core, &input, dst, true, false);
        let why = differences(&want, &obs);
        if !why.is_empty() {
            Report {
                origin,
                spec: &spec,
                case_no: 0,
                case,
                core: &core,
                installed: String::new(),
                step: "after the generation moved on, a verdict of the last one was used",
                obs: &obs,
                want: Some(&want),
                why,
            }
            .fail();
        }
        t.stale += 1;
    }
    inst.clear(k);
    t.switches += 1;
}

/// The counters a frame moves as it is received (what a miss counts besides itself).
fn core_receives_nothing(inst: &Installed, case: &Case) -> CoreSide {
    let mut counters = vec![[0u64; c::COUNT]; inst.places.len()];
    counters[case.from][c::RX_FRAMES] = 1;
    counters[case.from][c::RX_BYTES] = case.bytes.len() as u64;
    counters[case.from][c::RX_GSO] = u64::from(case.vnet.is_gso());
    CoreSide { decision: None, counters, sent: Vec::new(), placed: false }
}

/// Whether the frame holds its 802.1Q tag and a tag after it whole.
fn whole_tags(f: &[u8]) -> bool {
    let tag = |at: usize| f.get(at..at + 2).is_some_and(|t| t == [0x81, 0x00] || t == [0x88, 0xa8]);
    let off = if f.get(12..14) == Some(&[0x81, 0x00][..]) { 16 } else { 12 };
    f.len() >= off + 2 && !(tag(off) && f.len() < off + 6)
}

/// Stage 1's destination class of a frame arriving on `input`.
fn stage1_dst_of(f: &[u8], input: &abi::Input) -> u8 {
    if f[..5] == [0x01, 0x80, 0xc2, 0, 0] && f[5] < 16 {
        abi::DST_LINK_LOCAL
    } else if f[..6] == [0xff; 6] {
        abi::DST_BROADCAST
    } else if f[0] & 1 != 0 {
        abi::DST_GROUP
    } else if input.flags & abi::IN_OWN_MAC != 0 && f[..6] == input.own_mac {
        abi::DST_OWN
    } else {
        abi::DST_UNKNOWN
    }
}

/// A frame the core dropped before it had a key (not valid, or a GSO frame it will not
/// cut): the kernel may drop it for the same cause, hand it up, or — the host's own frame
/// on its uplink — leave it to the host, and must send it nowhere else. What it did and
/// why that is none of those, if it is not.
fn keyless(
    k: &mut Kernel,
    inst: &Installed,
    sw: &Switch,
    case: &Case,
    core: &CoreSide,
    t: &mut Totals,
) -> Option<(Observed, Vec<String>)> {
    t.keyless += 1;
    let cause =
        DropCause::ALL.iter().find(|&&c| core.counters[case.from][c::RX_DROP + usize::from(convert::cause(c))] > 0);
    t.saw(format!("dropped before deciding: {}", cause.map_or("?", |c| c.name())));
    let obs = run(k, inst, case);
    let input = convert::input(
        &sw.fast_port(case.from as PortId).expect("a port"),
        inst.places[case.from].slot,
        inst.mode,
        sw.config().router_mac,
    );
    let dst = stage1_dst_of(&case.bytes, &input);
    let dropped =
        Expected { code: SHOT, frame: None, mark: None, sent: Vec::new(), counters: core.counters.clone(), last: None };
    // (A frame cut inside a tag is no one's: the kernel reads no further.)
    let whole = whole_tags(&case.bytes);
    let host = whole && input.flags & abi::IN_HOST != 0 && dst != abi::DST_UNKNOWN;
    let dropped =
        if host { Expected { code: OK, frame: Some(case.bytes.clone()), mark: Some(0), ..dropped } } else { dropped };
    let mut candidates = vec![dropped];
    for miss in [true, false] {
        candidates.push(expect_up(case, inst, core, &input, dst, miss, false));
    }
    if input.flags & abi::IN_HOST != 0 && dst == abi::DST_OWN {
        candidates.push(Expected {
            code: OK,
            frame: Some(case.bytes.clone()),
            mark: Some(0),
            sent: Vec::new(),
            counters: vec![[0; c::COUNT]; inst.places.len()],
            last: None,
        });
    }
    if candidates.iter().any(|w| differences(w, &obs).is_empty()) {
        return None;
    }
    let why = candidates.iter().map(|w| differences(w, &obs).join("; ")).collect();
    Some((obs, why))
}

fn env(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    let v = v.trim().replace('_', "");
    let parsed = match v.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16),
        None => v.parse(),
    };
    Some(parsed.unwrap_or_else(|_| panic!("{name}={v} is not a number")))
}

#[test]
#[ignore = "system tier: needs root (BPF: the executor's programs on veths in network namespaces of its own); scripts/test.sh runs it"]
fn the_kernel_does_what_the_core_decided() {
    if !root() {
        return;
    }
    let cases = env("SLUICE_DIFF_CASES").unwrap_or(DEFAULT_CASES);
    let seed = env("SLUICE_DIFF_SEED").unwrap_or(DEFAULT_SEED);
    let only = env("SLUICE_DIFF_SWITCH");
    in_own_namespaces(move || {
        let mut k = Kernel::new();
        let mut t = Totals::default();
        let start = Instant::now();
        match only {
            Some(i) => one_switch(&mut k, seed, i, FRAMES_PER_SWITCH, &mut t),
            None => {
                let mut i = 0;
                while t.cases < cases {
                    let frames = FRAMES_PER_SWITCH.min((cases - t.cases) as usize);
                    one_switch(&mut k, seed, i, frames, &mut t);
                    i += 1;
                }
            }
        }
        eprintln!(
            "differential: seed {seed:#x}: {} cases on {} switches in {:.1} s: {} hits, {} misses then installed, \
             {} dropped by the core before deciding, {} stale verdicts missed, {} frames a test run refuses (the \
             core's alone)",
            t.cases,
            t.switches,
            start.elapsed().as_secs_f64(),
            t.hits,
            t.misses,
            t.keyless,
            t.stale,
            t.refused
        );
        for (what, n) in &t.seen {
            eprintln!("  {n:>9}  {what}");
        }
    });
}

/// Runs `f` on a thread of its own in a network and a mount namespace of its own: the
/// devices it makes and the bpffs it mounts go with them when the thread ends, whether
/// `f` passed, panicked, or the test was killed.
fn in_own_namespaces(f: impl FnOnce() + Send + 'static) {
    let t = std::thread::spawn(move || {
        // SAFETY: unshare moves only the calling thread (its own copy of the file system
        // context, which CLONE_NEWNS implies) into new namespaces; no memory is involved.
        let r = unsafe { libc::unshare(libc::CLONE_NEWNET | libc::CLONE_NEWNS) };
        assert_eq!(r, 0, "unshare(CLONE_NEWNET | CLONE_NEWNS): {}", std::io::Error::last_os_error());
        // Nothing mounted here is seen outside, nor outlives the namespace.
        // SAFETY: mount(2) with a NUL-terminated path and null source, type and data.
        let r = unsafe {
            libc::mount(
                std::ptr::null(),
                c"/".as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            )
        };
        assert_eq!(r, 0, "making / private: {}", std::io::Error::last_os_error());
        f();
    });
    if let Err(panic) = t.join() {
        std::panic::resume_unwind(panic);
    }
}

// ---------------------------------------------------------------------------------------
// Regressions: each disagreement the generated cases found, kept as the smallest switch
// and frames that show it (docs/results/2026-11-27-differential.md lists them).

/// An access port of VLAN 1, MTU 1500, in slot `slot`: a guest's veth.
fn port(slot: u16) -> PortSpec {
    PortSpec {
        vlan: VlanMode::Access(1),
        mtu: 1500,
        uplink: false,
        isolated: false,
        dev_mac: None,
        mac: None,
        ips: Vec::new(),
        learn_ips: false,
        mirror_of: None,
        drop_ethertypes: Vec::new(),
        forward_link_local: 0,
        storm: StormControl::default(),
        rate: RateLimit::default(),
        reach: Reach::Guest,
        slot,
        tunnel: None,
    }
}

fn uplink(slot: u16, dev: Option<MacAddr>) -> PortSpec {
    PortSpec { uplink: true, dev_mac: dev, reach: Reach::Uplink, ..port(slot) }
}

fn switch(mode: Mode, ports: Vec<PortSpec>) -> SwitchSpec {
    SwitchSpec {
        mode,
        ports,
        port_mac_limit: 1024,
        fib_max: 8192,
        statics: Vec::new(),
        forget_heard: false,
        acls: Vec::new(),
        acl_defaults: Vec::new(),
    }
}

fn case(from: usize, bytes: Vec<u8>, what: &str) -> Case {
    Case { from, vnet: VnetHdr::default(), bytes, what: what.into(), origin: None }
}

/// A UDP/IPv4 frame of `payload` bytes from `src` to `dst`, 10.0.0.1 to 10.0.0.9.
fn udp4(dst: MacAddr, src: MacAddr, payload: usize) -> Vec<u8> {
    let mut f = eth(dst, src, 0x0800);
    f.extend(ipv4(guest_v4(0), guest_v4(8), 17, 8 + payload, false));
    f.extend(l4_header(false, 8, payload));
    f.extend(pattern(payload, 1));
    f
}

/// A UDP GSO frame (IPv4) with `payload` bytes cut at `gso_size`.
fn udp4_gso(dst: MacAddr, src: MacAddr, payload: usize, gso_size: u16) -> (VnetHdr, Vec<u8>) {
    let vnet = VnetHdr {
        flags: VnetHdr::F_NEEDS_CSUM,
        gso_type: VnetHdr::GSO_UDP_L4,
        hdr_len: 42,
        gso_size,
        csum_start: 34,
        csum_offset: 6,
        num_buffers: 0,
    };
    (vnet, udp4(dst, src, payload))
}

/// Runs `cases` through a switch built from `spec` and through the kernel, in a network
/// namespace of the test's own; panics on the first disagreement.
fn regression(name: &'static str, spec: SwitchSpec, cases: Vec<Case>) {
    if !root() {
        return;
    }
    in_own_namespaces(move || {
        let mut k = Kernel::new();
        let mut cases = cases.into_iter();
        check_switch(&mut k, &spec, Origin::Named(name), 0, &mut Totals::default(), |_| cases.next());
    });
}

const UNKNOWN: MacAddr = MacAddr([2, 0, 0, 0, 0, 0x99]);

#[test]
#[ignore = "system tier: needs root (BPF: the executor's programs on veths in network namespaces of its own); scripts/test.sh runs it"]
fn a_gso_frame_whose_ip_length_runs_past_the_frame_is_malformed_in_both() {
    // The first frame installs the verdict (flooded) that the second, of the same key,
    // finds; the kernel measured GSO frames without the core's checks and sent it on.
    let (vnet, good) = udp4_gso(UNKNOWN, station(1), 300, 100);
    let mut long = good.clone();
    long[16..18].copy_from_slice(&(20 + 8 + 400u16).to_be_bytes());
    regression(
        "a_gso_frame_whose_ip_length_runs_past_the_frame_is_malformed_in_both",
        switch(Mode::L2, vec![port(7), port(8)]),
        vec![
            Case { vnet, ..case(0, good, "gso") },
            Case { vnet, ..case(0, long, "gso, its IP length past the frame") },
        ],
    );
}

#[test]
#[ignore = "system tier: needs root (BPF: the executor's programs on veths in network namespaces of its own); scripts/test.sh runs it"]
fn a_tag_popped_that_uncovers_another_is_counted_with_it() {
    // The frame leaves with its inner 802.1ad tag outermost, which popping the 802.1Q tag
    // moved into the skb's metadata: the kernel counted 4 bytes fewer than it sent.
    let mut inner = eth(UNKNOWN, station(1), 0x88a8);
    inner.extend_from_slice(&[0, 5, 0x08, 0x00]);
    inner.extend(pattern(40, 2));
    let trunk = PortSpec { vlan: VlanMode::Trunk { allowed: [1].into_iter().collect(), native: None }, ..port(3) };
    regression(
        "a_tag_popped_that_uncovers_another_is_counted_with_it",
        switch(Mode::L2, vec![trunk, port(4)]),
        vec![case(0, tagged(&inner, 1), "802.1ad inside 802.1Q")],
    );
}

#[test]
#[ignore = "system tier: needs root (BPF: the executor's programs on veths in network namespaces of its own); scripts/test.sh runs it"]
fn a_tag_followed_by_another_cut_short_is_malformed_in_both() {
    // The core sent the frame on; the kernel could not pop its tag (the helper moves the
    // next tag into the metadata, and there is none whole) and counted a transmit error.
    let mut f = eth(UNKNOWN, station(1), 0x88a8);
    f.push(0);
    let trunk = PortSpec { vlan: VlanMode::Trunk { allowed: [1].into_iter().collect(), native: None }, ..port(3) };
    regression(
        "a_tag_followed_by_another_cut_short_is_malformed_in_both",
        switch(Mode::L2, vec![trunk, port(4)]),
        vec![case(0, tagged(&udp4(UNKNOWN, station(1), 20), 1), "udp"), case(0, tagged(&f, 1), "a cut 802.1ad tag")],
    );
}

#[test]
#[ignore = "system tier: needs root (BPF: the executor's programs on veths in network namespaces of its own); scripts/test.sh runs it"]
fn a_gso_frame_from_a_group_source_is_counted_as_gso() {
    let (vnet, f) = udp4_gso(UNKNOWN, GROUPS[1], 300, 100);
    regression(
        "a_gso_frame_from_a_group_source_is_counted_as_gso",
        switch(Mode::L2, vec![port(1), port(2)]),
        vec![Case { vnet, ..case(0, f, "gso from a group address") }],
    );
}

#[test]
#[ignore = "system tier: needs root (BPF: the executor's programs on veths in network namespaces of its own); scripts/test.sh runs it"]
fn the_hosts_frames_the_switch_drops_still_reach_the_host() {
    // On an uplink that may be the host's interface: a frame to its address from a group
    // source, and a broadcast GSO frame of tiny segments. The kernel dropped both; the
    // host gets them with an installed verdict, and on the user-space datapath.
    let dev = MacAddr([2, 0xee, 0, 0, 0, 1]);
    let (mut vnet, tiny) = udp4_gso(MacAddr::BROADCAST, station(1), 300, 100);
    vnet.gso_size = 20;
    regression(
        "the_hosts_frames_the_switch_drops_still_reach_the_host",
        switch(Mode::L2, vec![uplink(5, Some(dev)), port(6)]),
        vec![
            case(0, udp4(dev, GROUPS[2], 20), "to the host, from a group address"),
            case(0, udp4(MacAddr::BROADCAST, station(1), 20), "broadcast"),
            Case { vnet, ..case(0, tiny, "broadcast gso, 20-byte segments") },
        ],
    );
}

/// A Layer 3 switch: an uplink in slot 10 (device address `dev`) and guests in slots 11 on.
fn l3(guests: usize, dev: Option<MacAddr>) -> SwitchSpec {
    let mut ports = vec![uplink(10, dev)];
    ports.extend((0..guests).map(|i| port(11 + i as u16)));
    switch(Mode::L3, ports)
}

#[test]
#[ignore = "system tier: needs root (BPF: the executor's programs on veths in network namespaces of its own); scripts/test.sh runs it"]
fn a_frame_to_the_address_its_source_teaches_is_keyed_after_learning() {
    // The guest's first IPv4 packet, to its own address: the core read the owner of the
    // destination before learning the source (none), routed it to the LAN, and installed
    // it under a key no frame has afterwards.
    let mut f = eth(DEFAULT_ROUTER_MAC, station(2), 0x0800);
    f.extend(ipv4(guest_v4(1), guest_v4(1), 17, 28, false));
    f.extend(l4_header(false, 8, 20));
    f.extend(pattern(20, 3));
    regression(
        "a_frame_to_the_address_its_source_teaches_is_keyed_after_learning",
        l3(1, None),
        vec![case(1, f, "ipv4 to its own address")],
    );
}

#[test]
#[ignore = "system tier: needs root (BPF: the executor's programs on veths in network namespaces of its own); scripts/test.sh runs it"]
fn in_layer_3_a_source_is_the_inputs_guest_or_no_one() {
    // Two guests sending from one address, and the LAN sending from it: the station
    // table (by VLAN and address) answered for one port only, where the core answers
    // "the input's guest" for each.
    let ip = |i: usize, dst: MacAddr| {
        let mut f = eth(dst, station(9), 0x0800);
        f.extend(ipv4(guest_v4(i), lan_v4(1), 17, 28, false));
        f.extend(l4_header(false, 8, 20));
        f.extend(pattern(20, 4));
        f
    };
    let dev = MacAddr([2, 0xee, 0, 0, 0, 1]);
    regression(
        "in_layer_3_a_source_is_the_inputs_guest_or_no_one",
        l3(2, Some(dev)),
        vec![
            case(1, ip(1, DEFAULT_ROUTER_MAC), "p1"),
            case(2, ip(2, DEFAULT_ROUTER_MAC), "p2"),
            case(1, ip(1, DEFAULT_ROUTER_MAC), "p1 again"),
            case(0, ip(0, dev), "the LAN"),
        ],
    );
}

#[test]
#[ignore = "system tier: needs root (BPF: the executor's programs on veths in network namespaces of its own); scripts/test.sh runs it"]
fn in_layer_3_a_frame_that_does_not_read_claims_its_source_as_in_layer_2() {
    // An ARP message of another operation from a guest whose addresses are checked: the
    // core keyed its claimed address as "too short to say", the kernel as the address.
    let mut b = vec![0u8; 64];
    let n = neigh::write_arp(&mut b, 3, MacAddr::BROADCAST, station(2), guest_v4(1), MacAddr([0; 6]), guest_v4(0))
        .expect("room");
    b.truncate(n);
    let mut spec = l3(1, None);
    spec.ports[1].ips = vec![guest_v4(1).into()];
    regression(
        "in_layer_3_a_frame_that_does_not_read_claims_its_source_as_in_layer_2",
        spec,
        vec![case(1, b, "arp, operation 3")],
    );
}

#[test]
#[ignore = "system tier: needs root (BPF: the executor's programs on veths in network namespaces of its own); scripts/test.sh runs it"]
fn in_layer_3_an_uplinks_source_is_keyed_alike_whether_or_not_it_is_admitted() {
    // An uplink locked to its `mac`, which is its guest address in Layer 3: the core keyed
    // the source as the input's guest for a frame its checks refused, and as no one's for
    // one they admitted.
    let lock = station(9);
    let mut spec = l3(1, None);
    spec.ports[0].mac = Some(lock);
    let mut other = eth(DEFAULT_ROUTER_MAC, lock, 0x88b5);
    other.extend(pattern(30, 5));
    let mut ip = eth(DEFAULT_ROUTER_MAC, lock, 0x0800);
    ip.extend(ipv4(lan_v4(1), guest_v4(1), 17, 28, false));
    ip.extend(l4_header(false, 8, 20));
    ip.extend(pattern(20, 5));
    regression(
        "in_layer_3_an_uplinks_source_is_keyed_alike_whether_or_not_it_is_admitted",
        spec,
        vec![case(0, other, "not ip"), case(0, ip, "ipv4 to a guest")],
    );
}

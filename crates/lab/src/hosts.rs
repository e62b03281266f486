//! `sluice lab up --hosts N [--peer-kernel]`: several "hosts" on one machine, each a
//! network namespace with its own switch and guests, joined by a veth underlay and VXLAN
//! tunnels into one LAN (docs/architecture.md, "VXLAN tunnels").
//!
//! Host K that runs sluice is a lab of its own, `LABhK` (its switch, its guests `hKgJ`,
//! numbered on across hosts so every guest has its own 10.77.0.N), plus a vxlan port
//! `vx0` whose socket lives in the host's namespace `sluice-LAB-hK` (on the kernel
//! datapath, the default, a vxlan device in the switch's namespace whose socket lives
//! there). A kernel peer host
//! (`--peer-kernel`, the last one) is a `vxlan` device and a bridge in its namespace, its
//! guests on veth pairs. The lab `LAB` itself lists every guest (so `lab exec h2g1 -- …`
//! finds them), the underlay, the hosts and the kernel host's guests, and takes the host
//! labs down with it.

use crate::error::{Error, Result};
use sluice_sys::bail;
use sluice_sys::error::Context;

use crate::args::UpArgs;
use crate::host;
use crate::shell::{add_bridge, sh};
use crate::state::{Guest, LabState};
use sluice_api::client::Client;
use sluice_api::config::{PortKind, PortSpec};
use sluice_api::proto::Request;
use sluice_sys::netns;

/// The VNI of a multi-host lab's LAN.
pub const LAB_VNI: u32 = 5000;
/// The tunnel's overhead over the IPv4 underlay: the underlay's MTU is the guests' plus
/// this, so the guests keep theirs.
const OVERHEAD: u16 = sluice_wire::vxlan::VXLAN_OVERHEAD_V4 as u16;

/// Creates a multi-host lab; on failure removes what it had made.
pub fn up(a: &UpArgs) -> Result<LabState> {
    if !(2..=4).contains(&a.hosts) {
        bail!("--hosts must be 2 to 4 (1, the default, is a lab of one host)");
    }
    if a.name.len() > 8 {
        bail!("a lab of several hosts has a name of at most 8 characters (its hosts are labs NAMEh1, NAMEh2…)");
    }
    if a.switch.is_some() || a.lan {
        bail!("--hosts makes a switch per host: it does not take --switch or --lan");
    }
    if a.guests * a.hosts > 99 {
        bail!("--guests × --hosts must be at most 99 (guests are 10.77.0.1 to .99)");
    }
    if a.mtu > 9000 - OVERHEAD {
        bail!("--mtu with --hosts is at most {}: the underlay carries {OVERHEAD} bytes more", 9000 - OVERHEAD);
    }
    if a.peer_kernel && !on_path("ethtool") {
        return Err(Error::ToolMissing {
            tool: "ethtool",
            package: "ethtool",
            needed_for: "with --peer-kernel, the kernel host's underlay fills checksums in software",
        });
    }
    if a.evpn {
        crate::frr::check_installed()?;
    }
    if let Ok(old) = LabState::load(&a.name) {
        return Err(Error::LabExists { name: old.name });
    }
    let mut s = LabState {
        name: a.name.clone(),
        switch: String::new(),
        socket: std::path::PathBuf::new(),
        started_switch: false,
        switch_pid: None,
        mtu: a.mtu,
        guests: Vec::new(),
        extra_netns: Vec::new(),
        mode: "l2".into(),
        datapath: "user".into(),
        links: Vec::new(),
        sublabs: Vec::new(),
        exe: a.exe.clone(),
        gateway: None,
        daemons: Vec::new(),
    };
    s.save()?;
    match build(&mut s, a) {
        Ok(()) => Ok(s),
        Err(e) => {
            let _ = host::down(&s.name);
            Err(e)
        }
    }
}

fn on_path(tool: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
}

fn netns_new(s: &mut LabState, ns: &str) -> Result<()> {
    if netns::exists(ns) {
        bail!("network namespace {ns} already exists and is not this lab's; remove it or pick another lab --name");
    }
    s.extra_netns.push(ns.into());
    s.save()?;
    sh(&["ip", "netns", "add", ns])?;
    sh(&["ip", "-n", ns, "link", "set", "lo", "up"])?;
    netns::run_in(Some(ns), || {
        for k in ["default", "all"] {
            std::fs::write(format!("/proc/sys/net/ipv6/conf/{k}/accept_dad"), "0")?;
        }
        Ok(())
    })?;
    Ok(())
}

fn build(s: &mut LabState, a: &UpArgs) -> Result<()> {
    let ul = format!("sluice-{}-ul", s.name);
    let under = (a.mtu + OVERHEAD).to_string();
    netns_new(s, &ul)?;
    add_bridge(&ul, a.mtu + OVERHEAD)?;
    sh(&["ip", "-n", &ul, "link", "set", "br0", "up"])?;
    let hosts: Vec<u32> = (1..=a.hosts).collect();
    for &k in &hosts {
        let h = format!("sluice-{}-h{k}", s.name);
        netns_new(s, &h)?;
        let u = format!("u{k}");
        sh(&["ip", "-n", &ul, "link", "add", &u, "mtu", &under, "type", "veth", "peer", "name", "u0", "netns", &h])?;
        sh(&["ip", "-n", &ul, "link", "set", &u, "master", "br0", "up"])?;
        sh(&["ip", "-n", &h, "link", "set", "u0", "mtu", &under, "up"])?;
        sh(&["ip", "-n", &h, "addr", "add", &format!("192.168.77.{k}/24"), "dev", "u0"])?;
        sh(&["ip", "-n", &h, "addr", "add", &format!("fd78::{k}/64"), "dev", "u0", "nodad"])?;
    }
    if a.evpn {
        reflector(s, &ul, &under)?;
    }
    let kernel_host = (a.peer_kernel || a.peer_frr).then_some(a.hosts);
    let mut sluice_hosts_up = 0;
    for &k in &hosts {
        let others: Vec<String> = hosts.iter().filter(|&&o| o != k).map(|o| format!("192.168.77.{o}")).collect();
        if Some(k) == kernel_host {
            kernel_peer(s, a, k, &others)?;
            continue;
        }
        let sub = format!("{}h{k}", s.name);
        s.sublabs.push(sub.clone());
        s.save()?;
        // Every sluice host on the datapath the first one got (a user-space tunnel end
        // cannot read the whole GSO frames a kernel one sends over a veth).
        let datapath = match (sluice_hosts_up, s.datapath.as_str()) {
            (0, _) => a.datapath,
            (_, "kernel") => Some(sluice_api::config::DatapathArg::Kernel),
            _ => Some(sluice_api::config::DatapathArg::User),
        };
        sluice_hosts_up += 1;
        let hs = host::up(&UpArgs { name: sub.clone(), hosts: 1, peer_kernel: false, host: k, datapath, ..a.clone() })
            .with_context(|| format!("host h{k}"))?;
        // (As its hosts' switches run: the kernel datapath unless told or unable.)
        s.datapath = hs.datapath.clone();
        // (With EVPN its tunnel and speaker are in its switch's configuration.)
        if !a.evpn {
            let spec = PortSpec {
                kind: PortKind::Vxlan,
                netns: Some(format!("sluice-{}-h{k}", s.name)),
                local: Some(format!("192.168.77.{k}")),
                remotes: others,
                vni: Some(LAB_VNI),
                ..PortSpec::tap("vx0")
            };
            Client::connect(&hs.socket)?
                .call_value(&Request::PortAdd { port: Box::new(spec), may_exist: false })
                .map_err(Error::from)
                .with_context(|| format!("host h{k}: adding its tunnel port"))?;
        }
        // The host lab owns its guests; this lab lists them for `lab exec`.
        s.guests.extend(hs.guests.iter().map(|g| Guest {
            created_netns: false,
            added_port: false,
            relay_pid: None,
            ..g.clone()
        }));
        s.save()?;
    }
    Ok(())
}

/// The route reflector of an EVPN lab: namespace `sluice-LAB-rr` on the underlay bridge
/// at [`crate::frr::RR_ADDRESS`], FRR's zebra and bgpd in it.
fn reflector(s: &mut LabState, ul: &str, under: &str) -> Result<()> {
    let rr = format!("sluice-{}-rr", s.name);
    netns_new(s, &rr)?;
    sh(&["ip", "-n", ul, "link", "add", "urr", "mtu", under, "type", "veth", "peer", "name", "u0", "netns", &rr])?;
    sh(&["ip", "-n", ul, "link", "set", "urr", "master", "br0", "up"])?;
    sh(&["ip", "-n", &rr, "link", "set", "u0", "mtu", under, "up"])?;
    sh(&["ip", "-n", &rr, "addr", "add", &format!("{}/24", crate::frr::RR_ADDRESS), "dev", "u0"])?;
    let dir = sluice_sys::paths::labs_dir().join(format!("{}-frr-rr", s.name));
    let started = crate::frr::start(&rr, &dir, &crate::frr::reflector_conf(&dir))?;
    s.daemons.extend(started);
    s.save()?;
    Ok(())
}

/// Makes host `k` (namespace `h`, underlay address 192.168.77.K) a Linux tunnel end: `vx0`,
/// the kernel's vxlan device (VNI [`LAB_VNI`], flooding to `remotes`), in bridge `br0` at
/// `mtu`, both up.
pub fn kernel_tunnel(h: &str, k: u32, mtu: u16, remotes: &[String]) -> Result<()> {
    vxlan_device(h, k, mtu, false)?;
    for r in remotes {
        sh(&["ip", "netns", "exec", h, "bridge", "fdb", "append", "00:00:00:00:00:00", "dev", "vx0", "dst", r])?;
    }
    Ok(())
}

/// `vx0` and `br0` of a Linux host; with `evpn`, learning off (FRR installs stations and
/// the flood list from routes).
fn vxlan_device(h: &str, k: u32, mtu: u16, evpn: bool) -> Result<()> {
    let m = mtu.to_string();
    let (vni, local) = (LAB_VNI.to_string(), format!("192.168.77.{k}"));
    let mut args = vec![
        "ip", "-n", h, "link", "add", "vx0", "mtu", &m, "type", "vxlan", "id", &vni, "local", &local, "dstport", "4789",
    ];
    if evpn {
        args.push("nolearning");
    }
    sh(&args)?;
    add_bridge(h, mtu)?;
    sh(&["ip", "-n", h, "link", "set", "vx0", "master", "br0", "up"])?;
    if evpn {
        sh(&["ip", "-n", h, "link", "set", "vx0", "type", "bridge_slave", "learning", "off"])?;
    }
    sh(&["ip", "-n", h, "link", "set", "br0", "up"])?;
    Ok(())
}

/// Host `k` as plain Linux: `vx0` (the kernel's vxlan device, flooding to `others`) and
/// `br0` in its namespace, guests on veth pairs.
fn kernel_peer(s: &mut LabState, a: &UpArgs, k: u32, others: &[String]) -> Result<()> {
    let h = format!("sluice-{}-h{k}", s.name);
    let m = a.mtu.to_string();
    if a.peer_frr {
        vxlan_device(&h, k, a.mtu, true)?;
        let dir = sluice_sys::paths::labs_dir().join(format!("{}-frr-h{k}", s.name));
        let started = crate::frr::start(&h, &dir, &crate::frr::host_conf(&dir, &format!("192.168.77.{k}")))?;
        s.daemons.extend(started);
        s.save()?;
    } else {
        kernel_tunnel(&h, k, a.mtu, others)?;
    }
    // A veth fills no checksum; a NIC would. The user-space ends read the bytes as sent.
    sh(&["ip", "netns", "exec", &h, "ethtool", "-K", "u0", "tx", "off"])?;
    for j in 1..=a.guests {
        let n = (k - 1) * a.guests + j;
        let g = Guest::numbered(n, format!("h{k}g{j}"), format!("sluice-{}-h{k}g{j}", s.name), "eth0".into());
        netns_new(s, &g.netns)?;
        let p = format!("p{j}");
        sh(&["ip", "-n", &h, "link", "add", &p, "mtu", &m, "type", "veth", "peer", "name", "eth0", "netns", &g.netns])?;
        sh(&["ip", "-n", &h, "link", "set", &p, "master", "br0", "up"])?;
        sh(&["ip", "-n", &g.netns, "link", "set", "eth0", "mtu", &m, "up"])?;
        sh(&["ip", "-n", &g.netns, "addr", "add", &g.ipv4, "dev", "eth0"])?;
        sh(&["ip", "-n", &g.netns, "addr", "add", &g.ipv6, "dev", "eth0", "nodad"])?;
        s.guests.push(g);
        s.save()?;
    }
    Ok(())
}

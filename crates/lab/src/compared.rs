//! The compared paths, built from network namespaces: a client guest and a server guest
//! joined by the thing a study compares (docs/architecture.md, "The study runner").
//!
//! Every path gets namespaces of its own (`ID-PATH-c`, `-s`, and `-r` or `-sw`), so paths
//! coexist with the same addresses: client 10.231.0.1 / fd31::1, server 10.231.0.2 /
//! fd31::2 (the router path: two subnets, 10.231.1.0/24 and 10.231.2.0/24; the sluice
//! paths: the lab's 10.77.0.1 and .2; `ovs` is in `ovs.rs`). A [`Topology`] removes what it made when dropped —
//! only that — and a bench server runs in its server namespace while it lives.

use std::fmt;
use std::net::IpAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sluice_sys::bail;
use sluice_sys::error::Context;

use crate::error::Result;
use serde::{Deserialize, Serialize};

use crate::guests::{self, sh};
use sluice_sys::netns;

/// Why a known path cannot run on this host (or in this version), if it cannot.
pub fn unavailable(path: &str) -> Option<String> {
    match path {
        "ovs" => crate::ovs::unavailable(),
        p if VM_PATHS.contains(&p) => ["qemu-system-x86_64", "busybox", "iperf3"]
            .into_iter()
            .find(|t| !which(t))
            .map(|t| format!("{t} is not installed (VMs need qemu-system-x86, busybox-static and iperf3)")),
        _ => None,
    }
}

/// True if `tool` is an executable on the PATH.
pub fn which(tool: &str) -> bool {
    sluice_sys::which(tool).is_some()
}

/// Where a condition's extra guest joins the path.
#[derive(Clone, Debug)]
pub enum Attach {
    /// A sluice switch of a lab of one host: its control socket, the lab's name (the
    /// prefix of the study's device names in the host's namespace), its datapath.
    Switch {
        /// The switch's control socket.
        socket: std::path::PathBuf,
        /// The lab's name.
        lab: String,
        /// The kernel datapath (ports are veth pairs).
        kernel: bool,
    },
    /// A Linux bridge `br0` in namespace `ns`.
    Bridge {
        /// The bridge's namespace.
        ns: String,
    },
}

/// An overlay path's underlay, for `underlay-flood`.
#[derive(Clone, Debug)]
pub struct Underlay {
    /// The namespace of the underlay's bridge `br0`.
    pub ns: String,
    /// The underlay's MTU.
    pub mtu: u16,
    /// The tunnel end attacked: the server's host.
    pub target: std::net::Ipv4Addr,
    /// The tunnel's endpoints (an attacker must not be one).
    pub remotes: Vec<std::net::Ipv4Addr>,
    /// The tunnel's VNI.
    pub vni: u32,
}

/// A built path with a bench server running on its server side.
pub struct Topology {
    /// The path's name.
    pub path: String,
    /// Namespace the client runs in.
    pub client_ns: String,
    /// Namespace the bench server runs in.
    pub server_ns: String,
    server_v4: IpAddr,
    server_v6: IpAddr,
    /// The switch process whose CPU is the "switch" column (sluice paths).
    pub switch_pid: Option<u32>,
    /// Guests beyond the server that run a bench server too (partition-aggregate
    /// workers): namespace, IPv4 and IPv6 address.
    more: Vec<(String, IpAddr, IpAddr)>,
    /// The bench server processes: the server guest's first, then one per `more`.
    servers: Vec<Child>,
    /// The namespaces the path's own devices live in (the bridge's; the hosts' and the
    /// underlay's of an overlay), whose interfaces' drops are the path's.
    pub switch_ns: Vec<String>,
    /// The sluice switches' control sockets (sluice paths; one per host of an overlay).
    pub switch_sockets: Vec<std::path::PathBuf>,
    /// The switch's devices in the host's namespace (the kernel datapath's veth ends).
    pub host_devices: Vec<String>,
    /// Namespaces this topology created, deleted on drop.
    created: Vec<String>,
    /// The sluice lab this topology brought up, taken down on drop.
    pub lab: Option<String>,
    /// The Open vSwitch daemons this topology started, stopped on drop.
    ovs: Option<crate::ovs::Ovs>,
    /// The sluice switch this topology started itself (a configuration `lab up` has no
    /// flag for), stopped on drop after its lab is down.
    own_switch: Option<OwnSwitch>,
    /// Client and server run under `sluice smc run` (the shared-memory fast path).
    pub smc: bool,
    /// The sluice executable the path's bench programs run under `sluice smc run` with,
    /// when not this one (an `smc`/`smc-loopback` path of another build: its launcher
    /// and preload library are the build's).
    smc_exe: Option<std::path::PathBuf>,
    /// The MTU of the guests' interfaces.
    pub mtu: u16,
    /// Where an extra guest joins (conditions `mac-flood`, `gso-bomb`, `rings`).
    pub attach: Option<Attach>,
    /// An IPv4 address with its prefix in the guests' subnet that nothing on the path uses.
    pub spare_v4: Option<String>,
    /// The underlay of an overlay path.
    pub underlay: Option<Underlay>,
    /// The VMs of a VM path: the client's, then the server's. Their cells run inside them.
    pub vms: Vec<VmGuest>,
    /// The files of VMs this topology booted itself (`vm-bridge`), removed on drop after
    /// their QEMUs are stopped with their namespace.
    vm_dir: Option<sluice_sys::fs::TempDir>,
}

/// A VM of a VM path.
#[derive(Clone, Debug)]
pub struct VmGuest {
    /// Its QEMU's pid.
    pub pid: u32,
    /// Its console (`vm::Console`).
    pub serial: std::path::PathBuf,
}

impl Topology {
    /// The server's address in `family`.
    pub fn server_addr(&self, family: Family) -> IpAddr {
        match family {
            Family::Ipv4 => self.server_v4,
            Family::Ipv6 => self.server_v6,
        }
    }

    /// The bench server's process id.
    pub fn server_pid(&self) -> Option<u32> {
        self.servers.first().map(|c| c.id())
    }

    /// Every bench server's process id.
    pub fn server_pids(&self) -> Vec<u32> {
        self.servers.iter().map(Child::id).collect()
    }

    /// The guests that serve (the server guest, then the partition-aggregate workers):
    /// namespace and address in `family`.
    pub fn servers(&self, family: Family) -> Vec<(String, IpAddr)> {
        let mut v = vec![(self.server_ns.clone(), self.server_addr(family))];
        v.extend(self.more.iter().map(|(ns, a4, a6)| {
            (
                ns.clone(),
                match family {
                    Family::Ipv4 => *a4,
                    Family::Ipv6 => *a6,
                },
            )
        }));
        v
    }

    /// Every namespace of the path: its guests', its devices', those it created.
    pub fn namespaces(&self) -> Vec<String> {
        let mut v = self.guest_namespaces();
        for ns in self.switch_ns.iter().chain(&self.created) {
            if !v.contains(ns) {
                v.push(ns.clone());
            }
        }
        v
    }

    /// The namespaces of the path's guests (client, server, workers), each once.
    pub fn guest_namespaces(&self) -> Vec<String> {
        let mut v = vec![self.client_ns.clone()];
        for (ns, _) in self.servers(Family::Ipv4) {
            if !v.contains(&ns) {
                v.push(ns);
            }
        }
        v
    }

    fn new(path: &str, client_ns: String, server_ns: String, v4: &str, v6: &str) -> Topology {
        Topology {
            path: path.into(),
            client_ns,
            server_ns,
            server_v4: v4.parse().expect("literal address"),
            server_v6: v6.parse().expect("literal address"),
            switch_pid: None,
            more: Vec::new(),
            servers: Vec::new(),
            switch_ns: Vec::new(),
            switch_sockets: Vec::new(),
            host_devices: Vec::new(),
            created: Vec::new(),
            lab: None,
            ovs: None,
            own_switch: None,
            smc: false,
            smc_exe: None,
            mtu: 1500,
            attach: None,
            spare_v4: None,
            underlay: None,
            vms: Vec::new(),
            vm_dir: None,
        }
    }

    /// Creates a namespace and remembers it for removal.
    fn netns(&mut self, name: &str) -> Result<()> {
        if netns::exists(name) {
            bail!("network namespace {name} already exists and is not this study's; remove it or run the study again");
        }
        sh(&["ip", "netns", "add", name])?;
        self.created.push(name.into());
        sh(&["ip", "-n", name, "link", "set", "lo", "up"])?;
        // IPv6 addresses usable at once, without duplicate address detection.
        netns::run_in(Some(name), || {
            for k in ["default", "all"] {
                std::fs::write(format!("/proc/sys/net/ipv6/conf/{k}/accept_dad"), "0")?;
            }
            Ok(())
        })?;
        Ok(())
    }

    /// `ip netns exec NS [taskset -c CPU] [sluice smc run --] sluice`, ready for its
    /// arguments: the path's build under the launcher when it has one, else this sluice.
    pub fn sluice_in(&self, ns: &str, cpu: Option<u8>, under_launcher: bool) -> Result<Command> {
        let Some(exe) = self.smc_exe.as_ref().filter(|_| under_launcher) else {
            return Ok(sluice_smc_launch::sluice_in(ns, cpu, under_launcher)?);
        };
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", ns]);
        if let Some(cpu) = cpu {
            cmd.args(["taskset", "-c", &cpu.to_string()]);
        }
        cmd.arg(exe).args(["smc", "run", "--"]).arg(exe);
        Ok(cmd)
    }

    /// Starts `sluice bench serve` in the server namespace and every worker's (on CPU 1
    /// if `pin`) and waits until each listens.
    fn start_servers(&mut self, pin: bool) -> Result<()> {
        for (ns, _) in self.servers(Family::Ipv4) {
            let child = self
                .sluice_in(&ns, pin.then_some(1), self.smc)?
                .args(["bench", "serve"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .with_context(|| format!("starting the bench server in {ns}"))?;
            self.servers.push(child);
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                let up = netns::run_in(Some(&ns), || {
                    Ok(std::net::TcpStream::connect(("127.0.0.1", sluice_bench::control::DEFAULT_PORT)).is_ok())
                })?;
                if up {
                    break;
                }
                if let Some(Ok(Some(st))) = self.servers.last_mut().map(|c| c.try_wait()) {
                    bail!("the bench server in {ns} exited at start ({st}); is port 20000 taken there?");
                }
                if Instant::now() >= deadline {
                    bail!("the bench server in {ns} did not listen within 10 s");
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        Ok(())
    }

    /// Stops the bench servers (a run in flight then fails at once).
    pub fn stop_server(&mut self) {
        for mut c in self.servers.drain(..) {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        self.stop_server();
        drop(self.ovs.take());
        if let Some(l) = self.lab.take()
            && let Err(e) = guests::down(&l)
        {
            eprintln!("warning: removing lab {l}: {e:#}");
        }
        drop(self.own_switch.take());
        for ns in self.created.drain(..).rev() {
            // Stop anything still running in it (only our namespaces, only their processes).
            if let Ok(o) = Command::new("ip").args(["netns", "pids", &ns]).output() {
                for pid in String::from_utf8_lossy(&o.stdout).split_whitespace().filter_map(|p| p.parse::<u32>().ok()) {
                    let _ = sluice_sys::kill(pid, libc::SIGKILL);
                }
            }
            if let Err(e) = sh(&["ip", "netns", "del", &ns]) {
                eprintln!("warning: {e:#}");
            }
        }
    }
}

/// Builds `path` with interfaces of `mtu`; `id` prefixes its names (unique per study
/// run), `index` tells the paths of one run apart. With `pin` the bench servers run on
/// CPU 1. `workers` is the number of serving guests: 1, or more for partition-aggregate
/// points (the paths in `spec::PA_PATHS`).
///
/// A path `PATH@BUILD` is built as PATH, its switch and relays run by `exe` (the build's
/// executable); the topology keeps the full name.
pub fn build(
    full: &str,
    exe: Option<&std::path::Path>,
    id: &str,
    index: usize,
    mtu: u16,
    pin: bool,
    workers: u32,
) -> Result<Topology> {
    let path = crate::compared::split_build(full).0;
    let exe = exe.map(std::path::Path::to_path_buf);
    if let Some(why) = unavailable(path) {
        bail!("{path}: {why}");
    }
    if workers > 1 && !crate::compared::PA_PATHS.contains(&path) {
        bail!(
            "{path} builds two guests; {workers} serving guests need one of {}",
            crate::compared::PA_PATHS.join(", ")
        );
    }
    // A path of another build (`smc-loopback@before`) gets namespaces of its own beside
    // the same path of this build.
    let kind = if full == path { path.to_string() } else { format!("{path}-{index}") };
    let ns = |role: &str| format!("{id}-{kind}-{role}");
    let mut t = match path {
        "direct" => {
            let mut t = Topology::new(path, ns("c"), ns("s"), "10.231.0.2", "fd31::2");
            direct(&mut t, mtu)?;
            t
        }
        "linux-bridge" | "linux-bridge-acl" => {
            let mut t = Topology::new(path, ns("c"), ns("s"), "10.231.0.2", "fd31::2");
            for k in 2..=workers {
                let (a4, a6) = (format!("10.231.0.{}", k + 1), format!("fd31::{:x}", k + 1));
                t.more.push((ns(&format!("s{k}")), a4.parse()?, a6.parse()?));
            }
            bridge(&mut t, &ns("sw"), mtu)?;
            if path == "linux-bridge-acl" {
                bridge_acl(&ns("sw"), 1 + workers as usize)?;
            }
            t.attach = Some(Attach::Bridge { ns: ns("sw") });
            t.spare_v4 = Some("10.231.0.250/24".into());
            t
        }
        "ovs" => {
            let mut t = Topology::new(path, ns("c"), ns("s"), "10.231.0.2", "fd31::2");
            ovs(&mut t, &ns("sw"), &format!("{id}-{index}"), mtu)?;
            t
        }
        "router" => {
            let mut t = Topology::new(path, ns("c"), ns("s"), "10.231.2.2", "fd31:2::2");
            router(&mut t, &ns("r"), mtu)?;
            t
        }
        "loopback" | "smc-loopback" => {
            // One namespace: client and server talk over its loopback interface ("smc-
            // loopback": both under `sluice smc run`, as SMC-D's loopback device is
            // measured against TCP loopback).
            let mut t = Topology::new(path, ns("c"), ns("c"), "127.0.0.1", "::1");
            t.netns(&ns("c"))?;
            t.smc = path == "smc-loopback";
            t.smc_exe = exe.clone().filter(|_| t.smc);
            t
        }
        // "smc": the lab's two guests, both ends under `sluice smc run` — the TCP
        // handshake crosses the switch (the kernel datapath, the lab's default), the data
        // goes through shared memory.
        "sluice-l2"
        | "sluice-l2-lossless"
        | "sluice-l2-poll"
        | "sluice-l2-stream"
        | "sluice-l2-lossless-stream"
        | "sluice-l2-lossless-stream-hold1"
        | "sluice-l2-lossless-stream-zovn"
        | "sluice-l3"
        | "sluice-l2-lan"
        | "sluice-l3-lan"
        | "smc"
        | "sluice-kernel"
        | "sluice-kernel-acl"
        | "sluice-kernel-l3" => {
            // Lab names are at most 10 characters: the study's id is short and unique.
            let name = format!("{}{index}", id.trim_start_matches("sst"));
            let name = format!("st{}", &name[name.len().saturating_sub(8)..]);
            // The LAN paths: the server is the lab's external host, behind the uplink.
            let lan = path.ends_with("-lan");
            let mut t = if lan {
                Topology::new(
                    path,
                    format!("sluice-{name}-g1"),
                    format!("sluice-{name}-lan"),
                    "10.77.0.200",
                    "fd77::c8",
                )
            } else {
                Topology::new(path, format!("sluice-{name}-g1"), format!("sluice-{name}-g2"), "10.77.0.2", "fd77::2")
            };
            // hold_len 1 with the pause watchdog, or without it (zOVN's Algorithm 1): a
            // switch of the study's own, configured as `lab up` cannot.
            let own = match path {
                "sluice-l2-lossless-stream-hold1" => {
                    Some(OwnSwitch::start(&format!("{name}w"), exe.as_deref(), 1, 200)?)
                }
                "sluice-l2-lossless-stream-zovn" => Some(OwnSwitch::start(&format!("{name}w"), exe.as_deref(), 1, 0)?),
                _ => None,
            };
            let s = guests::up(&guests::UpArgs {
                lossless: path.starts_with("sluice-l2-lossless"),
                switch: own.as_ref().map(|o| o.name.clone()),
                attach: if path.contains("-stream") { guests::AttachArg::Stream } else { guests::AttachArg::Tap },
                poll: path == "sluice-l2-poll",
                mode: if path.starts_with("sluice-l3") || path.ends_with("-l3") {
                    guests::ModeArg::L3
                } else {
                    guests::ModeArg::L2
                },
                // "smc" on the lab's default datapath: veths forwarded in the kernel.
                datapath: Some(if path.starts_with("sluice-kernel") || path == "smc" {
                    sluice_api::config::DatapathArg::Kernel
                } else {
                    sluice_api::config::DatapathArg::User
                }),
                guests: if lan { 1 } else { 1 + workers },
                lan,
                exe: exe.clone(),
                ..guests::UpArgs::two_guests(&name, mtu)
            })?;
            for g in s.guests.iter().skip(2) {
                let (a4, a6) =
                    (g.ipv4.split('/').next().unwrap_or_default(), g.ipv6.split('/').next().unwrap_or_default());
                t.more.push((g.netns.clone(), a4.parse()?, a6.parse()?));
            }
            if s.datapath == "kernel" {
                t.host_devices = s.guests.iter().map(|g| g.tap.clone()).collect();
            }
            if path == "sluice-kernel-acl" {
                switch_acl(&s.socket, s.guests.iter().map(|g| g.tap.as_str()))?;
            }
            t.switch_sockets = vec![s.socket.clone()];
            t.attach =
                Some(Attach::Switch { socket: s.socket.clone(), lab: name.clone(), kernel: s.datapath == "kernel" });
            t.spare_v4 = Some("10.77.0.250/24".into());
            t.lab = Some(name);
            t.switch_pid = s.switch_pid.or(own.as_ref().map(|o| o.child.id()));
            t.own_switch = own;
            t.smc = path == "smc";
            t.smc_exe = exe.clone().filter(|_| t.smc);
            t
        }
        "overlay-kernel" => {
            let mut t = Topology::new(path, ns("c"), ns("s"), "10.231.0.2", "fd31::2");
            // Partition-aggregate workers: all behind the second host (seed 004's Fig. 7b).
            for k in 2..=workers {
                let (a4, a6) = (format!("10.231.0.{}", k + 1), format!("fd31::{:x}", k + 1));
                t.more.push((ns(&format!("s{k}")), a4.parse()?, a6.parse()?));
            }
            overlay_kernel(&mut t, &ns("ul"), &ns("h1"), &ns("h2"), mtu)?;
            t.switch_ns = vec![ns("ul"), ns("h1"), ns("h2")];
            t.underlay = Some(underlay(&ns("ul"), mtu));
            t
        }
        "overlay-sluice" | "overlay-sluice-kernel" | "overlay-sluice-lossless" | "overlay-mixed" => {
            // Lab names of several hosts are at most 8 characters.
            let name = format!("o{index}{:05}", std::process::id() % 100_000);
            let per_host = workers;
            let s = guests::up(&guests::UpArgs {
                guests: per_host,
                hosts: 2,
                peer_kernel: path == "overlay-mixed",
                lossless: path == "overlay-sluice-lossless",
                exe: exe.clone(),
                datapath: Some(if path == "overlay-sluice-kernel" {
                    sluice_api::config::DatapathArg::Kernel
                } else {
                    sluice_api::config::DatapathArg::User
                }),
                ..guests::UpArgs::two_guests(&name, mtu)
            })?;
            // The client is the first host's first guest; the servers are the second host's.
            let first = &s.guests[per_host as usize];
            let (a4, a6) =
                (first.ipv4.split('/').next().unwrap_or_default(), first.ipv6.split('/').next().unwrap_or_default());
            let mut t = Topology::new(path, s.guests[0].netns.clone(), first.netns.clone(), a4, a6);
            for g in s.guests.iter().skip(per_host as usize + 1) {
                let (a4, a6) =
                    (g.ipv4.split('/').next().unwrap_or_default(), g.ipv6.split('/').next().unwrap_or_default());
                t.more.push((g.netns.clone(), a4.parse()?, a6.parse()?));
            }
            t.switch_ns = ["ul", "h1", "h2"].iter().map(|r| format!("sluice-{name}-{r}")).collect();
            t.underlay = Some(underlay(&format!("sluice-{name}-ul"), mtu));
            t.switch_sockets =
                s.sublabs.iter().filter_map(|l| guests::LabState::load(l).ok()).map(|l| l.socket).collect();
            t.lab = Some(name.clone());
            // The client's host's switch is the "switch" column (the other's CPU is "other").
            t.switch_pid = guests::LabState::load(&format!("{name}h1")).ok().and_then(|h| h.switch_pid);
            t
        }
        "vm-sluice" => {
            let name = format!("{}{index}", id.trim_start_matches("sst"));
            let name = format!("st{}", &name[name.len().saturating_sub(8)..]);
            let s = guests::up(&guests::UpArgs {
                guests: 1,
                vms: 2,
                exe: exe.clone(),
                ..guests::UpArgs::two_guests(&name, mtu)
            })?;
            let g1 = s.guests.iter().find(|g| g.vm.is_none()).context("the lab has no namespace guest")?;
            let vms: Vec<&guests::Guest> = s.guests.iter().filter(|g| g.vm.is_some()).collect();
            let [_, server] = vms[..] else { bail!("the lab booted {} VMs, not 2", vms.len()) };
            let (a4, a6) =
                (server.ipv4.split('/').next().unwrap_or_default(), server.ipv6.split('/').next().unwrap_or_default());
            let mut t = Topology::new(path, g1.netns.clone(), g1.netns.clone(), a4, a6);
            t.vms = vms
                .iter()
                .filter_map(|g| g.vm.as_ref())
                .map(|v| VmGuest { pid: v.pid, serial: v.serial.clone() })
                .collect();
            t.switch_sockets = vec![s.socket.clone()];
            t.switch_pid = s.switch_pid;
            t.lab = Some(name);
            t
        }
        "vm-bridge" => {
            let mut t = Topology::new(path, ns("c"), ns("c"), "10.78.0.3", "fd78::3");
            vm_bridge(&mut t, &ns("sw"), mtu)?;
            t
        }
        other => bail!("unknown path {other:?}"),
    };
    t.path = full.to_string();
    t.mtu = mtu;
    tune_client(&t.client_ns)?;
    t.start_servers(pin)?;
    Ok(t)
}

/// `vm-bridge`: a Linux bridge in namespace `sw` with a veth to the namespace guest
/// (10.78.0.1) and a TAP per VM, two VMs (10.78.0.2, .3) on QEMU's TAP backend booted in
/// `sw` from the image `sluice lab up --vm` builds, their files in a new private directory.
fn vm_bridge(t: &mut Topology, sw: &str, mtu: u16) -> Result<()> {
    let m = mtu.to_string();
    t.netns(sw)?;
    t.netns(&t.client_ns.clone())?;
    let c = t.client_ns.clone();
    sh(&["ip", "-n", sw, "link", "add", "br0", "mtu", &m, "type", "bridge", "stp_state", "0", "forward_delay", "0"])?;
    sh(&["ip", "-n", sw, "link", "set", "br0", "up"])?;
    sh(&[
        "ip", "-n", sw, "link", "add", "g1", "mtu", &m, "type", "veth", "peer", "name", "eth0", "mtu", &m, "netns", &c,
    ])?;
    sh(&["ip", "-n", sw, "link", "set", "g1", "master", "br0", "up"])?;
    sh(&["ip", "-n", &c, "link", "set", "eth0", "up"])?;
    sh(&["ip", "-n", &c, "addr", "add", "10.78.0.1/24", "dev", "eth0"])?;
    sh(&["ip", "-n", &c, "addr", "add", "fd78::1/64", "dev", "eth0", "nodad"])?;
    t.switch_ns = vec![sw.to_string()];
    let labs = sluice_sys::paths::labs_dir();
    let img = crate::vm::image(&labs).context("building the VMs' image")?;
    let accel = crate::vm::choose_accel(crate::vm::Accel::Auto, &img, &labs)?;
    let dir = sluice_sys::fs::TempDir::new("sluice-study-vm").context("making a directory for the VMs")?;
    for k in 1..=2u32 {
        let tap = format!("tap{k}");
        sh(&["ip", "-n", sw, "tuntap", "add", "dev", &tap, "mode", "tap", "vnet_hdr"])?;
        sh(&["ip", "-n", sw, "link", "set", &tap, "mtu", &m, "master", "br0", "up"])?;
        let (img, dir_path, sw2) = (img.clone(), dir.path().to_path_buf(), sw.to_string());
        let files = netns::run_in(Some(&sw2), move || {
            crate::vm::boot(
                &img,
                &crate::vm::VmSpec {
                    name: &format!("brvm{k}"),
                    dir: &dir_path,
                    socket: None,
                    tap: Some(&tap),
                    mac: &format!("52:54:00:78:00:{:02x}", k + 1),
                    ipv4: &format!("10.78.0.{}/24", k + 1),
                    ipv6: &format!("fd78::{:x}/64", k + 1),
                    mtu,
                    accel,
                },
            )
            .map_err(|e| std::io::Error::other(format!("{e:#}")))
        })?;
        t.vms.push(VmGuest { pid: files.pid, serial: files.serial });
    }
    t.vm_dir = Some(dir);
    for v in &t.vms {
        crate::vm::Console::connect(&v.serial, Duration::from_secs(10))?
            .wait_ready(Duration::from_secs(120))
            .with_context(|| format!("the VM of QEMU pid {} did not answer on its console", v.pid))?;
    }
    Ok(())
}

/// A lossless user-space sluice switch run by the study with a given `hold_len` and pause
/// watchdog, its configuration in a new private directory; killed when dropped.
struct OwnSwitch {
    name: String,
    child: Child,
    _dir: sluice_sys::fs::TempDir,
}

impl OwnSwitch {
    /// Starts switch `name` (`exe`, else this sluice) and waits until its control socket
    /// answers.
    fn start(name: &str, exe: Option<&std::path::Path>, hold_len: u32, watchdog_ms: u32) -> Result<OwnSwitch> {
        let dir = sluice_sys::fs::TempDir::new("sluice-study-switch").context("making a directory for a switch")?;
        let config = dir.path().join("switch.toml");
        std::fs::write(
            &config,
            format!(
                "name = \"{name}\"\ndatapath = \"user\"\nlossless = true\nhold_len = {hold_len}\nwatchdog_ms = {watchdog_ms}\n"
            ),
        )?;
        let exe = match exe {
            Some(e) => e.to_path_buf(),
            None => std::env::current_exe().context("finding the sluice executable")?,
        };
        let child = Command::new(exe)
            .args(["switch", "run", "--config"])
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting a switch")?;
        let mut own = OwnSwitch { name: name.into(), child, _dir: dir };
        let socket = sluice_sys::paths::socket_for(name);
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::os::unix::net::UnixStream::connect(&socket).is_err() {
            if let Ok(Some(st)) = own.child.try_wait() {
                bail!("switch {name} exited at start ({st})");
            }
            if Instant::now() >= deadline {
                bail!("switch {name} did not answer on {} within 10 s", socket.display());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(own)
    }
}

impl Drop for OwnSwitch {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Adds `v4` and `v6` (with prefixes) to `dev` in `ns` and brings it up at `mtu`.
fn address(ns: &str, dev: &str, mtu: u16, v4: &str, v6: &str) -> Result<()> {
    sh(&["ip", "-n", ns, "link", "set", dev, "mtu", &mtu.to_string(), "up"])?;
    sh(&["ip", "-n", ns, "addr", "add", v4, "dev", dev])?;
    sh(&["ip", "-n", ns, "addr", "add", v6, "dev", dev, "nodad"])
}

/// A veth pair from `a`'s `dev_a` to `b`'s `dev_b`, created inside the namespaces (never
/// in the host's, so names cannot clash).
fn veth(a: &str, dev_a: &str, b: &str, dev_b: &str, mtu: u16) -> Result<()> {
    let m = mtu.to_string();
    sh(&["ip", "-n", a, "link", "add", dev_a, "mtu", &m, "type", "veth", "peer", "name", dev_b, "mtu", &m, "netns", b])
}

fn direct(t: &mut Topology, mtu: u16) -> Result<()> {
    let (c, s) = (t.client_ns.clone(), t.server_ns.clone());
    t.netns(&c)?;
    t.netns(&s)?;
    veth(&c, "eth0", &s, "eth0", mtu)?;
    address(&c, "eth0", mtu, "10.231.0.1/24", "fd31::1/64")?;
    address(&s, "eth0", mtu, "10.231.0.2/24", "fd31::2/64")
}

fn bridge(t: &mut Topology, sw: &str, mtu: u16) -> Result<()> {
    let c = t.client_ns.clone();
    let guests: Vec<(String, IpAddr, IpAddr)> = std::iter::once((c.clone(), "10.231.0.1".parse()?, "fd31::1".parse()?))
        .chain(t.servers(Family::Ipv4).into_iter().zip(t.servers(Family::Ipv6)).map(|((ns, a4), (_, a6))| (ns, a4, a6)))
        .collect();
    t.netns(sw)?;
    t.switch_ns = vec![sw.to_string()];
    for (g, _, _) in &guests {
        t.netns(g)?;
    }
    guests::add_bridge(sw, mtu)?;
    for (i, (g, _, _)) in guests.iter().enumerate() {
        let p = format!("p{}", i + 1);
        veth(sw, &p, g, "eth0", mtu)?;
        sh(&["ip", "-n", sw, "link", "set", &p, "master", "br0", "up"])?;
    }
    sh(&["ip", "-n", sw, "link", "set", "br0", "up"])?;
    for (g, a4, a6) in &guests {
        address(g, "eth0", mtu, &format!("{a4}/24"), &format!("{a6}/64"))?;
    }
    Ok(())
}

/// The security-group load on a sluice switch: the load's rules towards each guest, on
/// the traffic its port sends it (`out`), through the switch's control socket.
fn switch_acl<'a>(socket: &std::path::Path, ports: impl Iterator<Item = &'a str>) -> Result<()> {
    use sluice_api::proto::{AclAdded, Request};
    use sluice_switch::acl::AclRuleSpec;
    let mut c = sluice_api::client::Client::connect(socket)?;
    let subnet = (std::net::Ipv4Addr::new(10, 77, 0, 0), 24);
    for port in ports {
        for r in crate::acl_load::rules(subnet) {
            let rule = AclRuleSpec {
                dir: "out".into(),
                action: if r.allow { "allow-related" } else { "deny" }.into(),
                proto: Some("tcp".into()),
                src: Some(format!("{}/{}", r.src.0, r.src.1)),
                dport: r.dport.map(|p| p.to_string()),
                priority: r.priority as i32,
                ..AclRuleSpec::default()
            };
            c.call::<AclAdded>(&Request::AclAdd { port: port.to_string(), rule })
                .with_context(|| format!("adding the security-group load to port {port}"))?;
        }
    }
    Ok(())
}

/// The security-group load on the bridge in `sw`: `br_netfilter` on in that namespace
/// (bridged IPv4 through the `inet` hooks and the connection tracker) and the load's
/// nftables ruleset towards each of the `guests` guests (10.231.0.1 onwards).
fn bridge_acl(sw: &str, guests: usize) -> Result<()> {
    sh(&["ip", "netns", "exec", sw, "sysctl", "-q", "-w", "net.bridge.bridge-nf-call-iptables=1"])?;
    let addrs: Vec<std::net::Ipv4Addr> = (1..=guests).map(|k| std::net::Ipv4Addr::new(10, 231, 0, k as u8)).collect();
    let subnet = (std::net::Ipv4Addr::new(10, 231, 0, 0), 24);
    crate::acl_load::nft_load(sw, &crate::acl_load::nft_ruleset("sluice_study_acl", &addrs, subnet))
}

fn ovs(t: &mut Topology, sw: &str, tag: &str, mtu: u16) -> Result<()> {
    let (c, s) = (t.client_ns.clone(), t.server_ns.clone());
    t.netns(sw)?;
    t.netns(&c)?;
    t.netns(&s)?;
    let taps = ["ovst1", "ovst2"];
    let o = crate::ovs::Ovs::start(tag, sw, &taps, mtu)?;
    t.switch_pid = o.vswitchd_pid;
    t.ovs = Some(o);
    for (tap, g, v4, v6) in [(taps[0], &c, "10.231.0.1/24", "fd31::1/64"), (taps[1], &s, "10.231.0.2/24", "fd31::2/64")]
    {
        sh(&["ip", "-n", sw, "link", "set", tap, "netns", g])?;
        address(g, tap, mtu, v4, v6)?;
    }
    Ok(())
}

/// Two hosts `h1`, `h2` on an underlay bridge in `ul` (192.168.77.1 and .2, MTU `mtu` +
/// 50), each with a kernel vxlan device (VNI 5000) and a bridge; the client guest behind
/// h1, the server behind h2.
fn overlay_kernel(t: &mut Topology, ul: &str, h1: &str, h2: &str, mtu: u16) -> Result<()> {
    let c = t.client_ns.clone();
    let servers: Vec<(String, IpAddr, IpAddr)> = t
        .servers(Family::Ipv4)
        .into_iter()
        .zip(t.servers(Family::Ipv6))
        .map(|((n, a4), (_, a6))| (n, a4, a6))
        .collect();
    for n in [ul, h1, h2, &c] {
        t.netns(n)?;
    }
    for (n, _, _) in &servers {
        t.netns(n)?;
    }
    let under = (mtu + 50).to_string();
    guests::add_bridge(ul, mtu + 50)?;
    sh(&["ip", "-n", ul, "link", "set", "br0", "up"])?;
    for (k, h) in [(1, h1), (2, h2)] {
        let u = format!("u{k}");
        sh(&[
            "ip", "-n", ul, "link", "add", &u, "mtu", &under, "type", "veth", "peer", "name", "u0", "mtu", &under,
            "netns", h,
        ])?;
        sh(&["ip", "-n", ul, "link", "set", &u, "master", "br0", "up"])?;
        sh(&["ip", "-n", h, "addr", "add", &format!("192.168.77.{k}/24"), "dev", "u0"])?;
        sh(&["ip", "-n", h, "link", "set", "u0", "up"])?;
        crate::hosts::kernel_tunnel(h, k, mtu, &[format!("192.168.77.{}", 3 - k)])?;
    }
    // The client behind h1, every server guest behind h2.
    let guests = std::iter::once((h1, c, "10.231.0.1".parse()?, "fd31::1".parse()?))
        .chain(servers.into_iter().map(|(n, a4, a6)| (h2, n, a4, a6)));
    for (i, (h, g, a4, a6)) in guests.enumerate() {
        let p = format!("p{i}");
        veth(h, &p, &g, "eth0", mtu)?;
        sh(&["ip", "-n", h, "link", "set", &p, "master", "br0", "up"])?;
        address(&g, "eth0", mtu, &format!("{a4}/24"), &format!("{a6}/64"))?;
    }
    Ok(())
}

/// The underlay of the two hosts of an overlay path (bridge in `ns`): the server's host,
/// 192.168.77.2, is the one attacked.
fn underlay(ns: &str, mtu: u16) -> Underlay {
    Underlay {
        ns: ns.into(),
        mtu: mtu + sluice_wire::vxlan::VXLAN_OVERHEAD_V4 as u16,
        target: std::net::Ipv4Addr::new(192, 168, 77, 2),
        remotes: vec![std::net::Ipv4Addr::new(192, 168, 77, 1), std::net::Ipv4Addr::new(192, 168, 77, 2)],
        vni: crate::hosts::LAB_VNI,
    }
}

/// True if device `dev` exists in this process's namespace.
pub fn link_exists_here(dev: &str) -> bool {
    Command::new("ip")
        .args(["link", "show", dev])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn router(t: &mut Topology, r: &str, mtu: u16) -> Result<()> {
    let (c, s) = (t.client_ns.clone(), t.server_ns.clone());
    t.netns(r)?;
    t.netns(&c)?;
    t.netns(&s)?;
    netns::run_in(Some(r), || {
        std::fs::write("/proc/sys/net/ipv4/ip_forward", "1")?;
        std::fs::write("/proc/sys/net/ipv6/conf/all/forwarding", "1")
    })
    .context("turning on forwarding in the router namespace")?;
    veth(r, "r1", &c, "eth0", mtu)?;
    veth(r, "r2", &s, "eth0", mtu)?;
    address(r, "r1", mtu, "10.231.1.254/24", "fd31:1::fe/64")?;
    address(r, "r2", mtu, "10.231.2.254/24", "fd31:2::fe/64")?;
    address(&c, "eth0", mtu, "10.231.1.1/24", "fd31:1::1/64")?;
    address(&s, "eth0", mtu, "10.231.2.2/24", "fd31:2::2/64")?;
    for (g, v4, v6) in [(&c, "10.231.1.254", "fd31:1::fe"), (&s, "10.231.2.254", "fd31:2::fe")] {
        sh(&["ip", "-n", g, "route", "add", "default", "via", v4])?;
        sh(&["ip", "-n", g, "-6", "route", "add", "default", "via", v6])?;
    }
    Ok(())
}

/// Lets a client namespace open connections fast for long CRR runs: reuse TIME_WAIT
/// ports for new connections and use a wide port range.
fn tune_client(ns: &str) -> Result<()> {
    netns::run_in(Some(ns), || {
        std::fs::write("/proc/sys/net/ipv4/tcp_tw_reuse", "1")?;
        std::fs::write("/proc/sys/net/ipv4/ip_local_port_range", "10000 65000")
    })
    .with_context(|| format!("tuning the client namespace {ns}"))?;
    Ok(())
}

/// Paths a study can compare: (name, what it is).
pub const PATHS: &[(&str, &str)] = &[
    ("direct", "a veth pair between the two guests: a dedicated adapter per guest"),
    ("linux-bridge", "the kernel's bridge in a switch namespace, a veth to each guest"),
    (
        "linux-bridge-acl",
        "the same bridge enforcing a security group of 1,000 rules towards each guest with nftables (br_netfilter, connection tracking)",
    ),
    ("router", "a router namespace forwarding between two subnets: a router guest"),
    ("sluice-l2", "a sluice switch, Layer 2, lossy, a TAP per guest"),
    ("sluice-l2-lossless", "the same sluice switch in lossless mode"),
    ("sluice-l2-poll", "the same sluice switch busy-polling (a core of its own)"),
    (
        "sluice-l2-stream",
        "a sluice switch, Layer 2, lossy, each guest behind a relay process on a stream port (QEMU's -netdev stream): a receiver that can fall behind, as a VM's backend can",
    ),
    (
        "sluice-l2-lossless-stream",
        "the same stream-attached switch in lossless mode: it holds senders back, end to end",
    ),
    (
        "sluice-l2-lossless-stream-hold1",
        "the same with one held frame per input (hold_len 1) and the pause watchdog (200 ms)",
    ),
    (
        "sluice-l2-lossless-stream-zovn",
        "the same with hold_len 1 and no pause watchdog: one full output stops the whole input (lossless without virtual queues)",
    ),
    ("sluice-l3", "a sluice switch in Layer 3 mode"),
    ("sluice-kernel", "a sluice switch, Layer 2, on its kernel datapath: a veth pair per guest, TC programs forward"),
    (
        "sluice-kernel-acl",
        "the same kernel-datapath sluice switch enforcing a security group of 1,000 rules towards each guest (connection tracking by the kernel's conntrack)",
    ),
    ("sluice-kernel-l3", "the same kernel-datapath sluice switch in Layer 3 mode"),
    ("sluice-l2-lan", "a guest of a Layer 2 sluice switch to a host on the LAN, through the uplink"),
    ("sluice-l3-lan", "a guest of a Layer 3 sluice switch to a host on the LAN, through the uplink"),
    ("ovs", "Open vSwitch, user-space datapath with TSO"),
    (
        "overlay-kernel",
        "two hosts joined by VXLAN over a veth underlay: a kernel vxlan device and a Linux bridge on each",
    ),
    (
        "overlay-sluice",
        "the same two hosts with a sluice switch and its vxlan port on each, user-space datapath (`lab up --hosts 2 --datapath user`): the tunnel a UDP socket",
    ),
    (
        "overlay-sluice-kernel",
        "the same on the kernel datapath (`lab up --hosts 2`): the tunnel a vxlan device fed by the TC programs",
    ),
    ("overlay-sluice-lossless", "the same with both sluice switches in lossless mode"),
    (
        "overlay-mixed",
        "a sluice host (user-space datapath) and a kernel vxlan host (`lab up --hosts 2 --peer-kernel --datapath user`)",
    ),
    ("loopback", "client and server in one namespace, TCP over its loopback interface"),
    (
        "smc",
        "both ends under `sluice smc run` in two guests of a sluice switch (veths on the kernel datapath, as `sluice lab up` makes them): shared memory",
    ),
    ("vm-sluice", "two QEMU VMs on vhost-user ports of a sluice switch (`lab up --vm 2`); iperf3 runs inside them"),
    ("vm-bridge", "two QEMU VMs on QEMU's TAP backend and a Linux bridge; iperf3 runs inside them"),
    ("smc-loopback", "both ends under `sluice smc run` in one namespace: shared memory against TCP loopback"),
];

/// Paths whose cells run inside two VMs (only `iperf3`: the VMs hold busybox and iperf3).
pub const VM_PATHS: &[&str] = &["vm-sluice", "vm-bridge"];

/// Paths that build the six guests a partition-aggregate point needs.
pub const PA_PATHS: &[&str] = &[
    "linux-bridge",
    "sluice-l2",
    "sluice-l2-lossless",
    "sluice-l2-poll",
    "sluice-l2-stream",
    "sluice-l2-lossless-stream",
    "sluice-kernel",
    "overlay-kernel",
    "overlay-sluice",
    "overlay-sluice-kernel",
    "overlay-sluice-lossless",
    "overlay-mixed",
];

/// An address family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Family {
    /// IPv4.
    Ipv4,
    /// IPv6.
    Ipv6,
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Family::Ipv4 => "IPv4",
            Family::Ipv6 => "IPv6",
        })
    }
}

/// A study path's kind and, for `PATH@BUILD`, the build it runs with.
pub fn split_build(path: &str) -> (&str, Option<&str>) {
    match path.split_once('@') {
        Some((base, build)) => (base, Some(build)),
        None => (path, None),
    }
}

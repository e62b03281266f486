//! `sluice lab`: throw-away guests in network namespaces, attached by TAP to a switch.
//!
//! A lab's state file (/run/sluice/labs/NAME.json) is written before each thing the lab
//! creates, so `sluice lab down` finds and removes everything — and only what — the lab
//! made, even after a crash. Tests and studies build their topologies with the same code.

use std::ffi::OsStr;
use std::fs;
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use serde::{Deserialize, Serialize};

use sluice_api::client::Client;
use sluice_api::config::PortSpec;
use sluice_api::proto::Request;
use sluice_sys::netns;
use sluice_sys::paths;

/// `sluice lab …`
#[derive(Debug, clap::Subcommand)]
pub enum LabCmd {
    /// Create guests attached to a switch, starting the switch if needed.
    ///
    /// Each guest is a network namespace `sluice-LAB-gN` holding a TAP `LAB-gN` (with
    /// --datapath kernel: one end of a veth pair `LAB-gN`, whose other end is the switch's
    /// port) with 10.77.0.N/24 and fd77::N/64 (usable at once: no DAD wait). The switch is the one
    /// named by --switch, else a switch named after the lab, started in the background
    /// if it is not running (its log: /run/sluice/labs/LAB.log).
    #[command(verbatim_doc_comment)]
    Up(UpArgs),
    /// Remove everything a lab made: its guests, their ports, and the switch if the lab
    /// started it.
    Down {
        /// The lab (default: the only one).
        #[arg(long)]
        name: Option<String>,
    },
    /// Run a command inside a guest's namespace, e.g. `sluice lab exec g1 -- ping 10.77.0.2`.
    Exec {
        /// The lab (default: the only one).
        #[arg(long)]
        name: Option<String>,
        /// Guest: g1, g2, … (h1g1, h2g1, … in a lab of several hosts), or its namespace name.
        guest: String,
        /// The command and its arguments.
        #[arg(last = true, required = true)]
        cmd: Vec<String>,
    },
    /// Stop a lab VM's QEMU and boot the VM again (a new QEMU process on the same port):
    /// what a VM restart looks like to the switch.
    Reboot {
        /// The lab (default: the only one).
        #[arg(long)]
        name: Option<String>,
        /// The VM: vm1, vm2, …
        guest: String,
    },
    /// List labs and their guests.
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// Arguments of `sluice lab up`.
#[derive(Debug, Clone, clap::Args)]
pub struct UpArgs {
    /// Lab name: 1 to 10 lowercase letters, digits or '-'.
    #[arg(long, default_value = "lab")]
    pub name: String,
    /// Number of guests (1 to 99).
    #[arg(long, default_value_t = 2)]
    pub guests: u32,
    /// MTU of the switch and the guests' interfaces, 68 to 9000.
    #[arg(long, default_value_t = 1500, value_parser = sluice_api::config::mtu_arg)]
    pub mtu: u16,
    /// Use this running switch instead of one named after the lab.
    #[arg(long, value_name = "NAME")]
    pub switch: Option<String>,
    /// Start the switch in lossless mode.
    #[arg(long)]
    pub lossless: bool,
    /// Start the switch busy-polling.
    #[arg(long)]
    pub poll: bool,
    /// Turn offloads off on the guests' ports (software segmentation).
    #[arg(long)]
    pub no_offload: bool,
    /// Add a LAN: an external host `lan` (10.77.0.200, fd77::c8) in a namespace of its
    /// own, reached through the switch's uplink port (a veth end opened with AF_PACKET).
    #[arg(long)]
    pub lan: bool,
    /// With --lan: how many uplink interfaces lead to the LAN (1 to 3); the first is
    /// active, the others are backups that take over when it goes down.
    #[arg(long, default_value_t = 1, requires = "lan", value_parser = clap::value_parser!(u8).range(1..=3))]
    pub uplinks: u8,
    /// Transport mode of the switch the lab starts: l2 (ports known by MAC address) or l3
    /// (ports known by IP address: each guest's port owns its two addresses, the switch
    /// answers ARP and neighbour discovery, and on the LAN every guest sits behind the
    /// uplink's MAC). A running switch of the other mode is refused.
    #[arg(long, value_enum, default_value = "l2")]
    pub mode: ModeArg,
    /// Which datapath the switch the lab starts runs: kernel (guests on veth pairs, TC
    /// programs forward in the kernel, the core in user space decides) or user (guests on
    /// TAP ports, one user-space thread forwards). Default: kernel, unless the lab is
    /// lossless (the kernel datapath cannot hold a sender back), this sluice was built without
    /// it, or the kernel refuses it (then user, with a note); with --switch, the running
    /// switch's.
    #[arg(long, value_enum)]
    pub datapath: Option<sluice_api::config::DatapathArg>,
    /// How guests attach: tap (a TAP port each) or stream (each guest's TAP is behind a
    /// `sluice port relay` process on a stream port: a program that can be stopped, so the
    /// switch can hold frames back for it and its pause watchdog can see it stop; user-space
    /// datapath).
    #[arg(long, value_enum, default_value = "tap")]
    pub attach: AttachArg,
    /// Hosts (1 to 4): with more than one, each host is a namespace of its own with its own
    /// sluice switch (on --datapath, as a lab of one host chooses it) and --guests guests
    /// `hKgJ`, the hosts joined by a veth underlay (192.168.77.K, fd78::K) and their switches
    /// by VXLAN tunnels (VNI 5000): one LAN, 10.77.0.0/24, across hosts. Lab names are then
    /// at most 8 characters.
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub hosts: u32,
    /// With --hosts: the last host is plain Linux instead of sluice — a kernel `vxlan`
    /// device and a bridge, its guests on veth pairs (needs ethtool: its underlay fills
    /// checksums in software, as a NIC would).
    #[arg(long, requires = "hosts")]
    pub peer_kernel: bool,
    /// Small QEMU VMs (0 to 8) next to the namespace guests, each attached by a vhost-user
    /// port: `vm1`… with the next addresses of the lab's table, Debian's kernel and an
    /// initramfs the lab builds (busybox, iperf3), under KVM where it works and TCG where
    /// not (--accel). `sluice lab exec vm1 -- CMD` runs CMD on the VM's serial console.
    /// Needs qemu-system-x86, linux-image-amd64 and busybox-static; picks the user-space
    /// datapath unless told otherwise.
    #[arg(long = "vm", value_name = "N", default_value_t = 0)]
    pub vms: u32,
    /// With --vm, how the VMs run: `auto` boots a small probe VM under KVM (when /dev/kvm
    /// opens; once, the verdict kept while labs with VMs are up) and uses KVM if it answers
    /// within 20 s, TCG (QEMU's emulator) if not — on some machines KVM guests hang at
    /// boot; `kvm` or `tcg` to choose.
    #[arg(long, value_enum, default_value = "auto")]
    pub accel: crate::vm::Accel,
    /// Which host of a multi-host lab this (sub-)lab is (0: a lab of one host).
    #[arg(skip)]
    pub host: u32,
    /// Print the guest table as JSON.
    #[arg(long)]
    pub json: bool,
    /// The sluice executable the lab starts its switch and relays with, when not this one
    /// (a study comparing two builds of sluice in one run).
    #[arg(skip)]
    pub exe: Option<PathBuf>,
}

/// `--attach` values.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum AttachArg {
    /// A TAP port per guest (or a veth pair on the kernel datapath).
    #[default]
    Tap,
    /// A stream port per guest, through a relay process.
    Stream,
}

/// `--mode` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ModeArg {
    /// Layer 2: ports known by MAC address.
    L2,
    /// Layer 3: ports known by IP address.
    L3,
}

impl ModeArg {
    fn as_str(self) -> &'static str {
        match self {
            ModeArg::L2 => "l2",
            ModeArg::L3 => "l3",
        }
    }
}

impl UpArgs {
    /// A lab of two guests with every other setting at its default (for the demo and
    /// the studies, which build labs without a command line).
    pub fn two_guests(name: &str, mtu: u16) -> UpArgs {
        UpArgs {
            name: name.into(),
            guests: 2,
            mtu,
            switch: None,
            lossless: false,
            poll: false,
            no_offload: false,
            lan: false,
            uplinks: 1,
            mode: ModeArg::L2,
            datapath: None,
            attach: AttachArg::Tap,
            hosts: 1,
            peer_kernel: false,
            vms: 0,
            accel: crate::vm::Accel::Auto,
            host: 0,
            json: false,
            exe: None,
        }
    }
}

/// One guest of a lab.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Guest {
    /// Short name, g1…
    pub guest: String,
    /// Network namespace.
    pub netns: String,
    /// TAP interface (inside the namespace) and switch port name.
    pub tap: String,
    /// IPv4 address with prefix.
    pub ipv4: String,
    /// IPv6 address with prefix.
    pub ipv6: String,
    /// The lab created the namespace.
    pub created_netns: bool,
    /// The lab attached the port.
    pub added_port: bool,
    /// The `sluice port relay` process between the guest's TAP and its stream port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub relay_pid: Option<u32>,
    /// A VM guest (`--vm`): its QEMU and its files. `netns` is empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vm: Option<crate::vm::VmFiles>,
}

impl Guest {
    /// Guest number `n` of the lab's address table (10.77.0.N/24, fd77::N/64), nothing
    /// made for it yet.
    pub(crate) fn numbered(n: u32, guest: String, netns: String, tap: String) -> Guest {
        Guest {
            guest,
            netns,
            tap,
            ipv4: format!("10.77.0.{n}/24"),
            ipv6: format!("fd77::{n:x}/64"),
            created_netns: false,
            added_port: false,
            relay_pid: None,
            vm: None,
        }
    }

    /// Its number in the address table (the IPv4 address's last byte).
    fn number(&self) -> u32 {
        self.ipv4.split('/').next().and_then(|a| a.rsplit('.').next()).and_then(|x| x.parse().ok()).unwrap_or(0)
    }

    /// Its addresses without their prefixes: what a Layer 3 port is reached at.
    fn addresses(&self) -> Vec<String> {
        [&self.ipv4, &self.ipv6].iter().map(|a| a.split('/').next().unwrap_or_default().to_string()).collect()
    }
}

/// What a lab made, as kept on disk.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LabState {
    /// Lab name.
    pub name: String,
    /// Switch name.
    pub switch: String,
    /// Its control socket.
    pub socket: PathBuf,
    /// The lab started the switch (and will stop it).
    pub started_switch: bool,
    /// The switch daemon's pid, if the lab started it.
    pub switch_pid: Option<u32>,
    /// MTU.
    pub mtu: u16,
    /// Guests (with `--lan`, the external host `lan` last; its "TAP" is the uplink port).
    pub guests: Vec<Guest>,
    /// Other namespaces the lab created (the uplink's side of the LAN), removed by `down`.
    #[serde(default)]
    pub extra_netns: Vec<String>,
    /// The switch's transport mode, "l2" or "l3".
    #[serde(default = "l2")]
    pub mode: String,
    /// The switch's datapath, "user" (guests on TAPs) or "kernel" (guests on veth pairs).
    #[serde(default = "user")]
    pub datapath: String,
    /// Interfaces the lab created in the switch's own namespace (the uplink's devices on
    /// the kernel datapath), deleted by `down`.
    #[serde(default)]
    pub links: Vec<String>,
    /// A multi-host lab's hosts that run sluice: labs of their own, taken down by `down`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sublabs: Vec<String>,
    /// The sluice executable that runs the lab's switch and relays, when not the one that
    /// made the lab.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exe: Option<PathBuf>,
}

fn l2() -> String {
    "l2".into()
}

fn user() -> String {
    "user".into()
}

pub(crate) fn state_path(name: &str) -> PathBuf {
    paths::labs_dir().join(format!("{name}.json"))
}

impl LabState {
    pub(crate) fn save(&self) -> Result<()> {
        check_name(&self.name)?;
        let dir = paths::labs_dir();
        fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let tmp = dir.join(format!(".{}.json.tmp", self.name));
        fs::write(&tmp, serde_json::to_vec_pretty(self)?)?;
        fs::rename(&tmp, state_path(&self.name))?;
        Ok(())
    }

    /// Reads lab `name`'s state. The name is checked as `lab up` checks it: what `lab down`
    /// and `lab exec` do as root follows this file (processes stopped, namespaces and
    /// interfaces deleted), so it is never one reached by a path out of the labs' directory.
    pub fn load(name: &str) -> Result<LabState> {
        check_name(name)?;
        let p = state_path(name);
        let text = fs::read(&p).map_err(|_| {
            let labs = list_names();
            anyhow!(
                "no lab named {name:?}{}",
                if labs.is_empty() { " (no lab is up)".to_string() } else { format!(" (labs: {})", labs.join(", ")) }
            )
        })?;
        serde_json::from_slice(&text).with_context(|| format!("reading lab state {}", p.display()))
    }

    /// The guest called `g` (g1, its namespace or its TAP).
    pub fn guest(&self, g: &str) -> Result<&Guest> {
        self.guests.iter().find(|x| x.guest == g || x.netns == g || x.tap == g).ok_or_else(|| {
            anyhow!(
                "lab {} has no guest {g:?} (guests: {})",
                self.name,
                self.guests.iter().map(|g| g.guest.as_str()).collect::<Vec<_>>().join(", ")
            )
        })
    }

    fn switch_alive(&self) -> bool {
        UnixStream::connect(&self.socket).is_ok()
    }
}

fn list_names() -> Vec<String> {
    let Ok(d) = fs::read_dir(paths::labs_dir()) else { return vec![] };
    let mut v: Vec<String> = d
        .flatten()
        .filter_map(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            n.strip_suffix(".json").filter(|s| !s.starts_with('.')).map(String::from)
        })
        .collect();
    v.sort();
    v
}

fn pick(name: Option<String>) -> Result<String> {
    if let Some(n) = name {
        return Ok(n);
    }
    let mut labs = list_names();
    // The hosts of a multi-host lab are labs too; without --name the lab that holds them
    // is meant.
    let hosts: Vec<String> = labs.iter().filter_map(|l| LabState::load(l).ok()).flat_map(|s| s.sublabs).collect();
    labs.retain(|l| !hosts.contains(l));
    match labs.len() {
        0 => bail!("no lab is up; create one with `sluice lab up`"),
        1 => Ok(labs[0].clone()),
        _ => bail!("{} labs are up ({}); choose one with --name", labs.len(), labs.join(", ")),
    }
}

/// Runs `sluice lab …`.
pub fn run(cmd: LabCmd) -> Result<()> {
    let verb = match &cmd {
        LabCmd::Up(_) => Some("up"),
        LabCmd::Down { .. } => Some("down"),
        LabCmd::Exec { .. } => Some("exec"),
        LabCmd::Reboot { .. } => Some("reboot"),
        _ => None,
    };
    if let Some(verb) = verb
        && !sluice_sys::is_root()
    {
        bail!(
            "`sluice lab {verb}` needs root: it creates and removes network namespaces and interfaces, and enters them; run it with sudo"
        );
    }
    match cmd {
        LabCmd::Up(a) => {
            let json = a.json;
            let s = up(&a)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&s)?);
            } else {
                print!("{}", render(&s));
            }
        }
        LabCmd::Down { name } => {
            let name = pick(name)?;
            down(&name)?;
            println!("lab {name} removed");
        }
        LabCmd::Exec { name, guest, cmd } => {
            let s = LabState::load(&pick(name)?)?;
            let g = s.guest(&guest)?;
            if g.vm.is_some() {
                // Bounded: a command that runs longer is reported, and keeps running in the VM.
                let rc = vm_exec(g, &cmd, Duration::from_secs(600))?;
                std::process::exit(rc);
            }
            let err = Command::new("ip").args(["netns", "exec", &g.netns]).args(&cmd).exec();
            bail!("cannot run `ip netns exec {} {}`: {err}", g.netns, cmd.join(" "));
        }
        LabCmd::Reboot { name, guest } => {
            let mut s = LabState::load(&pick(name)?)?;
            reboot_vm(&mut s, &guest)?;
            println!("VM {guest} booted again");
        }
        LabCmd::List { json } => {
            let labs: Vec<LabState> = list_names().iter().filter_map(|n| LabState::load(n).ok()).collect();
            if json {
                println!("{}", serde_json::to_string_pretty(&labs)?);
            } else if labs.is_empty() {
                println!("no lab is up");
            } else {
                for s in &labs {
                    print!("{}", render(s));
                }
            }
        }
    }
    Ok(())
}

/// The guest table.
pub fn render(s: &LabState) -> String {
    let mut t = comfy_table::Table::new();
    t.load_style(comfy_table::presets::NOTHING);
    t.set_header(["GUEST", "NAMESPACE", "PORT", "IPV4", "IPV6"]);
    for g in &s.guests {
        t.add_row([&g.guest, &g.netns, &g.tap, &g.ipv4, &g.ipv6]);
    }
    if s.switch.is_empty() {
        // A lab of several hosts: its host labs have the switches.
        let kernel = s.guests.iter().filter(|g| g.tap == "eth0").map(|g| &g.guest[..2]).next();
        return format!(
            "lab {} of hosts joined by VXLAN (VNI {}, underlay 192.168.77.0/24): sluice switches in {}{} (MTU {}):\n{t}\n",
            s.name,
            crate::hosts::LAB_VNI,
            s.sublabs.join(", "),
            kernel.map(|k| format!("; host {k} is a kernel vxlan device and bridge")).unwrap_or_default(),
            s.mtu
        );
    }
    format!(
        "lab {} on switch {} ({}{}){} (MTU {}):\n{t}\n",
        s.name,
        s.switch,
        if s.mode == "l3" { "Layer 3" } else { "Layer 2" },
        if s.datapath == "kernel" { ", kernel datapath" } else { "" },
        if s.started_switch {
            format!(", started by the lab, pid {}", s.switch_pid.unwrap_or(0))
        } else {
            String::new()
        },
        s.mtu
    )
}

/// Checks a lab name: 1 to 10 lowercase letters, digits or '-', not starting with '-' (a
/// file name in the labs' directory, never a path).
fn check_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 10
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !name.starts_with('-');
    if ok { Ok(()) } else { bail!("lab name {name:?} must be 1 to 10 lowercase letters, digits or '-'") }
}

/// Creates bridge `br0` in namespace `ns` at `mtu`, without spanning tree or forwarding
/// delay (it forwards at once), not yet up.
pub fn add_bridge(ns: &str, mtu: u16) -> Result<()> {
    let m = mtu.to_string();
    sh(&["ip", "-n", ns, "link", "add", "br0", "mtu", &m, "type", "bridge", "stp_state", "0", "forward_delay", "0"])
}

/// Runs a command, failing with its stderr.
pub fn sh(args: &[&str]) -> Result<()> {
    let out = Command::new(args[0])
        .args(&args[1..])
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("cannot run {}: is it installed?", args[0]))?;
    if !out.status.success() {
        bail!("`{}` failed: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

/// Creates a lab; on failure removes what it had made. Without `--datapath` the kernel
/// datapath is tried first (see [`UpArgs::datapath`]).
pub fn up(a: &UpArgs) -> Result<LabState> {
    if a.vms > 0 && (a.hosts != 1 || a.peer_kernel) {
        bail!("--vm works in a lab of one host; leave out --hosts and --peer-kernel");
    }
    if a.hosts != 1 || a.peer_kernel {
        return crate::hosts::up(a);
    }
    if a.datapath.is_some() {
        return up_on(a);
    }
    let running = a.switch.as_ref().and_then(|sw| {
        Client::connect(&paths::socket_for(sw)).ok()?.call::<sluice_api::proto::SwitchSummary>(&Request::Hello).ok()
    });
    let auto = match running {
        Some(r) if r.datapath == "kernel" => sluice_api::config::DatapathArg::Kernel,
        Some(_) => sluice_api::config::DatapathArg::User,
        None if a.lossless || a.attach == AttachArg::Stream || a.vms > 0 || !sluice_ebpf::available() => {
            sluice_api::config::DatapathArg::User
        }
        None => sluice_api::config::DatapathArg::Kernel,
    };
    let first = UpArgs { datapath: Some(auto), ..a.clone() };
    match up_on(&first) {
        Err(e)
            if auto == sluice_api::config::DatapathArg::Kernel
                && a.switch.is_none()
                && format!("{e:#}").contains("kernel datapath") =>
        {
            eprintln!(
                "sluice: the kernel datapath is not available here ({}); the lab uses the user-space datapath",
                format!("{e:#}").lines().last().unwrap_or_default().trim()
            );
            up_on(&UpArgs { datapath: Some(sluice_api::config::DatapathArg::User), ..a.clone() })
        }
        other => other,
    }
}

fn up_on(a: &UpArgs) -> Result<LabState> {
    let datapath = a.datapath.unwrap_or_default();
    check_name(&a.name)?;
    if a.attach == AttachArg::Stream && datapath == sluice_api::config::DatapathArg::Kernel {
        bail!(
            "--attach stream needs the user-space datapath (--datapath user): the kernel datapath forwards between veth ports"
        );
    }
    if a.switch.is_none() {
        sluice_api::config::check_lossless(datapath.kind(), a.lossless)
            .map_err(|e| anyhow::anyhow!("--lossless: {e}"))?;
    }
    if !(1..=99).contains(&a.guests) {
        bail!("--guests must be 1 to 99");
    }
    if a.vms > 8 || a.guests + a.vms > 99 {
        bail!("--vm must be 0 to 8 (and with --guests at most 99 in all)");
    }
    if !sluice_switch::switch_mtu_range().contains(&a.mtu) {
        bail!("--mtu {} is out of range: use 68 to 9000", a.mtu);
    }
    if let Ok(old) = LabState::load(&a.name) {
        let alive = old.switch_alive() || old.guests.iter().any(|g| g.created_netns && netns::exists(&g.netns));
        if alive {
            bail!(
                "lab {} is already up; remove it with `sluice lab down --name {}` or pick another --name",
                a.name,
                a.name
            );
        }
        let _ = fs::remove_file(state_path(&a.name));
    }
    let switch = a.switch.clone().unwrap_or_else(|| a.name.clone());
    let mut s = LabState {
        name: a.name.clone(),
        socket: paths::socket_for(&switch),
        switch,
        started_switch: false,
        switch_pid: None,
        mtu: a.mtu,
        guests: Vec::new(),
        extra_netns: Vec::new(),
        mode: a.mode.as_str().into(),
        datapath: datapath.kind().as_str().into(),
        links: Vec::new(),
        sublabs: Vec::new(),
        exe: a.exe.clone(),
    };
    s.save()?;
    match build(&mut s, a) {
        Ok(()) => Ok(s),
        Err(e) => {
            let _ = down(&s.name);
            Err(e)
        }
    }
}

fn build(s: &mut LabState, a: &UpArgs) -> Result<()> {
    if !s.switch_alive() {
        if a.switch.is_some() {
            bail!("switch {:?} is not running", s.switch);
        }
        start_switch(s, a)?;
    }
    let mut client = Client::connect(&s.socket)?;
    let running: sluice_api::proto::SwitchSummary = client.call(&Request::Hello)?;
    if running.mode != a.mode.as_str() {
        bail!(
            "switch {:?} runs in {} mode, not {}; use --mode {} with it, or another switch",
            s.switch,
            running.mode,
            a.mode.as_str(),
            running.mode
        );
    }
    let datapath = a.datapath.unwrap_or_default();
    let kernel = datapath == sluice_api::config::DatapathArg::Kernel;
    if running.datapath != datapath.kind().as_str() {
        bail!(
            "switch {:?} runs the {} datapath, not {}; use --datapath {} with it, or another switch",
            s.switch,
            running.datapath,
            datapath.kind().as_str(),
            running.datapath
        );
    }
    for i in 1..=a.guests {
        // Host K of a multi-host lab: guests hKgJ, numbered on from the hosts before it.
        let (label, n) = match a.host {
            0 => (format!("g{i}"), i),
            k => (format!("h{k}g{i}"), (k - 1) * a.guests + i),
        };
        let g = Guest::numbered(n, label, format!("sluice-{}-g{i}", s.name), format!("{}-g{i}", s.name));
        if netns::exists(&g.netns) {
            bail!(
                "network namespace {} already exists and is not this lab's; remove it or pick another lab --name",
                g.netns
            );
        }
        s.guests.push(g.clone());
        let idx = s.guests.len() - 1;
        s.guests[idx].created_netns = true;
        s.save()?;
        sh(&["ip", "netns", "add", &g.netns])?;
        netns::run_in(Some(&g.netns), || {
            for k in ["default", "all"] {
                fs::write(format!("/proc/sys/net/ipv6/conf/{k}/accept_dad"), "0")?;
            }
            Ok(())
        })?;
        sh(&["ip", "-n", &g.netns, "link", "set", "lo", "up"])?;
        s.guests[idx].added_port = true;
        s.save()?;
        let mut spec = PortSpec::tap(&g.tap);
        if kernel {
            // A veth pair: the switch's end here, the guest's (same name) in its namespace;
            // deleting the namespace deletes both.
            let m = a.mtu.to_string();
            sh(&[
                "ip", "link", "add", &g.tap, "mtu", &m, "type", "veth", "peer", "name", &g.tap, "mtu", &m, "netns",
                &g.netns,
            ])?;
            sh(&["ip", "-n", &g.netns, "link", "set", &g.tap, "up"])?;
            spec.kind = sluice_api::config::PortKind::Veth;
        } else if a.attach == AttachArg::Stream {
            let pid = start_relay(s, idx, a.mtu)?;
            s.guests[idx].relay_pid = Some(pid);
            s.save()?;
            spec.kind = sluice_api::config::PortKind::Stream;
            spec.path = Some(relay_socket(&s.name, &g.guest));
        } else {
            spec.netns = Some(g.netns.clone());
        }
        spec.mtu = Some(a.mtu);
        spec.offload = !a.no_offload;
        if a.mode == ModeArg::L3 {
            // The addresses the guest is reached at, before it has said anything.
            spec.ips = g.addresses();
        }
        client.call_value(&Request::PortAdd { port: Box::new(spec) })?;
        if a.attach == AttachArg::Stream {
            sh(&["ip", "-n", &g.netns, "link", "set", &g.tap, "up"])?;
        }
        sh(&["ip", "-n", &g.netns, "addr", "add", &g.ipv4, "dev", &g.tap])?;
        sh(&["ip", "-n", &g.netns, "addr", "add", &g.ipv6, "dev", &g.tap, "nodad"])?;
    }
    if a.vms > 0 {
        add_vms(s, &mut client, a)?;
    }
    if a.lan {
        add_lan(s, &mut client, a.mtu, a.uplinks, kernel)?;
    }
    Ok(())
}

/// The VMs of `--vm`: a vhost-user port each (its socket in the labs directory), QEMU
/// booted in the background, then each console waited for (all boot at once).
fn add_vms(s: &mut LabState, client: &mut Client, a: &UpArgs) -> Result<()> {
    let dir = paths::labs_dir();
    // The VMs are in the lab's state before their image is built: a lab going down
    // meanwhile keeps the image for them.
    let first = s.guests.len();
    for k in 1..=a.vms {
        let n = a.guests + k;
        s.guests.push(Guest {
            added_port: true,
            ..Guest::numbered(n, format!("vm{k}"), String::new(), format!("{}-vm{k}", s.name))
        });
    }
    s.save()?;
    let img = crate::vm::image(&dir).context("building the VMs' image")?;
    let accel = crate::vm::choose_accel(a.accel, &img, &dir)?;
    eprintln!("booting {} VM(s) under {}", a.vms, if accel == crate::vm::Accel::Kvm { "KVM" } else { "TCG" });
    for k in 1..=a.vms {
        let n = a.guests + k;
        let idx = first + k as usize - 1;
        let mut g = s.guests[idx].clone();
        let socket = dir.join(format!("{}-vm{k}.vhost.sock", s.name));
        let spec = PortSpec {
            kind: sluice_api::config::PortKind::VhostUser,
            socket: Some(socket.clone()),
            mtu: Some(a.mtu),
            offload: !a.no_offload,
            ips: if a.mode == ModeArg::L3 { g.addresses() } else { vec![] },
            ..PortSpec::tap(&g.tap)
        };
        client.call_value(&Request::PortAdd { port: Box::new(spec) })?;
        let mac = crate::vm::mac(n);
        let files = crate::vm::boot(
            &img,
            &crate::vm::VmSpec {
                name: &format!("{}-vm{k}", s.name),
                dir: &dir,
                socket: Some(&socket),
                tap: None,
                mac: &mac,
                ipv4: &g.ipv4,
                ipv6: &g.ipv6,
                mtu: a.mtu,
                accel,
            },
        )?;
        g.vm = Some(files);
        s.guests[idx] = g;
        s.save()?;
    }
    for g in s.guests.iter().filter(|g| g.vm.is_some()) {
        let vm = g.vm.as_ref().expect("filtered");
        let mut c = crate::vm::Console::connect(&vm.serial, Duration::from_secs(10))?;
        c.wait_ready(Duration::from_secs(120)).with_context(|| {
            format!(
                "VM {} (QEMU pid {}; its stderr: {}, its kernel's console: {})",
                g.guest,
                vm.pid,
                vm.log.display(),
                vm.console.display()
            )
        })?;
    }
    Ok(())
}

/// Stops VM `guest`'s QEMU and boots it again with the same port, address and files;
/// waits for its console.
pub fn reboot_vm(s: &mut LabState, guest: &str) -> Result<()> {
    let idx = s
        .guests
        .iter()
        .position(|g| g.guest == guest)
        .with_context(|| format!("lab {} has no VM {guest:?}", s.name))?;
    let g = s.guests[idx].clone();
    let vm = g.vm.clone().with_context(|| format!("{guest} is not a VM"))?;
    crate::vm::stop(vm.pid);
    let dir = paths::labs_dir();
    let img = crate::vm::image(&dir)?;
    let accel = if vm.accel == "kvm" { crate::vm::Accel::Kvm } else { crate::vm::Accel::Tcg };
    let files = crate::vm::boot(
        &img,
        &crate::vm::VmSpec {
            name: &g.tap,
            dir: &dir,
            socket: Some(&vm.socket),
            tap: None,
            mac: &crate::vm::mac(g.number()),
            ipv4: &g.ipv4,
            ipv6: &g.ipv6,
            mtu: s.mtu,
            accel,
        },
    )?;
    let serial = files.serial.clone();
    s.guests[idx].vm = Some(files);
    s.save()?;
    crate::vm::Console::connect(&serial, Duration::from_secs(10))?.wait_ready(Duration::from_secs(120))
}

/// Runs `cmd` on VM guest `g`'s console, its output to ours; returns its exit code.
pub fn vm_exec(g: &Guest, cmd: &[String], wait: Duration) -> Result<i32> {
    let vm = g.vm.as_ref().context("not a VM")?;
    let line = cmd.iter().map(|a| shell_quote(a)).collect::<Vec<_>>().join(" ");
    let mut c = crate::vm::Console::connect(&vm.serial, Duration::from_secs(5))?;
    let (rc, out) = c.run(&line, wait)?;
    std::io::stdout().write_all(&out)?;
    Ok(rc)
}

/// One argument as `sh` reads it back.
fn shell_quote(a: &str) -> String {
    if !a.is_empty() && a.chars().all(|c| c.is_ascii_alphanumeric() || "-_./:=@%+,".contains(c)) {
        a.to_string()
    } else {
        format!("'{}'", a.replace('\'', "'\\''"))
    }
}

/// The external host `lan` behind the uplink: namespace `sluice-LAB-lan` with `eth0`,
/// whose veth peer `LAB-up` sits in namespace `sluice-LAB-up` and is the switch's uplink
/// (on the kernel datapath: in the switch's own namespace, where the kernel can send to it).
/// With `uplinks` > 1, `eth0`, `eth1`… are joined by a bridge `br0` that holds the host's
/// addresses, and `LAB-up2`, `LAB-up3` are the uplink's backups.
fn add_lan(s: &mut LabState, client: &mut Client, mtu: u16, uplinks: u8, kernel: bool) -> Result<()> {
    let (up_ns, lan_ns, port) =
        (format!("sluice-{}-up", s.name), format!("sluice-{}-lan", s.name), format!("{}-up", s.name));
    for ns in [&up_ns, &lan_ns] {
        if netns::exists(ns) {
            bail!("network namespace {ns} already exists and is not this lab's; remove it or pick another lab --name");
        }
    }
    if !kernel {
        s.extra_netns.push(up_ns.clone());
        s.save()?;
        sh(&["ip", "netns", "add", &up_ns])?;
    }
    let g = Guest {
        guest: "lan".into(),
        netns: lan_ns.clone(),
        tap: port.clone(),
        ipv4: "10.77.0.200/24".into(),
        ipv6: "fd77::c8/64".into(),
        created_netns: true,
        added_port: false,
        relay_pid: None,
        vm: None,
    };
    s.guests.push(g.clone());
    s.save()?;
    sh(&["ip", "netns", "add", &lan_ns])?;
    netns::run_in(Some(&lan_ns), || {
        for k in ["default", "all"] {
            fs::write(format!("/proc/sys/net/ipv6/conf/{k}/accept_dad"), "0")?;
        }
        Ok(())
    })?;
    let m = mtu.to_string();
    let mut backups = Vec::new();
    sh(&["ip", "-n", &lan_ns, "link", "set", "lo", "up"])?;
    let host_dev = if uplinks > 1 { "br0" } else { "eth0" };
    if uplinks > 1 {
        add_bridge(&lan_ns, mtu)?;
    }
    for i in 0..uplinks {
        let up_dev = if i == 0 { port.clone() } else { format!("{port}{}", i + 1) };
        let lan_dev = format!("eth{i}");
        let mut add = vec!["ip"];
        let mut set = vec!["ip"];
        if !kernel {
            add.extend(["-n", &up_ns]);
            set.extend(["-n", &up_ns]);
        } else {
            s.links.push(up_dev.clone());
            s.save()?;
        }
        add.extend(["link", "add", &up_dev, "mtu", &m, "type", "veth", "peer", "name", &lan_dev, "mtu", &m]);
        add.extend(["netns", &lan_ns]);
        sh(&add)?;
        set.extend(["link", "set", &up_dev, "up"]);
        sh(&set)?;
        if uplinks > 1 {
            sh(&["ip", "-n", &lan_ns, "link", "set", &lan_dev, "master", "br0"])?;
        }
        sh(&["ip", "-n", &lan_ns, "link", "set", &lan_dev, "up"])?;
        if i > 0 {
            backups.push(up_dev);
        }
    }
    sh(&["ip", "-n", &lan_ns, "link", "set", host_dev, "up"])?;
    sh(&["ip", "-n", &lan_ns, "addr", "add", &g.ipv4, "dev", host_dev])?;
    sh(&["ip", "-n", &lan_ns, "addr", "add", &g.ipv6, "dev", host_dev, "nodad"])?;
    let idx = s.guests.len() - 1;
    s.guests[idx].added_port = true;
    s.save()?;
    let mut spec = PortSpec::tap(&port);
    spec.kind = sluice_api::config::PortKind::Uplink;
    spec.netns = (!kernel).then_some(up_ns);
    spec.backups = backups;
    client.call_value(&Request::PortAdd { port: Box::new(spec) })?;
    Ok(())
}

fn start_switch(s: &mut LabState, a: &UpArgs) -> Result<()> {
    let dir = paths::labs_dir();
    let conf = dir.join(format!("{}.toml", s.name));
    let log = dir.join(format!("{}.log", s.name));
    let mut f = fs::File::create(&conf)?;
    writeln!(f, "# written by `sluice lab up --name {}`", s.name)?;
    writeln!(
        f,
        "name = {:?}\nmode = {:?}\ndatapath = {:?}\nmtu = {}\nlossless = {}\npoll = {}",
        s.switch,
        a.mode.as_str(),
        a.datapath.unwrap_or_default().kind().as_str(),
        a.mtu,
        a.lossless,
        a.poll
    )?;
    writeln!(f, "socket = {:?}", s.socket.display().to_string())?;
    drop(f);
    let logf = fs::File::create(&log)?;
    let pid = spawn_detached(
        s.exe.as_deref(),
        ["switch".as_ref(), "run".as_ref(), "--config".as_ref(), conf.as_os_str()],
        logf,
    )
    .context("starting the switch daemon")?;
    s.started_switch = true;
    s.switch_pid = Some(pid);
    s.save()?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if s.switch_alive() {
            return Ok(());
        }
        if !Path::new(&format!("/proc/{pid}")).exists() || is_zombie(pid) {
            let text = fs::read_to_string(&log).unwrap_or_default();
            bail!("the switch daemon exited at start:\n{}", text.trim());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    bail!("the switch daemon did not open its socket within 10 s (log: {})", log.display())
}

/// Starts `exe` (else this sluice executable) with `args` in a process group of its own,
/// its output appended to `log`; it outlives this command (init reaps it). Returns its pid.
fn spawn_detached<'a>(exe: Option<&Path>, args: impl IntoIterator<Item = &'a OsStr>, log: fs::File) -> Result<u32> {
    let exe = match exe {
        Some(e) => e.to_path_buf(),
        None => std::env::current_exe().context("finding the sluice executable")?,
    };
    let child = Command::new(exe)
        .args(args)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .process_group(0)
        .spawn()?;
    let pid = child.id();
    std::mem::forget(child);
    Ok(pid)
}

/// Where guest `guest`'s relay listens.
fn relay_socket(lab: &str, guest: &str) -> PathBuf {
    paths::labs_dir().join(format!("{lab}-{guest}.sock"))
}

/// Starts the relay for guest `idx` (its TAP in the guest's namespace, listening on
/// [`relay_socket`]) and waits until it listens; returns its pid.
fn start_relay(s: &LabState, idx: usize, mtu: u16) -> Result<u32> {
    let g = &s.guests[idx];
    let sock = relay_socket(&s.name, &g.guest);
    let log =
        fs::OpenOptions::new().create(true).append(true).open(paths::labs_dir().join(format!("{}.log", s.name)))?;
    // A socket left by an earlier lab of this name would look like this relay's.
    let _ = fs::remove_file(&sock);
    let mtu = mtu.to_string();
    let args = ["port", "relay", &g.tap, "--netns", &g.netns, "--mtu", &mtu, "--listen"];
    let pid = spawn_detached(s.exe.as_deref(), args.iter().map(OsStr::new).chain([sock.as_os_str()]), log)
        .context("starting a relay")?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if sock.exists() {
            return Ok(pid);
        }
        if is_zombie(pid) {
            bail!(
                "the relay for {} exited at start (see {})",
                g.guest,
                paths::labs_dir().join(format!("{}.log", s.name)).display()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    bail!("the relay for {} did not listen on {} within 10 s", g.guest, sock.display())
}

fn is_zombie(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(')').map(|(_, r)| r.trim_start().starts_with('Z')))
        .unwrap_or(true)
}

/// Removes lab `name`: ports, namespaces, and the switch if the lab started it.
pub fn down(name: &str) -> Result<()> {
    let s = LabState::load(name)?;
    let mut problems = Vec::new();
    for sub in &s.sublabs {
        if state_path(sub).exists()
            && let Err(e) = down(sub)
        {
            problems.push(format!("host lab {sub}: {e:#}"));
        }
    }
    let mut client = if s.switch_alive() { Client::connect(&s.socket).ok() } else { None };
    for g in s.guests.iter().rev() {
        if g.added_port
            && !s.started_switch
            && let Some(c) = client.as_mut()
            && let Err(e) = c.call_value(&Request::PortDel { name: g.tap.clone() })
            && !e.to_string().contains("no port named")
        {
            problems.push(format!("port {}: {e}", g.tap));
        }
        if let Some(vm) = &g.vm {
            crate::vm::stop(vm.pid);
            for f in [&vm.serial, &vm.log, &vm.console] {
                let _ = fs::remove_file(f);
            }
            let _ = fs::remove_file(vm.serial.with_extension("pid"));
        }
        // A relay ends when its port goes; one the switch never took is stopped here.
        if let Some(pid) = g.relay_pid {
            stop_relay(pid, &g.tap);
            let _ = fs::remove_file(relay_socket(&s.name, &g.guest));
        }
        // The switch's end of a guest's veth pair (kernel datapath): deleted here, so the
        // pair is gone at once, even while something keeps the guest's namespace alive.
        if s.datapath == "kernel" && g.created_netns && g.guest != "lan" {
            let _ = sh(&["ip", "link", "del", &g.tap]);
        }
        if g.created_netns
            && netns::exists(&g.netns)
            && let Err(e) = sh(&["ip", "netns", "del", &g.netns])
        {
            problems.push(e.to_string());
        }
    }
    for l in s.links.iter().rev() {
        let _ = sh(&["ip", "link", "del", l]);
    }
    for ns in s.extra_netns.iter().rev() {
        if netns::exists(ns)
            && let Err(e) = sh(&["ip", "netns", "del", ns])
        {
            problems.push(e.to_string());
        }
    }
    if s.started_switch {
        if let Some(c) = client.as_mut() {
            let _ = c.call_value(&Request::Shutdown);
        }
        if let Some(pid) = s.switch_pid {
            stop_pid(pid, &s.name);
        }
    }
    for ext in ["json", "toml", "log"] {
        let _ = fs::remove_file(paths::labs_dir().join(format!("{}.{ext}", s.name)));
    }
    // The VMs' image (tens of MB, under /run: memory) and the KVM verdict go with the last
    // lab that has VMs.
    let is_vm = |g: &Guest| g.vm.is_some() || (g.netns.is_empty() && g.guest.starts_with("vm"));
    if s.guests.iter().any(is_vm)
        && !list_names().iter().filter_map(|n| LabState::load(n).ok()).any(|l| l.guests.iter().any(is_vm))
    {
        crate::vm::remove_images(&paths::labs_dir());
    }
    if s.started_switch {
        // What a daemon that died (rather than stopped) left for its next run: its state
        // file, its socket, and on the kernel datapath its programs and upcall TAP.
        let _ = fs::remove_file(paths::run_dir().join(format!("{}.state.json", s.switch)));
        if !s.switch_alive() {
            let _ = fs::remove_file(&s.socket);
            if s.datapath == "kernel" {
                sluice_daemon::kernel::remove_leftovers(&s.switch);
            }
        }
    }
    if problems.is_empty() { Ok(()) } else { bail!("lab {name} removed with problems: {}", problems.join("; ")) }
}

/// Stops relay `pid` if it is still the relay of TAP `tap`.
fn stop_relay(pid: u32, tap: &str) {
    let ours = || {
        fs::read(format!("/proc/{pid}/cmdline"))
            .map(|c| {
                let args: Vec<&[u8]> = c.split(|&b| b == 0).collect();
                args.contains(&b"relay".as_slice()) && args.contains(&tap.as_bytes())
            })
            .unwrap_or(false)
            && !is_zombie(pid)
    };
    if ours() {
        let _ = sluice_sys::kill(pid, libc::SIGKILL);
    }
}

/// Waits for the lab's daemon to exit; terminates it if it does not (only if the process
/// is still the sluice daemon started for this lab).
fn stop_pid(pid: u32, lab: &str) {
    let ours = || {
        fs::read(format!("/proc/{pid}/cmdline"))
            .map(|c| {
                let c = String::from_utf8_lossy(&c);
                c.contains("switch") && c.contains(&format!("labs/{lab}.toml"))
            })
            .unwrap_or(false)
            && !is_zombie(pid)
    };
    for sig in [0, libc::SIGTERM, libc::SIGKILL] {
        if sig != 0 && ours() {
            let _ = sluice_sys::kill(pid, sig);
        }
        let deadline = Instant::now() + Duration::from_secs(3);
        while Instant::now() < deadline {
            if !ours() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `lab down` and `lab exec` run as root on what a state file says (processes stopped,
    /// namespaces and links deleted, commands run in namespaces): a name that is a path
    /// would have them follow a file anyone could write.
    #[test]
    fn a_lab_name_never_reaches_a_state_file_outside_the_labs_directory() {
        let dir = sluice_sys::fs::TempDir::new("sluice-lab").unwrap();
        let state = r#"{"name":"x","switch":"s","socket":"/nonexistent","started_switch":true,"switch_pid":1,"mtu":1500,"guests":[]}"#;
        fs::write(dir.path().join("planted.json"), state).unwrap();
        let planted = dir.path().join("planted");
        let up = format!("{}{}", "../".repeat(32), planted.display());
        for name in [planted.to_str().unwrap(), &up, "..", "Lab", "-x"] {
            let e = LabState::load(name).unwrap_err().to_string();
            assert!(e.contains("must be 1 to 10 lowercase letters"), "{name}: {e}");
        }
        let e = LabState::load("nolabhere").unwrap_err().to_string();
        assert!(e.contains("no lab named"), "{e}");
    }
}

//! `sluice lab`: throw-away guests in network namespaces, attached to a switch — the
//! command, and [`up`], which makes a lab of one host ([`crate::host`]) or of several
//! ([`crate::hosts`]).

use std::os::unix::process::CommandExt;
use std::process::Command;
use std::time::Duration;

use crate::error::{Error, Result};
use sluice_sys::bail;
use sluice_sys::error::Context;

pub use crate::args::{AttachArg, ModeArg, UpArgs};
pub use crate::host::{down, reboot_vm, vm_exec};
pub use crate::shell::{add_bridge, sh};
use crate::state::list_names;
pub use crate::state::{Guest, LabState};

/// `sluice lab …`
#[derive(Debug, clap::Subcommand)]
pub enum LabCmd {
    /// Create guests attached to a switch, starting the switch if needed.
    ///
    /// Each guest is a network namespace `sluice-LAB-gN` holding one end of a veth pair
    /// `LAB-gN`, whose other end is the switch's port on the kernel datapath (the default) —
    /// or, on the user-space datapath (--datapath user, --lossless, --vm, or a kernel that
    /// cannot run the kernel datapath), a TAP `LAB-gN` — with 10.77.0.N/24 and fd77::N/64
    /// (usable at once: no DAD wait). The switch is the one named by --switch, else a switch
    /// named after the lab, started in the background if it is not running (its log:
    /// /run/sluice/labs/LAB.log).
    ///
    /// Examples:
    ///   sluice lab up --guests 3 && sluice lab exec g1 -- ping -c 3 10.77.0.2
    ///   sluice lab up --gateway && sluice lab exec g1 -- ip route   # DHCP, via 10.77.0.254
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
        return Err(Error::NotRoot { verb });
    }
    match cmd {
        LabCmd::Up(a) => {
            let json = a.json;
            let s = up(&a)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&s).context("printing the lab as JSON")?);
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
                println!("{}", serde_json::to_string_pretty(&labs).context("printing the labs as JSON")?);
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
    if let Some(g) = &s.gateway {
        t.add_row(["gateway", "(host)", "", g.as_str(), "DHCP from dnsmasq, masquerade out of the host"]);
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

/// Creates a lab — of one host, or of several with `--hosts` or `--peer-kernel`; on failure
/// removes what it had made.
pub fn up(a: &UpArgs) -> Result<LabState> {
    if a.vms > 0 && (a.hosts != 1 || a.peer_kernel) {
        bail!("--vm works in a lab of one host; leave out --hosts and --peer-kernel");
    }
    if a.gateway && (a.hosts != 1 || a.peer_kernel) {
        bail!("--gateway works in a lab of one host; leave out --hosts and --peer-kernel");
    }
    if a.hosts != 1 || a.peer_kernel {
        return crate::hosts::up(a);
    }
    crate::host::up(a)
}

//! A lab's state file: what a lab made, kept on disk (/run/sluice/labs/NAME.json).
//!
//! The file is written before each thing the lab creates, so `sluice lab down` finds and
//! removes everything — and only what — the lab made, even after a crash.

use std::fs;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;

use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use sluice_sys::bail;
use sluice_sys::error::Context;

use sluice_sys::paths;

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
    pub(crate) fn number(&self) -> u32 {
        self.ipv4.split('/').next().and_then(|a| a.rsplit('.').next()).and_then(|x| x.parse().ok()).unwrap_or(0)
    }

    /// Its addresses without their prefixes: what a Layer 3 port is reached at.
    pub(crate) fn addresses(&self) -> Vec<String> {
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
    /// The switch's gateway (`--gateway`): its address, the guests' router.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<String>,
    /// Daemons the lab started (FRR's, for EVPN), stopped by `down`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub daemons: Vec<crate::frr::Daemon>,
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
        fs::write(&tmp, serde_json::to_vec_pretty(self).context("writing the lab's state")?)?;
        fs::rename(&tmp, state_path(&self.name))?;
        Ok(())
    }

    /// Reads lab `name`'s state. The name is checked as `lab up` checks it: what `lab down`
    /// and `lab exec` do as root follows this file (processes stopped, namespaces and
    /// interfaces deleted), so it is never one reached by a path out of the labs' directory.
    pub fn load(name: &str) -> Result<LabState> {
        check_name(name)?;
        let p = state_path(name);
        let text = fs::read(&p).map_err(|_| Error::NoSuchLab { name: name.into(), up: list_names() })?;
        Ok(serde_json::from_slice(&text).with_context(|| format!("reading lab state {}", p.display()))?)
    }

    /// The guest called `g` (g1, its namespace or its TAP).
    pub fn guest(&self, g: &str) -> Result<&Guest> {
        let found = self.guests.iter().find(|x| x.guest == g || x.netns == g || x.tap == g);
        Ok(found.ok_or_else(|| {
            sluice_sys::failure!(
                "lab {} has no guest {g:?} (guests: {})",
                self.name,
                self.guests.iter().map(|g| g.guest.as_str()).collect::<Vec<_>>().join(", ")
            )
        })?)
    }

    /// True if the lab's switch answers on its socket.
    pub(crate) fn switch_alive(&self) -> bool {
        UnixStream::connect(&self.socket).is_ok()
    }
}

/// The labs that have a state file, by name.
pub(crate) fn list_names() -> Vec<String> {
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

/// Checks a lab name: 1 to 10 lowercase letters, digits or '-', not starting with '-' (a
/// file name in the labs' directory, never a path).
pub(crate) fn check_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 10
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !name.starts_with('-');
    if ok { Ok(()) } else { bail!("lab name {name:?} must be 1 to 10 lowercase letters, digits or '-'") }
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
        let e = LabState::load("nolabhere").unwrap_err();
        assert!(matches!(&e, Error::NoSuchLab { name, .. } if name == "nolabhere"), "{e}");
        assert!(e.to_string().starts_with("no lab named \"nolabhere\""), "{e}");
    }
}

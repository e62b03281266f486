//! FRR in an EVPN lab (`sluice lab up --hosts N --evpn [--peer-frr]`): a route reflector,
//! and a plain Linux host that speaks EVPN with zebra and bgpd, each in its namespace with
//! its configuration, sockets, pid files and log in a directory of the lab's own under the
//! run directory. The lab records the daemons and `lab down` stops them.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use sluice_sys::bail;
use sluice_sys::error::Context;

use crate::error::Result;
use crate::shell::sh;

/// Where Debian installs FRR's daemons.
pub const FRR_DIR: &str = "/usr/lib/frr";
/// The AS of every host of an EVPN lab (iBGP through the reflector).
pub const LAB_ASN: u32 = 65000;
/// The route reflector's underlay address.
pub const RR_ADDRESS: &str = "192.168.77.254";

/// A daemon the lab started.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Daemon {
    /// Its pid.
    pub pid: u32,
    /// Its executable (checked before it is signalled: the pid may be another's by then).
    pub exe: PathBuf,
    /// Its directory (configuration, sockets, log), removed with it.
    pub dir: PathBuf,
}

/// Refuses, saying what to install, when FRR or GoBGP is missing.
pub fn check_installed() -> Result<()> {
    for (what, path, package) in [
        ("FRR's bgpd", format!("{FRR_DIR}/bgpd"), "frr"),
        ("FRR's zebra", format!("{FRR_DIR}/zebra"), "frr"),
        ("gobgpd", "/usr/bin/gobgpd".to_string(), "gobgpd"),
    ] {
        if !Path::new(&path).is_file() {
            bail!("--evpn needs {what} ({path}): `apt-get install {package}`");
        }
    }
    if sluice_sys::user::user_ids("frr").is_none() {
        bail!("--evpn runs FRR as user frr, which this host does not have: `apt-get install frr` makes it");
    }
    Ok(())
}

/// The route reflector's configuration: every host of 192.168.77.0/24 may peer (iBGP,
/// L2VPN EVPN) and is a client.
pub fn reflector_conf(dir: &Path) -> String {
    format!(
        "frr defaults datacenter\nhostname rr\nlog file {log}\n!\nrouter bgp {LAB_ASN}\n bgp router-id {RR_ADDRESS}\n no bgp default ipv4-unicast\n bgp cluster-id {RR_ADDRESS}\n neighbor hosts peer-group\n neighbor hosts remote-as {LAB_ASN}\n bgp listen range 192.168.77.0/24 peer-group hosts\n address-family l2vpn evpn\n  neighbor hosts activate\n  neighbor hosts route-reflector-client\n exit-address-family\n!\n",
        log = dir.join("frr.log").display()
    )
}

/// A Linux EVPN host's configuration: its VNIs from its vxlan devices
/// (`advertise-all-vni`), the reflector its peer.
pub fn host_conf(dir: &Path, router_id: &str) -> String {
    format!(
        "frr defaults datacenter\nhostname frrhost\nlog file {log}\n!\nrouter bgp {LAB_ASN}\n bgp router-id {router_id}\n no bgp default ipv4-unicast\n neighbor {RR_ADDRESS} remote-as {LAB_ASN}\n address-family l2vpn evpn\n  neighbor {RR_ADDRESS} activate\n  advertise-all-vni\n exit-address-family\n!\n",
        log = dir.join("frr.log").display()
    )
}

/// Starts zebra and bgpd in namespace `ns` with configuration `conf`, everything of theirs
/// in `dir` (made, owned by user frr). Returns the daemons.
pub fn start(ns: &str, dir: &Path, conf: &str) -> Result<Vec<Daemon>> {
    std::fs::create_dir_all(dir).with_context(|| format!("making {}", dir.display()))?;
    let conf_path = dir.join("frr.conf");
    std::fs::write(&conf_path, conf).with_context(|| format!("writing {}", conf_path.display()))?;
    sh(&["chown", "-R", "frr:frr", &dir.display().to_string()])?;
    let mut started = Vec::new();
    for d in ["zebra", "bgpd"] {
        let exe = PathBuf::from(format!("{FRR_DIR}/{d}"));
        let pid_file = dir.join(format!("{d}.pid"));
        let (e, c, p, z, v) = (
            exe.display().to_string(),
            conf_path.display().to_string(),
            pid_file.display().to_string(),
            dir.join("zserv.api").display().to_string(),
            dir.display().to_string(),
        );
        // (-A: the vty on loopback only; -d: it daemonizes once ready, writing its pid.)
        let args =
            ["ip", "netns", "exec", ns, &e, "-d", "-f", &c, "-i", &p, "-z", &z, "--vty_socket", &v, "-A", "127.0.0.1"];
        if let Err(err) = sh(&args) {
            stop(&started);
            return Err(err);
        }
        let until = Instant::now() + Duration::from_secs(10);
        let pid = loop {
            if let Some(pid) = std::fs::read_to_string(&pid_file).ok().and_then(|t| t.trim().parse::<u32>().ok()) {
                break pid;
            }
            if Instant::now() >= until {
                stop(&started);
                bail!(
                    "FRR's {d} in {ns} wrote no pid file ({}) within 10 s; see {}",
                    pid_file.display(),
                    dir.join("frr.log").display()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        started.push(Daemon { pid, exe, dir: dir.to_path_buf() });
    }
    Ok(started)
}

/// Stops daemons the lab started (SIGTERM, then SIGKILL after 5 s), each only if its pid
/// still runs its executable; then removes their directories.
pub fn stop(daemons: &[Daemon]) {
    let ours = |d: &Daemon| std::fs::read_link(format!("/proc/{}/exe", d.pid)).is_ok_and(|x| x == d.exe);
    for d in daemons.iter().rev() {
        if !ours(d) {
            continue;
        }
        // SAFETY: kill with a pid checked to be the daemon's and a plain signal number.
        unsafe { libc::kill(d.pid as i32, libc::SIGTERM) };
        let until = Instant::now() + Duration::from_secs(5);
        while ours(d) && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(20));
        }
        if ours(d) {
            // SAFETY: as above.
            unsafe { libc::kill(d.pid as i32, libc::SIGKILL) };
        }
    }
    for d in daemons {
        let _ = std::fs::remove_dir_all(&d.dir);
    }
}

/// Runs `vtysh -c CMD` against the FRR daemons of `dir` in namespace `ns`, for tests and
/// the operator: its output.
pub fn vtysh(ns: &str, dir: &Path, cmd: &str) -> Result<String> {
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", ns, "vtysh", "--vty_socket", &dir.display().to_string(), "-c", cmd])
        .stdin(std::process::Stdio::null())
        .output()
        .context("running vtysh")?;
    if !out.status.success() {
        bail!("vtysh -c {cmd:?} in {ns} failed: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

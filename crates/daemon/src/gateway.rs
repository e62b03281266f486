//! A switch's gateway (`gateway = "10.77.0.254/24"`), as libvirt's default network: a
//! port of the switch whose host end carries the address, dnsmasq (DHCP, router
//! advertisements, DNS) run and supervised as the daemon's child, forwarding turned on and
//! the subnet masqueraded in an nftables table of the switch's own — all of it undone when
//! the switch stops (docs/policy.md, "A gateway").
//!
//! The port is the kind each datapath forwards itself: on the kernel datapath a veth pair
//! the daemon makes with both ends here (as the CNI plugin's gateway port is), the host's
//! end carrying the address; on the user-space datapath a TAP, its device the host's end.
//! dnsmasq reads only the configuration written here, in the daemon's root-owned run
//! directory; its leases are kept in the state directory. It runs in the foreground as user
//! `dnsmasq` under the daemon's supervision ([`crate::child`]: its stderr in the daemon's
//! log, started again with back-off when it exits).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sluice_api::config::{GatewaySettings, PortKind, PortSpec, Settings};
use sluice_api::proto::GatewayStatus;
use sluice_sys::error::{Context, Failure};
use tracing::{info, warn};

use crate::{Datapath, Result};

/// The dnsmasq binary (Debian's `dnsmasq-base`).
pub const DNSMASQ: &str = "/usr/sbin/dnsmasq";
/// The user dnsmasq drops to.
pub const DNSMASQ_USER: &str = "dnsmasq";
/// Its group.
pub const DNSMASQ_GROUP: &str = "nogroup";
/// The namespace the gateway pair's host end stays in: the daemon's own.
const HOST_NETNS: &str = "/proc/self/ns/net";

/// The names a switch's gateway goes by.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Names {
    /// The switch's port.
    pub port: String,
    /// The host's interface carrying the addresses.
    pub host: String,
    /// The nftables table (family `ip`).
    pub table: String,
}

impl Names {
    /// The names of switch `switch`'s gateway on datapath `kernel` (else user-space): the
    /// host's interface `SWITCH-gw` (`sgw` + 12 hex digits of a hash of the name when that
    /// is too long for an interface), the kernel datapath's switch end `SWITCH-gp` (or
    /// `sgp` + the hash); on the user-space datapath the TAP is both.
    pub fn of(switch: &str, kernel: bool) -> Names {
        let short = switch.len() <= 12;
        let name = |suffix: &str| {
            if short {
                format!("{switch}-{suffix}")
            } else {
                let h = switch
                    .bytes()
                    .fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
                format!("s{suffix}{:012x}", h >> 16)
            }
        };
        let host = name("gw");
        let port = if kernel { name("gp") } else { host.clone() };
        Names { port, host, table: format!("sluice-gw-{switch}") }
    }
}

/// A running gateway.
pub struct Gateway {
    settings: GatewaySettings,
    names: Names,
    kernel: bool,
    /// The run directory's `SWITCH/gateway` (holds `dnsmasq.conf`).
    dir: PathBuf,
    /// dnsmasq, once started.
    dnsmasq: Mutex<Option<crate::child::Supervisor>>,
}

impl Gateway {
    /// Makes switch `s`'s gateway (its settings `g`) and attaches its port to `dp`; starts
    /// dnsmasq. What it made is removed again when a step fails.
    pub fn start(s: &Settings, g: &GatewaySettings, dp: &mut Datapath) -> Result<Gateway> {
        check_dnsmasq()?;
        let kernel = s.datapath == sluice_api::config::DatapathKind::Kernel;
        let names = Names::of(&s.name, kernel);
        let dir = sluice_sys::paths::run_dir().join(&s.name).join("gateway");
        let gw = Gateway { settings: g.clone(), names, kernel, dir, dnsmasq: Mutex::new(None) };
        if let Err(e) = gw.set_up(s, dp) {
            gw.tear_down(true);
            return Err(e);
        }
        Ok(gw)
    }

    fn set_up(&self, s: &Settings, dp: &mut Datapath) -> Result<()> {
        let n = &self.names;
        let spec = if self.kernel {
            PortSpec {
                kind: PortKind::Veth,
                netns: Some(HOST_NETNS.into()),
                ifname: Some(n.host.clone()),
                ..PortSpec::tap(&n.port)
            }
        } else {
            PortSpec::tap(&n.port)
        };
        let port = crate::control::create_port(&spec, s, None)
            .with_context(|| format!("making the gateway's port {:?} (host interface {:?})", n.port, n.host))?;
        dp.attach(spec, port).with_context(|| format!("attaching the gateway's port {:?}", n.port))?;
        let g = &self.settings;
        ip(&["addr", "replace", &format!("{}/{}", g.address, g.prefix), "dev", &n.host])?;
        if let Some((a, p)) = g.v6 {
            ip(&["-6", "addr", "replace", &format!("{a}/{p}"), "dev", &n.host, "nodad"])?;
        }
        ip(&["link", "set", "dev", &n.host, "up"])?;
        enable_forwarding()?;
        nft(&self.ruleset()).context("loading the gateway's nftables table")?;
        let conf = self.write_conf(&s.name)?;
        end_stale(&conf);
        let test = Command::new(DNSMASQ)
            .arg("--test")
            .arg(format!("--conf-file={}", conf.display()))
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("running {DNSMASQ} --test"))?;
        if !test.status.success() {
            sluice_sys::bail!(
                "dnsmasq refuses the configuration sluice wrote ({}): {}",
                conf.display(),
                String::from_utf8_lossy(&test.stderr).trim()
            );
        }
        let program = crate::child::Program {
            label: "dnsmasq",
            path: DNSMASQ.into(),
            args: dnsmasq_args(&conf),
            netns: None,
            switch: s.name.clone(),
            log_stdout: false,
            leftovers: Vec::new(),
        };
        let sup = crate::child::Supervisor::start(program).context("starting the gateway's supervisor thread")?;
        *self.dnsmasq.lock().unwrap_or_else(|p| p.into_inner()) = Some(sup);
        info!(switch = %s.name, address = %format!("{}/{}", g.address, g.prefix), interface = %n.host, port = %n.port, dhcp = %format!("{}-{}", g.range.0, g.range.1), nft_table = %n.table, "gateway up");
        Ok(())
    }

    /// The gateway's state, for `sluice status`.
    pub fn status(&self) -> GatewayStatus {
        let st = self
            .dnsmasq
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map_or_else(|| crate::child::Status { state: "stopped", ..Default::default() }, |d| d.status());
        let g = &self.settings;
        GatewayStatus {
            address: format!("{}/{}", g.address, g.prefix),
            address6: g.v6.map(|(a, p)| format!("{a}/{p}")),
            interface: self.names.host.clone(),
            port: self.names.port.clone(),
            dhcp_range: format!("{}-{}", g.range.0, g.range.1),
            dns: g.dns,
            uplink: g.uplink.clone(),
            nft_table: self.names.table.clone(),
            dnsmasq: st.state.into(),
            pid: st.pid,
            restarts: st.restarts,
            last_exit: st.last_exit.clone(),
        }
    }

    /// Stops dnsmasq (SIGTERM, then SIGKILL after [`crate::child::TERM_WITHIN`]). With `all` (the switch
    /// stops), also deletes the nftables table, the configuration and the pair the daemon
    /// made; without (a restart in place), those stay for the next image.
    pub fn stop(&self, all: bool) {
        self.tear_down(all);
    }

    fn tear_down(&self, all: bool) {
        if let Some(d) = self.dnsmasq.lock().unwrap_or_else(|p| p.into_inner()).take() {
            d.stop();
        }
        if !all {
            return;
        }
        let t = &self.names.table;
        if nft_table_exists(t) {
            match nft(&format!("delete table ip {t}\n")) {
                Ok(()) => info!(table = %t, "gateway's nftables table deleted"),
                Err(e) => {
                    warn!(table = %t, "cannot delete the gateway's nftables table: {e}; delete it with `nft delete table ip {t}`")
                }
            }
        }
        let _ = std::fs::remove_file(self.dir.join("dnsmasq.conf"));
        let _ = std::fs::remove_dir(&self.dir);
        if let Some(parent) = self.dir.parent() {
            let _ = std::fs::remove_dir(parent);
        }
        if self.kernel {
            match sluice_ports::veth::remove_made(&self.names.port) {
                Ok(_) => {}
                Err(e) => warn!(port = %self.names.port, "cannot remove the gateway's veth pair: {e}"),
            }
        }
    }

    /// The nftables table: the subnet masqueraded to anywhere but itself (multicast of
    /// 224.0.0.0/24 and the broadcast address excluded), out of the uplink if one is named;
    /// forwarding from the gateway's interface accepted from the subnet, and back to it for
    /// established connections only. Replaced whole in one transaction.
    fn ruleset(&self) -> String {
        let (t, host, g) = (&self.names.table, &self.names.host, &self.settings);
        let net = g.subnet();
        let out = g.uplink.as_ref().map(|u| format!(" oifname \"{u}\"")).unwrap_or_default();
        format!(
            "table ip {t}\n\
             delete table ip {t}\n\
             table ip {t} {{\n\
             \tchain postrouting {{\n\
             \t\ttype nat hook postrouting priority srcnat; policy accept;\n\
             \t\tip saddr {net} ip daddr 224.0.0.0/24 return\n\
             \t\tip saddr {net} ip daddr 255.255.255.255 return\n\
             \t\tip saddr {net} ip daddr != {net}{out} masquerade\n\
             \t}}\n\
             \tchain forward {{\n\
             \t\ttype filter hook forward priority filter; policy accept;\n\
             \t\tiifname \"{host}\" ip saddr {net} accept\n\
             \t\tiifname \"{host}\" reject\n\
             \t\toifname \"{host}\" ip daddr {net} ct state established,related accept\n\
             \t\toifname \"{host}\" reject\n\
             \t}}\n\
             }}\n"
        )
    }

    /// Writes `dnsmasq.conf` in the run directory's `SWITCH/gateway` (root's, 0755: nothing
    /// secret in it) and returns its path; the leases go to the state directory.
    fn write_conf(&self, switch: &str) -> Result<PathBuf> {
        let dir = sluice_sys::fs::Dir::open(&self.dir, Some(0o755))
            .map_err(|e| Failure::new("the gateway's directory in the run directory", e))?;
        if !dir.private() {
            sluice_sys::bail!(
                "{} can be changed by users other than root: the gateway's configuration is written only where they cannot (set SLUICE_RUN_DIR to a directory of root's)",
                self.dir.display()
            );
        }
        let state = sluice_sys::paths::state_dir();
        sluice_sys::fs::Dir::open(&state, Some(0o755)).map_err(|e| Failure::new("the state directory", e))?;
        let leases = state.join(format!("{switch}.leases"));
        let text = conf_text(&self.settings, &self.names.host, &leases);
        let name = std::ffi::OsStr::new("dnsmasq.conf");
        let mut f = dir.output(name, 0o644).map_err(|e| Failure::new("the gateway's dnsmasq.conf", e))?;
        f.write_all(text.as_bytes()).context("writing the gateway's dnsmasq.conf")?;
        Ok(self.dir.join(name))
    }
}

/// dnsmasq's configuration for gateway `g` on interface `host`, leases in `leases`.
pub fn conf_text(g: &GatewaySettings, host: &str, leases: &Path) -> String {
    let size = u32::from(g.range.1) - u32::from(g.range.0) + 1;
    let mask = std::net::Ipv4Addr::from(u32::MAX << (32 - u32::from(g.prefix)));
    let mut c = String::from("# Written by the sluice daemon for its gateway; rewritten at every start.\n");
    c += "strict-order\nexcept-interface=lo\nbind-dynamic\n";
    c += &format!("interface={host}\n");
    if g.dns {
        c += "domain-needed\n";
    } else {
        c += "port=0\n";
    }
    c += &format!("dhcp-range={},{},{mask},1h\n", g.range.0, g.range.1);
    c += &format!("dhcp-option=option:router,{}\n", g.address);
    c += "dhcp-no-override\n";
    c += &format!("dhcp-lease-max={size}\n");
    c += &format!("dhcp-leasefile={}\n", leases.display());
    if let Some((a, _)) = g.v6 {
        // Addresses by SLAAC; a router lifetime of 0: sluice does not route IPv6.
        let seg = a.segments();
        let prefix = std::net::Ipv6Addr::new(seg[0], seg[1], seg[2], seg[3], 0, 0, 0, 0);
        c += &format!("enable-ra\ndhcp-range={prefix},ra-only,64\nra-param={host},60,0\n");
    }
    c
}

fn dnsmasq_args(conf: &Path) -> Vec<String> {
    vec![
        "--keep-in-foreground".into(),
        format!("--conf-file={}", conf.display()),
        "--pid-file=".into(),
        format!("--user={DNSMASQ_USER}"),
        format!("--group={DNSMASQ_GROUP}"),
        "--log-facility=-".into(),
    ]
}

/// Refuses, saying what to install, when dnsmasq or its user is missing.
fn check_dnsmasq() -> Result<()> {
    if !Path::new(DNSMASQ).is_file() {
        sluice_sys::bail!(
            "the gateway needs dnsmasq ({DNSMASQ}), which is not installed: `apt-get install dnsmasq-base`, or remove `gateway` from the configuration"
        );
    }
    if sluice_sys::user::user_ids(DNSMASQ_USER).is_none() {
        sluice_sys::bail!(
            "the gateway runs dnsmasq as user {DNSMASQ_USER:?}, which this host does not have: `apt-get install dnsmasq-base` makes it"
        );
    }
    if sluice_sys::user::group_id(DNSMASQ_GROUP).is_none() {
        sluice_sys::bail!("the gateway runs dnsmasq in group {DNSMASQ_GROUP:?}, which this host does not have");
    }
    Ok(())
}

/// Sets `net.ipv4.ip_forward` (host-wide, as libvirt does), saying so when it changes it.
fn enable_forwarding() -> Result<()> {
    let p = "/proc/sys/net/ipv4/ip_forward";
    let now = std::fs::read_to_string(p).with_context(|| format!("reading {p}"))?;
    if now.trim() != "1" {
        std::fs::write(p, "1").with_context(|| format!("setting {p}"))?;
        info!(
            "net.ipv4.ip_forward set to 1 for the gateway (host-wide, as libvirt does; it stays set when the switch stops)"
        );
    }
    Ok(())
}

fn ip(args: &[&str]) -> Result<()> {
    run_tool("ip", args, None)
}

fn nft(script: &str) -> Result<()> {
    run_tool("nft", &["-f", "-"], Some(script))
}

fn nft_table_exists(t: &str) -> bool {
    Command::new("nft")
        .args(["list", "table", "ip", t])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn run_tool(tool: &str, args: &[&str], stdin: Option<&str>) -> Result<()> {
    let mut c = Command::new(tool)
        .args(args)
        .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("running `{tool}` (install it: the gateway needs iproute2 and nftables)"))?;
    if let (Some(text), Some(mut w)) = (stdin, c.stdin.take()) {
        w.write_all(text.as_bytes()).with_context(|| format!("writing to `{tool}`"))?;
    }
    let out = c.wait_with_output().with_context(|| format!("waiting for `{tool}`"))?;
    if !out.status.success() {
        sluice_sys::bail!("`{tool} {}` failed: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

/// Ends a dnsmasq an earlier run of this switch left (the daemon was killed: dnsmasq drops
/// to its user, and a change of credentials clears the parent-death signal): a process
/// whose program is [`DNSMASQ`] and whose command line names `conf`, the path of this
/// switch's configuration. SIGTERM, then SIGKILL after [`TERM_WITHIN`](crate::child::TERM_WITHIN).
fn end_stale(conf: &Path) {
    let want = format!("--conf-file={}", conf.display());
    let Ok(rd) = std::fs::read_dir("/proc") else { return };
    // (Asked again before the SIGKILL: in the seconds between, the pid may have ended
    // and been given to another process.)
    let ours = |pid: i32| {
        let exe = std::fs::read_link(format!("/proc/{pid}/exe"));
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        exe.is_ok_and(|x| x == Path::new(DNSMASQ)) && cmdline.split(|&b| b == 0).any(|a| a == want.as_bytes())
    };
    for e in rd.flatten().take(1 << 22) {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else { continue };
        if !ours(pid) {
            continue;
        }
        warn!(pid, "ending the dnsmasq an earlier run of this switch left");
        // SAFETY: kill with a pid and a plain signal number.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let until = Instant::now() + crate::child::TERM_WITHIN;
        while Path::new(&format!("/proc/{pid}")).exists() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(20));
        }
        if ours(pid) {
            // SAFETY: as above.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_fit_an_interface_and_the_conf_says_what_the_settings_say() {
        let n = Names::of("sw0", true);
        assert_eq!((n.host.as_str(), n.port.as_str(), n.table.as_str()), ("sw0-gw", "sw0-gp", "sluice-gw-sw0"));
        assert_eq!(Names::of("sw0", false).port, "sw0-gw");
        let long = Names::of("a-rather-long-switch-name", true);
        assert!(long.host.len() <= 15 && long.port.len() <= 15 && long.host != long.port, "{long:?}");
        let text = "name = \"sw0\"\ngateway = \"10.77.0.254/24\"\ngateway6 = \"fd77::fe/64\"\ngateway_dns = false\n";
        let s = sluice_api::config::parse(text, Path::new("sw.toml")).unwrap();
        let c = conf_text(s.gateway.as_ref().unwrap(), "sw0-gw", Path::new("/var/lib/sluice/sw0.leases"));
        for want in [
            "interface=sw0-gw\n",
            "port=0\n",
            "dhcp-range=10.77.0.1,10.77.0.253,255.255.255.0,1h\n",
            "dhcp-option=option:router,10.77.0.254\n",
            "dhcp-lease-max=253\n",
            "dhcp-leasefile=/var/lib/sluice/sw0.leases\n",
            "dhcp-range=fd77::,ra-only,64\n",
        ] {
            assert!(c.contains(want), "{want:?} in {c}");
        }
        assert!(!c.contains("dhcp-script"), "no root helper: {c}");
    }
}

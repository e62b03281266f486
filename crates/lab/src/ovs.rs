//! The `ovs` path: Open vSwitch's user-space (netdev) datapath with userspace TSO, two TAP
//! ports moved into the guests' namespaces.
//!
//! The study starts OVS daemons of its own — an ovsdb-server with a fresh database and an
//! ovs-vswitchd inside a private network namespace, both with a private run directory —
//! so a system OVS (and /etc/openvswitch) is never touched, and a kernel datapath of the
//! host's namespace is never seen. That directory is new (`mkdtemp`, 0700): the daemons run
//! as root with a database, sockets and pid files nobody else could have put there. `userspace-tso-enable` is written before ovs-vswitchd
//! starts, because OVS reads it once.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::error::Result;
use sluice_sys::bail;
use sluice_sys::error::Context;

/// The OVS tools the path needs, and the database schema.
const TOOLS: [&str; 5] = ["ovsdb-tool", "ovsdb-server", "ovs-vswitchd", "ovs-vsctl", "ovs-appctl"];
const SCHEMA: &str = "/usr/share/openvswitch/vswitch.ovsschema";

/// Why the path cannot run here, if it cannot.
pub fn unavailable() -> Option<String> {
    let missing: Vec<&str> = TOOLS.iter().copied().filter(|t| sluice_sys::which(t).is_none()).collect();
    if !missing.is_empty() {
        return Some(format!(
            "Open vSwitch is not installed (missing {}; apt-get install openvswitch-switch); the path is skipped",
            missing.join(", ")
        ));
    }
    if !Path::new(SCHEMA).exists() {
        return Some(format!("Open vSwitch's schema {SCHEMA} is missing; the path is skipped"));
    }
    None
}

/// OVS daemons of our own, stopped (and their directory removed) on drop.
pub struct Ovs {
    dir: PathBuf,
    /// Removes `dir` when dropped (after the daemons were stopped).
    _made: sluice_sys::fs::TempDir,
    /// ovs-vswitchd's pid: the switch CPU column.
    pub vswitchd_pid: Option<u32>,
}

impl Ovs {
    fn env(&self, cmd: &mut Command) {
        for k in ["OVS_RUNDIR", "OVS_LOGDIR", "OVS_DBDIR"] {
            cmd.env(k, &self.dir);
        }
    }

    fn run(&self, args: &[&str]) -> Result<String> {
        let mut cmd = Command::new(args[0]);
        cmd.args(&args[1..]).stdin(Stdio::null());
        self.env(&mut cmd);
        let out = cmd.output().with_context(|| format!("cannot run {}", args[0]))?;
        if !out.status.success() {
            bail!(
                "`{}` failed: {}{}{}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim(),
                String::from_utf8_lossy(&out.stdout).trim(),
                self.log_tail()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The last lines of ovs-vswitchd's log, for an error message (the directory goes
    /// away with the daemons).
    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.dir.join("ovs-vswitchd.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().rev().take(3).collect();
        if lines.is_empty() {
            String::new()
        } else {
            format!("; ovs-vswitchd's log ends: {}", lines.into_iter().rev().collect::<Vec<_>>().join(" | "))
        }
    }

    fn vsctl(&self, args: &[&str]) -> Result<String> {
        let db = format!("--db=unix:{}/db.sock", self.dir.display());
        let mut a = vec!["ovs-vsctl", db.as_str(), "--timeout=15"];
        a.extend_from_slice(args);
        self.run(&a)
    }

    /// Starts the daemons (ovs-vswitchd in namespace `ns`), makes a netdev bridge with
    /// TAP ports `taps` at `mtu`, and leaves the TAPs in `ns`.
    pub fn start(id: &str, ns: &str, taps: &[&str], mtu: u16) -> Result<Ovs> {
        let made = work_dir(id)?;
        let mut o = Ovs { dir: made.path().to_path_buf(), _made: made, vswitchd_pid: None };
        let d = o.dir.display().to_string();
        o.run(&["ovsdb-tool", "create", &format!("{d}/conf.db"), SCHEMA])?;
        o.run(&[
            "ovsdb-server",
            &format!("{d}/conf.db"),
            &format!("--remote=punix:{d}/db.sock"),
            &format!("--pidfile={d}/ovsdb-server.pid"),
            &format!("--unixctl={d}/ovsdb-server.ctl"),
            &format!("--log-file={d}/ovsdb-server.log"),
            "--detach",
            "--no-chdir",
        ])?;
        o.vsctl(&["--no-wait", "init"])?;
        o.vsctl(&["--no-wait", "set", "Open_vSwitch", ".", "other_config:userspace-tso-enable=true"])?;
        o.run(&[
            "ip",
            "netns",
            "exec",
            ns,
            "ovs-vswitchd",
            &format!("unix:{d}/db.sock"),
            &format!("--pidfile={d}/ovs-vswitchd.pid"),
            &format!("--unixctl={d}/ovs-vswitchd.ctl"),
            &format!("--log-file={d}/ovs-vswitchd.log"),
            "--detach",
            "--no-chdir",
        ])?;
        o.vswitchd_pid =
            std::fs::read_to_string(o.dir.join("ovs-vswitchd.pid")).ok().and_then(|p| p.trim().parse().ok());
        let mtu_req = format!("mtu_request={mtu}");
        let mut args: Vec<String> =
            ["add-br", "br0", "--", "set", "bridge", "br0", "datapath_type=netdev"].map(String::from).to_vec();
        for t in taps {
            args.extend(["--", "add-port", "br0", t, "--", "set", "interface", t, "type=tap"].map(String::from));
            args.push(mtu_req.clone());
        }
        o.vsctl(&args.iter().map(String::as_str).collect::<Vec<_>>())?;
        // The TAPs appear in the daemon's namespace once the bridge has them.
        let deadline = Instant::now() + Duration::from_secs(10);
        while !taps.iter().all(|t| crate::shell::link_exists(ns, t)) {
            if Instant::now() > deadline {
                bail!("Open vSwitch did not create its TAP ports within 10 s{}", o.log_tail());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(o)
    }
}

/// A new directory for the daemons of study `id`.
fn work_dir(id: &str) -> Result<sluice_sys::fs::TempDir> {
    Ok(sluice_sys::fs::TempDir::new(&format!("sluice-{id}-ovs")).context("making Open vSwitch's directory")?)
}

impl Drop for Ovs {
    fn drop(&mut self) {
        for d in ["ovs-vswitchd", "ovsdb-server"] {
            let ctl = self.dir.join(format!("{d}.ctl"));
            let _ = Command::new("ovs-appctl")
                .arg("-t")
                .arg(&ctl)
                .args(["--timeout=10", "exit"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
            if let Some(pid) = std::fs::read_to_string(self.dir.join(format!("{d}.pid")))
                .ok()
                .and_then(|p| p.trim().parse::<u32>().ok())
            {
                let deadline = Instant::now() + Duration::from_secs(3);
                while Path::new(&format!("/proc/{pid}")).exists() && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(50));
                }
                if Path::new(&format!("/proc/{pid}/cmdline")).exists()
                    && std::fs::read(format!("/proc/{pid}/cmdline"))
                        .is_ok_and(|c| String::from_utf8_lossy(&c).contains(d))
                {
                    let _ = sluice_sys::kill(pid, libc::SIGKILL);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_daemons_directory_is_new_and_never_one_planted_at_the_old_name() {
        use std::os::unix::fs::MetadataExt;
        // The name the study once used (its id is `sst` and the process id), taken first
        // by a link to somewhere else.
        let id = format!("sst{}", std::process::id());
        let old = std::env::temp_dir().join(format!("sluice-{id}-ovs"));
        let _ = std::fs::remove_file(&old);
        std::os::unix::fs::symlink("/etc", &old).unwrap();
        let d = super::work_dir(&id);
        let still = std::fs::read_link(&old).ok();
        let _ = std::fs::remove_file(&old);
        let d = d.unwrap();
        assert_ne!(d.path(), old.as_path());
        assert_eq!(still.as_deref(), Some(std::path::Path::new("/etc")), "the link was left alone");
        let m = std::fs::symlink_metadata(d.path()).unwrap();
        assert!(m.is_dir() && m.mode() & 0o777 == 0o700);
    }
}

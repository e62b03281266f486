//! The commands a topology is built with (`ip`, `bridge`, `ethtool`), run and checked.

use std::process::{Command, Stdio};

use crate::error::Result;
use sluice_sys::bail;
use sluice_sys::error::Context;

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

/// True if device `dev` exists in namespace `ns`.
pub fn link_exists(ns: &str, dev: &str) -> bool {
    Command::new("ip")
        .args(["-n", ns, "link", "show", dev])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

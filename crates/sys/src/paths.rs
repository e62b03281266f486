//! Where sluice keeps its runtime files: control sockets and lab state under /run/sluice
//! (`SLUICE_RUN_DIR` overrides it, for tests and unprivileged experiments; set but empty,
//! it counts as unset, so a stray `SLUICE_RUN_DIR=` never scatters state into the current
//! directory). Persistent state (the ports a switch was given at runtime, kept across
//! reboots) is under /var/lib/sluice: `SLUICE_STATE_DIR` overrides it, and with the run
//! directory overridden it defaults to `RUN_DIR/state`, so that a test or an experiment
//! that moved the run directory never writes /var/lib.

use std::path::PathBuf;

/// The runtime directory.
pub fn run_dir() -> PathBuf {
    std::env::var_os("SLUICE_RUN_DIR")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/run/sluice"))
}

/// Default control socket of switch `name`.
pub fn socket_for(name: &str) -> PathBuf {
    run_dir().join(format!("{name}.sock"))
}

/// Directory of lab state files.
pub fn labs_dir() -> PathBuf {
    run_dir().join("labs")
}

/// The persistent state directory.
pub fn state_dir() -> PathBuf {
    let set = |v: &str| std::env::var_os(v).filter(|d| !d.is_empty()).map(PathBuf::from);
    set("SLUICE_STATE_DIR")
        .or_else(|| set("SLUICE_RUN_DIR").map(|r| r.join("state")))
        .unwrap_or_else(|| PathBuf::from("/var/lib/sluice"))
}

/// The file in [`state_dir`] keeping what switch `name` was given at runtime.
pub fn ports_file(name: &str) -> PathBuf {
    state_dir().join(format!("{name}.ports.json"))
}

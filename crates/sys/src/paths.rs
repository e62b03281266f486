//! Where sluice keeps its runtime files: control sockets and lab state under /run/sluice
//! (`SLUICE_RUN_DIR` overrides it, for tests and unprivileged experiments; set but empty,
//! it counts as unset, so a stray `SLUICE_RUN_DIR=` never scatters state into the current
//! directory).

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

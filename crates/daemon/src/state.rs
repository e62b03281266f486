//! What was attached to a running switch beyond its configuration file (ports added with
//! `sluice port add`, static MAC entries with `sluice fib add`, grants changed with
//! `sluice grant`), kept in `RUN_DIR/NAME.state.json` (mode 0600) while the daemon runs, so
//! that after a restart in place or a crash the next daemon attaches them again — checked
//! as a `sluice port add` would be — and on the kernel datapath takes their forwarding over
//! without a pause. A clean stop removes the file.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use tracing::warn;

use sluice_api::config::PortSpec;

/// The runtime additions of one switch.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Runtime {
    /// Ports added at runtime, in order.
    pub ports: Vec<PortSpec>,
    /// Static MAC entries added at runtime: (VLAN, MAC, port).
    pub macs: Vec<(u16, String, String)>,
    /// The grants as changed at runtime, if they were.
    #[serde(default)]
    pub grants: Option<sluice_api::config::Grants>,
    /// The TAPs this switch made (from its file or at runtime), persistent: the next run
    /// adopts each one that still has the index recorded here.
    #[serde(default)]
    pub taps: Vec<TapRecord>,
}

/// A TAP the switch made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TapRecord {
    /// The port's (and the device's) name.
    pub name: String,
    /// The namespace it is in (`None`: the switch's).
    pub netns: Option<String>,
    /// Its index there.
    pub ifindex: u32,
}

impl Runtime {
    /// The index the TAP of port `spec` had, if this switch made it.
    pub fn known_tap(&self, spec: &PortSpec) -> Option<u32> {
        self.taps.iter().find(|t| t.name == spec.name && t.netns == spec.netns).map(|t| t.ifindex)
    }

    /// Records the TAP of port `spec` (replacing an older record of that name).
    pub fn record_tap(&mut self, spec: &PortSpec, ifindex: Option<u32>) {
        self.taps.retain(|t| t.name != spec.name);
        if let Some(ifindex) = ifindex {
            self.taps.push(TapRecord { name: spec.name.clone(), netns: spec.netns.clone(), ifindex });
        }
    }
}

/// The state file of switch `name`.
pub fn path(name: &str) -> PathBuf {
    sluice_sys::paths::run_dir().join(format!("{name}.state.json"))
}

impl Runtime {
    /// What an earlier run of switch `name` left (nothing if it stopped cleanly).
    pub fn load(name: &str) -> Runtime {
        use std::io::Read;
        use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
        let p = path(name);
        // Only a regular file of this user's, not through a link.
        let opened =
            std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK).open(&p).and_then(
                |f| {
                    let m = f.metadata()?;
                    let me = sluice_sys::user::euid();
                    if !m.is_file() || m.uid() != me || m.mode() & 0o022 != 0 {
                        return Err(std::io::Error::other("not a regular file of this user's, writable by it alone"));
                    }
                    let mut b = Vec::new();
                    f.take(16 << 20).read_to_end(&mut b)?;
                    Ok(b)
                },
            );
        match opened {
            Ok(b) => serde_json::from_slice(&b).unwrap_or_else(|e| {
                warn!(file = %p.display(), "ignoring an unreadable state file ({e})");
                Runtime::default()
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Runtime::default(),
            Err(e) => {
                warn!(file = %p.display(), "ignoring the state file ({e})");
                Runtime::default()
            }
        }
    }

    /// Writes the file (atomically, owner-only).
    pub fn save(&self, name: &str) {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let p = path(name);
        let tmp = p.with_extension("json.tmp");
        let written = (|| -> std::io::Result<()> {
            // A fresh file, never one planted at the temporary name (nor through a link).
            let _ = std::fs::remove_file(&tmp);
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .custom_flags(libc::O_NOFOLLOW)
                .mode(0o600)
                .open(&tmp)?;
            f.write_all(&serde_json::to_vec_pretty(self).map_err(std::io::Error::other)?)?;
            std::fs::rename(&tmp, &p)
        })();
        if let Err(e) = written {
            warn!(file = %p.display(), "cannot keep the switch's runtime state ({e}); a restart will not attach the ports added since start");
        }
    }

    /// Removes switch `name`'s file (a clean stop).
    pub fn remove(name: &str) {
        let _ = std::fs::remove_file(path(name));
    }
}

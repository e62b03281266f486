//! What was attached to a running switch beyond its configuration file (ports added with
//! `sluice port add`, static MAC entries with `sluice fib add`, grants changed with
//! `sluice grant`), and the TAPs the switch made, so that the next daemon of the switch
//! attaches them again — checked as a `sluice port add` would be.
//!
//! Two files, by how long what they hold means something:
//! - `STATE_DIR/NAME.ports.json` (/var/lib/sluice, see `sluice_sys::paths::state_dir`):
//!   the runtime additions. They survive a clean stop and a reboot: every start attaches
//!   them again. The directory is made 0700 and must be this user's alone; the file is
//!   0600, written to a temporary name in that directory and renamed over the old one.
//! - `RUN_DIR/NAME.state.json` (tmpfs): the TAPs' indexes, which only mean something
//!   within one boot, for a restart in place or after a crash to adopt the same devices.
//!   A clean stop (which deletes the TAPs) removes it.
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
    /// The security groups as changed at runtime, if they were: they replace the file's at
    /// the next start.
    #[serde(default)]
    pub acl: Option<AclState>,
}

/// Every port's security-group rules (in match order) and defaults other than `allow`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AclState {
    /// (port, rule).
    pub rules: Vec<(String, sluice_switch::acl::AclRuleSpec)>,
    /// (port, direction, action).
    pub defaults: Vec<(String, sluice_switch::acl::Dir, sluice_switch::acl::AclAction)>,
}

impl AclState {
    /// Switch `sw`'s security groups now.
    pub fn of(sw: &sluice_switch::Switch) -> AclState {
        use sluice_switch::acl::{AclAction, Dir};
        let rules = sw.acl_list(None).into_iter().map(|l| (l.port, l.rule.spec())).collect();
        let mut defaults = Vec::new();
        for p in sw.acl_ports() {
            for d in [Dir::In, Dir::Out] {
                if sw.acl_default_of(&p, d) != AclAction::Allow {
                    defaults.push((p.clone(), d, sw.acl_default_of(&p, d)));
                }
            }
        }
        AclState { rules, defaults }
    }
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

/// The run directory's state file of switch `name` (its TAPs).
pub fn path(name: &str) -> PathBuf {
    sluice_sys::paths::run_dir().join(format!("{name}.state.json"))
}

/// Opens the persistent state directory, made 0700 where missing; refused unless only
/// this user can write it and nobody else could swap a name on the way to it (a wider
/// mode of a directory of this user's is narrowed to 0700).
fn state_dir() -> std::io::Result<sluice_sys::fs::Dir> {
    let at = sluice_sys::paths::state_dir();
    let d = sluice_sys::fs::Dir::open(&at, Some(0o700)).map_err(std::io::Error::other)?;
    let (uid, mode) = d.owner_mode();
    if !d.private() || uid != sluice_sys::user::euid() {
        return Err(std::io::Error::other(format!(
            "{} is not a directory of this user's alone; make it one (mode 0700) or set SLUICE_STATE_DIR",
            at.display()
        )));
    }
    if mode & 0o077 != 0 {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&at, std::fs::Permissions::from_mode(0o700))?;
    }
    Ok(d)
}

/// Reads `p`: a regular file of this user's, writable by it alone, never through a link;
/// `Ok(None)` when there is none.
fn read_checked(p: &std::path::Path) -> std::io::Result<Option<Vec<u8>>> {
    use std::io::Read;
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let opened =
        std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK).open(p).and_then(
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
        Ok(b) => Ok(Some(b)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// The runtime additions as the persistent file holds them.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Additions {
    #[serde(default)]
    ports: Vec<PortSpec>,
    #[serde(default)]
    macs: Vec<(u16, String, String)>,
    #[serde(default)]
    grants: Option<sluice_api::config::Grants>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    acl: Option<AclState>,
}

/// The run directory's file: the TAPs (and, as an earlier version wrote it, everything).
#[derive(Debug, Default, Serialize, Deserialize)]
struct Boot {
    #[serde(default)]
    taps: Vec<TapRecord>,
    #[serde(default, skip_serializing)]
    ports: Vec<PortSpec>,
    #[serde(default, skip_serializing)]
    macs: Vec<(u16, String, String)>,
    #[serde(default, skip_serializing)]
    grants: Option<sluice_api::config::Grants>,
}

impl Runtime {
    /// What earlier runs of switch `name` left: the runtime additions (kept across stops
    /// and reboots) and this boot's TAPs. An unreadable file is warned about and counts as
    /// empty.
    pub fn load(name: &str) -> Runtime {
        fn parse<T: Default + for<'a> Deserialize<'a>>(
            p: &std::path::Path,
            read: std::io::Result<Option<Vec<u8>>>,
        ) -> Option<T> {
            match read {
                Ok(Some(b)) => Some(serde_json::from_slice(&b).unwrap_or_else(|e| {
                    warn!(file = %p.display(), "ignoring an unreadable state file ({e})");
                    T::default()
                })),
                Ok(None) => None,
                Err(e) => {
                    warn!(file = %p.display(), "ignoring the state file ({e})");
                    Some(T::default())
                }
            }
        }
        let p = path(name);
        let boot: Boot = parse(&p, read_checked(&p)).unwrap_or_default();
        let kept = sluice_sys::paths::ports_file(name);
        let read = state_dir().and_then(|_| read_checked(&kept));
        let additions = match parse::<Additions>(&kept, read) {
            Some(a) => a,
            // (A daemon of an earlier version kept everything in the run directory.)
            None => Additions { ports: boot.ports, macs: boot.macs, grants: boot.grants, acl: None },
        };
        Runtime {
            ports: additions.ports,
            macs: additions.macs,
            grants: additions.grants,
            taps: boot.taps,
            acl: additions.acl,
        }
    }

    /// Writes both files (atomically, owner-only); a failure is warned about.
    pub fn save(&self, name: &str) {
        let kept = sluice_sys::paths::ports_file(name);
        let additions = Additions {
            ports: self.ports.clone(),
            macs: self.macs.clone(),
            grants: self.grants.clone(),
            acl: self.acl.clone(),
        };
        if let Err(e) = save_additions(name, &additions) {
            warn!(file = %kept.display(), "cannot keep the ports added at runtime ({e}); the next start will not attach them again");
        }
        let p = path(name);
        let boot = Boot { taps: self.taps.clone(), ..Boot::default() };
        if let Err(e) = save_boot(&p, &boot) {
            warn!(file = %p.display(), "cannot keep the switch's TAPs ({e}); a restart will make them anew");
        }
    }

    /// Removes switch `name`'s run directory file (a clean stop: its TAPs are gone). The
    /// runtime additions stay, for the next start.
    pub fn remove(name: &str) {
        let _ = std::fs::remove_file(path(name));
    }
}

/// Writes the persistent file: a temporary name in the checked directory, then renamed.
/// With nothing to keep there is no file (and no directory is made for it), so that the
/// many short-lived switches of labs and studies leave nothing behind.
fn save_additions(name: &str, a: &Additions) -> std::io::Result<()> {
    use std::io::Write;
    if a.ports.is_empty() && a.macs.is_empty() && a.grants.is_none() && a.acl.is_none() {
        return match std::fs::remove_file(sluice_sys::paths::ports_file(name)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        };
    }
    let dir = state_dir()?;
    let (tmp, file) = (format!("{name}.ports.json.tmp"), format!("{name}.ports.json"));
    let mut f = dir.output(tmp.as_ref(), 0o600).map_err(std::io::Error::other)?;
    f.write_all(&serde_json::to_vec_pretty(a).map_err(std::io::Error::other)?)?;
    f.sync_all()?;
    dir.rename(tmp.as_ref(), file.as_ref()).map_err(std::io::Error::other)
}

/// Writes the run directory's file (atomically, owner-only).
fn save_boot(p: &std::path::Path, b: &Boot) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = p.with_extension("json.tmp");
    // A fresh file, never one planted at the temporary name (nor through a link).
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(&serde_json::to_vec_pretty(b).map_err(std::io::Error::other)?)?;
    std::fs::rename(&tmp, p)
}

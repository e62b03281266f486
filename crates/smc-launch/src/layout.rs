//! Where the fast path lives and who may use it: `sluice smc setup`, the checks the
//! launcher makes before it loads the library into a program, and the library file itself
//! (docs/architecture.md, "The fast path's trust boundary").
//!
//! `RUN_DIR/smc/` and `smc/lib/` are the owner's alone (0755: root, or the user of a
//! private `SLUICE_RUN_DIR`); the shared directories are 3770 with the fast path's group,
//! or 0755 without one. The library a program preloads is used only from a file nobody
//! else can write, whose bytes are this binary's own.

use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use sluice_smc::access::{self, Cred, Policy, Unsafe};

use crate::error::{Error, Result};
use sluice_sys::error::{Context, Failure, Report};
use sluice_sys::{bail, paths, user};

/// The preload library, built by `build.rs`.
static LIBRARY: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/libsluice_smc.so"));

/// `RUN_DIR/smc`.
pub fn smc_dir() -> PathBuf {
    paths::run_dir().join("smc")
}

/// Opens an entry of a shared directory as a regular file without waiting on it and
/// without following it: a FIFO, device, socket or symlink that another user planted is
/// refused at once (`O_NONBLOCK`: opening a FIFO does not wait for a writer). When `owner`
/// is given, the file must be that user's.
pub fn open_entry(path: &Path, write: bool, owner: Option<u32>) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .read(!write)
        .write(write)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)?;
    let m = f.metadata()?;
    if !m.is_file() {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "not a regular file"));
    }
    if owner.is_some_and(|uid| m.uid() != uid) {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, format!("not a file of uid {}'s", m.uid())));
    }
    Ok(f)
}

/// This process's user, primary group and supplementary groups.
pub fn my_cred() -> Cred {
    Cred { uid: user::euid(), gid: user::egid(), groups: user::groups() }
}

/// The id of group `name`, if the host has it.
pub fn group_id(name: &str) -> Option<u32> {
    user::group_id(name)
}

/// The name of group `gid`, if the host has it.
pub fn group_name(gid: u32) -> Option<String> {
    user::group_name(gid)
}

/// The user's name, for messages.
pub fn user_name(uid: u32) -> String {
    match user::user_name(uid) {
        Some(name) => format!("{name} (uid {uid})"),
        None => format!("uid {uid}"),
    }
}

/// What the layout says now.
pub enum State {
    /// Not set up (no door directory).
    Missing,
    /// Set up, but not to be trusted by this user.
    Unsafe(Unsafe),
    /// Set up: who may use it.
    Ready(Policy),
}

/// Reads the policy back from the door directory, as the library does.
pub fn state() -> State {
    let door = smc_dir().join("door");
    let Ok(m) = std::fs::metadata(&door) else { return State::Missing };
    let me = user::euid();
    for d in [smc_dir(), smc_dir().join("lib")] {
        if let Ok(m) = std::fs::symlink_metadata(&d)
            && let Err(e) = Policy::check_private_dir(m.uid(), m.mode(), me)
        {
            return State::Unsafe(e);
        }
    }
    match Policy::from_dir(m.uid(), m.gid(), m.mode(), me) {
        Ok(p) => State::Ready(p),
        Err(e) => State::Unsafe(e),
    }
}

/// Who may use the fast path, in words ("root and members of group sluice").
pub fn describe(p: &Policy) -> String {
    p.describe(p.group.and_then(group_name).as_deref())
}

/// Creates (or repairs) the layout under the runtime directory, open to root and to
/// `group`'s members (root only when `None`). Root's job, or a private runtime
/// directory's owner's.
pub fn setup(group: Option<u32>) -> Result<Policy> {
    let (me, my_gid) = (user::euid(), user::egid());
    let run = paths::run_dir();
    if me != 0 {
        let owner = std::fs::metadata(&run).map(|m| m.uid()).ok();
        if owner != Some(me) {
            return Err(Error::NeedsRoot { run });
        }
    }
    let mk = |dir: &Path, mode: u32, gid: u32| -> Result<()> {
        match std::fs::symlink_metadata(dir) {
            Ok(m) if m.is_dir() => {}
            found => {
                if found.is_ok() {
                    // An older sluice kept statistics in a file named like a directory now.
                    std::fs::remove_file(dir).with_context(|| format!("removing {}", dir.display()))?;
                }
                std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
            }
        }
        std::os::unix::fs::chown(dir, Some(me), Some(gid))
            .with_context(|| format!("giving {} to uid {me}, gid {gid}", dir.display()))?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode))
            .with_context(|| format!("setting the mode of {}", dir.display()))?;
        Ok(())
    };
    let base_gid = if me == 0 { 0 } else { my_gid };
    mk(&smc_dir(), access::ROOT_DIR_MODE, base_gid)?;
    mk(&smc_dir().join("lib"), access::ROOT_DIR_MODE, base_gid)?;
    for d in access::SHARED_DIRS {
        match group {
            Some(g) => mk(&smc_dir().join(d), access::GROUP_DIR_MODE, g)?,
            None => mk(&smc_dir().join(d), access::ROOT_DIR_MODE, base_gid)?,
        }
    }
    match state() {
        State::Ready(p) => Ok(p),
        State::Unsafe(e) => bail!("{} is still not safe after setting it up: {e}", smc_dir().display()),
        State::Missing => bail!("{} was not created", smc_dir().join("door").display()),
    }
}

/// What `sluice smc run` does with a program: load the library, or run it on plain TCP
/// and say why once.
pub enum Verdict {
    /// Load the library (this file).
    Load(PathBuf),
    /// Plain TCP, with this message.
    Plain(String),
}

/// True when every directory of the layout is there (a runtime directory an older sluice
/// made lacks some, and kept its statistics in a file named like one of them).
fn complete() -> bool {
    std::iter::once("lib")
        .chain(access::SHARED_DIRS)
        .all(|d| std::fs::symlink_metadata(smc_dir().join(d)).is_ok_and(|m| m.is_dir()))
}

/// Decides for the calling user and program `program`. Root sets the layout up when it
/// is missing (with the default group) or incomplete (keeping its group).
pub fn verdict(program: &str) -> Result<Verdict> {
    let me = my_cred();
    if me.uid == 0 {
        match state() {
            State::Missing => {
                setup(group_id(access::DEFAULT_GROUP))?;
            }
            State::Ready(p) if !complete() => {
                setup(p.group)?;
            }
            _ => {}
        }
    }
    let dir = smc_dir();
    let plain = |why: String| Ok(Verdict::Plain(format!("sluice: {why}; {program} runs on plain TCP")));
    match state() {
        State::Missing => plain(format!(
            "the shared-memory fast path is not set up on this host ({} is missing): as root, run `sluice smc setup`",
            dir.join("door").display()
        )),
        State::Unsafe(e) => {
            plain(format!("{} cannot be trusted ({e}): as root, run `sluice smc setup` to repair it", dir.display()))
        }
        State::Ready(p) if !p.allows(&me) => {
            let how = match p.group.and_then(group_name) {
                Some(g) => format!("an administrator can add the user: `usermod -aG {g} USER`, then log in again"),
                None => format!(
                    "an administrator can open it to a group: `groupadd --system {0}; usermod -aG {0} USER; sluice smc setup`",
                    access::DEFAULT_GROUP
                ),
            };
            plain(format!(
                "the shared-memory fast path is open to {}, not to {} ({how})",
                describe(&p),
                user_name(me.uid)
            ))
        }
        // No library file to be had (a full /run, say): the program still runs.
        State::Ready(_) => match install_library(me.uid) {
            Ok(lib) => Ok(Verdict::Load(lib)),
            Err(e) => plain(format!("cannot install the preload library ({})", Report(&e))),
        },
    }
}

/// A library file that is safe to preload: a regular file owned by root or `uid`, in a
/// directory only they can write, that nobody else can write either, holding exactly the
/// library this binary carries.
fn trusted(path: &Path, uid: u32) -> bool {
    let ok_owner = |m: &std::fs::Metadata| (m.uid() == 0 || m.uid() == uid) && m.mode() & 0o022 == 0;
    let dir_ok =
        path.parent().and_then(|d| std::fs::symlink_metadata(d).ok()).is_some_and(|m| m.is_dir() && ok_owner(&m));
    let file_ok =
        std::fs::symlink_metadata(path).is_ok_and(|m| m.is_file() && ok_owner(&m) && m.len() == LIBRARY.len() as u64);
    dir_ok && file_ok && std::fs::read(path).is_ok_and(|b| b == LIBRARY)
}

/// The library for user `uid`'s program: the shared copy in `smc/lib/` when it can be
/// trusted (root writes it), else a private copy in a directory of the user's own.
pub fn install_library(uid: u32) -> Result<PathBuf> {
    let name = format!("libsluice_smc-{:016x}.so", fnv1a(LIBRARY));
    let shared = smc_dir().join("lib").join(&name);
    if trusted(&shared, uid) {
        return Ok(shared);
    }
    let dir = if uid == 0 {
        smc_dir().join("lib")
    } else {
        let base = std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from).filter(|d| {
            std::fs::symlink_metadata(d).is_ok_and(|m| m.is_dir() && m.uid() == uid && m.mode() & 0o077 == 0)
        });
        let dir = match base {
            Some(b) => b.join("sluice"),
            None => std::env::temp_dir().join(format!("sluice-smc-{uid}")),
        };
        private_dir(&dir, uid)?;
        dir
    };
    let path = dir.join(&name);
    let tmp = dir.join(format!(".lib-{}.tmp", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let written = (|| {
        let mut f = std::fs::OpenOptions::new().write(true).create_new(true).open(&tmp)?;
        f.write_all(LIBRARY)?;
        f.sync_all()?;
        drop(f);
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o644))?;
        std::fs::rename(&tmp, &path)
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(Failure::new(format!("writing {}", path.display()), e).into());
    }
    if !trusted(&path, uid) {
        return Err(Error::NotSafe(path));
    }
    Ok(path)
}

/// Makes `dir` a directory of `uid`'s alone (0700), refusing one that someone else made.
fn private_dir(dir: &Path, uid: u32) -> Result<()> {
    match std::fs::symlink_metadata(dir) {
        Ok(m) if m.is_dir() && m.uid() == uid => {}
        Ok(_) => return Err(Error::NotYours(dir.into())),
        Err(_) => std::fs::create_dir(dir).with_context(|| format!("creating {}", dir.display()))?,
    }
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .with_context(|| format!("setting the mode of {}", dir.display()))?;
    Ok(())
}

/// 64-bit FNV-1a: a content name that stays the same across Rust versions.
fn fnv1a(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &x| (h ^ u64::from(x)).wrapping_mul(0x0000_0100_0000_01b3))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_names_are_stable_and_group_lookups_answer() {
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_ne!(fnv1a(b"a"), fnv1a(b"b"));
        assert_eq!(group_id("root"), Some(0));
        assert_eq!(group_name(0).as_deref(), Some("root"));
        assert_eq!(group_id("no-such-group-here"), None);
    }
}

//! A server-mode port's socket file: bound mode 0600 (or 0660 with the group of the
//! peers allowed, [`crate::Allow::socket_group`]) from its first moment, a stale socket
//! nobody answers on replaced, and removed when the port goes.

use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::Mutex;

use tracing::warn;

/// Binds the socket: a stale socket nobody answers on is replaced, anything else is
/// refused with what to do.
pub(crate) fn bind(path: &Path, group: Option<u32>) -> io::Result<UnixListener> {
    let what = |e: io::Error, hint: &str| io::Error::new(e.kind(), format!("{}: {e}{hint}", path.display()));
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => {
            if UnixStream::connect(path).is_ok() {
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!(
                        "{} is in use: another program (or port) answers on it; choose another --socket",
                        path.display()
                    ),
                ));
            }
            // Removed only if it is still the socket looked at: whatever took its place
            // meanwhile stays, and the bind below fails on it.
            if std::fs::symlink_metadata(path).is_ok_and(|n| (n.dev(), n.ino()) == (m.dev(), m.ino())) {
                std::fs::remove_file(path).map_err(|e| what(e, ""))?;
            }
        }
        Ok(_) => {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{} exists and is not a socket; choose another --socket or remove it", path.display()),
            ));
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(what(e, "")),
    }
    bind_for(path, group).map_err(|e| {
        let hint = match e.kind() {
            io::ErrorKind::NotFound => " (does its directory exist?)",
            io::ErrorKind::AddrInUse => " (something took its place while the stale socket was removed)",
            _ => "",
        };
        what(e, hint)
    })
}

/// Binds `path` so that the socket has its final owner, group and mode from the moment it
/// exists: with the file-creation mask 0177 (mode 0600: only root and the switch's own user
/// may connect; the kernel checks write permission on connect) or, given `group`, 0117
/// with this thread's file-system group id set to `group` for the bind (mode 0660, group
/// `group`: its members may connect too). The peer's credentials are checked again after.
/// Nothing is changed by path afterwards (a chmod or chown by path would follow whatever
/// replaced the socket).
fn bind_for(path: &Path, group: Option<u32>) -> io::Result<UnixListener> {
    // The mask is the process's: binds here take turns, so one never restores another's.
    static TURN: Mutex<()> = Mutex::new(());
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    // The file-system group id is this thread's alone (setfsgid); only root may take any.
    let before = crate::sys::fsgid();
    let group = group.filter(|&g| {
        crate::sys::set_fsgid(g);
        if crate::sys::fsgid() == g {
            return true;
        }
        warn!(
            "{}: the switch may not create files of group {g} (it is not root): the socket is mode 0600, \
             and only root and the switch's user can connect",
            path.display()
        );
        false
    });
    let old = crate::sys::umask(if group.is_some() { 0o117 } else { 0o177 });
    let l = UnixListener::bind(path);
    crate::sys::umask(old);
    crate::sys::set_fsgid(before);
    if let Some(g) = group
        && let Ok(m) = std::fs::symlink_metadata(path)
        && l.is_ok()
        && m.gid() != g
    {
        warn!(
            "{}: the socket has group {} rather than {g} (its directory is set-group-ID): \
             the allowed group's members may not be able to connect",
            path.display(),
            m.gid()
        );
    }
    l
}

/// Removes the port's socket when the port goes, if it is still a socket.
pub(crate) fn remove(path: &Path) {
    if std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket()) {
        let _ = std::fs::remove_file(path);
    }
}

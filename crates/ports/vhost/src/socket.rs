//! A server-mode port's socket file: bound mode 0600 from its first moment, a stale socket
//! nobody answers on replaced, and removed when the port goes.

use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::Mutex;

/// Binds the socket: a stale socket nobody answers on is replaced, anything else is
/// refused with what to do.
pub(crate) fn bind(path: &Path) -> io::Result<UnixListener> {
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
    bind_owner_only(path).map_err(|e| {
        let hint = match e.kind() {
            io::ErrorKind::NotFound => " (does its directory exist?)",
            io::ErrorKind::AddrInUse => " (something took its place while the stale socket was removed)",
            _ => "",
        };
        what(e, hint)
    })
}

/// Binds `path` with the file-creation mask 0177, so the socket is mode 0600 from the
/// moment it exists: only root and the switch's own user may connect (the kernel checks
/// write permission on connect; the peer's credentials are checked again after). Nothing
/// is changed by path afterwards (a chmod by path would follow whatever link replaced the
/// socket).
fn bind_owner_only(path: &Path) -> io::Result<UnixListener> {
    // The mask is the process's: binds here take turns, so one never restores another's.
    static TURN: Mutex<()> = Mutex::new(());
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    let old = crate::sys::umask(0o177);
    let l = UnixListener::bind(path);
    crate::sys::umask(old);
    l
}

/// Removes the port's socket when the port goes, if it is still a socket.
pub(crate) fn remove(path: &Path) {
    if std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket()) {
        let _ = std::fs::remove_file(path);
    }
}

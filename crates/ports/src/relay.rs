//! `sluice port relay`: a TAP in a guest's namespace on one side, a unix stream socket in
//! the framing of a stream port on the other. The switch attaches the socket as a stream
//! port, so the guest's frames pass through a program the user (or a test) can stop: a
//! stopped relay is a receiver that stops draining, which a lossless switch holds frames
//! back for and its pause watchdog notices. Behind the relay the guest is still on a TAP,
//! whose kernel side drops when the relay does not read.
//!
//! The listening socket is made as the daemon makes its control socket: its directory
//! walked and checked (`sys::fs::Dir`), what is at the path removed only when it is a
//! socket nobody answers on (never a link, a file, or a live socket), bound under umask
//! 0177 so that it is never open to others, and removed afterwards only while it is still
//! the one this relay bound.

use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::time::{Duration, Instant};

use sluice_switch::{Port, PortError, TxOutcome};
use sluice_sys::error::{Context, Failure};
use sluice_wire::VNET_HDR_LEN;

use super::stream::{MAX_FRAME, StreamPort, out_frame};
use super::tap::TapPort;
use crate::{Error, Result};
use sluice_sys::netns;
use sluice_sys::proc::{Interest, wait_any};

/// How long the relay waits for the switch to connect.
const ACCEPT_WAIT: Duration = Duration::from_secs(30);

/// A socket this relay bound: its listener and which file it is (device, inode).
struct Listening {
    listener: UnixListener,
    file: (u64, u64),
}

/// Listens on `path` (mode 0600): the directory checked, a socket an earlier relay left
/// there removed, anything else refused with what to do.
fn listen(path: &Path) -> Result<Listening> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    sluice_sys::fs::Dir::open(dir, None).with_context(|| format!("the directory of {}", path.display()))?;
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(Error::NotASocket { path: path.into(), what: sluice_sys::fs::kind_of(meta.mode()) });
        }
        if UnixStream::connect(path).is_ok() {
            return Err(Error::Answering { path: path.into() });
        }
        std::fs::remove_file(path)
            .with_context(|| format!("removing the socket an earlier relay left at {}", path.display()))?;
    }
    // The file-creation mask is the process's: no other thread of the relay creates
    // files meanwhile.
    let listener = sluice_sys::proc::with_umask(0o177, || UnixListener::bind(path));
    let listener = listener.with_context(|| format!("listening on {}", path.display()))?;
    let meta = std::fs::symlink_metadata(path).with_context(|| format!("checking {}", path.display()))?;
    Ok(Listening { listener, file: (meta.dev(), meta.ino()) })
}

/// Removes the socket at `path` if it is still the one `file` names (nobody put another
/// file in its place).
fn unlink_own(path: &Path, file: (u64, u64)) {
    let ours = std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket() && (m.dev(), m.ino()) == file);
    if ours {
        let _ = std::fs::remove_file(path);
    }
}

/// Runs the relay until the switch closes its end (or the TAP goes): creates TAP `tap` in
/// namespace `ns` (the current one when `None`), listens on `path` (mode 0600), takes one
/// connection, and moves frames both ways.
pub fn run(tap: &str, ns: Option<&str>, path: &Path, mtu: u16) -> Result<()> {
    let name = tap.to_string();
    let mut t = netns::run_in(ns, move || TapPort::open(&name, false, mtu, None))
        .with_context(|| format!("creating TAP {tap:?}"))?;
    let Listening { listener, file } = listen(path)?;
    listener.set_nonblocking(true)?;
    let deadline = Instant::now() + ACCEPT_WAIT;
    let sock = loop {
        match listener.accept() {
            Ok((s, _)) => break s,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    unlink_own(path, file);
                    return Err(Error::NoSwitch { path: path.into(), secs: ACCEPT_WAIT.as_secs() });
                }
                let want = Interest { fd: listener.as_raw_fd(), read: true, write: false };
                let _ = wait_any(&[want], 100);
            }
            Err(e) => {
                unlink_own(path, file);
                return Err(Failure::new("accepting the switch's connection", e).into());
            }
        }
    };
    drop(listener);
    unlink_own(path, file);
    let mut link = StreamPort::from_stream(sock)?;
    // A frame from the TAP the socket had no room for yet, and one from the switch.
    let mut up = vec![0u8; VNET_HDR_LEN + MAX_FRAME];
    let mut waiting: Option<usize> = None;
    let mut down = vec![0u8; VNET_HDR_LEN + MAX_FRAME];
    loop {
        let mut moved = false;
        // The rest of a frame the socket took part of goes first.
        let flushed = match link.flush() {
            Ok(f) => f,
            Err(e) => return end(e),
        };
        // The TAP is read only when nothing waits for the socket, so a stopped switch side
        // stops this side's reading.
        if waiting.is_none() && flushed {
            waiting = t.recv(&mut up).map_err(|e| sluice_sys::failure!("reading TAP {tap:?}: {e}"))?;
        }
        if let Some(n) = waiting {
            match link.send(&out_frame(&up[VNET_HDR_LEN..VNET_HDR_LEN + n])) {
                Ok(TxOutcome::Sent) => {
                    waiting = None;
                    moved = true;
                }
                Ok(TxOutcome::Full) => {}
                Err(e) => return end(e),
            }
        }
        loop {
            match link.recv(&mut down) {
                Ok(Some(n)) => {
                    // A TAP takes every frame (the kernel drops what the guest cannot).
                    let _ = t.send(&out_frame(&down[VNET_HDR_LEN..VNET_HDR_LEN + n]));
                    moved = true;
                }
                Ok(None) => break,
                Err(e) => return end(e),
            }
        }
        if !moved {
            // Sleep until the socket has bytes (or room, when a frame waits) or the TAP has
            // a frame (when none waits).
            let socket = Interest { fd: link.raw_fd(), read: true, write: waiting.is_some() || !flushed };
            let tap = Interest { fd: t.raw_fd(), read: waiting.is_none() && flushed, write: false };
            let _ = wait_any(&[socket, tap], 1000);
        }
    }
}

/// The switch's end went (a normal end for the relay), or the stream broke.
fn end(e: PortError) -> Result<()> {
    match e {
        PortError::Gone(e)
            if matches!(
                e.kind(),
                io::ErrorKind::UnexpectedEof | io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset
            ) =>
        {
            Ok(())
        }
        e => Err(sluice_sys::failure!("the connection to the switch: {e}").into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn dir() -> sluice_sys::fs::TempDir {
        sluice_sys::fs::TempDir::new("sluice-relay").unwrap()
    }

    #[test]
    fn only_a_socket_nobody_answers_on_is_replaced() {
        let d = dir();
        let at = d.path().join("r.sock");
        // A stale socket (its relay gone) is replaced by this relay's, reachable by its
        // owner only from the moment it exists.
        drop(UnixListener::bind(&at).unwrap());
        let l = listen(&at).unwrap();
        let m = std::fs::symlink_metadata(&at).unwrap();
        assert!(m.file_type().is_socket());
        assert_eq!(m.permissions().mode() & 0o777, 0o600);
        assert_eq!((m.dev(), m.ino()), l.file);
        // A live one is not touched.
        let e = listen(&at).err().expect("a socket someone answers on");
        assert!(matches!(e, Error::Answering { .. }) && e.to_string().contains("something answers on"), "{e}");
        assert_eq!(std::fs::symlink_metadata(&at).unwrap().ino(), l.file.1);
        // Once the switch connected, the relay's own socket goes — and only that one.
        unlink_own(&at, l.file);
        assert!(std::fs::symlink_metadata(&at).is_err());
        std::fs::write(&at, b"someone else's").unwrap();
        unlink_own(&at, l.file);
        assert_eq!(std::fs::read(&at).unwrap(), b"someone else's");
    }

    #[test]
    fn a_file_or_a_link_at_the_listen_path_is_refused_and_kept() {
        let d = dir();
        let file = d.path().join("notes");
        std::fs::write(&file, b"keep me").unwrap();
        let e = listen(&file).err().expect("a regular file");
        assert!(
            matches!(e, Error::NotASocket { .. }) && e.to_string().contains("is a regular file, not a socket"),
            "{e}"
        );
        assert_eq!(std::fs::read(&file).unwrap(), b"keep me");
        // A link, to a file or to a stale socket, is neither removed nor followed.
        let sock = d.path().join("stale.sock");
        drop(UnixListener::bind(&sock).unwrap());
        for target in [&file, &sock] {
            let link = d.path().join("link.sock");
            let _ = std::fs::remove_file(&link);
            std::os::unix::fs::symlink(target, &link).unwrap();
            let e = listen(&link).err().expect("a symbolic link").to_string();
            assert!(e.contains("is a symbolic link, not a socket"), "{e}");
            assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
            assert!(std::fs::symlink_metadata(target).is_ok());
        }
    }
}

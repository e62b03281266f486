//! Taking QEMU's connections: a thread per port that serves the socket (or connects to
//! QEMU's), checks who is on the other side before reading a message, answers the protocol
//! ([`crate::handler`]) and hands the connection's rings to the datapath.
//!
//! A fresh device per connection: when QEMU goes (or restarts), its connection ends, the
//! port's link goes down (frames to it are dropped and counted, as on a TAP whose guest is
//! gone), and the next connection starts from scratch.

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tracing::{info, warn};
use vhost::vhost_user::{BackendReqHandler, Error as VuError};

use crate::handler::NetHandler;
use crate::port::{Shared, VhostUserPort};

/// Who opens the socket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// sluice listens at the path; QEMU connects (`-chardev socket,path=…,reconnect=1`).
    Server,
    /// QEMU listens (`-chardev socket,path=…,server=on`); sluice connects and retries.
    Client,
}

/// Opens a vhost-user port named `name` on the socket `path`. In server mode the socket
/// is bound here (mode 0600), so a path that cannot be used fails the attachment.
pub fn open(name: &str, path: &Path, role: Role, offload: bool) -> io::Result<VhostUserPort> {
    let shared = Shared::new()?;
    let label = name.to_string();
    let (name, p) = (name.to_string(), path.to_path_buf());
    let s = shared.clone();
    let (thread, socket) = match role {
        Role::Server => {
            let l = bind(path)?;
            shared.set_state(format!("waiting for QEMU to connect to {}", path.display()));
            let t = std::thread::Builder::new().name(format!("vhost-{name}")).spawn(move || serve(l, &name, &p, &s))?;
            (t, Some(path.to_path_buf()))
        }
        Role::Client => {
            shared.set_state(format!("connecting to QEMU at {}", path.display()));
            let t = std::thread::Builder::new().name(format!("vhost-{name}")).spawn(move || connect(&name, &p, &s))?;
            (t, None)
        }
    };
    Ok(VhostUserPort::new(&label, shared, offload, Some(thread), socket))
}

/// Binds the socket: a stale socket nobody answers on is replaced, anything else is
/// refused with what to do.
fn bind(path: &Path) -> io::Result<UnixListener> {
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
            std::fs::remove_file(path).map_err(|e| what(e, ""))?;
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
    let l = UnixListener::bind(path).map_err(|e| {
        let hint = if e.kind() == io::ErrorKind::NotFound { " (does its directory exist?)" } else { "" };
        what(e, hint)
    })?;
    // Least privilege: only root and the switch's own user may connect (the kernel checks
    // write permission on connect; the peer's credentials are checked again after).
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(|e| what(e, ""))?;
    Ok(l)
}

/// Removes the port's socket when the port goes, if it is still a socket.
pub(crate) fn remove_socket(path: &Path) {
    if std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket()) {
        let _ = std::fs::remove_file(path);
    }
}

/// Waits up to `ms` for `fd` to be readable.
fn readable(fd: RawFd, ms: i32) -> bool {
    let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    // SAFETY: one valid pollfd for the duration of the call.
    unsafe { libc::poll(&mut p, 1, ms) > 0 }
}

fn serve(listener: UnixListener, name: &str, path: &Path, shared: &Arc<Shared>) {
    let fd = listener.as_raw_fd();
    while !shared.stop.load(Ordering::Acquire) {
        crate::memory::sweep();
        if !readable(fd, 200) {
            continue;
        }
        match listener.accept() {
            Ok((stream, _)) => run_connection(stream, name, path, shared),
            Err(e) => {
                warn!(port = %name, "vhost-user: accepting a connection on {}: {e}", path.display());
                sleep_unless_stopped(shared, Duration::from_millis(200));
            }
        }
        shared.set_state(format!("waiting for QEMU to connect to {}", path.display()));
    }
}

fn connect(name: &str, path: &Path, shared: &Arc<Shared>) {
    let mut backoff = Duration::from_millis(100);
    let mut said = false;
    while !shared.stop.load(Ordering::Acquire) {
        crate::memory::sweep();
        match UnixStream::connect(path) {
            Ok(stream) => {
                backoff = Duration::from_millis(100);
                said = false;
                run_connection(stream, name, path, shared);
            }
            Err(e) => {
                let why = format!("waiting for QEMU's vhost-user socket at {} ({e}); retrying", path.display());
                if !said {
                    info!(port = %name, "{why}");
                    said = true;
                }
                shared.set_state(why);
                sleep_unless_stopped(shared, backoff);
                backoff = (backoff * 2).min(Duration::from_secs(2));
            }
        }
    }
}

fn sleep_unless_stopped(shared: &Shared, d: Duration) {
    let until = Instant::now() + d;
    while Instant::now() < until && !shared.stop.load(Ordering::Acquire) {
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// One connection: its peer checked before any message is read, then served on this
/// thread until it ends; the datapath has its rings meanwhile.
fn run_connection(stream: UnixStream, name: &str, path: &Path, shared: &Arc<Shared>) {
    let me = crate::peer::euid();
    let peer = match crate::peer::peer_cred(&stream) {
        Ok(c) if c.uid == 0 || c.uid == me => c,
        Ok(c) => {
            shared.refused.fetch_add(1, Ordering::Relaxed);
            warn!(
                port = %name,
                "vhost-user: refused a connection on {}: pid {} runs as uid {}, neither root nor the switch's user (uid {me})",
                path.display(),
                c.pid,
                c.uid
            );
            return;
        }
        Err(e) => {
            shared.refused.fetch_add(1, Ordering::Relaxed);
            warn!(port = %name, "vhost-user: refused a connection on {}: its credentials could not be read: {e}", path.display());
            return;
        }
    };
    // A reason left by the datapath after the last connection ended is not this one's.
    shared.take_end();
    let handler = match NetHandler::new(shared.clone()) {
        Ok(h) => Arc::new(Mutex::new(h)),
        Err(e) => {
            warn!(port = %name, "vhost-user: {e}");
            return;
        }
    };
    let (link, faulted) = {
        let h = handler.lock().unwrap_or_else(|p| p.into_inner());
        (h.link(), h.faulted().clone())
    };
    *shared.conn.lock().unwrap_or_else(|p| p.into_inner()) = stream.try_clone().ok();
    if shared.stop.load(Ordering::Acquire) {
        let _ = stream.shutdown(std::net::Shutdown::Both);
    }
    shared.connections.fetch_add(1, Ordering::Relaxed);
    shared.set_state(format!("connected: pid {} (uid {})", peer.pid, peer.uid));
    info!(port = %name, pid = peer.pid, "vhost-user: QEMU connected on {}", path.display());
    shared.publish(Some(Arc::new(link)));
    let closer = stream.try_clone();
    let (inner, relays) = match crate::shim::start(stream, handler.clone(), name) {
        Ok(s) => s,
        Err(e) => {
            warn!(port = %name, "vhost-user: {e}");
            shared.publish(None);
            shared.conn.lock().unwrap_or_else(|p| p.into_inner()).take();
            return;
        }
    };
    let mut req = BackendReqHandler::from_stream(inner, handler.clone());
    let end = loop {
        if let Err(e) = req.handle_request() {
            break e;
        }
        if faulted.load(Ordering::Acquire) {
            break VuError::Disconnected;
        }
    };
    shared.publish(None);
    shared.conn.lock().unwrap_or_else(|p| p.into_inner()).take();
    handler.lock().unwrap_or_else(|p| p.into_inner()).stop_all();
    // The relays end with QEMU's socket; then nothing but this thread holds the device
    // (without a handle on the socket they are left to end by themselves).
    drop(req);
    if let Ok(c) = closer {
        let _ = c.shutdown(std::net::Shutdown::Both);
        for r in relays {
            let _ = r.join();
        }
    }
    drop(handler);
    crate::memory::sweep();
    if faulted.load(Ordering::Acquire) {
        shared.memory_faults.fetch_add(1, Ordering::Relaxed);
        shared.end_with(
            "a page of the guest's memory went away under the switch (QEMU's memory file shrank, a hole was punched in it, or huge pages ran out: give QEMU `prealloc=on` with huge pages)"
                .to_string(),
        );
    }
    let why = shared.take_end().or(match &end {
        VuError::Disconnected | VuError::PartialMessage => None,
        e => Some(e.to_string()),
    });
    match why {
        None => info!(port = %name, "vhost-user: QEMU disconnected; the port's link is down until it connects again"),
        Some(why) => warn!(
            port = %name,
            "vhost-user: the connection ended: {why}; the port's link is down until QEMU connects again"
        ),
    }
}

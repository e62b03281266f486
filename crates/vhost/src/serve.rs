//! Taking QEMU's connections: a thread per port that serves the socket (or connects to
//! QEMU's), runs rust-vmm's protocol daemon for each connection, checks who is on the
//! other side, and hands the connection's queues to the datapath.
//!
//! A new daemon per connection: when QEMU goes (or restarts), its connection ends, the
//! port's link goes down (frames to it are dropped and counted, as on a TAP whose guest is
//! gone), and the next connection starts from a fresh device.

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use tracing::{info, warn};
use vhost::vhost_user::Listener;
use vhost_user_backend::{VhostUserDaemon, VringRwLock};
use vm_memory::{GuestMemoryAtomic, GuestMemoryMmap};
use vmm_sys_util::epoll::EventSet;

use crate::backend::{FETCH_EVENT, NetBackend};
use crate::port::{Link, Shared, VhostUserPort};

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
    Ok(VhostUserPort::new(shared, offload, Some(thread), socket))
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

type Daemon = VhostUserDaemon<Arc<RwLock<NetBackend>>>;

/// One protocol daemon (a protocol thread per connection, a vring worker) and the
/// descriptors the framework leaves behind, closed when it goes.
struct Session {
    d: Option<Daemon>,
    exit_fds: Arc<Mutex<Vec<RawFd>>>,
    vrings: Vec<VringRwLock>,
    mem: GuestMemoryAtomic<GuestMemoryMmap>,
}

impl Session {
    /// A fresh daemon, and its vrings (fetched from its vring worker, which alone is
    /// handed them).
    fn new(name: &str, shared: &Arc<Shared>) -> io::Result<Session> {
        let slot = Arc::new(Mutex::new(None));
        let backend = NetBackend::new(shared.clone(), slot.clone())?;
        let fetch = backend.fetch_fd().as_raw_fd();
        let exit_fds = backend.exit_fds.clone();
        let backend = Arc::new(RwLock::new(backend));
        let mem = GuestMemoryAtomic::new(GuestMemoryMmap::new());
        let d = VhostUserDaemon::new(format!("vhost-{name}"), backend.clone(), mem.clone())
            .map_err(|e| io::Error::other(format!("starting the vhost-user daemon: {e}")))?;
        let mut s = Session { d: Some(d), exit_fds, vrings: Vec::new(), mem };
        let handlers = s.daemon().get_epoll_handlers();
        let h = handlers.first().ok_or_else(|| io::Error::other("the vhost-user daemon has no vring worker"))?;
        h.register_listener(fetch, EventSet::IN, u64::from(FETCH_EVENT))?;
        backend.read().unwrap_or_else(|p| p.into_inner()).fetch_fd().write(1)?;
        let until = Instant::now() + Duration::from_secs(5);
        loop {
            if let Some(v) = slot.lock().unwrap_or_else(|p| p.into_inner()).take() {
                s.vrings = v;
                return Ok(s);
            }
            if Instant::now() > until {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the vhost-user vring worker did not hand over the vrings in 5 s",
                ));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn daemon(&mut self) -> &mut Daemon {
        self.d.as_mut().expect("present until dropped")
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        // The daemon's handler stops and joins its vring workers as it goes.
        drop(self.d.take());
        for fd in self.exit_fds.lock().unwrap_or_else(|p| p.into_inner()).drain(..) {
            // SAFETY: the framework took this descriptor out of its owner (`into_raw_fd`)
            // and never closes it; its epoll and worker are gone with the daemon, so no one
            // uses it, and it stayed open (its number not reused) until now.
            unsafe { libc::close(fd) };
        }
    }
}

fn serve(listener: UnixListener, name: &str, path: &Path, shared: &Arc<Shared>) {
    let fd = listener.as_raw_fd();
    let mut listener = Listener::from(listener);
    while !shared.stop.load(Ordering::Acquire) {
        if !readable(fd, 200) {
            continue;
        }
        let mut s = match Session::new(name, shared) {
            Ok(x) => x,
            Err(e) => {
                warn!(port = %name, "vhost-user: {e}; retrying in 1 s");
                sleep_unless_stopped(shared, Duration::from_secs(1));
                continue;
            }
        };
        if let Err(e) = s.daemon().start(&mut listener) {
            warn!(port = %name, "vhost-user: accepting a connection on {}: {e}", path.display());
            continue;
        }
        run_connection(s, name, path, Role::Server, shared);
        shared.set_state(format!("waiting for QEMU to connect to {}", path.display()));
    }
}

fn connect(name: &str, path: &Path, shared: &Arc<Shared>) {
    let mut backoff = Duration::from_millis(100);
    let mut said = false;
    let mut session = None;
    while !shared.stop.load(Ordering::Acquire) {
        // One daemon waits through every attempt; a new one after each connection.
        let s: &mut Session = match &mut session {
            Some(s) => s,
            None => match Session::new(name, shared) {
                Ok(s) => session.insert(s),
                Err(e) => {
                    warn!(port = %name, "vhost-user: {e}; retrying in 1 s");
                    sleep_unless_stopped(shared, Duration::from_secs(1));
                    continue;
                }
            },
        };
        match s.daemon().start_client(&path.to_string_lossy()) {
            Ok(()) => {
                backoff = Duration::from_millis(100);
                said = false;
                run_connection(session.take().expect("just used"), name, path, Role::Client, shared);
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

/// One connection: checked, handed to the datapath, and taken back when it ends.
fn run_connection(mut s: Session, name: &str, path: &Path, role: Role, shared: &Arc<Shared>) {
    let peers = crate::peer::peers_on(path, role == Role::Server);
    let me = crate::peer::euid();
    let verdict = match &peers {
        Ok(p) if p.is_empty() => Err("its credentials could not be read".to_string()),
        Ok(p) => match p.iter().find(|c| c.uid != 0 && c.uid != me) {
            Some(c) => {
                Err(format!("pid {} runs as uid {}, neither root nor the switch's user (uid {me})", c.pid, c.uid))
            }
            None => Ok(p[0]),
        },
        Err(e) => Err(format!("its credentials could not be read: {e}")),
    };
    let peer = match verdict {
        Ok(p) => p,
        Err(why) => {
            shared.refused.fetch_add(1, Ordering::Relaxed);
            warn!(port = %name, "vhost-user: refused a connection on {}: {why}", path.display());
            s.daemon().request_shutdown();
            let _ = s.daemon().wait();
            return;
        }
    };
    *shared.shutdown.lock().unwrap_or_else(|p| p.into_inner()) = s.daemon().shutdown_handle();
    if shared.stop.load(Ordering::Acquire) {
        s.daemon().request_shutdown();
    }
    shared.connections.fetch_add(1, Ordering::Relaxed);
    shared.set_state(format!("connected: pid {} (uid {})", peer.pid, peer.uid));
    info!(port = %name, pid = peer.pid, "vhost-user: QEMU connected on {}", path.display());
    shared.publish(Some(Arc::new(Link { vrings: s.vrings.clone(), mem: s.mem.clone() })));
    let r = s.daemon().wait();
    shared.publish(None);
    shared.shutdown.lock().unwrap_or_else(|p| p.into_inner()).take();
    drop(s);
    match r {
        Ok(()) => info!(port = %name, "vhost-user: QEMU disconnected; the port's link is down until it connects again"),
        Err(e) => {
            info!(port = %name, "vhost-user: the connection ended ({e}); the port's link is down until QEMU connects again")
        }
    }
}

//! Taking QEMU's connections: a thread per port that serves the socket (or connects to
//! QEMU's), checks who is on the other side before reading a message, answers the protocol
//! ([`crate::handler`]) and hands the connection's rings to the datapath.
//!
//! A fresh device per connection: when QEMU goes (or restarts), its connection ends, the
//! port's link goes down (frames to it are dropped and counted, as on a TAP whose guest is
//! gone), and the next connection starts from scratch.
//!
//! Whoever connects is hostile until proven otherwise, and may connect again and again: in
//! client mode the port waits before it connects again after a refused or short-lived
//! connection (100 ms, doubling to 2 s), and in either mode what it logs about connections
//! is at most one line a minute per cause (`Quiet`), with a count of what it held back.

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tracing::{info, warn};
use vhost::vhost_user::{BackendReqHandler, Error as VuError};

use crate::handler::NetHandler;
use crate::peer::Allow;
use crate::port::{Shared, VhostUserPort};

/// Who opens the socket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// sluice listens at the path; QEMU connects (`-chardev socket,path=…,reconnect=1`).
    Server,
    /// QEMU listens (`-chardev socket,path=…,server=on`); sluice connects and retries.
    Client,
}

/// Opens a vhost-user port named `name` on the socket `path` that only root and the
/// switch's own user may drive. In server mode the socket is bound here (mode 0600 from
/// the start), so a path that cannot be used fails the attachment.
pub fn open(name: &str, path: &Path, role: Role, offload: bool) -> io::Result<VhostUserPort> {
    open_allowing(name, path, role, offload, &Allow::default())
}

/// [`open`], letting in the peers `allow` names too; in server mode the socket file is
/// given `allow`'s socket group (mode 0660) from the start.
pub fn open_allowing(name: &str, path: &Path, role: Role, offload: bool, allow: &Allow) -> io::Result<VhostUserPort> {
    let shared = Shared::new()?;
    let a = allow.clone();
    let label = name.to_string();
    let (name, p) = (name.to_string(), path.to_path_buf());
    let s = shared.clone();
    let (thread, socket) = match role {
        Role::Server => {
            let l = crate::socket::bind(path, allow.socket_group)?;
            shared.set_state(format!("waiting for QEMU to connect to {}", path.display()));
            let t =
                std::thread::Builder::new().name(format!("vhost-{name}")).spawn(move || serve(l, &name, &p, &s, &a))?;
            (t, Some(path.to_path_buf()))
        }
        Role::Client => {
            shared.set_state(format!("connecting to QEMU at {}", path.display()));
            let t =
                std::thread::Builder::new().name(format!("vhost-{name}")).spawn(move || connect(&name, &p, &s, &a))?;
            (t, None)
        }
    };
    Ok(VhostUserPort::new(&label, shared, offload, Some(thread), socket))
}

/// Waits up to `ms` for `fd` to be readable.
fn readable(fd: RawFd, ms: i32) -> bool {
    crate::sys::poll(fd, libc::POLLIN, ms).is_ok_and(|r| r != 0)
}

/// What the port logs about connections, by cause.
#[derive(Clone, Copy)]
enum Event {
    /// A peer not allowed (neither root, the switch's user nor one `vhost_allow_users` or
    /// `vhost_allow_groups` names), or whose credentials could not be read.
    Refused = 0,
    /// A peer connected.
    Connected = 1,
    /// The peer went.
    Ended = 2,
    /// The switch ended the connection: the peer sent something it refuses, or its memory
    /// went away.
    Rejected = 3,
    /// Accepting failed.
    Accept = 4,
}

/// At most one line a minute per [`Event`]; the lines held back are counted and said with
/// the next one.
#[derive(Default)]
struct Quiet {
    last: [Option<Instant>; 5],
    held: [u64; 5],
}

const QUIET: Duration = Duration::from_secs(60);

impl Quiet {
    /// Whether a line about `e` may be logged now; if so, what to add to it about the lines
    /// held back since the last one.
    fn may(&mut self, e: Event) -> Option<String> {
        let i = e as usize;
        let now = Instant::now();
        if self.last[i].is_some_and(|t| now.duration_since(t) < QUIET) {
            self.held[i] += 1;
            return None;
        }
        self.last[i] = Some(now);
        let held = std::mem::take(&mut self.held[i]);
        Some(if held > 0 { format!(" ({held} more like it in the last minute, not logged)") } else { String::new() })
    }
}

/// After a refused peer, the wait before the next connection is taken: a peer that is
/// refused and connects again at once (QEMU's `reconnect`) costs ten accepts a second, not
/// a core.
const REFUSED_PAUSE: Duration = Duration::from_millis(100);

fn serve(listener: UnixListener, name: &str, path: &Path, shared: &Arc<Shared>, allow: &Allow) {
    let fd = listener.as_raw_fd();
    let mut quiet = Quiet::default();
    while !shared.stop.load(Ordering::Acquire) {
        crate::memory::sweep();
        if !readable(fd, 200) {
            continue;
        }
        match listener.accept() {
            Ok((stream, _)) => {
                if !run_connection(stream, name, path, shared, allow, &mut quiet) {
                    sleep_unless_stopped(shared, REFUSED_PAUSE);
                }
            }
            Err(e) => {
                if let Some(more) = quiet.may(Event::Accept) {
                    warn!(port = %name, "vhost-user: accepting a connection on {}: {e}{more}", path.display());
                }
                sleep_unless_stopped(shared, Duration::from_millis(200));
            }
        }
        shared.set_state(format!("waiting for QEMU to connect to {}", path.display()));
    }
}

/// The first wait before connecting again, and the longest.
const RETRY: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(2));
/// A connection shorter than this (or refused) is followed by a wait before the next.
const SHORT: Duration = Duration::from_secs(10);

fn connect(name: &str, path: &Path, shared: &Arc<Shared>, allow: &Allow) {
    let mut backoff = RETRY.0;
    let mut said = false;
    let mut quiet = Quiet::default();
    while !shared.stop.load(Ordering::Acquire) {
        crate::memory::sweep();
        match UnixStream::connect(path) {
            Ok(stream) => {
                said = false;
                let began = Instant::now();
                let served = run_connection(stream, name, path, shared, allow, &mut quiet);
                if served && began.elapsed() >= SHORT {
                    backoff = RETRY.0;
                    continue;
                }
                // Refused, or over at once: QEMU restarting, or a peer that is not QEMU.
                // Either way not again at once.
                shared.set_state(format!(
                    "connecting to QEMU at {} again in {} ms",
                    path.display(),
                    backoff.as_millis()
                ));
            }
            Err(e) => {
                let why = format!("waiting for QEMU's vhost-user socket at {} ({e}); retrying", path.display());
                if !said {
                    info!(port = %name, "{why}");
                    said = true;
                }
                shared.set_state(why);
            }
        }
        sleep_unless_stopped(shared, backoff);
        backoff = (backoff * 2).min(RETRY.1);
    }
}

fn sleep_unless_stopped(shared: &Shared, d: Duration) {
    let until = Instant::now() + d;
    while Instant::now() < until && !shared.stop.load(Ordering::Acquire) {
        std::thread::sleep(Duration::from_millis(50).min(until.saturating_duration_since(Instant::now())));
    }
}

/// One connection: its peer checked before any message is read, then served on this
/// thread until it ends; the datapath has its rings meanwhile. False if the peer was
/// refused before it was served.
fn run_connection(
    stream: UnixStream,
    name: &str,
    path: &Path,
    shared: &Arc<Shared>,
    allow: &Allow,
    quiet: &mut Quiet,
) -> bool {
    let me = crate::sys::euid();
    let peer = match crate::peer::peer_cred(&stream).map(|c| (allow.check(&c, me), c)) {
        Ok((Ok(()), c)) => c,
        Ok((Err(why), _)) => {
            shared.refused.fetch_add(1, Ordering::Relaxed);
            if let Some(more) = quiet.may(Event::Refused) {
                warn!(port = %name, "vhost-user: refused a connection on {}: {why}{more}", path.display());
            }
            return false;
        }
        Err(e) => {
            shared.refused.fetch_add(1, Ordering::Relaxed);
            if let Some(more) = quiet.may(Event::Refused) {
                warn!(port = %name, "vhost-user: refused a connection on {}: its credentials could not be read: {e}{more}", path.display());
            }
            return false;
        }
    };
    // A reason left by the datapath after the last connection ended is not this one's.
    shared.take_end();
    let handler = match NetHandler::new(shared.clone()) {
        Ok(h) => Arc::new(Mutex::new(h)),
        Err(e) => {
            warn!(port = %name, "vhost-user: {e}");
            return false;
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
    if let Some(more) = quiet.may(Event::Connected) {
        info!(port = %name, pid = peer.pid, "vhost-user: QEMU connected on {}{more}", path.display());
    }
    shared.publish(Some(Arc::new(link)));
    let closer = stream.try_clone();
    let (inner, relays) = match crate::shim::start(stream, handler.clone(), name) {
        Ok(s) => s,
        Err(e) => {
            warn!(port = %name, "vhost-user: {e}");
            shared.publish(None);
            shared.conn.lock().unwrap_or_else(|p| p.into_inner()).take();
            return false;
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
        None => {
            if let Some(more) = quiet.may(Event::Ended) {
                info!(port = %name, "vhost-user: QEMU disconnected; the port's link is down until it connects again{more}");
            }
        }
        Some(why) => {
            if let Some(more) = quiet.may(Event::Rejected) {
                warn!(
                    port = %name,
                    "vhost-user: the connection ended: {why}; the port's link is down until QEMU connects again{more}"
                );
            }
        }
    }
    true
}

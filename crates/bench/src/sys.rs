//! The socket calls the engine makes that std has not: waiting for a descriptor to become
//! readable, seeing a peer's half-close without reading, resizing a listener's backlog.

use std::io;
use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::time::Duration;

/// True when the peer has shut down its sending side (checked without blocking).
pub(crate) fn peer_half_closed(s: &TcpStream) -> io::Result<bool> {
    let revents = poll1(s.as_raw_fd(), libc::POLLIN | libc::POLLRDHUP, 0)?;
    Ok(revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0)
}

/// Resizes a bound listener's accept queue to hold `connections` pending connections at
/// once (128 to 4096): listen(2) again on the listening socket.
pub(crate) fn size_backlog(l: &TcpListener, connections: u32) -> io::Result<()> {
    let backlog = connections.clamp(128, 4096) as libc::c_int;
    // SAFETY: listen(2) on a socket we own; a second listen only resizes the backlog.
    if unsafe { libc::listen(l.as_raw_fd(), backlog) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Waits up to `limit` for `fd` to become readable; true if it did.
pub(crate) fn wait_readable(fd: RawFd, limit: Duration) -> io::Result<bool> {
    let ms = limit.as_millis().clamp(1, libc::c_int::MAX as u128) as libc::c_int;
    Ok(poll1(fd, libc::POLLIN, ms)? != 0)
}

/// poll(2) on one descriptor; returns its revents (0 on timeout).
fn poll1(fd: RawFd, events: libc::c_short, timeout_ms: libc::c_int) -> io::Result<libc::c_short> {
    let mut p = libc::pollfd { fd, events, revents: 0 };
    loop {
        // SAFETY: one valid pollfd on the stack, for the duration of the call.
        let r = unsafe { libc::poll(&mut p, 1, timeout_ms) };
        if r >= 0 {
            return Ok(p.revents);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

//! Who is on the other side of a vhost-user connection, and what it sends.
//!
//! The kernel records the peer's credentials when a unix socket connects (`SO_PEERCRED`):
//! the port reads them before it reads a message. A descriptor the peer sends is known by
//! the kernel's name for its file ([`fd_target`]), which the peer cannot choose for an
//! eventfd or a memfd.

use std::io;
use std::os::fd::RawFd;

/// A peer's credentials, as the kernel recorded them when it connected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cred {
    /// Process id.
    pub pid: i32,
    /// User id.
    pub uid: u32,
}

/// The credentials the kernel recorded for the peer of `s` when it connected.
pub fn peer_cred(s: &std::os::unix::net::UnixStream) -> io::Result<Cred> {
    use std::os::fd::AsRawFd;
    let (pid, uid) = crate::sys::peer_cred(s.as_raw_fd())?;
    Ok(Cred { pid, uid })
}

/// What descriptor `fd` of this process refers to, as the kernel names it
/// (`/proc/self/fd/N`): a path, `anon_inode:[eventfd]`, `pipe:[…]`, `/memfd:NAME (deleted)`.
pub fn fd_target(fd: RawFd) -> io::Result<std::path::PathBuf> {
    std::fs::read_link(format!("/proc/self/fd/{fd}"))
}

/// Makes `fd` non-blocking. On a descriptor the peer shares this is a courtesy, not a
/// guarantee (the peer can clear the flag again): the switch reads and writes those
/// without relying on it (`crate::eventfd`).
pub fn set_nonblocking(fd: RawFd) -> io::Result<()> {
    crate::sys::set_nonblocking(fd, true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;

    #[test]
    fn the_peer_of_a_connection_is_this_process() {
        let (a, _b) = UnixStream::pair().unwrap();
        assert_eq!(peer_cred(&a).unwrap(), Cred { pid: std::process::id() as i32, uid: crate::sys::euid() });
    }
}

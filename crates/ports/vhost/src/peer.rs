//! Who is on the other side of a vhost-user connection, and what it sends.
//!
//! The kernel records the peer's credentials when a unix socket connects (`SO_PEERCRED`):
//! the port reads them before it reads a message. A descriptor the peer sends is known by
//! the kernel's name for its file ([`fd_target`]), which the peer cannot choose for an
//! eventfd or a memfd.

use std::io;
use std::os::fd::RawFd;

/// A peer's credentials, as the kernel recorded them when it connected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cred {
    /// Process id.
    pub pid: i32,
    /// User id.
    pub uid: u32,
    /// Group id (the one it runs as).
    pub gid: u32,
    /// Supplementary groups (empty where the kernel could not say).
    pub groups: Vec<u32>,
}

/// The credentials the kernel recorded for the peer of `s` when it connected.
pub fn peer_cred(s: &std::os::unix::net::UnixStream) -> io::Result<Cred> {
    use std::os::fd::AsRawFd;
    let (pid, uid, gid) = crate::sys::peer_cred(s.as_raw_fd())?;
    let groups = crate::sys::peer_groups(s.as_raw_fd()).unwrap_or_default();
    Ok(Cred { pid, uid, gid, groups })
}

/// Who may be the peer of a vhost-user port, besides root and the switch's own user (the
/// switch's `vhost_allow_users` and `vhost_allow_groups`, resolved to ids), and the group
/// its socket file is given so that they can connect at all.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Allow {
    /// Users allowed by id.
    pub users: Vec<u32>,
    /// Groups allowed by id: a peer running in one, or having it among its supplementary
    /// groups, is allowed.
    pub groups: Vec<u32>,
    /// The group a server-mode port's socket file belongs to, mode 0660 (`None`: root's or
    /// the switch's group, mode 0600).
    pub socket_group: Option<u32>,
}

impl Allow {
    /// Whether `peer` may drive a port of a switch running as user `me`; if not, the
    /// sentence saying so and what to change.
    pub fn check(&self, peer: &Cred, me: u32) -> Result<(), String> {
        let in_group = std::iter::once(&peer.gid).chain(&peer.groups).any(|g| self.groups.contains(g));
        if peer.uid == 0 || peer.uid == me || self.users.contains(&peer.uid) || in_group {
            return Ok(());
        }
        Err(format!(
            "vhost-user peer uid {} gid {} (pid {}) is not allowed: add it to vhost_allow_users or vhost_allow_groups \
             in the switch's configuration (root and the switch's own user, uid {me}, always are)",
            peer.uid, peer.gid, peer.pid
        ))
    }
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
        let c = peer_cred(&a).unwrap();
        assert_eq!((c.pid, c.uid), (std::process::id() as i32, crate::sys::euid()));
        assert_eq!(c.gid, crate::sys::egid());
    }

    fn peer(uid: u32, gid: u32, groups: &[u32]) -> Cred {
        Cred { pid: 42, uid, gid, groups: groups.to_vec() }
    }

    #[test]
    fn root_the_switchs_user_and_the_allowed_are_let_in() {
        let none = Allow::default();
        assert!(none.check(&peer(0, 0, &[]), 1000).is_ok());
        assert!(none.check(&peer(1000, 1000, &[]), 1000).is_ok());
        let a = Allow { users: vec![1001], groups: vec![64055], socket_group: Some(64055) };
        assert!(a.check(&peer(1001, 5, &[]), 0).is_ok());
        assert!(a.check(&peer(64055, 64055, &[107]), 0).is_ok(), "by the group it runs in");
        assert!(a.check(&peer(2000, 107, &[64055]), 0).is_ok(), "by a supplementary group");
    }

    #[test]
    fn a_peer_not_allowed_is_told_its_ids_and_the_settings_to_change() {
        let a = Allow { users: vec![1001], groups: vec![64055], socket_group: None };
        let e = a.check(&peer(64056, 107, &[107]), 0).unwrap_err();
        assert!(e.starts_with("vhost-user peer uid 64056 gid 107 (pid 42) is not allowed"), "{e}");
        assert!(e.contains("vhost_allow_users or vhost_allow_groups"), "{e}");
        assert!(Allow::default().check(&peer(1000, 1000, &[]), 0).is_err());
    }
}

//! Who is on the other side of a vhost-user connection.
//!
//! rust-vmm's daemon accepts (or makes) the connection itself and does not hand out its
//! socket, so the port finds it among its own process's descriptors: the unix stream
//! sockets bound to (server) or connected to (client) the port's path that are not
//! listening. Only read-only socket queries are made on them; none is closed or kept.

use std::io;
use std::mem::{size_of, zeroed};
use std::os::fd::RawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// A peer's credentials, as the kernel recorded them when it connected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cred {
    /// Process id.
    pub pid: i32,
    /// User id.
    pub uid: u32,
}

/// This process's effective user id.
pub fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

fn int_opt(fd: RawFd, level: i32, name: i32) -> Option<i32> {
    let mut v: i32 = 0;
    let mut len = size_of::<i32>() as libc::socklen_t;
    // SAFETY: `v` and `len` are valid for writes of the sizes given.
    let r = unsafe { libc::getsockopt(fd, level, name, (&mut v as *mut i32).cast(), &mut len) };
    (r == 0).then_some(v)
}

/// The unix address of `fd`'s own end (`peer` false) or its peer's, as bytes.
fn unix_path(fd: RawFd, peer: bool) -> Option<Vec<u8>> {
    // SAFETY: sockaddr_un is plain data; all zeroes is a valid value.
    let mut a: libc::sockaddr_un = unsafe { zeroed() };
    let mut len = size_of::<libc::sockaddr_un>() as libc::socklen_t;
    let p = (&mut a as *mut libc::sockaddr_un).cast::<libc::sockaddr>();
    // SAFETY: `a` and `len` are valid for writes of the size given.
    let r = unsafe { if peer { libc::getpeername(fd, p, &mut len) } else { libc::getsockname(fd, p, &mut len) } };
    if r != 0 || a.sun_family != libc::AF_UNIX as libc::sa_family_t {
        return None;
    }
    let n = (len as usize).saturating_sub(size_of::<libc::sa_family_t>()).min(a.sun_path.len());
    let bytes: Vec<u8> = a.sun_path[..n].iter().map(|&c| c as u8).take_while(|&c| c != 0).collect();
    Some(bytes)
}

fn peer_cred(fd: RawFd) -> Option<Cred> {
    // SAFETY: ucred is plain data; all zeroes is a valid value.
    let mut c: libc::ucred = unsafe { zeroed() };
    let mut len = size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `c` and `len` are valid for writes of the size given.
    let r = unsafe {
        libc::getsockopt(fd, libc::SOL_SOCKET, libc::SO_PEERCRED, (&mut c as *mut libc::ucred).cast(), &mut len)
    };
    (r == 0).then_some(Cred { pid: c.pid, uid: c.uid })
}

/// The credentials of the peers of this process's connected unix stream sockets on
/// `path`: accepted on it (`accepted`), or connected to it.
pub fn peers_on(path: &Path, accepted: bool) -> io::Result<Vec<Cred>> {
    let want = path.as_os_str().as_bytes();
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc/self/fd")? {
        let Some(fd) = e?.file_name().to_str().and_then(|s| s.parse::<RawFd>().ok()) else { continue };
        if int_opt(fd, libc::SOL_SOCKET, libc::SO_DOMAIN) != Some(libc::AF_UNIX)
            || int_opt(fd, libc::SOL_SOCKET, libc::SO_TYPE) != Some(libc::SOCK_STREAM)
            || int_opt(fd, libc::SOL_SOCKET, libc::SO_ACCEPTCONN) != Some(0)
        {
            continue;
        }
        if unix_path(fd, !accepted).as_deref() == Some(want)
            && let Some(c) = peer_cred(fd)
        {
            out.push(c);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::{UnixListener, UnixStream};

    #[test]
    fn the_peer_of_an_accepted_connection_is_found_by_the_path() {
        let path = std::env::temp_dir().join(format!("sluice-peer-{}.sock", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let l = UnixListener::bind(&path).unwrap();
        assert!(peers_on(&path, true).unwrap().is_empty(), "a listener is no connection");
        let _c = UnixStream::connect(&path).unwrap();
        let (_s, _) = l.accept().unwrap();
        let me = Cred { pid: std::process::id() as i32, uid: euid() };
        assert_eq!(peers_on(&path, true).unwrap(), vec![me]);
        assert_eq!(peers_on(&path, false).unwrap(), vec![me], "the client's end, connected to the path");
        std::fs::remove_file(&path).unwrap();
    }
}

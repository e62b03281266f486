//! The system calls the port makes that std and `vmm-sys-util` have not, each a safe
//! function over one call.
//!
//! Two kinds of call stay with the code whose invariants make them sound: the SIGBUS
//! guard's handler and what it does in a signal handler (`crate::memory`), and the
//! eventfd watchdog's signal and `pthread_kill` (`crate::eventfd`).

use std::ffi::CStr;
use std::fs::File;
use std::io;
use std::mem::{size_of, zeroed};
use std::os::fd::{FromRawFd, RawFd};

/// Turns a call's `-1` into the error it left.
fn check(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 { Err(io::Error::last_os_error()) } else { Ok(r) }
}

/// Turns a transfer's `-1` into the error it left, its count into bytes.
fn check_size(n: isize) -> io::Result<usize> {
    if n < 0 { Err(io::Error::last_os_error()) } else { Ok(n as usize) }
}

/// This process's effective user id.
pub fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// This process's effective group id.
#[cfg(test)]
pub fn egid() -> u32 {
    // SAFETY: getegid has no preconditions and cannot fail.
    unsafe { libc::getegid() }
}

/// The process id, user id and group id the kernel recorded for the peer of unix socket
/// `fd` when it connected (`SO_PEERCRED`).
pub fn peer_cred(fd: RawFd) -> io::Result<(i32, u32, u32)> {
    // SAFETY: ucred is plain data; all zeroes is a valid value.
    let mut c: libc::ucred = unsafe { zeroed() };
    let mut len = size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `c` and `len` are valid for writes of the size given.
    check(unsafe {
        libc::getsockopt(fd, libc::SOL_SOCKET, libc::SO_PEERCRED, (&mut c as *mut libc::ucred).cast(), &mut len)
    })?;
    Ok((c.pid, c.uid, c.gid))
}

/// The supplementary groups the kernel recorded for the peer of unix socket `fd` when it
/// connected (`SO_PEERGROUPS`, Linux 4.13), at most 65536 of them.
pub fn peer_groups(fd: RawFd) -> io::Result<Vec<u32>> {
    let mut groups = vec![0 as libc::gid_t; 64];
    for _ in 0..2 {
        let mut len = (groups.len() * size_of::<libc::gid_t>()) as libc::socklen_t;
        // SAFETY: `groups` is valid for writes of `len` bytes; `len` for a write of its size.
        let r = unsafe {
            libc::getsockopt(fd, libc::SOL_SOCKET, libc::SO_PEERGROUPS, groups.as_mut_ptr().cast(), &mut len)
        };
        let n = len as usize / size_of::<libc::gid_t>();
        if r == 0 {
            groups.truncate(n);
            return Ok(groups);
        }
        let e = io::Error::last_os_error();
        // ERANGE: `len` now says how much room the list needs.
        if e.raw_os_error() != Some(libc::ERANGE) || n <= groups.len() || n > 65536 {
            return Err(e);
        }
        groups.resize(n, 0);
    }
    Err(io::Error::other("the peer's group list kept growing"))
}

/// Sets the group id this thread creates files with and is checked as on the file system
/// (`setfsgid`, which acts on the calling thread only); returns the one it replaces. The
/// kernel refuses silently: see [`fsgid`].
pub fn set_fsgid(gid: u32) -> u32 {
    // SAFETY: setfsgid changes only this thread's file-system group id, and cannot fail
    // (an id it may not take leaves it as it was).
    unsafe { libc::setfsgid(gid) as u32 }
}

/// This thread's file-system group id (`setfsgid` with an id it never takes).
pub fn fsgid() -> u32 {
    // SAFETY: as in `set_fsgid`; -1 is never taken, so nothing changes.
    unsafe { libc::setfsgid(u32::MAX) as u32 }
}

/// Sets (`on`) or clears `O_NONBLOCK` on `fd`.
pub fn set_nonblocking(fd: RawFd, on: bool) -> io::Result<()> {
    // SAFETY: F_GETFL takes no argument and only reads the file's flags.
    let fl = check(unsafe { libc::fcntl(fd, libc::F_GETFL) })?;
    let fl = if on { fl | libc::O_NONBLOCK } else { fl & !libc::O_NONBLOCK };
    // SAFETY: F_SETFL takes an int.
    check(unsafe { libc::fcntl(fd, libc::F_SETFL, fl) }).map(drop)
}

/// Waits up to `timeout_ms` (0: not at all) for `fd` to have one of `events`; returns the
/// events it has (0 when the time ran out).
pub fn poll(fd: RawFd, events: libc::c_short, timeout_ms: i32) -> io::Result<libc::c_short> {
    let mut p = libc::pollfd { fd, events, revents: 0 };
    // SAFETY: one valid pollfd for the duration of the call.
    check(unsafe { libc::poll(&mut p, 1, timeout_ms) })?;
    Ok(p.revents)
}

/// Sets this process's file-creation mask; returns the one it replaces.
pub fn umask(mask: libc::mode_t) -> libc::mode_t {
    // SAFETY: umask only changes this process's file-creation mask, and cannot fail.
    unsafe { libc::umask(mask) }
}

/// A new, empty memfd named `name` that can be sealed.
pub fn memfd(name: &CStr) -> io::Result<File> {
    // SAFETY: a NUL-terminated name.
    let fd = check(unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_ALLOW_SEALING) })?;
    // SAFETY: `fd` was just created and is owned by nothing else.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// Adds `seals` (`F_SEAL_*`) to memfd `fd`.
pub fn add_seals(fd: RawFd, seals: libc::c_int) -> io::Result<()> {
    // SAFETY: F_ADD_SEALS takes an int.
    check(unsafe { libc::fcntl(fd, libc::F_ADD_SEALS, seals) }).map(drop)
}

/// The seals of `fd`'s file (`F_GET_SEALS`).
pub fn seals(fd: RawFd) -> io::Result<libc::c_int> {
    // SAFETY: F_GET_SEALS takes no argument and only reads the file's state.
    check(unsafe { libc::fcntl(fd, libc::F_GET_SEALS) })
}

/// What the kernel knows of `fd`'s file (`fstat`).
pub fn fstat(fd: RawFd) -> io::Result<libc::stat> {
    // SAFETY: stat is plain data; all zeroes is a valid value.
    let mut st: libc::stat = unsafe { zeroed() };
    // SAFETY: `st` is valid for writes of its size.
    check(unsafe { libc::fstat(fd, &mut st) })?;
    Ok(st)
}

/// What the kernel knows of the file system `fd`'s file is on (`fstatfs`).
pub fn fstatfs(fd: RawFd) -> io::Result<libc::statfs> {
    // SAFETY: statfs is plain data; all zeroes is a valid value.
    let mut sf: libc::statfs = unsafe { zeroed() };
    // SAFETY: `sf` is valid for writes of its size.
    check(unsafe { libc::fstatfs(fd, &mut sf) })?;
    Ok(sf)
}

/// The size of the system's base pages, at least 4 KiB.
pub fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize
}

/// Reads from `fd` into `buf` without waiting, whatever the file's flags say
/// (`preadv2` with `RWF_NOWAIT`; `EOPNOTSUPP` where the file or kernel cannot).
pub fn read_nowait(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    let iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    // SAFETY: one iovec over `buf`, valid for its length of writes for the call; offset -1
    // reads at the file's position, as read(2) does.
    check_size(unsafe { libc::preadv2(fd, &iov, 1, -1, libc::RWF_NOWAIT) })
}

/// Reads from `fd` into `buf` (`read`).
pub fn read(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: `buf` is valid for its length of writes for the call.
    check_size(unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) })
}

/// Writes `buf` to `fd` (`write`).
pub fn write(fd: RawFd, buf: &[u8]) -> io::Result<usize> {
    // SAFETY: `buf` is valid for its length of reads for the call.
    check_size(unsafe { libc::write(fd, buf.as_ptr().cast(), buf.len()) })
}

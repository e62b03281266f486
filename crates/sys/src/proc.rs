//! What a process does to itself and its descriptors beyond the standard library: its
//! file-creation mask, blocking and waiting for the stop signals, advisory locks, duplicated
//! descriptors, waiting on several descriptors at once, its children's CPU time, and
//! integer socket options.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use crate::cvt;

/// Runs `f` with the file-creation mask `mask` (e.g. 0o177 so that a socket `f` binds is
/// never briefly open to others), then restores the mask. The mask is the process's: no
/// other thread should create files meanwhile.
pub fn with_umask<T>(mask: u32, f: impl FnOnce() -> T) -> T {
    // SAFETY: umask only changes this process's file-creation mask.
    let old = unsafe { libc::umask(mask as libc::mode_t) };
    let r = f();
    // SAFETY: as above, restoring the previous mask.
    unsafe { libc::umask(old) };
    r
}

/// The signal that makes a switch read its configuration file again (SIGHUP, as
/// `systemctl reload` sends it).
pub const RELOAD_SIGNAL: i32 = libc::SIGHUP;

/// SIGINT and SIGTERM (a stop) and SIGHUP (a reload, [`RELOAD_SIGNAL`]), blocked in the
/// calling thread (and so in every thread it spawns afterwards), to be taken with
/// [`StopSignals::wait`].
pub struct StopSignals(libc::sigset_t);

impl StopSignals {
    /// Blocks the stop signals in the calling thread.
    pub fn block() -> StopSignals {
        // SAFETY: sigset operations on a local, initialized set; pthread_sigmask affects
        // this thread and is inherited by the threads spawned after it.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGINT);
            libc::sigaddset(&mut set, libc::SIGTERM);
            libc::sigaddset(&mut set, libc::SIGHUP);
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
            StopSignals(set)
        }
    }

    /// Waits for one of them; returns its number (one sent meanwhile waits for the next
    /// call: a reload asked for during a reload is done after it).
    pub fn wait(&self) -> i32 {
        let mut sig = 0;
        // SAFETY: the set is initialized; `sig` is a valid out-pointer.
        unsafe { libc::sigwait(&self.0, &mut sig) };
        sig
    }
}

/// Takes an exclusive advisory lock on `f` (`flock`), waiting for it; released when the
/// file closes.
pub fn lock_exclusive(f: &impl AsRawFd) -> io::Result<()> {
    // SAFETY: flock on a descriptor the caller holds open.
    cvt(unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) })?;
    Ok(())
}

/// A copy of `fd` that is not close-on-exec: to hand to the next program image.
pub fn dup_inheritable(fd: &impl AsRawFd) -> io::Result<OwnedFd> {
    // SAFETY: dup of a descriptor the caller holds open.
    let n = cvt(unsafe { libc::dup(fd.as_raw_fd()) })?;
    // SAFETY: `n` is a new descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(n) })
}

/// One descriptor to wait on and what for (`poll`'s `POLLIN`/`POLLOUT`).
#[derive(Clone, Copy, Debug)]
pub struct Interest {
    /// The descriptor.
    pub fd: RawFd,
    /// Wait until it is readable.
    pub read: bool,
    /// Wait until it is writable.
    pub write: bool,
}

/// Waits until one of `fds` is ready as asked, or `timeout_ms` has passed (`poll`);
/// returns how many are ready. An entry asking for nothing is skipped by the kernel.
pub fn wait_any(fds: &[Interest], timeout_ms: i32) -> io::Result<usize> {
    let mut p: Vec<libc::pollfd> = fds
        .iter()
        .map(|i| libc::pollfd {
            fd: i.fd,
            events: if i.read { libc::POLLIN } else { 0 } | if i.write { libc::POLLOUT } else { 0 },
            revents: 0,
        })
        .collect();
    // SAFETY: `p` holds `p.len()` initialized pollfds, live for the call.
    let n = cvt(unsafe { libc::poll(p.as_mut_ptr(), p.len() as libc::nfds_t, timeout_ms) })?;
    Ok(n as usize)
}

/// CPU seconds (user + system) of this process's waited-for children so far.
pub fn children_cpu_seconds() -> f64 {
    // SAFETY: getrusage fills the zeroed struct it is given; RUSAGE_CHILDREN takes nothing else.
    let r = unsafe {
        let mut r: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_CHILDREN, &mut r);
        r
    };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(r.ru_utime) + tv(r.ru_stime)
}

/// Sets an integer socket option (`setsockopt(fd, level, name, &value)`).
pub fn set_int_option(fd: &impl AsRawFd, level: i32, name: i32, value: i32) -> io::Result<()> {
    let v: libc::c_int = value;
    // SAFETY: `v` is a live c_int of the size passed; the descriptor is the caller's.
    cvt(unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (&raw const v).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pipe_with_bytes_is_ready_to_read_and_an_empty_one_times_out() {
        let (r, mut w) = std::io::pipe().unwrap();
        let want = [Interest { fd: r.as_raw_fd(), read: true, write: false }];
        assert_eq!(wait_any(&want, 0).unwrap(), 0);
        std::io::Write::write_all(&mut w, b"x").unwrap();
        assert_eq!(wait_any(&want, 1000).unwrap(), 1);
        let copy = dup_inheritable(&r).unwrap();
        assert_ne!(copy.as_raw_fd(), r.as_raw_fd());
    }

    #[test]
    fn a_file_made_under_the_mask_has_its_mode_and_the_mask_is_restored_after() {
        use std::os::unix::fs::PermissionsExt;
        let d = crate::fs::TempDir::new("sluice-umask").unwrap();
        let made = |name: &str| {
            std::fs::File::create(d.path().join(name)).unwrap();
            std::fs::metadata(d.path().join(name)).unwrap().permissions().mode() & 0o777
        };
        assert_eq!(with_umask(0o177, || made("inner")), 0o600);
        let after = with_umask(0o022, || made("outer"));
        assert_eq!(after, 0o644);
    }
}

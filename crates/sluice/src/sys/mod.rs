//! Thin wrappers around the Linux system calls sluice needs and the standard library does
//! not offer: TUN/TAP ioctls, epoll, eventfd, network-namespace switching. Every `unsafe`
//! block of the daemon lives here, each with its SAFETY note.

pub mod epoll;
pub mod netns;
pub mod tun;

use std::io;

/// Turns a libc return value into an `io::Result`, reading errno on -1.
pub(crate) fn cvt<T: PartialOrd + Default>(ret: T) -> io::Result<T> {
    if ret < T::default() { Err(io::Error::last_os_error()) } else { Ok(ret) }
}

/// Sets the scheduling niceness of the calling thread (Linux applies `setpriority` per
/// thread when given a thread id).
pub fn set_thread_nice(nice: i32) -> io::Result<()> {
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() };
    // SAFETY: setpriority on our own thread id; no pointers involved.
    cvt(unsafe { libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, nice) })?;
    Ok(())
}

/// Sends `sig` to process `pid`.
pub fn kill(pid: u32, sig: i32) -> io::Result<()> {
    // SAFETY: kill(2) has no memory-safety preconditions; the caller decides the target.
    cvt(unsafe { libc::kill(pid as libc::pid_t, sig) })?;
    Ok(())
}

/// Restores the default SIGPIPE action, so that printing into a closed pipe (`| head`) ends
/// the process quietly, as other command-line tools do, instead of a panic. Only for
/// commands whose remaining work is printing: the Rust runtime ignores SIGPIPE so that
/// socket writes fail with EPIPE instead, which the daemons rely on.
pub fn default_sigpipe() {
    // SAFETY: installs the default disposition for one signal; no handler code runs.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
}

//! Running a piece of work inside a named network namespace (`ip netns` names, bound under
//! /run/netns). `setns` changes only the calling thread, so the work runs on a short-lived
//! thread of its own and never on a thread that serves anything else.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::PathBuf;

use super::cvt;

/// Where `ip netns` keeps named namespaces.
pub const NETNS_DIR: &str = "/run/netns";

/// Path of the named namespace.
pub fn path(name: &str) -> PathBuf {
    PathBuf::from(NETNS_DIR).join(name)
}

/// True if a namespace of that name exists.
pub fn exists(name: &str) -> bool {
    path(name).exists()
}

/// Runs `f` on a new thread inside namespace `name` (or in the current one for `None`) and
/// returns its result.
pub fn run_in<T: Send + 'static>(
    name: Option<&str>,
    f: impl FnOnce() -> io::Result<T> + Send + 'static,
) -> io::Result<T> {
    let target = match name {
        Some(n) => Some(File::open(path(n)).map_err(|e| {
            io::Error::new(e.kind(), format!("cannot open network namespace {n:?} ({}): {e}", path(n).display()))
        })?),
        None => None,
    };
    std::thread::spawn(move || {
        if let Some(ns) = target {
            // SAFETY: `ns` is an open namespace file; setns affects only this thread, which
            // exits when `f` returns.
            cvt(unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) })?;
        }
        f()
    })
    .join()
    .map_err(|_| io::Error::other("a thread working in a network namespace panicked"))?
}

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

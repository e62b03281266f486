//! epoll and eventfd, level-triggered, for the datapath's event loop.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use super::cvt;

/// An epoll instance.
pub struct Epoll {
    fd: OwnedFd,
}

/// Readiness of one registered descriptor.
#[derive(Clone, Copy, Debug)]
pub struct Event {
    /// The token given at registration.
    pub token: u64,
    /// Readable (or hung up / in error: a read will tell).
    pub readable: bool,
    /// Writable.
    pub writable: bool,
}

fn mask(read: bool, write: bool) -> u32 {
    let mut m = 0;
    if read {
        m |= libc::EPOLLIN as u32;
    }
    if write {
        m |= libc::EPOLLOUT as u32;
    }
    m
}

impl Epoll {
    /// A new epoll instance (close-on-exec).
    pub fn new() -> io::Result<Self> {
        // SAFETY: plain syscall; the returned descriptor is owned by us from here on.
        let fd = cvt(unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) })?;
        // SAFETY: `fd` is a fresh, valid descriptor nobody else owns.
        Ok(Epoll { fd: unsafe { OwnedFd::from_raw_fd(fd) } })
    }

    fn ctl(&self, op: i32, fd: RawFd, token: u64, read: bool, write: bool) -> io::Result<()> {
        let mut ev = libc::epoll_event { events: mask(read, write), u64: token };
        // SAFETY: `ev` is a valid epoll_event for the duration of the call.
        cvt(unsafe { libc::epoll_ctl(self.fd.as_raw_fd(), op, fd, &mut ev) })?;
        Ok(())
    }

    /// Watches `fd` under `token`.
    pub fn add(&self, fd: RawFd, token: u64, read: bool, write: bool) -> io::Result<()> {
        self.ctl(libc::EPOLL_CTL_ADD, fd, token, read, write)
    }

    /// Changes what `fd` is watched for.
    pub fn modify(&self, fd: RawFd, token: u64, read: bool, write: bool) -> io::Result<()> {
        self.ctl(libc::EPOLL_CTL_MOD, fd, token, read, write)
    }

    /// Stops watching `fd`.
    pub fn delete(&self, fd: RawFd) -> io::Result<()> {
        self.ctl(libc::EPOLL_CTL_DEL, fd, 0, false, false)
    }

    /// Waits up to `timeout_ms` (-1: forever, 0: poll) and fills `out` with ready events.
    pub fn wait(&self, buf: &mut [libc::epoll_event], timeout_ms: i32, out: &mut Vec<Event>) -> io::Result<()> {
        out.clear();
        // SAFETY: `buf` is valid for `buf.len()` events and outlives the call.
        let n = unsafe { libc::epoll_wait(self.fd.as_raw_fd(), buf.as_mut_ptr(), buf.len() as i32, timeout_ms) };
        if n < 0 {
            let e = io::Error::last_os_error();
            return if e.kind() == io::ErrorKind::Interrupted { Ok(()) } else { Err(e) };
        }
        for ev in &buf[..n as usize] {
            let bits = ev.events;
            let hup = bits & (libc::EPOLLHUP | libc::EPOLLERR) as u32 != 0;
            out.push(Event {
                token: ev.u64,
                readable: bits & libc::EPOLLIN as u32 != 0 || hup,
                writable: bits & libc::EPOLLOUT as u32 != 0,
            });
        }
        Ok(())
    }
}

/// An eventfd used to wake the event loop from another thread.
pub struct EventFd {
    fd: OwnedFd,
}

impl EventFd {
    /// A new non-blocking eventfd.
    pub fn new() -> io::Result<Self> {
        // SAFETY: plain syscall returning a fresh descriptor.
        let fd = cvt(unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) })?;
        // SAFETY: `fd` is fresh and owned by nobody else.
        Ok(EventFd { fd: unsafe { OwnedFd::from_raw_fd(fd) } })
    }

    /// Wakes the waiter.
    pub fn notify(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a valid u64; a full counter (EAGAIN) means a wake-up
        // is already pending, which is all we want.
        unsafe { libc::write(self.fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    /// Clears pending wake-ups.
    pub fn drain(&self) {
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into a valid u64; EAGAIN when nothing is pending is fine.
        unsafe { libc::read(self.fd.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
    }
}

impl AsRawFd for EventFd {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

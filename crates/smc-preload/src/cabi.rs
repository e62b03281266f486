//! The C interface the library shares with libc, declared by hand (the library has no
//! dependencies): the structs the socket calls take, laid out as glibc's, and the calling
//! thread's errno. It uses nothing else of the library, so both the real functions
//! (`crate::real`) and the wrappers over them (`crate::sys`) stand on it.

use std::ffi::{c_int, c_void};

unsafe extern "C" {
    fn __errno_location() -> *mut c_int;
}

/// The calling thread's errno.
pub fn errno() -> c_int {
    // SAFETY: glibc's per-thread errno location is always valid.
    unsafe { *__errno_location() }
}

/// Sets the calling thread's errno.
pub fn set_errno(e: c_int) {
    // SAFETY: as above.
    unsafe { *__errno_location() = e }
}

/// `struct pollfd`.
#[repr(C)]
pub struct PollFd {
    pub fd: c_int,
    pub events: i16,
    pub revents: i16,
}

/// `struct iovec`.
#[repr(C)]
pub struct IoVec {
    pub base: *mut c_void,
    pub len: usize,
}

/// `struct msghdr`.
#[repr(C)]
pub struct MsgHdr {
    pub name: *mut c_void,
    pub namelen: u32,
    pub iov: *mut IoVec,
    pub iovlen: usize,
    pub control: *mut c_void,
    pub controllen: usize,
    pub flags: c_int,
}

/// `struct mmsghdr`.
#[repr(C)]
pub struct MMsgHdr {
    /// The message.
    pub hdr: MsgHdr,
    /// The bytes it moved, as the call returns them.
    pub len: u32,
}

//! The functions the hooks stand in front of, found with `dlsym(RTLD_NEXT)` once and kept
//! in atomics. Everything the library itself does with sockets goes through these, so it
//! never re-enters its own hooks.

use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::atomic::{AtomicPtr, Ordering};

use crate::cabi::{IoVec, MMsgHdr, MsgHdr, PollFd};

unsafe extern "C" {
    fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void;
}

/// glibc's RTLD_NEXT: the next object after this one in the search order.
const RTLD_NEXT: *mut c_void = -1isize as *mut c_void;

fn lookup(slot: &AtomicPtr<c_void>, name: &CStr) -> *mut c_void {
    let p = slot.load(Ordering::Relaxed);
    if !p.is_null() {
        return p;
    }
    // SAFETY: dlsym with RTLD_NEXT and a NUL-terminated name.
    let p = unsafe { dlsym(RTLD_NEXT, name.as_ptr()) };
    slot.store(p, Ordering::Relaxed);
    p
}

/// What a C function answers when it fails: -1, or a null pointer.
trait Failed {
    const FAILED: Self;
}

impl Failed for c_int {
    const FAILED: Self = -1;
}

impl Failed for isize {
    const FAILED: Self = -1;
}

impl Failed for i64 {
    const FAILED: Self = -1;
}

impl Failed for *mut c_void {
    const FAILED: Self = std::ptr::null_mut();
}

macro_rules! real {
    ($( $name:ident ( $($arg:ident : $ty:ty),* ) -> $ret:ty; )*) => {
        mod slot {
            #![allow(non_upper_case_globals)]
            use std::ffi::c_void;
            use std::sync::atomic::AtomicPtr;
            $( pub static $name: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut()); )*
        }
        $(
            #[doc = concat!("The real `", stringify!($name), "`.\n\n# Safety\nAs for the C function.")]
            pub unsafe fn $name($($arg: $ty),*) -> $ret {
                // The name is made a C string only when the slot is empty (before the
                // constructor ran): on every other call one load.
                let f = slot::$name.load(Ordering::Relaxed);
                let f = if f.is_null() { lookup(&slot::$name, name_of(concat!(stringify!($name), "\0"))) } else { f };
                if f.is_null() {
                    crate::cabi::set_errno(38); // ENOSYS
                    return <$ret as Failed>::FAILED;
                }
                // SAFETY: `f` is libc's function of this name, whose C signature this is.
                let f: unsafe extern "C" fn($($ty),*) -> $ret = unsafe { std::mem::transmute(f) };
                // SAFETY: the caller's arguments, unchanged.
                unsafe { f($($arg),*) }
            }
        )*
        /// Looks every real function up (the constructor calls this, so hooks do not call
        /// dlsym, which may allocate).
        pub fn resolve() {
            $( lookup(&slot::$name, name_of(concat!(stringify!($name), "\0"))); )*
        }
    };
}

/// A NUL-terminated literal as a `CStr`.
fn name_of(s: &'static str) -> &'static CStr {
    CStr::from_bytes_with_nul(s.as_bytes()).unwrap_or(c"")
}

real! {
    connect(fd: c_int, addr: *const c_void, len: u32) -> c_int;
    listen(fd: c_int, backlog: c_int) -> c_int;
    accept(fd: c_int, addr: *mut c_void, len: *mut u32) -> c_int;
    accept4(fd: c_int, addr: *mut c_void, len: *mut u32, flags: c_int) -> c_int;
    close(fd: c_int) -> c_int;
    read(fd: c_int, buf: *mut c_void, n: usize) -> isize;
    write(fd: c_int, buf: *const c_void, n: usize) -> isize;
    readv(fd: c_int, iov: *const IoVec, n: c_int) -> isize;
    writev(fd: c_int, iov: *const IoVec, n: c_int) -> isize;
    send(fd: c_int, buf: *const c_void, n: usize, flags: c_int) -> isize;
    recv(fd: c_int, buf: *mut c_void, n: usize, flags: c_int) -> isize;
    sendto(fd: c_int, buf: *const c_void, n: usize, flags: c_int, addr: *const c_void, len: u32) -> isize;
    recvfrom(fd: c_int, buf: *mut c_void, n: usize, flags: c_int, addr: *mut c_void, len: *mut u32) -> isize;
    sendmsg(fd: c_int, msg: *mut MsgHdr, flags: c_int) -> isize;
    recvmsg(fd: c_int, msg: *mut MsgHdr, flags: c_int) -> isize;
    poll(fds: *mut PollFd, n: u64, timeout: c_int) -> c_int;
    epoll_wait(epfd: c_int, events: *mut c_void, max: c_int, timeout: c_int) -> c_int;
    epoll_pwait(epfd: c_int, events: *mut c_void, max: c_int, timeout: c_int, mask: *const c_void) -> c_int;
    epoll_pwait2(epfd: c_int, events: *mut c_void, max: c_int, timeout: *const c_void, mask: *const c_void) -> c_int;
    ppoll(fds: *mut PollFd, n: u64, timeout: *const c_void, mask: *const c_void) -> c_int;
    pselect(n: c_int, r: *mut c_void, w: *mut c_void, e: *mut c_void, timeout: *const c_void, mask: *const c_void) -> c_int;
    epoll_create1(flags: c_int) -> c_int;
    epoll_create(size: c_int) -> c_int;
    epoll_ctl(epfd: c_int, op: c_int, fd: c_int, event: *mut c_void) -> c_int;
    select(n: c_int, r: *mut c_void, w: *mut c_void, e: *mut c_void, timeout: *mut c_void) -> c_int;
    socket(domain: c_int, kind: c_int, proto: c_int) -> c_int;
    socketpair(domain: c_int, kind: c_int, proto: c_int, fds: *mut c_int) -> c_int;
    bind(fd: c_int, addr: *const c_void, len: u32) -> c_int;
    getsockname(fd: c_int, addr: *mut c_void, len: *mut u32) -> c_int;
    getpeername(fd: c_int, addr: *mut c_void, len: *mut u32) -> c_int;
    getsockopt(fd: c_int, level: c_int, name: c_int, val: *mut c_void, len: *mut u32) -> c_int;
    setsockopt(fd: c_int, level: c_int, name: c_int, val: *const c_void, len: u32) -> c_int;
    shutdown(fd: c_int, how: c_int) -> c_int;
    dup(fd: c_int) -> c_int;
    dup2(fd: c_int, to: c_int) -> c_int;
    dup3(fd: c_int, to: c_int, flags: c_int) -> c_int;
    close_range(first: u32, last: u32, flags: c_int) -> c_int;
    prctl(option: c_int, a2: u64, a3: u64, a4: u64, a5: u64) -> c_int;
    sendfile(out: c_int, input: c_int, offset: *mut i64, n: usize) -> isize;
    sendfile64(out: c_int, input: c_int, offset: *mut i64, n: usize) -> isize;
    splice(input: c_int, off_in: *mut i64, out: c_int, off_out: *mut i64, n: usize, flags: u32) -> isize;
    pread64(fd: c_int, buf: *mut c_void, n: usize, offset: i64) -> isize;
    lseek64(fd: c_int, offset: i64, whence: c_int) -> i64;
    sendmmsg(fd: c_int, msgs: *mut MMsgHdr, n: u32, flags: c_int) -> c_int;
    recvmmsg(fd: c_int, msgs: *mut MMsgHdr, n: u32, flags: c_int, timeout: *mut c_void) -> c_int;
    execve(path: *const c_char, argv: *const *const c_char, envp: *const *const c_char) -> c_int;
    execvpe(file: *const c_char, argv: *const *const c_char, envp: *const *const c_char) -> c_int;
    fexecve(fd: c_int, argv: *const *const c_char, envp: *const *const c_char) -> c_int;
    fdopen(fd: c_int, mode: *const c_char) -> *mut c_void;
}

/// The real `ioctl` (variadic: one integer or pointer argument).
///
/// # Safety
/// As for `ioctl(2)`.
pub unsafe fn ioctl(fd: c_int, req: std::ffi::c_ulong, arg: usize) -> c_int {
    static SLOT: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
    let f = lookup(&SLOT, c"ioctl");
    if f.is_null() {
        crate::cabi::set_errno(38);
        return -1;
    }
    // SAFETY: libc's ioctl, called with its one variadic argument.
    let f: unsafe extern "C" fn(c_int, std::ffi::c_ulong, ...) -> c_int = unsafe { std::mem::transmute(f) };
    // SAFETY: the caller's arguments.
    unsafe { f(fd, req, arg) }
}

/// The real `fcntl` (variadic: one integer or pointer argument).
///
/// # Safety
/// As for `fcntl(2)`.
pub unsafe fn fcntl(fd: c_int, cmd: c_int, arg: usize) -> c_int {
    static SLOT: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
    let f = lookup(&SLOT, c"fcntl");
    if f.is_null() {
        crate::cabi::set_errno(38);
        return -1;
    }
    // SAFETY: libc's fcntl, called with its one variadic argument.
    let f: unsafe extern "C" fn(c_int, c_int, ...) -> c_int = unsafe { std::mem::transmute(f) };
    // SAFETY: the caller's arguments.
    unsafe { f(fd, cmd, arg) }
}

//! The functions the hooks stand in front of, found with `dlsym(RTLD_NEXT)`.

use std::ffi::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicPtr, Ordering};

unsafe extern "C" {
    fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void;
}

/// glibc's RTLD_NEXT: the next object after this one in the search order.
const RTLD_NEXT: *mut c_void = -1isize as *mut c_void;

static CONNECT: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());

/// Looks every real function up once (the library's constructor calls this).
pub fn resolve() {
    // SAFETY: dlsym with RTLD_NEXT and a NUL-terminated name.
    let p = unsafe { dlsym(RTLD_NEXT, c"connect".as_ptr()) };
    CONNECT.store(p, Ordering::Relaxed);
}

fn get(slot: &AtomicPtr<c_void>, name: &std::ffi::CStr) -> *mut c_void {
    let p = slot.load(Ordering::Relaxed);
    if !p.is_null() {
        return p;
    }
    // Called before the constructor ran (another library's constructor): look it up now.
    // SAFETY: as in `resolve`.
    let p = unsafe { dlsym(RTLD_NEXT, name.as_ptr()) };
    slot.store(p, Ordering::Relaxed);
    p
}

/// The real `connect`.
///
/// # Safety
/// As for `connect(2)`.
pub unsafe fn connect(fd: c_int, addr: *const c_void, len: u32) -> c_int {
    let f = get(&CONNECT, c"connect");
    if f.is_null() {
        // SAFETY: the raw system call takes the same arguments.
        return unsafe { syscall(SYS_CONNECT, fd, addr, len) } as c_int;
    }
    // SAFETY: `f` is libc's connect, whose signature this is.
    let f: unsafe extern "C" fn(c_int, *const c_void, u32) -> c_int = unsafe { std::mem::transmute(f) };
    // SAFETY: the caller's arguments, unchanged.
    unsafe { f(fd, addr, len) }
}

unsafe extern "C" {
    fn syscall(n: i64, ...) -> i64;
}

#[cfg(target_arch = "x86_64")]
const SYS_CONNECT: i64 = 42;
#[cfg(target_arch = "aarch64")]
const SYS_CONNECT: i64 = 203;

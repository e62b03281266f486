//! C stdio on a moved connection.
//!
//! glibc's `FILE` streams read and write their descriptor with its own internal `read`
//! and `write`, which the library cannot stand in front of: a program that reads or
//! writes a moved connection through stdio — an inetd-style service on its standard
//! input and output (git's `upload-pack` answers `ls-refs` with `fwrite` to `stdout`), a
//! server that `fdopen`s its socket — would move bytes on the doorbell socket behind the
//! descriptor instead. So such a stream is a `fopencookie` stream whose reads and writes
//! are the program's own `read` and `write` calls, through the library's hooks: `fdopen`
//! of a moved descriptor answers one, and a program run with its standard streams on a
//! connection (crate::carry) gets `stdin`, `stdout` and `stderr` replaced before `main`.
//! Each stream's `fileno` is its descriptor, as a file stream's is.

use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::{cabi, marked, sys};

#[repr(C)]
struct CookieIo {
    read: Option<extern "C" fn(*mut c_void, *mut c_char, usize) -> isize>,
    write: Option<extern "C" fn(*mut c_void, *const c_char, usize) -> isize>,
    seek: Option<extern "C" fn(*mut c_void, *mut i64, c_int) -> c_int>,
    close: Option<extern "C" fn(*mut c_void) -> c_int>,
}

unsafe extern "C" {
    fn fopencookie(cookie: *mut c_void, mode: *const c_char, io: CookieIo) -> *mut c_void;
    fn setvbuf(f: *mut c_void, buf: *mut c_char, mode: c_int, size: usize) -> c_int;
    fn fileno(f: *mut c_void) -> c_int;
    fn fflush(f: *mut c_void) -> c_int;
    static mut stdin: *mut c_void;
    static mut stdout: *mut c_void;
    static mut stderr: *mut c_void;
}

/// `_IONBF`: no buffering (stderr's).
const IONBF: c_int = 2;

/// The offset of `_fileno` in glibc's `struct _IO_FILE` on LP64 (the flags word and its
/// padding, eleven buffer pointers, the markers and the chain): checked against the
/// standard streams before it is ever written ([`layout_known`]).
const FILENO_AT: usize = 112;

fn fd_of(cookie: *mut c_void) -> c_int {
    cookie as usize as c_int
}

extern "C" fn cookie_read(cookie: *mut c_void, buf: *mut c_char, n: usize) -> isize {
    // SAFETY: stdio's buffer of `n` bytes, read through the library's own hook.
    unsafe { crate::read(fd_of(cookie), buf.cast(), n) }
}

fn nonblocking(fd: c_int) -> bool {
    // SAFETY: F_GETFL reads the descriptor's flags (through the hook, which knows a
    // moved descriptor's).
    let fl = unsafe { crate::fcntl(fd, sys::F_GETFL, 0) };
    fl >= 0 && fl & sys::O_NONBLOCK != 0
}

/// Writes all of it (stdio takes a short write for an error): a non-blocking
/// descriptor's `EAGAIN` waits for room.
extern "C" fn cookie_write(cookie: *mut c_void, buf: *const c_char, n: usize) -> isize {
    let fd = fd_of(cookie);
    let mut off = 0usize;
    while off < n {
        // SAFETY: stdio's buffer of `n` bytes, written through the library's own hook.
        let r = unsafe { crate::write(fd, buf.add(off).cast(), n - off) };
        if r > 0 {
            off += r as usize;
            continue;
        }
        if r == 0 {
            break;
        }
        match cabi::errno() {
            sys::EINTR => {}
            // (On a blocking descriptor `EAGAIN` is its send timeout running out: an error.)
            sys::EAGAIN if nonblocking(fd) => {
                let mut p = [cabi::PollFd { fd, events: 0x4, revents: 0 }];
                // SAFETY: one pollfd, through the library's own hook.
                unsafe { crate::waits::poll(p.as_mut_ptr(), 1, 1000) };
            }
            _ => return if off > 0 { off as isize } else { -1 },
        }
    }
    off as isize
}

extern "C" fn cookie_close(cookie: *mut c_void) -> c_int {
    // SAFETY: the stream's descriptor, closed as `fclose` would, through the hook.
    unsafe { crate::close(fd_of(cookie)) }
}

/// True when the standard streams show `_fileno` where [`FILENO_AT`] says.
fn layout_known() -> bool {
    // SAFETY: glibc's standard streams, read where `_fileno` is on LP64 glibc; each
    // stream object is far larger than the offset.
    unsafe {
        let ok = |f: *mut c_void, n: c_int| {
            !f.is_null() && fileno(f) == n && f.cast::<u8>().add(FILENO_AT).cast::<c_int>().read_unaligned() == n
        };
        cfg!(target_pointer_width = "64") && ok(stdin, 0) && ok(stdout, 1) && ok(stderr, 2)
    }
}

/// A stream of mode `mode` on moved descriptor `fd`; null if none could be made.
fn stream(fd: c_int, mode: &CStr) -> *mut c_void {
    // Looked at once, on the standard streams as they were.
    static KNOWN: OnceLock<bool> = OnceLock::new();
    if !*KNOWN.get_or_init(layout_known) {
        return std::ptr::null_mut();
    }
    let io = CookieIo { read: Some(cookie_read), write: Some(cookie_write), seek: None, close: Some(cookie_close) };
    // SAFETY: a cookie that is the descriptor's number (never dereferenced).
    let f = unsafe { fopencookie(fd as usize as *mut c_void, mode.as_ptr(), io) };
    if !f.is_null() {
        MADE.store(true, Ordering::Relaxed);
        // SAFETY: a stream glibc just made (a cookie file begins with struct _IO_FILE,
        // whose `_fileno` is at FILENO_AT, as checked): `fileno` answers the descriptor.
        unsafe { f.cast::<u8>().add(FILENO_AT).cast::<c_int>().write_unaligned(fd) };
    }
    f
}

/// Whether any stream of ours was made.
static MADE: AtomicBool = AtomicBool::new(false);

/// At exit, before the connections end: glibc flushes its streams only after every
/// `atexit` handler, when a connection would no longer take the bytes.
pub fn flush_ours() {
    if MADE.load(Ordering::Relaxed) {
        // SAFETY: fflush(NULL) flushes every open stream, as exit would.
        unsafe { fflush(std::ptr::null_mut()) };
    }
}

/// `fdopen` of descriptor `fd`: a stream through the hooks if it is a moved connection's;
/// `None` to let glibc make an ordinary one.
pub fn fdopen(fd: c_int, mode: &CStr) -> Option<*mut c_void> {
    if !marked(fd) {
        return None;
    }
    let f = stream(fd, mode);
    (!f.is_null()).then_some(f)
}

/// Before `main` of a program run with connections: each standard stream whose
/// descriptor is a moved connection's reads and writes it through the hooks.
pub fn take_over_standard_streams() {
    for (fd, mode) in [(0, c"r"), (1, c"w"), (2, c"w")] {
        if !marked(fd) {
            continue;
        }
        let f = stream(fd, mode);
        if f.is_null() {
            continue;
        }
        // SAFETY: the constructor runs before `main`, when the program has not used its
        // standard streams yet (a thread another library's constructor started is not
        // expected to); glibc's own stay valid, and empty.
        unsafe {
            match fd {
                0 => stdin = f,
                1 => stdout = f,
                _ => {
                    setvbuf(f, std::ptr::null_mut(), IONBF, 0);
                    stderr = f;
                }
            }
        }
    }
}

//! The calls that move bytes without a user buffer — `sendfile`, `splice` — and the
//! `ioctl`s that count bytes, on a moved socket (docs/architecture.md, "The fast path,
//! part 2"). A moved socket's descriptor is the doorbell socketpair: passed to the kernel,
//! these calls would write the payload into it (lost, or a hung writer) or read doorbell
//! bytes as data. Here they go through the rings; what the kernel refuses for a TCP socket
//! is refused the same way.

use std::ffi::{c_int, c_void};

use crate::cabi::{self, MMsgHdr, MsgHdr};
use crate::conn::{Conn, Io, ReadSource};
use crate::{active, conn_of, guard, marked, real, ret, smc_recvmsg, smc_sendmsg, sys};

/// The most one call moves, as the kernel caps `sendfile` and `splice`.
const MAX_RW: usize = 0x7fff_f000;
const ESPIPE: c_int = 29;
const SEEK_SET: c_int = 0;
const SEEK_CUR: c_int = 1;
const SPLICE_F_NONBLOCK: u32 = 2;
/// `fcntl(F_GETPIPE_SZ)`: succeeds on pipes only.
const F_GETPIPE_SZ: c_int = 1032;

/// The moved connection behind `fd`, if it is one — a pending one once its server
/// decided (these calls do not run while the outcome is open: crate::pending).
fn moved(fd: c_int) -> Option<std::sync::Arc<Conn>> {
    let c = if active() && marked(fd) { conn_of(fd)? } else { return None };
    if c.is_pending() && !matches!(crate::pending::settle(fd, &c), Ok(true)) {
        return None;
    }
    Some(c)
}

fn fail(e: c_int) -> isize {
    cabi::set_errno(e);
    -1
}

fn cvt(n: isize) -> Io {
    if n < 0 { Err(cabi::errno()) } else { Ok(n as usize) }
}

/// `sendfile` to moved socket `fd` from `input` at `*offset` (or the file's position,
/// which moves by what was sent, when `offset` is null).
fn smc_sendfile(c: &Conn, fd: c_int, input: c_int, offset: *mut i64, count: usize) -> isize {
    c.tally.tx_call();
    let count = count.min(MAX_RW);
    if moved(input).is_some() {
        // A socket cannot be sendfile's source (the kernel says EINVAL for TCP too).
        return fail(sys::EINVAL);
    }
    let start = if offset.is_null() {
        // SAFETY: lseek on the caller's descriptor.
        match unsafe { real::lseek64(input, 0, SEEK_CUR) } {
            // Not seekable (a pipe): read in order; never more than the ring takes, so
            // nothing read is left over.
            -1 if cabi::errno() == ESPIPE => -1,
            -1 => return fail(cabi::errno()),
            p => p,
        }
    } else {
        // SAFETY: the caller's offset word.
        let p = unsafe { *offset };
        if p < 0 {
            return fail(sys::EINVAL);
        }
        p
    };
    if count == 0 {
        return 0;
    }
    let mut pos = start;
    let mut src = ReadSource::new(|buf: &mut [u8]| {
        if pos < 0 {
            // SAFETY: reads into a live buffer of its length.
            return cvt(unsafe { real::read(input, buf.as_mut_ptr().cast(), buf.len()) });
        }
        // SAFETY: reads into a live buffer of its length.
        let n = cvt(unsafe { real::pread64(input, buf.as_mut_ptr().cast(), buf.len(), pos) })?;
        pos += n as i64;
        Ok(n)
    });
    let r = c.write_from(fd, 0, count, &mut src);
    if let Ok(n) = r
        && start >= 0
    {
        let end = start + n as i64;
        if offset.is_null() {
            // SAFETY: as above.
            unsafe { real::lseek64(input, end, SEEK_SET) };
        } else {
            // SAFETY: the caller's offset word.
            unsafe { *offset = end };
        }
    }
    ret(r, false)
}

/// `sendfile(2)`.
///
/// # Safety
/// As for `sendfile(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sendfile(out: c_int, input: c_int, offset: *mut i64, count: usize) -> isize {
    if let Some(c) = moved(out) {
        return guard(|| smc_sendfile(&c, out, input, offset, count), || fail(sys::EINVAL));
    }
    // SAFETY: the caller's arguments.
    unsafe { real::sendfile(out, input, offset, count) }
}

/// `sendfile64` (the same on 64-bit Linux).
///
/// # Safety
/// As for `sendfile(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sendfile64(out: c_int, input: c_int, offset: *mut i64, count: usize) -> isize {
    if let Some(c) = moved(out) {
        return guard(|| smc_sendfile(&c, out, input, offset, count), || fail(sys::EINVAL));
    }
    // SAFETY: the caller's arguments.
    unsafe { real::sendfile64(out, input, offset, count) }
}

fn is_pipe(fd: c_int) -> bool {
    // SAFETY: F_GETPIPE_SZ takes no argument.
    unsafe { real::fcntl(fd, F_GETPIPE_SZ, 0) >= 0 }
}

/// Whether `fd` is ready for `events` now (no wait).
fn ready(fd: c_int, events: i16) -> bool {
    sys::wait(fd, events, 0).unwrap_or(true)
}

/// `splice` with a moved socket on one side, which must have a pipe on the other.
fn smc_splice(input: c_int, off_in: *mut i64, out: c_int, off_out: *mut i64, len: usize, flags: u32) -> isize {
    let (cin, cout) = (moved(input), moved(out));
    let pipe_fd = if cin.is_some() { out } else { input };
    if cin.is_some() && cout.is_some() || !is_pipe(pipe_fd) {
        return fail(sys::EINVAL);
    }
    if !off_in.is_null() || !off_out.is_null() {
        // Neither a socket nor a pipe has a position.
        return fail(ESPIPE);
    }
    let len = len.min(MAX_RW);
    if len == 0 {
        return 0;
    }
    let nonblock = flags & SPLICE_F_NONBLOCK != 0;
    if let Some(c) = cout {
        // Pipe → ring: what the pipe has now (waiting only for a first byte, unless
        // SPLICE_F_NONBLOCK), never more than the ring takes.
        c.tally.tx_call();
        let mut first = true;
        let mut src = ReadSource::new(|buf: &mut [u8]| {
            if !ready(input, sys::POLLIN) {
                if !first {
                    return Ok(0);
                }
                if nonblock {
                    return Err(sys::EAGAIN);
                }
            }
            first = false;
            // SAFETY: reads into a live buffer of its length.
            cvt(unsafe { real::read(input, buf.as_mut_ptr().cast(), buf.len()) })
        });
        return ret(c.write_from(out, 0, len, &mut src), false);
    }
    let c = cin.expect("one side is moved");
    // Ring → pipe: the pipe takes what it can; only that leaves the ring. Without
    // SPLICE_F_NONBLOCK the write waits for the pipe (as the kernel's splice does); with
    // it, at most one pipe buffer's worth, and only if the pipe has room.
    c.tally.rx_call();
    if nonblock && !ready(out, sys::POLLOUT) {
        return fail(sys::EAGAIN);
    }
    let max = if nonblock { len.min(4096) } else { len };
    let r = c.read_to(input, 0, max, &mut |b: &[u8]| {
        // SAFETY: writes from a live buffer of its length.
        cvt(unsafe { real::write(out, b.as_ptr().cast(), b.len()) })
    });
    ret(r, true)
}

/// `splice(2)`.
///
/// # Safety
/// As for `splice(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn splice(
    input: c_int,
    off_in: *mut i64,
    out: c_int,
    off_out: *mut i64,
    len: usize,
    flags: u32,
) -> isize {
    if moved(input).is_some() || moved(out).is_some() {
        return guard(|| smc_splice(input, off_in, out, off_out, len, flags), || fail(sys::EINVAL));
    }
    // SAFETY: the caller's arguments.
    unsafe { real::splice(input, off_in, out, off_out, len, flags) }
}

/// `FIONREAD`/`SIOCINQ`.
const FIONREAD: u32 = 0x541B;
/// `SIOCOUTQ`/`TIOCOUTQ`.
const SIOCOUTQ: u32 = 0x5411;
/// `SIOCOUTQNSD`.
const SIOCOUTQNSD: u32 = 0x894B;
/// `SIOCATMARK`.
const SIOCATMARK: u32 = 0x8905;

/// The answer to a byte-counting `ioctl` on a moved socket, if `req` is one: bytes
/// waiting to be read, bytes written and not yet read by the peer, none in flight, no
/// urgent mark.
pub(crate) fn counted(fd: c_int, req: std::ffi::c_ulong) -> Option<c_int> {
    let req = req as u32;
    if ![FIONREAD, SIOCOUTQ, SIOCOUTQNSD, SIOCATMARK].contains(&req) {
        return None;
    }
    let c = moved(fd)?;
    let n = match req {
        FIONREAD => c.readable_bytes(),
        SIOCOUTQ => c.unread_bytes(),
        _ => 0,
    };
    Some(n.min(c_int::MAX as usize) as c_int)
}

/// Answers a byte-counting `ioctl` on a moved socket (see [`counted`]); `None`: not one.
///
/// # Safety
/// `arg` must be what the caller passed to `ioctl`: for these requests, a pointer to an
/// int.
pub(crate) unsafe fn answer_ioctl(fd: c_int, req: std::ffi::c_ulong, arg: usize) -> Option<c_int> {
    let n = guard(|| counted(fd, req), || None)?;
    if arg == 0 {
        return Some(fail(14) as c_int); // EFAULT
    }
    // SAFETY: for these requests the argument is the caller's int.
    unsafe { *(arg as *mut c_int) = n };
    Some(0)
}

/// MSG_WAITFORONE: only the first message may wait.
const MSG_WAITFORONE: c_int = 0x10000;
/// The most messages one call takes (the kernel's UIO_MAXIOV).
const MAX_MMSG: usize = 1024;

/// The messages of a `sendmmsg`/`recvmmsg` call.
///
/// # Safety
/// `msgs` must point to `n` valid `mmsghdr`s.
unsafe fn messages<'a>(msgs: *mut MMsgHdr, n: u32) -> &'a mut [MMsgHdr] {
    if msgs.is_null() || n == 0 {
        return &mut [];
    }
    // SAFETY: per the caller.
    unsafe { std::slice::from_raw_parts_mut(msgs, (n as usize).min(MAX_MMSG)) }
}

/// Each message in turn through `one` (which returns bytes moved, or -1 with errno set):
/// the count done, or -1 if the first failed; a short transfer ends the call, and so does
/// `stop` (asked before every message after the first).
fn each(msgs: &mut [MMsgHdr], stop: impl Fn() -> bool, mut one: impl FnMut(&mut MsgHdr, usize) -> isize) -> c_int {
    let mut done = 0;
    for (i, m) in msgs.iter_mut().enumerate() {
        if i > 0 && stop() {
            break;
        }
        let want: usize = iov_total(&m.hdr);
        let n = one(&mut m.hdr, i);
        if n < 0 {
            return if done == 0 { -1 } else { done };
        }
        m.len = n as u32;
        done += 1;
        if (n as usize) < want {
            break;
        }
    }
    done
}

fn iov_total(m: &MsgHdr) -> usize {
    if m.iov.is_null() || m.iovlen == 0 {
        return 0;
    }
    // SAFETY: the caller's msghdr names its iovecs.
    unsafe { std::slice::from_raw_parts(m.iov, m.iovlen) }.iter().map(|v| v.len).sum()
}

/// `sendmmsg(2)`.
///
/// # Safety
/// As for `sendmmsg(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sendmmsg(fd: c_int, msgs: *mut MMsgHdr, n: u32, flags: c_int) -> c_int {
    if let Some(c) = moved(fd) {
        // SAFETY: the caller's messages.
        let msgs = unsafe { messages(msgs, n) };
        return guard(|| each(msgs, || false, |m, _| smc_sendmsg(&c, fd, m, flags)), || fail(sys::EINVAL) as c_int);
    }
    // SAFETY: the caller's arguments.
    unsafe { real::sendmmsg(fd, msgs, n, flags) }
}

/// `recvmmsg(2)`: each message waits as `recvmsg` would (or not at all after the first,
/// with `MSG_WAITFORONE`); the timeout is looked at after each message, as the kernel does
/// — the call returns once it has passed (it does not bound the wait for a message).
///
/// # Safety
/// As for `recvmmsg(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn recvmmsg(fd: c_int, msgs: *mut MMsgHdr, n: u32, flags: c_int, timeout: *mut c_void) -> c_int {
    if let Some(c) = moved(fd) {
        // SAFETY: the caller's messages.
        let msgs = unsafe { messages(msgs, n) };
        let deadline = (!timeout.is_null()).then(|| {
            // SAFETY: a non-null timeout is the caller's struct timespec.
            let t = unsafe { *timeout.cast::<[i64; 2]>() };
            std::time::Instant::now() + std::time::Duration::new(t[0].max(0) as u64, t[1].clamp(0, 999_999_999) as u32)
        });
        return guard(
            || {
                each(
                    msgs,
                    || deadline.is_some_and(|d| std::time::Instant::now() >= d),
                    |m, i| {
                        let f = flags & !MSG_WAITFORONE;
                        let f = if i > 0 && flags & MSG_WAITFORONE != 0 { f | sys::MSG_DONTWAIT } else { f };
                        smc_recvmsg(&c, fd, m, f)
                    },
                )
            },
            || fail(sys::EINVAL) as c_int,
        );
    }
    // SAFETY: the caller's arguments.
    unsafe { real::recvmmsg(fd, msgs, n, flags, timeout) }
}

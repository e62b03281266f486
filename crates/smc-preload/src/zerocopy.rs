//! `MSG_ZEROCOPY` (docs/smc.md, "Semantics"): a program that sets `SO_ZEROCOPY` before it
//! connects or listens stays on TCP, counted as `zerocopy` — its completions come with
//! `POLLERR`, which a shared-memory socket cannot raise, and it may wait for them. One
//! that sets it after its connection moved gets what the kernel gives a send it had to
//! copy: each `MSG_ZEROCOPY` send completes at once, and `recvmsg(MSG_ERRQUEUE)` reports
//! them in one notification with `SO_EE_CODE_ZEROCOPY_COPIED` (the buffers may be reused
//! as soon as the send returns).

use std::ffi::c_int;
use std::sync::atomic::Ordering;

use crate::conn::Conn;
use crate::{cabi, sys};

pub const MSG_ZEROCOPY: c_int = 0x400_0000;
const SO_ZEROCOPY: c_int = 60;
const MSG_ERRQUEUE: c_int = 0x2000;
const SO_EE_ORIGIN_ZEROCOPY: u8 = 5;
const SO_EE_CODE_ZEROCOPY_COPIED: u8 = 1;
const MSG_CTRUNC: c_int = 0x8;

/// Whether socket `fd` has `SO_ZEROCOPY` set.
pub fn enabled(fd: c_int) -> bool {
    sys::sockopt_int(fd, sys::SOL_SOCKET, SO_ZEROCOPY).is_some_and(|v| v != 0)
}

/// A send with `flags` moved `n` bytes on `c`: counted if it was a zero-copy send (the
/// kernel numbers only those that sent something, on a socket with `SO_ZEROCOPY`).
pub fn sent(c: &Conn, flags: c_int, n: isize) {
    if flags & MSG_ZEROCOPY != 0 && n > 0 && enabled(c.tcp_fd) {
        c.zc_sent.fetch_add(1, Ordering::Relaxed);
    }
}

/// `recvmsg(MSG_ERRQUEUE)` on `c`: one notification for every zero-copy send not yet
/// reported (`ee_info` the first, `ee_data` the last), or `EAGAIN` when there is none.
pub fn completion(c: &Conn, m: &mut cabi::MsgHdr) -> isize {
    let (lo, hi) = (c.zc_reported.load(Ordering::Relaxed), c.zc_sent.load(Ordering::Relaxed));
    m.namelen = 0;
    m.flags = 0;
    if lo == hi {
        m.controllen = 0;
        cabi::set_errno(sys::EAGAIN);
        return -1;
    }
    // struct cmsghdr (len, level, type) and struct sock_extended_err.
    const LEN: usize = 16 + 16;
    if m.control.is_null() || m.controllen < LEN {
        // As the kernel does: the notification is consumed, and the caller told it did
        // not fit.
        m.controllen = 0;
        m.flags = MSG_ERRQUEUE | MSG_CTRUNC;
        c.zc_reported.store(hi, Ordering::Relaxed);
        return 0;
    }
    let v6 = sys::sockopt_int(c.tcp_fd, sys::SOL_SOCKET, sys::SO_DOMAIN) == Some(sys::AF_INET6);
    // SOL_IP/IP_RECVERR or SOL_IPV6/IPV6_RECVERR.
    let (level, kind): (c_int, c_int) = if v6 { (41, 25) } else { (0, 11) };
    let mut b = [0u8; LEN];
    b[..8].copy_from_slice(&(LEN as u64).to_ne_bytes());
    b[8..12].copy_from_slice(&level.to_ne_bytes());
    b[12..16].copy_from_slice(&kind.to_ne_bytes());
    // ee_errno 0, ee_origin, ee_type 0, ee_code, ee_pad 0, ee_info = lo, ee_data = hi - 1.
    b[20] = SO_EE_ORIGIN_ZEROCOPY;
    b[22] = SO_EE_CODE_ZEROCOPY_COPIED;
    b[24..28].copy_from_slice(&lo.to_ne_bytes());
    b[28..32].copy_from_slice(&hi.wrapping_sub(1).to_ne_bytes());
    // SAFETY: the caller's control buffer holds at least LEN bytes (checked above).
    unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), m.control.cast::<u8>(), LEN) };
    m.controllen = LEN;
    m.flags = MSG_ERRQUEUE;
    c.zc_reported.store(hi, Ordering::Relaxed);
    0
}

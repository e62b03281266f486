//! UDP segmentation offloads on a socket: sending a run of equal-sized datagrams in one
//! `sendmsg` (`UDP_SEGMENT`, Linux 4.18) and receiving a run of them in one `recvmsg`
//! (`UDP_GRO`, Linux 5.0), the segment size given in a control message.

use std::io;
use std::mem::{size_of, zeroed};
use std::net::SocketAddr;
use std::os::fd::RawFd;

use crate::cvt;

/// The most datagrams one `UDP_SEGMENT` send may carry on every kernel that has it
/// (`UDP_MAX_SEGMENTS`, 64 before Linux 6.7).
pub const MAX_SEGMENTS: usize = 64;

/// The most bytes one send may carry: a UDP datagram's largest payload over IPv4 (65,535
/// less the IPv4 and UDP headers), which IPv6 is also held to.
pub const MAX_SEND: usize = 65_507;

/// A socket address in the kernel's form, and its length.
fn raw_addr(a: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: plain data, zeroed.
    let mut s: libc::sockaddr_storage = unsafe { zeroed() };
    let len = match a {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr { s_addr: u32::from_ne_bytes(a.ip().octets()) },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
            unsafe { std::ptr::write((&mut s as *mut libc::sockaddr_storage).cast(), sin) };
            size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr { s6_addr: a.ip().octets() },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in6.
            unsafe { std::ptr::write((&mut s as *mut libc::sockaddr_storage).cast(), sin6) };
            size_of::<libc::sockaddr_in6>()
        }
    };
    (s, len as libc::socklen_t)
}

/// The address the kernel wrote into `s`, if it is IPv4 or IPv6.
fn socket_addr(s: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match i32::from(s.ss_family) {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in.
            let a = unsafe { std::ptr::read((s as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>()) };
            Some(SocketAddr::from((a.sin_addr.s_addr.to_ne_bytes(), u16::from_be(a.sin_port))))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says the storage holds a sockaddr_in6.
            let a = unsafe { std::ptr::read((s as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>()) };
            Some(SocketAddr::V6(std::net::SocketAddrV6::new(
                a.sin6_addr.s6_addr.into(),
                u16::from_be(a.sin6_port),
                a.sin6_flowinfo,
                a.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

/// Sends `buf` to `to` as datagrams of `segment` bytes each (the last may be shorter) in
/// one system call; a `segment` of at least `buf.len()` sends one plain datagram. The
/// caller keeps `buf` within [`MAX_SEND`] bytes and [`MAX_SEGMENTS`] segments.
/// `Ok(false)`: the socket cannot take it now (nothing was sent).
pub fn send_segments(fd: RawFd, to: SocketAddr, buf: &[u8], segment: usize) -> io::Result<bool> {
    let (mut addr, addr_len) = raw_addr(to);
    let mut iov = libc::iovec { iov_base: buf.as_ptr() as *mut _, iov_len: buf.len() };
    // Room for one cmsg holding a u16, aligned as cmsghdr wants.
    let mut cmsg = [0u64; 4];
    // SAFETY: plain data, zeroed then filled with pointers to live buffers above.
    let mut msg: libc::msghdr = unsafe { zeroed() };
    msg.msg_name = (&mut addr as *mut libc::sockaddr_storage).cast();
    msg.msg_namelen = addr_len;
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if segment < buf.len() {
        let size = u16::try_from(segment).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        msg.msg_control = cmsg.as_mut_ptr().cast();
        // SAFETY: CMSG_SPACE is a pure computation.
        msg.msg_controllen = unsafe { libc::CMSG_SPACE(size_of::<u16>() as u32) } as usize;
        // SAFETY: the control buffer is larger than CMSG_SPACE(2) and 8-byte aligned, so
        // the first header and its data lie inside it.
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_UDP;
            (*c).cmsg_type = libc::UDP_SEGMENT;
            (*c).cmsg_len = libc::CMSG_LEN(size_of::<u16>() as u32) as usize;
            std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<u16>(), size);
        }
    }
    loop {
        // SAFETY: every pointer in `msg` refers to a buffer that outlives the call.
        let r = unsafe { libc::sendmsg(fd, &msg, 0) };
        if r >= 0 {
            return Ok(true);
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EAGAIN | libc::ENOBUFS) => return Ok(false),
            _ => return Err(e),
        }
    }
}

/// Asks the kernel to hand runs of datagrams of one sender, of one size, up in one read
/// (`UDP_GRO`); [`recv_segments`] then says the size.
pub fn enable_gro(fd: RawFd) -> io::Result<()> {
    let on: libc::c_int = 1;
    // SAFETY: the option value is a live c_int of the size given.
    cvt(unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_UDP,
            libc::UDP_GRO,
            (&on as *const libc::c_int).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    })?;
    Ok(())
}

/// What one [`recv_segments`] read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segments {
    /// Bytes read into the buffer.
    pub len: usize,
    /// The sender.
    pub from: SocketAddr,
    /// The size of each datagram in the buffer (the last may be shorter), when the kernel
    /// coalesced several; `None`: the buffer is one datagram.
    pub segment: Option<usize>,
    /// The read was cut short: what came was larger than the buffer.
    pub truncated: bool,
}

/// Receives into `buf`: one datagram, or with [`enable_gro`] a run of them back to back
/// (see [`Segments::segment`]). `Ok(None)`: nothing waiting.
pub fn recv_segments(fd: RawFd, buf: &mut [u8]) -> io::Result<Option<Segments>> {
    loop {
        // SAFETY: plain data, zeroed.
        let mut from: libc::sockaddr_storage = unsafe { zeroed() };
        let mut cmsg = [0u64; 8];
        let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
        // SAFETY: plain data, zeroed then filled with pointers to live buffers above.
        let mut msg: libc::msghdr = unsafe { zeroed() };
        msg.msg_name = (&mut from as *mut libc::sockaddr_storage).cast();
        msg.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cmsg.as_mut_ptr().cast();
        msg.msg_controllen = size_of::<[u64; 8]>();
        // SAFETY: every pointer in `msg` refers to a buffer that outlives the call.
        let n = unsafe { libc::recvmsg(fd, &mut msg, 0) };
        if n < 0 {
            let e = io::Error::last_os_error();
            return match e.kind() {
                io::ErrorKind::WouldBlock => Ok(None),
                io::ErrorKind::Interrupted => continue,
                _ => Err(e),
            };
        }
        let Some(from) = socket_addr(&from) else { continue };
        let mut got =
            Segments { len: n as usize, from, segment: None, truncated: msg.msg_flags & libc::MSG_TRUNC != 0 };
        // SAFETY: walking the control messages recvmsg filled in, within msg_controllen.
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(&msg);
            while !c.is_null() {
                if (*c).cmsg_level == libc::SOL_UDP && (*c).cmsg_type == libc::UDP_GRO {
                    let size = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<u16>());
                    got.segment = Some(usize::from(size)).filter(|&s| s > 0 && s < got.len);
                }
                c = libc::CMSG_NXTHDR(&msg, c);
            }
        }
        return Ok(Some(got));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::UdpSocket;
    use std::os::fd::AsRawFd;

    #[test]
    fn segments_sent_in_one_call_arrive_as_datagrams_or_as_one_run() {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let to = rx.local_addr().unwrap();
        let buf: Vec<u8> = (0..2500u32).map(|i| i as u8).collect();
        assert!(send_segments(tx.as_raw_fd(), to, &buf, 1000).unwrap());
        let mut got = vec![0u8; 4096];
        for (at, len) in [(0, 1000), (1000, 1000), (2000, 500)] {
            let (n, from) = rx.recv_from(&mut got).unwrap();
            assert_eq!((n, from), (len, tx.local_addr().unwrap()));
            assert_eq!(&got[..n], &buf[at..at + len]);
        }
        enable_gro(rx.as_raw_fd()).unwrap();
        assert!(send_segments(tx.as_raw_fd(), to, &buf, 1000).unwrap());
        rx.set_nonblocking(true).unwrap();
        let mut seen = Vec::new();
        for _ in 0..1000 {
            match recv_segments(rx.as_raw_fd(), &mut got).unwrap() {
                Some(s) => {
                    assert_eq!(s.from, tx.local_addr().unwrap());
                    assert!(!s.truncated);
                    let size = s.segment.unwrap_or(s.len);
                    seen.extend(got[..s.len].chunks(size).map(<[u8]>::to_vec));
                    if seen.concat().len() == buf.len() {
                        break;
                    }
                }
                None => std::thread::sleep(std::time::Duration::from_millis(1)),
            }
        }
        assert_eq!(seen.iter().map(Vec::len).collect::<Vec<_>>(), [1000, 1000, 500]);
        assert_eq!(seen.concat(), buf);
        assert!(send_segments(tx.as_raw_fd(), to, &buf[..10], 1000).unwrap(), "one plain datagram");
    }
}

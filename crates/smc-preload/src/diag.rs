//! "Is this TCP connection mine?": an exact `sock_diag` lookup (NETLINK_SOCK_DIAG,
//! SOCK_DIAG_BY_FAMILY without NLM_F_DUMP) of a connection by its four addresses in the
//! calling thread's network namespace. (The kernel's exact lookup answers with the
//! listening socket when no connection matches, so the answer's state and peer port are
//! checked.) The side door asks it before accepting a proposal,
//! so a proposal for a connection that went to another namespace's listener is declined.

use std::ffi::c_int;
use std::net::{IpAddr, SocketAddr};

use crate::sys;

const AF_NETLINK: c_int = 16;
const NETLINK_SOCK_DIAG: c_int = 4;
const SOCK_DIAG_BY_FAMILY: u16 = 20;
const NLM_F_REQUEST: u16 = 1;
const NLMSG_ERROR: u16 = 2;
const IPPROTO_TCP: u8 = 6;
/// TCP_ESTABLISHED, TCP_SYN_RECV and TCP_NEW_SYN_RECV.
const STATES: u32 = (1 << 1) | (1 << 3) | (1 << 12);

fn put_ip(out: &mut [u8], ip: IpAddr) {
    match ip {
        IpAddr::V4(v) => out[..4].copy_from_slice(&v.octets()),
        IpAddr::V6(v) => out[..16].copy_from_slice(&v.octets()),
    }
}

/// True when a TCP socket with local address `local` and peer `peer` exists here.
pub fn connection_exists(local: SocketAddr, peer: SocketAddr) -> bool {
    // SAFETY: a plain socket call; the descriptor is closed below.
    let fd = unsafe {
        crate::real::socket(AF_NETLINK, sys::SOCK_CLOEXEC | 2 /* SOCK_DGRAM */, NETLINK_SOCK_DIAG)
    };
    if fd < 0 {
        return false;
    }
    let found = ask(fd, local, peer);
    sys::close(fd);
    found
}

fn ask(fd: c_int, local: SocketAddr, peer: SocketAddr) -> bool {
    let family = if local.is_ipv4() { sys::AF_INET } else { sys::AF_INET6 } as u8;
    let mut m = [0u8; 72];
    m[0..4].copy_from_slice(&72u32.to_ne_bytes());
    m[4..6].copy_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    m[6..8].copy_from_slice(&NLM_F_REQUEST.to_ne_bytes());
    m[8..12].copy_from_slice(&1u32.to_ne_bytes());
    // struct inet_diag_req_v2
    m[16] = family;
    m[17] = IPPROTO_TCP;
    m[20..24].copy_from_slice(&STATES.to_ne_bytes());
    // struct inet_diag_sockid: sport, dport (network order), src[4], dst[4], if, cookie[2]
    m[24..26].copy_from_slice(&local.port().to_be_bytes());
    m[26..28].copy_from_slice(&peer.port().to_be_bytes());
    put_ip(&mut m[28..44], local.ip());
    put_ip(&mut m[44..60], peer.ip());
    m[64..72].copy_from_slice(&[0xff; 8]); // INET_DIAG_NOCOOKIE
    // SAFETY: `m` is a complete request; the kernel's address is the default (pid 0).
    let n = unsafe { crate::real::send(fd, m.as_ptr().cast(), m.len(), 0) };
    if n != m.len() as isize {
        return false;
    }
    if !sys::wait(fd, sys::POLLIN, 200).unwrap_or(false) {
        return false;
    }
    let mut buf = [0u8; 512];
    // SAFETY: `buf` has room for the answer.
    let n = unsafe { crate::real::recv(fd, buf.as_mut_ptr().cast(), buf.len(), sys::MSG_DONTWAIT) };
    if n < 16 {
        return false;
    }
    let kind = u16::from_ne_bytes([buf[4], buf[5]]);
    if kind == NLMSG_ERROR {
        // An error code of 0 would be an acknowledgement, never sent for this request.
        return false;
    }
    if kind != SOCK_DIAG_BY_FAMILY || n < 24 {
        return false;
    }
    // The exact lookup falls back to a listening socket when no connection matches:
    // only a connection (or a half-open one) with the peer's port is an answer.
    // struct inet_diag_msg: family, state, timer, retrans, then the id (sport, dport, …).
    let state = buf[17];
    let dport = u16::from_be_bytes([buf[22], buf[23]]);
    matches!(state, 1 | 3 | 12) && dport == peer.port()
}

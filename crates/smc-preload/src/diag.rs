//! What the kernel knows of a TCP socket by its addresses: an exact `sock_diag` lookup
//! (NETLINK_SOCK_DIAG, SOCK_DIAG_BY_FAMILY without NLM_F_DUMP) in the calling thread's
//! network namespace. Both sides of the handshake ask it (docs/architecture.md, "The fast
//! path's trust boundary"): the door, whether the connection's server end is its own and
//! whether its client end is the socket the proposer passed (by cookie); the client,
//! whether the connection ends in its namespace and which listener took it.
//!
//! The kernel's exact lookup answers with the most specific listening socket when no
//! connection matches, so answers are told apart by their state and peer port.

use std::ffi::c_int;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use crate::sys;

const AF_NETLINK: c_int = 16;
const NETLINK_SOCK_DIAG: c_int = 4;
const SOCK_DIAG_BY_FAMILY: u16 = 20;
const NLM_F_REQUEST: u16 = 1;
const IPPROTO_TCP: u8 = 6;
/// TCP_ESTABLISHED, TCP_SYN_RECV, TCP_LISTEN and TCP_NEW_SYN_RECV.
const STATES: u32 = (1 << 1) | (1 << 3) | (1 << 10) | (1 << 12);
/// Every state in which a connection's socket still has its owner: the above and the
/// closing ones (FIN_WAIT1/2, CLOSE_WAIT, LAST_ACK, CLOSING) — not TIME_WAIT or CLOSE.
const OWNED_STATES: u32 =
    (1 << 1) | (1 << 2) | (1 << 3) | (1 << 4) | (1 << 5) | (1 << 8) | (1 << 9) | (1 << 11) | (1 << 12);
const LISTEN: u8 = 10;

/// A socket as `sock_diag` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Found {
    /// TCP state (1 ESTABLISHED, 3 SYN_RECV, 10 LISTEN, 12 NEW_SYN_RECV).
    pub state: u8,
    /// The peer's port (0 for a listener).
    pub dport: u16,
    /// The socket's cookie, as `SO_COOKIE` reports it.
    pub cookie: u64,
    /// The user who owns it (a connection not yet accepted reports its listener's owner,
    /// or 0 while it is half-open).
    pub uid: u32,
    /// Its inode (0 until a process holds it as a descriptor).
    pub inode: u32,
}

/// A `sock_diag` socket for the lookups of one handshake, in the calling thread's
/// namespace (closed on drop).
pub struct Diag(c_int);

impl Diag {
    /// Opens one.
    pub fn open() -> Option<Diag> {
        // SAFETY: a plain socket call; the descriptor is closed on drop.
        let fd = unsafe {
            crate::real::socket(AF_NETLINK, sys::SOCK_CLOEXEC | 2 /* SOCK_DGRAM */, NETLINK_SOCK_DIAG)
        };
        (fd >= 0).then_some(Diag(fd))
    }

    /// The connection with local address `local` and peer `peer`, if one exists in this
    /// namespace (established, or half-open).
    pub fn connection(&self, local: SocketAddr, peer: SocketAddr) -> Option<Found> {
        ask(self.0, local, peer).filter(|f| matches!(f.state, 1 | 3 | 12) && f.dport == peer.port())
    }

    /// The connection with local address `local` and peer `peer` while a process still
    /// holds its socket, in any state — closing too (a client that sent everything and shut
    /// its side down before the server accepted is still that user's connection). A
    /// socket no process holds any more (closed, still finishing: no inode) reads as none:
    /// the kernel no longer says whose it was.
    pub fn owned_connection(&self, local: SocketAddr, peer: SocketAddr) -> Option<Found> {
        // (An exact lookup answers whatever socket the kernel finds, whatever the mask.)
        ask_states(self.0, local, peer, OWNED_STATES)
            .filter(|f| f.state < 32 && OWNED_STATES & (1 << f.state) != 0 && f.inode != 0 && f.dport == peer.port())
    }

    /// The listening socket that takes connections to `local` in this namespace (the most
    /// specific one, as the kernel chooses).
    pub fn listener(&self, local: SocketAddr) -> Option<Found> {
        let any: IpAddr = if local.is_ipv4() { Ipv4Addr::UNSPECIFIED.into() } else { Ipv6Addr::UNSPECIFIED.into() };
        ask(self.0, local, SocketAddr::new(any, 0)).filter(|f| f.state == LISTEN)
    }
}

impl Drop for Diag {
    fn drop(&mut self) {
        sys::close(self.0);
    }
}

fn put_ip(out: &mut [u8], ip: IpAddr) {
    match ip {
        IpAddr::V4(v) => out[..4].copy_from_slice(&v.octets()),
        IpAddr::V6(v) => out[..16].copy_from_slice(&v.octets()),
    }
}

fn ask(fd: c_int, local: SocketAddr, peer: SocketAddr) -> Option<Found> {
    ask_states(fd, local, peer, STATES)
}

fn ask_states(fd: c_int, local: SocketAddr, peer: SocketAddr, states: u32) -> Option<Found> {
    let family = if local.is_ipv4() { sys::AF_INET } else { sys::AF_INET6 } as u8;
    let mut m = [0u8; 72];
    m[0..4].copy_from_slice(&72u32.to_ne_bytes());
    m[4..6].copy_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    m[6..8].copy_from_slice(&NLM_F_REQUEST.to_ne_bytes());
    m[8..12].copy_from_slice(&1u32.to_ne_bytes());
    // struct inet_diag_req_v2
    m[16] = family;
    m[17] = IPPROTO_TCP;
    m[20..24].copy_from_slice(&states.to_ne_bytes());
    // struct inet_diag_sockid: sport, dport (network order), src[4], dst[4], if, cookie[2]
    m[24..26].copy_from_slice(&local.port().to_be_bytes());
    m[26..28].copy_from_slice(&peer.port().to_be_bytes());
    put_ip(&mut m[28..44], local.ip());
    put_ip(&mut m[44..60], peer.ip());
    m[64..72].copy_from_slice(&[0xff; 8]); // INET_DIAG_NOCOOKIE
    // SAFETY: `m` is a complete request; the kernel's address is the default (pid 0).
    let n = unsafe { crate::real::send(fd, m.as_ptr().cast(), m.len(), 0) };
    // (The kernel answers at once; the bound is for a machine so loaded that this thread
    // is not run for a while — at 200 ms a test under load saw no answer, and an
    // unanswered lookup is read as "not in this namespace".)
    if n != m.len() as isize || !sys::wait(fd, sys::POLLIN, 1000).unwrap_or(false) {
        return None;
    }
    let mut buf = [0u8; 512];
    // SAFETY: `buf` has room for the answer.
    let n = unsafe { crate::real::recv(fd, buf.as_mut_ptr().cast(), buf.len(), sys::MSG_DONTWAIT) };
    let found = parse(buf.get(..n.max(0) as usize)?);
    // An answer of more than one message (never for an exact lookup) must not be read as
    // the next lookup's: take whatever is left.
    // SAFETY: as above.
    while unsafe { crate::real::recv(fd, buf.as_mut_ptr().cast(), buf.len(), sys::MSG_DONTWAIT) } > 0 {}
    found
}

/// Reads the answer: an `inet_diag_msg` after the netlink header (an error, such as
/// ENOENT for "no such socket", reads as none).
fn parse(b: &[u8]) -> Option<Found> {
    if b.len() < 16 + 72 || u16::from_ne_bytes([b[4], b[5]]) != SOCK_DIAG_BY_FAMILY {
        return None;
    }
    let m = &b[16..];
    let u32_at = |at: usize| u32::from_ne_bytes([m[at], m[at + 1], m[at + 2], m[at + 3]]);
    Some(Found {
        state: m[1],
        dport: u16::from_be_bytes([m[6], m[7]]),
        cookie: u64::from(u32_at(44)) | u64::from(u32_at(48)) << 32,
        uid: u32_at(64),
        inode: u32_at(68),
    })
}

/// Whether process `pid` holds socket inode `inode` as a descriptor: `None` when its
/// descriptors cannot be read (another user's process, unless we are root). The last
/// pair found held is remembered (a client connecting again and again to one server
/// scans its descriptors once); the socket's inode names it uniquely while it lives.
pub fn holds(pid: u32, inode: u32) -> Option<bool> {
    static LAST: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let key = u64::from(pid) << 32 | u64::from(inode);
    if LAST.load(std::sync::atomic::Ordering::Relaxed) == key && sys::alive(pid) {
        return Some(true);
    }
    let want = format!("socket:[{inode}]");
    let dir = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?;
    let held = dir.flatten().any(|e| std::fs::read_link(e.path()).is_ok_and(|l| l.as_os_str() == want.as_str()));
    if held {
        LAST.store(key, std::sync::atomic::Ordering::Relaxed);
    }
    Some(held)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_is_read_field_by_field_and_short_or_error_answers_are_none() {
        let mut b = vec![0u8; 16 + 72];
        b[4..6].copy_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
        b[17] = 1;
        b[22..24].copy_from_slice(&40000u16.to_be_bytes());
        b[16 + 44..16 + 48].copy_from_slice(&7u32.to_ne_bytes());
        b[16 + 48..16 + 52].copy_from_slice(&1u32.to_ne_bytes());
        b[16 + 64..16 + 68].copy_from_slice(&1000u32.to_ne_bytes());
        b[16 + 68..16 + 72].copy_from_slice(&4242u32.to_ne_bytes());
        assert_eq!(parse(&b), Some(Found { state: 1, dport: 40000, cookie: (1 << 32) | 7, uid: 1000, inode: 4242 }));
        assert_eq!(parse(&b[..50]), None);
        b[4..6].copy_from_slice(&2u16.to_ne_bytes()); // NLMSG_ERROR
        assert_eq!(parse(&b), None);
    }

    #[test]
    fn the_kernel_reports_a_loopback_connection_its_listener_and_their_cookies() {
        use std::os::fd::AsRawFd;
        use std::os::unix::fs::MetadataExt;
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let server = l.local_addr().unwrap();
        let c = std::net::TcpStream::connect(server).unwrap();
        let client = c.local_addr().unwrap();
        let d = Diag::open().unwrap();
        let end = d.connection(client, server).expect("the client end is here");
        assert_eq!(Some(end.cookie), sys::cookie(c.as_raw_fd()));
        let li = d.listener(server).expect("the listener");
        let ino = std::fs::metadata(format!("/proc/self/fd/{}", l.as_raw_fd())).unwrap().ino();
        assert_eq!(u64::from(li.inode), ino);
        assert_eq!(holds(std::process::id(), li.inode), Some(true));
        assert!(d.connection(server, client).is_some(), "the server end, not yet accepted");
        assert_eq!(d.connection(client, "127.0.0.1:1".parse().unwrap()), None);
    }
}

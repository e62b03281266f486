//! What the kernel knows of a TCP socket by its addresses: an exact `sock_diag` lookup
//! (NETLINK_SOCK_DIAG, SOCK_DIAG_BY_FAMILY without NLM_F_DUMP) in the calling thread's
//! network namespace. Both sides of the handshake ask it (docs/architecture.md, "The fast
//! path's trust boundary"): the door, whether the connection's server end is its own and
//! whether its client end is the socket the proposer passed (by cookie); the client,
//! whether the connection ends in its namespace and which listener took it.
//!
//! The kernel's exact lookup answers with the most specific listening socket when no
//! connection matches, and whatever the request's state mask says, so answers are told
//! apart by their state and peer port.

use std::ffi::c_int;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use crate::{cabi, sys};

const AF_NETLINK: c_int = 16;
const NETLINK_SOCK_DIAG: c_int = 4;
const SOCK_DIAG_BY_FAMILY: u16 = 20;
const NLM_F_REQUEST: u16 = 1;
const IPPROTO_TCP: u8 = 6;
/// TCP_ESTABLISHED, TCP_SYN_RECV, TCP_LISTEN and TCP_NEW_SYN_RECV.
const STATES: u32 = (1 << 1) | (1 << 3) | (1 << 10) | (1 << 12);
const LISTEN: u8 = 10;

/// A socket as `sock_diag` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Found {
    /// TCP state (1 ESTABLISHED, 3 SYN_RECV, 4 FIN_WAIT1, 5 FIN_WAIT2, 10 LISTEN,
    /// 12 NEW_SYN_RECV).
    pub state: u8,
    /// The peer's port (0 for a listener).
    pub dport: u16,
    /// The socket's cookie, as `SO_COOKIE` reports it.
    pub cookie: u64,
    /// The user who owns it (a connection not yet accepted reports its listener's owner,
    /// or 0 while it is half-open; a time-wait remnant reports 0).
    pub uid: u32,
    /// Its inode (0 until a process holds it as a descriptor, and again once none does).
    pub inode: u32,
}

/// A `sock_diag` socket, in the namespace of the thread that opened it (closed on drop).
pub struct Diag(c_int);

thread_local! {
    static MINE: std::cell::RefCell<Option<Diag>> = const { std::cell::RefCell::new(None) };
}

/// Runs `f` with this thread's `sock_diag` socket (opened at its first use and kept: a
/// lookup costs a send and a receive, not a socket). `None` when none can be had.
pub fn with<T>(f: impl FnOnce(&Diag) -> Option<T>) -> Option<T> {
    MINE.with(|m| {
        let mut m = m.try_borrow_mut().ok()?;
        if m.is_none() {
            *m = Diag::open();
        }
        f(m.as_ref()?)
    })
}

impl Diag {
    /// Opens one.
    pub fn open() -> Option<Diag> {
        // SAFETY: a plain socket call; the descriptor is closed on drop.
        let fd = unsafe {
            crate::real::socket(AF_NETLINK, sys::SOCK_CLOEXEC | 2 /* SOCK_DGRAM */, NETLINK_SOCK_DIAG)
        };
        (fd >= 0).then(|| Diag(sys::move_high(fd)))
    }

    /// The connection with local address `local` and peer `peer`, if one exists in this
    /// namespace (established, or half-open).
    pub fn connection(&self, local: SocketAddr, peer: SocketAddr) -> Option<Found> {
        ask(self.0, local, peer).filter(|f| matches!(f.state, 1 | 3 | 12) && f.dport == peer.port())
    }

    /// The client end of the connection from `local` to `peer` that a server is accepting,
    /// if it is in this namespace: established, or already closed by its program — a
    /// client may send all it has and close before the server's `accept` runs (FIN_WAIT1
    /// while its bytes or its FIN wait for the server's acknowledgement, FIN_WAIT2 after,
    /// then a time-wait remnant). A socket no process holds any more reports inode 0, and
    /// a time-wait remnant uid 0: its owner is no longer known.
    pub fn client_end(&self, local: SocketAddr, peer: SocketAddr) -> Option<Found> {
        ask(self.0, local, peer).filter(|f| matches!(f.state, 1 | 4 | 5) && f.dport == peer.port())
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
    let seq = next_seq();
    let mut m = [0u8; 72];
    m[0..4].copy_from_slice(&72u32.to_ne_bytes());
    m[4..6].copy_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    m[6..8].copy_from_slice(&NLM_F_REQUEST.to_ne_bytes());
    m[8..12].copy_from_slice(&seq.to_ne_bytes());
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
    if n != m.len() as isize {
        return None;
    }
    answer(fd, seq).and_then(|b| parse(&b))
}

fn next_seq() -> u32 {
    static SEQ: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(1);
    SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// The kernel's answer to request `seq` on netlink socket `fd`: it answers within the
/// send, so the first receive finds it; answers to earlier requests that were given up
/// on are passed by. (Waited for at most a second, for a machine so loaded that this
/// thread is not run for a while — an unanswered lookup reads as "not found".)
fn answer(fd: c_int, seq: u32) -> Option<Vec<u8>> {
    let mut buf = vec![0u8; 1024];
    for _ in 0..16 {
        // SAFETY: `buf` has room for the answer.
        let mut n = unsafe { crate::real::recv(fd, buf.as_mut_ptr().cast(), buf.len(), sys::MSG_DONTWAIT) };
        if n < 0 && cabi::errno() == sys::EAGAIN {
            if !sys::wait(fd, sys::POLLIN, 1000).unwrap_or(false) {
                return None;
            }
            // SAFETY: as above.
            n = unsafe { crate::real::recv(fd, buf.as_mut_ptr().cast(), buf.len(), sys::MSG_DONTWAIT) };
        }
        if n < 16 {
            return None;
        }
        if u32::from_ne_bytes([buf[8], buf[9], buf[10], buf[11]]) == seq {
            buf.truncate(n as usize);
            return Some(buf);
        }
    }
    None
}

/// A `NETLINK_ROUTE` socket of this thread's, for [`is_local`].
struct Route(c_int);

impl Drop for Route {
    fn drop(&mut self) {
        sys::close(self.0);
    }
}

thread_local! {
    static ROUTE: std::cell::RefCell<Option<Route>> = const { std::cell::RefCell::new(None) };
}

/// Whether `ip` is an address of this thread's network namespace (the kernel's route to
/// it is local): a connection to it ends here. Loopback addresses are, without asking.
pub fn is_local(ip: IpAddr) -> bool {
    if ip.is_loopback() {
        return true;
    }
    ROUTE.with(|r| {
        let Ok(mut r) = r.try_borrow_mut() else { return false };
        if r.is_none() {
            // SAFETY: a plain socket call; NETLINK_ROUTE is 0.
            let fd = unsafe { crate::real::socket(AF_NETLINK, sys::SOCK_CLOEXEC | 2, 0) };
            if fd < 0 {
                return false;
            }
            *r = Some(Route(sys::move_high(fd)));
        }
        let Some(Route(fd)) = r.as_ref() else { return false };
        route_type(*fd, ip) == Some(RTN_LOCAL)
    })
}

const RTM_GETROUTE: u16 = 26;
const RTM_NEWROUTE: u16 = 24;
const RTA_DST: u16 = 1;
const RTN_LOCAL: u8 = 2;

/// The type of the kernel's route to `ip` (`RTM_GETROUTE`, as `ip route get`).
fn route_type(fd: c_int, ip: IpAddr) -> Option<u8> {
    let (family, alen) = match ip {
        IpAddr::V4(_) => (sys::AF_INET as u8, 4usize),
        IpAddr::V6(_) => (sys::AF_INET6 as u8, 16),
    };
    let seq = next_seq();
    let len = 16 + 12 + 4 + alen;
    let mut m = vec![0u8; len];
    m[0..4].copy_from_slice(&(len as u32).to_ne_bytes());
    m[4..6].copy_from_slice(&RTM_GETROUTE.to_ne_bytes());
    m[6..8].copy_from_slice(&NLM_F_REQUEST.to_ne_bytes());
    m[8..12].copy_from_slice(&seq.to_ne_bytes());
    // struct rtmsg: family, dst_len, src_len, tos, table, protocol, scope, type, flags.
    m[16] = family;
    m[17] = (alen * 8) as u8;
    // One attribute: RTA_DST.
    m[28..30].copy_from_slice(&((4 + alen) as u16).to_ne_bytes());
    m[30..32].copy_from_slice(&RTA_DST.to_ne_bytes());
    put_ip(&mut m[32..32 + alen], ip);
    // SAFETY: `m` is a complete request.
    let n = unsafe { crate::real::send(fd, m.as_ptr().cast(), m.len(), 0) };
    if n != m.len() as isize {
        return None;
    }
    let b = answer(fd, seq)?;
    (b.len() >= 28 && u16::from_ne_bytes([b[4], b[5]]) == RTM_NEWROUTE).then(|| b[16 + 7])
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

    /// A client may send all it has and close before its server accepts. Its end is still
    /// the connection's, held by no process: while its bytes wait for the server (its FIN
    /// behind them), and once the server's kernel acknowledged everything. (The door
    /// looked up established client ends only, took such a connection for one from another
    /// namespace, and left the announcements of it undecided.)
    #[test]
    fn the_client_end_of_a_connection_its_program_closed_is_found_held_by_no_process() {
        use std::io::Write;
        use std::os::fd::AsRawFd;
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let server = l.local_addr().unwrap();
        let d = Diag::open().unwrap();
        // Bytes until the buffers are full (the server never reads), then a few only.
        for fill in [true, false] {
            let mut c = std::net::TcpStream::connect(server).unwrap();
            let (client, cookie) = (c.local_addr().unwrap(), sys::cookie(c.as_raw_fd()));
            c.set_nonblocking(true).unwrap();
            if fill {
                let chunk = [7u8; 1 << 16];
                for _ in 0..4096 {
                    if c.write(&chunk).is_err() {
                        break;
                    }
                }
            } else {
                c.write_all(b"a few bytes").unwrap();
            }
            assert_ne!(d.client_end(client, server).expect("established").inode, 0, "held");
            drop(c);
            let end = d.client_end(client, server).expect("the closed client end is still here");
            assert_eq!(Some(end.cookie), cookie);
            assert_eq!(end.inode, 0, "held by no process: {end:?}");
            if fill {
                assert_eq!(end.state, 4, "its FIN waits behind its bytes (FIN_WAIT1)");
            }
        }
    }
}

//! The attackers that send frames or datagrams: `mac-flood` (new source MACs through a
//! packet socket), `gso-bomb` (UDP-GSO sends of tiny segments) and `underlay-flood`
//! (VXLAN datagrams from a host on the underlay that is no tunnel endpoint). Each runs on
//! a thread inside the attacker's namespace and stops at the cell's stop flag or its
//! deadline; the paced ones send in batches every 10 ms.

use std::io;
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use super::frames::{Rng, mac_flood_frame, underlay_datagram};
use super::{Clock, Shared, Tally};
use sluice_sys::packet;

/// New source MACs a second of `mac-flood`.
pub const MAC_FLOOD_PER_S: u64 = 10_000;
/// UDP-GSO sends a second of `gso-bomb`.
pub const GSO_PER_S: u64 = 2_000;
/// Segment size of `gso-bomb`'s sends.
pub const GSO_SEGMENT: u16 = 48;
/// Bytes of each `gso-bomb` send: 125 segments (fewer if the kernel allows fewer a send).
pub const GSO_BYTES: usize = 6_000;
/// The UDP port `gso-bomb` sends to (discard: nothing listens).
const DISCARD: u16 = 9;

/// Sleeps until the next 10-ms tick of a paced sender.
struct Pace {
    next: Instant,
}

impl Pace {
    fn new() -> Pace {
        Pace { next: Instant::now() }
    }

    fn wait(&mut self) {
        self.next += Duration::from_millis(10);
        let now = Instant::now();
        if self.next > now {
            std::thread::sleep(self.next - now);
        } else {
            self.next = now;
        }
    }
}

/// Floods frames from [`MAC_FLOOD_PER_S`] new source MACs a second out of `dev` (of the
/// calling thread's namespace) through a packet socket, each to an unknown destination.
pub fn mac_flood(dev: &str, seed: u64, sh: &Shared, mut clock: Clock) -> io::Result<Tally> {
    let sock = packet::open_tx(packet::ifindex(dev)?, 0)?;
    let vnet = [0u8; sluice_wire::VNET_HDR_LEN];
    let base = Rng::new(seed).next_u64() as u32;
    let mut t = Tally::default();
    let mut pace = Pace::new();
    let mut i = 0u32;
    while !sh.over() {
        for _ in 0..MAC_FLOOD_PER_S / 100 {
            let f = mac_flood_frame(base, i);
            i = i.wrapping_add(1);
            let parts: &[&[u8]] = if sock.vnet { &[&vnet, &f] } else { &[&f] };
            match packet::send(sock.fd.as_raw_fd(), parts) {
                Ok(true) => t.add("frames", 1),
                Ok(false) => t.add("refused_full", 1),
                Err(_) => t.add("send_errors", 1),
            }
        }
        clock.tick();
        pace.wait();
    }
    clock.tick();
    Ok(t)
}

/// Sets `UDP_SEGMENT` (the size each segment of a send is cut to) on UDP socket `s`.
fn set_udp_segment(s: &UdpSocket, size: u16) -> io::Result<()> {
    sluice_sys::proc::set_int_option(s, libc::SOL_UDP, libc::UDP_SEGMENT, i32::from(size))
}

/// Sends [`GSO_PER_S`] UDP-GSO datagrams a second of [`GSO_BYTES`] cut into
/// [`GSO_SEGMENT`]-byte segments, from `from` to `to`'s discard port (in the calling
/// thread's namespace): what an unprivileged program in a guest can send.
pub fn gso_bomb(from: Ipv4Addr, to: Ipv4Addr, sh: &Shared, mut clock: Clock) -> io::Result<Tally> {
    let s = UdpSocket::bind(SocketAddrV4::new(from, 0))?;
    set_udp_segment(&s, GSO_SEGMENT)
        .map_err(|e| io::Error::new(e.kind(), format!("UDP_SEGMENT (UDP GSO needs Linux 4.18): {e}")))?;
    // Not connected: the server's port-unreachable answers must not fail the sends.
    let to = SocketAddrV4::new(to, DISCARD);
    s.set_nonblocking(true)?;
    let mut payload = vec![0x5Au8; GSO_BYTES];
    let mut t = Tally::default();
    let mut pace = Pace::new();
    while !sh.over() {
        for _ in 0..GSO_PER_S / 100 {
            match s.send_to(&payload, to) {
                Ok(_) => {
                    t.add("sends", 1);
                    t.add("segments", (payload.len() / usize::from(GSO_SEGMENT)) as u64);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => t.add("refused_full", 1),
                // A kernel that takes fewer segments a send (64 before Linux 6.3): as many
                // as it takes.
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) && payload.len() > 64 * usize::from(GSO_SEGMENT) => {
                    payload.truncate(64 * usize::from(GSO_SEGMENT));
                }
                // Not yet resolved, or refused by the path: counted, and the flood goes on.
                Err(_) => t.add("send_errors", 1),
            }
        }
        clock.tick();
        pace.wait();
    }
    clock.tick();
    Ok(t)
}

/// What `underlay-flood` aims at.
pub struct UnderlayTarget {
    /// The attacker's own underlay address (bound to).
    pub from: Ipv4Addr,
    /// The tunnel end attacked (its UDP port 4789).
    pub to: Ipv4Addr,
    /// The tunnel's VNI.
    pub vni: u32,
    /// A guest's MAC behind the tunnel, the destination of half the unicasts.
    pub known: Option<[u8; 6]>,
}

/// Sends VXLAN datagrams to `t.to` as fast as this thread can (in the calling thread's
/// namespace): broadcasts and unicasts from made-up stations, foreign VNIs and garbage
/// (`frames::underlay_datagram`).
pub fn underlay_flood(target: &UnderlayTarget, seed: u64, sh: &Shared, mut clock: Clock) -> io::Result<Tally> {
    let s = UdpSocket::bind(SocketAddrV4::new(target.from, 0))?;
    let to = SocketAddrV4::new(target.to, sluice_wire::vxlan::VXLAN_PORT);
    s.set_nonblocking(true)?;
    let mut rng = Rng::new(seed);
    let tag = (rng.next_u64() as u16).to_be_bytes();
    let mut buf = Vec::with_capacity(256);
    let mut t = Tally::default();
    let mut i = 0u64;
    while !sh.over() {
        for _ in 0..256 {
            underlay_datagram(&mut rng, i, target.vni, tag, target.known, &mut buf);
            i += 1;
            match s.send_to(&buf, to) {
                Ok(_) => t.add("datagrams", 1),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    t.add("refused_full", 1);
                    std::thread::yield_now();
                }
                Err(_) => t.add("send_errors", 1),
            }
        }
        clock.tick();
    }
    clock.tick();
    Ok(t)
}

//! Packet sockets for the tests that watch what the programs send: one that reports each
//! frame's outer tag, and a read of one frame without waiting.

/// `PACKET_AUXDATA` and its status bits (linux/if_packet.h).
const PACKET_AUXDATA: libc::c_int = 8;
const TP_STATUS_VLAN_VALID: u32 = 1 << 4;
const TP_STATUS_VLAN_TPID_VALID: u32 = 1 << 6;

/// A packet socket for every protocol, unbound, that reports each frame's outer tag
/// (which the kernel keeps beside the frame: `PACKET_AUXDATA`).
pub fn packet_socket() -> std::os::fd::OwnedFd {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    let all = (libc::ETH_P_ALL as u16).to_be();
    // SAFETY: a plain socket(2) call.
    let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, all.into()) };
    assert!(fd >= 0, "socket(AF_PACKET): {}", std::io::Error::last_os_error());
    // SAFETY: `fd` is the socket just made, owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let on: libc::c_int = 1;
    // SAFETY: `on` is an int, alive for the call, of the size passed.
    let r = unsafe { libc::setsockopt(fd.as_raw_fd(), libc::SOL_PACKET, PACKET_AUXDATA, (&raw const on).cast(), 4) };
    assert_eq!(r, 0, "PACKET_AUXDATA: {}", std::io::Error::last_os_error());
    fd
}

/// A frame a packet socket read. (Each test reads the fields it needs.)
#[allow(dead_code)]
pub struct Packet {
    /// Its bytes, without the outer tag the kernel kept beside it.
    pub frame: Vec<u8>,
    /// The device it was read on.
    pub ifindex: u32,
    /// `PACKET_HOST`, `PACKET_OUTGOING`, …
    pub pkttype: u8,
    /// The outer tag the kernel kept beside the frame, as (TPID, TCI).
    pub tag: Option<(u16, u16)>,
}

/// The next frame waiting on packet socket `fd` (made by [`packet_socket`]), without
/// waiting: an error of kind `WouldBlock` when none waits.
pub fn recv_packet(fd: &std::os::fd::OwnedFd) -> std::io::Result<Packet> {
    use std::os::fd::AsRawFd;
    let mut buf = vec![0u8; 65536];
    let mut cbuf = [0u64; 16];
    // SAFETY: zeroed sockaddr_ll and msghdr are valid values.
    let mut from: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    // SAFETY: as above.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_name = (&raw mut from).cast();
    msg.msg_namelen = std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t;
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&cbuf);
    // SAFETY: every pointer in `msg` points into a buffer of the size given, all alive for
    // the call.
    let n = unsafe { libc::recvmsg(fd.as_raw_fd(), &mut msg, libc::MSG_DONTWAIT) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    buf.truncate(n as usize);
    let mut tag = None;
    // SAFETY: the CMSG macros walk the control buffer the kernel filled, within
    // `msg_controllen`; a PACKET_AUXDATA message holds a tpacket_auxdata (status at byte 0,
    // TCI at 16, TPID at 18), read unaligned.
    unsafe {
        let mut cm = libc::CMSG_FIRSTHDR(&msg);
        while !cm.is_null() {
            if (*cm).cmsg_level == libc::SOL_PACKET && (*cm).cmsg_type == PACKET_AUXDATA {
                let d = libc::CMSG_DATA(cm);
                let status = std::ptr::read_unaligned(d.cast::<u32>());
                let tci = std::ptr::read_unaligned(d.add(16).cast::<u16>());
                let tpid = std::ptr::read_unaligned(d.add(18).cast::<u16>());
                if status & TP_STATUS_VLAN_VALID != 0 {
                    let tpid = if status & TP_STATUS_VLAN_TPID_VALID != 0 { tpid } else { 0x8100 };
                    tag = Some((tpid, tci));
                }
            }
            cm = libc::CMSG_NXTHDR(&msg, cm);
        }
    }
    Ok(Packet { frame: buf, ifindex: from.sll_ifindex as u32, pkttype: from.sll_pkttype, tag })
}

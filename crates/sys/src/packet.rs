//! AF_PACKET sockets for uplink ports: one socket bound to a host interface, receiving
//! every frame the interface sees (promiscuous) and sending frames out of it; and the
//! send-only, marked sockets through which the switch reaches a veth guest.
//!
//! Offloads: `PACKET_VNET_HDR_SZ = 12` makes every frame carry the same 12-byte
//! virtio_net_hdr that TAPs use, so GSO frames and partial checksums cross whole. VLAN tags
//! the kernel took off a received frame arrive as `PACKET_AUXDATA` and are put back by the
//! caller. Frames this socket sent are not read back (`PACKET_IGNORE_OUTGOING`, and the
//! packet type is checked as well).

use std::ffi::CString;
use std::io;
use std::mem::{size_of, zeroed};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use super::cvt;

/// An open AF_PACKET socket, bound to one interface at a time.
pub struct PacketSocket {
    /// The socket (non-blocking).
    pub fd: OwnedFd,
    /// Frames carry a 12-byte virtio_net_hdr.
    pub vnet: bool,
    /// It receives (bound to every protocol); else it only sends (protocol 0).
    pub rx: bool,
}

fn setopt<T>(fd: RawFd, level: libc::c_int, name: libc::c_int, value: &T) -> io::Result<()> {
    // SAFETY: `value` points to a live T of the size passed.
    cvt(unsafe { libc::setsockopt(fd, level, name, (value as *const T).cast(), size_of::<T>() as libc::socklen_t) })?;
    Ok(())
}

/// Gives socket `fd` receive and send buffers of `bytes` each: beyond the system's
/// `rmem_max`/`wmem_max` when the process may (CAP_NET_ADMIN: `SO_RCVBUFFORCE`), else as
/// much as the limits allow. A tunnel's socket takes bursts of a whole TCP window of
/// datagrams between two reads.
pub fn grow_socket_buffers(fd: RawFd, bytes: libc::c_int) {
    for (force, plain) in [(libc::SO_RCVBUFFORCE, libc::SO_RCVBUF), (libc::SO_SNDBUFFORCE, libc::SO_SNDBUF)] {
        if setopt(fd, libc::SOL_SOCKET, force, &bytes).is_err() {
            let _ = setopt(fd, libc::SOL_SOCKET, plain, &bytes);
        }
    }
}

/// The index of interface `ifname` in the calling thread's namespace.
pub fn ifindex(ifname: &str) -> io::Result<i32> {
    let cname = CString::new(ifname).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "bad name"))?;
    // SAFETY: a NUL-terminated name.
    let ifindex = unsafe { libc::if_nametoindex(cname.as_ptr()) } as i32;
    if ifindex == 0 {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("no network interface {ifname:?} here (see `ip link`; name its namespace with --netns)"),
        ));
    }
    Ok(ifindex)
}

/// Opens a packet socket bound to the first of `ifindexes` (interfaces of the calling
/// thread's namespace), each of them promiscuous, asking for virtio headers. Received
/// frames need them even when nothing is sent with offloads: a frame from a local stack
/// may carry a partial checksum that only the header tells of. A kernel that refuses them
/// (before 6.2) gives a socket without (`vnet = false`).
///
/// With `rx` false the socket only sends (protocol 0: no frame is ever delivered to it) —
/// an uplink on the kernel datapath, whose frames the kernel forwards. The interfaces are
/// made promiscuous all the same (a NIC must accept the guests' MACs).
pub fn open(ifindexes: &[i32], rx: bool) -> io::Result<PacketSocket> {
    let proto = if rx { (libc::ETH_P_ALL as u16).to_be() } else { 0 };
    // SAFETY: plain socket(2) call; the result is checked and owned below.
    let raw = cvt(unsafe {
        libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC, i32::from(proto))
    })?;
    // SAFETY: `raw` is a fresh descriptor we own.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let vnet =
        setopt(fd.as_raw_fd(), libc::SOL_PACKET, libc::PACKET_VNET_HDR_SZ, &(sluice_wire::VNET_HDR_LEN as libc::c_int))
            .is_ok();
    if rx {
        setopt(fd.as_raw_fd(), libc::SOL_PACKET, libc::PACKET_AUXDATA, &1 as &libc::c_int)?;
        // Older kernels lack it; the packet type is checked on receive as well.
        let _ = setopt(fd.as_raw_fd(), libc::SOL_PACKET, libc::PACKET_IGNORE_OUTGOING, &1 as &libc::c_int);
    }
    for opt in [libc::SO_RCVBUF, libc::SO_SNDBUF] {
        let _ = setopt(fd.as_raw_fd(), libc::SOL_SOCKET, opt, &(4 << 20) as &libc::c_int);
    }
    let sock = PacketSocket { fd, vnet, rx };
    sock.bind(*ifindexes.first().ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no interface"))?)?;
    for &ifindex in ifindexes {
        // SAFETY: packet_mreq is plain data; zeroed then filled.
        let mut mr: libc::packet_mreq = unsafe { zeroed() };
        mr.mr_ifindex = ifindex;
        mr.mr_type = libc::PACKET_MR_PROMISC as u16;
        setopt(sock.fd.as_raw_fd(), libc::SOL_PACKET, libc::PACKET_ADD_MEMBERSHIP, &mr)?;
    }
    Ok(sock)
}

/// Opens a packet socket that only sends, out of interface `ifindex` (protocol 0: no
/// frame is ever delivered to it), with virtio headers when the kernel offers them, every
/// frame marked `mark` (`SO_MARK`): the switch's way into a kernel port.
pub fn open_tx(ifindex: i32, mark: u32) -> io::Result<PacketSocket> {
    // SAFETY: plain socket(2) call; the result is checked and owned below.
    let raw =
        cvt(unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: `raw` is a fresh descriptor we own.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let vnet =
        setopt(fd.as_raw_fd(), libc::SOL_PACKET, libc::PACKET_VNET_HDR_SZ, &(sluice_wire::VNET_HDR_LEN as libc::c_int))
            .is_ok();
    let _ = setopt(fd.as_raw_fd(), libc::SOL_SOCKET, libc::SO_SNDBUF, &(4 << 20) as &libc::c_int);
    // The switch's frames carry its mark: the kernel port's egress program lets only those
    // into the guest.
    setopt(fd.as_raw_fd(), libc::SOL_SOCKET, libc::SO_MARK, &mark).map_err(|e| {
        io::Error::new(e.kind(), format!("marking the switch's packet socket (SO_MARK needs CAP_NET_ADMIN): {e}"))
    })?;
    // SAFETY: sockaddr_ll is plain data; zeroed then filled.
    let mut sll: libc::sockaddr_ll = unsafe { zeroed() };
    sll.sll_family = libc::AF_PACKET as u16;
    sll.sll_protocol = 0;
    sll.sll_ifindex = ifindex;
    // SAFETY: a valid sockaddr_ll of the size passed.
    cvt(unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&sll as *const libc::sockaddr_ll).cast(),
            size_of::<libc::sockaddr_ll>() as libc::socklen_t,
        )
    })?;
    Ok(PacketSocket { fd, vnet, rx: false })
}

impl PacketSocket {
    /// Binds (or binds again) to interface `ifindex`: frames are read from and sent to it.
    pub fn bind(&self, ifindex: i32) -> io::Result<()> {
        // SAFETY: sockaddr_ll is plain data; zeroed then filled.
        let mut sll: libc::sockaddr_ll = unsafe { zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = if self.rx { (libc::ETH_P_ALL as u16).to_be() } else { 0 };
        sll.sll_ifindex = ifindex;
        // SAFETY: a valid sockaddr_ll of the size passed.
        cvt(unsafe {
            libc::bind(
                self.fd.as_raw_fd(),
                (&sll as *const libc::sockaddr_ll).cast(),
                size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        })?;
        Ok(())
    }
}

/// What one receive produced.
pub struct Received {
    /// Bytes written into the buffers (header included when the socket has one).
    pub len: usize,
    /// The 802.1Q tag control the kernel took off the frame, if any.
    pub vlan_tci: Option<u16>,
    /// The TPID of that tag (0x8100 unless the kernel said otherwise).
    pub vlan_tpid: u16,
}

/// Receives one frame into `buf`. `Ok(None)`: nothing waiting. Frames this host sent
/// out of the interface are skipped.
pub fn recv(fd: RawFd, buf: &mut [u8]) -> io::Result<Option<Received>> {
    loop {
        // SAFETY: plain data, zeroed.
        let mut from: libc::sockaddr_ll = unsafe { zeroed() };
        let mut cmsg = [0u64; 16];
        let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
        // SAFETY: plain data, zeroed then filled with pointers to live buffers above.
        let mut msg: libc::msghdr = unsafe { zeroed() };
        msg.msg_name = (&mut from as *mut libc::sockaddr_ll).cast();
        msg.msg_namelen = size_of::<libc::sockaddr_ll>() as libc::socklen_t;
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cmsg.as_mut_ptr().cast();
        msg.msg_controllen = size_of::<[u64; 16]>();
        // SAFETY: every pointer in `msg` refers to a buffer that outlives the call.
        let n = unsafe { libc::recvmsg(fd, &mut msg, libc::MSG_TRUNC) };
        if n < 0 {
            let e = io::Error::last_os_error();
            return match e.kind() {
                io::ErrorKind::WouldBlock => Ok(None),
                io::ErrorKind::Interrupted => continue,
                _ => Err(e),
            };
        }
        if from.sll_pkttype == libc::PACKET_OUTGOING {
            continue;
        }
        let n = n as usize;
        if n > buf.len() || msg.msg_flags & libc::MSG_TRUNC != 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("a {n}-byte frame is larger than the switch's buffer; it was dropped"),
            ));
        }
        let mut got = Received { len: n, vlan_tci: None, vlan_tpid: 0x8100 };
        // SAFETY: walking the control messages recvmsg filled in, within msg_controllen.
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(&msg);
            while !c.is_null() {
                if (*c).cmsg_level == libc::SOL_PACKET && (*c).cmsg_type == libc::PACKET_AUXDATA {
                    let aux = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<libc::tpacket_auxdata>());
                    if aux.tp_status & libc::TP_STATUS_VLAN_VALID != 0 {
                        got.vlan_tci = Some(aux.tp_vlan_tci);
                        if aux.tp_status & libc::TP_STATUS_VLAN_TPID_VALID != 0 {
                            got.vlan_tpid = aux.tp_vlan_tpid;
                        }
                    }
                }
                c = libc::CMSG_NXTHDR(&msg, c);
            }
        }
        return Ok(Some(got));
    }
}

/// Sends one frame given as byte runs. `Ok(false)`: the socket cannot take it now.
pub fn send(fd: RawFd, parts: &[&[u8]]) -> io::Result<bool> {
    let mut iov = [libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }; 5];
    for (v, p) in iov.iter_mut().zip(parts) {
        *v = libc::iovec { iov_base: p.as_ptr() as *mut _, iov_len: p.len() };
    }
    let n = parts.len().min(iov.len());
    loop {
        // SAFETY: the iovecs point into `parts`, which outlive the call.
        let r = unsafe { libc::writev(fd, iov.as_ptr(), n as libc::c_int) };
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

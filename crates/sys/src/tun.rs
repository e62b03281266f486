//! TAP devices with virtio net headers: creation, offload flags, MTU, link state, and the
//! read/writev calls the TAP port uses.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use super::cvt;

const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
const TUNSETOFFLOAD: libc::c_ulong = 0x4004_54d0;
const TUNSETVNETHDRSZ: libc::c_ulong = 0x4004_54d8;
const TUNSETPERSIST: libc::c_ulong = 0x4004_54cb;
const TUNGETIFF: libc::c_ulong = 0x8004_54d2;
const IFF_TAP: i16 = 0x0002;
const IFF_NO_PI: i16 = 0x1000;
const IFF_VNET_HDR: i16 = 0x4000;
const IFF_TUN_EXCL: i16 = -0x8000; // 0x8000 as a C short
const TUN_F_CSUM: u32 = 0x01;
const TUN_F_TSO4: u32 = 0x02;
const TUN_F_TSO6: u32 = 0x04;
const TUN_F_TSO_ECN: u32 = 0x08;
const TUN_F_USO4: u32 = 0x20;
const TUN_F_USO6: u32 = 0x40;
const SIOCGIFFLAGS: libc::c_ulong = 0x8913;
const SIOCSIFFLAGS: libc::c_ulong = 0x8914;
const SIOCSIFMTU: libc::c_ulong = 0x8922;
const SIOCGIFHWADDR: libc::c_ulong = 0x8927;

/// `struct ifreq`: a name and a 24-byte union, of which we use the short flags and the
/// int MTU.
#[repr(C)]
struct IfReq {
    name: [u8; libc::IFNAMSIZ],
    data: [u8; 24],
}

impl IfReq {
    fn new(name: &str) -> Self {
        let mut r = IfReq { name: [0; libc::IFNAMSIZ], data: [0; 24] };
        r.name[..name.len()].copy_from_slice(name.as_bytes());
        r
    }
}

/// The flags (`IFF_UP`, `IFF_RUNNING`, …) of interface `name` in the network namespace
/// of socket `sock` (any socket of that namespace will do).
pub fn link_flags(sock: RawFd, name: &str) -> io::Result<i16> {
    check_ifname(name).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let mut req = IfReq::new(name);
    // SAFETY: SIOCGIFFLAGS fills the flags of a `struct ifreq`, which `req` is.
    cvt(unsafe { libc::ioctl(sock, SIOCGIFFLAGS, &mut req) })?;
    Ok(i16::from_ne_bytes([req.data[0], req.data[1]]))
}

/// The hardware (MAC) address of interface `name` in the network namespace of socket
/// `sock`.
pub fn link_mac(sock: RawFd, name: &str) -> io::Result<[u8; 6]> {
    check_ifname(name).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let mut req = IfReq::new(name);
    // SAFETY: SIOCGIFHWADDR fills a `struct sockaddr` (family, then the address) in the
    // union of a `struct ifreq`, which `req` is.
    cvt(unsafe { libc::ioctl(sock, SIOCGIFHWADDR, &mut req) })?;
    let mut mac = [0u8; 6];
    mac.copy_from_slice(&req.data[2..8]);
    Ok(mac)
}

pub use crate::names::check_ifname;

/// A TAP device opened by sluice.
pub struct Tap {
    /// The queue's file descriptor (non-blocking).
    pub fd: OwnedFd,
    /// /proc/net/dev of the namespace the device was created in, for its drop counters.
    pub stats: Option<File>,
    /// The device's index in its namespace.
    pub ifindex: u32,
}

/// A fresh descriptor of /dev/net/tun (non-blocking, close-on-exec), not yet a device's.
fn open_tun() -> io::Result<OwnedFd> {
    // SAFETY: opening a path with a NUL-terminated literal; the result is checked.
    let raw = cvt(unsafe { libc::open(c"/dev/net/tun".as_ptr(), libc::O_RDWR | libc::O_NONBLOCK | libc::O_CLOEXEC) })
        .map_err(|e| {
        io::Error::new(e.kind(), format!("cannot open /dev/net/tun ({e}); is the tun module loaded and are you root?"))
    })?;
    // SAFETY: `raw` is a fresh descriptor owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// Makes `fd` a queue of TAP `name` with `flags` (TUNSETIFF: creates the device unless it
/// exists); the kernel's error is returned as it is, for the caller to explain.
fn set_iff(fd: &OwnedFd, name: &str, flags: i16) -> io::Result<()> {
    let mut req = IfReq::new(name);
    req.data[..2].copy_from_slice(&flags.to_ne_bytes());
    // SAFETY: TUNSETIFF reads and writes a `struct ifreq`, which `req` is (40 bytes).
    cvt(unsafe { libc::ioctl(fd.as_raw_fd(), TUNSETIFF, &mut req) }).map(|_| ())
}

/// The 12-byte virtio header on every frame, and the offloads the guest may use.
fn set_vnet(fd: &OwnedFd, offload: bool) -> io::Result<()> {
    let hdr: libc::c_int = 12;
    // SAFETY: TUNSETVNETHDRSZ reads an int from the pointer.
    cvt(unsafe { libc::ioctl(fd.as_raw_fd(), TUNSETVNETHDRSZ, &hdr) })?;
    set_offload(fd.as_raw_fd(), offload)
}

/// True if interface `name` is the TAP with index `ifindex` (an index is never handed out
/// twice in a namespace, so no other device passes).
fn is_that_tap(name: &str, ifindex: u32) -> bool {
    super::link::ifindex(name).ok() == Some(ifindex) && super::link::driver(name).is_ok_and(|d| d == "tun")
}

/// Opens a guest's TAP `name` in the calling thread's network namespace, persistent (it
/// outlives a crash of the daemon, so the guest keeps its interface, addresses and
/// connections): adopts the TAP an earlier run of the same switch left when `known` is the
/// index it had and the device of that name still has it and is a TAP ([`is_that_tap`]); otherwise creates it as
/// [`create_tap`] does. A TAP some other process holds is refused by the kernel (busy).
pub fn open_tap(name: &str, offload: bool, mtu: u16, known: Option<u32>) -> io::Result<Tap> {
    let tap = if known.is_some_and(|ix| is_that_tap(name, ix)) {
        adopt_tap(name, offload)?
    } else {
        create_tap(name, offload, mtu)?
    };
    if let Err(e) = set_persist(tap.fd.as_raw_fd(), true) {
        return Err(io::Error::new(e.kind(), format!("cannot make TAP {name:?} persistent: {e}")));
    }
    Ok(tap)
}

/// Deletes the persistent TAP `name` an earlier run of the switch left with index
/// `ifindex` and no port took again; a device that is not that one is left alone. True if
/// it was deleted.
pub fn remove_left_tap(name: &str, ifindex: u32) -> io::Result<bool> {
    if !is_that_tap(name, ifindex) {
        return Ok(false);
    }
    let tap = adopt_tap(name, false)?;
    // Not persistent any more: it goes with the descriptor, dropped here.
    set_persist(tap.fd.as_raw_fd(), false)?;
    Ok(true)
}

/// Attaches to the persistent TAP `name` as it is (its MTU, state and the guest's
/// addresses stay).
fn adopt_tap(name: &str, offload: bool) -> io::Result<Tap> {
    let fd = open_tun()?;
    set_iff(&fd, name, IFF_TAP | IFF_NO_PI | IFF_VNET_HDR)
        .map_err(|e| io::Error::new(e.kind(), format!("cannot attach to the TAP {name:?} an earlier run left: {e}")))?;
    set_vnet(&fd, offload)?;
    let ifindex = super::link::ifindex(name)?;
    Ok(Tap { fd, stats: File::open("/proc/thread-self/net/dev").ok(), ifindex })
}

/// Creates TAP device `name` in the calling thread's network namespace with a 12-byte
/// virtio header, the given offloads and MTU, and sets it up. Fails if a device of that
/// name exists (sluice never takes over an interface it did not create).
pub fn create_tap(name: &str, offload: bool, mtu: u16) -> io::Result<Tap> {
    check_ifname(name).map_err(io::Error::other)?;
    let fd = open_tun()?;
    set_iff(&fd, name, IFF_TAP | IFF_NO_PI | IFF_VNET_HDR | IFF_TUN_EXCL).map_err(|e| {
        if e.raw_os_error() == Some(libc::EBUSY) || e.raw_os_error() == Some(libc::EEXIST) {
            io::Error::new(e.kind(), format!("an interface named {name:?} already exists; pick another name"))
        } else {
            io::Error::new(e.kind(), format!("cannot create TAP {name:?}: {e}"))
        }
    })?;
    set_vnet(&fd, offload)?;

    let sock = control_socket()?;
    let mut req = IfReq::new(name);
    req.data[..4].copy_from_slice(&i32::from(mtu).to_ne_bytes());
    // SAFETY: SIOCSIFMTU reads a `struct ifreq` with the MTU in its union.
    cvt(unsafe { libc::ioctl(sock.as_raw_fd(), SIOCSIFMTU, &mut req) })
        .map_err(|e| io::Error::new(e.kind(), format!("cannot set MTU {mtu} on {name:?}: {e}")))?;
    let mut req = IfReq::new(name);
    // SAFETY: SIOCGIFFLAGS fills the flags of a `struct ifreq`.
    cvt(unsafe { libc::ioctl(sock.as_raw_fd(), SIOCGIFFLAGS, &mut req) })?;
    let flags = i16::from_ne_bytes([req.data[0], req.data[1]]) | libc::IFF_UP as i16;
    req.data[..2].copy_from_slice(&flags.to_ne_bytes());
    // SAFETY: SIOCSIFFLAGS reads the flags of a `struct ifreq`.
    cvt(unsafe { libc::ioctl(sock.as_raw_fd(), SIOCSIFFLAGS, &mut req) })?;

    // /proc/thread-self/net is the namespace of this thread: keep it open to read the
    // device's counters later from any thread.
    let stats = File::open("/proc/thread-self/net/dev").ok();
    let ifindex = super::link::ifindex(name)?;
    Ok(Tap { fd, stats, ifindex })
}

/// Opens the kernel datapath's upcall TAP `name`: creates it, or — when an earlier run of
/// the same switch left it (it is persistent, so the kernel's redirects always have a
/// device) — opens it again. Virtio headers and every offload, so GSO frames go up whole;
/// brought up with a long queue. Frames are read with [`read_upcall`].
pub fn open_upcall_tap(name: &str) -> io::Result<Tap> {
    check_ifname(name).map_err(io::Error::other)?;
    let fd = open_tun()?;
    set_iff(&fd, name, IFF_TAP | IFF_NO_PI | IFF_VNET_HDR)
        .map_err(|e| io::Error::new(e.kind(), format!("cannot open the upcall TAP {name:?}: {e}")))?;
    let set_up = || -> io::Result<()> {
        set_vnet(&fd, true)?;
        set_persist(fd.as_raw_fd(), true)?;
        super::link::set_mtu(name, 9216)?;
        super::link::set_txqlen(name, 4096)?;
        super::link::disable_ipv6(name)?;
        super::link::set_up(name)
    };
    if let Err(e) = set_up() {
        // Not left behind half made: without persistence it goes with this descriptor.
        let _ = set_persist(fd.as_raw_fd(), false);
        return Err(io::Error::new(e.kind(), format!("setting up the upcall TAP {name:?}: {e}")));
    }
    let stats = File::open("/proc/thread-self/net/dev").ok();
    let ifindex = super::link::ifindex(name)?;
    Ok(Tap { fd, stats, ifindex })
}

/// Takes the upcall TAP `name` from descriptor `raw`, which an earlier run of the daemon
/// left open across `exec` (so the frames queued in it are not lost): checked to be that
/// TAP, made non-blocking and close-on-exec again. `None` when it is not.
pub fn adopt_upcall_tap(raw: RawFd, name: &str) -> Option<Tap> {
    if raw < 3 || tap_name(raw).as_deref() != Some(name) {
        return None;
    }
    // SAFETY: the descriptor is open (TUNGETIFF answered on it) and was handed to this
    // process to own; nothing else in it refers to it.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: fcntl on a descriptor we own, with plain flag arguments.
    unsafe {
        let fl = libc::fcntl(raw, libc::F_GETFL);
        libc::fcntl(raw, libc::F_SETFL, fl | libc::O_NONBLOCK);
        libc::fcntl(raw, libc::F_SETFD, libc::FD_CLOEXEC);
    }
    let stats = File::open("/proc/thread-self/net/dev").ok();
    let ifindex = super::link::ifindex(name).ok()?;
    Some(Tap { fd, stats, ifindex })
}

/// The name of the TUN/TAP device behind `fd`, if it is one.
fn tap_name(fd: RawFd) -> Option<String> {
    let mut req = IfReq::new("");
    // SAFETY: TUNGETIFF fills the name and flags of a `struct ifreq`, which `req` is; on
    // a descriptor that is not a TUN/TAP it fails and writes nothing.
    cvt(unsafe { libc::ioctl(fd, TUNGETIFF, &mut req) }).ok()?;
    let end = req.name.iter().position(|&b| b == 0).unwrap_or(libc::IFNAMSIZ);
    String::from_utf8(req.name[..end].to_vec()).ok()
}

/// Makes the TAP behind `fd` outlive its descriptors (or not: then it goes with the last).
pub fn set_persist(fd: RawFd, persist: bool) -> io::Result<()> {
    // SAFETY: TUNSETPERSIST takes its flag by value.
    cvt(unsafe { libc::ioctl(fd, TUNSETPERSIST, libc::c_ulong::from(persist)) })?;
    Ok(())
}

/// Reads one frame from the upcall TAP into `buf` (virtio header first), without the
/// 4-byte outer tag the kernel datapath put after the MAC addresses; returns the frame's
/// length (header excluded) and that tag's TPID and TCI, or `Ok(None)` when none waits.
pub fn read_upcall(fd: RawFd, buf: &mut [u8]) -> io::Result<Option<(usize, u16, u16)>> {
    const HEAD: usize = 12 + 12; // virtio header, MAC addresses
    if buf.len() < HEAD + 2 {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "buffer too small"));
    }
    let mut tag = [0u8; 4];
    let (head, rest) = buf.split_at_mut(HEAD);
    let iov = [
        libc::iovec { iov_base: head.as_mut_ptr().cast(), iov_len: head.len() },
        libc::iovec { iov_base: tag.as_mut_ptr().cast(), iov_len: 4 },
        libc::iovec { iov_base: rest.as_mut_ptr().cast(), iov_len: rest.len() },
    ];
    loop {
        // SAFETY: the iovecs point at live, writable buffers borrowed for this call.
        let n = unsafe { libc::readv(fd, iov.as_ptr(), 3) };
        if n >= 0 {
            let n = n as usize;
            if n < HEAD + 4 {
                return Err(io::Error::new(io::ErrorKind::InvalidData, format!("a {n}-byte read has no outer tag")));
            }
            let tpid = u16::from_be_bytes([tag[0], tag[1]]);
            let tci = u16::from_be_bytes([tag[2], tag[3]]);
            return Ok(Some((n - 4 - 12, tpid, tci)));
        }
        let e = io::Error::last_os_error();
        match e.kind() {
            io::ErrorKind::Interrupted => continue,
            io::ErrorKind::WouldBlock => return Ok(None),
            _ => return Err(e),
        }
    }
}

fn set_offload(fd: RawFd, offload: bool) -> io::Result<()> {
    let base = TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6 | TUN_F_TSO_ECN;
    let tries: &[libc::c_ulong] = if offload { &[(base | TUN_F_USO4 | TUN_F_USO6) as _, base as _] } else { &[0] };
    let mut last = Ok(0);
    for &flags in tries {
        // SAFETY: TUNSETOFFLOAD takes its flags by value.
        last = cvt(unsafe { libc::ioctl(fd, TUNSETOFFLOAD, flags) });
        if last.is_ok() {
            break;
        }
    }
    last.map(|_| ())
}

fn control_socket() -> io::Result<OwnedFd> {
    // SAFETY: plain socket(2); the descriptor is owned below.
    let s = cvt(unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: `s` is fresh and owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(s) })
}

/// Reads one frame (virtio header first). `Ok(None)` when none is waiting.
pub fn read(fd: RawFd, buf: &mut [u8]) -> io::Result<Option<usize>> {
    // SAFETY: `buf` is valid for writes of `buf.len()` bytes.
    let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        let e = io::Error::last_os_error();
        return match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(None),
            _ => Err(e),
        };
    }
    Ok(Some(n as usize))
}

/// Writes one frame given as byte runs. `Ok(false)` when the device cannot take it now.
pub fn writev(fd: RawFd, parts: &[&[u8]]) -> io::Result<bool> {
    let mut iov = [libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }; 4];
    let n = parts.len().min(4);
    for (v, p) in iov.iter_mut().zip(parts) {
        v.iov_base = p.as_ptr() as *mut libc::c_void;
        v.iov_len = p.len();
    }
    loop {
        // SAFETY: the first `n` iovecs point at live slices borrowed for this call; writev
        // only reads through them.
        let r = unsafe { libc::writev(fd, iov.as_ptr(), n as i32) };
        if r >= 0 {
            return Ok(true);
        }
        let e = io::Error::last_os_error();
        match e.kind() {
            io::ErrorKind::Interrupted => continue,
            io::ErrorKind::WouldBlock => return Ok(false),
            _ => return Err(e),
        }
    }
}

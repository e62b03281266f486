//! Network interfaces by name in the calling thread's namespace: index, driver, MTU, up,
//! IPv6 off — what attaching an existing interface (a veth end) to the kernel datapath
//! needs.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use super::cvt;

const SIOCETHTOOL: libc::c_ulong = 0x8946;
const ETHTOOL_GDRVINFO: u32 = 0x0000_0003;
const SIOCGIFFLAGS: libc::c_ulong = 0x8913;
const SIOCSIFFLAGS: libc::c_ulong = 0x8914;
const SIOCSIFMTU: libc::c_ulong = 0x8922;
const SIOCSIFTXQLEN: libc::c_ulong = 0x8943;

/// `struct ifreq`: a name and a 24-byte union.
#[repr(C)]
struct IfReq {
    name: [u8; libc::IFNAMSIZ],
    data: [u8; 24],
}

fn ifreq(name: &str) -> io::Result<IfReq> {
    crate::names::check_ifname(name).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let mut r = IfReq { name: [0; libc::IFNAMSIZ], data: [0; 24] };
    r.name[..name.len()].copy_from_slice(name.as_bytes());
    Ok(r)
}

fn control_socket() -> io::Result<OwnedFd> {
    // SAFETY: plain socket(2); the descriptor is owned below.
    let s = cvt(unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: `s` is fresh and owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(s) })
}

/// The index of interface `name`.
pub fn ifindex(name: &str) -> io::Result<u32> {
    super::packet::ifindex(name).map(|i| i as u32)
}

/// The name of interface `name`'s driver ("veth", "tun", "virtio_net", …).
pub fn driver(name: &str) -> io::Result<String> {
    // struct ethtool_drvinfo: cmd, then driver[32], version[32], fw_version[32], …
    let mut info = [0u8; 196];
    info[..4].copy_from_slice(&ETHTOOL_GDRVINFO.to_ne_bytes());
    let mut req = ifreq(name)?;
    let ptr = info.as_mut_ptr() as usize;
    req.data[..8].copy_from_slice(&ptr.to_ne_bytes());
    let sock = control_socket()?;
    // SAFETY: SIOCETHTOOL with ETHTOOL_GDRVINFO writes a `struct ethtool_drvinfo` (196
    // bytes) through the pointer in the ifreq's union; `info` is that large and lives
    // through the call.
    cvt(unsafe { libc::ioctl(sock.as_raw_fd(), SIOCETHTOOL, &mut req) })?;
    let d = &info[4..36];
    let end = d.iter().position(|&b| b == 0).unwrap_or(d.len());
    Ok(String::from_utf8_lossy(&d[..end]).into_owned())
}

/// Sets interface `name`'s MTU.
pub fn set_mtu(name: &str, mtu: u16) -> io::Result<()> {
    let mut req = ifreq(name)?;
    req.data[..4].copy_from_slice(&i32::from(mtu).to_ne_bytes());
    let sock = control_socket()?;
    // SAFETY: SIOCSIFMTU reads a `struct ifreq` with the MTU in its union.
    cvt(unsafe { libc::ioctl(sock.as_raw_fd(), SIOCSIFMTU, &mut req) })?;
    Ok(())
}

/// Sets interface `name`'s transmit queue length.
pub fn set_txqlen(name: &str, len: u32) -> io::Result<()> {
    let mut req = ifreq(name)?;
    req.data[..4].copy_from_slice(&(len as i32).to_ne_bytes());
    let sock = control_socket()?;
    // SAFETY: SIOCSIFTXQLEN reads a `struct ifreq` with the length in its union.
    cvt(unsafe { libc::ioctl(sock.as_raw_fd(), SIOCSIFTXQLEN, &mut req) })?;
    Ok(())
}

/// Brings interface `name` up.
pub fn set_up(name: &str) -> io::Result<()> {
    let sock = control_socket()?;
    let mut req = ifreq(name)?;
    // SAFETY: SIOCGIFFLAGS fills the flags of a `struct ifreq`.
    cvt(unsafe { libc::ioctl(sock.as_raw_fd(), SIOCGIFFLAGS, &mut req) })?;
    let flags = i16::from_ne_bytes([req.data[0], req.data[1]]) | libc::IFF_UP as i16;
    req.data[..2].copy_from_slice(&flags.to_ne_bytes());
    // SAFETY: SIOCSIFFLAGS reads the flags of a `struct ifreq`.
    cvt(unsafe { libc::ioctl(sock.as_raw_fd(), SIOCSIFFLAGS, &mut req) })?;
    Ok(())
}

/// Turns IPv6 off on interface `name`, so the host's own stack neither configures an
/// address there nor sends router solicitations and MLD reports into the guest's link.
pub fn disable_ipv6(name: &str) -> io::Result<()> {
    crate::names::check_ifname(name).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    match std::fs::write(format!("/proc/sys/net/ipv6/conf/{name}/disable_ipv6"), "1") {
        // A kernel without IPv6 has nothing to turn off.
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

/// The name of the interface with index `ifindex` in this thread's namespace.
pub fn name_of(ifindex: u32) -> Option<String> {
    let mut buf = [0 as libc::c_char; libc::IFNAMSIZ];
    // SAFETY: if_indextoname writes at most IFNAMSIZ bytes (NUL included) into `buf`.
    let p = unsafe { libc::if_indextoname(ifindex, buf.as_mut_ptr()) };
    if p.is_null() {
        return None;
    }
    // SAFETY: on success `buf` holds a NUL-terminated name.
    Some(unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned())
}

/// Whether interface `ifindex` is a veth whose peer is in this same namespace (so the
/// kernel datapath must send to it as to any device, not into the peer's namespace):
/// its peer — the interface its `iflink` names — is here, is a veth, and names it back.
pub fn veth_peer_here(ifindex: u32) -> bool {
    let iflink = |name: &str| -> Option<u32> {
        std::fs::read_to_string(format!("/sys/class/net/{name}/iflink")).ok()?.trim().parse().ok()
    };
    let Some(me) = name_of(ifindex) else { return false };
    if driver(&me).ok().as_deref() != Some("veth") {
        return false;
    }
    let Some(peer) = iflink(&me).filter(|&p| p != ifindex && p != 0) else { return false };
    let Some(peer_name) = name_of(peer) else { return false };
    driver(&peer_name).ok().as_deref() == Some("veth") && iflink(&peer_name) == Some(ifindex)
}

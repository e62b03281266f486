//! A VXLAN tunnel port (RFC 7348): one UDP socket bound to the local underlay address;
//! frames go out with an 8-byte VXLAN header to the endpoint their destination was learned
//! behind, or to every endpoint once (head-end replication); frames come in from any
//! endpoint, which is learned. The kernel builds the outer IP and UDP headers and their
//! checksums. The table and the VNI map are `sluice_switch::tunnel`'s; this file is the I/O
//! (docs/architecture.md, "VXLAN tunnels").
//!
//! The port has no offloads: the switch cuts GSO frames and completes checksums before
//! they get here, so what leaves is what any VXLAN endpoint can read.

use std::io;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, RawFd};
use std::time::Instant;

use sluice_switch::port::DeviceDrops;
use sluice_switch::tunnel::{Endpoints, VniMap};
use sluice_switch::{OutFrame, Port, PortCaps, PortError, TxOutcome};
use sluice_wire::vxlan::{self, VXLAN_HDR_LEN};
use sluice_wire::{ETHERTYPE_VLAN, MacAddr, VNET_HDR_LEN};

use crate::config::VxlanSettings;

/// Stations learned behind one tunnel port at most.
const MAX_STATIONS: usize = 8192;
/// Endpoints learned (besides the configured ones) at most.
const MAX_ENDPOINTS: usize = 256;
/// The tunnel socket's receive and send buffers: a window of full-size datagrams between
/// two reads (the default 208 KiB dropped a quarter of a single TCP stream's segments).
const SOCKET_BUFFER: libc::c_int = 8 << 20;
/// Aging of learned stations and endpoints (the switch's default).
const AGING_MS: u64 = 300_000;

/// A VXLAN tunnel attached to the switch.
pub struct VxlanPort {
    sock: UdpSocket,
    dstport: u16,
    vnis: VniMap,
    table: Endpoints,
    start: Instant,
    /// Datagrams refused on the way in (too short, no I flag, a VNI the port does not
    /// carry, a frame too big for the buffer).
    bad_in: u64,
    /// Frames that could not go out (no endpoint to send to, a VLAN with no VNI, a send
    /// error).
    lost_out: u64,
    /// One outgoing datagram: the header, then the frame.
    out: Vec<u8>,
    /// The UDP socket table of the socket's namespace (/proc/net/udp or udp6, opened from
    /// inside it) and the socket's inode: the kernel's count of datagrams it dropped for
    /// this socket (a full receive buffer) is read from there.
    udp_table: Option<(std::fs::File, u64)>,
}

impl VxlanPort {
    /// Binds the tunnel's socket (in the calling thread's network namespace).
    pub fn open(v: &VxlanSettings) -> io::Result<Self> {
        let sock = UdpSocket::bind(SocketAddr::new(v.local, v.dstport)).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!(
                    "binding UDP {}:{} for the tunnel: {e} (is {} an address of this host, and is the port free — a kernel vxlan device on it?)",
                    v.local, v.dstport, v.local
                ),
            )
        })?;
        sock.set_nonblocking(true)?;
        crate::sys::packet::grow_socket_buffers(sock.as_raw_fd(), SOCKET_BUFFER);
        let table = if v.local.is_ipv4() { "udp" } else { "udp6" };
        let udp_table = std::fs::File::open(format!("/proc/thread-self/net/{table}")).ok().zip(
            std::fs::metadata(format!("/proc/self/fd/{}", sock.as_raw_fd())).ok().map(|m| {
                use std::os::unix::fs::MetadataExt;
                m.ino()
            }),
        );
        Ok(VxlanPort {
            sock,
            dstport: v.dstport,
            vnis: v.vnis.clone(),
            table: Endpoints::new(v.remotes.clone(), MAX_STATIONS, MAX_ENDPOINTS, AGING_MS),
            start: Instant::now(),
            bad_in: 0,
            lost_out: 0,
            out: Vec::with_capacity(VXLAN_HDR_LEN + 65_536),
            udp_table,
        })
    }

    /// The descriptor the event loop watches.
    pub fn raw_fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }

    fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }
}

/// The `drops` column of the socket with inode `ino` in a /proc/net/udp(6) table.
fn socket_drops(table: &std::fs::File, ino: u64) -> Option<u64> {
    use std::os::unix::fs::FileExt;
    // A table of a few sockets; a namespace with thousands is read in part (the count is
    // then missing, not wrong).
    let mut buf = vec![0u8; 64 * 1024];
    let n = table.read_at(&mut buf, 0).ok()?;
    udp_table_drops(std::str::from_utf8(&buf[..n]).ok()?, ino)
}

/// Parses a /proc/net/udp(6) text: the last column (`drops`) of the line whose `inode`
/// column (the 10th) is `ino`.
fn udp_table_drops(text: &str, ino: u64) -> Option<u64> {
    text.lines().skip(1).find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.get(9)?.parse::<u64>().ok()? == ino).then(|| f.last()?.parse().ok())?
    })
}

/// The MTU of the interface holding `local` in namespace `netns` (the daemon's own if
/// `None`), less the tunnel's overhead: the largest inner MTU that crosses without
/// fragmenting (the overhead counts the outer Ethernet, IP, UDP and VXLAN headers; the
/// inner frame's Ethernet header rides inside the outer payload).
pub fn inner_mtu(netns: Option<&str>, local: IpAddr) -> io::Result<u16> {
    let overhead = if local.is_ipv4() { vxlan::VXLAN_OVERHEAD_V4 } else { vxlan::VXLAN_OVERHEAD_V6 };
    let mut cmd = std::process::Command::new("ip");
    if let Some(ns) = netns {
        cmd.args(["-n", ns]);
    }
    let out = cmd.args(["-j", "addr", "show"]).output()?;
    if !out.status.success() {
        return Err(io::Error::other(format!("ip addr show: {}", String::from_utf8_lossy(&out.stderr).trim())));
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).map_err(io::Error::other)?;
    let mtu = v
        .as_array()
        .into_iter()
        .flatten()
        .find(|l| {
            l["addr_info"].as_array().into_iter().flatten().any(|a| a["local"].as_str().and_then(|x| x.parse::<IpAddr>().ok()) == Some(local))
        })
        .and_then(|l| l["mtu"].as_u64())
        .ok_or_else(|| {
            io::Error::other(format!(
                "{local} is not an address of {} (`ip{} addr show` lists them); a tunnel binds to one of its host's addresses",
                netns.map_or("this host".to_string(), |n| format!("namespace {n}")),
                netns.map(|n| format!(" -n {n}")).unwrap_or_default()
            ))
        })?;
    let inner = (mtu as usize).saturating_sub(overhead).max(68);
    u16::try_from(inner.min(9000)).map_err(io::Error::other)
}

impl Port for VxlanPort {
    fn kind(&self) -> &'static str {
        "vxlan"
    }

    fn caps(&self) -> PortCaps {
        PortCaps { offload: false, lossless_input: false }
    }

    fn recv(&mut self, buf: &mut [u8]) -> Result<Option<usize>, PortError> {
        // The datagram lands so that its inner frame starts at buf[VNET_HDR_LEN], with room
        // left for a tag to insert.
        let at = VNET_HDR_LEN - VXLAN_HDR_LEN;
        loop {
            let room = buf.len().saturating_sub(at + 4);
            let (n, from) = match self.sock.recv_from(&mut buf[at..at + room]) {
                Ok(r) => r,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(PortError::Io(e)),
            };
            if n == room {
                // Possibly cut short (a datagram larger than any frame the switch takes).
                self.bad_in += 1;
                continue;
            }
            let Ok((vni, inner)) = vxlan::decap(&buf[at..at + n]) else {
                self.bad_in += 1;
                continue;
            };
            let mut len = inner.len();
            let Some(vlan) = self.vnis.vlan_of(vni) else {
                self.bad_in += 1;
                continue;
            };
            let src = MacAddr(buf[VNET_HDR_LEN + 6..VNET_HDR_LEN + 12].try_into().expect("6 bytes"));
            let now = self.now_ms();
            self.table.learn(vni, src, from.ip(), now);
            if let Some(vid) = vlan {
                // The frame's VLAN travels as its VNI: the tag goes back on here.
                let f = VNET_HDR_LEN;
                buf.copy_within(f + 12..f + len, f + 16);
                buf[f + 12..f + 14].copy_from_slice(&ETHERTYPE_VLAN.to_be_bytes());
                buf[f + 14..f + 16].copy_from_slice(&vid.to_be_bytes());
                len += 4;
            }
            buf[..VNET_HDR_LEN].fill(0);
            return Ok(Some(len));
        }
    }

    fn send(&mut self, f: &OutFrame<'_>) -> Result<TxOutcome, PortError> {
        let vid = f.tag.map(|t| u16::from_be_bytes([t[2], t[3]]) & 0x0fff);
        let Some(vni) = self.vnis.vni_of(vid) else {
            self.lost_out += 1;
            return Ok(TxOutcome::Sent);
        };
        let Ok(dst) = <[u8; 6]>::try_from(&f.macs[..6.min(f.macs.len())]) else {
            self.lost_out += 1;
            return Ok(TxOutcome::Sent);
        };
        self.out.clear();
        self.out.extend_from_slice(&vxlan::header(vni));
        self.out.extend_from_slice(f.macs);
        // A per-VLAN tunnel carries the VLAN in the VNI; a single-VNI port is an access
        // port and gets no tag.
        if matches!(self.vnis, VniMap::Single(_))
            && let Some(tag) = f.tag
        {
            self.out.extend_from_slice(&tag);
        }
        self.out.extend_from_slice(f.rest);
        let now = self.now_ms();
        let (out, sock, port) = (&self.out, &self.sock, self.dstport);
        let (mut sent, mut busy, mut lost) = (0u64, 0u64, 0u64);
        self.table.targets(vni, MacAddr(dst), now, |ep| match sock.send_to(out, SocketAddr::new(ep, port)) {
            Ok(_) => sent += 1,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => busy += 1,
            Err(_) => lost += 1,
        });
        // Full only when no copy left: offering the frame again must not send a second
        // copy to an endpoint that took the first.
        if busy > 0 && sent == 0 && lost == 0 {
            return Ok(TxOutcome::Full);
        }
        lost += busy;
        self.lost_out += lost;
        if sent == 0 && lost == 0 {
            // Nowhere to send: no remote configured or heard from yet.
            self.lost_out += 1;
        }
        Ok(TxOutcome::Sent)
    }

    fn device_drops(&self) -> Option<DeviceDrops> {
        let kernel = self.udp_table.as_ref().and_then(|(f, ino)| socket_drops(f, *ino)).unwrap_or(0);
        Some(DeviceDrops { to_guest: self.lost_out, from_guest: self.bad_in + kernel })
    }

    fn endpoint_of(&self, vlan: u16, mac: MacAddr) -> Option<String> {
        let vni = match self.vnis {
            VniMap::Single(v) => v,
            VniMap::PerVlan(_) => self.vnis.vni_of(Some(vlan))?,
        };
        self.table.endpoint_of(vni, mac).map(|a| a.to_string())
    }

    fn tick(&mut self) -> Option<String> {
        let now = self.now_ms();
        self.table.expire(now);
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sockets_drops_are_found_by_its_inode() {
        let t = "   sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode ref pointer drops\n\
  1: 0100A8C0:12B5 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 41235 2 0000000000000000 17\n\
  2: 00000000:0044 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 999 2 0000000000000000 0\n";
        assert_eq!(udp_table_drops(t, 41235), Some(17));
        assert_eq!(udp_table_drops(t, 999), Some(0));
        assert_eq!(udp_table_drops(t, 5), None);
        assert_eq!(udp_table_drops("", 5), None);
    }
}

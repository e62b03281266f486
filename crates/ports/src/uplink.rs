//! An uplink port: a host interface (a NIC, or a veth towards another namespace) that
//! connects the switch to the real LAN, through an AF_PACKET socket (`sys::packet`).
//!
//! Received frames get back the 802.1Q tag the kernel took off (the switch's VLAN ingress
//! then treats them as any trunk or access port's frames). With offloads the socket
//! carries virtio headers both ways, so GSO frames cross whole; the kernel segments them
//! for a device without TSO. The socket is read into the switch's buffer directly: one copy,
//! as for a TAP (docs/architecture.md says why this is not a TPACKET ring).

use std::io;
use std::os::fd::{AsRawFd, RawFd};

use sluice_switch::{OutFrame, Port, PortCaps, PortError, TxOutcome};
use sluice_wire::{VNET_HDR_LEN, VnetHdr};

use sluice_api::config::PortSpec;
use sluice_sys::error::Context;
use sluice_sys::netns;
use sluice_sys::packet::{self, PacketSocket};

use crate::{Attachment, Result};

/// Opens the interface of uplink port `spec` (and its backups) in the port's namespace;
/// with `kernel`, the port is the kernel datapath's (see [`UplinkPort`]).
pub fn attach(spec: &PortSpec, kernel: bool) -> Result<Attachment> {
    let (name, backups, offload) = (spec.name.clone(), spec.backups.clone(), spec.offload);
    let up = netns::run_in(spec.netns.as_deref(), move || UplinkPort::open(&name, &backups, offload, kernel))
        .with_context(|| format!("opening uplink interface {:?}", spec.name))?;
    let fd = up.raw_fd();
    Ok(Attachment::new(Box::new(up), fd))
}

/// A host interface attached as the switch's uplink, with up to two backups.
///
/// On the kernel datapath the socket only sends (the core's frames for the LAN); what the
/// LAN sends is taken by the TC program on the devices, forwarded in the kernel or handed
/// up through the upcall TAP — `recv` has nothing then.
pub struct UplinkPort {
    sock: PacketSocket,
    offload: bool,
    kernel: bool,
    /// (name, ifindex) of the primary device and its backups, in order of preference.
    devices: Vec<(String, i32)>,
    /// The device the socket is bound to.
    active: usize,
    /// A move to another device made on an I/O error, reported at the next tick.
    pending: Option<String>,
}

impl UplinkPort {
    /// Opens interface `ifname` of the calling thread's namespace (see
    /// `sys::netns::run_in`). With `offload` the switch sends it GSO frames whole and
    /// partial checksums; without, it segments and completes them first (received frames
    /// carry their offload state either way).
    ///
    /// `backups` are devices of the same namespace that take over, in order, when the
    /// active one is down or loses carrier.
    ///
    /// With `kernel`, the port is the kernel datapath's: see the type's description.
    pub fn open(ifname: &str, backups: &[String], offload: bool, kernel: bool) -> io::Result<Self> {
        let mut devices = vec![(ifname.to_string(), packet::ifindex(ifname)?)];
        for b in backups {
            devices.push((b.clone(), packet::ifindex(b)?));
        }
        let sock = packet::open(&devices.iter().map(|d| d.1).collect::<Vec<_>>(), !kernel)?;
        if kernel {
            for (name, _) in &devices {
                sluice_sys::link::disable_ipv6(name)?;
            }
        }
        let mut port = UplinkPort { offload: offload && sock.vnet, sock, kernel, devices, active: 0, pending: None };
        // Start on the first device that is up, if the primary is not.
        if !port.usable(0)
            && let Some(i) = (1..port.devices.len()).find(|&i| port.usable(i))
        {
            port.sock.bind(port.devices[i].1)?;
            port.active = i;
        }
        Ok(port)
    }

    /// Moves to the next usable device if the active one is not; says what it did.
    fn failover(&mut self) -> Option<String> {
        if self.devices.len() < 2 || self.usable(self.active) {
            return None;
        }
        let n = self.devices.len();
        let next = (1..n).map(|k| (self.active + k) % n).find(|&i| self.usable(i))?;
        let from = self.devices[self.active].0.clone();
        match self.sock.bind(self.devices[next].1) {
            Ok(()) => {
                self.active = next;
                Some(format!("{from} is down or has no carrier; now on {}", self.devices[next].0))
            }
            Err(e) => Some(format!("{from} is down; moving to {} failed: {e}", self.devices[next].0)),
        }
    }

    /// An I/O error of the active device: a device that went down (or away) makes the port
    /// move to a backup, if one is usable; `Ok(())` means try again. A device that is only
    /// down, with nowhere to go, is waited for; one that is gone fails the port.
    fn on_error(&mut self, e: io::Error) -> Result<(), PortError> {
        match e.raw_os_error() {
            Some(libc::ENETDOWN | libc::ENXIO | libc::ENODEV) => {
                if let Some(what) = self.failover() {
                    self.pending = Some(what);
                    return Ok(());
                }
                if e.raw_os_error() == Some(libc::ENETDOWN) { Ok(()) } else { Err(PortError::Gone(e)) }
            }
            Some(libc::EBADF) => Err(PortError::Gone(e)),
            _ => Err(PortError::Io(e)),
        }
    }

    /// Device `i` is up and has carrier.
    fn usable(&self, i: usize) -> bool {
        let want = (libc::IFF_UP | libc::IFF_RUNNING) as i16;
        sluice_sys::tun::link_flags(self.sock.fd.as_raw_fd(), &self.devices[i].0).is_ok_and(|f| f & want == want)
    }

    /// The descriptor the event loop watches.
    pub fn raw_fd(&self) -> RawFd {
        self.sock.fd.as_raw_fd()
    }
}

/// Puts a tag the kernel removed back into the frame at `buf[VNET_HDR_LEN..][..len]`,
/// after the MAC addresses, and moves the virtio header's offsets with it. Returns the
/// new length, or `None` if the buffer has no room for four more bytes.
fn restore_tag(buf: &mut [u8], len: usize, tpid: u16, tci: u16) -> Option<usize> {
    let start = VNET_HDR_LEN;
    if len < 12 || start + len + 4 > buf.len() {
        return None;
    }
    buf.copy_within(start + 12..start + len, start + 16);
    buf[start + 12..start + 14].copy_from_slice(&tpid.to_be_bytes());
    buf[start + 14..start + 16].copy_from_slice(&tci.to_be_bytes());
    if let Ok(mut h) = VnetHdr::parse(&buf[..VNET_HDR_LEN]) {
        if h.needs_csum() {
            h.csum_start = h.csum_start.saturating_add(4);
        }
        if h.is_gso() && h.hdr_len > 0 {
            h.hdr_len = h.hdr_len.saturating_add(4);
        }
        let mut out = [0u8; VNET_HDR_LEN];
        h.emit(&mut out);
        buf[..VNET_HDR_LEN].copy_from_slice(&out);
    }
    Some(len + 4)
}

impl Port for UplinkPort {
    fn mac(&self) -> Option<sluice_wire::MacAddr> {
        let name = &self.devices[self.active].0;
        sluice_sys::tun::link_mac(self.sock.fd.as_raw_fd(), name).ok().map(sluice_wire::MacAddr)
    }

    fn kind(&self) -> &'static str {
        "uplink"
    }

    fn caps(&self) -> PortCaps {
        PortCaps { offload: self.offload, lossless_input: false }
    }

    fn fast_path(&self) -> Option<u32> {
        self.kernel.then(|| self.devices[self.active].1 as u32)
    }

    fn recv(&mut self, buf: &mut [u8]) -> Result<Option<usize>, PortError> {
        if self.kernel {
            return Ok(None);
        }
        let fd = self.sock.fd.as_raw_fd();
        let (got, len) = if self.sock.vnet {
            let r = match packet::recv(fd, buf) {
                Ok(r) => r,
                Err(e) => return self.on_error(e).map(|()| None),
            };
            match r {
                None => return Ok(None),
                Some(r) => {
                    // The last two bytes (num_buffers) mean nothing here.
                    buf[VNET_HDR_LEN - 2..VNET_HDR_LEN].fill(0);
                    let len = r.len.saturating_sub(VNET_HDR_LEN);
                    (r, len)
                }
            }
        } else {
            let r = match packet::recv(fd, &mut buf[VNET_HDR_LEN..]) {
                Ok(r) => r,
                Err(e) => return self.on_error(e).map(|()| None),
            };
            let Some(r) = r else { return Ok(None) };
            buf[..VNET_HDR_LEN].fill(0);
            let len = r.len;
            (r, len)
        };
        match got.vlan_tci {
            None => Ok(Some(len)),
            Some(tci) => restore_tag(buf, len, got.vlan_tpid, tci)
                .map(Some)
                .ok_or_else(|| PortError::Io(io::Error::other("a tagged frame does not fit the switch's buffer"))),
        }
    }

    fn tick(&mut self) -> Option<String> {
        self.pending.take().or_else(|| self.failover())
    }

    fn send(&mut self, f: &OutFrame<'_>) -> Result<TxOutcome, PortError> {
        let tag = f.tag.unwrap_or_default();
        let mut parts: [&[u8]; 4] = [&[]; 4];
        let mut n = 0;
        if self.sock.vnet {
            parts[n] = &f.vnet;
            n += 1;
        }
        parts[n] = f.macs;
        n += 1;
        if f.tag.is_some() {
            parts[n] = &tag;
            n += 1;
        }
        parts[n] = f.rest;
        n += 1;
        for _ in 0..2 {
            match packet::send(self.sock.fd.as_raw_fd(), &parts[..n]) {
                Ok(true) => return Ok(TxOutcome::Sent),
                Ok(false) => return Ok(TxOutcome::Full),
                Err(e) => {
                    let down = e.raw_os_error() == Some(libc::ENETDOWN);
                    self.on_error(e)?;
                    if down && self.pending.is_none() {
                        // Down, nowhere to go: the frame is lost, the port stays.
                        return Err(PortError::Io(io::Error::from_raw_os_error(libc::ENETDOWN)));
                    }
                }
            }
        }
        Err(PortError::Io(io::Error::other("the uplink's devices are down")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_restored_tag_sits_after_the_macs_and_moves_the_offsets() {
        let mut buf = vec![0u8; 64];
        let h = VnetHdr { flags: VnetHdr::F_NEEDS_CSUM, csum_start: 34, csum_offset: 16, ..Default::default() };
        let mut hb = [0u8; VNET_HDR_LEN];
        h.emit(&mut hb);
        buf[..VNET_HDR_LEN].copy_from_slice(&hb);
        let frame: Vec<u8> = (0u8..20).collect();
        buf[VNET_HDR_LEN..VNET_HDR_LEN + 20].copy_from_slice(&frame);
        let n = restore_tag(&mut buf, 20, 0x8100, 0x200a).unwrap();
        assert_eq!(n, 24);
        let f = &buf[VNET_HDR_LEN..VNET_HDR_LEN + n];
        assert_eq!(&f[..12], &frame[..12]);
        assert_eq!(&f[12..16], &[0x81, 0x00, 0x20, 0x0a]);
        assert_eq!(&f[16..], &frame[12..]);
        assert_eq!(VnetHdr::parse(&buf[..VNET_HDR_LEN]).unwrap().csum_start, 38);
        assert!(restore_tag(&mut buf, 60, 0x8100, 1).is_none(), "no room");
    }
}

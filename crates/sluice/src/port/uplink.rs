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

use crate::sys::packet::{self, PacketSocket};

/// A host interface attached as the switch's uplink.
pub struct UplinkPort {
    sock: PacketSocket,
    offload: bool,
}

impl UplinkPort {
    /// Opens interface `ifname` of the calling thread's namespace (see
    /// `sys::netns::run_in`). With `offload` the switch sends it GSO frames whole and
    /// partial checksums; without, it segments and completes them first (received frames
    /// carry their offload state either way).
    pub fn open(ifname: &str, offload: bool) -> io::Result<Self> {
        let sock = packet::open(ifname)?;
        Ok(UplinkPort { offload: offload && sock.vnet, sock })
    }

    /// The descriptor the event loop watches.
    pub fn raw_fd(&self) -> RawFd {
        self.sock.fd.as_raw_fd()
    }
}

fn classify(e: io::Error) -> PortError {
    match e.raw_os_error() {
        Some(libc::ENETDOWN | libc::ENXIO | libc::ENODEV | libc::EBADF) => PortError::Gone(e),
        _ => PortError::Io(e),
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
    fn kind(&self) -> &'static str {
        "uplink"
    }

    fn caps(&self) -> PortCaps {
        PortCaps { offload: self.offload, lossless_input: false }
    }

    fn recv(&mut self, buf: &mut [u8]) -> Result<Option<usize>, PortError> {
        let fd = self.sock.fd.as_raw_fd();
        let (got, len) = if self.sock.vnet {
            match packet::recv(fd, buf).map_err(classify)? {
                None => return Ok(None),
                Some(r) => {
                    // The last two bytes (num_buffers) mean nothing here.
                    buf[VNET_HDR_LEN - 2..VNET_HDR_LEN].fill(0);
                    let len = r.len.saturating_sub(VNET_HDR_LEN);
                    (r, len)
                }
            }
        } else {
            let Some(r) = packet::recv(fd, &mut buf[VNET_HDR_LEN..]).map_err(classify)? else { return Ok(None) };
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
        match packet::send(self.sock.fd.as_raw_fd(), &parts[..n]).map_err(classify)? {
            true => Ok(TxOutcome::Sent),
            false => Ok(TxOutcome::Full),
        }
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

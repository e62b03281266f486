//! A TAP port: the guest's network interface is a TAP device (usually moved into the
//! guest's network namespace); sluice holds its file descriptor. Frames carry the 12-byte
//! virtio header so GSO frames and partial checksums cross whole.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::FileExt;

use sluice_switch::port::DeviceDrops;
use sluice_switch::{OutFrame, Port, PortCaps, PortError, TxOutcome};

use sluice_api::config::PortSpec;
use sluice_sys::error::Failure;
use sluice_sys::{netns, tun};

use crate::{Attachment, Error, Kind, Result};

/// Set when the daemon leaves to start again in place (`sluice switch restart`): its TAPs
/// stay, for the new image to adopt. Otherwise a TAP the switch lets go of (port deleted,
/// switch stopped) is made non-persistent first, so that it goes with its descriptor.
pub static KEEP_TAPS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// A TAP device attached to the switch.
pub struct TapPort {
    name: String,
    fd: OwnedFd,
    offload: bool,
    stats: Option<File>,
    ifindex: u32,
}

impl Drop for TapPort {
    fn drop(&mut self) {
        if !KEEP_TAPS.load(std::sync::atomic::Ordering::Acquire) {
            let _ = tun::set_persist(self.fd.as_raw_fd(), false);
        }
    }
}

/// Opens the TAP of port `spec` with MTU `mtu` in the port's namespace (the current one if it
/// names none): adopts the one an earlier run left with index `known`, or creates it.
pub fn attach(spec: &PortSpec, mtu: u16, known: Option<u32>) -> Result<Attachment> {
    let (name, offload) = (spec.name.clone(), spec.offload);
    let tap = netns::run_in(spec.netns.as_deref(), move || TapPort::open(&name, offload, mtu, known)).map_err(|e| {
        if matches!(e.kind(), io::ErrorKind::AlreadyExists | io::ErrorKind::ResourceBusy) {
            Error::TapNameTaken { name: spec.name.clone() }
        } else {
            Failure::new(format!("creating TAP {:?}", spec.name), e).into()
        }
    })?;
    let (fd, ifindex) = (tap.raw_fd(), tap.ifindex());
    Ok(Attachment { port: Box::new(tap), fd, kind: Kind::Tap { ifindex } })
}

impl TapPort {
    /// Opens TAP `name` in the current thread's namespace (see `sys::netns::run_in`):
    /// adopts the one an earlier run left with index `known`, or creates it (see
    /// [`tun::open_tap`]).
    pub fn open(name: &str, offload: bool, mtu: u16, known: Option<u32>) -> io::Result<Self> {
        let t = tun::open_tap(name, offload, mtu, known)?;
        Ok(TapPort { name: name.to_string(), fd: t.fd, offload, stats: t.stats, ifindex: t.ifindex })
    }

    /// The device's index in its namespace.
    pub fn ifindex(&self) -> u32 {
        self.ifindex
    }

    /// The descriptor the event loop watches.
    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

fn classify(e: io::Error) -> PortError {
    match e.raw_os_error() {
        Some(libc::EBADFD | libc::ENODEV | libc::ENXIO | libc::EPIPE | libc::EBADF) => PortError::Gone(e),
        _ => PortError::Io(e),
    }
}

impl Port for TapPort {
    fn kind(&self) -> &'static str {
        "tap"
    }

    fn caps(&self) -> PortCaps {
        PortCaps { offload: self.offload, lossless_input: false }
    }

    fn recv(&mut self, buf: &mut [u8]) -> Result<Option<usize>, PortError> {
        match tun::read(self.fd.as_raw_fd(), buf).map_err(classify)? {
            None => Ok(None),
            Some(n) => Ok(Some(n.saturating_sub(sluice_wire::VNET_HDR_LEN))),
        }
    }

    fn send(&mut self, f: &OutFrame<'_>) -> Result<TxOutcome, PortError> {
        let tag;
        let parts: [&[u8]; 4];
        let n = if let Some(t) = f.tag {
            tag = t;
            parts = [&f.vnet, f.macs, &tag, f.rest];
            4
        } else {
            parts = [&f.vnet, f.macs, f.rest, &[]];
            3
        };
        match tun::writev(self.fd.as_raw_fd(), &parts[..n]).map_err(classify)? {
            true => Ok(TxOutcome::Sent),
            false => Ok(TxOutcome::Full),
        }
    }

    fn device_drops(&self) -> Option<DeviceDrops> {
        let file = self.stats.as_ref()?;
        let mut buf = [0u8; 16384];
        let n = file.read_at(&mut buf, 0).ok()?;
        let text = std::str::from_utf8(&buf[..n]).ok()?;
        parse_proc_net_dev(text, &self.name)
    }
}

/// Reads a device's drop counters from /proc/net/dev text. For a TAP, "transmit" is the
/// guest sending into the switch and "receive" is the switch delivering to the guest.
pub fn parse_proc_net_dev(text: &str, name: &str) -> Option<DeviceDrops> {
    let line = text.lines().find_map(|l| {
        let (dev, rest) = l.split_once(':')?;
        (dev.trim() == name).then_some(rest)
    })?;
    let v: Vec<u64> = line.split_whitespace().filter_map(|x| x.parse().ok()).collect();
    // receive: bytes packets errs drop fifo frame compressed multicast; transmit: bytes
    // packets errs drop ...
    Some(DeviceDrops { to_guest: *v.get(3)?, from_guest: *v.get(11)? })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_drop_columns_of_proc_net_dev() {
        let text = "Inter-|   Receive                                                |  Transmit\n \
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n \
    lo:       0       0    0    0    0     0          0         0        0       0    0    0    0     0       0          0\n  \
lab-g1:  123456     100    0    7    0     0          0         0   654321     200    0   42    0     0       0          0\n";
        assert_eq!(parse_proc_net_dev(text, "lab-g1"), Some(DeviceDrops { to_guest: 7, from_guest: 42 }));
        assert_eq!(parse_proc_net_dev(text, "lab-g2"), None);
    }
}

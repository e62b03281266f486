//! A veth port: the switch's end of a veth pair whose other end is in the guest's
//! namespace, forwarded by the kernel datapath (docs/architecture.md, "The kernel
//! datapath"). The TC program on this interface handles what it can; what it hands up
//! reaches the core through the switch's upcall TAP, never through this port, so `recv`
//! never has a frame. The core's frames for the guest (floods, answers, frames from user-
//! space ports) leave through a send-only packet socket on the interface, with virtio
//! headers, so GSO frames cross whole, and with the switch's mark: the egress program on
//! the interface lets nothing else into the guest (docs/architecture.md, "Frames into
//! guests on the kernel datapath").

use std::io;
use std::os::fd::{AsRawFd, RawFd};

use sluice_switch::{OutFrame, Port, PortCaps, PortError, TxOutcome};

use sluice_api::config::PortSpec;
use sluice_sys::error::Context;
use sluice_sys::{link, packet};

use crate::{Attachment, Result};

/// Opens the switch's end of the veth pair of port `spec`, with MTU `mtu`.
pub fn attach(spec: &PortSpec, mtu: u16) -> Result<Attachment> {
    let v =
        VethPort::open(&spec.name, spec.offload, mtu).with_context(|| format!("opening veth port {:?}", spec.name))?;
    let fd = v.raw_fd();
    Ok(Attachment::new(Box::new(v), fd))
}

/// The switch's end of a veth pair.
pub struct VethPort {
    ifindex: u32,
    sock: packet::PacketSocket,
    offload: bool,
}

impl VethPort {
    /// Opens existing veth interface `name` (in the calling thread's namespace) as a port:
    /// checks that it is a veth, sets its MTU, turns IPv6 off on it (the host must not talk
    /// into the guest's link), brings it up, and opens the socket the core sends through.
    pub fn open(name: &str, offload: bool, mtu: u16) -> io::Result<Self> {
        let ifindex = link::ifindex(name)?;
        let driver = link::driver(name).unwrap_or_default();
        if driver != "veth" {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{name} is not a veth interface (driver {driver:?}); a veth port is the switch's end of a veth pair, e.g. `ip link add {name} type veth peer name eth0 netns GUEST`"
                ),
            ));
        }
        link::set_mtu(name, mtu).map_err(|e| io::Error::new(e.kind(), format!("setting MTU {mtu} on {name}: {e}")))?;
        link::disable_ipv6(name)?;
        link::set_up(name)?;
        let sock = packet::open_tx(ifindex as i32, sluice_ebpf::abi::SLUICE_MARK)?;
        let offload = offload && sock.vnet;
        Ok(VethPort { ifindex, sock, offload })
    }

    /// The descriptor the event loop watches (writable again after `Full`).
    pub fn raw_fd(&self) -> RawFd {
        self.sock.fd.as_raw_fd()
    }
}

impl Port for VethPort {
    fn kind(&self) -> &'static str {
        "veth"
    }

    fn caps(&self) -> PortCaps {
        PortCaps { offload: self.offload, lossless_input: false }
    }

    fn recv(&mut self, _buf: &mut [u8]) -> Result<Option<usize>, PortError> {
        Ok(None)
    }

    fn send(&mut self, f: &OutFrame<'_>) -> Result<TxOutcome, PortError> {
        let tag;
        let mut parts: [&[u8]; 4] = [&[]; 4];
        let mut n = 0;
        if self.sock.vnet {
            parts[n] = &f.vnet;
            n += 1;
        }
        parts[n] = f.macs;
        n += 1;
        if let Some(t) = f.tag {
            tag = t;
            parts[n] = &tag;
            n += 1;
        }
        parts[n] = f.rest;
        n += 1;
        match packet::send(self.sock.fd.as_raw_fd(), &parts[..n]) {
            Ok(true) => Ok(TxOutcome::Sent),
            Ok(false) => Ok(TxOutcome::Full),
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENXIO | libc::ENODEV)) => Err(PortError::Gone(e)),
            Err(e) => Err(PortError::Io(e)),
        }
    }

    fn fast_path(&self) -> Option<u32> {
        Some(self.ifindex)
    }
}

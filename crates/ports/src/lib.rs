//! Port kinds backed by operating-system devices. Each is a thin adapter: the forwarding
//! decisions are in `sluice_switch`. Each kind's module opens its device from a port
//! description (its `attach`) and says, in an [`Attachment`], what the event loop needs to
//! know of it beyond its one descriptor.
//!
//! Every port kind lives here, under `crates/ports/`: one module a kind in `src/` (TAP,
//! veth, uplink, VXLAN, stream, relay, vhost-user's attachment), and vhost-user's device —
//! the guest's memory, its rings, the protocol — in `vhost/`, a crate of its own
//! (`sluice-vhost`) because it alone needs rust-vmm's crates and has its own tests and
//! benchmarks. The kernel datapath's side of a veth port (its maps) is the daemon's kernel
//! sync (`sluice_daemon::kernel`), since it writes the core's verdicts for every port.

pub mod error;
pub mod relay;
pub mod stream;
pub mod tap;
pub mod uplink;
pub mod veth;
pub mod vhost;
pub mod vxlan;

use std::os::fd::RawFd;

use sluice_switch::Port;

pub use error::{Error, Result};

/// A port ready to attach, with the descriptor the event loop watches for it.
pub struct Attachment {
    /// The port.
    pub port: Box<dyn Port>,
    /// Its readiness descriptor (owned by the port).
    pub fd: RawFd,
    /// What its kind adds.
    pub kind: Kind,
}

/// What a port kind adds to the descriptor every port has.
pub enum Kind {
    /// Nothing (veth, stream, uplink).
    Plain,
    /// A TAP, with its index in its namespace (recorded so that a later run can adopt it).
    Tap {
        /// The index.
        ifindex: u32,
    },
    /// A tunnel, whose MTU it decides when the spec does not (its underlay's less the
    /// overhead), with its kernel device on the kernel datapath.
    Tunnel {
        /// The MTU.
        mtu: u16,
        /// The kernel device (kernel datapath only).
        kernel: Option<vxlan::KernelTunnel>,
    },
    /// A port whose room to send is announced rather than polled (vhost-user: the guest
    /// kicks when it posts receive buffers): the event loop watches `fd` for the port's read
    /// interest only, and this doorbell, readable then, for its write interest.
    Vhost {
        /// The doorbell.
        room_fd: RawFd,
    },
}

impl Attachment {
    /// A port watched on `fd` and nothing else said about it.
    pub fn new(port: Box<dyn Port>, fd: RawFd) -> Attachment {
        Attachment { port, fd, kind: Kind::Plain }
    }

    /// A TAP's index in its namespace.
    pub fn tap_ifindex(&self) -> Option<u32> {
        match self.kind {
            Kind::Tap { ifindex } => Some(ifindex),
            _ => None,
        }
    }

    /// The MTU the port decides, if it does.
    pub fn mtu(&self) -> Option<u16> {
        match self.kind {
            Kind::Tunnel { mtu, .. } => Some(mtu),
            _ => None,
        }
    }

    /// The doorbell of a port whose room to send is announced.
    pub fn room_fd(&self) -> Option<RawFd> {
        match self.kind {
            Kind::Vhost { room_fd } => Some(room_fd),
            _ => None,
        }
    }

    /// A tunnel's kernel device.
    pub fn kernel_tunnel(&self) -> Option<&vxlan::KernelTunnel> {
        match &self.kind {
            Kind::Tunnel { kernel, .. } => kernel.as_ref(),
            _ => None,
        }
    }
}

//! Port kinds backed by operating-system devices. Each is a thin adapter: the forwarding
//! decisions are in `sluice_switch`.

pub mod relay;
pub mod stream;
pub mod tap;
pub mod uplink;
pub mod veth;
pub mod vxlan;

use std::os::fd::RawFd;

use sluice_switch::Port;

/// A port ready to attach, with the descriptor the event loop watches for it.
pub struct Attachment {
    /// The port.
    pub port: Box<dyn Port>,
    /// Its readiness descriptor (owned by the port).
    pub fd: RawFd,
    /// A TAP's index in its namespace (recorded so that a later run can adopt it).
    pub tap_ifindex: Option<u32>,
    /// The port's MTU when the port decides it (a tunnel: its underlay's less the
    /// overhead) and the spec does not.
    pub mtu: Option<u16>,
    /// A tunnel's kernel device (kernel datapath).
    pub tunnel: Option<vxlan::KernelTunnel>,
    /// For a port whose room to send is announced rather than polled (vhost-user: the
    /// guest kicks when it posts receive buffers), the doorbell that is readable then; the
    /// event loop watches it for the port's write interest, and `fd` for its read interest
    /// only.
    pub room_fd: Option<RawFd>,
}

impl Attachment {
    /// A port watched on `fd` and nothing else said about it.
    pub fn new(port: Box<dyn Port>, fd: RawFd) -> Attachment {
        Attachment { port, fd, tap_ifindex: None, mtu: None, tunnel: None, room_fd: None }
    }
}

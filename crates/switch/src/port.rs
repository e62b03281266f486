//! The one trait every attachment implements, and the frame view it transmits.
//!
//! A port moves whole frames, each preceded by a 12-byte virtio_net_hdr that carries its
//! offload state (GSO type and segment size, partial checksum). Ports that have no such
//! header (a raw socket without offloads) write a zeroed one on receive and ignore it on
//! transmit, after the switch has made sure the frame needs no offload.
//!
//! "Cannot take more now" is a first-class outcome of [`Port::send`] ([`TxOutcome::Full`]),
//! not an error: the lossless rule is built on it.

use std::io;

use sluice_wire::VNET_HDR_LEN;

use crate::counters::DropCause;
use crate::tunnel::{Origin, TunnelRules};

/// What a port can do, declared once when it is attached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PortCaps {
    /// Accepts GSO frames and frames with a partial checksum (virtio header offloads).
    /// When false the switch segments GSO frames and completes checksums before sending.
    pub offload: bool,
    /// Its sender can be held back: not reading from it makes the sender stop rather than
    /// lose frames (vhost-user queues; not a TAP, whose kernel side drops when full).
    pub lossless_input: bool,
}

/// Result of offering one frame to a port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TxOutcome {
    /// The port took the frame.
    Sent,
    /// The port cannot take a frame now; the switch keeps it and asks for write readiness.
    Full,
}

/// A frame on its way out, as up to four byte runs that the port writes in order.
///
/// The switch keeps frames untagged internally, so the 802.1Q tag an output needs is
/// inserted here, between the MAC addresses and the rest, without copying the frame.
#[derive(Clone, Copy, Debug)]
pub struct OutFrame<'a> {
    /// The virtio_net_hdr describing this frame's offload state for this output.
    pub vnet: [u8; VNET_HDR_LEN],
    /// Destination and source MAC addresses (12 bytes).
    pub macs: &'a [u8],
    /// The 802.1Q tag to insert after the MAC addresses, if this output wants one.
    pub tag: Option<[u8; 4]>,
    /// EtherType onwards.
    pub rest: &'a [u8],
}

impl OutFrame<'_> {
    /// Length of the Ethernet frame (without the virtio header).
    pub fn len(&self) -> usize {
        self.macs.len() + self.tag.map_or(0, |_| 4) + self.rest.len()
    }

    /// True for a frame with no bytes (never produced by the switch).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Copies the Ethernet frame (without the virtio header) into `out`, returning its
    /// length, or `None` if `out` is too small. For ports that need one contiguous buffer.
    pub fn copy_frame_to(&self, out: &mut [u8]) -> Option<usize> {
        let len = self.len();
        let out = out.get_mut(..len)?;
        let (m, rest) = out.split_at_mut(self.macs.len());
        m.copy_from_slice(self.macs);
        let rest = match self.tag {
            Some(tag) => {
                let (t, r) = rest.split_at_mut(4);
                t.copy_from_slice(&tag);
                r
            }
            None => rest,
        };
        rest.copy_from_slice(self.rest);
        Some(len)
    }
}

/// A port failed in a way the switch cannot retry.
#[derive(Debug, thiserror::Error)]
pub enum PortError {
    /// The port's device is gone or closed (for a TAP: the interface was deleted).
    #[error("the port's device is gone: {0}")]
    Gone(#[source] io::Error),
    /// An I/O error that loses this one frame (on receive: a frame the device consumed
    /// but could not hand over, e.g. larger than the buffer); the port stays attached.
    #[error("I/O error on the port: {0}")]
    Io(#[source] io::Error),
    /// On receive: the port took in one frame and refused it itself, for this cause (a
    /// tunnel: a datagram from an endpoint it does not accept). The switch counts it as
    /// received and dropped; the port stays attached.
    #[error("the port refused a frame it received ({})", .0.name())]
    Refused(DropCause),
}

/// A switch attachment: TAP, uplink, vhost-user, tunnel, or an in-memory test port.
pub trait Port: Send {
    /// Short name of the attachment kind ("tap", "mem", …) for display.
    fn kind(&self) -> &'static str;

    /// What this port can do. Must not change while attached.
    fn caps(&self) -> PortCaps;

    /// Receives one frame into `buf`: the virtio header in `buf[..12]` (zeroed if the port
    /// has none), the Ethernet frame from `buf[12..]`. Returns the frame's length without
    /// the header, or `Ok(None)` when nothing is waiting.
    fn recv(&mut self, buf: &mut [u8]) -> Result<Option<usize>, PortError>;

    /// Offers one frame. [`TxOutcome::Full`] leaves the frame with the switch.
    fn send(&mut self, frame: &OutFrame<'_>) -> Result<TxOutcome, PortError>;

    /// A tunnel's rules for the forwarding decision: its VNIs and whom it takes datagrams
    /// from (`None`: not a tunnel). Must not change while attached.
    fn tunnel(&self) -> Option<TunnelRules> {
        None
    }

    /// A tunnel: where the frame the last [`Port::recv`] returned came from (its VNI, the
    /// sender's underlay address). The frame is the datagram's inner frame as it arrived;
    /// the switch decides from the origin which VLAN it joins, or that it is dropped.
    fn origin(&self) -> Option<Origin> {
        None
    }

    /// A tunnel: the switch took a frame from station `mac` in `vni` that `sender` sent,
    /// after every check that comes before learning, and keeps the station on this port:
    /// frames to it go to `sender` from now on. Nothing else teaches a tunnel where its
    /// stations are.
    fn learn_remote(&mut self, _vni: u32, _mac: sluice_wire::MacAddr, _sender: std::net::IpAddr) {}

    /// An EVPN tunnel: station `mac` of `vni` is behind `endpoint` (installed from a
    /// route; it does not age), or no longer (`None`).
    fn pin_remote(&mut self, _vni: u32, _mac: sluice_wire::MacAddr, _endpoint: Option<std::net::IpAddr>) {}

    /// An EVPN tunnel: `vni` floods to `endpoints` (its type-3 routes) besides the
    /// configured remotes.
    fn set_flood(&mut self, _vni: u32, _endpoints: &[std::net::IpAddr]) {}

    /// An EVPN tunnel: the endpoints the routes name now, whose datagrams are accepted
    /// besides the configured remotes'.
    fn set_announced(&mut self, _endpoints: &[std::net::IpAddr]) {}

    /// Frames refused for the port before it could read them, since the last call, and
    /// why (a tunnel's socket filter drops datagrams from unknown endpoints in the kernel,
    /// where the port never sees them). The switch counts them as received and dropped for
    /// that cause, as it counts a [`PortError::Refused`] from [`Port::recv`]; it asks
    /// about once a second and when the port is removed.
    fn take_refused(&mut self) -> Option<(DropCause, u64)> {
        None
    }

    /// Frames the port's own device dropped (for a TAP: the kernel's drop counters),
    /// reported beside the switch's counters so users see where loss happens.
    fn device_drops(&self) -> Option<DeviceDrops> {
        None
    }

    /// The device's own MAC address, if it has one that matters to the switch (an uplink's
    /// interface: in Layer 3 mode the guests appear behind it on the LAN). May change after
    /// [`Port::tick`] reports a change.
    fn mac(&self) -> Option<sluice_wire::MacAddr> {
        None
    }

    /// The handle by which a kernel datapath reaches this port (for a veth or uplink
    /// port: its interface index), if the kernel executes forwarding to and from it; see
    /// [`crate::fastpath`]. May change after [`Port::tick`] reports a change.
    fn fast_path(&self) -> Option<u32> {
        None
    }

    /// Whether the frames a kernel datapath forwards to the port ([`Port::fast_path`]) may
    /// be GSO frames with partial checksums. By default what the port's own
    /// [`Port::send`] takes; a tunnel whose kernel device segments and checksums them says
    /// yes though its socket does not.
    fn fast_path_offload(&self) -> bool {
        self.caps().offload
    }

    /// How many copies the port itself makes of one frame to `dst` in `vlan`: 1 for a port
    /// with one peer; a tunnel sends a frame whose station it does not know (a group
    /// address, a station not heard from) to each of its endpoints. The switch bounds what
    /// a GSO frame may cost such a port ([`crate::FLOOD_DATAGRAMS_PER_FRAME`]).
    fn fanout(&self, _vlan: u16, _dst: sluice_wire::MacAddr) -> usize {
        1
    }

    /// The endpoints a tunnel sends a flood in `vlan` to itself (each once): what a kernel
    /// datapath that replicates floods into the tunnel writes. Empty for other ports.
    fn floods_to(&self, _vlan: u16) -> Vec<std::net::IpAddr> {
        Vec::new()
    }

    /// EVPN: the endpoint a route puts station `mac` of `vni` behind
    /// ([`Port::pin_remote`]), if any.
    fn routed_endpoint(&self, _vni: u32, _mac: sluice_wire::MacAddr) -> Option<std::net::IpAddr> {
        None
    }

    /// Where a station the switch learned behind this port really is, for a port that
    /// reaches several places (a tunnel: the remote endpoint `mac` in `vlan` was heard
    /// from), as text for `sluice fib show`.
    fn endpoint_of(&self, _vlan: u16, _mac: sluice_wire::MacAddr) -> Option<String> {
        None
    }

    /// The state of the port's link when it has one apart from the switch's view (a
    /// vhost-user port: which VM is connected, or what it waits for), for `sluice port list`.
    fn link_state(&self) -> Option<String> {
        None
    }

    /// Called about once a second: a port that watches its device (an uplink and its
    /// backups) checks it here, and returns what it did about a change, if anything
    /// (e.g. "eth1 lost carrier; now on eth2"), which the switch counts as a failover.
    fn tick(&mut self) -> Option<String> {
        None
    }
}

/// Drop counters kept by the device underneath a port, outside the switch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct DeviceDrops {
    /// Frames the device dropped on their way towards the guest (for a TAP: the
    /// interface's receive drops, e.g. the guest's backlog was full).
    pub to_guest: u64,
    /// Frames the device dropped on their way from the guest into the switch (for a TAP:
    /// the interface's transmit drops — the switch did not read them in time).
    pub from_guest: u64,
}

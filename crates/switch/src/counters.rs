//! Per-port counters and the causes of drops.
//!
//! Accounting rules, which tests check after every run:
//! - On ingress, every received frame has exactly one fate:
//!   `rx_frames = forwarded + flooded + consumed + rx_drops.total() + held + resolving`.
//! - On egress, every copy offered to a port has exactly one fate:
//!   `tx_offered = tx_frames + tx_drops.total() + queued`.
//! - Across the switch, the copies made on ingress plus the frames the switch wrote itself
//!   are the copies offered on egress: `Σ copies + Σ generated = Σ tx_offered` (a flooded
//!   frame makes one copy per output), where the sums include the ports removed since the
//!   last reset ([`Switch::departed`]). Frames still queued for a port when it is removed
//!   count as its `unknown_port` drops.
//!
//! (`held`, `resolving` and `queued` are gauges kept beside the counters;
//! [`Switch::port_info`] reports them.)
//!
//! [`Switch::port_info`]: crate::Switch::port_info
//! [`Switch::departed`]: crate::Switch::departed

use serde::{Deserialize, Serialize};

/// Why the switch dropped a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DropCause {
    /// The output queue was full (lossy mode only).
    QueueFull,
    /// Not a valid frame: shorter than an Ethernet header, a broken virtio header, a
    /// group source address, or headers a GSO frame cannot be cut by.
    Malformed,
    /// The port does not accept the frame's VLAN, or the destination is not in it.
    VlanFilter,
    /// Larger than the output's MTU (for a GSO frame: segment size plus headers).
    OverMtu,
    /// No port to deliver to: the destination's port is gone, or no other port is in the
    /// frame's VLAN.
    UnknownPort,
    /// The destination sits behind the port the frame came from.
    SamePort,
    /// The output's device refused the frame with an error.
    TxError,
    /// Between an isolated port and a port other than an uplink.
    Isolated,
    /// The source MAC address is not the one the port is allowed (anti-spoofing).
    SpoofedMac,
    /// The source IP address (or ARP sender address) is not one the port is allowed.
    SpoofedIp,
    /// Layer 3 mode: neither IPv4, IPv6 nor ARP.
    NotIp,
    /// Layer 3 mode: no port leads to the destination — no guest owns the address and
    /// there is no uplink, or a frame on the LAN was not addressed to the guests.
    NoRoute,
    /// Layer 3 mode: the next hop's MAC address could not be learned in time (or too
    /// many frames were already waiting for resolution).
    Unresolved,
    /// Kernel datapath: a frame the kernel had to hand up to the core never reached it
    /// (there was no upcall device to send it to, or its port had failed by the time the
    /// core read it).
    UpcallLost,
    /// A GSO frame the switch will not cut: segments of fewer than
    /// [`MIN_GSO_SIZE`](crate::MIN_GSO_SIZE) bytes, or more than
    /// [`MAX_GSO_SEGMENTS`](crate::MAX_GSO_SEGMENTS) of them (one frame must not cost the
    /// switch, and the other ports, tens of thousands); or, at an output that sends it to
    /// several places (a tunnel's endpoints), more than
    /// [`FLOOD_DATAGRAMS_PER_FRAME`](crate::FLOOD_DATAGRAMS_PER_FRAME) datagrams.
    GsoLimit,
    /// The pause watchdog declared the output stuck in the frame's (lossless) class: it
    /// had frames waiting and sent none for `watchdog_ms`.
    Watchdog,
    /// A tunnel's datagram from an underlay address that is not one of the port's
    /// `remotes` (the port accepts only its configured endpoints): dropped before anything
    /// was learned from it.
    UnknownEndpoint,
    /// Kernel datapath: a frame that entered a guest's veth from the switch's side without
    /// the switch sending it (a local program's socket bound to the interface), refused on
    /// its way into the guest; counted with the port's received frames.
    EgressRefused,
    /// Kernel datapath: a frame the kernel would have handed up to the core while its
    /// port had used up its upcall budget (a port whose frames miss faster than the core
    /// takes them, such as a guest sending from ever new source addresses past its MAC
    /// lock, is bounded, not queued without end).
    UpcallLimit,
    /// A frame of an EtherType its input port drops (`drop_ethertypes`).
    Filtered,
    /// Refused by a security group: a `deny` rule, or the default action, of the sender's
    /// `in` rules or the receiver's `out` rules.
    Acl,
    /// A connection a rule allowed could not be remembered: the connection table is full.
    CtFull,
}

impl DropCause {
    /// Every cause, in display order.
    pub const ALL: [DropCause; 22] = [
        DropCause::QueueFull,
        DropCause::Malformed,
        DropCause::VlanFilter,
        DropCause::OverMtu,
        DropCause::UnknownPort,
        DropCause::SamePort,
        DropCause::TxError,
        DropCause::Isolated,
        DropCause::SpoofedMac,
        DropCause::SpoofedIp,
        DropCause::NotIp,
        DropCause::NoRoute,
        DropCause::Unresolved,
        DropCause::UpcallLost,
        DropCause::GsoLimit,
        DropCause::Watchdog,
        DropCause::UnknownEndpoint,
        DropCause::EgressRefused,
        DropCause::UpcallLimit,
        DropCause::Filtered,
        DropCause::Acl,
        DropCause::CtFull,
    ];

    /// The cause's name as it appears in counters and JSON.
    pub fn name(self) -> &'static str {
        match self {
            DropCause::QueueFull => "queue_full",
            DropCause::Malformed => "malformed",
            DropCause::VlanFilter => "vlan_filter",
            DropCause::OverMtu => "over_mtu",
            DropCause::UnknownPort => "unknown_port",
            DropCause::SamePort => "same_port",
            DropCause::TxError => "tx_error",
            DropCause::Isolated => "isolated",
            DropCause::SpoofedMac => "spoofed_mac",
            DropCause::SpoofedIp => "spoofed_ip",
            DropCause::NotIp => "not_ip",
            DropCause::NoRoute => "no_route",
            DropCause::Unresolved => "unresolved",
            DropCause::UpcallLost => "upcall_lost",
            DropCause::GsoLimit => "gso_limit",
            DropCause::Watchdog => "watchdog",
            DropCause::UnknownEndpoint => "unknown_endpoint",
            DropCause::EgressRefused => "egress_refused",
            DropCause::UpcallLimit => "upcall_limit",
            DropCause::Filtered => "filtered",
            DropCause::Acl => "acl",
            DropCause::CtFull => "ct_full",
        }
    }
}

/// Frames dropped, by cause.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct DropCounts {
    /// See [`DropCause::QueueFull`].
    pub queue_full: u64,
    /// See [`DropCause::Malformed`].
    pub malformed: u64,
    /// See [`DropCause::VlanFilter`].
    pub vlan_filter: u64,
    /// See [`DropCause::OverMtu`].
    pub over_mtu: u64,
    /// See [`DropCause::UnknownPort`].
    pub unknown_port: u64,
    /// See [`DropCause::SamePort`].
    pub same_port: u64,
    /// See [`DropCause::TxError`].
    pub tx_error: u64,
    /// See [`DropCause::Isolated`].
    #[serde(default)]
    pub isolated: u64,
    /// See [`DropCause::SpoofedMac`].
    #[serde(default)]
    pub spoofed_mac: u64,
    /// See [`DropCause::SpoofedIp`].
    #[serde(default)]
    pub spoofed_ip: u64,
    /// See [`DropCause::NotIp`].
    #[serde(default)]
    pub not_ip: u64,
    /// See [`DropCause::NoRoute`].
    #[serde(default)]
    pub no_route: u64,
    /// See [`DropCause::Unresolved`].
    #[serde(default)]
    pub unresolved: u64,
    /// See [`DropCause::UpcallLost`].
    #[serde(default)]
    pub upcall_lost: u64,
    /// See [`DropCause::GsoLimit`].
    #[serde(default)]
    pub gso_limit: u64,
    /// See [`DropCause::Watchdog`].
    #[serde(default)]
    pub watchdog: u64,
    /// See [`DropCause::UnknownEndpoint`].
    #[serde(default)]
    pub unknown_endpoint: u64,
    /// See [`DropCause::EgressRefused`].
    #[serde(default)]
    pub egress_refused: u64,
    /// See [`DropCause::UpcallLimit`].
    #[serde(default)]
    pub upcall_limit: u64,
    /// See [`DropCause::Filtered`].
    #[serde(default)]
    pub filtered: u64,
    /// See [`DropCause::Acl`].
    #[serde(default)]
    pub acl: u64,
    /// See [`DropCause::CtFull`].
    #[serde(default)]
    pub ct_full: u64,
}

impl DropCounts {
    /// Counts one drop.
    pub fn add(&mut self, cause: DropCause) {
        *self.get_mut(cause) += 1;
    }

    /// Counts `n` drops.
    pub fn add_n(&mut self, cause: DropCause, n: u64) {
        *self.get_mut(cause) += n;
    }

    /// The count for one cause.
    pub fn get(&self, cause: DropCause) -> u64 {
        match cause {
            DropCause::QueueFull => self.queue_full,
            DropCause::Malformed => self.malformed,
            DropCause::VlanFilter => self.vlan_filter,
            DropCause::OverMtu => self.over_mtu,
            DropCause::UnknownPort => self.unknown_port,
            DropCause::SamePort => self.same_port,
            DropCause::TxError => self.tx_error,
            DropCause::Isolated => self.isolated,
            DropCause::SpoofedMac => self.spoofed_mac,
            DropCause::SpoofedIp => self.spoofed_ip,
            DropCause::NotIp => self.not_ip,
            DropCause::NoRoute => self.no_route,
            DropCause::Unresolved => self.unresolved,
            DropCause::UpcallLost => self.upcall_lost,
            DropCause::GsoLimit => self.gso_limit,
            DropCause::Watchdog => self.watchdog,
            DropCause::UnknownEndpoint => self.unknown_endpoint,
            DropCause::EgressRefused => self.egress_refused,
            DropCause::UpcallLimit => self.upcall_limit,
            DropCause::Filtered => self.filtered,
            DropCause::Acl => self.acl,
            DropCause::CtFull => self.ct_full,
        }
    }

    fn get_mut(&mut self, cause: DropCause) -> &mut u64 {
        match cause {
            DropCause::QueueFull => &mut self.queue_full,
            DropCause::Malformed => &mut self.malformed,
            DropCause::VlanFilter => &mut self.vlan_filter,
            DropCause::OverMtu => &mut self.over_mtu,
            DropCause::UnknownPort => &mut self.unknown_port,
            DropCause::SamePort => &mut self.same_port,
            DropCause::TxError => &mut self.tx_error,
            DropCause::Isolated => &mut self.isolated,
            DropCause::SpoofedMac => &mut self.spoofed_mac,
            DropCause::SpoofedIp => &mut self.spoofed_ip,
            DropCause::NotIp => &mut self.not_ip,
            DropCause::NoRoute => &mut self.no_route,
            DropCause::Unresolved => &mut self.unresolved,
            DropCause::UpcallLost => &mut self.upcall_lost,
            DropCause::GsoLimit => &mut self.gso_limit,
            DropCause::Watchdog => &mut self.watchdog,
            DropCause::UnknownEndpoint => &mut self.unknown_endpoint,
            DropCause::EgressRefused => &mut self.egress_refused,
            DropCause::UpcallLimit => &mut self.upcall_limit,
            DropCause::Filtered => &mut self.filtered,
            DropCause::Acl => &mut self.acl,
            DropCause::CtFull => &mut self.ct_full,
        }
    }

    /// Adds another set of drop counts to this one.
    pub fn accumulate(&mut self, o: &DropCounts) {
        for c in DropCause::ALL {
            *self.get_mut(c) += o.get(c);
        }
    }

    /// All drops.
    pub fn total(&self) -> u64 {
        DropCause::ALL.iter().map(|&c| self.get(c)).sum()
    }
}

/// Counters of one port. Ingress counters describe frames the port's guest sent into the
/// switch; egress counters, frames the switch sent to it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct PortCounters {
    /// Frames received from the port.
    pub rx_frames: u64,
    /// Bytes received (Ethernet frames, GSO frames counted whole).
    pub rx_bytes: u64,
    /// Received frames that were GSO frames (up to 64 KiB, to be cut later or never).
    pub rx_gso: u64,
    /// Received frames sent to one known destination.
    pub forwarded: u64,
    /// Received frames flooded (broadcast, multicast, unknown unicast).
    pub flooded: u64,
    /// Copies offered to outputs by this port's received frames.
    pub copies: u64,
    /// Received frames addressed to the switch itself and taken by it: ARP and neighbour
    /// discovery messages it answered or learned from (Layer 3 mode).
    #[serde(default)]
    pub consumed: u64,
    /// Received frames dropped before reaching any output, by cause.
    pub rx_drops: DropCounts,
    /// Copies offered to this port as an output (including `generated`).
    pub tx_offered: u64,
    /// Frames the switch wrote itself for this port: ARP and neighbour discovery answers
    /// and requests (Layer 3 mode), announcements after an uplink failover.
    #[serde(default)]
    pub generated: u64,
    /// Frames transmitted to the port (a software-segmented GSO frame counts once).
    pub tx_frames: u64,
    /// Bytes transmitted (GSO frames counted whole, before segmentation).
    pub tx_bytes: u64,
    /// GSO frames transmitted whole (the output took the offload).
    pub tx_gso: u64,
    /// GSO frames cut into segments in software because the output has no offloads.
    pub tx_segmented: u64,
    /// Segments produced by software segmentation.
    pub tx_segments: u64,
    /// Partial checksums completed in software for an output without offloads.
    pub tx_csum_filled: u64,
    /// Copies dropped at this output, by cause.
    pub tx_drops: DropCounts,
    /// Times this port's input was paused because an output was full (lossless mode).
    pub pauses: u64,
    /// Times an uplink moved to a backup device.
    #[serde(default)]
    pub failovers: u64,
    /// Frames from a station the switch did not learn because this port already has
    /// `mac_limit_per_port` stations behind it (they are still forwarded; frames to them
    /// are flooded).
    #[serde(default)]
    pub learn_refused: u64,
}

impl PortCounters {
    /// Adds another port's counters to these (for the totals of removed ports).
    pub fn accumulate(&mut self, o: &PortCounters) {
        self.rx_frames += o.rx_frames;
        self.rx_bytes += o.rx_bytes;
        self.rx_gso += o.rx_gso;
        self.forwarded += o.forwarded;
        self.flooded += o.flooded;
        self.copies += o.copies;
        self.consumed += o.consumed;
        self.generated += o.generated;
        self.rx_drops.accumulate(&o.rx_drops);
        self.tx_offered += o.tx_offered;
        self.tx_frames += o.tx_frames;
        self.tx_bytes += o.tx_bytes;
        self.tx_gso += o.tx_gso;
        self.tx_segmented += o.tx_segmented;
        self.tx_segments += o.tx_segments;
        self.tx_csum_filled += o.tx_csum_filled;
        self.tx_drops.accumulate(&o.tx_drops);
        self.pauses += o.pauses;
        self.failovers += o.failovers;
        self.learn_refused += o.learn_refused;
    }
}

/// Counters of one port in one traffic class.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ClassCounters {
    /// Frames of the class received from the port.
    pub rx_frames: u64,
    /// Frames of the class transmitted to the port.
    pub tx_frames: u64,
    /// Their bytes.
    pub tx_bytes: u64,
    /// Copies of the class dropped at this output, by cause.
    pub tx_drops: DropCounts,
    /// Times the pause watchdog declared this output stuck in the class.
    pub watchdog_trips: u64,
}

//! What a kernel datapath needs of the core's state, and the changes it must follow
//! (docs/architecture.md, "The kernel datapath", "One brain").
//!
//! The core is the only place where forwarding is decided: a kernel datapath caches its
//! verdicts and executes them. To extract a frame's key as the core reads it, the kernel
//! holds the core's answers — each port's input settings and lock ([`FastPort`]), the
//! station table ([`FastMac`]), Layer 3's address owners and neighbours — which the driver
//! writes from [`Switch::fast_port`], [`Switch::fast_mac`], [`Switch::fast_owner`] and
//! [`Switch::fast_neighbour`] for the keys [`Switch::take_fastpath_changes`] reports.
//!
//! [`Switch::fast_port`]: crate::Switch::fast_port
//! [`Switch::fast_mac`]: crate::Switch::fast_mac
//! [`Switch::fast_owner`]: crate::Switch::fast_owner
//! [`Switch::fast_neighbour`]: crate::Switch::fast_neighbour
//! [`Switch::take_fastpath_changes`]: crate::Switch::take_fastpath_changes

use std::net::IpAddr;

use sluice_wire::MacAddr;

use crate::ids::PortId;

/// One port as a kernel datapath needs to know it to read its frames' keys as the core
/// does (`sluice_ebpf::convert`): its device, and what the key reader asks of its frames.
/// No rule: those are the core's, in its verdicts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FastPort {
    /// The handle by which the kernel reaches the port ([`crate::Port::fast_path`]); `None`
    /// for a port in user space (frames to it go up).
    pub target: Option<u32>,
    /// Leads to the LAN.
    pub uplink: bool,
    /// The only source MAC address allowed, if any (the key holds a frame's source).
    pub mac: Option<MacAddr>,
    /// The port's source IP addresses are checked (the key holds what a frame claims).
    pub checks_ips: bool,
    /// An uplink's device address. In Layer 2 mode frames arriving there for it belong to
    /// the host's own stack (the device may be the host's interface too), not to the
    /// switch; in Layer 3 mode it is the switch's own address on the LAN.
    pub dev_mac: Option<MacAddr>,
    /// Layer 3: the MAC address of the guest behind the port, once the core knows it.
    pub guest_mac: Option<MacAddr>,
    /// Every frame from or to this port goes through the core (it failed, it takes no
    /// offloads so GSO frames must be cut in software, its mirror is in user space, or it
    /// is captured).
    pub slow: bool,
    /// The port failed (its device is gone or refused a frame).
    pub failed: bool,
    /// Its storm control rates: the meters the kernel charges the frames the core's
    /// verdicts mark (`Verdict::storm`).
    pub storm: crate::StormControl,
    /// Its rate limits: `rate_in` is the kernel's meter of the frames the core's verdicts
    /// mark (`Verdict::meter_in`), `rate_out` the daemon's qdisc.
    pub rate: crate::RateLimit,
    /// IGMP/MLD snooping is on (Layer 2): a group frame's key holds its IP group's class.
    pub snoops: bool,
    /// Some port of the switch has security groups, and the kernel tracks connections
    /// ([`crate::Switch::set_kernel_tracker`]): an IP frame's key holds its connection's
    /// state and classes.
    pub acl: bool,
    /// An EVPN tunnel: where its stations are, routes say; a source the station table has
    /// neither behind it nor configured is `Unlearnable`, and nothing is learned from its
    /// frames.
    pub routed: bool,
    /// Its address resolution is the core's to read (EVPN's ARP/ND suppression): a
    /// kernel reads an IPv6 frame's neighbour-discovery facts into the key.
    pub suppressed: bool,
}

/// A key whose kernel entry must be rewritten from the core's state now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FastChange {
    /// A port's rules ([`crate::Switch::fast_port`]; `None` there: the port is gone).
    Port(PortId),
    /// A MAC table entry ([`crate::Switch::fast_mac`]; `None` there: no entry).
    Mac(u16, MacAddr),
    /// Layer 3: which port owns an address ([`crate::Switch::fast_owner`]).
    Owner(IpAddr),
    /// Layer 3: a LAN neighbour's MAC address ([`crate::Switch::fast_neighbour`]).
    Neighbour(u16, IpAddr),
    /// IGMP/MLD snooping: a group's port set ([`crate::Switch::fast_group`]; `None`
    /// there: not registered).
    Group(u16, IpAddr),
    /// EVPN: where tunnel port `.0` sends station `.2` of VNI `.1`
    /// ([`crate::Switch::fast_remote`]; `None` there: no route for it). A change of the
    /// port's flood lists or of the endpoints its routes name is a [`FastChange::Port`].
    Remote(PortId, u32, MacAddr),
}

/// A MAC table entry as the kernel sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FastMac {
    /// The port behind the address.
    pub port: PortId,
    /// Configured, not learned.
    pub is_static: bool,
}

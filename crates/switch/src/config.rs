//! What a switch and its ports are configured with, the MTUs they may have, and the
//! reasons the switch refuses a change of its configuration ([`SwitchError`]).

use std::net::IpAddr;

use sluice_wire::MacAddr;

use crate::class::{ClassConfig, ClassError};
use crate::l3::Mode;
use crate::vlan::VlanMode;

/// Smallest and largest MTU a port or switch may have (IP packet bytes).
pub const MTU_RANGE: std::ops::RangeInclusive<u16> = 68..=9000;

/// Switch-wide settings.
#[derive(Clone, Debug)]
pub struct SwitchConfig {
    /// Default MTU of ports (bytes of IP packet, as `ip link` shows).
    pub mtu: u16,
    /// Learned MAC entries are forgotten after this long without traffic (ms).
    pub aging_ms: u64,
    /// Never drop a frame because an output queue is full; hold its input instead.
    pub lossless: bool,
    /// Frames each output queue holds.
    pub queue_len: usize,
    /// Frames read from one port before others get a turn.
    pub batch: usize,
    /// Maximum MAC table entries (and, in Layer 3 mode, LAN neighbour entries).
    pub fib_max: usize,
    /// Maximum learned stations behind one port other than an uplink (Layer 2 mode); more
    /// are not learned, and counted in the port's `learn_refused`.
    pub port_mac_limit: usize,
    /// Layer 2 or Layer 3 forwarding.
    pub mode: Mode,
    /// Layer 3 mode: the switch's own MAC address on the guests' side (on the uplink it
    /// uses the uplink device's).
    pub router_mac: MacAddr,
    /// Traffic classes, in match order; none: one class, `default`, lossless as `lossless`.
    pub classes: Vec<ClassConfig>,
    /// Frames each input may hold while their outputs (of lossless classes) are full
    /// before it stops being read.
    pub hold_len: usize,
    /// An output of a lossless class that sends nothing for this long while frames wait
    /// for it is declared stuck and its class drops toward it (ms; 0: never).
    pub watchdog_ms: u64,
    /// IGMP/MLD snooping.
    pub snoop: crate::mdb::SnoopConfig,
}

/// Frames an input holds for full outputs before it stops being read, unless configured.
pub const DEFAULT_HOLD_LEN: usize = 64;

/// The pause watchdog's time unless configured (ms).
pub const DEFAULT_WATCHDOG_MS: u64 = 200;

/// The switch's guest-side MAC address in Layer 3 mode unless configured otherwise.
pub const DEFAULT_ROUTER_MAC: MacAddr = MacAddr([0x02, 0x73, 0x6c, 0x75, 0x69, 0x01]);

impl Default for SwitchConfig {
    fn default() -> Self {
        SwitchConfig {
            mtu: 1500,
            aging_ms: 300_000,
            lossless: false,
            queue_len: 256,
            batch: 64,
            fib_max: 8192,
            port_mac_limit: 1024,
            mode: Mode::L2,
            router_mac: DEFAULT_ROUTER_MAC,
            classes: Vec::new(),
            hold_len: DEFAULT_HOLD_LEN,
            watchdog_ms: DEFAULT_WATCHDOG_MS,
            snoop: crate::mdb::SnoopConfig::default(),
        }
    }
}

/// Per-port settings.
#[derive(Clone, Debug)]
pub struct PortConfig {
    /// Unique name (for a TAP, its interface name).
    pub name: String,
    /// VLAN membership.
    pub vlan: VlanMode,
    /// MTU; the switch's when `None`.
    pub mtu: Option<u16>,
    /// Security settings.
    pub policy: PortPolicy,
}

/// What a port may do, beyond its VLANs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PortPolicy {
    /// The port leads to the LAN: isolated ports may still exchange frames with it.
    pub uplink: bool,
    /// The port exchanges frames with uplinks only (the reference switch's port isolation).
    pub isolated: bool,
    /// The only source MAC address the port may send from; frames from any other are
    /// dropped and counted (`spoofed_mac`). Any address when `None`. The address is then
    /// the port's alone: frames claiming it from a port that does not lock it are dropped
    /// (`spoofed_mac`) too, so the station never moves to another port.
    pub mac: Option<MacAddr>,
    /// The only source IP addresses the port's IPv4 and IPv6 packets (and ARP sender
    /// addresses) may carry, besides the unspecified 0.0.0.0 and `::` (DHCP, duplicate
    /// address detection); others are dropped and counted (`spoofed_ip`). Any address
    /// when empty (unless `learn_ips`). Non-IP frames are not affected. In Layer 3 mode
    /// these are also the addresses the port is reached at.
    pub ips: Vec<IpAddr>,
    /// The first source address of each family the port uses is added to `ips` and then
    /// locked. In Layer 3 mode a guest port without `ips` learns them.
    pub learn_ips: bool,
    /// Makes this port a mirror of the named ports: it gets a copy of every frame they
    /// receive and are sent (in the VLANs it is a member of), always lossy, so a slow
    /// mirror never holds traffic back. A port has at most one mirror. Names of ports
    /// attached later count from when they attach.
    pub mirror_of: Vec<String>,
    /// Frames of these EtherTypes (after any 802.1Q tag) from the port are dropped and
    /// counted (`filtered`), before anything is learned from them.
    pub drop_ethertypes: Vec<u16>,
    /// The IEEE link-local addresses (01:80:C2:00:00:00 to 0F) whose frames from this port
    /// the switch forwards, one bit per last byte ([`LINK_LOCAL_NEVER`] are never
    /// forwarded); frames to the others are dropped and counted (`link_local`).
    pub forward_link_local: u16,
    /// Storm control: the most broadcast and multicast frames a second the port may send
    /// into the switch; more are dropped and counted (`storm`).
    pub storm: StormControl,
    /// Rate limits: bits a second the port may send into the switch and be sent.
    pub rate: RateLimit,
    /// Whether the port leads to a multicast router (IGMP/MLD snooping).
    pub mcast_router: crate::mdb::McastRouter,
}

/// A port's rate limits, in bits a second on the wire (Ethernet frames, GSO frames by
/// their whole length; 0: no limit), and how many bytes may pass at once.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RateLimit {
    /// What the port's guest sends into the switch (the port's rx).
    pub rate_in: u64,
    /// What the switch sends the port's guest (the port's tx).
    pub rate_out: u64,
    /// Bytes that may pass at once (0: [`RateLimit::burst_of`]'s default).
    pub burst: u64,
}

impl RateLimit {
    /// The burst at `rate` bits a second: `burst` if set, else the larger of two whole
    /// 64 KiB GSO frames with their headers (a smaller bucket could never pass one) and
    /// half a second of the rate. Measured with TCP through the kernel's policer: a tenth
    /// of a second, or a fixed 1.25 MiB, held 100 Mbit/s and 1 Gbit/s flows to a third of
    /// the rate or less (each loss a window's worth); half a second keeps them within a
    /// few percent (Open vSwitch advises about 0.8 s for the same reason).
    pub fn burst_of(&self, rate: u64) -> u64 {
        if self.burst > 0 { self.burst } else { (2 * (65_536 + 128)).max(rate / 16) }
    }

    /// The meter of `rate` bits a second: bytes, with the port's burst.
    pub fn meter(&self, rate: u64) -> crate::meter::Meter {
        crate::meter::Meter::new(rate / 8, self.burst_of(rate))
    }
}

/// A port's storm control: frames a second of broadcast and of multicast it may send into
/// the switch (0: no limit), and how many of each may come at once.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StormControl {
    /// Broadcast frames a second (0: no limit).
    pub broadcast_pps: u32,
    /// Multicast frames a second, link-local ones a port forwards among them (0: no
    /// limit).
    pub multicast_pps: u32,
    /// Frames of each kind that may come at once (0: [`StormControl::burst_of`]'s
    /// default).
    pub burst: u32,
}

impl StormControl {
    /// The burst at `pps`: `burst` if set, else a tenth of a second of the rate and at
    /// least 16 frames (a guest's ARP and neighbour discovery at boot).
    pub fn burst_of(&self, pps: u32) -> u32 {
        if self.burst > 0 { self.burst } else { (pps / 10).max(16) }
    }

    /// The meters of broadcast and of multicast frames.
    pub fn meters(&self) -> [crate::meter::Meter; 2] {
        [self.broadcast_pps, self.multicast_pps]
            .map(|pps| crate::meter::Meter::new(u64::from(pps), u64::from(self.burst_of(pps))))
    }
}

/// The link-local addresses no port may forward, one bit per last byte: pause (…01, IEEE
/// 802.3x MAC control) and the slow protocols (…02: LACP, marker, OAM). Forwarded, a
/// guest's pause frame could stop the physical switch behind an uplink.
pub const LINK_LOCAL_NEVER: u16 = 1 << 0x01 | 1 << 0x02;

/// Refusals of configuration changes.
#[derive(Debug, thiserror::Error)]
pub enum SwitchError {
    /// A port of that name is already attached.
    #[error("a port named {0:?} is already attached; choose another name or delete it first")]
    DuplicatePort(String),
    /// No port of that name.
    #[error("no port named {0:?} is attached (see `sluice port list`)")]
    NoSuchPort(String),
    /// MTU out of range.
    #[error("MTU {0} is out of range: use 68 to 9000")]
    BadMtu(u16),
    /// A VLAN id out of range.
    #[error("VLAN {0} is out of range: use 1 to 4094")]
    BadVlan(u16),
    /// An address another port already owns (Layer 3 mode).
    #[error("{ip} already belongs to port {owner:?}; an address can belong to one port only")]
    AddressInUse {
        /// The address.
        ip: IpAddr,
        /// The port that owns it.
        owner: String,
    },
    /// A static MAC entry for an address no single station has.
    #[error("{0} is a {1} address, not one station's: a static entry needs a unicast MAC (the first byte even)")]
    NotUnicast(MacAddr, &'static str),
    /// A bad list of traffic classes.
    #[error(transparent)]
    BadClass(#[from] ClassError),
    /// A static MAC entry for an address another port locks.
    #[error(
        "{mac} is locked to port {owner:?} by its `mac` setting; a static entry for it can point at that port only"
    )]
    MacLocked {
        /// The address.
        mac: MacAddr,
        /// The port that locks it.
        owner: String,
    },
    /// A port that already has a mirror, or a mirror of itself.
    #[error("port {port:?} cannot be mirrored to {mirror:?}: {why}")]
    BadMirror {
        /// The watched port.
        port: String,
        /// The mirror.
        mirror: String,
        /// Why not.
        why: &'static str,
    },
}

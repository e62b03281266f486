//! The maps sluice's kernel programs share with its daemon, declared once: every struct a
//! map holds and every constant both sides use (flags, counter indexes, bounds).
//!
//! Each declaration below gives the Rust item (`#[repr(C)]`, no padding the compiler
//! adds) and its description in [`ITEMS`]; [`header`] writes the C header from those, and
//! crates/ebpf/build.rs compiles the programs with it. So a layout exists only here: a
//! field changed here is changed in both languages. crates/ebpf's tests hold every
//! struct's size and field offsets in the compiled objects' BTF to the Rust ones
//! (docs/architecture.md, "One brain: the kernel executes the core's verdicts").
//!
//! No dependencies: the build script uses this crate. With the feature `aya` (sluice-ebpf
//! turns it on) every struct is also an `aya::Pod`, so maps can hold it.

#[macro_use]
mod declare;
mod header;

pub use header::{Const, Field, Item, Struct, Type, header};

abi! {
    /// Port slots in the maps.
    pub const MAX_PORTS: u32 = 1024 => SLUICE_MAX_PORTS;
    /// Addresses per family in a port's entry; a port with more goes slow.
    pub const MAX_IPS: usize = 8 => SLUICE_MAX_IPS;
    /// The core's bounds on a GSO frame (`MIN_GSO_SIZE`, `MAX_GSO_SEGMENTS`): smaller
    /// segments, or more of them, are dropped as `gso_limit`.
    pub const MIN_GSO_SIZE: u16 = 48 => SLUICE_MIN_GSO_SIZE;
    /// See [`MIN_GSO_SIZE`].
    pub const MAX_GSO_SEGMENTS: usize = 1024 => SLUICE_MAX_GSO_SEGMENTS;
    /// The `skb->mark` of the frames the switch itself sends into a guest's veth (the
    /// program's clones and redirects to a device's egress, the daemon's packet sockets
    /// with `SO_MARK`) and of those the program hands up through the upcall TAP: the egress
    /// program on both passes those, clearing the mark, and refuses every other frame.
    /// Setting a mark takes `CAP_NET_ADMIN`.
    pub const SLUICE_MARK: u32 = 0x51ce_0001 => SLUICE_MARK;

    /// [`Port::flags`]: the kernel reaches the port; else frames to it go up.
    pub const PF_KERNEL: u32 = 1 << 0 => PF_KERNEL;
    /// Leads to the LAN: sent with `bpf_redirect`, not `_peer`.
    pub const PF_UPLINK: u32 = 1 << 1 => PF_UPLINK;
    /// Exchanges frames with uplinks only.
    pub const PF_ISOLATED: u32 = 1 << 2 => PF_ISOLATED;
    /// Only `mac` may be a source.
    pub const PF_MAC: u32 = 1 << 3 => PF_MAC;
    /// Source IP addresses are checked.
    pub const PF_IPS: u32 = 1 << 4 => PF_IPS;
    /// IPv4 and ARP frames go up (the core learns the address).
    pub const PF_UP_V4: u32 = 1 << 5 => PF_UP_V4;
    /// IPv6 frames go up.
    pub const PF_UP_V6: u32 = 1 << 6 => PF_UP_V6;
    /// Every frame from or to the port goes up.
    pub const PF_SLOW: u32 = 1 << 7 => PF_SLOW;
    /// A trunk: `allowed` and `native_vid`; else access `access_vid`.
    pub const PF_TRUNK: u32 = 1 << 8 => PF_TRUNK;
    /// `own_mac` is set: frames to it pass to the host (Layer 2).
    pub const PF_OWN_MAC: u32 = 1 << 9 => PF_OWN_MAC;
    /// Layer 3: `guest_mac` is known.
    pub const PF_GUEST_MAC: u32 = 1 << 10 => PF_GUEST_MAC;
    /// IPv6 link-local sources pass the IP check (Layer 3).
    pub const PF_LL_OK: u32 = 1 << 11 => PF_LL_OK;
    /// Sent with `bpf_redirect` (egress) though not an uplink: a veth whose peer is in the
    /// switch's own namespace, which `bpf_redirect_peer` cannot reach.
    pub const PF_EGRESS: u32 = 1 << 12 => PF_EGRESS;
    /// Layer 2: as many stations learned behind the port as it may; frames from others are
    /// forwarded or flooded by the kernel without being learned.
    pub const PF_LEARN_FULL: u32 = 1 << 13 => PF_LEARN_FULL;
    /// A VXLAN device in external mode: frames to it are sent with a tunnel key
    /// (`sluice_tunnels`, `sluice_remotes`), frames from it arrive with one; floods and
    /// mirror copies to it go up.
    pub const PF_TUNNEL: u32 = 1 << 14 => PF_TUNNEL;

    /// A port's entry in `sluice_ports`, by slot.
    pub struct Port => sluice_port {
        /// 0: slot unused
        pub ifindex: u32,
        /// `PF_*`
        pub flags: u32,
        /// The port's MTU: the largest IP packet it takes.
        pub mtu: u16,
        /// An access port's VLAN.
        pub access_vid: u16,
        /// A trunk's VLAN of untagged frames; 0: none.
        pub native_vid: u16,
        /// How many of `ip4` are set.
        pub n_ip4: u8,
        /// How many of `ip6` are set.
        pub n_ip6: u8,
        /// With `PF_MAC`: the only source address the port may send from.
        pub mac: [u8; 6],
        pub pad: [u8; 2],
        /// An uplink's device: frames to it are the host's, not the switch's.
        pub own_mac: [u8; 6],
        pub pad2: [u8; 2],
        /// Layer 3: the MAC of the guest behind the port.
        pub guest_mac: [u8; 6],
        pub pad3: [u8; 2],
        /// Slot + 1 of the port that gets copies of this port's frames; 0: none.
        pub mirror: u32,
        pub pad4: u32,
        /// The IPv4 source addresses the port may use, in network order (the address's
        /// bytes in memory order: `u32::from_ne_bytes(octets)`).
        pub ip4: [u32; MAX_IPS],
        /// The IPv6 source addresses the port may use.
        pub ip6: [[u8; 16]; MAX_IPS],
        /// A trunk's VLANs carried tagged, a bit per VLAN id.
        pub allowed: [u64; 64],
    }

    /// A MAC table key in `sluice_fib`.
    pub struct FibKey => sluice_fib_key {
        pub vlan: u16,
        pub mac: [u8; 6],
    }

    /// `FibVal::flags`: the entry is configured, not learned.
    pub const FIB_STATIC: u32 = 1 << 0 => FIB_STATIC;

    /// Where a MAC table key's station is.
    pub struct FibVal => sluice_fib_val {
        /// The slot of the port it is behind.
        pub slot: u32,
        /// `FIB_STATIC`
        pub flags: u32,
        /// `bpf_ktime_get_ns()` of the last frame from this source forwarded here.
        pub seen_ns: u64,
    }

    /// `Config::mode`: a Layer 2 switch.
    pub const MODE_L2: u8 = 0 => MODE_L2;
    /// `Config::mode`: a Layer 3 switch.
    pub const MODE_L3: u8 = 1 => MODE_L3;

    /// The switch's settings: the one entry of `sluice_config`.
    pub struct Config => sluice_config {
        /// The upcall TAP; 0: none (frames that would go up are dropped).
        pub upcall_ifindex: u32,
        /// Layer 3: slot + 1 of the uplink off-switch traffic leaves by; 0: none.
        pub l3_uplink: u32,
        /// `MODE_L2` or `MODE_L3`
        pub mode: u8,
        /// Layer 3: the switch's MAC on the guests' side.
        pub router_mac: [u8; 6],
        pub pad: u8,
        /// Port slots in use are below this (a flood looks at those).
        pub n_slots: u32,
    }

    /// `Tunnel::flags`: an IPv6 underlay.
    pub const TUN_V6: u32 = 1 << 0 => TUN_V6;
    /// `Tunnel::flags`: a VNI per VLAN (`sluice_vnis`): frames cross untagged, their VNI
    /// says the VLAN; else every frame has `Tunnel::vni`.
    pub const TUN_PER_VLAN: u32 = 1 << 1 => TUN_PER_VLAN;
    /// `Tunnel::flags`: datagrams only from the endpoints in `sluice_endpoints`.
    pub const TUN_REMOTES_ONLY: u32 = 1 << 2 => TUN_REMOTES_ONLY;

    /// A tunnel port in `sluice_tunnels`, by its device's ifindex.
    pub struct Tunnel => sluice_tunnel {
        /// `TUN_*`
        pub flags: u32,
        pub ttl: u8,
        pub pad: [u8; 3],
        /// Without `TUN_PER_VLAN`: the VNI of every frame.
        pub vni: u32,
        pub pad2: u32,
        /// The underlay address frames leave from; IPv4 in the first 4 bytes.
        pub local: [u8; 16],
    }

    /// A `TUN_PER_VLAN` tunnel's VNI of a VLAN (`id` the VLAN id, the value the VNI), and
    /// the VLAN of a VNI (`id` `VNI_IN` | the VNI, the value `TUN_TAG` | the VLAN id), in
    /// `sluice_vnis`.
    pub struct VniKey => sluice_vni_key {
        pub ifindex: u32,
        pub id: u32,
    }

    /// Marks a [`VniKey`] whose `id` is a VNI (its value: the VLAN).
    pub const VNI_IN: u32 = 1 << 31 => VNI_IN;
    /// A VNI's frames get the tag of the VLAN in the value's low 12 bits.
    pub const TUN_TAG: u32 = 1 << 16 => TUN_TAG;

    /// An endpoint a tunnel accepts datagrams from (with `TUN_REMOTES_ONLY`): its
    /// configured remotes, in `sluice_endpoints`. The value is unused (1).
    pub struct EndpointKey => sluice_endpoint_key {
        pub ifindex: u32,
        /// IPv4 in the first 4 bytes.
        pub addr: [u8; 16],
    }

    /// A station behind a tunnel, in `sluice_remotes`.
    pub struct RemoteKey => sluice_remote_key {
        pub ifindex: u32,
        pub vni: u32,
        pub mac: [u8; 6],
        pub pad: [u8; 2],
    }

    /// Where a station behind a tunnel is: learned from the outer source of the datagrams
    /// it sends.
    pub struct Remote => sluice_remote {
        /// The remote endpoint; IPv4 in the first 4 bytes.
        pub addr: [u8; 16],
        pub seen_ns: u64,
    }

    /// Layer 3: which port owns an address (`sluice_owners`); also a tunnel socket
    /// filter's endpoints (`sluice_tunnel_peers`).
    pub struct IpKey => sluice_ip_key {
        /// 4 or 6
        pub family: u8,
        pub pad: [u8; 3],
        /// IPv4 in the first 4 bytes.
        pub addr: [u8; 16],
    }

    /// Layer 3: a LAN neighbour's MAC, by VLAN and address (`sluice_neigh`).
    pub struct NeighKey => sluice_neigh_key {
        pub vlan: u16,
        /// 4 or 6
        pub family: u8,
        pub pad: u8,
        /// IPv4 in the first 4 bytes.
        pub addr: [u8; 16],
    }

    /// A LAN neighbour's MAC.
    pub struct NeighVal => sluice_neigh_val {
        pub mac: [u8; 6],
        pub pad: [u8; 2],
    }

    /// Indexes into [`Counters::v`]: counters per port slot (per CPU).
    /// Drop causes are the core's, in `DropCause::ALL` order (indexes in [`d`]),
    /// from [`c::RX_DROP`] and [`c::TX_DROP`].
    pub mod c {
        /// Frames received.
        pub const RX_FRAMES: usize = 0 => C_RX_FRAMES;
        /// Bytes received.
        pub const RX_BYTES: usize = 1 => C_RX_BYTES;
        /// GSO frames received.
        pub const RX_GSO: usize = 2 => C_RX_GSO;
        /// Frames the kernel sent to the one port their destination is behind.
        pub const FORWARDED: usize = 3 => C_FORWARDED;
        /// Outputs the kernel sent the port's frames to: one per frame sent on, per port a
        /// flood reached, per mirror copy.
        pub const COPIES: usize = 4 => C_COPIES;
        /// Frames handed up to the core.
        pub const UPCALLS: usize = 5 => C_UPCALLS;
        /// Frames the kernel had for the port (before its MTU and the send).
        pub const TX_OFFERED: usize = 6 => C_TX_OFFERED;
        /// Frames sent.
        pub const TX_FRAMES: usize = 7 => C_TX_FRAMES;
        /// Bytes sent.
        pub const TX_BYTES: usize = 8 => C_TX_BYTES;
        /// GSO frames sent.
        pub const TX_GSO: usize = 9 => C_TX_GSO;
        /// Receive drops start here, one per `DropCause::ALL` entry.
        pub const RX_DROP: usize = 10 => C_RX_DROP;
        /// Transmit drops start here, one per `DropCause::ALL` entry.
        pub const TX_DROP: usize = 28 => C_TX_DROP;
        /// Frames the kernel flooded.
        pub const FLOODED: usize = 46 => C_FLOODED;
        /// Frames the kernel sent on from a source the port may not learn.
        pub const LEARN_REFUSED: usize = 47 => C_LEARN_REFUSED;
        /// Datagrams from a tunnel refused (no key, a VNI the port does not carry).
        pub const TUN_BAD: usize = 48 => C_TUN_BAD;
        /// Counters per port.
        pub const COUNT: usize = 49 => C_COUNT;
    }

    /// The drop causes the program counts: their positions in `DropCause::ALL`, added to
    /// [`c::RX_DROP`] or [`c::TX_DROP`].
    pub mod d {
        /// `malformed`
        pub const MALFORMED: usize = 1 => D_MALFORMED;
        /// `vlan_filter`
        pub const VLAN_FILTER: usize = 2 => D_VLAN_FILTER;
        /// `over_mtu`
        pub const OVER_MTU: usize = 3 => D_OVER_MTU;
        /// `unknown_port`
        pub const UNKNOWN_PORT: usize = 4 => D_UNKNOWN_PORT;
        /// `same_port`
        pub const SAME_PORT: usize = 5 => D_SAME_PORT;
        /// `tx_error`
        pub const TX_ERROR: usize = 6 => D_TX_ERROR;
        /// `isolated`
        pub const ISOLATED: usize = 7 => D_ISOLATED;
        /// `spoofed_mac`
        pub const SPOOFED_MAC: usize = 8 => D_SPOOFED_MAC;
        /// `spoofed_ip`
        pub const SPOOFED_IP: usize = 9 => D_SPOOFED_IP;
        /// `not_ip`
        pub const NOT_IP: usize = 10 => D_NOT_IP;
        /// `no_route`
        pub const NO_ROUTE: usize = 11 => D_NO_ROUTE;
        /// `upcall_lost`
        pub const UPCALL_LOST: usize = 13 => D_UPCALL_LOST;
        /// `gso_limit`
        pub const GSO_LIMIT: usize = 14 => D_GSO_LIMIT;
        /// `unknown_endpoint`
        pub const UNKNOWN_ENDPOINT: usize = 16 => D_UNKNOWN_ENDPOINT;
        /// `egress_refused`
        pub const EGRESS_REFUSED: usize = 17 => D_EGRESS_REFUSED;
    }

    /// One port's counters on one CPU: the value of `sluice_stats`, by slot.
    pub struct Counters => sluice_counters {
        /// Indexed by [`c`] (`C_*`).
        pub v: [u64; c::COUNT],
    }

    /// Indexes into [`SwitchCounters::v`]: the switch's own counters.
    pub mod s {
        /// Frames others sent out of the upcall TAP (a socket bound to it, the kernel's
        /// own), dropped at its egress.
        pub const UPCALL_EGRESS_REFUSED: usize = 0 => S_UPCALL_EGRESS_REFUSED;
        /// Counters of the switch.
        pub const COUNT: usize = 1 => S_COUNT;
    }

    /// The switch's own counters on one CPU: the one entry of `sluice_switch_stats`.
    pub struct SwitchCounters => sluice_switch_counters {
        /// Indexed by [`s`] (`S_*`).
        pub v: [u64; s::COUNT],
    }
}

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

    /// `Tunnel::flags`: an IPv6 underlay.
    pub const TUN_V6: u32 = 1 << 0 => TUN_V6;
    /// A tunnel port in `sluice_tunnels`, by its device's ifindex: what its outputs are
    /// sent with.
    pub struct Tunnel => sluice_tunnel {
        /// `TUN_*`
        pub flags: u32,
        pub ttl: u8,
        pub pad: [u8; 3],
        /// The underlay address frames leave from; IPv4 in the first 4 bytes.
        pub local: [u8; 16],
    }

    /// An endpoint of a tunnel: one of its configured remotes, in `sluice_endpoints` (a
    /// frame's stage-1 key says whether its sender is one). The value is unused (1).
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

    /// Endpoints a flood into a tunnel is replicated to, at most (`FloodEps::addrs`): a
    /// tunnel whose flood set is larger has no `sluice_flood_eps` entry, and its floods go
    /// up to the core.
    pub const MAX_FLOOD_EPS: usize = 32 => SLUICE_MAX_FLOOD_EPS;

    /// A tunnel's VNI in `sluice_flood_eps`.
    pub struct FloodKey => sluice_flood_key {
        /// The tunnel's device.
        pub ifindex: u32,
        pub vni: u32,
    }

    /// The endpoints a flood into a tunnel in one VNI goes to (head-end replication): the
    /// core's flood set for that VNI, written by the core (`sluice_flood_eps`).
    pub struct FloodEps => sluice_flood_eps_val {
        /// How many of `addrs` are used (1 to `SLUICE_MAX_FLOOD_EPS`).
        pub n: u32,
        pub pad: u32,
        /// The endpoints; IPv4 in the first 4 bytes of each.
        pub addrs: [[u8; 16]; MAX_FLOOD_EPS],
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
        /// Receive drops start here, one per `DropCause::ALL` entry (32 places: room for
        /// the causes rules to come will add, without another layout).
        pub const RX_DROP: usize = 10 => C_RX_DROP;
        /// Transmit drops start here, one per `DropCause::ALL` entry (32 places).
        pub const TX_DROP: usize = 42 => C_TX_DROP;
        /// Frames the kernel flooded.
        pub const FLOODED: usize = 74 => C_FLOODED;
        /// Frames the kernel sent on from a source the port may not learn.
        pub const LEARN_REFUSED: usize = 75 => C_LEARN_REFUSED;
        /// Datagrams from a tunnel the program could not read: no tunnel key (the device's
        /// own fault; a VNI the port does not carry is a received frame dropped
        /// `vlan_filter`, an unknown sender one dropped `unknown_endpoint`).
        pub const TUN_BAD: usize = 76 => C_TUN_BAD;
        /// Frames the executor found no current verdict for (none, or one of an older
        /// generation), in either stage: each also went up (or was lost going up).
        pub const MISSES: usize = 77 => C_MISSES;
        /// Stations heard behind a tunnel the executor could not report, its ring
        /// (`sluice_heard`) being full: each is reported again by its next frame.
        pub const HEARD_LOST: usize = 78 => C_HEARD_LOST;
        /// Counters per port.
        pub const COUNT: usize = 79 => C_COUNT;
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
        /// `upcall_limit`
        pub const UPCALL_LIMIT: usize = 18 => D_UPCALL_LIMIT;
        /// `link_local`
        pub const LINK_LOCAL: usize = 20 => D_LINK_LOCAL;
        /// `storm`
        pub const STORM: usize = 21 => D_STORM;
        /// `rate_limit`
        pub const RATE_LIMIT: usize = 22 => D_RATE_LIMIT;
        /// `acl`
        pub const ACL: usize = 23 => D_ACL;
        /// `ct_full`
        pub const CT_FULL: usize = 24 => D_CT_FULL;
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
    // The executor (`bpf/exec.c`, program `sluice_exec`): the kernel extracts a frame's
    // key, looks up the core's verdict for it and executes it, deciding nothing
    // (docs/architecture.md, "One brain: the kernel executes the core's verdicts").

    /// The most outputs a verdict has: a frame the core would send to more ports (a flood
    /// of a VLAN with more members) is the core's, which installs an `ACT_UP` verdict.
    pub const MAX_OUTPUTS: usize = 16 => SLUICE_MAX_OUTPUTS;

    /// [`Input::flags`]: the device is a VXLAN device in external mode: its frames arrive
    /// with a tunnel key, whose VNI and outer source are part of the stage-1 key.
    pub const IN_TUNNEL: u32 = 1 << 0 => IN_TUNNEL;
    /// [`Input::flags`]: the tunnel's underlay is IPv6.
    pub const IN_TUNNEL_V6: u32 = 1 << 1 => IN_TUNNEL_V6;
    /// [`Input::flags`]: [`Input::own_mac`] is set: unicast to it is `DST_OWN`.
    pub const IN_OWN_MAC: u32 = 1 << 2 => IN_OWN_MAC;
    /// [`Input::flags`]: the device may be the host's own interface (a Layer 2 uplink):
    /// a frame to `own_mac` or a group that finds no verdict goes up as a copy and on to
    /// the host's stack, since whatever the core decides, the host gets it too.
    pub const IN_HOST: u32 = 1 << 3 => IN_HOST;
    /// [`Input::flags`]: Layer 3: [`Input::guest_mac`] is set: the MAC address of the guest
    /// behind the port, as the core knows it.
    pub const IN_GUEST: u32 = 1 << 4 => IN_GUEST;

    /// A device the executor runs on, by its ifindex, in `sluice_inputs` (the core writes
    /// it; a device not in it is not the switch's, and its frames go on to the host).
    pub struct Input => sluice_input {
        /// The port's slot: its counters, and the first field of its keys.
        pub slot: u32,
        /// `IN_*`
        pub flags: u32,
        /// With `IN_OWN_MAC`: the address a frame's destination is `DST_OWN` at (an uplink's
        /// device address in Layer 2, the switch's address on the LAN in Layer 3).
        pub own_mac: [u8; 6],
        pub pad: [u8; 2],
        /// With `IN_GUEST`: the address a source is `SRC_HERE` at, with `X_GUEST`.
        pub guest_mac: [u8; 6],
        pub pad2: [u8; 2],
    }

    /// [`AdmitKey::tag`]: the frame arrived untagged.
    pub const TAG_NONE: u8 = 0 => TAG_NONE;
    /// [`AdmitKey::tag`]: with an 802.1Q tag (in the skb's metadata, or in the frame).
    pub const TAG_8021Q: u8 = 1 => TAG_8021Q;
    /// [`AdmitKey::tag`]: with an outer tag of another kind in the skb's metadata (802.1ad).
    pub const TAG_OTHER: u8 = 2 => TAG_OTHER;

    /// [`AdmitKey::dst`], [`FlowKey::dst`]: unicast to a station the table does not know
    /// (in stage 1: any unicast but the input's own address).
    pub const DST_UNKNOWN: u8 = 0 => DST_UNKNOWN;
    /// Broadcast or multicast.
    pub const DST_GROUP: u8 = 1 => DST_GROUP;
    /// The input's own address ([`Input::own_mac`]).
    pub const DST_OWN: u8 = 2 => DST_OWN;
    /// [`FlowKey::dst`]: a station the table knows, behind [`FlowKey::dst_slot`].
    pub const DST_STATION: u8 = 3 => DST_STATION;
    /// An IEEE link-local address, 01:80:C2:00:00:00 to 0F (a group address of its own
    /// class): [`FlowKey::dst_slot`] holds its last byte.
    pub const DST_LINK_LOCAL: u8 = 4 => DST_LINK_LOCAL;
    /// Broadcast (ff:ff:ff:ff:ff:ff): a group of its own, for storm control.
    pub const DST_BROADCAST: u8 = 5 => DST_BROADCAST;

    /// Stage 1 of a frame's key: the port it came in by and how it arrived (the core's
    /// VLAN admission, and what an uplink's host takes before it). Padding-free, 12 bytes.
    pub struct AdmitKey => sluice_admit_key {
        /// The input's slot.
        pub slot: u16,
        /// With `TAG_8021Q`: the tag's VLAN id (0: a priority tag); else 0.
        pub vid: u16,
        /// `TAG_*`
        pub tag: u8,
        /// `DST_UNKNOWN`, `DST_GROUP`, `DST_OWN`, `DST_LINK_LOCAL` or `DST_BROADCAST`.
        pub dst: u8,
        /// From a tunnel: 1 when the outer source is one of the port's endpoints
        /// (`sluice_endpoints`); else 0.
        pub endpoint: u8,
        pub pad: u8,
        /// From a tunnel: the VNI; else 0.
        pub vni: u32,
    }

    /// [`Admit::action`], [`Verdict::action`]: up to the core (its slow work: learning,
    /// address resolution, a next hop to wait for); the zero value.
    pub const ACT_UP: u8 = 0 => ACT_UP;
    /// Dropped, counted at the input with the drop cause `cause` (a `D_*` index).
    pub const ACT_DROP: u8 = 1 => ACT_DROP;
    /// Stage 1: admitted to `Admit::vlan`, decided by stage 2. Stage 2: sent to the
    /// verdict's outputs.
    pub const ACT_FORWARD: u8 = 2 => ACT_FORWARD;
    /// The host's frame alone: it goes on to the host's stack, uncounted, as if the switch
    /// were not there.
    pub const ACT_HOST: u8 = 3 => ACT_HOST;

    /// [`Verdict::flags`]: counted as flooded at the input (else as forwarded).
    pub const V_FLOOD: u8 = 1 << 0 => V_FLOOD;
    /// Count `learn_refused` at the input: a source the input may not learn.
    pub const V_LEARN_REFUSED: u8 = 1 << 1 => V_LEARN_REFUSED;
    /// [`Verdict::flags`], [`Admit::flags`]: the host's stack gets the frame too, as it
    /// arrived (an uplink whose device may be the host's interface): with `ACT_DROP` after
    /// counting the drop, with `ACT_UP` after a copy went up, with `ACT_FORWARD` after
    /// every output got a copy.
    pub const V_HOST: u8 = 1 << 2 => V_HOST;
    /// [`Verdict::flags`]: the core lets frames with this key through the checks that come
    /// before learning, so it learns from them: a tunnel's station heard in one is
    /// reported (`sluice_heard`); one from a frame it drops before learning is not.
    pub const V_TEACHES: u8 = 1 << 3 => V_TEACHES;
    /// [`Verdict::flags`], `ACT_FORWARD`: charged to the input's broadcast storm control
    /// meter (`METER_STORM_BC`); over it, dropped at the input (`storm`).
    pub const V_STORM_BC: u8 = 1 << 4 => V_STORM_BC;
    /// Charged to the input's multicast storm control meter (`METER_STORM_MC`).
    pub const V_STORM_MC: u8 = 1 << 5 => V_STORM_MC;
    /// Charged to the input's `rate_in` meter (`METER_RATE_IN`, bytes); over it, dropped
    /// at the input (`rate_limit`).
    pub const V_METER_IN: u8 = 1 << 6 => V_METER_IN;
    /// Security-group rules decided the verdict: each frame that finds it adds one to its
    /// `hits` (the daemon credits them to the rules).
    pub const V_HITS: u8 = 1 << 7 => V_HITS;

    /// [`Admit::mask`]: read the exact source MAC address ([`FlowKey::src_mac`]).
    pub const X_SRC_MAC: u16 = 1 << 0 => X_SRC_MAC;
    /// Read the source address the frame claims ([`FlowKey::claim`], [`FlowKey::src_ip`]).
    pub const X_SRC_IP: u16 = 1 << 1 => X_SRC_IP;
    /// Look the source up in `sluice_locks`: `SRC_LOCKED` if another port locks it.
    pub const X_LOCKS: u16 = 1 << 2 => X_LOCKS;
    /// Look the destination up in the station table (`DST_STATION`); else a unicast
    /// destination is `DST_OWN` or `DST_UNKNOWN`.
    pub const X_DST_STATION: u16 = 1 << 3 => X_DST_STATION;
    /// Read Layer 3 mode's extras ([`FlowKey::l3`], `owner`, `proto`, `icmp6_type`).
    pub const X_L3: u16 = 1 << 4 => X_L3;
    /// Layer 3: answer the source from the input's guest, not from the station table:
    /// `SRC_HERE` if it is [`Input::guest_mac`] (with `IN_GUEST`), else `SRC_ABSENT` (the
    /// core's answer in Layer 3, which a table of stations by VLAN and address cannot give
    /// when two ports' guests share an address).
    pub const X_GUEST: u16 = 1 << 5 => X_GUEST;
    /// Security groups: track an IP frame's connection in the kernel's conntrack (zone
    /// `ExecConfig::ct_zone`) and read its classes ([`FlowKey::ct`] and after).
    pub const X_CT: u16 = 1 << 6 => X_CT;

    /// Stage 1's verdict, in `sluice_admits` by [`AdmitKey`].
    pub struct Admit => sluice_admit {
        /// The generation the core decided it in: only one equal to `ExecConfig::generation`
        /// is used; an older one is a miss.
        pub generation: u64,
        /// `ACT_*`
        pub action: u8,
        /// `ACT_DROP`: the drop cause, a `D_*` index.
        pub cause: u8,
        /// `V_HOST` (with `ACT_DROP` or `ACT_UP`).
        pub flags: u8,
        pub pad: u8,
        /// `ACT_FORWARD`: the VLAN the frame joins.
        pub vlan: u16,
        /// `ACT_FORWARD`: `X_*`, what stage 2's key reads of the frame (the input's mask,
        /// the same for every stage-1 key of a slot in a generation).
        pub mask: u16,
    }

    /// [`FlowKey::src`]: not in the station table; the zero value.
    pub const SRC_ABSENT: u8 = 0 => SRC_ABSENT;
    /// Behind the input (its station entry's slot is the input's).
    pub const SRC_HERE: u8 = 1 => SRC_HERE;
    /// Learned behind another port.
    pub const SRC_ELSEWHERE: u8 = 2 => SRC_ELSEWHERE;
    /// A static entry of another port.
    pub const SRC_STATIC: u8 = 3 => SRC_STATIC;
    /// Locked to another port (`X_LOCKS`, `sluice_locks`).
    pub const SRC_LOCKED: u8 = 4 => SRC_LOCKED;
    /// All zeroes: an address no table learns.
    pub const SRC_UNLEARNABLE: u8 = 5 => SRC_UNLEARNABLE;

    /// [`FlowKey::claim`]: not asked (no `X_SRC_IP`), or neither IP nor ARP.
    pub const CLAIM_NONE: u8 = 0 => CLAIM_NONE;
    /// An IPv4, IPv6 or ARP frame too short to say.
    pub const CLAIM_SHORT: u8 = 1 => CLAIM_SHORT;
    /// An IPv4 source or ARP sender address, in the first 4 bytes of `src_ip`.
    pub const CLAIM_V4: u8 = 2 => CLAIM_V4;
    /// An IPv6 source address.
    pub const CLAIM_V6: u8 = 3 => CLAIM_V6;

    /// [`FlowKey::l3`]: the frame's addresses can be read (an ARP message for IPv4 over
    /// Ethernet, request or reply; an IP header with both addresses).
    pub const L3X_READABLE: u8 = 1 << 0 => L3X_READABLE;
    /// IPv6: the hop limit is 255.
    pub const L3X_HOP255: u8 = 1 << 1 => L3X_HOP255;

    /// Stage 2 of a frame's key: what the forwarding decision reads, as the kernel
    /// extracts it (parsing, and table lookups; no decision). Extras the input's mask does
    /// not ask for are zero, so that frames the core decides alike share a key.
    /// Padding-free, 38 bytes.
    pub struct FlowKey => sluice_flow_key {
        /// The input's slot.
        pub slot: u16,
        /// The frame's VLAN (stage 1's `Admit::vlan`).
        pub vlan: u16,
        /// The EtherType after the 802.1Q tag, in host order.
        pub ethertype: u16,
        /// `SRC_*`: the station table's answer for the source, relative to the input.
        pub src: u8,
        /// `DST_*`
        pub dst: u8,
        /// `DST_STATION`: the slot the destination is behind; `DST_LINK_LOCAL`: the
        /// address's last byte (0 to 15); else 0.
        pub dst_slot: u16,
        /// `X_L3`: slot + 1 of the port owning the destination IP address
        /// (`sluice_owners`); 0: none, or not an IP frame.
        pub owner: u16,
        /// `X_SRC_IP`: `CLAIM_*`.
        pub claim: u8,
        /// `X_L3`: `L3X_*`; `X_ND`: `L3X_HOP255` alone.
        pub l3: u8,
        /// `X_L3` or `X_ND`, IPv6: the next header; else 0.
        pub proto: u8,
        /// `X_L3` or `X_ND`, ICMPv6: the message type; else 0.
        pub icmp6_type: u8,
        /// `X_SRC_MAC`: the source MAC address.
        pub src_mac: [u8; 6],
        /// `X_SRC_IP`, `CLAIM_V4` or `CLAIM_V6`: the claimed source address.
        pub src_ip: [u8; 16],
        /// `X_GROUP`, `DST_GROUP`: the IP group's class, a `u32` in host order: `GCLASS_*`
        /// or a port set id from `sluice_mdb`; else 0.
        pub group: [u8; 4],
        // Security groups (`X_CT`), IPv4 and IPv6 frames; else all zero.
        /// `CTS_*`: the frame's connection as the kernel's conntrack has it.
        pub ct: u8,
        /// The IP protocol.
        pub ct_proto: u8,
        /// ICMP and ICMPv6: the message type.
        pub icmp_type: u8,
        /// `CTS_MISS`, TCP: the segment's flags, `& CT_FLAGS` (the core tells a new
        /// connection from an invalid segment by them).
        pub ct_flags: u8,
        pub pad_ct: [u8; 2],
        /// The class of the source address (`sluice_acl_v4`, `sluice_acl_v6`; 0: none).
        pub src_class: u32,
        /// The class of the destination address.
        pub dst_class: u32,
        /// TCP and UDP: the class of the destination port (`sluice_acl_ports`).
        pub dport_class: u32,
    }

    // Security groups on the kernel datapath: the kernel's conntrack, the core's classes.

    /// [`FlowKey::ct`]: not tracked by the kernel (not TCP or UDP, a later fragment, cut
    /// short, or no `X_CT`).
    pub const CTS_UNTRACKED: u8 = 0 => CTS_UNTRACKED;
    /// No connection in the zone: the core's rules decide (with `ct_flags`, whether it may
    /// open one).
    pub const CTS_MISS: u8 = 1 => CTS_MISS;
    /// A remembered connection, in the direction it was opened.
    pub const CTS_ESTABLISHED: u8 = 2 => CTS_ESTABLISHED;
    /// A remembered connection's return traffic.
    pub const CTS_REPLY: u8 = 3 => CTS_REPLY;
    /// The TCP flags [`FlowKey::ct_flags`] keeps: SYN, RST, ACK.
    pub const CT_FLAGS: u8 = 0x16 => CT_FLAGS;

    /// [`Verdict::ct`]: nothing to do with the frame's connection.
    pub const CT_NONE: u8 = 0 => CT_NONE;
    /// Remember the frame's connection (a new one an `allow-related` rule passed) in the
    /// zone; the table full, the frame is dropped at the input (`ct_full`).
    pub const CT_COMMIT: u8 = 1 => CT_COMMIT;

    /// A key of the address class tries (`sluice_acl_v4`, `sluice_acl_v6`; LPM): the
    /// prefix length counts the 32 bits of `set` and the address's.
    pub struct AclAddrKey => sluice_acl_addr_key {
        /// 32 + the prefix's length.
        pub prefixlen: u32,
        /// The class set, big-endian ([`ExecConfig::acl_set`]).
        pub set: [u8; 4],
        /// The address; IPv4 in the first 4 bytes.
        pub addr: [u8; 16],
    }

    /// A key of the port class trie (`sluice_acl_ports`; LPM): a port range split into
    /// prefixes.
    pub struct AclPortKey => sluice_acl_port_key {
        /// 32 + the prefix's length (0 to 16 bits of the port).
        pub prefixlen: u32,
        /// The class set, big-endian.
        pub set: [u8; 4],
        /// The destination port, big-endian.
        pub port: [u8; 2],
        pub pad: [u8; 2],
    }

    /// [`Output::kind`]: a guest's veth: the frame itself is sent with
    /// `bpf_redirect_peer` into the guest's namespace, a copy through the device's egress.
    pub const OUT_PEER: u8 = 0 => OUT_PEER;
    /// Out of the device, through its egress (`bpf_redirect`): an uplink, or a veth whose
    /// peer is in the switch's own namespace.
    pub const OUT_EGRESS: u8 = 1 => OUT_EGRESS;
    /// Into a tunnel: out of its VXLAN device with a tunnel key (VNI `vni`, the remote
    /// endpoint, the local address and TTL of `sluice_tunnels`).
    pub const OUT_TUNNEL: u8 = 2 => OUT_TUNNEL;

    /// [`Output::flags`]: leaves tagged with 802.1Q VLAN `vid` (and the priority the
    /// frame arrived with); else untagged.
    pub const OF_TAG: u8 = 1 << 0 => OF_TAG;
    /// A mirror's copy (executed as any output; the core's distinction, kept for a
    /// one-to-one conversion).
    pub const OF_MIRROR: u8 = 1 << 1 => OF_MIRROR;
    /// Marked `SLUICE_MARK` when it passes the device's egress (a guest's veth, whose
    /// egress program lets only marked frames in).
    pub const OF_MARK: u8 = 1 << 2 => OF_MARK;
    /// Leaves with source MAC address `src_mac` (Layer 3: the switch's on that side).
    pub const OF_SRC_MAC: u8 = 1 << 3 => OF_SRC_MAC;
    /// `OUT_TUNNEL`: the remote endpoint is where the frame's destination was heard
    /// (`sluice_remotes`, by device, `vni` and destination MAC); else `remote`.
    pub const OF_REMOTE_DST: u8 = 1 << 4 => OF_REMOTE_DST;

    /// `OUT_TUNNEL`: a flood's copy, sent to every endpoint of `sluice_flood_eps` for the
    /// device and `vni` (one clone each, each with its own tunnel key) — or, for a unicast
    /// destination `sluice_remotes` has, to that endpoint alone, as the core's tunnel port
    /// sends it. No entry (or a GSO frame to more than one endpoint): the frame goes up.
    pub const OF_FLOOD_EPS: u8 = 1 << 5 => OF_FLOOD_EPS;

    /// One output of a verdict: where a copy of the frame goes and what it looks like.
    pub struct Output => sluice_out {
        /// The device to send to.
        pub ifindex: u32,
        /// `OUT_TUNNEL`: the VNI.
        pub vni: u32,
        /// The output port's slot: where it is counted.
        pub slot: u16,
        /// The port's MTU: a frame whose measure exceeds it is dropped there (`over_mtu`).
        pub mtu: u16,
        /// `OF_TAG`: the VLAN id of the tag to push.
        pub vid: u16,
        /// `OUT_*`
        pub kind: u8,
        /// `OF_*`
        pub flags: u8,
        /// `OF_SRC_MAC`: the source MAC address the copy leaves with.
        pub src_mac: [u8; 6],
        pub pad: [u8; 2],
        /// `OUT_TUNNEL` without `OF_REMOTE_DST`: the remote endpoint; IPv4 in the first 4
        /// bytes.
        pub remote: [u8; 16],
    }

    /// [`Verdict::next_hop`]: the destination MAC address stays.
    pub const NH_NONE: u8 = 0 => NH_NONE;
    /// Rewritten to `Verdict::next_mac` (Layer 3: the guest behind the output).
    pub const NH_MAC: u8 = 1 => NH_MAC;
    /// Rewritten to the neighbour table's entry for the frame's VLAN and destination IP
    /// address (`sluice_neigh`); a frame whose neighbour is not there goes up, to wait for
    /// it.
    pub const NH_NEIGH: u8 = 2 => NH_NEIGH;

    /// Stage 2's verdict, in `sluice_verdicts` by [`FlowKey`]: plain data, executed
    /// without deciding anything.
    pub struct Verdict => sluice_verdict {
        /// The generation the core decided it in: only one equal to `ExecConfig::generation`
        /// is used; an older one is a miss.
        pub generation: u64,
        /// `ACT_*`
        pub action: u8,
        /// `ACT_DROP`: the drop cause, a `D_*` index.
        pub cause: u8,
        /// `V_*`: which counters to add at the input, and whether the host gets the frame.
        pub flags: u8,
        /// `ACT_FORWARD`: how many of `outputs` are used (at most `SLUICE_MAX_OUTPUTS`):
        /// the destinations (in slot order for a flood), then mirror copies. The last gets
        /// the frame itself, the others a clone.
        pub n_out: u8,
        /// `NH_*`: the destination MAC address's rewrite.
        pub next_hop: u8,
        /// `CT_*`: what the executor does with the frame's connection (`ACT_FORWARD`).
        pub ct: u8,
        /// `NH_MAC`: the destination MAC address.
        pub next_mac: [u8; 6],
        /// `V_HITS`: the frames that found this verdict since it was installed.
        pub hits: u32,
        /// The outputs, `n_out` of them.
        pub outputs: [Output; MAX_OUTPUTS],
    }

    /// The TCI of an upcall's outer (802.1ad) tag, whose low 12 bits are the input's
    /// slot: with `UP_TUNNEL`, the frame came from a tunnel, and two 802.1Q tags follow the
    /// outer one with its origin, which the core's key needs: the first's TCI is the VNI's
    /// high 16 bits, the second's the VNI's low 8 bits (shifted up by 8) with
    /// `UP_ENDPOINT` when the sender is one of the port's endpoints. The frame's own tag,
    /// if any, follows them.
    pub const UP_TUNNEL: u16 = 1 << 15 => UP_TUNNEL;
    /// See [`UP_TUNNEL`].
    pub const UP_ENDPOINT: u16 = 1 << 0 => UP_ENDPOINT;
    /// Bits 12 to 14 of an upcall's outer TCI: the frame's `CTS_*` as the executor found it
    /// (`X_CT`; else `CTS_UNTRACKED`), which the core decides it in.
    pub const UP_CT_SHIFT: u16 = 12 => UP_CT_SHIFT;

    /// [`HeardEvent::family`]: the sender's address is IPv4, in the first 4 bytes.
    pub const HEARD_V4: u8 = 4 => HEARD_V4;
    /// [`HeardEvent::family`]: IPv6.
    pub const HEARD_V6: u8 = 6 => HEARD_V6;

    /// A station the executor heard behind a tunnel where `sluice_remotes` does not have
    /// it — a frame from a tunnel, admitted to `vlan`, whose source the station table
    /// has on the tunnel's slot — reported on the ring buffer `sluice_heard` (the program
    /// writes no forwarding state): the core decides whether to learn it, and writes
    /// `sluice_remotes` if it does.
    pub struct HeardEvent => sluice_heard_event {
        /// The tunnel's device.
        pub ifindex: u32,
        /// Its input slot.
        pub slot: u32,
        /// The datagram's VNI.
        pub vni: u32,
        /// The VLAN the frame was admitted to (stage 1).
        pub vlan: u16,
        /// `HEARD_V4` or `HEARD_V6`.
        pub family: u8,
        pub pad: u8,
        /// The frame's source MAC address.
        pub mac: [u8; 6],
        pub pad2: [u8; 2],
        /// The datagram's sender (the outer source address).
        pub addr: [u8; 16],
    }

    /// A MAC address locked to a port by its `mac` setting, in `sluice_locks` (on every
    /// VLAN); the value is the port's slot.
    pub struct LockKey => sluice_lock_key {
        pub mac: [u8; 6],
        pub pad: [u8; 2],
    }

    /// The executor's settings: the one entry of `sluice_exec_cfg`.
    pub struct ExecConfig => sluice_exec_config {
        /// The current generation: verdicts of any other are misses. The core moves it on
        /// whenever a change could alter a verdict (one write invalidates them all).
        pub generation: u64,
        /// The upcall TAP; 0: none (frames that would go up are dropped, `upcall_lost`).
        pub upcall_ifindex: u32,
        /// Each input's upcall budget, a token bucket: refilled with this many upcalls a
        /// second (0: no budget)…
        pub upcall_rate: u32,
        /// …holding at most this many. A frame that would go up from an input whose
        /// bucket is empty is dropped, `upcall_limit`.
        pub upcall_burst: u32,
        pub pad: u32,
        // Security groups.
        /// The kernel conntrack zone of the switch's connections.
        pub ct_zone: u16,
        pub pad_ct: u16,
        /// The class set the class tries are read in: the daemon writes a new set and then
        /// switches to it with the generation.
        pub acl_set: u32,
        /// The core's connection timeouts (ms), by `(TCP ? 4 : 0) | (replied ? 2 : 0) |
        /// (closing ? 1 : 0)`: what a commit and each frame of a connection set.
        pub ct_timeouts: [u32; 8],
    }

    // Meters (storm control, rate limits): token buckets the daemon sets and the program
    // runs, in `sluice_meters` by `slot * METERS_PER_SLOT + METER_*`.

    /// Meters per port slot in `sluice_meters`.
    pub const METERS_PER_SLOT: u32 = 4 => SLUICE_METERS_PER_SLOT;
    /// A slot's meter of broadcast frames from it (frames).
    pub const METER_STORM_BC: u32 = 0 => METER_STORM_BC;
    /// A slot's meter of multicast frames from it (frames).
    pub const METER_STORM_MC: u32 = 1 => METER_STORM_MC;
    /// A slot's meter of what it sends into the switch (`rate_in`; bytes).
    pub const METER_RATE_IN: u32 = 2 => METER_RATE_IN;

    /// A token bucket kept as the generic cell rate algorithm (crates/switch/src/meter.rs
    /// has the same arithmetic): a frame of `n` units passes when `max(tat, now) - now +
    /// n × unit_ps / 1000 <= burst_ns`, moving `tat` on by its cost.
    pub struct Meter => sluice_meter {
        /// Picoseconds a unit costs (a frame, a byte); 0: no limit.
        pub unit_ps: u64,
        /// How many nanoseconds of units may pass at once.
        pub burst_ns: u64,
        /// The program's: `bpf_ktime_get_ns()` time the next unit is due at.
        pub tat: u64,
    }

    /// [`Admit::mask`]: IGMP/MLD snooping: read a group frame's IP group class
    /// ([`FlowKey::group`]).
    pub const X_GROUP: u16 = 1 << 7 => X_GROUP;
    /// An EVPN tunnel's input: routes say where its stations are, so a source the station
    /// table has neither behind the input nor configured (`SRC_STATIC`) is
    /// `SRC_UNLEARNABLE` (the core's `Station::Unlearnable`), never `SRC_ELSEWHERE` or
    /// `SRC_ABSENT`.
    pub const X_ROUTED: u16 = 1 << 8 => X_ROUTED;
    /// A port whose address resolution the core reads (EVPN's suppression): read an IPv6
    /// frame's neighbour-discovery facts, as `X_L3` does ([`FlowKey::proto`],
    /// [`FlowKey::icmp6_type`], `L3X_HOP255`).
    pub const X_ND: u16 = 1 << 9 => X_ND;
    /// [`FlowKey::group`]: not a group the switch snoops (not IP, broadcast, a link-local
    /// group).
    pub const GCLASS_FLOODED: u32 = 0 => GCLASS_FLOODED;
    /// An IGMP or MLD message.
    pub const GCLASS_CONTROL: u32 = 1 => GCLASS_CONTROL;
    /// A snooped group not in `sluice_mdb`.
    pub const GCLASS_UNREGISTERED: u32 = 2 => GCLASS_UNREGISTERED;
    /// Port set ids in `sluice_mdb` start here.
    pub const GCLASS_FIRST_SET: u32 = 16 => GCLASS_FIRST_SET;

    /// IGMP/MLD snooping: a registered group, in `sluice_mdb`; the value is its port set
    /// id (at least `GCLASS_FIRST_SET`).
    pub struct MdbKey => sluice_mdb_key {
        /// The VLAN.
        pub vlan: u16,
        /// 4 or 6
        pub family: u8,
        pub pad: u8,
        /// IPv4 in the first 4 bytes.
        pub addr: [u8; 16],
    }

    /// A key of `sluice_group_prefixes` (LPM, core-written): which multicast destinations
    /// are snooped. IPv4 as IPv4-mapped IPv6 (::ffff:0:0/96).
    pub struct GroupPrefixKey => sluice_group_prefix_key {
        /// The prefix's length (IPv4: 96 + its length).
        pub prefixlen: u32,
        /// The address.
        pub addr: [u8; 16],
    }
    /// `sluice_group_prefixes`' value: multicast never snooped (flooded).
    pub const GPFX_FLOODED: u32 = 1 => GPFX_FLOODED;
    /// Multicast whose memberships decide (`sluice_mdb`).
    pub const GPFX_SNOOPED: u32 = 2 => GPFX_SNOOPED;
    /// `sluice_group_control` (an array, core-written): nonzero at an IPv4 protocol, or at
    /// `GCONTROL_ICMP6` + an ICMPv6 type, whose group frames are the core's to read.
    pub const GCONTROL_ICMP6: u32 = 256 => GCONTROL_ICMP6;
}

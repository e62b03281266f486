//! The maps' layouts, as `bpf/abi.h` defines them for the programs. Every struct here is
//! `#[repr(C)]` with the header's field order and sizes; the tests compare sizes with the
//! header's through the compiled object's BTF.

use aya::Pod;

/// Port slots in the maps.
pub const MAX_PORTS: u32 = 1024;
/// Source addresses per family a port's entry holds; a port with more goes slow.
pub const MAX_IPS: usize = 8;

/// `PF_KERNEL`: the kernel reaches the port.
pub const PF_KERNEL: u32 = 1 << 0;
/// `PF_UPLINK`: leads to the LAN.
pub const PF_UPLINK: u32 = 1 << 1;
/// `PF_ISOLATED`: exchanges frames with uplinks only.
pub const PF_ISOLATED: u32 = 1 << 2;
/// `PF_MAC`: only `mac` may be a source.
pub const PF_MAC: u32 = 1 << 3;
/// `PF_IPS`: source IP addresses are checked.
pub const PF_IPS: u32 = 1 << 4;
/// `PF_UP_V4`: IPv4 and ARP frames go up.
pub const PF_UP_V4: u32 = 1 << 5;
/// `PF_UP_V6`: IPv6 frames go up.
pub const PF_UP_V6: u32 = 1 << 6;
/// `PF_SLOW`: every frame from or to the port goes up.
pub const PF_SLOW: u32 = 1 << 7;
/// `PF_TRUNK`: trunk mode.
pub const PF_TRUNK: u32 = 1 << 8;
/// `PF_OWN_MAC`: `own_mac` is set, frames to it pass to the host (Layer 2).
pub const PF_OWN_MAC: u32 = 1 << 9;
/// `PF_GUEST_MAC`: Layer 3, `guest_mac` is known.
pub const PF_GUEST_MAC: u32 = 1 << 10;
/// `PF_LL_OK`: IPv6 link-local sources pass the IP check.
pub const PF_LL_OK: u32 = 1 << 11;
/// `PF_EGRESS`: sent with `bpf_redirect`, though not an uplink (a veth whose peer is in the
/// switch's own namespace, which `bpf_redirect_peer` cannot reach).
pub const PF_EGRESS: u32 = 1 << 12;
/// `PF_LEARN_FULL`: Layer 2, as many stations learned behind the port as it may; frames
/// from others are forwarded or flooded by the kernel without being learned.
pub const PF_LEARN_FULL: u32 = 1 << 13;

/// `PF_TUNNEL`: a VXLAN device in external mode; frames to it carry a tunnel key.
pub const PF_TUNNEL: u32 = 1 << 14;

/// `SLUICE_MARK`: the `skb->mark` of the frames the switch itself sends into a guest's
/// veth (the program's clones and egress redirects, the daemon's packet sockets through
/// `SO_MARK`); the egress program refuses every other frame there.
pub const SLUICE_MARK: u32 = 0x51ce_0001;

/// `TUN_V6`: the tunnel's underlay is IPv6.
pub const TUN_V6: u32 = 1 << 0;
/// `TUN_PER_VLAN`: a VNI per VLAN (`sluice_vnis`); else every frame in `Tunnel::vni`.
pub const TUN_PER_VLAN: u32 = 1 << 1;
/// `TUN_REMOTES_ONLY`: datagrams only from the endpoints in `sluice_endpoints`.
pub const TUN_REMOTES_ONLY: u32 = 1 << 2;
/// `VNI_IN`: marks a [`VniKey`] whose `id` is a VNI (its value: the VLAN).
pub const VNI_IN: u32 = 1 << 31;
/// `TUN_TAG`: a VNI's frames get the tag of the VLAN in the value's low 12 bits.
pub const TUN_TAG: u32 = 1 << 16;

/// `MODE_L2`.
pub const MODE_L2: u8 = 0;
/// `MODE_L3`.
pub const MODE_L3: u8 = 1;

/// `struct sluice_port`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Port {
    pub ifindex: u32,
    pub flags: u32,
    pub mtu: u16,
    pub access_vid: u16,
    pub native_vid: u16,
    pub n_ip4: u8,
    pub n_ip6: u8,
    pub mac: [u8; 6],
    pub pad: [u8; 2],
    pub own_mac: [u8; 6],
    pub pad2: [u8; 2],
    pub guest_mac: [u8; 6],
    pub pad3: [u8; 2],
    pub mirror: u32,
    pub pad4: u32,
    pub ip4: [[u8; 4]; MAX_IPS],
    pub ip6: [[u8; 16]; MAX_IPS],
    pub allowed: [u64; 64],
}

impl Default for Port {
    fn default() -> Self {
        Port {
            ifindex: 0,
            flags: 0,
            mtu: 0,
            access_vid: 0,
            native_vid: 0,
            n_ip4: 0,
            n_ip6: 0,
            mac: [0; 6],
            pad: [0; 2],
            own_mac: [0; 6],
            pad2: [0; 2],
            guest_mac: [0; 6],
            pad3: [0; 2],
            mirror: 0,
            pad4: 0,
            ip4: [[0; 4]; MAX_IPS],
            ip6: [[0; 16]; MAX_IPS],
            allowed: [0; 64],
        }
    }
}

/// `struct sluice_fib_key`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct FibKey {
    pub vlan: u16,
    pub mac: [u8; 6],
}

/// `FIB_STATIC`.
pub const FIB_STATIC: u32 = 1;

/// `struct sluice_fib_val`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct FibVal {
    pub slot: u32,
    pub flags: u32,
    pub seen_ns: u64,
}

/// `struct sluice_config`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Config {
    pub upcall_ifindex: u32,
    pub l3_uplink: u32,
    pub mode: u8,
    pub router_mac: [u8; 6],
    pub pad: u8,
    pub n_slots: u32,
}

/// `struct sluice_ip_key`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct IpKey {
    pub family: u8,
    pub pad: [u8; 3],
    pub addr: [u8; 16],
}

/// `struct sluice_neigh_key`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct NeighKey {
    pub vlan: u16,
    pub family: u8,
    pub pad: u8,
    pub addr: [u8; 16],
}

/// `struct sluice_neigh_val`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct NeighVal {
    pub mac: [u8; 6],
    pub pad: [u8; 2],
}

/// `struct sluice_tunnel`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Tunnel {
    pub flags: u32,
    pub ttl: u8,
    pub pad: [u8; 3],
    pub vni: u32,
    pub pad2: u32,
    pub local: [u8; 16],
}

/// `struct sluice_vni_key`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct VniKey {
    pub ifindex: u32,
    pub id: u32,
}

/// `struct sluice_endpoint_key`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct EndpointKey {
    pub ifindex: u32,
    pub addr: [u8; 16],
}

/// `struct sluice_remote_key`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct RemoteKey {
    pub ifindex: u32,
    pub vni: u32,
    pub mac: [u8; 6],
    pub pad: [u8; 2],
}

/// `struct sluice_remote`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Remote {
    pub addr: [u8; 16],
    pub seen_ns: u64,
}

/// Indexes into [`Counters::v`] (`C_*` in the header).
pub mod c {
    pub const RX_FRAMES: usize = 0;
    pub const RX_BYTES: usize = 1;
    pub const RX_GSO: usize = 2;
    pub const FORWARDED: usize = 3;
    pub const COPIES: usize = 4;
    pub const UPCALLS: usize = 5;
    pub const TX_OFFERED: usize = 6;
    pub const TX_FRAMES: usize = 7;
    pub const TX_BYTES: usize = 8;
    pub const TX_GSO: usize = 9;
    /// Receive drops start here, one per `DropCause::ALL` entry.
    pub const RX_DROP: usize = 10;
    /// Transmit drops start here, one per `DropCause::ALL` entry.
    pub const TX_DROP: usize = 28;
    /// Frames the kernel flooded.
    pub const FLOODED: usize = 46;
    /// Frames the kernel forwarded or flooded from a source the port may not learn.
    pub const LEARN_REFUSED: usize = 47;
    /// Datagrams from a tunnel refused (no key, a VNI the port does not carry).
    pub const TUN_BAD: usize = 48;
    pub const COUNT: usize = 49;
}

/// `struct sluice_counters`: one port's counters on one CPU.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Counters {
    pub v: [u64; c::COUNT],
}

impl Default for Counters {
    fn default() -> Self {
        Counters { v: [0; c::COUNT] }
    }
}

/// Indexes into [`SwitchCounters::v`] (`S_*` in the header).
pub mod s {
    /// Frames others sent out of the upcall TAP (a socket bound to it, the kernel's own),
    /// dropped at its egress.
    pub const UPCALL_EGRESS_REFUSED: usize = 0;
    pub const COUNT: usize = 1;
}

/// `struct sluice_switch_counters`: the switch's own counters on one CPU.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct SwitchCounters {
    pub v: [u64; s::COUNT],
}

// SAFETY: plain `#[repr(C)]` integers and byte arrays, no padding the kernel does not
// also see (every struct's size is a multiple of its alignment, checked in the tests).
unsafe impl Pod for Port {}
// SAFETY: as above.
unsafe impl Pod for FibKey {}
// SAFETY: as above.
unsafe impl Pod for FibVal {}
// SAFETY: as above.
unsafe impl Pod for Config {}
// SAFETY: as above.
unsafe impl Pod for Counters {}
// SAFETY: as above.
unsafe impl Pod for SwitchCounters {}
// SAFETY: as above.
unsafe impl Pod for IpKey {}
// SAFETY: as above.
unsafe impl Pod for NeighKey {}
// SAFETY: as above.
unsafe impl Pod for NeighVal {}
// SAFETY: as above.
unsafe impl Pod for Tunnel {}
// SAFETY: as above.
unsafe impl Pod for VniKey {}
// SAFETY: as above.
unsafe impl Pod for RemoteKey {}
// SAFETY: as above.
unsafe impl Pod for EndpointKey {}
// SAFETY: as above.
unsafe impl Pod for Remote {}

#[cfg(all(test, sluice_abi_check))]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    /// The layouts the host's C compiler gives `bpf/abi.h` (build.rs runs
    /// `bpf/abi_check.c`); BPF's layout rules for these fixed-width types are the same.
    mod from_c {
        #![allow(dead_code, non_upper_case_globals)]
        include!(concat!(env!("OUT_DIR"), "/abi_layouts.rs"));
    }

    #[test]
    fn the_rust_mirrors_have_the_headers_layouts() {
        use from_c::*;
        assert_eq!(size_of::<Port>(), SIZE_sluice_port);
        assert_eq!(offset_of!(Port, ifindex), OFF_sluice_port_ifindex);
        assert_eq!(offset_of!(Port, flags), OFF_sluice_port_flags);
        assert_eq!(offset_of!(Port, mtu), OFF_sluice_port_mtu);
        assert_eq!(offset_of!(Port, access_vid), OFF_sluice_port_access_vid);
        assert_eq!(offset_of!(Port, native_vid), OFF_sluice_port_native_vid);
        assert_eq!(offset_of!(Port, n_ip4), OFF_sluice_port_n_ip4);
        assert_eq!(offset_of!(Port, n_ip6), OFF_sluice_port_n_ip6);
        assert_eq!(offset_of!(Port, mac), OFF_sluice_port_mac);
        assert_eq!(offset_of!(Port, own_mac), OFF_sluice_port_own_mac);
        assert_eq!(offset_of!(Port, guest_mac), OFF_sluice_port_guest_mac);
        assert_eq!(offset_of!(Port, mirror), OFF_sluice_port_mirror);
        assert_eq!(offset_of!(Config, l3_uplink), OFF_sluice_config_l3_uplink);
        assert_eq!(offset_of!(Config, mode), OFF_sluice_config_mode);
        assert_eq!(offset_of!(Config, router_mac), OFF_sluice_config_router_mac);
        assert_eq!(offset_of!(Config, n_slots), OFF_sluice_config_n_slots);
        assert_eq!(size_of::<IpKey>(), SIZE_sluice_ip_key);
        assert_eq!(offset_of!(IpKey, addr), OFF_sluice_ip_key_addr);
        assert_eq!(size_of::<NeighKey>(), SIZE_sluice_neigh_key);
        assert_eq!(offset_of!(NeighKey, family), OFF_sluice_neigh_key_family);
        assert_eq!(offset_of!(NeighKey, addr), OFF_sluice_neigh_key_addr);
        assert_eq!(size_of::<NeighVal>(), SIZE_sluice_neigh_val);
        assert_eq!(offset_of!(Port, ip4), OFF_sluice_port_ip4);
        assert_eq!(offset_of!(Port, ip6), OFF_sluice_port_ip6);
        assert_eq!(offset_of!(Port, allowed), OFF_sluice_port_allowed);
        assert_eq!(size_of::<FibKey>(), SIZE_sluice_fib_key);
        assert_eq!(offset_of!(FibKey, mac), OFF_sluice_fib_key_mac);
        assert_eq!(size_of::<FibVal>(), SIZE_sluice_fib_val);
        assert_eq!(offset_of!(FibVal, flags), OFF_sluice_fib_val_flags);
        assert_eq!(offset_of!(FibVal, seen_ns), OFF_sluice_fib_val_seen_ns);
        assert_eq!(size_of::<Config>(), SIZE_sluice_config);
        assert_eq!(size_of::<Counters>(), SIZE_sluice_counters);
        assert_eq!(size_of::<SwitchCounters>(), SIZE_sluice_switch_counters);
        assert_eq!((s::UPCALL_EGRESS_REFUSED, s::COUNT), (S_UPCALL_EGRESS_REFUSED, S_COUNT));
        assert_eq!(size_of::<Tunnel>(), SIZE_sluice_tunnel);
        assert_eq!(offset_of!(Tunnel, ttl), OFF_sluice_tunnel_ttl);
        assert_eq!(offset_of!(Tunnel, vni), OFF_sluice_tunnel_vni);
        assert_eq!(offset_of!(Tunnel, local), OFF_sluice_tunnel_local);
        assert_eq!(size_of::<VniKey>(), SIZE_sluice_vni_key);
        assert_eq!(size_of::<RemoteKey>(), SIZE_sluice_remote_key);
        assert_eq!(offset_of!(RemoteKey, mac), OFF_sluice_remote_key_mac);
        assert_eq!(size_of::<Remote>(), SIZE_sluice_remote);
        assert_eq!(offset_of!(Remote, seen_ns), OFF_sluice_remote_seen_ns);
        assert_eq!(
            (c::TUN_BAD, PF_TUNNEL, TUN_V6, TUN_PER_VLAN, TUN_TAG, VNI_IN),
            (C_TUN_BAD, from_c::PF_TUNNEL, from_c::TUN_V6, from_c::TUN_PER_VLAN, from_c::TUN_TAG, from_c::VNI_IN)
        );
        assert_eq!(size_of::<EndpointKey>(), SIZE_sluice_endpoint_key);
        assert_eq!(offset_of!(EndpointKey, addr), OFF_sluice_endpoint_key_addr);
        assert_eq!((TUN_REMOTES_ONLY, SLUICE_MARK), (from_c::TUN_REMOTES_ONLY, from_c::SLUICE_MARK));
        assert_eq!(
            (c::COUNT, c::RX_DROP, c::TX_DROP, c::UPCALLS, c::TX_GSO, c::FLOODED, c::LEARN_REFUSED),
            (C_COUNT, C_RX_DROP, C_TX_DROP, C_UPCALLS, C_TX_GSO, C_FLOODED, C_LEARN_REFUSED)
        );
        assert_eq!(
            (PF_TRUNK, PF_SLOW, PF_EGRESS, PF_LEARN_FULL, MAX_PORTS, MAX_IPS),
            (
                from_c::PF_TRUNK,
                from_c::PF_SLOW,
                from_c::PF_EGRESS,
                from_c::PF_LEARN_FULL,
                from_c::MAX_PORTS,
                from_c::MAX_IPS
            )
        );
        assert_eq!(
            (sluice_switch::MIN_GSO_SIZE, sluice_switch::MAX_GSO_SEGMENTS),
            (from_c::MIN_GSO_SIZE, from_c::MAX_GSO_SEGMENTS),
            "the program bounds GSO frames as the core does"
        );
        // Drop causes are indexed in `DropCause::ALL` order, and must fit their rows.
        let all = sluice_switch::DropCause::ALL;
        assert!(all.len() <= c::TX_DROP - c::RX_DROP && all.len() <= c::FLOODED - c::TX_DROP);
        for (cause, at) in [
            (sluice_switch::DropCause::Malformed, D_MALFORMED),
            (sluice_switch::DropCause::VlanFilter, D_VLAN_FILTER),
            (sluice_switch::DropCause::OverMtu, D_OVER_MTU),
            (sluice_switch::DropCause::UnknownPort, D_UNKNOWN_PORT),
            (sluice_switch::DropCause::SamePort, D_SAME_PORT),
            (sluice_switch::DropCause::TxError, D_TX_ERROR),
            (sluice_switch::DropCause::Isolated, D_ISOLATED),
            (sluice_switch::DropCause::SpoofedMac, D_SPOOFED_MAC),
            (sluice_switch::DropCause::SpoofedIp, D_SPOOFED_IP),
            (sluice_switch::DropCause::NotIp, D_NOT_IP),
            (sluice_switch::DropCause::NoRoute, D_NO_ROUTE),
            (sluice_switch::DropCause::UpcallLost, D_UPCALL_LOST),
            (sluice_switch::DropCause::GsoLimit, D_GSO_LIMIT),
            (sluice_switch::DropCause::UnknownEndpoint, D_UNKNOWN_ENDPOINT),
            (sluice_switch::DropCause::EgressRefused, D_EGRESS_REFUSED),
        ] {
            assert_eq!(all.iter().position(|&c| c == cause), Some(at), "{cause:?}");
        }
    }
}

//! The core's decisions as map entries: a [`FastPort`] as a `sluice_port`, a MAC entry as
//! a `sluice_fib` key and value. Pure; the loader writes what these return.

use std::net::IpAddr;

use sluice_switch::{FastPort, IpRule, VlanMode};
use sluice_wire::MacAddr;

use crate::abi::{self, FibKey, FibVal};

/// Port `p`'s entry on a switch in mode `mode` ([`abi::MODE_L2`] or [`abi::MODE_L3`]), its
/// mirror (if any) in slot `mirror`. Reachable by the kernel only if it has an interface
/// (`ifindex`, which the kernel side of the port gives as its [`FastPort::target`]).
pub fn port_entry(p: &FastPort, mode: u8, mirror: Option<u32>) -> abi::Port {
    let mut e = abi::Port { mtu: p.mtu, ..abi::Port::default() };
    let mut flags = 0;
    if let Some(ifindex) = p.target {
        e.ifindex = ifindex;
        flags |= abi::PF_KERNEL;
    } else {
        // A port in user space still needs a live slot: frames to it go up.
        e.ifindex = u32::MAX;
    }
    if p.uplink {
        flags |= abi::PF_UPLINK;
    }
    if p.isolated {
        flags |= abi::PF_ISOLATED;
    }
    if let Some(m) = p.mac {
        flags |= abi::PF_MAC;
        e.mac = m.0;
    }
    if p.slow {
        flags |= abi::PF_SLOW;
    }
    if p.learn_full {
        flags |= abi::PF_LEARN_FULL;
    }
    if let Some(m) = p.dev_mac {
        // Layer 2: frames to the device's address are the host's. Layer 3: the address is
        // the switch's on the LAN (frames out of the uplink leave from it).
        if mode == abi::MODE_L2 {
            flags |= abi::PF_OWN_MAC;
        }
        e.own_mac = m.0;
    }
    if let Some(m) = p.guest_mac {
        flags |= abi::PF_GUEST_MAC;
        e.guest_mac = m.0;
    }
    if p.link_local_ok {
        flags |= abi::PF_LL_OK;
    }
    e.mirror = mirror.map_or(0, |s| s + 1);
    match &p.vlan {
        VlanMode::Access(v) => e.access_vid = *v,
        VlanMode::Trunk { allowed, native } => {
            flags |= abi::PF_TRUNK;
            e.native_vid = native.unwrap_or(0);
            for v in allowed.iter() {
                e.allowed[usize::from(v >> 6)] |= 1 << (v & 63);
            }
        }
    }
    if let IpRule::Only { v4, v6 } = &p.ips {
        flags |= abi::PF_IPS;
        match v4 {
            None => flags |= abi::PF_UP_V4,
            Some(l) if l.len() > abi::MAX_IPS => flags |= abi::PF_UP_V4,
            Some(l) => {
                for (i, a) in l.iter().enumerate() {
                    if let IpAddr::V4(a) = a {
                        e.ip4[i] = u32::from_ne_bytes(a.octets());
                    }
                }
                e.n_ip4 = l.len() as u8;
            }
        }
        match v6 {
            None => flags |= abi::PF_UP_V6,
            Some(l) if l.len() > abi::MAX_IPS => flags |= abi::PF_UP_V6,
            Some(l) => {
                for (i, a) in l.iter().enumerate() {
                    if let IpAddr::V6(a) = a {
                        e.ip6[i] = a.octets();
                    }
                }
                e.n_ip6 = l.len() as u8;
            }
        }
    }
    e.flags = flags;
    e
}

/// The owners map's key of `ip`.
pub fn ip_key(ip: IpAddr) -> abi::IpKey {
    let mut k = abi::IpKey::default();
    match ip {
        IpAddr::V4(a) => {
            k.family = 4;
            k.addr[..4].copy_from_slice(&a.octets());
        }
        IpAddr::V6(a) => {
            k.family = 6;
            k.addr = a.octets();
        }
    }
    k
}

/// The address a key holds.
pub fn key_ip(family: u8, addr: &[u8; 16]) -> Option<IpAddr> {
    match family {
        4 => Some(IpAddr::from([addr[0], addr[1], addr[2], addr[3]])),
        6 => Some(IpAddr::from(*addr)),
        _ => None,
    }
}

/// The neighbour map's key of `ip` on `vlan`.
pub fn neigh_key(vlan: u16, ip: IpAddr) -> abi::NeighKey {
    let k = ip_key(ip);
    abi::NeighKey { vlan, family: k.family, pad: 0, addr: k.addr }
}

/// The endpoints map's key of endpoint `ip` of the tunnel on device `ifindex` (IPv4 in
/// the first 4 bytes, as the program writes a tunnel key's remote).
pub fn endpoint_key(ifindex: u32, ip: IpAddr) -> abi::EndpointKey {
    abi::EndpointKey { ifindex, addr: ip_key(ip).addr }
}

/// The key of `mac` on `vlan`.
pub fn fib_key(vlan: u16, mac: MacAddr) -> FibKey {
    FibKey { vlan, mac: mac.0 }
}

/// The value for an entry behind port slot `slot`.
pub fn fib_val(slot: u32, is_static: bool) -> FibVal {
    FibVal { slot, flags: if is_static { abi::FIB_STATIC } else { 0 }, seen_ns: 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> FastPort {
        FastPort {
            target: Some(7),
            vlan: VlanMode::Access(10),
            mtu: 1500,
            isolated: false,
            uplink: false,
            mac: None,
            ips: IpRule::Any,
            slow: false,
            failed: false,
            dev_mac: None,
            guest_mac: None,
            link_local_ok: false,
            mirror: None,
            learn_full: false,
        }
    }

    #[test]
    fn an_access_port_in_the_kernel() {
        let e = port_entry(&base(), abi::MODE_L2, None);
        assert_eq!((e.ifindex, e.flags, e.access_vid, e.mtu), (7, abi::PF_KERNEL, 10, 1500));
    }

    #[test]
    fn a_trunk_carries_its_allowed_set_as_bits() {
        let p = FastPort {
            vlan: VlanMode::Trunk { allowed: [1u16, 64, 4094].into_iter().collect(), native: Some(5) },
            ..base()
        };
        let e = port_entry(&p, abi::MODE_L2, None);
        assert_ne!(e.flags & abi::PF_TRUNK, 0);
        assert_eq!(e.native_vid, 5);
        assert_eq!(e.allowed[0], 1 << 1);
        assert_eq!(e.allowed[1], 1);
        assert_eq!(e.allowed[63], 1 << 62);
    }

    #[test]
    fn addresses_not_learned_yet_or_too_many_go_up() {
        let many: Vec<IpAddr> = (1..=9).map(|i| IpAddr::from([10, 0, 0, i])).collect();
        let p = FastPort { ips: IpRule::Only { v4: Some(many), v6: None }, ..base() };
        let e = port_entry(&p, abi::MODE_L2, None);
        assert_eq!(
            e.flags & (abi::PF_IPS | abi::PF_UP_V4 | abi::PF_UP_V6),
            abi::PF_IPS | abi::PF_UP_V4 | abi::PF_UP_V6
        );
        let p =
            FastPort { ips: IpRule::Only { v4: Some(vec![IpAddr::from([10, 0, 0, 1])]), v6: Some(vec![]) }, ..base() };
        let e = port_entry(&p, abi::MODE_L2, None);
        assert_eq!(e.flags & (abi::PF_UP_V4 | abi::PF_UP_V6), 0);
        assert_eq!((e.n_ip4, e.ip4[0].to_ne_bytes(), e.n_ip6), (1, [10, 0, 0, 1], 0));
    }

    #[test]
    fn an_uplinks_address_is_the_hosts_in_layer_2_and_the_switchs_in_layer_3() {
        let p = FastPort { uplink: true, dev_mac: Some(MacAddr([2, 0, 0, 0, 0, 9])), ..base() };
        let l2 = port_entry(&p, abi::MODE_L2, None);
        let l3 = port_entry(&p, abi::MODE_L3, None);
        assert_ne!(l2.flags & abi::PF_OWN_MAC, 0);
        assert_eq!(l3.flags & abi::PF_OWN_MAC, 0);
        assert_eq!(l3.own_mac, [2, 0, 0, 0, 0, 9]);
    }

    #[test]
    fn addresses_key_by_family() {
        let k = ip_key(IpAddr::from([10, 0, 0, 1]));
        assert_eq!((k.family, &k.addr[..5]), (4, &[10, 0, 0, 1, 0][..]));
        assert_eq!(neigh_key(7, "fd00::1".parse().unwrap()).family, 6);
    }

    #[test]
    fn a_port_in_user_space_is_live_but_not_the_kernels() {
        let e = port_entry(&FastPort { target: None, ..base() }, abi::MODE_L2, None);
        assert_eq!(e.flags & abi::PF_KERNEL, 0);
        assert_ne!(e.ifindex, 0);
    }
}

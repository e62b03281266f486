//! The maps' keys and values of addresses and stations: an IP address as an owner's or
//! neighbour's key, a tunnel's endpoint, a MAC table key and value. Pure.

use std::net::IpAddr;

use sluice_wire::MacAddr;

use crate::abi::{self, FibKey, FibVal};

/// Ports `first..=last` as the fewest prefixes (a port, and how many of its 16 bits are
/// fixed), for a longest-prefix-match table.
pub fn port_prefixes(first: u16, last: u16) -> Vec<(u16, u8)> {
    let mut out = Vec::new();
    let (mut at, end) = (u32::from(first), u32::from(last));
    while at <= end {
        // The largest aligned block starting at `at` that stays within the range.
        let mut size = if at == 0 { 1 << 16 } else { 1u32 << at.trailing_zeros().min(16) };
        while at + size - 1 > end {
            size >>= 1;
        }
        out.push((at as u16, 16 - size.trailing_zeros() as u8));
        at += size;
    }
    out
}

/// `sluice_mdb`'s key of group `ip` in `vlan`.
pub fn mdb_key(vlan: u16, ip: IpAddr) -> abi::MdbKey {
    let k = ip_key(ip);
    abi::MdbKey { vlan, family: k.family, pad: 0, addr: k.addr }
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

    #[test]
    fn port_ranges_become_the_fewest_prefixes_that_cover_them_exactly() {
        assert_eq!(port_prefixes(0, u16::MAX), vec![(0, 0)]);
        assert_eq!(port_prefixes(80, 80), vec![(80, 16)]);
        assert_eq!(port_prefixes(1024, 2047), vec![(1024, 6)]);
        assert_eq!(port_prefixes(1, 3), vec![(1, 16), (2, 15)]);
        assert_eq!(port_prefixes(65535, 65535), vec![(65535, 16)]);
        // Every port of a range in exactly one prefix, none outside it.
        for (a, b) in [(0u16, 21u16), (22, 22), (23, 1023), (1000, 60000), (3, 65535)] {
            let ps = port_prefixes(a, b);
            for p in (0..=u16::MAX).step_by(7).chain([a, b]) {
                let n = ps.iter().filter(|&&(q, l)| l == 0 || (p ^ q) >> (16 - l) == 0).count();
                assert_eq!(n, usize::from((a..=b).contains(&p)), "{p} in {a}-{b}: {ps:?}");
            }
        }
    }

    #[test]
    fn addresses_key_by_family() {
        for ip in ["10.1.2.3", "fd00::7"] {
            let ip: IpAddr = ip.parse().unwrap();
            let k = ip_key(ip);
            assert_eq!(key_ip(k.family, &k.addr), Some(ip));
        }
        assert_eq!(key_ip(5, &[0; 16]), None);
    }
}

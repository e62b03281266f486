//! Layer 3 mode's tables: which port owns which IP address, the LAN neighbours learned on
//! the uplink, and frames waiting for an address to be resolved.
//!
//! The switch consults these; the frames themselves are read and written by
//! `sluice_wire::neigh`. Times are the driver's milliseconds, as for the MAC table.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::net::IpAddr;

use sluice_wire::MacAddr;

use crate::ids::PortId;

/// Frames that may wait for address resolution at once, switch-wide. A frame that finds
/// the list full is dropped (`unresolved`), as is one still waiting after
/// [`RESOLVE_MS`].
pub const MAX_PENDING: usize = 64;

/// How long a frame waits for its next hop's address (ms).
pub const RESOLVE_MS: u64 = 3000;

/// How often one address is asked for while frames wait for it (ms).
pub const RESOLVE_RETRY_MS: u64 = 1000;

/// How a switch forwards.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Mode {
    /// Ports known by MAC address; any EtherType passes.
    #[default]
    L2,
    /// Ports known by IP address; the switch answers ARP and neighbour solicitations,
    /// forwards IPv4 and IPv6 by destination address and rewrites MAC addresses; other
    /// EtherTypes are dropped (`not_ip`).
    L3,
}

/// A frame waiting for the MAC address of its next hop.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Pending {
    pub from: PortId,
    pub out: PortId,
    pub ip: IpAddr,
    pub fid: u32,
    pub since_ms: u64,
}

/// An address as a table key, hashed in one write (an IPv4 address as a word with a
/// mark, an IPv6 address as one 128-bit write) rather than an enum's tag and then its
/// address: the table's hash is the standard library's, keyed at random against chosen
/// collisions, and pays per write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct AddrKey(IpAddr);

impl Hash for AddrKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        match self.0 {
            IpAddr::V4(a) => state.write_u64(u64::from(a.to_bits()) | 1 << 32),
            IpAddr::V6(a) => state.write_u128(a.to_bits()),
        }
    }
}

/// One learned LAN neighbour.
#[derive(Clone, Copy, Debug)]
struct Neighbour {
    mac: MacAddr,
    seen_ms: u64,
}

/// The state behind Layer 3 forwarding.
pub(crate) struct L3Tables {
    /// IP address → the guest port that owns it (configured or learned, then locked).
    /// Changed only through [`L3Tables::own`] and [`L3Tables::disown_port`], which keep the
    /// change log.
    owners: HashMap<AddrKey, PortId>,
    /// (VLAN, IP) → MAC address of a host on the uplink's side.
    neigh: HashMap<(u16, IpAddr), Neighbour>,
    neigh_max: usize,
    /// Frames waiting for resolution, oldest first.
    pub pending: Vec<Pending>,
    /// Owners and neighbours that changed since the last take, when a kernel datapath
    /// follows the tables.
    pub changed_owners: Option<Vec<IpAddr>>,
    pub changed_neigh: Option<Vec<(u16, IpAddr)>>,
}

impl L3Tables {
    pub fn new(neigh_max: usize) -> Self {
        L3Tables {
            owners: HashMap::new(),
            neigh: HashMap::with_capacity(neigh_max.min(1024)),
            neigh_max,
            pending: Vec::with_capacity(MAX_PENDING),
            changed_owners: None,
            changed_neigh: None,
        }
    }

    /// The port that owns `ip`, if any.
    pub fn owner(&self, ip: IpAddr) -> Option<PortId> {
        self.owners.get(&AddrKey(ip)).copied()
    }

    /// Every address a port owns, with the port.
    pub fn owners(&self) -> impl Iterator<Item = (IpAddr, PortId)> + '_ {
        self.owners.iter().map(|(k, &p)| (k.0, p))
    }

    /// Makes `ip` port `port`'s.
    pub fn own(&mut self, ip: IpAddr, port: PortId) {
        self.owners.insert(AddrKey(ip), port);
        if let Some(c) = self.changed_owners.as_mut() {
            c.push(ip);
        }
    }

    /// Forgets every address port `port` owned.
    pub fn disown_port(&mut self, port: PortId) {
        let changed = &mut self.changed_owners;
        self.owners.retain(|ip, p| {
            let keep = *p != port;
            if !keep && let Some(c) = changed.as_mut() {
                c.push(ip.0);
            }
            keep
        });
    }

    /// The MAC address of `ip` on `vlan` as the table holds it, aged or not (aged entries
    /// go at the next [`L3Tables::expire`]).
    pub fn neighbour(&self, vlan: u16, ip: IpAddr) -> Option<MacAddr> {
        self.neigh.get(&(vlan, ip)).map(|n| n.mac)
    }

    fn note_neigh(&mut self, vlan: u16, ip: IpAddr) {
        if let Some(c) = self.changed_neigh.as_mut() {
            c.push((vlan, ip));
        }
    }

    /// Records that `ip` on `vlan` is at `mac`, as the uplink's side said. A full table
    /// learns nothing new.
    pub fn learn(&mut self, vlan: u16, ip: IpAddr, mac: MacAddr, now_ms: u64) {
        if mac.is_multicast() || mac.is_zero() {
            return;
        }
        let full = self.neigh.len() >= self.neigh_max;
        match self.neigh.get_mut(&(vlan, ip)) {
            Some(n) => {
                let moved = n.mac != mac;
                *n = Neighbour { mac, seen_ms: now_ms };
                if moved {
                    self.note_neigh(vlan, ip);
                }
            }
            None if full => {}
            None => {
                self.neigh.insert((vlan, ip), Neighbour { mac, seen_ms: now_ms });
                self.note_neigh(vlan, ip);
            }
        }
    }

    /// The MAC address of `ip` on `vlan`, if learned within `aging_ms`.
    pub fn lookup(&self, vlan: u16, ip: IpAddr, now_ms: u64, aging_ms: u64) -> Option<MacAddr> {
        let n = self.neigh.get(&(vlan, ip))?;
        (now_ms.saturating_sub(n.seen_ms) <= aging_ms).then_some(n.mac)
    }

    /// Forgets neighbours not heard from within `aging_ms`.
    pub fn expire(&mut self, now_ms: u64, aging_ms: u64) {
        let changed = &mut self.changed_neigh;
        self.neigh.retain(|k, n| {
            let keep = now_ms.saturating_sub(n.seen_ms) <= aging_ms;
            if !keep && let Some(c) = changed.as_mut() {
                c.push(*k);
            }
            keep
        });
    }

    /// Forgets every neighbour (the uplink moved to another device).
    pub fn forget_neighbours(&mut self) {
        if let Some(c) = self.changed_neigh.as_mut() {
            c.extend(self.neigh.keys().copied());
        }
        self.neigh.clear();
    }

    /// Neighbours as (VLAN, IP, MAC), sorted.
    pub fn neighbours(&self) -> Vec<(u16, IpAddr, MacAddr)> {
        let mut v: Vec<_> = self.neigh.iter().map(|(&(vl, ip), n)| (vl, ip, n.mac)).collect();
        v.sort();
        v
    }

    /// True when a request for `ip` was sent towards `out` within the retry interval.
    pub fn asked_recently(&self, out: PortId, ip: IpAddr, now_ms: u64) -> bool {
        self.pending.iter().any(|p| p.out == out && p.ip == ip && now_ms.saturating_sub(p.since_ms) < RESOLVE_RETRY_MS)
    }
}

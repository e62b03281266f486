//! EVPN's IP bindings and ARP/ND suppression (docs/architecture.md, "EVPN: many hosts,
//! one LAN", IP bindings and ARP/ND suppression).
//!
//! Remote bindings: the IPv4 and IPv6 addresses other hosts' routes bind to their
//! stations, by VLAN; a broadcast ARP request or a neighbour solicitation from a local
//! port for one of them is answered to the asker instead of being flooded into the
//! tunnel. Local bindings: the sender address of each ARP message, neighbour
//! solicitation or advertisement a local station sends, while it is learned behind that
//! port, for the agent to announce; bounded, and dropped when the station ages or
//! moves. Which frames come here is `decide`'s rule
//! ([`Upcall::Suppress`](crate::decide::Upcall::Suppress)); a frame not answered is
//! decided again and forwarded as before.

use std::net::IpAddr;

use sluice_wire::MacAddr;
use sluice_wire::neigh::{self, Neigh};

use super::Switch;
use super::lossless::Hold;
use crate::decide::{self, Key, PortRules};
use crate::ids::PortId;
use crate::l3::Mode;

/// Remote bindings a switch holds at most; further ones are refused.
pub const MAX_BINDINGS: usize = 65_536;
/// Local bindings a switch holds at most; further ones are not learned.
pub const MAX_LOCAL_BINDINGS: usize = 16_384;
/// Addresses learned for one local station at most.
pub const MAX_LOCAL_IPS_PER_STATION: usize = 4;

/// A local binding: the station an address was last seen from, and behind which port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct LocalBinding {
    mac: MacAddr,
    port: PortId,
}

impl Switch {
    /// Binds `ip` to station `mac` of `vni` (behind EVPN tunnel port `id`): ARP requests
    /// for `ip` from the VLAN's local ports are answered with `mac`. False when it cannot
    /// be: the port carries no such VNI, or [`MAX_BINDINGS`] are held.
    pub fn evpn_bind(&mut self, id: PortId, vni: u32, ip: IpAddr, mac: MacAddr) -> bool {
        let Some(vlan) = self.evpn_vlan(id, vni) else { return false };
        if self.bindings.len() >= MAX_BINDINGS && !self.bindings.contains_key(&(vlan, ip)) {
            return false;
        }
        self.bindings.insert((vlan, ip), mac);
        true
    }

    /// Removes the binding of `ip` in `vni` of EVPN tunnel port `id`.
    pub fn evpn_unbind(&mut self, id: PortId, vni: u32, ip: IpAddr) {
        if let Some(vlan) = self.evpn_vlan(id, vni) {
            self.bindings.remove(&(vlan, ip));
        }
    }

    /// ARP requests answered from the bindings, not flooded.
    pub fn arp_suppressed(&self) -> u64 {
        self.suppressed[0]
    }

    /// Neighbour solicitations answered from the bindings, not flooded.
    pub fn nd_suppressed(&self) -> u64 {
        self.suppressed[1]
    }

    /// The addresses of local stations learned from their ARP and neighbour-discovery
    /// messages, as `(vlan, ip, mac)`, of stations still learned behind the port they were
    /// seen from; those of stations gone or moved are forgotten now.
    pub fn local_bindings(&mut self) -> Vec<(u16, IpAddr, MacAddr)> {
        let (fib, per_station) = (&self.fib, &mut self.local_per_station);
        self.local_bound.retain(|&(vlan, _), b| {
            let kept = fib.get(vlan, b.mac).is_some_and(|e| e.port == b.port && !e.remote);
            if !kept {
                forget_one(per_station, b.mac);
            }
            kept
        });
        self.local_bound.iter().map(|(&(vlan, ip), b)| (vlan, ip, b.mac)).collect()
    }

    /// Whether the address resolution of a port with rules `r` is the core's to read
    /// ([`Switch::suppress`]; the key's `suppress`): a port that is no tunnel, in Layer 2
    /// mode, on a switch with an EVPN tunnel.
    pub(super) fn suppresses(&self, r: &PortRules) -> bool {
        self.cfg.mode == Mode::L2 && r.tunnel.is_none() && self.evpn
    }

    /// Notes whether any port is an EVPN tunnel, after a port comes or goes (a port's
    /// tunnel rules are its own from when it is added).
    pub(super) fn note_evpn(&mut self) {
        self.evpn = self.ports.iter().flatten().any(|s| s.rules.tunnel.as_ref().is_some_and(|t| t.evpn));
    }

    /// Address-resolution message `fid` from local port `from` (decided by `key`): learns
    /// its sender's address, answers a request from the remote bindings, or decides it
    /// again to be forwarded as before. An ARP request is answered when broadcast, a
    /// neighbour solicitation when sent to a group (its solicited-node address); probes
    /// and announcements (an ARP sender 0.0.0.0 or asking for its own address, a
    /// solicitation from `::` in duplicate address detection) are forwarded.
    pub(super) fn suppress(&mut self, from: PortId, fid: u32, key: &Key, now_ms: u64) {
        let vlan = self.pool.meta(fid).vlan;
        let frame = self.pool.frame(fid);
        let eth_src = super::mac_at(frame, 6);
        let mut answer = None;
        match neigh::parse_neigh(frame) {
            Some(Neigh::ArpRequest { sender_mac, sender_ip, target }) => {
                self.learn_local_binding(from, vlan, sender_mac, sender_ip.into());
                if key.dst == decide::Dest::Broadcast && !sender_ip.is_unspecified() && sender_ip != target {
                    answer = self
                        .bindings
                        .get(&(vlan, target.into()))
                        .map(|&m| Answer::Arp(sender_mac, sender_ip, target, m));
                }
            }
            Some(Neigh::ArpReply { sender_mac, sender_ip }) => {
                self.learn_local_binding(from, vlan, sender_mac, sender_ip.into());
            }
            Some(Neigh::Solicit { src, target, lla }) => {
                let asker = lla.unwrap_or(eth_src);
                self.learn_local_binding(from, vlan, asker, src.into());
                if key.dst == decide::Dest::Group && !src.is_unspecified() && src != target {
                    answer = self.bindings.get(&(vlan, target.into())).map(|&m| Answer::Nd(asker, src, target, m));
                }
            }
            Some(Neigh::Advert { target, lla }) => {
                self.learn_local_binding(from, vlan, lla.unwrap_or(eth_src), target.into());
            }
            None => {}
        }
        if let Some(a) = answer {
            self.slot_mut(from).expect("caller checked").counters.consumed += 1;
            self.pool.release(fid);
            match a {
                Answer::Arp(asker, asker_ip, target, mac) => {
                    self.suppressed[0] += 1;
                    self.emit(from, vlan, |b| neigh::write_arp(b, 2, asker, mac, target, asker, asker_ip));
                }
                Answer::Nd(asker, asker_ip, target, mac) => {
                    self.suppressed[1] += 1;
                    let m =
                        neigh::NdFields { advert: true, solicited: true, src: target, dst: asker_ip, target, lla: mac };
                    self.emit(from, vlan, |b| neigh::write_nd(b, asker, mac, &m));
                }
            }
            return;
        }
        let k = Key { suppress: false, ..*key };
        let mut v = std::mem::take(&mut self.again);
        decide::decide(&k, &self.tables(), &mut v);
        self.execute(from, fid, &k, &v, Hold::Never, now_ms);
        self.again = v;
    }

    /// Station `mac`, learned behind `from` on `vlan`, says it has `ip`: bound, within
    /// the bounds. (A sender claiming another port's station teaches nothing.)
    fn learn_local_binding(&mut self, from: PortId, vlan: u16, mac: MacAddr, ip: IpAddr) {
        let unusable = match ip {
            IpAddr::V4(a) => a.is_unspecified() || a.is_broadcast() || a.is_multicast(),
            IpAddr::V6(a) => a.is_unspecified() || a.is_multicast(),
        };
        if unusable || !self.fib.get(vlan, mac).is_some_and(|e| e.port == from && !e.remote) {
            return;
        }
        let b = LocalBinding { mac, port: from };
        if self.local_bound.get(&(vlan, ip)) == Some(&b) {
            return;
        }
        let held = self.local_per_station.get(&mac).copied().unwrap_or(0);
        if self.local_bound.len() >= MAX_LOCAL_BINDINGS || usize::from(held) >= MAX_LOCAL_IPS_PER_STATION {
            return;
        }
        *self.local_per_station.entry(mac).or_insert(0) += 1;
        if let Some(old) = self.local_bound.insert((vlan, ip), b) {
            forget_one(&mut self.local_per_station, old.mac);
        }
    }
}

/// One local binding of station `mac` fewer.
fn forget_one(per_station: &mut std::collections::HashMap<MacAddr, u8>, mac: MacAddr) {
    if let Some(n) = per_station.get_mut(&mac) {
        *n -= 1;
        if *n == 0 {
            per_station.remove(&mac);
        }
    }
}

/// The switch's answer to a request, from a binding: to the asker's MAC and address, for
/// the target address, with the bound MAC.
enum Answer {
    Arp(MacAddr, std::net::Ipv4Addr, std::net::Ipv4Addr, MacAddr),
    Nd(MacAddr, std::net::Ipv6Addr, std::net::Ipv6Addr, MacAddr),
}

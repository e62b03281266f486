//! EVPN's ARP suppression (docs/architecture.md, "EVPN: many hosts, one LAN", IP bindings
//! and ARP/ND suppression): the IPv4 addresses other hosts' routes bind to their stations,
//! by VLAN, and the answer to a broadcast ARP request for one of them, given to the asker
//! instead of flooding the request into the tunnel. Which frames come here is `decide`'s
//! rule ([`Upcall::Suppress`](crate::decide::Upcall::Suppress)); a request the switch
//! holds no binding for is decided again and flooded as before.

use std::net::IpAddr;

use sluice_wire::MacAddr;
use sluice_wire::neigh::{self, Neigh};

use super::Switch;
use super::lossless::Hold;
use crate::decide::{self, Key};
use crate::ids::PortId;

/// Bindings a switch holds at most; further ones are refused.
pub const MAX_BINDINGS: usize = 65_536;

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
        self.arp_suppressed
    }

    /// Whether the key reader marks a frame of `ethertype` for [`Switch::suppress_arp`]:
    /// ARP, while bindings are held.
    pub(super) fn suppress_candidate(&self, ethertype: u16) -> bool {
        ethertype == 0x0806 && !self.bindings.is_empty()
    }

    /// Answers broadcast ARP request `fid` from port `from` (decided by `key`) from the
    /// bindings, or decides it again to be flooded as any broadcast. Probes and
    /// announcements (sender 0.0.0.0, or asking for its own address) are flooded.
    pub(super) fn suppress_arp(&mut self, from: PortId, fid: u32, key: &Key, now_ms: u64) {
        let vlan = self.pool.meta(fid).vlan;
        let answer = match neigh::parse_neigh(self.pool.frame(fid)) {
            Some(Neigh::ArpRequest { sender_mac, sender_ip, target })
                if !sender_ip.is_unspecified() && sender_ip != target =>
            {
                self.bindings.get(&(vlan, IpAddr::V4(target))).map(|&mac| (sender_mac, sender_ip, target, mac))
            }
            _ => None,
        };
        if let Some((sender_mac, sender_ip, target, mac)) = answer {
            self.slot_mut(from).expect("caller checked").counters.consumed += 1;
            self.pool.release(fid);
            self.arp_suppressed += 1;
            self.emit(from, vlan, |b| neigh::write_arp(b, 2, sender_mac, mac, target, sender_mac, sender_ip));
            return;
        }
        let k = Key { suppress: false, ..*key };
        let mut v = std::mem::take(&mut self.again);
        decide::decide(&k, &self.tables(), &mut v);
        self.execute(from, fid, &k, &v, Hold::Never, now_ms);
        self.again = v;
    }
}

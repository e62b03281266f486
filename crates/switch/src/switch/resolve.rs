//! Layer 3 mode's address resolution inside the switch: the ARP and neighbour-discovery
//! messages guests and the LAN send are answered for the addresses the switch stands for,
//! and LAN neighbours learned from them; a routed frame whose next hop's MAC address is
//! not known yet is parked (the switch asks for it) and forwarded once it is. The tables
//! are [`crate::l3`]'s; the messages are read and written by `sluice_wire::neigh`.

use std::net::IpAddr;

use sluice_wire::MacAddr;
use sluice_wire::neigh::{self, NdFields, Neigh};

use super::lossless::Hold;
use super::{Switch, mac_at};
use crate::counters::DropCause;
use crate::decide::Key;
use crate::ids::PortId;
use crate::l3::{MAX_PENDING, Pending, RESOLVE_MS};

impl Switch {
    /// Layer 3 mode: the addresses guest ports own, as (address, port), sorted.
    pub fn ip_owners(&self) -> Vec<(IpAddr, PortId)> {
        let mut v: Vec<_> = self.l3.owners().collect();
        v.sort();
        v
    }

    /// Layer 3 mode: LAN neighbours learned on the uplink, as (VLAN, address, MAC), sorted.
    pub fn neighbours(&self) -> Vec<(u16, IpAddr, MacAddr)> {
        self.l3.neighbours()
    }

    /// Takes an address-resolution message port `from` sent: answers it or learns from it.
    pub(super) fn neighbour_message(&mut self, from: PortId, fid: u32, now_ms: u64) {
        let frame = self.pool.frame(fid);
        let (src, vlan) = (mac_at(frame, 6), self.pool.meta(fid).vlan);
        let Some(m) = neigh::parse_neigh(frame) else {
            // Neighbour discovery whose message does not read (a bad checksum or option).
            self.drop_rx(from, fid, DropCause::Malformed);
            return;
        };
        self.slot_mut(from).expect("caller checked").counters.consumed += 1;
        self.pool.release(fid);
        self.answer(from, vlan, src, m, now_ms);
    }

    /// Answers or learns from an address-resolution message that port `from` sent.
    fn answer(&mut self, from: PortId, vlan: u16, eth_src: MacAddr, m: Neigh, now_ms: u64) {
        let Some(s) = self.slot(from) else { return };
        let uplink = s.rules.policy.uplink;
        let me = s.rules.l3_src(self.cfg.router_mac);
        // Whether to answer for `target`: on the uplink, for guests' addresses only; on a
        // guest port, for any address but the guest's own.
        let answers = |sw: &Switch, target: IpAddr| {
            if uplink { sw.owner_in(vlan, target).is_some() } else { sw.l3.owner(target) != Some(from) }
        };
        match m {
            Neigh::ArpRequest { sender_mac, sender_ip, target } => {
                if uplink && !sender_ip.is_unspecified() {
                    self.learn_neighbour(from, vlan, sender_ip.into(), sender_mac, now_ms);
                }
                let probe = sender_ip.is_unspecified() || sender_ip == target;
                if (uplink || !probe) && answers(self, target.into()) {
                    self.emit(from, vlan, |b| neigh::write_arp(b, 2, sender_mac, me, target, sender_mac, sender_ip));
                }
            }
            Neigh::ArpReply { sender_mac, sender_ip } => {
                if uplink {
                    self.learn_neighbour(from, vlan, sender_ip.into(), sender_mac, now_ms);
                }
            }
            Neigh::Solicit { src, target, lla } => {
                if uplink && !src.is_unspecified() {
                    self.learn_neighbour(from, vlan, src.into(), lla.unwrap_or(eth_src), now_ms);
                }
                if (uplink || !src.is_unspecified()) && answers(self, target.into()) {
                    let (dst, dst_mac, solicited) = if src.is_unspecified() {
                        (neigh::ALL_NODES, neigh::multicast_mac(neigh::ALL_NODES), false)
                    } else {
                        (src, lla.unwrap_or(eth_src), true)
                    };
                    let f = NdFields { advert: true, solicited, src: target, dst, target, lla: me };
                    self.emit(from, vlan, |b| neigh::write_nd(b, dst_mac, me, &f));
                }
            }
            Neigh::Advert { target, lla } => {
                if uplink {
                    self.learn_neighbour(from, vlan, target.into(), lla.unwrap_or(eth_src), now_ms);
                }
            }
        }
    }

    /// The live guest port in `vlan` that owns `ip`.
    fn owner_in(&self, vlan: u16, ip: IpAddr) -> Option<PortId> {
        let p = self.l3.owner(ip)?;
        self.slot(p).filter(|s| s.rules.failed.is_none() && s.rules.vlan.is_member(vlan)).map(|_| p)
    }

    /// Records a LAN neighbour heard on uplink `port` and sends what waited for it.
    fn learn_neighbour(&mut self, port: PortId, vlan: u16, ip: IpAddr, mac: MacAddr, now_ms: u64) {
        self.l3.learn(vlan, ip, mac, now_ms);
        self.resolved(port, Some(ip), now_ms);
    }

    /// Parks IP frame `fid` from `from` (decided by `key`) until the MAC address of its
    /// next hop behind `out` is known; a frame that finds no room waits for nothing.
    pub(super) fn wait_for_next_hop(&mut self, from: PortId, fid: u32, key: &Key, out: PortId, now_ms: u64) {
        let Some((_, ip)) = neigh::ip_endpoints(self.pool.frame(fid)) else {
            self.drop_rx(from, fid, DropCause::Malformed);
            return;
        };
        self.pool.set_key(fid, *key);
        let vlan = self.pool.meta(fid).vlan;
        // The pending list keeps the frame (and its reference) until then.
        if !self.park(from, fid, out, ip, vlan, now_ms) {
            self.drop_rx(from, fid, DropCause::Unresolved);
        }
    }

    /// Parks frame `fid` from `from` until `ip` behind `out` is resolved, asking for it
    /// unless it was asked for recently.
    fn park(&mut self, from: PortId, fid: u32, out: PortId, ip: IpAddr, vlan: u16, now_ms: u64) -> bool {
        if self.l3.pending.len() >= MAX_PENDING {
            return false;
        }
        let ask = !self.l3.asked_recently(out, ip, now_ms);
        self.l3.pending.push(Pending { from, out, ip, fid, since_ms: now_ms });
        if !ask {
            return true;
        }
        let Some(s) = self.slot(out) else { return true };
        let me = s.rules.l3_src(self.cfg.router_mac);
        // Asked in the name of the packet's source, so the answer also teaches the target
        // where that source is.
        let Some((src, _)) = neigh::ip_endpoints(self.pool.frame(fid)) else { return true };
        match (src, ip) {
            (IpAddr::V4(s4), IpAddr::V4(t4)) => {
                self.emit(out, vlan, |b| neigh::write_arp(b, 1, MacAddr::BROADCAST, me, s4, MacAddr::default(), t4));
            }
            (IpAddr::V6(s6), IpAddr::V6(t6)) => {
                let dst = neigh::solicited_node(t6);
                let f = NdFields { advert: false, solicited: false, src: s6, dst, target: t6, lla: me };
                self.emit(out, vlan, |b| neigh::write_nd(b, neigh::multicast_mac(dst), me, &f));
            }
            _ => {}
        }
        true
    }

    /// Forwards the frames waiting for `ip` behind port `out` (any address: the guest's
    /// MAC became known).
    pub(super) fn resolved(&mut self, out: PortId, ip: Option<IpAddr>, now_ms: u64) {
        // Only the frames whose next hop is known now leave the list (an answer the table
        // did not keep — it was full, or for another VLAN — leaves the rest waiting, still
        // counted as asked for); they are taken out first and each forwarded once, so
        // none can come round again in this loop.
        let take: Vec<bool> = self
            .l3
            .pending
            .iter()
            .map(|p| p.out == out && ip.is_none_or(|ip| ip == p.ip) && self.next_hop_known(p, now_ms))
            .collect();
        let mut ready = Vec::new();
        let mut k = 0;
        self.l3.pending.retain(|p| {
            let now = take[k];
            k += 1;
            if now {
                ready.push(*p);
            }
            !now
        });
        for p in ready {
            // Its input may already hold a frame: this one is placed without holding.
            self.redecide(p.from, p.fid, Hold::Never);
        }
    }

    /// Whether the MAC address a waiting frame needs is known now (its port gone: yes, the
    /// frame is forwarded to be dropped).
    fn next_hop_known(&self, p: &Pending, now_ms: u64) -> bool {
        let Some(s) = self.slot(p.out) else { return true };
        if s.rules.policy.uplink {
            let vlan = self.pool.meta(p.fid).vlan;
            self.l3.lookup(vlan, p.ip, now_ms, self.cfg.aging_ms).is_some()
        } else {
            s.rules.guest_mac.is_some()
        }
    }

    /// Drops the frames that waited [`RESOLVE_MS`] or longer for their next hop's address.
    pub(super) fn expire_pending(&mut self, now_ms: u64) {
        let mut i = 0;
        while i < self.l3.pending.len() {
            let p = self.l3.pending[i];
            if now_ms.saturating_sub(p.since_ms) >= RESOLVE_MS {
                self.l3.pending.remove(i);
                self.pool.release(p.fid);
                if let Some(s) = self.slot_mut(p.from) {
                    s.counters.rx_drops.add(DropCause::Unresolved);
                }
            } else {
                i += 1;
            }
        }
    }
}

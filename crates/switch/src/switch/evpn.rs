//! EVPN's routes carried out in the switch (docs/architecture.md, "EVPN: many hosts, one
//! LAN"): a station another host announced is put behind the tunnel port with origin
//! `evpn` and its endpoint pinned in the port; each VNI's flood list and the endpoints the
//! routes name are handed to the port. What to install is decided by [`crate::evpn`].

use std::net::IpAddr;

use sluice_wire::MacAddr;

use super::Switch;
use crate::decide::{self, Tunneled};
use crate::ids::PortId;

impl Switch {
    /// The VLAN frames of `vni` join on EVPN tunnel port `id` (its stage 1, as for a
    /// datagram from one of its endpoints), if the port carries `vni`.
    pub(super) fn evpn_vlan(&self, id: PortId, vni: u32) -> Option<u16> {
        let s = self.slot(id)?;
        s.rules.tunnel.as_ref().filter(|t| t.evpn)?;
        decide::stage1(&s.rules, None, Some(Tunneled { vni, endpoint: true })).ok().map(|i| i.vid)
    }

    /// Puts station `mac` of `vni` behind EVPN tunnel port `id`, sent to `endpoint`. False
    /// when it cannot be: the port carries no such VNI, the station is configured here,
    /// or the table is full.
    pub fn evpn_install(&mut self, id: PortId, vni: u32, mac: MacAddr, endpoint: IpAddr) -> bool {
        let Some(vlan) = self.evpn_vlan(id, vni) else { return false };
        if !self.fib.add_remote(vlan, mac, id) {
            return false;
        }
        if let Some(s) = self.slot_mut(id) {
            s.port.pin_remote(vni, mac, Some(endpoint));
        }
        self.note_fast_remote(id, vni, mac);
        true
    }

    /// Removes remote station `mac` of `vni` from EVPN tunnel port `id` (unless a local
    /// port has taken it since).
    pub fn evpn_uninstall(&mut self, id: PortId, vni: u32, mac: MacAddr) {
        let Some(vlan) = self.evpn_vlan(id, vni) else { return };
        self.fib.remove_remote(vlan, mac, id);
        if let Some(s) = self.slot_mut(id) {
            s.port.pin_remote(vni, mac, None);
        }
        self.note_fast_remote(id, vni, mac);
    }

    /// `vni` of EVPN tunnel port `id` floods to `endpoints` besides its configured remotes.
    pub fn evpn_flood(&mut self, id: PortId, vni: u32, endpoints: &[IpAddr]) {
        if let Some(s) = self.slot_mut(id) {
            s.port.set_flood(vni, endpoints);
        }
        self.note_fast(id);
    }

    /// The endpoints EVPN tunnel port `id`'s routes name now: their datagrams are taken
    /// (stage 1 knows them as endpoints) besides the configured remotes'.
    pub fn evpn_endpoints(&mut self, id: PortId, endpoints: &[IpAddr]) {
        if let Some(s) = self.slot_mut(id)
            && let Some(t) = s.rules.tunnel.as_mut()
        {
            t.announced = endpoints.to_vec();
            t.announced.sort_unstable();
            t.announced.dedup();
            s.port.set_announced(endpoints);
        }
        self.note_fast(id);
    }

    /// Whether port `id` is an EVPN tunnel, and its VNI for frames of `vlan`.
    pub fn evpn_vni_of(&self, id: PortId, vlan: u16) -> Option<u32> {
        let t = self.slot(id)?.rules.tunnel.as_ref().filter(|t| t.evpn)?;
        // (The VNI whose frames join `vlan` on the way in, so both ways agree.)
        let vni = t.vnis.vni_of(Some(vlan))?;
        (self.evpn_vlan(id, vni) == Some(vlan)).then_some(vni)
    }
}

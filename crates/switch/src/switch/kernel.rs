//! The switch's side of a kernel datapath ([`crate::fastpath`]): the rules and table
//! entries the kernel executes, each change to them reported once; what the kernel reports
//! back (stations it forwarded for, stations heard behind a tunnel); and, when sluice takes
//! over the tables an earlier run left in the kernel, those entries adopted. Frames the
//! kernel hands up enter as any other ([`Switch::ingest`]).

use std::net::IpAddr;

use sluice_wire::MacAddr;

use super::Switch;
use crate::decide::{self, SourceCheck, Tunneled};
use crate::fastpath::{FastChange, FastMac, FastPort};
use crate::ids::PortId;
use crate::l3::Mode;

impl Switch {
    /// Starts reporting what a kernel datapath must follow (see [`crate::fastpath`]):
    /// from now on every port and MAC entry that changes is reported by
    /// [`Switch::take_fastpath_changes`]; the ports attached so far are reported once.
    pub fn follow_fastpath(&mut self) {
        self.fib.track_changes();
        self.l3.changed_owners = Some(self.l3.owners().map(|(ip, _)| ip).collect());
        self.l3.changed_neigh = Some(self.l3.neighbours().into_iter().map(|(v, ip, _)| (v, ip)).collect());
        self.mdb.track_changes();
        let ids: Vec<PortId> = self.port_ids().collect();
        self.fast_changed = Some(ids);
        for (vlan, mac, _) in self.fib.entries() {
            // Entries that existed before: reported like new ones.
            self.fib.add_changed(vlan, mac);
        }
    }

    /// Hands over the ports and MAC entries whose fast-path state changed since the last
    /// call, each once.
    pub fn take_fastpath_changes(&mut self, mut f: impl FnMut(FastChange)) {
        // Ports that reached their learning limit or left it.
        let mut counted = Vec::new();
        self.fib.take_count_changes(|p| counted.push(p));
        for p in counted {
            let full = self.learn_full(p);
            if self.slot(p).is_some_and(|s| s.learn_full != full) {
                self.note_fast(p);
            }
        }
        if let Some(mut c) = self.fast_changed.take() {
            c.sort_unstable();
            c.dedup();
            for &id in c.iter() {
                let full = self.learn_full(id);
                if let Some(s) = self.slot_mut(id) {
                    s.learn_full = full;
                }
                f(FastChange::Port(id));
            }
            c.clear();
            self.fast_changed = Some(c);
        }
        self.fib.take_changes(|vlan, mac| f(FastChange::Mac(vlan, mac)));
        if let Some(c) = self.l3.changed_owners.as_mut() {
            c.sort_unstable();
            c.dedup();
            for &ip in c.iter() {
                f(FastChange::Owner(ip));
            }
            c.clear();
        }
        if let Some(c) = self.l3.changed_neigh.as_mut() {
            c.sort_unstable();
            c.dedup();
            for &(vlan, ip) in c.iter() {
                f(FastChange::Neighbour(vlan, ip));
            }
            c.clear();
        }
        self.mdb.take_changes(|vlan, ip| f(FastChange::Group(vlan, ip)));
        self.fast_remotes.sort_unstable();
        self.fast_remotes.dedup();
        for (id, vni, mac) in self.fast_remotes.drain(..) {
            f(FastChange::Remote(id, vni, mac));
        }
    }

    pub(super) fn note_fast(&mut self, id: PortId) {
        if let Some(c) = self.fast_changed.as_mut() {
            c.push(id);
        }
    }

    /// EVPN: the route for station `mac` of `vni` behind tunnel port `id` changed.
    pub(super) fn note_fast_remote(&mut self, id: PortId, vni: u32, mac: MacAddr) {
        if self.fast_changed.is_some() {
            self.fast_remotes.push((id, vni, mac));
        }
    }

    /// Layer 2: port `id` has as many learned stations behind it as it may (see
    /// [`Tables::learn_full`](crate::decide::Tables::learn_full)).
    fn learn_full(&self, id: PortId) -> bool {
        self.slot(id).is_some_and(|s| self.tables().learn_full(id, &s.rules))
    }

    /// Port `id`'s rules as a kernel datapath executes them (`None`: no such port).
    pub fn fast_port(&self, id: PortId) -> Option<FastPort> {
        let s = self.slot(id)?;
        let r = &s.rules;
        // Frames to a port without offloads are cut in software, which only the core does;
        // a port whose mirror the kernel cannot serve goes through the core, copies and all.
        let mirror_in_user_space = r.mirrored_to.is_some_and(|m| self.slot(m).is_none_or(|m| !m.kernel_ready()));
        let slow = r.failed.is_some() || !s.port.fast_path_offload() || mirror_in_user_space || s.captured > 0;
        Some(FastPort {
            target: s.port.fast_path(),
            uplink: r.policy.uplink,
            mac: r.policy.mac,
            checks_ips: r.checks_ips(),
            slow,
            failed: r.failed.is_some(),
            dev_mac: if r.policy.uplink { r.dev_mac } else { None },
            guest_mac: if self.cfg.mode == Mode::L3 { r.guest_mac } else { None },
            storm: r.policy.storm,
            rate: r.policy.rate,
            snoops: self.cfg.mode == Mode::L2 && self.mdb.config().enabled,
            acl: self.acl.active() && self.kernel_ct.is_some(),
            routed: r.tunnel.as_ref().is_some_and(|t| t.evpn),
            suppressed: self.suppresses(r),
        })
    }

    /// The MAC table's entry for `mac` on `vlan` as a kernel datapath executes it.
    pub fn fast_mac(&self, vlan: u16, mac: MacAddr) -> Option<FastMac> {
        self.fib.get(vlan, mac).map(|e| FastMac { port: e.port, is_static: e.is_static })
    }

    /// Layer 3: the live port that owns `ip`, as a kernel datapath executes it.
    pub fn fast_owner(&self, ip: IpAddr) -> Option<PortId> {
        self.l3.owner(ip).filter(|&p| self.slot(p).is_some())
    }

    /// Layer 3: the MAC address of LAN neighbour `ip` on `vlan`, as a kernel datapath
    /// executes it.
    /// IGMP/MLD snooping: group `ip`'s port set id in `vlan`, if registered.
    pub fn fast_group(&self, vlan: u16, ip: IpAddr) -> Option<u32> {
        match self.mdb.class(vlan, ip) {
            crate::mdb::GroupClass::Set(id) => Some(id),
            _ => None,
        }
    }

    pub fn fast_neighbour(&self, vlan: u16, ip: IpAddr) -> Option<MacAddr> {
        self.l3.neighbour(vlan, ip)
    }

    /// Records that a kernel datapath forwarded frames from `mac` on `vlan` arriving on
    /// port `id` at `now_ms` (the driver's clock): its MAC entry stays fresh.
    pub fn touch_mac(&mut self, vlan: u16, mac: MacAddr, id: PortId, now_ms: u64) {
        self.fib.touch(vlan, mac, id, now_ms);
    }

    /// A kernel datapath heard station `mac` of VLAN `vlan` behind tunnel port `id`, in a
    /// datagram of `vni` from `sender` (its executor reports it, and learns nothing
    /// itself). Decided as for a frame: the tunnel's stage 1 must give that origin that
    /// VLAN, and the station must be the tunnel's (learned from an earlier frame, after
    /// every check, and not moved since). Then the port learns where the station is
    /// ([`Port::learn_remote`](crate::Port::learn_remote)). Returns whether it did: the
    /// kernel's table is to say so too.
    pub fn tunnel_heard(&mut self, id: PortId, vni: u32, vlan: u16, mac: MacAddr, sender: IpAddr) -> bool {
        let Some(s) = self.slot(id).filter(|s| s.rules.failed.is_none()) else { return false };
        let Some(t) = s.rules.tunnel.as_ref().filter(|t| !t.evpn) else { return false };
        let origin = Some(Tunneled { vni, endpoint: t.knows(sender) });
        let joins = |tci| decide::stage1(&s.rules, tci, origin).is_ok_and(|i| i.vid == vlan);
        let here = match self.cfg.mode {
            Mode::L2 => self.fib.get(vlan, mac).is_some_and(|e| e.port == id),
            Mode::L3 => s.rules.guest_mac == Some(mac),
        };
        if !here || !(joins(None) || joins(Some(vlan))) {
            return false;
        }
        if let Some(s) = self.slot_mut(id) {
            s.port.learn_remote(vni, mac, sender);
        }
        true
    }

    /// The endpoints tunnel port `id` sends a flood in `vlan` to ([`crate::Port::floods_to`]):
    /// what a kernel datapath that replicates floods writes. `None`: no such port, or it
    /// failed.
    pub fn tunnel_floods(&self, id: PortId, vlan: u16) -> Option<Vec<IpAddr>> {
        let s = self.slot(id).filter(|s| s.rules.failed.is_none() && s.rules.tunnel.is_some())?;
        Some(s.port.floods_to(vlan))
    }

    /// The endpoints tunnel port `id` takes datagrams from as its own (stage 1's
    /// `endpoint`): the configured ones, and on an EVPN tunnel those its routes name.
    pub fn tunnel_endpoints(&self, id: PortId) -> Vec<IpAddr> {
        let Some(t) = self.slot(id).and_then(|s| s.rules.tunnel.as_ref()) else { return Vec::new() };
        let mut v: Vec<IpAddr> = t.remotes.iter().chain(&t.announced).copied().collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// EVPN: the endpoint tunnel port `id`'s route for station `mac` of `vni` names, as a
    /// kernel datapath executes it; `None` when there is no such route (or port).
    pub fn fast_remote(&self, id: PortId, vni: u32, mac: MacAddr) -> Option<IpAddr> {
        let s = self.slot(id).filter(|s| s.rules.tunnel.as_ref().is_some_and(|t| t.evpn))?;
        s.port.routed_endpoint(vni, mac)
    }

    /// Taking over a kernel datapath an earlier run left: station `mac` of `vlan` was
    /// learned behind port `id` there. Learned again unless port `id` may not send from
    /// it (another port locks it now).
    pub fn adopt_mac(&mut self, vlan: u16, mac: MacAddr, id: PortId, now_ms: u64) {
        if self.slot(id).is_some_and(|s| !self.claims_locked(&s.rules.policy, mac)) {
            self.fib.learn(vlan, mac, id, now_ms);
        }
    }

    /// Layer 3, taking over a kernel datapath an earlier run left: port `id` owned `ip`
    /// there. As if the port's guest had just used it: a port that learns its addresses
    /// learns it (and locks it), one with configured addresses keeps them.
    pub fn adopt_owner(&mut self, ip: IpAddr, id: PortId) {
        if self.cfg.mode == Mode::L3
            && self.l3.owner(ip).is_none()
            && let Some(s) = self.slot(id)
            && let SourceCheck::Learn(ip) = s.rules.policy.check_source(ip, true)
        {
            self.lock_ip(id, ip);
        }
    }

    /// Layer 3, taking over a kernel datapath an earlier run left: LAN neighbour `ip` on
    /// `vlan` was at `mac`.
    pub fn adopt_neighbour(&mut self, vlan: u16, ip: IpAddr, mac: MacAddr, now_ms: u64) {
        if self.cfg.mode == Mode::L3 {
            self.l3.learn(vlan, ip, mac, now_ms);
        }
    }
}

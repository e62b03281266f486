//! The switch's ports as the driver manages them: attached (with their buffers, mirrors,
//! locks and addresses), removed, failed, their devices checked (a failover announces the
//! stations behind the switch anew), static MAC entries pointed at them, and what the
//! switch shows of them (snapshots and counters).

use std::net::IpAddr;

use sluice_wire::MacAddr;
use sluice_wire::neigh::{self, NdFields};

use super::{Interest, PortSlot, Switch, Watch};
use crate::config::{MTU_RANGE, PortConfig, SwitchError};
use crate::counters::{ClassCounters, DropCause, PortCounters};
use crate::decide::PortRules;
use crate::hold::HeldList;
use crate::ids::PortId;
use crate::l3::Mode;
use crate::port::{DeviceDrops, Port, PortCaps};
use crate::queue::ClassQueues;
use crate::vlan::VlanMode;

/// A snapshot of one port for display.
#[derive(Clone, Debug)]
pub struct PortInfo {
    /// Port id.
    pub id: PortId,
    /// Port name.
    pub name: String,
    /// Kind of attachment ("tap", "mem", …).
    pub kind: &'static str,
    /// VLAN membership.
    pub vlan: VlanMode,
    /// Effective MTU.
    pub mtu: u16,
    /// Declared capabilities.
    pub caps: PortCaps,
    /// Counters since the last reset.
    pub counters: PortCounters,
    /// Frames waiting in its output queue.
    pub queued: usize,
    /// Frames it sent that wait for room at their outputs (lossless classes); at the
    /// switch's `hold_len` its input is paused.
    pub held: usize,
    /// Its input is not read: its held frames reached `hold_len`.
    pub paused: bool,
    /// Per traffic class, in the switch's class order.
    pub classes: Vec<ClassInfo>,
    /// Frames it sent that wait for their next hop's address (Layer 3 mode).
    pub resolving: usize,
    /// Drops counted by the device underneath, outside the switch.
    pub device_drops: Option<DeviceDrops>,
    /// The port's own account of its link ([`Port::link_state`]).
    pub link: Option<String>,
    /// The port's device failed and it is no longer serviced.
    pub failed: Option<String>,
}

/// One port's view of one traffic class.
#[derive(Clone, Debug)]
pub struct ClassInfo {
    /// The class's name.
    pub name: String,
    /// Lossless class.
    pub lossless: bool,
    /// Counters since the last reset.
    pub counters: ClassCounters,
    /// Frames waiting in the port's queue of this class.
    pub queued: usize,
    /// The pause watchdog declared the port stuck in this class (it drops toward it).
    pub stuck: bool,
}

/// A frame an uplink sends after a failover.
#[derive(Clone, Copy)]
enum Announce {
    Rarp(MacAddr),
    Address(IpAddr, MacAddr),
}

impl Switch {
    /// Attaches a port. Its buffers are allocated now, so forwarding never allocates.
    pub fn add_port(&mut self, cfg: PortConfig, port: Box<dyn Port>) -> Result<PortId, SwitchError> {
        if self.port_id(&cfg.name).is_some() {
            return Err(SwitchError::DuplicatePort(cfg.name));
        }
        let mtu = cfg.mtu.unwrap_or(self.cfg.mtu);
        if !MTU_RANGE.contains(&mtu) {
            return Err(SwitchError::BadMtu(mtu));
        }
        check_vlans(&cfg.vlan)?;
        let id = self.ports.len() as PortId;
        let mut cfg = cfg;
        if self.cfg.mode == Mode::L3 && !cfg.policy.uplink {
            for ip in &cfg.policy.ips {
                if let Some(o) = self.l3.owner(*ip) {
                    let owner = self.port_name(o).unwrap_or("?").to_string();
                    return Err(SwitchError::AddressInUse { ip: *ip, owner });
                }
            }
            cfg.policy.learn_ips |= cfg.policy.ips.is_empty();
        }
        // Mirrors: the ports this one watches, and the mirror that watches it.
        let mut watched = Vec::new();
        for n in &cfg.policy.mirror_of {
            let bad = |why| SwitchError::BadMirror { port: n.clone(), mirror: cfg.name.clone(), why };
            if *n == cfg.name {
                return Err(bad("a port cannot mirror itself"));
            }
            if let Some(w) = self.port_id(n) {
                if self.slot(w).is_some_and(|s| s.rules.mirrored_to.is_some()) {
                    return Err(bad("it already has a mirror"));
                }
                watched.push(w);
            }
        }
        let mirrored_to = self
            .ports
            .iter()
            .enumerate()
            .find(|(_, p)| p.as_ref().is_some_and(|p| p.rules.policy.mirror_of.contains(&cfg.name)))
            .map(|(i, _)| i as PortId);
        for w in watched {
            if let Some(s) = self.slot_mut(w) {
                s.rules.mirrored_to = Some(id);
            }
        }
        self.pool.grow(self.port_buffers());
        let n = self.ports.len() + 1;
        for s in self.ports.iter_mut().flatten() {
            s.held.ensure_ports(n);
        }
        self.pass_blocked.resize(self.ports.len() + 1, false);
        if let Some(v) = self.verdict.as_mut() {
            v.outputs.reserve(2 * (self.ports.len() + 1));
        }
        self.again.outputs.reserve(2 * (self.ports.len() + 1));
        self.dirty.reserve(self.ports.len() + 1);
        self.interest_changed.reserve(self.ports.len() + 1);
        let caps = port.caps();
        let dev_mac = port.mac();
        let tunnel = port.tunnel();
        if self.cfg.mode == Mode::L3 && !cfg.policy.uplink {
            for ip in &cfg.policy.ips {
                self.l3.own(*ip, id);
            }
        }
        if let Some(m) = cfg.policy.mac {
            // The station is this port's from now on: what was learned of it elsewhere goes.
            *self.locked.entry(m).or_insert(0) += 1;
            self.fib.forget_elsewhere(m, id);
        }
        self.note_fast(id);
        if let Some(m) = mirrored_to {
            self.note_fast(m);
        }
        for n in &cfg.policy.mirror_of {
            if let Some(w) = self.port_id(n) {
                self.note_fast(w);
            }
        }
        self.generation += 1;
        let storm_buckets = cfg.policy.storm.meters().map(crate::meter::Bucket::new);
        let rate_in = crate::meter::Bucket::new(cfg.policy.rate.meter(cfg.policy.rate.rate_in));
        let rate_out = crate::meter::Bucket::new(cfg.policy.rate.meter(cfg.policy.rate.rate_out));
        self.acl.bind(id, Some(&cfg.name));
        self.ports.push(Some(PortSlot {
            name: cfg.name,
            port,
            caps,
            rules: PortRules {
                vlan: cfg.vlan,
                mtu,
                guest_mac: cfg.policy.mac,
                policy: cfg.policy,
                mirrored_to,
                dev_mac,
                failed: None,
                tunnel,
            },
            counters: PortCounters::default(),
            classes: vec![ClassCounters::default(); self.classes.len()],
            watch: vec![Watch::default(); self.classes.len()],
            queue: ClassQueues::new(&self.class_caps()),
            seg_done: 0,
            held: HeldList::new(self.cfg.hold_len, self.ports.len() + 1),
            want_write: false,
            dirty: false,
            // The driver registers the port with `interest(id)` when it attaches it.
            reported: Interest { read: true, write: false },
            learn_full: false,
            captured: 0,
            storm: storm_buckets,
            rate_in,
            rate_paused_until_ms: None,
            rate_out,
            shaped_until_ms: None,
        }));
        self.note_evpn();
        Ok(id)
    }

    /// Changes port `name`'s rate limits, storm control and link-local forwarding to
    /// `policy`'s (its other settings stay). A bucket whose rate and burst stay keeps what
    /// it holds; a changed one starts full. The verdicts these settings mark change, so the
    /// generation moves on.
    pub fn set_port_limits(&mut self, name: &str, policy: &crate::PortPolicy) -> Result<(), SwitchError> {
        let id = self.port_id(name).ok_or_else(|| SwitchError::NoSuchPort(name.to_string()))?;
        let s = self.ports[id as usize].as_mut().expect("port_id returned a live port");
        let p = &mut s.rules.policy;
        (p.rate, p.storm, p.forward_link_local) = (policy.rate, policy.storm, policy.forward_link_local);
        for (b, m) in s.storm.iter_mut().zip(policy.storm.meters()) {
            b.set(m);
        }
        s.rate_in.set(policy.rate.meter(policy.rate.rate_in));
        if policy.rate.rate_in == 0 {
            s.rate_paused_until_ms = None;
        }
        s.rate_out.set(policy.rate.meter(policy.rate.rate_out));
        if policy.rate.rate_out == 0 && s.shaped_until_ms.take().is_some() && !s.dirty {
            s.dirty = true;
            self.dirty.push(id);
        }
        self.note_interest(id);
        self.note_fast(id);
        self.generation += 1;
        Ok(())
    }

    /// Detaches a port, dropping the frames queued for it, and returns it to the caller.
    pub fn remove_port(&mut self, name: &str) -> Result<(PortId, Box<dyn Port>), SwitchError> {
        let id = self.port_id(name).ok_or_else(|| SwitchError::NoSuchPort(name.to_string()))?;
        let mut slot = self.ports[id as usize].take().expect("port_id returned a live port");
        self.note_evpn();
        self.mdb.remove_port(id);
        if self.mdb.take_wrapped() {
            self.generation += 1;
        }
        slot.count_refused();
        while let Some(q) = slot.queue.pop_any() {
            slot.counters.tx_drops.add(DropCause::UnknownPort);
            self.pool.release(q.fid);
        }
        while !slot.held.is_empty() {
            let (fid, _) = slot.held.take(0);
            slot.counters.rx_drops.add(DropCause::UnknownPort);
            self.pool.release(fid);
            self.held_count -= 1;
        }
        // Frames it sent that waited for resolution are lost with it; frames waiting to
        // reach it are lost to their senders.
        let mut i = 0;
        while i < self.l3.pending.len() {
            let p = self.l3.pending[i];
            if p.from == id || p.out == id {
                self.l3.pending.remove(i);
                self.pool.release(p.fid);
                let c =
                    if p.from == id { &mut slot.counters } else { &mut self.slot_mut(p.from).expect("live").counters };
                c.rx_drops.add(DropCause::UnknownPort);
            } else {
                i += 1;
            }
        }
        self.l3.disown_port(id);
        if let Some(m) = slot.rules.policy.mac
            && let Some(n) = self.locked.get_mut(&m)
        {
            *n -= 1;
            if *n == 0 {
                self.locked.remove(&m);
            }
        }
        self.departed.accumulate(&slot.counters);
        self.acl.bind(id, None);
        for c in self.captures.iter_mut().flatten().filter(|c| c.port == id) {
            c.ended = true;
        }
        let mut unmirrored = Vec::new();
        for (i, s) in self.ports.iter_mut().enumerate() {
            if let Some(s) = s
                && s.rules.mirrored_to == Some(id)
            {
                s.rules.mirrored_to = None;
                unmirrored.push(i as PortId);
            }
        }
        self.generation += 1;
        self.note_fast(id);
        if let Some(m) = slot.rules.mirrored_to {
            self.note_fast(m);
        }
        for i in unmirrored {
            self.note_fast(i);
        }
        self.fib.forget_port(id);
        self.settle();
        // The buffers its queue needed go back (ports that come and go leak none).
        self.pool.shrink(self.port_buffers());
        Ok((id, slot.port))
    }

    /// Marks port `id` as failed, as when its device reports itself gone: it is no longer
    /// serviced, frames for it are dropped (`unknown_port`), and `sluice port list` shows
    /// why. For devices whose loss a driver notices outside `recv`/`send` (a veth deleted
    /// behind the switch's back on the kernel datapath).
    pub fn port_gone(&mut self, id: PortId, why: String) {
        self.fail_port(id, why);
        self.settle();
    }

    pub(super) fn fail_port(&mut self, id: PortId, why: String) {
        let Some(s) = self.ports.get_mut(id as usize).and_then(Option::as_mut) else { return };
        if s.rules.failed.is_some() {
            return;
        }
        s.rules.failed = Some(why);
        let mut freed = 0u64;
        while let Some(q) = s.queue.pop_any() {
            freed += 1;
            self.pool.release(q.fid);
        }
        s.counters.tx_drops.tx_error += freed;
        s.seg_done = 0;
        self.generation += 1;
        self.note_interest(id);
        self.note_fast(id);
        // The ports it mirrors go through the core from now on (see `fast_port`).
        let watched: Vec<PortId> = self
            .ports
            .iter()
            .enumerate()
            .filter(|(_, p)| p.as_ref().is_some_and(|p| p.rules.mirrored_to == Some(id)))
            .map(|(i, _)| i as PortId)
            .collect();
        for w in watched {
            self.note_fast(w);
        }
    }

    /// Lets every port check its device (see [`Port::tick`]); hands each change to `f`
    /// with the port's name, and counts it as a failover. Counts what the ports' devices
    /// refused for them meanwhile ([`Port::take_refused`]).
    pub fn tick_ports(&mut self, mut f: impl FnMut(&str, &str)) {
        let mut moved = Vec::new();
        for (i, s) in self.ports.iter_mut().enumerate() {
            let Some(s) = s else { continue };
            s.count_refused();
            if let Some(what) = s.port.tick() {
                s.counters.failovers += 1;
                f(&s.name, &what);
                moved.push(i as PortId);
            }
        }
        // Stations learned behind a port that changed device are learned anew, and the
        // stations on this side announce themselves through it.
        for id in moved {
            self.note_fast(id);
            self.generation += 1;
            self.fib.forget_port(id);
            if let Some(s) = self.slot_mut(id) {
                s.rules.dev_mac = s.port.mac();
            }
            if self.cfg.mode == Mode::L3 {
                self.l3.forget_neighbours();
            }
            self.announce(id);
        }
        self.settle();
    }

    /// Sends, through port `to` (an uplink that just changed device), a frame from every
    /// station on this side so the LAN's switches learn the new path at once: in Layer 2
    /// mode a RARP announcement from each learned MAC address (as QEMU and Open vSwitch's
    /// bonds do), in Layer 3 mode a gratuitous ARP or unsolicited neighbour advertisement
    /// for each guest address, from the uplink's MAC.
    fn announce(&mut self, to: PortId) {
        let Some(out) = self.slot(to) else { return };
        // A guest's VLAN: the one its untagged frames join.
        let vlan_of = |m: &VlanMode| m.ingress(None).map(|i| i.vid);
        let mut frames: Vec<(u16, Announce)> = Vec::new();
        match self.cfg.mode {
            Mode::L2 => {
                for (vlan, mac, e) in self.fib.entries() {
                    if e.port != to && out.rules.vlan.is_member(vlan) {
                        frames.push((vlan, Announce::Rarp(mac)));
                    }
                }
            }
            Mode::L3 => {
                let mac = out.rules.dev_mac.unwrap_or(self.cfg.router_mac);
                for (ip, p) in self.ip_owners() {
                    let Some(vlan) = self.slot(p).and_then(|s| vlan_of(&s.rules.vlan)) else { continue };
                    if out.rules.vlan.is_member(vlan) {
                        frames.push((vlan, Announce::Address(ip, mac)));
                    }
                }
            }
        }
        for (vlan, a) in frames {
            self.emit(to, vlan, |buf| match a {
                Announce::Rarp(mac) => neigh::write_rarp_announce(buf, mac),
                Announce::Address(IpAddr::V4(ip), mac) => {
                    neigh::write_arp(buf, 1, MacAddr::BROADCAST, mac, ip, MacAddr::default(), ip)
                }
                Announce::Address(IpAddr::V6(ip), mac) => {
                    let m = NdFields {
                        advert: true,
                        solicited: false,
                        src: ip,
                        dst: neigh::ALL_NODES,
                        target: ip,
                        lla: mac,
                    };
                    neigh::write_nd(buf, neigh::multicast_mac(neigh::ALL_NODES), mac, &m)
                }
            });
            if self.slot(to).is_some_and(|s| s.queue.is_full(self.gen_class)) {
                self.flush_port(to);
            }
        }
    }

    /// Adds a static MAC entry pointing at the named port.
    pub fn add_static_mac(&mut self, vlan: u16, mac: MacAddr, port: &str) -> Result<(), SwitchError> {
        if !(1..=4094).contains(&vlan) {
            return Err(SwitchError::BadVlan(vlan));
        }
        if mac.is_zero() {
            return Err(SwitchError::NotUnicast(mac, "zero"));
        }
        if mac.is_multicast() {
            return Err(SwitchError::NotUnicast(mac, if mac.is_broadcast() { "broadcast" } else { "multicast" }));
        }
        let id = self.port_id(port).ok_or_else(|| SwitchError::NoSuchPort(port.to_string()))?;
        if let Some(s) = self.slot(id)
            && self.claims_locked(&s.rules.policy, mac)
        {
            let owner = self.ports.iter().flatten().find(|p| p.rules.policy.mac == Some(mac)).map(|p| p.name.clone());
            return Err(SwitchError::MacLocked { mac, owner: owner.unwrap_or_default() });
        }
        self.fib.add_static(vlan, mac, id);
        Ok(())
    }

    /// The id of the port named `name`.
    pub fn port_id(&self, name: &str) -> Option<PortId> {
        self.ports.iter().position(|p| p.as_ref().is_some_and(|p| p.name == name)).map(|i| i as PortId)
    }

    /// The name of port `id`.
    pub fn port_name(&self, id: PortId) -> Option<&str> {
        self.slot(id).map(|s| s.name.as_str())
    }

    /// Where station `mac` of `vlan` is behind port `id` (a tunnel's remote endpoint),
    /// if the port knows more than the switch.
    pub fn port_endpoint(&self, id: PortId, vlan: u16, mac: MacAddr) -> Option<String> {
        self.slot(id)?.port.endpoint_of(vlan, mac)
    }

    /// Ids of attached ports.
    pub fn port_ids(&self) -> impl Iterator<Item = PortId> + '_ {
        self.ports.iter().enumerate().filter(|(_, p)| p.is_some()).map(|(i, _)| i as PortId)
    }

    /// Snapshot of one port.
    pub fn port_info(&self, id: PortId) -> Option<PortInfo> {
        let s = self.slot(id)?;
        Some(PortInfo {
            id,
            name: s.name.clone(),
            kind: s.port.kind(),
            vlan: s.rules.vlan.clone(),
            mtu: s.rules.mtu,
            caps: s.caps,
            counters: s.counters,
            queued: s.queue.len(),
            held: s.held.len(),
            paused: s.held.is_full(),
            classes: self
                .classes
                .iter()
                .enumerate()
                .map(|(c, k)| ClassInfo {
                    name: k.name.clone(),
                    lossless: k.lossless,
                    counters: s.classes[c],
                    queued: s.queue.class_len(c as u8),
                    stuck: s.watch[c].stuck,
                })
                .collect(),
            resolving: self.l3.pending.iter().filter(|p| p.from == id).count(),
            device_drops: s.port.device_drops(),
            link: s.port.link_state(),
            failed: s.rules.failed.clone(),
        })
    }

    /// Snapshots of all ports, in id order.
    pub fn ports(&self) -> Vec<PortInfo> {
        (0..self.ports.len() as PortId).filter_map(|id| self.port_info(id)).collect()
    }

    /// Counters of the ports removed since the last reset, added up.
    pub fn departed(&self) -> &PortCounters {
        &self.departed
    }

    /// Adds what a kernel datapath counted for a port that is removed (beside what the
    /// core counted for it, which [`Switch::remove_port`] adds itself).
    pub fn add_departed(&mut self, c: &PortCounters) {
        self.departed.accumulate(c);
    }

    /// Zeroes every port's counters (queued and held frames stay).
    pub fn reset_counters(&mut self) {
        self.departed = PortCounters::default();
        for s in self.ports.iter_mut().flatten() {
            s.counters = PortCounters::default();
        }
        self.fib.full_refusals = 0;
        self.fib.moves = 0;
        self.acl.reset_hits();
    }

    /// The capacity of each class's queue at an output.
    fn class_caps(&self) -> Vec<usize> {
        self.classes.iter().map(|c| c.queue_len.unwrap_or(self.cfg.queue_len)).collect()
    }

    /// Buffers a port needs: its queues full, its held list full, and one being read.
    fn port_buffers(&self) -> usize {
        self.class_caps().iter().sum::<usize>() + self.cfg.hold_len + 1
    }
}

fn check_vlans(mode: &VlanMode) -> Result<(), SwitchError> {
    let ok = |v: u16| (1..=4094).contains(&v);
    match mode {
        VlanMode::Access(v) if !ok(*v) => Err(SwitchError::BadVlan(*v)),
        VlanMode::Trunk { native: Some(n), .. } if !ok(*n) => Err(SwitchError::BadVlan(*n)),
        _ => Ok(()),
    }
}

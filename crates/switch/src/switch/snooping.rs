//! IGMP/MLD snooping in the switch: the group class a frame's key gets, the membership
//! messages the core reads and forwards, the querier's general queries, and the database
//! as shown. The rules are [`crate::decide`]'s; the state is [`crate::mdb`]'s.

use std::net::IpAddr;

use super::Switch;
use super::lossless::Hold;
use crate::counters::DropCause;
use crate::decide::{self, Action, Key};
use crate::ids::PortId;
use crate::l3::Mode;
use crate::mdb::{GroupClass, Mdb, MdbEntry, SnoopCounters};
use crate::snoop::{self, Parsed, Target};
use crate::vlan::VlanMode;

/// A port's snooping state as shown.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouterPort {
    /// The port's name.
    pub port: String,
    /// Configured (`always`), or learned from queries with the time left (ms).
    pub learned_ms: Option<u64>,
}

/// The multicast database as `sluice mdb show` prints it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MdbView {
    /// Snooping is on.
    pub enabled: bool,
    /// It prunes (snooping on: from the start).
    pub pruning: bool,
    /// Memberships, with port names.
    pub groups: Vec<(MdbEntry, Vec<String>)>,
    /// Router ports.
    pub routers: Vec<RouterPort>,
    /// The querier per family (IPv4, IPv6): another one's address and port, or `None`:
    /// the switch queries itself.
    pub queriers: [Option<(IpAddr, String)>; 2],
    /// Per-port counters, by name.
    pub counters: Vec<(String, SnoopCounters)>,
}

impl Switch {
    /// The multicast database.
    pub fn mdb(&self) -> &Mdb {
        &self.mdb
    }

    /// The class of group frame `fid` in VLAN `vid` (Layer 2, snooping on).
    pub(super) fn group_class(&mut self, fid: u32, vid: u16, now_ms: u64) -> GroupClass {
        if self.cfg.mode != Mode::L2 || !self.mdb.config().enabled {
            return GroupClass::Flooded;
        }
        self.mdb.start(now_ms);
        match snoop::target(self.pool.frame(fid)) {
            Target::Flooded => GroupClass::Flooded,
            Target::Control => GroupClass::Control,
            Target::Group(g) => self.mdb.class(vid, g),
        }
    }

    /// Reads the IGMP or MLD message in frame `fid` from port `from` (decided by `key`),
    /// then forwards it: queries to every port, reports and leaves to router ports.
    pub(super) fn snoop_message(&mut self, from: PortId, fid: u32, key: &Key, now_ms: u64) {
        let vid = self.pool.meta(fid).vlan;
        let parsed = snoop::parse(self.pool.frame(fid));
        let fast = self.slot(from).is_some_and(|s| !s.rules.policy.uplink);
        let mut routers_changed = false;
        let forward_as = match parsed {
            Parsed::Malformed => {
                self.drop_rx(from, fid, DropCause::Malformed);
                return;
            }
            Parsed::Query { src, .. } => {
                routers_changed = self.mdb.heard_query(from, src, now_ms);
                GroupClass::Flooded
            }
            Parsed::Report { records, truncated } => {
                let mut leaves = 0;
                for (g, joins) in records {
                    if joins {
                        self.mdb.join(vid, g, from, now_ms);
                    } else {
                        leaves += 1;
                        self.mdb.leave(vid, g, from, fast);
                    }
                }
                self.mdb.note_report(from, leaves, truncated);
                GroupClass::Routers
            }
            Parsed::Other => GroupClass::Routers,
        };
        if routers_changed | self.mdb.take_wrapped() {
            self.generation += 1;
        }
        let k = Key { group: forward_as, ..*key };
        let mut v = std::mem::take(&mut self.again);
        decide::decide(&k, &self.tables(), &mut v);
        if forward_as == GroupClass::Routers && v.action == Action::Drop(DropCause::UnknownPort) {
            // A report with no router port to go to: read, and that is all (not a drop).
            if let Some(s) = self.slot_mut(from) {
                s.counters.consumed += 1;
            }
            self.pool.release(fid);
        } else {
            self.execute(from, fid, &k, &v, Hold::Never, now_ms);
        }
        self.again = v;
    }

    /// Ages the database and sends the general queries that are due.
    pub(super) fn snoop_expire(&mut self, now_ms: u64) {
        if self.cfg.mode != Mode::L2 || !self.mdb.config().enabled {
            return;
        }
        self.mdb.start(now_ms);
        let e = self.mdb.expire(now_ms);
        if e.changed | self.mdb.take_wrapped() {
            self.generation += 1;
        }
        if !(e.query_v4 || e.query_v6) {
            return;
        }
        let mac = self.cfg.router_mac;
        let ll = snoop::link_local(mac);
        let c = self.mdb.config();
        let (qi, resp) = ((c.query_interval_ms / 1000) as u32, c.query_response_ms as u32);
        let targets: Vec<(PortId, u16)> = self
            .ports
            .iter()
            .enumerate()
            .filter_map(|(i, s)| Some((i as PortId, s.as_ref()?)))
            .filter(|(_, s)| s.rules.failed.is_none() && s.rules.tunnel.is_none())
            .flat_map(|(i, s)| vlans(&s.rules.vlan).into_iter().map(move |v| (i, v)))
            .collect();
        for (p, vid) in targets {
            if e.query_v4 {
                self.emit(p, vid, |b| snoop::write_igmp_query(b, mac, qi, resp / 100));
            }
            if e.query_v6 {
                self.emit(p, vid, |b| snoop::write_mld_query(b, mac, ll, qi, resp));
            }
        }
        self.settle();
    }

    /// The database with port names, as shown.
    pub fn mdb_view(&self) -> MdbView {
        let now = self.now_ms;
        let name = |p: PortId| self.slot(p).map_or_else(|| format!("#{p}"), |s| s.name.clone());
        let groups = self
            .mdb
            .entries(now)
            .into_iter()
            .map(|e| {
                let names = e.ports.iter().map(|&(p, _)| name(p)).collect();
                (e, names)
            })
            .collect();
        let learned = self.mdb.learned_routers(now);
        let mut routers = Vec::new();
        for (i, s) in self.ports.iter().enumerate() {
            let Some(s) = s else { continue };
            let p = i as PortId;
            match s.rules.policy.mcast_router {
                crate::mdb::McastRouter::Always => routers.push(RouterPort { port: s.name.clone(), learned_ms: None }),
                crate::mdb::McastRouter::Never => {}
                crate::mdb::McastRouter::Auto => {
                    if let Some(&(_, left)) = learned.iter().find(|(q, _)| *q == p) {
                        routers.push(RouterPort { port: s.name.clone(), learned_ms: Some(left) });
                    }
                }
            }
        }
        let q = |v6| self.mdb.other_querier(v6).map(|o| (o.addr, name(o.port)));
        let counters = self
            .ports
            .iter()
            .enumerate()
            .filter_map(|(i, s)| Some((s.as_ref()?.name.clone(), self.mdb.counters(i as PortId))))
            .collect();
        MdbView {
            enabled: self.mdb.config().enabled,
            pruning: self.mdb.pruning(),
            groups,
            routers,
            queriers: [q(false), q(true)],
            counters,
        }
    }
}

/// The VLANs a port is a member of (its access VLAN, or its trunk's allowed and native).
fn vlans(m: &VlanMode) -> Vec<u16> {
    match m {
        VlanMode::Access(v) => vec![*v],
        VlanMode::Trunk { allowed, native } => {
            let mut v: Vec<u16> = allowed.iter().collect();
            if let Some(n) = native
                && !v.contains(n)
            {
                v.push(*n);
            }
            v
        }
    }
}

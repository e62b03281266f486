//! The multicast database: which ports joined which IP group in which VLAN (with expiry),
//! which ports lead to multicast routers, and the querier's state — what IGMP/MLD
//! snooping learns ([`crate::snoop`] reads the messages) and what the decision reads for a
//! group frame. docs/architecture.md, "IGMP/MLD snooping — design".
//!
//! A group's member ports are a *port set* with an id the database assigns; every change
//! of a group's members gives it a new id (ids are never reused), so a verdict made for
//! one set id is never wrong for another: a kernel datapath keyed by the id needs no
//! generation bump on a join or a leave.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;

use crate::ids::PortId;

/// Snooping's settings (per switch).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnoopConfig {
    /// Snooping on: group frames go to members and router ports only.
    pub enabled: bool,
    /// The switch's own general queries, when no other querier is heard (ms).
    pub query_interval_ms: u64,
    /// The maximum response time its queries announce (ms).
    pub query_response_ms: u64,
    /// A membership not reported again for this long is forgotten (ms).
    pub membership_ms: u64,
    /// Another querier (or a router port learned from its queries) is forgotten after
    /// this long without a query (ms).
    pub other_querier_ms: u64,
    /// Groups per switch (all VLANs); a report for one more is refused (`mdb_full`).
    pub max_groups: usize,
    /// Groups one port may be a member of.
    pub max_groups_per_port: usize,
}

impl Default for SnoopConfig {
    fn default() -> Self {
        // The Linux bridge's defaults (RFC 3376 §8): query interval 125 s, response 10 s,
        // membership 2 × 125 + 10 s, other querier present 2 × 125 + 10 / 2 s.
        SnoopConfig {
            enabled: true,
            query_interval_ms: 125_000,
            query_response_ms: 10_000,
            membership_ms: 260_000,
            other_querier_ms: 255_000,
            max_groups: 4096,
            max_groups_per_port: 256,
        }
    }
}

/// Whether a port leads to a multicast router (gets every group frame and every report).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum McastRouter {
    /// When a query is heard on it (until `other_querier_ms` passes without one).
    #[default]
    Auto,
    /// Always.
    Always,
    /// Never, even when queries are heard on it.
    Never,
}

/// A group's entry.
#[derive(Clone, Debug)]
struct Group {
    /// Member port → when its membership expires (ms; `u64::MAX` never).
    ports: BTreeMap<PortId, u64>,
    /// The id of its current port set.
    set: u32,
}

/// Another querier heard, per family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OtherQuerier {
    /// Its address.
    pub addr: IpAddr,
    /// The port it was heard on.
    pub port: PortId,
    /// When it is considered gone (ms).
    pub until_ms: u64,
}

/// Per-port snooping counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SnoopCounters {
    /// Reports read (each message once).
    pub reports: u64,
    /// Leaves (IGMPv2 leave, MLD done, a v3 record leaving).
    pub leaves: u64,
    /// Queries heard.
    pub queries: u64,
    /// Joins refused because the database (or the port's share of it) was full.
    pub mdb_full: u64,
    /// Records beyond a message's bound, not read.
    pub truncated: u64,
}

/// One membership as shown (`sluice mdb show`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MdbEntry {
    /// The VLAN.
    pub vlan: u16,
    /// The group.
    pub group: IpAddr,
    /// Its port set's id.
    pub set: u32,
    /// Member ports and the time left of each membership (ms).
    pub ports: Vec<(PortId, u64)>,
}

/// What the decision needs of the database for a group frame.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum GroupClass {
    /// Not a group the switch snoops (or snooping is off): flooded.
    #[default]
    Flooded,
    /// An IGMP or MLD message: the core reads it first.
    Control,
    /// A snooped group with no member in the frame's VLAN.
    Unregistered,
    /// A registered group: its port set's id.
    Set(u32),
    /// Reports and leaves the core forwards after reading them: router ports only.
    Routers,
}

/// The multicast database of one switch.
#[derive(Debug)]
pub struct Mdb {
    cfg: SnoopConfig,
    groups: HashMap<(u16, IpAddr), Group>,
    /// Port set id → its ports (sorted).
    sets: HashMap<u32, Vec<PortId>>,
    next_set: u32,
    /// Groups per port.
    per_port: HashMap<PortId, usize>,
    /// Router ports learned from queries → until when (ms).
    learned_routers: BTreeMap<PortId, u64>,
    /// Other queriers, IPv4 and IPv6.
    others: [Option<OtherQuerier>; 2],
    /// When the switch sends its next general queries (ms); `None` before the first clock.
    next_query_ms: Option<u64>,
    counters: HashMap<PortId, SnoopCounters>,
    /// The last [`Mdb::expire`] (ms).
    checked_ms: u64,
    /// Groups whose port set changed since the last [`Mdb::take_changes`], while a
    /// kernel datapath follows.
    changed: Option<Vec<(u16, IpAddr)>>,
    /// Set ids started again from [`FIRST_SET`] since [`Mdb::take_wrapped`].
    wrapped: bool,
}

/// The first port set id: ids below are the kernel's classes (`GCLASS_*`).
pub const FIRST_SET: u32 = 16;

impl Mdb {
    /// An empty database with settings `cfg`.
    pub fn new(cfg: SnoopConfig) -> Self {
        Mdb {
            cfg,
            groups: HashMap::new(),
            sets: HashMap::new(),
            next_set: FIRST_SET,
            per_port: HashMap::new(),
            learned_routers: BTreeMap::new(),
            others: [None, None],
            next_query_ms: None,
            counters: HashMap::new(),
            checked_ms: 0,
            changed: None,
            wrapped: false,
        }
    }

    /// The settings.
    pub fn config(&self) -> &SnoopConfig {
        &self.cfg
    }

    /// Whether snooping prunes: whenever it is on, from the switch's first frame (the
    /// Linux bridge with its own querier, less the bridge's delay after the querier
    /// starts). No clock moves it, so no timer moves the switch's generation at start; a
    /// membership made before the switch started is learned from the answer to its first
    /// general query, sent at start.
    pub fn pruning(&self) -> bool {
        self.cfg.enabled
    }

    /// The class of a frame to IP group `g` in VLAN `vid` (a snooped group).
    pub fn class(&self, vid: u16, g: IpAddr) -> GroupClass {
        match self.groups.get(&(vid, g)) {
            Some(e) => GroupClass::Set(e.set),
            None => GroupClass::Unregistered,
        }
    }

    /// Port set `id`'s ports (empty for an id no group holds any more).
    pub fn set(&self, id: u32) -> &[PortId] {
        self.sets.get(&id).map_or(&[], Vec::as_slice)
    }

    /// Whether port `p` (whose setting is `mode`) is a router port now.
    pub fn is_router(&self, p: PortId, mode: McastRouter) -> bool {
        match mode {
            McastRouter::Always => true,
            McastRouter::Never => false,
            McastRouter::Auto => self.learned_routers.contains_key(&p),
        }
    }

    /// Port `p`'s counters.
    pub fn counters(&self, p: PortId) -> SnoopCounters {
        self.counters.get(&p).copied().unwrap_or_default()
    }

    /// The other querier heard for IPv4 (`v6` false) or IPv6, if one is present.
    pub fn other_querier(&self, v6: bool) -> Option<OtherQuerier> {
        self.others[usize::from(v6)]
    }

    fn count(&mut self, p: PortId) -> &mut SnoopCounters {
        self.counters.entry(p).or_default()
    }

    /// Starts the clock at `now_ms` if it has not started: the first queries are due at
    /// once.
    pub fn start(&mut self, now_ms: u64) {
        if self.next_query_ms.is_none() {
            self.next_query_ms = Some(now_ms);
        }
    }

    /// Gives the group at `k` a new port set id for its current ports (or removes it when
    /// it has none).
    fn renumber(&mut self, k: (u16, IpAddr)) {
        let Some(g) = self.groups.get_mut(&k) else { return };
        if let Some(c) = self.changed.as_mut() {
            c.push(k);
        }
        self.sets.remove(&g.set);
        if g.ports.is_empty() {
            self.groups.remove(&k);
            return;
        }
        g.set = self.next_set;
        self.next_set = self.next_set.checked_add(1).unwrap_or_else(|| {
            // Ids start again: a verdict made for an old one must not be found.
            self.wrapped = true;
            FIRST_SET
        });
        self.sets.insert(g.set, g.ports.keys().copied().collect());
    }

    /// Whether set ids started again since the last call (the switch then moves its
    /// generation, so that no verdict of an old id is used).
    pub fn take_wrapped(&mut self) -> bool {
        std::mem::take(&mut self.wrapped)
    }

    /// Records the groups whose port set changes from now on, every group there is
    /// included (a kernel datapath starts following).
    pub fn track_changes(&mut self) {
        self.changed = Some(self.groups.keys().copied().collect());
    }

    /// Hands the groups whose port set changed since the last call to `f`.
    pub fn take_changes(&mut self, mut f: impl FnMut(u16, IpAddr)) {
        if let Some(c) = self.changed.as_mut() {
            c.sort_unstable();
            c.dedup();
            for &(v, g) in c.iter() {
                f(v, g);
            }
            c.clear();
        }
    }

    /// Port `p` reports membership of `g` in `vid` at `now_ms`. False when refused: the
    /// database, or the port's share of it, is full.
    pub fn join(&mut self, vid: u16, g: IpAddr, p: PortId, now_ms: u64) -> bool {
        let until = now_ms.saturating_add(self.cfg.membership_ms);
        let k = (vid, g);
        if let Some(e) = self.groups.get_mut(&k)
            && let Some(t) = e.ports.get_mut(&p)
        {
            *t = until;
            return true;
        }
        let mine = self.per_port.get(&p).copied().unwrap_or(0);
        if mine >= self.cfg.max_groups_per_port
            || (!self.groups.contains_key(&k) && self.groups.len() >= self.cfg.max_groups)
        {
            self.count(p).mdb_full += 1;
            return false;
        }
        *self.per_port.entry(p).or_default() += 1;
        self.groups.entry(k).or_insert_with(|| Group { ports: BTreeMap::new(), set: 0 }).ports.insert(p, until);
        self.renumber(k);
        true
    }

    /// Port `p` leaves `g` in `vid`: at once with `fast` (a port with one host behind it),
    /// else its membership ages as it would (hosts behind it answer the next query).
    pub fn leave(&mut self, vid: u16, g: IpAddr, p: PortId, fast: bool) {
        if !fast {
            return;
        }
        let k = (vid, g);
        if self.groups.get_mut(&k).and_then(|e| e.ports.remove(&p)).is_some() {
            self.drop_share(p);
            self.renumber(k);
        }
    }

    fn drop_share(&mut self, p: PortId) {
        if let Some(n) = self.per_port.get_mut(&p) {
            *n -= 1;
            if *n == 0 {
                self.per_port.remove(&p);
            }
        }
    }

    /// Counts a report from `p` (with `truncated` records not read).
    pub fn note_report(&mut self, p: PortId, leaves: usize, truncated: usize) {
        let c = self.count(p);
        c.reports += 1;
        c.leaves += leaves as u64;
        c.truncated += truncated as u64;
    }

    /// A query from `src` heard on port `p` at `now_ms`: the port leads to a querier (a
    /// router port, unless configured `never` — the caller asks [`Mdb::is_router`]), and
    /// the switch stops querying in that family while it is heard. Returns whether the
    /// set of router ports changed.
    pub fn heard_query(&mut self, p: PortId, src: IpAddr, now_ms: u64) -> bool {
        self.count(p).queries += 1;
        let until = now_ms.saturating_add(self.cfg.other_querier_ms);
        let f = usize::from(src.is_ipv6());
        // The lowest address is the querier (RFC 3376 §6.6.2); the switch's own yields to
        // any it hears.
        let keep = matches!(self.others[f], Some(o) if o.addr < src && o.until_ms > now_ms);
        if !keep {
            self.others[f] = Some(OtherQuerier { addr: src, port: p, until_ms: until });
        } else if let Some(o) = self.others[f].as_mut().filter(|o| o.addr == src) {
            o.until_ms = until;
        }
        self.learned_routers.insert(p, until).is_none()
    }

    /// Forgets port `p` (removed from the switch): its memberships, router state and
    /// counters.
    pub fn remove_port(&mut self, p: PortId) {
        let keys: Vec<_> = self.groups.iter().filter(|(_, g)| g.ports.contains_key(&p)).map(|(k, _)| *k).collect();
        for k in keys {
            if let Some(g) = self.groups.get_mut(&k) {
                g.ports.remove(&p);
            }
            self.renumber(k);
        }
        self.per_port.remove(&p);
        self.learned_routers.remove(&p);
        self.counters.remove(&p);
    }

    /// Ages memberships, router ports and other queriers at `now_ms`. Returns whether the
    /// router ports changed (what verdicts depend on besides set ids), and whether queries
    /// are due (then the next ones are scheduled).
    pub fn expire(&mut self, now_ms: u64) -> Expired {
        self.checked_ms = now_ms;
        let mut gone = Vec::new();
        for (k, g) in &mut self.groups {
            let before = g.ports.len();
            let mut left = Vec::new();
            g.ports.retain(|p, t| {
                let keep = *t > now_ms;
                if !keep {
                    left.push(*p);
                }
                keep
            });
            if g.ports.len() != before {
                gone.push((*k, left));
            }
        }
        for (k, left) in gone {
            for p in left {
                self.drop_share(p);
            }
            self.renumber(k);
        }
        let routers_before = self.learned_routers.len();
        self.learned_routers.retain(|_, t| *t > now_ms);
        for o in &mut self.others {
            if o.is_some_and(|o| o.until_ms <= now_ms) {
                *o = None;
            }
        }
        let mut queries = [false; 2];
        if self.cfg.enabled
            && let Some(next) = self.next_query_ms
            && now_ms >= next
        {
            queries = [self.others[0].is_none(), self.others[1].is_none()];
            self.next_query_ms = Some(now_ms.saturating_add(self.cfg.query_interval_ms));
        }
        Expired { changed: routers_before != self.learned_routers.len(), query_v4: queries[0], query_v6: queries[1] }
    }

    /// When [`Mdb::expire`] has work next (ms), if ever.
    pub fn next_deadline_ms(&self) -> Option<u64> {
        if !self.cfg.enabled {
            return None;
        }
        let mut at = self.next_query_ms?;
        // Memberships, router ports and queriers are aged at least once a second.
        if !self.groups.is_empty() || !self.learned_routers.is_empty() || self.others.iter().any(Option::is_some) {
            at = at.min(self.checked_ms.saturating_add(1000));
        }
        Some(at)
    }

    /// Every membership, by VLAN and group, with the time left at `now_ms`.
    pub fn entries(&self, now_ms: u64) -> Vec<MdbEntry> {
        let mut v: Vec<MdbEntry> = self
            .groups
            .iter()
            .map(|(&(vlan, group), g)| MdbEntry {
                vlan,
                group,
                set: g.set,
                ports: g.ports.iter().map(|(&p, &t)| (p, t.saturating_sub(now_ms))).collect(),
            })
            .collect();
        v.sort_by_key(|a| (a.vlan, a.group));
        v
    }

    /// Learned router ports and the time left of each (ms).
    pub fn learned_routers(&self, now_ms: u64) -> Vec<(PortId, u64)> {
        self.learned_routers.iter().map(|(&p, &t)| (p, t.saturating_sub(now_ms))).collect()
    }
}

/// What [`Mdb::expire`] found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Expired {
    /// Router ports changed: verdicts may differ.
    pub changed: bool,
    /// General queries are due in IPv4 (no other querier heard).
    pub query_v4: bool,
    /// … and in IPv6.
    pub query_v6: bool,
}

#[cfg(test)]
mod tests {
    //! Joins, leaves and aging with a clock the tests move; the querier's election.

    use super::*;

    fn g(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn mdb() -> Mdb {
        let mut m = Mdb::new(SnoopConfig {
            membership_ms: 5_000,
            query_interval_ms: 2_000,
            query_response_ms: 1_000,
            ..SnoopConfig::default()
        });
        m.start(0);
        m
    }

    #[test]
    fn a_join_registers_and_every_change_is_a_new_set() {
        let mut m = mdb();
        assert_eq!(m.class(1, g("239.1.2.3")), GroupClass::Unregistered);
        assert!(m.join(1, g("239.1.2.3"), 2, 0));
        let GroupClass::Set(a) = m.class(1, g("239.1.2.3")) else { panic!("registered") };
        assert_eq!(m.set(a), [2]);
        assert_eq!(m.class(2, g("239.1.2.3")), GroupClass::Unregistered, "per VLAN");
        assert!(m.join(1, g("239.1.2.3"), 2, 100), "a refresh");
        assert_eq!(m.class(1, g("239.1.2.3")), GroupClass::Set(a), "a refresh keeps the set");
        m.join(1, g("239.1.2.3"), 4, 100);
        let GroupClass::Set(b) = m.class(1, g("239.1.2.3")) else { panic!() };
        assert_ne!(a, b);
        assert_eq!(m.set(b), [2, 4]);
        assert!(m.set(a).is_empty(), "the old id names nothing");
        m.leave(1, g("239.1.2.3"), 4, true);
        let GroupClass::Set(c) = m.class(1, g("239.1.2.3")) else { panic!() };
        assert!(c != a && c != b && m.set(c) == [2]);
        m.leave(1, g("239.1.2.3"), 2, false);
        assert_eq!(m.class(1, g("239.1.2.3")), GroupClass::Set(c), "a slow leave waits for aging");
        m.leave(1, g("239.1.2.3"), 2, true);
        assert_eq!(m.class(1, g("239.1.2.3")), GroupClass::Unregistered);
    }

    #[test]
    fn set_ids_that_start_again_say_so() {
        let mut m = mdb();
        m.next_set = u32::MAX;
        m.join(1, g("239.1.2.3"), 2, 0);
        assert_eq!(m.class(1, g("239.1.2.3")), GroupClass::Set(u32::MAX));
        assert!(m.take_wrapped(), "the next id is one given before");
        m.join(1, g("239.1.2.3"), 3, 0);
        assert_eq!(m.class(1, g("239.1.2.3")), GroupClass::Set(FIRST_SET));
        assert!(!m.take_wrapped());
    }

    #[test]
    fn memberships_age_unless_reported_again() {
        let mut m = mdb();
        m.join(1, g("ff0e::1:3"), 2, 0);
        m.join(1, g("ff0e::1:3"), 3, 3_000);
        m.expire(4_999);
        assert!(matches!(m.class(1, g("ff0e::1:3")), GroupClass::Set(s) if m.set(s) == [2, 3]));
        m.expire(5_000);
        assert!(matches!(m.class(1, g("ff0e::1:3")), GroupClass::Set(s) if m.set(s) == [3]));
        assert_eq!(m.entries(5_000)[0].ports, [(3, 3_000)]);
        m.expire(8_000);
        assert_eq!(m.class(1, g("ff0e::1:3")), GroupClass::Unregistered);
        assert!(m.entries(8_000).is_empty() && m.per_port.is_empty());
    }

    #[test]
    fn the_database_and_each_port_are_bounded() {
        let mut m = Mdb::new(SnoopConfig { max_groups: 3, max_groups_per_port: 2, ..SnoopConfig::default() });
        assert!(m.join(1, g("239.0.0.1"), 1, 0) && m.join(1, g("239.0.0.2"), 1, 0));
        assert!(!m.join(1, g("239.0.0.3"), 1, 0), "the port's share");
        assert!(m.join(1, g("239.0.0.3"), 2, 0));
        assert!(!m.join(1, g("239.0.0.4"), 2, 0), "the switch's bound");
        assert!(m.join(1, g("239.0.0.1"), 2, 0), "an existing group takes another port");
        assert_eq!(m.counters(1).mdb_full + m.counters(2).mdb_full, 2);
    }

    #[test]
    fn snooping_prunes_from_the_start_and_no_timer_changes_what_verdicts_read() {
        let mut m = Mdb::new(SnoopConfig { query_response_ms: 1_000, ..SnoopConfig::default() });
        assert!(m.pruning(), "before the clock starts");
        m.start(0);
        assert!(m.join(1, g("239.1.2.3"), 2, 0));
        // Every second of the first response intervals (and well past them): queries go
        // out at start, but nothing a verdict reads changes.
        for t in (0..=30_000).step_by(1_000) {
            let e = m.expire(t);
            assert!(!e.changed, "a verdict changed at {t} ms");
            assert_eq!(e.query_v4, t == 0, "queries at start only, at {t} ms");
            assert!(m.pruning());
        }
        assert!(matches!(m.class(1, g("239.1.2.3")), GroupClass::Set(s) if m.set(s) == [2]));
        let off = Mdb::new(SnoopConfig { enabled: false, ..SnoopConfig::default() });
        assert!(!off.pruning(), "snooping off floods");
    }

    #[test]
    fn the_switch_queries_until_another_querier_is_heard() {
        let mut m = mdb();
        let e = m.expire(0);
        assert!(e.query_v4 && e.query_v6, "queries at once");
        assert!(!m.expire(1_500).query_v4, "not before the interval");
        assert!(m.expire(2_000).query_v4);
        assert!(m.heard_query(5, g("10.0.0.9"), 2_100), "a new router port");
        assert!(m.is_router(5, McastRouter::Auto) && !m.is_router(5, McastRouter::Never));
        let e = m.expire(4_000);
        assert!(!e.query_v4 && e.query_v6, "yields in IPv4 only");
        // A lower address takes over; a higher one does not.
        m.heard_query(6, g("10.0.0.1"), 4_100);
        m.heard_query(7, g("10.0.0.5"), 4_200);
        assert_eq!(m.other_querier(false).map(|o| o.port), Some(6));
        // The other querier goes quiet: the router ports age and the switch queries again.
        let e = m.expire(4_100 + 255_000);
        assert!(e.changed && e.query_v4);
        assert!(!m.is_router(5, McastRouter::Auto));
        assert!(m.other_querier(false).is_none());
    }
}

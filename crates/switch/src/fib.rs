//! The Layer 2 forwarding table: (VLAN, MAC) → port, learned from source addresses and
//! forgotten after the aging time; static entries never age and are never moved by
//! learning (a frame from another port claiming one is the caller's to drop:
//! [`Learn::Static`]).
//!
//! Times are milliseconds from an arbitrary origin supplied by the caller; the table
//! holds no clock. The table is bounded: when full, new stations are not learned (their
//! frames are flooded) and the refusal is counted. So is each port's share: a port may have
//! at most a given number of learned stations behind it, so one guest that sends from
//! random source addresses cannot take the table from the others.

use std::collections::HashMap;

use sluice_wire::MacAddr;

use crate::events::{EventQueue, StationChange, StationEvent};
use crate::ids::PortId;

/// One table entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FibEntry {
    /// Port the station is behind.
    pub port: PortId,
    /// When a frame from the station was last seen (ms), for aging.
    pub last_seen_ms: u64,
    /// Configured, not learned: never ages, never moves.
    pub is_static: bool,
    /// Installed from another host's route (EVPN), not learned: never ages; a frame from a
    /// local port moves it as it moves a learned station ([`Fib::add_remote`]).
    pub remote: bool,
}

/// What [`Fib::learn_limited`] did with a source address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Learn {
    /// The station is behind the port now: learned, refreshed, moved, or the port's own
    /// static entry.
    Ok,
    /// Not learned: the port already has as many learned stations as it may. `known`: the
    /// station stays learned behind another port.
    PortFull {
        /// The station is learned behind another port.
        known: bool,
    },
    /// Not learned: the table is full (counted in `full_refusals`).
    TableFull,
    /// A group or all-zero address, which no table learns.
    Ignored,
    /// The address is a static entry of another port: nothing moved, and the frame claims
    /// a station that is not behind the port it came from.
    Static,
}

/// A table key: a VLAN and a MAC address in one word, so that the table's hash (the
/// standard library's, keyed at random against chosen collisions) reads one word per
/// lookup rather than three pieces.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct StationKey(u64);

impl StationKey {
    fn new(vlan: u16, mac: MacAddr) -> Self {
        let m = mac.0;
        StationKey(u64::from_be_bytes([(vlan >> 8) as u8, vlan as u8, m[0], m[1], m[2], m[3], m[4], m[5]]))
    }

    fn vlan(self) -> u16 {
        (self.0 >> 48) as u16
    }

    fn mac(self) -> MacAddr {
        let b = self.0.to_be_bytes();
        MacAddr([b[2], b[3], b[4], b[5], b[6], b[7]])
    }
}

/// The learning table.
pub struct Fib {
    map: HashMap<StationKey, FibEntry>,
    max_entries: usize,
    aging_ms: u64,
    /// Stations not learned because the table was full.
    pub full_refusals: u64,
    /// Stations that moved from one port to another.
    pub moves: u64,
    /// Learned (not static) entries per port.
    per_port: HashMap<PortId, usize>,
    /// Keys whose port changed (added, moved, removed) since the last
    /// [`Fib::take_changes`], when a kernel datapath follows the table.
    changed: Option<Vec<(u16, MacAddr)>>,
    /// Ports whose count of learned stations changed since the last
    /// [`Fib::take_count_changes`], when tracking.
    count_changed: Option<Vec<PortId>>,
    /// The per-port limit whose crossings [`Fib::epoch`] counts.
    watched_limit: usize,
    /// Times the table became full or stopped being full, or a port's learned stations
    /// reached the watched limit or fell below it.
    epoch: u64,
    /// Stations learned, moved and forgotten, when a driver listens
    /// ([`Fib::record_events`]).
    events: Option<EventQueue>,
}

impl Fib {
    /// A table holding at most `max_entries`, forgetting learned entries after `aging_ms`.
    pub fn new(max_entries: usize, aging_ms: u64) -> Self {
        Fib {
            map: HashMap::with_capacity(max_entries.min(1 << 16)),
            max_entries,
            aging_ms,
            full_refusals: 0,
            moves: 0,
            per_port: HashMap::new(),
            changed: None,
            count_changed: None,
            watched_limit: usize::MAX,
            epoch: 0,
            events: None,
        }
    }

    /// Starts recording what happens to stations, at most `cap` events waiting (more are
    /// dropped and counted): see [`Fib::take_events`].
    pub fn record_events(&mut self, cap: usize) {
        self.events.get_or_insert_with(|| EventQueue::new(cap));
    }

    /// Hands over the stations' events since the last call, oldest first; returns how many
    /// were lost because the queue was full.
    pub fn take_events(&mut self, f: impl FnMut(StationEvent)) -> u64 {
        self.events.as_mut().map_or(0, |q| q.drain(f))
    }

    /// True when events (or a count of lost ones) wait.
    pub fn has_events(&self) -> bool {
        self.events.as_ref().is_some_and(|q| !q.is_empty())
    }

    fn event(&mut self, change: StationChange, vlan: u16, mac: MacAddr, e: &FibEntry) {
        if let Some(q) = self.events.as_mut() {
            q.push(StationEvent { change, vlan, mac, port: e.port, is_static: e.is_static });
        }
    }

    /// Counts in [`Fib::epoch`] every time a port's learned stations reach `limit` or fall
    /// below it.
    pub fn watch_port_limit(&mut self, limit: usize) {
        self.watched_limit = limit;
    }

    /// Moves whenever the table becomes full or stops being full, or a port's learned
    /// stations reach the watched limit ([`Fib::watch_port_limit`]) or fall below it: what
    /// a decision about a station the table does not hold depends on. Learning, moving or
    /// forgetting a station moves it only when it crosses one of those.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// True when no new station can be learned.
    pub fn is_full(&self) -> bool {
        self.map.len() >= self.max_entries
    }

    /// Counts a crossing of the table's fullness since it was `was_full`.
    fn note_full(&mut self, was_full: bool) {
        if was_full != self.is_full() {
            self.epoch += 1;
        }
    }

    /// The aging time in milliseconds.
    pub fn aging_ms(&self) -> u64 {
        self.aging_ms
    }

    /// Changes the aging time.
    pub fn set_aging_ms(&mut self, aging_ms: u64) {
        self.aging_ms = aging_ms;
    }

    /// Starts recording which entries change (see [`Fib::take_changes`]).
    pub fn track_changes(&mut self) {
        self.changed.get_or_insert_with(Vec::new);
        self.count_changed.get_or_insert_with(Vec::new);
    }

    /// Hands over the ports whose number of learned stations changed since the last call
    /// (each once), when tracking.
    pub fn take_count_changes(&mut self, mut f: impl FnMut(PortId)) {
        let Some(c) = self.count_changed.as_mut() else { return };
        c.sort_unstable();
        c.dedup();
        for &p in c.iter() {
            f(p);
        }
        c.clear();
    }

    /// Hands over the keys whose port changed since the last call (each once), when
    /// tracking: their entry now is [`Fib::get`]'s.
    pub fn take_changes(&mut self, mut f: impl FnMut(u16, MacAddr)) {
        let Some(c) = self.changed.as_mut() else { return };
        c.sort_unstable();
        c.dedup();
        for &(vlan, mac) in c.iter() {
            f(vlan, mac);
        }
        c.clear();
    }

    /// Reports `mac` on `vlan` as changed (when tracking).
    pub fn add_changed(&mut self, vlan: u16, mac: MacAddr) {
        self.note(vlan, mac);
    }

    fn note(&mut self, vlan: u16, mac: MacAddr) {
        if let Some(c) = self.changed.as_mut() {
            c.push((vlan, mac));
        }
    }

    /// Records that `mac` on `vlan` was seen on `port` at `now_ms`.
    pub fn learn(&mut self, vlan: u16, mac: MacAddr, port: PortId, now_ms: u64) {
        self.learn_limited(vlan, mac, port, now_ms, usize::MAX);
    }

    /// Records that `mac` on `vlan` was seen on `port` at `now_ms`, unless that would put
    /// more than `port_limit` learned stations behind `port`, or `mac` is another port's
    /// static entry (see [`Learn`]; a full table is not a refusal: see `full_refusals`).
    pub fn learn_limited(&mut self, vlan: u16, mac: MacAddr, port: PortId, now_ms: u64, port_limit: usize) -> Learn {
        if mac.is_multicast() || mac.is_zero() {
            return Learn::Ignored;
        }
        let len = self.map.len();
        // (Looked up only for a new or moving station: a known one, the common case, costs
        // the one table lookup it always did.)
        let per_port = &self.per_port;
        let port_full = || per_port.get(&port).copied().unwrap_or(0) >= port_limit;
        let moved_from = match self.map.get_mut(&StationKey::new(vlan, mac)) {
            Some(e) if e.is_static && e.port == port => return Learn::Ok,
            Some(e) if e.is_static => return Learn::Static,
            Some(e) if e.port == port => {
                e.last_seen_ms = now_ms;
                return Learn::Ok;
            }
            Some(_) if port_full() => return Learn::PortFull { known: true },
            Some(e) => {
                let from = e.port;
                e.port = port;
                e.last_seen_ms = now_ms;
                // (A remote station was not counted behind its tunnel.)
                Some((from, !std::mem::take(&mut e.remote)))
            }
            // (The port's limit first: a kernel datapath, which cannot see how full the
            // table is, tells the two refusals apart the same way.)
            None if port_full() => return Learn::PortFull { known: false },
            None if len >= self.max_entries => {
                self.full_refusals += 1;
                return Learn::TableFull;
            }
            None => {
                self.map.insert(
                    StationKey::new(vlan, mac),
                    FibEntry { port, last_seen_ms: now_ms, is_static: false, remote: false },
                );
                self.note_full(false);
                None
            }
        };
        if let Some((from, counted)) = moved_from {
            self.moves += 1;
            if counted {
                self.count(from, false);
            }
        }
        if self.events.is_some() {
            let change = moved_from.map_or(StationChange::Learned, |(from, _)| StationChange::Moved { from });
            self.event(change, vlan, mac, &FibEntry { port, last_seen_ms: now_ms, is_static: false, remote: false });
        }
        self.count(port, true);
        self.note(vlan, mac);
        Learn::Ok
    }

    /// Learned stations behind `port` now.
    pub fn learned_on(&self, port: PortId) -> usize {
        self.per_port.get(&port).copied().unwrap_or(0)
    }

    fn count(&mut self, port: PortId, up: bool) {
        if let Some(c) = self.count_changed.as_mut() {
            c.push(port);
        }
        let n = self.per_port.entry(port).or_insert(0);
        let before = *n;
        if up {
            *n += 1;
        } else {
            *n = n.saturating_sub(1);
        }
        let after = *n;
        if after == 0 {
            self.per_port.remove(&port);
        }
        if (before >= self.watched_limit) != (after >= self.watched_limit) {
            self.epoch += 1;
        }
    }

    /// Records that `mac` on `vlan` was seen on `port` at `now_ms` by a datapath that
    /// forwarded it without the core (a kernel datapath): the entry's age restarts if it
    /// still points at `port`; nothing is learned or moved.
    pub fn touch(&mut self, vlan: u16, mac: MacAddr, port: PortId, now_ms: u64) {
        if let Some(e) = self.map.get_mut(&StationKey::new(vlan, mac))
            && e.port == port
            && !e.is_static
        {
            e.last_seen_ms = e.last_seen_ms.max(now_ms);
        }
    }

    /// The entry for `mac` on `vlan`, expired or not.
    pub fn get(&self, vlan: u16, mac: MacAddr) -> Option<FibEntry> {
        self.map.get(&StationKey::new(vlan, mac)).copied()
    }

    /// The port behind `mac` on `vlan`, if known and not expired.
    pub fn lookup(&self, vlan: u16, mac: MacAddr, now_ms: u64) -> Option<PortId> {
        let e = self.map.get(&StationKey::new(vlan, mac))?;
        (e.is_static || e.remote || now_ms.saturating_sub(e.last_seen_ms) <= self.aging_ms).then_some(e.port)
    }

    /// Adds or replaces a static entry.
    pub fn add_static(&mut self, vlan: u16, mac: MacAddr, port: PortId) {
        let was_full = self.is_full();
        let entry = FibEntry { port, last_seen_ms: 0, is_static: true, remote: false };
        let old = self.map.insert(StationKey::new(vlan, mac), entry);
        if let Some(old) = old
            && !old.is_static
            && !old.remote
        {
            self.count(old.port, false);
        }
        if old.is_none_or(|o| o.port != port || !o.is_static) {
            self.event(StationChange::Learned, vlan, mac, &entry);
        }
        self.note_full(was_full);
        self.note(vlan, mac);
    }

    /// Removes an entry (static or learned); true if there was one.
    pub fn remove(&mut self, vlan: u16, mac: MacAddr) -> bool {
        let was_full = self.is_full();
        let Some(old) = self.map.remove(&StationKey::new(vlan, mac)) else { return false };
        self.note_full(was_full);
        self.event(StationChange::Removed, vlan, mac, &old);
        if !old.is_static && !old.remote {
            self.count(old.port, false);
        }
        self.note(vlan, mac);
        true
    }

    /// Puts station `mac` on `vlan` behind `port` (a tunnel) from another host's route:
    /// it never ages, and a frame from a local port moves it. A learned entry elsewhere is
    /// moved; a static one stays, and false says so. A full table refuses a new station
    /// (counted in `full_refusals`).
    pub fn add_remote(&mut self, vlan: u16, mac: MacAddr, port: PortId) -> bool {
        if mac.is_multicast() || mac.is_zero() {
            return false;
        }
        let was_full = self.is_full();
        let entry = FibEntry { port, last_seen_ms: 0, is_static: false, remote: true };
        let change = match self.map.get(&StationKey::new(vlan, mac)).copied() {
            Some(old) if old.is_static => return false,
            Some(old) if old.remote && old.port == port => return true,
            Some(old) => {
                if !old.remote {
                    self.count(old.port, false);
                }
                self.moves += u64::from(old.port != port);
                StationChange::Moved { from: old.port }
            }
            None if self.map.len() >= self.max_entries => {
                self.full_refusals += 1;
                return false;
            }
            None => StationChange::Learned,
        };
        self.map.insert(StationKey::new(vlan, mac), entry);
        self.event(change, vlan, mac, &entry);
        self.note_full(was_full);
        self.note(vlan, mac);
        true
    }

    /// Removes station `mac` on `vlan` if it is still the remote station [`Fib::add_remote`]
    /// put behind `port` (a local port may have taken it since); true if it was.
    pub fn remove_remote(&mut self, vlan: u16, mac: MacAddr, port: PortId) -> bool {
        match self.map.get(&StationKey::new(vlan, mac)) {
            Some(e) if e.remote && e.port == port => self.remove(vlan, mac),
            _ => false,
        }
    }

    /// Forgets the entries `drop` picks (`change` says why, to listeners).
    fn forget(&mut self, change: StationChange, drop: impl Fn(u16, MacAddr, &FibEntry) -> bool) {
        let mut gone = Vec::new();
        let mut freed = Vec::new();
        let tracking = self.changed.is_some();
        let was_full = self.is_full();
        let events = &mut self.events;
        self.map.retain(|k, e| {
            let d = drop(k.vlan(), k.mac(), e);
            if d && tracking {
                gone.push((k.vlan(), k.mac()));
            }
            if d && let Some(q) = events.as_mut() {
                q.push(StationEvent { change, vlan: k.vlan(), mac: k.mac(), port: e.port, is_static: e.is_static });
            }
            if d && !e.is_static && !e.remote {
                freed.push(e.port);
            }
            !d
        });
        self.note_full(was_full);
        for p in freed {
            self.count(p, false);
        }
        if let Some(c) = self.changed.as_mut() {
            c.extend(gone);
        }
    }

    /// Forgets learned entries older than the aging time.
    pub fn expire(&mut self, now_ms: u64) {
        let aging = self.aging_ms;
        self.forget(StationChange::Aged, |_, _, e| {
            !e.is_static && !e.remote && now_ms.saturating_sub(e.last_seen_ms) > aging
        });
    }

    /// Forgets every entry pointing at `port` (the port was removed).
    pub fn forget_port(&mut self, port: PortId) {
        self.forget(StationChange::Removed, |_, _, e| e.port == port);
    }

    /// Forgets what was learned of station `mac`, in every VLAN, behind ports other than
    /// `owner` (the station was just locked to `owner`).
    pub fn forget_elsewhere(&mut self, mac: MacAddr, owner: PortId) {
        self.forget(StationChange::Removed, |_, m, e| m == mac && !e.is_static && e.port != owner);
    }

    /// Forgets learned entries, keeping static ones.
    pub fn flush_learned(&mut self) {
        self.forget(StationChange::Removed, |_, _, e| !e.is_static && !e.remote);
    }

    /// Entries as (vlan, mac, entry), sorted by VLAN then MAC.
    pub fn entries(&self) -> Vec<(u16, MacAddr, FibEntry)> {
        let mut v: Vec<_> = self.map.iter().map(|(&k, &e)| (k.vlan(), k.mac(), e)).collect();
        v.sort_by_key(|&(vl, m, _)| (vl, m));
        v
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: MacAddr = MacAddr([2, 0, 0, 0, 0, 0xa]);

    #[test]
    fn learning_moving_aging_and_removal_are_told_in_order_and_a_full_queue_counts_its_losses() {
        let mut f = Fib::new(16, 1000);
        f.learn(1, A, 3, 0);
        f.record_events(4);
        f.learn(1, A, 3, 10);
        f.learn(1, A, 4, 20);
        f.learn(1, MacAddr::BROADCAST, 4, 20);
        f.expire(2000);
        f.add_static(2, A, 5);
        f.remove(2, A);
        let mut got = Vec::new();
        assert_eq!(f.take_events(|e| got.push((e.change, e.vlan, e.port, e.is_static))), 0);
        use StationChange::*;
        assert_eq!(
            got,
            [(Moved { from: 3 }, 1, 4, false), (Aged, 1, 4, false), (Learned, 2, 5, true), (Removed, 2, 5, true)],
            "a refresh and a group address say nothing"
        );
        for i in 0..10 {
            f.learn(1, MacAddr([2, 0, 0, 0, 2, i]), 1, 3000);
        }
        assert!(f.has_events());
        let mut n = 0;
        assert_eq!(f.take_events(|_| n += 1), 6, "4 kept, 6 counted lost");
        assert_eq!((n, f.len()), (4, 10), "learning itself went on");
        f.forget_port(1);
        assert_eq!(f.take_events(|e| assert_eq!(e.change, Removed)), 6, "10 forgotten, 4 told");
    }

    #[test]
    fn each_port_learns_at_most_its_limit_and_gets_room_back() {
        let mut f = Fib::new(16, 1000);
        let m = |i: u8| MacAddr([2, 0, 0, 0, 1, i]);
        for i in 0..3 {
            assert!(f.learn_limited(1, m(i), 7, 0, 2) == Learn::Ok || i == 2);
        }
        assert_eq!((f.learned_on(7), f.len()), (2, 2), "the third is refused");
        assert_eq!(
            f.learn_limited(1, m(0), 8, 0, 0),
            Learn::PortFull { known: true },
            "a move onto a full port is refused too"
        );
        assert_eq!(f.learn_limited(1, m(0), 8, 10, 2), Learn::Ok);
        assert_eq!((f.learned_on(7), f.learned_on(8), f.moves), (1, 1, 1));
        f.add_static(1, m(1), 8);
        assert_eq!(f.learned_on(7), 0, "a static entry is no one's share");
        assert!(f.remove(1, m(0)));
        assert_eq!(f.learned_on(8), 0);
        f.learn_limited(1, m(5), 7, 0, 2);
        f.expire(2000);
        assert_eq!(f.learned_on(7), 0, "aged entries give their place back");
    }

    #[test]
    fn learns_moves_and_ages() {
        let mut f = Fib::new(16, 1000);
        f.learn(1, A, 3, 0);
        assert_eq!(f.lookup(1, A, 500), Some(3));
        assert_eq!(f.lookup(2, A, 500), None, "VLANs have separate tables");
        f.learn(1, A, 4, 600);
        assert_eq!(f.moves, 1);
        assert_eq!(f.lookup(1, A, 1500), Some(4));
        assert_eq!(f.lookup(1, A, 1601), None);
        f.expire(1601);
        assert!(f.is_empty());
    }

    #[test]
    fn static_entries_neither_age_nor_move() {
        let mut f = Fib::new(16, 10);
        f.add_static(1, A, 7);
        assert_eq!(f.learn_limited(1, A, 8, 5, usize::MAX), Learn::Static, "claimed from another port");
        assert_eq!(f.learn_limited(1, A, 7, 5, usize::MAX), Learn::Ok, "from its own port");
        assert_eq!(f.learn_limited(2, A, 8, 5, usize::MAX), Learn::Ok, "static in VLAN 1 only");
        f.expire(1_000_000);
        assert_eq!(f.lookup(1, A, 1_000_000), Some(7));
    }

    #[test]
    fn a_locked_station_is_forgotten_everywhere_but_its_port() {
        let mut f = Fib::new(16, 1000);
        f.learn(1, A, 3, 0);
        f.learn(2, A, 4, 0);
        f.learn(3, A, 5, 0);
        f.add_static(4, A, 6);
        f.forget_elsewhere(A, 5);
        assert_eq!((f.get(1, A), f.get(2, A)), (None, None));
        assert_eq!(f.get(3, A).map(|e| e.port), Some(5));
        assert_eq!(f.get(4, A).map(|e| e.port), Some(6), "static entries are the operator's");
        assert_eq!((f.learned_on(3), f.learned_on(4)), (0, 0));
    }

    #[test]
    fn full_table_refuses_and_counts() {
        let mut f = Fib::new(1, 1000);
        f.learn(1, A, 1, 0);
        f.learn(1, MacAddr([2, 0, 0, 0, 0, 0xb]), 1, 0);
        assert_eq!(f.len(), 1);
        assert_eq!(f.full_refusals, 1);
    }

    #[test]
    fn changes_are_reported_once_each_and_refreshes_are_not_changes() {
        let mut f = Fib::new(16, 1000);
        f.track_changes();
        let b = MacAddr([2, 0, 0, 0, 0, 0xb]);
        f.learn(1, A, 3, 0);
        f.learn(1, A, 3, 10);
        f.learn(1, b, 3, 10);
        f.learn(1, A, 4, 20);
        let mut seen = Vec::new();
        f.take_changes(|v, m| seen.push((v, m)));
        assert_eq!(seen, vec![(1, A), (1, b)]);
        f.learn(1, A, 4, 30);
        f.touch(1, b, 3, 900);
        f.expire(1500);
        seen.clear();
        f.take_changes(|v, m| seen.push((v, m)));
        assert_eq!(seen, vec![(1, A)], "A aged out; b was touched in time");
        assert_eq!(f.get(1, b).map(|e| e.port), Some(3));
    }

    #[test]
    fn a_key_holds_its_vlan_and_address() {
        for (vlan, mac) in [(1, A), (4094, MacAddr([0xff; 6])), (0, MacAddr::default())] {
            let k = StationKey::new(vlan, mac);
            assert_eq!((k.vlan(), k.mac()), (vlan, mac));
        }
        assert_ne!(StationKey::new(1, A), StationKey::new(2, A));
    }

    #[test]
    fn never_learns_group_addresses() {
        let mut f = Fib::new(4, 1000);
        f.learn(1, MacAddr::BROADCAST, 1, 0);
        f.learn(1, MacAddr([1, 0, 0x5e, 0, 0, 1]), 1, 0);
        assert!(f.is_empty());
    }
}

//! EVPN's rules (docs/architecture.md, "EVPN: many hosts, one LAN"): of the routes other
//! hosts announce for a station and our own, which one holds; what to announce when a
//! station appears here; which endpoints each VNI floods to; and the bound on what peers
//! may install.
//!
//! Sans-IO: it is told of local stations and of received routes, and answers with
//! [`Action`]s — install or remove a remote station in the switch, announce or withdraw a
//! route, set a VNI's flood list. The caller (the daemon's EVPN agent) carries them out.
//!
//! MAC mobility (RFC 7432 §15): each route carries a sequence number. A station that
//! appears here while another host's route for it holds is announced with that route's
//! number plus one; a received route with a higher number than ours takes the station
//! away, and ours is withdrawn. A sticky route (a station configured, not learned) is
//! never taken by a non-sticky one. Between equal numbers the lower originator address
//! wins.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::net::IpAddr;

use sluice_wire::MacAddr;

/// Endpoints of one VNI's flood list at most; further type-3 routes are counted and not
/// used.
pub const MAX_FLOOD_ENDPOINTS: usize = 256;
/// How long a route whose session went down (or whose speaker is being reconnected) stays
/// installed, unless heard again: a session that flaps does not stop forwarding.
pub const STALE_MS: u64 = 60_000;

/// A type-2 route: station `mac` of `vni` is behind `endpoint`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MacRoute {
    /// The VNI.
    pub vni: u32,
    /// The station.
    pub mac: MacAddr,
    /// Its IP address, when the route binds one.
    pub ip: Option<IpAddr>,
    /// The endpoint it is behind (the route's next hop).
    pub endpoint: IpAddr,
    /// MAC mobility sequence number.
    pub seq: u32,
    /// A configured station, never moved by a route that is not sticky.
    pub sticky: bool,
}

/// A route heard from the speaker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Heard {
    /// A type-2 route announced (`true`) or withdrawn.
    Mac(MacRoute, bool),
    /// A type-3 route: `endpoint` floods `vni`, announced (`true`) or withdrawn.
    Flood {
        /// The VNI.
        vni: u32,
        /// The endpoint.
        endpoint: IpAddr,
        /// Announced, or withdrawn.
        up: bool,
    },
}

/// What the caller must do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Put station `mac` of `vni` behind the tunnel, sent to `endpoint`.
    Install {
        /// The VNI.
        vni: u32,
        /// The station.
        mac: MacAddr,
        /// Where frames to it go.
        endpoint: IpAddr,
    },
    /// Remove remote station `mac` of `vni` (if the switch still has it behind the
    /// tunnel: a local port may have taken it since).
    Uninstall {
        /// The VNI.
        vni: u32,
        /// The station.
        mac: MacAddr,
    },
    /// Announce local station `mac` of `vni` (replacing an earlier announcement of it).
    Announce {
        /// The VNI.
        vni: u32,
        /// The station.
        mac: MacAddr,
        /// Its sequence number.
        seq: u32,
        /// Configured here.
        sticky: bool,
    },
    /// Withdraw our route for `mac` of `vni`.
    Withdraw {
        /// The VNI.
        vni: u32,
        /// The station.
        mac: MacAddr,
    },
    /// `vni` floods to these endpoints now.
    Flood {
        /// The VNI.
        vni: u32,
        /// Its endpoints, sorted.
        endpoints: Vec<IpAddr>,
    },
}

/// Why a received route was not used, counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Routes received (announced or withdrawn).
    pub received: u64,
    /// Routes not installed because `max_routes` were (kept, installed when room frees).
    pub over_limit: u64,
    /// Routes for a station configured here, refused.
    pub claims_local: u64,
    /// Stations a received route took from here (the station moved to another host).
    pub moved_away: u64,
    /// Type-3 routes beyond a VNI's flood list bound.
    pub flood_over_limit: u64,
}

/// Our own announcement of a local station.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Local {
    seq: u32,
    sticky: bool,
}

/// A station's routes.
#[derive(Clone, Debug, Default)]
struct Station {
    /// Received, by originator endpoint.
    remote: BTreeMap<IpAddr, MacRoute>,
    /// Ours, while the station is here.
    local: Option<Local>,
    /// The endpoint the switch has it behind, when installed.
    installed: Option<IpAddr>,
}

impl Station {
    /// The received route that holds among the remote ones: the highest sequence number,
    /// sticky first, then the lowest originator.
    fn best_remote(&self) -> Option<&MacRoute> {
        self.remote.values().min_by_key(|r| (std::cmp::Reverse((r.sticky, r.seq)), r.endpoint))
    }

    /// Whether `r` takes the station from our own announcement `l`.
    fn beats_local(r: &MacRoute, l: Local) -> bool {
        match (r.sticky, l.sticky) {
            (false, true) => false,
            (true, false) => true,
            _ => r.seq > l.seq,
        }
    }
}

/// The routes of one switch's EVPN tunnel.
pub struct Table {
    stations: HashMap<(u32, MacAddr), Station>,
    flood: HashMap<u32, BTreeSet<IpAddr>>,
    max_routes: usize,
    installed: usize,
    /// Stations waiting for room to be installed, oldest first, and the same to look up.
    waiting: VecDeque<(u32, MacAddr)>,
    waiting_set: HashSet<(u32, MacAddr)>,
    /// Routes held after their session went down, and since when (ms): withdrawn when
    /// [`Table::expire_stale`] finds them older than [`STALE_MS`], unless heard again.
    stale: HashMap<Stale, u64>,
    /// Every endpoint a received route names, with how many do.
    endpoint_refs: HashMap<IpAddr, usize>,
    /// The set of endpoints changed since [`Table::take_endpoints_changed`].
    endpoints_changed: bool,
    /// What was refused or moved, counted.
    pub counters: Counters,
}

/// A received route, by what names it: (VNI, MAC, originator) or (VNI, originator).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RouteKey {
    /// A type-2 route.
    Mac(u32, MacAddr, IpAddr),
    /// A type-3 route.
    Flood(u32, IpAddr),
}

impl RouteKey {
    /// The route `h` is about.
    pub fn of(h: &Heard) -> RouteKey {
        match *h {
            Heard::Mac(r, _) => RouteKey::Mac(r.vni, r.mac, r.endpoint),
            Heard::Flood { vni, endpoint, .. } => RouteKey::Flood(vni, endpoint),
        }
    }
}

type Stale = RouteKey;

impl Table {
    /// A table installing at most `max_routes` remote stations.
    pub fn new(max_routes: usize) -> Self {
        Table {
            stations: HashMap::new(),
            flood: HashMap::new(),
            max_routes,
            installed: 0,
            waiting: VecDeque::new(),
            waiting_set: HashSet::new(),
            stale: HashMap::new(),
            endpoint_refs: HashMap::new(),
            endpoints_changed: false,
            counters: Counters::default(),
        }
    }

    /// A route withdrawn because its session went down (not by its originator): it stays
    /// installed, stale, until heard again or [`STALE_MS`] pass.
    pub fn hold(&mut self, h: Heard, now_ms: u64) {
        self.stale.entry(Stale::of(&h)).or_insert(now_ms);
    }

    /// Holds every received route stale (the speaker is being reconnected: it will tell
    /// the whole table again).
    pub fn hold_all(&mut self, now_ms: u64) {
        let mut keys: Vec<Stale> = self
            .stations
            .values()
            .flat_map(|s| s.remote.values().map(|r| Stale::Mac(r.vni, r.mac, r.endpoint)))
            .collect();
        keys.extend(self.flood.iter().flat_map(|(&v, eps)| eps.iter().map(move |&e| RouteKey::Flood(v, e))));
        for k in keys {
            self.stale.entry(k).or_insert(now_ms);
        }
    }

    /// Withdraws the stale routes held longer than [`STALE_MS`] at `now_ms`.
    pub fn expire_stale(&mut self, now_ms: u64, out: &mut Vec<Action>) {
        let old: Vec<Stale> =
            self.stale.iter().filter(|&(_, &t)| now_ms.saturating_sub(t) >= STALE_MS).map(|(&k, _)| k).collect();
        for k in old {
            self.stale.remove(&k);
            let h = match k {
                Stale::Mac(vni, mac, endpoint) => {
                    let Some(r) = self.stations.get(&(vni, mac)).and_then(|s| s.remote.get(&endpoint)).copied() else {
                        continue;
                    };
                    Heard::Mac(r, false)
                }
                Stale::Flood(vni, endpoint) => Heard::Flood { vni, endpoint, up: false },
            };
            self.apply(h, out);
        }
    }

    /// Routes held stale now.
    pub fn stale(&self) -> usize {
        self.stale.len()
    }

    /// Whether route `k` is held stale.
    pub fn is_stale(&self, k: &RouteKey) -> bool {
        self.stale.contains_key(k)
    }

    /// Every received route's key.
    pub fn received_keys(&self) -> HashSet<RouteKey> {
        self.received_routes().map(|(k, _)| k).collect()
    }

    /// Every received route, by key, as its withdrawal (for mending a difference).
    pub fn received_routes(&self) -> impl Iterator<Item = (RouteKey, Heard)> + '_ {
        let macs = self
            .stations
            .values()
            .flat_map(|s| s.remote.values().map(|r| (RouteKey::Mac(r.vni, r.mac, r.endpoint), Heard::Mac(*r, false))));
        let floods = self.flood.iter().flat_map(|(&vni, eps)| {
            eps.iter().map(move |&endpoint| (RouteKey::Flood(vni, endpoint), Heard::Flood { vni, endpoint, up: false }))
        });
        macs.chain(floods)
    }

    /// Station `mac` of `vni` is here now (learned, moved here, or configured: `sticky`).
    pub fn local_up(&mut self, vni: u32, mac: MacAddr, sticky: bool, out: &mut Vec<Action>) {
        let s = self.stations.entry((vni, mac)).or_default();
        let floor = s.remote.values().map(|r| r.seq).max();
        let seq = match (s.local, floor) {
            (Some(l), _) if l.sticky == sticky => return,
            (Some(l), _) => l.seq,
            // Taking the station from another host: one above its number.
            (None, Some(n)) => n.saturating_add(1),
            (None, None) => 0,
        };
        s.local = Some(Local { seq, sticky });
        out.push(Action::Announce { vni, mac, seq, sticky });
        if s.installed.take().is_some() {
            self.installed -= 1;
            out.push(Action::Uninstall { vni, mac });
            self.install_waiting(out);
        }
    }

    /// Station `mac` of `vni` is no longer here (aged, removed, its port gone, or moved to
    /// the tunnel).
    pub fn local_down(&mut self, vni: u32, mac: MacAddr, out: &mut Vec<Action>) {
        let Some(s) = self.stations.get_mut(&(vni, mac)) else { return };
        if s.local.take().is_none() {
            return;
        }
        out.push(Action::Withdraw { vni, mac });
        self.settle(vni, mac, out);
    }

    /// A route heard from the speaker.
    pub fn heard(&mut self, h: Heard, out: &mut Vec<Action>) {
        self.counters.received += 1;
        self.stale.remove(&Stale::of(&h));
        self.apply(h, out);
    }

    fn apply(&mut self, h: Heard, out: &mut Vec<Action>) {
        match h {
            Heard::Mac(r, true) => {
                if r.mac.is_multicast() || r.mac.is_zero() {
                    return;
                }
                if self.stations.entry((r.vni, r.mac)).or_default().remote.insert(r.endpoint, r).is_none() {
                    self.endpoint_ref(r.endpoint, true);
                }
                self.settle(r.vni, r.mac, out);
            }
            Heard::Mac(r, false) => {
                let Some(s) = self.stations.get_mut(&(r.vni, r.mac)) else { return };
                if s.remote.remove(&r.endpoint).is_some() {
                    self.endpoint_ref(r.endpoint, false);
                    self.settle(r.vni, r.mac, out);
                }
            }
            Heard::Flood { vni, endpoint, up } => {
                let set = self.flood.entry(vni).or_default();
                let changed = if up {
                    if set.len() >= MAX_FLOOD_ENDPOINTS && !set.contains(&endpoint) {
                        self.counters.flood_over_limit += 1;
                        false
                    } else {
                        set.insert(endpoint)
                    }
                } else {
                    set.remove(&endpoint)
                };
                if changed {
                    out.push(Action::Flood { vni, endpoints: set.iter().copied().collect() });
                }
                if set.is_empty() {
                    self.flood.remove(&vni);
                }
                if changed {
                    self.endpoint_ref(endpoint, up);
                }
            }
        }
    }

    fn endpoint_ref(&mut self, ep: IpAddr, up: bool) {
        let n = self.endpoint_refs.entry(ep).or_insert(0);
        if up {
            *n += 1;
            self.endpoints_changed |= *n == 1;
        } else {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.endpoint_refs.remove(&ep);
                self.endpoints_changed = true;
            }
        }
    }

    /// Decides station `(vni, mac)` again after a change: who holds it, and whether the
    /// switch must install, move or remove it.
    fn settle(&mut self, vni: u32, mac: MacAddr, out: &mut Vec<Action>) {
        let key = (vni, mac);
        let Some(s) = self.stations.get_mut(&key) else { return };
        let best = s.best_remote().copied();
        if let (Some(l), Some(r)) = (s.local, best) {
            if !Station::beats_local(&r, l) {
                if l.sticky && !r.sticky {
                    self.counters.claims_local += 1;
                }
                // Ours holds; an equal number from elsewhere is answered with a higher one.
                if r.seq >= l.seq && !l.sticky {
                    let seq = r.seq.saturating_add(1);
                    s.local = Some(Local { seq, sticky: l.sticky });
                    out.push(Action::Announce { vni, mac, seq, sticky: l.sticky });
                }
                return;
            }
            // The station moved to another host: ours goes.
            s.local = None;
            self.counters.moved_away += 1;
            out.push(Action::Withdraw { vni, mac });
        }
        let want = if s.local.is_some() { None } else { best.map(|r| r.endpoint) };
        match (s.installed, want) {
            (Some(a), Some(b)) if a == b => {}
            (Some(_), Some(b)) => {
                s.installed = Some(b);
                out.push(Action::Install { vni, mac, endpoint: b });
            }
            (None, Some(b)) => {
                if self.installed >= self.max_routes {
                    self.counters.over_limit += 1;
                    if self.waiting_set.insert(key) {
                        self.waiting.push_back(key);
                    }
                } else {
                    s.installed = Some(b);
                    self.installed += 1;
                    out.push(Action::Install { vni, mac, endpoint: b });
                }
            }
            (Some(_), None) => {
                s.installed = None;
                self.installed -= 1;
                out.push(Action::Uninstall { vni, mac });
                self.install_waiting(out);
            }
            (None, None) => {}
        }
        if let Some(s) = self.stations.get(&key)
            && s.remote.is_empty()
            && s.local.is_none()
        {
            self.stations.remove(&key);
        }
    }

    /// Installs stations that waited for room, oldest first, while there is room.
    fn install_waiting(&mut self, out: &mut Vec<Action>) {
        while self.installed < self.max_routes
            && let Some(key) = self.waiting.pop_front()
        {
            self.waiting_set.remove(&key);
            let Some(s) = self.stations.get_mut(&key) else { continue };
            if s.installed.is_some() || s.local.is_some() {
                continue;
            }
            if let Some(r) = s.best_remote().copied() {
                s.installed = Some(r.endpoint);
                self.installed += 1;
                out.push(Action::Install { vni: key.0, mac: key.1, endpoint: r.endpoint });
            }
        }
    }

    /// Forgets every received route (the speaker restarted or the session was lost for
    /// good): the remote stations are removed, the flood lists emptied. Our own
    /// announcements stay, to be announced again.
    pub fn forget_received(&mut self, out: &mut Vec<Action>) {
        let keys: Vec<_> = self.stations.keys().copied().collect();
        for (vni, mac) in keys {
            if let Some(s) = self.stations.get_mut(&(vni, mac)) {
                s.remote.clear();
            }
            self.settle(vni, mac, out);
        }
        self.waiting.clear();
        self.waiting_set.clear();
        self.stale.clear();
        self.endpoints_changed |= !self.endpoint_refs.is_empty();
        self.endpoint_refs.clear();
        for (vni, _) in self.flood.drain() {
            out.push(Action::Flood { vni, endpoints: Vec::new() });
        }
    }

    /// Our announcements, to send again (a new speaker): `(vni, mac, seq, sticky)`.
    pub fn announced(&self) -> impl Iterator<Item = (u32, MacAddr, u32, bool)> + '_ {
        self.stations.iter().filter_map(|(&(vni, mac), s)| s.local.map(|l| (vni, mac, l.seq, l.sticky)))
    }

    /// Received routes: each with whether it is the one installed.
    pub fn received(&self) -> impl Iterator<Item = (&MacRoute, bool)> + '_ {
        self.stations.values().flat_map(|s| s.remote.values().map(move |r| (r, s.installed == Some(r.endpoint))))
    }

    /// Each VNI's flood list.
    pub fn flood_lists(&self) -> impl Iterator<Item = (u32, &BTreeSet<IpAddr>)> + '_ {
        self.flood.iter().map(|(&v, s)| (v, s))
    }

    /// Every endpoint a route names: the tunnel accepts datagrams from these.
    pub fn endpoints(&self) -> BTreeSet<IpAddr> {
        self.endpoint_refs.keys().copied().collect()
    }

    /// Whether [`Table::endpoints`] changed since the last call.
    pub fn take_endpoints_changed(&mut self) -> bool {
        std::mem::take(&mut self.endpoints_changed)
    }

    /// Remote stations installed now.
    pub fn installed(&self) -> usize {
        self.installed
    }

    /// Received routes waiting for room.
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const M: MacAddr = MacAddr([2, 0, 0, 0, 0, 1]);
    const N: MacAddr = MacAddr([2, 0, 0, 0, 0, 2]);

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn route(mac: MacAddr, ep: &str, seq: u32) -> MacRoute {
        MacRoute { vni: 5000, mac, ip: None, endpoint: ip(ep), seq, sticky: false }
    }

    fn run(t: &mut Table, f: impl FnOnce(&mut Table, &mut Vec<Action>)) -> Vec<Action> {
        let mut out = Vec::new();
        f(t, &mut out);
        out
    }

    #[test]
    fn a_received_station_is_installed_and_removed_with_its_route() {
        let mut t = Table::new(16);
        let a = run(&mut t, |t, o| t.heard(Heard::Mac(route(M, "192.0.2.1", 0), true), o));
        assert_eq!(a, [Action::Install { vni: 5000, mac: M, endpoint: ip("192.0.2.1") }]);
        assert_eq!(t.installed(), 1);
        let a = run(&mut t, |t, o| t.heard(Heard::Mac(route(M, "192.0.2.1", 0), false), o));
        assert_eq!(a, [Action::Uninstall { vni: 5000, mac: M }]);
        assert_eq!((t.installed(), t.stations.len()), (0, 0), "nothing kept of it");
    }

    #[test]
    fn the_highest_sequence_number_holds_and_ties_go_to_the_lower_originator() {
        let mut t = Table::new(16);
        run(&mut t, |t, o| t.heard(Heard::Mac(route(M, "192.0.2.2", 0), true), o));
        let a = run(&mut t, |t, o| t.heard(Heard::Mac(route(M, "192.0.2.1", 0), true), o));
        assert_eq!(a, [Action::Install { vni: 5000, mac: M, endpoint: ip("192.0.2.1") }], "tie: lower address");
        let a = run(&mut t, |t, o| t.heard(Heard::Mac(route(M, "192.0.2.3", 1), true), o));
        assert_eq!(a, [Action::Install { vni: 5000, mac: M, endpoint: ip("192.0.2.3") }], "it moved there");
        let a = run(&mut t, |t, o| t.heard(Heard::Mac(route(M, "192.0.2.3", 1), false), o));
        assert_eq!(a, [Action::Install { vni: 5000, mac: M, endpoint: ip("192.0.2.1") }], "back to the rest");
        assert_eq!(t.installed(), 1);
    }

    #[test]
    fn a_station_that_arrives_here_is_announced_one_above_and_leaving_gives_it_back() {
        let mut t = Table::new(16);
        run(&mut t, |t, o| t.heard(Heard::Mac(route(M, "192.0.2.1", 4), true), o));
        let a = run(&mut t, |t, o| t.local_up(5000, M, false, o));
        assert_eq!(
            a,
            [Action::Announce { vni: 5000, mac: M, seq: 5, sticky: false }, Action::Uninstall { vni: 5000, mac: M }]
        );
        // The other host withdraws once it sees ours.
        let a = run(&mut t, |t, o| t.heard(Heard::Mac(route(M, "192.0.2.1", 4), false), o));
        assert!(a.is_empty(), "{a:?}");
        // It moves again: the other host announces 6; ours goes, theirs is installed.
        let a = run(&mut t, |t, o| t.heard(Heard::Mac(route(M, "192.0.2.1", 6), true), o));
        assert_eq!(
            a,
            [Action::Withdraw { vni: 5000, mac: M }, Action::Install { vni: 5000, mac: M, endpoint: ip("192.0.2.1") }]
        );
        assert_eq!(t.counters.moved_away, 1);
        // Our station's aging after it left changes nothing.
        assert!(run(&mut t, |t, o| t.local_down(5000, M, o)).is_empty());
    }

    #[test]
    fn an_equal_number_from_elsewhere_is_answered_and_a_configured_station_stays() {
        let mut t = Table::new(16);
        run(&mut t, |t, o| t.local_up(5000, M, false, o));
        let a = run(&mut t, |t, o| t.heard(Heard::Mac(route(M, "192.0.2.1", 0), true), o));
        assert_eq!(a, [Action::Announce { vni: 5000, mac: M, seq: 1, sticky: false }]);
        // Configured here: a route claiming it with any number is refused, counted.
        let a = run(&mut t, |t, o| t.local_up(5000, N, true, o));
        assert_eq!(a, [Action::Announce { vni: 5000, mac: N, seq: 0, sticky: true }]);
        let a = run(&mut t, |t, o| t.heard(Heard::Mac(route(N, "192.0.2.1", 9), true), o));
        assert!(a.is_empty(), "{a:?}");
        assert_eq!((t.counters.claims_local, t.installed()), (1, 0));
        // A sticky route elsewhere takes a learned station.
        let a = run(&mut t, |t, o| t.heard(Heard::Mac(MacRoute { sticky: true, ..route(M, "192.0.2.9", 0) }, true), o));
        assert_eq!(a[0], Action::Withdraw { vni: 5000, mac: M });
    }

    #[test]
    fn routes_beyond_the_bound_wait_and_are_installed_when_room_frees() {
        let mut t = Table::new(1);
        run(&mut t, |t, o| t.heard(Heard::Mac(route(M, "192.0.2.1", 0), true), o));
        let a = run(&mut t, |t, o| t.heard(Heard::Mac(route(N, "192.0.2.1", 0), true), o));
        assert!(a.is_empty());
        assert_eq!((t.counters.over_limit, t.waiting()), (1, 1));
        let a = run(&mut t, |t, o| t.heard(Heard::Mac(route(M, "192.0.2.1", 0), false), o));
        assert_eq!(
            a,
            [Action::Uninstall { vni: 5000, mac: M }, Action::Install { vni: 5000, mac: N, endpoint: ip("192.0.2.1") }]
        );
    }

    #[test]
    fn routes_of_a_session_that_went_down_stay_until_heard_again_or_stale() {
        let mut t = Table::new(16);
        let m = route(M, "192.0.2.1", 0);
        let f = Heard::Flood { vni: 5000, endpoint: ip("192.0.2.1"), up: true };
        run(&mut t, |t, o| t.heard(Heard::Mac(m, true), o));
        run(&mut t, |t, o| t.heard(f, o));
        // The session drops: its withdrawals are held, nothing changes.
        t.hold(Heard::Mac(m, false), 1000);
        t.hold(Heard::Flood { vni: 5000, endpoint: ip("192.0.2.1"), up: false }, 1000);
        assert_eq!((t.installed(), t.stale()), (1, 2));
        assert!(run(&mut t, |t, o| t.expire_stale(1000 + STALE_MS - 1, o)).is_empty());
        // Back: heard again, no longer stale.
        assert!(run(&mut t, |t, o| t.heard(Heard::Mac(m, true), o)).is_empty());
        assert_eq!(t.stale(), 1);
        // The flood route never came back: withdrawn when stale.
        let a = run(&mut t, |t, o| t.expire_stale(1000 + STALE_MS, o));
        assert_eq!(a, [Action::Flood { vni: 5000, endpoints: vec![] }]);
        // A speaker reconnected: everything held; what is not heard again goes.
        t.hold_all(5000);
        let a = run(&mut t, |t, o| t.expire_stale(5000 + STALE_MS, o));
        assert_eq!(a, [Action::Uninstall { vni: 5000, mac: M }]);
        assert_eq!((t.installed(), t.stale()), (0, 0));
    }

    #[test]
    fn flood_lists_follow_type_3_routes_per_vni() {
        let mut t = Table::new(16);
        let up = |vni, ep: &str| Heard::Flood { vni, endpoint: ip(ep), up: true };
        let a = run(&mut t, |t, o| t.heard(up(5000, "192.0.2.2"), o));
        assert_eq!(a, [Action::Flood { vni: 5000, endpoints: vec![ip("192.0.2.2")] }]);
        let a = run(&mut t, |t, o| t.heard(up(5000, "192.0.2.1"), o));
        assert_eq!(a, [Action::Flood { vni: 5000, endpoints: vec![ip("192.0.2.1"), ip("192.0.2.2")] }]);
        assert!(run(&mut t, |t, o| t.heard(up(5000, "192.0.2.1"), o)).is_empty(), "again: no change");
        run(&mut t, |t, o| t.heard(up(6000, "192.0.2.3"), o));
        assert_eq!(t.endpoints().len(), 3);
        assert!(t.take_endpoints_changed() && !t.take_endpoints_changed());
        let a = run(&mut t, |t, o| t.forget_received(o));
        assert_eq!(a.len(), 2);
        assert!(t.endpoints().is_empty());
    }
}

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
//!
//! Duplicate detection (RFC 7432 §15.1): a move is a change of the station's holder (this
//! host or another endpoint) to one whose sequence number is above every number the
//! station had. A station that moves [`DupRule::max_moves`] times within
//! [`DupRule::window_ms`] — two hosts that both have it, or a loop — is declared duplicate
//! and frozen: the move that reached the bound is not carried out, nothing more is
//! announced or withdrawn for it, and received routes for it are recorded but change
//! nothing installed, until [`DupRule::hold_ms`] pass (or the operator clears it). Then
//! the latest local state and received routes decide it afresh, with its moves counted
//! from zero. A station configured here (sticky) is never taken, so it never moves.
//!
//! IP bindings (RFC 7432 §7.2): a host's MAC-only route and its routes binding an address
//! to the station are one station of that host, present while any is, with the highest
//! number among them; [`Table::bindings`] gives the addresses of the installed stations,
//! which the switch answers ARP requests for.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::net::IpAddr;

use sluice_wire::MacAddr;

/// Endpoints of one VNI's flood list at most; further type-3 routes are counted and not
/// used.
pub const MAX_FLOOD_ENDPOINTS: usize = 256;
/// How long a route whose session went down (or whose speaker is being reconnected) stays
/// installed, unless heard again: a session that flaps does not stop forwarding.
pub const STALE_MS: u64 = 60_000;
/// Routes binding an IP address to one station that one host may have installed at most;
/// further ones are counted and not used.
pub const MAX_IPS_PER_STATION: usize = 16;

/// When a station that keeps moving is declared duplicate, and how long it stays frozen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DupRule {
    /// Moves that make a station duplicate; 0: never.
    pub max_moves: u32,
    /// Within this long (ms), counted from the first move.
    pub window_ms: u64,
    /// How long (ms) a duplicate stays frozen; 0: until cleared.
    pub hold_ms: u64,
}

impl Default for DupRule {
    /// 5 moves within 180 s, frozen 180 s (FRR's `dup-addr-detection` numbers).
    fn default() -> Self {
        DupRule { max_moves: 5, window_ms: 180_000, hold_ms: 180_000 }
    }
}

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
    /// Station `mac` of `vni` was declared duplicate and is frozen (to be logged).
    Duplicate {
        /// The VNI.
        vni: u32,
        /// The station.
        mac: MacAddr,
        /// The moves counted in the window.
        moves: u32,
        /// Whether it is here (learned or configured) besides `hosts`.
        here: bool,
        /// The other hosts that announce it.
        hosts: Vec<IpAddr>,
    },
    /// Station `mac` of `vni` is no longer frozen: decided afresh.
    Recovered {
        /// The VNI.
        vni: u32,
        /// The station.
        mac: MacAddr,
    },
}

/// A station declared duplicate, frozen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frozen {
    /// The VNI.
    pub vni: u32,
    /// The station.
    pub mac: MacAddr,
    /// The moves that made it duplicate.
    pub moves: u32,
    /// Frozen since (ms, the caller's clock).
    pub since_ms: u64,
    /// Whether it is here now (learned or configured).
    pub here: bool,
    /// The other hosts announcing it.
    pub hosts: Vec<IpAddr>,
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
    /// Stations declared duplicate.
    pub duplicates: u64,
    /// MAC+IP routes beyond [`MAX_IPS_PER_STATION`] of one host for one station.
    pub ips_over_limit: u64,
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
    /// Received, by originator endpoint and IP address: the MAC-only route (`None`) and
    /// those binding an address.
    routes: BTreeMap<(IpAddr, Option<IpAddr>), MacRoute>,
    /// Each originator's routes as one, which is what decides: the highest sequence
    /// number, sticky if one is (derived from `routes`).
    remote: BTreeMap<IpAddr, MacRoute>,
    /// Ours, while the station is here.
    local: Option<Local>,
    /// The endpoint the switch has it behind, when installed.
    installed: Option<IpAddr>,
    /// Duplicate detection's state, while it counts moves or the station is frozen.
    dup: Option<Box<Dup>>,
}

/// A station's moves, and its freeze.
#[derive(Clone, Debug, Default)]
struct Dup {
    /// The highest sequence number of a holder so far: a move raises it.
    top: u32,
    /// Moves counted since `since` (ms).
    moves: u32,
    since: u64,
    /// Frozen since (ms): declared duplicate.
    frozen: Option<u64>,
    /// While frozen, the latest local change held back: here (sticky or not), or gone.
    held_local: Option<Option<bool>>,
}

impl Station {
    /// The received route that holds among the remote ones: the highest sequence number,
    /// sticky first, then the lowest originator.
    fn best_remote(&self) -> Option<&MacRoute> {
        self.remote.values().min_by_key(|r| (std::cmp::Reverse((r.sticky, r.seq)), r.endpoint))
    }

    /// Derives `remote`'s entry for `ep` from its routes again: whether it exists now.
    fn summarize(&mut self, ep: IpAddr) -> bool {
        let mut of = self.routes.range((ep, None)..).take_while(|((e, _), _)| *e == ep).map(|(_, r)| r);
        let Some(first) = of.next().copied() else {
            self.remote.remove(&ep);
            return false;
        };
        let r = of.fold(MacRoute { ip: None, ..first }, |a, r| MacRoute {
            seq: a.seq.max(r.seq),
            sticky: a.sticky || r.sticky,
            ..a
        });
        self.remote.insert(ep, r);
        true
    }

    fn frozen(&self) -> bool {
        self.dup.as_ref().is_some_and(|d| d.frozen.is_some())
    }

    /// The sequence number of whoever holds the station now, if anyone does.
    fn holder_seq(&self) -> Option<u32> {
        match (self.local, self.installed) {
            (Some(l), _) => Some(l.seq),
            (None, Some(ep)) => self.remote.get(&ep).map(|r| r.seq),
            (None, None) => None,
        }
    }

    /// The station passes to a holder with sequence number `seq` at `now`: counts a move
    /// when `seq` is above every number it had. True when that makes it duplicate (it is
    /// frozen then, and the move must not be carried out).
    fn moving(&mut self, seq: u32, now: u64, rule: &DupRule) -> bool {
        let Some(before) = self.holder_seq().filter(|_| rule.max_moves > 0) else { return false };
        let top = self.dup.as_ref().map_or(before, |d| d.top.max(before));
        if seq <= top {
            return false;
        }
        let d = self.dup.get_or_insert_with(Box::default);
        d.top = seq;
        if d.moves == 0 || now.saturating_sub(d.since) > rule.window_ms {
            d.moves = 0;
            d.since = now;
        }
        d.moves += 1;
        if d.moves >= rule.max_moves {
            d.frozen = Some(now);
            return true;
        }
        false
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
    /// When a station is duplicate.
    dup_rule: DupRule,
    /// Stations whose moves are being counted, or that are frozen.
    watched: HashSet<(u32, MacAddr)>,
    /// Received routes that bind an IP address.
    ip_routes: usize,
    /// What was refused or moved, counted.
    pub counters: Counters,
}

/// A received route, by what names it: (VNI, MAC, originator) or (VNI, originator).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RouteKey {
    /// A type-2 route (VNI, MAC, originator, the IP address it binds).
    Mac(u32, MacAddr, IpAddr, Option<IpAddr>),
    /// A type-3 route.
    Flood(u32, IpAddr),
}

impl RouteKey {
    /// The route `h` is about.
    pub fn of(h: &Heard) -> RouteKey {
        match *h {
            Heard::Mac(r, _) => RouteKey::Mac(r.vni, r.mac, r.endpoint, r.ip),
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
            dup_rule: DupRule::default(),
            watched: HashSet::new(),
            ip_routes: 0,
            counters: Counters::default(),
        }
    }

    /// The same, declaring stations duplicate by `rule`.
    pub fn with_dup_rule(mut self, rule: DupRule) -> Self {
        self.dup_rule = rule;
        self
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
            .flat_map(|s| s.routes.values().map(|r| Stale::Mac(r.vni, r.mac, r.endpoint, r.ip)))
            .collect();
        keys.extend(self.flood.iter().flat_map(|(&v, eps)| eps.iter().map(move |&e| RouteKey::Flood(v, e))));
        for k in keys {
            self.stale.entry(k).or_insert(now_ms);
        }
    }

    /// Starts every stale route's [`STALE_MS`] again at `now_ms`: the speaker has begun to
    /// tell its table after a reconnection, and what it was too busy to tell before is
    /// not gone for that.
    pub fn restamp_stale(&mut self, now_ms: u64) {
        for t in self.stale.values_mut() {
            *t = now_ms;
        }
    }

    /// Withdraws the stale routes held longer than [`STALE_MS`] at `now_ms`.
    pub fn expire_stale(&mut self, now_ms: u64, out: &mut Vec<Action>) {
        let old: Vec<Stale> =
            self.stale.iter().filter(|&(_, &t)| now_ms.saturating_sub(t) >= STALE_MS).map(|(&k, _)| k).collect();
        for k in old {
            self.stale.remove(&k);
            let h = match k {
                Stale::Mac(vni, mac, endpoint, ip) => {
                    let Some(r) = self.stations.get(&(vni, mac)).and_then(|s| s.routes.get(&(endpoint, ip))).copied()
                    else {
                        continue;
                    };
                    Heard::Mac(r, false)
                }
                Stale::Flood(vni, endpoint) => Heard::Flood { vni, endpoint, up: false },
            };
            self.apply(h, now_ms, out);
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
            .flat_map(|s| s.routes.values().map(|r| (RouteKey::of(&Heard::Mac(*r, true)), Heard::Mac(*r, false))));
        let floods = self.flood.iter().flat_map(|(&vni, eps)| {
            eps.iter().map(move |&endpoint| (RouteKey::Flood(vni, endpoint), Heard::Flood { vni, endpoint, up: false }))
        });
        macs.chain(floods)
    }

    /// Station `mac` of `vni` is here now (learned, moved here, or configured: `sticky`),
    /// at `now_ms`.
    pub fn local_up(&mut self, vni: u32, mac: MacAddr, sticky: bool, now_ms: u64, out: &mut Vec<Action>) {
        let key = (vni, mac);
        let s = self.stations.entry(key).or_default();
        if let Some(d) = s.dup.as_mut().filter(|d| d.frozen.is_some()) {
            d.held_local = Some(Some(sticky));
            return;
        }
        let floor = s.remote.values().map(|r| r.seq).max();
        let seq = match (s.local, floor) {
            (Some(l), _) if l.sticky == sticky => return,
            (Some(l), _) => l.seq,
            // Taking the station from another host: one above its number.
            (None, Some(n)) => n.saturating_add(1),
            (None, None) => 0,
        };
        let taking = s.local.is_none();
        if taking && self.moved(key, seq, true, now_ms, out) {
            if let Some(d) = self.stations.get_mut(&key).and_then(|s| s.dup.as_mut()) {
                d.held_local = Some(Some(sticky));
            }
            return;
        }
        let Some(s) = self.stations.get_mut(&key) else { return };
        s.local = Some(Local { seq, sticky });
        out.push(Action::Announce { vni, mac, seq, sticky });
        if s.installed.take().is_some() {
            self.installed -= 1;
            out.push(Action::Uninstall { vni, mac });
            self.install_waiting(out);
        }
    }

    /// Station `mac` of `vni` is no longer here (aged, removed, its port gone, or moved to
    /// the tunnel), at `now_ms`.
    pub fn local_down(&mut self, vni: u32, mac: MacAddr, now_ms: u64, out: &mut Vec<Action>) {
        let Some(s) = self.stations.get_mut(&(vni, mac)) else { return };
        if let Some(d) = s.dup.as_mut().filter(|d| d.frozen.is_some()) {
            d.held_local = Some(None);
            return;
        }
        if s.local.take().is_none() {
            return;
        }
        out.push(Action::Withdraw { vni, mac });
        self.settle(vni, mac, now_ms, out);
    }

    /// A route heard from the speaker at `now_ms`.
    pub fn heard(&mut self, h: Heard, now_ms: u64, out: &mut Vec<Action>) {
        self.counters.received += 1;
        self.stale.remove(&Stale::of(&h));
        self.apply(h, now_ms, out);
    }

    fn apply(&mut self, h: Heard, now: u64, out: &mut Vec<Action>) {
        match h {
            Heard::Mac(r, true) => {
                if r.mac.is_multicast() || r.mac.is_zero() {
                    return;
                }
                let s = self.stations.entry((r.vni, r.mac)).or_default();
                let key = (r.endpoint, r.ip);
                if r.ip.is_some() && !s.routes.contains_key(&key) {
                    let bound = s.routes.range((r.endpoint, None)..).take_while(|((e, _), _)| *e == r.endpoint);
                    if bound.filter(|((_, ip), _)| ip.is_some()).count() >= MAX_IPS_PER_STATION {
                        self.counters.ips_over_limit += 1;
                        return;
                    }
                }
                let had = s.remote.contains_key(&r.endpoint);
                if s.routes.insert(key, r).is_none() && r.ip.is_some() {
                    self.ip_routes += 1;
                }
                s.summarize(r.endpoint);
                if !had {
                    self.endpoint_ref(r.endpoint, true);
                }
                self.settle(r.vni, r.mac, now, out);
            }
            Heard::Mac(r, false) => {
                let Some(s) = self.stations.get_mut(&(r.vni, r.mac)) else { return };
                if s.routes.remove(&(r.endpoint, r.ip)).is_some() {
                    if r.ip.is_some() {
                        self.ip_routes -= 1;
                    }
                    if !s.summarize(r.endpoint) {
                        self.endpoint_ref(r.endpoint, false);
                    }
                    self.settle(r.vni, r.mac, now, out);
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

    /// Decides station `(vni, mac)` again after a change at `now`: who holds it, and
    /// whether the switch must install, move or remove it. A frozen station stays as it is.
    fn settle(&mut self, vni: u32, mac: MacAddr, now: u64, out: &mut Vec<Action>) {
        let key = (vni, mac);
        let Some(s) = self.stations.get_mut(&key) else { return };
        if s.frozen() {
            return;
        }
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
            if self.moved(key, r.seq, false, now, out) {
                return;
            }
            let Some(s) = self.stations.get_mut(&key) else { return };
            s.local = None;
            self.counters.moved_away += 1;
            out.push(Action::Withdraw { vni, mac });
        }
        let Some(s) = self.stations.get(&key) else { return };
        let want = if s.local.is_some() { None } else { best.map(|r| r.endpoint) };
        match (s.installed, want) {
            (Some(a), Some(b)) if a == b => {}
            (Some(_), Some(b)) => {
                // From one host to another: a move when the number rose.
                if best.is_some_and(|r| self.moved(key, r.seq, false, now, out)) {
                    return;
                }
                let Some(s) = self.stations.get_mut(&key) else { return };
                s.installed = Some(b);
                out.push(Action::Install { vni, mac, endpoint: b });
            }
            (None, Some(b)) => {
                if self.installed >= self.max_routes {
                    self.counters.over_limit += 1;
                    if self.waiting_set.insert(key) {
                        self.waiting.push_back(key);
                    }
                } else if let Some(s) = self.stations.get_mut(&key) {
                    s.installed = Some(b);
                    self.installed += 1;
                    out.push(Action::Install { vni, mac, endpoint: b });
                }
            }
            (Some(_), None) => {
                if let Some(s) = self.stations.get_mut(&key) {
                    s.installed = None;
                }
                self.installed -= 1;
                out.push(Action::Uninstall { vni, mac });
                self.install_waiting(out);
            }
            (None, None) => {}
        }
        if let Some(s) = self.stations.get(&key)
            && s.remote.is_empty()
            && s.local.is_none()
            && s.dup.is_none()
        {
            self.stations.remove(&key);
        }
    }

    /// Station `key` passes to a holder with sequence number `seq` (this host when
    /// `arriving`) at `now`: counts the move, and declares the station duplicate when it
    /// is one too many. True then: the move is not carried out.
    fn moved(&mut self, key: (u32, MacAddr), seq: u32, arriving: bool, now: u64, out: &mut Vec<Action>) -> bool {
        let Some(s) = self.stations.get_mut(&key) else { return false };
        let dup = s.moving(seq, now, &self.dup_rule);
        if s.dup.is_some() {
            self.watched.insert(key);
        }
        if dup {
            self.counters.duplicates += 1;
            let moves = s.dup.as_ref().map_or(0, |d| d.moves);
            let hosts = s.remote.keys().copied().collect();
            out.push(Action::Duplicate { vni: key.0, mac: key.1, moves, here: arriving || s.local.is_some(), hosts });
        }
        dup
    }

    /// At `now_ms`: frozen stations whose hold is over recover, and stations whose window
    /// of moves passed are no longer watched.
    pub fn expire_duplicates(&mut self, now_ms: u64, out: &mut Vec<Action>) {
        let rule = self.dup_rule;
        let mut due = Vec::new();
        let mut quiet = Vec::new();
        for &key in &self.watched {
            match self.stations.get(&key).and_then(|s| s.dup.as_deref()) {
                None => quiet.push(key),
                Some(Dup { frozen: Some(t), .. }) => {
                    if rule.hold_ms > 0 && now_ms.saturating_sub(*t) >= rule.hold_ms {
                        due.push(key);
                    }
                }
                Some(d) => {
                    if now_ms.saturating_sub(d.since) > rule.window_ms {
                        quiet.push(key);
                    }
                }
            }
        }
        for key in quiet {
            self.watched.remove(&key);
            if let Some(s) = self.stations.get_mut(&key) {
                s.dup = None;
                if s.remote.is_empty() && s.local.is_none() && s.installed.is_none() {
                    self.stations.remove(&key);
                }
            }
        }
        for key in due {
            self.recover(key, now_ms, out);
        }
    }

    /// Clears the duplicates of `vni` (every VNI: `None`) and `mac` (every station:
    /// `None`) now, at `now_ms`, as if their hold were over; how many.
    pub fn clear_duplicates(
        &mut self,
        vni: Option<u32>,
        mac: Option<MacAddr>,
        now_ms: u64,
        out: &mut Vec<Action>,
    ) -> usize {
        let keys: Vec<_> = self
            .watched
            .iter()
            .copied()
            .filter(|&(v, m)| vni.is_none_or(|x| x == v) && mac.is_none_or(|x| x == m))
            .filter(|k| self.stations.get(k).is_some_and(Station::frozen))
            .collect();
        for &key in &keys {
            self.recover(key, now_ms, out);
        }
        keys.len()
    }

    /// Frozen station `key` is decided afresh from what it holds now, its moves counted
    /// from zero.
    fn recover(&mut self, key: (u32, MacAddr), now: u64, out: &mut Vec<Action>) {
        self.watched.remove(&key);
        let Some(s) = self.stations.get_mut(&key) else { return };
        let held = s.dup.take().and_then(|d| d.held_local);
        let (vni, mac) = key;
        out.push(Action::Recovered { vni, mac });
        match held {
            Some(Some(sticky)) => self.local_up(vni, mac, sticky, now, out),
            Some(None) => self.local_down(vni, mac, now, out),
            None => {}
        }
        self.settle(vni, mac, now, out);
    }

    /// The stations frozen now.
    pub fn duplicates(&self) -> impl Iterator<Item = Frozen> + '_ {
        self.watched.iter().filter_map(|&(vni, mac)| {
            let s = self.stations.get(&(vni, mac))?;
            let d = s.dup.as_deref()?;
            let since_ms = d.frozen?;
            let here = match d.held_local {
                Some(h) => h.is_some(),
                None => s.local.is_some(),
            };
            Some(Frozen { vni, mac, moves: d.moves, since_ms, here, hosts: s.remote.keys().copied().collect() })
        })
    }

    /// Installs stations that waited for room, oldest first, while there is room.
    fn install_waiting(&mut self, out: &mut Vec<Action>) {
        while self.installed < self.max_routes
            && let Some(key) = self.waiting.pop_front()
        {
            self.waiting_set.remove(&key);
            let Some(s) = self.stations.get_mut(&key) else { continue };
            if s.installed.is_some() || s.local.is_some() || s.frozen() {
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
    pub fn forget_received(&mut self, now_ms: u64, out: &mut Vec<Action>) {
        let keys: Vec<_> = self.stations.keys().copied().collect();
        for (vni, mac) in keys {
            if let Some(s) = self.stations.get_mut(&(vni, mac)) {
                s.remote.clear();
                self.ip_routes -= s.routes.keys().filter(|(_, ip)| ip.is_some()).count();
                s.routes.clear();
            }
            self.settle(vni, mac, now_ms, out);
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
        self.stations.values().flat_map(|s| s.routes.values().map(move |r| (r, s.installed == Some(r.endpoint))))
    }

    /// Whether any received route binds an IP address (else [`Table::bindings`] is
    /// empty).
    pub fn has_ip_routes(&self) -> bool {
        self.ip_routes > 0
    }

    /// The IP addresses of installed stations, as their routes from the endpoint they are
    /// installed behind bind them: `(vni, ip, mac)`.
    pub fn bindings(&self) -> impl Iterator<Item = (u32, IpAddr, MacAddr)> + '_ {
        self.stations.iter().flat_map(|(&(vni, mac), s)| {
            let ep = s.installed;
            s.routes.keys().filter(move |(e, _)| Some(*e) == ep).filter_map(move |&(_, ip)| ip.map(|ip| (vni, ip, mac)))
        })
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
        let a = run(&mut t, |t, o| t.heard(Heard::Mac(route(M, "192.0.2.1", 0), true), 0, o));
        assert_eq!(a, [Action::Install { vni: 5000, mac: M, endpoint: ip("192.0.2.1") }]);
        assert_eq!(t.installed(), 1);
        let a = run(&mut t, |t, o| t.heard(Heard::Mac(route(M, "192.0.2.1", 0), false), 0, o));
        assert_eq!(a, [Action::Uninstall { vni: 5000, mac: M }]);
        assert_eq!((t.installed(), t.stations.len()), (0, 0), "nothing kept of it");
    }

    #[test]
    fn the_highest_sequence_number_holds_and_ties_go_to_the_lower_originator() {
        let mut t = Table::new(16);
        run(&mut t, |t, o| t.heard(Heard::Mac(route(M, "192.0.2.2", 0), true), 0, o));
        let a = run(&mut t, |t, o| t.heard(Heard::Mac(route(M, "192.0.2.1", 0), true), 0, o));
        assert_eq!(a, [Action::Install { vni: 5000, mac: M, endpoint: ip("192.0.2.1") }], "tie: lower address");
        let a = run(&mut t, |t, o| t.heard(Heard::Mac(route(M, "192.0.2.3", 1), true), 0, o));
        assert_eq!(a, [Action::Install { vni: 5000, mac: M, endpoint: ip("192.0.2.3") }], "it moved there");
        let a = run(&mut t, |t, o| t.heard(Heard::Mac(route(M, "192.0.2.3", 1), false), 0, o));
        assert_eq!(a, [Action::Install { vni: 5000, mac: M, endpoint: ip("192.0.2.1") }], "back to the rest");
        assert_eq!(t.installed(), 1);
    }

    #[test]
    fn a_station_that_arrives_here_is_announced_one_above_and_leaving_gives_it_back() {
        let mut t = Table::new(16);
        run(&mut t, |t, o| t.heard(Heard::Mac(route(M, "192.0.2.1", 4), true), 0, o));
        let a = run(&mut t, |t, o| t.local_up(5000, M, false, 0, o));
        assert_eq!(
            a,
            [Action::Announce { vni: 5000, mac: M, seq: 5, sticky: false }, Action::Uninstall { vni: 5000, mac: M }]
        );
        // The other host withdraws once it sees ours.
        let a = run(&mut t, |t, o| t.heard(Heard::Mac(route(M, "192.0.2.1", 4), false), 0, o));
        assert!(a.is_empty(), "{a:?}");
        // It moves again: the other host announces 6; ours goes, theirs is installed.
        let a = run(&mut t, |t, o| t.heard(Heard::Mac(route(M, "192.0.2.1", 6), true), 0, o));
        assert_eq!(
            a,
            [Action::Withdraw { vni: 5000, mac: M }, Action::Install { vni: 5000, mac: M, endpoint: ip("192.0.2.1") }]
        );
        assert_eq!(t.counters.moved_away, 1);
        // Our station's aging after it left changes nothing.
        assert!(run(&mut t, |t, o| t.local_down(5000, M, 0, o)).is_empty());
    }

    #[test]
    fn an_equal_number_from_elsewhere_is_answered_and_a_configured_station_stays() {
        let mut t = Table::new(16);
        run(&mut t, |t, o| t.local_up(5000, M, false, 0, o));
        let a = run(&mut t, |t, o| t.heard(Heard::Mac(route(M, "192.0.2.1", 0), true), 0, o));
        assert_eq!(a, [Action::Announce { vni: 5000, mac: M, seq: 1, sticky: false }]);
        // Configured here: a route claiming it with any number is refused, counted.
        let a = run(&mut t, |t, o| t.local_up(5000, N, true, 0, o));
        assert_eq!(a, [Action::Announce { vni: 5000, mac: N, seq: 0, sticky: true }]);
        let a = run(&mut t, |t, o| t.heard(Heard::Mac(route(N, "192.0.2.1", 9), true), 0, o));
        assert!(a.is_empty(), "{a:?}");
        assert_eq!((t.counters.claims_local, t.installed()), (1, 0));
        // A sticky route elsewhere takes a learned station.
        let a =
            run(&mut t, |t, o| t.heard(Heard::Mac(MacRoute { sticky: true, ..route(M, "192.0.2.9", 0) }, true), 0, o));
        assert_eq!(a[0], Action::Withdraw { vni: 5000, mac: M });
    }

    #[test]
    fn routes_beyond_the_bound_wait_and_are_installed_when_room_frees() {
        let mut t = Table::new(1);
        run(&mut t, |t, o| t.heard(Heard::Mac(route(M, "192.0.2.1", 0), true), 0, o));
        let a = run(&mut t, |t, o| t.heard(Heard::Mac(route(N, "192.0.2.1", 0), true), 0, o));
        assert!(a.is_empty());
        assert_eq!((t.counters.over_limit, t.waiting()), (1, 1));
        let a = run(&mut t, |t, o| t.heard(Heard::Mac(route(M, "192.0.2.1", 0), false), 0, o));
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
        run(&mut t, |t, o| t.heard(Heard::Mac(m, true), 0, o));
        run(&mut t, |t, o| t.heard(f, 0, o));
        // The session drops: its withdrawals are held, nothing changes.
        t.hold(Heard::Mac(m, false), 1000);
        t.hold(Heard::Flood { vni: 5000, endpoint: ip("192.0.2.1"), up: false }, 1000);
        assert_eq!((t.installed(), t.stale()), (1, 2));
        assert!(run(&mut t, |t, o| t.expire_stale(1000 + STALE_MS - 1, o)).is_empty());
        // Back: heard again, no longer stale.
        assert!(run(&mut t, |t, o| t.heard(Heard::Mac(m, true), 0, o)).is_empty());
        assert_eq!(t.stale(), 1);
        // The flood route never came back: withdrawn when stale.
        let a = run(&mut t, |t, o| t.expire_stale(1000 + STALE_MS, o));
        assert_eq!(a, [Action::Flood { vni: 5000, endpoints: vec![] }]);
        // A speaker reconnected: everything held; what is not heard again goes, counted from
        // when the speaker began to tell its table (it was too busy until 9000).
        t.hold_all(5000);
        t.restamp_stale(9000);
        assert!(run(&mut t, |t, o| t.expire_stale(5000 + STALE_MS, o)).is_empty());
        let a = run(&mut t, |t, o| t.expire_stale(9000 + STALE_MS, o));
        assert_eq!(a, [Action::Uninstall { vni: 5000, mac: M }]);
        assert_eq!((t.installed(), t.stale()), (0, 0));
    }

    #[test]
    fn flood_lists_follow_type_3_routes_per_vni() {
        let mut t = Table::new(16);
        let up = |vni, ep: &str| Heard::Flood { vni, endpoint: ip(ep), up: true };
        let a = run(&mut t, |t, o| t.heard(up(5000, "192.0.2.2"), 0, o));
        assert_eq!(a, [Action::Flood { vni: 5000, endpoints: vec![ip("192.0.2.2")] }]);
        let a = run(&mut t, |t, o| t.heard(up(5000, "192.0.2.1"), 0, o));
        assert_eq!(a, [Action::Flood { vni: 5000, endpoints: vec![ip("192.0.2.1"), ip("192.0.2.2")] }]);
        assert!(run(&mut t, |t, o| t.heard(up(5000, "192.0.2.1"), 0, o)).is_empty(), "again: no change");
        run(&mut t, |t, o| t.heard(up(6000, "192.0.2.3"), 0, o));
        assert_eq!(t.endpoints().len(), 3);
        assert!(t.take_endpoints_changed() && !t.take_endpoints_changed());
        let a = run(&mut t, |t, o| t.forget_received(0, o));
        assert_eq!(a.len(), 2);
        assert!(t.endpoints().is_empty());
    }

    /// The station flaps between here and 192.0.2.2, one move per `step` ms from `from`:
    /// `n` moves, each host's number one above the other's.
    fn flap(t: &mut Table, n: u32, from: u64, step: u64) -> Vec<Action> {
        let mut all = Vec::new();
        for i in 0..n {
            let now = from + u64::from(i) * step;
            let ours = t.announced().find(|a| a.1 == M);
            let a = match ours {
                Some((_, _, seq, _)) => {
                    run(t, |t, o| t.heard(Heard::Mac(route(M, "192.0.2.2", seq + 1), true), now, o))
                }
                None => run(t, |t, o| t.local_up(5000, M, false, now, o)),
            };
            all.extend(a);
        }
        all
    }

    fn duplicates(a: &[Action]) -> usize {
        a.iter().filter(|a| matches!(a, Action::Duplicate { .. })).count()
    }

    #[test]
    fn a_station_that_moves_five_times_within_the_window_is_frozen_until_its_hold_is_over() {
        let mut t = Table::new(16);
        run(&mut t, |t, o| t.local_up(5000, M, false, 0, o));
        // Four moves (there and back, twice) are carried out.
        let a = flap(&mut t, 4, 1000, 1000);
        assert_eq!(duplicates(&a), 0, "{a:?}");
        assert_eq!(t.announced().collect::<Vec<_>>(), [(5000, M, 4, false)]);
        // The fifth is not: declared duplicate, naming the hosts; ours stays announced.
        let a = run(&mut t, |t, o| t.heard(Heard::Mac(route(M, "192.0.2.2", 5), true), 5000, o));
        assert_eq!(a, [Action::Duplicate { vni: 5000, mac: M, moves: 5, here: true, hosts: vec![ip("192.0.2.2")] }]);
        assert_eq!((t.counters.duplicates, t.counters.moved_away), (1, 2));
        // Frozen: neither routes nor local changes do anything; the numbers stop rising.
        assert!(run(&mut t, |t, o| t.heard(Heard::Mac(route(M, "192.0.2.2", 9), true), 6000, o)).is_empty());
        assert!(run(&mut t, |t, o| t.local_down(5000, M, 7000, o)).is_empty());
        assert!(run(&mut t, |t, o| t.local_up(5000, M, false, 8000, o)).is_empty());
        assert_eq!(t.announced().collect::<Vec<_>>(), [(5000, M, 4, false)]);
        let d: Vec<Frozen> = t.duplicates().collect();
        assert_eq!(
            d,
            [Frozen { vni: 5000, mac: M, moves: 5, since_ms: 5000, here: true, hosts: vec![ip("192.0.2.2")] }]
        );
        // The hold passes: decided afresh by the routes held now, moves counted from zero.
        assert!(run(&mut t, |t, o| t.expire_duplicates(5000 + 180_000 - 1, o)).is_empty());
        let a = run(&mut t, |t, o| t.expire_duplicates(5000 + 180_000, o));
        assert_eq!(
            a,
            [
                Action::Recovered { vni: 5000, mac: M },
                Action::Withdraw { vni: 5000, mac: M },
                Action::Install { vni: 5000, mac: M, endpoint: ip("192.0.2.2") },
            ]
        );
        assert_eq!(t.duplicates().count(), 0);
        let a = flap(&mut t, 3, 190_000, 1000);
        assert_eq!(duplicates(&a), 0, "a fresh count: {a:?}");
    }

    #[test]
    fn moves_spread_wider_than_the_window_never_make_a_duplicate() {
        let mut t = Table::new(16);
        run(&mut t, |t, o| t.local_up(5000, M, false, 0, o));
        // One move every 100 s: never more than two within 180 s.
        let mut a = Vec::new();
        for i in 0..20 {
            a.extend(flap(&mut t, 1, 100_000 * (i + 1), 0));
            run(&mut t, |t, o| t.expire_duplicates(100_000 * (i + 1) + 50_000, o));
        }
        assert_eq!(duplicates(&a), 0, "{a:?}");
        assert_eq!(t.counters.moved_away, 10);
        // Detection off: any number of moves, however fast.
        let mut t = Table::new(16).with_dup_rule(DupRule { max_moves: 0, ..DupRule::default() });
        run(&mut t, |t, o| t.local_up(5000, M, false, 0, o));
        assert_eq!(duplicates(&flap(&mut t, 50, 1, 1)), 0);
        assert_eq!(t.announced().next().map(|a| a.2), Some(50));
    }

    #[test]
    fn a_configured_station_is_never_taken_so_never_duplicate() {
        let mut t = Table::new(16);
        run(&mut t, |t, o| t.local_up(5000, M, true, 0, o));
        for seq in 1..=20 {
            let a = run(&mut t, |t, o| t.heard(Heard::Mac(route(M, "192.0.2.2", seq), true), u64::from(seq), o));
            assert!(a.is_empty(), "{a:?}");
        }
        assert_eq!((t.counters.claims_local, t.counters.duplicates, t.installed()), (20, 0, 0));
        assert_eq!(t.announced().collect::<Vec<_>>(), [(5000, M, 0, true)]);
    }

    #[test]
    fn a_station_flapping_between_two_other_hosts_is_frozen_where_it_was_until_cleared() {
        let rule = DupRule { max_moves: 3, window_ms: 10_000, hold_ms: 0 };
        let mut t = Table::new(16).with_dup_rule(rule);
        let hosts = ["192.0.2.1", "192.0.2.2"];
        let mut a = Vec::new();
        for seq in 0..3 {
            a = run(&mut t, |t, o| t.heard(Heard::Mac(route(M, hosts[seq as usize % 2], seq), true), 0, o));
        }
        assert_eq!(a, [Action::Install { vni: 5000, mac: M, endpoint: ip("192.0.2.1") }], "two moves");
        let a = run(&mut t, |t, o| t.heard(Heard::Mac(route(M, "192.0.2.2", 3), true), 10, o));
        assert_eq!(duplicates(&a), 1, "{a:?}");
        // Withdrawals change nothing either: it stays behind 192.0.2.1.
        assert!(run(&mut t, |t, o| t.heard(Heard::Mac(route(M, "192.0.2.1", 2), false), 20, o)).is_empty());
        // A hold of 0: frozen until cleared, whatever the time.
        assert!(run(&mut t, |t, o| t.expire_duplicates(u64::MAX / 2, o)).is_empty());
        assert_eq!(t.clear_duplicates(Some(5000), Some(N), 30, &mut Vec::new()), 0, "not that station");
        let mut a = Vec::new();
        assert_eq!(t.clear_duplicates(None, Some(M), 30, &mut a), 1);
        assert_eq!(
            a,
            [Action::Recovered { vni: 5000, mac: M }, Action::Install { vni: 5000, mac: M, endpoint: ip("192.0.2.2") }]
        );
        assert_eq!(t.installed(), 1);
    }

    #[test]
    fn mac_ip_routes_bind_addresses_and_the_station_stays_while_any_route_of_its_host_does() {
        let mut t = Table::new(16);
        let with_ip = |a: &str, seq| MacRoute { ip: Some(ip(a)), ..route(M, "192.0.2.1", seq) };
        // FRR announces the MAC alone and the MAC with its address: one station.
        let a = run(&mut t, |t, o| t.heard(Heard::Mac(with_ip("10.0.0.1", 0), true), 0, o));
        assert_eq!(a, [Action::Install { vni: 5000, mac: M, endpoint: ip("192.0.2.1") }], "a MAC+IP route alone");
        assert!(run(&mut t, |t, o| t.heard(Heard::Mac(route(M, "192.0.2.1", 0), true), 0, o)).is_empty());
        assert_eq!(t.bindings().collect::<Vec<_>>(), [(5000, ip("10.0.0.1"), M)]);
        assert_eq!((t.received().count(), t.endpoints().len()), (2, 1));
        // The address's route goes (its neighbour entry aged): the station stays.
        assert!(run(&mut t, |t, o| t.heard(Heard::Mac(with_ip("10.0.0.1", 0), false), 0, o)).is_empty());
        assert_eq!((t.bindings().count(), t.installed()), (0, 1));
        // A move is told by both routes; the higher number of any of them counts.
        run(&mut t, |t, o| t.heard(Heard::Mac(with_ip("10.0.0.1", 0), true), 0, o));
        let a = run(&mut t, |t, o| {
            t.heard(Heard::Mac(MacRoute { ip: Some(ip("10.0.0.1")), ..route(M, "192.0.2.2", 1) }, true), 0, o)
        });
        assert_eq!(a, [Action::Install { vni: 5000, mac: M, endpoint: ip("192.0.2.2") }]);
        assert_eq!(t.bindings().collect::<Vec<_>>(), [(5000, ip("10.0.0.1"), M)], "the new host's binding");
        // One host binds at most MAX_IPS_PER_STATION addresses to a station.
        for i in 0..MAX_IPS_PER_STATION as u8 + 4 {
            run(&mut t, |t, o| t.heard(Heard::Mac(with_ip(&format!("10.0.1.{i}"), 0), true), 0, o));
        }
        assert_eq!(t.counters.ips_over_limit, 5, "one of its 16 was bound already");
        // The last of the first host's routes goes: nothing kept of it.
        let keys: Vec<_> = t
            .received_routes()
            .filter(|(k, _)| matches!(k, RouteKey::Mac(_, _, e, _) if *e == ip("192.0.2.1")))
            .collect();
        for (_, h) in keys {
            run(&mut t, |t, o| t.heard(h, 0, o));
        }
        assert_eq!(t.endpoints().into_iter().collect::<Vec<_>>(), [ip("192.0.2.2")]);
    }
}

//! What a VXLAN tunnel port knows beyond the switch: which remote endpoint each inner MAC
//! is behind, which endpoints a flooded frame goes to, and which VNI carries which VLAN
//! (docs/architecture.md, "VXLAN tunnels").
//!
//! Sans-IO like the rest of the core: times are milliseconds supplied by the caller, and
//! endpoints are plain addresses; the port that owns a socket asks this table where to send.
//! The table is bounded: when full, new stations are not learned (their frames flood to
//! every endpoint, which still delivers them).
//!
//! Only known endpoints: unless opened (`remotes_only` false), a table accepts datagrams
//! from its configured endpoints alone — anything else is refused before a station or an
//! endpoint is learned from it — and floods to them alone (docs/architecture.md, "Tunnels
//! and the underlay").
//!
//! Which datagrams a tunnel takes in is a rule of the forwarding decision
//! ([`crate::decide`], stage 1: the VNI and whether the sender is one of the port's
//! endpoints say the frame's VLAN, or drop it); the port reports each datagram's
//! [`Origin`] and its [`TunnelRules`], and learns a station's endpoint only when the core,
//! after those checks and its own, tells it to ([`crate::Port::learn_remote`]).

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;

use sluice_wire::MacAddr;

/// Which VNI carries which frames.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VniMap {
    /// Every frame of the port (its native VLAN) in one VNI.
    Single(u32),
    /// A VNI per VLAN: (VLAN, VNI) pairs, each VLAN and each VNI once.
    PerVlan(Vec<(u16, u32)>),
}

impl VniMap {
    /// The VNI for a frame of `vlan` (`None`: untagged, the port's native VLAN).
    pub fn vni_of(&self, vlan: Option<u16>) -> Option<u32> {
        match (self, vlan) {
            (VniMap::Single(v), _) => Some(*v),
            (VniMap::PerVlan(m), Some(vid)) => m.iter().find(|p| p.0 == vid).map(|p| p.1),
            (VniMap::PerVlan(_), None) => None,
        }
    }

    /// The VLAN a received frame of `vni` belongs to: `Some(None)` for the single VNI
    /// (the frame stays untagged), `Some(Some(vid))` in a per-VLAN map, `None` for a VNI
    /// this port does not carry.
    pub fn vlan_of(&self, vni: u32) -> Option<Option<u16>> {
        match self {
            VniMap::Single(v) => (*v == vni).then_some(None),
            VniMap::PerVlan(m) => m.iter().find(|p| p.1 == vni).map(|p| Some(p.0)),
        }
    }
}

/// What the forwarding decision reads of a tunnel port: which VNIs it carries and whom it
/// takes datagrams from. Fixed while the port is attached.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TunnelRules {
    /// Which VNI carries which VLAN.
    pub vnis: VniMap,
    /// Datagrams are taken from `remotes` alone; any other sender's are dropped
    /// (`unknown_endpoint`).
    pub remotes_only: bool,
    /// The configured endpoints.
    pub remotes: Vec<IpAddr>,
    /// EVPN: stations and endpoints come from routes. Nothing is learned from datagrams,
    /// and the endpoints the routes name are accepted besides `remotes`.
    pub evpn: bool,
    /// EVPN: the endpoints the routes name now, sorted (the switch keeps this up to date:
    /// [`crate::Switch::evpn_endpoints`]). Hundreds of hosts: looked up by halves.
    pub announced: Vec<IpAddr>,
}

impl TunnelRules {
    /// Whether `sender` is one of the endpoints: configured, or named by a route.
    pub fn knows(&self, sender: IpAddr) -> bool {
        self.remotes.contains(&sender) || self.announced.binary_search(&sender).is_ok()
    }
}

/// Where one datagram came from: its VNI and the underlay address that sent it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Origin {
    /// The VXLAN network identifier in its header.
    pub vni: u32,
    /// The outer source address.
    pub sender: IpAddr,
}

/// One learned station behind the tunnel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RemoteEntry {
    /// The VNI it was heard in.
    pub vni: u32,
    /// Its MAC address.
    pub mac: MacAddr,
    /// The endpoint it is behind.
    pub endpoint: IpAddr,
    /// When a frame from it last arrived (ms).
    pub last_seen_ms: u64,
}

/// The endpoint table of one tunnel port.
pub struct Endpoints {
    stations: HashMap<(u32, MacAddr), (IpAddr, u64)>,
    /// Endpoints configured (`remotes`): always flooded to.
    configured: Vec<IpAddr>,
    /// The same, to look up.
    known: HashSet<IpAddr>,
    /// Only the configured endpoints are accepted (else any sender is learned).
    remotes_only: bool,
    /// Endpoints heard from, and when last: flooded to until they age out (only when
    /// `remotes_only` is off).
    heard: HashMap<IpAddr, u64>,
    max_stations: usize,
    max_endpoints: usize,
    aging_ms: u64,
    /// Stations not learned because the table was full.
    pub full_refusals: u64,
    /// EVPN: stations installed from routes (they do not age; only routes move them).
    pinned: HashMap<(u32, MacAddr), IpAddr>,
    /// EVPN: each VNI's flood list (the endpoints of its type-3 routes), besides the
    /// configured endpoints.
    vni_flood: HashMap<u32, Vec<IpAddr>>,
    /// EVPN: the endpoints routes name, accepted besides the configured ones.
    announced: HashSet<IpAddr>,
    /// Stations are learned from datagrams (off on an EVPN tunnel).
    learning: bool,
}

impl Endpoints {
    /// A table for `configured` endpoints, accepting only those (`remotes_only`) or any
    /// sender, learning at most `max_stations` stations and `max_endpoints` endpoints
    /// besides the configured ones, forgetting them after `aging_ms` of silence.
    pub fn new(
        configured: Vec<IpAddr>,
        remotes_only: bool,
        max_stations: usize,
        max_endpoints: usize,
        aging_ms: u64,
    ) -> Self {
        Endpoints {
            stations: HashMap::new(),
            known: configured.iter().copied().collect(),
            configured,
            remotes_only,
            heard: HashMap::new(),
            max_stations,
            max_endpoints,
            aging_ms,
            full_refusals: 0,
            pinned: HashMap::new(),
            vni_flood: HashMap::new(),
            announced: HashSet::new(),
            learning: true,
        }
    }

    /// An EVPN tunnel's table: nothing is learned from datagrams; stations, flood lists
    /// and further endpoints come from routes ([`Endpoints::pin`], [`Endpoints::set_flood`],
    /// [`Endpoints::set_announced`]).
    pub fn evpn(mut self) -> Self {
        self.learning = false;
        self
    }

    /// Whether datagrams from `endpoint` are accepted: it is configured or named by a
    /// route, or the table is open to any sender.
    pub fn accepts(&self, endpoint: IpAddr) -> bool {
        !self.remotes_only || self.known.contains(&endpoint) || self.announced.contains(&endpoint)
    }

    /// EVPN: station `mac` of `vni` is behind `endpoint` (from a route), or no longer.
    pub fn pin(&mut self, vni: u32, mac: MacAddr, endpoint: Option<IpAddr>) {
        match endpoint {
            Some(ep) => self.pinned.insert((vni, mac), ep),
            None => self.pinned.remove(&(vni, mac)),
        };
    }

    /// EVPN: `vni` floods to `endpoints` (besides the configured ones).
    pub fn set_flood(&mut self, vni: u32, endpoints: &[IpAddr]) {
        let mut v: Vec<IpAddr> = endpoints.iter().copied().filter(|e| !self.known.contains(e)).collect();
        v.sort();
        v.dedup();
        if v.is_empty() {
            self.vni_flood.remove(&vni);
        } else {
            self.vni_flood.insert(vni, v);
        }
    }

    /// EVPN: the endpoints the routes name now, accepted besides the configured ones.
    pub fn set_announced(&mut self, endpoints: &[IpAddr]) {
        self.announced = endpoints.iter().copied().collect();
    }

    /// Notes a frame from `mac` in `vni` that arrived from `endpoint` at `now_ms`. Returns
    /// false, learning nothing, when the endpoint is not accepted ([`Endpoints::accepts`]).
    /// Group source addresses (never a station) and the zero address are not learned; an
    /// accepted endpoint is remembered either way.
    pub fn learn(&mut self, vni: u32, mac: MacAddr, endpoint: IpAddr, now_ms: u64) -> bool {
        if !self.accepts(endpoint) {
            return false;
        }
        if !self.learning {
            return true;
        }
        if let Some(t) = self.heard.get_mut(&endpoint) {
            *t = now_ms;
        } else if !self.known.contains(&endpoint) && self.heard.len() < self.max_endpoints {
            self.heard.insert(endpoint, now_ms);
        }
        if mac.is_multicast() || mac.is_zero() {
            return true;
        }
        let room = self.stations.len() < self.max_stations;
        match self.stations.entry((vni, mac)) {
            std::collections::hash_map::Entry::Occupied(mut e) => {
                e.insert((endpoint, now_ms));
            }
            std::collections::hash_map::Entry::Vacant(e) if room => {
                e.insert((endpoint, now_ms));
            }
            std::collections::hash_map::Entry::Vacant(_) => self.full_refusals += 1,
        }
        true
    }

    /// Where a frame to `dst` in `vni` goes: the one endpoint it is known behind, or (a
    /// group address, an unknown or aged station) every endpoint once — the configured
    /// ones and those heard from within the aging time. Calls `f` per endpoint.
    pub fn targets(&self, vni: u32, dst: MacAddr, now_ms: u64, mut f: impl FnMut(IpAddr)) {
        if !dst.is_multicast()
            && let Some(&ep) = self.pinned.get(&(vni, dst))
        {
            f(ep);
            return;
        }
        if !dst.is_multicast()
            && let Some(&(ep, seen)) = self.stations.get(&(vni, dst))
            && now_ms.saturating_sub(seen) < self.aging_ms
        {
            f(ep);
            return;
        }
        for &ep in &self.configured {
            f(ep);
        }
        for &ep in self.vni_flood.get(&vni).into_iter().flatten() {
            f(ep);
        }
        for (&ep, &seen) in &self.heard {
            if now_ms.saturating_sub(seen) < self.aging_ms {
                f(ep);
            }
        }
    }

    /// How many endpoints a frame to `dst` in `vni` goes to now (see [`Endpoints::targets`]).
    pub fn fanout(&self, vni: u32, dst: MacAddr, now_ms: u64) -> usize {
        let mut n = 0;
        self.targets(vni, dst, now_ms, |_| n += 1);
        n
    }

    /// Forgets stations and endpoints silent for the aging time.
    pub fn expire(&mut self, now_ms: u64) {
        let aging = self.aging_ms;
        self.stations.retain(|_, e| now_ms.saturating_sub(e.1) < aging);
        self.heard.retain(|_, &mut seen| now_ms.saturating_sub(seen) < aging);
    }

    /// The learned stations, for `sluice fib show`.
    pub fn stations(&self) -> impl Iterator<Item = RemoteEntry> + '_ {
        self.stations.iter().map(|(&(vni, mac), &(endpoint, last_seen_ms))| RemoteEntry {
            vni,
            mac,
            endpoint,
            last_seen_ms,
        })
    }

    /// The endpoint `mac` in `vni` is behind, if learned.
    pub fn endpoint_of(&self, vni: u32, mac: MacAddr) -> Option<IpAddr> {
        self.pinned.get(&(vni, mac)).copied().or_else(|| self.stations.get(&(vni, mac)).map(|e| e.0))
    }

    /// EVPN: the endpoint a route puts `mac` of `vni` behind, if any.
    pub fn routed(&self, vni: u32, mac: MacAddr) -> Option<IpAddr> {
        self.pinned.get(&(vni, mac)).copied()
    }

    /// Endpoints a flood goes to now (configured, then heard).
    pub fn flood_set(&self, now_ms: u64) -> Vec<IpAddr> {
        let mut v = Vec::new();
        self.targets(0, MacAddr::BROADCAST, now_ms, |e| v.push(e));
        v
    }

    /// Changes the aging time (the switch's).
    pub fn set_aging_ms(&mut self, aging_ms: u64) {
        self.aging_ms = aging_ms;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }
    const A: MacAddr = MacAddr([2, 0, 0, 0, 0, 1]);
    const B: MacAddr = MacAddr([2, 0, 0, 0, 0, 2]);

    fn all(t: &Endpoints, vni: u32, dst: MacAddr, now: u64) -> Vec<IpAddr> {
        let mut v = Vec::new();
        t.targets(vni, dst, now, |e| v.push(e));
        v.sort();
        v
    }

    #[test]
    fn a_known_station_goes_to_its_endpoint_and_the_rest_floods_once_to_each() {
        let mut t = Endpoints::new(vec![ip("192.0.2.1"), ip("192.0.2.2")], false, 16, 16, 300_000);
        assert_eq!(all(&t, 7, A, 0), [ip("192.0.2.1"), ip("192.0.2.2")], "unknown: every configured endpoint");
        t.learn(7, A, ip("192.0.2.2"), 10);
        assert_eq!(all(&t, 7, A, 20), [ip("192.0.2.2")]);
        assert_eq!(all(&t, 8, A, 20).len(), 2, "another VNI is another LAN");
        assert_eq!(all(&t, 7, MacAddr::BROADCAST, 20).len(), 2);
        // An endpoint not configured is flooded to once heard from, until it ages out.
        t.learn(7, B, ip("192.0.2.3"), 30);
        assert_eq!(all(&t, 7, MacAddr::BROADCAST, 40), [ip("192.0.2.1"), ip("192.0.2.2"), ip("192.0.2.3")]);
        assert_eq!(t.flood_set(300_030).len(), 2, "aged: configured ones only");
        // A station that moves follows its new endpoint.
        t.learn(7, A, ip("192.0.2.1"), 50);
        assert_eq!(t.endpoint_of(7, A), Some(ip("192.0.2.1")));
        t.expire(300_040);
        assert_eq!(t.stations().count(), 1, "A (seen at 50) stays, B (30) went");
    }

    #[test]
    fn group_sources_are_not_learned_and_the_table_is_bounded() {
        let mut t = Endpoints::new(vec![], false, 1, 1, 1000);
        t.learn(1, MacAddr::BROADCAST, ip("fd00::1"), 0);
        assert_eq!(t.stations().count(), 0);
        t.learn(1, A, ip("fd00::1"), 0);
        t.learn(1, B, ip("fd00::1"), 0);
        assert_eq!((t.stations().count(), t.full_refusals), (1, 1));
        t.learn(1, A, ip("fd00::2"), 0);
        assert_eq!(t.flood_set(1), [ip("fd00::1")], "at most one heard endpoint");
        assert_eq!(all(&t, 1, B, 1), [ip("fd00::1")], "an unlearned station still floods");
    }

    #[test]
    fn only_configured_endpoints_are_heard_and_flooded_to() {
        let (a, b, forger) = (ip("192.0.2.1"), ip("192.0.2.2"), ip("192.0.2.66"));
        let mut t = Endpoints::new(vec![a, b], true, 16, 16, 300_000);
        assert!(t.accepts(a) && t.accepts(b) && !t.accepts(forger));
        // A sender not configured teaches nothing: neither a station nor an endpoint.
        assert!(!t.learn(7, A, forger, 0));
        assert!(!t.learn(7, MacAddr::BROADCAST, forger, 0));
        assert_eq!(t.stations().count(), 0);
        assert_eq!(all(&t, 7, MacAddr::BROADCAST, 1), [a, b], "floods go to the configured ones");
        assert_eq!(t.fanout(7, B, 1), 2, "an unknown station too");
        // A configured one does, and a station it claims is sent to it alone.
        assert!(t.learn(7, A, b, 10));
        assert_eq!((all(&t, 7, A, 20), t.fanout(7, A, 20)), (vec![b], 1));
        // Claiming a station another endpoint has does not reach the forger either.
        assert!(!t.learn(7, A, forger, 30));
        assert_eq!(t.endpoint_of(7, A), Some(b));
        // Opened, the same sender is learned (bounded as before).
        let mut open = Endpoints::new(vec![a], false, 16, 1, 300_000);
        assert!(open.learn(7, A, forger, 0));
        assert_eq!(open.flood_set(1), [a, forger]);
        assert!(open.learn(7, B, ip("192.0.2.67"), 0), "accepted, though no room to flood to it");
        assert_eq!(open.flood_set(1).len(), 2);
    }

    #[test]
    fn an_evpn_table_sends_by_routes_floods_per_vni_and_learns_nothing() {
        let (conf, a, b) = (ip("192.0.2.1"), ip("192.0.2.2"), ip("192.0.2.3"));
        let mut t = Endpoints::new(vec![conf], true, 16, 16, 1000).evpn();
        assert!(!t.accepts(a), "not yet named by a route");
        t.set_announced(&[a, b]);
        assert!(t.accepts(a) && t.accepts(b) && t.accepts(conf));
        assert!(t.learn(7, A, a, 0), "accepted");
        assert_eq!(t.stations().count(), 0, "but nothing learned");
        t.set_flood(7, &[b, conf, a]);
        assert_eq!(all(&t, 7, MacAddr::BROADCAST, 0), [conf, a, b], "the configured one once");
        assert_eq!(all(&t, 8, MacAddr::BROADCAST, 0), [conf], "another VNI's list is its own");
        t.pin(7, A, Some(b));
        assert_eq!((all(&t, 7, A, 5000), t.endpoint_of(7, A)), (vec![b], Some(b)), "never ages");
        t.pin(7, A, None);
        assert_eq!(all(&t, 7, A, 0).len(), 3, "removed: floods");
        t.set_flood(7, &[]);
        assert_eq!(all(&t, 7, MacAddr::BROADCAST, 0), [conf]);
    }

    #[test]
    fn vnis_map_to_vlans_both_ways() {
        let s = VniMap::Single(5000);
        assert_eq!((s.vni_of(None), s.vni_of(Some(3))), (Some(5000), Some(5000)));
        assert_eq!((s.vlan_of(5000), s.vlan_of(5001)), (Some(None), None));
        let m = VniMap::PerVlan(vec![(10, 5010), (20, 5020)]);
        assert_eq!((m.vni_of(Some(20)), m.vni_of(Some(30)), m.vni_of(None)), (Some(5020), None, None));
        assert_eq!((m.vlan_of(5010), m.vlan_of(5030)), (Some(Some(10)), None));
    }
}

//! EVPN routes as GoBGP paths, both ways (pure: no I/O).
//!
//! Out: a station here becomes a type-2 path — route distinguisher `router-id:index`,
//! Ethernet segment 0, Ethernet tag 0, `labels = [VNI]` (RFC 8365: the label field is
//! the VNI itself, which FRR reads so), the tunnel's local address as next hop, the route
//! target `ASN:VNI`, the VXLAN encapsulation community and, above sequence number 0 or
//! when configured, the MAC mobility community. A VNI's flood membership becomes a type-3
//! path with a PMSI tunnel attribute (ingress replication, label = VNI).
//!
//! In: a received path is decoded into [`Heard`], or refused with the reason, which the
//! agent counts.

use std::net::{IpAddr, Ipv4Addr};

use prost_types::Any;
use sluice_switch::evpn::{Heard, MacRoute};
use sluice_wire::MacAddr;

use crate::api::*;

const MAC_ROUTE: &str = "EVPNMACIPAdvertisementRoute";
const FLOOD_ROUTE: &str = "EVPNInclusiveMulticastEthernetTagRoute";
const RD_IP: &str = "RouteDistinguisherIPAddress";
const ORIGIN: &str = "OriginAttribute";
const NEXT_HOP: &str = "NextHopAttribute";
const MP_REACH: &str = "MpReachNLRIAttribute";
const EXT_COMMUNITIES: &str = "ExtendedCommunitiesAttribute";
const RT: &str = "TwoOctetAsSpecificExtended";
const ENCAP: &str = "EncapExtended";
const MOBILITY: &str = "MacMobilityExtended";
const PMSI: &str = "PmsiTunnelAttribute";

/// The BGP tunnel type of VXLAN (RFC 8365).
const TUNNEL_VXLAN: u32 = 8;
/// PMSI tunnel type: ingress replication.
const PMSI_INGRESS_REPLICATION: u32 = 6;
/// Extended community sub-type of a route target.
const SUBTYPE_ROUTE_TARGET: u32 = 2;
/// The largest VNI.
const MAX_VNI: u32 = (1 << 24) - 1;

/// Who we are in the routes we originate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Origin {
    /// Our AS (the route targets' AS, two octets as FRR derives them).
    pub asn: u32,
    /// Our router id: the route distinguishers' address.
    pub router_id: Ipv4Addr,
    /// The tunnel's local address: every route's next hop.
    pub next_hop: IpAddr,
}

fn rd(o: &Origin, vni: u32) -> Any {
    // (The index is 16 bits in a type-1 distinguisher; a VNI may not be.)
    any(RD_IP, &RouteDistinguisherIpAddress { admin: o.router_id.to_string(), assigned: vni & 0xffff })
}

fn attrs(o: &Origin, vni: u32, mobility: Option<(u32, bool)>) -> Vec<Any> {
    let mut communities = vec![
        any(
            RT,
            &TwoOctetAsSpecificExtended {
                is_transitive: true,
                sub_type: SUBTYPE_ROUTE_TARGET,
                asn: o.asn & 0xffff,
                local_admin: vni,
            },
        ),
        any(ENCAP, &EncapExtended { tunnel_type: TUNNEL_VXLAN }),
    ];
    if let Some((seq, sticky)) = mobility.filter(|&(seq, sticky)| seq > 0 || sticky) {
        communities.push(any(MOBILITY, &MacMobilityExtended { is_sticky: sticky, sequence_num: seq }));
    }
    vec![
        any(ORIGIN, &OriginAttribute { origin: 0 }),
        any(NEXT_HOP, &NextHopAttribute { next_hop: o.next_hop.to_string() }),
        any(EXT_COMMUNITIES, &ExtendedCommunitiesAttribute { communities }),
    ]
}

/// The type-2 path announcing station `mac` of `vni` here.
pub fn mac_path(o: &Origin, vni: u32, mac: MacAddr, ip: Option<IpAddr>, seq: u32, sticky: bool) -> Path {
    let nlri = EvpnMacIpAdvertisementRoute {
        rd: Some(rd(o, vni)),
        esi: Some(EthernetSegmentIdentifier { r#type: 0, value: vec![0; 9] }),
        ethernet_tag: 0,
        mac_address: mac.to_string(),
        ip_address: ip.map(|a| a.to_string()).unwrap_or_default(),
        labels: vec![vni],
    };
    Path {
        nlri: Some(any(MAC_ROUTE, &nlri)),
        pattrs: attrs(o, vni, Some((seq, sticky))),
        family: Some(Family::evpn()),
        ..Path::default()
    }
}

/// The type-3 path making us a member of `vni`'s flood list.
pub fn flood_path(o: &Origin, vni: u32) -> Path {
    let nlri = EvpnInclusiveMulticastEthernetTagRoute {
        rd: Some(rd(o, vni)),
        ethernet_tag: 0,
        ip_address: o.next_hop.to_string(),
    };
    let id = match o.next_hop {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    };
    let mut pattrs = attrs(o, vni, None);
    pattrs.push(any(PMSI, &PmsiTunnelAttribute { flags: 0, r#type: PMSI_INGRESS_REPLICATION, label: vni, id }));
    Path { nlri: Some(any(FLOOD_ROUTE, &nlri)), pattrs, family: Some(Family::evpn()), ..Path::default() }
}

/// Why a received path was not used.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Refused {
    /// Our own (no neighbour, or our next hop).
    Ours,
    /// Another EVPN route type (1, 4, 5: not used by a sluice tunnel).
    OtherType,
    /// The NLRI or an attribute does not decode.
    Malformed,
    /// No next hop.
    NoNextHop,
    /// No VNI: no label, or one above 24 bits.
    BadVni,
    /// A MAC that no station has (group, zero) or that does not parse.
    BadMac,
}

impl Refused {
    /// Its name in counters and logs.
    pub fn name(self) -> &'static str {
        match self {
            Refused::Ours => "ours",
            Refused::OtherType => "other_type",
            Refused::Malformed => "malformed",
            Refused::NoNextHop => "no_next_hop",
            Refused::BadVni => "bad_vni",
            Refused::BadMac => "bad_mac",
        }
    }
}

fn next_hop(p: &Path) -> Option<IpAddr> {
    p.pattrs.iter().find_map(|a| {
        from_any::<MpReachNlriAttribute>(a, MP_REACH)
            .and_then(|m| m.next_hops.first().and_then(|h| h.parse().ok()))
            .or_else(|| from_any::<NextHopAttribute>(a, NEXT_HOP).and_then(|n| n.next_hop.parse().ok()))
    })
}

fn mobility(p: &Path) -> (u32, bool) {
    p.pattrs
        .iter()
        .filter_map(|a| from_any::<ExtendedCommunitiesAttribute>(a, EXT_COMMUNITIES))
        .flat_map(|e| e.communities)
        .find_map(|c| from_any::<MacMobilityExtended>(&c, MOBILITY))
        .map_or((0, false), |m| (m.sequence_num, m.is_sticky))
}

/// Decodes a path the speaker received. `local` is our tunnel's address (paths with it
/// as next hop are ours, as are paths with no neighbour).
pub fn decode(p: &Path, local: IpAddr) -> Result<Heard, Refused> {
    if p.neighbor_ip.is_empty() {
        return Err(Refused::Ours);
    }
    let nlri = p.nlri.as_ref().ok_or(Refused::Malformed)?;
    let up = !p.is_withdraw;
    let hop = next_hop(p);
    if hop == Some(local) {
        return Err(Refused::Ours);
    }
    match any_name(nlri) {
        MAC_ROUTE => {
            let r: EvpnMacIpAdvertisementRoute = from_any(nlri, MAC_ROUTE).ok_or(Refused::Malformed)?;
            let vni = *r.labels.first().ok_or(Refused::BadVni)?;
            if vni == 0 || vni > MAX_VNI {
                return Err(Refused::BadVni);
            }
            let mac: MacAddr = r.mac_address.parse().map_err(|_| Refused::BadMac)?;
            if mac.is_multicast() || mac.is_zero() {
                return Err(Refused::BadMac);
            }
            let ip = if r.ip_address.is_empty() || r.ip_address == "<nil>" {
                None
            } else {
                Some(r.ip_address.parse().map_err(|_| Refused::Malformed)?)
            };
            // (A withdrawal may come without attributes: its originator is then the
            // distinguisher's address, as we and FRR number them.)
            let endpoint = hop.or_else(|| rd_admin(&r.rd)).ok_or(Refused::NoNextHop)?;
            let (seq, sticky) = mobility(p);
            Ok(Heard::Mac(MacRoute { vni, mac, ip, endpoint, seq, sticky }, up))
        }
        FLOOD_ROUTE => {
            let r: EvpnInclusiveMulticastEthernetTagRoute = from_any(nlri, FLOOD_ROUTE).ok_or(Refused::Malformed)?;
            let pmsi = p.pattrs.iter().find_map(|a| from_any::<PmsiTunnelAttribute>(a, PMSI));
            let vni = match (pmsi, r.ethernet_tag) {
                (Some(m), _) if m.label > 0 => m.label,
                (_, tag) if tag > 0 => tag,
                _ if !up => return Err(Refused::BadVni),
                _ => return Err(Refused::BadVni),
            };
            if vni > MAX_VNI {
                return Err(Refused::BadVni);
            }
            let endpoint: IpAddr = r.ip_address.parse().map_err(|_| Refused::Malformed)?;
            if endpoint == local {
                return Err(Refused::Ours);
            }
            Ok(Heard::Flood { vni, endpoint, up })
        }
        _ => Err(Refused::OtherType),
    }
}

fn rd_admin(rd: &Option<Any>) -> Option<IpAddr> {
    let rd: RouteDistinguisherIpAddress = from_any(rd.as_ref()?, RD_IP)?;
    rd.admin.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn origin() -> Origin {
        Origin { asn: 65000, router_id: "192.0.2.1".parse().unwrap(), next_hop: "192.0.2.1".parse().unwrap() }
    }

    fn from_peer(mut p: Path, hop: &str) -> Path {
        p.neighbor_ip = "192.0.2.254".into();
        for a in &mut p.pattrs {
            if any_name(a) == NEXT_HOP {
                *a = any(NEXT_HOP, &NextHopAttribute { next_hop: hop.into() });
            }
        }
        p
    }

    #[test]
    fn a_station_route_round_trips_with_its_vni_and_mobility() {
        let m: MacAddr = "02:00:00:00:0a:01".parse().unwrap();
        let p = mac_path(&origin(), 5000, m, None, 3, false);
        let local: IpAddr = "192.0.2.1".parse().unwrap();
        assert_eq!(decode(&p, local), Err(Refused::Ours), "no neighbour: ours");
        assert_eq!(decode(&from_peer(p.clone(), "192.0.2.1"), local), Err(Refused::Ours), "our next hop");
        let h = decode(&from_peer(p, "192.0.2.2"), local).unwrap();
        let want =
            MacRoute { vni: 5000, mac: m, ip: None, endpoint: "192.0.2.2".parse().unwrap(), seq: 3, sticky: false };
        assert_eq!(h, Heard::Mac(want, true));
    }

    #[test]
    fn a_flood_route_names_its_vni_and_endpoint_and_bad_ones_are_refused() {
        let local: IpAddr = "192.0.2.9".parse().unwrap();
        let h = decode(&from_peer(flood_path(&origin(), 5010), "192.0.2.1"), local).unwrap();
        assert_eq!(h, Heard::Flood { vni: 5010, endpoint: "192.0.2.1".parse().unwrap(), up: true });
        let mut bad = from_peer(mac_path(&origin(), 5000, MacAddr::BROADCAST, None, 0, false), "192.0.2.1");
        assert_eq!(decode(&bad, local), Err(Refused::BadMac));
        bad.nlri = Some(any("EVPNIPPrefixRoute", &OriginAttribute { origin: 0 }));
        assert_eq!(decode(&bad, local), Err(Refused::OtherType));
        bad.nlri = Some(Any { type_url: format!("x/{PACKAGE}.{MAC_ROUTE}"), value: vec![0xff, 0xff] });
        assert_eq!(decode(&bad, local), Err(Refused::Malformed));
    }

    #[test]
    fn a_route_binding_an_ipv4_or_ipv6_address_round_trips_and_a_bad_address_is_refused() {
        let m: MacAddr = "02:00:00:00:0a:01".parse().unwrap();
        let local: IpAddr = "192.0.2.9".parse().unwrap();
        for a in ["10.77.0.1", "fd00::1"] {
            let a: IpAddr = a.parse().unwrap();
            let p = from_peer(mac_path(&origin(), 5000, m, Some(a), 0, false), "192.0.2.1");
            let Ok(Heard::Mac(r, true)) = decode(&p, local) else { panic!("{p:?}") };
            assert_eq!((r.mac, r.ip, r.vni), (m, Some(a), 5000));
        }
        let mut p = from_peer(mac_path(&origin(), 5000, m, None, 0, false), "192.0.2.1");
        let mut nlri: EvpnMacIpAdvertisementRoute = from_any(p.nlri.as_ref().unwrap(), MAC_ROUTE).unwrap();
        nlri.ip_address = "10.77.0.300".into();
        p.nlri = Some(any(MAC_ROUTE, &nlri));
        assert_eq!(decode(&p, local), Err(Refused::Malformed));
    }
}

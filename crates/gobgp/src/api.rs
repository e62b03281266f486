//! The messages of GoBGP's gRPC API (package `apipb`, GoBGP 3.x) that sluice uses, declared
//! by their field numbers. Only the fields sluice reads or writes are declared; protobuf
//! skips the others when decoding, so a newer 3.x speaker's additions do no harm.
//!
//! Path attributes and NLRI travel as `google.protobuf.Any`: the type URL names the
//! message (`type.googleapis.com/apipb.NAME`), the value is its encoding ([`any`],
//! [`from_any`]).

use prost::Message;
use prost_types::Any;

/// The protobuf package of GoBGP's API, in type URLs and gRPC paths.
pub const PACKAGE: &str = "apipb";

/// Packs `m` as an `Any` named `name` (a message of the `apipb` package).
pub fn any<M: Message>(name: &str, m: &M) -> Any {
    Any { type_url: format!("type.googleapis.com/{PACKAGE}.{name}"), value: m.encode_to_vec() }
}

/// The message name an `Any` carries (`EVPNMACIPAdvertisementRoute`), without its prefix.
pub fn any_name(a: &Any) -> &str {
    a.type_url.rsplit(['/', '.']).next().unwrap_or("")
}

/// Decodes `a` as `M` if it is named `name`.
pub fn from_any<M: Message + Default>(a: &Any, name: &str) -> Option<M> {
    (any_name(a) == name).then(|| M::decode(a.value.as_slice()).ok()).flatten()
}

/// Address family identifiers.
pub mod family {
    /// Layer 2 VPN.
    pub const AFI_L2VPN: i32 = 25;
    /// EVPN.
    pub const SAFI_EVPN: i32 = 70;
}

/// An address family (AFI and SAFI).
#[derive(Clone, PartialEq, Message)]
pub struct Family {
    /// AFI.
    #[prost(int32, tag = "1")]
    pub afi: i32,
    /// SAFI.
    #[prost(int32, tag = "2")]
    pub safi: i32,
}

impl Family {
    /// L2VPN EVPN.
    pub fn evpn() -> Self {
        Family { afi: family::AFI_L2VPN, safi: family::SAFI_EVPN }
    }
}

/// The speaker's global settings.
#[derive(Clone, PartialEq, Message)]
pub struct Global {
    /// Our AS number.
    #[prost(uint32, tag = "1")]
    pub asn: u32,
    /// Our router id (an IPv4 address).
    #[prost(string, tag = "2")]
    pub router_id: String,
    /// TCP port BGP listens on (-1: none).
    #[prost(int32, tag = "3")]
    pub listen_port: i32,
    /// Addresses BGP listens on.
    #[prost(string, repeated, tag = "4")]
    pub listen_addresses: Vec<String>,
}

/// `StartBgp`.
#[derive(Clone, PartialEq, Message)]
pub struct StartBgpRequest {
    /// The settings.
    #[prost(message, optional, tag = "1")]
    pub global: Option<Global>,
}

/// `GetBgp`.
#[derive(Clone, PartialEq, Message)]
pub struct GetBgpRequest {}

/// `GetBgp`'s answer.
#[derive(Clone, PartialEq, Message)]
pub struct GetBgpResponse {
    /// The settings (AS 0: not started).
    #[prost(message, optional, tag = "1")]
    pub global: Option<Global>,
}

/// A peer's configuration.
#[derive(Clone, PartialEq, Message)]
pub struct PeerConf {
    /// Our AS towards it.
    #[prost(uint32, tag = "3")]
    pub local_asn: u32,
    /// Its address.
    #[prost(string, tag = "4")]
    pub neighbor_address: String,
    /// Its AS.
    #[prost(uint32, tag = "5")]
    pub peer_asn: u32,
}

/// A peer's state.
#[derive(Clone, PartialEq, Message)]
pub struct PeerState {
    /// Its address.
    #[prost(string, tag = "5")]
    pub neighbor_address: String,
    /// Its AS.
    #[prost(uint32, tag = "6")]
    pub peer_asn: u32,
    /// The session: 6 is established ([`SESSION_ESTABLISHED`]).
    #[prost(int32, tag = "13")]
    pub session_state: i32,
    /// Its router id.
    #[prost(string, tag = "20")]
    pub router_id: String,
}

/// `PeerState::session_state` of a session that is up.
pub const SESSION_ESTABLISHED: i32 = 6;

/// A session's timers (seconds).
#[derive(Clone, PartialEq, Message)]
pub struct TimersConfig {
    /// Between connection attempts.
    #[prost(uint64, tag = "1")]
    pub connect_retry: u64,
    /// Hold time.
    #[prost(uint64, tag = "2")]
    pub hold_time: u64,
    /// Keepalive interval.
    #[prost(uint64, tag = "3")]
    pub keepalive_interval: u64,
}

/// A peer's timers.
#[derive(Clone, PartialEq, Message)]
pub struct Timers {
    /// Configured.
    #[prost(message, optional, tag = "1")]
    pub config: Option<TimersConfig>,
}

/// Where a session runs from.
#[derive(Clone, PartialEq, Message)]
pub struct Transport {
    /// Our address.
    #[prost(string, tag = "1")]
    pub local_address: String,
}

/// An address family of a session, configured.
#[derive(Clone, PartialEq, Message)]
pub struct AfiSafiConfig {
    /// The family.
    #[prost(message, optional, tag = "1")]
    pub family: Option<Family>,
    /// On.
    #[prost(bool, tag = "2")]
    pub enabled: bool,
}

/// An address family of a session.
#[derive(Clone, PartialEq, Message)]
pub struct AfiSafi {
    /// Its configuration.
    #[prost(message, optional, tag = "2")]
    pub config: Option<AfiSafiConfig>,
}

/// A BGP peer.
#[derive(Clone, PartialEq, Message)]
pub struct Peer {
    /// Its configuration.
    #[prost(message, optional, tag = "2")]
    pub conf: Option<PeerConf>,
    /// Its state (answers only).
    #[prost(message, optional, tag = "5")]
    pub state: Option<PeerState>,
    /// Its timers.
    #[prost(message, optional, tag = "6")]
    pub timers: Option<Timers>,
    /// Where the session runs from.
    #[prost(message, optional, tag = "7")]
    pub transport: Option<Transport>,
    /// Its address families.
    #[prost(message, repeated, tag = "10")]
    pub afi_safis: Vec<AfiSafi>,
}

/// `AddPeer`.
#[derive(Clone, PartialEq, Message)]
pub struct AddPeerRequest {
    /// The peer.
    #[prost(message, optional, tag = "1")]
    pub peer: Option<Peer>,
}

/// `ListPeer`.
#[derive(Clone, PartialEq, Message)]
pub struct ListPeerRequest {
    /// One peer's address, or empty for all.
    #[prost(string, tag = "1")]
    pub address: String,
}

/// One of `ListPeer`'s answers.
#[derive(Clone, PartialEq, Message)]
pub struct ListPeerResponse {
    /// A peer.
    #[prost(message, optional, tag = "1")]
    pub peer: Option<Peer>,
}

/// A route and its attributes.
#[derive(Clone, PartialEq, Message)]
pub struct Path {
    /// The NLRI (an EVPN route message).
    #[prost(message, optional, tag = "1")]
    pub nlri: Option<Any>,
    /// The path attributes, each an `*Attribute` message.
    #[prost(message, repeated, tag = "2")]
    pub pattrs: Vec<Any>,
    /// The best path of its destination.
    #[prost(bool, tag = "4")]
    pub best: bool,
    /// A withdrawal.
    #[prost(bool, tag = "5")]
    pub is_withdraw: bool,
    /// Its family.
    #[prost(message, optional, tag = "9")]
    pub family: Option<Family>,
    /// The peer it came from (empty: ours).
    #[prost(string, tag = "15")]
    pub neighbor_ip: String,
    /// The id `AddPath` gave it.
    #[prost(bytes = "vec", tag = "16")]
    pub uuid: Vec<u8>,
}

/// Which table a call is about: the global one.
pub const TABLE_GLOBAL: i32 = 0;

/// `AddPath`.
#[derive(Clone, PartialEq, Message)]
pub struct AddPathRequest {
    /// [`TABLE_GLOBAL`].
    #[prost(int32, tag = "1")]
    pub table_type: i32,
    /// The path.
    #[prost(message, optional, tag = "3")]
    pub path: Option<Path>,
}

/// `AddPath`'s answer.
#[derive(Clone, PartialEq, Message)]
pub struct AddPathResponse {
    /// The path's id, for `DeletePath`.
    #[prost(bytes = "vec", tag = "1")]
    pub uuid: Vec<u8>,
}

/// `DeletePath`.
#[derive(Clone, PartialEq, Message)]
pub struct DeletePathRequest {
    /// [`TABLE_GLOBAL`].
    #[prost(int32, tag = "1")]
    pub table_type: i32,
    /// The family (with an empty path and uuid: every path of ours in it).
    #[prost(message, optional, tag = "3")]
    pub family: Option<Family>,
    /// The path.
    #[prost(message, optional, tag = "4")]
    pub path: Option<Path>,
    /// Or its id.
    #[prost(bytes = "vec", tag = "5")]
    pub uuid: Vec<u8>,
}

/// `ListPath`.
#[derive(Clone, PartialEq, Message)]
pub struct ListPathRequest {
    /// [`TABLE_GLOBAL`].
    #[prost(int32, tag = "1")]
    pub table_type: i32,
    /// The family.
    #[prost(message, optional, tag = "3")]
    pub family: Option<Family>,
}

/// One destination of `ListPath`'s answer.
#[derive(Clone, PartialEq, Message)]
pub struct Destination {
    /// The destination, as text.
    #[prost(string, tag = "1")]
    pub prefix: String,
    /// Its paths.
    #[prost(message, repeated, tag = "2")]
    pub paths: Vec<Path>,
}

/// One of `ListPath`'s answers.
#[derive(Clone, PartialEq, Message)]
pub struct ListPathResponse {
    /// A destination.
    #[prost(message, optional, tag = "1")]
    pub destination: Option<Destination>,
}

/// A filter of a table watch.
#[derive(Clone, PartialEq, Message)]
pub struct WatchTableFilter {
    /// 0: best paths.
    #[prost(int32, tag = "1")]
    pub r#type: i32,
    /// The current table first.
    #[prost(bool, tag = "2")]
    pub init: bool,
}

/// The table part of a watch.
#[derive(Clone, PartialEq, Message)]
pub struct WatchTable {
    /// Its filters.
    #[prost(message, repeated, tag = "1")]
    pub filters: Vec<WatchTableFilter>,
}

/// The peer part of a watch (present: peer events too).
#[derive(Clone, PartialEq, Message)]
pub struct WatchPeer {}

/// `WatchEvent`.
#[derive(Clone, PartialEq, Message)]
pub struct WatchEventRequest {
    /// Peer events.
    #[prost(message, optional, tag = "1")]
    pub peer: Option<WatchPeer>,
    /// Table events.
    #[prost(message, optional, tag = "2")]
    pub table: Option<WatchTable>,
}

/// A peer's event.
#[derive(Clone, PartialEq, Message)]
pub struct PeerEvent {
    /// 3: its state changed.
    #[prost(int32, tag = "1")]
    pub r#type: i32,
    /// The peer.
    #[prost(message, optional, tag = "2")]
    pub peer: Option<Peer>,
}

/// Paths that changed.
#[derive(Clone, PartialEq, Message)]
pub struct TableEvent {
    /// The paths.
    #[prost(message, repeated, tag = "2")]
    pub paths: Vec<Path>,
}

/// One of `WatchEvent`'s answers.
#[derive(Clone, PartialEq, Message)]
pub struct WatchEventResponse {
    /// A peer's event.
    #[prost(message, optional, tag = "2")]
    pub peer: Option<PeerEvent>,
    /// A table's.
    #[prost(message, optional, tag = "3")]
    pub table: Option<TableEvent>,
}

/// A route distinguisher of type 1 (an IPv4 address and a number).
#[derive(Clone, PartialEq, Message)]
pub struct RouteDistinguisherIpAddress {
    /// The address.
    #[prost(string, tag = "1")]
    pub admin: String,
    /// The number.
    #[prost(uint32, tag = "2")]
    pub assigned: u32,
}

/// An Ethernet segment identifier.
#[derive(Clone, PartialEq, Message)]
pub struct EthernetSegmentIdentifier {
    /// Its type.
    #[prost(uint32, tag = "1")]
    pub r#type: u32,
    /// Its value (empty or 9 zero bytes: single-homed).
    #[prost(bytes = "vec", tag = "2")]
    pub value: Vec<u8>,
}

/// An EVPN type-2 route: a station's MAC (and IP).
#[derive(Clone, PartialEq, Message)]
pub struct EvpnMacIpAdvertisementRoute {
    /// Its route distinguisher.
    #[prost(message, optional, tag = "1")]
    pub rd: Option<Any>,
    /// Its Ethernet segment.
    #[prost(message, optional, tag = "2")]
    pub esi: Option<EthernetSegmentIdentifier>,
    /// Its Ethernet tag.
    #[prost(uint32, tag = "3")]
    pub ethernet_tag: u32,
    /// The MAC, as text.
    #[prost(string, tag = "4")]
    pub mac_address: String,
    /// The IP, as text (empty: none).
    #[prost(string, tag = "5")]
    pub ip_address: String,
    /// Labels: the VNI, for VXLAN.
    #[prost(uint32, repeated, tag = "6")]
    pub labels: Vec<u32>,
}

/// An EVPN type-3 route: an endpoint's flood list membership.
#[derive(Clone, PartialEq, Message)]
pub struct EvpnInclusiveMulticastEthernetTagRoute {
    /// Its route distinguisher.
    #[prost(message, optional, tag = "1")]
    pub rd: Option<Any>,
    /// Its Ethernet tag.
    #[prost(uint32, tag = "2")]
    pub ethernet_tag: u32,
    /// The originator's address, as text.
    #[prost(string, tag = "3")]
    pub ip_address: String,
}

/// The ORIGIN attribute.
#[derive(Clone, PartialEq, Message)]
pub struct OriginAttribute {
    /// 0 IGP, 1 EGP, 2 incomplete.
    #[prost(uint32, tag = "1")]
    pub origin: u32,
}

/// The NEXT_HOP attribute.
#[derive(Clone, PartialEq, Message)]
pub struct NextHopAttribute {
    /// The next hop, as text.
    #[prost(string, tag = "1")]
    pub next_hop: String,
}

/// The MP_REACH_NLRI attribute (the next hop of a received EVPN route is here).
#[derive(Clone, PartialEq, Message)]
pub struct MpReachNlriAttribute {
    /// The family.
    #[prost(message, optional, tag = "1")]
    pub family: Option<Family>,
    /// Next hops, as text.
    #[prost(string, repeated, tag = "2")]
    pub next_hops: Vec<String>,
    /// The NLRI.
    #[prost(message, repeated, tag = "3")]
    pub nlris: Vec<Any>,
}

/// The extended communities attribute.
#[derive(Clone, PartialEq, Message)]
pub struct ExtendedCommunitiesAttribute {
    /// Each an `*Extended` message.
    #[prost(message, repeated, tag = "1")]
    pub communities: Vec<Any>,
}

/// A two-octet-AS specific extended community (sub-type 2: a route target).
#[derive(Clone, PartialEq, Message)]
pub struct TwoOctetAsSpecificExtended {
    /// Transitive.
    #[prost(bool, tag = "1")]
    pub is_transitive: bool,
    /// Its sub-type.
    #[prost(uint32, tag = "2")]
    pub sub_type: u32,
    /// The AS.
    #[prost(uint32, tag = "3")]
    pub asn: u32,
    /// The number.
    #[prost(uint32, tag = "4")]
    pub local_admin: u32,
}

/// The encapsulation extended community (tunnel type 8: VXLAN).
#[derive(Clone, PartialEq, Message)]
pub struct EncapExtended {
    /// The tunnel type.
    #[prost(uint32, tag = "1")]
    pub tunnel_type: u32,
}

/// The MAC mobility extended community.
#[derive(Clone, PartialEq, Message)]
pub struct MacMobilityExtended {
    /// Sticky (a static station).
    #[prost(bool, tag = "1")]
    pub is_sticky: bool,
    /// The sequence number.
    #[prost(uint32, tag = "2")]
    pub sequence_num: u32,
}

/// The PMSI tunnel attribute of a type-3 route.
#[derive(Clone, PartialEq, Message)]
pub struct PmsiTunnelAttribute {
    /// Flags.
    #[prost(uint32, tag = "1")]
    pub flags: u32,
    /// 6: ingress replication.
    #[prost(uint32, tag = "2")]
    pub r#type: u32,
    /// The VNI.
    #[prost(uint32, tag = "3")]
    pub label: u32,
    /// The endpoint's address (4 or 16 bytes).
    #[prost(bytes = "vec", tag = "4")]
    pub id: Vec<u8>,
}

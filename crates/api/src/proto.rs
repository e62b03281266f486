//! The control protocol: one JSON object per line over the switch's unix socket, one
//! response line per request. The `--json` outputs of the CLI are these responses' data.
//!
//! Two framings share the socket, told apart per line (docs/api.md): JSON-RPC 2.0
//! (`{"jsonrpc":"2.0","id":N,"method":"port_add","params":{…}}`, [`PROTOCOL`]`.`
//! [`PROTOCOL_MINOR`]), whose methods are [`Request`]'s names and params its fields, and
//! the older line protocol (`{"cmd":"port_add",…}` → [`Response`], version
//! [`PROTOCOL_V1`]), still answered for the clients that speak it.

use std::io::{BufRead, Read};

use serde::{Deserialize, Serialize};
use sluice_switch::PortCounters;
use sluice_switch::port::DeviceDrops;

use crate::config::PortSpec;

/// Major version of the protocol (JSON-RPC framing): a client works with a daemon of the
/// same major version, whatever its minor one.
pub const PROTOCOL: u32 = 2;

/// Minor version: grows with each addition (a method, a field) an older client can ignore.
pub const PROTOCOL_MINOR: u32 = 3;

/// The version `hello` reports to a client of the line protocol (`{"cmd":…}`), which
/// checks for exactly this one.
pub const PROTOCOL_V1: u32 = 1;

/// A request to the daemon. In JSON-RPC its name is the method and its fields the params
/// (by name); in the line protocol the name is the `cmd` field. Fields added later are
/// optional (`#[serde(default)]`) and fields a daemon does not know are ignored.
#[derive(Debug, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(tag = "cmd", rename_all = "snake_case")]
pub enum Request {
    /// Who are you? Answered with [`SwitchSummary`].
    Hello,
    /// Attach a port.
    PortAdd {
        /// The port.
        port: Box<PortSpec>,
        /// Success, doing nothing, when a port of that name with an equal description is
        /// attached (`--may-exist`); a different one is still refused, naming what differs.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        may_exist: bool,
    },
    /// Detach a port.
    PortDel {
        /// Its name.
        name: String,
        /// Success, doing nothing, when no port of that name is attached (`--if-exists`).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        if_exists: bool,
    },
    /// Answered with a [`StatsReport`] without counters.
    PortList,
    /// Answered with the MAC table ([`FibReport`]).
    FibShow,
    /// Add a static MAC entry.
    FibAdd {
        /// Station address.
        mac: String,
        /// VLAN.
        vlan: u16,
        /// Port.
        port: String,
    },
    /// Remove a MAC entry.
    FibDel {
        /// Station address.
        mac: String,
        /// VLAN.
        vlan: u16,
    },
    /// Counters of every port, or one.
    Stats {
        /// Only this port.
        port: Option<String>,
    },
    /// Zero every counter.
    StatsReset,
    /// Start monitor records (replacing any running).
    MonitorStart {
        /// The record file.
        file: std::path::PathBuf,
        /// Between records, in milliseconds.
        interval_ms: u64,
        /// The file is rotated before it passes this many MiB.
        max_mb: u64,
    },
    /// Stop monitor records.
    MonitorStop,
    /// Answered with a [`MonitorStatus`].
    MonitorStatus,
    /// Copies of a port's frames: answered once, then the connection carries capture
    /// records ([`CAPTURE_RECORD_HEADER`]) until the client closes it.
    Capture {
        /// The port.
        port: String,
        /// "in" (frames the port delivers), "out" (frames it is sent) or "both".
        direction: String,
        /// Bytes kept of each frame.
        snaplen: u32,
    },
    /// Stop the switch.
    Shutdown,
    /// Start the daemon again in place (the same process, its program image read anew):
    /// the kernel datapath keeps forwarding meanwhile and the new daemon takes it over.
    Restart,
    /// Grant a port VLANs (switches with `grants = true`).
    GrantAdd {
        /// The port's name (it need not be attached yet).
        port: String,
        /// VLANs to grant.
        vlans: Vec<u16>,
        /// Also let it be promiscuous (a mirror).
        #[serde(default)]
        promiscuous: bool,
    },
    /// Take VLANs (or promiscuous mode) back from a port; everything when `vlans` is empty
    /// and `promiscuous` false.
    GrantDel {
        /// The port's name.
        port: String,
        /// VLANs to revoke.
        vlans: Vec<u16>,
        /// Revoke promiscuous mode.
        #[serde(default)]
        promiscuous: bool,
    },
    /// Answered with the grants:
    /// `{"enforced": bool, "grants": {port: [vlans]}, "promiscuous": [ports]}`.
    GrantList,
    /// JSON-RPC only: answered with a [`Subscribed`], then the connection carries
    /// notifications (`{"jsonrpc":"2.0","method":"event","params":`[`Event`]`}`) until the
    /// client closes it.
    Subscribe {
        /// The kinds of event wanted ([`EVENT_KINDS`]); all when empty.
        #[serde(default)]
        kinds: Vec<String>,
    },
    // Security groups (docs/policy.md).
    /// Add a security-group rule to a port (attached or not): answered with
    /// `{"id": N}`, the rule's id.
    AclAdd {
        /// The port's name.
        port: String,
        /// The rule.
        rule: sluice_switch::acl::AclRuleSpec,
    },
    /// Delete a security-group rule.
    AclDel {
        /// Only a rule of this port.
        #[serde(default)]
        port: Option<String>,
        /// The rule's id.
        id: u32,
    },
    /// Answered with an [`AclReport`].
    AclList {
        /// Only this port's rules.
        #[serde(default)]
        port: Option<String>,
    },
    /// Set a port's default action for a direction (`allow` unless set).
    AclDefault {
        /// The port's name.
        port: String,
        /// "in" or "out".
        dir: String,
        /// "allow" or "deny".
        action: String,
    },
    /// Change a running port's rate limits, storm control or link-local forwarding; the
    /// settings not given stay as they are.
    PortSet {
        /// The port's name.
        name: String,
        /// The settings to change.
        #[serde(flatten)]
        set: PortSettings,
    },
    /// Answered with IGMP/MLD snooping's multicast database ([`MdbReport`]).
    MdbShow,
    /// Answered with the EVPN speaker, its sessions and the routes sent and received
    /// ([`EvpnReport`]).
    EvpnShow,
    /// Stations EVPN declared duplicate are decided afresh now, without waiting for
    /// `dup_hold` to pass. Answered with [`EvpnCleared`].
    EvpnClearDuplicates {
        /// Only this VNI's.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        vni: Option<u32>,
        /// Only this station (`aa:bb:cc:dd:ee:ff`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mac: Option<String>,
    },
}

/// What `port_set` changes on a port (absent: unchanged; a rate of 0: no limit).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct PortSettings {
    /// `rate_in`, Mbit/s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_in: Option<f64>,
    /// `rate_out`, Mbit/s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_out: Option<f64>,
    /// `burst`, KiB (0: the default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<u64>,
    /// `storm_broadcast_pps`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storm_broadcast_pps: Option<u32>,
    /// `storm_multicast_pps`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storm_multicast_pps: Option<u32>,
    /// `storm_burst` (0: the default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storm_burst: Option<u32>,
    /// `forward_link_local` (an empty list: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forward_link_local: Option<Vec<String>>,
}

impl PortSettings {
    /// Applies these changes to a port's description (a 0 removes a setting).
    pub fn apply(&self, p: &mut PortSpec) {
        let keep = |new: Option<f64>, old: Option<f64>| new.map(|r| (r > 0.0).then_some(r)).unwrap_or(old);
        p.rate_in = keep(self.rate_in, p.rate_in);
        p.rate_out = keep(self.rate_out, p.rate_out);
        p.burst = self.burst.map(|b| (b > 0).then_some(b)).unwrap_or(p.burst);
        let keep32 = |new: Option<u32>, old: Option<u32>| new.map(|r| (r > 0).then_some(r)).unwrap_or(old);
        p.storm_broadcast_pps = keep32(self.storm_broadcast_pps, p.storm_broadcast_pps);
        p.storm_multicast_pps = keep32(self.storm_multicast_pps, p.storm_multicast_pps);
        p.storm_burst = keep32(self.storm_burst, p.storm_burst);
        if let Some(f) = &self.forward_link_local {
            p.forward_link_local = f.clone();
        }
    }
}

/// The methods (the names of [`Request`]'s variants).
pub const METHODS: &[&str] = &[
    "hello",
    "port_add",
    "port_del",
    "port_list",
    "fib_show",
    "fib_add",
    "fib_del",
    "stats",
    "stats_reset",
    "monitor_start",
    "monitor_stop",
    "monitor_status",
    "capture",
    "shutdown",
    "restart",
    "grant_add",
    "grant_del",
    "grant_list",
    "subscribe",
    "acl_add",
    "acl_del",
    "acl_list",
    "acl_default",
    "port_set",
    "mdb_show",
    "evpn_show",
    "evpn_clear_duplicates",
];

/// JSON-RPC's version string.
pub const JSONRPC: &str = "2.0";

/// Error codes of JSON-RPC answers: JSON-RPC's own (-32700 to -32603) and sluice's
/// (-32000 and below).
pub mod code {
    /// The line is not JSON.
    pub const PARSE_ERROR: i64 = -32700;
    /// JSON, but not a request object (a batch, a missing `method`, a wrong `jsonrpc`).
    pub const INVALID_REQUEST: i64 = -32600;
    /// No such method.
    pub const METHOD_NOT_FOUND: i64 = -32601;
    /// The params are not the method's (a missing or ill-typed field, params by position).
    pub const INVALID_PARAMS: i64 = -32602;
    /// The daemon failed to encode its answer.
    pub const INTERNAL_ERROR: i64 = -32603;
    /// The switch refused the request; the message says why and what to do.
    pub const REFUSED: i64 = -32000;
    /// The request names a port the switch does not have.
    pub const NO_SUCH_PORT: i64 = -32001;
    /// What the request would add exists already.
    pub const ALREADY_EXISTS: i64 = -32002;
    /// The datapath did not take the request in time (it may still run it): try again.
    pub const BUSY: i64 = -32003;
    /// The switch is stopping.
    pub const STOPPING: i64 = -32004;
    /// A limit was reached (connections, subscribers, a request's size or its time).
    pub const LIMIT: i64 = -32005;
}

/// A JSON-RPC error object.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct RpcError {
    /// One of [`code`].
    pub code: i64,
    /// What went wrong and what to do, in a sentence.
    pub message: String,
    /// More, when there is more (the method or field concerned).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<serde_json::Value>,
}

impl RpcError {
    /// An error of code `code` saying `message`.
    pub fn new(code: i64, message: impl Into<String>) -> Self {
        RpcError { code, message: message.into(), data: None }
    }
}

/// A JSON-RPC answer as a client reads it (`result` or `error`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RpcResponse {
    /// "2.0".
    pub jsonrpc: String,
    /// The request's id (null when the request could not be read).
    #[serde(default)]
    pub id: serde_json::Value,
    /// The answer, on success (null for methods that answer nothing).
    #[serde(default)]
    pub result: Option<serde_json::Value>,
    /// The error, on failure.
    #[serde(default)]
    pub error: Option<RpcError>,
}

/// How a request line was framed, and so how it is answered.
#[derive(Debug, Clone, PartialEq)]
pub enum Framing {
    /// The line protocol: answered with a [`Response`].
    V1,
    /// JSON-RPC with this id; `None` for a notification (a request without an id), which
    /// is run and not answered.
    Rpc(Option<serde_json::Value>),
}

impl Framing {
    /// The answer line (with its newline) to a request framed so; `None` for a JSON-RPC
    /// notification. `Ok(None)` is success without data.
    pub fn answer(&self, r: std::result::Result<Option<serde_json::Value>, RpcError>) -> Option<String> {
        let v = match (self, r) {
            (Framing::Rpc(None), _) => return None,
            (Framing::Rpc(Some(id)), Ok(data)) => {
                serde_json::json!({"jsonrpc": JSONRPC, "id": id, "result": data.unwrap_or(serde_json::Value::Null)})
            }
            (Framing::Rpc(Some(id)), Err(e)) => serde_json::json!({"jsonrpc": JSONRPC, "id": id, "error": e}),
            (Framing::V1, Ok(data)) => serde_json::json!(Response { ok: true, error: None, data }),
            (Framing::V1, Err(e)) => serde_json::json!(Response { ok: false, error: Some(e.message), data: None }),
        };
        let mut line = v.to_string();
        line.push('\n');
        Some(line)
    }
}

/// The longest request line the daemon reads.
pub const MAX_REQUEST: usize = 1 << 20;

/// What the daemon takes from a control connection in one read.
#[derive(Debug)]
pub enum Incoming {
    /// The connection ended (or failed, or sat idle past its timeout).
    End,
    /// A line longer than the limit: the connection is refused and closed.
    TooLong,
    /// A line that is not a request, with why (it is answered, the connection stays).
    Malformed(Framing, RpcError),
    /// A request, and how to answer it.
    Request(Framing, Request),
}

/// Reads the next request line (blank lines are skipped), reading at most `max` bytes of it.
pub fn read_request(r: &mut impl BufRead, max: usize) -> Incoming {
    loop {
        let mut line = Vec::new();
        match r.by_ref().take(max as u64).read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => return Incoming::End,
            Ok(n) if n == max && line.last() != Some(&b'\n') => return Incoming::TooLong,
            Ok(_) => {}
        }
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        return parse_request(&line);
    }
}

/// Reads one request line in either framing: an object with a `jsonrpc` member is
/// JSON-RPC, anything else the line protocol.
pub fn parse_request(line: &[u8]) -> Incoming {
    use serde_json::Value;
    let v: Value = match serde_json::from_slice(line) {
        Ok(v) => v,
        Err(e) => {
            let rpc = line.windows(9).any(|w| w == b"\"jsonrpc\"");
            let framing = if rpc { Framing::Rpc(Some(Value::Null)) } else { Framing::V1 };
            return Incoming::Malformed(framing, RpcError::new(code::PARSE_ERROR, format!("malformed request: {e}")));
        }
    };
    let invalid =
        |why: &str| Incoming::Malformed(Framing::Rpc(Some(Value::Null)), RpcError::new(code::INVALID_REQUEST, why));
    let mut obj = match v {
        Value::Array(_) => return invalid("batches are not supported: send one request object per line"),
        Value::Object(o) if o.contains_key("jsonrpc") => o,
        v => {
            return match serde_json::from_value::<Request>(v) {
                Ok(req) => Incoming::Request(Framing::V1, req),
                Err(e) => Incoming::Malformed(
                    Framing::V1,
                    RpcError::new(code::INVALID_REQUEST, format!("malformed request: {e}")),
                ),
            };
        }
    };
    let id = match obj.remove("id") {
        None => None,
        Some(id @ (Value::Null | Value::Number(_) | Value::String(_))) => Some(id),
        Some(_) => return invalid("the id must be a number, a string or null"),
    };
    if obj.get("jsonrpc").and_then(Value::as_str) != Some(JSONRPC) {
        return invalid("\"jsonrpc\" must be \"2.0\"");
    }
    let framing = Framing::Rpc(id);
    let Some(Value::String(method)) = obj.remove("method") else {
        return Incoming::Malformed(framing, RpcError::new(code::INVALID_REQUEST, "\"method\" must be a string"));
    };
    if !METHODS.contains(&method.as_str()) {
        let mut e = RpcError::new(
            code::METHOD_NOT_FOUND,
            format!("no method {method:?}; the methods are {}", METHODS.join(", ")),
        );
        e.data = Some(serde_json::json!({"method": method}));
        return Incoming::Malformed(framing, e);
    }
    let mut params = match obj.remove("params") {
        None | Some(Value::Null) => serde_json::Map::new(),
        Some(Value::Object(p)) => p,
        Some(_) => {
            return Incoming::Malformed(
                framing,
                RpcError::new(code::INVALID_PARAMS, "params go by name, as an object (see docs/api.md)"),
            );
        }
    };
    params.insert("cmd".into(), Value::String(method.clone()));
    match serde_json::from_value::<Request>(Value::Object(params)) {
        Ok(req) => Incoming::Request(framing, req),
        Err(e) => {
            let mut err = RpcError::new(code::INVALID_PARAMS, format!("params of {method}: {e}"));
            err.data = Some(serde_json::json!({"method": method}));
            Incoming::Malformed(framing, err)
        }
    }
}

/// The kinds of [`Event`], as `subscribe` names them.
pub const EVENT_KINDS: &[&str] = &[
    "port_up",
    "port_down",
    "station_learned",
    "station_moved",
    "station_aged",
    "station_removed",
    "uplink_failover",
    "events_lost",
];

/// Answer to [`Request::Subscribe`].
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Subscribed {
    /// The kinds this connection receives.
    pub kinds: Vec<String>,
    /// The sequence number the next event will have.
    pub seq: u64,
}

/// One event, the params of an `event` notification.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Event {
    /// Numbers the switch's events in order, from 1; a gap is events this connection did
    /// not receive (kinds it did not ask for, or lost ones: see `events_lost`).
    pub seq: u64,
    /// When the daemon published it, Unix time in seconds.
    pub time: f64,
    /// What happened.
    #[serde(flatten)]
    pub what: EventKind,
}

/// What an [`Event`] tells.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum EventKind {
    /// A port was attached.
    PortUp {
        /// The port.
        port: String,
        /// Why: "attached".
        reason: String,
    },
    /// A port was detached, or stopped working.
    PortDown {
        /// The port.
        port: String,
        /// Why: "detached", or what made it fail.
        reason: String,
    },
    /// A station was learned behind a port (or a static entry was added).
    StationLearned {
        /// Station address.
        mac: String,
        /// VLAN.
        vlan: u16,
        /// The port.
        port: String,
        /// A configured entry.
        #[serde(rename = "static")]
        is_static: bool,
    },
    /// A station moved to another port.
    StationMoved {
        /// Station address.
        mac: String,
        /// VLAN.
        vlan: u16,
        /// The port it is behind now.
        port: String,
        /// The port it was behind.
        from: String,
    },
    /// A station was silent past the aging time and was forgotten.
    StationAged {
        /// Station address.
        mac: String,
        /// VLAN.
        vlan: u16,
        /// The port it was behind.
        port: String,
    },
    /// A station was forgotten for another reason (its port went away, an operator
    /// removed the entry, a failover).
    StationRemoved {
        /// Station address.
        mac: String,
        /// VLAN.
        vlan: u16,
        /// The port it was behind.
        port: String,
        /// A configured entry.
        #[serde(rename = "static")]
        is_static: bool,
    },
    /// An uplink moved to another of its devices.
    UplinkFailover {
        /// The uplink port.
        port: String,
        /// What happened, in a sentence.
        what: String,
    },
    /// Events were lost before reaching this connection: the switch's queue was full, or
    /// this connection read too slowly.
    EventsLost {
        /// How many.
        count: u64,
    },
}

impl EventKind {
    /// Its name, one of [`EVENT_KINDS`].
    pub fn name(&self) -> &'static str {
        match self {
            EventKind::PortUp { .. } => "port_up",
            EventKind::PortDown { .. } => "port_down",
            EventKind::StationLearned { .. } => "station_learned",
            EventKind::StationMoved { .. } => "station_moved",
            EventKind::StationAged { .. } => "station_aged",
            EventKind::StationRemoved { .. } => "station_removed",
            EventKind::UplinkFailover { .. } => "uplink_failover",
            EventKind::EventsLost { .. } => "events_lost",
        }
    }
}

/// An `event` notification's line (with its newline).
pub fn event_line(e: &Event) -> String {
    let mut line = serde_json::json!({"jsonrpc": JSONRPC, "method": "event", "params": e}).to_string();
    line.push('\n');
    line
}

/// The answer to `grant_list`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, schemars::JsonSchema)]
pub struct GrantReport {
    /// The switch enforces grants.
    pub enforced: bool,
    /// VLANs granted, by port.
    pub grants: std::collections::BTreeMap<String, std::collections::BTreeSet<u16>>,
    /// Ports allowed to be promiscuous (mirrors).
    pub promiscuous: std::collections::BTreeSet<String>,
}

/// The answer to `acl_add`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, schemars::JsonSchema)]
pub struct AclAdded {
    /// The rule's id.
    pub id: u32,
}

/// One security-group rule in an [`AclReport`].
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct AclRuleReport {
    /// Its port.
    pub port: String,
    /// Its id.
    pub id: u32,
    /// Frames it decided (new connections, and frames of no connection).
    pub hits: u64,
    /// The rule.
    pub rule: sluice_switch::acl::AclRuleSpec,
}

/// A port's default actions in an [`AclReport`].
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct AclDefaults {
    /// The port.
    pub port: String,
    /// For what its guest sends: "allow" or "deny".
    #[serde(rename = "in")]
    pub dir_in: String,
    /// For what it is sent.
    pub out: String,
}

/// The connection tracker's numbers (user-space datapath).
#[derive(Debug, Clone, Default, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ConntrackReport {
    /// Connections remembered.
    pub entries: u64,
    /// The table's size.
    pub max: u64,
    /// New connections refused because the table was full (`ct_full` drops).
    pub full: u64,
    /// The kernel datapath: the kernel conntrack zone its TCP and UDP connections are in
    /// (the numbers above are the switch's own table's: ICMP echo, ports in user space).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_zone: Option<u16>,
}

/// The answer to `acl_list`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, schemars::JsonSchema)]
pub struct AclReport {
    /// The rules, per port in match order.
    pub rules: Vec<AclRuleReport>,
    /// The ports with rules or defaults, and their defaults.
    pub defaults: Vec<AclDefaults>,
    /// The connection tracker.
    pub conntrack: ConntrackReport,
}

/// The JSON Schema of the protocol (`sluice api schema`, docs/api.schema.json): a request
/// ([`Request`], whose `cmd` is the JSON-RPC method and whose other fields are its params),
/// and in `x-results` each method's result, in `x-event` an event's params.
pub fn schema() -> serde_json::Value {
    let mut g = schemars::generate::SchemaSettings::draft2020_12().into_generator();
    let request = g.subschema_for::<Request>();
    let results: Vec<(&str, serde_json::Value)> = vec![
        ("hello", g.subschema_for::<SwitchSummary>().to_value()),
        ("port_list", g.subschema_for::<StatsReport>().to_value()),
        ("stats", g.subschema_for::<StatsReport>().to_value()),
        ("fib_show", g.subschema_for::<FibReport>().to_value()),
        ("monitor_start", g.subschema_for::<MonitorStatus>().to_value()),
        ("monitor_stop", g.subschema_for::<MonitorStatus>().to_value()),
        ("monitor_status", g.subschema_for::<MonitorStatus>().to_value()),
        (
            "capture",
            serde_json::json!({"type": "object", "properties": {"port": {"type": "string"}, "snaplen": {"type": "integer"}}}),
        ),
        ("grant_list", g.subschema_for::<GrantReport>().to_value()),
        ("subscribe", g.subschema_for::<Subscribed>().to_value()),
        ("acl_add", g.subschema_for::<AclAdded>().to_value()),
        ("acl_list", g.subschema_for::<AclReport>().to_value()),
        ("mdb_show", g.subschema_for::<MdbReport>().to_value()),
        ("evpn_show", g.subschema_for::<EvpnReport>().to_value()),
        ("evpn_clear_duplicates", g.subschema_for::<EvpnCleared>().to_value()),
    ];
    let event = g.subschema_for::<Event>();
    let error = g.subschema_for::<RpcError>();
    let mut x_results = serde_json::Map::new();
    for m in METHODS {
        let r = results.iter().find(|(n, _)| n == m).map_or(serde_json::Value::Null, |(_, s)| s.clone());
        x_results.insert((*m).into(), r);
    }
    let defs: serde_json::Map<String, serde_json::Value> = g.take_definitions(true).into_iter().collect();
    serde_json::json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "sluice control API",
        "description": format!(
            "Protocol {PROTOCOL}.{PROTOCOL_MINOR} (docs/api.md). Validates a request: in JSON-RPC its `cmd` is the method and its other fields the params. `x-results` gives each method's result (null: none), `x-event` an `event` notification's params, `x-error` an error object. Generated by `sluice api schema`."
        ),
        "$ref": request.to_value()["$ref"],
        "x-results": x_results,
        "x-event": event.to_value(),
        "x-error": error.to_value(),
        "$defs": defs,
    })
}

/// The daemon's answer.
#[derive(Debug, Serialize, Deserialize)]
pub struct Response {
    /// The request succeeded.
    pub ok: bool,
    /// Why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The answer's payload.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<serde_json::Value>,
}

/// Answer to [`Request::Hello`].
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct SwitchSummary {
    /// Protocol version: [`PROTOCOL`] to a JSON-RPC client, [`PROTOCOL_V1`] to one of the
    /// line protocol.
    pub protocol: u32,
    /// Its minor version ([`PROTOCOL_MINOR`]).
    #[serde(default)]
    pub protocol_minor: u32,
    /// sluice version.
    pub version: String,
    /// Switch name.
    pub name: String,
    /// Transport mode ("l2").
    pub mode: String,
    /// Daemon process id.
    pub pid: u32,
    /// When this daemon started (Unix time, ns): tells a restarted daemon (same pid) apart.
    #[serde(default)]
    pub started_ns: u64,
    /// Lossless mode.
    pub lossless: bool,
    /// Which datapath forwards: "user" or "kernel".
    #[serde(default = "user_datapath")]
    pub datapath: String,
    /// Busy-polling datapath.
    pub poll: bool,
    /// Default MTU.
    pub mtu: u16,
    /// Attached ports.
    pub ports: usize,
    /// Where the Prometheus / OpenMetrics endpoint listens, if it does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics: Option<String>,
    /// The switch's gateway and its dnsmasq, when it has one (`gateway =`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<GatewayStatus>,
}

/// What the kernel datapath did with a kernel port's frames.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
pub struct KernelPortStats {
    /// Frames from the port the kernel forwarded itself (to one port).
    pub forwarded: u64,
    /// Frames from the port the kernel flooded itself.
    #[serde(default)]
    pub flooded: u64,
    /// Frames from the port the kernel sent up to the core (to learn, flood, answer, or
    /// for a port in user space).
    pub upcalls: u64,
    /// Of those, frames of a kind the kernel had no current verdict for (the first of a
    /// kind, or the first after the switch's rules changed): the core decided them and
    /// gave the kernel its verdict for the rest of their kind.
    #[serde(default)]
    pub misses: u64,
    /// Frames the kernel dropped itself (included in the port's drops).
    pub drops: u64,
}

fn user_datapath() -> String {
    "user".into()
}

/// One port in one traffic class.
#[derive(Clone, Debug, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ClassStats {
    /// The class's name.
    pub name: String,
    /// A lossless class (a full output holds its frames back).
    pub lossless: bool,
    /// Frames of the class waiting in the port's queue.
    pub queued: usize,
    /// The pause watchdog declared the port stuck in this class (frames toward it dropped).
    pub stuck: bool,
    /// Frames in, out, drops by cause, watchdog trips.
    pub counters: sluice_switch::ClassCounters,
}

/// Counters and state of one port (the `ports[]` items of `sluice stats --json`).
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct PortStats {
    /// Port name.
    pub name: String,
    /// Kind ("tap").
    pub kind: String,
    /// Network namespace of its device, if not the switch's.
    pub netns: Option<String>,
    /// VLAN membership, as `access 10` or `trunk 10,20 native 1`.
    pub vlan: String,
    /// MTU.
    pub mtu: u16,
    /// Offloads on (GSO frames cross whole).
    pub offload: bool,
    /// Its sender can be held back (not reading from it stops the sender rather than
    /// losing frames): the switch can be lossless from this port's guest on.
    #[serde(default)]
    pub lossless_input: bool,
    /// Frames waiting in its output queue.
    pub queued: usize,
    /// Frames from it waiting for room at their outputs (lossless classes).
    pub held: usize,
    /// Its input is paused: its held frames reached the switch's `hold_len`.
    #[serde(default)]
    pub paused: bool,
    /// Per traffic class, in the switch's class order (the user-space core's view).
    #[serde(default)]
    pub classes: Vec<ClassStats>,
    /// Frames from it waiting for their next hop's address (Layer 3 mode).
    #[serde(default)]
    pub resolving: usize,
    /// Frames the kernel datapath sent up to the core that the core has not taken yet
    /// (kernel ports; lost ones stay counted here).
    #[serde(default)]
    pub upcall: u64,
    /// The kernel datapath's part of the counters (kernel ports only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel: Option<KernelPortStats>,
    /// Why the port stopped working, if it did.
    pub failed: Option<String>,
    /// The port's own account of its link (a vhost-user port: the VM connected, or what
    /// it waits for).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link: Option<String>,
    /// The switch's counters for the port.
    pub counters: PortCounters,
    /// Drops counted by the device underneath (the TAP in the kernel).
    pub device_drops: Option<DeviceDrops>,
}

/// Answer to [`Request::Stats`] and [`Request::PortList`].
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct StatsReport {
    /// The switch.
    pub switch: SwitchSummary,
    /// Seconds since the daemon started.
    pub uptime_s: f64,
    /// Seconds since counters were last reset.
    pub counters_age_s: f64,
    /// Ports, in the order they were attached.
    pub ports: Vec<PortStats>,
    /// Counters of ports removed since the last reset, added up.
    pub departed: PortCounters,
    /// MAC table summary.
    pub fib: FibSummary,
    /// The kernel datapath's own figures (switches on the kernel datapath).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel: Option<KernelSummary>,
    /// CPU time the daemon used.
    #[serde(default)]
    pub cpu: CpuReport,
}

/// A capture record on the wire, after the answer to [`Request::Capture`]: kind (u8: 0 a
/// frame the port delivered, 1 a frame it was sent, 2 the count of copies lost so far as
/// 8 bytes of data, 3 the port went away), the time (u64 ns since the epoch), the frame's
/// length on the wire (u32) and the data's length (u32), big-endian; then the data.
pub const CAPTURE_RECORD_HEADER: usize = 17;

/// Whether monitor records are being written, and where.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
pub struct MonitorStatus {
    /// Records are being written.
    pub running: bool,
    /// The record file.
    pub file: Option<String>,
    /// Between records, in milliseconds.
    pub interval_ms: u64,
    /// Rotation size, MiB.
    pub max_mb: u64,
    /// Records written since this recording started.
    pub records: u64,
}

/// CPU time a switch's daemon used since it started (user + system), in seconds.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub struct CpuReport {
    /// The datapath thread's (on the kernel datapath the kernel's forwarding is not in it:
    /// it runs in the guests' softirq time).
    pub datapath_s: f64,
    /// The whole process's (the datapath, control and metrics threads).
    pub process_s: f64,
}

/// The kernel datapath as a whole.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct KernelSummary {
    /// The upcall TAP: frames the kernel hands to the core go out of it.
    pub upcall_device: String,
    /// Frames the upcall TAP dropped because its queue was full (lost on the way up; they
    /// stay in their ports' `upcall` gauge), if the device's counters could be read.
    pub upcall_queue_drops: Option<u64>,
    /// Frames others sent out of the upcall TAP (a socket in the switch's namespace bound
    /// to it, the kernel's own), dropped at its egress before its queue: only the kernel
    /// datapath's upcalls reach the daemon.
    #[serde(default)]
    pub upcall_egress_refused: u64,
    /// Frames read from the upcall TAP that named no port (dropped).
    pub upcalls_refused: u64,
    /// Decisions of the core the kernel's maps refused (a full map, a port with no slot):
    /// the frames they concern go up to the core instead.
    #[serde(default)]
    pub map_updates_failed: u64,
}

/// MAC table summary.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct FibSummary {
    /// Entries now.
    pub entries: usize,
    /// Capacity.
    pub max_entries: usize,
    /// Aging time, seconds.
    pub aging_s: u64,
    /// Stations seen moving between ports.
    pub moves: u64,
    /// Stations not learned because the table was full.
    pub full_refusals: u64,
}

/// One MAC table entry.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct FibEntryReport {
    /// VLAN.
    pub vlan: u16,
    /// Station address.
    pub mac: String,
    /// Port name.
    pub port: String,
    /// Configured rather than learned.
    #[serde(rename = "static")]
    pub is_static: bool,
    /// Seconds since last seen (learned entries).
    pub age_s: Option<f64>,
    /// Behind a tunnel port: the remote endpoint the station was heard from, or (origin
    /// `evpn`) the next hop of the route that put it there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// How the entry came: `learned`, `static` (configured) or `evpn` (another host's
    /// route).
    #[serde(default = "learned")]
    pub origin: String,
}

fn learned() -> String {
    "learned".into()
}

/// One group's membership, in an [`MdbReport`].
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct MdbGroupReport {
    /// VLAN.
    pub vlan: u16,
    /// The IP group.
    pub group: String,
    /// Its port set's id (what the kernel datapath's `sluice_mdb` holds).
    pub set: u32,
    /// Member ports, each with the seconds left of its membership.
    pub ports: Vec<MdbMemberReport>,
}

/// A member port of a group.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct MdbMemberReport {
    /// Port name.
    pub port: String,
    /// Seconds until the membership expires unless reported again.
    pub expires_s: f64,
}

/// A router port.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct MdbRouterReport {
    /// Port name.
    pub port: String,
    /// Learned from queries: seconds left; `None`: configured (`mcast_router = "always"`).
    pub expires_s: Option<f64>,
}

/// The querier of one family.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct MdbQuerierReport {
    /// `"switch"`: the switch sends the general queries itself; `"other"`: another
    /// querier is heard.
    pub who: String,
    /// The other querier's address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// The port it is heard on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<String>,
}

/// Per-port snooping counters.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct MdbPortCounters {
    /// Port name.
    pub port: String,
    /// Reports read.
    pub reports: u64,
    /// Leaves read.
    pub leaves: u64,
    /// Queries heard.
    pub queries: u64,
    /// Joins refused, the database or the port's share of it full.
    pub mdb_full: u64,
    /// Group records beyond a message's bound, not read.
    pub truncated: u64,
}

/// The EVPN speaker, in an [`EvpnReport`].
#[derive(Debug, Clone, Default, Serialize, Deserialize, schemars::JsonSchema)]
pub struct EvpnSpeakerReport {
    /// `spawned` (the switch runs it) or `attached` (one already running).
    pub mode: String,
    /// The speaker's API socket.
    pub api: String,
    /// `running`, `restarting`, `stopped` or `failed` (spawned); `connected` or
    /// `disconnected` (attached).
    pub state: String,
    /// Its pid (spawned, while it runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// Times it was started again.
    pub restarts: u64,
    /// Our AS and router id.
    pub asn: u32,
    /// The router id.
    pub router_id: String,
    /// Whether the agent is connected to its API now.
    pub connected: bool,
    /// Why the last connection ended, or failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

/// One BGP session, in an [`EvpnReport`].
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct EvpnPeerReport {
    /// The peer's address.
    pub address: String,
    /// Its AS.
    pub asn: u32,
    /// `established`, `active`, `idle` …
    pub state: String,
}

/// One EVPN route, in an [`EvpnReport`].
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct EvpnRouteReport {
    /// 2 (a station) or 3 (a flood list membership).
    #[serde(rename = "type")]
    pub route_type: u8,
    /// The VNI.
    pub vni: u32,
    /// The station (type 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
    /// Its IP address, when bound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip: Option<String>,
    /// The endpoint: ours for routes sent, the originator's for routes received.
    pub endpoint: String,
    /// MAC mobility sequence number.
    pub seq: u32,
    /// A configured station.
    pub sticky: bool,
    /// Received routes: `installed` (the switch sends to it), `lost` (another route for the
    /// station holds: a higher sequence number, or ours) or `over_limit` (waiting for room);
    /// sent routes: `announced`.
    pub status: String,
}

/// Answer to [`Request::EvpnShow`].
#[derive(Debug, Clone, Default, Serialize, Deserialize, schemars::JsonSchema)]
pub struct EvpnReport {
    /// The EVPN port.
    pub port: String,
    /// The speaker.
    pub speaker: EvpnSpeakerReport,
    /// The BGP sessions.
    pub peers: Vec<EvpnPeerReport>,
    /// Routes announced.
    pub sent: Vec<EvpnRouteReport>,
    /// Routes received.
    pub received: Vec<EvpnRouteReport>,
    /// Counters: `received`, `installed`, `over_limit`, `claims_local`, `moved_away`,
    /// `flood_over_limit`, `duplicates`, `refused_<reason>`, `announce_errors`, `resyncs`.
    pub counters: std::collections::BTreeMap<String, u64>,
    /// Stations declared duplicate, frozen now (since 2.3).
    #[serde(default)]
    pub duplicates: Vec<EvpnDuplicateReport>,
}

/// A station that moved between hosts too often, declared duplicate: nothing is announced,
/// withdrawn or installed for it until it recovers. In an [`EvpnReport`].
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct EvpnDuplicateReport {
    /// The VNI.
    pub vni: u32,
    /// The station.
    pub mac: String,
    /// The moves counted within `dup_window` that made it duplicate.
    pub moves: u32,
    /// The hosts that have it: endpoints, this host's first when it is here.
    pub hosts: Vec<String>,
    /// Whether it is here (behind a local port).
    pub here: bool,
    /// Seconds since it was declared duplicate.
    pub frozen_s: u64,
    /// Seconds until it recovers by itself (absent: `dup_hold = 0`, until cleared).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovers_in_s: Option<u64>,
}

/// Answer to [`Request::EvpnClearDuplicates`].
#[derive(Debug, Clone, Default, Serialize, Deserialize, schemars::JsonSchema)]
pub struct EvpnCleared {
    /// Stations no longer frozen.
    pub cleared: u64,
}

/// Answer to [`Request::MdbShow`].
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct MdbReport {
    /// Snooping is on (`mcast_snooping`).
    pub enabled: bool,
    /// It prunes now: the same as `enabled`, since snooping prunes from the switch's first
    /// frame (kept for the clients that read it).
    pub pruning: bool,
    /// Memberships, by VLAN and group.
    pub groups: Vec<MdbGroupReport>,
    /// Router ports.
    pub routers: Vec<MdbRouterReport>,
    /// IGMP's querier.
    pub querier_v4: MdbQuerierReport,
    /// MLD's querier.
    pub querier_v6: MdbQuerierReport,
    /// Per-port counters.
    pub counters: Vec<MdbPortCounters>,
}

/// Answer to [`Request::FibShow`].
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct FibReport {
    /// Summary.
    pub summary: FibSummary,
    /// Entries sorted by VLAN and address.
    pub entries: Vec<FibEntryReport>,
}

#[cfg(test)]
mod port_request_tests {
    use super::*;

    /// A client that knows nothing of `may_exist` / `if_exists` still gets its requests
    /// understood (as they always were: not idempotent), and the flags are left out of a
    /// request that does not set them.
    #[test]
    fn idempotence_flags_are_optional_on_the_wire() {
        let add: Request = serde_json::from_str(r#"{"cmd":"port_add","port":{"name":"t0"}}"#).unwrap();
        assert!(matches!(add, Request::PortAdd { may_exist: false, .. }));
        let del: Request = serde_json::from_str(r#"{"cmd":"port_del","name":"t0"}"#).unwrap();
        assert!(matches!(del, Request::PortDel { if_exists: false, .. }));
        let del = Request::PortDel { name: "t0".into(), if_exists: false };
        assert_eq!(serde_json::to_string(&del).unwrap(), r#"{"cmd":"port_del","name":"t0"}"#);
        let add: Request = serde_json::from_str(
            r#"{"cmd":"port_add","port":{"name":"c1","type":"veth","ifname":"eth0"},"may_exist":true}"#,
        )
        .unwrap();
        assert!(matches!(add, Request::PortAdd { may_exist: true, ref port } if port.guest_ifname() == "eth0"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(line: &str) -> Incoming {
        parse_request(line.as_bytes())
    }

    #[test]
    fn each_line_is_read_in_its_own_framing() {
        assert!(
            matches!(parse(r#"{"cmd":"port_del","name":"t1"}"#), Incoming::Request(Framing::V1, Request::PortDel { name, .. }) if name == "t1")
        );
        let rpc = r#"{"jsonrpc":"2.0","id":7,"method":"port_del","params":{"name":"t1"}}"#;
        assert!(
            matches!(parse(rpc), Incoming::Request(Framing::Rpc(Some(id)), Request::PortDel { name, .. }) if id == 7 && name == "t1")
        );
        // A newer client's extra param is ignored; a request without params has its defaults.
        let newer = r#"{"jsonrpc":"2.0","id":"a","method":"stats","params":{"port":"t1","since_minor":3}}"#;
        assert!(matches!(parse(newer), Incoming::Request(_, Request::Stats { port: Some(p) }) if p == "t1"));
        assert!(
            matches!(parse(r#"{"jsonrpc":"2.0","id":1,"method":"subscribe"}"#), Incoming::Request(_, Request::Subscribe { kinds }) if kinds.is_empty())
        );
        // A notification (no id) is run and not answered.
        let Incoming::Request(f, _) = parse(r#"{"jsonrpc":"2.0","method":"hello"}"#) else { panic!() };
        assert_eq!(f, Framing::Rpc(None));
        assert_eq!(f.answer(Ok(None)), None);
    }

    #[test]
    fn what_is_not_a_request_is_answered_with_its_code() {
        let code_of = |l: &str| match parse(l) {
            Incoming::Malformed(Framing::Rpc(Some(_)), e) => e.code,
            other => panic!("{l}: {other:?}"),
        };
        assert_eq!(code_of(r#"{"jsonrpc":"2.0","id":1,"method":"#), code::PARSE_ERROR);
        assert_eq!(code_of(r#"[{"jsonrpc":"2.0","id":1,"method":"hello"}]"#), code::INVALID_REQUEST);
        assert_eq!(code_of(r#"{"jsonrpc":"1.0","id":1,"method":"hello"}"#), code::INVALID_REQUEST);
        assert_eq!(code_of(r#"{"jsonrpc":"2.0","id":{},"method":"hello"}"#), code::INVALID_REQUEST);
        assert_eq!(code_of(r#"{"jsonrpc":"2.0","id":1,"method":"nosuch"}"#), code::METHOD_NOT_FOUND);
        assert_eq!(code_of(r#"{"jsonrpc":"2.0","id":1,"method":"port_del"}"#), code::INVALID_PARAMS);
        assert_eq!(code_of(r#"{"jsonrpc":"2.0","id":1,"method":"port_del","params":["t1"]}"#), code::INVALID_PARAMS);
        assert!(matches!(parse(r#"{"cmd":"nosuch"}"#), Incoming::Malformed(Framing::V1, _)));
        assert!(matches!(parse("not json"), Incoming::Malformed(Framing::V1, _)));
        // Answers: JSON-RPC's with the id and the error object, the line protocol's as before.
        let e = RpcError::new(code::NO_SUCH_PORT, "no port");
        let a = Framing::Rpc(Some(3.into())).answer(Err(e.clone())).unwrap();
        assert_eq!(a, "{\"error\":{\"code\":-32001,\"message\":\"no port\"},\"id\":3,\"jsonrpc\":\"2.0\"}\n");
        assert_eq!(Framing::V1.answer(Err(e)).unwrap(), "{\"error\":\"no port\",\"ok\":false}\n");
        let ok = Framing::Rpc(Some(4.into())).answer(Ok(None)).unwrap();
        assert_eq!(ok, "{\"id\":4,\"jsonrpc\":\"2.0\",\"result\":null}\n");
    }

    #[test]
    fn the_methods_are_the_requests_and_the_event_kinds_the_events() {
        let schema = schema();
        let variants: Vec<String> = schema["$defs"]["Request"]["oneOf"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v["properties"]["cmd"]["const"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(variants, METHODS, "METHODS lists Request's variants, in order");
        let kinds: Vec<String> = schema["$defs"]["Event"]["oneOf"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v["properties"]["kind"]["const"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(kinds, EVENT_KINDS);
    }

    #[test]
    fn the_checked_in_schema_is_the_generated_one() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/api.schema.json");
        let checked_in = std::fs::read_to_string(path).unwrap_or_default();
        let generated = serde_json::to_string_pretty(&schema()).unwrap() + "\n";
        assert!(
            checked_in == generated,
            "docs/api.schema.json differs from the protocol's types: regenerate it with \
             `cargo run --release -p sluice -- api schema > docs/api.schema.json` and commit it"
        );
    }
}

// ---- The gateway's state (`sluice status`): docs/policy.md, "A gateway". ----

/// A switch's gateway as it runs: its addresses, port and interface, and its dnsmasq.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
pub struct GatewayStatus {
    /// The gateway's address with the subnet's prefix (`10.77.0.254/24`).
    pub address: String,
    /// Its IPv6 address announced by router advertisements, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address6: Option<String>,
    /// The host's interface carrying the addresses.
    pub interface: String,
    /// The switch's port it is attached by.
    pub port: String,
    /// The addresses DHCP hands out, `FIRST-LAST`.
    pub dhcp_range: String,
    /// dnsmasq answers DNS on the gateway's address.
    pub dns: bool,
    /// The device the subnet is masqueraded out of (`None`: any).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uplink: Option<String>,
    /// The nftables table of the masquerade (`ip` family).
    pub nft_table: String,
    /// dnsmasq: "running", "restarting" (waiting out its back-off), "failed" (gave up) or
    /// "stopped".
    pub dnsmasq: String,
    /// Its process id while it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// How many times it was started again after it exited.
    pub restarts: u64,
    /// How it last exited, with its last lines on stderr.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_exit: Option<String>,
}

//! The control protocol: one JSON object per line over the switch's unix socket, one
//! response line per request. The `--json` outputs of the CLI are these responses' data.

use std::io::{BufRead, Read};

use serde::{Deserialize, Serialize};
use sluice_switch::PortCounters;
use sluice_switch::port::DeviceDrops;

use crate::config::PortSpec;

/// Version of this protocol; a client refuses a daemon that speaks another.
pub const PROTOCOL: u32 = 1;

/// A request to the daemon.
#[derive(Debug, Serialize, Deserialize)]
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
    Malformed(String),
    /// A request.
    Request(Request),
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
        return match serde_json::from_slice::<Request>(&line) {
            Ok(req) => Incoming::Request(req),
            Err(e) => Incoming::Malformed(format!("malformed request: {e}")),
        };
    }
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
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SwitchSummary {
    /// Protocol version.
    pub protocol: u32,
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
}

/// What the kernel datapath did with a kernel port's frames.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
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
#[derive(Clone, Debug, Serialize, Deserialize)]
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
#[derive(Debug, Clone, Serialize, Deserialize)]
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
#[derive(Debug, Clone, Serialize, Deserialize)]
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
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
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
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
pub struct CpuReport {
    /// The datapath thread's (on the kernel datapath the kernel's forwarding is not in it:
    /// it runs in the guests' softirq time).
    pub datapath_s: f64,
    /// The whole process's (the datapath, control and metrics threads).
    pub process_s: f64,
}

/// The kernel datapath as a whole.
#[derive(Debug, Clone, Serialize, Deserialize)]
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
#[derive(Debug, Clone, Serialize, Deserialize)]
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
#[derive(Debug, Clone, Serialize, Deserialize)]
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
    /// Behind a tunnel port: the remote endpoint the station was heard from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
}

/// Answer to [`Request::FibShow`].
#[derive(Debug, Clone, Serialize, Deserialize)]
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

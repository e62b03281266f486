//! A study's conditions: the same paths measured quiet and under attack (docs/study.md,
//! "Conditions"). A condition other than `quiet` starts attackers on the cell's topology
//! before its workload and stops them after; the plan interleaves conditions as it does
//! paths, so quiet and attacked cells of one path alternate in one run.
//!
//! - `rings` ([`rings`]): a hostile VM-less vhost-user guest on the path's switch;
//! - `vm-feed` ([`rings`]): `rings`'s control, the same feeder's frames to a well-behaved
//!   VM-less guest (not an attack: what any guest receiving that much costs);
//! - `mac-flood`, `gso-bomb` ([`flood`]): an extra guest on the path's switch or bridge,
//!   flooding new source MACs, or sending UDP-GSO frames of 48-byte segments;
//! - `underlay-flood` ([`flood`]): a host on an overlay's underlay that is no tunnel
//!   endpoint, sending VXLAN datagrams as fast as one thread can;
//! - `capture` ([`capture`]): a capture of another guest's port to a file, that guest
//!   pinging the server meanwhile;
//! - `stopped-receiver` ([`stopped`]): a third guest behind a relay, streamed to by the
//!   cell's client, its relay stopped for the middle third of the cell;
//! - `draining-receiver` ([`stopped`]): `stopped-receiver`'s control, the same third
//!   guest and stream, its relay never stopped;
//! - `fib-flush` ([`fib`]): the path's switch forgets every station it learned, ten times
//!   a second, so first packets keep coming;
//! - `port-churn` ([`churn`]): five ports added to the path's switch and removed again,
//!   every second.
//!
//! Invariants: every attacker is a thread of the study process whose every loop ends at
//! the cell's stop flag or the condition's deadline (the cell's duration and a minute);
//! everything a condition makes — namespaces, interfaces, switch ports, socket
//! directories — has a name unique to the study process and the cell, and is removed
//! when the [`Disturbance`] stops or is dropped, also on a failed start. The attackers'
//! own CPU is measured per thread and kept apart from the path's ([`AttackRecord::cpu_s`]).

pub mod capture;
pub mod churn;
pub mod fib;
pub mod flood;
pub mod frames;
pub mod rings;
pub mod stopped;

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use sluice_sys::bail;
use sluice_sys::error::Context;

use crate::error::Result;
use serde::{Deserialize, Serialize};

use sluice_api::client::Client;
use sluice_api::config::{PortKind, PortSpec};
use sluice_api::proto::{Request, StatsReport};
use sluice_lab::compared::{Attach, Topology};
use sluice_lab::guests::sh;
use sluice_sys::netns;

/// What the host does while a cell runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Condition {
    /// Nothing but the cell's workload.
    Quiet,
    /// A hostile vhost-user guest abusing its rings on the path's switch.
    Rings,
    /// `rings`'s control: its feeder's frames to a well-behaved vhost-user guest.
    VmFeed,
    /// A host on the overlay's underlay, not a tunnel endpoint, flooding VXLAN datagrams.
    UnderlayFlood,
    /// A guest flooding frames from 10,000 new source MACs a second.
    MacFlood,
    /// A guest sending 2,000 UDP-GSO datagrams a second cut into 48-byte segments.
    GsoBomb,
    /// A capture of another guest's port to a file, that guest pinging the server.
    Capture,
    /// A third guest behind a relay, streamed to by the client; its relay stopped for the
    /// middle third of the cell.
    StoppedReceiver,
    /// `stopped-receiver`'s control: the same third guest and stream, never stopped.
    DrainingReceiver,
    /// The path's switch forgets every station it learned, every 100 ms.
    FibFlush,
    /// Five ports added to the path's switch and removed again, every second.
    PortChurn,
}

/// Paths a `rings` attacker attaches to: single-host labs whose switch takes a vhost-user
/// port and drops rather than holds (a lossless switch would hold senders for a guest that
/// posts no buffers: another attack).
pub const RING_PATHS: &[&str] = &["sluice-l2", "sluice-l2-poll", "sluice-l2-stream", "sluice-kernel"];
/// Paths an extra hostile guest attaches to (`mac-flood`, `gso-bomb`).
pub const GUEST_PATHS: &[&str] = &["sluice-l2", "sluice-l2-poll", "sluice-l2-stream", "sluice-kernel", "linux-bridge"];
/// Paths whose switch can capture a port (`capture`) or take ports that come and go
/// (`port-churn`): single-host sluice labs.
pub const CAPTURE_PATHS: &[&str] = &[
    "sluice-l2",
    "sluice-l2-lossless",
    "sluice-l2-poll",
    "sluice-l2-stream",
    "sluice-l2-lossless-stream",
    "sluice-kernel",
];
/// Paths whose guests are behind relays on stream ports (`stopped-receiver`): a relay
/// can be stopped, a TAP cannot.
pub const STREAM_PATHS: &[&str] = &[
    "sluice-l2-stream",
    "sluice-l2-lossless-stream",
    "sluice-l2-lossless-stream-hold1",
    "sluice-l2-lossless-stream-zovn",
];
/// Paths with an underlay (`underlay-flood`).
pub const UNDERLAY_PATHS: &[&str] =
    &["overlay-kernel", "overlay-sluice", "overlay-sluice-kernel", "overlay-sluice-lossless", "overlay-mixed"];

impl Condition {
    /// Every condition.
    pub const ALL: [Condition; 11] = [
        Condition::Quiet,
        Condition::Rings,
        Condition::VmFeed,
        Condition::UnderlayFlood,
        Condition::MacFlood,
        Condition::GsoBomb,
        Condition::Capture,
        Condition::StoppedReceiver,
        Condition::DrainingReceiver,
        Condition::FibFlush,
        Condition::PortChurn,
    ];

    /// Its name in a study file.
    pub fn name(self) -> &'static str {
        match self {
            Condition::Quiet => "quiet",
            Condition::Rings => "rings",
            Condition::VmFeed => "vm-feed",
            Condition::UnderlayFlood => "underlay-flood",
            Condition::MacFlood => "mac-flood",
            Condition::GsoBomb => "gso-bomb",
            Condition::Capture => "capture",
            Condition::StoppedReceiver => "stopped-receiver",
            Condition::DrainingReceiver => "draining-receiver",
            Condition::FibFlush => "fib-flush",
            Condition::PortChurn => "port-churn",
        }
    }

    /// The condition called `name`.
    pub fn parse(name: &str) -> Option<Condition> {
        Condition::ALL.into_iter().find(|c| c.name() == name)
    }

    /// What it does, in a sentence.
    pub fn about(self) -> &'static str {
        match self {
            Condition::Quiet => "nothing but the workload",
            Condition::Rings => {
                "a VM-less vhost-user guest on the path's switch abusing its rings, 200 ms each in turn: a receive available index far ahead while a second guest sends it up to 20,000 frames a second, a transmit index far ahead, indirect chains, loops of zero-length descriptors, loops of 1-byte descriptors, a queue of 1-byte receive buffers, chain heads beyond the table; its rings reset after each"
            }
            Condition::VmFeed => {
                "rings's control, no attack: the same second guest sending the same frames at the same rate (up to 20,000 a second) to a well-behaved VM-less vhost-user guest on the path's switch, which posts receive buffers, takes its frames and posts them again"
            }
            Condition::UnderlayFlood => {
                "a host on the underlay (192.168.77.250, not a tunnel endpoint) sending VXLAN datagrams to the server's host as fast as one thread can: inner broadcasts and unicasts from 16,384 made-up stations, foreign VNIs, garbage"
            }
            Condition::MacFlood => {
                "an extra guest on the path's switch sending frames from 10,000 new source MACs a second to unknown destinations (a packet socket)"
            }
            Condition::GsoBomb => {
                "an extra guest on the path's switch sending the server 2,000 UDP datagrams a second of 6,000 bytes cut into 48-byte segments (UDP_SEGMENT)"
            }
            Condition::Capture => {
                "a capture of an extra guest's port (both directions, whole frames) to a pcap file, as `sluice capture -w FILE` makes it, while that guest pings the server every 10 ms"
            }
            Condition::StoppedReceiver => {
                "a third guest behind a relay on a stream port, receiving a TCP stream from the client beside the cell's workload; its relay stopped (SIGSTOP) for the middle third of the cell, then continued"
            }
            Condition::DrainingReceiver => {
                "stopped-receiver's control: the same third guest behind a relay and the same TCP stream from the client to it, its relay never stopped"
            }
            Condition::FibFlush => {
                "the path's switch or bridge forgets every station it learned every 100 ms (sluice: its learned MAC entries removed through the control socket; the Linux bridge: `bridge fdb flush dynamic`), so frames keep being the first between stations it does not know"
            }
            Condition::PortChurn => {
                "five TAP ports (in a namespace of their own, no traffic) added to the path's switch through its control socket and removed again, every second"
            }
        }
    }

    /// The paths it applies to (`None`: every path).
    pub fn paths(self) -> Option<&'static [&'static str]> {
        match self {
            Condition::Quiet => None,
            Condition::Rings | Condition::VmFeed => Some(RING_PATHS),
            Condition::MacFlood | Condition::GsoBomb | Condition::FibFlush => Some(GUEST_PATHS),
            Condition::UnderlayFlood => Some(UNDERLAY_PATHS),
            Condition::Capture | Condition::PortChurn => Some(CAPTURE_PATHS),
            Condition::StoppedReceiver | Condition::DrainingReceiver => Some(STREAM_PATHS),
        }
    }

    /// The condition it is judged against besides `quiet`, when the study has it: the same
    /// load without the attack (`rings` against `vm-feed`, `stopped-receiver` against
    /// `draining-receiver`).
    pub fn control(self) -> Option<Condition> {
        match self {
            Condition::Rings => Some(Condition::VmFeed),
            Condition::StoppedReceiver => Some(Condition::DrainingReceiver),
            _ => None,
        }
    }

    /// True if it is another condition's control rather than an attack.
    pub fn is_control(self) -> bool {
        Condition::ALL.iter().any(|c| c.control() == Some(self))
    }

    /// True if its cells are planned on `path`.
    pub fn applies(self, path: &str) -> bool {
        let path = sluice_lab::compared::split_build(path).0;
        self.paths().is_none_or(|p| p.contains(&path))
    }
}

impl std::fmt::Display for Condition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Counters an attacker keeps: what it sent, what failed.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tally(pub BTreeMap<String, u64>);

impl Tally {
    /// Adds `n` to counter `what`.
    pub fn add(&mut self, what: &str, n: u64) {
        *self.0.entry(what.to_string()).or_default() += n;
    }

    fn merge(&mut self, o: Tally) {
        for (k, v) in o.0 {
            *self.0.entry(k).or_default() += v;
        }
    }
}

/// When attackers stop: the cell's stop flag, or the condition's deadline.
#[derive(Clone)]
pub struct Shared {
    stop: Arc<AtomicBool>,
    deadline: Instant,
}

impl Shared {
    /// True once the attackers must stop.
    pub fn over(&self) -> bool {
        self.stop.load(Ordering::Relaxed) || Instant::now() >= self.deadline
    }
}

/// An attacker thread's CPU time, published for the study to read (every 50 ms at most,
/// from `/proc/thread-self/stat`).
pub struct Clock {
    cell: Arc<AtomicU64>,
    last: Option<Instant>,
}

impl Clock {
    /// Publishes the calling thread's CPU time if 50 ms passed since the last time.
    pub fn tick(&mut self) {
        if self.last.is_some_and(|l| l.elapsed() < Duration::from_millis(50)) {
            return;
        }
        self.last = Some(Instant::now());
        self.cell.store((sluice_sys::cpu_seconds(true) * 1e6) as u64, Ordering::Relaxed);
    }
}

/// What a condition's attackers did during one cell (a line of `cells.jsonl` keeps it).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AttackRecord {
    /// Seconds the attackers ran.
    pub seconds: f64,
    /// CPU seconds of the attackers' threads. They are threads of the study process, so
    /// this much is taken out of the cell's guest column (workloads the study runs in
    /// process) or other-kernel column (the tools), where it would otherwise land.
    pub cpu_s: f64,
    /// What the attackers counted (frames, datagrams, sends, abuses done, resets…).
    pub sent: BTreeMap<String, u64>,
    /// What the switch counted on the attackers' ports, or the tunnels' ports on an
    /// overlay (counters that moved; drops as `rx:CAUSE`/`tx:CAUSE`).
    #[serde(default)]
    pub switch: BTreeMap<String, u64>,
    /// The ports' own account of their link (a vhost-user port's faults).
    #[serde(default)]
    pub link: Vec<String>,
    /// What did not go as it should (an attacker that failed or did not stop in time).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<String>,
}

/// Everything a condition made, removed (in reverse) when dropped.
#[derive(Default)]
struct Made {
    /// (switch socket, port name).
    ports: Vec<(PathBuf, String)>,
    /// Interfaces in the host's namespace.
    host_links: Vec<String>,
    /// Namespaces.
    netns: Vec<String>,
    /// Directories of sockets and files.
    dirs: Vec<sluice_sys::fs::TempDir>,
    /// Processes started (relays), killed.
    children: Vec<std::process::Child>,
}

impl Made {
    fn netns(&mut self, name: &str) -> Result<()> {
        if netns::exists(name) {
            bail!("network namespace {name} already exists and is not this study's; remove it or run the study again");
        }
        sh(&["ip", "netns", "add", name])?;
        self.netns.push(name.into());
        sh(&["ip", "-n", name, "link", "set", "lo", "up"])?;
        // A silent attacker: no IPv6 chatter (router solicitations, MLD) of its own.
        netns::run_in(Some(name), || {
            for k in ["default", "all"] {
                std::fs::write(format!("/proc/sys/net/ipv6/conf/{k}/disable_ipv6"), "1")?;
            }
            Ok(())
        })
        .with_context(|| format!("turning IPv6 off in {name}"))?;
        Ok(())
    }

    fn port(&mut self, socket: &std::path::Path, spec: PortSpec) -> Result<()> {
        let name = spec.name.clone();
        Client::connect(socket)?
            .call_value(&Request::PortAdd { port: Box::new(spec), may_exist: false })
            .with_context(|| format!("adding the attacker's port {name}"))?;
        self.ports.push((socket.to_path_buf(), name));
        Ok(())
    }
}

impl Drop for Made {
    fn drop(&mut self) {
        // A stopped relay is continued first: its port's removal must not wait on it.
        for c in &self.children {
            let _ = sluice_sys::kill(c.id(), libc::SIGCONT);
        }
        for (sock, name) in self.ports.drain(..).rev() {
            let r = Client::connect(&sock)
                .and_then(|mut c| c.call_value(&Request::PortDel { name: name.clone(), if_exists: false }));
            if let Err(e) = r
                && !e.to_string().contains("no port named")
            {
                eprintln!("warning: removing the attacker's port {name}: {e:#}");
            }
        }
        for mut c in self.children.drain(..).rev() {
            let _ = c.kill();
            let _ = c.wait();
        }
        for l in self.host_links.drain(..).rev() {
            if sluice_lab::compared::link_exists_here(&l) {
                let _ = sh(&["ip", "link", "del", &l]);
            }
        }
        for ns in self.netns.drain(..).rev() {
            if netns::exists(&ns)
                && let Err(e) = sh(&["ip", "netns", "del", &ns])
            {
                eprintln!("warning: {e:#}");
            }
        }
        self.dirs.clear();
    }
}

/// Attackers at work on a cell's topology; [`Disturbance::stop`] ends them and removes
/// what they needed.
pub struct Disturbance {
    condition: Condition,
    shared: Shared,
    threads: Vec<(String, JoinHandle<std::io::Result<Tally>>)>,
    clocks: Vec<Arc<AtomicU64>>,
    /// The switches' ports whose counters tell what the attack did: (socket, port, their
    /// counters when the attack started).
    watch: Vec<(PathBuf, String, BTreeMap<String, u64>)>,
    started: Instant,
    made: Made,
}

/// Distinguishes the attackers of one study process's cells (namespace and port names).
static NEXT: AtomicU32 = AtomicU32::new(1);

impl Disturbance {
    fn spawn(
        &mut self,
        what: &str,
        ns: Option<String>,
        f: impl FnOnce(&Shared, Clock) -> std::io::Result<Tally> + Send + 'static,
    ) {
        let cell = Arc::new(AtomicU64::new(0));
        self.clocks.push(cell.clone());
        let sh = self.shared.clone();
        let h = std::thread::spawn(move || {
            let clock = Clock { cell, last: None };
            match ns {
                Some(ns) => netns::run_in(Some(&ns), move || f(&sh, clock)),
                None => f(&sh, clock),
            }
        });
        self.threads.push((what.to_string(), h));
    }

    /// Watches port `port` of the switch at `socket`: what it counts from now on is the
    /// attack's.
    fn watch(&mut self, socket: &std::path::Path, port: &str) {
        let before = port_counters(socket, port).map(|(c, _)| c).unwrap_or_default();
        self.watch.push((socket.to_path_buf(), port.to_string(), before));
    }

    /// CPU seconds the attackers' threads used so far.
    pub fn cpu_s(&self) -> f64 {
        self.clocks.iter().map(|c| c.load(Ordering::Relaxed) as f64 / 1e6).sum()
    }

    /// Stops the attackers (waiting up to 10 s for each), reads what the switch counted on
    /// their ports, and removes everything the condition made.
    pub fn stop(mut self) -> AttackRecord {
        let mut rec = AttackRecord { seconds: self.started.elapsed().as_secs_f64(), ..AttackRecord::default() };
        let mut tally = Tally::default();
        // The ports' own account while the attackers are still at it (a vhost-user port
        // says what it found wrong with the connection it has).
        let links: Vec<String> = self
            .watch
            .iter()
            .filter_map(|(sock, port, _)| port_counters(sock, port).ok().and_then(|(_, l)| l))
            .collect();
        self.shared.stop.store(true, Ordering::Relaxed);
        for (what, h) in self.threads.drain(..) {
            match join_within(h, Duration::from_secs(10)) {
                Some(Ok(t)) => tally.merge(t),
                Some(Err(e)) => rec.problems.push(format!("{what}: {e}")),
                None => rec.problems.push(format!("{what} did not stop within 10 s")),
            }
        }
        rec.cpu_s = self.cpu_s();
        rec.sent = tally.0;
        rec.link = links;
        for (sock, port, before) in &self.watch {
            match port_counters(sock, port) {
                Ok((counts, _)) => {
                    for (k, v) in counts {
                        let moved = v.saturating_sub(before.get(&k).copied().unwrap_or(0));
                        if moved > 0 {
                            *rec.switch.entry(k).or_default() += moved;
                        }
                    }
                }
                Err(e) => rec.problems.push(format!("reading port {port}'s counters: {e:#}")),
            }
        }
        let names: Vec<String> = self.made.netns.clone();
        let ports = self.made.ports.clone();
        let links = self.made.host_links.clone();
        drop(std::mem::take(&mut self.made));
        for ns in names.iter().filter(|ns| netns::exists(ns)) {
            rec.problems.push(format!("namespace {ns} is still there"));
        }
        for l in links.iter().filter(|l| sluice_lab::compared::link_exists_here(l)) {
            rec.problems.push(format!("interface {l} is still there"));
        }
        for (sock, port) in &ports {
            let listed: sluice_api::Result<StatsReport> =
                Client::connect(sock).and_then(|mut c| c.call(&Request::PortList));
            if listed.is_ok_and(|r| r.ports.iter().any(|p| &p.name == port)) {
                rec.problems.push(format!("port {port} is still on the switch"));
            }
        }
        if !rec.problems.is_empty() {
            eprintln!("warning: {}: {}", self.condition, rec.problems.join("; "));
        }
        rec
    }
}

impl Drop for Disturbance {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        for (_, h) in self.threads.drain(..) {
            let _ = join_within(h, Duration::from_secs(10));
        }
    }
}

/// Joins `h` if it ends within `wait`; a thread still running then is left to end by
/// itself (its port is removed next, which ends any wait of its on the switch).
fn join_within<T>(h: JoinHandle<std::io::Result<T>>, wait: Duration) -> Option<std::io::Result<T>> {
    let until = Instant::now() + wait;
    while !h.is_finished() {
        if Instant::now() >= until {
            return None;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Some(h.join().unwrap_or_else(|_| Err(std::io::Error::other("the attacker's thread panicked"))))
}

/// The counters of `port` on the switch at `sock` that are not zero, and its link account.
fn port_counters(sock: &std::path::Path, port: &str) -> Result<(BTreeMap<String, u64>, Option<String>)> {
    let r: StatsReport = Client::connect(sock)?.call(&Request::Stats { port: Some(port.to_string()) })?;
    let mut m = BTreeMap::new();
    let Some(p) = r.ports.iter().find(|p| p.name == port) else { return Ok((m, None)) };
    let c = &p.counters;
    for (k, v) in [
        ("rx_frames", c.rx_frames),
        ("rx_gso", c.rx_gso),
        ("forwarded", c.forwarded),
        ("flooded", c.flooded),
        ("learn_refused", c.learn_refused),
        ("tx_offered", c.tx_offered),
        ("tx_frames", c.tx_frames),
    ] {
        if v > 0 {
            m.insert(k.to_string(), v);
        }
    }
    for cause in sluice_switch::counters::DropCause::ALL {
        for (dir, n) in [("rx", c.rx_drops.get(cause)), ("tx", c.tx_drops.get(cause))] {
            if n > 0 {
                m.insert(format!("{dir}:{}", cause.name()), n);
            }
        }
    }
    let trips: u64 = p.classes.iter().map(|c| c.counters.watchdog_trips).sum();
    if trips > 0 {
        m.insert("watchdog_trips".to_string(), trips);
    }
    if let Some(k) = &p.kernel {
        for (name, v) in [
            ("kernel_forwarded", k.forwarded),
            ("kernel_flooded", k.flooded),
            ("kernel_upcalls", k.upcalls),
            ("kernel_drops", k.drops),
        ] {
            if v > 0 {
                m.insert(name.to_string(), v);
            }
        }
    }
    Ok((m, p.link.clone()))
}

/// Starts condition `c` on `topo` (`id`: the study's name prefix, unique per process);
/// its attackers stop by themselves `duration_s` and a minute from now at the latest.
/// `Ok(None)` for `quiet`.
pub fn start(c: Condition, topo: &Topology, id: &str, duration_s: u32) -> Result<Option<Disturbance>> {
    if c == Condition::Quiet {
        return Ok(None);
    }
    if !c.applies(&topo.path) {
        bail!("condition {c} does not apply to path {}", topo.path);
    }
    let k = NEXT.fetch_add(1, Ordering::Relaxed);
    let mut d = Disturbance {
        condition: c,
        shared: Shared {
            stop: Arc::new(AtomicBool::new(false)),
            deadline: Instant::now() + Duration::from_secs(u64::from(duration_s) + 60),
        },
        threads: Vec::new(),
        clocks: Vec::new(),
        watch: Vec::new(),
        started: Instant::now(),
        made: Made::default(),
    };
    let seed = u64::from(std::process::id()) << 32 | u64::from(k);
    match c {
        Condition::Quiet => unreachable!("handled above"),
        Condition::Rings => start_rings(&mut d, topo, k, true)?,
        Condition::VmFeed => start_rings(&mut d, topo, k, false)?,
        Condition::MacFlood | Condition::GsoBomb => {
            let ns = format!("{id}-x{k}");
            d.made.netns(&ns)?;
            let dev = attach_guest(&mut d, topo, &ns, k)?;
            if c == Condition::MacFlood {
                d.spawn("the MAC flooder", Some(ns), move |sh, clock| flood::mac_flood(&dev, seed, sh, clock));
            } else {
                let spare = topo.spare_v4.as_deref().context("the path has no spare address for an attacker")?;
                sh(&["ip", "-n", &ns, "addr", "add", spare, "dev", &dev])?;
                let from: Ipv4Addr =
                    spare.split('/').next().unwrap_or_default().parse().context("reading the path's spare address")?;
                let to = match topo.server_addr(sluice_lab::compared::Family::Ipv4) {
                    std::net::IpAddr::V4(a) => a,
                    std::net::IpAddr::V6(_) => bail!("the path's server has no IPv4 address"),
                };
                d.spawn("the GSO sender", Some(ns), move |sh, clock| flood::gso_bomb(from, to, sh, clock));
            }
        }
        Condition::UnderlayFlood => {
            let u = topo.underlay.as_ref().context("the path has no underlay")?;
            let ns = format!("{id}-x{k}");
            d.made.netns(&ns)?;
            let x = format!("x{}", k % 1000);
            let m = u.mtu.to_string();
            sh(&[
                "ip", "-n", &u.ns, "link", "add", &x, "mtu", &m, "type", "veth", "peer", "name", "eth0", "mtu", &m,
                "netns", &ns,
            ])?;
            sh(&["ip", "-n", &u.ns, "link", "set", &x, "master", "br0", "up"])?;
            sh(&["ip", "-n", &ns, "link", "set", "eth0", "up"])?;
            let from = Ipv4Addr::new(192, 168, 77, 250);
            if u.remotes.contains(&from) {
                bail!("the underlay attacker's address {from} is one of the tunnel's endpoints");
            }
            sh(&["ip", "-n", &ns, "addr", "add", &format!("{from}/24"), "dev", "eth0"])?;
            let target = flood::UnderlayTarget { from, to: u.target, vni: u.vni, known: guest_mac(&topo.server_ns) };
            for s in &topo.switch_sockets {
                d.watch(s, "vx0");
            }
            d.spawn("the underlay flooder", Some(ns), move |sh, clock| flood::underlay_flood(&target, seed, sh, clock));
        }
        Condition::FibFlush => match topo.attach.clone() {
            Some(Attach::Switch { socket, .. }) => {
                d.spawn("the FIB flusher", None, move |sh, clock| fib::flush_switch(&socket, sh, clock));
            }
            Some(Attach::Bridge { ns }) => {
                d.spawn("the FIB flusher", None, move |sh, clock| fib::flush_bridge(&ns, sh, clock));
            }
            None => bail!("the path has no switch or bridge whose table can be flushed"),
        },
        Condition::Capture => start_capture(&mut d, topo, &format!("{id}-x{k}"), k)?,
        Condition::PortChurn => start_churn(&mut d, topo, &format!("{id}-x{k}"), k)?,
        Condition::StoppedReceiver | Condition::DrainingReceiver => {
            let stop = (c == Condition::StoppedReceiver).then_some(duration_s);
            start_stopped(&mut d, topo, &format!("{id}-x{k}"), k, stop)?
        }
    }
    Ok(Some(d))
}

/// `port-churn`: a namespace for the churned ports' TAPs, and the churner; the ports are
/// listed as made, so whatever a churner left is removed with the condition.
fn start_churn(d: &mut Disturbance, topo: &Topology, ns: &str, k: u32) -> Result<()> {
    let (socket, lab) = lab_switch(topo)?;
    d.made.netns(ns)?;
    let names = churn::names(&lab, k);
    d.made.ports.extend(names.iter().map(|n| (socket.clone(), n.clone())));
    let (ns, mtu) = (ns.to_string(), topo.mtu);
    d.spawn("the port churner", None, move |sh, clock| churn::churn(&socket, &names, &ns, mtu, sh, clock));
    Ok(())
}

/// The path's switch: its control socket and its lab's name.
fn lab_switch(topo: &Topology) -> Result<(PathBuf, String)> {
    match topo.attach.as_ref() {
        Some(Attach::Switch { socket, lab, .. }) => Ok((socket.clone(), lab.clone())),
        _ => bail!("the path has no sluice switch"),
    }
}

/// The path's spare IPv4 address (with its prefix), and the address alone.
fn spare(topo: &Topology) -> Result<(String, Ipv4Addr)> {
    let spare = topo.spare_v4.clone().context("the path has no spare address for an extra guest")?;
    let a = spare.split('/').next().unwrap_or_default().parse().context("reading the path's spare address")?;
    Ok((spare, a))
}

/// The server's IPv4 address.
fn server_v4(topo: &Topology) -> Result<Ipv4Addr> {
    match topo.server_addr(sluice_lab::compared::Family::Ipv4) {
        std::net::IpAddr::V4(a) => Ok(a),
        std::net::IpAddr::V6(_) => bail!("the path's server has no IPv4 address"),
    }
}

/// `capture`: an extra guest on the path's switch at the spare address, pinging the
/// server, and a capture of its port into a file of a new directory of the study's.
fn start_capture(d: &mut Disturbance, topo: &Topology, ns: &str, k: u32) -> Result<()> {
    let (socket, lab) = lab_switch(topo)?;
    d.made.netns(ns)?;
    // Root's ICMP datagram socket (ping without a raw socket).
    netns::run_in(Some(ns), || std::fs::write("/proc/sys/net/ipv4/ping_group_range", "0 0"))
        .with_context(|| format!("letting root ping in {ns}"))?;
    let dev = attach_guest(d, topo, ns, k)?;
    let (with_prefix, _) = spare(topo)?;
    sh(&["ip", "-n", ns, "addr", "add", &with_prefix, "dev", &dev])?;
    let to = server_v4(topo)?;
    let dir = sluice_sys::fs::TempDir::new("sluice-study-capture").context("making a directory for the capture")?;
    let file = dir.path().join("capture.pcap");
    d.made.dirs.push(dir);
    let port = format!("{lab}-x{}", k % 100);
    d.spawn("the captured guest's pinger", Some(ns.to_string()), move |sh, clock| capture::pinger(to, sh, clock));
    d.spawn("the capture", None, move |sh, clock| capture::capture(&socket, &port, &file, sh, clock));
    Ok(())
}

/// `stopped-receiver` and its control: a third guest behind a relay of its own on a
/// stream port, at the spare address; the client streams to it; with `stop` (the cell's
/// seconds), its relay stopped for the middle third of them.
fn start_stopped(d: &mut Disturbance, topo: &Topology, ns: &str, k: u32, stop: Option<u32>) -> Result<()> {
    let (socket, lab) = lab_switch(topo)?;
    d.made.netns(ns)?;
    let name = format!("{lab}-x{}", k % 100);
    let dir = sluice_sys::fs::TempDir::new("sluice-study-relay").context("making a directory for the relay")?;
    let sock = dir.path().join("relay.sock");
    d.made.dirs.push(dir);
    let exe = std::env::current_exe().context("finding the sluice executable")?;
    let m = topo.mtu.to_string();
    let relay = std::process::Command::new(exe)
        .args(["port", "relay", &name, "--netns", ns, "--mtu", &m, "--listen"])
        .arg(&sock)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .context("starting the third guest's relay")?;
    let pid = relay.id();
    d.made.children.push(relay);
    let until = Instant::now() + Duration::from_secs(10);
    while !sock.exists() {
        if d.made.children.last_mut().is_some_and(|c| c.try_wait().ok().flatten().is_some()) {
            bail!("the third guest's relay exited at start");
        }
        if Instant::now() >= until {
            bail!("the third guest's relay did not listen within 10 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut spec = PortSpec::tap(&name);
    spec.kind = PortKind::Stream;
    spec.path = Some(sock);
    spec.mtu = Some(topo.mtu);
    d.made.port(&socket, spec)?;
    d.watch(&socket, &name);
    sh(&["ip", "-n", ns, "link", "set", &name, "up"])?;
    let (with_prefix, at) = spare(topo)?;
    sh(&["ip", "-n", ns, "addr", "add", &with_prefix, "dev", &name])?;
    // The client may still know the spare address by an earlier cell's guest's MAC.
    sh(&["ip", "-n", &topo.client_ns, "neigh", "flush", "to", &at.to_string()])?;
    d.spawn("the third guest's receiver", Some(ns.to_string()), move |sh, clock| stopped::receiver(at, sh, clock));
    d.spawn("the client's stream to the third guest", Some(topo.client_ns.clone()), move |sh, clock| {
        stopped::sender(at, sh, clock)
    });
    if let Some(s) = stop {
        let cell = Duration::from_secs(u64::from(s));
        d.spawn("the relay's stopper", None, move |sh, clock| stopped::stopper(pid, cell, sh, clock));
    }
    Ok(())
}

/// Attaches an extra guest in namespace `ns` to the path's switch or bridge; returns its
/// interface's name there.
fn attach_guest(d: &mut Disturbance, topo: &Topology, ns: &str, k: u32) -> Result<String> {
    let m = topo.mtu.to_string();
    match topo.attach.as_ref().context("the path has no switch an attacker can join")? {
        Attach::Switch { socket, lab, kernel } => {
            let name = format!("{lab}-x{}", k % 100);
            let mut spec = PortSpec::tap(&name);
            spec.mtu = Some(topo.mtu);
            if *kernel {
                // The switch's end of a veth pair here, the attacker's in its namespace.
                sh(&[
                    "ip", "link", "add", &name, "mtu", &m, "type", "veth", "peer", "name", "eth0", "mtu", &m, "netns",
                    ns,
                ])?;
                d.made.host_links.push(name.clone());
                sh(&["ip", "-n", ns, "link", "set", "eth0", "up"])?;
                spec.kind = PortKind::Veth;
                d.made.port(socket, spec)?;
                d.watch(socket, &name);
                Ok("eth0".into())
            } else {
                spec.netns = Some(ns.to_string());
                d.made.port(socket, spec)?;
                d.watch(socket, &name);
                sh(&["ip", "-n", ns, "link", "set", &name, "up"])?;
                Ok(name)
            }
        }
        Attach::Bridge { ns: sw } => {
            let x = format!("x{}", k % 1000);
            sh(&[
                "ip", "-n", sw, "link", "add", &x, "mtu", &m, "type", "veth", "peer", "name", "eth0", "mtu", &m,
                "netns", ns,
            ])?;
            sh(&["ip", "-n", sw, "link", "set", &x, "master", "br0", "up"])?;
            sh(&["ip", "-n", ns, "link", "set", "eth0", "up"])?;
            Ok("eth0".into())
        }
    }
}

/// `rings` and `vm-feed`: two vhost-user ports on the path's switch, sockets in a new
/// directory of the study's; the hostile guest (`hostile`) or a well-behaved one on one,
/// the feeder on the other.
fn start_rings(d: &mut Disturbance, topo: &Topology, k: u32, hostile: bool) -> Result<()> {
    let Some(Attach::Switch { socket, lab, .. }) = topo.attach.as_ref() else {
        bail!("the path has no sluice switch for a vhost-user guest");
    };
    let dir = sluice_sys::fs::TempDir::new("sluice-study-rings").context("making a directory for the sockets")?;
    let (a, b) = (dir.path().join("hostile.sock"), dir.path().join("feeder.sock"));
    d.made.dirs.push(dir);
    let mut names = Vec::new();
    for (role, sock) in [("ra", &a), ("rb", &b)] {
        let name = format!("{lab}-{role}{}", k % 100);
        let mut spec = PortSpec::tap(&name);
        spec.kind = PortKind::VhostUser;
        spec.socket = Some(sock.clone());
        d.made.port(socket, spec)?;
        names.push(name);
    }
    d.watch(socket, &names[0]);
    let me = [0x02, 0x5E, 0, (k >> 8) as u8, k as u8, 1];
    let feeder = [0x02, 0x5E, 0, (k >> 8) as u8, k as u8, 2];
    if hostile {
        d.spawn("the hostile vhost-user guest", None, move |sh, clock| Ok(rings::hostile(&a, me, feeder, sh, clock)));
    } else {
        d.spawn("the receiving vhost-user guest", None, move |sh, clock| {
            Ok(rings::receiver(&a, me, feeder, sh, clock))
        });
    }
    d.spawn("the feeding vhost-user guest", None, move |sh, clock| Ok(rings::feeder(&b, feeder, me, sh, clock)));
    Ok(())
}

/// The MAC of the first interface (not loopback) in namespace `ns`.
fn guest_mac(ns: &str) -> Option<[u8; 6]> {
    let o = std::process::Command::new("ip").args(["-j", "-n", ns, "link", "show"]).output().ok()?;
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).ok()?;
    let mac = v.as_array()?.iter().find(|l| l["link_type"] == "ether")?["address"].as_str()?.to_string();
    let b: Vec<u8> = mac.split(':').filter_map(|x| u8::from_str_radix(x, 16).ok()).collect();
    b.try_into().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conditions_read_back_by_name_and_apply_to_their_paths() {
        for c in Condition::ALL {
            assert_eq!(Condition::parse(c.name()), Some(c));
            assert_eq!(serde_json::to_string(&c).unwrap(), format!("\"{}\"", c.name()));
        }
        assert_eq!(Condition::parse("storm"), None);
        assert!(Condition::Quiet.applies("direct"));
        assert!(Condition::Rings.applies("sluice-kernel") && !Condition::Rings.applies("linux-bridge"));
        assert!(Condition::VmFeed.applies("sluice-l2") && !Condition::VmFeed.applies("linux-bridge"));
        assert_eq!(Condition::Rings.control(), Some(Condition::VmFeed));
        assert!(Condition::VmFeed.is_control() && !Condition::Rings.is_control() && !Condition::Quiet.is_control());
        assert!(Condition::MacFlood.applies("linux-bridge") && !Condition::MacFlood.applies("overlay-kernel"));
        assert!(Condition::UnderlayFlood.applies("overlay-kernel") && !Condition::UnderlayFlood.applies("sluice-l2"));
        assert!(Condition::Capture.applies("sluice-kernel") && !Condition::Capture.applies("linux-bridge"));
        assert!(Condition::StoppedReceiver.applies("sluice-l2-lossless-stream@before"));
        assert!(!Condition::StoppedReceiver.applies("sluice-l2") && !Condition::Capture.is_control());
        assert_eq!(Condition::StoppedReceiver.control(), Some(Condition::DrainingReceiver));
        assert!(Condition::DrainingReceiver.is_control() && Condition::DrainingReceiver.applies("sluice-l2-stream"));
        assert!(Condition::FibFlush.applies("linux-bridge") && !Condition::FibFlush.applies("direct"));
        assert!(Condition::PortChurn.applies("sluice-kernel") && !Condition::PortChurn.applies("linux-bridge"));
        for paths in [RING_PATHS, GUEST_PATHS, UNDERLAY_PATHS, CAPTURE_PATHS, STREAM_PATHS] {
            for p in paths {
                assert!(sluice_lab::compared::PATHS.iter().any(|k| k.0 == *p), "{p} is a known path");
            }
        }
    }

    #[test]
    fn an_attacker_stops_at_its_deadline_and_its_cpu_is_read() {
        let mut d = Disturbance {
            condition: Condition::MacFlood,
            shared: Shared {
                stop: Arc::new(AtomicBool::new(false)),
                deadline: Instant::now() + Duration::from_millis(300),
            },
            threads: Vec::new(),
            clocks: Vec::new(),
            watch: Vec::new(),
            started: Instant::now(),
            made: Made::default(),
        };
        d.spawn("a spinner", None, |sh, mut clock| {
            let mut t = Tally::default();
            while !sh.over() {
                t.add("turns", 1);
                clock.tick();
            }
            clock.tick();
            Ok(t)
        });
        let began = Instant::now();
        std::thread::sleep(Duration::from_millis(500));
        let rec = d.stop();
        assert!(began.elapsed() < Duration::from_secs(5));
        assert!(rec.sent["turns"] > 0 && rec.problems.is_empty(), "{rec:?}");
        assert!(rec.cpu_s > 0.0, "the spinner's CPU: {rec:?}");
    }
}

//! The switch's EVPN agent (docs/architecture.md, "EVPN: many hosts, one LAN"): it runs a
//! GoBGP speaker (or attaches to one), announces the switch's local stations and its flood
//! list membership through it, and carries what the speaker receives into the switch.
//!
//! One thread with a one-thread async runtime holds the gRPC client: the only async code
//! in the daemon. The datapath tells it of local stations over a bounded channel (when the
//! channel is full, or the core lost events, it asks for a resynchronisation instead:
//! gaps are never silent). The agent hands what to install to the datapath as jobs, the
//! way the control thread does. Which route holds is decided by
//! [`sluice_switch::evpn::Table`].
//!
//! When the speaker's API goes away (the speaker died, or was restarted), the remote
//! stations stay installed until the agent is connected again; it then reads the whole
//! table again, replaces what it had, and announces every local station again.

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sluice_api::config::{EvpnSettings, EvpnSpeaker, PortSpec, Settings};
use sluice_api::proto::{EvpnDuplicateReport, EvpnPeerReport, EvpnReport, EvpnRouteReport, EvpnSpeakerReport};
use sluice_gobgp::api::{
    AfiSafi, AfiSafiConfig, Family, Global, Peer, PeerConf, SESSION_ESTABLISHED, Timers, TimersConfig, Transport,
};
use sluice_gobgp::paths::{self, Origin};
use sluice_switch::PortId;
use sluice_switch::evpn::{Action, Heard, Table};
use sluice_switch::tunnel::VniMap;
use sluice_wire::MacAddr;
use tracing::{info, warn};

use crate::child::{Program, Supervisor};
use crate::control::Jobs;
use crate::{Datapath, Result};

/// Local station changes waiting for the agent at most; more ask for a resynchronisation.
pub const QUEUE: usize = 65_536;
/// How long the agent waits for a speaker it started to open its API.
const API_WAIT: Duration = Duration::from_secs(10);
/// The longest pause between attempts to reach the speaker.
const MAX_RETRY: Duration = Duration::from_secs(10);
/// How often the received routes are compared with the speaker's table, and mended (a
/// change the agent missed is then at most this old).
const RECONCILE: Duration = Duration::from_secs(30);
/// Sessions' timers: a connection attempt every 5 s, hold 9 s, keepalive 3 s (a lab and a
/// data centre both want a lost host noticed in seconds).
const TIMERS: TimersConfig = TimersConfig { connect_retry: 5, hold_time: 9, keepalive_interval: 3 };

/// A local station change, from the datapath.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Local {
    /// Station `mac` of `vni` is here (learned, moved here, or configured: `sticky`).
    Up {
        /// The VNI.
        vni: u32,
        /// The station.
        mac: MacAddr,
        /// Configured here.
        sticky: bool,
    },
    /// It is not here any more.
    Down {
        /// The VNI.
        vni: u32,
        /// The station.
        mac: MacAddr,
    },
}

/// What the datapath keeps of the agent: where to tell it of local stations.
pub struct Link {
    /// The EVPN tunnel port.
    pub port: PortId,
    /// Local station changes.
    pub tx: tokio::sync::mpsc::Sender<Local>,
    /// Set when a change could not be told (the channel was full, or the core lost
    /// events): the agent resynchronises.
    pub resync: Arc<AtomicBool>,
}

impl Link {
    /// Tells the agent of a change, or asks for a resynchronisation when it cannot.
    pub fn tell(&self, l: Local) {
        if self.tx.try_send(l).is_err() {
            self.resync.store(true, Ordering::Relaxed);
        }
    }
}

/// The operator's request to clear duplicates (of one VNI, of one station), and where the
/// agent answers how many it cleared.
struct Clear {
    vni: Option<u32>,
    mac: Option<MacAddr>,
    reply: std::sync::mpsc::SyncSender<usize>,
}

/// How long `evpn clear-duplicates` waits for the agent.
const CLEAR_WAIT: Duration = Duration::from_secs(5);

/// A running agent.
pub struct Evpn {
    clear: tokio::sync::mpsc::Sender<Clear>,
    stop: Arc<AtomicBool>,
    wake: Arc<tokio::sync::Notify>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    report: Arc<Mutex<EvpnReport>>,
    speaker: Option<Arc<Supervisor>>,
}

/// One of our paths in the speaker: its id, the sequence number and stickiness it has.
type SentPath = (Vec<u8>, u32, bool);

/// What the agent thread works with.
struct Ctx {
    settings: EvpnSettings,
    origin: Origin,
    vnis: Vec<u32>,
    port: PortId,
    socket: PathBuf,
    spawned: bool,
    jobs: Jobs,
    rx: tokio::sync::mpsc::Receiver<Local>,
    clear: tokio::sync::mpsc::Receiver<Clear>,
    resync: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    wake: Arc<tokio::sync::Notify>,
    report: Arc<Mutex<EvpnReport>>,
    table: Table,
    /// Our paths in the speaker, by station (type 2) and by VNI (type 3, MAC zero).
    sent: HashMap<(u32, MacAddr), (Vec<u8>, u32, bool)>,
    /// Our type-2 paths binding a local station's address, with the station's number.
    sent_ips: HashMap<(u32, MacAddr, IpAddr), SentPath>,
    counters: std::collections::BTreeMap<String, u64>,
    /// The agent's clock (stale routes' ages).
    started: Instant,
    /// Received stations the switch could not install (configured here, or the MAC table
    /// full), counted by the datapath; and what was last logged of it, when.
    install_refused: Arc<std::sync::atomic::AtomicU64>,
    refused_logged: (u64, Option<Instant>),
    /// Routes over the bound, as last logged, and when.
    over_logged: (u64, Option<Instant>),
    /// The IP bindings given to the switch (ARP and ND suppression): `(vni, ip, mac)`.
    bound: std::collections::HashSet<(u32, IpAddr, MacAddr)>,
    /// From the switch: ARP requests it answered from the bindings, bindings it
    /// refused (full), and neighbour solicitations it answered.
    suppression: Arc<[std::sync::atomic::AtomicU64; 3]>,
    /// When (on `started`'s clock) the table is next compared with the speaker's.
    next_reconcile: Duration,
}

impl Evpn {
    /// Starts the agent of switch `s` (settings `e`), whose EVPN port (`spec`, attached to
    /// `dp` as `port`) it announces; links it to the datapath. With `speaker = spawn`, the
    /// speaker is started first.
    pub fn start(
        s: &Settings,
        e: &EvpnSettings,
        spec: &PortSpec,
        port: PortId,
        dp: &mut Datapath,
        jobs: Jobs,
    ) -> Result<Evpn> {
        let v = spec.vxlan().map_err(sluice_sys::error::Failure::msg)?.expect("the EVPN port is a vxlan port");
        let router_id = match (e.router_id, v.local) {
            (Some(r), _) => r,
            (None, IpAddr::V4(a)) => a,
            (None, IpAddr::V6(_)) => sluice_sys::bail!(
                "[evpn] needs router_id (an IPv4 address) when the tunnel's local address {} is IPv6",
                v.local
            ),
        };
        let vnis = match &v.vnis {
            VniMap::Single(n) => vec![*n],
            VniMap::PerVlan(m) => m.iter().map(|p| p.1).collect(),
        };
        let dir = sluice_sys::paths::run_dir().join(&s.name).join("evpn");
        let (socket, speaker) = match &e.speaker {
            EvpnSpeaker::Attach(sock) => (sock.clone(), None),
            EvpnSpeaker::Spawn(gobgpd) => {
                let d = sluice_sys::fs::Dir::open(&dir, Some(0o700)).map_err(|err| {
                    sluice_sys::error::Failure::new("the EVPN speaker's directory in the run directory", err)
                })?;
                if !d.private() {
                    sluice_sys::bail!(
                        "{} can be changed by users other than root: the EVPN speaker's API socket is made only where they cannot (set SLUICE_RUN_DIR to a directory of root's)",
                        dir.display()
                    );
                }
                let sock = dir.join("gobgp.sock");
                let program = Program {
                    label: "gobgpd",
                    path: gobgpd.clone(),
                    args: vec![
                        format!("--api-hosts=unix://{}", sock.display()),
                        "--log-plain".into(),
                        "--log-level=info".into(),
                        "--pprof-disable".into(),
                    ],
                    netns: spec.netns.clone(),
                    switch: s.name.clone(),
                    log_stdout: true,
                    // (An earlier gobgpd's socket; the directory is root's alone.)
                    leftovers: vec![sock.clone()],
                };
                let sup = Supervisor::start(program)
                    .map_err(|err| sluice_sys::error::Failure::new("starting the EVPN speaker (gobgpd)", err))?;
                (sock, Some(Arc::new(sup)))
            }
        };
        let (tx, rx) = tokio::sync::mpsc::channel(QUEUE);
        let (clear_tx, clear) = tokio::sync::mpsc::channel(4);
        let resync = Arc::new(AtomicBool::new(false));
        dp.set_evpn(Link { port, tx, resync: resync.clone() });
        let stop = Arc::new(AtomicBool::new(false));
        let wake = Arc::new(tokio::sync::Notify::new());
        let report = Arc::new(Mutex::new(EvpnReport {
            port: spec.name.clone(),
            speaker: EvpnSpeakerReport {
                mode: if speaker.is_some() { "spawned" } else { "attached" }.into(),
                api: socket.display().to_string(),
                asn: e.asn,
                router_id: router_id.to_string(),
                ..EvpnSpeakerReport::default()
            },
            ..EvpnReport::default()
        }));
        let ctx = Ctx {
            settings: e.clone(),
            origin: Origin { asn: e.asn, router_id, next_hop: v.local },
            vnis,
            port,
            socket,
            spawned: speaker.is_some(),
            jobs,
            rx,
            clear,
            resync,
            stop: stop.clone(),
            wake: wake.clone(),
            report: report.clone(),
            table: Table::new(e.max_routes).with_dup_rule(e.dup),
            sent: HashMap::new(),
            sent_ips: HashMap::new(),
            counters: Default::default(),
            started: Instant::now(),
            install_refused: Default::default(),
            refused_logged: (0, None),
            over_logged: (0, None),
            bound: Default::default(),
            suppression: Default::default(),
            next_reconcile: RECONCILE,
        };
        let thread = std::thread::Builder::new()
            .name("evpn".into())
            .spawn(move || {
                let report = ctx.report.clone();
                let rt = tokio::runtime::Builder::new_current_thread().enable_all().build();
                let ended = match rt {
                    Ok(rt) => std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| rt.block_on(run(ctx)))),
                    Err(err) => {
                        tracing::error!("the EVPN agent cannot start its runtime: {err}; EVPN is off");
                        Ok(())
                    }
                };
                if let Err(p) = ended {
                    let why = p
                        .downcast_ref::<&str>()
                        .map(|s| s.to_string())
                        .or_else(|| p.downcast_ref::<String>().cloned())
                        .unwrap_or_default();
                    tracing::error!("the EVPN agent failed ({why}); routes stay as they are, nothing more is announced or installed: restart the switch");
                    let mut r = report.lock().unwrap_or_else(|p| p.into_inner());
                    r.speaker.connected = false;
                    r.speaker.last_error = Some(format!("the agent failed: {why}"));
                }
            })
            .map_err(|err| sluice_sys::error::Failure::new("starting the EVPN agent's thread", err))?;
        info!(switch = %s.name, port = %spec.name, asn = e.asn, %router_id, peers = ?e.peers, "EVPN agent started");
        Ok(Evpn { clear: clear_tx, stop, wake, thread: Mutex::new(Some(thread)), report, speaker })
    }

    /// Clears the duplicates of `vni` and `mac` (all: `None`): they are decided afresh.
    /// How many; an error when the agent cannot do it now (it is not connected to its
    /// speaker).
    pub fn clear_duplicates(&self, vni: Option<u32>, mac: Option<MacAddr>) -> std::result::Result<usize, String> {
        let (reply, answer) = std::sync::mpsc::sync_channel(1);
        let busy = || {
            format!(
                "the EVPN agent did not take the request within {} s: is it connected to its speaker (sluice evpn show)?",
                CLEAR_WAIT.as_secs()
            )
        };
        self.clear.try_send(Clear { vni, mac, reply }).map_err(|_| busy())?;
        answer.recv_timeout(CLEAR_WAIT).map_err(|_| busy())
    }

    /// The agent's view, for `sluice evpn show`.
    pub fn report(&self) -> EvpnReport {
        let mut r = self.report.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if let Some(s) = &self.speaker {
            let st = s.status();
            r.speaker.state = st.state.into();
            r.speaker.pid = st.pid;
            r.speaker.restarts = st.restarts;
        } else {
            r.speaker.state = if r.speaker.connected { "connected" } else { "disconnected" }.into();
        }
        r
    }

    /// Stops the agent, then the speaker it started (its routes go with it; an attached
    /// speaker keeps ours until their owner removes them, as BGP withdraws them when
    /// sessions end).
    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        self.wake.notify_one();
        if let Some(t) = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = t.join();
        }
        if let Some(s) = &self.speaker {
            s.stop();
        }
    }
}

/// The agent: connects, works until the connection fails, and tries again.
async fn run(mut ctx: Ctx) {
    let mut retry = Duration::from_millis(200);
    while !ctx.stop.load(Ordering::SeqCst) {
        let started = Instant::now();
        let err = session(&mut ctx).await;
        set_connected(&ctx, false, Some(err.clone()));
        if ctx.stop.load(Ordering::SeqCst) {
            break;
        }
        if started.elapsed() > Duration::from_secs(30) {
            retry = Duration::from_millis(200);
        }
        warn!(api = %ctx.socket.display(), "EVPN: {err}; trying again in {} ms", retry.as_millis());
        tokio::select! {
            _ = tokio::time::sleep(retry) => {}
            _ = ctx.wake.notified() => {}
        }
        retry = (retry * 2).min(MAX_RETRY);
    }
}

fn set_connected(ctx: &Ctx, up: bool, err: Option<String>) {
    let mut r = ctx.report.lock().unwrap_or_else(|p| p.into_inner());
    r.speaker.connected = up;
    if err.is_some() {
        r.speaker.last_error = err;
    }
}

/// One connection to the speaker; returns why it ended.
async fn session(ctx: &mut Ctx) -> String {
    match session_inner(ctx).await {
        Ok(()) => "stopped".into(),
        Err(e) => e,
    }
}

async fn session_inner(ctx: &mut Ctx) -> std::result::Result<(), String> {
    // A speaker just started needs a moment to open its API.
    let until = Instant::now() + API_WAIT;
    while ctx.spawned && !ctx.socket.exists() {
        if Instant::now() >= until || ctx.stop.load(Ordering::SeqCst) {
            return Err(format!(
                "the speaker did not open its API at {} within {} s",
                ctx.socket.display(),
                API_WAIT.as_secs()
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut c = sluice_gobgp::Client::connect(&ctx.socket).await.map_err(|e| e.to_string())?;
    let g = c.get_bgp().await.map_err(|e| e.to_string())?;
    if g.asn == 0 {
        if !ctx.spawned {
            return Err(format!(
                "the speaker at {} has not started BGP: configure it (gobgpd -f FILE) or let the switch start its own (leave out `attach`)",
                ctx.socket.display()
            ));
        }
        configure(ctx, &mut c).await?;
    } else if !ctx.spawned {
        // An attached speaker may hold paths an earlier run of ours announced.
        c.delete_all_paths().await.map_err(|e| e.to_string())?;
    }
    ctx.sent.clear();
    ctx.sent_ips.clear();
    set_connected(ctx, true, None);
    info!(api = %ctx.socket.display(), "EVPN: connected to the speaker");
    // The watch's first answer is the whole table: what was received before stays
    // installed, stale, until heard again (or withdrawn when stale).
    let mut acts = Vec::new();
    ctx.table.hold_all(now_ms(ctx));
    resync_local(ctx, &mut acts)?;
    let mut stream = c.watch().await.map_err(|e| e.to_string())?;
    for vni in ctx.vnis.clone() {
        let p = paths::flood_path(&ctx.origin, vni);
        let uuid = c.add_path(p).await.map_err(|e| e.to_string())?;
        ctx.sent.insert((vni, MacAddr([0; 6])), (uuid, 0, false));
    }
    let announced: Vec<_> = ctx.table.announced().collect();
    for (vni, mac, seq, sticky) in announced {
        announce(ctx, &mut c, vni, mac, seq, sticky).await;
    }
    carry_out(ctx, &mut c, acts).await;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    // Routes held stale age only once the speaker has told its table in this session (the
    // watch's first answer, or a comparison with its table): a speaker too busy to answer
    // does not make the switch forget what it had.
    let mut synced = false;
    loop {
        tokio::select! {
            m = stream.message() => {
                let m = m.map_err(|e| format!("the speaker's event stream failed: {e}"))?;
                let Some(ev) = m else { return Err("the speaker ended its event stream".into()) };
                let mut acts = Vec::new();
                if let Some(t) = ev.table {
                    if !synced {
                        synced = true;
                        ctx.table.restamp_stale(now_ms(ctx));
                    }
                    let mut heard = Vec::new();
                    for p in &t.paths {
                        match paths::decode(p, ctx.origin.next_hop) {
                            Ok(h) => heard.push((h, p.neighbor_ip.clone())),
                            Err(paths::Refused::Ours) => {}
                            Err(r) => *ctx.counters.entry(format!("refused_{}", r.name())).or_default() += 1,
                        }
                    }
                    // A withdrawal because the session to its peer went down (not its
                    // originator's) is held: forwarding goes on while the session flaps.
                    let withdrawn = |h: &Heard| matches!(h, Heard::Mac(_, false) | Heard::Flood { up: false, .. });
                    let up: std::collections::HashSet<String> = if heard.iter().any(|(h, _)| withdrawn(h)) {
                        let peers = c.list_peers().await.map_err(|e| e.to_string())?;
                        peers
                            .iter()
                            .filter(|p| p.state.as_ref().is_some_and(|s| s.session_state == SESSION_ESTABLISHED))
                            .filter_map(|p| p.conf.as_ref().map(|c| c.neighbor_address.clone()))
                            .collect()
                    } else {
                        Default::default()
                    };
                    let now = now_ms(ctx);
                    for (h, from) in heard {
                        if withdrawn(&h) && !up.contains(&from) {
                            *ctx.counters.entry("held_stale".into()).or_default() += 1;
                            ctx.table.hold(h, now);
                        } else {
                            ctx.table.heard(h, now, &mut acts);
                        }
                    }
                }
                carry_out(ctx, &mut c, acts).await;
            }
            l = ctx.rx.recv() => {
                let Some(l) = l else { return Ok(()) };
                let mut acts = Vec::new();
                local(ctx, l, &mut acts);
                // (A burst — a host's thousand stations — is taken in one go.)
                while let Ok(l) = ctx.rx.try_recv() {
                    local(ctx, l, &mut acts);
                }
                carry_out(ctx, &mut c, acts).await;
            }
            _ = tick.tick() => {
                if ctx.stop.load(Ordering::SeqCst) {
                    return Ok(());
                }
                let mut acts = Vec::new();
                if synced {
                    ctx.table.expire_stale(now_ms(ctx), &mut acts);
                }
                ctx.table.expire_duplicates(now_ms(ctx), &mut acts);
                carry_out(ctx, &mut c, acts).await;
                log_bounds(ctx);
                if ctx.resync.swap(false, Ordering::Relaxed) {
                    *ctx.counters.entry("resyncs".into()).or_default() += 1;
                    let mut acts = Vec::new();
                    resync_local(ctx, &mut acts)?;
                    carry_out(ctx, &mut c, acts).await;
                }
                let suppression = ctx.suppression.clone();
                ctx.jobs.post(move |dp| {
                    let sw = dp.switch_mut();
                    suppression[0].store(sw.arp_suppressed(), Ordering::Relaxed);
                    suppression[2].store(sw.nd_suppressed(), Ordering::Relaxed);
                });
                announce_bindings(ctx, &mut c).await?;
                if ctx.started.elapsed() >= ctx.next_reconcile {
                    reconcile(ctx, &mut c).await?;
                    ctx.next_reconcile = ctx.started.elapsed() + RECONCILE;
                    if !synced {
                        synced = true;
                        ctx.table.restamp_stale(now_ms(ctx));
                    }
                }
                let peers = c.list_peers().await.map_err(|e| e.to_string())?;
                publish(ctx, &peers);
            }
            r = ctx.clear.recv() => {
                let Some(r) = r else { return Ok(()) };
                let mut acts = Vec::new();
                let n = ctx.table.clear_duplicates(r.vni, r.mac, now_ms(ctx), &mut acts);
                if n > 0 {
                    info!(stations = n, "EVPN: duplicates cleared by the operator");
                }
                let _ = r.reply.send(n);
                carry_out(ctx, &mut c, acts).await;
            }
            _ = ctx.wake.notified() => return Ok(()),
        }
    }
}

/// Compares the routes the agent holds with the speaker's best paths, and mends the
/// difference: a route it lacks is taken, one the speaker no longer has is withdrawn
/// (unless held stale). Counted as `reconciled`.
async fn reconcile(ctx: &mut Ctx, c: &mut sluice_gobgp::Client) -> std::result::Result<(), String> {
    let dests = c.list_paths().await.map_err(|e| e.to_string())?;
    let mut rib = std::collections::HashSet::new();
    let mut acts = Vec::new();
    let mut mended = 0u64;
    let known = ctx.table.received_keys();
    let now = now_ms(ctx);
    for d in &dests {
        for p in d.paths.iter().filter(|p| p.best) {
            let Ok(h) = paths::decode(p, ctx.origin.next_hop) else { continue };
            let key = sluice_switch::evpn::RouteKey::of(&h);
            rib.insert(key);
            if !known.contains(&key) {
                mended += 1;
                ctx.table.heard(h, now, &mut acts);
            }
        }
    }
    let gone: Vec<(sluice_switch::evpn::RouteKey, Heard)> =
        ctx.table.received_routes().filter(|(k, _)| !rib.contains(k)).collect();
    for (key, h) in gone {
        if !ctx.table.is_stale(&key) {
            mended += 1;
            ctx.table.heard(h, now, &mut acts);
        }
    }
    if mended > 0 {
        *ctx.counters.entry("reconciled".into()).or_default() += mended;
        warn!(routes = mended, "EVPN: routes the agent had missed were mended from the speaker's table");
    }
    carry_out(ctx, c, acts).await;
    Ok(())
}

/// Logs, at most once a minute, routes held back by the bound and stations the switch
/// could not install, when their counts grew.
fn log_bounds(ctx: &mut Ctx) {
    let due =
        |l: &(u64, Option<Instant>), n: u64| n > l.0 && l.1.is_none_or(|t| t.elapsed() >= Duration::from_secs(60));
    let over = ctx.table.counters.over_limit;
    if due(&ctx.over_logged, over) {
        warn!(
            max_routes = ctx.settings.max_routes,
            over_limit = over,
            waiting = ctx.table.waiting(),
            "EVPN: peers announce more stations than max_routes; the rest wait, installed as room frees (raise max_routes and mac_table_size if they are genuine)"
        );
        ctx.over_logged = (over, Some(Instant::now()));
    }
    let refused = ctx.install_refused.load(Ordering::Relaxed);
    if due(&ctx.refused_logged, refused) {
        warn!(
            refused,
            "EVPN: received stations the switch could not install (configured here, or its MAC table is full)"
        );
        ctx.refused_logged = (refused, Some(Instant::now()));
    }
}

/// The agent's clock, in ms.
fn now_ms(ctx: &Ctx) -> u64 {
    ctx.started.elapsed().as_millis() as u64
}

/// Starts BGP on a speaker the switch started, and adds the peers (EVPN family).
async fn configure(ctx: &Ctx, c: &mut sluice_gobgp::Client) -> std::result::Result<(), String> {
    let e = &ctx.settings;
    let global = Global {
        asn: e.asn,
        router_id: ctx.origin.router_id.to_string(),
        listen_port: i32::from(e.listen_port),
        listen_addresses: vec![ctx.origin.next_hop.to_string()],
    };
    c.start_bgp(global).await.map_err(|e| e.to_string())?;
    for p in &e.peers {
        let peer = Peer {
            conf: Some(PeerConf { local_asn: e.asn, neighbor_address: p.to_string(), peer_asn: e.asn }),
            timers: Some(Timers { config: Some(TIMERS) }),
            transport: Some(Transport { local_address: ctx.origin.next_hop.to_string() }),
            afi_safis: vec![AfiSafi { config: Some(AfiSafiConfig { family: Some(Family::evpn()), enabled: true }) }],
            state: None,
        };
        c.add_peer(peer).await.map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// Takes a local change into the table.
fn local(ctx: &mut Ctx, l: Local, acts: &mut Vec<Action>) {
    let now = now_ms(ctx);
    match l {
        Local::Up { vni, mac, sticky } => ctx.table.local_up(vni, mac, sticky, now, acts),
        Local::Down { vni, mac } => ctx.table.local_down(vni, mac, now, acts),
    }
}

/// Reads the switch's local stations and brings the table in line: stations it has that
/// the table does not are announced, stations the table announces that are gone are
/// withdrawn.
fn resync_local(ctx: &mut Ctx, acts: &mut Vec<Action>) -> std::result::Result<(), String> {
    // (Changes already queued are older than the snapshot: dropped, as it says it all.)
    while ctx.rx.try_recv().is_ok() {}
    let port = ctx.port;
    let here = ctx.jobs.run(move |dp| dp.evpn_local_stations(port)).map_err(|e| e.to_string())?;
    let now: std::collections::HashSet<(u32, MacAddr)> = here.iter().map(|&(v, m, _)| (v, m)).collect();
    let gone: Vec<_> = ctx.table.announced().filter(|&(v, m, _, _)| !now.contains(&(v, m))).collect();
    let t = now_ms(ctx);
    for (vni, mac, _, _) in gone {
        ctx.table.local_down(vni, mac, t, acts);
    }
    for (vni, mac, sticky) in here {
        ctx.table.local_up(vni, mac, sticky, t, acts);
    }
    Ok(())
}

/// Does what the table decided: announcements and withdrawals through the speaker, the
/// rest in one job for the datapath.
async fn carry_out(ctx: &mut Ctx, c: &mut sluice_gobgp::Client, acts: Vec<Action>) {
    let mut for_switch = Vec::new();
    for a in acts {
        match a {
            Action::Announce { vni, mac, seq, sticky } => announce(ctx, c, vni, mac, seq, sticky).await,
            Action::Withdraw { vni, mac } => {
                if let Some((uuid, _, _)) = ctx.sent.remove(&(vni, mac))
                    && let Err(e) = c.delete_path(uuid).await
                {
                    *ctx.counters.entry("announce_errors".into()).or_default() += 1;
                    warn!(%mac, vni, "EVPN: withdrawing a station's route: {e}");
                }
            }
            Action::Duplicate { vni, mac, moves, here, hosts } => {
                let hosts: Vec<String> = here
                    .then(|| format!("{} (here)", ctx.origin.next_hop))
                    .into_iter()
                    .chain(hosts.iter().map(|h| h.to_string()))
                    .collect();
                warn!(
                    %mac,
                    vni,
                    moves,
                    window_s = ctx.settings.dup.window_ms / 1000,
                    hosts = %hosts.join(", "),
                    "EVPN: a station moves between hosts too often (two hosts have its MAC, or there is a loop): declared duplicate; what is announced and installed for it stays as it is, {}",
                    match ctx.settings.dup.hold_ms {
                        0 => "until `sluice evpn clear-duplicates`".to_string(),
                        h => format!("for {} s (or until `sluice evpn clear-duplicates`)", h / 1000),
                    }
                );
            }
            Action::Recovered { vni, mac } => info!(%mac, vni, "EVPN: a duplicate station is no longer frozen"),
            other => for_switch.push(other),
        }
    }
    let endpoints: Option<Vec<IpAddr>> =
        ctx.table.take_endpoints_changed().then(|| ctx.table.endpoints().into_iter().collect());
    // The addresses installed stations' routes bind, for ARP and ND suppression: what
    // changed.
    let (mut unbind, mut bind) = (Vec::new(), Vec::new());
    if ctx.table.has_ip_routes() || !ctx.bound.is_empty() {
        let now: std::collections::HashSet<_> = ctx.table.bindings().collect();
        unbind.extend(ctx.bound.difference(&now).map(|&(vni, ip, _)| (vni, ip)));
        bind.extend(now.difference(&ctx.bound).copied());
        ctx.bound = now;
    }
    if for_switch.is_empty() && endpoints.is_none() && unbind.is_empty() && bind.is_empty() {
        return;
    }
    let port = ctx.port;
    let refused = ctx.install_refused.clone();
    let suppression = ctx.suppression.clone();
    ctx.jobs.post(move |dp| {
        let sw = dp.switch_mut();
        for (vni, ip) in unbind {
            sw.evpn_unbind(port, vni, ip);
        }
        for (vni, ip, mac) in bind {
            if !sw.evpn_bind(port, vni, ip, mac) {
                suppression[1].fetch_add(1, Ordering::Relaxed);
            }
        }
        for a in for_switch {
            match a {
                Action::Install { vni, mac, endpoint } => {
                    if !sw.evpn_install(port, vni, mac, endpoint) {
                        refused.fetch_add(1, Ordering::Relaxed);
                    }
                }
                Action::Uninstall { vni, mac } => sw.evpn_uninstall(port, vni, mac),
                Action::Flood { vni, endpoints } => sw.evpn_flood(port, vni, &endpoints),
                Action::Announce { .. }
                | Action::Withdraw { .. }
                | Action::Duplicate { .. }
                | Action::Recovered { .. } => {}
            }
        }
        if let Some(e) = endpoints {
            sw.evpn_endpoints(port, &e);
        }
    });
}

async fn announce(ctx: &mut Ctx, c: &mut sluice_gobgp::Client, vni: u32, mac: MacAddr, seq: u32, sticky: bool) {
    let p = paths::mac_path(&ctx.origin, vni, mac, None, seq, sticky);
    match c.add_path(p).await {
        Ok(uuid) => {
            ctx.sent.insert((vni, mac), (uuid, seq, sticky));
        }
        Err(e) => {
            *ctx.counters.entry("announce_errors".into()).or_default() += 1;
            warn!(%mac, vni, "EVPN: announcing a station: {e}");
        }
    }
}

/// Announces the addresses local stations' ARP and neighbour-discovery messages bound to
/// them (a MAC+IP route each, with the station's number, while the station is announced)
/// and withdraws those gone or renumbered.
async fn announce_bindings(ctx: &mut Ctx, c: &mut sluice_gobgp::Client) -> std::result::Result<(), String> {
    let port = ctx.port;
    let here = ctx.jobs.run(move |dp| dp.evpn_local_bindings(port)).map_err(|e| e.to_string())?;
    let ours: HashMap<(u32, MacAddr), (u32, bool)> =
        ctx.table.announced().map(|(vni, mac, seq, sticky)| ((vni, mac), (seq, sticky))).collect();
    let want: HashMap<(u32, MacAddr, IpAddr), (u32, bool)> =
        here.into_iter().filter_map(|(vni, mac, ip)| ours.get(&(vni, mac)).map(|&n| ((vni, mac, ip), n))).collect();
    let gone: Vec<_> = ctx
        .sent_ips
        .iter()
        .filter(|(k, (_, seq, sticky))| want.get(k) != Some(&(*seq, *sticky)))
        .map(|(k, _)| *k)
        .collect();
    for k in gone {
        if let Some((uuid, _, _)) = ctx.sent_ips.remove(&k)
            && let Err(e) = c.delete_path(uuid).await
        {
            *ctx.counters.entry("announce_errors".into()).or_default() += 1;
            warn!(mac = %k.1, vni = k.0, ip = %k.2, "EVPN: withdrawing a station's address: {e}");
        }
    }
    for (k, (seq, sticky)) in want {
        if ctx.sent_ips.contains_key(&k) {
            continue;
        }
        match c.add_path(paths::mac_path(&ctx.origin, k.0, k.1, Some(k.2), seq, sticky)).await {
            Ok(uuid) => {
                ctx.sent_ips.insert(k, (uuid, seq, sticky));
            }
            Err(e) => {
                *ctx.counters.entry("announce_errors".into()).or_default() += 1;
                warn!(mac = %k.1, vni = k.0, ip = %k.2, "EVPN: announcing a station's address: {e}");
            }
        }
    }
    Ok(())
}

/// Publishes the agent's state for `evpn show`.
fn publish(ctx: &Ctx, peers: &[Peer]) {
    let state_name = |n: i32| {
        match n {
            1 => "idle",
            2 => "connect",
            3 => "active",
            4 => "opensent",
            5 => "openconfirm",
            6 => "established",
            _ => "unknown",
        }
        .to_string()
    };
    let mut sent: Vec<EvpnRouteReport> = ctx
        .sent
        .iter()
        .map(|(&(vni, mac), &(_, seq, sticky))| EvpnRouteReport {
            route_type: if mac.is_zero() { 3 } else { 2 },
            vni,
            mac: (!mac.is_zero()).then(|| mac.to_string()),
            ip: None,
            endpoint: ctx.origin.next_hop.to_string(),
            seq,
            sticky,
            status: "announced".into(),
        })
        .chain(ctx.sent_ips.iter().map(|(&(vni, mac, ip), &(_, seq, sticky))| EvpnRouteReport {
            route_type: 2,
            vni,
            mac: Some(mac.to_string()),
            ip: Some(ip.to_string()),
            endpoint: ctx.origin.next_hop.to_string(),
            seq,
            sticky,
            status: "announced".into(),
        }))
        .collect();
    sent.sort_by(|a, b| (a.vni, a.route_type, &a.mac, &a.ip).cmp(&(b.vni, b.route_type, &b.mac, &b.ip)));
    let mut received: Vec<EvpnRouteReport> = ctx
        .table
        .received()
        .map(|(r, installed)| EvpnRouteReport {
            route_type: 2,
            vni: r.vni,
            mac: Some(r.mac.to_string()),
            ip: r.ip.map(|a| a.to_string()),
            endpoint: r.endpoint.to_string(),
            seq: r.seq,
            sticky: r.sticky,
            status: if installed { "installed" } else { "lost" }.into(),
        })
        .collect();
    for (vni, eps) in ctx.table.flood_lists() {
        for ep in eps {
            received.push(EvpnRouteReport {
                route_type: 3,
                vni,
                mac: None,
                ip: None,
                endpoint: ep.to_string(),
                seq: 0,
                sticky: false,
                status: "installed".into(),
            });
        }
    }
    received
        .sort_by(|a, b| (a.vni, a.route_type, &a.mac, &a.endpoint).cmp(&(b.vni, b.route_type, &b.mac, &b.endpoint)));
    let t = &ctx.table.counters;
    let mut counters = ctx.counters.clone();
    for (k, v) in [
        ("received", t.received),
        ("installed", ctx.table.installed() as u64),
        ("over_limit", t.over_limit),
        ("waiting", ctx.table.waiting() as u64),
        ("claims_local", t.claims_local),
        ("moved_away", t.moved_away),
        ("flood_over_limit", t.flood_over_limit),
        ("duplicates", t.duplicates),
        ("ips_over_limit", t.ips_over_limit),
        ("bindings", ctx.bound.len() as u64),
        ("arp_suppressed", ctx.suppression[0].load(Ordering::Relaxed)),
        ("nd_suppressed", ctx.suppression[2].load(Ordering::Relaxed)),
        ("bind_refused", ctx.suppression[1].load(Ordering::Relaxed)),
        ("stale", ctx.table.stale() as u64),
        ("install_refused", ctx.install_refused.load(Ordering::Relaxed)),
    ] {
        counters.insert(k.into(), v);
    }
    let peers = peers
        .iter()
        .filter_map(|p| {
            let conf = p.conf.as_ref()?;
            Some(EvpnPeerReport {
                address: conf.neighbor_address.clone(),
                asn: conf.peer_asn,
                state: state_name(p.state.as_ref().map_or(0, |s| s.session_state)),
            })
        })
        .collect();
    let now = now_ms(ctx);
    let hold = ctx.settings.dup.hold_ms;
    let mut duplicates: Vec<EvpnDuplicateReport> = ctx
        .table
        .duplicates()
        .map(|d| EvpnDuplicateReport {
            vni: d.vni,
            mac: d.mac.to_string(),
            moves: d.moves,
            hosts: d
                .here
                .then_some(ctx.origin.next_hop)
                .into_iter()
                .chain(d.hosts.iter().copied())
                .map(|a| a.to_string())
                .collect(),
            here: d.here,
            frozen_s: now.saturating_sub(d.since_ms) / 1000,
            recovers_in_s: (hold > 0).then(|| (d.since_ms + hold).saturating_sub(now).div_ceil(1000)),
        })
        .collect();
    duplicates.sort_by(|a, b| (a.vni, &a.mac).cmp(&(b.vni, &b.mac)));
    let mut r = ctx.report.lock().unwrap_or_else(|p| p.into_inner());
    r.duplicates = duplicates;
    r.peers = peers;
    r.sent = sent;
    r.received = received;
    r.counters = counters;
}

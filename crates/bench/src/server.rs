//! `sluice bench serve`: runs the mirror of each client's flowops, one run at a time.
//!
//! For every run the server opens one data listener per group, accepts every connection
//! the client's threads make, and runs the group's connection script mirrored on a thread
//! per connection, counting what it moved. Timed loops end as docs/architecture.md
//! describes: at end-of-file at the loop head (client-driven) or when the client's
//! half-close is seen there (server-driven).
//!
//! A group whose client opens its connections with `accept` is served in reverse: each
//! client thread opens a *doorbell* connection to the group's listener and names its own
//! listening port; every byte it then sends asks the server to connect back once, and
//! the connection runs the same mirrored script.
//!
//! The server is left listening where anyone may reach it, so what a client can make it do
//! is bounded (docs/architecture.md, "The workload modeler's server"):
//! - at most [`MAX_CONTROL`] control connections at once (a newcomer closes the oldest one
//!   that holds no run); outside a run every control message must arrive whole within
//!   [`CONTROL_WAIT`], so a client that connects or says hello and then idles gives the
//!   server up;
//! - a run has the bounds of [`crate::script::derive_all`]; it takes data connections and
//!   datagrams from its client's address only; each group serves at most twice its
//!   connections plus 16 at once (more wait in the listen backlog); a data connection that
//!   makes no progress for its group's patience ([`DATA_IDLE`] plus the pauses the profile
//!   makes on purpose) is closed, and a run with no data connection for that long is
//!   abandoned;
//! - a UDP group answers each datagram with at most [`MAX_ANSWERS`] datagrams, and keeps at
//!   most twice its connections plus 16 peers, forgetting those silent for its patience;
//! - whatever a run opened (listeners, sockets, threads, connections) ends with the run,
//!   however it ends: done, abandoned, its client gone, or its preparation failed part-way.
//!   Failing to start a thread refuses what needed it; it never panics.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::buf::IoBuf;
use crate::control::{Channel, ClientMsg, PROTOCOL, ServerMsg, boot_id};
use crate::profile::FlowOpKind;
use crate::profile::parse;
use crate::result::SideCounts;
use crate::script::{ConnScript, Io, MAX_ANSWERS, Rng, Times, derive_all};
use crate::sys::{peer_half_closed, size_backlog, wait_readable};

/// How long a client has for each control message outside a run: its hello after
/// connecting, a run request after hello or after the previous run's counts.
pub const CONTROL_WAIT: Duration = Duration::from_secs(10);

/// The most control connections served at once.
pub const MAX_CONTROL: usize = 16;

/// The silence a data connection (or a UDP peer) is allowed on top of the pauses its
/// profile makes on purpose.
pub const DATA_IDLE: Duration = Duration::from_secs(60);

/// How long a finished run waits for its connections to end before closing them.
const FINISH_WAIT: Duration = Duration::from_secs(30);

/// How often a waiting loop looks at whether its run has ended.
const TICK: Duration = Duration::from_millis(100);

/// Stack of a data connection's thread (its buffers are on the heap).
const CONN_STACK: usize = 256 * 1024;

/// Connections (or UDP peers) a group serves at once beyond its thread count: a closing
/// connection's thread may still be finishing when the client opens the next.
fn group_cap(count: u32) -> u64 {
    2 * u64::from(count) + 16
}

/// The server's log: one line per event.
type Log = Arc<dyn Fn(String) + Send + Sync>;

/// Logs one cause at most once a minute, saying how many were left out.
#[derive(Default)]
struct Throttle {
    last: Mutex<Option<Instant>>,
    quiet: AtomicU64,
}

impl Throttle {
    fn log(&self, log: &dyn Fn(String), line: impl FnOnce() -> String) {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if last.is_some_and(|t| t.elapsed() < Duration::from_secs(60)) {
            self.quiet.fetch_add(1, Ordering::Relaxed);
            return;
        }
        *last = Some(Instant::now());
        let quiet = self.quiet.swap(0, Ordering::Relaxed);
        let line = line();
        if quiet > 0 {
            log(format!("{line} (and {quiet} more like it in the last minute)"));
        } else {
            log(line);
        }
    }
}

/// Serves runs on `listener` until the process ends. `log` receives one line per event.
pub fn serve(listener: TcpListener, log: Arc<dyn Fn(String) + Send + Sync>) -> io::Result<()> {
    let busy = Arc::new(Mutex::new(()));
    let slots = Arc::new(Slots::default());
    let throttles = Arc::new(Throttles::default());
    for conn in listener.incoming() {
        let stream = match conn {
            Ok(s) => s,
            Err(e) => {
                throttles.accept.log(&*log, || format!("accepting a control connection failed: {e}"));
                // (Out of descriptors, the error comes back at once: do not spin on it.)
                std::thread::sleep(TICK);
                continue;
            }
        };
        let peer = stream.peer_addr().map(|a| a.to_string()).unwrap_or_default();
        let slot = slots.admit(&stream, &peer, &throttles, &*log);
        let (busy, log2, throttles2) = (busy.clone(), log.clone(), throttles.clone());
        let spawned = std::thread::Builder::new().name("bench-control".into()).spawn(move || {
            if let Err(e) = control(stream, &busy, &slot, &log2, &throttles2) {
                log2(format!("client {}: {e}", slot.peer));
            }
        });
        if let Err(e) = spawned {
            // The closure, and with it the connection and its slot, is dropped: closed.
            throttles.spawn.log(&*log, || {
                format!("cannot start a thread for client {peer}'s control connection ({e}); closed it")
            });
        }
    }
    Ok(())
}

/// The causes the control side logs at most once a minute, since anyone can repeat them.
#[derive(Default)]
struct Throttles {
    accept: Throttle,
    spawn: Throttle,
    evict: Throttle,
    early: Throttle,
}

/// The open control connections, so that a newcomer can close the oldest idle one.
#[derive(Default)]
struct Slots {
    open: Mutex<Vec<SlotEntry>>,
    next: AtomicU64,
}

struct SlotEntry {
    id: u64,
    stream: Option<TcpStream>,
    since: Instant,
    holds: Arc<AtomicBool>,
    peer: String,
}

/// A control connection's place among the open ones; gives it up when dropped.
struct Slot {
    id: u64,
    slots: Arc<Slots>,
    /// The connection holds the server's run (it may not be closed for a newcomer).
    holds: Arc<AtomicBool>,
    peer: String,
}

impl Slots {
    /// Takes a slot for `stream`; when all are taken, closes the oldest connection that
    /// holds no run.
    fn admit(self: &Arc<Self>, stream: &TcpStream, peer: &str, throttles: &Throttles, log: &dyn Fn(String)) -> Slot {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        if open.len() >= MAX_CONTROL
            && let Some(i) = open
                .iter()
                .enumerate()
                .filter(|(_, e)| !e.holds.load(Ordering::SeqCst))
                .min_by_key(|(_, e)| e.since)
                .map(|(i, _)| i)
        {
            let old = open.swap_remove(i);
            if let Some(s) = &old.stream {
                let _ = s.shutdown(Shutdown::Both);
            }
            throttles.evict.log(log, || {
                format!(
                    "{MAX_CONTROL} control connections were open: closed the oldest that held no run (client {}, {} s old) for client {peer}",
                    old.peer,
                    old.since.elapsed().as_secs()
                )
            });
        }
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let holds = Arc::new(AtomicBool::new(false));
        open.push(SlotEntry {
            id,
            stream: stream.try_clone().ok(),
            since: Instant::now(),
            holds: holds.clone(),
            peer: peer.to_string(),
        });
        Slot { id, slots: self.clone(), holds, peer: peer.to_string() }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.slots.open.lock().unwrap_or_else(|p| p.into_inner()).retain(|e| e.id != self.id);
    }
}

fn control(stream: TcpStream, busy: &Mutex<()>, slot: &Slot, log: &Log, throttles: &Throttles) -> io::Result<()> {
    let peer = stream.peer_addr()?;
    let local = stream.local_addr()?;
    // A client that stops reading cannot hold this thread in a write either.
    stream.set_write_timeout(Some(CONTROL_WAIT))?;
    let mut ch = Channel::new(stream)?;
    match ch.recv_by::<ClientMsg>(Instant::now() + CONTROL_WAIT) {
        Ok(Some(ClientMsg::Hello { protocol, version })) if protocol == PROTOCOL => {
            ch.send(&ServerMsg::Hello {
                protocol: PROTOCOL,
                version: env!("CARGO_PKG_VERSION").into(),
                pid: std::process::id(),
                boot_id: boot_id(),
            })?;
            log(format!("client {peer} (sluice {version}) connected"));
        }
        Ok(Some(ClientMsg::Hello { protocol, version })) => {
            let message = format!(
                "this server speaks bench protocol {PROTOCOL} (sluice {}) and the client {protocol} (sluice {version}): run the same sluice version on both ends",
                env!("CARGO_PKG_VERSION")
            );
            ch.send(&ServerMsg::Error { message: message.clone() })?;
            return Err(io::Error::other(message));
        }
        // Anyone can connect and say nothing, or anything: logged once a minute.
        Ok(None) => return Ok(()),
        Ok(Some(_)) => {
            throttles.early.log(&**log, || format!("client {peer} did not start with hello; closed its connection"));
            return Ok(());
        }
        Err(e) if e.kind() == io::ErrorKind::TimedOut => {
            throttles.early.log(&**log, || {
                format!(
                    "client {peer} sent no hello within {} s of connecting; closed its connection",
                    CONTROL_WAIT.as_secs()
                )
            });
            return Ok(());
        }
        Err(e) => {
            throttles.early.log(&**log, || format!("client {peer} before hello: {e}; closed its connection"));
            return Ok(());
        }
    }
    // The previous client's control thread may still be closing: wait a little before
    // calling the server busy.
    let mut guard = busy.try_lock().ok();
    let deadline = Instant::now() + Duration::from_secs(3);
    while guard.is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
        guard = busy.try_lock().ok();
    }
    let Some(_guard) = guard else {
        let message = "the server is busy with another client's run; try again when it has finished".to_string();
        ch.send(&ServerMsg::Error { message: message.clone() })?;
        return Err(io::Error::other(message));
    };
    slot.holds.store(true, Ordering::SeqCst);
    let client = peer.ip().to_canonical();
    loop {
        let msg = match ch.recv_by::<ClientMsg>(Instant::now() + CONTROL_WAIT) {
            Ok(Some(m)) => m,
            Ok(None) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::TimedOut => {
                log(format!(
                    "client {peer} sent no run request within {} s; closed its connection so that another client can run",
                    CONTROL_WAIT.as_secs()
                ));
                let _ = ch.send(&ServerMsg::Error {
                    message: format!(
                        "no run request within {} s: the server closed the connection",
                        CONTROL_WAIT.as_secs()
                    ),
                });
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        let ClientMsg::Run { profile_xml } = msg else {
            ch.send(&ServerMsg::Error { message: "expected a run request".into() })?;
            continue;
        };
        let run = match prepare(&profile_xml, local, client) {
            Ok(run) => run,
            Err(message) => {
                log(format!("client {peer}: run refused: {message}"));
                ch.send(&ServerMsg::Error { message })?;
                continue;
            }
        };
        ch.send(&ServerMsg::Ready { ports: run.ports.clone() })?;
        let cpu0 = crate::cpu::self_seconds().unwrap_or(0.0);
        if let Err(why) = wait_done(&mut ch, &run) {
            run.shared.close();
            for line in run.summary() {
                log(format!("client {peer}: {line}"));
            }
            return Err(io::Error::other(why));
        }
        let counts = run.finish(FINISH_WAIT);
        let cpu_s = (crate::cpu::self_seconds().unwrap_or(0.0) - cpu0).max(0.0);
        log(format!(
            "run done: {} transactions, {} bytes in, {} bytes out, {} connections",
            counts.transactions, counts.bytes_received, counts.bytes_sent, counts.connections
        ));
        for line in run.summary() {
            log(format!("client {peer}: {line}"));
        }
        drop(run);
        ch.send(&ServerMsg::Counts { counts, cpu_s })?;
    }
}

/// Waits for the client's `done` while its run goes on. A run in which no data connection
/// has been open (and no UDP peer known) for its patience is abandoned.
fn wait_done(ch: &mut Channel, run: &Run) -> Result<(), String> {
    loop {
        if ch.ready_within(Duration::from_secs(1)).map_err(|e| format!("during a run: {e}"))? {
            return match ch.recv_by::<ClientMsg>(Instant::now() + CONTROL_WAIT) {
                Ok(Some(ClientMsg::Done)) => Ok(()),
                Ok(None) => Err("the client went away during a run; stopped the run".into()),
                Ok(Some(_)) => Err("the client sent something other than done during a run; stopped the run".into()),
                Err(e) => Err(format!("during a run: {e}; stopped the run")),
            };
        }
        if let Some(idle) = run.shared.idle_for()
            && idle >= run.patience
        {
            let message = format!(
                "the run was abandoned: no data connection was open for {} s; the server stopped it",
                idle.as_secs()
            );
            let _ = ch.send(&ServerMsg::Error { message: message.clone() });
            return Err(message);
        }
    }
}

/// What the server counts, shared by its connection threads.
struct Counters {
    transactions: AtomicU64,
    bytes_sent: AtomicU64,
    bytes_received: AtomicU64,
    connections: AtomicU64,
    active: Mutex<Activity>,
    idle: Condvar,
}

/// Connections (and UDP peers) being served, and since when there have been none.
struct Activity {
    n: u64,
    since: Instant,
}

impl Counters {
    fn new() -> Self {
        Counters {
            transactions: AtomicU64::new(0),
            bytes_sent: AtomicU64::new(0),
            bytes_received: AtomicU64::new(0),
            connections: AtomicU64::new(0),
            active: Mutex::new(Activity { n: 0, since: Instant::now() }),
            idle: Condvar::new(),
        }
    }

    fn snapshot(&self) -> SideCounts {
        SideCounts {
            transactions: self.transactions.load(Ordering::Relaxed),
            bytes_sent: self.bytes_sent.load(Ordering::Relaxed),
            bytes_received: self.bytes_received.load(Ordering::Relaxed),
            connections: self.connections.load(Ordering::Relaxed),
        }
    }

    fn add_active(&self, delta: i64) {
        let mut a = self.active.lock().unwrap_or_else(|p| p.into_inner());
        a.n = a.n.saturating_add_signed(delta);
        if a.n == 0 {
            a.since = Instant::now();
            self.idle.notify_all();
        }
    }
}

/// What a run's threads share.
struct RunShared {
    /// The client's address (canonical: an IPv4-mapped address as IPv4): the only one
    /// whose data connections and datagrams the run takes, and the only one it answers.
    client: IpAddr,
    /// No new data connections or UDP peers (the client said done, or the run ends).
    stop: AtomicBool,
    /// Everything ends now; set with `streams.closed`.
    closed: AtomicBool,
    /// The run's open data connections, shut down when it closes.
    streams: Mutex<Streams>,
    c: Counters,
    /// What a data connection writes: one buffer for the whole run.
    out: IoBuf,
    /// Data connections and datagrams from other addresses than the client's.
    strangers: AtomicU64,
    /// Data connections closed for making no progress within their patience.
    stalled: AtomicU64,
    /// UDP peers forgotten (silent for their patience, or evicted from a full table).
    forgotten: AtomicU64,
    /// Answers not sent because a datagram had already had its [`MAX_ANSWERS`].
    held_back: AtomicU64,
    /// Data connections refused because no thread could be started for them.
    no_thread: AtomicU64,
    /// Accepts that failed (other than for want of a pending connection).
    accept_failed: AtomicU64,
}

#[derive(Default)]
struct Streams {
    closed: bool,
    next: u64,
    open: HashMap<u64, TcpStream>,
}

/// A data connection on the run's list; leaves the list when dropped.
struct Tracked {
    id: u64,
    run: Arc<RunShared>,
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.run.streams.lock().unwrap_or_else(|p| p.into_inner()).open.remove(&self.id);
    }
}

impl RunShared {
    fn new(client: IpAddr) -> Self {
        RunShared {
            client,
            stop: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            streams: Mutex::new(Streams::default()),
            c: Counters::new(),
            out: IoBuf::filled(CHUNK, 0x5a),
            strangers: AtomicU64::new(0),
            stalled: AtomicU64::new(0),
            forgotten: AtomicU64::new(0),
            held_back: AtomicU64::new(0),
            no_thread: AtomicU64::new(0),
            accept_failed: AtomicU64::new(0),
        }
    }

    /// Puts `s` on the run's list of connections to shut down when the run closes; `None`
    /// (and `s` shut down) if it has closed already.
    fn track(self: &Arc<Self>, s: &TcpStream) -> Option<Tracked> {
        let mut streams = self.streams.lock().unwrap_or_else(|p| p.into_inner());
        if streams.closed {
            let _ = s.shutdown(Shutdown::Both);
            return None;
        }
        let clone = s.try_clone().ok()?;
        let id = streams.next;
        streams.next += 1;
        streams.open.insert(id, clone);
        Some(Tracked { id, run: self.clone() })
    }

    /// Ends the run: no new connections, every open one shut down (their threads see the
    /// end of their stream or a failed write and return).
    fn close(&self) {
        self.stop.store(true, Ordering::SeqCst);
        let mut streams = self.streams.lock().unwrap_or_else(|p| p.into_inner());
        streams.closed = true;
        self.closed.store(true, Ordering::SeqCst);
        for s in streams.open.values() {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    /// How long the run has had no data connection open, if it has none.
    fn idle_for(&self) -> Option<Duration> {
        let a = self.c.active.lock().unwrap_or_else(|p| p.into_inner());
        (a.n == 0).then(|| a.since.elapsed())
    }

    fn add(&self, counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// One client's run: its data ports, and the threads that serve them.
struct Run {
    ports: Vec<u16>,
    shared: Arc<RunShared>,
    /// The acceptors and UDP loops, joined when the run is dropped (each looks at
    /// `stop`/`closed` at least every [`TICK`]).
    threads: Vec<JoinHandle<()>>,
    /// The longest patience of its groups: how long the run may go without a connection.
    patience: Duration,
}

impl Run {
    /// Stops taking connections, waits up to `limit` for the open ones to end, closes the
    /// rest and returns the counts.
    fn finish(&self, limit: Duration) -> SideCounts {
        let run = &self.shared;
        run.stop.store(true, Ordering::SeqCst);
        let active = run.c.active.lock().unwrap_or_else(|p| p.into_inner());
        drop(run.c.idle.wait_timeout_while(active, limit, |a| a.n > 0));
        run.close();
        run.c.snapshot()
    }

    /// One line per unusual thing the run saw, for the log.
    fn summary(&self) -> Vec<String> {
        let run = &self.shared;
        let n = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let mut lines = Vec::new();
        if n(&run.strangers) > 0 {
            lines.push(format!(
                "ignored {} data connections and datagrams from other addresses than the client's ({})",
                n(&run.strangers),
                run.client
            ));
        }
        if n(&run.stalled) > 0 {
            lines.push(format!(
                "closed {} data connections that made no progress for {} s",
                n(&run.stalled),
                self.patience.as_secs()
            ));
        }
        if n(&run.forgotten) > 0 {
            lines.push(format!(
                "forgot {} UDP peers (silent too long, or more at once than the profile's connections)",
                n(&run.forgotten)
            ));
        }
        if n(&run.held_back) > 0 {
            lines.push(format!(
                "held back {} datagrams: the server answers a datagram with at most {MAX_ANSWERS}",
                n(&run.held_back)
            ));
        }
        if n(&run.no_thread) > 0 {
            lines.push(format!(
                "refused {} data connections: no thread could be started for them (the server is short of memory or threads)",
                n(&run.no_thread)
            ));
        }
        if n(&run.accept_failed) > 0 {
            lines.push(format!(
                "{} data connections could not be accepted (out of file descriptors? raise the server's limit, ulimit -n)",
                n(&run.accept_failed)
            ));
        }
        lines
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        self.shared.close();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Opens a run's data listeners and sockets, each with its thread. On any failure the
/// partial run is dropped: what it bound is closed and its threads end.
fn prepare(xml: &str, local: SocketAddr, client: IpAddr) -> Result<Run, String> {
    let profile = parse(xml, "profile sent by the client", &|_| None).map_err(|e| e.to_string())?;
    let scripts = derive_all(&profile).map_err(|e| e.to_string())?;
    let shared = Arc::new(RunShared::new(client));
    let patience = scripts.iter().map(|s| DATA_IDLE.saturating_add(s.pause)).max().unwrap_or(DATA_IDLE);
    let mut run = Run { ports: Vec::new(), shared, threads: Vec::new(), patience };
    for (g, script) in profile.groups.iter().zip(scripts) {
        let script = Arc::new(script);
        let patience = DATA_IDLE.saturating_add(script.pause);
        let cap = group_cap(g.count);
        // A connect's `port=` names the data port; otherwise the server picks one.
        let port = g.port_of(FlowOpKind::Connect).unwrap_or(0);
        let shared = run.shared.clone();
        let start = |name: &str, f: Box<dyn FnOnce() + Send>| {
            std::thread::Builder::new().name(name.into()).stack_size(CONN_STACK).spawn(f).map_err(|e| {
                format!(
                    "cannot start a thread for the group on line {} ({e}): the server is short of memory or threads",
                    g.line
                )
            })
        };
        if script.udp {
            let u = UdpSocket::bind(SocketAddr::new(local.ip(), port))
                .map_err(|e| format!("cannot open a UDP data socket on port {port}: {e}"))?;
            run.ports.push(u.local_addr().map_err(|e| e.to_string())?.port());
            run.threads.push(start("bench-udp", Box::new(move || udp_loop(u, &script, &shared, patience, cap)))?);
            continue;
        }
        let l = TcpListener::bind(SocketAddr::new(local.ip(), port))
            .map_err(|e| format!("cannot open a data listener on port {port}: {e}"))?;
        // Every client thread may connect at once: a backlog of the default 128 would
        // drop SYNs at 250 connections and stall their connects for a second.
        size_backlog(&l, g.count).map_err(|e| format!("cannot size the data listener's backlog: {e}"))?;
        l.set_nonblocking(true).map_err(|e| format!("cannot set up the data listener: {e}"))?;
        run.ports.push(l.local_addr().map_err(|e| e.to_string())?.port());
        run.threads.push(start("bench-accept", Box::new(move || accept_loop(l, script, shared, patience, cap)))?);
    }
    Ok(run)
}

/// Accepts a TCP group's connections from the client until the run stops, serving at most
/// `cap` at once.
fn accept_loop(l: TcpListener, script: Arc<ConnScript>, run: Arc<RunShared>, patience: Duration, cap: u64) {
    let served = Arc::new(AtomicU64::new(0));
    while !run.stop.load(Ordering::SeqCst) {
        if served.load(Ordering::SeqCst) >= cap {
            // More connections than the group has threads: they wait in the backlog.
            std::thread::sleep(Duration::from_millis(10));
            continue;
        }
        match wait_readable(l.as_raw_fd(), TICK) {
            Ok(true) => {}
            Ok(false) => continue,
            Err(_) => {
                std::thread::sleep(TICK);
                continue;
            }
        }
        let (s, from) = match l.accept() {
            Ok(x) => x,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted | io::ErrorKind::ConnectionAborted
                ) =>
            {
                continue;
            }
            Err(_) => {
                run.add(&run.accept_failed);
                std::thread::sleep(TICK);
                continue;
            }
        };
        if from.ip().to_canonical() != run.client {
            run.add(&run.strangers);
            continue;
        }
        if !script.reverse {
            run.c.connections.fetch_add(1, Ordering::Relaxed);
        }
        serve_connection(s, &script, &run, &served, patience);
    }
}

/// Serves one accepted connection on a thread of its own.
fn serve_connection(
    s: TcpStream,
    script: &Arc<ConnScript>,
    run: &Arc<RunShared>,
    served: &Arc<AtomicU64>,
    patience: Duration,
) {
    if s.set_read_timeout(Some(patience)).and_then(|()| s.set_write_timeout(Some(patience))).is_err() {
        return;
    }
    let Some(tracked) = run.track(&s) else { return };
    served.fetch_add(1, Ordering::SeqCst);
    run.c.add_active(1);
    let (script, run2, served2) = (script.clone(), run.clone(), served.clone());
    let spawned = std::thread::Builder::new().name("bench-conn".into()).stack_size(CONN_STACK).spawn(move || {
        let r = if script.reverse { connect_back(s, &script, &run2, patience) } else { mirror(s, &script, &run2) };
        if let Err(e) = r
            && matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut)
        {
            run2.add(&run2.stalled);
        }
        drop(tracked);
        served2.fetch_sub(1, Ordering::SeqCst);
        run2.c.add_active(-1);
    });
    if spawned.is_err() {
        // The closure (the connection and its tracking) was dropped: closed.
        run.add(&run.no_thread);
        served.fetch_sub(1, Ordering::SeqCst);
        run.c.add_active(-1);
    }
}

/// Where one UDP peer is in its connection script.
struct Peer {
    seg: usize,
    step: usize,
    /// Repetitions of the current step done.
    rep: u64,
    pass: u64,
    rng: Rng,
    awaiting_seed: bool,
    heard: Instant,
}

/// Serves a UDP group: every datagram from the client's address is fed to its sender's
/// script. A zero-length datagram ends a timed loop, or the connection when no timed loop
/// is running. At most `cap` peers are known at once; one silent for `patience` is
/// forgotten.
fn udp_loop(u: UdpSocket, script: &ConnScript, run: &RunShared, patience: Duration, cap: u64) {
    let _ = u.set_read_timeout(Some(TICK));
    let mut peers: HashMap<SocketAddr, Peer> = HashMap::new();
    let mut buf = IoBuf::new(65_536);
    let buf = buf.as_mut_slice();
    let mut swept = Instant::now();
    let forget = |n: usize| {
        run.forgotten.fetch_add(n as u64, Ordering::Relaxed);
        run.c.add_active(-(n as i64));
    };
    loop {
        if run.closed.load(Ordering::SeqCst) || (run.stop.load(Ordering::SeqCst) && peers.is_empty()) {
            break;
        }
        if swept.elapsed() >= Duration::from_secs(1) {
            let before = peers.len();
            peers.retain(|_, p| p.heard.elapsed() < patience);
            if peers.len() < before {
                forget(before - peers.len());
            }
            swept = Instant::now();
        }
        let Ok((n, from)) = u.recv_from(buf) else { continue };
        if from.ip().to_canonical() != run.client {
            run.add(&run.strangers);
            continue;
        }
        if !peers.contains_key(&from) {
            if run.stop.load(Ordering::SeqCst) {
                continue;
            }
            if peers.len() as u64 >= cap
                && let Some(oldest) = peers.iter().min_by_key(|(_, p)| p.heard).map(|(a, _)| *a)
            {
                peers.remove(&oldest);
                forget(1);
            }
            run.c.connections.fetch_add(1, Ordering::Relaxed);
            run.c.add_active(1);
            let p = Peer {
                seg: 0,
                step: 0,
                rep: 0,
                pass: 0,
                rng: Rng::new(0),
                awaiting_seed: script.seeded,
                heard: Instant::now(),
            };
            peers.insert(from, p);
        }
        let Some(p) = peers.get_mut(&from) else { continue };
        p.heard = Instant::now();
        if p.awaiting_seed {
            p.rng = Rng::new(u64::from_le_bytes(buf[..n.min(8)].try_into().unwrap_or([0; 8])));
            p.awaiting_seed = false;
            continue;
        }
        if !feed(p, script, &u, from, n, run) {
            peers.remove(&from);
            run.c.add_active(-1);
        }
    }
    // Peers still known when the run ends (their goodbyes lost, or the client gone).
    run.c.add_active(-(peers.len() as i64));
}

/// Advances a UDP peer's script by one received datagram of `n` bytes and sends whatever
/// the script writes next: at most [`MAX_ANSWERS`] datagrams, and none once the run has
/// closed. Returns false when the peer has disconnected.
fn feed(p: &mut Peer, script: &ConnScript, u: &UdpSocket, to: SocketAddr, n: usize, run: &RunShared) -> bool {
    let c = &run.c;
    let out = run.out.as_slice();
    let mut datagram = Some(n);
    let mut answers = 0u64;
    loop {
        let Some(seg) = script.segments.get(p.seg) else {
            // Script done: only the client's goodbye (a zero-length datagram) is expected.
            return datagram != Some(0);
        };
        if p.step == seg.steps.len() {
            p.step = 0;
            p.pass += 1;
            if seg.counts {
                c.transactions.fetch_add(1, Ordering::Relaxed);
            }
            let done = match seg.times {
                Times::Once => true,
                Times::Count(k) => p.pass == k,
                Times::Timed => false,
            };
            if done {
                p.seg += 1;
                p.pass = 0;
            }
            continue;
        }
        let step = &seg.steps[p.step];
        match step.io.mirrored() {
            Io::Read(_) => match datagram.take() {
                None => return true,
                Some(0) if seg.times == Times::Timed && p.step == 0 && p.rep == 0 => {
                    p.seg += 1;
                    p.pass = 0;
                }
                Some(0) => return false,
                Some(len) => {
                    c.bytes_received.fetch_add(len as u64, Ordering::Relaxed);
                    advance(p, step.count);
                }
            },
            Io::Write(size) => {
                if answers == MAX_ANSWERS || run.closed.load(Ordering::Relaxed) {
                    run.add(&run.held_back);
                    return true;
                }
                answers += 1;
                let k = (p.rng.size(&size) as usize).min(out.len());
                if u.send_to(&out[..k], to).is_ok() {
                    c.bytes_sent.fetch_add(k as u64, Ordering::Relaxed);
                }
                advance(p, step.count);
            }
        }
    }
}

/// One repetition of the peer's current step done.
fn advance(p: &mut Peer, count: u64) {
    p.rep += 1;
    if p.rep >= count {
        p.rep = 0;
        p.step += 1;
    }
}

/// Serves one client thread of a reverse group: reads the port it listens on from its
/// doorbell, then connects back once per byte rung, running the mirror script on each
/// connection in turn, until the doorbell closes (or the run does).
fn connect_back(mut bell: TcpStream, script: &ConnScript, run: &Arc<RunShared>, patience: Duration) -> io::Result<()> {
    let mut port = [0u8; 2];
    bell.read_exact(&mut port)?;
    // (The doorbell's peer is the client: the acceptor took it from no one else.)
    let to = SocketAddr::new(bell.peer_addr()?.ip(), u16::from_le_bytes(port));
    let mut ring = [0u8; 1];
    loop {
        match bell.read(&mut ring) {
            Ok(0) => return Ok(()),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
        if run.stop.load(Ordering::SeqCst) {
            return Ok(());
        }
        let s = TcpStream::connect_timeout(&to, Duration::from_secs(10))?;
        s.set_read_timeout(Some(patience))?;
        s.set_write_timeout(Some(patience))?;
        let Some(_tracked) = run.track(&s) else { return Ok(()) };
        run.c.connections.fetch_add(1, Ordering::Relaxed);
        mirror(s, script, run)?;
    }
}

/// Buffer for one write or read call.
const CHUNK: usize = 256 * 1024;

/// Runs one connection's script, mirrored.
fn mirror(mut s: TcpStream, script: &ConnScript, run: &RunShared) -> io::Result<()> {
    let c = &run.c;
    s.set_nodelay(script.nodelay)?;
    let mut rng = Rng::new(0);
    if script.seeded {
        let mut seed = [0u8; 8];
        s.read_exact(&mut seed)?;
        rng = Rng::new(u64::from_le_bytes(seed));
    }
    let out = run.out.as_slice();
    let mut inp = IoBuf::new(CHUNK);
    let inp = inp.as_mut_slice();
    for seg in &script.segments {
        let mut pass = 0u64;
        loop {
            match seg.times {
                Times::Once if pass == 1 => break,
                Times::Count(n) if pass == n => break,
                Times::Timed if seg.server_driven() && peer_half_closed(&s)? => break,
                _ => {}
            }
            let mut eof_at_head = false;
            'pass: for (i, step) in seg.steps.iter().enumerate() {
                // The server does the mirror: the client's write is our read.
                let io = step.io.mirrored();
                for rep in 0..step.count {
                    match &io {
                        Io::Read(size) => {
                            let n = rng.size(size);
                            let got = read_n(&mut s, inp, n)?;
                            c.bytes_received.fetch_add(got, Ordering::Relaxed);
                            if got < n {
                                if i == 0 && rep == 0 && got == 0 && seg.times == Times::Timed {
                                    eof_at_head = true;
                                    break 'pass;
                                }
                                return Err(io::Error::new(
                                    io::ErrorKind::UnexpectedEof,
                                    "the client closed mid-transaction",
                                ));
                            }
                        }
                        Io::Write(size) => {
                            let n = rng.size(size);
                            write_n(&mut s, out, n)?;
                            c.bytes_sent.fetch_add(n, Ordering::Relaxed);
                        }
                    }
                }
            }
            if eof_at_head {
                break;
            }
            if seg.counts {
                c.transactions.fetch_add(1, Ordering::Relaxed);
            }
            pass += 1;
        }
    }
    Ok(())
}

/// Reads exactly `n` bytes (or until end of stream); returns how many arrived.
pub(crate) fn read_n(s: &mut TcpStream, buf: &mut [u8], n: u64) -> io::Result<u64> {
    let mut got = 0u64;
    while got < n {
        let want = ((n - got) as usize).min(buf.len());
        match s.read(&mut buf[..want]) {
            Ok(0) => break,
            Ok(k) => got += k as u64,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// Writes `n` bytes from a repeating buffer.
pub(crate) fn write_n(s: &mut TcpStream, buf: &[u8], n: u64) -> io::Result<()> {
    let mut left = n;
    while left > 0 {
        let k = (left as usize).min(buf.len());
        s.write_all(&buf[..k])?;
        left -= k as u64;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::Size;
    use crate::script::{Segment, Step};

    fn udp_script(segments: Vec<Segment>) -> ConnScript {
        ConnScript { segments, seeded: false, nodelay: false, udp: true, reverse: false, pause: Duration::ZERO }
    }

    fn answers(u: &UdpSocket) -> usize {
        u.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
        let mut buf = [0u8; 2048];
        let mut n = 0;
        while u.recv(&mut buf).is_ok() {
            n += 1;
        }
        n
    }

    /// Whatever script it is given (derive refuses these), one datagram in never makes more
    /// than MAX_ANSWERS datagrams out, and none once the run has closed.
    #[test]
    fn one_datagram_gets_at_most_max_answers() {
        let server = UdpSocket::bind("127.0.0.1:0").unwrap();
        let client = UdpSocket::bind("127.0.0.1:0").unwrap();
        let to = client.local_addr().unwrap();
        let run = RunShared::new(to.ip());
        let endless = udp_script(vec![Segment {
            times: Times::Count(u64::MAX),
            steps: vec![Step { io: Io::Read(Size::Fixed(1000)), count: u64::MAX, line: 1 }],
            counts: true,
        }]);
        let mut p =
            Peer { seg: 0, step: 0, rep: 0, pass: 0, rng: Rng::new(0), awaiting_seed: false, heard: Instant::now() };
        assert!(feed(&mut p, &endless, &server, to, 1, &run));
        assert_eq!(answers(&client), MAX_ANSWERS as usize);
        assert!(feed(&mut p, &endless, &server, to, 1, &run));
        assert_eq!(answers(&client), MAX_ANSWERS as usize, "each datagram gets its own, no more");
        assert_eq!(run.held_back.load(Ordering::Relaxed), 2);
        run.close();
        assert!(feed(&mut p, &endless, &server, to, 1, &run));
        assert_eq!(answers(&client), 0, "a closed run sends nothing");

        // Request-response with a count: each request gets exactly its answers.
        let rr = udp_script(vec![Segment {
            times: Times::Timed,
            steps: vec![
                Step { io: Io::Write(Size::Fixed(10)), count: 1, line: 1 },
                Step { io: Io::Read(Size::Fixed(100)), count: 3, line: 2 },
            ],
            counts: true,
        }]);
        let run = RunShared::new(to.ip());
        let mut p =
            Peer { seg: 0, step: 0, rep: 0, pass: 0, rng: Rng::new(0), awaiting_seed: false, heard: Instant::now() };
        for _ in 0..3 {
            assert!(feed(&mut p, &rr, &server, to, 10, &run));
            assert_eq!(answers(&client), 3);
        }
        assert_eq!(run.c.transactions.load(Ordering::Relaxed), 3);
        assert!(feed(&mut p, &rr, &server, to, 0, &run), "an empty datagram ends the timed loop");
        assert!(!feed(&mut p, &rr, &server, to, 0, &run), "and a second one says goodbye");
        assert_eq!(run.held_back.load(Ordering::Relaxed), 0);
    }
}

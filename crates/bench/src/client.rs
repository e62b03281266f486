//! `sluice bench run`: drives a profile against a server and measures it.
//!
//! One thread per connection of each group runs the group's transactions literally; the
//! server mirrors them. All threads start together behind a barrier; the run's time is from
//! that start until the last thread has finished (including the short drain of
//! server-driven timed loops, whose iterations are counted, so rates and counts agree).

use std::io::{self, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use crate::control::{Channel, ClientMsg, PROTOCOL, ServerMsg, boot_id};
use crate::profile::{FlowOp, FlowOpKind, Group, Profile, Repeat, Transaction};
use crate::result::{FlowOpStat, RunResult, SideCounts};
use crate::script::{ConnScript, Rng, derive_all, is_io, opens};
use crate::server::{read_n, write_n};
use crate::sys::{size_backlog, wait_readable};

/// Why a run could not be done.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// The server cannot be reached.
    #[error("cannot reach the bench server at {addr}: {cause}; start it there with `sluice bench serve`")]
    Connect {
        /// Where we tried.
        addr: String,
        /// Why it failed (part of the message, not a separate cause, so chains print it once).
        cause: io::Error,
    },
    /// The server's host name does not resolve to an address.
    #[error(
        "the bench server's name {addr} does not resolve ({cause}): check the name, or give the server's address (e.g. --to 10.77.0.2)"
    )]
    Resolve {
        /// The name (HOST:PORT) as given.
        addr: String,
        /// The resolver's answer (part of the message, as in `Connect`).
        cause: io::Error,
    },
    /// The server refused or failed the request.
    #[error("the bench server refused: {0}")]
    Server(String),
    /// The profile cannot be run.
    #[error("{0}")]
    Profile(String),
    /// The run failed part-way.
    #[error("{what}: {cause}")]
    Io {
        /// What we were doing.
        what: String,
        /// The error (part of the message, as for `Connect`).
        cause: io::Error,
    },
}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> BenchError {
    let what = what.into();
    move |source| BenchError::Io { what, cause: source }
}

/// Called with (elapsed seconds, transactions so far, bytes so far) for interval lines.
pub type IntervalFn = Arc<dyn Fn(f64, u64, u64) + Send + Sync>;

/// How to run.
#[derive(Clone)]
pub struct RunOptions {
    /// The server's control address (host:port).
    pub server: String,
    /// Processes whose CPU counts as guest besides this one (e.g. a local server).
    pub guest_pids: Vec<u32>,
    /// The switch daemon on the path, for the switch CPU column.
    pub switch_pid: Option<u32>,
    /// Called every `interval` with (elapsed s, transactions so far, bytes so far).
    pub interval: Option<(Duration, IntervalFn)>,
}

/// How long a bench server has to answer hello.
const HELLO_WAIT: Duration = Duration::from_secs(5);

/// An open control connection to a bench server that has said hello.
pub(crate) struct Session {
    /// The control channel.
    pub ch: Channel,
    /// The server's process id.
    pub pid: u32,
    /// The server runs on this host (its CPU is visible in /proc here).
    pub same_host: bool,
    /// Our end of the control connection: the address the server sees us by.
    pub local: SocketAddr,
}

impl Session {
    /// Connects to the server at `addr` and checks protocol versions.
    pub fn open(addr: SocketAddr) -> Result<Session, BenchError> {
        let ctrl = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
            .map_err(|source| BenchError::Connect { addr: addr.to_string(), cause: source })?;
        let local = ctrl.local_addr().map_err(io_err("control connection"))?;
        // A bench server answers hello at once; anything else listening there (uperf's
        // server uses port 20000 too) may never answer, or answer in its own protocol.
        ctrl.set_read_timeout(Some(HELLO_WAIT)).map_err(io_err("control connection"))?;
        let not_ours = |what: &str| {
            BenchError::Server(format!(
                "{addr} answered but is not a sluice bench server ({what}; uperf's server uses port {} too): \
                 start `sluice bench serve` there, or use --to HOST:PORT for the port it listens on",
                crate::control::DEFAULT_PORT
            ))
        };
        let mut ch = Channel::new(ctrl.try_clone().map_err(io_err("control connection"))?)
            .map_err(io_err("control connection"))?;
        ch.send(&ClientMsg::Hello { protocol: PROTOCOL, version: env!("CARGO_PKG_VERSION").into() })
            .map_err(io_err("control connection"))?;
        let hello = match ch.recv::<ServerMsg>() {
            Ok(m) => m,
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                return Err(not_ours(&format!("no answer to hello within {} s", HELLO_WAIT.as_secs())));
            }
            Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                return Err(not_ours("its answer to hello is not the bench protocol"));
            }
            Err(e) => return Err(io_err("control connection")(e)),
        };
        ctrl.set_read_timeout(None).map_err(io_err("control connection"))?;
        match hello {
            Some(ServerMsg::Hello { protocol: PROTOCOL, pid, boot_id: b, .. }) => {
                Ok(Session { ch, pid, same_host: b == boot_id(), local })
            }
            Some(ServerMsg::Hello { protocol, version, .. }) => Err(BenchError::Server(format!(
                "{addr} speaks bench protocol {protocol} (sluice {version}) and this client {PROTOCOL} (sluice {}): run the same sluice version on both ends",
                env!("CARGO_PKG_VERSION")
            ))),
            Some(ServerMsg::Error { message }) => Err(BenchError::Server(message)),
            _ => Err(BenchError::Server(format!("{addr} did not answer hello; is that port a sluice bench server?"))),
        }
    }

    /// Asks for a run of `profile_xml`; returns its data ports (one per group).
    pub fn start(&mut self, profile_xml: &str, groups: usize) -> Result<Vec<u16>, BenchError> {
        self.ch.send(&ClientMsg::Run { profile_xml: profile_xml.into() }).map_err(io_err("control connection"))?;
        match self.ch.recv::<ServerMsg>().map_err(io_err("control connection"))? {
            Some(ServerMsg::Ready { ports }) if ports.len() == groups => Ok(ports),
            Some(ServerMsg::Error { message }) => Err(BenchError::Server(message)),
            other => Err(BenchError::Server(format!("unexpected answer to run: {other:?}"))),
        }
    }

    /// Ends the run and returns the server's counts and CPU seconds.
    pub fn finish(&mut self) -> Result<(SideCounts, f64), BenchError> {
        self.ch.send(&ClientMsg::Done).map_err(io_err("control connection"))?;
        match self.ch.recv::<ServerMsg>().map_err(io_err("control connection"))? {
            Some(ServerMsg::Counts { counts, cpu_s }) => Ok((counts, cpu_s)),
            Some(ServerMsg::Error { message }) => Err(BenchError::Server(message)),
            other => Err(BenchError::Server(format!("unexpected answer to done: {other:?}"))),
        }
    }
}

#[derive(Default)]
struct Shared {
    transactions: AtomicU64,
    bytes: AtomicU64,
    failed: Mutex<Option<String>>,
}

#[derive(Default)]
struct ThreadStats {
    counts: SideCounts,
    latency: Option<Histogram<u64>>,
    /// (flowop label, count, total ns) in flowop order.
    flowops: Vec<(String, u64, u128)>,
}

/// The first address of `server` (HOST:PORT): a name that does not resolve is said to be
/// one, not taken for a server that is not running.
pub fn resolve(server: &str) -> Result<SocketAddr, BenchError> {
    let resolve = |cause| BenchError::Resolve { addr: server.to_string(), cause };
    server.to_socket_addrs().map_err(resolve)?.next().ok_or_else(|| resolve(io::Error::other("no address")))
}

/// Runs `profile` against the server and returns what it measured.
pub fn run(profile: &Profile, opts: &RunOptions) -> Result<RunResult, BenchError> {
    let scripts: Vec<ConnScript> = derive_all(profile).map_err(|e| BenchError::Profile(e.to_string()))?;
    let addr = resolve(&opts.server)?;
    let mut srv = Session::open(addr)?;
    let ports = srv.start(&profile.to_xml(), profile.groups.len())?;
    let (server_pid, same_host) = (srv.pid, srv.same_host);
    let backs: Vec<Option<Arc<TcpListener>>> = profile
        .groups
        .iter()
        .zip(&scripts)
        .map(|(g, script)| script.reverse.then(|| back_listener(g, srv.local).map(Arc::new)).transpose())
        .collect::<Result<_, _>>()?;

    let nthreads: usize = profile.groups.iter().map(|g| g.count as usize).sum();
    let barrier = Arc::new(Barrier::new(nthreads + 1));
    let shared = Arc::new(Shared::default());
    let mut handles = Vec::with_capacity(nthreads);
    for (((g, script), port), back) in profile.groups.iter().zip(&scripts).zip(&ports).zip(&backs) {
        let data = SocketAddr::new(addr.ip(), *port);
        for _ in 0..g.count {
            let (g, script, barrier, shared) = (g.clone(), script.clone(), barrier.clone(), shared.clone());
            let mut link = Link { data, back: back.clone(), bell: None };
            let h = std::thread::Builder::new()
                .stack_size(256 * 1024)
                .spawn(move || {
                    barrier.wait();
                    let r = run_thread(&g, &script, &mut link, &shared);
                    if let Err(e) = &r {
                        shared.failed.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert_with(|| e.to_string());
                    }
                    r.unwrap_or_default()
                })
                .map_err(io_err("starting a client thread"))?;
            handles.push(h);
        }
    }

    let mut guests = vec![std::process::id()];
    guests.extend(opts.guest_pids.iter().copied());
    if same_host {
        guests.push(server_pid);
    }
    guests.sort_unstable();
    guests.dedup();
    let cpu0 = crate::cpu::sample(&guests, opts.switch_pid).ok();
    // The clock starts with the CPU sample, before the barrier lets the threads go: with
    // hundreds of threads released at once onto 2 CPUs this thread may not run again for
    // seconds after the barrier, and a clock started then missed that much of the run
    // (a 250-connection stream measured 20.5 s of a 33-s run, with 33 s of CPU).
    let start = Instant::now();
    barrier.wait();
    let done = Arc::new(AtomicBool::new(false));
    let ticker = opts.interval.clone().map(|(every, f)| {
        let (shared, done) = (shared.clone(), done.clone());
        std::thread::spawn(move || {
            let mut next = start + every;
            while !done.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(20));
                if Instant::now() >= next {
                    f(
                        start.elapsed().as_secs_f64(),
                        shared.transactions.load(Ordering::Relaxed),
                        shared.bytes.load(Ordering::Relaxed),
                    );
                    next += every;
                }
            }
        })
    });
    let stats: Vec<ThreadStats> = handles.into_iter().map(|h| h.join().unwrap_or_default()).collect();
    let duration_s = start.elapsed().as_secs_f64();
    let cpu1 = crate::cpu::sample(&guests, opts.switch_pid).ok();
    done.store(true, Ordering::Relaxed);
    if let Some(t) = ticker {
        let _ = t.join();
    }
    if let Some(why) = shared.failed.lock().unwrap_or_else(|p| p.into_inner()).take() {
        let _ = srv.finish();
        return Err(BenchError::Io { what: "a data connection failed".into(), cause: io::Error::other(why) });
    }
    let (server, server_cpu) = srv.finish()?;

    let mut cpu = match (cpu0, cpu1) {
        (Some(a), Some(b)) => crate::cpu::split(&a, &b),
        _ => Default::default(),
    };
    if !same_host {
        // The server's host is not ours: its CPU is what it reported, and ours holds none.
        cpu.guest_s += server_cpu;
    }
    Ok(merge(profile, duration_s, stats, server, cpu))
}

fn merge(
    profile: &Profile,
    duration_s: f64,
    stats: Vec<ThreadStats>,
    server: SideCounts,
    cpu: crate::result::CpuSplit,
) -> RunResult {
    let mut client = SideCounts::default();
    let mut hist: Option<Histogram<u64>> = None;
    let mut flowops: Vec<(String, u64, u128)> = Vec::new();
    for s in stats {
        client.transactions += s.counts.transactions;
        client.bytes_sent += s.counts.bytes_sent;
        client.bytes_received += s.counts.bytes_received;
        client.connections += s.counts.connections;
        if let Some(h) = s.latency {
            match hist.as_mut() {
                Some(acc) => {
                    let _ = acc.add(&h);
                }
                None => hist = Some(h),
            }
        }
        for (label, n, ns) in s.flowops {
            match flowops.iter_mut().find(|f| f.0 == label) {
                Some(f) => {
                    f.1 += n;
                    f.2 += ns;
                }
                None => flowops.push((label, n, ns)),
            }
        }
    }
    RunResult {
        profile: profile.name.clone(),
        conns: profile.conns(),
        duration_s,
        client,
        server,
        latency: hist.as_ref().map(crate::report::latency_from_histogram).unwrap_or_default(),
        flowops: flowops
            .into_iter()
            .map(|(flowop, count, ns)| FlowOpStat {
                flowop,
                count,
                mean_us: if count > 0 { ns as f64 / count as f64 / 1e3 } else { 0.0 },
            })
            .collect(),
        cpu,
        completion: None,
    }
}

/// Where a client thread's connections come from.
struct Link {
    /// The server's data port for the group: `connect` goes here; for a reverse group
    /// the thread's doorbell does.
    data: SocketAddr,
    /// A reverse group's listener, which the server connects back to.
    back: Option<Arc<TcpListener>>,
    /// A reverse group's doorbell: one byte on it asks the server for one connection.
    bell: Option<TcpStream>,
}

/// How long an `accept` waits for the server to connect back.
const ACCEPT_WAIT: Duration = Duration::from_secs(10);

/// Opens the listener of a reverse group on the address the server knows us by, on the
/// port its `accept` names (or any). Shared by the group's threads; non-blocking, so an
/// accept can wait with a limit.
fn back_listener(g: &Group, local: SocketAddr) -> Result<TcpListener, BenchError> {
    let port = g.port_of(FlowOpKind::Accept).unwrap_or(0);
    let l = TcpListener::bind(SocketAddr::new(local.ip(), port)).map_err(|source| BenchError::Io {
        what: format!("opening the listener for accept on {}:{port}", local.ip()),
        cause: source,
    })?;
    // Every thread of the group may have one connection pending at once.
    size_backlog(&l, g.count).map_err(io_err("sizing the accept backlog"))?;
    l.set_nonblocking(true).map_err(io_err("opening the listener for accept"))?;
    Ok(l)
}

/// Accepts one connection on a shared non-blocking listener, waiting at most `limit`.
fn accept_within(l: &TcpListener, limit: Duration) -> io::Result<TcpStream> {
    let deadline = Instant::now() + limit;
    loop {
        match l.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(false)?;
                return Ok(s);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!(
                            "the server did not connect back to port {} within {} s; a firewall between the server and this host may refuse it",
                            l.local_addr().map(|a| a.port()).unwrap_or(0),
                            limit.as_secs()
                        ),
                    ));
                }
                wait_readable(l.as_raw_fd(), left)?;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

enum Sock {
    Tcp(TcpStream),
    Udp(UdpSocket),
}

struct Conn {
    s: Sock,
    rng: Rng,
}

/// How long the end of a server-driven stream may take to arrive.
const DRAIN_LIMIT: Duration = Duration::from_secs(15);

/// How long a UDP read waits for its datagram before the run fails as lossy.
const UDP_WAIT: Duration = Duration::from_secs(2);

impl Conn {
    fn open(addr: SocketAddr, script: &ConnScript) -> Result<Conn, BenchError> {
        let s = if script.udp {
            let local: SocketAddr =
                if addr.is_ipv4() { "0.0.0.0:0".parse() } else { "[::]:0".parse() }.expect("literal");
            let u = UdpSocket::bind(local).map_err(io_err("opening a UDP socket"))?;
            u.connect(addr).map_err(|source| BenchError::Connect { addr: addr.to_string(), cause: source })?;
            u.set_read_timeout(Some(UDP_WAIT)).map_err(io_err("setting a UDP timeout"))?;
            Sock::Udp(u)
        } else {
            let t = TcpStream::connect_timeout(&addr, Duration::from_secs(10))
                .map_err(|source| BenchError::Connect { addr: addr.to_string(), cause: source })?;
            t.set_nodelay(script.nodelay).map_err(io_err("setting TCP_NODELAY"))?;
            Sock::Tcp(t)
        };
        Conn::opened(s, script)
    }

    /// A client-side `accept`: rings the doorbell (opening it on first use, with the
    /// listener's port) and takes the connection the server makes back.
    fn accept(link: &mut Link, script: &ConnScript) -> Result<Conn, BenchError> {
        let back = link.back.as_ref().ok_or_else(|| BenchError::Profile("accept in a group that connects".into()))?;
        if link.bell.is_none() {
            let mut b = TcpStream::connect_timeout(&link.data, Duration::from_secs(10))
                .map_err(|source| BenchError::Connect { addr: link.data.to_string(), cause: source })?;
            let port = back.local_addr().map_err(io_err("reading the accept listener's port"))?.port();
            b.set_nodelay(true).map_err(io_err("setting TCP_NODELAY"))?;
            b.write_all(&port.to_le_bytes()).map_err(io_err("asking the server to connect back"))?;
            link.bell = Some(b);
        }
        if let Some(b) = link.bell.as_mut() {
            b.write_all(&[1]).map_err(io_err("asking the server to connect back"))?;
        }
        let t = accept_within(back, ACCEPT_WAIT).map_err(io_err("accept"))?;
        t.set_nodelay(script.nodelay).map_err(io_err("setting TCP_NODELAY"))?;
        Conn::opened(Sock::Tcp(t), script)
    }

    /// A newly opened connection: sends the seed first if the group draws sizes.
    fn opened(s: Sock, script: &ConnScript) -> Result<Conn, BenchError> {
        let mut c = Conn { s, rng: Rng::new(0) };
        if script.seeded {
            let seed = seed();
            c.send_raw(&seed.to_le_bytes()).map_err(io_err("sending the connection's seed"))?;
            c.rng = Rng::new(seed);
        }
        Ok(c)
    }

    fn send_raw(&mut self, b: &[u8]) -> io::Result<()> {
        match &mut self.s {
            Sock::Tcp(t) => t.write_all(b),
            Sock::Udp(u) => u.send(b).map(|_| ()),
        }
    }

    /// Writes `n` bytes (one datagram for UDP).
    fn write(&mut self, out: &[u8], n: u64) -> io::Result<()> {
        match &mut self.s {
            Sock::Tcp(t) => write_n(t, out, n),
            Sock::Udp(u) => u.send(&out[..(n as usize).min(out.len())]).map(|_| ()),
        }
    }

    /// Reads `n` bytes (TCP, fewer only at end of stream) or one datagram (UDP).
    fn read(&mut self, inp: &mut [u8], n: u64) -> io::Result<u64> {
        match &mut self.s {
            Sock::Tcp(t) => read_n(t, inp, n),
            Sock::Udp(u) => match u.recv(inp) {
                Ok(k) => Ok(k as u64),
                Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                    Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!(
                            "no UDP datagram within {} s: datagrams are being lost (UDP has no retransmission)",
                            UDP_WAIT.as_secs()
                        ),
                    ))
                }
                Err(e) => Err(e),
            },
        }
    }

    /// Makes TCP reads give up at `deadline` (WouldBlock).
    fn limit_reads(&mut self, deadline: Instant) -> io::Result<()> {
        match &mut self.s {
            Sock::Tcp(t) => {
                let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
                t.set_read_timeout(Some(left))
            }
            Sock::Udp(_) => Ok(()),
        }
    }

    /// Tells the server a timed loop is over: half-close (TCP) or an empty datagram (UDP).
    fn end_loop(&mut self) -> io::Result<()> {
        match &mut self.s {
            Sock::Tcp(t) => t.shutdown(std::net::Shutdown::Write),
            Sock::Udp(u) => u.send(&[]).map(|_| ()),
        }
    }
}

/// Closing a UDP "connection" says goodbye with an empty datagram, wherever it happens
/// (disconnect, a new connect, or the end of the thread's program).
impl Drop for Conn {
    fn drop(&mut self) {
        if let Sock::Udp(u) = &self.s {
            let _ = u.send(&[]);
        }
    }
}

/// Runs one thread's copy of a group's transactions.
fn run_thread(g: &Group, script: &ConnScript, link: &mut Link, shared: &Shared) -> Result<ThreadStats, BenchError> {
    let mut st =
        ThreadStats { latency: Histogram::new_with_bounds(1, 3_600_000_000_000, 3).ok(), ..ThreadStats::default() };
    let mut conn: Option<Conn> = None;
    let out = crate::buf::IoBuf::filled(256 * 1024, 0xa5);
    let out = out.as_slice();
    let mut inp = crate::buf::IoBuf::new(256 * 1024);
    let inp = inp.as_mut_slice();
    let labels: Vec<Vec<usize>> = g
        .transactions
        .iter()
        .map(|t| {
            t.flowops
                .iter()
                .map(|f| {
                    let label = f.to_string();
                    match st.flowops.iter().position(|x| x.0 == label) {
                        Some(i) => i,
                        None => {
                            st.flowops.push((label, 0, 0));
                            st.flowops.len() - 1
                        }
                    }
                })
                .collect()
        })
        .collect();

    for (ti, t) in g.transactions.iter().enumerate() {
        let has_io = t.flowops.iter().any(|f| is_io(f.kind));
        let opens_or_closes = t.flowops.iter().any(|f| opens(f.kind) || f.kind == FlowOpKind::Disconnect);
        let start = Instant::now();
        let pace = t.rate.filter(|r| *r > 0.0).map(|r| Duration::from_secs_f64(1.0 / r));
        let mut i = 0u64;
        loop {
            match t.repeat {
                Repeat::Iterations(n) if i >= n => break,
                Repeat::Duration(d) if start.elapsed() >= d => break,
                _ => {}
            }
            if let Some(p) = pace {
                let due = start + p.mul_f64(i as f64);
                if let Some(wait) = due.checked_duration_since(Instant::now()) {
                    std::thread::sleep(wait);
                }
            }
            let t0 = Instant::now();
            for (fi, f) in t.flowops.iter().enumerate() {
                let f0 = Instant::now();
                step(f, script, link, &mut conn, &mut st.counts, shared, out, inp)?;
                let e = &mut st.flowops[labels[ti][fi]];
                e.1 += 1;
                e.2 += f0.elapsed().as_nanos();
            }
            if has_io {
                st.counts.transactions += 1;
                shared.transactions.fetch_add(1, Ordering::Relaxed);
                if let Some(h) = st.latency.as_mut() {
                    let _ = h.record((t0.elapsed().as_nanos() as u64).max(1));
                }
            }
            i += 1;
        }
        if matches!(t.repeat, Repeat::Duration(_)) && !opens_or_closes && has_io && conn.is_some() {
            finish_timed(t, script, &mut conn, &mut st.counts, shared, out, inp)?;
        }
    }
    Ok(st)
}

/// Ends a timed loop on an open connection: half-close so the server stops, then (if the
/// server sends first) read the iterations it had already started until end-of-file.
fn finish_timed(
    t: &Transaction,
    script: &ConnScript,
    conn: &mut Option<Conn>,
    counts: &mut SideCounts,
    shared: &Shared,
    out: &[u8],
    inp: &mut [u8],
) -> Result<(), BenchError> {
    let Some(c) = conn.as_mut() else { return Ok(()) };
    c.end_loop().map_err(io_err("ending a timed loop on a data connection"))?;
    let server_driven =
        t.flowops.iter().find(|f| is_io(f.kind)).is_some_and(|f| matches!(f.kind, FlowOpKind::Read | FlowOpKind::Recv));
    if !server_driven {
        return Ok(());
    }
    let _ = (script, out);
    // Bounded: on a path losing most of its packets TCP may take minutes to deliver what
    // the server had queued; the run fails saying so rather than hang.
    let deadline = Instant::now() + DRAIN_LIMIT;
    // Only reads remain in a server-driven timed loop (script::derive checked it).
    'drain: loop {
        for (k, f) in t.flowops.iter().enumerate() {
            if !matches!(f.kind, FlowOpKind::Read | FlowOpKind::Recv) {
                continue;
            }
            for rep in 0..f.count.max(1) {
                let size = f.size.clone().unwrap_or(crate::profile::Size::Fixed(0));
                let n = c.rng.size(&size);
                c.limit_reads(deadline).map_err(io_err("draining a data connection"))?;
                let got = c.read(inp, n).map_err(|e| {
                    if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) {
                        BenchError::Io {
                            what: "draining a data connection".into(),
                            cause: io::Error::new(
                                e.kind(),
                                format!(
                                    "the server was still sending {} s after the end of the run; \
                                     the path is losing packets heavily (see its drop counters)",
                                    DRAIN_LIMIT.as_secs()
                                ),
                            ),
                        }
                    } else {
                        io_err("draining a data connection")(e)
                    }
                })?;
                counts.bytes_received += got;
                shared.bytes.fetch_add(got, Ordering::Relaxed);
                if got < n {
                    if k == 0 && rep == 0 && got == 0 {
                        break 'drain;
                    }
                    return Err(BenchError::Io {
                        what: "draining a data connection".into(),
                        cause: io::Error::new(io::ErrorKind::UnexpectedEof, "the server closed mid-transaction"),
                    });
                }
            }
        }
        counts.transactions += 1;
        shared.transactions.fetch_add(1, Ordering::Relaxed);
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn step(
    f: &FlowOp,
    script: &ConnScript,
    link: &mut Link,
    conn: &mut Option<Conn>,
    counts: &mut SideCounts,
    shared: &Shared,
    out: &[u8],
    inp: &mut [u8],
) -> Result<(), BenchError> {
    for _ in 0..f.count.max(1) {
        match f.kind {
            FlowOpKind::Connect => {
                drop(conn.take());
                *conn = Some(Conn::open(link.data, script)?);
                counts.connections += 1;
            }
            FlowOpKind::Accept => {
                drop(conn.take());
                *conn = Some(Conn::accept(link, script)?);
                counts.connections += 1;
            }
            FlowOpKind::Disconnect => drop(conn.take()),
            FlowOpKind::Write | FlowOpKind::Send => {
                let c = conn.as_mut().ok_or_else(|| BenchError::Profile("write without a connection".into()))?;
                let n = c.rng.size(f.size.as_ref().unwrap_or(&crate::profile::Size::Fixed(0)));
                c.write(out, n).map_err(|source| BenchError::Io { what: f.to_string(), cause: source })?;
                counts.bytes_sent += n;
                shared.bytes.fetch_add(n, Ordering::Relaxed);
            }
            FlowOpKind::Read | FlowOpKind::Recv => {
                let c = conn.as_mut().ok_or_else(|| BenchError::Profile("read without a connection".into()))?;
                let n = c.rng.size(f.size.as_ref().unwrap_or(&crate::profile::Size::Fixed(0)));
                let got = c.read(inp, n).map_err(|source| BenchError::Io { what: f.to_string(), cause: source })?;
                counts.bytes_received += got;
                shared.bytes.fetch_add(got, Ordering::Relaxed);
                if got < n && !script.udp {
                    return Err(BenchError::Io {
                        what: format!("{f}"),
                        cause: io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            "the server closed the connection mid-transaction",
                        ),
                    });
                }
            }
            FlowOpKind::Think => std::thread::sleep(f.think.unwrap_or_default()),
            FlowOpKind::Nop => {}
        }
    }
    Ok(())
}

/// A per-connection seed: time and thread mixed, no global state.
fn seed() -> u64 {
    let t =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0);
    let id = format!("{:?}", std::thread::current().id());
    let mut r = Rng::new(t ^ id.bytes().fold(0u64, |a, b| a.wrapping_mul(31).wrapping_add(u64::from(b))));
    r.next_u64()
}

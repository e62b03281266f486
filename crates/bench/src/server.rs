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

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use crate::control::{Channel, ClientMsg, PROTOCOL, ServerMsg, boot_id};
use crate::profile::FlowOpKind;
use crate::profile::parse;
use crate::result::SideCounts;
use crate::script::{ConnScript, Io, Rng, Times, derive};

/// What the server counts, shared by its connection threads.
#[derive(Default)]
struct Counters {
    transactions: AtomicU64,
    bytes_sent: AtomicU64,
    bytes_received: AtomicU64,
    connections: AtomicU64,
    active: Mutex<u64>,
    idle: Condvar,
}

impl Counters {
    fn snapshot(&self) -> SideCounts {
        SideCounts {
            transactions: self.transactions.load(Ordering::Relaxed),
            bytes_sent: self.bytes_sent.load(Ordering::Relaxed),
            bytes_received: self.bytes_received.load(Ordering::Relaxed),
            connections: self.connections.load(Ordering::Relaxed),
        }
    }
}

/// Serves runs on `listener` until the process ends. `log` receives one line per event.
pub fn serve(listener: TcpListener, log: Arc<dyn Fn(String) + Send + Sync>) -> io::Result<()> {
    let busy = Arc::new(Mutex::new(()));
    for conn in listener.incoming() {
        let stream = match conn {
            Ok(s) => s,
            Err(e) => {
                log(format!("accept failed: {e}"));
                continue;
            }
        };
        let (busy, log) = (busy.clone(), log.clone());
        std::thread::spawn(move || {
            let peer = stream.peer_addr().map(|a| a.to_string()).unwrap_or_default();
            if let Err(e) = control(stream, &busy, &*log) {
                log(format!("client {peer}: {e}"));
            }
        });
    }
    Ok(())
}

fn control(stream: TcpStream, busy: &Mutex<()>, log: &dyn Fn(String)) -> io::Result<()> {
    let peer = stream.peer_addr()?;
    let local = stream.local_addr()?;
    let mut ch = Channel::new(stream)?;
    match ch.recv::<ClientMsg>()? {
        Some(ClientMsg::Hello { protocol, version }) if protocol == PROTOCOL => {
            ch.send(&ServerMsg::Hello {
                protocol: PROTOCOL,
                version: env!("CARGO_PKG_VERSION").into(),
                pid: std::process::id(),
                boot_id: boot_id(),
            })?;
            log(format!("client {peer} (sluice {version}) connected"));
        }
        Some(ClientMsg::Hello { protocol, version }) => {
            let message = format!(
                "this server speaks bench protocol {PROTOCOL} (sluice {}) and the client {protocol} (sluice {version}): run the same sluice version on both ends",
                env!("CARGO_PKG_VERSION")
            );
            ch.send(&ServerMsg::Error { message: message.clone() })?;
            return Err(io::Error::other(message));
        }
        _ => return Err(io::Error::other("the client did not start with hello")),
    }
    // The previous client's control thread may still be closing: wait a little before
    // calling the server busy.
    let mut guard = busy.try_lock().ok();
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    while guard.is_none() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
        guard = busy.try_lock().ok();
    }
    let Some(_guard) = guard else {
        let message = "the server is busy with another client's run; try again when it has finished".to_string();
        ch.send(&ServerMsg::Error { message: message.clone() })?;
        return Err(io::Error::other(message));
    };
    while let Some(msg) = ch.recv::<ClientMsg>()? {
        let ClientMsg::Run { profile_xml } = msg else {
            ch.send(&ServerMsg::Error { message: "expected a run request".into() })?;
            continue;
        };
        match prepare(&profile_xml, local) {
            Err(message) => ch.send(&ServerMsg::Error { message })?,
            Ok(run) => {
                ch.send(&ServerMsg::Ready { ports: run.ports.clone() })?;
                let cpu0 = crate::cpu::self_seconds().unwrap_or(0.0);
                match ch.recv::<ClientMsg>()? {
                    Some(ClientMsg::Done) => {}
                    _ => {
                        run.stop();
                        return Err(io::Error::other("the client went away during a run"));
                    }
                }
                let counts = run.finish(Duration::from_secs(30));
                let cpu_s = (crate::cpu::self_seconds().unwrap_or(0.0) - cpu0).max(0.0);
                log(format!(
                    "run done: {} transactions, {} bytes in, {} bytes out, {} connections",
                    counts.transactions, counts.bytes_received, counts.bytes_sent, counts.connections
                ));
                ch.send(&ServerMsg::Counts { counts, cpu_s })?;
            }
        }
    }
    Ok(())
}

struct Run {
    ports: Vec<u16>,
    addrs: Vec<SocketAddr>,
    stop: Arc<AtomicBool>,
    counters: Arc<Counters>,
}

impl Run {
    fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        for a in &self.addrs {
            // Wake the acceptor blocked in accept().
            let _ = TcpStream::connect_timeout(a, Duration::from_secs(1));
        }
    }

    /// Stops accepting and waits (up to `limit`) for every connection to finish.
    fn finish(&self, limit: Duration) -> SideCounts {
        self.stop();
        let c = &self.counters;
        let active = c.active.lock().unwrap_or_else(|p| p.into_inner());
        let _ = c.idle.wait_timeout_while(active, limit, |n| *n > 0);
        c.snapshot()
    }
}

fn prepare(xml: &str, local: SocketAddr) -> Result<Run, String> {
    let profile = parse(xml, "profile sent by the client", &|_| None).map_err(|e| e.to_string())?;
    let stop = Arc::new(AtomicBool::new(false));
    let counters = Arc::new(Counters::default());
    let (mut ports, mut addrs) = (Vec::new(), Vec::new());
    for g in &profile.groups {
        let script = Arc::new(derive(g).map_err(|e| e.to_string())?);
        // A connect's `port=` names the data port; otherwise the server picks one.
        let port = g.port_of(FlowOpKind::Connect).unwrap_or(0);
        let (stop, counters) = (stop.clone(), counters.clone());
        if script.udp {
            let u = UdpSocket::bind(SocketAddr::new(local.ip(), port))
                .map_err(|e| format!("cannot open a UDP data socket: {e}"))?;
            ports.push(u.local_addr().map_err(|e| e.to_string())?.port());
            std::thread::spawn(move || udp_loop(u, &script, &stop, &counters));
            continue;
        }
        let l = TcpListener::bind(SocketAddr::new(local.ip(), port))
            .map_err(|e| format!("cannot open a data listener on port {port}: {e}"))?;
        // Every client thread may connect at once: a backlog of the default 128 would
        // drop SYNs at 250 connections and stall their connects for a second.
        size_backlog(&l, g.count).map_err(|e| format!("cannot size the data listener's backlog: {e}"))?;
        let addr = l.local_addr().map_err(|e| e.to_string())?;
        ports.push(addr.port());
        addrs.push(addr);
        std::thread::spawn(move || accept_loop(l, script, stop, counters));
    }
    Ok(Run { ports, addrs, stop, counters })
}

fn accept_loop(l: TcpListener, script: Arc<ConnScript>, stop: Arc<AtomicBool>, c: Arc<Counters>) {
    for conn in l.incoming() {
        if stop.load(Ordering::SeqCst) {
            break;
        }
        let Ok(s) = conn else { continue };
        if !script.reverse {
            c.connections.fetch_add(1, Ordering::Relaxed);
        }
        *c.active.lock().unwrap_or_else(|p| p.into_inner()) += 1;
        let (script, c) = (script.clone(), c.clone());
        std::thread::spawn(move || {
            let _ = if script.reverse { connect_back(s, &script, &c) } else { mirror(s, &script, &c) };
            let mut n = c.active.lock().unwrap_or_else(|p| p.into_inner());
            *n -= 1;
            if *n == 0 {
                c.idle.notify_all();
            }
        });
    }
}

/// Where one UDP peer is in its connection script.
struct Peer {
    seg: usize,
    step: usize,
    pass: u64,
    rng: Rng,
    awaiting_seed: bool,
}

fn add_active(c: &Counters, delta: i64) {
    let mut n = c.active.lock().unwrap_or_else(|p| p.into_inner());
    *n = n.saturating_add_signed(delta);
    if *n == 0 {
        c.idle.notify_all();
    }
}

/// Serves a UDP group: every datagram is fed to its sender's script. A zero-length
/// datagram ends a timed loop, or the connection when no timed loop is running.
fn udp_loop(u: UdpSocket, script: &ConnScript, stop: &AtomicBool, c: &Counters) {
    let _ = u.set_read_timeout(Some(Duration::from_millis(100)));
    let mut peers: HashMap<SocketAddr, Peer> = HashMap::new();
    let mut buf = crate::buf::IoBuf::new(65_536);
    let buf = buf.as_mut_slice();
    let out = crate::buf::IoBuf::filled(65_536, 0x5a);
    let out = out.as_slice();
    loop {
        let (n, from) = match u.recv_from(buf) {
            Ok(x) => x,
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                if stop.load(Ordering::SeqCst) && peers.is_empty() {
                    return;
                }
                continue;
            }
            Err(_) => continue,
        };
        let p = peers.entry(from).or_insert_with(|| {
            c.connections.fetch_add(1, Ordering::Relaxed);
            add_active(c, 1);
            Peer { seg: 0, step: 0, pass: 0, rng: Rng::new(0), awaiting_seed: script.seeded }
        });
        if p.awaiting_seed {
            p.rng = Rng::new(u64::from_le_bytes(buf[..n.min(8)].try_into().unwrap_or([0; 8])));
            p.awaiting_seed = false;
            continue;
        }
        if !feed(p, script, &u, from, n, out, c) {
            peers.remove(&from);
            add_active(c, -1);
        }
    }
}

/// Advances a UDP peer's script by one received datagram of `n` bytes and sends whatever
/// the script writes next. Returns false when the peer has disconnected.
fn feed(p: &mut Peer, script: &ConnScript, u: &UdpSocket, to: SocketAddr, n: usize, out: &[u8], c: &Counters) -> bool {
    let mut datagram = Some(n);
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
        match seg.steps[p.step].mirrored() {
            Io::Read(_) => match datagram.take() {
                None => return true,
                Some(0) if seg.times == Times::Timed && p.step == 0 => {
                    p.seg += 1;
                    p.pass = 0;
                }
                Some(0) => return false,
                Some(len) => {
                    c.bytes_received.fetch_add(len as u64, Ordering::Relaxed);
                    p.step += 1;
                }
            },
            Io::Write(size) => {
                let k = (p.rng.size(&size) as usize).min(out.len());
                if u.send_to(&out[..k], to).is_ok() {
                    c.bytes_sent.fetch_add(k as u64, Ordering::Relaxed);
                }
                p.step += 1;
            }
        }
    }
}

/// Serves one client thread of a reverse group: reads the port it listens on from its
/// doorbell, then connects back once per byte rung, running the mirror script on each
/// connection in turn, until the doorbell closes.
fn connect_back(mut bell: TcpStream, script: &ConnScript, c: &Counters) -> io::Result<()> {
    let mut port = [0u8; 2];
    bell.read_exact(&mut port)?;
    let to = SocketAddr::new(bell.peer_addr()?.ip(), u16::from_le_bytes(port));
    let mut ring = [0u8; 1];
    loop {
        match bell.read(&mut ring) {
            Ok(0) => return Ok(()),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
        let s = TcpStream::connect_timeout(&to, Duration::from_secs(10))?;
        c.connections.fetch_add(1, Ordering::Relaxed);
        mirror(s, script, c)?;
    }
}

/// Buffer for one write or read call.
const CHUNK: usize = 256 * 1024;

/// Runs one connection's script, mirrored.
fn mirror(mut s: TcpStream, script: &ConnScript, c: &Counters) -> io::Result<()> {
    s.set_nodelay(script.nodelay)?;
    let mut rng = Rng::new(0);
    if script.seeded {
        let mut seed = [0u8; 8];
        s.read_exact(&mut seed)?;
        rng = Rng::new(u64::from_le_bytes(seed));
    }
    let out = crate::buf::IoBuf::filled(CHUNK, 0x5a);
    let out = out.as_slice();
    let mut inp = crate::buf::IoBuf::new(CHUNK);
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
            for (i, io) in seg.steps.iter().enumerate() {
                // The server does the mirror: the client's write is our read.
                match io.mirrored() {
                    Io::Read(size) => {
                        let n = rng.size(&size);
                        let got = read_n(&mut s, inp, n)?;
                        c.bytes_received.fetch_add(got, Ordering::Relaxed);
                        if got < n {
                            if i == 0 && got == 0 && seg.times == Times::Timed {
                                eof_at_head = true;
                                break;
                            }
                            return Err(io::Error::new(
                                io::ErrorKind::UnexpectedEof,
                                "the client closed mid-transaction",
                            ));
                        }
                    }
                    Io::Write(size) => {
                        let n = rng.size(&size);
                        write_n(&mut s, out, n)?;
                        c.bytes_sent.fetch_add(n, Ordering::Relaxed);
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

/// True when the peer has shut down its sending side (checked without blocking).
fn peer_half_closed(s: &TcpStream) -> io::Result<bool> {
    let revents = poll1(s.as_raw_fd(), libc::POLLIN | libc::POLLRDHUP, 0)?;
    Ok(revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0)
}

/// Resizes a bound listener's accept queue to hold `connections` pending connections at
/// once (128 to 4096): listen(2) again on the listening socket.
pub(crate) fn size_backlog(l: &TcpListener, connections: u32) -> io::Result<()> {
    let backlog = connections.clamp(128, 4096) as libc::c_int;
    // SAFETY: listen(2) on a socket we own; a second listen only resizes the backlog.
    if unsafe { libc::listen(l.as_raw_fd(), backlog) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Waits up to `limit` for `fd` to become readable; true if it did.
pub(crate) fn wait_readable(fd: RawFd, limit: Duration) -> io::Result<bool> {
    let ms = limit.as_millis().clamp(1, libc::c_int::MAX as u128) as libc::c_int;
    Ok(poll1(fd, libc::POLLIN, ms)? != 0)
}

/// poll(2) on one descriptor; returns its revents (0 on timeout).
fn poll1(fd: RawFd, events: libc::c_short, timeout_ms: libc::c_int) -> io::Result<libc::c_short> {
    let mut p = libc::pollfd { fd, events, revents: 0 };
    loop {
        // SAFETY: one valid pollfd on the stack, for the duration of the call.
        let r = unsafe { libc::poll(&mut p, 1, timeout_ms) };
        if r >= 0 {
            return Ok(p.revents);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
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

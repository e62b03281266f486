//! `stopped-receiver`: a third guest, behind a relay process on a stream port, receives a
//! TCP stream from the cell's client ([`sender`] to [`receiver`]) while the cell's own
//! workload runs from the same client to the server; for the middle third of the cell its
//! relay is stopped (`SIGSTOP`) and then continued ([`stopper`]). A receiver that stops
//! draining is what a lossless switch must hold senders back for — and, with its pause
//! watchdog, give up on — without stalling the sender's other streams. Its control,
//! `draining-receiver`, is the same guest and stream without the stop (no [`stopper`]).

use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use super::{Clock, Shared, Tally};

/// The TCP port the third guest receives on.
pub const PORT: u16 = 5399;

/// Bytes of each write of the stream to the third guest.
const CHUNK: usize = 64 * 1024;

/// Accepts one connection on `at` (in the calling thread's namespace) and reads it until
/// the cell ends, counting the bytes.
pub fn receiver(at: Ipv4Addr, sh: &Shared, mut clock: Clock) -> io::Result<Tally> {
    let l = TcpListener::bind(SocketAddrV4::new(at, PORT))?;
    l.set_nonblocking(true)?;
    let mut t = Tally::default();
    let mut conn = loop {
        if sh.over() {
            return Ok(t);
        }
        match l.accept() {
            Ok((c, _)) => break c,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(5)),
            Err(e) => return Err(e),
        }
    };
    conn.set_nonblocking(false)?;
    conn.set_read_timeout(Some(Duration::from_millis(50)))?;
    let mut buf = vec![0u8; CHUNK];
    while !sh.over() {
        match conn.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => t.add("bytes_received", n as u64),
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
        clock.tick();
    }
    clock.tick();
    Ok(t)
}

/// Connects to the third guest at `to` (from the calling thread's namespace, trying for
/// up to 5 s) and writes to it as fast as it takes until the cell ends, counting bytes.
pub fn sender(to: Ipv4Addr, sh: &Shared, mut clock: Clock) -> io::Result<Tally> {
    let until = Instant::now() + Duration::from_secs(5);
    let mut t = Tally::default();
    let mut conn = loop {
        match TcpStream::connect_timeout(&SocketAddrV4::new(to, PORT).into(), Duration::from_secs(1)) {
            Ok(c) => break c,
            Err(_) if Instant::now() < until && !sh.over() => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => return Err(e),
        }
    };
    // A write blocked on a stopped receiver wakes up to look at the stop flag.
    conn.set_write_timeout(Some(Duration::from_millis(50)))?;
    let buf = vec![0x5a; CHUNK];
    while !sh.over() {
        match conn.write(&buf) {
            Ok(n) => t.add("bytes_sent", n as u64),
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                t.add("blocked_writes", 1)
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
        clock.tick();
    }
    clock.tick();
    Ok(t)
}

/// Stops process `relay` (`SIGSTOP`) from a third of `duration` to two thirds of it, then
/// continues it (`SIGCONT`, also when the cell ends first); counts the milliseconds it
/// was stopped.
pub fn stopper(relay: u32, duration: Duration, sh: &Shared, mut clock: Clock) -> io::Result<Tally> {
    let start = Instant::now();
    let mut t = Tally::default();
    let wait_until = |at: Instant, sh: &Shared| {
        while Instant::now() < at && !sh.over() {
            std::thread::sleep(Duration::from_millis(5));
        }
        !sh.over()
    };
    if !wait_until(start + duration / 3, sh) {
        return Ok(t);
    }
    sluice_sys::kill(relay, libc::SIGSTOP)?;
    let stopped = Instant::now();
    wait_until(start + duration * 2 / 3, sh);
    let continued = sluice_sys::kill(relay, libc::SIGCONT);
    t.add("stopped_ms", stopped.elapsed().as_millis() as u64);
    t.add("stops", 1);
    clock.tick();
    continued?;
    Ok(t)
}

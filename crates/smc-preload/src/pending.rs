//! A client's pending connections (docs/architecture.md, "Connections at TCP's cost"):
//! from `connect` until its server decides, a connection's descriptor is already the
//! shared-memory one and its writes go into the ring. If the server declines — or takes
//! the connection as plain TCP where the library cannot see, or never decides — the
//! connection stays on TCP: [`fall_back`] sends what the program wrote meanwhile onto the
//! TCP socket (nothing went there before, so nothing is doubled or lost), gives the
//! descriptor number back to the TCP socket, and makes the program's `epoll`
//! registrations again. Calls that cannot wait for the outcome in a ring (`dup`,
//! `shutdown`, `fork`, a full ring) wait for it first; `close` hands a connection with
//! bytes still undelivered to a thread that waits for it, so `close` returns at once, as
//! TCP's does.

use std::collections::VecDeque;
use std::ffi::c_int;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

use sluice_smc::msg::Reason;
use sluice_smc::slot::State;

use crate::conn::{Conn, FELL_BACK};
use crate::{cabi, real, sys};

/// Pending connections, by descriptor; how many there are (the poll-family hooks look at
/// them only while there are some).
static WATCH: Mutex<Vec<(c_int, Weak<Conn>)>> = Mutex::new(Vec::new());
pub static WATCHING: AtomicUsize = AtomicUsize::new(0);

/// Watches pending connection `c` on descriptor `fd`.
pub fn watch(fd: c_int, c: &Arc<Conn>) {
    let mut w = WATCH.lock().unwrap_or_else(|p| p.into_inner());
    w.retain(|(_, c)| c.upgrade().is_some_and(|c| c.is_pending()));
    w.push((fd, Arc::downgrade(c)));
    WATCHING.store(w.len(), Ordering::Relaxed);
}

/// Why a connection stays on TCP, as the client counts it.
fn reason_of(c: &Conn) -> Reason {
    match c.decision() {
        Some((State::Declined, _)) => Reason::PeerDeclined,
        _ => c.abandoned_for(),
    }
}

/// Pending connection `c`, on descriptor `fd`, stays on TCP: the bytes written meanwhile
/// go onto the TCP socket, the descriptor becomes the TCP socket again (its flags and the
/// program's epoll registrations carried over), and the library forgets it.
///
/// Once per connection, and only while `fd` still names it: the thread that reads a
/// pending connection and a thread whose `poll` looks at every pending connection
/// ([`sweep`]) can both find it declined at once. The second waits for the first and then
/// finds the descriptor TCP's already (`Ok`: its call goes to the kernel) — it must not
/// replay the ring a second time, nor put the TCP socket over a descriptor number the
/// program has closed and reused meanwhile (both broke connections under load).
pub fn fall_back(fd: c_int, c: &Arc<Conn>) -> Result<(), c_int> {
    crate::while_named(fd, c, true, || move_back(fd, c, true)).unwrap_or(Ok(()))
}

/// [`fall_back`]'s work, under the descriptor's lock: what to answer, and whether the
/// descriptor is the TCP socket now. Without `wait`, nothing is done while a write
/// into the ring is under way (its thread will find the outcome itself).
fn move_back(fd: c_int, c: &Conn, wait: bool) -> (Result<(), c_int>, bool) {
    let reason = reason_of(c);
    let mut handover = if wait {
        c.handover.lock().unwrap_or_else(|p| p.into_inner())
    } else {
        match c.handover.try_lock() {
            Ok(h) => h,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return (Ok(()), false),
        }
    };
    *handover = true;
    let replayed = replay_locked(c);
    drop(handover);
    // SAFETY: fcntl and dup3 on the caller's descriptor and the connection's TCP socket.
    unsafe {
        let fdfl = real::fcntl(fd, sys::F_GETFD, 0);
        let cloexec = if fdfl >= 0 && fdfl & 1 != 0 { sys::O_CLOEXEC } else { 0 };
        let fl = real::fcntl(c.tcp_fd, sys::F_GETFL, 0);
        if fl >= 0 {
            let nb = if c.nonblock.load(Ordering::Relaxed) { sys::O_NONBLOCK } else { 0 };
            real::fcntl(c.tcp_fd, sys::F_SETFL, ((fl & !sys::O_NONBLOCK) | nb) as usize);
        }
        if real::dup3(c.tcp_fd, fd, cloexec) < 0 {
            return (Err(cabi::errno()), false);
        }
    }
    let regs = c.take_regs();
    for (epfd, ev) in &regs {
        let mut ev = *ev;
        // SAFETY: the program's epoll instance and event, made again for the TCP socket.
        unsafe {
            real::epoll_ctl(*epfd, 1 /* EPOLL_CTL_ADD */, fd, ev.as_mut_ptr().cast())
        };
    }
    crate::stats::fallback(reason, false);
    moved(Fallen { fd, regs });
    (replayed, true)
}

/// Connections moved back to TCP lately, numbered by [`MOVES`]: a wait that was under
/// way when one moved may report its descriptor for the pair's end closing (the server's
/// decline), whichever thread moved it (crate::waits takes such reports out).
static MOVED: Mutex<VecDeque<(u64, Fallen)>> = Mutex::new(VecDeque::new());
static MOVES: AtomicU64 = AtomicU64::new(0);
/// Moves remembered (a wait that outlasts more of them may report one of the older).
const MOVED_KEPT: usize = 256;

/// How many connections have moved back to TCP so far (a wait notes it before it looks).
pub fn moves() -> u64 {
    MOVES.load(Ordering::SeqCst)
}

fn moved(f: Fallen) {
    let mut m = MOVED.lock().unwrap_or_else(|p| p.into_inner());
    let n = MOVES.fetch_add(1, Ordering::SeqCst) + 1;
    if m.len() >= MOVED_KEPT {
        m.pop_front();
    }
    m.push_back((n, f));
}

/// Writes what the program wrote into the ring while pending onto the TCP socket, in
/// order (blocking, bounded: the server reads TCP now).
fn replay(c: &Conn) -> Result<(), c_int> {
    let mut handover = c.handover.lock().unwrap_or_else(|p| p.into_inner());
    *handover = true;
    replay_locked(c)
}

/// [`replay`], the handover lock held: one replay at a time (a second finds the ring
/// empty — two readers of the ring could both send the same bytes), and no write into
/// the ring meanwhile.
fn replay_locked(c: &Conn) -> Result<(), c_int> {
    let mut buf = vec![0u8; 64 * 1024];
    let deadline = std::time::Instant::now() + std::time::Duration::from_millis(crate::conn::DECISION_MS);
    loop {
        let n = match c.tx.pop(&mut buf, false) {
            Ok(p) => p.n,
            Err(_) => return Err(sys::ECONNRESET),
        };
        if n == 0 {
            return Ok(());
        }
        let mut off = 0;
        while off < n {
            // SAFETY: sends from a live buffer on the connection's TCP socket.
            let k = unsafe {
                real::send(c.tcp_fd, buf[off..n].as_ptr().cast(), n - off, sys::MSG_NOSIGNAL | sys::MSG_DONTWAIT)
            };
            if k > 0 {
                off += k as usize;
                continue;
            }
            let e = cabi::errno();
            let left = deadline.saturating_duration_since(std::time::Instant::now()).as_millis() as i32;
            if e != sys::EAGAIN || left == 0 || !sys::wait(c.tcp_fd, sys::POLLOUT, left).unwrap_or(false) {
                return Err(if e == sys::EAGAIN { sys::ETIMEDOUT } else { e });
            }
        }
    }
}

/// Settles pending connection `c` on `fd` where a call needs the outcome: waits for it;
/// `Ok(true)` when the connection is on shared memory, `Ok(false)` when it is TCP's now
/// (the call goes to the TCP socket).
pub fn settle(fd: c_int, c: &Arc<Conn>) -> Result<bool, c_int> {
    if !c.is_pending() {
        return Ok(true);
    }
    match c.await_decision(fd) {
        Ok(()) => Ok(true),
        Err(FELL_BACK) => fall_back(fd, c).map(|()| false),
        Err(e) => Err(e),
    }
}

/// A pending connection sent back to TCP: its descriptor and the epoll registrations
/// the program had made of it.
#[derive(Clone)]
pub struct Fallen {
    pub fd: c_int,
    pub regs: Vec<(c_int, [u8; 16])>,
}

/// Looks at every pending connection for an outcome (the poll-family hooks call this
/// between slices of their waits, so a program asleep in `epoll_wait` on a connection
/// its server took as TCP wakes to the TCP socket, and after a wait that reported
/// something while connections were pending). Returns the connections that went back
/// to TCP since move number `since` (this sweep's moves, and other threads'): what a
/// wait begun before then reported of them was the library's doing — a declining
/// server closes its end of the pair, which reads as "readable" — and must not reach
/// the program, whose read would find nothing on the TCP socket yet.
pub fn sweep(since: u64) -> Vec<Fallen> {
    let list: Vec<(c_int, Arc<Conn>)> = {
        let w = WATCH.lock().unwrap_or_else(|p| p.into_inner());
        w.iter().filter_map(|(fd, c)| Some((*fd, c.upgrade()?))).collect()
    };
    let mut busy = Vec::new();
    for (fd, c) in list {
        // Looked at and moved back under the descriptor's lock, only while it still names
        // this connection (not once the program closed it, or another thread moved it).
        // (Without waiting: a descriptor another thread is busy with is that thread's to
        // move, and is looked at again after the next slice.)
        let looked = crate::while_named(fd, &c, false, || match c.check_pending(fd, true) {
            Err(FELL_BACK) => ((), move_back(fd, &c, false).1),
            _ => ((), false),
        });
        // One another thread is moving back right now: what the caller's wait reported of
        // it (its pair's end closing) is not the connection's either, though its move is
        // not done yet (and not yet among the moves below). (Taken out of one report at
        // worst wrongly, if the number was reused meanwhile: a level-triggered wait
        // reports it again, an edge-triggered registration is armed again.)
        if looked.is_none() && c.falling_back() {
            busy.push(Fallen { fd, regs: c.regs() });
        }
    }
    {
        let mut w = WATCH.lock().unwrap_or_else(|p| p.into_inner());
        w.retain(|(_, c)| c.upgrade().is_some_and(|c| c.is_pending()));
        WATCHING.store(w.len(), Ordering::Relaxed);
    }
    let m = MOVED.lock().unwrap_or_else(|p| p.into_inner());
    busy.extend(m.iter().filter(|(n, _)| *n > since).map(|(_, f)| f.clone()));
    busy
}

/// Settles every pending connection before the process forks (a child's copy of a
/// descriptor could not be moved back to TCP by the parent).
pub extern "C" fn before_fork() {
    crate::conn::FORKS.fetch_add(1, Ordering::Relaxed);
    crate::forking();
    crate::looks::before_fork();
    if WATCHING.load(Ordering::Relaxed) == 0 {
        return;
    }
    let list: Vec<(c_int, Arc<Conn>)> = {
        let w = WATCH.lock().unwrap_or_else(|p| p.into_inner());
        w.iter().filter_map(|(fd, c)| Some((*fd, c.upgrade()?))).collect()
    };
    for (fd, c) in list {
        if crate::conn_of(fd).is_some_and(|now| Arc::ptr_eq(&now, &c)) {
            let _ = settle(fd, &c);
        }
    }
}

/// The program closes the last descriptor of pending connection `c` (`fd`, still open;
/// -1 when it is gone already). Undelivered bytes must reach the server whichever way it
/// decides: a thread waits for the outcome (on its own copy of the descriptor) and sends
/// them onto TCP if it declines. Without such bytes the client simply gives up on it.
pub fn closing(c: Arc<Conn>, fd: c_int) {
    match c.decision() {
        Some((State::Committed, _)) => {
            c.mark_moved();
            c.closed();
            return;
        }
        Some(_) => {
            crate::stats::fallback(reason_of(&c), false);
            let _ = replay(&c);
            return;
        }
        None => {}
    }
    if c.tx.is_empty() && c.control().decide(c.generation, State::Abandoned, 0) {
        // Nothing to deliver: the server finds it given up on and keeps TCP (our close of
        // the TCP socket is its end of file).
        crate::stats::fallback(Reason::ClosedEarly, false);
        return;
    }
    // SAFETY: a duplicate of the caller's descriptor, ours to close.
    let mine = if fd >= 0 { sys::dup_high(fd) } else { -1 };
    CLOSING.fetch_add(1, Ordering::SeqCst);
    let work = move || {
        deliver(&c, mine);
        if mine >= 0 {
            sys::close(mine);
        }
        CLOSING.fetch_sub(1, Ordering::SeqCst);
    };
    if std::thread::Builder::new().name("sluice-smc-close".into()).spawn(work).is_err() {
        // No thread to be had (the closure, and our copy of the descriptor, went with the
        // failed spawn): the exit handler still waits for nothing of it.
        CLOSING.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Connections closed while pending whose bytes are still being delivered.
static CLOSING: AtomicUsize = AtomicUsize::new(0);

/// Waits for pending connection `c`'s outcome and delivers what the program wrote: the
/// server reads it from the ring if it commits, or it goes onto TCP.
fn deliver(c: &Conn, fd: c_int) {
    match c.await_decision(fd) {
        Ok(()) => c.closed(),
        Err(_) => {
            crate::stats::fallback(reason_of(c), false);
            let _ = replay(c);
        }
    }
}

/// At a normal exit: what the program wrote on connections still pending (open, or closed
/// and being delivered) reaches the server before the process goes, as the kernel would
/// deliver a TCP socket's bytes after its process exited (bounded by the decision's limit).
pub extern "C" fn at_exit() {
    let list: Vec<(c_int, Arc<Conn>)> = {
        let Ok(w) = WATCH.try_lock() else { return };
        w.iter().filter_map(|(fd, c)| Some((*fd, c.upgrade()?))).collect()
    };
    for (fd, c) in list {
        // (One the program closed is its closing thread's, waited for below; its number
        // may be another socket's by now.)
        let open = crate::conn_of(fd).is_some_and(|now| Arc::ptr_eq(&now, &c));
        if open && c.is_pending() && c.owner == sys::pid() && !c.tx.is_empty() {
            deliver(&c, fd);
        }
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_millis(crate::conn::DECISION_MS);
    while CLOSING.load(Ordering::SeqCst) > 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

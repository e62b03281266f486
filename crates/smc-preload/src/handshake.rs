//! The CLC-style handshake over a listener's side door (docs/architecture.md,
//! "Capability"): the client's half runs inside `connect`; the server's half runs on the
//! process's door thread and leaves a prepared connection for `accept` to pick up.
//!
//! Neither side hands over memory before the kernel has shown it the other is the real
//! other end of the TCP connection (docs/architecture.md, "The fast path's trust
//! boundary"): the client checks the door's owner against the listener its connection
//! reached ([`verify_listener`]) before it sends anything; the server checks the TCP
//! socket the proposal carries against the connection ([`verify_proposer`]) before it
//! answers; and each checks the seals and size of the peer's segment before mapping it.

use std::collections::{HashMap, HashSet};
use std::ffi::c_int;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use sluice_smc::access;
use sluice_smc::msg::{DecodeError, Msg, Reason, Tuple};
use sluice_smc::ring::{Ring, region_len};

use crate::conn::{Conn, Side};
use crate::registry::Entry;
use crate::sys::{self, Shm};
use crate::{diag, foreign, registry, settings};

/// How long either side waits for the other's next message. The one exception: after
/// CONFIRM the client waits for the server's decision as long as the server may take to
/// decide ([`DECISION_MS`]).
pub const TIMEOUT_MS: i32 = 1000;

/// How long `accept` waits for a handshake a client announced.
pub const ACCEPT_WAIT_MS: u64 = 5000;

/// How long after a user's announced connection brought no proposal in time its
/// announcements are not waited for: one who announces and never proposes holds a
/// server's `accept` once, not again and again.
pub const PENALTY_MS: u64 = 60_000;

/// How long the door waits for `accept` to claim a prepared connection while the
/// program is accepting (a thread is in `accept`, or left it lately)…
pub const CLAIM_LIMIT_MS: u64 = 10_000;
/// …and how long without any `accept` in this process it waits before declining (a
/// pre-forking server whose children accept, or a program not accepting now).
pub const CLAIM_IDLE_MS: u64 = 500;

/// How long the client waits for the server's decision after its CONFIRM: the longest the
/// server waits for its claim, and a message's time on top. Past it the client cannot know
/// whether the server moved its end, so it fails the connection rather than guess.
pub const DECISION_MS: i32 = CLAIM_LIMIT_MS as i32 + 2 * TIMEOUT_MS;

/// Milliseconds on a clock this process shares with the processes it forks after its
/// first `listen` ([`prepare_for_children`] starts it before any fork).
fn now_ms() -> u64 {
    static BASE: OnceLock<Instant> = OnceLock::new();
    BASE.get_or_init(Instant::now).elapsed().as_millis() as u64 + 1
}

/// What the processes forked from a listening one share about `accept`: how many of
/// their threads are in it, and when one last left it. Anonymous shared memory made at
/// the first `listen`, before any fork, so a parent whose children accept on its
/// listener (a pre-forking server) knows they do: no file, nobody else's reach. (If it
/// cannot be mapped, this process's own memory: its children are then not seen.)
struct Tree {
    in_accept: AtomicU64,
    last_accept_ms: AtomicU64,
}

fn tree() -> &'static Tree {
    static OWN: Tree = Tree { in_accept: AtomicU64::new(0), last_accept_ms: AtomicU64::new(0) };
    static AT: OnceLock<usize> = OnceLock::new();
    let at = *AT.get_or_init(|| match Shm::anonymous(4096) {
        Ok(shm) => {
            let p = shm.ptr as usize;
            // Mapped for the life of the process (and its children's).
            std::mem::forget(shm);
            p
        }
        Err(_) => 0,
    });
    if at == 0 {
        return &OWN;
    }
    // SAFETY: a zeroed, page-aligned page mapped until the process ends; all-zero bytes
    // are a valid `Tree`, and only atomic operations touch it.
    unsafe { &*(at as *const Tree) }
}

/// Called at `listen`: the shared page and clock must exist before the program forks.
pub fn prepare_for_children() {
    let _ = now_ms();
    let _ = tree();
}

/// Held by a thread inside `accept` (in the kernel's or in the claim): the program is
/// accepting, so the door keeps waiting for its claim.
pub struct Accepting(());

impl Accepting {
    /// Marks this thread as accepting.
    pub fn begin() -> Accepting {
        tree().in_accept.fetch_add(1, Ordering::SeqCst);
        Accepting(())
    }
}

impl Drop for Accepting {
    fn drop(&mut self) {
        let t = tree();
        t.last_accept_ms.fetch_max(now_ms(), Ordering::SeqCst);
        t.in_accept.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Whether the program — this process, or one forked from it that accepts on its
/// listeners — has been accepting within the last [`CLAIM_IDLE_MS`].
fn accepting() -> bool {
    let t = tree();
    t.in_accept.load(Ordering::SeqCst) > 0
        || now_ms().saturating_sub(t.last_accept_ms.load(Ordering::SeqCst)) < CLAIM_IDLE_MS
}

/// A receive ring of `size` bytes, `window` of them in use to start with, in fresh shared
/// memory sealed against resizing (so the peer cannot truncate what it maps). The memfd is
/// sparse: pages past the window take no memory until the window grows over them.
fn new_ring(size: usize, window: usize) -> Result<(Shm, Ring), Reason> {
    let shm = Shm::create(region_len(size)).map_err(|_| Reason::NoMemory)?;
    // SAFETY: a fresh, page-aligned shared mapping of the right length, owned by `shm`,
    // which the connection keeps alive as long as the ring.
    let ring = unsafe { Ring::create(shm.ptr, shm.len, size, window) }.map_err(|_| Reason::NoMemory)?;
    Ok((shm, ring))
}

/// Maps the peer's receive ring of `size` bytes from `fd` (which it takes) — only once the
/// file is shown to be a memfd (not hugetlbfs) that can neither shrink nor change its
/// seals, at least as long as the ring, whose header says the same size.
pub(crate) fn map_ring(fd: c_int, size: usize) -> Result<(Shm, Ring), Reason> {
    let ok = size.is_power_of_two()
        && (sluice_smc::size::MIN..=sluice_smc::size::MAX).contains(&size)
        && sys::is_shmem(fd)
        && sys::seals(fd).is_some_and(|s| s & sys::SEALS == sys::SEALS)
        && sys::file_len(fd).is_some_and(|n| n >= region_len(size) as u64);
    if !ok {
        foreign::release(fd);
        return Err(Reason::BadSegment);
    }
    let shm = Shm::map(fd, region_len(size)).map_err(|_| Reason::BadSegment)?;
    // SAFETY: a shared mapping of `region_len(size)` bytes that cannot shrink (sealed),
    // owned by `shm`, which the connection keeps alive as long as the ring.
    let ring = unsafe { Ring::attach(shm.ptr, shm.len) }.map_err(|_| Reason::BadSegment)?;
    if ring.max_capacity() != size || ring.window().is_err() {
        return Err(Reason::BadSegment);
    }
    Ok((shm, ring))
}

/// True when `fd` is fit to be the peer's doorbell end: a unix stream socket with nothing
/// queued in it (the connection has not begun), which from now on refuses descriptors, so
/// the peer cannot make our reads or our close release something of its choosing.
fn take_doorbell(fd: c_int) -> bool {
    let unix = sys::sockopt_int(fd, sys::SOL_SOCKET, sys::SO_DOMAIN) == Some(sys::AF_UNIX)
        && sys::sockopt_int(fd, sys::SOL_SOCKET, sys::SO_TYPE) == Some(sys::SOCK_STREAM);
    // Refused first, then looked at: nothing can slip in between. (A kernel before 6.16
    // cannot refuse: docs/architecture.md, "What stays out of reach".)
    unix && {
        sys::refuse_rights(fd);
        sys::pending(fd) == Some(0)
    }
}

/// The client's proof that door `door` belongs to the listener this connection reached,
/// asked of the kernel before a byte goes to the door.
fn verify_listener(door: c_int, tuple: Tuple, entry: &Entry) -> Result<(), Reason> {
    let policy = registry::policy().ok_or(Reason::NotAllowed)?;
    let (pid, cred) = sys::peer_cred(door).ok_or(Reason::Protocol)?;
    if pid != entry.pid || cred.uid != entry.owner {
        return Err(Reason::WrongListener);
    }
    // Does the connection end in this namespace? Then the kernel knows which listener
    // took it, and the door's process must be that listener's.
    let d = diag::Diag::open().ok_or(Reason::NoMemory)?;
    let exact = match d.connection(tuple.server, tuple.client) {
        Some(_) => {
            let l = d.listener(tuple.server).ok_or(Reason::WrongListener)?;
            if l.uid != cred.uid || diag::holds(pid, l.inode) == Some(false) {
                return Err(Reason::WrongListener);
            }
            true
        }
        None => false,
    };
    if !policy.peer_allowed(&cred, sys::euid(), exact) {
        return Err(Reason::NotAllowed);
    }
    Ok(())
}

/// The server's proof that the proposer on door connection `c` holds the connection's
/// client socket: `tcp`, the socket it passed.
fn verify_proposer(c: c_int, tuple: Tuple, tcp: c_int) -> Result<(), Reason> {
    let policy = registry::policy().ok_or(Reason::NotAllowed)?;
    let (_, cred) = sys::peer_cred(c).ok_or(Reason::Protocol)?;
    if !policy.allows(&cred) {
        return Err(Reason::NotAllowed);
    }
    let holds_it = crate::is_tcp(tcp)
        && sys::tcp_state(tcp) == Some(1)
        && sys::sock_addr(tcp, false) == Some(tuple.client)
        && sys::sock_addr(tcp, true) == Some(tuple.server);
    if !holds_it {
        return Err(Reason::Unproven);
    }
    let ours = listening_ports().lock().unwrap_or_else(|p| p.into_inner()).contains(&tuple.server.port());
    let d = diag::Diag::open().ok_or(Reason::NoMemory)?;
    if !ours || d.connection(tuple.server, tuple.client).is_none() {
        return Err(Reason::NotOurConnection);
    }
    // Is the client end in this namespace? Then it must be the very socket passed.
    let exact = match d.connection(tuple.client, tuple.server) {
        Some(end) if Some(end.cookie) == sys::cookie(tcp) => true,
        Some(_) => return Err(Reason::Unproven),
        None => false,
    };
    if !policy.peer_allowed(&cred, sys::euid(), exact) {
        return Err(Reason::NotAllowed);
    }
    Ok(())
}

/// The doorbell pair for our side: (our descriptor-to-be, the end for the peer).
fn doorbell() -> Result<(c_int, c_int), Reason> {
    let (a, b) = sys::socketpair(sys::SOCK_STREAM).map_err(|_| Reason::NoMemory)?;
    // A small send buffer: filler makes it unwritable quickly when our ring is full.
    sys::set_sockopt_int(a, sys::SOL_SOCKET, sys::SO_SNDBUF, 4096);
    // What the peer writes into its end arrives here: bytes, never descriptors.
    sys::refuse_rights(a);
    Ok((a, b))
}

pub(crate) fn decline(sock: c_int, token: [u8; 16], reason: Reason) {
    let _ = sys::send_with_fds(sock, &Msg::Decline { token, reason }.encode(), &[]);
}

pub(crate) fn recv_msg(sock: c_int, timeout_ms: i32) -> Result<(Msg, Vec<c_int>), Reason> {
    let mut buf = [0u8; 256];
    let (n, fds) = sys::recv_with_fds(sock, &mut buf, timeout_ms)
        .map_err(|e| if e.kind() == std::io::ErrorKind::TimedOut { Reason::Timeout } else { Reason::Protocol })?;
    match Msg::decode(&buf[..n]) {
        Ok(m) => Ok((m, fds)),
        Err(e) => {
            foreign::release_all(&fds);
            Err(if let DecodeError::Version(_) = e { Reason::Version } else { Reason::Protocol })
        }
    }
}

/// What the client's half hands back: the connection and our descriptor-to-be.
pub struct Ready {
    pub conn: Conn,
    pub app_end: c_int,
    pub rmem: usize,
    pub tmem: usize,
}

/// Why the client's half did not move a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failed {
    /// The connection stays on TCP, untouched; the reason is counted.
    Fallback(Reason),
    /// The server's decision did not come within [`DECISION_MS`]: it may have moved its
    /// end, so the connection can be neither moved nor kept. The caller fails it.
    Undecided,
}

impl From<Reason> for Failed {
    fn from(r: Reason) -> Failed {
        Failed::Fallback(r)
    }
}

/// The client's half, for connected TCP socket `tcp` with `tuple`, towards the listener
/// of registry entry `entry`. Every wait in it is bounded: the door is opened without
/// waiting (a door that does not accept is unreachable, not waited for), each message is
/// waited for at most [`TIMEOUT_MS`], the decision at most [`DECISION_MS`].
pub fn client(tcp: c_int, tuple: Tuple, entry: &Entry) -> Result<Ready, Failed> {
    if foreign::congested() {
        return Err(Reason::NoMemory.into());
    }
    let (r, t) = settings();
    // SAFETY: a plain socket call.
    let door =
        unsafe { crate::real::socket(sys::AF_UNIX, sys::SOCK_SEQPACKET | sys::SOCK_CLOEXEC | sys::SOCK_NONBLOCK, 0) };
    if door < 0 {
        return Err(Reason::NoMemory.into());
    }
    let out = client_on(door, tcp, tuple, entry, r, t);
    foreign::quiesce(door);
    out
}

fn client_on(door: c_int, tcp: c_int, tuple: Tuple, entry: &Entry, r: usize, t: usize) -> Result<Ready, Failed> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let path = registry::door_path(entry.pid);
    // A door that is not the entry owner's socket is not the listener's.
    let m = path.symlink_metadata().map_err(|_| Reason::DoorUnreachable)?;
    if !m.file_type().is_socket() || m.uid() != entry.owner {
        return Err(Reason::WrongListener.into());
    }
    let sa = unix_addr(&path).ok_or(Reason::DoorUnreachable)?;
    // SAFETY: `sa` is a complete sockaddr_un.
    if unsafe { crate::real::connect(door, sa.as_ptr().cast(), sa.len() as u32) } < 0 {
        // A door we may not open: its owner does not let our user in. A full backlog
        // (EAGAIN): a door that does not accept — not waited for.
        return Err(if sys::errno() == sys::EACCES { Reason::NotAllowed } else { Reason::DoorUnreachable }.into());
    }
    verify_listener(door, tuple, entry)?;
    if crate::fault("client-no-proposal") {
        return Err(Reason::DoorUnreachable.into());
    }
    let (rmax, _) = crate::maxima();
    let (rx_shm, rx) = new_ring(rmax, r)?;
    let side = Side::new().map_err(|_| Reason::NoMemory)?;
    let (app_end, bell) = doorbell()?;
    let token = sys::token();
    // Our ring's whole size (the window is in its header), and the send buffer we start with.
    let p =
        Msg::Proposal { token, tuple, netns: sys::netns_inode(), pid: sys::pid(), rmem: rmax as u32, tmem: t as u32 };
    // The TCP socket travels too: the server's proof that we hold the connection.
    let sent = sys::send_with_fds(door, &p.encode(), &[rx_shm.fd, bell, tcp]);
    sys::close(bell);
    if sent.is_err() {
        sys::close(app_end);
        return Err(Reason::DoorUnreachable.into());
    }
    let fail = |reason: Failed| {
        sys::close(app_end);
        Err(reason)
    };
    let (m, fds) = match recv_msg(door, TIMEOUT_MS) {
        Ok(x) => x,
        Err(e) => return fail(e.into()),
    };
    match m {
        Msg::Accept { .. } if crate::fault("client-no-confirm") => {
            foreign::release_all(&fds);
            fail(Reason::Protocol.into())
        }
        Msg::Accept { token: t2, rmem, .. } if t2 == token && fds.len() == 2 => {
            if !take_doorbell(fds[1]) {
                foreign::release_all(&fds);
                decline(door, token, Reason::Protocol);
                return fail(Reason::Protocol.into());
            }
            let (tx_shm, tx) = match map_ring(fds[0], rmem as usize) {
                Ok(x) => x,
                Err(e) => {
                    sys::close(fds[1]);
                    decline(door, token, e);
                    return fail(e.into());
                }
            };
            if sys::send_with_fds(door, &Msg::Confirm { token }.encode(), &[]).is_err() {
                sys::close(fds[1]);
                return fail(Reason::DoorUnreachable.into());
            }
            // The server's decision: its CONFIRM (committed) or DECLINE (its `accept` had
            // already given up on us). A dead server closes the door; one that says
            // nothing within DECISION_MS leaves the connection undecided.
            match recv_msg(door, DECISION_MS) {
                Ok((Msg::Confirm { token: t3 }, extra)) if t3 == token => {
                    foreign::release_all(&extra);
                }
                Ok((m, extra)) => {
                    foreign::release_all(&extra);
                    sys::close(fds[1]);
                    let r = if let Msg::Decline { .. } = m { Reason::PeerDeclined } else { Reason::Protocol };
                    return fail(r.into());
                }
                Err(Reason::Timeout) => {
                    sys::close(fds[1]);
                    return fail(Failed::Undecided);
                }
                Err(_) => {
                    sys::close(fds[1]);
                    return fail(Reason::DoorUnreachable.into());
                }
            }
            let tmem = tx.capacity();
            Ok(Ready { conn: Conn::new(rx_shm, rx, tx_shm, tx, side, fds[1]), app_end, rmem: r, tmem })
        }
        Msg::Decline { .. } => {
            foreign::release_all(&fds);
            fail(Reason::PeerDeclined.into())
        }
        _ => {
            foreign::release_all(&fds);
            decline(door, token, Reason::Protocol);
            fail(Reason::Protocol.into())
        }
    }
}

/// A `sockaddr_un` for `path`.
fn unix_addr(path: &std::path::Path) -> Option<Vec<u8>> {
    use std::os::unix::ffi::OsStrExt;
    let p = path.as_os_str().as_bytes();
    if p.len() >= 108 {
        return None;
    }
    let mut sa = vec![0u8; 2 + p.len() + 1];
    sa[..2].copy_from_slice(&(sys::AF_UNIX as u16).to_ne_bytes());
    sa[2..2 + p.len()].copy_from_slice(p);
    Some(sa)
}

/// A server-side connection prepared by the door thread, waiting for `accept`.
pub struct Prepared {
    pub conn: Conn,
    pub app_end: c_int,
    pub rmem: usize,
    pub tmem: usize,
    /// Committed already (the program was accepting: the door confirmed to the client at
    /// once, and `accept` takes it whenever it comes to it); otherwise the door commits
    /// when `accept` claims it.
    pub committed: bool,
}

impl Prepared {
    /// Hands the connection and our descriptor-to-be over (to `accept`, which keeps both).
    pub fn into_parts(self) -> (Conn, c_int, usize, usize) {
        let me = std::mem::ManuallyDrop::new(self);
        // SAFETY: `me` is never dropped, so `conn` is moved out exactly once.
        let conn = unsafe { std::ptr::read(&me.conn) };
        (conn, me.app_end, me.rmem, me.tmem)
    }
}

impl Drop for Prepared {
    fn drop(&mut self) {
        sys::close(self.app_end);
    }
}

type Key = (SocketAddr, SocketAddr);

/// Connections the door has prepared, and those `accept` has claimed. The door commits
/// (answers the client's CONFIRM with its own) only once `accept` in this process claimed
/// the connection, and declines if none did in time; both happen under this table's
/// lock, so client and server can never disagree — also when a forked child, whose
/// door is its parent's, accepts the connection.
struct Table {
    ready: HashMap<Key, Prepared>,
    claimed: HashSet<Key>,
    /// Connections a forked child claimed, being handed over to it now: the door waits
    /// for the outcome ([`handed`]).
    handing: HashSet<Key>,
    /// Connections whose proposal a door thread is working on now.
    working: HashSet<Key>,
    /// Users whose announced connection brought no proposal within `ACCEPT_WAIT_MS`, and
    /// when: their announcements are not waited for until [`PENALTY_MS`] later.
    broken: HashMap<u32, Instant>,
}

fn table() -> &'static (Mutex<Table>, Condvar) {
    static T: OnceLock<(Mutex<Table>, Condvar)> = OnceLock::new();
    T.get_or_init(|| {
        let t = Table {
            ready: HashMap::new(),
            claimed: HashSet::new(),
            handing: HashSet::new(),
            working: HashSet::new(),
            broken: HashMap::new(),
        };
        (Mutex::new(t), Condvar::new())
    })
}

/// Marks a connection as being worked on by a door thread for as long as it lives, and
/// wakes `accept` when the work ends, however it ends.
struct Working(Key);

impl Working {
    /// None when another door thread is already working on the same connection.
    fn begin(key: Key) -> Option<Working> {
        let (m, cv) = table();
        let mut t = m.lock().unwrap_or_else(|p| p.into_inner());
        if t.ready.contains_key(&key) || !t.working.insert(key) {
            return None;
        }
        cv.notify_all();
        Some(Working(key))
    }
}

impl Drop for Working {
    fn drop(&mut self) {
        let (m, cv) = table();
        m.lock().unwrap_or_else(|p| p.into_inner()).working.remove(&self.0);
        cv.notify_all();
    }
}

/// Claims the prepared connection whose server side is `local` and client `peer`. Waits
/// while a door thread works on its proposal, or — up to [`ACCEPT_WAIT_MS`] — while its
/// client's announcement says one is coming. Without one, says why: `NoProposal` (nobody
/// announced it, or its handshake ended without a connection), `Unproven` (the
/// announcement was written by another user than the client's), `Timeout` (announced,
/// and no proposal came in time) or `Penalized` (announced by a user not waited for now).
///
/// An announcement is a file any allowed user can write: when the client end is in this
/// namespace, only one its owner wrote counts, so nobody can make `accept` wait for
/// others' connections. (When it is not, the announcement is believed: the wait is
/// bounded, and only allowed users can write one.) A user whose announced connection
/// held `accept` for [`CLAIM_IDLE_MS`] or more and brought nothing is not waited for
/// again for [`PENALTY_MS`]: announcing and then not proposing (or not confirming) holds
/// a server once, not connection after connection.
///
/// `to_child`: the claim is a forked child's ([`crate::claim`]); the door commits only
/// once [`handed`] says the child took the connection.
pub fn take_prepared(local: SocketAddr, peer: SocketAddr, to_child: bool) -> Result<Prepared, Reason> {
    let (m, cv) = table();
    let key = (local, peer);
    let mut t = m.lock().unwrap_or_else(|p| p.into_inner());
    let start = Instant::now();
    let deadline = start + Duration::from_millis(ACCEPT_WAIT_MS);
    // The client end's owner, asked of sock_diag once (None: not in this namespace).
    let mut client_owner: Option<Option<u32>> = None;
    let mut proposed = false;
    let mut announcer = None;
    let out = loop {
        if let Some(p) = t.ready.remove(&key) {
            if p.committed {
                // Nothing to tell the door: it confirmed already.
            } else if to_child {
                t.handing.insert(key);
            } else {
                t.claimed.insert(key);
            }
            cv.notify_all();
            return Ok(p);
        }
        let now = Instant::now();
        let working = t.working.contains(&key);
        proposed |= working;
        let by = registry::announced(peer, local);
        announcer = by.or(announcer);
        if !working {
            let Some(by) = by.filter(|_| !proposed) else {
                // Not announced, or its handshake ended without a connection for us.
                break Reason::NoProposal;
            };
            if !client_announced(&mut client_owner, peer, local, by) {
                break Reason::Unproven;
            }
            if t.broken.get(&by).is_some_and(|at| now.duration_since(*at) < PENALTY) {
                break Reason::Penalized;
            }
            if now >= deadline {
                break Reason::Timeout;
            }
        } else if now >= deadline + Duration::from_millis(CLAIM_LIMIT_MS) {
            // Bounded even if a door thread never finishes.
            break Reason::Timeout;
        }
        // Unlocked while waiting; door threads notify when they begin, prepare and end.
        let left = (deadline + Duration::from_millis(CLAIM_LIMIT_MS)).saturating_duration_since(now);
        t = cv
            .wait_timeout(t, left.clamp(Duration::from_millis(1), Duration::from_millis(50)))
            .unwrap_or_else(|p| p.into_inner())
            .0;
    };
    let now = Instant::now();
    if let Some(by) = announcer.filter(|_| now.duration_since(start) >= Duration::from_millis(CLAIM_IDLE_MS))
        && client_announced(&mut client_owner, peer, local, by)
    {
        t.broken.retain(|_, at| now.duration_since(*at) < PENALTY);
        t.broken.insert(by, now);
    }
    Err(out)
}

/// The end of a handover to a forked child: it took the connection (`ok`: the door
/// commits) or not (the door declines, and the client stays on TCP).
pub fn handed(local: SocketAddr, peer: SocketAddr, ok: bool) {
    let (m, cv) = table();
    let mut t = m.lock().unwrap_or_else(|p| p.into_inner());
    t.handing.remove(&(local, peer));
    if ok {
        t.claimed.insert((local, peer));
    }
    cv.notify_all();
}

/// Whether user `by`'s announcement of the connection from `peer` to `local` is the
/// client's own: its client end is owned by `by`, or is not in this namespace. `owner`
/// keeps sock_diag's answer, asked once.
fn client_announced(owner: &mut Option<Option<u32>>, peer: SocketAddr, local: SocketAddr, by: u32) -> bool {
    let o =
        *owner.get_or_insert_with(|| diag::Diag::open().and_then(|d| d.owned_connection(peer, local)).map(|f| f.uid));
    o.is_none_or(|uid| uid == by)
}

const PENALTY: Duration = Duration::from_millis(PENALTY_MS);

/// Ports this process listens on (the door accepts proposals for these only).
pub fn listening_ports() -> &'static Mutex<Vec<u16>> {
    static P: OnceLock<Mutex<Vec<u16>>> = OnceLock::new();
    P.get_or_init(|| Mutex::new(Vec::new()))
}

/// Starts this process's door thread (once).
pub fn start_door() {
    // The pid whose door runs: a child forked after its parent started one has no door
    // thread of its own (threads do not survive fork) and gets one at its first `listen`.
    static STARTED: Mutex<u32> = Mutex::new(0);
    let mut started = STARTED.lock().unwrap_or_else(|p| p.into_inner());
    let me = sys::pid();
    if *started == me {
        return;
    }
    let ok = (|| {
        let path = registry::door_path(sys::pid());
        // A leftover of a process that had our pid (only its owner or root can remove it).
        let _ = std::fs::remove_file(&path);
        let Some(sa) = unix_addr(&path) else { return false };
        // SAFETY: plain socket calls on a descriptor we own.
        let fd = unsafe { crate::real::socket(sys::AF_UNIX, sys::SOCK_SEQPACKET | sys::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return false;
        }
        // SAFETY: `sa` is a complete sockaddr_un.
        let ok = unsafe {
            crate::real::bind(fd, sa.as_ptr().cast(), sa.len() as u32) == 0 && crate::real::listen(fd, 128) == 0
        };
        if !ok {
            sys::close(fd);
            return false;
        }
        // Only the users the fast path is open to may knock (the door also checks who
        // knocked); a group's door is the group's.
        use std::os::unix::fs::PermissionsExt;
        let group = registry::policy().and_then(|p| p.group);
        let mode = if group.is_some() { access::DOOR_MODE_GROUP } else { access::DOOR_MODE_OWNER };
        if std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).is_err() {
            sys::close(fd);
            return false;
        }
        if let Some(g) = group {
            let _ = std::os::unix::fs::chown(&path, None, Some(g));
        }
        std::thread::Builder::new()
            .name("sluice-smc-door".into())
            .spawn(move || {
                // (The handshake threads it starts inherit the mask.)
                sys::block_signals();
                door_loop(fd)
            })
            .is_ok()
    })();
    if ok {
        *started = me;
    }
}

/// Handshakes in flight at most: beyond this a door connection is closed at once, so a
/// flood of connections that send nothing costs a bounded number of threads.
const MAX_HANDSHAKES: usize = 1024;

static IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);

/// Runs `work` on a thread of its own, unless [`MAX_HANDSHAKES`] are in flight already
/// (then false, and `work` is dropped unrun). A panic in it ends only its thread.
pub(crate) fn spawn_handshake(name: &str, work: impl FnOnce() + Send + 'static) -> bool {
    if IN_FLIGHT.fetch_add(1, Ordering::SeqCst) >= MAX_HANDSHAKES {
        IN_FLIGHT.fetch_sub(1, Ordering::SeqCst);
        return false;
    }
    let spawned = std::thread::Builder::new().name(name.into()).spawn(move || {
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(work));
        IN_FLIGHT.fetch_sub(1, Ordering::SeqCst);
    });
    if spawned.is_err() {
        IN_FLIGHT.fetch_sub(1, Ordering::SeqCst);
    }
    spawned.is_ok()
}

fn door_loop(fd: c_int) {
    loop {
        // Taking no door connections while the reaper is behind: clients find the door
        // full and stay on TCP at once (they do not wait on it).
        if foreign::congested() {
            std::thread::sleep(Duration::from_millis(50));
            continue;
        }
        // SAFETY: accept on our own listening socket.
        let c = unsafe { crate::real::accept4(fd, std::ptr::null_mut(), std::ptr::null_mut(), sys::SOCK_CLOEXEC) };
        if c < 0 {
            match sys::errno() {
                sys::EINTR | sys::EAGAIN | sys::ECONNABORTED => {}
                // Out of descriptors or memory: the door stays, and takes connections
                // again when there are.
                sys::EMFILE | sys::ENFILE | sys::ENOBUFS | sys::ENOMEM => {
                    std::thread::sleep(Duration::from_millis(50));
                }
                // The descriptor is no longer our door: nobody can be answered.
                _ => {
                    let _ = std::fs::remove_file(registry::door_path(sys::pid()));
                    return;
                }
            }
            continue;
        }
        // One thread per handshake: a slow client or a slow `accept` delays no other.
        let spawned = spawn_handshake("sluice-smc-hs", move || {
            if let Ok(Err(reason)) = std::panic::catch_unwind(|| serve(c)) {
                crate::stats::fallback(reason, true);
            }
            foreign::quiesce(c);
        });
        if !spawned {
            crate::stats::fallback(Reason::NoMemory, true);
            foreign::quiesce(c);
        }
    }
}

/// The server's half for one proposal on door connection `c`. Everything the proposer
/// sent that is not kept is let go through [`foreign::release`].
fn serve(c: c_int) -> Result<(), Reason> {
    let (m, fds) = recv_msg(c, TIMEOUT_MS)?;
    if crate::fault("server-no-answer") {
        foreign::release_all(&fds);
        return Err(Reason::Protocol);
    }
    if crate::fault("server-slow-answer") {
        std::thread::sleep(Duration::from_millis(TIMEOUT_MS as u64 + 200));
    }
    let Msg::Proposal { token, tuple, rmem: peer_r, tmem: peer_t, .. } = m else {
        foreign::release_all(&fds);
        return Err(Reason::Protocol);
    };
    let fail = |reason: Reason, fds: &[c_int]| {
        foreign::release_all(fds);
        decline(c, token, reason);
        Err(reason)
    };
    // Ring, doorbell end, and the TCP socket that proves the proposer holds the connection.
    if fds.len() != 3 {
        return fail(Reason::Unproven, &fds);
    }
    let proven = verify_proposer(c, tuple, fds[2]);
    foreign::release(fds[2]);
    if let Err(reason) = proven {
        return fail(reason, &fds[..2]);
    }
    if crate::listener_zerocopy(tuple.server.port()) {
        // Decided before the first byte: its completions would need POLLERR.
        return fail(Reason::ZeroCopy, &fds[..2]);
    }
    if !take_doorbell(fds[1]) {
        return fail(Reason::Protocol, &fds[..2]);
    }
    let key = (tuple.server, tuple.client);
    // One handshake per connection at a time; `accept` waits while this one lasts.
    let Some(_working) = Working::begin(key) else { return fail(Reason::Ambiguous, &fds[..2]) };
    // Our ring starts as large as the client's send buffer wishes, and grows to our maximum.
    let (r, _) = settings();
    let r = r.max((peer_t as usize).min(sluice_smc::size::MAX)).next_power_of_two().min(sluice_smc::size::MAX);
    let rmax = crate::maxima().0.max(r);
    let (tx_shm, tx) = match map_ring(fds[0], peer_r as usize) {
        Ok(x) => x,
        Err(e) => return fail(e, &fds[1..2]),
    };
    let peer_bell = fds[1];
    let (rx_shm, rx) = match new_ring(rmax, r) {
        Ok(x) => x,
        Err(e) => return fail(e, &[peer_bell]),
    };
    let Ok(side) = Side::new() else { return fail(Reason::NoMemory, &[peer_bell]) };
    let (app_end, bell) = match doorbell() {
        Ok(x) => x,
        Err(e) => return fail(e, &[peer_bell]),
    };
    let accept = Msg::Accept { token, rmem: rmax as u32, pid: sys::pid() };
    let sent = sys::send_with_fds(c, &accept.encode(), &[rx_shm.fd, bell]);
    sys::close(bell);
    if sent.is_err() {
        sys::close(app_end);
        return fail(Reason::DoorUnreachable, &[peer_bell]);
    }
    match recv_msg(c, TIMEOUT_MS) {
        Ok((Msg::Confirm { token: t2 }, extra)) if t2 == token => {
            foreign::release_all(&extra);
        }
        Ok((_, extra)) => {
            foreign::release_all(&extra);
            sys::close(app_end);
            foreign::release(peer_bell);
            return Err(Reason::PeerDeclined);
        }
        Err(e) => {
            sys::close(app_end);
            foreign::release(peer_bell);
            return Err(e);
        }
    }
    let tmem = tx.capacity();
    // The TCP socket is filled in by `accept`.
    let conn = Conn::new(rx_shm, rx, tx_shm, tx, side, peer_bell);
    // A program that is accepting takes its connections in turn: commit at once, and let
    // `accept` (or a child's claim) take the connection when it comes to it — the client
    // is not kept waiting for that. One that is not accepting may never take it: commit
    // only once it claims.
    let committed = accepting();
    let (m, cv) = table();
    let mut t = m.lock().unwrap_or_else(|p| p.into_inner());
    t.ready.insert(key, Prepared { conn, app_end, rmem: r, tmem, committed });
    cv.notify_all();
    let start = Instant::now();
    let deadline = start + Duration::from_millis(CLAIM_LIMIT_MS);
    if committed {
        drop(t);
        let _ = sys::send_with_fds(c, &Msg::Confirm { token }.encode(), &[]);
        // Taken in time, or dropped: the client then sees its connection end, as a TCP
        // connection ends that a listener never accepts.
        let mut t = m.lock().unwrap_or_else(|p| p.into_inner());
        while t.ready.contains_key(&key) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                let p = t.ready.remove(&key);
                drop(t);
                drop(p);
                return Err(Reason::Timeout);
            }
            t = cv.wait_timeout(t, left.min(Duration::from_millis(50))).unwrap_or_else(|p| p.into_inner()).0;
        }
        return Ok(());
    }
    // Wait for `accept` in this process to claim it: as long as the program is
    // accepting (a busy server reaches this connection in its turn), briefly if not.
    let idle_after = start + Duration::from_millis(CLAIM_IDLE_MS);
    loop {
        if t.claimed.remove(&key) {
            drop(t);
            // Committed. If the client is gone, the connection's doorbell says so.
            let _ = sys::send_with_fds(c, &Msg::Confirm { token }.encode(), &[]);
            return Ok(());
        }
        if t.handing.contains(&key) {
            // A child claimed it: its answer comes within a message's time.
        } else if !t.ready.contains_key(&key) {
            // A child claimed it and did not take it.
            drop(t);
            decline(c, token, Reason::NoProposal);
            return Err(Reason::Protocol);
        } else {
            let now = Instant::now();
            let idle = now >= idle_after && !accepting();
            if now >= deadline || idle {
                let p = t.ready.remove(&key);
                drop(t);
                drop(p);
                decline(c, token, Reason::NoProposal);
                return Err(if idle { Reason::NotAccepting } else { Reason::Timeout });
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        t = cv
            .wait_timeout(t, left.clamp(Duration::from_millis(1), Duration::from_millis(50)))
            .unwrap_or_else(|p| p.into_inner())
            .0;
    }
}

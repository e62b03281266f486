//! The server's side door (docs/architecture.md, "Connections at TCP's cost"): a unix
//! `SOCK_SEQPACKET` listener `door/PID.sock` that client processes keep one connection
//! to each (an association). Nothing here runs on a thread of its own: `accept` drains
//! the door ([`take`]) — new associations, and the ANNOUNCE and PROOF messages clients
//! sent before and just after their SYN — and finds the proposal of the connection it
//! just accepted.
//!
//! What a client sent is a hint until proven. When the connection's client end is in
//! this namespace the kernel shows it (`sock_diag`): its cookie names the announcement,
//! and its owner must be the announcing association's user — nobody can announce another
//! user's connection. It shows it too once its program has closed it (a client may send
//! everything and close before `accept` runs), held by no process then: nobody's to
//! announce (an honest client holds its socket until the server decides). When it is
//! not, the proposal is taken only with the client socket in hand (PROOF, sent right
//! after the SYN; waited for, briefly), matched by its addresses, and the proposer must be
//! root or this user. Everything a client sent that is not kept is let go through
//! [`crate::foreign::release`].

use std::collections::HashMap;
use std::ffi::c_int;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sluice_smc::access::{self, Cred};
use sluice_smc::msg::{Msg, Reason};
use sluice_smc::slot::{self, Geometry, State};

use crate::arena::Arena;
use crate::{diag, foreign, registry, sys};

/// How long `accept` waits for the PROOF of an ANNOUNCE it has: the client sends it right
/// after its SYN, so it is on its way — unless the client lies.
pub const PROOF_WAIT_MS: u64 = 50;
/// How long a user whose announcement made `accept` wait for nothing is not waited for.
pub const PENALTY_MS: u64 = 60_000;
/// Announcements and proofs no connection took within this are let go.
const STALE_MS: u64 = 10_000;
/// Per association: pending announcements and proofs, and arenas mapped.
const MAX_PENDING: usize = 512;
const MAX_ARENAS: usize = 16;
/// Associations at once.
const MAX_PEERS: usize = 4096;

struct Announce {
    cookie: u64,
    slot: u32,
    generation: u32,
    pid: u32,
    arena: Arc<Arena>,
    arena_fd: c_int,
    bell: c_int,
    app_end: c_int,
    at: Instant,
    /// Its client is in another namespace: a proof follows (across the namespaces).
    proof_follows: bool,
}

struct Proof {
    /// The passed socket's own cookie (not what the message claimed).
    cookie: u64,
    tcp: c_int,
    /// The passed socket's own address (it has one from its SYN on).
    local: Option<SocketAddr>,
    /// The address it is connected to: asked when needed, kept once known. (Not before:
    /// a socket whose SYN is still on its way — a slow path, a busy switch — has none
    /// yet, and a lookup that failed then must not stand for the connection it becomes.)
    peer: Option<SocketAddr>,
    at: Instant,
}

impl Proof {
    fn new(cookie: u64, tcp: c_int) -> Proof {
        Proof { cookie, tcp, local: sys::sock_addr(tcp, false), peer: None, at: Instant::now() }
    }

    /// Whether the passed socket is the client end of the connection from `client` to
    /// `server` (compared by its own address first: no system call for the others).
    fn is_of(&mut self, client: SocketAddr, server: SocketAddr) -> bool {
        self.local == Some(client) && self.peer() == Some(server)
    }

    /// The address the passed socket is connected to, once it is.
    fn peer(&mut self) -> Option<SocketAddr> {
        if self.peer.is_none() {
            self.peer = sys::sock_addr(self.tcp, true);
        }
        self.peer
    }
}

/// One client process's association.
struct Peer {
    fd: c_int,
    cred: Cred,
    /// It sent a proof: its client is in another namespace (the watcher keeps an eye on it).
    across: bool,
    arenas: Vec<Arc<Arena>>,
    announces: Vec<Announce>,
    proofs: Vec<Proof>,
}

struct Door {
    pid: u32,
    listen: c_int,
    epfd: c_int,
    /// What the door's watcher sleeps on: the listener, and each association until it
    /// shows it talks across namespaces (then for as long as it lives).
    watch_epfd: c_int,
    peers: HashMap<c_int, Peer>,
    /// Users whose announcements lapsed while `accept` waited, and when.
    penalized: HashMap<u32, Instant>,
    /// Connections from clients in other namespaces that `accept` kept on TCP without a
    /// proposal — (client, server) addresses, when, and why: a proof of one that comes
    /// later has its announcement declined at once, so its client goes to TCP too
    /// instead of waiting for a decision.
    kept: HashMap<(SocketAddr, SocketAddr), (Instant, Reason)>,
    /// Descriptors held for clients (associations, and what their announcements and
    /// proofs brought), counted at each pump and added to as more come in it.
    held: usize,
}

/// The most descriptors the door holds for its clients: a quarter of the process's limit
/// (as it was when the door opened), so clients cannot take the descriptors the program
/// needs for its own connections — a program that runs out cannot `accept` even plain TCP.
fn budget() -> usize {
    static B: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *B.get_or_init(|| (sys::fd_limit() / 4).clamp(64, 65536) as usize)
}

/// Connections [`Door::kept`] remembers at most.
const MAX_KEPT: usize = 4096;

static DOOR: Mutex<Option<Door>> = Mutex::new(None);

/// A proposal `accept` found, proven, for the connection it accepted.
pub struct Taken {
    pub arena: Arc<Arena>,
    /// The announcement's copy of the arena's memfd (handed to a forked child that claims
    /// the connection; closed otherwise). -1 once closed.
    pub arena_fd: c_int,
    pub slot: u32,
    pub generation: u32,
    pub pid: u32,
    /// The end of the client's pair that rings it (and where its filler arrives).
    pub bell: c_int,
    /// The server's pair's end that becomes the application's descriptor.
    pub app_end: c_int,
}

impl Taken {
    /// The server declines: the client learns it from the slot's word (and its end of the
    /// pair closing); the connection stays TCP.
    pub fn decline(mut self, reason: Reason) {
        if let Some(c) = self.arena.control(self.slot) {
            c.decide(self.generation, State::Declined, reason as u8);
            c.server_done(self.generation);
            sys::futex_wake(c.word_atomic());
        }
        foreign::release(self.bell);
        foreign::release(self.app_end);
        self.bell = -1;
        self.app_end = -1;
    }

    /// Lets the announcement's memfd go (the mapping keeps the memory).
    pub fn close_arena_fd(&mut self) {
        if self.arena_fd >= 0 {
            sys::close(self.arena_fd);
            self.arena_fd = -1;
        }
    }
}

impl Drop for Taken {
    fn drop(&mut self) {
        self.close_arena_fd();
        for fd in [self.bell, self.app_end] {
            if fd >= 0 {
                foreign::release(fd);
            }
        }
    }
}

/// Opens this process's door at its first `listen` (a forked child that listens gets its
/// own: the inherited one is its parent's).
pub fn start() {
    let mut g = DOOR.lock().unwrap_or_else(|p| p.into_inner());
    let me = sys::pid();
    if g.as_ref().is_some_and(|d| d.pid == me) {
        return;
    }
    if let Some(old) = g.take() {
        // The parent's, inherited: our copies of its descriptors go (not its door file).
        old.close_all();
    }
    *g = open(me);
}

fn open(me: u32) -> Option<Door> {
    let path = registry::door_path(me);
    // A leftover of a process that had our pid (only its owner or root can remove it).
    let _ = std::fs::remove_file(&path);
    let sa = sys::unix_addr(&path)?;
    // SAFETY: plain socket calls on descriptors we own.
    let fd =
        unsafe { crate::real::socket(sys::AF_UNIX, sys::SOCK_SEQPACKET | sys::SOCK_CLOEXEC | sys::SOCK_NONBLOCK, 0) };
    if fd < 0 {
        return None;
    }
    // SAFETY: `sa` is a complete sockaddr_un.
    let ok = unsafe {
        crate::real::bind(fd, sa.as_ptr().cast(), sa.len() as u32) == 0 && crate::real::listen(fd, 1024) == 0
    };
    // Only the users the fast path is open to may knock (each association's credentials
    // are checked too); a group's door is the group's.
    use std::os::unix::fs::PermissionsExt;
    let group = registry::policy().and_then(|p| p.group);
    let mode = if group.is_some() { access::DOOR_MODE_GROUP } else { access::DOOR_MODE_OWNER };
    if !ok || std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).is_err() {
        sys::close(fd);
        let _ = std::fs::remove_file(&path);
        return None;
    }
    if let Some(g) = group {
        let _ = std::os::unix::fs::chown(&path, None, Some(g));
    }
    let listen = sys::move_high(fd);
    let (epfd, watch_epfd) = (sys::epoll_create(), sys::epoll_create());
    if epfd < 0 || watch_epfd < 0 || !sys::epoll_add(epfd, listen) || !sys::epoll_add(watch_epfd, listen) {
        for fd in [listen, epfd, watch_epfd] {
            sys::close(fd);
        }
        let _ = std::fs::remove_file(&path);
        return None;
    }
    let started = std::thread::Builder::new().name("sluice-smc-door".into()).spawn(move || {
        sys::block_signals();
        watch(me, watch_epfd)
    });
    if started.is_err() {
        for fd in [listen, epfd, watch_epfd] {
            sys::close(fd);
        }
        let _ = std::fs::remove_file(&path);
        return None;
    }
    Some(Door {
        pid: me,
        listen,
        epfd,
        watch_epfd,
        peers: HashMap::new(),
        penalized: HashMap::new(),
        kept: HashMap::new(),
        held: 0,
    })
}

/// How long a proof may wait for its connection to show up in this namespace before the
/// watcher declines it (the proof outruns the SYN through a switch by microseconds).
const UNSEEN_MS: u64 = 100;

/// `TCP_INFO`'s state of a socket whose SYN is out and not yet answered.
const TCP_SYN_SENT: u8 = 2;
/// `TCP_INFO`'s state of a connected socket.
const TCP_ESTABLISHED: u8 = 1;

/// The door's watcher: a thread that looks after clients in other namespaces, whose
/// proposals may name connections that never reach this process (a listener of the same
/// address elsewhere, the one their connection really reaches). It sleeps until the door
/// has something for it — a new association, an association's first message, any
/// message of one across namespaces — and declines the proofs whose connections this
/// namespace does not have, so their clients stay on TCP at once instead of waiting for
/// a decision that would never come. Associations within the namespace wake it once.
fn watch(me: u32, watch_epfd: c_int) {
    let mut ready = [0u64; 64];
    loop {
        let waiting = {
            let g = DOOR.lock().unwrap_or_else(|p| p.into_inner());
            match g.as_ref() {
                Some(d) if d.pid == me && d.watch_epfd == watch_epfd => d.peers.values().any(|p| !p.proofs.is_empty()),
                // The door is gone (or this is a forked child's copy of the thread's fds).
                _ => return,
            }
        };
        let n = sys::epoll_ready(watch_epfd, &mut ready, if waiting { UNSEEN_MS as i32 / 2 } else { -1 });
        let mut g = DOOR.lock().unwrap_or_else(|p| p.into_inner());
        let Some(d) = g.as_mut().filter(|d| d.pid == me) else { return };
        let _ = d.pump();
        for &fd in &ready[..n] {
            let fd = fd as c_int;
            if let Some(p) = d.peers.get(&fd).filter(|p| p.across) {
                sys::epoll_rearm(watch_epfd, p.fd);
            }
        }
        d.decline_unseen();
    }
}

impl Door {
    /// Declines the proposals whose proofs name connections this namespace does not have
    /// (after [`UNSEEN_MS`]: the SYN may still be on its way).
    fn decline_unseen(&mut self) {
        let now = Instant::now();
        for p in self.peers.values_mut() {
            let mut i = 0;
            while i < p.proofs.len() {
                let q = &mut p.proofs[i];
                if now.duration_since(q.at) < Duration::from_millis(UNSEEN_MS) {
                    i += 1;
                    continue;
                }
                let here = match (q.local, q.peer()) {
                    // The server end of the connection, as this namespace would hold it.
                    (Some(client), Some(server)) => diag::with(|d| d.connection(server, client)).is_some(),
                    // Its SYN not answered yet (a slow path): not known to be elsewhere; it
                    // goes when it is, or stale.
                    _ => sys::tcp_state(q.tcp) == Some(TCP_SYN_SENT),
                };
                if here {
                    i += 1;
                    continue;
                }
                let q = p.proofs.remove(i);
                if let Some(ai) = p.announces.iter().position(|a| a.cookie == q.cookie) {
                    drop_announce(p.announces.remove(ai), Reason::NotOurConnection);
                    crate::stats::fallback(Reason::NotOurConnection, true);
                }
                foreign::release(q.tcp);
            }
        }
    }

    fn close_all(self) {
        for (_, p) in self.peers {
            sys::close(p.fd);
            for a in p.announces {
                sys::close(a.arena_fd);
                sys::close(a.bell);
                sys::close(a.app_end);
            }
            for q in p.proofs {
                sys::close(q.tcp);
            }
        }
        sys::close(self.listen);
        sys::close(self.epfd);
        sys::close(self.watch_epfd);
    }

    /// Takes in what waits at the door: new associations, then every message queued on
    /// those that have some; lets go of what went stale. Answers how many of the door's
    /// descriptors were ready.
    fn pump(&mut self) -> usize {
        self.held = self.peers.values().map(|p| 1 + p.arenas.len() + 3 * p.announces.len() + p.proofs.len()).sum();
        let mut ready = [0u64; 64];
        let n = sys::epoll_ready(self.epfd, &mut ready, 0);
        for &fd in &ready[..n] {
            let fd = fd as c_int;
            if fd == self.listen {
                self.admit();
            } else if !self.read_peer(fd) {
                self.drop_peer(fd);
            }
        }
        let now = Instant::now();
        let stale = Duration::from_millis(STALE_MS);
        for p in self.peers.values_mut() {
            while p.announces.first().is_some_and(|a| now.duration_since(a.at) > stale) {
                let a = p.announces.remove(0);
                drop_announce(a, Reason::Timeout);
            }
            while p.proofs.first().is_some_and(|q| now.duration_since(q.at) > stale) {
                foreign::release(p.proofs.remove(0).tcp);
            }
        }
        n
    }

    /// Accepts the associations waiting at the door, from allowed users only.
    fn admit(&mut self) {
        let Some(policy) = registry::policy() else { return };
        for _ in 0..256 {
            // SAFETY: accept on our own listening socket.
            let c = unsafe {
                crate::real::accept4(
                    self.listen,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    sys::SOCK_CLOEXEC | sys::SOCK_NONBLOCK,
                )
            };
            if c < 0 {
                return;
            }
            // The library's from now on (a program's `closefrom` leaves it).
            let c = sys::own(c);
            let cred = sys::peer_cred(c).map(|(_, cred)| cred);
            let room = self.peers.len() < MAX_PEERS && self.held < budget();
            let Some(cred) = cred.filter(|c| policy.allows(c) && room) else {
                // (What it may have queued already is released off this thread.)
                foreign::quiesce(c);
                continue;
            };
            let c = sys::move_high(c);
            if !sys::epoll_add(self.epfd, c) || !sys::epoll_add_oneshot(self.watch_epfd, c) {
                sys::epoll_del(self.epfd, c);
                foreign::quiesce(c);
                continue;
            }
            let peer =
                Peer { fd: c, cred, across: false, arenas: Vec::new(), announces: Vec::new(), proofs: Vec::new() };
            self.peers.insert(c, peer);
            self.held += 1;
            // What it sent before we came (its first announcement, likely) is read now.
            if !self.read_peer(c) {
                self.drop_peer(c);
            }
        }
    }

    fn drop_peer(&mut self, fd: c_int) {
        let Some(p) = self.peers.remove(&fd) else { return };
        sys::epoll_del(self.epfd, fd);
        sys::epoll_del(self.watch_epfd, fd);
        for a in p.announces {
            drop_announce(a, Reason::DoorUnreachable);
        }
        for q in p.proofs {
            foreign::release(q.tcp);
        }
        foreign::quiesce(fd);
    }

    /// Reads what association `fd` sent; false when it ended (or broke the protocol).
    fn read_peer(&mut self, fd: c_int) -> bool {
        let Some(p) = self.peers.get_mut(&fd) else { return false };
        let mut buf = [0u8; 256];
        for _ in 0..256 {
            let (n, fds) = match sys::recv_with_fds_nowait(fd, &mut buf) {
                Ok(Some(x)) => x,
                Ok(None) => return true,
                Err(_) => return false,
            };
            if n == 0 && fds.is_empty() {
                return false;
            }
            match Msg::decode(&buf[..n]) {
                Ok(Msg::Announce { cookie, slot, generation, pid, geometry, flags }) if fds.len() == 3 => {
                    if flags & sluice_smc::msg::PROOF_FOLLOWS != 0 && !p.across {
                        // Its client is in another namespace: the watcher hears of this
                        // association's messages from now on (its proof comes next).
                        p.across = true;
                        sys::epoll_rearm(self.watch_epfd, fd);
                    }
                    match p.arena_for(fds[0], geometry, self.held < budget()) {
                        Some(arena) if slot < geometry.slots => {
                            if p.announces.len() >= MAX_PENDING {
                                drop_announce(p.announces.remove(0), Reason::NoMemory);
                            }
                            let at = Instant::now();
                            let (arena_fd, bell, app_end) = (fds[0], fds[1], fds[2]);
                            let a = Announce {
                                cookie,
                                slot,
                                generation,
                                pid,
                                arena,
                                arena_fd,
                                bell,
                                app_end,
                                at,
                                proof_follows: flags & sluice_smc::msg::PROOF_FOLLOWS != 0,
                            };
                            if self.held >= budget() {
                                // Declined at once: its client stays on TCP (and the server
                                // counts the connection when it accepts it).
                                drop_announce(a, Reason::NoMemory);
                                continue;
                            }
                            self.held += 3;
                            p.announces.push(a);
                        }
                        // Not an arena we can map (unsealed, of another length, not a memfd):
                        // the client sees its end of the pair close, and stays on TCP.
                        _ => {
                            crate::stats::fallback(Reason::BadSegment, true);
                            foreign::release_all(&fds);
                        }
                    }
                }
                Ok(Msg::Proof { cookie }) if fds.len() == 1 => {
                    let tcp = fds[0];
                    // A proof comes after its announcement (one socket, in order): without
                    // one it proves nothing any more (declined, or taken) and is let go —
                    // kept, it would hold the client's socket open after its client closed.
                    let announced = p.announces.iter().position(|a| a.cookie == cookie);
                    let (Some(ai), true) = (announced, sys::cookie(tcp) == Some(cookie) && crate::is_tcp(tcp)) else {
                        foreign::release(tcp);
                        continue;
                    };
                    let mut q = Proof::new(cookie, tcp);
                    // Its connection came to `accept` before it did, and stayed on TCP there.
                    if !self.kept.is_empty()
                        && let (Some(client), Some(server)) = (q.local, q.peer())
                        && let Some((_, why)) = self.kept.remove(&(client, server))
                    {
                        drop_announce(p.announces.remove(ai), why);
                        foreign::release(tcp);
                        continue;
                    }
                    if self.held >= budget() {
                        drop_announce(p.announces.remove(ai), Reason::NoMemory);
                        foreign::release(tcp);
                        continue;
                    }
                    if p.proofs.len() >= MAX_PENDING {
                        foreign::release(p.proofs.remove(0).tcp);
                    }
                    self.held += 1;
                    p.proofs.push(q);
                    if !p.across {
                        // From now on the watcher hears of this association's messages.
                        p.across = true;
                        sys::epoll_rearm(self.watch_epfd, fd);
                    }
                }
                _ => foreign::release_all(&fds),
            }
        }
        true
    }

    /// The proposal for the connection accepted with local address `local`, from `peer`,
    /// whose client end, when it is in this namespace, has cookie and owner `end` (no
    /// owner once no process holds it).
    fn find(&mut self, end: Option<ClientEnd>, local: SocketAddr, peer: SocketAddr) -> Found {
        if let Some((cookie, owner)) = end {
            // The client end is here: the kernel says whose socket it is, and the
            // announcement must come from that user (the socket was made before the SYN,
            // so its announcement is queued already: nothing to wait for). One whose
            // program closed it is nobody's: every announcement of it is let go.
            let mut found = Found::Nothing;
            let mut liars = Vec::new();
            for (&fd, p) in self.peers.iter() {
                let owns = owner == Some(p.cred.uid);
                for (ai, a) in p.announces.iter().enumerate().filter(|(_, a)| a.cookie == cookie) {
                    if owns && matches!(found, Found::Nothing) {
                        found = Found::Both { peer: fd, ai, qi: None, exact: true };
                    } else if !owns {
                        liars.push((fd, a.at));
                    }
                }
            }
            // Announcements of another user's socket are let go (their clients stay on TCP).
            if matches!(found, Found::Nothing) && !liars.is_empty() {
                found = Found::Liar;
            }
            for (fd, at) in liars {
                if let Some(p) = self.peers.get_mut(&fd)
                    && let Some(i) = p.announces.iter().position(|a| a.cookie == cookie && a.at == at)
                {
                    drop_announce(p.announces.remove(i), Reason::Unproven);
                }
            }
            if let Found::Both { peer, ref mut ai, .. } = found {
                *ai = self.peers[&peer].announces.iter().position(|a| a.cookie == cookie).unwrap_or(*ai);
            }
            return found;
        }
        for (&fd, p) in self.peers.iter_mut() {
            for (qi, q) in p.proofs.iter_mut().enumerate() {
                if q.is_of(peer, local) {
                    let cookie = q.cookie;
                    return match p.announces.iter().position(|a| a.cookie == cookie) {
                        Some(ai) => Found::Both { peer: fd, ai, qi: Some(qi), exact: false },
                        None => Found::Nothing,
                    };
                }
            }
        }
        Found::Nothing
    }

    /// The announcements that may be the connection `accept` has just taken, from a
    /// client in another namespace, when its proof is not here: those across namespaces
    /// made lately (before its SYN, so they are here already), still open, without a
    /// proof yet — by association and cookie.
    fn candidates(&self) -> Vec<(c_int, u64)> {
        let now = Instant::now();
        let mut c = Vec::new();
        for (&fd, p) in &self.peers {
            for a in &p.announces {
                // (Fresh for twice the wait, so one `accept` waiting on it sees it lapse.)
                let fresh = now.duration_since(a.at) < Duration::from_millis(2 * PROOF_WAIT_MS);
                if a.proof_follows && fresh && a.open() && !p.proofs.iter().any(|q| q.cookie == a.cookie) {
                    c.push((fd, a.cookie));
                }
            }
        }
        c
    }

    /// The user of candidate `(fd, cookie)` while it still waits for its proof.
    fn unproven(&self, (fd, cookie): (c_int, u64)) -> Option<u32> {
        let p = self.peers.get(&fd)?;
        let open = p.announces.iter().any(|a| a.cookie == cookie && a.open());
        (open && !p.proofs.iter().any(|q| q.cookie == cookie)).then_some(p.cred.uid)
    }

    /// Remembers a connection from a client in another namespace that `accept` kept on
    /// TCP (for `why`) without finding its proposal: [`Door::kept`].
    fn keep(&mut self, client: SocketAddr, server: SocketAddr, why: Reason) {
        let now = Instant::now();
        if self.kept.len() >= MAX_KEPT {
            self.kept.retain(|_, (at, _)| now.duration_since(*at) < Duration::from_millis(STALE_MS));
        }
        if self.kept.len() >= MAX_KEPT {
            // Still full of fresh ones: the oldest goes (its proof, if it ever comes, waits
            // to go stale instead).
            if let Some(k) = self.kept.iter().min_by_key(|(_, (at, _))| *at).map(|(k, _)| *k) {
                self.kept.remove(&k);
            }
        }
        self.kept.insert((client, server), (now, why));
    }
}

impl Announce {
    /// Whether its client still waits for a decision (it abandons one it could not prove).
    fn open(&self) -> bool {
        self.arena.control(self.slot).is_some_and(|c| c.word() == slot::pack(self.generation, State::Proposed, 0))
    }
}

/// The client end of an accepted connection as `sock_diag` shows it in this namespace:
/// its cookie, and its owner's uid while a process holds it.
type ClientEnd = (u64, Option<u32>);

enum Found {
    /// The announcement, and the proof when the client end is not in this namespace.
    Both {
        peer: c_int,
        ai: usize,
        qi: Option<usize>,
        exact: bool,
    },
    /// Only announcements by another user than the one whose socket it is.
    Liar,
    Nothing,
}

impl Peer {
    /// The arena in memfd `fd`: one this association sent before (the same file), or a
    /// new one, mapped once it is shown to be sealed and of the arena's length — if there
    /// is `room` among the door's descriptors (a mapped arena keeps one, crate::carry).
    fn arena_for(&mut self, fd: c_int, geometry: Geometry, room: bool) -> Option<Arc<Arena>> {
        let id = sys::file_id(fd)?;
        if let Some(a) = self.arenas.iter().find(|a| a.id == id) {
            return (a.geometry == geometry).then(|| a.clone());
        }
        if self.arenas.len() >= MAX_ARENAS || !room {
            return None;
        }
        let a = Arc::new(Arena::map_shared(fd, geometry).ok()?);
        self.arenas.push(a.clone());
        Some(a)
    }
}

/// Lets an announcement go without a connection: its slot is declined (the client, if it
/// still waits, stays on TCP) and let go of.
fn drop_announce(a: Announce, reason: Reason) {
    let t = Taken {
        arena: a.arena,
        arena_fd: a.arena_fd,
        slot: a.slot,
        generation: a.generation,
        pid: a.pid,
        bell: a.bell,
        app_end: a.app_end,
    };
    t.decline(reason);
}

/// True when this process's door holds no announcement, read or waiting to be read (a
/// connection accepted now was then announced by nobody: announcements come before their
/// SYN).
pub fn nothing_announced() -> bool {
    let mut g = DOOR.lock().unwrap_or_else(|p| p.into_inner());
    let me = sys::pid();
    let Some(door) = g.as_mut().filter(|d| d.pid == me) else { return true };
    // Nothing was ready: nothing can be waiting unread (what arrives from now on is for
    // later connections).
    if door.pump() == 0 {
        return door.peers.values().all(|p| p.announces.is_empty());
    }
    door.nothing_announced()
}

/// The proposal for the connection just accepted (local address `local`, peer `peer`),
/// proven: the connection's client socket in hand, its user allowed. Waits (at most
/// [`PROOF_WAIT_MS`]) only for the proofs of announcements that may be this
/// connection's; a user whose announcement lapsed that way is not waited for during
/// [`PENALTY_MS`]. A connection from another namespace kept on TCP is remembered, so
/// that its client, if its proof comes later, learns it at once ([`Door::kept`]).
pub fn take(local: SocketAddr, peer: SocketAddr) -> Result<Taken, Reason> {
    let mut g = DOOR.lock().unwrap_or_else(|p| p.into_inner());
    let me = sys::pid();
    let Some(door) = g.as_mut().filter(|d| d.pid == me) else { return Err(Reason::NoProposal) };
    let _ = door.pump();
    if door.nothing_announced() {
        // Announcements come before their SYN: none here means none for this connection,
        // and no `sock_diag` lookup is needed to say so.
        return Err(Reason::NoProposal);
    }
    // The client end, if it is in this namespace (its owner while a process holds it).
    let end = diag::with(|d| d.client_end(peer, local)).map(|f| (f.cookie, (f.inode != 0).then_some(f.uid)));
    let r = door.take(end, local, peer);
    if let (None, Err(why)) = (end, &r)
        && matches!(why, Reason::NoProposal | Reason::Timeout | Reason::Penalized)
    {
        door.keep(peer, local, *why);
    }
    r
}

impl Door {
    /// True when no announcement waits at the door, read or unread (a client's first
    /// association still in the door's queue, or messages not yet read, make its epoll
    /// instance ready).
    fn nothing_announced(&self) -> bool {
        self.peers.values().all(|p| p.announces.is_empty()) && sys::epoll_ready(self.epfd, &mut [0u64; 1], 0) == 0
    }

    /// [`take`], the door pumped and the client end looked up.
    fn take(&mut self, end: Option<ClientEnd>, local: SocketAddr, peer: SocketAddr) -> Result<Taken, Reason> {
        // Across namespaces: which announcements to wait for, if the proof is not here.
        // Those made since this connection's SYN cannot be its own, so they are fixed now.
        let candidates = if end.is_none() { self.candidates() } else { Vec::new() };
        let deadline = Instant::now() + Duration::from_millis(PROOF_WAIT_MS);
        loop {
            match self.find(end, local, peer) {
                Found::Both { peer: pfd, ai, qi, exact } => return self.proven(pfd, ai, qi, exact),
                Found::Liar => return Err(Reason::Unproven),
                Found::Nothing => {}
            }
            let now = Instant::now();
            let penalty = Duration::from_millis(PENALTY_MS);
            let waiting: Vec<u32> = candidates.iter().filter_map(|&c| self.unproven(c)).collect();
            let (punished, owed): (Vec<u32>, Vec<u32>) = waiting
                .iter()
                .partition(|uid| self.penalized.get(uid).is_some_and(|t| now.duration_since(*t) < penalty));
            if owed.is_empty() {
                return Err(if punished.is_empty() { Reason::NoProposal } else { Reason::Penalized });
            }
            if now >= deadline {
                self.penalized.retain(|_, t| now.duration_since(*t) < penalty);
                for uid in owed {
                    self.penalized.insert(uid, now);
                }
                return Err(Reason::Timeout);
            }
            let left = deadline.saturating_duration_since(now).as_millis().clamp(1, 5) as i32;
            let mut ready = [0u64; 1];
            sys::epoll_ready(self.epfd, &mut ready, left);
            let _ = self.pump();
        }
    }

    /// The proposal [`Door::find`] found (announcement `ai` of association `pfd`, with
    /// proof `qi` across namespaces), checked: the connection's, and its user allowed.
    fn proven(&mut self, pfd: c_int, ai: usize, qi: Option<usize>, exact: bool) -> Result<Taken, Reason> {
        let p = self.peers.get_mut(&pfd).ok_or(Reason::Protocol)?;
        let a = p.announces.remove(ai);
        let q = qi.map(|qi| p.proofs.remove(qi));
        let cred = p.cred.clone();
        let t = Taken {
            arena: a.arena,
            arena_fd: a.arena_fd,
            slot: a.slot,
            generation: a.generation,
            pid: a.pid,
            bell: a.bell,
            app_end: a.app_end,
        };
        // Across namespaces the addresses matched; the socket must also be a connection,
        // not a socket merely bound and connected elsewhere before.
        let established = exact || q.as_ref().is_some_and(|q| sys::tcp_state(q.tcp) == Some(TCP_ESTABLISHED));
        if let Some(q) = q {
            foreign::release(q.tcp);
        }
        if !established {
            t.decline(Reason::Unproven);
            return Err(Reason::Unproven);
        }
        if !registry::policy().is_some_and(|p| p.peer_allowed(&cred, sys::euid(), exact)) {
            t.decline(Reason::NotAllowed);
            return Err(Reason::NotAllowed);
        }
        Ok(t)
    }
}

/// A forked child's map of arenas handed to it with claimed connections (the same arena
/// comes with each connection of that client): mapped once each.
pub fn child_arena(fd: c_int, geometry: Geometry) -> Result<Arc<Arena>, Reason> {
    static CACHE: Mutex<Vec<std::sync::Weak<Arena>>> = Mutex::new(Vec::new());
    let id = sys::file_id(fd).ok_or(Reason::BadSegment)?;
    let mut c = CACHE.lock().unwrap_or_else(|p| p.into_inner());
    c.retain(|w| w.strong_count() > 0);
    if let Some(a) = c.iter().filter_map(|w| w.upgrade()).find(|a| a.id == id) {
        sys::close(fd);
        return if a.geometry == geometry { Ok(a) } else { Err(Reason::BadSegment) };
    }
    let a = Arena::map_shared(fd, geometry);
    sys::close(fd);
    let a = Arc::new(a?);
    c.push(Arc::downgrade(&a));
    Ok(a)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `struct sockaddr_in` for `a`.
    fn sockaddr_in(a: std::net::SocketAddrV4) -> [u8; 16] {
        let mut sa = [0u8; 16];
        sa[..2].copy_from_slice(&(sys::AF_INET as u16).to_ne_bytes());
        sa[2..4].copy_from_slice(&a.port().to_be_bytes());
        sa[4..8].copy_from_slice(&a.ip().octets());
        sa
    }

    /// A client in another namespace sends its proof right after its SYN; through a busy
    /// switch the SYN can take long enough for another connection's `accept` to look at
    /// the proof first, while the socket has its own address and no peer yet. The proof
    /// must still match its connection once that completes. (The first build remembered
    /// the failed lookup: the proof never matched, its connection stayed on TCP and its
    /// client waited for a decline — thousands of times a second under load.)
    #[test]
    fn a_proof_looked_at_before_its_socket_connected_matches_the_connection_it_becomes() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let server = l.local_addr().unwrap();
        let std::net::SocketAddr::V4(server4) = server else { unreachable!() };
        // SAFETY: a plain socket call; the descriptor is closed below.
        let fd = unsafe { crate::real::socket(sys::AF_INET, sys::SOCK_STREAM, 0) };
        assert!(fd >= 0);
        let here = sockaddr_in("127.0.0.1:0".parse().unwrap());
        // SAFETY: a complete sockaddr_in.
        assert_eq!(unsafe { crate::real::bind(fd, here.as_ptr().cast(), 16) }, 0);
        let mut q = Proof::new(7, fd);
        let client = q.local.expect("a bound socket has its own address");
        assert!(!q.is_of(client, server), "no connection yet");
        let to = sockaddr_in(server4);
        // SAFETY: a complete sockaddr_in.
        assert_eq!(unsafe { crate::real::connect(fd, to.as_ptr().cast(), 16) }, 0);
        assert!(q.is_of(client, server), "the proof, looked at again, names its connection");
        assert!(!q.is_of(client, "127.0.0.1:1".parse().unwrap()), "and no other");
        sys::close(fd);
    }
}

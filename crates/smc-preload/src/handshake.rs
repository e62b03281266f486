//! Proposing and taking a connection (docs/architecture.md, "Connections at TCP's cost"):
//! the client's half runs inside `connect` and waits for nothing — it announces the
//! connection before its SYN and proves it holds it right after; the server's half runs
//! inside `accept` (crate::door finds the proposal) and decides with one compare-and-swap
//! of the slot's control word.
//!
//! Neither side hands over memory before the kernel has shown it the other is the real
//! other end of the connection (docs/architecture.md, "The fast path's trust boundary"):
//! the client checks the door's owner against the listener its connection will reach
//! ([`verify_listener`]) before it sends anything; the server takes a proposal only with
//! the connection's client socket in hand (crate::door), and checks the arena's seals and
//! length before mapping it (crate::arena).

use std::ffi::c_int;
use std::net::SocketAddr;
use std::sync::Arc;

use sluice_smc::msg::{Msg, Reason};
use sluice_smc::ring::Ring;
use sluice_smc::slot::{Geometry, State};

use crate::arena::Arena;
use crate::assoc::{self, Assoc, SlotLease};
use crate::conn::{Conn, Role, Side};
use crate::door::Taken;
use crate::registry::Entry;
use crate::{diag, foreign, registry, sys};

/// The arena shape a client uses with the server of `entry`: its own receive buffer for
/// the server-to-client ring; for the client-to-server ring, what the server said it
/// receives with (its registry entry), at least our send buffer.
pub fn geometry_for(entry: &Entry) -> Geometry {
    let (r, t) = crate::settings();
    let (rmax, _) = crate::maxima();
    let pow = |v: usize| v.clamp(4096, sluice_smc::size::MAX).next_power_of_two() as u32;
    let cs_window = pow(entry.r.max(t));
    let cs_area = pow(entry.rmax).max(cs_window);
    Geometry { slots: sluice_smc::slot::MAX_SLOTS, cs_area, sc_area: pow(rmax), cs_window, sc_window: pow(r) }
}

/// The client's proof, before it sends a byte, that the door of association `a` belongs
/// to the listener its connection to `dst` will reach. The door's owner and credentials
/// were checked when the association was made. If `dst` is an address of our own
/// namespace, the connection ends here, at the listening socket the kernel chooses for it:
/// its owner must be the door's, and the door's process must hold it. Otherwise the
/// connection leaves the namespace, where no unprivileged call can see where it ends: the
/// door's owner must be root or our user.
///
/// Returns whether the connection ends in our namespace (then the server finds our
/// socket itself, by its cookie, and no proof follows the SYN).
pub fn verify_listener(dst: SocketAddr, a: &Assoc) -> Result<bool, Reason> {
    let policy = registry::policy().ok_or(Reason::NotAllowed)?;
    let exact = if diag::is_local(dst.ip()) {
        match diag::with(|d| d.listener(dst)) {
            Some(l) if l.uid == a.cred.uid && diag::holds(a.pid, l.inode) != Some(false) => true,
            Some(_) => return Err(Reason::WrongListener),
            // Nothing listens: the connection will be refused, and nothing is sent.
            None => return Err(Reason::WrongListener),
        }
    } else {
        false
    };
    if !policy.peer_allowed(&a.cred, sys::euid(), exact) {
        return Err(Reason::NotAllowed);
    }
    Ok(exact)
}

/// A connection announced, not yet proven (its SYN is next).
pub struct Proposal {
    pub assoc: Arc<Assoc>,
    pub lease: SlotLease,
    pub cookie: u64,
    /// Our end of our pair (the application's descriptor-to-be).
    pub app_end: c_int,
    /// The server's pair's other end (we ring it there, and drain its filler).
    pub peer_bell: c_int,
    pub rx: Ring,
    pub tx: Ring,
    /// The server is in another namespace: it cannot see our socket, so the socket itself
    /// follows the SYN (PROOF).
    pub needs_proof: bool,
}

impl Proposal {
    /// Lets the proposal go: given up on in the slot's word, so the server neither
    /// commits it nor waits for its proof (the connection stays on TCP; the server lets
    /// go of the slot when it finds no connection for it).
    pub fn abandon(self) {
        if let Some(c) = self.lease.arena.control(self.lease.slot) {
            c.decide(self.lease.generation, State::Abandoned, 0);
        }
        sys::close(self.app_end);
        sys::close(self.peer_bell);
    }
}

/// The client's announcement, before the SYN, of TCP socket `fd`'s connection to `dst`,
/// to the listener of registry entry `entry`.
pub fn announce(fd: c_int, dst: SocketAddr, entry: &Entry) -> Result<Proposal, Reason> {
    if foreign::congested() {
        return Err(Reason::NoMemory);
    }
    let a = assoc::get(entry, geometry_for(entry))?;
    let exact = verify_listener(dst, &a)?;
    let cookie = sys::cookie(fd).ok_or(Reason::Protocol)?;
    let lease = a.lease()?;
    let (tx, rx) = lease.arena.create_rings(lease.slot).map_err(|_| Reason::NoMemory)?;
    let control = lease.arena.control(lease.slot).ok_or(Reason::NoMemory)?;
    control.propose(lease.generation, sys::pid());
    // Two pairs: ours (our descriptor-to-be, and the end the server rings us through) and
    // the server's (its descriptor-to-be, and the end we ring it through).
    let (app_end, bell) = doorbell()?;
    let (their_app, peer_bell) = match doorbell() {
        Ok(x) => x,
        Err(e) => {
            sys::close(app_end);
            sys::close(bell);
            return Err(e);
        }
    };
    // The server drains our filler from its end of our pair; we drain its from ours.
    sys::refuse_rights(peer_bell);
    let m = Msg::Announce {
        cookie,
        slot: lease.slot,
        generation: lease.generation,
        pid: sys::pid(),
        flags: if exact { 0 } else { sluice_smc::msg::PROOF_FOLLOWS },
        geometry: lease.arena.geometry,
    };
    let sent = a.send(&m, &[lease.arena.fd(), bell, their_app]);
    sys::close(bell);
    sys::close(their_app);
    if let Err(e) = sent {
        sys::close(app_end);
        sys::close(peer_bell);
        return Err(e);
    }
    lease.announced.store(true, std::sync::atomic::Ordering::Relaxed);
    Ok(Proposal { assoc: a, lease, cookie, app_end, peer_bell, rx, tx, needs_proof: !exact })
}

/// The client's proof, once its SYN is out, when the server cannot see our socket: the
/// TCP socket itself (a socket that has sent its SYN cannot be connected elsewhere).
pub fn prove(p: &Proposal, fd: c_int) -> Result<(), Reason> {
    if !p.needs_proof {
        return Ok(());
    }
    if crate::fault("client-no-proof") {
        return Err(Reason::DoorUnreachable);
    }
    p.assoc.send(&Msg::Proof { cookie: p.cookie }, &[fd])
}

/// The connection of proposal `p`, pending until the server decides, and the
/// application's descriptor-to-be.
pub fn client_conn(p: Proposal) -> Result<(Conn, c_int), Reason> {
    let Proposal { lease, app_end, peer_bell, rx, tx, .. } = p;
    let Ok(side) = Side::new() else {
        sys::close(app_end);
        sys::close(peer_bell);
        return Err(Reason::NoMemory);
    };
    let (arena, slot, generation) = (lease.arena.clone(), lease.slot, lease.generation);
    match Conn::new(arena, slot, generation, rx, tx, side, peer_bell, Role::Client, Some(Box::new(lease))) {
        Some(c) => Ok((c, app_end)),
        None => {
            sys::close(app_end);
            Err(Reason::NoMemory)
        }
    }
}

/// A doorbell pair: (our descriptor-to-be, its other end).
fn doorbell() -> Result<(c_int, c_int), Reason> {
    let (a, b) = sys::socketpair(sys::SOCK_STREAM).map_err(|_| Reason::NoMemory)?;
    // A small send buffer: filler makes it unwritable quickly when the ring is full.
    sys::set_sockopt_int(a, sys::SOL_SOCKET, sys::SO_SNDBUF, 4096);
    // What the peer writes into the other end arrives here: bytes, never descriptors.
    sys::refuse_rights(a);
    Ok((a, b))
}

/// True when `fd`, one of the two socket ends the client made for the server, is fit to be
/// ours: a unix stream socket, which from now on refuses descriptors. (Any the client
/// queued before it was handed over arrive with the bytes its pending writes rang; every
/// read of ours takes them with room for them and lets them go off this thread —
/// crate::conn — so the peer cannot make a read of ours, or our close, release something
/// of its choosing.)
fn take_doorbell(fd: c_int) -> bool {
    let unix = sys::sockopt_int(fd, sys::SOL_SOCKET, sys::SO_DOMAIN) == Some(sys::AF_UNIX)
        && sys::sockopt_int(fd, sys::SOL_SOCKET, sys::SO_TYPE) == Some(sys::SOCK_STREAM);
    // (A kernel before 6.16 cannot refuse: docs/architecture.md, "What stays out of reach".)
    unix && {
        sys::refuse_rights(fd);
        true
    }
}

/// The server's half: commits the proposal `accept` found (crate::door), or declines it.
/// Returns the connection and the application's descriptor-to-be.
pub fn commit(mut t: Taken) -> Result<(Conn, c_int), Reason> {
    t.close_arena_fd();
    if crate::fault("server-decline") {
        t.decline(Reason::Protocol);
        return Err(Reason::Protocol);
    }
    if !take_doorbell(t.bell) || !take_doorbell(t.app_end) {
        t.decline(Reason::Protocol);
        return Err(Reason::Protocol);
    }
    sys::set_sockopt_int(t.app_end, sys::SOL_SOCKET, sys::SO_SNDBUF, 4096);
    let (rx, tx) = match t.arena.attach_rings(t.slot) {
        Ok(x) => x,
        Err(e) => {
            t.decline(e);
            return Err(e);
        }
    };
    let Ok(side) = Side::new() else {
        t.decline(Reason::NoMemory);
        return Err(Reason::NoMemory);
    };
    let bell = std::mem::replace(&mut t.bell, -1);
    let Some(conn) = Conn::new(t.arena.clone(), t.slot, t.generation, rx, tx, side, bell, Role::Server, None) else {
        t.decline(Reason::Protocol);
        return Err(Reason::Protocol);
    };
    let control = conn.control();
    if !control.decide(t.generation, State::Committed, 0) {
        // The client gave up on it first (it saw the connection go another way): TCP.
        control.server_done(t.generation);
        return Err(Reason::PeerDeclined);
    }
    control.set_server_pid(sys::pid());
    // A client waiting for the decision (a full ring, a dup) sleeps on the word.
    sys::futex_wake(control.word_atomic());
    let app_end = std::mem::replace(&mut t.app_end, -1);
    Ok((conn, app_end))
}

/// A forked child's arena, from a handover (crate::claim).
pub fn handed_arena(fd: c_int, g: Geometry) -> Result<Arc<Arena>, Reason> {
    crate::door::child_arena(fd, g)
}

//! The client's associations (docs/architecture.md, "Connections at TCP's cost"): for
//! each server process it talks to, one connected `SOCK_SEQPACKET` socket to that
//! process's side door (its credentials checked once, when it is made) and the arenas
//! whose slots its connections there use. A slot goes back to the association when its
//! connection ends and is used again once the server has let go of it too
//! (sluice_smc::slot), so nothing is created or mapped per connection.

use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};

use sluice_smc::access::Cred;
use sluice_smc::msg::{Msg, Reason};
use sluice_smc::slot::{self, Geometry};

use crate::arena::Arena;
use crate::registry::Entry;
use crate::{cabi, sys};

/// The most arenas one association makes (so the most connections it has at once to
/// one server process: this times the slots of an arena). Past it, new connections stay
/// on TCP (`no_memory`) until slots come back.
const MAX_ARENAS: usize = 8;

/// Slots an arena holds.
const SLOTS: u32 = slot::MAX_SLOTS;

#[derive(Clone, Copy)]
enum Use {
    /// Free; the generation it last had.
    Free(u32),
    /// A connection has it.
    Busy,
    /// Its connection ended here; free again once the server let go of this generation.
    Released { generation: u32, grew: bool },
}

struct Slots {
    arenas: Vec<(Arc<Arena>, Vec<Use>)>,
}

/// An association with one server process.
pub struct Assoc {
    /// The server's process (its door's).
    pub pid: u32,
    /// The door's credentials, as the kernel recorded them when we connected.
    pub cred: Cred,
    door: c_int,
    /// The process that made it (a forked child makes its own).
    me: u32,
    geometry: Geometry,
    slots: Mutex<Slots>,
    /// The door went away (the server exited): not used again.
    dead: AtomicBool,
}

impl Drop for Assoc {
    fn drop(&mut self) {
        sys::close(self.door);
    }
}

/// A slot an announcement is made for; given back when dropped (crate::conn::Lease).
pub struct SlotLease {
    assoc: Weak<Assoc>,
    pub arena: Arc<Arena>,
    arena_at: usize,
    pub slot: u32,
    pub generation: u32,
    /// The announcement reached the server (so it must let go before the slot is reused).
    pub announced: AtomicBool,
    grew: AtomicBool,
}

impl crate::conn::Lease for SlotLease {
    fn set_grew(&self) {
        self.grew.store(true, Ordering::Relaxed);
    }
}

impl Drop for SlotLease {
    fn drop(&mut self) {
        let Some(a) = self.assoc.upgrade() else { return };
        let mut s = a.slots.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(u) = s.arenas.get_mut(self.arena_at).and_then(|(_, v)| v.get_mut(self.slot as usize)) {
            *u = if self.announced.load(Ordering::Relaxed) {
                Use::Released { generation: self.generation, grew: self.grew.load(Ordering::Relaxed) }
            } else {
                Use::Free(self.generation)
            };
        }
    }
}

impl Assoc {
    /// A slot for a new connection: a free one, or one the server has let go of; a new
    /// arena when none is (up to [`MAX_ARENAS`]).
    pub fn lease(self: &Arc<Self>) -> Result<SlotLease, Reason> {
        let mut s = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        for (ai, (arena, uses)) in s.arenas.iter_mut().enumerate() {
            for (i, u) in uses.iter_mut().enumerate() {
                let last = match *u {
                    Use::Free(g) => g,
                    Use::Released { generation, grew } => {
                        let Some(c) = arena.control(i as u32) else { continue };
                        if !c.server_let_go(generation) {
                            continue;
                        }
                        if grew {
                            arena.trim(i as u32);
                        }
                        generation
                    }
                    Use::Busy => continue,
                };
                let generation = (last % slot::GEN_MASK) + 1;
                *u = Use::Busy;
                return Ok(self.lease_of(arena.clone(), ai, i as u32, generation));
            }
        }
        if s.arenas.len() >= MAX_ARENAS {
            return Err(Reason::NoMemory);
        }
        let arena = Arc::new(Arena::create(self.geometry)?);
        let mut uses = vec![Use::Free(0); SLOTS as usize];
        uses[0] = Use::Busy;
        s.arenas.push((arena.clone(), uses));
        Ok(self.lease_of(arena, s.arenas.len() - 1, 0, 1))
    }

    fn lease_of(self: &Arc<Self>, arena: Arc<Arena>, arena_at: usize, slot: u32, generation: u32) -> SlotLease {
        SlotLease {
            assoc: Arc::downgrade(self),
            arena,
            arena_at,
            slot,
            generation,
            announced: AtomicBool::new(false),
            grew: AtomicBool::new(false),
        }
    }

    /// Sends `m` with `fds` to the server's door without waiting: a door whose queue is
    /// full is a server not taking connections now (`door_unreachable`), one that is gone
    /// ends the association.
    pub fn send(&self, m: &Msg, fds: &[c_int]) -> Result<(), Reason> {
        if crate::fault("client-no-announce") && matches!(m, Msg::Announce { .. }) {
            return Err(Reason::DoorUnreachable);
        }
        match sys::send_with_fds_nowait(self.door, &m.encode(), fds) {
            Ok(()) => Ok(()),
            Err(e) if e.raw_os_error() == Some(sys::EAGAIN) => Err(Reason::DoorUnreachable),
            Err(_) => {
                self.dead.store(true, Ordering::Relaxed);
                Err(Reason::DoorUnreachable)
            }
        }
    }
}

/// This process's associations.
fn table() -> &'static Mutex<Vec<Arc<Assoc>>> {
    static T: Mutex<Vec<Arc<Assoc>>> = Mutex::new(Vec::new());
    &T
}

/// The association with the listener of registry entry `entry`: the one this process
/// has, or a new one — the door opened without waiting, its owner and credentials the
/// entry's.
pub fn get(entry: &Entry, geometry: Geometry) -> Result<Arc<Assoc>, Reason> {
    let me = sys::pid();
    let mut t = table().lock().unwrap_or_else(|p| p.into_inner());
    // A forked child's copies of its parent's associations are not its own.
    t.retain(|a| a.me == me && !a.dead.load(Ordering::Relaxed));
    if let Some(a) = t.iter().find(|a| a.pid == entry.pid && a.cred.uid == entry.owner && a.geometry == geometry) {
        return Ok(a.clone());
    }
    let (door, cred) = open_door(entry)?;
    let a = Arc::new(Assoc {
        pid: entry.pid,
        cred,
        door,
        me,
        geometry,
        slots: Mutex::new(Slots { arenas: Vec::new() }),
        dead: AtomicBool::new(false),
    });
    // Bounded: associations with servers that are gone go when their door does.
    if t.len() >= 1024 {
        t.remove(0);
    }
    t.push(a.clone());
    Ok(a)
}

fn open_door(entry: &Entry) -> Result<(c_int, Cred), Reason> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let path = crate::registry::door_path(entry.pid);
    // A door that is not the entry owner's socket is not the listener's.
    let m = path.symlink_metadata().map_err(|_| Reason::DoorUnreachable)?;
    if !m.file_type().is_socket() || m.uid() != entry.owner {
        return Err(Reason::WrongListener);
    }
    let sa = sys::unix_addr(&path).ok_or(Reason::DoorUnreachable)?;
    // SAFETY: a plain socket call.
    let door =
        unsafe { crate::real::socket(sys::AF_UNIX, sys::SOCK_SEQPACKET | sys::SOCK_CLOEXEC | sys::SOCK_NONBLOCK, 0) };
    if door < 0 {
        return Err(Reason::NoMemory);
    }
    // SAFETY: `sa` is a complete sockaddr_un.
    if unsafe { crate::real::connect(door, sa.as_ptr().cast(), sa.len() as u32) } < 0 {
        let e = cabi::errno();
        sys::close(door);
        // A door we may not open: its owner does not let our user in. A full backlog
        // (EAGAIN): a door that does not accept — not waited for.
        return Err(if e == sys::EACCES { Reason::NotAllowed } else { Reason::DoorUnreachable });
    }
    match sys::peer_cred(door) {
        Some((pid, cred)) if pid == entry.pid && cred.uid == entry.owner => Ok((sys::move_high(door), cred)),
        _ => {
            sys::close(door);
            Err(Reason::WrongListener)
        }
    }
}

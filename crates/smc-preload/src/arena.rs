//! A mapped arena (sluice_smc::slot): the client makes one, sealed, for each server
//! process it talks to and reuses its slots; the server maps it once per association,
//! after the kernel has shown it is a sealed memfd of exactly the arena's length.

use std::ffi::c_int;

use sluice_smc::msg::Reason;
use sluice_smc::ring::{Ring, RingError};
use sluice_smc::slot::{Control, Geometry};

use crate::sys::{self, Shm};

/// An arena mapped in this process.
pub struct Arena {
    shm: Shm,
    pub geometry: Geometry,
    /// The memfd's identity (device, inode): how a server knows an arena it mapped
    /// before when the client sends it again.
    pub id: (u64, u64),
    /// A server's close-on-exec descriptor of the memfd it mapped, kept so that a
    /// connection can go along to a program this one runs (crate::carry); -1 if none.
    kept: c_int,
}

impl Arena {
    /// Client: a fresh arena of `geometry` (sparse: no page is touched until a slot is
    /// used). Keeps its memfd, which goes with every announcement.
    pub fn create(geometry: Geometry) -> Result<Arena, Reason> {
        let len = geometry.arena_len().filter(|_| geometry.valid()).ok_or(Reason::NoMemory)?;
        let mut shm = Shm::create(len).map_err(|_| Reason::NoMemory)?;
        // Kept for the association's life: among the library's high descriptors.
        shm.fd = sys::move_high(shm.fd);
        let id = sys::file_id(shm.fd).ok_or(Reason::NoMemory)?;
        Ok(Arena { shm, geometry, id, kept: -1 })
    }

    /// Server: maps the arena in memfd `fd` (which stays the caller's) — only once the
    /// file is shown to be a memfd (not hugetlbfs) whose size can no longer change and is
    /// exactly the arena's length, so the peer can neither shrink what we map nor make us
    /// map more.
    pub fn map_shared(fd: c_int, geometry: Geometry) -> Result<Arena, Reason> {
        let len = geometry.arena_len().filter(|_| geometry.valid()).ok_or(Reason::BadSegment)?;
        let id = sys::file_id(fd).filter(|_| sys::is_sealed_shm(fd, len)).ok_or(Reason::BadSegment)?;
        let shm = Shm::map_borrowed(fd, len).map_err(|_| Reason::BadSegment)?;
        Ok(Arena { shm, geometry, id, kept: sys::dup_high(fd) })
    }

    /// The memfd (client arenas only; -1 on the server).
    pub fn fd(&self) -> c_int {
        self.shm.fd
    }

    /// A descriptor of the memfd on either side (-1 if none is kept).
    pub fn memfd(&self) -> c_int {
        if self.shm.fd >= 0 { self.shm.fd } else { self.kept }
    }

    fn at(&self, off: usize) -> *mut u8 {
        // SAFETY: callers pass offsets from `geometry` for slots below `slots`, all inside
        // the mapping (arena_len covers them).
        unsafe { self.shm.ptr.add(off) }
    }

    /// Slot `slot`'s control line.
    pub fn control(&self, slot: u32) -> Option<Control> {
        if slot >= self.geometry.slots {
            return None;
        }
        // SAFETY: a page-aligned offset inside the mapping, which outlives the view as
        // long as the caller keeps the arena (every connection holds it in an Arc).
        unsafe { Control::at(self.at(self.geometry.slot_at(slot))) }
    }

    /// Client: fresh headers for slot `slot`'s two rings; (client-to-server,
    /// server-to-client).
    pub fn create_rings(&self, slot: u32) -> Result<(Ring, Ring), RingError> {
        let g = self.geometry;
        let ((cs, cs_len), (sc, sc_len)) = (g.cs_at(slot), g.sc_at(slot));
        // SAFETY: both regions lie inside the mapping (checked geometry, slot < slots);
        // the arena outlives the views (held by the connection); the peer only ever has
        // its own views of them.
        unsafe {
            Ok((
                Ring::create(self.at(cs), cs_len, g.cs_area as usize, g.cs_window as usize)?,
                Ring::create(self.at(sc), sc_len, g.sc_area as usize, g.sc_window as usize)?,
            ))
        }
    }

    /// Server: views of slot `slot`'s rings as the client wrote them; (client-to-server,
    /// server-to-client). A ring whose header names another size than the geometry is
    /// refused (the client may lie in either place).
    pub fn attach_rings(&self, slot: u32) -> Result<(Ring, Ring), Reason> {
        let g = self.geometry;
        if slot >= g.slots {
            return Err(Reason::Protocol);
        }
        let ((cs, cs_len), (sc, sc_len)) = (g.cs_at(slot), g.sc_at(slot));
        // SAFETY: as in `create_rings`.
        let (a, b) = unsafe { (Ring::attach(self.at(cs), cs_len), Ring::attach(self.at(sc), sc_len)) };
        match (a, b) {
            (Ok(a), Ok(b))
                if a.max_capacity() == g.cs_area as usize
                    && b.max_capacity() == g.sc_area as usize
                    && a.window().is_ok()
                    && b.window().is_ok() =>
            {
                Ok((a, b))
            }
            _ => Err(Reason::BadSegment),
        }
    }

    /// Gives back the pages of slot `slot`'s rings past their first windows (a ring that
    /// grew keeps megabytes otherwise, in a slot that may wait long for its next use).
    pub fn trim(&self, slot: u32) {
        let g = self.geometry;
        for ((off, len), window) in [(g.cs_at(slot), g.cs_window), (g.sc_at(slot), g.sc_window)] {
            let keep = (sluice_smc::ring::HEADER_LEN + window as usize).next_multiple_of(4096);
            if len > keep {
                sys::punch(self.shm.fd, (off + keep) as u64, (len - keep) as u64);
            }
        }
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        if self.kept >= 0 {
            sys::close(self.kept);
        }
    }
}

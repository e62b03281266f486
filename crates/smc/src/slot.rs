//! Arenas and slots (docs/architecture.md, "Connections at TCP's cost"): the shared
//! memory of the connections between one client process and one server process.
//!
//! An *arena* is one sealed, sparse memfd the client makes and sends to one server
//! process (and nobody else); it holds [`Geometry::slots`] *slots* of one size. A slot is
//! one connection at a time: a page of control (its [`Control`] line), then the ring the
//! client writes (client to server, "cs"), then the ring the server writes ("sc"), each
//! page-aligned. A slot is used again for the next connection to the same server process
//! once both sides have let go of it, so its pages are already there.
//!
//! The control line's *state word* is the one place the two sides agree on what became
//! of a connection: the client writes PROPOSED with a fresh generation before it sends
//! its announcement; from PROPOSED the server swaps to COMMITTED or DECLINED, the client
//! to ABANDONED, each by compare-and-swap, so exactly one of them decides. The peer can
//! write every byte here, so a word that is not what a side expects is read as "not
//! committed" by the server and as the peer's own loss by the client.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::ring::{self, region_len};

/// Bytes of a slot before its first ring: the control line, and room.
pub const CONTROL_LEN: usize = 4096;
/// The most slots one arena holds.
pub const MAX_SLOTS: u32 = 64;
/// "SLUICESL" in ASCII: the control line of a slot its client set up.
pub const MAGIC: u64 = 0x4c53_4543_4955_4c53;
/// Generations count modulo this (20 bits of the state word).
pub const GEN_MASK: u32 = (1 << 20) - 1;

/// What became of a slot's current connection (the low 4 bits of the state word).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum State {
    /// Not in use.
    Free = 0,
    /// The client announced it and waits for the server's decision.
    Proposed = 1,
    /// The server took it: the connection is on shared memory.
    Committed = 2,
    /// The server declined it (the reason beside): the connection stays on TCP.
    Declined = 3,
    /// The client gave up waiting (the server took the connection as TCP, or never
    /// decided): the connection stays on TCP, or fails.
    Abandoned = 4,
}

impl State {
    fn from_bits(b: u32) -> Option<State> {
        [State::Free, State::Proposed, State::Committed, State::Declined, State::Abandoned]
            .into_iter()
            .find(|s| *s as u32 == b)
    }
}

/// Packs a state word: generation, state, and a reason byte (for DECLINED).
pub fn pack(generation: u32, state: State, reason: u8) -> u32 {
    (generation & GEN_MASK) << 12 | u32::from(reason) << 4 | state as u32
}

/// Unpacks a state word: (generation, state, reason); `None` for a state no side writes.
pub fn unpack(w: u32) -> Option<(u32, State, u8)> {
    Some((w >> 12, State::from_bits(w & 0xf)?, (w >> 4) as u8))
}

/// The shape of an arena: how many slots, and the two rings of each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    /// Slots in the arena.
    pub slots: u32,
    /// Data area of the client-to-server ring (the most it may grow to).
    pub cs_area: u32,
    /// Data area of the server-to-client ring.
    pub sc_area: u32,
    /// The window the client-to-server ring starts with.
    pub cs_window: u32,
    /// The window the server-to-client ring starts with.
    pub sc_window: u32,
}

/// Bytes of `Geometry` on the wire.
pub const GEOMETRY_LEN: usize = 20;

fn pages(n: usize) -> usize {
    n.next_multiple_of(4096)
}

fn ring_ok(area: u32, window: u32) -> bool {
    let (a, w) = (area as usize, window as usize);
    a.is_power_of_two() && w.is_power_of_two() && (4096..=ring::MAX_SIZE).contains(&a) && (4096..=a).contains(&w)
}

impl Geometry {
    /// True when every size is one a ring can have and the arena's length is addressable.
    pub fn valid(&self) -> bool {
        (1..=MAX_SLOTS).contains(&self.slots)
            && ring_ok(self.cs_area, self.cs_window)
            && ring_ok(self.sc_area, self.sc_window)
            && self.arena_len().is_some()
    }

    fn cs_region(&self) -> usize {
        pages(region_len(self.cs_area as usize))
    }

    fn sc_region(&self) -> usize {
        pages(region_len(self.sc_area as usize))
    }

    /// Bytes of one slot.
    pub fn slot_len(&self) -> usize {
        CONTROL_LEN + self.cs_region() + self.sc_region()
    }

    /// Bytes of the whole arena (`None` if it overflows).
    pub fn arena_len(&self) -> Option<usize> {
        (self.slots as usize).checked_mul(self.slot_len())
    }

    /// Offset of slot `i`'s control line.
    pub fn slot_at(&self, i: u32) -> usize {
        i as usize * self.slot_len()
    }

    /// Offset and length of slot `i`'s client-to-server ring.
    pub fn cs_at(&self, i: u32) -> (usize, usize) {
        (self.slot_at(i) + CONTROL_LEN, self.cs_region())
    }

    /// Offset and length of slot `i`'s server-to-client ring.
    pub fn sc_at(&self, i: u32) -> (usize, usize) {
        (self.slot_at(i) + CONTROL_LEN + self.cs_region(), self.sc_region())
    }

    /// The 20 bytes on the wire.
    pub fn encode(&self, out: &mut Vec<u8>) {
        for v in [self.slots, self.cs_area, self.sc_area, self.cs_window, self.sc_window] {
            out.extend_from_slice(&v.to_le_bytes());
        }
    }

    /// Reads 20 bytes (not checked: see [`Geometry::valid`]).
    pub fn decode(b: &[u8]) -> Option<Geometry> {
        let w = |i: usize| -> Option<u32> { Some(u32::from_le_bytes(b.get(4 * i..4 * i + 4)?.try_into().ok()?)) };
        Some(Geometry { slots: w(0)?, cs_area: w(1)?, sc_area: w(2)?, cs_window: w(3)?, sc_window: w(4)? })
    }
}

#[repr(C)]
struct ControlLine {
    magic: AtomicU64,
    word: AtomicU32,
    /// The generation the server let go of last (the client may reuse the slot once this
    /// is the generation it used).
    server_done: AtomicU32,
    client_pid: AtomicU32,
    server_pid: AtomicU32,
}

/// A view of a slot's control line in a mapped arena.
pub struct Control {
    base: NonNull<ControlLine>,
}

// SAFETY: a pointer to atomics in shared memory that outlives the view (see `at`).
unsafe impl Send for Control {}
// SAFETY: as above; every access is atomic.
unsafe impl Sync for Control {}

impl Control {
    /// The control line at `ptr`.
    ///
    /// # Safety
    /// `ptr` must be 64-byte aligned and point at `CONTROL_LEN` bytes of shared memory
    /// that stay mapped for the view's lifetime; only atomics touch them.
    pub unsafe fn at(ptr: *mut u8) -> Option<Control> {
        if !(ptr as usize).is_multiple_of(64) {
            return None;
        }
        Some(Control { base: NonNull::new(ptr.cast())? })
    }

    fn line(&self) -> &ControlLine {
        // SAFETY: per `at`: aligned, mapped, atomics only (a peer writing them is a race
        // on atomics, which is sound).
        unsafe { self.base.as_ref() }
    }

    /// Client: a fresh connection of generation `generation` in this slot.
    pub fn propose(&self, generation: u32, client_pid: u32) {
        let l = self.line();
        l.magic.store(MAGIC, Ordering::Relaxed);
        l.client_pid.store(client_pid, Ordering::Relaxed);
        l.server_pid.store(0, Ordering::Relaxed);
        l.word.store(pack(generation, State::Proposed, 0), Ordering::Release);
    }

    /// True when the slot carries the magic of a slot its client set up.
    pub fn has_magic(&self) -> bool {
        self.line().magic.load(Ordering::Acquire) == MAGIC
    }

    /// The state word now.
    pub fn word(&self) -> u32 {
        self.line().word.load(Ordering::Acquire)
    }

    /// The word a side waiting for the decision sleeps on (a futex both processes share).
    pub fn word_atomic(&self) -> &AtomicU32 {
        &self.line().word
    }

    /// Leaves PROPOSED of `generation` for `to`: true when this call decided.
    pub fn decide(&self, generation: u32, to: State, reason: u8) -> bool {
        self.line()
            .word
            .compare_exchange(
                pack(generation, State::Proposed, 0),
                pack(generation, to, reason),
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok()
    }

    /// Server: the pid that took the connection (for `sluice smc info`).
    pub fn set_server_pid(&self, pid: u32) {
        self.line().server_pid.store(pid, Ordering::Relaxed);
    }

    /// Server: it holds nothing of generation `generation` any more.
    pub fn server_done(&self, generation: u32) {
        self.line().server_done.store(generation & GEN_MASK, Ordering::Release);
    }

    /// Client: whether the server let go of generation `generation`.
    pub fn server_let_go(&self, generation: u32) -> bool {
        self.line().server_done.load(Ordering::Acquire) == generation & GEN_MASK
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_pack_and_unpack_and_only_one_side_decides() {
        let w = pack(0x12345, State::Declined, 9);
        assert_eq!(unpack(w), Some((0x12345, State::Declined, 9)));
        assert_eq!(unpack(0xf), None);
        #[repr(C, align(64))]
        struct Page([u8; 4096]);
        let mut page = Box::new(Page([0; 4096]));
        // SAFETY: an aligned page that outlives the view.
        let c = unsafe { Control::at(page.0.as_mut_ptr()) }.unwrap();
        c.propose(7, 42);
        assert!(c.has_magic());
        assert!(!c.decide(6, State::Committed, 0), "another generation's decision");
        assert!(c.decide(7, State::Committed, 0));
        assert!(!c.decide(7, State::Abandoned, 0), "decided already");
        assert_eq!(unpack(c.word()), Some((7, State::Committed, 0)));
        assert!(!c.server_let_go(7));
        c.server_done(7);
        assert!(c.server_let_go(7));
    }

    #[test]
    fn geometry_lays_slots_out_page_aligned_and_refuses_bad_sizes() {
        let g = Geometry { slots: 3, cs_area: 65536, sc_area: 1 << 20, cs_window: 65536, sc_window: 65536 };
        assert!(g.valid());
        assert_eq!(g.slot_len() % 4096, 0);
        let (cs, cs_len) = g.cs_at(2);
        let (sc, sc_len) = g.sc_at(2);
        assert_eq!(cs, 2 * g.slot_len() + CONTROL_LEN);
        assert_eq!(sc, cs + cs_len);
        assert_eq!(sc + sc_len, g.arena_len().unwrap());
        let mut b = Vec::new();
        g.encode(&mut b);
        assert_eq!(b.len(), GEOMETRY_LEN);
        assert_eq!(Geometry::decode(&b), Some(g));
        for bad in [
            Geometry { slots: 0, ..g },
            Geometry { slots: MAX_SLOTS + 1, ..g },
            Geometry { cs_area: 65535, ..g },
            Geometry { cs_window: 1 << 17, ..g },
            Geometry { sc_area: 1 << 30, ..g },
            Geometry { sc_window: 2048, ..g },
        ] {
            assert!(!bad.valid(), "{bad:?}");
        }
    }
}

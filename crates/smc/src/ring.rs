//! A single-producer, single-consumer byte ring in shared memory, one per direction of a
//! connection (docs/architecture.md, "Data path").
//!
//! Layout (all cache-line aligned): a header line that never changes after creation, the
//! producer cursor on its own line (written only by the producer), the consumer cursor on
//! its own line (written only by the consumer), a line with `avail` and the flags, then the
//! data area, a power of two of bytes. Cursors count bytes from the start and never wrap
//! in practice (2^64 bytes).
//!
//! The *state word* — 32 bits: the bytes published and not yet consumed (`avail`) and
//! four flags — changes only by atomic read-modify-write, so its transitions between
//! empty and non-empty alternate in one total order. An *epoch* is a non-empty stretch.
//! The producer's add that finds the ring empty opens an epoch and decides how the reader
//! hears of it: by a doorbell byte (`BELL`: the reader may be in poll/epoll, which only a
//! descriptor can wake), or — when the reader is asleep in the library on this very word
//! (`SLEEPER`) and the bytes fit the buffer it is reading into — by a futex wake alone
//! (`QUIET`). A quiet epoch turns into a bell epoch the moment its bytes exceed that
//! buffer, so a quiet epoch is always emptied by the read that slept, and the descriptor
//! is readable exactly while a bell epoch lasts. The consumer's subtract that empties the
//! ring closes the epoch and is told whether a doorbell byte is to be taken
//! ([`Pop::take_bell`]). The producer adds *before* it publishes its cursor, so the
//! consumer, which only consumes what the cursor published, never takes `avail` below 0.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Bytes before the data area.
pub const HEADER_LEN: usize = 256;
/// "SLUICERG" in ASCII.
pub const MAGIC: u64 = 0x5352_4543_4955_4c53;
/// Layout version.
pub const VERSION: u32 = 2;

/// The reader's peer has shut down writing: after the data, EOF.
pub const FLAG_SHUTDOWN_WR: u32 = 1;
/// The writer found the ring full and waits for room on its descriptor (filler written).
pub const FLAG_WRITER_WAITING: u32 = 2;
/// The writer found the ring full and sleeps on the flags word (a futex).
pub const FLAG_WRITER_SLEEPING: u32 = 8;

/// State word: bytes published and not yet consumed.
const AVAIL: u32 = (1 << 28) - 1;
/// State word: this epoch's readers hear of it by a doorbell byte.
const BELL: u32 = 1 << 28;
/// State word: this epoch was announced by a futex wake only.
const QUIET: u32 = 1 << 29;
/// State word: the reader sleeps on this word (or is about to).
const SLEEPER: u32 = 1 << 30;
/// State word: the flags changed in a way a sleeping reader must see (shutdown).
const POKED: u32 = 1 << 31;

/// The largest ring: `avail` must fit its bits of the state word.
pub const MAX_SIZE: usize = 1 << 27;

#[repr(C, align(64))]
struct Line<T>(T);

/// The header at the start of the shared region.
#[repr(C)]
struct Header {
    info: Line<Info>,
    prod: Line<Producer>,
    cons: Line<Consumer>,
    state: Line<State>,
}

/// The producer's line: its cursor, what is left of a quiet epoch's budget, and the lock
/// that serializes writers when processes share the connection (after `fork`).
#[repr(C)]
struct Producer {
    prod: AtomicU64,
    quiet_left: AtomicU32,
    lock: AtomicU32,
}

/// The consumer's line: its cursor and the readers' lock.
#[repr(C)]
struct Consumer {
    cons: AtomicU64,
    lock: AtomicU32,
}

#[repr(C)]
struct Info {
    magic: u64,
    version: u32,
    size_log2: u32,
}

#[repr(C)]
struct State {
    word: AtomicU32,
    flags: AtomicU32,
    /// The buffer room of the reader asleep on `word` (set before `SLEEPER`).
    want: AtomicU32,
}

const _: () = assert!(std::mem::size_of::<Header>() == HEADER_LEN);

/// Why a region cannot hold a ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RingError {
    /// The region is not 64-byte aligned, or shorter than its header says.
    BadRegion,
    /// Not a sluice ring, or another layout version.
    BadHeader,
    /// The data size is not a power of two between 4 KiB and 128 MiB.
    BadSize,
}

impl std::fmt::Display for RingError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RingError::BadRegion => "the shared region is misaligned or too short",
            RingError::BadHeader => "the shared region holds no sluice ring of this version",
            RingError::BadSize => "the ring size is not a power of two from 4 KiB to 128 MiB",
        })
    }
}

impl std::error::Error for RingError {}

/// Bytes of shared memory a ring of `size` data bytes needs.
pub fn region_len(size: usize) -> usize {
    HEADER_LEN + size
}

/// A view of a ring in a shared region. Either end may hold one; which methods it calls
/// makes it the producer ([`Ring::push`]) or the consumer ([`Ring::pop`]).
pub struct Ring {
    base: NonNull<u8>,
    size: usize,
}

// SAFETY: the ring's shared state is atomics and a data area whose bytes are written only
// by the producer before a release store and read only by the consumer after the matching
// acquire load; a `Ring` is a pointer into memory that outlives it (see `from_raw`).
unsafe impl Send for Ring {}
// SAFETY: as above; `&Ring` methods touch only atomics and their own side's bytes.
unsafe impl Sync for Ring {}

/// What a [`Ring::push`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Push {
    /// Bytes copied in (0 when the ring is full).
    pub n: usize,
    /// A bell epoch began: write one doorbell byte to the reader's descriptor.
    pub ring_bell: bool,
    /// The reader sleeps on the state word: wake it ([`Ring::state_word`]).
    pub wake_sleeper: bool,
}

/// What a [`Ring::pop`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Pop {
    /// Bytes copied out.
    pub n: usize,
    /// This call emptied the ring and ended a bell epoch: one doorbell byte is to come
    /// off the descriptor.
    pub take_bell: bool,
    /// This call emptied the ring.
    pub emptied: bool,
}

/// Why a reader need not sleep ([`Ring::prepare_sleep`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Awake {
    /// There are bytes to read.
    Data,
    /// The flags changed (a shutdown): look at them.
    Poked,
}

impl Ring {
    /// Writes a fresh header for a ring of `size` data bytes at `ptr` and returns a view.
    ///
    /// # Safety
    /// `ptr` must point to `len` writable bytes, shared only with other [`Ring`] views,
    /// that stay mapped for as long as the returned view (and every other view) lives.
    pub unsafe fn create(ptr: *mut u8, len: usize, size: usize) -> Result<Ring, RingError> {
        check_size(size)?;
        if !(ptr as usize).is_multiple_of(64) || len < region_len(size) {
            return Err(RingError::BadRegion);
        }
        let h = ptr.cast::<Header>();
        // SAFETY: the caller gives `len ≥ HEADER_LEN` writable, aligned bytes; nobody else
        // uses the ring before `create` returns.
        unsafe {
            h.write(Header {
                info: Line(Info { magic: MAGIC, version: VERSION, size_log2: size.trailing_zeros() }),
                prod: Line(Producer {
                    prod: AtomicU64::new(0),
                    quiet_left: AtomicU32::new(0),
                    lock: AtomicU32::new(0),
                }),
                cons: Line(Consumer { cons: AtomicU64::new(0), lock: AtomicU32::new(0) }),
                state: Line(State { word: AtomicU32::new(0), flags: AtomicU32::new(0), want: AtomicU32::new(0) }),
            });
        }
        Ok(Ring { base: NonNull::new(ptr).ok_or(RingError::BadRegion)?, size })
    }

    /// A view of the ring another process created at `ptr`.
    ///
    /// # Safety
    /// As for [`Ring::create`]; the header must have been written by `create`.
    pub unsafe fn attach(ptr: *mut u8, len: usize) -> Result<Ring, RingError> {
        if ptr.is_null() || !(ptr as usize).is_multiple_of(64) || len < HEADER_LEN {
            return Err(RingError::BadRegion);
        }
        // SAFETY: aligned and at least a header long, per the checks and the caller.
        let info = unsafe { &(*ptr.cast::<Header>()).info.0 };
        if info.magic != MAGIC || info.version != VERSION {
            return Err(RingError::BadHeader);
        }
        let size = 1usize.checked_shl(info.size_log2).ok_or(RingError::BadSize)?;
        check_size(size)?;
        if len < region_len(size) {
            return Err(RingError::BadRegion);
        }
        Ok(Ring { base: NonNull::new(ptr).ok_or(RingError::BadRegion)?, size })
    }

    fn header(&self) -> &Header {
        // SAFETY: `base` points at a header written by `create` (checked in `attach`),
        // mapped for this view's lifetime.
        unsafe { &*self.base.as_ptr().cast::<Header>() }
    }

    fn data(&self) -> *mut u8 {
        // SAFETY: the data area follows the header inside the region.
        unsafe { self.base.as_ptr().add(HEADER_LEN) }
    }

    /// Data bytes the ring holds when full.
    pub fn capacity(&self) -> usize {
        self.size
    }

    /// Bytes published and not yet consumed.
    pub fn len(&self) -> usize {
        let h = self.header();
        (h.prod.0.prod.load(Ordering::Acquire) - h.cons.0.cons.load(Ordering::Acquire)) as usize
    }

    /// True when nothing is waiting to be read.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Producer: copies as much of `data` as fits and publishes it.
    pub fn push(&self, data: &[u8]) -> Push {
        let h = self.header();
        let prod = h.prod.0.prod.load(Ordering::Relaxed);
        let cons = h.cons.0.cons.load(Ordering::Acquire);
        let free = self.size - (prod - cons) as usize;
        let n = data.len().min(free);
        if n == 0 {
            return Push::default();
        }
        let at = (prod as usize) & (self.size - 1);
        let first = n.min(self.size - at);
        // SAFETY: [at, at+first) and [0, n-first) lie in the data area and are free: the
        // consumer has released them (cons acquired above) and reads only below `prod`.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.data().add(at), first);
            std::ptr::copy_nonoverlapping(data.as_ptr().add(first), self.data(), n - first);
        }
        // Count before publishing, so the consumer never subtracts what was not added.
        let mut p = Push { n, ..Push::default() };
        let n32 = n as u32; // n ≤ size ≤ MAX_SIZE
        // Only the producer touches the quiet budget: read once, store after the update.
        let left = h.prod.0.quiet_left.load(Ordering::Relaxed);
        let mut new_left = None;
        let _ = h.state.0.word.fetch_update(Ordering::AcqRel, Ordering::Acquire, |old| {
            let mut new = old + n32;
            (p.ring_bell, p.wake_sleeper, new_left) = (false, false, None);
            if old & AVAIL == 0 {
                // A new epoch.
                if old & SLEEPER != 0 {
                    new &= !SLEEPER;
                    p.wake_sleeper = true;
                    let want = h.state.0.want.load(Ordering::Relaxed);
                    if n32 <= want {
                        new_left = Some(want - n32);
                        return Some(new | QUIET);
                    }
                }
                new |= BELL;
                p.ring_bell = true;
            } else if old & QUIET != 0 {
                // A quiet epoch may grow only as far as the sleeping reader's buffer.
                if n32 <= left {
                    new_left = Some(left - n32);
                } else {
                    new = (new & !QUIET) | BELL;
                    p.ring_bell = true;
                }
            }
            Some(new)
        });
        if let Some(l) = new_left {
            h.prod.0.quiet_left.store(l, Ordering::Relaxed);
        }
        h.prod.0.prod.store(prod + n as u64, Ordering::Release);
        p
    }

    /// Consumer: copies up to `out.len()` published bytes out; with `peek` they stay in
    /// the ring.
    pub fn pop(&self, out: &mut [u8], peek: bool) -> Pop {
        let h = self.header();
        let cons = h.cons.0.cons.load(Ordering::Relaxed);
        let prod = h.prod.0.prod.load(Ordering::Acquire);
        let n = out.len().min((prod - cons) as usize);
        if n == 0 {
            return Pop::default();
        }
        let at = (cons as usize) & (self.size - 1);
        let first = n.min(self.size - at);
        // SAFETY: the bytes below `prod` (acquired) were written by the producer, which
        // does not touch them again until `cons` passes them.
        unsafe {
            std::ptr::copy_nonoverlapping(self.data().add(at), out.as_mut_ptr(), first);
            std::ptr::copy_nonoverlapping(self.data(), out.as_mut_ptr().add(first), n - first);
        }
        if peek {
            return Pop { n, ..Pop::default() };
        }
        self.consumed(cons, n)
    }

    /// Consumer: publishes `n` bytes consumed at `cons` and counts them off the state
    /// word, ending the epoch when they were the last.
    fn consumed(&self, cons: u64, n: usize) -> Pop {
        let h = self.header();
        h.cons.0.cons.store(cons + n as u64, Ordering::Release);
        let mut p = Pop { n, ..Pop::default() };
        let _ = h.state.0.word.fetch_update(Ordering::AcqRel, Ordering::Acquire, |old| {
            let mut new = old - n as u32;
            p.emptied = new & AVAIL == 0;
            p.take_bell = p.emptied && old & BELL != 0;
            if p.emptied {
                new &= !(BELL | QUIET);
            }
            Some(new)
        });
        p
    }

    /// Consumer: drops up to `n` published bytes without copying them.
    pub fn skip(&self, n: usize) -> Pop {
        let h = self.header();
        let cons = h.cons.0.cons.load(Ordering::Relaxed);
        let prod = h.prod.0.prod.load(Ordering::Acquire);
        let n = n.min((prod - cons) as usize);
        if n == 0 {
            return Pop::default();
        }
        self.consumed(cons, n)
    }

    /// Consumer: about to sleep on [`Ring::state_word`] reading into `room` bytes of
    /// buffer (0: tell me by doorbell only, as for `MSG_PEEK`). Returns the value to
    /// sleep on, or why not to sleep.
    pub fn prepare_sleep(&self, room: usize) -> Result<u32, Awake> {
        let st = &self.header().state.0;
        st.want.store(room.min(AVAIL as usize) as u32, Ordering::Relaxed);
        let mut out = Err(Awake::Data);
        let _ = st.word.fetch_update(Ordering::AcqRel, Ordering::Acquire, |old| {
            if old & AVAIL != 0 {
                out = Err(Awake::Data);
                return None;
            }
            if old & POKED != 0 {
                out = Err(Awake::Poked);
                return None;
            }
            out = Ok(old | SLEEPER);
            Some(old | SLEEPER)
        });
        out
    }

    /// Consumer: no longer sleeping (a producer that saw `SLEEPER` took it already).
    pub fn cancel_sleep(&self) {
        self.header().state.0.word.fetch_and(!SLEEPER, Ordering::AcqRel);
    }

    /// True while the current epoch is quiet: the reader that slept must read on until the
    /// ring is empty or its buffer full (the bytes are there or about to be published).
    pub fn quiet(&self) -> bool {
        let w = self.header().state.0.word.load(Ordering::Acquire);
        w & QUIET != 0 && w & AVAIL != 0
    }

    /// Marks the state word changed so a sleeping reader wakes to read the flags (after a
    /// shutdown flag was set); the caller then wakes [`Ring::state_word`].
    pub fn poke(&self) {
        self.header().state.0.word.fetch_or(POKED, Ordering::AcqRel);
    }

    /// The word a reader sleeps on (a futex shared by both processes).
    pub fn state_word(&self) -> &AtomicU32 {
        &self.header().state.0.word
    }

    /// The lock word writers hold while they push (shared by every process holding the
    /// connection; the holder's pid, with the top bit for "others wait").
    pub fn producer_lock(&self) -> &AtomicU32 {
        &self.header().prod.0.lock
    }

    /// The lock word readers hold while they pop.
    pub fn consumer_lock(&self) -> &AtomicU32 {
        &self.header().cons.0.lock
    }

    /// The flags word, on which a writer waiting for room sleeps.
    pub fn flags_word(&self) -> &AtomicU32 {
        &self.header().state.0.flags
    }

    /// Sets flag bits (`FLAG_…`).
    pub fn set_flags(&self, f: u32) {
        self.header().state.0.flags.fetch_or(f, Ordering::SeqCst);
    }

    /// Clears flag bits and says whether any of them was set.
    pub fn take_flags(&self, f: u32) -> bool {
        self.header().state.0.flags.fetch_and(!f, Ordering::SeqCst) & f != 0
    }

    /// True if any of the flag bits is set.
    pub fn has_flags(&self, f: u32) -> bool {
        self.header().state.0.flags.load(Ordering::SeqCst) & f != 0
    }
}

fn check_size(size: usize) -> Result<(), RingError> {
    if size.is_power_of_two() && (4096..=MAX_SIZE).contains(&size) { Ok(()) } else { Err(RingError::BadSize) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Copy)]
    #[repr(C, align(64))]
    struct Chunk([u8; 64]);

    /// A 64-byte-aligned heap region standing in for a shared mapping.
    fn region(size: usize) -> Vec<Chunk> {
        vec![Chunk([0u8; 64]); region_len(size).div_ceil(64)]
    }

    #[test]
    fn bytes_cross_in_order_through_wraps_with_alternating_transitions() {
        let mut mem = region(4096);
        let len = mem.len() * 64;
        let ptr = mem.as_mut_ptr().cast::<u8>();
        // SAFETY: `mem` outlives both views and is used only through them.
        let w = unsafe { Ring::create(ptr, len, 4096) }.unwrap();
        // SAFETY: as above.
        let r = unsafe { Ring::attach(ptr, len) }.unwrap();
        assert_eq!(r.capacity(), 4096);
        let total = 3_000_000usize;
        let (mut wakes, mut empties) = (0u64, 0u64);
        std::thread::scope(|s| {
            let producer = s.spawn(|| {
                let mut sent = 0usize;
                let mut wakes = 0u64;
                while sent < total {
                    let want = (total - sent).min(1 + sent % 1499);
                    let buf: Vec<u8> = (0..want).map(|i| ((sent + i) % 251) as u8).collect();
                    let p = w.push(&buf);
                    sent += p.n;
                    wakes += u64::from(p.ring_bell);
                    assert!(!p.wake_sleeper, "nobody slept");
                }
                wakes
            });
            let mut got = 0usize;
            let mut out = vec![0u8; 1000];
            while got < total {
                let p = r.pop(&mut out[..1 + got % 999], false);
                for (i, b) in out[..p.n].iter().enumerate() {
                    assert_eq!(*b, ((got + i) % 251) as u8, "byte {}", got + i);
                }
                got += p.n;
                empties += u64::from(p.take_bell);
            }
            wakes = producer.join().unwrap();
        });
        // Every empty→non-empty transition was matched by a non-empty→empty one.
        assert_eq!(wakes, empties);
        assert!(r.is_empty());
    }

    #[test]
    fn peek_leaves_bytes_and_flags_round_trip() {
        let mut mem = region(4096);
        let len = mem.len() * 64;
        let ptr = mem.as_mut_ptr().cast::<u8>();
        // SAFETY: `mem` outlives the view.
        let ring = unsafe { Ring::create(ptr, len, 4096) }.unwrap();
        assert_eq!(ring.push(b"hello"), Push { n: 5, ring_bell: true, wake_sleeper: false });
        assert_eq!(ring.push(b" world"), Push { n: 6, ring_bell: false, wake_sleeper: false });
        let mut out = [0u8; 5];
        assert_eq!(ring.pop(&mut out, true), Pop { n: 5, take_bell: false, emptied: false });
        assert_eq!(ring.len(), 11);
        assert_eq!(ring.skip(5), Pop { n: 5, take_bell: false, emptied: false });
        let mut out = [0u8; 64];
        assert_eq!(ring.pop(&mut out, false), Pop { n: 6, take_bell: true, emptied: true });
        assert_eq!(&out[..6], b" world");
        assert_eq!(ring.push(&[7u8; 5000]).n, 4096, "a full ring takes no more");
        assert_eq!(ring.push(b"x").n, 0);
        ring.set_flags(FLAG_WRITER_WAITING);
        assert!(ring.has_flags(FLAG_WRITER_WAITING));
        assert!(ring.take_flags(FLAG_WRITER_WAITING));
        assert!(!ring.take_flags(FLAG_WRITER_WAITING));
    }

    #[test]
    fn a_sleeping_reader_is_woken_without_a_bell_while_its_buffer_holds_the_epoch() {
        let mut mem = region(4096);
        let len = mem.len() * 64;
        let ptr = mem.as_mut_ptr().cast::<u8>();
        // SAFETY: `mem` outlives the view.
        let ring = unsafe { Ring::create(ptr, len, 4096) }.unwrap();
        let mut out = [0u8; 100];
        // Asleep with room for 100: 60 + 40 arrive quietly; 1 more turns the epoch loud.
        let v = ring.prepare_sleep(100).unwrap();
        assert_eq!(ring.state_word().load(Ordering::Relaxed), v);
        assert_eq!(ring.push(&[1; 60]), Push { n: 60, ring_bell: false, wake_sleeper: true });
        assert!(ring.quiet());
        assert_eq!(ring.push(&[2; 40]), Push { n: 40, ring_bell: false, wake_sleeper: false });
        assert_eq!(ring.push(&[3; 1]), Push { n: 1, ring_bell: true, wake_sleeper: false });
        assert!(!ring.quiet());
        assert_eq!(ring.pop(&mut out, false), Pop { n: 100, take_bell: false, emptied: false });
        assert_eq!(ring.pop(&mut out, false), Pop { n: 1, take_bell: true, emptied: true });
        // Too much for the sleeper's buffer at once: a bell, and a wake.
        ring.prepare_sleep(10).unwrap();
        assert_eq!(ring.push(&[4; 11]), Push { n: 11, ring_bell: true, wake_sleeper: true });
        assert_eq!(ring.prepare_sleep(10), Err(Awake::Data), "bytes are waiting");
        assert_eq!(ring.pop(&mut out, false), Pop { n: 11, take_bell: true, emptied: true });
        // A reader that gave up sleeping is not woken; a peek (room 0) always gets a bell.
        ring.prepare_sleep(50).unwrap();
        ring.cancel_sleep();
        assert_eq!(ring.push(&[5; 5]), Push { n: 5, ring_bell: true, wake_sleeper: false });
        assert!(ring.pop(&mut out, false).take_bell);
        ring.prepare_sleep(0).unwrap();
        assert_eq!(ring.push(&[6; 5]), Push { n: 5, ring_bell: true, wake_sleeper: true });
        assert!(ring.pop(&mut out, false).take_bell);
        // A poke (a shutdown) keeps the reader from sleeping, for good.
        ring.poke();
        assert_eq!(ring.prepare_sleep(50), Err(Awake::Poked));
        assert!(ring.push(&[7; 5]).ring_bell, "bytes still count");
        assert_eq!(ring.pop(&mut out, false), Pop { n: 5, take_bell: true, emptied: true });
    }

    #[test]
    fn quiet_epochs_always_end_in_the_read_that_slept() {
        let mut mem = region(4096);
        let len = mem.len() * 64;
        let ptr = mem.as_mut_ptr().cast::<u8>();
        // SAFETY: `mem` outlives both views and is used only through them.
        let w = unsafe { Ring::create(ptr, len, 4096) }.unwrap();
        // SAFETY: as above.
        let r = unsafe { Ring::attach(ptr, len) }.unwrap();
        let total = 2_000_000usize;
        std::thread::scope(|s| {
            let producer = s.spawn(|| {
                let (mut sent, mut bells) = (0usize, 0u64);
                // Bounded, so a failing reader does not leave the producer spinning.
                let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
                while sent < total && std::time::Instant::now() < deadline {
                    let want = (total - sent).min(1 + sent % 777);
                    let buf: Vec<u8> = (0..want).map(|i| ((sent + i) % 251) as u8).collect();
                    if sent % 8 == 0 {
                        // Now and then let the reader fall asleep first (bounded wait).
                        let t = std::time::Instant::now();
                        while w.state_word().load(Ordering::Acquire) & SLEEPER == 0
                            && t.elapsed() < std::time::Duration::from_millis(1)
                        {
                            std::thread::yield_now();
                        }
                    }
                    let p = w.push(&buf);
                    sent += p.n;
                    bells += u64::from(p.ring_bell);
                    if p.n == 0 {
                        std::thread::yield_now();
                    }
                }
                bells
            });
            let (mut got, mut taken, mut quiet_reads) = (0usize, 0u64, 0u64);
            let mut out = vec![0u8; 1000];
            while got < total {
                let room = 1 + got % 997;
                // "Sleep" (spin on the word as a futex would) when the ring is empty.
                let slept = match r.prepare_sleep(room) {
                    Ok(v) => {
                        let t = std::time::Instant::now();
                        while r.state_word().load(Ordering::Acquire) == v {
                            assert!(t.elapsed().as_secs() < 30, "the producer never woke the reader");
                            std::hint::spin_loop();
                        }
                        true
                    }
                    Err(_) => false,
                };
                let was_quiet = r.quiet();
                let mut k = 0;
                loop {
                    let p = r.pop(&mut out[k..room], false);
                    for (i, b) in out[k..k + p.n].iter().enumerate() {
                        assert_eq!(*b, ((got + k + i) % 251) as u8, "byte {}", got + k + i);
                    }
                    k += p.n;
                    taken += u64::from(p.take_bell);
                    // A reader that slept reads on while the epoch is quiet.
                    if !(slept && r.quiet() && k < room) {
                        break;
                    }
                }
                if slept && was_quiet {
                    quiet_reads += 1;
                    assert!(!r.quiet(), "a quiet epoch outlived the read that slept");
                }
                got += k;
            }
            let bells = producer.join().unwrap();
            assert_eq!(bells, taken, "every bell epoch ended exactly once");
            assert!(quiet_reads > 0, "some epochs were quiet");
        });
    }

    #[test]
    fn bad_regions_are_refused() {
        let mut mem = region(8192);
        let len = mem.len() * 64;
        let ptr = mem.as_mut_ptr().cast::<u8>();
        // SAFETY: `mem` outlives every view; failed calls write nothing.
        unsafe {
            assert_eq!(Ring::create(ptr, len, 3000).err(), Some(RingError::BadSize));
            assert_eq!(Ring::create(ptr.add(1), len - 1, 4096).err(), Some(RingError::BadRegion));
            assert_eq!(Ring::create(ptr, 4096, 4096).err(), Some(RingError::BadRegion));
            assert_eq!(Ring::attach(ptr, len).err(), Some(RingError::BadHeader));
            Ring::create(ptr, len, 8192).unwrap();
            assert_eq!(Ring::attach(ptr, 4096).err(), Some(RingError::BadRegion));
            assert_eq!(Ring::attach(ptr, len).unwrap().capacity(), 8192);
        }
    }
}

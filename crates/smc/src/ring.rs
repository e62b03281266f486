//! A single-producer, single-consumer byte ring in shared memory, one per direction of a
//! connection (docs/architecture.md, "Data path").
//!
//! Layout (all cache-line aligned): a header line that never changes after creation, the
//! producer cursor on its own line (written only by the producer), the consumer cursor on
//! its own line (written only by the consumer), a line with `avail` and the flags, then the
//! data area, a power of two of bytes. Cursors count bytes from the start and never wrap
//! in practice (2^64 bytes).
//!
//! **The window.** The data area is the most the ring may ever hold; the bytes in use are
//! a *window* at its start, a power of two the producer may double (up to the whole area)
//! when it keeps finding the ring full — while the ring is empty ([`Ring::grow`]), or, for
//! a ring its reader lets stay full, with bytes in it ([`Ring::grow_full`]: those whose
//! place moves are copied to it first, and a reader that copied under the old window
//! copies again). The producer stores the new window before it publishes the bytes
//! written under it, and the consumer reads the window after it has acquired the cursor,
//! never before, and again after its copy. Pages past the window are never touched, so a
//! connection that never fills its ring costs only its first window in memory (the area
//! is a sparse file), as TCP's buffers grow only when a connection needs them.
//!
//! The *state word* — 32 bits: the bytes published and not yet consumed (`avail`) and
//! five flags — changes only by atomic read-modify-write, so its transitions between
//! empty and non-empty alternate in one total order. An *epoch* is a non-empty stretch.
//! The producer's add that finds the ring empty opens an epoch and decides how the reader
//! hears of it: by a doorbell byte (`BELL`: the reader may be in poll/epoll, which only a
//! descriptor can wake), or — when the reader is asleep in the library on this very word
//! (`SLEEPER`) and the bytes fit the buffer it is reading into — by a futex wake alone
//! (`QUIET`), or not at all (a *looked-for* epoch) while the reader's event loop is awake
//! and has promised to look at the ring before it sleeps (`WATCHED`, which the reader
//! takes back, and looks once more, before any wait on its descriptor). A quiet epoch
//! turns into a bell epoch the moment its bytes exceed that buffer, so a quiet epoch is
//! always emptied by the read that slept, and the descriptor is readable exactly while a
//! bell epoch lasts. The consumer's subtract that empties the
//! ring closes the epoch and is told whether a doorbell byte is to be taken
//! ([`Pop::take_bell`]). The producer adds *before* it publishes its cursor, so the
//! consumer, which only consumes what the cursor published, never takes `avail` below 0.
//!
//! **The peer can write every byte of the region**, so nothing read from it is trusted:
//! the data size is read once, at attach, and kept in the view; every use of the two
//! cursors checks `prod - cons` (wrapping) against it and answers [`Corrupt`] when it does
//! not hold, before any byte is copied; the state word's count is arithmetic modulo its
//! bits. So a hostile peer can garble its own connection's bytes and wake-ups, never make
//! this side read or write outside the region (docs/architecture.md, "The fast path's
//! trust boundary"). Locks that serialize forked processes are not here, where the peer
//! could hold them, but in memory of each side's own.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Bytes before the data area.
pub const HEADER_LEN: usize = 256;
/// "SLUICERG" in ASCII.
pub const MAGIC: u64 = 0x5352_4543_4955_4c53;
/// Layout version.
pub const VERSION: u32 = 6;

/// The reader's peer has shut down writing: after the data, EOF.
pub const FLAG_SHUTDOWN_WR: u32 = 1;
/// The writer found the ring full and waits for room on its descriptor (filler written).
pub const FLAG_WRITER_WAITING: u32 = 2;
/// The writer found the ring full and sleeps on the flags word (a futex).
pub const FLAG_WRITER_SLEEPING: u32 = 8;

/// State word: bytes published and not yet consumed.
const AVAIL: u32 = (1 << 27) - 1;
/// State word: the reader's event loop is awake and looks at the ring before it sleeps;
/// an epoch it opens needs no doorbell byte (one for a reader asleep in the library still
/// gets its futex wake).
const WATCHED: u32 = 1 << 27;
/// State word: this epoch's readers hear of it by a doorbell byte.
const BELL: u32 = 1 << 28;
/// State word: this epoch was announced by a futex wake only.
const QUIET: u32 = 1 << 29;
/// State word: the reader sleeps on this word (or is about to).
const SLEEPER: u32 = 1 << 30;
/// State word: the flags changed in a way a sleeping reader must see (shutdown).
const POKED: u32 = 1 << 31;

/// The largest ring: `avail` must fit its bits of the state word.
pub const MAX_SIZE: usize = 1 << 26;

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

/// The producer's line: its cursor, what is left of a quiet epoch's budget, and the
/// window (log2 of the data bytes in use).
#[repr(C)]
struct Producer {
    prod: AtomicU64,
    quiet_left: AtomicU32,
    window_log2: AtomicU32,
}

/// The consumer's line: its cursor.
#[repr(C)]
struct Consumer {
    cons: AtomicU64,
}

#[repr(C)]
struct Info {
    // Atomics (the layout of plain integers) because the peer can write them at any time:
    // every byte of the shared header is read through an atomic, never a plain reference.
    magic: AtomicU64,
    version: AtomicU32,
    size_log2: AtomicU32,
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
    /// The data size is not a power of two between 4 KiB and 64 MiB.
    BadSize,
}

impl std::fmt::Display for RingError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RingError::BadRegion => "the shared region is misaligned or too short",
            RingError::BadHeader => "the shared region holds no sluice ring of this version",
            RingError::BadSize => "the ring size is not a power of two from 4 KiB to 64 MiB",
        })
    }
}

impl std::error::Error for RingError {}

/// The cursors in shared memory say more bytes are waiting than the ring holds (or fewer
/// than none): the peer broke the ring. The connection cannot go on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Corrupt;

impl std::fmt::Display for Corrupt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the peer wrote a ring cursor out of range")
    }
}

impl std::error::Error for Corrupt {}

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
// acquire load — save the old places of bytes a full window's doubling moved, which the
// producer may overwrite while a consumer copies them (that copy is thrown away: `pop`
// sees the window changed and copies again, seqlock-fashion, through raw pointers only);
// a `Ring` is a pointer into memory that outlives it (see `from_raw`).
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
    /// Writes a fresh header for a ring of `size` data bytes, of which the first `window`
    /// are in use, at `ptr` and returns a view.
    ///
    /// # Safety
    /// `ptr` must point to `len` writable bytes, shared only with other [`Ring`] views,
    /// that stay mapped for as long as the returned view (and every other view) lives.
    pub unsafe fn create(ptr: *mut u8, len: usize, size: usize, window: usize) -> Result<Ring, RingError> {
        check_size(size)?;
        check_size(window)?;
        if window > size {
            return Err(RingError::BadSize);
        }
        if !(ptr as usize).is_multiple_of(64) || len < region_len(size) {
            return Err(RingError::BadRegion);
        }
        let h = ptr.cast::<Header>();
        // SAFETY: the caller gives `len ≥ HEADER_LEN` writable, aligned bytes; nobody else
        // uses the ring before `create` returns.
        unsafe {
            h.write(Header {
                info: Line(Info {
                    magic: AtomicU64::new(MAGIC),
                    version: AtomicU32::new(VERSION),
                    size_log2: AtomicU32::new(size.trailing_zeros()),
                }),
                prod: Line(Producer {
                    prod: AtomicU64::new(0),
                    quiet_left: AtomicU32::new(0),
                    window_log2: AtomicU32::new(window.trailing_zeros()),
                }),
                cons: Line(Consumer { cons: AtomicU64::new(0) }),
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
        if info.magic.load(Ordering::Acquire) != MAGIC || info.version.load(Ordering::Relaxed) != VERSION {
            return Err(RingError::BadHeader);
        }
        // Read once: the size this view keeps, whatever the peer writes there later.
        let size = 1usize.checked_shl(info.size_log2.load(Ordering::Relaxed)).ok_or(RingError::BadSize)?;
        check_size(size)?;
        if len < region_len(size) {
            return Err(RingError::BadRegion);
        }
        Ok(Ring { base: NonNull::new(ptr).ok_or(RingError::BadRegion)?, size })
    }

    fn header(&self) -> &Header {
        // SAFETY: `base` points at a header written by `create` (checked in `attach`),
        // mapped for this view's lifetime. Every field is an atomic, so a shared reference
        // stays sound while the peer writes any of them.
        unsafe { &*self.base.as_ptr().cast::<Header>() }
    }

    fn data(&self) -> *mut u8 {
        // SAFETY: the data area follows the header inside the region.
        unsafe { self.base.as_ptr().add(HEADER_LEN) }
    }

    /// The window now: the data bytes the ring holds when full. Read from shared memory
    /// each time (the producer may grow it); one the peer garbled is [`Corrupt`].
    pub fn window(&self) -> Result<usize, Corrupt> {
        let log2 = self.header().prod.0.window_log2.load(Ordering::Acquire);
        match 1usize.checked_shl(log2) {
            Some(w) if (4096..=self.size).contains(&w) => Ok(w),
            _ => Err(Corrupt),
        }
    }

    /// Data bytes the ring holds when full now (the whole area if the window is garbled:
    /// the next push or pop reports that).
    pub fn capacity(&self) -> usize {
        self.window().unwrap_or(self.size)
    }

    /// The most the window can grow to: the data area this view was attached with.
    pub fn max_capacity(&self) -> usize {
        self.size
    }

    /// Producer: doubles the window if the ring is empty and the area has room for it.
    /// Returns the window it has now.
    pub fn grow(&self) -> Result<usize, Corrupt> {
        let h = self.header();
        let w = self.window()?;
        let prod = h.prod.0.prod.load(Ordering::Relaxed);
        let cons = h.cons.0.cons.load(Ordering::Acquire);
        if w >= self.size || prod != cons {
            return Ok(w);
        }
        // Published by the next push's release of the cursor, before which the consumer
        // has nothing to read under either window.
        h.prod.0.window_log2.store((2 * w).trailing_zeros(), Ordering::Release);
        Ok(2 * w)
    }

    /// Producer: doubles the window although the ring holds bytes, if the area has room —
    /// for a ring its reader has let stay full (a program that writes everything before
    /// it reads, talking to one that answers as it reads: TCP's buffers would take more).
    /// Returns the window it has now.
    ///
    /// A byte at position `p` lies at `p mod w` under window `w` and at `p mod 2w` under
    /// the doubled one: the same place for a byte of an even block of the old window, `w`
    /// further for one of an odd block. Those are copied to their new place first — into
    /// the half the old window never used, where no reader under it looks — and only then
    /// is the doubled window published. A reader that copied under the old window while
    /// the producer went on writing under the new one sees the window changed after its
    /// copy and copies again ([`Ring::pop`]); the new places of unread bytes are never
    /// written before the reader passes them.
    pub fn grow_full(&self) -> Result<usize, Corrupt> {
        let h = self.header();
        let w = self.window()?;
        if w >= self.size {
            return Ok(w);
        }
        let prod = h.prod.0.prod.load(Ordering::Relaxed);
        let cons = h.cons.0.cons.load(Ordering::Acquire);
        self.used(prod, cons, w)?;
        let shift = w.trailing_zeros();
        // The unread bytes [cons, prod): at most w of them, so at most two blocks.
        let mut pos = cons;
        for _ in 0..2 {
            if pos == prod {
                break;
            }
            let next_block = ((pos >> shift) + 1) << shift;
            let end = if prod.wrapping_sub(pos) < next_block.wrapping_sub(pos) { prod } else { next_block };
            let n = end.wrapping_sub(pos) as usize;
            if (pos >> shift) & 1 == 1 {
                let at = (pos as usize) & (w - 1);
                // SAFETY: the run lies in one block, so at + n ≤ w; its copy lands in
                // [w + at, w + at + n) ⊆ [w, 2w), and 2w ≤ size: both inside the data
                // area, which stays mapped. Raw pointers only (the peer may write there).
                unsafe { std::ptr::copy_nonoverlapping(self.data().add(at), self.data().add(w + at), n) };
            }
            pos = end;
        }
        h.prod.0.window_log2.store((2 * w).trailing_zeros(), Ordering::Release);
        // The window before any byte written under it (a reader checks it after copying).
        std::sync::atomic::fence(Ordering::Release);
        Ok(2 * w)
    }

    /// The data size this view was attached with (never re-read from shared memory).
    pub fn size_log2(&self) -> u32 {
        self.size.trailing_zeros()
    }

    /// Bytes between `cons` and `prod`, if that is a possible fill of window `w`.
    fn used(&self, prod: u64, cons: u64, w: usize) -> Result<usize, Corrupt> {
        let used = prod.wrapping_sub(cons);
        if used > w as u64 { Err(Corrupt) } else { Ok(used as usize) }
    }

    /// Bytes published and not yet consumed.
    pub fn len(&self) -> Result<usize, Corrupt> {
        let h = self.header();
        let (prod, cons) = (h.prod.0.prod.load(Ordering::Acquire), h.cons.0.cons.load(Ordering::Acquire));
        self.used(prod, cons, self.window()?)
    }

    /// True when nothing is waiting to be read (a broken ring is not empty).
    pub fn is_empty(&self) -> bool {
        self.len() == Ok(0)
    }

    /// Producer: copies as much of `data` as fits and publishes it.
    pub fn push(&self, data: &[u8]) -> Result<Push, Corrupt> {
        self.push_all(&[data])
    }

    /// Producer: copies as much of `bufs`, in order, as fits and publishes it in one step —
    /// a reader sees a vectored write whole or not at all (at most what fits), as TCP sends
    /// it in one segment, never the first buffers without the rest.
    pub fn push_all(&self, bufs: &[&[u8]]) -> Result<Push, Corrupt> {
        let h = self.header();
        let prod = h.prod.0.prod.load(Ordering::Relaxed);
        let cons = h.cons.0.cons.load(Ordering::Acquire);
        let w = self.window()?;
        let free = w - self.used(prod, cons, w)?;
        let mut n = 0usize;
        for data in bufs {
            if n == free {
                break;
            }
            let k = data.len().min(free - n);
            if k == 0 {
                continue;
            }
            let at = (prod as usize).wrapping_add(n) & (w - 1);
            let first = k.min(w - at);
            // SAFETY: n + k ≤ free ≤ w ≤ size (checked above), `at` < w (masked), so
            // [at, at+first) and [0, k-first) lie in the data area, which stays mapped. The
            // peer may write these bytes while we copy (it can lie about its cursor, or just
            // write): shared memory another process writes is never behind a Rust reference
            // here, only raw pointers, and what a racing peer can garble is this
            // connection's bytes alone.
            unsafe {
                std::ptr::copy_nonoverlapping(data.as_ptr(), self.data().add(at), first);
                std::ptr::copy_nonoverlapping(data.as_ptr().add(first), self.data(), k - first);
            }
            n += k;
        }
        if n == 0 {
            return Ok(Push::default());
        }
        // Count before publishing, so the consumer never subtracts what was not added.
        let mut p = Push { n, ..Push::default() };
        let n32 = n as u32; // n ≤ size ≤ MAX_SIZE
        // Only the producer touches the quiet budget: read once, store after the update.
        let left = h.prod.0.quiet_left.load(Ordering::Relaxed);
        let mut new_left = None;
        let _ = h.state.0.word.fetch_update(Ordering::AcqRel, Ordering::Acquire, |old| {
            // Modulo the count's bits: a garbled word stays a word, never a panic.
            let mut new = (old & !AVAIL) | ((old & AVAIL).wrapping_add(n32) & AVAIL);
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
                if old & WATCHED != 0 && !p.wake_sleeper {
                    // Looked for: the reader's event loop finds it before it sleeps.
                    return Some(new);
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
        h.prod.0.prod.store(prod.wrapping_add(n as u64), Ordering::Release);
        Ok(p)
    }

    /// Consumer: copies up to `out.len()` published bytes out; with `peek` they stay in
    /// the ring.
    pub fn pop(&self, out: &mut [u8], peek: bool) -> Result<Pop, Corrupt> {
        let h = self.header();
        let cons = h.cons.0.cons.load(Ordering::Relaxed);
        let prod = h.prod.0.prod.load(Ordering::Acquire);
        // After the cursor: the window these bytes were written under.
        let mut w = self.window()?;
        let n = out.len().min(self.used(prod, cons, w)?);
        if n == 0 {
            return Ok(Pop::default());
        }
        // Bounded: the window only doubles, up to the area (a producer that claims more
        // doublings than that is garbling its own connection).
        for _ in 0..64 {
            let at = (cons as usize) & (w - 1);
            let first = n.min(w - at);
            // SAFETY: n ≤ used ≤ w ≤ size (checked) and `at` < w, so both copies read
            // inside the data area (mapped) and write inside `out`. An honest producer does
            // not touch the bytes below `prod` (acquired) until `cons` passes them; a
            // hostile one may write them during the copy, through raw pointers only (no
            // reference to them exists), which garbles the bytes `out` receives and nothing
            // else.
            unsafe {
                std::ptr::copy_nonoverlapping(self.data().add(at), out.as_mut_ptr(), first);
                std::ptr::copy_nonoverlapping(self.data(), out.as_mut_ptr().add(first), n - first);
            }
            // A window doubled while the ring held bytes (Ring::grow_full): what was
            // copied under the old one may have been overwritten since; copy again. (A
            // plain copy racing the producer's writes, as in a seqlock: the bytes are
            // thrown away, never trusted. A window that shrank is a lying producer's.)
            std::sync::atomic::fence(Ordering::Acquire);
            let now = self.window()?;
            if now == w {
                break;
            }
            if now < w {
                return Err(Corrupt);
            }
            w = now;
        }
        if peek {
            return Ok(Pop { n, ..Pop::default() });
        }
        Ok(self.consumed(cons, n))
    }

    /// Consumer: publishes `n` bytes consumed at `cons` and counts them off the state
    /// word, ending the epoch when they were the last.
    fn consumed(&self, cons: u64, n: usize) -> Pop {
        let h = self.header();
        h.cons.0.cons.store(cons.wrapping_add(n as u64), Ordering::Release);
        let mut p = Pop { n, ..Pop::default() };
        let _ = h.state.0.word.fetch_update(Ordering::AcqRel, Ordering::Acquire, |old| {
            let mut new = (old & !AVAIL) | ((old & AVAIL).wrapping_sub(n as u32) & AVAIL);
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
    pub fn skip(&self, n: usize) -> Result<Pop, Corrupt> {
        let h = self.header();
        let cons = h.cons.0.cons.load(Ordering::Relaxed);
        let prod = h.prod.0.prod.load(Ordering::Acquire);
        let n = n.min(self.used(prod, cons, self.window()?)?);
        if n == 0 {
            return Ok(Pop::default());
        }
        Ok(self.consumed(cons, n))
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

    /// Consumer: the reader's event loop is awake and will look at this ring before it
    /// sleeps: epochs opened from now on ring no doorbell (until [`Ring::unwatch`]).
    pub fn watch(&self) {
        self.header().state.0.word.fetch_or(WATCHED, Ordering::AcqRel);
    }

    /// Consumer: about to wait on the descriptor (or no longer looking): epochs opened
    /// from now on ring the doorbell again. Returns true when bytes are counted — an
    /// epoch may have opened unrung — so the caller must not sleep on its descriptor but
    /// read (or report the ring readable) first.
    pub fn unwatch(&self) -> bool {
        self.header().state.0.word.fetch_and(!WATCHED, Ordering::AcqRel) & AVAIL != 0
    }

    /// Consumer: whether the event loop's promise stands ([`Ring::watch`]).
    pub fn watched(&self) -> bool {
        self.header().state.0.word.load(Ordering::Relaxed) & WATCHED != 0
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

    /// True while bytes are counted in the state word (published, or about to be: the
    /// producer counts before it publishes).
    pub fn counted(&self) -> bool {
        self.header().state.0.word.load(Ordering::Acquire) & AVAIL != 0
    }

    /// True while an epoch that rang the doorbell is open: one doorbell byte is (or is
    /// about to be) waiting on the reader's descriptor for it.
    pub fn bell_open(&self) -> bool {
        let w = self.header().state.0.word.load(Ordering::Acquire);
        w & BELL != 0 && w & AVAIL != 0
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
        let w = unsafe { Ring::create(ptr, len, 4096, 4096) }.unwrap();
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
                    let p = w.push(&buf).unwrap();
                    sent += p.n;
                    wakes += u64::from(p.ring_bell);
                    assert!(!p.wake_sleeper, "nobody slept");
                }
                wakes
            });
            let mut got = 0usize;
            let mut out = vec![0u8; 1000];
            while got < total {
                let p = r.pop(&mut out[..1 + got % 999], false).unwrap();
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
    fn a_vectored_push_publishes_its_buffers_at_once_in_order_as_far_as_they_fit() {
        let mut mem = region(4096);
        let len = mem.len() * 64;
        let ptr = mem.as_mut_ptr().cast::<u8>();
        // SAFETY: `mem` outlives both views and is used only through them.
        let w = unsafe { Ring::create(ptr, len, 4096, 4096) }.unwrap();
        // SAFETY: as above.
        let r = unsafe { Ring::attach(ptr, len) }.unwrap();
        let mut out = vec![0u8; 4096];
        // Move the cursors near the end, so the buffers wrap.
        w.push(&[9; 4000]).unwrap();
        assert_eq!(r.pop(&mut out, false).unwrap().n, 4000);
        let (a, b, c) = ([1u8; 60], [2u8; 0], [3u8; 100]);
        assert_eq!(w.push_all(&[&a, &b, &c]).unwrap(), Push { n: 160, ring_bell: true, wake_sleeper: false });
        let p = r.pop(&mut out, false).unwrap();
        assert_eq!(p, Pop { n: 160, take_bell: true, emptied: true }, "one epoch for the three");
        assert!(out[..60].iter().all(|&x| x == 1) && out[60..160].iter().all(|&x| x == 3));
        // As far as they fit: 4096 of 3 × 2000.
        let big = [7u8; 2000];
        assert_eq!(w.push_all(&[&big, &big, &big]).unwrap().n, 4096);
        assert_eq!(w.push_all(&[&big]).unwrap().n, 0, "full");
        assert_eq!(r.pop(&mut out, false).unwrap().n, 4096);
        assert!(out.iter().all(|&x| x == 7));
    }

    #[test]
    fn peek_leaves_bytes_and_flags_round_trip() {
        let mut mem = region(4096);
        let len = mem.len() * 64;
        let ptr = mem.as_mut_ptr().cast::<u8>();
        // SAFETY: `mem` outlives the view.
        let ring = unsafe { Ring::create(ptr, len, 4096, 4096) }.unwrap();
        assert_eq!(ring.push(b"hello").unwrap(), Push { n: 5, ring_bell: true, wake_sleeper: false });
        assert_eq!(ring.push(b" world").unwrap(), Push { n: 6, ring_bell: false, wake_sleeper: false });
        let mut out = [0u8; 5];
        assert_eq!(ring.pop(&mut out, true).unwrap(), Pop { n: 5, take_bell: false, emptied: false });
        assert_eq!(ring.len(), Ok(11));
        assert_eq!(ring.skip(5).unwrap(), Pop { n: 5, take_bell: false, emptied: false });
        let mut out = [0u8; 64];
        assert_eq!(ring.pop(&mut out, false).unwrap(), Pop { n: 6, take_bell: true, emptied: true });
        assert_eq!(&out[..6], b" world");
        assert_eq!(ring.push(&[7u8; 5000]).unwrap().n, 4096, "a full ring takes no more");
        assert_eq!(ring.push(b"x").unwrap().n, 0);
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
        let ring = unsafe { Ring::create(ptr, len, 4096, 4096) }.unwrap();
        let mut out = [0u8; 100];
        // Asleep with room for 100: 60 + 40 arrive quietly; 1 more turns the epoch loud.
        let v = ring.prepare_sleep(100).unwrap();
        assert_eq!(ring.state_word().load(Ordering::Relaxed), v);
        assert_eq!(ring.push(&[1; 60]).unwrap(), Push { n: 60, ring_bell: false, wake_sleeper: true });
        assert!(ring.quiet());
        assert_eq!(ring.push(&[2; 40]).unwrap(), Push { n: 40, ring_bell: false, wake_sleeper: false });
        assert_eq!(ring.push(&[3; 1]).unwrap(), Push { n: 1, ring_bell: true, wake_sleeper: false });
        assert!(!ring.quiet());
        assert_eq!(ring.pop(&mut out, false).unwrap(), Pop { n: 100, take_bell: false, emptied: false });
        assert_eq!(ring.pop(&mut out, false).unwrap(), Pop { n: 1, take_bell: true, emptied: true });
        // Too much for the sleeper's buffer at once: a bell, and a wake.
        ring.prepare_sleep(10).unwrap();
        assert_eq!(ring.push(&[4; 11]).unwrap(), Push { n: 11, ring_bell: true, wake_sleeper: true });
        assert_eq!(ring.prepare_sleep(10), Err(Awake::Data), "bytes are waiting");
        assert_eq!(ring.pop(&mut out, false).unwrap(), Pop { n: 11, take_bell: true, emptied: true });
        // A reader that gave up sleeping is not woken; a peek (room 0) always gets a bell.
        ring.prepare_sleep(50).unwrap();
        ring.cancel_sleep();
        assert_eq!(ring.push(&[5; 5]).unwrap(), Push { n: 5, ring_bell: true, wake_sleeper: false });
        assert!(ring.pop(&mut out, false).unwrap().take_bell);
        ring.prepare_sleep(0).unwrap();
        assert_eq!(ring.push(&[6; 5]).unwrap(), Push { n: 5, ring_bell: true, wake_sleeper: true });
        assert!(ring.pop(&mut out, false).unwrap().take_bell);
        // A poke (a shutdown) keeps the reader from sleeping, for good.
        ring.poke();
        assert_eq!(ring.prepare_sleep(50), Err(Awake::Poked));
        assert!(ring.push(&[7; 5]).unwrap().ring_bell, "bytes still count");
        assert_eq!(ring.pop(&mut out, false).unwrap(), Pop { n: 5, take_bell: true, emptied: true });
    }

    #[test]
    fn a_watched_ring_opens_epochs_without_a_bell_until_the_reader_takes_its_promise_back() {
        let mut mem = region(4096);
        let len = mem.len() * 64;
        let ptr = mem.as_mut_ptr().cast::<u8>();
        // SAFETY: `mem` outlives the view.
        let ring = unsafe { Ring::create(ptr, len, 4096, 4096) }.unwrap();
        let mut out = [0u8; 100];
        ring.watch();
        assert!(ring.watched());
        // Looked for: no byte to send, none to take.
        assert_eq!(ring.push(&[1; 10]).unwrap(), Push { n: 10, ring_bell: false, wake_sleeper: false });
        assert!(!ring.bell_open() && !ring.quiet());
        assert_eq!(ring.pop(&mut out, false).unwrap(), Pop { n: 10, take_bell: false, emptied: true });
        // A reader asleep in the library is still woken, by its futex.
        let _ = ring.prepare_sleep(100).unwrap();
        assert_eq!(ring.push(&[2; 10]).unwrap(), Push { n: 10, ring_bell: false, wake_sleeper: true });
        assert!(ring.quiet());
        assert_eq!(ring.pop(&mut out, false).unwrap(), Pop { n: 10, take_bell: false, emptied: true });
        // An epoch opened unrung is reported to the reader that takes its promise back
        // before waiting on its descriptor — it must read first.
        assert!(!ring.push(&[3; 10]).unwrap().ring_bell);
        assert!(ring.unwatch(), "bytes counted: do not sleep");
        assert!(!ring.watched());
        assert_eq!(ring.pop(&mut out, false).unwrap(), Pop { n: 10, take_bell: false, emptied: true });
        // No longer watched: the next epoch rings again, and an empty ring is nothing to read.
        assert!(!ring.unwatch());
        assert_eq!(ring.push(&[4; 10]).unwrap(), Push { n: 10, ring_bell: true, wake_sleeper: false });
        assert_eq!(ring.pop(&mut out, false).unwrap(), Pop { n: 10, take_bell: true, emptied: true });
    }

    #[test]
    fn quiet_epochs_always_end_in_the_read_that_slept() {
        let mut mem = region(4096);
        let len = mem.len() * 64;
        let ptr = mem.as_mut_ptr().cast::<u8>();
        // SAFETY: `mem` outlives both views and is used only through them.
        let w = unsafe { Ring::create(ptr, len, 4096, 4096) }.unwrap();
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
                    let p = w.push(&buf).unwrap();
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
                    let p = r.pop(&mut out[k..room], false).unwrap();
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

    /// A window that grows only while the ring is empty: bytes cross in order through
    /// every doubling, and a full ring never grows under its reader.
    #[test]
    fn the_window_doubles_only_when_empty_and_bytes_cross_it_in_order() {
        let size = 64 * 1024;
        let mut mem = region(size);
        let len = mem.len() * 64;
        let ptr = mem.as_mut_ptr().cast::<u8>();
        // SAFETY: `mem` outlives both views and is used only through them.
        let w = unsafe { Ring::create(ptr, len, size, 4096) }.unwrap();
        // SAFETY: as above.
        let r = unsafe { Ring::attach(ptr, len) }.unwrap();
        assert_eq!((w.capacity(), r.max_capacity()), (4096, size));
        assert_eq!(w.push(&[1; 100]).unwrap().n, 100);
        assert_eq!(w.grow(), Ok(4096), "not while bytes wait");
        let mut out = vec![0u8; 200];
        assert_eq!(r.pop(&mut out, false).unwrap().n, 100);
        assert_eq!(w.grow(), Ok(8192));
        assert_eq!(r.capacity(), 8192);
        let total = 2_000_000usize;
        std::thread::scope(|s| {
            s.spawn(|| {
                let mut sent = 0usize;
                let mut wanted = false;
                while sent < total {
                    if wanted {
                        // Found full before: wait for the reader to empty it (it keeps
                        // reading), then the window doubles.
                        while !w.is_empty() {
                            std::thread::yield_now();
                        }
                        let _ = w.grow().unwrap();
                        wanted = false;
                    }
                    let want = (total - sent).min(1 + sent % 7001);
                    let buf: Vec<u8> = (0..want).map(|i| ((sent + i) % 253) as u8).collect();
                    let n = w.push(&buf).unwrap().n;
                    wanted |= n < want;
                    sent += n;
                }
            });
            let mut got = 0usize;
            let mut buf = vec![0u8; 3000];
            while got < total {
                let k = r.pop(&mut buf, false).unwrap().n;
                for (i, b) in buf[..k].iter().enumerate() {
                    assert_eq!(*b, ((got + i) % 253) as u8, "byte {}", got + i);
                }
                got += k;
            }
        });
        assert!(r.capacity() > 8192, "it grew: {}", r.capacity());
        assert!(r.capacity() <= size);
    }

    #[test]
    fn a_full_window_doubles_and_its_bytes_stay_in_order() {
        let size = 4 * 4096;
        let mut mem = region(size);
        let len = region_len(size);
        // SAFETY: `mem` outlives both views and holds `len` bytes.
        let (tx, rx) = unsafe {
            let p = mem.as_mut_ptr().cast();
            (Ring::create(p, len, size, 4096).unwrap(), Ring::attach(p, len).unwrap())
        };
        let mut next = 0u8;
        let mut want = 0u8;
        let mut fill = |tx: &Ring, n: usize| {
            let data: Vec<u8> = (1..=n).map(|i| next.wrapping_add((7 * i) as u8)).collect();
            let pushed = tx.push(&data).unwrap().n;
            next = next.wrapping_add((7 * pushed) as u8);
            pushed
        };
        let mut take = |rx: &Ring, n: usize| {
            let mut out = vec![0u8; n];
            let got = rx.pop(&mut out, false).unwrap().n;
            for &b in &out[..got] {
                want = want.wrapping_add(7);
                assert_eq!(b, want);
            }
            got
        };
        // Full, its bytes straddling a block (positions 3000..7096: blocks 0 and 1).
        assert_eq!(fill(&tx, 3000), 3000);
        assert_eq!(take(&rx, 3000), 3000);
        assert_eq!(fill(&tx, 5000), 4096);
        assert_eq!(tx.grow_full().unwrap(), 8192);
        assert_eq!(fill(&tx, 5000), 4096, "the doubled window takes as much again");
        // Full again, at an odd place: it doubles once more, then not past the area.
        assert_eq!(take(&rx, 1000), 1000);
        assert_eq!(fill(&tx, 1000), 1000);
        assert_eq!(tx.grow_full().unwrap(), 16384);
        assert_eq!(tx.grow_full().unwrap(), 16384);
        assert_eq!(fill(&tx, 9000), 8192);
        let mut left = 16384;
        while left > 0 {
            left -= take(&rx, 1500);
        }
        assert!(rx.is_empty());
    }

    #[test]
    fn bytes_cross_in_order_while_a_full_window_doubles_under_a_reading_consumer() {
        // A 4 KiB window in a 64 KiB area: the producer doubles it whenever it finds the
        // ring full, while the consumer on another thread reads in odd sizes (its copies
        // race the doublings: `pop` must copy again when the window changed under it).
        let mut grew = 0;
        for round in 0..20u64 {
            let size = 16 * 4096;
            let mut mem = region(size);
            let len = region_len(size);
            let p = mem.as_mut_ptr() as usize;
            // SAFETY: `mem` outlives both views (the threads are joined below).
            let (tx, rx) = unsafe {
                (Ring::create(p as *mut u8, len, size, 4096).unwrap(), Ring::attach(p as *mut u8, len).unwrap())
            };
            const TOTAL: u64 = 1 << 20;
            let producer = std::thread::spawn(move || {
                let mut sent = 0u64;
                while sent < TOTAL {
                    let chunk: Vec<u8> = (sent..(sent + 3001).min(TOTAL)).map(|i| (i * 131 + round) as u8).collect();
                    let n = tx.push(&chunk).unwrap().n;
                    if n == 0 {
                        tx.grow_full().unwrap();
                        std::thread::yield_now();
                    }
                    sent += n as u64;
                }
                tx.capacity()
            });
            let mut got = 0u64;
            let mut buf = vec![0u8; 1777];
            while got < TOTAL {
                let n = rx.pop(&mut buf, false).unwrap().n;
                for (k, &b) in buf[..n].iter().enumerate() {
                    assert_eq!(b, ((got + k as u64) * 131 + round) as u8, "byte {} of round {round}", got + k as u64);
                }
                got += n as u64;
            }
            grew += usize::from(producer.join().unwrap() > 4096);
            drop(mem);
        }
        assert!(grew > 0, "a window grew in some round (the consumer checks every byte: it falls behind)");
    }

    #[test]
    fn bad_regions_are_refused() {
        let mut mem = region(8192);
        let len = mem.len() * 64;
        let ptr = mem.as_mut_ptr().cast::<u8>();
        // SAFETY: `mem` outlives every view; failed calls write nothing.
        unsafe {
            assert_eq!(Ring::create(ptr, len, 3000, 3000).err(), Some(RingError::BadSize));
            assert_eq!(Ring::create(ptr.add(1), len - 1, 4096, 4096).err(), Some(RingError::BadRegion));
            assert_eq!(Ring::create(ptr, 4096, 4096, 4096).err(), Some(RingError::BadRegion));
            assert_eq!(Ring::attach(ptr, len).err(), Some(RingError::BadHeader));
            Ring::create(ptr, len, 8192, 8192).unwrap();
            assert_eq!(Ring::attach(ptr, 4096).err(), Some(RingError::BadRegion));
            assert_eq!(Ring::attach(ptr, len).unwrap().capacity(), 8192);
        }
    }

    /// Every word of the header a hostile peer could write, set to garbage between calls:
    /// each call either works within the data area or answers `Corrupt` — never a copy out
    /// of bounds (the test runs under the normal allocator; an overrun would corrupt the
    /// guard bytes after the region, which are checked at the end).
    #[test]
    fn garbage_cursors_are_refused_never_followed() {
        let size = 8192;
        let mut mem = region(size + 64);
        let len = mem.len() * 64;
        let ptr = mem.as_mut_ptr().cast::<u8>();
        // Guard bytes past the ring's region.
        // SAFETY: the region is `len` bytes; the ring uses region_len(size) of them.
        unsafe { std::ptr::write_bytes(ptr.add(region_len(size)), 0xA5, len - region_len(size)) };
        // SAFETY: `mem` outlives both views and is used only through them and the pokes.
        let w = unsafe { Ring::create(ptr, region_len(size), size, size / 2) }.unwrap();
        // SAFETY: as above.
        let r = unsafe { Ring::attach(ptr, region_len(size)) }.unwrap();
        let poke = |off: usize, v: u64| {
            // SAFETY: `off` is a cursor's offset in the header, 8-byte aligned.
            unsafe { (ptr.add(off) as *mut u64).write_volatile(v) }
        };
        let (prod_at, cons_at) = (64, 128);
        let mut out = vec![0u8; 3 * size];
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        let mut refused = 0;
        for i in 0..20_000u64 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            match i % 4 {
                0 => poke(prod_at, seed),
                1 => poke(cons_at, seed),
                2 => poke(prod_at, seed % (2 * size as u64)),
                _ => {
                    poke(prod_at, 0);
                    poke(cons_at, 0);
                }
            }
            // SAFETY: the state word's line; any value is a valid u32.
            unsafe { (ptr.add(192) as *mut u32).write_volatile(seed as u32) };
            if i % 5 == 0 {
                // The window: garbage, or a possible one.
                let log2 = if i % 10 == 0 { (seed >> 32) as u32 } else { 12 + (seed % 2) as u32 };
                // SAFETY: the window's word in the producer's line; any value is a valid u32.
                unsafe { (ptr.add(76) as *mut u32).write_volatile(log2) };
            }
            let results = [
                w.push(&out[..(seed as usize) % (2 * size)]).map(|p| p.n),
                r.pop(&mut out[..(seed as usize >> 8) % (3 * size)], i % 3 == 0).map(|p| p.n),
                r.skip((seed >> 16) as usize).map(|p| p.n),
                r.len(),
            ];
            for res in results {
                match res {
                    Ok(n) => assert!(n <= size, "{n} bytes from a {size}-byte ring"),
                    Err(Corrupt) => refused += 1,
                }
            }
        }
        assert!(refused > 1000, "garbage was noticed: {refused}");
        // SAFETY: reading our own guard bytes.
        let guard = unsafe { std::slice::from_raw_parts(ptr.add(region_len(size)), len - region_len(size)) };
        assert!(guard.iter().all(|b| *b == 0xA5), "nothing was written past the ring");
        // A sane ring still works after the peer put the cursors back.
        poke(prod_at, 1000);
        poke(cons_at, 1000);
        assert_eq!(w.push(b"again").unwrap().n, 5);
        assert_eq!(r.pop(&mut out[..5], false).unwrap().n, 5);
        assert_eq!(&out[..5], b"again");
    }
}

//! A single-producer, single-consumer byte ring in shared memory, one per direction of a
//! connection (docs/architecture.md, "Data path").
//!
//! Layout (all cache-line aligned): a header line that never changes after creation, the
//! producer cursor on its own line (written only by the producer), the consumer cursor on
//! its own line (written only by the consumer), a line with `avail` and the flags, then the
//! data area, a power of two of bytes. Cursors count bytes from the start and never wrap
//! in practice (2^64 bytes).
//!
//! `avail` — bytes published and not yet consumed — changes only by atomic read-modify-
//! write, so its transitions between 0 and non-zero alternate in one total order: the
//! producer's add that finds 0 is told to wake the reader ([`Push::wake_reader`]), the
//! consumer's subtract that reaches 0 is told the ring emptied ([`Pop::emptied`]). The
//! producer adds to `avail` *before* it publishes its cursor, so the consumer, which only
//! consumes what the cursor published, can never take `avail` below zero.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Bytes before the data area.
pub const HEADER_LEN: usize = 256;
/// "SLUICERG" in ASCII.
pub const MAGIC: u64 = 0x5352_4543_4955_4c53;
/// Layout version.
pub const VERSION: u32 = 1;

/// The reader's peer has shut down writing: after the data, EOF.
pub const FLAG_SHUTDOWN_WR: u32 = 1;
/// The writer found the ring full and waits for room.
pub const FLAG_WRITER_WAITING: u32 = 2;

#[repr(C, align(64))]
struct Line<T>(T);

/// The header at the start of the shared region.
#[repr(C)]
struct Header {
    info: Line<Info>,
    prod: Line<AtomicU64>,
    cons: Line<AtomicU64>,
    state: Line<State>,
}

#[repr(C)]
struct Info {
    magic: u64,
    version: u32,
    size_log2: u32,
}

#[repr(C)]
struct State {
    avail: AtomicU64,
    flags: AtomicU32,
}

const _: () = assert!(std::mem::size_of::<Header>() == HEADER_LEN);

/// Why a region cannot hold a ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RingError {
    /// The region is not 64-byte aligned, or shorter than its header says.
    BadRegion,
    /// Not a sluice ring, or another layout version.
    BadHeader,
    /// The data size is not a power of two between 4 KiB and 1 GiB.
    BadSize,
}

impl std::fmt::Display for RingError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RingError::BadRegion => "the shared region is misaligned or too short",
            RingError::BadHeader => "the shared region holds no sluice ring of this version",
            RingError::BadSize => "the ring size is not a power of two from 4 KiB to 1 GiB",
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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Push {
    /// Bytes copied in (0 when the ring is full).
    pub n: usize,
    /// The ring was empty: the reader may be asleep and must be woken.
    pub wake_reader: bool,
}

/// What a [`Ring::pop`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pop {
    /// Bytes copied out.
    pub n: usize,
    /// This call emptied the ring (the matching wake-up, if any, is now stale).
    pub emptied: bool,
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
                prod: Line(AtomicU64::new(0)),
                cons: Line(AtomicU64::new(0)),
                state: Line(State { avail: AtomicU64::new(0), flags: AtomicU32::new(0) }),
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
        (h.prod.0.load(Ordering::Acquire) - h.cons.0.load(Ordering::Acquire)) as usize
    }

    /// True when nothing is waiting to be read.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Producer: copies as much of `data` as fits and publishes it.
    pub fn push(&self, data: &[u8]) -> Push {
        let h = self.header();
        let prod = h.prod.0.load(Ordering::Relaxed);
        let cons = h.cons.0.load(Ordering::Acquire);
        let free = self.size - (prod - cons) as usize;
        let n = data.len().min(free);
        if n == 0 {
            return Push { n: 0, wake_reader: false };
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
        let before = h.state.0.avail.fetch_add(n as u64, Ordering::AcqRel);
        h.prod.0.store(prod + n as u64, Ordering::Release);
        Push { n, wake_reader: before == 0 }
    }

    /// Consumer: copies up to `out.len()` published bytes out; with `peek` they stay in
    /// the ring.
    pub fn pop(&self, out: &mut [u8], peek: bool) -> Pop {
        let h = self.header();
        let cons = h.cons.0.load(Ordering::Relaxed);
        let prod = h.prod.0.load(Ordering::Acquire);
        let n = out.len().min((prod - cons) as usize);
        if n == 0 {
            return Pop { n: 0, emptied: false };
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
            return Pop { n, emptied: false };
        }
        h.cons.0.store(cons + n as u64, Ordering::Release);
        let before = h.state.0.avail.fetch_sub(n as u64, Ordering::AcqRel);
        Pop { n, emptied: before == n as u64 }
    }

    /// Consumer: drops up to `n` published bytes without copying them.
    pub fn skip(&self, n: usize) -> Pop {
        let h = self.header();
        let cons = h.cons.0.load(Ordering::Relaxed);
        let prod = h.prod.0.load(Ordering::Acquire);
        let n = n.min((prod - cons) as usize);
        if n == 0 {
            return Pop { n: 0, emptied: false };
        }
        h.cons.0.store(cons + n as u64, Ordering::Release);
        let before = h.state.0.avail.fetch_sub(n as u64, Ordering::AcqRel);
        Pop { n, emptied: before == n as u64 }
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
    if size.is_power_of_two() && (4096..=1 << 30).contains(&size) { Ok(()) } else { Err(RingError::BadSize) }
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
                    wakes += u64::from(p.wake_reader);
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
                empties += u64::from(p.emptied);
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
        assert_eq!(ring.push(b"hello"), Push { n: 5, wake_reader: true });
        assert_eq!(ring.push(b" world"), Push { n: 6, wake_reader: false });
        let mut out = [0u8; 5];
        assert_eq!(ring.pop(&mut out, true), Pop { n: 5, emptied: false });
        assert_eq!(ring.len(), 11);
        assert_eq!(ring.skip(5), Pop { n: 5, emptied: false });
        let mut out = [0u8; 64];
        assert_eq!(ring.pop(&mut out, false), Pop { n: 6, emptied: true });
        assert_eq!(&out[..6], b" world");
        assert_eq!(ring.push(&[7u8; 5000]).n, 4096, "a full ring takes no more");
        assert_eq!(ring.push(b"x").n, 0);
        ring.set_flags(FLAG_WRITER_WAITING);
        assert!(ring.has_flags(FLAG_WRITER_WAITING));
        assert!(ring.take_flags(FLAG_WRITER_WAITING));
        assert!(!ring.take_flags(FLAG_WRITER_WAITING));
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

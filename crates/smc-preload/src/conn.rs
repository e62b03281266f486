//! One connection on shared memory, and reading and writing it with TCP's semantics
//! (docs/architecture.md, "Data path", "Wake-ups" and "Connections at TCP's cost").
//!
//! The application's descriptor is one end of a unix socket pair (the "doorbell"); the
//! other end is the peer's. `peer_bell` is the peer's pair's other end: a byte written
//! there makes the peer's descriptor readable, and filler this side leaves in its own
//! descriptor's send direction is drained from there by the peer. (One pair for both
//! directions was tried: a late doorbell byte and filler then share one queue and cannot
//! be told apart, and wrk was told EAGAIN after poll said readable.)
//!
//! The rings are memory the peer can write, so every call that reads them may find them
//! broken ([`sluice_smc::ring::Corrupt`]): that connection is then reset — the pair shut
//! down both ways, counted as a peer fault — and nothing else happens. What must not
//! be in the peer's reach (the locks that serialize forked processes) lives on a page of
//! this side's own ([`Side`]).
//!
//! A client's connection is *pending* from `connect` until the server decides (the
//! slot's control word, sluice_smc::slot): writes go into the ring meanwhile; a read that
//! finds the server declined, or that the server took the connection as plain TCP,
//! answers [`FELL_BACK`] and the caller moves the descriptor back to TCP
//! (crate::pending).

use std::ffi::c_int;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, Ordering, fence};

use sluice_smc::ring::{Corrupt, FLAG_SHUTDOWN_WR, FLAG_WRITER_SLEEPING, FLAG_WRITER_WAITING, Push, Ring};
use sluice_smc::slot::{self, Control, State};
use sluice_smc::stats::Counter;

use crate::arena::Arena;
use crate::cabi;
use crate::sys::{self, Shm};

/// Not an errno: a pending connection's server did not take it onto shared memory; the
/// caller hands the descriptor back to TCP and makes the call there (crate::pending).
pub const FELL_BACK: c_int = 0x5eec_0001;

/// The peer closed with unread data (as TCP answers with a reset).
pub const FLAG_RESET: u32 = 4;

/// How long a blocking read or write sleeps on the ring's futex before it waits on its
/// descriptor instead — where an idle connection costs nothing and a dead peer shows.
const FUTEX_SLICE_MS: i32 = 50;
/// How long a blocking writer waits on its descriptor for room before the full ring
/// grows (Conn::write_from).
const STALL_MS: i32 = 50;
/// How long a non-blocking reader that emptied a bell epoch waits for its doorbell byte.
const BELL_WAIT_MS: i32 = 20;
/// The same while the server has not decided: between slices the read looks whether it
/// declined (or took the connection as TCP), which wakes nobody here.
const PENDING_SLICE_MS: i32 = 2;
/// How long a blocking read of a pending connection sleeps in such slices before it waits
/// on its two descriptors instead (the doorbell, which the server's first write rings,
/// and the TCP socket, where a server that took the connection as TCP writes): a server
/// this slow to decide is a busy one, and each slice that ends wakes the reader for
/// nothing.
const PENDING_FUTEX_MS: u128 = 4;
/// The longest a client's connection stays pending: then the client gives up on it (first,
/// by compare-and-swap, so the server cannot commit it any more) and stays on TCP, where
/// what it wrote meanwhile goes. A server declines or commits within its `accept`; one
/// that never decides costs its clients this long, once.
pub const DECISION_MS: u64 = 10_000;

/// A lock in the ring's shared header: one reader and one writer at a time across every
/// thread of every process holding the connection (a forked child and its parent write
/// in turn, as they would to one TCP socket). The word holds the holder's pid, with
/// [`WAITERS`] set when someone sleeps on it; a waiter that finds the holder's process
/// dead takes the lock over.
struct SharedLock<'a>(&'a AtomicU32);

const WAITERS: u32 = 1 << 31;

impl<'a> SharedLock<'a> {
    fn take(word: &'a AtomicU32) -> SharedLock<'a> {
        let me = sys::pid();
        loop {
            let cur = match word.compare_exchange(0, me, Ordering::Acquire, Ordering::Relaxed) {
                Ok(_) => return SharedLock(word),
                Err(cur) => cur,
            };
            let w = cur | WAITERS;
            if cur & WAITERS == 0 && word.compare_exchange(cur, w, Ordering::Relaxed, Ordering::Relaxed).is_err() {
                continue;
            }
            if sys::futex_wait(word, w, 100) == sys::Woke::TimedOut && !sys::alive(w & !WAITERS) {
                // The holder died holding it (killed mid-call): take it over.
                let _ = word.compare_exchange(w, 0, Ordering::Relaxed, Ordering::Relaxed);
            }
        }
    }

    /// The lock if nobody holds it now.
    fn try_take(word: &'a AtomicU32) -> Option<SharedLock<'a>> {
        word.compare_exchange(0, sys::pid(), Ordering::Acquire, Ordering::Relaxed).ok().map(|_| SharedLock(word))
    }
}

impl Drop for SharedLock<'_> {
    fn drop(&mut self) {
        if self.0.swap(0, Ordering::Release) & WAITERS != 0 {
            sys::futex_wake(self.0);
        }
    }
}

/// This side's own shared words of a connection (its fork-wide locks): in memory shared
/// with the processes this one forks (a memfd of this process's, mapped `MAP_SHARED` and
/// inherited as shared, and handed to a program it runs with the connection:
/// crate::carry), never reachable by the peer. Carved from chunks that are kept and
/// reused, so a connection maps nothing: a slot goes back to the pool when its connection
/// ends — unless the process forked meanwhile (a child may still hold the connection, and
/// its locks), or the words came from the program that ran this one.
pub struct Side {
    at: *mut u8,
    fork_epoch: u64,
    /// Taken from the pool, not carried in: its maker is named when the connection is made.
    fresh: bool,
}

// SAFETY: a pointer into a mapping that is never unmapped; only atomics touch it.
unsafe impl Send for Side {}
// SAFETY: as above.
unsafe impl Sync for Side {}

/// Bytes of one side's slot: three words on their own cache lines.
const SIDE_LEN: usize = 192;
/// Bytes of a chunk of slots.
const SIDE_CHUNK: usize = 48 * 1024;

/// Free slots, and the process they belong to (a forked child starts a pool of its own).
static SIDES: std::sync::Mutex<(u32, Vec<usize>)> = std::sync::Mutex::new((0, Vec::new()));
/// A chunk mapped in this process: its address, its memfd (a close-on-exec descriptor
/// among the library's) and the file's identity (device, inode).
type Chunk = (usize, c_int, (u64, u64));
/// Every chunk mapped in this process.
static CHUNKS: std::sync::Mutex<Vec<Chunk>> = std::sync::Mutex::new(Vec::new());
/// Forks so far in this process (a slot made before one is not reused).
pub static FORKS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

impl Side {
    /// Fresh words (taken before the server commits, so that building the connection
    /// afterwards cannot fail).
    pub fn new() -> std::io::Result<Side> {
        let mut pool = SIDES.lock().unwrap_or_else(|p| p.into_inner());
        let me = sys::pid();
        if pool.0 != me {
            // Inherited slots are the parent's connections' (and shared with it).
            *pool = (me, Vec::new());
        }
        if pool.1.is_empty() {
            let chunk = Shm::create(SIDE_CHUNK)?;
            let id = sys::file_id(chunk.fd).unwrap_or_default();
            let base = keep(&mut CHUNKS.lock().unwrap_or_else(|p| p.into_inner()), chunk, id);
            pool.1.extend((0..SIDE_CHUNK / SIDE_LEN).rev().map(|i| base + i * SIDE_LEN));
        }
        let at = pool.1.pop().unwrap_or_default() as *mut u8;
        Ok(Side { at, fork_epoch: FORKS.load(Ordering::Relaxed), fresh: true })
    }

    /// Where the words are: their chunk's memfd and their offset in it.
    pub fn place(&self) -> Option<(c_int, usize)> {
        let at = self.at as usize;
        let chunks = CHUNKS.lock().unwrap_or_else(|p| p.into_inner());
        chunks.iter().find(|c| (c.0..c.0 + SIDE_CHUNK).contains(&at)).map(|c| (c.1, at - c.0))
    }

    /// The words at `offset` of chunk memfd `fd` (which it takes), carried in from the
    /// program that ran this one: the chunk mapped once it is shown to be a memfd of a
    /// chunk's size. Never given back to the pool (the processes that forked the program
    /// may still use them).
    pub fn carried(fd: c_int, offset: usize) -> Option<Side> {
        let ok =
            offset.is_multiple_of(SIDE_LEN) && offset + SIDE_LEN <= SIDE_CHUNK && sys::is_sealed_shm(fd, SIDE_CHUNK);
        let Some(id) = sys::file_id(fd).filter(|_| ok) else {
            sys::close(fd);
            return None;
        };
        let mut chunks = CHUNKS.lock().unwrap_or_else(|p| p.into_inner());
        let base = match chunks.iter().find(|c| c.2 == id) {
            Some(c) => {
                sys::close(fd);
                c.0
            }
            None => keep(&mut chunks, Shm::map(fd, SIDE_CHUNK).ok()?, id),
        };
        Some(Side { at: (base + offset) as *mut u8, fork_epoch: u64::MAX, fresh: false })
    }

    fn word(&self, line: usize) -> &AtomicU32 {
        // SAFETY: a 192-byte slot of a page-aligned shared mapping that is never unmapped;
        // lines 0–2 are 64-byte-aligned u32 words written only through atomics.
        unsafe { &*self.at.add(line * 64).cast::<AtomicU32>() }
    }

    /// The lock readers hold while they pop.
    fn reader_lock(&self) -> &AtomicU32 {
        self.word(0)
    }

    /// The lock writers hold while they push.
    fn writer_lock(&self) -> &AtomicU32 {
        self.word(1)
    }

    /// Doorbell bytes that must still come off our descriptor (for bell epochs that ended
    /// before their byte arrived).
    fn owed(&self) -> &AtomicU32 {
        self.word(2)
    }

    /// Forks under way (counted by the parent before it forks), whose children have not
    /// named themselves among the holders yet — or could not, the table being full.
    fn forks(&self) -> &AtomicU32 {
        self.line2(1)
    }

    /// The processes that hold the connection, by pid (0: a free entry): its maker, and
    /// each child forked since, which names itself as it starts.
    fn holder(&self, i: usize) -> &AtomicU32 {
        self.line2(2 + i)
    }

    fn line2(&self, word: usize) -> &AtomicU32 {
        debug_assert!(word < 16);
        // SAFETY: as in `word`: u32 number `word` (< 16) of the 64-byte line 2, 4-byte
        // aligned, inside the slot, written only through atomics.
        unsafe { &*self.at.add(2 * 64 + 4 * word).cast::<AtomicU32>() }
    }
}

/// Keeps `chunk` (memfd identity `id`) mapped for the life of the process — its slots are
/// reused, never unmapped — its memfd among the library's descriptors; its address.
fn keep(chunks: &mut Vec<Chunk>, chunk: Shm, id: (u64, u64)) -> usize {
    let (base, fd) = (chunk.ptr as usize, chunk.fd);
    std::mem::forget(chunk);
    chunks.push((base, sys::move_high(fd), id));
    base
}

/// Processes a connection's holder table names.
const HOLDERS: usize = 14;

/// Whether process `pid` holds the socket whose inode is `ino` (one of its descriptors is
/// it). A process that is gone (or a zombie) does not; one whose descriptors this process
/// may not look at (another user's) is taken to.
fn holds(pid: u32, ino: u64) -> bool {
    let dir = match std::fs::read_dir(format!("/proc/{pid}/fd")) {
        Ok(d) => d,
        Err(e) => return e.kind() != std::io::ErrorKind::NotFound,
    };
    let want = format!("socket:[{ino}]");
    // Bounded: a process has at most as many descriptors as its limit allows.
    dir.take(1 << 20).flatten().any(|e| std::fs::read_link(e.path()).is_ok_and(|l| l.as_os_str() == want.as_str()))
}

impl Drop for Side {
    fn drop(&mut self) {
        if self.fork_epoch != FORKS.load(Ordering::Relaxed) {
            return;
        }
        let mut pool = SIDES.lock().unwrap_or_else(|p| p.into_inner());
        if pool.0 == sys::pid() {
            (0..3).for_each(|l| self.word(l).store(0, Ordering::Relaxed));
            (1..16).for_each(|w| self.line2(w).store(0, Ordering::Relaxed));
            pool.1.push(self.at as usize);
        }
    }
}

/// Which end of the connection this side is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Client,
    Server,
}

/// A client's slot, given back to its association when dropped (crate::assoc), for the
/// next connection to the same server.
pub trait Lease: Send + Sync {
    /// A ring grew past its first window: the slot's pages are trimmed before reuse.
    fn set_grew(&self);
}

/// A connection on shared memory.
pub struct Conn {
    /// The ring we read and the ring we write (a client reads server-to-client).
    pub rx: Ring,
    pub tx: Ring,
    /// The arena the rings live in (kept mapped as long as the connection).
    _arena: Arc<Arena>,
    /// The slot's control line, and this connection's generation of it.
    control: Control,
    pub generation: u32,
    /// The slot in the arena.
    pub slot: u32,
    pub role: Role,
    side: Side,
    /// The peer broke a ring: every call answers a reset.
    broken: AtomicBool,
    /// The TCP socket, kept at a descriptor of the library's.
    pub tcp_fd: c_int,
    /// The peer's doorbell end (among the library's descriptors).
    pub peer_bell: c_int,
    /// A client's connection whose server has not decided yet.
    pending: AtomicBool,
    /// The client's slot lease.
    lease: Option<Box<dyn Lease>>,
    /// The process that made the connection (the one that decides a pending one).
    pub owner: u32,
    /// The inode of the application's descriptor (our end of the pair): how another
    /// process is seen to still hold the connection.
    pub app_ino: Option<u64>,
    /// O_NONBLOCK on the application's descriptor (shared by its duplicates).
    pub nonblock: AtomicBool,
    rd_shut: AtomicBool,
    wr_shut: AtomicBool,
    /// A read waited [`BELL_WAIT_MS`] for bytes counted and never published: the peer
    /// garbled its count (or died between its two steps); later reads do not wait for
    /// them again.
    count_waited_out: AtomicBool,
    /// Registered in an event loop's epoll instance that may watch the receive ring
    /// (crate::looks): any other wait on the descriptor takes the promise back first.
    looked: AtomicBool,
    /// Not watched again (crate::looks): waited on outside the event loop, or its ring
    /// counted bytes the event loop waited for and never published.
    no_look: AtomicBool,
    /// The program waits for this descriptor's input with poll, select or epoll: a read
    /// that empties a bell epoch waits for its doorbell byte even when the descriptor
    /// blocks ([`Conn::take_doorbell`]).
    polled: AtomicBool,
    /// A wait for an owed doorbell byte ran out ([`Conn::waited_for_input`]): the peer
    /// garbled its word or died between its two steps; later waits do not wait again
    /// until the connection owes nothing.
    owed_waited_out: AtomicBool,
    /// A write found the peer's ring full: its window doubles the next time a write finds
    /// it empty (sluice_smc::ring, "The window"; a ring that stays full while the peer
    /// waits on us grows although full: Conn::write_from).
    grow_wanted: AtomicBool,
    /// A ring grew past its first window (the slot is trimmed before its next use).
    grew: AtomicBool,
    /// How long this connection's reads have lately waited for the peer (crate::spin).
    reader_waits: crate::spin::Adaptive,
    /// Counted in [`crate::spin::LIVE`] (the application holds it).
    live: bool,
    /// Bytes and calls, added to the statistics now and then.
    pub tally: crate::stats::Tally,
    /// `MSG_ZEROCOPY` sends so far, and how many of them a completion has reported
    /// (crate::zerocopy).
    pub zc_sent: AtomicU32,
    pub zc_reported: AtomicU32,
    /// `SO_RCVTIMEO`/`SO_SNDTIMEO` in ms (-1: none), as set through the hooks.
    pub rcvtimeo: AtomicI32,
    pub sndtimeo: AtomicI32,
    /// This connection's line in the process's table for `sluice smc info`.
    pub info: Option<crate::info::Line>,
    /// Ring sizes to count when the connection moves (a client's, at the decision).
    pub sizes: (usize, usize),
    /// The peer's address (a client's destination: how it ended is told to the automatic
    /// rule, crate::choose).
    pub peer: Option<std::net::SocketAddr>,
    /// A client's server committed it (how it ends is then worth telling).
    moved: AtomicBool,
    /// Why this side gave up on its pending connection (a `Reason` as a byte; 0: it did
    /// not).
    abandoned: std::sync::atomic::AtomicU8,
    /// The program's epoll registrations of the descriptor while it is pending: made again
    /// on the TCP socket if the connection stays there (crate::pending).
    regs: std::sync::Mutex<Vec<(c_int, [u8; 16])>>,
    /// When the connection was made (a pending one is given up on after [`DECISION_MS`]).
    born: std::time::Instant,
    /// A pending client's ring handed over to TCP: true once what the program wrote into
    /// it went onto the TCP socket (crate::pending), after which it takes no more bytes.
    /// Held while writing into a pending connection's ring and while handing it over, so
    /// no byte is written after the replay that would have carried it.
    pub handover: std::sync::Mutex<bool>,
}

/// The outcome of an I/O call: bytes, or an errno.
pub type Io = Result<usize, c_int>;

/// Why a [`Source`] gave nothing.
pub enum SourceError {
    /// The ring is broken (the peer garbled it).
    Ring,
    /// Reading the source failed with this errno.
    Io(c_int),
}

/// Where the bytes of [`Conn::write_from`] come from.
pub trait Source {
    /// Copies at most `room` bytes (never 0) into `tx`, all of which fit; a push of 0
    /// bytes means the source has ended.
    fn push_into(&mut self, tx: &Ring, room: usize) -> Result<Push, SourceError>;
}

/// A caller's buffer.
struct SliceSource<'a> {
    data: &'a [u8],
    off: usize,
}

impl Source for SliceSource<'_> {
    fn push_into(&mut self, tx: &Ring, room: usize) -> Result<Push, SourceError> {
        let end = self.data.len().min(self.off + room);
        let p = tx.push(&self.data[self.off..end]).map_err(|Corrupt| SourceError::Ring)?;
        self.off += p.n;
        Ok(p)
    }
}

/// A caller's buffers, in turn (`writev`, `sendmsg`): no copy of them all first.
pub struct IovSource<'a> {
    bufs: &'a [&'a [u8]],
    at: usize,
    off: usize,
}

impl<'a> IovSource<'a> {
    /// Reads `bufs` in order.
    pub fn new(bufs: &'a [&'a [u8]]) -> Self {
        IovSource { bufs, at: 0, off: 0 }
    }
}

impl Source for IovSource<'_> {
    /// What fits of the buffers left, in one push: a reader sees the write whole (as far
    /// as it fits), never its first buffers alone — which cost a reader that caught them
    /// another wake-up for the rest, and a doorbell byte per epoch each opened.
    fn push_into(&mut self, tx: &Ring, room: usize) -> Result<Push, SourceError> {
        let mut left: Vec<&[u8]> = Vec::with_capacity(self.bufs.len() - self.at.min(self.bufs.len()));
        let mut want = 0usize;
        for (i, b) in self.bufs.iter().enumerate().skip(self.at) {
            let b = if i == self.at { &b[self.off.min(b.len())..] } else { *b };
            left.push(b);
            want += b.len();
            if want >= room {
                break;
            }
        }
        let p = tx.push_all(&left).map_err(|Corrupt| SourceError::Ring)?;
        // Past what went in.
        let mut n = p.n;
        while n > 0 && self.at < self.bufs.len() {
            let rest = self.bufs[self.at].len() - self.off;
            if n >= rest {
                n -= rest;
                self.at += 1;
                self.off = 0;
            } else {
                self.off += n;
                n = 0;
            }
        }
        // Empty buffers after the last byte are done too.
        while self.at < self.bufs.len() && self.bufs[self.at].len() == self.off {
            self.at += 1;
            self.off = 0;
        }
        Ok(p)
    }
}

/// A descriptor read into a bounce buffer, at most the ring's room at a time: `read`
/// fills the buffer it is given from the descriptor (0: end of input).
pub struct ReadSource<F: FnMut(&mut [u8]) -> Io> {
    /// Reads into the buffer.
    pub read: F,
    buf: Vec<u8>,
}

impl<F: FnMut(&mut [u8]) -> Io> ReadSource<F> {
    /// Bytes are read by `read`, in chunks of at most 256 KiB.
    pub fn new(read: F) -> Self {
        ReadSource { read, buf: Vec::new() }
    }
}

impl<F: FnMut(&mut [u8]) -> Io> Source for ReadSource<F> {
    fn push_into(&mut self, tx: &Ring, room: usize) -> Result<Push, SourceError> {
        let want = room.min(256 * 1024);
        if self.buf.len() < want {
            self.buf.resize(want, 0);
        }
        let k = (self.read)(&mut self.buf[..want]).map_err(SourceError::Io)?.min(want);
        if k == 0 {
            return Ok(Push::default());
        }
        let p = tx.push(&self.buf[..k]).map_err(|Corrupt| SourceError::Ring)?;
        // (`room` was free and only the writer-lock holder fills it: all of it fits.)
        debug_assert_eq!(p.n, k);
        Ok(p)
    }
}

impl Conn {
    /// A connection over slot `slot` of `arena`, its rings `rx` and `tx`, this side's
    /// words, the peer's doorbell end `peer_bell` (which it takes). A client's is pending
    /// (its server has not decided yet) and holds `lease`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        arena: Arc<Arena>,
        slot: u32,
        generation: u32,
        rx: Ring,
        tx: Ring,
        side: Side,
        peer_bell: c_int,
        role: Role,
        lease: Option<Box<dyn Lease>>,
    ) -> Option<Conn> {
        let Some(control) = arena.control(slot) else {
            sys::close(peer_bell);
            return None;
        };
        let sizes = (rx.capacity(), tx.capacity());
        // Its maker holds it (the side's words are fresh: no fork since they were taken).
        // Words carried in already name this process (crate::carry).
        if side.fresh {
            side.holder(0).store(sys::pid(), Ordering::Release);
        }
        Some(Conn {
            rx,
            tx,
            _arena: arena,
            control,
            generation,
            slot,
            role,
            side,
            broken: AtomicBool::new(false),
            tcp_fd: -1,
            peer_bell: sys::move_high(peer_bell),
            pending: AtomicBool::new(role == Role::Client),
            lease,
            owner: sys::pid(),
            app_ino: None,
            nonblock: AtomicBool::new(false),
            rd_shut: AtomicBool::new(false),
            wr_shut: AtomicBool::new(false),
            count_waited_out: AtomicBool::new(false),
            looked: AtomicBool::new(false),
            no_look: AtomicBool::new(false),
            polled: AtomicBool::new(false),
            owed_waited_out: AtomicBool::new(false),
            grow_wanted: AtomicBool::new(false),
            grew: AtomicBool::new(false),
            reader_waits: crate::spin::Adaptive::new(),
            live: false,
            tally: crate::stats::Tally::default(),
            zc_sent: AtomicU32::new(0),
            zc_reported: AtomicU32::new(0),
            rcvtimeo: AtomicI32::new(-1),
            sndtimeo: AtomicI32::new(-1),
            info: None,
            sizes,
            abandoned: std::sync::atomic::AtomicU8::new(0),
            regs: std::sync::Mutex::new(Vec::new()),
            born: std::time::Instant::now(),
            peer: None,
            moved: AtomicBool::new(false),
            handover: std::sync::Mutex::new(false),
        })
    }

    /// The connection is the application's now (counted among the live ones).
    pub fn settle_in(&mut self) {
        if !self.live {
            self.live = true;
            crate::spin::LIVE.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The slot's control line.
    pub fn control(&self) -> &Control {
        &self.control
    }

    /// An event loop registered the descriptor (crate::looks).
    pub fn mark_looked(&self) {
        self.looked.store(true, Ordering::Relaxed);
    }

    /// True once an event loop registered the descriptor.
    pub fn looked(&self) -> bool {
        self.looked.load(Ordering::Relaxed)
    }

    /// The receive ring is never watched again (crate::looks).
    pub fn stop_looking(&self) {
        self.no_look.store(true, Ordering::Relaxed);
    }

    /// The program is about to wait for input on descriptor `fd` (poll, select, epoll):
    /// from now on a read that empties a bell epoch waits for its doorbell byte, blocking
    /// descriptor or not, and bytes owed by earlier reads come off the descriptor now (a
    /// moment's wait if one is still on its way) — so the wait is never told "readable"
    /// with nothing to read. A program that then reads a blocking descriptor would wait
    /// for a message that never comes: iperf3's server, reading its control connection
    /// after `select`, did. Not done while another thread reads the connection (it takes
    /// them when its read ends), and a byte more than [`BELL_WAIT_MS`] late stays owed
    /// (the next read takes it); a byte that never came is not waited for again until
    /// the connection owes nothing.
    pub fn waited_for_input(&self, fd: c_int) {
        if !self.polled.load(Ordering::Relaxed) {
            self.polled.store(true, Ordering::Relaxed);
        }
        let owed = self.side.owed();
        if owed.load(Ordering::Relaxed) == 0 {
            if self.owed_waited_out.load(Ordering::Relaxed) {
                self.owed_waited_out.store(false, Ordering::Relaxed);
            }
            return;
        }
        let Some(_g) = SharedLock::try_take(self.side.reader_lock()) else { return };
        let settled = crate::spin::nap_until(BELL_WAIT_MS as u64, || {
            self.settle_doorbell(fd);
            // Bytes in the ring: the descriptor may well be readable; the program reads them.
            owed.load(Ordering::Relaxed) == 0 || !self.rx.is_empty() || self.owed_waited_out.load(Ordering::Relaxed)
        });
        if !settled {
            self.owed_waited_out.store(true, Ordering::Relaxed);
        }
    }

    /// True once [`Conn::stop_looking`] was called.
    pub fn no_look(&self) -> bool {
        self.no_look.load(Ordering::Relaxed)
    }

    /// True while a client's server has not decided.
    pub fn is_pending(&self) -> bool {
        self.pending.load(Ordering::Acquire)
    }

    /// What the control word says of this connection now: `None` while undecided.
    pub fn decision(&self) -> Option<(State, u8)> {
        match slot::unpack(self.control.word()) {
            Some((g, State::Proposed, _)) if g == self.generation & slot::GEN_MASK => None,
            Some((g, st, reason)) if g == self.generation & slot::GEN_MASK => Some((st, reason)),
            // Another generation, or a word no side writes: the peer garbled it.
            _ => Some((State::Abandoned, 0)),
        }
    }

    /// What goes along with the connection to a program this process runs
    /// (crate::carry): its arena, its side's words, and which directions were shut.
    pub fn carried_parts(&self) -> (&Arc<Arena>, &Side, (bool, bool)) {
        let shut = (self.rd_shut.load(Ordering::Relaxed), self.wr_shut.load(Ordering::Relaxed));
        (&self._arena, &self.side, shut)
    }

    /// A connection carried in from the program that ran this one (crate::carry): decided
    /// (a client's was committed before it came), its directions shut as they were.
    pub fn carried_in(&mut self, shut: (bool, bool)) {
        self.pending.store(false, Ordering::Release);
        self.moved.store(self.role == Role::Client, Ordering::Relaxed);
        self.rd_shut.store(shut.0, Ordering::Relaxed);
        self.wr_shut.store(shut.1, Ordering::Relaxed);
    }

    /// A pending client's server committed: the connection is on shared memory.
    pub fn mark_moved(&self) {
        if self.pending.swap(false, Ordering::AcqRel) {
            self.moved.store(true, Ordering::Relaxed);
            crate::stats::smc(false, self.sizes.0, self.sizes.1);
            self.regs.lock().unwrap_or_else(|p| p.into_inner()).clear();
        }
    }

    /// Gives up on the pending connection for `reason`: true when this side decided
    /// (the server cannot commit it any more).
    fn abandon(&self, reason: sluice_smc::msg::Reason) -> bool {
        let won = self.control.decide(self.generation, State::Abandoned, 0);
        if won {
            self.abandoned.store(reason as u8, Ordering::Relaxed);
        }
        won
    }

    /// Why this side gave up on it (when the server did not decline).
    pub fn abandoned_for(&self) -> sluice_smc::msg::Reason {
        let b = self.abandoned.load(Ordering::Relaxed);
        sluice_smc::msg::Reason::ALL.into_iter().find(|r| *r as u8 == b).unwrap_or(sluice_smc::msg::Reason::Protocol)
    }

    /// Remembers an epoll registration of the pending descriptor (`op` 1 ADD, 2 DEL,
    /// 3 MOD; `event` as the program passed it).
    pub fn note_epoll(&self, epfd: c_int, op: c_int, event: Option<[u8; 16]>) {
        let mut r = self.regs.lock().unwrap_or_else(|p| p.into_inner());
        r.retain(|(e, _)| *e != epfd);
        if let (1 | 3, Some(ev)) = (op, event) {
            r.push((epfd, ev));
        }
    }

    /// The epoll registrations to make again on the TCP socket.
    pub fn take_regs(&self) -> Vec<(c_int, [u8; 16])> {
        std::mem::take(&mut *self.regs.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// The program's epoll registrations of the pending descriptor, left in place.
    pub fn regs(&self) -> Vec<(c_int, [u8; 16])> {
        self.regs.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// True for a pending connection whose server has decided against it (or that this
    /// side gave up on): it is going back to TCP, and what its descriptor reports until
    /// then (the pair's end closing) is not the connection's.
    pub fn falling_back(&self) -> bool {
        self.is_pending() && self.decision().is_some_and(|(st, _)| st != State::Committed)
    }

    /// Looks at a pending connection's decision: Ok while undecided or committed (the
    /// connection is then moved), [`FELL_BACK`] once it is known to stay on TCP. With
    /// `signals`, also asks whether the server took it as TCP (bytes or an end on the TCP
    /// socket, or our pair's other end gone without a decision) and if so gives up on it.
    pub fn check_pending(&self, fd: c_int, signals: bool) -> Result<(), c_int> {
        if !self.is_pending() {
            return Ok(());
        }
        match self.decision() {
            Some((State::Committed, _)) => {
                self.mark_moved();
                Ok(())
            }
            Some(_) => Err(FELL_BACK),
            None if signals && self.taken_elsewhere(fd) => {
                // The server took it where the library cannot see (or died): unless it
                // decided meanwhile, it stays TCP.
                if self.abandon(sluice_smc::msg::Reason::TakenAsTcp) {
                    Err(FELL_BACK)
                } else {
                    self.check_pending(fd, false)
                }
            }
            None if signals && self.born.elapsed() >= std::time::Duration::from_millis(DECISION_MS) => {
                // A server that says nothing this long is not waited for: TCP's.
                if self.abandon(sluice_smc::msg::Reason::Timeout) {
                    Err(FELL_BACK)
                } else {
                    self.check_pending(fd, false)
                }
            }
            None => Ok(()),
        }
    }

    /// Milliseconds left before a pending connection is given up on (at least 1).
    fn decision_left_ms(&self) -> i32 {
        let left = DECISION_MS.saturating_sub(self.born.elapsed().as_millis() as u64);
        left.clamp(1, i32::MAX as u64) as i32
    }

    /// A pending connection's signs that the server took it as TCP: bytes or an end on
    /// the TCP socket, or the other end of our pair closed (not merely shut for writing)
    /// — one `poll` of the two.
    fn taken_elsewhere(&self, fd: c_int) -> bool {
        const POLLRDHUP: i16 = 0x2000;
        let mut p = [
            cabi::PollFd { fd: self.tcp_fd, events: sys::POLLIN | POLLRDHUP, revents: 0 },
            cabi::PollFd { fd, events: 0, revents: 0 },
        ];
        // SAFETY: two valid pollfds (a negative descriptor is skipped), no waiting.
        let r = unsafe { crate::real::poll(p.as_mut_ptr(), 2, 0) };
        r > 0 && (p[0].revents != 0 || p[1].revents & (0x10 | 0x8) != 0)
    }

    /// The peer broke a ring: the connection is reset, once — the pair shut down both
    /// ways (both sides see the end, poll reports it), counted.
    fn fault(&self, fd: c_int) -> c_int {
        if !self.broken.swap(true, Ordering::SeqCst) {
            crate::stats::count(Counter::PeerFaults);
            self.tx.set_flags(FLAG_RESET);
            // SAFETY: our descriptors of the two doorbell pairs.
            unsafe {
                crate::real::shutdown(fd, sys::SHUT_RDWR);
                crate::real::shutdown(self.peer_bell, sys::SHUT_RDWR);
            }
        }
        sys::ECONNRESET
    }

    fn check(&self, fd: c_int) -> Result<(), c_int> {
        if self.broken.load(Ordering::Relaxed) { Err(self.fault(fd)) } else { Ok(()) }
    }

    /// Wakes the peer's reader. False when the peer is gone.
    fn ring_peer(&self) -> bool {
        let n = sys::send_nowait(self.peer_bell, &[1u8]);
        if n == 1 {
            self.tally.bell();
        }
        // EAGAIN: the peer's doorbell is already full of wake-ups; it will look.
        n == 1 || cabi::errno() == sys::EAGAIN
    }

    /// Takes up to `n` bytes off descriptor `fd`; returns how many it took. (With room for
    /// descriptors: any the peer queued before its end refused them are let go off this
    /// thread, never released by the kernel on it.)
    fn consume(fd: c_int, n: u32) -> u32 {
        let mut buf = [0u8; 4096];
        let mut taken = 0u32;
        // Bounded: a peer writing as fast as we take must not keep us here.
        for _ in 0..64 {
            let want = ((n - taken) as usize).min(buf.len());
            if want == 0 {
                break;
            }
            match crate::foreign::recv_releasing(fd, &mut buf[..want]) {
                Some(got) if got > 0 => taken += got as u32,
                _ => break,
            }
        }
        taken
    }

    /// The ring just emptied: its doorbell byte comes off our descriptor, with any owed
    /// from earlier emptyings whose bytes had not arrived yet.
    ///
    /// A reader quick enough (one that spun) empties the ring before the writer, which
    /// publishes first and rings second, has sent the byte. A non-blocking reader (`wait`:
    /// a program that polls) waits for it — briefly, the writer is between two calls —
    /// rather than leave the descriptor readable with nothing to read, which a program may
    /// take as an error (wrk counts a read that says EAGAIN after poll said readable). A
    /// blocking reader does not (it does not poll; waiting cost sockperf a wake-up in most
    /// of its round trips): the byte is owed, and comes off with the next. So is a byte
    /// that does not come within [`BELL_WAIT_MS`] (a writer preempted between its two
    /// steps on a busy machine: 1 ms was not always enough for wrk against nginx). A
    /// blocking descriptor the program also polls (iperf3 reads its control connection
    /// after `select`) is waited for as a non-blocking one is.
    ///
    /// The wait is only for a descriptor with no byte at all: bytes owed from earlier
    /// epochs are taken as they come, never waited for — a byte that never comes (a peer
    /// that garbled its word) would otherwise make every later read of the connection
    /// wait the whole [`BELL_WAIT_MS`].
    fn take_doorbell(&self, fd: c_int, wait: bool) {
        let owed = self.side.owed();
        let need = owed.load(Ordering::Relaxed).saturating_add(1);
        let mut got = Conn::consume(fd, need);
        if got == 0 && wait && sys::wait(fd, sys::POLLIN, BELL_WAIT_MS).unwrap_or(false) {
            got = Conn::consume(fd, need);
        }
        owed.store(need - got, Ordering::Relaxed);
    }

    /// The ring is empty: takes off our descriptor every byte no open epoch accounts for —
    /// those owed for epochs that ended, and any the peer wrote beyond its epochs — so the
    /// descriptor is readable exactly while a bell epoch is open, and a stray byte cannot
    /// keep `poll` returning. (Counted first, then the state: a byte of an epoch opened in
    /// between was counted only if its epoch shows as open.)
    fn settle_doorbell(&self, fd: c_int) {
        let Some(n) = sys::pending(fd) else { return };
        let open = usize::from(self.rx.bell_open());
        let extra = n.saturating_sub(open).min(u32::MAX as usize) as u32;
        let taken = if extra > 0 { Conn::consume(fd, extra) } else { 0 };
        let owed = self.side.owed();
        let o = owed.load(Ordering::Relaxed);
        owed.store(o.saturating_sub(taken), Ordering::Relaxed);
    }

    /// Wakes a peer writer waiting for room: asleep on the flags word, or waiting on its
    /// descriptor behind the filler it wrote (drained here so it is writable again).
    fn release_writer(&self) {
        // Pairs with the writer's fence between setting its flag and looking for room.
        fence(Ordering::SeqCst);
        let f = self.rx.flags_word().load(Ordering::Relaxed);
        if f & FLAG_WRITER_SLEEPING != 0 && self.rx.take_flags(FLAG_WRITER_SLEEPING) {
            sys::futex_wake(self.rx.flags_word());
        }
        if f & FLAG_WRITER_WAITING == 0 || !self.rx.take_flags(FLAG_WRITER_WAITING) {
            return;
        }
        Conn::consume(self.peer_bell, 64 * 4096);
    }

    /// Whether our descriptor says the peer is gone (its doorbell end closed). Asked of
    /// poll, not by peeking: doorbell bytes may still be queued in front of the end.
    /// A peer that only shut down its sending side (flag set first, then its end shut
    /// for writing, which our descriptor reports as `POLLRDHUP`) is not gone.
    fn peer_gone(&self, fd: c_int) -> bool {
        const POLLRDHUP: i16 = 0x2000;
        let mut p = cabi::PollFd { fd, events: POLLRDHUP, revents: 0 };
        // SAFETY: one valid pollfd, no waiting.
        let r = unsafe { crate::real::poll(&mut p, 1, 0) };
        if r <= 0 {
            return false;
        }
        if p.revents & (0x10 /* POLLHUP */ | 0x8/* POLLERR */) != 0 {
            return true;
        }
        p.revents & POLLRDHUP != 0 && !self.rx.has_flags(FLAG_SHUTDOWN_WR)
    }

    /// `read`/`recv` on descriptor `fd`.
    ///
    /// A blocking read that finds the ring empty sleeps on the ring's futex for a slice
    /// (the writer wakes it without a doorbell when the bytes fit this read — the ring's
    /// "quiet" epochs), then waits on the descriptor like a poll/epoll program would.
    pub fn read(&self, fd: c_int, buf: &mut [u8], flags: c_int) -> Io {
        if buf.is_empty() {
            return Ok(0);
        }
        self.check(fd)?;
        let _g = SharedLock::take(self.side.reader_lock());
        let mut slept = false;
        let r = self.read_locked(fd, buf, flags, &mut slept);
        if slept {
            // A wake-up that was not the writer's (a signal, a shutdown) leaves the
            // sleeper mark behind: clear it, so the next epoch rings the doorbell.
            self.rx.cancel_sleep();
        }
        r
    }

    /// Bytes waiting in the receive ring (`FIONREAD`).
    pub fn readable_bytes(&self) -> usize {
        self.rx.len().unwrap_or(0)
    }

    /// Bytes written that the peer has not read yet (`SIOCOUTQ`).
    pub fn unread_bytes(&self) -> usize {
        self.tx.len().unwrap_or(0)
    }

    /// Reads up to `max` bytes as [`Conn::read`] would and hands them to `sink`, which
    /// takes what it can (`splice` into a pipe): only what it took is consumed.
    pub fn read_to(&self, fd: c_int, flags: c_int, max: usize, sink: &mut dyn FnMut(&[u8]) -> Io) -> Io {
        if max == 0 {
            return Ok(0);
        }
        self.check(fd)?;
        let _g = SharedLock::take(self.side.reader_lock());
        let mut buf = vec![0u8; max.min(256 * 1024)];
        let mut slept = false;
        let r = self.read_locked(fd, &mut buf, flags | sys::MSG_PEEK, &mut slept);
        if slept {
            self.rx.cancel_sleep();
        }
        let n = r?;
        if n == 0 {
            return Ok(0);
        }
        let took = sink(&buf[..n])?.min(n);
        let p = self.rx.skip(took).map_err(|Corrupt| self.fault(fd))?;
        if p.take_bell {
            let wait = self.nonblock.load(Ordering::Relaxed)
                || flags & sys::MSG_DONTWAIT != 0
                || self.polled.load(Ordering::Relaxed);
            self.take_doorbell(fd, wait);
        }
        self.release_writer();
        self.tally.rx(p.n);
        Ok(p.n)
    }

    fn read_locked(&self, fd: c_int, buf: &mut [u8], flags: c_int, slept: &mut bool) -> Io {
        let peek = flags & sys::MSG_PEEK != 0;
        let nonblock = self.nonblock.load(Ordering::Relaxed) || flags & sys::MSG_DONTWAIT != 0;
        let waitall = flags & sys::MSG_WAITALL != 0 && !peek && !nonblock;
        let timeout = self.rcvtimeo.load(Ordering::Relaxed);
        let mut got = 0usize;
        // `slept`: this call slept on the futex (and so must read on through a quiet
        // epoch); `on_descriptor`: its futex slice is used up.
        let mut on_descriptor = timeout >= 0;
        let mut idle = Backoff::default();
        // When this call began to wait for the peer, and whether it has looked (spun) yet.
        let mut waiting: Option<std::time::Instant> = None;
        let mut spun = false;
        let mut looked_for_count = false;
        // The wait on the descriptors returned (for a pending connection: look why).
        let mut woke = false;
        loop {
            if self.rd_shut.load(Ordering::Relaxed) {
                return Ok(got);
            }
            let p = self.rx.pop(&mut buf[got..], peek).map_err(|Corrupt| self.fault(fd))?;
            if p.n > 0 {
                if let Some(t) = waiting.take() {
                    self.reader_waits.record(t.elapsed());
                }
                if self.is_pending() {
                    // A server writes only once it committed; bytes from one that did not
                    // are a broken peer's.
                    match self.decision() {
                        Some((State::Committed, _)) => self.mark_moved(),
                        _ => return Err(self.fault(fd)),
                    }
                }
                idle = Backoff::default();
                if p.take_bell {
                    self.take_doorbell(fd, nonblock || self.polled.load(Ordering::Relaxed));
                }
                if !peek {
                    self.release_writer();
                    self.tally.rx(p.n);
                }
                got += p.n;
                if got == buf.len() {
                    return Ok(got);
                }
                if !(waitall || *slept && self.rx.quiet()) {
                    return Ok(got);
                }
                continue;
            }
            if *slept && self.rx.quiet() {
                // Counted but not yet published: the writer is between two stores (or the
                // peer garbled the word — then this backs off to sleeps, never spins).
                if idle.pause() && self.peer_gone(fd) && self.rx.is_empty() {
                    // (Looked at after the peer went: what it published before is read.)
                    return if got > 0 { Ok(got) } else { Err(sys::ECONNRESET) };
                }
                continue;
            }
            if got > 0 && !waitall {
                return Ok(got);
            }
            if self.rx.has_flags(FLAG_SHUTDOWN_WR) && !self.is_pending() {
                // The writer publishes its last bytes before it sets the flag, and the pop
                // above may have looked before they were: end of file only once the ring
                // is still empty after the flag was seen.
                if !self.rx.is_empty() {
                    continue;
                }
                // A peer that closed with bytes of ours unread reset the connection, as
                // TCP's would: after the data, a reset rather than end of file.
                return if got == 0 && self.rx.has_flags(FLAG_RESET) { Err(sys::ECONNRESET) } else { Ok(got) };
            }
            // Still waiting for the server's decision: it may have declined, or taken the
            // connection as plain TCP (then our bytes go there, and so does this read).
            // (Asked of the descriptors only when something woke us there: the wait below
            // watches both, and returns at once for what is already on them.)
            self.check_pending(fd, nonblock || std::mem::take(&mut woke))?;
            if !nonblock && !on_descriptor {
                waiting.get_or_insert_with(std::time::Instant::now);
                if !spun {
                    spun = true;
                    // A peer that answers within microseconds is looked for before sleeping.
                    let budget = self.reader_waits.budget();
                    if crate::spin::spin_until(budget, || !self.rx.is_empty() || self.rx.has_flags(FLAG_SHUTDOWN_WR)) {
                        continue;
                    }
                }
                let room = if peek { 0 } else { buf.len() - got };
                match self.rx.prepare_sleep(room) {
                    Ok(v) => {
                        *slept = true;
                        // A pending connection's server may decline without a word into
                        // this ring: short slices, each followed by a look at the decision.
                        let slice = if self.is_pending() { PENDING_SLICE_MS } else { FUTEX_SLICE_MS };
                        if sys::futex_wait(self.rx.state_word(), v, slice) == sys::Woke::TimedOut {
                            self.rx.cancel_sleep();
                            on_descriptor = !self.is_pending()
                                || waiting.is_some_and(|t| t.elapsed().as_millis() >= PENDING_FUTEX_MS);
                            self.check_pending(fd, true)?;
                        }
                    }
                    // Counted, not yet published: look again — for a while; a count that
                    // never turns into bytes is left to the descriptor.
                    Err(sluice_smc::ring::Awake::Data) => on_descriptor = idle.pause(),
                    Err(sluice_smc::ring::Awake::Poked) => on_descriptor = true,
                }
                continue;
            }
            if self.peer_gone(fd) {
                // A pending connection's server that went without deciding: TCP's.
                self.check_pending(fd, true)?;
                // Whatever the peer wrote before it went is read first (the ring was
                // empty just above; look once more now that it is certainly gone).
                let p = self.rx.pop(&mut buf[got..], peek).map_err(|Corrupt| self.fault(fd))?;
                if p.n > 0 {
                    return Ok(got + p.n);
                }
                return if self.rx.has_flags(FLAG_RESET) { Err(sys::ECONNRESET) } else { Ok(got) };
            }
            if nonblock && got == 0 && !looked_for_count && self.rx.counted() {
                // Counted and not yet published: the writer is between two stores, and the
                // doorbell of this epoch may already have made the descriptor readable. A
                // program told "readable" must not be told EAGAIN (wrk counts that as an
                // error): wait until they are published.
                looked_for_count = true;
                if self.await_published(fd) {
                    continue;
                }
            }
            self.settle_doorbell(fd);
            if nonblock {
                return if got > 0 { Ok(got) } else { Err(sys::EAGAIN) };
            }
            // While pending, the TCP socket too (bytes or an end there mean the server took
            // the connection as TCP), and no longer than the decision's limit (a server that
            // took it as TCP and waits for what we wrote neither decides nor writes).
            let (tcp, left) = if self.is_pending() { (self.tcp_fd, self.decision_left_ms()) } else { (-1, -1) };
            let wait_ms = if left >= 0 && (timeout < 0 || left < timeout) { left } else { timeout };
            // An event loop may have promised to look at the ring (crate::looks): its epochs
            // ring no doorbell. The promise is taken back for good — this connection is
            // waited on elsewhere too — and bytes counted meanwhile are read first.
            if self.looked() && crate::looks::give_up(self) {
                continue;
            }
            match sys::wait2(fd, tcp, sys::POLLIN, wait_ms) {
                Ok(true) => woke = true,
                Ok(false) if wait_ms != timeout => woke = true,
                // SO_RCVTIMEO expired, as a TCP socket reports it.
                Ok(false) => return if got > 0 { Ok(got) } else { Err(sys::EAGAIN) },
                Err(e) => return Err(e.raw_os_error().unwrap_or(sys::EINVAL)),
            }
        }
    }

    /// Waits for bytes counted in the receive ring and not yet published; true once they
    /// are. The writer publishes right after it counts, so a few yields (it may need this
    /// CPU) nearly always do. It can lose its CPU in between, though — a virtual CPU the
    /// host takes away, a preemption — for longer than a yield: where our descriptor holds
    /// a doorbell byte, so that poll may have told the program "readable", the wait goes
    /// on in sleeps of 50 µs for up to [`BELL_WAIT_MS`] (a writer descheduled for that
    /// long is rare; a program that reads without being told may be told EAGAIN, as TCP
    /// would). A count that is not published by then was garbled or its writer died: the
    /// read gives up, and later reads on this connection do not wait for it again, so a
    /// hostile peer costs this reader one such wait.
    fn await_published(&self, fd: c_int) -> bool {
        let published = || !self.rx.is_empty();
        if (0..64).any(|_| {
            std::thread::yield_now();
            published()
        }) {
            return true;
        }
        if self.count_waited_out.load(Ordering::Relaxed) || sys::pending(fd).unwrap_or(0) == 0 {
            return false;
        }
        if self.until_published(BELL_WAIT_MS as u64) {
            return true;
        }
        if self.rx.counted() {
            self.count_waited_out.store(true, Ordering::Relaxed);
        }
        false
    }

    /// Waits in sleeps of 50 µs, for at most `ms`, for bytes counted in the receive ring
    /// and not yet published: true once they are; false when the time is up, or nothing
    /// is counted any more (nothing to wait for).
    pub fn until_published(&self, ms: u64) -> bool {
        let mut published = false;
        crate::spin::nap_until(ms, || {
            published = !self.rx.is_empty();
            published || !self.rx.counted()
        });
        published
    }

    /// `write`/`send` on descriptor `fd`.
    ///
    /// A blocking write that finds the ring full sleeps on the ring's flags word for a
    /// slice (the reader wakes it as it makes room), then waits on the descriptor.
    pub fn write(&self, fd: c_int, data: &[u8], flags: c_int) -> Io {
        self.write_from(fd, flags, data.len(), &mut SliceSource { data, off: 0 })
    }

    /// Writes up to `max` bytes that `src` gives as room appears (`sendfile`, `splice`):
    /// as [`Conn::write`] does, and never asking `src` for more than the ring takes at
    /// once — under the writer lock room only grows, so no byte taken from the source is
    /// ever left over. Stops early, with what it wrote, when the source ends.
    pub fn write_from(&self, fd: c_int, flags: c_int, max: usize, src: &mut dyn Source) -> Io {
        if self.wr_shut.load(Ordering::Relaxed) {
            return Err(sys::EPIPE);
        }
        self.check(fd)?;
        let nonblock = self.nonblock.load(Ordering::Relaxed) || flags & sys::MSG_DONTWAIT != 0;
        let timeout = self.sndtimeo.load(Ordering::Relaxed);
        let _g = SharedLock::take(self.side.writer_lock());
        let mut off = 0usize;
        let mut counted_full = false;
        let mut waited_to_grow = false;
        let mut on_descriptor = timeout >= 0;
        // The ring stayed full for a whole wait (crate::conn's FUTEX_SLICE_MS or
        // STALL_MS): its reader may be waiting on us.
        let mut stalled = false;
        // Slices of the wait on the descriptor: 50 ms, longer while the peer does not wait
        // on us (at most a second), so a writer blocked long wakes rarely.
        let mut stall_ms = STALL_MS;
        while off < max {
            let mut used = self.tx.len().map_err(|Corrupt| self.fault(fd))?;
            if used > 0 && !waited_to_grow && self.grow_wanted.load(Ordering::Relaxed) {
                // Only an empty ring can grow: give the reader, which is most likely
                // draining it now, a moment (a few yields, once per call) to finish.
                waited_to_grow = true;
                for _ in 0..64 {
                    std::thread::yield_now();
                    used = self.tx.len().map_err(|Corrupt| self.fault(fd))?;
                    if used == 0 {
                        break;
                    }
                }
            }
            if used == 0 && self.grow_wanted.swap(false, Ordering::Relaxed) {
                let before = self.tx.capacity();
                if self.tx.grow().map_err(|Corrupt| self.fault(fd))? > before {
                    crate::stats::count(Counter::BuffersGrown);
                }
            }
            // (Saturating: a window the peer garbled below its fill is its own loss.)
            let room = self.tx.capacity().saturating_sub(used).min(max - off);
            let p = if room == 0 {
                Push::default()
            } else {
                // While pending, another thread may hand the ring over to TCP at any
                // moment (its server declined): bytes go in only before that.
                let handover = self.is_pending().then(|| self.handover.lock().unwrap_or_else(|p| p.into_inner()));
                if handover.as_ref().is_some_and(|h| **h) {
                    return if off > 0 { Ok(off) } else { Err(FELL_BACK) };
                }
                match src.push_into(&self.tx, room) {
                    Ok(p) if p.n == 0 => return Ok(off),
                    Ok(p) => p,
                    Err(SourceError::Ring) => return Err(self.fault(fd)),
                    Err(SourceError::Io(e)) => return if off > 0 { Ok(off) } else { Err(e) },
                }
            };
            if p.n > 0 {
                off += p.n;
                stalled = false;
                self.tally.tx(p.n);
                if p.wake_sleeper {
                    sys::futex_wake(self.tx.state_word());
                }
                if p.ring_bell && !self.ring_peer() {
                    return if off > 0 { Ok(off) } else { Err(sys::EPIPE) };
                }
                continue;
            }
            // Full.
            if self.is_pending() {
                // Nobody reads this ring before the server decides: wait for it. Bytes
                // written already stay (replayed onto TCP if it declines).
                match self.await_decision(fd) {
                    Ok(()) => continue,
                    Err(e) => return if off > 0 { Ok(off) } else { Err(e) },
                }
            }
            if !counted_full {
                counted_full = true;
                crate::stats::buffer_full();
                if self.tx.capacity() < self.tx.max_capacity() {
                    self.grow_wanted.store(true, Ordering::Relaxed);
                }
            }
            if stalled && self.peer_waits_on_us() {
                // The reader lets the ring stay full because it is stuck writing to us (a
                // program that writes everything before it reads, talking to one that
                // answers as it reads): TCP's buffers would take more, so the ring grows
                // although full (sluice_smc::ring's grow_full), up to its area. (A reader
                // that is merely slow, or stopped, does not make it grow.)
                stalled = false;
                let before = self.tx.capacity();
                if self.tx.grow_full().map_err(|Corrupt| self.fault(fd))? > before {
                    crate::stats::count(Counter::BuffersGrown);
                    // (Grown already: not again when it next empties.)
                    self.grow_wanted.store(false, Ordering::Relaxed);
                    stall_ms = STALL_MS;
                    continue;
                }
            }
            if !nonblock && !on_descriptor {
                let v = self.tx.flags_word().fetch_or(FLAG_WRITER_SLEEPING, Ordering::SeqCst) | FLAG_WRITER_SLEEPING;
                // Pairs with the reader's fence between taking bytes and looking for us.
                fence(Ordering::SeqCst);
                if self.tx_room() {
                    self.tx.take_flags(FLAG_WRITER_SLEEPING);
                    continue;
                }
                if sys::futex_wait(self.tx.flags_word(), v, FUTEX_SLICE_MS) == sys::Woke::TimedOut {
                    self.tx.take_flags(FLAG_WRITER_SLEEPING);
                    on_descriptor = true;
                    stalled = true;
                }
                continue;
            }
            if self.peer_gone(fd) {
                return if off > 0 { Ok(off) } else { Err(sys::EPIPE) };
            }
            self.tx.set_flags(FLAG_WRITER_WAITING);
            if self.tx_room() {
                continue;
            }
            self.fill(fd);
            // The reader may have taken the flag while we filled: set it again, so its
            // next read drains the filler.
            self.tx.set_flags(FLAG_WRITER_WAITING);
            if self.tx_room() {
                continue;
            }
            if nonblock {
                return if off > 0 { Ok(off) } else { Err(sys::EAGAIN) };
            }
            // Without a send timeout, in slices: a ring that stays full grows (above).
            let grows = timeout < 0 && self.tx.capacity() < self.tx.max_capacity();
            match sys::wait(fd, sys::POLLOUT, if grows { stall_ms } else { timeout }) {
                Ok(true) => {}
                Ok(false) if grows => {
                    stalled = true;
                    if !self.peer_waits_on_us() {
                        stall_ms = (stall_ms * 2).min(1000);
                    }
                }
                Ok(false) => return if off > 0 { Ok(off) } else { Err(sys::EAGAIN) },
                Err(e) => return Err(e.raw_os_error().unwrap_or(sys::EINVAL)),
            }
        }
        Ok(off)
    }

    /// True when the peer is waiting for room in the ring it writes to us: its writer's
    /// flags are set, or that ring is full.
    fn peer_waits_on_us(&self) -> bool {
        self.rx.has_flags(FLAG_WRITER_WAITING | FLAG_WRITER_SLEEPING)
            || matches!(self.rx.len(), Ok(n) if n >= self.rx.capacity())
    }

    /// True when the peer's ring has room (or is broken: the next push says so).
    fn tx_room(&self) -> bool {
        !matches!(self.tx.len(), Ok(n) if n >= self.tx.capacity())
    }

    /// Fills our descriptor's send direction so it stops being writable.
    fn fill(&self, fd: c_int) {
        let junk = [0u8; 1024];
        // Until the socket is full — bounded, in case the reader drains as fast as we fill.
        for _ in 0..64 {
            let n = sys::send_nowait(fd, &junk);
            if n <= 0 {
                break;
            }
        }
    }

    /// Waits for a pending connection's server to decide: Ok once the connection is on
    /// shared memory, [`FELL_BACK`] once it is TCP's. Bounded: past [`DECISION_MS`] the
    /// client gives up on it (and, having decided first, keeps TCP).
    pub fn await_decision(&self, fd: c_int) -> Result<(), c_int> {
        loop {
            // (Past DECISION_MS from the connection's start, this gives up on it.)
            self.check_pending(fd, true)?;
            if !self.is_pending() {
                return Ok(());
            }
            // The server wakes the word when it decides; a slice, then look at the TCP
            // socket too (a server that took it as TCP says nothing here).
            let w = self.control.word();
            if matches!(slot::unpack(w), Some((_, State::Proposed, _))) {
                sys::futex_wait(self.control.word_atomic(), w, PENDING_SLICE_MS);
            }
        }
    }

    /// `shutdown`.
    pub fn shutdown(&self, how: c_int) {
        if how == sys::SHUT_RD || how == sys::SHUT_RDWR {
            self.rd_shut.store(true, Ordering::Relaxed);
        }
        if (how == sys::SHUT_WR || how == sys::SHUT_RDWR) && !self.wr_shut.swap(true, Ordering::Relaxed) {
            self.tx.set_flags(FLAG_SHUTDOWN_WR);
            // A reader asleep on the ring's futex wakes to see the flag.
            self.tx.poke();
            sys::futex_wake(self.tx.state_word());
            // The peer's descriptor now reads end-of-file and polls POLLRDHUP, as after
            // a TCP FIN (programs that ask poll whether the peer half-closed see it).
            // SAFETY: our own descriptor of the peer's pair.
            unsafe { crate::real::shutdown(self.peer_bell, sys::SHUT_WR) };
        }
    }

    /// This process is about to fork: the child will hold the connection too.
    pub fn forking(&self) {
        self.side.forks().fetch_add(1, Ordering::AcqRel);
    }

    /// In a child just forked: it names itself among the holders (the fork its parent
    /// counted is done). With the table full it stays counted as a fork under way: a
    /// holder that cannot be looked up, so the connection is never ended under it.
    pub fn forked_child(&self) {
        let me = sys::pid();
        if (0..HOLDERS)
            .any(|i| self.side.holder(i).compare_exchange(0, me, Ordering::AcqRel, Ordering::Acquire).is_ok())
        {
            let _ = self.side.forks().fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
        }
    }

    /// A connection carried in (crate::carry): this process is named among its holders —
    /// it is already when the program that ran it was forked (the fork handler named it),
    /// not when that was a `vfork`, which runs no fork handler.
    pub fn name_this_holder(&self) {
        let me = sys::pid_now();
        if !(0..HOLDERS).any(|i| self.side.holder(i).load(Ordering::Acquire) == me) {
            let _ = (0..HOLDERS)
                .any(|i| self.side.holder(i).compare_exchange(0, me, Ordering::AcqRel, Ordering::Acquire).is_ok());
        }
    }

    /// This process lets go of the connection (its last descriptor of it closes, or it
    /// exits): true when no other process holds it any more — none is being forked, and
    /// every other process the table names is gone or has no descriptor of it left (a
    /// child that ran another program closed it, if it was close-on-exec).
    fn let_go(&self) -> bool {
        let me = sys::pid();
        let mut others = Vec::new();
        for i in 0..HOLDERS {
            let h = self.side.holder(i);
            if h.compare_exchange(me, 0, Ordering::AcqRel, Ordering::Acquire).is_err() {
                match h.load(Ordering::Acquire) {
                    0 => {}
                    pid => others.push(pid),
                }
            }
        }
        if self.side.forks().load(Ordering::Acquire) > 0 {
            return false;
        }
        match self.app_ino {
            _ if others.is_empty() => true,
            Some(ino) => !others.into_iter().any(|pid| holds(pid, ino)),
            None => false,
        }
    }

    /// This process closed its last descriptor of the connection (or exits holding it).
    /// As with TCP, the connection ends only with the last process that holds it: a
    /// fork-per-connection server (postgres) closes its copy right after forking the
    /// process that serves it, and that process may exit without closing it at all.
    pub fn closed(&self) {
        self.end(true);
    }

    /// As [`Conn::closed`], for a process that exits holding the connection: the same,
    /// less what only a living process needs (the automatic rule's learning, which takes
    /// a lock another thread may hold as the process exits).
    pub fn closed_at_exit(&self) {
        self.end(false);
    }

    fn end(&self, learn: bool) {
        if !self.let_go() {
            return;
        }
        if !self.rx.is_empty() {
            // Closing with unread data: the peer sees a reset, as with TCP.
            self.tx.set_flags(FLAG_RESET);
        }
        self.shutdown(sys::SHUT_RDWR);
        self.grew.fetch_or(self.tx.capacity() > self.sizes.1 || self.rx.capacity() > self.sizes.0, Ordering::Relaxed);
        if self.role == Role::Server {
            self.control.server_done(self.generation);
        } else if let Some(dst) = self.peer
            && learn
            && self.moved.load(Ordering::Relaxed)
        {
            let (bytes, moves) = self.tally.lifetime();
            crate::choose::ended(dst, bytes, moves);
        }
    }
}

/// Waiting for bytes that were counted but not yet published: a few yields (the writer is
/// between two stores), then sleeps of a millisecond, so a peer that garbled the count
/// costs a sleeping thread, not a spinning one.
#[derive(Default)]
struct Backoff {
    rounds: u32,
}

impl Backoff {
    /// Waits a little; true every 64 rounds, when the caller should look beyond the ring
    /// (is the peer gone? is the descriptor a better place to wait?).
    fn pause(&mut self) -> bool {
        self.rounds = self.rounds.wrapping_add(1);
        if self.rounds < 64 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        self.rounds.is_multiple_of(64)
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        if self.live {
            crate::spin::LIVE.fetch_sub(1, Ordering::Relaxed);
        }
        if self.tcp_fd >= 0 {
            sys::close(self.tcp_fd);
        }
        sys::close(self.peer_bell);
        if let Some(l) = self.lease.take()
            && self.grew.load(Ordering::Relaxed)
        {
            l.set_grew();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Vectored writes against a reader that empties the ring as fast as it can: every
    /// epoch the reader ends was rung for, once. (When each buffer was pushed in turn, a
    /// reader could empty the ring between two of them — two epochs — while the call
    /// rang once: the reader waited for the byte that never came and, owing it for good,
    /// waited 20 ms on every later read; memcached's answers, three buffers each, ran 150
    /// times slower than on TCP.)
    #[test]
    fn every_epoch_a_vectored_write_opens_is_rung_for() {
        #[derive(Clone, Copy)]
        #[repr(C, align(64))]
        struct Chunk([u8; 64]);
        let len = sluice_smc::ring::HEADER_LEN + 4096;
        let mut mem = vec![Chunk([0; 64]); len / 64];
        let ptr = mem.as_mut_ptr().cast::<u8>();
        // SAFETY: `mem` outlives both views and is used only through them.
        let w = unsafe { Ring::create(ptr, len, 4096, 4096) }.unwrap();
        // SAFETY: as above.
        let r = unsafe { Ring::attach(ptr, len) }.unwrap();
        let (a, b, c) = ([1u8; 30], [2u8; 7], [3u8; 5]);
        let bufs: [&[u8]; 3] = [&a, &b, &c];
        let writes = 100_000usize;
        let total = writes * 42;
        let (mut rung, mut taken) = (0u64, 0u64);
        std::thread::scope(|s| {
            let writer = s.spawn(|| {
                let mut rung = 0u64;
                for _ in 0..writes {
                    let mut src = IovSource::new(&bufs);
                    let mut left = 42;
                    while left > 0 {
                        let room = w.capacity() - w.len().unwrap();
                        if room == 0 {
                            std::hint::spin_loop();
                            continue;
                        }
                        let Ok(p) = src.push_into(&w, room) else { panic!("the ring broke") };
                        left -= p.n;
                        rung += u64::from(p.ring_bell);
                    }
                }
                rung
            });
            let mut got = 0usize;
            let mut out = [0u8; 64];
            while got < total {
                let p = r.pop(&mut out, false).unwrap();
                got += p.n;
                taken += u64::from(p.take_bell);
            }
            rung = writer.join().unwrap();
        });
        assert_eq!(rung, taken, "a doorbell byte for every epoch the reader ended");
    }
}

//! One connection on shared memory, and reading and writing it with TCP's semantics
//! (docs/architecture.md, "Data path" and "Wake-ups").
//!
//! The application's descriptor is one end of a unix socket pair (the "doorbell"); the
//! other end was handed to the peer. `peer_bell` is the peer's pair's other end: a byte
//! written there makes the peer's descriptor readable, and filler this side leaves in its
//! own descriptor's send direction is drained from there by the peer.
//!
//! The rings are memory the peer can write, so every call that reads them may find them
//! broken ([`sluice_smc::ring::Corrupt`]): that connection is then reset — both
//! descriptors shut down, counted as a peer fault — and nothing else happens. What must not
//! be in the peer's reach (the locks that serialize forked processes, the count of
//! doorbell bytes owed) lives on a page of this side's own ([`Side`]).

use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, Ordering, fence};

use sluice_smc::ring::{Corrupt, FLAG_SHUTDOWN_WR, FLAG_WRITER_SLEEPING, FLAG_WRITER_WAITING, Push, Ring};
use sluice_smc::stats::Counter;

use crate::sys::{self, Shm};

/// The peer closed with unread data (as TCP answers with a reset).
pub const FLAG_RESET: u32 = 4;

/// How long a blocking read or write sleeps on the ring's futex before it waits on its
/// descriptor instead — where an idle connection costs nothing and a dead peer shows.
const FUTEX_SLICE_MS: i32 = 50;

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
}

impl Drop for SharedLock<'_> {
    fn drop(&mut self) {
        if self.0.swap(0, Ordering::Release) & WAITERS != 0 {
            sys::futex_wake(self.0);
        }
    }
}

/// This side's own shared page of a connection: shared with the processes this one forks
/// (an anonymous `MAP_SHARED` mapping is inherited as shared), never reachable by the peer.
pub struct Side {
    shm: Shm,
}

impl Side {
    /// A fresh page (made before the handshake commits, so that building the connection
    /// afterwards cannot fail).
    pub fn new() -> std::io::Result<Side> {
        Ok(Side { shm: Shm::anonymous(4096)? })
    }

    fn word(&self, line: usize) -> &AtomicU32 {
        // SAFETY: a page-aligned mapping of 4096 bytes, alive as long as `self`; lines 0–2
        // are 64-byte-aligned u32 words written only through atomics.
        unsafe { &*self.shm.ptr.add(line * 64).cast::<AtomicU32>() }
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
}

/// A connection on shared memory.
pub struct Conn {
    /// Our receive ring (we created it) and the peer's receive ring (we write into it).
    pub rx: Ring,
    pub tx: Ring,
    _rx_shm: Shm,
    _tx_shm: Shm,
    side: Side,
    /// The peer broke a ring: every call answers a reset.
    broken: AtomicBool,
    /// The TCP socket, kept at a descriptor of the library's.
    pub tcp_fd: c_int,
    /// The peer's doorbell end.
    pub peer_bell: c_int,
    /// The process that made the connection (a forked child does not end it on close).
    pub owner: u32,
    /// O_NONBLOCK on the application's descriptor (shared by its duplicates).
    pub nonblock: AtomicBool,
    rd_shut: AtomicBool,
    wr_shut: AtomicBool,
    /// A write found the peer's ring full: its window doubles the next time a write finds
    /// it empty (only then may it change: sluice_smc::ring, "The window").
    grow_wanted: AtomicBool,
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
    /// This connection's entry for `sluice smc info`.
    pub info: Option<std::path::PathBuf>,
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
    fn push_into(&mut self, tx: &Ring, room: usize) -> Result<Push, SourceError> {
        let mut total = Push::default();
        while total.n < room && self.at < self.bufs.len() {
            let b = self.bufs[self.at];
            let end = b.len().min(self.off + room - total.n);
            let p = tx.push(&b[self.off..end]).map_err(|Corrupt| SourceError::Ring)?;
            total.n += p.n;
            total.ring_bell |= p.ring_bell;
            total.wake_sleeper |= p.wake_sleeper;
            self.off += p.n;
            if self.off == b.len() {
                self.at += 1;
                self.off = 0;
            } else if p.n == 0 {
                break;
            }
        }
        Ok(total)
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
    /// A connection over the two mapped rings and this side's page; `peer_bell` is the
    /// peer's doorbell end, which it takes. The TCP socket is filled in when the connection
    /// takes the application's descriptor over.
    pub fn new(rx_shm: Shm, rx: Ring, tx_shm: Shm, tx: Ring, side: Side, peer_bell: c_int) -> Conn {
        Conn {
            rx,
            tx,
            _rx_shm: rx_shm,
            _tx_shm: tx_shm,
            side,
            broken: AtomicBool::new(false),
            tcp_fd: -1,
            peer_bell,
            owner: sys::pid(),
            nonblock: AtomicBool::new(false),
            rd_shut: AtomicBool::new(false),
            wr_shut: AtomicBool::new(false),
            grow_wanted: AtomicBool::new(false),
            reader_waits: crate::spin::Adaptive::new(),
            live: false,
            tally: crate::stats::Tally::default(),
            zc_sent: AtomicU32::new(0),
            zc_reported: AtomicU32::new(0),
            rcvtimeo: AtomicI32::new(-1),
            sndtimeo: AtomicI32::new(-1),
            info: None,
        }
    }

    /// Lets go of every descriptor the connection does not need once it is the
    /// application's: the rings' memfds (their mappings stay), and moves the peer's doorbell
    /// end among the library's high descriptors.
    pub fn settle(&mut self) {
        if !self.live {
            self.live = true;
            crate::spin::LIVE.fetch_add(1, Ordering::Relaxed);
        }
        self._rx_shm.close_fd();
        self._tx_shm.close_fd();
        self.peer_bell = sys::move_high(self.peer_bell);
    }

    /// The memfds of our receive ring and the peer's (to hand the connection to a forked
    /// child that accepted it: crate::claim).
    pub fn ring_fds(&self) -> (c_int, c_int) {
        (self._rx_shm.fd, self._tx_shm.fd)
    }

    /// The peer broke a ring: the connection is reset, once — our descriptor and the
    /// peer's shut down (both see the end, poll reports it), counted.
    fn fault(&self, fd: c_int) -> c_int {
        if !self.broken.swap(true, Ordering::SeqCst) {
            crate::stats::count(Counter::PeerFaults);
            self.tx.set_flags(FLAG_RESET);
            // SAFETY: our own descriptors of the two doorbell pairs.
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
        let b = [1u8];
        // SAFETY: one byte from a live buffer.
        let n =
            unsafe { crate::real::send(self.peer_bell, b.as_ptr().cast(), 1, sys::MSG_DONTWAIT | sys::MSG_NOSIGNAL) };
        // EAGAIN: the peer's doorbell is already full of wake-ups; it will look.
        n == 1 || sys::errno() == sys::EAGAIN
    }

    /// Takes up to `n` doorbell bytes off our descriptor `fd`; returns how many it took.
    fn consume(fd: c_int, n: u32) -> u32 {
        let mut buf = [0u8; 64];
        let want = (n as usize).min(buf.len());
        if want == 0 {
            return 0;
        }
        // SAFETY: `buf` has room for `want` bytes.
        let got = unsafe { crate::real::recv(fd, buf.as_mut_ptr().cast(), want, sys::MSG_DONTWAIT) };
        if got > 0 { got as u32 } else { 0 }
    }

    /// The ring just emptied: its doorbell byte comes off our descriptor, with any owed
    /// from earlier emptyings whose bytes had not arrived yet.
    ///
    /// A reader quick enough (one that spun) empties the ring before the writer, which
    /// publishes first and rings second, has sent the byte: it waits for it (briefly — the
    /// writer is between two calls) rather than leave the descriptor readable with nothing
    /// to read, which a program may take as an error (wrk counts a read that says EAGAIN
    /// after poll said readable). A byte that does not come in a millisecond is owed.
    fn take_doorbell(&self, fd: c_int) {
        let owed = self.side.owed();
        let need = owed.load(Ordering::Relaxed).saturating_add(1);
        let mut got = Conn::consume(fd, need);
        if got < need && sys::wait(fd, sys::POLLIN, 1).unwrap_or(false) {
            got += Conn::consume(fd, need - got);
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
        let mut extra = n.saturating_sub(open);
        let owed = self.side.owed();
        let mut taken = 0u32;
        // Bounded: a peer writing as fast as we take must not keep us here.
        for _ in 0..64 {
            if extra == 0 {
                break;
            }
            let got = Conn::consume(fd, extra.min(64) as u32);
            if got == 0 {
                break;
            }
            extra -= got as usize;
            taken += got;
        }
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
        let mut buf = [0u8; 4096];
        // Bounded: a writer filling while we drain must not keep both of us looping.
        for _ in 0..64 {
            // SAFETY: reads into a live buffer.
            let n = unsafe { crate::real::recv(self.peer_bell, buf.as_mut_ptr().cast(), buf.len(), sys::MSG_DONTWAIT) };
            if n <= 0 {
                break;
            }
        }
    }

    /// Whether our descriptor says the peer is gone (its doorbell end closed). Asked of
    /// poll, not by peeking: doorbell bytes may still be queued in front of the end.
    /// A peer that only shut down its sending side (flag set first, then its end shut
    /// for writing, which our descriptor reports as `POLLRDHUP`) is not gone.
    fn peer_gone(&self, fd: c_int) -> bool {
        const POLLRDHUP: i16 = 0x2000;
        let mut p = sys::PollFd { fd, events: POLLRDHUP, revents: 0 };
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
            self.take_doorbell(fd);
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
        loop {
            if self.rd_shut.load(Ordering::Relaxed) {
                return Ok(got);
            }
            let p = self.rx.pop(&mut buf[got..], peek).map_err(|Corrupt| self.fault(fd))?;
            if p.n > 0 {
                if let Some(t) = waiting.take() {
                    self.reader_waits.record(t.elapsed());
                }
                idle = Backoff::default();
                if p.take_bell {
                    self.take_doorbell(fd);
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
                if idle.pause() && self.peer_gone(fd) {
                    return if got > 0 { Ok(got) } else { Err(sys::ECONNRESET) };
                }
                continue;
            }
            if got > 0 && !waitall {
                return Ok(got);
            }
            if self.rx.has_flags(FLAG_SHUTDOWN_WR) {
                return Ok(got);
            }
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
                        if sys::futex_wait(self.rx.state_word(), v, FUTEX_SLICE_MS) == sys::Woke::TimedOut {
                            self.rx.cancel_sleep();
                            on_descriptor = true;
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
                // Whatever the peer wrote before it went is read first (the ring was
                // empty just above; look once more now that it is certainly gone).
                let p = self.rx.pop(&mut buf[got..], peek).map_err(|Corrupt| self.fault(fd))?;
                if p.n > 0 {
                    return Ok(got + p.n);
                }
                return if self.rx.has_flags(FLAG_RESET) { Err(sys::ECONNRESET) } else { Ok(got) };
            }
            if nonblock && got == 0 && !looked_for_count && self.rx.counted() {
                // Counted and not yet published: the writer is between two stores, and its
                // doorbell may already have made the descriptor readable. A program told
                // "readable" must not be told EAGAIN (wrk counts that as an error): wait
                // the moment it takes — a few yields (the writer may need this CPU),
                // bounded in case the peer garbled the count.
                looked_for_count = true;
                if (0..64).any(|_| {
                    std::thread::yield_now();
                    !self.rx.is_empty()
                }) {
                    continue;
                }
            }
            self.settle_doorbell(fd);
            if nonblock {
                return if got > 0 { Ok(got) } else { Err(sys::EAGAIN) };
            }
            match sys::wait(fd, sys::POLLIN, timeout) {
                Ok(true) => {}
                // SO_RCVTIMEO expired, as a TCP socket reports it.
                Ok(false) => return if got > 0 { Ok(got) } else { Err(sys::EAGAIN) },
                Err(e) => return Err(e.raw_os_error().unwrap_or(sys::EINVAL)),
            }
        }
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
                match src.push_into(&self.tx, room) {
                    Ok(p) if p.n == 0 => return Ok(off),
                    Ok(p) => p,
                    Err(SourceError::Ring) => return Err(self.fault(fd)),
                    Err(SourceError::Io(e)) => return if off > 0 { Ok(off) } else { Err(e) },
                }
            };
            if p.n > 0 {
                off += p.n;
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
            if !counted_full {
                counted_full = true;
                crate::stats::buffer_full();
                if self.tx.capacity() < self.tx.max_capacity() {
                    self.grow_wanted.store(true, Ordering::Relaxed);
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
            match sys::wait(fd, sys::POLLOUT, timeout) {
                Ok(true) => {}
                Ok(false) => return if off > 0 { Ok(off) } else { Err(sys::EAGAIN) },
                Err(e) => return Err(e.raw_os_error().unwrap_or(sys::EINVAL)),
            }
        }
        Ok(off)
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
            // SAFETY: writes from a live buffer.
            let n = unsafe {
                crate::real::send(fd, junk.as_ptr().cast(), junk.len(), sys::MSG_DONTWAIT | sys::MSG_NOSIGNAL)
            };
            if n <= 0 {
                break;
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

    /// The last descriptor of the connection in this process was closed.
    pub fn closed(&self) {
        if sys::pid() != self.owner {
            return;
        }
        if let Some(p) = &self.info {
            let _ = std::fs::remove_file(p);
        }
        if !self.rx.is_empty() {
            // Closing with unread data: the peer sees a reset, as with TCP.
            self.tx.set_flags(FLAG_RESET);
        }
        self.shutdown(sys::SHUT_RDWR);
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
        sys::close(self.peer_bell);
        sys::close(self.tcp_fd);
    }
}

//! Rings an event loop looks at itself (docs/architecture.md, "Wake-ups an event loop
//! needs no doorbell for").
//!
//! A program's `epoll` instance that has a connection on shared memory registered for
//! input (not one-shot, not exclusive, in no other instance) *watches* its receive ring
//! while no thread of the program is asleep in that instance: the peer's writes then ring
//! no doorbell (sluice_smc::ring, `WATCHED`), and each `epoll_wait` first looks at the
//! watched rings — memory, no system call — and reports those with bytes as readable with
//! the program's own event data, merged with what the kernel reports. Before a thread
//! sleeps in the instance the promise is taken back from every ring (the writers ring
//! again), and a ring that counted bytes meanwhile is looked at instead of sleeping; when
//! the last sleeper wakes, the rings are watched again.
//!
//! Anything else that waits on such a descriptor — a blocking read's wait on it, `poll`,
//! `ppoll`, `select`, `pselect` (crate::conn, crate::waits) — takes the promise back for
//! good first
//! ([`give_up`]: the connection rings its doorbell from then on, as before it was
//! registered), and reports the bytes an unrung epoch holds. An instance that existed
//! when the process forked is never watched again (parent and child may both wait in it),
//! nor is one the library did not see made, or one with a second descriptor (a wait on
//! the other number would not be seen to sleep).

use std::cell::UnsafeCell;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

use crate::conn::Conn;
use crate::sys;

pub(crate) const EPOLLIN: u32 = 0x001;
const EPOLLEXCLUSIVE: u32 = 1 << 28;
const EPOLLONESHOT: u32 = 1 << 30;
pub(crate) const EPOLL_CTL_ADD: c_int = 1;
const EPOLL_CTL_DEL: c_int = 2;
pub(crate) const EPOLL_CTL_MOD: c_int = 3;

/// One registration of a connection's descriptor in an instance.
struct Watch {
    fd: c_int,
    conn: Weak<Conn>,
    events: u32,
    /// The program's event data, reported back as it registered it.
    data: [u8; 8],
    /// The connection is registered in another instance too: never watched.
    twice: bool,
}

impl Watch {
    /// The connection, if this registration may watch its ring now.
    fn eligible(&self) -> Option<Arc<Conn>> {
        if self.twice || self.events & EPOLLIN == 0 || self.events & (EPOLLONESHOT | EPOLLEXCLUSIVE) != 0 {
            return None;
        }
        let c = self.conn.upgrade()?;
        (!c.is_pending() && !c.no_look()).then_some(c)
    }
}

/// One epoll instance of the program's.
struct Instance {
    epfd: c_int,
    watches: Vec<Watch>,
    /// Threads asleep in it now (the rings are not watched while one is).
    asleep: u32,
    /// It existed when the process forked: never watched again.
    forked: bool,
    /// Where the next look begins.
    next: usize,
    /// In one-event waits, whether the kernel's events come first this time.
    kernel_turn: bool,
}

impl Instance {
    fn watch_all(&self) {
        if self.asleep == 0 && !self.forked {
            self.watches.iter().filter_map(Watch::eligible).for_each(|c| c.rx.watch());
        }
    }

    /// Takes the promise back from every ring; true if one counted bytes meanwhile.
    fn unwatch_all(&self) -> bool {
        let mut counted = false;
        for w in &self.watches {
            if let Some(c) = w.conn.upgrade() {
                counted |= c.rx.unwatch() && w.eligible().is_some();
            }
        }
        counted
    }
}

/// A lock for this process's table that a forked child can take over: the word holds
/// the holder's pid, and a holder that is not this process was a thread of the parent
/// when it forked — gone in the child, its lock with it.
struct Table {
    word: AtomicU32,
    inner: UnsafeCell<Vec<Instance>>,
}

// SAFETY: `inner` is reached only through `Table::with`, which holds `word` for the
// duration (one thread of this process at a time).
unsafe impl Sync for Table {}

impl Table {
    fn with<T>(&self, f: impl FnOnce(&mut Vec<Instance>) -> T) -> T {
        let me = sys::pid();
        loop {
            match self.word.compare_exchange(0, me, Ordering::Acquire, Ordering::Relaxed) {
                Ok(_) => break,
                Err(holder) if holder != me => {
                    // Held when the process forked by a thread the child does not have.
                    if self.word.compare_exchange(holder, me, Ordering::Acquire, Ordering::Relaxed).is_ok() {
                        break;
                    }
                }
                Err(_) => std::thread::yield_now(),
            }
        }
        // Let go however `f` ends (the hooks catch a panic and go on: the lock must not
        // stay held).
        struct Held<'a>(&'a AtomicU32);
        impl Drop for Held<'_> {
            fn drop(&mut self) {
                self.0.store(0, Ordering::Release);
            }
        }
        let _held = Held(&self.word);
        // SAFETY: the lock is ours until `_held` goes.
        f(unsafe { &mut *self.inner.get() })
    }
}

static TABLE: Table = Table { word: AtomicU32::new(0), inner: UnsafeCell::new(Vec::new()) };

/// For each descriptor number: the process's fork count plus one when the program made an
/// epoll instance there (0: none, or not seen made). An instance whose number says
/// another fork count existed across a fork.
static BORN: [AtomicU64; crate::MAX_FD] = [const { AtomicU64::new(0) }; crate::MAX_FD];

fn forks() -> u64 {
    crate::conn::FORKS.load(Ordering::Relaxed).wrapping_add(1)
}

/// The program made epoll instance `fd` (`epoll_create`).
pub fn created(fd: c_int) {
    if fd >= 0 && (fd as usize) < crate::MAX_FD {
        BORN[fd as usize].store(forks(), Ordering::Relaxed);
    }
}

/// True when `epfd` is an instance made in this process since its last fork, with one
/// descriptor.
fn born_here(epfd: c_int) -> bool {
    epfd >= 0 && (epfd as usize) < crate::MAX_FD && BORN[epfd as usize].load(Ordering::Relaxed) == forks()
}

/// Descriptor `fd` was duplicated: an instance is not watched from now on.
pub fn duplicated(fd: c_int) {
    if fd < 0 || fd as usize >= crate::MAX_FD || BORN[fd as usize].swap(0, Ordering::Relaxed) == 0 {
        return;
    }
    TABLE.with(|t| {
        if let Some(i) = t.iter_mut().find(|i| i.epfd == fd) {
            i.forked = true;
            i.unwatch_all();
        }
    });
}

/// Registrations in the table: nothing to do while there is none.
static WATCHES: AtomicUsize = AtomicUsize::new(0);

fn recount(t: &[Instance]) {
    WATCHES.store(t.iter().map(|i| i.watches.len()).sum(), Ordering::Relaxed);
}

/// `sluice smc run --doorbells`: no instance ever watches.
static OFF: AtomicBool = AtomicBool::new(false);

/// Every wake-up by doorbell from now on (read at load, before any connection).
pub fn turn_off() {
    OFF.store(true, Ordering::Relaxed);
}

/// The program's `epoll_ctl` (`op` on `fd`, connection `c`, with the event it passed)
/// succeeded: the registration is noted, and its ring watched if it may be.
pub fn ctl(epfd: c_int, op: c_int, fd: c_int, c: &Arc<Conn>, event: Option<[u8; 16]>) {
    if OFF.load(Ordering::Relaxed) {
        return;
    }
    let (_, off) = sys::EPOLL_EVENT;
    TABLE.with(|t| {
        if let Some(i) = t.iter_mut().find(|i| i.epfd == epfd) {
            i.watches.retain(|w| w.fd != fd);
        }
        if (op == EPOLL_CTL_ADD || op == EPOLL_CTL_MOD)
            && let Some(ev) = event
        {
            let events = u32::from_ne_bytes([ev[0], ev[1], ev[2], ev[3]]);
            let mut data = [0u8; 8];
            data.copy_from_slice(&ev[off..off + 8]);
            // In another instance as well: neither may watch it (each would need the
            // other's sleepers).
            let mut twice = false;
            for i in t.iter_mut().filter(|i| i.epfd != epfd) {
                for w in i.watches.iter_mut().filter(|w| w.conn.upgrade().is_some_and(|o| Arc::ptr_eq(&o, c))) {
                    w.twice = true;
                    twice = true;
                }
            }
            c.mark_looked();
            let w = Watch { fd, conn: Arc::downgrade(c), events, data, twice };
            let at = match t.iter().position(|i| i.epfd == epfd) {
                Some(at) => at,
                None => {
                    let forked = !born_here(epfd);
                    t.push(Instance { epfd, watches: Vec::new(), asleep: 0, forked, next: 0, kernel_turn: false });
                    t.len() - 1
                }
            };
            let inst = &mut t[at];
            let may = w.eligible().is_some() && inst.asleep == 0 && !inst.forked;
            inst.watches.push(w);
            if may {
                c.rx.watch();
            } else {
                c.rx.unwatch();
            }
        } else if op == EPOLL_CTL_DEL {
            c.rx.unwatch();
        }
        t.retain(|i| !i.watches.is_empty() || i.asleep > 0);
        recount(t);
    });
}

/// Whether closing descriptor `fd` changes anything here (it was born an epoll instance
/// the library watches for, or some registration exists).
pub fn concerns(fd: c_int) -> bool {
    (fd >= 0 && (fd as usize) < crate::MAX_FD && BORN[fd as usize].load(Ordering::Relaxed) != 0)
        || WATCHES.load(Ordering::Relaxed) != 0
}

/// Descriptor `fd` is being closed (or replaced): its registrations go (the kernel drops
/// them with the last descriptor of the file; the ring then rings its doorbell again), and
/// so does the instance, if `fd` was one.
pub fn closed(fd: c_int) {
    if fd >= 0 && (fd as usize) < crate::MAX_FD {
        BORN[fd as usize].store(0, Ordering::Relaxed);
    }
    if WATCHES.load(Ordering::Relaxed) == 0 {
        return;
    }
    TABLE.with(|t| {
        for i in t.iter_mut() {
            let all = i.epfd == fd;
            let (gone, kept): (Vec<Watch>, Vec<Watch>) = i.watches.drain(..).partition(|w| all || w.fd == fd);
            i.watches = kept;
            for c in gone.iter().filter_map(|w| w.conn.upgrade()) {
                c.rx.unwatch();
            }
        }
        t.retain(|i| i.epfd != fd && (!i.watches.is_empty() || i.asleep > 0));
        recount(t);
    });
}

/// Before a fork: every instance so far may be waited in by both processes from now on,
/// and one process's sleepers are not the other's to see — none is watched again.
pub fn before_fork() {
    if WATCHES.load(Ordering::Relaxed) == 0 {
        return;
    }
    TABLE.with(|t| {
        for i in t.iter_mut() {
            i.forked = true;
            i.unwatch_all();
        }
    });
}

/// Writes into `events` (room for `max`) an input event for each watched ring of `epfd`
/// with bytes published, from where the last look stopped (so a program that asks for
/// fewer events than there are rings with bytes meets them all in turn); returns how
/// many. A ring that became eligible while the loop was awake (a pending connection its
/// server committed) is watched from here on.
///
/// # Safety
/// `events` has room for `max` epoll events.
unsafe fn look(epfd: c_int, events: *mut c_void, max: usize) -> usize {
    let (size, _) = sys::EPOLL_EVENT;
    TABLE.with(|t| {
        let Some(i) = t.iter_mut().find(|i| i.epfd == epfd && !i.forked) else { return 0 };
        let (len, start) = (i.watches.len(), i.next);
        let mut k = 0;
        for step in 0..len {
            if k == max {
                break;
            }
            let at = (start + step) % len;
            let w = &i.watches[at];
            let Some(c) = w.eligible() else { continue };
            if i.asleep == 0 && !c.rx.watched() {
                c.rx.watch();
            }
            if !c.rx.counted() || c.rx.is_empty() {
                continue;
            }
            c.tally.ring_event();
            let ev = sys::epoll_event(EPOLLIN, u64::from_ne_bytes(w.data));
            // SAFETY: slot `k` < `max` of the caller's array, `size` bytes.
            unsafe { std::ptr::copy_nonoverlapping(ev.as_ptr(), events.cast::<u8>().add(k * size), size) };
            k += 1;
            i.next = (at + 1) % len;
        }
        k
    })
}

/// Whose turn it is in a one-event wait of `epfd` (true: the kernel's), turned over.
fn kernel_turn(epfd: c_int) -> bool {
    TABLE.with(|t| {
        t.iter_mut().find(|i| i.epfd == epfd).is_some_and(|i| {
            i.kernel_turn = !i.kernel_turn;
            !i.kernel_turn
        })
    })
}

/// One look without sleeping: the watched rings with bytes, then what the kernel reports
/// (`kernel(events, max)`, a zero-timeout wait) in the room left, one event per
/// registration (the kernel's merged into the ring's).
///
/// # Safety
/// `events` has room for `max` epoll events.
pub unsafe fn now(
    epfd: c_int,
    events: *mut c_void,
    max: c_int,
    kernel: &mut dyn FnMut(*mut c_void, c_int) -> c_int,
) -> c_int {
    if max <= 0 || WATCHES.load(Ordering::Relaxed) == 0 {
        return kernel(events, max);
    }
    // The kernel's events are never crowded out by the rings': one slot is kept for
    // them, and a one-event wait gives it to them every other time.
    let asked = max == 1 && kernel_turn(epfd);
    if asked {
        let r = kernel(events, max);
        if r != 0 {
            return r;
        }
    }
    let room = if max > 1 { max as usize - 1 } else { 1 };
    // SAFETY: the caller's array, `room` ≤ `max`.
    let k = unsafe { look(epfd, events, room) };
    if k == 0 {
        // (The kernel, if just asked, had nothing.)
        return if asked { 0 } else { kernel(events, max) };
    }
    let (size, off) = sys::EPOLL_EVENT;
    let base = events.cast::<u8>();
    if k == max as usize {
        return k as c_int;
    }
    // SAFETY: the room after the `k` events written.
    let r = kernel(unsafe { base.add(k * size) }.cast(), max - k as c_int);
    if r <= 0 {
        return k as c_int;
    }
    // One event per registration: the kernel's report of a ring's descriptor (a doorbell
    // of an epoch before the ring was watched, an end) joins the ring's.
    let mut n = k;
    for j in k..k + r as usize {
        // SAFETY: event `j` of those written, `size` bytes; `n ≤ j`.
        let (ev_j, data_j) = unsafe {
            let p = base.add(j * size);
            (u32::from_ne_bytes(p.cast::<[u8; 4]>().read_unaligned()), p.add(off).cast::<[u8; 8]>().read_unaligned())
        };
        let same = (0..k).find(|&i| {
            // SAFETY: event `i` < k of ours.
            unsafe { base.add(i * size + off).cast::<[u8; 8]>().read_unaligned() == data_j }
        });
        match same {
            Some(i) => {
                // SAFETY: event `i` of ours: its events word.
                unsafe {
                    let p = base.add(i * size).cast::<[u8; 4]>();
                    *p = (u32::from_ne_bytes(*p) | ev_j).to_ne_bytes();
                }
            }
            None => {
                if n != j {
                    // SAFETY: both within the array, `n < j`.
                    unsafe { std::ptr::copy_nonoverlapping(base.add(j * size), base.add(n * size), size) };
                }
                n += 1;
            }
        }
    }
    n as c_int
}

/// A wait that may sleep (`timeout` ≠ 0) in `epfd`: the rings' promise is taken back
/// first — a ring that counted bytes meanwhile is looked at instead of sleeping (its
/// bytes are published within moments; one that never publishes is not watched again) —
/// then `kernel(events, max, timeout)` sleeps, and the last sleeper to wake watches the
/// rings again.
///
/// # Safety
/// `events` has room for `max` epoll events.
pub unsafe fn sleep(
    epfd: c_int,
    events: *mut c_void,
    max: c_int,
    timeout: c_int,
    kernel: &mut dyn FnMut(*mut c_void, c_int, c_int) -> c_int,
) -> c_int {
    if max <= 0 || timeout == 0 || WATCHES.load(Ordering::Relaxed) == 0 {
        return kernel(events, max, timeout);
    }
    let counted = TABLE.with(|t| {
        t.iter_mut().find(|i| i.epfd == epfd && !i.forked).map(|i| {
            i.asleep += 1;
            i.unwatch_all()
        })
    });
    let Some(counted) = counted else { return kernel(events, max, timeout) };
    let r = if counted {
        // SAFETY: the caller's array.
        unsafe { published(epfd, events, max, timeout, kernel) }
    } else {
        kernel(events, max, timeout)
    };
    TABLE.with(|t| {
        if let Some(i) = t.iter_mut().find(|i| i.epfd == epfd) {
            i.asleep = i.asleep.saturating_sub(1);
            i.watch_all();
        }
    });
    r
}

/// How long a wait that found bytes counted and not published looks for them.
const PUBLISH_WAIT_MS: u64 = 20;

/// Bytes were counted on a ring whose epoch may have opened unrung: the writer publishes
/// right after it counts, so look (and ask the kernel, without sleeping) until they are.
/// A count not published within [`PUBLISH_WAIT_MS`] was garbled, or its writer died: that
/// connection is not watched again (its epochs ring), and the wait is the kernel's.
///
/// # Safety
/// `events` has room for `max` epoll events.
unsafe fn published(
    epfd: c_int,
    events: *mut c_void,
    max: c_int,
    timeout: c_int,
    kernel: &mut dyn FnMut(*mut c_void, c_int, c_int) -> c_int,
) -> c_int {
    let mut r = 0;
    if crate::spin::nap_until(PUBLISH_WAIT_MS, || {
        // SAFETY: the caller's array.
        r = unsafe { now(epfd, events, max, &mut |e, m| kernel(e, m, 0)) };
        r != 0
    }) {
        return r;
    }
    TABLE.with(|t| {
        if let Some(i) = t.iter().find(|i| i.epfd == epfd) {
            for c in i.watches.iter().filter_map(Watch::eligible) {
                if c.rx.counted() && c.rx.is_empty() {
                    c.stop_looking();
                    c.rx.unwatch();
                }
            }
        }
    });
    kernel(events, max, timeout)
}

/// Connection `c` is waited on outside its event loop: its ring is never watched again.
/// True when bytes are counted (an epoch may have opened unrung): the caller reads them,
/// or reports the descriptor readable, instead of waiting on it.
pub fn give_up(c: &Conn) -> bool {
    // Under the table's lock: no event loop is between deciding to watch and watching.
    TABLE.with(|_| {
        c.stop_looking();
        c.rx.unwatch()
    })
}

/// For `poll` and `select`, before they sleep on connection `c`'s descriptor for input:
/// if an event loop may watch the connection, the promise is taken back ([`give_up`]),
/// and true when its ring has bytes to read (waited for a moment if counted and not yet
/// published) — the descriptor is then to be reported readable: no doorbell may say so.
pub fn readable_after_giving_up(c: &Conn) -> bool {
    if WATCHES.load(Ordering::Relaxed) == 0 || !c.looked() || !give_up(c) {
        return false;
    }
    !c.rx.is_empty() || c.rx.counted() && c.until_published(PUBLISH_WAIT_MS)
}

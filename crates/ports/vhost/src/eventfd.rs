//! The peer's kick and call descriptors, read and written so that the switch never waits on
//! them.
//!
//! The frontend hands each ring two descriptors: a *kick* the guest's driver signals (the
//! port reads it) and a *call* the port signals (QEMU turns it into the guest's interrupt).
//! They stay the peer's: it shares their open file description, so it can clear
//! `O_NONBLOCK` on them whenever it likes, fill a call's counter and never read it, or send
//! something that is no eventfd at all (a pipe takes 8,192 eight-byte writes, then blocks).
//! So, whatever the peer does:
//! - only eventfds are taken ([`is_eventfd`]: the kernel's own name for the file);
//! - a kick is read with `preadv2(RWF_NOWAIT)` ([`drain`]), which returns at once whatever
//!   the file's flags say;
//! - a call is written only when `poll` says the counter can take one ([`notify`]). Eventfds
//!   have no write that ignores the file's flags, so a peer that fills the counter between
//!   the `poll` and the write (after clearing `O_NONBLOCK`) could still make it wait: the
//!   write runs under a watchdog thread that interrupts it with a signal once it has waited
//!   [`STALL`], and it then fails with [`Notified::Stalled`] (the port ends that
//!   connection). The signal (`SIGURG`, whose default is to be ignored) gets a handler that
//!   does nothing, installed without `SA_RESTART` so that it interrupts the write.

use std::cell::Cell;
use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Once, OnceLock};
use std::time::{Duration, Instant};

/// How long a call's write may wait before the watchdog interrupts it.
pub const STALL: Duration = Duration::from_millis(100);
/// How often the watchdog looks at the writes under way.
const TICK: Duration = Duration::from_millis(50);
/// Threads that may write calls at the same time, each watched (the switch has one datapath
/// thread; tests and benchmarks a few). A thread beyond these writes unwatched.
const WRITERS: usize = 64;
/// The signal that interrupts a stalled write.
const WAKE: libc::c_int = libc::SIGURG;

/// Whether `fd` is an eventfd: the kernel names its file `anon_inode:[eventfd]`, a name no
/// other descriptor (a pipe, a socket, a file called so) can have.
pub(crate) fn is_eventfd(fd: RawFd) -> bool {
    crate::peer::fd_target(fd).is_ok_and(|t| t.as_os_str() == "anon_inode:[eventfd]")
}

/// Empties a kick eventfd without waiting; true if it had been signalled.
pub(crate) fn drain(fd: RawFd) -> bool {
    let mut v = [0u8; 8];
    match crate::sys::read_nowait(fd, &mut v) {
        Ok(8) => true,
        Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => {
            // A kernel older than 5.12 (no RWF_NOWAIT on eventfds): read only what poll says
            // is there, under the watchdog.
            ready(fd, libc::POLLIN) && matches!(watched(|| crate::sys::read(fd, &mut v)).0, Ok(8))
        }
        _ => false,
    }
}

/// What became of a call.
#[derive(Debug)]
pub(crate) enum Notified {
    /// The guest is signalled.
    Sent,
    /// The counter was full (the peer never reads it): the guest misses this interrupt.
    Full,
    /// The write waited [`STALL`] and was interrupted: the peer filled the counter after
    /// clearing `O_NONBLOCK`.
    Stalled,
    /// The write failed otherwise.
    Failed(io::Error),
}

/// Signals a call eventfd, never waiting longer than [`STALL`] (and then only if the peer
/// races the `poll`).
pub(crate) fn notify(fd: RawFd) -> Notified {
    if !ready(fd, libc::POLLOUT) {
        return Notified::Full;
    }
    let one = 1u64.to_ne_bytes();
    let (r, waited) = watched(|| crate::sys::write(fd, &one));
    match r {
        Ok(8) => Notified::Sent,
        Ok(n) => Notified::Failed(io::Error::other(format!("a write of {n} bytes"))),
        Err(e) => match e.raw_os_error() {
            Some(libc::EAGAIN) => Notified::Full,
            Some(libc::EINTR) if waited >= STALL => Notified::Stalled,
            Some(libc::EINTR) => Notified::Full,
            _ => Notified::Failed(e),
        },
    }
}

/// Whether `fd` is ready for `events` now (never waits).
fn ready(fd: RawFd, events: libc::c_short) -> bool {
    crate::sys::poll(fd, events, 0).is_ok_and(|r| r & events != 0 && r & (libc::POLLERR | libc::POLLNVAL) == 0)
}

/// One thread's write under way, as the watchdog sees it.
struct Writer {
    claimed: AtomicBool,
    /// When the write began (milliseconds since [`epoch`], plus one); 0 when none is.
    since: AtomicU64,
    thread: AtomicU64,
}

#[allow(clippy::declare_interior_mutable_const)]
const IDLE: Writer = Writer { claimed: AtomicBool::new(false), since: AtomicU64::new(0), thread: AtomicU64::new(0) };
static WRITERS_TABLE: [Writer; WRITERS] = [IDLE; WRITERS];

/// This thread's entry in the writers' table, given back when the thread ends.
struct Claim(Option<usize>);

impl Claim {
    fn take() -> Claim {
        let slot = WRITERS_TABLE
            .iter()
            .position(|w| w.claimed.compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed).is_ok());
        if let Some(i) = slot {
            // SAFETY: pthread_self has no preconditions.
            WRITERS_TABLE[i].thread.store(unsafe { libc::pthread_self() } as u64, Ordering::Release);
        }
        Claim(slot)
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        if let Some(i) = self.0 {
            WRITERS_TABLE[i].since.store(0, Ordering::Release);
            WRITERS_TABLE[i].claimed.store(false, Ordering::Release);
        }
    }
}

thread_local! {
    static MINE: Claim = Claim::take();
    static WATCHING: Cell<bool> = const { Cell::new(false) };
}

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

fn now_ms() -> u64 {
    epoch().elapsed().as_millis() as u64 + 1
}

/// Runs the system call `f` (a read or write of a peer's eventfd) with this thread's entry
/// telling the watchdog when it began; returns its result and how long it took. An
/// interrupted call is tried again until it has waited [`STALL`].
fn watched(mut f: impl FnMut() -> io::Result<usize>) -> (io::Result<usize>, Duration) {
    start_watchdog();
    let start = Instant::now();
    let slot = MINE.try_with(|c| c.0).ok().flatten();
    if let Some(i) = slot {
        WRITERS_TABLE[i].since.store(now_ms(), Ordering::Release);
    }
    let out = loop {
        let r = f();
        let interrupted = r.as_ref().is_err_and(|e| e.raw_os_error() == Some(libc::EINTR));
        if !interrupted || start.elapsed() >= STALL {
            break (r, start.elapsed());
        }
    };
    if let Some(i) = slot {
        WRITERS_TABLE[i].since.store(0, Ordering::Release);
    }
    out
}

extern "C" fn on_wake(_: libc::c_int) {}

/// Installs the wake-up signal's handler and starts the watchdog, once per process.
fn start_watchdog() {
    static ONCE: Once = Once::new();
    if WATCHING.with(Cell::get) {
        return;
    }
    ONCE.call_once(|| {
        // SAFETY: `sa` is fully initialized (zeroed, a handler that does nothing, an empty
        // mask, no SA_RESTART so that a blocked write is interrupted).
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_wake as *const () as usize;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(WAKE, &sa, std::ptr::null_mut());
        }
        let _ = std::thread::Builder::new().name("vhost-watchdog".into()).spawn(|| {
            loop {
                std::thread::sleep(TICK);
                let now = now_ms();
                for w in &WRITERS_TABLE {
                    let since = w.since.load(Ordering::Acquire);
                    if since != 0 && now.saturating_sub(since) >= STALL.as_millis() as u64 {
                        // SAFETY: the thread is alive: it clears `since` before it ends
                        // (Claim's drop), and `since` was set after `thread`.
                        unsafe { libc::pthread_kill(w.thread.load(Ordering::Acquire) as libc::pthread_t, WAKE) };
                    }
                }
            }
        });
    });
    WATCHING.with(|w| w.set(true));
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;
    use vmm_sys_util::eventfd::EventFd;

    fn blocking_eventfd() -> EventFd {
        EventFd::new(0).unwrap()
    }

    #[test]
    fn only_eventfds_are_eventfds() {
        assert!(is_eventfd(blocking_eventfd().as_raw_fd()));
        let (r, w) = std::io::pipe().unwrap();
        assert!(!is_eventfd(r.as_raw_fd()) && !is_eventfd(w.as_raw_fd()));
        let f = std::fs::File::open("/proc/self/status").unwrap();
        assert!(!is_eventfd(f.as_raw_fd()));
    }

    #[test]
    fn a_blocking_kick_is_drained_without_waiting() {
        let e = blocking_eventfd();
        assert!(!drain(e.as_raw_fd()), "nothing there, and no wait");
        e.write(3).unwrap();
        assert!(drain(e.as_raw_fd()));
        assert!(!drain(e.as_raw_fd()));
    }

    #[test]
    fn a_full_blocking_call_is_not_written() {
        let e = blocking_eventfd();
        assert!(matches!(notify(e.as_raw_fd()), Notified::Sent));
        e.write(u64::MAX - 2).unwrap();
        let t = Instant::now();
        assert!(matches!(notify(e.as_raw_fd()), Notified::Full));
        assert!(t.elapsed() < STALL, "it did not wait");
    }

    /// The race `poll` cannot close: a write into a full, blocking counter is interrupted
    /// after `STALL` (the write is made here without the `poll`, as if the peer had filled the
    /// counter just after it).
    #[test]
    fn a_stalled_write_is_interrupted() {
        let e = blocking_eventfd();
        e.write(u64::MAX - 1).unwrap();
        let one = 1u64.to_ne_bytes();
        let fd = e.as_raw_fd();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let (r, waited) = watched(|| crate::sys::write(fd, &one));
            let _ = tx.send((r.map_err(|e| e.raw_os_error()), waited));
        });
        let (r, waited) = rx.recv_timeout(Duration::from_secs(20)).expect("the write was never interrupted: a hang");
        assert_eq!(r, Err(Some(libc::EINTR)));
        assert!(waited >= STALL, "{waited:?}");
        drop(e);
    }
}

//! Descriptors a peer sent us, and how they are let go without waiting on the peer.
//!
//! Closing a descriptor can block: the last close of a TCP socket with `SO_LINGER` waits
//! for its unsent bytes, a file on a FUSE mount waits for its server's answer, and a unix
//! socket's queued messages release the descriptors they carry, on the closing thread. A
//! peer chooses what it sends, so a descriptor not shown to be harmless (a memfd) is closed
//! by the reaper, a thread of its own, never on the application's thread or a handshake's.
//! The same holds for messages a peer queues: our doorbells refuse descriptors
//! ([`crate::sys::refuse_rights`]), and door connections are shut for reading and closed
//! by the reaper ([`quiesce`]).
//!
//! A reaper stuck on a close holds what comes after it; past [`CONGESTED`] descriptors the
//! library stops taking new ones (no handshakes) until it catches up, so what a peer can
//! pin is bounded. The reaper is woken once [`BATCH`] descriptors wait, or looks on its
//! own every [`PATIENCE_MS`] while any do: a connection's proof socket costs no wake-up.

use std::ffi::c_int;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, OnceLock};

use crate::sys;

/// Descriptors waiting for the reaper beyond which no handshake starts.
pub const CONGESTED: usize = 256;
/// Descriptors waiting at which the reaper is woken.
const BATCH: usize = 32;
/// How long a descriptor waits for the reaper at most (when fewer than [`BATCH`] do).
const PATIENCE_MS: u64 = 100;

static WAITING: AtomicUsize = AtomicUsize::new(0);

struct Reaper {
    /// The process whose thread this is (a forked child starts its own).
    pid: u32,
    queue: Vec<c_int>,
    /// The reaper sleeps with nothing to do (no timeout): the first descriptor wakes it,
    /// after which it looks every PATIENCE_MS.
    idle: bool,
}

fn reaper() -> &'static (Mutex<Reaper>, Condvar) {
    static R: OnceLock<(Mutex<Reaper>, Condvar)> = OnceLock::new();
    R.get_or_init(|| (Mutex::new(Reaper { pid: 0, queue: Vec::new(), idle: false }), Condvar::new()))
}

/// Lets go of descriptor `fd`, which a peer sent: closed here if it is a memfd, by the
/// reaper otherwise.
pub fn release(fd: c_int) {
    if fd < 0 {
        return;
    }
    if sys::is_shmem(fd) {
        sys::close(fd);
        return;
    }
    let (m, cv) = reaper();
    let mut r = m.lock().unwrap_or_else(|p| p.into_inner());
    let me = sys::pid();
    if r.pid != me {
        let started = std::thread::Builder::new()
            .name("sluice-smc-reap".into())
            .spawn(|| {
                sys::block_signals();
                reap()
            })
            .is_ok();
        if !started {
            drop(r);
            // No thread to be had: the one place left to close it is here.
            sys::close(fd);
            return;
        }
        r.pid = me;
    }
    r.queue.push(fd);
    if WAITING.fetch_add(1, Ordering::SeqCst) + 1 >= BATCH || r.queue.len() == 1 && r.idle {
        cv.notify_one();
    }
}

/// Lets go of every descriptor in `fds`.
pub fn release_all(fds: &[c_int]) {
    fds.iter().for_each(|&f| release(f));
}

/// Takes up to `buf.len()` bytes off unix stream socket `fd` without waiting: any
/// descriptors that come with them are let go off this thread ([`release_all`]), so a peer
/// cannot make this read release something of its choosing. `None` when nothing could be
/// read.
pub fn recv_releasing(fd: c_int, buf: &mut [u8]) -> Option<usize> {
    let (n, fds) = sys::recv_nowait_with_rights(fd, buf);
    release_all(&fds);
    n
}

/// True while the reaper is behind: no new descriptors should be taken from peers.
pub fn congested() -> bool {
    WAITING.load(Ordering::SeqCst) >= CONGESTED
}

fn reap() {
    let (m, cv) = reaper();
    let mut r = m.lock().unwrap_or_else(|p| p.into_inner());
    loop {
        if let Some(fd) = r.queue.pop() {
            drop(r);
            sys::close(fd);
            WAITING.fetch_sub(1, Ordering::SeqCst);
            r = m.lock().unwrap_or_else(|p| p.into_inner());
            continue;
        }
        // Nothing queued: sleep until the first comes (it wakes us), then gather for a
        // while before closing (later ones do not wake us, unless a batch is full).
        r.idle = true;
        r = cv.wait(r).unwrap_or_else(|p| p.into_inner());
        r.idle = false;
        if !r.queue.is_empty() && WAITING.load(Ordering::SeqCst) < BATCH {
            r = cv.wait_timeout(r, std::time::Duration::from_millis(PATIENCE_MS)).unwrap_or_else(|p| p.into_inner()).0;
        }
    }
}

/// Closes door connection `sock` without releasing anything the peer queued on this
/// thread: shut for reading (the peer can send no more), then given to the reaper, whose
/// close frees what is still queued. (Draining it here instead cannot tell the end of the
/// queue from an empty message.)
pub fn quiesce(sock: c_int) {
    // SAFETY: shutdown on a descriptor the caller owns.
    unsafe { crate::real::shutdown(sock, sys::SHUT_RD) };
    release(sock);
}

//! The poll family — `epoll_wait`, `epoll_pwait`, `poll`, `select` — for event-loop
//! programs (nginx, redis): while the process has a connection on shared memory and its
//! waits have lately been short, a wait looks (without sleeping: a zero timeout) for up
//! to the adaptive budget before it sleeps with what is left of the caller's timeout
//! (crate::spin). The doorbell byte a peer writes makes the descriptor ready at once, so
//! a looking wait sees it without a wake-up. Everything else is the real call's.

use std::ffi::{c_int, c_void};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::spin::{self, Adaptive};
use crate::sys::PollFd;
use crate::{active, pending, real};

/// This process's event-loop waits.
static LOOP: Adaptive = Adaptive::new();

/// Runs a wait of `timeout_ms` (-1: none): `try_now` is the call with a zero timeout,
/// `sleep` the call with the given one. Returns what the last call returned.
///
/// While the process has pending connections (crate::pending) the sleep is cut into
/// slices, and between them the pending connections are looked at: one whose server took
/// it as plain TCP goes back to its TCP socket, where this wait then sees its bytes.
fn wait(timeout_ms: c_int, mut try_now: impl FnMut() -> c_int, mut sleep: impl FnMut(c_int) -> c_int) -> c_int {
    let watching = || pending::WATCHING.load(Ordering::Relaxed) > 0;
    if !active() || timeout_ms == 0 || (spin::LIVE.load(Ordering::Relaxed) == 0 && !watching()) {
        return sleep(timeout_ms);
    }
    let start = Instant::now();
    let budget = LOOP.budget();
    let mut r = 0;
    if spin::spin_until(budget, || {
        r = try_now();
        r != 0
    }) {
        LOOP.record(start.elapsed());
        return r;
    }
    let left = |start: Instant| {
        if timeout_ms < 0 {
            -1
        } else {
            let spent = start.elapsed().as_millis().min(c_int::MAX as u128) as c_int;
            (timeout_ms - spent).max(0)
        }
    };
    let r = loop {
        let l = left(start);
        if !watching() || l == 0 {
            break sleep(l);
        }
        let slice = if l < 0 { PENDING_SLICE_MS } else { l.min(PENDING_SLICE_MS) };
        let r = sleep(slice);
        if r != 0 || (l >= 0 && slice == l) {
            break r;
        }
        pending::sweep();
    };
    if r != 0 {
        LOOP.record(start.elapsed());
    } else {
        // A timeout: the wait was as long as the caller let it be.
        LOOP.record(Duration::from_millis(timeout_ms.max(0) as u64).max(start.elapsed()));
    }
    r
}

/// How long a wait sleeps between looks at the pending connections.
const PENDING_SLICE_MS: c_int = 10;

/// `epoll_wait(2)`.
///
/// # Safety
/// As for `epoll_wait(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epoll_wait(epfd: c_int, events: *mut c_void, max: c_int, timeout: c_int) -> c_int {
    // SAFETY (both closures): the caller's arguments, with a timeout of our choosing.
    wait(
        timeout,
        || unsafe { real::epoll_wait(epfd, events, max, 0) },
        |t| unsafe { real::epoll_wait(epfd, events, max, t) },
    )
}

/// `epoll_pwait(2)`.
///
/// # Safety
/// As for `epoll_pwait(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epoll_pwait(
    epfd: c_int,
    events: *mut c_void,
    max: c_int,
    timeout: c_int,
    mask: *const c_void,
) -> c_int {
    // SAFETY (both closures): the caller's arguments, with a timeout of our choosing.
    wait(
        timeout,
        || unsafe { real::epoll_pwait(epfd, events, max, 0, mask) },
        |t| unsafe { real::epoll_pwait(epfd, events, max, t, mask) },
    )
}

/// `poll(2)`.
///
/// # Safety
/// As for `poll(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn poll(fds: *mut PollFd, n: u64, timeout: c_int) -> c_int {
    // SAFETY (both closures): the caller's arguments; poll only writes `revents`.
    wait(timeout, || unsafe { real::poll(fds, n, 0) }, |t| unsafe { real::poll(fds, n, t) })
}

/// `struct timeval`.
#[repr(C)]
#[derive(Clone, Copy)]
struct TimeVal {
    sec: i64,
    usec: i64,
}

/// `select(2)`: the sets are kept and put back before every look (a zero-timeout select
/// clears the bits of descriptors that are not ready).
///
/// # Safety
/// As for `select(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn select(n: c_int, r: *mut c_void, w: *mut c_void, e: *mut c_void, tv: *mut c_void) -> c_int {
    let timeout_ms = if tv.is_null() {
        -1
    } else {
        // SAFETY: `tv` is the caller's timeval.
        let t = unsafe { *tv.cast::<TimeVal>() };
        (t.sec.saturating_mul(1000).saturating_add(t.usec / 1000)).clamp(0, c_int::MAX as i64) as c_int
    };
    if timeout_ms == 0
        || !active()
        || (spin::LIVE.load(Ordering::Relaxed) == 0 && pending::WATCHING.load(Ordering::Relaxed) == 0)
    {
        // SAFETY: the caller's arguments.
        return unsafe { real::select(n, r, w, e, tv) };
    }
    // The words of each set that select reads and writes: `n` bits (also when a program
    // built with a larger FD_SETSIZE passes more than 1024).
    let words = (n.max(0) as usize).div_ceil(64);
    // SAFETY: a set the caller passed holds at least `n` bits.
    let keep =
        |p: *mut c_void| (!p.is_null()).then(|| unsafe { std::slice::from_raw_parts(p.cast::<u64>(), words) }.to_vec());
    let sets = [(r, keep(r)), (w, keep(w)), (e, keep(e))];
    let restore = || {
        for (p, v) in &sets {
            if let Some(v) = v {
                // SAFETY: as above.
                unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), p.cast::<u64>(), words) };
            }
        }
    };
    wait(
        timeout_ms,
        || {
            restore();
            let mut zero = TimeVal { sec: 0, usec: 0 };
            // SAFETY: the caller's sets, and a zero timeval of ours.
            unsafe { real::select(n, r, w, e, (&raw mut zero).cast()) }
        },
        |left| {
            restore();
            if tv.is_null() || left == timeout_ms {
                // Nothing spent looking: the caller's own timeout, to the microsecond.
                // SAFETY: the caller's arguments.
                return unsafe { real::select(n, r, w, e, tv) };
            }
            let mut t = TimeVal { sec: i64::from(left) / 1000, usec: i64::from(left) % 1000 * 1000 };
            // SAFETY: the caller's sets, and a timeval of ours for what is left.
            let out = unsafe { real::select(n, r, w, e, (&raw mut t).cast()) };
            // As Linux does, the caller's timeval is left with the time not slept.
            // SAFETY: `tv` is the caller's timeval.
            unsafe { *tv.cast::<TimeVal>() = t };
            out
        },
    )
}

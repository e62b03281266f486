//! The poll family — `epoll_wait`, `epoll_pwait`, `poll`, `select` — for event-loop
//! programs (nginx, redis): while the process has a connection on shared memory and its
//! waits have lately been short, a wait looks (without sleeping: a zero timeout) for up
//! to the adaptive budget before it sleeps with what is left of the caller's timeout
//! (crate::spin). The doorbell byte a peer writes makes the descriptor ready at once, so
//! a looking wait sees it without a wake-up; `epoll_wait` (and `epoll_pwait2`) looks at
//! the rings its instance watches itself, without a doorbell, and `poll`, `ppoll`,
//! `select` and `pselect` take such rings' promise back first (crate::looks). Everything
//! else is the real call's.

use std::ffi::{c_int, c_void};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::cabi::PollFd;
use crate::spin::{self, Adaptive};
use crate::{active, looks, pending, real, sys};

/// This process's event-loop waits.
static LOOP: Adaptive = Adaptive::new();

/// Runs a wait of `timeout_ms` (-1: none): `try_now` is the call with a zero timeout,
/// `sleep` the call with the given one. Returns what the last call returned, less what
/// `forget` takes out of it.
///
/// While the process has pending connections (crate::pending) the sleep is cut into
/// slices, and between them the pending connections are looked at: one whose server took
/// it as plain TCP goes back to its TCP socket, where this wait then sees its bytes. They
/// are looked at also when a call reports something: a connection that went back to TCP
/// was reported for its pair's end closing (the server's decline), which `forget(count,
/// fallen)` takes out of the result — the program's read would find nothing yet on the
/// TCP socket, and a program told "readable" that then reads nothing may count an error
/// (wrk does). When nothing else was reported the wait goes on.
fn wait(
    timeout_ms: c_int,
    mut try_now: impl FnMut() -> c_int,
    mut sleep: impl FnMut(c_int) -> c_int,
    mut forget: impl FnMut(c_int, &[pending::Fallen]) -> c_int,
) -> c_int {
    let watching = || pending::WATCHING.load(Ordering::Relaxed) > 0;
    if !active() || (spin::LIVE.load(Ordering::Relaxed) == 0 && !watching()) {
        return sleep(timeout_ms);
    }
    // What a call reported, less what it reported of connections that went back to TCP
    // while it ran (from move number `since` on, on any thread).
    let mut settle = |r: c_int, since: u64| -> c_int {
        if r <= 0 || !watching() && pending::moves() == since {
            return r;
        }
        let fallen = pending::sweep(since);
        if fallen.is_empty() { r } else { forget(r, &fallen) }
    };
    if timeout_ms == 0 {
        let since = pending::moves();
        return settle(try_now(), since);
    }
    let start = Instant::now();
    let budget = LOOP.budget();
    let mut r = 0;
    if spin::spin_until(budget, || {
        let since = pending::moves();
        r = settle(try_now(), since);
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
        let slice = if !watching() || l == 0 {
            l
        } else if l < 0 {
            PENDING_SLICE_MS
        } else {
            l.min(PENDING_SLICE_MS)
        };
        let since = pending::moves();
        let raw = sleep(slice);
        let r = settle(raw, since);
        if r != 0 || l == 0 {
            break r;
        }
        if raw == 0 {
            if slice == l {
                // The caller's whole timeout.
                break 0;
            }
            // A slice: whatever went back to TCP in it was not reported.
            let _ = pending::sweep(pending::moves());
        } else {
            // All it reported was of connections gone back to TCP, or going back on
            // another thread (whose pair's end then reports again at once until that
            // thread is done): wait on, a moment later.
            std::thread::sleep(Duration::from_micros(200));
        }
    };
    if r != 0 {
        LOOP.record(start.elapsed());
    } else {
        // A timeout: the wait was as long as the caller let it be.
        LOOP.record(Duration::from_millis(timeout_ms.max(0) as u64).max(start.elapsed()));
    }
    r
}

/// Takes out of `count` epoll events at `events` those of registrations (on `epfd`) of
/// connections that went back to TCP; returns how many are left, moved to the front.
/// Each registration taken out is armed again (`EPOLL_CTL_MOD`, as it was made), so an
/// edge-triggered one whose TCP socket became ready meanwhile is reported by the next
/// wait rather than never.
///
/// # Safety
/// `events` holds `count` events as `epoll_wait` wrote them.
unsafe fn forget_epoll(epfd: c_int, events: *mut c_void, count: c_int, fallen: &[pending::Fallen]) -> c_int {
    let (size, off) = sys::EPOLL_EVENT;
    let base = events.cast::<u8>();
    let mut kept = 0usize;
    for i in 0..count.max(0) as usize {
        // SAFETY: event `i` of the `count` the kernel wrote, `size` bytes each.
        let ev = unsafe { std::slice::from_raw_parts(base.add(i * size), size) };
        let data = &ev[off..off + 8];
        let stale = fallen.iter().find_map(|f| {
            f.regs.iter().find(|(e, reg)| *e == epfd && reg[off..off + 8] == *data).map(|(_, reg)| (f.fd, *reg))
        });
        if let Some((fd, mut reg)) = stale {
            // SAFETY: the program's epoll instance and the event it registered `fd` with.
            unsafe {
                real::epoll_ctl(epfd, 3 /* EPOLL_CTL_MOD */, fd, reg.as_mut_ptr().cast())
            };
        } else {
            if kept != i {
                // SAFETY: both within the caller's array; `kept < i`, so they do not overlap.
                unsafe { std::ptr::copy_nonoverlapping(base.add(i * size), base.add(kept * size), size) };
            }
            kept += 1;
        }
    }
    kept as c_int
}

/// Clears what `poll` reported of descriptors that went back to TCP; returns the count
/// left.
///
/// # Safety
/// `fds` holds `n` pollfds.
unsafe fn forget_poll(fds: *mut PollFd, n: u64, count: c_int, fallen: &[pending::Fallen]) -> c_int {
    // SAFETY: the caller's array of `n` pollfds.
    let fds = unsafe { std::slice::from_raw_parts_mut(fds, n as usize) };
    let mut count = count;
    for p in fds {
        if p.revents != 0 && fallen.iter().any(|f| f.fd == p.fd) {
            p.revents = 0;
            count -= 1;
        }
    }
    count
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
        || unsafe { looks::now(epfd, events, max, &mut |e, m| real::epoll_wait(epfd, e, m, 0)) },
        |t| unsafe { looks::sleep(epfd, events, max, t, &mut |e, m, t| real::epoll_wait(epfd, e, m, t)) },
        |r, fallen| unsafe { forget_epoll(epfd, events, r, fallen) },
    )
}

/// `epoll_create1(2)`: an instance made in this process since its last fork may look at
/// rings itself (crate::looks).
///
/// # Safety
/// As for `epoll_create1(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epoll_create1(flags: c_int) -> c_int {
    // SAFETY: the caller's argument.
    let fd = unsafe { real::epoll_create1(flags) };
    looks::created(fd);
    fd
}

/// `epoll_create(2)`, as [`epoll_create1`].
///
/// # Safety
/// As for `epoll_create(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epoll_create(size: c_int) -> c_int {
    // SAFETY: the caller's argument.
    let fd = unsafe { real::epoll_create(size) };
    looks::created(fd);
    fd
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
        || unsafe { looks::now(epfd, events, max, &mut |e, m| real::epoll_pwait(epfd, e, m, 0, mask)) },
        |t| unsafe { looks::sleep(epfd, events, max, t, &mut |e, m, t| real::epoll_pwait(epfd, e, m, t, mask)) },
        |r, fallen| unsafe { forget_epoll(epfd, events, r, fallen) },
    )
}

/// `poll(2)`.
///
/// # Safety
/// As for `poll(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn poll(fds: *mut PollFd, n: u64, timeout: c_int) -> c_int {
    // SAFETY: the caller's array of `n` pollfds.
    if let Some(r) = unsafe { rings_first(fds, n, &mut |t| real::poll(fds, n, t)) } {
        return r;
    }
    // SAFETY (both closures): the caller's arguments; poll only writes `revents`.
    wait(
        timeout,
        || unsafe { real::poll(fds, n, 0) },
        |t| unsafe { real::poll(fds, n, t) },
        |r, fallen| unsafe { forget_poll(fds, n, r, fallen) },
    )
}

/// Before a poll-family call waits for input on descriptor `fd`: a connection's owed
/// doorbell bytes come off ([`crate::conn::Conn::waited_for_input`]), and an event loop's
/// promise to look at its ring is taken back (crate::looks); true when its ring has bytes
/// to read — the descriptor is then to be reported readable.
fn before_input_wait(fd: c_int) -> bool {
    let Some(c) = crate::conn_of(fd) else { return false };
    c.waited_for_input(fd);
    looks::readable_after_giving_up(&c)
}

/// Before `poll`/`ppoll` look at descriptors `fds`: each connection asked for input has
/// its owed doorbell bytes taken off ([`before_input_wait`]); connections an event loop
/// watches ring no doorbell (crate::looks), so each is not watched from now on, and one
/// whose ring holds bytes makes the call answer at once — `zero(0)`, the call
/// without waiting, with those descriptors readable too. `None`: the call is the caller's.
///
/// # Safety
/// `fds` holds `n` pollfds.
unsafe fn rings_first(fds: *mut PollFd, n: u64, zero: &mut dyn FnMut(c_int) -> c_int) -> Option<c_int> {
    if !active() || fds.is_null() {
        return None;
    }
    // SAFETY: the caller's array of `n` pollfds.
    let all = unsafe { std::slice::from_raw_parts_mut(fds, n as usize) };
    let ready: Vec<usize> =
        (0..all.len()).filter(|&i| all[i].events & sys::POLLIN != 0 && before_input_wait(all[i].fd)).collect();
    if ready.is_empty() {
        return None;
    }
    let mut r = zero(0).max(0);
    for i in ready {
        if all[i].revents == 0 {
            r += 1;
        }
        all[i].revents |= sys::POLLIN;
    }
    Some(r)
}

/// As [`rings_first`], for `select`/`pselect`'s input set `r` of `n` descriptors.
///
/// # Safety
/// `r` is null or a set of at least `n` bits, as are `w` and `e`.
unsafe fn rings_first_in_sets(n: c_int, r: *mut c_void, zero: &mut dyn FnMut() -> c_int) -> Option<c_int> {
    if !active() || r.is_null() {
        return None;
    }
    let bit = |fd: c_int| (fd as usize / 64, 1u64 << (fd as usize % 64));
    let ready: Vec<c_int> = (0..n.max(0))
        .filter(|&fd| {
            let (word, b) = bit(fd);
            // SAFETY: a set the caller passed holds at least `n` bits.
            let set = unsafe { *r.cast::<u64>().add(word) };
            set & b != 0 && before_input_wait(fd)
        })
        .collect();
    if ready.is_empty() {
        return None;
    }
    let mut count = zero().max(0);
    for fd in ready {
        let (word, b) = bit(fd);
        // SAFETY: as above.
        let set = unsafe { &mut *r.cast::<u64>().add(word) };
        if *set & b == 0 {
            *set |= b;
            count += 1;
        }
    }
    Some(count)
}

/// `struct timespec`.
#[repr(C)]
struct TimeSpec {
    sec: i64,
    nsec: i64,
}

static ZERO: TimeSpec = TimeSpec { sec: 0, nsec: 0 };

/// `ppoll(2)`: as the kernel's, after [`rings_first`].
///
/// # Safety
/// As for `ppoll(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ppoll(fds: *mut PollFd, n: u64, timeout: *const c_void, mask: *const c_void) -> c_int {
    // SAFETY: the caller's arguments (with a zero timeout of ours for the look).
    if let Some(r) = unsafe { rings_first(fds, n, &mut |_| real::ppoll(fds, n, (&raw const ZERO).cast(), mask)) } {
        return r;
    }
    // SAFETY: the caller's arguments.
    unsafe { real::ppoll(fds, n, timeout, mask) }
}

/// `pselect(2)`: as the kernel's, after the rings are looked at ([`rings_first`]).
///
/// # Safety
/// As for `pselect(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pselect(
    n: c_int,
    r: *mut c_void,
    w: *mut c_void,
    e: *mut c_void,
    timeout: *const c_void,
    mask: *const c_void,
) -> c_int {
    // SAFETY: the caller's sets (with a zero timeout of ours for the look).
    let first = unsafe { rings_first_in_sets(n, r, &mut || real::pselect(n, r, w, e, (&raw const ZERO).cast(), mask)) };
    if let Some(count) = first {
        return count;
    }
    // SAFETY: the caller's arguments.
    unsafe { real::pselect(n, r, w, e, timeout, mask) }
}

/// `epoll_pwait2(2)`: the rings first, then the kernel's wait with the caller's timeout
/// (crate::looks).
///
/// # Safety
/// As for `epoll_pwait2(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epoll_pwait2(
    epfd: c_int,
    events: *mut c_void,
    max: c_int,
    timeout: *const c_void,
    mask: *const c_void,
) -> c_int {
    if !active() || spin::LIVE.load(Ordering::Relaxed) == 0 {
        // SAFETY: the caller's arguments.
        return unsafe { real::epoll_pwait2(epfd, events, max, timeout, mask) };
    }
    let zero: *const c_void = (&raw const ZERO).cast();
    // SAFETY: the caller's arguments, without waiting.
    let r = unsafe { looks::now(epfd, events, max, &mut |ev, m| real::epoll_pwait2(epfd, ev, m, zero, mask)) };
    // SAFETY: `timeout` is null or the caller's timespec.
    if r != 0
        || (!timeout.is_null()
            && unsafe { (*timeout.cast::<TimeSpec>()).sec == 0 && (*timeout.cast::<TimeSpec>()).nsec == 0 })
    {
        return r;
    }
    // SAFETY: the caller's arguments; `1` only says "may sleep" (the caller's own timeout
    // is the one the kernel gets).
    unsafe { looks::sleep(epfd, events, max, 1, &mut |ev, m, _| real::epoll_pwait2(epfd, ev, m, timeout, mask)) }
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
    let mut zero = TimeVal { sec: 0, usec: 0 };
    // SAFETY: the caller's sets, and a zero timeval of ours.
    if let Some(count) = unsafe { rings_first_in_sets(n, r, &mut || real::select(n, r, w, e, (&raw mut zero).cast())) }
    {
        return count;
    }
    let watching = pending::WATCHING.load(Ordering::Relaxed) > 0;
    if !active() || (!watching && (timeout_ms == 0 || spin::LIVE.load(Ordering::Relaxed) == 0)) {
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
        |mut count, fallen| {
            for f in fallen.iter().filter(|f| f.fd >= 0 && f.fd < n) {
                let (word, bit) = (f.fd as usize / 64, 1u64 << (f.fd as usize % 64));
                for p in [r, w, e].into_iter().filter(|p| !p.is_null()) {
                    // SAFETY: a set the caller passed holds at least `n` bits.
                    let set = unsafe { &mut *p.cast::<u64>().add(word) };
                    if *set & bit != 0 {
                        *set &= !bit;
                        count -= 1;
                    }
                }
            }
            count
        },
    )
}

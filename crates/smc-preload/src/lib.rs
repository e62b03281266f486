//! The preload library `sluice smc run` puts in front of a program (docs/architecture.md,
//! "The shared-memory fast path").
//!
//! It is inert unless `SLUICE_SMC` is set in the environment: every hook is then a
//! straight call to the function it replaces. Real functions come from
//! `dlsym(RTLD_NEXT, …)` (module `real`), resolved when the library is loaded, so hooks do
//! not call dlsym, and a hook never calls itself. No panic crosses into C: every hook that
//! does more than pass a call through runs inside `guard`.

use std::collections::HashMap;
use std::ffi::{CStr, c_char, c_int, c_void};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use sluice_smc::msg::Reason;
use sluice_smc::stats::Counter;

mod arena;
mod assoc;
mod cabi;
mod carry;
mod choose;
mod claim;
mod conn;
mod diag;
mod door;
mod foreign;
mod handshake;
mod info;
mod looks;
mod pending;
mod real;
mod registry;
mod spin;
mod stats;
mod stdio;
mod sys;

use cabi::IoVec;
use conn::Conn;

/// Set by the constructor when `SLUICE_SMC` asks for the fast path.
static ACTIVE: AtomicBool = AtomicBool::new(false);
static RMEM: AtomicUsize = AtomicUsize::new(sluice_smc::size::MIN);
static TMEM: AtomicUsize = AtomicUsize::new(sluice_smc::size::MIN);
static RMAX: AtomicUsize = AtomicUsize::new(0);
static TMAX: AtomicUsize = AtomicUsize::new(0);
static RUN_DIR: OnceLock<PathBuf> = OnceLock::new();
/// A handshake step to break on purpose (`SLUICE_SMC_FAULT`, for the tests only).
static FAULT: OnceLock<String> = OnceLock::new();

unsafe extern "C" {
    fn getenv(name: *const c_char) -> *const c_char;
    fn unsetenv(name: *const c_char) -> c_int;
    fn raise(sig: c_int) -> c_int;
    fn atexit(f: extern "C" fn()) -> c_int;
    static mut environ: *const *const c_char;
}

/// The process's environment as `execv` and `execvp` use it.
fn environment() -> *const *const c_char {
    // SAFETY: read once, by value, through a raw pointer (C changes `environ` with
    // setenv and putenv; no reference to it is made).
    unsafe { std::ptr::addr_of!(environ).read() }
}

/// What loaded the library in this program (`LD_PRELOAD`, `SLUICE_SMC`, as the
/// constructor found them): put back into the environment of a program it runs with a
/// connection, if that `exec` left them out (crate::carry).
static LOADED_BY: OnceLock<Vec<(&'static str, String)>> = OnceLock::new();

pub(crate) fn loaded_by() -> &'static [(&'static str, String)] {
    LOADED_BY.get().map(|v| v.as_slice()).unwrap_or(&[])
}

/// At a normal exit this process's door, listener and connection entries go with it. (A process a
/// signal kills leaves them; the next `sluice smc run` sweeps them, and clients pass by
/// entries of processes that are gone.) A forked child that exits removes only its own.
extern "C" fn remove_entries_at_exit() {
    if sys::sandboxed() {
        // Under a seccomp filter (sshd's pre-authentication child): `unlink` is not among
        // the calls such filters allow, and this process made no door or listener entry.
        return;
    }
    let me = sys::pid();
    let _ = std::fs::remove_file(registry::door_path(me));
    // (try_lock: a thread that held the lock when exit began must not hang the exit.)
    if let Ok(l) = listeners().try_lock() {
        let mine = format!(".{me}");
        for (_, path, ..) in l.values() {
            if path.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.ends_with(&mine)) {
                let _ = std::fs::remove_file(path);
            }
        }
    }
    // The table of its connections (`smc/conn/PID`).
    let _ = std::fs::remove_file(info::path_of(me));
}

fn env(name: &CStr) -> Option<String> {
    // SAFETY: getenv with a NUL-terminated name; read at load time, before the program
    // can change its environment from other threads.
    let v = unsafe { getenv(name.as_ptr()) };
    // SAFETY: a non-null getenv result is a NUL-terminated string.
    (!v.is_null()).then(|| unsafe { CStr::from_ptr(v) }.to_string_lossy().into_owned())
}

/// At exit: what the live connections counted since their last addition goes into the
/// statistics (a program may exit without closing them).
///
/// Then each connection it holds ends as at its last close (the kernel closes the
/// descriptors of a process that exits): unless another process holds it too, its peer
/// reads end of file after the last bytes, or a reset for bytes left unread, and its
/// client may use the slot again.
extern "C" fn flush_at_exit() {
    // glibc flushes its streams only after every atexit handler: streams of ours
    // (crate::stdio) are flushed now, while their connections still take bytes.
    stdio::flush_ours();
    // (Without waiting: a thread that held a lock when exit began must not hang the exit.)
    for c in held(false) {
        c.tally.flush();
        if !c.is_pending() {
            c.closed_at_exit();
        }
    }
}

/// The connections this process's descriptors name, each once however many descriptors
/// name it. `wait`: take each descriptor's lock; else pass over one another thread
/// holds.
fn held(wait: bool) -> Vec<Arc<Conn>> {
    by_connection(wait, |_| true).into_iter().map(|(c, _)| c).collect()
}

/// The connections named by this process's descriptors that `keep` keeps, each with
/// those descriptors (in order). `wait` as for [`held`].
pub(crate) fn by_connection(wait: bool, keep: impl Fn(c_int) -> bool) -> Vec<(Arc<Conn>, Vec<c_int>)> {
    let mut out: Vec<(Arc<Conn>, Vec<c_int>)> = Vec::new();
    for (fd, slot) in SLOTS.iter().enumerate() {
        let fd = fd as c_int;
        if !marked(fd) || !keep(fd) {
            continue;
        }
        let guard = if wait { Some(slot.lock().unwrap_or_else(|p| p.into_inner())) } else { slot.try_lock().ok() };
        let Some(c) = guard.as_ref().and_then(|g| g.as_ref()) else { continue };
        match out.iter_mut().find(|(e, _)| Arc::ptr_eq(e, c)) {
            Some((_, fds)) => fds.push(fd),
            None => out.push((c.clone(), vec![fd])),
        }
    }
    out
}

/// In a child just forked: it names itself a holder of each connection it inherited. (A
/// descriptor's lock held by a thread of the parent at the fork stays held here: its
/// connection stays counted as a fork under way, never ended under this child.)
extern "C" fn forked() {
    if spin::LIVE.load(Ordering::Relaxed) > 0 {
        held(false).iter().for_each(|c| c.forked_child());
    }
}

/// Before a fork: the child holds every connection this process holds (counted once per
/// connection, however many descriptors name it).
pub(crate) fn forking() {
    if spin::LIVE.load(Ordering::Relaxed) > 0 {
        held(true).iter().for_each(|c| c.forking());
    }
}

/// Runs when the library is loaded, before `main`.
extern "C" fn init() {
    real::resolve();
    let dir = env(c"SLUICE_RUN_DIR").filter(|d| !d.is_empty()).unwrap_or_else(|| "/run/sluice".into());
    let _ = RUN_DIR.set(PathBuf::from(dir));
    // The pid, cached now: a `vfork`ed child must never be the first to ask (sys::vforked).
    sys::pid();
    let _ = FAULT.set(env(c"SLUICE_SMC_FAULT").unwrap_or_default());
    let Some(s) = env(c"SLUICE_SMC") else { return };
    let mut rules = Vec::new();
    let mut short = sluice_smc::auto::DEFAULT_SHORT_BYTES;
    for kv in s.split(',') {
        match kv.split_once('=') {
            Some(("r", v)) => RMEM.store(v.parse().unwrap_or(sluice_smc::size::MIN), Ordering::Relaxed),
            Some(("t", v)) => TMEM.store(v.parse().unwrap_or(sluice_smc::size::MIN), Ordering::Relaxed),
            Some(("spin", v)) => spin::set_limit_us(v.parse().unwrap_or(spin::DEFAULT_US)),
            Some(("looks", "0")) => looks::turn_off(),
            Some(("rmax", v)) => RMAX.store(v.parse().unwrap_or(0), Ordering::Relaxed),
            Some(("tmax", v)) => TMAX.store(v.parse().unwrap_or(0), Ordering::Relaxed),
            Some(("uring", "1")) => IO_URING.store(true, Ordering::Relaxed),
            Some(("tcp", v)) => rules.push(v),
            Some(("short", v)) => short = v.parse().unwrap_or(short),
            _ => {}
        }
    }
    choose::set_up(&rules, short);
    let mut by = vec![("SLUICE_SMC", s.clone())];
    if let Some(p) = env(c"LD_PRELOAD") {
        by.push(("LD_PRELOAD", p));
    }
    if let Some(d) = env(c"SLUICE_RUN_DIR") {
        by.push(("SLUICE_RUN_DIR", d));
    }
    let _ = LOADED_BY.set(by);
    ACTIVE.store(true, Ordering::Relaxed);
    sys::pid_after_fork();
    sys::before_fork(pending::before_fork);
    // (After `pid_after_fork`'s handler: children's handlers run in the order made.)
    sys::in_child_after_fork(forked);
    // SAFETY: atexit with functions that live as long as the process (run in reverse:
    // pending bytes are delivered first, then the counters flushed).
    unsafe {
        atexit(flush_at_exit);
        atexit(pending::at_exit);
    }
    // Connections the program that ran this one handed over with its descriptors.
    if let Some(v) = env(c"SLUICE_SMC_CARRY") {
        // SAFETY: a NUL-terminated name; the constructor runs before the program's threads.
        unsafe { unsetenv(c"SLUICE_SMC_CARRY".as_ptr()) };
        guard(
            || {
                carry::adopt(&v);
                stdio::take_over_standard_streams();
            },
            || (),
        );
    }
}

#[used]
#[unsafe(link_section = ".init_array")]
static INIT: extern "C" fn() = init;

/// True when the program runs under `sluice smc run`.
fn active() -> bool {
    ACTIVE.load(Ordering::Relaxed)
}

/// True when the tests asked this process to break the handshake at `step`.
pub(crate) fn fault(step: &str) -> bool {
    FAULT.get().is_some_and(|f| f == step)
}

/// Buffer sizes: (receive, send) to start with…
pub(crate) fn settings() -> (usize, usize) {
    (RMEM.load(Ordering::Relaxed), TMEM.load(Ordering::Relaxed))
}

/// …and the most they grow to (never less than the start: a fixed size does not grow).
pub(crate) fn maxima() -> (usize, usize) {
    let (r, t) = settings();
    let clamp = |m: usize, start: usize| m.clamp(start, sluice_smc::size::MAX).next_power_of_two();
    (clamp(RMAX.load(Ordering::Relaxed), r), clamp(TMAX.load(Ordering::Relaxed), t))
}

/// The runtime directory (`SLUICE_RUN_DIR`, else /run/sluice).
pub(crate) fn run_dir() -> PathBuf {
    RUN_DIR.get().cloned().unwrap_or_else(|| PathBuf::from("/run/sluice"))
}

/// The version of the library: the sluice version it was built with, NUL-terminated.
#[unsafe(no_mangle)]
pub extern "C" fn sluice_smc_version() -> *const c_char {
    static V: &CStr = match CStr::from_bytes_with_nul(concat!(env!("CARGO_PKG_VERSION"), "\0").as_bytes()) {
        Ok(v) => v,
        Err(_) => c"?",
    };
    V.as_ptr()
}

// ---- which descriptors are ours ----

pub(crate) const MAX_FD: usize = 65536;
static MARK: [AtomicBool; MAX_FD] = [const { AtomicBool::new(false) }; MAX_FD];

/// The connection behind each moved descriptor: a lock per descriptor, so calls on
/// different connections never meet on one lock (or one cache line of one).
static SLOTS: [Mutex<Option<Arc<Conn>>>; MAX_FD] = [const { Mutex::new(None) }; MAX_FD];

/// A listener: its address, its registry entry, the pid of the process that registered it
/// (whose side door takes the proposals; another process after a fork), and that
/// process's claim channel (crate::claim).
type Listener = (SocketAddr, PathBuf, u32, c_int);

/// This process's listeners, by descriptor.
fn listeners() -> &'static Mutex<HashMap<c_int, Listener>> {
    static L: OnceLock<Mutex<HashMap<c_int, Listener>>> = OnceLock::new();
    L.get_or_init(|| Mutex::new(HashMap::new()))
}

fn marked(fd: c_int) -> bool {
    fd >= 0 && (fd as usize) < MAX_FD && MARK[fd as usize].load(Ordering::Acquire)
}

fn conn_of(fd: c_int) -> Option<Arc<Conn>> {
    if !marked(fd) {
        return None;
    }
    SLOTS[fd as usize].lock().unwrap_or_else(|p| p.into_inner()).clone()
}

fn set_conn(fd: c_int, c: Arc<Conn>) {
    let old = SLOTS[fd as usize].lock().unwrap_or_else(|p| p.into_inner()).replace(c);
    if let Some(old) = old {
        release(old, -1);
    }
    MARK[fd as usize].store(true, Ordering::Release);
}

/// Forgets descriptor `fd`, which the program is closing (`open`: it still names the
/// connection's descriptor) or which names something else already; the connection ends
/// when no descriptor is left.
fn forget(fd: c_int, open: bool) {
    if !marked(fd) {
        return;
    }
    MARK[fd as usize].store(false, Ordering::Release);
    let old = SLOTS[fd as usize].lock().unwrap_or_else(|p| p.into_inner()).take();
    if let Some(c) = old {
        release(c, if open { fd } else { -1 });
    }
}

/// Runs `f` while descriptor `fd` names connection `c`, holding the descriptor's lock:
/// no `close`, no `dup` onto it and no other thread's move back to TCP comes between
/// (crate::pending). `f` answers a value and whether the descriptor is now TCP's again,
/// to be forgotten without ending its connection. `None`, without running `f`, when
/// `fd` names something else by now — another thread moved it back already, or the
/// program closed it (and the number may be a new socket's) — or, without `wait`, when
/// another thread holds the lock.
pub(crate) fn while_named<T>(fd: c_int, c: &Arc<Conn>, wait: bool, f: impl FnOnce() -> (T, bool)) -> Option<T> {
    if fd < 0 || fd as usize >= MAX_FD {
        return None;
    }
    let lock = &SLOTS[fd as usize];
    let mut slot = if wait {
        lock.lock().unwrap_or_else(|p| p.into_inner())
    } else {
        match lock.try_lock() {
            Ok(g) => g,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return None,
        }
    };
    if !slot.as_ref().is_some_and(|now| Arc::ptr_eq(now, c)) {
        return None;
    }
    let (r, back_on_tcp) = f();
    if back_on_tcp {
        MARK[fd as usize].store(false, Ordering::Release);
        // (Not the last reference: the caller holds `c`.)
        drop(slot.take());
    }
    Some(r)
}

fn release(c: Arc<Conn>, fd: c_int) {
    if Arc::strong_count(&c) == 1 {
        if c.is_pending() && c.owner == sys::pid() {
            pending::closing(c, fd);
        } else {
            c.closed();
        }
    }
}

/// Runs `f`, or `fallback` if it panics (a panic must not unwind into C).
fn guard<T>(f: impl FnOnce() -> T, fallback: impl FnOnce() -> T) -> T {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|_| fallback())
}

fn ret(r: conn::Io, nosignal: bool) -> isize {
    match r {
        Ok(n) => n as isize,
        Err(e) => {
            if e == sys::EPIPE && !nosignal {
                // SAFETY: as a TCP socket would, raise SIGPIPE for a write to a closed peer.
                unsafe { raise(13) };
            }
            cabi::set_errno(e);
            -1
        }
    }
}

// ---- turning a TCP descriptor into a shared-memory one ----

/// Makes descriptor `fd` (a TCP socket) the connection's: the TCP socket moves among the
/// library's descriptors, `app_end` (our end of the pair) takes its number and its flags.
fn convert(
    fd: c_int,
    mut conn: Conn,
    app_end: c_int,
    local: Option<SocketAddr>,
    peer: Option<SocketAddr>,
) -> Arc<Conn> {
    // SAFETY: fcntl and dup3 on descriptors this call owns or the caller passed.
    unsafe {
        let fl = real::fcntl(fd, sys::F_GETFL, 0);
        let fdfl = real::fcntl(fd, sys::F_GETFD, 0);
        conn.tcp_fd = sys::dup_high(fd);
        let cloexec = if fdfl >= 0 && fdfl & 1 != 0 { sys::O_CLOEXEC } else { 0 };
        real::dup3(app_end, fd, cloexec);
        sys::close(app_end);
        conn.app_ino = sys::file_id(fd).map(|(_, ino)| ino);
        if fl >= 0 && fl & sys::O_NONBLOCK != 0 {
            real::fcntl(fd, sys::F_SETFL, (fl & sys::O_NONBLOCK) as usize);
            conn.nonblock.store(true, Ordering::Relaxed);
        }
    }
    install(conn, &[fd], local, peer)
}

/// The connection is the application's from now on, named by descriptors `fds`: counted
/// live, its TCP socket's timeouts taken over, listed for `sluice smc info`.
pub(crate) fn install(mut conn: Conn, fds: &[c_int], local: Option<SocketAddr>, peer: Option<SocketAddr>) -> Arc<Conn> {
    conn.peer = peer;
    conn.settle_in();
    // Timeouts set before the connection moved to shared memory are the TCP socket's.
    conn.rcvtimeo.store(sys::timeout_ms(conn.tcp_fd, sys::SO_RCVTIMEO), Ordering::Relaxed);
    conn.sndtimeo.store(sys::timeout_ms(conn.tcp_fd, sys::SO_SNDTIMEO), Ordering::Relaxed);
    conn.info = info::add(conn.role == conn::Role::Server, local, peer, conn.sizes.0, conn.sizes.1);
    let c = Arc::new(conn);
    for &fd in fds {
        set_conn(fd, c.clone());
    }
    c
}

pub(crate) fn is_tcp(fd: c_int) -> bool {
    sys::is_stream(fd, &[sys::AF_INET, sys::AF_INET6])
}

// ---- connect, listen, accept ----

/// `connect(2)`: a TCP connection to a registered sluice listener is announced to it
/// before the SYN, proven right after, and pending from then on (crate::pending):
/// `connect` waits for nothing but what TCP's waits for.
///
/// # Safety
/// As for `connect(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn connect(fd: c_int, addr: *const c_void, len: u32) -> c_int {
    if !active() || fd < 0 || fd as usize >= MAX_FD {
        // SAFETY: the caller's arguments, unchanged.
        return unsafe { real::connect(fd, addr, len) };
    }
    if let Some(c) = conn_of(fd) {
        // A moved socket: TCP's own answers (EISCONN, EALREADY while connecting).
        // SAFETY: the caller's address, on the connection's TCP socket.
        return unsafe { real::connect(c.tcp_fd, addr, len) };
    }
    // SAFETY: as above, in both branches.
    guard(|| unsafe { connect_smc(fd, addr, len) }, || unsafe { real::connect(fd, addr, len) })
}

unsafe fn connect_smc(fd: c_int, addr: *const c_void, len: u32) -> c_int {
    // SAFETY: the caller's address of `len` bytes.
    let dst = unsafe { sys::sockaddr_to(addr, len) };
    // A socket whose connection has begun is asked how it went: the first `connect` chose
    // its path, and it stays there (a choice made again could move a socket the program
    // has already registered with epoll).
    let Some(dst) = dst.filter(|_| sys::tcp_unstarted(fd)) else {
        // SAFETY: the caller's arguments.
        return unsafe { real::connect(fd, addr, len) };
    };
    stats::count(Counter::ConnsClient);
    if let Some(reason) = choose::client(dst) {
        stats::fallback(reason, false);
        // SAFETY: the caller's arguments.
        return unsafe { real::connect(fd, addr, len) };
    }
    let cands = registry::listeners_for(dst);
    let early = if cands.is_empty() {
        Some(Reason::NoListener)
    } else if zerocopy::enabled(fd) {
        // Decided before the first byte: its completions would need POLLERR.
        Some(Reason::ZeroCopy)
    } else if uses_io_uring() {
        Some(Reason::IoUring)
    } else {
        None
    };
    if let Some(reason) = early {
        stats::fallback(reason, false);
        // SAFETY: the caller's arguments.
        return unsafe { real::connect(fd, addr, len) };
    }
    let mut last = Reason::NoListener;
    let mut proposal = None;
    for entry in &cands {
        match handshake::announce(fd, dst, entry) {
            Ok(p) => {
                proposal = Some(p);
                break;
            }
            Err(reason) => last = reason,
        }
    }
    let Some(p) = proposal else {
        stats::fallback(last, false);
        // SAFETY: the caller's arguments.
        return unsafe { real::connect(fd, addr, len) };
    };
    // The SYN, without waiting: the proof must follow it at once.
    // SAFETY: fcntl and connect on the caller's socket, with its address.
    let (fl, r, e) = unsafe {
        let fl = real::fcntl(fd, sys::F_GETFL, 0);
        if fl >= 0 && fl & sys::O_NONBLOCK == 0 {
            real::fcntl(fd, sys::F_SETFL, (fl | sys::O_NONBLOCK) as usize);
        }
        let r = real::connect(fd, addr, len);
        (fl, r, cabi::errno())
    };
    let started = r == 0 || e == sys::EINPROGRESS;
    let proven = started && handshake::prove(&p, fd).is_ok();
    let blocking = fl >= 0 && fl & sys::O_NONBLOCK == 0;
    if blocking {
        // SAFETY: the caller's socket, its flags as they were.
        unsafe { real::fcntl(fd, sys::F_SETFL, fl as usize) };
    }
    if !started {
        // No connection: its announcement is let go of by the server in time.
        p.abandon();
        cabi::set_errno(e);
        return -1;
    }
    if !proven {
        p.abandon();
        stats::fallback(Reason::DoorUnreachable, false);
        return if blocking { finish_connect(fd) } else { in_progress(r) };
    }
    if blocking && finish_connect(fd) < 0 {
        let e = cabi::errno();
        p.abandon();
        cabi::set_errno(e);
        return -1;
    }
    match handshake::client_conn(p) {
        Ok((conn, app_end)) => {
            let c = convert(fd, conn, app_end, sys::sock_addr(fd, false), Some(dst));
            pending::watch(fd, &c);
        }
        Err(reason) => stats::fallback(reason, false),
    }
    if blocking { 0 } else { in_progress(r) }
}

/// What a non-blocking `connect` returns: 0 if it completed at once, else `EINPROGRESS`.
fn in_progress(r: c_int) -> c_int {
    if r == 0 {
        return 0;
    }
    cabi::set_errno(sys::EINPROGRESS);
    -1
}

/// A blocking `connect` whose SYN went out non-blocking: waits as the kernel's would
/// (bounded by `SO_SNDTIMEO` when set, then `EINPROGRESS`) and answers what it answers.
fn finish_connect(fd: c_int) -> c_int {
    let timeout = sys::timeout_ms(fd, sys::SO_SNDTIMEO);
    match sys::wait(fd, sys::POLLOUT, timeout) {
        Ok(true) => match sys::sockopt_int(fd, sys::SOL_SOCKET, sys::SO_ERROR) {
            Some(0) => 0,
            Some(e) => {
                cabi::set_errno(e);
                -1
            }
            None => -1,
        },
        Ok(false) => {
            cabi::set_errno(sys::EINPROGRESS);
            -1
        }
        Err(e) => {
            cabi::set_errno(e.raw_os_error().unwrap_or(sys::EINVAL));
            -1
        }
    }
}

/// True for a program that uses io_uring (its calls bypass the library: its connections
/// stay on TCP), as far as the library can tell: the launcher found liburing among the
/// libraries the program's ELF file needs. One that makes the system calls itself is not
/// seen.
fn uses_io_uring() -> bool {
    IO_URING.load(Ordering::Relaxed)
}

static IO_URING: AtomicBool = AtomicBool::new(false);

/// `listen(2)`: a TCP listener is registered so clients under the launcher find it.
///
/// # Safety
/// As for `listen(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn listen(fd: c_int, backlog: c_int) -> c_int {
    // SAFETY: the caller's arguments.
    let r = unsafe { real::listen(fd, backlog) };
    if r == 0 && active() {
        guard(|| register(fd), || ());
    }
    r
}

fn register(fd: c_int) {
    if registry::policy().is_none()
        || !is_tcp(fd)
        || listeners().lock().unwrap_or_else(|p| p.into_inner()).contains_key(&fd)
    {
        return;
    }
    let Some(addr) = sys::sock_addr(fd, false) else { return };
    if choose::listener_kept(addr) {
        // A rule keeps it on TCP: unregistered, no client meets it.
        return;
    }
    door::start();
    stats::prepare();
    let channel = claim::channel();
    remove_at_exit();
    let Some(path) = registry::register_listener(addr) else { return };
    PORTS.lock().unwrap_or_else(|p| p.into_inner()).push(addr.port());
    listeners().lock().unwrap_or_else(|p| p.into_inner()).insert(fd, (addr, path, sys::pid(), channel));
}

/// Makes this process remove its door, listener entries and connection table at a normal
/// exit (once; a forked child removes only its own).
pub(crate) fn remove_at_exit() {
    static AT_EXIT: std::sync::Once = std::sync::Once::new();
    // SAFETY: atexit with a function that lives as long as the process.
    AT_EXIT.call_once(|| unsafe {
        atexit(remove_entries_at_exit);
    });
}

/// Ports this process listens on (a claim names one of them: crate::claim).
static PORTS: Mutex<Vec<u16>> = Mutex::new(Vec::new());

/// Whether this process listens on `port`.
pub(crate) fn listening_port(port: u16) -> bool {
    PORTS.lock().unwrap_or_else(|p| p.into_inner()).contains(&port)
}

/// Whether a listener of this process on `port` has `SO_ZEROCOPY` set (its connections
/// stay on TCP: crate::zerocopy).
pub(crate) fn listener_zerocopy(port: u16) -> bool {
    let fds: Vec<c_int> = listeners()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .filter(|(_, l)| l.0.port() == port)
        .map(|(fd, _)| *fd)
        .collect();
    fds.into_iter().any(zerocopy::enabled)
}

/// Listener `fd` is being closed. Its entry goes only when the process that registered it
/// closes it: a forked child closing its copy (postgres's children close the
/// postmaster's listeners first thing) leaves the listener its parent still holds
/// registered.
fn unregister(fd: c_int) {
    let Some((addr, path, owner, _)) = listeners().lock().unwrap_or_else(|p| p.into_inner()).remove(&fd) else {
        return;
    };
    if owner == sys::pid() {
        let _ = std::fs::remove_file(path);
    }
    let mut ports = PORTS.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(i) = ports.iter().position(|p| *p == addr.port()) {
        ports.remove(i);
    }
}

/// `accept` returned `fd` on `listener`: its proposal, if a client made one, is found at
/// the door (or, in a forked child, claimed from the parent's) and committed.
fn accepted(listener: c_int, fd: c_int) {
    if fd < 0 || fd as usize >= MAX_FD {
        return;
    }
    let Some((owner, channel)) =
        listeners().lock().unwrap_or_else(|p| p.into_inner()).get(&listener).map(|l| (l.2, l.3))
    else {
        return;
    };
    if owner == sys::pid() && door::nothing_announced() {
        // The common case of a client that stays on TCP, without asking the addresses.
        stats::count(Counter::ConnsServer);
        return stats::fallback(Reason::NoProposal, true);
    }
    let (Some(local), Some(peer)) = (sys::sock_addr(fd, false), sys::sock_addr(fd, true)) else { return };
    stats::count(Counter::ConnsServer);
    // A listener inherited across fork (a pre-forking server: the parent listens, a child
    // accepts): its clients announced to the parent's side door; the child claims there.
    let got = if owner == sys::pid() { door::take(local, peer) } else { claim::claim(channel, owner, fd) };
    let t = match got {
        Ok(t) => t,
        Err(why) => return stats::fallback(why, true),
    };
    let refuse = if listener_zerocopy(local.port()) {
        // Decided before the first byte: its completions would need POLLERR.
        Some(Reason::ZeroCopy)
    } else if uses_io_uring() {
        Some(Reason::IoUring)
    } else {
        None
    };
    if let Some(why) = refuse {
        t.decline(why);
        return stats::fallback(why, true);
    }
    match handshake::commit(t) {
        Ok((conn, bell)) => {
            stats::smc(true, conn.sizes.0, conn.sizes.1);
            convert(fd, conn, bell, Some(local), Some(peer));
        }
        Err(why) => stats::fallback(why, true),
    }
}

/// `accept(2)`.
///
/// # Safety
/// As for `accept(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn accept(fd: c_int, addr: *mut c_void, len: *mut u32) -> c_int {
    // SAFETY: the caller's arguments.
    let r = unsafe { real::accept(fd, addr, len) };
    if r >= 0 && active() {
        guard(|| accepted(fd, r), || ());
    }
    r
}

/// `accept4(2)`.
///
/// # Safety
/// As for `accept4(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn accept4(fd: c_int, addr: *mut c_void, len: *mut u32, flags: c_int) -> c_int {
    // SAFETY: the caller's arguments.
    let r = unsafe { real::accept4(fd, addr, len, flags) };
    if r >= 0 && active() {
        guard(|| accepted(fd, r), || ());
    }
    r
}

// ---- running another program ----

/// Runs `exec` with the connections that go along (crate::carry): `run` is the real call
/// given the environment to use; if it fails, what was made for the new program goes.
fn exec_with(envp: *const *const c_char, run: impl FnOnce(*const *const c_char) -> c_int) -> c_int {
    let prepared = if active() { guard(|| carry::prepare(envp), || Ok(None)) } else { Ok(None) };
    let p = match prepared {
        Ok(Some(p)) => p,
        Ok(None) => return run(envp),
        Err(e) => {
            // A connection that must go along cannot: the new program would find only
            // the doorbell socket behind its descriptor. The exec fails instead.
            cabi::set_errno(e);
            return -1;
        }
    };
    let r = run(p.envp());
    let e = cabi::errno();
    p.failed();
    cabi::set_errno(e);
    r
}

/// `execve(2)`: a moved connection whose descriptor survives goes along.
///
/// # Safety
/// As for `execve(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn execve(path: *const c_char, argv: *const *const c_char, envp: *const *const c_char) -> c_int {
    // SAFETY: the caller's arguments, with an environment as valid as theirs.
    exec_with(envp, |env| unsafe { real::execve(path, argv, env) })
}

/// `execv(3)`.
///
/// # Safety
/// As for `execv(3)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn execv(path: *const c_char, argv: *const *const c_char) -> c_int {
    // SAFETY: the caller's arguments and the process's environment (execv is execve with
    // it), or an environment as valid as theirs.
    exec_with(environment(), |env| unsafe { real::execve(path, argv, env) })
}

/// `execvp(3)`.
///
/// # Safety
/// As for `execvp(3)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn execvp(file: *const c_char, argv: *const *const c_char) -> c_int {
    // SAFETY: as for execv (execvp is execvpe with the process's environment).
    exec_with(environment(), |env| unsafe { real::execvpe(file, argv, env) })
}

/// `execvpe(3)`.
///
/// # Safety
/// As for `execvpe(3)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn execvpe(file: *const c_char, argv: *const *const c_char, envp: *const *const c_char) -> c_int {
    // SAFETY: the caller's arguments, with an environment as valid as theirs.
    exec_with(envp, |env| unsafe { real::execvpe(file, argv, env) })
}

/// `fexecve(3)`.
///
/// # Safety
/// As for `fexecve(3)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fexecve(fd: c_int, argv: *const *const c_char, envp: *const *const c_char) -> c_int {
    // SAFETY: the caller's arguments, with an environment as valid as theirs.
    exec_with(envp, |env| unsafe { real::fexecve(fd, argv, env) })
}

/// `fdopen(3)`: a stream on a moved connection reads and writes through the hooks
/// (crate::stdio).
///
/// # Safety
/// As for `fdopen(3)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fdopen(fd: c_int, mode: *const c_char) -> *mut c_void {
    if active() && !mode.is_null() {
        // SAFETY: the caller's NUL-terminated mode.
        let m = unsafe { CStr::from_ptr(mode) };
        if let Some(f) = guard(|| stdio::fdopen(fd, m), || None) {
            return f;
        }
    }
    // SAFETY: the caller's arguments.
    unsafe { real::fdopen(fd, mode) }
}

// ---- descriptors ----

/// `close(2)`.
///
/// # Safety
/// As for `close(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    // (The pid is asked only when there is something to change: most closes are of
    // descriptors the library knows nothing of.)
    if active() && concerns(fd) && !sys::vforked() {
        guard(|| closing(fd), || ());
    }
    // SAFETY: the caller's descriptor.
    unsafe { real::close(fd) }
}

/// The program is closing descriptor `fd`: what the library knew of it goes (a
/// connection it named ends with its last descriptor; a listener is unregistered).
fn closing(fd: c_int) {
    sys::disown(fd);
    looks::closed(fd);
    forget(fd, true);
    unregister(fd);
}

/// Whether closing `fd` changes anything the library knows: its own descriptor, a
/// connection's, a listener, an epoll instance it watches for.
fn concerns(fd: c_int) -> bool {
    sys::is_own(fd)
        || marked(fd)
        || looks::concerns(fd)
        || listeners().lock().unwrap_or_else(|p| p.into_inner()).contains_key(&fd)
}

/// True when the library runs and this process may change its tables: not in a `vfork`ed
/// child, which runs in its parent's memory until it runs `exec` (sys::vforked).
fn tables_mine() -> bool {
    active() && !sys::vforked()
}

/// `close_range(2)`: the program's descriptors in the range are closed as `close` closes
/// them (a connection among them ends with its last descriptor, a listener is
/// unregistered); the library's own — a moved connection's TCP socket and doorbell, its
/// side door, its arenas — stay open: the program never opened them, and a daemon that
/// closes everything above its own descriptors, or a child that does before `exec`
/// (Python's `subprocess`), would otherwise take them from under its connections.
///
/// # Safety
/// As for `close_range(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn close_range(first: u32, last: u32, flags: c_int) -> c_int {
    let known = sys::CLOSE_RANGE_UNSHARE | sys::CLOSE_RANGE_CLOEXEC;
    if !active() || first > last || flags & !known != 0 {
        // (Flags this library does not know: the kernel's answer, EINVAL or its own.)
        // SAFETY: the caller's arguments.
        return unsafe { real::close_range(first, last, flags) };
    }
    if flags & sys::CLOSE_RANGE_CLOEXEC == 0 && tables_mine() {
        guard(
            || {
                let within = |fd: c_int| fd >= 0 && (first..=last).contains(&(fd as u32));
                let mut open = sys::open_fds();
                if open.is_empty() {
                    // No /proc (a chroot): what the library knows of, in the range.
                    let listening: Vec<c_int> =
                        listeners().lock().unwrap_or_else(|p| p.into_inner()).keys().copied().collect();
                    let top = last.min(MAX_FD as u32 - 1);
                    open = (first..=top)
                        .map(|fd| fd as c_int)
                        .filter(|&fd| marked(fd) || listening.contains(&fd))
                        .collect();
                }
                open.into_iter().filter(|&fd| within(fd) && !sys::is_own(fd)).for_each(closing);
            },
            || (),
        );
    }
    sys::close_range_but_ours(first, last, flags)
}

/// `prctl(2)` (declared with its four optional arguments, which travel in registers as
/// for the variadic C function): a program that puts itself under a seccomp filter
/// (`PR_SET_SECCOMP`) makes the library move doorbell bytes with calls such filters allow
/// from then on (sys::sandboxed).
///
/// # Safety
/// As for `prctl(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn prctl(option: c_int, a2: u64, a3: u64, a4: u64, a5: u64) -> c_int {
    const PR_SET_SECCOMP: c_int = 22;
    if option == PR_SET_SECCOMP && active() {
        sys::set_sandboxed();
    }
    // SAFETY: the caller's arguments.
    unsafe { real::prctl(option, a2, a3, a4, a5) }
}

/// `closefrom(3)`: as `close_range(first, ~0U, 0)`.
///
/// # Safety
/// As for `closefrom(3)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn closefrom(first: c_int) {
    // SAFETY: the caller's argument.
    unsafe { close_range(first.max(0) as u32, u32::MAX, 0) };
}

/// Before a call that copies or ends a descriptor's connection as a whole (`dup`,
/// `shutdown`): a pending connection's outcome is waited for, so the copy is of what the
/// connection is (a descriptor back on TCP is plain TCP's, its copies too).
pub(crate) fn settle(fd: c_int) {
    if active()
        && let Some(c) = conn_of(fd)
        && c.is_pending()
        && !sys::vforked()
    {
        guard(
            || {
                let _ = pending::settle(fd, &c);
            },
            || (),
        );
    }
}

fn dup_conn(old: c_int, new: c_int) {
    looks::duplicated(old);
    if new >= 0
        && (new as usize) < MAX_FD
        && let Some(c) = conn_of(old)
    {
        set_conn(new, c);
    }
}

/// `dup(2)`.
///
/// # Safety
/// As for `dup(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dup(fd: c_int) -> c_int {
    settle(fd);
    // SAFETY: the caller's descriptor.
    let r = unsafe { real::dup(fd) };
    if tables_mine() {
        guard(|| dup_conn(fd, r), || ());
    }
    r
}

/// `dup2(2)`.
///
/// # Safety
/// As for `dup2(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dup2(fd: c_int, to: c_int) -> c_int {
    settle(fd);
    // SAFETY: the caller's descriptors.
    let r = unsafe { real::dup2(fd, to) };
    duplicated_onto(fd, to, r);
    r
}

/// After `dup2`/`dup3` of `fd` onto `to` returned `r`: `to` now names `fd`'s file, and
/// what it named before is closed. (`dup2(fd, fd)` changes nothing.)
fn duplicated_onto(fd: c_int, to: c_int, r: c_int) {
    if fd != to && r >= 0 && tables_mine() {
        guard(
            || {
                sys::disown(to);
                looks::closed(to);
                forget(to, false);
                dup_conn(fd, r);
            },
            || (),
        );
    }
}

/// `dup3(2)`.
///
/// # Safety
/// As for `dup3(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dup3(fd: c_int, to: c_int, flags: c_int) -> c_int {
    settle(fd);
    // SAFETY: the caller's descriptors.
    let r = unsafe { real::dup3(fd, to, flags) };
    duplicated_onto(fd, to, r);
    r
}

/// `fcntl(2)` (declared with its one optional argument: integer and pointer arguments
/// travel in the same register as for the variadic C function).
///
/// # Safety
/// As for `fcntl(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fcntl(fd: c_int, cmd: c_int, arg: usize) -> c_int {
    if cmd == sys::F_SETFL {
        // SAFETY: the caller's arguments.
        let call = || unsafe { real::fcntl(fd, cmd, arg) };
        return set_mode(fd, call, |r| (r >= 0).then_some(arg as c_int & sys::O_NONBLOCK != 0));
    }
    if cmd == 0 || cmd == sys::F_DUPFD_CLOEXEC {
        settle(fd);
    }
    // SAFETY: the caller's arguments.
    let r = unsafe { real::fcntl(fd, cmd, arg) };
    if r >= 0 && (cmd == 0 || cmd == sys::F_DUPFD_CLOEXEC) && tables_mine() {
        guard(|| dup_conn(fd, r), || ());
    }
    r
}

/// A call that sets descriptor `fd`'s blocking mode (`F_SETFL`, `FIONBIO`): for a moved
/// descriptor the mode it set (`mode` of its result; `None` when it failed) is recorded
/// on the connection ([`recorded`]).
fn set_mode(fd: c_int, call: impl FnMut() -> c_int, mode: impl FnOnce(c_int) -> Option<bool>) -> c_int {
    recorded(fd, call, |c, r| {
        if let Some(on) = mode(r) {
            c.nonblock.store(on, Ordering::Relaxed);
        }
    })
}

/// The real `call` on descriptor `fd` and, for a moved descriptor, `record` of its
/// result on the connection — both under the descriptor's lock, so that a move back to
/// TCP on another thread (crate::pending), which carries what is recorded over to the
/// TCP socket, comes before both or after both. (Between them it had left the TCP socket
/// non-blocking under a program that had just made it blocking — `EAGAIN` from a
/// blocking read — or dropped an epoll registration.)
fn recorded(fd: c_int, mut call: impl FnMut() -> c_int, record: impl FnOnce(&Conn, c_int)) -> c_int {
    if let Some(c) = active().then(|| conn_of(fd)).flatten() {
        let r = guard(
            || {
                while_named(fd, &c, true, || {
                    let r = call();
                    record(&c, r);
                    (r, false)
                })
            },
            || None,
        );
        if let Some(r) = r {
            return r;
        }
    }
    // Not (or no longer) a moved descriptor: the kernel's alone.
    call()
}

/// `fcntl64`, glibc's other name for `fcntl`.
///
/// # Safety
/// As for `fcntl(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fcntl64(fd: c_int, cmd: c_int, arg: usize) -> c_int {
    // SAFETY: as for fcntl.
    unsafe { fcntl(fd, cmd, arg) }
}

/// `shutdown(2)`.
///
/// # Safety
/// As for `shutdown(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shutdown(fd: c_int, how: c_int) -> c_int {
    settle(fd);
    if let Some(c) = active().then(|| conn_of(fd)).flatten() {
        c.shutdown(how);
        return 0;
    }
    // SAFETY: the caller's arguments.
    unsafe { real::shutdown(fd, how) }
}

/// `epoll_ctl(2)`: a pending connection's registrations are remembered, to be made again
/// on its TCP socket if it stays there (crate::pending), and a connection's registration
/// for input lets the event loop look at its ring itself (crate::looks).
///
/// # Safety
/// As for `epoll_ctl(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epoll_ctl(epfd: c_int, op: c_int, fd: c_int, event: *mut c_void) -> c_int {
    // SAFETY: the caller's arguments.
    let call = || unsafe { real::epoll_ctl(epfd, op, fd, event) };
    if !(active() && marked(fd)) {
        return call();
    }
    let ev = (!event.is_null()).then(|| {
        let mut ev = [0u8; 16];
        // SAFETY: the caller's struct epoll_event, EPOLL_EVENT.0 bytes.
        unsafe { std::ptr::copy_nonoverlapping(event.cast::<u8>(), ev.as_mut_ptr(), sys::EPOLL_EVENT.0) };
        ev
    });
    let r = recorded(fd, call, |c, r| {
        if r == 0 && c.is_pending() {
            c.note_epoll(epfd, op, ev);
        }
    });
    if r == 0
        && let Some(c) = conn_of(fd)
    {
        let for_input = ev.is_some_and(|e| u32::from_ne_bytes([e[0], e[1], e[2], e[3]]) & looks::EPOLLIN != 0);
        if for_input && (op == looks::EPOLL_CTL_ADD || op == looks::EPOLL_CTL_MOD) {
            c.waited_for_input(fd);
        }
        guard(|| looks::ctl(epfd, op, fd, &c, ev), || ());
    }
    r
}

// ---- addresses and options come from the TCP socket ----

/// Runs `f` on the TCP socket behind descriptor `fd`: its own, or a moved connection's —
/// whose connection is held for the call, so that socket's descriptor is not closed (and
/// its number given to another file) by a move back to TCP on another thread meanwhile.
fn on_tcp<T>(fd: c_int, f: impl FnOnce(c_int) -> T) -> T {
    let c = if active() { conn_of(fd) } else { None };
    f(c.as_ref().map_or(fd, |c| c.tcp_fd))
}

/// `getsockname(2)`.
///
/// # Safety
/// As for `getsockname(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn getsockname(fd: c_int, addr: *mut c_void, len: *mut u32) -> c_int {
    // SAFETY: the caller's arguments, on the connection's TCP socket if it has one.
    on_tcp(fd, |tcp| unsafe { real::getsockname(tcp, addr, len) })
}

/// `getpeername(2)`.
///
/// # Safety
/// As for `getpeername(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn getpeername(fd: c_int, addr: *mut c_void, len: *mut u32) -> c_int {
    // SAFETY: as above.
    on_tcp(fd, |tcp| unsafe { real::getpeername(tcp, addr, len) })
}

/// `getsockopt(2)`.
///
/// # Safety
/// As for `getsockopt(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn getsockopt(fd: c_int, level: c_int, name: c_int, val: *mut c_void, len: *mut u32) -> c_int {
    // SAFETY: as above.
    on_tcp(fd, |tcp| unsafe { real::getsockopt(tcp, level, name, val, len) })
}

/// `setsockopt(2)`.
///
/// # Safety
/// As for `setsockopt(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn setsockopt(fd: c_int, level: c_int, name: c_int, val: *const c_void, len: u32) -> c_int {
    on_tcp(fd, |tcp| {
        if tcp != fd && level == sys::SOL_SOCKET && (name == sys::SO_RCVTIMEO || name == sys::SO_SNDTIMEO) {
            // Timeouts also bound the library's waits on the descriptor itself.
            // SAFETY: the caller's option value, on our descriptor.
            unsafe { real::setsockopt(fd, level, name, val, len) };
            if let Some(c) = conn_of(fd) {
                let ms = sys::timeout_ms(fd, name);
                if name == sys::SO_RCVTIMEO { &c.rcvtimeo } else { &c.sndtimeo }.store(ms, Ordering::Relaxed);
            }
        }
        // SAFETY: as above.
        unsafe { real::setsockopt(tcp, level, name, val, len) }
    })
}

/// `ioctl(2)` (one optional argument, as for `fcntl`): `FIONBIO` on a shared-memory
/// connection is tracked like `O_NONBLOCK`; `FIONREAD`, `SIOCOUTQ`, `SIOCOUTQNSD` and
/// `SIOCATMARK` are answered from the rings.
///
/// # Safety
/// As for `ioctl(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ioctl(fd: c_int, req: std::ffi::c_ulong, arg: usize) -> c_int {
    if active() && marked(fd) {
        if let Some(c) = conn_of(fd)
            && c.is_pending()
            && c.check_pending(fd, true) == Err(conn::FELL_BACK)
        {
            // Back on TCP: the kernel answers for it.
            let _ = guard(|| pending::fall_back(fd, &c), || Ok(()));
        }
        // SAFETY: the caller's argument, for the requests `answer_ioctl` answers.
        if let Some(r) = unsafe { transfer::answer_ioctl(fd, req, arg) } {
            return r;
        }
    }
    const FIONBIO: std::ffi::c_ulong = 0x5421;
    // SAFETY: the caller's arguments.
    let call = || unsafe { real::ioctl(fd, req, arg) };
    if req == FIONBIO && arg != 0 {
        // SAFETY: FIONBIO's argument is a pointer to an int, which the kernel has read
        // when the call succeeded.
        return set_mode(fd, call, |r| (r == 0).then(|| unsafe { *(arg as *const c_int) } != 0));
    }
    call()
}

// ---- data ----

/// MSG_OOB: urgent data has no place on shared memory.
const MSG_OOB: c_int = 1;

/// MSG_TRUNC: on a TCP read, discard the bytes instead of copying them.
const MSG_TRUNC: c_int = 0x20;

/// MSG_ERRQUEUE: the socket's error queue (zero-copy completions, timestamps).
const MSG_ERRQUEUE: c_int = 0x2000;

fn smc_read(c: &Conn, fd: c_int, buf: *mut c_void, n: usize, flags: c_int) -> isize {
    c.tally.rx_call();
    if flags & MSG_OOB != 0 {
        cabi::set_errno(sys::EOPNOTSUPP);
        return -1;
    }
    if flags & MSG_ERRQUEUE != 0 {
        // Never the stream's bytes. (Completions are read with recvmsg, which has room
        // for them: crate::zerocopy.)
        cabi::set_errno(sys::EAGAIN);
        return -1;
    }
    if n == 0 {
        return 0;
    }
    if flags & MSG_TRUNC != 0 && flags & sys::MSG_PEEK == 0 {
        // TCP's MSG_TRUNC: up to `n` bytes are taken and thrown away; `buf` is not touched.
        return ret(c.read_to(fd, flags & !MSG_TRUNC, n, &mut |b: &[u8]| Ok(b.len())), true);
    }
    // SAFETY: the caller's buffer of `n` bytes.
    let b = unsafe { std::slice::from_raw_parts_mut(buf.cast::<u8>(), n) };
    ret(c.read(fd, b, flags), true)
}

fn smc_write(c: &Conn, fd: c_int, buf: *const c_void, n: usize, flags: c_int) -> isize {
    c.tally.tx_call();
    if flags & MSG_OOB != 0 {
        cabi::set_errno(sys::EOPNOTSUPP);
        return -1;
    }
    if n == 0 {
        return 0;
    }
    // SAFETY: the caller's buffer of `n` bytes.
    let b = unsafe { std::slice::from_raw_parts(buf.cast::<u8>(), n) };
    let r = ret(c.write(fd, b, flags), flags & sys::MSG_NOSIGNAL != 0);
    zerocopy::sent(c, flags, r);
    r
}

/// A call on a moved descriptor goes to shared memory (`$smc`, with `$c` the
/// connection); anywhere else, or on a pending connection that turns out to stay on TCP
/// ([`conn::FELL_BACK`]: crate::pending moves the descriptor back first), to the kernel.
macro_rules! data_hook {
    ($c:ident, $fd:expr, $smc:expr, $real:expr) => {{
        if active() && marked($fd) {
            if let Some($c) = conn_of($fd) {
                let r = guard(
                    || $smc,
                    || {
                        cabi::set_errno(sys::EINVAL);
                        -1
                    },
                );
                if r != -1 || cabi::errno() != conn::FELL_BACK {
                    return r;
                }
                if let Err(e) = guard(|| pending::fall_back($fd, &$c), || Err(sys::EINVAL)) {
                    cabi::set_errno(e);
                    return -1;
                }
            }
        }
        $real
    }};
}

/// `read(2)`.
///
/// # Safety
/// As for `read(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn read(fd: c_int, buf: *mut c_void, n: usize) -> isize {
    // SAFETY: the caller's arguments.
    data_hook!(c, fd, smc_read(&c, fd, buf, n, 0), unsafe { real::read(fd, buf, n) })
}

/// `__read_chk`, the fortified `read`.
///
/// # Safety
/// As for `read(2)`, with `buflen` the buffer's size.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __read_chk(fd: c_int, buf: *mut c_void, n: usize, buflen: usize) -> isize {
    // SAFETY: at most the buffer's size.
    unsafe { read(fd, buf, n.min(buflen)) }
}

/// `recv(2)`.
///
/// # Safety
/// As for `recv(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn recv(fd: c_int, buf: *mut c_void, n: usize, flags: c_int) -> isize {
    // SAFETY: the caller's arguments.
    data_hook!(c, fd, smc_read(&c, fd, buf, n, flags), unsafe { real::recv(fd, buf, n, flags) })
}

/// `__recv_chk`, the fortified `recv`.
///
/// # Safety
/// As for `recv(2)`, with `buflen` the buffer's size.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __recv_chk(fd: c_int, buf: *mut c_void, n: usize, buflen: usize, flags: c_int) -> isize {
    // SAFETY: at most the buffer's size.
    unsafe { recv(fd, buf, n.min(buflen), flags) }
}

/// `recvfrom(2)` (a connected stream socket reports no address).
///
/// # Safety
/// As for `recvfrom(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn recvfrom(
    fd: c_int,
    buf: *mut c_void,
    n: usize,
    flags: c_int,
    addr: *mut c_void,
    len: *mut u32,
) -> isize {
    data_hook!(
        c,
        fd,
        {
            if !len.is_null() {
                // SAFETY: the caller's length word.
                unsafe { *len = 0 };
            }
            smc_read(&c, fd, buf, n, flags)
        },
        // SAFETY: the caller's arguments.
        unsafe { real::recvfrom(fd, buf, n, flags, addr, len) }
    )
}

/// `__recvfrom_chk`, the fortified `recvfrom`.
///
/// # Safety
/// As for `recvfrom(2)`, with `buflen` the buffer's size.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __recvfrom_chk(
    fd: c_int,
    buf: *mut c_void,
    n: usize,
    buflen: usize,
    flags: c_int,
    addr: *mut c_void,
    len: *mut u32,
) -> isize {
    // SAFETY: at most the buffer's size.
    unsafe { recvfrom(fd, buf, n.min(buflen), flags, addr, len) }
}

/// `write(2)`.
///
/// # Safety
/// As for `write(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn write(fd: c_int, buf: *const c_void, n: usize) -> isize {
    // SAFETY: the caller's arguments.
    data_hook!(c, fd, smc_write(&c, fd, buf, n, 0), unsafe { real::write(fd, buf, n) })
}

/// `send(2)`.
///
/// # Safety
/// As for `send(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn send(fd: c_int, buf: *const c_void, n: usize, flags: c_int) -> isize {
    // SAFETY: the caller's arguments.
    data_hook!(c, fd, smc_write(&c, fd, buf, n, flags), unsafe { real::send(fd, buf, n, flags) })
}

/// `sendto(2)` (the address of a connected stream socket is ignored, as TCP does).
///
/// # Safety
/// As for `sendto(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sendto(
    fd: c_int,
    buf: *const c_void,
    n: usize,
    flags: c_int,
    addr: *const c_void,
    len: u32,
) -> isize {
    // SAFETY: the caller's arguments.
    data_hook!(c, fd, smc_write(&c, fd, buf, n, flags), unsafe { real::sendto(fd, buf, n, flags, addr, len) })
}

/// The buffers of an iovec array.
///
/// # Safety
/// `iov` must point to `n` valid iovecs.
unsafe fn iovecs<'a>(iov: *const IoVec, n: c_int) -> &'a [IoVec] {
    if iov.is_null() || n <= 0 {
        return &[];
    }
    // (`readv`/`writev` leave a count above IOV_MAX to the kernel, which refuses it.)
    // SAFETY: per the caller.
    unsafe { std::slice::from_raw_parts(iov, n as usize) }
}

fn smc_writev(c: &Conn, fd: c_int, iov: &[IoVec], flags: c_int) -> isize {
    c.tally.tx_call();
    if flags & MSG_OOB != 0 {
        cabi::set_errno(sys::EOPNOTSUPP);
        return -1;
    }
    let bufs: Vec<&[u8]> = iov
        .iter()
        .filter(|v| v.len > 0)
        // SAFETY: each iovec names a readable buffer of its length.
        .map(|v| unsafe { std::slice::from_raw_parts(v.base.cast::<u8>(), v.len) })
        .collect();
    let total = bufs.iter().try_fold(0usize, |t, b| t.checked_add(b.len()).filter(|&t| t <= isize::MAX as usize));
    let Some(total) = total else {
        cabi::set_errno(sys::EINVAL);
        return -1;
    };
    if total == 0 {
        return 0;
    }
    let r = c.write_from(fd, flags, total, &mut conn::IovSource::new(&bufs));
    let r = ret(r, flags & sys::MSG_NOSIGNAL != 0);
    zerocopy::sent(c, flags, r);
    r
}

fn smc_readv(c: &Conn, fd: c_int, iov: &[IoVec], flags: c_int) -> isize {
    let total: usize = iov.iter().map(|v| v.len).sum();
    let mut tmp = vec![0u8; total];
    let n = smc_read(c, fd, tmp.as_mut_ptr().cast(), total, flags);
    if n > 0 {
        let mut off = 0usize;
        for v in iov {
            let k = v.len.min(n as usize - off);
            // SAFETY: each iovec names a writable buffer of its length; `k` ≤ its length.
            unsafe { std::ptr::copy_nonoverlapping(tmp.as_ptr().add(off), v.base.cast::<u8>(), k) };
            off += k;
            if off == n as usize {
                break;
            }
        }
    }
    n
}

/// `readv(2)`.
///
/// # Safety
/// As for `readv(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn readv(fd: c_int, iov: *const IoVec, n: c_int) -> isize {
    if !(0..=IOV_MAX).contains(&n) {
        // SAFETY: the kernel refuses the count, on any descriptor.
        return unsafe { real::readv(fd, iov, n) };
    }
    // SAFETY: the caller's iovecs.
    data_hook!(c, fd, smc_readv(&c, fd, unsafe { iovecs(iov, n) }, 0), unsafe { real::readv(fd, iov, n) })
}

/// The most iovecs one call takes (the kernel's UIO_MAXIOV).
const IOV_MAX: c_int = 1024;

/// `writev(2)`.
///
/// # Safety
/// As for `writev(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn writev(fd: c_int, iov: *const IoVec, n: c_int) -> isize {
    if !(0..=IOV_MAX).contains(&n) {
        // SAFETY: the kernel refuses the count, on any descriptor.
        return unsafe { real::writev(fd, iov, n) };
    }
    // SAFETY: the caller's iovecs.
    data_hook!(c, fd, smc_writev(&c, fd, unsafe { iovecs(iov, n) }, 0), unsafe { real::writev(fd, iov, n) })
}

/// `recvmsg` on a moved socket: data only (no address, no ancillary data).
fn smc_recvmsg(c: &Conn, fd: c_int, m: &mut cabi::MsgHdr, flags: c_int) -> isize {
    if flags & MSG_ERRQUEUE != 0 {
        return zerocopy::completion(c, m);
    }
    m.namelen = 0;
    m.controllen = 0;
    m.flags = 0;
    // SAFETY: the caller's msghdr names its iovecs.
    smc_readv(c, fd, unsafe { iovecs(m.iov, m.iovlen as c_int) }, flags)
}

/// `sendmsg` on a moved socket: data only; ancillary data is refused (`EOPNOTSUPP`).
fn smc_sendmsg(c: &Conn, fd: c_int, m: &cabi::MsgHdr, flags: c_int) -> isize {
    if m.controllen > 0 {
        cabi::set_errno(sys::EOPNOTSUPP);
        return -1;
    }
    // SAFETY: the caller's msghdr names its iovecs.
    smc_writev(c, fd, unsafe { iovecs(m.iov, m.iovlen as c_int) }, flags)
}

/// `recvmsg(2)`: data only; ancillary data is never delivered on shared memory.
///
/// # Safety
/// As for `recvmsg(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn recvmsg(fd: c_int, msg: *mut cabi::MsgHdr, flags: c_int) -> isize {
    data_hook!(
        c,
        fd,
        // SAFETY: the caller's msghdr.
        smc_recvmsg(&c, fd, unsafe { &mut *msg }, flags),
        // SAFETY: the caller's arguments.
        unsafe { real::recvmsg(fd, msg, flags) }
    )
}

/// `sendmsg(2)`: data only; ancillary data is refused (`EOPNOTSUPP`) on shared memory.
///
/// # Safety
/// As for `sendmsg(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sendmsg(fd: c_int, msg: *mut cabi::MsgHdr, flags: c_int) -> isize {
    data_hook!(
        c,
        fd,
        // SAFETY: the caller's msghdr.
        smc_sendmsg(&c, fd, unsafe { &*msg }, flags),
        // SAFETY: the caller's arguments.
        unsafe { real::sendmsg(fd, msg, flags) }
    )
}

// After `data_hook!`, which it uses.
mod transfer;
mod waits;
mod zerocopy;

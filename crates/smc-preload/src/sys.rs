//! The few system interfaces the library needs, declared by hand (the library has no
//! dependencies), each behind a small wrapper. Socket calls go through [`crate::real`] so
//! they never re-enter the library's own hooks.

use std::ffi::{c_int, c_void};
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use crate::cabi::{IoVec, MsgHdr, PollFd, errno};

pub const AF_UNIX: c_int = 1;
pub const AF_INET: c_int = 2;
pub const AF_INET6: c_int = 10;
pub const SOCK_STREAM: c_int = 1;
pub const SOCK_SEQPACKET: c_int = 5;
pub const SOCK_CLOEXEC: c_int = 0o2000000;
pub const SOCK_NONBLOCK: c_int = 0o4000;
pub const SOL_SOCKET: c_int = 1;
pub const SO_TYPE: c_int = 3;
pub const SO_ERROR: c_int = 4;
pub const SO_SNDBUF: c_int = 7;
pub const SO_DOMAIN: c_int = 39;
pub const SCM_RIGHTS: c_int = 1;
pub const MSG_DONTWAIT: c_int = 0x40;
pub const MSG_NOSIGNAL: c_int = 0x4000;
pub const MSG_PEEK: c_int = 0x2;
pub const MSG_WAITALL: c_int = 0x100;
pub const MSG_CMSG_CLOEXEC: c_int = 0x40000000;
pub const POLLIN: i16 = 0x1;
pub const POLLOUT: i16 = 0x4;
pub const F_GETFL: c_int = 3;
pub const F_GETFD: c_int = 1;
pub const F_SETFL: c_int = 4;
pub const F_DUPFD_CLOEXEC: c_int = 1030;
pub const O_NONBLOCK: c_int = 0o4000;
pub const O_CLOEXEC: c_int = 0o2000000;
pub const EAGAIN: c_int = 11;
pub const E2BIG: c_int = 7;
pub const EMFILE: c_int = 24;
pub const EINTR: c_int = 4;
pub const EACCES: c_int = 13;
pub const EINPROGRESS: c_int = 115;
pub const EPIPE: c_int = 32;
pub const ECONNRESET: c_int = 104;
pub const EOPNOTSUPP: c_int = 95;
pub const EINVAL: c_int = 22;
pub const ETIMEDOUT: c_int = 110;
pub const SHUT_RD: c_int = 0;
pub const SHUT_WR: c_int = 1;
pub const SHUT_RDWR: c_int = 2;

unsafe extern "C" {
    fn memfd_create(name: *const std::ffi::c_char, flags: u32) -> c_int;
    fn ftruncate(fd: c_int, len: i64) -> c_int;
    fn mmap(addr: *mut c_void, len: usize, prot: c_int, flags: c_int, fd: c_int, off: i64) -> *mut c_void;
    fn munmap(addr: *mut c_void, len: usize) -> c_int;
    fn getpid() -> c_int;
    fn pthread_atfork(
        prepare: Option<extern "C" fn()>,
        parent: Option<extern "C" fn()>,
        child: Option<extern "C" fn()>,
    ) -> c_int;
    fn getrlimit(resource: c_int, rlim: *mut [u64; 2]) -> c_int;
    fn kill(pid: c_int, sig: c_int) -> c_int;
    fn getrandom(buf: *mut c_void, len: usize, flags: u32) -> isize;
    fn geteuid() -> u32;
    fn lseek(fd: c_int, off: i64, whence: c_int) -> i64;
    fn fstatfs(fd: c_int, buf: *mut c_void) -> c_int;
    fn posix_fallocate(fd: c_int, off: i64, len: i64) -> c_int;
    fn fallocate(fd: c_int, mode: c_int, off: i64, len: i64) -> c_int;
    fn fstat(fd: c_int, buf: *mut c_void) -> c_int;
    fn syscall(n: std::ffi::c_long, ...) -> std::ffi::c_long;
    fn sigfillset(set: *mut c_void) -> c_int;
    fn pthread_sigmask(how: c_int, set: *const c_void, old: *mut c_void) -> c_int;
}

/// Blocks every signal in the calling thread: the library's own threads never take a
/// signal meant for the program (a program that waits for SIGTERM with `sigwait`, its
/// other threads blocking it, would otherwise be killed by it through one of ours).
/// Faults a thread causes itself are still delivered to it.
pub fn block_signals() {
    const SIG_BLOCK: c_int = 0;
    // (glibc's sigset_t is 128 bytes; 8-aligned.)
    let mut set = [0u64; 16];
    // SAFETY: `set` is as large and aligned as a sigset_t; both calls only write it or
    // read it, and change this thread's mask.
    unsafe {
        sigfillset(set.as_mut_ptr().cast());
        pthread_sigmask(SIG_BLOCK, set.as_ptr().cast(), std::ptr::null_mut());
    }
}

#[cfg(target_arch = "x86_64")]
const SYS_FUTEX: std::ffi::c_long = 202;
#[cfg(target_arch = "aarch64")]
const SYS_FUTEX: std::ffi::c_long = 98;
const FUTEX_WAIT: c_int = 0;
const FUTEX_WAKE: c_int = 1;

/// How a [`futex_wait`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Woke {
    /// Woken, or the word had already changed: look again.
    Changed,
    /// `timeout_ms` passed.
    TimedOut,
}

/// Sleeps while `word` holds `expected`, at most `timeout_ms`. The word lives in memory
/// shared between processes, so this is the shared (not the private) futex. A signal
/// counts as a change (the caller looks again, as after `EINTR`).
pub fn futex_wait(word: &std::sync::atomic::AtomicU32, expected: u32, timeout_ms: i32) -> Woke {
    let ts = [i64::from(timeout_ms / 1000), i64::from(timeout_ms % 1000) * 1_000_000];
    // SAFETY: a valid, aligned u32 for the kernel to compare; a live timespec.
    let r = unsafe { syscall(SYS_FUTEX, word.as_ptr(), FUTEX_WAIT, expected, ts.as_ptr(), 0usize, 0u32) };
    if r < 0 && errno() == ETIMEDOUT { Woke::TimedOut } else { Woke::Changed }
}

/// Wakes every thread sleeping on `word`, in any process.
pub fn futex_wake(word: &std::sync::atomic::AtomicU32) {
    // SAFETY: a valid, aligned u32; FUTEX_WAKE only reads its address.
    unsafe { syscall(SYS_FUTEX, word.as_ptr(), FUTEX_WAKE, c_int::MAX, 0usize, 0usize, 0u32) };
}

fn cvt(r: c_int) -> io::Result<c_int> {
    if r < 0 { Err(io::Error::from_raw_os_error(errno())) } else { Ok(r) }
}

/// This process's effective user id.
pub fn euid() -> u32 {
    // SAFETY: no preconditions.
    unsafe { geteuid() }
}

/// This process's id, asked of the kernel now: in a `vfork`ed child (which runs no fork
/// handler) [`pid`] still answers the parent's.
pub fn pid_now() -> u32 {
    // SAFETY: no preconditions.
    unsafe { getpid() as u32 }
}

/// This process's id.
pub fn pid() -> u32 {
    // Asked of the kernel once per process: every read and write takes a lock that names
    // its holder, and a system call each time showed in the profiles.
    let p = PID.load(std::sync::atomic::Ordering::Relaxed);
    if p != 0 {
        return p;
    }
    // SAFETY: no preconditions.
    let p = unsafe { getpid() as u32 };
    PID.store(p, std::sync::atomic::Ordering::Relaxed);
    p
}

static PID: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

extern "C" fn forget_pid() {
    // Stored now, not asked later: a `vfork`ed child of this child shares its memory, and
    // an answer it cached would be the parent's from then on.
    PID.store(pid_now(), std::sync::atomic::Ordering::Relaxed);
}

/// True in a child made by `vfork` (or `posix_spawn`, or a raw `clone` that shares
/// memory) that has not yet run `exec`: it runs in its parent's memory and runs no fork
/// handler, so nothing of the library's tables may change here — they are the parent's
/// (a `dup2` onto standard input here would otherwise name the parent's standard input a
/// connection). One system call.
pub fn vforked() -> bool {
    // (Never stores: the cache is filled in the constructor and by the fork handler.)
    let p = PID.load(std::sync::atomic::Ordering::Relaxed);
    p != 0 && p != pid_now()
}

/// The library's own descriptors (a bit each, below `MAX_FD`): a program that closes
/// every descriptor above a number (`closefrom`, `close_range`) closes its own and leaves
/// these, which it never opened. Marked where the library makes or receives a descriptor,
/// cleared where it closes one or the program closes or overwrites that number.
static OURS: [std::sync::atomic::AtomicU64; crate::MAX_FD / 64] =
    [const { std::sync::atomic::AtomicU64::new(0) }; crate::MAX_FD / 64];

/// Marks `fd` the library's; answers it.
pub fn own(fd: c_int) -> c_int {
    if fd >= 0 && (fd as usize) < crate::MAX_FD {
        OURS[fd as usize / 64].fetch_or(1 << (fd % 64), std::sync::atomic::Ordering::Relaxed);
    }
    fd
}

/// `fd` is no longer the library's.
pub fn disown(fd: c_int) {
    if fd >= 0 && (fd as usize) < crate::MAX_FD {
        OURS[fd as usize / 64].fetch_and(!(1 << (fd % 64)), std::sync::atomic::Ordering::Relaxed);
    }
}

/// Whether `fd` is the library's.
pub fn is_own(fd: c_int) -> bool {
    fd >= 0
        && (fd as usize) < crate::MAX_FD
        && OURS[fd as usize / 64].load(std::sync::atomic::Ordering::Relaxed) & (1 << (fd % 64)) != 0
}

/// Set once the program puts itself under a seccomp filter (`prctl(PR_SET_SECCOMP)`, as
/// OpenSSH's sshd does in its pre-authentication child): from then on the library moves
/// doorbell bytes with the calls such filters allow — `poll`, then `read` or `write` —
/// instead of `recvmsg` and `send` with flags, which they kill the process for.
static SANDBOXED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The program is about to put itself under a seccomp filter.
pub fn set_sandboxed() {
    SANDBOXED.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// Whether the program has put itself under a seccomp filter.
pub fn sandboxed() -> bool {
    SANDBOXED.load(std::sync::atomic::Ordering::Relaxed)
}

/// Whether `fd` has `events` now (no waiting).
fn ready_now(fd: c_int, events: i16) -> bool {
    let mut p = PollFd { fd, events, revents: 0 };
    // SAFETY: one valid pollfd, no waiting.
    unsafe { crate::real::poll(&mut p, 1, 0) == 1 && p.revents & events != 0 }
}

/// Writes `buf` onto unix stream socket `fd` without waiting and without `SIGPIPE`; the
/// bytes written, or -1 (`EAGAIN` when it is full). In a sandboxed process: a `write`
/// once `poll` says there is room (one write below a quarter of the send buffer never
/// waits), and a peer that is gone raises `SIGPIPE` unless the program ignores it.
pub fn send_nowait(fd: c_int, buf: &[u8]) -> isize {
    if sandboxed() {
        if !ready_now(fd, POLLOUT) {
            crate::cabi::set_errno(EAGAIN);
            return -1;
        }
        // SAFETY: writes from a live buffer.
        return unsafe { crate::real::write(fd, buf.as_ptr().cast(), buf.len()) };
    }
    // SAFETY: as above.
    unsafe { crate::real::send(fd, buf.as_ptr().cast(), buf.len(), MSG_DONTWAIT | MSG_NOSIGNAL) }
}

/// `CLOSE_RANGE_UNSHARE`.
pub const CLOSE_RANGE_UNSHARE: c_int = 1 << 1;
/// `CLOSE_RANGE_CLOEXEC`.
pub const CLOSE_RANGE_CLOEXEC: c_int = 1 << 2;

/// `close_range(first, last, flags)` on every descriptor of the range but the library's:
/// one call per run of the program's descriptors between ours. `CLOSE_RANGE_UNSHARE`
/// goes with the first call only (it unshares the table once). A kernel without the call
/// (before 5.9), or a seccomp profile that refuses it, gets a `close` per descriptor, up to
/// the descriptor limit.
pub fn close_range_but_ours(first: u32, last: u32, flags: c_int) -> c_int {
    let mut flags = flags;
    let mut from = first;
    let run = |from: u32, to: u32, flags: c_int| -> c_int {
        // SAFETY: the program's descriptors, as it asked.
        let r = unsafe { crate::real::close_range(from, to, flags) };
        // (EPERM: a seccomp profile that refuses the call, as glibc's closefrom also
        // falls back for.)
        if r < 0 && matches!(errno(), 38 /* ENOSYS */ | 1 /* EPERM */) && flags & CLOSE_RANGE_CLOEXEC == 0 {
            let top = (to as u64).min(fd_limit().saturating_sub(1)).min(1 << 20) as u32;
            for fd in from..=top.max(from) {
                // SAFETY: as above.
                unsafe { crate::real::close(fd as c_int) };
            }
            return 0;
        }
        r
    };
    let top = last.min(crate::MAX_FD as u32 - 1);
    let mut fd = first;
    while fd <= top {
        if is_own(fd as c_int) {
            if fd > from {
                let r = run(from, fd - 1, flags);
                if r < 0 {
                    return r;
                }
                flags &= !CLOSE_RANGE_UNSHARE;
            }
            from = fd + 1;
        }
        // (A word without marks is skipped whole.)
        if fd.is_multiple_of(64)
            && fd + 63 <= top
            && OURS[fd as usize / 64].load(std::sync::atomic::Ordering::Relaxed) == 0
        {
            fd += 64;
        } else {
            fd += 1;
        }
    }
    if from <= last {
        return run(from, last, flags);
    }
    0
}

/// The descriptors open in this process now (from `/proc/self/fd`), in no order.
pub fn open_fds() -> Vec<c_int> {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else { return Vec::new() };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect()
}

/// Runs `f` in the parent before every fork (registered once, at load).
pub fn before_fork(f: extern "C" fn()) {
    // SAFETY: registers a prepare handler that lives as long as the process.
    unsafe { pthread_atfork(Some(f), None, None) };
}

/// Runs `f` in the child after every fork (registered once, at load).
pub fn in_child_after_fork(f: extern "C" fn()) {
    // SAFETY: registers a child handler that lives as long as the process.
    unsafe { pthread_atfork(None, None, Some(f)) };
}

/// Makes a forked child ask its own pid again (called once, at load).
pub fn pid_after_fork() {
    // SAFETY: registers a child handler that only stores to an atomic.
    unsafe { pthread_atfork(None, None, Some(forget_pid)) };
}

/// True if process `pid` exists.
pub fn alive(pid: u32) -> bool {
    // SAFETY: signal 0 only checks for existence.
    unsafe { kill(pid as c_int, 0) == 0 || errno() != 3 }
}

/// 16 random bytes.
pub fn token() -> [u8; 16] {
    let mut t = [0u8; 16];
    // SAFETY: writes at most 16 bytes into `t`.
    unsafe { getrandom(t.as_mut_ptr().cast(), 16, 0) };
    t
}

/// Closes a descriptor the library owns.
pub fn close(fd: c_int) {
    disown(fd);
    // SAFETY: the caller owns `fd`.
    unsafe { crate::real::close(fd) };
}

/// A shared memory region backed by a memfd.
pub struct Shm {
    pub fd: c_int,
    pub ptr: *mut u8,
    pub len: usize,
}

// SAFETY: the mapping is shared memory; access goes through the ring's atomics.
unsafe impl Send for Shm {}
// SAFETY: as above.
unsafe impl Sync for Shm {}

/// `F_SEAL_SEAL | F_SEAL_SHRINK | F_SEAL_GROW`: no more seals, no resizing — what every
/// segment sent to a peer carries, and what a received one must carry before it is mapped.
pub const SEALS: u32 = 0x1 | 0x2 | 0x4;
const F_ADD_SEALS: c_int = 1033;
const F_GET_SEALS: c_int = 1034;

impl Shm {
    /// A new zeroed region of `len` bytes in a memfd sealed against resizing.
    pub fn create(len: usize) -> io::Result<Shm> {
        // MFD_CLOEXEC | MFD_ALLOW_SEALING.
        // SAFETY: a NUL-terminated name.
        let fd = cvt(unsafe { memfd_create(c"sluice-smc".as_ptr(), 0x1 | 0x2) })?;
        // SAFETY: `fd` is ours.
        let sized = unsafe { ftruncate(fd, len as i64) } == 0;
        // SAFETY: fcntl on our own memfd.
        if !sized || unsafe { crate::real::fcntl(fd, F_ADD_SEALS, SEALS as usize) } < 0 {
            let e = io::Error::from_raw_os_error(errno());
            close(fd);
            return Err(e);
        }
        Shm::map(fd, len)
    }

    /// Maps `len` bytes of memfd `fd` (taking ownership of `fd`).
    pub fn map(fd: c_int, len: usize) -> io::Result<Shm> {
        // PROT_READ|PROT_WRITE, MAP_SHARED.
        // SAFETY: a fresh mapping of a descriptor we own; the result is checked.
        let p = unsafe { mmap(std::ptr::null_mut(), len, 0x1 | 0x2, 0x01, fd, 0) };
        if p as isize == -1 {
            let e = io::Error::from_raw_os_error(errno());
            close(fd);
            return Err(e);
        }
        Ok(Shm { fd: own(fd), ptr: p.cast(), len })
    }
}

impl Shm {
    /// Maps `len` bytes of memfd `fd`, which stays the caller's (the mapping keeps the
    /// memory; the view holds no descriptor).
    pub fn map_borrowed(fd: c_int, len: usize) -> io::Result<Shm> {
        // SAFETY: a fresh mapping of a descriptor the caller holds; the result is checked.
        let p = unsafe { mmap(std::ptr::null_mut(), len, 0x1 | 0x2, 0x01, fd, 0) };
        if p as isize == -1 {
            return Err(io::Error::from_raw_os_error(errno()));
        }
        Ok(Shm { fd: -1, ptr: p.cast(), len })
    }
}

impl Shm {
    /// Closes the memfd behind the mapping (the mapping keeps the memory): a moved
    /// connection holds no descriptor for its buffers.
    pub fn close_fd(&mut self) {
        if self.fd >= 0 {
            close(self.fd);
            self.fd = -1;
        }
    }
}

impl Drop for Shm {
    fn drop(&mut self) {
        // SAFETY: our own mapping and descriptor.
        unsafe { munmap(self.ptr.cast(), self.len) };
        if self.fd >= 0 {
            close(self.fd);
        }
    }
}

/// True when `fd` is a shared-memory file (not hugetlbfs) whose size can no longer change
/// and is exactly `len`: safe to map whole, whatever its maker does next.
pub fn is_sealed_shm(fd: c_int, len: usize) -> bool {
    is_shmem(fd) && seals(fd).is_some_and(|s| s & SEALS == SEALS) && file_len(fd) == Some(len as u64)
}

/// The seals of memfd `fd` (`None`: not a file that can carry seals).
pub fn seals(fd: c_int) -> Option<u32> {
    // SAFETY: F_GET_SEALS takes no argument and only reads the file's state.
    let r = unsafe { crate::real::fcntl(fd, F_GET_SEALS, 0) };
    (r >= 0).then_some(r as u32)
}

/// `TMPFS_MAGIC`: the file system of memfds (and of tmpfs mounts), not hugetlbfs, whose
/// sealed files can still lose their pages to a hole punched by the peer.
const TMPFS_MAGIC: i64 = 0x0102_1994;

/// True when `fd` is a memfd (or tmpfs file) that can carry seals: the only kind of file a
/// peer's segment may be. Asked with `F_GET_SEALS` first, which only shmem and hugetlbfs
/// files answer without asking a file system, so a file on a peer's FUSE mount is refused
/// before `fstatfs` could wait on its server.
pub fn is_shmem(fd: c_int) -> bool {
    if seals(fd).is_none() {
        return false;
    }
    // struct statfs: f_type first; 120 bytes on 64-bit Linux.
    let mut st = [0i64; 15];
    // SAFETY: `st` has room for a struct statfs.
    let r = unsafe { fstatfs(fd, st.as_mut_ptr().cast()) };
    r == 0 && st[0] == TMPFS_MAGIC
}

/// Gives file `fd` real blocks for its first `len` bytes, so a mapping of them never
/// faults for want of space (a sparse page on a full tmpfs is SIGBUS on first touch).
pub fn allocate(fd: c_int, len: u64) -> bool {
    // SAFETY: on a descriptor the caller holds.
    unsafe { posix_fallocate(fd, 0, len as i64) == 0 }
}

/// Gives back the pages of `len` bytes of file `fd` from `off` (a hole; the size stays).
pub fn punch(fd: c_int, off: u64, len: u64) {
    const PUNCH_HOLE_KEEP_SIZE: c_int = 0x02 | 0x01;
    // SAFETY: on a descriptor the caller holds; only that file's pages change.
    unsafe { fallocate(fd, PUNCH_HOLE_KEEP_SIZE, off as i64, len as i64) };
}

/// The (device, inode) of the file behind `fd`.
pub fn file_id(fd: c_int) -> Option<(u64, u64)> {
    // struct stat on x86_64/aarch64: st_dev first (8 bytes), st_ino second; 144 bytes.
    let mut st = [0u64; 18];
    // SAFETY: `st` has room for a struct stat.
    let r = unsafe { fstat(fd, st.as_mut_ptr().cast()) };
    (r == 0).then_some((st[0], st[1]))
}

/// `SO_PASSRIGHTS` (Linux 6.16): off, a unix socket refuses descriptors sent to it.
const SO_PASSRIGHTS: c_int = 83;

/// Makes unix socket `fd` refuse descriptors (`SCM_RIGHTS`) from now on. False when the
/// kernel cannot (before Linux 6.16).
pub fn refuse_rights(fd: c_int) -> bool {
    let off: c_int = 0;
    // SAFETY: an int option on a descriptor the caller holds.
    let r = unsafe { crate::real::setsockopt(fd, SOL_SOCKET, SO_PASSRIGHTS, (&off as *const c_int).cast(), 4) };
    r == 0
}

/// The size of the file behind `fd`.
pub fn file_len(fd: c_int) -> Option<u64> {
    // SAFETY: SEEK_END on a descriptor the caller holds; moves only its own offset.
    let r = unsafe { lseek(fd, 0, 2) };
    (r >= 0).then_some(r as u64)
}

const SO_PEERCRED: c_int = 17;
const SO_PEERGROUPS: c_int = 59;
const SO_COOKIE: c_int = 57;

/// The process at the other end of unix socket `fd` when it connected (or listened), as
/// the kernel recorded it: (pid, credentials with supplementary groups).
pub fn peer_cred(fd: c_int) -> Option<(u32, sluice_smc::access::Cred)> {
    let mut uc = [0u32; 3];
    let mut len: u32 = 12;
    // SAFETY: `uc` is a struct ucred (pid, uid, gid).
    let r = unsafe { crate::real::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, uc.as_mut_ptr().cast(), &mut len) };
    if r != 0 || len != 12 {
        return None;
    }
    let mut groups = vec![0u32; 256];
    let mut glen: u32 = 4 * 256;
    // SAFETY: `groups` has `glen` bytes.
    let r = unsafe { crate::real::getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups.as_mut_ptr().cast(), &mut glen) };
    // More than 256 groups (ERANGE): judged by the primary group alone.
    groups.truncate(if r == 0 { (glen as usize / 4).min(256) } else { 0 });
    Some((uc[0], sluice_smc::access::Cred { uid: uc[1], gid: uc[2], groups }))
}

/// The kernel's cookie of socket `fd` (unique among the host's sockets; `sock_diag`
/// reports the same value).
pub fn cookie(fd: c_int) -> Option<u64> {
    let mut v = 0u64;
    let mut len: u32 = 8;
    // SAFETY: `v` has 8 bytes.
    let r = unsafe { crate::real::getsockopt(fd, SOL_SOCKET, SO_COOKIE, (&mut v as *mut u64).cast(), &mut len) };
    (r == 0 && len == 8).then_some(v)
}

/// The TCP state of socket `fd` (the first byte of `TCP_INFO`; 1 is ESTABLISHED).
pub fn tcp_state(fd: c_int) -> Option<u8> {
    let mut info = [0u8; 8];
    let mut len: u32 = 8;
    // SAFETY: `info` has 8 bytes; the kernel copies at most `len`.
    let r = unsafe {
        crate::real::getsockopt(
            fd,
            6,  /* IPPROTO_TCP */
            11, /* TCP_INFO */
            info.as_mut_ptr().cast(),
            &mut len,
        )
    };
    (r == 0 && len >= 1).then_some(info[0])
}

/// Bytes waiting to be read on socket `fd`.
pub fn pending(fd: c_int) -> Option<usize> {
    let mut n: c_int = 0;
    // SAFETY: FIONREAD writes one int.
    let r = unsafe {
        crate::real::ioctl(fd, 0x541B /* FIONREAD */, (&mut n as *mut c_int) as usize)
    };
    (r == 0).then_some(n.max(0) as usize)
}

/// Creates `path` as a new file of ours with `mode`, never following a symlink or
/// reusing what is there: entries in directories other users write into.
pub fn create_new(path: &std::path::Path, mode: u32) -> io::Result<std::fs::File> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(O_NOFOLLOW | O_CLOEXEC)
        .mode(mode)
        .open(path)?;
    // The umask may have narrowed the mode.
    f.set_permissions(std::fs::Permissions::from_mode(mode))?;
    Ok(f)
}

/// `O_NOFOLLOW`.
pub const O_NOFOLLOW: c_int = 0o400000;

/// A unix socket pair, close-on-exec.
pub fn socketpair(kind: c_int) -> io::Result<(c_int, c_int)> {
    let mut fds = [0 as c_int; 2];
    // SAFETY: `fds` has room for two descriptors.
    cvt(unsafe { crate::real::socketpair(AF_UNIX, kind | SOCK_CLOEXEC, 0, fds.as_mut_ptr()) })?;
    Ok((own(fds[0]), own(fds[1])))
}

/// Where the library keeps the descriptors a moved connection needs besides the
/// application's (its TCP socket, the peer's doorbell end): from half the descriptor limit
/// (at most 4096) up, away from the low numbers a program's own descriptors get, so the
/// program's numbering stays as it would be on TCP (event loops sized by connection count,
/// `select`'s 1024).
fn high_base() -> c_int {
    // Asked once (a program that raises its limit later only gets a lower base).
    static BASE: std::sync::OnceLock<c_int> = std::sync::OnceLock::new();
    *BASE.get_or_init(|| (fd_limit() / 2).clamp(3, 4096) as c_int)
}

/// The process's descriptor limit (`RLIMIT_NOFILE`, soft), as it is now.
pub fn fd_limit() -> u64 {
    let mut r = [0u64; 2];
    // SAFETY: RLIMIT_NOFILE (7) into a two-word struct rlimit.
    if unsafe { getrlimit(7, &mut r) } == 0 { r[0] } else { 1024 }
}

/// A close-on-exec duplicate of `fd` among the library's high descriptors (or the lowest
/// free one when those are full); -1 if none is left.
pub fn dup_high(fd: c_int) -> c_int {
    // SAFETY: fcntl on a descriptor the caller owns.
    let n = unsafe { crate::real::fcntl(fd, F_DUPFD_CLOEXEC, high_base() as usize) };
    // SAFETY: as above.
    own(if n >= 0 { n } else { unsafe { crate::real::fcntl(fd, F_DUPFD_CLOEXEC, 3) } })
}

/// A duplicate of `fd` among the library's high descriptors that survives `exec`
/// (crate::carry); -1 if none is left.
pub fn dup_high_inheritable(fd: c_int) -> c_int {
    const F_DUPFD: c_int = 0;
    // SAFETY: fcntl on a descriptor the caller owns.
    unsafe { crate::real::fcntl(fd, F_DUPFD, high_base() as usize) }
}

/// True when `fd` is a `SOCK_STREAM` socket of one of `domains`.
pub fn is_stream(fd: c_int, domains: &[c_int]) -> bool {
    sockopt_int(fd, SOL_SOCKET, SO_TYPE) == Some(SOCK_STREAM)
        && sockopt_int(fd, SOL_SOCKET, SO_DOMAIN).is_some_and(|d| domains.contains(&d))
}

/// Moves `fd` (which it takes) among the library's high descriptors; the descriptor it
/// is now.
pub fn move_high(fd: c_int) -> c_int {
    let n = dup_high(fd);
    if n < 0 {
        return own(fd);
    }
    close(fd);
    n
}

/// Sets `O_NONBLOCK` on `fd`.
pub fn set_nonblocking(fd: c_int) {
    // SAFETY: fcntl on a descriptor the caller owns.
    unsafe {
        let fl = crate::real::fcntl(fd, F_GETFL, 0);
        if fl >= 0 {
            crate::real::fcntl(fd, F_SETFL, (fl | O_NONBLOCK) as usize);
        }
    }
}

/// Sends `data` with descriptors `fds` over unix socket `sock`, never waiting (`EAGAIN`
/// when the socket's queue is full).
pub fn send_with_fds_nowait(sock: c_int, data: &[u8], fds: &[c_int]) -> io::Result<()> {
    send_with_fds_flags(sock, data, fds, MSG_NOSIGNAL | MSG_DONTWAIT)
}

fn send_with_fds_flags(sock: c_int, data: &[u8], fds: &[c_int], flags: c_int) -> io::Result<()> {
    let mut iov = IoVec { base: data.as_ptr() as *mut c_void, len: data.len() };
    // cmsghdr: len (usize), level (int), type (int), then the descriptors; aligned to 8.
    let mut ctl = [0u8; 64];
    let clen = 16 + 4 * fds.len();
    ctl[..8].copy_from_slice(&(clen as u64).to_ne_bytes());
    ctl[8..12].copy_from_slice(&SOL_SOCKET.to_ne_bytes());
    ctl[12..16].copy_from_slice(&SCM_RIGHTS.to_ne_bytes());
    for (i, fd) in fds.iter().enumerate() {
        ctl[16 + 4 * i..20 + 4 * i].copy_from_slice(&fd.to_ne_bytes());
    }
    let mut m = MsgHdr {
        name: std::ptr::null_mut(),
        namelen: 0,
        iov: &mut iov,
        iovlen: 1,
        control: if fds.is_empty() { std::ptr::null_mut() } else { ctl.as_mut_ptr().cast() },
        controllen: if fds.is_empty() { 0 } else { clen.next_multiple_of(8) },
        flags: 0,
    };
    // SAFETY: `m` points at live buffers for the duration of the call.
    let n = unsafe { crate::real::sendmsg(sock, &mut m, flags) };
    if n < 0 { Err(io::Error::from_raw_os_error(errno())) } else { Ok(()) }
}

/// Room for the most descriptors one message can carry (`SCM_MAX_FD`, 253) behind a
/// control message header: all arrive in our hands, none is released by the kernel on our
/// thread (a truncated control message drops the rest, and dropping can block).
const CONTROL_LEN: usize = 16 + 4 * 253 + 4;

/// Receives one datagram (up to `buf.len()`) and every descriptor it carries, waiting at
/// most `timeout_ms`. Returns the length and the descriptors (close-on-exec), which are
/// the caller's to keep or to hand to [`crate::foreign::release`].
pub fn recv_with_fds(sock: c_int, buf: &mut [u8], timeout_ms: i32) -> io::Result<(usize, Vec<c_int>)> {
    if !wait(sock, POLLIN, timeout_ms)? {
        return Err(io::Error::from(io::ErrorKind::TimedOut));
    }
    let mut iov = IoVec { base: buf.as_mut_ptr().cast(), len: buf.len() };
    let mut ctl = [0u64; CONTROL_LEN / 8];
    let mut m = MsgHdr {
        name: std::ptr::null_mut(),
        namelen: 0,
        iov: &mut iov,
        iovlen: 1,
        control: ctl.as_mut_ptr().cast(),
        controllen: CONTROL_LEN,
        flags: 0,
    };
    // SAFETY: `m` points at live buffers for the duration of the call.
    let n = unsafe { crate::real::recvmsg(sock, &mut m, MSG_CMSG_CLOEXEC | MSG_DONTWAIT) };
    if n < 0 {
        return Err(io::Error::from_raw_os_error(errno()));
    }
    let ctl_bytes: &[u8] =
        // SAFETY: `ctl` is CONTROL_LEN initialized bytes.
        unsafe { std::slice::from_raw_parts(ctl.as_ptr().cast::<u8>(), m.controllen.min(CONTROL_LEN)) };
    Ok((n as usize, rights(ctl_bytes)))
}

/// Every descriptor in every `SCM_RIGHTS` message of a control buffer — all of them, so
/// a sender cannot slip descriptors past the caller (which closes what it does not use)
/// in a second control message.
fn rights(mut ctl: &[u8]) -> Vec<c_int> {
    let mut fds = Vec::new();
    while ctl.len() >= 16 {
        let clen = u64::from_ne_bytes(ctl[..8].try_into().unwrap_or_default()) as usize;
        let level = c_int::from_ne_bytes(ctl[8..12].try_into().unwrap_or_default());
        let kind = c_int::from_ne_bytes(ctl[12..16].try_into().unwrap_or_default());
        if clen < 16 || clen > ctl.len() {
            break;
        }
        if level == SOL_SOCKET && kind == SCM_RIGHTS {
            fds.extend(ctl[16..clen].chunks_exact(4).map(|b| own(c_int::from_ne_bytes([b[0], b[1], b[2], b[3]]))));
        }
        ctl = &ctl[clen.next_multiple_of(8).min(ctl.len())..];
    }
    fds
}

/// Waits until `fd` has one of `events` (or an error or hang-up), at most `timeout_ms`
/// (-1: forever). False on timeout.
pub fn wait(fd: c_int, events: i16, timeout_ms: i32) -> io::Result<bool> {
    let mut p = PollFd { fd, events, revents: 0 };
    loop {
        // SAFETY: one valid pollfd.
        let r = unsafe { crate::real::poll(&mut p, 1, timeout_ms) };
        if r < 0 && errno() == EINTR {
            continue;
        }
        return cvt(r).map(|n| n > 0);
    }
}

/// Waits until `fd` has one of `events`, or `also` (when not -1) is readable or ended
/// (or either has an error or hang-up), at most `timeout_ms` (-1: forever). False on
/// timeout.
pub fn wait2(fd: c_int, also: c_int, events: i16, timeout_ms: i32) -> io::Result<bool> {
    if also < 0 {
        return wait(fd, events, timeout_ms);
    }
    const POLLRDHUP: i16 = 0x2000;
    let mut p = [PollFd { fd, events, revents: 0 }, PollFd { fd: also, events: POLLIN | POLLRDHUP, revents: 0 }];
    loop {
        // SAFETY: two valid pollfds.
        let r = unsafe { crate::real::poll(p.as_mut_ptr(), 2, timeout_ms) };
        if r < 0 && errno() == EINTR {
            continue;
        }
        return cvt(r).map(|n| n > 0);
    }
}

/// A `sockaddr_un` for `path`.
pub fn unix_addr(path: &std::path::Path) -> Option<Vec<u8>> {
    use std::os::unix::ffi::OsStrExt;
    let p = path.as_os_str().as_bytes();
    if p.len() >= 108 {
        return None;
    }
    let mut sa = vec![0u8; 2 + p.len() + 1];
    sa[..2].copy_from_slice(&(AF_UNIX as u16).to_ne_bytes());
    sa[2..2 + p.len()].copy_from_slice(p);
    Some(sa)
}

/// One datagram (up to `buf.len()`) and every descriptor it carries, without waiting:
/// `None` when nothing is queued, a length of 0 and no descriptors when the peer is gone.
pub fn recv_with_fds_nowait(sock: c_int, buf: &mut [u8]) -> io::Result<Option<(usize, Vec<c_int>)>> {
    let mut iov = IoVec { base: buf.as_mut_ptr().cast(), len: buf.len() };
    let mut ctl = [0u64; CONTROL_LEN / 8];
    let mut m = MsgHdr {
        name: std::ptr::null_mut(),
        namelen: 0,
        iov: &mut iov,
        iovlen: 1,
        control: ctl.as_mut_ptr().cast(),
        controllen: CONTROL_LEN,
        flags: 0,
    };
    // SAFETY: `m` points at live buffers for the duration of the call.
    let n = unsafe { crate::real::recvmsg(sock, &mut m, MSG_CMSG_CLOEXEC | MSG_DONTWAIT) };
    if n < 0 {
        return match errno() {
            EAGAIN | EINTR => Ok(None),
            e => Err(io::Error::from_raw_os_error(e)),
        };
    }
    let ctl_bytes: &[u8] =
        // SAFETY: `ctl` is CONTROL_LEN initialized bytes.
        unsafe { std::slice::from_raw_parts(ctl.as_ptr().cast::<u8>(), m.controllen.min(CONTROL_LEN)) };
    Ok(Some((n as usize, rights(ctl_bytes))))
}

/// Takes up to `buf.len()` bytes off unix stream socket `fd` without waiting, with room
/// for every descriptor a message can carry. Returns how many bytes (`None` when nothing
/// could be read) and every descriptor that came, the caller's to let go
/// ([`crate::foreign::recv_releasing`]).
pub fn recv_nowait_with_rights(fd: c_int, buf: &mut [u8]) -> (Option<usize>, Vec<c_int>) {
    if sandboxed() {
        // A `read` once `poll` says bytes wait (descriptors queued with them, which a
        // kernel before 6.16 lets a peer send, are released by the kernel then).
        if !ready_now(fd, POLLIN) {
            return (None, Vec::new());
        }
        // SAFETY: reads into a live buffer.
        let n = unsafe { crate::real::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        return ((n >= 0).then_some(n as usize), Vec::new());
    }
    let mut iov = IoVec { base: buf.as_mut_ptr().cast(), len: buf.len() };
    let mut ctl = [0u64; CONTROL_LEN / 8];
    let mut m = MsgHdr {
        name: std::ptr::null_mut(),
        namelen: 0,
        iov: &mut iov,
        iovlen: 1,
        control: ctl.as_mut_ptr().cast(),
        controllen: CONTROL_LEN,
        flags: 0,
    };
    // SAFETY: `m` points at live buffers for the duration of the call.
    let n = unsafe { crate::real::recvmsg(fd, &mut m, MSG_DONTWAIT | MSG_CMSG_CLOEXEC) };
    let mut fds = Vec::new();
    if m.controllen > 0 {
        let ctl_bytes: &[u8] =
            // SAFETY: `ctl` is CONTROL_LEN initialized bytes.
            unsafe { std::slice::from_raw_parts(ctl.as_ptr().cast::<u8>(), m.controllen.min(CONTROL_LEN)) };
        fds = rights(ctl_bytes);
    }
    ((n >= 0).then_some(n as usize), fds)
}

const EPOLL_CTL_ADD: c_int = 1;
const EPOLL_CTL_DEL: c_int = 2;

/// A new epoll instance of the library's own (close-on-exec, among the high descriptors).
pub fn epoll_create() -> c_int {
    // SAFETY: no pointers.
    let fd = unsafe { crate::real::epoll_create1(O_CLOEXEC) };
    if fd < 0 { fd } else { move_high(fd) }
}

/// `struct epoll_event`: packed on x86_64 (events, then data at 4), 16 bytes elsewhere.
#[cfg(target_arch = "x86_64")]
pub const EPOLL_EVENT: (usize, usize) = (12, 4);
#[cfg(not(target_arch = "x86_64"))]
pub const EPOLL_EVENT: (usize, usize) = (16, 8);

/// An epoll event of `events` carrying `data`.
pub fn epoll_event(events: u32, data: u64) -> [u8; 16] {
    let mut ev = [0u8; 16];
    ev[..4].copy_from_slice(&events.to_ne_bytes());
    ev[EPOLL_EVENT.1..EPOLL_EVENT.1 + 8].copy_from_slice(&data.to_ne_bytes());
    ev
}

/// Watches `fd` for input on epoll instance `epfd` (its number is the event's data).
pub fn epoll_add(epfd: c_int, fd: c_int) -> bool {
    let mut ev = epoll_event(POLLIN as u32, fd as u64);
    // SAFETY: a complete epoll_event.
    unsafe { crate::real::epoll_ctl(epfd, EPOLL_CTL_ADD, fd, ev.as_mut_ptr().cast()) == 0 }
}

const EPOLLONESHOT: u32 = 1 << 30;
const EPOLL_CTL_MOD: c_int = 3;

/// Watches `fd` for input on `epfd` once: after it fires, until [`epoll_rearm`].
pub fn epoll_add_oneshot(epfd: c_int, fd: c_int) -> bool {
    let mut ev = epoll_event(POLLIN as u32 | EPOLLONESHOT, fd as u64);
    // SAFETY: a complete epoll_event.
    unsafe { crate::real::epoll_ctl(epfd, EPOLL_CTL_ADD, fd, ev.as_mut_ptr().cast()) == 0 }
}

/// Watches `fd` (added with [`epoll_add_oneshot`]) once more.
pub fn epoll_rearm(epfd: c_int, fd: c_int) {
    let mut ev = epoll_event(POLLIN as u32 | EPOLLONESHOT, fd as u64);
    // SAFETY: a complete epoll_event.
    unsafe { crate::real::epoll_ctl(epfd, EPOLL_CTL_MOD, fd, ev.as_mut_ptr().cast()) };
}

/// Stops watching `fd`.
pub fn epoll_del(epfd: c_int, fd: c_int) {
    let mut ev = [0u8; 16];
    // SAFETY: a complete (ignored) epoll_event.
    unsafe { crate::real::epoll_ctl(epfd, EPOLL_CTL_DEL, fd, ev.as_mut_ptr().cast()) };
}

/// The data of the events ready on `epfd` (up to 64 and `out.len()`), waiting at most
/// `timeout_ms`; how many.
pub fn epoll_ready(epfd: c_int, out: &mut [u64], timeout_ms: i32) -> usize {
    let (len, at) = EPOLL_EVENT;
    let max = out.len().min(64);
    let mut evs = [0u8; 64 * 16];
    // SAFETY: room for `max` events.
    let n = unsafe { crate::real::epoll_wait(epfd, evs.as_mut_ptr().cast(), max as c_int, timeout_ms) };
    let n = (n.max(0) as usize).min(max);
    for (i, o) in out.iter_mut().enumerate().take(n) {
        let e = &evs[i * len..(i + 1) * len];
        *o = u64::from_ne_bytes(e[at..at + 8].try_into().unwrap_or_default());
    }
    n
}

/// Reads a `struct sockaddr` of `len` bytes.
///
/// # Safety
/// `sa` must point to `len` readable bytes.
pub unsafe fn sockaddr_to(sa: *const c_void, len: u32) -> Option<SocketAddr> {
    if sa.is_null() || len < 2 {
        return None;
    }
    // SAFETY: at least 2 bytes, per the caller.
    let b = unsafe { std::slice::from_raw_parts(sa.cast::<u8>(), len as usize) };
    let fam = u16::from_ne_bytes([b[0], b[1]]) as c_int;
    match fam {
        AF_INET if b.len() >= 8 => {
            let port = u16::from_be_bytes([b[2], b[3]]);
            Some(SocketAddr::new(IpAddr::V4(Ipv4Addr::new(b[4], b[5], b[6], b[7])), port))
        }
        AF_INET6 if b.len() >= 24 => {
            let port = u16::from_be_bytes([b[2], b[3]]);
            let ip: [u8; 16] = b[8..24].try_into().ok()?;
            let v6 = Ipv6Addr::from(ip);
            // A v4-mapped address is the IPv4 address a dual-stack socket talks to.
            let ip = v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4);
            Some(SocketAddr::new(ip, port))
        }
        _ => None,
    }
}

/// The local or peer address of socket `fd`.
pub fn sock_addr(fd: c_int, peer: bool) -> Option<SocketAddr> {
    let mut buf = [0u8; 128];
    let mut len: u32 = 128;
    // SAFETY: `buf` has `len` bytes.
    let r = unsafe {
        if peer {
            crate::real::getpeername(fd, buf.as_mut_ptr().cast(), &mut len)
        } else {
            crate::real::getsockname(fd, buf.as_mut_ptr().cast(), &mut len)
        }
    };
    if r < 0 {
        return None;
    }
    // SAFETY: the kernel wrote `len` bytes.
    unsafe { sockaddr_to(buf.as_ptr().cast(), len) }
}

/// An integer socket option.
pub fn sockopt_int(fd: c_int, level: c_int, name: c_int) -> Option<c_int> {
    let mut v: c_int = 0;
    let mut len: u32 = 4;
    // SAFETY: `v` has 4 bytes.
    let r = unsafe { crate::real::getsockopt(fd, level, name, (&mut v as *mut c_int).cast(), &mut len) };
    (r == 0).then_some(v)
}

/// True for a TCP socket that has not begun a connection (its state is CLOSE), in one
/// system call: only a TCP socket answers `TCP_INFO`. A second `connect` on a socket that
/// has begun one asks how the first went (as a non-blocking program's event loop does).
pub fn tcp_unstarted(fd: c_int) -> bool {
    const IPPROTO_TCP: c_int = 6;
    const TCP_INFO: c_int = 11;
    const TCP_CLOSE: u8 = 7;
    // The first bytes of `struct tcp_info`: the state is the first.
    sockopt_int(fd, IPPROTO_TCP, TCP_INFO).is_some_and(|v| v.to_ne_bytes()[0] == TCP_CLOSE)
}

/// Sets an integer socket option.
pub fn set_sockopt_int(fd: c_int, level: c_int, name: c_int, v: c_int) {
    // SAFETY: `v` has 4 bytes.
    unsafe { crate::real::setsockopt(fd, level, name, (&v as *const c_int).cast(), 4) };
}

pub const SO_RCVTIMEO: c_int = 20;
pub const SO_SNDTIMEO: c_int = 21;

/// A socket's receive or send timeout (`SO_RCVTIMEO`/`SO_SNDTIMEO`) in milliseconds for
/// `poll`: -1 when none is set.
pub fn timeout_ms(fd: c_int, name: c_int) -> i32 {
    let mut tv = [0i64; 2];
    let mut len: u32 = 16;
    // SAFETY: `tv` is a struct timeval.
    let r = unsafe { crate::real::getsockopt(fd, SOL_SOCKET, name, tv.as_mut_ptr().cast(), &mut len) };
    if r != 0 || (tv[0] == 0 && tv[1] == 0) {
        return -1;
    }
    tv[0].saturating_mul(1000).saturating_add(tv[1] / 1000).clamp(1, i32::MAX as i64) as i32
}

/// The inode of the calling thread's network namespace.
pub fn netns_inode() -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/thread-self/ns/net").map(|m| m.ino()).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptors_in_every_rights_message_are_found() {
        let mut ctl = Vec::new();
        // SCM_CREDENTIALS first (level 1, type 2: 12 bytes of data), then SCM_RIGHTS with two.
        ctl.extend_from_slice(&28u64.to_ne_bytes());
        ctl.extend_from_slice(&SOL_SOCKET.to_ne_bytes());
        ctl.extend_from_slice(&2i32.to_ne_bytes());
        ctl.extend_from_slice(&[0u8; 12]);
        ctl.extend_from_slice(&[0u8; 4]); // padding to 8
        ctl.extend_from_slice(&24u64.to_ne_bytes());
        ctl.extend_from_slice(&SOL_SOCKET.to_ne_bytes());
        ctl.extend_from_slice(&SCM_RIGHTS.to_ne_bytes());
        ctl.extend_from_slice(&7i32.to_ne_bytes());
        ctl.extend_from_slice(&9i32.to_ne_bytes());
        assert_eq!(rights(&ctl), vec![7, 9]);
        assert_eq!(rights(&ctl[..20]), Vec::<c_int>::new(), "a cut message is not read past its end");
        let mut bad = ctl.clone();
        bad[..8].copy_from_slice(&4u64.to_ne_bytes());
        assert_eq!(rights(&bad), Vec::<c_int>::new(), "a length below a header stops the walk");
    }

    #[test]
    fn a_range_is_closed_around_the_library_s_descriptors() {
        // Descriptors 704–839 (across three words of the bitmap, the middle one without a
        // mark: skipped whole; below a soft limit of 1024), two of them the library's.
        let ours = [705, 839];
        // SAFETY: duplicates of this test's standard error, at numbers nothing else uses.
        unsafe {
            for fd in 704..840 {
                assert_eq!(crate::real::dup2(2, fd), fd);
            }
        }
        ours.iter().for_each(|&fd| {
            own(fd);
        });
        assert_eq!(close_range_but_ours(704, 839, 0), 0);
        // SAFETY: F_GETFD only reads a descriptor's flags.
        let open: Vec<c_int> = (704..840).filter(|&fd| unsafe { crate::real::fcntl(fd, F_GETFD, 0) } >= 0).collect();
        assert_eq!(open, ours);
        ours.iter().for_each(|&fd| close(fd));
        assert!(!is_own(705));
    }
}

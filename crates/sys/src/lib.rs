//! Thin wrappers around the Linux system calls sluice needs and the standard library does
//! not offer: TUN/TAP ioctls, epoll, eventfd, network-namespace switching. Every `unsafe`
//! block of the daemon lives here, each with its SAFETY note.

pub mod epoll;
pub mod error;

pub use error::Error;
pub mod fs;
pub mod link;
pub mod names;
pub mod netns;
pub mod notify;
pub mod packet;
pub mod paths;
pub mod proc;
pub mod time;
pub mod tun;
pub mod udp;
pub mod user;

use std::io;

/// Turns a libc return value into an `io::Result`, reading errno on -1.
pub(crate) fn cvt<T: PartialOrd + Default>(ret: T) -> io::Result<T> {
    if ret < T::default() { Err(io::Error::last_os_error()) } else { Ok(ret) }
}

/// Sets the scheduling niceness of the calling thread (Linux applies `setpriority` per
/// thread when given a thread id).
pub fn set_thread_nice(nice: i32) -> io::Result<()> {
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() };
    // SAFETY: setpriority on our own thread id; no pointers involved.
    cvt(unsafe { libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, nice) })?;
    Ok(())
}

/// Sends `sig` to process `pid`.
pub fn kill(pid: u32, sig: i32) -> io::Result<()> {
    // SAFETY: kill(2) has no memory-safety preconditions; the caller decides the target.
    cvt(unsafe { libc::kill(pid as libc::pid_t, sig) })?;
    Ok(())
}

/// Restores the default SIGPIPE action, so that printing into a closed pipe (`| head`) ends
/// the process quietly, as other command-line tools do, instead of a panic. Only for
/// commands whose remaining work is printing: the Rust runtime ignores SIGPIPE so that
/// socket writes fail with EPIPE instead, which the daemons rely on.
pub fn default_sigpipe() {
    // SAFETY: installs the default disposition for one signal; no handler code runs.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
}

/// Pins the calling thread (and the threads it starts later) to one CPU.
pub fn pin_to_cpu(cpu: usize) -> io::Result<()> {
    if cpu >= 8 * std::mem::size_of::<libc::cpu_set_t>() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("no CPU {cpu}")));
    }
    // SAFETY: cpu_set_t is plain data; zeroed is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: CPU_SET writes one bit inside `set`; `cpu` was checked against its size.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: a valid set of the size we pass, for the calling thread (pid 0).
    cvt(unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) })?;
    Ok(())
}

/// Set by [`catch_interrupts`]'s handler when SIGINT or SIGTERM arrives.
pub static INTERRUPTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

extern "C" fn on_interrupt(_: libc::c_int) {
    // Only an atomic store: async-signal-safe.
    INTERRUPTED.store(true, std::sync::atomic::Ordering::SeqCst);
}

/// Makes SIGINT and SIGTERM set [`INTERRUPTED`] instead of ending the process, so that a
/// long job can stop cleanly (remove what it made, keep what it measured).
pub fn catch_interrupts() {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: installs a handler that only stores to an atomic; `sa` is fully
        // initialized (zeroed, then handler and empty mask set).
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_interrupt as *const () as usize;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

/// The file `program` names, as the shell would find it on the PATH (a name with a `/` is
/// taken as it is).
pub fn which(program: &str) -> Option<std::path::PathBuf> {
    if program.contains('/') {
        return Some(std::path::PathBuf::from(program));
    }
    std::env::split_paths(&std::env::var_os("PATH")?).map(|d| d.join(program)).find(|p| p.is_file())
}

/// The credentials the kernel recorded for the peer of unix socket `s` when it connected:
/// (pid, uid).
pub fn peer_cred(s: &std::os::unix::net::UnixStream) -> io::Result<(i32, u32)> {
    use std::os::fd::AsRawFd;
    // SAFETY: ucred is plain data; all zeroes is a valid value.
    let mut c: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `c` and `len` are valid for writes of the sizes given; the descriptor is open.
    cvt(unsafe {
        libc::getsockopt(s.as_raw_fd(), libc::SOL_SOCKET, libc::SO_PEERCRED, (&raw mut c).cast(), &mut len)
    })?;
    Ok((c.pid, c.uid))
}

/// True when running as root (effective uid 0).
pub fn is_root() -> bool {
    user::euid() == 0
}

/// Blocks SIGINT and SIGTERM in the calling thread (and the threads it starts after this)
/// and runs `f` with the signal on a thread of its own when one arrives. Call it before
/// starting other threads, so that only the waiter receives them.
pub fn on_stop_signal(f: impl FnOnce(i32) + Send + 'static) -> io::Result<()> {
    // SAFETY: sigset operations on a local, initialized set; the mask is this thread's
    // and is inherited by the threads started after it.
    let set = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    };
    std::thread::Builder::new().name("signals".into()).spawn(move || {
        let mut sig = 0;
        // SAFETY: `set` is an initialized sigset; `sig` is a valid out-pointer.
        unsafe { libc::sigwait(&set, &mut sig) };
        f(sig);
    })?;
    Ok(())
}

/// CPU time (user + system) of the calling thread (`thread` true) or of the whole process,
/// in seconds, from /proc. 0 when it cannot be read.
pub fn cpu_seconds(thread: bool) -> f64 {
    let path = if thread { "/proc/thread-self/stat" } else { "/proc/self/stat" };
    std::fs::read_to_string(path).ok().and_then(|s| stat_cpu_seconds(&s)).unwrap_or(0.0)
}

/// utime + stime of a /proc stat line, in seconds (Linux counts them in USER_HZ, 100 a
/// second, whatever the kernel's own tick).
fn stat_cpu_seconds(stat: &str) -> Option<f64> {
    // The command name may hold spaces and parentheses: fields start after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let (utime, stime): (u64, u64) = (f.get(11)?.parse().ok()?, f.get(12)?.parse().ok()?);
    Some((utime + stime) as f64 / 100.0)
}

/// An ICMP datagram socket ("ping socket": the kernel fills in the echo identifier and
/// checksum), as a `UdpSocket`, which only sends and receives datagrams on it. The calling
/// thread's namespace's `net.ipv4.ping_group_range` must admit the caller's group.
pub fn ping_socket() -> io::Result<std::net::UdpSocket> {
    use std::os::fd::FromRawFd;
    // SAFETY: socket(2) with constant arguments; the descriptor is checked below.
    let fd = cvt(unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, libc::IPPROTO_ICMP) })?;
    // SAFETY: `fd` is a new datagram socket owned by nothing else; UdpSocket only sends
    // and receives datagrams on it, which an ICMP datagram socket takes.
    Ok(unsafe { std::net::UdpSocket::from_raw_fd(fd) })
}

#[cfg(test)]
mod tests {
    #[test]
    fn cpu_time_is_read_past_an_odd_command_name() {
        let line = "4242 (a (b) c) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 1 0 100 0 0";
        assert_eq!(super::stat_cpu_seconds(line), Some(3.25));
        assert_eq!(super::stat_cpu_seconds("garbage"), None);
        assert!(super::cpu_seconds(false) >= 0.0);
    }
}

//! CPU accounting from /proc, for the studies' guest / switch / other split.
//!
//! The studies report CPU per transaction (or per megabyte) in three parts:
//!
//! - **guest**: the bench client and server processes, user + system time of all their threads
//!   (`/proc/PID/stat` fields 14 and 15);
//! - **switch**: the sluice daemon on the path (one pid, all its threads);
//! - **other**: the whole host's busy time (`/proc/stat`, first line) minus the two above. Kernel
//!   work done in softirq context on behalf of anyone (the kernel's own forwarding paths, for
//!   example) lands here.
//!
//! Take a [`sample`] before and after the timed part of a run and [`split`] the two.
//!
//! Invariants and caveats:
//!
//! - All figures are CPU *seconds*, summed over CPUs: two cores busy for one second is 2.0.
//! - The kernel counts in clock ticks of `USER_HZ`, which is 100 on every Linux ABI (the kernel
//!   exports a fixed USER_HZ to userspace whatever its internal HZ), so the resolution is 10 ms
//!   per process and per CPU. Short runs are correspondingly coarse.
//! - Deltas are never negative: a counter that went backwards (a pid reused by another process)
//!   contributes 0, and `other` is clamped at 0 (process and host counters are sampled by
//!   different ticks and can disagree by a few ticks).
//! - A pid that cannot be read (it has exited, or never existed) is recorded in the sample's
//!   [`Sample::lost`] list and contributes nothing: a process that exits during a run counts what
//!   it had at its last successful read, i.e. at the start sample, so its time in the run falls
//!   into `other`. Callers should warn when `lost` is not empty.
//! - The time of a process's reaped children is not counted (fields 16 and 17 are ignored): pass
//!   the pids of the bench processes themselves.

use std::io;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::result::CpuSplit;

/// Clock ticks per second of the counters in /proc/stat and /proc/PID/stat.
///
/// This is USER_HZ, which the kernel fixes at 100 on every Linux architecture regardless of its
/// internal tick rate (`sysconf(_SC_CLK_TCK)` always answers 100), so it is a constant here rather
/// than a libc call.
const USER_HZ: f64 = 100.0;

/// The host-wide CPU statistics file.
const PROC_STAT: &str = "/proc/stat";

/// Why CPU accounting failed.
#[derive(Debug, thiserror::Error)]
pub enum CpuError {
    /// A /proc file could not be read.
    #[error("cannot read {path}: {source} (CPU accounting needs a Linux /proc mounted at /proc)")]
    Read {
        /// The file.
        path: String,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// The process does not exist (any more).
    #[error("process {pid} does not exist: it has exited, or the pid is wrong")]
    NoSuchProcess {
        /// The pid asked for.
        pid: u32,
    },
    /// A /proc file did not have the expected format.
    #[error(
        "cannot parse {path}: its format is not the one this kernel interface documents ({what}); please report this with the file's contents"
    )]
    Parse {
        /// The file.
        path: String,
        /// What was wrong.
        what: &'static str,
    },
}

/// Reads a /proc file to a string.
fn read_proc(path: &str) -> Result<String, io::Error> {
    std::fs::read_to_string(Path::new(path))
}

/// Reads `/proc/stat`, with the error naming it.
fn read_proc_stat() -> Result<String, CpuError> {
    read_proc(PROC_STAT).map_err(|source| CpuError::Read { path: PROC_STAT.to_string(), source })
}

/// The first line's counters of /proc/stat, in ticks: (busy, total).
///
/// busy = user + nice + system + irq + softirq + steal; total = busy + idle + iowait. `guest` and
/// `guest_nice` (fields 9 and 10) are already included in `user` and `nice` and are ignored.
/// Kernels older than 2.6.11 print fewer fields; missing trailing fields count as 0, but the four
/// original ones (user nice system idle) are required.
fn parse_proc_stat_ticks(text: &str) -> Option<(u64, u64)> {
    let line = text.lines().next()?;
    let mut fields = line.split_whitespace();
    if fields.next()? != "cpu" {
        return None;
    }
    let values: Vec<u64> = fields.take(8).map(|f| f.parse().ok()).collect::<Option<_>>()?;
    if values.len() < 4 {
        return None;
    }
    let at = |i: usize| values.get(i).copied().unwrap_or(0);
    let (user, nice, system, idle, iowait, irq, softirq, steal) =
        (at(0), at(1), at(2), at(3), at(4), at(5), at(6), at(7));
    let busy = user + nice + system + irq + softirq + steal;
    Some((busy, busy + idle + iowait))
}

/// Busy CPU seconds of the whole host since boot: user + nice + system + irq + softirq + steal from
/// the first line of /proc/stat (not idle or iowait; guest and guest_nice are already included in
/// user and nice and are not counted twice). Summed over CPUs.
pub fn host_busy_seconds() -> Result<f64, CpuError> {
    let text = read_proc_stat()?;
    parse_proc_stat(&text).ok_or(CpuError::Parse {
        path: PROC_STAT.to_string(),
        what: "its first line is not `cpu` followed by at least four numbers",
    })
}

/// Parses the text of /proc/stat into the host's busy CPU seconds (see [`host_busy_seconds`]).
/// `None` if the first line is not the aggregate `cpu` line with at least four numeric counters.
pub fn parse_proc_stat(text: &str) -> Option<f64> {
    parse_proc_stat_ticks(text).map(|(busy, _)| busy as f64 / USER_HZ)
}

/// Counts the per-CPU lines (`cpu0`, `cpu1`, …) of /proc/stat text: the online CPUs. `None` if
/// there are none.
pub fn parse_ncpus(text: &str) -> Option<usize> {
    let n = text
        .lines()
        .filter(|l| l.strip_prefix("cpu").and_then(|rest| rest.chars().next()).is_some_and(|c| c.is_ascii_digit()))
        .count();
    (n > 0).then_some(n)
}

/// Number of CPUs of the host: the `cpuN` lines of /proc/stat (the online CPUs, which is what its
/// first line sums over), else [`std::thread::available_parallelism`], else 1.
///
/// Note that in a container or under a CPU affinity mask `available_parallelism` may be smaller
/// than the host's count; /proc/stat is preferred because [`host_load`] measures the whole host.
pub fn ncpus() -> usize {
    read_proc(PROC_STAT)
        .ok()
        .and_then(|t| parse_ncpus(&t))
        .or_else(|| std::thread::available_parallelism().ok().map(|n| n.get()))
        .unwrap_or(1)
}

/// utime + stime of a process, all its threads (fields 14 and 15 of `/proc/PID/stat`), in seconds.
///
/// Fails with [`CpuError::NoSuchProcess`] if the process does not exist. A zombie (exited, not yet
/// reaped) still reads, with its final times.
pub fn process_seconds(pid: u32) -> Result<f64, CpuError> {
    let path = format!("/proc/{pid}/stat");
    let text = match read_proc(&path) {
        Ok(text) => text,
        // ESRCH: the process went away between open and read.
        Err(e) if e.kind() == io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ESRCH) => {
            return Err(CpuError::NoSuchProcess { pid });
        }
        Err(source) => return Err(CpuError::Read { path, source }),
    };
    parse_pid_stat(&text).ok_or(CpuError::Parse {
        path,
        what: "fields 14 and 15 (utime, stime) after `(comm)` are missing or not numbers",
    })
}

/// Parses the text of `/proc/PID/stat` (or `/proc/self/stat`) into utime + stime in seconds.
///
/// The second field, `(comm)`, may contain spaces and parentheses, so the fields are counted from
/// the *last* `)`. `None` if there is no `)` or fields 14 and 15 are missing or not numbers.
pub fn parse_pid_stat(text: &str) -> Option<f64> {
    let close = text.rfind(')')?;
    // After ")": field 3 (state) is index 0, so field N is index N - 3.
    let mut rest = text[close + 1..].split_whitespace().skip(14 - 3);
    let utime: u64 = rest.next()?.parse().ok()?;
    let stime: u64 = rest.next()?.parse().ok()?;
    Some((utime + stime) as f64 / USER_HZ)
}

/// utime + stime of the calling process, all its threads, in seconds, read from /proc/self/stat
/// (no getrusage).
pub fn self_seconds() -> Result<f64, CpuError> {
    let path = "/proc/self/stat";
    let text = read_proc(path).map_err(|source| CpuError::Read { path: path.to_string(), source })?;
    parse_pid_stat(&text).ok_or(CpuError::Parse {
        path: path.to_string(),
        what: "fields 14 and 15 (utime, stime) after `(comm)` are missing or not numbers",
    })
}

/// A snapshot of everything needed for a [`CpuSplit`]: the host's busy seconds and the CPU seconds
/// of each guest pid and of the switch pid, at one instant.
#[derive(Clone, Debug)]
pub struct Sample {
    /// Host busy seconds (see [`host_busy_seconds`]).
    host: f64,
    /// (pid, CPU seconds) of each guest process that could be read.
    guests: Vec<(u32, f64)>,
    /// (pid, CPU seconds) of the switch daemon, if asked for and readable.
    switch: Option<(u32, f64)>,
    /// Pids asked for that could not be read (they do not exist).
    lost: Vec<u32>,
    /// When the sample was taken.
    at: Instant,
}

impl Sample {
    /// Host busy CPU seconds at the sample.
    pub fn host_seconds(&self) -> f64 {
        self.host
    }

    /// (pid, CPU seconds) of each guest process read.
    pub fn guests(&self) -> &[(u32, f64)] {
        &self.guests
    }

    /// (pid, CPU seconds) of the switch daemon, if one was asked for and could be read.
    pub fn switch(&self) -> Option<(u32, f64)> {
        self.switch
    }

    /// Pids (guest or switch) that could not be read because they do not exist: they contribute
    /// nothing to a [`split`] that uses this sample, and their time falls into `other`.
    pub fn lost(&self) -> &[u32] {
        &self.lost
    }

    /// When the sample was taken.
    pub fn at(&self) -> Instant {
        self.at
    }
}

/// Reads one pid for a sample: `Ok(None)` (and the pid noted as lost) if it does not exist.
fn read_pid(pid: u32, lost: &mut Vec<u32>) -> Result<Option<f64>, CpuError> {
    match process_seconds(pid) {
        Ok(s) => Ok(Some(s)),
        Err(CpuError::NoSuchProcess { .. }) => {
            if !lost.contains(&pid) {
                lost.push(pid);
            }
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// Takes a sample. `guest_pids` are the bench processes on this host (the client itself, the
/// servers whose pids are known); `switch_pid` is the sluice daemon.
///
/// A pid that does not exist is not an error: it is recorded in [`Sample::lost`] and contributes 0
/// (see the module doc). Duplicate guest pids are counted once, and a guest pid equal to
/// `switch_pid` is counted as the switch only. Fails if /proc/stat or an existing process's stat
/// cannot be read or parsed.
pub fn sample(guest_pids: &[u32], switch_pid: Option<u32>) -> Result<Sample, CpuError> {
    let mut lost = Vec::new();
    let mut guests: Vec<(u32, f64)> = Vec::with_capacity(guest_pids.len());
    for &pid in guest_pids {
        if Some(pid) == switch_pid || guests.iter().any(|&(p, _)| p == pid) || lost.contains(&pid) {
            continue;
        }
        if let Some(s) = read_pid(pid, &mut lost)? {
            guests.push((pid, s));
        }
    }
    let switch = match switch_pid {
        Some(pid) => read_pid(pid, &mut lost)?.map(|s| (pid, s)),
        None => None,
    };
    let host = host_busy_seconds()?;
    Ok(Sample { host, guests, switch, lost, at: Instant::now() })
}

/// The non-negative growth of a pid's CPU seconds between two samples; 0 unless it was read in both.
fn pid_delta(start: &[(u32, f64)], pid: u32, end_s: f64) -> f64 {
    start.iter().find(|&&(p, _)| p == pid).map_or(0.0, |&(_, s)| (end_s - s).max(0.0))
}

/// The CPU split between two samples: guest and switch are the growth of their pids' times (pids
/// read in both samples only), other = host growth − guest − switch, clamped at 0.
pub fn split(start: &Sample, end: &Sample) -> CpuSplit {
    let guest_s: f64 = end.guests.iter().map(|&(pid, s)| pid_delta(&start.guests, pid, s)).sum();
    let switch_s = match (start.switch, end.switch) {
        (Some((p0, s0)), Some((p1, s1))) if p0 == p1 => (s1 - s0).max(0.0),
        _ => 0.0,
    };
    let host_s = (end.host - start.host).max(0.0);
    let other_s = (host_s - guest_s - switch_s).max(0.0);
    CpuSplit { guest_s, switch_s, other_s }
}

/// The fraction (0.0 to 1.0) of all the host's CPUs that were busy over the next `over`: sleeps
/// for `over` and compares /proc/stat before and after. Used to warn "the host is busy: N% of CPU
/// in use before the run". Returns 0.0 if no tick elapsed (an `over` shorter than 10 ms).
pub fn host_load(over: Duration) -> Result<f64, CpuError> {
    let read = || -> Result<(u64, u64), CpuError> {
        let text = read_proc_stat()?;
        parse_proc_stat_ticks(&text).ok_or(CpuError::Parse {
            path: PROC_STAT.to_string(),
            what: "its first line is not `cpu` followed by at least four numbers",
        })
    };
    let (busy0, total0) = read()?;
    std::thread::sleep(over);
    let (busy1, total1) = read()?;
    Ok(load_fraction((busy0, total0), (busy1, total1)))
}

/// Busy fraction between two (busy, total) tick readings, in [0, 1].
fn load_fraction((busy0, total0): (u64, u64), (busy1, total1): (u64, u64)) -> f64 {
    let total = total1.saturating_sub(total0);
    if total == 0 {
        return 0.0;
    }
    (busy1.saturating_sub(busy0) as f64 / total as f64).clamp(0.0, 1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PROC_STAT_TEXT: &str = "\
cpu  131246 7 151580 775594 1067 3 28904 616 500 20
cpu0 61328 0 76882 391323 169 0 14808 327 0 0
cpu1 69917 7 74697 384271 898 3 14095 289 500 20
intr 123456 0 9 0 0
ctxt 9876543
btime 1700000000
processes 22000
procs_running 2
procs_blocked 0
softirq 456 0 1 2 3 4 5 6 7 8 9
";

    #[test]
    fn proc_stat_busy_excludes_idle_iowait_and_guest() {
        // user 131246 + nice 7 + system 151580 + irq 3 + softirq 28904 + steal 616
        let busy = 131246 + 7 + 151580 + 3 + 28904 + 616;
        assert_eq!(parse_proc_stat(PROC_STAT_TEXT), Some(busy as f64 / 100.0));
        assert_eq!(parse_proc_stat_ticks(PROC_STAT_TEXT), Some((busy, busy + 775594 + 1067)));
    }

    #[test]
    fn proc_stat_old_kernel_with_four_fields() {
        assert_eq!(parse_proc_stat("cpu  100 20 30 4000\ncpu0 100 20 30 4000\n"), Some(1.5));
    }

    #[test]
    fn proc_stat_rejects_malformed() {
        assert_eq!(parse_proc_stat(""), None);
        assert_eq!(parse_proc_stat("cpu0 1 2 3 4 5 6 7 8\n"), None);
        assert_eq!(parse_proc_stat("intr 1 2 3\ncpu 1 2 3 4\n"), None);
        assert_eq!(parse_proc_stat("cpu  1 2 3\n"), None);
        assert_eq!(parse_proc_stat("cpu  1 2 x 4 5 6 7 8\n"), None);
    }

    #[test]
    fn ncpus_from_proc_stat_text() {
        assert_eq!(parse_ncpus(PROC_STAT_TEXT), Some(2));
        assert_eq!(parse_ncpus("cpu  1 2 3 4\n"), None);
        assert!(ncpus() >= 1);
    }

    #[test]
    fn pid_stat_plain_comm() {
        let text = "21964 (cat) R 21949 21949 21346 0 -1 4194304 98 0 0 0 250 75 3 4 20 0 1 0 549698 3133440 \
                    350 18446744073709551615 94245386817536 94245386837417 140723457936240 0 0 0 0 0 0 0 0 0 17 0 \
                    0 0 0 0 0\n";
        assert_eq!(parse_pid_stat(text), Some(3.25));
    }

    #[test]
    fn pid_stat_comm_with_spaces_and_parentheses() {
        // fields 14 and 15 are 1234 and 66; the cutime/cstime after them (999 999) are not counted.
        let text = "4242 (sluice (x) y) S 1 4242 4242 0 -1 4194560 1000 0 0 0 1234 66 999 999 20 0 5 0 100 \
                    123456789 2000 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0\n";
        assert_eq!(parse_pid_stat(text), Some(13.0));
        // A comm that ends with ") " followed by a number must not shift the fields.
        let tricky = "7 (a) 1 2 3) R 1 7 7 0 -1 0 0 0 0 0 10 20 0 0 20 0 1 0 5 0 0\n";
        assert_eq!(parse_pid_stat(tricky), Some(0.3));
    }

    #[test]
    fn pid_stat_rejects_malformed() {
        assert_eq!(parse_pid_stat(""), None);
        assert_eq!(parse_pid_stat("1 cat R 1 2 3 4 5 6 7 8 9 10 11 12 13"), None);
        assert_eq!(parse_pid_stat("1 (cat) R 1 1 1 0 -1 0 0 0 0 0 10"), None);
        assert_eq!(parse_pid_stat("1 (cat) R 1 1 1 0 -1 0 0 0 0 0 x 10"), None);
    }

    #[test]
    fn load_fraction_bounds() {
        assert_eq!(load_fraction((100, 1000), (150, 1100)), 0.5);
        assert_eq!(load_fraction((100, 1000), (100, 1000)), 0.0);
        assert_eq!(load_fraction((100, 1000), (90, 1100)), 0.0);
    }

    fn sample_of(host: f64, guests: &[(u32, f64)], switch: Option<(u32, f64)>, lost: &[u32]) -> Sample {
        Sample { host, guests: guests.to_vec(), switch, lost: lost.to_vec(), at: Instant::now() }
    }

    #[test]
    fn split_of_literal_samples() {
        let start = sample_of(100.0, &[(10, 1.0), (11, 2.0)], Some((20, 5.0)), &[]);
        let end = sample_of(110.0, &[(10, 3.0), (11, 2.5)], Some((20, 6.0)), &[]);
        let s = split(&start, &end);
        assert!((s.guest_s - 2.5).abs() < 1e-9);
        assert!((s.switch_s - 1.0).abs() < 1e-9);
        assert!((s.other_s - 6.5).abs() < 1e-9);
    }

    #[test]
    fn split_with_lost_and_reused_pids() {
        // Pid 11 exited before the end sample: it keeps its start value (contributes 0).
        // Pid 12 was missing at the start: contributes 0. Pid 10 went backwards (reused): 0.
        let start = sample_of(100.0, &[(10, 9.0), (11, 2.0)], None, &[12]);
        let end = sample_of(101.0, &[(10, 1.0), (12, 4.0)], None, &[11]);
        let s = split(&start, &end);
        assert_eq!(s, CpuSplit { guest_s: 0.0, switch_s: 0.0, other_s: 1.0 });
        // Processes counted more than the host (tick skew): other clamps at 0.
        let start = sample_of(100.0, &[(10, 1.0)], Some((20, 1.0)), &[]);
        let end = sample_of(100.5, &[(10, 1.4)], Some((20, 1.3)), &[]);
        let s = split(&start, &end);
        assert_eq!(s.other_s, 0.0);
        assert!((s.guest_s - 0.4).abs() < 1e-9 && (s.switch_s - 0.3).abs() < 1e-9);
    }

    /// Spins until this process has used `cpu_s` more CPU seconds (or 30 s of wall time pass).
    fn burn(cpu_s: f64) {
        let start = self_seconds().unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut x = 0u64;
        while self_seconds().unwrap() - start < cpu_s && Instant::now() < deadline {
            for i in 0..100_000u64 {
                x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(i));
            }
        }
        std::hint::black_box(x);
    }

    #[test]
    fn live_process_seconds_grows() {
        let me = std::process::id();
        let before = process_seconds(me).unwrap();
        burn(0.2);
        let after = process_seconds(me).unwrap();
        assert!(after - before >= 0.19, "before {before}, after {after}");
        assert!(self_seconds().unwrap() >= after);
        assert!(host_busy_seconds().unwrap() > 0.0);
    }

    #[test]
    fn live_missing_pid() {
        // Pids above the kernel's maximum (4194304) never exist.
        assert!(matches!(process_seconds(u32::MAX), Err(CpuError::NoSuchProcess { pid: u32::MAX })));
        let s = sample(&[u32::MAX], Some(u32::MAX - 1)).unwrap();
        assert_eq!(s.lost(), &[u32::MAX, u32::MAX - 1]);
        assert!(s.guests().is_empty() && s.switch().is_none());
    }

    #[test]
    fn live_split_attributes_busy_loop() {
        let me = std::process::id();
        let start = sample(&[me, me], None).unwrap();
        assert_eq!(start.guests().len(), 1, "duplicate guest pids are counted once");
        burn(0.3);
        let end = sample(&[me], None).unwrap();
        let s = split(&start, &end);
        assert!(s.guest_s >= 0.29, "{s:?}");
        assert_eq!(s.switch_s, 0.0);
        assert!(end.at() > start.at());

        // The same pid as the switch (and as a guest): counted as the switch only.
        let start = sample(&[me], Some(me)).unwrap();
        burn(0.1);
        let end = sample(&[me], Some(me)).unwrap();
        let s = split(&start, &end);
        assert!(s.switch_s >= 0.09 && s.guest_s == 0.0, "{s:?}");
    }

    #[test]
    fn live_host_load_in_range() {
        let load = host_load(Duration::from_millis(50)).unwrap();
        assert!((0.0..=1.0).contains(&load));
        assert_eq!(host_load(Duration::ZERO).map(|l| l <= 1.0).ok(), Some(true));
    }

    #[test]
    fn errors_name_the_file_and_the_fix() {
        let e = CpuError::Read { path: "/proc/stat".into(), source: io::Error::from(io::ErrorKind::PermissionDenied) };
        assert!(e.to_string().contains("/proc/stat") && e.to_string().contains("mounted"));
        assert!(CpuError::NoSuchProcess { pid: 7 }.to_string().contains("process 7"));
    }
}

//! How much a cell can be trusted: what the host did besides the cell while it ran
//! (docs/study.md, "How sure a study is").
//!
//! Two signs are recorded per cell, both over the cell's whole time (its condition started
//! and stopped included):
//!
//! - **steal**: the share of the CPUs' time the hypervisor gave to someone else
//!   (`/proc/stat`: steal ticks over all ticks);
//! - **others' CPU**: the share of the CPUs' time used by processes that are not the
//!   study's — not the study process or anything it started (switches, servers, tools),
//!   not a process in one of its namespaces, not a kernel thread (kernel threads do the
//!   paths' own softirq work). Counted from `/proc/PID/stat` as user + system time plus the
//!   time of reaped children, so a compiler that started and ended during the cell is
//!   counted in its parent: the sum over all other processes at the end minus the sum at
//!   the start is what they used in between.
//!
//! A cell is *trusted* when both stay under their limits ([`STEAL_LIMIT`],
//! [`OTHERS_LIMIT`]); a run is QUIET when every cell it measured is trusted. A cell
//! recorded before these signs existed has none: it is "not recorded", never trusted.

use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;

use serde::{Deserialize, Serialize};

/// Above this share of the CPUs' time stolen by the hypervisor, a cell is not trusted.
pub const STEAL_LIMIT: f64 = 0.02;
/// Above this share of the CPUs' time used by other processes, a cell is not trusted (on 2
/// CPUs: a fifth of one CPU).
pub const OTHERS_LIMIT: f64 = 0.10;
/// A process that is a kernel thread (`PF_KTHREAD` in `/proc/PID/stat`'s flags).
const PF_KTHREAD: u64 = 0x0020_0000;

/// What the host did besides the cell while it ran.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Noise {
    /// Seconds the window lasted.
    pub seconds: f64,
    /// Share (0–1) of all CPUs' time stolen by the hypervisor.
    pub steal: f64,
    /// Share (0–1) of all CPUs' time used by processes that are not the study's.
    pub others: f64,
}

impl Noise {
    /// Why the cell cannot be trusted, or `None` when it can.
    pub fn fault(&self) -> Option<String> {
        let mut why = Vec::new();
        if self.steal > STEAL_LIMIT {
            why.push(format!("steal {} (limit {})", pct(self.steal), pct(STEAL_LIMIT)));
        }
        if self.others > OTHERS_LIMIT {
            why.push(format!("others' CPU {} (limit {})", pct(self.others), pct(OTHERS_LIMIT)));
        }
        (!why.is_empty()).then(|| why.join(", "))
    }
}

/// A share as a percentage with one decimal ("2.5%").
pub fn pct(x: f64) -> String {
    format!("{:.1}%", x * 100.0)
}

/// How far a cell can be trusted.
#[derive(Clone, Debug, PartialEq)]
pub enum Trust {
    /// Both signs under their limits.
    Quiet,
    /// A sign over its limit: why.
    Noisy(String),
    /// A cell measured before the signs were recorded.
    NotRecorded,
}

impl Trust {
    /// Of a cell's record.
    pub fn of(n: Option<&Noise>) -> Trust {
        match n {
            None => Trust::NotRecorded,
            Some(n) => n.fault().map_or(Trust::Quiet, Trust::Noisy),
        }
    }
}

/// A run's verdict from its cells' noise.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    /// Every cell trusted.
    Quiet,
    /// Some cell not: why, in a sentence.
    Noisy(String),
    /// No cell of the run has the signs (measured by an older sluice), or none finished.
    NotRecorded,
}

impl Verdict {
    /// From the noise of every cell of one run.
    pub fn of(cells: &[Option<&Noise>]) -> Verdict {
        let recorded: Vec<&Noise> = cells.iter().flatten().copied().collect();
        if recorded.is_empty() {
            return Verdict::NotRecorded;
        }
        let missing = cells.len() - recorded.len();
        let noisy: Vec<&Noise> = recorded.iter().copied().filter(|n| n.fault().is_some()).collect();
        let mut why = Vec::new();
        if !noisy.is_empty() {
            let steal = noisy.iter().map(|n| n.steal).fold(0.0, f64::max);
            let others = noisy.iter().map(|n| n.others).fold(0.0, f64::max);
            let mut what = Vec::new();
            if steal > STEAL_LIMIT {
                what.push(format!("steal up to {} (limit {})", pct(steal), pct(STEAL_LIMIT)));
            }
            if others > OTHERS_LIMIT {
                what.push(format!("other processes' CPU up to {} (limit {})", pct(others), pct(OTHERS_LIMIT)));
            }
            why.push(format!("{} of {} cells measured while {}", noisy.len(), cells.len(), what.join(" and ")));
        }
        if missing > 0 {
            why.push(format!("{missing} cells without a noise record"));
        }
        if why.is_empty() { Verdict::Quiet } else { Verdict::Noisy(why.join("; ")) }
    }

    /// QUIET, NOISY or NOT RECORDED.
    pub fn word(&self) -> &'static str {
        match self {
            Verdict::Quiet => "QUIET",
            Verdict::Noisy(_) => "NOISY",
            Verdict::NotRecorded => "NOT RECORDED",
        }
    }
}

/// What the study owns, so that its CPU is not counted as the host's noise.
#[derive(Clone, Debug, Default)]
pub struct Ours {
    /// Processes (and their descendants) that are the study's: the study process itself,
    /// switches it did not start as children (Open vSwitch's daemons detach).
    pub pids: HashSet<u32>,
    /// Network namespaces (their inode numbers) whose processes are the study's.
    pub netns: HashSet<u64>,
}

impl Ours {
    /// This process, `pids` and the named namespaces (`ip netns` names; those that no
    /// longer exist are left out).
    pub fn new(pids: impl IntoIterator<Item = u32>, namespaces: impl IntoIterator<Item = String>) -> Ours {
        let mut o = Ours { pids: pids.into_iter().collect(), netns: HashSet::new() };
        o.pids.insert(std::process::id());
        for n in namespaces {
            if let Ok(m) = std::fs::metadata(sluice_sys::netns::path(&n)) {
                o.netns.insert(m.ino());
            }
        }
        o
    }
}

/// One process as the scan sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Proc {
    /// Its id.
    pub pid: u32,
    /// Its parent's.
    pub ppid: u32,
    /// utime + stime + cutime + cstime, in ticks.
    pub ticks: u64,
    /// A kernel thread.
    pub kernel: bool,
    /// Its network namespace's inode, when readable.
    pub netns: Option<u64>,
}

/// Reads one `/proc/PID/stat` line: (ppid, ticks, kernel thread).
pub fn parse_stat(text: &str) -> Option<(u32, u64, bool)> {
    // The command name may hold spaces and parentheses: fields start after the last ')'.
    let f: Vec<&str> = text[text.rfind(')')? + 1..].split_whitespace().collect();
    let n = |i: usize| f.get(i).and_then(|x| x.parse::<u64>().ok());
    let ppid = u32::try_from(n(1)?).ok()?;
    let flags = n(6)?;
    let ticks = n(11)? + n(12)? + n(13)? + n(14)?;
    Some((ppid, ticks, flags & PF_KTHREAD != 0))
}

/// Every process now.
pub fn scan() -> Vec<Proc> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    let mut out = Vec::new();
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        let Some((ppid, ticks, kernel)) = parse_stat(&text) else { continue };
        let netns = std::fs::metadata(format!("/proc/{pid}/ns/net")).ok().map(|m| m.ino());
        out.push(Proc { pid, ppid, ticks, kernel: kernel || pid == 2 || ppid == 2, netns });
    }
    out
}

/// Ticks of the processes in `procs` that are not `ours` (nor descendants of ours, nor in
/// our namespaces) and not kernel threads.
pub fn others_ticks(procs: &[Proc], ours: &Ours) -> u64 {
    let parent: std::collections::HashMap<u32, u32> = procs.iter().map(|p| (p.pid, p.ppid)).collect();
    let is_ours = |p: &Proc| {
        if p.netns.is_some_and(|n| ours.netns.contains(&n)) {
            return true;
        }
        // Up the parents, a bounded walk (a pid table has no cycles, but it is read
        // while it changes).
        let mut at = p.pid;
        for _ in 0..64 {
            if ours.pids.contains(&at) {
                return true;
            }
            match parent.get(&at) {
                Some(&pp) if pp > 1 && pp != at => at = pp,
                _ => return false,
            }
        }
        false
    };
    procs.iter().filter(|p| !p.kernel && !is_ours(p)).map(|p| p.ticks).sum()
}

/// `/proc/stat`'s first line: (steal, total) ticks.
pub fn parse_proc_stat(text: &str) -> Option<(u64, u64)> {
    let mut f = text.lines().next()?.split_whitespace();
    if f.next()? != "cpu" {
        return None;
    }
    let v: Vec<u64> = f.take(8).map(|x| x.parse().ok()).collect::<Option<_>>()?;
    if v.len() < 4 {
        return None;
    }
    let at = |i: usize| v.get(i).copied().unwrap_or(0);
    Some((at(7), v.iter().sum()))
}

fn proc_stat() -> (u64, u64) {
    std::fs::read_to_string("/proc/stat").ok().and_then(|t| parse_proc_stat(&t)).unwrap_or((0, 0))
}

/// A window being measured: [`Sampler::start`] before the cell, [`Sampler::finish`] after.
pub struct Sampler {
    ours: Ours,
    at: std::time::Instant,
    stat: (u64, u64),
    others: u64,
}

impl Sampler {
    /// Starts a window.
    pub fn start(ours: Ours) -> Sampler {
        let others = others_ticks(&scan(), &ours);
        Sampler { stat: proc_stat(), others, at: std::time::Instant::now(), ours }
    }

    /// Ends it.
    pub fn finish(self) -> Noise {
        let others = others_ticks(&scan(), &self.ours);
        let (steal1, total1) = proc_stat();
        share(self.stat, (steal1, total1), self.others, others, self.at.elapsed().as_secs_f64())
    }
}

/// The noise between two readings: `(steal, total)` ticks of `/proc/stat` and others'
/// ticks, at the start and the end of `seconds`.
pub fn share(stat0: (u64, u64), stat1: (u64, u64), others0: u64, others1: u64, seconds: f64) -> Noise {
    let total = stat1.1.saturating_sub(stat0.1);
    if total == 0 {
        return Noise { seconds, steal: 0.0, others: 0.0 };
    }
    let frac = |x: u64| (x as f64 / total as f64).clamp(0.0, 1.0);
    Noise { seconds, steal: frac(stat1.0.saturating_sub(stat0.0)), others: frac(others1.saturating_sub(others0)) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_are_read_after_the_last_parenthesis() {
        let line = "4242 (cc1 (a) b) R 4200 4242 4200 0 -1 4194304 10 0 0 0 150 30 7 3 20 0 1 0 100 0 0";
        assert_eq!(parse_stat(line), Some((4200, 150 + 30 + 7 + 3, false)));
        let kthread = "2 (kthreadd) S 0 0 0 0 -1 2129984 0 0 0 0 1 2 0 0 20 0 1 0 1 0 0";
        assert_eq!(parse_stat(kthread).map(|s| s.2), Some(true));
        assert_eq!(parse_stat("garbage"), None);
        let p = "cpu  910506 0 162695 117146 911 0 12430 1368 0 0\ncpu0 1 2 3 4\n";
        assert_eq!(parse_proc_stat(p), Some((1368, 910506 + 162695 + 117146 + 911 + 12430 + 1368)));
    }

    #[test]
    fn others_leave_out_the_study_its_descendants_its_namespaces_and_kernel_threads() {
        let p = |pid, ppid, ticks, kernel, netns| Proc { pid, ppid, ticks, kernel, netns };
        let procs = [
            p(1, 0, 5, false, Some(1)),      // init: not ours
            p(2, 0, 9, true, Some(1)),       // kthreadd
            p(100, 1, 40, false, Some(1)),   // the study
            p(101, 100, 30, false, Some(1)), // its switch
            p(102, 101, 20, false, Some(1)), // a grandchild
            p(200, 1, 1000, false, Some(1)), // someone's build
            p(300, 1, 7, false, Some(77)),   // a detached daemon in our namespace
            p(400, 2, 500, true, Some(1)),   // ksoftirqd
        ];
        let ours = Ours { pids: [100].into(), netns: [77].into() };
        assert_eq!(others_ticks(&procs, &ours), 5 + 1000);
    }

    #[test]
    fn shares_verdicts_and_trust() {
        let n = share((10, 1000), (30, 2000), 50, 250, 5.0);
        assert!((n.steal - 0.02).abs() < 1e-9 && (n.others - 0.2).abs() < 1e-9);
        assert_eq!(share((0, 5), (0, 5), 0, 9, 1.0).others, 0.0, "no tick passed");
        let quiet = Noise { seconds: 3.0, steal: 0.0, others: 0.01 };
        let busy = Noise { seconds: 3.0, steal: 0.0, others: 0.45 };
        let stolen = Noise { seconds: 3.0, steal: 0.05, others: 0.0 };
        assert_eq!(Trust::of(Some(&quiet)), Trust::Quiet);
        assert!(matches!(Trust::of(Some(&busy)), Trust::Noisy(w) if w.contains("others' CPU 45.0%")));
        assert!(matches!(Trust::of(Some(&stolen)), Trust::Noisy(w) if w.contains("steal 5.0%")));
        assert_eq!(Trust::of(None), Trust::NotRecorded);
        assert_eq!(Verdict::of(&[Some(&quiet), Some(&quiet)]), Verdict::Quiet);
        let v = Verdict::of(&[Some(&quiet), Some(&busy), Some(&stolen)]);
        assert_eq!(v.word(), "NOISY");
        assert!(
            matches!(&v, Verdict::Noisy(w) if w.contains("2 of 3 cells") && w.contains("steal up to 5.0%") && w.contains("up to 45.0%")),
            "{v:?}"
        );
        assert_eq!(Verdict::of(&[None, None]), Verdict::NotRecorded);
        assert!(matches!(Verdict::of(&[Some(&quiet), None]), Verdict::Noisy(w) if w.contains("1 cells without")));
        assert_eq!(Verdict::of(&[]), Verdict::NotRecorded);
    }

    #[test]
    fn a_scan_sees_this_process_and_counts_it_as_ours() {
        let procs = scan();
        let me = std::process::id();
        assert!(procs.iter().any(|p| p.pid == me && !p.kernel));
        let all = others_ticks(&procs, &Ours::default());
        let without_me = others_ticks(&procs, &Ours::new([], []));
        assert!(without_me <= all);
    }
}

//! What a study run keeps in its output directory: `study.json` ([`StudyFile`]: the
//! resolved study, the options and one entry per run) and `cells.jsonl` (one
//! [`CellRecord`] per finished cell), their records, and reading and writing them. Cells
//! written before conditions and noise were recorded still load: their condition is
//! `quiet`, their noise "not recorded".
//!
//! The study runs as root and writes there: the directory must be this user's (or root's)
//! and writable by nobody else, every directory above it passing the walk of `sys::fs`, so
//! no one can plant a link or a file for root to write through.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use crate::error::Result;
use serde::{Deserialize, Serialize};
use sluice_bench::result::RunResult;
use sluice_sys::bail;
use sluice_sys::error::{Context, Failure};

use super::conditions::{AttackRecord, Condition};
use super::noise::Noise;
use super::spec::{Family, Study};

/// How a study is run (from the command line; kept for a resume).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Options {
    /// Seconds per cell.
    pub duration_s: u32,
    /// Repetitions per cell.
    pub reps: u32,
    /// The comparison's baseline path.
    pub baseline: String,
    /// Pin clients to CPU 0 and servers to CPU 1.
    pub pin: bool,
    /// A `--quick` look.
    pub quick: bool,
    /// The study file, when the study came from one (not a built-in's name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
}

/// One run (the first, or a resume) of a study.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RunInfo {
    /// 1 for the first run, then one more per resume.
    pub run: u32,
    /// When it started (RFC 3339, UTC).
    pub started: String,
    /// The host it ran on.
    pub host: HostInfo,
    /// Paths skipped in this run, with the reason.
    pub skipped: Vec<(String, String)>,
}

/// Where the numbers came from.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct HostInfo {
    /// Host name.
    pub hostname: String,
    /// Online CPUs.
    pub cpus: usize,
    /// CPU model.
    pub cpu_model: String,
    /// Kernel release.
    pub kernel: String,
    /// sluice version.
    pub sluice: String,
    /// Fraction of all CPUs busy over a second before the run.
    pub load_before: f64,
    /// Open vSwitch's version, when the study has the ovs path and OVS is installed.
    #[serde(default)]
    pub ovs: String,
    /// One core's copy rate before the run (stream results are read as a share of it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub copy: Option<sluice_bench::copy::CopyRate>,
    /// The study's other builds of sluice, a line each (`builds`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub builds: Vec<String>,
}

/// `study.json`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct StudyFile {
    /// The study as resolved at the first run (profile texts included).
    pub study: Study,
    /// The options of the first run.
    pub options: Options,
    /// Every run so far.
    pub runs: Vec<RunInfo>,
}

/// What identifies a cell.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CellKey {
    /// Path.
    pub path: String,
    /// Workload name.
    pub workload: String,
    /// Connections.
    pub conns: u32,
    /// MTU.
    pub mtu: u16,
    /// Address family.
    pub family: Family,
    /// Repetition, from 1.
    pub rep: u32,
    /// What the host did meanwhile (cells of older studies: `quiet`).
    #[serde(default = "quiet")]
    pub condition: Condition,
}

fn quiet() -> Condition {
    Condition::Quiet
}

/// One line of `cells.jsonl`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CellRecord {
    /// The cell.
    #[serde(flatten)]
    pub key: CellKey,
    /// The run that measured it.
    pub run: u32,
    /// When it finished (RFC 3339, UTC).
    pub at: String,
    /// What the modeler measured.
    pub result: RunResult,
    /// What the path lost during the cell (partition-aggregate points).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drops: Option<PathDrops>,
    /// What the host did besides the cell (cells of older studies: none recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub noise: Option<Noise>,
    /// What the condition's attackers did (cells under a condition other than `quiet`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attack: Option<AttackRecord>,
    /// The switch daemon's memory and descriptors after the cell (paths with a daemon).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub daemon: Option<DaemonSample>,
}

/// What was lost on a path during one point (the counters' differences around it).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PathDrops {
    /// The sluice switch's drops by cause (sluice paths; causes with a count only).
    pub switch: BTreeMap<String, u64>,
    /// Times a sluice switch paused an input (lossless classes).
    pub pauses: u64,
    /// Pause watchdog trips.
    pub watchdog_trips: u64,
    /// Frames the kernel dropped on the path's interfaces, both directions: the guests'
    /// TAPs or veths, the bridge's ports, the kernel datapath's veth ends.
    pub interfaces: u64,
    /// TCP segments the guests retransmitted (`TcpRetransSegs`, the counter `nstat` shows).
    pub tcp_retrans: u64,
    /// Of those, segments the receiver reported it already had (`TcpExtTCPDSACKRecvSegs`):
    /// retransmissions that repaired no loss — reordering on the path taken for loss.
    #[serde(default)]
    pub tcp_spurious: u64,
}

impl PathDrops {
    /// Every switch drop, whatever its cause.
    pub fn switch_total(&self) -> u64 {
        self.switch.values().sum()
    }

    pub(crate) fn since(&self, before: &PathDrops) -> PathDrops {
        let mut switch = BTreeMap::new();
        for (k, &v) in &self.switch {
            let d = v.saturating_sub(before.switch.get(k).copied().unwrap_or(0));
            if d > 0 {
                switch.insert(k.clone(), d);
            }
        }
        PathDrops {
            switch,
            pauses: self.pauses.saturating_sub(before.pauses),
            watchdog_trips: self.watchdog_trips.saturating_sub(before.watchdog_trips),
            interfaces: self.interfaces.saturating_sub(before.interfaces),
            tcp_retrans: self.tcp_retrans.saturating_sub(before.tcp_retrans),
            tcp_spurious: self.tcp_spurious.saturating_sub(before.tcp_spurious),
        }
    }
}

/// Reads `cells.jsonl` (a torn last line, from a crash mid-write, is ignored).
pub fn load_cells(dir: &Path) -> Result<Vec<CellRecord>> {
    let p = dir.join("cells.jsonl");
    let text = match fs::read_to_string(&p) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(vec![]),
        Err(e) => return Err(Failure::new(format!("reading {}", p.display()), e).into()),
    };
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let mut out = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        match serde_json::from_str(l) {
            Ok(r) => out.push(r),
            Err(_) if i + 1 == lines.len() => {}
            Err(e) => bail!("{}:{}: not a cell record: {e}", p.display(), i + 1),
        }
    }
    Ok(out)
}

/// Reads `study.json`.
pub fn load_study_file(dir: &Path) -> Result<StudyFile> {
    let p = dir.join("study.json");
    let text = fs::read(&p).with_context(|| format!("{} is not a study directory (no study.json)", dir.display()))?;
    Ok(serde_json::from_slice(&text).with_context(|| format!("reading {}", p.display()))?)
}

/// Checks the output directory `dir`: reached by the walk of `sys::fs` (nothing on the way
/// someone else could swap), this user's or root's, and writable by its owner alone.
pub fn check_out_dir(dir: &Path) -> Result<sluice_sys::fs::Dir> {
    let d = sluice_sys::fs::Dir::open(dir, None).map_err(|e| sluice_sys::failure!("the study's directory: {e}"))?;
    let (uid, mode) = d.owner_mode();
    if !d.private() {
        bail!(
            "the study's directory {} can be written by others (mode {mode:04o}, owner uid {uid}); give --out a directory only you can write",
            dir.display()
        );
    }
    Ok(d)
}

/// Writes `study.json` atomically (in a directory [`check_out_dir`] accepts).
pub fn save_study_file(dir: &Path, f: &StudyFile) -> Result<()> {
    check_out_dir(dir)?;
    let tmp = dir.join(".study.json.tmp");
    fs::write(&tmp, serde_json::to_vec_pretty(f).context("writing study.json")?)?;
    fs::rename(&tmp, dir.join("study.json"))?;
    Ok(())
}

/// The switch daemon after a cell: its resident memory and open descriptors.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DaemonSample {
    /// Its process id (a resume starts new daemons: their series are apart).
    pub pid: u32,
    /// `VmRSS` of /proc/PID/status, in kB.
    pub rss_kb: u64,
    /// Entries of /proc/PID/fd.
    pub fds: u32,
}

impl DaemonSample {
    /// Reads process `pid`'s sample; `None` when it is gone or unreadable.
    pub fn read(pid: u32) -> Option<DaemonSample> {
        let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let rss_kb = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())?;
        let fds = fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u32;
        Some(DaemonSample { pid, rss_kb, fds })
    }
}

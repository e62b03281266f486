//! Walking a study's matrix: building paths, running cells interleaved across paths,
//! recording each finished cell at once, and resuming where a run stopped.
//!
//! The output directory holds `study.json` ([`StudyFile`]: the resolved study, the options
//! and one entry per run) and `cells.jsonl` (one [`CellRecord`] per finished cell, appended
//! and flushed as each cell ends). A cell already in `cells.jsonl` is never run again.
//!
//! The study runs as root and writes there: the directory must be this user's (or root's)
//! and writable by nobody else, every directory above it passing the walk of `sys::fs`, so
//! no one can plant a link or a file for root to write through. A profile a cell hands its
//! client goes into a new `mkdtemp` directory, never to a name derived from the process id.

use std::collections::HashSet;
use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use sluice_bench::client::{RunOptions, run};
use sluice_bench::report::Per;
use sluice_bench::result::RunResult;

use super::paths::{self, Topology};
use super::spec::{Family, Study, Workload};
use crate::sys::{INTERRUPTED, netns};

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
    pub drops: Option<super::pa::PathDrops>,
}

/// How a run ended.
pub enum Outcome {
    /// Every cell it could run was run.
    Complete,
    /// Stopped by a signal; `cells.jsonl` holds what finished.
    Interrupted,
}

/// What `execute` reports besides the outcome.
pub struct Executed {
    /// How it ended.
    pub outcome: Outcome,
    /// Paths that could not be built at some MTU, with the error (their cells did not run;
    /// a resume tries them again).
    pub unbuilt: Vec<(String, String)>,
}

/// The cells of a study, in the order they run (see the module doc and the architecture
/// notes): MTU-major (paths are built once per MTU), then repetition, workload,
/// connections and family, with the paths rotating one place per cell.
pub fn plan(study: &Study, paths: &[String], reps: u32) -> Vec<CellKey> {
    let mut cells = Vec::new();
    let mut turn = 0usize;
    for &mtu in &study.mtus {
        for rep in 1..=reps {
            for w in &study.workloads {
                for &conns in &study.conns {
                    // sockperf measures one connection: its cells at other counts are none.
                    if w.tool == Some(super::spec::Tool::Sockperf) && conns != 1 {
                        continue;
                    }
                    // A partition-aggregate point has one connection per worker, whatever
                    // `conns` says: one cell per point.
                    if w.pa.is_some() && conns != study.conns[0] {
                        continue;
                    }
                    let conns = if w.pa.is_some() { super::spec::PA_WORKERS } else { conns };
                    for &family in &study.families {
                        for i in 0..paths.len() {
                            let path = paths[(i + turn) % paths.len()].clone();
                            cells.push(CellKey { path, workload: w.name.clone(), conns, mtu, family, rep });
                        }
                        turn += 1;
                    }
                }
            }
        }
    }
    cells
}

/// Reads `cells.jsonl` (a torn last line, from a crash mid-write, is ignored).
pub fn load_cells(dir: &Path) -> Result<Vec<CellRecord>> {
    let p = dir.join("cells.jsonl");
    let text = match fs::read_to_string(&p) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(vec![]),
        Err(e) => return Err(e).with_context(|| format!("reading {}", p.display())),
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
    serde_json::from_slice(&text).with_context(|| format!("reading {}", p.display()))
}

/// Checks the output directory `dir`: reached by the walk of `sys::fs` (nothing on the way
/// someone else could swap), this user's or root's, and writable by its owner alone.
pub fn check_out_dir(dir: &Path) -> Result<crate::sys::fs::Dir> {
    let d = crate::sys::fs::Dir::open(dir, None).map_err(|e| anyhow::anyhow!("the study's directory: {e}"))?;
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
    fs::write(&tmp, serde_json::to_vec_pretty(f)?)?;
    fs::rename(&tmp, dir.join("study.json"))?;
    Ok(())
}

/// Now, as RFC 3339 UTC.
pub fn now_rfc3339() -> String {
    rfc3339(SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0))
}

/// A Unix time (seconds) as RFC 3339 UTC.
pub fn rfc3339(s: u64) -> String {
    let (days, rem) = (s / 86_400, s % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

/// Facts about this host for the report (`paths`: the study's paths that run).
pub fn host_info(paths: &[String]) -> HostInfo {
    let read = |p: &str| fs::read_to_string(p).unwrap_or_default().trim().to_string();
    let cpu_model = read("/proc/cpuinfo")
        .lines()
        .find_map(|l| l.strip_prefix("model name").and_then(|r| r.split_once(':')).map(|(_, v)| v.trim().to_string()))
        .unwrap_or_default();
    HostInfo {
        hostname: read("/proc/sys/kernel/hostname"),
        cpus: sluice_bench::cpu::ncpus(),
        cpu_model,
        kernel: read("/proc/sys/kernel/osrelease"),
        sluice: env!("CARGO_PKG_VERSION").into(),
        load_before: sluice_bench::cpu::host_load(Duration::from_secs(1)).unwrap_or(0.0),
        ovs: if paths.iter().any(|p| p == "ovs") { ovs_version() } else { String::new() },
    }
}

/// The first line of `ovs-vswitchd --version`, e.g. "ovs-vswitchd (Open vSwitch) 3.1.0".
fn ovs_version() -> String {
    std::process::Command::new("ovs-vswitchd")
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).lines().next().map(str::to_string))
        .unwrap_or_default()
}

/// Seconds of overhead per cell beyond its duration (connects, the drain, the CPU
/// samples), for the estimate before the first cell has run.
const CELL_OVERHEAD_S: f64 = 1.0;
/// Seconds to build one path, for the estimate.
const BUILD_S: f64 = 1.5;

/// Formats seconds as `1h02m`, `4m10s` or `12s`.
pub fn hms(s: f64) -> String {
    let s = s.max(0.0).round() as u64;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
    }
}

/// An estimate of the time `cells` take, with `npaths` paths built per MTU.
pub fn estimate(cells: &[CellKey], duration_s: u32, mtus: usize, npaths: usize) -> f64 {
    cells.len() as f64 * (f64::from(duration_s) + CELL_OVERHEAD_S) + (mtus * npaths) as f64 * BUILD_S
}

/// Runs every cell of `sf` not yet in `dir/cells.jsonl`, as run `run`.
pub fn execute(dir: &Path, sf: &StudyFile, run_no: u32, paths_here: &[String]) -> Result<Executed> {
    let study = &sf.study;
    let o = &sf.options;
    let done: HashSet<CellKey> = load_cells(dir)?.into_iter().map(|r| r.key).collect();
    let todo: Vec<CellKey> = plan(study, paths_here, o.reps).into_iter().filter(|c| !done.contains(c)).collect();
    let total = todo.len();
    if total == 0 {
        eprintln!("every cell already has a result");
        return Ok(Executed { outcome: Outcome::Complete, unbuilt: vec![] });
    }
    let mtus: HashSet<u16> = todo.iter().map(|c| c.mtu).collect();
    eprintln!(
        "{} cells to run ({} s each), about {} in all; Ctrl-C stops and keeps what finished",
        total,
        o.duration_s,
        hms(estimate(&todo, o.duration_s, mtus.len(), paths_here.len()))
    );
    let mut log = check_out_dir(dir)?
        .append(std::ffi::OsStr::new("cells.jsonl"), 0o644)
        .map_err(|e| anyhow::anyhow!("cannot record the cells: {e}"))?;

    // A watcher stops the bench servers when a signal arrives, so a cell in flight ends
    // at once (its connections fail) instead of running out its duration.
    let servers: Arc<Mutex<Vec<u32>>> = Arc::default();
    let stop_watch = Arc::new(AtomicBool::new(false));
    let watcher = {
        let (servers, stop_watch) = (servers.clone(), stop_watch.clone());
        std::thread::spawn(move || {
            while !stop_watch.load(Ordering::Relaxed) {
                if INTERRUPTED.load(Ordering::Relaxed) {
                    for &pid in servers.lock().unwrap_or_else(|p| p.into_inner()).iter() {
                        let _ = crate::sys::kill(pid, libc::SIGKILL);
                    }
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };

    let id = format!("sst{}", std::process::id());
    let started = Instant::now();
    let mut ran = 0usize;
    let mut outcome = Outcome::Complete;
    let mut failures = 0usize;
    let mut unbuilt = Vec::new();
    'mtus: for &mtu in &study.mtus {
        let cells: Vec<&CellKey> = todo.iter().filter(|c| c.mtu == mtu).collect();
        if cells.is_empty() {
            continue;
        }
        let needed: Vec<&String> = paths_here.iter().filter(|p| cells.iter().any(|c| &c.path == *p)).collect();
        let mut topos: Vec<Topology> = Vec::new();
        for (i, p) in needed.iter().enumerate() {
            eprintln!("building {p} at MTU {mtu}…");
            let workers = if study.has_pa() { super::spec::PA_WORKERS } else { 1 };
            match paths::build(p, &id, i, mtu, o.pin, workers) {
                Ok(t) => topos.push(t),
                Err(e) => {
                    eprintln!(
                        "warning: cannot build {p} at MTU {mtu}: {e:#}; its cells are skipped (a resume tries again)"
                    );
                    unbuilt.push(((*p).clone(), format!("MTU {mtu}: {e:#}")));
                }
            }
        }
        *servers.lock().unwrap_or_else(|p| p.into_inner()) = topos.iter().flat_map(|t| t.server_pids()).collect();
        for cell in cells {
            if INTERRUPTED.load(Ordering::Relaxed) {
                outcome = Outcome::Interrupted;
                break 'mtus;
            }
            let Some(topo) = topos.iter().find(|t| t.path == cell.path) else {
                ran += 1;
                continue;
            };
            let w = study.workloads.iter().find(|w| w.name == cell.workload).expect("planned from the study");
            let elapsed = started.elapsed().as_secs_f64();
            let left = if ran > 0 {
                elapsed / ran as f64 * (total - ran) as f64
            } else {
                estimate(&todo[ran..], o.duration_s, 0, 0)
            };
            eprint!(
                "[{:>w$}/{total}] {:>6} left  rep {}/{}  MTU {mtu}  {}  {} conn{}  {}  {:<20}",
                ran + 1,
                hms(left),
                cell.rep,
                o.reps,
                cell.workload,
                cell.conns,
                if cell.conns == 1 { "" } else { "s" },
                cell.family,
                cell.path,
                w = total.to_string().len()
            );
            let r = match w.pa {
                Some(point) => {
                    super::pa::run_point(topo, point, cell, o, super::pa::queries(study, o)).map(|(r, d)| (r, Some(d)))
                }
                None => run_cell(topo, w, cell, o).map(|r| (r, None)),
            };
            ran += 1;
            match r {
                Ok((result, drops)) => {
                    eprintln!("{}", summary(&result, drops.as_ref()));
                    let rec = CellRecord { key: cell.clone(), run: run_no, at: now_rfc3339(), result, drops };
                    let mut line = serde_json::to_string(&rec)?;
                    line.push('\n');
                    log.write_all(line.as_bytes()).context("writing cells.jsonl")?;
                    log.sync_data().context("writing cells.jsonl")?;
                }
                Err(_) if INTERRUPTED.load(Ordering::Relaxed) => {
                    eprintln!("interrupted");
                    outcome = Outcome::Interrupted;
                    break 'mtus;
                }
                Err(e) => {
                    failures += 1;
                    eprintln!("FAILED: {e:#}");
                }
            }
        }
        drop(topos);
    }
    stop_watch.store(true, Ordering::Relaxed);
    let _ = watcher.join();
    if failures > 0 && matches!(outcome, Outcome::Complete) {
        eprintln!("{failures} cell(s) failed; `sluice study resume {}` runs them again", dir.display());
    }
    Ok(Executed { outcome, unbuilt })
}

/// One line of what a cell measured.
fn summary(r: &RunResult, drops: Option<&super::pa::PathDrops>) -> String {
    if let (Some(c), Some(d)) = (r.completion, drops) {
        return format!(
            "{:>9.2} ms mean QCT, p99 {:.2} ms, {} queries; drops: switch {}, interfaces {}, TCP rtx {}",
            c.mean_us / 1000.0,
            c.p99_us / 1000.0,
            c.queries,
            d.switch_total(),
            d.interfaces,
            d.tcp_retrans
        );
    }
    match Per::for_volume(r.client.transactions, r.client.bytes_sent + r.client.bytes_received) {
        Per::Megabyte => format!("{:>10.1} MB/s", r.mb_per_s()),
        Per::Transaction => format!("{:>10.0} tx/s", r.tps()),
    }
}

/// Runs one cell: the workload from the client namespace against the path's server.
fn run_cell(topo: &Topology, w: &Workload, cell: &CellKey, o: &Options) -> Result<RunResult> {
    if let Some(tool) = w.tool {
        return super::tools::run(topo, tool, topo.server_addr(cell.family), cell.conns, o.duration_s);
    }
    let host = topo.server_addr(cell.family).to_string();
    let mut profile = if w.builtin {
        crate::bench::builtin_profile(&w.name, &w.text, &host)?
    } else {
        let env = |v: &str| std::env::var(v).ok();
        sluice_bench::profile::parse(&w.text, &w.source, &env)?
    };
    profile.set_remotehost(&host);
    profile.set_duration(Duration::from_secs(u64::from(o.duration_s)));
    profile.set_conns(cell.conns);
    let opts = RunOptions {
        server: crate::bench::host_port(&host, sluice_bench::control::DEFAULT_PORT),
        guest_pids: topo.server_pid().into_iter().collect(),
        switch_pid: topo.switch_pid,
        interval: None,
    };
    if topo.smc {
        return run_cell_smc(topo, w, cell, o, &host);
    }
    let pin = o.pin;
    let r = netns::run_in(Some(&topo.client_ns), move || {
        if pin {
            crate::sys::pin_to_cpu(0)?;
        }
        run(&profile, &opts).map_err(std::io::Error::other)
    })?;
    if !sluice_bench::report::counts_agree(&r) {
        bail!("client and server counts differ: {:?} vs {:?}", r.client, r.server);
    }
    Ok(r)
}

/// Runs a cell's client as `sluice smc run -- sluice bench run … --json` in the client
/// namespace (the preload library must be in the client process, which an in-process run
/// cannot be), and reads its result.
fn run_cell_smc(topo: &Topology, w: &Workload, cell: &CellKey, o: &Options, host: &str) -> Result<RunResult> {
    let _made;
    let profile = if w.builtin {
        w.name.clone()
    } else {
        let (dir, file) = write_profile(w)?;
        _made = dir;
        file.display().to_string()
    };
    let mut cmd = crate::smc::sluice_in(&topo.client_ns, o.pin.then_some(0), true)?;
    cmd.args(["bench", "run", "--to", host, "-m", &profile]);
    cmd.args(["--duration", &o.duration_s.to_string(), "--conns", &cell.conns.to_string(), "--json"]);
    if let Some(lab) = &topo.lab {
        cmd.args(["--switch", lab]);
    }
    let out =
        cmd.stdin(std::process::Stdio::null()).output().context("running the bench client under sluice smc run")?;
    if !out.status.success() {
        bail!("the bench client failed: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).context("reading the bench client's JSON")?;
    let r: RunResult = serde_json::from_value(v["results"][0].clone()).context("reading the bench client's result")?;
    if !sluice_bench::report::counts_agree(&r) {
        bail!("client and server counts differ: {:?} vs {:?}", r.client, r.server);
    }
    Ok(r)
}

/// Writes workload `w`'s profile into a new directory (removed when the first value is
/// dropped) and returns its path there.
fn write_profile(w: &Workload) -> Result<(crate::sys::fs::TempDir, PathBuf)> {
    let dir = crate::sys::fs::TempDir::new("sluice-study-profile").context("making a directory for a profile")?;
    let file = dir.path().join("profile.xml");
    fs::write(&file, &w.text).with_context(|| format!("writing {}", file.display()))?;
    Ok((dir, file))
}

/// A fresh output directory for `study`: `study-NAME-YYYYMMDD-HHMMSS` here.
pub fn default_out(study: &Study) -> PathBuf {
    let t = now_rfc3339().replace(['-', ':'], "");
    PathBuf::from(format!("study-{}-{}-{}", study.name, &t[..8], &t[9..15]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn study() -> Study {
        super::super::spec::parse(
            r#"name = "t"
baseline = "direct"
paths = ["direct", "linux-bridge", "router"]
workloads = ["rr-200x1000", "crr-64x8k"]
conns = [1, 10]
mtus = [1500, 9000]
families = ["ipv4", "ipv6"]
reps = 2
"#,
            "t.toml",
            Path::new("."),
        )
        .unwrap()
    }

    #[test]
    fn the_plan_covers_the_matrix_once_and_interleaves_paths() {
        let s = study();
        let cells = plan(&s, &s.paths, s.reps);
        assert_eq!(cells.len(), 3 * 2 * 2 * 2 * 2 * 2);
        let set: HashSet<_> = cells.iter().cloned().collect();
        assert_eq!(set.len(), cells.len(), "no cell twice");
        // Consecutive groups of three are one cell on each path, starting on a new path.
        for (i, g) in cells.chunks(3).enumerate() {
            let ps: HashSet<_> = g.iter().map(|c| &c.path).collect();
            assert_eq!(ps.len(), 3);
            assert_eq!(g[0].path, s.paths[i % 3]);
        }
        // MTU-major: all 1500 cells first.
        let first9000 = cells.iter().position(|c| c.mtu == 9000).unwrap();
        assert!(cells[first9000..].iter().all(|c| c.mtu == 9000));
    }

    #[test]
    fn dates_and_durations_print_plainly() {
        let t = now_rfc3339();
        assert_eq!(t.len(), 20, "{t}");
        assert!(t.starts_with("20") && t.ends_with('Z'));
        assert_eq!(hms(12.0), "12s");
        assert_eq!(hms(250.0), "4m10s");
        assert_eq!(hms(3720.0), "1h02m");
    }

    #[test]
    fn a_profile_is_written_where_nobody_planted_anything() {
        let w = Workload {
            name: "mine".into(),
            source: "mine.xml".into(),
            text: "<profile name=\"mine\"/>".into(),
            builtin: false,
            tool: None,
            pa: None,
        };
        // The name a cell once wrote to, taken first by a link to a file of root's.
        let old = std::env::temp_dir().join(format!("sluice-study-{}-{}.xml", std::process::id(), w.name));
        let target = crate::sys::fs::TempDir::new("sluice-unit").unwrap();
        let victim = target.path().join("victim");
        fs::write(&victim, "root's").unwrap();
        let _ = fs::remove_file(&old);
        std::os::unix::fs::symlink(&victim, &old).unwrap();
        let written = write_profile(&w);
        let _ = fs::remove_file(&old);
        let (dir, file) = written.unwrap();
        assert_eq!(fs::read_to_string(&victim).unwrap(), "root's", "nothing was written through the link");
        assert!(file.starts_with(dir.path()) && file != old);
        assert_eq!(fs::read_to_string(&file).unwrap(), w.text);
        drop(dir);
        assert!(!file.exists());
    }

    #[test]
    fn an_output_directory_others_can_write_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let t = crate::sys::fs::TempDir::new("sluice-unit").unwrap();
        assert!(check_out_dir(t.path()).is_ok());
        let open = t.path().join("open");
        fs::create_dir(&open).unwrap();
        fs::set_permissions(&open, fs::Permissions::from_mode(0o1777)).unwrap();
        let e = check_out_dir(&open).unwrap_err().to_string();
        assert!(e.contains("can be written by others"), "{e}");
    }

    #[test]
    fn a_torn_last_line_is_ignored() {
        let tmp = crate::sys::fs::TempDir::new("sluice-cells").unwrap();
        let dir = tmp.path();
        let rec = CellRecord {
            key: CellKey {
                path: "direct".into(),
                workload: "w".into(),
                conns: 1,
                mtu: 1500,
                family: Family::Ipv4,
                rep: 1,
            },
            run: 1,
            at: now_rfc3339(),
            result: RunResult::default(),
            drops: None,
        };
        let line = serde_json::to_string(&rec).unwrap();
        fs::write(dir.join("cells.jsonl"), format!("{line}\n{}", &line[..10])).unwrap();
        assert_eq!(load_cells(dir).unwrap().len(), 1);
        fs::write(dir.join("cells.jsonl"), format!("garbage\n{line}\n")).unwrap();
        assert!(load_cells(dir).is_err());
    }
}

//! Walking a study's matrix: building paths, running cells interleaved across paths and
//! conditions, recording each finished cell at once with what the host did besides it
//! (`noise.rs`) and what its condition's attackers did (`conditions`), and resuming where
//! a run stopped.
//!
//! Each finished cell's [`CellRecord`] is appended to `cells.jsonl` and flushed as the cell
//! ends (the files are `record.rs`'s); a cell already there is never run again. A profile a
//! cell hands its client goes into a new `mkdtemp` directory, never to a name derived from
//! the process id.

use std::collections::HashSet;
use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::error::Result;
use sluice_bench::client::{RunOptions, run};
use sluice_bench::report::Per;
use sluice_bench::result::RunResult;
use sluice_sys::bail;
use sluice_sys::error::Context;

use super::conditions::{self, AttackRecord, Condition};
use super::noise::{self, Noise};
use super::record::{CellKey, CellRecord, HostInfo, Options, PathDrops, StudyFile, check_out_dir, load_cells};
use super::spec::{Study, Workload};
use sluice_lab::compared::Topology;
use sluice_sys::{INTERRUPTED, netns};

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
/// connections and family; within those, every path under every condition that applies to
/// it (a path's conditions next to each other, so its attacked cells run beside its quiet
/// one), the list rotating one place per group. Partition-aggregate points run quiet only.
pub fn plan(study: &Study, paths: &[String], reps: u32) -> Vec<CellKey> {
    let combos: Vec<(&String, Condition)> =
        paths.iter().flat_map(|p| study.conditions.iter().filter(|c| c.applies(p)).map(move |&c| (p, c))).collect();
    let quiet: Vec<(&String, Condition)> = paths.iter().map(|p| (p, Condition::Quiet)).collect();
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
                    let list = if w.pa.is_some() { &quiet } else { &combos };
                    if list.is_empty() {
                        continue;
                    }
                    for &family in &study.families {
                        for i in 0..list.len() {
                            let (path, condition) = list[(i + turn) % list.len()];
                            cells.push(CellKey {
                                path: path.clone(),
                                workload: w.name.clone(),
                                conns,
                                mtu,
                                family,
                                rep,
                                condition,
                            });
                        }
                        turn += 1;
                    }
                }
            }
        }
    }
    cells
}

/// Now, as RFC 3339 UTC.
pub fn now_rfc3339() -> String {
    rfc3339(SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0))
}

pub use sluice_sys::time::rfc3339;

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
        copy: Some(sluice_bench::copy::measure()),
        builds: Vec::new(),
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
/// Seconds to start and stop a condition's attackers, for the estimate.
const CONDITION_S: f64 = 1.0;

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
    let attacked = cells.iter().filter(|c| c.condition != Condition::Quiet).count();
    cells.len() as f64 * (f64::from(duration_s) + CELL_OVERHEAD_S)
        + attacked as f64 * CONDITION_S
        + (mtus * npaths) as f64 * BUILD_S
}

/// Runs every cell of `sf` not yet in `dir/cells.jsonl`, as run `run`.
/// `builds`: the executables of the study's other builds, by name (see [`super::builds`]).
pub fn execute(
    dir: &Path,
    sf: &StudyFile,
    run_no: u32,
    paths_here: &[String],
    builds: &std::collections::BTreeMap<String, std::path::PathBuf>,
) -> Result<Executed> {
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
        .map_err(|e| sluice_sys::failure!("cannot record the cells: {e}"))?;

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
                        let _ = sluice_sys::kill(pid, libc::SIGKILL);
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
            let exe = match super::spec::split_build(p).1 {
                Some(b) => {
                    Some(builds.get(b).with_context(|| format!("{p}: the build {b:?} was not staged"))?.as_path())
                }
                None => None,
            };
            match sluice_lab::compared::build(p, exe, &id, i, mtu, o.pin, workers) {
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
            let label = match cell.condition {
                Condition::Quiet => cell.path.clone(),
                c => format!("{} [{c}]", cell.path),
            };
            eprint!(
                "[{:>w$}/{total}] {:>6} left  rep {}/{}  MTU {mtu}  {}  {} conn{}  {}  {:<30}",
                ran + 1,
                hms(left),
                cell.rep,
                o.reps,
                cell.workload,
                cell.conns,
                if cell.conns == 1 { "" } else { "s" },
                cell.family,
                label,
                w = total.to_string().len()
            );
            let ours = noise::Ours::new(
                topos.iter().filter_map(|t| t.switch_pid).chain(topos.iter().flat_map(|t| t.vms.iter().map(|v| v.pid))),
                topos.iter().flat_map(|t| t.namespaces()),
            );
            let sampler = noise::Sampler::start(ours);
            let r = run_one(topo, w, cell, o, study, &id);
            let noise = sampler.finish();
            ran += 1;
            match r {
                Ok((result, drops, attack)) => {
                    eprintln!("{}{}", summary(&result, drops.as_ref()), noise_summary(&noise));
                    let rec = CellRecord {
                        key: cell.clone(),
                        run: run_no,
                        at: now_rfc3339(),
                        result,
                        drops,
                        noise: Some(noise),
                        attack,
                        daemon: topo.switch_pid.and_then(crate::record::DaemonSample::read),
                    };
                    let mut line = serde_json::to_string(&rec).context("writing a cell record")?;
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
                    eprintln!("FAILED: {}", e.chain());
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

/// What the host did besides the cell, for its line: steal and others' CPU, and NOISY
/// when either is over its limit.
fn noise_summary(n: &Noise) -> String {
    format!(
        "  steal {}, others {}{}",
        noise::pct(n.steal),
        noise::pct(n.others),
        if n.fault().is_some() { "  NOISY" } else { "" }
    )
}

/// Runs one cell under its condition: the attackers started before the workload and
/// stopped after; their own CPU is taken out of the column it landed in (they are threads
/// of this process: the guest column when the bench client runs in this process, other
/// kernel otherwise).
fn run_one(
    topo: &Topology,
    w: &Workload,
    cell: &CellKey,
    o: &Options,
    study: &Study,
    id: &str,
) -> Result<(RunResult, Option<PathDrops>, Option<AttackRecord>)> {
    let attackers = conditions::start(cell.condition, topo, id, o.duration_s)
        .with_context(|| format!("starting condition {}", cell.condition))?;
    let cpu0 = attackers.as_ref().map(|a| a.cpu_s());
    let r = match w.pa {
        Some(point) => {
            super::pa::run_point(topo, point, cell, o, super::pa::queries(study, o)).map(|(r, d)| (r, Some(d)))
        }
        None => run_cell(topo, w, cell, o).map(|r| (r, None)),
    };
    let cpu1 = attackers.as_ref().map(|a| a.cpu_s());
    let attack = attackers.map(|a| a.stop());
    let (mut r, drops) = r?;
    if let (Some(a), Some(b)) = (cpu0, cpu1) {
        let theirs = (b - a).max(0.0);
        if w.tool.is_none() && !topo.smc {
            r.cpu.guest_s = (r.cpu.guest_s - theirs).max(0.0);
        } else {
            r.cpu.other_s = (r.cpu.other_s - theirs).max(0.0);
        }
    }
    Ok((r, drops, attack))
}

/// One line of what a cell measured.
fn summary(r: &RunResult, drops: Option<&PathDrops>) -> String {
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
    if !topo.vms.is_empty() {
        return super::vmcell::run(topo, w, cell, o);
    }
    if let Some(tool) = w.tool {
        return super::tools::run(topo, tool, topo.server_addr(cell.family), cell.conns, o.duration_s);
    }
    let host = topo.server_addr(cell.family).to_string();
    let mut profile = if w.builtin {
        sluice_bench::builtin::profile(&w.name, &w.text, &host)?
    } else {
        let env = |v: &str| std::env::var(v).ok();
        sluice_bench::profile::parse(&w.text, &w.source, &env)?
    };
    profile.set_remotehost(&host);
    profile.set_duration(Duration::from_secs(u64::from(o.duration_s)));
    profile.set_conns(cell.conns);
    let opts = RunOptions {
        server: sluice_bench::host_port(&host, sluice_bench::control::DEFAULT_PORT),
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
            sluice_sys::pin_to_cpu(0)?;
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
    let mut cmd = topo.sluice_in(&topo.client_ns, o.pin.then_some(0), true)?;
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
fn write_profile(w: &Workload) -> Result<(sluice_sys::fs::TempDir, PathBuf)> {
    let dir = sluice_sys::fs::TempDir::new("sluice-study-profile").context("making a directory for a profile")?;
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
pub(crate) mod tests {
    use super::*;
    use crate::record::load_study_file;
    use crate::spec::Family;

    fn study() -> Study {
        crate::spec::parse(
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
    fn the_plan_interleaves_conditions_with_paths_and_plans_none_where_they_do_not_apply() {
        let s = crate::spec::parse(
            r#"name = "h"
baseline = "linux-bridge"
paths = ["sluice-l2", "linux-bridge"]
conditions = ["quiet", "rings", "mac-flood"]
workloads = ["iperf3", "pa-8mtu"]
reps = 2
"#,
            "h.toml",
            Path::new("."),
        )
        .unwrap();
        let cells = plan(&s, &s.paths, s.reps);
        let ordinary: Vec<&CellKey> = cells.iter().filter(|c| c.workload == "iperf3").collect();
        // sluice-l2 quiet, rings, mac-flood; the bridge quiet and mac-flood (no vhost-user).
        assert_eq!(ordinary.len(), 5 * 2);
        assert!(!ordinary.iter().any(|c| c.path == "linux-bridge" && c.condition == Condition::Rings));
        let set: HashSet<_> = cells.iter().cloned().collect();
        assert_eq!(set.len(), cells.len(), "no cell twice");
        for g in ordinary.chunks(5) {
            let combos: HashSet<_> = g.iter().map(|c| (c.path.as_str(), c.condition)).collect();
            assert_eq!(combos.len(), 5, "each group is every path under every condition once: {g:?}");
            // Quiet and attacked cells of one path run side by side (the list rotates).
            let quiet = g.iter().position(|c| c.path == "sluice-l2" && c.condition == Condition::Quiet).unwrap();
            let rings = g.iter().position(|c| c.path == "sluice-l2" && c.condition == Condition::Rings).unwrap();
            assert!(quiet.abs_diff(rings) == 1 || quiet.abs_diff(rings) == 4, "{g:?}");
        }
        assert_ne!(ordinary[0], ordinary[5], "the second group starts elsewhere");
        assert_ne!((&ordinary[0].path, ordinary[0].condition), (&ordinary[5].path, ordinary[5].condition));
        // Partition-aggregate points run quiet only.
        let pa: Vec<&CellKey> = cells.iter().filter(|c| c.workload == "pa-8mtu").collect();
        assert_eq!(pa.len(), 2 * 2);
        assert!(pa.iter().all(|c| c.condition == Condition::Quiet));
    }

    /// A study an earlier sluice measured (before conditions and noise were recorded).
    pub(crate) const OLD_STUDY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/results/2026-11-27-overlay");

    #[test]
    fn cells_written_before_conditions_and_noise_load_as_quiet_and_unrecorded() {
        let sf = load_study_file(Path::new(OLD_STUDY)).unwrap();
        assert_eq!(sf.study.conditions, [Condition::Quiet]);
        assert!(sf.study.goals.is_empty());
        let cells = load_cells(Path::new(OLD_STUDY)).unwrap();
        assert!(cells.len() > 10);
        assert!(cells.iter().all(|c| c.key.condition == Condition::Quiet && c.noise.is_none() && c.attack.is_none()));
        // And they are the cells the plan has: a resume would run none of them again.
        let planned: HashSet<CellKey> = plan(&sf.study, &sf.study.paths, sf.options.reps).into_iter().collect();
        assert!(cells.iter().all(|c| planned.contains(&c.key)));
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
        let target = sluice_sys::fs::TempDir::new("sluice-unit").unwrap();
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
        let t = sluice_sys::fs::TempDir::new("sluice-unit").unwrap();
        assert!(check_out_dir(t.path()).is_ok());
        let open = t.path().join("open");
        fs::create_dir(&open).unwrap();
        fs::set_permissions(&open, fs::Permissions::from_mode(0o1777)).unwrap();
        let e = check_out_dir(&open).unwrap_err().to_string();
        assert!(e.contains("can be written by others"), "{e}");
    }

    #[test]
    fn a_torn_last_line_is_ignored() {
        let tmp = sluice_sys::fs::TempDir::new("sluice-cells").unwrap();
        let dir = tmp.path();
        let rec = CellRecord {
            key: CellKey {
                path: "direct".into(),
                workload: "w".into(),
                conns: 1,
                mtu: 1500,
                family: Family::Ipv4,
                rep: 1,
                condition: Condition::Quiet,
            },
            run: 1,
            at: now_rfc3339(),
            result: RunResult::default(),
            drops: None,
            noise: None,
            attack: None,
            daemon: None,
        };
        let line = serde_json::to_string(&rec).unwrap();
        fs::write(dir.join("cells.jsonl"), format!("{line}\n{}", &line[..10])).unwrap();
        assert_eq!(load_cells(dir).unwrap().len(), 1);
        fs::write(dir.join("cells.jsonl"), format!("garbage\n{line}\n")).unwrap();
        assert!(load_cells(dir).is_err());
    }
}

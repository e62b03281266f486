//! What a study's runs left behind: the switch daemons' resident memory and open
//! descriptors cell by cell (recorded with each cell), the namespaces, interfaces and
//! /dev/shm entries of a run still on the host after it ended (`leftovers.jsonl`), and the
//! report's section "What the run left behind" that checks them (studies with
//! `leftovers = true`, the built-in `soak`).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::fs;
use std::io::Write as _;
use std::path::Path;

use serde::{Deserialize, Serialize};
use sluice_sys::error::Context;

use crate::error::Result;
use crate::record::{CellRecord, DaemonSample, StudyFile, check_out_dir};

/// How far the daemon's resident memory may move from its warm value to the last cell's.
pub const RSS_FLAT: f64 = 0.10;

/// Names on the host before a run: network namespaces, interfaces of the host's
/// namespace and /dev/shm entries.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    netns: BTreeSet<String>,
    links: BTreeSet<String>,
    shm: BTreeSet<String>,
}

fn names(dir: &str) -> BTreeSet<String> {
    fs::read_dir(dir)
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default()
}

impl Snapshot {
    /// The names there now.
    pub fn take() -> Snapshot {
        Snapshot { netns: names("/run/netns"), links: names("/sys/class/net"), shm: names("/dev/shm") }
    }
}

/// One line of `leftovers.jsonl`: what of run `run` was still there after it ended.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RunLeft {
    /// The run.
    pub run: u32,
    /// Its network namespaces still there.
    pub netns: Vec<String>,
    /// Its interfaces still in the host's namespace.
    pub links: Vec<String>,
    /// /dev/shm entries made during the run and still there (they carry no run's name:
    /// another program's would be counted too).
    pub shm: Vec<String>,
}

/// What of this process's run is on the host now and was not at `before`: namespaces and
/// interfaces carrying the run's names (`sstPID-…` and the labs' `stPID…`), any new
/// /dev/shm entry.
pub fn left_since(run: u32, before: &Snapshot) -> RunLeft {
    let now = Snapshot::take();
    let mark = format!("st{}", std::process::id());
    let ours = |was: &BTreeSet<String>, is: BTreeSet<String>, marked: bool| -> Vec<String> {
        is.into_iter().filter(|n| !was.contains(n) && (!marked || n.contains(&mark))).collect()
    };
    RunLeft {
        run,
        netns: ours(&before.netns, now.netns, true),
        links: ours(&before.links, now.links, true),
        shm: ours(&before.shm, now.shm, false),
    }
}

/// Appends what run `run` left behind (since `before`) to `dir/leftovers.jsonl`.
pub fn record(dir: &Path, run: u32, before: &Snapshot) -> Result<()> {
    let left = left_since(run, before);
    let mut f = check_out_dir(dir)?
        .append(std::ffi::OsStr::new("leftovers.jsonl"), 0o644)
        .context("cannot record what the run left")?;
    let mut line = serde_json::to_string(&left).context("writing what the run left as JSON")?;
    line.push('\n');
    f.write_all(line.as_bytes()).context("writing leftovers.jsonl")?;
    Ok(())
}

/// Reads `dir/leftovers.jsonl` (none: no run has ended).
pub fn load(dir: &Path) -> Result<Vec<RunLeft>> {
    let p = dir.join("leftovers.jsonl");
    let text = match fs::read_to_string(&p) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(vec![]),
        Err(e) => return Err(sluice_sys::error::Failure::new(format!("reading {}", p.display()), e).into()),
    };
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| Ok(serde_json::from_str(l).with_context(|| format!("{}: not a leftovers line", p.display()))?))
        .collect()
}

/// One check of the section.
#[derive(Clone, Debug, PartialEq)]
pub struct Check {
    /// What is checked.
    pub what: String,
    /// What was found.
    pub found: String,
    /// Whether it holds; `None`: too few cells to judge.
    pub met: Option<bool>,
}

/// The cell whose sample counts as warm in a series of `n`: after a tenth of the cells,
/// and at least the third (the first fill the frame pool and the allocator's arenas).
pub fn warm_index(n: usize) -> usize {
    (n / 10).max(2).min(n.saturating_sub(1))
}

/// The daemon checks of one series (one daemon's samples in cell order): resident memory
/// warm against the last cell within [`RSS_FLAT`], descriptors at the last cell not above
/// the warm value.
pub fn daemon_checks(label: &str, series: &[DaemonSample]) -> Vec<Check> {
    let n = series.len();
    if n < 4 {
        return vec![Check {
            what: format!("{label}: switch daemon's memory and descriptors"),
            found: format!("{n} cell(s) sampled; at least 4 needed (warm at the third, then the last)"),
            met: None,
        }];
    }
    let w = warm_index(n);
    let (warm, last) = (series[w], series[n - 1]);
    let peak = series.iter().map(|s| s.rss_kb).max().unwrap_or(0);
    let change = (last.rss_kb as f64 - warm.rss_kb as f64) / (warm.rss_kb.max(1) as f64);
    vec![
        Check {
            what: format!(
                "{label}: daemon RSS, cell {} → cell {n}, within {:.0}% (cell 1: {} kB)",
                w + 1,
                RSS_FLAT * 100.0,
                series[0].rss_kb
            ),
            found: format!("{} kB → {} kB ({:+.1}%; peak {peak} kB)", warm.rss_kb, last.rss_kb, change * 100.0),
            met: Some(change.abs() <= RSS_FLAT),
        },
        Check {
            what: format!("{label}: daemon descriptors, cell {} → cell {n}, not more", w + 1),
            found: format!("{} → {}", warm.fds, last.fds),
            met: Some(last.fds <= warm.fds),
        },
    ]
}

/// Every daemon's series: per path, run and process, the samples in the order the cells
/// finished.
fn series(cells: &[CellRecord]) -> BTreeMap<(String, u32, u32), Vec<DaemonSample>> {
    let mut out: BTreeMap<(String, u32, u32), Vec<DaemonSample>> = BTreeMap::new();
    for c in cells {
        if let Some(d) = c.daemon {
            out.entry((c.key.path.clone(), c.run, d.pid)).or_default().push(d);
        }
    }
    out
}

/// Every check of the section, from the cells and what the runs left.
pub fn checks(sf: &StudyFile, cells: &[CellRecord], left: &[RunLeft]) -> Vec<Check> {
    let mut out = Vec::new();
    let all = series(cells);
    for ((path, run, pid), s) in &all {
        out.extend(daemon_checks(&format!("`{path}` (run {run}, pid {pid})"), s));
    }
    for p in &sf.study.paths {
        if !all.keys().any(|k| &k.0 == p) && cells.iter().any(|c| &c.key.path == p) {
            out.push(Check {
                what: format!("`{p}`: switch daemon's memory and descriptors"),
                found: "no samples (the path runs no switch daemon of its own)".into(),
                met: None,
            });
        }
    }
    let ran: BTreeSet<&String> = cells.iter().map(|c| &c.key.path).collect();
    let skipped: BTreeSet<&String> = sf.runs.iter().flat_map(|r| r.skipped.iter().map(|s| &s.0)).collect();
    let paths: Vec<String> =
        sf.study.paths.iter().filter(|p| ran.contains(p) || !skipped.contains(p)).cloned().collect();
    let planned = super::run::plan(&sf.study, &paths, sf.options.reps).len();
    out.push(Check {
        what: "every planned cell finished".into(),
        found: format!("{} of {planned}", cells.len()),
        met: Some(cells.len() >= planned),
    });
    for r in left {
        let list = |v: &[String]| if v.is_empty() { "none".to_string() } else { v.join(", ") };
        out.push(Check {
            what: format!("run {}: its namespaces left", r.run),
            found: list(&r.netns),
            met: Some(r.netns.is_empty()),
        });
        out.push(Check {
            what: format!("run {}: its interfaces left (host namespace)", r.run),
            found: list(&r.links),
            met: Some(r.links.is_empty()),
        });
        out.push(Check {
            what: format!("run {}: /dev/shm entries made during it and left", r.run),
            found: list(&r.shm),
            met: Some(r.shm.is_empty()),
        });
    }
    out
}

/// The report's section "What the run left behind" (empty unless the study asks for it
/// with `leftovers = true`).
pub fn section(dir: &Path, sf: &StudyFile, cells: &[CellRecord]) -> Result<String> {
    if !sf.study.leftovers {
        return Ok(String::new());
    }
    Ok(markdown(&checks(sf, cells, &load(dir)?), series(cells).values().map(Vec::as_slice)))
}

fn markdown<'a>(checks: &[Check], series: impl Iterator<Item = &'a [DaemonSample]>) -> String {
    let mut md = String::from("## What the run left behind\n\n");
    md.push_str(
        "After every cell the runner read the switch daemon's resident memory (`VmRSS`) and open descriptors; after each run it looked for namespaces and interfaces carrying the run's names and /dev/shm entries made during it. The daemon's memory counts from the warm cell (after a tenth of its cells, at least the third). These checks do not depend on the host's noise: MET and NOT MET hold from any run.\n\n",
    );
    md.push_str("| check | found | verdict |\n|--|--|--|\n");
    for c in checks {
        let v = match c.met {
            Some(true) => "MET",
            Some(false) => "**NOT MET**",
            None => "NOT JUDGED",
        };
        let _ = writeln!(md, "| {} | {} | {v} |", c.what, c.found);
    }
    let _ = writeln!(md);
    for s in series {
        let Some(first) = s.first() else { continue };
        let step = (s.len() / 20).max(1);
        let which = if step == 1 { "each cell".to_string() } else { format!("every {step} cells, and the last") };
        let _ = writeln!(md, "Daemon pid {} after {which}:\n", first.pid);
        md.push_str("| cell | RSS (kB) | descriptors |\n|--:|--:|--:|\n");
        for (i, d) in s.iter().enumerate() {
            if i % step == 0 || i + 1 == s.len() {
                let _ = writeln!(md, "| {} | {} | {} |", i + 1, d.rss_kb, d.fds);
            }
        }
        let _ = writeln!(md);
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(rss: &[u64], fds: &[u32]) -> Vec<DaemonSample> {
        rss.iter().zip(fds).map(|(&rss_kb, &fds)| DaemonSample { pid: 7, rss_kb, fds }).collect()
    }

    #[test]
    fn the_warm_cell_is_after_a_tenth_and_at_least_the_third() {
        assert_eq!(warm_index(4), 2);
        assert_eq!(warm_index(20), 2);
        assert_eq!(warm_index(80), 8);
        assert_eq!(warm_index(2), 1);
    }

    #[test]
    fn a_flat_series_meets_both_checks_after_warming_up() {
        // The first cells fill the pools: growth before the warm cell does not count.
        let s = series(&[5_000, 9_000, 12_000, 12_400, 11_900, 12_800], &[30, 34, 36, 36, 35, 36]);
        let c = daemon_checks("p", &s);
        assert_eq!(c.len(), 2);
        assert!(c.iter().all(|c| c.met == Some(true)), "{c:?}");
        assert!(c[0].found.starts_with("12000 kB → 12800 kB (+6.7%"), "{}", c[0].found);
    }

    #[test]
    fn a_growing_series_fails_and_so_do_growing_descriptors() {
        let s = series(&[5_000, 9_000, 12_000, 12_900, 13_600, 14_000], &[30, 34, 36, 37, 38, 39]);
        let c = daemon_checks("p", &s);
        assert_eq!(c[0].met, Some(false), "{c:?}");
        assert_eq!(c[1].met, Some(false), "{c:?}");
        let md = markdown(&c, std::iter::once(s.as_slice()));
        assert!(md.contains("**NOT MET**") && md.contains("| 6 | 14000 | 39 |"), "{md}");
    }

    #[test]
    fn too_few_cells_are_not_judged() {
        let c = daemon_checks("p", &series(&[1, 2, 3], &[1, 1, 1]));
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].met, None);
    }

    #[test]
    fn what_a_run_left_is_only_what_carries_its_names() {
        let mark = format!("st{}", std::process::id());
        let before = Snapshot::default();
        let left = left_since(3, &before);
        assert_eq!(left.run, 3);
        assert!(left.netns.iter().chain(&left.links).all(|n| n.contains(&mark)), "{left:?}");
        let back: RunLeft = serde_json::from_str(&serde_json::to_string(&left).unwrap()).unwrap();
        assert_eq!(back, left);
    }
}

//! A study's results as the seeds print them: per (workload, MTU, family) a table with a
//! block of absolute values per path (and, in a study with conditions, per path and
//! condition) — the rate and CPU per unit split into guest, switch and other kernel, median
//! of the repetitions with min–max, and the host's noise while they ran — then ratio and %
//! difference rows against the baseline, and each attacked path against itself quiet and,
//! when the study has its control condition (`rings`'s `vm-feed`), against itself under
//! that.
//! Also `results.csv` (one row per cell), `results.json` (the tables) and the charts
//! (`chart.rs`); the verdicts, goals and the attackers' account are in `judge.rs`.
//!
//! The tables themselves, their ratios and number formatting are `table.rs`'s.
//!
//! Rendering never fails on partial data: a cell without results shows "–", a ratio over a
//! zero baseline is "–", a cell without a noise record "not recorded".

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::Path;

use crate::error::Result;
use sluice_sys::error::Context;

use super::conditions::Condition;
use super::noise::{self, Noise};
use super::record::{CellRecord, StudyFile};
use super::table::{Figure, Ratio, Row, Stat, Table, Values, has_conditions, num, ratio, tables};

fn stat_cell(s: &Stat, runs: &BTreeSet<u32>) -> String {
    let mut out = num(s.median);
    if s.n > 1 && s.min != s.max {
        let _ = write!(out, " ({}–{})", num(s.min), num(s.max));
    }
    let later: Vec<String> = runs.iter().filter(|r| **r > 1).map(|r| r.to_string()).collect();
    if !later.is_empty() {
        let _ = write!(out, " ⁽ʳ{}⁾", later.join(","));
    }
    out
}

/// The noise of a block's repetitions: the largest steal and others' CPU, † when one is
/// over its limit; "not recorded" when no repetition has a record.
fn noise_cell(v: &Values) -> String {
    let recorded: Vec<&Noise> = v.reps.values().filter_map(|r| r.noise.as_ref()).collect();
    if recorded.is_empty() {
        return "not recorded".into();
    }
    let steal = recorded.iter().map(|n| n.steal).fold(0.0, f64::max);
    let others = recorded.iter().map(|n| n.others).fold(0.0, f64::max);
    let mut out = format!("{} · {}", noise::pct(steal), noise::pct(others));
    if recorded.len() < v.reps.len() {
        let _ = write!(out, " ({} not recorded)", v.reps.len() - recorded.len());
    }
    if v.noisy() {
        out.push_str(" †");
    }
    out
}

fn pct(a: f64, b: f64) -> String {
    ratio(a, b).map_or("–".into(), |r| format!("{:+.2}%", (r - 1.0) * 100.0))
}

const CPU_PARTS: [&str; 4] = ["guest", "switch", "other kernel", "total"];

/// The markdown of one table.
pub fn table_markdown(t: &Table) -> String {
    let mut md = String::new();
    let head: Vec<String> = t.conns.iter().map(|n| format!("{n} conn{}", if *n == 1 { "" } else { "s" })).collect();
    let _ = writeln!(md, "| {} {} | {} |", t.workload, t.family, head.join(" | "));
    let _ = writeln!(md, "|---|{}", "--:|".repeat(t.conns.len()));
    let row = |md: &mut String, label: &str, cells: Vec<String>| {
        let _ = writeln!(md, "| {label} | {} |", cells.join(" | "));
    };
    let dash = || "–".to_string();
    for r in &t.rows {
        let vals = &r.values;
        let tag = if r.path == t.baseline && r.condition == Condition::Quiet { " (baseline)" } else { "" };
        row(&mut md, &format!("**{}**{tag}", r.label(t.conditions)), vec![String::new(); t.conns.len()]);
        row(
            &mut md,
            t.rate_label(),
            vals.iter().map(|v| v.as_ref().map_or_else(dash, |v| stat_cell(&v.rate, &v.runs))).collect(),
        );
        if t.per_mb && t.copy_mb_s.is_some_and(|c| c > 0.0) {
            row(
                &mut md,
                "of one core's copy rate (memory)",
                vals.iter()
                    .map(|v| {
                        v.as_ref()
                            .and_then(|v| t.copy_share(v))
                            .map_or_else(dash, |s| format!("{:.0}%", 100.0 * s.median))
                    })
                    .collect(),
            );
        }
        if t.latency {
            row(
                &mut md,
                "mean latency µs",
                vals.iter()
                    .map(|v| {
                        v.as_ref()
                            .filter(|v| v.latency.n > 0)
                            .map_or_else(dash, |v| stat_cell(&v.latency, &BTreeSet::new()))
                    })
                    .collect(),
            );
        }
        for k in [3, 0, 1, 2] {
            row(
                &mut md,
                &format!("{} {}", t.cpu_label(), CPU_PARTS[k]),
                vals.iter().map(|v| v.as_ref().map_or_else(dash, |v| stat_cell(&v.cpu[k], &BTreeSet::new()))).collect(),
            );
        }
        row(&mut md, "steal · others' CPU", vals.iter().map(|v| v.as_ref().map_or_else(dash, noise_cell)).collect());
    }
    let compare = |a: &Row, b: &Row, f: Figure| -> Vec<String> {
        a.values
            .iter()
            .zip(&b.values)
            .map(|(x, y)| match (x, y) {
                (Some(x), Some(y)) => Ratio::of(x, y, f).map_or_else(dash, |r| r.cell()),
                _ => dash(),
            })
            .collect()
    };
    // Each attacked block against the same path quiet, and against it under the attack's
    // control where the study has it.
    for r in t.rows.iter().filter(|r| r.condition != Condition::Quiet) {
        let against = std::iter::once(Condition::Quiet).chain(r.condition.control());
        for q in against.filter_map(|c| t.row(&r.path, c)) {
            let who = format!("*{} / {}*", r.label(true), q.label(true));
            row(&mut md, &format!("{who}: {}", t.rate_label()), compare(r, q, Figure::Rate));
            if t.latency {
                row(&mut md, &format!("{who}: mean latency"), compare(r, q, Figure::Latency));
            }
            row(&mut md, &format!("{who}: {} total", t.cpu_label()), compare(r, q, Figure::CpuTotal));
        }
    }
    // Every other block against the baseline.
    for r in t.rows.iter().filter(|r| r.path != t.baseline) {
        let Some(b) = t.base_row(r) else { continue };
        let who = format!("*{} / {}*", r.label(t.conditions), b.label(t.conditions));
        row(&mut md, &format!("{who}: {}", t.rate_label()), compare(r, b, Figure::Rate));
        row(&mut md, &format!("{who}: {} total", t.cpu_label()), compare(r, b, Figure::CpuTotal));
        let pair = |f: &dyn Fn(&Values) -> f64| -> Vec<String> {
            r.values
                .iter()
                .zip(&b.values)
                .map(|(v, bv)| match (v, bv) {
                    (Some(v), Some(bv)) => pct(f(v), f(bv)),
                    _ => dash(),
                })
                .collect()
        };
        let diff = if t.conditions { format!("*% difference* ({})", r.label(true)) } else { "*% difference*".into() };
        row(&mut md, &format!("{diff}: {}", t.rate_label()), pair(&|v| v.rate.median));
        for k in [3, 0, 1, 2] {
            row(&mut md, &format!("{diff}: {} {}", t.cpu_label(), CPU_PARTS[k]), pair(&|v| v.cpu[k].median));
        }
    }
    md
}

/// The whole report.
/// `pa` is the partition-aggregate section (study/pa.rs), placed after the tables.
pub fn markdown(
    sf: &StudyFile,
    cells: &[CellRecord],
    tables: &[Table],
    charts: &[(String, String)],
    pa: &str,
) -> String {
    let s = &sf.study;
    let o = &sf.options;
    let mut md = String::new();
    let _ = writeln!(md, "# {} (`{}`)\n", s.title, s.name);
    if !s.about.is_empty() {
        let _ = writeln!(md, "{}\n", s.about.split_whitespace().collect::<Vec<_>>().join(" "));
    }
    md.push_str(&super::judge::verdict_section(sf, cells));
    md.push_str(&super::judge::goals_section(sf, cells, tables));
    let _ = writeln!(md, "## How these numbers were made\n");
    for r in &sf.runs {
        let h = &r.host;
        let _ = writeln!(
            md,
            "- Run {}{}: started {} on {} — {} CPUs ({}), kernel {}, sluice {}; {:.0}% of the CPUs busy before it started.",
            r.run,
            if r.run > 1 { " (resumed)" } else { "" },
            r.started,
            if h.hostname.is_empty() { "this host" } else { &h.hostname },
            h.cpus,
            if h.cpu_model.is_empty() { "unknown model" } else { &h.cpu_model },
            h.kernel,
            h.sluice,
            h.load_before * 100.0
        );
        if let Some(c) = h.copy {
            let _ = writeln!(
                md,
                "  - One core copies {:.1} GB/s within its cache and {:.1} GB/s from memory to memory (`memcpy`; the limit of a byte stream between two processes is one copy per byte).",
                c.cached_mb_s / 1000.0,
                c.memory_mb_s / 1000.0
            );
        }
        if !h.ovs.is_empty() {
            let _ = writeln!(md, "  - {}", h.ovs);
        }
        for b in &h.builds {
            let _ = writeln!(md, "  - {b}; its paths are named `PATH@{}`", b.split('`').nth(1).unwrap_or_default());
        }
        for (p, why) in &r.skipped {
            let _ = writeln!(md, "  - skipped `{p}`: {why}");
        }
    }
    let _ = writeln!(md, "- Reproduce: `{}`", reproduce(sf));
    let _ = writeln!(
        md,
        "- Each cell ran {} s; {}; cells were interleaved across paths{}. {} cells measured.",
        o.duration_s,
        if o.reps == 1 {
            "one repetition".to_string()
        } else {
            format!("values are the median of {} repetitions with (min–max)", o.reps)
        },
        if has_conditions(sf) { " and conditions" } else { "" },
        cells.len()
    );
    let _ = writeln!(
        md,
        "- A ratio is the median of the per-repetition ratios (repetition k against repetition k) with their (min–max); *within noise* when the two sides' ranges of values overlap; † when a cell of either side was measured while the host was noisy. **steal · others' CPU**: the largest of the block's repetitions (see the last section)."
    );
    let _ = writeln!(
        md,
        "- CPU per unit, as the seeds split it: **guest** = the bench client and server processes (the seeds' Emul), **switch** = the sluice daemon (the seeds' CP time for the switch), **other kernel** = the rest of the host's busy time, **total** = all three, by which paths rank. The kernel paths (veth, bridge, router) forward inside the sending process's system call (softirq run on its way out), so their forwarding cost is charged to the guest column; softirq work the kernel defers to its own threads lands in other kernel."
    );
    if o.pin {
        let _ = writeln!(md, "- `--pin`: clients on CPU 0, bench servers on CPU 1; switch daemons not pinned.");
    } else {
        let _ = writeln!(md, "- Nothing was pinned to a CPU.");
    }
    if sf.runs.iter().any(|r| r.run > 1) {
        let _ = writeln!(md, "- ⁽ʳⁿ⁾ marks values with repetitions measured in resumed run n.");
    }
    if o.quick {
        let _ = writeln!(
            md,
            "- **`--quick`**: a first look with short cells and one repetition; rerun without it for figures to quote."
        );
    }
    let _ = writeln!(md);
    for t in tables {
        let _ = writeln!(md, "## {} — MTU {}, {}\n", t.workload, t.mtu, t.family);
        md.push_str(&table_markdown(t));
        let _ = writeln!(md);
        for (slug, file) in charts {
            if *slug == t.slug() {
                let _ = writeln!(md, "![{} normalized to {}]({file})\n", t.workload, t.baseline);
            }
        }
    }
    md.push_str(&super::judge::conditions_section(sf, cells));
    md.push_str(pa);
    md.push_str(&super::judge::noise_section(cells));
    md
}

/// The command that reproduces the first run.
pub fn reproduce(sf: &StudyFile) -> String {
    let o = &sf.options;
    let mut c = format!("sluice study run {}", o.file.as_deref().unwrap_or(&sf.study.name));
    if o.quick {
        c.push_str(" --quick");
    } else {
        let _ = write!(c, " --reps {} --duration {}", o.reps, o.duration_s);
    }
    if o.baseline != sf.study.baseline {
        let _ = write!(c, " --baseline {}", o.baseline);
    }
    if o.pin {
        c.push_str(" --pin");
    }
    c
}

/// CSV columns of `results.csv`.
pub const CSV_COLUMNS: &[&str] = &[
    "run",
    "at",
    "path",
    "workload",
    "conns",
    "mtu",
    "family",
    "rep",
    "duration_s",
    "transactions",
    "bytes_sent",
    "bytes_received",
    "tps",
    "mb_per_s",
    "cpu_guest_s",
    "cpu_switch_s",
    "cpu_other_s",
    "cpu_total_s",
    "cpu_us_per_tx_total",
    "cpu_ms_per_mb_total",
    "latency_p50_us",
    "latency_p99_us",
    "queries",
    "qct_mean_us",
    "qct_p99_us",
    "switch_drops",
    "interface_drops",
    "tcp_retrans",
    "condition",
    "steal",
    "others_cpu",
    "noisy",
    "attack_cpu_s",
];

/// One row per measured cell.
pub fn csv(cells: &[CellRecord]) -> String {
    let mut out = CSV_COLUMNS.join(",");
    out.push('\n');
    for c in cells {
        let r = &c.result;
        let k = &c.key;
        let _ = writeln!(
            out,
            "{},{},{},{},{},{},{},{},{:.3},{},{},{},{:.2},{:.3},{:.4},{:.4},{:.4},{:.4},{:.4},{:.5},{:.1},{:.1},{},{},{},{}",
            c.run,
            c.at,
            k.path,
            k.workload,
            k.conns,
            k.mtu,
            format!("{}", k.family).to_lowercase(),
            k.rep,
            r.duration_s,
            r.client.transactions,
            r.client.bytes_sent,
            r.client.bytes_received,
            r.tps(),
            r.mb_per_s(),
            r.cpu.guest_s,
            r.cpu.switch_s,
            r.cpu.other_s,
            r.cpu.total_s(),
            r.cpu_us_per_transaction()[3],
            r.cpu_ms_per_mb()[3],
            r.latency.p50_us,
            r.latency.p99_us,
            match (r.completion, &c.drops) {
                (Some(q), Some(d)) => format!(
                    "{},{:.1},{:.1},{},{},{}",
                    q.queries,
                    q.mean_us,
                    q.p99_us,
                    d.switch_total(),
                    d.interfaces,
                    d.tcp_retrans
                ),
                _ => ",,,,,".to_string(),
            },
            k.condition,
            match &c.noise {
                Some(n) => format!("{:.4},{:.4},{}", n.steal, n.others, u8::from(n.fault().is_some())),
                None => ",,".to_string(),
            },
            c.attack.as_ref().map_or(String::new(), |a| format!("{:.3}", a.cpu_s))
        );
    }
    out
}

/// Writes report.md, results.csv, results.json and the charts into `dir`; returns the
/// report's path.
pub fn write_all(dir: &Path, sf: &StudyFile, cells: &[CellRecord]) -> Result<std::path::PathBuf> {
    let ts = tables(sf, cells);
    let charts_dir = dir.join("charts");
    std::fs::create_dir_all(&charts_dir).with_context(|| format!("creating {}", charts_dir.display()))?;
    let mut charts = Vec::new();
    for t in &ts {
        let file = format!("charts/{}.png", t.slug());
        super::chart::draw(t, &dir.join(&file)).with_context(|| format!("drawing {file}"))?;
        charts.push((t.slug(), file));
    }
    std::fs::write(dir.join("results.csv"), csv(cells))?;
    std::fs::write(
        dir.join("results.json"),
        serde_json::to_vec_pretty(&serde_json::json!({ "schema": 2, "tables": ts })).context("writing results.json")?,
    )?;
    let report = dir.join("report.md");
    let pa = super::pa::section(Some(dir), sf, cells)? + &super::leftovers::section(dir, sf, cells)?;
    std::fs::write(&report, markdown(sf, cells, &ts, &charts, &pa))?;
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::Family;

    #[test]
    fn a_stream_is_read_as_a_share_of_one_cores_copy_rate() {
        let mut sf = study_file(false);
        sf.runs[0].host.copy = Some(sluice_bench::copy::CopyRate { cached_mb_s: 40_000.0, memory_mb_s: 10_000.0 });
        let mut cells = Vec::new();
        for rep in 1..=3 {
            for (p, mb) in [("sluice-l2", 2000.0), ("linux-bridge", 1000.0)] {
                // (A stream: one transaction of many bytes.)
                let mut c = cell(p, Condition::Quiet, rep, 0.1, 0.0, Some(0.01));
                c.result.client.bytes_sent = (mb * 1e6 * 10.0) as u64;
                c.result.client.bytes_received = 0;
                cells.push(c);
            }
        }
        let t = &crate::table::tables(&sf, &cells)[0];
        assert!(t.per_mb);
        let md = table_markdown(t);
        assert!(md.contains("| of one core's copy rate (memory) | 20% |"), "{md}");
        assert!(md.contains("| of one core's copy rate (memory) | 10% |"), "{md}");
    }

    #[test]
    fn percent_differences() {
        assert_eq!(pct(1.7293, 1.0), "+72.93%");
        assert_eq!(pct(1.0, 0.0), "–");
    }

    use crate::conditions::Condition;
    use crate::noise::Noise;
    use crate::record::{CellKey, HostInfo, Options, RunInfo};

    const STUDY: &str = r#"name = "h"
baseline = "linux-bridge"
paths = ["sluice-l2", "linux-bridge"]
conditions = ["quiet", "rings", "mac-flood"]
workloads = ["rr-200x1000"]
reps = 3
duration = 10
goals = [{ workload = "rr-200x1000", keeps_rate = 0.9 }, { workload = "rr-200x1000", latency_within = 2 }]
"#;

    fn study_file(quick: bool) -> StudyFile {
        let study = crate::spec::parse(STUDY, "h.toml", Path::new(".")).unwrap();
        let options =
            Options { duration_s: 10, reps: 3, baseline: "linux-bridge".into(), pin: false, quick, file: None };
        let runs = vec![RunInfo { run: 1, started: String::new(), host: HostInfo::default(), skipped: vec![] }];
        StudyFile { study, options, runs }
    }

    /// A cell of `tps` transactions a second and `lat` µs mean latency, measured while
    /// other processes used `others` of the machine (`None`: not recorded).
    fn cell(path: &str, condition: Condition, rep: u32, tps: f64, lat: f64, others: Option<f64>) -> CellRecord {
        let mut result = sluice_bench::result::RunResult { duration_s: 10.0, ..Default::default() };
        result.client.transactions = (tps * 10.0) as u64;
        result.client.bytes_sent = result.client.transactions * 200;
        result.client.bytes_received = result.client.transactions * 1000;
        result.latency.mean_us = lat;
        result.cpu.guest_s = 1.0;
        CellRecord {
            key: CellKey {
                path: path.into(),
                workload: "rr-200x1000".into(),
                conns: 1,
                mtu: 1500,
                family: Family::Ipv4,
                rep,
                condition,
            },
            run: 1,
            at: String::new(),
            result,
            drops: None,
            noise: others.map(|o| Noise { seconds: 10.0, steal: 0.0, others: o }),
            attack: None,
            daemon: None,
        }
    }

    /// Three repetitions of every block; the bridge's mac-flood cell of rep 2 measured
    /// while the host was busy when `busy`.
    fn cells(busy: bool) -> Vec<CellRecord> {
        let mut v = Vec::new();
        for rep in 1..=3 {
            let d = f64::from(rep);
            v.push(cell("sluice-l2", Condition::Quiet, rep, 1000.0 + d, 100.0, Some(0.01)));
            v.push(cell("sluice-l2", Condition::Rings, rep, 950.0 + 10.0 * d, 150.0, Some(0.01)));
            v.push(cell("sluice-l2", Condition::MacFlood, rep, 700.0, 250.0, Some(0.01)));
            v.push(cell("linux-bridge", Condition::Quiet, rep, 900.0 + 20.0 * d, 110.0, Some(0.01)));
            let noisy = if busy && rep == 2 { 0.4 } else { 0.01 };
            v.push(cell("linux-bridge", Condition::MacFlood, rep, 880.0 + 20.0 * d, 115.0, Some(noisy)));
        }
        v
    }

    #[test]
    fn ratios_pair_repetitions_and_say_when_they_are_within_noise_or_untrusted() {
        let sf = study_file(false);
        let ts = tables(&sf, &cells(true));
        assert_eq!(ts.len(), 1);
        let t = &ts[0];
        assert!(t.conditions && t.latency);
        let labels: Vec<String> = t.rows.iter().map(|r| r.label(true)).collect();
        assert_eq!(
            labels,
            [
                "sluice-l2 [quiet]",
                "sluice-l2 [rings]",
                "sluice-l2 [mac-flood]",
                "linux-bridge [quiet]",
                "linux-bridge [mac-flood]"
            ]
        );
        let v = |p: &str, c| t.row(p, c).unwrap().values[0].clone().unwrap();
        // Repetition against repetition: 960/1001, 970/1002, 980/1003.
        let r = Ratio::of(&v("sluice-l2", Condition::Rings), &v("sluice-l2", Condition::Quiet), Figure::Rate).unwrap();
        assert_eq!(r.n, 3);
        assert!((r.median - 970.0 / 1002.0).abs() < 1e-12 && (r.min - 960.0 / 1001.0).abs() < 1e-12);
        assert!(!r.within_noise && !r.noisy);
        assert_eq!(r.cell(), "0.97 (0.96–0.98)");
        // The bridge's ranges overlap (900–960 against 900–940), and one cell was noisy.
        let b = Ratio::of(&v("linux-bridge", Condition::MacFlood), &v("linux-bridge", Condition::Quiet), Figure::Rate)
            .unwrap();
        assert!(b.within_noise && b.noisy, "{b:?}");
        assert!(b.cell().ends_with("within noise †"), "{}", b.cell());
        let md = table_markdown(t);
        for want in [
            "| **linux-bridge [quiet]** (baseline) |",
            "| steal · others' CPU | 0.0% · 1.0% |",
            "| steal · others' CPU | 0.0% · 40.0% † |",
            "| *sluice-l2 [rings] / sluice-l2 [quiet]*: transactions/s | 0.97 (0.96–0.98) |",
            "| *sluice-l2 [mac-flood] / sluice-l2 [quiet]*: mean latency | 2.50 |",
            "| *linux-bridge [mac-flood] / linux-bridge [quiet]*: transactions/s |",
            // Against the baseline under the same condition, or quiet where it has none.
            "| *sluice-l2 [mac-flood] / linux-bridge [mac-flood]*: transactions/s |",
            "| *sluice-l2 [rings] / linux-bridge [quiet]*: transactions/s |",
            "| mean latency µs | 150.0 |",
        ] {
            assert!(md.contains(want), "{want:?} in\n{md}");
        }
    }

    #[test]
    fn goals_are_met_not_met_or_not_claimable() {
        let quiet_run = cells(false);
        let sf = study_file(false);
        let ts = tables(&sf, &quiet_run);
        let rate = &sf.study.goals[0];
        let lines = crate::judge::check(rate, &sf, &quiet_run, &ts);
        let got: Vec<(String, Condition, String)> =
            lines.iter().map(|l| (l.path.clone(), l.condition, l.verdict())).collect();
        assert_eq!(
            got,
            [
                ("sluice-l2".into(), Condition::Rings, "MET".into()),
                ("sluice-l2".into(), Condition::MacFlood, "NOT MET".into()),
                ("linux-bridge".into(), Condition::MacFlood, "MET".into()),
            ]
        );
        let lat = crate::judge::check(&sf.study.goals[1], &sf, &quiet_run, &ts);
        assert_eq!(lat.iter().map(|l| l.verdict()).collect::<Vec<_>>(), ["MET", "NOT MET", "MET"]);
        // One noisy cell makes the run NOISY: nothing in it can be claimed.
        let noisy = cells(true);
        let ts = tables(&sf, &noisy);
        for l in crate::judge::check(rate, &sf, &noisy, &ts) {
            assert_eq!(l.verdict(), "NOT CLAIMABLE (noisy run: run 1 NOISY)", "{l:?}");
        }
        let md = markdown(&sf, &noisy, &ts, &[], "");
        assert!(
            md.contains("> **Run 1: NOISY** — 1 of 15 cells measured while other processes' CPU up to 40.0%"),
            "{md}"
        );
        assert!(md.contains("A results page may claim a goal only from a QUIET run"), "{md}");
        assert!(md.find("Run 1: NOISY").unwrap() < md.find("## How these numbers were made").unwrap(), "at the top");
        assert!(md.contains("| sluice-l2 | mac-flood | 0.70 | **NOT CLAIMABLE (noisy run: run 1 NOISY)** |"), "{md}");
        // A --quick look claims nothing either.
        let quick = study_file(true);
        let md = markdown(&quick, &quiet_run, &tables(&quick, &quiet_run), &[], "");
        assert!(md.contains("> **Run 1: QUIET**"), "{md}");
        assert!(md.contains("| sluice-l2 | rings | 0.97 (0.96–0.98) | **NOT CLAIMABLE (a --quick look)** |"), "{md}");
    }

    /// `rings` judged against its control as well as against quiet: the goal against
    /// `vm-feed` has a line for `rings` only (rings / vm-feed), the goal against quiet lines
    /// for the attacks only (not the control), and the table shows each attacked block
    /// against quiet and against its control.
    #[test]
    fn an_attack_is_judged_against_its_control_and_against_quiet() {
        let text = STUDY
            .replace("\"rings\", ", "\"rings\", \"vm-feed\", ")
            .replace("goals = [", "goals = [{ workload = \"rr-200x1000\", keeps_rate = 0.9, against = \"vm-feed\" }, ");
        let study = crate::spec::parse(&text, "h.toml", Path::new(".")).unwrap();
        let mut sf = study_file(false);
        sf.study = study;
        let mut cs = cells(false);
        for rep in 1..=3 {
            // Rings keeps 0.95–0.97 of quiet's rate, and 1.00 of the control's.
            cs.push(cell("sluice-l2", Condition::VmFeed, rep, 950.0 + 10.0 * f64::from(rep), 120.0, Some(0.01)));
        }
        let ts = tables(&sf, &cs);
        let lines = |g| crate::judge::check(&sf.study.goals[g], &sf, &cs, &ts);
        let ctl = lines(0);
        assert_eq!(ctl.len(), 1, "{ctl:?}");
        let l = &ctl[0];
        assert_eq!((l.path.as_str(), l.condition, l.verdict()), ("sluice-l2", Condition::Rings, "MET".into()));
        assert_eq!(l.ratio.unwrap().cell(), "1.00 within noise");
        let quiet: Vec<(String, Condition)> = lines(1).iter().map(|l| (l.path.clone(), l.condition)).collect();
        assert_eq!(
            quiet,
            [
                ("sluice-l2".into(), Condition::Rings),
                ("sluice-l2".into(), Condition::MacFlood),
                ("linux-bridge".into(), Condition::MacFlood),
            ]
        );
        let md = markdown(&sf, &cs, &ts, &[], "");
        for want in [
            "**Goal: under rings, rr-200x1000 keeps at least 90% of its rate under vm-feed (the same load without the attack).**",
            "| path | condition | rate attacked / vm-feed | verdict |",
            "| sluice-l2 | rings | 1.00 within noise | **MET** |",
            "| path | condition | rate attacked / quiet | verdict |",
            "| sluice-l2 | rings | 0.97 (0.96–0.98) | **MET** |",
            "| *sluice-l2 [rings] / sluice-l2 [quiet]*: transactions/s | 0.97 (0.96–0.98) |",
            "| *sluice-l2 [rings] / sluice-l2 [vm-feed]*: transactions/s | 1.00 within noise |",
            "| *sluice-l2 [vm-feed] / sluice-l2 [quiet]*: transactions/s | 0.97 (0.96–0.98) |",
            "- **vm-feed**: rings's control, no attack",
        ] {
            assert!(md.contains(want), "{want:?} in\n{md}");
        }
        let goals = &md[md.find("## Goals").unwrap()..md.find("## How these numbers were made").unwrap()];
        assert!(!goals.contains("| vm-feed |"), "the control is judged by no goal: {goals}");
    }

    #[test]
    fn a_study_measured_before_noise_was_recorded_reads_as_before_with_not_recorded() {
        let dir = Path::new(crate::run::tests::OLD_STUDY);
        let sf = crate::record::load_study_file(dir).unwrap();
        let cells = crate::record::load_cells(dir).unwrap();
        let ts = tables(&sf, &cells);
        assert!(ts.iter().all(|t| !t.conditions && !t.latency));
        let md = markdown(&sf, &cells, &ts, &[], "");
        for want in [
            "> **Run 1: NOT RECORDED** — its cells were measured by a sluice that did not record the host's noise",
            "| **overlay-kernel** (baseline) |",
            "| *overlay-sluice / overlay-kernel*: MB/s |",
            "| *% difference*: MB/s |",
            "| steal · others' CPU | not recorded |",
        ] {
            assert!(md.contains(want), "{want:?} in\n{md}");
        }
        assert!(!md.contains(" † |") && !md.contains("## Goals") && !md.contains("## Conditions"));
        let csv = csv(&cells);
        let header = csv.lines().next().unwrap();
        assert!(header.ends_with(",condition,steal,others_cpu,noisy,attack_cpu_s"), "{header}");
        assert!(csv.lines().nth(1).unwrap().ends_with(",quiet,,,,"), "{csv}");
    }
}

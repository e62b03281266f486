//! A study's results as the seeds print them: per (workload, MTU, family) a table with a
//! block of absolute values per path — the rate and CPU per unit split into guest, switch
//! and other kernel, median of the repetitions with min–max — then ratio and % difference
//! rows against the baseline. Also `results.csv` (one row per cell), `results.json` (the
//! tables) and the charts (`chart.rs`).
//!
//! Rendering never fails on partial data: a cell without results shows "–", a ratio over a
//! zero baseline is "–".

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result};
use serde::Serialize;

use sluice_bench::report::Per;

use super::run::{CellRecord, StudyFile};
use super::spec::Family;

/// Median, minimum and maximum of the repetitions.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Stat {
    /// Median.
    pub median: f64,
    /// Smallest.
    pub min: f64,
    /// Largest.
    pub max: f64,
    /// Repetitions.
    pub n: usize,
}

impl Stat {
    /// The statistic of `xs` (empty: all zero).
    pub fn of(xs: &[f64]) -> Stat {
        let mut v: Vec<f64> = xs.iter().copied().filter(|x| x.is_finite()).collect();
        if v.is_empty() {
            return Stat::default();
        }
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 };
        Stat { median, min: v[0], max: v[n - 1], n }
    }
}

/// What one path measured at one connection count.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Values {
    /// Transactions/s or MB/s.
    pub rate: Stat,
    /// CPU per unit: guest, switch, other kernel, total.
    pub cpu: [Stat; 4],
    /// The runs the repetitions came from.
    pub runs: BTreeSet<u32>,
}

/// One table: a workload at one MTU and family.
#[derive(Clone, Debug, Serialize)]
pub struct Table {
    /// Workload name.
    pub workload: String,
    /// MTU.
    pub mtu: u16,
    /// Address family.
    pub family: Family,
    /// Reported per MB (streaming) rather than per transaction.
    pub per_mb: bool,
    /// Connection counts (columns).
    pub conns: Vec<u32>,
    /// The baseline path.
    pub baseline: String,
    /// Per path, per connection count.
    pub rows: Vec<(String, Vec<Option<Values>>)>,
}

impl Table {
    /// The rate's name and unit.
    pub fn rate_label(&self) -> &'static str {
        if self.per_mb { "MB/s" } else { "transactions/s" }
    }

    /// The CPU figure's unit.
    pub fn cpu_label(&self) -> &'static str {
        if self.per_mb { "CPU ms/MB" } else { "CPU µs/transaction" }
    }

    /// The baseline's values at column `i`.
    pub fn base(&self, i: usize) -> Option<&Values> {
        self.rows.iter().find(|r| r.0 == self.baseline).and_then(|r| r.1[i].as_ref())
    }

    /// A file-name stem for this table.
    pub fn slug(&self) -> String {
        format!("{}-mtu{}-{}", self.workload, self.mtu, format!("{}", self.family).to_lowercase())
    }
}

/// Builds the tables of `sf` from `cells`, paths in `paths` order (those with data).
pub fn tables(sf: &StudyFile, cells: &[CellRecord]) -> Vec<Table> {
    let s = &sf.study;
    let paths: Vec<&String> = s.paths.iter().filter(|p| cells.iter().any(|c| &c.key.path == *p)).collect();
    let baseline = if paths.iter().any(|p| **p == sf.options.baseline) {
        sf.options.baseline.clone()
    } else {
        paths.first().map(|p| p.to_string()).unwrap_or_default()
    };
    let mut out = Vec::new();
    // Partition-aggregate points have a section of their own (study/pa.rs).
    for w in s.workloads.iter().filter(|w| w.pa.is_none()) {
        let of_w: Vec<&CellRecord> = cells.iter().filter(|c| c.key.workload == w.name).collect();
        let (tx, bytes) = of_w.iter().fold((0u64, 0u64), |(t, b), c| {
            (t + c.result.client.transactions, b + c.result.client.bytes_sent + c.result.client.bytes_received)
        });
        let per_mb = Per::for_volume(tx, bytes) == Per::Megabyte;
        for &mtu in &s.mtus {
            for &family in &s.families {
                let here: Vec<&&CellRecord> =
                    of_w.iter().filter(|c| c.key.mtu == mtu && c.key.family == family).collect();
                if here.is_empty() {
                    continue;
                }
                let rows = paths
                    .iter()
                    .map(|p| {
                        let vals = s
                            .conns
                            .iter()
                            .map(|&n| {
                                let reps: Vec<&&&CellRecord> =
                                    here.iter().filter(|c| &c.key.path == *p && c.key.conns == n).collect();
                                if reps.is_empty() {
                                    return None;
                                }
                                let rate: Vec<f64> = reps
                                    .iter()
                                    .map(|c| if per_mb { c.result.mb_per_s() } else { c.result.tps() })
                                    .collect();
                                let cpu = |k: usize| {
                                    Stat::of(
                                        &reps
                                            .iter()
                                            .map(|c| {
                                                if per_mb {
                                                    c.result.cpu_ms_per_mb()[k]
                                                } else {
                                                    c.result.cpu_us_per_transaction()[k]
                                                }
                                            })
                                            .collect::<Vec<_>>(),
                                    )
                                };
                                Some(Values {
                                    rate: Stat::of(&rate),
                                    cpu: [cpu(0), cpu(1), cpu(2), cpu(3)],
                                    runs: reps.iter().map(|c| c.run).collect(),
                                })
                            })
                            .collect();
                        (p.to_string(), vals)
                    })
                    .collect();
                out.push(Table {
                    workload: w.name.clone(),
                    mtu,
                    family,
                    per_mb,
                    conns: s.conns.clone(),
                    baseline: baseline.clone(),
                    rows,
                });
            }
        }
    }
    out
}

/// A number with about four significant digits and thousands separators.
pub fn num(v: f64) -> String {
    if !v.is_finite() {
        return "–".into();
    }
    if v == 0.0 {
        return "0".into();
    }
    let a = v.abs();
    let decimals = if a >= 1000.0 {
        0
    } else if a >= 100.0 {
        1
    } else if a >= 10.0 {
        2
    } else if a >= 1.0 {
        3
    } else {
        4
    };
    let s = format!("{v:.decimals$}");
    let (int, frac) = s.split_once('.').map_or((s.as_str(), None), |(i, f)| (i, Some(f)));
    let (sign, digits) = int.strip_prefix('-').map_or(("", int), |d| ("-", d));
    let mut grouped = String::new();
    for (i, ch) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            grouped.push(',');
        }
        grouped.push(ch);
    }
    match frac {
        Some(f) => format!("{sign}{grouped}.{f}"),
        None => format!("{sign}{grouped}"),
    }
}

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

/// `a / b`, or `None` when `b` is zero.
pub fn ratio(a: f64, b: f64) -> Option<f64> {
    (b.abs() > f64::EPSILON).then(|| a / b)
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
    for (path, vals) in &t.rows {
        let tag = if *path == t.baseline { " (baseline)" } else { "" };
        row(&mut md, &format!("**{path}**{tag}"), vec![String::new(); t.conns.len()]);
        row(
            &mut md,
            t.rate_label(),
            vals.iter().map(|v| v.as_ref().map_or("–".into(), |v| stat_cell(&v.rate, &v.runs))).collect(),
        );
        for k in [3, 0, 1, 2] {
            row(
                &mut md,
                &format!("{} {}", t.cpu_label(), CPU_PARTS[k]),
                vals.iter()
                    .map(|v| v.as_ref().map_or("–".into(), |v| stat_cell(&v.cpu[k], &BTreeSet::new())))
                    .collect(),
            );
        }
    }
    for (path, vals) in t.rows.iter().filter(|r| r.0 != t.baseline) {
        let pair = |f: &dyn Fn(&Values) -> f64, fmt: &dyn Fn(f64, f64) -> String| -> Vec<String> {
            vals.iter()
                .enumerate()
                .map(|(i, v)| match (v, t.base(i)) {
                    (Some(v), Some(b)) => fmt(f(v), f(b)),
                    _ => "–".into(),
                })
                .collect()
        };
        let r2 = |a: f64, b: f64| ratio(a, b).map_or("–".into(), |r| format!("{r:.2}"));
        row(&mut md, &format!("*{path} / {}*: {}", t.baseline, t.rate_label()), pair(&|v| v.rate.median, &r2));
        row(&mut md, &format!("*{path} / {}*: {} total", t.baseline, t.cpu_label()), pair(&|v| v.cpu[3].median, &r2));
        row(&mut md, &format!("*% difference*: {}", t.rate_label()), pair(&|v| v.rate.median, &pct));
        for k in [3, 0, 1, 2] {
            row(
                &mut md,
                &format!("*% difference*: {} {}", t.cpu_label(), CPU_PARTS[k]),
                pair(&|v| v.cpu[k].median, &pct),
            );
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
        if !h.ovs.is_empty() {
            let _ = writeln!(md, "  - {}", h.ovs);
        }
        for (p, why) in &r.skipped {
            let _ = writeln!(md, "  - skipped `{p}`: {why}");
        }
    }
    let _ = writeln!(md, "- Reproduce: `{}`", reproduce(sf));
    let _ = writeln!(
        md,
        "- Each cell ran {} s; {}; cells were interleaved across paths. {} cells measured.",
        o.duration_s,
        if o.reps == 1 {
            "one repetition".to_string()
        } else {
            format!("values are the median of {} repetitions with (min–max)", o.reps)
        },
        cells.len()
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
    md.push_str(pa);
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
            "{},{},{},{},{},{},{},{},{:.3},{},{},{},{:.2},{:.3},{:.4},{:.4},{:.4},{:.4},{:.4},{:.5},{:.1},{:.1},{}",
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
            }
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
        serde_json::to_vec_pretty(&serde_json::json!({ "schema": 1, "tables": ts }))?,
    )?;
    let report = dir.join("report.md");
    let pa = super::pa::section(Some(dir), sf, cells)?;
    std::fs::write(&report, markdown(sf, cells, &ts, &charts, &pa))?;
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_ranges_and_numbers() {
        let s = Stat::of(&[3.0, 1.0, 2.0]);
        assert_eq!((s.median, s.min, s.max, s.n), (2.0, 1.0, 3.0, 3));
        assert_eq!(Stat::of(&[1.0, 2.0]).median, 1.5);
        assert_eq!(Stat::of(&[]).n, 0);
        assert_eq!(num(18064.12), "18,064");
        assert_eq!(num(-1234567.0), "-1,234,567");
        assert_eq!(num(53.24), "53.24");
        assert_eq!(num(0.00855), "0.0086");
        assert_eq!(num(f64::NAN), "–");
        assert_eq!(pct(1.7293, 1.0), "+72.93%");
        assert_eq!(pct(1.0, 0.0), "–");
    }
}

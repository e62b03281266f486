//! A study's results as tables: per (workload, MTU, family) the values per path (and
//! condition), their ratios against the baseline, and the numbers' formatting.
//!
//! A ratio is the median of the per-repetition ratios (repetition k of one against
//! repetition k of the other: cells measured minutes apart at most), with their min–max;
//! "within noise" when the two sides' ranges of values overlap; † when a cell on either side
//! was measured while the host was noisy (`noise.rs`).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use serde::Serialize;

use sluice_bench::report::Per;

use super::conditions::Condition;
use super::noise::{Noise, Trust};
use super::record::{CellRecord, StudyFile};
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

    /// True if both have a spread (two repetitions or more) and their ranges overlap.
    pub fn overlaps(&self, o: &Stat) -> bool {
        self.n > 1 && o.n > 1 && self.min <= o.max && o.min <= self.max
    }
}

/// One repetition of a block: what the report compares repetition by repetition.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Rep {
    /// Transactions/s or MB/s.
    pub rate: f64,
    /// Total CPU per unit.
    pub cpu_total: f64,
    /// Mean latency, µs (0: not measured).
    pub latency_us: f64,
    /// What the host did besides it (`None`: not recorded).
    pub noise: Option<Noise>,
}

impl Rep {
    /// True if it was measured while the host was noisy.
    pub fn noisy(&self) -> bool {
        matches!(Trust::of(self.noise.as_ref()), Trust::Noisy(_))
    }
}

/// What one path measured at one connection count (under one condition).
#[derive(Clone, Debug, Default, Serialize)]
pub struct Values {
    /// Transactions/s or MB/s.
    pub rate: Stat,
    /// CPU per unit: guest, switch, other kernel, total.
    pub cpu: [Stat; 4],
    /// Mean latency, µs.
    pub latency: Stat,
    /// The runs the repetitions came from.
    pub runs: BTreeSet<u32>,
    /// Each repetition, by its number.
    pub reps: BTreeMap<u32, Rep>,
}

impl Values {
    /// True if a repetition was measured while the host was noisy.
    pub fn noisy(&self) -> bool {
        self.reps.values().any(Rep::noisy)
    }
}

/// A comparison of two blocks: the median of the per-repetition ratios and their range.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Ratio {
    /// Median of the ratios.
    pub median: f64,
    /// Smallest.
    pub min: f64,
    /// Largest.
    pub max: f64,
    /// Ratios (repetitions both sides have).
    pub n: usize,
    /// The two sides' ranges of values overlap: the difference is within the noise.
    pub within_noise: bool,
    /// A cell of either side was measured while the host was noisy.
    pub noisy: bool,
}

/// What a ratio compares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Figure {
    /// The rate.
    Rate,
    /// Total CPU per unit.
    CpuTotal,
    /// Mean latency.
    Latency,
}

impl Figure {
    fn of_rep(self, r: &Rep) -> f64 {
        match self {
            Figure::Rate => r.rate,
            Figure::CpuTotal => r.cpu_total,
            Figure::Latency => r.latency_us,
        }
    }

    fn of_values(self, v: &Values) -> Stat {
        match self {
            Figure::Rate => v.rate,
            Figure::CpuTotal => v.cpu[3],
            Figure::Latency => v.latency,
        }
    }
}

impl Ratio {
    /// `a` against `b` in `f`: paired by repetition where both have the same numbers,
    /// else the ratio of the medians with the range of the values' ratios. `None` over a
    /// zero.
    pub fn of(a: &Values, b: &Values, f: Figure) -> Option<Ratio> {
        let paired: Vec<f64> = a
            .reps
            .iter()
            .filter_map(|(k, ra)| b.reps.get(k).and_then(|rb| ratio(f.of_rep(ra), f.of_rep(rb))))
            .collect();
        let (sa, sb) = (f.of_values(a), f.of_values(b));
        let within_noise = sa.overlaps(&sb);
        let noisy = a.noisy() || b.noisy();
        if paired.is_empty() {
            let m = ratio(sa.median, sb.median)?;
            let lo = ratio(sa.min, sb.max).unwrap_or(m);
            let hi = ratio(sa.max, sb.min).unwrap_or(m);
            return Some(Ratio { median: m, min: lo, max: hi, n: 0, within_noise, noisy });
        }
        let st = Stat::of(&paired);
        Some(Ratio { median: st.median, min: st.min, max: st.max, n: st.n, within_noise, noisy })
    }

    /// "0.93 (0.90–0.95) within noise †".
    pub fn cell(&self) -> String {
        let mut out = format!("{:.2}", self.median);
        let (lo, hi) = (format!("{:.2}", self.min), format!("{:.2}", self.max));
        if self.n != 1 && lo != hi {
            let _ = write!(out, " ({lo}–{hi})");
        }
        if self.within_noise {
            out.push_str(" within noise");
        }
        if self.noisy {
            out.push_str(" †");
        }
        out
    }
}

/// One block of a table: a path under a condition.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    /// The path.
    pub path: String,
    /// The condition.
    pub condition: Condition,
    /// Per connection count.
    pub values: Vec<Option<Values>>,
}

impl Row {
    /// `path`, or `path [condition]` in a study with conditions.
    pub fn label(&self, conditions: bool) -> String {
        if conditions { format!("{} [{}]", self.path, self.condition) } else { self.path.clone() }
    }
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
    /// The study has conditions besides `quiet`: blocks are labelled with theirs.
    pub conditions: bool,
    /// Mean latency is shown (a study with conditions, for a workload that measures it).
    pub latency: bool,
    /// Per path and condition, per connection count.
    pub rows: Vec<Row>,
    /// One core's copy rate from memory, MB/s, as the first run measured it (a stream's
    /// rate is shown as a share of it).
    pub copy_mb_s: Option<f64>,
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

    /// The block of `path` under `c`.
    pub fn row(&self, path: &str, c: Condition) -> Option<&Row> {
        self.rows.iter().find(|r| r.path == path && r.condition == c)
    }

    /// The block `row` is compared with: the baseline under the same condition, else the
    /// baseline quiet.
    pub fn base_row(&self, row: &Row) -> Option<&Row> {
        self.row(&self.baseline, row.condition).or_else(|| self.row(&self.baseline, Condition::Quiet))
    }

    /// The baseline's values at column `i` for `row`.
    pub fn base(&self, row: &Row, i: usize) -> Option<&Values> {
        self.base_row(row).and_then(|r| r.values[i].as_ref())
    }

    /// `v`'s rate as a share of one core's copy rate from memory: the median, smallest and
    /// largest of its repetitions over that rate. `None` unless the table is of a stream
    /// (MB/s) and the copy rate was measured.
    pub fn copy_share(&self, v: &Values) -> Option<Ratio> {
        let c = self.copy_mb_s.filter(|c| self.per_mb && *c > 0.0)?;
        let r = v.rate;
        Some(Ratio {
            median: r.median / c,
            min: r.min / c,
            max: r.max / c,
            n: r.n,
            within_noise: false,
            noisy: v.noisy(),
        })
    }

    /// A file-name stem for this table.
    pub fn slug(&self) -> String {
        format!("{}-mtu{}-{}", self.workload, self.mtu, format!("{}", self.family).to_lowercase())
    }
}

/// The values of `reps` (a block's cells at one connection count).
fn values(reps: &[&CellRecord], per_mb: bool) -> Values {
    let rate_of = |c: &CellRecord| if per_mb { c.result.mb_per_s() } else { c.result.tps() };
    let cpu_of = |c: &CellRecord, k: usize| {
        if per_mb { c.result.cpu_ms_per_mb()[k] } else { c.result.cpu_us_per_transaction()[k] }
    };
    let cpu = |k: usize| Stat::of(&reps.iter().map(|c| cpu_of(c, k)).collect::<Vec<_>>());
    let lat: Vec<f64> = reps.iter().map(|c| c.result.latency.mean_us).filter(|x| *x > 0.0).collect();
    Values {
        rate: Stat::of(&reps.iter().map(|c| rate_of(c)).collect::<Vec<_>>()),
        cpu: [cpu(0), cpu(1), cpu(2), cpu(3)],
        latency: Stat::of(&lat),
        runs: reps.iter().map(|c| c.run).collect(),
        reps: reps
            .iter()
            .map(|c| {
                let rep = Rep {
                    rate: rate_of(c),
                    cpu_total: cpu_of(c, 3),
                    latency_us: c.result.latency.mean_us,
                    noise: c.noise,
                };
                (c.key.rep, rep)
            })
            .collect(),
    }
}

/// True if the study runs under a condition besides `quiet`.
pub fn has_conditions(sf: &StudyFile) -> bool {
    sf.study.conditions.iter().any(|c| *c != Condition::Quiet)
}

/// Builds the tables of `sf` from `cells`, paths in `paths` order (those with data), each
/// path's conditions in the study's order.
pub fn tables(sf: &StudyFile, cells: &[CellRecord]) -> Vec<Table> {
    let s = &sf.study;
    let paths: Vec<&String> = s.paths.iter().filter(|p| cells.iter().any(|c| &c.key.path == *p)).collect();
    let baseline = if paths.iter().any(|p| **p == sf.options.baseline) {
        sf.options.baseline.clone()
    } else {
        paths.first().map(|p| p.to_string()).unwrap_or_default()
    };
    let conditions = has_conditions(sf);
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
                let here: Vec<&CellRecord> =
                    of_w.iter().copied().filter(|c| c.key.mtu == mtu && c.key.family == family).collect();
                if here.is_empty() {
                    continue;
                }
                let mut rows = Vec::new();
                for p in &paths {
                    for &cond in &s.conditions {
                        let mine: Vec<&CellRecord> =
                            here.iter().copied().filter(|c| &c.key.path == *p && c.key.condition == cond).collect();
                        if mine.is_empty() {
                            continue;
                        }
                        let vals = s
                            .conns
                            .iter()
                            .map(|&n| {
                                let reps: Vec<&CellRecord> =
                                    mine.iter().copied().filter(|c| c.key.conns == n).collect();
                                (!reps.is_empty()).then(|| values(&reps, per_mb))
                            })
                            .collect();
                        rows.push(Row { path: p.to_string(), condition: cond, values: vals });
                    }
                }
                let latency =
                    conditions && rows.iter().flat_map(|r| r.values.iter().flatten()).any(|v| v.latency.n > 0);
                out.push(Table {
                    workload: w.name.clone(),
                    mtu,
                    family,
                    per_mb,
                    conns: s.conns.clone(),
                    baseline: baseline.clone(),
                    conditions,
                    latency,
                    rows,
                    copy_mb_s: sf.runs.first().and_then(|r| r.host.copy).map(|c| c.memory_mb_s),
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

/// `a / b`, or `None` when `b` is zero.
pub fn ratio(a: f64, b: f64) -> Option<f64> {
    (b.abs() > f64::EPSILON).then(|| a / b)
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
        assert_eq!(ratio(1.0, 0.0), None);
    }
}

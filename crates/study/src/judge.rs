//! What a study's report concludes, beside its tables: each run's verdict from its cells'
//! noise (QUIET or NOISY, with why), each goal checked per path and condition against
//! `quiet` or a control (MET, NOT MET, or NOT CLAIMABLE when a run it rests on was not quiet
//! or was a `--quick` look), each goal against the baseline checked per path (MET, NOT MET,
//! or NOT ESTABLISHED when a cell it reads was not measured quiet), what the conditions'
//! attackers did, and the noise of every cell.
//!
//! Every ratio is the tables' own ([`Ratio::of`]: the median of the per-repetition ratios
//! with their min–max), and a stream's share of one core's copy rate is
//! [`Table::copy_share`], as the tables print them.
//!
//! The rule the report states at its top: a results page may claim a goal only from a
//! QUIET run.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::conditions::Condition;
use super::noise::{self, OTHERS_LIMIT, STEAL_LIMIT, Trust, Verdict};
use super::record::{CellRecord, StudyFile};
use super::spec::{BaselineGoal, Bound, Goal, Versus};
use super::table::{Figure, Ratio, Stat, Table, Values, num};

/// The verdict of every run of the study, in run order.
pub fn verdicts(sf: &StudyFile, cells: &[CellRecord]) -> Vec<(u32, Verdict)> {
    sf.runs
        .iter()
        .map(|r| {
            let mine: Vec<Option<&noise::Noise>> =
                cells.iter().filter(|c| c.run == r.run).map(|c| c.noise.as_ref()).collect();
            (r.run, Verdict::of(&mine))
        })
        .collect()
}

/// The lines at the report's top: a verdict per run and the rule.
pub fn verdict_section(sf: &StudyFile, cells: &[CellRecord]) -> String {
    let mut md = String::new();
    for (run, v) in verdicts(sf, cells) {
        let why = match &v {
            Verdict::Quiet => format!(
                "every cell measured with steal at most {} and other processes' CPU at most {} of the machine",
                noise::pct(STEAL_LIMIT),
                noise::pct(OTHERS_LIMIT)
            ),
            Verdict::Noisy(w) => w.clone(),
            Verdict::NotRecorded if cells.iter().any(|c| c.run == run) => {
                "its cells were measured by a sluice that did not record the host's noise: not recorded".into()
            }
            Verdict::NotRecorded => "no cell of it finished".into(),
        };
        let _ = writeln!(md, "> **Run {run}: {}** — {why}.", v.word());
    }
    let _ = writeln!(
        md,
        ">\n> A results page may claim a goal only from a QUIET run (every cell with steal at most {} and other processes' CPU at most {}). Values and ratios marked † were measured while the host was noisy: not to be trusted.\n",
        noise::pct(STEAL_LIMIT),
        noise::pct(OTHERS_LIMIT)
    );
    md
}

/// Whether a goal's verdict can be claimed, and if not why.
#[derive(Clone, Debug, PartialEq)]
pub enum Claim {
    /// Every run it rests on was QUIET, and none was a `--quick` look.
    Yes,
    /// Why not.
    No(String),
}

/// One goal checked for one path under one condition.
#[derive(Clone, Debug)]
pub struct GoalLine {
    /// The path.
    pub path: String,
    /// The condition.
    pub condition: Condition,
    /// The worst of its tables' ratios (attacked / against), `None` when nothing compares.
    pub ratio: Option<Ratio>,
    /// Every table's ratio meets the goal.
    pub met: bool,
    /// Whether it may be claimed.
    pub claim: Claim,
}

impl GoalLine {
    /// MET, NOT MET, NOT CLAIMABLE (why) or NOT MEASURED.
    pub fn verdict(&self) -> String {
        match (&self.ratio, &self.claim) {
            (None, _) => "NOT MEASURED".into(),
            (Some(_), Claim::No(why)) => format!("NOT CLAIMABLE ({why})"),
            (Some(_), Claim::Yes) if self.met => "MET".into(),
            (Some(_), Claim::Yes) => "NOT MET".into(),
        }
    }
}

/// Checks `goal` on every path and condition it judges that the tables have: each against
/// the same path under the goal's `against`.
pub fn check(goal: &Goal, sf: &StudyFile, cells: &[CellRecord], tables: &[Table]) -> Vec<GoalLine> {
    let verdicts: BTreeMap<u32, Verdict> = verdicts(sf, cells).into_iter().collect();
    let figure = match goal.bound {
        Bound::KeepsRate(_) => Figure::Rate,
        Bound::LatencyWithin(_) => Figure::Latency,
    };
    let mine: Vec<&Table> = tables.iter().filter(|t| t.workload == goal.workload).collect();
    let mut out = Vec::new();
    for path in &sf.study.paths {
        if !goal.against.applies(path) {
            continue;
        }
        for cond in goal.judged(&sf.study.conditions).into_iter().filter(|c| c.applies(path)) {
            let mut ratios = Vec::new();
            for t in &mine {
                let (Some(a), Some(q)) = (t.row(path, cond), t.row(path, goal.against)) else { continue };
                for (x, y) in a.values.iter().zip(&q.values) {
                    if let (Some(x), Some(y)) = (x, y)
                        && let Some(r) = Ratio::of(x, y, figure)
                    {
                        ratios.push(r);
                    }
                }
            }
            if ratios.is_empty() && !cells.iter().any(|c| &c.key.path == path && c.key.condition == cond) {
                continue;
            }
            let met = !ratios.is_empty() && ratios.iter().all(|r| goal.met_by(r.median));
            let worst = ratios.iter().copied().reduce(|a, b| match goal.bound {
                Bound::KeepsRate(_) if b.median < a.median => b,
                Bound::LatencyWithin(_) if b.median > a.median => b,
                _ => a,
            });
            let runs: std::collections::BTreeSet<u32> = cells
                .iter()
                .filter(|c| {
                    c.key.workload == goal.workload
                        && &c.key.path == path
                        && (c.key.condition == cond || c.key.condition == goal.against)
                })
                .map(|c| c.run)
                .collect();
            let not_quiet: Vec<String> = runs
                .iter()
                .filter_map(|r| match verdicts.get(r) {
                    Some(Verdict::Quiet) => None,
                    Some(v) => Some(format!("run {r} {}", v.word())),
                    None => Some(format!("run {r} unknown")),
                })
                .collect();
            let claim = if sf.options.quick {
                Claim::No("a --quick look".into())
            } else if !not_quiet.is_empty() {
                Claim::No(format!("noisy run: {}", not_quiet.join(", ")))
            } else {
                Claim::Yes
            };
            out.push(GoalLine { path: path.clone(), condition: cond, ratio: worst, met, claim });
        }
    }
    out
}

/// One goal against the baseline checked for one path.
#[derive(Clone, Debug)]
pub struct BaselineLine {
    /// The path.
    pub path: String,
    /// The worst point compared ("nginx-1k at 50 conns") and its ratio (a share of the
    /// copy rate, for `copy_share_at_least`); `None` when nothing compares.
    pub worst: Option<(String, Ratio)>,
    /// Points (workload, connection count, MTU, family) compared.
    pub compared: usize,
    /// Every point compared meets the goal.
    pub met: bool,
    /// Points one side measured and the other not (or that give no ratio).
    pub missing: Vec<String>,
    /// Why the verdict cannot be established whatever the ratios say: a cell read was
    /// noisy, or has no noise record, or the run was a `--quick` look.
    pub unsure: Option<String>,
    /// Why nothing compares, when nothing does.
    pub unmeasured: Option<String>,
}

impl BaselineLine {
    /// MET, NOT MET, NOT ESTABLISHED (why), or NOT MEASURED.
    pub fn verdict(&self) -> String {
        if self.worst.is_none() {
            return match &self.unmeasured {
                Some(why) => format!("NOT MEASURED ({why})"),
                None => "NOT MEASURED".into(),
            };
        }
        if let Some(why) = &self.unsure {
            return format!("NOT ESTABLISHED ({why})");
        }
        if !self.missing.is_empty() {
            const SHOWN: usize = 3;
            let mut which = self.missing.iter().take(SHOWN).cloned().collect::<Vec<_>>().join(", ");
            if self.missing.len() > SHOWN {
                let _ = write!(which, " and {} more", self.missing.len() - SHOWN);
            }
            return format!("NOT ESTABLISHED (not measured: {which})");
        }
        if self.met { "MET".into() } else { "NOT MET".into() }
    }
}

/// Why cells cannot establish a goal: "noisy" when one was measured while the host was
/// noisy, "noise not recorded" when one has no record; `None` when every one was quiet.
fn unsure(values: &[&Values]) -> Option<&'static str> {
    let trust: Vec<Trust> = values.iter().flat_map(|v| v.reps.values()).map(|r| Trust::of(r.noise.as_ref())).collect();
    if trust.iter().any(|t| matches!(t, Trust::Noisy(_))) {
        Some("noisy")
    } else if trust.contains(&Trust::NotRecorded) {
        Some("noise not recorded")
    } else {
        None
    }
}

/// Checks `goal` on each of its paths: every point it reads (its workload, or every one, at
/// its connection count, or every one, at each MTU and family of the tables), the path
/// quiet against the study's baseline quiet, with the tables' own ratio.
pub fn check_baseline(goal: &BaselineGoal, sf: &StudyFile, tables: &[Table]) -> Vec<BaselineLine> {
    let s = &sf.study;
    let several_tables = s.mtus.len() > 1 || s.families.len() > 1;
    let mine: Vec<&Table> = tables.iter().filter(|t| goal.workload.as_ref().is_none_or(|w| *w == t.workload)).collect();
    let mut out = Vec::new();
    for path in &goal.paths {
        let mut line = BaselineLine {
            path: path.clone(),
            worst: None,
            compared: 0,
            met: true,
            missing: Vec::new(),
            unsure: None,
            unmeasured: None,
        };
        let mut unsure_why: Option<&'static str> = None;
        for t in &mine {
            let (p_row, b_row) = (t.row(path, Condition::Quiet), t.row(&s.baseline, Condition::Quiet));
            for (i, &n) in t.conns.iter().enumerate() {
                if goal.conns.is_some_and(|c| c != n) {
                    continue;
                }
                let mut label = format!("{} at {n} conn{}", t.workload, if n == 1 { "" } else { "s" });
                if several_tables {
                    let _ = write!(label, " (MTU {}, {})", t.mtu, t.family);
                }
                let pv = p_row.and_then(|r| r.values[i].as_ref());
                let bv = b_row.and_then(|r| r.values[i].as_ref());
                let (pv, bv) = match (pv, bv) {
                    (None, None) => continue,
                    (Some(pv), Some(bv)) => (pv, bv),
                    _ => {
                        line.missing.push(label);
                        continue;
                    }
                };
                let (ratio, read) = match goal.bound {
                    Versus::AtLeast(_) => (Ratio::of(pv, bv, Figure::Rate), vec![pv, bv]),
                    Versus::CpuAtMost(_) => (Ratio::of(pv, bv, Figure::CpuTotal), vec![pv, bv]),
                    Versus::LatencyAtMost(_) => {
                        let both = pv.latency.n > 0 && bv.latency.n > 0;
                        (both.then(|| Ratio::of(pv, bv, Figure::Latency)).flatten(), vec![pv, bv])
                    }
                    Versus::CopyShareAtLeast(_) => {
                        if !t.per_mb {
                            line.unmeasured = Some(format!("{} is not measured in MB/s", t.workload));
                        } else if t.copy_mb_s.is_none() {
                            line.unmeasured = Some("one core's copy rate was not measured".into());
                        }
                        (t.copy_share(pv), vec![pv])
                    }
                };
                let Some(r) = ratio else {
                    line.missing.push(label);
                    continue;
                };
                line.compared += 1;
                line.met &= goal.bound.met_by(r.median);
                if let Some(why) = unsure(&read)
                    && unsure_why != Some("noisy")
                {
                    unsure_why = Some(why);
                }
                let worse = line.worst.as_ref().is_none_or(|(_, w)| {
                    if goal.bound.higher_is_better() { r.median < w.median } else { r.median > w.median }
                });
                if worse {
                    line.worst = Some((label, r));
                }
            }
        }
        line.met &= line.compared > 0;
        line.unsure = if sf.options.quick { Some("a --quick look".into()) } else { unsure_why.map(String::from) };
        out.push(line);
    }
    out
}

/// The goals section: per goal a table of paths and conditions with their verdicts; then
/// per goal against the baseline a verdict line per path.
pub fn goals_section(sf: &StudyFile, cells: &[CellRecord], tables: &[Table]) -> String {
    let mut md = String::new();
    if sf.study.goals.is_empty() && sf.study.baseline_goals.is_empty() {
        return md;
    }
    let _ = writeln!(md, "## Goals\n");
    md.push_str(&baseline_goals(sf, tables));
    if sf.study.goals.is_empty() {
        return md;
    }
    let _ = writeln!(
        md,
        "Each path under each attack against the same path quiet, or, for a goal against a control, under the same load without the attack: the median of the per-repetition ratios (min–max), the worst over the tables of the workload. A goal is claimed only from QUIET runs.\n"
    );
    for g in &sf.study.goals {
        let what = match g.bound {
            Bound::KeepsRate(_) => format!("rate attacked / {}", g.against),
            Bound::LatencyWithin(_) => format!("mean latency attacked / {}", g.against),
        };
        let _ = writeln!(md, "**Goal: {}.**\n", g.describe());
        let _ = writeln!(md, "| path | condition | {what} | verdict |");
        let _ = writeln!(md, "|---|---|--:|---|");
        for l in check(g, sf, cells, tables) {
            let _ = writeln!(
                md,
                "| {} | {} | {} | **{}** |",
                l.path,
                l.condition,
                l.ratio.map_or("–".into(), |r| r.cell()),
                l.verdict()
            );
        }
        let _ = writeln!(md);
    }
    md
}

/// The verdict lines of the goals against the baseline.
fn baseline_goals(sf: &StudyFile, tables: &[Table]) -> String {
    let mut md = String::new();
    let s = &sf.study;
    if s.baseline_goals.is_empty() {
        return md;
    }
    let _ = writeln!(
        md,
        "Each path quiet against {b}, the baseline, quiet, at the goal's workload and connection count: the median of the per-repetition ratios (min–max), as in the tables' rows *path / {b}*; a stream's rate as a share of one core's copy rate (memory) is the median (min–max) of its repetitions. A goal over several workloads or connection counts shows its worst. A goal is established only when every cell it reads was measured quiet (steal at most {}, others' CPU at most {}), and not from a `--quick` look.\n",
        noise::pct(STEAL_LIMIT),
        noise::pct(OTHERS_LIMIT),
        b = s.baseline
    );
    for g in &s.baseline_goals {
        let what = g.describe(&s.baseline);
        for l in check_baseline(g, sf, tables) {
            let figure = match &l.worst {
                None => String::new(),
                Some((at, r)) => {
                    let shown = match g.bound {
                        Versus::CopyShareAtLeast(_) => share_cell(r),
                        _ => r.cell(),
                    };
                    if l.compared > 1 { format!(" — worst {at}: {shown}") } else { format!(" — {shown}") }
                }
            };
            let _ = writeln!(md, "- **{}**: {what}{figure} — **{}**", l.path, l.verdict());
        }
    }
    let _ = writeln!(md);
    md
}

/// A share of the copy rate as the tables show it: "52% (48–55%)", † when noisy.
fn share_cell(r: &Ratio) -> String {
    let pct = |x: f64| format!("{:.0}", x * 100.0);
    let mut out = format!("{}%", pct(r.median));
    if r.n > 1 && pct(r.min) != pct(r.max) {
        let _ = write!(out, " ({}–{}%)", pct(r.min), pct(r.max));
    }
    if r.noisy {
        out.push_str(" †");
    }
    out
}

/// What the conditions are and what their attackers did: per path and condition, the
/// medians over its cells of what the attackers counted (per second), their CPU, and what
/// the switch counted on their ports in the last cell.
pub fn conditions_section(sf: &StudyFile, cells: &[CellRecord]) -> String {
    let mut md = String::new();
    let attacked: Vec<Condition> = sf.study.conditions.iter().copied().filter(|c| *c != Condition::Quiet).collect();
    if attacked.is_empty() {
        return md;
    }
    let _ = writeln!(md, "## Conditions\n");
    for c in &sf.study.conditions {
        let _ = writeln!(md, "- **{c}**: {}.", c.about());
    }
    let _ = writeln!(
        md,
        "\nThe attackers (and a control's guests, which attack nothing) are threads of the study process; their own CPU is taken out of the cell's CPU columns and shown here. What the switch counted is on the attackers' ports (the tunnel ports, for the underlay), in the last cell.\n"
    );
    let _ = writeln!(
        md,
        "| path | condition | cells | the attackers, a second (median) | their CPU s (median) | the switch counted |"
    );
    let _ = writeln!(md, "|---|---|--:|---|--:|---|");
    for p in &sf.study.paths {
        for &c in &attacked {
            let mine: Vec<&CellRecord> =
                cells.iter().filter(|x| &x.key.path == p && x.key.condition == c && x.attack.is_some()).collect();
            if mine.is_empty() {
                continue;
            }
            let mut per_s: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
            for a in mine.iter().filter_map(|x| x.attack.as_ref()) {
                for (k, v) in &a.sent {
                    per_s.entry(k.as_str()).or_default().push(*v as f64 / a.seconds.max(1e-3));
                }
            }
            let sent: Vec<String> = per_s.iter().map(|(k, v)| format!("{k} {}", num(Stat::of(v).median))).collect();
            let cpu: Vec<f64> = mine.iter().filter_map(|x| x.attack.as_ref()).map(|a| a.cpu_s).collect();
            let last = mine.last().and_then(|x| x.attack.as_ref());
            let mut switch: Vec<String> = last
                .map(|a| a.switch.iter().map(|(k, v)| format!("{k} {}", num(*v as f64))).collect())
                .unwrap_or_default();
            if let Some(a) = last {
                switch.extend(a.link.iter().map(|l| format!("“{l}”")));
                switch.extend(a.problems.iter().map(|w| format!("problem: {w}")));
            }
            let _ = writeln!(
                md,
                "| {p} | {c} | {} | {} | {} | {} |",
                mine.len(),
                sent.join(", "),
                num(Stat::of(&cpu).median),
                if switch.is_empty() { "–".into() } else { switch.join(", ") }
            );
        }
    }
    let _ = writeln!(md);
    md
}

/// The noise of every cell, in the order they ran.
pub fn noise_section(cells: &[CellRecord]) -> String {
    let mut md = String::new();
    if cells.is_empty() {
        return md;
    }
    let _ = writeln!(md, "## The host's noise, cell by cell\n");
    let _ = writeln!(
        md,
        "**steal**: the share of the CPUs' time the hypervisor gave to others; **others' CPU**: the share used by processes that are not the study's (its own processes and namespaces, and kernel threads, left out). A cell is trusted when steal is at most {} and others' CPU at most {}.\n",
        noise::pct(STEAL_LIMIT),
        noise::pct(OTHERS_LIMIT)
    );
    let _ = writeln!(
        md,
        "| run | rep | path | condition | workload | conns | MTU | family | steal | others' CPU | trusted |"
    );
    let _ = writeln!(md, "|--:|--:|---|---|---|--:|--:|---|--:|--:|---|");
    for c in cells {
        let k = &c.key;
        let (steal, others) = c
            .noise
            .as_ref()
            .map_or(("not recorded".into(), "not recorded".into()), |n| (noise::pct(n.steal), noise::pct(n.others)));
        let trusted = match Trust::of(c.noise.as_ref()) {
            Trust::Quiet => "yes".to_string(),
            Trust::Noisy(why) => format!("no †: {why}"),
            Trust::NotRecorded => "not recorded".into(),
        };
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {steal} | {others} | {trusted} |",
            c.run, k.rep, k.path, k.condition, k.workload, k.conns, k.mtu, k.family
        );
    }
    let _ = writeln!(md);
    md
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::noise::Noise;
    use crate::record::{CellKey, HostInfo, Options, RunInfo};
    use crate::spec::Family;
    use crate::table::tables;

    /// Shared memory against TCP loopback, with a goal of each kind against the baseline.
    const SMC: &str = r#"name = "s"
baseline = "loopback"
paths = ["smc-loopback", "smc", "loopback"]
workloads = ["iperf3", "sockperf", "crr-64x8k"]
conns = [1, 50]
reps = 3
goals = [
  { workload = "iperf3", conns = 1, paths = ["smc-loopback", "smc"], at_least = 2.0 },
  { workload = "sockperf", conns = 1, paths = ["smc-loopback", "smc"], latency_at_most = 0.5 },
  { workload = "sockperf", conns = 1, paths = ["smc-loopback", "smc"], cpu_at_most = 1.0 },
  { workload = "iperf3", conns = 1, paths = ["smc-loopback"], copy_share_at_least = 0.5 },
  { workload = "*", paths = ["smc-loopback", "smc"], at_least = 0.95 },
]
"#;

    /// The study, run once on a host whose core copies 10,000 MB/s from memory.
    fn study_file(quick: bool) -> StudyFile {
        let study = crate::spec::parse(SMC, "s.toml", Path::new(".")).unwrap();
        let options = Options { duration_s: 10, reps: 3, baseline: "loopback".into(), pin: false, quick, file: None };
        let host = HostInfo {
            copy: Some(sluice_bench::copy::CopyRate { cached_mb_s: 40_000.0, memory_mb_s: 10_000.0 }),
            ..Default::default()
        };
        let runs = vec![RunInfo { run: 1, started: String::new(), host, skipped: vec![] }];
        StudyFile { study, options, runs }
    }

    /// A cell of 10 s: for iperf3 `rate` MB/s in one stream, else `rate` transactions a
    /// second of 1,200 bytes; `lat` µs mean latency, `cpu` CPU seconds, measured while other
    /// processes used 1% of the machine.
    fn cell(path: &str, workload: &str, conns: u32, rep: u32, rate: f64, lat: f64, cpu: f64) -> CellRecord {
        let mut result = sluice_bench::result::RunResult { duration_s: 10.0, ..Default::default() };
        if workload == "iperf3" {
            result.client.transactions = 1;
            result.client.bytes_sent = (rate * 1e6 * 10.0) as u64;
        } else {
            result.client.transactions = (rate * 10.0) as u64;
            result.client.bytes_sent = result.client.transactions * 200;
            result.client.bytes_received = result.client.transactions * 1000;
        }
        result.latency.mean_us = lat;
        result.cpu.guest_s = cpu;
        let key = CellKey {
            path: path.into(),
            workload: workload.into(),
            conns,
            mtu: 1500,
            family: Family::Ipv4,
            rep,
            condition: Condition::Quiet,
        };
        let noise = Some(Noise { seconds: 10.0, steal: 0.0, others: 0.01 });
        CellRecord { key, run: 1, at: String::new(), result, drops: None, noise, attack: None, daemon: None }
    }

    /// Three repetitions of every path, workload and connection count (sockperf at one
    /// connection only). `smc-loopback` streams 2.6–3.0× loopback's rate (57–63% of the copy
    /// rate), halves sockperf's round trip and its CPU, and sets up connections 1.1× (1.05×
    /// at 50) as fast; `smc` streams 1.5×, takes 0.6× the round trip for 1.33× the CPU, and
    /// sets up connections 0.98× as fast at 1 and 0.8× at 50, its worst.
    fn cells() -> Vec<CellRecord> {
        let mut v = Vec::new();
        for rep in 1..=3 {
            let d = f64::from(rep - 1);
            v.push(cell("loopback", "iperf3", 1, rep, 2000.0 + 100.0 * d, 0.0, 1.0));
            v.push(cell("smc-loopback", "iperf3", 1, rep, [6000.0, 6300.0, 5700.0][rep as usize - 1], 0.0, 1.0));
            v.push(cell("smc", "iperf3", 1, rep, 3000.0 + 150.0 * d, 0.0, 1.0));
            v.push(cell("loopback", "iperf3", 50, rep, 3000.0, 0.0, 1.0));
            v.push(cell("smc-loopback", "iperf3", 50, rep, 6000.0, 0.0, 1.0));
            v.push(cell("smc", "iperf3", 50, rep, 4500.0, 0.0, 1.0));
            v.push(cell("loopback", "sockperf", 1, rep, 20_000.0, 50.0, 2.0));
            v.push(cell("smc-loopback", "sockperf", 1, rep, 40_000.0, 20.0, 2.0));
            v.push(cell("smc", "sockperf", 1, rep, 30_000.0, 30.0, 4.0));
            for (n, lo, fast, slow) in [(1, 10_000.0, 11_000.0, 9_800.0), (50, 10_000.0, 10_500.0, 8_000.0)] {
                v.push(cell("loopback", "crr-64x8k", n, rep, lo, 100.0, 1.0));
                v.push(cell("smc-loopback", "crr-64x8k", n, rep, fast, 90.0, 1.0));
                v.push(cell("smc", "crr-64x8k", n, rep, slow, 110.0, 1.0));
            }
        }
        v
    }

    /// Each goal's verdict lines as the report prints them.
    fn lines(sf: &StudyFile, cells: &[CellRecord]) -> Vec<String> {
        let md = goals_section(sf, cells, &tables(sf, cells));
        md.lines().filter(|l| l.starts_with("- **")).map(String::from).collect()
    }

    #[test]
    fn each_path_meets_a_goal_against_the_baseline_or_not_and_every_workload_shows_its_worst() {
        let sf = study_file(false);
        let got = lines(&sf, &cells());
        assert_eq!(
            got,
            [
                "- **smc-loopback**: iperf3 at 1 conn: rate at least 2× loopback's — 3.00 (2.59–3.00) — **MET**",
                "- **smc**: iperf3 at 1 conn: rate at least 2× loopback's — 1.50 — **NOT MET**",
                "- **smc-loopback**: sockperf at 1 conn: mean latency at most 0.5× loopback's — 0.40 — **MET**",
                "- **smc**: sockperf at 1 conn: mean latency at most 0.5× loopback's — 0.60 — **NOT MET**",
                "- **smc-loopback**: sockperf at 1 conn: CPU per unit (total) at most 1× loopback's — 0.50 — **MET**",
                "- **smc**: sockperf at 1 conn: CPU per unit (total) at most 1× loopback's — 1.33 — **NOT MET**",
                "- **smc-loopback**: iperf3 at 1 conn: rate at least 50% of one core's copy rate (memory) — 60% (57–63%) — **MET**",
                "- **smc-loopback**: every workload at every connection count: rate at least 0.95× loopback's — worst crr-64x8k at 50 conns: 1.05 — **MET**",
                "- **smc**: every workload at every connection count: rate at least 0.95× loopback's — worst crr-64x8k at 50 conns: 0.80 — **NOT MET**",
            ]
        );
        // The `*` goal read every point both sides measured: iperf3 at 1 and 50, sockperf
        // at 1 (not at 50, where nothing ran), crr-64x8k at 1 and 50.
        let all = check_baseline(&sf.study.baseline_goals[4], &sf, &tables(&sf, &cells()));
        assert_eq!(all.iter().map(|l| l.compared).collect::<Vec<_>>(), [5, 5]);
        // The attack goals' table is not there: the study has none.
        let md = goals_section(&sf, &cells(), &tables(&sf, &cells()));
        assert!(md.starts_with("## Goals\n\nEach path quiet against loopback, the baseline, quiet"), "{md}");
        assert!(!md.contains("| path | condition |"), "{md}");
    }

    #[test]
    fn a_goal_is_not_established_from_a_noisy_cell_a_missing_one_or_a_quick_look() {
        let sf = study_file(false);
        // One of smc's crr-64x8k cells at 50 measured while the host was busy: its
        // every-workload goal is not established; smc-loopback's, which does not read it, is.
        let mut cs = cells();
        let busy = cs
            .iter_mut()
            .find(|c| c.key.path == "smc" && c.key.workload == "crr-64x8k" && c.key.conns == 50 && c.key.rep == 2)
            .unwrap();
        busy.noise = Some(Noise { seconds: 10.0, steal: 0.0, others: 0.4 });
        let got = lines(&sf, &cs);
        assert!(got[8].ends_with("worst crr-64x8k at 50 conns: 0.80 † — **NOT ESTABLISHED (noisy)**"), "{}", got[8]);
        assert!(got[7].ends_with("**MET**"), "{}", got[7]);
        // A noisy baseline cell: every goal that reads it, for every path.
        let mut cs = cells();
        cs.iter_mut().find(|c| c.key.path == "loopback" && c.key.workload == "sockperf").unwrap().noise =
            Some(Noise { seconds: 10.0, steal: 0.05, others: 0.0 });
        let got = lines(&sf, &cs);
        for l in &got[2..6] {
            assert!(l.ends_with(" † — **NOT ESTABLISHED (noisy)**"), "{l}");
        }
        assert!(got[0].ends_with("**MET**") && got[6].ends_with("**MET**"), "{got:?}");
        // Cells without a noise record establish nothing either.
        let mut cs = cells();
        cs.iter_mut().find(|c| c.key.path == "smc" && c.key.workload == "iperf3").unwrap().noise = None;
        assert!(lines(&sf, &cs)[1].ends_with("— 1.50 — **NOT ESTABLISHED (noise not recorded)**"));
        // A point the baseline measured and the path did not.
        let mut cs = cells();
        cs.retain(|c| !(c.key.path == "smc" && c.key.workload == "crr-64x8k" && c.key.conns == 1));
        let got = lines(&sf, &cs);
        assert!(got[8].ends_with("— **NOT ESTABLISHED (not measured: crr-64x8k at 1 conn)**"), "{}", got[8]);
        // A path that did not run at all.
        cs.retain(|c| c.key.path != "smc");
        let got = lines(&sf, &cs);
        assert_eq!(got[1], "- **smc**: iperf3 at 1 conn: rate at least 2× loopback's — **NOT MEASURED**");
        // A --quick look.
        let quick = study_file(true);
        for l in lines(&quick, &cells()) {
            assert!(l.ends_with("**NOT ESTABLISHED (a --quick look)**"), "{l}");
        }
        // No copy rate measured.
        let mut sf = study_file(false);
        sf.runs[0].host.copy = None;
        assert!(lines(&sf, &cells())[6].ends_with("— **NOT MEASURED (one core's copy rate was not measured)**"));
    }
}

//! What a study's report concludes, beside its tables: each run's verdict from its cells'
//! noise (QUIET or NOISY, with why), each goal checked per path and condition against
//! `quiet` or a control (MET, NOT MET, or NOT CLAIMABLE when a run it rests on was not quiet
//! or was a `--quick` look), what the conditions' attackers did, and the noise of every
//! cell.
//!
//! The rule the report states at its top: a results page may claim a goal only from a
//! QUIET run.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::conditions::Condition;
use super::noise::{self, OTHERS_LIMIT, STEAL_LIMIT, Trust, Verdict};
use super::record::{CellRecord, StudyFile};
use super::spec::{Bound, Goal};
use super::table::{Figure, Ratio, Stat, Table, num};

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

/// The goals section: per goal a table of paths and conditions with their verdicts.
pub fn goals_section(sf: &StudyFile, cells: &[CellRecord], tables: &[Table]) -> String {
    let mut md = String::new();
    if sf.study.goals.is_empty() {
        return md;
    }
    let _ = writeln!(md, "## Goals\n");
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

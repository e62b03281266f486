//! The study file: which paths to compare, with which workloads, at which connection
//! counts, MTUs and address families, how often and for how long (docs/study.md).
//!
//! Invariants of a [`Study`] that [`parse`] returns: every path is known and named once;
//! the baseline is one of the paths; every workload is a built-in profile or a profile.xml
//! that parses (its text is kept, so a resumed study runs what the first run ran); every
//! list is non-empty and every number is in range; every condition applies to at least
//! one of the paths; every goal names a workload of the study and compares with `quiet`,
//! which the conditions then hold with another, or with a control the conditions hold
//! with the condition it is the control of (`against = "vm-feed"`, with `rings`); every
//! goal against the baseline names a workload of the study (or `*`), a connection count
//! of the study (or none), paths of the study other than the baseline, and one bound that
//! the workload can measure. Errors name the file and line.

use std::path::Path;

use serde::{Deserialize, Serialize};
use toml::Spanned;

pub use crate::error::SpecError;
pub use sluice_lab::compared::{Family, PA_PATHS, PATHS, split_build};

pub use super::conditions::Condition;

/// The built-in studies: (name, study file text).
pub const BUILTINS: &[(&str, &str)] = &[
    ("vswitch-vs-router", include_str!("builtin/vswitch-vs-router.toml")),
    ("dedicated-vs-vswitch", include_str!("builtin/dedicated-vs-vswitch.toml")),
    ("layer2-vs-layer3", include_str!("builtin/layer2-vs-layer3.toml")),
    ("smc-vs-tcp", include_str!("builtin/smc-vs-tcp.toml")),
    ("kernel-vs-bridge", include_str!("builtin/kernel-vs-bridge.toml")),
    ("lossless-pa", include_str!("builtin/lossless-pa.toml")),
    ("overlay", include_str!("builtin/overlay.toml")),
    ("lossless-pa-2hosts", include_str!("builtin/lossless-pa-2hosts.toml")),
    ("switch-paths", include_str!("builtin/switch-paths.toml")),
    ("calibrate", include_str!("builtin/calibrate.toml")),
    ("hostile", include_str!("builtin/hostile.toml")),
    ("hostile-underlay", include_str!("builtin/hostile-underlay.toml")),
    ("capture-impact", include_str!("builtin/capture-impact.toml")),
    ("stopped-receiver", include_str!("builtin/stopped-receiver.toml")),
    ("kernel-upcalls", include_str!("builtin/kernel-upcalls.toml")),
    ("smc-cost", include_str!("builtin/smc-cost.toml")),
    ("soak", include_str!("builtin/soak.toml")),
    ("vm-paths", include_str!("builtin/vm-paths.toml")),
    ("policy", include_str!("builtin/policy.toml")),
];

/// A reference tool a workload runs instead of `sluice bench`: what users measure paths
/// with today, beside the modeler in the same study (calibration, and the paths compared
/// the way iperf3 and sockperf users compare them).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Tool {
    /// `iperf3 -c … -t D -P CONNS`: TCP streaming, the receiver's bytes.
    Iperf3,
    /// `sockperf ping-pong --tcp -m 200 --full-rtt`: TCP request-response of 200 bytes on
    /// one connection, round trips.
    Sockperf,
    /// nginx (master and workers, `sendfile on`, keep-alive: Debian's defaults) serving a
    /// 1 KB file to `wrk -c CONNS -d D`: requests/s.
    Nginx1k,
    /// The same nginx serving a 10 MB file: MB/s.
    Nginx10m,
    /// redis-server and `redis-benchmark -t get -c CONNS`: requests/s.
    RedisGet,
    /// As `redis-get`, with SET.
    RedisSet,
    /// ICMP echo round trips, 50 a second (`ping -i 0.02`), inside VMs only (`vm-sluice`,
    /// `vm-bridge`): their mean, and one over it as round trips per second.
    Ping,
}

impl Tool {
    /// Every tool.
    pub const ALL: [Tool; 7] =
        [Tool::Iperf3, Tool::Sockperf, Tool::Nginx1k, Tool::Nginx10m, Tool::RedisGet, Tool::RedisSet, Tool::Ping];

    /// The workload name a study file uses for it.
    pub fn name(self) -> &'static str {
        match self {
            Tool::Iperf3 => "iperf3",
            Tool::Sockperf => "sockperf",
            Tool::Nginx1k => "nginx-1k",
            Tool::Nginx10m => "nginx-10m",
            Tool::RedisGet => "redis-get",
            Tool::RedisSet => "redis-set",
            Tool::Ping => "ping",
        }
    }

    /// The programs it runs (each must be installed), and the Debian package of each.
    pub fn programs(self) -> &'static [(&'static str, &'static str)] {
        match self {
            Tool::Iperf3 => &[("iperf3", "iperf3")],
            Tool::Sockperf => &[("sockperf", "sockperf")],
            Tool::Nginx1k | Tool::Nginx10m => &[("nginx", "nginx"), ("wrk", "wrk")],
            Tool::RedisGet | Tool::RedisSet => &[("redis-server", "redis-server"), ("redis-benchmark", "redis-tools")],
            Tool::Ping => &[],
        }
    }
}

fn tool_names() -> String {
    Tool::ALL.iter().map(|t| t.name()).collect::<Vec<_>>().join(", ")
}

/// One workload: a built-in profile, a profile.xml with its text, or a reference tool.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Workload {
    /// The name the report uses: the built-in's name or the file's stem.
    pub name: String,
    /// As written in the study file.
    pub source: String,
    /// The profile.xml text (for a built-in, its text with `$h`, `$d`, `$n` unexpanded).
    pub text: String,
    /// A built-in profile (its variables are filled by the runner).
    pub builtin: bool,
    /// A reference tool instead of a profile.
    #[serde(default)]
    pub tool: Option<Tool>,
    /// A partition-aggregate point instead of a profile (`pa-Nmtu[-bgK]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pa: Option<PaPoint>,
}

/// One point of a partition-aggregate study (seed 004's Figure 7): one aggregator (the
/// path's client guest) queries [`PA_WORKERS`] workers (one guest each) and waits for
/// every answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PaPoint {
    /// Each worker's answer, in MTUs (the answer is this many times the path's MTU).
    pub response_mtus: u32,
    /// Long streams from the workers into the aggregator during the queries.
    pub background: u32,
}

/// Workers of a partition-aggregate point: five, as in seed 004's microbenchmark.
pub const PA_WORKERS: u32 = 5;

/// Largest answer of a partition-aggregate point, in MTUs.
pub const PA_MAX_MTUS: u32 = 8192;

/// Largest number of background streams of a partition-aggregate point.
pub const PA_MAX_BACKGROUND: u32 = 16;

/// Default `queries` of a study: seed 004's 10K repetitions per point.
pub const DEFAULT_PA_QUERIES: u64 = 10_000;

/// Reads a partition-aggregate workload name, `pa-8mtu` or `pa-8mtu-bg2`.
fn pa_point(src: &str) -> Option<Result<PaPoint, String>> {
    let rest = src.strip_prefix("pa-")?;
    let form = || {
        format!(
            "workload {src:?}: a partition-aggregate point is written pa-Nmtu or pa-Nmtu-bgK (answers of N MTUs, 1 to {PA_MAX_MTUS}, with K background streams, 0 to {PA_MAX_BACKGROUND}), e.g. pa-32mtu or pa-32mtu-bg2"
        )
    };
    let (size, bg) = match rest.split_once("-bg") {
        Some((s, b)) => (s, Some(b)),
        None => (rest, None),
    };
    let parse = || -> Option<PaPoint> {
        let n: u32 = size.strip_suffix("mtu")?.parse().ok()?;
        let k: u32 = match bg {
            Some(b) => b.parse().ok()?,
            None => 0,
        };
        ((1..=PA_MAX_MTUS).contains(&n) && k <= PA_MAX_BACKGROUND)
            .then_some(PaPoint { response_mtus: n, background: k })
    };
    Some(parse().ok_or_else(form))
}

/// A checked study.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Study {
    /// Short name (used in directory names).
    pub name: String,
    /// One-line title for the report.
    pub title: String,
    /// What it answers and what the seed found (a paragraph for the report).
    pub about: String,
    /// The path every other path is compared with.
    pub baseline: String,
    /// Paths, in report order.
    pub paths: Vec<String>,
    /// Workloads, in report order.
    pub workloads: Vec<Workload>,
    /// Concurrent connections.
    pub conns: Vec<u32>,
    /// MTUs of every interface on the path.
    pub mtus: Vec<u16>,
    /// Address families.
    pub families: Vec<Family>,
    /// Repetitions of every cell.
    pub reps: u32,
    /// Seconds of each run's timed transactions (a partition-aggregate point's upper bound).
    pub duration_s: u32,
    /// Queries per partition-aggregate point (it ends at this many or at `duration_s`,
    /// whichever comes first).
    #[serde(default = "default_queries")]
    pub queries: u64,
    /// What the host does while the cells run: `quiet`, or an attack (conditions.rs).
    #[serde(default = "quiet_only")]
    pub conditions: Vec<Condition>,
    /// What the study means to show under its attacks, checked in the report.
    #[serde(default)]
    pub goals: Vec<Goal>,
    /// What the study means to show of its paths against the baseline, checked in the
    /// report (written in the same `goals` list of the study file, with `paths`).
    #[serde(default)]
    pub baseline_goals: Vec<BaselineGoal>,
    /// Other sluice executables the study's `PATH@BUILD` paths run their switches with,
    /// by build name (the executable running the study is the unnamed build).
    #[serde(default)]
    pub builds: std::collections::BTreeMap<String, std::path::PathBuf>,
    /// Check what the runs left behind: the switch daemons' memory and descriptors over
    /// the cells, and the namespaces, interfaces and /dev/shm entries left after each run
    /// (`leftovers.rs`).
    #[serde(default)]
    pub leftovers: bool,
}

fn default_queries() -> u64 {
    DEFAULT_PA_QUERIES
}

fn quiet_only() -> Vec<Condition> {
    vec![Condition::Quiet]
}

/// A goal a study's report checks: under each attack (each condition but `quiet` and the
/// controls), every path keeps at least `keeps_rate` of its quiet rate, or its mean
/// latency stays within `latency_within` times its quiet one. Against a control instead
/// (`against`), under each attack whose control it is, against the same path under it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Goal {
    /// The workload it is about.
    pub workload: String,
    /// What it asks.
    pub bound: Bound,
    /// The condition the attacked cells are compared with: `quiet`, or a control.
    #[serde(default = "quiet")]
    pub against: Condition,
}

fn quiet() -> Condition {
    Condition::Quiet
}

/// A goal's bound, on the ratio of a path under a condition to the same path under the
/// goal's `against` (quiet, unless it names a control).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Bound {
    /// The rate keeps at least this share of quiet's.
    KeepsRate(f64),
    /// The mean latency (a round trip, for sockperf) is at most this many times quiet's.
    LatencyWithin(f64),
}

impl Goal {
    /// The goal in words.
    pub fn describe(&self) -> String {
        if self.against == Condition::Quiet {
            return match self.bound {
                Bound::KeepsRate(x) => {
                    format!("under every attack, {} keeps at least {:.0}% of its quiet rate", self.workload, x * 100.0)
                }
                Bound::LatencyWithin(x) => {
                    format!("under every attack, {}'s mean latency stays within {x}× of quiet", self.workload)
                }
            };
        }
        let attacks: Vec<&str> = self.judged(&Condition::ALL).iter().map(|c| c.name()).collect();
        let (on, ctl) = (attacks.join(", "), self.against);
        match self.bound {
            Bound::KeepsRate(x) => format!(
                "under {on}, {} keeps at least {:.0}% of its rate under {ctl} (the same load without the attack)",
                self.workload,
                x * 100.0
            ),
            Bound::LatencyWithin(x) => format!(
                "under {on}, {}'s mean latency stays within {x}× of its latency under {ctl} (the same load without the attack)",
                self.workload
            ),
        }
    }

    /// Of `conditions`, those the goal judges: against `quiet`, the attacks (neither
    /// `quiet` nor a control); against a control, the conditions it is the control of.
    pub fn judged(&self, conditions: &[Condition]) -> Vec<Condition> {
        conditions
            .iter()
            .copied()
            .filter(|c| match self.against {
                Condition::Quiet => *c != Condition::Quiet && !c.is_control(),
                ctl => c.control() == Some(ctl),
            })
            .collect()
    }

    /// True if `ratio` (attacked / quiet: of rates, or of latencies) meets it.
    pub fn met_by(&self, ratio: f64) -> bool {
        match self.bound {
            Bound::KeepsRate(x) => ratio >= x,
            Bound::LatencyWithin(x) => ratio <= x,
        }
    }
}

/// A goal against the study's baseline: each of `paths` quiet against the baseline quiet,
/// on one workload (or every one) at one connection count (or every one the study runs).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BaselineGoal {
    /// The workload, `None` for every workload of the study (`workload = "*"`).
    pub workload: Option<String>,
    /// The connection count, `None` for every count of the study.
    pub conns: Option<u32>,
    /// The paths judged, each against the baseline.
    pub paths: Vec<String>,
    /// What it asks.
    pub bound: Versus,
}

/// A bound of a goal against the baseline: on the ratio of a path to the baseline (the
/// median of the per-repetition ratios), or on a stream's share of one core's copy rate.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Versus {
    /// The rate is at least this many times the baseline's (`at_least`).
    AtLeast(f64),
    /// The mean latency (a round trip, for sockperf) is at most this many times the
    /// baseline's (`latency_at_most`).
    LatencyAtMost(f64),
    /// The total CPU per unit (per MB or per transaction) is at most this many times the
    /// baseline's (`cpu_at_most`).
    CpuAtMost(f64),
    /// The rate (MB/s) is at least this share of one core's copy rate from memory
    /// (`copy_share_at_least`).
    CopyShareAtLeast(f64),
}

impl Versus {
    /// The key the study file writes it with.
    pub fn key(self) -> &'static str {
        match self {
            Versus::AtLeast(_) => "at_least",
            Versus::LatencyAtMost(_) => "latency_at_most",
            Versus::CpuAtMost(_) => "cpu_at_most",
            Versus::CopyShareAtLeast(_) => "copy_share_at_least",
        }
    }

    /// True if larger ratios are better (the worst of several is the smallest).
    pub fn higher_is_better(self) -> bool {
        matches!(self, Versus::AtLeast(_) | Versus::CopyShareAtLeast(_))
    }

    /// True if `ratio` meets it.
    pub fn met_by(self, ratio: f64) -> bool {
        match self {
            Versus::AtLeast(x) | Versus::CopyShareAtLeast(x) => ratio >= x,
            Versus::LatencyAtMost(x) | Versus::CpuAtMost(x) => ratio <= x,
        }
    }
}

impl BaselineGoal {
    /// The goal in words, against `baseline`: "iperf3 at 1 conn: rate at least 2× loopback's".
    pub fn describe(&self, baseline: &str) -> String {
        let conns = |n: u32| format!("{n} conn{}", if n == 1 { "" } else { "s" });
        let at = match (&self.workload, self.conns) {
            (Some(w), Some(n)) => format!("{w} at {}", conns(n)),
            (Some(w), None) => format!("{w} at every connection count"),
            (None, Some(n)) => format!("every workload at {}", conns(n)),
            (None, None) => "every workload at every connection count".into(),
        };
        let what = match self.bound {
            Versus::AtLeast(x) => format!("rate at least {x}× {baseline}'s"),
            Versus::LatencyAtMost(x) => format!("mean latency at most {x}× {baseline}'s"),
            Versus::CpuAtMost(x) => format!("CPU per unit (total) at most {x}× {baseline}'s"),
            Versus::CopyShareAtLeast(x) => format!("rate at least {}% of one core's copy rate (memory)", x * 100.0),
        };
        format!("{at}: {what}")
    }
}

impl Study {
    /// True if some workload is a partition-aggregate point (every path then builds six
    /// guests).
    pub fn has_pa(&self) -> bool {
        self.workloads.iter().any(|w| w.pa.is_some())
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    name: Spanned<String>,
    #[serde(default)]
    title: String,
    #[serde(default)]
    about: String,
    baseline: Spanned<String>,
    paths: Spanned<Vec<Spanned<String>>>,
    workloads: Spanned<Vec<Spanned<String>>>,
    #[serde(default = "default_conns")]
    conns: Spanned<Vec<Spanned<u32>>>,
    #[serde(default = "default_mtus")]
    mtus: Spanned<Vec<Spanned<u16>>>,
    #[serde(default = "default_families")]
    families: Spanned<Vec<Spanned<String>>>,
    #[serde(default = "default_reps")]
    reps: Spanned<u32>,
    #[serde(default = "default_duration")]
    duration: Spanned<u32>,
    #[serde(default = "default_raw_queries")]
    queries: Spanned<u64>,
    #[serde(default = "default_conditions")]
    conditions: Spanned<Vec<Spanned<String>>>,
    #[serde(default)]
    goals: Vec<Spanned<RawGoal>>,
    #[serde(default = "no_builds")]
    builds: Spanned<std::collections::BTreeMap<String, Spanned<String>>>,
    #[serde(default)]
    leftovers: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawGoal {
    workload: String,
    #[serde(default)]
    keeps_rate: Option<f64>,
    #[serde(default)]
    latency_within: Option<f64>,
    #[serde(default)]
    against: Option<String>,
    #[serde(default)]
    conns: Option<u32>,
    #[serde(default)]
    paths: Option<Vec<String>>,
    #[serde(default)]
    at_least: Option<f64>,
    #[serde(default)]
    latency_at_most: Option<f64>,
    #[serde(default)]
    cpu_at_most: Option<f64>,
    #[serde(default)]
    copy_share_at_least: Option<f64>,
}

impl RawGoal {
    /// True if it is a goal against the baseline (it names paths, a connection count or
    /// one of their bounds).
    fn versus_baseline(&self) -> bool {
        self.paths.is_some()
            || self.conns.is_some()
            || self.at_least.is_some()
            || self.latency_at_most.is_some()
            || self.cpu_at_most.is_some()
            || self.copy_share_at_least.is_some()
    }
}

fn no_builds() -> Spanned<std::collections::BTreeMap<String, Spanned<String>>> {
    Spanned::new(0..0, std::collections::BTreeMap::new())
}

fn default_conditions() -> Spanned<Vec<Spanned<String>>> {
    Spanned::new(0..0, vec![Spanned::new(0..0, "quiet".into())])
}

fn default_raw_queries() -> Spanned<u64> {
    Spanned::new(0..0, DEFAULT_PA_QUERIES)
}

fn default_conns() -> Spanned<Vec<Spanned<u32>>> {
    Spanned::new(0..0, vec![Spanned::new(0..0, 1)])
}
fn default_mtus() -> Spanned<Vec<Spanned<u16>>> {
    Spanned::new(0..0, vec![Spanned::new(0..0, 1500)])
}
fn default_families() -> Spanned<Vec<Spanned<String>>> {
    Spanned::new(0..0, vec![Spanned::new(0..0, "ipv4".into())])
}
fn default_reps() -> Spanned<u32> {
    Spanned::new(0..0, 3)
}
fn default_duration() -> Spanned<u32> {
    Spanned::new(0..0, 20)
}

/// Largest connection count a cell may ask for.
pub const MAX_CONNS: u32 = 1000;

/// Finds a built-in study's text.
pub fn builtin(name: &str) -> Option<&'static str> {
    BUILTINS.iter().find(|b| b.0 == name).map(|b| b.1)
}

/// Parses and checks a study. `file` names it in errors; `dir` is where relative
/// profile paths are looked up.
pub fn parse(text: &str, file: &str, dir: &Path) -> Result<Study, SpecError> {
    let line_of = |pos: usize| text[..pos.min(text.len())].matches('\n').count() + 1;
    let err = |span: std::ops::Range<usize>, message: String| SpecError {
        file: file.into(),
        line: line_of(span.start),
        message,
    };
    let raw: Raw = toml::from_str(text).map_err(|e| {
        let line = e.span().map_or(1, |s| line_of(s.start));
        SpecError { file: file.into(), line, message: e.message().trim().to_string() }
    })?;

    let name = raw.name.get_ref().clone();
    let name_ok = !name.is_empty()
        && name.len() <= 40
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_');
    if !name_ok {
        return Err(err(raw.name.span(), "name must be 1 to 40 lowercase letters, digits, '-' or '_'".into()));
    }

    let mut builds = std::collections::BTreeMap::new();
    for (b, exe) in raw.builds.get_ref() {
        let ok = !b.is_empty()
            && b.len() <= 16
            && b.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
        if !ok {
            return Err(err(exe.span(), format!("build name {b:?}: 1 to 16 lowercase letters, digits or '-'")));
        }
        let exe_path = std::path::PathBuf::from(exe.get_ref());
        if !exe_path.is_absolute() {
            return Err(err(
                exe.span(),
                format!("build {b:?}: {:?} is not an absolute path; name the sluice executable in full", exe.get_ref()),
            ));
        }
        builds.insert(b.clone(), exe_path);
    }
    let mut paths: Vec<String> = Vec::new();
    for p in raw.paths.get_ref() {
        let n = p.get_ref();
        let (base, build) = split_build(n);
        if !PATHS.iter().any(|k| k.0 == base) {
            return Err(err(p.span(), format!("unknown path {base:?}; known paths: {}", path_names())));
        }
        if let Some(b) = build {
            if !BUILD_PATHS.contains(&base) {
                return Err(err(
                    p.span(),
                    format!(
                        "{n:?}: only the paths that start a sluice switch run with another build ({})",
                        BUILD_PATHS.join(", ")
                    ),
                ));
            }
            if !builds.contains_key(b) {
                return Err(err(
                    p.span(),
                    format!(
                        "{n:?}: no build {b:?}; name its executable in builds, e.g. builds = {{ {b} = \"/usr/local/bin/sluice-{b}\" }}"
                    ),
                ));
            }
        }
        if paths.contains(n) {
            return Err(err(p.span(), format!("path {n:?} is listed twice")));
        }
        paths.push(n.clone());
    }
    if paths.is_empty() {
        return Err(err(raw.paths.span(), format!("paths is empty; name one or more of: {}", path_names())));
    }
    let baseline = raw.baseline.get_ref().clone();
    if !paths.contains(&baseline) {
        return Err(err(
            raw.baseline.span(),
            format!("baseline {baseline:?} is not one of the study's paths ({})", paths.join(", ")),
        ));
    }

    let mut workloads: Vec<Workload> = Vec::new();
    for w in raw.workloads.get_ref() {
        let src = w.get_ref();
        let wl = workload(src, dir).map_err(|m| err(w.span(), m))?;
        if workloads.iter().any(|x| x.name == wl.name) {
            return Err(err(w.span(), format!("workload {:?} is listed twice", wl.name)));
        }
        workloads.push(wl);
    }
    if workloads.is_empty() {
        return Err(err(
            raw.workloads.span(),
            format!(
                "workloads is empty; name built-in profiles ({}) or profile.xml files",
                sluice_bench::builtin::names()
            ),
        ));
    }

    let mut conns = Vec::new();
    for c in raw.conns.get_ref() {
        if !(1..=MAX_CONNS).contains(c.get_ref()) {
            return Err(err(c.span(), format!("conns {} is out of range: use 1 to {MAX_CONNS}", c.get_ref())));
        }
        conns.push(*c.get_ref());
    }
    if raw.workloads.get_ref().iter().any(|w| w.get_ref() == "sockperf") && !conns.contains(&1) {
        return Err(err(
            raw.conns.span(),
            "workload \"sockperf\" measures one connection, and conns has no 1: add 1 (its cells at other counts are left out)".into(),
        ));
    }
    let mut mtus = Vec::new();
    for m in raw.mtus.get_ref() {
        if !(1280..=9000).contains(m.get_ref()) {
            return Err(err(
                m.span(),
                format!("mtu {} is out of range: use 1280 (IPv6's minimum) to 9000", m.get_ref()),
            ));
        }
        mtus.push(*m.get_ref());
    }
    let mut families = Vec::new();
    for f in raw.families.get_ref() {
        let fam = match f.get_ref().to_ascii_lowercase().as_str() {
            "ipv4" | "inet" | "4" => Family::Ipv4,
            "ipv6" | "inet6" | "6" => Family::Ipv6,
            other => return Err(err(f.span(), format!("unknown address family {other:?}: use ipv4 or ipv6"))),
        };
        families.push(fam);
    }
    for (list, empty) in [
        (raw.conns.span(), conns.is_empty()),
        (raw.mtus.span(), mtus.is_empty()),
        (raw.families.span(), families.is_empty()),
    ] {
        if empty {
            return Err(err(list, "this list is empty; give at least one value".into()));
        }
    }
    let reps = *raw.reps.get_ref();
    if !(1..=50).contains(&reps) {
        return Err(err(raw.reps.span(), format!("reps {reps} is out of range: use 1 to 50")));
    }
    let queries = *raw.queries.get_ref();
    if !(1..=10_000_000).contains(&queries) {
        return Err(err(raw.queries.span(), format!("queries {queries} is out of range: use 1 to 10000000")));
    }
    if let Some(w) = raw.workloads.get_ref().iter().find(|w| w.get_ref().starts_with("pa-"))
        && let Some(p) = paths.iter().find(|p| !PA_PATHS.contains(&split_build(p).0))
    {
        return Err(err(
            w.span(),
            format!(
                "workload {:?} needs six guests, and path {p:?} builds two; partition-aggregate points run on {}",
                w.get_ref(),
                PA_PATHS.join(", ")
            ),
        ));
    }
    if let Some(p) = paths.iter().find(|p| sluice_lab::compared::VM_PATHS.contains(&p.as_str()))
        && let Some(w) = raw.workloads.get_ref().iter().find(|w| !["iperf3", "ping"].contains(&w.get_ref().as_str()))
    {
        return Err(err(
            w.span(),
            format!("workload {:?} cannot run on path {p:?}: inside its VMs only iperf3 and ping run", w.get_ref()),
        ));
    }
    if raw.workloads.get_ref().iter().any(|w| w.get_ref() == "ping")
        && let Some(p) = paths.iter().find(|p| !sluice_lab::compared::VM_PATHS.contains(&p.as_str()))
    {
        return Err(err(
            raw.workloads.span(),
            format!("workload \"ping\" runs inside VMs only (vm-sluice, vm-bridge), not on path {p:?}"),
        ));
    }
    let duration_s = *raw.duration.get_ref();
    if !(1..=3600).contains(&duration_s) {
        return Err(err(raw.duration.span(), format!("duration {duration_s} is out of range: use 1 to 3600 seconds")));
    }
    let mut conditions: Vec<Condition> = Vec::new();
    for c in raw.conditions.get_ref() {
        let Some(cond) = Condition::parse(c.get_ref()) else {
            return Err(err(
                c.span(),
                format!("unknown condition {:?}; known conditions: {}", c.get_ref(), condition_names()),
            ));
        };
        if conditions.contains(&cond) {
            return Err(err(c.span(), format!("condition {cond:?} is listed twice")));
        }
        if !paths.iter().any(|p| cond.applies(p)) {
            return Err(err(
                c.span(),
                format!(
                    "condition {:?} applies to {}; none of this study's paths ({}) takes it",
                    cond.name(),
                    cond.paths().unwrap_or_default().join(", "),
                    paths.join(", ")
                ),
            ));
        }
        conditions.push(cond);
    }
    if conditions.is_empty() {
        return Err(err(
            raw.conditions.span(),
            format!("conditions is empty; name one or more of: {}", condition_names()),
        ));
    }
    let mut goals = Vec::new();
    let mut baseline_goals = Vec::new();
    for g in &raw.goals {
        let rg = g.get_ref();
        if rg.versus_baseline() {
            let goal =
                baseline_goal(rg, &baseline, &paths, &workloads, &conns, &conditions).map_err(|m| err(g.span(), m))?;
            baseline_goals.push(goal);
            continue;
        }
        let Some(w) = workloads.iter().find(|w| w.name == rg.workload) else {
            return Err(err(
                g.span(),
                format!(
                    "goal about workload {:?}, which the study does not run ({})",
                    rg.workload,
                    workloads.iter().map(|w| w.name.as_str()).collect::<Vec<_>>().join(", ")
                ),
            ));
        };
        let bound = match (rg.keeps_rate, rg.latency_within) {
            (Some(x), None) if x > 0.0 && x <= 10.0 => Bound::KeepsRate(x),
            (None, Some(x)) if (1.0..=1000.0).contains(&x) => Bound::LatencyWithin(x),
            (Some(_), None) => {
                return Err(err(g.span(), "keeps_rate must be more than 0 and at most 10 (0.9: 90%)".into()));
            }
            (None, Some(_)) => return Err(err(g.span(), "latency_within must be 1 to 1000 (2: twice quiet's)".into())),
            _ => {
                return Err(err(
                    g.span(),
                    "a goal has either keeps_rate (e.g. 0.9: at least 90% of the quiet rate) or latency_within (e.g. 2: at most twice the quiet latency)".into(),
                ));
            }
        };
        if matches!(bound, Bound::LatencyWithin(_)) && (w.tool == Some(Tool::Iperf3) || w.tool == Some(Tool::Nginx10m))
        {
            return Err(err(g.span(), format!("workload {:?} measures no latency; give it keeps_rate", w.name)));
        }
        if w.pa.is_some() {
            return Err(err(g.span(), "partition-aggregate points run quiet only: a goal cannot compare them".into()));
        }
        let against = match rg.against.as_deref() {
            None | Some("quiet") => Condition::Quiet,
            Some(name) => {
                let controls = || {
                    Condition::ALL
                        .iter()
                        .filter_map(|c| c.control().map(|k| format!("{k} (for {c})")))
                        .collect::<Vec<_>>()
                        .join(", ")
                };
                let Some(ctl) = Condition::parse(name).filter(|c| c.is_control()) else {
                    return Err(err(
                        g.span(),
                        format!(
                            "against = {name:?} is no control condition; a goal is judged against \"quiet\" (the default) or a control: {}",
                            controls()
                        ),
                    ));
                };
                ctl
            }
        };
        let goal = Goal { workload: w.name.clone(), bound, against };
        if against == Condition::Quiet {
            if !conditions.contains(&Condition::Quiet) || goal.judged(&conditions).is_empty() {
                return Err(err(
                    g.span(),
                    "a goal compares each path under an attack with the same path quiet: conditions needs \"quiet\" and at least one other that is an attack, not a control".into(),
                ));
            }
        } else if !conditions.contains(&against) || goal.judged(&conditions).is_empty() {
            let of: Vec<&str> = goal.judged(&Condition::ALL).iter().map(|c| c.name()).collect();
            return Err(err(
                g.span(),
                format!(
                    "a goal against \"{against}\" compares each path under {} with the same path under \"{against}\": conditions needs both",
                    of.join(", ")
                ),
            ));
        }
        goals.push(goal);
    }
    Ok(Study {
        title: if raw.title.is_empty() { name.clone() } else { raw.title },
        name,
        about: raw.about.trim().to_string(),
        baseline,
        paths,
        workloads,
        conns,
        mtus,
        families,
        reps,
        duration_s,
        queries,
        conditions,
        goals,
        baseline_goals,
        builds,
        leftovers: raw.leftovers,
    })
}

/// Checks a goal against the baseline (`rg` names paths, a connection count or one of the
/// bounds `at_least`, `latency_at_most`, `cpu_at_most`, `copy_share_at_least`).
fn baseline_goal(
    rg: &RawGoal,
    baseline: &str,
    paths: &[String],
    workloads: &[Workload],
    conns: &[u32],
    conditions: &[Condition],
) -> Result<BaselineGoal, String> {
    const BOUNDS: &str = "at_least (rate), latency_at_most, cpu_at_most or copy_share_at_least";
    if rg.keeps_rate.is_some() || rg.latency_within.is_some() || rg.against.is_some() {
        return Err(format!(
            "a goal either compares paths with the baseline (paths, with {BOUNDS}) or each path under attack with itself (keeps_rate or latency_within, with against): not both"
        ));
    }
    let Some(named) = &rg.paths else {
        return Err(format!(
            "a goal with {BOUNDS} compares paths with the baseline {baseline:?}: name them, e.g. paths = [{:?}]",
            paths.iter().find(|p| *p != baseline).map_or("PATH", |p| p.as_str())
        ));
    };
    let bounds = [
        rg.at_least.map(Versus::AtLeast),
        rg.latency_at_most.map(Versus::LatencyAtMost),
        rg.cpu_at_most.map(Versus::CpuAtMost),
        rg.copy_share_at_least.map(Versus::CopyShareAtLeast),
    ];
    let bound = match bounds.iter().flatten().collect::<Vec<_>>()[..] {
        [b] => *b,
        [] => return Err(format!("a goal against the baseline needs one bound: {BOUNDS}")),
        [..] => {
            let keys: Vec<&str> = bounds.iter().flatten().map(|b| b.key()).collect();
            return Err(format!(
                "a goal against the baseline has one bound, and this one has {}: write a goal for each",
                keys.join(" and ")
            ));
        }
    };
    let (Versus::AtLeast(x) | Versus::LatencyAtMost(x) | Versus::CpuAtMost(x) | Versus::CopyShareAtLeast(x)) = bound;
    let top = if matches!(bound, Versus::CopyShareAtLeast(_)) { 10.0 } else { 1000.0 };
    if !(x > 0.0 && x <= top) {
        return Err(format!("{} must be more than 0 and at most {top}", bound.key()));
    }
    if !conditions.contains(&Condition::Quiet) {
        return Err("a goal against the baseline compares quiet cells: conditions needs \"quiet\"".into());
    }
    let workload = match rg.workload.as_str() {
        "*" => {
            if !matches!(bound, Versus::AtLeast(_)) {
                return Err(format!(
                    "workload = \"*\" (every workload) takes at_least only, not {}: name the workload",
                    bound.key()
                ));
            }
            None
        }
        name => {
            let Some(w) = workloads.iter().find(|w| w.name == name) else {
                return Err(format!(
                    "goal about workload {name:?}, which the study does not run ({}, or \"*\" for every one)",
                    workloads.iter().map(|w| w.name.as_str()).collect::<Vec<_>>().join(", ")
                ));
            };
            if w.pa.is_some() {
                return Err("partition-aggregate points have a section of their own: a goal cannot compare them".into());
            }
            let streams = [Tool::Iperf3, Tool::Nginx10m];
            match (bound, w.tool) {
                (Versus::LatencyAtMost(_), Some(t)) if streams.contains(&t) => {
                    return Err(format!("workload {name:?} measures no latency; give it at_least or cpu_at_most"));
                }
                (Versus::CopyShareAtLeast(_), Some(t)) if !streams.contains(&t) => {
                    return Err(format!(
                        "workload {name:?} is measured in requests or round trips a second, not MB/s: copy_share_at_least needs a stream"
                    ));
                }
                _ => {}
            }
            if w.tool == Some(Tool::Sockperf) && rg.conns.is_some_and(|n| n != 1) {
                return Err("workload \"sockperf\" measures one connection: give it conns = 1".into());
            }
            Some(w.name.clone())
        }
    };
    if let Some(n) = rg.conns
        && !conns.contains(&n)
    {
        return Err(format!(
            "conns = {n}: the study runs {}",
            conns.iter().map(|c| c.to_string()).collect::<Vec<_>>().join(", ")
        ));
    }
    if named.is_empty() {
        return Err("paths is empty: name the paths to compare with the baseline".into());
    }
    let mut out: Vec<String> = Vec::new();
    for p in named {
        if p == baseline {
            return Err(format!("path {p:?} is the baseline: a goal compares other paths with it"));
        }
        if !paths.contains(p) {
            return Err(format!("path {p:?} is not one of the study's paths ({})", paths.join(", ")));
        }
        if out.contains(p) {
            return Err(format!("path {p:?} is listed twice"));
        }
        out.push(p.clone());
    }
    Ok(BaselineGoal { workload, conns: rg.conns, paths: out, bound })
}

/// The paths whose switch a study may start with another build (`PATH@BUILD`).
pub const BUILD_PATHS: &[&str] = &[
    "sluice-l2",
    "sluice-l2-lossless",
    "sluice-l2-poll",
    "sluice-l2-stream",
    "sluice-l2-lossless-stream",
    "sluice-l2-lossless-stream-hold1",
    "sluice-l2-lossless-stream-zovn",
    "sluice-l3",
    "sluice-l2-lan",
    "sluice-l3-lan",
    "smc",
    "smc-loopback",
    "sluice-kernel",
    "sluice-kernel-acl",
    "sluice-kernel-l3",
    "overlay-sluice",
    "overlay-sluice-kernel",
    "overlay-sluice-lossless",
    "overlay-mixed",
];

fn condition_names() -> String {
    Condition::ALL.iter().map(|c| c.name()).collect::<Vec<_>>().join(", ")
}

fn path_names() -> String {
    PATHS.iter().map(|p| p.0).collect::<Vec<_>>().join(", ")
}

/// Resolves a workload: a built-in profile name, or a profile.xml file (relative to `dir`).
fn workload(src: &str, dir: &Path) -> Result<Workload, String> {
    if let Some(text) = sluice_bench::builtin::get(src) {
        return Ok(Workload {
            name: src.into(),
            source: src.into(),
            text: text.into(),
            builtin: true,
            tool: None,
            pa: None,
        });
    }
    for tool in Tool::ALL {
        if src == tool.name() {
            return Ok(Workload {
                name: src.into(),
                source: src.into(),
                text: String::new(),
                builtin: false,
                tool: Some(tool),
                pa: None,
            });
        }
    }
    if let Some(point) = pa_point(src) {
        let pa = Some(point?);
        return Ok(Workload {
            name: src.into(),
            source: src.into(),
            text: String::new(),
            builtin: false,
            tool: None,
            pa,
        });
    }
    if src == "pa" {
        return Err("workload \"pa\" needs its answer size: write pa-Nmtu or pa-Nmtu-bgK, e.g. pa-32mtu-bg2 (answers of 32 MTUs with two background streams)".into());
    }
    let p = if Path::new(src).is_absolute() { Path::new(src).to_path_buf() } else { dir.join(src) };
    if !p.exists() {
        return Err(format!(
            "unknown workload {src:?}: not a built-in profile ({}), a reference tool ({}) or a file {}",
            sluice_bench::builtin::names(),
            tool_names(),
            p.display()
        ));
    }
    let text = std::fs::read_to_string(&p).map_err(|e| format!("reading workload {}: {e}", p.display()))?;
    let env = |v: &str| std::env::var(v).ok();
    sluice_bench::profile::parse(&text, &p.display().to_string(), &env)
        .map_err(|e| format!("workload {src:?}: {e}"))?;
    let name = p.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| src.into());
    Ok(Workload { name, source: src.into(), text, builtin: false, tool: None, pa: None })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(text: &str) -> Result<Study, SpecError> {
        parse(text, "t.toml", Path::new("/nonexistent"))
    }

    const OK: &str = r#"name = "tiny"
baseline = "direct"
paths = ["direct", "linux-bridge"]
workloads = ["rr-200x1000"]
conns = [1, 10]
mtus = [1500, 8992]
families = ["ipv4", "ipv6"]
reps = 2
duration = 3
"#;

    #[test]
    fn a_good_study_parses_with_its_lists() {
        let s = p(OK).unwrap();
        assert_eq!(s.paths, ["direct", "linux-bridge"]);
        assert_eq!(s.conns, [1, 10]);
        assert_eq!(s.mtus, [1500, 8992]);
        assert_eq!(s.families, [Family::Ipv4, Family::Ipv6]);
        assert_eq!((s.reps, s.duration_s), (2, 3));
        assert!(s.workloads[0].builtin && s.workloads[0].text.contains("<profile"));
    }

    #[test]
    fn paths_may_run_with_another_build_named_in_builds() {
        let two = OK.replace("\"linux-bridge\"]", "\"sluice-kernel\", \"sluice-kernel@before\"]")
            + "builds = { before = \"/usr/local/bin/sluice-before\" }\n";
        let s = p(&two).unwrap();
        assert_eq!(s.paths, ["direct", "sluice-kernel", "sluice-kernel@before"]);
        assert_eq!(s.builds["before"], std::path::Path::new("/usr/local/bin/sluice-before"));
        assert_eq!(split_build("sluice-kernel@before"), ("sluice-kernel", Some("before")));
        assert!(Condition::MacFlood.applies("sluice-kernel@before"));
        for (text, what) in [
            (two.replace("builds = { before", "builds = { after"), "no build \"before\""),
            (two.replace("/usr/local/bin/sluice-before", "sluice-before"), "not an absolute path"),
            (two.replace("builds = { before", "builds = { Before").replace("@before", "@Before"), "build name"),
            (
                two.replace("\"sluice-kernel@before\"", "\"linux-bridge@before\""),
                "only the paths that start a sluice switch",
            ),
        ] {
            let e = p(&text).unwrap_err();
            assert!(e.message.contains(what), "{what}: {e}");
        }
    }

    #[test]
    fn errors_name_the_line_and_the_fault() {
        let cases = [
            (OK.replace("\"linux-bridge\"]", "\"linux-bridge\", \"hub\"]"), 3, "unknown path \"hub\""),
            (OK.replace("rr-200x1000", "rr-9"), 4, "unknown workload \"rr-9\""),
            (OK.replace("baseline = \"direct\"", "baseline = \"router\""), 2, "not one of the study's paths"),
            (OK.replace("mtus = [1500, 8992]", "mtus = [1500, 9500]"), 6, "9500"),
            (OK.replace("\"ipv6\"", "\"ipx\""), 7, "ipx"),
            (OK.replace("reps = 2", "reps = 0"), 8, "reps 0"),
            (OK.replace("duration = 3", "duraton = 3"), 9, "duraton"),
            (OK.replace("conns = [1, 10]", "conns = [1, 1001]"), 5, "1001"),
            (OK.replace("\"linux-bridge\"]", "\"direct\"]"), 3, "twice"),
            (OK.replace("rr-200x1000", "pa"), 4, "pa-Nmtu"),
            (OK.replace("rr-200x1000", "pa-3kb"), 4, "pa-Nmtu-bgK"),
            (OK.replace("rr-200x1000", "pa-0mtu"), 4, "1 to 8192"),
            (OK.replace("rr-200x1000", "pa-2mtu-bg99"), 4, "0 to 16"),
            (OK.replace("rr-200x1000", "pa-2mtu"), 4, "path \"direct\" builds two"),
            (OK.replace("duration = 3", "duration = 3\nqueries = 0"), 10, "queries 0"),
            (OK.replace("duration = 3", "duration = 3\nconditions = [\"storm\"]"), 10, "unknown condition \"storm\""),
            (
                OK.replace("duration = 3", "duration = 3\nconditions = [\"quiet\", \"rings\"]"),
                10,
                "none of this study's paths (direct, linux-bridge) takes it",
            ),
            (
                OK.replace("duration = 3", "duration = 3\nconditions = [\"quiet\", \"mac-flood\", \"quiet\"]"),
                10,
                "listed twice",
            ),
            (OK.replace("duration = 3", "duration = 3\nconditions = []"), 10, "conditions is empty"),
            (
                OK.replace("duration = 3", "duration = 3\ngoals = [{ workload = \"rr-200x1000\", keeps_rate = 0.9 }]"),
                10,
                "needs \"quiet\" and at least one other",
            ),
            (
                OK.replace(
                    "duration = 3",
                    "duration = 3\nconditions = [\"quiet\", \"mac-flood\"]\ngoals = [{ workload = \"iperf3\", keeps_rate = 0.9 }]",
                ),
                11,
                "does not run (rr-200x1000)",
            ),
            (
                OK.replace(
                    "duration = 3",
                    "duration = 3\nconditions = [\"quiet\", \"mac-flood\"]\ngoals = [{ workload = \"rr-200x1000\" }]",
                ),
                11,
                "either keeps_rate",
            ),
            (
                RINGS.replace("GOAL", "against = \"rings\""),
                11,
                "against = \"rings\" is no control condition; a goal is judged against \"quiet\" (the default) or a control: vm-feed (for rings)",
            ),
            (RINGS.replace("GOAL", "against = \"storm\""), 11, "against = \"storm\" is no control condition"),
            (
                RINGS.replace("GOAL", "against = \"vm-feed\"").replace(", \"vm-feed\"]", "]"),
                11,
                "a goal against \"vm-feed\" compares each path under rings with the same path under \"vm-feed\": conditions needs both",
            ),
            (
                RINGS.replace("GOAL", "against = \"vm-feed\"").replace("\"rings\", ", ""),
                11,
                "conditions needs both",
            ),
            (
                RINGS.replace("GOAL", "against = \"quiet\"").replace("\"rings\", ", ""),
                11,
                "needs \"quiet\" and at least one other that is an attack, not a control",
            ),
        ];
        for (text, line, want) in cases {
            let e = p(&text).unwrap_err();
            assert_eq!(e.line, line, "{e}");
            assert!(e.to_string().contains(want), "{e}");
            assert!(e.to_string().starts_with(&format!("t.toml:{line}: ")), "{e}");
        }
    }

    /// A study of `rings` and its control, with one goal (`GOAL` is its `against`).
    const RINGS: &str = r#"name = "r"
baseline = "sluice-l2"
paths = ["sluice-l2"]
workloads = ["rr-200x1000"]
conns = [1]
mtus = [1500]
families = ["ipv4"]
reps = 2
duration = 3
conditions = ["quiet", "rings", "vm-feed"]
goals = [{ workload = "rr-200x1000", keeps_rate = 0.9, GOAL }]
"#;

    #[test]
    fn a_goal_is_judged_against_quiet_or_a_control() {
        let s = p(&RINGS.replace("GOAL", "against = \"vm-feed\"")).unwrap();
        let g = &s.goals[0];
        assert_eq!(g.against, Condition::VmFeed);
        assert_eq!(g.judged(&s.conditions), [Condition::Rings]);
        assert_eq!(
            g.describe(),
            "under rings, rr-200x1000 keeps at least 90% of its rate under vm-feed (the same load without the attack)"
        );
        // Against quiet (the default): every attack, and not the control.
        let s = p(&RINGS
            .replace(", GOAL", "")
            .replace("\"vm-feed\"]", "\"vm-feed\", \"mac-flood\"]")
            .replace("paths = [\"sluice-l2\"]", "paths = [\"sluice-l2\", \"linux-bridge\"]"))
        .unwrap();
        let g = &s.goals[0];
        assert_eq!(g.against, Condition::Quiet);
        assert_eq!(g.judged(&s.conditions), [Condition::Rings, Condition::MacFlood]);
        assert!(g.describe().starts_with("under every attack, rr-200x1000 keeps at least 90% of its quiet rate"));
        // A goal read back from an older study.json has no `against`: quiet.
        let mut v = serde_json::to_value(g).unwrap();
        v.as_object_mut().unwrap().remove("against");
        let old: Goal = serde_json::from_value(v).unwrap();
        assert_eq!(old.against, Condition::Quiet);
    }

    /// A study of shared memory against TCP loopback, with one goal (`GOAL`, line 7).
    const SMC: &str = r#"name = "s"
baseline = "loopback"
paths = ["smc-loopback", "smc", "loopback"]
workloads = ["iperf3", "sockperf", "crr-64x8k"]
conns = [1, 50]
goals = [
  GOAL,
]
"#;

    #[test]
    fn goals_against_the_baseline_are_read_beside_the_attack_goals() {
        let s = p(&SMC.replace(
            "GOAL",
            r#"{ workload = "iperf3", conns = 1, paths = ["smc-loopback", "smc"], at_least = 2.0 },
  { workload = "sockperf", conns = 1, paths = ["smc"], latency_at_most = 0.5 },
  { workload = "sockperf", conns = 1, paths = ["smc"], cpu_at_most = 1 },
  { workload = "iperf3", conns = 1, paths = ["smc-loopback"], copy_share_at_least = 0.5 },
  { workload = "*", paths = ["smc-loopback", "smc"], at_least = 0.95 },
  { workload = "crr-64x8k", paths = ["smc"], at_least = 1 }"#,
        ))
        .unwrap();
        assert!(s.goals.is_empty());
        let b = &s.baseline_goals;
        assert_eq!(b.len(), 6);
        assert_eq!(
            b[0],
            BaselineGoal {
                workload: Some("iperf3".into()),
                conns: Some(1),
                paths: vec!["smc-loopback".into(), "smc".into()],
                bound: Versus::AtLeast(2.0)
            }
        );
        assert_eq!(
            [b[1].bound, b[2].bound, b[3].bound],
            [Versus::LatencyAtMost(0.5), Versus::CpuAtMost(1.0), Versus::CopyShareAtLeast(0.5)]
        );
        assert_eq!((b[4].workload.as_deref(), b[4].conns), (None, None));
        let words: Vec<String> = b.iter().map(|g| g.describe("loopback")).collect();
        assert_eq!(
            words,
            [
                "iperf3 at 1 conn: rate at least 2× loopback's",
                "sockperf at 1 conn: mean latency at most 0.5× loopback's",
                "sockperf at 1 conn: CPU per unit (total) at most 1× loopback's",
                "iperf3 at 1 conn: rate at least 50% of one core's copy rate (memory)",
                "every workload at every connection count: rate at least 0.95× loopback's",
                "crr-64x8k at every connection count: rate at least 1× loopback's",
            ]
        );
        assert!(b[0].bound.met_by(2.0) && !b[0].bound.met_by(1.99));
        assert!(b[1].bound.met_by(0.5) && !b[1].bound.met_by(0.51));
        // A study.json written before these goals existed has none.
        let mut v = serde_json::to_value(&s).unwrap();
        v.as_object_mut().unwrap().remove("baseline_goals");
        let old: Study = serde_json::from_value(v).unwrap();
        assert!(old.baseline_goals.is_empty());
    }

    #[test]
    fn a_goal_against_the_baseline_is_refused_with_its_line_and_why() {
        let cases = [
            (
                r#"{ workload = "redis-get", conns = 1, paths = ["smc"], at_least = 2 }"#,
                "workload \"redis-get\", which the study does not run (iperf3, sockperf, crr-64x8k, or \"*\" for every one)",
            ),
            (
                r#"{ workload = "iperf3", conns = 1, paths = ["smc", "sluice-l2"], at_least = 2 }"#,
                "path \"sluice-l2\" is not one of the study's paths (smc-loopback, smc, loopback)",
            ),
            (
                r#"{ workload = "iperf3", conns = 1, paths = ["loopback"], at_least = 2 }"#,
                "path \"loopback\" is the baseline",
            ),
            (
                r#"{ workload = "iperf3", conns = 10, paths = ["smc"], at_least = 2 }"#,
                "conns = 10: the study runs 1, 50",
            ),
            (
                r#"{ workload = "iperf3", conns = 1, paths = ["smc"], at_least = 2, cpu_at_most = 1 }"#,
                "has one bound, and this one has at_least and cpu_at_most",
            ),
            (
                r#"{ workload = "iperf3", conns = 1, paths = ["smc"] }"#,
                "needs one bound: at_least (rate), latency_at_most, cpu_at_most or copy_share_at_least",
            ),
            (
                r#"{ workload = "*", paths = ["smc"], latency_at_most = 0.5 }"#,
                "workload = \"*\" (every workload) takes at_least only, not latency_at_most",
            ),
            (
                r#"{ workload = "*", paths = ["smc"], copy_share_at_least = 0.5 }"#,
                "takes at_least only, not copy_share_at_least",
            ),
            (
                r#"{ workload = "iperf3", conns = 1, at_least = 2 }"#,
                "compares paths with the baseline \"loopback\": name them, e.g. paths = [\"smc-loopback\"]",
            ),
            (r#"{ workload = "iperf3", paths = ["smc"], keeps_rate = 0.9 }"#, "not both"),
            (r#"{ workload = "iperf3", paths = ["smc"], at_least = 2, against = "vm-feed" }"#, "not both"),
            (
                r#"{ workload = "iperf3", conns = 1, paths = ["smc"], latency_at_most = 0.5 }"#,
                "\"iperf3\" measures no latency",
            ),
            (
                r#"{ workload = "sockperf", conns = 1, paths = ["smc"], copy_share_at_least = 0.5 }"#,
                "copy_share_at_least needs a stream",
            ),
            (
                r#"{ workload = "sockperf", conns = 50, paths = ["smc"], cpu_at_most = 1 }"#,
                "measures one connection: give it conns = 1",
            ),
            (r#"{ workload = "iperf3", conns = 1, paths = [], at_least = 2 }"#, "paths is empty"),
            (
                r#"{ workload = "iperf3", conns = 1, paths = ["smc", "smc"], at_least = 2 }"#,
                "path \"smc\" is listed twice",
            ),
            (r#"{ workload = "iperf3", conns = 1, paths = ["smc"], at_least = 0 }"#, "at_least must be more than 0"),
            (r#"{ workload = "iperf3", conns = 1, paths = ["smc"], colour = 1 }"#, "unknown field `colour`"),
        ];
        for (goal, want) in cases {
            let e = p(&SMC.replace("GOAL", goal)).unwrap_err();
            assert_eq!(e.line, 7, "{goal}: {e}");
            assert!(e.to_string().starts_with("t.toml:7: "), "{e}");
            assert!(e.message.contains(want), "{goal}: {e}");
        }
        // Against the baseline means quiet cells.
        let e = p(&RINGS
            .replace(
                "{ workload = \"rr-200x1000\", keeps_rate = 0.9, GOAL }",
                "{ workload = \"rr-200x1000\", paths = [\"sluice-l2\"], at_least = 1 }",
            )
            .replace("paths = [\"sluice-l2\"]\n", "paths = [\"sluice-l2\", \"linux-bridge\"]\n")
            .replace("baseline = \"sluice-l2\"", "baseline = \"linux-bridge\"")
            .replace("[\"quiet\", \"rings\", \"vm-feed\"]", "[\"rings\"]"))
        .unwrap_err();
        assert!(e.message.contains("conditions needs \"quiet\""), "{e}");
    }

    #[test]
    fn smc_vs_tcp_states_the_products_targets_against_tcp_loopback() {
        let s = parse(builtin("smc-vs-tcp").unwrap(), "smc-vs-tcp", Path::new(".")).unwrap();
        assert_eq!(s.baseline, "loopback");
        let both = ["smc-loopback", "smc"];
        let find = |w: Option<&str>, n: Option<u32>, b: Versus| {
            s.baseline_goals
                .iter()
                .find(|g| g.workload.as_deref() == w && g.conns == n && g.bound == b)
                .unwrap_or_else(|| panic!("{w:?} {n:?} {b:?}"))
                .paths
                .clone()
        };
        for (w, n, b) in [
            (Some("iperf3"), Some(1), Versus::AtLeast(2.0)),
            (Some("str-20x20m"), Some(1), Versus::AtLeast(2.0)),
            (Some("crr-64x8k"), Some(1), Versus::AtLeast(1.0)),
            (Some("crr-64x8k"), Some(50), Versus::AtLeast(1.0)),
            (Some("nginx-1k"), Some(50), Versus::AtLeast(1.5)),
            (Some("redis-get"), Some(50), Versus::AtLeast(1.5)),
            (Some("sockperf"), Some(1), Versus::LatencyAtMost(0.5)),
            (Some("sockperf"), Some(1), Versus::CpuAtMost(1.0)),
            (None, None, Versus::AtLeast(0.95)),
        ] {
            assert_eq!(find(w, n, b), both);
        }
        assert_eq!(find(Some("iperf3"), Some(1), Versus::CopyShareAtLeast(0.5)), ["smc-loopback"]);
        assert_eq!(s.baseline_goals.len(), 10);
    }

    #[test]
    fn partition_aggregate_points_read_their_size_and_background() {
        let text = OK
            .replace("\"direct\", ", "\"sluice-l2\", ")
            .replace("baseline = \"direct\"", "baseline = \"linux-bridge\"");
        let s = p(&text.replace("\"rr-200x1000\"", "\"pa-2mtu\", \"pa-2048mtu-bg2\"")).unwrap();
        assert_eq!(s.workloads[0].pa, Some(PaPoint { response_mtus: 2, background: 0 }));
        assert_eq!(s.workloads[1].pa, Some(PaPoint { response_mtus: 2048, background: 2 }));
        assert_eq!(s.queries, DEFAULT_PA_QUERIES);
        assert!(s.has_pa());
    }

    #[test]
    fn conditions_and_goals_are_read() {
        let text = OK.replace(
            "duration = 3",
            "duration = 3\nconditions = [\"quiet\", \"mac-flood\", \"gso-bomb\"]\ngoals = [\n  { workload = \"rr-200x1000\", keeps_rate = 0.9 },\n  { workload = \"rr-200x1000\", latency_within = 2 },\n]",
        );
        let s = p(&text).unwrap();
        assert_eq!(s.conditions, [Condition::Quiet, Condition::MacFlood, Condition::GsoBomb]);
        assert_eq!(s.goals.len(), 2);
        assert_eq!(s.goals[0].bound, Bound::KeepsRate(0.9));
        assert!(s.goals[0].met_by(0.95) && !s.goals[0].met_by(0.85));
        assert!(s.goals[1].met_by(1.9) && !s.goals[1].met_by(2.1));
        assert!(s.goals[1].describe().contains("within 2× of quiet"));
        // A study without conditions is measured quiet, as before; its old study.json too.
        assert_eq!(p(OK).unwrap().conditions, [Condition::Quiet]);
        let mut v = serde_json::to_value(p(OK).unwrap()).unwrap();
        v.as_object_mut().unwrap().remove("conditions");
        v.as_object_mut().unwrap().remove("goals");
        let old: Study = serde_json::from_value(v).unwrap();
        assert_eq!((old.conditions, old.goals), (vec![Condition::Quiet], vec![]));
    }

    #[test]
    fn every_builtin_study_parses() {
        for (name, text) in BUILTINS {
            let s = parse(text, name, Path::new(".")).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(&s.name, name);
            assert!(!s.about.is_empty());
        }
    }

    #[test]
    fn the_builtins_that_replaced_the_bench_scripts_read_as_meant() {
        let get = |n: &str| parse(builtin(n).unwrap(), n, Path::new(".")).unwrap();
        let c = get("capture-impact");
        assert_eq!(c.conditions, [Condition::Quiet, Condition::Capture]);
        assert!(c.paths.iter().all(|p| Condition::Capture.applies(p)));
        let s = get("stopped-receiver");
        assert_eq!(s.conditions, [Condition::Quiet, Condition::DrainingReceiver, Condition::StoppedReceiver]);
        assert!(s.goals.iter().all(|g| g.against == Condition::DrainingReceiver));
        assert_eq!(s.goals[0].judged(&s.conditions), [Condition::StoppedReceiver]);
        assert_eq!((s.baseline.as_str(), s.duration_s), ("sluice-l2-stream", 15));
        assert!(s.paths.iter().all(|p| Condition::StoppedReceiver.applies(p)));
        let u = get("kernel-upcalls");
        assert_eq!(u.conditions, [Condition::Quiet, Condition::FibFlush, Condition::MacFlood]);
        assert!(u.paths.contains(&"sluice-kernel".to_string()));
        let m = get("smc-cost");
        assert_eq!((m.baseline.as_str(), m.conns.as_slice()), ("loopback", &[1][..]));
        let k = get("kernel-vs-bridge");
        assert!(k.workloads.iter().any(|w| w.tool == Some(Tool::Iperf3)) && k.conns == [1, 10]);
        // smc-cost before and after a change: the launcher's path runs with another build.
        let two =
            builtin("smc-cost").unwrap().replace("\"smc-loopback\"]", "\"smc-loopback\", \"smc-loopback@before\"]")
                + "builds = { before = \"/usr/local/bin/sluice-before\" }\n";
        assert_eq!(parse(&two, "c.toml", Path::new(".")).unwrap().paths[2], "smc-loopback@before");
        // The new conditions are refused on paths that cannot take them.
        let e =
            p(&OK.replace("duration = 3", "duration = 3\nconditions = [\"quiet\", \"stopped-receiver\"]")).unwrap_err();
        assert!(e.message.contains("sluice-l2-stream, sluice-l2-lossless-stream"), "{e}");
        let e = p(&OK.replace("duration = 3", "duration = 3\nconditions = [\"capture\"]")).unwrap_err();
        assert!(e.message.contains("none of this study's paths"), "{e}");
        let f = p(&OK.replace("duration = 3", "duration = 3\nconditions = [\"quiet\", \"fib-flush\"]")).unwrap();
        assert_eq!(f.conditions[1], Condition::FibFlush);
    }

    #[test]
    fn vm_paths_take_iperf3_alone_and_soak_checks_what_it_leaves() {
        let vm = builtin("vm-paths").unwrap();
        assert_eq!(parse(vm, "v.toml", Path::new(".")).unwrap().paths, ["vm-bridge", "vm-sluice"]);
        let e = parse(&vm.replace("\"ping\"]", "\"ping\", \"rr-200x1000\"]"), "v.toml", Path::new(".")).unwrap_err();
        assert!(e.message.contains("only iperf3 and ping run"), "{e}");
        let e = p(&OK.replace("[\"rr-200x1000\"", "[\"ping\"")).unwrap_err();
        assert!(e.message.contains("inside VMs only"), "{e}");
        let soak = parse(builtin("soak").unwrap(), "s.toml", Path::new(".")).unwrap();
        assert!(soak.leftovers && soak.conditions.contains(&Condition::PortChurn));
        assert!(!p(OK).unwrap().leftovers);
    }

    #[test]
    fn profile_files_are_read_relative_to_the_study() {
        let tmp = sluice_sys::fs::TempDir::new("sluice-spec").unwrap();
        let dir = tmp.path().to_path_buf();
        std::fs::write(
            dir.join("mine.xml"),
            r#"<profile name="mine"><group nthreads="1"><transaction iterations="5"><flowop type="connect" options="remotehost=h"/><flowop type="write" options="size=1"/><flowop type="disconnect"/></transaction></group></profile>"#,
        )
        .unwrap();
        std::fs::write(dir.join("bad.xml"), "<profile name=\"x\"><group>").unwrap();
        let s = parse(&OK.replace("\"rr-200x1000\"", "\"mine.xml\""), "t.toml", &dir).unwrap();
        assert_eq!(s.workloads[0].name, "mine");
        assert!(!s.workloads[0].builtin);
        let e = parse(&OK.replace("\"rr-200x1000\"", "\"bad.xml\""), "t.toml", &dir).unwrap_err();
        assert_eq!(e.line, 4);
    }
}

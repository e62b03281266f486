//! `sluice study`: builds the compared network paths from namespaces, runs the studies'
//! workloads through all of them with the modeler (or iperf3 and sockperf), and writes the
//! studies' tables and charts (docs/architecture.md, "The study runner"; the file format in
//! docs/study.md).
//!
//! - [`spec`]: the study file and the built-in studies.
//! - [`conditions`]: quiet, or attackers on the cell's topology (rings, floods).
//! - [`noise`]: what the host did besides each cell (steal, others' CPU), the run's verdict.
//! - [`tools`]: cells run by iperf3 or sockperf.
//! - the compared paths themselves are built by `sluice_lab::compared`.
//! - [`pa`]: partition-aggregate points (six guests, completion times, drops per path).
//! - [`record`]: what a run keeps (`study.json`, `cells.jsonl`) and reading it back.
//! - [`run`]: the matrix, interleaving, recording, resume.
//! - [`table`]: the results as tables, their ratios and numbers.
//! - [`report`], [`chart`]: CSV, JSON, markdown, PNG; [`judge`]: the runs' verdicts, the
//!   goals, the attackers' account.
//! - [`leftovers`]: what a run leaves behind (the daemons' memory and descriptors, the
//!   host's namespaces, interfaces and /dev/shm), checked by studies that ask (`soak`).
//! - [`vmcell`]: cells on the VM paths, run inside the VMs through their consoles.
//! - [`error`]: what can go wrong, as the caller sees it.

pub mod builds;
pub mod chart;
pub mod conditions;
pub mod error;
pub mod judge;
pub mod leftovers;
pub mod noise;
pub mod pa;
pub mod record;
pub mod report;
pub mod run;
pub mod spec;
pub mod table;
pub mod tools;
pub mod vmcell;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use crate::error::{Error, Result};
use sluice_sys::bail;
use sluice_sys::error::Context;

use record::{Options, RunInfo, StudyFile};
use run::Outcome;
use spec::Study;

/// `sluice study …`
#[derive(Debug, clap::Subcommand)]
pub enum StudyCmd {
    /// List the built-in studies and the paths a study can compare.
    List,
    /// Print a built-in study's file, to copy and edit.
    Show {
        /// Built-in study name.
        name: String,
    },
    /// Run a study: build every path, run every cell, write the report.
    ///
    /// Examples:
    ///   sluice study run vswitch-vs-router --quick          a first look, a few minutes
    ///   sluice study run dedicated-vs-vswitch --out results/dvv
    ///   sluice study run ./my-study.toml --reps 5 --duration 30 --pin
    ///   sluice study run switch-paths       the paths as iperf3 and sockperf see them
    ///   sluice study run calibrate          sluice bench against iperf3 and sockperf
    ///   sluice study run lossless-pa --quick   partition-aggregate queries, lossless against lossy, six guests a path
    ///   sluice study run hostile            paths quiet and under attack (rings, MAC flood, GSO bomb)
    ///
    /// Every cell records the host's noise (steal, other processes' CPU); the report opens
    /// with each run's verdict, QUIET or NOISY, and claims goals only from a QUIET run.
    ///
    /// The output directory gets report.md (the tables), results.csv (one row per cell),
    /// results.json, charts/*.png, and cells.jsonl + study.json, from which
    /// `sluice study resume DIR` continues an interrupted run. Needs root.
    #[command(verbatim_doc_comment)]
    Run(RunArgs),
    /// Continue an interrupted study in DIR: cells already measured are kept, the rest run.
    Resume {
        /// The study's output directory.
        dir: PathBuf,
    },
    /// Write the report of DIR again from its measured cells (no measuring).
    Report {
        /// The study's output directory.
        dir: PathBuf,
    },
}

/// Arguments of `sluice study run`.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// A built-in study (see `sluice study list`) or a study file.
    pub study: String,
    /// A first look: 3-second cells, one repetition (the whole matrix in a few minutes).
    #[arg(long)]
    pub quick: bool,
    /// Repetitions of every cell [default: the study's].
    #[arg(long, value_name = "N")]
    pub reps: Option<u32>,
    /// Seconds per cell [default: the study's].
    #[arg(long, value_name = "SECONDS")]
    pub duration: Option<u32>,
    /// Compare every path with this one [default: the study's baseline].
    #[arg(long, value_name = "PATH")]
    pub baseline: Option<String>,
    /// Output directory [default: ./study-NAME-DATE-TIME].
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Pin the bench clients to CPU 0 and the servers to CPU 1 (switches stay unpinned).
    #[arg(long)]
    pub pin: bool,
}

/// Runs `sluice study …`.
pub fn run_cmd(cmd: StudyCmd) -> Result<ExitCode> {
    match cmd {
        StudyCmd::List => {
            println!("Built-in studies (sluice study show NAME prints one):");
            for (name, text) in spec::BUILTINS {
                let s = spec::parse(text, name, Path::new("."))?;
                println!("  {name:22} {}", s.title);
            }
            println!("\nPaths a study can compare:");
            for (name, what) in spec::PATHS {
                let note = sluice_lab::compared::unavailable(name).map(|w| format!(" [{w}]")).unwrap_or_default();
                println!("  {name:22} {what}{note}");
            }
            println!(
                "\nWorkloads: the built-in profiles ({}), profile.xml files, or the reference tools iperf3 and sockperf.",
                sluice_bench::builtin::names()
            );
            println!("\nConditions the paths can be measured under (`conditions = [...]`):");
            for c in conditions::Condition::ALL {
                let on = c.paths().map_or("every path".to_string(), |p| p.join(", "));
                println!("  {:22} {on}", c.name());
            }
            Ok(ExitCode::SUCCESS)
        }
        StudyCmd::Show { name } => {
            let text = spec::builtin(&name)
                .with_context(|| format!("no built-in study {name:?}; `sluice study list` shows them"))?;
            print!("{text}");
            Ok(ExitCode::SUCCESS)
        }
        StudyCmd::Run(a) => run_new(a),
        StudyCmd::Resume { dir } => {
            let sf = record::load_study_file(&dir)?;
            measure(&dir, sf)
        }
        StudyCmd::Report { dir } => {
            let sf = record::load_study_file(&dir)?;
            let cells = record::load_cells(&dir)?;
            let report = report::write_all(&dir, &sf, &cells)?;
            println!("{}", report.display());
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn load_study(name: &str) -> Result<Study> {
    if let Some(text) = spec::builtin(name)
        && !Path::new(name).exists()
    {
        return Ok(spec::parse(text, name, Path::new("."))?);
    }
    let p = Path::new(name);
    let text = std::fs::read_to_string(p).with_context(|| {
        format!(
            "no study file {name:?} and no built-in study of that name; built-ins: {}",
            spec::BUILTINS.iter().map(|b| b.0).collect::<Vec<_>>().join(", ")
        )
    })?;
    let dir = p.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    Ok(spec::parse(&text, name, dir)?)
}

fn run_new(a: RunArgs) -> Result<ExitCode> {
    let study = load_study(&a.study)?;
    let baseline = a.baseline.clone().unwrap_or_else(|| study.baseline.clone());
    if !study.paths.contains(&baseline) {
        bail!("--baseline {baseline:?} is not one of the study's paths ({})", study.paths.join(", "));
    }
    let reps = a.reps.unwrap_or(if a.quick { 1 } else { study.reps });
    let duration_s = a.duration.unwrap_or(if a.quick { 3 } else { study.duration_s });
    if !(1..=50).contains(&reps) {
        bail!("--reps must be 1 to 50");
    }
    if !(1..=3600).contains(&duration_s) {
        bail!("--duration must be 1 to 3600 seconds");
    }
    let dir = a.out.clone().unwrap_or_else(|| run::default_out(&study));
    if dir.join("study.json").exists() {
        bail!(
            "{} already holds a study; continue it with `sluice study resume {}` or choose another --out",
            dir.display(),
            dir.display()
        );
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let file = (spec::builtin(&a.study).is_none() || Path::new(&a.study).exists()).then(|| a.study.clone());
    let options = Options { duration_s, reps, baseline, pin: a.pin, quick: a.quick, file };
    let sf = StudyFile { study, options, runs: vec![] };
    measure(&dir, sf)
}

/// Runs what is missing in `dir` as a new run, then writes the report.
fn measure(dir: &Path, mut sf: StudyFile) -> Result<ExitCode> {
    if !sluice_sys::is_root() {
        return Err(Error::NotRoot);
    }
    let run_no = sf.runs.iter().map(|r| r.run).max().unwrap_or(0) + 1;
    let mut skipped = Vec::new();
    let mut here = Vec::new();
    for p in &sf.study.paths {
        match sluice_lab::compared::unavailable(p) {
            Some(why) => {
                eprintln!("skipping {p}: {why}");
                skipped.push((p.clone(), why));
            }
            None => here.push(p.clone()),
        }
    }
    if here.is_empty() {
        return Err(Error::NoPathRuns { skipped });
    }
    if pin_impossible(sf.options.pin) {
        bail!("--pin needs at least 2 CPUs");
    }
    eprintln!("study {} → {}", sf.study.name, dir.display());
    let staged = builds::stage(&sf.study.builds)?;
    let mut host = run::host_info(&here);
    host.builds = staged.about.clone();
    if host.load_before > 0.25 {
        eprintln!(
            "warning: the host is busy ({:.0}% of its CPUs before the start); the numbers will say more about the load than the paths",
            host.load_before * 100.0
        );
    }
    sf.runs.push(RunInfo { run: run_no, started: run::now_rfc3339(), host, skipped });
    record::save_study_file(dir, &sf)?;
    sluice_sys::catch_interrupts();
    let t0 = Instant::now();
    let before = sf.study.leftovers.then(leftovers::Snapshot::take);
    let done = run::execute(dir, &sf, run_no, &here, &staged.exes)?;
    if let Some(b) = &before {
        leftovers::record(dir, run_no, b)?;
    }
    if !done.unbuilt.is_empty()
        && let Some(r) = sf.runs.last_mut()
    {
        r.skipped.extend(done.unbuilt.iter().map(|(p, why)| (p.clone(), format!("could not be built at {why}"))));
        record::save_study_file(dir, &sf)?;
    }
    let cells = record::load_cells(dir)?;
    let report = report::write_all(dir, &sf, &cells)?;
    match done.outcome {
        Outcome::Complete if !done.unbuilt.is_empty() => {
            eprintln!(
                "finished without {} (could not be built; see the warnings above and the report {}); `sluice study resume {}` tries again",
                {
                    let mut names: Vec<&str> = done.unbuilt.iter().map(|(p, _)| p.as_str()).collect();
                    names.sort_unstable();
                    names.dedup();
                    names.join(", ")
                },
                report.display(),
                dir.display()
            );
            println!("{}", report.display());
            Ok(ExitCode::FAILURE)
        }
        Outcome::Complete => {
            eprintln!("done in {}; report: {}", run::hms(t0.elapsed().as_secs_f64()), report.display());
            println!("{}", report.display());
            Ok(ExitCode::SUCCESS)
        }
        Outcome::Interrupted => {
            eprintln!(
                "interrupted: {} cells kept in {}; the report so far is {}; continue with `sluice study resume {}`",
                cells.len(),
                dir.display(),
                report.display(),
                dir.display()
            );
            Ok(ExitCode::from(130))
        }
    }
}

fn pin_impossible(pin: bool) -> bool {
    pin && sluice_bench::cpu::ncpus() < 2
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wrong_study_file_is_the_spec_case_with_its_line() {
        let dir = sluice_sys::fs::TempDir::new("sluice-unit").unwrap();
        let file = dir.path().join("s.toml");
        std::fs::write(&file, "name = \"s\"\nbaseline = \"direct\"\npaths = [\"direct\", \"no-such-path\"]\nworkloads = [\"rr-200x1000\"]\n").unwrap();
        match load_study(file.to_str().unwrap()) {
            Err(Error::Spec(e)) => assert_eq!(e.line, 3, "{e}"),
            other => panic!("{other:?}"),
        }
        let e = load_study("no-such-study").unwrap_err();
        assert!(matches!(e, Error::Failed(_)), "{e:?}");
        assert!(e.chain().contains("no study file \"no-such-study\""), "{}", e.chain());
    }
}

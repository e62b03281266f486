//! `sluice monitor start|stop|status` and `sluice report FILE`: monitor records reduced to
//! per-interval tables (rates, drops, CPU per MB) and charts over time, as the seeds'
//! performance toolkit reduced CP monitor data (docs/architecture.md, "Seeing inside the
//! switch").

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow, bail};
use plotters::prelude::*;

use sluice_api::client::{Client, Target};
use sluice_api::proto::{MonitorStatus, Request, StatsReport};

/// `sluice monitor …`.
#[derive(clap::Subcommand, Debug)]
pub enum MonitorCmd {
    /// Start writing a record of every counter each interval to FILE (one JSON line per
    /// record; rotated to FILE.1 before it passes --max-mb). Replaces a running recording.
    Start {
        /// The record file (mode 0600; a symbolic link is refused).
        #[arg(long, short = 'f', value_name = "FILE")]
        file: PathBuf,
        /// Between records: 500ms, 1s, 2m … (100 ms to 1 hour).
        #[arg(long, short = 'i', default_value = "1s", value_name = "INTERVAL")]
        interval: String,
        /// Rotate the file before it passes this many MiB.
        #[arg(long, default_value_t = sluice_api::config::DEFAULT_MONITOR_MAX_MB, value_name = "MB")]
        max_mb: u64,
        #[command(flatten)]
        target: Target,
    },
    /// Stop writing records.
    Stop {
        #[command(flatten)]
        target: Target,
    },
    /// Whether records are being written, where, and how many.
    Status {
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        target: Target,
    },
}

/// Arguments of `sluice report`.
#[derive(clap::Args, Debug)]
pub struct ReportArgs {
    /// The monitor file (FILE.1, the part before its last rotation, is read first if it is
    /// there).
    pub file: PathBuf,
    /// Where report.md, intervals.csv and the charts go (default: FILE-report).
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
}

/// Runs `sluice monitor …`.
pub fn monitor(c: MonitorCmd) -> Result<()> {
    let show = |s: &MonitorStatus| match (&s.file, s.running) {
        (Some(f), true) => {
            println!(
                "recording every {} ms to {f} (rotated at {} MiB): {} records so far",
                s.interval_ms, s.max_mb, s.records
            )
        }
        (Some(f), false) => println!("stopped; {} records written to {f}", s.records),
        (None, _) => {
            println!("no monitor records are being written (start them with `sluice monitor start --file FILE`)")
        }
    };
    match c {
        MonitorCmd::Start { file, interval, max_mb, target } => {
            let every = sluice_api::config::parse_interval(&interval).map_err(|e| anyhow!("--interval: {e}"))?;
            if !(1..=1 << 20).contains(&max_mb) {
                bail!("--max-mb must be 1 to 1048576");
            }
            // The daemon writes the file: a relative path is this shell's.
            let file = std::path::absolute(&file).with_context(|| format!("resolving {}", file.display()))?;
            let req = Request::MonitorStart { file, interval_ms: every.as_millis() as u64, max_mb };
            let s: MonitorStatus = Client::for_target(&target)?.call(&req)?;
            show(&s);
        }
        MonitorCmd::Stop { target } => {
            let s: MonitorStatus = Client::for_target(&target)?.call(&Request::MonitorStop)?;
            show(&s);
        }
        MonitorCmd::Status { json, target } => {
            let s: MonitorStatus = Client::for_target(&target)?.call(&Request::MonitorStatus)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&s)?);
            } else {
                show(&s);
            }
        }
    }
    Ok(())
}

/// One record: when, and every counter.
struct Record {
    t: f64,
    stats: StatsReport,
}

/// Reads the records of `file` (after those of `file.1`), skipping lines that are not
/// records (counted, with the first one's place named).
fn read(file: &Path) -> Result<(Vec<Record>, usize, Option<String>)> {
    let older = PathBuf::from(format!("{}.1", file.display()));
    let mut out = Vec::new();
    let (mut bad, mut first_bad) = (0usize, None);
    let mut any = false;
    for f in [older.as_path(), file] {
        let text = match std::fs::read_to_string(f) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && f != file => continue,
            Err(e) => return Err(e).with_context(|| format!("reading {}", f.display())),
        };
        any = true;
        for (i, line) in text.lines().enumerate() {
            #[derive(serde::Deserialize)]
            struct Line {
                t: f64,
                stats: StatsReport,
            }
            match serde_json::from_str::<Line>(line) {
                Ok(l) => out.push(Record { t: l.t, stats: l.stats }),
                Err(e) => {
                    bad += 1;
                    first_bad.get_or_insert_with(|| format!("{}:{}: {e}", f.display(), i + 1));
                }
            }
        }
    }
    if !any {
        bail!("no monitor file {}", file.display());
    }
    out.sort_by(|a, b| a.t.total_cmp(&b.t));
    Ok((out, bad, first_bad))
}

/// One interval between two records.
#[derive(Debug, Clone, PartialEq)]
pub struct Interval {
    /// Seconds since the first record, at the interval's end.
    pub at: f64,
    /// The interval's end, Unix time.
    pub t: f64,
    pub dt: f64,
    /// Per port: (name, rx bits/s, tx bits/s, rx frames/s, tx frames/s, drops/s).
    pub ports: Vec<(String, f64, f64, f64, f64, f64)>,
    /// Drops per second by cause, all ports.
    pub drops: Vec<(String, f64)>,
    /// Share of one CPU the datapath thread used (percent).
    pub cpu_pct: f64,
    /// Datapath CPU milliseconds per MB received by the switch (None: nothing received).
    pub cpu_ms_per_mb: Option<f64>,
    /// The daemon restarted or its counters were reset within the interval.
    pub reset: bool,
}

fn delta(now: u64, before: u64, reset: bool) -> u64 {
    if reset { now } else { now.saturating_sub(before) }
}

/// The intervals between consecutive records.
pub fn intervals(records: &[(f64, &StatsReport)]) -> Vec<Interval> {
    let Some(t0) = records.first().map(|r| r.0) else { return Vec::new() };
    records
        .windows(2)
        .filter_map(|w| {
            let ((ta, a), (tb, b)) = (w[0], w[1]);
            let dt = tb - ta;
            if dt <= 0.0 {
                return None;
            }
            let reset = b.switch.started_ns != a.switch.started_ns || b.counters_age_s < a.counters_age_s;
            let mut drops: std::collections::BTreeMap<String, f64> = Default::default();
            let mut rx_bytes = 0u64;
            let ports = b
                .ports
                .iter()
                .map(|p| {
                    let o = a.ports.iter().find(|o| o.name == p.name).map(|o| o.counters).unwrap_or_default();
                    let c = p.counters;
                    let r = reset || c.rx_frames < o.rx_frames || c.tx_frames < o.tx_frames;
                    rx_bytes += delta(c.rx_bytes, o.rx_bytes, r);
                    let mut d = 0.0;
                    for (now, before) in [(c.rx_drops, o.rx_drops), (c.tx_drops, o.tx_drops)] {
                        let (n, b) = (
                            serde_json::to_value(now).unwrap_or_default(),
                            serde_json::to_value(before).unwrap_or_default(),
                        );
                        for (cause, v) in n.as_object().into_iter().flatten() {
                            let x = delta(v.as_u64().unwrap_or(0), b[cause].as_u64().unwrap_or(0), r) as f64 / dt;
                            d += x;
                            *drops.entry(cause.clone()).or_default() += x;
                        }
                    }
                    (
                        p.name.clone(),
                        8.0 * delta(c.rx_bytes, o.rx_bytes, r) as f64 / dt,
                        8.0 * delta(c.tx_bytes, o.tx_bytes, r) as f64 / dt,
                        delta(c.rx_frames, o.rx_frames, r) as f64 / dt,
                        delta(c.tx_frames, o.tx_frames, r) as f64 / dt,
                        d,
                    )
                })
                .collect();
            let cpu = if reset { b.cpu.datapath_s } else { (b.cpu.datapath_s - a.cpu.datapath_s).max(0.0) };
            Some(Interval {
                at: tb - t0,
                t: tb,
                dt,
                ports,
                drops: drops.into_iter().filter(|d| d.1 > 0.0).collect(),
                cpu_pct: 100.0 * cpu / dt,
                cpu_ms_per_mb: (rx_bytes > 0).then(|| cpu * 1000.0 / (rx_bytes as f64 / 1e6)),
                reset,
            })
        })
        .collect()
}

/// Runs `sluice report`.
pub fn report(a: ReportArgs) -> Result<()> {
    let (records, bad, first_bad) = read(&a.file)?;
    if records.len() < 2 {
        bail!(
            "{} holds {} record(s): a report needs two at least (records are written every monitor interval)",
            a.file.display(),
            records.len()
        );
    }
    let out = a.out.unwrap_or_else(|| PathBuf::from(format!("{}-report", a.file.display())));
    std::fs::create_dir_all(out.join("charts")).with_context(|| format!("creating {}", out.display()))?;
    let pairs: Vec<(f64, &StatsReport)> = records.iter().map(|r| (r.t, &r.stats)).collect();
    let iv = intervals(&pairs);
    let first = &records[0];
    let last = &records[records.len() - 1];
    // The ports that carried anything, busiest first (the tables and charts show 8 at most).
    let mut names: Vec<(String, f64)> = Vec::new();
    for i in &iv {
        for p in &i.ports {
            match names.iter_mut().find(|n| n.0 == p.0) {
                Some(n) => n.1 += p.1 + p.2,
                None => names.push((p.0.clone(), p.1 + p.2)),
            }
        }
    }
    names.sort_by(|a, b| b.1.total_cmp(&a.1));
    let shown: Vec<String> = names.iter().take(8).map(|n| n.0.clone()).collect();

    let mut csv = String::from(
        "at_s,dt_s,port,rx_bits_per_s,tx_bits_per_s,rx_frames_per_s,tx_frames_per_s,drops_per_s,datapath_cpu_pct,cpu_ms_per_mb,reset\n",
    );
    for i in &iv {
        for p in &i.ports {
            let _ = writeln!(
                csv,
                "{:.3},{:.3},{:.3},{},{:.0},{:.0},{:.1},{:.1},{:.2},{:.2},{},{}",
                i.t,
                i.at,
                i.dt,
                p.0,
                p.1,
                p.2,
                p.3,
                p.4,
                p.5,
                i.cpu_pct,
                i.cpu_ms_per_mb.map(|x| format!("{x:.3}")).unwrap_or_default(),
                i.reset
            );
        }
    }
    std::fs::write(out.join("intervals.csv"), csv)?;

    let mb = |x: f64| format!("{:.1}", x / 1e6);
    let mut md = format!(
        "# Monitor report: switch {}\n\n`sluice report {}` — {} records, {:.0} s from {} to the last; one row per interval.\n\n",
        last.stats.switch.name,
        a.file.display(),
        records.len(),
        last.t - first.t,
        sluice_sys::time::rfc3339(first.t as u64),
    );
    if bad > 0 {
        let _ = writeln!(
            md,
            "{bad} line(s) were not records and were skipped (the first: {}).\n",
            first_bad.unwrap_or_default()
        );
    }
    md += "## The switch\n\n| at (s) | in (Mb/s) | out (Mb/s) | frames in/s | drops/s | datapath CPU | CPU ms/MB |\n|--:|--:|--:|--:|--:|--:|--:|\n";
    for i in &iv {
        let (rx, tx, f, d) =
            i.ports.iter().fold((0.0, 0.0, 0.0, 0.0), |s, p| (s.0 + p.1, s.1 + p.2, s.2 + p.3, s.3 + p.5));
        let _ = writeln!(
            md,
            "| {:.1}{} | {} | {} | {:.0} | {:.1} | {:.1}% | {} |",
            i.at,
            if i.reset { " (reset)" } else { "" },
            mb(rx),
            mb(tx),
            f,
            d,
            i.cpu_pct,
            i.cpu_ms_per_mb.map(|x| format!("{x:.3}")).unwrap_or_else(|| "–".into())
        );
    }
    md += "\n![received per port](charts/throughput.png)\n\n![CPU](charts/cpu.png)\n\n";
    md += "## Ports: received Mb/s\n\n| at (s) |";
    for n in &shown {
        let _ = write!(md, " {n} |");
    }
    md += "\n|--:|";
    md += &"--:|".repeat(shown.len());
    md.push('\n');
    for i in &iv {
        let _ = write!(md, "| {:.1} |", i.at);
        for n in &shown {
            let v = i.ports.iter().find(|p| &p.0 == n).map_or(0.0, |p| p.1);
            let _ = write!(md, " {} |", mb(v));
        }
        md.push('\n');
    }
    md += "\n## Drops\n\n";
    let mut total: std::collections::BTreeMap<&str, f64> = Default::default();
    for i in &iv {
        for (c, x) in &i.drops {
            *total.entry(c.as_str()).or_default() += x * i.dt;
        }
    }
    if total.is_empty() {
        md += "None in the record.\n";
    } else {
        md += "| cause | frames |\n|---|--:|\n";
        for (c, n) in &total {
            let _ = writeln!(md, "| {c} | {n:.0} |");
        }
        md += "\n![drops](charts/drops.png)\n";
    }
    md += "\nPer-interval figures for every port: [intervals.csv](intervals.csv).\n";
    std::fs::write(out.join("report.md"), md)?;

    let series: Vec<(String, Vec<(f64, f64)>)> = shown
        .iter()
        .map(|n| {
            (
                n.clone(),
                iv.iter().map(|i| (i.at, i.ports.iter().find(|p| &p.0 == n).map_or(0.0, |p| p.1 / 1e6))).collect(),
            )
        })
        .collect();
    line_chart(&out.join("charts/throughput.png"), "Received per port", "Mb/s", &series)?;
    let cpu = vec![("datapath CPU %".to_string(), iv.iter().map(|i| (i.at, i.cpu_pct)).collect())];
    line_chart(&out.join("charts/cpu.png"), "Datapath CPU", "% of one CPU", &cpu)?;
    if !total.is_empty() {
        let causes: Vec<(String, Vec<(f64, f64)>)> = total
            .keys()
            .map(|c| {
                (
                    c.to_string(),
                    iv.iter().map(|i| (i.at, i.drops.iter().find(|d| d.0 == *c).map_or(0.0, |d| d.1))).collect(),
                )
            })
            .collect();
        line_chart(&out.join("charts/drops.png"), "Drops by cause", "frames/s", &causes)?;
    }
    println!("{} intervals; report: {}", iv.len(), out.join("report.md").display());
    Ok(())
}

/// A line chart of `series` over time (PNG, 1000×420).
fn line_chart(file: &Path, title: &str, y: &str, series: &[(String, Vec<(f64, f64)>)]) -> Result<()> {
    sluice_study::chart::font();
    let e = |e: &dyn std::fmt::Display| anyhow!("drawing {}: {e}", file.display());
    let root = BitMapBackend::new(file, (1000, 420)).into_drawing_area();
    root.fill(&WHITE).map_err(|x| e(&x))?;
    let xmax = series.iter().flat_map(|s| s.1.iter().map(|p| p.0)).fold(1.0f64, f64::max);
    let ymax = series.iter().flat_map(|s| s.1.iter().map(|p| p.1)).fold(0.0f64, f64::max).max(1e-9) * 1.15;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..xmax, 0f64..ymax)
        .map_err(|x| e(&x))?;
    chart
        .configure_mesh()
        .light_line_style(RGBColor(236, 236, 236))
        .x_desc("seconds since the first record")
        .y_desc(y)
        .label_style(("sans-serif", 14))
        .draw()
        .map_err(|x| e(&x))?;
    let colors = sluice_study::chart::COLORS;
    for (k, (name, pts)) in series.iter().enumerate() {
        let color = colors[k % colors.len()];
        chart
            .draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))
            .map_err(|x| e(&x))?
            .label(name.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.3))
        .label_font(("sans-serif", 14))
        .draw()
        .map_err(|x| e(&x))?;
    root.present().map_err(|x| e(&x))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals_are_differences_and_a_reset_counts_from_zero() {
        let mk = |started: u64, age: f64, rx: u64, bytes: u64, cpu: f64| -> StatsReport {
            let c = sluice_switch::PortCounters { rx_frames: rx, rx_bytes: bytes, ..Default::default() };
            let mut r: StatsReport = serde_json::from_value(serde_json::json!({
                "switch": {"protocol": 1, "version": "x", "name": "sw", "mode": "l2", "pid": 1, "started_ns": started,
                           "lossless": false, "datapath": "user", "poll": false, "mtu": 1500, "ports": 1},
                "uptime_s": age, "counters_age_s": age, "departed": sluice_switch::PortCounters::default(),
                "fib": {"entries": 0, "max_entries": 1, "aging_s": 300, "moves": 0, "full_refusals": 0},
                "ports": [{"name": "t1", "kind": "tap", "vlan": "access 1", "mtu": 1500, "offload": true,
                           "counters": c, "queued": 0, "held": 0, "paused": false}]
            }))
            .unwrap();
            r.cpu.datapath_s = cpu;
            r
        };
        let (a, b, c) =
            (mk(1, 10.0, 100, 1_000_000, 1.0), mk(1, 12.0, 300, 3_000_000, 1.5), mk(2, 1.0, 50, 500_000, 0.1));
        let iv = intervals(&[(100.0, &a), (102.0, &b), (103.0, &c)]);
        assert_eq!(iv.len(), 2);
        assert_eq!((iv[0].at, iv[0].ports[0].1, iv[0].ports[0].3), (2.0, 8_000_000.0, 100.0));
        assert_eq!(iv[0].cpu_pct, 25.0);
        assert_eq!(iv[0].cpu_ms_per_mb, Some(250.0));
        // The daemon restarted: the new counters are the interval's.
        assert!(iv[1].reset);
        assert_eq!(iv[1].ports[0].3, 50.0);
    }
}

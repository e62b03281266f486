//! `sluice top`: the switch's ports and traffic classes as rates, refreshed in place
//! (docs/architecture.md, "Seeing inside the switch"). Two snapshots of `sluice stats` an
//! interval apart make every rate; `--once` prints one table for scripts.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use comfy_table::{CellAlignment, Table};

use sluice_api::client::{Client, Target};
use sluice_api::proto::{Request, StatsReport};

/// Arguments of `sluice top`.
#[derive(clap::Args, Debug)]
pub struct TopArgs {
    /// Print one table of rates (over one interval) and exit, without the live view.
    #[arg(long)]
    pub once: bool,
    /// Seconds between snapshots (0.2 to 60).
    #[arg(long, short = 'd', default_value_t = 1.0, value_name = "SECS")]
    pub interval: f64,
    #[command(flatten)]
    pub target: Target,
}

/// One port's rates over an interval.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PortRates {
    pub name: String,
    pub kind: String,
    pub rx_fps: f64,
    pub rx_bps: f64,
    pub tx_fps: f64,
    pub tx_bps: f64,
    pub drops_ps: f64,
    /// The cause that dropped most in the interval, if any dropped.
    pub top_drop: Option<String>,
    pub queued: usize,
    pub held: usize,
    pub failed: bool,
    /// (class, frames/s sent, bits/s sent, drops/s, queued) per traffic class.
    pub classes: Vec<(String, f64, f64, f64, usize)>,
}

/// The whole view: the switch and its ports' rates.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Rates {
    pub title: String,
    /// Share of one CPU the datapath thread used (percent).
    pub datapath_cpu_pct: f64,
    pub fib_entries: usize,
    pub ports: Vec<PortRates>,
}

fn per_s(now: u64, before: u64, dt: f64) -> f64 {
    now.saturating_sub(before) as f64 / dt
}

/// The rates between snapshots `a` and `b` taken `dt` seconds apart (ports matched by
/// name; a port new in `b`, or whose counters were reset, counts from zero).
pub fn rates(a: &StatsReport, b: &StatsReport, dt: f64) -> Rates {
    let dt = dt.max(1e-3);
    let ports = b
        .ports
        .iter()
        .map(|p| {
            let old = a.ports.iter().find(|o| o.name == p.name);
            let c = p.counters;
            let mut o = old.map(|o| o.counters).unwrap_or_default();
            if c.rx_frames < o.rx_frames || c.tx_frames < o.tx_frames {
                // (Reset between the snapshots.)
                o = Default::default();
            }
            let mut drops: Vec<(String, f64)> = serde_json::to_value(c.rx_drops)
                .ok()
                .zip(serde_json::to_value(c.tx_drops).ok())
                .into_iter()
                .flat_map(|(rx, tx)| {
                    let orx = serde_json::to_value(o.rx_drops).unwrap_or_default();
                    let otx = serde_json::to_value(o.tx_drops).unwrap_or_default();
                    let mut v = Vec::new();
                    for (now, before) in [(rx, orx), (tx, otx)] {
                        for (cause, n) in now.as_object().cloned().unwrap_or_default() {
                            let d = per_s(n.as_u64().unwrap_or(0), before[&cause].as_u64().unwrap_or(0), dt);
                            v.push((cause, d));
                        }
                    }
                    v
                })
                .collect();
            drops.sort_by(|x, y| y.1.total_cmp(&x.1));
            let drops_ps: f64 = drops.iter().map(|d| d.1).sum();
            let classes = p
                .classes
                .iter()
                .map(|k| {
                    let ok = old.and_then(|o| o.classes.iter().find(|x| x.name == k.name)).map(|x| x.counters);
                    let ok = ok.unwrap_or_default();
                    (
                        k.name.clone(),
                        per_s(k.counters.tx_frames, ok.tx_frames, dt),
                        8.0 * per_s(k.counters.tx_bytes, ok.tx_bytes, dt),
                        per_s(k.counters.tx_drops.total(), ok.tx_drops.total(), dt),
                        k.queued,
                    )
                })
                .collect();
            PortRates {
                name: p.name.clone(),
                kind: p.kind.clone(),
                rx_fps: per_s(c.rx_frames, o.rx_frames, dt),
                rx_bps: 8.0 * per_s(c.rx_bytes, o.rx_bytes, dt),
                tx_fps: per_s(c.tx_frames, o.tx_frames, dt),
                tx_bps: 8.0 * per_s(c.tx_bytes, o.tx_bytes, dt),
                drops_ps,
                top_drop: drops.first().filter(|d| d.1 > 0.0).map(|d| d.0.clone()),
                queued: p.queued,
                held: p.held,
                failed: p.failed.is_some(),
                classes,
            }
        })
        .collect();
    let s = &b.switch;
    Rates {
        title: format!(
            "switch {} — {}{}, {} port(s), up {}",
            s.name,
            s.mode,
            if s.datapath == "kernel" { ", kernel datapath" } else { "" },
            b.ports.len(),
            uptime(b.uptime_s)
        ),
        datapath_cpu_pct: 100.0 * (b.cpu.datapath_s - a.cpu.datapath_s).max(0.0) / dt,
        fib_entries: b.fib.entries,
        ports,
    }
}

fn uptime(s: f64) -> String {
    let s = s as u64;
    match s {
        0..3600 => format!("{}m{:02}s", s / 60, s % 60),
        3600..86_400 => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d{:02}h", s / 86_400, s % 86_400 / 3600),
    }
}

/// A rate of frames (or drops) per second: `812`, `81.2k`, `1.20M`.
pub fn fps(x: f64) -> String {
    match x {
        x if x < 1000.0 => format!("{x:.0}"),
        x if x < 1e6 => format!("{:.1}k", x / 1e3),
        x => format!("{:.2}M", x / 1e6),
    }
}

/// A bit rate: `940 b/s`, `12.3 kb/s`, `941.2 Mb/s`, `9.41 Gb/s`.
pub fn bps(x: f64) -> String {
    match x {
        x if x < 1e3 => format!("{x:.0} b/s"),
        x if x < 1e6 => format!("{:.1} kb/s", x / 1e3),
        x if x < 1e9 => format!("{:.1} Mb/s", x / 1e6),
        x => format!("{:.2} Gb/s", x / 1e9),
    }
}

/// The column headers of the port table, and each port's cells.
const PORT_HEADER: [&str; 10] =
    ["PORT", "KIND", "RX FRAMES/S", "RX", "TX FRAMES/S", "TX", "DROPS/S", "MOSTLY", "QUEUED", "HELD"];

fn port_cells(p: &PortRates) -> [String; 10] {
    [
        if p.failed { format!("{} (failed)", p.name) } else { p.name.clone() },
        p.kind.clone(),
        fps(p.rx_fps),
        bps(p.rx_bps),
        fps(p.tx_fps),
        bps(p.tx_bps),
        fps(p.drops_ps),
        p.top_drop.clone().unwrap_or_else(|| "-".into()),
        p.queued.to_string(),
        p.held.to_string(),
    ]
}

const CLASS_HEADER: [&str; 6] = ["PORT", "CLASS", "TX FRAMES/S", "TX", "DROPS/S", "QUEUED"];

/// Whether the classes are worth a table of their own (any but the single default class).
fn shows_classes(r: &Rates) -> bool {
    r.ports.iter().any(|p| p.classes.len() > 1 || p.classes.iter().any(|c| c.0 != "default"))
}

fn summary_line(r: &Rates, dt: f64) -> String {
    format!(
        "{}; rates over {dt:.1} s; datapath CPU {:.0}%; MAC table {} entries",
        r.title, r.datapath_cpu_pct, r.fib_entries
    )
}

/// The `--once` text: a summary line, the port table and (when there are classes) the
/// class table.
pub fn render_text(r: &Rates, dt: f64) -> String {
    let mut out = summary_line(r, dt) + "\n";
    let mut t = Table::new();
    t.load_style(comfy_table::presets::NOTHING);
    t.set_content_arrangement(comfy_table::ContentArrangement::Disabled);
    t.set_header(PORT_HEADER);
    for p in &r.ports {
        t.add_row(port_cells(p));
    }
    for i in 2..PORT_HEADER.len() {
        if i != 7
            && let Some(c) = t.column_mut(i)
        {
            c.set_cell_alignment(CellAlignment::Right);
        }
    }
    out += &t.to_string();
    out.push('\n');
    if shows_classes(r) {
        let mut t = Table::new();
        t.load_style(comfy_table::presets::NOTHING);
        t.set_header(CLASS_HEADER);
        for p in &r.ports {
            for (name, f, b, d, q) in &p.classes {
                t.add_row([p.name.clone(), name.clone(), fps(*f), bps(*b), fps(*d), q.to_string()]);
            }
        }
        out += "\n";
        out += &t.to_string();
        out.push('\n');
    }
    out
}

fn snapshot(c: &mut Client) -> Result<(Instant, StatsReport)> {
    let r: StatsReport = c.call(&Request::Stats { port: None }).context("reading the switch's counters")?;
    Ok((Instant::now(), r))
}

/// Runs `sluice top`.
pub fn run(a: TopArgs) -> Result<()> {
    if !(0.2..=60.0).contains(&a.interval) {
        anyhow::bail!("--interval must be 0.2 to 60 seconds");
    }
    let every = Duration::from_secs_f64(a.interval);
    let mut c = Client::for_target(&a.target)?;
    let first = snapshot(&mut c)?;
    if a.once {
        std::thread::sleep(every);
        let second = snapshot(&mut c)?;
        let dt = second.0.duration_since(first.0).as_secs_f64();
        print!("{}", render_text(&rates(&first.1, &second.1, dt), dt));
        return Ok(());
    }
    live(&mut c, first, every)
}

/// The live view: redrawn every interval until `q`, Esc or Ctrl-C.
fn live(c: &mut Client, first: (Instant, StatsReport), every: Duration) -> Result<()> {
    use crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};
    let mut terminal = ratatui::try_init().context("the live view needs a terminal (use --once for a plain table)")?;
    let mut prev = first;
    let mut view: Option<(Rates, f64)> = None;
    let mut next = Instant::now();
    let mut error: Option<String> = None;
    let result = loop {
        if Instant::now() >= next {
            match snapshot(c) {
                Ok(now) => {
                    let dt = now.0.duration_since(prev.0).as_secs_f64();
                    if dt > 0.05 {
                        view = Some((rates(&prev.1, &now.1, dt), dt));
                    }
                    prev = now;
                    error = None;
                }
                Err(e) => error = Some(format!("{e:#}")),
            }
            next = Instant::now() + every;
        }
        if let Err(e) = terminal.draw(|f| draw(f, view.as_ref(), error.as_deref())) {
            break Err(anyhow::Error::from(e));
        }
        let wait = next.saturating_duration_since(Instant::now()).min(every);
        match event::poll(wait) {
            Ok(true) => match event::read() {
                Ok(Event::Key(k)) if k.kind == KeyEventKind::Press => {
                    let ctrl_c = k.code == KeyCode::Char('c') && k.modifiers.contains(KeyModifiers::CONTROL);
                    if ctrl_c || matches!(k.code, KeyCode::Char('q') | KeyCode::Esc) {
                        break Ok(());
                    }
                }
                Ok(_) => {}
                Err(e) => break Err(e.into()),
            },
            Ok(false) => {}
            Err(e) => break Err(e.into()),
        }
    };
    ratatui::restore();
    result
}

fn draw(f: &mut ratatui::Frame, view: Option<&(Rates, f64)>, error: Option<&str>) {
    use ratatui::layout::{Constraint, Layout};
    use ratatui::style::{Modifier, Style};
    use ratatui::widgets::{Paragraph, Row, Table};
    let area = f.area();
    let Some((r, dt)) = view else {
        f.render_widget(Paragraph::new("sluice top: measuring… (q quits)"), area);
        return;
    };
    let classes = shows_classes(r);
    let class_rows: usize = if classes { r.ports.iter().map(|p| p.classes.len()).sum::<usize>() + 2 } else { 0 };
    let [head, ports, cls, foot] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Min(3),
        Constraint::Length(class_rows as u16),
        Constraint::Length(1),
    ])
    .areas(area);
    f.render_widget(Paragraph::new(summary_line(r, *dt)), head);
    let bold = Style::default().add_modifier(Modifier::BOLD);
    let widths = [
        Constraint::Min(10),
        Constraint::Length(6),
        Constraint::Length(11),
        Constraint::Length(12),
        Constraint::Length(11),
        Constraint::Length(12),
        Constraint::Length(8),
        Constraint::Length(12),
        Constraint::Length(7),
        Constraint::Length(5),
    ];
    let rows = r.ports.iter().map(|p| Row::new(port_cells(p)));
    f.render_widget(Table::new(rows, widths).header(Row::new(PORT_HEADER).style(bold)), ports);
    if classes {
        let rows = r.ports.iter().flat_map(|p| {
            p.classes.iter().map(move |(name, fr, b, d, q)| {
                Row::new([p.name.clone(), name.clone(), fps(*fr), bps(*b), fps(*d), q.to_string()])
            })
        });
        let widths = [
            Constraint::Min(10),
            Constraint::Length(12),
            Constraint::Length(11),
            Constraint::Length(12),
            Constraint::Length(8),
            Constraint::Length(7),
        ];
        f.render_widget(Table::new(rows, widths).header(Row::new(CLASS_HEADER).style(bold)), cls);
    }
    let footer = match error {
        Some(e) => format!("q quits — {e}"),
        None => "q quits".into(),
    };
    f.render_widget(Paragraph::new(footer), foot);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_come_from_two_snapshots_and_survive_a_reset() {
        let mut a: StatsReport = serde_json::from_value(serde_json::json!({
            "switch": {"protocol": 1, "version": "x", "name": "sw", "mode": "l2", "pid": 1, "started_ns": 0,
                       "lossless": false, "datapath": "user", "poll": false, "mtu": 1500, "ports": 1},
            "uptime_s": 10.0, "counters_age_s": 10.0, "ports": [],
            "departed": sluice_switch::PortCounters::default(),
            "fib": {"entries": 2, "max_entries": 8192, "aging_s": 300, "moves": 0, "full_refusals": 0}
        }))
        .unwrap();
        let port = |rx: u64, bytes: u64, drops: u64| {
            let mut c = sluice_switch::PortCounters { rx_frames: rx, rx_bytes: bytes, ..Default::default() };
            c.rx_drops.add_n(sluice_switch::DropCause::OverMtu, drops);
            serde_json::json!({"name": "t1", "kind": "tap", "vlan": "access 1", "mtu": 1500, "offload": true,
                               "counters": c, "queued": 3, "held": 0, "paused": false})
        };
        a.ports = vec![serde_json::from_value(port(1000, 1_000_000, 0)).unwrap()];
        let mut b = a.clone();
        b.ports = vec![serde_json::from_value(port(3000, 3_000_000, 10)).unwrap()];
        b.cpu.datapath_s = 0.5;
        let r = rates(&a, &b, 2.0);
        let p = &r.ports[0];
        assert_eq!((p.rx_fps, p.rx_bps, p.drops_ps), (1000.0, 8_000_000.0, 5.0));
        assert_eq!(p.top_drop.as_deref(), Some("over_mtu"));
        assert_eq!(r.datapath_cpu_pct, 25.0);
        // Counters reset between the snapshots: rates count from zero, never negative.
        let r = rates(&b, &a, 1.0);
        assert_eq!(r.ports[0].rx_fps, 1000.0);
        let text = render_text(&rates(&a, &b, 2.0), 2.0);
        assert!(text.contains("8.0 Mb/s") && text.contains("over_mtu"), "{text}");
        assert_eq!((bps(9.41e9), fps(81_234.0)), ("9.41 Gb/s".to_string(), "81.2k".to_string()));
    }
}

//! Partition-aggregate points of a study (seed 004's Figure 7; the `lossless-pa` built-in):
//! the aggregator in the path's client guest queries the five workers' `sluice bench serve`
//! with `sluice_bench::pa::run_pa`, and the path's drops are read around each point — the
//! switch's by cause, the kernel's on the path's interfaces, TCP's retransmissions in the
//! guests — so a completion time is read beside where its losses happened.

use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::error::Result;
use plotters::prelude::*;
use sluice_bench::pa::{PaOptions, run_pa};
use sluice_bench::result::RunResult;
use sluice_sys::bail;
use sluice_sys::error::Context;

use super::record::{CellKey, CellRecord, Options, PathDrops, StudyFile};
use super::spec::{Family, PaPoint, Study};
use super::table::num;
use sluice_api::client::Client;
use sluice_api::proto::{Request, StatsReport};
use sluice_lab::compared::Topology;
use sluice_sys::netns;

/// Reads the path's counters now (absolute values; [`run_point`] takes differences).
fn read_counters(topo: &Topology) -> Result<PathDrops> {
    let mut d = PathDrops::default();
    for sock in &topo.switch_sockets {
        let r: StatsReport = Client::connect(sock)?.call(&Request::Stats { port: None })?;
        for p in &r.ports {
            let c = &p.counters;
            for cause in sluice_switch::counters::DropCause::ALL {
                let n = c.rx_drops.get(cause) + c.tx_drops.get(cause);
                *d.switch.entry(cause.name().to_string()).or_default() += n;
            }
            d.pauses += c.pauses;
            // A tunnel port's own drops (datagrams refused, its socket's overflows, frames
            // with nowhere to go) are the path's interface drops; a TAP's are counted from
            // its namespace below.
            if p.kind == "vxlan"
                && let Some(dd) = p.device_drops
            {
                d.interfaces += dd.to_guest + dd.from_guest;
            }
            d.watchdog_trips += p.classes.iter().map(|k| k.counters.watchdog_trips).sum::<u64>();
        }
        if let Some(k) = &r.kernel {
            d.interfaces += k.upcall_queue_drops.unwrap_or(0);
        }
    }
    let mut spaces: Vec<Option<String>> = topo.guest_namespaces().into_iter().map(Some).collect();
    spaces.extend(topo.switch_ns.iter().cloned().map(Some));
    for ns in &spaces {
        d.interfaces += interface_drops(ns.as_deref(), &[])?;
    }
    if !topo.host_devices.is_empty() {
        d.interfaces += interface_drops(None, &topo.host_devices)?;
    }
    for ns in topo.guest_namespaces() {
        let (rtx, spurious) = tcp_retrans(&ns)?;
        d.tcp_retrans += rtx;
        d.tcp_spurious += spurious;
    }
    Ok(d)
}

/// Receive plus transmit drops of the interfaces in `ns` (all but loopback), or of
/// `only` when it names some, from `ip -s -j link`.
fn interface_drops(ns: Option<&str>, only: &[String]) -> Result<u64> {
    let mut cmd = Command::new("ip");
    if let Some(ns) = ns {
        cmd.args(["-n", ns]);
    }
    let out = cmd.args(["-s", "-j", "link", "show"]).output().context("running ip -s -j link show")?;
    if !out.status.success() {
        bail!(
            "ip -s link show{} failed: {}",
            ns.map(|n| format!(" in {n}")).unwrap_or_default(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).context("reading ip's JSON")?;
    let mut sum = 0;
    for link in v.as_array().into_iter().flatten() {
        let name = link["ifname"].as_str().unwrap_or_default();
        if name == "lo" || (!only.is_empty() && !only.iter().any(|o| o == name)) {
            continue;
        }
        let s = &link["stats64"];
        sum += s["rx"]["dropped"].as_u64().unwrap_or(0) + s["tx"]["dropped"].as_u64().unwrap_or(0);
    }
    Ok(sum)
}

/// `TcpRetransSegs` and `TcpExtTCPDSACKRecvSegs` of namespace `ns` (its /proc/net/snmp
/// and netstat, read from a thread inside it).
fn tcp_retrans(ns: &str) -> Result<(u64, u64)> {
    let (snmp, netstat) = netns::run_in(Some(ns), || {
        Ok((
            std::fs::read_to_string("/proc/thread-self/net/snmp")?,
            std::fs::read_to_string("/proc/thread-self/net/netstat")?,
        ))
    })
    .with_context(|| format!("reading the TCP counters of {ns}"))?;
    let rtx = snmp_value(&snmp, "Tcp", "RetransSegs")
        .ok_or_else(|| sluice_sys::failure!("no Tcp RetransSegs in {ns}'s /proc/net/snmp"))?;
    // Older kernels lack the counter; none counted then.
    Ok((rtx, snmp_value(&netstat, "TcpExt", "TCPDSACKRecvSegs").unwrap_or(0)))
}

/// A counter of /proc/net/snmp (or netstat) text: a header line `Proto: names…`, then
/// `Proto: values…`.
fn snmp_value(text: &str, proto: &str, name: &str) -> Option<u64> {
    let tag = format!("{proto}:");
    let mut lines = text.lines().filter(|l| l.starts_with(&tag));
    let names = lines.next()?;
    let values = lines.next()?;
    let i = names.split_whitespace().position(|n| n == name)?;
    values.split_whitespace().nth(i)?.parse().ok()
}

/// Runs one point on `topo`: the aggregator in the client guest, the workers in the
/// serving guests; returns the result and what the path lost meanwhile.
pub fn run_point(
    topo: &Topology,
    point: PaPoint,
    cell: &CellKey,
    o: &Options,
    queries: u64,
) -> Result<(RunResult, PathDrops)> {
    let servers = topo.servers(cell.family);
    let opts = PaOptions {
        workers: servers
            .iter()
            .map(|(_, a)| sluice_bench::host_port(&a.to_string(), sluice_bench::control::DEFAULT_PORT))
            .collect(),
        query: 64,
        response: u64::from(point.response_mtus) * u64::from(cell.mtu),
        duration: Duration::from_secs(u64::from(o.duration_s)),
        guest_pids: topo.server_pids(),
        switch_pid: topo.switch_pid,
        background: point.background,
        queries: Some(queries),
    };
    let before = read_counters(topo)?;
    let pin = o.pin;
    let r = netns::run_in(Some(&topo.client_ns), move || {
        if pin {
            sluice_sys::pin_to_cpu(0)?;
        }
        run_pa(&opts).map_err(std::io::Error::other)
    })?;
    let after = read_counters(topo)?;
    if !sluice_bench::report::counts_agree(&r) {
        bail!("aggregator and workers count differently: {:?} vs {:?}", r.client, r.server);
    }
    Ok((r, after.since(&before)))
}

/// The query count a point runs to (`--quick`: a tenth, at most 1,000).
pub fn queries(study: &Study, o: &Options) -> u64 {
    if o.quick { (study.queries / 10).clamp(1, 1000) } else { study.queries }
}

/// One measured point, for the report.
struct Point<'a> {
    path: &'a str,
    mtus: u32,
    rec: &'a CellRecord,
}

/// The groups of the report: (MTU, family, background streams).
fn groups(study: &Study, cells: &[CellRecord]) -> Vec<(u16, Family, u32)> {
    let mut out = Vec::new();
    for &mtu in &study.mtus {
        for &family in &study.families {
            for w in &study.workloads {
                if let Some(p) = w.pa
                    && !out.contains(&(mtu, family, p.background))
                    && cells.iter().any(|c| c.key.workload == w.name && c.key.mtu == mtu && c.key.family == family)
                {
                    out.push((mtu, family, p.background));
                }
            }
        }
    }
    out
}

fn points<'a>(study: &'a Study, cells: &'a [CellRecord], g: (u16, Family, u32)) -> Vec<Point<'a>> {
    let mut out = Vec::new();
    for w in &study.workloads {
        let Some(p) = w.pa.filter(|p| p.background == g.2) else { continue };
        for c in cells.iter().filter(|c| c.key.workload == w.name && c.key.mtu == g.0 && c.key.family == g.1) {
            out.push(Point { path: &c.key.path, mtus: p.response_mtus, rec: c });
        }
    }
    out
}

fn slug(g: (u16, Family, u32)) -> String {
    format!("pa-mtu{}-{}-bg{}", g.0, format!("{}", g.1).to_lowercase(), g.2)
}

fn title(g: (u16, Family, u32)) -> String {
    let bg = match g.2 {
        0 => "no background flows".to_string(),
        1 => "one background stream".to_string(),
        n => format!("{n} background streams"),
    };
    format!("Partition-aggregate, {bg} — MTU {}, {}", g.0, g.1)
}

/// Bytes as kB, without needless decimals: `3 kB`, `1.5 kB`, `3,072 kB`.
fn kb(bytes: u64) -> String {
    if bytes.is_multiple_of(1000) {
        format!("{} kB", int(bytes / 1000))
    } else {
        format!("{:.1} kB", bytes as f64 / 1000.0)
    }
}

/// A whole number with thousands separators.
fn int(n: u64) -> String {
    if n >= 1000 { num(n as f64) } else { n.to_string() }
}

/// Milliseconds, with three significant digits.
fn ms(us: f64) -> String {
    let v = us / 1000.0;
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// The partition-aggregate part of the report (empty when the study has no such points),
/// with a chart per group written into `dir/charts`.
pub fn section(dir: Option<&Path>, sf: &StudyFile, cells: &[CellRecord]) -> Result<String> {
    let study = &sf.study;
    let mut md = String::new();
    let gs = groups(study, cells);
    if gs.is_empty() {
        return Ok(md);
    }
    let paths: Vec<&String> = study.paths.iter().filter(|p| cells.iter().any(|c| &c.key.path == *p)).collect();
    let base = &sf.options.baseline;
    let target = queries(study, &sf.options);
    let _ = writeln!(
        md,
        "Partition-aggregate points: the aggregator sends a 64-byte query to each of the {} workers and the query completes when every answer is in; the **query completion time** (QCT) is the time from the first query's write to the last answer's last byte. Up to {} queries per point, fewer where the point's {} s ran out. Drops are counted during the point: **switch** = the sluice switch's drops by cause, **interfaces** = the kernel's drops on the path's TAPs, veths and bridge ports, **TCP rtx** = segments the guests retransmitted (`TcpRetransSegs`), and in parentheses how many of them the receiver already had (DSACK: spurious, reordering taken for loss).\n",
        super::spec::PA_WORKERS,
        queries(study, &sf.options),
        sf.options.duration_s
    );
    for g in gs {
        let pts = points(study, cells, g);
        let mut sizes: Vec<u32> = pts.iter().map(|p| p.mtus).collect();
        sizes.sort_unstable();
        sizes.dedup();
        let _ = writeln!(md, "## {}\n", title(g));
        let find = |path: &str, n: u32| pts.iter().filter(|p| p.path == path && p.mtus == n).map(|p| p.rec).next_back();
        let _ = writeln!(
            md,
            "Mean QCT in ms (p99 in parentheses), its ratio to `{base}`, and [the queries made] where the point's time ran out before {}.\n",
            int(target)
        );
        table_head(&mut md, &paths);
        for &n in &sizes {
            let _ = write!(md, "| {n} MTUs ({}) |", kb(u64::from(n) * u64::from(g.0)));
            for p in &paths {
                match find(p, n).and_then(|r| r.result.completion) {
                    Some(c) => {
                        let ratio = find(base, n)
                            .and_then(|b| b.result.completion)
                            .filter(|b| b.mean_us > 0.0 && *p != base)
                            .map(|b| format!(" ×{:.2}", c.mean_us / b.mean_us))
                            .unwrap_or_default();
                        let fewer =
                            if c.queries < target { format!(" [{} queries]", int(c.queries)) } else { String::new() };
                        let _ = write!(md, " {} ({}){ratio}{fewer} |", ms(c.mean_us), ms(c.p99_us));
                    }
                    None => {
                        let _ = write!(md, " – |");
                    }
                }
            }
            let _ = writeln!(md);
        }
        let _ = writeln!(md);
        let _ = writeln!(md, "Drops during each point: switch (by cause) · interfaces · TCP rtx.\n");
        table_head(&mut md, &paths);
        for &n in &sizes {
            let _ = write!(md, "| {n} MTUs |");
            for p in &paths {
                match find(p, n).map(|r| r.drops.clone().unwrap_or_default()) {
                    Some(d) => {
                        let sw = if d.switch.is_empty() {
                            "0".to_string()
                        } else {
                            d.switch.iter().map(|(k, v)| format!("{v} {k}")).collect::<Vec<_>>().join(", ")
                        };
                        let extra = if d.watchdog_trips > 0 {
                            format!(" ({} watchdog trips)", d.watchdog_trips)
                        } else {
                            String::new()
                        };
                        let _ =
                            write!(md, " {sw}{extra} · {} · {} ({}) |", d.interfaces, d.tcp_retrans, d.tcp_spurious);
                    }
                    None => {
                        let _ = write!(md, " – |");
                    }
                }
            }
            let _ = writeln!(md);
        }
        let _ = writeln!(md);
        if let Some(dir) = dir {
            let file = format!("charts/{}.png", slug(g));
            let series: Vec<(String, Vec<(u32, f64)>)> = paths
                .iter()
                .map(|p| {
                    let v = sizes
                        .iter()
                        .filter_map(|&n| find(p, n).and_then(|r| r.result.completion).map(|c| (n, c.mean_us / 1000.0)))
                        .collect();
                    (p.to_string(), v)
                })
                .collect();
            draw(&dir.join(&file), &title(g), &series).with_context(|| format!("drawing {file}"))?;
            let _ = writeln!(md, "![{}]({file})\n", title(g));
        }
    }
    Ok(md)
}

/// A table's head: the answer column, then a column per path.
fn table_head(md: &mut String, paths: &[&String]) {
    let _ = write!(md, "| answer |");
    for p in paths {
        let _ = write!(md, " {p} |");
    }
    let _ = writeln!(md);
    let _ = writeln!(md, "|---|{}", "---:|".repeat(paths.len()));
}

/// Mean QCT against the answer size, both axes log scale, a line per path (seed 004's
/// Figure 7a). Drawn in log coordinates by hand: x = log2(MTUs), y = log10(ms).
fn draw(file: &Path, title: &str, series: &[(String, Vec<(u32, f64)>)]) -> Result<()> {
    super::chart::font();
    let pts = series.iter().flat_map(|s| s.1.iter());
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for &(n, v) in pts {
        let (x, y) = (f64::from(n).log2(), v.max(1e-3).log10());
        (x0, x1, y0, y1) = (x0.min(x), x1.max(x), y0.min(y), y1.max(y));
    }
    if x0 > x1 {
        return Ok(());
    }
    let (x0, x1) = (x0 - 0.5, x1 + 0.5);
    let (y0, y1) = (y0.floor(), y1.ceil().max(y0.floor() + 1.0));
    let root = BitMapBackend::new(file, (900, 600)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| sluice_sys::failure!("{e}"))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(64)
        .build_cartesian_2d(x0..x1, y0..y1)
        .map_err(|e| sluice_sys::failure!("{e}"))?;
    chart
        .configure_mesh()
        .light_line_style(RGBColor(236, 236, 236))
        .x_labels(((x1 - x0) as usize + 1) * 2)
        .x_label_formatter(&|x| {
            let r = x.round();
            if (x - r).abs() < 0.01 && r >= 0.0 { format!("{}", 1u64 << (r as u32)) } else { String::new() }
        })
        .y_labels(((y1 - y0) as usize + 1) * 2)
        .y_label_formatter(&|y| {
            let r = y.round();
            if (y - r).abs() < 0.01 {
                if r >= 0.0 { int(10f64.powf(r).round() as u64) } else { format!("{}", 10f64.powf(r)) }
            } else {
                String::new()
            }
        })
        .x_desc("answer per worker (MTUs, log scale)")
        .y_desc("mean query completion time (ms, log scale)")
        .label_style(("sans-serif", 14))
        .draw()
        .map_err(|e| sluice_sys::failure!("{e}"))?;
    for (i, (path, v)) in series.iter().enumerate() {
        let color = super::chart::COLORS[i % super::chart::COLORS.len()];
        let line: Vec<(f64, f64)> = v.iter().map(|&(n, ms)| (f64::from(n).log2(), ms.max(1e-3).log10())).collect();
        chart
            .draw_series(std::iter::once(PathElement::new(line.clone(), color.stroke_width(2))))
            .map_err(|e| sluice_sys::failure!("{e}"))?
            .label(path.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2)));
        chart
            .draw_series(line.iter().map(|&p| Circle::new(p, 4, color.filled())))
            .map_err(|e| sluice_sys::failure!("{e}"))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.3))
        .label_font(("sans-serif", 14))
        .draw()
        .map_err(|e| sluice_sys::failure!("{e}"))?;
    root.present().map_err(|e| sluice_sys::failure!("{e}"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snmp_counters_are_read_by_name() {
        let text = "Ip: Forwarding DefaultTTL\nIp: 1 64\nTcp: RtoAlgorithm RtoMin RetransSegs InErrs\nTcp: 1 200 17 0\nUdp: InDatagrams\nUdp: 3\n";
        assert_eq!(snmp_value(text, "Tcp", "RetransSegs"), Some(17));
        assert_eq!(snmp_value(text, "Udp", "InDatagrams"), Some(3));
        assert_eq!(snmp_value(text, "Tcp", "Nope"), None);
        assert_eq!(snmp_value("", "Tcp", "RetransSegs"), None);
    }

    #[test]
    fn sizes_print_plainly() {
        assert_eq!(kb(3000), "3 kB");
        assert_eq!(kb(3_072_000), "3,072 kB");
        assert_eq!(kb(1500), "1.5 kB");
        assert_eq!(ms(1234.0), "1.23");
        assert_eq!(ms(123_456.0), "123");
    }

    #[test]
    fn drops_are_the_differences_and_quiet_causes_are_left_out() {
        let before = PathDrops {
            switch: [("queue_full".to_string(), 5), ("watchdog".to_string(), 2)].into(),
            pauses: 1,
            watchdog_trips: 0,
            interfaces: 10,
            tcp_retrans: 7,
            tcp_spurious: 1,
        };
        let after = PathDrops {
            switch: [("queue_full".to_string(), 9), ("watchdog".to_string(), 2)].into(),
            pauses: 4,
            watchdog_trips: 1,
            interfaces: 10,
            tcp_retrans: 12,
            tcp_spurious: 3,
        };
        let d = after.since(&before);
        assert_eq!(d.switch, [("queue_full".to_string(), 4)].into());
        assert_eq!((d.pauses, d.watchdog_trips, d.interfaces, d.tcp_retrans, d.tcp_spurious), (3, 1, 0, 5, 2));
        assert_eq!(d.switch_total(), 4);
    }
}

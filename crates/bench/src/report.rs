//! Output of the workload modeler: a readable table, JSON and CSV.
//!
//! All three render a series of [`RunResult`]s (typically one per connection count) and add the
//! figures the studies derive from them: transactions per second, MB/s and Gbit/s (payload, both
//! directions, 1 MB = 10^6 bytes), and CPU per transaction (µs) or per megabyte (ms), split into
//! guest / switch / other. The derivations are [`RunResult`]'s own methods, so every format agrees.
//!
//! Invariants:
//!
//! - The JSON document has `"schema": `[`JSON_SCHEMA`]; fields are only ever added within a schema
//!   version. The CSV's columns are exactly [`CSV_COLUMNS`], in that order. Both are documented field
//!   by field, with units, in `docs/bench-json.md`.
//! - Rendering never fails and never panics on odd input (zero durations, empty series): rates over
//!   zero seconds or zero transactions are 0.
//! - Latencies are stored in microseconds everywhere; the histogram the engine records is in
//!   nanoseconds ([`latency_from_histogram`] converts).

use std::fmt::Write as _;
use std::str::FromStr;

use comfy_table::{CellAlignment, Table};
use serde::Serialize;

use crate::result::{Latency, RunResult};

/// The output formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// Aligned columns for a terminal ([`render_table`]).
    Table,
    /// One pretty-printed JSON document ([`render_json`]).
    Json,
    /// Comma-separated values with a header row ([`render_csv`]).
    Csv,
}

/// A format name that is not one of ours.
#[derive(Debug, thiserror::Error)]
#[error("unknown output format {given:?}: use one of table, json, csv")]
pub struct UnknownFormat {
    /// What was given.
    pub given: String,
}

impl FromStr for Format {
    type Err = UnknownFormat;

    /// Parses `table`, `json` or `csv` (case-insensitive).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "table" => Ok(Format::Table),
            "json" => Ok(Format::Json),
            "csv" => Ok(Format::Csv),
            _ => Err(UnknownFormat { given: s.to_string() }),
        }
    }
}

/// What the table's CPU columns are normalized by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Per {
    /// CPU microseconds per transaction (request-response profiles).
    Transaction,
    /// CPU milliseconds per megabyte of payload (streaming profiles).
    Megabyte,
}

impl Per {
    /// How the studies normalize a workload that moved `bytes` of payload in
    /// `transactions`: per megabyte when a transaction moves 16 KiB or more (streaming),
    /// per transaction otherwise (request-response).
    pub fn for_volume(transactions: u64, bytes: u64) -> Per {
        if transactions > 0 && bytes / transactions >= 16 * 1024 { Per::Megabyte } else { Per::Transaction }
    }
}

/// Renders `results` in `format`; `per` only matters for [`Format::Table`] (JSON and CSV carry both
/// normalizations).
pub fn render(results: &[RunResult], format: Format, per: Per) -> String {
    match format {
        Format::Table => render_table(results, per),
        Format::Json => render_json(results),
        Format::Csv => render_csv(results),
    }
}

/// Formats a figure with about three significant digits (more for large values): `12346`, `98.7`,
/// `1.23`, `0.123`; `-` for a non-finite value.
fn num(x: f64) -> String {
    if !x.is_finite() {
        return "-".to_string();
    }
    let a = x.abs();
    if a == 0.0 {
        "0".to_string()
    } else if a >= 100.0 {
        format!("{x:.0}")
    } else if a >= 10.0 {
        format!("{x:.1}")
    } else if a >= 1.0 {
        format!("{x:.2}")
    } else {
        format!("{x:.3}")
    }
}

/// Partition-aggregate queries per second of a result, if it has completion times.
fn queries_per_s(r: &RunResult) -> Option<f64> {
    r.completion.map(|c| if r.duration_s > 0.0 { c.queries as f64 / r.duration_s } else { 0.0 })
}

/// Whether the client's and the server's counts of a run agree: the same transactions, and every
/// byte the client sent was received by the server and vice versa.
pub fn counts_agree(r: &RunResult) -> bool {
    r.client.transactions == r.server.transactions
        && r.client.bytes_sent == r.server.bytes_received
        && r.client.bytes_received == r.server.bytes_sent
}

/// Describes how a result's client and server counts disagree, for a warning line; `None` if they
/// agree.
fn count_mismatch(r: &RunResult) -> Option<String> {
    if counts_agree(r) {
        return None;
    }
    let (c, s) = (&r.client, &r.server);
    let mut parts = Vec::new();
    if c.transactions != s.transactions {
        parts.push(format!("transactions {} (client) vs {} (server)", c.transactions, s.transactions));
    }
    if c.bytes_sent != s.bytes_received {
        parts.push(format!("client sent {} B, server received {} B", c.bytes_sent, s.bytes_received));
    }
    if c.bytes_received != s.bytes_sent {
        parts.push(format!("server sent {} B, client received {} B", s.bytes_sent, c.bytes_received));
    }
    let hint = if *s == Default::default() {
        "the server reported nothing: was its count report lost, or is it another run's server?"
    } else {
        "data was lost or the two sides timed different windows; do not trust these figures"
    };
    Some(format!(
        "WARNING: client/server counts disagree for {} at {} conns: {}; {hint}",
        r.profile,
        r.conns,
        parts.join("; ")
    ))
}

/// A table without borders; columns right-aligned (they are numbers) except those in `left`.
fn plain_table(header: Vec<String>, rows: Vec<Vec<String>>, left: &[usize]) -> String {
    let mut table = Table::new();
    table.load_style(comfy_table::presets::NOTHING);
    let ncols = header.len();
    table.set_header(header);
    for row in rows {
        table.add_row(row);
    }
    for i in (0..ncols).filter(|i| !left.contains(i)) {
        if let Some(col) = table.column_mut(i) {
            col.set_cell_alignment(CellAlignment::Right);
        }
    }
    table.trim_fmt()
}

/// Renders a series of results (one per connection count) for the terminal.
///
/// The main table has: conns; transactions/s; MB/s; Gbit/s; latency p50, p90, p99, p99.9 and max
/// in µs; then CPU as guest / switch / other / total, per transaction in µs ([`Per::Transaction`])
/// or per megabyte in ms ([`Per::Megabyte`]). When any result has partition-aggregate completion
/// times, their mean / p50 / p99 in ms and queries/s follow. A `profile` column leads when the
/// results are of different profiles; otherwise the profile is named in a heading line.
///
/// When any result has per-flowop statistics, a second table lists them (conns, flowop, count,
/// mean µs). The last line(s) say "client/server counts agree", or warn about each result whose
/// counts do not.
pub fn render_table(results: &[RunResult], per: Per) -> String {
    if results.is_empty() {
        return "no results\n".to_string();
    }
    let mut out = String::new();
    let one_profile = results.iter().all(|r| r.profile == results[0].profile);
    if one_profile {
        let _ = writeln!(out, "profile {}", results[0].profile);
    }
    let pa = results.iter().any(|r| r.completion.is_some());

    let unit = match per {
        Per::Transaction => "µs/tx",
        Per::Megabyte => "ms/MB",
    };
    let mut header: Vec<String> = Vec::new();
    if !one_profile {
        header.push("profile".into());
    }
    header.extend(
        ["conns", "tx/s", "MB/s", "Gbit/s", "p50 µs", "p90 µs", "p99 µs", "p99.9 µs", "max µs"].map(String::from),
    );
    header.extend(["guest", "switch", "other", "total"].map(|p| format!("{p} {unit}")));
    if pa {
        header.extend(["compl mean ms", "compl p50 ms", "compl p99 ms", "queries/s"].map(String::from));
    }
    let rows = results
        .iter()
        .map(|r| {
            let mut row = Vec::new();
            if !one_profile {
                row.push(r.profile.clone());
            }
            row.push(r.conns.to_string());
            let l = &r.latency;
            row.extend(
                [r.tps(), r.mb_per_s(), r.gbit_per_s(), l.p50_us, l.p90_us, l.p99_us, l.p999_us, l.max_us].map(num),
            );
            let cpu = match per {
                Per::Transaction => r.cpu_us_per_transaction(),
                Per::Megabyte => r.cpu_ms_per_mb(),
            };
            row.extend(cpu.map(num));
            if pa {
                match (r.completion, queries_per_s(r)) {
                    (Some(c), Some(q)) => {
                        row.extend([c.mean_us / 1e3, c.p50_us / 1e3, c.p99_us / 1e3, q].map(num));
                    }
                    _ => row.extend(std::iter::repeat_n("-".to_string(), 4)),
                }
            }
            row
        })
        .collect();
    out.push_str(&plain_table(header, rows, if one_profile { &[] } else { &[0] }));
    out.push('\n');

    if results.iter().any(|r| !r.flowops.is_empty()) {
        out.push_str("\nper-flowop averages\n");
        let rows = results
            .iter()
            .flat_map(|r| {
                r.flowops.iter().map(move |f| {
                    let mut row = Vec::new();
                    if !one_profile {
                        row.push(r.profile.clone());
                    }
                    row.extend([r.conns.to_string(), f.flowop.clone(), f.count.to_string(), num(f.mean_us)]);
                    row
                })
            })
            .collect();
        let mut header: Vec<String> = Vec::new();
        if !one_profile {
            header.push("profile".into());
        }
        header.extend(["conns", "flowop", "count", "mean µs"].map(String::from));
        let left: &[usize] = if one_profile { &[1] } else { &[0, 2] };
        out.push_str(&plain_table(header, rows, left));
        out.push('\n');
    }

    out.push('\n');
    let warnings: Vec<String> = results.iter().filter_map(count_mismatch).collect();
    if warnings.is_empty() {
        out.push_str("client/server counts agree\n");
    } else {
        for w in warnings {
            out.push_str(&w);
            out.push('\n');
        }
    }
    out
}

/// Version of the JSON document's layout; bumped only when a field changes meaning or goes away.
pub const JSON_SCHEMA: u32 = 1;

/// guest / switch / other / total, as JSON.
#[derive(Serialize)]
struct CpuParts {
    guest: f64,
    switch: f64,
    other: f64,
    total: f64,
}

impl From<[f64; 4]> for CpuParts {
    fn from([guest, switch, other, total]: [f64; 4]) -> Self {
        CpuParts { guest, switch, other, total }
    }
}

/// A result with its derived figures.
#[derive(Serialize)]
struct JsonResult<'a> {
    #[serde(flatten)]
    result: &'a RunResult,
    tps: f64,
    mb_per_s: f64,
    gbit_per_s: f64,
    cpu_us_per_transaction: CpuParts,
    cpu_ms_per_mb: CpuParts,
    queries_per_s: Option<f64>,
    counts_agree: bool,
}

/// The whole document.
#[derive(Serialize)]
struct JsonReport<'a> {
    schema: u32,
    results: Vec<JsonResult<'a>>,
}

/// Renders results as one pretty-printed JSON document: `{"schema": 1, "results": [...]}` where
/// each result is the [`RunResult`] with derived fields added: `tps`, `mb_per_s`, `gbit_per_s`,
/// `cpu_us_per_transaction` and `cpu_ms_per_mb` (each `{guest, switch, other, total}`),
/// `queries_per_s` (null unless partition-aggregate) and `counts_agree`. See `docs/bench-json.md`.
pub fn render_json(results: &[RunResult]) -> String {
    let report = JsonReport {
        schema: JSON_SCHEMA,
        results: results
            .iter()
            .map(|r| JsonResult {
                result: r,
                tps: r.tps(),
                mb_per_s: r.mb_per_s(),
                gbit_per_s: r.gbit_per_s(),
                cpu_us_per_transaction: r.cpu_us_per_transaction().into(),
                cpu_ms_per_mb: r.cpu_ms_per_mb().into(),
                queries_per_s: queries_per_s(r),
                counts_agree: counts_agree(r),
            })
            .collect(),
    };
    // Serializing plain structs of numbers and strings into a String cannot fail (non-finite
    // floats become null).
    let mut s = serde_json::to_string_pretty(&report).expect("a report always serializes");
    s.push('\n');
    s
}

/// The CSV columns, in order. Units are in the names (`_s` seconds, `_us` microseconds, `_ms`
/// milliseconds, bytes for `bytes_*`); `docs/bench-json.md` describes each. Completion columns are
/// empty for results that are not partition-aggregate; per-flowop statistics are only in the JSON.
pub const CSV_COLUMNS: &[&str] = &[
    "profile",
    "conns",
    "duration_s",
    "client_transactions",
    "client_bytes_sent",
    "client_bytes_received",
    "client_connections",
    "server_transactions",
    "server_bytes_sent",
    "server_bytes_received",
    "server_connections",
    "latency_mean_us",
    "latency_p50_us",
    "latency_p90_us",
    "latency_p99_us",
    "latency_p999_us",
    "latency_max_us",
    "cpu_guest_s",
    "cpu_switch_s",
    "cpu_other_s",
    "cpu_total_s",
    "tps",
    "mb_per_s",
    "gbit_per_s",
    "cpu_us_per_transaction_guest",
    "cpu_us_per_transaction_switch",
    "cpu_us_per_transaction_other",
    "cpu_us_per_transaction_total",
    "cpu_ms_per_mb_guest",
    "cpu_ms_per_mb_switch",
    "cpu_ms_per_mb_other",
    "cpu_ms_per_mb_total",
    "completion_queries",
    "completion_mean_us",
    "completion_p50_us",
    "completion_p99_us",
    "queries_per_s",
    "counts_agree",
];

/// Quotes a CSV field if it needs it (RFC 4180).
fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) { format!("\"{}\"", s.replace('"', "\"\"")) } else { s.to_string() }
}

/// A float for CSV: the shortest text that reads back as the same number; empty if not finite.
fn csv_f64(x: f64) -> String {
    if x.is_finite() { x.to_string() } else { String::new() }
}

/// One result's CSV fields, in [`CSV_COLUMNS`] order.
fn csv_row(r: &RunResult) -> Vec<String> {
    let (c, s, l, cpu) = (&r.client, &r.server, &r.latency, &r.cpu);
    let mut row = vec![csv_field(&r.profile), r.conns.to_string(), csv_f64(r.duration_s)];
    for side in [c, s] {
        row.extend([side.transactions, side.bytes_sent, side.bytes_received, side.connections].map(|n| n.to_string()));
    }
    row.extend([l.mean_us, l.p50_us, l.p90_us, l.p99_us, l.p999_us, l.max_us].map(csv_f64));
    row.extend([cpu.guest_s, cpu.switch_s, cpu.other_s, cpu.total_s()].map(csv_f64));
    row.extend([r.tps(), r.mb_per_s(), r.gbit_per_s()].map(csv_f64));
    row.extend(r.cpu_us_per_transaction().map(csv_f64));
    row.extend(r.cpu_ms_per_mb().map(csv_f64));
    match r.completion {
        Some(comp) => {
            row.push(comp.queries.to_string());
            row.extend([comp.mean_us, comp.p50_us, comp.p99_us].map(csv_f64));
        }
        None => row.extend(std::iter::repeat_n(String::new(), 4)),
    }
    row.push(queries_per_s(r).map(csv_f64).unwrap_or_default());
    row.push(counts_agree(r).to_string());
    debug_assert_eq!(row.len(), CSV_COLUMNS.len());
    row
}

/// Renders results as CSV: a header row of [`CSV_COLUMNS`], then one row per result, `\n`-terminated.
pub fn render_csv(results: &[RunResult]) -> String {
    let mut out = CSV_COLUMNS.join(",");
    out.push('\n');
    for r in results {
        out.push_str(&csv_row(r).join(","));
        out.push('\n');
    }
    out
}

/// One progress line for `-i SECONDS`, without a trailing newline, aligned across lines:
/// `"  10.0s      12345 tx/s      98.7 MB/s  p50 85.3 µs"`. The p50 part is left out when `p50_us`
/// is `None` (no transactions completed in the interval, or a profile without latency).
pub fn interval_line(elapsed_s: f64, tps: f64, mb_per_s: f64, p50_us: Option<f64>) -> String {
    let mut line = format!("{elapsed_s:>6.1}s {tps:>10.0} tx/s {mb_per_s:>9.1} MB/s");
    if let Some(p50) = p50_us {
        let _ = write!(line, "  p50 {} µs", num(p50));
    }
    line
}

/// Builds a [`Latency`] (microseconds) from a histogram recorded in nanoseconds. An empty histogram
/// gives all zeros. Percentiles carry the histogram's precision (its significant figures), and are
/// the highest value equivalent to the recorded ones at that precision.
pub fn latency_from_histogram(h: &hdrhistogram::Histogram<u64>) -> Latency {
    if h.is_empty() {
        return Latency::default();
    }
    let us = |ns: u64| ns as f64 / 1e3;
    Latency {
        mean_us: h.mean() / 1e3,
        p50_us: us(h.value_at_quantile(0.5)),
        p90_us: us(h.value_at_quantile(0.9)),
        p99_us: us(h.value_at_quantile(0.99)),
        p999_us: us(h.value_at_quantile(0.999)),
        max_us: us(h.max()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::result::{Completion, CpuSplit, FlowOpStat, SideCounts};

    fn rr(conns: u32, tx: u64) -> RunResult {
        let counts = SideCounts { transactions: tx, bytes_sent: tx * 200, bytes_received: tx * 100, connections: 1 };
        RunResult {
            profile: "rr-200-100".into(),
            conns,
            duration_s: 10.0,
            client: counts,
            server: SideCounts { bytes_sent: counts.bytes_received, bytes_received: counts.bytes_sent, ..counts },
            latency: Latency {
                mean_us: 90.0,
                p50_us: 85.0,
                p90_us: 120.0,
                p99_us: 250.5,
                p999_us: 900.0,
                max_us: 4000.0,
            },
            flowops: vec![],
            cpu: CpuSplit { guest_s: 2.0, switch_s: 1.0, other_s: 0.5 },
            completion: None,
        }
    }

    fn series() -> Vec<RunResult> {
        let mut two = rr(2, 200_000);
        two.flowops = vec![
            FlowOpStat { flowop: "write size=200".into(), count: 200_000, mean_us: 4.5 },
            FlowOpStat { flowop: "read size=100".into(), count: 200_000, mean_us: 80.4 },
        ];
        vec![rr(1, 100_000), two]
    }

    #[test]
    fn table_has_figures_and_agreement() {
        let t = render_table(&series(), Per::Transaction);
        assert!(t.starts_with("profile rr-200-100\n"), "{t}");
        // 100000 tx in 10 s; 30 MB in 10 s = 3 MB/s = 0.024 Gbit/s; CPU 2 s / 100000 tx = 20 µs.
        let row1 = t.lines().find(|l| l.trim_start().starts_with("1 ")).unwrap();
        let cells: Vec<&str> = row1.split_whitespace().collect();
        assert_eq!(
            cells,
            ["1", "10000", "3.00", "0.024", "85.0", "120", "250", "900", "4000", "20.0", "10.0", "5.00", "35.0"]
        );
        assert!(t.contains("guest µs/tx") && t.contains("p99.9 µs"));
        assert!(t.contains("per-flowop averages") && t.contains("write size=200") && t.contains("80.4"));
        assert!(t.ends_with("client/server counts agree\n"));
        assert!(!t.contains("queries/s"));
        assert!(!t.lines().any(|l| l.ends_with(' ')));
    }

    #[test]
    fn table_per_megabyte_and_pa_and_mixed_profiles() {
        let mut pa = rr(4, 1000);
        pa.profile = "pa".into();
        pa.completion = Some(Completion { queries: 500, mean_us: 1500.0, p50_us: 1200.0, p99_us: 9000.0 });
        let t = render_table(&[rr(1, 100_000), pa], Per::Megabyte);
        assert!(t.contains("guest ms/MB") && t.contains("compl p99 ms") && t.contains("queries/s"));
        assert!(t.lines().next().unwrap().trim_start().starts_with("profile"));
        let pa_row: Vec<&str> =
            t.lines().find(|l| l.trim_start().starts_with("pa ")).unwrap().split_whitespace().collect();
        assert_eq!(&pa_row[pa_row.len() - 4..], ["1.50", "1.20", "9.00", "50.0"]);
        let rr_row: Vec<&str> = t.lines().find(|l| l.contains("rr-200-100")).unwrap().split_whitespace().collect();
        assert_eq!(&rr_row[rr_row.len() - 4..], ["-", "-", "-", "-"]);
        // 2 s guest CPU over 30 MB: 66.7 ms/MB.
        assert!(rr_row.contains(&"66.7"));
        assert!(!t.contains("per-flowop"));
    }

    #[test]
    fn table_warns_on_count_mismatch() {
        let mut bad = rr(8, 1000);
        bad.server.transactions = 998;
        bad.server.bytes_received -= 1;
        let t = render_table(&[rr(1, 10), bad], Per::Transaction);
        assert!(!t.contains("counts agree"));
        let w = t.lines().find(|l| l.starts_with("WARNING")).unwrap();
        assert!(w.contains("at 8 conns") && w.contains("1000 (client) vs 998 (server)"), "{w}");
        assert!(w.contains("client sent 200000 B, server received 199999 B"), "{w}");
        assert!(!w.contains("server sent"), "{w}");

        let mut silent = rr(2, 10);
        silent.server = SideCounts::default();
        assert!(render_table(&[silent], Per::Transaction).contains("the server reported nothing"));
        assert_eq!(render_table(&[], Per::Transaction), "no results\n");
    }

    #[test]
    fn json_parses_back_with_derived_fields() {
        let mut results = series();
        results[1].completion = Some(Completion { queries: 40, mean_us: 1.0, p50_us: 1.0, p99_us: 2.0 });
        let j = render_json(&results);
        let v: serde_json::Value = serde_json::from_str(&j).unwrap();
        assert_eq!(v["schema"], 1);
        let r0 = &v["results"][0];
        assert_eq!(r0["profile"], "rr-200-100");
        assert_eq!(r0["conns"], 1);
        assert_eq!(r0["client"]["transactions"], 100_000);
        assert_eq!(r0["latency"]["p999_us"], 900.0);
        assert_eq!(r0["tps"], 10_000.0);
        assert_eq!(r0["mb_per_s"], 3.0);
        assert_eq!(r0["cpu_us_per_transaction"]["guest"], 20.0);
        assert_eq!(r0["cpu_us_per_transaction"]["total"], 35.0);
        assert!((r0["cpu_ms_per_mb"]["switch"].as_f64().unwrap() - 1000.0 / 30.0).abs() < 1e-9);
        assert!(r0["gbit_per_s"].is_f64());
        assert!(r0["queries_per_s"].is_null() && r0["completion"].is_null());
        assert_eq!(r0["counts_agree"], true);
        let r1 = &v["results"][1];
        assert_eq!(r1["queries_per_s"], 4.0);
        assert_eq!(r1["flowops"][1]["flowop"], "read size=100");
        // The RunResult part still deserializes as one (extra fields are ignored).
        let back: RunResult = serde_json::from_value(r1.clone()).unwrap();
        assert_eq!(back, results[1]);
        assert!(j.contains("\n  \"results\""), "pretty-printed");
    }

    #[test]
    fn csv_rows_match_header() {
        let mut results = series();
        results[0].completion = Some(Completion { queries: 7, mean_us: 1.5, p50_us: 1.0, p99_us: 3.0 });
        let csv = render_csv(&results);
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[0], CSV_COLUMNS.join(","));
        for line in &lines[1..] {
            assert_eq!(line.split(',').count(), CSV_COLUMNS.len(), "{line}");
        }
        let col = |row: usize, name: &str| {
            let i = CSV_COLUMNS.iter().position(|c| *c == name).unwrap();
            lines[row].split(',').nth(i).unwrap().to_string()
        };
        assert_eq!(col(1, "tps"), "10000");
        assert_eq!(col(1, "cpu_total_s"), "3.5");
        assert_eq!(col(1, "cpu_us_per_transaction_other"), "5");
        assert_eq!(col(1, "completion_queries"), "7");
        assert_eq!(col(1, "queries_per_s"), "0.7");
        assert_eq!(col(2, "completion_mean_us"), "");
        assert_eq!(col(2, "counts_agree"), "true");
        assert_eq!(render_csv(&[]), format!("{}\n", CSV_COLUMNS.join(",")));
    }

    #[test]
    fn csv_quotes_odd_profile_names() {
        assert_eq!(csv_field("a,b"), "\"a,b\"");
        assert_eq!(csv_field("say \"hi\""), "\"say \"\"hi\"\"\"");
        assert_eq!(csv_field("plain"), "plain");
    }

    #[test]
    fn interval_lines_align() {
        let a = interval_line(10.0, 12345.4, 98.74, Some(85.0));
        assert_eq!(a, "  10.0s      12345 tx/s      98.7 MB/s  p50 85.0 µs");
        let b = interval_line(110.0, 5.0, 0.0, None);
        assert_eq!(b, " 110.0s          5 tx/s       0.0 MB/s");
        assert_eq!(a.find("tx/s"), b.find("tx/s"));
    }

    #[test]
    fn latency_from_known_histogram() {
        let mut h = hdrhistogram::Histogram::<u64>::new(3).unwrap();
        assert_eq!(latency_from_histogram(&h), Latency::default());
        // 1..=1000 µs, one each, in nanoseconds.
        for us in 1..=1000u64 {
            h.record(us * 1000).unwrap();
        }
        let l = latency_from_histogram(&h);
        let close = |got: f64, want: f64| (got - want).abs() <= want * 0.001 + 1e-9;
        assert!(close(l.mean_us, 500.5), "{l:?}");
        assert!(close(l.p50_us, 500.0), "{l:?}");
        assert!(close(l.p90_us, 900.0), "{l:?}");
        assert!(close(l.p99_us, 990.0), "{l:?}");
        assert!(close(l.p999_us, 999.0), "{l:?}");
        assert!(close(l.max_us, 1000.0), "{l:?}");
    }

    #[test]
    fn format_names() {
        assert_eq!("JSON".parse::<Format>().unwrap(), Format::Json);
        assert_eq!("table".parse::<Format>().unwrap(), Format::Table);
        let e = "xml".parse::<Format>().unwrap_err();
        assert!(e.to_string().contains("table, json, csv"));
        assert!(render(&series(), Format::Csv, Per::Transaction).starts_with("profile,conns"));
    }
}

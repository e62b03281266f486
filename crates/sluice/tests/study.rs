//! `sluice study` end to end: a tiny study builds its paths from namespaces, runs, and
//! writes the table, the CSV and charts that decode; a study naming an unknown path or
//! workload is refused with the name and line; an interrupted study resumes without
//! repeating finished cells, and leaves nothing behind either time; partition-aggregate
//! points (seed 004) build six guests per path and report completion times and drops; a
//! study with conditions measures a path quiet and under attack in one run, records the
//! host's noise per cell, and removes every attacker.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

/// A fresh directory `tag` inside the test process's own runtime directory (`mkdtemp`).
fn scratch(tag: &str) -> PathBuf {
    let d = common::scratch(&format!("study-{tag}"));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn study_file(dir: &Path, body: &str) -> PathBuf {
    let p = dir.join("s.toml");
    std::fs::write(&p, body).unwrap();
    p
}

/// Namespaces a study run by process `pid` would have made.
fn leftovers(pid: u32) -> Vec<String> {
    let out = Command::new("ip").args(["netns", "list"]).output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| {
            n.starts_with(&format!("sst{pid}-"))
                || n.starts_with(&format!("sluice-st{pid}"))
                // The overlay paths' labs: o, the path's index, the pid's last five digits.
                || (n.starts_with("sluice-o") && n.get(9..14) == Some(&format!("{:05}", pid % 100_000)))
        })
        .map(String::from)
        .collect()
}

/// Starts `sluice study run FILE --out OUT` with stdout and stderr piped.
fn spawn_study(file: &Path, out: &Path) -> std::process::Child {
    Command::new(BIN)
        .args(["study", "run", file.to_str().unwrap(), "--out", out.to_str().unwrap()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Runs study `file` to its end: it must succeed and leave nothing behind. Its progress
/// (stderr).
fn run_study_ok(file: &Path, out: &Path) -> String {
    let child = spawn_study(file, out);
    let pid = child.id();
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "{err}");
    assert!(leftovers(pid).is_empty(), "left behind: {:?}", leftovers(pid));
    err
}

/// `png` is a PNG of `size` that is not blank.
fn assert_chart(png: &Path, size: (u32, u32)) {
    let decoder = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(png).unwrap()));
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).unwrap();
    assert_eq!((info.width, info.height), size, "{}", png.display());
    assert!(buf.iter().any(|&b| b != 255), "the chart {} is not blank", png.display());
}

fn cells(dir: &Path) -> Vec<Value> {
    std::fs::read_to_string(dir.join("cells.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
#[ignore = "system tier: needs root (network namespaces, veths, bridges and BPF programs for the study's paths); scripts/test.sh runs it"]
fn a_tiny_study_writes_its_table_csv_and_charts() {
    if !root() {
        return;
    }
    init();
    let d = scratch("tiny");
    let f = study_file(
        &d,
        r#"name = "tiny"
baseline = "direct"
paths = ["direct", "linux-bridge", "sluice-kernel", "sluice-kernel-l3"]
workloads = ["rr-200x1000"]
conns = [2]
mtus = [1500]
reps = 1
duration = 1
"#,
    );
    let out = d.join("out");
    let err = run_study_ok(&f, &out);
    assert!(err.contains("[4/4]"), "progress per cell: {err}");

    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(report.contains("| **direct** (baseline) |"), "{report}");
    assert!(report.contains("| transactions/s |"), "{report}");
    assert!(report.contains("*linux-bridge / direct*: transactions/s"), "{report}");
    assert!(report.contains("*% difference*: CPU µs/transaction total"), "{report}");
    assert!(report.contains("2 CPUs") || report.contains(" CPUs ("), "host facts: {report}");

    let csv = std::fs::read_to_string(out.join("results.csv")).unwrap();
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines.len(), 5, "header and one row per cell: {csv}");
    assert!(lines[0].starts_with("run,at,path,workload,conns,mtu,family,rep"));
    let ncols = lines[0].split(',').count();
    for l in &lines[1..] {
        assert_eq!(l.split(',').count(), ncols, "{l}");
    }
    // Both ends agreed on every cell, and each moved transactions.
    for c in cells(&out) {
        let r = &c["result"];
        assert!(r["client"]["transactions"].as_u64().unwrap() > 0, "{c}");
        assert_eq!(r["client"]["transactions"], r["server"]["transactions"], "{c}");
    }

    assert_chart(&out.join("charts/rr-200x1000-mtu1500-ipv4.png"), (1200, 480));

    // The report can be written again from the cells alone.
    let o = Command::new(BIN).args(["study", "report", out.to_str().unwrap()]).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let _ = std::fs::remove_dir_all(&d);
}

/// Two builds of sluice in one run: `sluice-kernel@copy` runs its switch with the build
/// named in `builds` (here a wrapper that notes how it was started, then runs this sluice),
/// interleaved with `sluice-kernel` run by the study's own executable.
#[test]
#[ignore = "system tier: needs root (network namespaces, veths, bridges and BPF programs for the study's paths); scripts/test.sh runs it"]
fn a_path_runs_its_switch_with_the_build_the_study_names() {
    if !root() {
        return;
    }
    init();
    let d = scratch("builds");
    let marker = d.join("started");
    let wrapper = d.join("sluice-copy");
    std::fs::write(&wrapper, format!("#!/bin/sh\necho \"$*\" >> {}\nexec {BIN} \"$@\"\n", marker.display())).unwrap();
    std::fs::set_permissions(&wrapper, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let f = study_file(
        &d,
        &format!(
            r#"name = "builds"
baseline = "sluice-kernel"
paths = ["sluice-kernel", "sluice-kernel@copy"]
workloads = ["rr-200x1000"]
reps = 1
duration = 1
builds = {{ copy = "{}" }}
"#,
            wrapper.display()
        ),
    );
    let out = d.join("out");
    let err = run_study_ok(&f, &out);
    assert!(err.contains("[2/2]"), "{err}");
    let started = std::fs::read_to_string(&marker).unwrap();
    assert!(started.lines().any(|l| l == "--version"), "asked its version: {started}");
    assert_eq!(started.lines().filter(|l| l.starts_with("switch run --config")).count(), 1, "{started}");
    let paths: Vec<String> = cells(&out).iter().map(|c| c["path"].as_str().unwrap().to_string()).collect();
    assert_eq!(paths.len(), 2);
    assert!(paths.contains(&"sluice-kernel@copy".to_string()), "{paths:?}");
    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(report.contains("build `copy`") && report.contains(&wrapper.display().to_string()), "{report}");
    assert!(report.contains("*sluice-kernel@copy / sluice-kernel*"), "{report}");
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
#[ignore = "system tier: needs root (network namespaces, veths, bridges and BPF programs for the study's paths); scripts/test.sh runs it"]
fn a_partition_aggregate_study_builds_six_guests_and_reports_completion_times_and_drops() {
    if !root() {
        return;
    }
    init();
    let d = scratch("pa");
    let f = study_file(
        &d,
        r#"name = "pa"
baseline = "linux-bridge"
paths = ["linux-bridge", "sluice-l2-lossless", "sluice-l2-stream"]
workloads = ["pa-8mtu", "pa-64mtu-bg2"]
reps = 1
duration = 2
queries = 200
"#,
    );
    let out = d.join("out");
    let err = run_study_ok(&f, &out);
    assert!(err.contains("[6/6]") && err.contains("ms mean QCT"), "progress per point: {err}");

    let cs = cells(&out);
    assert_eq!(cs.len(), 6, "{cs:?}");
    for c in &cs {
        let r = &c["result"];
        let q = r["completion"]["queries"].as_u64().unwrap();
        assert!((1..=200).contains(&q), "{c}");
        assert!(r["completion"]["mean_us"].as_f64().unwrap() > 0.0, "{c}");
        // Five workers answered every query, and both ends counted alike.
        assert_eq!(c["conns"], 5, "{c}");
        assert_eq!(r["client"]["transactions"], r["server"]["transactions"], "{c}");
        let bg = c["workload"] == "pa-64mtu-bg2";
        let conns = r["client"]["connections"].as_u64().unwrap();
        assert_eq!(conns, if bg { 7 } else { 5 }, "five query connections, two background streams: {c}");
        if !bg {
            assert_eq!(r["client"]["bytes_received"].as_u64().unwrap(), q * 5 * 8 * 1500, "{c}");
        }
        // The drops were read on every path.
        let drops = &c["drops"];
        assert!(drops["tcp_retrans"].is_u64() && drops["interfaces"].is_u64(), "{c}");
        if c["path"] == "sluice-l2-lossless" {
            let switch: u64 = drops["switch"].as_object().unwrap().values().map(|v| v.as_u64().unwrap()).sum();
            assert_eq!(switch, 0, "a lossless switch drops nothing: {c}");
        }
    }

    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    for want in [
        "## Partition-aggregate, no background flows — MTU 1500, IPv4",
        "## Partition-aggregate, 2 background streams — MTU 1500, IPv4",
        "| answer | linux-bridge | sluice-l2-lossless | sluice-l2-stream |",
        "| 8 MTUs (12 kB) |",
        "| 64 MTUs (96 kB) |",
        "switch (by cause) · interfaces · TCP rtx",
    ] {
        assert!(report.contains(want), "{want:?} in {report}");
    }
    let csv = std::fs::read_to_string(out.join("results.csv")).unwrap();
    let lines: Vec<&str> = csv.lines().collect();
    let header: Vec<&str> = lines[0].split(',').collect();
    let qi = header.iter().position(|h| *h == "qct_mean_us").unwrap();
    for l in &lines[1..] {
        let v: Vec<&str> = l.split(',').collect();
        assert_eq!(v.len(), header.len(), "{l}");
        assert!(v[qi].parse::<f64>().unwrap() > 0.0, "{l}");
    }
    for bg in [0, 2] {
        assert_chart(&out.join(format!("charts/pa-mtu1500-ipv4-bg{bg}.png")), (900, 600));
    }
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn partition_aggregate_points_need_paths_with_six_guests() {
    let d = scratch("pa-bad");
    let f = study_file(
        &d,
        "name = \"x\"\nbaseline = \"direct\"\npaths = [\"direct\", \"linux-bridge\"]\nworkloads = [\"pa-8mtu\"]\n",
    );
    let o = Command::new(BIN).args(["study", "run", f.to_str().unwrap(), "--out"]).arg(d.join("o")).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(err.contains("s.toml:4:") && err.contains("path \"direct\" builds two"), "{err}");
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
#[ignore = "system tier: needs root (network namespaces, veths, bridges and BPF programs for the study's paths), ethtool; scripts/test.sh runs it"]
fn the_overlay_paths_build_two_hosts_joined_by_vxlan() {
    if !root() || !have("ethtool") {
        return;
    }
    init();
    let d = scratch("overlay");
    let f = study_file(
        &d,
        r#"name = "ov"
baseline = "overlay-kernel"
paths = ["overlay-kernel", "overlay-sluice", "overlay-sluice-kernel", "overlay-mixed"]
workloads = ["rr-200x1000", "pa-8mtu"]
reps = 1
duration = 1
queries = 100
"#,
    );
    let out = d.join("out");
    let err = run_study_ok(&f, &out);
    assert!(err.contains("[8/8]"), "{err}");
    let cs = cells(&out);
    assert_eq!(cs.len(), 8, "{cs:?}");
    for c in &cs {
        let r = &c["result"];
        assert!(r["client"]["transactions"].as_u64().unwrap() > 0, "{c}");
        assert_eq!(r["client"]["transactions"], r["server"]["transactions"], "{c}");
        // Partition-aggregate across hosts (seed 004's Fig. 7b): five workers behind the
        // second host, the drops read on both hosts' switches.
        if c["workload"] == "pa-8mtu" {
            assert_eq!(c["conns"], 5, "{c}");
            assert!(r["completion"]["queries"].as_u64().unwrap() > 0, "{c}");
            assert!(c["drops"]["interfaces"].is_u64(), "{c}");
        }
    }
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn unknown_paths_and_workloads_are_refused_by_name_and_line() {
    let d = scratch("bad");
    let good = "name = \"bad\"\nbaseline = \"direct\"\npaths = [\"direct\", \"linux-bridge\"]\nworkloads = [\"rr-200x1000\"]\n";
    for (body, want) in [
        (good.replace("\"linux-bridge\"]", "\"hub\"]"), "s.toml:3: unknown path \"hub\""),
        (good.replace("rr-200x1000", "rr-999"), "s.toml:4: unknown workload \"rr-999\""),
        (
            format!("{good}conditions = [\"quiet\", \"rings\"]\n"),
            "s.toml:5: condition \"rings\" applies to sluice-l2, sluice-l2-poll, sluice-l2-stream, sluice-kernel; none of this study's paths (direct, linux-bridge) takes it",
        ),
    ] {
        let f = study_file(&d, &body);
        let o =
            Command::new(BIN).args(["study", "run", f.to_str().unwrap(), "--out"]).arg(d.join("o")).output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success());
        assert!(err.contains(want), "{err}");
        assert!(!d.join("o").exists(), "nothing is made for a refused study");
    }
    let o = Command::new(BIN).args(["study", "run", "no-such-study"]).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("vswitch-vs-router"), "lists the built-ins: {err}");
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
#[ignore = "system tier: needs root (network namespaces, veths, bridges and BPF programs for the study's paths); scripts/test.sh runs it"]
fn an_interrupted_study_resumes_without_repeating_cells() {
    if !root() {
        return;
    }
    init();
    let d = scratch("resume");
    let f = study_file(
        &d,
        r#"name = "resume"
baseline = "direct"
paths = ["direct", "sluice-l2"]
workloads = ["rr-200x1000"]
conns = [1]
mtus = [1500]
reps = 3
duration = 2
"#,
    );
    let out = d.join("out");
    let child = spawn_study(&f, &out);
    let pid = child.id();
    let deadline = Instant::now() + Duration::from_secs(60);
    while cells(&out).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(!cells(&out).is_empty(), "a first cell finished");
    crate_kill(pid, libc::SIGINT);
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(130), "{err}");
    assert!(err.contains("sluice study resume"), "says how to resume: {err}");
    let first = cells(&out);
    assert!(!first.is_empty() && first.len() < 6, "{} cells", first.len());
    assert!(leftovers(pid).is_empty(), "left behind: {:?}", leftovers(pid));
    assert!(out.join("report.md").exists(), "the report of what finished");

    let o = Command::new(BIN).args(["study", "resume", out.to_str().unwrap()]).stdin(Stdio::null()).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let all = cells(&out);
    assert_eq!(all.len(), 6, "every cell once");
    assert_eq!(&all[..first.len()], &first[..], "finished cells kept as they were");
    assert!(all[first.len()..].iter().all(|c| c["run"] == 2), "the rest measured by run 2");
    let keys: std::collections::HashSet<String> =
        all.iter().map(|c| format!("{}/{}/{}", c["path"], c["rep"], c["conns"])).collect();
    assert_eq!(keys.len(), 6, "no cell repeated");
    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(report.contains("Run 2 (resumed)"), "{report}");
    let o = Command::new(BIN).args(["study", "resume", out.to_str().unwrap()]).output().unwrap();
    assert!(o.status.success());
    assert_eq!(cells(&out).len(), 6, "a finished study runs nothing more");
    let _ = std::fs::remove_dir_all(&d);
}

fn crate_kill(pid: u32, sig: i32) {
    // SAFETY: kill(2) on the child we started.
    unsafe { libc::kill(pid as libc::pid_t, sig) };
}

#[test]
#[ignore = "system tier: needs root (network namespaces, veths, bridges and BPF programs for the study's paths), Open vSwitch; scripts/test.sh runs it"]
fn the_ovs_path_runs_when_installed_and_is_skipped_with_the_reason_otherwise() {
    if !root() {
        return;
    }
    init();
    let d = scratch("ovs");
    let f = study_file(
        &d,
        r#"name = "ovs"
baseline = "direct"
paths = ["direct", "ovs"]
workloads = ["rr-200x1000"]
reps = 1
duration = 1
"#,
    );
    let out = d.join("out");
    let o = spawn_study(&f, &out).wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    if have("ovs-vswitchd") {
        let ovs: Vec<Value> = cells(&out).into_iter().filter(|c| c["path"] == "ovs").collect();
        assert_eq!(ovs.len(), 1, "{err}");
        let r = &ovs[0]["result"];
        assert_eq!(r["client"]["transactions"], r["server"]["transactions"], "{r}");
        assert!(r["cpu"]["switch_s"].as_f64().unwrap() > 0.0, "ovs-vswitchd's CPU is the switch column: {r}");
        assert!(report.contains("**ovs**"), "{report}");
    } else {
        assert!(err.contains("skipping ovs: Open vSwitch is not installed"), "{err}");
        assert!(report.contains("skipped `ovs`: Open vSwitch is not installed"), "{report}");
        assert_eq!(cells(&out).len(), 1, "the other path still ran");
    }
    let _ = std::fs::remove_dir_all(&d);
}

/// iperf3 and sockperf run as workloads beside `sluice bench` (issue 15: the study is the
/// one way to measure paths): their servers in the server namespace, their results in the
/// same table, sockperf only at one connection.
#[test]
#[ignore = "system tier: needs root (network namespaces, veths, bridges and BPF programs for the study's paths), iperf3 and sockperf; scripts/test.sh runs it"]
fn iperf3_and_sockperf_run_as_study_workloads() {
    if !root() || !have("iperf3") || !have("sockperf") {
        return;
    }
    init();
    let d = scratch("tools");
    let f = study_file(
        &d,
        r#"name = "tools"
baseline = "direct"
paths = ["direct", "sluice-l2"]
workloads = ["iperf3", "sockperf", "rr1c-200x200"]
conns = [1, 2]
mtus = [1500]
reps = 1
duration = 1
"#,
    );
    let out = d.join("out");
    let err = run_study_ok(&f, &out);
    // iperf3 and the profile at 1 and 2 connections, sockperf at 1: 5 cells per path.
    assert!(err.contains("[10/10]"), "{err}");
    let cells = cells(&out);
    for c in &cells {
        let r = &c["result"];
        let moved = r["client"]["bytes_sent"].as_u64().unwrap();
        assert!(moved > 0 && r["duration_s"].as_f64().unwrap() > 0.0, "{c}");
        if c["workload"] == "sockperf" {
            assert_eq!(c["conns"], 1, "{c}");
            assert!(r["latency"]["mean_us"].as_f64().unwrap() > 0.0, "round trips measured: {c}");
        }
    }
    assert!(cells.iter().any(|c| c["workload"] == "iperf3" && c["conns"] == 2));
    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(report.contains("## iperf3") && report.contains("## sockperf"), "{report}");
    let _ = std::fs::remove_dir_all(&d);
}

/// Real programs as study workloads (issue 16): nginx as Debian ships it under wrk, and
/// redis under redis-benchmark, on plain TCP and on the fast path (both ends under
/// `sluice smc run`), in one run.
#[test]
#[ignore = "system tier: needs root (network namespaces, veths, bridges and BPF programs for the study's paths), nginx, wrk and redis; scripts/test.sh runs it"]
fn nginx_and_redis_run_as_study_workloads_on_tcp_and_on_shared_memory() {
    if !root() || !have("nginx") || !have("wrk") || !have("redis-server") || !have("redis-benchmark") {
        return;
    }
    init();
    let d = scratch("real");
    let f = study_file(
        &d,
        r#"name = "real"
baseline = "loopback"
paths = ["smc", "loopback"]
workloads = ["nginx-1k", "redis-get"]
conns = [1]
mtus = [1500]
reps = 1
duration = 1
"#,
    );
    let out = d.join("out");
    let err = run_study_ok(&f, &out);
    assert!(err.contains("[4/4]") && !err.contains("FAILED"), "{err}");
    let cells = cells(&out);
    assert_eq!(cells.len(), 4);
    for c in &cells {
        let r = &c["result"];
        assert!(r["client"]["transactions"].as_u64().unwrap() > 0 && r["duration_s"].as_f64().unwrap() > 0.0, "{c}");
    }
    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(report.contains("## nginx-1k") && report.contains("## redis-get"), "{report}");
    let _ = std::fs::remove_dir_all(&d);
}

/// The lab name `paths.rs` gives the study's first path (index 0) in study process `pid`.
fn lab_of(pid: u32) -> String {
    let n = format!("{pid}0");
    format!("st{}", &n[n.len().saturating_sub(8)..])
}

/// A hostile study in small: one path, quiet and under `rings` (a VM-less vhost-user guest
/// abusing its rings on the path's switch), one short workload, `--quick`. Both cells are
/// measured with the host's noise, the attacked one with what its attackers did and what
/// the switch counted of it; the report has the condition's rows, the steal column and the
/// run's verdict; and nothing is left: namespaces, interfaces, ports, the sockets'
/// directory, processes.
#[test]
#[ignore = "system tier: needs root (network namespaces, veths, bridges and BPF programs for the study's paths); scripts/test.sh runs it"]
fn a_quick_hostile_study_measures_quiet_and_rings_and_leaves_nothing_behind() {
    if !root() {
        return;
    }
    init();
    let d = scratch("hostile");
    let f = study_file(
        &d,
        r#"name = "hostile-small"
baseline = "sluice-l2"
paths = ["sluice-l2"]
conditions = ["quiet", "rings"]
workloads = ["rr-200x1000"]
"#,
    );
    let out = d.join("out");
    // The study's temporary directories (the vhost-user sockets') go here, to be counted.
    let tmp = d.join("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    let child = Command::new(BIN)
        .args(["study", "run", f.to_str().unwrap(), "--quick", "--out", out.to_str().unwrap()])
        .env("TMPDIR", &tmp)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("[2/2]") && err.contains("sluice-l2 [rings]") && err.contains("steal "), "{err}");

    let cs = cells(&out);
    assert_eq!(cs.len(), 2, "{cs:?}");
    let quiet = cs.iter().find(|c| c["condition"] == "quiet").expect("a quiet cell");
    let rings = cs.iter().find(|c| c["condition"] == "rings").expect("a cell under rings");
    for c in [quiet, rings] {
        assert!(c["result"]["client"]["transactions"].as_u64().unwrap() > 0, "{c}");
        let n = &c["noise"];
        assert!(n["steal"].as_f64().is_some() && n["others"].as_f64().is_some(), "noise recorded: {c}");
    }
    assert!(quiet.get("attack").is_none(), "{quiet}");
    let a = &rings["attack"];
    assert!(a["sent"]["chains"].as_u64().unwrap_or(0) > 0, "the hostile guest offered chains: {a}");
    assert!(a["sent"]["resets"].as_u64().unwrap_or(0) > 0, "and reset its rings: {a}");
    assert!(a["sent"]["feeder_frames"].as_u64().unwrap_or(0) > 0, "the feeder sent: {a}");
    assert!(a["switch"]["rx:malformed"].as_u64().unwrap_or(0) > 0, "the switch refused chains: {a}");
    assert!(a.get("problems").is_none(), "everything stopped and was removed: {a}");

    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    for want in [
        "| **sluice-l2 [quiet]** (baseline) |",
        "| **sluice-l2 [rings]** |",
        "| *sluice-l2 [rings] / sluice-l2 [quiet]*: transactions/s |",
        "| steal · others' CPU |",
        "## Conditions",
        "| sluice-l2 | rings | 1 |",
        "A results page may claim a goal only from a QUIET run",
    ] {
        assert!(report.contains(want), "{want:?} in {report}");
    }
    assert!(report.contains("> **Run 1: QUIET**") || report.contains("> **Run 1: NOISY**"), "{report}");
    let csv = std::fs::read_to_string(out.join("results.csv")).unwrap();
    assert!(csv.lines().any(|l| l.contains(",rings,")), "{csv}");

    // Nothing left behind.
    assert!(leftovers(pid).is_empty(), "namespaces left: {:?}", leftovers(pid));
    let lab = lab_of(pid);
    let links = Command::new("ip").args(["-o", "link", "show"]).output().unwrap();
    let links = String::from_utf8_lossy(&links.stdout);
    assert!(!links.contains(&lab), "interfaces left: {links}");
    let dirs: Vec<_> = std::fs::read_dir(&tmp).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(dirs.is_empty(), "the study's temporary directories are gone: {dirs:?}");
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        let cmd = String::from_utf8_lossy(&cmd);
        assert!(!cmd.contains(&format!("labs/{lab}")) && !cmd.contains("sluice-study-rings"), "left running: {cmd}");
    }
    let _ = std::fs::remove_dir_all(&d);
}

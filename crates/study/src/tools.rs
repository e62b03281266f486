//! Cells run by a reference tool or a real program instead of `sluice bench` (workloads
//! `iperf3`, `sockperf`, `nginx-1k`, `nginx-10m`, `redis-get`, `redis-set`): the server
//! in the path's server namespace, the client in the client namespace — both under
//! `sluice smc run` on the `smc` path — the result read into the same [`RunResult`] the
//! report uses, with the CPU split measured around the run (guest time: the programs,
//! from the kernel's accounting of waited-for children).

use std::net::IpAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::error::Result;
use sluice_bench::result::{CpuSplit, Latency, RunResult, SideCounts};
use sluice_sys::bail;
use sluice_sys::error::Context;

use super::spec::Tool;
use sluice_lab::compared::Topology;

/// The ports the tools' servers listen on in the server namespace (their defaults).
const IPERF3_PORT: u16 = 5201;
const SOCKPERF_PORT: u16 = 11111;
/// sockperf's message size: the request-response studies' 200 bytes.
const SOCKPERF_MSG: u32 = 200;
const NGINX_PORT: u16 = 8088;
const REDIS_PORT: u16 = 6379;
/// redis-benchmark runs a count, not a time: this many requests per second of the cell.
const REDIS_PER_S: u32 = 10_000;

fn in_ns(ns: &str, argv: &[String]) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns]).args(argv).stdin(Stdio::null());
    c
}

/// Waits (at most 10 s) until something listens on TCP `port` in `ns`.
fn wait_listening(ns: &str, port: u16, server: &mut Child) -> Result<()> {
    let end = Instant::now() + Duration::from_secs(10);
    let filter = format!("sport = :{port}");
    while Instant::now() < end {
        let o = in_ns(ns, &["ss".into(), "-ltnH".into(), filter.clone()]).output()?;
        if !o.stdout.is_empty() {
            return Ok(());
        }
        if let Some(st) = server.try_wait()? {
            bail!("the server in {ns} exited ({st}) before it listened on port {port}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    bail!("nothing listened on port {port} in {ns} within 10 s")
}

/// An nginx configured as Debian ships it (master and `worker_processes auto`, workers as
/// `nobody`, `sendfile on`, `tcp_nopush on`, keep-alive), in a directory of its own with
/// the files the workloads fetch; removed when dropped. The directory is new (`mkdtemp`):
/// nginx runs as root from a configuration nobody else could have written or swapped.
struct Nginx {
    dir: sluice_sys::fs::TempDir,
}

impl Nginx {
    fn new(host: IpAddr) -> Result<Nginx> {
        use std::os::unix::fs::PermissionsExt;
        let tmp = sluice_sys::fs::TempDir::new("sluice-study-nginx").context("making nginx's directory")?;
        let dir = tmp.path().to_path_buf();
        let www = dir.join("www");
        std::fs::create_dir(&www).with_context(|| format!("creating {}", www.display()))?;
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        let mut bytes = |n: usize| -> Vec<u8> {
            (0..n)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    seed as u8
                })
                .collect()
        };
        std::fs::write(www.join("1k"), bytes(1024))?;
        std::fs::write(www.join("10m"), bytes(10 << 20))?;
        let host = match host {
            IpAddr::V6(a) => format!("[{a}]"),
            a => a.to_string(),
        };
        let d = dir.display();
        let conf = format!(
            "daemon off;\nworker_processes auto;\npid {d}/nginx.pid;\nerror_log {d}/error.log;\n\
             events {{ worker_connections 4096; }}\n\
             http {{\n sendfile on;\n tcp_nopush on;\n access_log off;\n\
             client_body_temp_path {d}/tmp;\n proxy_temp_path {d}/tmp;\n fastcgi_temp_path {d}/tmp;\n\
             uwsgi_temp_path {d}/tmp;\n scgi_temp_path {d}/tmp;\n\
             server {{ listen {host}:{NGINX_PORT}; root {d}/www; }}\n}}\n"
        );
        std::fs::write(dir.join("nginx.conf"), conf)?;
        // The workers run as `nobody`: they must reach the files (and may read, not write).
        for p in [&dir, &www, &www.join("1k"), &www.join("10m")] {
            let mode = if p.is_dir() { 0o755 } else { 0o644 };
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode))?;
        }
        Ok(Nginx { dir: tmp })
    }
}

/// Runs one cell of `tool` on `topo`: `conns` streams (iperf3), one connection (sockperf)
/// or `conns` connections (wrk against nginx, redis-benchmark against redis), for
/// `duration_s` (redis-benchmark: `REDIS_PER_S` requests per second of it), against `host`.
pub fn run(topo: &Topology, tool: Tool, host: IpAddr, conns: u32, duration_s: u32) -> Result<RunResult> {
    for (program, package) in tool.programs() {
        if !sluice_lab::compared::which(program) {
            bail!("workload {:?} needs {program} installed (apt-get install {package})", tool.name());
        }
    }
    if tool == Tool::Ping {
        bail!("ping runs inside VMs only (vmcell.rs)");
    }
    let need = tool.name();
    let d = duration_s.to_string();
    let h = host.to_string();
    let url_host = if host.is_ipv6() { format!("[{host}]") } else { h.clone() };
    let nginx = matches!(tool, Tool::Nginx1k | Tool::Nginx10m).then(|| Nginx::new(host)).transpose()?;
    let strings = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<String>>();
    let (port, server_argv, client_argv): (u16, Vec<String>, Vec<String>) = match tool {
        Tool::Iperf3 => (
            IPERF3_PORT,
            strings(&["iperf3", "-s", "-1", "-p", &IPERF3_PORT.to_string()]),
            strings(&["iperf3", "-c", &h, "-p", &IPERF3_PORT.to_string(), "-t", &d, "-P", &conns.to_string(), "-J"]),
        ),
        Tool::Sockperf => (
            SOCKPERF_PORT,
            strings(&["sockperf", "server", "--tcp", "-i", &h, "-p", &SOCKPERF_PORT.to_string()]),
            strings(&[
                "sockperf",
                "ping-pong",
                "--tcp",
                "-i",
                &h,
                "-p",
                &SOCKPERF_PORT.to_string(),
                "-m",
                &SOCKPERF_MSG.to_string(),
                "-t",
                &d,
                "--full-rtt",
            ]),
        ),
        Tool::Nginx1k | Tool::Nginx10m => {
            let conf =
                nginx.as_ref().map(|n| n.dir.path().join("nginx.conf").display().to_string()).unwrap_or_default();
            let file = if tool == Tool::Nginx1k { "1k" } else { "10m" };
            let threads = conns.clamp(1, 2).to_string();
            // wrk gives up on a request after 2 s and counts a timeout; 50 connections
            // fetching 10 MB each through a slow path can take longer without anything
            // being wrong, so the large file waits for as long as the run.
            let timeout = if tool == Tool::Nginx10m { duration_s.max(2) } else { 2 };
            (
                NGINX_PORT,
                strings(&["nginx", "-c", &conf]),
                strings(&[
                    "wrk",
                    "-t",
                    &threads,
                    "-c",
                    &conns.to_string(),
                    "-d",
                    &format!("{d}s"),
                    "--latency",
                    "--timeout",
                    &format!("{timeout}s"),
                    &format!("http://{url_host}:{NGINX_PORT}/{file}"),
                ]),
            )
        }
        Tool::RedisGet | Tool::RedisSet => (
            REDIS_PORT,
            strings(&[
                "redis-server",
                "--port",
                &REDIS_PORT.to_string(),
                "--bind",
                &h,
                "--protected-mode",
                "no",
                "--save",
                "",
                "--appendonly",
                "no",
            ]),
            strings(&[
                "redis-benchmark",
                "-h",
                &h,
                "-p",
                &REDIS_PORT.to_string(),
                "-t",
                if tool == Tool::RedisGet { "get" } else { "set" },
                "-c",
                &conns.to_string(),
                "-n",
                &(REDIS_PER_S * duration_s.max(1)).to_string(),
                "--csv",
            ]),
        ),
        Tool::Ping => unreachable!("refused above"),
    };
    // On the fast path both ends run under the launcher.
    let launch = |argv: Vec<String>| -> Result<Vec<String>> {
        if !topo.smc {
            return Ok(argv);
        }
        let exe = std::env::current_exe().context("finding the sluice executable")?;
        let mut v = vec![exe.display().to_string(), "smc".into(), "run".into(), "--".into()];
        v.extend(argv);
        Ok(v)
    };
    let mut server = in_ns(&topo.server_ns, &launch(server_argv)?)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("starting the {need} server in {}", topo.server_ns))?;
    struct Reap<'a>(&'a mut Child);
    impl Drop for Reap<'_> {
        fn drop(&mut self) {
            // SIGTERM first: nginx's master takes its workers with it.
            let _ = sluice_sys::kill(self.0.id(), libc::SIGTERM);
            let end = Instant::now() + Duration::from_secs(5);
            while Instant::now() < end && matches!(self.0.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let server = Reap(&mut server);
    wait_listening(&topo.server_ns, port, server.0)?;
    let cpu0 = sluice_bench::cpu::sample(&[], topo.switch_pid).context("reading CPU times")?;
    let children0 = sluice_sys::proc::children_cpu_seconds();
    // Bounded: the run's own length and a minute more.
    let mut argv = vec!["timeout".to_string(), (duration_s + 60).to_string()];
    argv.extend(launch(client_argv)?);
    let out = in_ns(&topo.client_ns, &argv).output().with_context(|| format!("running the {need} client"))?;
    drop(server); // (sockperf's, nginx's and redis's servers run until stopped; iperf3's has ended)
    drop(nginx);
    let cpu1 = sluice_bench::cpu::sample(&[], topo.switch_pid).context("reading CPU times")?;
    let guest_s = (sluice_sys::proc::children_cpu_seconds() - children0).max(0.0);
    let split = sluice_bench::cpu::split(&cpu0, &cpu1);
    let cpu = CpuSplit { guest_s, switch_s: split.switch_s, other_s: (split.other_s - guest_s).max(0.0) };
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        bail!("{need} failed ({}): {}{}", out.status, text.trim(), String::from_utf8_lossy(&out.stderr).trim());
    }
    let mut r = match tool {
        Tool::Iperf3 => iperf3_result(&text)?,
        Tool::Sockperf => sockperf_result(&text)?,
        Tool::Nginx1k | Tool::Nginx10m => wrk_result(&text)?,
        Tool::RedisGet | Tool::RedisSet => redis_result(&text, REDIS_PER_S * duration_s.max(1))?,
        Tool::Ping => unreachable!("refused above"),
    };
    r.profile = need.into();
    r.conns = if tool == Tool::Sockperf { 1 } else { conns };
    r.cpu = cpu;
    Ok(r)
}

/// A wrk duration or size with its unit ("350.00us", "1.20ms", "2.00s"; "335.36MB"), in
/// microseconds or bytes.
fn with_unit(s: &str) -> Option<f64> {
    let at = s.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
    let (n, unit) = s.split_at(at);
    let n: f64 = n.parse().ok()?;
    let mult = match unit {
        "us" => 1.0,
        "ms" => 1e3,
        "s" => 1e6,
        "m" => 60e6,
        "B" => 1.0,
        "KB" => 1024.0,
        "MB" => 1024.0 * 1024.0,
        "GB" => 1024.0 * 1024.0 * 1024.0,
        "TB" => 1024.0f64.powi(4),
        _ => return None,
    };
    Some(n * mult)
}

/// Reads wrk's report (with `--latency`): the requests completed, their time and bytes,
/// and the latency distribution. Responses that were not 2xx/3xx, or errors, fail the cell.
pub fn wrk_result(text: &str) -> Result<RunResult> {
    if let Some(l) = text.lines().find(|l| l.contains("Non-2xx or 3xx responses")) {
        bail!("wrk: {}", l.trim());
    }
    // "  278207 requests in 3.04s, 335.36MB read"
    let line = text.lines().find(|l| l.contains(" requests in ")).context("wrk printed no \"requests in\" line")?;
    let w: Vec<&str> = line.split_whitespace().collect();
    let requests: u64 = w.first().and_then(|n| n.parse().ok()).context("wrk's request count")?;
    let secs = w.get(3).map(|t| t.trim_end_matches(',')).and_then(with_unit).context("wrk's run time")? / 1e6;
    let bytes = w.get(4).and_then(|b| with_unit(b)).context("wrk's bytes read")? as u64;
    if let Some(l) = text.lines().find(|l| l.contains("Socket errors:"))
        && l.split(|c: char| !c.is_ascii_digit()).filter_map(|n| n.parse::<u64>().ok()).any(|n| n > 0)
    {
        bail!("wrk: {}", l.trim());
    }
    let pct = |p: &str| {
        text.lines().map(str::trim).find_map(|l| l.strip_prefix(p).map(str::trim)).and_then(with_unit).unwrap_or(0.0)
    };
    let mean = text
        .lines()
        .map(str::trim)
        .find_map(|l| l.strip_prefix("Latency").and_then(|r| r.split_whitespace().next()))
        .and_then(with_unit)
        .unwrap_or(0.0);
    let latency = Latency {
        mean_us: mean,
        p50_us: pct("50%"),
        p90_us: pct("90%"),
        p99_us: pct("99%"),
        p999_us: 0.0,
        max_us: 0.0,
    };
    let side = SideCounts { transactions: requests, bytes_sent: bytes, bytes_received: 0, connections: 0 };
    Ok(tool_result("wrk", secs.max(1e-9), side, latency))
}

/// Reads `redis-benchmark --csv`: requests/s and latencies (ms) of the one test run;
/// `requests` is the count it was given.
pub fn redis_result(text: &str, requests: u32) -> Result<RunResult> {
    // "GET","119047.62","0.221","0.064","0.207","0.311","0.447","1.287"
    let line = text
        .lines()
        .find(|l| l.starts_with("\"GET\"") || l.starts_with("\"SET\""))
        .context("redis-benchmark printed no GET or SET line")?;
    let f: Vec<f64> = line.split(',').skip(1).filter_map(|x| x.trim_matches('"').parse().ok()).collect();
    let [rps, avg, _min, p50, _p95, p99, max] = f[..] else {
        bail!("redis-benchmark's CSV line is not what it prints: {line}");
    };
    if rps <= 0.0 {
        bail!("redis-benchmark measured no requests: {line}");
    }
    let latency = Latency {
        mean_us: avg * 1e3,
        p50_us: p50 * 1e3,
        p90_us: 0.0,
        p99_us: p99 * 1e3,
        p999_us: 0.0,
        max_us: max * 1e3,
    };
    let side = SideCounts {
        transactions: u64::from(requests),
        bytes_sent: u64::from(requests) * 3,
        bytes_received: 0,
        connections: 0,
    };
    Ok(tool_result("redis-benchmark", f64::from(requests) / rps, side, latency))
}

/// A tool's result, as the report reads every cell: one side's counts stand for both (the
/// tool reports one side), one connection until the caller sets the cell's, CPU measured
/// around the run by the caller.
fn tool_result(profile: &str, duration_s: f64, side: SideCounts, latency: Latency) -> RunResult {
    RunResult {
        profile: profile.into(),
        conns: 1,
        duration_s,
        client: side,
        server: side,
        latency,
        flowops: Vec::new(),
        cpu: CpuSplit::default(),
        completion: None,
    }
}

/// Reads `iperf3 -J`: what the receiver got, over the receiver's seconds.
pub fn iperf3_result(json: &str) -> Result<RunResult> {
    let v: serde_json::Value = serde_json::from_str(json).context("reading iperf3's JSON")?;
    if let Some(e) = v["error"].as_str() {
        bail!("iperf3: {e}");
    }
    let recv = &v["end"]["sum_received"];
    let bytes = recv["bytes"].as_u64().context("iperf3's JSON has no end.sum_received.bytes")?;
    let secs = recv["seconds"].as_f64().filter(|s| *s > 0.0).context("iperf3's JSON has no receive time")?;
    // Counted in iperf3's 128 KiB writes, as `str-write128k` counts its writes (so the
    // report gives both in MB/s).
    let side =
        SideCounts { transactions: bytes.div_ceil(128 * 1024), bytes_sent: bytes, bytes_received: 0, connections: 0 };
    Ok(tool_result("iperf3", secs, side, Latency::default()))
}

/// Reads sockperf's ping-pong summary: the valid run time, the messages received (each a
/// round trip), the mean round trip (with `--full-rtt`) and its percentiles.
pub fn sockperf_result(text: &str) -> Result<RunResult> {
    let num_in = |text: &str, key: &str| -> Option<f64> {
        let at = text.find(key)? + key.len();
        let rest = text[at..].trim_start_matches([' ', '=']);
        let end = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
        rest[..end].parse().ok()
    };
    let num_after = |key: &str| num_in(text, key);
    // The warm-up is left out: the counts of the valid duration.
    let valid = &text[text.find("[Valid Duration]").context("sockperf printed no [Valid Duration] line")?..];
    let secs = num_in(valid, "RunTime=").filter(|s| *s > 0.0).context("sockperf printed no RunTime")?;
    let received = num_in(valid, "ReceivedMessages=").context("sockperf printed no ReceivedMessages")? as u64;
    let mean = num_after("avg-rtt=").or_else(|| num_after("avg-latency=")).context("sockperf printed no average")?;
    let pct = |p: &str| num_after(&format!("percentile {p} =")).unwrap_or(0.0);
    let latency = Latency {
        mean_us: mean,
        p50_us: pct("50.000"),
        p90_us: pct("90.000"),
        p99_us: pct("99.000"),
        p999_us: pct("99.900"),
        max_us: num_after("<MAX> observation =").unwrap_or(0.0),
    };
    let bytes = received * u64::from(SOCKPERF_MSG);
    let side = SideCounts { transactions: received, bytes_sent: bytes, bytes_received: bytes, connections: 1 };
    Ok(tool_result("sockperf", secs, side, latency))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[ignore = "system tier: needs root (a directory of another user) and nginx; scripts/test.sh runs it"]
    fn nginx_never_runs_from_a_directory_someone_planted_at_the_old_name() {
        use std::os::unix::fs::MetadataExt;
        assert!(
            sluice_sys::is_root(),
            "needs root (a directory of another user): run scripts/test.sh as root, or leave out --include-ignored"
        );
        // What a local user could make before the study ran: a directory of theirs at the
        // name the study once used, with a configuration in it.
        let old = std::env::temp_dir().join(format!("sluice-study-nginx-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&old);
        std::fs::create_dir(&old).unwrap();
        std::fs::write(old.join("nginx.conf"), "planted").unwrap();
        std::os::unix::fs::chown(&old, Some(65534), Some(65534)).unwrap();
        let n = Nginx::new("127.0.0.1".parse().unwrap());
        let planted = std::fs::read_to_string(old.join("nginx.conf")).ok();
        let owner = std::fs::symlink_metadata(&old).map(|m| m.uid()).ok();
        let _ = std::fs::remove_dir_all(&old);
        let n = n.unwrap();
        assert_ne!(n.dir.path(), old.as_path(), "nginx's directory is not at the old name");
        assert_eq!(planted.as_deref(), Some("planted"), "the planted directory was neither used nor touched");
        assert_eq!(owner, Some(65534));
        let m = std::fs::symlink_metadata(n.dir.path()).unwrap();
        assert!(m.is_dir() && m.uid() == 0 && m.mode() & 0o022 == 0, "nginx's directory is root's alone");
        let conf = std::fs::read_to_string(n.dir.path().join("nginx.conf")).unwrap();
        assert!(conf.contains(&format!("root {}/www;", n.dir.path().display())), "{conf}");
        let p = n.dir.path().to_path_buf();
        drop(n);
        assert!(!p.exists(), "removed when dropped");
    }

    #[test]
    fn sockperf_and_iperf3_outputs_are_read() {
        let sp = "sockperf: == version #3.7-no.git == \n\
sockperf: [Total Run] RunTime=10.000 sec; Warm up time=400 msec; SentMessages=469041; ReceivedMessages=469040\n\
sockperf: ========= Printing statistics for Server No: 0\n\
sockperf: [Valid Duration] RunTime=9.550 sec; SentMessages=448047; ReceivedMessages=448047\n\
sockperf: ====> avg-rtt=21.235 (std-dev=4.263)\n\
sockperf: # dropped messages = 0; # duplicated messages = 0; # out-of-order messages = 0\n\
sockperf: Summary: Round trip is 21.235 usec\n\
sockperf: ---> <MAX> observation =  302.583\n\
sockperf: ---> percentile 99.900 =   80.190\n\
sockperf: ---> percentile 99.000 =   38.004\n\
sockperf: ---> percentile 90.000 =   25.020\n\
sockperf: ---> percentile 50.000 =   20.101\n";
        let r = sockperf_result(sp).unwrap();
        // The total run's counts include the warm-up: the valid duration's are what count.
        assert_eq!(r.client.transactions, 448_047);
        assert!((r.duration_s - 9.55).abs() < 1e-9);
        assert!((r.latency.mean_us - 21.235).abs() < 1e-9);
        assert!((r.latency.p99_us - 38.004).abs() < 1e-9 && (r.latency.max_us - 302.583).abs() < 1e-9);
        let ip = r#"{"end": {"sum_received": {"bytes": 2500000000, "seconds": 10.0}}}"#;
        let r = iperf3_result(ip).unwrap();
        assert!((r.mb_per_s() - 250.0).abs() < 1e-9);
        assert!(iperf3_result(r#"{"error": "unable to connect"}"#).unwrap_err().to_string().contains("unable"));
    }

    #[test]
    fn wrk_and_redis_benchmark_outputs_are_read() {
        let wrk = "Running 3s test @ http://127.0.0.1:8088/1k\n  2 threads and 50 connections\n\
  Thread Stats   Avg      Stdev     Max   +/- Stdev\n    Latency   545.10us  300.00us   5.00ms   90.00%\n\
    Req/Sec    45.00k     2.00k   50.00k    70.00%\n  Latency Distribution\n     50%  500.00us\n\
     75%  600.00us\n     90%  800.00us\n     99%    1.50ms\n  278207 requests in 3.04s, 335.36MB read\n\
Requests/sec:  91420.49\nTransfer/sec:    110.35MB\n";
        let r = wrk_result(wrk).unwrap();
        assert_eq!(r.client.transactions, 278_207);
        assert!((r.duration_s - 3.04).abs() < 1e-9);
        assert_eq!(r.client.bytes_sent, (335.36 * 1024.0 * 1024.0) as u64);
        assert!((r.latency.mean_us - 545.1).abs() < 1e-6 && (r.latency.p99_us - 1500.0).abs() < 1e-6);
        let bad = wrk.replace("Requests/sec", "  Socket errors: connect 18, read 0, write 0, timeout 0\nRequests/sec");
        assert!(wrk_result(&bad).unwrap_err().to_string().contains("connect 18"));
        let csv = "\"test\",\"rps\",\"avg_latency_ms\",\"min_latency_ms\",\"p50_latency_ms\",\"p95_latency_ms\",\"p99_latency_ms\",\"max_latency_ms\"\n\
\"GET\",\"100000.00\",\"0.221\",\"0.064\",\"0.207\",\"0.311\",\"0.447\",\"1.287\"\n";
        let r = redis_result(csv, 200_000).unwrap();
        assert!((r.duration_s - 2.0).abs() < 1e-9);
        assert!((r.latency.p99_us - 447.0).abs() < 1e-6);
        assert_eq!(r.client.transactions, 200_000);
    }
}

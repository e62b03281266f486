//! Cells run by a reference tool instead of `sluice bench` (workloads `iperf3` and
//! `sockperf`): the tool's server in the path's server namespace, its client in the client
//! namespace, its result read into the same [`RunResult`] the report uses, with the CPU
//! split measured around the run (guest time: the tool processes, from the kernel's
//! accounting of waited-for children).

use std::net::IpAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use sluice_bench::result::{CpuSplit, Latency, RunResult, SideCounts};

use super::paths::Topology;
use super::spec::Tool;

/// The ports the tools' servers listen on in the server namespace (their defaults).
const IPERF3_PORT: u16 = 5201;
const SOCKPERF_PORT: u16 = 11111;
/// sockperf's message size: the request-response studies' 200 bytes.
const SOCKPERF_MSG: u32 = 200;

/// CPU seconds (user + system) of this process's waited-for children so far.
fn children_cpu_s() -> f64 {
    // SAFETY: getrusage fills the zeroed struct it is given.
    let mut r: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above; RUSAGE_CHILDREN takes no other argument.
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut r) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(r.ru_utime) + tv(r.ru_stime)
}

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

/// Runs one cell of `tool` on `topo`: `conns` streams (iperf3) or one connection
/// (sockperf), for `duration_s`, against `host`.
pub fn run(topo: &Topology, tool: Tool, host: IpAddr, conns: u32, duration_s: u32) -> Result<RunResult> {
    let need = tool.name();
    if !super::paths::which(need) {
        bail!("workload {need:?} needs {need} installed (apt-get install {need})");
    }
    let d = duration_s.to_string();
    let h = host.to_string();
    let (port, server_argv, client_argv): (u16, Vec<String>, Vec<String>) = match tool {
        Tool::Iperf3 => (
            IPERF3_PORT,
            ["iperf3", "-s", "-1", "-p", &IPERF3_PORT.to_string()].map(String::from).to_vec(),
            ["iperf3", "-c", &h, "-p", &IPERF3_PORT.to_string(), "-t", &d, "-P", &conns.to_string(), "-J"]
                .map(String::from)
                .to_vec(),
        ),
        Tool::Sockperf => (
            SOCKPERF_PORT,
            ["sockperf", "server", "--tcp", "-i", &h, "-p", &SOCKPERF_PORT.to_string()].map(String::from).to_vec(),
            [
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
            ]
            .map(String::from)
            .to_vec(),
        ),
    };
    let mut server = in_ns(&topo.server_ns, &server_argv)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("starting the {need} server in {}", topo.server_ns))?;
    struct Reap<'a>(&'a mut Child);
    impl Drop for Reap<'_> {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let server = Reap(&mut server);
    wait_listening(&topo.server_ns, port, server.0)?;
    let cpu0 = sluice_bench::cpu::sample(&[], topo.switch_pid).context("reading CPU times")?;
    let children0 = children_cpu_s();
    // Bounded: the run's own length and a minute more.
    let mut argv = vec!["timeout".to_string(), (duration_s + 60).to_string()];
    argv.extend(client_argv);
    let out = in_ns(&topo.client_ns, &argv).output().with_context(|| format!("running the {need} client"))?;
    drop(server); // (sockperf's server runs until killed; iperf3's has ended)
    let cpu1 = sluice_bench::cpu::sample(&[], topo.switch_pid).context("reading CPU times")?;
    let guest_s = (children_cpu_s() - children0).max(0.0);
    let split = sluice_bench::cpu::split(&cpu0, &cpu1);
    let cpu = CpuSplit { guest_s, switch_s: split.switch_s, other_s: (split.other_s - guest_s).max(0.0) };
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        bail!("{need} failed ({}): {}{}", out.status, text.trim(), String::from_utf8_lossy(&out.stderr).trim());
    }
    let mut r = match tool {
        Tool::Iperf3 => iperf3_result(&text)?,
        Tool::Sockperf => sockperf_result(&text)?,
    };
    r.conns = if tool == Tool::Sockperf { 1 } else { conns };
    r.cpu = cpu;
    Ok(r)
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
    Ok(RunResult {
        profile: "iperf3".into(),
        conns: 1,
        duration_s: secs,
        client: side,
        server: side,
        latency: Latency::default(),
        flowops: Vec::new(),
        cpu: CpuSplit::default(),
        completion: None,
    })
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
    Ok(RunResult {
        profile: "sockperf".into(),
        conns: 1,
        duration_s: secs,
        client: side,
        server: side,
        latency,
        flowops: Vec::new(),
        cpu: CpuSplit::default(),
        completion: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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
}

//! Partition-aggregate (zOVN, seed 004): one aggregator sends a query to each of N workers,
//! each answers with S bytes, and a query completes when every answer has arrived. The
//! figure of merit is the query completion time.
//!
//! Each worker is an ordinary `sluice bench serve`: the aggregator asks each for a
//! request-response run (query bytes in, S bytes out) and then drives all N data
//! connections in lock-step from one thread: write the query to every worker, then read
//! every answer. Both ends count as in any run, so counts stay exact.

use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use crate::client::{BenchError, Session};
use crate::profile::parse;
use crate::result::{Completion, RunResult, SideCounts};
use crate::server::{read_n, write_n};

/// How to run a partition-aggregate workload.
#[derive(Clone, Debug)]
pub struct PaOptions {
    /// The workers' control addresses (host:port), one `sluice bench serve` each.
    pub workers: Vec<String>,
    /// Query size in bytes.
    pub query: u64,
    /// Answer size in bytes (each worker).
    pub response: u64,
    /// How long to keep querying.
    pub duration: Duration,
    /// Processes whose CPU counts as guest besides this one.
    pub guest_pids: Vec<u32>,
    /// The switch daemon on the path.
    pub switch_pid: Option<u32>,
    /// Background streaming flows from the workers (spread over them) into the
    /// aggregator, running for the whole duration: they compete with the answers for the
    /// aggregator's link, as seed 004's long flows do. Their 64 KiB writes count as
    /// transactions too.
    pub background: u32,
    /// Stop after this many queries (if the duration has not ended first).
    pub queries: Option<u64>,
}

/// Size of one background write.
const BACKGROUND_WRITE: u64 = 64 * 1024;

fn worker_profile(query: u64, response: u64, duration: Duration, background: u32) -> String {
    let bg = if background > 0 {
        format!(
            r#"
  <group nthreads="{background}">
    <transaction iterations="1"><flowop type="connect" options="remotehost=worker protocol=tcp"/></transaction>
    <transaction duration="{}ms"><flowop type="read" options="size={BACKGROUND_WRITE}"/></transaction>
    <transaction iterations="1"><flowop type="disconnect"/></transaction>
  </group>"#,
            duration.as_millis()
        )
    } else {
        String::new()
    };
    format!(
        r#"<?xml version="1.0"?>
<profile name="pa-worker">
  <group nthreads="1">
    <transaction iterations="1"><flowop type="connect" options="remotehost=worker protocol=tcp tcp_nodelay"/></transaction>
    <transaction duration="{}ms"><flowop type="write" options="size={query}"/><flowop type="read" options="size={response}"/></transaction>
    <transaction iterations="1"><flowop type="disconnect"/></transaction>
  </group>{bg}
</profile>"#,
        duration.as_millis()
    )
}

struct Worker {
    srv: Session,
    data: TcpStream,
    /// The worker's background sink, when it has background flows.
    background: Option<SocketAddr>,
}

fn io_err(what: &str) -> impl FnOnce(std::io::Error) -> BenchError + '_ {
    move |source| BenchError::Io { what: what.to_string(), cause: source }
}

fn open_worker(addr: &str, profile_xml: &str, groups: usize) -> Result<Worker, BenchError> {
    let sa: SocketAddr = crate::client::resolve(addr)?;
    let mut srv = Session::open(sa)?;
    let ports = srv.start(profile_xml, groups)?;
    let data = TcpStream::connect_timeout(&SocketAddr::new(sa.ip(), ports[0]), Duration::from_secs(5))
        .map_err(|source| BenchError::Connect { addr: format!("{}:{}", sa.ip(), ports[0]), cause: source })?;
    data.set_nodelay(true).map_err(io_err("setting TCP_NODELAY"))?;
    Ok(Worker { srv, data, background: ports.get(1).map(|&p| SocketAddr::new(sa.ip(), p)) })
}

/// Runs the workload and returns its result, with `completion` filled.
pub fn run_pa(o: &PaOptions) -> Result<RunResult, BenchError> {
    if o.workers.is_empty() {
        return Err(BenchError::Profile("partition-aggregate needs at least one worker (--workers HOST,HOST…)".into()));
    }
    let n = o.workers.len() as u32;
    let share = |i: usize| o.background / n + u32::from((i as u32) < o.background % n);
    let mut workers = Vec::with_capacity(o.workers.len());
    for (i, w) in o.workers.iter().enumerate() {
        let xml = worker_profile(o.query, o.response, o.duration, share(i));
        // Checked here so a bad size is reported once, clearly.
        parse(&xml, "pa", &|_| None).map_err(|e| BenchError::Profile(e.to_string()))?;
        // A worker that sinks background flows has a second group.
        workers.push(open_worker(w, &xml, if share(i) > 0 { 2 } else { 1 })?);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let mut flows = Vec::new();
    for (i, w) in workers.iter().enumerate() {
        for _ in 0..share(i) {
            let addr = w.background.ok_or_else(|| BenchError::Server("a worker opened no background sink".into()))?;
            let s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
                .map_err(|source| BenchError::Connect { addr: addr.to_string(), cause: source })?;
            let stop = stop.clone();
            flows.push(std::thread::spawn(move || background_flow(s, &stop)));
        }
    }

    let mut guests = vec![std::process::id()];
    guests.extend(o.guest_pids.iter().copied());
    guests.extend(workers.iter().filter(|w| w.srv.same_host).map(|w| w.srv.pid));
    guests.sort_unstable();
    guests.dedup();
    let cpu0 = crate::cpu::sample(&guests, o.switch_pid).ok();

    let out = crate::buf::IoBuf::filled(256 * 1024, 0x3c);
    let out = out.as_slice();
    let mut inp = crate::buf::IoBuf::new(256 * 1024);
    let inp = inp.as_mut_slice();
    let mut hist = Histogram::<u64>::new_with_bounds(1, 3_600_000_000_000, 3)
        .map_err(|e| BenchError::Profile(format!("histogram: {e}")))?;
    let mut client = SideCounts { connections: workers.len() as u64, ..SideCounts::default() };
    let mut queries = 0u64;
    let start = Instant::now();
    while start.elapsed() < o.duration && o.queries.is_none_or(|n| queries < n) {
        let t0 = Instant::now();
        for w in workers.iter_mut() {
            write_n(&mut w.data, out, o.query).map_err(io_err("sending a query"))?;
        }
        for w in workers.iter_mut() {
            let got = read_n(&mut w.data, inp, o.response).map_err(io_err("reading an answer"))?;
            if got < o.response {
                return Err(BenchError::Io {
                    what: "reading an answer".into(),
                    cause: std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "a worker closed mid-answer"),
                });
            }
        }
        let _ = hist.record((t0.elapsed().as_nanos() as u64).max(1));
        queries += 1;
    }
    stop.store(true, Ordering::Relaxed);
    let n = workers.len() as u64;
    client.transactions = queries * n;
    client.bytes_sent = queries * n * o.query;
    client.bytes_received = queries * n * o.response;
    for f in flows {
        let (t, b) = f
            .join()
            .map_err(|_| BenchError::Profile("a background flow panicked".into()))?
            .map_err(io_err("a background flow"))?;
        client.transactions += t;
        client.bytes_received += b;
        client.connections += 1;
    }
    for w in workers.iter_mut() {
        w.data.shutdown(std::net::Shutdown::Write).map_err(io_err("half-closing a data connection"))?;
    }
    let duration_s = start.elapsed().as_secs_f64();
    let cpu1 = crate::cpu::sample(&guests, o.switch_pid).ok();

    let mut server = SideCounts::default();
    let mut remote_cpu = 0.0;
    for w in workers.iter_mut() {
        let (counts, cpu_s) = w.srv.finish()?;
        server.transactions += counts.transactions;
        server.bytes_sent += counts.bytes_sent;
        server.bytes_received += counts.bytes_received;
        server.connections += counts.connections;
        if !w.srv.same_host {
            remote_cpu += cpu_s;
        }
    }
    let mut cpu = match (cpu0, cpu1) {
        (Some(a), Some(b)) => crate::cpu::split(&a, &b),
        _ => Default::default(),
    };
    cpu.guest_s += remote_cpu;
    let latency = crate::report::latency_from_histogram(&hist);
    Ok(RunResult {
        profile: "pa".into(),
        conns: workers.len() as u32,
        duration_s,
        client,
        server,
        latency,
        flowops: vec![],
        cpu,
        completion: Some(Completion {
            queries,
            mean_us: latency.mean_us,
            p50_us: latency.p50_us,
            p99_us: latency.p99_us,
        }),
    })
}

/// Reads a worker's stream in 64 KiB reads; once the queries are done (`stop`) tells the
/// worker to end it (a half-close: the worker stops at its next write) and reads on to
/// its end, so every byte written is read and both ends count alike. Returns (whole
/// reads, bytes).
fn background_flow(mut s: TcpStream, stop: &AtomicBool) -> std::io::Result<(u64, u64)> {
    let mut buf = crate::buf::IoBuf::new(BACKGROUND_WRITE as usize);
    let buf = buf.as_mut_slice();
    let (mut reads, mut bytes) = (0u64, 0u64);
    // Bounded: a worker that neither writes nor closes for this long is given up on.
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut told = false;
    loop {
        if !told && stop.load(Ordering::Relaxed) {
            s.shutdown(std::net::Shutdown::Write)?;
            told = true;
        }
        let got = read_n(&mut s, buf, BACKGROUND_WRITE)?;
        bytes += got;
        if got < BACKGROUND_WRITE {
            break;
        }
        reads += 1;
    }
    Ok((reads, bytes))
}

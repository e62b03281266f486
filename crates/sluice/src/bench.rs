//! `sluice bench`: the workload modeler's command line (the engine is `sluice-bench`).

use std::io::IsTerminal;
use std::net::{IpAddr, TcpListener};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use sluice_bench::client::{RunOptions, run};
use sluice_bench::control::DEFAULT_PORT;
use sluice_bench::profile::{Profile, parse, parse_duration};
use sluice_bench::report::{self, Per};
use sluice_bench::{builtin, host_port, server};

use sluice_api::client::{Client, Target};
use sluice_api::proto::{Request, SwitchSummary};

/// `sluice bench …`
#[derive(Debug, clap::Subcommand)]
pub enum BenchCmd {
    /// Serve bench clients, one run after another, until stopped.
    ///
    /// Anyone who reaches the port may run a workload (there is no authentication); what a
    /// client can make the server do is bounded, and it answers no other address than the
    /// client's (docs/architecture.md, "The workload modeler's server"). On a host with
    /// other networks, listen on the lab's address with --listen.
    Serve {
        /// Address to listen on [default: :: (IPv6 and IPv4), or 0.0.0.0 on a host
        /// without IPv6].
        #[arg(long)]
        listen: Option<IpAddr>,
        /// Control port (0: one the kernel picks; the first line on stderr names it).
        #[arg(long, default_value_t = DEFAULT_PORT)]
        port: u16,
    },
    /// Run a workload against a `sluice bench serve` and report transactions/s, MB/s, latency
    /// percentiles and CPU per transaction.
    ///
    /// Examples:
    ///   sluice bench run --to 10.77.0.2 -m rr1c-200x1000 --conns 1,10,50
    ///   sluice bench run --to 10.77.0.2 -m ./profile.xml --duration 30 -a -i 5
    ///   sluice bench run --to 10.77.0.2 -m str-readx30k --json > run.json
    #[command(verbatim_doc_comment)]
    Run(Box<RunArgs>),
    /// List the built-in profiles, or print one as profile.xml.
    Profiles {
        /// Print this profile's XML.
        #[arg(long)]
        show: Option<String>,
    },
}

/// Arguments of `sluice bench run`.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// The server: HOST or HOST:PORT (default port 20000). Replaces every connect's
    /// remotehost.
    #[arg(long, value_name = "HOST")]
    pub to: Option<String>,
    /// A profile.xml file, or a built-in profile's name (`sluice bench profiles`).
    #[arg(short = 'm', long = "profile", value_name = "PROFILE")]
    pub profile: String,
    /// Replaces every timed transaction's duration (seconds, or with a unit: 500ms, 2min).
    #[arg(long, value_name = "SECONDS")]
    pub duration: Option<String>,
    /// Connections: replaces the groups' thread counts; a list runs the series.
    #[arg(long, value_name = "N[,N…]", value_delimiter = ',')]
    pub conns: Vec<u32>,
    /// Per-flowop averages (uperf's -a).
    #[arg(short = 'a', long)]
    pub all_stats: bool,
    /// Print an interval line every SECONDS.
    #[arg(short = 'i', long, value_name = "SECONDS")]
    pub interval: Option<f64>,
    /// Print JSON (schema: docs/bench-json.md).
    #[arg(long, conflicts_with = "csv")]
    pub json: bool,
    /// Print CSV.
    #[arg(long)]
    pub csv: bool,
    /// The sluice switch on the path, for the switch CPU column (default: the only running
    /// switch, if there is exactly one).
    #[arg(long, value_name = "NAME")]
    pub switch: Option<String>,
    /// `-m pa`: the workers, each a `sluice bench serve` (HOST or HOST:PORT); the study uses 5.
    #[arg(long, value_name = "HOST,…", value_delimiter = ',')]
    pub workers: Vec<String>,
    /// `-m pa`: bytes each worker answers: a size (3000, 64k) or N MTUs of 1500 bytes
    /// (`2mtu`, the default; the study sweeps 2 to 2048).
    #[arg(long, default_value = "2mtu")]
    pub response: String,
    /// `-m pa`: bytes of each query.
    #[arg(long, default_value = "64")]
    pub query: String,
    /// `-m pa`: background streaming flows from the workers into the aggregator (this
    /// program's guest) for the whole run, competing with the answers (long flows sharing
    /// the aggregator's link).
    #[arg(long, default_value_t = 0)]
    pub background: u32,
    /// `-m pa`: stop after this many queries (or at --duration, whichever comes first).
    #[arg(long, value_name = "N")]
    pub queries: Option<u64>,
}

/// Makes SIGINT and SIGTERM end the process with `exit`, as iperf3's and uperf's servers
/// end: the C library's exit handlers run, so a server under `sluice smc run` takes its
/// fast-path registry entries with it (the default action of SIGTERM would leave them for
/// the next `smc run` to sweep).
fn exit_cleanly_on_signals() {
    // (Before the server starts its threads: they inherit the blocked mask, so only the
    // waiter receives the signals; threads of a preload library block them on their own.)
    let _ = sluice_sys::on_stop_signal(|sig| {
        eprintln!("sluice bench server: stopped by signal {sig}");
        std::process::exit(128 + sig);
    });
}

/// Runs `sluice bench …`.
pub fn run_cmd(cmd: BenchCmd) -> Result<()> {
    match cmd {
        BenchCmd::Serve { listen, port } => {
            let listen = listen.unwrap_or_else(|| {
                // A dual-stack socket serves IPv4 clients too (as IPv4-mapped addresses).
                let any6 = IpAddr::from(std::net::Ipv6Addr::UNSPECIFIED);
                if TcpListener::bind((any6, 0)).is_ok() { any6 } else { IpAddr::from(std::net::Ipv4Addr::UNSPECIFIED) }
            });
            let at = std::net::SocketAddr::from((listen, port));
            let l = TcpListener::bind(at)
                .with_context(|| format!("cannot listen on {at} (is another server running there?)"))?;
            let at = l.local_addr().unwrap_or(at);
            eprintln!("sluice bench server listening on {at}; Ctrl-C stops it");
            exit_cleanly_on_signals();
            server::serve(l, Arc::new(|line: String| tracing::info!("{line}")))?;
            Ok(())
        }
        BenchCmd::Profiles { show: Some(name) } => {
            let text = builtin::get(&name)
                .with_context(|| format!("no built-in profile {name:?}; built-ins: {}", builtin::names()))?;
            print!("{text}");
            Ok(())
        }
        BenchCmd::Profiles { show: None } => {
            for (name, what, _) in builtin::BUILTINS {
                println!("{name:16} {what}");
            }
            println!(
                "{:16} partition-aggregate: a query to each of --workers, each answers --response bytes; query completion times",
                "pa"
            );
            Ok(())
        }
        BenchCmd::Run(a) => bench_run(*a),
    }
}

/// Loads `-m`: a file if one exists by that name, else a built-in.
pub fn load_profile(m: &str, to_host: Option<&str>) -> Result<Profile> {
    let env = |v: &str| std::env::var(v).ok();
    if Path::new(m).exists() {
        let text = std::fs::read_to_string(m).with_context(|| format!("reading {m}"))?;
        let p = parse(&text, m, &env)?;
        for w in &p.warnings {
            eprintln!("sluice: warning: {w}");
        }
        return Ok(p);
    }
    let Some(text) = builtin::get(m) else {
        bail!("no profile file {m:?} and no built-in profile of that name; built-ins: {}", builtin::names());
    };
    Ok(builtin::profile(m, text, to_host.unwrap_or("127.0.0.1"))?)
}

fn split_host_port(to: &str) -> (String, u16) {
    if let Some((h, p)) = to.rsplit_once(':')
        && !h.contains(':')
        && let Ok(p) = p.parse()
    {
        return (h.to_string(), p);
    }
    if let Some(rest) = to.strip_prefix('[')
        && let Some((h, p)) = rest.split_once("]:")
        && let Ok(p) = p.parse()
    {
        return (h.to_string(), p);
    }
    (to.trim_matches(['[', ']']).to_string(), DEFAULT_PORT)
}

/// Reads `--duration`.
fn duration_arg(d: Option<&str>) -> Result<Option<Duration>> {
    d.map(|d| {
        parse_duration(d).with_context(|| format!("--duration {d:?}: use seconds, or a number with ms, s, min or h"))
    })
    .transpose()
}

fn switch_pid(name: Option<&str>) -> Option<u32> {
    let target = Target { switch: name.map(String::from), socket: None };
    let mut c = Client::for_target(&target).ok()?;
    c.call::<SwitchSummary>(&Request::Hello).ok().map(|s| s.pid)
}

fn size_arg(s: &str, what: &str) -> Result<u64> {
    if let Some(n) = s.strip_suffix("mtu").or_else(|| s.strip_suffix("MTU")) {
        let n: u64 = n.parse().with_context(|| format!("{what} {s:?}: use a size or N mtu"))?;
        return Ok(n * 1500);
    }
    match sluice_bench::profile::parse_size(s) {
        Some(sluice_bench::profile::Size::Fixed(n)) if n > 0 => Ok(n),
        _ => bail!("{what} {s:?}: use a byte count with an optional k, m or g suffix, or N mtu"),
    }
}

fn bench_pa(a: &RunArgs) -> Result<()> {
    if a.workers.is_empty() {
        bail!("-m pa needs its workers: --workers HOST,HOST,… (each running `sluice bench serve`; the study uses 5)");
    }
    let duration = duration_arg(a.duration.as_deref())?.unwrap_or(Duration::from_secs(20));
    let workers = a
        .workers
        .iter()
        .map(|w| {
            let (h, p) = split_host_port(w);
            host_port(&h, p)
        })
        .collect();
    let switch = switch_pid(a.switch.as_deref());
    let o = sluice_bench::pa::PaOptions {
        workers,
        query: size_arg(&a.query, "--query")?,
        response: size_arg(&a.response, "--response")?,
        duration,
        guest_pids: vec![],
        switch_pid: switch,
        background: a.background,
        queries: a.queries,
    };
    let r = sluice_bench::pa::run_pa(&o)?;
    let results = [r];
    sluice_sys::default_sigpipe();
    if a.json {
        println!("{}", report::render_json(&results));
    } else if a.csv {
        print!("{}", report::render_csv(&results));
    } else {
        print!("{}", report::render_table(&results, Per::Transaction));
    }
    Ok(())
}

fn bench_run(a: RunArgs) -> Result<()> {
    if a.profile == "pa" && !Path::new("pa").exists() {
        return bench_pa(&a);
    }
    let (host, port) = a.to.as_deref().map(split_host_port).unzip();
    let mut profile = load_profile(&a.profile, host.as_deref())?;
    let host = match host {
        Some(h) => h,
        None => first_remotehost(&profile)
            .context("the profile names no remotehost; say where the server is with --to HOST")?,
    };
    profile.set_remotehost(&host);
    if let Some(d) = duration_arg(a.duration.as_deref())? {
        profile.set_duration(d);
    }
    let server = host_port(&host, port.unwrap_or(DEFAULT_PORT));
    let switch = switch_pid(a.switch.as_deref());
    if a.switch.is_some() && switch.is_none() {
        bail!("switch {:?} is not running (or its socket does not answer)", a.switch.as_deref().unwrap_or_default());
    }
    // Without --conns the profile's own thread counts stand.
    let series: Vec<Option<u32>> =
        if a.conns.is_empty() { vec![None] } else { a.conns.iter().map(|&n| Some(n)).collect() };
    let interactive = std::io::stderr().is_terminal() && !a.json && !a.csv;
    let mut results = Vec::new();
    for n in series {
        if let Some(n) = n {
            if n == 0 {
                bail!("--conns must be at least 1");
            }
            profile.set_conns(n);
        }
        if interactive {
            eprintln!("running {} with {} connection(s) against {server}…", profile.name, profile.conns());
        }
        let opts = RunOptions {
            server: server.clone(),
            guest_pids: vec![],
            switch_pid: switch,
            interval: match a.interval {
                Some(_) => interval_printer(a.interval),
                None if interactive => progress_bar(&profile),
                None => None,
            },
        };
        let r = run(&profile, &opts);
        if interactive && a.interval.is_none() {
            eprint!("\r\x1b[K");
        }
        let mut r = r?;
        if !a.all_stats {
            r.flowops.clear();
        }
        results.push(r);
    }
    sluice_sys::default_sigpipe();
    if a.json {
        println!("{}", report::render_json(&results));
    } else if a.csv {
        print!("{}", report::render_csv(&results));
    } else {
        let bytes: u64 = results.iter().map(|r| r.client.bytes_sent + r.client.bytes_received).sum();
        let tx: u64 = results.iter().map(|r| r.client.transactions).sum();
        let per = Per::for_volume(tx, bytes);
        print!("{}", report::render_table(&results, per));
        if switch.is_none() {
            println!("(no sluice switch found on this host: the switch CPU column is 0; name one with --switch)");
        }
    }
    Ok(())
}

/// A one-line progress bar on stderr (terminals only), against the longest group's timed
/// transactions.
fn progress_bar(p: &Profile) -> Option<(Duration, sluice_bench::client::IntervalFn)> {
    use sluice_bench::profile::Repeat;
    let total = p
        .groups
        .iter()
        .map(|g| {
            g.transactions
                .iter()
                .filter_map(|t| if let Repeat::Duration(d) = t.repeat { Some(d.as_secs_f64()) } else { None })
                .sum::<f64>()
        })
        .fold(0.0, f64::max);
    if total < 2.0 {
        return None;
    }
    let f: sluice_bench::client::IntervalFn = Arc::new(move |t: f64, tx: u64, _bytes: u64| {
        let done = (t / total).clamp(0.0, 1.0);
        let filled = (done * 30.0) as usize;
        eprint!(
            "\r  [{}{}] {:>5.1}/{:.0} s  {:>10.0} tx/s",
            "#".repeat(filled),
            "-".repeat(30 - filled),
            t.min(total),
            total,
            tx as f64 / t.max(1e-9)
        );
    });
    Some((Duration::from_millis(500), f))
}

/// Prints an interval line every `secs` seconds of a run (state is per run).
fn interval_printer(secs: Option<f64>) -> Option<(Duration, sluice_bench::client::IntervalFn)> {
    let secs = secs?;
    let last = std::sync::Mutex::new((0.0f64, 0u64, 0u64));
    let f: sluice_bench::client::IntervalFn = Arc::new(move |t: f64, tx: u64, bytes: u64| {
        let mut l = last.lock().unwrap_or_else(|p| p.into_inner());
        let dt = (t - l.0).max(1e-9);
        let (dtx, db) = (tx.saturating_sub(l.1), bytes.saturating_sub(l.2));
        eprintln!("{}", report::interval_line(t, dtx as f64 / dt, db as f64 / dt / 1e6, None));
        *l = (t, tx, bytes);
    });
    Some((Duration::from_secs_f64(secs.max(0.1)), f))
}

fn first_remotehost(p: &Profile) -> Option<String> {
    p.groups.iter().flat_map(|g| &g.transactions).flat_map(|t| &t.flowops).find_map(|f| f.conn.remotehost.clone())
}

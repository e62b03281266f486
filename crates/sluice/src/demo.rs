//! `sluice demo`: a lab of two guests (on the kernel datapath when it is available), ping
//! (IPv4 and IPv6), a TCP transfer and a short
//! `sluice bench` request-response run between them through the switch, the same run with
//! both ends under `sluice smc run` (shared memory), then the switch's counters. Needs
//! nothing but sluice and iproute2: the pings and the transfer run on threads that enter
//! the guests' namespaces, the shared-memory run in processes started there.

use std::io::{Read, Write};
use std::mem::MaybeUninit;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use socket2::{Domain, Protocol, SockAddr, Socket, Type};

use sluice_api::client::Client;
use sluice_api::proto::{Request, StatsReport};
use sluice_lab::guests::{self as lab, UpArgs};
use sluice_sys::netns;

/// Arguments of `sluice demo`.
#[derive(Debug, clap::Args)]
pub struct DemoArgs {
    /// Megabytes to send through the switch.
    #[arg(long, default_value_t = 1000)]
    pub megabytes: u64,
    /// MTU of the lab, 68 to 9000.
    #[arg(long, default_value_t = 1500, value_parser = sluice_api::config::mtu_arg)]
    pub mtu: u16,
    /// Leave the lab running afterwards (remove it with `sluice lab down --name demo`).
    #[arg(long)]
    pub keep: bool,
    /// Name of the demo's lab.
    #[arg(long, default_value = "demo")]
    pub name: String,
}

/// Runs the demo.
pub fn run(a: DemoArgs) -> Result<()> {
    if !sluice_sys::is_root() {
        bail!("`sluice demo` needs root: it builds a lab of network namespaces and interfaces; run it with sudo");
    }
    let name = a.name.as_str();
    if lab::LabState::load(name).is_ok() {
        println!("removing the previous demo lab");
        lab::down(name)?;
    }
    println!("== building a lab: a switch and two guests (network namespaces)");
    let s = lab::up(&UpArgs::two_guests(name, a.mtu))?;
    print!("{}", lab::render(&s));
    if s.datapath == "kernel" {
        println!(
            "the guests are attached by veth pairs; TC programs forward between them in the kernel, executing what the switch's core decided (frames it cannot decide go up to the core)"
        );
    } else {
        println!("the guests are attached by TAP devices; one user-space thread forwards every frame");
    }
    let result = show(&s, &a);
    if a.keep {
        println!(
            "\nthe lab stays up: try `sluice lab exec g1 -- ping 10.77.0.2`, `sluice stats`; remove it with `sluice lab down --name {name}`"
        );
    } else {
        lab::down(name)?;
        println!("\nlab removed");
    }
    result
}

fn show(s: &lab::LabState, a: &DemoArgs) -> Result<()> {
    let g1 = s.guest("g1")?.clone();
    let g2 = s.guest("g2")?.clone();
    let ip4: IpAddr = g2.ipv4.split('/').next().unwrap_or_default().parse()?;
    let ip6: IpAddr = g2.ipv6.split('/').next().unwrap_or_default().parse()?;

    println!("\n== ping from g1 to g2");
    for dst in [ip4, ip6] {
        let rtts = netns::run_in(Some(&g1.netns), move || ping(dst, 3))?;
        let shown: Vec<String> = rtts.iter().map(|d| format!("{:.0} µs", d.as_secs_f64() * 1e6)).collect();
        println!("  {dst}: 3 echoes answered, round trips {}", shown.join(", "));
    }

    println!("\n== TCP transfer g1 → g2: {} MB", a.megabytes);
    let total = a.megabytes * 1_000_000;
    let listener = netns::run_in(Some(&g2.netns), move || TcpListener::bind(SocketAddr::new(ip4, 7777)))?;
    let receiver = std::thread::spawn(move || -> std::io::Result<(u64, bool)> {
        let (mut c, _) = listener.accept()?;
        let mut buf = vec![0u8; 1 << 20];
        let expected = pattern_block();
        let (mut got, mut intact) = (0u64, true);
        loop {
            let n = c.read(&mut buf)?;
            if n == 0 {
                break;
            }
            let off = (got % 251) as usize;
            intact &= buf[..n] == expected[off..off + n];
            got += n as u64;
        }
        Ok((got, intact))
    });
    let start = Instant::now();
    netns::run_in(Some(&g1.netns), move || {
        let mut c = TcpStream::connect_timeout(&SocketAddr::new(ip4, 7777), Duration::from_secs(5))?;
        let chunk = pattern_block();
        let mut sent = 0u64;
        while sent < total {
            let off = (sent % 251) as usize;
            let n = ((total - sent) as usize).min(1 << 20);
            c.write_all(&chunk[off..off + n])?;
            sent += n as u64;
        }
        c.shutdown(std::net::Shutdown::Write)
    })
    .context("sending")?;
    let (got, intact) = receiver.join().map_err(|_| anyhow::anyhow!("receiver panicked"))??;
    let secs = start.elapsed().as_secs_f64();
    if got != total || !intact {
        bail!(
            "the transfer arrived damaged: {got} of {total} bytes, content {}",
            if intact { "intact" } else { "corrupted" }
        );
    }
    println!("  {} bytes arrived intact in {:.2} s: {:.2} Gbit/s", got, secs, got as f64 * 8.0 / secs / 1e9);

    println!("\n== the workload modeler: request-response 200/1000 bytes, g1 → g2 (`sluice bench`)");
    bench_step(ip4, &g1.netns, &g2.netns, s)?;

    println!(
        "\n== the same between programs run with `sluice smc run`: TCP handshake through the switch, data through shared memory"
    );
    smc_step(ip4, &g1.netns, &g2.netns, s)?;

    println!("\n== the switch's counters (`sluice stats --switch {}`)", s.switch);
    let mut c = Client::connect(&s.socket)?;
    let r: StatsReport = c.call(&Request::Stats { port: None })?;
    print!("{}", crate::cli::render_stats(&r, false));
    Ok(())
}

/// Runs seed 003's rr1c-200x1000 for 2 s at 1 and 10 connections: a bench server on a
/// thread inside g2's namespace, the client inside g1's (threads inherit the namespace).
fn bench_step(server_ip: IpAddr, client_ns: &str, server_ns: &str, s: &lab::LabState) -> Result<()> {
    use sluice_bench::{client, report, server};
    // Spawned from inside g2's namespace, so that the data sockets it opens are there too.
    netns::run_in(Some(server_ns), move || {
        let listener = TcpListener::bind(SocketAddr::new(server_ip, 20000))?;
        std::thread::spawn(move || server::serve(listener, std::sync::Arc::new(|_line: String| {})));
        Ok(())
    })?;
    let mut profile = crate::bench::load_profile("rr1c-200x1000", Some(&server_ip.to_string()))?;
    profile.set_duration(Duration::from_secs(2));
    let switch_pid = Client::connect(&s.socket)
        .and_then(|mut c| c.call::<sluice_api::proto::SwitchSummary>(&Request::Hello))
        .ok()
        .map(|h| h.pid);
    let mut results = Vec::new();
    for conns in [1, 10] {
        profile.set_conns(conns);
        let p = profile.clone();
        let opts = client::RunOptions {
            server: SocketAddr::new(server_ip, 20000).to_string(),
            guest_pids: vec![],
            switch_pid,
            interval: None,
        };
        let mut r = netns::run_in(Some(client_ns), move || client::run(&p, &opts).map_err(std::io::Error::other))?;
        r.flowops.clear();
        results.push(r);
    }
    print!("{}", report::render_table(&results, report::Per::Transaction));
    Ok(())
}

/// Runs rr1c-200x1000 for 2 s at 1 and 10 connections with both ends under
/// `sluice smc run`: a `sluice bench serve` process in g2, the client in g1.
fn smc_step(server_ip: IpAddr, client_ns: &str, server_ns: &str, s: &lab::LabState) -> Result<()> {
    const PORT: u16 = 20001;
    let mut server = sluice_smc_launch::sluice_in(server_ns, None, true)?
        .args(["bench", "serve", "--port", &PORT.to_string()])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .context("starting a bench server under sluice smc run")?;
    let result = (|| {
        // Ready when its control port answers (bounded).
        let at = SocketAddr::new(server_ip, PORT);
        let deadline = Instant::now() + Duration::from_secs(10);
        while netns::run_in(Some(client_ns), move || TcpStream::connect_timeout(&at, Duration::from_millis(200)))
            .is_err()
        {
            if Instant::now() > deadline {
                bail!("the bench server under sluice smc run did not start within 10 s");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let counted = |v: &serde_json::Value, k: &str| v[k].as_u64().unwrap_or(0);
        let before = sluice_smc_launch::read_stats()?;
        let out = sluice_smc_launch::sluice_in(client_ns, None, true)?
            .args(["bench", "run", "--to", &at.to_string(), "-m", "rr1c-200x1000", "--duration", "2"])
            .args(["--conns", "1,10", "--switch", &s.switch])
            .stdin(std::process::Stdio::null())
            .output()
            .context("running the bench client under sluice smc run")?;
        if !out.status.success() {
            bail!("the bench client under sluice smc run failed: {}", String::from_utf8_lossy(&out.stderr).trim());
        }
        print!("{}", String::from_utf8_lossy(&out.stdout));
        let after = sluice_smc_launch::read_stats()?;
        let (conns, smc) = (
            counted(&after, "connections_client") - counted(&before, "connections_client"),
            counted(&after, "smc_client") - counted(&before, "smc_client"),
        );
        let early = |v: &serde_json::Value| v["fallback_client"]["closed_early"].as_u64().unwrap_or(0);
        let early = early(&after) - early(&before);
        println!(
            "  {smc} of {conns} client connections moved to shared memory, {early} closed before their server decided (`sluice smc stats` says more)"
        );
        Ok(())
    })();
    let _ = server.kill();
    let _ = server.wait();
    result
}

/// The transfer's content: byte i is i mod 251 (a prime, so no block size lines up with
/// it). The block holds 1 MiB from any starting phase.
fn pattern_block() -> Vec<u8> {
    (0..(1usize << 20) + 251).map(|i| (i % 251) as u8).collect()
}

/// Sends `count` ICMP echo requests to `dst` and returns the round trips.
fn ping(dst: IpAddr, count: u16) -> std::io::Result<Vec<Duration>> {
    let (domain, proto, req_type, reply_type) = match dst {
        IpAddr::V4(_) => (Domain::IPV4, Protocol::ICMPV4, 8u8, 0u8),
        IpAddr::V6(_) => (Domain::IPV6, Protocol::ICMPV6, 128, 129),
    };
    let sock = Socket::new(domain, Type::RAW, Some(proto))?;
    sock.set_read_timeout(Some(Duration::from_secs(2)))?;
    let id = (std::process::id() & 0xffff) as u16;
    let addr = SockAddr::from(SocketAddr::new(dst, 0));
    let mut rtts = Vec::new();
    for seq in 1..=count {
        let mut pkt = vec![req_type, 0, 0, 0];
        pkt.extend_from_slice(&id.to_be_bytes());
        pkt.extend_from_slice(&seq.to_be_bytes());
        pkt.extend((0..56).map(|i| i as u8));
        if dst.is_ipv4() {
            let c = sluice_wire::checksum::fold(sluice_wire::checksum::sum(&pkt, 0));
            pkt[2..4].copy_from_slice(&c.to_be_bytes());
        }
        let start = Instant::now();
        sock.send_to(&pkt, &addr)?;
        loop {
            let mut buf = [MaybeUninit::<u8>::uninit(); 2048];
            let n = sock
                .recv(&mut buf)
                .map_err(|e| std::io::Error::new(e.kind(), format!("no echo reply from {dst} within 2 s ({e})")))?;
            // SAFETY: recv initialized the first `n` bytes.
            let b: Vec<u8> = buf[..n].iter().map(|x| unsafe { x.assume_init() }).collect();
            let icmp = if dst.is_ipv4() { &b[((b[0] & 0x0f) as usize * 4).min(b.len())..] } else { &b[..] };
            if icmp.len() >= 8
                && icmp[0] == reply_type
                && icmp[4..6] == id.to_be_bytes()
                && icmp[6..8] == seq.to_be_bytes()
            {
                rtts.push(start.elapsed());
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(rtts)
}

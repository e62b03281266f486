//! `sluice smc`: the launcher of the shared-memory fast path (docs/architecture.md, "The
//! shared-memory fast path").
//!
//! The preload library is inside this binary (see `build.rs`); `smc run` writes it once
//! to the runtime directory, named by its content, and runs the program with it in
//! `LD_PRELOAD` and its settings in `SLUICE_SMC`.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::paths;

/// The preload library, built by `build.rs`.
static LIBRARY: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/libsluice_smc.so"));

/// `sluice smc …`
#[derive(Debug, clap::Subcommand)]
pub enum SmcCmd {
    /// Run an unmodified, dynamically linked TCP program with sluice's preload library,
    /// like `smc_run`: its connections to and from other programs run this way, on this
    /// host (any network namespace), are to use shared memory; connections with any
    /// other peer stay plain TCP.
    ///
    /// Buffer sizes default to SMC's rule: the TCP default buffer (net.ipv4.tcp_rmem and
    /// tcp_wmem, middle value) rounded up to a power of two, halved, at least 16 KiB.
    /// Streams gain from larger ones (-r 1m -t 1m), as with the kernel's SMC.
    ///
    /// Nothing busy-polls: blocking reads and writes sleep on a futex in the shared
    /// buffer, poll/epoll programs on the socket itself.
    ///
    /// Both ends must run under the launcher; `sluice smc stats` shows what happened.
    ///
    ///   sluice smc run -- iperf3 -s
    ///   sluice smc run -r 128k -t 128k -- iperf3 -c 10.77.0.2
    #[command(verbatim_doc_comment)]
    Run(RunArgs),
    /// Host-wide counters of the fast path, like `smcd stats`: connections, how many moved
    /// to shared memory and why the others stayed on TCP, bytes and calls, full buffers,
    /// buffer sizes. Kept until `sluice smc stats reset`.
    #[command(args_conflicts_with_subcommands = true)]
    Stats {
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(subcommand)]
        reset: Option<StatsReset>,
    },
    /// Live connections on shared memory, host-wide: process, role, addresses, buffer
    /// sizes, age.
    Info {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// `sluice smc stats reset`.
#[derive(Debug, clap::Subcommand)]
pub enum StatsReset {
    /// Zero the counters.
    Reset,
}

/// Arguments of `sluice smc run`.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// Receive buffer size per connection (e.g. 64k, 1m; 16k to 64m, rounded up to a power
    /// of two).
    #[arg(short = 'r', long = "rmem", value_name = "SIZE", value_parser = parse_size)]
    pub rmem: Option<usize>,
    /// Send buffer size per connection (as -r).
    #[arg(short = 't', long = "tmem", value_name = "SIZE", value_parser = parse_size)]
    pub tmem: Option<usize>,
    /// The program and its arguments.
    #[arg(last = true, required = true, value_name = "PROGRAM ARGS")]
    pub cmd: Vec<String>,
}

fn parse_size(s: &str) -> Result<usize, String> {
    sluice_smc::size::parse(s)
}

/// Runs `sluice smc …`.
pub fn run_cmd(c: SmcCmd) -> Result<()> {
    match c {
        SmcCmd::Run(a) => run(a),
        SmcCmd::Stats { reset: Some(StatsReset::Reset), .. } => {
            let p = stats_path();
            if p.exists() {
                let mut b = vec![0u8; sluice_smc::stats::LEN];
                b[..8].copy_from_slice(&sluice_smc::stats::MAGIC.to_le_bytes());
                std::fs::write(&p, b).with_context(|| format!("resetting {}", p.display()))?;
            }
            println!("SMC counters reset");
            Ok(())
        }
        SmcCmd::Info { json } => info(json),
        SmcCmd::Stats { json, reset: None } => {
            let v = read_stats()?;
            if json {
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                print!("{}", render_stats(&v));
            }
            Ok(())
        }
    }
}

/// `sluice smc info`.
fn info(json: bool) -> Result<()> {
    let dir = paths::run_dir().join("smc").join("conn");
    let mut rows: Vec<serde_json::Value> = Vec::new();
    for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
        let Ok(text) = std::fs::read_to_string(e.path()) else { continue };
        let Ok(v) = serde_json::from_str::<serde_json::Value>(text.trim()) else { continue };
        let pid = v["pid"].as_u64().unwrap_or(0) as u32;
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            // Its process died without closing: the entry is stale.
            let _ = std::fs::remove_file(e.path());
            continue;
        }
        rows.push(v);
    }
    rows.sort_by_key(|v| (v["pid"].as_u64(), v["since"].as_u64()));
    if json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    if rows.is_empty() {
        println!("no connection is on shared memory");
        return Ok(());
    }
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let mut t = comfy_table::Table::new();
    t.load_style(comfy_table::presets::NOTHING);
    t.set_header(["PID", "ROLE", "LOCAL", "PEER", "RMEM", "TMEM", "AGE"]);
    for v in rows {
        let s = |k: &str| v[k].as_str().unwrap_or("").to_string();
        let kib = |k: &str| format!("{}K", v[k].as_u64().unwrap_or(0) / 1024);
        t.add_row([
            v["pid"].to_string(),
            s("role"),
            s("local"),
            s("peer"),
            kib("rmem"),
            kib("tmem"),
            format!("{}s", now.saturating_sub(v["since"].as_u64().unwrap_or(now))),
        ]);
    }
    println!("{t}");
    Ok(())
}

/// `ip netns exec NS [taskset -c CPU] [sluice smc run --] sluice`: this sluice, run in a
/// namespace (pinned to a CPU, under the launcher), ready for its arguments — how the
/// studies and the demo start `sluice bench` in their guests.
pub fn sluice_in(netns: &str, cpu: Option<u8>, under_launcher: bool) -> Result<std::process::Command> {
    let exe = std::env::current_exe().context("finding the sluice executable")?;
    let mut cmd = std::process::Command::new("ip");
    cmd.args(["netns", "exec", netns]);
    if let Some(cpu) = cpu {
        cmd.args(["taskset", "-c", &cpu.to_string()]);
    }
    if under_launcher {
        cmd.arg(&exe).args(["smc", "run", "--"]);
    }
    cmd.arg(exe);
    Ok(cmd)
}

fn stats_path() -> PathBuf {
    paths::run_dir().join("smc").join("stats")
}

/// The counters as JSON (all zero when no program has run under the launcher yet).
pub fn read_stats() -> Result<serde_json::Value> {
    use sluice_smc::msg::Reason;
    use sluice_smc::stats::{self, Counter};
    let b = match std::fs::read(stats_path()) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => vec![0u8; stats::LEN],
        Err(e) => return Err(e).with_context(|| format!("reading {}", stats_path().display())),
    };
    let w = |i: usize| b.get(i * 8..i * 8 + 8).map_or(0, |x| u64::from_le_bytes(x.try_into().unwrap_or_default()));
    let mut v = serde_json::Map::new();
    for c in Counter::ALL {
        v.insert(c.name().into(), w(stats::counter_index(c)).into());
    }
    for (side, server) in [("fallback_client", false), ("fallback_server", true)] {
        let m: serde_json::Map<_, _> =
            Reason::ALL.iter().map(|r| (r.name().to_string(), w(stats::fallback_index(*r, server)).into())).collect();
        v.insert(side.into(), m.into());
    }
    for (name, send) in [("rmem_histogram", false), ("tmem_histogram", true)] {
        let m: serde_json::Map<_, _> = stats::BUCKETS
            .iter()
            .enumerate()
            .map(|(i, b)| (b.to_string(), w(stats::hist_index(16384 << i, send)).into()))
            .collect();
        v.insert(name.into(), m.into());
    }
    Ok(v.into())
}

fn render_stats(v: &serde_json::Value) -> String {
    let n = |k: &str| v[k].as_u64().unwrap_or(0);
    let sum = |k: &str| v[k].as_object().map_or(0, |m| m.values().filter_map(|x| x.as_u64()).sum::<u64>());
    let mut out = String::new();
    let line = |out: &mut String, a: &str, c: String, s: String| out.push_str(&format!("  {a:<24}{c:>12}{s:>12}\n"));
    out.push_str(&format!("  {:<24}{:>12}{:>12}\n", "", "client", "server"));
    line(&mut out, "connections", n("connections_client").to_string(), n("connections_server").to_string());
    line(&mut out, "on shared memory", n("smc_client").to_string(), n("smc_server").to_string());
    line(&mut out, "TCP fallback", sum("fallback_client").to_string(), sum("fallback_server").to_string());
    for r in sluice_smc::msg::Reason::ALL {
        let (c, s) = (
            v["fallback_client"][r.name()].as_u64().unwrap_or(0),
            v["fallback_server"][r.name()].as_u64().unwrap_or(0),
        );
        if c > 0 || s > 0 {
            line(&mut out, &format!("  {}", r.name()), c.to_string(), s.to_string());
        }
    }
    out.push_str(&format!("  {:<24}{:>12}\n", "handshake errors", n("handshake_errors")));
    let (tx, rx, txc, rxc) = (n("tx_bytes"), n("rx_bytes"), n("tx_calls"), n("rx_calls"));
    out.push_str(&format!("  {:<24}{:>12} bytes in {} calls\n", "sent", tx, txc));
    out.push_str(&format!("  {:<24}{:>12} bytes in {} calls\n", "received", rx, rxc));
    let full = n("buffer_full");
    let pct = if txc > 0 { 100.0 * full as f64 / txc as f64 } else { 0.0 };
    out.push_str(&format!("  {:<24}{:>12} ({pct:.2}% of sends)\n", "buffer full", full));
    for (k, title) in [("rmem_histogram", "receive buffers"), ("tmem_histogram", "send buffers")] {
        let parts: Vec<String> =
            sluice_smc::stats::BUCKETS.iter().map(|b| format!("{b}: {}", v[k][*b].as_u64().unwrap_or(0))).collect();
        out.push_str(&format!("  {title:<24}{}\n", parts.join("  ")));
    }
    out
}

fn run(a: RunArgs) -> Result<()> {
    let lib = install_library()?;
    let (r_default, t_default) = sluice_smc::size::host_defaults();
    let settings = format!("r={},t={}", a.rmem.unwrap_or(r_default), a.tmem.unwrap_or(t_default));
    let program = &a.cmd[0];
    if let Some(path) = which(program)
        && is_static(&path)
    {
        eprintln!(
            "sluice: warning: {} is statically linked: the preload library cannot reach it, so its connections stay on TCP",
            path.display()
        );
    }
    let preload = match std::env::var_os("LD_PRELOAD") {
        Some(old) if !old.is_empty() => {
            let mut v = lib.clone().into_os_string();
            v.push(" ");
            v.push(old);
            v
        }
        _ => lib.clone().into_os_string(),
    };
    let err = Command::new(program).args(&a.cmd[1..]).env("LD_PRELOAD", preload).env("SLUICE_SMC", settings).exec();
    bail!("cannot run {program}: {err}")
}

/// Writes the preload library to the runtime directory unless a copy with the same
/// content is there, and returns its path.
pub fn install_library() -> Result<PathBuf> {
    let dir = paths::run_dir().join("smc").join("lib");
    let path = dir.join(format!("libsluice_smc-{:016x}.so", fnv1a(LIBRARY)));
    if std::fs::metadata(&path).is_ok_and(|m| m.len() == LIBRARY.len() as u64) {
        return Ok(path);
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let _ = std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755));
    let tmp = dir.join(format!(".lib-{}.tmp", std::process::id()));
    let mut f = std::fs::File::create(&tmp).with_context(|| format!("writing {}", tmp.display()))?;
    f.write_all(LIBRARY)?;
    f.sync_all()?;
    drop(f);
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o644))?;
    std::fs::rename(&tmp, &path).with_context(|| format!("installing {}", path.display()))?;
    Ok(path)
}

/// 64-bit FNV-1a: a content name that stays the same across Rust versions.
fn fnv1a(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &x| (h ^ u64::from(x)).wrapping_mul(0x0000_0100_0000_01b3))
}

/// The file `program` names, as the shell would find it.
fn which(program: &str) -> Option<PathBuf> {
    if program.contains('/') {
        return Some(PathBuf::from(program));
    }
    std::env::split_paths(&std::env::var_os("PATH")?).map(|d| d.join(program)).find(|p| p.is_file())
}

/// True for an ELF executable without an interpreter (statically linked); false when it
/// cannot tell (scripts, unreadable files).
fn is_static(path: &Path) -> bool {
    let Ok(b) = std::fs::read(path) else { return false };
    if b.len() < 64 || &b[..4] != b"\x7fELF" || b[4] != 2 || b[5] != 1 {
        return false;
    }
    let u16_at = |o: usize| u16::from_le_bytes([b[o], b[o + 1]]) as usize;
    let phoff = u64::from_le_bytes(b[32..40].try_into().unwrap_or_default()) as usize;
    let (phentsize, phnum) = (u16_at(54), u16_at(56));
    // PT_INTERP = 3.
    !(0..phnum).any(|i| {
        let at = phoff + i * phentsize;
        b.get(at..at + 4).is_some_and(|t| u32::from_le_bytes([t[0], t[1], t[2], t[3]]) == 3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dynamic_and_static_programs_are_told_apart() {
        assert!(!is_static(Path::new("/bin/sh")), "sh is dynamically linked");
        assert!(!is_static(Path::new("/nonexistent")));
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_ne!(fnv1a(b"a"), fnv1a(b"b"));
    }
}

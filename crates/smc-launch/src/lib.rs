//! `sluice smc`: the launcher of the shared-memory fast path (docs/architecture.md, "The
//! shared-memory fast path"), its setup and its views.
//!
//! The preload library is inside this binary (see `build.rs`); `smc run` writes it once
//! to the runtime directory, named by its content, and runs the program with it in
//! `LD_PRELOAD` and its settings in `SLUICE_SMC` — when the user may use the fast path
//! ([`layout`]); otherwise it says so once and runs the program on plain TCP.

pub mod choice;
mod elf;
pub mod error;
mod layout;
pub mod stats;

use std::os::unix::process::CommandExt;
use std::process::Command;

use sluice_sys::error::Context;
use sluice_sys::paths;

pub use error::{Error, Result};
pub use stats::read_stats;

/// `sluice smc …`
#[derive(Debug, clap::Subcommand)]
pub enum SmcCmd {
    /// Run an unmodified, dynamically linked TCP program with sluice's preload library,
    /// like `smc_run`: its connections to and from other programs run this way, on this
    /// host (any network namespace), are to use shared memory; connections with any
    /// other peer stay plain TCP.
    ///
    /// Buffers start at SMC's size: the TCP default buffer (net.ipv4.tcp_rmem and
    /// tcp_wmem, middle value) rounded up to a power of two, halved, at least 16 KiB. Like
    /// TCP's, a connection's buffer grows — doubling each time it is found full, up to the
    /// TCP maximum (the last value of tcp_rmem/tcp_wmem, rounded down to a power of two)
    /// but no more than an eighth of the CPU's last-level cache (a ring that stays in the
    /// cache streams fastest), or --max-buffer — while idle connections keep the small one.
    /// -r and -t fix the sizes (no growth), as with the kernel's SMC.
    ///
    /// Nothing busy-polls for long: a wait for the peer looks for its answer for a few
    /// microseconds first (--spin: twice the recent wait, at most 50 µs, and only while
    /// answers have lately come that fast), then blocking reads and writes sleep on a
    /// futex in the shared buffer, poll/epoll programs on the socket itself. An awake epoll
    /// event loop finds its sockets' bytes in the shared buffers without being woken
    /// (--doorbells turns that off).
    ///
    /// Both ends must run under the launcher; `sluice smc stats` shows what happened.
    ///
    /// The fast path is open to root and to members of the group `sluice smc setup` names
    /// (`sluice` by default, when it exists). Others are told so once, and their program
    /// runs on plain TCP. Peers prove to each other, through the kernel, that they are the
    /// two ends of the connection before any memory is shared (docs/smc.md, "Who may use
    /// it").
    ///
    /// A connection that would not gain stays on TCP: by the operator's rules (--tcp, and
    /// /etc/sluice/smc.toml: `tcp = ["5432", "prog:curl"]`, `short = "64k"`), and by an
    /// automatic rule that keeps a destination's connections on TCP once they have proved
    /// too short to repay the handshake (--short). `sluice smc stats` counts both.
    ///
    ///   sluice smc run -- iperf3 -s
    ///   sluice smc run -r 128k -t 128k -- iperf3 -c 10.77.0.2
    ///   sluice smc run --max-buffer 1m -- redis-server
    ///   sluice smc run --tcp 5432 --tcp prog:curl -- ./start-services.sh
    #[command(verbatim_doc_comment)]
    Run(RunArgs),
    /// Host-wide counters of the fast path, like `smcd stats`: connections, how many moved
    /// to shared memory and why the others stayed on TCP, bytes and calls, full buffers,
    /// connections reset by a broken peer, buffer sizes — summed over every user's
    /// programs, and each user's own (each user's programs count into a file of that
    /// user's: a user can misstate only their own counts). Kept until `sluice smc stats
    /// reset` (root resets everyone's, a user their own).
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
    /// Prepare the runtime directory (/run/sluice/smc) so the fast path can be used, and
    /// say who may use it: root, and the members of GROUP. Run as root, once per boot
    /// (the first `sluice smc run` by root does it with the default group), or again to
    /// change the group or repair the modes.
    ///
    ///   sluice smc setup                  # group `sluice` if it exists, else root only
    ///   sluice smc setup --group netdev
    ///   sluice smc setup --root-only
    #[command(verbatim_doc_comment)]
    Setup {
        /// The group whose members may use the fast path [default: sluice, if it exists].
        #[arg(long, value_name = "GROUP", conflicts_with = "root_only")]
        group: Option<String>,
        /// Only root may use the fast path.
        #[arg(long)]
        root_only: bool,
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
    /// Receive buffer size per connection, fixed (e.g. 64k, 1m; 16k to 64m, rounded up to
    /// a power of two) [default: SMC's rule, growing].
    #[arg(short = 'r', long = "rmem", value_name = "SIZE", value_parser = parse_size)]
    pub rmem: Option<usize>,
    /// Send buffer size per connection, fixed (as -r).
    #[arg(short = 't', long = "tmem", value_name = "SIZE", value_parser = parse_size)]
    pub tmem: Option<usize>,
    /// The most a growing buffer grows to (16k to 64m) [default: the TCP maxima, at most an
    /// eighth of the last-level cache].
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub max_buffer: Option<usize>,
    /// The longest a wait for the peer looks for its answer before it sleeps, in
    /// microseconds (adaptive: only while answers lately came that fast; never on one CPU);
    /// 0 never looks.
    #[arg(long, value_name = "MICROSECONDS", default_value_t = 50, value_parser = clap::value_parser!(u32).range(0..=1000))]
    pub spin: u32,
    /// Every wake-up by doorbell: event loops (epoll) do not look at the shared buffers of
    /// the sockets they registered themselves, and writers always write the reader a byte
    /// (slower under load; for comparison, or to rule the looks out).
    #[arg(long)]
    pub doorbells: bool,
    /// Connections that stay on TCP (repeatable): a port (5432), a port range
    /// (8000-8099), an address or network (10.1.0.0/16, fd00::/8), one with a port
    /// (10.1.0.0/16:443, [fd00::1]:443), or a program (prog:psql, by its executable's
    /// name: all its connections). A client's destination or a listener's own address is
    /// matched; added to the rules of the host's file.
    #[arg(long = "tcp", value_name = "RULE", value_parser = choice::parse_rule)]
    pub tcp: Vec<String>,
    /// The automatic rule: after two connections of the program to one destination each
    /// moved less than SIZE (both ways) in fewer than 16 transfers, its next connections
    /// there stay on TCP (too short to repay the handshake), but for a probe now and then;
    /// 0 turns it off [default: the host's file, else 64k].
    #[arg(long, value_name = "SIZE", value_parser = choice::parse_short)]
    pub short: Option<u64>,
    /// The file of rules to read [default: /etc/sluice/smc.toml, when it exists].
    #[arg(long, value_name = "FILE")]
    pub config: Option<std::path::PathBuf>,
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
            let n = stats::reset()?;
            if sluice_sys::user::euid() == 0 {
                println!("SMC counters reset ({n} users' files)");
            } else if n > 0 {
                println!("your SMC counters reset (root resets every user's)");
            } else {
                println!("no SMC counters of yours to reset (root resets every user's)");
            }
            Ok(())
        }
        SmcCmd::Info { json } => info(json),
        SmcCmd::Stats { json, reset: None } => {
            let t = stats::gather();
            for note in t.notes.iter().take(3) {
                eprintln!("sluice: {note}");
            }
            if t.notes.len() > 3 {
                eprintln!("sluice: … and {} more entries of the statistics directory skipped", t.notes.len() - 3);
            }
            let v = stats::to_json(&t);
            if json {
                println!("{}", serde_json::to_string_pretty(&v).context("encoding the statistics")?);
            } else {
                print!("{}", stats::render(&v));
            }
            Ok(())
        }
        SmcCmd::Setup { group, root_only } => {
            let gid = match (group, root_only) {
                (_, true) => None,
                (Some(g), _) => match g.parse().ok().or_else(|| layout::group_id(&g)) {
                    Some(id) => Some(id),
                    None => return Err(Error::NoGroup(g)),
                },
                (None, _) => layout::group_id(sluice_smc::access::DEFAULT_GROUP),
            };
            let p = layout::setup(gid)?;
            println!(
                "{}: the shared-memory fast path is open to {}",
                layout::smc_dir().display(),
                layout::describe(&p)
            );
            Ok(())
        }
    }
}

/// `sluice smc info`.
fn info(json: bool) -> Result<()> {
    let dir = paths::run_dir().join("smc").join("conn");
    let mut rows: Vec<serde_json::Value> = Vec::new();
    for e in std::fs::read_dir(&dir).into_iter().flatten().flatten().take(65536) {
        // A process's table: fixed-width lines of JSON, blank ones free; anything else (a
        // FIFO, a link, a huge file) is passed by.
        let Ok(f) = layout::open_entry(&e.path(), false, None) else { continue };
        let Some(pid) = e.file_name().to_str().and_then(|n| sluice_smc::access::entry_pid("conn", n)) else {
            continue;
        };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            // Its process died without closing: the table is stale.
            let _ = std::fs::remove_file(e.path());
            continue;
        }
        let mut text = String::new();
        if std::io::Read::read_to_string(&mut std::io::Read::take(f, 1 << 20), &mut text).is_err() {
            continue;
        }
        for line in text.lines().map(str::trim).filter(|l| l.starts_with('{')) {
            // (A line being written as we read it does not parse, and is passed by.)
            if let Ok(v) = serde_json::from_str::<serde_json::Value>(line) {
                rows.push(v);
            }
        }
    }
    rows.sort_by_key(|v| (v["pid"].as_u64(), v["since"].as_u64()));
    if json {
        println!("{}", serde_json::to_string_pretty(&rows).context("encoding the connections")?);
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

fn run(a: RunArgs) -> Result<()> {
    let program = &a.cmd[0];
    let choice = choice::gather(a.config.as_deref(), &a.tcp, a.short).map_err(Error::Config)?;
    let lib = match layout::verdict(program)? {
        layout::Verdict::Load(lib) => lib,
        layout::Verdict::Plain(why) => {
            eprintln!("{why}");
            let cause = Command::new(program).args(&a.cmd[1..]).exec();
            return Err(Error::CannotRun { program: program.clone(), cause });
        }
    };
    sweep_stale();
    let (r_default, t_default) = sluice_smc::size::host_defaults();
    let (r_max, t_max) = sluice_smc::size::host_maxima();
    let (r, t) = (a.rmem.unwrap_or(r_default), a.tmem.unwrap_or(t_default));
    // A size given is fixed; a default one grows up to the maximum (or --max-buffer).
    let grow_to = |given: Option<usize>, start: usize, max: usize| {
        given.unwrap_or_else(|| a.max_buffer.unwrap_or(max).max(start))
    };
    let mut settings = format!(
        "r={r},t={t},rmax={},tmax={},spin={},looks={}",
        grow_to(a.rmem, r, r_max),
        grow_to(a.tmem, t, t_max),
        a.spin,
        u8::from(!a.doorbells)
    );
    settings.push(',');
    settings.push_str(&choice::settings(&choice));
    // The program's file, read once (a missing or unreadable one, or a script, says
    // nothing).
    let file = sluice_sys::which(program).and_then(|p| Some((std::fs::read(&p).ok()?, p)));
    if let Some((bytes, path)) = &file
        && let Some(elf) = elf::Elf::parse(bytes)
    {
        if elf_is_go(&elf) {
            eprintln!(
                "sluice: warning: {} is a Go program: Go makes its own socket system calls, which the preload library cannot see, so its connections stay on TCP",
                path.display()
            );
        } else if !elf.has_interp() {
            eprintln!(
                "sluice: warning: {} is statically linked: the preload library cannot reach it, so its connections stay on TCP",
                path.display()
            );
        } else if elf_uses_liburing(&elf) {
            // Its io_uring calls bypass the library: its connections stay on TCP, counted.
            settings.push_str(",uring=1");
        }
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
    let cause = Command::new(program).args(&a.cmd[1..]).env("LD_PRELOAD", preload).env("SLUICE_SMC", settings).exec();
    Err(Error::CannotRun { program: program.clone(), cause })
}

/// Removes the side doors (`door/PID.sock`), listener entries (`listen/ADDR_PORT.NETNS.PID`)
/// and connection tables (`conn/PID`) of processes that are gone — killed by a signal,
/// they could not remove their own: this user's, or anyone's when root (the directories
/// are sticky). Looks at most at 4,096 entries of each directory, never follows a link.
fn sweep_stale() {
    let me = sluice_sys::user::euid();
    let smc = paths::run_dir().join("smc");
    for sub in ["door", "listen", "conn"] {
        for e in std::fs::read_dir(smc.join(sub)).into_iter().flatten().flatten().take(4096) {
            let Ok(m) = std::fs::symlink_metadata(e.path()) else { continue };
            if m.is_dir() || (me != 0 && std::os::unix::fs::MetadataExt::uid(&m) != me) {
                continue;
            }
            let name = e.file_name();
            let Some(pid) = name.to_str().and_then(|n| sluice_smc::access::entry_pid(sub, n)) else { continue };
            if pid != 0 && !std::path::Path::new(&format!("/proc/{pid}")).exists() {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
}

/// True for a Go program (it has Go's build information section): Go's runtime makes its
/// socket system calls itself, past the C library, even when it is dynamically linked.
fn elf_is_go(e: &elf::Elf) -> bool {
    e.section_names().iter().any(|n| n == ".go.buildinfo")
}

/// True for a program linked with liburing (it names the library among those it needs).
/// Its io_uring calls bypass the library. A program that only mentions the name (as this
/// one does) is not one; one that loads liburing itself with `dlopen` is not seen.
fn elf_uses_liburing(e: &elf::Elf) -> bool {
    e.needed().iter().any(|l| l.starts_with("liburing.so"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    /// What `what` says of the ELF file at `path` (false when it cannot tell).
    fn file_is(path: &Path, what: fn(&elf::Elf) -> bool) -> bool {
        let Ok(b) = std::fs::read(path) else { return false };
        elf::Elf::parse(&b).is_some_and(|e| what(&e))
    }

    fn is_go(path: &Path) -> bool {
        file_is(path, elf_is_go)
    }

    fn uses_liburing(path: &Path) -> bool {
        file_is(path, elf_uses_liburing)
    }

    fn is_static(path: &Path) -> bool {
        file_is(path, |e| !e.has_interp())
    }

    #[test]
    fn programs_that_use_liburing_are_found() {
        assert!(!uses_liburing(Path::new("/bin/sh")));
        // This test binary holds the name, as the launcher does: it does not link it.
        assert!(!uses_liburing(&std::env::current_exe().unwrap()));
        let file = std::env::temp_dir().join(format!("sluice-uring-{}", std::process::id()));
        std::fs::write(&file, elf::tests::tiny(&["libc.so.6", "liburing.so.2"])).unwrap();
        let linked = uses_liburing(&file);
        std::fs::write(&file, elf::tests::tiny(&["libc.so.6"])).unwrap();
        let plain = uses_liburing(&file);
        let _ = std::fs::remove_file(&file);
        assert!(linked && !plain);
    }

    #[test]
    fn go_programs_are_told_apart() {
        assert!(!is_go(Path::new("/bin/sh")), "sh is C");
        assert!(!is_go(&std::env::current_exe().unwrap()), "this is Rust");
        if Path::new("/usr/bin/gobgpd").exists() {
            assert!(is_go(Path::new("/usr/bin/gobgpd")), "gobgpd is Go (stripped, dynamically linked)");
        }
    }

    #[test]
    fn dynamic_and_static_programs_are_told_apart() {
        assert!(!is_static(Path::new("/bin/sh")), "sh is dynamically linked");
        assert!(!is_static(Path::new("/nonexistent")));
    }
}

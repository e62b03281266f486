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
    ///
    /// Status (issue 6, in progress): the library is loaded and inert; connections stay
    /// on TCP until the handshake and the rings land.
    ///
    ///   sluice smc run -- iperf3 -s
    ///   sluice smc run -r 128k -t 128k -- iperf3 -c 10.77.0.2
    #[command(verbatim_doc_comment)]
    Run(RunArgs),
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
    }
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

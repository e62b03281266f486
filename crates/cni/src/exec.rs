//! Running the programs the plugin rests on — the IPAM plugin, `ip`, `nft` — each with a
//! bounded wait: a program still running after its time is killed and the call fails
//! saying which program and how long it was given.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long the IPAM plugin may take.
pub const IPAM_WITHIN: Duration = Duration::from_secs(60);
/// How long `ip` or `nft` may take.
pub const TOOL_WITHIN: Duration = Duration::from_secs(20);
/// The most output read from a program.
const MAX_OUTPUT: u64 = 1 << 20;

/// What a finished program said.
pub struct Output {
    /// It exited 0.
    pub ok: bool,
    /// Its stdout.
    pub stdout: Vec<u8>,
    /// Its stderr.
    pub stderr: String,
}

/// Runs `cmd` with `input` on its stdin, for at most `within`.
pub fn run(mut cmd: Command, input: &[u8], within: Duration) -> std::io::Result<Output> {
    let what = format!("{:?}", cmd.get_program());
    let mut child = cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn()?;
    let mut stdin = child.stdin.take();
    let input = input.to_vec();
    // (Written on a thread: a program that does not read would otherwise hold us.)
    let writer = std::thread::spawn(move || {
        if let Some(s) = stdin.as_mut() {
            let _ = s.write_all(&input);
        }
    });
    let (mut out, mut err) = (child.stdout.take(), child.stderr.take());
    let reader = std::thread::spawn(move || {
        let mut b = Vec::new();
        if let Some(o) = out.as_mut() {
            let _ = o.take(MAX_OUTPUT).read_to_end(&mut b);
        }
        b
    });
    let err_reader = std::thread::spawn(move || {
        let mut b = Vec::new();
        if let Some(e) = err.as_mut() {
            let _ = e.take(MAX_OUTPUT).read_to_end(&mut b);
        }
        String::from_utf8_lossy(&b).trim().to_string()
    });
    let started = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait()? {
            break s;
        }
        if started.elapsed() > within {
            let _ = child.kill();
            let _ = child.wait();
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("{what} did not finish within {} s and was killed", within.as_secs()),
            ));
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let _ = writer.join();
    let stdout = reader.join().unwrap_or_default();
    let stderr = err_reader.join().unwrap_or_default();
    Ok(Output { ok: status.success(), stdout, stderr })
}

/// Runs tool `prog ARGS` (in the calling thread's network namespace) for at most
/// [`TOOL_WITHIN`]; the error says what it said.
pub fn tool(prog: &str, args: &[&str]) -> std::io::Result<Vec<u8>> {
    let mut cmd = Command::new(prog);
    cmd.args(args);
    let out = run(cmd, &[], TOOL_WITHIN)?;
    if out.ok {
        Ok(out.stdout)
    } else {
        Err(std::io::Error::other(format!("`{prog} {}`: {}", args.join(" "), out.stderr)))
    }
}

/// The plugin `name` in the first directory of `path` that has it.
pub fn find_plugin(path: &[PathBuf], name: &str) -> Option<PathBuf> {
    path.iter().map(|d| d.join(name)).find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

//! Other builds of sluice in one study: a study's `builds` name executables, and its paths
//! `PATH@BUILD` run their switches and relays with them, interleaved with the same paths
//! run by this executable — before and after a change, in one run (docs/study.md,
//! "Two builds in one run").
//!
//! Each named executable is copied, at the start of a run, into a new private directory
//! (`mkdtemp`, 0700) and run from there: what was measured is what was read at the start,
//! whatever happens to the named file meanwhile. The report names each build with its
//! version, size and a digest of its bytes.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::error::Result;
use sluice_sys::bail;
use sluice_sys::error::Context;

use sluice_sys::fs::TempDir;

/// The builds of one run, ready to start.
pub struct Staged {
    /// The copies' directory, removed with them when the run ends.
    _dir: Option<TempDir>,
    /// Each build's copy, by name.
    pub exes: BTreeMap<String, PathBuf>,
    /// Each build in a line for the report.
    pub about: Vec<String>,
}

/// How long a build may take to say its version.
const VERSION_WAIT: Duration = Duration::from_secs(10);

/// Copies every build of `builds` into a new private directory and asks each its version.
pub fn stage(builds: &BTreeMap<String, PathBuf>) -> Result<Staged> {
    if builds.is_empty() {
        return Ok(Staged { _dir: None, exes: BTreeMap::new(), about: Vec::new() });
    }
    let dir = TempDir::new("sluice-builds").context("making a directory for the study's builds")?;
    let mut exes = BTreeMap::new();
    let mut about = Vec::new();
    for (name, exe) in builds {
        let mut src = std::fs::File::open(exe)
            .with_context(|| format!("build {name}: opening {} (name a sluice executable)", exe.display()))?;
        let meta = src.metadata().with_context(|| format!("build {name}: {}", exe.display()))?;
        if !meta.is_file() {
            bail!("build {name}: {} is not a regular file; name a sluice executable", exe.display());
        }
        let mut bytes = Vec::with_capacity(meta.len() as usize);
        src.read_to_end(&mut bytes).with_context(|| format!("build {name}: reading {}", exe.display()))?;
        let copy = dir.path().join(format!("sluice-{name}"));
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o700)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&copy)
            .with_context(|| format!("build {name}: copying it to {}", copy.display()))?;
        f.write_all(&bytes).and_then(|()| f.sync_all()).with_context(|| format!("build {name}: copying it"))?;
        drop(f);
        let version = version(&copy).with_context(|| format!("build {name}: {} --version", exe.display()))?;
        about.push(format!(
            "build `{name}`: {} ({version}, {} bytes, FNV-1a {:016x})",
            exe.display(),
            bytes.len(),
            fnv1a(&bytes)
        ));
        exes.insert(name.clone(), copy);
    }
    Ok(Staged { _dir: Some(dir), exes, about })
}

/// The first line `exe --version` prints, waiting at most [`VERSION_WAIT`].
fn version(exe: &Path) -> Result<String> {
    let mut child = Command::new(exe)
        .arg("--version")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("starting it")?;
    let deadline = Instant::now() + VERSION_WAIT;
    loop {
        if let Some(status) = child.try_wait()? {
            let mut out = String::new();
            if let Some(mut o) = child.stdout.take() {
                let _ = o.read_to_string(&mut out);
            }
            let line = out.lines().next().unwrap_or_default().trim().to_string();
            if !status.success() || !line.starts_with("sluice") {
                bail!("it did not say it is sluice ({status}: {line:?})");
            }
            return Ok(line);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!("it did not answer within {} s", VERSION_WAIT.as_secs());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A digest that tells two builds apart in a report (not a security check).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_build_is_copied_privately_and_must_say_it_is_sluice() {
        let tmp = TempDir::new("sluice-unit").unwrap();
        let fake = tmp.path().join("fake");
        std::fs::write(&fake, "#!/bin/sh\necho 'sluice 9.9.9'\n").unwrap();
        std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let s = stage(&BTreeMap::from([("before".to_string(), fake.clone())])).unwrap();
        let copy = &s.exes["before"];
        assert_ne!(copy, &fake);
        assert_eq!(std::fs::read(copy).unwrap(), std::fs::read(&fake).unwrap());
        assert!(s.about[0].contains("sluice 9.9.9") && s.about[0].contains("build `before`"), "{:?}", s.about);
        // Changing the named file afterwards changes nothing the run starts.
        std::fs::write(&fake, "#!/bin/sh\necho other\n").unwrap();
        assert!(std::fs::read_to_string(copy).unwrap().contains("9.9.9"));

        let other = tmp.path().join("other");
        std::fs::write(&other, "#!/bin/sh\necho hello\n").unwrap();
        std::fs::set_permissions(&other, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let e = stage(&BTreeMap::from([("x".to_string(), other)])).err().unwrap();
        assert!(e.chain().contains("did not say it is sluice"), "{}", e.chain());
        let e = stage(&BTreeMap::from([("x".to_string(), tmp.path().to_path_buf())])).err().unwrap();
        assert!(e.chain().contains("not a regular file"), "{}", e.chain());
    }
}

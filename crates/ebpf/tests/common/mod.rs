//! What the crate's kernel tests share: the root requirement, and a bpffs of their own to pin
//! the programs' maps in.

use std::process::Command;

use sluice_ebpf::ensure_bpffs;

/// True when the test runs as root (loading BPF programs needs it); otherwise fails the
/// test saying what to do. The tests that call it are the system tier's, `#[ignore]`d and
/// run only when asked for (`--include-ignored`, as scripts/test.sh does).
pub fn root() -> bool {
    // SAFETY: no preconditions.
    let ok = unsafe { libc::geteuid() } == 0;
    assert!(ok, "needs root (BPF programs): run scripts/test.sh as root, or leave out --include-ignored");
    ok
}

/// A new directory `$TMPDIR/PREFIX.XXXXXX` made by `mkdtemp` (mode 0700): never one that
/// exists, so nothing another user planted under a predictable name is mounted on or
/// emptied.
pub fn mkdtemp(prefix: &str) -> std::path::PathBuf {
    use std::os::unix::ffi::OsStringExt;
    let mut t = std::env::temp_dir().join(format!("{prefix}.XXXXXX")).into_os_string().into_vec();
    t.push(0);
    // SAFETY: `t` is NUL-terminated and writable; mkdtemp fills in the Xs in place.
    let p = unsafe { libc::mkdtemp(t.as_mut_ptr().cast()) };
    assert!(!p.is_null(), "mkdtemp: {}", std::io::Error::last_os_error());
    t.pop();
    std::path::PathBuf::from(std::ffi::OsString::from_vec(t))
}

/// A bpffs mounted on a directory of [`mkdtemp`]'s, unmounted and removed on drop.
pub struct Bpffs(pub std::path::PathBuf);

impl Bpffs {
    pub fn new(prefix: &str) -> Bpffs {
        let dir = mkdtemp(prefix);
        let fs = Bpffs(dir);
        ensure_bpffs(&fs.0).unwrap();
        fs
    }
}

impl Drop for Bpffs {
    fn drop(&mut self) {
        sluice_ebpf::remove_pins(&self.0);
        let _ = Command::new("umount").arg(&self.0).status();
        let _ = std::fs::remove_dir(&self.0);
    }
}

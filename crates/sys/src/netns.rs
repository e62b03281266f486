//! Running a piece of work inside a named network namespace (`ip netns` names, bound under
//! /run/netns). `setns` changes only the calling thread, so the work runs on a short-lived
//! thread of its own and never on a thread that serves anything else.
//!
//! A name is what `ip netns` accepts — one path component, never a path — and is checked
//! by [`check_name`] before anything is looked up; the namespace file is opened by
//! [`open`] without following a link and without blocking (a FIFO planted there would hold
//! the caller forever), and must be a namespace (nsfs). A later option naming a namespace
//! by its path (`/proc/PID/ns/net`, as container runtimes hand out) gets a check of its
//! own beside these, not a looser name.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd};
use std::path::PathBuf;

use super::cvt;

/// Where `ip netns` keeps named namespaces.
pub const NETNS_DIR: &str = "/run/netns";

/// `NSFS_MAGIC`: the file system of namespace files.
const NSFS_MAGIC: i64 = 0x6e73_6673;

/// The name check (in the configuration's module, which checks `netns` settings with it).
pub use crate::names::check_netns_name as check_name;

/// Path of the named namespace (for a name [`check_name`] passed).
pub fn path(name: &str) -> PathBuf {
    PathBuf::from(NETNS_DIR).join(name)
}

/// True if a namespace of that name exists; false for a name [`check_name`] refuses.
pub fn exists(name: &str) -> bool {
    check_name(name).is_ok() && path(name).exists()
}

/// Opens namespace `name` for `setns`: the name checked, the file opened
/// `O_NOFOLLOW|O_NONBLOCK|O_CLOEXEC` and checked to be a namespace file (nsfs).
pub fn open(name: &str) -> io::Result<File> {
    check_name(name).map_err(|m| io::Error::new(io::ErrorKind::InvalidInput, m))?;
    let p = path(name);
    let said = |e: io::Error, what: &str| {
        io::Error::new(e.kind(), format!("cannot open network namespace {name:?} ({}): {what}{e}", p.display()))
    };
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL byte in a namespace name"))?;
    // SAFETY: `c` is NUL-terminated; the result is checked and owned below.
    let fd =
        cvt(unsafe { libc::open(c.as_ptr(), libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC) })
            .map_err(|e| match e.raw_os_error() {
                Some(libc::ELOOP) => said(e, "it is a symbolic link, not a namespace `ip netns add` made; "),
                Some(libc::ENOENT) => said(e, &format!("no such namespace (create it with `ip netns add {name}`); ")),
                _ => said(e, ""),
            })?;
    // SAFETY: `fd` was just opened and is owned by nobody else.
    let f = unsafe { File::from_raw_fd(fd) };
    // SAFETY: `st` is plain data the call fills; `f` is open.
    let magic = unsafe {
        let mut st: libc::statfs = std::mem::zeroed();
        cvt(libc::fstatfs(f.as_raw_fd(), &mut st)).map_err(|e| said(e, ""))?;
        st.f_type as i64
    };
    if magic != NSFS_MAGIC {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{} is not a network namespace (a file left where `ip netns add {name}` would bind one?); remove it with `ip netns delete {name}` and create the namespace again",
                p.display()
            ),
        ));
    }
    Ok(f)
}

/// Runs `f` on a new thread inside namespace `name` (or in the current one for `None`) and
/// returns its result.
pub fn run_in<T: Send + 'static>(
    name: Option<&str>,
    f: impl FnOnce() -> io::Result<T> + Send + 'static,
) -> io::Result<T> {
    let target = name.map(open).transpose()?;
    std::thread::spawn(move || {
        if let Some(ns) = target {
            // SAFETY: `ns` is an open namespace file; setns affects only this thread, which
            // exits when `f` returns.
            cvt(unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) })?;
        }
        f()
    })
    .join()
    .map_err(|_| io::Error::other("a thread working in a network namespace panicked"))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_is_one_component_as_ip_netns_takes_it() {
        for ok in ["blue", "sluice-lab-g1", ".hidden", "a..b", "a b", &"n".repeat(255)] {
            assert!(check_name(ok).is_ok(), "{ok:?}");
        }
        for bad in ["", ".", "..", "../../tmp/x", "/proc/1/ns/net", "a/b", "a\0b", &"n".repeat(256)] {
            let e = check_name(bad).unwrap_err();
            assert!(
                matches!(e, crate::Error::NetnsName { .. }) && e.to_string().contains("not a path"),
                "{bad:?}: {e}"
            );
            assert!(!exists(bad), "{bad:?}");
        }
    }

    /// A FIFO reached through a name that leaves /run/netns would have held `run_in` (and
    /// the daemon's control thread behind it) in `open(2)` forever: refused at once now.
    #[test]
    fn a_path_out_of_the_namespace_directory_is_refused_without_blocking() {
        let dir = crate::fs::TempDir::new("sluice-netns").unwrap();
        let fifo = dir.path().join("fifo");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: `c` is NUL-terminated.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "{}", io::Error::last_os_error());
        let name = format!("../..{}", fifo.display());
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(run_in(Some(&name), || Ok(())).map_err(|e| e.to_string()));
        });
        let r = rx.recv_timeout(std::time::Duration::from_secs(10)).expect("run_in blocked opening a FIFO");
        let e = r.expect_err("a path taken as a namespace name");
        assert!(e.contains("not a path"), "{e}");
    }

    /// What `ip netns` leaves when it cannot bind a namespace (an empty file), and a link
    /// someone put there, are refused by what they are.
    #[test]
    #[ignore = "system tier: needs root and /run/netns; scripts/test.sh runs it"]
    fn only_a_namespace_file_is_entered_and_never_through_a_link() {
        assert!(
            crate::user::euid() == 0 && std::path::Path::new(NETNS_DIR).is_dir(),
            "needs root and {NETNS_DIR} (`ip netns add` makes it): run scripts/test.sh as root, or leave out --include-ignored"
        );
        let tag = format!("sluice-test-{}", std::process::id());
        let (file, link) = (format!("{tag}-file"), format!("{tag}-link"));
        struct Gone(PathBuf);
        impl Drop for Gone {
            fn drop(&mut self) {
                let _ = std::fs::remove_file(&self.0);
            }
        }
        let _file = Gone(path(&file));
        let _link = Gone(path(&link));
        std::fs::OpenOptions::new().write(true).create_new(true).open(path(&file)).unwrap();
        std::os::unix::fs::symlink("/proc/self/ns/net", path(&link)).unwrap();
        let e = run_in(Some(&file), || Ok(())).unwrap_err().to_string();
        assert!(e.contains("is not a network namespace"), "{e}");
        let e = run_in(Some(&link), || Ok(())).unwrap_err().to_string();
        assert!(e.contains("symbolic link"), "{e}");
        // A namespace `ip netns add` made is entered.
        let ns = format!("{tag}-ns");
        let added = std::process::Command::new("ip").args(["netns", "add", &ns]).status().unwrap();
        assert!(added.success());
        let inside = run_in(Some(&ns), || std::fs::read_link("/proc/thread-self/ns/net"));
        let _ = std::process::Command::new("ip").args(["netns", "delete", &ns]).status();
        let here = std::fs::read_link("/proc/thread-self/ns/net").unwrap();
        assert_ne!(inside.unwrap(), here, "run_in entered namespace {ns}");
    }
}

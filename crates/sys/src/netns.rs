//! Running a piece of work inside a network namespace, named (`ip netns` names, bound under
//! /run/netns) or given by the path of its file (`/proc/PID/ns/net`, `/run/netns/cni-…`, as
//! container runtimes hand them out). `setns` changes only the calling thread, so the work
//! runs on a short-lived thread of its own and never on a thread that serves anything else.
//!
//! A name is what `ip netns` accepts — one path component, never a path — and is checked
//! by [`check_name`] before anything is looked up; its file is opened by [`open`] without
//! following a link. A path is absolute, without `..` or a NUL ([`check`]), and may be a
//! link (`/proc/PID/ns/net` is one). Either is opened without blocking (a FIFO planted
//! there would hold the caller forever) and the descriptor — not the path, which someone
//! could swap meanwhile — must be a namespace (nsfs) of a network (`NS_GET_NSTYPE`) before
//! anything enters it.

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

/// `NS_GET_NSTYPE` (linux/nsfs.h: `_IO(0xb7, 0x3)`): the kind of namespace a file is.
const NS_GET_NSTYPE: libc::c_ulong = 0xb703;

/// The longest namespace path accepted (`PATH_MAX` less its NUL).
const PATH_MAX: usize = 4095;

/// True if `ns` names a namespace by its path (an absolute one) rather than by name.
pub fn is_path(ns: &str) -> bool {
    ns.starts_with('/')
}

/// Checks a namespace given by name ([`check_name`]) or by an absolute path to its file:
/// at most 4095 bytes, no NUL byte, no `..` component. What the path leads to is checked
/// when it is opened ([`open`]).
pub fn check(ns: &str) -> Result<(), String> {
    if !is_path(ns) {
        return check_name(ns).map_err(|e| e.to_string());
    }
    if ns.len() > PATH_MAX || ns.contains('\0') || ns.split('/').any(|c| c == "..") {
        return Err(format!(
            "network namespace {ns:?} is not a path sluice enters: write an absolute path without `..` or a NUL byte, at most {PATH_MAX} bytes (e.g. /proc/PID/ns/net or /run/netns/NAME), or a name under {NETNS_DIR}"
        ));
    }
    Ok(())
}

/// Path of the namespace: the named one under /run/netns, or `ns` itself when it is a
/// path (for a namespace [`check`] passed).
pub fn path(ns: &str) -> PathBuf {
    if is_path(ns) { PathBuf::from(ns) } else { PathBuf::from(NETNS_DIR).join(ns) }
}

/// True if a namespace of that name (or at that path) exists; false for one [`check`]
/// refuses.
pub fn exists(ns: &str) -> bool {
    check(ns).is_ok() && path(ns).exists()
}

/// Opens namespace `ns` (a name, or an absolute path: see the module's doc) for `setns`:
/// checked, opened `O_RDONLY|O_NONBLOCK|O_CLOEXEC` (and `O_NOFOLLOW` for a name), and the
/// descriptor checked to be a namespace file (nsfs) of a network namespace.
pub fn open(ns: &str) -> io::Result<File> {
    if is_path(ns) {
        check(ns).map_err(|m| io::Error::new(io::ErrorKind::InvalidInput, m))?;
        return open_checked(ns, 0);
    }
    check_name(ns).map_err(|m| io::Error::new(io::ErrorKind::InvalidInput, m))?;
    open_checked(ns, libc::O_NOFOLLOW)
}

/// Opens namespace `name`'s file with the extra flags `flags` and checks the descriptor.
fn open_checked(name: &str, flags: i32) -> io::Result<File> {
    let p = path(name);
    let said = |e: io::Error, what: &str| {
        io::Error::new(e.kind(), format!("cannot open network namespace {name:?} ({}): {what}{e}", p.display()))
    };
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL byte in a namespace name"))?;
    // SAFETY: `c` is NUL-terminated; the result is checked and owned below.
    let fd = cvt(unsafe { libc::open(c.as_ptr(), libc::O_RDONLY | libc::O_NONBLOCK | libc::O_CLOEXEC | flags) })
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => said(e, "it is a symbolic link, not a namespace `ip netns add` made; "),
            Some(libc::ENOENT) if is_path(name) => said(e, "no such file (has its process or container ended?); "),
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
    if magic != NSFS_MAGIC && is_path(name) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{} is not a network namespace (not a namespace file); give /proc/PID/ns/net or a file `ip netns add` bound",
                p.display()
            ),
        ));
    }
    if magic != NSFS_MAGIC {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{} is not a network namespace (a file left where `ip netns add {name}` would bind one?); remove it with `ip netns delete {name}` and create the namespace again",
                p.display()
            ),
        ));
    }
    // SAFETY: NS_GET_NSTYPE takes no argument and returns the namespace's CLONE_NEW* type.
    let kind = cvt(unsafe { libc::ioctl(f.as_raw_fd(), NS_GET_NSTYPE) }).map_err(|e| said(e, "asking its kind: "))?;
    if kind != libc::CLONE_NEWNET {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is a namespace of another kind, not a network namespace (use …/ns/net)", p.display()),
        ));
    }
    Ok(f)
}

/// Moves the calling thread into namespace `ns` (a file [`open`] returned), for good: for a
/// thread of its own that works there from then on (one that starts children there, whose
/// parent-death signal is tied to the thread that forked them).
pub fn enter(ns: &File) -> io::Result<()> {
    // SAFETY: `ns` is an open namespace file; setns affects only the calling thread.
    cvt(unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) }).map(drop)
}

/// Runs `f` on a new thread inside namespace `name` (or in the current one for `None`) and
/// returns its result.
pub fn run_in<T: Send + 'static>(
    name: Option<&str>,
    f: impl FnOnce() -> io::Result<T> + Send + 'static,
) -> io::Result<T> {
    let target = name.map(open).transpose()?;
    run_in_file(target, f)
}

/// Runs `f` on a new thread inside the namespace of `ns`, a file [`open`] returned (or in
/// the current one for `None`), and returns its result: for work that must enter the
/// namespace that was checked, not whatever its path leads to later.
pub fn run_in_file<T: Send + 'static>(
    ns: Option<File>,
    f: impl FnOnce() -> io::Result<T> + Send + 'static,
) -> io::Result<T> {
    let target = ns;
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

    #[test]
    fn a_path_is_absolute_without_dot_dot_and_a_name_is_not_a_path() {
        for ok in ["/proc/1/ns/net", "/run/netns/cni-1234", "/var/run/netns/x", "blue"] {
            assert!(check(ok).is_ok(), "{ok:?}");
        }
        for bad in ["/run/netns/../../tmp/x", "/a\0b", &format!("/{}", "n".repeat(4095)), "a/b", ""] {
            assert!(check(bad).is_err(), "{bad:?}");
            assert!(!exists(bad), "{bad:?}");
        }
        assert_eq!(path("/proc/1/ns/net"), PathBuf::from("/proc/1/ns/net"));
        assert_eq!(path("blue"), PathBuf::from("/run/netns/blue"));
    }

    /// A path is entered only when what it leads to is a network namespace: a runtime's
    /// `/proc/PID/ns/net` (a link) is, another kind of namespace or a plain file is not.
    #[test]
    fn a_path_is_entered_only_when_it_leads_to_a_network_namespace() {
        // (Opened only: entering it needs root, which the pure tier does not have.)
        open("/proc/self/ns/net").unwrap();
        let e = run_in(Some("/proc/self/ns/uts"), || Ok(())).unwrap_err().to_string();
        assert!(e.contains("another kind"), "{e}");
        let e = run_in(Some("/proc/self/status"), || Ok(())).unwrap_err().to_string();
        assert!(e.contains("is not a network namespace"), "{e}");
        let e = run_in(Some("/nonexistent/ns/net"), || Ok(())).unwrap_err().to_string();
        assert!(e.contains("no such file"), "{e}");
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

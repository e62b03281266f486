//! The host-local rendezvous registry: files under the runtime directory that every
//! network namespace of the host sees (docs/architecture.md, "Capability", and "The fast
//! path's trust boundary").
//!
//! - `smc/listen/KEY_PORT.NETNS.PID` — a sluice listener (KEY: the address, `any4` or
//!   `any6` for wildcards); its side door is `smc/door/PID.sock`. The file's owner is the
//!   listener's user; the client checks the door's credentials against it. It holds the
//!   buffer sizes the listener receives with (`r=BYTES rmax=BYTES`), which the client
//!   makes the rings it writes with.
//!
//! Entries are hints, never proof: any allowed user can write one. Every file is created
//! new (`O_EXCL | O_NOFOLLOW`), so a planted file or symlink cannot make a program write
//! elsewhere; the directories are sticky, so only an entry's owner removes it.

use std::net::{IpAddr, SocketAddr};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use sluice_smc::access::{self, Policy};

use crate::sys;

fn dir(sub: &str) -> PathBuf {
    crate::run_dir().join("smc").join(sub)
}

/// Who may use the fast path here, read once from the door directory (`None`: no layout,
/// or one this process must not trust — then the fast path stays off).
pub fn policy() -> Option<Policy> {
    static P: OnceLock<Option<Policy>> = OnceLock::new();
    *P.get_or_init(|| {
        let m = std::fs::metadata(dir("door")).ok()?;
        Policy::from_dir(m.uid(), m.gid(), m.mode(), sys::euid()).ok()
    })
}

fn key(ip: IpAddr) -> String {
    if ip.is_unspecified() {
        return if ip.is_ipv4() { "any4".into() } else { "any6".into() };
    }
    ip.to_string().replace(':', "-")
}

/// The side door of process `pid`.
pub fn door_path(pid: u32) -> PathBuf {
    dir("door").join(access::door_name(pid))
}

/// Creates `path` new with `content`. A leftover of ours (a process that had our pid)
/// is replaced; anyone else's entry is left alone and the call fails.
pub fn create_entry(path: &Path, content: &[u8]) -> Option<()> {
    use std::io::Write;
    for _ in 0..2 {
        match sys::create_new(path, access::ENTRY_MODE) {
            Ok(mut f) => return f.write_all(content).ok(),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                let m = std::fs::symlink_metadata(path).ok()?;
                if m.uid() != sys::euid() {
                    return None;
                }
                std::fs::remove_file(path).ok()?;
            }
            Err(_) => return None,
        }
    }
    None
}

/// Announces a listener on `addr`; returns the entry to remove when it closes.
pub fn register_listener(addr: SocketAddr) -> Option<PathBuf> {
    policy()?;
    let addr_port = format!("{}_{}", key(addr.ip()), addr.port());
    let p = dir("listen").join(access::listener_name(&addr_port, sys::netns_inode(), sys::pid()));
    let (r, _) = crate::settings();
    let (rmax, _) = crate::maxima();
    create_entry(&p, format!("r={r} rmax={rmax}\n").as_bytes())?;
    Some(p)
}

/// A registry entry: a sluice listener that may be behind an address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    /// The listener's process (its door is `door/PID.sock`).
    pub pid: u32,
    /// The network namespace it says it is in.
    pub netns: u64,
    /// The entry file's owner: the user the door must belong to.
    pub owner: u32,
    /// The receive buffer the listener starts with, and the most it grows to (what the
    /// entry says; only sizes: a liar gets rings of its choosing within the limits).
    pub r: usize,
    pub rmax: usize,
}

/// The sizes an entry's file holds (`r=BYTES rmax=BYTES`); this process's own when it
/// says none.
fn sizes_of(path: &Path) -> (usize, usize) {
    let mut out = (crate::settings().0, crate::maxima().0);
    // A regular file of at most a line (the caller checked the type; O_NONBLOCK against a
    // FIFO swapped in meanwhile).
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let mut text = String::new();
    if let Ok(f) = std::fs::OpenOptions::new().read(true).custom_flags(sys::O_NOFOLLOW | 0o4000).open(path) {
        let _ = f.take(128).read_to_string(&mut text);
    }
    for kv in text.split_whitespace() {
        match kv.split_once('=').map(|(k, v)| (k, v.parse::<usize>())) {
            Some(("r", Ok(v))) => out.0 = v,
            Some(("rmax", Ok(v))) => out.1 = v,
            _ => {}
        }
    }
    out
}

/// What the last look at `smc/listen/` found, and the directory's change time then: the
/// directory is read again only when an entry came or went. Its change time is asked of
/// a descriptor of the directory kept open (no path walked per `connect`), opened again
/// by name each second and whenever the one it holds was removed.
#[derive(Default)]
struct Seen {
    stamp: Option<(i64, i64)>,
    entries: Vec<Named>,
    dir: Option<Held>,
}

/// A listener entry as its name tells it; the file itself is looked at only when a
/// `connect` goes to its address (then once until the directory changes).
struct Named {
    addr_port: String,
    netns: u64,
    pid: u32,
    path: PathBuf,
    /// What the file says: `None` until looked at, then the entry (`None` when it is no
    /// listener's: not a regular file, or its process gone).
    looked: Option<Option<Entry>>,
}

impl Named {
    /// The entry, looking at its file the first time.
    fn entry(&mut self) -> Option<Entry> {
        if self.looked.is_none() {
            self.looked = Some(self.look());
        }
        self.looked.flatten()
    }

    fn look(&self) -> Option<Entry> {
        let m = self.path.symlink_metadata().ok().filter(|m| m.file_type().is_file())?;
        if !sys::alive(self.pid) {
            // Only its owner (or root) can remove it; others just pass it by.
            let _ = std::fs::remove_file(&self.path);
            return None;
        }
        let (r, rmax) = sizes_of(&self.path);
        Some(Entry { pid: self.pid, netns: self.netns, owner: m.uid(), r, rmax })
    }
}

/// The listener directory, open (`O_PATH`, among the library's high descriptors).
struct Held {
    file: std::fs::File,
    /// Device and inode it had when opened: a descriptor that no longer shows them was
    /// closed by the program and its number reused — not ours to use or close.
    id: (u64, u64),
    opened: std::time::Instant,
}

impl Held {
    fn open() -> Option<Held> {
        use std::os::fd::{FromRawFd, IntoRawFd};
        use std::os::unix::fs::OpenOptionsExt;
        const O_PATH: i32 = 0o10_000_000;
        let f =
            std::fs::OpenOptions::new().read(true).custom_flags(O_PATH | sys::O_NOFOLLOW).open(dir("listen")).ok()?;
        // SAFETY: a descriptor just opened, moved among ours and owned by the File again.
        let file = unsafe { std::fs::File::from_raw_fd(sys::move_high(f.into_raw_fd())) };
        let m = file.metadata().ok()?;
        Some(Held { file, id: (m.dev(), m.ino()), opened: std::time::Instant::now() })
    }

    /// Its metadata, if the descriptor is still the directory it opened.
    fn meta(&self) -> Option<std::fs::Metadata> {
        self.file.metadata().ok().filter(|m| (m.dev(), m.ino()) == self.id)
    }

    /// Lets go of it: closed if it is still ours.
    fn release(self) {
        if self.meta().is_none() {
            std::mem::forget(self.file);
        }
    }
}

fn seen() -> &'static std::sync::Mutex<Seen> {
    static S: std::sync::OnceLock<std::sync::Mutex<Seen>> = std::sync::OnceLock::new();
    S.get_or_init(Default::default)
}

/// The listener directory's metadata, through `s`'s descriptor of it.
fn listen_dir_meta(s: &mut Seen) -> Option<std::fs::Metadata> {
    if let Some(h) = &s.dir
        && h.opened.elapsed() < std::time::Duration::from_secs(1)
        && let Some(m) = h.meta()
        && m.nlink() > 0
    {
        return Some(m);
    }
    if let Some(h) = s.dir.take() {
        h.release();
    }
    let h = Held::open()?;
    let m = h.meta();
    s.dir = Some(h);
    m
}

/// Sluice listeners that may be behind `dst`, those claiming our own namespace first.
pub fn listeners_for(dst: SocketAddr) -> Vec<Entry> {
    if policy().is_none() {
        return Vec::new();
    }
    let mut g = seen().lock().unwrap_or_else(|p| p.into_inner());
    let Some(m) = listen_dir_meta(&mut g) else { return Vec::new() };
    let stamp = (m.mtime(), m.mtime_nsec());
    if g.stamp != Some(stamp) {
        g.stamp = Some(stamp);
        g.entries = read_listen_dir();
    }
    let port = dst.port();
    let mut keys = vec![format!("{}_{port}", key(dst.ip()))];
    if dst.is_ipv4() {
        keys.push(format!("any4_{port}"));
    }
    // A dual-stack IPv6 wildcard listener also takes IPv4 connections.
    keys.push(format!("any6_{port}"));
    let here = sys::netns_inode();
    // Those claiming our own namespace first. Entries are anyone's to write: a few doors
    // are tried (one try per door, each costing the connecting program a kernel lookup or
    // two), and a few files looked at per `connect` (what a file says is kept until the
    // directory changes).
    let mut order: Vec<usize> = (0..g.entries.len()).filter(|&i| keys.contains(&g.entries[i].addr_port)).collect();
    order.sort_by_key(|&i| g.entries[i].netns != here);
    let mut looks = 0;
    let mut out: Vec<Entry> = Vec::new();
    for i in order {
        if out.len() == MAX_TRIED {
            break;
        }
        let n = &mut g.entries[i];
        if n.looked.is_none() {
            if looks == MAX_LOOKS {
                continue;
            }
            looks += 1;
        }
        if let Some(e) = n.entry()
            && !out.iter().any(|o| (o.pid, o.owner) == (e.pid, e.owner))
            && sys::alive(e.pid)
        {
            out.push(e);
        }
    }
    out
}

/// The most registry entries one `connect` tries (its own namespace's first).
const MAX_TRIED: usize = 8;
/// The most entry files one `connect` looks at for the first time.
const MAX_LOOKS: usize = 64;

/// Every listener entry there is, as their names tell (at most 65,536: the directory is
/// read again whenever an entry comes or goes, by every client that connects next).
fn read_listen_dir() -> Vec<Named> {
    let Ok(rd) = std::fs::read_dir(dir("listen")) else { return Vec::new() };
    let mut out = Vec::new();
    for e in rd.flatten().take(65536) {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some((addr_port, netns, pid)) = access::parse_listener_name(&name) else { continue };
        out.push(Named { addr_port: addr_port.to_string(), netns, pid, path: e.path(), looked: None });
    }
    out
}

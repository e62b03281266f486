//! This process's table of its connections on shared memory, for `sluice smc info`: the
//! file `smc/conn/PID` (mode 0644, like the registry's entries), mapped once, with one
//! fixed-width line of JSON per live connection ([`LINE`] bytes, spaces when free). A
//! connection writes its line when it moves and blanks it when it ends: no system call per
//! connection. The file goes at a normal exit; `sluice smc run` and `info` sweep the files
//! of processes a signal killed.

use std::sync::{Arc, Mutex, OnceLock};

use crate::sys::{self, Shm};

/// Bytes of one line (the last one a newline).
pub const LINE: usize = 192;
/// Lines in a table: connections past this many at once are not listed.
const LINES: usize = 2048;

struct Table {
    pid: u32,
    shm: Shm,
    free: Mutex<Vec<usize>>,
}

/// A connection's line; blanked when dropped (by the process that wrote it).
pub struct Line {
    table: Arc<Table>,
    at: usize,
}

fn table() -> Option<Arc<Table>> {
    static T: OnceLock<Mutex<Option<Arc<Table>>>> = OnceLock::new();
    let m = T.get_or_init(|| Mutex::new(None));
    let mut g = m.lock().unwrap_or_else(|p| p.into_inner());
    let me = sys::pid();
    if let Some(t) = g.as_ref().filter(|t| t.pid == me) {
        return Some(t.clone());
    }
    // (A forked child makes its own: the inherited one is its parent's.)
    let path = path_of(me);
    let mut blank = vec![b' '; LINE * LINES];
    blank.iter_mut().skip(LINE - 1).step_by(LINE).for_each(|b| *b = b'\n');
    crate::registry::create_entry(&path, &blank)?;
    let f = std::fs::OpenOptions::new().read(true).write(true).custom_flags(sys::O_NOFOLLOW).open(&path).ok()?;
    // Our own file, just made (a link swapped in meanwhile is not followed).
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let m = f.metadata().ok()?;
    if !m.is_file() || m.uid() != sys::euid() || m.len() != (LINE * LINES) as u64 {
        return None;
    }
    let shm = Shm::map_borrowed(std::os::fd::AsRawFd::as_raw_fd(&f), LINE * LINES).ok()?;
    let t = Arc::new(Table { pid: me, shm, free: Mutex::new((0..LINES).rev().collect()) });
    *g = Some(t.clone());
    crate::remove_at_exit();
    Some(t)
}

/// This process's table file.
pub fn path_of(pid: u32) -> std::path::PathBuf {
    crate::run_dir().join("smc").join("conn").join(pid.to_string())
}

impl Table {
    fn put(&self, at: usize, text: &[u8]) {
        let mut line = [b' '; LINE];
        let n = text.len().min(LINE - 1);
        line[..n].copy_from_slice(&text[..n]);
        line[LINE - 1] = b'\n';
        // SAFETY: line `at` < LINES lies inside the mapping, which lives as long as `self`;
        // a reader racing the copy may see a torn line, which it cannot parse and skips.
        unsafe { std::ptr::copy_nonoverlapping(line.as_ptr(), self.shm.ptr.add(at * LINE), LINE) };
    }
}

/// Writes a connection's line: role, addresses, buffer sizes, since when.
pub fn add(
    server: bool,
    local: Option<std::net::SocketAddr>,
    peer: Option<std::net::SocketAddr>,
    rmem: usize,
    tmem: usize,
) -> Option<Line> {
    let t = table()?;
    let at = t.free.lock().unwrap_or_else(|p| p.into_inner()).pop()?;
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let show = |a: Option<std::net::SocketAddr>| a.map_or_else(String::new, |a| a.to_string());
    let text = format!(
        "{{\"pid\":{},\"role\":\"{}\",\"local\":\"{}\",\"peer\":\"{}\",\"rmem\":{rmem},\"tmem\":{tmem},\"since\":{since}}}",
        t.pid,
        if server { "server" } else { "client" },
        show(local),
        show(peer),
    );
    t.put(at, text.as_bytes());
    Some(Line { table: t, at })
}

impl Drop for Line {
    fn drop(&mut self) {
        if sys::pid() == self.table.pid {
            self.table.put(self.at, b"");
            self.table.free.lock().unwrap_or_else(|p| p.into_inner()).push(self.at);
        }
    }
}

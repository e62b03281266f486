//! A moved connection carried across `exec` to the program this process runs
//! (docs/architecture.md, "A connection handed to another program").
//!
//! inetd-style servers — git's daemon, OpenSSH's sshd — accept, fork, put the connection
//! on the child's standard input and output and `exec` another program. The library's
//! state does not survive `exec`; without this, the new program would read the doorbell
//! socket behind its descriptor while the peer's bytes wait in a ring nobody maps.
//!
//! Before the `exec` ([`prepare`]), every connection a surviving descriptor (one without
//! `FD_CLOEXEC`) names is described in the new program's environment
//! (`SLUICE_SMC_CARRY`), and the descriptors it needs besides the program's own — the TCP
//! socket, the peer's doorbell end, the arena's memfd and the memfd of its side's words —
//! are duplicated without close-on-exec. The library in the new program takes them over
//! in its constructor ([`adopt`]), after the checks a server makes of what a client sends.

use std::ffi::{CStr, CString, c_char, c_int};
use std::sync::Arc;

use sluice_smc::slot::Geometry;

use crate::conn::{Conn, Role, Side};
use crate::{MAX_FD, real, sys};

/// The variable that describes the connections carried into a program.
pub const VAR: &str = "SLUICE_SMC_CARRY";

/// Connections carried at most (the variable stays short).
const MAX_CARRIED: usize = 64;

/// Descriptors a carried connection's record names at most.
const MAX_NAMES: usize = 16;

/// What `exec` runs the new program with: its environment, and the descriptors made for
/// it (closed again if the `exec` fails).
pub struct Prepared {
    _env: Vec<CString>,
    ptrs: Vec<*const c_char>,
    dups: Vec<c_int>,
}

impl Prepared {
    /// The new program's environment, NULL-terminated.
    pub fn envp(&self) -> *const *const c_char {
        self.ptrs.as_ptr()
    }

    /// The `exec` failed: the descriptors made for the new program go. (Never marked the
    /// library's: after a `vfork` the marks are the parent's.)
    pub fn failed(self) {
        for fd in &self.dups {
            // SAFETY: descriptors `prepare` made.
            unsafe { real::close(*fd) };
        }
    }
}

/// A duplicate of `fd` that survives `exec` (kept in `dups`); -1 if none.
fn inheritable(fd: c_int, dups: &mut Vec<c_int>) -> c_int {
    let n = sys::dup_high_inheritable(fd);
    if n >= 0 {
        dups.push(n);
    }
    n
}

/// Whether descriptor `fd` survives `exec`.
fn survives(fd: c_int) -> bool {
    // SAFETY: F_GETFD reads the descriptor's flags.
    let fl = unsafe { real::fcntl(fd, sys::F_GETFD, 0) };
    fl >= 0 && fl & 1 == 0
}

/// The connections named by descriptors that survive `exec`, each with those descriptors
/// (in order). In a `vfork`ed child the library's table is the parent's — the child's
/// `dup2` of a connection onto its standard input went unrecorded, and its `close_range`
/// closed what the table names — so there each open descriptor is matched by the file
/// it names (a connection's descriptors all name its socket pair's end).
fn surviving(vforked: bool) -> Vec<(Arc<Conn>, Vec<c_int>)> {
    if !vforked {
        return crate::by_connection(true, survives);
    }
    let conns = crate::by_connection(true, |_| true);
    let mut open = sys::open_fds();
    open.sort_unstable();
    let mut out: Vec<(Arc<Conn>, Vec<c_int>)> = Vec::new();
    for fd in open.into_iter().filter(|&fd| !sys::is_own(fd) && survives(fd) && sys::is_stream(fd, &[sys::AF_UNIX])) {
        let Some((_, ino)) = sys::file_id(fd) else { continue };
        let Some((c, _)) = conns.iter().find(|(c, _)| c.app_ino == Some(ino)) else { continue };
        match out.iter_mut().find(|(e, _)| Arc::ptr_eq(e, c)) {
            Some((_, fds)) => fds.push(fd),
            None => out.push((c.clone(), vec![fd])),
        }
    }
    out
}

/// Before an `exec` with environment `envp` (NULL-terminated; may be null): `None` when
/// no connection goes along (the `exec` runs as asked), else the environment to run the
/// new program with; an errno when a connection that must go along cannot (too many, or
/// no descriptor left for it), so that the `exec` fails rather than the new program.
pub fn prepare(envp: *const *const c_char) -> Result<Option<Prepared>, c_int> {
    let vforked = sys::vforked();
    if vforked {
        // Its own descriptors are not in the library's table (which is the parent's): a
        // pending connection cannot be decided here, so the `exec` fails rather than
        // start a program that could not read it.
        if surviving(true).iter().any(|(c, _)| c.is_pending()) {
            return Err(sys::EAGAIN);
        }
    } else {
        // A pending connection is decided first, as for `dup`; one that went back to TCP
        // is plain TCP's, and goes as it is.
        for (c, fds) in crate::by_connection(true, survives) {
            if c.is_pending() {
                crate::settle(fds[0]);
            }
        }
    }
    // The connections named by descriptors that survive, each with those descriptors.
    let carried: Vec<_> = surviving(vforked).into_iter().filter(|(c, _)| !c.is_pending()).collect();
    if carried.len() > MAX_CARRIED || carried.iter().any(|(_, fds)| fds.len() > MAX_NAMES) {
        return Err(sys::E2BIG);
    }
    if carried.is_empty() {
        return Ok(None);
    }
    let mut dups = Vec::new();
    let mut records = Vec::new();
    // (The kernel's answer: after a `vfork` the library's cached pid is the parent's.)
    let me = sys::pid_now();
    for (c, fds) in &carried {
        let (arena, side, shut) = c.carried_parts();
        let mut made = Vec::new();
        let place = side.place();
        let (side_fd, side_off) = place.unwrap_or((-1, 0));
        let tcp = inheritable(c.tcp_fd, &mut made);
        let bell = inheritable(c.peer_bell, &mut made);
        let memfd = inheritable(arena.memfd(), &mut made);
        let side = inheritable(side_fd, &mut made);
        dups.extend(made);
        if place.is_none() || tcp < 0 || bell < 0 || memfd < 0 || side < 0 {
            // SAFETY: descriptors made here (never marked: see `Prepared::failed`).
            dups.iter().for_each(|&d| unsafe {
                real::close(d);
            });
            return Err(sys::EMFILE);
        }
        if vforked {
            // The parent runs on as soon as this child's `exec` succeeds and may close its
            // copy at once (`Popen(…, stdin=conn)`, then `conn.close()`): the child is named
            // a holder now — the table is shared memory, not the parent's private state —
            // or the parent's close would end the connection before the new program names
            // itself. (If the `exec` fails, the entry names a process without it: let go.)
            c.name_this_holder();
        }
        let g = arena.geometry;
        let names: Vec<String> = fds.iter().map(|f| f.to_string()).collect();
        records.push(format!(
            "{me}:{}:{}:{tcp}:{bell}:{memfd}:{side}:{side_off}:{}:{}:{}:{}:{}:{}:{}:{}",
            if c.role == Role::Server { 's' } else { 'c' },
            names.join("/"),
            c.slot,
            c.generation,
            g.slots,
            g.cs_area,
            g.sc_area,
            g.cs_window,
            g.sc_window,
            u8::from(shut.0) | (u8::from(shut.1) << 1),
        ));
    }
    let env = environment(envp, &records.join(";"));
    let mut ptrs: Vec<*const c_char> = env.iter().map(|v| v.as_ptr()).collect();
    ptrs.push(std::ptr::null());
    Ok(Some(Prepared { _env: env, ptrs, dups }))
}

/// `envp` with the variable set to `records`, and with what loads the library in the new
/// program (`LD_PRELOAD`, `SLUICE_SMC`, `SLUICE_RUN_DIR`, as this program got them) where
/// `envp` left it out — and the library in front of an `LD_PRELOAD` of the program's own.
fn environment(envp: *const *const c_char, records: &str) -> Vec<CString> {
    let mut env: Vec<CString> = Vec::new();
    let prefix = format!("{VAR}=");
    let mut i = 0;
    while !envp.is_null() {
        // SAFETY: `envp` is a NULL-terminated array of C strings (exec's contract).
        let p = unsafe { *envp.add(i) };
        if p.is_null() || i >= 1 << 20 {
            break;
        }
        i += 1;
        // SAFETY: as above: a NUL-terminated string.
        let v = unsafe { CStr::from_ptr(p) };
        if !v.to_bytes().starts_with(prefix.as_bytes()) {
            env.push(v.to_owned());
        }
    }
    for (name, value) in crate::loaded_by() {
        let head = format!("{name}=");
        match env.iter().position(|v| v.to_bytes().starts_with(head.as_bytes())) {
            None => {
                if let Ok(v) = CString::new(format!("{head}{value}")) {
                    env.push(v);
                }
            }
            Some(i) if *name == "LD_PRELOAD" => {
                // The program's own preload list: the library goes first if it is not in it.
                let theirs = String::from_utf8_lossy(&env[i].to_bytes()[head.len()..]).into_owned();
                let ours: Vec<&str> = value.split([':', ' ']).filter(|l| l.contains("libsluice_smc")).collect();
                if !ours.is_empty()
                    && !theirs.split([':', ' ']).any(|l| ours.contains(&l))
                    && let Ok(v) = CString::new(format!("{head}{}:{theirs}", ours.join(":")))
                {
                    env[i] = v;
                }
            }
            Some(_) => {}
        }
    }
    if !records.is_empty()
        && let Ok(v) = CString::new(format!("{prefix}{records}"))
    {
        env.push(v);
    }
    env
}

/// In the constructor of a program run with connections: takes each over, and takes
/// the variable out of the environment (the program's own children do not see it).
pub fn adopt(value: &str) {
    for record in value.split(';').take(MAX_CARRIED) {
        adopt_one(record);
    }
}

fn adopt_one(record: &str) -> Option<()> {
    let all: Vec<&str> = record.split(':').collect();
    // Made by this very process before its `exec` (which keeps the pid): a record that
    // came down from further up — through a program the library was not loaded into —
    // names descriptors that are not the library's, and is left alone.
    if all.len() != 16 || all[0].parse::<u32>().ok() != Some(sys::pid_now()) {
        return None;
    }
    let f = &all[1..];
    let role = match f[0] {
        "s" => Role::Server,
        "c" => Role::Client,
        _ => return None,
    };
    let num = |i: usize| f[i].parse::<u32>().ok();
    let names: Vec<c_int> = f[1].split('/').take(MAX_NAMES).filter_map(|n| n.parse().ok()).collect();
    let (tcp, bell, memfd, side_fd) = (num(2)? as c_int, num(3)? as c_int, num(4)? as c_int, num(5)? as c_int);
    let side_off = num(6)? as usize;
    let (slot, generation) = (num(7)?, num(8)?);
    let geometry =
        Geometry { slots: num(9)?, cs_area: num(10)?, sc_area: num(11)?, cs_window: num(12)?, sc_window: num(13)? };
    let shut = num(14)?;
    // The program's descriptors must be one connection's end of a socket pair; the
    // library's must be none of them, and each what it says it is.
    let own = [tcp, bell, memfd, side_fd];
    // The four were made for this program by the library before the `exec` (the record is
    // this process's own): whatever is wrong with the rest, they go.
    let close = |fds: &[c_int]| fds.iter().filter(|&&d| d > 2 && !names.contains(&d)).for_each(|&d| sys::close(d));
    let Some(ino) = names.first().and_then(|&n| sys::file_id(n)).map(|(_, ino)| ino) else {
        close(&own);
        return None;
    };
    let fine = names.iter().all(|&n| {
        (0..MAX_FD as c_int).contains(&n)
            && !own.contains(&n)
            && sys::is_stream(n, &[sys::AF_UNIX])
            && sys::file_id(n).map(|(_, i)| i) == Some(ino)
    }) && crate::is_tcp(tcp)
        && sys::is_stream(bell, &[sys::AF_UNIX])
        && own.iter().all(|&d| d > 2);
    if !fine {
        close(&own);
        return None;
    }
    // From here each of the four is taken over, or closed.
    let Ok(arena) = crate::door::child_arena(memfd, geometry) else {
        close(&[tcp, bell, side_fd]);
        return None;
    };
    let Ok((cs, sc)) = arena.attach_rings(slot) else {
        close(&[tcp, bell, side_fd]);
        return None;
    };
    let (rx, tx) = if role == Role::Server { (cs, sc) } else { (sc, cs) };
    let Some(side) = Side::carried(side_fd, side_off) else {
        close(&[tcp, bell]);
        return None;
    };
    let Some(mut conn) = Conn::new(arena, slot, generation, rx, tx, side, sys::own(bell), role, None) else {
        close(&[tcp]);
        return None;
    };
    conn.carried_in((shut & 1 != 0, shut & 2 != 0));
    conn.name_this_holder();
    conn.tcp_fd = sys::move_high(tcp);
    conn.app_ino = Some(ino);
    // SAFETY: F_GETFL reads a descriptor's flags.
    let fl = unsafe { real::fcntl(names[0], sys::F_GETFL, 0) };
    conn.nonblock.store(fl >= 0 && fl & sys::O_NONBLOCK != 0, std::sync::atomic::Ordering::Relaxed);
    let (local, peer) = (sys::sock_addr(conn.tcp_fd, false), sys::sock_addr(conn.tcp_fd, true));
    crate::install(conn, &names, local, peer);
    Some(())
}

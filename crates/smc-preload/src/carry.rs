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
use crate::{MAX_FD, conn_of, marked, real, set_conn, sys};

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

    /// The `exec` failed: the descriptors made for the new program go.
    pub fn failed(self) {
        for fd in &self.dups {
            sys::close(*fd);
        }
    }
}

/// A duplicate of `fd` that survives `exec`, among the library's high numbers; -1 if none.
fn inheritable(fd: c_int, dups: &mut Vec<c_int>) -> c_int {
    const F_DUPFD: c_int = 0;
    // SAFETY: fcntl on a descriptor of ours.
    let n = unsafe { real::fcntl(fd, F_DUPFD, sys::high_base() as usize) };
    if n >= 0 {
        dups.push(n);
    }
    n
}

/// Whether descriptor `fd` survives `exec`.
fn survives(fd: c_int) -> bool {
    const F_GETFD: c_int = 1;
    // SAFETY: F_GETFD reads the descriptor's flags.
    let fl = unsafe { real::fcntl(fd, F_GETFD, 0) };
    fl >= 0 && fl & 1 == 0
}

/// Before an `exec` with environment `envp` (NULL-terminated; may be null): `None` when
/// no connection goes along (the `exec` runs as asked), else the environment to run the
/// new program with.
pub fn prepare(envp: *const *const c_char) -> Option<Prepared> {
    // The connections named by descriptors that survive, each with those descriptors.
    let mut carried: Vec<(Arc<Conn>, Vec<c_int>)> = Vec::new();
    for fd in 0..MAX_FD as c_int {
        if !marked(fd) || !survives(fd) {
            continue;
        }
        // A pending connection is decided first, as for `dup`; one that went back to TCP
        // is plain TCP's, and goes as it is.
        crate::settle(fd);
        let Some(c) = conn_of(fd).filter(|c| !c.is_pending()) else { continue };
        match carried.iter().position(|(k, _)| Arc::ptr_eq(k, &c)) {
            Some(i) if carried[i].1.len() < MAX_NAMES => carried[i].1.push(fd),
            Some(_) => {}
            None if carried.len() < MAX_CARRIED => carried.push((c, vec![fd])),
            None => {}
        }
    }
    if carried.is_empty() {
        return None;
    }
    let mut dups = Vec::new();
    let mut records = Vec::new();
    for (c, fds) in &carried {
        let (arena, side, shut) = c.carried_parts();
        let Some((side_fd, side_off)) = side.place() else { continue };
        let mut made = Vec::new();
        let tcp = inheritable(c.tcp_fd, &mut made);
        let bell = inheritable(c.peer_bell, &mut made);
        let memfd = inheritable(arena.memfd(), &mut made);
        let side = inheritable(side_fd, &mut made);
        if made.len() < 4 {
            made.iter().for_each(|&d| sys::close(d));
            continue;
        }
        dups.extend(made);
        let g = arena.geometry;
        let names: Vec<String> = fds.iter().map(|f| f.to_string()).collect();
        records.push(format!(
            "{}:{}:{tcp}:{bell}:{memfd}:{side}:{side_off}:{}:{}:{}:{}:{}:{}:{}:{}",
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
    Some(Prepared { _env: env, ptrs, dups })
}

/// `envp` with the variable set to `records`, and with what loads the library in the new
/// program (`LD_PRELOAD`, `SLUICE_SMC`, as this program got them) where `envp` left it out.
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
        if !env.iter().any(|v| v.to_bytes().starts_with(head.as_bytes()))
            && let Ok(v) = CString::new(format!("{head}{value}"))
        {
            env.push(v);
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

/// True when `fd` is a socket of `domain` and `SOCK_STREAM`.
fn stream_of(fd: c_int, domain: c_int) -> bool {
    sys::sockopt_int(fd, sys::SOL_SOCKET, sys::SO_TYPE) == Some(sys::SOCK_STREAM)
        && sys::sockopt_int(fd, sys::SOL_SOCKET, sys::SO_DOMAIN) == Some(domain)
}

fn adopt_one(record: &str) -> Option<()> {
    let f: Vec<&str> = record.split(':').collect();
    if f.len() != 15 {
        return None;
    }
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
    let ino = names.first().and_then(|&n| sys::file_id(n)).map(|(_, ino)| ino)?;
    let own = [tcp, bell, memfd, side_fd];
    let fine = names.iter().all(|&n| {
        (0..MAX_FD as c_int).contains(&n)
            && !own.contains(&n)
            && stream_of(n, sys::AF_UNIX)
            && sys::file_id(n).map(|(_, i)| i) == Some(ino)
    }) && crate::is_tcp(tcp)
        && stream_of(bell, sys::AF_UNIX)
        && own.iter().all(|&d| d > 2);
    if !fine {
        // Not what this library makes: nothing is touched.
        return None;
    }
    // From here the four are the library's: each is taken over, or closed.
    let close = |fds: &[c_int]| fds.iter().for_each(|&d| sys::close(d));
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
    let Some(mut conn) = Conn::new(arena, slot, generation, rx, tx, side, bell, role, None) else {
        close(&[tcp]);
        return None;
    };
    conn.carried_in((shut & 1 != 0, shut & 2 != 0));
    conn.tcp_fd = sys::move_high(tcp);
    conn.app_ino = Some(ino);
    const F_GETFL: c_int = 3;
    // SAFETY: F_GETFL reads a descriptor's flags.
    let fl = unsafe { real::fcntl(names[0], F_GETFL, 0) };
    conn.nonblock.store(fl >= 0 && fl & sys::O_NONBLOCK != 0, std::sync::atomic::Ordering::Relaxed);
    let peer = sys::sock_addr(conn.tcp_fd, true);
    let local = sys::sock_addr(conn.tcp_fd, false);
    conn.peer = peer.filter(|_| role == Role::Client);
    conn.settle_in();
    conn.rcvtimeo.store(sys::timeout_ms(conn.tcp_fd, sys::SO_RCVTIMEO), std::sync::atomic::Ordering::Relaxed);
    conn.sndtimeo.store(sys::timeout_ms(conn.tcp_fd, sys::SO_SNDTIMEO), std::sync::atomic::Ordering::Relaxed);
    conn.info = crate::info::add(role == Role::Server, local, peer, conn.sizes.0, conn.sizes.1);
    let c = Arc::new(conn);
    for &n in &names {
        set_conn(n, c.clone());
    }
    Some(())
}

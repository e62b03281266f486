//! Pre-forking servers (docs/architecture.md, "Pre-forking servers"): a listener made by
//! one process and accepted on in a child it forked (nginx's master and workers, apache
//! prefork, gunicorn). Clients propose to the listener's owner — the parent — whose door
//! prepares the connection; the child that accepted it claims it over the parent's
//! *claim channel* and gets the rings, the doorbell ends and the sizes.
//!
//! The channel is a socket pair made at the parent's first `listen`, before any fork:
//! only the parent and the processes forked from it hold it (close-on-exec: a program
//! they run does not), so nobody else can claim. What a claim carries is checked all the
//! same: the accepted TCP socket, whose addresses name the connection and a port the
//! parent listens on; the answer goes back on a socket pair of the claim's own, so two
//! children claiming at once never read each other's answers.

use std::ffi::c_int;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sluice_smc::msg::{Msg, Reason};

use crate::conn::{Conn, Side};
use crate::handshake::{self, Prepared};
use crate::{foreign, sys};

/// This process's claim channel: (the pid that made it, its end, the children's end).
static CHANNEL: Mutex<(u32, c_int, c_int)> = Mutex::new((0, -1, -1));

/// The end of this process's claim channel for the processes it will fork, made (with the
/// thread that serves it) at the first call in this process; -1 if it could not be.
pub fn channel() -> c_int {
    let mut ch = CHANNEL.lock().unwrap_or_else(|p| p.into_inner());
    let me = sys::pid();
    if ch.0 == me {
        return ch.2;
    }
    // (A forked child that listens too gets a channel of its own: its parent's thread
    // did not survive the fork.)
    let Ok((ours, theirs)) = sys::socketpair(sys::SOCK_SEQPACKET) else { return -1 };
    // Children never wait to send: a parent that does not read is a parent not answering.
    sys::set_nonblocking(theirs);
    let started = std::thread::Builder::new().name("sluice-smc-claim".into()).spawn(move || {
        sys::block_signals();
        serve_channel(ours)
    });
    if started.is_err() {
        sys::close(ours);
        sys::close(theirs);
        return -1;
    }
    *ch = (me, ours, theirs);
    theirs
}

fn serve_channel(ours: c_int) {
    let mut buf = [0u8; 256];
    loop {
        let (n, fds) = match sys::recv_with_fds(ours, &mut buf, -1) {
            Ok(x) => x,
            Err(e) if matches!(e.raw_os_error(), Some(sys::EINTR | sys::EAGAIN)) => continue,
            Err(_) => return,
        };
        let Ok(Msg::Claim { token }) = Msg::decode(&buf[..n]) else {
            foreign::release_all(&fds);
            continue;
        };
        // Waiting for the door's handshake can take a while: a thread per claim.
        let work = {
            let fds = fds.clone();
            move || serve_claim(token, &fds)
        };
        if !handshake::spawn_handshake("sluice-smc-hand", work) {
            if let Some(&reply) = fds.first() {
                handshake::decline(reply, token, Reason::NoMemory);
            }
            foreign::release_all(&fds);
        }
    }
}

/// The parent's half of one claim: `fds` are the answer's socket and the child's accepted
/// TCP socket.
fn serve_claim(token: [u8; 16], fds: &[c_int]) {
    let &[reply, tcp] = fds else {
        foreign::release_all(fds);
        return;
    };
    let addrs = (sys::sock_addr(tcp, false), sys::sock_addr(tcp, true));
    let ours = |port: u16| handshake::listening_ports().lock().unwrap_or_else(|p| p.into_inner()).contains(&port);
    let (Some(local), Some(peer)) = addrs.0.zip(addrs.1).filter(|(l, _)| crate::is_tcp(tcp) && ours(l.port())).unzip()
    else {
        handshake::decline(reply, token, Reason::NotOurConnection);
        foreign::release_all(fds);
        return;
    };
    sys::close(tcp);
    match handshake::take_prepared(local, peer, true) {
        Ok(p) => {
            let committed = p.committed;
            let ok = hand_over(reply, token, p);
            if !committed {
                handshake::handed(local, peer, ok);
            }
        }
        Err(reason) => handshake::decline(reply, token, reason),
    }
    sys::close(reply);
}

/// Sends prepared connection `p` down `reply` and waits for the child's word that it took
/// it. Our copies go when `p` does: the child's are the connection now.
fn hand_over(reply: c_int, token: [u8; 16], p: Prepared) -> bool {
    let (conn, app_end, _, _) = p.into_parts();
    let (rx, tx) = conn.ring_fds();
    // The rings' whole sizes (their windows are in their headers).
    let (rmem, tmem) = (conn.rx.max_capacity(), conn.tx.max_capacity());
    let m = Msg::Handover { token, rmem: rmem as u32, tmem: tmem as u32 };
    let sent = sys::send_with_fds(reply, &m.encode(), &[rx, tx, conn.peer_bell, app_end]).is_ok();
    let took = sent
        && matches!(handshake::recv_msg(reply, handshake::TIMEOUT_MS), Ok((Msg::Confirm { token: t }, ref extra))
            if t == token && extra.is_empty());
    drop(conn);
    sys::close(app_end);
    took
}

/// How long a child waits for its parent's answer: as long as the parent's door may wait
/// for the handshake it claims, and a message's time on top.
const CLAIM_WAIT_MS: u64 = handshake::ACCEPT_WAIT_MS + handshake::CLAIM_LIMIT_MS + 2 * handshake::TIMEOUT_MS as u64;

/// The child's half: claims the connection accepted as TCP socket `tcp` from the parent
/// `owner` whose channel end is `channel`. On success the connection is ours, and the
/// parent's door commits it.
pub fn claim(channel: c_int, owner: u32, tcp: c_int) -> Result<Prepared, Reason> {
    if channel < 0 {
        return Err(Reason::DoorUnreachable);
    }
    let (mine, theirs) = sys::socketpair(sys::SOCK_SEQPACKET).map_err(|_| Reason::NoMemory)?;
    let token = sys::token();
    let sent = sys::send_with_fds(channel, &Msg::Claim { token }.encode(), &[theirs, tcp]);
    sys::close(theirs);
    let out = if sent.is_err() { Err((Reason::DoorUnreachable, false)) } else { answer(mine, owner, token) };
    sys::close(mine);
    out.map_err(|(reason, handed)| {
        if handed {
            // The parent handed the connection over and we could not take it: its client
            // may be on shared memory already, so the connection fails rather than go on
            // TCP with nobody writing to it.
            // SAFETY: shutdown on the socket `accept` just returned.
            unsafe { crate::real::shutdown(tcp, sys::SHUT_RDWR) };
        }
        reason
    })
}

/// The parent's answer, and what it means; the error says whether the parent had handed
/// the connection over.
fn answer(mine: c_int, owner: u32, token: [u8; 16]) -> Result<Prepared, (Reason, bool)> {
    let deadline = Instant::now() + Duration::from_millis(CLAIM_WAIT_MS);
    let (m, fds) = loop {
        match handshake::recv_msg(mine, 100) {
            Err(Reason::Timeout) if Instant::now() < deadline && sys::alive(owner) => continue,
            Err(Reason::Timeout) => return Err((Reason::DoorUnreachable, false)),
            other => break other.map_err(|r| (r, false))?,
        }
    };
    match (m, &fds[..]) {
        (Msg::Handover { token: t, rmem, tmem }, &[rx, tx, bell, app]) if t == token => {
            let unix_stream = |fd| {
                sys::sockopt_int(fd, sys::SOL_SOCKET, sys::SO_DOMAIN) == Some(sys::AF_UNIX)
                    && sys::sockopt_int(fd, sys::SOL_SOCKET, sys::SO_TYPE) == Some(sys::SOCK_STREAM)
            };
            if !unix_stream(bell) || !unix_stream(app) {
                foreign::release_all(&fds);
                return Err((Reason::Protocol, true));
            }
            // (map_ring takes its descriptor whatever it answers.)
            let rings = (handshake::map_ring(rx, rmem as usize), handshake::map_ring(tx, tmem as usize));
            let ((rx_shm, rx), (tx_shm, tx), side) = match (rings, Side::new()) {
                ((Ok(r), Ok(t)), Ok(side)) => (r, t, side),
                ((r, t), _) => {
                    sys::close(bell);
                    sys::close(app);
                    let why = r.err().or(t.err()).unwrap_or(Reason::NoMemory);
                    return Err((why, true));
                }
            };
            let conn = Conn::new(rx_shm, rx, tx_shm, tx, side, bell);
            if sys::send_with_fds(mine, &Msg::Confirm { token }.encode(), &[]).is_err() {
                drop(conn);
                sys::close(app);
                return Err((Reason::DoorUnreachable, true));
            }
            let (rmem, tmem) = (conn.rx.capacity(), conn.tx.capacity());
            Ok(Prepared { conn, app_end: app, rmem, tmem, committed: true })
        }
        (Msg::Decline { token: t, reason }, []) if t == token => Err((reason, false)),
        _ => {
            foreign::release_all(&fds);
            Err((Reason::Protocol, false))
        }
    }
}

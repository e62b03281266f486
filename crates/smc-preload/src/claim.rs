//! Pre-forking servers (docs/architecture.md, "Pre-forking servers" and "Connections at
//! TCP's cost"): a listener made by one process and accepted on in a child it forked
//! (nginx's master and workers, apache prefork, gunicorn). Clients propose to the
//! listener's owner — the parent — at whose door the proposal waits; the child that
//! accepted the connection claims it over the parent's *claim channel* and gets the
//! arena, the slot and its end of the socket pair, and commits it itself.
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

use crate::door::{self, Taken};
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
    let (ours, theirs) = (sys::move_high(ours), sys::move_high(theirs));
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
        match (Msg::decode(&buf[..n]), &fds[..]) {
            (Ok(Msg::Claim { token }), &[reply, tcp]) => serve_claim(token, reply, tcp),
            _ => foreign::release_all(&fds),
        }
    }
}

fn decline(reply: c_int, token: [u8; 16], reason: Reason) {
    let _ = sys::send_with_fds_nowait(reply, &Msg::Decline { token, reason }.encode(), &[]);
}

/// The parent's half of one claim: `reply` is the answer's socket, `tcp` the child's
/// accepted TCP socket. The proposal is found as the parent's own `accept` would find it
/// (it waits, briefly, for nothing else) and handed over whole: the child commits it.
fn serve_claim(token: [u8; 16], reply: c_int, tcp: c_int) {
    let addrs = (sys::sock_addr(tcp, false), sys::sock_addr(tcp, true));
    let ours = |port: u16| crate::listening_port(port);
    let got = match addrs {
        (Some(local), Some(peer)) if crate::is_tcp(tcp) && ours(local.port()) => door::take(local, peer),
        _ => Err(Reason::NotOurConnection),
    };
    foreign::release(tcp);
    match got {
        Ok(mut t) => {
            let Some(geometry) = t.arena.control(t.slot).map(|_| t.arena.geometry) else {
                t.decline(Reason::Protocol);
                decline(reply, token, Reason::Protocol);
                sys::close(reply);
                return;
            };
            let m = Msg::Handover { token, slot: t.slot, generation: t.generation, pid: t.pid, geometry };
            if sys::send_with_fds_nowait(reply, &m.encode(), &[t.arena_fd, t.bell, t.app_end]).is_ok() {
                // Ours go; the child's copies are the connection now (or, if it never
                // takes them, close with its end of the answer's socket — its client
                // sees the pair close and stays on TCP).
                t.close_arena_fd();
                sys::close(std::mem::replace(&mut t.bell, -1));
                sys::close(std::mem::replace(&mut t.app_end, -1));
            } else {
                t.decline(Reason::DoorUnreachable);
            }
        }
        Err(reason) => decline(reply, token, reason),
    }
    sys::close(reply);
}

/// How long a child waits for its parent's answer: as long as the parent may wait for a
/// proof, and a margin for a busy parent.
const CLAIM_WAIT_MS: u64 = door::PROOF_WAIT_MS + 2000;

/// The child's half: claims the connection accepted as TCP socket `tcp` from the parent
/// `owner` whose channel end is `channel`. What it gets is committed by the caller
/// (crate::handshake::commit), as the parent's own `accept` would.
pub fn claim(channel: c_int, owner: u32, tcp: c_int) -> Result<Taken, Reason> {
    if channel < 0 {
        return Err(Reason::DoorUnreachable);
    }
    let (mine, theirs) = sys::socketpair(sys::SOCK_SEQPACKET).map_err(|_| Reason::NoMemory)?;
    let token = sys::token();
    let sent = sys::send_with_fds_nowait(channel, &Msg::Claim { token }.encode(), &[theirs, tcp]);
    sys::close(theirs);
    let out = if sent.is_err() { Err(Reason::DoorUnreachable) } else { answer(mine, owner, token) };
    sys::close(mine);
    out
}

/// The parent's answer.
fn answer(mine: c_int, owner: u32, token: [u8; 16]) -> Result<Taken, Reason> {
    let deadline = Instant::now() + Duration::from_millis(CLAIM_WAIT_MS);
    let mut buf = [0u8; 256];
    let (n, fds) = loop {
        match sys::recv_with_fds(mine, &mut buf, 100) {
            Ok(x) => break x,
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut && Instant::now() < deadline && sys::alive(owner) => {}
            Err(_) => return Err(Reason::DoorUnreachable),
        }
    };
    match (Msg::decode(&buf[..n]), &fds[..]) {
        (Ok(Msg::Handover { token: t, slot, generation, pid, geometry }), &[arena_fd, bell, app_end]) if t == token => {
            let arena = match crate::handshake::handed_arena(arena_fd, geometry) {
                Ok(a) => a,
                Err(e) => {
                    // Nobody can decline in the slot: the client sees the pairs close.
                    foreign::release_all(&[bell, app_end]);
                    return Err(e);
                }
            };
            Ok(Taken { arena, arena_fd: -1, slot, generation, pid, bell, app_end })
        }
        (Ok(Msg::Decline { token: t, reason }), []) if t == token => Err(reason),
        _ => {
            foreign::release_all(&fds);
            Err(Reason::Protocol)
        }
    }
}

//! `sluice port relay`: a TAP in a guest's namespace on one side, a unix stream socket in
//! the framing of a stream port on the other. The switch attaches the socket as a stream
//! port, so the guest's frames pass through a program the user (or a test) can stop: a
//! stopped relay is a receiver that stops draining, which a lossless switch holds frames
//! back for and its pause watchdog notices. Behind the relay the guest is still on a TAP,
//! whose kernel side drops when the relay does not read.

use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use sluice_switch::{Port, PortError, TxOutcome};
use sluice_wire::VNET_HDR_LEN;

use super::stream::{MAX_FRAME, StreamPort, out_frame};
use super::tap::TapPort;
use crate::sys::netns;

/// How long the relay waits for the switch to connect.
const ACCEPT_WAIT: Duration = Duration::from_secs(30);

/// Runs the relay until the switch closes its end (or the TAP goes): creates TAP `tap` in
/// namespace `ns` (the current one when `None`), listens on `path` (mode 0600), takes one
/// connection, and moves frames both ways.
pub fn run(tap: &str, ns: Option<&str>, path: &Path, mtu: u16) -> Result<()> {
    let name = tap.to_string();
    let mut t = netns::run_in(ns, move || TapPort::open(&name, false, mtu, None))
        .with_context(|| format!("creating TAP {tap:?}"))?;
    let _ = std::fs::remove_file(path);
    let listener = UnixListener::bind(path).with_context(|| format!("listening on {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    listener.set_nonblocking(true)?;
    let deadline = Instant::now() + ACCEPT_WAIT;
    let sock = loop {
        match listener.accept() {
            Ok((s, _)) => break s,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    bail!(
                        "no switch connected to {} within {} s (attach it with `sluice port add NAME --type stream --path {}`)",
                        path.display(),
                        ACCEPT_WAIT.as_secs(),
                        path.display()
                    );
                }
                let mut p = libc::pollfd { fd: listener.as_raw_fd(), events: libc::POLLIN, revents: 0 };
                // SAFETY: one valid pollfd.
                unsafe { libc::poll(&mut p, 1, 100) };
            }
            Err(e) => return Err(e).context("accepting the switch's connection"),
        }
    };
    drop(listener);
    let _ = std::fs::remove_file(path);
    let mut link = StreamPort::from_stream(sock)?;
    // A frame from the TAP the socket had no room for yet, and one from the switch.
    let mut up = vec![0u8; VNET_HDR_LEN + MAX_FRAME];
    let mut waiting: Option<usize> = None;
    let mut down = vec![0u8; VNET_HDR_LEN + MAX_FRAME];
    loop {
        let mut moved = false;
        // The rest of a frame the socket took part of goes first.
        let flushed = match link.flush() {
            Ok(f) => f,
            Err(e) => return end(e),
        };
        // The TAP is read only when nothing waits for the socket, so a stopped switch side
        // stops this side's reading.
        if waiting.is_none() && flushed {
            waiting = t.recv(&mut up).map_err(|e| anyhow::anyhow!("reading TAP {tap:?}: {e}"))?;
        }
        if let Some(n) = waiting {
            match link.send(&out_frame(&up[VNET_HDR_LEN..VNET_HDR_LEN + n])) {
                Ok(TxOutcome::Sent) => {
                    waiting = None;
                    moved = true;
                }
                Ok(TxOutcome::Full) => {}
                Err(e) => return end(e),
            }
        }
        loop {
            match link.recv(&mut down) {
                Ok(Some(n)) => {
                    // A TAP takes every frame (the kernel drops what the guest cannot).
                    let _ = t.send(&out_frame(&down[VNET_HDR_LEN..VNET_HDR_LEN + n]));
                    moved = true;
                }
                Ok(None) => break,
                Err(e) => return end(e),
            }
        }
        if !moved {
            // Sleep until the socket has bytes (or room, when a frame waits) or the TAP has
            // a frame (when none waits).
            let mut fds = [
                libc::pollfd {
                    fd: link.raw_fd(),
                    events: libc::POLLIN | if waiting.is_some() || !flushed { libc::POLLOUT } else { 0 },
                    revents: 0,
                },
                libc::pollfd {
                    fd: t.raw_fd(),
                    events: if waiting.is_none() && flushed { libc::POLLIN } else { 0 },
                    revents: 0,
                },
            ];
            // SAFETY: two valid pollfds.
            unsafe { libc::poll(fds.as_mut_ptr(), 2, 1000) };
        }
    }
}

/// The switch's end went (a normal end for the relay), or the stream broke.
fn end(e: PortError) -> Result<()> {
    match e {
        PortError::Gone(e)
            if matches!(
                e.kind(),
                io::ErrorKind::UnexpectedEof | io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset
            ) =>
        {
            Ok(())
        }
        e => Err(anyhow::anyhow!("the connection to the switch: {e}")),
    }
}

//! `sluice port relay`: a TAP in a guest's namespace on one side, a unix stream socket in
//! the framing of a stream port on the other. The switch attaches the socket as a stream
//! port, so the guest's frames pass through a program the user (or a test) can stop: a
//! stopped relay is a receiver that stops draining, which a lossless switch holds frames
//! back for and its pause watchdog notices. Behind the relay the guest is still on a TAP,
//! whose kernel side drops when the relay does not read.

use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use sluice_switch::{OutFrame, Port};
use sluice_wire::VNET_HDR_LEN;

use super::stream::MAX_FRAME;
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
    let mut sock = loop {
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
    sock.set_nonblocking(true)?;
    let mut frame = vec![0u8; VNET_HDR_LEN + MAX_FRAME];
    // TAP → socket: a frame read but not yet (wholly) written.
    let mut out: Vec<u8> = Vec::with_capacity(4 + MAX_FRAME);
    let mut out_at = 0usize;
    // Socket → TAP: bytes read, not yet whole frames.
    let mut inb = vec![0u8; 2 * (4 + MAX_FRAME)];
    let (mut in_start, mut in_end) = (0usize, 0usize);
    loop {
        // Write what the TAP gave while the socket takes it; read the TAP only when
        // nothing is waiting (so a stopped switch side stops this side's reading).
        while out_at < out.len() {
            match sock.write(&out[out_at..]) {
                Ok(n) => out_at += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return end(e),
            }
        }
        let mut moved = false;
        if out_at == out.len() {
            out.clear();
            out_at = 0;
            if let Some(n) = t.recv(&mut frame).map_err(|e| anyhow::anyhow!("reading TAP {tap:?}: {e}"))? {
                out.extend_from_slice(&(n as u32).to_be_bytes());
                out.extend_from_slice(&frame[VNET_HDR_LEN..VNET_HDR_LEN + n]);
                moved = true;
            }
        }
        // Whole frames from the socket go to the TAP.
        loop {
            let have = &inb[in_start..in_end];
            if have.len() >= 4 {
                let n = u32::from_be_bytes([have[0], have[1], have[2], have[3]]) as usize;
                if n > MAX_FRAME {
                    bail!("the switch sent a frame length of {n} bytes: the stream is broken");
                }
                if have.len() >= 4 + n {
                    let f = &have[4..4 + n];
                    let o =
                        OutFrame { vnet: [0; VNET_HDR_LEN], macs: &f[..12.min(n)], tag: None, rest: &f[12.min(n)..] };
                    // A TAP takes every frame (the kernel drops what the guest cannot).
                    let _ = t.send(&o);
                    in_start += 4 + n;
                    moved = true;
                    continue;
                }
            }
            if in_start > 0 {
                inb.copy_within(in_start..in_end, 0);
                in_end -= in_start;
                in_start = 0;
            }
            match sock.read(&mut inb[in_end..]) {
                Ok(0) => return Ok(()),
                Ok(n) => {
                    in_end += n;
                    moved = true;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return end(e),
            }
        }
        if !moved {
            // Sleep until the socket has bytes (or room, when a frame waits) or the TAP has
            // a frame (when none waits).
            let mut fds = [
                libc::pollfd {
                    fd: sock.as_raw_fd(),
                    events: libc::POLLIN | if out.is_empty() { 0 } else { libc::POLLOUT },
                    revents: 0,
                },
                libc::pollfd { fd: t.raw_fd(), events: if out.is_empty() { libc::POLLIN } else { 0 }, revents: 0 },
            ];
            // SAFETY: two valid pollfds.
            unsafe { libc::poll(fds.as_mut_ptr(), 2, 1000) };
        }
    }
}

/// The switch's end went: a normal end for the relay.
fn end(e: io::Error) -> Result<()> {
    match e.kind() {
        io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset => Ok(()),
        _ => Err(e).context("writing to the switch"),
    }
}

//! A stream port: Ethernet frames over a connected unix stream socket, each a 4-byte
//! big-endian length and the frame — the framing of QEMU's `-netdev stream`. The peer is
//! a program (QEMU, `sluice port relay`): when it stops reading, the socket fills and
//! [`Port::send`] reports `Full`, so a lossless switch holds frames for it back and its
//! pause watchdog can see it stuck; when the switch stops reading, the peer's writes
//! block, so the switch can hold the peer back too (`lossless_input`). Frames carry no
//! virtio header: the switch cuts GSO frames and completes checksums for it.
//!
//! The socket's path is the admin's, but whoever listens there is checked: the kernel's
//! record of the peer (`SO_PEERCRED`) must name root or the switch's own user, as for a
//! vhost-user port's QEMU — a listener another user planted (in /tmp, say) never gets the
//! switch's frames.

use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;

use sluice_switch::{OutFrame, Port, PortCaps, PortError, TxOutcome};
use sluice_wire::VNET_HDR_LEN;

use sluice_api::config::PortSpec;
use sluice_sys::error::Context;

use crate::{Attachment, Result};

/// Connects to the socket of stream port `spec`.
pub fn attach(spec: &PortSpec) -> Result<Attachment> {
    let path = spec.path.clone().unwrap_or_default();
    let s = StreamPort::connect(&path).with_context(|| format!("attaching stream port {:?}", spec.name))?;
    let fd = s.raw_fd();
    Ok(Attachment::new(Box::new(s), fd))
}

/// Largest frame either side may send (QEMU's limit for this netdev is 69,632).
pub const MAX_FRAME: usize = 65_535 + 18;

/// A connected stream socket attached to the switch.
pub struct StreamPort {
    sock: UnixStream,
    /// Bytes read and not yet handed over as frames: `rbuf[rstart..rend]`.
    rbuf: Box<[u8]>,
    rstart: usize,
    rend: usize,
    /// The rest of a frame the socket took only part of: `wbuf[wstart..]`.
    wbuf: Vec<u8>,
    wstart: usize,
}

impl StreamPort {
    /// Connects to the peer listening at `path` (bounded: a unix socket connects at once or
    /// fails) and checks who it is: root or the switch's own user.
    pub fn connect(path: &Path) -> io::Result<Self> {
        let sock = UnixStream::connect(path)
            .map_err(|e| io::Error::new(e.kind(), format!("connecting to {}: {e}", path.display())))?;
        let (pid, uid) = sluice_sys::peer_cred(&sock)
            .map_err(|e| io::Error::new(e.kind(), format!("reading who listens at {}: {e}", path.display())))?;
        check_peer(uid, sluice_sys::user::euid()).map_err(|why| {
            io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!("the program listening at {} (pid {pid}) {why}", path.display()),
            )
        })?;
        Self::from_stream(sock)
    }

    /// Takes a connected socket.
    pub fn from_stream(sock: UnixStream) -> io::Result<Self> {
        sock.set_nonblocking(true)?;
        Ok(StreamPort {
            sock,
            rbuf: vec![0u8; 2 * (MAX_FRAME + 4)].into_boxed_slice(),
            rstart: 0,
            rend: 0,
            wbuf: Vec::with_capacity(MAX_FRAME + 4),
            wstart: 0,
        })
    }

    /// The descriptor the event loop watches.
    pub fn raw_fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }

    /// Writes what is left of a frame the socket took part of; true when nothing is left.
    pub fn flush(&mut self) -> Result<bool, PortError> {
        while self.wstart < self.wbuf.len() {
            match self.sock.write(&self.wbuf[self.wstart..]) {
                Ok(0) => return Err(closed()),
                Ok(n) => self.wstart += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(PortError::Gone(e)),
            }
        }
        self.wbuf.clear();
        self.wstart = 0;
        Ok(true)
    }
}

/// Whether a peer of user `uid` may be attached by a switch running as user `me`: root
/// or the switch's own user only.
fn check_peer(uid: u32, me: u32) -> Result<(), String> {
    if uid == 0 || uid == me {
        return Ok(());
    }
    Err(format!(
        "runs as uid {uid}, neither root nor the switch's user (uid {me}): a stream port attaches only a peer of one of them; run the peer as uid {me} or root, and keep its socket in a directory only they can write"
    ))
}

/// An Ethernet frame as one to send (no virtio header, no tag to insert).
pub fn out_frame(f: &[u8]) -> OutFrame<'_> {
    let (macs, rest) = f.split_at(12.min(f.len()));
    OutFrame { vnet: [0; VNET_HDR_LEN], macs, tag: None, rest }
}

/// The peer closed its end (`UnexpectedEof`), as opposed to breaking the framing.
fn closed() -> PortError {
    PortError::Gone(io::Error::new(io::ErrorKind::UnexpectedEof, "the peer closed the connection"))
}

fn gone(why: &str) -> PortError {
    PortError::Gone(io::Error::new(io::ErrorKind::InvalidData, why.to_string()))
}

impl Port for StreamPort {
    fn kind(&self) -> &'static str {
        "stream"
    }

    fn caps(&self) -> PortCaps {
        PortCaps { offload: false, lossless_input: true }
    }

    fn recv(&mut self, buf: &mut [u8]) -> Result<Option<usize>, PortError> {
        loop {
            let have = &self.rbuf[self.rstart..self.rend];
            if have.len() >= 4 {
                let n = u32::from_be_bytes([have[0], have[1], have[2], have[3]]) as usize;
                if n > MAX_FRAME || n + VNET_HDR_LEN > buf.len() {
                    // The framing is lost: nothing after this can be trusted.
                    return Err(gone(&format!("the peer sent a frame length of {n} bytes (at most {MAX_FRAME})")));
                }
                if have.len() >= 4 + n {
                    buf[..VNET_HDR_LEN].fill(0);
                    buf[VNET_HDR_LEN..VNET_HDR_LEN + n].copy_from_slice(&have[4..4 + n]);
                    self.rstart += 4 + n;
                    return Ok(Some(n));
                }
            }
            // Move what is left to the front, then read more.
            if self.rstart > 0 {
                self.rbuf.copy_within(self.rstart..self.rend, 0);
                self.rend -= self.rstart;
                self.rstart = 0;
            }
            match self.sock.read(&mut self.rbuf[self.rend..]) {
                Ok(0) => return Err(closed()),
                Ok(n) => self.rend += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(PortError::Gone(e)),
            }
        }
    }

    fn send(&mut self, f: &OutFrame<'_>) -> Result<TxOutcome, PortError> {
        if !self.flush()? {
            return Ok(TxOutcome::Full);
        }
        let len = f.len();
        if len > MAX_FRAME {
            return Err(PortError::Io(io::Error::new(
                io::ErrorKind::InvalidInput,
                "frame too large for a stream port",
            )));
        }
        self.wbuf.resize(4 + len, 0);
        self.wbuf[..4].copy_from_slice(&(len as u32).to_be_bytes());
        f.copy_frame_to(&mut self.wbuf[4..]);
        match self.sock.write(&self.wbuf) {
            Ok(n) if n == self.wbuf.len() => {
                self.wbuf.clear();
                Ok(TxOutcome::Sent)
            }
            Ok(n) => {
                // Part of it went: the rest must follow before anything else.
                self.wstart = n;
                Ok(TxOutcome::Sent)
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                self.wbuf.clear();
                Ok(TxOutcome::Full)
            }
            Err(e) => Err(PortError::Gone(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_root_or_the_switch_user_may_be_the_peer() {
        assert!(check_peer(0, 1000).is_ok() && check_peer(1000, 1000).is_ok() && check_peer(0, 0).is_ok());
        let e = check_peer(65534, 0).unwrap_err();
        assert!(e.contains("runs as uid 65534") && e.contains("(uid 0)"), "{e}");
    }

    #[test]
    fn frames_cross_with_their_lengths_and_a_full_socket_reports_full() {
        let (a, mut b) = UnixStream::pair().unwrap();
        let mut p = StreamPort::from_stream(a).unwrap();
        let frame: Vec<u8> = (0..1514).map(|i| i as u8).collect();
        assert_eq!(p.send(&out_frame(&frame)).unwrap(), TxOutcome::Sent);
        let mut got = vec![0u8; 4 + 1514];
        b.read_exact(&mut got).unwrap();
        assert_eq!(&got[..4], &1514u32.to_be_bytes());
        assert_eq!(&got[4..], &frame[..]);
        // The peer stops reading: the socket fills, then Full (nothing half-sent is lost).
        let mut sent = 0usize;
        while p.send(&out_frame(&frame)).unwrap() == TxOutcome::Sent {
            sent += 1;
            assert!(sent < 100_000, "never full");
        }
        b.set_nonblocking(true).unwrap();
        let mut total = 0;
        let mut chunk = vec![0u8; 1 << 16];
        // Drain: the port finishes the frame the socket took part of as room appears.
        loop {
            let flushed = p.flush().unwrap();
            match b.read(&mut chunk) {
                Ok(n) => total += n,
                Err(_) if flushed => break,
                Err(_) => {}
            }
        }
        assert_eq!(total, sent * (4 + 1514), "every frame sent arrived whole");

        // The other way, in pieces and several at once.
        let mut wire = Vec::new();
        for n in [60usize, 1514, 9000] {
            wire.extend((n as u32).to_be_bytes());
            wire.extend(std::iter::repeat_n(n as u8, n));
        }
        b.set_nonblocking(false).unwrap();
        b.write_all(&wire[..7]).unwrap();
        let mut buf = vec![0u8; 66 * 1024];
        assert_eq!(p.recv(&mut buf).unwrap(), None, "a frame not yet whole waits");
        b.write_all(&wire[7..]).unwrap();
        for n in [60usize, 1514, 9000] {
            assert_eq!(p.recv(&mut buf).unwrap(), Some(n));
            assert!(buf[VNET_HDR_LEN..VNET_HDR_LEN + n].iter().all(|&x| x == n as u8));
        }
        assert_eq!(p.recv(&mut buf).unwrap(), None);
        b.write_all(&(1u32 << 20).to_be_bytes()).unwrap();
        let e = p.recv(&mut buf).unwrap_err();
        assert!(e.to_string().contains("frame length of 1048576"), "{e}");
        drop(b);
        let (a, b) = UnixStream::pair().unwrap();
        let mut p = StreamPort::from_stream(a).unwrap();
        drop(b);
        assert!(matches!(p.recv(&mut buf), Err(PortError::Gone(_))));
    }
}

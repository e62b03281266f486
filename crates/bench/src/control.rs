//! The control connection between `sluice bench run` and `sluice bench serve`: one JSON
//! object per line each way.
//!
//! client → `hello` → server answers `hello` (or `error` on a version mismatch);
//! client → `run` (profile text) → server answers `ready` (a data port per group);
//! client runs the data connections, then → `done` → server answers `counts`.
//!
//! For a group that opens with a client-side `accept`, the group's data port takes
//! doorbells instead of data connections: each client thread connects once, sends the
//! port it listens on (2 bytes, little-endian), then one byte per connection it wants;
//! the server connects back to the doorbell's address at that port for each byte.

use std::io::{BufRead, BufReader, ErrorKind, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::result::SideCounts;

/// Version of the control protocol; both ends must speak the same.
/// 2: groups that open connections with a client-side `accept` are served through
/// doorbell connections (see `server`).
pub const PROTOCOL: u32 = 2;

/// Default control port (uperf's).
pub const DEFAULT_PORT: u16 = 20000;

/// Messages from the client.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "msg", rename_all = "snake_case")]
pub enum ClientMsg {
    /// Opening: who the client is.
    Hello {
        /// Control protocol version.
        protocol: u32,
        /// sluice version.
        version: String,
    },
    /// Prepare a run of this profile.
    Run {
        /// profile.xml text, variables already substituted.
        profile_xml: String,
    },
    /// The client's data connections are finished.
    Done,
}

/// Messages from the server.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "msg", rename_all = "snake_case")]
pub enum ServerMsg {
    /// Opening: who the server is.
    Hello {
        /// Control protocol version.
        protocol: u32,
        /// sluice version.
        version: String,
        /// Server process id.
        pid: u32,
        /// /proc/sys/kernel/random/boot_id: equal to the client's when both run on one host.
        boot_id: String,
    },
    /// Data listeners are open, one port per group in profile order.
    Ready {
        /// Ports.
        ports: Vec<u16>,
    },
    /// The server's side of the run.
    Counts {
        /// What the server counted.
        counts: SideCounts,
        /// CPU seconds the server process used between `ready` and `counts`.
        cpu_s: f64,
    },
    /// The request was refused.
    Error {
        /// Why, and what to do.
        message: String,
    },
}

/// This host's boot id (empty if unreadable).
pub fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id").map(|s| s.trim().to_string()).unwrap_or_default()
}

/// The longest control message either end reads (a profile travels in one): a peer that
/// sends more without a newline is cut off, not buffered without end.
pub const MAX_MESSAGE: u64 = 4 << 20;

/// A JSON-lines channel over a TCP stream.
pub struct Channel {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl Channel {
    /// Wraps a connected stream.
    pub fn new(s: TcpStream) -> std::io::Result<Self> {
        Ok(Channel { writer: s.try_clone()?, reader: BufReader::new(s) })
    }

    /// Sends one message.
    pub fn send<T: Serialize>(&mut self, m: &T) -> std::io::Result<()> {
        let mut line = serde_json::to_string(m).map_err(std::io::Error::other)?;
        line.push('\n');
        self.writer.write_all(line.as_bytes())
    }

    /// Receives one message; `Ok(None)` at end of stream. Waits as long as the stream's
    /// own read timeout allows (none by default).
    pub fn recv<T: for<'de> Deserialize<'de>>(&mut self) -> std::io::Result<Option<T>> {
        self.recv_line(None)
    }

    /// Receives one message that must arrive whole by `deadline` (a whole-message deadline,
    /// not a per-read one: a peer that trickles a byte at a time gets no more time).
    /// `ErrorKind::TimedOut` when it has not; `Ok(None)` at end of stream. Leaves a read
    /// timeout set on the stream.
    pub fn recv_by<T: for<'de> Deserialize<'de>>(&mut self, deadline: Instant) -> std::io::Result<Option<T>> {
        self.recv_line(Some(deadline))
    }

    /// True when a message has begun to arrive (or the stream has ended) within `limit`.
    pub fn ready_within(&self, limit: Duration) -> std::io::Result<bool> {
        Ok(!self.reader.buffer().is_empty() || crate::sys::wait_readable(self.writer.as_raw_fd(), limit)?)
    }

    fn recv_line<T: for<'de> Deserialize<'de>>(&mut self, deadline: Option<Instant>) -> std::io::Result<Option<T>> {
        let mut line: Vec<u8> = Vec::new();
        loop {
            if let Some(d) = deadline {
                let left = d.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(std::io::Error::new(ErrorKind::TimedOut, "no whole control message in time"));
                }
                self.reader.get_ref().set_read_timeout(Some(left))?;
            }
            let buf = match self.reader.fill_buf() {
                Ok(b) => b,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) if deadline.is_some() && e.kind() == ErrorKind::WouldBlock => {
                    return Err(std::io::Error::new(ErrorKind::TimedOut, "no whole control message in time"));
                }
                Err(e) => return Err(e),
            };
            if buf.is_empty() {
                if line.is_empty() {
                    return Ok(None);
                }
                return Err(std::io::Error::new(ErrorKind::UnexpectedEof, "the peer closed mid-message"));
            }
            let (take, end) = match buf.iter().position(|&b| b == b'\n') {
                Some(i) => (i + 1, true),
                None => (buf.len(), false),
            };
            if (line.len() + take) as u64 > MAX_MESSAGE {
                return Err(std::io::Error::new(
                    ErrorKind::InvalidData,
                    format!("control message longer than {} MiB", MAX_MESSAGE >> 20),
                ));
            }
            line.extend_from_slice(&buf[..take]);
            self.reader.consume(take);
            if end {
                break;
            }
        }
        serde_json::from_slice(&line)
            .map(Some)
            .map_err(|e| std::io::Error::new(ErrorKind::InvalidData, format!("malformed control message: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    fn pair() -> (Channel, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let peer = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        (Channel::new(s).unwrap(), peer)
    }

    /// A peer that sends a message a byte at a time, each byte well within any per-read
    /// timeout, still runs out of time: the deadline is for the whole message.
    #[test]
    fn the_deadline_is_for_the_whole_message() {
        let (mut ch, mut peer) = pair();
        let slow = std::thread::spawn(move || {
            for b in br#"{"msg":"done"}"#.iter().chain(b"\n") {
                if peer.write_all(&[*b]).is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        let e = ch.recv_by::<ClientMsg>(Instant::now() + Duration::from_millis(500)).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::TimedOut);
        drop(ch);
        slow.join().unwrap();
    }

    #[test]
    fn messages_within_the_deadline_arrive_and_the_end_is_none() {
        let (mut ch, mut peer) = pair();
        peer.write_all(b"{\"msg\":\"done\"}\n{\"msg\":\"run\",\"profile_xml\":\"x\"}\n").unwrap();
        drop(peer);
        let soon = || Instant::now() + Duration::from_secs(10);
        assert!(ch.ready_within(Duration::ZERO).unwrap());
        assert!(matches!(ch.recv_by::<ClientMsg>(soon()).unwrap(), Some(ClientMsg::Done)));
        assert!(matches!(ch.recv_by::<ClientMsg>(soon()).unwrap(), Some(ClientMsg::Run { .. })));
        assert!(ch.recv_by::<ClientMsg>(soon()).unwrap().is_none());
    }

    #[test]
    fn an_endless_line_is_cut_off() {
        let (mut ch, peer) = pair();
        let w = std::thread::spawn(move || {
            let mut peer = peer;
            let chunk = vec![b'x'; 64 * 1024];
            while peer.write_all(&chunk).is_ok() {}
        });
        let e = ch.recv_by::<ClientMsg>(Instant::now() + Duration::from_secs(60)).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidData, "{e}");
        drop(ch);
        w.join().unwrap();
    }
}

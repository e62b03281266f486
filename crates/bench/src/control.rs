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

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;

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

    /// Receives one message; `Ok(None)` at end of stream.
    pub fn recv<T: for<'de> Deserialize<'de>>(&mut self) -> std::io::Result<Option<T>> {
        let mut line = String::new();
        let n = (&mut self.reader).take(MAX_MESSAGE).read_line(&mut line)?;
        if n == 0 {
            return Ok(None);
        }
        if !line.ends_with('\n') && n as u64 == MAX_MESSAGE {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("control message longer than {} MiB", MAX_MESSAGE >> 20),
            ));
        }
        serde_json::from_str(&line).map(Some).map_err(|e| {
            std::io::Error::new(std::io::ErrorKind::InvalidData, format!("malformed control message: {e}"))
        })
    }
}

//! `capture`: a `sluice capture` of another guest's port, to a pcap file, running while
//! the cell's guests talk — what a capture costs the ports it is not on. The captured
//! guest pings the server every 10 ms ([`pinger`]) so that the capture has frames to
//! copy; the capture itself ([`capture`]) reads the switch's copies on a thread of the
//! study, as `sluice capture -w FILE` would, and counts what it kept.

use std::fs::File;
use std::io::{self, BufWriter, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use sluice_api::client::Client;
use sluice_api::proto::{CAPTURE_RECORD_HEADER, Request};

use super::{Clock, Shared, Tally};

/// Echo requests a second of the captured guest's pinger.
pub const PINGS_PER_S: u64 = 100;

/// Bytes kept of each captured frame (`sluice capture`'s default).
const SNAPLEN: u32 = 262_144;

/// How long the capture drains the switch's copies after the cell ends.
const DRAIN: Duration = Duration::from_secs(5);

/// Pings `to` from the calling thread's namespace every 10 ms (an ICMP datagram socket:
/// the namespace's `ping_group_range` must admit root), counting requests and replies.
pub fn pinger(to: Ipv4Addr, sh: &Shared, mut clock: Clock) -> io::Result<Tally> {
    let s = sluice_sys::ping_socket()?;
    s.set_read_timeout(Some(Duration::from_millis(10)))?;
    let dest = SocketAddr::V4(SocketAddrV4::new(to, 0));
    let mut t = Tally::default();
    let mut next = Instant::now();
    let mut seq = 0u16;
    let mut buf = [0u8; 256];
    while !sh.over() {
        if Instant::now() >= next {
            next += Duration::from_millis(1000 / PINGS_PER_S);
            seq = seq.wrapping_add(1);
            // Echo request: type 8, code 0; the kernel fills in the identifier and checksum.
            let mut req = [0u8; 64];
            req[0] = 8;
            req[6..8].copy_from_slice(&seq.to_be_bytes());
            match s.send_to(&req, dest) {
                Ok(_) => t.add("echo_requests", 1),
                Err(_) => t.add("send_errors", 1),
            }
        }
        if let Ok(n) = s.recv(&mut buf)
            && n > 0
            && buf[0] == 0
        {
            t.add("echo_replies", 1);
        }
        clock.tick();
    }
    clock.tick();
    Ok(t)
}

/// Captures port `port` of the switch at `socket` (both directions) into `file` until the
/// cell ends, then lets the switch send what it copied until then; counts the frames kept,
/// their bytes, and the copies the switch lost (the capture could not keep up).
pub fn capture(socket: &Path, port: &str, file: &PathBuf, sh: &Shared, mut clock: Clock) -> io::Result<Tally> {
    let req = Request::Capture { port: port.into(), direction: "both".into(), snaplen: SNAPLEN };
    let reader = Client::connect(socket).and_then(|c| c.into_capture(&req)).map_err(io::Error::other)?;
    // Records already read ahead by the client's buffer come first.
    let mut pending = reader.buffer().to_vec();
    let mut stream: UnixStream = reader.into_inner();
    stream.set_read_timeout(Some(Duration::from_millis(50)))?;
    let mut out = BufWriter::new(File::create(file)?);
    out.write_all(&sluice_wire::pcap::file_header(SNAPLEN))?;
    let mut t = Tally::default();
    let mut chunk = vec![0u8; 256 * 1024];
    let mut drain_until: Option<Instant> = None;
    loop {
        take_records(&mut pending, &mut out, &mut t)?;
        if drain_until.is_none() && sh.over() {
            // As Ctrl-C ends `sluice capture`: this side closes, the switch sends what it
            // copied until then and ends the stream.
            let _ = stream.shutdown(std::net::Shutdown::Write);
            drain_until = Some(Instant::now() + DRAIN);
        }
        if drain_until.is_some_and(|d| Instant::now() >= d) {
            t.add("undrained", 1);
            break;
        }
        match stream.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => pending.extend_from_slice(&chunk[..n]),
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
        clock.tick();
    }
    take_records(&mut pending, &mut out, &mut t)?;
    out.flush()?;
    clock.tick();
    Ok(t)
}

/// Writes every whole capture record at the front of `pending` to `out` as pcap, counting
/// frames, bytes and the switch's count of lost copies; leaves a partial record in place.
fn take_records(pending: &mut Vec<u8>, out: &mut impl Write, t: &mut Tally) -> io::Result<()> {
    let mut at = 0;
    while pending.len() - at >= CAPTURE_RECORD_HEADER {
        let head = &pending[at..at + CAPTURE_RECORD_HEADER];
        let kind = head[0];
        let ts = u64::from_be_bytes(head[1..9].try_into().expect("8 bytes"));
        let len = u32::from_be_bytes(head[9..13].try_into().expect("4 bytes"));
        let dlen = u32::from_be_bytes(head[13..17].try_into().expect("4 bytes")) as usize;
        if pending.len() - at - CAPTURE_RECORD_HEADER < dlen {
            break;
        }
        let d = &pending[at + CAPTURE_RECORD_HEADER..at + CAPTURE_RECORD_HEADER + dlen];
        match kind {
            0 | 1 => {
                out.write_all(&sluice_wire::pcap::record_header(ts, dlen as u32, len))?;
                out.write_all(d)?;
                t.add("frames_kept", 1);
                t.add("bytes_kept", dlen as u64);
            }
            2 if dlen == 8 => {
                let lost = u64::from_be_bytes(d.try_into().expect("8 bytes"));
                t.0.insert("copies_lost".into(), lost);
            }
            3 => t.add("port_gone", 1),
            _ => {}
        }
        at += CAPTURE_RECORD_HEADER + dlen;
    }
    pending.drain(..at);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(kind: u8, data: &[u8]) -> Vec<u8> {
        let mut r = vec![kind];
        r.extend_from_slice(&1_000_000_007u64.to_be_bytes());
        r.extend_from_slice(&(data.len() as u32 + 10).to_be_bytes());
        r.extend_from_slice(&(data.len() as u32).to_be_bytes());
        r.extend_from_slice(data);
        r
    }

    #[test]
    fn whole_records_become_pcap_and_a_partial_one_waits() {
        let mut pending = record(0, &[1; 60]);
        pending.extend(record(1, &[2; 42]));
        pending.extend(record(2, &5u64.to_be_bytes()));
        let third = record(0, &[3; 30]);
        pending.extend_from_slice(&third[..20]);
        let (mut out, mut t) = (Vec::new(), Tally::default());
        take_records(&mut pending, &mut out, &mut t).unwrap();
        assert_eq!((t.0["frames_kept"], t.0["bytes_kept"], t.0["copies_lost"]), (2, 102, 5));
        assert_eq!(out.len(), 16 + 60 + 16 + 42);
        assert_eq!(u32::from_le_bytes(out[12..16].try_into().unwrap()), 70, "the frame's length on the wire");
        assert_eq!(pending, third[..20]);
        pending.extend_from_slice(&third[20..]);
        take_records(&mut pending, &mut out, &mut t).unwrap();
        assert_eq!((t.0["frames_kept"], pending.len()), (3, 0));
    }
}

//! Copies of a port's frames for a packet capture (`sluice capture`; docs/architecture.md,
//! "Seeing inside the switch"): as received from the port (in) and as sent to it (out,
//! tagged as on the wire), kept in a bounded queue until the driver takes them. A copy that
//! does not fit is counted as lost, never waited for: a capture never holds a frame back.
//!
//! Copies allocate (one buffer each); only ports being captured pay for that. Each copy is
//! stamped when it is made, by the clock the driver hands the capture (the core reads no
//! clock of its own): a batch of frames taken together still carries each frame's time.

use std::collections::VecDeque;

use crate::ids::PortId;

/// Which frames of a port a capture copies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// Frames the port delivers to the switch.
    In,
    /// Frames the switch sends to the port.
    Out,
    /// Both.
    Both,
}

impl Direction {
    fn takes(self, out: bool) -> bool {
        matches!((self, out), (Direction::Both, _) | (Direction::In, false) | (Direction::Out, true))
    }
}

/// One copied frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Captured {
    /// Sent to the port (else received from it).
    pub out: bool,
    /// When the copy was made, by the capture's clock (the daemon's: nanoseconds since the
    /// Unix epoch).
    pub ts_ns: u64,
    /// The frame's length on the wire (the copy may be cut shorter: `snaplen`).
    pub len: u32,
    /// The frame's first bytes, up to the capture's `snaplen`.
    pub data: Vec<u8>,
}

/// A capture of one port.
#[derive(Debug)]
pub struct Capture {
    /// The port.
    pub port: PortId,
    /// What it copies.
    pub dir: Direction,
    snaplen: usize,
    budget: usize,
    queued_bytes: usize,
    queue: VecDeque<Captured>,
    clock: fn() -> u64,
    /// Copies that did not fit in the queue.
    pub lost: u64,
    /// The port went away: nothing more will come.
    pub ended: bool,
}

impl Capture {
    /// A capture of `port` copying `dir`, each copy cut to `snaplen` bytes, at most
    /// `budget` bytes waiting for the driver, each stamped by `clock` as it is made.
    pub fn new(port: PortId, dir: Direction, snaplen: usize, budget: usize, clock: fn() -> u64) -> Capture {
        Capture {
            port,
            dir,
            snaplen: snaplen.max(14),
            budget,
            queued_bytes: 0,
            queue: VecDeque::new(),
            clock,
            lost: 0,
            ended: false,
        }
    }

    /// Copies a frame made of `parts` (in order), if the capture wants its direction.
    pub(crate) fn offer(&mut self, out: bool, parts: &[&[u8]]) {
        if !self.dir.takes(out) {
            return;
        }
        let len: usize = parts.iter().map(|p| p.len()).sum();
        let keep = len.min(self.snaplen);
        if self.queued_bytes + keep > self.budget {
            self.lost += 1;
            return;
        }
        let mut data = Vec::with_capacity(keep);
        for p in parts {
            let room = keep - data.len();
            data.extend_from_slice(&p[..p.len().min(room)]);
        }
        self.queued_bytes += keep;
        self.queue.push_back(Captured { out, ts_ns: (self.clock)(), len: len as u32, data });
    }

    /// Takes every copy waiting, oldest first.
    pub fn take(&mut self, mut f: impl FnMut(Captured)) {
        while let Some(c) = self.queue.pop_front() {
            self.queued_bytes -= c.data.len();
            f(c);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A clock that ticks once per reading.
    fn ticks() -> u64 {
        use std::sync::atomic::{AtomicU64, Ordering};
        static T: AtomicU64 = AtomicU64::new(100);
        T.fetch_add(1, Ordering::Relaxed)
    }

    #[test]
    fn copies_are_cut_to_snaplen_and_bounded_and_filtered_by_direction() {
        let mut c = Capture::new(3, Direction::Out, 20, 45, ticks);
        c.offer(false, &[&[1u8; 30]]);
        assert_eq!(c.queue.len(), 0, "an incoming frame is not an outgoing one");
        c.offer(true, &[&[1u8; 12], &[0x81, 0, 0, 10], &[2u8; 30]]);
        c.offer(true, &[&[3u8; 10]]);
        c.offer(true, &[&[4u8; 30]]);
        assert_eq!(c.lost, 1, "the third copy did not fit in 45 bytes");
        let mut got = vec![];
        c.take(|x| got.push(x));
        assert_eq!(got[0].len, 46);
        assert_eq!(&got[0].data[12..16], &[0x81, 0, 0, 10], "the tag as on the wire");
        assert_eq!(got[0].data.len(), 20);
        assert_eq!((got[1].len, got[1].data.len()), (10, 10));
        assert!(got[0].ts_ns < got[1].ts_ns, "each copy stamped when made, not when taken");
        assert_eq!(c.queued_bytes, 0);
    }
}

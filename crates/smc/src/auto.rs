//! The automatic rule: connections too short to repay the handshake stay on TCP
//! (docs/architecture.md, "Which connections move").
//!
//! A process's connections to one destination are alike. The library tells this table
//! how each client connection on shared memory ended ([`Auto::ended`]): *short* when it
//! moved fewer bytes than the threshold and made fewer than [`SHORT_MOVES`] transfers.
//! After [`CLASSIFY_AFTER`] short ones in a row, the destination's next connections stay
//! on TCP ([`Auto::decide`] says [`Choice::Stay`]) but for a probe every `gap`-th, the gap
//! doubling from [`FIRST_GAP`] to [`MAX_GAP`] while probes stay short; one long
//! connection forgets the destination. The table is the process's own and bounded
//! ([`ENTRIES`], least recently used replaced): nothing outside the process writes it.

use std::net::SocketAddr;

/// The default threshold: a connection that moved less (both directions) is short.
pub const DEFAULT_SHORT_BYTES: u64 = 64 * 1024;
/// A connection that made this many transfers or more is not short, however few bytes.
pub const SHORT_MOVES: u64 = 16;
/// Short connections in a row before a destination's connections stay on TCP.
pub const CLASSIFY_AFTER: u32 = 2;
/// Connections kept on TCP between the first probes…
pub const FIRST_GAP: u32 = 4;
/// …and, doubling while the probes are short, at most.
pub const MAX_GAP: u32 = 256;
/// Destinations remembered per process.
pub const ENTRIES: usize = 256;

/// What [`Auto::decide`] says of a new connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Choice {
    /// Try shared memory.
    Move,
    /// Stay on TCP: the destination's connections are short.
    Stay,
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    dst: SocketAddr,
    /// Short connections in a row.
    shorts: u32,
    /// Connections kept on TCP between probes, now.
    gap: u32,
    /// Connections still to keep on TCP before the next probe.
    skip: u32,
    /// When it was last used (the table's clock), for replacement.
    used: u64,
}

/// A process's table of destinations.
#[derive(Debug)]
pub struct Auto {
    short_bytes: u64,
    entries: Vec<Entry>,
    clock: u64,
}

impl Auto {
    /// A table with threshold `short_bytes` (0: the rule is off, every connection moves).
    pub fn new(short_bytes: u64) -> Auto {
        Auto { short_bytes, entries: Vec::new(), clock: 0 }
    }

    /// True when the rule is on.
    pub fn on(&self) -> bool {
        self.short_bytes > 0
    }

    fn find(&mut self, dst: SocketAddr) -> Option<&mut Entry> {
        self.clock += 1;
        let now = self.clock;
        let e = self.entries.iter_mut().find(|e| e.dst == dst)?;
        e.used = now;
        Some(e)
    }

    /// Whether a new connection to `dst` tries shared memory.
    pub fn decide(&mut self, dst: SocketAddr) -> Choice {
        if !self.on() {
            return Choice::Move;
        }
        let Some(e) = self.find(dst) else { return Choice::Move };
        if e.shorts < CLASSIFY_AFTER {
            return Choice::Move;
        }
        if e.skip == 0 {
            // A probe; the next one after `gap` more.
            e.skip = e.gap;
            return Choice::Move;
        }
        e.skip -= 1;
        Choice::Stay
    }

    /// A client connection to `dst` on shared memory ended, having moved `bytes` (both
    /// directions) in `moves` transfers.
    pub fn ended(&mut self, dst: SocketAddr, bytes: u64, moves: u64) {
        if !self.on() {
            return;
        }
        let short = bytes < self.short_bytes && moves < SHORT_MOVES;
        match (self.find(dst), short) {
            (Some(e), true) => {
                e.shorts = e.shorts.saturating_add(1);
                if e.shorts == CLASSIFY_AFTER {
                    (e.gap, e.skip) = (FIRST_GAP, FIRST_GAP);
                } else if e.shorts > CLASSIFY_AFTER {
                    e.gap = (e.gap * 2).min(MAX_GAP);
                }
            }
            (Some(e), false) => {
                e.shorts = 0;
                e.gap = 0;
                e.skip = 0;
            }
            (None, false) => {}
            (None, true) => {
                let e = Entry { dst, shorts: 1, gap: 0, skip: 0, used: self.clock };
                if self.entries.len() < ENTRIES {
                    self.entries.push(e);
                } else if let Some(old) = self.entries.iter_mut().min_by_key(|e| e.used) {
                    *old = e;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dst(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    /// Connections to `d`, each ended at once as `bytes`/`moves`: what each was told.
    fn run(a: &mut Auto, d: SocketAddr, n: usize, bytes: u64, moves: u64) -> Vec<Choice> {
        (0..n)
            .map(|_| {
                let c = a.decide(d);
                if c == Choice::Move {
                    a.ended(d, bytes, moves);
                }
                c
            })
            .collect()
    }

    #[test]
    fn short_connections_stay_on_tcp_after_two_but_for_rarer_and_rarer_probes() {
        let mut a = Auto::new(DEFAULT_SHORT_BYTES);
        let seen = run(&mut a, dst(80), 1000, 8 * 1024, 3);
        assert_eq!(&seen[..2], &[Choice::Move, Choice::Move]);
        assert_eq!(seen[2], Choice::Stay);
        let moved = seen.iter().filter(|c| **c == Choice::Move).count();
        // 2 to learn, then probes at gaps 4, 4, 8, 16, 32, 64, 128 and 256 from then on.
        assert!((9..=14).contains(&moved), "{moved} of 1000 moved");
        let tail = &seen[seen.len() - 514..];
        assert_eq!(tail.iter().filter(|c| **c == Choice::Move).count(), 2, "one in 257 at the end");
    }

    #[test]
    fn long_connections_move_and_one_long_probe_forgets_the_history() {
        let mut a = Auto::new(DEFAULT_SHORT_BYTES);
        assert!(run(&mut a, dst(80), 50, 1 << 20, 3).iter().all(|c| *c == Choice::Move), "many bytes");
        assert!(run(&mut a, dst(81), 50, 100, 40).iter().all(|c| *c == Choice::Move), "many round trips");
        run(&mut a, dst(82), 300, 100, 2);
        assert_eq!(a.decide(dst(82)), Choice::Stay);
        // The destination's connections turn long: the next probe finds it.
        let seen = run(&mut a, dst(82), 300, 1 << 20, 3);
        let first = seen.iter().position(|c| *c == Choice::Move).expect("a probe within the gap");
        assert!(seen[first..].iter().all(|c| *c == Choice::Move));
    }

    #[test]
    fn destinations_are_told_apart_the_table_is_bounded_and_zero_turns_it_off() {
        let mut a = Auto::new(DEFAULT_SHORT_BYTES);
        run(&mut a, dst(80), 3, 10, 1);
        assert_eq!(a.decide(dst(80)), Choice::Stay);
        assert_eq!(a.decide(dst(90)), Choice::Move);
        for p in 1000..1000 + 2 * ENTRIES as u16 {
            run(&mut a, dst(p), 3, 10, 1);
        }
        assert_eq!(a.entries.len(), ENTRIES);
        // The oldest destination was replaced: it moves again.
        assert_eq!(a.decide(dst(80)), Choice::Move);
        let mut off = Auto::new(0);
        assert!(run(&mut off, dst(80), 100, 10, 1).iter().all(|c| *c == Choice::Move));
    }

    #[test]
    fn connections_that_end_out_of_order_keep_the_gap_bounded() {
        // 50 at once: all move before any ends, then all end short.
        let mut a = Auto::new(DEFAULT_SHORT_BYTES);
        for _ in 0..50 {
            assert_eq!(a.decide(dst(80)), Choice::Move);
        }
        for _ in 0..50 {
            a.ended(dst(80), 8 * 1024, 3);
        }
        let seen = run(&mut a, dst(80), 650, 8 * 1024, 3);
        let moved = seen.iter().filter(|c| **c == Choice::Move).count();
        assert!(moved <= 8, "{moved} of 650 moved");
    }
}

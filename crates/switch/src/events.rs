//! What the MAC table did with stations, as events for a driver to hand on (the daemon's
//! `subscribe`): learned, moved, aged out, forgotten. The queue is bounded: when the driver
//! does not take them in time, further events are dropped and counted, never waited for,
//! so the forwarding path never stalls on an observer.

use std::collections::VecDeque;

use sluice_wire::MacAddr;

use crate::ids::PortId;

/// The events the queue holds by default ([`EventQueue::new`]'s usual bound).
pub const DEFAULT_EVENT_QUEUE: usize = 4096;

/// What happened to a station in the MAC table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StationChange {
    /// Newly learned behind `port`.
    Learned,
    /// Moved from port `from` to `port`.
    Moved {
        /// The port it was behind.
        from: PortId,
    },
    /// Silent past the aging time: forgotten.
    Aged,
    /// Forgotten for another reason: its port went away, an operator removed the entry,
    /// a failover or a MAC lock made the table forget it, or a static entry replaced it.
    Removed,
}

/// One change of the MAC table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StationEvent {
    /// What happened.
    pub change: StationChange,
    /// VLAN.
    pub vlan: u16,
    /// Station address.
    pub mac: MacAddr,
    /// The port it is (or, when forgotten, was) behind.
    pub port: PortId,
    /// A static (configured) entry.
    pub is_static: bool,
}

/// A bounded queue of [`StationEvent`]s: pushing into a full queue drops the event and
/// counts it.
#[derive(Debug)]
pub struct EventQueue {
    q: VecDeque<StationEvent>,
    cap: usize,
    lost: u64,
}

impl EventQueue {
    /// A queue holding at most `cap` events (at least one).
    pub fn new(cap: usize) -> Self {
        let cap = cap.max(1);
        EventQueue { q: VecDeque::with_capacity(cap.min(1024)), cap, lost: 0 }
    }

    /// Adds an event, or counts it lost when the queue is full.
    pub fn push(&mut self, e: StationEvent) {
        if self.q.len() >= self.cap {
            self.lost += 1;
        } else {
            self.q.push_back(e);
        }
    }

    /// True when no event waits.
    pub fn is_empty(&self) -> bool {
        self.q.is_empty() && self.lost == 0
    }

    /// Hands every waiting event to `f`, oldest first; returns how many were lost since the
    /// last call (they came after those handed over, before the queue had room again).
    pub fn drain(&mut self, mut f: impl FnMut(StationEvent)) -> u64 {
        for e in self.q.drain(..) {
            f(e);
        }
        std::mem::take(&mut self.lost)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(n: u8) -> StationEvent {
        StationEvent {
            change: StationChange::Learned,
            vlan: 1,
            mac: MacAddr([2, 0, 0, 0, 0, n]),
            port: 0,
            is_static: false,
        }
    }

    #[test]
    fn a_full_queue_drops_and_counts_instead_of_growing() {
        let mut q = EventQueue::new(3);
        for n in 0..10 {
            q.push(ev(n));
        }
        let mut got = Vec::new();
        assert_eq!(q.drain(|e| got.push(e.mac.0[5])), 7, "7 of 10 lost");
        assert_eq!(got, [0, 1, 2], "the oldest kept, in order");
        assert!(q.is_empty());
        assert_eq!(q.drain(|_| panic!("nothing waits")), 0, "the loss is reported once");
        q.push(ev(20));
        assert_eq!(q.drain(|e| got.push(e.mac.0[5])), 0);
        assert_eq!(got, [0, 1, 2, 20], "room again after a drain");
    }
}

//! The switch's events to its subscribers (`subscribe`, docs/api.md): the datapath thread
//! publishes, each subscriber's connection thread writes them out. Publishing never waits:
//! each subscriber has a bounded queue, and what does not fit is counted and announced to
//! it as `events_lost`; a subscriber that stops reading is disconnected by its own thread's
//! write deadline, not by the datapath.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, Mutex};

use sluice_api::proto::{EVENT_KINDS, Event, EventKind, event_line};

/// Subscribers served at once; more are refused.
pub const MAX_SUBSCRIBERS: usize = 16;
/// Events waiting for one subscriber's connection; beyond them its events are lost.
pub const SUBSCRIBER_QUEUE: usize = 4096;

/// One subscriber, as the publisher sees it.
struct Sub {
    /// Bit `i` set: kind [`EVENT_KINDS`]`[i]` wanted.
    kinds: u32,
    tx: SyncSender<Arc<str>>,
    shared: Arc<Shared>,
}

/// What a subscriber's thread and the publisher share.
#[derive(Default)]
struct Shared {
    /// Events lost because the queue was full.
    lost: AtomicU64,
    /// The subscriber's connection ended.
    gone: std::sync::atomic::AtomicBool,
}

/// Where the datapath publishes events and connections subscribe.
#[derive(Default)]
pub struct Hub {
    subs: Mutex<Vec<Sub>>,
    /// Subscribers now (read without the lock: publishing costs nothing without them).
    count: AtomicUsize,
    /// The last event's sequence number.
    seq: AtomicU64,
}

/// A subscriber's end: the lines to write, and how many did not fit.
pub struct Subscription {
    /// Event lines (with their newline), in order.
    pub rx: Receiver<Arc<str>>,
    shared: Arc<Shared>,
}

impl Subscription {
    /// Events lost so far because the queue was full (the thread announces them).
    pub fn lost(&self) -> u64 {
        self.shared.lost.load(Ordering::Acquire)
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.shared.gone.store(true, Ordering::Release);
    }
}

/// The mask of event kinds `names` (all when empty), or the first unknown name.
pub fn kind_mask(names: &[String]) -> Result<u32, String> {
    if names.is_empty() {
        return Ok(u32::MAX);
    }
    let mut m = 0;
    for n in names {
        let i = EVENT_KINDS.iter().position(|k| k == n).ok_or_else(|| n.clone())?;
        m |= 1 << i;
    }
    // (Losses are always told: a gap must never pass unnoticed.)
    Ok(m | 1 << EVENT_KINDS.iter().position(|k| *k == "events_lost").unwrap_or(0))
}

fn bit(kind: &EventKind) -> u32 {
    1 << EVENT_KINDS.iter().position(|k| *k == kind.name()).unwrap_or(0)
}

impl Hub {
    /// True when someone listens (events need not be made otherwise).
    pub fn listened(&self) -> bool {
        self.count.load(Ordering::Acquire) > 0
    }

    /// The sequence number the next event will have.
    pub fn next_seq(&self) -> u64 {
        self.seq.load(Ordering::Acquire) + 1
    }

    /// Adds a subscriber to the kinds in `mask`; `None` when [`MAX_SUBSCRIBERS`] listen
    /// already.
    pub fn subscribe(&self, mask: u32) -> Option<Subscription> {
        let mut subs = self.subs.lock().unwrap_or_else(|p| p.into_inner());
        subs.retain(|s| !s.shared.gone.load(Ordering::Acquire));
        if subs.len() >= MAX_SUBSCRIBERS {
            return None;
        }
        let (tx, rx) = sync_channel(SUBSCRIBER_QUEUE);
        let shared = Arc::new(Shared::default());
        subs.push(Sub { kinds: mask, tx, shared: shared.clone() });
        self.count.store(subs.len(), Ordering::Release);
        Some(Subscription { rx, shared })
    }

    /// Hands `what` to every subscriber that wants its kind, without waiting: a full queue
    /// counts it lost for that subscriber, a subscriber gone is dropped.
    pub fn publish(&self, what: EventKind) {
        if !self.listened() {
            return;
        }
        let mut subs = self.subs.lock().unwrap_or_else(|p| p.into_inner());
        let seq = self.seq.fetch_add(1, Ordering::AcqRel) + 1;
        let time = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
        let b = bit(&what);
        let line: Arc<str> = event_line(&Event { seq, time, what }).into();
        subs.retain(|s| {
            if s.kinds & b == 0 {
                return true;
            }
            match s.tx.try_send(line.clone()) {
                Ok(()) => true,
                Err(TrySendError::Full(_)) => {
                    s.shared.lost.fetch_add(1, Ordering::AcqRel);
                    true
                }
                Err(TrySendError::Disconnected(_)) => false,
            }
        });
        self.count.store(subs.len(), Ordering::Release);
    }

    /// Tells every subscriber that `count` events were lost before reaching any of them
    /// (the switch's own queue was full).
    pub fn lost(&self, count: u64) {
        self.publish(EventKind::EventsLost { count });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn publishing_never_waits_and_a_full_subscriber_is_told_how_many_it_lost() {
        let hub = Hub::default();
        hub.publish(EventKind::EventsLost { count: 1 });
        assert_eq!(hub.next_seq(), 1, "nothing made without subscribers");
        let all = hub.subscribe(kind_mask(&[]).unwrap()).unwrap();
        let ports = hub.subscribe(kind_mask(&["port_up".into()]).unwrap()).unwrap();
        for i in 0..SUBSCRIBER_QUEUE + 10 {
            hub.publish(EventKind::PortUp { port: format!("p{i}"), reason: "attached".into() });
        }
        hub.publish(EventKind::StationAged { mac: "02:00:00:00:00:01".into(), vlan: 1, port: "p".into() });
        assert_eq!(all.lost(), 11);
        assert_eq!(ports.lost(), 10, "a kind not asked for is not lost");
        let lines: Vec<_> = all.rx.try_iter().collect();
        assert_eq!(lines.len(), SUBSCRIBER_QUEUE);
        assert!(lines[0].contains("\"seq\":1") && lines[0].contains("\"kind\":\"port_up\""), "{}", lines[0]);
        drop(ports);
        hub.publish(EventKind::EventsLost { count: 3 });
        assert_eq!(hub.subs.lock().unwrap().len(), 1, "a subscriber gone is dropped");
        assert!(kind_mask(&["nosuch".into()]).is_err());
    }

    #[test]
    fn subscribers_are_bounded() {
        let hub = Hub::default();
        let subs: Vec<_> = (0..MAX_SUBSCRIBERS).map(|_| hub.subscribe(u32::MAX).unwrap()).collect();
        assert!(hub.subscribe(u32::MAX).is_none());
        drop(subs);
        assert!(hub.subscribe(u32::MAX).is_some(), "room again once they left");
    }
}

//! The lossless rule around the queues, after zOVN's Algorithm 1 (seed 004): a frame of a
//! lossless class that finds an output full waits at its input, which stops being read
//! once it holds `hold_len` frames, and is placed in arrival order when room appears; the
//! pause watchdog declares an output that sends nothing stuck, so that one dead receiver
//! cannot hold back every input. Whether a frame must wait is decided as it is placed in
//! its outputs' queues; a lossy class drops the copy for a full output instead.

use super::{Switch, WatchdogEvent};
use crate::counters::DropCause;
use crate::decide::Key;
use crate::hold::SEVERAL;
use crate::ids::PortId;

/// What became of a frame to be placed in its outputs' queues.
pub(super) enum Placement {
    /// Its input is done with it: placed, dropped, consumed or waiting for its next hop.
    Placed,
    /// Waits for room at its output (or [`SEVERAL`] outputs).
    Held(PortId),
}

/// How a frame being forwarded may wait for room.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Hold {
    /// A frame just received: it waits (lossless class) if an output is full or an earlier
    /// frame of its input waits for one of its outputs.
    Fresh,
    /// A held frame retried in order: it waits if an output is full.
    Retry,
    /// Never waits: a copy for a full output is dropped.
    Never,
}

impl Switch {
    /// Holds frame `fid` at its input `id` until output `out` (or [`SEVERAL`]) has room.
    pub(super) fn hold(&mut self, id: PortId, fid: u32, out: PortId, key: &Key) {
        self.pool.set_key(fid, *key);
        let s = self.ports[id as usize].as_mut().expect("caller checked");
        s.held.push(fid, out);
        self.held_count += 1;
        if s.held.is_full() {
            // The input stops being read until something it holds is placed.
            s.counters.pauses += 1;
            self.note_interest(id);
        }
    }

    /// Retries every input's held frames in arrival order, each only if no earlier frame
    /// of its input still waits for one of its outputs; true if any was placed.
    pub(super) fn retry_held(&mut self) -> bool {
        let mut placed = false;
        for id in 0..self.ports.len() as PortId {
            if self.slot(id).is_none_or(|s| s.held.is_empty()) {
                continue;
            }
            let was_full = self.slot(id).is_some_and(|s| s.held.is_full());
            self.pass_blocked.iter_mut().for_each(|b| *b = false);
            let mut all_blocked = false;
            let mut i = 0;
            while let Some(&(fid, out)) = self.slot(id).and_then(|s| s.held.entries().get(i)) {
                let blocked = all_blocked
                    || (out == SEVERAL && i > 0)
                    || (out != SEVERAL && self.pass_blocked.get(out as usize).copied().unwrap_or(false));
                // Learning and classification happened when the frame arrived; only the
                // placement is retried.
                if !blocked && matches!(self.redecide(id, fid, Hold::Retry), Placement::Placed) {
                    self.slot_mut(id).expect("live").held.take(i);
                    self.held_count -= 1;
                    placed = true;
                    continue;
                }
                if out == SEVERAL {
                    all_blocked = true;
                } else if let Some(b) = self.pass_blocked.get_mut(out as usize) {
                    *b = true;
                }
                i += 1;
            }
            if was_full && self.slot(id).is_some_and(|s| !s.held.is_full()) {
                self.note_interest(id);
            }
        }
        placed
    }

    /// The pause watchdog: an output of a lossless class with frames waiting that has sent
    /// none of them for `watchdog_ms` is declared stuck in that class — the frames queued
    /// behind its head are dropped (`watchdog`), and so from now on are frames of the class
    /// toward it, so the inputs it held flow again — until it sends again.
    /// [`Switch::expire`] runs it too; a driver calls it alone at
    /// [`Switch::next_deadline_ms`]. It also resumes the reading of inputs whose `rate_in`
    /// has paid for what they sent, and the sending of outputs whose `rate_out` has.
    pub fn watchdog(&mut self, now_ms: u64) {
        self.now_ms = now_ms;
        self.resume_rate_limited(now_ms);
        let limit = self.cfg.watchdog_ms;
        if limit == 0 {
            return;
        }
        let mut tripped = false;
        for id in 0..self.ports.len() as PortId {
            for ci in 0..self.classes.len() {
                if !self.classes[ci].lossless {
                    continue;
                }
                let Some(s) = self.ports.get_mut(id as usize).and_then(Option::as_mut) else { break };
                let w = s.watch[ci];
                if w.stuck || s.queue.class_len(ci as u8) == 0 || now_ms.saturating_sub(w.since_ms) < limit {
                    continue;
                }
                s.watch[ci].stuck = true;
                s.classes[ci].watchdog_trips += 1;
                while let Some(q) = s.queue.pop_behind_head(ci as u8) {
                    s.counters.tx_drops.add(DropCause::Watchdog);
                    s.classes[ci].tx_drops.add(DropCause::Watchdog);
                    self.pool.release(q.fid);
                }
                let class = self.classes[ci].name.clone();
                self.watchdog_events.push(WatchdogEvent { port: id, class, stuck: true });
                tripped = true;
            }
        }
        if tripped && self.held_count > 0 {
            // Frames held for a stuck output now go (their copies for it dropped).
            self.retry_held();
            self.settle();
        }
    }

    /// When the driver must call [`Switch::expire`] (or [`Switch::watchdog`]) next at the
    /// latest (its clock, ms) for the pause watchdog to keep its time and for an input
    /// paused by its `rate_in` to be read again; `None` when nothing waits.
    pub fn next_deadline_ms(&self) -> Option<u64> {
        // (`rate_in`: the first input whose reading resumes; `rate_out`: the first output
        // whose queue is sent from again.)
        let resume =
            self.ports.iter().flatten().flat_map(|s| [s.rate_paused_until_ms, s.shaped_until_ms]).flatten().min();
        let limit = self.cfg.watchdog_ms;
        if limit == 0 {
            return resume;
        }
        let mut next: Option<u64> = resume;
        for s in self.ports.iter().flatten() {
            for (ci, w) in s.watch.iter().enumerate() {
                if self.classes[ci].lossless && !w.stuck && s.queue.class_len(ci as u8) > 0 {
                    let at = w.since_ms.saturating_add(limit);
                    next = Some(next.map_or(at, |n| n.min(at)));
                }
            }
        }
        next
    }

    /// `rate_in`: inputs whose bucket has paid its debt by `now_ms` are read again.
    /// `rate_out`: outputs whose bucket has filled again send from their queues.
    fn resume_rate_limited(&mut self, now_ms: u64) {
        let mut shaped = false;
        for id in 0..self.ports.len() as PortId {
            let Some(s) = self.ports.get_mut(id as usize).and_then(Option::as_mut) else { continue };
            if s.shaped_until_ms.is_some_and(|at| at <= now_ms) {
                s.shaped_until_ms = None;
                if !s.dirty {
                    s.dirty = true;
                    self.dirty.push(id);
                }
                shaped = true;
            }
            if s.rate_paused_until_ms.is_some_and(|at| at <= now_ms) {
                s.rate_paused_until_ms = None;
                self.note_interest(id);
            }
        }
        if shaped {
            self.settle();
        }
    }

    /// Hands over the watchdog's changes since the last call (for the driver to log).
    pub fn take_watchdog_events(&mut self, mut f: impl FnMut(WatchdogEvent)) {
        for e in self.watchdog_events.drain(..) {
            f(e);
        }
    }
}

//! The decision asked and carried out. [`crate::decide`] is asked with the switch's tables
//! (for a frame received, for one decided again after waiting, or by a datapath that
//! caches verdicts), and the verdict executed: a drop counted, an address-resolution
//! message handed to Layer 3, or a copy of the frame placed in each output's queue — its
//! next hop's address written first — unless a full output of a lossless class makes it
//! wait.

use std::num::NonZeroU16;

use sluice_wire::neigh;

use super::lossless::{Hold, Placement};
use super::{PortSlot, Switch, mac_at};
use crate::counters::DropCause;
use crate::decide::{self, Action, Key, NextHop, Tables, Upcall, Verdict};
use crate::hold::SEVERAL;
use crate::ids::PortId;
use crate::queue::QueuedCopy;

impl Switch {
    /// What [`decide`] reads besides a frame's key.
    pub(super) fn tables(&self) -> Tables<'_, [Option<PortSlot>]> {
        Tables { cfg: &self.cfg, ports: &self.ports[..], fib: &self.fib, l3: &self.l3, acl: &self.acl, mdb: &self.mdb }
    }

    /// The verdict on a frame with key `key` now: what the switch would do with it if it
    /// arrived with the tables as they are (nothing is learned). A datapath that caches
    /// verdicts keeps this one while [`Switch::generation`] stays where it was.
    pub fn verdict(&self, key: &Key) -> Verdict {
        let mut v = Verdict::default();
        decide::decide(key, &self.tables(), &mut v);
        v
    }

    /// Whether a frame with key `key` passes, now, the checks that come before learning
    /// (its input, VLAN, EtherType, locks and source addresses) on a port that learns
    /// stations: whether the switch learns where its source is. A datapath that reports
    /// what it hears behind a tunnel reports it for such frames only (never for an EVPN
    /// tunnel's, whose stations come from routes).
    pub fn admits(&self, key: &Key) -> bool {
        decide::learning(key, &self.tables()).is_some_and(|a| a.station)
    }

    /// Stage 1 of the decision on a frame with key `key` now: the VLAN it joins, or why
    /// its input refuses it (its VLAN rule; a tunnel's endpoints and VNIs). What a datapath
    /// that caches stage 1 apart from the rest installs.
    pub fn stage1(&self, key: &Key) -> Result<u16, DropCause> {
        let me = self.slot(key.port).map(|s| &s.rules).ok_or(DropCause::UnknownPort)?;
        decide::stage1(me, key.tag.map(|v| v & 0x0fff), key.tunnel).map(|i| i.vid)
    }

    /// Moves on every change that can alter a verdict on the same key: a port attached,
    /// removed or failed, its device's address, its rules or mirrors, a source address it
    /// learned and locked, a guest's MAC address (Layer 3), a port's learned stations
    /// reaching its limit or falling below it, the MAC table becoming full or not, a
    /// capture of a port started or ended (its frames must pass the core). A
    /// station learned, moved or aged does not move it: stations are answers in a key.
    pub fn generation(&self) -> u64 {
        self.generation + self.fib.epoch()
    }

    /// The key of the last frame received and the verdict it was decided by (what the
    /// switch then did with it), if any frame was received.
    pub fn last_decision(&self) -> Option<(&Key, &Verdict)> {
        Some((self.last_key.as_ref()?, self.verdict.as_deref()?))
    }

    /// Executes verdict `v` on frame `fid` from port `from` (decided by `key`): drops it,
    /// does the core's slow work, or places it in its outputs' queues — or reports that it
    /// must be held ([`Switch::forward`]).
    #[inline]
    pub(super) fn execute(
        &mut self,
        from: PortId,
        fid: u32,
        key: &Key,
        v: &Verdict,
        hold: Hold,
        now_ms: u64,
    ) -> Placement {
        match v.action {
            Action::Drop(cause) => self.drop_rx(from, fid, cause),
            // The core learns before it decides, and a frame decided again learns again
            // first: this is never the verdict executed.
            Action::Up(Upcall::Learn) => self.drop_rx(from, fid, DropCause::UnknownPort),
            Action::Up(Upcall::Neigh) => self.neighbour_message(from, fid, now_ms),
            Action::Up(Upcall::Resolve(out)) => self.wait_for_next_hop(from, fid, key, out, now_ms),
            Action::Up(Upcall::Snoop) => self.snoop_message(from, fid, key, now_ms),
            Action::Up(Upcall::Suppress) => self.suppress(from, fid, key, now_ms),
            Action::Forward if hold == Hold::Fresh && v.storm.is_some_and(|k| !self.storm_take(from, k, now_ms)) => {
                self.drop_rx(from, fid, DropCause::Storm)
            }
            Action::Forward => {
                if v.meter_in && hold == Hold::Fresh {
                    self.charge_rate_in(from, fid, now_ms);
                }
                return self.forward(from, fid, key, v, hold, now_ms);
            }
        }
        Placement::Placed
    }

    /// Storm control: whether input `from` may send one more frame of kind `k` now (at
    /// `now_ms` on the driver's clock), taking it from the port's bucket if so.
    fn storm_take(&mut self, from: PortId, k: crate::decide::Storm, now_ms: u64) -> bool {
        let Some(s) = self.ports.get_mut(from as usize).and_then(Option::as_mut) else { return true };
        let b = &mut s.storm[match k {
            crate::decide::Storm::Broadcast => 0,
            crate::decide::Storm::Multicast => 1,
        }];
        b.take(now_ms.saturating_mul(1_000_000), 1)
    }

    /// `rate_in`: charges frame `fid` to input `from`'s bucket. It goes on whatever the
    /// bucket holds (it has been read); an overdrawn bucket stops the port's reading until
    /// the rate has paid for it, so the sender's own queue holds the rest (a vhost-user
    /// guest loses nothing).
    fn charge_rate_in(&mut self, from: PortId, fid: u32, now_ms: u64) {
        let len = self.pool.meta(fid).len as u64;
        let Some(s) = self.ports.get_mut(from as usize).and_then(Option::as_mut) else { return };
        let now_ns = now_ms.saturating_mul(1_000_000);
        let b = &mut s.rate_in;
        if !b.take(now_ns, len) {
            // Taken all the same: the bucket runs into debt, paid by the pause.
            b.tat_ns = b.tat_ns.max(now_ns) + b.meter.cost_ns(len);
        }
        let wait = b.wait_ns(now_ns, 0);
        if wait > 0 {
            s.rate_paused_until_ms = Some(now_ms + wait.div_ceil(1_000_000));
            self.note_interest(from);
        }
    }

    /// Decides again, by the key it was decided by and the tables as they are now, a frame
    /// that waited (held for room, or for its next hop's address), and executes that.
    pub(super) fn redecide(&mut self, from: PortId, fid: u32, hold: Hold) -> Placement {
        let now_ms = self.now_ms;
        let mut key = *self.pool.key(fid);
        let mut v = std::mem::take(&mut self.again);
        decide::decide(&key, &self.tables(), &mut v);
        if v.action == Action::Up(Upcall::Learn) {
            // Its source aged out or its port's limit moved while it waited: learned as on
            // arrival.
            let (src, vid) = (mac_at(self.pool.frame(fid), 6), self.pool.meta(fid).vlan);
            let admission = self.learn(from, &mut key, src, vid, now_ms);
            self.owner_after_learning(fid, &mut key, admission);
            decide::decide(&key, &self.tables(), &mut v);
            self.pool.set_key(fid, key);
        }
        let placed = self.execute(from, fid, &key, &v, hold, now_ms);
        self.again = v;
        placed
    }

    /// Places copies of frame `fid` from port `from` in the queues of verdict `v`'s
    /// outputs (its next hop's address written first), or reports that it must be held (a
    /// lossless class, an output full or, for a fresh frame, an earlier frame of its input
    /// waiting for one of its outputs). With [`Hold::Never`] a copy for a full output is
    /// dropped instead.
    #[inline]
    fn forward(&mut self, from: PortId, fid: u32, key: &Key, v: &Verdict, hold: Hold, now_ms: u64) -> Placement {
        let meta = *self.pool.meta(fid);
        if v.outputs.is_empty() {
            // The host's own frame on an uplink that is also its interface: the host's
            // stack has its copy.
            self.ports[from as usize].as_mut().expect("live").counters.consumed += 1;
            self.pool.release(fid);
            return Placement::Placed;
        }
        if let Some(next) = v.next_hop {
            let mac = match next {
                NextHop::Mac(m) => m,
                NextHop::Neighbour => {
                    let Some((_, ip)) = neigh::ip_endpoints(self.pool.frame(fid)) else {
                        self.drop_rx(from, fid, DropCause::Malformed);
                        return Placement::Placed;
                    };
                    match self.l3.lookup(meta.vlan, ip, now_ms, self.cfg.aging_ms) {
                        Some(m) => m,
                        None => {
                            self.wait_for_next_hop(from, fid, key, v.outputs[0].port, now_ms);
                            return Placement::Placed;
                        }
                    }
                }
            };
            let start = meta.start as usize;
            self.pool.buf_mut(fid)[start..start + 6].copy_from_slice(&mac.0);
        }
        // An output whose queue filled up during this batch gets a chance to send before
        // the frame is held or dropped for want of room.
        for o in &v.outputs {
            if self.ports[o.port as usize].as_ref().is_some_and(|s| s.queue.is_full(meta.class) && !s.want_write) {
                self.flush_port(o.port);
            }
        }
        let class = meta.class;
        let ci = usize::from(class);
        if hold != Hold::Never && self.classes[ci].lossless {
            // Mirror copies never hold a frame back.
            let real = v.destinations().count();
            let full = v.destinations().any(|o| {
                let s = self.ports[o.port as usize].as_ref().expect("outputs are live");
                meta.l3_max <= u32::from(o.mtu) && s.queue.is_full(class) && !s.watch[ci].stuck
            });
            let behind = hold == Hold::Fresh
                && self.slot(from).is_some_and(|s| s.held.must_wait(v.destinations().map(|o| o.port), real > 1));
            if full || behind {
                return Placement::Held(if real == 1 { v.outputs[0].port } else { SEVERAL });
            }
        }
        for o in &v.outputs {
            let out = self.ports[o.port as usize].as_mut().expect("outputs are live");
            out.counters.tx_offered += 1;
            let cause = if out.rules.failed.is_some() {
                // Failed while this frame was being placed (its flush hit a dead device).
                Some(DropCause::TxError)
            } else if meta.l3_max > u32::from(o.mtu) {
                Some(DropCause::OverMtu)
            } else if out.watch[ci].stuck && out.queue.class_len(class) > 0 {
                // Stuck: one frame at a time is offered, to see whether it sends again.
                Some(DropCause::Watchdog)
            } else {
                if out.queue.class_len(class) == 0 {
                    out.watch[ci].since_ms = now_ms;
                }
                let copy = QueuedCopy { fid, tag: o.tag.and_then(NonZeroU16::new), own_src: o.src_mac.is_some() };
                match out.queue.push(class, copy) {
                    true => None,
                    // (A shaped port's queue fills because of its `rate_out`.)
                    false if out.rate_out.meter.unit_ps != 0 => Some(DropCause::RateLimit),
                    false => Some(DropCause::QueueFull),
                }
            };
            match cause {
                Some(c) => {
                    out.counters.tx_drops.add(c);
                    out.classes[ci].tx_drops.add(c);
                }
                None => {
                    self.pool.retain(fid);
                    if !out.dirty {
                        out.dirty = true;
                        self.dirty.push(o.port);
                    }
                }
            }
        }
        let c = &mut self.ports[from as usize].as_mut().expect("live").counters;
        c.copies += v.outputs.len() as u64;
        if v.flood {
            c.flooded += 1;
        } else {
            c.forwarded += 1;
        }
        self.pool.release(fid);
        Placement::Placed
    }

    /// Counts a received frame's drop and frees it.
    pub(super) fn drop_rx(&mut self, id: PortId, fid: u32, cause: DropCause) {
        if let Some(s) = self.slot_mut(id) {
            s.counters.rx_drops.add(cause);
        }
        self.pool.release(fid);
    }
}

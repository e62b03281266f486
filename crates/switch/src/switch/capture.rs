//! Packet captures of a port started, read and ended. The copies themselves are made where
//! frames are received and sent, and kept by [`crate::capture`].

use super::Switch;
use crate::capture::{Capture, Captured, Direction};
use crate::config::SwitchError;

impl Switch {
    /// Starts a capture of port `port`: copies of the frames it delivers (`In`), is sent
    /// (`Out`) or both, each cut to `snaplen` bytes, at most `budget` bytes of them
    /// waiting for [`Switch::capture_take`], each stamped by `clock` as it is made (the
    /// driver's wall clock; the core reads none). On a kernel datapath the port's frames pass
    /// through the core while it is captured. Returns the capture's id.
    pub fn capture_start(
        &mut self,
        port: &str,
        dir: Direction,
        snaplen: usize,
        budget: usize,
        clock: fn() -> u64,
    ) -> Result<usize, SwitchError> {
        let id = self.port_id(port).ok_or_else(|| SwitchError::NoSuchPort(port.to_string()))?;
        let slot = self.slot_mut(id).expect("port_id returned a live port");
        slot.captured = slot.captured.saturating_add(1);
        self.note_fast(id);
        // (A kernel datapath's cached verdicts sent the port's frames past the core.)
        self.generation += 1;
        let c = Capture::new(id, dir, snaplen, budget, clock);
        match self.captures.iter().position(Option::is_none) {
            Some(i) => {
                self.captures[i] = Some(c);
                Ok(i)
            }
            None => {
                self.captures.push(Some(c));
                Ok(self.captures.len() - 1)
            }
        }
    }

    /// Hands over the copies capture `cap` made since the last call, oldest first; returns
    /// the copies it lost so far and whether its port went away, or `None` for no such
    /// capture.
    pub fn capture_take(&mut self, cap: usize, f: impl FnMut(Captured)) -> Option<(u64, bool)> {
        let c = self.captures.get_mut(cap)?.as_mut()?;
        c.take(f);
        Some((c.lost, c.ended))
    }

    /// Ends capture `cap` (its waiting copies are dropped).
    pub fn capture_stop(&mut self, cap: usize) {
        let Some(c) = self.captures.get_mut(cap).and_then(Option::take) else { return };
        if !c.ended
            && let Some(s) = self.slot_mut(c.port)
        {
            s.captured = s.captured.saturating_sub(1);
            self.note_fast(c.port);
            self.generation += 1;
        }
    }
}

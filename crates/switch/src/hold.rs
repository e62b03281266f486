//! An input's held frames (docs/architecture.md, "Lossless without head-of-line
//! blocking"): frames of lossless classes it read but could not place yet, in arrival
//! order, with how many wait for each output. A new frame for an output something of this
//! input already waits for waits behind it (order per input and output); frames for other
//! outputs pass. The input stops being read only when the list is full.

use crate::ids::PortId;

/// The output of a held frame that goes to several (a flood): it waits behind everything
/// held before it, and everything after it waits behind it.
pub const SEVERAL: PortId = PortId::MAX;

/// One input's held frames. Bounded and allocated when the port is attached.
#[derive(Debug)]
pub struct HeldList {
    /// (frame, its output or [`SEVERAL`]), oldest first.
    entries: Vec<(u32, PortId)>,
    cap: usize,
    /// Entries waiting for each output, by port id.
    waiting: Vec<u16>,
    /// Entries waiting for several outputs.
    several: u16,
}

impl HeldList {
    /// A list of up to `cap` frames (at least one), for outputs with ids below `ports`.
    pub fn new(cap: usize, ports: usize) -> Self {
        let cap = cap.clamp(1, usize::from(u16::MAX));
        HeldList { entries: Vec::with_capacity(cap), cap, waiting: vec![0; ports], several: 0 }
    }

    /// Makes room to count frames for outputs with ids below `ports` (when a port is added).
    pub fn ensure_ports(&mut self, ports: usize) {
        if self.waiting.len() < ports {
            self.waiting.resize(ports, 0);
        }
    }

    /// Frames held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when nothing is held.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// True when no more frame can be held: the input must not be read.
    pub fn is_full(&self) -> bool {
        self.entries.len() >= self.cap
    }

    /// True when a new frame for `outs` must wait behind a frame held earlier (`several`:
    /// it goes to more than one output).
    pub fn must_wait(&self, outs: impl IntoIterator<Item = PortId>, several: bool) -> bool {
        if self.entries.is_empty() {
            return false;
        }
        several || self.several > 0 || outs.into_iter().any(|o| self.waiting.get(o as usize).is_some_and(|&n| n > 0))
    }

    /// Holds frame `fid` for output `out` ([`SEVERAL`] for a flood). The caller checked
    /// [`HeldList::is_full`].
    pub fn push(&mut self, fid: u32, out: PortId) {
        debug_assert!(!self.is_full());
        self.entries.push((fid, out));
        self.count(out, true);
    }

    /// The held frames, oldest first.
    pub fn entries(&self) -> &[(u32, PortId)] {
        &self.entries
    }

    /// Removes entry `i` (keeping the order of the rest) and returns it.
    pub fn take(&mut self, i: usize) -> (u32, PortId) {
        let e = self.entries.remove(i);
        self.count(e.1, false);
        e
    }

    fn count(&mut self, out: PortId, up: bool) {
        let n = if out == SEVERAL {
            &mut self.several
        } else {
            let i = out as usize;
            if self.waiting.len() <= i {
                self.waiting.resize(i + 1, 0);
            }
            &mut self.waiting[i]
        };
        *n = if up { n.saturating_add(1) } else { n.saturating_sub(1) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_waits_only_behind_frames_for_its_own_output() {
        let mut h = HeldList::new(3, 4);
        assert!(!h.must_wait([1], false), "nothing held");
        h.push(100, 1);
        assert!(h.must_wait([1], false));
        assert!(!h.must_wait([2], false), "another output passes");
        assert!(h.must_wait([2], true), "a flood waits behind anything");
        h.push(101, SEVERAL);
        assert!(h.must_wait([2], false), "everything waits behind a flood");
        h.push(102, 3);
        assert!(h.is_full());
        assert_eq!(h.take(1), (101, SEVERAL));
        assert!(!h.must_wait([2], false));
        assert!(h.must_wait([3], false));
        assert_eq!(h.entries(), &[(100, 1), (102, 3)]);
        assert_eq!(h.take(0), (100, 1));
        assert!(!h.must_wait([1], false) && !h.is_full());
        h.push(103, 9);
        assert!(h.must_wait([9], false), "an output added after the list was made");
    }
}

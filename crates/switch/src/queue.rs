//! A bounded first-in first-out queue of frames, allocated once at its full capacity; an
//! output's queue holds, with each frame's id, what its verdict said to do to that copy
//! ([`QueuedCopy`]).

use std::num::NonZeroU16;

/// A frame waiting at an output, with what its verdict said to do to this copy: the
/// frame's buffer is shared by every output it goes to. Eight bytes, so that a queue's
/// ring stays as small as the frames' ids alone would need twice over.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueuedCopy {
    /// The frame's buffer.
    pub fid: u32,
    /// The 802.1Q tag to push (this VLAN id, the frame's priority), if any.
    pub tag: Option<NonZeroU16>,
    /// The copy leaves from its output's own address (Layer 3: the switch's on that side,
    /// as the verdict's `src_mac` says).
    pub own_src: bool,
}

/// Fixed-capacity ring of frames (by default `u32` frame ids). Never allocates after
/// construction.
#[derive(Debug)]
pub struct FrameQueue<T = u32> {
    ring: Box<[T]>,
    head: usize,
    len: usize,
}

impl<T: Copy + Default> FrameQueue<T> {
    /// A queue that holds up to `capacity` frames (at least one).
    pub fn new(capacity: usize) -> Self {
        FrameQueue { ring: vec![T::default(); capacity.max(1)].into_boxed_slice(), head: 0, len: 0 }
    }

    /// How many frames it can hold.
    pub fn capacity(&self) -> usize {
        self.ring.len()
    }

    /// Frames waiting.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when no frame waits.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// True when no frame can be added.
    pub fn is_full(&self) -> bool {
        self.len == self.ring.len()
    }

    /// Appends `id`; returns false (and keeps nothing) when full.
    pub fn push(&mut self, id: T) -> bool {
        if self.is_full() {
            return false;
        }
        let tail = (self.head + self.len) % self.ring.len();
        self.ring[tail] = id;
        self.len += 1;
        true
    }

    /// The oldest frame, if any.
    pub fn front(&self) -> Option<T> {
        (self.len > 0).then(|| self.ring[self.head])
    }

    /// Removes and returns the newest frame.
    pub fn pop_back(&mut self) -> Option<T> {
        if self.len == 0 {
            return None;
        }
        self.len -= 1;
        Some(self.ring[(self.head + self.len) % self.ring.len()])
    }

    /// Removes and returns the oldest frame.
    pub fn pop(&mut self) -> Option<T> {
        let id = self.front()?;
        self.head = (self.head + 1) % self.ring.len();
        self.len -= 1;
        Some(id)
    }
}

/// An output's queues, one per traffic class, sent round-robin: the class whose turn it is
/// keeps it until its head frame has left (a GSO frame cut in software may take several
/// sends), then the turn passes to the next class with frames.
#[derive(Debug)]
pub struct ClassQueues<T = u32> {
    queues: Box<[FrameQueue<T>]>,
    turn: usize,
    len: usize,
}

impl<T: Copy + Default> ClassQueues<T> {
    /// Queues of the given capacities, one per class (at least one class).
    pub fn new(capacities: &[usize]) -> Self {
        let mut queues: Vec<FrameQueue<T>> = capacities.iter().map(|&c| FrameQueue::new(c)).collect();
        if queues.is_empty() {
            queues.push(FrameQueue::new(1));
        }
        ClassQueues { queues: queues.into_boxed_slice(), turn: 0, len: 0 }
    }

    /// Frames waiting in all classes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when no frame waits in any class.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Frames waiting in `class`.
    pub fn class_len(&self, class: u8) -> usize {
        self.queues.get(usize::from(class)).map_or(0, FrameQueue::len)
    }

    /// True when `class`'s queue can take no frame.
    pub fn is_full(&self, class: u8) -> bool {
        self.queues.get(usize::from(class)).is_none_or(FrameQueue::is_full)
    }

    /// Appends `id` to `class`'s queue; false (keeping nothing) when it is full.
    pub fn push(&mut self, class: u8, id: T) -> bool {
        let Some(q) = self.queues.get_mut(usize::from(class)) else { return false };
        let ok = q.push(id);
        self.len += usize::from(ok);
        ok
    }

    /// The next frame to send and its class: the head of the class whose turn it is.
    pub fn front(&mut self) -> Option<(u8, T)> {
        if self.len == 0 {
            return None;
        }
        let n = self.queues.len();
        for k in 0..n {
            let c = (self.turn + k) % n;
            if let Some(id) = self.queues[c].front() {
                self.turn = c;
                return Some((c as u8, id));
            }
        }
        None
    }

    /// Removes the frame [`ClassQueues::front`] returned; the turn passes on.
    pub fn pop_front(&mut self) -> Option<T> {
        let id = self.queues[self.turn].pop()?;
        self.len -= 1;
        self.turn = (self.turn + 1) % self.queues.len();
        Some(id)
    }

    /// Removes any one frame (for emptying the queues).
    pub fn pop_any(&mut self) -> Option<T> {
        let id = self.queues.iter_mut().find_map(FrameQueue::pop)?;
        self.len -= 1;
        Some(id)
    }

    /// Removes the frames of `class` behind its head (a class's head may be being sent).
    pub fn pop_behind_head(&mut self, class: u8) -> Option<T> {
        let q = self.queues.get_mut(usize::from(class))?;
        if q.len() < 2 {
            return None;
        }
        let id = q.pop_back()?;
        self.len -= 1;
        Some(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_take_turns_and_a_head_keeps_its_turn_until_it_leaves() {
        let mut q: ClassQueues = ClassQueues::new(&[4, 4]);
        for id in [1, 2, 3] {
            assert!(q.push(0, id));
        }
        assert!(q.push(1, 10));
        assert!(q.push(1, 11));
        assert_eq!(q.len(), 5);
        assert_eq!(q.front(), Some((0, 1)));
        assert_eq!(q.front(), Some((0, 1)), "still its turn");
        assert_eq!(q.pop_front(), Some(1));
        assert_eq!(q.front(), Some((1, 10)));
        q.pop_front();
        assert_eq!(q.front(), Some((0, 2)));
        q.pop_front();
        assert_eq!(q.front(), Some((1, 11)));
        q.pop_front();
        assert_eq!(q.front(), Some((0, 3)));
        q.pop_front();
        assert_eq!(q.front(), None);
        assert!(q.is_empty());
        for id in 0..4 {
            assert!(q.push(1, id));
        }
        assert!(q.is_full(1) && !q.is_full(0) && q.is_full(7), "a class that does not exist takes nothing");
        assert_eq!(q.pop_behind_head(1), Some(3));
        assert_eq!(q.pop_behind_head(1), Some(2));
        assert_eq!(q.pop_behind_head(1), Some(1));
        assert_eq!(q.pop_behind_head(1), None);
        assert_eq!((q.class_len(1), q.len()), (1, 1));
        assert_eq!(q.pop_any(), Some(0));
    }

    #[test]
    fn fifo_and_bounded() {
        let mut q: FrameQueue = FrameQueue::new(2);
        assert!(q.push(1));
        assert!(q.push(2));
        assert!(!q.push(3));
        assert_eq!(q.pop(), Some(1));
        assert!(q.push(3));
        assert_eq!(q.pop(), Some(2));
        assert_eq!(q.pop(), Some(3));
        assert_eq!(q.pop(), None);
        assert!(q.is_empty());
    }
}

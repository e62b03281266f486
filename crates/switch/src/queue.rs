//! A bounded first-in first-out queue of frame ids, allocated once at its full capacity.

/// Fixed-capacity ring of `u32` frame ids. Never allocates after construction.
#[derive(Debug)]
pub struct FrameQueue {
    ring: Box<[u32]>,
    head: usize,
    len: usize,
}

impl FrameQueue {
    /// A queue that holds up to `capacity` frames (at least one).
    pub fn new(capacity: usize) -> Self {
        FrameQueue { ring: vec![0; capacity.max(1)].into_boxed_slice(), head: 0, len: 0 }
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
    pub fn push(&mut self, id: u32) -> bool {
        if self.is_full() {
            return false;
        }
        let tail = (self.head + self.len) % self.ring.len();
        self.ring[tail] = id;
        self.len += 1;
        true
    }

    /// The oldest frame id, if any.
    pub fn front(&self) -> Option<u32> {
        (self.len > 0).then(|| self.ring[self.head])
    }

    /// Removes and returns the oldest frame id.
    pub fn pop(&mut self) -> Option<u32> {
        let id = self.front()?;
        self.head = (self.head + 1) % self.ring.len();
        self.len -= 1;
        Some(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fifo_and_bounded() {
        let mut q = FrameQueue::new(2);
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

//! Preallocated frame buffers shared by every queue of a switch.
//!
//! Each buffer holds one frame of up to 64 KiB (a whole GSO frame) preceded by its
//! virtio header. A frame flooded to several outputs is stored once and reference-counted.
//! Buffers are allocated when ports are attached (enough for every queue to be full at
//! once), never per frame; their pages are zeroed lazily by the kernel, so an idle buffer
//! costs address space, not memory.

use sluice_wire::{VNET_HDR_LEN, VnetHdr};

use crate::decide::Key;

/// Bytes in one buffer: the virtio header, a 64 KiB IP packet, an Ethernet header and one
/// 802.1Q tag, rounded up.
pub const FRAME_BUF_LEN: usize = 66 * 1024;

/// Largest Ethernet frame (without virtio header) a buffer holds.
pub const MAX_FRAME_LEN: usize = FRAME_BUF_LEN - VNET_HDR_LEN;

/// What the switch knows about a stored frame.
#[derive(Clone, Copy, Debug, Default)]
pub struct FrameMeta {
    /// Offset of the Ethernet frame in the buffer (after the virtio header, moved on by
    /// four when an 802.1Q tag was removed).
    pub start: u32,
    /// Length of the untagged Ethernet frame.
    pub len: u32,
    /// Offload state, with offsets relative to the untagged frame.
    pub vnet: VnetHdr,
    /// The frame's VLAN.
    pub vlan: u16,
    /// 802.1p priority code point from the received tag (0 when untagged).
    pub pcp: u8,
    /// Largest IP packet the frame is, or would be cut into by segmentation; compared
    /// with each output's MTU.
    pub l3_max: u32,
    /// Its traffic class (an index into the switch's classes).
    pub class: u8,
}

struct Slot {
    data: Box<[u8]>,
    meta: FrameMeta,
    refs: u16,
    /// The key the frame was decided by, kept while it waits (held, or for its next hop)
    /// to be decided again.
    key: Key,
}

/// The buffers and their free list.
pub struct FramePool {
    slots: Vec<Slot>,
    free: Vec<u32>,
    /// Slots whose memory was given back ([`FramePool::shrink`]); reused first by `grow`.
    retired: Vec<u32>,
    /// Buffers still to retire as they come back (in use when `shrink` asked for them).
    debt: usize,
}

impl FramePool {
    /// An empty pool; call [`FramePool::grow`] before use.
    pub fn new() -> Self {
        FramePool { slots: Vec::new(), free: Vec::new(), retired: Vec::new(), debt: 0 }
    }

    /// Adds `n` buffers (first cancelling a shrink not yet done, then reviving retired
    /// slots, then new ones).
    pub fn grow(&mut self, n: usize) {
        let cancelled = n.min(self.debt);
        self.debt -= cancelled;
        let mut n = n - cancelled;
        while n > 0
            && let Some(id) = self.retired.pop()
        {
            self.slots[id as usize].data = vec![0u8; FRAME_BUF_LEN].into_boxed_slice();
            self.free.push(id);
            n -= 1;
        }
        self.slots.reserve(n);
        self.free.reserve(n);
        for _ in 0..n {
            let id = self.slots.len() as u32;
            self.slots.push(Slot {
                data: vec![0u8; FRAME_BUF_LEN].into_boxed_slice(),
                meta: FrameMeta::default(),
                refs: 0,
                key: Key::default(),
            });
            self.free.push(id);
        }
    }

    /// Gives back the memory of `n` buffers (a port left): free ones now, the rest as
    /// they are released. Their slots stay (ids are stable) and `grow` reuses them.
    pub fn shrink(&mut self, n: usize) {
        self.debt += n;
        while self.debt > 0
            && let Some(id) = self.free.pop()
        {
            self.retire(id);
        }
    }

    fn retire(&mut self, id: u32) {
        self.slots[id as usize].data = Box::new([]);
        self.retired.push(id);
        self.debt -= 1;
    }

    /// Total buffers (not counting retired ones).
    pub fn capacity(&self) -> usize {
        self.slots.len() - self.retired.len()
    }

    /// Buffers not holding a frame.
    pub fn available(&self) -> usize {
        self.free.len()
    }

    /// Takes a free buffer with one reference, or `None` when all are in use.
    pub fn alloc(&mut self) -> Option<u32> {
        let id = self.free.pop()?;
        let slot = &mut self.slots[id as usize];
        slot.refs = 1;
        slot.meta = FrameMeta::default();
        Some(id)
    }

    /// Adds a reference (the frame joins one more queue).
    pub fn retain(&mut self, id: u32) {
        self.slots[id as usize].refs += 1;
    }

    /// Drops a reference; the buffer is free again at zero.
    pub fn release(&mut self, id: u32) {
        let slot = &mut self.slots[id as usize];
        debug_assert!(slot.refs > 0, "frame {id} released twice");
        slot.refs = slot.refs.saturating_sub(1);
        if slot.refs == 0 {
            if self.debt > 0 {
                self.retire(id);
            } else {
                self.free.push(id);
            }
        }
    }

    /// The whole buffer, for receiving into.
    pub fn buf_mut(&mut self, id: u32) -> &mut [u8] {
        &mut self.slots[id as usize].data
    }

    /// The frame's metadata.
    pub fn meta(&self, id: u32) -> &FrameMeta {
        &self.slots[id as usize].meta
    }

    /// The frame's metadata, for changing.
    pub fn meta_mut(&mut self, id: u32) -> &mut FrameMeta {
        &mut self.slots[id as usize].meta
    }

    /// The key the frame was last decided by ([`FramePool::set_key`]).
    pub fn key(&self, id: u32) -> &Key {
        &self.slots[id as usize].key
    }

    /// Keeps the key the frame was decided by, for a frame that waits.
    pub fn set_key(&mut self, id: u32, key: Key) {
        self.slots[id as usize].key = key;
    }

    /// The untagged Ethernet frame.
    pub fn frame(&self, id: u32) -> &[u8] {
        let s = &self.slots[id as usize];
        &s.data[s.meta.start as usize..(s.meta.start + s.meta.len) as usize]
    }

    /// The frame and its metadata, mutably (for completing a checksum in place).
    pub fn frame_and_meta_mut(&mut self, id: u32) -> (&mut [u8], &mut FrameMeta) {
        let s = &mut self.slots[id as usize];
        let range = s.meta.start as usize..(s.meta.start + s.meta.len) as usize;
        (&mut s.data[range], &mut s.meta)
    }
}

impl Default for FramePool {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refcounted_buffers_return_to_the_free_list() {
        let mut p = FramePool::new();
        p.grow(2);
        let a = p.alloc().unwrap();
        let _b = p.alloc().unwrap();
        assert!(p.alloc().is_none());
        p.retain(a);
        p.release(a);
        assert_eq!(p.available(), 0);
        p.release(a);
        assert_eq!(p.available(), 1);
    }

    #[test]
    fn shrinking_gives_memory_back_now_or_when_buffers_return_and_growing_reuses_it() {
        let mut p = FramePool::new();
        p.grow(4);
        let held = p.alloc().unwrap();
        // Three of four are free: those go now, the fourth when it is released.
        p.shrink(4);
        assert_eq!((p.capacity(), p.available()), (1, 0));
        p.release(held);
        assert_eq!((p.capacity(), p.available()), (0, 0));
        assert!(p.slots.iter().all(|s| s.data.is_empty()));
        // Growing revives the retired slots before adding any.
        p.grow(5);
        assert_eq!((p.slots.len(), p.capacity(), p.available()), (5, 5, 5));
        let a = p.alloc().unwrap();
        assert_eq!(p.buf_mut(a).len(), FRAME_BUF_LEN);
        // A shrink not yet done is cancelled by the next grow.
        p.shrink(5);
        assert_eq!(p.capacity(), 1);
        p.grow(1);
        p.release(a);
        assert_eq!((p.capacity(), p.available()), (1, 1));
    }
}

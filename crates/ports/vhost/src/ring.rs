//! The split virtqueue as the port walks it: the guest's available index, its available
//! ring's entries and its descriptors, read here through `vm-memory`'s checked accessors,
//! every index checked before it is used.
//!
//! `virtio-queue`'s `Queue` keeps the ring's addresses, size and the device's positions
//! (`next_avail`, `next_used`), returns used chains and suppresses notifications; its
//! iterator is not used, because its failures are silent (an available index too far ahead
//! yields "no chain" while `enable_notification` keeps saying "more") and it follows
//! indirect tables, a feature the device does not offer.
//!
//! Invariants, whatever the guest writes:
//! - a [`Cursor`] never hands out more chains than the queue's size beyond `next_avail`:
//!   an available index further ahead breaks the queue ([`Broken::AvailIndex`]);
//! - a head or `next` index outside the descriptor table breaks the queue;
//! - a descriptor of length zero, or one with the indirect flag, breaks the queue: QEMU and
//!   libvhost-user stop the device for the first ("zero sized buffers are not allowed"),
//!   and the specification forbids the second to a driver that did not negotiate
//!   VIRTIO_F_INDIRECT_DESC (2.7.5.3.1), which the device does not offer;
//! - a chain is at most [`MAX_CHAIN_DESCRIPTORS`] descriptors: a longer one is refused;
//! - every read is a checked copy out of the guest's memory: an address outside it is an
//!   error, never a read of the switch's own.

use std::fmt;
use std::sync::atomic::Ordering;

use virtio_bindings::virtio_ring::{VRING_DESC_F_INDIRECT, VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
use virtio_queue::desc::split::Descriptor;
use virtio_queue::{Queue, QueueT};
use vm_memory::{Address, Bytes, GuestAddress, GuestMemory, Permissions, VolatileMemory};

/// Descriptors one chain may have at most. A Linux guest's transmit chain has at most
/// `MAX_SKB_FRAGS + 2` (19, or 47 with the largest build option) and a receive chain one
/// (mergeable buffers) or 19 (big packets); a chain longer than this is refused.
pub const MAX_CHAIN_DESCRIPTORS: usize = 64;

/// Chains one frame into the guest may take at most. Linux posts mergeable buffers of at
/// least 1,518 bytes, so its largest frame (64 KiB) takes 44; a frame that would need
/// more is dropped and its chains returned empty.
pub const MAX_FRAME_CHAINS: usize = 64;

const DESC_NEXT: u16 = VRING_DESC_F_NEXT as u16;
const DESC_WRITE: u16 = VRING_DESC_F_WRITE as u16;
const DESC_INDIRECT: u16 = VRING_DESC_F_INDIRECT as u16;

/// Why a queue is broken: its ring says something no driver that follows the virtio
/// specification writes. The queue is not read or written again until the frontend sets
/// it up anew.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Broken {
    /// The available index is more than the queue's size ahead of the device's.
    AvailIndex {
        /// The guest's available index.
        avail: u16,
        /// The device's next available position.
        next: u16,
        /// The queue's size.
        size: u16,
    },
    /// An available ring entry names a descriptor outside the table.
    Head {
        /// The entry's descriptor index.
        head: u16,
        /// The queue's size.
        size: u16,
    },
    /// A descriptor's `next` is outside the table.
    Next {
        /// The `next` index.
        next: u16,
        /// The queue's size.
        size: u16,
    },
    /// The available ring or the descriptor table is not in the guest's memory.
    Unreadable(GuestAddress),
    /// A descriptor has the indirect flag, and VIRTIO_F_INDIRECT_DESC was not negotiated.
    Indirect,
    /// A descriptor's length is zero.
    ZeroLength,
    /// A receive buffer is smaller than the virtio-net header while mergeable buffers are
    /// negotiated (the specification, 5.1.6.3.1: "each buffer MUST be at least the size of
    /// the struct virtio_net_hdr").
    SmallBuffer {
        /// The buffer's bytes (its chain's, all descriptors).
        len: u32,
        /// The header's.
        header: u32,
    },
}

impl fmt::Display for Broken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Broken::AvailIndex { avail, next, size } => write!(
                f,
                "its available index ({avail}) is {} ahead of the device's ({next}), more than the queue's size ({size})",
                avail.wrapping_sub(next)
            ),
            Broken::Head { head, size } => {
                write!(f, "its available ring names descriptor {head}, outside the table of {size}")
            }
            Broken::Next { next, size } => {
                write!(f, "a descriptor chains to descriptor {next}, outside the table of {size}")
            }
            Broken::Unreadable(a) => write!(f, "its ring is not in its memory (0x{:x})", a.raw_value()),
            Broken::Indirect => {
                write!(f, "a descriptor is indirect, a feature the device does not offer and the guest did not accept")
            }
            Broken::ZeroLength => write!(f, "a descriptor has length 0 (zero-sized buffers are not allowed)"),
            Broken::SmallBuffer { len, header } => write!(
                f,
                "it posted a {len}-byte receive buffer, smaller than the {header}-byte virtio-net header every buffer must hold with mergeable buffers"
            ),
        }
    }
}

/// Why one chain was refused; the queue stays usable, the chain goes back used and empty.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// More than [`MAX_CHAIN_DESCRIPTORS`] descriptors (a driver may chain up to the
    /// queue's size; Linux's longest chain has 47).
    TooLong,
}

/// What ended a walk early, beyond the caller's own stop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The queue is broken.
    Broken(Broken),
    /// The chain is refused.
    Refused(Refused),
}

/// One descriptor of a chain.
#[derive(Clone, Copy, Debug)]
pub struct Desc {
    /// Guest-physical address of the buffer.
    pub addr: GuestAddress,
    /// Its length in bytes.
    pub len: u32,
    /// Whether the device writes into it (a receive buffer).
    pub write: bool,
}

/// What a walk saw.
#[derive(Clone, Copy, Debug, Default)]
pub struct Walk {
    /// Descriptors handed to the caller.
    pub descriptors: usize,
    /// The chain's last descriptor was handed to the caller and the caller took it (the
    /// chain was walked whole).
    pub whole: bool,
    /// What ended the chain early, if anything but the caller or its last descriptor.
    pub fault: Option<Fault>,
}

/// A queue's state beside `virtio-queue`'s `Queue`, kept by the port for one set-up of the
/// ring (the frontend setting the ring up again starts a fresh one).
#[derive(Clone, Copy, Debug, Default)]
pub struct Cursor {
    /// The ring's set-up count this state belongs to.
    pub setup: u64,
    /// The guest's available index as last read; entries up to it are published.
    avail: Option<u16>,
    /// Why the queue is broken, if it is.
    pub broken: Option<Broken>,
    /// A receive queue found without enough buffers: the available index it was found
    /// at. It is not walked again until the guest moves that index.
    pub full_at: Option<u16>,
    /// A receive queue whose buffers were too small for a frame even `MAX_FRAME_CHAINS` of
    /// them: the largest of those buffers. A later frame that would need more than
    /// `MAX_FRAME_CHAINS` such buffers looks at the next one only, and is dropped without
    /// taking it while the guest posts no larger one.
    pub small: Option<u32>,
}

impl Cursor {
    /// A fresh state for set-up `setup` of the ring.
    pub fn new(setup: u64) -> Cursor {
        Cursor { setup, ..Cursor::default() }
    }

    /// Reads the guest's available index (after which its entries are read); an index
    /// more than the queue's size ahead of `next_avail` breaks the queue.
    pub fn look<M: GuestMemory + ?Sized>(&mut self, mem: &M, q: &Queue) -> Result<u16, Broken> {
        let at = GuestAddress(q.avail_ring()).checked_add(2).ok_or(Broken::Unreadable(GuestAddress(q.avail_ring())))?;
        let avail = u16::from_le(mem.load(at, Ordering::Acquire).map_err(|_| Broken::Unreadable(at))?);
        let (next, size) = (q.next_avail(), q.size());
        if avail.wrapping_sub(next) > size {
            return Err(Broken::AvailIndex { avail, next, size });
        }
        self.avail = Some(avail);
        Ok(avail)
    }

    /// The guest's available index as last read, if it was read since the cursor was made.
    pub fn seen(&self) -> Option<u16> {
        self.avail
    }

    /// The head of the next available chain, moving `next_avail` past it; `None` when the
    /// guest has made no more available. The index is read again only when the chains it
    /// last showed are taken.
    pub fn next_head<M: GuestMemory + ?Sized>(&mut self, mem: &M, q: &mut Queue) -> Result<Option<u16>, Broken> {
        let (next, size) = (q.next_avail(), q.size());
        if size == 0 {
            return Ok(None);
        }
        let avail = match self.avail {
            Some(a) if a != next => a,
            _ => self.look(mem, q)?,
        };
        if avail == next {
            return Ok(None);
        }
        let slot = 4 + 2 * u64::from(next % size);
        let base = GuestAddress(q.avail_ring());
        let at = base.checked_add(slot).ok_or(Broken::Unreadable(base))?;
        let head = u16::from_le(mem.read_obj(at).map_err(|_| Broken::Unreadable(at))?);
        if head >= size {
            return Err(Broken::Head { head, size });
        }
        q.set_next_avail(next.wrapping_add(1));
        Ok(Some(head))
    }

    /// Asks the guest for a kick when it makes entry `at` available (event index) or at all
    /// (no event index), as `enable_notification` does at `next_avail`.
    pub fn ask_kick_at<M: GuestMemory>(mem: &M, q: &mut Queue, at: u16) {
        let keep = q.next_avail();
        q.set_next_avail(at);
        let _ = q.enable_notification(mem);
        q.set_next_avail(keep);
    }
}

/// Walks the chain whose head is `head` (checked by [`Cursor::next_head`]), handing each
/// descriptor to `each` until it returns false or the chain ends. At most
/// [`MAX_CHAIN_DESCRIPTORS`] descriptors are read; an indirect or zero-length one breaks
/// the queue before it is handed over.
pub fn walk<M: GuestMemory + ?Sized>(mem: &M, q: &Queue, head: u16, mut each: impl FnMut(Desc) -> bool) -> Walk {
    let size = q.size();
    let table = GuestAddress(q.desc_table());
    let bytes = 16 * usize::from(size);
    // The table as one checked slice when it lies in one region of the guest's memory (it
    // always does for QEMU's): each descriptor is then a bounds-checked copy out of it,
    // without looking the region up again.
    let slice = mem
        .get_slices(table, bytes, Permissions::Read)
        .ok()
        .and_then(|mut it| it.next())
        .and_then(Result::ok)
        .filter(|s| s.len() == bytes);
    let mut w = Walk::default();
    let mut i = head;
    loop {
        if w.descriptors == MAX_CHAIN_DESCRIPTORS {
            w.fault = Some(Fault::Refused(Refused::TooLong));
            return w;
        }
        let Some(at) = table.checked_add(16 * u64::from(i)) else {
            w.fault = Some(Fault::Broken(Broken::Unreadable(table)));
            return w;
        };
        let read = match &slice {
            Some(s) => s.get_ref::<Descriptor>(16 * usize::from(i)).ok().map(|r| r.load()),
            None => mem.read_obj(at).ok(),
        };
        let Some(d) = read else {
            w.fault = Some(Fault::Broken(Broken::Unreadable(at)));
            return w;
        };
        if d.flags() & DESC_INDIRECT != 0 {
            w.fault = Some(Fault::Broken(Broken::Indirect));
            return w;
        }
        if d.len() == 0 {
            w.fault = Some(Fault::Broken(Broken::ZeroLength));
            return w;
        }
        w.descriptors += 1;
        if !each(Desc { addr: d.addr(), len: d.len(), write: d.flags() & DESC_WRITE != 0 }) {
            return w;
        }
        if d.flags() & DESC_NEXT == 0 {
            w.whole = true;
            return w;
        }
        if d.next() >= size {
            w.fault = Some(Fault::Broken(Broken::Next { next: d.next(), size }));
            return w;
        }
        i = d.next();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::GuestMemoryMmap;

    const DESC: u64 = 0x1000;
    const AVAIL: u64 = 0x2000;
    const USED: u64 = 0x3000;

    fn ring(size: u16) -> (GuestMemoryMmap, Queue) {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x10000)]).unwrap();
        let mut q = Queue::new(size).unwrap();
        q.try_set_desc_table_address(GuestAddress(DESC)).unwrap();
        q.try_set_avail_ring_address(GuestAddress(AVAIL)).unwrap();
        q.try_set_used_ring_address(GuestAddress(USED)).unwrap();
        q.set_ready(true);
        (mem, q)
    }

    fn desc(mem: &GuestMemoryMmap, i: u16, addr: u64, len: u32, flags: u16, next: u16) {
        let mut d = [0u8; 16];
        d[..8].copy_from_slice(&addr.to_le_bytes());
        d[8..12].copy_from_slice(&len.to_le_bytes());
        d[12..14].copy_from_slice(&flags.to_le_bytes());
        d[14..16].copy_from_slice(&next.to_le_bytes());
        mem.write_slice(&d, GuestAddress(DESC + 16 * u64::from(i))).unwrap();
    }

    fn avail(mem: &GuestMemoryMmap, idx: u16, heads: &[u16]) {
        for (k, h) in heads.iter().enumerate() {
            mem.write_obj(h.to_le(), GuestAddress(AVAIL + 4 + 2 * k as u64)).unwrap();
        }
        mem.write_obj(idx.to_le(), GuestAddress(AVAIL + 2)).unwrap();
    }

    #[test]
    fn chains_are_handed_out_up_to_the_available_index() {
        let (mem, mut q) = ring(8);
        avail(&mem, 2, &[3, 5]);
        let mut c = Cursor::new(0);
        assert_eq!(c.next_head(&mem, &mut q), Ok(Some(3)));
        assert_eq!(c.next_head(&mem, &mut q), Ok(Some(5)));
        assert_eq!(c.next_head(&mem, &mut q), Ok(None));
        assert_eq!(q.next_avail(), 2);
    }

    #[test]
    fn an_index_further_ahead_than_the_size_breaks_the_queue() {
        let (mem, mut q) = ring(8);
        avail(&mem, 9, &[]);
        let mut c = Cursor::new(0);
        assert_eq!(c.next_head(&mem, &mut q), Err(Broken::AvailIndex { avail: 9, next: 0, size: 8 }));
        // Exactly a queue's worth is fine, across the index's wrap too.
        q.set_next_avail(u16::MAX - 3);
        avail(&mem, 4, &[1; 8]);
        assert_eq!(c.look(&mem, &q), Ok(4));
    }

    #[test]
    fn a_head_or_next_outside_the_table_breaks_the_queue() {
        let (mem, mut q) = ring(8);
        avail(&mem, 2, &[8, 0]);
        let mut c = Cursor::new(0);
        assert_eq!(c.next_head(&mem, &mut q), Err(Broken::Head { head: 8, size: 8 }));
        desc(&mem, 0, 0x8000, 10, DESC_NEXT, 200);
        let w = walk(&mem, &q, 0, |_| true);
        assert_eq!((w.descriptors, w.fault), (1, Some(Fault::Broken(Broken::Next { next: 200, size: 8 }))));
    }

    #[test]
    fn indirect_and_zero_length_descriptors_break_the_queue_before_they_are_handed_over() {
        let (mem, q) = ring(8);
        desc(&mem, 1, 0x8000, 4096, DESC_INDIRECT, 0);
        let w = walk(&mem, &q, 1, |_| panic!("an indirect descriptor was handed over"));
        assert_eq!((w.descriptors, w.fault), (0, Some(Fault::Broken(Broken::Indirect))));
        // A loop of zero-length descriptors: its first one breaks the queue.
        desc(&mem, 2, 0x8000, 0, DESC_NEXT, 2);
        let w = walk(&mem, &q, 2, |_| panic!("a zero-length descriptor was handed over"));
        assert_eq!((w.descriptors, w.fault), (0, Some(Fault::Broken(Broken::ZeroLength))));
        // Behind a good descriptor too.
        desc(&mem, 3, 0x8000, 10, DESC_NEXT, 2);
        let w = walk(&mem, &q, 3, |_| true);
        assert_eq!((w.descriptors, w.whole, w.fault), (1, false, Some(Fault::Broken(Broken::ZeroLength))));
    }

    #[test]
    fn looping_chains_are_refused_within_the_bound() {
        let (mem, q) = ring(8);
        desc(&mem, 2, 0x8000, 1, DESC_NEXT, 2);
        let mut seen = 0;
        let w = walk(&mem, &q, 2, |_| {
            seen += 1;
            true
        });
        assert_eq!((seen, w.descriptors, w.whole), (MAX_CHAIN_DESCRIPTORS, MAX_CHAIN_DESCRIPTORS, false));
        assert_eq!(w.fault, Some(Fault::Refused(Refused::TooLong)));
    }

    #[test]
    fn a_chain_ends_at_its_last_descriptor_or_where_the_caller_stops() {
        let (mem, q) = ring(8);
        desc(&mem, 0, 0x8000, 10, DESC_NEXT | DESC_WRITE, 1);
        desc(&mem, 1, 0x9000, 20, DESC_WRITE, 0);
        let mut lens = vec![];
        let w = walk(&mem, &q, 0, |d| {
            lens.push((d.len, d.write));
            true
        });
        assert_eq!((lens, w.whole, w.fault), (vec![(10, true), (20, true)], true, None));
        let w = walk(&mem, &q, 0, |_| false);
        assert_eq!((w.descriptors, w.whole), (1, false));
    }

    #[test]
    fn a_table_partly_outside_memory_is_read_up_to_its_end() {
        let (mem, mut q) = ring(8);
        // The table's last 64 bytes (descriptors 4 to 7) lie beyond the guest's memory.
        let table = 0x10000 - 64;
        q.try_set_desc_table_address(GuestAddress(table)).unwrap();
        let mut d = [0u8; 16];
        d[..8].copy_from_slice(&0x8000u64.to_le_bytes());
        d[8..12].copy_from_slice(&10u32.to_le_bytes());
        d[12..14].copy_from_slice(&DESC_NEXT.to_le_bytes());
        d[14..16].copy_from_slice(&5u16.to_le_bytes());
        mem.write_slice(&d, GuestAddress(table + 16)).unwrap();
        let w = walk(&mem, &q, 1, |_| true);
        assert_eq!(w.descriptors, 1);
        assert_eq!(w.fault, Some(Fault::Broken(Broken::Unreadable(GuestAddress(table + 16 * 5)))));
    }

    #[test]
    fn a_ring_outside_memory_breaks_the_queue() {
        let (mem, mut q) = ring(8);
        q.try_set_avail_ring_address(GuestAddress(0x10_0000)).unwrap();
        let mut c = Cursor::new(0);
        assert!(matches!(c.next_head(&mem, &mut q), Err(Broken::Unreadable(_))));
    }
}

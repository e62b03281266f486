//! A guest's side of a vhost-user network device, without a VM: the frontend protocol
//! (rust-vmm's `Frontend`, as QEMU speaks it), guest memory in a memfd, and split
//! virtqueues the "guest" fills and drains itself, as a virtio-net driver does.
//!
//! For the tests (protocol, frames through the switch, hostile descriptors) and for the
//! per-frame benchmark (`sluice bench vhost`); not a general virtio driver: single-buffer
//! transmit chains, receive buffers of a fixed size, one queue pair or several (each with
//! its own part of guest memory; [`Driver::select`] picks the one the calls use).
//!
//! It can also play a hostile guest: descriptors and chains of its own
//! ([`Driver::write_desc`], [`Driver::offer_tx_chain`], [`Driver::offer_rx_chain`]), an
//! available index anywhere ([`Driver::set_avail_idx`]), receive buffers of any size
//! ([`Driver::post_rx_sized`]); and reset a ring as QEMU does when the guest resets its
//! device ([`Driver::reset_ring`]). And a hostile QEMU: guest memory in a file shorter than
//! it says, in a memfd it could shrink, in a file it truncates later ([`Memory`],
//! [`Driver::connect_with`]); a call descriptor of any kind ([`Driver::set_call_fd`]); kick
//! and call eventfds it makes blocking and fills ([`Driver::make_kick_blocking`],
//! [`Driver::fill_call`]).

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd};
use std::path::Path;
use std::time::{Duration, Instant};

use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::{VhostBackend, VhostUserMemoryRegionInfo, VringConfigData};
use virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;
use vm_memory::{Bytes, FileOffset, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};
use vmm_sys_util::eventfd::EventFd;

use crate::sys;

/// Guest-physical base of the driver's memory.
pub const MEM_BASE: u64 = 0x10_0000;
/// Guest memory per queue pair (pair k's from `MEM_BASE + k * PAIR_AREA`).
const PAIR_AREA: u64 = 0x80_0000;
/// Descriptors per queue.
pub const QUEUE_SIZE: u16 = 256;
const RING_AREA: u64 = 0x1_0000; // per queue: descriptors, then avail at +0x4000, used at +0x8000
const RX_BUFS: u64 = 0x2_0000; // in the pair's area
/// Size of each receive buffer the driver posts.
pub const RX_BUF_SIZE: u32 = 2048;
const TX_BUFS: u64 = 0x10_0000; // in the pair's area
const TX_SLOT: u64 = 0x1_1000; // a 64 KiB frame, its header and some room
const TX_SLOTS: u16 = 64;

/// Descriptor flags.
pub const DESC_NEXT: u16 = 1;
/// The device writes into this descriptor's buffer.
pub const DESC_WRITE: u16 = 2;
/// The descriptor's buffer is a table of descriptors (VIRTIO_RING_F_INDIRECT_DESC).
pub const DESC_INDIRECT: u16 = 4;
/// Guest memory no queue uses (2 MiB from here), for a test's own buffers and tables.
pub const SPARE: u64 = MEM_BASE + 0x60_0000;

fn err(what: &str, e: impl std::fmt::Display) -> io::Error {
    io::Error::other(format!("{what}: {e}"))
}

struct Ring {
    base: u64,
    next_avail: u16,
    last_used: u16,
    kick: EventFd,
    call: EventFd,
}

impl Ring {
    fn desc(&self, i: u16) -> GuestAddress {
        GuestAddress(self.base + 16 * u64::from(i % QUEUE_SIZE))
    }
    fn avail(&self) -> u64 {
        self.base + 0x4000
    }
    fn used(&self) -> u64 {
        self.base + 0x8000
    }
}

/// A frame received, with its virtio-net header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Received {
    /// The 12-byte header as the device wrote it (`num_buffers` at bytes 10–11).
    pub header: [u8; 12],
    /// The Ethernet frame.
    pub frame: Vec<u8>,
}

/// One receive and one transmit queue, with the guest memory behind them.
struct Pair {
    rx: Ring,
    tx: Ring,
    tx_free: Vec<u16>,
    /// Guest-physical start of the pair's area.
    area: u64,
}

/// The guest side of one vhost-user network device.
pub struct Driver {
    frontend: Frontend,
    mem: GuestMemoryMmap,
    pairs: Vec<Pair>,
    /// The pair the calls use.
    cur: usize,
    /// The features the driver accepted.
    pub features: u64,
    /// The frontend's (this process's) address of guest memory's start.
    host: u64,
    /// Whether vhost-user's protocol features were accepted (rings are enabled by message).
    protocol: bool,
}

/// The file behind the driver's guest memory, as the frontend hands it to the device.
#[derive(Debug)]
pub enum Memory {
    /// A memfd sealed against shrinking and growing, as QEMU's `memory-backend-memfd` makes
    /// it (the default).
    Sealed,
    /// A memfd without seals (QEMU's `seal=off`): its owner could shrink it.
    Unsealed,
    /// A sealed memfd of this many bytes, announced as the whole guest memory (a file shorter
    /// than the region).
    Short(u64),
    /// This file (`memory-backend-file`), sized by the driver; the caller keeps a clone to
    /// truncate it under the device.
    File(File),
}

fn guest_memory(size: usize, memory: Memory) -> io::Result<GuestMemoryMmap> {
    let sealed = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW;
    let file = match memory {
        Memory::Sealed => {
            let f = sys::memfd(c"sluice-driver-guest")?;
            f.set_len(size as u64)?;
            sys::add_seals(f.as_raw_fd(), sealed)?;
            f
        }
        Memory::Unsealed => {
            let f = sys::memfd(c"sluice-driver-guest")?;
            f.set_len(size as u64)?;
            f
        }
        Memory::Short(len) => {
            let f = sys::memfd(c"sluice-driver-guest")?;
            f.set_len(len)?;
            sys::add_seals(f.as_raw_fd(), sealed)?;
            f
        }
        Memory::File(f) => {
            f.set_len(size as u64)?;
            f
        }
    };
    GuestMemoryMmap::from_ranges_with_files(&[(GuestAddress(MEM_BASE), size, Some(FileOffset::new(file, 0)))])
        .map_err(|e| err("mapping guest memory", e))
}

/// Hands ring `q` (at `ring.base`) to the device: size, addresses, base 0, call, kick,
/// enabled.
fn set_up_ring(frontend: &mut Frontend, q: usize, ring: &Ring, host: u64, protocol: bool) -> io::Result<()> {
    let p = |e: vhost::Error| err("vhost-user", e);
    let to_host = |g: u64| host + (g - MEM_BASE);
    frontend.set_vring_num(q, QUEUE_SIZE).map_err(p)?;
    let cfg = VringConfigData {
        queue_max_size: QUEUE_SIZE,
        queue_size: QUEUE_SIZE,
        flags: 0,
        desc_table_addr: to_host(ring.base),
        avail_ring_addr: to_host(ring.avail()),
        used_ring_addr: to_host(ring.used()),
        log_addr: None,
    };
    frontend.set_vring_addr(q, &cfg).map_err(p)?;
    frontend.set_vring_base(q, 0).map_err(p)?;
    frontend.set_vring_call(q, &ring.call).map_err(p)?;
    frontend.set_vring_kick(q, &ring.kick).map_err(p)?;
    if protocol {
        frontend.set_vring_enable(q, true).map_err(p)?;
    }
    Ok(())
}

impl Driver {
    /// Connects to the device at `path` (waiting up to `wait` for it to listen), accepts the
    /// offered features that are in `mask`, hands over memory and one queue pair.
    pub fn connect(path: &Path, mask: u64, wait: Duration) -> io::Result<Driver> {
        Self::connect_pairs(path, mask, 1, wait)
    }

    /// As [`Driver::connect`], with `pairs` queue pairs (more than one needs the device's
    /// VIRTIO_NET_F_MQ and vhost-user's MQ protocol feature), every one enabled.
    pub fn connect_pairs(path: &Path, mask: u64, pairs: usize, wait: Duration) -> io::Result<Driver> {
        Self::connect_with(path, mask, pairs, wait, Memory::Sealed)
    }

    /// As [`Driver::connect_pairs`], with guest memory in `memory`.
    pub fn connect_with(path: &Path, mask: u64, pairs: usize, wait: Duration, memory: Memory) -> io::Result<Driver> {
        let until = Instant::now() + wait;
        let frontend = loop {
            match Frontend::connect(path, 2 * pairs as u64) {
                Ok(f) => break f,
                Err(e) if Instant::now() > until => {
                    return Err(err(&format!("connecting to the vhost-user socket {}", path.display()), e));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        };
        Self::set_up(frontend, mask, pairs, memory)
    }

    /// Waits up to `wait` for the device to connect to `listener` (QEMU's `server=on`
    /// side), then sets it up as [`Driver::connect`] does.
    pub fn accept(listener: &vhost::vhost_user::Listener, mask: u64, wait: Duration) -> io::Result<Driver> {
        let until = Instant::now() + wait;
        listener.set_nonblocking(true).map_err(|e| err("listener", e))?;
        loop {
            match listener.accept() {
                Ok(Some(s)) => {
                    s.set_nonblocking(false)?;
                    return Self::set_up(Frontend::from_stream(s, 2), mask, 1, Memory::Sealed);
                }
                Ok(None) if Instant::now() < until => std::thread::sleep(Duration::from_millis(10)),
                Ok(None) => return Err(io::Error::new(io::ErrorKind::TimedOut, "no device connected in time")),
                Err(e) => return Err(err("accepting the device's connection", e)),
            }
        }
    }

    fn set_up(mut frontend: Frontend, mask: u64, pairs: usize, memory: Memory) -> io::Result<Driver> {
        let p = |e: vhost::Error| err("vhost-user", e);
        frontend.set_owner().map_err(p)?;
        let features = frontend.get_features().map_err(p)? & mask;
        frontend.set_features(features).map_err(p)?;
        // vhost-user's protocol features, when the device offers them.
        let protocol = features & VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits() != 0;
        if protocol {
            let proto = frontend.get_protocol_features().map_err(p)?;
            frontend
                .set_protocol_features(proto & (VhostUserProtocolFeatures::MQ | VhostUserProtocolFeatures::REPLY_ACK))
                .map_err(p)?;
        }
        if pairs > 1 {
            let max = if protocol { frontend.get_queue_num().map_err(p)? } else { 1 };
            if max < 2 * pairs as u64 {
                return Err(err("vhost-user", format!("the device has {max} queues, not {}", 2 * pairs)));
            }
        }
        let mem = guest_memory(PAIR_AREA as usize * pairs, memory)?;
        let region = mem.find_region(GuestAddress(MEM_BASE)).ok_or_else(|| err("guest memory", "no region"))?;
        let host = mem.get_host_address(GuestAddress(MEM_BASE)).map_err(|e| err("guest memory", e))? as u64;
        frontend.set_mem_table(&[VhostUserMemoryRegionInfo::from_guest_region(region).map_err(p)?]).map_err(p)?;
        let mut rings = Vec::new();
        for q in 0..2 * pairs {
            let ring = Ring {
                base: MEM_BASE + PAIR_AREA * (q / 2) as u64 + RING_AREA * (q % 2) as u64,
                next_avail: 0,
                last_used: 0,
                kick: EventFd::new(libc::EFD_NONBLOCK)?,
                call: EventFd::new(libc::EFD_NONBLOCK)?,
            };
            set_up_ring(&mut frontend, q, &ring, host, protocol)?;
            rings.push(ring);
        }
        let mut list = Vec::new();
        let mut it = rings.into_iter();
        while let (Some(rx), Some(tx)) = (it.next(), it.next()) {
            let area = MEM_BASE + PAIR_AREA * list.len() as u64;
            list.push(Pair { rx, tx, tx_free: (0..TX_SLOTS).rev().collect(), area });
        }
        Ok(Driver { frontend, mem, pairs: list, cur: 0, features, host, protocol })
    }

    /// Makes the calls that follow use queue pair `k` (queues `2k` and `2k + 1`).
    pub fn select(&mut self, k: usize) {
        assert!(k < self.pairs.len(), "the driver has {} queue pairs", self.pairs.len());
        self.cur = k;
    }

    /// The guest's memory, for tests that write their own descriptors.
    pub fn memory(&self) -> &GuestMemoryMmap {
        &self.mem
    }

    /// The file behind the guest's memory (to shrink it under the device).
    pub fn memory_file(&self) -> Option<&File> {
        self.mem.iter().next().and_then(|r| r.file_offset()).map(|f| f.file())
    }

    fn put_avail(&mut self, transmit: bool, head: u16) -> io::Result<()> {
        let pair = &mut self.pairs[self.cur];
        let r = if transmit { &mut pair.tx } else { &mut pair.rx };
        let slot = GuestAddress(r.avail() + 4 + 2 * u64::from(r.next_avail % QUEUE_SIZE));
        self.mem.write_obj(head, slot).map_err(|e| err("avail ring", e))?;
        let old = r.next_avail;
        r.next_avail = r.next_avail.wrapping_add(1);
        // The index last, after the entry (one thread, plain memory: a fence orders them).
        std::sync::atomic::fence(std::sync::atomic::Ordering::Release);
        self.mem.write_obj(r.next_avail, GuestAddress(r.avail() + 2)).map_err(|e| err("avail ring", e))?;
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        // With event indexes the device says which entry it wants a kick for (as a
        // virtio-net driver does, kick only then).
        if self.features & (1 << VIRTIO_RING_F_EVENT_IDX) != 0 {
            let event: u16 = self
                .mem
                .read_obj(GuestAddress(r.used() + 4 + 8 * u64::from(QUEUE_SIZE)))
                .map_err(|e| err("used ring", e))?;
            if r.next_avail.wrapping_sub(event).wrapping_sub(1) >= r.next_avail.wrapping_sub(old) {
                return Ok(());
            }
        }
        r.kick.write(1).map_err(|e| err("kick", e))
    }

    /// Writes descriptor `i` of the transmit (`transmit`) or receive queue.
    pub fn write_desc(&self, transmit: bool, i: u16, addr: u64, len: u32, flags: u16, next: u16) -> io::Result<()> {
        let pair = &self.pairs[self.cur];
        let r = if transmit { &pair.tx } else { &pair.rx };
        let mut d = [0u8; 16];
        d[..8].copy_from_slice(&addr.to_le_bytes());
        d[8..12].copy_from_slice(&len.to_le_bytes());
        d[12..14].copy_from_slice(&flags.to_le_bytes());
        d[14..16].copy_from_slice(&next.to_le_bytes());
        self.mem.write_slice(&d, r.desc(i)).map_err(|e| err("descriptor table", e))
    }

    /// Offers a chain whose head is transmit descriptor `head` (written by the caller with
    /// [`Driver::write_desc`]): for tests of hostile chains.
    pub fn offer_tx_chain(&mut self, head: u16) -> io::Result<()> {
        self.put_avail(true, head)
    }

    /// Offers a chain whose head is receive descriptor `head` (written by the caller).
    pub fn offer_rx_chain(&mut self, head: u16) -> io::Result<()> {
        self.put_avail(false, head)
    }

    fn ring_mut(&mut self, transmit: bool) -> &mut Ring {
        let pair = &mut self.pairs[self.cur];
        if transmit { &mut pair.tx } else { &mut pair.rx }
    }

    /// The driver's available index of the transmit (`transmit`) or receive queue.
    pub fn avail_idx(&mut self, transmit: bool) -> u16 {
        self.ring_mut(transmit).next_avail
    }

    /// Writes `idx` as the queue's available index, whatever the entries say (a hostile
    /// guest), and kicks. The driver's own count stays as it was.
    pub fn set_avail_idx(&mut self, transmit: bool, idx: u16) -> io::Result<()> {
        let at = GuestAddress(self.ring_mut(transmit).avail() + 2);
        self.mem.write_obj(idx, at).map_err(|e| err("avail ring", e))?;
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        self.kick(transmit)
    }

    /// Kicks the device for the transmit (`transmit`) or receive queue.
    pub fn kick(&mut self, transmit: bool) -> io::Result<()> {
        self.ring_mut(transmit).kick.write(1).map_err(|e| err("kick", e))
    }

    /// The receive queue's used index (chains the device returned, ever).
    pub fn rx_used(&self) -> io::Result<u16> {
        self.mem.read_obj(GuestAddress(self.pairs[self.cur].rx.used() + 2)).map_err(|e| err("used ring", e))
    }

    /// Posts up to `n` receive buffers of `size` bytes (at most [`RX_BUF_SIZE`]; a guest
    /// with tiny buffers); returns how many.
    pub fn post_rx_sized(&mut self, n: u16, size: u32) -> io::Result<u16> {
        let size = size.min(RX_BUF_SIZE);
        let room = QUEUE_SIZE - self.pairs[self.cur].rx.next_avail.wrapping_sub(self.pairs[self.cur].rx.last_used);
        let n = n.min(room);
        for _ in 0..n {
            let i = self.pairs[self.cur].rx.next_avail % QUEUE_SIZE;
            let buf = self.pairs[self.cur].area + RX_BUFS + u64::from(RX_BUF_SIZE) * u64::from(i);
            self.write_desc(false, i, buf, size, DESC_WRITE, 0)?;
            self.put_avail(false, i)?;
        }
        Ok(n)
    }

    /// Stops the transmit (`transmit`) or receive queue and sets it up again from scratch,
    /// as QEMU does when the guest resets its network device: the device forgets what it
    /// found wrong with the ring.
    pub fn reset_ring(&mut self, transmit: bool) -> io::Result<()> {
        let q = 2 * self.cur + usize::from(transmit);
        self.frontend.get_vring_base(q).map_err(|e| err("vhost-user", e))?;
        let base = self.ring_mut(transmit).base;
        // Descriptors, avail and used rings: all zero, as a fresh driver leaves them.
        self.mem.write_slice(&vec![0u8; RING_AREA as usize], GuestAddress(base)).map_err(|e| err("ring", e))?;
        let r = self.ring_mut(transmit);
        (r.next_avail, r.last_used) = (0, 0);
        if transmit {
            self.pairs[self.cur].tx_free = (0..TX_SLOTS).rev().collect();
        }
        let (host, protocol) = (self.host, self.protocol);
        let pair = &self.pairs[self.cur];
        set_up_ring(&mut self.frontend, q, if transmit { &pair.tx } else { &pair.rx }, host, protocol)
    }

    /// Queues one frame (`header` then `frame`, in one buffer) for the device to take.
    /// False when every transmit slot is in flight.
    pub fn send(&mut self, header: &[u8; 12], frame: &[u8]) -> io::Result<bool> {
        self.reclaim_tx()?;
        let Some(slot) = self.pairs[self.cur].tx_free.pop() else { return Ok(false) };
        let addr = self.pairs[self.cur].area + TX_BUFS + TX_SLOT * u64::from(slot);
        let len = 12 + frame.len();
        if len as u64 > TX_SLOT {
            self.pairs[self.cur].tx_free.push(slot);
            return Err(err("send", format!("a frame of {} bytes does not fit a slot", frame.len())));
        }
        self.mem.write_slice(header, GuestAddress(addr)).map_err(|e| err("tx buffer", e))?;
        self.mem.write_slice(frame, GuestAddress(addr + 12)).map_err(|e| err("tx buffer", e))?;
        self.write_desc(true, slot, addr, len as u32, 0, 0)?;
        self.put_avail(true, slot)?;
        Ok(true)
    }

    /// Transmit chains the device is done with go back to the free slots; returns how
    /// many the device has not returned yet.
    pub fn reclaim_tx(&mut self) -> io::Result<usize> {
        let used_idx: u16 =
            self.mem.read_obj(GuestAddress(self.pairs[self.cur].tx.used() + 2)).map_err(|e| err("used ring", e))?;
        while self.pairs[self.cur].tx.last_used != used_idx {
            let at = self.pairs[self.cur].tx.used() + 4 + 8 * u64::from(self.pairs[self.cur].tx.last_used % QUEUE_SIZE);
            let id: u32 = self.mem.read_obj(GuestAddress(at)).map_err(|e| err("used ring", e))?;
            if id < u32::from(TX_SLOTS) {
                self.pairs[self.cur].tx_free.push(id as u16);
            }
            self.pairs[self.cur].tx.last_used = self.pairs[self.cur].tx.last_used.wrapping_add(1);
        }
        Ok(usize::from(self.pairs[self.cur].tx.next_avail.wrapping_sub(self.pairs[self.cur].tx.last_used)))
    }

    /// The transmit queue's used index (chains the device returned, ever).
    pub fn tx_used(&self) -> io::Result<u16> {
        self.mem.read_obj(GuestAddress(self.pairs[self.cur].tx.used() + 2)).map_err(|e| err("used ring", e))
    }

    /// Posts up to `n` receive buffers of [`RX_BUF_SIZE`] bytes (never more than the
    /// queue's size in flight); returns how many.
    pub fn post_rx(&mut self, n: u16) -> io::Result<u16> {
        self.post_rx_sized(n, RX_BUF_SIZE)
    }

    /// Posts receive buffers up to a full queue.
    pub fn fill_rx(&mut self) -> io::Result<()> {
        self.post_rx(QUEUE_SIZE).map(drop)
    }

    /// Takes the next frame the device wrote, gathering mergeable buffers; `None` when
    /// none is complete.
    pub fn recv(&mut self) -> io::Result<Option<Received>> {
        let used_idx: u16 =
            self.mem.read_obj(GuestAddress(self.pairs[self.cur].rx.used() + 2)).map_err(|e| err("used ring", e))?;
        if self.pairs[self.cur].rx.last_used == used_idx {
            return Ok(None);
        }
        let entry = |k: u16| -> io::Result<(u32, u32)> {
            let at = self.pairs[self.cur].rx.used() + 4 + 8 * u64::from(k % QUEUE_SIZE);
            let id: u32 = self.mem.read_obj(GuestAddress(at)).map_err(|e| err("used ring", e))?;
            let len: u32 = self.mem.read_obj(GuestAddress(at + 4)).map_err(|e| err("used ring", e))?;
            Ok((id, len))
        };
        let (id, len) = entry(self.pairs[self.cur].rx.last_used)?;
        if len == 0 {
            // A buffer the device returned empty (it refused the chain): nothing to read,
            // as Linux drops such a buffer.
            self.pairs[self.cur].rx.last_used = self.pairs[self.cur].rx.last_used.wrapping_add(1);
            return Ok(Some(Received { header: [0; 12], frame: Vec::new() }));
        }
        let area = self.pairs[self.cur].area;
        let buf = |id: u32| area + RX_BUFS + u64::from(RX_BUF_SIZE) * u64::from(id % u32::from(QUEUE_SIZE));
        let mut header = [0u8; 12];
        self.mem.read_slice(&mut header, GuestAddress(buf(id))).map_err(|e| err("rx buffer", e))?;
        let nbufs = u16::from_le_bytes([header[10], header[11]]).max(1);
        if used_idx.wrapping_sub(self.pairs[self.cur].rx.last_used) < nbufs {
            return Ok(None); // the rest of the frame's buffers are not there yet
        }
        let mut frame = vec![0u8; (len as usize).saturating_sub(12)];
        self.mem.read_slice(&mut frame, GuestAddress(buf(id) + 12)).map_err(|e| err("rx buffer", e))?;
        for k in 1..nbufs {
            let (id, len) = entry(self.pairs[self.cur].rx.last_used.wrapping_add(k))?;
            let at = frame.len();
            frame.resize(at + len as usize, 0);
            self.mem.read_slice(&mut frame[at..], GuestAddress(buf(id))).map_err(|e| err("rx buffer", e))?;
        }
        self.pairs[self.cur].rx.last_used = self.pairs[self.cur].rx.last_used.wrapping_add(nbufs);
        Ok(Some(Received { header, frame }))
    }

    /// Waits up to `wait` for a received frame.
    pub fn recv_wait(&mut self, wait: Duration) -> io::Result<Option<Received>> {
        let until = Instant::now() + wait;
        loop {
            if let Some(r) = self.recv()? {
                return Ok(Some(r));
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            let _ = self.pairs[self.cur].rx.call.read();
            // Ask for a signal at the next used entry (event index), then look once more.
            let used_event = GuestAddress(self.pairs[self.cur].rx.avail() + 4 + 2 * u64::from(QUEUE_SIZE));
            self.mem.write_obj(self.pairs[self.cur].rx.last_used, used_event).map_err(|e| err("avail ring", e))?;
            std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
            if let Some(r) = self.recv()? {
                return Ok(Some(r));
            }
            let _ = sys::poll(
                self.pairs[self.cur].rx.call.as_raw_fd(),
                libc::POLLIN,
                left.as_millis().clamp(1, 100) as i32,
            );
        }
    }

    /// Waits up to `wait` until the device returned every transmit chain.
    pub fn tx_drained(&mut self, wait: Duration) -> io::Result<bool> {
        let until = Instant::now() + wait;
        while self.reclaim_tx()? > 0 {
            if Instant::now() > until {
                return Ok(false);
            }
            let _ = sys::poll(self.pairs[self.cur].tx.call.as_raw_fd(), libc::POLLIN, 10);
            let _ = self.pairs[self.cur].tx.call.read();
        }
        Ok(true)
    }

    /// The frontend, for protocol-level tests.
    pub fn frontend(&mut self) -> &mut Frontend {
        &mut self.frontend
    }

    /// Hands the device `fd` as the call descriptor of the transmit (`transmit`) or receive
    /// queue of the selected pair, whatever it is (a pipe, a socket…).
    pub fn set_call_fd(&mut self, transmit: bool, fd: OwnedFd) -> io::Result<()> {
        let q = 2 * self.cur + usize::from(transmit);
        // SAFETY: `fd` is owned and handed over whole; the EventFd only carries it to the
        // message (vmm-sys-util's EventFd is a plain owned descriptor).
        let e = unsafe { EventFd::from_raw_fd(fd.into_raw_fd()) };
        self.frontend.set_vring_call(q, &e).map_err(|e| err("vhost-user", e))
    }

    /// Clears `O_NONBLOCK` on the kick eventfd of the transmit (`transmit`) or receive queue
    /// (the device shares its open file description).
    pub fn make_kick_blocking(&mut self, transmit: bool) -> io::Result<()> {
        sys::set_nonblocking(self.ring_mut(transmit).kick.as_raw_fd(), false)
    }

    /// Clears `O_NONBLOCK` on the call eventfd of the transmit (`transmit`) or receive queue
    /// and fills its counter (never read again), so that a write into it would wait forever.
    pub fn fill_call(&mut self, transmit: bool) -> io::Result<()> {
        let r = self.ring_mut(transmit);
        let _ = r.call.read();
        r.call.write(u64::MAX - 1).map_err(|e| err("call", e))?;
        sys::set_nonblocking(r.call.as_raw_fd(), false)
    }
}

//! The switch's side of a vhost-user port: frames taken from the guest's transmit queues
//! and written into its receive queues, on the datapath thread.
//!
//! What the guest writes into its queues is hostile input. The rings are walked by
//! [`crate::ring`]: every index checked, every byte moved through `vm-memory`'s checked
//! accessors (an address outside the guest's memory is an error, never a read of sluice's
//! own). A ring that lies (an available index too far ahead, a descriptor index outside
//! the table, an indirect or zero-length descriptor, a receive buffer smaller than the
//! virtio-net header with mergeable buffers) breaks only its queue: counted, logged at most
//! once a minute, never read or written again until the frontend sets it up anew, shown by
//! `link_state`. A chain longer than `MAX_CHAIN_DESCRIPTORS`, holding a write-only
//! descriptor (transmit) or more bytes than a frame may have is returned used and counted,
//! and nothing is copied out of it; a receive chain the guest marked read-only loses only
//! the frame written into it; a frame that would take more than `MAX_FRAME_CHAINS` receive
//! chains is dropped and its chains returned empty, and later frames that large are dropped
//! without taking any while the next buffer is no larger.
//!
//! Work per call is bounded whatever the guest wrote: `recv` takes at most one chain (of at
//! most 64 descriptors and one frame's bytes) and looks at each transmit queue at most
//! twice; `send` writes at most 64 chains per frame (or segment) and looks at a receive
//! queue found full again only when the guest moved its available index. How many calls a
//! port gets per turn of the event loop is the switch's `batch`. What the guest does wrong
//! costs no formatting per frame: an error's message is made only if someone reads it.

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sluice_switch::port::DeviceDrops;
use sluice_switch::{OutFrame, Port, PortCaps, PortError, TxOutcome};
use sluice_wire::{VNET_HDR_LEN, VnetHdr};
use tracing::warn;
use vhost_user_backend::{VringRwLock, VringState, VringT};
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_net::{
    VIRTIO_NET_F_GUEST_CSUM, VIRTIO_NET_F_GUEST_TSO4, VIRTIO_NET_F_GUEST_TSO6, VIRTIO_NET_F_MRG_RXBUF,
};
use virtio_queue::QueueT;
use vm_memory::{Address, Bytes, GuestAddress, GuestAddressSpace, GuestMemoryAtomic, GuestMemoryMmap};
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::EventFd;

use crate::backend::NUM_QUEUES;
use crate::eventfd::Notified;
use crate::ring::{self, Broken, Cursor, Fault, MAX_FRAME_CHAINS, Refused};

/// A connected frontend's queues and memory, as the port uses them.
pub(crate) struct Link {
    /// Receive queue of pair `k` at `2k`, transmit queue at `2k + 1`.
    pub(crate) vrings: Vec<VringRwLock>,
    /// The guest's memory (replaced in place when the frontend sends a new table).
    pub(crate) mem: GuestMemoryAtomic<GuestMemoryMmap>,
    /// Set by the SIGBUS guard when a page of that memory went away under the switch: the
    /// connection is ended.
    pub(crate) faulted: Arc<AtomicBool>,
}

impl Link {
    /// Whether queue `q` is set up (kicked) and enabled: the guest's driver uses it.
    fn usable(&self, q: usize) -> bool {
        let st = self.vrings[q].get_ref();
        st.get_queue().ready() && st.is_enabled()
    }

    /// The guest's queue pairs in use: the first ones whose receive queue is usable.
    fn pairs_in_use(&self) -> usize {
        (0..self.vrings.len() / 2).take_while(|&k| self.usable(2 * k)).count()
    }
}

/// What the port's serving thread and the datapath share.
pub struct Shared {
    /// Readable when frames may wait: the transmit rings' kicks, and a nudge.
    frames: Epoll,
    frames_nudge: EventFd,
    /// Readable when buffers may have been posted: the receive rings' kicks, and a nudge.
    room: Epoll,
    room_nudge: EventFd,
    acked: AtomicU64,
    link: Mutex<Option<Arc<Link>>>,
    generation: AtomicU64,
    /// Counts changes of the rings' state (set up, enabled, stopped): the datapath
    /// recounts the queue pairs in use when it moves.
    rings_changed: AtomicU64,
    /// Per ring, counts the frontend's set-ups of it (its size, addresses, base, kick, a
    /// stop): a queue broken by its guest is looked at again once its count moved.
    ring_setups: [AtomicU64; NUM_QUEUES],
    pub(crate) stop: AtomicBool,
    state: Mutex<String>,
    /// The connection, to end it when the port goes.
    pub(crate) conn: Mutex<Option<std::os::unix::net::UnixStream>>,
    /// Connections taken (a QEMU restart makes one more).
    pub connections: AtomicU64,
    /// Connections refused: a peer that is not allowed (`crate::Allow`).
    pub refused: AtomicU64,
    /// Connections ended because the peer sent something the switch refuses (a memory
    /// region it could shrink or that is too short, a descriptor that is no eventfd).
    pub rejected: AtomicU64,
    /// Connections ended because a page of the guest's memory went away under the switch.
    pub memory_faults: AtomicU64,
    /// Connections ended because the peer kept a call eventfd full and blocking.
    pub stalled_calls: AtomicU64,
    /// Why the switch is ending the current connection (taken by its serving thread), and
    /// why it last refused what a peer sent or ended its connection.
    refusal: Mutex<(Option<String>, Option<String>)>,
}

const NUDGE: u64 = u64::MAX;

impl Shared {
    /// Wait sets and an empty link.
    pub(crate) fn new() -> io::Result<Arc<Shared>> {
        let (frames, room) = (Epoll::new()?, Epoll::new()?);
        let (frames_nudge, room_nudge) = (EventFd::new(libc::EFD_NONBLOCK)?, EventFd::new(libc::EFD_NONBLOCK)?);
        frames.ctl(ControlOperation::Add, frames_nudge.as_raw_fd(), EpollEvent::new(EventSet::IN, NUDGE))?;
        room.ctl(ControlOperation::Add, room_nudge.as_raw_fd(), EpollEvent::new(EventSet::IN, NUDGE))?;
        Ok(Arc::new(Shared {
            frames,
            frames_nudge,
            room,
            room_nudge,
            acked: AtomicU64::new(0),
            link: Mutex::new(None),
            generation: AtomicU64::new(0),
            rings_changed: AtomicU64::new(0),
            ring_setups: std::array::from_fn(|_| AtomicU64::new(0)),
            stop: AtomicBool::new(false),
            state: Mutex::new(String::new()),
            conn: Mutex::new(None),
            connections: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
            memory_faults: AtomicU64::new(0),
            stalled_calls: AtomicU64::new(0),
            refusal: Mutex::new((None, None)),
        }))
    }

    /// Remembers why the current connection is being ended (for its serving thread's log,
    /// and for `sluice port list`).
    pub(crate) fn end_with(&self, why: String) {
        let mut r = self.refusal.lock().unwrap_or_else(|p| p.into_inner());
        r.0.get_or_insert_with(|| why.clone());
        r.1 = Some(why);
    }

    /// Why the current connection is being ended, if the switch ends it (taken: once).
    pub(crate) fn take_end(&self) -> Option<String> {
        self.refusal.lock().unwrap_or_else(|p| p.into_inner()).0.take()
    }

    /// Why the switch last refused what the peer sent, or ended its connection.
    pub fn refusal(&self) -> Option<String> {
        self.refusal.lock().unwrap_or_else(|p| p.into_inner()).1.clone()
    }

    /// Ends the connection (its serving thread sees the socket close), keeping `why`.
    pub(crate) fn end_connection(&self, why: String) {
        self.end_with(why);
        if let Some(c) = self.conn.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
            let _ = c.shutdown(std::net::Shutdown::Both);
        }
    }

    /// Ring `index`'s kick eventfd joins its wait set (transmit rings are odd).
    pub(crate) fn watch_kick(&self, index: usize, fd: RawFd) -> io::Result<()> {
        let ep = if index % 2 == 1 { &self.frames } else { &self.room };
        ep.ctl(ControlOperation::Add, fd, EpollEvent::new(EventSet::IN, index as u64))
    }

    /// Ring `index`'s kick eventfd leaves its wait set.
    pub(crate) fn unwatch_kick(&self, index: usize, fd: RawFd) {
        let ep = if index % 2 == 1 { &self.frames } else { &self.room };
        let _ = ep.ctl(ControlOperation::Delete, fd, EpollEvent::default());
    }

    /// Makes the datapath look at the rings (a ring started, stopped or was enabled, a
    /// connection came or went).
    pub(crate) fn nudge(&self) {
        self.rings_changed.fetch_add(1, Ordering::AcqRel);
        let _ = self.frames_nudge.write(1);
        let _ = self.room_nudge.write(1);
    }

    /// The frontend set ring `index` up (again): whatever the port found wrong with the
    /// guest's use of it is forgotten.
    pub(crate) fn ring_set_up(&self, index: usize) {
        if let Some(c) = self.ring_setups.get(index) {
            c.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// Empties one wait set: its nudge and its rings' kicks.
    fn drain(&self, transmit: bool, link: Option<&Link>) {
        let _ = if transmit { self.frames_nudge.read() } else { self.room_nudge.read() };
        if let Some(l) = link {
            for v in l.vrings.iter().skip(usize::from(transmit)).step_by(2) {
                if let Some(k) = v.get_ref().get_kick() {
                    crate::eventfd::drain(k.as_raw_fd());
                }
            }
        }
    }

    pub(crate) fn set_acked(&self, features: u64) {
        self.acked.store(features, Ordering::Release);
    }

    /// The features the frontend accepted (0 while none is connected).
    pub fn acked(&self) -> u64 {
        self.acked.load(Ordering::Acquire)
    }

    /// Hands a checked connection to the datapath, or takes it away.
    pub(crate) fn publish(&self, link: Option<Arc<Link>>) {
        if link.is_none() {
            self.set_acked(0);
        }
        *self.link.lock().unwrap_or_else(|p| p.into_inner()) = link;
        self.generation.fetch_add(1, Ordering::AcqRel);
        // Whatever the guest queued before (or after a restart) is looked at at once.
        self.nudge();
    }

    pub(crate) fn set_state(&self, s: String) {
        *self.state.lock().unwrap_or_else(|p| p.into_inner()) = s;
    }

    /// What the port is doing: connected to whom, or waiting for what.
    pub fn state(&self) -> String {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Whether a checked frontend is connected.
    pub fn connected(&self) -> bool {
        self.link.lock().unwrap_or_else(|p| p.into_inner()).is_some()
    }
}

const fn bit(b: u32) -> u64 {
    1 << b
}

/// The virtio-net header the frontend's features give its frames: 12 bytes with virtio
/// 1.0 or mergeable buffers, 10 for a legacy device without them.
pub fn header_len(features: u64) -> usize {
    if features & (bit(VIRTIO_F_VERSION_1) | bit(VIRTIO_NET_F_MRG_RXBUF)) != 0 { VNET_HDR_LEN } else { 10 }
}

/// Whether a guest that accepted `features` takes a frame with header `h` as it is.
fn guest_takes(features: u64, h: &VnetHdr) -> bool {
    if h.needs_csum() && features & bit(VIRTIO_NET_F_GUEST_CSUM) == 0 {
        return false;
    }
    if h.gso_type & VnetHdr::GSO_ECN != 0 {
        return false; // VIRTIO_NET_F_GUEST_ECN is not offered
    }
    match h.gso_kind() {
        VnetHdr::GSO_NONE => true,
        VnetHdr::GSO_TCPV4 => features & bit(VIRTIO_NET_F_GUEST_TSO4) != 0,
        VnetHdr::GSO_TCPV6 => features & bit(VIRTIO_NET_F_GUEST_TSO6) != 0,
        _ => false, // UDP segmentation offload is not offered
    }
}

/// Why a guest's chain was refused.
#[derive(Debug)]
enum Bad {
    WriteOnly,
    ReadOnly,
    TooLong(usize),
    Short,
    Memory(GuestAddress),
    Refused(Refused),
    SmallBuffers(usize),
}

impl std::fmt::Display for Bad {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Bad::WriteOnly => write!(f, "the guest put a write-only descriptor into a transmit chain"),
            Bad::ReadOnly => write!(f, "the guest posted a read-only receive buffer"),
            Bad::TooLong(n) => write!(f, "the guest's transmit chain holds more than {n} bytes"),
            Bad::Short => write!(f, "the guest's transmit chain is shorter than the virtio-net header"),
            Bad::Memory(a) => write!(f, "the guest's descriptor points outside its memory (0x{:x})", a.raw_value()),
            Bad::Refused(Refused::TooLong) => {
                write!(f, "the guest's chain has more than {} descriptors", ring::MAX_CHAIN_DESCRIPTORS)
            }
            Bad::SmallBuffers(n) => write!(
                f,
                "the guest's receive buffers are too small: a frame of {n} bytes would take more than {MAX_FRAME_CHAINS} of them"
            ),
        }
    }
}

impl std::error::Error for Bad {}

impl Bad {
    /// The port's error for it (its message made only when read).
    fn into_error(self) -> PortError {
        PortError::Io(io::Error::new(io::ErrorKind::InvalidData, self))
    }
}

/// A frame dropped for broken queue `q` of the guest's.
#[derive(Debug)]
struct ToBroken {
    q: usize,
    why: Option<Broken>,
}

impl std::fmt::Display for ToBroken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the guest broke its {}", queue_name(self.q))?;
        if let Some(why) = self.why {
            write!(f, " ({why})")?;
        }
        write!(f, "; the VM must reset its network device")
    }
}

impl std::error::Error for ToBroken {}

/// Counts kept by the port itself, beside the switch's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PortCounts {
    /// Transmit chains refused (returned to the guest used, with length 0), whatever the
    /// reason.
    pub bad_tx_chains: u64,
    /// Frames lost to receive chains refused (read-only, outside memory, too many
    /// descriptors; the chains returned empty).
    pub bad_rx_buffers: u64,
    /// Segments of a frame cut for a guest without offloads that found no buffer.
    pub segments_lost: u64,
    /// Frames offered while no guest was connected.
    pub no_link: u64,
    /// Chains refused for more than `MAX_CHAIN_DESCRIPTORS` descriptors (either direction).
    pub long_chains: u64,
    /// Frames into the guest dropped because they would take more than `MAX_FRAME_CHAINS`
    /// of its receive buffers (the first one's chains returned empty; later ones while the
    /// guest posts no larger buffer take none).
    pub small_buffers: u64,
    /// Queues found broken (an available index too far ahead, a descriptor index outside
    /// the table, an indirect or zero-length descriptor, a receive buffer smaller than the
    /// virtio-net header with mergeable buffers, a ring outside the guest's memory).
    pub broken_queues: u64,
    /// Frames into the guest dropped because its receive queues are broken.
    pub to_broken_queue: u64,
    /// Interrupts the guest missed: its call eventfd's counter was full (QEMU reads it; a
    /// peer that never does only starves its own guest).
    pub lost_calls: u64,
}

/// What the port logs, each at most once a minute.
#[derive(Clone, Copy)]
enum Cause {
    Broken = 0,
    Refused = 1,
    SmallBuffers = 2,
    LostCall = 3,
}

const LOG_EVERY: Duration = Duration::from_secs(60);

/// "receive queue 0", "transmit queue 1": queue `q` as the guest's driver numbers them.
fn queue_name(q: usize) -> String {
    format!("{} queue {}", if q % 2 == 1 { "transmit" } else { "receive" }, q / 2)
}

/// A vhost-user port: a VM's virtio-net queues, attached to the switch.
pub struct VhostUserPort {
    name: String,
    shared: Arc<Shared>,
    generation: u64,
    link: Option<Arc<Link>>,
    /// The queue pairs in use, as of `rings_changed` at the first value.
    pairs: (u64, usize),
    next_tx: usize,
    offload: bool,
    /// Each queue's state beside virtio-queue's: broken, full, the index last read.
    rings: [Cursor; NUM_QUEUES],
    /// When each [`Cause`] was last logged.
    logged: [Option<Instant>; 4],
    /// Chains taken for the frame being written: (head, bytes written).
    used: Vec<(u16, u32)>,
    /// The descriptors of the chain being read or written: (address, length).
    chain: Vec<(GuestAddress, usize)>,
    /// Contiguous copy of a frame and its segments, for guests without offloads.
    whole: Vec<u8>,
    scratch: Vec<u8>,
    segs: Vec<u8>,
    seg_ends: Vec<usize>,
    counts: PortCounts,
    serving: Option<std::thread::JoinHandle<()>>,
    /// The socket to remove when the port goes (server mode).
    socket: Option<std::path::PathBuf>,
}

impl VhostUserPort {
    /// A port named `name` over `shared`, served by the thread `serving` (joined when the
    /// port goes).
    pub(crate) fn new(
        name: &str,
        shared: Arc<Shared>,
        offload: bool,
        serving: Option<std::thread::JoinHandle<()>>,
        socket: Option<std::path::PathBuf>,
    ) -> Self {
        VhostUserPort {
            name: name.to_string(),
            shared,
            generation: u64::MAX,
            link: None,
            pairs: (u64::MAX, 0),
            next_tx: 0,
            offload,
            rings: [Cursor::new(u64::MAX); NUM_QUEUES],
            logged: [None; 4],
            used: Vec::with_capacity(MAX_FRAME_CHAINS),
            chain: Vec::with_capacity(ring::MAX_CHAIN_DESCRIPTORS),
            whole: Vec::new(),
            scratch: Vec::new(),
            segs: Vec::new(),
            seg_ends: Vec::new(),
            counts: PortCounts::default(),
            serving,
            socket,
        }
    }

    /// The descriptor that is readable when frames may wait on the guest's transmit
    /// queues (the event loop's read interest): an epoll set of the transmit rings' kicks
    /// and the port's own nudge.
    pub fn frames_fd(&self) -> RawFd {
        self.shared.frames.as_raw_fd()
    }

    /// The descriptor that is readable when the guest posted receive buffers (the event
    /// loop's write interest): an epoll set of the receive rings' kicks — readable, since
    /// nothing here can say "writable".
    pub fn room_fd(&self) -> RawFd {
        self.shared.room.as_raw_fd()
    }

    /// What the port and its serving thread share.
    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// The port's own counts.
    pub fn counts(&self) -> PortCounts {
        self.counts
    }

    /// Why queue `q` (receive queue of pair `k` at `2k`, transmit at `2k + 1`) is broken,
    /// if its guest broke it and the frontend has not set it up since.
    pub fn broken(&self, q: usize) -> Option<String> {
        let c = self.rings.get(q)?;
        let b = c.broken?;
        (c.setup == self.shared.ring_setups[q].load(Ordering::Acquire)).then(|| b.to_string())
    }

    /// Whether a guest is connected with its first receive queue set up and enabled: what
    /// the guest's driver does when its interface comes up.
    pub fn rx_ready(&mut self) -> bool {
        self.refresh();
        self.link.as_ref().is_some_and(|l| l.usable(0))
    }

    /// How many queue pairs the guest uses: its first pairs with the receive queue set up
    /// and enabled (0 when none is, or no guest is connected).
    pub fn pairs_in_use(&mut self) -> usize {
        self.refresh();
        match self.link.take() {
            Some(l) => {
                let n = self.pairs_of(&l);
                self.link = Some(l);
                n
            }
            None => 0,
        }
    }

    /// [`VhostUserPort::pairs_in_use`] of `link`, counted again only when a ring changed.
    fn pairs_of(&mut self, link: &Link) -> usize {
        let seen = self.shared.rings_changed.load(Ordering::Acquire);
        if seen != self.pairs.0 {
            self.pairs = (seen, link.pairs_in_use());
        }
        self.pairs.1
    }

    fn refresh(&mut self) {
        let g = self.shared.generation.load(Ordering::Acquire);
        if g != self.generation {
            self.link = self.shared.link.lock().unwrap_or_else(|p| p.into_inner()).clone();
            self.generation = g;
            // A new connection: every queue starts afresh.
            self.rings = [Cursor::new(u64::MAX); NUM_QUEUES];
        }
    }

    /// Starts queue `q`'s state afresh when the frontend set the ring up since it was made.
    fn sync(&mut self, q: usize) {
        let setup = self.shared.ring_setups[q].load(Ordering::Acquire);
        if self.rings[q].setup != setup {
            self.rings[q] = Cursor::new(setup);
        }
    }

    /// Whether a [`Cause`] may be logged now (at most once a minute per port).
    fn may_log(&mut self, cause: Cause) -> bool {
        let now = Instant::now();
        let last = &mut self.logged[cause as usize];
        if last.is_some_and(|t| now.duration_since(t) < LOG_EVERY) {
            return false;
        }
        *last = Some(now);
        true
    }

    /// Marks queue `q` broken: it is not read or written again until the frontend sets
    /// it up anew.
    fn break_queue(&mut self, q: usize, why: Broken) {
        self.rings[q].broken = Some(why);
        self.counts.broken_queues += 1;
        if self.may_log(Cause::Broken) {
            warn!(
                port = %self.name,
                "vhost-user: the guest broke its {}: {why}; the switch no longer reads or writes that queue until the VM resets its network device (reboot it, or reload its virtio-net driver)",
                queue_name(q)
            );
        }
    }

    /// Counts (and logs, at most once a minute) a chain of queue `q` refused as `r`.
    fn refuse(&mut self, q: usize, r: Refused) {
        match r {
            Refused::TooLong => self.counts.long_chains += 1,
        }
        if self.may_log(Cause::Refused) {
            warn!(
                port = %self.name,
                "vhost-user: refused a chain of the guest's {}: {} (counted in `sluice port list`; the guest's driver is not a standard virtio-net driver)",
                queue_name(q),
                Bad::Refused(r)
            );
        }
    }

    /// A frame of `n` bytes for receive queue `q` is dropped: it would take more than
    /// `MAX_FRAME_CHAINS` of the guest's buffers.
    fn too_small(&mut self, q: usize, n: usize) -> PortError {
        self.counts.small_buffers += 1;
        let b = Bad::SmallBuffers(n);
        if self.may_log(Cause::SmallBuffers) {
            warn!(port = %self.name, "vhost-user: dropped a frame for the guest's {}: {b}", queue_name(q));
        }
        b.into_error()
    }

    /// A frame for broken receive queue `q` is dropped.
    fn drop_for_broken(&mut self, q: usize) -> PortError {
        self.counts.to_broken_queue += 1;
        PortError::Io(io::Error::new(io::ErrorKind::InvalidData, ToBroken { q, why: self.rings[q].broken }))
    }

    /// Signals the guest that queue `q` has used chains, through the call eventfd of `st`
    /// (its vring), never waiting on it: a full counter loses the interrupt (counted); a
    /// peer that kept it full and blocking has its connection ended.
    fn signal(&mut self, st: &VringState<GuestMemoryAtomic<GuestMemoryMmap>>, q: usize) {
        let Some(call) = st.get_call() else { return };
        match crate::eventfd::notify(call.as_raw_fd()) {
            Notified::Sent => {}
            Notified::Full => {
                self.counts.lost_calls += 1;
                if self.may_log(Cause::LostCall) {
                    warn!(
                        port = %self.name,
                        "vhost-user: the call eventfd of the guest's {} takes no more interrupts (QEMU does not read it); the guest may stall",
                        queue_name(q)
                    );
                }
            }
            Notified::Failed(e) => {
                self.counts.lost_calls += 1;
                if self.may_log(Cause::LostCall) {
                    warn!(port = %self.name, "vhost-user: signalling the guest's {}: {e}", queue_name(q));
                }
            }
            Notified::Stalled => {
                self.counts.lost_calls += 1;
                self.shared.stalled_calls.fetch_add(1, Ordering::Relaxed);
                self.shared.end_connection(format!(
                    "the peer kept the call eventfd of the guest's {} full and blocking (a write waited {} ms): the connection was ended",
                    queue_name(q),
                    crate::eventfd::STALL.as_millis()
                ));
            }
        }
    }

    /// Whether the link's guest memory lost a page under the switch: the connection is
    /// ended then (once), and the link is taken as down.
    fn faulted(&mut self, link: &Link) -> bool {
        if !link.faulted.load(Ordering::Acquire) {
            return false;
        }
        if self.shared.conn.lock().unwrap_or_else(|p| p.into_inner()).is_some() {
            self.shared.end_connection(
                "a page of the guest's memory went away under the switch (QEMU's memory file shrank, a hole was punched in it, or huge pages ran out): the connection was ended"
                    .to_string(),
            );
        }
        true
    }

    /// Takes one chain from transmit queue `q` into `buf`; `None` when it has none (or
    /// is broken).
    fn pop_tx(&mut self, link: &Link, q: usize, buf: &mut [u8], hdr: usize) -> Option<Result<usize, Bad>> {
        let vr = &link.vrings[q];
        let mut st = vr.get_mut();
        if !st.get_queue().ready() || !st.is_enabled() {
            return None;
        }
        self.sync(q);
        if self.rings[q].broken.is_some() {
            return None;
        }
        let mem = link.mem.memory();
        let head = match self.rings[q].next_head(&*mem, st.get_queue_mut()) {
            Ok(Some(h)) => h,
            Ok(None) => return None,
            Err(b) => {
                self.break_queue(q, b);
                return None;
            }
        };
        // The header lands so that the frame starts at buf[VNET_HDR_LEN] either way.
        let skew = VNET_HDR_LEN - hdr;
        let mut off = skew;
        let mut res = Ok(());
        // The chain is walked whole before a byte is copied: a chain refused costs its
        // descriptors' reads only.
        let chain = &mut self.chain;
        chain.clear();
        let w = ring::walk(&*mem, st.get_queue(), head, |d| {
            if d.write {
                res = Err(Bad::WriteOnly);
                return false;
            }
            match off.checked_add(d.len as usize) {
                Some(e) if e <= buf.len() => off = e,
                _ => {
                    res = Err(Bad::TooLong(buf.len() - VNET_HDR_LEN));
                    return false;
                }
            }
            chain.push((d.addr, d.len as usize));
            true
        });
        match w.fault {
            Some(Fault::Broken(b)) => {
                self.break_queue(q, b);
                return None;
            }
            Some(Fault::Refused(r)) => {
                self.refuse(q, r);
                res = Err(Bad::Refused(r));
            }
            None => {}
        }
        if res.is_ok() && off < VNET_HDR_LEN {
            res = Err(Bad::Short);
        }
        if res.is_ok() {
            let mut at = skew;
            for &(addr, len) in &self.chain {
                if mem.read_slice(&mut buf[at..at + len], addr).is_err() {
                    res = Err(Bad::Memory(addr));
                    break;
                }
                at += len;
            }
        }
        let queue = st.get_queue_mut();
        let _ = queue.add_used(&*mem, head, 0);
        if queue.needs_notification(&*mem).unwrap_or(true) {
            self.signal(&st, q);
        }
        Some(res.map(|()| {
            if skew > 0 {
                buf.copy_within(skew..VNET_HDR_LEN, 0);
            }
            // num_buffers means nothing on transmit.
            buf[10..VNET_HDR_LEN].fill(0);
            off - VNET_HDR_LEN
        }))
    }

    /// Rearms the guest's kicks on every transmit queue; true if frames arrived meanwhile.
    /// The port's frames descriptor is readable whenever frames may wait: a guest's kick
    /// or the port's own nudge, drained only here, when the rings were found empty. A
    /// broken queue is not rearmed, and its kicks are drained with the others.
    fn rearm_tx(&mut self, link: &Link) -> bool {
        self.shared.drain(true, Some(link));
        let mem = link.mem.memory();
        let mut more = false;
        for q in (1..link.vrings.len()).step_by(2) {
            let mut st = link.vrings[q].get_mut();
            if !st.get_queue().ready() || !st.is_enabled() {
                continue;
            }
            self.sync(q);
            if self.rings[q].broken.is_some() {
                continue;
            }
            let _ = st.get_queue_mut().enable_notification(&*mem);
            match self.rings[q].look(&*mem, st.get_queue()) {
                Ok(avail) => more |= avail != st.get_queue().next_avail(),
                Err(b) => self.break_queue(q, b),
            }
        }
        if more {
            // Frames came in between the look and the rearm, and their kick may just have
            // been drained above: the guest will not kick for them again, so the port keeps
            // its own descriptor readable until it finds the rings empty. (Without this a
            // switch that stops reading mid-ring — a batch's end, a held input — would never
            // be woken for the rest.)
            let _ = self.shared.frames_nudge.write(1);
        }
        more
    }

    /// Writes `parts` (header first) into receive queue `q`, over as many chains as
    /// mergeable buffers allow (at most `MAX_FRAME_CHAINS`). `Full` leaves the queue as it
    /// was, and the queue is not walked again until the guest moves its available index.
    fn write_rx(&mut self, link: &Link, q: usize, parts: &[&[u8]], features: u64) -> Result<TxOutcome, PortError> {
        let mrg = features & bit(VIRTIO_NET_F_MRG_RXBUF) != 0;
        let hdr = header_len(features);
        let total: usize = parts.iter().map(|p| p.len()).sum();
        let vr = &link.vrings[q];
        let mut st = vr.get_mut();
        if !st.get_queue().ready() || !st.is_enabled() {
            self.counts.no_link += 1;
            return Err(link_down("the guest has not set up its receive queue"));
        }
        self.sync(q);
        if self.rings[q].broken.is_some() {
            return Err(self.drop_for_broken(q));
        }
        let mem = link.mem.memory();
        if let Some(at) = self.rings[q].full_at {
            let mut moved = self.rings[q].look(&*mem, st.get_queue()).map(|a| a != at);
            if moved == Ok(false) {
                // A kick without new buffers: drained, the kick asked for again at the
                // same entry, and one more look (buffers posted meanwhile count).
                drop(st);
                self.shared.drain(false, Some(link));
                st = vr.get_mut();
                Cursor::ask_kick_at(&*mem, st.get_queue_mut(), at);
                moved = self.rings[q].look(&*mem, st.get_queue()).map(|a| a != at);
            }
            match moved {
                Ok(false) => return Ok(TxOutcome::Full),
                Ok(true) => self.rings[q].full_at = None,
                Err(b) => {
                    self.break_queue(q, b);
                    return Err(self.drop_for_broken(q));
                }
            }
        }
        let start = st.get_queue().next_avail();
        if let Some(small) = self.rings[q].small.filter(|&s| total > MAX_FRAME_CHAINS * s as usize) {
            // Its buffers were too small for a frame before, and this one needs more than
            // MAX_FRAME_CHAINS of that size: the next buffer alone is looked at, and while
            // it is no larger the frame is dropped without taking any.
            match self.rings[q].next_head(&*mem, st.get_queue_mut()) {
                Ok(Some(head)) => {
                    let mut cap = 0usize;
                    let w = ring::walk(&*mem, st.get_queue(), head, |d| {
                        cap += d.len as usize;
                        cap <= small as usize
                    });
                    st.get_queue_mut().set_next_avail(start);
                    if w.fault.is_none() && cap <= small as usize {
                        return Err(self.too_small(q, total - hdr));
                    }
                    self.rings[q].small = None;
                }
                Ok(None) => {}
                Err(b) => {
                    self.break_queue(q, b);
                    return Err(self.drop_for_broken(q));
                }
            }
        }
        self.used.clear();
        let (mut pi, mut po, mut pos) = (0usize, 0usize, 0usize);
        let mut nb_at: [Option<GuestAddress>; 2] = [None, None];
        let mut bad = None;
        while pos < total {
            if self.used.len() == MAX_FRAME_CHAINS {
                bad = Some(Bad::SmallBuffers(total - hdr));
                break;
            }
            let mut next = self.rings[q].next_head(&*mem, st.get_queue_mut());
            if next == Ok(None) {
                // Out of buffers: ask for a kick at the ring's current end, and look once
                // more (buffers posted meanwhile, whose kick the drain may have eaten, are
                // taken now).
                drop(st);
                self.shared.drain(false, Some(link));
                st = vr.get_mut();
                let _ = st.get_queue_mut().enable_notification(&*mem);
                next = self.rings[q].next_head(&*mem, st.get_queue_mut());
            }
            let head = match next {
                Ok(Some(h)) => h,
                Ok(None) => {
                    st.get_queue_mut().set_next_avail(start);
                    self.rings[q].full_at = self.rings[q].seen();
                    return Ok(TxOutcome::Full);
                }
                Err(b) => {
                    self.break_queue(q, b);
                    return Err(self.drop_for_broken(q));
                }
            };
            // The chain's descriptors, as far as the rest of the frame needs, are walked
            // before a byte is written: a chain refused or breaking the queue is not
            // written at all.
            let need = total - pos;
            let (mut cap, mut read_only) = (0usize, false);
            let chain = &mut self.chain;
            chain.clear();
            let w = ring::walk(&*mem, st.get_queue(), head, |d| {
                if !d.write {
                    read_only = true;
                    return false;
                }
                chain.push((d.addr, d.len as usize));
                cap += d.len as usize;
                cap < need
            });
            let fault = match w.fault {
                None if mrg && w.whole && cap < hdr => {
                    Some(Fault::Broken(Broken::SmallBuffer { len: cap as u32, header: hdr as u32 }))
                }
                f => f,
            };
            match fault {
                Some(Fault::Broken(b)) => {
                    self.break_queue(q, b);
                    return Err(self.drop_for_broken(q));
                }
                Some(Fault::Refused(r)) => {
                    self.refuse(q, r);
                    bad = Some(Bad::Refused(r));
                }
                None if read_only => bad = Some(Bad::ReadOnly),
                None => {}
            }
            let mut written = 0u32;
            let chain = if bad.is_none() { &self.chain[..] } else { &[] };
            'chain: for &(addr, len) in chain {
                let (mut at, mut room) = (addr, len);
                while room > 0 && pos < total {
                    let part = parts[pi];
                    let n = (part.len() - po).min(room);
                    if mem.write_slice(&part[po..po + n], at).is_err() {
                        bad = Some(Bad::Memory(at));
                        break 'chain;
                    }
                    for (k, b) in [10usize, 11].into_iter().enumerate() {
                        if hdr == VNET_HDR_LEN && (pos..pos + n).contains(&b) {
                            nb_at[k] = at.checked_add((b - pos) as u64);
                        }
                    }
                    (pos, po, room, written) = (pos + n, po + n, room - n, written + n as u32);
                    at = at.unchecked_add(n as u64);
                    while pi < parts.len() && po == parts[pi].len() {
                        (pi, po) = (pi + 1, 0);
                    }
                }
            }
            self.used.push((head, written));
            if bad.is_some() {
                break;
            }
            if !mrg && pos < total {
                // One buffer must hold the frame without mergeable buffers.
                bad = Some(Bad::TooLong(written as usize));
                break;
            }
        }
        let queue = st.get_queue_mut();
        if let Some(b) = bad {
            // The buffers taken go back empty; the frame is lost.
            for &(h, _) in &self.used {
                let _ = queue.add_used(&*mem, h, 0);
            }
            if queue.needs_notification(&*mem).unwrap_or(true) {
                self.signal(&st, q);
            }
            if let Bad::SmallBuffers(n) = b {
                // Every chain it took was full: the largest is the size to beat.
                self.rings[q].small = self.used.iter().map(|u| u.1).max();
                return Err(self.too_small(q, n));
            }
            self.counts.bad_rx_buffers += 1;
            return Err(b.into_error());
        }
        if hdr == VNET_HDR_LEN {
            let n = (self.used.len() as u16).to_le_bytes();
            for (k, at) in nb_at.iter().enumerate() {
                if let Some(a) = at {
                    let _ = mem.write_slice(&n[k..k + 1], *a);
                }
            }
        }
        for &(h, len) in &self.used {
            let _ = queue.add_used(&*mem, h, len);
        }
        if queue.needs_notification(&*mem).unwrap_or(true) {
            self.signal(&st, q);
        }
        Ok(TxOutcome::Sent)
    }

    /// A frame the guest did not negotiate the offloads of: checksums filled and GSO frames
    /// cut here, each segment into its own buffers.
    fn send_in_software(
        &mut self,
        link: &Link,
        q: usize,
        f: &OutFrame<'_>,
        h: &VnetHdr,
        features: u64,
    ) -> Result<TxOutcome, PortError> {
        self.whole.resize(f.len(), 0);
        f.copy_frame_to(&mut self.whole);
        let largest = usize::from(h.gso_size).max(f.len()) + 256;
        self.segs.clear();
        self.seg_ends.clear();
        self.scratch.resize(largest, 0);
        let (segs, ends) = (&mut self.segs, &mut self.seg_ends);
        sluice_wire::gso::segment(&self.whole, h, &mut self.scratch, |s| {
            segs.extend_from_slice(s);
            ends.push(segs.len());
            true
        })
        .map_err(|e| PortError::Io(io::Error::new(io::ErrorKind::InvalidData, e.to_string())))?;
        let zero = [0u8; VNET_HDR_LEN];
        let hdr = header_len(features);
        let (segs, ends) = (std::mem::take(&mut self.segs), std::mem::take(&mut self.seg_ends));
        let mut from = 0;
        let mut out = Ok(TxOutcome::Sent);
        for (i, &end) in ends.iter().enumerate() {
            match self.write_rx(link, q, &[&zero[..hdr], &segs[from..end]], features) {
                Ok(TxOutcome::Full) if i == 0 => {
                    out = Ok(TxOutcome::Full);
                    break;
                }
                Ok(TxOutcome::Full) => {
                    self.counts.segments_lost += (ends.len() - i) as u64;
                    break;
                }
                Ok(TxOutcome::Sent) => {}
                Err(e) => {
                    out = Err(e);
                    break;
                }
            }
            from = end;
        }
        (self.segs, self.seg_ends) = (segs, ends);
        out
    }

    /// Takes one frame from the guest's transmit rings, in turn.
    fn recv_from(&mut self, link: &Link, buf: &mut [u8]) -> Result<Option<usize>, PortError> {
        let hdr = header_len(self.shared.acked());
        let pairs = link.vrings.len() / 2;
        let mut rearmed = false;
        loop {
            for i in 0..pairs {
                let p = (self.next_tx + i) % pairs;
                if let Some(r) = self.pop_tx(link, 2 * p + 1, buf, hdr) {
                    self.next_tx = (p + 1) % pairs;
                    return match r {
                        Ok(n) => Ok(Some(n)),
                        Err(b) => {
                            self.counts.bad_tx_chains += 1;
                            Err(b.into_error())
                        }
                    };
                }
            }
            // Nothing waits: the guest kicks again when it queues more (checked once more
            // after rearming, so a frame queued meanwhile is not left behind).
            if rearmed || !self.rearm_tx(link) {
                return Ok(None);
            }
            rearmed = true;
        }
    }

    /// Writes one frame into the receive ring of its conversation's queue pair.
    fn send_to(&mut self, link: &Link, f: &OutFrame<'_>) -> Result<TxOutcome, PortError> {
        let features = self.shared.acked();
        // The pairs the guest uses share the conversations: its first ones, enabled (Linux
        // enables one per vCPU, `ethtool -L` changes it; QEMU's `queues=` caps it).
        let pairs = self.pairs_of(link).max(1);
        let mut q = 2 * pair_for(f.macs, pairs);
        self.sync(q);
        if self.rings[q].broken.is_some() {
            // The conversation's pair is broken: another pair of the guest's takes it.
            let healthy = (0..pairs).map(|k| 2 * k).find(|&r| {
                self.sync(r);
                self.rings[r].broken.is_none()
            });
            if let Some(r) = healthy {
                q = r;
            }
        }
        let h = VnetHdr::parse(&f.vnet).unwrap_or_default();
        if !guest_takes(features, &h) {
            return self.send_in_software(link, q, f, &h, features);
        }
        let hdr = header_len(features);
        let tag = f.tag.unwrap_or_default();
        let tag: &[u8] = if f.tag.is_some() { &tag } else { &[] };
        self.write_rx(link, q, &[&f.vnet[..hdr], f.macs, tag, f.rest], features)
    }
}

fn link_down(why: &str) -> PortError {
    PortError::Io(io::Error::new(io::ErrorKind::NotConnected, why.to_string()))
}

/// FNV-1a of the MAC addresses: which queue pair a conversation's frames go to.
fn pair_for(macs: &[u8], pairs: usize) -> usize {
    let h = macs.iter().fold(0x811c_9dc5u32, |h, &b| (h ^ u32::from(b)).wrapping_mul(0x0100_0193));
    h as usize % pairs.max(1)
}

impl Port for VhostUserPort {
    fn kind(&self) -> &'static str {
        "vhost-user"
    }

    fn caps(&self) -> PortCaps {
        PortCaps { offload: self.offload, lossless_input: true }
    }

    fn recv(&mut self, buf: &mut [u8]) -> Result<Option<usize>, PortError> {
        self.refresh();
        // The link is lent out for the call (no reference count touched per frame).
        let Some(link) = self.link.take() else {
            self.shared.drain(true, None);
            self.shared.drain(false, None);
            return Ok(None);
        };
        if self.faulted(&link) {
            self.link = Some(link);
            self.shared.drain(true, None);
            return Ok(None);
        }
        let r = self.recv_from(&link, buf);
        self.link = Some(link);
        r
    }

    fn send(&mut self, f: &OutFrame<'_>) -> Result<TxOutcome, PortError> {
        self.refresh();
        let Some(link) = self.link.take() else {
            self.counts.no_link += 1;
            return Err(link_down("no VM is connected"));
        };
        if self.faulted(&link) {
            self.link = Some(link);
            self.counts.no_link += 1;
            return Err(link_down("the VM's connection is ending: its memory went away under the switch"));
        }
        let r = self.send_to(&link, f);
        self.link = Some(link);
        r
    }

    fn link_state(&self) -> Option<String> {
        let mut s = self.shared.state();
        if let Some(l) = self.shared.link.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
            let q = |i: usize| {
                let st = l.vrings[i].get_ref();
                (st.get_queue().ready(), st.is_enabled())
            };
            let (rx, tx) = (q(0), q(1));
            s.push_str(match (rx, tx) {
                ((true, true), (true, true)) => "; guest driver up",
                ((false, _), (false, _)) => "; guest driver not started",
                _ => "; guest queues partly set up",
            });
            let pairs = l.pairs_in_use();
            if pairs > 1 {
                s.push_str(&format!(", {pairs} queue pairs"));
            }
            let c = &self.counts;
            if c.bad_tx_chains + c.bad_rx_buffers > 0 {
                s.push_str(&format!(
                    "; refused {} transmit chains, {} receive buffers of the guest's",
                    c.bad_tx_chains, c.bad_rx_buffers
                ));
                if c.long_chains > 0 {
                    s.push_str(&format!(
                        " ({} longer than {} descriptors)",
                        c.long_chains,
                        ring::MAX_CHAIN_DESCRIPTORS
                    ));
                }
            }
            if c.small_buffers > 0 {
                s.push_str(&format!(
                    "; dropped {} frames that would take more than {MAX_FRAME_CHAINS} of the guest's receive buffers",
                    c.small_buffers
                ));
            }
            for q in 0..NUM_QUEUES {
                if let Some(why) = self.broken(q) {
                    s.push_str(&format!(
                        "; {} BROKEN by the guest ({why}): not used until the VM resets its network device (reboot it, or reload its virtio-net driver)",
                        queue_name(q)
                    ));
                }
            }
            if c.to_broken_queue > 0 {
                s.push_str(&format!("; dropped {} frames for its broken receive queues", c.to_broken_queue));
            }
            if c.lost_calls > 0 {
                s.push_str(&format!("; {} interrupts lost to a full call eventfd", c.lost_calls));
            }
            if std::env::var_os("SLUICE_VHOST_DEBUG").is_some() {
                s.push_str(&format!(" rx={rx:?} tx={tx:?} acked={:#x}", self.shared.acked()));
            }
        }
        let refused = self.shared.refused.load(Ordering::Relaxed);
        if refused > 0 {
            s.push_str(&format!(
                "; refused {refused} connections (peers not allowed: see the switch's log, and vhost_allow_users or vhost_allow_groups)"
            ));
        }
        let sh = &self.shared;
        let ended = [
            (sh.rejected.load(Ordering::Relaxed), "for what the peer sent"),
            (sh.memory_faults.load(Ordering::Relaxed), "for guest memory that went away"),
            (sh.stalled_calls.load(Ordering::Relaxed), "for a blocking call eventfd"),
        ];
        for (n, why) in ended {
            if n > 0 {
                s.push_str(&format!("; ended {n} connections {why}"));
            }
        }
        if let Some(why) = sh.refusal() {
            s.push_str(&format!("; last refusal: {why}"));
        }
        Some(s)
    }

    fn device_drops(&self) -> Option<DeviceDrops> {
        let c = &self.counts;
        Some(DeviceDrops {
            to_guest: c.bad_rx_buffers + c.segments_lost + c.small_buffers + c.to_broken_queue,
            from_guest: 0,
        })
    }
}

impl Drop for VhostUserPort {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(c) = self.shared.conn.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = c.shutdown(std::net::Shutdown::Both);
        }
        if let Some(t) = self.serving.take() {
            let _ = t.join();
        }
        if let Some(p) = &self.socket {
            crate::socket::remove(p);
        }
        // The guest's memory is unmapped once nothing holds it: the port let go last.
        self.link = None;
        self.shared.publish(None);
        crate::memory::sweep();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_header_is_12_bytes_with_virtio_1_or_mergeable_buffers() {
        assert_eq!(header_len(bit(VIRTIO_F_VERSION_1)), 12);
        assert_eq!(header_len(bit(VIRTIO_NET_F_MRG_RXBUF)), 12);
        assert_eq!(header_len(0), 10);
    }

    #[test]
    fn a_guest_without_offloads_takes_only_plain_frames() {
        let tso = VnetHdr {
            gso_type: VnetHdr::GSO_TCPV4,
            gso_size: 1448,
            flags: VnetHdr::F_NEEDS_CSUM,
            ..Default::default()
        };
        let all = bit(VIRTIO_NET_F_GUEST_CSUM) | bit(VIRTIO_NET_F_GUEST_TSO4) | bit(VIRTIO_NET_F_GUEST_TSO6);
        assert!(guest_takes(all, &tso));
        assert!(!guest_takes(bit(VIRTIO_NET_F_GUEST_CSUM), &tso));
        assert!(!guest_takes(0, &VnetHdr { flags: VnetHdr::F_NEEDS_CSUM, ..Default::default() }));
        assert!(guest_takes(0, &VnetHdr::default()));
        let ecn = VnetHdr { gso_type: VnetHdr::GSO_TCPV4 | VnetHdr::GSO_ECN, ..tso };
        assert!(!guest_takes(all, &ecn));
    }

    #[test]
    fn a_conversation_keeps_its_queue_pair() {
        let m = [1u8, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12];
        assert_eq!(pair_for(&m, 4), pair_for(&m, 4));
        assert!(pair_for(&m, 4) < 4);
        assert_eq!(pair_for(&m, 1), 0);
    }
}

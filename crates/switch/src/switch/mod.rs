//! The switch: its ports and their queues around the forwarding decision, and the
//! invariant every path keeps.
//!
//! A driver calls [`Switch::on_readable`] when a port has frames, [`Switch::on_writable`]
//! when a port that reported [`TxOutcome::Full`](crate::TxOutcome::Full) can take more, and
//! [`Switch::expire`] on its timer (at [`Switch::next_deadline_ms`] at the latest), and
//! applies the read/write interest the switch reports through
//! [`Switch::take_interest_changes`].
//!
//! A frame passes these stages, each in a file of its own:
//!
//! 1. [`ingress`]: received (from a port, or handed up by a kernel datapath) and
//!    validated; its [`Key`] read and its source learned (the core's alone, and only from
//!    a frame its input's checks admit); then decided once by [`crate::decide`], a pure
//!    function of the key and the tables.
//! 2. [`forward`]: the [`Verdict`] executed: a drop counted, an address-resolution message
//!    handed to Layer 3, or a copy placed in each output's queue.
//! 3. [`lossless`]: a frame of a lossless class whose output is full waits at its input
//!    until there is room; the pause watchdog keeps a stuck output from holding it forever.
//! 4. [`transmit`]: each queue drained into its port; tags, source addresses and the
//!    offloads the port cannot do are applied as a copy leaves.
//!
//! Beside the frames' path: [`resolve`] (Layer 3 mode's address resolution), [`ports`]
//! (ports attached, removed, failed and shown), [`kernel`] (what a kernel datapath
//! executes and reports back) and [`capture`] (a port's packet captures). This file holds
//! the switch's state, its construction, the driver's timer and interest, and the check
//! of its accounting: each frame received is counted once by its fate, and each copy
//! offered to a port once as sent, dropped or queued ([`Switch::check_accounting`]).

use std::collections::HashMap;
use std::fmt;

use sluice_wire::MacAddr;

use crate::acl::AclTables;
use crate::capture::Capture;
use crate::class::{self, ClassConfig};
use crate::config::{MTU_RANGE, SwitchConfig, SwitchError};
use crate::conntrack::{DEFAULT_CT_MAX, Tracker};
use crate::counters::{ClassCounters, PortCounters};
use crate::decide::{Key, PortRules, Ports, Verdict};
use crate::fib::Fib;
use crate::hold::HeldList;
use crate::ids::PortId;
use crate::l3::{L3Tables, MAX_PENDING, Mode};
use crate::pool::{FRAME_BUF_LEN, FramePool};
use crate::port::{Port, PortCaps};
use crate::queue::{ClassQueues, QueuedCopy};

mod capture;
mod evpn;
mod forward;
pub(crate) mod ingress;
mod kernel;
mod lossless;
pub(crate) mod ports;
mod resolve;
mod security;
pub(crate) mod snooping;
mod suppress;
pub(crate) mod transmit;

/// Read/write readiness the switch wants from a port's device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Interest {
    /// Wake me when the port has frames to receive.
    pub read: bool,
    /// Wake me when the port can take frames again.
    pub write: bool,
}

/// A change of an output's watchdog state, for the driver to log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WatchdogEvent {
    /// The output.
    pub port: PortId,
    /// The class's name.
    pub class: String,
    /// True: declared stuck; false: it sent again.
    pub stuck: bool,
}

/// A Layer 2 (or, configured so, Layer 3) switch.
pub struct Switch {
    cfg: SwitchConfig,
    ports: Vec<Option<PortSlot>>,
    pool: FramePool,
    fib: Fib,
    scratch: Box<[u8]>,
    /// The verdict on the last frame received (its memory reused for the next; boxed so
    /// that taking it out to execute it moves a pointer).
    verdict: Option<Box<Verdict>>,
    /// The key it was decided by.
    last_key: Option<Key>,
    /// The verdict on a frame decided again (held, or waiting for its next hop).
    again: Verdict,
    /// Moves on every change of what a verdict depends on besides its key (see
    /// [`Switch::generation`]); the MAC table counts its own part.
    generation: u64,
    dirty: Vec<PortId>,
    interest_changed: Vec<PortId>,
    held_count: usize,
    /// The classes in force (at least one).
    classes: Vec<ClassConfig>,
    /// The class of frames the switch writes itself.
    gen_class: u8,
    /// Per output, during a retry of one input's held frames: an earlier frame still waits
    /// for it.
    pass_blocked: Vec<bool>,
    watchdog_events: Vec<WatchdogEvent>,
    /// The driver's clock at the last call that told it (ms).
    now_ms: u64,
    /// Counters of ports removed since the last reset.
    departed: PortCounters,
    /// Layer 3 mode's tables (empty in Layer 2 mode).
    l3: L3Tables,
    /// Source MAC addresses locked to ports by their `mac` setting, with how many ports
    /// lock each: no other port's frames may claim them.
    locked: HashMap<MacAddr, u32>,
    /// Ports whose fast-path rules changed since the last
    /// [`Switch::take_fastpath_changes`]; `None` while no kernel datapath follows.
    fast_changed: Option<Vec<PortId>>,
    /// EVPN: remote stations whose route changed since the last
    /// [`Switch::take_fastpath_changes`] (kept only while a kernel datapath follows).
    fast_remotes: Vec<(PortId, u32, MacAddr)>,
    /// Packet captures, by id (`None`: ended and taken).
    captures: Vec<Option<Capture>>,
    /// Security groups: every port's rules, compiled.
    acl: AclTables,
    /// The connections security groups let open (the user-space datapath's tracker).
    ct: Tracker,
    /// When expired connections were last swept (ms).
    ct_swept_ms: u64,
    /// A kernel datapath's connection tracker: frames whose protocol a kernel tracks
    /// ([`crate::conntrack::kernel_tracks`]) are then tracked there alone.
    kernel_ct: Option<Box<dyn crate::conntrack::KernelTracker>>,
    /// Moves with every change of the security groups' classes.
    acl_epoch: u64,
    /// IGMP/MLD snooping's database.
    mdb: crate::mdb::Mdb,
    /// EVPN's IP bindings, by VLAN and address: the station ARP requests and neighbour
    /// solicitations are answered with.
    bindings: std::collections::HashMap<(u16, std::net::IpAddr), MacAddr>,
    /// ARP requests and neighbour solicitations answered from `bindings`.
    suppressed: [u64; 2],
    /// A port is an EVPN tunnel (`note_evpn`): the other ports' address resolution is the
    /// core's to read.
    evpn: bool,
    /// EVPN's local bindings, by VLAN and address, from local stations' ARP and
    /// neighbour-discovery messages.
    local_bound: std::collections::HashMap<(u16, std::net::IpAddr), suppress::LocalBinding>,
    /// How many of `local_bound` each station has (at most
    /// [`suppress::MAX_LOCAL_IPS_PER_STATION`]).
    local_per_station: std::collections::HashMap<MacAddr, u8>,
}

impl fmt::Debug for Switch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Switch").field("cfg", &self.cfg).finish_non_exhaustive()
    }
}

/// One attached port: its device, its rules as the decision reads them, its queues, the
/// frames it holds and its counters.
struct PortSlot {
    name: String,
    port: Box<dyn Port>,
    caps: PortCaps,
    /// What the decision reads of the port (its VLANs, MTU, policy, mirror, addresses, and
    /// whether it failed).
    rules: PortRules,
    counters: PortCounters,
    /// Per class: counters, and the watchdog's state as an output.
    classes: Vec<ClassCounters>,
    watch: Vec<Watch>,
    queue: ClassQueues<QueuedCopy>,
    /// Segments of the queue's head frame already sent (software segmentation resumed
    /// after `Full`).
    seg_done: u32,
    /// Frames from this port waiting for room at their outputs (lossless classes).
    held: HeldList,
    want_write: bool,
    dirty: bool,
    reported: Interest,
    /// At its learning limit, as last reported to a kernel datapath.
    learn_full: bool,
    /// Captures running on it (their copies are made here, so a kernel datapath sends
    /// its frames through the core meanwhile).
    captured: u8,
    /// Storm control's buckets: broadcast, multicast (crate::meter).
    storm: [crate::meter::Bucket; 2],
    /// `rate_in`'s bucket (bytes), and while it is overdrawn, when the port may be read
    /// again (the driver's clock, ms): frames wait in the port's device meanwhile.
    rate_in: crate::meter::Bucket,
    rate_paused_until_ms: Option<u64>,
    /// `rate_out`'s bucket (bytes), and while it is empty, when the port's queue may be
    /// sent from again (the driver's clock, ms): frames wait in the queue meanwhile.
    rate_out: crate::meter::Bucket,
    shaped_until_ms: Option<u64>,
}

impl Ports for [Option<PortSlot>] {
    #[inline]
    fn rules(&self, id: PortId) -> Option<&PortRules> {
        self.get(id as usize).and_then(Option::as_ref).map(|s| &s.rules)
    }
    fn all(&self) -> impl Iterator<Item = (PortId, &PortRules)> {
        self.iter().enumerate().filter_map(|(i, p)| Some((i as PortId, &p.as_ref()?.rules)))
    }
}

impl PortSlot {
    /// Counts the frames the port's device refused for it since the last call as received
    /// and dropped.
    fn count_refused(&mut self) {
        if let Some((cause, n)) = self.port.take_refused() {
            self.counters.rx_frames += n;
            self.counters.rx_drops.add_n(cause, n);
        }
    }

    /// A kernel datapath can send to it as it is: it reaches the port, which has not
    /// failed and takes GSO frames whole.
    fn kernel_ready(&self) -> bool {
        self.port.fast_path().is_some() && self.rules.failed.is_none() && self.caps.offload
    }

    fn interest(&self) -> Interest {
        if self.rules.failed.is_some() {
            return Interest::default();
        }
        Interest { read: !self.held.is_full() && self.rate_paused_until_ms.is_none(), write: self.want_write }
    }
}

/// The pause watchdog's view of one output in one class.
#[derive(Clone, Copy, Debug, Default)]
struct Watch {
    /// When it last sent a frame of the class, or got one into an empty queue (ms).
    since_ms: u64,
    /// Declared stuck: frames of the class toward it are dropped.
    stuck: bool,
}

impl Switch {
    /// A switch with no ports.
    pub fn new(cfg: SwitchConfig) -> Result<Self, SwitchError> {
        if !MTU_RANGE.contains(&cfg.mtu) {
            return Err(SwitchError::BadMtu(cfg.mtu));
        }
        class::check(&cfg.classes)?;
        let classes =
            if cfg.classes.is_empty() { vec![ClassConfig::default_for(cfg.lossless)] } else { cfg.classes.clone() };
        let gen_class = class::classify(&classes, &[], 0, "");
        let fib_max = cfg.fib_max;
        let cfg_snoop = cfg.snoop.clone();
        let mut pool = FramePool::new();
        pool.grow(1);
        if cfg.mode == Mode::L3 {
            // Frames waiting for resolution, and the replies the switch writes.
            pool.grow(MAX_PENDING + 8);
        }
        let mut fib = Fib::new(cfg.fib_max, cfg.aging_ms);
        fib.watch_port_limit(cfg.port_mac_limit);
        Ok(Switch {
            fib,
            cfg,
            ports: Vec::new(),
            pool,
            scratch: vec![0u8; FRAME_BUF_LEN].into_boxed_slice(),
            verdict: Some(Box::default()),
            last_key: None,
            again: Verdict::default(),
            generation: 0,
            dirty: Vec::new(),
            interest_changed: Vec::new(),
            held_count: 0,
            classes,
            gen_class,
            pass_blocked: Vec::new(),
            watchdog_events: Vec::new(),
            now_ms: 0,
            departed: PortCounters::default(),
            l3: L3Tables::new(fib_max),
            locked: HashMap::new(),
            fast_changed: None,
            fast_remotes: Vec::new(),
            captures: Vec::new(),
            acl: AclTables::default(),
            ct: Tracker::new(DEFAULT_CT_MAX),
            ct_swept_ms: 0,
            kernel_ct: None,
            acl_epoch: 0,
            mdb: crate::mdb::Mdb::new(cfg_snoop),
            bindings: std::collections::HashMap::new(),
            suppressed: [0; 2],
            evpn: false,
            local_bound: std::collections::HashMap::new(),
            local_per_station: std::collections::HashMap::new(),
        })
    }

    /// The settings it runs with.
    pub fn config(&self) -> &SwitchConfig {
        &self.cfg
    }

    /// Changes what may change while frames flow (a configuration reloaded): how long a
    /// learned station is kept without traffic (ms, at least 1) and how many stations one
    /// port may have learned. Entries already learned beyond a lowered limit stay until
    /// they age; cached verdicts are decided again.
    pub fn set_learning(&mut self, aging_ms: u64, port_mac_limit: usize) {
        self.cfg.aging_ms = aging_ms.max(1);
        self.fib.set_aging_ms(self.cfg.aging_ms);
        self.cfg.port_mac_limit = port_mac_limit.max(1);
        self.fib.watch_port_limit(self.cfg.port_mac_limit);
        self.generation += 1;
    }

    /// The classes in force, in match order.
    pub fn classes(&self) -> &[ClassConfig] {
        &self.classes
    }

    /// Frame buffers the switch holds memory for.
    pub fn buffers(&self) -> usize {
        self.pool.capacity()
    }

    /// Checks the accounting rules of `counters.rs` on every port and across the switch:
    /// each frame received was forwarded, flooded, consumed, dropped under a cause, or is
    /// held or resolving; each copy offered to a port was sent, dropped or is queued; and
    /// the copies made plus the frames the switch generated are the copies offered. A
    /// broken rule is a bug: the error names it (the tests and the fuzz target check it).
    pub fn check_accounting(&self) -> Result<(), String> {
        let mut copies = self.departed.copies + self.departed.generated;
        let mut offered = self.departed.tx_offered;
        for p in self.ports() {
            let c = &p.counters;
            let fates = c.forwarded + c.flooded + c.consumed + c.rx_drops.total() + p.held as u64 + p.resolving as u64;
            if c.rx_frames != fates {
                return Err(format!(
                    "ingress accounting of port {}: {} in, {fates} accounted: {c:?}",
                    p.name, c.rx_frames
                ));
            }
            let out = c.tx_frames + c.tx_drops.total() + p.queued as u64;
            if c.tx_offered != out {
                return Err(format!(
                    "egress accounting of port {}: {} offered, {out} accounted: {c:?}",
                    p.name, c.tx_offered
                ));
            }
            copies += c.copies + c.generated;
            offered += c.tx_offered;
        }
        if copies != offered {
            return Err(format!("copies made + frames generated ({copies}) != copies offered ({offered})"));
        }
        Ok(())
    }

    /// The MAC table.
    pub fn fib(&self) -> &Fib {
        &self.fib
    }

    /// The MAC table, for adding static entries.
    pub fn fib_mut(&mut self) -> &mut Fib {
        &mut self.fib
    }

    /// Starts recording what happens to stations (learned, moved, aged, forgotten), at
    /// most `cap` events waiting for [`Switch::take_events`]; more are dropped and counted,
    /// so a driver that does not take them never slows forwarding.
    pub fn record_events(&mut self, cap: usize) {
        self.fib.record_events(cap);
    }

    /// Hands over the stations' events since the last call, oldest first; returns how many
    /// were lost because the queue was full. A port named in them may be gone already
    /// (removed since): its name is the driver's to remember.
    pub fn take_events(&mut self, f: impl FnMut(crate::StationEvent)) -> u64 {
        self.fib.take_events(f)
    }

    /// True when station events (or a count of lost ones) wait.
    pub fn has_events(&self) -> bool {
        self.fib.has_events()
    }

    /// Forgets MAC entries (and LAN neighbours) older than the aging time, and drops frames
    /// that waited too long for address resolution.
    pub fn expire(&mut self, now_ms: u64) {
        self.now_ms = now_ms;
        self.watchdog(now_ms);
        self.fib.expire(now_ms);
        self.expire_connections(now_ms);
        if self.cfg.mode == Mode::L3 {
            self.l3.expire(now_ms, self.cfg.aging_ms);
            self.expire_pending(now_ms);
        }
        self.snoop_expire(now_ms);
    }

    /// Hands the ports whose wanted interest changed since the last call to `f`.
    pub fn take_interest_changes(&mut self, mut f: impl FnMut(PortId, Interest)) {
        for i in 0..self.interest_changed.len() {
            let id = self.interest_changed[i];
            if let Some(s) = self.ports.get_mut(id as usize).and_then(Option::as_mut) {
                let now = s.interest();
                if now != s.reported {
                    s.reported = now;
                    f(id, now);
                }
            }
        }
        self.interest_changed.clear();
    }

    /// The interest a port wants now.
    pub fn interest(&self, id: PortId) -> Interest {
        self.slot(id).map(PortSlot::interest).unwrap_or_default()
    }

    fn slot(&self, id: PortId) -> Option<&PortSlot> {
        self.ports.get(id as usize).and_then(Option::as_ref)
    }

    fn slot_mut(&mut self, id: PortId) -> Option<&mut PortSlot> {
        self.ports.get_mut(id as usize).and_then(Option::as_mut)
    }

    fn note_interest(&mut self, id: PortId) {
        if let Some(s) = self.slot(id)
            && s.interest() != s.reported
            && !self.interest_changed.contains(&id)
        {
            self.interest_changed.push(id);
        }
    }
}

/// The MAC address at `at` in `frame` (which holds at least an Ethernet header).
fn mac_at(frame: &[u8], at: usize) -> MacAddr {
    MacAddr(frame.get(at..at + 6).and_then(|m| m.try_into().ok()).unwrap_or_default())
}

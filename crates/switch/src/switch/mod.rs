//! The switch: ports, output queues and the lossless rule, around the forwarding decision.
//!
//! The driver calls [`Switch::on_readable`] when a port has frames, [`Switch::on_writable`]
//! when a port that reported [`TxOutcome::Full`] can take more, and applies the read/write
//! interest the switch reports through [`Switch::take_interest_changes`].
//!
//! Each frame received is validated, its [`Key`] read, its source learned (the core's
//! alone, and only from a frame its input's checks admit), then decided once by
//! [`crate::decide`] — a pure function of the key and the tables — and the [`Verdict`]
//! executed here: queues, holds, lossless, the next hop's address, segmentation, MAC
//! rewrite and tags at transmit, counters.
//!
//! Lossless mode follows zOVN's Algorithm 1 (seed 004): a frame is moved only into outputs
//! with room. When one of its outputs is full the frame stays at its input (the port's
//! single "held" slot) and the input is not read again — its read interest is withdrawn —
//! until every output it needs has room. A transmit that makes room retries held frames.
//! Lossy mode drops the copy for the full output and counts it.

use std::collections::HashMap;
use std::fmt;

use std::net::IpAddr;

use sluice_wire::MacAddr;
use sluice_wire::neigh::{self, NdFields};

use crate::capture::{Capture, Captured, Direction};
use crate::class::{self, ClassConfig};
use crate::config::{MTU_RANGE, PortConfig, SwitchConfig, SwitchError};
use crate::counters::{ClassCounters, DropCause, PortCounters};
use crate::decide::{self, Key, PortRules, Ports, SourceCheck, Tunneled, Verdict};
use crate::fastpath::{FastChange, FastMac, FastPort};
use crate::fib::Fib;
use crate::hold::HeldList;
use crate::ids::PortId;
use crate::l3::{L3Tables, MAX_PENDING, Mode};
use crate::pool::{FRAME_BUF_LEN, FramePool};
use crate::port::{DeviceDrops, Port, PortCaps};
use crate::queue::{ClassQueues, QueuedCopy};
use crate::vlan::VlanMode;

mod forward;
pub(crate) mod ingress;
mod lossless;
mod resolve;
pub(crate) mod transmit;

/// Read/write readiness the switch wants from a port's device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Interest {
    /// Wake me when the port has frames to receive.
    pub read: bool,
    /// Wake me when the port can take frames again.
    pub write: bool,
}

/// A snapshot of one port for display.
#[derive(Clone, Debug)]
pub struct PortInfo {
    /// Port id.
    pub id: PortId,
    /// Port name.
    pub name: String,
    /// Kind of attachment ("tap", "mem", …).
    pub kind: &'static str,
    /// VLAN membership.
    pub vlan: VlanMode,
    /// Effective MTU.
    pub mtu: u16,
    /// Declared capabilities.
    pub caps: PortCaps,
    /// Counters since the last reset.
    pub counters: PortCounters,
    /// Frames waiting in its output queue.
    pub queued: usize,
    /// Frames it sent that wait for room at their outputs (lossless classes); at the
    /// switch's `hold_len` its input is paused.
    pub held: usize,
    /// Its input is not read: its held frames reached `hold_len`.
    pub paused: bool,
    /// Per traffic class, in the switch's class order.
    pub classes: Vec<ClassInfo>,
    /// Frames it sent that wait for their next hop's address (Layer 3 mode).
    pub resolving: usize,
    /// Drops counted by the device underneath, outside the switch.
    pub device_drops: Option<DeviceDrops>,
    /// The port's own account of its link ([`Port::link_state`]).
    pub link: Option<String>,
    /// The port's device failed and it is no longer serviced.
    pub failed: Option<String>,
}

/// One port's view of one traffic class.
#[derive(Clone, Debug)]
pub struct ClassInfo {
    /// The class's name.
    pub name: String,
    /// Lossless class.
    pub lossless: bool,
    /// Counters since the last reset.
    pub counters: ClassCounters,
    /// Frames waiting in the port's queue of this class.
    pub queued: usize,
    /// The pause watchdog declared the port stuck in this class (it drops toward it).
    pub stuck: bool,
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
        Interest { read: !self.held.is_full(), write: self.want_write }
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

/// A frame an uplink sends after a failover.
#[derive(Clone, Copy)]
enum Announce {
    Rarp(MacAddr),
    Address(IpAddr, MacAddr),
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
    /// Packet captures, by id (`None`: ended and taken).
    captures: Vec<Option<Capture>>,
}

impl fmt::Debug for Switch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Switch").field("cfg", &self.cfg).finish_non_exhaustive()
    }
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
            captures: Vec::new(),
        })
    }

    /// Starts reporting what a kernel datapath must follow (see [`crate::fastpath`]):
    /// from now on every port and MAC entry that changes is reported by
    /// [`Switch::take_fastpath_changes`]; the ports attached so far are reported once.
    pub fn follow_fastpath(&mut self) {
        self.fib.track_changes();
        self.l3.changed_owners = Some(self.l3.owners().map(|(ip, _)| ip).collect());
        self.l3.changed_neigh = Some(self.l3.neighbours().into_iter().map(|(v, ip, _)| (v, ip)).collect());
        let ids: Vec<PortId> = self.port_ids().collect();
        self.fast_changed = Some(ids);
        for (vlan, mac, _) in self.fib.entries() {
            // Entries that existed before: reported like new ones.
            self.fib.add_changed(vlan, mac);
        }
    }

    fn note_fast(&mut self, id: PortId) {
        if let Some(c) = self.fast_changed.as_mut() {
            c.push(id);
        }
    }

    /// Hands over the ports and MAC entries whose fast-path state changed since the last
    /// call, each once.
    pub fn take_fastpath_changes(&mut self, mut f: impl FnMut(FastChange)) {
        // Ports that reached their learning limit or left it.
        let mut counted = Vec::new();
        self.fib.take_count_changes(|p| counted.push(p));
        for p in counted {
            let full = self.learn_full(p);
            if self.slot(p).is_some_and(|s| s.learn_full != full) {
                self.note_fast(p);
            }
        }
        if let Some(mut c) = self.fast_changed.take() {
            c.sort_unstable();
            c.dedup();
            for &id in c.iter() {
                let full = self.learn_full(id);
                if let Some(s) = self.slot_mut(id) {
                    s.learn_full = full;
                }
                f(FastChange::Port(id));
            }
            c.clear();
            self.fast_changed = Some(c);
        }
        self.fib.take_changes(|vlan, mac| f(FastChange::Mac(vlan, mac)));
        if let Some(c) = self.l3.changed_owners.as_mut() {
            c.sort_unstable();
            c.dedup();
            for &ip in c.iter() {
                f(FastChange::Owner(ip));
            }
            c.clear();
        }
        if let Some(c) = self.l3.changed_neigh.as_mut() {
            c.sort_unstable();
            c.dedup();
            for &(vlan, ip) in c.iter() {
                f(FastChange::Neighbour(vlan, ip));
            }
            c.clear();
        }
    }

    /// Layer 3, taking over a kernel datapath an earlier run left: port `id` owned `ip`
    /// there. As if the port's guest had just used it: a port that learns its addresses
    /// learns it (and locks it), one with configured addresses keeps them.
    pub fn adopt_owner(&mut self, ip: IpAddr, id: PortId) {
        if self.cfg.mode == Mode::L3
            && self.l3.owner(ip).is_none()
            && let Some(s) = self.slot(id)
            && let SourceCheck::Learn(ip) = s.rules.policy.check_source(ip, true)
        {
            self.lock_ip(id, ip);
        }
    }

    /// Layer 3, taking over a kernel datapath an earlier run left: LAN neighbour `ip` on
    /// `vlan` was at `mac`.
    pub fn adopt_neighbour(&mut self, vlan: u16, ip: IpAddr, mac: MacAddr, now_ms: u64) {
        if self.cfg.mode == Mode::L3 {
            self.l3.learn(vlan, ip, mac, now_ms);
        }
    }

    /// Layer 3: the live port that owns `ip`, as a kernel datapath executes it.
    pub fn fast_owner(&self, ip: IpAddr) -> Option<PortId> {
        self.l3.owner(ip).filter(|&p| self.slot(p).is_some())
    }

    /// Layer 3: the MAC address of LAN neighbour `ip` on `vlan`, as a kernel datapath
    /// executes it.
    pub fn fast_neighbour(&self, vlan: u16, ip: IpAddr) -> Option<MacAddr> {
        self.l3.neighbour(vlan, ip)
    }

    /// Port `id`'s rules as a kernel datapath executes them (`None`: no such port).
    pub fn fast_port(&self, id: PortId) -> Option<FastPort> {
        let s = self.slot(id)?;
        let r = &s.rules;
        // Frames to a port without offloads are cut in software, which only the core does;
        // a port whose mirror the kernel cannot serve goes through the core, copies and all.
        let mirror_in_user_space = r.mirrored_to.is_some_and(|m| self.slot(m).is_none_or(|m| !m.kernel_ready()));
        let slow = r.failed.is_some() || !s.port.fast_path_offload() || mirror_in_user_space || s.captured > 0;
        Some(FastPort {
            target: s.port.fast_path(),
            uplink: r.policy.uplink,
            mac: r.policy.mac,
            checks_ips: r.checks_ips(),
            slow,
            failed: r.failed.is_some(),
            dev_mac: if r.policy.uplink { r.dev_mac } else { None },
            guest_mac: if self.cfg.mode == Mode::L3 { r.guest_mac } else { None },
        })
    }

    /// Layer 2: port `id` has as many learned stations behind it as it may (see
    /// [`Tables::learn_full`]).
    fn learn_full(&self, id: PortId) -> bool {
        self.slot(id).is_some_and(|s| self.tables().learn_full(id, &s.rules))
    }

    /// The MAC table's entry for `mac` on `vlan` as a kernel datapath executes it.
    pub fn fast_mac(&self, vlan: u16, mac: MacAddr) -> Option<FastMac> {
        self.fib.get(vlan, mac).map(|e| FastMac { port: e.port, is_static: e.is_static })
    }

    /// Records that a kernel datapath forwarded frames from `mac` on `vlan` arriving on
    /// port `id` at `now_ms` (the driver's clock): its MAC entry stays fresh.
    pub fn touch_mac(&mut self, vlan: u16, mac: MacAddr, id: PortId, now_ms: u64) {
        self.fib.touch(vlan, mac, id, now_ms);
    }

    /// Taking over a kernel datapath an earlier run left: station `mac` of `vlan` was
    /// learned behind port `id` there. Learned again unless port `id` may not send from
    /// it (another port locks it now).
    pub fn adopt_mac(&mut self, vlan: u16, mac: MacAddr, id: PortId, now_ms: u64) {
        if self.slot(id).is_some_and(|s| !self.claims_locked(&s.rules.policy, mac)) {
            self.fib.learn(vlan, mac, id, now_ms);
        }
    }

    /// Starts a capture of port `port`: copies of the frames it delivers (`In`), is sent
    /// (`Out`) or both, each cut to `snaplen` bytes, at most `budget` bytes of them
    /// waiting for [`Switch::capture_take`]. On a kernel datapath the port's frames pass
    /// through the core while it is captured. Returns the capture's id.
    pub fn capture_start(
        &mut self,
        port: &str,
        dir: Direction,
        snaplen: usize,
        budget: usize,
    ) -> Result<usize, SwitchError> {
        let id = self.port_id(port).ok_or_else(|| SwitchError::NoSuchPort(port.to_string()))?;
        let slot = self.slot_mut(id).expect("port_id returned a live port");
        slot.captured = slot.captured.saturating_add(1);
        self.note_fast(id);
        // (A kernel datapath's cached verdicts sent the port's frames past the core.)
        self.generation += 1;
        let c = Capture::new(id, dir, snaplen, budget);
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

    /// The settings it runs with.
    pub fn config(&self) -> &SwitchConfig {
        &self.cfg
    }

    /// Attaches a port. Its buffers are allocated now, so forwarding never allocates.
    pub fn add_port(&mut self, cfg: PortConfig, port: Box<dyn Port>) -> Result<PortId, SwitchError> {
        if self.port_id(&cfg.name).is_some() {
            return Err(SwitchError::DuplicatePort(cfg.name));
        }
        let mtu = cfg.mtu.unwrap_or(self.cfg.mtu);
        if !MTU_RANGE.contains(&mtu) {
            return Err(SwitchError::BadMtu(mtu));
        }
        check_vlans(&cfg.vlan)?;
        let id = self.ports.len() as PortId;
        let mut cfg = cfg;
        if self.cfg.mode == Mode::L3 && !cfg.policy.uplink {
            for ip in &cfg.policy.ips {
                if let Some(o) = self.l3.owner(*ip) {
                    let owner = self.port_name(o).unwrap_or("?").to_string();
                    return Err(SwitchError::AddressInUse { ip: *ip, owner });
                }
            }
            cfg.policy.learn_ips |= cfg.policy.ips.is_empty();
        }
        // Mirrors: the ports this one watches, and the mirror that watches it.
        let mut watched = Vec::new();
        for n in &cfg.policy.mirror_of {
            let bad = |why| SwitchError::BadMirror { port: n.clone(), mirror: cfg.name.clone(), why };
            if *n == cfg.name {
                return Err(bad("a port cannot mirror itself"));
            }
            if let Some(w) = self.port_id(n) {
                if self.slot(w).is_some_and(|s| s.rules.mirrored_to.is_some()) {
                    return Err(bad("it already has a mirror"));
                }
                watched.push(w);
            }
        }
        let mirrored_to = self
            .ports
            .iter()
            .enumerate()
            .find(|(_, p)| p.as_ref().is_some_and(|p| p.rules.policy.mirror_of.contains(&cfg.name)))
            .map(|(i, _)| i as PortId);
        for w in watched {
            if let Some(s) = self.slot_mut(w) {
                s.rules.mirrored_to = Some(id);
            }
        }
        self.pool.grow(self.port_buffers());
        let n = self.ports.len() + 1;
        for s in self.ports.iter_mut().flatten() {
            s.held.ensure_ports(n);
        }
        self.pass_blocked.resize(self.ports.len() + 1, false);
        if let Some(v) = self.verdict.as_mut() {
            v.outputs.reserve(2 * (self.ports.len() + 1));
        }
        self.again.outputs.reserve(2 * (self.ports.len() + 1));
        self.dirty.reserve(self.ports.len() + 1);
        self.interest_changed.reserve(self.ports.len() + 1);
        let caps = port.caps();
        let dev_mac = port.mac();
        let tunnel = port.tunnel();
        if self.cfg.mode == Mode::L3 && !cfg.policy.uplink {
            for ip in &cfg.policy.ips {
                self.l3.own(*ip, id);
            }
        }
        if let Some(m) = cfg.policy.mac {
            // The station is this port's from now on: what was learned of it elsewhere goes.
            *self.locked.entry(m).or_insert(0) += 1;
            self.fib.forget_elsewhere(m, id);
        }
        self.note_fast(id);
        if let Some(m) = mirrored_to {
            self.note_fast(m);
        }
        for n in &cfg.policy.mirror_of {
            if let Some(w) = self.port_id(n) {
                self.note_fast(w);
            }
        }
        self.generation += 1;
        self.ports.push(Some(PortSlot {
            name: cfg.name,
            port,
            caps,
            rules: PortRules {
                vlan: cfg.vlan,
                mtu,
                guest_mac: cfg.policy.mac,
                policy: cfg.policy,
                mirrored_to,
                dev_mac,
                failed: None,
                tunnel,
            },
            counters: PortCounters::default(),
            classes: vec![ClassCounters::default(); self.classes.len()],
            watch: vec![Watch::default(); self.classes.len()],
            queue: ClassQueues::new(&self.class_caps()),
            seg_done: 0,
            held: HeldList::new(self.cfg.hold_len, self.ports.len() + 1),
            want_write: false,
            dirty: false,
            // The driver registers the port with `interest(id)` when it attaches it.
            reported: Interest { read: true, write: false },
            learn_full: false,
            captured: 0,
        }));
        Ok(id)
    }

    /// Detaches a port, dropping the frames queued for it, and returns it to the caller.
    pub fn remove_port(&mut self, name: &str) -> Result<(PortId, Box<dyn Port>), SwitchError> {
        let id = self.port_id(name).ok_or_else(|| SwitchError::NoSuchPort(name.to_string()))?;
        let mut slot = self.ports[id as usize].take().expect("port_id returned a live port");
        slot.count_refused();
        while let Some(q) = slot.queue.pop_any() {
            slot.counters.tx_drops.add(DropCause::UnknownPort);
            self.pool.release(q.fid);
        }
        while !slot.held.is_empty() {
            let (fid, _) = slot.held.take(0);
            slot.counters.rx_drops.add(DropCause::UnknownPort);
            self.pool.release(fid);
            self.held_count -= 1;
        }
        // Frames it sent that waited for resolution are lost with it; frames waiting to
        // reach it are lost to their senders.
        let mut i = 0;
        while i < self.l3.pending.len() {
            let p = self.l3.pending[i];
            if p.from == id || p.out == id {
                self.l3.pending.remove(i);
                self.pool.release(p.fid);
                let c =
                    if p.from == id { &mut slot.counters } else { &mut self.slot_mut(p.from).expect("live").counters };
                c.rx_drops.add(DropCause::UnknownPort);
            } else {
                i += 1;
            }
        }
        self.l3.disown_port(id);
        if let Some(m) = slot.rules.policy.mac
            && let Some(n) = self.locked.get_mut(&m)
        {
            *n -= 1;
            if *n == 0 {
                self.locked.remove(&m);
            }
        }
        self.departed.accumulate(&slot.counters);
        for c in self.captures.iter_mut().flatten().filter(|c| c.port == id) {
            c.ended = true;
        }
        let mut unmirrored = Vec::new();
        for (i, s) in self.ports.iter_mut().enumerate() {
            if let Some(s) = s
                && s.rules.mirrored_to == Some(id)
            {
                s.rules.mirrored_to = None;
                unmirrored.push(i as PortId);
            }
        }
        self.generation += 1;
        self.note_fast(id);
        if let Some(m) = slot.rules.mirrored_to {
            self.note_fast(m);
        }
        for i in unmirrored {
            self.note_fast(i);
        }
        self.fib.forget_port(id);
        self.settle();
        // The buffers its queue needed go back (ports that come and go leak none).
        self.pool.shrink(self.port_buffers());
        Ok((id, slot.port))
    }

    /// The capacity of each class's queue at an output.
    fn class_caps(&self) -> Vec<usize> {
        self.classes.iter().map(|c| c.queue_len.unwrap_or(self.cfg.queue_len)).collect()
    }

    /// Buffers a port needs: its queues full, its held list full, and one being read.
    fn port_buffers(&self) -> usize {
        self.class_caps().iter().sum::<usize>() + self.cfg.hold_len + 1
    }

    /// The classes in force, in match order.
    pub fn classes(&self) -> &[ClassConfig] {
        &self.classes
    }

    /// Frame buffers the switch holds memory for.
    pub fn buffers(&self) -> usize {
        self.pool.capacity()
    }

    /// The id of the port named `name`.
    pub fn port_id(&self, name: &str) -> Option<PortId> {
        self.ports.iter().position(|p| p.as_ref().is_some_and(|p| p.name == name)).map(|i| i as PortId)
    }

    /// The name of port `id`.
    pub fn port_name(&self, id: PortId) -> Option<&str> {
        self.slot(id).map(|s| s.name.as_str())
    }

    /// Where station `mac` of `vlan` is behind port `id` (a tunnel's remote endpoint),
    /// if the port knows more than the switch.
    pub fn port_endpoint(&self, id: PortId, vlan: u16, mac: MacAddr) -> Option<String> {
        self.slot(id)?.port.endpoint_of(vlan, mac)
    }

    /// Snapshot of one port.
    pub fn port_info(&self, id: PortId) -> Option<PortInfo> {
        let s = self.slot(id)?;
        Some(PortInfo {
            id,
            name: s.name.clone(),
            kind: s.port.kind(),
            vlan: s.rules.vlan.clone(),
            mtu: s.rules.mtu,
            caps: s.caps,
            counters: s.counters,
            queued: s.queue.len(),
            held: s.held.len(),
            paused: s.held.is_full(),
            classes: self
                .classes
                .iter()
                .enumerate()
                .map(|(c, k)| ClassInfo {
                    name: k.name.clone(),
                    lossless: k.lossless,
                    counters: s.classes[c],
                    queued: s.queue.class_len(c as u8),
                    stuck: s.watch[c].stuck,
                })
                .collect(),
            resolving: self.l3.pending.iter().filter(|p| p.from == id).count(),
            device_drops: s.port.device_drops(),
            link: s.port.link_state(),
            failed: s.rules.failed.clone(),
        })
    }

    /// Snapshots of all ports, in id order.
    pub fn ports(&self) -> Vec<PortInfo> {
        (0..self.ports.len() as PortId).filter_map(|id| self.port_info(id)).collect()
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

    /// Ids of attached ports.
    pub fn port_ids(&self) -> impl Iterator<Item = PortId> + '_ {
        self.ports.iter().enumerate().filter(|(_, p)| p.is_some()).map(|(i, _)| i as PortId)
    }

    /// The MAC table.
    pub fn fib(&self) -> &Fib {
        &self.fib
    }

    /// The MAC table, for adding static entries.
    pub fn fib_mut(&mut self) -> &mut Fib {
        &mut self.fib
    }

    /// Adds a static MAC entry pointing at the named port.
    pub fn add_static_mac(&mut self, vlan: u16, mac: MacAddr, port: &str) -> Result<(), SwitchError> {
        if !(1..=4094).contains(&vlan) {
            return Err(SwitchError::BadVlan(vlan));
        }
        if mac.is_zero() {
            return Err(SwitchError::NotUnicast(mac, "zero"));
        }
        if mac.is_multicast() {
            return Err(SwitchError::NotUnicast(mac, if mac.is_broadcast() { "broadcast" } else { "multicast" }));
        }
        let id = self.port_id(port).ok_or_else(|| SwitchError::NoSuchPort(port.to_string()))?;
        if let Some(s) = self.slot(id)
            && self.claims_locked(&s.rules.policy, mac)
        {
            let owner = self.ports.iter().flatten().find(|p| p.rules.policy.mac == Some(mac)).map(|p| p.name.clone());
            return Err(SwitchError::MacLocked { mac, owner: owner.unwrap_or_default() });
        }
        self.fib.add_static(vlan, mac, id);
        Ok(())
    }

    /// Counters of the ports removed since the last reset, added up.
    pub fn departed(&self) -> &PortCounters {
        &self.departed
    }

    /// Adds what a kernel datapath counted for a port that is removed (beside what the
    /// core counted for it, which [`Switch::remove_port`] adds itself).
    pub fn add_departed(&mut self, c: &PortCounters) {
        self.departed.accumulate(c);
    }

    /// Zeroes every port's counters (queued and held frames stay).
    pub fn reset_counters(&mut self) {
        self.departed = PortCounters::default();
        for s in self.ports.iter_mut().flatten() {
            s.counters = PortCounters::default();
        }
        self.fib.full_refusals = 0;
        self.fib.moves = 0;
    }

    /// Forgets MAC entries (and LAN neighbours) older than the aging time, and drops frames
    /// that waited too long for address resolution.
    pub fn expire(&mut self, now_ms: u64) {
        self.now_ms = now_ms;
        self.watchdog(now_ms);
        self.fib.expire(now_ms);
        if self.cfg.mode == Mode::L3 {
            self.l3.expire(now_ms, self.cfg.aging_ms);
            self.expire_pending(now_ms);
        }
    }

    /// Lets every port check its device (see [`Port::tick`]); hands each change to `f`
    /// with the port's name, and counts it as a failover. Counts what the ports' devices
    /// refused for them meanwhile ([`Port::take_refused`]).
    pub fn tick_ports(&mut self, mut f: impl FnMut(&str, &str)) {
        let mut moved = Vec::new();
        for (i, s) in self.ports.iter_mut().enumerate() {
            let Some(s) = s else { continue };
            s.count_refused();
            if let Some(what) = s.port.tick() {
                s.counters.failovers += 1;
                f(&s.name, &what);
                moved.push(i as PortId);
            }
        }
        // Stations learned behind a port that changed device are learned anew, and the
        // stations on this side announce themselves through it.
        for id in moved {
            self.note_fast(id);
            self.generation += 1;
            self.fib.forget_port(id);
            if let Some(s) = self.slot_mut(id) {
                s.rules.dev_mac = s.port.mac();
            }
            if self.cfg.mode == Mode::L3 {
                self.l3.forget_neighbours();
            }
            self.announce(id);
        }
        self.settle();
    }

    /// Sends, through port `to` (an uplink that just changed device), a frame from every
    /// station on this side so the LAN's switches learn the new path at once: in Layer 2
    /// mode a RARP announcement from each learned MAC address (as QEMU and Open vSwitch's
    /// bonds do), in Layer 3 mode a gratuitous ARP or unsolicited neighbour advertisement
    /// for each guest address, from the uplink's MAC.
    fn announce(&mut self, to: PortId) {
        let Some(out) = self.slot(to) else { return };
        // A guest's VLAN: the one its untagged frames join.
        let vlan_of = |m: &VlanMode| m.ingress(None).map(|i| i.vid);
        let mut frames: Vec<(u16, Announce)> = Vec::new();
        match self.cfg.mode {
            Mode::L2 => {
                for (vlan, mac, e) in self.fib.entries() {
                    if e.port != to && out.rules.vlan.is_member(vlan) {
                        frames.push((vlan, Announce::Rarp(mac)));
                    }
                }
            }
            Mode::L3 => {
                let mac = out.rules.dev_mac.unwrap_or(self.cfg.router_mac);
                for (ip, p) in self.ip_owners() {
                    let Some(vlan) = self.slot(p).and_then(|s| vlan_of(&s.rules.vlan)) else { continue };
                    if out.rules.vlan.is_member(vlan) {
                        frames.push((vlan, Announce::Address(ip, mac)));
                    }
                }
            }
        }
        for (vlan, a) in frames {
            self.emit(to, vlan, |buf| match a {
                Announce::Rarp(mac) => neigh::write_rarp_announce(buf, mac),
                Announce::Address(IpAddr::V4(ip), mac) => {
                    neigh::write_arp(buf, 1, MacAddr::BROADCAST, mac, ip, MacAddr::default(), ip)
                }
                Announce::Address(IpAddr::V6(ip), mac) => {
                    let m = NdFields {
                        advert: true,
                        solicited: false,
                        src: ip,
                        dst: neigh::ALL_NODES,
                        target: ip,
                        lla: mac,
                    };
                    neigh::write_nd(buf, neigh::multicast_mac(neigh::ALL_NODES), mac, &m)
                }
            });
            if self.slot(to).is_some_and(|s| s.queue.is_full(self.gen_class)) {
                self.flush_port(to);
            }
        }
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

    /// Marks port `id` as failed, as when its device reports itself gone: it is no longer
    /// serviced, frames for it are dropped (`unknown_port`), and `sluice port list` shows
    /// why. For devices whose loss a driver notices outside `recv`/`send` (a veth deleted
    /// behind the switch's back on the kernel datapath).
    pub fn port_gone(&mut self, id: PortId, why: String) {
        self.fail_port(id, why);
        self.settle();
    }

    fn fail_port(&mut self, id: PortId, why: String) {
        let Some(s) = self.ports.get_mut(id as usize).and_then(Option::as_mut) else { return };
        if s.rules.failed.is_some() {
            return;
        }
        s.rules.failed = Some(why);
        let mut freed = 0u64;
        while let Some(q) = s.queue.pop_any() {
            freed += 1;
            self.pool.release(q.fid);
        }
        s.counters.tx_drops.tx_error += freed;
        s.seg_done = 0;
        self.generation += 1;
        self.note_interest(id);
        self.note_fast(id);
        // The ports it mirrors go through the core from now on (see `fast_port`).
        let watched: Vec<PortId> = self
            .ports
            .iter()
            .enumerate()
            .filter(|(_, p)| p.as_ref().is_some_and(|p| p.rules.mirrored_to == Some(id)))
            .map(|(i, _)| i as PortId)
            .collect();
        for w in watched {
            self.note_fast(w);
        }
    }

    /// A kernel datapath heard station `mac` of VLAN `vlan` behind tunnel port `id`, in a
    /// datagram of `vni` from `sender` (its executor reports it, and learns nothing
    /// itself). Decided as for a frame: the tunnel's stage 1 must give that origin that
    /// VLAN, and the station must be the tunnel's (learned from an earlier frame, after
    /// every check, and not moved since). Then the port learns where the station is
    /// ([`Port::learn_remote`]). Returns whether it did: the kernel's table is to say so
    /// too.
    pub fn tunnel_heard(&mut self, id: PortId, vni: u32, vlan: u16, mac: MacAddr, sender: IpAddr) -> bool {
        let Some(s) = self.slot(id).filter(|s| s.rules.failed.is_none()) else { return false };
        let Some(t) = &s.rules.tunnel else { return false };
        let origin = Some(Tunneled { vni, endpoint: t.knows(sender) });
        let joins = |tci| decide::stage1(&s.rules, tci, origin).is_ok_and(|i| i.vid == vlan);
        let here = match self.cfg.mode {
            Mode::L2 => self.fib.get(vlan, mac).is_some_and(|e| e.port == id),
            Mode::L3 => s.rules.guest_mac == Some(mac),
        };
        if !here || !(joins(None) || joins(Some(vlan))) {
            return false;
        }
        if let Some(s) = self.slot_mut(id) {
            s.port.learn_remote(vni, mac, sender);
        }
        true
    }
}

fn check_vlans(mode: &VlanMode) -> Result<(), SwitchError> {
    let ok = |v: u16| (1..=4094).contains(&v);
    match mode {
        VlanMode::Access(v) if !ok(*v) => Err(SwitchError::BadVlan(*v)),
        VlanMode::Trunk { native: Some(n), .. } if !ok(*n) => Err(SwitchError::BadVlan(*n)),
        _ => Ok(()),
    }
}

/// The MAC address at `at` in `frame` (which holds at least an Ethernet header).
fn mac_at(frame: &[u8], at: usize) -> MacAddr {
    MacAddr(frame.get(at..at + 6).and_then(|m| m.try_into().ok()).unwrap_or_default())
}

//! The switch: ports, forwarding decisions, output queues and the lossless rule.
//!
//! The driver calls [`Switch::on_readable`] when a port has frames, [`Switch::on_writable`]
//! when a port that reported [`TxOutcome::Full`] can take more, and applies the read/write
//! interest the switch reports through [`Switch::take_interest_changes`].
//!
//! Lossless mode follows zOVN's Algorithm 1 (seed 004): a frame is moved only into outputs
//! with room. When one of its outputs is full the frame stays at its input (the port's
//! single "held" slot) and the input is not read again — its read interest is withdrawn —
//! until every output it needs has room. A transmit that makes room retries held frames.
//! Lossy mode drops the copy for the full output and counts it.

use std::fmt;

use sluice_wire::{ETH_HDR_LEN, MacAddr, VNET_HDR_LEN, VnetHdr, gso_max_l3_len, parse_ethernet};

use crate::counters::{DropCause, PortCounters};
use crate::fib::Fib;
use crate::pool::{FRAME_BUF_LEN, FramePool};
use crate::port::{DeviceDrops, OutFrame, Port, PortCaps, PortError, TxOutcome};
use crate::queue::FrameQueue;
use crate::vlan::VlanMode;

/// Index of a port in its switch. Never reused while the switch lives.
pub type PortId = u32;

/// Smallest and largest MTU a port or switch may have (IP packet bytes).
pub const MTU_RANGE: std::ops::RangeInclusive<u16> = 68..=9000;

/// Switch-wide settings.
#[derive(Clone, Debug)]
pub struct SwitchConfig {
    /// Default MTU of ports (bytes of IP packet, as `ip link` shows).
    pub mtu: u16,
    /// Learned MAC entries are forgotten after this long without traffic (ms).
    pub aging_ms: u64,
    /// Never drop a frame because an output queue is full; hold its input instead.
    pub lossless: bool,
    /// Frames each output queue holds.
    pub queue_len: usize,
    /// Frames read from one port before others get a turn.
    pub batch: usize,
    /// Maximum MAC table entries.
    pub fib_max: usize,
}

impl Default for SwitchConfig {
    fn default() -> Self {
        SwitchConfig { mtu: 1500, aging_ms: 300_000, lossless: false, queue_len: 256, batch: 64, fib_max: 8192 }
    }
}

/// Per-port settings.
#[derive(Clone, Debug)]
pub struct PortConfig {
    /// Unique name (for a TAP, its interface name).
    pub name: String,
    /// VLAN membership.
    pub vlan: VlanMode,
    /// MTU; the switch's when `None`.
    pub mtu: Option<u16>,
    /// Security settings.
    pub policy: PortPolicy,
}

/// What a port may do, beyond its VLANs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PortPolicy {
    /// The port leads to the LAN: isolated ports may still exchange frames with it.
    pub uplink: bool,
    /// The port exchanges frames with uplinks only (the reference switch's port isolation).
    pub isolated: bool,
    /// The only source MAC address the port may send from; frames from any other are
    /// dropped and counted (`spoofed_mac`). Any address when `None`.
    pub mac: Option<MacAddr>,
    /// The only source IP addresses the port's IPv4 and IPv6 packets (and ARP sender
    /// addresses) may carry, besides the unspecified 0.0.0.0 and `::` (DHCP, duplicate
    /// address detection); others are dropped and counted (`spoofed_ip`). Any address
    /// when empty. Non-IP frames are not affected.
    pub ips: Vec<std::net::IpAddr>,
    /// Makes this port a mirror of the named ports: it gets a copy of every frame they
    /// receive and are sent (in the VLANs it is a member of), always lossy, so a slow
    /// mirror never holds traffic back. A port has at most one mirror. Names of ports
    /// attached later count from when they attach.
    pub mirror_of: Vec<String>,
}

impl PortPolicy {
    /// The frame (untagged, from its Ethernet header) carries a source IP address the
    /// port may use, or none at all.
    fn allows_source_ip(&self, frame: &[u8]) -> bool {
        if self.ips.is_empty() {
            return true;
        }
        let ethertype = frame.get(12..14).map_or(0, |t| u16::from_be_bytes([t[0], t[1]]));
        let src: std::net::IpAddr = match ethertype {
            0x0800 => match frame.get(26..30) {
                Some(a) => std::net::Ipv4Addr::new(a[0], a[1], a[2], a[3]).into(),
                None => return false,
            },
            // ARP for IPv4 over Ethernet: the sender protocol address.
            0x0806 => match frame.get(28..32) {
                Some(a) => std::net::Ipv4Addr::new(a[0], a[1], a[2], a[3]).into(),
                None => return false,
            },
            0x86dd => match frame.get(22..38).and_then(|a| <[u8; 16]>::try_from(a).ok()) {
                Some(a) => std::net::Ipv6Addr::from(a).into(),
                None => return false,
            },
            _ => return true,
        };
        src.is_unspecified() || self.ips.contains(&src)
    }
}

/// Isolation between ports whose (isolated, uplink) flags are `a` and `b`.
fn may_talk(a: (bool, bool), b: (bool, bool)) -> bool {
    (!a.0 && !b.0) || a.1 || b.1
}

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
    /// 1 when a frame it sent waits for room at an output (input paused), else 0.
    pub held: usize,
    /// Drops counted by the device underneath, outside the switch.
    pub device_drops: Option<DeviceDrops>,
    /// The port's device failed and it is no longer serviced.
    pub failed: Option<String>,
}

/// Refusals of configuration changes.
#[derive(Debug, thiserror::Error)]
pub enum SwitchError {
    /// A port of that name is already attached.
    #[error("a port named {0:?} is already attached; choose another name or delete it first")]
    DuplicatePort(String),
    /// No port of that name.
    #[error("no port named {0:?} is attached (see `sluice port list`)")]
    NoSuchPort(String),
    /// MTU out of range.
    #[error("MTU {0} is out of range: use 68 to 9000")]
    BadMtu(u16),
    /// A VLAN id out of range.
    #[error("VLAN {0} is out of range: use 1 to 4094")]
    BadVlan(u16),
    /// A port that already has a mirror, or a mirror of itself.
    #[error("port {port:?} cannot be mirrored to {mirror:?}: {why}")]
    BadMirror {
        /// The watched port.
        port: String,
        /// The mirror.
        mirror: String,
        /// Why not.
        why: &'static str,
    },
}

struct PortSlot {
    name: String,
    port: Box<dyn Port>,
    caps: PortCaps,
    vlan: VlanMode,
    mtu: u16,
    policy: PortPolicy,
    /// The mirror port that gets copies of this port's traffic.
    mirrored_to: Option<PortId>,
    counters: PortCounters,
    queue: FrameQueue,
    /// Segments of the queue's head frame already sent (software segmentation resumed
    /// after `Full`).
    seg_done: u32,
    /// A frame from this port waiting for room at its outputs (lossless mode).
    held: Option<u32>,
    want_write: bool,
    dirty: bool,
    failed: Option<String>,
    reported: Interest,
}

impl PortSlot {
    fn interest(&self) -> Interest {
        if self.failed.is_some() {
            return Interest::default();
        }
        Interest { read: self.held.is_none(), write: self.want_write }
    }
}

/// Where a frame goes.
enum Decision {
    Drop(DropCause),
    Unicast,
    Flood,
}

enum Placement {
    Placed,
    Held,
}

enum Sent {
    Ok,
    Full,
    Drop(DropCause),
    Gone(String),
}

/// A Layer 2 switch.
pub struct Switch {
    cfg: SwitchConfig,
    ports: Vec<Option<PortSlot>>,
    pool: FramePool,
    fib: Fib,
    scratch: Box<[u8]>,
    dests: Vec<PortId>,
    dirty: Vec<PortId>,
    interest_changed: Vec<PortId>,
    held_count: usize,
    /// The driver's clock at the last call that told it (ms).
    now_ms: u64,
    /// Counters of ports removed since the last reset.
    departed: PortCounters,
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
        let mut pool = FramePool::new();
        pool.grow(1);
        Ok(Switch {
            fib: Fib::new(cfg.fib_max, cfg.aging_ms),
            cfg,
            ports: Vec::new(),
            pool,
            scratch: vec![0u8; FRAME_BUF_LEN].into_boxed_slice(),
            dests: Vec::new(),
            dirty: Vec::new(),
            interest_changed: Vec::new(),
            held_count: 0,
            now_ms: 0,
            departed: PortCounters::default(),
        })
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
        // Mirrors: the ports this one watches, and the mirror that watches it.
        let mut watched = Vec::new();
        for n in &cfg.policy.mirror_of {
            let bad = |why| SwitchError::BadMirror { port: n.clone(), mirror: cfg.name.clone(), why };
            if *n == cfg.name {
                return Err(bad("a port cannot mirror itself"));
            }
            if let Some(w) = self.port_id(n) {
                if self.slot(w).is_some_and(|s| s.mirrored_to.is_some()) {
                    return Err(bad("it already has a mirror"));
                }
                watched.push(w);
            }
        }
        let mirrored_to = self
            .ports
            .iter()
            .enumerate()
            .find(|(_, p)| p.as_ref().is_some_and(|p| p.policy.mirror_of.contains(&cfg.name)))
            .map(|(i, _)| i as PortId);
        for w in watched {
            if let Some(s) = self.slot_mut(w) {
                s.mirrored_to = Some(id);
            }
        }
        self.pool.grow(self.cfg.queue_len + 1);
        self.dests.reserve(self.ports.len() + 1);
        self.dirty.reserve(self.ports.len() + 1);
        self.interest_changed.reserve(self.ports.len() + 1);
        let caps = port.caps();
        self.ports.push(Some(PortSlot {
            name: cfg.name,
            port,
            caps,
            vlan: cfg.vlan,
            mtu,
            policy: cfg.policy,
            mirrored_to,
            counters: PortCounters::default(),
            queue: FrameQueue::new(self.cfg.queue_len),
            seg_done: 0,
            held: None,
            want_write: false,
            dirty: false,
            failed: None,
            // The driver registers the port with `interest(id)` when it attaches it.
            reported: Interest { read: true, write: false },
        }));
        Ok(id)
    }

    /// Detaches a port, dropping the frames queued for it, and returns it to the caller.
    pub fn remove_port(&mut self, name: &str) -> Result<(PortId, Box<dyn Port>), SwitchError> {
        let id = self.port_id(name).ok_or_else(|| SwitchError::NoSuchPort(name.to_string()))?;
        let mut slot = self.ports[id as usize].take().expect("port_id returned a live port");
        while let Some(fid) = slot.queue.pop() {
            slot.counters.tx_drops.add(DropCause::UnknownPort);
            self.pool.release(fid);
        }
        if let Some(fid) = slot.held.take() {
            slot.counters.rx_drops.add(DropCause::UnknownPort);
            self.pool.release(fid);
            self.held_count -= 1;
        }
        self.departed.accumulate(&slot.counters);
        for s in self.ports.iter_mut().flatten() {
            if s.mirrored_to == Some(id) {
                s.mirrored_to = None;
            }
        }
        self.fib.forget_port(id);
        self.settle();
        Ok((id, slot.port))
    }

    /// The id of the port named `name`.
    pub fn port_id(&self, name: &str) -> Option<PortId> {
        self.ports.iter().position(|p| p.as_ref().is_some_and(|p| p.name == name)).map(|i| i as PortId)
    }

    /// The name of port `id`.
    pub fn port_name(&self, id: PortId) -> Option<&str> {
        self.slot(id).map(|s| s.name.as_str())
    }

    /// Snapshot of one port.
    pub fn port_info(&self, id: PortId) -> Option<PortInfo> {
        let s = self.slot(id)?;
        Some(PortInfo {
            id,
            name: s.name.clone(),
            kind: s.port.kind(),
            vlan: s.vlan.clone(),
            mtu: s.mtu,
            caps: s.caps,
            counters: s.counters,
            queued: s.queue.len(),
            held: usize::from(s.held.is_some()),
            device_drops: s.port.device_drops(),
            failed: s.failed.clone(),
        })
    }

    /// Snapshots of all ports, in id order.
    pub fn ports(&self) -> Vec<PortInfo> {
        (0..self.ports.len() as PortId).filter_map(|id| self.port_info(id)).collect()
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
        let id = self.port_id(port).ok_or_else(|| SwitchError::NoSuchPort(port.to_string()))?;
        self.fib.add_static(vlan, mac, id);
        Ok(())
    }

    /// Counters of the ports removed since the last reset, added up.
    pub fn departed(&self) -> &PortCounters {
        &self.departed
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

    /// Forgets MAC entries older than the aging time.
    pub fn expire(&mut self, now_ms: u64) {
        self.now_ms = now_ms;
        self.fib.expire(now_ms);
    }

    /// Lets every port check its device (see [`Port::tick`]); hands each change to `f`
    /// with the port's name, and counts it as a failover.
    pub fn tick_ports(&mut self, mut f: impl FnMut(&str, &str)) {
        let mut moved = Vec::new();
        for (i, s) in self.ports.iter_mut().enumerate() {
            let Some(s) = s else { continue };
            if let Some(what) = s.port.tick() {
                s.counters.failovers += 1;
                f(&s.name, &what);
                moved.push(i as PortId);
            }
        }
        // Stations learned behind a port that changed device are learned anew.
        for id in moved {
            self.fib.forget_port(id);
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

    /// Receives up to one batch of frames from port `id` and forwards them. Returns true
    /// when the batch was full, so more frames may be waiting.
    pub fn on_readable(&mut self, id: PortId, now_ms: u64) -> bool {
        self.now_ms = now_ms;
        let mut n = 0;
        while n < self.cfg.batch {
            let Some(slot) = self.ports.get_mut(id as usize).and_then(Option::as_mut) else {
                break;
            };
            if slot.held.is_some() || slot.failed.is_some() {
                break;
            }
            let Some(fid) = self.pool.alloc() else { break };
            match slot.port.recv(self.pool.buf_mut(fid)) {
                Ok(Some(len)) => {
                    n += 1;
                    self.ingress(id, fid, len, now_ms);
                }
                Ok(None) => {
                    self.pool.release(fid);
                    break;
                }
                Err(PortError::Io(_)) => {
                    // The device consumed a frame it could not hand over (for a TAP: one
                    // larger than the buffer): it entered the switch and is lost here.
                    self.pool.release(fid);
                    let c = &mut self.ports[id as usize].as_mut().expect("checked above").counters;
                    c.rx_frames += 1;
                    c.rx_drops.add(DropCause::Malformed);
                    n += 1;
                }
                Err(PortError::Gone(e)) => {
                    self.pool.release(fid);
                    self.fail_port(id, format!("receive failed: {e}"));
                    break;
                }
            }
        }
        self.settle();
        n == self.cfg.batch
    }

    /// Port `id` can take frames again: sends what is queued for it.
    pub fn on_writable(&mut self, id: PortId) {
        if let Some(s) = self.slot_mut(id) {
            s.want_write = false;
            if !s.dirty {
                s.dirty = true;
                self.dirty.push(id);
            }
        }
        self.note_interest(id);
        self.settle();
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

    fn fail_port(&mut self, id: PortId, why: String) {
        let Some(s) = self.ports.get_mut(id as usize).and_then(Option::as_mut) else { return };
        if s.failed.is_some() {
            return;
        }
        s.failed = Some(why);
        let mut freed = 0u64;
        while let Some(fid) = s.queue.pop() {
            freed += 1;
            self.pool.release(fid);
        }
        s.counters.tx_drops.tx_error += freed;
        s.seg_done = 0;
        self.note_interest(id);
    }

    /// Validates and classifies a received frame, then forwards it.
    fn ingress(&mut self, id: PortId, fid: u32, len: usize, now_ms: u64) {
        let slot = self.ports[id as usize].as_mut().expect("caller checked");
        slot.counters.rx_frames += 1;
        slot.counters.rx_bytes += len as u64;
        let buf = self.pool.buf_mut(fid);
        let Some(meta) = classify(buf, len, &slot.vlan, &mut slot.counters) else {
            self.pool.release(fid);
            return;
        };
        let src = MacAddr(buf[meta.start as usize + 6..meta.start as usize + 12].try_into().unwrap_or_default());
        if slot.policy.mac.is_some_and(|m| m != src) {
            // Before learning: a forged address must not move the real owner's entry.
            slot.counters.rx_drops.add(DropCause::SpoofedMac);
            self.pool.release(fid);
            return;
        }
        let frame = &buf[meta.start as usize..(meta.start + meta.len) as usize];
        if !slot.policy.allows_source_ip(frame) {
            slot.counters.rx_drops.add(DropCause::SpoofedIp);
            self.pool.release(fid);
            return;
        }
        *self.pool.meta_mut(fid) = meta;
        self.fib.learn(meta.vlan, src, id, now_ms);
        if let Placement::Held = self.forward(id, fid, now_ms) {
            let s = self.ports[id as usize].as_mut().expect("caller checked");
            s.held = Some(fid);
            s.counters.pauses += 1;
            self.held_count += 1;
            self.note_interest(id);
        }
    }

    /// Decides the outputs of frame `fid` from port `from` and places copies in their
    /// queues, or reports that it must be held (lossless mode, an output full).
    fn forward(&mut self, from: PortId, fid: u32, now_ms: u64) -> Placement {
        let meta = *self.pool.meta(fid);
        let frame = self.pool.frame(fid);
        let dst = MacAddr(frame[..6].try_into().unwrap_or_default());
        let decision = self.destinations(from, meta.vlan, dst, now_ms);
        let cause = match decision {
            Decision::Drop(cause) => Some(cause),
            _ if self.dests.is_empty() => Some(DropCause::UnknownPort),
            _ => None,
        };
        if let Some(cause) = cause {
            self.ports[from as usize].as_mut().expect("live").counters.rx_drops.add(cause);
            self.pool.release(fid);
            return Placement::Placed;
        }
        // Copies for mirrors come after the real outputs; they never hold a frame back.
        let real = self.dests.len();
        self.add_mirrors(from, meta.vlan, real);
        // An output whose queue filled up during this batch gets a chance to send before
        // the frame is held or dropped for want of room.
        for i in 0..self.dests.len() {
            let d = self.dests[i];
            if self.ports[d as usize].as_ref().is_some_and(|s| s.queue.is_full() && !s.want_write) {
                self.flush_port(d);
            }
        }
        if self.cfg.lossless {
            let blocked = self.dests[..real].iter().any(|&d| {
                let s = self.ports[d as usize].as_ref().expect("destinations are live");
                meta.l3_max <= u32::from(s.mtu) && s.queue.is_full()
            });
            if blocked {
                return Placement::Held;
            }
        }
        let copies = self.dests.len() as u64;
        for i in 0..self.dests.len() {
            let d = self.dests[i];
            let out = self.ports[d as usize].as_mut().expect("destinations are live");
            out.counters.tx_offered += 1;
            if out.failed.is_some() {
                // Failed while this frame was being placed (its flush hit a dead device).
                out.counters.tx_drops.add(DropCause::TxError);
            } else if meta.l3_max > u32::from(out.mtu) {
                out.counters.tx_drops.add(DropCause::OverMtu);
            } else if !out.queue.push(fid) {
                out.counters.tx_drops.add(DropCause::QueueFull);
            } else {
                self.pool.retain(fid);
                if !out.dirty {
                    out.dirty = true;
                    self.dirty.push(d);
                }
            }
        }
        let c = &mut self.ports[from as usize].as_mut().expect("live").counters;
        c.copies += copies;
        match decision {
            Decision::Flood => c.flooded += 1,
            _ => c.forwarded += 1,
        }
        self.pool.release(fid);
        Placement::Placed
    }

    /// Appends to `self.dests` the mirrors of the frame's input and of its first `real`
    /// outputs, once each, if they are live members of `vlan` and not already outputs.
    fn add_mirrors(&mut self, from: PortId, vlan: u16, real: usize) {
        for k in 0..=real {
            let p = if k == real { from } else { self.dests[k] };
            let Some(m) = self.slot(p).and_then(|s| s.mirrored_to) else { continue };
            let ok = m != from
                && !self.dests.contains(&m)
                && self.slot(m).is_some_and(|s| s.failed.is_none() && s.vlan.is_member(vlan));
            if ok {
                self.dests.push(m);
            }
        }
    }

    /// Fills `self.dests` with the outputs of a frame to `dst` on `vlan` from `from`.
    fn destinations(&mut self, from: PortId, vlan: u16, dst: MacAddr, now_ms: u64) -> Decision {
        self.dests.clear();
        let me = self.slot(from).map_or((false, false), |s| (s.policy.isolated, s.policy.uplink));
        if !dst.is_multicast()
            && let Some(p) = self.fib.lookup(vlan, dst, now_ms)
        {
            if p == from {
                return Decision::Drop(DropCause::SamePort);
            }
            return match self.slot(p) {
                None => Decision::Drop(DropCause::UnknownPort),
                Some(s) if s.failed.is_some() => Decision::Drop(DropCause::UnknownPort),
                Some(s) if !s.vlan.is_member(vlan) => Decision::Drop(DropCause::VlanFilter),
                Some(s) if !may_talk(me, (s.policy.isolated, s.policy.uplink)) => Decision::Drop(DropCause::Isolated),
                Some(_) => {
                    self.dests.push(p);
                    Decision::Unicast
                }
            };
        }
        for (i, p) in self.ports.iter().enumerate() {
            if let Some(s) = p
                && i as PortId != from
                && s.failed.is_none()
                && s.vlan.is_member(vlan)
                && may_talk(me, (s.policy.isolated, s.policy.uplink))
            {
                self.dests.push(i as PortId);
            }
        }
        Decision::Flood
    }

    /// Sends queued frames and retries held ones until nothing more can move.
    fn settle(&mut self) {
        loop {
            let mut moved = false;
            while let Some(d) = self.dirty.pop() {
                moved |= self.flush_port(d);
            }
            if !moved || self.held_count == 0 || !self.retry_held() {
                break;
            }
        }
    }

    /// Retries every held frame; true if any was placed.
    fn retry_held(&mut self) -> bool {
        let mut placed = false;
        for id in 0..self.ports.len() as PortId {
            let Some(fid) = self.slot(id).and_then(|s| s.held) else { continue };
            // Learning and classification happened when the frame arrived; only the
            // placement is retried.
            if let Placement::Placed = self.forward(id, fid, self.now_ms) {
                let s = self.slot_mut(id).expect("live");
                s.held = None;
                self.held_count -= 1;
                self.note_interest(id);
                placed = true;
            }
        }
        placed
    }

    /// Sends port `d`'s queue until it is empty or the port is full. True if it sent any.
    fn flush_port(&mut self, d: PortId) -> bool {
        let mut sent_any = false;
        loop {
            let Some(s) = self.slot_mut(d) else { return sent_any };
            s.dirty = false;
            if s.failed.is_some() {
                return sent_any;
            }
            let Some(fid) = s.queue.front() else { break };
            match self.transmit(d, fid) {
                Sent::Ok => {
                    let s = self.slot_mut(d).expect("live");
                    s.queue.pop();
                    self.pool.release(fid);
                    sent_any = true;
                }
                Sent::Full => {
                    let s = self.slot_mut(d).expect("live");
                    s.want_write = true;
                    self.note_interest(d);
                    break;
                }
                Sent::Drop(cause) => {
                    let s = self.slot_mut(d).expect("live");
                    s.queue.pop();
                    s.counters.tx_drops.add(cause);
                    self.pool.release(fid);
                    sent_any = true;
                }
                Sent::Gone(why) => {
                    self.fail_port(d, why);
                    return true;
                }
            }
        }
        sent_any
    }

    /// Offers frame `fid` to port `d`, completing offloads in software where the port
    /// cannot take them.
    fn transmit(&mut self, d: PortId, fid: u32) -> Sent {
        let Switch { ports, pool, scratch, .. } = self;
        let s = ports[d as usize].as_mut().expect("caller checked");
        let meta = *pool.meta(fid);
        let tagged = s.vlan.egress(meta.vlan) == Some(true);
        let tag = tagged.then(|| {
            let tci = (u16::from(meta.pcp) << 13) | meta.vlan;
            let t = tci.to_be_bytes();
            [0x81, 0x00, t[0], t[1]]
        });
        let shift = if tagged { 4 } else { 0 };
        let len = u64::from(meta.len) + shift;

        if meta.vnet.is_gso() && !s.caps.offload {
            let skip = s.seg_done;
            let mut idx = 0u32;
            let mut outcome = Sent::Ok;
            let port = &mut s.port;
            let result = sluice_wire::segment(pool.frame(fid), &meta.vnet, scratch, |seg| {
                if idx < skip {
                    idx += 1;
                    return true;
                }
                let out = OutFrame { vnet: [0; VNET_HDR_LEN], macs: &seg[..12], tag, rest: &seg[12..] };
                match port.send(&out) {
                    Ok(TxOutcome::Sent) => {
                        idx += 1;
                        true
                    }
                    Ok(TxOutcome::Full) => {
                        outcome = Sent::Full;
                        false
                    }
                    Err(PortError::Io(_)) => {
                        outcome = Sent::Drop(DropCause::TxError);
                        false
                    }
                    Err(PortError::Gone(e)) => {
                        outcome = Sent::Gone(format!("transmit failed: {e}"));
                        false
                    }
                }
            });
            return match (result, outcome) {
                (Err(_), _) => {
                    s.seg_done = 0;
                    Sent::Drop(DropCause::Malformed)
                }
                (Ok(_), Sent::Full) => {
                    s.seg_done = idx;
                    Sent::Full
                }
                (Ok(_), Sent::Ok) => {
                    s.seg_done = 0;
                    s.counters.tx_frames += 1;
                    s.counters.tx_bytes += len;
                    s.counters.tx_segmented += 1;
                    s.counters.tx_segments += u64::from(idx - skip);
                    Sent::Ok
                }
                (Ok(_), other) => {
                    s.seg_done = 0;
                    other
                }
            };
        }

        if meta.vnet.needs_csum() && !s.caps.offload {
            let (frame, m) = pool.frame_and_meta_mut(fid);
            if sluice_wire::fill_partial_checksum(frame, &m.vnet).is_err() {
                return Sent::Drop(DropCause::Malformed);
            }
            // Every other output now sees a frame with a complete checksum.
            m.vnet.flags &= !VnetHdr::F_NEEDS_CSUM;
            s.counters.tx_csum_filled += 1;
        }
        let meta = *pool.meta(fid);
        let mut vnet = [0u8; VNET_HDR_LEN];
        if s.caps.offload {
            let mut h = meta.vnet;
            if h.needs_csum() {
                h.csum_start += shift as u16;
            }
            if h.is_gso() && h.hdr_len != 0 {
                h.hdr_len += shift as u16;
            }
            h.num_buffers = 0;
            h.emit(&mut vnet);
        }
        let frame = pool.frame(fid);
        let out = OutFrame { vnet, macs: &frame[..12], tag, rest: &frame[12..] };
        match s.port.send(&out) {
            Ok(TxOutcome::Sent) => {
                s.counters.tx_frames += 1;
                s.counters.tx_bytes += len;
                if meta.vnet.is_gso() {
                    s.counters.tx_gso += 1;
                }
                Sent::Ok
            }
            Ok(TxOutcome::Full) => Sent::Full,
            Err(PortError::Io(_)) => Sent::Drop(DropCause::TxError),
            Err(PortError::Gone(e)) => Sent::Gone(format!("transmit failed: {e}")),
        }
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

/// Validates a received frame (virtio header at `buf[..12]`, `len` frame bytes after it),
/// applies the port's VLAN ingress rule (removing the tag in place), and returns its
/// metadata; counts the drop and returns `None` when the frame cannot go on.
fn classify(buf: &mut [u8], len: usize, vlan: &VlanMode, c: &mut PortCounters) -> Option<crate::pool::FrameMeta> {
    let drop = |c: &mut PortCounters, cause| {
        c.rx_drops.add(cause);
        None
    };
    let frame_end = VNET_HDR_LEN + len;
    if len < ETH_HDR_LEN || frame_end > buf.len() {
        return drop(c, DropCause::Malformed);
    }
    let Ok(mut vnet) = VnetHdr::parse(&buf[..VNET_HDR_LEN]) else {
        return drop(c, DropCause::Malformed);
    };
    if vnet.validate(len).is_err() {
        return drop(c, DropCause::Malformed);
    }
    let Ok(eth) = parse_ethernet(&buf[VNET_HDR_LEN..frame_end]) else {
        return drop(c, DropCause::Malformed);
    };
    if eth.src.is_multicast() {
        return drop(c, DropCause::Malformed);
    }
    if vnet.is_gso() {
        c.rx_gso += 1;
    }
    let Some(ing) = vlan.ingress(eth.tci) else {
        return drop(c, DropCause::VlanFilter);
    };
    let mut start = VNET_HDR_LEN;
    let mut len = len;
    if eth.tci.is_some() {
        // Remove the tag: move the MAC addresses over it.
        if vnet.needs_csum() && vnet.csum_start < (ETH_HDR_LEN + 4) as u16 {
            return drop(c, DropCause::Malformed);
        }
        buf.copy_within(VNET_HDR_LEN..VNET_HDR_LEN + 12, VNET_HDR_LEN + 4);
        start += 4;
        len -= 4;
        if vnet.needs_csum() {
            vnet.csum_start -= 4;
        }
        vnet.hdr_len = vnet.hdr_len.saturating_sub(4);
    }
    let frame = &buf[start..start + len];
    let l3_max = if vnet.is_gso() {
        match gso_max_l3_len(frame, &vnet) {
            Ok(l) => l,
            Err(_) => return drop(c, DropCause::Malformed),
        }
    } else {
        len - ETH_HDR_LEN
    };
    Some(crate::pool::FrameMeta {
        start: start as u32,
        len: len as u32,
        vnet,
        vlan: ing.vid,
        pcp: ing.pcp,
        l3_max: l3_max as u32,
    })
}

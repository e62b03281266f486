//! The daemon's half of the kernel datapath (docs/architecture.md, "The kernel datapath"):
//! it keeps the kernel's maps equal to the core's state, reads the frames the kernel hands
//! up and gives them to the core, refreshes the core's MAC ages from the kernel's stamps,
//! and merges the kernel's counters into the switch's.
//!
//! Every core port gets a slot in the kernel's port array (a port in user space too: the
//! kernel needs to know that frames to it go up). Slots, not the core's port ids, are what
//! the kernel's MAC entries hold; a port keeps its slot while attached.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use sluice_ebpf::{KernelDatapath, abi, tables};
use sluice_switch::{FastChange, PortCounters, PortId, Switch};
use tracing::{info, warn};

use crate::proto::KernelPortStats;
use crate::sys::{link, tun};

/// A slot held for a port of an earlier run not attached again yet.
const RESERVED: PortId = PortId::MAX;

/// Where the kernel datapath's pins live: a bpffs of sluice's own.
pub fn pin_dir(switch: &str) -> PathBuf {
    crate::paths::run_dir().join("bpf").join(switch)
}

/// Holds the lock that orders the switches of this runtime directory around the bpffs
/// they share: it is mounted by the first to start and unmounted by the last to stop.
struct BpfLock {
    _file: std::fs::File,
}

impl BpfLock {
    fn take() -> Result<BpfLock> {
        let path = crate::paths::run_dir().join(".bpf.lock");
        if let Some(d) = path.parent() {
            std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
        }
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        // SAFETY: flock on a descriptor we own; released when the file closes.
        if unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&f), libc::LOCK_EX) } != 0 {
            bail!("locking {}: {}", path.display(), std::io::Error::last_os_error());
        }
        Ok(BpfLock { _file: f })
    }
}

/// Unmounts `dir` (sluice's bpffs) when no switch has pins in it any more.
fn unmount_if_unused(dir: &std::path::Path) {
    let used =
        std::fs::read_dir(dir).map(|rd| rd.flatten().any(|e| e.file_type().is_ok_and(|t| t.is_dir()))).unwrap_or(true);
    if used {
        return;
    }
    if let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()) {
        // SAFETY: umount of a NUL-terminated path; failure leaves things as they were.
        unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    }
}

/// The upcall TAP's name: `su` and 8 hex digits of the switch's name (interface names
/// hold 15 bytes; switch names 32).
pub fn upcall_name(switch: &str) -> String {
    let mut h: u32 = 0x811c_9dc5;
    for b in switch.bytes() {
        h = (h ^ u32::from(b)).wrapping_mul(0x0100_0193);
    }
    format!("su{h:08x}")
}

/// The kernel side of one switch.
pub struct KernelSide {
    dp: KernelDatapath,
    switch: String,
    upcall: OwnedFd,
    upcall_name: String,
    slot_of: HashMap<PortId, u32>,
    port_at: Vec<Option<PortId>>,
    /// Interfaces the program is attached to, by port.
    attached: HashMap<PortId, Vec<String>>,
    /// The veth ports among them.
    veths: std::collections::HashSet<PortId>,
    /// Taking over an earlier run: its kernel ports' slots by interface index, until
    /// those ports are attached again.
    reserved: HashMap<u32, u32>,
    /// This run took over an earlier one's pinned state.
    takeover: bool,
    /// Ports whose interface disappeared (reported once).
    gone: std::collections::HashSet<PortId>,
    /// The daemon's clock origin (an `Instant`, which is `CLOCK_MONOTONIC` on Linux, as
    /// the kernel's last-seen stamps are).
    started: Instant,
    /// Frames read from the upcall TAP that could not be given to the core.
    pub upcalls_refused: u64,
    /// The switch's mode, as the maps spell it.
    mode: u8,
    router_mac: sluice_wire::MacAddr,
    upcall_ifindex: u32,
    /// Layer 3: the uplink port off-switch traffic leaves by (the core's: the first live
    /// uplink), as the kernel's config holds it.
    l3_uplink: Option<u32>,
}

fn monotonic_ns() -> u64 {
    // SAFETY: clock_gettime writes a timespec we own.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: as above; CLOCK_MONOTONIC is always available.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

impl KernelSide {
    /// Loads the kernel datapath for switch `name` with a MAC table of `fib_max` entries,
    /// and opens its upcall TAP. `started` is the daemon's clock origin.
    pub fn start(name: &str, cfg: &sluice_switch::SwitchConfig, started: Instant) -> Result<Self> {
        let fib_max = cfg.fib_max;
        let mode = if cfg.mode == sluice_switch::Mode::L3 { abi::MODE_L3 } else { abi::MODE_L2 };
        if !sluice_ebpf::available() {
            bail!(sluice_ebpf::Error::NotBuilt);
        }
        let dir = pin_dir(name);
        let lock = BpfLock::take()?;
        sluice_ebpf::ensure_bpffs(&crate::paths::run_dir().join("bpf"))?;
        // What an earlier run of this switch left pinned (a crash, `sluice switch restart`)
        // is taken over, so forwarding never stops; unless its layout is another build's.
        let fib_max = fib_max.min(u32::MAX as usize) as u32;
        let takeover = match sluice_ebpf::pins_compatible(&dir, fib_max) {
            Some(true) => true,
            Some(false) => {
                warn!(dir = %dir.display(), "the kernel datapath an earlier sluice left has another layout (or MAC table size); removing it and starting afresh");
                sluice_ebpf::remove_pins(&dir);
                false
            }
            None => {
                // Links without maps: nothing worth taking over.
                sluice_ebpf::remove_pins(&dir);
                false
            }
        };
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let mut dp = KernelDatapath::open(&dir, fib_max)?;
        drop(lock);
        // The slots the earlier run gave its kernel ports, by interface: the same interface
        // gets the same slot again, so the MAC entries pointing at it stay right.
        let mut reserved = HashMap::new();
        let mut port_at = vec![None; abi::MAX_PORTS as usize];
        if takeover {
            for (slot, p) in dp.ports() {
                if p.flags & abi::PF_KERNEL != 0 {
                    reserved.insert(p.ifindex, slot);
                }
                port_at[slot as usize] = Some(RESERVED);
            }
            info!(switch = %name, ports = reserved.len(), "taking over the kernel datapath an earlier run left forwarding");
        }
        let upcall_name = upcall_name(name);
        let tap = tun::open_upcall_tap(&upcall_name)?;
        let ifindex = link::ifindex(&upcall_name)?;
        dp.set_config(ifindex, mode, cfg.router_mac, None)?;
        info!(switch = %name, upcall = %upcall_name, pins = %dir.display(), "kernel datapath loaded");
        Ok(KernelSide {
            dp,
            switch: name.to_string(),
            upcall: tap.fd,
            upcall_name,
            slot_of: HashMap::new(),
            port_at,
            reserved,
            takeover,
            gone: Default::default(),
            veths: Default::default(),
            attached: HashMap::new(),
            started,
            upcalls_refused: 0,
            mode,
            router_mac: cfg.router_mac,
            upcall_ifindex: ifindex,
            l3_uplink: None,
        })
    }

    /// The upcall TAP's descriptor, for the event loop.
    pub fn upcall_fd(&self) -> RawFd {
        self.upcall.as_raw_fd()
    }

    /// Attaches the program to port `id`'s interfaces `ifnames` (a veth's one; an uplink's
    /// devices, its backups with it). Only a veth is watched for disappearing.
    pub fn attach(&mut self, id: PortId, ifnames: &[String], veth: bool) -> Result<()> {
        for (i, ifname) in ifnames.iter().enumerate() {
            if let Err(e) = self.dp.attach(ifname) {
                for done in &ifnames[..i] {
                    self.dp.detach(done);
                }
                return Err(e.into());
            }
        }
        self.attached.insert(id, ifnames.to_vec());
        if veth {
            self.veths.insert(id);
        }
        Ok(())
    }

    /// Detaches the program from port `id`'s interfaces, if it was attached.
    pub fn detach(&mut self, id: PortId) {
        self.gone.remove(&id);
        self.veths.remove(&id);
        for ifname in self.attached.remove(&id).unwrap_or_default() {
            self.dp.detach(&ifname);
        }
    }

    /// Port `id`'s slot (reached by the kernel at `target`), given now if it has none.
    fn slot(&mut self, id: PortId, target: Option<u32>) -> Option<u32> {
        if let Some(&s) = self.slot_of.get(&id) {
            return Some(s);
        }
        let slot = match target.and_then(|t| self.reserved.remove(&t)) {
            Some(s) => s,
            None => self.port_at.iter().position(Option::is_none)? as u32,
        };
        self.port_at[slot as usize] = Some(id);
        self.slot_of.insert(id, slot);
        Some(slot)
    }

    /// Ends a takeover once the configured ports are attached again: the core learns the
    /// MAC entries the kernel kept (those of ports still here), and what belonged to ports
    /// that are gone is removed. Counters start from zero, as the core's do.
    pub fn finish_takeover(&mut self, sw: &mut Switch, now_ms: u64) {
        if !self.takeover {
            return;
        }
        self.takeover = false;
        let mut learned = 0;
        let live = |port_at: &[Option<PortId>], slot: u32| {
            port_at.get(slot as usize).copied().flatten().filter(|&id| id != RESERVED)
        };
        for (vlan, mac, slot, is_static, _) in self.dp.macs() {
            match live(&self.port_at, slot) {
                Some(id) => {
                    if !is_static {
                        sw.fib_mut().learn(vlan, mac, id, now_ms);
                        learned += 1;
                    }
                }
                None => self.dp.del_mac(vlan, mac),
            }
        }
        for (k, slot) in self.dp.owners() {
            let Some(ip) = tables::key_ip(k.family, &k.addr) else { continue };
            match live(&self.port_at, slot) {
                Some(id) => sw.adopt_owner(ip, id),
                None => {
                    let _ = self.dp.set_owner(ip, None);
                }
            }
        }
        for (vlan, ip, mac) in self.dp.neighbours() {
            sw.adopt_neighbour(vlan, ip, mac, now_ms);
        }
        for slot in 0..abi::MAX_PORTS {
            if self.port_at[slot as usize] == Some(RESERVED) {
                self.port_at[slot as usize] = None;
                let _ = self.dp.clear_port(slot);
            }
        }
        self.reserved.clear();
        for slot in 0..abi::MAX_PORTS {
            let _ = self.dp.reset_counters(slot);
        }
        info!(switch = %self.switch, stations = learned, "took over the kernel datapath");
    }

    /// Lets go of the kernel datapath without removing it: programs keep forwarding and
    /// what goes up waits in the persistent upcall TAP until a new run takes over.
    pub fn leave(self) {
        info!(switch = %self.switch, pins = %pin_dir(&self.switch).display(), "kernel datapath left forwarding for the next run to take over");
    }

    /// Writes into the kernel's maps every change the core reports.
    pub fn sync(&mut self, sw: &mut Switch) {
        let mut changes = Vec::new();
        sw.take_fastpath_changes(|c| changes.push(c));
        let ports_changed = changes.iter().any(|c| matches!(c, FastChange::Port(_)));
        for c in changes {
            let r = match c {
                FastChange::Owner(ip) => {
                    let slot = sw.fast_owner(ip).and_then(|id| self.slot_of.get(&id).copied());
                    self.dp.set_owner(ip, slot).map_err(anyhow::Error::from)
                }
                FastChange::Neighbour(vlan, ip) => {
                    self.dp.set_neighbour(vlan, ip, sw.fast_neighbour(vlan, ip)).map_err(anyhow::Error::from)
                }
                FastChange::Port(id) => match sw.fast_port(id) {
                    Some(p) => match self.slot(id, p.target) {
                        Some(slot) => {
                            let mirror = p.mirror.and_then(|m| {
                                let target = sw.fast_port(m).and_then(|mp| mp.target);
                                self.slot(m, target)
                            });
                            self.dp
                                .set_port(slot, &tables::port_entry(&p, self.mode, mirror))
                                .map_err(anyhow::Error::from)
                        }
                        None => {
                            Err(anyhow::anyhow!("no free port slot (the kernel datapath holds {})", abi::MAX_PORTS))
                        }
                    },
                    None => {
                        if let Some(slot) = self.slot_of.remove(&id) {
                            self.port_at[slot as usize] = None;
                            let _ = self.dp.reset_counters(slot);
                            self.dp.clear_port(slot).map_err(anyhow::Error::from)
                        } else {
                            Ok(())
                        }
                    }
                },
                FastChange::Mac(vlan, mac) => match sw.fast_mac(vlan, mac) {
                    Some(e) => match self.slot_of.get(&e.port) {
                        Some(&slot) => self.dp.set_mac(vlan, mac, slot, e.is_static).map_err(anyhow::Error::from),
                        None => Ok(()),
                    },
                    None => {
                        self.dp.del_mac(vlan, mac);
                        Ok(())
                    }
                },
            };
            if let Err(e) = r {
                warn!(switch = %self.switch, "kernel datapath: {e:#}; the frames it concerns go through user space");
            }
        }
        if ports_changed && self.mode == abi::MODE_L3 {
            // The core's choice for traffic off the switch: the first live uplink.
            let up = sw
                .port_ids()
                .find(|&id| sw.fast_port(id).is_some_and(|p| p.uplink && !p.slow))
                .and_then(|id| self.slot_of.get(&id).copied());
            if up != self.l3_uplink {
                self.l3_uplink = up;
                if let Err(e) = self.dp.set_config(self.upcall_ifindex, self.mode, self.router_mac, up) {
                    warn!(switch = %self.switch, "kernel datapath: {e:#}");
                }
            }
        }
    }

    /// Gives the core every frame waiting in the upcall TAP, at most `limit`; returns how
    /// many were read (frames that could not be given are counted in `upcalls_refused`).
    pub fn read_upcalls(&mut self, sw: &mut Switch, now_ms: u64, limit: usize) -> usize {
        let fd = self.upcall.as_raw_fd();
        let mut n = 0;
        while n < limit {
            let mut read = false;
            let mut bad = false;
            let port_at = &self.port_at;
            let took = sw.ingest(now_ms, |buf| match tun::read_upcall(fd, buf) {
                Ok(Some((len, tpid, tci))) => {
                    read = true;
                    let slot = usize::from(tci & 0x0fff);
                    let id = (tpid == 0x88a8)
                        .then(|| port_at.get(slot).copied().flatten())
                        .flatten()
                        .filter(|&id| id != RESERVED);
                    if id.is_none() {
                        bad = true;
                        return None;
                    }
                    fix_vnet_after_untag(buf);
                    Some((id?, len))
                }
                Ok(None) => None,
                Err(_) => {
                    read = true;
                    bad = true;
                    None
                }
            });
            if !read {
                break;
            }
            n += 1;
            if bad || !took {
                self.upcalls_refused += 1;
            }
        }
        n
    }

    /// Checks that every interface the program is attached to is still there (a veth can be
    /// deleted behind the switch's back): a port whose interface went is marked failed in
    /// the core, once, with a log line — its frames then go up and are dropped as
    /// `unknown_port`, counted, and everything else keeps forwarding.
    pub fn check_interfaces(&mut self, sw: &mut Switch) {
        let mut gone = Vec::new();
        for (&id, ifnames) in &self.attached {
            if self.gone.contains(&id) || !self.veths.contains(&id) {
                continue;
            }
            let Some(ifname) = ifnames.first() else { continue };
            let target = sw.fast_port(id).and_then(|p| p.target);
            let now = link::ifindex(ifname).ok();
            if now.is_none() || now != target {
                gone.push((id, ifname.clone()));
            }
        }
        for (id, ifname) in gone {
            warn!(switch = %self.switch, port = %ifname, "interface {ifname} is gone (deleted behind the switch's back); its port stops, frames for it are dropped as unknown_port; delete the port with `sluice port del {ifname}`");
            self.gone.insert(id);
            sw.port_gone(id, format!("interface {ifname} was deleted"));
        }
    }

    /// Tells the core which MAC entries the kernel forwarded from lately, so they do not
    /// age out while their traffic never reaches user space.
    pub fn refresh_ages(&mut self, sw: &mut Switch) {
        let now_ms = self.started.elapsed().as_millis() as u64;
        let now_ns = monotonic_ns();
        for (vlan, mac, slot, _, seen_ns) in self.dp.macs() {
            if seen_ns == 0 {
                continue;
            }
            let Some(Some(id)) = self.port_at.get(slot as usize) else { continue };
            if *id == RESERVED {
                continue;
            }
            let ago_ms = now_ns.saturating_sub(seen_ns) / 1_000_000;
            sw.touch_mac(vlan, mac, *id, now_ms.saturating_sub(ago_ms));
        }
    }

    /// Port `id`'s counters as the switch reports them: the core's for what it handled,
    /// plus the kernel's; the frames sent up not yet taken by the core; and the kernel's
    /// own part (kernel ports only).
    pub fn merged(&self, id: PortId, core: PortCounters) -> (PortCounters, u64, Option<KernelPortStats>) {
        // Ports in user space: the kernel never sees their frames.
        if !self.attached.contains_key(&id) {
            return (core, 0, None);
        }
        let Some(&slot) = self.slot_of.get(&id) else { return (core, 0, None) };
        let k = self.dp.counters(slot);
        let (m, upcall) = merge(core, &k);
        let own = KernelPortStats {
            forwarded: k.v[abi::c::FORWARDED],
            upcalls: k.v[abi::c::UPCALLS],
            drops: k.v[abi::c::RX_DROP..abi::c::RX_DROP + 13].iter().sum(),
        };
        (m, upcall, Some(own))
    }

    /// Zeroes the kernel's counters.
    pub fn reset_counters(&mut self) {
        for &slot in self.slot_of.values() {
            let _ = self.dp.reset_counters(slot);
        }
    }

    /// Detaches everything, removes the pins and the upcall TAP: nothing is left.
    pub fn stop(self) {
        let _ = tun::set_persist(self.upcall.as_raw_fd(), false);
        info!(switch = %self.switch, upcall = %self.upcall_name, "kernel datapath removed");
        let lock = BpfLock::take();
        self.dp.remove();
        unmount_if_unused(&crate::paths::run_dir().join("bpf"));
        drop(lock);
    }
}

/// The TAP computed the virtio header of an upcalled frame with the outer tag in it; the
/// checksum start and header length move back by the tag's 4 bytes.
fn fix_vnet_after_untag(buf: &mut [u8]) {
    let Ok(mut h) = sluice_wire::VnetHdr::parse(&buf[..sluice_wire::VNET_HDR_LEN]) else { return };
    if h.needs_csum() {
        h.csum_start = h.csum_start.saturating_sub(4);
    }
    if h.hdr_len != 0 {
        h.hdr_len = h.hdr_len.saturating_sub(4);
    }
    if let Some(head) = buf.first_chunk_mut::<{ sluice_wire::VNET_HDR_LEN }>() {
        h.emit(head);
    }
}

/// The core's counters of a kernel-reachable port plus the kernel's (see
/// docs/architecture.md, "Counters"): the kernel saw every frame in; what it sent up the
/// core counted again as received, so those are not added twice; the difference is still
/// on its way (the `upcall` gauge).
fn merge(core: PortCounters, k: &abi::Counters) -> (PortCounters, u64) {
    use abi::c;
    use sluice_switch::DropCause;
    let mut m = core;
    m.rx_frames = k.v[c::RX_FRAMES];
    m.rx_bytes = k.v[c::RX_BYTES];
    m.rx_gso = k.v[c::RX_GSO];
    m.forwarded += k.v[c::FORWARDED];
    m.copies += k.v[c::COPIES];
    m.tx_offered += k.v[c::TX_OFFERED];
    m.tx_frames += k.v[c::TX_FRAMES];
    m.tx_bytes += k.v[c::TX_BYTES];
    m.tx_gso += k.v[c::TX_GSO];
    for (i, cause) in DropCause::ALL.iter().enumerate() {
        m.rx_drops.add_n(*cause, k.v[c::RX_DROP + i]);
        m.tx_drops.add_n(*cause, k.v[c::TX_DROP + i]);
    }
    let upcall = k.v[c::UPCALLS].saturating_sub(core.rx_frames);
    (m, upcall)
}

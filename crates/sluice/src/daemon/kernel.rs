//! The daemon's half of the kernel datapath (docs/architecture.md, "The kernel datapath"):
//! it keeps the kernel's maps equal to the core's state, reads the frames the kernel hands
//! up and gives them to the core, refreshes the core's MAC ages from the kernel's stamps,
//! and merges the kernel's counters into the switch's.
//!
//! Every core port gets a slot in the kernel's port array (a port in user space too: the
//! kernel needs to know that frames to it go up). Slots, not the core's port ids, are what
//! the kernel's MAC entries hold; a port keeps its slot while attached.

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use sluice_ebpf::{KernelDatapath, abi, tables};
use sluice_switch::{FastChange, PortCounters, PortId, Switch};
use tracing::{info, warn};

use crate::port::vxlan::{Heard, KernelTunnel};
use crate::proto::{KernelPortStats, KernelSummary};
use crate::sys::{link, tun};

/// The TTL (hop limit) of the datagrams the kernel's tunnels send, as Linux's vxlan
/// default route hop limit gives them.
const TUNNEL_TTL: u8 = 64;

/// A slot held for a port of an earlier run not attached again yet.
const RESERVED: PortId = PortId::MAX;

/// How long a port slot rests after its port left before another port gets it.
const SLOT_QUARANTINE: Duration = Duration::from_secs(60);

/// The environment variable through which a daemon restarting in place hands the upcall
/// TAP's descriptor to the next (so the frames queued in it survive the `exec`).
pub const UPCALL_FD_ENV: &str = "SLUICE_UPCALL_FD";

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

/// Removes what a daemon of switch `switch` that died (rather than stopped) left of the
/// kernel datapath: its pins (so the programs stop forwarding) and its upcall TAP. Only
/// for when no daemon of that switch runs.
pub fn remove_leftovers(switch: &str) {
    let dir = pin_dir(switch);
    if let Ok(lock) = BpfLock::take() {
        if dir.exists() {
            sluice_ebpf::remove_pins(&dir);
        }
        unmount_if_unused(&crate::paths::run_dir().join("bpf"));
        drop(lock);
    }
    let tap = upcall_name(switch);
    if link::driver(&tap).ok().as_deref() == Some("tun") {
        let _ = std::process::Command::new("ip")
            .args(["link", "del", &tap])
            .stdin(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status();
    }
}

/// The upcall TAP's name: `su` and 8 hex digits of the switch's name (interface names
/// hold 15 bytes; switch names 32).
pub fn upcall_name(switch: &str) -> String {
    format!("su{:08x}", fnv1a(switch))
}

/// The kernel device of switch `switch`'s tunnel port `port`: `sx` and 8 hex digits of
/// both names (ports of different switches share the daemon's namespace).
pub fn tunnel_device_name(switch: &str, port: &str) -> String {
    format!("sx{:08x}", fnv1a(&format!("{switch}/{port}")))
}

/// FNV-1a, 32 bits: a short stable name from a longer one.
fn fnv1a(s: &str) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in s.bytes() {
        h = (h ^ u32::from(b)).wrapping_mul(0x0100_0193);
    }
    h
}

/// The kernel side of one switch.
pub struct KernelSide {
    dp: KernelDatapath,
    switch: String,
    upcall: OwnedFd,
    upcall_name: String,
    /// /proc/net/dev of the daemon's namespace: the upcall TAP's drop counter.
    upcall_stats: Option<File>,
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
    /// Changes of the core the kernel's maps refused.
    map_updates_failed: u64,
    /// The switch's mode, as the maps spell it.
    mode: u8,
    router_mac: sluice_wire::MacAddr,
    upcall_ifindex: u32,
    /// Layer 3: the uplink port off-switch traffic leaves by (the core's: the first live
    /// uplink), as the kernel's config holds it.
    l3_uplink: Option<u32>,
    /// Every slot in use is below this, as the kernel's config holds it (a flood looks at
    /// the slots below it).
    n_slots: u32,
    /// Interfaces (by index) that are veths with their peer in this namespace.
    egress: HashMap<u32, bool>,
    /// When each free slot's last port left (`None`: never used, or a takeover's). A slot
    /// is not given out again until [`SLOT_QUARANTINE`] has passed, so that a frame still
    /// on its way for the old port (in the upcall TAP's queue, tagged with the slot) cannot
    /// be taken for the new one's; within that, the lowest slot goes first, which keeps
    /// the slots a flood looks at (`n_slots`) close to the ports in use.
    freed_at: Vec<Option<Instant>>,
    /// Left for the next run ([`KernelSide::leave`]): nothing is removed on drop.
    keep: bool,
    /// Tunnel ports: their device's index, and where what the kernel heard behind them goes.
    tunnels: HashMap<PortId, (u32, std::sync::mpsc::Sender<Heard>)>,
}

/// A slot for a new port at `now`: the lowest free one that has rested
/// [`SLOT_QUARANTINE`] since its last port left (or never had one); when none has (ports
/// churning faster), the free one that left longest ago; `None` when all are in use.
fn pick_slot(port_at: &[Option<PortId>], freed_at: &[Option<Instant>], now: Instant) -> Option<usize> {
    let free = |i: &usize| port_at[*i].is_none();
    let rested = |i: &usize| freed_at[*i].is_none_or(|t| now.saturating_duration_since(t) >= SLOT_QUARANTINE);
    let n = port_at.len();
    (0..n).filter(free).find(rested).or_else(|| (0..n).filter(free).min_by_key(|&i| freed_at[i]))
}

/// One past the highest slot in use (0: none).
fn slots_in_use(port_at: &[Option<PortId>]) -> u32 {
    port_at.iter().rposition(Option::is_some).map_or(0, |i| i as u32 + 1)
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
        // Restarted in place: the earlier daemon handed its descriptor over (see `leave`).
        let inherited = std::env::var(UPCALL_FD_ENV)
            .ok()
            .and_then(|v| v.parse::<RawFd>().ok())
            .and_then(|fd| tun::adopt_upcall_tap(fd, &upcall_name));
        let tap = match inherited {
            Some(t) => t,
            None => tun::open_upcall_tap(&upcall_name)?,
        };
        let ifindex = link::ifindex(&upcall_name)?;
        // Layer 3: until the ports are attached again, traffic off the switch keeps leaving
        // by the uplink the earlier run chose (its slot is reserved for it).
        let l3_uplink = if takeover { dp.config().and_then(|c| c.l3_uplink.checked_sub(1)) } else { None };
        let n_slots = slots_in_use(&port_at);
        dp.set_config(ifindex, mode, cfg.router_mac, l3_uplink, n_slots)?;
        // Only the program's upcalls into the TAP's queue: anyone in this namespace can bind
        // a socket to the TAP and send through it (SO_BINDTODEVICE needs no privilege), and
        // such frames would fill the queue the upcalls wait in. (Taken over in place, as the
        // ports' links are, after a restart.)
        dp.attach_egress(&upcall_name)
            .with_context(|| format!("guarding the upcall TAP {upcall_name} against frames not the switch's"))?;
        info!(switch = %name, upcall = %upcall_name, pins = %dir.display(), "kernel datapath loaded");
        Ok(KernelSide {
            dp,
            switch: name.to_string(),
            upcall: tap.fd,
            upcall_stats: tap.stats,
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
            map_updates_failed: 0,
            mode,
            router_mac: cfg.router_mac,
            upcall_ifindex: ifindex,
            l3_uplink,
            n_slots,
            egress: HashMap::new(),
            freed_at: vec![None; abi::MAX_PORTS as usize],
            keep: false,
            tunnels: HashMap::new(),
        })
    }

    /// The upcall TAP's descriptor, for the event loop.
    pub fn upcall_fd(&self) -> RawFd {
        self.upcall.as_raw_fd()
    }

    /// Attaches the program to port `id`'s interfaces `ifnames` (a veth's one; an uplink's
    /// devices, its backups with it). A veth — the switch's end of a guest's pair — also
    /// gets the egress program, which lets only the switch's own frames into the guest;
    /// only a veth is watched for disappearing.
    pub fn attach(&mut self, id: PortId, ifnames: &[String], veth: bool) -> Result<()> {
        for (i, ifname) in ifnames.iter().enumerate() {
            let r = self.dp.attach(ifname).and_then(|()| if veth { self.dp.attach_egress(ifname) } else { Ok(()) });
            if let Err(e) = r {
                for done in &ifnames[..=i] {
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

    /// Makes port `id` (not attached yet) a tunnel through kernel device `t`: its settings
    /// in the kernel's maps, so that its port entry is written with `PF_TUNNEL`.
    pub fn add_tunnel(&mut self, id: PortId, t: &KernelTunnel) -> Result<()> {
        use sluice_switch::tunnel::VniMap;
        let (vni, pairs) = match &t.vnis {
            VniMap::Single(v) => (*v, Vec::new()),
            VniMap::PerVlan(p) => (0, p.clone()),
        };
        let spec = sluice_ebpf::TunnelSpec {
            local: t.local,
            ttl: TUNNEL_TTL,
            vni,
            per_vlan: &pairs,
            remotes: &t.remotes,
            remotes_only: t.remotes_only,
        };
        self.dp.set_tunnel(t.ifindex, &spec)?;
        self.tunnels.insert(id, (t.ifindex, t.heard.clone()));
        Ok(())
    }

    /// Detaches the program from port `id`'s interfaces, if it was attached.
    pub fn detach(&mut self, id: PortId) {
        if let Some((ifindex, _)) = self.tunnels.remove(&id) {
            self.dp.clear_tunnel(ifindex);
        }
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
            None => pick_slot(&self.port_at, &self.freed_at, Instant::now())? as u32,
        };
        self.port_at[slot as usize] = Some(id);
        self.slot_of.insert(id, slot);
        Some(slot)
    }

    /// Ends a takeover once the configured ports are attached again: the core learns the
    /// MAC entries, address owners and neighbours the kernel kept (those of ports still
    /// here), then every kernel entry is rewritten from the core's answer — what belonged
    /// to ports that are gone, or to a configuration that changed (a static entry), goes.
    /// Links of interfaces no port took again are removed. Counters start from zero, as
    /// the core's do.
    pub fn finish_takeover(&mut self, sw: &mut Switch, now_ms: u64) {
        if !self.takeover {
            return;
        }
        self.takeover = false;
        let mut learned = 0;
        let live = |port_at: &[Option<PortId>], slot: u32| {
            port_at.get(slot as usize).copied().flatten().filter(|&id| id != RESERVED)
        };
        let macs = self.dp.macs();
        for &(vlan, mac, slot, is_static, _) in &macs {
            if let Some(id) = live(&self.port_at, slot)
                && !is_static
            {
                sw.adopt_mac(vlan, mac, id, now_ms);
                learned += 1;
            }
        }
        for (vlan, mac, ..) in macs {
            let to = sw.fast_mac(vlan, mac).and_then(|e| Some((self.slot_of.get(&e.port).copied()?, e.is_static)));
            match to {
                Some((slot, is_static)) => {
                    let _ = self.dp.set_mac(vlan, mac, slot, is_static);
                }
                None => self.dp.del_mac(vlan, mac),
            }
        }
        let owners = self.dp.owners();
        for (k, slot) in &owners {
            if let (Some(ip), Some(id)) = (tables::key_ip(k.family, &k.addr), live(&self.port_at, *slot)) {
                sw.adopt_owner(ip, id);
            }
        }
        for (k, _) in owners {
            let Some(ip) = tables::key_ip(k.family, &k.addr) else { continue };
            let slot = sw.fast_owner(ip).and_then(|id| self.slot_of.get(&id).copied());
            let _ = self.dp.set_owner(ip, slot);
        }
        let neighbours = self.dp.neighbours();
        for &(vlan, ip, mac) in &neighbours {
            sw.adopt_neighbour(vlan, ip, mac, now_ms);
        }
        for (vlan, ip, _) in neighbours {
            let _ = self.dp.set_neighbour(vlan, ip, sw.fast_neighbour(vlan, ip));
        }
        for slot in 0..abi::MAX_PORTS {
            if self.port_at[slot as usize] == Some(RESERVED) {
                self.port_at[slot as usize] = None;
                self.freed_at[slot as usize] = Some(Instant::now());
                let _ = self.dp.clear_port(slot);
            }
        }
        self.follow_slots();
        self.reserved.clear();
        let attached: std::collections::HashSet<&String> = self.attached.values().flatten().collect();
        for ifname in self.dp.linked() {
            if !attached.contains(&ifname) && ifname != self.upcall_name {
                info!(switch = %self.switch, interface = %ifname, "no port took interface {ifname} again; the kernel datapath leaves it");
                self.dp.detach(&ifname);
            }
        }
        for slot in 0..abi::MAX_PORTS {
            let _ = self.dp.reset_counters(slot);
        }
        let _ = self.dp.reset_switch_counters();
        // The way off the switch is the core's choice from here on.
        self.l3_uplink = None;
        self.choose_l3_uplink(sw, true);
        info!(switch = %self.switch, stations = learned, "took over the kernel datapath");
    }

    /// Lets go of the kernel datapath without removing it: programs keep forwarding and
    /// what goes up waits in the persistent upcall TAP until a new run takes over. Returns
    /// a descriptor of the upcall TAP that survives `exec` (for a restart in place: while
    /// a descriptor is open the TAP keeps its queue), if one could be made.
    pub fn leave(mut self) -> Option<RawFd> {
        self.keep = true;
        info!(switch = %self.switch, pins = %pin_dir(&self.switch).display(), "kernel datapath left forwarding for the next run to take over");
        // SAFETY: dup of a descriptor we own; the copy is not close-on-exec and is handed
        // to the next program image, which owns it from then on.
        let fd = unsafe { libc::dup(self.upcall.as_raw_fd()) };
        (fd >= 0).then_some(fd)
    }

    /// The kernel datapath's own figures.
    pub fn summary(&self) -> KernelSummary {
        let queue_drops = self.upcall_stats.as_ref().and_then(|f| {
            use std::os::unix::fs::FileExt;
            let mut buf = vec![0u8; 65536];
            let n = f.read_at(&mut buf, 0).ok()?;
            let text = std::str::from_utf8(&buf[..n]).ok()?;
            crate::port::tap::parse_proc_net_dev(text, &self.upcall_name).map(|d| d.from_guest)
        });
        KernelSummary {
            upcall_device: self.upcall_name.clone(),
            upcall_queue_drops: queue_drops,
            upcall_egress_refused: self.dp.switch_counters().v[abi::s::UPCALL_EGRESS_REFUSED],
            upcalls_refused: self.upcalls_refused,
            map_updates_failed: self.map_updates_failed,
        }
    }

    /// Layer 3: points the kernel's way off the switch at the core's — the first uplink
    /// that has not failed (`force`: write it even if unchanged).
    fn choose_l3_uplink(&mut self, sw: &Switch, force: bool) {
        if self.mode != abi::MODE_L3 {
            return;
        }
        let up = sw
            .port_ids()
            .find(|&id| sw.fast_port(id).is_some_and(|p| p.uplink && !p.failed))
            .and_then(|id| self.slot_of.get(&id).copied());
        if up != self.l3_uplink || force {
            self.l3_uplink = up;
            self.write_config();
        }
    }

    /// Follows the slots in use: a flood must look at every one (a port given a slot
    /// past the others is written before this, so no flood misses it).
    fn follow_slots(&mut self) {
        let n = slots_in_use(&self.port_at);
        if n != self.n_slots {
            self.n_slots = n;
            self.write_config();
        }
    }

    fn write_config(&mut self) {
        let (ifindex, mode, mac, up, n) =
            (self.upcall_ifindex, self.mode, self.router_mac, self.l3_uplink, self.n_slots);
        if let Err(e) = self.dp.set_config(ifindex, mode, mac, up, n) {
            warn!(switch = %self.switch, "kernel datapath: {e:#}");
        }
    }

    /// Whether interface `ifindex` is a veth whose peer is in the switch's namespace.
    fn sends_egress(&mut self, ifindex: u32) -> bool {
        *self.egress.entry(ifindex).or_insert_with(|| link::veth_peer_here(ifindex))
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
                            let mut e = tables::port_entry(&p, self.mode, mirror);
                            if self.tunnels.contains_key(&id) {
                                e.flags |= abi::PF_TUNNEL;
                            } else if let Some(t) = p.target
                                && !p.uplink
                                && self.sends_egress(t)
                            {
                                e.flags |= abi::PF_EGRESS;
                            }
                            let r = self.dp.set_port(slot, &e).map_err(anyhow::Error::from);
                            self.follow_slots();
                            r
                        }
                        None => {
                            Err(anyhow::anyhow!("no free port slot (the kernel datapath holds {})", abi::MAX_PORTS))
                        }
                    },
                    None => {
                        if let Some(slot) = self.slot_of.remove(&id) {
                            self.port_at[slot as usize] = None;
                            self.freed_at[slot as usize] = Some(Instant::now());
                            let _ = self.dp.reset_counters(slot);
                            let r = self.dp.clear_port(slot).map_err(anyhow::Error::from);
                            self.follow_slots();
                            r
                        } else {
                            Ok(())
                        }
                    }
                },
                FastChange::Mac(vlan, mac) => match sw.fast_mac(vlan, mac) {
                    Some(e) => match self.slot_of.get(&e.port) {
                        Some(&slot) => self.dp.set_mac(vlan, mac, slot, e.is_static).map_err(anyhow::Error::from),
                        None => {
                            // (A port with no slot: frames to it must go up, not to the
                            // entry's old port.)
                            self.dp.del_mac(vlan, mac);
                            Ok(())
                        }
                    },
                    None => {
                        self.dp.del_mac(vlan, mac);
                        Ok(())
                    }
                },
            };
            if let Err(e) = r {
                self.map_updates_failed += 1;
                warn!(switch = %self.switch, "kernel datapath: {e:#}; the frames it concerns go through user space");
            }
        }
        // (During a takeover the earlier run's choice stands until the ports are back.)
        if ports_changed && !self.takeover {
            self.choose_l3_uplink(sw, false);
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
        // What the tunnels heard goes to their ports; stations silent past the aging time
        // are forgotten (their frames go up and to every endpoint until heard again).
        let aging_ns = crate::port::vxlan::AGING_MS * 1_000_000;
        for (id, (ifindex, tx)) in &self.tunnels {
            let mut stations = self.dp.heard(*ifindex);
            stations.retain(|&(vni, mac, _, seen_ns)| {
                let fresh = now_ns.saturating_sub(seen_ns) < aging_ns;
                if !fresh {
                    self.dp.forget_heard(*ifindex, vni, mac);
                }
                fresh
            });
            let refused = self.slot_of.get(id).map_or(0, |&s| self.dp.counters(s).v[abi::c::TUN_BAD]);
            let _ = tx.send(Heard { stations, now_ns, refused });
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
            flooded: k.v[abi::c::FLOODED],
            upcalls: k.v[abi::c::UPCALLS],
            drops: k.v[abi::c::RX_DROP..abi::c::RX_DROP + sluice_switch::DropCause::ALL.len()].iter().sum(),
        };
        (m, upcall, Some(own))
    }

    /// What the kernel counted for port `id` beyond the core's `core` (what the merged
    /// counters add to them), for the switch's totals of departed ports when it is
    /// removed.
    pub fn kernel_part(&self, id: PortId, core: PortCounters) -> Option<PortCounters> {
        use abi::c;
        let &slot = self.slot_of.get(&id)?;
        if !self.attached.contains_key(&id) {
            return None;
        }
        let k = self.dp.counters(slot);
        let mut p = PortCounters {
            // The core counted the frames it was handed as received too.
            rx_frames: k.v[c::RX_FRAMES].saturating_sub(core.rx_frames),
            rx_bytes: k.v[c::RX_BYTES].saturating_sub(core.rx_bytes),
            rx_gso: k.v[c::RX_GSO].saturating_sub(core.rx_gso),
            forwarded: k.v[c::FORWARDED],
            flooded: k.v[c::FLOODED],
            learn_refused: k.v[c::LEARN_REFUSED],
            copies: k.v[c::COPIES],
            tx_offered: k.v[c::TX_OFFERED],
            tx_frames: k.v[c::TX_FRAMES],
            tx_bytes: k.v[c::TX_BYTES],
            tx_gso: k.v[c::TX_GSO],
            ..PortCounters::default()
        };
        for (i, cause) in sluice_switch::DropCause::ALL.iter().enumerate() {
            p.rx_drops.add_n(*cause, k.v[c::RX_DROP + i]);
            p.tx_drops.add_n(*cause, k.v[c::TX_DROP + i]);
        }
        Some(p)
    }

    /// Zeroes the kernel's counters.
    pub fn reset_counters(&mut self) {
        for &slot in self.slot_of.values() {
            let _ = self.dp.reset_counters(slot);
        }
    }

    /// Detaches everything, removes the pins and the upcall TAP: nothing is left.
    pub fn stop(self) {
        info!(switch = %self.switch, upcall = %self.upcall_name, "kernel datapath removed");
        // (Dropping does it.)
    }
}

impl Drop for KernelSide {
    /// Unless left for the next run, removes everything: a daemon that fails after loading
    /// the datapath leaves nothing behind.
    fn drop(&mut self) {
        if self.keep {
            return;
        }
        let _ = tun::set_persist(self.upcall.as_raw_fd(), false);
        let lock = BpfLock::take();
        sluice_ebpf::remove_pins(&pin_dir(&self.switch));
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
    m.flooded += k.v[c::FLOODED];
    m.learn_refused += k.v[c::LEARN_REFUSED];
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_go_lowest_first_after_a_rest_and_bound_what_a_flood_looks_at() {
        let t0 = Instant::now();
        let mut port_at: Vec<Option<PortId>> = vec![None; 8];
        let mut freed_at: Vec<Option<Instant>> = vec![None; 8];
        for id in 0..3 {
            let s = pick_slot(&port_at, &freed_at, t0).unwrap();
            port_at[s] = Some(id);
        }
        assert_eq!(port_at[..3], [Some(0), Some(1), Some(2)]);
        // Port 1 leaves: its slot rests; the next port gets slot 3, not 1.
        port_at[1] = None;
        freed_at[1] = Some(t0);
        assert_eq!(pick_slot(&port_at, &freed_at, t0), Some(3));
        // A minute later slot 1 is the lowest rested slot again.
        let later = t0 + SLOT_QUARANTINE;
        assert_eq!(pick_slot(&port_at, &freed_at, later), Some(1));
        // Churning faster than the rest: the slot that left longest ago.
        for (s, p) in port_at.iter_mut().enumerate() {
            if p.is_none() {
                *p = Some(9);
                freed_at[s] = None;
            }
        }
        port_at[5] = None;
        freed_at[5] = Some(t0 + Duration::from_secs(2));
        port_at[6] = None;
        freed_at[6] = Some(t0 + Duration::from_secs(1));
        assert_eq!(pick_slot(&port_at, &freed_at, t0 + Duration::from_secs(3)), Some(6));
        assert_eq!(slots_in_use(&port_at), 8);
        port_at.iter_mut().skip(3).for_each(|p| *p = None);
        assert_eq!(slots_in_use(&port_at), 3);
        port_at.iter_mut().for_each(|p| *p = Some(1));
        assert_eq!(pick_slot(&port_at, &freed_at, later), None, "all in use");
    }
}

//! The daemon's half of the kernel datapath (docs/architecture.md, "The kernel datapath",
//! "One brain"): it keeps the executor's tables equal to the core's state (inputs,
//! stations, locks, owners, neighbours, the generation), reads the frames the kernel hands
//! up, gives them to the core and installs the core's verdict on each, hands the stations
//! the kernel heard behind tunnels to the core, refreshes the core's MAC ages from the
//! kernel's stamps, and merges the kernel's counters into the switch's. It decides
//! nothing: every verdict is the core's, converted by `sluice_ebpf::convert`.
//!
//! Every core port gets a slot (a port in user space too: a key names the port a station
//! is behind by it, and a verdict with an output to a port the kernel cannot reach goes
//! up). Slots, not the core's port ids, are what the kernel's tables hold; a port keeps its
//! slot while attached.

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use sluice_ebpf::abi;
use sluice_ebpf::convert::{self, Device, Place, Reach, TunnelOut};
use sluice_ebpf::exec::{Executor, Sizes, UpcallBudget, UpcallTags};
use sluice_switch::tunnel::VniMap;
use sluice_switch::{FastChange, Mode, PortCounters, PortId, Switch};
use sluice_wire::MacAddr;
use tracing::{info, warn};

use sluice_api::proto::{KernelPortStats, KernelSummary};
use sluice_ports::vxlan::{Heard, KernelTunnel};
use sluice_sys::error::{Context, Failure, Report};
use sluice_sys::{link, tun};

use crate::error::{Error, Result};

/// The TTL (hop limit) of the datagrams the kernel's tunnels send, as Linux's vxlan
/// default route hop limit gives them.
const TUNNEL_TTL: u8 = 64;

/// A slot held for a port of an earlier run not attached again yet.
const RESERVED: PortId = PortId::MAX;

/// Verdicts the kernel caches (an LRU table: the least used go when it is full, and miss
/// again). About 750 bytes of kernel memory each.
const VERDICTS: u32 = 65_536;

/// Reports of stations heard behind tunnels handed to the core at once, at most.
const HEARD_BATCH: usize = 256;

/// How long a port slot rests after its port left before another port gets it.
const SLOT_QUARANTINE: Duration = Duration::from_secs(60);

/// The environment variable through which a daemon restarting in place hands the upcall
/// TAP's descriptor to the next (so the frames queued in it survive the `exec`).
pub const UPCALL_FD_ENV: &str = "SLUICE_UPCALL_FD";

/// Where the kernel datapath's pins live: a bpffs of sluice's own.
pub fn pin_dir(switch: &str) -> PathBuf {
    sluice_sys::paths::run_dir().join("bpf").join(switch)
}

/// Holds the lock that orders the switches of this runtime directory around the bpffs
/// they share: it is mounted by the first to start and unmounted by the last to stop.
struct BpfLock {
    _file: std::fs::File,
}

impl BpfLock {
    fn take() -> Result<BpfLock> {
        let path = sluice_sys::paths::run_dir().join(".bpf.lock");
        if let Some(d) = path.parent() {
            std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
        }
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        // Released when the file closes.
        if let Err(e) = sluice_sys::proc::lock_exclusive(&f) {
            return Err(Failure::new(format!("locking {}", path.display()), e).into());
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
        unmount_if_unused(&sluice_sys::paths::run_dir().join("bpf"));
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

/// A tunnel port as the kernel side knows it.
struct TunnelSide {
    /// Its VXLAN device.
    ifindex: u32,
    /// Its underlay is IPv6.
    v6: bool,
    /// Which VNI carries which frames.
    vnis: VniMap,
    /// Where the stations the kernel keeps hearing go, once a second.
    heard: std::sync::mpsc::Sender<Heard>,
    /// The endpoints written in `sluice_endpoints` (the core's
    /// [`Switch::tunnel_endpoints`]).
    endpoints: Vec<std::net::IpAddr>,
    /// Each VNI's flood set as written in `sluice_flood_eps` (none: floods of that VNI go
    /// up).
    floods: HashMap<u32, Vec<std::net::IpAddr>>,
}

/// The kernel side of one switch.
/// A veth port's shaper (`rate_out`) as installed.
struct Shaped {
    ifname: String,
    rate: u64,
    burst: u64,
    /// The shaper's drops at the last counter reset.
    drops_base: u64,
}

pub struct KernelSide {
    ex: Executor,
    switch: String,
    upcall: OwnedFd,
    upcall_name: String,
    /// /proc/net/dev of the daemon's namespace: the upcall TAP's drop counter.
    upcall_stats: Option<File>,
    slot_of: HashMap<PortId, u32>,
    port_at: Vec<Option<PortId>>,
    /// Interfaces the program is attached to, by port.
    attached: HashMap<PortId, Vec<String>>,
    /// How the kernel sends to each attached port's device.
    reach: HashMap<PortId, Reach>,
    /// The veth ports among them.
    veths: std::collections::HashSet<PortId>,
    /// The device each port is an input by (its `FastPort::target` when written).
    input_of: HashMap<PortId, u32>,
    /// The address each port locks (its `mac`), as written.
    lock_of: HashMap<PortId, MacAddr>,
    /// Veth ports shaped for their `rate_out` (crate::shaper).
    shaped: HashMap<PortId, Shaped>,
    /// Taking over an earlier run: its inputs' slots by interface index, until those ports
    /// are attached again.
    reserved: HashMap<u32, u32>,
    /// This run took over an earlier one's pinned state: the earlier run's verdicts stand
    /// (its generation stays current) until the configured ports are attached again.
    takeover: bool,
    /// Ports whose interface disappeared (reported once).
    gone: std::collections::HashSet<PortId>,
    /// The daemon's clock origin (an `Instant`, which is `CLOCK_MONOTONIC` on Linux, as
    /// the kernel's last-seen stamps are).
    started: Instant,
    /// Frames read from the upcall TAP that could not be given to the core.
    pub upcalls_refused: u64,
    /// Changes of the core the kernel's tables refused.
    map_updates_failed: u64,
    /// A tunnel's routes changed: its flood sets are to be written again.
    floods_due: bool,
    /// Verdicts installed after upcalls.
    installed: u64,
    mode: Mode,
    router_mac: MacAddr,
    upcall_ifindex: u32,
    /// The kernel's generation is this plus the core's: above every generation an earlier
    /// run's verdicts were made in.
    gen_base: u64,
    /// The generation last written.
    generation: u64,
    /// When each free slot's last port left (`None`: never used, or a takeover's). A slot
    /// is not given out again until [`SLOT_QUARANTINE`] has passed, so that a frame still
    /// on its way for the old port (in the upcall TAP's queue, tagged with the slot) cannot
    /// be taken for the new one's; within that, the lowest slot goes first.
    freed_at: Vec<Option<Instant>>,
    /// Left for the next run ([`KernelSide::leave`]): nothing is removed on drop.
    keep: bool,
    /// Tunnel ports.
    tunnels: HashMap<PortId, TunnelSide>,
    /// Security groups: the switch's connections in the kernel's conntrack, until the
    /// core takes it ([`KernelSide::take_tracker`]); `None` on a kernel without the
    /// conntrack kfuncs (the core then tracks every connection).
    tracker: Option<sluice_ebpf::exec::Conntrack>,
    /// The kernel classifies frames for security groups (it tracks connections).
    classifies: bool,
    /// The class set written and in use, and the epoch of the core's classes it holds
    /// (`None`: to be written).
    acl_set: u32,
    acl_epoch: Option<u64>,
    /// Verdicts security-group rules decided (`V_HITS`), by key: the rules, and the
    /// verdict's count already credited to them.
    credited: HashMap<abi::FlowKey, Credited>,
    /// Hits of verdicts replaced, for their rules (at the next [`KernelSide::credit_hits`]).
    uncredited: Vec<(Vec<(String, u32)>, u64)>,
}

/// The rules a verdict the kernel counts hits of was decided by (port name, rule id), and
/// how many of its hits they were given.
struct Credited {
    rules: Vec<(String, u32)>,
    seen: u32,
}

/// The kernel conntrack zone of switch `name`'s connections: one of its own, never the
/// host's (0).
pub fn ct_zone(name: &str) -> u16 {
    (fnv1a(name) % 65_535 + 1) as u16
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

impl KernelSide {
    /// Loads the kernel datapath for switch `name` with tables for the switch's MAC table
    /// size, and opens its upcall TAP. `started` is the daemon's clock origin.
    pub fn start(name: &str, cfg: &sluice_switch::SwitchConfig, started: Instant) -> Result<Self> {
        if !sluice_ebpf::available() {
            return Err(sluice_ebpf::Error::NotBuilt.into());
        }
        // Security groups: whether this kernel takes conntrack kfunc calls from a TC
        // program; if not, the frames security groups judge go through the core.
        let kfuncs = match sluice_ebpf::kfunc::Probe::load() {
            Ok(_) => {
                tracing::debug!("the kernel takes the conntrack kfuncs");
                true
            }
            Err(e) => {
                info!(
                    "the kernel does not take the conntrack kfuncs ({e}); security groups on this switch are decided and tracked by the core"
                );
                false
            }
        };
        let sizes = Sizes { stations: cfg.fib_max.min(u32::MAX as usize) as u32, verdicts: VERDICTS };
        let dir = pin_dir(name);
        let lock = BpfLock::take()?;
        sluice_ebpf::ensure_bpffs(&sluice_sys::paths::run_dir().join("bpf"))?;
        // What an earlier run of this switch left pinned (a crash, `sluice switch restart`)
        // is taken over, so forwarding never stops; unless its layout is another build's.
        let takeover = match sluice_ebpf::pins_compatible(&dir, sizes) {
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
        let mut ex = Executor::open(&dir, sizes)?;
        drop(lock);
        // The slots the earlier run gave its inputs, by interface: the same interface gets
        // the same slot again, so the stations and verdicts naming it stay right. Slots the
        // earlier run's stations name are held too (ports in user space).
        let mut reserved = HashMap::new();
        let mut port_at = vec![None; abi::MAX_PORTS as usize];
        let mut gen_base = 1;
        if takeover {
            for (ifindex, input) in ex.inputs() {
                reserved.insert(ifindex, input.slot);
                if let Some(p) = port_at.get_mut(input.slot as usize) {
                    *p = Some(RESERVED);
                }
            }
            for (_, _, st) in ex.stations() {
                if let Some(p) = port_at.get_mut(st.slot as usize) {
                    *p = Some(RESERVED);
                }
            }
            gen_base = ex.config().generation + 1;
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
        ex.set_upcall_budget(UpcallBudget::DEFAULT)?;
        let generation = if takeover { ex.config().generation } else { gen_base };
        ex.configure(generation, ifindex)?;
        let acl_set = ex.config().acl_set;
        let tracker = if kfuncs {
            let zone = ct_zone(name);
            ex.set_conntrack(zone, sluice_switch::conntrack::kernel_timeouts_ms())?;
            info!(switch = %name, zone, "security groups track connections in the kernel's conntrack (`conntrack -L -w {zone}` lists them)");
            Some(ex.conntrack()?)
        } else {
            None
        };
        // Only the program's upcalls into the TAP's queue: anyone in this namespace can bind
        // a socket to the TAP and send through it (SO_BINDTODEVICE needs no privilege), and
        // such frames would fill the queue the upcalls wait in. (Taken over in place, as the
        // ports' links are, after a restart.)
        ex.attach_egress(&upcall_name)
            .with_context(|| format!("guarding the upcall TAP {upcall_name} against frames not the switch's"))?;
        info!(switch = %name, upcall = %upcall_name, pins = %dir.display(), "kernel datapath loaded");
        Ok(KernelSide {
            ex,
            switch: name.to_string(),
            upcall: tap.fd,
            upcall_stats: tap.stats,
            upcall_name,
            slot_of: HashMap::new(),
            port_at,
            attached: HashMap::new(),
            reach: HashMap::new(),
            veths: Default::default(),
            input_of: HashMap::new(),
            lock_of: HashMap::new(),
            shaped: HashMap::new(),
            reserved,
            takeover,
            gone: Default::default(),
            started,
            upcalls_refused: 0,
            map_updates_failed: 0,
            floods_due: false,
            installed: 0,
            mode: cfg.mode,
            router_mac: cfg.router_mac,
            upcall_ifindex: ifindex,
            gen_base,
            generation,
            freed_at: vec![None; abi::MAX_PORTS as usize],
            keep: false,
            tunnels: HashMap::new(),
            classifies: tracker.is_some(),
            tracker,
            acl_set,
            acl_epoch: None,
            credited: HashMap::new(),
            uncredited: Vec::new(),
        })
    }

    /// The kernel conntrack zone the switch's TCP and UDP connections are in, when the
    /// kernel tracks them.
    pub fn conntrack_zone(&self) -> Option<u16> {
        self.classifies.then(|| self.ex.config().ct_zone)
    }

    /// The switch's connections in the kernel's conntrack, for the core
    /// ([`Switch::set_kernel_tracker`]); `None` after the first call, or on a kernel
    /// without the conntrack kfuncs.
    pub fn take_tracker(&mut self) -> Option<sluice_ebpf::exec::Conntrack> {
        self.tracker.take()
    }

    /// The upcall TAP's descriptor, for the event loop.
    pub fn upcall_fd(&self) -> RawFd {
        self.upcall.as_raw_fd()
    }

    /// The descriptor that is readable when the kernel reported stations heard behind
    /// tunnels ([`KernelSide::read_heard`]), for the event loop.
    pub fn heard_fd(&self) -> RawFd {
        self.ex.heard_fd()
    }

    /// Attaches the executor to port `id`'s interfaces `ifnames` (a veth's one; an uplink's
    /// devices, its backups with it; a tunnel's VXLAN device). A veth — the switch's end of
    /// a guest's pair — also gets the egress guard, which lets only the switch's own frames
    /// into the guest; only a veth is watched for disappearing.
    pub fn attach(&mut self, id: PortId, ifnames: &[String], veth: bool) -> Result<()> {
        for (i, ifname) in ifnames.iter().enumerate() {
            let r = self.ex.attach(ifname).and_then(|()| if veth { self.ex.attach_egress(ifname) } else { Ok(()) });
            if let Err(e) = r {
                for done in &ifnames[..=i] {
                    self.ex.detach(done);
                }
                return Err(e.into());
            }
        }
        let reach = if self.tunnels.contains_key(&id) {
            Reach::Tunnel
        } else if !veth {
            Reach::Uplink
        } else {
            // A veth whose peer is in the switch's own namespace cannot be reached with
            // `bpf_redirect_peer`.
            let here = ifnames.first().and_then(|n| link::ifindex(n).ok()).is_some_and(link::veth_peer_here);
            if here { Reach::Veth } else { Reach::Guest }
        };
        self.reach.insert(id, reach);
        self.attached.insert(id, ifnames.to_vec());
        if veth {
            self.veths.insert(id);
        }
        Ok(())
    }

    /// Makes port `id` (not attached yet) a tunnel through kernel device `t`: its settings
    /// and endpoints in the kernel's tables (the remote table starts empty).
    pub fn add_tunnel(&mut self, id: PortId, t: &KernelTunnel) -> Result<()> {
        self.ex.clear_tunnel(t.ifindex);
        self.ex.set_tunnel(t.ifindex, &convert::tunnel(t.local, TUNNEL_TTL))?;
        for &r in &t.remotes {
            self.ex.set_endpoint(t.ifindex, r)?;
        }
        let side = TunnelSide {
            ifindex: t.ifindex,
            v6: t.local.is_ipv6(),
            vnis: t.vnis.clone(),
            heard: t.heard.clone(),
            endpoints: t.remotes.clone(),
            floods: HashMap::new(),
        };
        self.tunnels.insert(id, side);
        Ok(())
    }

    /// Detaches the programs from port `id`'s interfaces, if they were attached.
    pub fn detach(&mut self, id: PortId) {
        if let Some(t) = self.tunnels.remove(&id) {
            self.ex.clear_tunnel(t.ifindex);
        }
        self.gone.remove(&id);
        self.veths.remove(&id);
        self.reach.remove(&id);
        for ifname in self.attached.remove(&id).unwrap_or_default() {
            self.ex.detach(&ifname);
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

    /// How the kernel reaches port `id` of `sw`: its slot, and its device unless frames to
    /// it must go through the core (a port in user space, failed, or whose frames all pass
    /// the core).
    fn place(&self, sw: &Switch, id: PortId) -> Option<Place> {
        let slot = u16::try_from(*self.slot_of.get(&id)?).ok()?;
        let device = sw
            .fast_port(id)
            .filter(|p| !p.slow && !p.failed)
            .and_then(|p| p.target)
            .and_then(|ifindex| Some(Device { ifindex, reach: *self.reach.get(&id)? }));
        Some(Place { slot, device })
    }

    /// How a frame leaves by tunnel port `id` with the tag the core gives it.
    fn tunnel_out(&self, id: PortId, tag: Option<u16>) -> Option<TunnelOut> {
        let t = self.tunnels.get(&id)?;
        match &t.vnis {
            VniMap::Single(vni) => Some(TunnelOut { vni: *vni, tagged: true }),
            m @ VniMap::PerVlan(_) => Some(TunnelOut { vni: m.vni_of(tag.map(|v| v & 0x0fff))?, tagged: false }),
        }
    }

    /// Ends a takeover once the configured ports are attached again: the core learns the
    /// stations, address owners and neighbours the kernel kept (those of ports still
    /// here), then every kernel entry is rewritten from the core's answer — what belonged
    /// to ports that are gone, or to a configuration that changed (a static entry), goes.
    /// Links of interfaces no port took again are removed. Counters start from zero, as
    /// the core's do; the core's generation becomes current, so every earlier verdict
    /// misses once and the core installs its own.
    pub fn finish_takeover(&mut self, sw: &mut Switch, now_ms: u64) {
        if !self.takeover {
            return;
        }
        self.takeover = false;
        let mut learned = 0;
        let live = |port_at: &[Option<PortId>], slot: u32| {
            port_at.get(slot as usize).copied().flatten().filter(|&id| id != RESERVED)
        };
        let stations = self.ex.stations();
        for (vlan, mac, st) in &stations {
            if let Some(id) = live(&self.port_at, st.slot)
                && st.flags & abi::FIB_STATIC == 0
            {
                sw.adopt_mac(*vlan, *mac, id, now_ms);
                learned += 1;
            }
        }
        for (vlan, mac, _) in stations {
            let to = sw.fast_mac(vlan, mac).and_then(|e| Some((*self.slot_of.get(&e.port)?, e.is_static)));
            match to {
                Some((slot, is_static)) => {
                    let _ = self.ex.set_station(vlan, mac, slot, is_static);
                }
                None => self.ex.remove_station(vlan, mac),
            }
        }
        let owners = self.ex.owners();
        for &(ip, slot) in &owners {
            if let Some(id) = live(&self.port_at, slot) {
                sw.adopt_owner(ip, id);
            }
        }
        for (ip, _) in owners {
            match sw.fast_owner(ip).and_then(|id| self.slot_of.get(&id).copied()) {
                Some(slot) => {
                    let _ = self.ex.set_owner(ip, slot);
                }
                None => self.ex.remove_owner(ip),
            }
        }
        let neighbours = self.ex.neighbours();
        for &(vlan, ip, mac) in &neighbours {
            sw.adopt_neighbour(vlan, ip, mac, now_ms);
        }
        for (vlan, ip, _) in neighbours {
            match sw.fast_neighbour(vlan, ip) {
                Some(mac) => {
                    let _ = self.ex.set_neighbour(vlan, ip, mac);
                }
                None => self.ex.remove_neighbour(vlan, ip),
            }
        }
        for (&ifindex, _) in self.reserved.iter() {
            self.ex.clear_input(ifindex);
        }
        self.reserved.clear();
        for slot in 0..abi::MAX_PORTS {
            if self.port_at[slot as usize] == Some(RESERVED) {
                self.port_at[slot as usize] = None;
                self.freed_at[slot as usize] = Some(Instant::now());
            }
        }
        let attached: std::collections::HashSet<&String> = self.attached.values().flatten().collect();
        for ifname in self.ex.linked() {
            if !attached.contains(&ifname) && ifname != self.upcall_name {
                info!(switch = %self.switch, interface = %ifname, "no port took interface {ifname} again; the kernel datapath leaves it");
                self.ex.detach(&ifname);
            }
        }
        for slot in 0..abi::MAX_PORTS {
            let _ = self.ex.reset_counters(slot);
        }
        let _ = self.ex.reset_switch_counters();
        self.follow_generation(sw);
        info!(switch = %self.switch, stations = learned, "took over the kernel datapath");
    }

    /// Lets go of the kernel datapath without removing it: programs keep forwarding and
    /// what goes up waits in the persistent upcall TAP until a new run takes over. Returns
    /// a descriptor of the upcall TAP that survives `exec` (for a restart in place: while
    /// a descriptor is open the TAP keeps its queue), if one could be made.
    pub fn leave(mut self) -> Option<RawFd> {
        self.keep = true;
        info!(switch = %self.switch, pins = %pin_dir(&self.switch).display(), "kernel datapath left forwarding for the next run to take over");
        // The copy is handed to the next program image, which owns it from then on.
        let fd = sluice_sys::proc::dup_inheritable(&self.upcall).ok()?;
        Some(std::os::fd::IntoRawFd::into_raw_fd(fd))
    }

    /// The kernel datapath's own figures.
    pub fn summary(&self) -> KernelSummary {
        let queue_drops = self.upcall_stats.as_ref().and_then(|f| {
            use std::os::unix::fs::FileExt;
            let mut buf = vec![0u8; 65536];
            let n = f.read_at(&mut buf, 0).ok()?;
            let text = std::str::from_utf8(&buf[..n]).ok()?;
            sluice_ports::tap::parse_proc_net_dev(text, &self.upcall_name).map(|d| d.from_guest)
        });
        KernelSummary {
            upcall_device: self.upcall_name.clone(),
            upcall_queue_drops: queue_drops,
            upcall_egress_refused: self.ex.switch_counters().v[abi::s::UPCALL_EGRESS_REFUSED],
            upcalls_refused: self.upcalls_refused,
            map_updates_failed: self.map_updates_failed,
        }
    }

    /// Writes the core's generation, if it moved (not while an earlier run's verdicts
    /// stand, during a takeover) — with the security groups' classes, if they changed: a
    /// new class set beside the one in use, switched to with the generation in one write.
    fn follow_generation(&mut self, sw: &mut Switch) {
        if self.takeover {
            return;
        }
        let g = self.gen_base + sw.generation();
        let (acl, epoch) = sw.acl_classes();
        let new_set = (self.classifies && self.acl_epoch != Some(epoch)).then(|| self.acl_set.wrapping_add(1).max(1));
        if g == self.generation && new_set.is_none() {
            return;
        }
        if let Some(set) = new_set {
            let addrs = acl.address_classes().map(|(c, p)| (c, p.addr, p.len));
            let ports = acl.port_classes().filter(|&(c, _, _)| c != 0);
            if let Err(e) = self.ex.write_acl_set(set, addrs, ports) {
                // A set half written would classify frames unlike the core: the kernel
                // stops classifying, and every frame security groups decide goes up.
                self.map_updates_failed += 1;
                self.ex.remove_acl_sets_but(self.acl_set);
                self.classifies = false;
                sw.set_kernel_tracker(None);
                tracing::error!(switch = %self.switch, "kernel datapath: writing the security groups' classes: {e:#}; frames they decide go through the core from now on (its own connection tracking: connections the kernel remembered are judged by the rules again)");
                return self.follow_generation(sw);
            }
        }
        let r = match new_set {
            Some(set) => self.ex.use_acl_set(g, set),
            None => self.ex.configure(g, self.upcall_ifindex),
        };
        match r {
            Ok(()) => {
                self.generation = g;
                if let Some(set) = new_set {
                    self.acl_set = set;
                    self.acl_epoch = Some(epoch);
                    self.ex.remove_acl_sets_but(set);
                }
            }
            Err(e) => {
                self.map_updates_failed += 1;
                warn!(switch = %self.switch, "kernel datapath: {e:#}; its verdicts stay those of the rules before");
            }
        }
    }

    /// Writes into the kernel's tables every change the core reports, then its generation.
    pub fn sync(&mut self, sw: &mut Switch) {
        let mut changes = Vec::new();
        sw.take_fastpath_changes(|c| changes.push(c));
        for c in changes {
            let r = match c {
                FastChange::Owner(ip) => match sw.fast_owner(ip).and_then(|id| self.slot_of.get(&id).copied()) {
                    Some(slot) => self.ex.set_owner(ip, slot).map_err(Error::from),
                    None => {
                        self.ex.remove_owner(ip);
                        Ok(())
                    }
                },
                FastChange::Neighbour(vlan, ip) => match sw.fast_neighbour(vlan, ip) {
                    Some(mac) => self.ex.set_neighbour(vlan, ip, mac).map_err(Error::from),
                    None => {
                        self.ex.remove_neighbour(vlan, ip);
                        Ok(())
                    }
                },
                FastChange::Port(id) if self.tunnels.contains_key(&id) => {
                    self.floods_due = true;
                    self.sync_port(sw, id).and_then(|()| self.sync_endpoints(sw, id))
                }
                FastChange::Port(id) => self.sync_port(sw, id),
                FastChange::Remote(id, vni, mac) => match self.tunnels.get(&id) {
                    Some(t) => match sw.fast_remote(id, vni, mac) {
                        Some(ep) => self.ex.set_remote(t.ifindex, vni, mac, ep).map_err(Error::from),
                        None => {
                            self.ex.forget_remote(t.ifindex, vni, mac);
                            Ok(())
                        }
                    },
                    None => Ok(()),
                },
                FastChange::Group(vlan, ip) => {
                    self.ex.set_group(vlan, ip, sw.fast_group(vlan, ip)).map_err(Error::from)
                }
                FastChange::Mac(vlan, mac) => {
                    let entry = sw.fast_mac(vlan, mac).and_then(|m| {
                        let e = convert::station(&m, |p| self.place(sw, p))?;
                        Some((e.slot, m.is_static))
                    });
                    match entry {
                        Some((slot, is_static)) => self.ex.set_station(vlan, mac, slot, is_static).map_err(Error::from),
                        None => {
                            // (A port with no slot: frames to it must go up, not to the
                            // entry's old port.)
                            self.ex.remove_station(vlan, mac);
                            Ok(())
                        }
                    }
                }
            };
            if let Err(e) = r {
                self.map_updates_failed += 1;
                warn!(switch = %self.switch, "kernel datapath: {}; the frames it concerns go through user space", Report(&e));
            }
        }
        if std::mem::take(&mut self.floods_due) {
            self.sync_floods(sw);
        }
        self.follow_generation(sw);
    }

    /// Keeps each tunnel VNI's flood set in the kernel the core's tunnel port's
    /// ([`Switch::tunnel_floods`]: its configured endpoints, an EVPN tunnel's flood list,
    /// endpoints heard from): the kernel replicates a flood to exactly those. A set the
    /// kernel cannot hold (none, or more than `MAX_FLOOD_EPS`) is taken out: floods of that
    /// VNI go up, and the port sends them. Called when a tunnel's routes change, when the
    /// core learned a station behind one (and so perhaps an endpoint), and once a second
    /// (heard endpoints age).
    fn sync_floods(&mut self, sw: &Switch) {
        for (&id, t) in self.tunnels.iter_mut() {
            let vnis: Vec<(u16, u32)> = match &t.vnis {
                VniMap::Single(vni) => vec![(0, *vni)],
                VniMap::PerVlan(m) => m.clone(),
            };
            for (vlan, vni) in vnis {
                let want = sw.tunnel_floods(id, vlan).filter(|v| convert::flood_eps(v).is_some()).unwrap_or_default();
                if t.floods.get(&vni).map_or(want.is_empty(), |had| *had == want) {
                    continue;
                }
                let eps = convert::flood_eps(&want);
                match self.ex.set_flood(t.ifindex, vni, eps.as_ref()) {
                    Ok(()) if want.is_empty() => {
                        t.floods.remove(&vni);
                    }
                    Ok(()) => {
                        t.floods.insert(vni, want);
                    }
                    Err(e) => {
                        // (Taken out, so that floods go up rather than to an old set.)
                        self.ex.set_flood(t.ifindex, vni, None).ok();
                        t.floods.remove(&vni);
                        self.map_updates_failed += 1;
                        warn!(switch = %self.switch, "kernel datapath: {e:#}; floods into the tunnel go through user space");
                    }
                }
            }
        }
    }

    /// Keeps tunnel port `id`'s endpoints in the kernel (`sluice_endpoints`: a datagram
    /// from one is its endpoint's in stage 1's key) the core's: the configured ones and, on
    /// an EVPN tunnel, those its routes name.
    fn sync_endpoints(&mut self, sw: &Switch, id: PortId) -> Result<()> {
        let Some(t) = self.tunnels.get_mut(&id) else { return Ok(()) };
        let want = sw.tunnel_endpoints(id);
        for gone in t.endpoints.iter().filter(|a| !want.contains(a)) {
            self.ex.remove_endpoint(t.ifindex, *gone);
        }
        t.endpoints.retain(|a| want.contains(a));
        for &new in &want {
            if !t.endpoints.contains(&new) {
                self.ex.set_endpoint(t.ifindex, new)?;
                t.endpoints.push(new);
            }
        }
        Ok(())
    }

    /// Writes port `id`'s input entry and lock as the core has them now, or frees its slot
    /// when it is gone.
    fn sync_port(&mut self, sw: &Switch, id: PortId) -> Result<()> {
        let Some(p) = sw.fast_port(id) else {
            if let Some(slot) = self.slot_of.remove(&id) {
                self.port_at[slot as usize] = None;
                self.freed_at[slot as usize] = Some(Instant::now());
                let _ = self.ex.reset_counters(slot);
            }
            if let Some(ifindex) = self.input_of.remove(&id) {
                self.ex.clear_input(ifindex);
            }
            if let Some(mac) = self.lock_of.remove(&id) {
                self.ex.set_lock(mac, None)?;
            }
            if let Some(s) = self.shaped.remove(&id) {
                crate::shaper::remove(&s.ifname);
            }
            return Ok(());
        };
        let Some(slot) = self.slot(id, p.target) else {
            sluice_sys::bail!("no free port slot (the kernel datapath holds {})", abi::MAX_PORTS)
        };
        let slot = slot as u16;
        if let Some(old) = self.input_of.get(&id).copied()
            && Some(old) != p.target
        {
            self.ex.clear_input(old);
            self.input_of.remove(&id);
        }
        if let Some(ifindex) = p.target {
            let mut e = convert::input(&p, slot, self.mode, self.router_mac);
            if let Some(t) = self.tunnels.get(&id) {
                e = convert::tunnel_input(e, t.v6);
            }
            self.ex.set_input(ifindex, &e)?;
            self.input_of.insert(id, ifindex);
        }
        for (kind, m) in convert::meters(&p) {
            self.ex.set_meter(slot, kind, m)?;
        }
        self.shape(id, &p)?;
        let lock = convert::lock(&p, slot);
        let want = lock.map(|(k, _)| MacAddr(k.mac));
        if let Some(old) = self.lock_of.get(&id).copied()
            && Some(old) != want
        {
            self.ex.set_lock(old, None)?;
            self.lock_of.remove(&id);
        }
        if let Some((k, s)) = lock {
            self.ex.set_lock(MacAddr(k.mac), Some(s))?;
            self.lock_of.insert(id, MacAddr(k.mac));
        }
        Ok(())
    }

    /// Installs the core's verdict on the frame it just decided (its last decision), for
    /// the kernel to execute on every frame with the same key: stage 1's and, for a frame
    /// admitted, stage 2's, made in the generation now written.
    fn install_last(&mut self, sw: &Switch) {
        if self.takeover {
            return;
        }
        let Some((key, v)) = sw.last_decision() else { return };
        let (Some(p), Some(&slot)) = (sw.fast_port(key.port), self.slot_of.get(&key.port)) else { return };
        if p.target.is_none() {
            return;
        }
        let slot = slot as u16;
        let g = self.generation;
        let ak = convert::admit_key(key, slot);
        let a = convert::admit(v, sw.stage1(key), &p, self.mode, g);
        let mut r = self.ex.install_admit(&ak, &a);
        if r.is_ok()
            && a.action == abi::ACT_FORWARD
            && let Some(fk) = convert::flow_key(key, a.vlan, |q| self.place(sw, q))
        {
            let e =
                convert::verdict(key, v, g, sw.admits(key), |q| self.place(sw, q), |q, tag| self.tunnel_out(q, tag));
            // (What the verdict this one replaces counted is its rules', credited later.)
            if let Some(c) = self.credited.remove(&fk) {
                let n = self.ex.verdict(&fk).map_or(0, |old| old.hits.wrapping_sub(c.seen));
                self.uncredited.push((c.rules, u64::from(n)));
            }
            r = self.ex.install(&fk, &e);
            if r.is_ok() && e.flags & abi::V_HITS != 0 {
                self.credited.insert(fk, Credited { rules: sw.acl_rule_ids(&v.acl.hits), seen: 0 });
            }
        }
        match r {
            Ok(()) => self.installed += 1,
            Err(e) => {
                self.map_updates_failed += 1;
                warn!(switch = %self.switch, "kernel datapath: {e:#}; frames with this key keep going through user space");
            }
        }
    }

    /// Security groups: credits the rules with the hits the kernel counted on their
    /// verdicts since the last call (verdicts of an older generation are forgotten once
    /// credited).
    pub fn credit_hits(&mut self, sw: &mut Switch) {
        for (rules, n) in self.uncredited.drain(..) {
            for (port, id) in &rules {
                sw.acl_credit(port, *id, n);
            }
        }
        let generation = self.generation;
        let ex = &self.ex;
        self.credited.retain(|k, c| {
            let v = ex.verdict(k);
            let hits = v.map_or(c.seen, |v| v.hits);
            let n = u64::from(hits.wrapping_sub(c.seen));
            if n > 0 {
                for (port, id) in &c.rules {
                    sw.acl_credit(port, *id, n);
                }
            }
            c.seen = hits;
            v.is_some_and(|v| v.generation == generation && v.flags & abi::V_HITS != 0)
        });
    }

    /// Gives the core every frame waiting in the upcall TAP, at most `limit`, and installs
    /// its verdict on each; returns how many were read (frames that could not be given
    /// are counted in `upcalls_refused`).
    pub fn read_upcalls(&mut self, sw: &mut Switch, now_ms: u64, limit: usize) -> usize {
        let fd = self.upcall.as_raw_fd();
        let mut n = 0;
        while n < limit {
            let mut read = false;
            let mut bad = false;
            let port_at = &self.port_at;
            let took = sw.ingest_from(now_ms, |buf| match tun::read_upcall(fd, buf) {
                Ok(Some((len, tpid, tci))) => {
                    read = true;
                    let frame = upcalled(buf, len, tpid, tci, port_at);
                    bad = frame.is_none();
                    frame
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
                continue;
            }
            // (A frame from a tunnel may have taught its port an endpoint, which the
            // tunnel's floods then go to as well.)
            if sw.last_decision().is_some_and(|(k, _)| self.tunnels.contains_key(&k.port)) {
                self.floods_due = true;
            }
            self.sync(sw);
            self.install_last(sw);
        }
        n
    }

    /// Hands the core the stations the kernel reported heard behind tunnels; what it
    /// learns goes into the kernel's remote table.
    pub fn read_heard(&mut self, sw: &mut Switch) {
        let port_at = &self.port_at;
        let port_of = |slot: u32| port_at.get(slot as usize).copied().flatten().filter(|&id| id != RESERVED);
        let (_, learned) = sluice_ebpf::heard::hand_to_core(&mut self.ex, sw, port_of, HEARD_BATCH);
        // (A station learned behind a tunnel may be its first from that endpoint, which
        // the tunnel's floods then go to as well.)
        if learned > 0 {
            self.sync_floods(sw);
        }
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

    /// Tells the core which stations the kernel forwarded from lately, so they do not age
    /// out while their traffic never reaches user space; and each tunnel port where the
    /// kernel keeps hearing its stations (those silent past the aging time are forgotten:
    /// frames to them go up, and to every endpoint, until heard again).
    pub fn refresh_ages(&mut self, sw: &mut Switch) {
        let now_ms = self.started.elapsed().as_millis() as u64;
        let now_ns = sluice_ebpf::exec::monotonic_ns();
        for (vlan, mac, st) in self.ex.stations() {
            if st.seen_ns == 0 {
                continue;
            }
            let Some(Some(id)) = self.port_at.get(st.slot as usize) else { continue };
            if *id == RESERVED {
                continue;
            }
            let ago_ms = now_ns.saturating_sub(st.seen_ns) / 1_000_000;
            sw.touch_mac(vlan, mac, *id, now_ms.saturating_sub(ago_ms));
        }
        let aging_ns = sluice_ports::vxlan::AGING_MS * 1_000_000;
        for (id, t) in &self.tunnels {
            // (An EVPN tunnel's stations are its routes': they go when they are withdrawn.)
            let routed = sw.fast_port(*id).is_some_and(|p| p.routed);
            let mut stations = self.ex.remotes(t.ifindex, t.v6);
            stations.retain(|&(vni, mac, _, seen_ns)| {
                let fresh = routed || now_ns.saturating_sub(seen_ns) < aging_ns;
                if !fresh {
                    self.ex.forget_remote(t.ifindex, vni, mac);
                }
                fresh
            });
            let refused = self.slot_of.get(id).map_or(0, |&s| self.ex.counters(s).v[abi::c::TUN_BAD]);
            let _ = t.heard.send(Heard { stations, now_ns, refused });
        }
        self.sync_floods(sw);
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
        let k = self.ex.counters(slot);
        let (m, upcall) = merge(core, &k);
        let own = KernelPortStats {
            forwarded: k.v[abi::c::FORWARDED],
            flooded: k.v[abi::c::FLOODED],
            upcalls: k.v[abi::c::UPCALLS],
            misses: k.v[abi::c::MISSES],
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
        let k = self.ex.counters(slot);
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
        if let Some(s) = self.shaped.get(&id) {
            // The shaper's drops were sent into its queue, counted sent: they are the
            // port's transmitted frames dropped `rate_limit`.
            let d = crate::shaper::drops(&s.ifname).unwrap_or(0).saturating_sub(s.drops_base).min(p.tx_frames);
            p.tx_frames -= d;
            p.tx_drops.add_n(sluice_switch::DropCause::RateLimit, d);
        }
        Some(p)
    }

    /// Zeroes the kernel's counters.
    pub fn reset_counters(&mut self) {
        for &slot in self.slot_of.values() {
            let _ = self.ex.reset_counters(slot);
        }
        for s in self.shaped.values_mut() {
            s.drops_base = crate::shaper::drops(&s.ifname).unwrap_or(0);
        }
    }

    /// `rate_out`: a guest's veth (not an uplink: its device is the host's too) with a
    /// rate gets a TBF root qdisc its paced outputs pass; one without loses it.
    fn shape(&mut self, id: PortId, p: &sluice_switch::FastPort) -> Result<()> {
        let ifname = p
            .target
            .filter(|_| !p.uplink)
            .and_then(link::name_of)
            .filter(|n| link::driver(n).is_ok_and(|d| d == "veth"));
        let want = ifname.zip((p.rate.rate_out > 0).then(|| (p.rate.rate_out, p.rate.burst_of(p.rate.rate_out))));
        let have = self.shaped.get(&id).map(|s| (s.ifname.clone(), (s.rate, s.burst)));
        if want == have {
            return Ok(());
        }
        if let Some(s) = self.shaped.remove(&id) {
            crate::shaper::remove(&s.ifname);
        }
        if let Some((ifname, (rate, burst))) = want {
            crate::shaper::install(&ifname, rate, burst)?;
            info!(switch = %self.switch, port = %ifname, rate, burst, "rate_out: TBF installed");
            self.shaped.insert(id, Shaped { ifname, rate, burst, drops_base: 0 });
        }
        Ok(())
    }

    /// Detaches everything, removes the pins and the upcall TAP: nothing is left.
    pub fn stop(self) {
        for s in self.shaped.values() {
            crate::shaper::remove(&s.ifname);
        }
        info!(switch = %self.switch, upcall = %self.upcall_name, installed = self.installed, "kernel datapath removed");
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
        unmount_if_unused(&sluice_sys::paths::run_dir().join("bpf"));
        drop(lock);
    }
}

/// The frame of an upcall as `read_upcall` left it in `buf` (`len` bytes after the virtio
/// header, the outer tag `tpid`/`tci` taken out), made what the core reads: the port its
/// slot is (`None`: not an upcall of a port here), the origin's tags of a tunnel's frame
/// taken out, the virtio header moved back by what was taken. Returns the port, the
/// frame's length and the tunnel origin.
fn upcalled(
    buf: &mut [u8],
    len: usize,
    tpid: u16,
    tci: u16,
    port_at: &[Option<PortId>],
) -> Option<(PortId, usize, sluice_switch::Handed)> {
    const MACS: usize = sluice_wire::VNET_HDR_LEN + 12;
    if tpid != 0x88a8 {
        return None;
    }
    let end = (sluice_wire::VNET_HDR_LEN + len).min(buf.len());
    let tags = UpcallTags::read(tci, buf.get(MACS..end)?)?;
    let id = port_at.get(tags.slot as usize).copied().flatten().filter(|&id| id != RESERVED)?;
    if tags.origin_len > 0 {
        buf.copy_within(MACS + tags.origin_len..end, MACS);
    }
    fix_vnet_after_untag(buf, 4 + tags.origin_len as u16);
    Some((id, len - tags.origin_len, sluice_switch::Handed { tunnel: tags.tunnel, ct: tags.ct }))
}

/// The TAP computed the virtio header of an upcalled frame with the outer tags in it
/// (`taken` bytes of them); the checksum start and header length move back by as much.
fn fix_vnet_after_untag(buf: &mut [u8], taken: u16) {
    let Ok(mut h) = sluice_wire::VnetHdr::parse(&buf[..sluice_wire::VNET_HDR_LEN]) else { return };
    if h.needs_csum() {
        h.csum_start = h.csum_start.saturating_sub(taken);
    }
    if h.hdr_len != 0 {
        h.hdr_len = h.hdr_len.saturating_sub(taken);
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
    fn slots_go_lowest_first_after_a_rest() {
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
        port_at.iter_mut().for_each(|p| *p = Some(1));
        assert_eq!(pick_slot(&port_at, &freed_at, later), None, "all in use");
    }
}

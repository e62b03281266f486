//! sluice's kernel datapath: how the kernel executes what the forwarding core decided
//! (docs/architecture.md, "The kernel datapath").
//!
//! One TC program (`bpf/datapath.c`, compiled by build.rs) runs at the ingress of every
//! port the kernel reaches — the switch side of a guest's veth pair, the uplink — and
//! forwards known unicast itself from five maps the daemon fills from the core's state
//! ([`tables`]); every other frame it hands up through the switch's upcall TAP. A second
//! one runs at the egress of the switch side of every guest's veth, and of the upcall TAP,
//! and lets only the switch's own frames ([`abi::SLUICE_MARK`]) into the guest, or into the
//! TAP's queue. This crate loads the
//! programs, attaches them (tcx), pins programs and maps so that forwarding outlives the
//! daemon, writes the maps, and reads the counters back. What is decided lives in
//! `sluice_switch::fastpath`; nothing here decides.
//!
//! The maps' layouts and the constants both sides use are declared once, in
//! sluice-ebpf-abi ([`abi`]): build.rs writes the programs' C header from those
//! declarations, and a test holds the compiled programs' BTF to the Rust layouts.
//!
//! [`exec`] is the program that is to replace the forwarding one (docs/architecture.md,
//! "One brain"): it extracts a frame's key, looks up the verdict the core installed for it
//! and executes it, deciding nothing; [`convert`] turns the core's state, keys and
//! verdicts into its map entries. The daemon does not use them yet.
//!
//! Apart from the datapath, [`tunnel_filter`] is the socket filter a user-space tunnel
//! puts on its UDP socket: datagrams from hosts that are not its endpoints are dropped in
//! the kernel.

pub mod abi;
pub mod convert;
pub mod exec;
pub mod heard;
pub mod tables;
pub mod tunnel_filter;

use std::path::{Path, PathBuf};

use aya::maps::{Array, HashMap, MapData, PerCpuArray};
use aya::programs::links::{FdLink, PinnedLink};
use aya::programs::tc::{SchedClassifierLink, TcAttachOptions};
use aya::programs::{LinkOrder, SchedClassifier, TcAttachType};
use sluice_wire::MacAddr;

pub use abi::MAX_PORTS;

/// Why the kernel datapath could not do what was asked. Each message says what to do.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Built without clang.
    #[error(
        "this sluice was built without the kernel datapath's programs (no clang or libbpf headers at build time): install them (`apt-get install clang libbpf-dev`) and build sluice again, or use `--datapath user`"
    )]
    NotBuilt,
    /// Loading the object or its program failed (the verifier's log is in the cause).
    #[error("loading the kernel datapath into the kernel failed (it needs BPF with BTF and TC programs, as root): {0}")]
    Load(String),
    /// The pin directory could not be prepared.
    #[error("preparing {path} for the kernel datapath's pinned objects: {source}")]
    Pins {
        /// The directory.
        path: PathBuf,
        /// What failed.
        #[source]
        source: std::io::Error,
    },
    /// Attaching to an interface failed.
    #[error("attaching the kernel datapath to {ifname} failed (it needs tcx, Linux 6.6 or later): {why}")]
    Attach {
        /// The interface.
        ifname: String,
        /// What failed.
        why: String,
    },
    /// A map operation failed.
    #[error("updating the kernel datapath's {map} map: {why}")]
    Map {
        /// Which map.
        map: &'static str,
        /// What failed.
        why: String,
    },
}

#[cfg(sluice_bpf)]
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/datapath.o"));
#[cfg(not(sluice_bpf))]
static OBJECT: &[u8] = &[];

/// Whether this build carries the programs.
pub fn available() -> bool {
    !OBJECT.is_empty()
}

const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

/// Makes `dir` a bpffs of its own (mode 0700) unless it already is one; `/sys/fs/bpf` is
/// not used because `ip netns exec` remounts `/sys`.
pub fn ensure_bpffs(dir: &Path) -> Result<(), Error> {
    let pins = |source| Error::Pins { path: dir.to_path_buf(), source };
    std::fs::create_dir_all(dir).map_err(pins)?;
    let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes())
        .map_err(|_| pins(std::io::Error::from(std::io::ErrorKind::InvalidInput)))?;
    // SAFETY: `st` is a zeroed statfs the call fills; `c` is NUL-terminated.
    let is_bpffs = unsafe {
        let mut st: libc::statfs = std::mem::zeroed();
        libc::statfs(c.as_ptr(), &mut st) == 0 && st.f_type as i64 == BPF_FS_MAGIC
    };
    if is_bpffs {
        return Ok(());
    }
    // SAFETY: mounting a bpffs on a directory we just made sure exists; all strings are
    // NUL-terminated literals or `c`.
    let r = unsafe { libc::mount(c"bpf".as_ptr(), c.as_ptr(), c"bpf".as_ptr(), 0, c"mode=0700".as_ptr().cast()) };
    if r != 0 {
        return Err(pins(std::io::Error::last_os_error()));
    }
    Ok(())
}

/// Whether the maps an earlier run pinned in `dir` have this build's layouts (key and value
/// sizes, and a MAC table of `fib_max` entries), so this run can take them over. `None`
/// when nothing is pinned there.
pub fn pins_compatible(dir: &Path, fib_max: u32) -> Option<bool> {
    let want: [(&str, usize, usize, Option<u32>); 12] = [
        ("sluice_ports", 4, std::mem::size_of::<abi::Port>(), Some(MAX_PORTS)),
        ("sluice_port_of", 4, 4, Some(MAX_PORTS)),
        ("sluice_fib", std::mem::size_of::<abi::FibKey>(), std::mem::size_of::<abi::FibVal>(), Some(fib_max.max(1))),
        ("sluice_config", 4, std::mem::size_of::<abi::Config>(), Some(1)),
        ("sluice_stats", 4, std::mem::size_of::<abi::Counters>(), Some(MAX_PORTS)),
        ("sluice_owners", std::mem::size_of::<abi::IpKey>(), 4, Some(fib_max.max(1))),
        (
            "sluice_neigh",
            std::mem::size_of::<abi::NeighKey>(),
            std::mem::size_of::<abi::NeighVal>(),
            Some(fib_max.max(1)),
        ),
        ("sluice_tunnels", 4, std::mem::size_of::<abi::Tunnel>(), None),
        ("sluice_vnis", std::mem::size_of::<abi::VniKey>(), 4, None),
        ("sluice_remotes", std::mem::size_of::<abi::RemoteKey>(), std::mem::size_of::<abi::Remote>(), None),
        ("sluice_endpoints", std::mem::size_of::<abi::EndpointKey>(), 4, None),
        ("sluice_switch_stats", 4, std::mem::size_of::<abi::SwitchCounters>(), Some(1)),
    ];
    if !dir.join("sluice_ports").exists() {
        return None;
    }
    Some(want.iter().all(|&(name, k, v, n)| {
        MapData::from_pin(dir.join(name)).and_then(|m| m.info()).is_ok_and(|i| {
            i.key_size() as usize == k && i.value_size() as usize == v && n.is_none_or(|n| i.max_entries() == n)
        })
    }))
}

/// Counters of one port slot, summed over CPUs.
pub type Counters = abi::Counters;

/// The loaded program and its maps, pinned in one directory.
pub struct KernelDatapath {
    ebpf: aya::Ebpf,
    dir: PathBuf,
    ports: Array<MapData, abi::Port>,
    port_of: HashMap<MapData, u32, u32>,
    fib: HashMap<MapData, abi::FibKey, abi::FibVal>,
    config: Array<MapData, abi::Config>,
    stats: PerCpuArray<MapData, abi::Counters>,
    switch_stats: PerCpuArray<MapData, abi::SwitchCounters>,
    owners: HashMap<MapData, abi::IpKey, u32>,
    neigh: HashMap<MapData, abi::NeighKey, abi::NeighVal>,
    tunnels: HashMap<MapData, u32, abi::Tunnel>,
    vnis: HashMap<MapData, abi::VniKey, u32>,
    remotes: HashMap<MapData, abi::RemoteKey, abi::Remote>,
    endpoints: HashMap<MapData, abi::EndpointKey, u32>,
}

/// Where a program is attached on an interface.
#[derive(Clone, Copy)]
enum Hook {
    /// `sluice_ingress`, at the interface's ingress: forwarding.
    Ingress,
    /// `sluice_egress`, at a guest's veth's egress and the upcall TAP's: only the switch's
    /// frames into the guest, or into the TAP's queue.
    Egress,
}

impl Hook {
    fn program(self) -> &'static str {
        match self {
            Hook::Ingress => "sluice_ingress",
            Hook::Egress => "sluice_egress",
        }
    }

    /// The prefix of its links' pins (`link-IFNAME`, `egress-IFNAME`).
    fn pin_prefix(self) -> &'static str {
        match self {
            Hook::Ingress => "link-",
            Hook::Egress => "egress-",
        }
    }

    fn attach_type(self) -> TcAttachType {
        match self {
            Hook::Ingress => TcAttachType::Ingress,
            Hook::Egress => TcAttachType::Egress,
        }
    }
}

/// A tunnel's settings, as [`KernelDatapath::set_tunnel`] writes them.
#[derive(Clone, Copy, Debug)]
pub struct TunnelSpec<'a> {
    /// The underlay address frames leave from.
    pub local: std::net::IpAddr,
    /// Their TTL (hop limit).
    pub ttl: u8,
    /// The VNI of every frame, when `per_vlan` is empty.
    pub vni: u32,
    /// A VNI per VLAN, as (VLAN, VNI) pairs.
    pub per_vlan: &'a [(u16, u32)],
    /// The configured remote endpoints.
    pub remotes: &'a [std::net::IpAddr],
    /// Datagrams are accepted from `remotes` alone.
    pub remotes_only: bool,
}

/// A station the kernel heard behind a tunnel: (VNI, inner MAC, remote endpoint, when
/// last as `CLOCK_MONOTONIC` nanoseconds).
pub type HeardStation = (u32, MacAddr, std::net::IpAddr, u64);

fn map_err(map: &'static str) -> impl Fn(aya::maps::MapError) -> Error {
    move |e| Error::Map { map, why: e.to_string() }
}

impl KernelDatapath {
    /// Loads the program and its maps, pinning the maps in `dir` (a bpffs, see
    /// [`ensure_bpffs`]) or taking over those pinned there by an earlier run. The MAC
    /// table holds `fib_max` entries.
    pub fn open(dir: &Path, fib_max: u32) -> Result<Self, Error> {
        if !available() {
            return Err(Error::NotBuilt);
        }
        Self::open_object(OBJECT, dir, fib_max)
    }

    /// As [`KernelDatapath::open`], with the programs of `object` (the tests load one the
    /// verifier refuses).
    #[doc(hidden)]
    pub fn open_object(object: &[u8], dir: &Path, fib_max: u32) -> Result<Self, Error> {
        let mut ebpf = aya::EbpfLoader::new()
            .map_pin_path(dir)
            .set_max_entries("sluice_fib", fib_max.max(1))
            .set_max_entries("sluice_owners", fib_max.max(1))
            .set_max_entries("sluice_neigh", fib_max.max(1))
            .load(object)
            .map_err(|e| Error::Load(format!("{e:#}")))?;
        for hook in [Hook::Ingress, Hook::Egress] {
            let name = hook.program();
            let prog: &mut SchedClassifier = ebpf
                .program_mut(name)
                .ok_or_else(|| Error::Load(format!("the object has no program {name}")))?
                .try_into()
                .map_err(|e| Error::Load(format!("{e}")))?;
            prog.load().map_err(|e| Error::Load(verifier_log(&e)))?;
        }
        let take = |ebpf: &mut aya::Ebpf, name: &'static str| {
            ebpf.take_map(name).ok_or_else(|| Error::Load(format!("the object has no map {name}")))
        };
        let ports = Array::try_from(take(&mut ebpf, "sluice_ports")?).map_err(map_err("ports"))?;
        let port_of = HashMap::try_from(take(&mut ebpf, "sluice_port_of")?).map_err(map_err("port_of"))?;
        let fib = HashMap::try_from(take(&mut ebpf, "sluice_fib")?).map_err(map_err("fib"))?;
        let config = Array::try_from(take(&mut ebpf, "sluice_config")?).map_err(map_err("config"))?;
        let stats = PerCpuArray::try_from(take(&mut ebpf, "sluice_stats")?).map_err(map_err("stats"))?;
        let switch_stats =
            PerCpuArray::try_from(take(&mut ebpf, "sluice_switch_stats")?).map_err(map_err("switch_stats"))?;
        let owners = HashMap::try_from(take(&mut ebpf, "sluice_owners")?).map_err(map_err("owners"))?;
        let neigh = HashMap::try_from(take(&mut ebpf, "sluice_neigh")?).map_err(map_err("neigh"))?;
        let tunnels = HashMap::try_from(take(&mut ebpf, "sluice_tunnels")?).map_err(map_err("tunnels"))?;
        let vnis = HashMap::try_from(take(&mut ebpf, "sluice_vnis")?).map_err(map_err("vnis"))?;
        let remotes = HashMap::try_from(take(&mut ebpf, "sluice_remotes")?).map_err(map_err("remotes"))?;
        let endpoints = HashMap::try_from(take(&mut ebpf, "sluice_endpoints")?).map_err(map_err("endpoints"))?;
        Ok(KernelDatapath {
            ebpf,
            dir: dir.to_path_buf(),
            ports,
            port_of,
            fib,
            config,
            stats,
            switch_stats,
            owners,
            neigh,
            tunnels,
            vnis,
            remotes,
            endpoints,
        })
    }

    fn link_pin(&self, ifname: &str, hook: Hook) -> PathBuf {
        self.dir.join(format!("{}{ifname}", hook.pin_prefix()))
    }

    /// Attaches the forwarding program at the ingress of interface `ifname` (in this
    /// thread's network namespace) with a pinned tcx link, or — when an earlier run left a
    /// link pinned for it — puts this program into that link in one step, so forwarding
    /// never pauses.
    pub fn attach(&mut self, ifname: &str) -> Result<(), Error> {
        self.attach_hook(ifname, Hook::Ingress)
    }

    /// Attaches the egress program to the switch's end `ifname` of a guest's veth pair, or
    /// to the upcall interface (the one [`KernelDatapath::set_config`] names), as
    /// [`KernelDatapath::attach`] does the forwarding program: from then on only the
    /// switch's own frames ([`abi::SLUICE_MARK`]) go into the guest that way, or into the
    /// upcall interface's queue; the rest is counted, at the guest's port or in
    /// [`KernelDatapath::switch_counters`].
    pub fn attach_egress(&mut self, ifname: &str) -> Result<(), Error> {
        self.attach_hook(ifname, Hook::Egress)
    }

    fn attach_hook(&mut self, ifname: &str, hook: Hook) -> Result<(), Error> {
        let pin = self.link_pin(ifname, hook);
        let err = |why: String| Error::Attach { ifname: ifname.to_string(), why };
        let prog: &mut SchedClassifier = self
            .ebpf
            .program_mut(hook.program())
            .and_then(|p| p.try_into().ok())
            .ok_or_else(|| err("the program is not loaded".into()))?;
        // Taking the earlier link over; should that fail (a link left for an interface of
        // the same name that has since been replaced), the pin goes and a fresh link is made.
        let taken = if pin.exists() {
            let over = PinnedLink::from_pin(&pin)
                .map_err(|e| e.to_string())
                .and_then(|old| old.unpin().map_err(|e| e.to_string()))
                .and_then(|fd| SchedClassifierLink::try_from(fd).map_err(|e| e.to_string()))
                .and_then(|link| prog.attach_to_link(link).map_err(|e| e.to_string()));
            if over.is_err() {
                let _ = std::fs::remove_file(&pin);
            }
            over.ok()
        } else {
            None
        };
        let id = match taken {
            Some(id) => id,
            None => prog
                .attach_with_options(ifname, hook.attach_type(), TcAttachOptions::TcxOrder(LinkOrder::default()))
                .map_err(|e| err(format!("{e}")))?,
        };
        let link = prog.take_link(id).map_err(|e| err(format!("{e}")))?;
        let fd = FdLink::try_from(link).map_err(|e| err(format!("{e}")))?;
        fd.pin(&pin).map_err(|e| err(format!("pinning {}: {e}", pin.display())))?;
        Ok(())
    }

    /// Detaches the programs from `ifname` (their pinned links go; nothing else holds them).
    pub fn detach(&mut self, ifname: &str) {
        for hook in [Hook::Ingress, Hook::Egress] {
            let _ = std::fs::remove_file(self.link_pin(ifname, hook));
        }
    }

    /// The interfaces with a pinned link (after a takeover, those of the earlier run too).
    pub fn linked(&self) -> Vec<String> {
        let Ok(rd) = std::fs::read_dir(&self.dir) else { return Vec::new() };
        let mut names: Vec<String> = rd
            .flatten()
            .filter_map(|e| {
                let n = e.file_name().to_str()?.to_string();
                [Hook::Ingress, Hook::Egress].iter().find_map(|h| n.strip_prefix(h.pin_prefix()).map(str::to_string))
            })
            .collect();
        names.sort_unstable();
        names.dedup();
        names
    }

    /// Writes port slot `slot`. A port the kernel reaches is also found by its ifindex.
    pub fn set_port(&mut self, slot: u32, e: &abi::Port) -> Result<(), Error> {
        if let Ok(old) = self.ports.get(&slot, 0)
            && old.ifindex != e.ifindex
            && old.ifindex != 0
        {
            let _ = self.port_of.remove(&old.ifindex);
        }
        self.ports.set(slot, e, 0).map_err(map_err("ports"))?;
        if e.flags & abi::PF_KERNEL != 0 {
            self.port_of.insert(e.ifindex, slot, 0).map_err(map_err("port_of"))?;
        }
        Ok(())
    }

    /// Frees port slot `slot`.
    pub fn clear_port(&mut self, slot: u32) -> Result<(), Error> {
        if let Ok(old) = self.ports.get(&slot, 0)
            && old.ifindex != 0
        {
            let _ = self.port_of.remove(&old.ifindex);
        }
        self.ports.set(slot, abi::Port::default(), 0).map_err(map_err("ports"))
    }

    /// The port in slot `slot` as the maps hold it.
    pub fn port(&self, slot: u32) -> Option<abi::Port> {
        self.ports.get(&slot, 0).ok().filter(|p| p.ifindex != 0)
    }

    /// Every used slot and its port, as the maps hold them (after a takeover: what the
    /// earlier run left).
    pub fn ports(&self) -> Vec<(u32, abi::Port)> {
        (0..MAX_PORTS).filter_map(|s| self.port(s).map(|p| (s, p))).collect()
    }

    /// Points `mac` on `vlan` at port slot `slot`.
    pub fn set_mac(&mut self, vlan: u16, mac: MacAddr, slot: u32, is_static: bool) -> Result<(), Error> {
        let k = tables::fib_key(vlan, mac);
        let mut v = tables::fib_val(slot, is_static);
        // Keep the kernel's last-seen stamp when only the port changes.
        if let Ok(old) = self.fib.get(&k, 0) {
            v.seen_ns = old.seen_ns;
        }
        self.fib.insert(k, v, 0).map_err(map_err("fib"))
    }

    /// Removes `mac` on `vlan`.
    pub fn del_mac(&mut self, vlan: u16, mac: MacAddr) {
        let _ = self.fib.remove(&tables::fib_key(vlan, mac));
    }

    /// Every MAC entry: (VLAN, MAC, slot, static, when the kernel last forwarded a frame
    /// from it, as `CLOCK_MONOTONIC` nanoseconds; 0: never).
    pub fn macs(&self) -> Vec<(u16, MacAddr, u32, bool, u64)> {
        self.fib
            .iter()
            .flatten()
            .map(|(k, v)| (k.vlan, MacAddr(k.mac), v.slot, v.flags & abi::FIB_STATIC != 0, v.seen_ns))
            .collect()
    }

    /// Sets the switch-wide settings: the interface frames go up through (0: none), the
    /// mode, the switch's MAC on the guests' side, (Layer 3) the slot of the uplink
    /// traffic off the switch leaves by, and how many slots a flood looks at (every port
    /// in use has a slot below it).
    pub fn set_config(
        &mut self,
        upcall_ifindex: u32,
        mode: u8,
        router_mac: MacAddr,
        l3_uplink: Option<u32>,
        n_slots: u32,
    ) -> Result<(), Error> {
        let c = abi::Config {
            upcall_ifindex,
            l3_uplink: l3_uplink.map_or(0, |s| s + 1),
            mode,
            router_mac: router_mac.0,
            pad: 0,
            n_slots,
        };
        self.config.set(0, c, 0).map_err(map_err("config"))
    }

    /// The switch-wide settings as the maps hold them (after a takeover: the earlier
    /// run's).
    pub fn config(&self) -> Option<abi::Config> {
        self.config.get(&0, 0).ok()
    }

    /// Layer 3: makes `ip` port slot `slot`'s, or nobody's.
    pub fn set_owner(&mut self, ip: std::net::IpAddr, slot: Option<u32>) -> Result<(), Error> {
        let k = tables::ip_key(ip);
        match slot {
            Some(s) => self.owners.insert(k, s, 0).map_err(map_err("owners")),
            None => {
                let _ = self.owners.remove(&k);
                Ok(())
            }
        }
    }

    /// Layer 3: every address owned, as (key, slot).
    pub fn owners(&self) -> Vec<(abi::IpKey, u32)> {
        self.owners.iter().flatten().collect()
    }

    /// Layer 3: every LAN neighbour, as (VLAN, address, MAC).
    pub fn neighbours(&self) -> Vec<(u16, std::net::IpAddr, MacAddr)> {
        self.neigh
            .iter()
            .flatten()
            .filter_map(|(k, v)| Some((k.vlan, tables::key_ip(k.family, &k.addr)?, MacAddr(v.mac))))
            .collect()
    }

    /// Layer 3: sets (or, with `None`, forgets) LAN neighbour `ip`'s MAC on `vlan`.
    pub fn set_neighbour(&mut self, vlan: u16, ip: std::net::IpAddr, mac: Option<MacAddr>) -> Result<(), Error> {
        let k = tables::neigh_key(vlan, ip);
        match mac {
            Some(m) => self.neigh.insert(k, abi::NeighVal { mac: m.0, pad: [0; 2] }, 0).map_err(map_err("neigh")),
            None => {
                let _ = self.neigh.remove(&k);
                Ok(())
            }
        }
    }

    /// Makes the device `ifindex` the tunnel `spec` describes. Entries of an earlier tunnel
    /// on the same device go first.
    pub fn set_tunnel(&mut self, ifindex: u32, spec: &TunnelSpec<'_>) -> Result<(), Error> {
        let TunnelSpec { local, ttl, vni, per_vlan, remotes, remotes_only } = *spec;
        self.clear_tunnel(ifindex);
        let mut t = abi::Tunnel { ttl, vni, ..Default::default() };
        if remotes_only {
            t.flags |= abi::TUN_REMOTES_ONLY;
        }
        for &r in remotes {
            self.endpoints.insert(tables::endpoint_key(ifindex, r), 1, 0).map_err(map_err("endpoints"))?;
        }
        match local {
            std::net::IpAddr::V4(a) => t.local[..4].copy_from_slice(&a.octets()),
            std::net::IpAddr::V6(a) => {
                t.local = a.octets();
                t.flags |= abi::TUN_V6;
            }
        }
        if !per_vlan.is_empty() {
            t.flags |= abi::TUN_PER_VLAN;
        }
        for &(vlan, vni) in per_vlan {
            let out = abi::VniKey { ifindex, id: u32::from(vlan) };
            self.vnis.insert(out, vni, 0).map_err(map_err("vnis"))?;
            let inn = abi::VniKey { ifindex, id: vni | abi::VNI_IN };
            self.vnis.insert(inn, abi::TUN_TAG | u32::from(vlan), 0).map_err(map_err("vnis"))?;
        }
        self.tunnels.insert(ifindex, t, 0).map_err(map_err("tunnels"))
    }

    /// Forgets the tunnel on device `ifindex`: its settings, endpoints, VNIs and stations
    /// heard.
    pub fn clear_tunnel(&mut self, ifindex: u32) {
        let _ = self.tunnels.remove(&ifindex);
        let vnis: Vec<abi::VniKey> = self.vnis.keys().flatten().filter(|k| k.ifindex == ifindex).collect();
        for k in vnis {
            let _ = self.vnis.remove(&k);
        }
        let heard: Vec<abi::RemoteKey> = self.remotes.keys().flatten().filter(|k| k.ifindex == ifindex).collect();
        for k in heard {
            let _ = self.remotes.remove(&k);
        }
        let known: Vec<abi::EndpointKey> = self.endpoints.keys().flatten().filter(|k| k.ifindex == ifindex).collect();
        for k in known {
            let _ = self.endpoints.remove(&k);
        }
    }

    /// The stations the kernel heard behind the tunnel on device `ifindex`.
    pub fn heard(&self, ifindex: u32) -> Vec<HeardStation> {
        let v6 = self.tunnels.get(&ifindex, 0).is_ok_and(|t| t.flags & abi::TUN_V6 != 0);
        self.remotes
            .iter()
            .flatten()
            .filter(|(k, _)| k.ifindex == ifindex)
            .map(|(k, v)| {
                let addr = if v6 {
                    std::net::IpAddr::from(v.addr)
                } else {
                    std::net::IpAddr::from(<[u8; 4]>::try_from(&v.addr[..4]).expect("4 bytes"))
                };
                (k.vni, MacAddr(k.mac), addr, v.seen_ns)
            })
            .collect()
    }

    /// Forgets station `mac` of VNI `vni` behind the tunnel on device `ifindex` (frames to
    /// it go up, and the core sends them to every endpoint, until it is heard again).
    pub fn forget_heard(&mut self, ifindex: u32, vni: u32, mac: MacAddr) {
        let _ = self.remotes.remove(&abi::RemoteKey { ifindex, vni, mac: mac.0, pad: [0; 2] });
    }

    /// Port slot `slot`'s counters, summed over CPUs.
    pub fn counters(&self, slot: u32) -> Counters {
        sum_counters(&self.stats, slot)
    }

    /// Zeroes port slot `slot`'s counters.
    pub fn reset_counters(&mut self, slot: u32) -> Result<(), Error> {
        let n = aya::util::nr_cpus().map_err(|(_, e)| Error::Map { map: "stats", why: e.to_string() })?;
        let zeros = aya::maps::PerCpuValues::try_from(vec![Counters::default(); n])
            .map_err(|e| Error::Map { map: "stats", why: e.to_string() })?;
        self.stats.set(slot, zeros, 0).map_err(map_err("stats"))
    }

    /// The switch's own counters (indexes in [`abi::s`]), summed over CPUs.
    pub fn switch_counters(&self) -> abi::SwitchCounters {
        let mut sum = abi::SwitchCounters::default();
        if let Ok(per_cpu) = self.switch_stats.get(&0, 0) {
            for c in per_cpu.iter() {
                for (s, v) in sum.v.iter_mut().zip(c.v) {
                    *s = s.wrapping_add(v);
                }
            }
        }
        sum
    }

    /// Zeroes the switch's own counters.
    pub fn reset_switch_counters(&mut self) -> Result<(), Error> {
        let why = |e: String| Error::Map { map: "switch_stats", why: e };
        let n = aya::util::nr_cpus().map_err(|(_, e)| why(e.to_string()))?;
        let zeros = aya::maps::PerCpuValues::try_from(vec![abi::SwitchCounters::default(); n])
            .map_err(|e| why(e.to_string()))?;
        self.switch_stats.set(0, zeros, 0).map_err(map_err("switch_stats"))
    }

    /// Detaches everything and removes every pin: nothing of this datapath is left in the
    /// kernel once the maps' last users (this process) let go.
    pub fn remove(self) {
        remove_pins(&self.dir);
    }
}

/// Port slot `slot`'s counters in `stats`, summed over CPUs.
fn sum_counters(stats: &PerCpuArray<MapData, abi::Counters>, slot: u32) -> Counters {
    let mut sum = Counters::default();
    if let Ok(per_cpu) = stats.get(&slot, 0) {
        for c in per_cpu.iter() {
            for (s, v) in sum.v.iter_mut().zip(c.v) {
                *s = s.wrapping_add(v);
            }
        }
    }
    sum
}

/// Removes the links and maps pinned in `dir` (detaching the programs) and the directory.
pub fn remove_pins(dir: &Path) {
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let _ = std::fs::remove_file(e.path());
        }
    }
    let _ = std::fs::remove_dir(dir);
}

/// A program load error with the verifier's log, if it has one.
fn verifier_log(e: &aya::programs::ProgramError) -> String {
    match e {
        aya::programs::ProgramError::LoadError { io_error, verifier_log } => {
            format!("{io_error}; the verifier said:\n{verifier_log}")
        }
        other => format!("{other}"),
    }
}

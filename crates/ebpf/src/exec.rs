//! The verdict executor (`bpf/exec.c`, program `sluice_exec`): the kernel side of "one
//! brain" (docs/architecture.md, "One brain: the kernel executes the core's verdicts").
//!
//! The program extracts a frame's key in two stages — stage 1, [`abi::AdmitKey`]: the
//! input's slot, its tag (or VNI and whether the sender is an endpoint) and whether the
//! destination is a group or the input's own address; stage 2, [`abi::FlowKey`]: slot,
//! VLAN, EtherType, the station table's answers for source and destination, and the extras
//! the input's mask asks for — looks up the verdict the core installed for each, and
//! executes it. A key without a verdict of the current generation goes up the upcall
//! interface, tagged with its input's slot.
//!
//! [`Executor`] loads it, writes the tables the program reads (only the core's answers
//! go in: the program writes nothing but counters and the stations' last-seen stamps),
//! reads what it reports (stations heard behind tunnels, [`Heard`]), and runs it on
//! a frame without a device ([`Executor::run`], `BPF_PROG_TEST_RUN`; as if from a tunnel,
//! [`RunCtx::tunnel`]), which is how its tests see what it does. It also attaches the
//! programs to devices and pins them with the maps, so that forwarding outlives the daemon.

use std::os::fd::{AsFd, AsRawFd};
use std::path::{Path, PathBuf};

use aya::maps::lpm_trie::{Key as LpmKey, LpmTrie};
use aya::maps::{Array, HashMap, MapData, PerCpuArray, RingBuf};
use aya::programs::links::{FdLink, PinnedLink};
use aya::programs::tc::{SchedClassifierLink, TcAttachOptions};
use aya::programs::{LinkOrder, SchedClassifier, TcAttachType};
use sluice_wire::MacAddr;

use crate::sys::{SkBuff, prog_test_run};
use crate::{Counters, Error, abi, map_err, tables};

pub use crate::sys::monotonic_ns;

#[cfg(sluice_bpf)]
pub(crate) static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/exec.o"));
#[cfg(not(sluice_bpf))]
pub(crate) static OBJECT: &[u8] = &[];

/// The program's name in the object.
const PROGRAM: &str = "sluice_exec";
/// The tests' program: gives a frame a tunnel key, then runs the executor on it.
const TUNNELED: &str = "sluice_exec_tunneled";
/// The guard at the egress of a guest's veth and of the upcall TAP.
const EGRESS: &str = "sluice_egress";
/// Security groups: the daemon's lookup of a frame's connection, and its commit.
const CT_LOOKUP: &str = "sluice_ct_lookup";
const CT_COMMIT: &str = "sluice_ct_commit";

/// What an upcall's tags say beyond its frame: the input slot and, for a frame from a
/// tunnel, where it came from, as the core's key has it ([`abi::UP_TUNNEL`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UpcallTags {
    /// The input's slot.
    pub slot: u32,
    /// From a tunnel: the datagram's VNI, and whether its sender is one of the port's
    /// endpoints (for `Switch::ingest_from`).
    pub tunnel: Option<sluice_switch::Tunneled>,
    /// How many bytes after the outer tag are the origin's tags, to take out: the frame is
    /// what follows them.
    pub origin_len: usize,
    /// Security groups: what the kernel's tracker found of the frame's connection (`None`:
    /// not looked up).
    pub ct: Option<sluice_switch::conntrack::Found>,
}

impl UpcallTags {
    /// Reads an upcall's outer tag (its TCI, `tci`) and, when it says a tunnel's origin
    /// follows, the two tags at the start of `rest` (the bytes after the outer tag).
    /// `None` when the origin's tags are not there.
    pub fn read(tci: u16, rest: &[u8]) -> Option<UpcallTags> {
        let slot = u32::from(tci & 0x0fff);
        let cts = ((tci >> abi::UP_CT_SHIFT) & 7) as u8;
        let ct = (cts != abi::CTS_UNTRACKED).then(|| crate::convert::found(cts));
        if tci & abi::UP_TUNNEL == 0 {
            return Some(UpcallTags { slot, tunnel: None, origin_len: 0, ct });
        }
        let tag = |at: usize| -> Option<u16> {
            let t = rest.get(at..at + 4)?;
            (t[..2] == [0x81, 0x00]).then(|| u16::from_be_bytes([t[2], t[3]]))
        };
        let (high, low) = (tag(0)?, tag(4)?);
        let vni = (u32::from(high) << 8) | u32::from(low >> 8);
        let tunnel = sluice_switch::Tunneled { vni, endpoint: low & abi::UP_ENDPOINT != 0 };
        Some(UpcallTags { slot, tunnel: Some(tunnel), origin_len: 8, ct })
    }
}

/// One station heard behind a tunnel: an event the program wrote on its ring buffer
/// `sluice_heard` ([`abi::HeardEvent`]), read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Heard {
    /// The tunnel's device.
    pub ifindex: u32,
    /// Its input slot.
    pub slot: u32,
    /// The datagram's VNI.
    pub vni: u32,
    /// The VLAN the frame was admitted to.
    pub vlan: u16,
    /// The station.
    pub mac: MacAddr,
    /// The datagram's sender.
    pub sender: std::net::IpAddr,
}

impl Heard {
    /// Reads an event as the program wrote it: `None` for bytes of another size or an
    /// address family it does not write.
    pub fn parse(bytes: &[u8]) -> Option<Heard> {
        if bytes.len() != std::mem::size_of::<abi::HeardEvent>() {
            return None;
        }
        // SAFETY: `bytes` holds exactly one `HeardEvent`, a `repr(C)` struct of integers
        // and byte arrays, for which every bit pattern is a value; read unaligned, as a
        // ring buffer's record is 8-byte aligned only.
        let e: abi::HeardEvent = unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast()) };
        let sender = match e.family {
            abi::HEARD_V4 => std::net::IpAddr::V4(std::net::Ipv4Addr::new(e.addr[0], e.addr[1], e.addr[2], e.addr[3])),
            abi::HEARD_V6 => std::net::IpAddr::V6(std::net::Ipv6Addr::from(e.addr)),
            _ => return None,
        };
        Some(Heard { ifindex: e.ifindex, slot: e.slot, vni: e.vni, vlan: e.vlan, mac: MacAddr(e.mac), sender })
    }
}

/// How many entries the tables the executor sizes at load time hold.
#[derive(Clone, Copy, Debug)]
pub struct Sizes {
    /// The station table (`sluice_fib`), the address owners and the neighbours: the
    /// switch's MAC table size.
    pub stations: u32,
    /// Stage 2's verdicts (`sluice_verdicts`, an LRU map: the least used go when it is
    /// full). Each entry is preallocated: about 750 bytes of kernel memory.
    pub verdicts: u32,
}

/// The size of the remote table (`sluice_remotes`: where each station behind a tunnel
/// is, by device, VNI and MAC): twice the station table's, and at least 16,384. It is an
/// LRU map, so that a table full of heard stations takes a new one; sized so, the
/// stations the core installs — at most the station table's size — never make it evict
/// one (the kernel's LRU may take one a little before it is full).
pub fn remotes_size(sizes: Sizes) -> u32 {
    sizes.stations.max(1).saturating_mul(2).max(16_384)
}

/// How many upcalls each input may make: a token bucket per input slot, in the kernel.
/// A frame that would go up from an input whose bucket is empty is dropped and counted
/// `upcall_limit` at that input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UpcallBudget {
    /// Upcalls a second the bucket refills with (0: no budget at all).
    pub rate: u32,
    /// Upcalls it holds at most: what an input may make at once.
    pub burst: u32,
}

impl UpcallBudget {
    /// The budget unless configured: 2,048 upcalls a second, 2,048 at once. A guest's
    /// learning costs an upcall for each station it sends from (two if its second frame
    /// comes before the core installed the verdict), up to `mac_limit_per_port` (1,024 by
    /// default) stations, and a change of generation one miss for each key it uses (tens:
    /// a key names destination ports and EtherTypes, not addresses), so a guest learning
    /// all the stations it may at once stays within the burst, and within the rate at any
    /// pace. What a port can make beyond that — frames from ever new source addresses past
    /// its MAC lock, each a key of its own — is bounded to 2,048 a second instead of
    /// filling the upcall TAP's queue (4,096) that every port's upcalls share. An uplink
    /// facing a LAN where more than 2,048 stations appear at once loses the first frames
    /// of the rest, counted, until its bucket refills.
    pub const DEFAULT: UpcallBudget = UpcallBudget { rate: 2048, burst: 2048 };
}

/// The executor loaded, its maps pinned in one directory.
pub struct Executor {
    ebpf: aya::Ebpf,
    /// The settings last written to `sluice_exec_cfg`.
    cfg: abi::ExecConfig,
    inputs: HashMap<MapData, u32, abi::Input>,
    admits: HashMap<MapData, abi::AdmitKey, abi::Admit>,
    verdicts: HashMap<MapData, abi::FlowKey, abi::Verdict>,
    fib: HashMap<MapData, abi::FibKey, abi::FibVal>,
    locks: HashMap<MapData, abi::LockKey, u32>,
    config: Array<MapData, abi::ExecConfig>,
    stats: PerCpuArray<MapData, abi::Counters>,
    owners: HashMap<MapData, abi::IpKey, u32>,
    neigh: HashMap<MapData, abi::NeighKey, abi::NeighVal>,
    tunnels: HashMap<MapData, u32, abi::Tunnel>,
    remotes: HashMap<MapData, abi::RemoteKey, abi::Remote>,
    endpoints: HashMap<MapData, abi::EndpointKey, u32>,
    /// Each tunnel VNI's flood set (`sluice_flood_eps`).
    floods: HashMap<MapData, abi::FloodKey, abi::FloodEps>,
    heard: RingBuf<MapData>,
    switch_stats: PerCpuArray<MapData, abi::SwitchCounters>,
    meters: Array<MapData, abi::Meter>,
    /// IGMP/MLD snooping: registered groups → port set id (`sluice_mdb`).
    mdb: HashMap<MapData, abi::MdbKey, u32>,
    /// Security groups' address classes by class set (LPM: the set's 4 bytes, then the
    /// address).
    acl_v4: LpmTrie<MapData, [u8; 20], u32>,
    acl_v6: LpmTrie<MapData, [u8; 20], u32>,
    /// Their destination port classes (the set, the port, 2 bytes of padding).
    acl_ports: LpmTrie<MapData, [u8; 8], u32>,
    /// IGMP/MLD snooping's classes of group frames, written once (held: a program loaded
    /// later, the tests' own, refers to their descriptors).
    _group_prefixes: LpmTrie<MapData, [u8; 16], u32>,
    _group_control: Array<MapData, u32>,
    /// Where the maps and links are pinned.
    dir: PathBuf,
}

/// Where a program is attached on an interface.
#[derive(Clone, Copy)]
enum Hook {
    /// `sluice_exec`, at the interface's ingress: the frames of a port.
    Ingress,
    /// `sluice_egress`, at a guest's veth's egress and the upcall TAP's: only the switch's
    /// frames into the guest, or into the TAP's queue.
    Egress,
}

impl Hook {
    const ALL: [Hook; 2] = [Hook::Ingress, Hook::Egress];

    fn program(self) -> &'static str {
        match self {
            Hook::Ingress => PROGRAM,
            Hook::Egress => EGRESS,
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

/// What [`Executor::run`] hands the program besides the frame: the fields of its
/// `struct __sk_buff` a test run may set.
#[derive(Clone, Copy, Debug, Default)]
pub struct RunCtx {
    /// The device the frame arrives on (an interface of the caller's namespace; 0: the
    /// loopback device).
    pub ifindex: u32,
    /// `skb->mark`.
    pub mark: u32,
    /// A GSO frame's segment size (0: not GSO).
    pub gso_size: u32,
    /// A GSO frame's segment count.
    pub gso_segs: u32,
    /// As if a tunnel's device received it: the datagram's VNI and sender, in the key it
    /// leaves (of the input's underlay family).
    pub tunnel: Option<(u32, std::net::IpAddr)>,
}

/// What one run of the program did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ran {
    /// The program's return code (`TC_ACT_OK` 0, `TC_ACT_SHOT` 2, `TC_ACT_REDIRECT` 7).
    pub code: u32,
    /// The frame as the program left it (an 802.1Q tag the program pushed is in the skb's
    /// metadata, which a test run does not return; one it popped from the frame is gone).
    pub frame: Vec<u8>,
    /// `skb->mark` afterwards.
    pub mark: u32,
}

/// IGMP/MLD snooping: writes the core's classes of group frames (`sluice_group_prefixes`,
/// `sluice_group_control`) from [`sluice_switch::snoop`]'s own lists.
fn write_group_classes(
    prefixes: &mut LpmTrie<MapData, [u8; 16], u32>,
    control: &mut Array<MapData, u32>,
) -> Result<(), Error> {
    use sluice_switch::snoop::{self, GroupPrefix};
    for &(addr, len, class) in snoop::group_prefixes() {
        let (a, len) = match addr {
            std::net::IpAddr::V4(a) => (a.to_ipv6_mapped().octets(), 96 + u32::from(len)),
            std::net::IpAddr::V6(a) => (a.octets(), u32::from(len)),
        };
        let v = match class {
            GroupPrefix::Flooded => abi::GPFX_FLOODED,
            GroupPrefix::Snooped => abi::GPFX_SNOOPED,
        };
        prefixes.insert(&LpmKey::new(len, a), v, 0).map_err(map_err("group_prefixes"))?;
    }
    let at = snoop::CONTROL_PROTOCOLS.iter().map(|&p| u32::from(p));
    let at = at.chain(snoop::CONTROL_ICMP6_TYPES.iter().map(|&t| abi::GCONTROL_ICMP6 + u32::from(t)));
    for i in at {
        control.set(i, 1, 0).map_err(map_err("group_control"))?;
    }
    Ok(())
}

/// The switch's connections in the kernel's conntrack (the executor's zone and
/// timeouts), for the frames the executor does not see: the core's lookups of frames from
/// ports in user space, and its commits of connections it decided to remember after an
/// upcall (the executor never saw that verdict). Each runs a program of the executor's
/// object on the frame with `BPF_PROG_TEST_RUN`, in the caller's network namespace — the
/// executor's.
#[derive(Debug)]
pub struct Conntrack {
    lookup: std::os::fd::OwnedFd,
    commit: std::os::fd::OwnedFd,
}

impl Conntrack {
    fn run(fd: &std::os::fd::OwnedFd, name: &str, frame: &[u8]) -> Result<u32, Error> {
        let mut skb = SkBuff::default();
        let mut out = vec![0u8; frame.len() + 64];
        prog_test_run(fd.as_raw_fd(), frame, &mut out, &mut skb)
            .map(|(code, _)| code)
            .map_err(|e| Error::Load(format!("running {name} on a frame (BPF_PROG_TEST_RUN): {e}")))
    }

    /// Looks `frame`'s connection up (an untagged Ethernet frame; only its headers are
    /// read), refreshing it as the executor does: its `CTS_*`.
    pub fn lookup(&self, frame: &[u8]) -> Result<u8, Error> {
        Self::run(&self.lookup, CT_LOOKUP, frame).map(|c| c as u8)
    }

    /// Remembers `frame`'s connection: `Ok(false)` when the kernel's table is full.
    pub fn commit(&self, frame: &[u8]) -> Result<bool, Error> {
        Self::run(&self.commit, CT_COMMIT, frame).map(|c| c != 2)
    }
}

impl sluice_switch::conntrack::KernelTracker for Conntrack {
    fn lookup(&mut self, frame: &[u8]) -> sluice_switch::conntrack::Found {
        // (A run that fails finds nothing: the frame is judged by the rules.)
        crate::convert::found(Conntrack::lookup(self, frame).unwrap_or(abi::CTS_MISS))
    }

    fn commit(&mut self, frame: &[u8]) -> Result<(), sluice_switch::conntrack::CtFull> {
        match Conntrack::commit(self, frame) {
            Ok(true) => Ok(()),
            Ok(false) => Err(sluice_switch::conntrack::CtFull),
            // (Not remembered: its return traffic is judged by the rules.)
            Err(_) => Ok(()),
        }
    }
}

impl Executor {
    /// Loads the executor, pinning its maps in `dir` (a bpffs, see
    /// [`crate::ensure_bpffs`]) or reusing those pinned there under the same names.
    pub fn open(dir: &Path, sizes: Sizes) -> Result<Self, Error> {
        if OBJECT.is_empty() {
            return Err(Error::NotBuilt);
        }
        Self::open_object(OBJECT, dir, sizes)
    }

    /// As [`Executor::open`], with the programs of `object` (a test loads one the verifier
    /// refuses).
    #[doc(hidden)]
    pub fn open_object(object: &[u8], dir: &Path, sizes: Sizes) -> Result<Self, Error> {
        let stations = sizes.stations.max(1);
        // Kfunc placeholders become kfunc calls of this kernel (its BTF read only if any);
        // a kernel without the conntrack kfuncs gets `r0 = 0` for them, and the executor
        // tracks no connection (the daemon's start-up probe says so).
        let mut object = object.to_vec();
        let btf = std::cell::OnceCell::new();
        crate::kfunc::rewrite_calls_or_null(&mut object, |name| {
            btf.get_or_init(|| aya::Btf::from_sys_fs().ok())
                .as_ref()?
                .id_by_type_name_kind(name, aya_obj::btf::BtfKind::Func)
                .ok()
        })
        .map_err(Error::Load)?;
        let object = &object[..];
        let mut ebpf = aya::EbpfLoader::new()
            .map_pin_path(dir)
            .set_max_entries("sluice_fib", stations)
            .set_max_entries("sluice_owners", stations)
            .set_max_entries("sluice_neigh", stations)
            .set_max_entries("sluice_verdicts", sizes.verdicts.max(1))
            .set_max_entries("sluice_remotes", remotes_size(sizes))
            .load(object)
            .map_err(|e| Error::Load(format!("{e:#}")))?;
        for name in [PROGRAM, EGRESS, CT_LOOKUP, CT_COMMIT] {
            let prog: &mut SchedClassifier = ebpf
                .program_mut(name)
                .ok_or_else(|| Error::Load(format!("the object has no program {name}")))?
                .try_into()
                .map_err(|e| Error::Load(format!("{e}")))?;
            prog.load().map_err(|e| Error::Load(crate::verifier_log(&e)))?;
        }
        let mut take = |name: &'static str| {
            ebpf.take_map(name).ok_or_else(|| Error::Load(format!("the object has no map {name}")))
        };
        let inputs = HashMap::try_from(take("sluice_inputs")?).map_err(map_err("inputs"))?;
        let admits = HashMap::try_from(take("sluice_admits")?).map_err(map_err("admits"))?;
        let verdicts = HashMap::try_from(take("sluice_verdicts")?).map_err(map_err("verdicts"))?;
        let fib = HashMap::try_from(take("sluice_fib")?).map_err(map_err("fib"))?;
        let locks = HashMap::try_from(take("sluice_locks")?).map_err(map_err("locks"))?;
        let config = Array::try_from(take("sluice_exec_cfg")?).map_err(map_err("exec_cfg"))?;
        let stats = PerCpuArray::try_from(take("sluice_stats")?).map_err(map_err("stats"))?;
        let owners = HashMap::try_from(take("sluice_owners")?).map_err(map_err("owners"))?;
        let neigh = HashMap::try_from(take("sluice_neigh")?).map_err(map_err("neigh"))?;
        let tunnels = HashMap::try_from(take("sluice_tunnels")?).map_err(map_err("tunnels"))?;
        let remotes = HashMap::try_from(take("sluice_remotes")?).map_err(map_err("remotes"))?;
        let endpoints = HashMap::try_from(take("sluice_endpoints")?).map_err(map_err("endpoints"))?;
        let floods = HashMap::try_from(take("sluice_flood_eps")?).map_err(map_err("flood_eps"))?;
        let heard = RingBuf::try_from(take("sluice_heard")?).map_err(map_err("heard"))?;
        let switch_stats = PerCpuArray::try_from(take("sluice_switch_stats")?).map_err(map_err("switch_stats"))?;
        let meters = Array::try_from(take("sluice_meters")?).map_err(map_err("meters"))?;
        let mdb = HashMap::try_from(take("sluice_mdb")?).map_err(map_err("mdb"))?;
        let mut prefixes: LpmTrie<MapData, [u8; 16], u32> =
            LpmTrie::try_from(take("sluice_group_prefixes")?).map_err(map_err("group_prefixes"))?;
        let mut control: Array<MapData, u32> =
            Array::try_from(take("sluice_group_control")?).map_err(map_err("group_control"))?;
        write_group_classes(&mut prefixes, &mut control)?;
        let acl_v4 = LpmTrie::try_from(take("sluice_acl_v4")?).map_err(map_err("acl_v4"))?;
        let acl_v6 = LpmTrie::try_from(take("sluice_acl_v6")?).map_err(map_err("acl_v6"))?;
        let acl_ports = LpmTrie::try_from(take("sluice_acl_ports")?).map_err(map_err("acl_ports"))?;
        // (Taking over an earlier run's pins: its settings stand until changed.)
        let b = UpcallBudget::DEFAULT;
        let cfg = config.get(&0, 0).ok().filter(|c: &abi::ExecConfig| c.generation != 0).unwrap_or(abi::ExecConfig {
            upcall_rate: b.rate,
            upcall_burst: b.burst,
            ..Default::default()
        });
        Ok(Executor {
            ebpf,
            cfg,
            inputs,
            admits,
            verdicts,
            fib,
            locks,
            config,
            stats,
            owners,
            neigh,
            tunnels,
            remotes,
            endpoints,
            floods,
            heard,
            switch_stats,
            meters,
            mdb,
            acl_v4,
            acl_v6,
            acl_ports,
            _group_prefixes: prefixes,
            _group_control: control,
            dir: dir.to_path_buf(),
        })
    }

    /// Sets the current generation (every verdict of another one is a miss from now on)
    /// and the interface frames go up through (0: none; they are dropped as
    /// `upcall_lost`); the upcall budget stays what it was ([`UpcallBudget::DEFAULT`]
    /// unless set).
    pub fn configure(&mut self, generation: u64, upcall_ifindex: u32) -> Result<(), Error> {
        self.write_config(abi::ExecConfig { generation, upcall_ifindex, ..self.cfg })
    }

    /// Sets every input's upcall budget (each input's bucket keeps what it holds).
    pub fn set_upcall_budget(&mut self, b: UpcallBudget) -> Result<(), Error> {
        self.write_config(abi::ExecConfig { upcall_rate: b.rate, upcall_burst: b.burst, ..self.cfg })
    }

    /// Security groups: the kernel conntrack zone the executor tracks the switch's
    /// connections in (frames whose stage-1 mask has `X_CT`), and the timeouts it gives
    /// them (ms, indexed as [`abi::ExecConfig::ct_timeouts`]).
    pub fn set_conntrack(&mut self, zone: u16, timeouts_ms: [u32; 8]) -> Result<(), Error> {
        self.write_config(abi::ExecConfig { ct_zone: zone, ct_timeouts: timeouts_ms, ..self.cfg })
    }

    /// Security groups: writes class set `set` — address classes `addrs` (class, address,
    /// prefix length) and destination port classes `ports` (class, first, last port; class
    /// 0, what no entry covers, need not be written) — beside the set in use. Returns how
    /// many entries it wrote.
    pub fn write_acl_set(
        &mut self,
        set: u32,
        addrs: impl IntoIterator<Item = (u32, std::net::IpAddr, u8)>,
        ports: impl IntoIterator<Item = (u32, u16, u16)>,
    ) -> Result<usize, Error> {
        let mut n = 0;
        for (class, addr, len) in addrs {
            let mut k = [0u8; 20];
            k[..4].copy_from_slice(&set.to_be_bytes());
            let (trie, name) = match addr {
                std::net::IpAddr::V4(a) => {
                    k[4..8].copy_from_slice(&a.octets());
                    (&mut self.acl_v4, "acl_v4")
                }
                std::net::IpAddr::V6(a) => {
                    k[4..].copy_from_slice(&a.octets());
                    (&mut self.acl_v6, "acl_v6")
                }
            };
            trie.insert(&LpmKey::new(32 + u32::from(len), k), class, 0).map_err(map_err(name))?;
            n += 1;
        }
        for (class, first, last) in ports {
            for (port, len) in tables::port_prefixes(first, last) {
                let mut k = [0u8; 8];
                k[..4].copy_from_slice(&set.to_be_bytes());
                k[4..6].copy_from_slice(&port.to_be_bytes());
                self.acl_ports.insert(&LpmKey::new(32 + u32::from(len), k), class, 0).map_err(map_err("acl_ports"))?;
                n += 1;
            }
        }
        Ok(n)
    }

    /// Makes class set `set` the one frames are classified in, with generation
    /// `generation`, in one write (a frame never reads one set's classes with verdicts
    /// made for another's).
    pub fn use_acl_set(&mut self, generation: u64, set: u32) -> Result<(), Error> {
        self.write_config(abi::ExecConfig { generation, acl_set: set, ..self.cfg })
    }

    /// Removes every class entry of a set other than `keep` (the sets replaced).
    pub fn remove_acl_sets_but(&mut self, keep: u32) {
        let keep = keep.to_be_bytes();
        let old4: Vec<_> = self.acl_v4.keys().filter_map(Result::ok).filter(|k| k.data()[..4] != keep).collect();
        for k in old4 {
            let _ = self.acl_v4.remove(&k);
        }
        let old6: Vec<_> = self.acl_v6.keys().filter_map(Result::ok).filter(|k| k.data()[..4] != keep).collect();
        for k in old6 {
            let _ = self.acl_v6.remove(&k);
        }
        let oldp: Vec<_> = self.acl_ports.keys().filter_map(Result::ok).filter(|k| k.data()[..4] != keep).collect();
        for k in oldp {
            let _ = self.acl_ports.remove(&k);
        }
    }

    /// The switch's connections in the kernel's conntrack, for the frames the executor
    /// does not see (see [`Conntrack`]).
    pub fn conntrack(&self) -> Result<Conntrack, Error> {
        let fd = |name: &str| {
            let prog: &SchedClassifier = self
                .ebpf
                .program(name)
                .and_then(|p| p.try_into().ok())
                .ok_or_else(|| Error::Load(format!("the object has no program {name}")))?;
            let fd = prog.fd().map_err(|e| Error::Load(format!("the program {name} is not loaded ({e})")))?;
            fd.as_fd().try_clone_to_owned().map_err(|e| Error::Load(format!("duplicating {name}'s descriptor: {e}")))
        };
        Ok(Conntrack { lookup: fd(CT_LOOKUP)?, commit: fd(CT_COMMIT)? })
    }

    fn write_config(&mut self, c: abi::ExecConfig) -> Result<(), Error> {
        self.config.set(0, c, 0).map_err(map_err("exec_cfg"))?;
        self.cfg = c;
        Ok(())
    }

    /// Sets meter `kind` (`abi::METER_*`) of port slot `slot` to `m`'s rate and burst: a
    /// meter whose rate and burst stay keeps what its bucket holds, a changed one starts
    /// full.
    pub fn set_meter(&mut self, slot: u16, kind: u32, m: abi::Meter) -> Result<(), Error> {
        let at = u32::from(slot) * abi::METERS_PER_SLOT + kind;
        let old = self.meters.get(&at, 0).map_err(map_err("meters"))?;
        if (old.unit_ps, old.burst_ns) == (m.unit_ps, m.burst_ns) {
            return Ok(());
        }
        self.meters.set(at, abi::Meter { tat: 0, ..m }, 0).map_err(map_err("meters"))
    }

    /// Makes device `ifindex` an input of the switch.
    pub fn set_input(&mut self, ifindex: u32, input: &abi::Input) -> Result<(), Error> {
        self.inputs.insert(ifindex, input, 0).map_err(map_err("inputs"))
    }

    /// Device `ifindex` is no input any more: its frames go on to the host.
    pub fn clear_input(&mut self, ifindex: u32) {
        let _ = self.inputs.remove(&ifindex);
    }

    /// Installs stage 1's verdict for `key`, replacing any (a reader sees the old one or
    /// this one).
    pub fn install_admit(&mut self, key: &abi::AdmitKey, admit: &abi::Admit) -> Result<(), Error> {
        self.admits.insert(key, admit, 0).map_err(map_err("admits"))
    }

    /// Removes stage 1's verdict for `key`, if any: frames with that key miss.
    pub fn remove_admit(&mut self, key: &abi::AdmitKey) {
        let _ = self.admits.remove(key);
    }

    /// Installs stage 2's verdict for `key`, replacing any.
    pub fn install(&mut self, key: &abi::FlowKey, verdict: &abi::Verdict) -> Result<(), Error> {
        self.verdicts.insert(key, verdict, 0).map_err(map_err("verdicts"))
    }

    /// Removes stage 2's verdict for `key`, if any: frames with that key miss.
    pub fn remove_verdict(&mut self, key: &abi::FlowKey) {
        let _ = self.verdicts.remove(key);
    }

    /// Stage 2's verdict for `key`, if one is installed.
    pub fn verdict(&self, key: &abi::FlowKey) -> Option<abi::Verdict> {
        self.verdicts.get(key, 0).ok()
    }

    /// Puts station `mac` of `vlan` behind port slot `slot` (keeping the program's
    /// last-seen stamp when only the slot or flag changes).
    pub fn set_station(&mut self, vlan: u16, mac: MacAddr, slot: u32, is_static: bool) -> Result<(), Error> {
        let k = tables::fib_key(vlan, mac);
        let mut v = tables::fib_val(slot, is_static);
        if let Ok(old) = self.fib.get(&k, 0) {
            v.seen_ns = old.seen_ns;
        }
        self.fib.insert(k, v, 0).map_err(map_err("fib"))
    }

    /// Forgets station `mac` of `vlan`: frames from it are `SRC_ABSENT`, to it
    /// `DST_UNKNOWN`.
    pub fn remove_station(&mut self, vlan: u16, mac: MacAddr) {
        let _ = self.fib.remove(&tables::fib_key(vlan, mac));
    }

    /// Station `mac` of `vlan` as the table holds it: its slot, static flag and the last
    /// time the program forwarded a frame from it (`CLOCK_MONOTONIC` nanoseconds; 0: never).
    pub fn station(&self, vlan: u16, mac: MacAddr) -> Option<abi::FibVal> {
        self.fib.get(&tables::fib_key(vlan, mac), 0).ok()
    }

    /// Locks `mac` to port slot `slot` (its `mac` setting), or with `None` unlocks it.
    pub fn set_lock(&mut self, mac: MacAddr, slot: Option<u32>) -> Result<(), Error> {
        let k = abi::LockKey { mac: mac.0, pad: [0; 2] };
        match slot {
            Some(s) => self.locks.insert(k, s, 0).map_err(map_err("locks")),
            None => {
                let _ = self.locks.remove(&k);
                Ok(())
            }
        }
    }

    /// Layer 3: makes `ip` port slot `slot`'s.
    pub fn set_owner(&mut self, ip: std::net::IpAddr, slot: u32) -> Result<(), Error> {
        self.owners.insert(tables::ip_key(ip), slot, 0).map_err(map_err("owners"))
    }

    /// Layer 3: `ip` is no port's any more.
    pub fn remove_owner(&mut self, ip: std::net::IpAddr) {
        let _ = self.owners.remove(&tables::ip_key(ip));
    }

    /// IGMP/MLD snooping: group `ip` in `vlan` is registered with port set `set`, or
    /// (`None`) not registered.
    pub fn set_group(&mut self, vlan: u16, ip: std::net::IpAddr, set: Option<u32>) -> Result<(), Error> {
        let k = tables::mdb_key(vlan, ip);
        match set {
            Some(s) => self.mdb.insert(k, s, 0).map_err(map_err("mdb")),
            None => {
                let _ = self.mdb.remove(&k);
                Ok(())
            }
        }
    }

    /// Layer 3: LAN neighbour `ip`'s MAC on `vlan`.
    pub fn set_neighbour(&mut self, vlan: u16, ip: std::net::IpAddr, mac: MacAddr) -> Result<(), Error> {
        let v = abi::NeighVal { mac: mac.0, pad: [0; 2] };
        self.neigh.insert(tables::neigh_key(vlan, ip), v, 0).map_err(map_err("neigh"))
    }

    /// Layer 3: forgets LAN neighbour `ip` on `vlan`: frames routed to it go up.
    pub fn remove_neighbour(&mut self, vlan: u16, ip: std::net::IpAddr) {
        let _ = self.neigh.remove(&tables::neigh_key(vlan, ip));
    }

    /// Makes device `ifindex` a tunnel with these settings (its local address and TTL are
    /// what outputs into it are sent with).
    pub fn set_tunnel(&mut self, ifindex: u32, t: &abi::Tunnel) -> Result<(), Error> {
        self.tunnels.insert(ifindex, t, 0).map_err(map_err("tunnels"))
    }

    /// Makes `addr` one of tunnel device `ifindex`'s endpoints (its frames'
    /// stage-1 key says so).
    pub fn set_endpoint(&mut self, ifindex: u32, addr: std::net::IpAddr) -> Result<(), Error> {
        let k = abi::EndpointKey { ifindex, addr: tables::ip_key(addr).addr };
        self.endpoints.insert(k, 1, 0).map_err(map_err("endpoints"))
    }

    /// Makes `addr` no longer one of tunnel device `ifindex`'s endpoints.
    pub fn remove_endpoint(&mut self, ifindex: u32, addr: std::net::IpAddr) {
        let _ = self.endpoints.remove(&abi::EndpointKey { ifindex, addr: tables::ip_key(addr).addr });
    }

    /// Where a flood into tunnel device `ifindex` in VNI `vni` goes: every endpoint of
    /// `eps` ([`crate::convert::flood_eps`]), or — `None` — the core (floods go up).
    pub fn set_flood(&mut self, ifindex: u32, vni: u32, eps: Option<&abi::FloodEps>) -> Result<(), Error> {
        let k = abi::FloodKey { ifindex, vni };
        match eps {
            Some(v) => self.floods.insert(k, v, 0).map_err(map_err("flood_eps")),
            None => {
                let _ = self.floods.remove(&k);
                Ok(())
            }
        }
    }

    /// The flood set of tunnel device `ifindex` in VNI `vni`, as the program has it.
    pub fn flood(&self, ifindex: u32, vni: u32) -> Option<abi::FloodEps> {
        self.floods.get(&abi::FloodKey { ifindex, vni }, 0).ok()
    }

    /// Where station `mac` of VNI `vni` behind tunnel device `ifindex` is, heard from now
    /// (its last-seen stamp, which the program moves on while it hears it there).
    pub fn set_remote(&mut self, ifindex: u32, vni: u32, mac: MacAddr, addr: std::net::IpAddr) -> Result<(), Error> {
        let k = abi::RemoteKey { ifindex, vni, mac: mac.0, pad: [0; 2] };
        let mut r = abi::Remote { seen_ns: monotonic_ns(), ..abi::Remote::default() };
        match addr {
            std::net::IpAddr::V4(a) => r.addr[..4].copy_from_slice(&a.octets()),
            std::net::IpAddr::V6(a) => r.addr = a.octets(),
        }
        self.remotes.insert(k, r, 0).map_err(map_err("remotes"))
    }

    /// Where the remote table has station `mac` of VNI `vni` behind tunnel device
    /// `ifindex`, and when the program last heard it there (`CLOCK_MONOTONIC` ns).
    pub fn remote(&self, ifindex: u32, vni: u32, mac: MacAddr) -> Option<abi::Remote> {
        self.remotes.get(&abi::RemoteKey { ifindex, vni, mac: mac.0, pad: [0; 2] }, 0).ok()
    }

    /// The stations the program reported heard behind tunnels since the last call, at
    /// most `limit` (the rest stay in the ring). Records that do not read are skipped.
    pub fn take_heard(&mut self, limit: usize) -> Vec<Heard> {
        let mut out = Vec::new();
        for _ in 0..limit {
            let Some(item) = self.heard.next() else { break };
            if let Some(h) = Heard::parse(&item) {
                out.push(h);
            }
        }
        out
    }

    /// The ring's descriptor, readable when the program has reported something (for an
    /// event loop).
    pub fn heard_fd(&self) -> std::os::fd::RawFd {
        self.heard.as_raw_fd()
    }

    /// Port slot `slot`'s counters, summed over CPUs.
    pub fn counters(&self, slot: u32) -> Counters {
        crate::sum_counters(&self.stats, slot)
    }

    /// The settings as the maps hold them (after a takeover: the earlier run's, until
    /// changed).
    pub fn config(&self) -> abi::ExecConfig {
        self.cfg
    }

    fn link_pin(&self, ifname: &str, hook: Hook) -> PathBuf {
        self.dir.join(format!("{}{ifname}", hook.pin_prefix()))
    }

    /// Attaches the executor at the ingress of interface `ifname` (in this thread's
    /// network namespace) with a pinned tcx link, or — when an earlier run left a link
    /// pinned for it — puts this program into that link in one step, so forwarding never
    /// pauses. Its frames are the switch's once it is an input ([`Executor::set_input`]).
    pub fn attach(&mut self, ifname: &str) -> Result<(), Error> {
        self.attach_hook(ifname, Hook::Ingress)
    }

    /// Attaches the egress guard to the switch's end `ifname` of a guest's veth pair, or
    /// to the upcall interface, as [`Executor::attach`] does the executor: from then on
    /// only the switch's own frames ([`abi::SLUICE_MARK`]) go into the guest that way, or
    /// into the upcall interface's queue; the rest is counted, at the guest's port or in
    /// [`Executor::switch_counters`].
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
        for hook in Hook::ALL {
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
                Hook::ALL.iter().find_map(|h| n.strip_prefix(h.pin_prefix()).map(str::to_string))
            })
            .collect();
        names.sort_unstable();
        names.dedup();
        names
    }

    /// Every input, as (ifindex, entry): after a takeover, the earlier run's.
    pub fn inputs(&self) -> Vec<(u32, abi::Input)> {
        self.inputs.iter().flatten().collect()
    }

    /// Every station: (VLAN, MAC, its entry). An entry's `seen_ns` is when the program
    /// last forwarded a frame from it (`CLOCK_MONOTONIC` ns; 0: never).
    pub fn stations(&self) -> Vec<(u16, MacAddr, abi::FibVal)> {
        self.fib.iter().flatten().map(|(k, v)| (k.vlan, MacAddr(k.mac), v)).collect()
    }

    /// Layer 3: every address owned, as (address, slot).
    pub fn owners(&self) -> Vec<(std::net::IpAddr, u32)> {
        self.owners.iter().flatten().filter_map(|(k, s)| Some((tables::key_ip(k.family, &k.addr)?, s))).collect()
    }

    /// Layer 3: every LAN neighbour, as (VLAN, address, MAC).
    pub fn neighbours(&self) -> Vec<(u16, std::net::IpAddr, MacAddr)> {
        self.neigh
            .iter()
            .flatten()
            .filter_map(|(k, v)| Some((k.vlan, tables::key_ip(k.family, &k.addr)?, MacAddr(v.mac))))
            .collect()
    }

    /// The stations the remote table has behind tunnel device `ifindex`: (VNI, station,
    /// endpoint, when the program last heard it there, `CLOCK_MONOTONIC` ns).
    pub fn remotes(&self, ifindex: u32, v6: bool) -> Vec<crate::HeardStation> {
        self.remotes
            .iter()
            .flatten()
            .filter(|(k, _)| k.ifindex == ifindex)
            .map(|(k, v)| {
                let addr = if v6 {
                    std::net::IpAddr::from(v.addr)
                } else {
                    std::net::IpAddr::from([v.addr[0], v.addr[1], v.addr[2], v.addr[3]])
                };
                (k.vni, MacAddr(k.mac), addr, v.seen_ns)
            })
            .collect()
    }

    /// Forgets station `mac` of VNI `vni` behind tunnel device `ifindex`: frames to it go
    /// up until the core learns it again.
    pub fn forget_remote(&mut self, ifindex: u32, vni: u32, mac: MacAddr) {
        let _ = self.remotes.remove(&abi::RemoteKey { ifindex, vni, mac: mac.0, pad: [0; 2] });
    }

    /// Forgets the tunnel on device `ifindex`: its settings, endpoints, flood sets and remote
    /// stations.
    pub fn clear_tunnel(&mut self, ifindex: u32) {
        let _ = self.tunnels.remove(&ifindex);
        let heard: Vec<abi::RemoteKey> = self.remotes.keys().flatten().filter(|k| k.ifindex == ifindex).collect();
        for k in heard {
            let _ = self.remotes.remove(&k);
        }
        let known: Vec<abi::EndpointKey> = self.endpoints.keys().flatten().filter(|k| k.ifindex == ifindex).collect();
        for k in known {
            let _ = self.endpoints.remove(&k);
        }
        let floods: Vec<abi::FloodKey> = self.floods.keys().flatten().filter(|k| k.ifindex == ifindex).collect();
        for k in floods {
            let _ = self.floods.remove(&k);
        }
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

    /// Loads the tests' program that [`Executor::run`] runs a frame from a tunnel with
    /// ([`RunCtx::tunnel`]): it gives the frame the tunnel key a vxlan device would, then
    /// runs the executor on it. Never attached to a device.
    pub fn load_tunneled(&mut self) -> Result<(), Error> {
        let prog: &mut SchedClassifier = self
            .ebpf
            .program_mut(TUNNELED)
            .ok_or_else(|| Error::Load(format!("the object has no program {TUNNELED}")))?
            .try_into()
            .map_err(|e| Error::Load(format!("{e}")))?;
        prog.load().map_err(|e| Error::Load(crate::verifier_log(&e)))
    }

    /// Runs the program once on `frame` as if it arrived on `ctx.ifindex`, without sending
    /// anything the program redirects (copies it clones do leave): what it returned, and
    /// the frame as it left it.
    pub fn run(&self, frame: &[u8], ctx: &RunCtx) -> Result<Ran, Error> {
        let name = if ctx.tunnel.is_some() { TUNNELED } else { PROGRAM };
        let prog: &SchedClassifier = self
            .ebpf
            .program(name)
            .and_then(|p| p.try_into().ok())
            .ok_or_else(|| Error::Load(format!("the object has no program {name}")))?;
        let fd = prog.fd().map_err(|e| {
            Error::Load(format!(
                "the program {name} is not loaded ({e}); a run from a tunnel needs load_tunneled first"
            ))
        })?;
        let mut skb = SkBuff {
            mark: ctx.mark,
            ifindex: ctx.ifindex,
            gso_size: ctx.gso_size,
            gso_segs: ctx.gso_segs,
            ..SkBuff::default()
        };
        if let Some((vni, sender)) = ctx.tunnel {
            let a = tables::ip_key(sender).addr;
            skb.cb[0] = vni;
            for (w, b) in skb.cb[1..].iter_mut().zip(a.chunks_exact(4)) {
                *w = u32::from_ne_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        let mut out = vec![0u8; frame.len() + 256];
        let (code, n) = prog_test_run(fd.as_fd().as_raw_fd(), frame, &mut out, &mut skb)
            .map_err(|e| Error::Load(format!("running {PROGRAM} on a frame (BPF_PROG_TEST_RUN): {e}")))?;
        out.truncate(n);
        Ok(Ran { code, frame: out, mark: skb.mark })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_switch::Tunneled;
    use std::net::{IpAddr, Ipv6Addr};

    #[test]
    fn an_upcalls_tags_say_its_slot_and_a_tunnels_origin() {
        let frame = [0x08, 0x06, 0, 1];
        assert_eq!(
            UpcallTags::read(0x0123, &frame),
            Some(UpcallTags { slot: 0x123, tunnel: None, origin_len: 0, ct: None })
        );
        // VNI 0x12_3456 from an endpoint: 0x1234, then 0x56 << 8 | UP_ENDPOINT.
        let rest = [0x81, 0x00, 0x12, 0x34, 0x81, 0x00, 0x56, 0x01, 0x08, 0x06];
        let t = UpcallTags::read(abi::UP_TUNNEL | 7, &rest).unwrap();
        let origin = Tunneled { vni: 0x12_3456, endpoint: true };
        assert_eq!(t, UpcallTags { slot: 7, tunnel: Some(origin), origin_len: 8, ct: None });
        let stranger = [0x81, 0x00, 0, 0, 0x81, 0x00, 0x05, 0x00];
        assert_eq!(
            UpcallTags::read(abi::UP_TUNNEL, &stranger).unwrap().tunnel,
            Some(Tunneled { vni: 5, endpoint: false })
        );
        assert_eq!(UpcallTags::read(abi::UP_TUNNEL, &rest[..7]), None, "cut short");
        assert_eq!(UpcallTags::read(abi::UP_TUNNEL, &[0x88, 0xa8, 0, 0, 0x81, 0x00, 0, 0]), None, "not 802.1Q");
        // A connection's state as the executor found it, in bits 12 to 14.
        let tci = 3 | (u16::from(abi::CTS_REPLY) << abi::UP_CT_SHIFT);
        let t = UpcallTags::read(tci, &frame).unwrap();
        assert_eq!((t.slot, t.ct), (3, Some(sluice_switch::conntrack::Found::Reply)));
        assert_eq!(UpcallTags::read(3, &frame).unwrap().ct, None, "not looked up");
    }

    fn event(family: u8, addr: &[u8]) -> Vec<u8> {
        let mut e = abi::HeardEvent {
            ifindex: 7,
            slot: 3,
            vni: 5010,
            vlan: 10,
            family,
            mac: [2, 0, 0, 0, 0, 9],
            ..Default::default()
        };
        e.addr[..addr.len()].copy_from_slice(addr);
        let size = std::mem::size_of::<abi::HeardEvent>();
        // SAFETY: `e` is a `repr(C)` struct with no padding (the ABI macro refuses any):
        // its `size` bytes are all initialized.
        unsafe { std::slice::from_raw_parts((&raw const e).cast::<u8>(), size) }.to_vec()
    }

    #[test]
    fn an_event_reads_as_the_program_writes_it() {
        let h = Heard::parse(&event(abi::HEARD_V4, &[192, 0, 2, 1])).unwrap();
        assert_eq!(
            h,
            Heard {
                ifindex: 7,
                slot: 3,
                vni: 5010,
                vlan: 10,
                mac: MacAddr([2, 0, 0, 0, 0, 9]),
                sender: "192.0.2.1".parse().unwrap()
            }
        );
        let v6: Ipv6Addr = "fd78::2".parse().unwrap();
        assert_eq!(Heard::parse(&event(abi::HEARD_V6, &v6.octets())).unwrap().sender, IpAddr::V6(v6));
        assert_eq!(Heard::parse(&event(5, &[])), None, "no such family");
        assert_eq!(Heard::parse(&event(abi::HEARD_V4, &[])[..39]), None, "cut short");
    }
}

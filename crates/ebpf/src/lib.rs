//! sluice's kernel datapath: the kernel executes what the forwarding core decided
//! (docs/architecture.md, "The kernel datapath", "One brain: the kernel executes the core's
//! verdicts").
//!
//! One TC program, the executor (`bpf/exec.c`, compiled by build.rs; [`exec`]), runs at
//! the ingress of every port the kernel reaches — the switch side of a guest's veth pair,
//! an uplink, a tunnel's VXLAN device. It decides nothing: it extracts a frame's key,
//! looks up the verdict the core installed for it and executes it; a frame without one
//! goes up through the switch's upcall TAP, the core decides it and installs the verdict.
//! A second program runs at the egress of the switch side of every guest's veth, and of
//! the upcall TAP, and lets only the switch's own frames ([`abi::SLUICE_MARK`]) into the
//! guest, or into the TAP's queue. [`exec::Executor`] loads both, attaches them (tcx),
//! pins programs and maps so that forwarding outlives the daemon, writes the maps, and
//! reads counters and reports back; [`convert`] turns the core's state, keys and verdicts
//! into the maps' entries; [`heard`] hands the stations heard behind tunnels to the core.
//!
//! The maps' layouts and the constants both sides use are declared once, in
//! sluice-ebpf-abi ([`abi`]): build.rs writes the programs' C header from those
//! declarations, and a test holds the compiled programs' BTF to the Rust layouts.
//!
//! Apart from the datapath, [`tunnel_filter`] is the socket filter a user-space tunnel
//! puts on its UDP socket: datagrams from hosts that are not its endpoints are dropped in
//! the kernel.
//!
//! The few system calls the crate makes beyond aya's are safe functions in `sys`.

pub mod abi;
pub mod convert;
pub mod exec;
pub mod heard;
pub mod kfunc;
mod sys;
pub mod tables;
pub mod tunnel_filter;

use std::path::{Path, PathBuf};

use aya::maps::{MapData, PerCpuArray};
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

/// Whether this build carries the programs.
pub fn available() -> bool {
    !exec::OBJECT.is_empty()
}

/// Makes `dir` a bpffs of its own (mode 0700) unless it already is one; `/sys/fs/bpf` is
/// not used because `ip netns exec` remounts `/sys`.
pub fn ensure_bpffs(dir: &Path) -> Result<(), Error> {
    let pins = |source| Error::Pins { path: dir.to_path_buf(), source };
    std::fs::create_dir_all(dir).map_err(pins)?;
    let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes())
        .map_err(|_| pins(std::io::Error::from(std::io::ErrorKind::InvalidInput)))?;
    if sys::fs_type(&c).is_ok_and(|t| t == sys::BPF_FS_MAGIC) {
        return Ok(());
    }
    sys::mount_bpffs(&c, c"mode=0700").map_err(pins)
}

/// Whether the maps an earlier run pinned in `dir` have this build's layouts (key and value
/// sizes, and tables of `sizes`), so this run can take them over. `None` when nothing is
/// pinned there.
pub fn pins_compatible(dir: &Path, sizes: exec::Sizes) -> Option<bool> {
    use std::mem::size_of;
    let stations = Some(sizes.stations.max(1));
    let want: [(&str, usize, usize, Option<u32>); 14] = [
        ("sluice_inputs", 4, size_of::<abi::Input>(), Some(MAX_PORTS)),
        ("sluice_admits", size_of::<abi::AdmitKey>(), size_of::<abi::Admit>(), None),
        ("sluice_verdicts", size_of::<abi::FlowKey>(), size_of::<abi::Verdict>(), Some(sizes.verdicts.max(1))),
        ("sluice_fib", size_of::<abi::FibKey>(), size_of::<abi::FibVal>(), stations),
        ("sluice_locks", size_of::<abi::LockKey>(), 4, None),
        ("sluice_exec_cfg", 4, size_of::<abi::ExecConfig>(), Some(1)),
        ("sluice_stats", 4, size_of::<abi::Counters>(), Some(MAX_PORTS)),
        ("sluice_switch_stats", 4, size_of::<abi::SwitchCounters>(), Some(1)),
        ("sluice_owners", size_of::<abi::IpKey>(), 4, stations),
        ("sluice_neigh", size_of::<abi::NeighKey>(), size_of::<abi::NeighVal>(), stations),
        ("sluice_tunnels", 4, size_of::<abi::Tunnel>(), None),
        ("sluice_remotes", size_of::<abi::RemoteKey>(), size_of::<abi::Remote>(), Some(exec::remotes_size(sizes))),
        ("sluice_endpoints", size_of::<abi::EndpointKey>(), 4, None),
        ("sluice_flood_eps", size_of::<abi::FloodKey>(), size_of::<abi::FloodEps>(), None),
    ];
    if !dir.join("sluice_inputs").exists() {
        // An earlier build's datapath (its maps have other names), or nothing.
        return dir.join("sluice_stats").exists().then_some(false);
    }
    Some(want.iter().all(|&(name, k, v, n)| {
        MapData::from_pin(dir.join(name)).and_then(|m| m.info()).is_ok_and(|i| {
            i.key_size() as usize == k && i.value_size() as usize == v && n.is_none_or(|n| i.max_entries() == n)
        })
    }))
}

/// Counters of one port slot, summed over CPUs.
pub type Counters = abi::Counters;

/// A station the kernel heard behind a tunnel: (VNI, inner MAC, remote endpoint, when
/// last as `CLOCK_MONOTONIC` nanoseconds).
pub type HeardStation = (u32, MacAddr, std::net::IpAddr, u64);

fn map_err(map: &'static str) -> impl Fn(aya::maps::MapError) -> Error {
    move |e| Error::Map { map, why: e.to_string() }
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

//! The socket filter of a user-space VXLAN tunnel (`bpf/tunnel_filter.c`): attached to the
//! tunnel's UDP socket, it drops a datagram whose outer source address is not one of the
//! tunnel's endpoints in the kernel — before it is queued on the socket or wakes the
//! switch's datapath — and counts it. docs/architecture.md, "Tunnels and the underlay".
//!
//! Each socket gets a copy of its own, with its own maps (nothing is pinned): the socket
//! holds the program once attached, and it goes when the socket is closed. The endpoints
//! are written before the filter is attached, so no datagram from one is ever refused.

use std::net::IpAddr;
use std::os::fd::BorrowedFd;

use aya::maps::{HashMap, MapData, PerCpuArray};
use aya::programs::SocketFilter;

use crate::{abi, tables};

/// Why a tunnel's socket filter could not be put in place. Each message says what to do.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Built without clang.
    #[error(
        "this sluice was built without its BPF programs (no clang or libbpf headers at build time): install them (`apt-get install clang libbpf-dev`) and build sluice again"
    )]
    NotBuilt,
    /// Loading the object or its program failed (the verifier's log is in the cause).
    #[error("loading the tunnel's socket filter into the kernel failed (it needs BPF, as root): {0}")]
    Load(String),
    /// Writing the endpoints failed.
    #[error("writing the tunnel's endpoints into its socket filter: {0}")]
    Map(String),
    /// SO_ATTACH_BPF failed.
    #[error("attaching the socket filter to the tunnel's socket: {0}")]
    Attach(String),
}

#[cfg(sluice_bpf)]
pub(crate) static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/tunnel_filter.o"));
#[cfg(not(sluice_bpf))]
pub(crate) static OBJECT: &[u8] = &[];

/// A socket filter attached to a tunnel's socket: what it refused can be read back, and
/// (an EVPN tunnel's) endpoints can be let in or out later.
pub struct TunnelFilter {
    refused: PerCpuArray<MapData, u64>,
    peers: HashMap<MapData, abi::IpKey, u32>,
}

impl TunnelFilter {
    /// Loads a filter that lets through datagrams from `endpoints` alone and attaches it
    /// to `socket` (a UDP socket of the same address family).
    pub fn attach(socket: BorrowedFd<'_>, endpoints: &[IpAddr]) -> Result<Self, Error> {
        Self::attach_with_room(socket, endpoints, endpoints.len())
    }

    /// [`TunnelFilter::attach`], with room for `room` endpoints in all ([`TunnelFilter::allow`]
    /// adds them later).
    pub fn attach_with_room(socket: BorrowedFd<'_>, endpoints: &[IpAddr], room: usize) -> Result<Self, Error> {
        if OBJECT.is_empty() {
            return Err(Error::NotBuilt);
        }
        let n = u32::try_from(room.max(endpoints.len()).max(1)).map_err(|_| Error::Map("too many endpoints".into()))?;
        let mut ebpf = aya::EbpfLoader::new()
            .set_max_entries("sluice_tunnel_peers", n)
            .load(OBJECT)
            .map_err(|e| Error::Load(format!("{e:#}")))?;
        let take = |ebpf: &mut aya::Ebpf, name: &str| {
            ebpf.take_map(name).ok_or_else(|| Error::Load(format!("the object has no map {name}")))
        };
        let mut peers: HashMap<MapData, abi::IpKey, u32> =
            HashMap::try_from(take(&mut ebpf, "sluice_tunnel_peers")?).map_err(|e| Error::Map(e.to_string()))?;
        let refused =
            PerCpuArray::try_from(take(&mut ebpf, "sluice_tunnel_refused")?).map_err(|e| Error::Map(e.to_string()))?;
        for &a in endpoints {
            peers.insert(tables::ip_key(a), 1, 0).map_err(|e| Error::Map(format!("{a}: {e}")))?;
        }
        let prog: &mut SocketFilter = ebpf
            .program_mut("sluice_tunnel_filter")
            .ok_or_else(|| Error::Load("the object has no program sluice_tunnel_filter".into()))?
            .try_into()
            .map_err(|e| Error::Load(format!("{e}")))?;
        prog.load().map_err(|e| Error::Load(crate::verifier_log(&e)))?;
        let link = prog.attach(socket).map_err(|e| Error::Attach(format!("{e}: {}", source_of(&e))))?;
        // The socket holds the program from now on. The link is taken out of the program's
        // keeping, which would detach it by the socket's descriptor number when dropped
        // (by then perhaps another socket's); the filter stays as long as the socket does.
        let _kept_by_the_socket = prog.take_link(link).map_err(|e| Error::Attach(e.to_string()))?;
        Ok(TunnelFilter { refused, peers })
    }

    /// Lets datagrams from `addr` in (false: no room left; they stay refused).
    pub fn allow(&mut self, addr: IpAddr) -> bool {
        self.peers.insert(tables::ip_key(addr), 1, 0).is_ok()
    }

    /// Refuses datagrams from `addr` again.
    pub fn forget(&mut self, addr: IpAddr) {
        let _ = self.peers.remove(&tables::ip_key(addr));
    }

    /// Datagrams the filter refused so far, summed over CPUs.
    pub fn refused(&self) -> u64 {
        self.refused.get(&0, 0).map_or(0, |per_cpu| per_cpu.iter().fold(0u64, |s, v| s.wrapping_add(*v)))
    }
}

/// The cause under an aya error, where it has one (the setsockopt's errno).
fn source_of(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cause = e.source();
    let mut last = String::new();
    while let Some(c) = cause {
        last = c.to_string();
        cause = c.source();
    }
    last
}

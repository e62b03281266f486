//! A VXLAN tunnel port (RFC 7348): one UDP socket bound to the local underlay address;
//! frames go out with an 8-byte VXLAN header to the endpoint their destination was learned
//! behind, or to every endpoint once (head-end replication). Frames come in as they
//! arrived, each with its origin (VNI, sender; [`Port::origin`]): which ones the switch
//! takes — from the configured endpoints (`remotes`) only, unless `remotes_only = false`;
//! of a VNI the port carries; the VLAN that VNI is — is the switch's decision (its stage
//! 1, `sluice_switch::decide`), and where a station is behind the tunnel the port learns
//! when the switch, after its checks, says so ([`Port::learn_remote`]). The kernel builds
//! the outer IP and UDP headers and their checksums. The table and the VNI map are
//! `sluice_switch::tunnel`'s; this file is the I/O (docs/architecture.md, "VXLAN tunnels",
//! "Tunnels and the underlay", "One brain").
//!
//! With `remotes_only`, a socket filter ([`sluice_ebpf::tunnel_filter`]) drops datagrams
//! from other senders in the kernel, before they are queued on the socket or wake the
//! datapath; the port hands the filter's count to the switch as `unknown_endpoint` drops
//! ([`Port::take_refused`]) and leaves it out of the socket's kernel drops, which count it
//! too. Where the filter cannot be loaded the port says so once; the switch's decision
//! refuses such datagrams then, as it does any that pass the filter.
//!
//! Datagrams leave from one of [`SOURCE_PORTS`] sockets bound to `local` with ports the
//! kernel chose, picked by a hash of the inner flow (RFC 7348 §5: the outer source port
//! is the underlay's ECMP entropy); they arrive on the tunnel port's socket. The port takes
//! GSO frames whole: it cuts one into segments with complete inner checksums
//! ([`sluice_wire::segment`]), each behind its VXLAN header, and hands the kernel a run of
//! them in one `sendmsg` (`UDP_SEGMENT`), so what leaves is still what any VXLAN endpoint
//! can read. The receiving socket has `UDP_GRO`: one read takes a run of datagrams of one
//! sender, which the port hands to the switch one frame at a time.
//!
//! On the kernel datapath the tunnel is also a `vxlan` device in external mode in the
//! switch's namespace, its socket in the underlay's: the TC program sends known unicast
//! into it with a tunnel key and reads the key of what arrives, learning stations in a map
//! ([`Heard`] brings them here once a second). The port's sockets then only send what the
//! core sends (floods, frames from user-space ports), and the device receives everything
//! (the port's own receiving socket is bound to an ephemeral port and refuses what comes).

use std::io;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::sync::mpsc;
use std::time::Instant;

use sluice_switch::port::DeviceDrops;
use sluice_switch::tunnel::{Endpoints, Origin, TunnelRules, VniMap};
use sluice_switch::{DropCause, OutFrame, Port, PortCaps, PortError, TxOutcome};
use sluice_sys::udp;
use sluice_wire::vxlan::{self, VXLAN_HDR_LEN};
use sluice_wire::{MacAddr, VNET_HDR_LEN, VnetHdr};

use sluice_api::config::{PortSpec, VxlanSettings};
use sluice_sys::error::{Context, Failure};
use sluice_sys::netns;

use crate::{Attachment, Error, Kind, Result};

/// Opens the tunnel of vxlan port `spec` in the port's namespace; on the kernel datapath
/// (`kernel_device`: the name its kernel device gets) the kernel device receives and the
/// port only sends. The MTU is the spec's, else the underlay's less the tunnel's overhead.
pub fn attach(spec: &PortSpec, kernel_device: Option<&str>) -> Result<Attachment> {
    let v = spec.vxlan().map_err(Failure::msg)?.expect("a vxlan port has vxlan settings");
    let mtu = match spec.mtu {
        Some(m) => m,
        None => inner_mtu(spec.netns.as_deref(), v.local)
            .with_context(|| format!("port {:?}: finding the underlay's MTU", spec.name))?,
    };
    let (settings, send_only) = (v.clone(), kernel_device.is_some());
    let mut p = netns::run_in(spec.netns.as_deref(), move || VxlanPort::open(&settings, send_only))
        .with_context(|| format!("opening vxlan port {:?}", spec.name))?;
    let kernel = match kernel_device {
        Some(device) => {
            Some(p.add_device(&spec.name, &v, device, spec.netns.as_deref(), mtu).map_err(|e| match e {
                e @ Error::TunnelNameTaken { .. } => e,
                e => Failure::new(format!("making the kernel device {device} of vxlan port {:?}", spec.name), e).into(),
            })?)
        }
        None => None,
    };
    let fd = p.raw_fd();
    Ok(Attachment { port: Box::new(p), fd, kind: Kind::Tunnel { mtu, kernel } })
}

/// Stations learned behind one tunnel port at most.
const MAX_STATIONS: usize = 8192;
/// Endpoints learned (besides the configured ones) at most, when the port accepts any
/// sender.
const MAX_ENDPOINTS: usize = 256;
/// The tunnel socket's receive and send buffers: a window of full-size datagrams between
/// two reads (the default 208 KiB dropped a quarter of a single TCP stream's segments).
const SOCKET_BUFFER: libc::c_int = 8 << 20;
/// Datagrams one `recv` refuses at most (runts, datagrams too big, datagrams to a
/// send-only socket) before it returns: like the switch's batch, a bound on the work an
/// underlay sender can make one call do.
const REFUSED_PER_CALL: usize = 64;
/// Aging of learned stations and endpoints (the switch's default).
pub const AGING_MS: u64 = 300_000;
/// The sockets datagrams leave from, one per outer source port; the inner flow's hash
/// picks one.
pub const SOURCE_PORTS: usize = 16;
/// Runs a merge may read beyond the one it started in.
const READS_AHEAD: usize = 4;
/// The read buffer of the receiving socket: a run of datagrams `UDP_GRO` coalesced (at
/// most 64 KiB of UDP payload), or one datagram of any size UDP allows.
const RUN_BUFFER: usize = 64 * 1024 + 1024;
/// The receive buffer of a send socket: nothing is read from them, so what an underlay
/// host sends to their ports is held in a few kilobytes and dropped beyond.
const SEND_SOCKET_RCVBUF: libc::c_int = 4096;

/// What the kernel datapath heard behind a tunnel, sent to its port once a second.
pub struct Heard {
    /// Stations and the endpoints they were heard from, with when (monotonic ns).
    pub stations: Vec<sluice_ebpf::HeardStation>,
    /// The monotonic clock when they were read (ns).
    pub now_ns: u64,
    /// Datagrams the kernel could not read so far (no tunnel key).
    pub refused: u64,
}

/// A tunnel's kernel device, as the kernel datapath needs to know it.
pub struct KernelTunnel {
    /// The device's index in the switch's namespace.
    pub ifindex: u32,
    /// Its name (`sx` and a hash of the switch's and port's names).
    pub device: String,
    /// The underlay address frames leave from.
    pub local: IpAddr,
    /// Which VNI carries which frames.
    pub vnis: VniMap,
    /// The configured remote endpoints.
    pub remotes: Vec<IpAddr>,
    /// Where the kernel side sends what it heard.
    pub heard: mpsc::Sender<Heard>,
}

/// The alias sluice gives the vxlan devices it makes (an interface of the device's name
/// without it is someone else's and is never deleted).
const DEVICE_ALIAS: &str = "sluice vxlan port";

/// The port's kernel device (kernel datapath only).
struct Device {
    name: String,
    ifindex: u32,
    heard: mpsc::Receiver<Heard>,
    /// The kernel's count of datagrams it refused.
    refused: u64,
}

/// A run of datagrams one read took (`UDP_GRO`), handed to the switch one at a time.
struct Run {
    buf: Vec<u8>,
    /// Bytes read.
    len: usize,
    /// Where the next datagram starts.
    at: usize,
    /// Each datagram's size (the last may be shorter).
    segment: usize,
    /// The sender of them all.
    from: IpAddr,
}

impl Run {
    /// Where the next datagram lies, if any is left.
    fn peek(&self) -> Option<std::ops::Range<usize>> {
        (self.at < self.len).then(|| self.at..(self.at + self.segment.max(1)).min(self.len))
    }

    /// The next datagram's bounds, taking it.
    fn next(&mut self) -> Option<std::ops::Range<usize>> {
        let r = self.peek()?;
        self.at = r.end;
        Some(r)
    }
}

/// A VXLAN tunnel attached to the switch.
pub struct VxlanPort {
    sock: UdpSocket,
    /// The sockets datagrams leave from (see [`SOURCE_PORTS`]).
    senders: Vec<UdpSocket>,
    dstport: u16,
    vnis: VniMap,
    table: Endpoints,
    start: Instant,
    /// Datagrams refused on the way in (too short, no I flag, a frame too big for the
    /// buffer, any datagram to the send-only socket).
    bad_in: u64,
    /// Where the frame the last `recv` returned came from.
    last: Option<Origin>,
    /// Whom the port takes datagrams from (its `remotes`, and whether only them).
    remotes: Vec<IpAddr>,
    remotes_only: bool,
    /// Frames that could not go out (no endpoint to send to, a VLAN with no VNI, a send
    /// error).
    lost_out: u64,
    /// One outgoing datagram: the header, then the frame.
    out: Vec<u8>,
    /// A GSO frame's datagrams back to back; and where each segment is built.
    run_out: Vec<u8>,
    scratch: Vec<u8>,
    /// The datagrams the last read took, not yet handed to the switch.
    run_in: Run,
    /// The UDP socket table of the socket's namespace (/proc/net/udp or udp6, opened from
    /// inside it) and the socket's inode: the kernel's count of datagrams it dropped for
    /// this socket (a full receive buffer) is read from there.
    udp_table: Option<(std::fs::File, u64)>,
    /// The kernel device, on the kernel datapath.
    device: Option<Device>,
    /// The socket filter refusing unknown senders in the kernel, and how many of its
    /// refusals the switch has been told of.
    filter: Option<(sluice_ebpf::tunnel_filter::TunnelFilter, u64)>,
    /// EVPN: stations and flood lists come from routes.
    evpn: bool,
    /// EVPN: the endpoints the routes name now (let in by the filter).
    announced: Vec<IpAddr>,
}

impl VxlanPort {
    /// Binds the tunnel's socket (in the calling thread's network namespace): to the tunnel
    /// port, or — `send_only`, when a kernel device receives — to an ephemeral one.
    pub fn open(v: &VxlanSettings, send_only: bool) -> io::Result<Self> {
        let port = if send_only { 0 } else { v.dstport };
        let sock = UdpSocket::bind(SocketAddr::new(v.local, port)).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!(
                    "binding UDP {}:{} for the tunnel: {e} (is {} an address of this host, and is the port free — a kernel vxlan device on it?)",
                    v.local, v.dstport, v.local
                ),
            )
        })?;
        sock.set_nonblocking(true)?;
        sluice_sys::packet::grow_socket_buffers(sock.as_raw_fd(), SOCKET_BUFFER);
        if !send_only && let Err(e) = udp::enable_gro(sock.as_raw_fd()) {
            tracing::warn!(local = %v.local, dstport = v.dstport, "the tunnel reads one datagram per call (UDP_GRO: {e})");
        }
        let senders = (0..SOURCE_PORTS).map(|_| send_socket(v.local)).collect::<io::Result<Vec<_>>>()?;
        let filter = if v.remotes_only && !send_only {
            // (An EVPN tunnel lets in the endpoints its routes name, as they come.)
            let room = if v.evpn { v.remotes.len() + MAX_ENDPOINTS } else { v.remotes.len() };
            match sluice_ebpf::tunnel_filter::TunnelFilter::attach_with_room(sock.as_fd(), &v.remotes, room) {
                Ok(f) => Some((f, 0)),
                Err(e) => {
                    tracing::warn!(
                        local = %v.local,
                        dstport = v.dstport,
                        "the tunnel's datagrams from hosts not among its remotes are refused by the switch itself, not in the kernel: {e}"
                    );
                    None
                }
            }
        } else {
            None
        };
        let table = if v.local.is_ipv4() { "udp" } else { "udp6" };
        let udp_table = std::fs::File::open(format!("/proc/thread-self/net/{table}")).ok().zip(
            std::fs::metadata(format!("/proc/self/fd/{}", sock.as_raw_fd())).ok().map(|m| {
                use std::os::unix::fs::MetadataExt;
                m.ino()
            }),
        );
        Ok(VxlanPort {
            sock,
            senders,
            dstport: v.dstport,
            vnis: v.vnis.clone(),
            table: {
                let t = Endpoints::new(v.remotes.clone(), v.remotes_only, MAX_STATIONS, MAX_ENDPOINTS, AGING_MS);
                if v.evpn { t.evpn() } else { t }
            },
            evpn: v.evpn,
            announced: Vec::new(),
            start: Instant::now(),
            bad_in: 0,
            last: None,
            remotes: v.remotes.clone(),
            remotes_only: v.remotes_only,
            lost_out: 0,
            out: Vec::with_capacity(VXLAN_HDR_LEN + 65_536),
            run_out: Vec::with_capacity(2 * 65_536),
            scratch: vec![0; 65_536],
            run_in: Run { buf: vec![0; RUN_BUFFER], len: 0, at: 0, segment: 0, from: v.local },
            udp_table,
            device: None,
            filter,
        })
    }

    /// Makes the kernel device `name` of tunnel port `port` (kernel datapath): a `vxlan`
    /// device in external mode in the calling process's namespace whose socket (on
    /// `v.dstport`) lives in the underlay's namespace `netns` (the process's own if `None`),
    /// with MTU `mtu`, up.
    /// A device of that name an earlier run of sluice left is replaced; any other is
    /// refused. Returns what the kernel datapath needs to know of it.
    pub fn add_device(
        &mut self,
        port: &str,
        v: &VxlanSettings,
        name: &str,
        netns: Option<&str>,
        mtu: u16,
    ) -> Result<KernelTunnel> {
        if let Ok(old) = sluice_sys::link::ifindex(name) {
            if !is_ours(name) {
                return Err(Error::TunnelNameTaken { port: port.to_string(), name: name.to_string(), index: old });
            }
            ip(None, &["link", "del", name])?;
        }
        let pid = std::process::id().to_string();
        let port = v.dstport.to_string();
        ip(netns, &["link", "add", name, "netns", &pid, "type", "vxlan", "external", "dstport", &port]).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("{e} (only one external vxlan device may use UDP port {port} in a namespace: is another switch's tunnel, or a kernel vxlan device with `external`, there?)"),
            )
        })?;
        let made = (|| {
            ip(None, &["link", "set", name, "alias", DEVICE_ALIAS])?;
            sluice_sys::link::set_mtu(name, mtu)
                .map_err(|e| io::Error::new(e.kind(), format!("setting MTU {mtu} on {name}: {e}")))?;
            sluice_sys::link::disable_ipv6(name)?;
            sluice_sys::link::set_up(name).map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!(
                        "bringing {name} up: {e} (is UDP port {port} in use in the underlay's namespace, by a user-space tunnel, say?)"
                    ),
                )
            })?;
            sluice_sys::link::ifindex(name)
        })();
        let ifindex = match made {
            Ok(i) => i,
            Err(e) => {
                let _ = ip(None, &["link", "del", name]);
                return Err(e.into());
            }
        };
        let (tx, rx) = mpsc::channel();
        self.device = Some(Device { name: name.to_string(), ifindex, heard: rx, refused: 0 });
        Ok(KernelTunnel {
            ifindex,
            device: name.to_string(),
            local: v.local,
            vnis: v.vnis.clone(),
            remotes: v.remotes.clone(),
            heard: tx,
        })
    }

    /// The descriptor the event loop watches.
    pub fn raw_fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }

    fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    /// The VNI of the switch's VLAN `vlan` on this tunnel.
    fn vni_of(&self, vlan: u16) -> Option<u32> {
        match self.vnis {
            VniMap::Single(v) => Some(v),
            VniMap::PerVlan(_) => self.vnis.vni_of(Some(vlan)),
        }
    }
}

impl VxlanPort {
    /// Reads the next run of datagrams (one, or several of one sender and size) into
    /// `run_in`: false when nothing is waiting. A run refused — cut short (larger than any
    /// frame the switch takes) or sent to the send-only socket of a tunnel whose device
    /// receives — is counted and left empty.
    fn read_run(&mut self) -> io::Result<bool> {
        let Some(got) = udp::recv_segments(self.sock.as_raw_fd(), &mut self.run_in.buf)? else {
            return Ok(false);
        };
        let run = &mut self.run_in;
        (run.len, run.at) = (0, 0);
        if got.truncated || self.device.is_some() {
            self.bad_in += 1;
            return Ok(true);
        }
        run.len = got.len;
        run.segment = got.segment.unwrap_or(got.len);
        run.from = got.from.ip();
        Ok(true)
    }
}

impl Drop for VxlanPort {
    /// The kernel device goes with the port (if it is still the one made).
    fn drop(&mut self) {
        if let Some(d) = &self.device
            && sluice_sys::link::ifindex(&d.name).ok() == Some(d.ifindex)
            && let Err(e) = ip(None, &["link", "del", &d.name])
        {
            tracing::warn!(port = %d.name, "removing the tunnel's device: {e}");
        }
    }
}

/// A socket datagrams leave from: bound to `local` and a port the kernel chooses, with the
/// tunnel's send buffer and almost no receive buffer (it is never read).
fn send_socket(local: IpAddr) -> io::Result<UdpSocket> {
    let s = UdpSocket::bind(SocketAddr::new(local, 0))
        .map_err(|e| io::Error::new(e.kind(), format!("binding a UDP send socket on {local} for the tunnel: {e}")))?;
    s.set_nonblocking(true)?;
    if sluice_sys::proc::set_int_option(&s, libc::SOL_SOCKET, libc::SO_SNDBUFFORCE, SOCKET_BUFFER).is_err() {
        let _ = sluice_sys::proc::set_int_option(&s, libc::SOL_SOCKET, libc::SO_SNDBUF, SOCKET_BUFFER);
    }
    let _ = sluice_sys::proc::set_int_option(&s, libc::SOL_SOCKET, libc::SO_RCVBUF, SEND_SOCKET_RCVBUF);
    Ok(s)
}

/// Which of [`SOURCE_PORTS`] send sockets carries an inner frame: a hash of its flow (the
/// 5-tuple the switch's connection tracker reads, [`sluice_switch::conntrack::read_flow`]),
/// else of its first 14 bytes. `frame` is an untagged Ethernet frame, or any 12 bytes
/// followed by the EtherType and what comes after it (the 12 are read only for frames
/// that are not IP).
fn source_index(frame: &[u8]) -> usize {
    use std::hash::{Hash, Hasher};
    // The standard library's SipHash with fixed keys: the same flow leaves from the same
    // port for the switch's lifetime.
    let mut h = std::hash::DefaultHasher::new();
    match sluice_switch::conntrack::read_flow(frame).and_then(|(f, ..)| f.tuple) {
        Some(t) => t.hash(&mut h),
        None => frame.get(..14).hash(&mut h),
    }
    (h.finish() % SOURCE_PORTS as u64) as usize
}

/// Runs `ip ARGS` (in namespace `netns`, if given); the error says what `ip` said.
fn ip(netns: Option<&str>, args: &[&str]) -> io::Result<()> {
    let mut cmd = std::process::Command::new("ip");
    if let Some(ns) = netns {
        cmd.args(["-n", ns]);
    }
    let out = cmd.args(args).output()?;
    if out.status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!("`ip {}`: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim())))
    }
}

/// Whether interface `name` is a vxlan device sluice made (by its alias).
fn is_ours(name: &str) -> bool {
    std::process::Command::new("ip")
        .args(["-j", "-d", "link", "show", name])
        .output()
        .ok()
        .and_then(|o| serde_json::from_slice::<serde_json::Value>(&o.stdout).ok())
        .is_some_and(|v| {
            v[0]["ifalias"].as_str() == Some(DEVICE_ALIAS) && v[0]["linkinfo"]["info_kind"].as_str() == Some("vxlan")
        })
}

/// A device's counter from sysfs (0 when it cannot be read).
fn device_stat(name: &str, what: &str) -> u64 {
    std::fs::read_to_string(format!("/sys/class/net/{name}/statistics/{what}"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// The `drops` column of the socket with inode `ino` in a /proc/net/udp(6) table.
fn socket_drops(table: &std::fs::File, ino: u64) -> Option<u64> {
    use std::os::unix::fs::FileExt;
    // A table of a few sockets; a namespace with thousands is read in part (the count is
    // then missing, not wrong).
    let mut buf = vec![0u8; 64 * 1024];
    let n = table.read_at(&mut buf, 0).ok()?;
    udp_table_drops(std::str::from_utf8(&buf[..n]).ok()?, ino)
}

/// Parses a /proc/net/udp(6) text: the last column (`drops`) of the line whose `inode`
/// column (the 10th) is `ino`.
fn udp_table_drops(text: &str, ino: u64) -> Option<u64> {
    text.lines().skip(1).find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.get(9)?.parse::<u64>().ok()? == ino).then(|| f.last()?.parse().ok())?
    })
}

/// The MTU of the interface holding `local` in namespace `netns` (the daemon's own if
/// `None`), less the tunnel's overhead: the largest inner MTU that crosses without
/// fragmenting (the overhead counts the outer Ethernet, IP, UDP and VXLAN headers; the
/// inner frame's Ethernet header rides inside the outer payload).
pub fn inner_mtu(netns: Option<&str>, local: IpAddr) -> io::Result<u16> {
    let overhead = if local.is_ipv4() { vxlan::VXLAN_OVERHEAD_V4 } else { vxlan::VXLAN_OVERHEAD_V6 };
    let mut cmd = std::process::Command::new("ip");
    if let Some(ns) = netns {
        cmd.args(["-n", ns]);
    }
    let out = cmd.args(["-j", "addr", "show"]).output()?;
    if !out.status.success() {
        return Err(io::Error::other(format!("ip addr show: {}", String::from_utf8_lossy(&out.stderr).trim())));
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).map_err(io::Error::other)?;
    let mtu = v
        .as_array()
        .into_iter()
        .flatten()
        .find(|l| {
            l["addr_info"].as_array().into_iter().flatten().any(|a| a["local"].as_str().and_then(|x| x.parse::<IpAddr>().ok()) == Some(local))
        })
        .and_then(|l| l["mtu"].as_u64())
        .ok_or_else(|| {
            io::Error::other(format!(
                "{local} is not an address of {} (`ip{} addr show` lists them); a tunnel binds to one of its host's addresses",
                netns.map_or("this host".to_string(), |n| format!("namespace {n}")),
                netns.map(|n| format!(" -n {n}")).unwrap_or_default()
            ))
        })?;
    let inner = (mtu as usize).saturating_sub(overhead).max(68);
    u16::try_from(inner.min(9000)).map_err(io::Error::other)
}

impl Port for VxlanPort {
    fn kind(&self) -> &'static str {
        "vxlan"
    }

    fn caps(&self) -> PortCaps {
        PortCaps { offload: true, lossless_input: false }
    }

    fn recv(&mut self, buf: &mut [u8]) -> Result<Option<usize>, PortError> {
        // The inner frame goes to buf[VNET_HDR_LEN], with the room for a tag the switch's
        // buffers keep.
        let room = buf.len().saturating_sub(VNET_HDR_LEN + 4);
        self.last = None;
        for _ in 0..REFUSED_PER_CALL {
            let Some(datagram) = self.run_in.next() else {
                match self.read_run() {
                    Ok(true) => continue,
                    Ok(false) => return Ok(None),
                    Err(e) => return Err(PortError::Io(e)),
                }
            };
            let Ok((vni, inner)) = vxlan::decap(&self.run_in.buf[datagram]) else {
                self.bad_in += 1;
                continue;
            };
            if inner.len() > room {
                self.bad_in += 1;
                continue;
            }
            // Whether it is taken, and in which VLAN, is the switch's decision.
            self.last = Some(Origin { vni, sender: self.run_in.from });
            let (head, out) = buf.split_at_mut(VNET_HDR_LEN);
            let out = &mut out[..room];
            // More of the run behind it: the segments of one TCP flow that follow on go to
            // the switch as one GSO frame.
            if self.run_in.peek().is_some()
                && let Some(mut merge) = sluice_wire::gro::Merge::start(inner, out)
            {
                let (sender, mut reads) = (self.run_in.from, 0);
                loop {
                    let Some(next) = self.run_in.peek() else {
                        // The run ends, the frame may not: a sender's frame too large for
                        // one send comes as two runs (a few reads ahead at most).
                        reads += 1;
                        if reads <= READS_AHEAD
                            && merge.is_open()
                            && matches!(self.read_run(), Ok(true))
                            && self.run_in.from == sender
                        {
                            continue;
                        }
                        break;
                    };
                    match vxlan::decap(&self.run_in.buf[next]) {
                        Ok((v, inner)) if v == vni && merge.push(inner, out) => {}
                        _ => break,
                    }
                    self.run_in.next();
                }
                let (len, hdr) = merge.finish(out);
                hdr.emit(head.try_into().expect("the virtio header's length"));
                return Ok(Some(len));
            }
            out[..inner.len()].copy_from_slice(inner);
            head.fill(0);
            return Ok(Some(inner.len()));
        }
        // A run of datagrams refused here (counted): the rest waits for the next turn of the
        // event loop, so an underlay host sending garbage cannot hold the datapath (the
        // socket stays readable and the loop comes back to it).
        Ok(None)
    }

    fn send(&mut self, f: &OutFrame<'_>) -> Result<TxOutcome, PortError> {
        let vid = f.tag.map(|t| u16::from_be_bytes([t[2], t[3]]) & 0x0fff);
        let Some(vni) = self.vnis.vni_of(vid) else {
            self.lost_out += 1;
            return Ok(TxOutcome::Sent);
        };
        let Ok(dst) = <[u8; 6]>::try_from(&f.macs[..6.min(f.macs.len())]) else {
            self.lost_out += 1;
            return Ok(TxOutcome::Sent);
        };
        let Ok(mut hdr) = VnetHdr::parse(&f.vnet) else {
            return Err(PortError::Refused(DropCause::Malformed));
        };
        self.out.clear();
        self.out.extend_from_slice(&vxlan::header(vni));
        self.out.extend_from_slice(f.macs);
        // A per-VLAN tunnel carries the VLAN in the VNI; a single-VNI port is an access
        // port and gets no tag.
        match f.tag {
            Some(tag) if matches!(self.vnis, VniMap::Single(_)) => self.out.extend_from_slice(&tag),
            // (The switch counted the tag in the checksum's offset.)
            Some(_) => hdr.csum_start = hdr.csum_start.saturating_sub(4),
            None => {}
        }
        let rest_at = self.out.len();
        self.out.extend_from_slice(f.rest);
        let source = source_index(&self.out[rest_at - 12..]);
        let now = self.now_ms();
        // What goes to each endpoint: one datagram, or a GSO frame's segments, each behind
        // the header, in runs of equal-sized datagrams the kernel sends as one.
        let (buf, segment): (&[u8], usize) = if hdr.is_gso() {
            if self.table.fanout(vni, MacAddr(dst), now) > 1 {
                // Sent to several endpoints, a frame costs its segments at each: bounded,
                // as the switch bounds the floods of ports it cuts frames for.
                let segments = (f.rest.len() / usize::from(hdr.gso_size.max(1))).max(1);
                if segments * self.table.fanout(vni, MacAddr(dst), now) > sluice_switch::FLOOD_DATAGRAMS_PER_FRAME {
                    return Err(PortError::Refused(DropCause::GsoLimit));
                }
            }
            self.run_out.clear();
            let (run, header) = (&mut self.run_out, &self.out[..VXLAN_HDR_LEN]);
            let mut first = 0;
            let cut = sluice_wire::segment(&self.out[VXLAN_HDR_LEN..], &hdr, &mut self.scratch, |seg| {
                run.extend_from_slice(header);
                run.extend_from_slice(seg);
                if first == 0 {
                    first = VXLAN_HDR_LEN + seg.len();
                }
                true
            });
            if cut.is_err() || first == 0 {
                return Err(PortError::Refused(DropCause::Malformed));
            }
            (&self.run_out, first)
        } else {
            if hdr.needs_csum() && sluice_wire::fill_partial_checksum(&mut self.out[VXLAN_HDR_LEN..], &hdr).is_err() {
                return Err(PortError::Refused(DropCause::Malformed));
            }
            (&self.out, self.out.len())
        };
        // Runs the kernel takes in one send: at most its segment count, within a datagram.
        let per_send = (udp::MAX_SEND / segment).clamp(1, udp::MAX_SEGMENTS) * segment;
        let (fd, port) = (self.senders[source].as_raw_fd(), self.dstport);
        let (mut sent, mut busy, mut lost) = (0u64, 0u64, 0u64);
        self.table.targets(vni, MacAddr(dst), now, |ep| {
            let to = SocketAddr::new(ep, port);
            for (i, chunk) in buf.chunks(per_send).enumerate() {
                match udp::send_segments(fd, to, chunk, segment) {
                    Ok(true) => {}
                    // Nothing of this copy left yet: it may be offered again.
                    Ok(false) if i == 0 => return busy += 1,
                    Ok(false) | Err(_) => return lost += 1,
                }
            }
            sent += 1;
        });
        // Full only when no copy left: offering the frame again must not send a second
        // copy to an endpoint that took the first.
        if busy > 0 && sent == 0 && lost == 0 {
            return Ok(TxOutcome::Full);
        }
        lost += busy;
        self.lost_out += lost;
        if sent == 0 && lost == 0 {
            // Nowhere to send: no remote configured or heard from yet.
            self.lost_out += 1;
        }
        Ok(TxOutcome::Sent)
    }

    fn tunnel(&self) -> Option<TunnelRules> {
        Some(TunnelRules {
            vnis: self.vnis.clone(),
            remotes_only: self.remotes_only,
            remotes: self.remotes.clone(),
            evpn: self.evpn,
            announced: self.announced.clone(),
        })
    }

    fn pin_remote(&mut self, vni: u32, mac: MacAddr, endpoint: Option<IpAddr>) {
        self.table.pin(vni, mac, endpoint);
    }

    fn set_flood(&mut self, vni: u32, endpoints: &[IpAddr]) {
        self.table.set_flood(vni, endpoints);
    }

    fn set_announced(&mut self, endpoints: &[IpAddr]) {
        self.table.set_announced(endpoints);
        if let Some((f, _)) = self.filter.as_mut() {
            for gone in self.announced.iter().filter(|a| !endpoints.contains(a) && !self.remotes.contains(a)) {
                f.forget(*gone);
            }
            for &new in endpoints.iter().filter(|a| !self.announced.contains(a)) {
                if !f.allow(new) {
                    tracing::warn!(endpoint = %new, "the tunnel's socket filter has no room for another EVPN endpoint: its datagrams are refused");
                }
            }
        }
        self.announced = endpoints.to_vec();
    }

    fn origin(&self) -> Option<Origin> {
        self.last
    }

    fn learn_remote(&mut self, vni: u32, mac: MacAddr, sender: IpAddr) {
        let now = self.now_ms();
        self.table.learn(vni, mac, sender, now);
    }

    fn take_refused(&mut self) -> Option<(DropCause, u64)> {
        let (f, told) = self.filter.as_mut()?;
        let n = f.refused();
        let new = n.checked_sub(*told).filter(|&d| d > 0)?;
        *told = n;
        Some((DropCause::UnknownEndpoint, new))
    }

    fn device_drops(&self) -> Option<DeviceDrops> {
        let mut kernel = self.udp_table.as_ref().and_then(|(f, ino)| socket_drops(f, *ino)).unwrap_or(0);
        if let Some((f, _)) = &self.filter {
            // The socket's drops count the filter's refusals too. The filter counts first
            // and is read last, so a refusal under way is never taken for a full buffer.
            kernel = kernel.saturating_sub(f.refused());
        }
        let mut d = DeviceDrops { to_guest: self.lost_out, from_guest: self.bad_in + kernel };
        if let Some(dev) = &self.device {
            d.to_guest += device_stat(&dev.name, "tx_dropped") + device_stat(&dev.name, "tx_errors");
            d.from_guest += dev.refused + device_stat(&dev.name, "rx_dropped") + device_stat(&dev.name, "rx_errors");
        }
        Some(d)
    }

    fn fast_path(&self) -> Option<u32> {
        self.device.as_ref().map(|d| d.ifindex)
    }

    fn fast_path_offload(&self) -> bool {
        // The device segments GSO frames and fills checksums itself.
        self.device.is_some()
    }

    fn endpoint_of(&self, vlan: u16, mac: MacAddr) -> Option<String> {
        self.table.endpoint_of(self.vni_of(vlan)?, mac).map(|a| a.to_string())
    }

    fn fanout(&self, vlan: u16, dst: MacAddr) -> usize {
        self.vni_of(vlan).map_or(1, |vni| self.table.fanout(vni, dst, self.now_ms()))
    }

    fn floods_to(&self, vlan: u16) -> Vec<IpAddr> {
        let mut v = Vec::new();
        if let Some(vni) = self.vni_of(vlan) {
            self.table.targets(vni, MacAddr::BROADCAST, self.now_ms(), |ep| v.push(ep));
        }
        v
    }

    fn routed_endpoint(&self, vni: u32, mac: MacAddr) -> Option<IpAddr> {
        self.table.routed(vni, mac)
    }

    fn tick(&mut self) -> Option<String> {
        let now = self.now_ms();
        if let Some(d) = self.device.as_mut() {
            while let Ok(h) = d.heard.try_recv() {
                d.refused = h.refused;
                for (vni, mac, endpoint, seen_ns) in h.stations {
                    let ago_ms = h.now_ns.saturating_sub(seen_ns) / 1_000_000;
                    self.table.learn(vni, mac, endpoint, now.saturating_sub(ago_ms));
                }
            }
        }
        self.table.expire(now);
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Receives from `p` until a frame from `want` comes (a bounded number of tries),
    /// returning the senders of the frames before it.
    fn senders_before(p: &mut VxlanPort, want: IpAddr) -> Vec<IpAddr> {
        let mut buf = vec![0u8; 2048];
        let mut before = Vec::new();
        for _ in 0..1000 {
            match p.recv(&mut buf) {
                Ok(Some(_)) => {
                    let o = p.origin().expect("a frame has an origin");
                    assert_eq!(o.vni, 5000);
                    if o.sender == want {
                        return before;
                    }
                    before.push(o.sender);
                }
                Ok(None) => std::thread::sleep(std::time::Duration::from_millis(1)),
                Err(e) => panic!("{e}"),
            }
        }
        panic!("no frame came");
    }

    fn settings(remotes_only: bool) -> VxlanSettings {
        VxlanSettings {
            local: "127.0.0.1".parse().unwrap(),
            remotes: vec!["127.0.0.2".parse().unwrap()],
            remotes_only,
            evpn: false,
            vnis: VniMap::Single(5000),
            dstport: 0,
        }
    }

    /// A datagram of VNI 5000 whose inner frame is a broadcast from 02:00:00:00:00:01.
    fn datagram() -> Vec<u8> {
        let mut d = vxlan::header(5000).to_vec();
        d.extend_from_slice(&[0xff; 6]);
        d.extend_from_slice(&[0x02, 0, 0, 0, 0, 1, 0x88, 0xb5]);
        d.extend_from_slice(&[0; 46]);
        d
    }

    #[test]
    fn a_station_is_learned_behind_its_sender_only_when_the_switch_says_so() {
        let mut p = VxlanPort::open(&settings(false), false).unwrap();
        let to = p.sock.local_addr().unwrap();
        let remote = UdpSocket::bind("127.0.0.2:0").unwrap();
        remote.send_to(&datagram(), to).unwrap();
        let from: IpAddr = "127.0.0.2".parse().unwrap();
        assert!(senders_before(&mut p, from).is_empty());
        let src = MacAddr([0x02, 0, 0, 0, 0, 1]);
        assert_eq!(p.table.endpoint_of(5000, src), None, "learned before the switch's checks");
        assert_eq!(p.fanout(1, src), 1, "one remote: where an unknown station's frames go");
        p.learn_remote(5000, src, from);
        assert_eq!(p.table.endpoint_of(5000, src), Some(from));
        assert_eq!(p.endpoint_of(1, src), Some("127.0.0.2".into()));
    }

    #[test]
    fn an_unknown_senders_datagram_is_refused_in_the_kernel_or_else_left_to_the_switch() {
        let v = settings(true);
        let mut p = VxlanPort::open(&v, false).unwrap();
        assert_eq!(p.tunnel().map(|t| (t.remotes_only, t.remotes)), Some((true, v.remotes.clone())));
        let to = p.sock.local_addr().unwrap();
        let datagram = datagram();
        let (remote, stranger) = (UdpSocket::bind("127.0.0.2:0").unwrap(), UdpSocket::bind("127.0.0.3:0").unwrap());
        let both = || {
            stranger.send_to(&datagram, to).unwrap();
            remote.send_to(&datagram, to).unwrap();
        };
        let (from_remote, from_stranger): (IpAddr, IpAddr) =
            ("127.0.0.2".parse().unwrap(), "127.0.0.3".parse().unwrap());
        if p.filter.is_some() {
            // The filter takes the stranger's datagram; the switch is told of it.
            both();
            assert!(senders_before(&mut p, from_remote).is_empty());
            assert_eq!(p.take_refused(), Some((DropCause::UnknownEndpoint, 1)));
            assert_eq!(p.take_refused(), None);
            assert_eq!(p.device_drops().unwrap().from_guest, 0, "not a full buffer");
            sluice_sys::proc::set_int_option(&p.raw_fd(), libc::SOL_SOCKET, libc::SO_DETACH_FILTER, 0).unwrap();
            p.filter = None;
        } else {
            assert!(!is_root(), "as root the filter loads");
        }
        // Without the filter the stranger's frame comes with its origin, which the switch's
        // decision refuses (`unknown_endpoint`).
        both();
        assert_eq!(senders_before(&mut p, from_remote), [from_stranger]);
        assert_eq!(p.take_refused(), None);
    }

    fn is_root() -> bool {
        sluice_sys::user::euid() == 0
    }

    /// An untagged IPv4 TCP frame 10.0.0.1:`sport` -> 10.0.0.2:80 with `payload` bytes
    /// (the checksums left for whoever sends it).
    fn tcp_frame(sport: u16, payload: usize) -> Vec<u8> {
        let mut f = vec![0x02, 0, 0, 0, 0, 2, 0x02, 0, 0, 0, 0, 1, 0x08, 0x00];
        let total = (20 + 20 + payload) as u16;
        f.extend_from_slice(&[
            0x45,
            0,
            (total >> 8) as u8,
            total as u8,
            0,
            1,
            0x40,
            0,
            64,
            6,
            0,
            0,
            10,
            0,
            0,
            1,
            10,
            0,
            0,
            2,
        ]);
        f.extend_from_slice(&sport.to_be_bytes());
        f.extend_from_slice(&[0, 80, 0, 0, 0, 1, 0, 0, 0, 1, 0x50, 0x18, 0xff, 0xff, 0, 0, 0, 0]);
        f.extend((0..payload).map(|i| (i * 13) as u8));
        f
    }

    /// A port sending to a UDP socket on 127.0.0.2 (its only remote), and that socket.
    fn port_and_receiver() -> (VxlanPort, UdpSocket) {
        let remote = UdpSocket::bind("127.0.0.2:0").unwrap();
        let mut v = settings(false);
        v.dstport = remote.local_addr().unwrap().port();
        remote.set_read_timeout(Some(std::time::Duration::from_secs(5))).unwrap();
        (VxlanPort::open(&v, true).unwrap(), remote)
    }

    fn send_frame(p: &mut VxlanPort, frame: &[u8], vnet: VnetHdr) {
        let mut h = [0u8; VNET_HDR_LEN];
        vnet.emit(&mut h);
        let out = OutFrame { vnet: h, macs: &frame[..12], tag: None, rest: &frame[12..] };
        assert!(matches!(p.send(&out), Ok(TxOutcome::Sent)));
    }

    #[test]
    fn different_inner_flows_leave_from_different_source_ports() {
        let (mut p, remote) = port_and_receiver();
        let mut ports = std::collections::BTreeMap::new();
        let mut buf = vec![0u8; 2048];
        for sport in 1000..1032u16 {
            let frame = tcp_frame(sport, 10);
            for _ in 0..2 {
                send_frame(&mut p, &frame, VnetHdr::default());
                let (n, from) = remote.recv_from(&mut buf).unwrap();
                assert_eq!(&buf[VXLAN_HDR_LEN..n], &frame[..]);
                assert_eq!(ports.entry(sport).or_insert(from.port()), &from.port(), "one flow, one source port");
            }
        }
        let distinct: std::collections::BTreeSet<_> = ports.values().collect();
        assert!(distinct.len() > 4, "32 flows from {} source ports", distinct.len());
        assert!(!distinct.contains(&p.dstport));
    }

    #[test]
    fn a_gso_frame_leaves_as_segments_with_complete_checksums() {
        let (mut p, remote) = port_and_receiver();
        let (payload, mss) = (20_000usize, 1448u16);
        let frame = tcp_frame(4000, payload);
        let vnet = VnetHdr {
            flags: VnetHdr::F_NEEDS_CSUM,
            gso_type: VnetHdr::GSO_TCPV4,
            gso_size: mss,
            hdr_len: 54,
            csum_start: 34,
            csum_offset: 16,
            ..VnetHdr::default()
        };
        send_frame(&mut p, &frame, vnet);
        let mut buf = vec![0u8; 4096];
        let mut got = Vec::new();
        while got.len() < payload {
            let (n, _) = remote.recv_from(&mut buf).unwrap();
            let (vni, seg) = vxlan::decap(&buf[..n]).unwrap();
            assert_eq!(vni, 5000);
            let ip = &seg[14..];
            assert_eq!(sluice_wire::checksum::fold(sluice_wire::checksum::sum(&ip[..20], 0)), 0, "IPv4 header");
            let l4 = &ip[20..];
            let pseudo = sluice_wire::checksum::pseudo_v4([10, 0, 0, 1], [10, 0, 0, 2], 6, l4.len() as u32);
            assert_eq!(sluice_wire::checksum::fold(sluice_wire::checksum::sum(l4, pseudo)), 0, "TCP checksum");
            let seq = u32::from_be_bytes(l4[4..8].try_into().unwrap());
            assert_eq!(seq as usize - 1, got.len(), "in order");
            assert!(l4.len() - 20 <= usize::from(mss));
            got.extend_from_slice(&l4[20..]);
        }
        assert_eq!(got, &frame[54..]);
    }

    #[test]
    fn a_gso_frame_sent_by_one_port_arrives_at_another_as_one_gso_frame() {
        // The receiver: a port on 127.0.0.2 whose remote is the sender's address.
        let mut v = settings(false);
        v.local = "127.0.0.2".parse().unwrap();
        v.remotes = vec!["127.0.0.1".parse().unwrap()];
        let mut rx = VxlanPort::open(&v, false).unwrap();
        let mut s = settings(false);
        s.dstport = rx.sock.local_addr().unwrap().port();
        s.remotes = vec![v.local];
        let mut tx = VxlanPort::open(&s, true).unwrap();
        // 45 segments: more than one send carries, so two runs of datagrams.
        let frame = tcp_frame(4000, 64_000);
        let vnet = VnetHdr {
            flags: VnetHdr::F_NEEDS_CSUM,
            gso_type: VnetHdr::GSO_TCPV4,
            gso_size: 1448,
            hdr_len: 54,
            csum_start: 34,
            csum_offset: 16,
            ..VnetHdr::default()
        };
        send_frame(&mut tx, &frame, vnet);
        let mut buf = vec![0u8; sluice_switch::pool::FRAME_BUF_LEN];
        let mut payload = Vec::new();
        let mut gso_frames = 0;
        for _ in 0..1000 {
            match rx.recv(&mut buf).unwrap() {
                Some(n) => {
                    assert_eq!(rx.origin().map(|o| o.sender), Some(s.local));
                    let h = VnetHdr::parse(&buf[..VNET_HDR_LEN]).unwrap();
                    let f = &buf[VNET_HDR_LEN..VNET_HDR_LEN + n];
                    if h.is_gso() {
                        gso_frames += 1;
                        assert_eq!((h.gso_size, h.csum_start, h.csum_offset), (1448, 34, 16));
                    }
                    payload.extend_from_slice(&f[54..]);
                    if payload.len() >= 64_000 {
                        break;
                    }
                }
                None => std::thread::sleep(std::time::Duration::from_millis(1)),
            }
        }
        assert_eq!(payload, &frame[54..], "the stream, whole and in order");
        assert_eq!(gso_frames, 1, "the segments merged again, across the two runs");
    }

    #[test]
    fn a_sockets_drops_are_found_by_its_inode() {
        let t = "   sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode ref pointer drops\n\
  1: 0100A8C0:12B5 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 41235 2 0000000000000000 17\n\
  2: 00000000:0044 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 999 2 0000000000000000 0\n";
        assert_eq!(udp_table_drops(t, 41235), Some(17));
        assert_eq!(udp_table_drops(t, 999), Some(0));
        assert_eq!(udp_table_drops(t, 5), None);
        assert_eq!(udp_table_drops("", 5), None);
    }
}

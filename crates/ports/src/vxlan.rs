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
//! The port has no offloads: the switch cuts GSO frames and completes checksums before
//! they get here, so what leaves is what any VXLAN endpoint can read.
//!
//! On the kernel datapath the tunnel is also a `vxlan` device in external mode in the
//! switch's namespace, its socket in the underlay's: the TC program sends known unicast
//! into it with a tunnel key and reads the key of what arrives, learning stations in a map
//! ([`Heard`] brings them here once a second). The port's socket then only sends what the
//! core sends (floods, frames from user-space ports), from an ephemeral source port, and
//! the device receives everything.

use std::io;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::sync::mpsc;
use std::time::Instant;

use sluice_switch::port::DeviceDrops;
use sluice_switch::tunnel::{Endpoints, Origin, TunnelRules, VniMap};
use sluice_switch::{DropCause, OutFrame, Port, PortCaps, PortError, TxOutcome};
use sluice_wire::vxlan::{self, VXLAN_HDR_LEN};
use sluice_wire::{MacAddr, VNET_HDR_LEN};

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

/// A VXLAN tunnel attached to the switch.
pub struct VxlanPort {
    sock: UdpSocket,
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
        PortCaps { offload: false, lossless_input: false }
    }

    fn recv(&mut self, buf: &mut [u8]) -> Result<Option<usize>, PortError> {
        // The datagram lands so that its inner frame starts at buf[VNET_HDR_LEN], with the
        // room for a tag the switch's buffers keep.
        let at = VNET_HDR_LEN - VXLAN_HDR_LEN;
        self.last = None;
        for _ in 0..REFUSED_PER_CALL {
            let room = buf.len().saturating_sub(at + 4);
            let (n, from) = match self.sock.recv_from(&mut buf[at..at + room]) {
                Ok(r) => r,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(PortError::Io(e)),
            };
            if n == room || self.device.is_some() {
                // Possibly cut short (a datagram larger than any frame the switch takes), or
                // sent to the send-only socket of a tunnel whose device receives.
                self.bad_in += 1;
                continue;
            }
            let Ok((vni, inner)) = vxlan::decap(&buf[at..at + n]) else {
                self.bad_in += 1;
                continue;
            };
            let len = inner.len();
            // Whether it is taken, and in which VLAN, is the switch's decision.
            self.last = Some(Origin { vni, sender: from.ip() });
            buf[..VNET_HDR_LEN].fill(0);
            return Ok(Some(len));
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
        self.out.clear();
        self.out.extend_from_slice(&vxlan::header(vni));
        self.out.extend_from_slice(f.macs);
        // A per-VLAN tunnel carries the VLAN in the VNI; a single-VNI port is an access
        // port and gets no tag.
        if matches!(self.vnis, VniMap::Single(_))
            && let Some(tag) = f.tag
        {
            self.out.extend_from_slice(&tag);
        }
        self.out.extend_from_slice(f.rest);
        let now = self.now_ms();
        let (out, sock, port) = (&self.out, &self.sock, self.dstport);
        let (mut sent, mut busy, mut lost) = (0u64, 0u64, 0u64);
        self.table.targets(vni, MacAddr(dst), now, |ep| match sock.send_to(out, SocketAddr::new(ep, port)) {
            Ok(_) => sent += 1,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => busy += 1,
            Err(_) => lost += 1,
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

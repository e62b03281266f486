//! A veth port: the switch's end of a veth pair whose other end is in the guest's
//! namespace, forwarded by the kernel datapath (docs/architecture.md, "The kernel
//! datapath"). The TC program on this interface handles what it can; what it hands up
//! reaches the core through the switch's upcall TAP, never through this port, so `recv`
//! never has a frame. The core's frames for the guest (floods, answers, frames from user-
//! space ports) leave through a send-only packet socket on the interface, with virtio
//! headers, so GSO frames cross whole, and with the switch's mark: the egress program on
//! the interface lets nothing else into the guest (docs/architecture.md, "Frames into
//! guests on the kernel datapath").
//!
//! A port with `netns` has its pair made by the switch: the switch's end named as the port,
//! the guest's end (`ifname`) made directly inside the namespace and brought up, the pair
//! marked with [`MADE_ALIAS`]. A later run (a restart, a start after a stop) adopts a pair
//! so marked instead of making another — the guest keeps its interface and its addresses —
//! and `port del` removes only a pair so marked ([`remove_made`]); the pair also goes when
//! the guest's namespace does. An interface of the port's name the switch did not make is
//! never taken over.

use std::io;
use std::os::fd::{AsRawFd, RawFd};

use sluice_switch::{OutFrame, Port, PortCaps, PortError, TxOutcome};

use sluice_api::config::PortSpec;
use sluice_sys::error::Context;
use sluice_sys::{link, packet};

use crate::{Attachment, Result};

/// The interface alias marking a veth pair the switch made for a port with `netns`.
pub const MADE_ALIAS: &str = "sluice: veth pair made for a port";

/// Opens the switch's end of the veth pair of port `spec`, with MTU `mtu`: with `netns`,
/// first makes the pair (or adopts the one an earlier run made).
pub fn attach(spec: &PortSpec, mtu: u16) -> Result<Attachment> {
    if let Some(ns) = &spec.netns {
        make_pair(&spec.name, spec.guest_ifname(), ns, mtu).with_context(|| {
            format!(
                "making the veth pair of port {:?} (its end {:?} in namespace {ns})",
                spec.name,
                spec.guest_ifname()
            )
        })?;
    }
    let v =
        VethPort::open(&spec.name, spec.offload, mtu).with_context(|| format!("opening veth port {:?}", spec.name))?;
    let fd = v.raw_fd();
    Ok(Attachment::new(Box::new(v), fd))
}

/// Makes the veth pair `name` (here) — `ifname` (in namespace `ns`, MTU `mtu` on both
/// ends) unless the pair an earlier run made is there; an interface `name` the switch did
/// not make is refused. Nothing is left behind when it fails.
fn make_pair(name: &str, ifname: &str, ns: &str, mtu: u16) -> io::Result<()> {
    if link::ifindex(name).is_ok() {
        if is_made(name) {
            return Ok(());
        }
        return Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!(
                "interface {name} exists and the switch did not make it; choose another port name, or leave out `netns` to attach an existing pair by its switch-side end"
            ),
        ));
    }
    // The namespace is opened and checked once; `ip` enters that one through our descriptor
    // (never the path again, which could lead elsewhere by now).
    let file = sluice_sys::netns::open(ns)?;
    let target = format!("/proc/{}/fd/{}", std::process::id(), file.as_raw_fd());
    let mtu = mtu.to_string();
    ip(&["link", "add", name, "mtu", &mtu, "type", "veth", "peer", "name", ifname, "mtu", &mtu, "netns", &target])?;
    let guest = ifname.to_string();
    let done = ip(&["link", "set", "dev", name, "alias", MADE_ALIAS])
        .and_then(|()| sluice_sys::netns::run_in_file(Some(file), move || ip(&["link", "set", "dev", &guest, "up"])));
    if let Err(e) = done {
        let _ = ip(&["link", "del", "dev", name]);
        return Err(e);
    }
    Ok(())
}

/// Whether interface `name` (here) is the switch's end of a pair the switch made.
pub fn is_made(name: &str) -> bool {
    sluice_sys::names::check_ifname(name).is_ok()
        && std::fs::read_to_string(format!("/sys/class/net/{name}/ifalias")).is_ok_and(|a| a.trim_end() == MADE_ALIAS)
}

/// Removes the veth pair of port `name` if the switch made it (both ends go); true if it
/// did.
pub fn remove_made(name: &str) -> io::Result<bool> {
    if !is_made(name) {
        return Ok(false);
    }
    ip(&["link", "del", "dev", name])?;
    Ok(true)
}

/// Runs `ip ARGS` in the calling thread's namespace; the error says what `ip` said.
fn ip(args: &[&str]) -> io::Result<()> {
    let out = std::process::Command::new("ip").args(args).stdin(std::process::Stdio::null()).output()?;
    if out.status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!("`ip {}`: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim())))
    }
}

/// The switch's end of a veth pair.
pub struct VethPort {
    ifindex: u32,
    sock: packet::PacketSocket,
    offload: bool,
}

impl VethPort {
    /// Opens existing veth interface `name` (in the calling thread's namespace) as a port:
    /// checks that it is a veth, sets its MTU, turns IPv6 off on it (the host must not talk
    /// into the guest's link), brings it up, and opens the socket the core sends through.
    pub fn open(name: &str, offload: bool, mtu: u16) -> io::Result<Self> {
        let ifindex = link::ifindex(name)?;
        let driver = link::driver(name).unwrap_or_default();
        if driver != "veth" {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{name} is not a veth interface (driver {driver:?}); a veth port is the switch's end of a veth pair, e.g. `ip link add {name} type veth peer name eth0 netns GUEST`"
                ),
            ));
        }
        link::set_mtu(name, mtu).map_err(|e| io::Error::new(e.kind(), format!("setting MTU {mtu} on {name}: {e}")))?;
        link::disable_ipv6(name)?;
        link::set_up(name)?;
        let sock = packet::open_tx(ifindex as i32, sluice_ebpf::abi::SLUICE_MARK)?;
        let offload = offload && sock.vnet;
        Ok(VethPort { ifindex, sock, offload })
    }

    /// The descriptor the event loop watches (writable again after `Full`).
    pub fn raw_fd(&self) -> RawFd {
        self.sock.fd.as_raw_fd()
    }
}

impl Port for VethPort {
    fn kind(&self) -> &'static str {
        "veth"
    }

    fn caps(&self) -> PortCaps {
        PortCaps { offload: self.offload, lossless_input: false }
    }

    fn recv(&mut self, _buf: &mut [u8]) -> Result<Option<usize>, PortError> {
        Ok(None)
    }

    fn send(&mut self, f: &OutFrame<'_>) -> Result<TxOutcome, PortError> {
        let tag;
        let mut parts: [&[u8]; 4] = [&[]; 4];
        let mut n = 0;
        if self.sock.vnet {
            parts[n] = &f.vnet;
            n += 1;
        }
        parts[n] = f.macs;
        n += 1;
        if let Some(t) = f.tag {
            tag = t;
            parts[n] = &tag;
            n += 1;
        }
        parts[n] = f.rest;
        n += 1;
        match packet::send(self.sock.fd.as_raw_fd(), &parts[..n]) {
            Ok(true) => Ok(TxOutcome::Sent),
            Ok(false) => Ok(TxOutcome::Full),
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENXIO | libc::ENODEV)) => Err(PortError::Gone(e)),
            Err(e) => Err(PortError::Io(e)),
        }
    }

    fn fast_path(&self) -> Option<u32> {
        Some(self.ifindex)
    }
}

//! An in-memory port, for tests and benchmarks of the forwarding core.
//!
//! The test keeps a [`MemHandle`] to inject frames and collect what the switch sent; the
//! switch owns the [`MemPort`]. A transmit limit makes the port report
//! [`TxOutcome::Full`], which is how tests exercise the lossless rule. In `repeat` mode
//! the port produces the same frame again and again and counts what it is sent without
//! storing it, so that forwarding can be measured without allocation. Given tunnel rules,
//! it is a tunnel: each frame injected with an origin reports it, and it records the
//! stations the switch tells it are behind which sender.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use sluice_wire::{MacAddr, VNET_HDR_LEN, VnetHdr};

use crate::counters::DropCause;
use crate::port::{OutFrame, Port, PortCaps, PortError, TxOutcome};
use crate::tunnel::{Endpoints, Origin, TunnelRules};

/// A station a tunnel was told is behind a sender: (VNI, MAC, sender).
pub type Remote = (u32, MacAddr, std::net::IpAddr);

#[derive(Default)]
struct Inner {
    rx: VecDeque<(Vec<u8>, Option<Origin>)>,
    repeat: Option<(Vec<u8>, u64)>,
    tx: Vec<(VnetHdr, Vec<u8>)>,
    record: bool,
    tx_count: u64,
    tx_limit: Option<usize>,
    gone: bool,
    mac: Option<MacAddr>,
    tick: Option<String>,
    fast: Option<u32>,
    refused: Option<(DropCause, u64)>,
    tunnel: Option<TunnelRules>,
    /// A tunnel's routes (EVPN): its stations, flood lists and further endpoints.
    routes: Option<Endpoints>,
    origin: Option<Origin>,
    remotes: Vec<Remote>,
}

/// The switch's side of an in-memory port.
pub struct MemPort {
    inner: Arc<Mutex<Inner>>,
    caps: PortCaps,
}

/// The test's side of an in-memory port.
#[derive(Clone)]
pub struct MemHandle {
    inner: Arc<Mutex<Inner>>,
}

/// A new in-memory port with the given capabilities, recording what it is sent.
pub fn mem_port(caps: PortCaps) -> (MemPort, MemHandle) {
    let inner = Arc::new(Mutex::new(Inner { record: true, ..Inner::default() }));
    (MemPort { inner: inner.clone(), caps }, MemHandle { inner })
}

fn lock(m: &Mutex<Inner>) -> MutexGuard<'_, Inner> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl MemHandle {
    /// Queues a frame for the switch to receive, with its virtio header.
    pub fn inject(&self, vnet: VnetHdr, frame: &[u8]) {
        let mut bytes = vec![0u8; VNET_HDR_LEN];
        let mut h = [0u8; VNET_HDR_LEN];
        vnet.emit(&mut h);
        bytes.copy_from_slice(&h);
        bytes.extend_from_slice(frame);
        lock(&self.inner).rx.push_back((bytes, None));
    }

    /// Queues a frame (no offloads) that a tunnel received from `origin`.
    pub fn inject_from(&self, origin: Origin, frame: &[u8]) {
        let mut bytes = vec![0u8; VNET_HDR_LEN];
        bytes.extend_from_slice(frame);
        lock(&self.inner).rx.push_back((bytes, Some(origin)));
    }

    /// Queues raw bytes (virtio header and frame, possibly malformed).
    pub fn inject_raw(&self, bytes: &[u8]) {
        lock(&self.inner).rx.push_back((bytes.to_vec(), None));
    }

    /// Makes the port a tunnel with these rules (before it is attached: the switch reads
    /// them then).
    pub fn set_tunnel(&self, rules: TunnelRules) {
        let mut i = lock(&self.inner);
        // (Stations it is told it learned are recorded, not kept: `take_remotes`.)
        let t = Endpoints::new(rules.remotes.clone(), rules.remotes_only, 8192, 256, u64::MAX / 4);
        i.routes = Some(if rules.evpn { t.evpn() } else { t });
        i.tunnel = Some(rules);
    }

    /// Takes the stations the switch said are behind which sender ([`Port::learn_remote`]),
    /// in order.
    pub fn take_remotes(&self) -> Vec<Remote> {
        std::mem::take(&mut lock(&self.inner).remotes)
    }

    /// Makes the port produce `frame` `times` times without storing copies.
    pub fn repeat(&self, vnet: VnetHdr, frame: &[u8], times: u64) {
        let mut h = [0u8; VNET_HDR_LEN];
        vnet.emit(&mut h);
        let mut bytes = h.to_vec();
        bytes.extend_from_slice(frame);
        lock(&self.inner).repeat = Some((bytes, times));
    }

    /// Stops storing transmitted frames (they are still counted).
    pub fn stop_recording(&self) {
        lock(&self.inner).record = false;
    }

    /// Frames received by the switch not yet read.
    pub fn pending(&self) -> usize {
        let i = lock(&self.inner);
        i.rx.len() + i.repeat.as_ref().map_or(0, |r| r.1 as usize)
    }

    /// Takes the frames the switch sent (virtio header, Ethernet frame).
    pub fn take_sent(&self) -> Vec<(VnetHdr, Vec<u8>)> {
        std::mem::take(&mut lock(&self.inner).tx)
    }

    /// Frames sent to this port so far.
    pub fn sent_count(&self) -> u64 {
        lock(&self.inner).tx_count
    }

    /// Makes the port's device disappear: every later receive and send fails for good.
    pub fn vanish(&self) {
        lock(&self.inner).gone = true;
    }

    /// Gives the port's device a MAC address (as an uplink's interface has).
    pub fn set_mac(&self, mac: Option<MacAddr>) {
        lock(&self.inner).mac = mac;
    }

    /// Makes the port reachable by a kernel datapath under handle `h` (see
    /// [`Port::fast_path`]).
    pub fn set_fast_path(&self, h: Option<u32>) {
        lock(&self.inner).fast = h;
    }

    /// Makes the port's next tick report a device change (as an uplink's failover does).
    pub fn change_device(&self, what: &str) {
        lock(&self.inner).tick = Some(what.to_string());
    }

    /// Makes the port report `n` frames refused below it for `cause` (as a tunnel's socket
    /// filter does) when the switch next asks ([`Port::take_refused`]).
    pub fn refuse_below(&self, cause: DropCause, n: u64) {
        lock(&self.inner).refused = Some((cause, n));
    }

    /// Makes `send` report Full while `limit` frames are stored and not taken.
    pub fn set_tx_limit(&self, limit: Option<usize>) {
        lock(&self.inner).tx_limit = limit;
    }
}

impl Port for MemPort {
    fn kind(&self) -> &'static str {
        "mem"
    }

    fn caps(&self) -> PortCaps {
        self.caps
    }

    fn mac(&self) -> Option<MacAddr> {
        lock(&self.inner).mac
    }

    fn fast_path(&self) -> Option<u32> {
        lock(&self.inner).fast
    }

    fn tick(&mut self) -> Option<String> {
        lock(&self.inner).tick.take()
    }

    fn take_refused(&mut self) -> Option<(DropCause, u64)> {
        lock(&self.inner).refused.take()
    }

    fn tunnel(&self) -> Option<TunnelRules> {
        lock(&self.inner).tunnel.clone()
    }

    fn origin(&self) -> Option<Origin> {
        lock(&self.inner).origin
    }

    fn learn_remote(&mut self, vni: u32, mac: MacAddr, sender: std::net::IpAddr) {
        lock(&self.inner).remotes.push((vni, mac, sender));
    }

    fn pin_remote(&mut self, vni: u32, mac: MacAddr, endpoint: Option<std::net::IpAddr>) {
        if let Some(t) = lock(&self.inner).routes.as_mut() {
            t.pin(vni, mac, endpoint);
        }
    }

    fn set_flood(&mut self, vni: u32, endpoints: &[std::net::IpAddr]) {
        if let Some(t) = lock(&self.inner).routes.as_mut() {
            t.set_flood(vni, endpoints);
        }
    }

    fn set_announced(&mut self, endpoints: &[std::net::IpAddr]) {
        if let Some(t) = lock(&self.inner).routes.as_mut() {
            t.set_announced(endpoints);
        }
    }

    fn floods_to(&self, vlan: u16) -> Vec<std::net::IpAddr> {
        let i = lock(&self.inner);
        let (Some(r), Some(t)) = (i.tunnel.as_ref(), i.routes.as_ref()) else { return Vec::new() };
        let mut v = Vec::new();
        if let Some(vni) = r.vnis.vni_of(Some(vlan)) {
            t.targets(vni, MacAddr::BROADCAST, 0, |ep| v.push(ep));
        }
        v
    }

    fn routed_endpoint(&self, vni: u32, mac: MacAddr) -> Option<std::net::IpAddr> {
        lock(&self.inner).routes.as_ref()?.routed(vni, mac)
    }

    fn recv(&mut self, buf: &mut [u8]) -> Result<Option<usize>, PortError> {
        let mut i = lock(&self.inner);
        if i.gone {
            return Err(PortError::Gone(std::io::Error::from_raw_os_error(77)));
        }
        if let Some((bytes, left)) = i.repeat.as_mut()
            && *left > 0
        {
            *left -= 1;
            let n = bytes.len().min(buf.len());
            buf[..n].copy_from_slice(&bytes[..n]);
            return Ok(Some(n.saturating_sub(VNET_HDR_LEN)));
        }
        let Some((bytes, origin)) = i.rx.pop_front() else { return Ok(None) };
        i.origin = origin;
        if bytes.len() > buf.len() {
            // As a TAP does: the frame is consumed and the read fails.
            return Err(PortError::Io(std::io::Error::from_raw_os_error(14)));
        }
        let n = bytes.len();
        buf[..n].copy_from_slice(&bytes[..n]);
        if n < VNET_HDR_LEN {
            buf[n..VNET_HDR_LEN].fill(0);
        }
        Ok(Some(n.saturating_sub(VNET_HDR_LEN)))
    }

    fn send(&mut self, frame: &OutFrame<'_>) -> Result<TxOutcome, PortError> {
        let mut i = lock(&self.inner);
        if i.gone {
            return Err(PortError::Gone(std::io::Error::from_raw_os_error(77)));
        }
        if i.tx_limit.is_some_and(|l| i.tx.len() >= l) {
            return Ok(TxOutcome::Full);
        }
        i.tx_count += 1;
        if i.record {
            let mut bytes = vec![0u8; frame.len()];
            frame.copy_frame_to(&mut bytes);
            let vnet = VnetHdr::parse(&frame.vnet).unwrap_or_default();
            i.tx.push((vnet, bytes));
        }
        Ok(TxOutcome::Sent)
    }
}

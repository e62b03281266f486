//! Frames arriving: read from a port (or handed up by a kernel datapath), each is
//! validated (virtio and Ethernet headers, GSO bounds), untagged if its input's VLAN rule
//! admits it, given its traffic class, and its [`Key`] read; what it teaches is learned
//! (its source's station, an address its port learns, a tunnel's endpoint), and it is
//! decided once and handed on to be executed.

use std::net::{IpAddr, Ipv4Addr};

use sluice_wire::neigh::{self, Neigh};
use sluice_wire::{
    ETH_HDR_LEN, ETHERTYPE_QINQ, ETHERTYPE_VLAN, MacAddr, VLAN_TAG_LEN, VNET_HDR_LEN, VnetHdr, gso_max_l3_len,
    parse_ethernet,
};

use super::lossless::{Hold, Placement};
use super::{PortSlot, Switch, mac_at};
use crate::class;
use crate::config::PortPolicy;
use crate::conntrack::Found;
use crate::counters::{DropCause, PortCounters};
use crate::decide::{self, Dest, Key, L3Extras, NdFacts, PortRules, Station, Tunneled};
use crate::fib::Learn;
use crate::ids::PortId;
use crate::l3::Mode;
use crate::pool::FrameMeta;
use crate::port::PortError;
use crate::tunnel::Origin;

/// The smallest segment a GSO frame may ask for (bytes of payload): Linux's floor on the
/// TCP segment size it sends (`tcp_min_snd_mss`). Below it a frame is dropped as
/// [`DropCause::GsoLimit`]: a `gso_size` of 1 would make the switch send one frame per byte.
pub const MIN_GSO_SIZE: u16 = 48;

/// The most segments one GSO frame may be cut into (a 64 KiB frame at the floor is about
/// 1,400; a BIG TCP frame of 512 KiB at a 1,448-byte segment, 362). More is
/// [`DropCause::GsoLimit`].
pub const MAX_GSO_SEGMENTS: usize = 1024;

/// What a frame's port says of it besides its bytes: from a tunnel, where its datagram
/// came from.
#[derive(Clone, Copy, Default)]
struct Arrival {
    /// The origin as the decision reads it.
    tunnel: Option<Tunneled>,
    /// The datagram's VNI and sender, when the port reported them (a tunnel the core reads
    /// itself): a station admitted from it is learned behind the sender.
    sender: Option<Origin>,
    /// Handed up by a kernel datapath that tracks connections: what its tracker found.
    ct: Option<Found>,
}

/// What a kernel datapath says of a frame it hands up ([`Switch::ingest_from`]) beyond
/// the port it came from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Handed {
    /// From a tunnel: its VNI, and whether its sender is one of the port's endpoints.
    pub tunnel: Option<Tunneled>,
    /// Security groups: what the kernel's connection tracker found of it, when the kernel
    /// looked it up.
    pub ct: Option<Found>,
}

impl Arrival {
    /// What port `s` says of the frame its `recv` just returned; `None` for a tunnel that
    /// cannot say where it came from (the frame is refused: the decision cannot place it).
    fn read(s: &PortSlot) -> Option<Arrival> {
        let Some(t) = &s.rules.tunnel else { return Some(Arrival::default()) };
        let o = s.port.origin()?;
        Some(Arrival { tunnel: Some(Tunneled { vni: o.vni, endpoint: t.knows(o.sender) }), sender: Some(o), ct: None })
    }
}

/// A received frame that is valid: its metadata (its VLAN and priority once admitted),
/// the VLAN id of the tag it came with, and its EtherType after the tag.
struct Received {
    meta: FrameMeta,
    tag: Option<u16>,
    ethertype: u16,
    /// Its input's VLAN rule takes it: the tag is gone and the GSO frame measured. A frame
    /// not admitted is left as it came, for the decision to drop.
    admitted: bool,
}

impl Switch {
    /// Receives up to one batch of frames from port `id` and forwards them. Returns true
    /// when the batch was full, so more frames may be waiting.
    pub fn on_readable(&mut self, id: PortId, now_ms: u64) -> bool {
        self.now_ms = now_ms;
        let mut n = 0;
        while n < self.cfg.batch {
            let Some(slot) = self.ports.get_mut(id as usize).and_then(Option::as_mut) else {
                break;
            };
            if slot.held.is_full() || slot.rules.failed.is_some() || slot.rate_paused_until_ms.is_some() {
                break;
            }
            let Some(fid) = self.pool.alloc() else { break };
            match slot.port.recv(self.pool.buf_mut(fid)) {
                Ok(Some(len)) => {
                    n += 1;
                    let Some(from) = Arrival::read(slot) else {
                        slot.counters.rx_frames += 1;
                        slot.counters.rx_drops.add(DropCause::Malformed);
                        self.pool.release(fid);
                        continue;
                    };
                    self.ingress(id, fid, len, from, now_ms);
                }
                Ok(None) => {
                    self.pool.release(fid);
                    break;
                }
                Err(e @ (PortError::Io(_) | PortError::Refused(_))) => {
                    // The device consumed a frame it could not hand over (for a TAP: one
                    // larger than the buffer), or the port refused it itself: it entered
                    // the switch and is lost here.
                    self.pool.release(fid);
                    let c = &mut self.ports[id as usize].as_mut().expect("checked above").counters;
                    c.rx_frames += 1;
                    c.rx_drops.add(if let PortError::Refused(cause) = e { cause } else { DropCause::Malformed });
                    n += 1;
                }
                Err(PortError::Gone(e)) => {
                    self.pool.release(fid);
                    self.fail_port(id, format!("receive failed: {e}"));
                    break;
                }
            }
        }
        self.settle();
        n == self.cfg.batch
    }

    /// Receives one frame a kernel datapath handed up (see [`crate::fastpath`]) and
    /// forwards it as if port `id` had delivered it: `fill` writes it into the switch's
    /// buffer (the 12-byte virtio header first, as [`Port::recv`](crate::Port::recv)
    /// does) and returns the port it came from and the frame's length without the header,
    /// or `None` when it has nothing. Returns false when nothing was received (no frame, no
    /// free buffer, or a port that is gone). A frame from a port that failed or is paused
    /// is received and dropped as [`DropCause::UpcallLost`]: the kernel counted it in, so
    /// the core counts its fate.
    pub fn ingest(&mut self, now_ms: u64, fill: impl FnOnce(&mut [u8]) -> Option<(PortId, usize)>) -> bool {
        self.ingest_from(now_ms, |buf| fill(buf).map(|(id, len)| (id, len, Handed::default())))
    }

    /// [`Switch::ingest`] for a kernel datapath that says more of the frame (`fill`
    /// returns it third, [`Handed`]): for a frame from a tunnel, where it came from — its
    /// VNI and whether its sender is one of the port's endpoints, which the decision reads
    /// (the kernel does not learn where the tunnel's stations are; it reports them,
    /// [`Switch::tunnel_heard`]) — and what its connection tracker found.
    pub fn ingest_from(
        &mut self,
        now_ms: u64,
        fill: impl FnOnce(&mut [u8]) -> Option<(PortId, usize, Handed)>,
    ) -> bool {
        self.now_ms = now_ms;
        let Some(fid) = self.pool.alloc() else { return false };
        let Some((id, len, handed)) = fill(self.pool.buf_mut(fid)) else {
            self.pool.release(fid);
            return false;
        };
        let Some(slot) = self.ports.get_mut(id as usize).and_then(Option::as_mut) else {
            self.pool.release(fid);
            return false;
        };
        if slot.held.is_full() || slot.rules.failed.is_some() {
            slot.counters.rx_frames += 1;
            slot.counters.rx_bytes += len as u64;
            slot.counters.rx_drops.add(DropCause::UpcallLost);
            self.pool.release(fid);
            // (Not decided: no verdict to install for it.)
            self.last_key = None;
            return true;
        }
        self.ingress(id, fid, len, Arrival { tunnel: handed.tunnel, sender: None, ct: handed.ct }, now_ms);
        self.settle();
        true
    }

    /// Receives a frame: validates it, reads its key, learns what it teaches, decides it
    /// once and executes the verdict.
    fn ingress(&mut self, id: PortId, fid: u32, len: usize, from: Arrival, now_ms: u64) {
        self.last_key = None;
        let slot = self.ports[id as usize].as_mut().expect("caller checked");
        slot.counters.rx_frames += 1;
        slot.counters.rx_bytes += len as u64;
        let buf = self.pool.buf_mut(fid);
        if slot.captured > 0 {
            let frame = &buf[VNET_HDR_LEN..(VNET_HDR_LEN + len).min(buf.len())];
            for c in self.captures.iter_mut().flatten().filter(|c| c.port == id) {
                c.offer(false, &[frame]);
            }
        }
        let Some(rx) = classify(buf, len, &slot.rules, from.tunnel, &mut slot.counters) else {
            self.pool.release(fid);
            return;
        };
        let mut meta = rx.meta;
        if rx.admitted {
            let frame = &buf[meta.start as usize..(meta.start + meta.len) as usize];
            meta.class = class::classify(&self.classes, frame, meta.pcp, &slot.name);
            slot.classes[usize::from(meta.class)].rx_frames += 1;
        }
        *self.pool.meta_mut(fid) = meta;
        let frame = self.pool.frame(fid);
        let (dst, src) = (mac_at(frame, 0), mac_at(frame, 6));
        let mut key = self.read_key(id, frame, rx.tag, rx.ethertype, rx.admitted);
        key.tunnel = from.tunnel;
        let mut flow = None;
        // (The headers the rules read, out of the pool's borrow.)
        let mut hdr = [0u8; 128];
        let mut hdr_len = 0;
        if rx.admitted && self.acl.active() {
            let frame = self.pool.frame(fid);
            hdr_len = frame.len().min(hdr.len());
            hdr[..hdr_len].copy_from_slice(&frame[..hdr_len]);
            (key.extras.acl, flow) = self.acl_extras(&hdr[..hdr_len], from.ct, now_ms);
        }
        if rx.admitted && key.dst == Dest::Group {
            key.group = self.group_class(fid, meta.vlan, now_ms);
        }
        let admission = if rx.admitted { self.learn(id, &mut key, src, meta.vlan, now_ms) } else { None };
        // (An EVPN tunnel learns nothing from datagrams: `station` is off there.)
        if admission.is_some_and(|a| a.station) {
            self.learn_remote(id, &key, &from, src);
        }
        self.owner_after_learning(fid, &mut key, admission);
        // (After learning: a frame to its own source is to its own port.)
        if self.cfg.mode == Mode::L2
            && rx.admitted
            && key.dst == Dest::Unknown
            && let Some(p) = self.fib.lookup(meta.vlan, dst, now_ms)
        {
            key.dst = Dest::Station(p);
        }
        let mut v = self.verdict.take().unwrap_or_default();
        match admission {
            Some(adm) => decide::decide_learned(&key, adm, &self.tables(), &mut v),
            None => decide::decide(&key, &self.tables(), &mut v),
        }
        if v.learn_refused
            && let Some(s) = self.slot_mut(id)
        {
            s.counters.learn_refused += 1;
        }
        self.acl_after(&key, &hdr[..hdr_len], flow, &mut v, now_ms);
        self.last_key = Some(key);
        if let Placement::Held(out) = self.execute(id, fid, &key, &v, Hold::Fresh, now_ms) {
            self.hold(id, fid, out, &key);
        }
        self.verdict = Some(v);
    }

    /// What the decision reads of a frame from port `id` (`frame`, untagged if
    /// `admitted`; the VLAN id of the tag it came with, its EtherType): the input's mask
    /// says which extras. The source's station is filled in by [`Switch::learn`], a known
    /// destination station by the caller.
    #[inline]
    fn read_key(&self, id: PortId, frame: &[u8], tag: Option<u16>, ethertype: u16, admitted: bool) -> Key {
        let r = &self.slot(id).expect("caller checked").rules;
        let l3 = self.cfg.mode == Mode::L3;
        let (dst, src) = (mac_at(frame, 0), mac_at(frame, 6));
        // An uplink's own address: its device's (Layer 3: the switch's on the LAN).
        let own = || match self.cfg.mode {
            Mode::L2 => r.dev_mac,
            Mode::L3 => Some(r.l3_src(self.cfg.router_mac)),
        };
        let dst = if dst.is_multicast() {
            Dest::group(dst)
        } else if r.policy.uplink && own() == Some(dst) {
            Dest::Own
        } else {
            Dest::Unknown
        };
        let mut key = Key { port: id, tag, ethertype, dst, ..Key::default() };
        if !admitted {
            return key;
        }
        if r.policy.mac.is_some() {
            key.extras.src_mac = Some(src);
        }
        // In Layer 3 mode the LAN's sources are not checked.
        let checked = !(l3 && r.policy.uplink);
        if l3 {
            key.extras.l3 = Some(self.l3_extras(frame, ethertype));
        }
        // (In both modes what the frame claims where its type says, read or not: a frame
        // Layer 3 cannot read is dropped before its source is checked.)
        if checked && r.checks_ips() {
            key.extras.src_ip = claimed_source(frame);
        }
        if checked && self.claims_locked(&r.policy, src) {
            key.src = Station::Locked;
        }
        key.suppress = self.suppresses(r);
        if key.suppress {
            key.extras.nd = Some(nd_facts(frame, ethertype));
        }
        key
    }

    /// What Layer 3 mode reads of an untagged frame of `ethertype`.
    fn l3_extras(&self, frame: &[u8], ethertype: u16) -> L3Extras {
        let mut x = L3Extras::default();
        match ethertype {
            0x0806 => {
                if let Some(Neigh::ArpRequest { .. } | Neigh::ArpReply { .. }) = neigh::parse_neigh(frame) {
                    x.readable = true;
                }
            }
            0x0800 | 0x86dd => {
                if let Some((_, dst)) = neigh::ip_endpoints(frame) {
                    x.readable = true;
                    x.owner = self.l3.owner(dst);
                    x.nd = nd_facts(frame, ethertype);
                }
            }
            _ => {}
        }
        x
    }

    /// Learns what a frame with key `key` from port `id` (source `src`, VLAN `vid`)
    /// teaches, if its input's checks admit it ([`decide::learning`]), and puts the
    /// station table's answer for its source, after learning, into the key. Returns the
    /// admission, for the decision to go on from.
    #[inline]
    pub(super) fn learn(
        &mut self,
        id: PortId,
        key: &mut Key,
        src: MacAddr,
        vid: u16,
        now_ms: u64,
    ) -> Option<decide::Admission> {
        let Some(l) = decide::learning(key, &self.tables()) else {
            if key.src != Station::Locked {
                key.src = self.station(id, src, vid);
            }
            return None;
        };
        if let Some(ip) = l.ip {
            self.lock_ip(id, ip);
        }
        if !l.station {
            // (Nothing to learn of it, as of a frame not admitted: the tables' answer.)
            key.src = self.station(id, src, vid);
            return Some(l);
        }
        match self.cfg.mode {
            Mode::L2 => {
                let limit = match self.slot(id) {
                    Some(s) if !s.rules.policy.uplink => self.cfg.port_mac_limit,
                    _ => usize::MAX,
                };
                key.src = match self.fib.learn_limited(vid, src, id, now_ms, limit) {
                    Learn::Ok => Station::Here,
                    Learn::PortFull { known: true } => Station::Elsewhere,
                    Learn::PortFull { known: false } | Learn::TableFull => Station::Absent,
                    Learn::Static => Station::Static,
                    Learn::Ignored => Station::Unlearnable,
                };
            }
            Mode::L3 => {
                let s = self.slot_mut(id).expect("caller checked");
                if s.rules.guest_mac != Some(src) {
                    s.rules.guest_mac = Some(src);
                    self.generation += 1;
                    self.note_fast(id);
                    self.resolved(id, None, now_ms);
                }
                key.src = Station::Here;
            }
        }
        Some(l)
    }

    /// A tunnel's station `src` of a frame port `id` admitted (key `key`, after learning):
    /// when the port keeps it, its endpoint is the datagram's sender.
    fn learn_remote(&mut self, id: PortId, key: &Key, from: &Arrival, src: MacAddr) {
        if let Some(o) = from.sender
            && matches!(key.src, Station::Here | Station::Unlearnable)
            && let Some(s) = self.slot_mut(id)
        {
            s.port.learn_remote(o.vni, src, o.sender);
        }
    }

    /// Layer 3: reads again the owner of frame `fid`'s destination address into its key
    /// once learning (`admission`) made an address the input's, which may be that one (a
    /// key is what the tables answer after learning).
    pub(super) fn owner_after_learning(&self, fid: u32, key: &mut Key, admission: Option<decide::Admission>) {
        if self.cfg.mode == Mode::L3
            && admission.is_some_and(|a| a.ip.is_some())
            && let Some(x) = key.extras.l3.as_mut()
            && let Some((_, dst)) = neigh::ip_endpoints(self.pool.frame(fid))
        {
            x.owner = self.l3.owner(dst);
        }
    }

    /// The station table's answer for source `src` of a frame from port `id` in `vid`,
    /// as it is (nothing learned).
    fn station(&self, id: PortId, src: MacAddr, vid: u16) -> Station {
        match self.cfg.mode {
            Mode::L3 if self.slot(id).is_some_and(|s| s.rules.guest_mac == Some(src)) => Station::Here,
            Mode::L3 => Station::Absent,
            Mode::L2 if src.is_zero() => Station::Unlearnable,
            Mode::L2 => match self.fib.get(vid, src) {
                Some(e) if e.port == id => Station::Here,
                Some(e) if e.is_static => Station::Static,
                // An EVPN tunnel learns nothing: where its stations are, routes say.
                _ if self.slot(id).is_some_and(|s| s.rules.tunnel.as_ref().is_some_and(|t| t.evpn)) => {
                    Station::Unlearnable
                }
                Some(_) => Station::Elsewhere,
                None => Station::Absent,
            },
        }
    }

    /// Locks address `ip` to port `id`, which used it first (its `ips = "learn"`).
    pub(super) fn lock_ip(&mut self, id: PortId, ip: IpAddr) {
        if self.cfg.mode == Mode::L3 {
            self.l3.own(ip, id);
        }
        if let Some(s) = self.slot_mut(id) {
            s.rules.policy.ips.push(ip);
        }
        self.generation += 1;
        self.note_fast(id);
    }

    /// Whether a frame from source `src` on a port with `policy` claims a station locked
    /// to another port (a port that locks an address may send from it; the port's own
    /// lock is checked before this).
    pub(super) fn claims_locked(&self, policy: &PortPolicy, src: MacAddr) -> bool {
        policy.mac.is_none() && !self.locked.is_empty() && self.locked.contains_key(&src)
    }
}

/// The source address an untagged frame claims: an IPv4 or IPv6 source, or an ARP sender
/// address. `None` for other frames, or when the header is cut short (`Some(None)` means
/// "an IP or ARP frame too short to say").
/// What neighbour discovery reads of an untagged frame of `ethertype`: an IPv6 header
/// whole, its next header and hop limit, and ICMPv6's type when the next header is
/// ICMPv6 (the kernel datapath's `nd_facts` reads the same bytes).
fn nd_facts(frame: &[u8], ethertype: u16) -> NdFacts {
    let Some(ip) = frame.get(ETH_HDR_LEN..ETH_HDR_LEN + 40).filter(|_| ethertype == 0x86dd) else {
        return NdFacts::default();
    };
    let icmp6_type = if ip[6] == 58 { frame.get(ETH_HDR_LEN + 40).copied().unwrap_or(0) } else { 0 };
    NdFacts { proto: ip[6], icmp6_type, hop255: ip[7] == 255 }
}

fn claimed_source(frame: &[u8]) -> Option<Option<IpAddr>> {
    let ethertype = frame.get(12..14).map_or(0, |t| u16::from_be_bytes([t[0], t[1]]));
    let v4 = |at: usize| frame.get(at..at + 4).map(|a| IpAddr::from(Ipv4Addr::new(a[0], a[1], a[2], a[3])));
    match ethertype {
        0x0800 => Some(v4(26)),
        // ARP for IPv4 over Ethernet: the sender protocol address.
        0x0806 => Some(v4(28)),
        0x86dd => Some(frame.get(22..38).and_then(|a| <[u8; 16]>::try_from(a).ok()).map(IpAddr::from)),
        _ => None,
    }
}

/// Validates a received frame (virtio header at `buf[..12]`, `len` frame bytes after it)
/// and, if the port's VLAN rule admits it (the rule [`decide`] applies),
/// removes its tag in place and measures it; counts the drop and returns `None` when the
/// frame is not valid.
fn classify(
    buf: &mut [u8],
    len: usize,
    rules: &PortRules,
    tunnel: Option<Tunneled>,
    c: &mut PortCounters,
) -> Option<Received> {
    let drop = |c: &mut PortCounters, cause| {
        c.rx_drops.add(cause);
        None
    };
    let frame_end = VNET_HDR_LEN + len;
    if len < ETH_HDR_LEN || frame_end > buf.len() {
        return drop(c, DropCause::Malformed);
    }
    let Ok(mut vnet) = VnetHdr::parse(&buf[..VNET_HDR_LEN]) else {
        return drop(c, DropCause::Malformed);
    };
    if vnet.validate(len).is_err() {
        return drop(c, DropCause::Malformed);
    }
    // (A GSO frame received is counted as one whatever else is wrong with it, as the
    // kernel datapath counts it.)
    if vnet.is_gso() {
        c.rx_gso += 1;
    }
    let Ok(eth) = parse_ethernet(&buf[VNET_HDR_LEN..frame_end]) else {
        return drop(c, DropCause::Malformed);
    };
    // Another tag next, cut short: no datapath takes the first tag off without the next
    // (the kernel moves it into the frame's metadata).
    if matches!(eth.ethertype, ETHERTYPE_VLAN | ETHERTYPE_QINQ) && len < eth.payload_offset + VLAN_TAG_LEN {
        return drop(c, DropCause::Malformed);
    }
    if eth.src.is_multicast() {
        return drop(c, DropCause::Malformed);
    }
    let tag = eth.tci.map(|t| t & 0x0fff);
    let Ok(ing) = decide::stage1(rules, eth.tci, tunnel) else {
        let meta = FrameMeta { start: VNET_HDR_LEN as u32, len: len as u32, vnet, ..Default::default() };
        return Some(Received { meta, tag, ethertype: eth.ethertype, admitted: false });
    };
    let mut start = VNET_HDR_LEN;
    let mut len = len;
    if eth.tci.is_some() {
        // Remove the tag: move the MAC addresses over it.
        if vnet.needs_csum() && vnet.csum_start < (ETH_HDR_LEN + 4) as u16 {
            return drop(c, DropCause::Malformed);
        }
        buf.copy_within(VNET_HDR_LEN..VNET_HDR_LEN + 12, VNET_HDR_LEN + 4);
        start += 4;
        len -= 4;
        if vnet.needs_csum() {
            vnet.csum_start -= 4;
        }
        vnet.hdr_len = vnet.hdr_len.saturating_sub(4);
    }
    let frame = &buf[start..start + len];
    let Some(l3_max) = measure(frame, &vnet) else {
        return drop(c, DropCause::Malformed);
    };
    if vnet.is_gso() {
        // (The headers' length is what the largest segment has beyond its payload.)
        let payload = (len - ETH_HDR_LEN).saturating_sub(l3_max.saturating_sub(usize::from(vnet.gso_size)));
        if vnet.gso_size < MIN_GSO_SIZE || payload.div_ceil(usize::from(vnet.gso_size)) > MAX_GSO_SEGMENTS {
            return drop(c, DropCause::GsoLimit);
        }
    }
    let meta = FrameMeta {
        start: start as u32,
        len: len as u32,
        vnet,
        vlan: ing.vid,
        pcp: ing.pcp,
        l3_max: l3_max as u32,
        class: 0,
    };
    Some(Received { meta, tag, ethertype: eth.ethertype, admitted: true })
}

/// What an untagged frame measures against an output's MTU: its IP packet's length, or
/// for a GSO frame the length of its largest segment (its headers and at most `gso_size`
/// bytes of payload). `None` for a GSO frame whose headers cannot be cut by.
fn measure(frame: &[u8], vnet: &VnetHdr) -> Option<usize> {
    if vnet.is_gso() { gso_max_l3_len(frame, vnet).ok() } else { Some(frame.len().saturating_sub(ETH_HDR_LEN)) }
}

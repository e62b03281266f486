//! Frame builders and checks shared by the core's tests.
#![allow(dead_code)]

use sluice_switch::mem::{MemHandle, mem_port};
use sluice_switch::{PortCaps, PortConfig, Switch, SwitchConfig, VlanMode};
use sluice_wire::VnetHdr;
use sluice_wire::checksum;

pub const OFFLOAD: PortCaps = PortCaps { offload: true, lossless_input: false };
pub const NO_OFFLOAD: PortCaps = PortCaps { offload: false, lossless_input: false };

pub fn mac(n: u8) -> [u8; 6] {
    [0x02, 0, 0, 0, 0, n]
}

pub const BCAST: [u8; 6] = [0xff; 6];

/// An Ethernet frame with the given EtherType and `payload_len` bytes of payload.
pub fn eth(dst: [u8; 6], src: [u8; 6], ethertype: u16, payload_len: usize) -> Vec<u8> {
    let mut f = Vec::with_capacity(14 + payload_len);
    f.extend_from_slice(&dst);
    f.extend_from_slice(&src);
    f.extend_from_slice(&ethertype.to_be_bytes());
    f.extend((0..payload_len).map(|i| i as u8));
    f
}

/// Inserts an 802.1Q tag with `vid` after the MAC addresses.
pub fn tag(frame: &[u8], vid: u16) -> Vec<u8> {
    let mut f = frame[..12].to_vec();
    f.extend_from_slice(&[0x81, 0x00]);
    f.extend_from_slice(&vid.to_be_bytes());
    f.extend_from_slice(&frame[12..]);
    f
}

/// A TCP/IPv4 frame with `payload` bytes; with `gso_size` it is a GSO frame with a partial
/// checksum, as a TAP with TSO hands it over.
pub fn tcp4(dst: [u8; 6], src: [u8; 6], payload: usize, gso_size: Option<u16>) -> (VnetHdr, Vec<u8>) {
    let mut f = eth(dst, src, 0x0800, 0);
    let total = 20 + 20 + payload;
    let saddr = [10, 0, 0, 1];
    let daddr = [10, 0, 0, 2];
    let mut ip = vec![0x45, 0, 0, 0, 0x12, 0x34, 0x40, 0, 64, 6, 0, 0];
    ip[2..4].copy_from_slice(&(total as u16).to_be_bytes());
    ip.extend_from_slice(&saddr);
    ip.extend_from_slice(&daddr);
    let c = checksum::fold(checksum::sum(&ip, 0));
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    f.extend_from_slice(&ip);
    let mut tcp = vec![0x13, 0x88, 0x9c, 0x40, 0, 0, 0x10, 0, 0, 0, 0, 0, 0x50, 0x18, 0xff, 0xff, 0, 0, 0, 0];
    tcp.extend((0..payload).map(|i| (i * 7) as u8));
    let pseudo = checksum::pseudo_v4(saddr, daddr, 6, tcp.len() as u32);
    let partial = !checksum::fold(pseudo);
    tcp[16..18].copy_from_slice(&partial.to_be_bytes());
    f.extend_from_slice(&tcp);
    let vnet = VnetHdr {
        flags: VnetHdr::F_NEEDS_CSUM,
        gso_type: if gso_size.is_some() { VnetHdr::GSO_TCPV4 } else { VnetHdr::GSO_NONE },
        hdr_len: if gso_size.is_some() { 54 } else { 0 },
        gso_size: gso_size.unwrap_or(0),
        csum_start: 34,
        csum_offset: 16,
        num_buffers: 0,
    };
    (vnet, f)
}

/// True when the IPv4 header and TCP checksums of an untagged TCP/IPv4 frame are complete
/// and correct.
pub fn tcp4_checksums_ok(f: &[u8]) -> bool {
    let ip = &f[14..34];
    if checksum::fold(checksum::sum(ip, 0)) != 0 {
        return false;
    }
    let total = u16::from_be_bytes([ip[2], ip[3]]) as usize;
    let tcp = &f[34..14 + total];
    let pseudo =
        checksum::pseudo_v4(ip[12..16].try_into().unwrap(), ip[16..20].try_into().unwrap(), 6, tcp.len() as u32);
    checksum::fold(checksum::sum(tcp, pseudo)) == 0
}

/// A switch for these tests, which count every frame a port is sent and every move of the
/// generation: without IGMP/MLD snooping, whose querier sends frames of its own and whose
/// start bumps the generation once (it has tests of its own: `mdb`, `snoop`, and
/// crates/sluice/tests/snooping.rs).
pub fn cfg() -> SwitchConfig {
    let snoop = sluice_switch::SnoopConfig { enabled: false, ..Default::default() };
    SwitchConfig { queue_len: 8, snoop, ..SwitchConfig::default() }
}

pub fn access(vid: u16) -> VlanMode {
    VlanMode::Access(vid)
}

pub fn trunk(allowed: &[u16], native: Option<u16>) -> VlanMode {
    VlanMode::Trunk { allowed: allowed.iter().copied().collect(), native }
}

/// Adds a memory port named `name`.
pub fn add(sw: &mut Switch, name: &str, vlan: VlanMode, mtu: Option<u16>, caps: PortCaps) -> (u32, MemHandle) {
    let (p, h) = mem_port(caps);
    let id = sw.add_port(PortConfig { name: name.into(), vlan, mtu, policy: Default::default() }, Box::new(p)).unwrap();
    (id, h)
}

/// Adds a memory port with a security policy.
pub fn add_with(sw: &mut Switch, name: &str, policy: sluice_switch::PortPolicy) -> (u32, MemHandle) {
    let (p, h) = mem_port(OFFLOAD);
    let id = sw.add_port(PortConfig { name: name.into(), vlan: access(1), mtu: None, policy }, Box::new(p)).unwrap();
    (id, h)
}

/// Sends `frame` into port `id` and lets the switch forward it.
pub fn send(sw: &mut Switch, id: u32, h: &MemHandle, frame: &[u8], now_ms: u64) {
    h.inject(VnetHdr::default(), frame);
    while sw.on_readable(id, now_ms) {}
}

/// Checks the accounting rules of `counters.rs` on every port and across the switch.
pub fn assert_conserved(sw: &Switch) {
    if let Err(e) = sw.check_accounting() {
        panic!("{e}");
    }
}

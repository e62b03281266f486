//! Address resolution as a Layer 3 switch sees it: ARP for IPv4 over Ethernet and IPv6
//! neighbour solicitations and advertisements (RFC 826, RFC 4861), read from and written
//! into untagged Ethernet frames, and the IP endpoints of an IPv4 or IPv6 packet.
//!
//! Writers fill a caller's buffer and return the frame's length, or `None` when the buffer
//! is too small; they never allocate.

use core::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::checksum;
use crate::ethernet::{ETH_HDR_LEN, ETHERTYPE_ARP, ETHERTYPE_IPV4, ETHERTYPE_IPV6, MacAddr};

/// ICMPv6's IPv6 next-header value.
const ICMPV6: u8 = 58;
const NS: u8 = 135;
const NA: u8 = 136;
/// Length of an ARP frame (Ethernet header and the IPv4-over-Ethernet ARP body).
pub const ARP_FRAME_LEN: usize = ETH_HDR_LEN + 28;
/// Length of a solicitation or advertisement frame with one link-layer address option.
pub const ND_FRAME_LEN: usize = ETH_HDR_LEN + 40 + 24 + 8;

/// An address-resolution message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Neigh {
    /// "Who has `target`? Tell `sender_ip` at `sender_mac`" (ARP request, opcode 1). A
    /// probe has sender 0.0.0.0; a gratuitous announcement has `target == sender_ip`.
    ArpRequest {
        /// Sender hardware address.
        sender_mac: MacAddr,
        /// Sender protocol address.
        sender_ip: Ipv4Addr,
        /// The address asked about.
        target: Ipv4Addr,
    },
    /// "`sender_ip` is at `sender_mac`" (ARP reply, opcode 2).
    ArpReply {
        /// Sender hardware address.
        sender_mac: MacAddr,
        /// Sender protocol address.
        sender_ip: Ipv4Addr,
    },
    /// Neighbour solicitation from `src` (`::` during duplicate address detection).
    Solicit {
        /// IPv6 source address.
        src: Ipv6Addr,
        /// The address asked about.
        target: Ipv6Addr,
        /// The source link-layer address option, if present.
        lla: Option<MacAddr>,
    },
    /// Neighbour advertisement: `target` is at `lla`.
    Advert {
        /// The address advertised.
        target: Ipv6Addr,
        /// The target link-layer address option, if present.
        lla: Option<MacAddr>,
    },
}

fn mac_at(f: &[u8], at: usize) -> Option<MacAddr> {
    Some(MacAddr(f.get(at..at + 6)?.try_into().ok()?))
}

fn v4_at(f: &[u8], at: usize) -> Option<Ipv4Addr> {
    let b: [u8; 4] = f.get(at..at + 4)?.try_into().ok()?;
    Some(Ipv4Addr::from(b))
}

fn v6_at(f: &[u8], at: usize) -> Option<Ipv6Addr> {
    let b: [u8; 16] = f.get(at..at + 16)?.try_into().ok()?;
    Some(Ipv6Addr::from(b))
}

fn ethertype(f: &[u8]) -> Option<u16> {
    Some(u16::from_be_bytes(f.get(12..14)?.try_into().ok()?))
}

/// Reads an address-resolution message from an untagged Ethernet frame. `None` for every
/// other frame, and for ARP or ND messages this module does not use (other hardware or
/// protocol types, other ICMPv6 types, hop limit other than 255, extension headers, a
/// checksum that does not verify).
pub fn parse_neigh(f: &[u8]) -> Option<Neigh> {
    match ethertype(f)? {
        ETHERTYPE_ARP => {
            // htype 1 (Ethernet), ptype IPv4, hlen 6, plen 4.
            if f.get(14..20)? != [0, 1, 0x08, 0x00, 6, 4] {
                return None;
            }
            let op = u16::from_be_bytes(f.get(20..22)?.try_into().ok()?);
            let sender_mac = mac_at(f, 22)?;
            let sender_ip = v4_at(f, 28)?;
            let target = v4_at(f, 38)?;
            match op {
                1 => Some(Neigh::ArpRequest { sender_mac, sender_ip, target }),
                2 => Some(Neigh::ArpReply { sender_mac, sender_ip }),
                _ => None,
            }
        }
        ETHERTYPE_IPV6 => {
            let ip = f.get(ETH_HDR_LEN..ETH_HDR_LEN + 40)?;
            if ip[6] != ICMPV6 || ip[7] != 255 {
                return None;
            }
            let payload = usize::from(u16::from_be_bytes([ip[4], ip[5]]));
            let icmp = f.get(ETH_HDR_LEN + 40..ETH_HDR_LEN + 40 + payload)?;
            if icmp.len() < 24 || icmp[1] != 0 {
                return None;
            }
            // A message whose checksum does not verify is not read (RFC 4861, 7.1.1).
            let (src, dst) = (ip[8..24].try_into().ok()?, ip[24..40].try_into().ok()?);
            if checksum::fold(checksum::sum(icmp, checksum::pseudo_v6(src, dst, ICMPV6, icmp.len() as u32))) != 0 {
                return None;
            }
            let target = v6_at(icmp, 8)?;
            // Options: type, length in units of 8 bytes, data.
            let want = if icmp[0] == NS { 1 } else { 2 };
            let mut lla = None;
            let mut opts = &icmp[24..];
            while opts.len() >= 8 {
                let len = usize::from(opts[1]) * 8;
                if len == 0 || len > opts.len() {
                    return None;
                }
                if opts[0] == want && len == 8 {
                    lla = mac_at(opts, 2);
                }
                opts = &opts[len..];
            }
            match icmp[0] {
                NS => Some(Neigh::Solicit { src: v6_at(ip, 8)?, target, lla }),
                NA => Some(Neigh::Advert { target, lla }),
                _ => None,
            }
        }
        _ => None,
    }
}

/// Source and destination addresses of an IPv4 or IPv6 packet in an untagged Ethernet
/// frame; `None` for other frames or when the header is cut short.
pub fn ip_endpoints(f: &[u8]) -> Option<(IpAddr, IpAddr)> {
    match ethertype(f)? {
        ETHERTYPE_IPV4 => Some((v4_at(f, 26)?.into(), v4_at(f, 30)?.into())),
        ETHERTYPE_IPV6 => Some((v6_at(f, 22)?.into(), v6_at(f, 38)?.into())),
        _ => None,
    }
}

fn put_eth(out: &mut [u8], dst: MacAddr, src: MacAddr, ethertype: u16) {
    out[..6].copy_from_slice(&dst.0);
    out[6..12].copy_from_slice(&src.0);
    out[12..14].copy_from_slice(&ethertype.to_be_bytes());
}

/// Writes an ARP frame: opcode `op` (1 request, 2 reply) from `sha`/`spa` about
/// `tha`/`tpa`, in an Ethernet frame from `sha` to `eth_dst`.
pub fn write_arp(
    out: &mut [u8],
    op: u16,
    eth_dst: MacAddr,
    sha: MacAddr,
    spa: Ipv4Addr,
    tha: MacAddr,
    tpa: Ipv4Addr,
) -> Option<usize> {
    let out = out.get_mut(..ARP_FRAME_LEN)?;
    put_eth(out, eth_dst, sha, ETHERTYPE_ARP);
    out[14..20].copy_from_slice(&[0, 1, 0x08, 0x00, 6, 4]);
    out[20..22].copy_from_slice(&op.to_be_bytes());
    out[22..28].copy_from_slice(&sha.0);
    out[28..32].copy_from_slice(&spa.octets());
    out[32..38].copy_from_slice(&tha.0);
    out[38..42].copy_from_slice(&tpa.octets());
    Some(ARP_FRAME_LEN)
}

/// Writes the RARP request a station sends to announce `mac` to the switches of a LAN
/// (EtherType 0x8035, opcode 3, from and about `mac`, to broadcast), as QEMU does after
/// migration and Open vSwitch bonds after a failover.
pub fn write_rarp_announce(out: &mut [u8], mac: MacAddr) -> Option<usize> {
    let n = write_arp(out, 3, MacAddr::BROADCAST, mac, Ipv4Addr::UNSPECIFIED, mac, Ipv4Addr::UNSPECIFIED)?;
    out[12..14].copy_from_slice(&0x8035u16.to_be_bytes());
    Some(n)
}

/// The solicited-node multicast address of `a` (ff02::1:ffXX:XXXX).
pub fn solicited_node(a: Ipv6Addr) -> Ipv6Addr {
    let o = a.octets();
    Ipv6Addr::new(0xff02, 0, 0, 0, 0, 1, 0xff00 | u16::from(o[13]), u16::from_be_bytes([o[14], o[15]]))
}

/// The Ethernet address IPv6 multicast `a` maps to (33:33 and its last four bytes).
pub fn multicast_mac(a: Ipv6Addr) -> MacAddr {
    let o = a.octets();
    MacAddr([0x33, 0x33, o[12], o[13], o[14], o[15]])
}

/// The all-nodes address ff02::1.
pub const ALL_NODES: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1);

/// Neighbour-discovery message fields that differ between solicitations and
/// advertisements.
#[derive(Clone, Copy, Debug)]
pub struct NdFields {
    /// ICMPv6 type: solicitation (135) or advertisement (136).
    pub advert: bool,
    /// Advertisement flags: solicited (S) — the O (override) flag is always set.
    pub solicited: bool,
    /// IPv6 source and destination addresses.
    pub src: Ipv6Addr,
    /// IPv6 destination address.
    pub dst: Ipv6Addr,
    /// The address asked about or advertised.
    pub target: Ipv6Addr,
    /// The link-layer address option's value (source for a solicitation, target for an
    /// advertisement).
    pub lla: MacAddr,
}

/// Writes a neighbour solicitation or advertisement with one link-layer address option,
/// from `eth_src` to `eth_dst`, with its ICMPv6 checksum.
pub fn write_nd(out: &mut [u8], eth_dst: MacAddr, eth_src: MacAddr, m: &NdFields) -> Option<usize> {
    let out = out.get_mut(..ND_FRAME_LEN)?;
    put_eth(out, eth_dst, eth_src, ETHERTYPE_IPV6);
    let (ip, icmp) = out[ETH_HDR_LEN..].split_at_mut(40);
    ip[..4].copy_from_slice(&[0x60, 0, 0, 0]);
    ip[4..6].copy_from_slice(&32u16.to_be_bytes());
    ip[6] = ICMPV6;
    ip[7] = 255;
    ip[8..24].copy_from_slice(&m.src.octets());
    ip[24..40].copy_from_slice(&m.dst.octets());
    icmp.fill(0);
    icmp[0] = if m.advert { NA } else { NS };
    if m.advert {
        // R = 0, S, O = 1.
        icmp[4] = if m.solicited { 0x60 } else { 0x20 };
    }
    icmp[8..24].copy_from_slice(&m.target.octets());
    icmp[24] = if m.advert { 2 } else { 1 };
    icmp[25] = 1;
    icmp[26..32].copy_from_slice(&m.lla.0);
    let c = checksum::fold(checksum::sum(icmp, checksum::pseudo_v6(m.src.octets(), m.dst.octets(), ICMPV6, 32)));
    icmp[2..4].copy_from_slice(&c.to_be_bytes());
    Some(ND_FRAME_LEN)
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: MacAddr = MacAddr([2, 0, 0, 0, 0, 0xa]);
    const B: MacAddr = MacAddr([2, 0, 0, 0, 0, 0xb]);

    #[test]
    fn arp_written_is_arp_read() {
        let mut buf = [0u8; 64];
        let ip = |d| Ipv4Addr::new(10, 0, 0, d);
        let n = write_arp(&mut buf, 1, MacAddr::BROADCAST, A, ip(1), MacAddr::default(), ip(2)).unwrap();
        assert_eq!(n, 42);
        assert_eq!(parse_neigh(&buf[..n]), Some(Neigh::ArpRequest { sender_mac: A, sender_ip: ip(1), target: ip(2) }));
        let n = write_arp(&mut buf, 2, A, B, ip(2), A, ip(1)).unwrap();
        assert_eq!(parse_neigh(&buf[..n]), Some(Neigh::ArpReply { sender_mac: B, sender_ip: ip(2) }));
        assert_eq!(&buf[..6], &A.0);
        assert!(write_arp(&mut buf[..41], 2, A, B, ip(2), A, ip(1)).is_none());
        // Cut short, or another protocol type: not read.
        assert_eq!(parse_neigh(&buf[..30]), None);
        buf[17] = 0xdd;
        assert_eq!(parse_neigh(&buf[..n]), None);
    }

    #[test]
    fn nd_written_is_nd_read_with_a_correct_checksum() {
        let mut buf = [0u8; 128];
        let src: Ipv6Addr = "fd00::1".parse().unwrap();
        let target: Ipv6Addr = "fd00::2".parse().unwrap();
        let dst = solicited_node(target);
        assert_eq!(dst, "ff02::1:ff00:2".parse::<Ipv6Addr>().unwrap());
        let m = NdFields { advert: false, solicited: false, src, dst, target, lla: A };
        let n = write_nd(&mut buf, multicast_mac(dst), A, &m).unwrap();
        assert_eq!(&buf[..6], &[0x33, 0x33, 0xff, 0, 0, 2]);
        assert_eq!(parse_neigh(&buf[..n]), Some(Neigh::Solicit { src, target, lla: Some(A) }));
        let icmp = &buf[54..n];
        assert_eq!(checksum::fold(checksum::sum(icmp, checksum::pseudo_v6(src.octets(), dst.octets(), 58, 32))), 0);
        let m = NdFields { advert: true, solicited: true, src: target, dst: src, target, lla: B };
        let n = write_nd(&mut buf, A, B, &m).unwrap();
        assert_eq!(parse_neigh(&buf[..n]), Some(Neigh::Advert { target, lla: Some(B) }));
        assert_eq!(buf[58], 0x60);
        // A forged message whose checksum does not verify is not read (a host drops it).
        buf[60] ^= 1;
        assert_eq!(parse_neigh(&buf[..n]), None);
        buf[60] ^= 1;
        assert_eq!(parse_neigh(&buf[..n]), Some(Neigh::Advert { target, lla: Some(B) }));
        // A hop limit other than 255 is not neighbour discovery (RFC 4861 section 7.1).
        buf[21] = 64;
        assert_eq!(parse_neigh(&buf[..n]), None);
    }

    #[test]
    fn ip_endpoints_of_both_families() {
        let mut f = [0u8; 54];
        f[12..14].copy_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
        f[26..30].copy_from_slice(&[10, 0, 0, 1]);
        f[30..34].copy_from_slice(&[10, 0, 0, 2]);
        assert_eq!(
            ip_endpoints(&f[..34]),
            Some((Ipv4Addr::new(10, 0, 0, 1).into(), Ipv4Addr::new(10, 0, 0, 2).into()))
        );
        assert_eq!(ip_endpoints(&f[..33]), None);
        f = [0u8; 54];
        f[12..14].copy_from_slice(&ETHERTYPE_IPV6.to_be_bytes());
        f[22] = 0xfd;
        f[38] = 0xfd;
        f[53] = 2;
        let (s, d) = ip_endpoints(&f).unwrap();
        assert_eq!((s, d), ("fd00::".parse::<IpAddr>().unwrap(), "fd00::2".parse::<IpAddr>().unwrap()));
        f[12] = 0x88;
        assert_eq!(ip_endpoints(&f), None);
    }
}

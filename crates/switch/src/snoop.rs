//! IGMP and MLD on the wire: which group a frame is for, reading a membership message
//! (IGMPv1/v2/v3, MLDv1/v2) into what it says, and writing the general queries the switch
//! sends as querier. Pure functions over a frame's bytes; the membership itself is
//! [`crate::mdb`]'s. docs/architecture.md, "IGMP/MLD snooping — design".
//!
//! Bounded: a message yields at most [`MAX_RECORDS`] group records (the rest are counted,
//! not read); every length is checked against the frame before it is read, and a message
//! whose checksum or length is wrong is [`Parsed::Malformed`].

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use sluice_wire::MacAddr;
use sluice_wire::checksum::{fold, sum};

/// Group records read from one IGMPv3 or MLDv2 report; more are counted as truncated.
pub const MAX_RECORDS: usize = 256;

const ETH: usize = 14;

/// The multicast class of an IP frame's destination, as the key reader sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// Not an IP group the switch snoops (not IP, broadcast, a link-local group): flooded.
    Flooded,
    /// An IGMP or MLD message: the core reads it.
    Control,
    /// Data to this IP group.
    Group(IpAddr),
}

/// What a multicast destination's prefix says of it ([`group_prefixes`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupPrefix {
    /// Multicast the switch never snoops: flooded.
    Flooded,
    /// Multicast whose memberships decide where it goes.
    Snooped,
}

/// IPv4 protocols whose group frames are the core's to read: IGMP.
pub const CONTROL_PROTOCOLS: [u8; 1] = [2];
/// ICMPv6 types whose group frames are the core's to read: MLD queries, reports, done.
pub const CONTROL_ICMP6_TYPES: [u8; 4] = [130, 131, 132, 143];

/// The multicast prefixes and what each says, the longest that holds an address deciding
/// (an address none holds is not multicast): IPv4 multicast outside 224.0.0.0/24, IPv6
/// multicast of a scope wider than link-local (ff02::/16 and the interface-local ff01::/16
/// always flood, so neighbour discovery never depends on MLD), whatever its flags. A kernel
/// datapath looks the same prefixes up in a table written from this list.
pub fn group_prefixes() -> &'static [(IpAddr, u8, GroupPrefix)] {
    static PREFIXES: std::sync::LazyLock<Vec<(IpAddr, u8, GroupPrefix)>> = std::sync::LazyLock::new(|| {
        let mut v = vec![
            (Ipv4Addr::new(224, 0, 0, 0).into(), 4, GroupPrefix::Snooped),
            (Ipv4Addr::new(224, 0, 0, 0).into(), 24, GroupPrefix::Flooded),
            (Ipv6Addr::new(0xff00, 0, 0, 0, 0, 0, 0, 0).into(), 8, GroupPrefix::Snooped),
        ];
        for flags in 0..16u16 {
            for scope in 0..=2u16 {
                v.push((
                    Ipv6Addr::new(0xff00 | flags << 4 | scope, 0, 0, 0, 0, 0, 0, 0).into(),
                    16,
                    GroupPrefix::Flooded,
                ));
            }
        }
        v
    });
    &PREFIXES
}

/// What the longest of [`group_prefixes`] that holds `g` says; `None`: not multicast.
pub fn group_prefix(g: IpAddr) -> Option<GroupPrefix> {
    let holds = |p: IpAddr, len: u8| match (p, g) {
        (IpAddr::V4(p), IpAddr::V4(a)) => {
            u32::from(a) >> (32 - u32::from(len)) == u32::from(p) >> (32 - u32::from(len))
        }
        (IpAddr::V6(p), IpAddr::V6(a)) => {
            u128::from(a) >> (128 - u32::from(len)) == u128::from(p) >> (128 - u32::from(len))
        }
        _ => false,
    };
    group_prefixes().iter().filter(|&&(p, len, _)| holds(p, len)).max_by_key(|&&(_, len, _)| len).map(|&(.., c)| c)
}

/// Whether a group is one the switch keeps memberships for ([`group_prefixes`]).
pub fn snooped(g: IpAddr) -> bool {
    group_prefix(g) == Some(GroupPrefix::Snooped)
}

/// What the key reader needs to know of an untagged frame (`f`, from its Ethernet header)
/// whose destination MAC address is a group address.
pub fn target(f: &[u8]) -> Target {
    let Some(et) = f.get(12..14) else { return Target::Flooded };
    match u16::from_be_bytes([et[0], et[1]]) {
        0x0800 => {
            let Some(ip) = f.get(ETH..ETH + 20) else { return Target::Flooded };
            if ip[0] >> 4 != 4 {
                return Target::Flooded;
            }
            let dst = Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]);
            // IGMP to any group (224.0.0.22 reports and 224.0.0.1 queries too).
            classed(dst.into(), CONTROL_PROTOCOLS.contains(&ip[9]))
        }
        0x86dd => {
            let Some(ip) = f.get(ETH..ETH + 40) else { return Target::Flooded };
            let dst = Ipv6Addr::from(<[u8; 16]>::try_from(&ip[24..40]).expect("16 bytes"));
            classed(dst.into(), mld_type(f).is_some())
        }
        _ => Target::Flooded,
    }
}

/// The target of a frame to IP destination `dst`, a control message or not: multicast
/// first, then control, then the prefix (the order a kernel datapath looks them up in).
fn classed(dst: IpAddr, control: bool) -> Target {
    match group_prefix(dst) {
        None => Target::Flooded,
        Some(_) if control => Target::Control,
        Some(GroupPrefix::Snooped) => Target::Group(dst),
        Some(GroupPrefix::Flooded) => Target::Flooded,
    }
}

/// An IPv6 frame's MLD message: its offset and ICMPv6 type (130, 131, 132 or 143), after
/// at most one hop-by-hop header (MLD always carries a Router Alert in one).
fn mld_type(f: &[u8]) -> Option<(usize, u8)> {
    let mut next = *f.get(ETH + 6)?;
    let mut at = ETH + 40;
    if next == 0 {
        next = *f.get(at)?;
        at += (usize::from(*f.get(at + 1)?) + 1) * 8;
    }
    if next != 58 {
        return None;
    }
    let t = *f.get(at)?;
    CONTROL_ICMP6_TYPES.contains(&t).then_some((at, t))
}

/// What one IGMP or MLD message says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Parsed {
    /// A query from `src`: general (`group` none) or for one group.
    Query {
        /// The querier's address (IPv4 0.0.0.0 or IPv6 :: from a snooping switch).
        src: IpAddr,
        /// A group-specific query's group.
        group: Option<IpAddr>,
    },
    /// A report: each record's group and whether it joins (else leaves); `truncated`
    /// records beyond [`MAX_RECORDS`] were not read.
    Report {
        /// (group, joins).
        records: Vec<(IpAddr, bool)>,
        /// Records not read.
        truncated: usize,
    },
    /// Not IGMP or MLD the switch reads (an IGMP type it does not know, DVMRP, …):
    /// forwarded as it is, to router ports.
    Other,
    /// Too short, a length past the frame, or a wrong checksum.
    Malformed,
}

/// Reads the IGMP or MLD message in untagged frame `f` (one [`target`] called
/// [`Target::Control`]).
pub fn parse(f: &[u8]) -> Parsed {
    match f.get(12..14).map(|e| u16::from_be_bytes([e[0], e[1]])) {
        Some(0x0800) => parse_igmp(f).unwrap_or(Parsed::Malformed),
        Some(0x86dd) => parse_mld(f).unwrap_or(Parsed::Malformed),
        _ => Parsed::Malformed,
    }
}

fn v4(b: &[u8]) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(b[0], b[1], b[2], b[3]))
}

fn v6(b: &[u8]) -> IpAddr {
    IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(&b[..16]).expect("16 bytes")))
}

fn parse_igmp(f: &[u8]) -> Option<Parsed> {
    let ip = f.get(ETH..ETH + 20)?;
    let ihl = usize::from(ip[0] & 0x0f) * 4;
    let total = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
    if ihl < 20 || total < ihl + 8 {
        return None;
    }
    let m = f.get(ETH + ihl..ETH + total)?;
    if fold(sum(m, 0)) != 0 {
        return None;
    }
    let src = v4(&ip[12..16]);
    let group = v4(&m[4..8]);
    let one = |joins| {
        if snooped(group) {
            Parsed::Report { records: vec![(group, joins)], truncated: 0 }
        } else {
            Parsed::Report { records: Vec::new(), truncated: 0 }
        }
    };
    Some(match m[0] {
        0x11 => {
            let g = (!group.is_unspecified()).then_some(group);
            Parsed::Query { src, group: g }
        }
        0x12 | 0x16 => one(true),
        0x17 => one(false),
        0x22 => {
            let n = usize::from(u16::from_be_bytes([*m.get(6)?, *m.get(7)?]));
            records(&m[8..], n, 4)?
        }
        _ => Parsed::Other,
    })
}

/// IGMPv3 and MLDv2 group records (`n` of them, addresses of `alen` bytes) in `b`.
fn records(b: &[u8], n: usize, alen: usize) -> Option<Parsed> {
    let (mut out, mut at) = (Vec::with_capacity(n.min(MAX_RECORDS)), 0);
    for _ in 0..n.min(MAX_RECORDS) {
        let h = b.get(at..at + 4 + alen)?;
        let (kind, aux, nsrc) = (h[0], usize::from(h[1]), usize::from(u16::from_be_bytes([h[2], h[3]])));
        let group = if alen == 4 { v4(&h[4..]) } else { v6(&h[4..]) };
        at += 4 + alen + nsrc * alen + aux * 4;
        if at > b.len() {
            return None;
        }
        if !snooped(group) {
            continue;
        }
        // Open vSwitch's rule, no source filtering: INCLUDE with no sources leaves, a
        // blocked source changes nothing, anything else joins the whole group.
        match kind {
            1 | 3 if nsrc == 0 => out.push((group, false)),
            6 => {}
            1..=5 => out.push((group, true)),
            _ => {}
        }
    }
    Some(Parsed::Report { records: out, truncated: n.saturating_sub(MAX_RECORDS) })
}

fn parse_mld(f: &[u8]) -> Option<Parsed> {
    let (at, t) = mld_type(f)?;
    let ip = &f[ETH..ETH + 40];
    let end = ETH + 40 + usize::from(u16::from_be_bytes([ip[4], ip[5]]));
    let m = f.get(at..end)?;
    if m.len() < 24 {
        return None;
    }
    // The ICMPv6 checksum covers a pseudo-header: addresses, length, next header 58.
    let mut pseudo = [0u8; 40];
    pseudo[..32].copy_from_slice(&ip[8..40]);
    pseudo[32..36].copy_from_slice(&(m.len() as u32).to_be_bytes());
    pseudo[39] = 58;
    if fold(sum(m, sum(&pseudo, 0))) != 0 {
        return None;
    }
    let src = v6(&ip[8..24]);
    let group = v6(&m[8..24]);
    let one = |joins| Parsed::Report {
        records: if snooped(group) { vec![(group, joins)] } else { Vec::new() },
        truncated: 0,
    };
    Some(match t {
        130 => Parsed::Query { src, group: (!group.is_unspecified()).then_some(group) },
        131 => one(true),
        132 => one(false),
        _ => {
            let n = usize::from(u16::from_be_bytes([m[6], m[7]]));
            records(&m[8..], n, 16)?
        }
    })
}

/// The link-local address the switch sends MLD queries from: fe80:: with the modified
/// EUI-64 interface id of `mac`.
pub fn link_local(mac: MacAddr) -> Ipv6Addr {
    let m = mac.0;
    Ipv6Addr::from([0xfe, 0x80, 0, 0, 0, 0, 0, 0, m[0] ^ 2, m[1], m[2], 0xff, 0xfe, m[3], m[4], m[5]])
}

/// Length of an IGMPv3 general query frame.
pub const IGMP_QUERY_LEN: usize = ETH + 24 + 12;
/// Length of an MLDv2 general query frame.
pub const MLD_QUERY_LEN: usize = ETH + 40 + 8 + 28;

/// The QQIC / max-response encoding of small values (below 128: the value itself).
fn code(v: u32) -> u8 {
    v.min(127) as u8
}

/// Writes an IGMPv3 general query to 224.0.0.1 from 0.0.0.0 (a snooping querier's
/// address, as the Linux bridge's), Router Alert, TTL 1; `interval_s` is the query
/// interval it announces, `response_ds` the maximum response time (tenths of a second).
pub fn write_igmp_query(out: &mut [u8], src_mac: MacAddr, interval_s: u32, response_ds: u32) -> Option<usize> {
    let f = out.get_mut(..IGMP_QUERY_LEN)?;
    f.fill(0);
    f[..6].copy_from_slice(&[0x01, 0x00, 0x5e, 0, 0, 1]);
    f[6..12].copy_from_slice(&src_mac.0);
    f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    let ip = &mut f[ETH..ETH + 24];
    ip[0] = 0x46;
    ip[2..4].copy_from_slice(&36u16.to_be_bytes());
    ip[8] = 1;
    ip[9] = 2;
    ip[16..20].copy_from_slice(&[224, 0, 0, 1]);
    ip[20..24].copy_from_slice(&[0x94, 0x04, 0, 0]);
    let c = fold(sum(ip, 0));
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    let m = &mut f[ETH + 24..];
    m[0] = 0x11;
    m[1] = code(response_ds);
    m[8] = 2; // robustness 2
    m[9] = code(interval_s);
    let c = fold(sum(m, 0));
    m[2..4].copy_from_slice(&c.to_be_bytes());
    Some(IGMP_QUERY_LEN)
}

/// Writes an MLDv2 general query to ff02::1 from `src` (a link-local address), with a
/// Router Alert, hop limit 1; `response_ms` is the maximum response time.
pub fn write_mld_query(
    out: &mut [u8],
    src_mac: MacAddr,
    src: Ipv6Addr,
    interval_s: u32,
    response_ms: u32,
) -> Option<usize> {
    let f = out.get_mut(..MLD_QUERY_LEN)?;
    f.fill(0);
    f[..6].copy_from_slice(&[0x33, 0x33, 0, 0, 0, 1]);
    f[6..12].copy_from_slice(&src_mac.0);
    f[12..14].copy_from_slice(&0x86ddu16.to_be_bytes());
    let dst = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1);
    {
        let ip = &mut f[ETH..ETH + 40];
        ip[0] = 0x60;
        ip[4..6].copy_from_slice(&36u16.to_be_bytes());
        ip[6] = 0;
        ip[7] = 1;
        ip[8..24].copy_from_slice(&src.octets());
        ip[24..40].copy_from_slice(&dst.octets());
    }
    f[ETH + 40..ETH + 48].copy_from_slice(&[58, 0, 5, 2, 0, 0, 1, 0]);
    let mut pseudo = [0u8; 40];
    pseudo[..16].copy_from_slice(&src.octets());
    pseudo[16..32].copy_from_slice(&dst.octets());
    pseudo[32..36].copy_from_slice(&28u32.to_be_bytes());
    pseudo[39] = 58;
    let m = &mut f[ETH + 48..];
    m[0] = 130;
    m[4..6].copy_from_slice(&(response_ms.min(32767) as u16).to_be_bytes());
    m[24] = 2;
    m[25] = code(interval_s);
    let c = fold(sum(m, sum(&pseudo, 0)));
    m[2..4].copy_from_slice(&c.to_be_bytes());
    Some(MLD_QUERY_LEN)
}

#[cfg(test)]
mod tests {
    //! Each message kind read from bytes the tests write, and what is refused.

    use super::*;

    #[test]
    fn group_prefixes_say_what_is_snooped_the_longest_deciding() {
        let c = |a: &str| group_prefix(a.parse().unwrap());
        assert_eq!(c("10.0.0.1"), None, "not multicast");
        assert_eq!(c("224.0.0.251"), Some(GroupPrefix::Flooded));
        assert_eq!(c("224.0.1.1"), Some(GroupPrefix::Snooped));
        assert_eq!(c("239.255.0.1"), Some(GroupPrefix::Snooped));
        assert_eq!(c("fe80::1"), None);
        assert_eq!(c("ff02::1:ff00:1"), Some(GroupPrefix::Flooded));
        assert_eq!(c("ff12::1"), Some(GroupPrefix::Flooded), "a transient link-local group");
        assert_eq!(c("ff01::1"), Some(GroupPrefix::Flooded));
        assert_eq!(c("ff05::1:3"), Some(GroupPrefix::Snooped));
        assert_eq!(c("ff3e::8000:1"), Some(GroupPrefix::Snooped), "source-specific, global");
    }

    const MAC: MacAddr = MacAddr([2, 0, 0, 0, 0, 1]);

    fn g4(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    /// An IPv4 frame to `dst` carrying IGMP message `m` (checksum filled in).
    fn igmp(dst: [u8; 4], mut m: Vec<u8>) -> Vec<u8> {
        let c = fold(sum(&m, 0));
        m[2..4].copy_from_slice(&c.to_be_bytes());
        let mut f = vec![1, 0, 0x5e, 0, 0, 1, 2, 0, 0, 0, 0, 9, 8, 0];
        let mut ip = vec![0x45, 0, 0, 0, 0, 0, 0, 0, 1, 2, 0, 0, 10, 0, 0, 9];
        ip.extend_from_slice(&dst);
        ip[2..4].copy_from_slice(&((20 + m.len()) as u16).to_be_bytes());
        f.extend_from_slice(&ip);
        f.extend_from_slice(&m);
        f
    }

    /// An IPv6 frame from fe80::9 to `dst` with a hop-by-hop Router Alert and ICMPv6 `m`.
    fn mld(dst: Ipv6Addr, mut m: Vec<u8>) -> Vec<u8> {
        let src = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 9);
        let mut pseudo = [0u8; 40];
        pseudo[..16].copy_from_slice(&src.octets());
        pseudo[16..32].copy_from_slice(&dst.octets());
        pseudo[32..36].copy_from_slice(&(m.len() as u32).to_be_bytes());
        pseudo[39] = 58;
        let c = fold(sum(&m, sum(&pseudo, 0)));
        m[2..4].copy_from_slice(&c.to_be_bytes());
        let mut f = vec![0x33, 0x33, 0, 0, 0, 1, 2, 0, 0, 0, 0, 9, 0x86, 0xdd];
        let mut ip = vec![0x60, 0, 0, 0, 0, 0, 0, 1];
        ip[4..6].copy_from_slice(&((8 + m.len()) as u16).to_be_bytes());
        ip.extend_from_slice(&src.octets());
        ip.extend_from_slice(&dst.octets());
        f.extend_from_slice(&ip);
        f.extend_from_slice(&[58, 0, 5, 2, 0, 0, 1, 0]);
        f.extend_from_slice(&m);
        f
    }

    fn report(records: Vec<(IpAddr, bool)>) -> Parsed {
        Parsed::Report { records, truncated: 0 }
    }

    #[test]
    fn igmp_v1_v2_reports_leaves_and_queries_read() {
        let g = [239, 1, 2, 3];
        let f = igmp(g, vec![0x16, 0, 0, 0, 239, 1, 2, 3]);
        assert_eq!(target(&f), Target::Control);
        assert_eq!(parse(&f), report(vec![(g4("239.1.2.3"), true)]));
        assert_eq!(parse(&igmp(g, vec![0x12, 0, 0, 0, 239, 1, 2, 3])), report(vec![(g4("239.1.2.3"), true)]));
        let leave = igmp([224, 0, 0, 2], vec![0x17, 0, 0, 0, 239, 1, 2, 3]);
        assert_eq!(parse(&leave), report(vec![(g4("239.1.2.3"), false)]));
        let q = igmp([224, 0, 0, 1], vec![0x11, 100, 0, 0, 0, 0, 0, 0]);
        assert_eq!(parse(&q), Parsed::Query { src: g4("10.0.0.9"), group: None });
        let q = igmp(g, vec![0x11, 10, 0, 0, 239, 1, 2, 3]);
        assert_eq!(parse(&q), Parsed::Query { src: g4("10.0.0.9"), group: Some(g4("239.1.2.3")) });
        // A report for a link-local group joins nothing.
        assert_eq!(parse(&igmp([224, 0, 0, 251], vec![0x16, 0, 0, 0, 224, 0, 0, 251])), report(vec![]));
    }

    #[test]
    fn igmp_v3_records_join_or_leave_the_whole_group() {
        let mut m = vec![0x22, 0, 0, 0, 0, 0, 0, 4];
        m.extend_from_slice(&[4, 0, 0, 0, 239, 1, 2, 3]); // TO_EX {}: join
        m.extend_from_slice(&[3, 0, 0, 0, 239, 1, 2, 4]); // TO_IN {}: leave
        m.extend_from_slice(&[1, 0, 0, 1, 239, 1, 2, 5, 10, 0, 0, 1]); // IS_IN {s}: join
        m.extend_from_slice(&[6, 0, 0, 1, 239, 1, 2, 6, 10, 0, 0, 1]); // BLOCK: nothing
        let f = igmp([224, 0, 0, 22], m);
        assert_eq!(parse(&f), report(vec![(g4("239.1.2.3"), true), (g4("239.1.2.4"), false), (g4("239.1.2.5"), true)]));
    }

    #[test]
    fn malformed_and_oversized_messages_are_bounded() {
        let good = igmp([239, 1, 2, 3], vec![0x16, 0, 0, 0, 239, 1, 2, 3]);
        let mut bad = good.clone();
        bad[14 + 20 + 4] ^= 1; // checksum no longer matches
        assert_eq!(parse(&bad), Parsed::Malformed);
        assert_eq!(parse(&good[..good.len() - 1]), Parsed::Malformed, "shorter than its IP length");
        // A v3 report claiming more records than it holds.
        assert_eq!(
            parse(&igmp([224, 0, 0, 22], vec![0x22, 0, 0, 0, 0, 0, 0, 9, 4, 0, 0, 0, 239, 1, 2, 3])),
            Parsed::Malformed
        );
        // A record claiming more sources than the frame holds.
        assert_eq!(
            parse(&igmp([224, 0, 0, 22], vec![0x22, 0, 0, 0, 0, 0, 0, 1, 1, 0, 0, 200, 239, 1, 2, 3])),
            Parsed::Malformed
        );
        // 300 records: the first MAX_RECORDS read, the rest counted.
        let mut m = vec![0x22, 0, 0, 0, 0, 0, 1, 44];
        for i in 0..300u16 {
            m.extend_from_slice(&[4, 0, 0, 0, 239, 9, (i >> 8) as u8, i as u8]);
        }
        let Parsed::Report { records, truncated } = parse(&igmp([224, 0, 0, 22], m)) else { panic!("a report") };
        assert_eq!((records.len(), truncated), (MAX_RECORDS, 300 - MAX_RECORDS));
        assert_eq!(parse(&[0u8; 10]), Parsed::Malformed);
    }

    #[test]
    fn mld_v1_v2_read() {
        let g: Ipv6Addr = "ff0e::1:3".parse().unwrap();
        let mut m = vec![131, 0, 0, 0, 0, 0, 0, 0];
        m.extend_from_slice(&g.octets());
        let f = mld(g, m.clone());
        assert_eq!(target(&f), Target::Control);
        assert_eq!(parse(&f), report(vec![(g.into(), true)]));
        m[0] = 132;
        assert_eq!(parse(&mld("ff02::2".parse().unwrap(), m.clone())), report(vec![(g.into(), false)]));
        let mut v2 = vec![143, 0, 0, 0, 0, 0, 0, 2];
        v2.extend_from_slice(&[4, 0, 0, 0]);
        v2.extend_from_slice(&g.octets());
        v2.extend_from_slice(&[4, 0, 0, 0]);
        v2.extend_from_slice(&"ff02::1:ff00:9".parse::<Ipv6Addr>().unwrap().octets());
        assert_eq!(
            parse(&mld("ff02::16".parse().unwrap(), v2)),
            report(vec![(g.into(), true)]),
            "link-local scope not snooped"
        );
        let mut q = vec![130, 0, 0, 0, 0x27, 0x10, 0, 0];
        q.extend_from_slice(&[0; 16]);
        assert_eq!(parse(&mld("ff02::1".parse().unwrap(), q)), Parsed::Query { src: g4("fe80::9"), group: None });
        let mut bad = mld(g, vec![131, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        let n = bad.len();
        bad[n - 1] ^= 1;
        assert_eq!(parse(&bad), Parsed::Malformed);
    }

    #[test]
    fn group_data_is_classed_by_its_ip_destination() {
        let udp = |dst: [u8; 4]| {
            let mut f = igmp(dst, vec![0x16, 0, 0, 0, 0, 0, 0, 0]);
            f[14 + 9] = 17;
            f
        };
        assert_eq!(target(&udp([239, 1, 2, 3])), Target::Group(g4("239.1.2.3")));
        assert_eq!(target(&udp([224, 0, 0, 251])), Target::Flooded);
        assert_eq!(target(&udp([255, 255, 255, 255])), Target::Flooded);
        assert!(snooped(g4("ff05::1:3")) && !snooped(g4("ff02::1")) && !snooped(g4("ff02::1:ff00:1")));
    }

    #[test]
    fn the_queries_written_read_back() {
        let mut b = [0u8; 128];
        let n = write_igmp_query(&mut b, MAC, 125, 100).unwrap();
        assert_eq!(parse(&b[..n]), Parsed::Query { src: g4("0.0.0.0"), group: None });
        assert_eq!(fold(sum(&b[14..38], 0)), 0, "IPv4 header checksum");
        let ll = link_local(MAC);
        assert_eq!(ll, "fe80::ff:fe00:1".parse::<Ipv6Addr>().unwrap());
        let n = write_mld_query(&mut b, MAC, ll, 125, 10_000).unwrap();
        assert_eq!(target(&b[..n]), Target::Control);
        assert_eq!(parse(&b[..n]), Parsed::Query { src: ll.into(), group: None });
    }
}

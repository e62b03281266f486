//! Software segmentation of GSO frames and completion of partial checksums: what the
//! switch does when an output port cannot take a frame with offloads pending.
//!
//! A GSO frame is one large TCP or UDP packet (Ethernet, at most one 802.1Q tag, IPv4 or
//! IPv6 without extension headers, then TCP or UDP) that a sender with TSO/USO handed over
//! together with a virtio-net header saying how to cut it. [`segment`] cuts it into
//! ordinary frames with complete checksums, building each in a caller-supplied scratch
//! buffer; nothing is allocated.
//!
//! No function in this module panics on any input; lengths are checked once.

use crate::checksum::{fold, pseudo_v4, pseudo_v6, sum};
use crate::ethernet::{ETHERTYPE_IPV4, ETHERTYPE_IPV6, ETHERTYPE_QINQ, ETHERTYPE_VLAN, parse_ethernet};
use crate::{VnetHdr, WireError};

const IPV4_MIN_HDR: usize = 20;
const IPV6_HDR: usize = 40;
const TCP_MIN_HDR: usize = 20;
const UDP_HDR: usize = 8;
const PROTO_TCP: u8 = 6;
const PROTO_UDP: u8 = 17;

const TCP_FIN: u8 = 0x01;
const TCP_PSH: u8 = 0x08;
const TCP_CWR: u8 = 0x80;

/// Where the headers of a GSO frame are. Offsets are from the start of the frame and
/// satisfy `l3 < l4 < payload <= end <= frame.len()`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Layout {
    /// Start of the IP header.
    pub(crate) l3: usize,
    /// True for IPv4, false for IPv6.
    pub(crate) v4: bool,
    /// Start of the TCP or UDP header.
    pub(crate) l4: usize,
    /// True for TCP, false for UDP.
    pub(crate) tcp: bool,
    /// Start of the L4 payload (end of all headers).
    pub(crate) payload: usize,
    /// End of the IP packet; bytes after it (link padding) are not part of any segment.
    pub(crate) end: usize,
}

/// True for the IPv6 next-header values that introduce an extension header.
fn is_ipv6_extension(next: u8) -> bool {
    matches!(next, 0 | 43 | 44 | 50 | 51 | 60 | 135 | 139 | 140 | 253 | 254)
}

/// Reads two bytes at `at` as big-endian, or `None` past the end.
fn be16(b: &[u8], at: usize) -> Option<u16> {
    let s = b.get(at..)?.first_chunk::<2>()?;
    Some(u16::from_be_bytes(*s))
}

/// Reads `N` bytes at `at`, or zeros past the end (callers check bounds first).
fn bytes_at<const N: usize>(b: &[u8], at: usize) -> [u8; N] {
    b.get(at..).and_then(|s| s.first_chunk::<N>()).copied().unwrap_or([0; N])
}

/// Writes `v` at `at` if it fits (callers check bounds first).
fn put(b: &mut [u8], at: usize, v: &[u8]) {
    if let Some(dst) = b.get_mut(at..at.saturating_add(v.len())) {
        dst.copy_from_slice(v);
    }
}

/// Finds the headers of a GSO frame of kind `kind` (a `VnetHdr::GSO_*` without ECN) and
/// checks that they describe one consistent packet of that kind.
pub(crate) fn layout(frame: &[u8], kind: u8) -> Result<Layout, WireError> {
    let want_tcp = match kind {
        VnetHdr::GSO_TCPV4 | VnetHdr::GSO_TCPV6 => true,
        VnetHdr::GSO_UDP_L4 => false,
        VnetHdr::GSO_UDP => {
            return Err(WireError::Unsupported("UDP fragmentation offload (UFO, GSO_UDP)"));
        }
        VnetHdr::GSO_NONE => return Err(WireError::BadVnetHeader("frame is not GSO")),
        _ => return Err(WireError::BadVnetHeader("unknown GSO type")),
    };
    let eth = parse_ethernet(frame)?;
    let l3 = eth.payload_offset;
    let (v4, l4, end, proto) = match eth.ethertype {
        ETHERTYPE_IPV4 => {
            let Some(ip) = frame.get(l3..l3 + IPV4_MIN_HDR) else {
                return Err(WireError::Malformed("IPv4 header is cut short"));
            };
            if ip[0] >> 4 != 4 {
                return Err(WireError::Malformed("EtherType says IPv4 but the version field is not 4"));
            }
            let ihl = usize::from(ip[0] & 0x0f) * 4;
            if ihl < IPV4_MIN_HDR {
                return Err(WireError::Malformed("IPv4 header length is below 20 bytes"));
            }
            if u16::from_be_bytes([ip[6], ip[7]]) & 0x3fff != 0 {
                return Err(WireError::Unsupported("segmenting an IPv4 fragment"));
            }
            let total = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
            // A total length of 0 is how BIG TCP marks packets over 64 KiB: the frame's
            // length is the packet's.
            let end = if total == 0 { frame.len() } else { l3 + total };
            if end > frame.len() {
                return Err(WireError::Malformed("IPv4 total length runs past the end of the frame"));
            }
            if l3 + ihl > end {
                return Err(WireError::Malformed("IPv4 header is longer than the packet"));
            }
            if kind == VnetHdr::GSO_TCPV6 {
                return Err(WireError::BadVnetHeader("GSO type is TCPv6 but the frame carries IPv4"));
            }
            (true, l3 + ihl, end, ip[9])
        }
        ETHERTYPE_IPV6 => {
            let Some(ip) = frame.get(l3..l3 + IPV6_HDR) else {
                return Err(WireError::Malformed("IPv6 header is cut short"));
            };
            if ip[0] >> 4 != 6 {
                return Err(WireError::Malformed("EtherType says IPv6 but the version field is not 6"));
            }
            let plen = usize::from(u16::from_be_bytes([ip[4], ip[5]]));
            // A payload length of 0 (jumbogram / BIG TCP): the frame's length is the packet's.
            let end = if plen == 0 { frame.len() } else { l3 + IPV6_HDR + plen };
            if end > frame.len() {
                return Err(WireError::Malformed("IPv6 payload length runs past the end of the frame"));
            }
            if kind == VnetHdr::GSO_TCPV4 {
                return Err(WireError::BadVnetHeader("GSO type is TCPv4 but the frame carries IPv6"));
            }
            if is_ipv6_extension(ip[6]) {
                return Err(WireError::Unsupported("segmenting IPv6 packets with extension headers"));
            }
            (false, l3 + IPV6_HDR, end, ip[6])
        }
        ETHERTYPE_VLAN => {
            return Err(WireError::Unsupported("segmenting frames with more than one VLAN tag"));
        }
        ETHERTYPE_QINQ => return Err(WireError::Unsupported("segmenting 802.1ad (QinQ) frames")),
        _ => {
            return Err(WireError::BadVnetHeader("GSO frame carries neither IPv4 nor IPv6"));
        }
    };
    let payload = if want_tcp {
        if proto != PROTO_TCP {
            return Err(WireError::BadVnetHeader("GSO type is TCP but the IP packet is not TCP"));
        }
        if l4 + TCP_MIN_HDR > end {
            return Err(WireError::Malformed("TCP header is cut short"));
        }
        let doff = frame.get(l4 + 12).map_or(0, |b| usize::from(b >> 4) * 4);
        if doff < TCP_MIN_HDR {
            return Err(WireError::Malformed("TCP data offset is below 20 bytes"));
        }
        if l4 + doff > end {
            return Err(WireError::Malformed("TCP header (with options) is longer than the packet"));
        }
        l4 + doff
    } else {
        if proto != PROTO_UDP {
            return Err(WireError::BadVnetHeader("GSO type is UDP_L4 but the IP packet is not UDP"));
        }
        if l4 + UDP_HDR > end {
            return Err(WireError::Malformed("UDP header is cut short"));
        }
        l4 + UDP_HDR
    };
    Ok(Layout { l3, v4, l4, tcp: want_tcp, payload, end })
}

/// Length of the largest L3 packet (IP header + L4 header + `gso_size` payload) the GSO
/// frame would be cut into: what must fit the output MTU. For a non-GSO frame, the L3
/// length (`frame.len()` minus the Ethernet [`payload_offset`](crate::EthernetInfo)).
///
/// When the GSO frame's payload is smaller than `gso_size`, its one segment is what counts.
/// Errors: [`WireError::Runt`] for a frame shorter than its Ethernet header;
/// [`WireError::BadVnetHeader`] for an unknown GSO kind, a `gso_size` of 0 or a kind that
/// does not match the packet; [`WireError::Malformed`] for IP or L4 headers that do not
/// parse or segments whose IP length would exceed 65535; [`WireError::Unsupported`] for
/// UFO, IPv6 extension headers, IPv4 fragments or stacked tags. A frame this accepts,
/// [`segment`] can cut (given a large enough scratch buffer).
pub fn gso_max_l3_len(frame: &[u8], hdr: &VnetHdr) -> Result<usize, WireError> {
    if !hdr.is_gso() {
        let eth = parse_ethernet(frame)?;
        return Ok(frame.len() - eth.payload_offset);
    }
    let (lay, largest) = plan(frame, hdr)?;
    Ok(lay.payload - lay.l3 + largest)
}

/// Parses a GSO frame's headers and checks that it can be cut as `hdr` asks. Returns the
/// layout and the payload length of the largest segment.
fn plan(frame: &[u8], hdr: &VnetHdr) -> Result<(Layout, usize), WireError> {
    let lay = layout(frame, hdr.gso_kind())?;
    if hdr.gso_size == 0 {
        return Err(WireError::BadVnetHeader("GSO frame with a gso_size of 0"));
    }
    let largest = (lay.end - lay.payload).min(usize::from(hdr.gso_size));
    // The IPv4 total length, IPv6 payload length and UDP length must fit 16 bits.
    let ip_len = if lay.v4 { lay.payload - lay.l3 } else { lay.payload - lay.l4 } + largest;
    if ip_len > usize::from(u16::MAX) {
        return Err(WireError::Malformed("a segment would exceed the 65535-byte IP length limit"));
    }
    Ok((lay, largest))
}

/// Completes the partial checksum of a non-GSO frame whose header says `F_NEEDS_CSUM`:
/// computes the Internet checksum over `frame[csum_start..]` (the sender already put the
/// pseudo-header sum in the checksum field, as Linux `CHECKSUM_PARTIAL` does) and stores
/// it at `csum_start + csum_offset`. Afterwards the frame needs no offload.
///
/// A result of 0 is stored as 0xffff (equivalent in ones-complement arithmetic, and
/// required for UDP, where 0 means "no checksum"), as Linux does. Without
/// `F_NEEDS_CSUM` this does nothing and returns `Ok(())`. Errors:
/// [`WireError::BadChecksumOffsets`] if the two-byte field does not lie inside `frame`;
/// [`WireError::Unsupported`] for a GSO frame (cut it with [`segment`] instead, which
/// computes every segment's checksum).
pub fn fill_partial_checksum(frame: &mut [u8], hdr: &VnetHdr) -> Result<(), WireError> {
    if !hdr.needs_csum() {
        return Ok(());
    }
    if hdr.is_gso() {
        return Err(WireError::Unsupported("completing the checksum of a GSO frame; segment it instead"));
    }
    let start = usize::from(hdr.csum_start);
    let at = start + usize::from(hdr.csum_offset);
    if at + 2 > frame.len() {
        return Err(WireError::BadChecksumOffsets);
    }
    let c = match fold(sum(&frame[start..], 0)) {
        0 => 0xffff,
        c => c,
    };
    put(frame, at, &c.to_be_bytes());
    Ok(())
}

/// Cuts a GSO frame into ordinary frames each carrying at most `hdr.gso_size` payload
/// bytes, with complete and correct checksums, and hands each to `emit`.
///
/// The frame is Ethernet, optionally one 802.1Q tag, then IPv4 or IPv6 (without extension
/// headers: those are [`WireError::Unsupported`]), then TCP for `GSO_TCPV4`/`GSO_TCPV6`
/// or UDP for `GSO_UDP_L4`. The frame's own headers, as far as parsing finds them (not
/// `hdr.hdr_len`, which is only a hint), are the template for every segment. Checksums are
/// computed from scratch: the IPv4 header checksum and the TCP/UDP checksum over the
/// pseudo-header; whatever partial checksum the input carries is ignored.
///
/// Per segment: IPv4 total length and header checksum are rewritten and the IPv4 id is the
/// original id plus the segment's index; the IPv6 payload length is rewritten; the TCP
/// sequence number is advanced by the segment's payload offset, FIN and PSH stay only on
/// the last segment and CWR only on the first; the UDP length is rewritten (with
/// `GSO_UDP_L4` every segment is its own datagram). A GSO frame whose payload is not
/// larger than `gso_size` yields one segment. A frame that is not GSO yields one frame,
/// its partial checksum filled if `F_NEEDS_CSUM`.
///
/// Each segment is built in `scratch` and passed as `emit(&scratch[..seg_len])`; when
/// `emit` returns false, segmentation stops. If `scratch` cannot hold the headers plus the
/// largest segment's payload (`min(gso_size, payload)`; for a non-GSO frame,
/// `frame.len()`), the result is [`WireError::ScratchTooSmall`].
///
/// Returns the number of calls made to `emit`, counting a last one that returned false.
/// Nothing is emitted when an error is returned: every check happens before the first
/// segment. Bytes after the IP packet's own length (link padding) belong to no segment.
/// A UDP checksum that computes to 0 is sent as 0xffff. Errors are those of
/// [`gso_max_l3_len`] plus [`WireError::ScratchTooSmall`]; a non-GSO frame gets those of
/// [`fill_partial_checksum`].
pub fn segment(
    frame: &[u8],
    hdr: &VnetHdr,
    scratch: &mut [u8],
    mut emit: impl FnMut(&[u8]) -> bool,
) -> Result<usize, WireError> {
    if !hdr.is_gso() {
        parse_ethernet(frame)?;
        let Some(out) = scratch.get_mut(..frame.len()) else {
            return Err(WireError::ScratchTooSmall { need: frame.len() });
        };
        out.copy_from_slice(frame);
        fill_partial_checksum(out, hdr)?;
        emit(out);
        return Ok(1);
    }
    let (lay, largest) = plan(frame, hdr)?;
    let gso = usize::from(hdr.gso_size);
    let hdrs = lay.payload;
    let payload = &frame[hdrs..lay.end];
    let need = hdrs + largest;
    let Some(scratch) = scratch.get_mut(..need) else {
        return Err(WireError::ScratchTooSmall { need });
    };
    scratch[..hdrs].copy_from_slice(&frame[..hdrs]);

    let (l3, l4) = (lay.l3, lay.l4);
    let ip_id = be16(frame, l3 + 4).unwrap_or(0);
    let seq = u32::from_be_bytes(bytes_at(frame, l4 + 4));
    let tcp_flags = frame.get(l4 + 13).copied().unwrap_or(0);
    let (proto, csum_at) = if lay.tcp { (PROTO_TCP, l4 + 16) } else { (PROTO_UDP, l4 + 6) };

    let mut off = 0usize;
    let mut count = 0usize;
    loop {
        let n = (payload.len() - off).min(gso);
        let first = off == 0;
        let last = off + n >= payload.len();
        let seg_len = hdrs + n;
        scratch[hdrs..seg_len].copy_from_slice(&payload[off..off + n]);
        let seg = &mut scratch[..seg_len];
        let l4_len = seg_len - l4;

        let pseudo = if lay.v4 {
            put(seg, l3 + 2, &((seg_len - l3) as u16).to_be_bytes());
            put(seg, l3 + 4, &ip_id.wrapping_add(count as u16).to_be_bytes());
            put(seg, l3 + 10, &[0, 0]);
            let c = fold(sum(&seg[l3..l4], 0));
            put(seg, l3 + 10, &c.to_be_bytes());
            pseudo_v4(bytes_at(seg, l3 + 12), bytes_at(seg, l3 + 16), proto, l4_len as u32)
        } else {
            put(seg, l3 + 4, &((seg_len - l4) as u16).to_be_bytes());
            pseudo_v6(bytes_at(seg, l3 + 8), bytes_at(seg, l3 + 24), proto, l4_len as u32)
        };

        if lay.tcp {
            put(seg, l4 + 4, &seq.wrapping_add(off as u32).to_be_bytes());
            let mut f = tcp_flags;
            if !last {
                f &= !(TCP_FIN | TCP_PSH);
            }
            if !first {
                f &= !TCP_CWR;
            }
            put(seg, l4 + 13, &[f]);
        } else {
            put(seg, l4 + 4, &(l4_len as u16).to_be_bytes());
        }
        put(seg, csum_at, &[0, 0]);
        let c = match fold(sum(&seg[l4..], pseudo)) {
            0 if !lay.tcp => 0xffff,
            c => c,
        };
        put(seg, csum_at, &c.to_be_bytes());

        count += 1;
        if !emit(seg) || last {
            return Ok(count);
        }
        off += n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checksum;
    use crate::ethernet::ETH_HDR_LEN;
    use etherparse::{LinkExtSlice, NetSlice, SlicedPacket, TransportSlice};
    use std::vec;
    use std::vec::Vec;

    /// Ethernet: 02:00:00:00:00:02 <- 02:00:00:00:00:01, IPv4.
    const ETH_V4: [u8; 14] = [0x02, 0, 0, 0, 0, 0x02, 0x02, 0, 0, 0, 0, 0x01, 0x08, 0x00];
    /// Ethernet: same addresses, IPv6.
    const ETH_V6: [u8; 14] = [0x02, 0, 0, 0, 0, 0x02, 0x02, 0, 0, 0, 0, 0x01, 0x86, 0xdd];
    /// IPv4 10.0.0.1 -> 10.0.0.2, id 0x1234, DF, TTL 64, TCP. Length and checksum are junk
    /// (the length is fixed by `build`; the checksum must be recomputed, never trusted).
    const IP4_TCP: [u8; 20] =
        [0x45, 0x00, 0x00, 0x00, 0x12, 0x34, 0x40, 0x00, 0x40, 0x06, 0xde, 0xad, 10, 0, 0, 1, 10, 0, 0, 2];
    /// The same with protocol UDP and id 0xffff (wraps to 0 on the second segment).
    const IP4_UDP: [u8; 20] =
        [0x45, 0x00, 0x00, 0x00, 0xff, 0xff, 0x40, 0x00, 0x40, 0x11, 0xbe, 0xef, 10, 0, 0, 1, 10, 0, 0, 2];
    /// IPv6 fd00::1 -> fd00::2, flow label 0x12345, next header TCP, hop limit 64.
    const IP6_TCP: [u8; 40] = [
        0x60, 0x01, 0x23, 0x45, 0x00, 0x00, 0x06, 0x40, //
        0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, //
        0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2,
    ];
    /// TCP 5000 -> 40000, seq 0xfffffc00 (wraps inside the stream), ack 1, flags
    /// CWR|PSH|ACK|FIN, window 0xffff, junk checksum.
    const TCP: [u8; 20] =
        [0x13, 0x88, 0x9c, 0x40, 0xff, 0xff, 0xfc, 0x00, 0, 0, 0, 1, 0x50, 0x99, 0xff, 0xff, 0x55, 0xaa, 0, 0];
    /// TCP with 12 bytes of options (NOP, NOP, timestamp), seq 1000, flags ACK|PSH.
    const TCP_OPTS: [u8; 32] = [
        0x13, 0x88, 0x9c, 0x40, 0, 0, 0x03, 0xe8, 0, 0, 0, 1, 0x80, 0x18, 0x01, 0x00, 0x12, 0x34, 0, 0, //
        0x01, 0x01, 0x08, 0x0a, 0, 0, 0, 1, 0, 0, 0, 2,
    ];
    /// UDP 4789 -> 4789, length junk, checksum junk.
    const UDP: [u8; 8] = [0x12, 0xb5, 0x12, 0xb5, 0x00, 0x00, 0x77, 0x77];

    fn tag(frame: &[u8], tci: u16) -> Vec<u8> {
        let mut f = frame[..12].to_vec();
        f.extend_from_slice(&[0x81, 0x00]);
        f.extend_from_slice(&tci.to_be_bytes());
        f.extend_from_slice(&frame[12..]);
        f
    }

    fn payload(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 7 + i / 251) as u8).collect()
    }

    /// An Ethernet frame from header templates, with the IP (and UDP) length fields set.
    fn build(eth: &[u8], ip: &[u8], l4: &[u8], data: &[u8]) -> Vec<u8> {
        let mut f = eth.to_vec();
        let mut ip = ip.to_vec();
        let mut l4 = l4.to_vec();
        if ip[0] >> 4 == 4 {
            let total = (ip.len() + l4.len() + data.len()) as u16;
            ip[2..4].copy_from_slice(&total.to_be_bytes());
        } else {
            ip[4..6].copy_from_slice(&((l4.len() + data.len()) as u16).to_be_bytes());
        }
        if l4.len() == 8 {
            l4[4..6].copy_from_slice(&((8 + data.len()) as u16).to_be_bytes());
        }
        f.extend_from_slice(&ip);
        f.extend_from_slice(&l4);
        f.extend_from_slice(data);
        f
    }

    fn gso(kind: u8, size: u16) -> VnetHdr {
        VnetHdr { flags: VnetHdr::F_NEEDS_CSUM, gso_type: kind, gso_size: size, hdr_len: 54, ..VnetHdr::default() }
    }

    fn cut(frame: &[u8], hdr: &VnetHdr) -> Vec<Vec<u8>> {
        let mut scratch = vec![0u8; 70_000];
        let mut out = Vec::new();
        let n = segment(frame, hdr, &mut scratch, |s| {
            out.push(s.to_vec());
            true
        })
        .unwrap();
        assert_eq!(n, out.len());
        out
    }

    /// What one segment looks like, read back with checks.
    struct Seg {
        l3: usize,
        l4: usize,
        payload: Vec<u8>,
        ip_id: Option<u16>,
        tcp_seq: Option<u32>,
        tcp_flags: Option<u8>,
    }

    /// Checks a segment's lengths and checksums twice: with this crate's checksum module
    /// and with etherparse's own checksum code.
    fn verify(seg: &[u8], tagged: bool) -> Seg {
        let eth = parse_ethernet(seg).unwrap();
        let l3 = eth.payload_offset;
        assert_eq!(l3, if tagged { 18 } else { 14 });
        let ip = &seg[l3..];
        let (l4, pseudo, ip_id);
        if eth.ethertype == ETHERTYPE_IPV4 {
            let ihl = usize::from(ip[0] & 0xf) * 4;
            assert_eq!(usize::from(u16::from_be_bytes([ip[2], ip[3]])), seg.len() - l3, "IPv4 total length");
            assert_eq!(checksum::fold(checksum::sum(&ip[..ihl], 0)), 0, "IPv4 header checksum");
            l4 = l3 + ihl;
            ip_id = Some(u16::from_be_bytes([ip[4], ip[5]]));
            let (s, d) = (ip[12..16].try_into().unwrap(), ip[16..20].try_into().unwrap());
            pseudo = checksum::pseudo_v4(s, d, ip[9], (seg.len() - l4) as u32);
        } else {
            assert_eq!(usize::from(u16::from_be_bytes([ip[4], ip[5]])), seg.len() - l3 - 40, "IPv6 payload length");
            l4 = l3 + 40;
            ip_id = None;
            let (s, d) = (ip[8..24].try_into().unwrap(), ip[24..40].try_into().unwrap());
            pseudo = checksum::pseudo_v6(s, d, ip[6], (seg.len() - l4) as u32);
        }
        assert_eq!(checksum::fold(checksum::sum(&seg[l4..], pseudo)), 0, "L4 checksum");

        // The same with etherparse.
        let p = SlicedPacket::from_ethernet(seg).unwrap();
        assert_eq!(matches!(p.link_exts.first(), Some(LinkExtSlice::Vlan(_))), tagged);
        let (v4, v6) = match &p.net {
            Some(NetSlice::Ipv4(s)) => {
                let h = s.header().to_header();
                assert_eq!(h.calc_header_checksum(), h.header_checksum);
                (Some((h.source, h.destination)), None)
            }
            Some(NetSlice::Ipv6(s)) => (None, Some((s.header().source(), s.header().destination()))),
            other => panic!("not IP: {other:?}"),
        };
        let (payload, tcp_seq, tcp_flags) = match &p.transport {
            Some(TransportSlice::Tcp(t)) => {
                let c = match (v4, v6) {
                    (Some((s, d)), _) => t.calc_checksum_ipv4(s, d).unwrap(),
                    (_, Some((s, d))) => t.calc_checksum_ipv6(s, d).unwrap(),
                    _ => unreachable!(),
                };
                assert_eq!(c, t.checksum(), "etherparse TCP checksum");
                (t.payload().to_vec(), Some(t.sequence_number()), Some(seg[l4 + 13]))
            }
            Some(TransportSlice::Udp(u)) => {
                let h = u.to_header();
                assert_eq!(usize::from(u.length()), seg.len() - l4, "UDP length");
                let c = match (v4, v6) {
                    (Some((s, d)), _) => h.calc_checksum_ipv4_raw(s, d, u.payload()).unwrap(),
                    (_, Some((s, d))) => h.calc_checksum_ipv6_raw(s, d, u.payload()).unwrap(),
                    _ => unreachable!(),
                };
                assert_eq!(c, u.checksum(), "etherparse UDP checksum");
                assert_ne!(u.checksum(), 0);
                (u.payload().to_vec(), None, None)
            }
            other => panic!("not TCP/UDP: {other:?}"),
        };
        Seg { l3, l4, payload, ip_id, tcp_seq, tcp_flags }
    }

    /// Cuts `frame`, verifies every segment, checks the payloads reassemble to `data` and
    /// that every segment fits `gso_max_l3_len`; returns the segments' payload lengths.
    fn cut_and_verify(frame: &[u8], hdr: &VnetHdr, data: &[u8], tagged: bool) -> (Vec<Vec<u8>>, Vec<Seg>) {
        let raw = cut(frame, hdr);
        let segs: Vec<Seg> = raw.iter().map(|s| verify(s, tagged)).collect();
        let joined: Vec<u8> = segs.iter().flat_map(|s| s.payload.iter().copied()).collect();
        assert_eq!(joined, data, "payload reassembles");
        let max = gso_max_l3_len(frame, hdr).unwrap();
        assert_eq!(raw.iter().zip(&segs).map(|(r, s)| r.len() - s.l3).max().unwrap(), max);
        for (r, s) in raw.iter().zip(&segs) {
            // Headers other than the ones rewritten are the template's.
            assert_eq!(r[..12], frame[..12]);
            assert!(s.payload.len() <= usize::from(hdr.gso_size));
            assert!(s.l4 > s.l3);
        }
        (raw, segs)
    }

    #[test]
    fn ipv4_tcp_3000_by_1000() {
        let data = payload(3000);
        for tagged in [false, true] {
            let mut f = build(&ETH_V4, &IP4_TCP, &TCP, &data);
            if tagged {
                f = tag(&f, 0x2064);
            }
            let h = gso(VnetHdr::GSO_TCPV4, 1000);
            assert_eq!(gso_max_l3_len(&f, &h), Ok(1040));
            let (raw, segs) = cut_and_verify(&f, &h, &data, tagged);
            assert_eq!(segs.len(), 3);
            let l2 = if tagged { 18 } else { 14 };
            assert!(raw.iter().all(|r| r.len() == l2 + 1040));
            let seqs: Vec<u32> = segs.iter().map(|s| s.tcp_seq.unwrap()).collect();
            assert_eq!(seqs, [0xffff_fc00, 0xffff_ffe8, 0x0000_03d0]);
            let flags: Vec<u8> = segs.iter().map(|s| s.tcp_flags.unwrap()).collect();
            // CWR only first; FIN and PSH only last; ACK everywhere.
            assert_eq!(flags, [0x90, 0x10, 0x19]);
            let ids: Vec<u16> = segs.iter().map(|s| s.ip_id.unwrap()).collect();
            assert_eq!(ids, [0x1234, 0x1235, 0x1236]);
            if tagged {
                assert!(raw.iter().all(|r| r[12..16] == [0x81, 0x00, 0x20, 0x64]));
            }
        }
    }

    #[test]
    fn uneven_last_segment_and_ecn() {
        let data = payload(2500);
        let f = build(&ETH_V4, &IP4_TCP, &TCP, &data);
        let h = gso(VnetHdr::GSO_TCPV4 | VnetHdr::GSO_ECN, 1448);
        let (raw, segs) = cut_and_verify(&f, &h, &data, false);
        assert_eq!(segs.iter().map(|s| s.payload.len()).collect::<Vec<_>>(), [1448, 1052]);
        assert_eq!(raw[1].len(), 14 + 40 + 1052);
        assert_eq!(segs[1].tcp_seq, Some(0xffff_fc00u32.wrapping_add(1448)));
    }

    #[test]
    fn ipv6_tcp_with_options() {
        let data = payload(4000);
        for tagged in [false, true] {
            let mut f = build(&ETH_V6, &IP6_TCP, &TCP_OPTS, &data);
            if tagged {
                f = tag(&f, 7);
            }
            let h = gso(VnetHdr::GSO_TCPV6, 1428);
            assert_eq!(gso_max_l3_len(&f, &h), Ok(40 + 32 + 1428));
            let (raw, segs) = cut_and_verify(&f, &h, &data, tagged);
            assert_eq!(segs.iter().map(|s| s.payload.len()).collect::<Vec<_>>(), [1428, 1428, 1144]);
            assert_eq!(segs.iter().map(|s| s.tcp_seq.unwrap()).collect::<Vec<_>>(), [1000, 2428, 3856]);
            assert_eq!(segs.iter().map(|s| s.tcp_flags.unwrap()).collect::<Vec<_>>(), [0x10, 0x10, 0x18]);
            // Options and the flow label are copied to every segment.
            let l4 = segs[0].l4;
            assert!(raw.iter().all(|r| r[l4 + 20..l4 + 32] == TCP_OPTS[20..]));
            assert!(raw.iter().all(|r| r[l4 - 40..l4 - 36] == [0x60, 0x01, 0x23, 0x45]));
        }
    }

    #[test]
    fn udp_l4_over_ipv4_and_ipv6() {
        let data = payload(3000);
        let mut ip6_udp = IP6_TCP;
        ip6_udp[6] = 17;
        for tagged in [false, true] {
            for (eth, ip) in [(&ETH_V4, &IP4_UDP[..]), (&ETH_V6, &ip6_udp[..])] {
                let mut f = build(eth, ip, &UDP, &data);
                if tagged {
                    f = tag(&f, 100);
                }
                let h = gso(VnetHdr::GSO_UDP_L4, 1200);
                let (raw, segs) = cut_and_verify(&f, &h, &data, tagged);
                assert_eq!(segs.iter().map(|s| s.payload.len()).collect::<Vec<_>>(), [1200, 1200, 600]);
                assert!(segs.iter().all(|s| s.tcp_seq.is_none()));
                if ip[0] >> 4 == 4 {
                    let ids: Vec<u16> = segs.iter().map(|s| s.ip_id.unwrap()).collect();
                    assert_eq!(ids, [0xffff, 0x0000, 0x0001]);
                }
                // Each segment is its own datagram: its UDP length covers only itself.
                for (r, s) in raw.iter().zip(&segs) {
                    assert_eq!(usize::from(u16::from_be_bytes([r[s.l4 + 4], r[s.l4 + 5]])), 8 + s.payload.len());
                }
            }
        }
    }

    #[test]
    fn small_payloads_give_one_segment() {
        for n in [0, 1, 999, 1000] {
            let data = payload(n);
            let f = build(&ETH_V4, &IP4_TCP, &TCP, &data);
            let h = gso(VnetHdr::GSO_TCPV4, 1000);
            let (_, segs) = cut_and_verify(&f, &h, &data, false);
            assert_eq!(segs.len(), 1);
            // One segment is first and last: it keeps CWR, PSH and FIN.
            assert_eq!(segs[0].tcp_flags, Some(0x99));
            assert_eq!(gso_max_l3_len(&f, &h), Ok(40 + n));
        }
        let f = build(&ETH_V4, &IP4_TCP, &TCP, &payload(1001));
        assert_eq!(cut(&f, &gso(VnetHdr::GSO_TCPV4, 1000)).len(), 2);
    }

    #[test]
    fn link_padding_is_not_payload() {
        let data = payload(4);
        let mut f = build(&ETH_V4, &IP4_TCP, &TCP, &data);
        f.extend_from_slice(&[0; 2]); // padded to the 60-byte minimum
        assert_eq!(f.len(), 60);
        let (raw, _) = cut_and_verify(&f, &gso(VnetHdr::GSO_TCPV4, 1000), &data, false);
        assert_eq!(raw[0].len(), 58);
    }

    #[test]
    fn emit_returning_false_stops() {
        let f = build(&ETH_V4, &IP4_TCP, &TCP, &payload(5000));
        let mut scratch = [0u8; 2000];
        let mut seen = 0;
        let n = segment(&f, &gso(VnetHdr::GSO_TCPV4, 1000), &mut scratch, |_| {
            seen += 1;
            seen < 2
        });
        assert_eq!((n, seen), (Ok(2), 2));
    }

    #[test]
    fn scratch_must_hold_headers_and_one_segment() {
        let f = build(&ETH_V4, &IP4_TCP, &TCP, &payload(3000));
        let h = gso(VnetHdr::GSO_TCPV4, 1000);
        let mut small = [0u8; 1053];
        assert_eq!(segment(&f, &h, &mut small, |_| true), Err(WireError::ScratchTooSmall { need: 1054 }));
        let mut exact = [0u8; 1054];
        assert_eq!(segment(&f, &h, &mut exact, |_| true), Ok(3));
        // A non-GSO frame needs room for itself.
        let mut tiny = [0u8; 10];
        assert_eq!(
            segment(&f, &VnetHdr::default(), &mut tiny, |_| true),
            Err(WireError::ScratchTooSmall { need: f.len() })
        );
    }

    #[test]
    fn refuses_what_it_cannot_cut() {
        let data = payload(3000);
        let v4 = build(&ETH_V4, &IP4_TCP, &TCP, &data);
        let v6 = build(&ETH_V6, &IP6_TCP, &TCP, &data);
        let mut scratch = vec![0u8; 4000];
        let mut err = |f: &[u8], h: VnetHdr| {
            let a = gso_max_l3_len(f, &h).unwrap_err();
            let b = segment(f, &h, &mut scratch, |_| panic!("nothing may be emitted")).unwrap_err();
            assert_eq!(a, b);
            a
        };
        let bad_hdr = |e| matches!(e, WireError::BadVnetHeader(_));
        let unsupported = |e| matches!(e, WireError::Unsupported(_));
        let malformed = |e| matches!(e, WireError::Malformed(_));

        assert!(bad_hdr(err(&v4, gso(VnetHdr::GSO_TCPV6, 1000))), "says IPv6, carries IPv4");
        assert!(bad_hdr(err(&v6, gso(VnetHdr::GSO_TCPV4, 1000))), "says IPv4, carries IPv6");
        assert!(bad_hdr(err(&v4, gso(VnetHdr::GSO_UDP_L4, 1000))), "says UDP, carries TCP");
        assert!(bad_hdr(err(&v4, gso(VnetHdr::GSO_TCPV4, 0))));
        assert!(bad_hdr(err(&v4, gso(9, 1000))));
        assert!(unsupported(err(&v4, gso(VnetHdr::GSO_UDP, 1000))));

        let mut arp = v4.clone();
        arp[12..14].copy_from_slice(&[0x08, 0x06]);
        assert!(bad_hdr(err(&arp, gso(VnetHdr::GSO_TCPV4, 1000))));
        let mut qinq = tag(&v4, 5);
        qinq[12..14].copy_from_slice(&[0x88, 0xa8]);
        assert!(unsupported(err(&qinq, gso(VnetHdr::GSO_TCPV4, 1000))));
        assert!(unsupported(err(&tag(&tag(&v4, 5), 6), gso(VnetHdr::GSO_TCPV4, 1000))));

        let mut hop_by_hop = v6.clone();
        hop_by_hop[14 + 6] = 0;
        assert!(unsupported(err(&hop_by_hop, gso(VnetHdr::GSO_TCPV6, 1000))));
        let mut frag = v4.clone();
        frag[14 + 6] = 0x20; // MF
        assert!(unsupported(err(&frag, gso(VnetHdr::GSO_TCPV4, 1000))));

        assert_eq!(err(&v4[..13], gso(VnetHdr::GSO_TCPV4, 1000)), WireError::Runt { len: 13 });
        assert!(malformed(err(&v4[..14 + 19], gso(VnetHdr::GSO_TCPV4, 1000))));
        assert!(malformed(err(&v4[..100], gso(VnetHdr::GSO_TCPV4, 1000))), "total length past the end");
        assert!(malformed(err(&v6[..100], gso(VnetHdr::GSO_TCPV6, 1000))), "payload length past the end");
        let mut short_ip = v4.clone();
        short_ip[14 + 2..14 + 4].copy_from_slice(&30u16.to_be_bytes());
        assert!(malformed(err(&short_ip, gso(VnetHdr::GSO_TCPV4, 1000))), "TCP header past the total length");
        let mut ihl = v4.clone();
        ihl[14] = 0x44;
        assert!(malformed(err(&ihl, gso(VnetHdr::GSO_TCPV4, 1000))));
        let mut version = v4.clone();
        version[14] = 0x65;
        assert!(malformed(err(&version, gso(VnetHdr::GSO_TCPV4, 1000))));
        let mut doff = v4.clone();
        doff[34 + 12] = 0x40;
        assert!(malformed(err(&doff, gso(VnetHdr::GSO_TCPV4, 1000))));
        doff[34 + 12] = 0xf0; // 60 bytes of TCP header in a 40-byte... packet of 3040: fine
        assert!(gso_max_l3_len(&doff, &gso(VnetHdr::GSO_TCPV4, 1000)).is_ok());
    }

    #[test]
    fn too_long_segments_are_refused() {
        // BIG TCP style: IPv4 total length 0, 70000 bytes of payload, gso_size 65535.
        let data = payload(70_000);
        let mut f = build(&ETH_V4, &IP4_TCP, &TCP, &data);
        f[16..18].copy_from_slice(&[0, 0]);
        assert!(matches!(gso_max_l3_len(&f, &gso(VnetHdr::GSO_TCPV4, 65_535)), Err(WireError::Malformed(_))));
        // With a sane gso_size it is cut, and its length comes from the frame.
        let h = gso(VnetHdr::GSO_TCPV4, 60_000);
        let (_, segs) = cut_and_verify(&f, &h, &data, false);
        assert_eq!(segs.len(), 2);
    }

    #[test]
    fn non_gso_frames_pass_through_with_the_checksum_filled() {
        let data = payload(101);
        let mut f = build(&ETH_V4, &IP4_TCP, &TCP, &data);
        // A correct IPv4 header checksum, and the pseudo-header sum in the TCP field.
        f[24..26].copy_from_slice(&[0, 0]);
        let c = checksum::fold(checksum::sum(&f[14..34], 0));
        f[24..26].copy_from_slice(&c.to_be_bytes());
        let pseudo = checksum::pseudo_v4([10, 0, 0, 1], [10, 0, 0, 2], 6, 20 + 101);
        f[50..52].copy_from_slice(&(!checksum::fold(pseudo)).to_be_bytes());
        let h = VnetHdr { flags: VnetHdr::F_NEEDS_CSUM, csum_start: 34, csum_offset: 16, ..VnetHdr::default() };
        let out = cut(&f, &h);
        assert_eq!(out.len(), 1);
        let s = verify(&out[0], false);
        assert_eq!((s.payload, s.tcp_flags), (data, Some(0x99)));
        // Without NEEDS_CSUM the frame goes out unchanged.
        let out = cut(&f, &VnetHdr::default());
        assert_eq!(out, [f.clone()]);
        assert_eq!(gso_max_l3_len(&f, &VnetHdr::default()), Ok(f.len() - ETH_HDR_LEN));
        assert_eq!(gso_max_l3_len(&tag(&f, 1), &VnetHdr::default()), Ok(f.len() - ETH_HDR_LEN));
        assert_eq!(gso_max_l3_len(&f[..10], &VnetHdr::default()), Err(WireError::Runt { len: 10 }));
    }

    #[test]
    fn fill_partial_checksum_udp() {
        // IPv4 10.0.0.1:4789 -> 10.0.0.2:4789 UDP, 4 bytes of payload; the checksum field
        // holds the folded pseudo-header sum (0a00+0001+0a00+0002+0011+000c = 0x1420).
        let mut f = [
            0x02, 0, 0, 0, 0, 0x02, 0x02, 0, 0, 0, 0, 0x01, 0x08, 0x00, // Ethernet
            0x45, 0x00, 0x00, 0x20, 0x00, 0x01, 0x00, 0x00, 0x40, 0x11, 0x66, 0xca, 10, 0, 0, 1, 10, 0, 0,
            2, // IPv4
            0x12, 0xb5, 0x12, 0xb5, 0x00, 0x0c, 0x14, 0x20, // UDP
            0xde, 0xad, 0xbe, 0xef,
        ];
        assert_eq!(checksum::fold(checksum::sum(&f[14..34], 0)), 0, "the literal IPv4 header is right");
        let h = VnetHdr { flags: VnetHdr::F_NEEDS_CSUM, csum_start: 34, csum_offset: 6, ..VnetHdr::default() };
        fill_partial_checksum(&mut f, &h).unwrap();
        // 0x12b5 + 0x12b5 + 0x000c + 0x1420 + 0xdead + 0xbeef = 0x1_d732 -> 0xd733 -> !0xd733.
        assert_eq!(f[40..42], [0x28, 0xcc]);
        verify(&f, false);
    }

    #[test]
    fn fill_partial_checksum_zero_becomes_ffff_and_bounds_are_checked() {
        // Words summing to 0xffff: the checksum computes to 0 and is stored as 0xffff.
        let mut f = [0x12, 0x34, 0x00, 0x00, 0xed, 0xcb];
        let h = VnetHdr { flags: VnetHdr::F_NEEDS_CSUM, csum_start: 0, csum_offset: 2, ..VnetHdr::default() };
        fill_partial_checksum(&mut f, &h).unwrap();
        assert_eq!(f, [0x12, 0x34, 0xff, 0xff, 0xed, 0xcb]);
        let beyond = VnetHdr { csum_offset: 5, ..h };
        assert_eq!(fill_partial_checksum(&mut f, &beyond), Err(WireError::BadChecksumOffsets));
        let far = VnetHdr { csum_start: u16::MAX, csum_offset: u16::MAX, ..h };
        assert_eq!(fill_partial_checksum(&mut f, &far), Err(WireError::BadChecksumOffsets));
        let last = VnetHdr { csum_start: 4, csum_offset: 0, ..h };
        assert_eq!(fill_partial_checksum(&mut f, &last), Ok(()));
        let gso_frame = VnetHdr { gso_type: VnetHdr::GSO_TCPV4, gso_size: 1, ..h };
        assert!(matches!(fill_partial_checksum(&mut f, &gso_frame), Err(WireError::Unsupported(_))));
        let before = f;
        assert_eq!(fill_partial_checksum(&mut f, &VnetHdr { flags: 0, ..far }), Ok(()));
        assert_eq!(f, before, "no NEEDS_CSUM: untouched");
    }

    fn any_hdr() -> impl proptest::strategy::Strategy<Value = VnetHdr> {
        use proptest::prelude::*;
        (any::<u8>(), any::<u8>(), any::<u16>(), 0u16..3000, any::<u16>(), any::<u16>()).prop_map(
            |(flags, gso_type, hdr_len, gso_size, csum_start, csum_offset)| VnetHdr {
                flags,
                gso_type: match gso_type % 8 {
                    0..=5 => gso_type % 8,
                    6 => gso_type,
                    _ => (gso_type % 8) | VnetHdr::GSO_ECN,
                },
                hdr_len,
                gso_size,
                csum_start: csum_start % 128,
                csum_offset: csum_offset % 64,
                num_buffers: 0,
            },
        )
    }

    /// The ones' complement sum of `b` (16-bit words, folded): 0xffff over a header whose
    /// checksum is right.
    fn ones_sum(b: &[u8]) -> u16 {
        let mut sum: u32 = b.chunks(2).map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]))).sum();
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        sum as u16
    }

    /// An IPv4 header whose reserved flag bit an edit set (a tagged frame's byte 24) is cut
    /// with a checksum that verifies over its bytes.
    #[test]
    fn a_reserved_flag_bit_keeps_the_checksum_right() {
        let mut f = tag(&build(&ETH_V4, &IP4_TCP, &TCP, &payload(0)), 42);
        f[24] = 192;
        let mut scratch = vec![0u8; 4000];
        let mut sums = Vec::new();
        let r = segment(&f, &gso(VnetHdr::GSO_TCPV4, 1), &mut scratch, |s| {
            let at = parse_ethernet(s).map(|e| e.payload_offset).unwrap();
            let ihl = usize::from(s[at] & 0x0f) * 4;
            sums.push(ones_sum(&s[at..at + ihl]));
            true
        });
        assert!(r.is_ok(), "{r:?}");
        assert!(!sums.is_empty() && sums.iter().all(|&x| x == 0xffff), "{sums:?}");
    }

    proptest::proptest! {
        #[test]
        fn never_panic_on_arbitrary_bytes(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300),
            hdr in any_hdr(),
            scratch_len in 0usize..400,
        ) {
            let _ = gso_max_l3_len(&bytes, &hdr);
            let mut scratch = vec![0u8; scratch_len];
            let _ = segment(&bytes, &hdr, &mut scratch, |s| s.len() % 3 != 0);
            let mut copy = bytes.clone();
            let _ = fill_partial_checksum(&mut copy, &hdr);
        }

        /// Valid frames with a few bytes changed and a random cut: whatever
        /// `gso_max_l3_len` accepts, `segment` cuts into segments that fit that length and
        /// carry correct checksums.
        #[test]
        fn mutated_frames_segment_consistently(
            which in 0usize..6,
            tagged in proptest::prelude::any::<bool>(),
            n in 0usize..3000,
            gso_size in 1u16..1600,
            edits in proptest::collection::vec((0usize..80, proptest::prelude::any::<u8>()), 0..3),
            cut_at in proptest::option::of(0usize..3200),
        ) {
            let data = payload(n);
            let mut ip6_udp = IP6_TCP;
            ip6_udp[6] = 17;
            let (mut f, kind) = match which {
                0 => (build(&ETH_V4, &IP4_TCP, &TCP, &data), VnetHdr::GSO_TCPV4),
                1 => (build(&ETH_V4, &IP4_TCP, &TCP_OPTS, &data), VnetHdr::GSO_TCPV4),
                2 => (build(&ETH_V6, &IP6_TCP, &TCP, &data), VnetHdr::GSO_TCPV6),
                3 => (build(&ETH_V6, &IP6_TCP, &TCP_OPTS, &data), VnetHdr::GSO_TCPV6),
                4 => (build(&ETH_V4, &IP4_UDP, &UDP, &data), VnetHdr::GSO_UDP_L4),
                _ => (build(&ETH_V6, &ip6_udp, &UDP, &data), VnetHdr::GSO_UDP_L4),
            };
            if tagged {
                f = tag(&f, 42);
            }
            for (at, v) in edits {
                if let Some(b) = f.get_mut(at) {
                    *b = v;
                }
            }
            if let Some(c) = cut_at {
                f.truncate(c);
            }
            let h = gso(kind, gso_size);
            let mut scratch = vec![0u8; 4000];
            let mut lens = Vec::new();
            let mut ok = true;
            let r = segment(&f, &h, &mut scratch, |s| {
                let l3 = parse_ethernet(s).map(|e| e.payload_offset).unwrap_or(usize::MAX);
                lens.push(s.len() - l3.min(s.len()));
                // Every segment's IP and L4 checksums verify, by etherparse too, unless an
                // edit changed what the headers say (then it must still not panic).
                if SlicedPacket::from_ethernet(s).is_ok_and(|p| p.transport.is_some()) {
                    let p = SlicedPacket::from_ethernet(s).unwrap();
                    ok &= match (&p.net, &p.transport) {
                        (Some(NetSlice::Ipv4(ip)), Some(TransportSlice::Tcp(t))) => {
                            let h = ip.header();
                            // (Summed over the header's own bytes: etherparse's header
                            // drops the reserved flag bit, which an edit may set.)
                            ones_sum(h.slice()) == 0xffff
                                && t.calc_checksum_ipv4(h.source(), h.destination()).ok() == Some(t.checksum())
                        }
                        (Some(NetSlice::Ipv6(ip)), Some(TransportSlice::Tcp(t))) => {
                            let h = ip.header();
                            t.calc_checksum_ipv6(h.source(), h.destination()).ok() == Some(t.checksum())
                        }
                        (Some(NetSlice::Ipv4(ip)), Some(TransportSlice::Udp(u))) => {
                            let h = ip.header();
                            u.to_header().calc_checksum_ipv4_raw(h.source(), h.destination(), u.payload()).ok()
                                == Some(u.checksum())
                        }
                        (Some(NetSlice::Ipv6(ip)), Some(TransportSlice::Udp(u))) => {
                            let h = ip.header();
                            u.to_header().calc_checksum_ipv6_raw(h.source(), h.destination(), u.payload()).ok()
                                == Some(u.checksum())
                        }
                        _ => true,
                    };
                }
                true
            });
            match gso_max_l3_len(&f, &h) {
                Ok(max) => {
                    proptest::prop_assert!(r.is_ok(), "{:?}", r);
                    proptest::prop_assert_eq!(r.ok(), Some(lens.len()));
                    proptest::prop_assert_eq!(lens.iter().copied().max(), Some(max));
                    proptest::prop_assert!(ok, "a segment's checksum did not verify");
                }
                Err(e) => {
                    proptest::prop_assert_eq!(r, Err(e));
                    proptest::prop_assert!(lens.is_empty());
                }
            }
        }
    }
}

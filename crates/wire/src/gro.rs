//! Merging received TCP segments of one flow into one GSO frame (what Linux's GRO does):
//! the receive side's counterpart of [`crate::segment`], for a port that reads many
//! segments at once and hands them on to outputs that take offloads.
//!
//! A [`Merge`] starts with one segment and takes the next while it continues the first:
//! the same headers but for the lengths, the IPv4 id and checksum, the sequence number
//! (which must follow on) and PSH; a payload no larger than the first's, and a smaller one,
//! or PSH, ends it. Every segment's checksums are verified before it is taken, so a merged
//! frame (whose TCP checksum is left partial, as a sender's GSO frame has it) never hides a
//! corrupted one; a segment that fails is left for the caller to pass on as it came.
//!
//! No function in this module panics on any input; nothing is allocated.

use crate::VnetHdr;
use crate::checksum::{fold, pseudo_v4, pseudo_v6, sum};
use crate::ethernet::{ETHERTYPE_IPV4, ETHERTYPE_IPV6, parse_ethernet};
use crate::gso::{Layout, layout};

const TCP_PSH: u8 = 0x08;
const TCP_ACK: u8 = 0x10;

/// Segments with less payload than this are not merged: a GSO frame's segment size has a
/// floor (Linux's smallest MSS is 48), and small segments are not where the time goes.
pub const MIN_MERGE_PAYLOAD: usize = 536;

/// The most segments one merged frame holds (Linux's GRO stops at 64 too).
pub const MAX_MERGE_SEGMENTS: usize = 64;

/// A merge under way: the frame built so far lies at the start of the caller's buffer.
#[derive(Clone, Copy, Debug)]
pub struct Merge {
    lay: Layout,
    /// Bytes of the frame so far.
    len: usize,
    /// The first segment's payload length: every other is at most this.
    mss: usize,
    /// The sequence number the next segment must carry.
    next_seq: u32,
    segments: usize,
    /// A shorter segment or PSH came: nothing more is taken.
    closed: bool,
}

/// The layout of a TCP segment that may be merged: IPv4 (not a fragment) or IPv6 without
/// extension headers, at most one VLAN tag, only ACK and PSH set, a payload of at least
/// [`MIN_MERGE_PAYLOAD`], no bytes after the IP packet, and correct checksums.
fn mergeable(frame: &[u8]) -> Option<Layout> {
    let kind = match parse_ethernet(frame).ok()?.ethertype {
        ETHERTYPE_IPV4 => VnetHdr::GSO_TCPV4,
        ETHERTYPE_IPV6 => VnetHdr::GSO_TCPV6,
        _ => return None,
    };
    let lay = layout(frame, kind).ok()?;
    let flags = frame[lay.l4 + 13];
    if lay.end != frame.len() || flags & !(TCP_ACK | TCP_PSH) != 0 || flags & TCP_ACK == 0 {
        return None;
    }
    if lay.end - lay.payload < MIN_MERGE_PAYLOAD {
        return None;
    }
    let l4_len = (lay.end - lay.l4) as u32;
    let pseudo = if lay.v4 {
        if fold(sum(&frame[lay.l3..lay.l4], 0)) != 0 {
            return None;
        }
        pseudo_v4(bytes(frame, lay.l3 + 12), bytes(frame, lay.l3 + 16), 6, l4_len)
    } else {
        pseudo_v6(bytes(frame, lay.l3 + 8), bytes(frame, lay.l3 + 24), 6, l4_len)
    };
    (fold(sum(&frame[lay.l4..lay.end], pseudo)) == 0).then_some(lay)
}

/// `N` bytes at `at` (callers checked the bounds).
fn bytes<const N: usize>(b: &[u8], at: usize) -> [u8; N] {
    b.get(at..).and_then(|s| s.first_chunk::<N>()).copied().unwrap_or([0; N])
}

fn seq(frame: &[u8], lay: &Layout) -> u32 {
    u32::from_be_bytes(bytes(frame, lay.l4 + 4))
}

impl Merge {
    /// Starts a merge with `frame`, copied to the start of `out`; `None` when it cannot
    /// start one (see the module's rules; a frame `out` cannot hold), and then `out` is
    /// unchanged.
    pub fn start(frame: &[u8], out: &mut [u8]) -> Option<Merge> {
        let lay = mergeable(frame)?;
        out.get_mut(..frame.len())?.copy_from_slice(frame);
        let mss = lay.end - lay.payload;
        Some(Merge {
            lay,
            len: frame.len(),
            mss,
            next_seq: seq(frame, &lay).wrapping_add(mss as u32),
            segments: 1,
            closed: frame[lay.l4 + 13] & TCP_PSH != 0,
        })
    }

    /// Appends `frame`'s payload to the merged frame in `out` (the same buffer `start`
    /// wrote) if it continues it; false otherwise, and then nothing changed.
    pub fn push(&mut self, frame: &[u8], out: &mut [u8]) -> bool {
        if self.closed || self.segments >= MAX_MERGE_SEGMENTS {
            return false;
        }
        let lay = self.lay;
        // Same header lengths and the same bytes in every field that must not change.
        if frame.len() <= lay.payload || out.len() < self.len {
            return false;
        }
        let same = |a: usize, b: usize| frame.get(a..b) == out.get(a..b);
        let headers_match = if lay.v4 {
            // Lengths (2..4), id (4..6) and checksum (10..12) may differ.
            same(0, lay.l3 + 2) && same(lay.l3 + 6, lay.l3 + 10) && same(lay.l3 + 12, lay.l4 + 4)
        } else {
            // The payload length (4..6) may differ.
            same(0, lay.l3 + 4) && same(lay.l3 + 6, lay.l4 + 4)
        };
        // Sequence (4..8), flags (13) and checksum (16..18) are checked apart.
        if !headers_match || !same(lay.l4 + 8, lay.l4 + 13) || !same(lay.l4 + 14, lay.l4 + 16) {
            return false;
        }
        if !same(lay.l4 + 18, lay.payload) {
            return false;
        }
        let Some(l) = mergeable(frame) else { return false };
        if l != (Layout { end: l.end, ..lay }) || seq(frame, &l) != self.next_seq {
            return false;
        }
        let n = l.end - l.payload;
        let ip_len = if lay.v4 { self.len - lay.l3 } else { self.len - lay.l4 } + n;
        if n > self.mss || ip_len > usize::from(u16::MAX) || self.len + n > out.len() {
            return false;
        }
        out[self.len..self.len + n].copy_from_slice(&frame[l.payload..]);
        self.len += n;
        self.next_seq = self.next_seq.wrapping_add(n as u32);
        self.segments += 1;
        let flags = frame[lay.l4 + 13];
        out[lay.l4 + 13] |= flags & TCP_PSH;
        self.closed = n < self.mss || flags & TCP_PSH != 0;
        true
    }

    /// Whether the merge may take another segment (no shorter one, no PSH, room for more).
    pub fn is_open(&self) -> bool {
        !self.closed && self.segments < MAX_MERGE_SEGMENTS
    }

    /// Segments in the frame so far.
    pub fn segments(&self) -> usize {
        self.segments
    }

    /// Finishes the frame in `out`: returns its length and its virtio-net header. One
    /// segment stays as it came, its checksum marked verified (`F_DATA_VALID`); several
    /// become a GSO frame (`GSO_TCPV4`/`GSO_TCPV6`, the first segment's payload as the
    /// segment size) with its IP lengths and IPv4 checksum rewritten and its TCP checksum
    /// left partial (`F_NEEDS_CSUM`: the field holds the pseudo-header's sum), as a sender's
    /// TSO frame has it.
    pub fn finish(self, out: &mut [u8]) -> (usize, VnetHdr) {
        let lay = self.lay;
        if self.segments == 1 {
            return (self.len, VnetHdr { flags: VnetHdr::F_DATA_VALID, ..VnetHdr::default() });
        }
        let frame = &mut out[..self.len];
        let l4_len = (self.len - lay.l4) as u32;
        let pseudo = if lay.v4 {
            let total = (self.len - lay.l3) as u16;
            frame[lay.l3 + 2..lay.l3 + 4].copy_from_slice(&total.to_be_bytes());
            frame[lay.l3 + 10..lay.l3 + 12].fill(0);
            let c = fold(sum(&frame[lay.l3..lay.l4], 0));
            frame[lay.l3 + 10..lay.l3 + 12].copy_from_slice(&c.to_be_bytes());
            pseudo_v4(bytes(frame, lay.l3 + 12), bytes(frame, lay.l3 + 16), 6, l4_len)
        } else {
            frame[lay.l3 + 4..lay.l3 + 6].copy_from_slice(&(l4_len as u16).to_be_bytes());
            pseudo_v6(bytes(frame, lay.l3 + 8), bytes(frame, lay.l3 + 24), 6, l4_len)
        };
        // The partial checksum: the pseudo-header's sum, not complemented.
        let partial = !fold(pseudo);
        frame[lay.l4 + 16..lay.l4 + 18].copy_from_slice(&partial.to_be_bytes());
        let hdr = VnetHdr {
            flags: VnetHdr::F_NEEDS_CSUM,
            gso_type: if lay.v4 { VnetHdr::GSO_TCPV4 } else { VnetHdr::GSO_TCPV6 },
            hdr_len: lay.payload as u16,
            gso_size: self.mss as u16,
            csum_start: lay.l4 as u16,
            csum_offset: 16,
            ..VnetHdr::default()
        };
        (self.len, hdr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::vec;
    use std::vec::Vec;

    /// A TCP stream's GSO frame of `payload` bytes over IPv4 or IPv6, seq `seq0`.
    fn stream(v6: bool, payload: &[u8], seq0: u32, flags: u8) -> Vec<u8> {
        let mut f = vec![0x02, 0, 0, 0, 0, 2, 0x02, 0, 0, 0, 0, 1];
        if v6 {
            f.extend_from_slice(&[0x86, 0xdd, 0x60, 0, 0, 0, 0, 0, 6, 64]);
            f.extend_from_slice(&[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
            f.extend_from_slice(&[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
        } else {
            f.extend_from_slice(&[
                0x08, 0x00, 0x45, 0, 0, 0, 0x12, 0x34, 0x40, 0, 64, 6, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2,
            ]);
        }
        f.extend_from_slice(&[0x13, 0x88, 0x9c, 0x40]);
        f.extend_from_slice(&seq0.to_be_bytes());
        f.extend_from_slice(&[0, 0, 0, 1, 0x80, flags, 0x01, 0x00, 0, 0, 0, 0]);
        f.extend_from_slice(&[0x01, 0x01, 0x08, 0x0a, 0, 0, 0, 1, 0, 0, 0, 2]);
        let l3 = 14;
        if v6 {
            let plen = (f.len() - l3 - 40 + payload.len()) as u16;
            f[l3 + 4..l3 + 6].copy_from_slice(&plen.to_be_bytes());
        } else {
            let total = (f.len() - l3 + payload.len()) as u16;
            f[l3 + 2..l3 + 4].copy_from_slice(&total.to_be_bytes());
        }
        f.extend_from_slice(payload);
        f
    }

    /// `frame` cut by [`crate::segment`] at `mss`.
    fn cut(frame: &[u8], v6: bool, mss: u16) -> Vec<Vec<u8>> {
        let hdr = VnetHdr {
            gso_type: if v6 { VnetHdr::GSO_TCPV6 } else { VnetHdr::GSO_TCPV4 },
            gso_size: mss,
            ..VnetHdr::default()
        };
        let mut scratch = vec![0u8; 70_000];
        let mut segs = Vec::new();
        crate::segment(frame, &hdr, &mut scratch, |s| {
            segs.push(s.to_vec());
            true
        })
        .unwrap();
        segs
    }

    /// Merges `segs` as a port would: as many merged frames as it takes, each with its
    /// header; frames that start none pass as they came.
    fn merge_all(segs: &[Vec<u8>]) -> Vec<(Vec<u8>, VnetHdr)> {
        let mut out = vec![0u8; 70_000];
        let mut frames = Vec::new();
        let mut i = 0;
        while i < segs.len() {
            match Merge::start(&segs[i], &mut out) {
                Some(mut m) => {
                    i += 1;
                    while i < segs.len() && m.push(&segs[i], &mut out) {
                        i += 1;
                    }
                    let (n, h) = m.finish(&mut out);
                    frames.push((out[..n].to_vec(), h));
                }
                None => {
                    frames.push((segs[i].clone(), VnetHdr::default()));
                    i += 1;
                }
            }
        }
        frames
    }

    /// Every frame cut again (a GSO one by its header, with a fresh checksum) in order.
    fn recut(frames: &[(Vec<u8>, VnetHdr)], v6: bool) -> Vec<Vec<u8>> {
        frames.iter().flat_map(|(f, h)| if h.is_gso() { cut(f, v6, h.gso_size) } else { vec![f.clone()] }).collect()
    }

    #[test]
    fn a_cut_stream_merges_back_into_one_frame() {
        for v6 in [false, true] {
            let payload: Vec<u8> = (0..20_000u32).map(|i| (i * 7) as u8).collect();
            let whole = stream(v6, &payload, 1000, TCP_ACK | TCP_PSH);
            let segs = cut(&whole, v6, 1448);
            let frames = merge_all(&segs);
            assert_eq!(frames.len(), 1);
            let (f, h) = &frames[0];
            assert_eq!((h.gso_size, h.needs_csum(), h.is_gso()), (1448, true, true));
            assert_eq!(f.len(), whole.len());
            assert_eq!(f[f.len() - payload.len()..], payload[..]);
            assert_eq!(recut(&frames, v6), segs, "cut again, the same segments");
        }
    }

    #[test]
    fn a_bad_checksum_a_gap_or_other_flags_end_a_merge() {
        let payload: Vec<u8> = (0..8000u32).map(|i| i as u8).collect();
        let segs = cut(&stream(false, &payload, 1, TCP_ACK), false, 1000);
        let mut bad = segs.clone();
        let last = bad[3].len() - 1;
        bad[3][last] ^= 1;
        let frames = merge_all(&bad);
        assert_eq!(frames.iter().map(|(_, h)| h.is_gso()).collect::<Vec<_>>(), [true, false, true]);
        assert_eq!(frames[1].0, bad[3], "the corrupted segment passes as it came");
        let mut gap = segs.clone();
        gap.remove(4);
        assert_eq!(merge_all(&gap).len(), 2);
        // (The cut keeps FIN on the last segment only.)
        let fin = cut(&stream(false, &payload, 1, TCP_ACK | 0x01), false, 1000);
        let frames = merge_all(&fin);
        assert_eq!(frames.len(), 2);
        assert_eq!((&frames[1].0, frames[1].1.is_gso()), (&fin[7], false), "FIN is never merged");
    }

    proptest::proptest! {
        #[test]
        fn merging_then_cutting_gives_back_the_segments(
            len in 0usize..30_000,
            mss in 536u16..2000,
            v6 in proptest::bool::ANY,
            seq0 in proptest::prelude::any::<u32>(),
            drop_at in proptest::option::of(0usize..40),
            flip in proptest::option::of((0usize..40, 0usize..2000)),
        ) {
            let payload: Vec<u8> = (0..len).map(|i| (i * 31 + i / 7) as u8).collect();
            let mut segs = cut(&stream(v6, &payload, seq0, TCP_ACK | TCP_PSH), v6, mss);
            if let Some(d) = drop_at.filter(|&d| d < segs.len()) {
                segs.remove(d);
            }
            if let Some((s, b)) = flip.filter(|&(s, _)| s < segs.len()) {
                let at = segs[s].len() - 1 - b.min(segs[s].len() - 1);
                segs[s][at] ^= 0x40;
            }
            let frames = merge_all(&segs);
            // Nothing lost, nothing reordered, nothing changed: a corrupted segment passes
            // alone, so its receiver still sees the bad checksum.
            proptest::prop_assert_eq!(recut(&frames, v6), segs);
            for (f, h) in &frames {
                if h.is_gso() {
                    proptest::prop_assert!(f.len() <= 14 + 40 + 32 + 65_535);
                }
            }
        }
    }
}

//! The bytes the attackers send: frames from ever new source MACs (`mac-flood`) and VXLAN
//! datagrams from a host on the underlay that is not a tunnel endpoint (`underlay-flood`).
//! Pure builders, deterministic for a seed, so the tests can read what they make.

use sluice_wire::vxlan;

/// A small, fast generator (xorshift64): the attackers need varied bytes, not good ones.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// Seeded with `seed` (0 is replaced: xorshift never leaves 0).
    pub fn new(seed: u64) -> Rng {
        Rng(if seed == 0 { 0x9E37_79B9_7F4A_7C15 } else { seed })
    }

    /// The next number.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// `n` varied bytes.
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next_u64() as u8).collect()
    }
}

/// Length of a mac-flood frame: the Ethernet minimum.
pub const MAC_FLOOD_LEN: usize = 60;

/// Frame `i` of a MAC flood starting at `base`: from the unicast source 02:66:(base + i),
/// to the unknown unicast destination 02:67:(base + i), EtherType 0x88B5 (local
/// experimental), zeros. Each `i` is a source no one sent from before.
pub fn mac_flood_frame(base: u32, i: u32) -> [u8; MAC_FLOOD_LEN] {
    let n = base.wrapping_add(i).to_be_bytes();
    let mut f = [0u8; MAC_FLOOD_LEN];
    f[..6].copy_from_slice(&[0x02, 0x67, n[0], n[1], n[2], n[3]]);
    f[6..12].copy_from_slice(&[0x02, 0x66, n[0], n[1], n[2], n[3]]);
    f[12..14].copy_from_slice(&[0x88, 0xB5]);
    f
}

/// Distinct inner source addresses an underlay flood uses: enough to make learning
/// tables churn, few enough that a table that learns from anyone (Linux `vxlan`, a
/// bridge) stays bounded.
pub const UNDERLAY_SOURCES: u64 = 16_384;

/// What one datagram of an underlay flood is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Datagram {
    /// The tunnel's VNI, an inner broadcast (an ARP request) from a made-up station.
    Broadcast,
    /// The tunnel's VNI, an inner unicast to a guest of the path (or an unknown station).
    Unicast,
    /// Another VNI.
    ForeignVni,
    /// Random bytes: a runt, a header without its flag, anything.
    Garbage,
}

impl Datagram {
    /// The mix of a flood, by the datagram's number: 40% broadcasts, 30% unicasts, 15%
    /// foreign VNIs, 15% garbage.
    pub fn nth(i: u64) -> Datagram {
        match i % 20 {
            0..8 => Datagram::Broadcast,
            8..14 => Datagram::Unicast,
            14..17 => Datagram::ForeignVni,
            _ => Datagram::Garbage,
        }
    }
}

/// Writes datagram `i` of an underlay flood into `buf` (what follows the UDP header): VNI
/// `vni`, inner sources from a pool of [`UNDERLAY_SOURCES`] under the prefix
/// 02:5A:`tag`, unicasts to `known` (a guest's MAC) every other time and to unknown
/// stations otherwise.
pub fn underlay_datagram(rng: &mut Rng, i: u64, vni: u32, tag: [u8; 2], known: Option<[u8; 6]>, buf: &mut Vec<u8>) {
    buf.clear();
    let kind = Datagram::nth(i);
    if kind == Datagram::Garbage {
        let n = (rng.next_u64() % 64) as usize;
        buf.extend(rng.bytes(n));
        return;
    }
    let vni =
        if kind == Datagram::ForeignVni { (vni + 1 + (rng.next_u64() % 1000) as u32) & vxlan::VNI_MAX } else { vni };
    buf.extend_from_slice(&vxlan::header(vni));
    let s = rng.next_u64() % UNDERLAY_SOURCES;
    let src = [0x02, 0x5A, tag[0], tag[1], (s >> 8) as u8, s as u8];
    let dst = match kind {
        Datagram::Unicast => match known {
            Some(m) if i.is_multiple_of(2) => m,
            _ => {
                let r = rng.next_u64().to_be_bytes();
                [0x02, 0x5B, r[0], r[1], r[2], r[3]]
            }
        },
        _ => [0xFF; 6],
    };
    buf.extend_from_slice(&dst);
    buf.extend_from_slice(&src);
    if kind == Datagram::Unicast {
        buf.extend_from_slice(&[0x08, 0x00]);
        let n = 46 + (rng.next_u64() % 150) as usize;
        buf.extend(rng.bytes(n));
    } else {
        // An ARP request for a guest's address (10.77.0.2 or 10.231.0.2, alternately).
        buf.extend_from_slice(&[0x08, 0x06, 0, 1, 0x08, 0, 6, 4, 0, 1]);
        buf.extend_from_slice(&src);
        buf.extend_from_slice(&[10, 77, 0, 250]);
        buf.extend_from_slice(&[0; 6]);
        buf.extend_from_slice(if i.is_multiple_of(2) { &[10, 77, 0, 2] } else { &[10, 231, 0, 2] });
        buf.resize(buf.len() + 18, 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mac_flood_frames_come_from_a_new_unicast_source_each() {
        let a = mac_flood_frame(0x0102_0304, 0);
        assert_eq!(&a[..14], &[0x02, 0x67, 1, 2, 3, 4, 0x02, 0x66, 1, 2, 3, 4, 0x88, 0xB5]);
        assert!(a[14..].iter().all(|&b| b == 0));
        let b = mac_flood_frame(0x0102_0304, 1);
        assert_eq!(&b[6..12], &[0x02, 0x66, 1, 2, 3, 5]);
        assert_eq!(b[6] & 1, 0, "unicast source");
    }

    #[test]
    fn an_underlay_flood_mixes_its_datagrams_and_keeps_its_sources_bounded() {
        let mut rng = Rng::new(7);
        let mut buf = Vec::new();
        let known = [0x52, 0x54, 0, 0, 0, 2];
        let (mut bcast, mut to_known, mut foreign, mut garbage) = (0, 0, 0, 0);
        let mut sources = std::collections::HashSet::new();
        for i in 0..2000 {
            underlay_datagram(&mut rng, i, 5000, [0xAB, 0xCD], Some(known), &mut buf);
            match Datagram::nth(i) {
                Datagram::Garbage => {
                    garbage += 1;
                    assert!(buf.len() < 64);
                    continue;
                }
                k => {
                    let (vni, inner) = vxlan::decap(&buf).unwrap();
                    assert_eq!(vni == 5000, k != Datagram::ForeignVni, "{k:?}");
                    assert!(inner.len() >= 60, "{k:?}: {} bytes", inner.len());
                    assert_eq!(&inner[6..10], &[0x02, 0x5A, 0xAB, 0xCD]);
                    sources.insert(inner[6..12].to_vec());
                    bcast += usize::from(inner[..6] == [0xFF; 6]);
                    to_known += usize::from(inner[..6] == known);
                    foreign += usize::from(k == Datagram::ForeignVni);
                }
            }
        }
        assert_eq!((garbage, foreign), (300, 300));
        assert_eq!(bcast, 800 + 300, "broadcasts and the foreign VNIs' broadcasts");
        assert_eq!(to_known, 300, "every other unicast to the guest");
        assert!(sources.len() as u64 <= UNDERLAY_SOURCES && sources.len() > 1000, "{}", sources.len());
    }
}

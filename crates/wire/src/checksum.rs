//! The Internet checksum (RFC 1071): ones-complement sum of 16-bit big-endian words,
//! folded and complemented, plus the IPv4 and IPv6 pseudo-header sums that TCP and UDP
//! checksums include.
//!
//! Partial sums are `u32` values that may carry above 16 bits; add more data to one with
//! [`sum`]'s `initial` argument and finish with [`fold`]. When chaining, every piece but
//! the last must have an even length (an odd trailing byte is padded with a zero).
//!
//! No function in this module panics on any input; lengths are checked once.

/// Bytes summed before the wide accumulator is folded; small enough that adding 32-bit
/// words cannot overflow 64 bits.
const BLOCK: usize = 1 << 16;

/// Folds a 64-bit accumulator to 32 bits keeping its value modulo 0xffff.
fn fold64(mut acc: u64) -> u32 {
    while acc >> 32 != 0 {
        acc = (acc & 0xffff_ffff) + (acc >> 32);
    }
    acc as u32
}

/// Adds `data` to the ones-complement partial sum `initial` and returns the new partial
/// sum (not folded, not complemented).
///
/// `data` is read as 16-bit big-endian words; an odd trailing byte is the high byte of a
/// last word whose low byte is zero. The bulk is summed as 32-bit words in the machine's
/// byte order, in eight independent accumulators (which compilers vectorize), folded to
/// 16 bits and byte-swapped: the ones-complement sum does not depend on byte order but
/// for that swap (RFC 1071 section 2 (B)).
pub fn sum(data: &[u8], initial: u32) -> u32 {
    let mut acc = u64::from(initial);
    for block in data.chunks(BLOCK) {
        acc = u64::from(fold64(acc + u64::from(block_sum(block))));
    }
    fold64(acc)
}

/// The big-endian partial sum of at most [`BLOCK`] bytes.
fn block_sum(block: &[u8]) -> u32 {
    let (words, rest) = block.as_chunks::<4>();
    let (groups, tail) = words.as_chunks::<8>();
    // At most 2^14 words of < 2^32 each: no accumulator can overflow.
    let mut lanes = [0u64; 8];
    for g in groups {
        for (l, w) in lanes.iter_mut().zip(g) {
            *l += u64::from(u32::from_ne_bytes(*w));
        }
    }
    let native = lanes.iter().sum::<u64>() + tail.iter().map(|w| u64::from(u32::from_ne_bytes(*w))).sum::<u64>();
    let mut n = fold64(native);
    while n >> 16 != 0 {
        n = (n & 0xffff) + (n >> 16);
    }
    let mut be = u64::from(u16::from_be(n as u16));
    // (BLOCK is a multiple of 4: only the last block has bytes past its words.)
    let (pairs, odd) = rest.as_chunks::<2>();
    for p in pairs {
        be += u64::from(u16::from_be_bytes(*p));
    }
    if let [last] = odd {
        be += u64::from(*last) << 8;
    }
    fold64(be)
}

/// Folds a partial sum to 16 bits and complements it: the value to store in a checksum
/// field. Summing data that contains a correct checksum and folding gives 0.
pub fn fold(sum: u32) -> u16 {
    let mut s = sum;
    while s >> 16 != 0 {
        s = (s & 0xffff) + (s >> 16);
    }
    !(s as u16)
}

/// Partial sum of the IPv4 pseudo-header: source and destination addresses, protocol and
/// the L4 length (TCP or UDP header plus payload).
pub fn pseudo_v4(src: [u8; 4], dst: [u8; 4], proto: u8, l4_len: u32) -> u32 {
    let w = |a: [u8; 4]| u32::from(u16::from_be_bytes([a[0], a[1]])) + u32::from(u16::from_be_bytes([a[2], a[3]]));
    w(src) + w(dst) + u32::from(proto) + (l4_len >> 16) + (l4_len & 0xffff)
}

/// Partial sum of the IPv6 pseudo-header (RFC 8200 section 8.1): source and destination
/// addresses, the 32-bit upper-layer length and the next-header value.
pub fn pseudo_v6(src: [u8; 16], dst: [u8; 16], proto: u8, l4_len: u32) -> u32 {
    let w = |a: [u8; 16]| -> u32 {
        let (pairs, _) = a.as_chunks::<2>();
        pairs.iter().map(|p| u32::from(u16::from_be_bytes(*p))).sum()
    };
    w(src) + w(dst) + u32::from(proto) + (l4_len >> 16) + (l4_len & 0xffff)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::vec::Vec;

    /// Plain 16-bit-at-a-time reference.
    fn slow(data: &[u8]) -> u16 {
        let mut s: u64 = 0;
        let mut i = 0;
        while i + 1 < data.len() {
            s += u64::from(u16::from_be_bytes([data[i], data[i + 1]]));
            i += 2;
        }
        if i < data.len() {
            s += u64::from(data[i]) << 8;
        }
        while s >> 16 != 0 {
            s = (s & 0xffff) + (s >> 16);
        }
        !(s as u16)
    }

    #[test]
    fn rfc1071_example() {
        // RFC 1071 section 3: 00 01 f2 03 f4 f5 f6 f7 sums to ddf2.
        let data = [0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7];
        assert_eq!(fold(sum(&data, 0)), !0xddf2);
        // The same split in two even pieces.
        assert_eq!(fold(sum(&data[4..], sum(&data[..4], 0))), !0xddf2);
    }

    #[test]
    fn ipv4_header_example() {
        // A well-known IPv4 header whose checksum is b861.
        let mut h = [
            0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0x00, 0x00, 0xc0, 0xa8, 0x00, 0x01, 0xc0, 0xa8,
            0x00, 0xc7,
        ];
        assert_eq!(fold(sum(&h, 0)), 0xb861);
        h[10..12].copy_from_slice(&[0xb8, 0x61]);
        assert_eq!(fold(sum(&h, 0)), 0);
    }

    #[test]
    fn odd_length_pads_with_zero() {
        assert_eq!(fold(sum(&[0x12, 0x34, 0x56], 0)), !(0x1234u16 + 0x5600));
        assert_eq!(fold(sum(&[0xab], 0)), !0xab00);
        assert_eq!(fold(sum(&[], 0)), 0xffff);
        assert_eq!(sum(&[], 0x1_2345), 0x1_2345);
    }

    #[test]
    fn all_ones_and_carries() {
        let ones = [0xffu8; 9000];
        assert_eq!(fold(sum(&ones, 0)), 0);
        let big: Vec<u8> = (0..200_003u32).map(|i| (i * 31 + 7) as u8).collect();
        assert_eq!(fold(sum(&big, 0)), slow(&big));
        assert_eq!(fold(sum(&big, u32::MAX)), fold(sum(&big, 0xffff)));
    }

    #[test]
    fn pseudo_headers() {
        // 10.0.0.1 -> 10.0.0.2, TCP, 40 bytes: 0a00 + 0001 + 0a00 + 0002 + 0006 + 0028.
        assert_eq!(pseudo_v4([10, 0, 0, 1], [10, 0, 0, 2], 6, 40), 0x0a00 + 1 + 0x0a00 + 2 + 6 + 40);
        let mut a = [0u8; 16];
        a[0] = 0xfe;
        a[1] = 0x80;
        a[15] = 1;
        let mut b = a;
        b[15] = 2;
        assert_eq!(pseudo_v6(a, b, 17, 0x1_0008), 0xfe80 + 1 + 0xfe80 + 2 + 17 + 1 + 8);
    }

    proptest::proptest! {
        #[test]
        fn matches_the_reference(data in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..3000), split in 0usize..1500) {
            proptest::prop_assert_eq!(fold(sum(&data, 0)), slow(&data));
            let cut = (split * 2).min(data.len() & !1);
            proptest::prop_assert_eq!(fold(sum(&data[cut..], sum(&data[..cut], 0))), slow(&data));
        }
    }
}

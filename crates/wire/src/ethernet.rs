//! Ethernet II headers with an optional outer IEEE 802.1Q tag, and MAC addresses.
//!
//! Layout: destination MAC (6), source MAC (6), EtherType (2); with a tag, the EtherType
//! 0x8100 is followed by the tag control information (TCI: PCP 3 bits, DEI 1, VID 12) and
//! the inner EtherType.
//!
//! No function in this module panics on any input; lengths are checked once.

use core::fmt;
use core::str::FromStr;

use crate::WireError;

/// Length of an untagged Ethernet header: two MAC addresses and the EtherType.
pub const ETH_HDR_LEN: usize = 14;
/// Length of one 802.1Q tag (TPID + TCI).
pub const VLAN_TAG_LEN: usize = 4;
/// EtherType of IPv4.
pub const ETHERTYPE_IPV4: u16 = 0x0800;
/// EtherType of ARP.
pub const ETHERTYPE_ARP: u16 = 0x0806;
/// EtherType of IPv6.
pub const ETHERTYPE_IPV6: u16 = 0x86DD;
/// TPID of an IEEE 802.1Q VLAN tag.
pub const ETHERTYPE_VLAN: u16 = 0x8100;
/// TPID of an IEEE 802.1ad service tag (QinQ); not treated as a VLAN tag by this crate.
pub const ETHERTYPE_QINQ: u16 = 0x88A8;

/// A 48-bit IEEE MAC address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct MacAddr(pub [u8; 6]);

impl MacAddr {
    /// The broadcast address ff:ff:ff:ff:ff:ff.
    pub const BROADCAST: MacAddr = MacAddr([0xff; 6]);

    /// True for group addresses (the I/G bit, the low bit of the first byte, is set);
    /// this includes broadcast.
    pub fn is_multicast(&self) -> bool {
        self.0[0] & 0x01 != 0
    }

    /// True for ff:ff:ff:ff:ff:ff.
    pub fn is_broadcast(&self) -> bool {
        *self == Self::BROADCAST
    }

    /// True for 00:00:00:00:00:00.
    pub fn is_zero(&self) -> bool {
        self.0 == [0; 6]
    }
}

impl fmt::Display for MacAddr {
    /// Writes the address as six lowercase hex pairs joined by colons: `02:00:00:00:00:01`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [a, b, c, d, e, g] = self.0;
        write!(f, "{a:02x}:{b:02x}:{c:02x}:{d:02x}:{e:02x}:{g:02x}")
    }
}

fn hex_digit(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

impl FromStr for MacAddr {
    type Err = WireError;

    /// Parses `aa:bb:cc:dd:ee:ff` or `aa-bb-cc-dd-ee-ff` (hex digits of either case, two per
    /// byte, one separator used throughout). Anything else is [`WireError::BadMac`].
    fn from_str(s: &str) -> Result<MacAddr, WireError> {
        let Some(text) = s.as_bytes().first_chunk::<17>().filter(|_| s.len() == 17) else {
            return Err(WireError::BadMac);
        };
        let sep = text[2];
        if sep != b':' && sep != b'-' {
            return Err(WireError::BadMac);
        }
        let mut mac = [0u8; 6];
        for (i, byte) in mac.iter_mut().enumerate() {
            let at = i * 3;
            if i > 0 && text[at - 1] != sep {
                return Err(WireError::BadMac);
            }
            let (Some(hi), Some(lo)) = (hex_digit(text[at]), hex_digit(text[at + 1])) else {
                return Err(WireError::BadMac);
            };
            *byte = (hi << 4) | lo;
        }
        Ok(MacAddr(mac))
    }
}

/// What the switch needs from the outer Ethernet header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EthernetInfo {
    /// Destination MAC address.
    pub dst: MacAddr,
    /// Source MAC address.
    pub src: MacAddr,
    /// The outer 802.1Q (0x8100) tag's TCI if the frame carries one (an 0x88A8 outer tag
    /// is NOT treated as a VLAN tag here: it is reported as ethertype 0x88A8 with tci None).
    pub tci: Option<u16>,
    /// EtherType after the outer 802.1Q tag (if any).
    pub ethertype: u16,
    /// Offset of the byte after the EtherType field (14, or 18 when tagged).
    pub payload_offset: usize,
}

/// Reads the Ethernet header of `frame`, looking through one outer 802.1Q tag.
///
/// Errors: shorter than 14 bytes (or 18 when the type says 0x8100) -> [`WireError::Runt`].
/// Any EtherType is accepted (0x88B5 etc); values < 0x0600 (802.3 length) are accepted too.
pub fn parse_ethernet(frame: &[u8]) -> Result<EthernetInfo, WireError> {
    let runt = WireError::Runt { len: frame.len() };
    let Some(h) = frame.first_chunk::<ETH_HDR_LEN>() else {
        return Err(runt);
    };
    let [d0, d1, d2, d3, d4, d5, s0, s1, s2, s3, s4, s5, t0, t1] = *h;
    let dst = MacAddr([d0, d1, d2, d3, d4, d5]);
    let src = MacAddr([s0, s1, s2, s3, s4, s5]);
    let outer = u16::from_be_bytes([t0, t1]);
    if outer != ETHERTYPE_VLAN {
        return Ok(EthernetInfo { dst, src, tci: None, ethertype: outer, payload_offset: ETH_HDR_LEN });
    }
    let Some(&[tci0, tci1, e0, e1]) = frame.get(ETH_HDR_LEN..ETH_HDR_LEN + VLAN_TAG_LEN) else {
        return Err(runt);
    };
    Ok(EthernetInfo {
        dst,
        src,
        tci: Some(u16::from_be_bytes([tci0, tci1])),
        ethertype: u16::from_be_bytes([e0, e1]),
        payload_offset: ETH_HDR_LEN + VLAN_TAG_LEN,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::string::ToString;

    const A: MacAddr = MacAddr([0x02, 0, 0, 0, 0, 0x01]);
    const B: MacAddr = MacAddr([0x02, 0, 0, 0, 0, 0x02]);

    #[test]
    fn untagged() {
        let f = [
            0x02, 0, 0, 0, 0, 0x02, // dst
            0x02, 0, 0, 0, 0, 0x01, // src
            0x08, 0x00, // IPv4
            0x45, 0x00, // payload
        ];
        let e = parse_ethernet(&f).unwrap();
        assert_eq!(e, EthernetInfo { dst: B, src: A, tci: None, ethertype: ETHERTYPE_IPV4, payload_offset: 14 });
    }

    #[test]
    fn tagged() {
        let f = [
            0xff, 0xff, 0xff, 0xff, 0xff, 0xff, // dst
            0x02, 0, 0, 0, 0, 0x01, // src
            0x81, 0x00, 0xa0, 0x0a, // 802.1Q, PCP 5, VID 10
            0x86, 0xdd, // IPv6
        ];
        let e = parse_ethernet(&f).unwrap();
        assert_eq!(e.dst, MacAddr::BROADCAST);
        assert_eq!(e.src, A);
        assert_eq!(e.tci, Some(0xa00a));
        assert_eq!(e.ethertype, ETHERTYPE_IPV6);
        assert_eq!(e.payload_offset, 18);
    }

    #[test]
    fn qinq_outer_tag_is_reported_as_its_ethertype() {
        let f = [0x02, 0, 0, 0, 0, 0x02, 0x02, 0, 0, 0, 0, 0x01, 0x88, 0xa8, 0x00, 0x64, 0x81, 0x00];
        let e = parse_ethernet(&f).unwrap();
        assert_eq!((e.tci, e.ethertype, e.payload_offset), (None, ETHERTYPE_QINQ, 14));
    }

    #[test]
    fn any_ethertype_and_802_3_lengths_are_accepted() {
        let mut f = [0u8; 14];
        f[12..].copy_from_slice(&[0x88, 0xb5]);
        assert_eq!(parse_ethernet(&f).unwrap().ethertype, 0x88b5);
        f[12..].copy_from_slice(&[0x00, 0x2e]);
        assert_eq!(parse_ethernet(&f).unwrap().ethertype, 0x002e);
    }

    #[test]
    fn runts() {
        let f = [0x02, 0, 0, 0, 0, 0x02, 0x02, 0, 0, 0, 0, 0x01, 0x81, 0x00, 0x00, 0x0a, 0x08, 0x00];
        assert_eq!(parse_ethernet(&f[..13]), Err(WireError::Runt { len: 13 }));
        assert_eq!(parse_ethernet(&[]), Err(WireError::Runt { len: 0 }));
        // Says 802.1Q but the tag is cut off.
        assert_eq!(parse_ethernet(&f[..14]), Err(WireError::Runt { len: 14 }));
        assert_eq!(parse_ethernet(&f[..17]), Err(WireError::Runt { len: 17 }));
        assert_eq!(parse_ethernet(&f).unwrap().tci, Some(10));
    }

    #[test]
    fn mac_predicates() {
        assert!(MacAddr::BROADCAST.is_broadcast());
        assert!(MacAddr::BROADCAST.is_multicast());
        assert!(MacAddr([0x01, 0x00, 0x5e, 0, 0, 1]).is_multicast());
        assert!(MacAddr([0x33, 0x33, 0, 0, 0, 1]).is_multicast());
        assert!(!A.is_multicast());
        assert!(!A.is_broadcast());
        assert!(!A.is_zero());
        assert!(MacAddr::default().is_zero());
        assert!(A < B);
    }

    #[test]
    fn mac_display_and_parse() {
        assert_eq!(A.to_string(), "02:00:00:00:00:01");
        assert_eq!(MacAddr([0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0xff]).to_string(), "aa:bb:cc:dd:ee:ff");
        assert_eq!("02:00:00:00:00:01".parse(), Ok(A));
        assert_eq!("AA-bb-Cc-dd-ee-FF".parse(), Ok(MacAddr([0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0xff])));
        for bad in [
            "",
            "02:00:00:00:00",
            "02:00:00:00:00:01:",
            "02:00:00:00:00:0g",
            "02:00-00:00:00:01",
            "02.00.00.00.00.01",
            "2:0:0:0:0:1",
            "+2:00:00:00:00:01",
            "02:00:00:00:00:1 ",
            "020000000001",
            "é2:00:00:00:00:1",
        ] {
            assert_eq!(bad.parse::<MacAddr>(), Err(WireError::BadMac), "{bad:?}");
        }
    }

    proptest::proptest! {
        #[test]
        fn parse_ethernet_never_panics(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..40)) {
            match parse_ethernet(&bytes) {
                Ok(e) => proptest::prop_assert!(e.payload_offset <= bytes.len()),
                Err(e) => proptest::prop_assert_eq!(e, WireError::Runt { len: bytes.len() }),
            }
        }

        #[test]
        fn mac_parse_never_panics_and_round_trips(s in "\\PC{0,20}", mac in proptest::prelude::any::<[u8; 6]>()) {
            let _ = s.parse::<MacAddr>();
            let m = MacAddr(mac);
            proptest::prop_assert_eq!(m.to_string().parse::<MacAddr>(), Ok(m));
        }
    }
}

//! The VXLAN header (RFC 7348, section 5): 8 bytes in front of the inner Ethernet frame,
//! carried in UDP to port 4789.
//!
//! ```text
//!  0                   1                   2                   3
//! |R|R|R|R|I|R|R|R|            Reserved                           |
//! |                VXLAN Network Identifier (VNI) |   Reserved    |
//! ```
//!
//! A receiver requires the I flag and ignores the reserved bits (RFC 7348: "MUST be
//! ignored on receipt"), so extensions that set them (GBP, GPE's next-protocol) still read
//! as plain VXLAN; a sender writes them zero.

use crate::WireError;
use crate::ethernet::ETH_HDR_LEN;

/// Length of the VXLAN header.
pub const VXLAN_HDR_LEN: usize = 8;

/// IANA's UDP port for VXLAN.
pub const VXLAN_PORT: u16 = 4789;

/// Bytes a VXLAN tunnel adds in front of the inner frame over an IPv4 underlay: outer
/// Ethernet (14), IPv4 (20), UDP (8), VXLAN (8).
pub const VXLAN_OVERHEAD_V4: usize = 50;

/// The same over IPv6 (a 40-byte IPv6 header).
pub const VXLAN_OVERHEAD_V6: usize = 70;

/// Largest VNI (24 bits).
pub const VNI_MAX: u32 = (1 << 24) - 1;

/// The I flag: the VNI is valid.
const FLAG_I: u8 = 0x08;

/// Reads a VXLAN datagram's payload (what follows the UDP header): returns the VNI and the
/// inner Ethernet frame. Refuses a datagram too short for a header and an Ethernet header,
/// or one without the I flag.
pub fn decap(datagram: &[u8]) -> Result<(u32, &[u8]), WireError> {
    if datagram.len() < VXLAN_HDR_LEN + ETH_HDR_LEN {
        return Err(WireError::Runt { len: datagram.len() });
    }
    if datagram[0] & FLAG_I == 0 {
        return Err(WireError::Malformed("VXLAN header without the I flag (no valid VNI)"));
    }
    let vni = u32::from_be_bytes([0, datagram[4], datagram[5], datagram[6]]);
    Ok((vni, &datagram[VXLAN_HDR_LEN..]))
}

/// The header for `vni` (only its low 24 bits are used).
pub fn header(vni: u32) -> [u8; VXLAN_HDR_LEN] {
    let v = (vni & VNI_MAX).to_be_bytes();
    [FLAG_I, 0, 0, 0, v[1], v[2], v[3], 0]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_reads_back_as_written() {
        let mut d = [0u8; 8 + 60];
        d[..8].copy_from_slice(&header(0x12_3456));
        d[8] = 0xaa;
        let (vni, inner) = decap(&d).unwrap();
        assert_eq!(vni, 0x12_3456);
        assert_eq!(inner.len(), 60);
        assert_eq!(inner[0], 0xaa);
        assert_eq!(header(5000), [0x08, 0, 0, 0, 0, 0x13, 0x88, 0]);
        assert_eq!(header(u32::MAX)[4..7], [0xff, 0xff, 0xff], "24 bits only");
    }

    #[test]
    fn reserved_bits_are_ignored_and_a_missing_i_flag_or_runt_refused() {
        let mut d = [0xffu8; 8 + 14];
        assert_eq!(decap(&d).unwrap().0, VNI_MAX);
        d[0] = 0xf7;
        assert!(matches!(decap(&d), Err(WireError::Malformed(_))));
        assert!(matches!(decap(&d[..21]), Err(WireError::Runt { len: 21 })));
        assert!(matches!(decap(&[]), Err(WireError::Runt { len: 0 })));
    }
}

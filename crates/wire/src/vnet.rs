//! The virtio-net header (`struct virtio_net_hdr_v1`, virtio 1.0, 12 bytes, little-endian)
//! that a Linux TAP device opened with `IFF_VNET_HDR` and `TUNSETVNETHDRSZ` = 12 puts in
//! front of every frame. It carries the checksum and segmentation offload state of the
//! frame that follows.
//!
//! No function in this module panics on any input; lengths are checked once.

use crate::WireError;

/// Length of the virtio-net header on the wire.
pub const VNET_HDR_LEN: usize = 12;

/// A parsed virtio-net header. Fields are in host order; [`VnetHdr::parse`] and
/// [`VnetHdr::emit`] convert from and to the little-endian wire layout.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VnetHdr {
    /// `F_NEEDS_CSUM` and/or `F_DATA_VALID`.
    pub flags: u8,
    /// One of the `GSO_*` kinds, optionally ORed with [`VnetHdr::GSO_ECN`].
    pub gso_type: u8,
    /// Length of the headers (Ethernet through L4) of a GSO frame; a hint only.
    pub hdr_len: u16,
    /// Largest L4 payload per segment of a GSO frame.
    pub gso_size: u16,
    /// Offset in the frame where checksumming starts (with `F_NEEDS_CSUM`).
    pub csum_start: u16,
    /// Offset after `csum_start` where the checksum is stored (with `F_NEEDS_CSUM`).
    pub csum_offset: u16,
    /// Number of merged receive buffers; ignored by sluice and written as given.
    pub num_buffers: u16,
}

impl VnetHdr {
    /// The frame carries a partial checksum to be completed from `csum_start`.
    pub const F_NEEDS_CSUM: u8 = 1;
    /// The checksum of the frame has already been verified.
    pub const F_DATA_VALID: u8 = 2;
    /// Not a GSO frame.
    pub const GSO_NONE: u8 = 0;
    /// TCP over IPv4 segmentation (TSO).
    pub const GSO_TCPV4: u8 = 1;
    /// UDP fragmentation offload (UFO), legacy; refused by [`VnetHdr::validate`].
    pub const GSO_UDP: u8 = 3;
    /// TCP over IPv6 segmentation (TSO6).
    pub const GSO_TCPV6: u8 = 4;
    /// UDP segmentation (USO): every segment is its own datagram.
    pub const GSO_UDP_L4: u8 = 5;
    /// Bit ORed into `gso_type`: the TCP stream uses ECN (CWR goes on the first segment).
    pub const GSO_ECN: u8 = 0x80;

    const KNOWN_FLAGS: u8 = Self::F_NEEDS_CSUM | Self::F_DATA_VALID;

    /// Reads the header from the first 12 bytes of `bytes` (more bytes are ignored).
    ///
    /// Returns [`WireError::Runt`] if `bytes` is shorter than [`VNET_HDR_LEN`]. Does not
    /// validate the contents; see [`VnetHdr::validate`].
    pub fn parse(bytes: &[u8]) -> Result<VnetHdr, WireError> {
        let Some(b) = bytes.first_chunk::<VNET_HDR_LEN>() else {
            return Err(WireError::Runt { len: bytes.len() });
        };
        let le = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        Ok(VnetHdr {
            flags: b[0],
            gso_type: b[1],
            hdr_len: le(2),
            gso_size: le(4),
            csum_start: le(6),
            csum_offset: le(8),
            num_buffers: le(10),
        })
    }

    /// Writes the header in its 12-byte wire layout.
    pub fn emit(&self, out: &mut [u8; VNET_HDR_LEN]) {
        out[0] = self.flags;
        out[1] = self.gso_type;
        out[2..4].copy_from_slice(&self.hdr_len.to_le_bytes());
        out[4..6].copy_from_slice(&self.gso_size.to_le_bytes());
        out[6..8].copy_from_slice(&self.csum_start.to_le_bytes());
        out[8..10].copy_from_slice(&self.csum_offset.to_le_bytes());
        out[10..12].copy_from_slice(&self.num_buffers.to_le_bytes());
    }

    /// The GSO kind: `gso_type` without the [`VnetHdr::GSO_ECN`] bit.
    pub fn gso_kind(&self) -> u8 {
        self.gso_type & !Self::GSO_ECN
    }

    /// True if the frame is a GSO frame (its kind is not [`VnetHdr::GSO_NONE`]).
    pub fn is_gso(&self) -> bool {
        self.gso_kind() != Self::GSO_NONE
    }

    /// True if the frame carries a partial checksum ([`VnetHdr::F_NEEDS_CSUM`]).
    pub fn needs_csum(&self) -> bool {
        self.flags & Self::F_NEEDS_CSUM != 0
    }

    /// Checks the header against the frame it describes; `frame_len` is the length of the
    /// frame after the virtio-net header, starting with the Ethernet header.
    ///
    /// Refuses unknown flag bits, unknown GSO kinds, the ECN bit without GSO, GSO with a
    /// `gso_size` of 0 ([`WireError::BadVnetHeader`]); legacy UFO
    /// ([`WireError::Unsupported`]); and `F_NEEDS_CSUM` whose checksum field
    /// (`csum_start + csum_offset`, two bytes) does not lie inside the frame
    /// ([`WireError::BadChecksumOffsets`]).
    pub fn validate(&self, frame_len: usize) -> Result<(), WireError> {
        if self.flags & !Self::KNOWN_FLAGS != 0 {
            return Err(WireError::BadVnetHeader("unknown flag bits are set"));
        }
        match self.gso_kind() {
            Self::GSO_NONE => {
                if self.gso_type & Self::GSO_ECN != 0 {
                    return Err(WireError::BadVnetHeader("the ECN bit is set on a frame that is not GSO"));
                }
            }
            Self::GSO_TCPV4 | Self::GSO_TCPV6 | Self::GSO_UDP_L4 => {
                if self.gso_size == 0 {
                    return Err(WireError::BadVnetHeader("GSO frame with a gso_size of 0"));
                }
            }
            Self::GSO_UDP => {
                return Err(WireError::Unsupported("UDP fragmentation offload (UFO, GSO_UDP)"));
            }
            _ => return Err(WireError::BadVnetHeader("unknown GSO type")),
        }
        if self.needs_csum() {
            let field_end = usize::from(self.csum_start) + usize::from(self.csum_offset) + 2;
            if field_end > frame_len {
                return Err(WireError::BadChecksumOffsets);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A TSO header as a TAP hands it over: NEEDS_CSUM, TCPV4, hdr_len 54, gso_size 1448,
    /// csum_start 34, csum_offset 16.
    const TSO: [u8; 12] = [0x01, 0x01, 54, 0, 0xa8, 0x05, 34, 0, 16, 0, 0, 0];

    #[test]
    fn parses_little_endian_fields() {
        let h = VnetHdr::parse(&TSO).unwrap();
        assert_eq!(
            h,
            VnetHdr {
                flags: VnetHdr::F_NEEDS_CSUM,
                gso_type: VnetHdr::GSO_TCPV4,
                hdr_len: 54,
                gso_size: 1448,
                csum_start: 34,
                csum_offset: 16,
                num_buffers: 0,
            }
        );
        assert!(h.is_gso());
        assert!(h.needs_csum());
        assert_eq!(h.validate(1514), Ok(()));
    }

    #[test]
    fn round_trips() {
        let h = VnetHdr {
            flags: 3,
            gso_type: 0x84,
            hdr_len: 0x0102,
            gso_size: 0x0304,
            csum_start: 0x0506,
            csum_offset: 0x0708,
            num_buffers: 0x090a,
        };
        let mut out = [0u8; VNET_HDR_LEN];
        h.emit(&mut out);
        assert_eq!(out, [3, 0x84, 2, 1, 4, 3, 6, 5, 8, 7, 0x0a, 9]);
        assert_eq!(VnetHdr::parse(&out), Ok(h));
        let mut tso = [0u8; VNET_HDR_LEN];
        VnetHdr::parse(&TSO).unwrap().emit(&mut tso);
        assert_eq!(tso, TSO);
    }

    #[test]
    fn parse_ignores_trailing_bytes_and_refuses_short_input() {
        let mut long = [0u8; 20];
        long[..12].copy_from_slice(&TSO);
        assert_eq!(VnetHdr::parse(&long), VnetHdr::parse(&TSO));
        assert_eq!(VnetHdr::parse(&TSO[..11]), Err(WireError::Runt { len: 11 }));
        assert_eq!(VnetHdr::parse(&[]), Err(WireError::Runt { len: 0 }));
    }

    #[test]
    fn ecn_bit_is_not_part_of_the_kind() {
        let h = VnetHdr { gso_type: VnetHdr::GSO_TCPV6 | VnetHdr::GSO_ECN, gso_size: 1, ..VnetHdr::default() };
        assert_eq!(h.gso_kind(), VnetHdr::GSO_TCPV6);
        assert!(h.is_gso());
        assert_eq!(h.validate(100), Ok(()));
        let ecn_only = VnetHdr { gso_type: VnetHdr::GSO_ECN, ..VnetHdr::default() };
        assert!(!ecn_only.is_gso());
        assert!(matches!(ecn_only.validate(100), Err(WireError::BadVnetHeader(_))));
    }

    #[test]
    fn default_header_is_valid_for_any_length() {
        assert_eq!(VnetHdr::default().validate(0), Ok(()));
        assert_eq!(VnetHdr { flags: VnetHdr::F_DATA_VALID, ..VnetHdr::default() }.validate(60), Ok(()));
    }

    #[test]
    fn validate_refuses_bad_headers() {
        let base = VnetHdr::parse(&TSO).unwrap();
        let bad = |h: VnetHdr| h.validate(1514);
        assert!(matches!(bad(VnetHdr { flags: 4, ..base }), Err(WireError::BadVnetHeader(_))));
        assert!(matches!(bad(VnetHdr { gso_type: 2, ..base }), Err(WireError::BadVnetHeader(_))));
        assert!(matches!(bad(VnetHdr { gso_type: 7, ..base }), Err(WireError::BadVnetHeader(_))));
        assert!(matches!(bad(VnetHdr { gso_size: 0, ..base }), Err(WireError::BadVnetHeader(_))));
        assert!(matches!(bad(VnetHdr { gso_type: VnetHdr::GSO_UDP, ..base }), Err(WireError::Unsupported(_))));
        assert_eq!(bad(VnetHdr { gso_type: VnetHdr::GSO_UDP_L4, csum_offset: 6, ..base }), Ok(()));
    }

    #[test]
    fn validate_checks_checksum_offsets_against_the_frame() {
        let h = VnetHdr { flags: VnetHdr::F_NEEDS_CSUM, csum_start: 34, csum_offset: 16, ..VnetHdr::default() };
        assert_eq!(h.validate(52), Ok(()));
        assert_eq!(h.validate(51), Err(WireError::BadChecksumOffsets));
        assert_eq!(h.validate(0), Err(WireError::BadChecksumOffsets));
        let far = VnetHdr { csum_start: u16::MAX, csum_offset: u16::MAX, ..h };
        assert_eq!(far.validate(usize::from(u16::MAX) * 2 + 1), Err(WireError::BadChecksumOffsets));
        assert_eq!(far.validate(usize::from(u16::MAX) * 2 + 2), Ok(()));
        // Without NEEDS_CSUM the offsets are not looked at.
        assert_eq!(VnetHdr { flags: 0, ..far }.validate(14), Ok(()));
    }

    proptest::proptest! {
        #[test]
        fn parse_and_validate_never_panic(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..32), len in 0usize..200_000) {
            if let Ok(h) = VnetHdr::parse(&bytes) {
                let _ = h.validate(len);
                let mut out = [0u8; VNET_HDR_LEN];
                h.emit(&mut out);
                proptest::prop_assert_eq!(&out[..], &bytes[..VNET_HDR_LEN]);
            } else {
                proptest::prop_assert!(bytes.len() < VNET_HDR_LEN);
            }
        }
    }
}

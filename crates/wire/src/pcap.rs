//! The pcap file format's two headers, as `sluice capture` and the study's capture write
//! them: little-endian, nanosecond timestamps, Ethernet frames.

/// The pcap file header (24 bytes) for frames cut to `snaplen` bytes.
pub fn file_header(snaplen: u32) -> [u8; 24] {
    let mut h = [0u8; 24];
    h[..4].copy_from_slice(&0xa1b2_3c4du32.to_le_bytes());
    h[4..6].copy_from_slice(&2u16.to_le_bytes());
    h[6..8].copy_from_slice(&4u16.to_le_bytes());
    h[16..20].copy_from_slice(&snaplen.to_le_bytes());
    h[20..24].copy_from_slice(&1u32.to_le_bytes());
    h
}

/// One record's header (16 bytes): the time in nanoseconds, the bytes kept, the frame's length.
pub fn record_header(ts_ns: u64, caplen: u32, len: u32) -> [u8; 16] {
    let mut r = [0u8; 16];
    r[..4].copy_from_slice(&((ts_ns / 1_000_000_000) as u32).to_le_bytes());
    r[4..8].copy_from_slice(&((ts_ns % 1_000_000_000) as u32).to_le_bytes());
    r[8..12].copy_from_slice(&caplen.to_le_bytes());
    r[12..16].copy_from_slice(&len.to_le_bytes());
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pcap_headers_are_little_endian_with_nanoseconds() {
        let h = file_header(65535);
        assert_eq!(&h[..4], &[0x4d, 0x3c, 0xb2, 0xa1]);
        assert_eq!(u32::from_le_bytes(h[20..24].try_into().unwrap()), 1, "Ethernet");
        let r = record_header(1_700_000_000_123_456_789, 60, 1514);
        assert_eq!(u32::from_le_bytes(r[..4].try_into().unwrap()), 1_700_000_000);
        assert_eq!(u32::from_le_bytes(r[4..8].try_into().unwrap()), 123_456_789);
        assert_eq!(u32::from_le_bytes(r[8..12].try_into().unwrap()), 60);
        assert_eq!(u32::from_le_bytes(r[12..16].try_into().unwrap()), 1514);
    }
}

//! Fuzzes everything the switch runs on a frame from a guest: the input is a 12-byte
//! virtio-net header followed by the frame. Besides "never panics", it checks that
//! whatever `gso_max_l3_len` accepts, `segment` cuts into segments that fit that length
//! and carry correct IPv4 and TCP/UDP checksums.

#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_wire::checksum::{fold, pseudo_v4, pseudo_v6, sum};
use sluice_wire::{ETHERTYPE_IPV4, VNET_HDR_LEN, VnetHdr, gso_max_l3_len, parse_ethernet, segment};

/// True if the IPv4 header checksum and the TCP/UDP checksum of a segment verify.
fn checksums_ok(seg: &[u8]) -> bool {
    let Ok(eth) = parse_ethernet(seg) else { return false };
    let ip = &seg[eth.payload_offset..];
    let (l4, pseudo) = if eth.ethertype == ETHERTYPE_IPV4 {
        let ihl = usize::from(ip[0] & 0xf) * 4;
        if fold(sum(&ip[..ihl], 0)) != 0 {
            return false;
        }
        let l4 = &ip[ihl..];
        (l4, pseudo_v4(ip[12..16].try_into().unwrap(), ip[16..20].try_into().unwrap(), ip[9], l4.len() as u32))
    } else {
        let l4 = &ip[40..];
        (l4, pseudo_v6(ip[8..24].try_into().unwrap(), ip[24..40].try_into().unwrap(), ip[6], l4.len() as u32))
    };
    fold(sum(l4, pseudo)) == 0
}

fuzz_target!(|data: &[u8]| {
    let Ok(hdr) = VnetHdr::parse(data) else { return };
    let frame = &data[VNET_HDR_LEN..];
    let _ = hdr.validate(frame.len());
    let _ = parse_ethernet(frame);

    let max = gso_max_l3_len(frame, &hdr);
    let mut scratch = [0u8; 1 << 17];
    let mut longest = 0;
    let mut all_ok = true;
    let n = segment(frame, &hdr, &mut scratch, |seg| {
        if hdr.is_gso() {
            let l3 = parse_ethernet(seg).expect("segments start with Ethernet").payload_offset;
            longest = longest.max(seg.len() - l3);
            all_ok &= checksums_ok(seg);
        }
        true
    });
    if hdr.is_gso() {
        match max {
            Ok(max) => {
                let n = n.expect("a frame gso_max_l3_len accepts can be segmented");
                assert!(n >= 1);
                assert_eq!(longest, max, "the largest segment is what gso_max_l3_len said");
                assert!(all_ok, "every segment's checksums verify");
            }
            Err(e) => assert_eq!(n, Err(e), "segment and gso_max_l3_len agree on errors"),
        }
    }

    let mut copy = [0u8; 1 << 17];
    if let Some(c) = copy.get_mut(..frame.len()) {
        c.copy_from_slice(frame);
        let _ = sluice_wire::fill_partial_checksum(c, &hdr);
    }
});

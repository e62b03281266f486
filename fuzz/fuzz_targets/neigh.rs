//! Fuzzes the address-resolution reader a Layer 3 switch runs on every guest's ARP and
//! neighbour-discovery frame, and the IP-endpoint reader it runs on every packet. Besides
//! "never panics", whatever `parse_neigh` reads, the writers write back as a frame that
//! reads as the same message. The first input byte, when odd, has the target fill in a
//! correct ICMPv6 checksum first, so that the fuzzer gets past the checksum to the options.

#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_wire::MacAddr;
use sluice_wire::checksum::{fold, pseudo_v6, sum};
use sluice_wire::neigh::{NdFields, Neigh, ip_endpoints, parse_neigh, solicited_node, write_arp, write_nd};

/// Writes a correct ICMPv6 checksum into an IPv6 frame's ICMPv6 message, if it has one.
fn fix_checksum(f: &mut [u8]) {
    if f.len() < 14 + 40 + 4 || f[12..14] != [0x86, 0xdd] {
        return;
    }
    let len = usize::from(u16::from_be_bytes([f[18], f[19]])).min(f.len() - 54);
    let (ip, icmp) = f[14..].split_at_mut(40);
    let icmp = &mut icmp[..len];
    if icmp.len() < 4 {
        return;
    }
    icmp[2..4].fill(0);
    let c = fold(sum(icmp, pseudo_v6(ip[8..24].try_into().unwrap(), ip[24..40].try_into().unwrap(), 58, len as u32)));
    icmp[2..4].copy_from_slice(&c.to_be_bytes());
}

fuzz_target!(|data: &[u8]| {
    let Some((&flag, frame)) = data.split_first() else { return };
    let mut f = frame.to_vec();
    if flag & 1 == 1 {
        fix_checksum(&mut f);
    }
    let _ = ip_endpoints(&f);
    let Some(n) = parse_neigh(&f) else { return };
    let mut out = [0u8; 128];
    let any = MacAddr([2, 0, 0, 0, 0, 9]);
    let len = match n {
        Neigh::ArpRequest { sender_mac, sender_ip, target } => {
            write_arp(&mut out, 1, MacAddr::BROADCAST, sender_mac, sender_ip, MacAddr::default(), target)
        }
        Neigh::ArpReply { sender_mac, sender_ip } => write_arp(&mut out, 2, any, sender_mac, sender_ip, any, sender_ip),
        Neigh::Solicit { src, target, lla: Some(lla) } => {
            let m = NdFields { advert: false, solicited: false, src, dst: solicited_node(target), target, lla };
            write_nd(&mut out, any, lla, &m)
        }
        Neigh::Advert { target, lla: Some(lla) } => {
            let m = NdFields { advert: true, solicited: true, src: target, dst: target, target, lla };
            write_nd(&mut out, any, lla, &m)
        }
        // (The writers always include the link-layer address option.)
        _ => return,
    };
    let len = len.expect("a 128-byte buffer holds any ARP or ND frame");
    assert_eq!(parse_neigh(&out[..len]), Some(n), "written back: {:02x?}", &out[..len]);
});

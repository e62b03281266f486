//! Stations the executor heard behind tunnels: the events `sluice_exec` writes on its ring
//! buffer `sluice_heard` ([`abi::HeardEvent`]), read, and handed to the core, which decides
//! whether to learn each (docs/architecture.md, "One brain", *As built: stations heard
//! behind tunnels*).
//!
//! The program writes no forwarding state: a frame from a tunnel whose source the station
//! table has on the tunnel, from a sender the remote table does not have it behind, is
//! reported (a full ring is counted, `C_HEARD_LOST`, and the station's next frame reports
//! it again). [`hand_to_core`] gives each report to [`Switch::tunnel_heard`] and writes
//! what the core learns into the kernel's remote table, after which the program finds it
//! there and reports it no more.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use sluice_switch::{PortId, Switch};
use sluice_wire::MacAddr;

use crate::abi;
use crate::exec::Executor;

/// One station heard behind a tunnel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Heard {
    /// The tunnel's device.
    pub ifindex: u32,
    /// Its input slot.
    pub slot: u32,
    /// The datagram's VNI.
    pub vni: u32,
    /// The VLAN the frame was admitted to.
    pub vlan: u16,
    /// The station.
    pub mac: MacAddr,
    /// The datagram's sender.
    pub sender: IpAddr,
}

impl Heard {
    /// Reads an event as the program wrote it: `None` for bytes of another size or an
    /// address family it does not write.
    pub fn parse(bytes: &[u8]) -> Option<Heard> {
        if bytes.len() != std::mem::size_of::<abi::HeardEvent>() {
            return None;
        }
        // SAFETY: `bytes` holds exactly one `HeardEvent`, a `repr(C)` struct of integers
        // and byte arrays, for which every bit pattern is a value; read unaligned, as a
        // ring buffer's record is 8-byte aligned only.
        let e: abi::HeardEvent = unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast()) };
        let sender = match e.family {
            abi::HEARD_V4 => IpAddr::V4(Ipv4Addr::new(e.addr[0], e.addr[1], e.addr[2], e.addr[3])),
            abi::HEARD_V6 => IpAddr::V6(Ipv6Addr::from(e.addr)),
            _ => return None,
        };
        Some(Heard { ifindex: e.ifindex, slot: e.slot, vni: e.vni, vlan: e.vlan, mac: MacAddr(e.mac), sender })
    }
}

/// Gives the core every station the executor reported since the last call, at most
/// `limit` (the rest waits in the ring for the next call): `port_of` says which of the
/// core's ports an input slot is. The core decides on each as for a frame
/// ([`Switch::tunnel_heard`]: the tunnel's stage 1 must give that origin that VLAN, and
/// the station must be the tunnel's); each it learns is written into the kernel's remote
/// table, so that frames to it leave for its endpoint from the kernel. Returns how many
/// reports were read and how many learned.
pub fn hand_to_core(
    ex: &mut Executor,
    sw: &mut Switch,
    port_of: impl Fn(u32) -> Option<PortId>,
    limit: usize,
) -> (usize, usize) {
    let reports = ex.take_heard(limit);
    let mut learned = 0;
    for h in &reports {
        let Some(id) = port_of(h.slot) else { continue };
        if sw.tunnel_heard(id, h.vni, h.vlan, h.mac, h.sender)
            && ex.set_remote(h.ifindex, h.vni, h.mac, h.sender).is_ok()
        {
            learned += 1;
        }
    }
    (reports.len(), learned)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(family: u8, addr: &[u8]) -> Vec<u8> {
        let mut e = abi::HeardEvent {
            ifindex: 7,
            slot: 3,
            vni: 5010,
            vlan: 10,
            family,
            mac: [2, 0, 0, 0, 0, 9],
            ..Default::default()
        };
        e.addr[..addr.len()].copy_from_slice(addr);
        let size = std::mem::size_of::<abi::HeardEvent>();
        // SAFETY: `e` is a `repr(C)` struct with no padding (the ABI macro refuses any):
        // its `size` bytes are all initialized.
        unsafe { std::slice::from_raw_parts((&raw const e).cast::<u8>(), size) }.to_vec()
    }

    #[test]
    fn an_event_reads_as_the_program_writes_it() {
        let h = Heard::parse(&event(abi::HEARD_V4, &[192, 0, 2, 1])).unwrap();
        assert_eq!(
            h,
            Heard {
                ifindex: 7,
                slot: 3,
                vni: 5010,
                vlan: 10,
                mac: MacAddr([2, 0, 0, 0, 0, 9]),
                sender: "192.0.2.1".parse().unwrap()
            }
        );
        let v6: Ipv6Addr = "fd78::2".parse().unwrap();
        assert_eq!(Heard::parse(&event(abi::HEARD_V6, &v6.octets())).unwrap().sender, IpAddr::V6(v6));
        assert_eq!(Heard::parse(&event(5, &[])), None, "no such family");
        assert_eq!(Heard::parse(&event(abi::HEARD_V4, &[])[..39]), None, "cut short");
    }
}

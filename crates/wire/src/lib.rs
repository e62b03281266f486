//! Bounds-checked views over the frames sluice switches: Ethernet with an optional 802.1Q
//! tag, the virtio-net header that Linux TAP devices put in front of every frame, the
//! Internet checksum, software segmentation of GSO frames, and the ARP and neighbour
//! discovery messages a Layer 3 switch answers, and the VXLAN header of its tunnels.
//!
//! Written in the style of smoltcp's `wire` module: every function takes a byte slice,
//! checks its length once, and reads or writes fixed offsets. No function in this crate
//! panics on any input, none allocates, and there is no `unsafe`: these run on the
//! switch's per-frame hot path.

#![forbid(unsafe_code)]
#![no_std]
#![warn(missing_docs)]

#[cfg(test)]
extern crate std;

pub mod checksum;
mod error;
pub mod ethernet;
pub mod gro;
pub mod gso;
pub mod neigh;
pub mod pcap;
pub mod vnet;
pub mod vxlan;

pub use error::WireError;
pub use ethernet::{
    ETH_HDR_LEN, ETHERTYPE_ARP, ETHERTYPE_IPV4, ETHERTYPE_IPV6, ETHERTYPE_QINQ, ETHERTYPE_VLAN, EthernetInfo, MacAddr,
    VLAN_TAG_LEN, parse_ethernet,
};
pub use gso::{fill_partial_checksum, gso_max_l3_len, segment};
pub use vnet::{VNET_HDR_LEN, VnetHdr};

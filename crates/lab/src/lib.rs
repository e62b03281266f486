//! Every topology sluice builds, in one place: throw-away guests in network namespaces
//! attached to a switch ([`guests`], `sluice lab`), labs of several hosts joined by VXLAN
//! ([`hosts`]), QEMU guests on vhost-user ports ([`vm`]), the network paths a study
//! compares ([`compared`]) and the Open vSwitch daemons one of them runs ([`ovs`]).
//!
//! Tests, studies and the demo build their topologies with this code, so that what is
//! measured is what users run.

pub mod compared;
pub mod guests;
pub mod hosts;
pub mod ovs;
pub mod vm;

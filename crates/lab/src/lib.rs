//! Every topology sluice builds, in one place: throw-away guests in network namespaces
//! attached to a switch ([`guests`], `sluice lab`), made as a lab of one host ([`host`])
//! or of several joined by VXLAN ([`hosts`]), QEMU guests on vhost-user ports ([`vm`]), the
//! network paths a study compares ([`compared`]) and the Open vSwitch daemons one of them
//! runs ([`ovs`]). Underneath them: what `lab up` asks for ([`args`]), what a lab made
//! ([`state`]), the commands they all run ([`shell`]) and what can go wrong ([`error`]).
//!
//! Tests, studies and the demo build their topologies with this code, so that what is
//! measured is what users run.

pub mod acl_load;
pub mod args;
pub mod compared;
pub mod error;
pub mod frr;
pub mod guests;
pub mod host;
pub mod hosts;
pub mod ovs;
pub mod shell;
pub mod state;
pub mod vm;

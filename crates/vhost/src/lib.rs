//! sluice's vhost-user network backend (issue 20; docs/architecture.md, "vhost-user ports
//! for QEMU guests"): what QEMU's `-netdev vhost-user` talks to.
//!
//! - [`backend`]: the device as the protocol sees it (the offer, the kicks), on rust-vmm's
//!   `vhost-user-backend` daemon;
//! - [`serve`]: the port's socket, one daemon per connection, the peer check, reconnection;
//! - [`port`]: the switch's [`sluice_switch::Port`]: frames from the guest's transmit
//!   queues, into its receive queues, on the datapath thread;
//! - [`driver`]: a guest's side without a VM, for the tests and the per-frame benchmark.

pub mod backend;
pub mod driver;
mod peer;
pub mod port;
pub mod serve;

pub use backend::{MAX_QUEUE_PAIRS, MAX_QUEUE_SIZE, NUM_QUEUES, OFFERED_FEATURES, RX_QUEUE, TX_QUEUE};
pub use port::{PortCounts, VhostUserPort};
pub use serve::{Role, open};

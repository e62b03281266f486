//! sluice's vhost-user network backend (issue 20; docs/architecture.md, "vhost-user ports
//! for QEMU guests"): what QEMU's `-netdev vhost-user` talks to.
//!
//! - [`backend`]: what the device offers;
//! - `handler`: the vhost-user protocol on the `vhost` crate (features, memory, vrings);
//! - `memory`: the guest memory the peer shares, checked before it is mapped and guarded
//!   against pages going away under the switch (SIGBUS);
//! - `eventfd`: the rings' kick and call descriptors, read and written without waiting;
//! - [`serve`]: the peer check ([`Allow`]), a fresh device per connection, reconnection;
//! - `socket`: a server-mode port's socket file, bound mode 0600 (0660 with the allowed
//!   peers' group) and removed when the port goes;
//! - [`port`]: the switch's [`sluice_switch::Port`]: frames from the guest's transmit
//!   queues, into its receive queues, on the datapath thread;
//! - `sys`: the system calls std and `vmm-sys-util` have not, each a safe function;
//! - `ring`: the split virtqueue walked with every index checked, the bounds on chains;
//! - [`driver`]: a guest's side without a VM, for the tests and the per-frame benchmark;
//! - [`abuse`]: hostile and well-behaved guests played by a driver, for the study's
//!   `rings` and `vm-feed` conditions and the bench of what each abuse costs.

pub mod abuse;
pub mod backend;
pub mod driver;
mod eventfd;
mod handler;
mod memory;
mod peer;
pub mod port;
mod ring;
pub mod serve;
mod shim;
mod socket;
mod sys;

pub use backend::{MAX_QUEUE_PAIRS, MAX_QUEUE_SIZE, NUM_QUEUES, OFFERED_FEATURES, RX_QUEUE, TX_QUEUE};
pub use peer::{Allow, Cred};
pub use port::{PortCounts, VhostUserPort};
pub use ring::{MAX_CHAIN_DESCRIPTORS, MAX_FRAME_CHAINS};
pub use serve::{Role, open, open_allowing};

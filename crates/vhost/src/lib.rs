//! sluice's vhost-user network backend (issue 20; docs/architecture.md, "vhost-user ports
//! for QEMU guests — design"): what QEMU's `-netdev vhost-user` talks to.
//!
//! rust-vmm's `vhost-user-backend` runs the protocol (features, memory table, vrings) on
//! threads of its own; the guest's kicks wake its vring worker, and this backend's
//! `handle_event` does nothing but ring the port's *doorbell*, an eventfd the switch's
//! datapath thread watches. The descriptor work itself is the datapath's (the port, a later
//! step), under the vrings' locks.
//!
//! This first step: the device the backend offers (virtio-net features, one queue pair),
//! the memory and vrings the frontend hands over, and the doorbell.

use std::sync::Arc;

use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vhost_user_backend::{VhostUserBackendMut, VringRwLock};
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_net::{
    VIRTIO_NET_F_CSUM, VIRTIO_NET_F_GUEST_CSUM, VIRTIO_NET_F_GUEST_TSO4, VIRTIO_NET_F_GUEST_TSO6,
    VIRTIO_NET_F_HOST_TSO4, VIRTIO_NET_F_HOST_TSO6, VIRTIO_NET_F_MRG_RXBUF,
};
use virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;
use vm_memory::{GuestMemoryAtomic, GuestMemoryMmap};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::eventfd::EventFd;

/// Queues per queue pair: receive (guest ← switch) first, then transmit.
pub const RX_QUEUE: usize = 0;
/// The guest's transmit queue (guest → switch).
pub const TX_QUEUE: usize = 1;
/// Descriptors per queue at most.
pub const MAX_QUEUE_SIZE: usize = 1024;

/// The virtio-net features offered: virtio 1.0, checksum offload both ways, TSO both ways
/// (GSO frames cross whole, as between TAPs), mergeable receive buffers, event-index
/// notification suppression, and vhost-user's protocol features.
pub const OFFERED_FEATURES: u64 = (1 << VIRTIO_F_VERSION_1)
    | (1 << VIRTIO_NET_F_CSUM)
    | (1 << VIRTIO_NET_F_GUEST_CSUM)
    | (1 << VIRTIO_NET_F_HOST_TSO4)
    | (1 << VIRTIO_NET_F_HOST_TSO6)
    | (1 << VIRTIO_NET_F_GUEST_TSO4)
    | (1 << VIRTIO_NET_F_GUEST_TSO6)
    | (1 << VIRTIO_NET_F_MRG_RXBUF)
    | (1 << VIRTIO_RING_F_EVENT_IDX)
    | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits();

/// Why the backend could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An eventfd could not be made.
    #[error("making the port's doorbell (an eventfd): {0}")]
    Doorbell(std::io::Error),
}

/// One vhost-user network device: what it offers, what the frontend accepted, and the
/// guest memory it handed over.
pub struct NetBackend {
    acked: u64,
    event_idx: bool,
    mem: Option<GuestMemoryAtomic<GuestMemoryMmap>>,
    doorbell: Arc<EventFd>,
    /// Kicks seen (for `sluice stats`, and the tests).
    pub kicks: u64,
}

impl NetBackend {
    /// A device whose kicks ring `doorbell`.
    pub fn new() -> Result<(NetBackend, Arc<EventFd>), Error> {
        // Non-blocking: the datapath reads the doorbell without ever waiting on it.
        let doorbell = Arc::new(EventFd::new(libc::EFD_NONBLOCK).map_err(Error::Doorbell)?);
        Ok((NetBackend { acked: 0, event_idx: false, mem: None, doorbell: doorbell.clone(), kicks: 0 }, doorbell))
    }

    /// The features the frontend accepted.
    pub fn acked(&self) -> u64 {
        self.acked
    }

    /// Whether the frontend handed over the guest's memory.
    pub fn has_memory(&self) -> bool {
        self.mem.is_some()
    }

    /// Whether event-index notification suppression is on.
    pub fn event_idx(&self) -> bool {
        self.event_idx
    }
}

impl VhostUserBackendMut for NetBackend {
    type Bitmap = ();
    type Vring = VringRwLock;

    fn num_queues(&self) -> usize {
        2
    }

    fn max_queue_size(&self) -> usize {
        MAX_QUEUE_SIZE
    }

    fn features(&self) -> u64 {
        OFFERED_FEATURES
    }

    fn acked_features(&mut self, features: u64) {
        self.acked = features;
    }

    fn protocol_features(&self) -> VhostUserProtocolFeatures {
        VhostUserProtocolFeatures::MQ | VhostUserProtocolFeatures::REPLY_ACK | VhostUserProtocolFeatures::CONFIG
    }

    fn reset_device(&mut self) {
        self.acked = 0;
        self.event_idx = false;
    }

    fn set_event_idx(&mut self, enabled: bool) {
        self.event_idx = enabled;
    }

    fn update_memory(&mut self, mem: GuestMemoryAtomic<GuestMemoryMmap>) -> std::io::Result<()> {
        self.mem = Some(mem);
        Ok(())
    }

    fn handle_event(
        &mut self,
        _device_event: u16,
        _evset: EventSet,
        _vrings: &[VringRwLock],
        _thread_id: usize,
    ) -> std::io::Result<()> {
        // The guest posted transmit frames or receive buffers: the datapath does the rest.
        self.kicks += 1;
        self.doorbell.write(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_offer_is_virtio_1_with_offloads_and_mergeable_buffers() {
        let (b, _) = NetBackend::new().unwrap();
        let f = b.features();
        for bit in [VIRTIO_F_VERSION_1, VIRTIO_NET_F_CSUM, VIRTIO_NET_F_HOST_TSO4, VIRTIO_NET_F_MRG_RXBUF] {
            assert_ne!(f & (1 << bit), 0, "bit {bit}");
        }
        assert_ne!(f & VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits(), 0);
        assert_eq!(b.num_queues(), 2);
    }
}

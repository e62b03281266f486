//! The device as the vhost-user protocol sees it: what it offers, what the frontend
//! accepted, and where the guest's kicks go.
//!
//! rust-vmm's `vhost-user-backend` runs the protocol (features, memory table, vrings) on a
//! thread of its own and watches the guest's kick eventfds on another; [`NetBackend`]'s
//! `handle_event` does nothing but ring one of the port's two doorbells (frames waiting on
//! a transmit queue, or buffers posted on a receive queue), eventfds the switch's datapath
//! thread watches. The descriptor work is the port's ([`crate::port`]), on the datapath
//! thread, under the vrings' locks.

use std::os::fd::{AsRawFd, RawFd};
use std::sync::{Arc, Mutex};

use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vhost_user_backend::{VhostUserBackendMut, VringRwLock};
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_net::{
    VIRTIO_NET_F_CSUM, VIRTIO_NET_F_GUEST_CSUM, VIRTIO_NET_F_GUEST_TSO4, VIRTIO_NET_F_GUEST_TSO6,
    VIRTIO_NET_F_HOST_TSO4, VIRTIO_NET_F_HOST_TSO6, VIRTIO_NET_F_MQ, VIRTIO_NET_F_MRG_RXBUF,
};
use virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;
use vm_memory::{GuestMemoryAtomic, GuestMemoryMmap};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::event::{EventConsumer, EventFlag, EventNotifier, new_event_consumer_and_notifier};
use vmm_sys_util::eventfd::EventFd;

use crate::port::Shared;

/// Queue pairs at most (each a receive and a transmit queue): more than this machine
/// class has CPUs; the switch serves them all on its one datapath thread, in turn.
pub const MAX_QUEUE_PAIRS: usize = 4;
/// Queues: receive queue of pair `k` is `2k`, its transmit queue `2k + 1`.
pub const NUM_QUEUES: usize = 2 * MAX_QUEUE_PAIRS;
/// The first pair's receive queue (guest ← switch).
pub const RX_QUEUE: usize = 0;
/// The first pair's transmit queue (guest → switch).
pub const TX_QUEUE: usize = 1;
/// Descriptors per queue at most.
pub const MAX_QUEUE_SIZE: usize = 1024;
/// The event id of the eventfd by which the port asks the vring worker for the vrings
/// (ids up to `NUM_QUEUES` are the framework's).
pub(crate) const FETCH_EVENT: u16 = NUM_QUEUES as u16 + 1;

/// The virtio-net features offered: virtio 1.0, checksum offload both ways, TSO both ways
/// (GSO frames cross whole, as between TAPs), mergeable receive buffers, several queue
/// pairs, event-index notification suppression, and vhost-user's protocol features.
pub const OFFERED_FEATURES: u64 = (1 << VIRTIO_F_VERSION_1)
    | (1 << VIRTIO_NET_F_CSUM)
    | (1 << VIRTIO_NET_F_GUEST_CSUM)
    | (1 << VIRTIO_NET_F_HOST_TSO4)
    | (1 << VIRTIO_NET_F_HOST_TSO6)
    | (1 << VIRTIO_NET_F_GUEST_TSO4)
    | (1 << VIRTIO_NET_F_GUEST_TSO6)
    | (1 << VIRTIO_NET_F_MRG_RXBUF)
    | (1 << VIRTIO_NET_F_MQ)
    | (1 << VIRTIO_RING_F_EVENT_IDX)
    | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits();

/// One connection's vhost-user network device.
pub struct NetBackend {
    shared: Arc<Shared>,
    event_idx: bool,
    mem: Option<GuestMemoryAtomic<GuestMemoryMmap>>,
    /// Rung by the port to have the vring worker hand the vrings over.
    fetch: EventFd,
    /// Where the vrings go when fetched.
    vrings: Arc<Mutex<Option<Vec<VringRwLock>>>>,
    /// The descriptors the vring workers' exit events are read from: the framework gives
    /// them up to its epoll and never closes them, so the daemon's owner does once the
    /// daemon is gone (`serve::Session`).
    pub(crate) exit_fds: Arc<Mutex<Vec<RawFd>>>,
}

impl NetBackend {
    /// A device whose kicks ring `shared`'s doorbells, and whose vrings are put into
    /// `vrings` when [`FETCH_EVENT`] fires.
    pub(crate) fn new(shared: Arc<Shared>, vrings: Arc<Mutex<Option<Vec<VringRwLock>>>>) -> std::io::Result<Self> {
        Ok(NetBackend {
            shared,
            event_idx: false,
            mem: None,
            fetch: EventFd::new(libc::EFD_NONBLOCK)?,
            vrings,
            exit_fds: Arc::default(),
        })
    }

    /// The eventfd that makes the vring worker hand the vrings over.
    pub(crate) fn fetch_fd(&self) -> &EventFd {
        &self.fetch
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
        NUM_QUEUES
    }

    fn max_queue_size(&self) -> usize {
        MAX_QUEUE_SIZE
    }

    fn features(&self) -> u64 {
        OFFERED_FEATURES
    }

    fn acked_features(&mut self, features: u64) {
        self.shared.set_acked(features);
    }

    fn protocol_features(&self) -> VhostUserProtocolFeatures {
        VhostUserProtocolFeatures::MQ | VhostUserProtocolFeatures::REPLY_ACK | VhostUserProtocolFeatures::CONFIG
    }

    fn reset_device(&mut self) {
        self.shared.set_acked(0);
        self.event_idx = false;
    }

    fn set_event_idx(&mut self, enabled: bool) {
        self.event_idx = enabled;
    }

    fn update_memory(&mut self, mem: GuestMemoryAtomic<GuestMemoryMmap>) -> std::io::Result<()> {
        self.mem = Some(mem);
        Ok(())
    }

    fn exit_event(&self, _thread_index: usize) -> Option<(EventConsumer, EventNotifier)> {
        let (c, n) = new_event_consumer_and_notifier(EventFlag::NONBLOCK | EventFlag::CLOEXEC).ok()?;
        self.exit_fds.lock().unwrap_or_else(|p| p.into_inner()).push(c.as_raw_fd());
        Some((c, n))
    }

    fn handle_event(
        &mut self,
        device_event: u16,
        _evset: EventSet,
        vrings: &[VringRwLock],
        _thread_id: usize,
    ) -> std::io::Result<()> {
        if device_event == FETCH_EVENT {
            let _ = self.fetch.read();
            *self.vrings.lock().unwrap_or_else(|p| p.into_inner()) = Some(vrings.to_vec());
            return Ok(());
        }
        // The guest posted frames (a transmit queue) or buffers (a receive queue): the
        // datapath does the rest.
        self.shared.kicked(usize::from(device_event) % 2 == TX_QUEUE);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_offer_is_virtio_1_with_offloads_mergeable_buffers_and_queue_pairs() {
        let f = OFFERED_FEATURES;
        for bit in
            [VIRTIO_F_VERSION_1, VIRTIO_NET_F_CSUM, VIRTIO_NET_F_HOST_TSO4, VIRTIO_NET_F_MRG_RXBUF, VIRTIO_NET_F_MQ]
        {
            assert_ne!(f & (1 << bit), 0, "bit {bit}");
        }
        assert_ne!(f & VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits(), 0);
        assert!(usize::from(FETCH_EVENT) > NUM_QUEUES, "the framework's ids are 0..=NUM_QUEUES");
    }
}

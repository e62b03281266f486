//! What the device offers: virtio-net features, queues, sizes.

use vhost::vhost_user::message::VhostUserVirtioFeatures;
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_net::{
    VIRTIO_NET_F_CSUM, VIRTIO_NET_F_GUEST_CSUM, VIRTIO_NET_F_GUEST_TSO4, VIRTIO_NET_F_GUEST_TSO6,
    VIRTIO_NET_F_HOST_TSO4, VIRTIO_NET_F_HOST_TSO6, VIRTIO_NET_F_MQ, VIRTIO_NET_F_MRG_RXBUF,
};
use virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;

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

/// The virtio-net features offered: virtio 1.0, checksum offload both ways, TSO both ways
/// (GSO frames cross whole, as between TAPs), mergeable receive buffers, several queue
/// pairs, event-index notification suppression, and vhost-user's protocol features (QEMU
/// starts a vhost-user network device only with them; the protocol features offered are
/// MQ and REPLY_ACK).
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
    }
}

//! Guests without a VM that abuse their rings, and the well-behaved ones beside them,
//! played by a [`Driver`]: the study's `rings` and `vm-feed` conditions
//! (crates/study/src/conditions/rings.rs) and the bench of what each abuse costs the
//! switch (`cargo bench -p sluice-vhost --bench hostile`) play the same guests.
//!
//! - [`play`]: one [`Abuse`], until its phase ends, then both rings reset (as QEMU does when
//!   a guest resets its device);
//! - [`feed`]: a turn of the feeder, a guest that sends another frames;
//! - [`take`]: a turn of a guest that receives them as a virtio-net driver does.
//!
//! Every loop here ends at the caller's deadline or stop, or after a queue's worth of work.

use std::io;
use std::time::{Duration, Instant};

use crate::driver::{DESC_INDIRECT, DESC_NEXT, DESC_WRITE, Driver, QUEUE_SIZE, SPARE};

/// How long each abuse lasts before the rings are reset and the next one starts.
pub const PHASE: Duration = Duration::from_millis(200);
/// Frames a second the feeder sends, at most (as many as the switch takes from its 64
/// transmit slots).
pub const FEED_PER_S: u64 = 20_000;
/// The feeder's frames, in bytes (without the virtio-net header).
pub const FEED_FRAME_LEN: usize = 200;
/// Chains the hostile guest keeps offered and not yet returned, at most (the driver's ring
/// must itself stay well-formed: more than a queue's size would be a fault of ours).
const MAX_IN_FLIGHT: u16 = 128;

/// One abuse of the rings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Abuse {
    /// An available index far ahead on the receive ring while frames arrive for it.
    RxIndex,
    /// An available index far ahead on the transmit ring, and kicks.
    TxIndex,
    /// Chains behind indirect descriptors (a table of 65,535), both ways.
    Indirect,
    /// Chains of zero-length descriptors that loop on themselves, both ways.
    ZeroChains,
    /// Chains of 1-byte descriptors that loop on themselves, both ways: what is left to a
    /// guest once zero-length descriptors break its queue.
    LongChains,
    /// A queue's worth of 1-byte receive buffers, posted again as frames use them.
    TinyBuffers,
    /// A chain head, and a `next`, beyond the descriptor table.
    BadHead,
}

impl Abuse {
    /// In the order they cycle.
    pub const ALL: [Abuse; 7] = [
        Abuse::RxIndex,
        Abuse::TxIndex,
        Abuse::Indirect,
        Abuse::ZeroChains,
        Abuse::LongChains,
        Abuse::TinyBuffers,
        Abuse::BadHead,
    ];

    /// Its name in a record.
    pub fn name(self) -> &'static str {
        match self {
            Abuse::RxIndex => "rx_index",
            Abuse::TxIndex => "tx_index",
            Abuse::Indirect => "indirect",
            Abuse::ZeroChains => "zero_chains",
            Abuse::LongChains => "long_chains",
            Abuse::TinyBuffers => "tiny_buffers",
            Abuse::BadHead => "bad_head",
        }
    }
}

/// A minimal frame from `src` to `dst` (EtherType 0x88B5), `len` bytes (60 at least).
pub fn frame(dst: [u8; 6], src: [u8; 6], len: usize) -> Vec<u8> {
    let mut f = vec![0u8; len.max(60)];
    f[..6].copy_from_slice(&dst);
    f[6..12].copy_from_slice(&src);
    f[12..14].copy_from_slice(&[0x88, 0xB5]);
    f
}

/// Says who the guest is (a frame from `me` to `peer`), so that the switch forwards
/// `peer`'s frames to it; false when every transmit slot is in flight.
pub fn hello(d: &mut Driver, me: [u8; 6], peer: [u8; 6]) -> io::Result<bool> {
    d.send(&[0; 12], &frame(peer, me, 60))
}

fn in_flight(d: &mut Driver, transmit: bool) -> io::Result<u16> {
    let used = if transmit { d.tx_used()? } else { d.rx_used()? };
    Ok(d.avail_idx(transmit).wrapping_sub(used))
}

/// Plays `abuse` until `until` or `stop()`, then resets both rings; `count` is told what
/// was done (`chains`, `kicks`, `tiny_buffers_posted`, `resets`). `me` says who it is
/// first, so that `peer`'s frames come to it.
pub fn play(
    d: &mut Driver,
    abuse: Abuse,
    me: [u8; 6],
    peer: [u8; 6],
    until: Instant,
    stop: &dyn Fn() -> bool,
    count: &mut dyn FnMut(&'static str, u64),
) -> io::Result<()> {
    let going = || Instant::now() < until && !stop();
    hello(d, me, peer)?;
    match abuse {
        Abuse::RxIndex => {
            d.post_rx(8)?;
            let bogus = d.avail_idx(false).wrapping_add(QUEUE_SIZE + 744);
            d.set_avail_idx(false, bogus)?;
            while going() {
                d.kick(false)?;
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        Abuse::TxIndex => {
            let bogus = d.avail_idx(true).wrapping_add(QUEUE_SIZE + 1);
            d.set_avail_idx(true, bogus)?;
            while going() {
                d.kick(true)?;
                count("kicks", 1);
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        Abuse::Indirect | Abuse::ZeroChains | Abuse::LongChains => {
            let (tx_head, rx_head) = if abuse == Abuse::Indirect {
                d.write_desc(true, 100, SPARE, 16 * 65_535, DESC_INDIRECT, 0)?;
                d.write_desc(false, 200, SPARE, 16, DESC_INDIRECT | DESC_WRITE, 0)?;
                (100, 200)
            } else {
                let len = u32::from(abuse == Abuse::LongChains);
                for i in 0..QUEUE_SIZE {
                    d.write_desc(true, i, SPARE, len, DESC_NEXT, (i + 1) % QUEUE_SIZE)?;
                    d.write_desc(false, i, SPARE, len, DESC_WRITE | DESC_NEXT, (i + 1) % QUEUE_SIZE)?;
                }
                (0, 0)
            };
            while going() {
                let mut offered = false;
                if in_flight(d, true)? < MAX_IN_FLIGHT {
                    d.offer_tx_chain(tx_head)?;
                    count("chains", 1);
                    offered = true;
                }
                if in_flight(d, false)? < 16 {
                    d.offer_rx_chain(rx_head)?;
                    count("chains", 1);
                    offered = true;
                }
                if !offered {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        }
        Abuse::TinyBuffers => {
            while going() {
                // What the frames used comes back empty: take it and post again, up to a
                // queue's worth of 1-byte buffers in flight.
                for _ in 0..QUEUE_SIZE {
                    if d.recv()?.is_none() {
                        break;
                    }
                }
                count("tiny_buffers_posted", u64::from(d.post_rx_sized(QUEUE_SIZE, 1)?));
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        Abuse::BadHead => {
            d.offer_tx_chain(999)?;
            d.write_desc(false, 0, SPARE, 10, DESC_WRITE | DESC_NEXT, 4000)?;
            d.offer_rx_chain(0)?;
            while going() {
                d.kick(true)?;
                std::thread::sleep(Duration::from_millis(2));
            }
        }
    }
    d.reset_ring(false)?;
    d.reset_ring(true)?;
    count("resets", 2);
    Ok(())
}

/// One turn of the feeder: up to `n` copies of `f` sent before `until` (waiting a little
/// when all its transmit slots are in flight), then what came in taken and its buffers
/// posted again. Returns (frames sent, frames received).
pub fn feed(d: &mut Driver, f: &[u8], n: u64, until: Instant) -> io::Result<(u64, u64)> {
    let mut sent = 0;
    while sent < n && Instant::now() < until {
        if d.send(&[0; 12], f)? {
            sent += 1;
        } else {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    Ok((sent, take(d)?))
}

/// One turn of a well-behaved guest's receive side, as a virtio-net driver's: the frames
/// the device wrote taken (at most a queue's worth), their buffers posted again. Returns
/// how many frames it took.
pub fn take(d: &mut Driver) -> io::Result<u64> {
    let mut got = 0;
    while got < u64::from(QUEUE_SIZE) && d.recv()?.is_some() {
        got += 1;
    }
    d.fill_rx()?;
    Ok(got)
}

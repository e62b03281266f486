//! `rings`: a VM guest that abuses its virtio rings for the whole cell, played without a VM
//! by `sluice_vhost::driver` on a vhost-user port of the path's switch; and a second,
//! well-behaved one (the feeder) that sends frames to it, so that its receive queue has
//! frames to take while it lies about it.
//!
//! The hostile guest cycles through six abuses, [`PHASE`] each, and resets both rings after
//! each (as QEMU does when a guest resets its device: a queue the port found broken stays
//! broken until then), connecting again if the port ended the connection. Every loop is
//! bounded by the phase's end, the cell's stop flag and the condition's deadline.

use std::io;
use std::path::Path;
use std::time::{Duration, Instant};

use sluice_vhost::driver::{DESC_INDIRECT, DESC_NEXT, DESC_WRITE, Driver, QUEUE_SIZE, SPARE};

use super::{Clock, Shared, Tally};

/// How long each abuse lasts before the rings are reset and the next one starts.
pub const PHASE: Duration = Duration::from_millis(200);
/// Frames a second the feeder sends to the hostile guest, at most (as many as the switch
/// takes from its 64 transmit slots).
pub const FEED_PER_S: u64 = 20_000;
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
    /// A queue's worth of 1-byte receive buffers, posted again as frames use them.
    TinyBuffers,
    /// A chain head, and a `next`, beyond the descriptor table.
    BadHead,
}

impl Abuse {
    /// In the order they cycle.
    pub const ALL: [Abuse; 6] =
        [Abuse::RxIndex, Abuse::TxIndex, Abuse::Indirect, Abuse::ZeroChains, Abuse::TinyBuffers, Abuse::BadHead];

    /// Its name in the cell's record.
    pub fn name(self) -> &'static str {
        match self {
            Abuse::RxIndex => "rx_index",
            Abuse::TxIndex => "tx_index",
            Abuse::Indirect => "indirect",
            Abuse::ZeroChains => "zero_chains",
            Abuse::TinyBuffers => "tiny_buffers",
            Abuse::BadHead => "bad_head",
        }
    }
}

/// Connects to the port at `sock`, trying until it answers, the cell stops or its deadline
/// passes.
fn connect(sock: &Path, sh: &Shared) -> Option<Driver> {
    while !sh.over() {
        match Driver::connect(sock, u64::MAX, Duration::from_millis(500)) {
            Ok(d) => return Some(d),
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
    None
}

/// A minimal frame from `src` to `dst` (EtherType 0x88B5), `len` bytes.
fn frame(dst: [u8; 6], src: [u8; 6], len: usize) -> Vec<u8> {
    let mut f = vec![0u8; len.max(60)];
    f[..6].copy_from_slice(&dst);
    f[6..12].copy_from_slice(&src);
    f[12..14].copy_from_slice(&[0x88, 0xB5]);
    f
}

/// The hostile guest: cycles through [`Abuse::ALL`] until the cell stops.
pub fn hostile(sock: &Path, me: [u8; 6], feeder: [u8; 6], sh: &Shared, mut clock: Clock) -> Tally {
    let mut t = Tally::default();
    let mut d: Option<Driver> = None;
    let mut k = 0usize;
    while !sh.over() {
        if d.is_none() {
            d = connect(sock, sh);
            if d.is_none() {
                break;
            }
            if k > 0 {
                t.add("reconnects", 1);
            }
        }
        let Some(drv) = d.as_mut() else { break };
        let abuse = Abuse::ALL[k % Abuse::ALL.len()];
        k += 1;
        match run(drv, abuse, me, feeder, sh, &mut t) {
            Ok(()) => t.add(abuse.name(), 1),
            Err(_) => {
                // The port ended the connection (or the ring calls failed): a new one.
                t.add("connection_errors", 1);
                d = None;
            }
        }
        clock.tick();
    }
    clock.tick();
    t
}

fn in_flight(d: &mut Driver, transmit: bool) -> io::Result<u16> {
    let used = if transmit { d.tx_used()? } else { d.rx_used()? };
    Ok(d.avail_idx(transmit).wrapping_sub(used))
}

/// One abuse, for [`PHASE`], then both rings reset.
fn run(d: &mut Driver, abuse: Abuse, me: [u8; 6], feeder: [u8; 6], sh: &Shared, t: &mut Tally) -> io::Result<()> {
    let until = Instant::now() + PHASE;
    let going = || Instant::now() < until && !sh.over();
    // Say who it is, so the switch forwards the feeder's frames here.
    d.send(&[0; 12], &frame(feeder, me, 60))?;
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
                t.add("kicks", 1);
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        Abuse::Indirect | Abuse::ZeroChains => {
            let (tx_head, rx_head) = if abuse == Abuse::Indirect {
                d.write_desc(true, 100, SPARE, 16 * 65_535, DESC_INDIRECT, 0)?;
                d.write_desc(false, 200, SPARE, 16, DESC_INDIRECT | DESC_WRITE, 0)?;
                (100, 200)
            } else {
                for i in 0..QUEUE_SIZE {
                    d.write_desc(true, i, SPARE, 0, DESC_NEXT, (i + 1) % QUEUE_SIZE)?;
                    d.write_desc(false, i, SPARE, 0, DESC_WRITE | DESC_NEXT, (i + 1) % QUEUE_SIZE)?;
                }
                (0, 0)
            };
            while going() {
                let mut offered = false;
                if in_flight(d, true)? < MAX_IN_FLIGHT {
                    d.offer_tx_chain(tx_head)?;
                    t.add("chains", 1);
                    offered = true;
                }
                if in_flight(d, false)? < 16 {
                    d.offer_rx_chain(rx_head)?;
                    t.add("chains", 1);
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
                t.add("tiny_buffers_posted", u64::from(d.post_rx_sized(QUEUE_SIZE, 1)?));
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
    t.add("resets", 2);
    Ok(())
}

/// The feeder: a guest that behaves, sending [`FEED_PER_S`] frames a second to `target`
/// (and taking what is flooded to it) until the cell stops.
pub fn feeder(sock: &Path, me: [u8; 6], target: [u8; 6], sh: &Shared, mut clock: Clock) -> Tally {
    let mut t = Tally::default();
    let f = frame(target, me, 200);
    let tick = Duration::from_millis(10);
    let per_tick = FEED_PER_S / 100;
    let mut d: Option<Driver> = None;
    let mut next = Instant::now();
    while !sh.over() {
        if d.is_none() {
            let Some(mut drv) = connect(sock, sh) else { break };
            if drv.fill_rx().is_err() {
                continue;
            }
            d = Some(drv);
        }
        let Some(drv) = d.as_mut() else { break };
        match feed(drv, &f, per_tick, next + tick) {
            Ok((sent, got)) => {
                t.add("feeder_frames", sent);
                t.add("feeder_received", got);
            }
            Err(_) => {
                t.add("feeder_reconnects", 1);
                d = None;
            }
        }
        clock.tick();
        next += tick;
        let now = Instant::now();
        if next > now {
            std::thread::sleep(next - now);
        } else {
            next = now;
        }
    }
    clock.tick();
    t
}

/// One turn of the feeder: up to `n` frames sent before `until` (waiting a little when
/// all its transmit slots are in flight), what came in taken, buffers posted again.
fn feed(d: &mut Driver, f: &[u8], n: u64, until: Instant) -> io::Result<(u64, u64)> {
    let mut sent = 0;
    while sent < n && Instant::now() < until {
        if d.send(&[0; 12], f)? {
            sent += 1;
        } else {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    let mut got = 0;
    while got < u64::from(QUEUE_SIZE) && d.recv()?.is_some() {
        got += 1;
    }
    d.fill_rx()?;
    Ok((sent, got))
}

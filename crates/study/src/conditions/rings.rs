//! `rings`: a VM guest that abuses its virtio rings for the whole cell, played without a VM
//! by `sluice_vhost::driver` on a vhost-user port of the path's switch; and a second,
//! well-behaved one (the feeder) that sends frames to it, so that its receive queue has
//! frames to take while it lies about it. `vm-feed`, its control: the same feeder sending
//! the same frames at the same rate to a well-behaved guest, which takes them.
//!
//! The hostile guest cycles through the abuses of [`sluice_vhost::abuse`], [`PHASE`] each,
//! and resets both rings after each (as QEMU does when a guest resets its device: a queue
//! the port found broken stays broken until then), connecting again if the port ended the
//! connection. Every loop is bounded by the phase's end, the cell's stop flag and the
//! condition's deadline.

use std::path::Path;
use std::time::{Duration, Instant};

use sluice_vhost::abuse::{self, Abuse, FEED_FRAME_LEN, FEED_PER_S, PHASE};
use sluice_vhost::driver::Driver;

use super::{Clock, Shared, Tally};

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
        let a = Abuse::ALL[k % Abuse::ALL.len()];
        k += 1;
        let stop = || sh.over();
        match abuse::play(drv, a, me, feeder, Instant::now() + PHASE, &stop, &mut |what, n| t.add(what, n)) {
            Ok(()) => t.add(a.name(), 1),
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

/// The well-behaved guest of `vm-feed`: posts receive buffers, takes the frames the
/// switch writes and posts their buffers again, every 2 ms (at [`FEED_PER_S`] a queue of
/// 256 buffers lasts 12 ms); says who it is every [`PHASE`], as the hostile guest does.
pub fn receiver(sock: &Path, me: [u8; 6], feeder: [u8; 6], sh: &Shared, mut clock: Clock) -> Tally {
    let mut t = Tally::default();
    let mut d: Option<Driver> = None;
    let mut said = Instant::now();
    while !sh.over() {
        if d.is_none() {
            let Some(mut drv) = connect(sock, sh) else { break };
            if drv.fill_rx().and_then(|()| abuse::hello(&mut drv, me, feeder)).is_err() {
                continue;
            }
            said = Instant::now();
            d = Some(drv);
        }
        let Some(drv) = d.as_mut() else { break };
        let turn = abuse::take(drv).and_then(|got| {
            if said.elapsed() >= PHASE {
                abuse::hello(drv, me, feeder)?;
                said = Instant::now();
            }
            Ok(got)
        });
        match turn {
            Ok(got) => t.add("received", got),
            Err(_) => {
                t.add("receiver_reconnects", 1);
                d = None;
            }
        }
        clock.tick();
        std::thread::sleep(Duration::from_millis(2));
    }
    clock.tick();
    t
}

/// The feeder: a guest that behaves, sending [`FEED_PER_S`] frames a second to `target`
/// (and taking what is flooded to it) until the cell stops.
pub fn feeder(sock: &Path, me: [u8; 6], target: [u8; 6], sh: &Shared, mut clock: Clock) -> Tally {
    let mut t = Tally::default();
    let f = abuse::frame(target, me, FEED_FRAME_LEN);
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
        match abuse::feed(drv, &f, per_tick, next + tick) {
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

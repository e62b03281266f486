//! `rate_out` in user space: what a port is sent leaves at its rate, burst first, with the
//! driver's clock (here a fake one: exact counts) — frames wait in the port's queue while
//! its bucket is empty, the driver is told when to come back, and what does not fit the
//! queue is dropped as `rate_limit`; another port is not slowed.

mod common;

use common::*;
use sluice_switch::{PortPolicy, RateLimit, Switch, SwitchConfig};

#[test]
fn a_shaped_port_is_sent_its_rate_burst_first_and_no_other_port_waits() {
    let mut sw = Switch::new(SwitchConfig { queue_len: 64, ..cfg() }).unwrap();
    // 8 Mbit/s: 1,000 bytes a millisecond; a burst of 10,000 bytes.
    let rate = RateLimit { rate_in: 0, rate_out: 8_000_000, burst: 10_000 };
    let shaped = add_with(&mut sw, "shaped", PortPolicy { rate, ..PortPolicy::default() });
    let free = add_with(&mut sw, "free", PortPolicy::default());
    let from = add_with(&mut sw, "from", PortPolicy::default());
    // Both destinations' stations known, so each frame goes to one port.
    send(&mut sw, shaped.0, &shaped.1, &eth(mac(9), mac(2), 0x0800, 50), 0);
    send(&mut sw, free.0, &free.1, &eth(mac(9), mac(3), 0x0800, 50), 0);
    for h in [&shaped.1, &free.1, &from.1] {
        h.take_sent();
    }
    let t0 = 1_000;
    // 1,000-byte frames (986 of payload and the header).
    let frame = |dst: u8| eth(mac(dst), mac(1), 0x0800, 986);
    for _ in 0..30 {
        send(&mut sw, from.0, &from.1, &frame(2), t0);
        send(&mut sw, from.0, &from.1, &frame(3), t0);
    }
    assert_eq!(free.1.take_sent().len(), 30, "the unlimited port is sent everything at once");
    assert_eq!(shaped.1.take_sent().len(), 10, "the burst: 10,000 bytes");
    // The rest waits in the queue, and the driver is told when to come back.
    let at = sw.next_deadline_ms().expect("a deadline for the shaped queue");
    assert!((t0 + 1..=t0 + 2).contains(&at), "one frame's worth later: {at}");
    // 1,000 bytes a millisecond: 5 ms, 5 more frames; nothing before the deadline.
    sw.watchdog(t0);
    assert_eq!(shaped.1.take_sent().len(), 0);
    sw.watchdog(t0 + 5);
    assert_eq!(shaped.1.take_sent().len(), 5, "5 ms of the rate");
    // Until the queue is empty: the 30 frames, at the rate.
    let mut ms = t0 + 5;
    let mut sent = 15;
    while sent < 30 && ms < t0 + 1_000 {
        ms += 1;
        sw.watchdog(ms);
        sent += shaped.1.take_sent().len();
    }
    assert_eq!(sent, 30);
    assert_eq!(ms, t0 + 20, "20 ms for 20,000 bytes past the burst");
    assert_eq!(sw.next_deadline_ms(), None, "nothing waits");
    assert_conserved(&sw);
}

#[test]
fn frames_past_a_shaped_ports_full_queue_are_dropped_as_rate_limit() {
    let mut sw = Switch::new(cfg()).unwrap();
    let rate = RateLimit { rate_in: 0, rate_out: 8_000, burst: 1_000 };
    let shaped = add_with(&mut sw, "shaped", PortPolicy { rate, ..PortPolicy::default() });
    let from = add_with(&mut sw, "from", PortPolicy::default());
    send(&mut sw, shaped.0, &shaped.1, &eth(mac(9), mac(2), 0x0800, 50), 0);
    for _ in 0..5_000 {
        send(&mut sw, from.0, &from.1, &eth(mac(2), mac(1), 0x0800, 986), 1_000);
    }
    let c = sw.port_info(shaped.0).unwrap().counters;
    assert!(c.tx_drops.rate_limit > 0, "{c:?}");
    assert_eq!(c.tx_drops.queue_full, 0, "a shaped port's drops are its rate's: {c:?}");
    assert_conserved(&sw);
}

#[test]
fn a_frame_larger_than_the_burst_still_passes_and_the_next_waits_for_it() {
    let mut sw = Switch::new(cfg()).unwrap();
    let rate = RateLimit { rate_in: 0, rate_out: 8_000_000, burst: 500 };
    let shaped = add_with(&mut sw, "shaped", PortPolicy { rate, ..PortPolicy::default() });
    let from = add_with(&mut sw, "from", PortPolicy::default());
    send(&mut sw, shaped.0, &shaped.1, &eth(mac(9), mac(2), 0x0800, 50), 0);
    send(&mut sw, from.0, &from.1, &eth(mac(2), mac(1), 0x0800, 986), 1_000);
    send(&mut sw, from.0, &from.1, &eth(mac(2), mac(1), 0x0800, 986), 1_000);
    assert_eq!(shaped.1.take_sent().len(), 1, "a full bucket passes one frame larger than the burst");
    sw.watchdog(1_001);
    assert_eq!(shaped.1.take_sent().len(), 1, "the next, once the first is paid for");
    assert_conserved(&sw);
}

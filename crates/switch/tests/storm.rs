//! Storm control in user space: a port's broadcast and multicast are held to its rates,
//! burst first, with the driver's clock (here a fake one: exact counts); unicast and the
//! other kind are not charged.

mod common;

use common::*;
use sluice_switch::{PortPolicy, StormControl, Switch};

const BCAST: [u8; 6] = [0xff; 6];
const MCAST: [u8; 6] = [0x01, 0x00, 0x5e, 0, 0, 1];

#[test]
fn broadcast_and_multicast_are_held_to_their_rates_and_unicast_is_not() {
    let mut sw = Switch::new(cfg()).unwrap();
    let storm = StormControl { broadcast_pps: 100, multicast_pps: 10, burst: 5 };
    let noisy = add_with(&mut sw, "noisy", PortPolicy { storm, ..PortPolicy::default() });
    let quiet = add(&mut sw, "quiet", access(1), None, OFFLOAD);
    // The quiet port's station is known, so unicast to it is forwarded, not flooded.
    send(&mut sw, quiet.0, &quiet.1, &eth(mac(9), mac(2), 0x0800, 50), 0);
    let t0 = 1_000;
    let sent_at = |sw: &mut Switch, dst: [u8; 6], n: usize, ms: u64| {
        for _ in 0..n {
            send(sw, noisy.0, &noisy.1, &eth(dst, mac(1), 0x0800, 50), ms);
        }
        quiet.1.take_sent().len()
    };
    assert_eq!(sent_at(&mut sw, BCAST, 20, t0), 5, "the burst of broadcasts, at once");
    assert_eq!(sent_at(&mut sw, MCAST, 20, t0), 5, "multicast has its own bucket");
    assert_eq!(sent_at(&mut sw, mac(2), 50, t0), 50, "unicast is never charged");
    // 100 broadcasts a second: one every 10 ms.
    assert_eq!(sent_at(&mut sw, BCAST, 3, t0 + 10), 1);
    assert_eq!(sent_at(&mut sw, BCAST, 3, t0 + 15), 0);
    // Half a second: 50 more intervals, at most the burst at once.
    assert_eq!(sent_at(&mut sw, BCAST, 100, t0 + 510), 5);
    // Over two seconds of 1 ms ticks, 3 a tick: the rate, and the burst once.
    let mut passed = 0;
    for ms in 0..2_000 {
        passed += sent_at(&mut sw, MCAST, 3, t0 + 2_000 + ms);
    }
    assert!((20..=25).contains(&passed), "10 multicast frames a second: {passed}");
    // Every group frame that did not pass was counted, at the input.
    let (sent, through) = (20 + 20 + 3 + 3 + 100 + 6_000, 5 + 5 + 1 + 5 + passed as u64);
    let c = sw.port_info(noisy.0).unwrap().counters;
    assert_eq!(c.rx_drops.storm, sent - through, "{c:?}");
    assert_conserved(&sw);
}

#[test]
fn the_default_burst_is_a_tenth_of_a_second_and_at_least_16() {
    let s = StormControl { broadcast_pps: 1_000, multicast_pps: 50, burst: 0 };
    assert_eq!((s.burst_of(1_000), s.burst_of(50)), (100, 16));
    assert_eq!(StormControl { burst: 7, ..s }.burst_of(1_000), 7);
}

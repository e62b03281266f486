//! Forwarding allocates nothing per frame once the switch is warm.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};

use common::*;
use sluice_switch::Switch;
use sluice_wire::VnetHdr;

struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards every call to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as our caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as our caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as our caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn no_heap_allocation_per_forwarded_frame() {
    let mut sw = Switch::new(cfg()).unwrap();
    let a = add(&mut sw, "a", access(1), None, OFFLOAD);
    let b = add(&mut sw, "b", access(1), None, OFFLOAD);
    let c = add(&mut sw, "c", access(10), None, NO_OFFLOAD);
    let t = add(&mut sw, "t", trunk(&[10], Some(1)), None, OFFLOAD);
    for h in [&a.1, &b.1, &c.1, &t.1] {
        h.stop_recording();
    }
    send(&mut sw, b.0, &b.1, &eth(BCAST, mac(2), 0x0806, 28), 0);
    send(&mut sw, c.0, &c.1, &eth(BCAST, mac(3), 0x0806, 28), 0);
    let (gso_v, gso) = tcp4(mac(3), mac(1), 30_000, Some(1448));
    let unicast = eth(mac(2), mac(1), 0x0800, 1000);
    let flood = eth(BCAST, mac(1), 0x88b5, 60);
    let tagged_gso = tag(&gso, 10);

    // Only the forwarding is measured: setting a frame up to repeat allocates.
    let mut run = |n: u64| -> u64 {
        let mut allocs = 0;
        for (port, frame, vnet) in
            [(&a, &unicast, VnetHdr::default()), (&a, &flood, VnetHdr::default()), (&t, &tagged_gso, gso_v)]
        {
            port.1.repeat(vnet, frame, n);
            let before = ALLOCS.load(Ordering::Relaxed);
            while sw.on_readable(port.0, 5) {}
            allocs += ALLOCS.load(Ordering::Relaxed) - before;
        }
        allocs
    };
    run(100); // warm up
    assert_eq!(run(10_000), 0, "allocations while forwarding 30 000 frames");
    let (bs, cs) = (b.1.sent_count(), c.1.sent_count());
    assert!(bs >= 20_200 && cs > 200_000, "b got {bs}, c got {cs}: {:?}", sw.ports());
}

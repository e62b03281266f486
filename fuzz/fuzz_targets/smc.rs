//! Fuzzes what the shared-memory fast path reads from a peer: a handshake datagram, and a
//! ring whose header the peer rewrites between our operations. Besides "never panics",
//! AddressSanitizer checks that no push or pop touches memory outside the ring's region
//! however the cursors, the window and the state word are garbled, and each call moves at
//! most the ring's area. The window starts at a quarter of the area and may grow (empty or
//! full).

#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_smc::msg::Msg;
use sluice_smc::ring::{Ring, region_len};

const SIZE: usize = 4 * 4096;
const WINDOW: usize = 4096;

#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

fuzz_target!(|data: &[u8]| {
    let _ = Msg::decode(data);
    // The rest drives a ring: each 11-byte step writes 8 bytes at one of the header's
    // words the peer can reach, then pushes, pops, peeks, skips a length or grows.
    let mut mem = vec![Line([0; 64]); region_len(SIZE) / 64];
    let ptr = mem.as_mut_ptr().cast::<u8>();
    // SAFETY: `mem` is region_len(SIZE) bytes, 64-aligned, and outlives both views.
    let (w, r) =
        unsafe { (Ring::create(ptr, region_len(SIZE), SIZE, WINDOW).unwrap(), Ring::attach(ptr, region_len(SIZE)).unwrap()) };
    let mut buf = vec![0u8; 2 * SIZE];
    for step in data.chunks_exact(11) {
        // Words at 64 (prod), 72 (quiet budget, window), 128 (cons), 192 (state, flags),
        // 200 (want).
        let at = [64usize, 72, 128, 192, 200][usize::from(step[0]) % 5];
        // SAFETY: `at` + 8 lies inside the header, 8-aligned.
        unsafe { (ptr.add(at) as *mut [u8; 8]).write_volatile(step[1..9].try_into().unwrap()) };
        let len = usize::from(u16::from_le_bytes([step[9], step[10]])) % (2 * SIZE);
        let moved = match (step[0] / 5) % 6 {
            0 => w.push(&buf[..len]).map(|p| p.n),
            1 => r.pop(&mut buf[..len], false).map(|p| p.n),
            2 => r.pop(&mut buf[..len], true).map(|p| p.n),
            3 => r.skip(len).map(|p| p.n),
            4 => w.grow_full().map(|_| 0),
            _ => w.grow().map(|_| 0),
        };
        if let Ok(n) = moved {
            assert!(n <= SIZE);
        }
        let _ = (r.prepare_sleep(len), r.quiet(), r.bell_open(), w.len());
        r.cancel_sleep();
    }
});

//! The machine's copy bandwidth, the physical limit of a byte stream between two
//! processes (one memory copy per byte): how fast one core copies a buffer that stays in
//! its cache, and one that does not (from memory to memory). Stream results are read as
//! a share of it.

use std::hint::black_box;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// A buffer that stays in one core's cache (L2 on current x86 and Arm cores).
pub const CACHED_BYTES: usize = 64 << 10;
/// A buffer no cache holds: larger than any last-level cache this runs on.
pub const MEMORY_BYTES: usize = 256 << 20;

/// One core's copy rate, in MB/s (10^6 bytes copied — each read once and written once —
/// a second).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CopyRate {
    /// Copying a [`CACHED_BYTES`] buffer again and again.
    pub cached_mb_s: f64,
    /// Copying a [`MEMORY_BYTES`] buffer.
    pub memory_mb_s: f64,
}

/// Measures this core's copy rate with the best copy the C library has for this CPU
/// (`memcpy`): about 0.6 s, and 512 MiB of memory for the moment.
pub fn measure() -> CopyRate {
    CopyRate {
        cached_mb_s: rate(CACHED_BYTES, Duration::from_millis(200)),
        memory_mb_s: rate(MEMORY_BYTES, Duration::from_millis(400)),
    }
}

/// MB/s copying `size` bytes for at least `budget` (after one copy that faults the pages
/// in); bounded by the budget and one copy more.
fn rate(size: usize, budget: Duration) -> f64 {
    let src = vec![0x5au8; size];
    let mut dst = vec![0u8; size];
    dst.copy_from_slice(&src);
    let start = Instant::now();
    let mut bytes = 0u64;
    while start.elapsed() < budget {
        dst.copy_from_slice(black_box(&src));
        black_box(&mut dst);
        bytes += size as u64;
    }
    bytes as f64 / start.elapsed().as_secs_f64() / 1e6
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_rate_is_measured() {
        assert!(rate(CACHED_BYTES, Duration::from_millis(20)) > 0.0);
        assert!(rate(8 << 20, Duration::from_millis(20)) > 0.0);
    }
}

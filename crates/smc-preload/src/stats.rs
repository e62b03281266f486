//! Counting into the host-wide statistics segment (`sluice_smc::stats`). The segment is
//! mapped on first use; if it cannot be, counting is skipped — statistics never stop a
//! connection.

use std::os::fd::IntoRawFd;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use sluice_smc::msg::Reason;
use sluice_smc::stats::{self, Counter};

use crate::sys::Shm;

static SEGMENT: OnceLock<Option<Shm>> = OnceLock::new();

fn words() -> Option<&'static [AtomicU64]> {
    let shm = SEGMENT.get_or_init(|| {
        let dir = crate::run_dir().join("smc");
        let _ = std::fs::create_dir_all(&dir);
        let path = dir.join("stats");
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o666)
            .open(&path)
            .ok()?;
        // Every user's programs count here (the umask may have narrowed the mode).
        let _ = f.set_permissions(std::fs::Permissions::from_mode(0o666));
        if f.metadata().ok()?.len() < stats::LEN as u64 {
            f.set_len(stats::LEN as u64).ok()?;
        }
        let shm = Shm::map(f.into_raw_fd(), stats::LEN).ok()?;
        // A fresh segment gets its magic word once, here, not on every count.
        let _ = view(&shm)[0].compare_exchange(0, stats::MAGIC, Ordering::Relaxed, Ordering::Relaxed);
        Some(shm)
    });
    shm.as_ref().map(view)
}

fn view(shm: &Shm) -> &[AtomicU64] {
    // SAFETY: the mapping is LEN bytes, page aligned, shared, and lives as long as `shm`.
    unsafe { std::slice::from_raw_parts(shm.ptr.cast::<AtomicU64>(), stats::LEN / 8) }
}

fn add(i: usize, n: u64) {
    if let Some(w) = words() {
        w[i].fetch_add(n, Ordering::Relaxed);
    }
}

/// Counts one event.
pub fn count(c: Counter) {
    add(stats::counter_index(c), 1);
}

/// A connection stayed on TCP.
pub fn fallback(reason: Reason, server: bool) {
    add(stats::fallback_index(reason, server), 1);
    // Not errors: the peer is not sluice, or the connection is not the listener's.
    if !matches!(reason, Reason::NoListener | Reason::NoProposal | Reason::NotOurConnection | Reason::PeerDeclined) {
        count(Counter::HandshakeErrors);
    }
}

/// A connection moved to shared memory with these ring sizes.
pub fn smc(server: bool, rmem: usize, tmem: usize) {
    count(if server { Counter::SmcServer } else { Counter::SmcClient });
    add(stats::hist_index(rmem, false), 1);
    add(stats::hist_index(tmem, true), 1);
}

/// Bytes written into shared memory by one call.
pub fn add_tx(n: usize) {
    add(stats::counter_index(Counter::TxBytes), n as u64);
}

/// Bytes read from shared memory by one call.
pub fn add_rx(n: usize) {
    add(stats::counter_index(Counter::RxBytes), n as u64);
}

/// A write found the peer's ring full.
pub fn buffer_full() {
    count(Counter::BufferFull);
}

//! Counting into this user's statistics segment (`sluice_smc::stats`): the file
//! `smc/stats/UID`, which only this user's programs write. It is mapped on first use, and
//! only if it is a regular file of this user's with its pages allocated (so a full /run
//! cannot fault a count); if it cannot be, counting is skipped —
//! statistics never stop a connection. The file only ever grows (`sluice smc stats reset`
//! writes zeros in place), so no mapping loses its pages.

use std::os::fd::IntoRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use sluice_smc::msg::Reason;
use sluice_smc::stats::{self, Counter};

use crate::sys::Shm;

static SEGMENT: OnceLock<Option<Shm>> = OnceLock::new();

fn words() -> Option<&'static [AtomicU64]> {
    let shm = SEGMENT.get_or_init(|| {
        crate::registry::policy()?;
        let uid = crate::sys::euid();
        let path = crate::run_dir().join("smc").join("stats").join(stats::file_name(uid));
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(sluice_smc::access::ENTRY_MODE)
            .custom_flags(crate::sys::O_NOFOLLOW | crate::sys::O_CLOEXEC)
            .open(&path)
            .ok()?;
        let m = f.metadata().ok()?;
        // Someone else's file under our name (planted before we came) is not counted into.
        if !m.file_type().is_file() || m.uid() != uid {
            return None;
        }
        if m.len() < stats::LEN as u64 {
            f.set_len(stats::LEN as u64).ok()?;
        }
        // Real pages, not a hole: a hole filled on first count would be SIGBUS when /run
        // is full (and other users can fill it).
        if !crate::sys::allocate(std::os::fd::AsRawFd::as_raw_fd(&f), stats::LEN as u64) {
            return None;
        }
        let mut shm = Shm::map(f.into_raw_fd(), stats::LEN).ok()?;
        // The mapping is all we need: no descriptor of the program's is taken for good.
        shm.close_fd();
        // A fresh segment gets its magic word once, here, not on every count; one of an
        // older layout (a sluice before this one) starts over in this one.
        let w = view(&shm);
        if let Err(old) = w[0].compare_exchange(0, stats::MAGIC, Ordering::Relaxed, Ordering::Relaxed)
            && old != stats::MAGIC
        {
            w[1..].iter().for_each(|x| x.store(0, Ordering::Relaxed));
            w[0].store(stats::MAGIC, Ordering::Release);
        }
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

/// Maps this user's segment now (at `listen`, before the program forks): the processes
/// it forks count into it too, also once they drop privileges (nginx's workers run as
/// another user, who may not write this user's file).
pub fn prepare() {
    let _ = words();
}

/// Counts one event.
pub fn count(c: Counter) {
    add(stats::counter_index(c), 1);
}

/// A connection stayed on TCP.
pub fn fallback(reason: Reason, server: bool) {
    add(stats::fallback_index(reason, server), 1);
    if reason.is_error() {
        count(Counter::HandshakeErrors);
    }
}

/// A connection moved to shared memory with these ring sizes.
pub fn smc(server: bool, rmem: usize, tmem: usize) {
    count(if server { Counter::SmcServer } else { Counter::SmcClient });
    add(stats::hist_index(rmem, false), 1);
    add(stats::hist_index(tmem, true), 1);
}

/// One connection's data counters, kept in the connection (no cache line shared between
/// connections, threads or processes on the data path) and added to the segment every
/// [`Tally::EVERY`] calls, when the connection ends, and at exit. `sluice smc stats` is so
/// at most that many calls behind per live connection.
#[derive(Default)]
pub struct Tally {
    tx_bytes: AtomicU64,
    rx_bytes: AtomicU64,
    tx_calls: AtomicU64,
    rx_calls: AtomicU64,
    bells: AtomicU64,
    ring_events: AtomicU64,
    pending: AtomicU64,
    /// Bytes moved either way, and the transfers that moved them, over the connection's
    /// life (never flushed: what the automatic rule is told when it ends).
    life_bytes: AtomicU64,
    life_moves: AtomicU64,
}

impl Tally {
    /// Calls between additions to the segment.
    pub const EVERY: u64 = 64;

    /// A call that writes into shared memory.
    pub fn tx_call(&self) {
        self.tx_calls.fetch_add(1, Ordering::Relaxed);
        self.tick();
    }

    /// A call that reads from shared memory.
    pub fn rx_call(&self) {
        self.rx_calls.fetch_add(1, Ordering::Relaxed);
        self.tick();
    }

    /// A doorbell byte written to the peer.
    pub fn bell(&self) {
        self.bells.fetch_add(1, Ordering::Relaxed);
    }

    /// An event loop took this connection's readiness from its ring (crate::looks).
    pub fn ring_event(&self) {
        self.ring_events.fetch_add(1, Ordering::Relaxed);
    }

    /// Bytes written into shared memory.
    pub fn tx(&self, n: usize) {
        self.tx_bytes.fetch_add(n as u64, Ordering::Relaxed);
        self.moved(n);
    }

    fn moved(&self, n: usize) {
        if n > 0 {
            self.life_bytes.fetch_add(n as u64, Ordering::Relaxed);
            self.life_moves.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Bytes moved either way over the connection's life, and the transfers.
    pub fn lifetime(&self) -> (u64, u64) {
        (self.life_bytes.load(Ordering::Relaxed), self.life_moves.load(Ordering::Relaxed))
    }

    /// Bytes read from shared memory.
    pub fn rx(&self, n: usize) {
        self.rx_bytes.fetch_add(n as u64, Ordering::Relaxed);
        self.moved(n);
    }

    fn tick(&self) {
        if self.pending.fetch_add(1, Ordering::Relaxed) + 1 >= Self::EVERY {
            self.flush();
        }
    }

    /// Adds what was counted since the last time to the segment.
    pub fn flush(&self) {
        self.pending.store(0, Ordering::Relaxed);
        for (c, v) in [
            (Counter::TxBytes, &self.tx_bytes),
            (Counter::RxBytes, &self.rx_bytes),
            (Counter::TxCalls, &self.tx_calls),
            (Counter::RxCalls, &self.rx_calls),
            (Counter::Doorbells, &self.bells),
            (Counter::RingEvents, &self.ring_events),
        ] {
            let n = v.swap(0, Ordering::Relaxed);
            if n > 0 {
                add(stats::counter_index(c), n);
            }
        }
    }
}

impl Drop for Tally {
    fn drop(&mut self) {
        self.flush();
    }
}

/// A write found the peer's ring full.
pub fn buffer_full() {
    count(Counter::BufferFull);
}

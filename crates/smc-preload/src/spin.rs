//! Adaptive spinning before sleeping (docs/architecture.md, "Wake-ups that cost less than
//! a sleep"): a thread about to wait for a peer that usually answers within a few
//! microseconds looks for the answer for a little while first, instead of paying a sleep
//! and a wake-up (tens of microseconds on a virtual machine). How long it looks follows how
//! long its waits have lately been: twice the recent average, at most the limit
//! (`spin=` in `SLUICE_SMC`, `sluice smc run --spin`), and not at all while waits run
//! longer than the limit — an idle connection or event loop never spins. On a machine with
//! one CPU nothing spins: the answer cannot come while we hold the CPU.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// The limit in microseconds when `SLUICE_SMC` names none.
pub const DEFAULT_US: u32 = 50;

static LIMIT_US: AtomicU32 = AtomicU32::new(DEFAULT_US);

/// Sets the limit (from `SLUICE_SMC`'s `spin=`; 0 turns spinning off).
pub fn set_limit_us(us: u32) {
    LIMIT_US.store(us.min(1000), Ordering::Relaxed);
}

fn limit_ns() -> u32 {
    static CPUS: OnceLock<usize> = OnceLock::new();
    let cpus = *CPUS.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    if cpus < 2 { 0 } else { LIMIT_US.load(Ordering::Relaxed) * 1000 }
}

/// Connections on shared memory alive in this process: the poll-family hooks spin only
/// while there is one (nothing else of theirs can be answered that fast).
pub static LIVE: AtomicUsize = AtomicUsize::new(0);

/// The recent waits of one kind of waiter (a connection's reader, the process's event
/// loop): an average, in nanoseconds, that weighs the latest wait an eighth.
pub struct Adaptive {
    avg_ns: AtomicU32,
}

impl Adaptive {
    pub const fn new() -> Adaptive {
        // Start as if waits were long: spin only once short waits have been seen.
        Adaptive { avg_ns: AtomicU32::new(u32::MAX) }
    }

    /// How long to look before sleeping now (zero: do not).
    pub fn budget(&self) -> Duration {
        let limit = limit_ns();
        let avg = self.avg_ns.load(Ordering::Relaxed);
        if limit == 0 || avg > limit {
            return Duration::ZERO;
        }
        Duration::from_nanos(u64::from(avg.saturating_mul(2).clamp(2_000, limit)))
    }

    /// A wait took `d` (spinning or sleeping).
    pub fn record(&self, d: Duration) {
        let w = d.as_nanos().min(u128::from(u32::MAX / 2)) as u32;
        let old = self.avg_ns.load(Ordering::Relaxed);
        let new = if old == u32::MAX { w } else { old - old / 8 + w / 8 };
        self.avg_ns.store(new, Ordering::Relaxed);
    }
}

impl Default for Adaptive {
    fn default() -> Self {
        Adaptive::new()
    }
}

/// Looks for `ready` for up to `budget`; true if it came.
pub fn spin_until(budget: Duration, mut ready: impl FnMut() -> bool) -> bool {
    if budget.is_zero() {
        return false;
    }
    let start = Instant::now();
    loop {
        if ready() {
            return true;
        }
        if start.elapsed() >= budget {
            return false;
        }
        for _ in 0..16 {
            std::hint::spin_loop();
        }
    }
}

/// Looks for `done` every 50 µs, first at once, for up to `ms` milliseconds — a peer is
/// between two steps and may need this CPU to take the second; true if it came.
pub fn nap_until(ms: u64, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_millis(ms);
    loop {
        if done() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_micros(50));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_waits_earn_a_spin_long_ones_lose_it() {
        let a = Adaptive::new();
        assert_eq!(a.budget(), Duration::ZERO, "no spin before any wait was seen");
        for _ in 0..20 {
            a.record(Duration::from_micros(10));
        }
        let b = a.budget();
        if limit_ns() > 0 {
            assert!(b >= Duration::from_micros(15) && b <= Duration::from_micros(25), "{b:?}");
        }
        for _ in 0..40 {
            a.record(Duration::from_millis(5));
        }
        assert_eq!(a.budget(), Duration::ZERO, "long waits: sleep at once");
    }

    #[test]
    fn spinning_stops_at_the_budget_or_when_ready() {
        assert!(spin_until(Duration::from_millis(1), || true));
        assert!(!spin_until(Duration::ZERO, || true), "a zero budget never looks");
        let start = Instant::now();
        assert!(!spin_until(Duration::from_micros(200), || false));
        assert!(start.elapsed() >= Duration::from_micros(200));
    }
}

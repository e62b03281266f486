//! Token buckets kept as the generic cell rate algorithm, with the kernel executor's
//! arithmetic (`gcra` in crates/ebpf/bpf/exec.c): one time per bucket, the theoretical
//! arrival time of the next unit (`tat`), which a frame moves on by its cost, and which may
//! run ahead of now by at most the burst. The caller passes its clock in, so that tests
//! are exact.

/// A rate and a burst, as both datapaths meter them: picoseconds per unit (a frame for
/// storm control, a byte for a rate limit) and how far ahead of now the bucket's time may
/// run, in nanoseconds. `unit_ps` 0: no limit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Meter {
    /// Picoseconds each unit costs (0: unlimited).
    pub unit_ps: u64,
    /// The burst: how many nanoseconds of units may pass at once.
    pub burst_ns: u64,
}

impl Meter {
    /// No limit.
    pub const NONE: Meter = Meter { unit_ps: 0, burst_ns: 0 };

    /// `per_second` units a second, `burst` of them at once (at least one); `per_second`
    /// 0: no limit.
    pub fn new(per_second: u64, burst: u64) -> Meter {
        if per_second == 0 {
            return Meter::NONE;
        }
        let unit_ps = (1_000_000_000_000 / per_second).max(1);
        Meter { unit_ps, burst_ns: (burst.max(1).saturating_mul(unit_ps)) / 1000 }
    }

    /// The nanoseconds `units` cost.
    pub fn cost_ns(&self, units: u64) -> u64 {
        units.saturating_mul(self.unit_ps) / 1000
    }
}

/// One bucket's state: its meter and its theoretical arrival time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Bucket {
    /// The rate and burst.
    pub meter: Meter,
    /// The time (ns on the caller's clock) the next unit is due at the meter's rate.
    pub tat_ns: u64,
}

impl Bucket {
    /// A full bucket of `meter`.
    pub fn new(meter: Meter) -> Bucket {
        Bucket { meter, tat_ns: 0 }
    }

    /// Changes the rate or burst; the bucket keeps what it holds when the meter is the
    /// same.
    pub fn set(&mut self, meter: Meter) {
        if meter != self.meter {
            *self = Bucket::new(meter);
        }
    }

    /// Whether `units` may pass at `now_ns`, taking them if so: the same test as the
    /// kernel's — the bucket's time, no earlier than now, plus their cost, may be at most
    /// the burst ahead of now.
    pub fn take(&mut self, now_ns: u64, units: u64) -> bool {
        if self.meter.unit_ps == 0 {
            return true;
        }
        let t = self.tat_ns.max(now_ns);
        let cost = self.meter.cost_ns(units);
        if (t - now_ns).saturating_add(cost) > self.meter.burst_ns {
            return false;
        }
        self.tat_ns = t + cost;
        true
    }

    /// A shaper's take: `units` pass now (0), or the nanoseconds to wait before they may.
    /// More units than the burst holds pass when the bucket is full, running it into debt
    /// that the next ones wait for (a frame larger than the burst is never stuck).
    pub fn take_or_wait(&mut self, now_ns: u64, units: u64) -> u64 {
        if self.take(now_ns, units) {
            return 0;
        }
        if self.tat_ns <= now_ns {
            self.tat_ns = now_ns + self.meter.cost_ns(units);
            return 0;
        }
        // (Until the burst holds them, or, larger than the burst, until the bucket is full.)
        self.wait_ns(now_ns, units).min(self.tat_ns - now_ns).max(1)
    }

    /// How long from `now_ns` until `units` may pass (0: now).
    pub fn wait_ns(&self, now_ns: u64, units: u64) -> u64 {
        if self.meter.unit_ps == 0 {
            return 0;
        }
        let ahead = self.tat_ns.max(now_ns) - now_ns + self.meter.cost_ns(units);
        ahead.saturating_sub(self.meter.burst_ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn a_burst_passes_then_the_rate() {
        // 100 frames a second, 5 at once.
        let mut b = Bucket::new(Meter::new(100, 5));
        let t0 = 1_000 * MS;
        assert_eq!((0..20).filter(|_| b.take(t0, 1)).count(), 5, "the burst, at once");
        assert!(!b.take(t0 + 9 * MS, 1), "one interval is 10 ms");
        assert!(b.take(t0 + 10 * MS, 1));
        assert!(!b.take(t0 + 10 * MS, 1));
        // A second later, the bucket is full again, no fuller.
        assert_eq!((0..20).filter(|_| b.take(t0 + 1_010 * MS, 1)).count(), 5);
        // Over a long run, the rate: 100 a second plus the burst.
        let mut passed = 0;
        for ms in 0..10_000 {
            passed += (0..3).filter(|_| b.take(t0 + 2_000 * MS + ms * MS, 1)).count();
        }
        assert!((1_000..=1_005).contains(&passed), "{passed}");
    }

    #[test]
    fn bytes_are_metered_as_frames_are() {
        // 8 Mbit/s: a byte a microsecond; 3,000 bytes at once.
        let mut b = Bucket::new(Meter::new(1_000_000, 3_000));
        let t0 = 5 * MS;
        assert!(b.take(t0, 1_500) && b.take(t0, 1_500));
        assert!(!b.take(t0, 1), "empty");
        assert_eq!(b.wait_ns(t0, 1_500), 1_500_000, "1,500 bytes are 1.5 ms away");
        assert!(b.take(t0 + 1_500_000, 1_500));
        let mut none = Bucket::new(Meter::NONE);
        assert!((0..1000).all(|_| none.take(0, 65_535)), "no limit");
    }

    #[test]
    fn a_new_meter_starts_full_and_the_same_one_keeps_its_state() {
        let mut b = Bucket::new(Meter::new(10, 2));
        assert!(b.take(0, 1) && b.take(0, 1) && !b.take(0, 1));
        b.set(Meter::new(10, 2));
        assert!(!b.take(0, 1), "unchanged: still empty");
        b.set(Meter::new(10, 3));
        assert!(b.take(0, 1), "changed: full again");
    }
}

//! What one run measured, and the figures the studies derive from it.

use serde::{Deserialize, Serialize};

/// Latency of one transaction, in microseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Latency {
    /// Mean.
    pub mean_us: f64,
    /// Median.
    pub p50_us: f64,
    /// 90th percentile.
    pub p90_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// 99.9th percentile.
    pub p999_us: f64,
    /// Largest.
    pub max_us: f64,
}

/// Average time of one flowop kind (uperf's `-a` per-flowop statistics).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FlowOpStat {
    /// The flowop, as `write size=200` or `connect`.
    pub flowop: String,
    /// Times executed.
    pub count: u64,
    /// Mean duration in microseconds.
    pub mean_us: f64,
}

/// CPU seconds spent during a run, split as the studies split it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CpuSplit {
    /// The bench client and server processes (user + system): the studies' guest ("Emul").
    pub guest_s: f64,
    /// The sluice switch daemon on the path: the studies' hypervisor switch ("CP").
    pub switch_s: f64,
    /// All other busy time on the host (kernel softirq work of kernel paths lands here).
    pub other_s: f64,
}

impl CpuSplit {
    /// Guest + switch + other.
    pub fn total_s(&self) -> f64 {
        self.guest_s + self.switch_s + self.other_s
    }
}

/// Counts the server side reports for a run, to check against the client's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SideCounts {
    /// Transactions completed (iterations of the mirrored transactions).
    pub transactions: u64,
    /// Payload bytes written.
    pub bytes_sent: u64,
    /// Payload bytes read.
    pub bytes_received: u64,
    /// Connections opened (client `connect`) or accepted (client `accept`), or the
    /// server's mirror of those.
    pub connections: u64,
}

/// Partition-aggregate query completion times, in microseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Completion {
    /// Queries completed.
    pub queries: u64,
    /// Mean completion time.
    pub mean_us: f64,
    /// Median.
    pub p50_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
}

/// One run of one profile at one connection count.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RunResult {
    /// Profile name.
    pub profile: String,
    /// Concurrent connections (threads of the profile's groups, summed).
    pub conns: u32,
    /// Wall-clock seconds from the common start of all client threads to the last one
    /// finishing (connects and the drain of server-driven timed loops included, so that
    /// rates and counts describe the same transactions).
    pub duration_s: f64,
    /// The client's counts.
    pub client: SideCounts,
    /// The server's counts for the same run.
    pub server: SideCounts,
    /// Per-transaction latency of the timed transactions.
    pub latency: Latency,
    /// Per-flowop averages (filled with `-a`).
    pub flowops: Vec<FlowOpStat>,
    /// CPU over the same interval as `duration_s`.
    pub cpu: CpuSplit,
    /// Partition-aggregate completion times, for `pa`.
    pub completion: Option<Completion>,
}

impl RunResult {
    /// Transactions per second (the studies' ETR).
    pub fn tps(&self) -> f64 {
        per_s(self.client.transactions as f64, self.duration_s)
    }

    /// Payload megabytes (1e6) per second, both directions.
    pub fn mb_per_s(&self) -> f64 {
        per_s((self.client.bytes_sent + self.client.bytes_received) as f64 / 1e6, self.duration_s)
    }

    /// Payload gigabits per second, both directions.
    pub fn gbit_per_s(&self) -> f64 {
        self.mb_per_s() * 8.0 / 1000.0
    }

    /// CPU microseconds per transaction: (guest, switch, other, total).
    pub fn cpu_us_per_transaction(&self) -> [f64; 4] {
        let t = self.client.transactions as f64;
        let c = &self.cpu;
        [c.guest_s, c.switch_s, c.other_s, c.total_s()].map(|s| if t > 0.0 { s * 1e6 / t } else { 0.0 })
    }

    /// CPU milliseconds per megabyte: (guest, switch, other, total).
    pub fn cpu_ms_per_mb(&self) -> [f64; 4] {
        let mb = (self.client.bytes_sent + self.client.bytes_received) as f64 / 1e6;
        let c = &self.cpu;
        [c.guest_s, c.switch_s, c.other_s, c.total_s()].map(|s| if mb > 0.0 { s * 1e3 / mb } else { 0.0 })
    }
}

fn per_s(x: f64, secs: f64) -> f64 {
    if secs > 0.0 { x / secs } else { 0.0 }
}

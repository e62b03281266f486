//! `rate_out` on the kernel datapath: a TBF root qdisc on a guest's host-side veth, which
//! the executor's paced outputs leave through (`OUT_EGRESS`; `bpf_redirect_peer` passes
//! no qdisc). A shaper, not a policer: a local sender's socket stays charged while its
//! frames wait in the queue, so TCP is held back rather than cut.
//!
//! The daemon speaks no rtnetlink (its devices are made with ioctls and sysfs), so the
//! qdisc is the `tc` program's: `tc qdisc replace … root tbf`, `tc qdisc del … root`, and
//! `tc -s -j qdisc show` for the queue's drops, which count as the port's transmitted
//! frames dropped `rate_limit`. `sch_fq` with departure-time stamps would be lockless and
//! fair between flows, but kernels without it (this suite's) exist; TBF is everywhere.

use std::process::{Command, Stdio};

use sluice_sys::error::Failure;

use crate::error::Result;

/// The most a TBF may queue: 20 ms of the rate, at least 4 MiB (a local TCP sender's
/// small queues keep its backlog far below; the bound is for senders without them).
fn limit_bytes(rate_bps: u64) -> u64 {
    (rate_bps / 8 / 50).max(4 << 20)
}

fn tc(args: &[&str]) -> Result<String> {
    let out = Command::new("tc").args(args).stdin(Stdio::null()).output().map_err(|e| {
        Failure::msg(format!("cannot run `tc` ({e}): install iproute2, which rate_out needs on the kernel datapath"))
    })?;
    if !out.status.success() {
        sluice_sys::bail!("`tc {}` failed: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Shapes what leaves device `ifname` to `rate_bps` bits a second with a bucket of
/// `burst` bytes (replacing any root qdisc).
pub fn install(ifname: &str, rate_bps: u64, burst: u64) -> Result<()> {
    let (rate, burst, limit) = (format!("{rate_bps}bit"), burst.to_string(), limit_bytes(rate_bps).to_string());
    tc(&["qdisc", "replace", "dev", ifname, "root", "tbf", "rate", &rate, "burst", &burst, "limit", &limit]).map(drop)
}

/// Removes the shaper of `ifname` (the device's default qdisc comes back); a device that
/// is gone has none.
pub fn remove(ifname: &str) {
    let _ = tc(&["qdisc", "del", "dev", ifname, "root"]);
}

/// The frames the shaper of `ifname` dropped since it was installed, if it is there.
pub fn drops(ifname: &str) -> Option<u64> {
    let out = tc(&["-s", "-j", "qdisc", "show", "dev", ifname, "root"]).ok()?;
    let v: serde_json::Value = serde_json::from_str(&out).ok()?;
    v.as_array()?.iter().find(|q| q["kind"] == "tbf")?["drops"].as_u64()
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_queue_holds_20_ms_of_the_rate_and_at_least_4_mib() {
        assert_eq!(super::limit_bytes(10_000_000), 4 << 20);
        assert_eq!(super::limit_bytes(10_000_000_000), 25_000_000);
    }
}

//! A cell on a VM path (`vm-sluice`, `vm-bridge`): iperf3 or ping from the first VM to the
//! second, run through their consoles; the guest column is the two QEMUs' CPU.

use std::time::Duration;

use sluice_bench::result::RunResult;
use sluice_lab::compared::Topology;
use sluice_lab::vm::Console;
use sluice_sys::bail;
use sluice_sys::error::Context;

use super::spec::{Tool, Workload};
use crate::error::Result;
use crate::record::{CellKey, Options};

/// Echo requests a second of a `ping` cell.
pub const PING_PER_S: u32 = 50;

/// Runs `w` (iperf3 or ping) from the topology's first VM to its second for the cell.
pub fn run(topo: &Topology, w: &Workload, cell: &CellKey, o: &Options) -> Result<RunResult> {
    let [client, server] = &topo.vms[..] else { bail!("{}: a VM path has two VMs", topo.path) };
    let host = topo.server_addr(cell.family);
    match w.tool {
        Some(Tool::Iperf3) => {}
        Some(Tool::Ping) => {
            let pids = [client.pid, server.pid];
            let cpu0 = sluice_bench::cpu::sample(&pids, topo.switch_pid).context("reading CPU times")?;
            let n = o.duration_s * PING_PER_S;
            let (_, out) = Console::connect(&client.serial, Duration::from_secs(5))?
                .run(&format!("ping -c {n} -i 0.02 -q {host}"), Duration::from_secs(u64::from(o.duration_s) + 60))?;
            let cpu1 = sluice_bench::cpu::sample(&pids, topo.switch_pid).context("reading CPU times")?;
            let mut r = ping_result(&String::from_utf8_lossy(&out))?;
            r.profile = w.name.clone();
            r.cpu = sluice_bench::cpu::split(&cpu0, &cpu1);
            return Ok(r);
        }
        _ => bail!("{}: only iperf3 and ping run inside the VMs, not {:?}", topo.path, w.name),
    }
    let mut s = Console::connect(&server.serial, Duration::from_secs(5))?;
    let (rc, out) = s.run("iperf3 -s -1 -D", Duration::from_secs(30))?;
    if rc != 0 {
        bail!("starting iperf3 -s in the server VM: {}", String::from_utf8_lossy(&out).trim());
    }
    // Listening once its port shows (busybox netstat), within 5 s.
    let (rc, _) = s.run(
        "i=0; until netstat -ltn | grep -q ':5201 '; do i=$((i+1)); [ $i -gt 50 ] && exit 1; sleep 0.1; done",
        Duration::from_secs(10),
    )?;
    if rc != 0 {
        bail!("iperf3 -s in the server VM did not listen within 5 s");
    }
    let pids = [client.pid, server.pid];
    let cpu0 = sluice_bench::cpu::sample(&pids, topo.switch_pid).context("reading CPU times")?;
    let cmd = format!("iperf3 -c {host} -t {} -P {} -J", o.duration_s, cell.conns);
    let (rc, out) = Console::connect(&client.serial, Duration::from_secs(5))?
        .run(&cmd, Duration::from_secs(u64::from(o.duration_s) + 60))?;
    let cpu1 = sluice_bench::cpu::sample(&pids, topo.switch_pid).context("reading CPU times")?;
    let text = String::from_utf8_lossy(&out).into_owned();
    if rc != 0 {
        bail!("iperf3 in the client VM failed ({rc}): {}", text.trim());
    }
    let json = text.find('{').map(|i| &text[i..]).context("iperf3 printed no JSON")?;
    let mut r = super::tools::iperf3_result(json)?;
    r.profile = w.name.clone();
    r.conns = cell.conns;
    r.cpu = sluice_bench::cpu::split(&cpu0, &cpu1);
    Ok(r)
}

/// Bytes of an echo request's payload (ping's default), each way.
const PING_BYTES: u64 = 56;

/// Reads busybox ping's summary (`N packets transmitted, M packets received`,
/// `round-trip min/avg/max = A/B/C ms`): M round trips of the mean time each, so its rate
/// is one over the mean round trip, as sockperf's ping-pong.
pub fn ping_result(text: &str) -> Result<RunResult> {
    let received: u64 = text
        .lines()
        .find_map(|l| l.split(", ").find_map(|p| p.strip_suffix(" packets received")))
        .and_then(|n| n.trim().parse().ok())
        .with_context(|| format!("ping printed no count of replies: {}", text.trim()))?;
    if received == 0 {
        bail!("ping had no reply: {}", text.trim());
    }
    let avg_ms: f64 = text
        .lines()
        .find_map(|l| l.split_once("min/avg/max = "))
        .and_then(|(_, v)| v.split('/').nth(1))
        .and_then(|v| v.trim().parse().ok())
        .with_context(|| format!("ping printed no round-trip times: {}", text.trim()))?;
    let mut r = RunResult { conns: 1, ..RunResult::default() };
    r.client.transactions = received;
    r.client.bytes_sent = received * PING_BYTES;
    r.client.bytes_received = received * PING_BYTES;
    r.server = r.client;
    r.latency.mean_us = avg_ms * 1000.0;
    r.duration_s = received as f64 * avg_ms / 1000.0;
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busybox_pings_summary_reads_as_round_trips() {
        let out = "PING 10.77.0.3 (10.77.0.3): 56 data bytes\n\n--- 10.77.0.3 ping statistics ---\n100 packets transmitted, 99 packets received, 1% packet loss\nround-trip min/avg/max = 0.412/0.800/2.310 ms\n";
        let r = ping_result(out).unwrap();
        assert_eq!(r.client.transactions, 99);
        assert_eq!(r.latency.mean_us, 800.0);
        assert!((r.tps() - 1250.0).abs() < 1e-6, "{}", r.tps());
        assert!(ping_result("100 packets transmitted, 0 packets received, 100% packet loss").is_err());
    }
}

//! A cell on a VM path (`vm-sluice`, `vm-bridge`): iperf3 from the first VM to the second,
//! run through their consoles; the guest column is the two QEMUs' CPU.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use sluice_bench::result::RunResult;
use sluice_lab::compared::Topology;
use sluice_lab::vm::Console;

use super::run::{CellKey, Options};
use super::spec::{Tool, Workload};

/// Runs `w` (iperf3 only) from the topology's first VM to its second for the cell.
pub fn run(topo: &Topology, w: &Workload, cell: &CellKey, o: &Options) -> Result<RunResult> {
    if w.tool != Some(Tool::Iperf3) {
        bail!("{}: only iperf3 runs inside the VMs, not {:?}", topo.path, w.name);
    }
    let [client, server] = &topo.vms[..] else { bail!("{}: a VM path has two VMs", topo.path) };
    let host = topo.server_addr(cell.family);
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

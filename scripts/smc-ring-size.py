#!/usr/bin/env python3
"""The shared-memory fast path's stream rate against its ring size (docs/smc.md), as root.

  scripts/smc-ring-size.py [--sluice PATH] [--sizes 64k,256k,1m,4m,grow] [--reps 5]
                           [--duration 5] [--port 5299] [--placement]

For each ring size, iperf3 (one stream, loopback, one namespace) with both ends under
`sluice smc run -r SIZE -t SIZE` (fixed rings; `grow` is the default, rings that start
small and grow to the TCP maxima; `grow:SIZE` grows to SIZE at most), and plain TCP loopback in the same run: sizes and TCP
interleaved, REPS repetitions of DURATION seconds each. Prints a Markdown table: the
median rate with its (min–max), the ratio to TCP in the same repetition, the CPU time of
both iperf3 processes per GB, and the host's CPU steal and other processes' CPU over
the run (/proc/stat; other processes' CPU is the host's busy time less the iperf3
processes'), so that a noisy run is seen as one: QUIET at most 2% steal and 10% others,
as the study runner judges.

--placement runs every case twice, with both iperf3 processes pinned (taskset) to CPU 0,
then to CPUs 0 and 1 — whether writer and reader share a CPU, which the scheduler
otherwise decides run by run; each case's ratio is to TCP placed alike. Needs two CPUs.

Every wait is bounded; the servers are stopped at the end, whatever happens.
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("--sluice", default="sluice")
ap.add_argument("--sizes", default="64k,256k,1m,4m,grow")
ap.add_argument("--reps", type=int, default=5)
ap.add_argument("--duration", type=int, default=5)
ap.add_argument("--port", type=int, default=5299, help="iperf3's port (outside ip_local_port_range)")
ap.add_argument("--placement", action="store_true", help="each case with both ends on one CPU, then on two")
a = ap.parse_args()
# Where the server and the client run: (None, None) leaves it to the scheduler.
PLACEMENTS = {"one CPU": ("0", "0"), "two CPUs": ("0", "1")} if a.placement else {"": (None, None)}
if a.placement and (os.cpu_count() or 1) < 2:
    raise SystemExit("--placement needs two CPUs")


def cpu_times():
    """(steal, busy, total) jiffies of the whole host."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + v[4]
    return v[7], sum(v) - idle - v[7], sum(v)


def launcher(size, cpu=None):
    pin = ["taskset", "-c", cpu] if cpu else []
    if size == "tcp":
        return pin
    if size == "grow":
        opts = []
    elif size.startswith("grow:"):
        opts = ["--max-buffer", size[len("grow:"):]]
    else:
        opts = ["-r", size, "-t", size]
    return [*pin, a.sluice, "smc", "run", *opts, "--"]


def one(size, placement):
    """One iperf3 run: (GB/s, CPU seconds of both processes per GB)."""
    server_cpu, client_cpu = PLACEMENTS[placement]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    srv = subprocess.Popen(
        launcher(size, server_cpu) + ["iperf3", "-s", "-1", "-B", "127.0.0.1", "-p", str(a.port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.time() + 10
        while b":%d " % a.port not in subprocess.run(["ss", "-ltnH"], capture_output=True).stdout:
            if time.time() > deadline:
                raise SystemExit("iperf3 -s did not listen within 10 s")
            time.sleep(0.05)
        out = subprocess.run(
            launcher(size, client_cpu) + ["iperf3", "-c", "127.0.0.1", "-p", str(a.port), "-t", str(a.duration), "-J"],
            capture_output=True,
            timeout=a.duration + 30,
        )
        if out.returncode != 0:
            raise SystemExit(f"iperf3 ({size}) failed: {out.stderr.decode().strip()}")
        bps = json.loads(out.stdout)["end"]["sum_received"]["bits_per_second"]
        srv.wait(timeout=10)
    finally:
        if srv.poll() is None:
            srv.kill()
            srv.wait()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    gbs = bps / 8e9
    return gbs, cpu / (gbs * a.duration)


sizes = ["tcp"] + a.sizes.split(",")
cases = [(s, p) for p in PLACEMENTS for s in sizes]
r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
rates = {c: [] for c in cases}
cpus = {c: [] for c in cases}
s0, b0, t0 = cpu_times()
for rep in range(a.reps):
    # Interleaved, in a different order each repetition.
    order = cases[rep % len(cases):] + cases[: rep % len(cases)]
    for c in order:
        g, per_gb = one(*c)
        rates[c].append(g)
        cpus[c].append(per_gb)
        print(f"rep {rep + 1}/{a.reps} {c[0]}{', ' + c[1] if c[1] else ''}: {g:.2f} GB/s", file=sys.stderr,
              flush=True)
s1, b1, t1 = cpu_times()
r1 = resource.getrusage(resource.RUSAGE_CHILDREN)


def med(v):
    return f"{statistics.median(v):.2f} ({min(v):.2f}–{max(v):.2f})"


print(f"iperf3, one stream, loopback, {a.reps} interleaved repetitions of {a.duration} s")
print()
print("| rings | ends on | GB/s | / TCP | CPU s per GB (both ends) |" if a.placement else
      "| rings | GB/s | / TCP | CPU s per GB (both ends) |")
print("|---|---|--:|--:|--:|" if a.placement else "|---|--:|--:|--:|")
for s, p in cases:
    ratios = [x / y for x, y in zip(rates[s, p], rates["tcp", p])]
    where = f" {p} |" if a.placement else ""
    print(f"| {'TCP loopback' if s == 'tcp' else s} |{where} {med(rates[s, p])} | {med(ratios)} | {med(cpus[s, p])} |")
print()
steal = 100 * (s1 - s0) / max(1, t1 - t0)
hz = os.sysconf("SC_CLK_TCK")
ours = (r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime) * hz
others = 100 * max(0, (b1 - b0) - ours) / max(1, t1 - t0)
verdict = "QUIET" if steal <= 2 and others <= 10 else "NOISY: not to be trusted"
print(f"Host CPU steal over the run {steal:.1f}%, other processes' CPU {others:.1f}% of the machine: {verdict}.")
print(f"Reproduce: `scripts/smc-ring-size.py --sizes {a.sizes} --reps {a.reps} --duration {a.duration}"
      f"{' --placement' if a.placement else ''}`")

#!/usr/bin/env python3
"""One iperf3 stream with both ends on one CPU, and on two, on shared memory and on TCP.

  scripts/smc-placement.py [--reps 3] [--duration 4] [--sluice PATH]

Why a stream study's repetitions are now and then half as fast as the others: the
scheduler sometimes leaves the writer and the reader on one CPU. Each repetition runs, in
this order, `sluice smc run -- iperf3` with server and client pinned (taskset) to CPU 0
both, then to CPUs 0 and 1, then the same on plain TCP loopback; prints each rate (GB/s,
the receiver's) and the medians. As root (`sluice smc run` sets the fast path up as root;
another user's programs could quietly run on TCP); needs iperf3, taskset, ss and two CPUs.
About 20 s per repetition. Every wait is bounded; the servers end with their one client.
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("--reps", type=int, default=3, help="repetitions (default 3)")
ap.add_argument("--duration", type=int, default=4, help="seconds of each stream (default 4)")
ap.add_argument("--sluice", default=os.path.join(REPO, "target", "release", "sluice"), help="the sluice binary")
a = ap.parse_args()
if os.geteuid() != 0:
    sys.exit("smc-placement: run it as root (as another user the smc cases might run on plain TCP)")
if os.cpu_count() < 2:
    sys.exit("smc-placement: needs two CPUs")
if not os.access(a.sluice, os.X_OK):
    sys.exit(f"smc-placement: no sluice at {a.sluice} (cargo build --release -p sluice, or --sluice PATH)")


def free_port():
    """A free port below the ephemeral range, so no client's port collides with it."""
    low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
    for port in range(low - 2000, low):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
                return port
            except OSError:
                continue
    sys.exit("smc-placement: no free port below ip_local_port_range")


def listening(port):
    """Whether something listens on PORT — read from ss, since a probe connection would be
    iperf3's one client."""
    out = subprocess.run(["ss", "-Hltn", f"sport = :{port}"], capture_output=True, text=True, timeout=10).stdout
    return bool(out.strip())


def stream(path, server_cpu, client_cpu):
    port = free_port()
    pre = [a.sluice, "smc", "run", "--"] if path == "smc" else []
    server = subprocess.Popen(["taskset", "-c", server_cpu, *pre, "iperf3", "-s", "-1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while not listening(port):
            if time.monotonic() > deadline:
                sys.exit("smc-placement: iperf3's server did not listen within 10 s")
            time.sleep(0.05)
        out = subprocess.run(["taskset", "-c", client_cpu, *pre, "iperf3", "-c", "127.0.0.1", "-p", str(port),
                              "-t", str(a.duration), "-J"], capture_output=True, text=True,
                             timeout=a.duration + 30)
        try:
            result = json.loads(out.stdout)
        except ValueError:
            result = {}
        if out.returncode != 0 or "error" in result or "sum_received" not in result.get("end", {}):
            sys.exit(f"smc-placement: iperf3's client failed on {path} (exit {out.returncode}): "
                     f"{result.get('error') or out.stderr.strip()[-400:]}")
        if path == "smc" and "plain TCP" in out.stderr:
            sys.exit(f"smc-placement: the launcher ran iperf3 on plain TCP: {out.stderr.strip()[-400:]}")
        rate = result["end"]["sum_received"]["bits_per_second"] / 8e9
    finally:
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    return rate


CASES = [("smc", "0", "0", "one CPU"), ("smc", "0", "1", "two CPUs"), ("tcp", "0", "0", "one CPU"),
         ("tcp", "0", "1", "two CPUs")]
rates = {c: [] for c in CASES}
for rep in range(1, a.reps + 1):
    for c in CASES:
        r = stream(*c[:3])
        rates[c].append(r)
        print(f"rep {rep}: {c[0]}, {c[3]}: {r:.1f} GB/s", flush=True)
print("\n| path | ends on | GB/s, median (min–max) |\n|---|---|--:|")
for c in CASES:
    v = rates[c]
    print(f"| {c[0]} | {c[3]} | {statistics.median(v):.1f} ({min(v):.1f}–{max(v):.1f}) |")

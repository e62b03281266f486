#!/usr/bin/env python3
"""A peer that announces a great many EVPN routes (docs/evpn.md, "Bad input"), as root.

  scripts/evpn-route-flood.py [--sluice PATH] [--routes 100000] [--limit 1200] [--name erf]
                              [--gobgpd PATH]

Makes `sluice lab up --hosts 2 --evpn --peer-frr` (h1 a sluice host with its gobgpd, h2 a
Linux host with a kernel vxlan device, a bridge and FRR, FRR's bgpd as the route
reflector), then adds ROUTES dynamic entries to h2's bridge on a guest's port at once
(`bridge -batch`): zebra takes them as local stations and FRR announces a MAC/IP route for
each, through the reflector to h1. It measures, printing a Markdown report:

- how many routes h1's agent has received, installed and keeps waiting, every 5 s, until
  it has all ROUTES or LIMIT seconds pass;
- that h1's guest still reaches h2's guest while they arrive (a ping every 5 s);
- the resident memory and CPU time of h1's switch daemon, its gobgpd and FRR's daemons;
- the host's CPU steal over the run (/proc/stat).

GOBGPD names the speaker binary h1's switch runs (found on PATH as `gobgpd` unless given):
the lab's hosts run whichever `gobgpd` comes first on PATH.

The lab is taken down at the end, whatever happens (unless KEEP_LAB=1, to look into it).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("--sluice", default="sluice")
ap.add_argument("--routes", type=int, default=100_000)
ap.add_argument("--limit", type=float, default=1200.0, help="seconds to wait for every route (default 1200)")
ap.add_argument("--name", default="erf")
ap.add_argument("--gobgpd", help="the gobgpd binary h1 runs (default: the first on PATH)")
a = ap.parse_args()
S, N, LAB = a.sluice, a.routes, a.name
env = dict(os.environ)
# (A directory of our own for the speaker's name on PATH, and the batch file; both go at
# the end.)
scratch = tempfile.mkdtemp(prefix="sluice-erf-")
if a.gobgpd:
    os.symlink(os.path.abspath(a.gobgpd), os.path.join(scratch, "gobgpd"))
    env["PATH"] = scratch + ":" + env.get("PATH", "")


def run(*args, check=True, timeout=300):
    p = subprocess.run(args, capture_output=True, text=True, env=env, timeout=timeout)
    if check and p.returncode != 0:
        sys.exit(f"`{' '.join(args)}` failed: {p.stderr.strip()}")
    return p.stdout


def steal():
    f = open("/proc/stat").readline().split()
    v = [int(x) for x in f[1:]]
    return v[7], sum(v)


def proc(pid):
    """(RSS in MiB, CPU seconds) of process `pid`."""
    with open(f"/proc/{pid}/status") as f:
        rss = next(int(l.split()[1]) for l in f if l.startswith("VmRSS:"))
    with open(f"/proc/{pid}/stat") as f:
        t = f.read().rsplit(")", 1)[1].split()
    return rss / 1024, (int(t[11]) + int(t[12])) / os.sysconf("SC_CLK_TCK")


def counters():
    return json.loads(run(S, "evpn", "show", "--switch", f"{LAB}h1", "--json"))["counters"]


def reaches():
    p = subprocess.run([S, "lab", "exec", "--name", LAB, "h1g1", "--", "ping", "-c", "1", "-W", "2", "10.77.0.3"],
                       capture_output=True, env=env, timeout=30)
    return p.returncode == 0


s0 = steal()
try:
    print(f"lab up --hosts 2 --evpn --peer-frr ({LAB}) ...", file=sys.stderr)
    run(S, "lab", "up", "--name", LAB, "--hosts", "2", "--evpn", "--peer-frr")
    t = time.monotonic()
    while not reaches():
        if time.monotonic() - t > 60:
            sys.exit("h1g1 does not reach h2g1 (10.77.0.3) within 60 s of `lab up`")
        time.sleep(1)
    ev = json.loads(run(S, "evpn", "show", "--switch", f"{LAB}h1", "--json"))
    gobgpd = [ev["speaker"]["pid"]]
    summary = json.loads(run(S, "switch", "list", "--json"))
    daemon = [next(s["switch"]["pid"] for s in summary if s["switch"]["name"] == f"{LAB}h1")]
    batch = os.path.join(scratch, "fdb.batch")
    with open(batch, "w") as f:
        for i in range(N):
            b = i.to_bytes(4, "big")
            f.write("fdb add 02:66:%02x:%02x:%02x:%02x dev p1 master dynamic\n" % tuple(b))
    print(f"adding {N:,} stations to h2's bridge ...", file=sys.stderr)
    start = time.monotonic()
    run("ip", "netns", "exec", f"sluice-{LAB}-h2", "bridge", "-batch", batch)
    added = time.monotonic() - start
    rows, lost = [], 0
    while True:
        time.sleep(5)
        el = time.monotonic() - start
        c = counters()
        ok = reaches()
        lost += not ok
        g = proc(gobgpd[0]) if gobgpd else (0, 0)
        rows.append((el, c.get("received", 0), c.get("installed", 0), c.get("waiting", 0), ok, g[0], g[1]))
        print(f"{el:6.0f} s  received {rows[-1][1]:>7,}  installed {rows[-1][2]:>5,}  waiting {rows[-1][3]:>7,}"
              f"  ping {'ok' if ok else 'LOST'}  gobgpd {g[0]:,.0f} MiB {g[1]:,.0f} s CPU", file=sys.stderr)
        if c.get("received", 0) >= N or el > a.limit:
            break
    c = counters()
    s1 = steal()
    st = 100.0 * (s1[0] - s0[0]) / max(1, s1[1] - s0[1])
    full = rows[-1][1] >= N
    print(f"# A peer announcing {N:,} EVPN routes\n")
    print(f"- Stations added to the FRR host's bridge in {added:.1f} s (`bridge -batch`).")
    if full:
        print(f"- h1's agent had received all {N:,} routes after **{rows[-1][0]:.0f} s** (polled every 5 s).")
    else:
        print(f"- After {rows[-1][0]:.0f} s (the limit) h1's agent had received **{rows[-1][1]:,}** of {N:,}.")
    bound = " (its bound)" if c.get("waiting", 0) else ""
    print(f"- h1 installed {c.get('installed', 0):,}{bound}, kept {c.get('waiting', 0):,} waiting, "
          f"counted {c.get('over_limit', 0):,} over the limit.")
    print(f"- h1g1 → h2g1 pings lost while the routes arrived: {lost} of {len(rows)}.")
    for name, ps in [("h1's gobgpd", gobgpd), ("h1's switch daemon", daemon)]:
        if ps:
            r, cpu = proc(ps[0])
            print(f"- {name}: {r:,.0f} MiB resident, {cpu:,.0f} s of CPU at the end.")
    print(f"- CPU steal over the run: {st:.1f} %.\n")
    print("| s | received | installed | waiting | ping | gobgpd MiB | gobgpd CPU s |")
    print("|--:|--:|--:|--:|---|--:|--:|")
    for r in rows:
        print(f"| {r[0]:.0f} | {r[1]:,} | {r[2]:,} | {r[3]:,} | {'ok' if r[4] else 'lost'} | {r[5]:,.0f} | {r[6]:,.0f} |")
finally:
    if os.environ.get("KEEP_LAB") != "1":
        subprocess.run([S, "lab", "down", "--name", LAB], capture_output=True, env=env, timeout=300)
    shutil.rmtree(scratch, ignore_errors=True)

#!/usr/bin/env python3
"""EVPN convergence on a lab of three sluice hosts (docs/evpn.md), as root.

  scripts/evpn-convergence.py [--sluice PATH] [--stations 1000] [--repeat 20] [--name evc]
                              [--datapath kernel|user]

Makes `sluice lab up --hosts 3 --evpn --guests 1 --datapath D` (each host's switch with its
gobgpd, FRR's bgpd as the route reflector; the kernel datapath unless told), then measures,
printing a Markdown report:

- the time from `lab up` to every session established and every host in every other's
  flood list;
- each host's guest sending one frame from each of STATIONS new MAC addresses at once
  (3 x STATIONS stations): the time until every host has the other hosts' stations
  installed (origin evpn), read by polling `sluice fib show` (every 20 ms: the resolution);
- a new station: its first frame on h1 until h2 and h3 have it (REPEAT times: p50, max);
- a removed station (`sluice fib del` on h1) until h2 and h3 no longer have it;
- after convergence, the frames h3's tunnel receives while h1 and h2's guests exchange
  100 pings (known unicast flooded, if any);
- the resident memory of each switch daemon and its gobgpd before and after the 3 x STATIONS
  stations (each host: STATIONS local, 2 x STATIONS remote), per 1,000 of them;
- the host's CPU steal over the run (/proc/stat).

The lab is taken down at the end, whatever happens (unless KEEP_LAB=1, to look into it).
"""
import argparse
import json
import os
import subprocess
import sys
import time

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("--sluice", default="sluice")
ap.add_argument("--stations", type=int, default=1000)
ap.add_argument("--repeat", type=int, default=20)
ap.add_argument("--name", default="evc")
ap.add_argument("--datapath", choices=["kernel", "user"], default="kernel")
a = ap.parse_args()
S, N, LAB = a.sluice, a.stations, a.name
POLL = 0.02


def run(*args, check=True):
    p = subprocess.run(args, capture_output=True, text=True)
    if check and p.returncode != 0:
        sys.exit(f"`{' '.join(args)}` failed: {p.stderr.strip()}")
    return p.stdout


def js(*args):
    return json.loads(run(S, *args, "--json"))


def sw(k):
    return f"{LAB}h{k}"


def steal():
    f = open("/proc/stat").readline().split()
    return int(f[8]), sum(int(x) for x in f[1:])


def rss_kb(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def evpn_macs(k):
    entries = js("fib", "show", "--switch", sw(k))["entries"]
    return {e["mac"] for e in entries if e.get("origin") == "evpn"}


def send_frames(ns, iface, macs):
    code = (
        "import socket,sys\n"
        "s=socket.socket(socket.AF_PACKET,socket.SOCK_RAW)\n"
        f"s.bind(({iface!r},0))\n"
        "for m in sys.argv[1:]:\n"
        "    src=bytes(int(x,16) for x in m.split(':'))\n"
        "    s.send(b'\\xff'*6+src+b'\\x88\\xb5'+b'evpn convergence'*3)\n"
    )
    return subprocess.Popen(["ip", "netns", "exec", ns, "python3", "-c", code, *macs])


def wait(cond, limit=120.0):
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit:
        if cond():
            return time.monotonic() - t0
        time.sleep(POLL)
    return None


def pct(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, int(round(p / 100 * (len(v) - 1))))]


def mac(k, i, tag=0):
    return f"02:{k:02x}:{tag:02x}:00:{i >> 8:02x}:{i & 255:02x}"


st0 = steal()
t0 = time.monotonic()
up = json.loads(run(S, "lab", "up", "--name", LAB, "--hosts", "3", "--evpn", "--guests", "1", "--datapath", a.datapath, "--json"))
try:
    guests = {g["guest"]: (g["netns"], g["tap"]) for g in up["guests"]}

    def ready():
        for k in (1, 2, 3):
            ev = js("evpn", "show", "--switch", sw(k))
            if not all(p["state"] == "established" for p in ev["peers"]) or not ev["peers"]:
                return False
            floods = {r["endpoint"] for r in ev["received"] if r["type"] == 3}
            if len(floods) < 2:
                return False
        return True

    t_ready = wait(ready, 120)
    if t_ready is None:
        sys.exit("the lab's sessions did not come up within 120 s")
    t_lab = time.monotonic() - t0
    pids = {}
    for k in (1, 2, 3):
        ev = js("evpn", "show", "--switch", sw(k))
        summary = js("switch", "list")
        sw_pid = next(s["switch"]["pid"] for s in summary if s["switch"]["name"] == sw(k))
        pids[k] = (sw_pid, ev["speaker"]["pid"])
    mem0 = {k: (rss_kb(a), rss_kb(b)) for k, (a, b) in pids.items()}

    # 3 x N stations at once. (The guests' interfaces get room for the whole burst: with
    # the default queue of 1,000 a burst can lose frames in the guest, and a station whose
    # only frame was lost never appears.)
    for ns, iface in guests.values():
        run("ip", "-n", ns, "link", "set", "dev", iface, "txqueuelen", str(max(1000, 4 * N)))
    want = {k: {mac(j, i) for j in (1, 2, 3) if j != k for i in range(N)} for k in (1, 2, 3)}
    t_burst = time.monotonic()
    procs = [send_frames(*guests[f"h{k}g1"], [mac(k, i) for i in range(N)]) for k in (1, 2, 3)]
    done = {}
    while len(done) < 3 and time.monotonic() - t_burst < 300:
        for k in (1, 2, 3):
            if k not in done and want[k] <= evpn_macs(k):
                done[k] = time.monotonic() - t_burst
        time.sleep(POLL)
    for p in procs:
        p.wait()
    if len(done) < 3:
        lost = {}
        for k in (1, 2, 3):
            st = js("stats", "--switch", sw(k))
            g = next(p for p in st["ports"] if p["name"] != "vx0")
            lost[k] = (g.get("device_drops") or {}).get("from_guest", 0)
        sys.exit(f"not every host converged within 300 s: {done}; frames lost before the switches: {lost}")
    mem1 = {k: (rss_kb(a), rss_kb(b)) for k, (a, b) in pids.items()}

    # One new station, then its removal, REPEAT times.
    new_t, gone_t = [], []
    for r in range(a.repeat):
        m = mac(1, r, tag=0xAA)
        t = time.monotonic()
        send_frames(*guests["h1g1"], [m]).wait()
        there = wait(lambda: all(m in evpn_macs(k) for k in (2, 3)), 30)
        new_t.append((time.monotonic() - t) if there is not None else float("inf"))
        t = time.monotonic()
        run(S, "fib", "del", m, "--switch", sw(1))
        gone = wait(lambda: all(m not in evpn_macs(k) for k in (2, 3)), 30)
        gone_t.append((time.monotonic() - t) if gone is not None else float("inf"))

    # Known unicast after convergence: what reaches h3's tunnel while h1 and h2 talk.
    def vx_rx(k):
        st = js("stats", "--switch", sw(k))
        return next(p for p in st["ports"] if p["name"] == "vx0")["counters"]["rx_frames"]

    # (One ping first: the guests' ARP entries are then in place, and an ARP request is a
    # broadcast, flooded by design.)
    run(S, "lab", "exec", "--name", LAB, "h1g1", "--", "ping", "-c", "1", "-W", "1", "10.77.0.2")
    before = vx_rx(3)
    run(S, "lab", "exec", "--name", LAB, "h1g1", "--", "ping", "-c", "100", "-i", "0.01", "-W", "1", "10.77.0.2")
    flooded = vx_rx(3) - before

    st1 = steal()
    steal_pct = 100.0 * (st1[0] - st0[0]) / max(1, st1[1] - st0[1])
    print(f"# EVPN convergence: 3 sluice hosts x {N} stations, {a.datapath} datapath\n")
    print(f"command: `scripts/evpn-convergence.py --stations {N} --repeat {a.repeat} --datapath {a.datapath}`; host CPU steal over the run {steal_pct:.1f} %\n")
    print("| measure | value |\n|---|---|")
    print(f"| `lab up` (making the lab included) to every session established and every flood list full | {t_lab:.1f} s |")
    for k in (1, 2, 3):
        print(f"| {3 * N} stations announced at once: h{k} has the other hosts' {2 * N} | {done[k]:.2f} s |")
    print(f"| a new station's first frame on h1 until h2 and h3 have it (n={a.repeat}) | p50 {pct(new_t, 50) * 1000:.0f} ms, max {max(new_t) * 1000:.0f} ms |")
    print(f"| a station removed on h1 until h2 and h3 no longer have it (n={a.repeat}) | p50 {pct(gone_t, 50) * 1000:.0f} ms, max {max(gone_t) * 1000:.0f} ms |")
    print(f"| frames h3's tunnel received during 100 pings between h1 and h2 (known unicast flooded) | {flooded} |")
    for k in (1, 2, 3):
        d_sw = (mem1[k][0] - mem0[k][0]) / (3 * N / 1000)
        d_bgp = (mem1[k][1] - mem0[k][1]) / (3 * N / 1000)
        print(f"| h{k} memory per 1,000 stations (its {N} local and {2 * N} remote): switch daemon / gobgpd | {d_sw:.0f} KiB / {d_bgp:.0f} KiB (RSS after: {mem1[k][0] // 1024} / {mem1[k][1] // 1024} MiB) |")
finally:
    if not os.environ.get("KEEP_LAB"):
        subprocess.run([S, "lab", "down", "--name", LAB], capture_output=True)

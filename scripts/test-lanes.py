#!/usr/bin/env python3
"""Runs the workspace's test binaries two at a time, as scripts/test.sh does.

  scripts/test-lanes.py [--lanes 2] [--bound SECONDS] [-- TEST ARGS...]

Builds every test binary (`cargo test --locked --workspace --release --no-run`), then runs
them the way `cargo test` would — each in its package's directory, with cargo's run-time
variables — but LANES binaries at a time instead of one, the longest first. Most of the
suite's time is spent waiting on things outside the test process (BGP sessions, guests
booting, links coming up), so two binaries side by side finish sooner on two cores.

Some binaries run alone, nothing beside them (SOLO): the ones whose programs keep both CPUs
busy (QEMU guests under TCG, the studies and benchmarks, load on the shared-memory path),
and the ones whose behaviour depends on a peer being scheduled within milliseconds (rate
limits, a late doorbell byte). Then the documentation tests, with cargo.

Each binary's output is printed whole when it ends (never interleaved), with its time.
A binary that runs longer than --bound (default 1,200 s) is killed and counts as failed.
Every binary runs whatever the others did; the exit status is 0 only if all passed.
TEST ARGS go to every binary (default: --include-ignored).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Seconds each took in a CI run (package:target); the longest start first. A binary not
# listed is placed as if it took 10 s.
SECONDS = {
    "sluice:evpn": 126, "sluice:vxlan": 92, "sluice:rate": 82, "sluice:control": 61, "sluice:vm": 60,
    "sluice:snooping": 50, "sluice:study": 48, "sluice:smc": 45, "sluice:uplink": 43, "sluice:traffic": 41,
    "sluice:hostile": 38, "sluice:acl": 34, "sluice:kernel": 34, "sluice:observe": 32, "sluice:vlan": 29,
    "sluice-ebpf:differential": 27, "sluice:bench": 24, "sluice:smc_trust": 24, "sluice:layer3": 21,
    "sluice:install": 17, "sluice-ebpf:exec": 16, "sluice:libvirt": 15, "sluice:l2safety": 12,
    "sluice:gateway": 11, "sluice:smc_load": 9, "sluice-cni:cni": 9,
}
SOLO = {
    "sluice:vm", "sluice:libvirt", "sluice:study", "sluice:bench", "sluice:bench_lab", "sluice:rate",
    "sluice:smc", "sluice:smc_trust", "sluice:smc_load",
}

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("--lanes", type=int, default=2, help="binaries at a time (default 2)")
ap.add_argument("--bound", type=float, default=1200, help="seconds one binary may run (default 1200)")
ap.add_argument("test_args", nargs="*", help="arguments for every test binary (after --)")
a = ap.parse_args()
test_args = a.test_args or ["--include-ignored"]
if a.lanes < 1:
    sys.exit("--lanes must be at least 1")

started = time.monotonic()


def say(text):
    print(text, flush=True)


def binaries():
    """(name, executable, package directory, package name, version) of every test binary."""
    cmd = ["cargo", "test", "--locked", "--workspace", "--release", "--no-run", "--message-format=json-render-diagnostics"]
    p = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, text=True)
    found = []
    for line in p.stdout:
        try:
            m = json.loads(line)
        except ValueError:
            continue
        if m.get("reason") != "compiler-artifact" or not m.get("executable") or not m["profile"]["test"]:
            continue
        pkg_dir = os.path.dirname(m["manifest_path"])
        # package_id: "path+file:///…/crates/x#name@0.1.0" (or "…#0.1.0" when the directory
        # is the package's name); the name and version cargo would export.
        tail = m["package_id"].rsplit("#", 1)[-1]
        pkg, _, version = tail.rpartition("@")
        pkg = pkg or os.path.basename(pkg_dir)
        found.append((f"{pkg}:{m['target']['name']}", m["executable"], pkg_dir, pkg, version))
    if p.wait() != 0:
        sys.exit(f"test-lanes: `{' '.join(cmd)}` failed (exit {p.returncode})")
    return found


def run(entry, results):
    name, exe, pkg_dir, pkg, version = entry
    env = dict(os.environ, CARGO_MANIFEST_DIR=pkg_dir, CARGO_PKG_NAME=pkg, CARGO_PKG_VERSION=version)
    t0 = time.monotonic()
    with tempfile.TemporaryFile(mode="w+") as out:
        try:
            p = subprocess.Popen([exe, *test_args], cwd=pkg_dir, env=env, stdout=out, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL)
        except OSError as e:
            p, code, why = None, -1, f"could not start it: {e}"
        if p:
            try:
                code = p.wait(timeout=a.bound)
                why = "" if code == 0 else f"exit {code}"
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
                code, why = -1, f"killed: still running after {a.bound:.0f} s"
        out.seek(0)
        text = out.read()
    took = time.monotonic() - t0
    with lock:
        say(f"\n── {name} ({os.path.relpath(exe, REPO)}): {'passed' if code == 0 else 'FAILED, ' + why} "
            f"in {took:.0f} s (at {time.monotonic() - started:.0f} s)")
        say(text.rstrip())
        results[name] = code == 0


lock = threading.Lock()
found = binaries()
if not found:
    sys.exit("test-lanes: cargo built no test binaries")
say(f"test-lanes: {len(found)} test binaries, {a.lanes} at a time (alone: the ones that load both CPUs "
    f"or depend on being scheduled promptly)")
found.sort(key=lambda e: -SECONDS.get(e[0], 10))
shared = [e for e in found if e[0] not in SOLO]
alone = [e for e in found if e[0] in SOLO]
results = {}

queue = list(shared)


def lane():
    while True:
        with lock:
            if not queue:
                return
            entry = queue.pop(0)
        run(entry, results)


threads = [threading.Thread(target=lane) for _ in range(a.lanes)]
for t in threads:
    t.start()
for t in threads:
    t.join()
for entry in alone:
    run(entry, results)

say(f"\n── documentation tests (at {time.monotonic() - started:.0f} s)")
doc = subprocess.run(["cargo", "test", "--locked", "--workspace", "--release", "--doc", "--", *test_args], cwd=REPO)
results["doc tests"] = doc.returncode == 0

failed = [n for n, ok in results.items() if not ok]
say(f"\ntest-lanes: {len(results) - len(failed)} of {len(results)} passed in {time.monotonic() - started:.0f} s"
    + (": FAILED " + ", ".join(failed) if failed else ""))
sys.exit(1 if failed else 0)

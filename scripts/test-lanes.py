#!/usr/bin/env python3
"""Runs the workspace's test binaries two at a time, as scripts/test.sh does.

  scripts/test-lanes.py [--lanes 2] [--bound SECONDS] [--beside COMMAND] [-- TEST ARGS...]

Builds every test binary (`cargo test --locked --workspace --release --no-run`, up to an
hour), then runs them the way `cargo test` would — each in its package's directory, with
CARGO_MANIFEST_DIR, CARGO_PKG_NAME and CARGO_PKG_VERSION set — but LANES binaries at a
time instead of one, the longest first. Most of the
suite's time is spent waiting on things outside the test process (BGP sessions, guests
booting, links coming up), so two binaries side by side finish sooner on two cores.

Some binaries run alone, nothing beside them (SOLO): the ones whose programs keep both CPUs
busy (QEMU guests under TCG, the studies and benchmarks, load on the shared-memory path),
and the ones whose behaviour depends on a peer being scheduled within milliseconds (rate
limits, a late doorbell byte), or that change a setting of the host's for a while (IPv4
forwarding). Then the documentation tests, with cargo (up to 20 minutes).

Each binary's output is printed whole when it ends (never interleaved), with its time.
A binary that runs longer than --bound (default 1,200 s) is ended with what it started
(its process group) and counts as failed; so does one that cannot start or never reports.
Every binary runs whatever the others did; the exit status is 0 only if all passed.
Ctrl-C or SIGTERM ends the binaries running and runs no more.
TEST ARGS go to every binary (default: --include-ignored).

--beside COMMAND runs a shell command of other checks (scripts/test.sh: the lints and the
fuzz targets' build) while the binaries run side by side, at the scheduler's idle priority
(SCHED_IDLE: it gets a CPU only when no test wants one), stopped while the binaries that
run alone run, and waited for after them; its output is printed when it ends, and its
failure fails the run.
"""
import argparse
import json
import os
import signal
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
    # It sets the host's net.ipv4.ip_forward for a while (and puts it back), which new
    # namespaces copy when they are made.
    "sluice:gateway",
}

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("--lanes", type=int, default=2, help="binaries at a time (default 2)")
ap.add_argument("--bound", type=float, default=1200, help="seconds one binary may run (default 1200)")
ap.add_argument("--beside", metavar="COMMAND",
                help="a shell command run at idle priority while binaries run side by side (see above)")
ap.add_argument("test_args", nargs="*", help="arguments for every test binary (after --)")
a = ap.parse_args()
test_args = a.test_args or ["--include-ignored"]
if a.lanes < 1:
    sys.exit("--lanes must be at least 1")

started = time.monotonic()


def say(text):
    print(text, flush=True)


BUILD_BOUND = 3600  # seconds for the optimized build of every test binary
DOC_BOUND = 1200  # seconds for the documentation tests, their build included


def binaries():
    """(name, executable, package directory, package name, version) of every test binary."""
    cmd = ["cargo", "test", "--locked", "--workspace", "--release", "--no-run", "--message-format=json-render-diagnostics"]
    p = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, text=True)
    timer = threading.Timer(BUILD_BOUND, p.kill)
    timer.start()
    found, names = [], set()
    try:
        for line in p.stdout:
            try:
                m = json.loads(line)
            except ValueError:
                continue
            if m.get("reason") != "compiler-artifact" or not m.get("executable") or not m["profile"]["test"]:
                continue
            pkg_dir = os.path.dirname(m["manifest_path"])
            # package_id: "path+file:///…/crates/x#name@0.1.0" (or "…#0.1.0" when the
            # directory is the package's name); the name and version cargo would export.
            tail = m["package_id"].rsplit("#", 1)[-1]
            pkg, _, version = tail.rpartition("@")
            pkg = pkg or os.path.basename(pkg_dir)
            name = f"{pkg}:{m['target']['name']}"
            if name in names:  # a package's lib and bin of the same name
                name += f" ({'/'.join(m['target']['kind'])})"
            names.add(name)
            found.append((name, m["executable"], pkg_dir, pkg, version))
    finally:
        code = p.wait()
        timer.cancel()
    if code != 0:
        why = f"not done within {BUILD_BOUND} s" if code == -9 else f"exit {code}"
        sys.exit(f"test-lanes: building the test binaries (`{' '.join(cmd)}`) failed: {why}")
    return found


def end_group(p):
    """TERM to the binary's process group (its daemons, guests, load generators), KILL
    after 10 s; the binary reaped."""
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            pass
        try:
            p.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def wait_bounded(p, bound):
    """Waits for `p` at most `bound` seconds, then ends its process group; (passed, why)."""
    try:
        code = p.wait(timeout=bound)
        return code == 0, "" if code == 0 else f"exit {code}"
    except subprocess.TimeoutExpired:
        end_group(p)
        return False, f"killed: still running after {bound:.0f} s"


def report(title, ok, why, took, text):
    """Prints one finished binary's (or command's) header and output, whole."""
    with lock:
        say(f"\n── {title}: {'passed' if ok else 'FAILED, ' + why} "
            f"in {took:.0f} s (at {time.monotonic() - started:.0f} s)")
        say(text.rstrip())


running = {}  # name → Popen, so that an interrupt can end them


class Beside:
    """The --beside command: started, stopped and continued as a process group, then
    waited for and reported like a binary."""

    def __init__(self, command):
        self.command = command
        self.out = tempfile.TemporaryFile()
        self.t0 = time.monotonic()
        # chrt: the scheduler's idle class, which what it starts inherits.
        self.p = subprocess.Popen(["chrt", "--idle", "0", "bash", "-c", command], cwd=REPO, stdout=self.out,
                                  stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, process_group=0)

    def signal(self, sig):
        if self.p.poll() is None:
            try:
                os.killpg(self.p.pid, sig)
            except ProcessLookupError:
                pass

    def finish(self):
        """Waits for it (bounded as a build is) and reports it; True if it passed."""
        self.signal(signal.SIGCONT)
        ok, why = wait_bounded(self.p, BUILD_BOUND)
        self.out.seek(0)
        report(f"beside the tests: `{self.command}`", ok, why, time.monotonic() - self.t0,
               self.out.read().decode(errors="replace"))
        return ok


def run_one(entry):
    """Runs one binary; (passed, why, output)."""
    name, exe, pkg_dir, pkg, version = entry
    env = dict(os.environ, CARGO_MANIFEST_DIR=pkg_dir, CARGO_PKG_NAME=pkg, CARGO_PKG_VERSION=version)
    with tempfile.TemporaryFile() as out:
        try:
            # A process group of its own (same session), so that a binary killed for
            # running too long takes what it started with it.
            p = subprocess.Popen([exe, *test_args], cwd=pkg_dir, env=env, stdout=out, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, process_group=0)
        except OSError as e:
            return False, f"could not start it: {e}", ""
        running[name] = p
        ok, why = wait_bounded(p, a.bound)
        # (Left in `running` when interrupted: the interrupt's handler ends it.)
        running.pop(name, None)
        out.seek(0)
        return ok, why, out.read().decode(errors="replace")


def run(entry):
    name, exe = entry[0], entry[1]
    t0 = time.monotonic()
    try:
        ok, why, text = run_one(entry)
    except Exception as e:  # whatever went wrong, the binary counts as failed
        ok, why, text = False, f"the runner failed: {e!r}", ""
    report(f"{name} ({os.path.relpath(exe, REPO)})", ok, why, time.monotonic() - t0, text)
    with lock:
        results[name] = ok


def lane():
    while not stopping.is_set():
        with lock:
            if not queue:
                return
            entry = queue.pop(0)
        run(entry)


def interrupted(signum, frame):
    raise KeyboardInterrupt


lock = threading.Lock()
stopping = threading.Event()
results = {}
signal.signal(signal.SIGTERM, interrupted)
beside = None
try:
    found = binaries()
    if not found:
        sys.exit("test-lanes: cargo built no test binaries")
    say(f"test-lanes: {len(found)} test binaries, {a.lanes} at a time (alone: the ones that load both CPUs, "
        f"depend on being scheduled promptly or change a host setting)")
    found.sort(key=lambda e: -SECONDS.get(e[0], 10))
    queue = [e for e in found if e[0] not in SOLO]
    alone = [e for e in found if e[0] in SOLO]

    if a.beside:
        beside = Beside(a.beside)
    threads = [threading.Thread(target=lane, daemon=True) for _ in range(a.lanes)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        time.sleep(0.2)
    if beside:
        beside.signal(signal.SIGSTOP)  # nothing beside the binaries that run alone
    for entry in alone:
        run(entry)
    if beside:
        results["beside the tests"] = beside.finish()

    say(f"\n── documentation tests (at {time.monotonic() - started:.0f} s)")
    try:
        doc = subprocess.run(["cargo", "test", "--locked", "--workspace", "--release", "--doc", "--", *test_args],
                             cwd=REPO, timeout=DOC_BOUND)
        results["doc tests"] = doc.returncode == 0
    except subprocess.TimeoutExpired:
        say(f"the documentation tests did not finish within {DOC_BOUND} s")
        results["doc tests"] = False
except KeyboardInterrupt:
    stopping.set()
    for p in list(running.values()):
        end_group(p)
    if beside:
        beside.signal(signal.SIGCONT)
        end_group(beside.p)
    sys.exit("test-lanes: interrupted; the binaries running were ended")

# A binary that never reported (whatever the reason) counts as failed.
for entry in found:
    results.setdefault(entry[0], False)
failed = [n for n, ok in results.items() if not ok]
say(f"\ntest-lanes: {len(results) - len(failed)} of {len(results)} passed in {time.monotonic() - started:.0f} s"
    + (": FAILED " + ", ".join(failed) if failed else ""))
sys.exit(1 if failed else 0)

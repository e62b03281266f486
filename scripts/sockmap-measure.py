#!/usr/bin/env python3
"""What the kernel's sockmap redirection gives local TCP, against plain TCP loopback, as root.

  scripts/sockmap-measure.py [--reps 5] [--duration 5] [--workloads iperf3,sockperf,crr]
                             [--sluice PATH] [--check]

Sets up scripts/sockmap/ (scripts/sockmap/loader.py: a sockops program on a cgroup v2 of
its own puts each established TCP socket into a sockhash, keyed by its network namespace and
addresses; an sk_msg program on the sockhash hands each sendmsg straight to the other end's
socket, in the same namespace) and a second, plain cgroup. Each
workload runs with its client and server in the redirected cgroup ("sockmap") or in the
plain one ("tcp"), the two interleaved (alternating which goes first), REPS times each, on
127.0.0.1 with ports below ip_local_port_range:

- iperf3: one stream for DURATION seconds, receiver's bits/s;
- sockperf: TCP ping-pong of 64-byte messages for DURATION seconds, average round trip
  (sockperf before 3.8 reports half the round trip as its latency: doubled here);
- crr: `sluice bench run -m crr-64x8k --conns 1` against `sluice bench serve` (connect,
  64-byte request, 8 KiB response, close), transactions/s. SLUICE defaults to
  target/release/sluice of this checkout, else `sluice` on PATH; without one, crr is left
  out.

It prints a Markdown report: per workload and mode the median with min-max, the ratio of
medians (sockmap / tcp), the CPU time of client and server per unit of work (getrusage of
the children: CPU s per GB, µs per round trip, µs per transaction), the bytes the sk_msg
program redirected (proof the sockmap runs took the short path), and the host's CPU steal
over the whole measurement (/proc/stat). Per-run lines go to stderr as they come.

About 3.5 minutes at the defaults (30 runs of 5 s, plus a second or two each to start).

--check instead verifies the redirection: 64 MiB through a loopback TCP connection in the
redirected cgroup arrive intact (sha256 of what was sent and received), the program
redirected at least that many bytes, and the same transfer in the plain cgroup redirected
nothing. Then the same transfer read with splice(2), and 4 MiB through a TCP relay written
in Go (scripts/sockmap/goproxy.go: io.Copy between two TCP connections, which Go has done
with splice since Go 1.11; built with `go` when it is on PATH), each in both cgroups. It
exits non-zero when any transfer loses bytes — which, on kernels whose sockmap cannot
splice (6.18 cannot), the splice reader and the Go relay do in the redirected cgroup.

Every wait is bounded; everything (programs, pins, bpffs, cgroups, processes) is taken down
at the end, whatever happens.
"""
import argparse
import json
import os
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time

sys.dont_write_bytecode = True  # no __pycache__ left in the checkout
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "sockmap"))
from loader import Redirection, SetupError  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODES = ("tcp", "sockmap")
CGROUP_OF = {"tcp": "off", "sockmap": "on"}

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("--reps", type=int, default=5, help="repetitions of each workload and mode (default 5)")
ap.add_argument("--duration", type=float, default=5.0, help="seconds of each run (default 5)")
ap.add_argument("--workloads", default="iperf3,sockperf,crr", help="which, comma-separated (default all)")
ap.add_argument("--sluice", help="the sluice binary for crr")
ap.add_argument("--check", action="store_true", help="verify the redirection instead of measuring")
a = ap.parse_args()
WORKLOADS = [w for w in a.workloads.split(",") if w]
for w in WORKLOADS:
    if w not in ("iperf3", "sockperf", "crr"):
        sys.exit(f"unknown workload {w!r} (iperf3, sockperf, crr)")
if a.reps < 1 or a.duration <= 0:
    sys.exit("--reps must be at least 1 and --duration positive")


class RunFailed(Exception):
    pass


def free_port():
    """A free port below the ephemeral range, so no client's port ever collides with it."""
    low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
    for _ in range(100):
        port = random.randrange(max(1024, low - 12000), low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
                return port
            except OSError:
                continue
    raise RunFailed(f"no free port below {low}")


def listening(port):
    want = f"0100007F:{port:04X}"
    with open("/proc/net/tcp") as f:
        return any(l.split()[1] == want and l.split()[3] == "0A" for l in list(f)[1:])


class Proc:
    """A child moved into a cgroup before it execs, its output in a file, its rusage kept."""

    def __init__(self, args, cgroup, scratch, tag):
        self.args = args
        self.out_path = os.path.join(scratch, tag + ".out")
        procs = os.path.join(cgroup, "cgroup.procs")

        def into_cgroup():
            with open(procs, "w") as f:
                f.write(str(os.getpid()))

        with open(self.out_path, "w") as out:
            self.p = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      preexec_fn=into_cgroup)
        self.rusage = None
        self.code = None

    def poll(self):
        if self.code is None:
            pid, status, ru = os.wait4(self.p.pid, os.WNOHANG)
            if pid:
                self.code, self.rusage = os.waitstatus_to_exitcode(status), ru
                self.p.returncode = self.code  # reaped here; Popen must not wait again
        return self.code

    def wait(self, seconds):
        deadline = time.monotonic() + seconds
        while self.poll() is None:
            if time.monotonic() > deadline:
                self.stop()
                raise RunFailed(f"`{' '.join(self.args)}` did not finish in {seconds:.0f} s")
            time.sleep(0.02)
        return self.code

    def stop(self):
        """SIGTERM, then SIGKILL after 5 s; reaped either way."""
        if self.poll() is not None:
            return
        self.p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 5
        while self.poll() is None:
            if time.monotonic() > deadline:
                self.p.kill()
                _, status, ru = os.wait4(self.p.pid, 0)  # SIGKILL: returns at once
                self.code, self.rusage = os.waitstatus_to_exitcode(status), ru
                self.p.returncode = self.code
                break
            time.sleep(0.02)

    def output(self):
        with open(self.out_path) as f:
            return f.read()

    def cpu(self):
        return self.rusage.ru_utime + self.rusage.ru_stime if self.rusage else 0.0


def serve_and_run(server_args, client_args, port, cgroup, scratch, tag, server_ends=False):
    """Start the server, wait for its listen, run the client; both stopped and reaped.

    Returns the client's output and the CPU seconds of both. A server that ends by itself
    after one client (SERVER_ENDS) is given 10 s to do so, so that its CPU time is whole.
    """
    server = Proc(server_args, cgroup, scratch, tag + "-server")
    client = None
    try:
        deadline = time.monotonic() + 10
        while not listening(port):
            if server.poll() is not None or time.monotonic() > deadline:
                raise RunFailed(f"`{' '.join(server_args)}` is not listening on {port}: {server.output()[-500:]}")
            time.sleep(0.02)
        client = Proc(client_args, cgroup, scratch, tag + "-client")
        code = client.wait(a.duration + 30)
        if code != 0:
            raise RunFailed(f"`{' '.join(client_args)}` exited {code}: {client.output()[-500:]}")
        if server_ends:
            server.wait(10)
    finally:
        if client:
            client.stop()
        server.stop()
    return client.output(), client.cpu() + server.cpu()


def iperf3(cgroup, scratch, tag):
    port = free_port()
    out, cpu = serve_and_run(["iperf3", "-s", "-B", "127.0.0.1", "-p", str(port), "-1"],
                             ["iperf3", "-c", "127.0.0.1", "-p", str(port), "-t", str(a.duration), "-J"],
                             port, cgroup, scratch, tag, server_ends=True)
    result = json.loads(out)
    if "error" in result:
        raise RunFailed("iperf3: " + result["error"])
    received = result["end"]["sum_received"]
    return received["bits_per_second"] / 1e9, cpu, received["bytes"] / 1e9


def sockperf(cgroup, scratch, tag):
    port = free_port()
    out, cpu = serve_and_run(["sockperf", "server", "--tcp", "-i", "127.0.0.1", "-p", str(port)],
                             ["sockperf", "ping-pong", "--tcp", "-i", "127.0.0.1", "-p", str(port),
                              "-t", str(max(1, round(a.duration))), "-m", "64"],
                             port, cgroup, scratch, tag)
    out = re.sub(r"\x1b\[[0-9;]*m", "", out)
    m = re.search(r"avg-rtt=([0-9.]+)", out)
    if m:
        rtt = float(m.group(1))
    else:
        m = re.search(r"avg-latency=([0-9.]+)", out)
        if not m:
            raise RunFailed("sockperf printed no average: " + out[-500:])
        rtt = 2 * float(m.group(1))
    # Every round trip of the run, warm-up included, as the CPU time includes it.
    total = re.search(r"\[Total Run\].*ReceivedMessages=([0-9]+)", out)
    return rtt, cpu, int(total.group(1)) if total else 0


def crr(cgroup, scratch, tag):
    port = free_port()
    out, cpu = serve_and_run([SLUICE, "bench", "serve", "--listen", "127.0.0.1", "--port", str(port)],
                             [SLUICE, "bench", "run", "--to", f"127.0.0.1:{port}", "-m", "crr-64x8k",
                              "--conns", "1", "--duration", str(a.duration), "--json"],
                             port, cgroup, scratch, tag)
    r = json.loads(out[out.index("{"):])["results"][0]
    if not r["counts_agree"]:
        raise RunFailed("crr: the client's and the server's counts disagree")
    return r["tps"], cpu, r["client"]["transactions"]


# Per workload: its figure's unit, which way is better, and the CPU cost's unit (CPU
# seconds times SCALE per unit of work).
UNITS = {"iperf3": ("Gbit/s", "higher is better", "CPU s/GB", 1),
         "sockperf": ("µs round trip", "lower is better", "CPU µs/round trip", 1e6),
         "crr": ("transactions/s", "higher is better", "CPU µs/transaction", 1e6)}
RUNNERS = {"iperf3": iperf3, "sockperf": sockperf, "crr": crr}


def find_sluice():
    if a.sluice:
        return a.sluice
    built = os.path.join(REPO, "target", "release", "sluice")
    if os.access(built, os.X_OK):
        return built
    return shutil.which("sluice")


def stat():
    v = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    return v[7], sum(v)


CHECK_CHILD = """
import hashlib, os, random, select, socket, sys, threading
how, n = sys.argv[1], 64 << 20
ls = socket.socket(); ls.bind(("127.0.0.1", 0)); ls.listen(1)
c = socket.create_connection(ls.getsockname(), timeout=60)
s, _ = ls.accept()
sent = hashlib.sha256()
def send():
    rng = random.Random(1)
    left = n
    while left:
        b = rng.randbytes(min(left, 1 << 20)); sent.update(b); c.sendall(b); left -= len(b)
    c.shutdown(socket.SHUT_WR)
t = threading.Thread(target=send, daemon=True); t.start()
got, h = 0, hashlib.sha256()
pipe = os.pipe() if how == "splice" else None
while True:
    # A reader that sees nothing for 10 s gives up and says how much it had.
    if not select.select([s], [], [], 10)[0]:
        break
    if pipe:
        k = os.splice(s.fileno(), pipe[1], 1 << 16)
        b = os.read(pipe[0], k) if k else b""
    else:
        b = s.recv(1 << 20)
    if not b:
        break
    got += len(b); h.update(b)
t.join(10)
print(got, sent.hexdigest(), h.hexdigest())
"""

# A server that answers with the length and sha256 of what it received, and a client that
# sends 4 MiB to it through the Go relay (argv: relay port, server port).
CHECK_RELAYED = """
import hashlib, os, socket, sys, threading
relay, port = int(sys.argv[1]), int(sys.argv[2])
ls = socket.socket(); ls.bind(("127.0.0.1", port)); ls.listen(1)
def serve():
    s, _ = ls.accept(); s.settimeout(20); h = hashlib.sha256(); k = 0
    try:
        while True:
            b = s.recv(1 << 16)
            if not b: break
            h.update(b); k += len(b)
    except socket.timeout:
        pass
    s.sendall(f"{k} {h.hexdigest()}".encode()); s.close()
threading.Thread(target=serve, daemon=True).start()
data = os.urandom(4 << 20)
c = socket.create_connection(("127.0.0.1", relay), timeout=20)
c.sendall(data); c.shutdown(socket.SHUT_WR)
answer = b""
try:
    while True:
        b = c.recv(4096)
        if not b: break
        answer += b
except socket.timeout:
    pass
k, digest = answer.decode().split() if answer else ("-", "-")
print(len(data), hashlib.sha256(data).hexdigest(), k, digest)
"""


def transfer(r, mode, how):
    """64 MiB through a connection in MODE's cgroup, read with recv or splice."""
    before = r.counters()
    child = Proc([sys.executable, "-c", CHECK_CHILD, how], r.cgroups[CGROUP_OF[mode]], r.scratch,
                 f"check-{mode}-{how}")
    if child.wait(180) != 0:
        raise RunFailed("the check's transfer failed: " + child.output()[-800:])
    got, sent, received = child.output().strip().splitlines()[-1].split()
    after = r.counters()
    moved = after["bytes_redirected"] - before["bytes_redirected"]
    added = after["sockets_added"] - before["sockets_added"]
    passed = after["msgs_on_stack"] - before["msgs_on_stack"]
    intact = int(got) == 64 << 20 and sent == received
    print(f"{mode}, read with {how}: {int(got):,} of {64 << 20:,} bytes received, sha256 "
          f"{'matches' if intact else 'DIFFERS'}; {added} sockets added to the sockhash, "
          f"{moved:,} bytes redirected, {passed} sends through the stack")
    return intact, added, moved


def relayed(r, mode, relay_bin):
    """4 MiB through the Go relay, all three programs in MODE's cgroup."""
    relay_port, server_port = free_port(), free_port()
    while server_port == relay_port:
        server_port = free_port()
    before = r.counters()
    relay = Proc([relay_bin, f"127.0.0.1:{relay_port}", f"127.0.0.1:{server_port}"],
                 r.cgroups[CGROUP_OF[mode]], r.scratch, f"relay-{mode}")
    try:
        deadline = time.monotonic() + 10
        while not listening(relay_port):
            if time.monotonic() > deadline or relay.poll() is not None:
                raise RunFailed("the Go relay did not listen within 10 s: " + relay.output()[-400:])
            time.sleep(0.05)
        child = Proc([sys.executable, "-c", CHECK_RELAYED, str(relay_port), str(server_port)],
                     r.cgroups[CGROUP_OF[mode]], r.scratch, f"relayed-{mode}")
        if child.wait(60) != 0:
            raise RunFailed("the relayed transfer failed: " + child.output()[-800:])
    finally:
        relay.stop()
    n, digest, k, got = child.output().strip().splitlines()[-1].split()
    moved = r.counters()["bytes_redirected"] - before["bytes_redirected"]
    intact = n == k and digest == got
    received = "no answer came back" if k == "-" else f"the server received {int(k):,} of {int(n):,} bytes"
    print(f"{mode}, through a Go relay (io.Copy between TCP connections): {received}, sha256 "
          f"{'matches' if intact else 'DIFFERS'}; {moved:,} bytes redirected")
    return intact, moved


def go_relay(scratch):
    """scripts/sockmap/goproxy.go built into SCRATCH, or None without a Go toolchain."""
    if not shutil.which("go"):
        print("no `go` on PATH: the Go relay check is left out")
        return None
    out = os.path.join(scratch, "goproxy")
    env = dict(os.environ, GOCACHE=os.path.join(scratch, "gocache"), CGO_ENABLED="0", GOFLAGS="",
               GOPATH=os.path.join(scratch, "gopath"))
    src = os.path.join(REPO, "scripts", "sockmap", "goproxy.go")
    try:
        p = subprocess.run(["go", "build", "-o", out, src], env=env, capture_output=True, text=True,
                           timeout=300, cwd=scratch)
    except subprocess.TimeoutExpired:
        raise RunFailed("building the Go relay took over 300 s")
    if p.returncode != 0:
        raise RunFailed("building the Go relay failed: " + p.stderr[-800:])
    return out


def check(r):
    failures, limits = [], []
    for mode in ("sockmap", "tcp"):
        intact, added, moved = transfer(r, mode, "recv")
        if not intact:
            failures.append(f"{mode}: the bytes arrived changed or short")
        if mode == "sockmap" and (added < 2 or moved < 64 << 20):
            failures.append("sockmap: the transfer was not redirected")
        if mode == "tcp" and (added or moved):
            failures.append("tcp: the plain cgroup's transfer was redirected")
    # Reading with splice(2): the kernel's splice reads the socket's receive queue and
    # knows nothing of the queue redirected bytes wait in.
    # A transfer in the redirected cgroup proves something only if it was redirected.
    for mode in ("tcp", "sockmap"):
        intact, _, moved = transfer(r, mode, "splice")
        if mode == "sockmap" and moved < 64 << 20:
            failures.append("sockmap: the splice reader's transfer was not redirected (proves nothing)")
        if not intact:
            (limits if mode == "sockmap" else failures).append(f"{mode}: a splice(2) reader lost bytes")
    relay = go_relay(r.scratch)
    if relay:
        for mode in ("tcp", "sockmap"):
            intact, moved = relayed(r, mode, relay)
            if mode == "sockmap" and moved < 4 << 20:
                failures.append("sockmap: the Go relay's transfer was not redirected (proves nothing)")
            if not intact:
                (limits if mode == "sockmap" else failures).append(f"{mode}: bytes through the Go relay were lost")
    for what in limits:
        print("limit of this kernel: " + what)
    print("check: " + ("FAILED: " + "; ".join(failures) if failures else
                       "the redirection moves bytes intact to readers that use read(2)/recv(2)"
                       + ("; it loses them for readers that use splice(2)" if limits else "")))
    return not failures and not limits


def fmt(x):
    return f"{x:.3g}" if abs(x) < 1000 else f"{x:,.0f}"


def measure(r):
    results = {w: {m: [] for m in MODES} for w in WORKLOADS}
    cpu = {w: {m: [] for m in MODES} for w in WORKLOADS}
    redirected = {w: 0 for w in WORKLOADS}
    steal0, total0 = stat()
    started = time.monotonic()
    for rep in range(a.reps):
        for w in WORKLOADS:
            for mode in (MODES if rep % 2 == 0 else MODES[::-1]):
                before = r.counters()
                value, seconds, work = RUNNERS[w](r.cgroups[CGROUP_OF[mode]], r.scratch, f"{w}-{mode}-{rep}")
                after = r.counters()
                moved = after["bytes_redirected"] - before["bytes_redirected"]
                passed = after["msgs_on_stack"] - before["msgs_on_stack"]
                if mode == "sockmap":
                    redirected[w] += moved
                elif moved:
                    raise RunFailed(f"{w}: the plain run was redirected")
                results[w][mode].append(value)
                cpu[w][mode].append(seconds * UNITS[w][3] / work if work else float("nan"))
                print(f"  {w} {mode} rep {rep + 1}: {fmt(value)} {UNITS[w][0]}, {fmt(cpu[w][mode][-1])} "
                      f"{UNITS[w][2]}, {moved / 1e6:.0f} MB redirected, {passed} sends through the stack",
                      file=sys.stderr, flush=True)
    steal1, total1 = stat()
    elapsed = time.monotonic() - started

    print(f"# Sockmap redirection against TCP loopback\n\n"
          f"{a.reps} repetitions of {a.duration:g} s per workload and mode, interleaved; "
          f"kernel {os.uname().release}, {os.cpu_count()} CPUs; {elapsed:.0f} s in all; "
          f"host CPU steal over the run {100 * (steal1 - steal0) / max(1, total1 - total0):.1f}%.\n")
    print("| workload | unit | tcp median (min-max) | sockmap median (min-max) | sockmap / tcp "
          "| CPU tcp | CPU sockmap | CPU unit | redirected |")
    print("|---|---|---|---|---|---|---|---|---|")
    for w in WORKLOADS:
        med = {m: statistics.median(results[w][m]) for m in MODES}
        cell = {m: f"{fmt(med[m])} ({fmt(min(results[w][m]))}-{fmt(max(results[w][m]))})" for m in MODES}
        ratio = med["sockmap"] / med["tcp"] if med["tcp"] else float("nan")
        print(f"| {w} | {UNITS[w][0]}, {UNITS[w][1]} | {cell['tcp']} | {cell['sockmap']} | {ratio:.2f} "
              f"| {fmt(statistics.median(cpu[w]['tcp']))} | {fmt(statistics.median(cpu[w]['sockmap']))} "
              f"| {UNITS[w][2]} | {redirected[w] / 1e6:,.0f} MB |")
    print("\nCPU: median over the runs of the user + system time of client and server together "
          "(getrusage of the children) per unit of work; sockperf's includes its warm-up. "
          "Redirected: payload the sk_msg program handed straight to the peer socket over all "
          "sockmap runs (plain runs redirect nothing; the script fails if one does).")


SLUICE = None
if "crr" in WORKLOADS and not a.check:
    SLUICE = find_sluice()
    if not SLUICE:
        print("no sluice binary (build it: cargo build --release -p sluice, or give --sluice): "
              "crr left out", file=sys.stderr)
        WORKLOADS.remove("crr")
missing = [t for t in ("iperf3", "sockperf") if t in WORKLOADS and not shutil.which(t)]
if missing:
    sys.exit(f"missing: {', '.join(missing)} (apt-get install -y {' '.join(missing)})")



def terminated(signum, frame):
    raise KeyboardInterrupt


signal.signal(signal.SIGTERM, terminated)
ok = True
try:
    with Redirection() as r:
        ok = check(r) if a.check else (measure(r) or True)
except (SetupError, RunFailed, subprocess.SubprocessError) as e:
    sys.exit(f"sockmap-measure: {e}")
except KeyboardInterrupt:
    sys.exit("sockmap-measure: interrupted; everything is taken down")
sys.exit(0 if ok else 1)

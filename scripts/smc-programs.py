#!/usr/bin/env python3
"""PostgreSQL, memcached, nginx, redis, OpenSSH and rsync's daemon on the shared-memory fast
path against plain TCP, and against the fast path with every wake-up by doorbell, as root.

  scripts/smc-programs.py [--sluice PATH] [--reps 5] [--duration 5] [--base-port 26400]

Three servers of each program in one network namespace of the script's own: one under
`sluice smc run`, one under `sluice smc run --doorbells` (event loops do not look at the
shared buffers themselves), one plain; each client runs the same way as its server.
PostgreSQL runs as nobody (a member of a group of the script's own, which `sluice smc
setup` opens the fast path to, in a runtime directory of the script's own), from
clusters `initdb` makes under a new temporary directory; nginx serves a 1 KB file from
another. Workloads: pgbench's select-only transactions (`-S`) on one connection and on
ten (DURATION seconds each), memcslap's sets and gets (four threads, 20,000 operations
each), wrk fetching the 1 KB file on 50 connections (DURATION seconds) and
redis-benchmark's GET on 50 connections (100,000 requests), a 64 MB file through ssh (`ssh
… cat FILE`, sshd with a key of the script's own) and pulled from rsync's daemon (`rsync
rsync://…`, into a fresh directory each time). Paths alternate within each
repetition (the order turns each time), REPS repetitions. Prints a Markdown table: per
workload the median rate of each path with its (min–max), the medians of the
per-repetition ratios with their (min–max), and the host's CPU steal over the cells
(/proc/stat); the host's busy share is measured for 2 s just before and just after the
cells, the servers idle. A run with more than 2% steal in a cell, or a host more than
10% busy before or after, is NOISY and proves nothing.

Every wait is bounded; everything the script started is stopped and removed at the end,
whatever happens.
"""
import argparse
import glob
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("--sluice", default="sluice")
ap.add_argument("--reps", type=int, default=5)
ap.add_argument("--duration", type=int, default=5)
ap.add_argument("--base-port", type=int, default=26400, help="eighteen ports from here (outside ip_local_port_range)")
a = ap.parse_args()

NOBODY = 65534
PATHS = ["smc", "smc-doorbells", "tcp"]
PROGRAMS = ["postgres", "memcached", "nginx", "redis", "sshd", "rsync"]
bins = sorted(glob.glob("/usr/lib/postgresql/*/bin"))
if os.geteuid() != 0:
    sys.exit("smc-programs.py: run it as root (it makes a network namespace and a group)")
NEEDS = ["memcached", "memcslap", "nginx", "wrk", "redis-server", "redis-benchmark", "sshd", "ssh", "rsync"]
if not bins or not all(shutil.which(n) for n in NEEDS):
    sys.exit("smc-programs.py: needs postgresql, memcached, libmemcached-tools, nginx, wrk, redis, "
             "openssh-server, openssh-client and rsync (apt-get install them)")
PG = bins[-1]
sluice = shutil.which(a.sluice) or a.sluice

tmp = tempfile.mkdtemp(prefix="sluice-programs.")
os.chmod(tmp, 0o755)
ns = f"sluice-programs-{os.getpid()}"
group = f"sluiceprog{os.getpid() % 100000}"
run_dir = os.path.join(tmp, "run")
env = dict(os.environ, SLUICE_RUN_DIR=run_dir)
servers = []


def sh(*argv, **kw):
    return subprocess.run(argv, check=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120, **kw).stdout


def in_ns(path, argv, user=None):
    """argv in the namespace, under the launcher for path `smc`, as root or `nobody`."""
    cmd = ["ip", "netns", "exec", ns]
    if user:
        gid = sh("getent", "group", group).split(":")[2]
        cmd += ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", f"--groups={gid}"]
    if path == "smc":
        cmd += [sluice, "smc", "run", "--"]
    elif path == "smc-doorbells":
        cmd += [sluice, "smc", "run", "--doorbells", "--"]
    return cmd + argv


def port(path, program):
    return a.base_port + PROGRAMS.index(program) * len(PATHS) + PATHS.index(path)


def cpu():
    """(steal, total) jiffies of the whole host."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return v[7], sum(v)


def busy(secs=2.0):
    """The host's busy share over `secs` (steal excluded), measured while this script waits."""
    with open("/proc/stat") as f:
        v0 = [int(x) for x in f.readline().split()[1:]]
    time.sleep(secs)
    with open("/proc/stat") as f:
        v1 = [int(x) for x in f.readline().split()[1:]]
    d = [y - x for x, y in zip(v0, v1)]
    return (sum(d) - d[3] - d[4] - d[7]) / max(1, sum(d))


def pgbench(path, clients):
    out = sh(*in_ns(path, [f"{PG}/pgbench", "-n", "-S", "-c", str(clients), "-j", str(min(clients, 2)),
                           "-T", str(a.duration), "-h", "127.0.0.1", "-p", str(port(path, "postgres")),
                           "-U", "postgres", "postgres"]), env=env)
    if "number of failed transactions: 0 " not in out:
        raise SystemExit(f"pgbench on {path} failed:\n{out}")
    return float(re.search(r"tps = ([0-9.]+)", out).group(1))


def memcslap(path, test):
    out = sh(*in_ns(path, ["memcslap", f"--servers=127.0.0.1:{port(path, 'memcached')}", "--concurrency=4",
                           "--execute-number=20000", f"--test={test}"]), env=env)
    m = re.search(rf"Time to {test}\s+(\d+) keys by\s+\d+ threads:\s+([0-9.]+) seconds", out)
    if not m:
        raise SystemExit(f"memcslap on {path} said:\n{out}")
    return int(m.group(1)) / float(m.group(2))


def wrk(path):
    out = sh(*in_ns(path, ["wrk", "-t", "2", "-c", "50", "-d", f"{a.duration}s", "--timeout", "2s",
                           f"http://127.0.0.1:{port(path, 'nginx')}/1k"]), env=env)
    if "Socket errors" in out or "Non-2xx" in out:
        raise SystemExit(f"wrk on {path} counted errors:\n{out}")
    return float(re.search(r"Requests/sec:\s+([0-9.]+)", out).group(1))


def redis_get(path):
    out = sh(*in_ns(path, ["redis-benchmark", "-h", "127.0.0.1", "-p", str(port(path, "redis")), "-c", "50",
                           "-n", "100000", "-t", "get", "-q"]), env=env)
    m = re.search(r"GET: ([0-9.]+) requests per second", out)
    if not m:
        raise SystemExit(f"redis-benchmark on {path} said:\n{out}")
    return float(m.group(1))


BIG = 64 * 1024 * 1024


def ssh_cat(path):
    key = os.path.join(tmp, "ssh", "user_key")
    t0 = time.monotonic()
    out = subprocess.run(in_ns(path, ["ssh", "-F", "none", "-i", key, "-o", "BatchMode=yes", "-o",
                                      "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o",
                                      "LogLevel=ERROR", "-p", str(port(path, "sshd")), "root@127.0.0.1",
                                      f"cat {tmp}/share/big"]),
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120, check=True).stdout
    secs = time.monotonic() - t0
    if len(out) != BIG:
        raise SystemExit(f"ssh on {path} brought {len(out)} bytes of {BIG}")
    return BIG / secs / 1e6


def rsync_pull(path):
    into = os.path.join(tmp, f"pulled-{path}")
    shutil.rmtree(into, ignore_errors=True)
    t0 = time.monotonic()
    sh(*in_ns(path, ["rsync", "-a", f"rsync://127.0.0.1:{port(path, 'rsync')}/m/big", into + "/"]), env=env)
    secs = time.monotonic() - t0
    if os.path.getsize(os.path.join(into, "big")) != BIG:
        raise SystemExit(f"rsync on {path} pulled a short file")
    return BIG / secs / 1e6


WORKLOADS = {
    "pgbench select-only, 1 connection (tps)": lambda p: pgbench(p, 1),
    "pgbench select-only, 10 connections (tps)": lambda p: pgbench(p, 10),
    "memcslap set, 4 threads (ops/s)": lambda p: memcslap(p, "set"),
    "memcslap get, 4 threads (ops/s)": lambda p: memcslap(p, "get"),
    "wrk against nginx, 1 KB, 50 connections (requests/s)": wrk,
    "redis-benchmark GET, 50 connections (requests/s)": redis_get,
    "ssh cat of a 64 MB file (MB/s)": ssh_cat,
    "rsync daemon pull of a 64 MB file (MB/s)": rsync_pull,
}


def wait_for(what, ok, secs=30):
    deadline = time.time() + secs
    while time.time() < deadline:
        if ok():
            return
        time.sleep(0.1)
    raise SystemExit(f"smc-programs.py: {what} within {secs} s")


try:
    sh("groupadd", group)
    sh("ip", "netns", "add", ns)
    sh("ip", "-n", ns, "link", "set", "lo", "up")
    sh(sluice, "smc", "setup", "--group", group, env=env)
    # What rsync's module serves: this directory, the big file alone.
    share = os.path.join(tmp, "share")
    os.mkdir(share)
    with open(os.path.join(share, "big"), "wb") as f:
        f.write(os.urandom(BIG))
    keys = os.path.join(tmp, "ssh")
    os.mkdir(keys)
    for k in ("host_key", "user_key"):
        sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", os.path.join(keys, k))
    shutil.copy(os.path.join(keys, "user_key.pub"), os.path.join(keys, "authorized_keys"))
    # sshd's privilege separation directory (the package's; made if missing).
    os.makedirs("/run/sshd", exist_ok=True)
    for path in PATHS:
        data = os.path.join(tmp, f"pg-{path}")
        os.mkdir(data)
        os.chown(data, NOBODY, NOBODY)
        sh("setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", f"{PG}/initdb", "-D", data,
           "-A", "trust", "-U", "postgres")
        p = str(port(path, "postgres"))
        servers.append(subprocess.Popen(
            in_ns(path, [f"{PG}/postgres", "-D", data, "-k", data, "-p", p, "-c", "listen_addresses=127.0.0.1"],
                  user=True), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True))
        wait_for(f"postgres ({path}) accepting on port {p}", lambda: subprocess.run(
            ["ip", "netns", "exec", ns, f"{PG}/pg_isready", "-h", "127.0.0.1", "-p", p],
            stdout=subprocess.DEVNULL).returncode == 0)
        sh(*in_ns(path, [f"{PG}/pgbench", "-i", "-q", "-s", "1", "-h", "127.0.0.1", "-p", p, "-U", "postgres",
                         "postgres"]), env=env)
        m = str(port(path, "memcached"))
        servers.append(subprocess.Popen(
            in_ns(path, ["memcached", "-u", "root", "-l", "127.0.0.1", "-p", m, "-t", "2"]), env=env,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True))
        wait_for(f"memcached ({path}) listening on port {m}", lambda: f"127.0.0.1:{m} " in sh(
            "ip", "netns", "exec", ns, "ss", "-ltn"))
        n = str(port(path, "nginx"))
        www = os.path.join(tmp, f"www-{path}")
        os.makedirs(os.path.join(www, "files"))
        with open(os.path.join(www, "files", "1k"), "wb") as f:
            f.write(os.urandom(1024))
        for d in (www, os.path.join(www, "files")):
            os.chmod(d, 0o755)
        os.chmod(os.path.join(www, "files", "1k"), 0o644)
        with open(os.path.join(www, "nginx.conf"), "w") as f:
            f.write(f"daemon off;\nworker_processes auto;\npid {www}/nginx.pid;\nerror_log {www}/error.log;\n"
                    f"events {{ worker_connections 4096; }}\nhttp {{\n sendfile on;\n tcp_nopush on;\n"
                    f" access_log off;\n client_body_temp_path {www}/tmp;\n proxy_temp_path {www}/tmp;\n"
                    f" fastcgi_temp_path {www}/tmp;\n uwsgi_temp_path {www}/tmp;\n scgi_temp_path {www}/tmp;\n"
                    f" server {{ listen 127.0.0.1:{n}; root {www}/files; }}\n}}\n")
        servers.append(subprocess.Popen(in_ns(path, ["nginx", "-c", os.path.join(www, "nginx.conf")]), env=env,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True))
        r = str(port(path, "redis"))
        servers.append(subprocess.Popen(
            in_ns(path, ["redis-server", "--port", r, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                         "--dir", tmp]), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True))
        for what, q in (("nginx", n), ("redis", r)):
            wait_for(f"{what} ({path}) listening on port {q}", lambda: f"127.0.0.1:{q} " in sh(
                "ip", "netns", "exec", ns, "ss", "-ltn"))
        sh(*in_ns(path, ["redis-cli", "-p", r, "set", "key:__rand_int__", "x" * 3]), env=env)
        q = str(port(path, "sshd"))
        with open(os.path.join(keys, f"sshd-{path}.conf"), "w") as f:
            f.write(f"Port {q}\nListenAddress 127.0.0.1\nHostKey {keys}/host_key\nPidFile {keys}/sshd-{path}.pid\n"
                    f"AuthorizedKeysFile {keys}/authorized_keys\nPermitRootLogin yes\nPasswordAuthentication no\n"
                    f"UsePAM no\nStrictModes no\n")
        servers.append(subprocess.Popen(in_ns(path, ["/usr/sbin/sshd", "-D", "-f", f"{keys}/sshd-{path}.conf"]),
                                        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                        start_new_session=True))
        y = str(port(path, "rsync"))
        with open(os.path.join(tmp, f"rsyncd-{path}.conf"), "w") as f:
            f.write(f"port = {y}\naddress = 127.0.0.1\nuse chroot = no\npid file = {tmp}/rsyncd-{path}.pid\n"
                    f"[m]\npath = {share}\nread only = true\nuid = root\ngid = root\n")
        servers.append(subprocess.Popen(in_ns(path, ["rsync", "--daemon", "--no-detach",
                                                     f"--config={tmp}/rsyncd-{path}.conf"]),
                                        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                        start_new_session=True))
        for what, q in (("sshd", q), ("rsync", y)):
            wait_for(f"{what} ({path}) listening on port {q}", lambda: f"127.0.0.1:{q} " in sh(
                "ip", "netns", "exec", ns, "ss", "-ltn"))
    before = busy()
    got = {w: {p: [] for p in PATHS} for w in WORKLOADS}
    steal = {w: [] for w in WORKLOADS}
    for rep in range(a.reps):
        for w, fn in WORKLOADS.items():
            turn = rep % len(PATHS)
            for path in PATHS[turn:] + PATHS[:turn]:
                s0, t0 = cpu()
                got[w][path].append(fn(path))
                s1, t1 = cpu()
                steal[w].append((s1 - s0) / max(1, t1 - t0))
                print(f"rep {rep + 1}/{a.reps}  {w}  {path}: {got[w][path][-1]:,.0f}", file=sys.stderr, flush=True)
    worst = max(max(v) for v in steal.values())
    after = busy()
    quiet = worst <= 0.02 and max(before, after) <= 0.10
    print(f"{'QUIET' if quiet else 'NOISY'}: {a.reps} repetitions, paths interleaved; the host's steal at most "
          f"{worst:.1%} in any cell; the host {before:.1%} busy just before the cells and {after:.1%} just after "
          f"(with the servers idle; more than 10% is others' load).\n")
    print("| workload | sluice smc | smc --doorbells | TCP | smc / TCP | smc / smc --doorbells | steal |")
    print("|---|--:|--:|--:|--:|--:|--:|")

    def cell(v):
        return f"{statistics.median(v):,.0f} ({min(v):,.0f}–{max(v):,.0f})"

    def ratio(w, x, y):
        r = [s / t for s, t in zip(got[w][x], got[w][y])]
        return f"{statistics.median(r):.2f}× ({min(r):.2f}–{max(r):.2f})"

    for w in WORKLOADS:
        print(f"| {w} | {cell(got[w]['smc'])} | {cell(got[w]['smc-doorbells'])} | {cell(got[w]['tcp'])} | "
              f"{ratio(w, 'smc', 'tcp')} | {ratio(w, 'smc', 'smc-doorbells')} | {max(steal[w]):.1%} |")
finally:
    for s in servers:
        try:
            os.killpg(s.pid, 15)
            s.wait(timeout=10)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(s.pid, 9)
            except ProcessLookupError:
                pass
    subprocess.run(["ip", "netns", "del", ns], stderr=subprocess.DEVNULL)
    subprocess.run(["groupdel", group], stderr=subprocess.DEVNULL)
    shutil.rmtree(tmp, ignore_errors=True)

#!/usr/bin/env python3
"""Sockmap redirection between local TCP sockets, set up and taken down, as root.

  scripts/sockmap/loader.py [--for SECONDS]

Compiles sockmap.bpf.c (beside this file) with clang, loads it with bpftool, pins its
programs and maps on a bpffs mounted on a directory of its own (not /sys/fs/bpf, which
`ip netns exec` remounts), makes two cgroups v2 under the cgroup2 mount (`on`, whose TCP
sockets are redirected, and `off`, a plain one to compare with), attaches the sockops
program to `on` and the sk_msg program to the sockhash. Run on its own it prints the two
cgroups and keeps them until Ctrl-C or SECONDS (default 600) pass; move a shell into one
with `echo $$ > CGROUP/cgroup.procs`. Everything is taken down at the end, whatever
happens: processes left in the cgroups are killed.

scripts/sockmap-measure.py uses it as a module (`Redirection`).
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.join(HERE, "sockmap.bpf.c")
# The order of the counters in sockmap.bpf.c's `counters` map.
COUNTERS = ["sockets_added", "sockets_not_added", "msgs_redirected", "bytes_redirected", "msgs_on_stack",
            "peers_not_found", "sockets_skipped", "msgs_dropped"]


class SetupError(Exception):
    pass


def run(*args, timeout=30):
    try:
        p = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise SetupError(f"`{' '.join(args)}` did not finish in {timeout} s")
    if p.returncode != 0:
        raise SetupError(f"`{' '.join(args)}` failed: {(p.stderr or p.stdout).strip()}")
    return p.stdout


def cgroup2_mount():
    """The first cgroup v2 mount point (/sys/fs/cgroup, or /sys/fs/cgroup/unified on hybrid hosts)."""
    with open("/proc/self/mounts") as f:
        for line in f:
            dev, where, kind = line.split()[:3]
            if kind == "cgroup2":
                return where
    raise SetupError("no cgroup v2 hierarchy is mounted (mount -t cgroup2 none /sys/fs/cgroup/unified)")


def wait_until(cond, seconds, what):
    deadline = time.monotonic() + seconds
    while not cond():
        if time.monotonic() > deadline:
            raise SetupError(f"{what}: not done within {seconds} s")
        time.sleep(0.05)


class Redirection:
    """Loaded and attached on enter, taken down on exit (each step undone that was done)."""

    def __init__(self, name="sluice-sockmap"):
        self.name = f"{name}-{os.getpid()}"
        self.undo = []  # (what, function), undone last first

    def __enter__(self):
        try:
            self._up()
        except BaseException:
            self._down()
            raise
        return self

    def __exit__(self, *exc):
        errors = self._down()
        if errors and exc[0] is None:
            raise SetupError("teardown: " + "; ".join(errors))
        return False

    def _up(self):
        for tool in ("clang", "bpftool"):
            if not shutil.which(tool):
                raise SetupError(f"`{tool}` is not on PATH (apt-get install -y --no-install-recommends {tool})")
        # libbpf turns every '.' of a pin path into '_', so the directory's name has none.
        self.scratch = tempfile.mkdtemp(prefix=self.name + "-", dir="/tmp")
        self.undo.append(("remove " + self.scratch, lambda: shutil.rmtree(self.scratch)))
        obj = os.path.join(self.scratch, "sockmap.bpf.o")
        run("clang", "-target", "bpf", "-O2", "-g", "-Wall", "-I/usr/include/" + multiarch(),
            "-c", SOURCE, "-o", obj, timeout=120)

        self.pins = os.path.join(self.scratch, "bpffs")
        os.mkdir(self.pins)
        run("mount", "-t", "bpf", "bpf", self.pins)
        self.undo.append(("unmount " + self.pins, lambda: run("umount", self.pins)))
        progs, maps = os.path.join(self.pins, "progs"), os.path.join(self.pins, "maps")
        self.undo.append(("unpin", lambda: [shutil.rmtree(d) for d in (progs, maps) if os.path.exists(d)]))
        os.mkdir(progs)
        os.mkdir(maps)
        run("bpftool", "prog", "loadall", obj, progs, "pinmaps", maps, timeout=60)
        self.sockops = os.path.join(progs, "add_local")
        self.sk_msg = os.path.join(progs, "redirect_to_peer")
        self.sockhash = os.path.join(maps, "sockets")
        self.counter_map = os.path.join(maps, "counters")

        root = cgroup2_mount()
        self.cgroups = {}
        for mode in ("off", "on"):
            path = os.path.join(root, f"{self.name}-{mode}")
            os.mkdir(path)
            self.undo.append(("remove cgroup " + path, lambda p=path: remove_cgroup(p)))
            self.cgroups[mode] = path
        run("bpftool", "cgroup", "attach", self.cgroups["on"], "sock_ops", "pinned", self.sockops)
        self.undo.append(("detach sockops", lambda: run(
            "bpftool", "cgroup", "detach", self.cgroups["on"], "sock_ops", "pinned", self.sockops)))
        run("bpftool", "prog", "attach", "pinned", self.sk_msg, "msg_verdict", "pinned", self.sockhash)
        self.undo.append(("detach sk_msg", lambda: run(
            "bpftool", "prog", "detach", "pinned", self.sk_msg, "msg_verdict", "pinned", self.sockhash)))

    def _down(self):
        # A second Ctrl-C or a TERM must not leave half of it behind.
        held = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
        errors = []
        try:
            while self.undo:
                what, step = self.undo.pop()
                try:
                    step()
                except Exception as e:  # keep taking down the rest
                    errors.append(f"{what}: {e}")
        finally:
            for sig, handler in held.items():
                signal.signal(sig, handler)
        return errors

    def counters(self):
        """The program's counters, by name."""
        out = {}
        for entry in json.loads(run("bpftool", "-j", "map", "dump", "pinned", self.counter_map)):
            # A per-CPU array: one value for each CPU, summed.
            if "formatted" in entry:  # the object has BTF: bpftool decodes key and values
                key = entry["formatted"]["key"]
                value = sum(v["value"] for v in entry["formatted"]["values"])
            else:
                def number(b):
                    return int.from_bytes(bytes(int(x, 16) for x in b), "little")
                key = number(entry["key"])
                value = sum(number(v["value"]) for v in entry["values"])
            out[COUNTERS[key]] = value
        return out


def multiarch():
    try:
        return subprocess.run(["gcc", "-print-multiarch"], capture_output=True, text=True,
                              timeout=10).stdout.strip() or "x86_64-linux-gnu"
    except (OSError, subprocess.TimeoutExpired):
        return "x86_64-linux-gnu"


def remove_cgroup(path):
    if not os.path.isdir(path):
        return
    with open(os.path.join(path, "cgroup.procs")) as f:
        left = f.read().split()
    if left:
        try:
            with open(os.path.join(path, "cgroup.kill"), "w") as f:
                f.write("1")
        except OSError:  # kernels before 5.14 have no cgroup.kill
            for pid in left:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
        wait_until(lambda: not open(os.path.join(path, "cgroup.procs")).read().strip(), 10,
                   f"emptying {path}")
    os.rmdir(path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--for", dest="seconds", type=float, default=600.0,
                    help="take everything down after this many seconds (default 600)")
    a = ap.parse_args()
    with Redirection() as r:
        print(f"redirected: {r.cgroups['on']}\nplain:      {r.cgroups['off']}\n"
              f"counters:   bpftool map dump pinned {r.counter_map}\n"
              f"sockets:    bpftool map dump pinned {r.sockhash}", flush=True)
        try:
            time.sleep(a.seconds)
        except KeyboardInterrupt:
            pass
        print(json.dumps(r.counters()))


def terminated(signum, frame):
    raise KeyboardInterrupt


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, terminated)
    try:
        main()
    except SetupError as e:
        raise SystemExit(f"sockmap: {e}")

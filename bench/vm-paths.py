#!/usr/bin/python3
"""VM paths, same run (issue 20): QEMU VMs on sluice's vhost-user ports against QEMU's TAP
backend on a Linux bridge, VM <-> VM and VM <-> namespace, throughput (iperf3) and
request-response (ICMP echo round trips, ping).

    sudo bench/vm-paths.py [SECONDS] [ROUNDS] > docs/results/DATE-vm-paths.md

Both paths boot the same kernel and initramfs (the one `sluice lab up --vm` builds) under
TCG, so absolute numbers measure QEMU's emulation on this machine more than either switch;
compare the paths with each other, within one run. Everything is made in namespaces of its
own and removed at the end.
"""
import json, os, re, socket, statistics, subprocess, sys, tempfile, time

SECS = int(sys.argv[1]) if len(sys.argv) > 1 else 10
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 3
SLUICE = os.environ.get("SLUICE", "sluice")
LAB = "vmb"
BR_NS = "sluice-vmb-br"
G1_NS = "sluice-vmb-brg1"


def sh(cmd, check=True, capture=True):
    r = subprocess.run(cmd, shell=True, text=True, capture_output=capture, timeout=600)
    if check and r.returncode != 0:
        raise SystemExit(f"`{cmd}` failed: {r.stderr.strip()}")
    return r.stdout if capture else ""


class Console:
    """The lab VMs' console protocol (crates/lab/src/vm.rs): `ID CMD\\n`, answered
    with BEGIN/END markers and the exit code."""

    def __init__(self, path, wait=120):
        end = time.monotonic() + wait
        while True:
            try:
                self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                self.s.connect(path)
                break
            except OSError:
                self.s.close()
                if time.monotonic() > end:
                    raise
                time.sleep(0.05)
        self.buf, self.seq = b"", 0
        end = time.monotonic() + wait
        while time.monotonic() < end:
            try:
                if self.run("true", 0.5)[0] == 0:
                    return
            except TimeoutError:
                pass
        raise TimeoutError(f"no answer on {path}")

    def run(self, cmd, wait=120):
        self.seq += 1
        tag = f"b{os.getpid()}x{self.seq}".encode()
        self.s.sendall(tag + b" " + cmd.encode() + b"\n")
        begin = b"\n@@SLUICE BEGIN " + tag + b"@@\n"
        end_re = re.compile(rb"\n@@SLUICE END " + re.escape(tag) + rb" (-?\d+)@@\n")
        deadline = time.monotonic() + wait
        while True:
            b = self.buf.find(begin)
            if b >= 0:
                m = end_re.search(self.buf, b + len(begin) - 1)
                if m:
                    out = self.buf[b + len(begin):m.start()]
                    self.buf = self.buf[m.end():]
                    return int(m.group(1)), out.decode(errors="replace")
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(cmd)
            self.s.settimeout(left)
            try:
                d = self.s.recv(65536)
            except socket.timeout:
                continue
            if not d:
                raise EOFError("console closed")
            self.buf += d


def iperf(client_run, server_ip):
    out = client_run(f"iperf3 -c {server_ip} -t {SECS} -J")
    return json.loads(out[out.index("{"):])["end"]["sum_received"]["bits_per_second"] / 1e9


def ping_rtt_ms(client_run, ip):
    out = client_run(f"ping -c 100 -i 0.02 -q {ip}")
    m = re.search(r"= [\d.]+/([\d.]+)/", out)
    return float(m.group(1))


def measure(name, vm1, vm2, g1_run, ips):
    """vm1/vm2: Console; g1_run: runs a command in the namespace guest."""
    vm2.run("iperf3 -s -D >/dev/null 2>&1")
    g1_run(f"iperf3 -s -D -p 5201 >/dev/null 2>&1")
    time.sleep(1)
    r = {k: [] for k in ["vm-vm Gbit/s", "vm-ns Gbit/s", "ns-vm Gbit/s", "vm-vm ping ms", "vm-ns ping ms"]}
    c1 = lambda c: vm1.run(c, SECS + 60)[1]
    for _ in range(ROUNDS):
        r["vm-vm Gbit/s"].append(iperf(c1, ips["vm2"]))
        r["vm-ns Gbit/s"].append(iperf(c1, ips["g1"]))
        r["ns-vm Gbit/s"].append(iperf(g1_run, ips["vm2"]))
        r["vm-vm ping ms"].append(ping_rtt_ms(c1, ips["vm2"]))
        r["vm-ns ping ms"].append(ping_rtt_ms(c1, ips["g1"]))
    return {k: statistics.median(v) for k, v in r.items()}


def sluice_path():
    sh(f"{SLUICE} lab down --name {LAB}", check=False)
    st = json.loads(sh(f"{SLUICE} lab up --name {LAB} --guests 1 --vm 2 --datapath user --json"))
    try:
        vms = {g["guest"]: g for g in st["guests"]}
        vm1, vm2 = Console(vms["vm1"]["vm"]["serial"]), Console(vms["vm2"]["vm"]["serial"])
        g1 = lambda c: sh(f"ip netns exec {vms['g1']['netns']} sh -c '{c}'")
        ips = {k: vms[k]["ipv4"].split("/")[0] for k in ["g1", "vm1", "vm2"]}
        img = sh(f"ls -d {os.path.dirname(vms['vm1']['vm']['serial'])}/vm-image-*").split()[0]
        return measure("sluice", vm1, vm2, g1, ips), img
    finally:
        sh(f"{SLUICE} lab down --name {LAB}", check=False)


def bridge_path(img):
    """QEMU's TAP backend (no vhost-net on this kernel) on a Linux bridge, in a namespace."""
    sh(f"ip netns del {BR_NS}", check=False)
    sh(f"ip netns del {G1_NS}", check=False)
    # A new directory (mkdtemp, 0700): QEMU runs as root with files nobody else could plant.
    pids, tmp = [], tempfile.mkdtemp(prefix="sluice-vmb-")
    try:
        sh(f"ip netns add {BR_NS} && ip -n {BR_NS} link set lo up")
        sh(f"ip -n {BR_NS} link add br0 type bridge stp_state 0 forward_delay 0 && ip -n {BR_NS} link set br0 up")
        sh(f"ip netns add {G1_NS} && ip -n {G1_NS} link set lo up")
        sh(f"ip -n {BR_NS} link add g1 type veth peer name eth0 netns {G1_NS}")
        sh(f"ip -n {BR_NS} link set g1 master br0 up && ip -n {G1_NS} link set eth0 up && ip -n {G1_NS} addr add 10.78.0.1/24 dev eth0")
        cons = []
        for k in (1, 2):
            sh(f"ip -n {BR_NS} tuntap add dev tap{k} mode tap vnet_hdr && ip -n {BR_NS} link set tap{k} master br0 up")
            serial = f"{tmp}/vm{k}.serial"
            append = (f"console=ttyS0 quiet panic=-1 cryptomgr.notests=1 rodata=off mitigations=off tsc=reliable "
                      f"no_timer_check sluice.hostname=brvm{k} sluice.ip=10.78.0.{k + 1}/24 sluice.ip6=fd78::{k + 1}/64 sluice.mtu=1500")
            cmd = (f"ip netns exec {BR_NS} qemu-system-x86_64 -name brvm{k} -accel tcg -machine q35,memory-backend=mem "
                   f"-object memory-backend-memfd,id=mem,size=160M,share=on -m 160M -smp 1 -cpu qemu64 "
                   f"-nodefaults -no-user-config -display none -no-reboot -bios /usr/share/qemu/qboot.rom "
                   f"-kernel {img}/vmlinux -initrd {img}/initramfs.cpio -append '{append}' "
                   f"-chardev file,id=ser0,path={tmp}/vm{k}.console -serial chardev:ser0 "
                   f"-chardev socket,id=ser1,path={serial},server=on,wait=off -serial chardev:ser1 "
                   f"-netdev tap,id=n0,ifname=tap{k},script=no,downscript=no "
                   f"-device virtio-net-pci,netdev=n0,mac=52:54:00:78:00:0{k + 1},mrg_rxbuf=on "
                   f"-pidfile {tmp}/vm{k}.pid -daemonize")
            sh(cmd)
            pids.append(int(open(f"{tmp}/vm{k}.pid").read()))
            cons.append(serial)
        vm1, vm2 = Console(cons[0]), Console(cons[1])
        g1 = lambda c: sh(f"ip netns exec {G1_NS} sh -c '{c}'")
        return measure("bridge", vm1, vm2, g1, {"g1": "10.78.0.1", "vm1": "10.78.0.2", "vm2": "10.78.0.3"})
    finally:
        for p in pids:
            try:
                os.kill(p, 15)
            except ProcessLookupError:
                pass
        time.sleep(1)
        sh(f"ip netns del {G1_NS}", check=False)
        sh(f"ip netns del {BR_NS}", check=False)
        sh(f"rm -rf {tmp}", check=False)


def main():
    s, img = sluice_path()
    b = bridge_path(img)
    host = os.uname()
    cpu = re.search(r"model name\s*: (.*)", open("/proc/cpuinfo").read()).group(1)
    print(f"# VM paths: sluice vhost-user vs QEMU TAP on a Linux bridge ({time.strftime('%Y-%m-%d')})\n")
    print(f"Machine: {os.cpu_count()} CPUs ({cpu}), kernel {host.release}; QEMU "
          f"{sh('qemu-system-x86_64 --version').splitlines()[0].split()[3]} under TCG, 1 vCPU and 160 MiB per VM.\n")
    print(f"Command: `sudo bench/vm-paths.py {SECS} {ROUNDS}` — medians of {ROUNDS} rounds; iperf3 runs of {SECS} s; "
          "ping: 100 echo requests 20 ms apart, mean round trip.\n")
    print("| measure | sluice (vhost-user) | Linux bridge (QEMU TAP) | sluice ÷ bridge |")
    print("|---|---:|---:|---:|")
    for k in s:
        ratio = s[k] / b[k] if b[k] else float("nan")
        print(f"| {k} | {s[k]:.3f} | {b[k]:.3f} | {ratio:.2f}× |")


if __name__ == "__main__":
    main()

#!/usr/bin/env bash
# kernel-iperf.sh — iperf3 through the Linux bridge, sluice's kernel datapath, its
# user-space datapath and a direct veth pair, alternating paths round by round in one run.
#
#   bench/kernel-iperf.sh [ROUNDS] [SECONDS]
#
# Prints one line per path, round and stream count (1 and 10): the Gbit/s iperf3 received,
# then a table of the medians. Needs root, sluice on the PATH (or SLUICE=path), iperf3,
# python3. Everything it makes (labs ik/iu, namespaces ib-*, id-*) is removed at the end.
set -euo pipefail
if [ "${1:-}" = --help ] || [ "${1:-}" = -h ]; then sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0; fi
rounds=${1:-3} dur=${2:-5}
S=${SLUICE:-sluice}
export SLUICE_RUN_DIR=${SLUICE_RUN_DIR:-$(mktemp -d /tmp/kernel-iperf.XXXXXX)}
out=$(mktemp /tmp/kernel-iperf.XXXXXX.txt)
cleanup() {
    $S lab down --name ik >/dev/null 2>&1 || true
    $S lab down --name iu >/dev/null 2>&1 || true
    for n in ib-c ib-s ib-br id-c id-s; do ip netns del $n 2>/dev/null || true; done
}
trap cleanup EXIT
cleanup
for n in ib-c ib-s ib-br; do ip netns add $n; ip -n $n link set lo up; done
ip -n ib-br link add br0 type bridge stp_state 0 forward_delay 0; ip -n ib-br link set br0 up
i=1; for g in ib-c ib-s; do
    ip -n ib-br link add p$i type veth peer name eth0 netns $g; ip -n ib-br link set p$i master br0 up
    ip -n $g link set eth0 up; ip -n $g addr add 10.88.0.$i/24 dev eth0; i=$((i + 1))
done
ip netns add id-c; ip netns add id-s; ip -n id-c link add eth0 type veth peer name eth0 netns id-s
for g in id-c id-s; do ip -n $g link set lo up; ip -n $g link set eth0 up; done
ip -n id-c addr add 10.88.0.1/24 dev eth0; ip -n id-s addr add 10.88.0.2/24 dev eth0
$S lab up --name ik --datapath kernel >/dev/null
$S lab up --name iu --datapath user >/dev/null

run() { # label client-ns server-ns address streams
    ip netns exec "$3" timeout $((dur + 30)) iperf3 -s -1 -p 5301 >/dev/null &
    for _ in $(seq 100); do ip netns exec "$3" ss -ltnH 'sport = :5301' | grep -q . && break; sleep 0.05; done
    ip netns exec "$2" timeout $((dur + 30)) iperf3 -c "$4" -p 5301 -t "$dur" -P "$5" -J |
        python3 -c 'import json, sys
e = json.load(sys.stdin)["end"]
print(sys.argv[1], sys.argv[2], "%.2f" % (e["sum_received"]["bits_per_second"] / 1e9))' "$1" "$5" | tee -a "$out"
    wait
}
for r in $(seq "$rounds"); do
    for P in 1 10; do
        run bridge ib-c ib-s 10.88.0.2 $P
        run kernel sluice-ik-g1 sluice-ik-g2 10.77.0.2 $P
        run user sluice-iu-g1 sluice-iu-g2 10.77.0.2 $P
        run direct id-c id-s 10.88.0.2 $P
    done
done
python3 - "$out" <<'PY'
import collections, statistics, sys
cells = collections.defaultdict(list)
for line in open(sys.argv[1]):
    path, p, g = line.split()
    cells[(path, p)].append(float(g))
print("\n| streams | bridge | kernel | user | direct | kernel / bridge |")
print("|--:|--:|--:|--:|--:|--:|")
for p in ("1", "10"):
    m = {k: statistics.median(cells[(k, p)]) for k in ("bridge", "kernel", "user", "direct")}
    print(f"| {p} | {m['bridge']:.1f} | {m['kernel']:.1f} | {m['user']:.1f} | {m['direct']:.1f} | {m['kernel'] / m['bridge']:.2f}× |")
PY

#!/usr/bin/env bash
# hostile.sh — how much of their iperf3 rate two guests keep while two others attack the
# switch: one floods source MACs (100,000 new addresses at 10,000 a second), one sends GSO
# frames asking for 1-byte segments (2,000 a second; cut, each would be 1,400 frames).
# Quiet and attacked rounds alternate in one run, on each datapath and, as the baseline, on
# the Linux bridge (the same four veth guests on a kernel bridge, which floods in the
# kernel and learns every address: it has no per-port limit). A third condition on the
# bridge, "elsewhere", runs the same attackers into interfaces that lead to no switch:
# what the attack costs the machine itself (its CPU), whatever forwards.
#
#   bench/hostile.sh [ROUNDS] [SECONDS]      (defaults: 3 rounds of 10 s)
#
# Prints one line per datapath, round and condition (Gbit/s iperf3 received), whether the
# flooder heard any of the two guests' IPv4 frames, then a table of medians and the ratio
# attacked / quiet. Needs root, sluice on the PATH (or SLUICE=path), iperf3, python3. The
# labs it makes (hu, hk, and the bridge's hb) are removed at the end.
set -euo pipefail
if [ "${1:-}" = --help ] || [ "${1:-}" = -h ]; then sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0; fi
rounds=${1:-3} dur=${2:-10}
S=${SLUICE:-sluice}
H="$(cd "$(dirname "$0")/.." && pwd)/crates/sluice/tests/hostile.py"
R="$(cd "$(dirname "$0")/.." && pwd)/crates/sluice/tests/rawframe.py"
G="$(cd "$(dirname "$0")/.." && pwd)/crates/sluice/tests/gso_send.py"
export SLUICE_RUN_DIR=${SLUICE_RUN_DIR:-$(mktemp -d /tmp/hostile.XXXXXX)}
out=$(mktemp /tmp/hostile.XXXXXX.txt)
cleanup() {
    $S lab down --name hu >/dev/null 2>&1 || true
    $S lab down --name hk >/dev/null 2>&1 || true
    for n in gbr g1 g2 g3 g4 x0 x3 x4; do ip netns del sluice-hb-$n 2>/dev/null || true; done
}
trap cleanup EXIT
cleanup
$S lab up --name hu --datapath user --guests 4 >/dev/null
$S lab up --name hk --datapath kernel --guests 4 >/dev/null
# The baseline: four guests on a Linux bridge in a namespace of its own, named and
# addressed as the labs' guests are.
ip netns add sluice-hb-gbr
ip -n sluice-hb-gbr link add br0 type bridge
ip -n sluice-hb-gbr link set br0 up
for n in 1 2 3 4; do
    ip netns add sluice-hb-g$n
    ip link add hb-g$n netns sluice-hb-g$n type veth peer name p$n netns sluice-hb-gbr
    ip -n sluice-hb-gbr link set p$n master br0 up
    ip -n sluice-hb-g$n addr add 10.77.0.$n/24 dev hb-g$n
    ip -n sluice-hb-g$n link set hb-g$n up
    ip -n sluice-hb-g$n link set lo up
done
# "Elsewhere": the attackers' interfaces lead to an empty namespace.
ip netns add sluice-hb-x0
for n in 3 4; do
    ip netns add sluice-hb-x$n
    ip link add hb-x$n netns sluice-hb-x$n type veth peer name x$n netns sluice-hb-x0
    ip -n sluice-hb-x0 link set x$n up
    ip -n sluice-hb-x$n link set hb-x$n up
done
for lab in hu hk hb; do
    # The flooder (g3) is silent: no addresses, no IPv6; what it hears is someone else's.
    ip netns exec sluice-$lab-g3 sysctl -qw net.ipv6.conf.all.disable_ipv6=1
    ip -n sluice-$lab-g3 addr flush dev $lab-g3
    ip netns exec sluice-$lab-g1 ping -c 2 -W 2 10.77.0.2 >/dev/null
done

run() { # lab condition
    local lab=$1 cond=$2 g=sluice-$1-g
    local m2; m2=$(ip netns exec ${g}2 cat /sys/class/net/$lab-g2/address)
    ip netns exec ${g}2 timeout $((dur + 30)) iperf3 -s -1 -p 5301 >/dev/null &
    for _ in $(seq 100); do ip netns exec ${g}2 ss -ltnH 'sport = :5301' | grep -q . && break; sleep 0.05; done
    local heard=-
    if [ "$cond" = attacked ]; then
        ip netns exec ${g}3 timeout $((dur + 30)) python3 "$H" macflood $lab-g3 $((10000 * dur)) 10000 >/dev/null &
        ip netns exec ${g}4 timeout $((dur + 30)) python3 "$G" $lab-g4 "$m2" 10.77.0.4 10.77.0.2 1 $((2000 * dur)) 2000 >/dev/null &
        heard=$(mktemp /tmp/hostile.XXXXXX.heard)
        ip netns exec ${g}3 timeout $((dur + 30)) python3 "$R" recv $lab-g3 2048 "$dur" >"$heard" 2>/dev/null &
    fi
    if [ "$cond" = elsewhere ]; then
        ip netns exec sluice-$lab-x3 timeout $((dur + 30)) python3 "$H" macflood $lab-x3 $((10000 * dur)) 10000 >/dev/null &
        ip netns exec sluice-$lab-x4 timeout $((dur + 30)) python3 "$G" $lab-x4 "$m2" 10.77.0.4 10.77.0.2 1 $((2000 * dur)) 2000 >/dev/null &
    fi
    ip netns exec ${g}1 timeout $((dur + 30)) iperf3 -c 10.77.0.2 -p 5301 -t "$dur" -J |
        python3 -c 'import json, sys
e = json.load(sys.stdin)["end"]
print(sys.argv[1], sys.argv[2], "%.2f" % (e["sum_received"]["bits_per_second"] / 1e9), end=" ")' "$lab" "$cond" | tee -a "$out"
    wait
    if [ "$heard" != - ]; then heard=$(wc -l <"$heard"); fi
    echo "heard=$heard" | tee -a "$out"
}
for r in $(seq "$rounds"); do
    for lab in hu hk hb; do
        run $lab quiet
        run $lab attacked
        if [ $lab = hb ]; then run $lab elsewhere; fi
    done
done
echo "== the switch's view (last round)"
for lab in hu hk; do
    $S stats --switch $lab --json | python3 -c 'import json, sys
s = json.load(sys.stdin)
for p in s["ports"]:
    c = p["counters"]
    k = p.get("kernel") or {}
    print(sys.argv[1], p["name"], "rx", c["rx_frames"], "learn_refused", c["learn_refused"], "gso_limit", c["rx_drops"]["gso_limit"],
          "flooded", c["flooded"], *(("in the kernel: flooded", k["flooded"], "upcalls", k["upcalls"]) if k else ()))
print(sys.argv[1], "fib entries", s["fib"]["entries"], "of", s["fib"]["max_entries"])' $lab
done
echo "hb bridge fdb entries $(bridge -n sluice-hb-gbr fdb show br br0 | wc -l)"
python3 - "$out" <<'PY'
import collections, statistics, sys
cells = collections.defaultdict(list)
heard = collections.defaultdict(int)
for line in open(sys.argv[1]):
    lab, cond, g, h = line.split()
    cells[(lab, cond)].append(float(g))
    if h != "heard=-":
        heard[lab] += int(h.split("=")[1])
print("\n| path | quiet Gbit/s | attacked Gbit/s | attacked / quiet | IPv4 frames the flooder heard |")
print("|--|--:|--:|--:|--:|")
rows = (("hu", "attacked", "sluice user"), ("hk", "attacked", "sluice kernel"), ("hb", "attacked", "linux-bridge"),
        ("hb", "elsewhere", "attackers elsewhere (no switch)"))
for lab, cond, name in rows:
    q, a = statistics.median(cells[(lab, "quiet")]), statistics.median(cells[(lab, cond)])
    h = heard[lab] if cond == "attacked" else "-"
    print(f"| {name} | {q:.2f} | {a:.2f} | {a / q:.2f} | {h} |")
PY

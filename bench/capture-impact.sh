#!/usr/bin/env bash
# capture-impact.sh — what a running `sluice capture` costs the other ports, in one run:
# iperf3 from guest 2 to guest 3 of a lab, rounds alternating without and with a capture
# of guest 1's port (to a file), while guest 1 pings guest 2 every 10 ms throughout, on
# both datapaths.
#
#   bench/capture-impact.sh [SECONDS] [ROUNDS]
#
# Prints, per datapath, the median Gbit/s of the iperf3 stream without and with the
# capture and their ratio, and how many frames the captures kept. Needs root, sluice on
# the PATH (or SLUICE=path), iperf3, python3. Its labs (ci1, ci2) are removed at the end.
set -euo pipefail
if [ "${1:-}" = --help ] || [ "${1:-}" = -h ]; then sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0; fi
T=${1:-10} rounds=${2:-3}
S=${SLUICE:-sluice}
export SLUICE_RUN_DIR=${SLUICE_RUN_DIR:-$(mktemp -d /tmp/capture-impact.XXXXXX)}
work=$(mktemp -d /tmp/capture-impact.XXXXXX)
cleanup() {
    for n in ci1 ci2; do $S lab down --name $n >/dev/null 2>&1 || true; done
    jobs -p | xargs -r kill 2>/dev/null || true
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

stream() { # lab → Gbit/s of one iperf3 run from g2 to g3
    local ns="sluice-$1-g"
    ip netns exec "${ns}3" timeout $((T + 30)) iperf3 -s -1 -p 5303 >/dev/null &
    local srv=$!
    for _ in $(seq 100); do ip netns exec "${ns}3" ss -ltnH 'sport = :5303' | grep -q . && break; sleep 0.05; done
    ip netns exec "${ns}2" timeout $((T + 30)) iperf3 -c 10.77.0.3 -p 5303 -t "$T" -J |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"]/1e9)'
    wait $srv
}

for dp in user kernel; do
    lab=ci1; [ $dp = kernel ] && lab=ci2
    $S lab up --name $lab --guests 3 --datapath $dp >/dev/null
    port=$($S port list --switch $lab --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["ports"][0]["name"])')
    without=() with=() kept=0
    # Guest 1 pings guest 2 every 10 ms throughout, captured or not: the rounds differ
    # only by the capture.
    ip netns exec "sluice-$lab-g1" timeout $((2 * rounds * (T + 10) + 60)) ping -q -i 0.01 10.77.0.2 >/dev/null 2>&1 &
    pinger=$!
    for r in $(seq "$rounds"); do
        without+=("$(stream $lab)")
        $S capture --switch $lab "$port" -w "$work/$lab.pcap" 2>"$work/$lab.err" &
        cap=$!
        for _ in $(seq 100); do grep -q capturing "$work/$lab.err" 2>/dev/null && break; sleep 0.05; done
        with+=("$(stream $lab)")
        kill -INT $cap; wait $cap || true
        kept=$((kept + $(grep -o '^sluice: [0-9]* frame' "$work/$lab.err" | grep -o '[0-9]*' || echo 0)))
    done
    kill $pinger 2>/dev/null || true; wait $pinger 2>/dev/null || true
    python3 - "$dp" "$kept" "${without[*]}" "${with[*]}" <<'EOF'
import statistics, sys
dp, kept, a, b = sys.argv[1], int(sys.argv[2]), [float(x) for x in sys.argv[3].split()], [float(x) for x in sys.argv[4].split()]
ma, mb = statistics.median(a), statistics.median(b)
print(f"{dp:6} datapath: g2→g3 {ma:.2f} Gbit/s without a capture, {mb:.2f} with one on g1's port "
      f"({mb / ma:.2f}×; rounds {', '.join(f'{x:.2f}' for x in a)} / {', '.join(f'{x:.2f}' for x in b)}); "
      f"{kept} frames captured")
EOF
    $S lab down --name $lab >/dev/null
done

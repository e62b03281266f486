#!/usr/bin/env bash
# stopped-receiver.sh — what a receiver that stops draining does to another guest's stream
# from the same sender, on a lossless sluice switch, in one run: with the defaults (virtual
# output queues: hold_len 64; pause watchdog 200 ms), with the watchdog alone (hold_len 1),
# and with zOVN's Algorithm 1 as published (hold_len 1, no watchdog).
#
#   bench/stopped-receiver.sh [SECONDS] [ROUNDS]
#
# Three guests behind stream-port relays (`lab up --attach stream`): g1 runs iperf3 to g2
# and to g3; after SECONDS the relay of g3 is stopped (SIGSTOP), SECONDS later continued.
# Prints, per configuration and round, g2's mean Gbit/s before, during and after the stop,
# and the watchdog trips. Needs root, sluice on the PATH (or SLUICE=path), iperf3, python3.
# Everything it makes (switches and labs sr1..sr3) is removed at the end.
set -euo pipefail
if [ "${1:-}" = --help ] || [ "${1:-}" = -h ]; then sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0; fi
T=${1:-5} rounds=${2:-1}
S=${SLUICE:-sluice}
export SLUICE_RUN_DIR=${SLUICE_RUN_DIR:-$(mktemp -d /tmp/stopped-receiver.XXXXXX)}
work=$(mktemp -d /tmp/stopped-receiver.XXXXXX)
pids=()
cleanup() {
    for n in sr1 sr2 sr3; do $S lab down --name $n >/dev/null 2>&1 || true; done
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

configs=("sr1 64 200 defaults:_hold_len_64,_watchdog_200_ms" "sr2 1 200 watchdog_alone:_hold_len_1,_watchdog_200_ms"
    "sr3 1 0 zOVN_Algorithm_1:_hold_len_1,_no_watchdog")
for c in "${configs[@]}"; do
    read -r name hold wd _ <<<"$c"
    cat >"$work/$name.toml" <<EOF
name = "$name"
datapath = "user"
lossless = true
hold_len = $hold
watchdog_ms = $wd
EOF
    $S switch run --config "$work/$name.toml" 2>"$work/$name.log" &
    pids+=($!)
    for _ in $(seq 200); do [ -S "$SLUICE_RUN_DIR/$name.sock" ] && break; sleep 0.05; done
    [ -S "$SLUICE_RUN_DIR/$name.sock" ] || { echo "switch $name did not start: $(cat "$work/$name.log")" >&2; exit 1; }
    $S lab up --name "$name" --switch "$name" --guests 3 --attach stream >/dev/null
done

measure() { # name label round
    local name=$1 ns="sluice-$1-g"
    local servers=()
    for g in 2 3; do
        ip netns exec "$ns$g" timeout $((4 * T + 30)) iperf3 -s -1 -p 5302 >/dev/null &
        servers+=($!)
    done
    for g in 2 3; do
        for _ in $(seq 100); do ip netns exec "$ns$g" ss -ltnH 'sport = :5302' | grep -q . && break; sleep 0.05; done
    done
    ip netns exec "${ns}1" timeout $((4 * T + 30)) iperf3 -c 10.77.0.2 -p 5302 -t $((3 * T)) -i 1 -J >"$work/to2.json" &
    local to2=$!
    ip netns exec "${ns}1" timeout $((4 * T + 30)) iperf3 -c 10.77.0.3 -p 5302 -t $((3 * T)) -J >/dev/null &
    local to3=$!
    local relay
    relay=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["guests"][2]["relay_pid"])' \
        "$SLUICE_RUN_DIR/labs/$name.json")
    local trips0
    trips0=$($S stats --switch "$name" --json | python3 -c 'import json,sys; print(sum(c["counters"]["watchdog_trips"] for p in json.load(sys.stdin)["ports"] for c in p["classes"]))')
    sleep "$T"
    kill -STOP "$relay"
    sleep "$T"
    kill -CONT "$relay"
    wait $to2 || true
    wait $to3 || true
    wait "${servers[@]}" || true
    local trips1
    trips1=$($S stats --switch "$name" --json | python3 -c 'import json,sys; print(sum(c["counters"]["watchdog_trips"] for p in json.load(sys.stdin)["ports"] for c in p["classes"]))')
    python3 - "$work/to2.json" "$T" "$2" "$3" $((trips1 - trips0)) <<'PY'
import json, sys
f, T, label, rnd, trips = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
try:
    iv = json.load(open(f))["intervals"]
except Exception:
    iv = []
def mean(lo, hi):
    # Whole seconds inside [lo+1, hi): the second around each change is left out.
    xs = [i["sum"]["bits_per_second"] / 1e9 for i in iv if lo + 1 <= i["sum"]["start"] and i["sum"]["end"] <= hi]
    return sum(xs) / len(xs) if xs else float("nan")
b, d, a = mean(0, T), mean(T, 2 * T), mean(2 * T, 3 * T)
print(f"{label} round {rnd}: g2 before {b:.2f}  during {d:.2f}  after {a:.2f} Gbit/s  during/before {d / b if b else float('nan'):.2f}  watchdog trips {trips}")
PY
}
for r in $(seq "$rounds"); do
    for c in "${configs[@]}"; do
        read -r name _ _ label <<<"$c"
        measure "$name" "${label//_/ }" "$r"
    done
done

#!/usr/bin/env bash
# smc-cost.sh — what a change to the shared-memory fast path costs, measured in one run:
# `sluice bench` on loopback with both ends under `sluice smc run`, two sluice builds
# alternating round by round (which goes first alternates too), and plain TCP loopback
# beside them. One connection; connect-request-response (a handshake per transaction),
# request-response and streaming.
#
#   bench/smc-cost.sh OLD_SLUICE NEW_SLUICE [ROUNDS] [SECONDS]
#
# Each build gets a runtime directory of its own (SLUICE_RUN_DIR), so builds with
# different layouts do not meet. Prints one line per cell
# (build profile transactions/s MB/s mean-µs) and a summary of medians.
# Needs root only if the runtime directory does (it is under $TMPDIR here).
set -euo pipefail

if [ $# -lt 2 ] || [ "$1" = --help ] || [ "$1" = -h ]; then
    sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
fi
old=$1 new=$2 rounds=${3:-3} dur=${4:-5}
work=$(mktemp -d "${TMPDIR:-/tmp}/smc-cost.XXXXXX")
chmod 755 "$work"
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
port=$((28000 + $$ % 2000))
out=$work/cells

cell() { # label binary under-launcher(0|1) profile
    local label=$1 bin=$2 smc=$3 prof=$4 dir=$work/$1 pre=()
    mkdir -p "$dir"
    [ "$smc" = 1 ] && pre=("$bin" smc run --)
    port=$((port + 1))
    SLUICE_RUN_DIR=$dir "${pre[@]}" "$bin" bench serve --listen 127.0.0.1 --port $port >/dev/null 2>&1 &
    local server=$!
    for _ in $(seq 100); do ss -ltnH "sport = :$port" | grep -q . && break; sleep 0.05; done
    SLUICE_RUN_DIR=$dir timeout $((dur + 60)) "${pre[@]}" "$bin" bench run --to 127.0.0.1:$port -m "$prof" \
        --duration "$dur" --conns 1 --json 2>/dev/null |
        python3 -c 'import json, sys
r = json.load(sys.stdin)["results"][0]
print(sys.argv[1], sys.argv[2], "%.1f %.2f %.1f" % (r["tps"], r["mb_per_s"], r["latency"]["mean_us"]))' "$label" "$prof" |
        tee -a "$out"
    kill $server 2>/dev/null || true
    wait $server 2>/dev/null || true
}

for r in $(seq "$rounds"); do
    for prof in crr-64x8k rr1c-200x1000 str-readx30k; do
        if [ $((r % 2)) = 1 ]; then cell old "$old" 1 $prof; cell new "$new" 1 $prof
        else cell new "$new" 1 $prof; cell old "$old" 1 $prof; fi
        cell tcp "$new" 0 $prof
    done
done

python3 - "$out" <<'PY'
import collections, statistics, sys
cells = collections.defaultdict(list)
for line in open(sys.argv[1]):
    label, prof, tps, _, _ = line.split()
    cells[(label, prof)].append(float(tps))
print("\n| profile | old (tx/s) | new (tx/s) | TCP loopback | new / old |")
print("|---|--:|--:|--:|--:|")
for prof in ("crr-64x8k", "rr1c-200x1000", "str-readx30k"):
    m = {k: statistics.median(cells[(k, prof)]) for k in ("old", "new", "tcp")}
    print(f"| {prof} | {m['old']:,.0f} | {m['new']:,.0f} | {m['tcp']:,.0f} | {m['new'] / m['old']:.2f}× |")
PY

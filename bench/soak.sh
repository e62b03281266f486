#!/usr/bin/env bash
# soak.sh — an hour of mixed load on one switch, and what it leaves behind.
#
#   bench/soak.sh [MINUTES] [DATAPATH] [OUT.md]     (defaults: 60, user, soak-DATAPATH.md)
#
# A lab of four guests on DATAPATH (user or kernel); round after round until MINUTES have
# passed: sluice bench request-response (rr-200x1000, 4 connections), connect-request-
# response (crr-64x8k), streaming (str-20x20m), partition-aggregate (pa, three workers),
# iperf3 UDP at 200 Mbit/s, the shared-memory fast path (`sluice smc run` on both ends of
# a request-response run inside one guest), and five ports added and removed; 10 s each.
# After every round it samples the daemon's resident memory and open descriptors, and the
# fast path's registry entries. At the end it checks, and writes to OUT.md with the
# samples: RSS once warm (after a tenth of the rounds, at least three: the first rounds
# fill the frame pool and the allocator's arenas) vs the last (flat within 10%), descriptors flat, the
# counters' conservation rules, and that nothing is left: no namespace, interface,
# registry entry or shared-memory segment the run made. Exits 1 if a check fails.
# Needs root, sluice on the PATH (or SLUICE=path), iperf3, python3.
set -euo pipefail
if [ "${1:-}" = --help ] || [ "${1:-}" = -h ]; then sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0; fi
minutes=${1:-60} dp=${2:-user} md=${3:-soak-$dp.md}
S=${SLUICE:-sluice}
case $dp in user|kernel) ;; *) echo "soak.sh: DATAPATH is user or kernel" >&2; exit 2 ;; esac
run=$(mktemp -d /tmp/soak.XXXXXX)
export SLUICE_RUN_DIR=$run
lab=soak$$
extra=sluice-$lab-x
samples=$run/samples.csv
log=$run/rounds.log
fail=0
cleanup() {
    kill $(jobs -p) 2>/dev/null || true
    $S lab down --name $lab >/dev/null 2>&1 || true
    ip netns del $extra 2>/dev/null || true
    rm -rf "$run"
}
trap cleanup EXIT

shm_before=$(ls /dev/shm | wc -l)
$S lab up --name $lab --datapath "$dp" --guests 4 >/dev/null
ip netns add $extra
g() { echo sluice-$lab-g$1; }
pid=$($S stats --switch $lab --json | python3 -c 'import json, sys; print(json.load(sys.stdin)["switch"]["pid"])')
for i in 2 3 4; do
    ip netns exec "$(g $i)" $S bench serve --port 20000 >/dev/null 2>&1 &
done
for i in 2 3 4; do
    for _ in $(seq 100); do ip netns exec "$(g $i)" ss -ltnH 'sport = :20000' | grep -q . && break; sleep 0.05; done
done
echo "t_s,round,rss_kb,fds,smc_entries" >"$samples"
sample() { # round
    local rss fds smc
    rss=$(awk '/^VmRSS:/ {print $2}' /proc/$pid/status)
    fds=$(ls /proc/$pid/fd | wc -l)
    smc=$(find "$run/smc" -mindepth 2 -maxdepth 2 \( -path '*/listen/*' -o -path '*/door/*' -o -path '*/intent/*' -o -path '*/conn/*' \) 2>/dev/null | wc -l)
    echo "$(($(date +%s) - start)),$1,$rss,$fds,$smc" >>"$samples"
}
bench() { # guest profile [args…]
    local gi=$1; shift
    ip netns exec "$(g $gi)" timeout 60 $S bench run --to 10.77.0.2 --duration 10 --json "$@" >/dev/null 2>>"$log" ||
        { echo "round $round: bench $* failed" | tee -a "$log"; fail=1; }
}
start=$(date +%s)
end=$((start + minutes * 60))
round=0
while [ "$(date +%s)" -lt $end ]; do
    round=$((round + 1))
    bench 1 -m rr-200x1000 --conns 4
    bench 1 -m crr-64x8k
    bench 1 -m str-20x20m
    ip netns exec "$(g 1)" timeout 60 $S bench run -m pa --workers 10.77.0.2,10.77.0.3,10.77.0.4 --duration 10 --json \
        >/dev/null 2>>"$log" || { echo "round $round: pa failed" | tee -a "$log"; fail=1; }
    ip netns exec "$(g 3)" timeout 40 iperf3 -s -1 -p 5301 >/dev/null 2>&1 &
    udp_server=$!
    for _ in $(seq 100); do ip netns exec "$(g 3)" ss -ltnH 'sport = :5301' | grep -q . && break; sleep 0.05; done
    ip netns exec "$(g 1)" timeout 40 iperf3 -u -b 200M -c 10.77.0.3 -p 5301 -t 10 >/dev/null 2>>"$log" ||
        { echo "round $round: iperf3 -u failed" | tee -a "$log"; fail=1; }
    wait $udp_server 2>/dev/null || true
    # The fast path: both ends under the launcher, inside guest 4.
    ip netns exec "$(g 4)" timeout 40 $S smc run -- $S bench serve --listen 127.0.0.1 --port 20001 >/dev/null 2>&1 &
    smc_server=$!
    for _ in $(seq 100); do ip netns exec "$(g 4)" ss -ltnH 'sport = :20001' | grep -q . && break; sleep 0.05; done
    ip netns exec "$(g 4)" timeout 60 $S smc run -- $S bench run --to 127.0.0.1:20001 -m rr-200x1000 --duration 10 \
        --json >/dev/null 2>>"$log" || { echo "round $round: smc run failed" | tee -a "$log"; fail=1; }
    kill -TERM $smc_server 2>/dev/null || true
    wait $smc_server 2>/dev/null || true
    # Ports come and go while nothing else runs on them.
    for i in 1 2 3 4 5; do
        $S port add $lab-x$i --netns $extra --switch $lab >/dev/null 2>>"$log" || fail=1
    done
    for i in 1 2 3 4 5; do
        $S port del $lab-x$i --switch $lab >/dev/null 2>>"$log" || fail=1
    done
    sample $round
    echo "round $round done at $(($(date +%s) - start)) s" >>"$log"
done

# The end: conservation, then what is left.
stats=$($S stats --switch $lab --json)
conserved=$(echo "$stats" | python3 -c '
import json, sys
s = json.load(sys.stdin)
d = s["departed"]
copies, offered, bad = d["copies"] + d["generated"], d["tx_offered"], []
for p in s["ports"]:
    c = p["counters"]
    drops = lambda k: sum(c[k].values())
    i = c["forwarded"] + c["flooded"] + c["consumed"] + drops("rx_drops") + p["held"] + p["resolving"] + p.get("upcall", 0)
    n = p["name"]
    if c["rx_frames"] != i: bad.append("%s in %d != %d" % (n, c["rx_frames"], i))
    o = c["tx_frames"] + drops("tx_drops") + p["queued"]
    if c["tx_offered"] != o: bad.append("%s out %d != %d" % (n, c["tx_offered"], o))
    copies += c["copies"] + c["generated"]; offered += c["tx_offered"]
if copies != offered: bad.append("copies %d != offered %d" % (copies, offered))
print("yes" if not bad else "NO: " + "; ".join(bad))')
kill $(jobs -p) 2>/dev/null || true
wait 2>/dev/null || true
$S lab down --name $lab >/dev/null
ip netns del $extra
# What this run made carries its lab's name (other work may add or remove its own meanwhile).
netns_left=$(ip netns list | grep -c -- "$lab" || true)
links_left=$(ip -o link | grep -c -- "$lab" || true)
shm_after=$(ls /dev/shm | wc -l)
smc_left=$(find "$run/smc" -mindepth 2 -maxdepth 2 \( -path '*/listen/*' -o -path '*/door/*' -o -path '*/intent/*' -o -path '*/conn/*' \) 2>/dev/null | wc -l)

python3 - "$samples" "$md" "$dp" "$minutes" "$conserved" "$netns_left" "$links_left" \
    "$shm_before" "$shm_after" "$smc_left" "$fail" <<'PY'
import csv, sys
samples, md, dp, minutes, conserved = sys.argv[1:6]
netns_left, links_left, sb, sa, smc_left, fail = map(int, sys.argv[6:12])
rows = list(csv.DictReader(open(samples)))
warm = rows[min(len(rows) - 1, max(2, len(rows) // 10))]
last = rows[-1]
rss0, rss1 = int(warm["rss_kb"]), int(last["rss_kb"])
fd0, fd1 = int(rows[0]["fds"]), int(last["fds"])
peak = max(int(r["rss_kb"]) for r in rows)
checks = [
    (f"daemon RSS, round {warm['round']} → last (round 1: {rows[0]['rss_kb']} kB)",
     f"{rss0} kB → {rss1} kB ({(rss1 - rss0) / rss0:+.1%}; peak {peak} kB)", abs(rss1 - rss0) <= rss0 * 0.10),
    ("daemon descriptors, round 1 → last", f"{fd0} → {fd1}", fd1 <= fd0),
    ("counters conserve at the end", conserved, conserved == "yes"),
    ("namespaces of the run left", f"{netns_left}", netns_left == 0),
    ("interfaces of the run left (host namespace)", f"{links_left}", links_left == 0),
    ("/dev/shm entries left", f"{sa - sb}", sa == sb),
    ("fast-path registry entries left", f"{smc_left}", smc_left == 0),
    ("every workload ran", "yes" if not fail else "NO (see the rounds log)", not fail),
]
with open(md, "w") as f:
    f.write(f"Soak: {minutes} min on the {dp} datapath, {len(rows)} rounds\n\n")
    f.write("| check | result | holds |\n|--|--|--|\n")
    for name, result, ok in checks:
        f.write(f"| {name} | {result} | {'yes' if ok else '**no**'} |\n")
    f.write("\nSamples after each round (daemon resident memory, open descriptors, fast-path registry entries):\n\n")
    f.write("| t (s) | round | RSS (kB) | fds | registry entries |\n|--:|--:|--:|--:|--:|\n")
    step = max(1, len(rows) // 20)
    for r in rows[::step] + ([rows[-1]] if (len(rows) - 1) % step else []):
        f.write(f"| {r['t_s']} | {r['round']} | {r['rss_kb']} | {r['fds']} | {r['smc_entries']} |\n")
print(open(md).read())
sys.exit(0 if all(ok for _, _, ok in checks) else 1)
PY

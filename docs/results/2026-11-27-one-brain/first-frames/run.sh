#!/bin/bash
# First-packet cost on the kernel datapath, two builds interleaved: for each sample a fresh
# lab (switch + 2 veth guests, nothing learned), then `ping -c 6` from g1 to g2. The first
# RTT includes ARP and every first frame of a kind going up to the core; RTTs 2..6 are the
# kernel's alone. Usage: run.sh SAMPLES BUILD_A BUILD_B
set -u
N=${1:-10}; A=$2; B=$3
echo "build,sample,first_ms,rest_median_ms"
for i in $(seq 1 "$N"); do
  for pair in "new:$A" "before:$B"; do
    tag=${pair%%:*}; bin=${pair#*:}
    name="fp$i${tag:0:1}"
    "$bin" lab up --name "$name" --guests 2 --datapath kernel >/dev/null 2>&1 || { echo "lab up failed: $tag" >&2; continue; }
    out=$(timeout 20 ip netns exec "sluice-$name-g1" ping -c 6 -i 0.2 -W 2 10.77.0.2 2>&1)
    "$bin" lab down --name "$name" >/dev/null 2>&1
    rtts=$(echo "$out" | sed -n 's/.*time=\([0-9.]*\) ms/\1/p')
    first=$(echo "$rtts" | head -1)
    rest=$(echo "$rtts" | tail -n +2 | sort -n | awk '{a[NR]=$1} END {print (NR%2? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}')
    echo "$tag,$i,$first,$rest"
  done
done

#!/usr/bin/env bash
# kernel-upcalls.sh — what the kernel datapath's upcalls cost, measured in one run: the
# first packet between two stations the switch has not learned (both frames of a ping go
# up to the core and come back down) against the packets after it, and how fast frames the
# kernel cannot decide (unknown unicast, flooded by the core) get through — on sluice's
# kernel datapath, its user-space datapath, and the Linux bridge.
#
#   bench/kernel-upcalls.sh [SAMPLES] [FLOOD_SECONDS]
#
# Needs root, sluice on the PATH (or SLUICE=path), python3, iproute2. Everything it makes
# (labs kup/kuu, namespaces kub-*) is removed at the end, even on failure.
set -euo pipefail
if [ "${1:-}" = --help ] || [ "${1:-}" = -h ]; then sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0; fi
samples=${1:-20} secs=${2:-3}
S=${SLUICE:-sluice}
export SLUICE_RUN_DIR=${SLUICE_RUN_DIR:-$(mktemp -d /tmp/kernel-upcalls.XXXXXX)}
cleanup() {
    $S lab down --name kup >/dev/null 2>&1 || true
    $S lab down --name kuu >/dev/null 2>&1 || true
    for n in kub-c kub-s kub-br; do ip netns del $n 2>/dev/null || true; done
}
trap cleanup EXIT
cleanup

$S lab up --name kup --datapath kernel >/dev/null
$S lab up --name kuu --datapath user >/dev/null
for n in kub-c kub-s kub-br; do ip netns add $n; ip -n $n link set lo up; done
ip -n kub-br link add br0 type bridge stp_state 0 forward_delay 0 ageing_time 1000; ip -n kub-br link set br0 up
i=1; for g in kub-c kub-s; do
    ip -n kub-br link add p$i type veth peer name eth0 netns $g; ip -n kub-br link set p$i master br0 up
    ip -n $g link set eth0 up; ip -n $g addr add 10.77.0.$i/24 dev eth0; i=$((i + 1))
done

mac() { ip -n "$1" -br link show "$2" | awk '{print $3}'; }
# Static neighbours: no ARP, so a ping is two frames, both unicast.
for pair in "kup sluice-kup-g1 kup-g1 sluice-kup-g2 kup-g2" "kuu sluice-kuu-g1 kuu-g1 sluice-kuu-g2 kuu-g2" "bridge kub-c eth0 kub-s eth0"; do
    set -- $pair
    ip -n "$2" neigh replace 10.77.0.2 lladdr "$(mac "$4" "$5")" dev "$3" nud permanent
    ip -n "$4" neigh replace 10.77.0.1 lladdr "$(mac "$2" "$3")" dev "$5" nud permanent
done

rtt() { ip netns exec "$1" ping -c 1 -W 1 10.77.0.2 | sed -n 's/.*time=\([0-9.]*\) ms.*/\1/p'; }
median() { sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }

echo "first-packet latency (ms; median of $samples): a ping between stations the switch has forgotten, then the next"
for path in kernel user bridge; do
    first=() next=()
    for _ in $(seq "$samples"); do
        case $path in
            kernel) lab=kup ;;
            user) lab=kuu ;;
        esac
        if [ $path = bridge ]; then
            ip -n kub-br link set br0 type bridge ageing_time 0 >/dev/null 2>&1 || true
            bridge -n kub-br fdb flush dev br0 2>/dev/null || ip netns exec kub-br bridge fdb flush dev br0 2>/dev/null || true
            ns=kub-c
        else
            for g in 1 2; do $S fib del "$(mac sluice-$lab-g$g $lab-g$g)" --switch $lab >/dev/null 2>&1 || true; done
            ns=sluice-$lab-g1
        fi
        first+=("$(rtt $ns)")
        next+=("$(rtt $ns)")
    done
    printf '  %-7s first %s  next %s\n' "$path" "$(printf '%s\n' "${first[@]}" | median)" "$(printf '%s\n' "${next[@]}" | median)"
done

echo "flood throughput ($secs s of 64-byte UDP to a station nobody knows: every frame is flooded)"
cat > "$SLUICE_RUN_DIR/udp.py" <<'PY'
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
end, n, b = time.time() + float(sys.argv[1]), 0, b"x" * 22
while time.time() < end:
    for _ in range(256):
        s.sendto(b, ("10.77.0.99", 9))
    n += 256
print(n)
PY
for pair in "kernel sluice-kup-g1 kup-g1 sluice-kup-g2 kup-g2" "user sluice-kuu-g1 kuu-g1 sluice-kuu-g2 kuu-g2" "bridge kub-c eth0 kub-s eth0"; do
    set -- $pair
    ip -n "$2" neigh replace 10.77.0.99 lladdr 02:00:00:00:99:99 dev "$3" nud permanent
    before=$(ip netns exec "$4" cat /sys/class/net/"$5"/statistics/rx_packets)
    sent=$(ip netns exec "$2" python3 "$SLUICE_RUN_DIR/udp.py" "$secs")
    sleep 0.5
    after=$(ip netns exec "$4" cat /sys/class/net/"$5"/statistics/rx_packets)
    got=$((after - before))
    printf '  %-7s sent %6d frames/s, the other guest got %6d frames/s (%d%%)\n' "$1" $((sent / secs)) $((got / secs)) $((100 * got / sent))
done

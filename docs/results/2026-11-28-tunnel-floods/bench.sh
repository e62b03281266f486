#!/usr/bin/env bash
# Floods into a VXLAN tunnel on the kernel datapath: datagrams a second reaching the
# tunnel's three remote endpoints while a guest sends frames to an unknown MAC address
# (unknown unicast, flooded) as fast as one Python loop on a packet socket can.
#
#   bench.sh BEFORE_SLUICE AFTER_SLUICE [ROUNDS] [SECONDS]
#
# Each round runs the same switch (kernel datapath: a guest on a veth pair, a vxlan port
# to 192.168.77.2-4) with each binary in turn, in namespaces of its own (names from
# mktemp, removed on exit, even on failure), and prints one line per binary per round:
# frames sent, datagrams received per endpoint (the endpoints' underlay interface RX
# packets), the guest port's upcalls and upcall_limit drops, CPU steal during the round
# (/proc/stat) and the 1-minute load. As root.
set -euo pipefail
BEFORE=$1 AFTER=$2 ROUNDS=${3:-3} SECS=${4:-5}
[ "$(id -u)" = 0 ] || { echo "bench.sh: run as root (network namespaces, BPF)" >&2; exit 1; }
WORK=$(mktemp -d /tmp/sluice-floodbench-XXXXXX)
TAG=fb$(basename "$WORK" | tail -c 5 | tr -dc 'a-z0-9')
export SLUICE_RUN_DIR=$WORK/run
mkdir -m 0755 "$SLUICE_RUN_DIR"
NS=()
SW_PID=
cleanup() {
    [ -n "$SW_PID" ] && { "$CUR" switch stop --switch "${TAG}s" >/dev/null 2>&1 || true; sleep 1; kill "$SW_PID" 2>/dev/null || true; }
    for n in "${NS[@]}"; do ip netns del "$n" 2>/dev/null || true; done
    ip link del "${TAG}t" 2>/dev/null || true
    umount "$SLUICE_RUN_DIR/bpf" 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT
addns() { ip netns add "$1"; ip -n "$1" link set lo up; NS+=("$1"); }

addns "${TAG}ul"
ip -n "${TAG}ul" link add br0 type bridge stp_state 0 forward_delay 0
ip -n "${TAG}ul" link set br0 up
for i in 1 2 3 4; do
    addns "${TAG}h$i"
    ip -n "${TAG}ul" link add "u$i" type veth peer name u0 netns "${TAG}h$i"
    ip -n "${TAG}ul" link set "u$i" master br0 up
    ip -n "${TAG}h$i" addr add "192.168.77.$i/24" dev u0
    ip -n "${TAG}h$i" link set u0 up
done
ip netns exec "${TAG}h1" ethtool -K u0 tx off >/dev/null
addns "${TAG}g1"
# Endpoints count what arrives on their underlay interface (RX packets); they answer with
# at most one ICMP port unreachable each.
for i in 2 3 4; do ip netns exec "${TAG}h$i" sysctl -qw net.ipv4.icmp_ratelimit=1000000; done

cat > "$WORK/send.py" <<'PY'
import socket, sys, time
iface, secs = sys.argv[1], float(sys.argv[2])
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
s.bind((iface, 0))
src = open(f"/sys/class/net/{iface}/address").read().strip()
dst = bytes.fromhex("020000009999")
udp = bytes(8 + 72)
ip = bytes([0x45, 0, 0, 100, 0, 0, 0, 0, 64, 17, 0, 0, 10, 78, 0, 1, 10, 78, 0, 200])
f = dst + bytes.fromhex(src.replace(":", "")) + b"\x08\x00" + ip + udp
n, end = 0, time.time() + secs
while time.time() < end:
    for _ in range(256):
        try:
            s.send(f)
            n += 1
        except OSError:
            pass
print(n)
PY

rx() { ip -n "$1" -s -j link show u0 | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["stats64"]["rx"]["packets"])'; }
steal() { awk '/^cpu /{print $9, $2+$3+$4+$5+$6+$7+$8+$9}' /proc/stat; }

run_one() { # LABEL BINARY
    CUR=$2
    local name="${TAG}s"
    ip link add "${name}t" type veth peer name "${name}t" netns "${TAG}g1"
    cat > "$WORK/sw.toml" <<TOML
name = "$name"
datapath = "kernel"
[[port]]
name = "${name}t"
type = "veth"
[[port]]
name = "vx0"
type = "vxlan"
netns = "${TAG}h1"
local = "192.168.77.1"
remotes = ["192.168.77.2", "192.168.77.3", "192.168.77.4"]
vni = 5000
TOML
    "$CUR" switch run --config "$WORK/sw.toml" 2>"$WORK/$1.log" >/dev/null &
    SW_PID=$!
    for _ in $(seq 100); do "$CUR" port list --switch "$name" >/dev/null 2>&1 && break; sleep 0.1; done
    ip -n "${TAG}g1" link set "${name}t" up
    ip -n "${TAG}g1" addr add 10.78.0.1/24 dev "${name}t" 2>/dev/null || true
    for i in 2 3 4; do ip netns exec "${TAG}h1" ping -c 1 -W 5 "192.168.77.$i" >/dev/null; done
    ip netns exec "${TAG}g1" python3 "$WORK/send.py" "${name}t" 0.5 >/dev/null
    sleep 1
    local a2 a3 a4 b2 b3 b4 s0 s1 sent st
    a2=$(rx "${TAG}h2"); a3=$(rx "${TAG}h3"); a4=$(rx "${TAG}h4"); s0=$(steal)
    sent=$(ip netns exec "${TAG}g1" python3 "$WORK/send.py" "${name}t" "$SECS")
    sleep 1
    b2=$(rx "${TAG}h2"); b3=$(rx "${TAG}h3"); b4=$(rx "${TAG}h4"); s1=$(steal)
    st=$("$CUR" stats --switch "$name" --json)
    python3 - "$1" "$SECS" "$sent" "$((b2-a2))" "$((b3-a3))" "$((b4-a4))" "$s0" "$s1" "$st" "$(cut -d' ' -f1 /proc/loadavg)" "$name" <<'PY'
import json, sys
label, secs, sent, e2, e3, e4 = sys.argv[1], float(sys.argv[2]), *map(int, sys.argv[3:7])
(st0, t0), (st1, t1) = [tuple(map(int, a.split())) for a in sys.argv[7:9]]
st, load, name = json.loads(sys.argv[9]), sys.argv[10], sys.argv[11]
g = next(p for p in st["ports"] if p["name"] == name + "t")
k = g.get("kernel") or {}
print(f"{label:6} sent {sent/secs:9.0f}/s  endpoints {e2/secs:8.0f} {e3/secs:8.0f} {e4/secs:8.0f} /s"
      f"  upcalls {k.get('upcalls', 0):8}  upcall_limit {g['counters']['rx_drops'].get('upcall_limit', 0):8}"
      f"  steal {100*(st1-st0)/max(1, t1-t0):4.1f}%  load {load}")
PY
    "$CUR" switch stop --switch "$name" >/dev/null 2>&1 || true
    wait "$SW_PID" 2>/dev/null || true
    SW_PID=
    ip link del "${name}t" 2>/dev/null || true
}

echo "# $(date -u +%FT%TZ) $(uname -r) $(nproc) CPUs; ${SECS}s each; before=$BEFORE after=$AFTER"
for r in $(seq "$ROUNDS"); do
    run_one before "$BEFORE"
    run_one after "$AFTER"
done

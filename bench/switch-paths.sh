#!/usr/bin/env bash
# switch-paths.sh — compare virtual-network paths between two guests (two network
# namespaces): a direct veth pair, a Linux bridge, Open vSwitch's user-space (netdev)
# datapath with TAP ports (userspace TSO off and on), and sluice (event-driven and
# busy-polling). Every path is measured in one run, with the same CPU placement.
# Run with --help for the options; everything it creates is removed on exit.
set -euo pipefail

usage() {
    cat <<'EOF'
Usage: bench/switch-paths.sh [options]

Measure virtual-network paths between two guests (network namespaces), all in one run
with the same CPU placement, and print a markdown report.

Paths (default: all of them; unavailable ones are skipped with a note):
  direct         a veth pair between the two namespaces
  linux-bridge   each guest has a veth to a Linux bridge in a third (switch) namespace
  ovs-user       Open vSwitch, user-space (netdev) datapath, type=tap ports,
                 other_config:userspace-tso-enable=false
  ovs-user-tso   the same with userspace-tso-enable=true
  sluice         `sluice lab up` (a sluice switch with two TAP guests)
  sluice-poll    the same with the switch busy-polling (`sluice lab up --poll`), if
                 `sluice switch run --help` lists --poll

Measurements per path (each bounded by --duration):
  single stream   iperf3 -c in guest 1 against iperf3 -s in guest 2 (Gbit/s received)
  10 streams      10 iperf3 servers on 10 ports and 10 iperf3 clients at once (summed)
  RR round trip   sockperf ping-pong, TCP, 200-byte messages: average ROUND TRIP in µs
                  (sockperf --full-rtt; without it sockperf prints RTT/2)
  host CPU s/GB   busy time of all CPUs (/proc/stat) during the single-stream run,
                  divided by the GB (1e9 bytes) received
  switch CPU s/GB CPU time (utime+stime, all threads) of the switch process during the
                  single-stream run (ovs-vswitchd, the sluice daemon) per GB

Options:
  --paths LIST    comma-separated paths to run (default: all, in the order above)
  --duration S    seconds per measurement (default 10, 1–600)
  --reps N        repetitions (default 1); with N>1 the report shows the median and the
                  min–max range; repetitions are interleaved (path order repeated N times)
  --mtu MTU       MTU of every path's interfaces (default 1500, 576–9000)
  --pin           pin the iperf3/sockperf clients to CPU 0 and the servers to CPU 1
                  (taskset), for every path alike. Default: no pinning for anything.
                  Switch daemons are never pinned.
  --wait-idle S   before the run and before each path, wait up to S seconds for the
                  machine to be quiet (at most 10% of all CPUs busy over 1 s; default
                  0: do not wait). The load seen is reported either way, and a path
                  that started on a busy machine gets a note.
  --out FILE      also write the report to FILE
  --keep-logs     keep the raw outputs (iperf3 JSON, sockperf, OVS logs) in
                  /tmp/switch-paths.swpPID.* (always kept when the run fails)
  -h, --help      this help

Environment:
  SLUICE          the sluice binary (default: `sluice` on PATH)

Examples:
  bench/switch-paths.sh --duration 5                      # every path, quick
  bench/switch-paths.sh --reps 3 --wait-idle 300 --out report.md
  bench/switch-paths.sh --paths linux-bridge,sluice,sluice-poll --pin --mtu 9000

Guests: namespaces swpPID-g1/-g2 with 10.231.N.1/24 and 10.231.N.2/24 (fd31:N::1/64,
fd31:N::2/64; N = 1 direct, 2 linux-bridge, 3 ovs), the Linux bridge in swpPID-sw;
sluice's lab makes sluice-swpPID-g1/-g2 with 10.77.0.1/24 and 10.77.0.2/24. Traffic
runs guest 1 (client) → guest 2 (server) over IPv4.

Needs root, iproute2, iperf3, sockperf, jq, ethtool (and taskset for --pin,
openvswitch-switch for the ovs paths). Progress goes to stderr, the report to stdout.
Everything it creates (namespaces swpPID-*, an OVS bridge, OVS daemons it started, a
sluice lab) is removed on exit, also on failure or Ctrl-C.

OVS: if an ovs-vswitchd is already running (default run directory), its database is
used, a bridge is added and deleted afterwards, and a path whose
userspace-tso-enable differs from the running setting is skipped (changing it needs a
daemon restart, which this script does not do to a daemon it did not start). Otherwise
the script starts its own ovsdb-server and ovs-vswitchd with a private database and run
directory in a temporary directory, inside a private network namespace (so OVS's TAP
devices and its ovs-netdev device are never in the host's namespace), fresh for each
ovs path, and stops them afterwards; /etc/openvswitch is not touched (ovs-ctl is not
used: it writes the system database and may modprobe, or rmmod the bridge module).
TAP ports are not PMD ports: the ovs-vswitchd main thread polls them, so pmd-cpu-mask
and n-rxq change nothing here; userspace TSO is what matters (see the report's notes).
EOF
}

# ---------------------------------------------------------------- options
ALL_PATHS=(direct linux-bridge ovs-user ovs-user-tso sluice sluice-poll)
DURATION=10
REPS=1
MTU=1500
PIN=0
OUT=""
PATHS_ARG=""
CMDLINE=$0
for a in "$@"; do
    if [[ $a =~ ^[A-Za-z0-9_./,:=@%+-]+$ ]]; then CMDLINE+=" $a"; else CMDLINE+=" $(printf '%q' "$a")"; fi
done
WAIT_IDLE=0
KEEP_LOGS=0

die() { echo "switch-paths: $*" >&2; exit 2; }

while (($#)); do
    case $1 in
        -h|--help) usage; exit 0 ;;
        --paths) (($# >= 2)) || die "--paths needs a value"; PATHS_ARG=$2; shift 2 ;;
        --paths=*) PATHS_ARG=${1#*=}; shift ;;
        --duration) (($# >= 2)) || die "--duration needs a value"; DURATION=$2; shift 2 ;;
        --duration=*) DURATION=${1#*=}; shift ;;
        --reps) (($# >= 2)) || die "--reps needs a value"; REPS=$2; shift 2 ;;
        --reps=*) REPS=${1#*=}; shift ;;
        --mtu) (($# >= 2)) || die "--mtu needs a value"; MTU=$2; shift 2 ;;
        --mtu=*) MTU=${1#*=}; shift ;;
        --pin) PIN=1; shift ;;
        --keep-logs) KEEP_LOGS=1; shift ;;
        --wait-idle) (($# >= 2)) || die "--wait-idle needs a value"; WAIT_IDLE=$2; shift 2 ;;
        --wait-idle=*) WAIT_IDLE=${1#*=}; shift ;;
        --out) (($# >= 2)) || die "--out needs a value"; OUT=$2; shift 2 ;;
        --out=*) OUT=${1#*=}; shift ;;
        *) die "unknown option: $1 (see --help)" ;;
    esac
done

int_in() { [[ $1 =~ ^[0-9]+$ ]] && (($1 >= $2 && $1 <= $3)); }
int_in "$DURATION" 1 600 || die "--duration must be 1..600"
int_in "$REPS" 1 50 || die "--reps must be 1..50"
int_in "$MTU" 576 9000 || die "--mtu must be 576..9000"
int_in "$WAIT_IDLE" 0 3600 || die "--wait-idle must be 0..3600"

PATHS=()
if [[ -z $PATHS_ARG ]]; then
    PATHS=("${ALL_PATHS[@]}")
else
    IFS=, read -ra want <<<"$PATHS_ARG"
    for p in "${want[@]}"; do
        [[ -z $p ]] && continue
        ok=0
        for q in "${ALL_PATHS[@]}"; do [[ $p == "$q" ]] && ok=1; done
        ((ok)) || die "unknown path '$p' (known: ${ALL_PATHS[*]})"
        for q in "${PATHS[@]}"; do [[ $p == "$q" ]] && die "path '$p' given twice"; done
        PATHS+=("$p")
    done
    ((${#PATHS[@]})) || die "--paths is empty"
fi

((EUID == 0)) || die "needs root (network namespaces)"
for t in ip iperf3 sockperf jq ethtool timeout awk ss; do
    command -v "$t" >/dev/null || die "missing tool: $t"
done
((PIN == 0)) || command -v taskset >/dev/null || die "--pin needs taskset (util-linux)"
if ((PIN)); then
    ncpu=$(nproc --all)
    ((ncpu >= 2)) || die "--pin needs at least 2 CPUs"
fi
if [[ -n $OUT ]]; then
    : >"$OUT" || die "cannot write $OUT"
fi

# ---------------------------------------------------------------- state and cleanup
ID="swp$$"                      # prefix of everything this run creates (≤ 10 chars)
TMP=$(mktemp -d "/tmp/switch-paths.$ID.XXXXXX")
CREATED_NS=()                   # namespaces this run created (deleted on exit)
BG_PIDS=()                      # background processes this run started
OVS_PRIVATE=0                   # 1: OVS daemons are ours (private dir/namespace)
OVSDIR=""                       # private OVS run/db/log directory
OVS_NS=""                       # namespace our ovs-vswitchd runs in
OVS_BR=""                       # bridge this run added (to delete)
OVS_TAPS=()                     # TAP names OVS created for us
OVS_MODE_NOTE=""
SLUICE_LAB=""                   # sluice lab this run brought up
SLUICE_BIN=${SLUICE:-sluice}
CLK_TCK=$(getconf CLK_TCK)
OVS_TIMEOUT=15                  # seconds for any ovs-vsctl/ovs-appctl call
BOUND=$((DURATION + 20))        # hard bound on any client/server process
NOTES=()
declare -A R=()                 # R[path,metric] = "v1 v2 …" (one per rep)
declare -A SKIP=()              # SKIP[path] = reason
declare -A OVSINFO=()           # OVSINFO[path] = offload flags etc.

log() { printf '%s\n' "$*" >&2; }
note() { NOTES+=("$*"); log "note: $*"; }

ovs() {  # run an OVS tool against the daemons in use
    if ((OVS_PRIVATE)); then
        OVS_RUNDIR=$OVSDIR OVS_LOGDIR=$OVSDIR OVS_DBDIR=$OVSDIR "$@"
    else
        "$@"
    fi
}
vsctl() { ovs timeout $((OVS_TIMEOUT + 5)) ovs-vsctl --timeout=$OVS_TIMEOUT "$@"; }
appctl() { ovs timeout $((OVS_TIMEOUT + 5)) ovs-appctl --timeout=$OVS_TIMEOUT "$@"; }

alive() {  # pid exists and is not a zombie
    local st
    [[ -r /proc/$1/stat ]] || return 1
    st=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
    st=${st##*) }
    [[ ${st:0:1} != Z ]]
}

stop_pid() {  # stop one process we started: TERM, then KILL after 3 s
    local pid=$1 i
    alive "$pid" || return 0
    kill -TERM "$pid" 2>/dev/null || return 0
    for i in {1..30}; do alive "$pid" || return 0; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
}

SETUP_ERR=""
must() {  # one setup step: on failure remember what failed (for the skip note)
    local err
    if ! err=$("$@" 2>&1); then
        SETUP_ERR="'$*' failed: ${err//$'\n'/ }"
        return 1
    fi
}

ns_add() {
    must ip netns add "$1" || return 1
    CREATED_NS+=("$1")
    must ip -n "$1" link set lo up
}

ns_del() {  # delete a namespace we created, after stopping what we ran in it
    local ns=$1 pid left=()
    [[ -e /run/netns/$ns ]] || return 0
    for pid in $(ip netns pids "$ns" 2>/dev/null); do stop_pid "$pid"; done
    ip netns del "$ns" 2>/dev/null || true
    for pid in "${CREATED_NS[@]}"; do if [[ $pid != "$ns" ]]; then left+=("$pid"); fi; done
    CREATED_NS=("${left[@]}")
}

ovs_stop_private() {  # stop the OVS daemons we started
    local d pid
    ((OVS_PRIVATE)) || return 0
    for d in ovs-vswitchd ovsdb-server; do
        [[ -r $OVSDIR/$d.pid ]] || continue
        pid=$(<"$OVSDIR/$d.pid")
        if alive "$pid"; then
            appctl -t "$d" exit >/dev/null 2>&1 || true
            for _ in {1..50}; do alive "$pid" || break; sleep 0.1; done
            stop_pid "$pid"
        fi
        rm -f "$OVSDIR/$d.pid"
    done
}

ovs_teardown() {
    local t
    if [[ -n $OVS_BR ]]; then
        vsctl --if-exists del-br "$OVS_BR" >/dev/null 2>&1 || true
        OVS_BR=""
    fi
    ovs_stop_private
    if [[ -n $OVS_NS ]]; then ns_del "$OVS_NS"; OVS_NS=""; fi
    # OVS makes its TAPs persistent; if the daemon died before deleting them, they
    # live on in a guest namespace (deleted below) or here: remove only ours.
    for t in "${OVS_TAPS[@]}"; do
        if ip link show "$t" >/dev/null 2>&1; then ip link del "$t" 2>/dev/null || true; fi
    done
    OVS_TAPS=()
    OVS_PRIVATE=0
}

sluice_teardown() {
    local ns pid sw
    if [[ -n $SLUICE_LAB ]]; then
        # stop our own leftovers (iperf3/sockperf) in the lab's guests, never the switch
        sw=" $(switch_pids | tr '\n' ' ') "
        for ns in "sluice-$SLUICE_LAB-g1" "sluice-$SLUICE_LAB-g2"; do
            [[ -e /run/netns/$ns ]] || continue
            for pid in $(ip netns pids "$ns" 2>/dev/null); do
                if [[ $sw != *" $pid "* ]]; then stop_pid "$pid"; fi
            done
        done
        timeout 60 "$SLUICE_BIN" lab down --name "$SLUICE_LAB" >>"$TMP/sluice.log" 2>&1 ||
            log "warning: 'sluice lab down --name $SLUICE_LAB' failed (see $TMP/sluice.log)"
        SLUICE_LAB=""
    fi
}

teardown_path() {
    local pid ns
    for pid in "${BG_PIDS[@]}"; do stop_pid "$pid"; done
    BG_PIDS=()
    sluice_teardown
    ovs_teardown
    for ns in "${CREATED_NS[@]}"; do ns_del "$ns"; done
}

cleanup() {
    local rc=$?
    trap - EXIT INT TERM ERR
    set +e
    teardown_path
    if ((rc == 0 && !KEEP_LOGS)); then
        rm -rf "$TMP"
    else
        log "switch-paths: exit status $rc; raw outputs kept in $TMP"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'log "switch-paths: failed at line $LINENO: $BASH_COMMAND"' ERR

# ---------------------------------------------------------------- helpers
PIN_CLI=()
PIN_SRV=()
if ((PIN)); then
    PIN_CLI=(taskset -c 0)
    PIN_SRV=(taskset -c 1)
fi

host_busy() {  # busy jiffies of all CPUs: user nice system irq softirq steal
    awk '$1 == "cpu" { print $2 + $3 + $4 + $7 + $8 + $9; exit }' /proc/stat
}

proc_ticks() {  # utime+stime (all threads) summed over the pids given
    local sum=0 pid s fields
    for pid in "$@"; do
        s=$(cat "/proc/$pid/stat" 2>/dev/null) || continue
        s=${s##*) }
        read -ra fields <<<"$s"
        sum=$((sum + fields[11] + fields[12]))
    done
    echo "$sum"
}

wait_listen() {  # ns port: wait up to 5 s for a TCP listener
    local i
    for i in {1..50}; do
        [[ -n $(ip netns exec "$1" ss -Hltn "sport = :$2" 2>/dev/null) ]] && return 0
        sleep 0.1
    done
    return 1
}

reach() {  # ns addr: wait up to 10 s for the peer to answer pings
    local i
    for i in {1..10}; do
        ip netns exec "$1" ping -c 1 -W 1 -q "$2" >/dev/null 2>&1 && return 0
    done
    return 1
}

fmt() { awk -v v="$1" -v f="$2" 'BEGIN { printf f, v }'; }

# ---------------------------------------------------------------- paths
# Each setup_* sets G1, G2 (guest namespaces), ADDR2 (guest 2's IPv4) and SWITCH
# (how to find the switch's pids: none|ovs|sluice); returns non-zero (after noting why)
# when the path cannot run.

guest_addr() {  # ns dev v4 v6
    must ip -n "$1" link set "$2" mtu "$MTU" up &&
        must ip -n "$1" addr add "$3" dev "$2" &&
        must ip -n "$1" addr add "$4" dev "$2" nodad
}

setup_direct() {
    G1=$ID-g1 G2=$ID-g2 ADDR2=10.231.1.2 SWITCH=none
    ns_add "$G1" && ns_add "$G2" &&
        must ip -n "$G1" link add eth0 mtu "$MTU" type veth peer name eth0 mtu "$MTU" netns "$G2" &&
        guest_addr "$G1" eth0 10.231.1.1/24 fd31:1::1/64 &&
        guest_addr "$G2" eth0 10.231.1.2/24 fd31:1::2/64
}

setup_linux_bridge() {
    local sw=$ID-sw i
    G1=$ID-g1 G2=$ID-g2 ADDR2=10.231.2.2 SWITCH=none
    ns_add "$sw" && ns_add "$G1" && ns_add "$G2" || return 1
    must ip -n "$sw" link add br0 mtu "$MTU" type bridge stp_state 0 forward_delay 0 || return 1
    for i in 1 2; do
        must ip -n "$sw" link add "p$i" mtu "$MTU" type veth peer name eth0 mtu "$MTU" netns "$ID-g$i" &&
            must ip -n "$sw" link set "p$i" master br0 up || return 1
    done
    must ip -n "$sw" link set br0 up &&
        guest_addr "$G1" eth0 10.231.2.1/24 fd31:2::1/64 &&
        guest_addr "$G2" eth0 10.231.2.2/24 fd31:2::2/64
}

ovs_system_running() {  # an ovs-vswitchd answers on the default run directory
    local pidf=/var/run/openvswitch/ovs-vswitchd.pid
    [[ -r $pidf ]] && alive "$(<"$pidf")" &&
        timeout 10 ovs-vsctl --timeout=5 show >/dev/null 2>&1
}

ovs_start_private() {  # tso(true|false): fresh ovsdb-server + ovs-vswitchd of our own
    local tso=$1 schema=/usr/share/openvswitch/vswitch.ovsschema
    OVSDIR=$TMP/ovs
    rm -rf "$OVSDIR"; mkdir -p "$OVSDIR"
    OVS_PRIVATE=1
    OVS_NS=$ID-ovs
    ns_add "$OVS_NS" || { echo "$SETUP_ERR"; return 1; }
    [[ -r $schema ]] || { echo "no $schema"; return 1; }
    ovs ovsdb-tool create "$OVSDIR/conf.db" "$schema" || return 1
    if ! ovs timeout 30 ovsdb-server "$OVSDIR/conf.db" --remote="punix:$OVSDIR/db.sock" \
        --pidfile --detach --no-chdir --log-file >"$OVSDIR/ovsdb-server.out" 2>&1; then
        echo "ovsdb-server did not start: $(tail -n 2 "$OVSDIR/ovsdb-server.out" | tr '\n' ' ')"
        return 1
    fi
    vsctl --no-wait init || return 1
    # Set before ovs-vswitchd starts: the setting is read once (false -> true at run
    # time takes effect for ports added later; true -> false needs a restart).
    vsctl --no-wait set Open_vSwitch . "other_config:userspace-tso-enable=$tso" || return 1
    if ! ovs timeout 30 ip netns exec "$OVS_NS" ovs-vswitchd "unix:$OVSDIR/db.sock" \
        --pidfile --detach --no-chdir --log-file >"$OVSDIR/ovs-vswitchd.out" 2>&1; then
        echo "ovs-vswitchd did not start: $(tail -n 2 "$OVSDIR/ovs-vswitchd.out" | tr '\n' ' ')"
        return 1
    fi
}

setup_ovs() {  # tso(true|false)
    local tso=$1 path=$2 cur i t flags vnet
    G1=$ID-g1 G2=$ID-g2 ADDR2=10.231.3.2 SWITCH=ovs
    if ! command -v ovs-vswitchd >/dev/null || ! command -v ovs-vsctl >/dev/null; then
        SKIP[$path]="Open vSwitch is not installed (apt-get install openvswitch-switch)"
        return 1
    fi
    if ovs_system_running; then
        OVS_PRIVATE=0
        cur=$(vsctl --if-exists get Open_vSwitch . other_config:userspace-tso-enable 2>/dev/null | tr -d '"')
        [[ -n $cur ]] || cur=false
        if [[ $cur != "$tso" ]]; then
            SKIP[$path]="the running ovs-vswitchd has userspace-tso-enable=$cur; $path needs $tso and a daemon restart, which this script does not do to a daemon it did not start"
            return 1
        fi
    else
        # Without module support this is fine; with it, a stray kernel datapath would
        # be deleted by a new ovs-vswitchd: refuse rather than touch it.
        if [[ -n $(ip -d link show type openvswitch 2>/dev/null) ]]; then
            SKIP[$path]="no ovs-vswitchd running but a kernel OVS datapath exists; not starting one"
            return 1
        fi
        if ! ovs_start_private "$tso" >"$TMP/$path-ovs-start.log" 2>&1; then
            SKIP[$path]="could not start OVS: $(tail -n 3 "$TMP/$path-ovs-start.log" | tr '\n' ' ')"
            return 1
        fi
    fi
    if ((OVS_PRIVATE)); then
        OVS_MODE_NOTE="Daemons: a fresh ovsdb-server and ovs-vswitchd started by this script for each ovs path, with userspace-tso-enable written to the database before ovs-vswitchd starts (OVS 3.1 reads it once: false→true at run time applies only to ports added later, true→false needs a restart); private database and run directory under /tmp, ovs-vswitchd in a private network namespace, default daemon options (no --mlockall, no CPU affinity); stopped afterwards, /etc/openvswitch not touched."
    else
        OVS_MODE_NOTE="Daemons: the ovs-vswitchd that was already running (its database and its userspace-tso-enable setting; a bridge was added and deleted afterwards)."
    fi
    OVS_BR=${ID}br
    OVS_TAPS=("${ID}t1" "${ID}t2")
    if ! vsctl add-br "$OVS_BR" -- set bridge "$OVS_BR" datapath_type=netdev \
        -- add-port "$OVS_BR" "${ID}t1" -- set interface "${ID}t1" type=tap "mtu_request=$MTU" \
        -- add-port "$OVS_BR" "${ID}t2" -- set interface "${ID}t2" type=tap "mtu_request=$MTU" \
        >"$TMP/$path-vsctl.log" 2>&1; then
        SKIP[$path]="ovs-vsctl add-br/add-port failed: $(tr '\n' ' ' <"$TMP/$path-vsctl.log")"
        return 1
    fi
    ns_add "$G1" && ns_add "$G2" || return 1
    for i in 1 2; do
        t=${ID}t$i
        if [[ -n $OVS_NS ]]; then
            must ip -n "$OVS_NS" link set "$t" netns "$ID-g$i" || return 1
        else
            must ip link set "$t" netns "$ID-g$i" || return 1
        fi
        guest_addr "$ID-g$i" "$t" "10.231.3.$i/24" "fd31:3::$i/64" || return 1
    done
    # What the guest sees on its TAP (OVS opens it with IFF_VNET_HDR and sets the
    # TAP's offloads from userspace-tso-enable).
    t=${ID}t1
    flags=$(ip netns exec "$G1" ethtool -k "$t" 2>/dev/null |
        awk -F': ' '/^(tx-checksumming|scatter-gather|tcp-segmentation-offload|generic-segmentation-offload|generic-receive-offload):/ { split($2, v, " "); printf "%s%s=%s", sep, $1, v[1]; sep=", " }')
    vnet=$(ip -n "$G1" -d link show "$t" | grep -o 'vnet_hdr [a-z]*' || true)
    OVSINFO[$path]="guest TAP: ${vnet:-vnet_hdr ?}, ${flags:-ethtool -k unavailable}"
    if appctl dpif-netdev/pmd-rxq-show 2>&1 | grep -q 'pmd thread'; then
        OVSINFO[$path,pmd]="pmd-rxq-show: $(appctl dpif-netdev/pmd-rxq-show 2>&1 | tr '\n' ' ' | sed 's/  */ /g;s/ $//')"
    else
        OVSINFO[$path,pmd]="pmd-rxq-show lists no PMD thread"
    fi
    OVSINFO[$path,tso]=$(vsctl --if-exists get Open_vSwitch . other_config:userspace-tso-enable 2>/dev/null | tr -d '"' || true)
    OVSINFO[$path,tso]=${OVSINFO[$path,tso]:-false (default)}
    if [[ $tso == false ]] && ((MTU > 1500)); then
        OVSINFO[$path]+="; MTU $MTU without userspace TSO: OVS 3.1 sizes a TAP's receive buffer from the MTU it reads from the device, which fails once the TAP is in another namespace (\"failed to set MTU … No such device\"), so it falls back to 1500 and drops larger frames: TCP stalls (ping -s 1400 passes, -s 1480 does not)"
    fi
}

sluice_available() {
    command -v "$SLUICE_BIN" >/dev/null 2>&1
}

setup_sluice() {  # poll(0|1) path
    local poll=$1 path=$2 lab=$ID args
    G1=sluice-$lab-g1 G2=sluice-$lab-g2 ADDR2=10.77.0.2 SWITCH=sluice
    if ! sluice_available; then
        SKIP[$path]="'$SLUICE_BIN' not found (install sluice or set SLUICE=/path/to/sluice)"
        return 1
    fi
    args=(lab up --name "$lab" --guests 2 --mtu "$MTU")
    if ((poll)); then
        if ! timeout 10 "$SLUICE_BIN" switch run --help 2>&1 | grep -q -- --poll; then
            SKIP[$path]="'sluice switch run' has no --poll"
            return 1
        fi
        args+=(--poll)
    fi
    SLUICE_LAB=$lab
    if ! timeout 60 "$SLUICE_BIN" "${args[@]}" >>"$TMP/sluice.log" 2>&1; then
        SKIP[$path]="'sluice ${args[*]}' failed: $(tail -n 3 "$TMP/sluice.log" | tr '\n' ' ')"
        return 1
    fi
    if [[ -z $(switch_pids) ]]; then
        note "$path: no process matches 'sluice switch run.*$lab'; switch CPU not measured"
    fi
}

switch_pids() {
    case $SWITCH in
        ovs)
            local pidf=/var/run/openvswitch/ovs-vswitchd.pid
            if ((OVS_PRIVATE)); then pidf=$OVSDIR/ovs-vswitchd.pid; fi
            if [[ -r $pidf ]]; then cat "$pidf"; fi
            ;;
        sluice) pgrep -f "sluice switch run.*$SLUICE_LAB" || true ;;
        *) ;;
    esac
}

setup_path() {
    case $1 in
        direct) setup_direct ;;
        linux-bridge) setup_linux_bridge ;;
        ovs-user) setup_ovs false "$1" ;;
        ovs-user-tso) setup_ovs true "$1" ;;
        sluice) setup_sluice 0 "$1" ;;
        sluice-poll) setup_sluice 1 "$1" ;;
    esac
}

# ---------------------------------------------------------------- measurements
add_result() { R[$1,$2]+="$3 "; }

iperf_server() {  # port logfile: one-off server in G2, in the background
    ip netns exec "$G2" timeout "$BOUND" "${PIN_SRV[@]}" \
        iperf3 -s -1 -p "$1" >"$2" 2>&1 &
    BG_PIDS+=($!)
}

iperf_client() {  # port json
    ip netns exec "$G1" timeout "$BOUND" "${PIN_CLI[@]}" \
        iperf3 -c "$ADDR2" -p "$1" -t "$DURATION" -J --connect-timeout 5000 >"$2" 2>&1
}

iperf_ok() {  # json: received bytes > 0 and no error
    jq -e '(.error // null) == null and .end.sum_received.bytes > 0' "$1" >/dev/null 2>&1
}

iperf_why() {  # json: why a run gave no result
    jq -r 'if (.error // "") != "" then .error
           else "received \(.end.sum_received.bytes // 0) bytes (sent \(.end.sum_sent.bytes // 0), \(.end.sum_sent.retransmits // 0) retransmits)" end' \
        "$1" 2>/dev/null || head -c 200 "$1" | tr '\n' ' '
}

measure_single() {  # path rep
    local path=$1 rep=$2 j=$TMP/$1-r$2-single.json b0 b1 s0 s1 bytes gbps gb
    iperf_server 5201 "$TMP/$path-r$rep-single-srv.log"
    if ! wait_listen "$G2" 5201; then
        note "$path: iperf3 server did not start"; return 0
    fi
    local -a pids
    mapfile -t pids < <(switch_pids)
    s0=$(proc_ticks "${pids[@]}"); b0=$(host_busy)
    iperf_client 5201 "$j" || true
    b1=$(host_busy); s1=$(proc_ticks "${pids[@]}")
    wait "${BG_PIDS[-1]}" 2>/dev/null || true
    if ! iperf_ok "$j"; then
        note "$path (rep $rep): single-stream iperf3 failed: $(iperf_why "$j")"
        return 0
    fi
    bytes=$(jq '.end.sum_received.bytes' "$j")
    gbps=$(jq '.end.sum_received.bits_per_second / 1e9' "$j")
    gb=$(awk -v b="$bytes" 'BEGIN { print b / 1e9 }')
    add_result "$path" single "$gbps"
    add_result "$path" hostcpu "$(awk -v d=$((b1 - b0)) -v hz="$CLK_TCK" -v gb="$gb" 'BEGIN { print d / hz / gb }')"
    if ((${#pids[@]})); then
        add_result "$path" swcpu "$(awk -v d=$((s1 - s0)) -v hz="$CLK_TCK" -v gb="$gb" 'BEGIN { print d / hz / gb }')"
    fi
}

measure_multi() {  # path rep: 10 servers, 10 clients at once
    local path=$1 rep=$2 i sum=0 failed=0 why="" cpids=() j
    local first=${#BG_PIDS[@]}
    for i in {0..9}; do
        iperf_server $((5301 + i)) "$TMP/$path-r$rep-multi$i-srv.log"
    done
    for i in {0..9}; do
        if ! wait_listen "$G2" $((5301 + i)); then
            note "$path: iperf3 server on port $((5301 + i)) did not start"; return 0
        fi
    done
    for i in {0..9}; do
        iperf_client $((5301 + i)) "$TMP/$path-r$rep-multi$i.json" &
        cpids+=($!)
        BG_PIDS+=($!)
    done
    for i in "${cpids[@]}"; do wait "$i" || true; done
    for i in "${BG_PIDS[@]:first}"; do wait "$i" 2>/dev/null || true; done
    for i in {0..9}; do
        j=$TMP/$path-r$rep-multi$i.json
        if iperf_ok "$j"; then
            sum=$(awk -v s="$sum" -v v="$(jq '.end.sum_received.bits_per_second' "$j")" 'BEGIN { print s + v }')
        else
            failed=$((failed + 1))
            [[ -n $why ]] || why="stream $i: $(iperf_why "$j")"
        fi
    done
    if ((failed == 0)); then
        add_result "$path" multi "$(awk -v s="$sum" 'BEGIN { print s / 1e9 }')"
    else
        note "$path (rep $rep): $failed of 10 streams failed, no 10-stream figure (first: $why)"
    fi
}

measure_rr() {  # path rep: sockperf TCP ping-pong, 200 bytes, round trip
    local path=$1 rep=$2 out=$TMP/$1-r$2-rr.log srv rtt
    ip netns exec "$G2" timeout "$BOUND" "${PIN_SRV[@]}" \
        sockperf sr --tcp -i "$ADDR2" -p 11111 >"$TMP/$path-r$rep-rr-srv.log" 2>&1 &
    srv=$!
    BG_PIDS+=("$srv")
    if ! wait_listen "$G2" 11111; then
        note "$path: sockperf server did not start"; return 0
    fi
    ip netns exec "$G1" timeout "$BOUND" "${PIN_CLI[@]}" \
        sockperf pp --tcp -i "$ADDR2" -p 11111 -m 200 -t "$DURATION" --full-rtt >"$out" 2>&1 || true
    stop_pid "$srv"
    wait "$srv" 2>/dev/null || true
    # "sockperf: Summary: Round trip is 23.820 usec" (with --full-rtt)
    rtt=$(sed 's/\x1b\[[0-9;]*m//g' "$out" | awk '/Summary: Round trip is/ { print $(NF-1); exit }')
    if [[ -z $rtt ]]; then
        rtt=$(sed 's/\x1b\[[0-9;]*m//g' "$out" | sed -n 's/.*avg-rtt=\([0-9.]*\).*/\1/p' | head -n1)
    fi
    if [[ -n $rtt ]]; then
        add_result "$path" rr "$rtt"
    else
        note "$path (rep $rep): sockperf gave no round trip: $(tail -n 2 "$out" | tr '\n' ' ')"
    fi
}

# ---------------------------------------------------------------- header facts
version_of() {  # first line of a tool's version, or "not installed"
    local t=$1; shift
    local out
    if command -v "$t" >/dev/null 2>&1; then
        out=$(timeout 10 "$t" "$@" 2>&1 || true)
        out=$(printf '%s\n' "$out" | sed 's/\x1b\[[0-9;]*m//g' | awk 'NF && !done { print; done = 1 }')
        echo "${out:-?}"
    else
        echo "not installed"
    fi
}

background_busy() {  # % of all CPUs busy over 1 s, before the run
    local a b ta tb
    read -r a ta < <(awk '$1 == "cpu" { b = $2+$3+$4+$7+$8+$9; print b, b + $5 + $6; exit }' /proc/stat)
    sleep 1
    read -r b tb < <(awk '$1 == "cpu" { b = $2+$3+$4+$7+$8+$9; print b, b + $5 + $6; exit }' /proc/stat)
    awk -v d=$((b - a)) -v t=$((tb - ta)) 'BEGIN { printf "%.0f", t ? 100 * d / t : 0 }'
}

START_DATE=$(date -u '+%Y-%m-%d %H:%M:%S UTC')
KERNEL=$(uname -r)
CPU_MODEL=$(lscpu 2>/dev/null | awk -F: '/^Model name/ { sub(/^[ \t]+/, "", $2); print $2; exit }')
NCPU=$(nproc --all)
V_IPERF=$(version_of iperf3 -v)
V_SOCKPERF=$(version_of sockperf --version)
V_OVS=$(version_of ovs-vswitchd --version)
V_SLUICE=$(version_of "$SLUICE_BIN" --version)
quiet_check() {  # what: sample the load; with --wait-idle wait for ≤10%; sets BUSY
    BUSY=$(background_busy)
    if ((WAIT_IDLE > 0 && BUSY > 10)); then
        log "switch-paths: machine ${BUSY}% busy before $1; waiting up to ${WAIT_IDLE}s for it to be quiet…"
        local deadline=$((SECONDS + WAIT_IDLE))
        while ((BUSY > 10 && SECONDS < deadline)); do
            sleep 4
            BUSY=$(background_busy)
        done
    fi
}
quiet_check "the run"
BG_BUSY=$BUSY
if ((PIN)); then
    PLACEMENT="clients (iperf3 -c, sockperf pp) pinned to CPU 0, servers (iperf3 -s, sockperf sr) pinned to CPU 1 with taskset, for every path; switch daemons (ovs-vswitchd, sluice) and kernel softirq work not pinned"
else
    PLACEMENT="no pinning: clients, servers and switch daemons placed by the scheduler, for every path"
fi
MAX_BUSY=$BG_BUSY

# ---------------------------------------------------------------- run
NP=${#PATHS[@]}
log "switch-paths: ${PATHS[*]}; ${DURATION}s per measurement, $REPS rep(s), MTU $MTU; $PLACEMENT"
for ((rep = 1; rep <= REPS; rep++)); do
    for ((k = 0; k < NP; k++)); do
        path=${PATHS[k]}
        if [[ -n ${SKIP[$path]:-} ]]; then continue; fi
        tag="[$((k + 1))/$NP] $path"
        if ((REPS > 1)); then tag+=" (rep $rep/$REPS)"; fi
        log "$tag: setting up…"
        if ((k > 0 || rep > 1)); then quiet_check "$path"; fi
        if ((BUSY > MAX_BUSY)); then MAX_BUSY=$BUSY; fi
        if ((BUSY > 10)); then
            note "$path (rep $rep): the machine was ${BUSY}% busy in a 1 s sample just before this path: its figures (CPU s/GB above all) include that background load"
        fi
        SETUP_ERR=""
        if ! setup_path "$path"; then
            [[ -n ${SKIP[$path]:-} ]] || SKIP[$path]="setup failed: ${SETUP_ERR:-?}"
            log "$tag: skipped — ${SKIP[$path]}"
            teardown_path
            continue
        fi
        if ! reach "$G1" "$ADDR2"; then
            SKIP[$path]="guest 1 cannot reach $ADDR2"
            log "$tag: skipped — ${SKIP[$path]}"
            teardown_path
            continue
        fi
        log "$tag: single stream…"
        measure_single "$path" "$rep"
        log "$tag: 10 streams…"
        measure_multi "$path" "$rep"
        log "$tag: 200-byte TCP request-response…"
        measure_rr "$path" "$rep"
        if [[ $SWITCH == ovs ]]; then
            # who forwarded: the "main thread" section of pmd-stats-show (non-PMD ports)
            n=$(appctl dpif-netdev/pmd-stats-show 2>/dev/null |
                awk '/^main thread/ { m = 1; next } /^pmd thread/ { m = 0 } m && /packets received:/ { print $3 }')
            OVSINFO[$path,pmd]+="; pmd-stats-show: main thread received ${n:-?} packets"
        fi
        if [[ $SWITCH == ovs ]] && ((OVS_PRIVATE)); then
            n=$(grep -c 'Too big' "$OVSDIR/ovs-vswitchd.log" 2>/dev/null || true)
            ((${n:-0} == 0)) || note "$path: ovs-vswitchd logged ${n} 'Dropped packet: Too big' line(s)"
            OVSINFO[$path,log]=$(grep -E '\|(WARN|ERR)\|' "$OVSDIR/ovs-vswitchd.log" 2>/dev/null |
                grep -v -E 'ETHTOOL_|SIOCGIFINDEX|No such device' | head -n 3 | cut -d'|' -f3- | tr '\n' ';' || true)
        fi
        log "$tag: tearing down…"
        teardown_path
    done
done

# ---------------------------------------------------------------- report
# summary path metric fmt: sets CELL ("median" or "median (min–max)" or n/a) and MED
summary() {
    local vals=${R[$1,$2]:-} f=$3 lo hi n
    MED="" CELL="n/a"
    if [[ -z ${vals// /} ]]; then return 0; fi
    # shellcheck disable=SC2086
    read -r MED lo hi n < <(printf '%s\n' $vals | sort -g | awk '
        { a[NR] = $1 }
        END { m = (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2; print m, a[1], a[NR], NR }')
    if ((n > 1)); then
        CELL="$(fmt "$MED" "$f") ($(fmt "$lo" "$f")–$(fmt "$hi" "$f"))"
    else
        CELL=$(fmt "$MED" "$f")
    fi
}

METRICS=(single multi rr hostcpu swcpu)
declare -A FMT=([single]="%.2f" [multi]="%.2f" [rr]="%.1f" [hostcpu]="%.3f" [swcpu]="%.3f")
declare -A MEDIAN=()

report() {
    local p m cell row
    echo "# sluice switch-paths benchmark"
    echo
    echo "- date: $START_DATE"
    echo "- kernel: $KERNEL"
    echo "- CPU: ${CPU_MODEL:-?}, $NCPU CPUs"
    echo "- tools: $V_IPERF; $V_SOCKPERF; $V_OVS; sluice: $V_SLUICE"
    echo "- command: \`$CMDLINE\`"
    echo "- placement: $PLACEMENT"
    echo "- per measurement: ${DURATION} s; repetitions: $REPS$( ((REPS > 1)) && echo ' (cells: median (min–max))'); MTU: $MTU"
    echo "- background load (other processes), 1 s samples of all CPUs before each path: ${BG_BUSY}% before the run, ${MAX_BUSY}% at most"
    echo
    echo "| path | single-stream Gbit/s | 10-stream Gbit/s | RR round trip µs | CPU s/GB host | switch CPU s/GB |"
    echo "|---|--:|--:|--:|--:|--:|"
    for p in "${PATHS[@]}"; do
        if [[ -n ${SKIP[$p]:-} && -z ${R[$p,single]:-}${R[$p,multi]:-}${R[$p,rr]:-} ]]; then
            echo "| $p | skipped | skipped | skipped | skipped | skipped |"
            continue
        fi
        row="| $p"
        for m in "${METRICS[@]}"; do
            summary "$p" "$m" "${FMT[$m]}"
            cell=$CELL
            MEDIAN[$p,$m]=$MED
            if [[ $m == swcpu && $cell == n/a ]]; then
                case $p in direct|linux-bridge) cell="— (kernel)" ;; esac
            fi
            row+=" | $cell"
        done
        echo "$row |"
    done
    echo
    echo "Ratios vs linux-bridge (medians; path ÷ linux-bridge: above 1 is faster for Gbit/s, slower or costlier for µs and CPU):"
    echo
    echo "| path | single-stream | 10-stream | RR round trip | CPU s/GB host | switch CPU s/GB |"
    echo "|---|--:|--:|--:|--:|--:|"
    for p in "${PATHS[@]}"; do
        row="| $p"
        for m in "${METRICS[@]}"; do
            local a=${MEDIAN[$p,$m]:-} b=${MEDIAN[linux-bridge,$m]:-}
            if [[ -n $a && -n $b ]] && awk -v b="$b" 'BEGIN { exit !(b > 0) }'; then
                row+=" | $(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.2f×", a / b }')"
            else
                row+=" | n/a"
            fi
        done
        echo "$row |"
    done
    echo
    echo "Notes:"
    echo
    echo "- single stream: one iperf3 TCP stream, guest 1 → guest 2 (received rate); 10-stream: 10 iperf3 server processes on ports 5301–5310 and 10 client processes at once, summed (iperf3 3.12 runs -P streams on one thread, hence separate processes)."
    echo "- RR: sockperf ping-pong --tcp -m 200 with --full-rtt: the average ROUND TRIP in µs (sockperf without --full-rtt prints half of it as 'avg-latency')."
    echo "- CPU s/GB host: busy jiffies of all CPUs (/proc/stat user+nice+system+irq+softirq+steal) during the single-stream run ÷ GB (1e9 bytes) received; includes client, server, kernel and switch. Switch CPU: utime+stime of the switch process (all threads) over the same run; for direct and linux-bridge the forwarding is kernel softirq work, counted in the host column only."
    for p in "${PATHS[@]}"; do
        if [[ -n ${SKIP[$p]:-} ]]; then echo "- $p: skipped — ${SKIP[$p]}"; fi
    done
    for p in ovs-user ovs-user-tso; do
        [[ -n ${OVSINFO[$p]:-} ]] || continue
        echo "- $p: userspace-tso-enable=${OVSINFO[$p,tso]:-?}; ${OVSINFO[$p]}; ${OVSINFO[$p,pmd]:-}${OVSINFO[$p,log]:+; vswitchd warnings: ${OVSINFO[$p,log]}}"
    done
    if [[ -n ${OVSINFO[ovs-user]:-}${OVSINFO[ovs-user-tso]:-} ]]; then
        echo "- OVS settings: bridge datapath_type=netdev, two Interface type=tap with mtu_request=$MTU (OVS creates the TAPs, then each is moved into a guest namespace), default NORMAL flow (MAC learning); nothing else changed. pmd-cpu-mask/n-rxq do not apply: TAP ports are not PMD ports, so no PMD thread is created and their queues are polled by the ovs-vswitchd main thread (see pmd-rxq-show/pmd-stats-show above). ${OVS_MODE_NOTE:-}"
    fi
    for m in "${NOTES[@]}"; do echo "- $m"; done
}

REPORT=$(report)
printf '%s\n' "$REPORT"
if [[ -n $OUT ]]; then
    printf '%s\n' "$REPORT" >"$OUT"
    log "switch-paths: report written to $OUT"
fi

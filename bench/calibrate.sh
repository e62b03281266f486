#!/usr/bin/env bash
# calibrate.sh — check that the workload modeler (`sluice bench`) is not the bottleneck:
# compare it, in one run, with sockperf (request-response) and iperf3 (streaming) on TCP
# loopback and across two network namespaces joined by a veth pair.
# Run with --help for the options; everything it creates is removed on exit.
set -euo pipefail

usage() {
    cat <<'EOF'
Usage: bench/calibrate.sh [options]

Check that `sluice bench` measures what the reference tools measure, i.e. that the
modeler itself is not the bottleneck. Two paths, both measured in the same run:

  loopback   TCP over 127.0.0.1 in the host's network namespace
  veth       client in namespace calPID-a (10.231.7.1/24), server in calPID-b
             (10.231.7.2/24), joined by a veth pair

Per path and repetition, the tools are interleaved (the reference first in odd
repetitions, sluice first in even ones) so that drift hits both alike:

  RR   sockperf sr --tcp  +  sockperf pp --tcp -m 200 -t S --full-rtt
         transactions/s = 1e6 / "Round trip is X usec"
       versus `sluice bench run` with a generated profile doing the same: one connection,
       tcp_nodelay, a timed loop of write size=200 then read size=200 (the server mirrors:
       read 200, write 200) — its `tps`
  STR  iperf3 -s  +  iperf3 -c -t S -J (one stream): end.sum_received.bits_per_second
       versus `sluice bench run` with a generated profile: one connection, a timed loop of
       write size=128k (iperf3's default TCP buffer length); the server reads — its
       `gbit_per_s`

The report (markdown, on stdout) gives medians over the repetitions with min–max, the
sluice/reference ratio (median of the per-repetition ratios, min–max), the machine load
before every measurement, and a reading against the requirement that sluice bench be
within 10% of the reference tools.

Options:
  --duration S    seconds per measurement (default 10, 1–600)
  --reps N        repetitions (default 3, 1–50)
  --out FILE      also write the report to FILE
  --wait-idle S   before each measurement, wait up to S seconds for the machine to be
                  quiet (at most 10% of all CPUs busy in a 1 s sample; default 0: do not
                  wait). The load seen is reported either way.
  --keep-logs     keep the raw outputs in /tmp/calibrate.calPID.* (always kept on failure)
  -h, --help      this help

Environment:
  SLUICE          the sluice binary (default: `sluice` on PATH, else
                  target/release/sluice next to this script's repository); it is copied
                  to the temporary directory first, so a rebuild during the run does not
                  change what is measured

Example:
  SLUICE=$PWD/target/release/sluice bench/calibrate.sh --out report.md

Needs root (network namespaces), iproute2, sockperf, iperf3, jq, timeout, ss, ping.
Progress goes to stderr, the report to stdout. Processes run unpinned (placed by the
scheduler); every process is bounded by `timeout` (duration + 20 s). Loopback servers
listen on 127.0.0.1 on free ports picked at start; namespaces calPID-a/-b and their
processes are removed on exit, also on failure or Ctrl-C.
EOF
}

# ---------------------------------------------------------------- options
DURATION=10
REPS=3
OUT=""
KEEP_LOGS=0
WAIT_IDLE=0
CMDLINE=$0
for a in "$@"; do
    if [[ $a =~ ^[A-Za-z0-9_./,:=@%+-]+$ ]]; then CMDLINE+=" $a"; else CMDLINE+=" $(printf '%q' "$a")"; fi
done

die() { echo "calibrate: $*" >&2; exit 2; }

while (($#)); do
    case $1 in
        -h|--help) usage; exit 0 ;;
        --duration) (($# >= 2)) || die "--duration needs a value"; DURATION=$2; shift 2 ;;
        --duration=*) DURATION=${1#*=}; shift ;;
        --reps) (($# >= 2)) || die "--reps needs a value"; REPS=$2; shift 2 ;;
        --reps=*) REPS=${1#*=}; shift ;;
        --out) (($# >= 2)) || die "--out needs a value"; OUT=$2; shift 2 ;;
        --out=*) OUT=${1#*=}; shift ;;
        --keep-logs) KEEP_LOGS=1; shift ;;
        --wait-idle) (($# >= 2)) || die "--wait-idle needs a value"; WAIT_IDLE=$2; shift 2 ;;
        --wait-idle=*) WAIT_IDLE=${1#*=}; shift ;;
        *) die "unknown option: $1 (see --help)" ;;
    esac
done

int_in() { [[ $1 =~ ^[0-9]+$ ]] && ((10#$1 >= $2 && 10#$1 <= $3)); }
int_in "$DURATION" 1 600 || die "--duration must be 1..600"
int_in "$REPS" 1 50 || die "--reps must be 1..50"
int_in "$WAIT_IDLE" 0 3600 || die "--wait-idle must be 0..3600"
DURATION=$((10#$DURATION)) REPS=$((10#$REPS)) WAIT_IDLE=$((10#$WAIT_IDLE))

((EUID == 0)) || die "needs root (network namespaces)"
for t in ip sockperf iperf3 jq timeout ss ping awk sed; do
    command -v "$t" >/dev/null || die "missing tool: $t"
done
if [[ -n ${SLUICE:-} ]]; then
    SLUICE_BIN=$SLUICE
elif command -v sluice >/dev/null; then
    SLUICE_BIN=$(command -v sluice)
else
    SLUICE_BIN=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/target/release/sluice
fi
[[ -x $SLUICE_BIN ]] || die "no sluice binary at '$SLUICE_BIN' (build with cargo build --release, or set SLUICE)"
if [[ -n $OUT ]]; then
    : >"$OUT" || die "cannot write $OUT"
fi
SLUICE_ORIG=$SLUICE_BIN

# ---------------------------------------------------------------- state and cleanup
ID="cal$$"
NS_A=$ID-a                      # client namespace (veth path)
NS_B=$ID-b                      # server namespace (veth path)
ADDR_A=10.231.7.1
ADDR_B=10.231.7.2
TMP=$(mktemp -d "/tmp/calibrate.$ID.XXXXXX")
cp "$SLUICE_ORIG" "$TMP/sluice"
SLUICE_BIN=$TMP/sluice
CREATED_NS=()
BG_PIDS=()
BOUND=$((DURATION + 20))        # hard bound on every client/server process
NOTES=()
declare -A R=()                 # R[path,metric] = "v1 v2 …" (one per rep)
RAW=()                          # per-measurement rows for the appendix

log() { printf '%s\n' "$*" >&2; }
note() { NOTES+=("$*"); log "note: $*"; }

alive() {  # pid exists and is not a zombie
    local st
    st=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
    st=${st##*) }
    [[ ${st:0:1} != Z ]]
}

stop_pid() {  # stop one process we started: TERM, then KILL after 3 s
    local pid=$1
    alive "$pid" || return 0
    kill -TERM "$pid" 2>/dev/null || return 0
    for _ in {1..30}; do alive "$pid" || return 0; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
}

stop_servers() {
    local pid
    for pid in "${BG_PIDS[@]}"; do stop_pid "$pid"; wait "$pid" 2>/dev/null || true; done
    BG_PIDS=()
}

ns_del() {  # delete a namespace we created, after stopping what runs in it (all ours)
    local ns=$1 pid
    [[ -e /run/netns/$ns ]] || return 0
    for pid in $(ip netns pids "$ns" 2>/dev/null); do stop_pid "$pid"; done
    ip netns del "$ns" 2>/dev/null || true
}

cleanup() {
    local rc=$? ns
    trap - EXIT INT TERM ERR
    set +e
    stop_servers
    for ns in "${CREATED_NS[@]}"; do ns_del "$ns"; done
    if ((rc == 0 && !KEEP_LOGS)); then
        rm -rf "$TMP"
    else
        log "calibrate: exit status $rc; raw outputs kept in $TMP"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'log "calibrate: failed at line $LINENO: $BASH_COMMAND"' ERR

# ---------------------------------------------------------------- helpers
in_ns() {  # ns cmd…: run in namespace ns ("" = the host's)
    local ns=$1; shift
    if [[ -n $ns ]]; then ip netns exec "$ns" "$@"; else "$@"; fi
}

port_free() { [[ -z $(ss -Hltn "sport = :$1" 2>/dev/null) ]]; }

wait_listen() {  # ns port: wait up to 5 s for a TCP listener
    for _ in {1..50}; do
        listening "$1" "$2" && return 0
        sleep 0.1
    done
    return 1
}

listening() { [[ -n $(in_ns "$1" ss -Hltn "sport = :$2" 2>/dev/null) ]]; }

server() {  # ns port log cmd…: start a bounded server in the background, wait for it
    local ns=$1 port=$2 out=$3 pre=() pid; shift 3
    # The port must be free: a server left over from an earlier measurement would be
    # measured instead (and its own time limit would cut the run short).
    for _ in {1..50}; do listening "$ns" "$port" || break; sleep 0.1; done
    if listening "$ns" "$port"; then
        log "calibrate: port $port${ns:+ in $ns} is still in use; not starting '$*'"
        return 1
    fi
    [[ -z $ns ]] || pre=(ip netns exec "$ns")
    # A simple command in the background, not a function: $! is then the process itself
    # (ip netns exec execs timeout), so stop_pid reaches it; timeout passes TERM on.
    "${pre[@]}" timeout "$BOUND" "$@" >"$out" 2>&1 &
    pid=$!
    BG_PIDS+=("$pid")
    wait_listen "$ns" "$port" || { log "calibrate: '$*' did not listen on :$port (log: $out)"; return 1; }
    alive "$pid" || { log "calibrate: '$*' exited at once (log: $out)"; return 1; }
}

cpu_sample() { awk '$1 == "cpu" { b = $2+$3+$4+$7+$8+$9; print b, b + $5 + $6; exit }' /proc/stat; }

busy_1s() {  # % of all CPUs busy over 1 s
    local a ta b tb
    read -r a ta < <(cpu_sample)
    sleep 1
    read -r b tb < <(cpu_sample)
    awk -v d=$((b - a)) -v t=$((tb - ta)) 'BEGIN { printf "%.0f", t ? 100 * d / t : 0 }'
}

load_now() {  # sets LOAD ("1-min 5-min 15-min") and BUSY (% of all CPUs busy over 1 s, our tools idle)
    local deadline
    BUSY=$(busy_1s)
    if ((WAIT_IDLE > 0 && BUSY > 10)); then
        log "  machine ${BUSY}% busy; waiting up to ${WAIT_IDLE}s for it to be quiet…"
        deadline=$((SECONDS + WAIT_IDLE))
        while ((BUSY > 10 && SECONDS < deadline)); do
            sleep 3
            BUSY=$(busy_1s)
        done
    fi
    LOAD=$(awk '{ print $1, $2, $3 }' /proc/loadavg)
}

join() { local IFS=';' s; s="$*"; echo "${s//;/; }"; }

fmt() { awk -v v="$1" -v f="$2" 'BEGIN { printf f, v }'; }

strip() { sed 's/\x1b\[[0-9;]*m//g' "$1"; }

# ---------------------------------------------------------------- setup
START_DATE=$(date -u '+%Y-%m-%d %H:%M:%S UTC')
KERNEL=$(uname -r)
CPU_MODEL=$(awk -F: '/^model name/ { sub(/^[ \t]+/, "", $2); print $2; exit }' /proc/cpuinfo)
NCPU=$(nproc --all)
ver() { timeout 10 "$@" 2>&1 | sed 's/\x1b\[[0-9;]*m//g' | awk 'NF && !d { print; d = 1 }' || true; }
V_SOCKPERF=$(ver sockperf --version)
V_IPERF=$(ver iperf3 -v)
V_SLUICE=$(ver "$SLUICE_BIN" --version)
GIT_REV=$(git -C "$(dirname "$SLUICE_ORIG")" rev-parse --short HEAD 2>/dev/null || true)
SLUICE_SUM=$(sha256sum "$SLUICE_BIN" | cut -c1-12)

# Loopback ports: three consecutive free ones (sockperf, iperf3, sluice's control port; sluice
# opens its data listener on an ephemeral port). The same ports are used in the namespaces.
PORT_SP="" PORT_IP="" PORT_SL=""
for ((try = 0; try < 200; try++)); do
    base=$((41000 + (($$ + try * 7919) % 8000) * 3))
    if port_free "$base" && port_free $((base + 1)) && port_free $((base + 2)); then
        PORT_SP=$base PORT_IP=$((base + 1)) PORT_SL=$((base + 2))
        break
    fi
done
[[ -n $PORT_SP ]] || die "found no free ports"

log "calibrate: setting up namespaces $NS_A/$NS_B…"
for ns in "$NS_A" "$NS_B"; do
    ip netns add "$ns"
    CREATED_NS+=("$ns")
    ip -n "$ns" link set lo up
done
ip -n "$NS_A" link add veth0 type veth peer name veth0 netns "$NS_B"
ip -n "$NS_A" addr add "$ADDR_A/24" dev veth0
ip -n "$NS_B" addr add "$ADDR_B/24" dev veth0
ip -n "$NS_A" link set veth0 up
ip -n "$NS_B" link set veth0 up
ok=0
for _ in {1..10}; do
    if ip netns exec "$NS_A" ping -c 1 -W 1 -q "$ADDR_B" >/dev/null 2>&1; then ok=1; break; fi
done
((ok)) || die "$NS_A cannot reach $ADDR_B over the veth pair"
VETH_INFO=$(ip -n "$NS_A" -o link show veth0 | awk '{ for (i = 1; i <= NF; i++) if ($i == "mtu") print "MTU " $(i + 1) }')

# The profiles. remotehost and duration are replaced by --to and --duration.
PROF_RR=$TMP/calib-rr-200x200.xml
PROF_STR=$TMP/calib-str-write128k.xml
cat >"$PROF_RR" <<EOF
<?xml version="1.0"?>
<!-- as sockperf ping-pong over TCP with 200-byte messages: one connection, TCP_NODELAY, 200 bytes each way -->
<profile name="calib-rr-200x200">
  <group nthreads="1">
    <transaction iterations="1">
      <flowop type="connect" options="remotehost=127.0.0.1 protocol=tcp tcp_nodelay"/>
    </transaction>
    <transaction duration="${DURATION}s">
      <flowop type="write" options="size=200"/>
      <flowop type="read" options="size=200"/>
    </transaction>
    <transaction iterations="1">
      <flowop type="disconnect"/>
    </transaction>
  </group>
</profile>
EOF
cat >"$PROF_STR" <<EOF
<?xml version="1.0"?>
<!-- as iperf3 with one stream and its default 128 KiB writes: the client writes, the server reads -->
<profile name="calib-str-write128k">
  <group nthreads="1">
    <transaction iterations="1">
      <flowop type="connect" options="remotehost=127.0.0.1 protocol=tcp"/>
    </transaction>
    <transaction duration="${DURATION}s">
      <flowop type="write" options="size=128k"/>
    </transaction>
    <transaction iterations="1">
      <flowop type="disconnect"/>
    </transaction>
  </group>
</profile>
EOF

# ---------------------------------------------------------------- measurements
# Each sets VAL (the compared figure) and EXTRA (a side figure) or leaves VAL empty on failure.
# Arguments: path cns sns addr tag.

m_sockperf() {
    local cns=$2 sns=$3 addr=$4 tag=$5 out rtt p50
    out=$TMP/$tag.sockperf-pp.txt
    VAL="" EXTRA=""
    server "$sns" "$PORT_SP" "$TMP/$tag.sockperf-sr.txt" sockperf sr --tcp -i "$addr" -p "$PORT_SP" || return 0
    in_ns "$cns" timeout "$BOUND" sockperf pp --tcp -i "$addr" -p "$PORT_SP" -m 200 -t "$DURATION" --full-rtt \
        >"$out" 2>&1 || true
    stop_servers
    rtt=$(strip "$out" | sed -n 's/.*Round trip is \([0-9.]*\) usec.*/\1/p' | head -n 1)
    p50=$(strip "$out" | sed -n 's/.*percentile 50\.000 = *\([0-9.]*\).*/\1/p' | head -n 1)
    if [[ -n $rtt ]] && awk -v r="$rtt" 'BEGIN { exit !(r > 0) }'; then
        VAL=$(awk -v r="$rtt" 'BEGIN { printf "%.1f", 1e6 / r }')
        EXTRA="rtt ${rtt} µs, p50 ${p50:-?} µs"
        R[$1,rtt_ref]+=" $rtt"
        [[ -z $p50 ]] || R[$1,p50_ref]+=" $p50"
    else
        note "$tag: sockperf gave no round trip: $(strip "$out" | tail -n 2 | tr '\n' ' ')"
    fi
}

m_sluice() {  # … profile kind(rr|str)
    local cns=$2 sns=$3 addr=$4 tag=$5 prof=$6 kind=$7 out agree
    out=$TMP/$tag.sluice-$kind.json
    VAL="" EXTRA=""
    server "$sns" "$PORT_SL" "$TMP/$tag.sluice-serve.txt" "$SLUICE_BIN" bench serve --listen "$addr" --port "$PORT_SL" ||
        return 0
    in_ns "$cns" timeout "$BOUND" "$SLUICE_BIN" bench run --to "$addr:$PORT_SL" -m "$prof" --duration "$DURATION" \
        --json >"$out" 2>"$TMP/$tag.sluice-$kind.err" || true
    stop_servers
    if ! [[ -s $out ]] || ! jq -e '.results[0].tps | numbers' "$out" >/dev/null 2>&1; then
        note "$tag: sluice bench run ($kind) failed: $(tail -n 2 "$TMP/$tag.sluice-$kind.err" | tr '\n' ' ')"
        return 0
    fi
    agree=$(jq -r '.results[0].counts_agree' "$out")
    [[ $agree == true ]] || note "$tag: sluice bench ($kind): client and server counts disagree"
    if [[ $kind == rr ]]; then
        VAL=$(jq -r '.results[0].tps' "$out")
        EXTRA=$(jq -r '.results[0].latency | "mean \(.mean_us*10|round/10) µs, p50 \(.p50_us*10|round/10) µs"' "$out")
        R[$1,mean_sl]+=" $(jq -r '.results[0].latency.mean_us' "$out")"
        R[$1,p50_sl]+=" $(jq -r '.results[0].latency.p50_us' "$out")"
    else
        VAL=$(jq -r '.results[0].gbit_per_s' "$out")
        EXTRA=$(jq -r '.results[0] | "\(.client.transactions) writes in \(.duration_s*1000|round/1000) s"' "$out")
    fi
}

m_iperf3() {
    local cns=$2 sns=$3 addr=$4 tag=$5 out bps err
    out=$TMP/$tag.iperf3.json
    VAL="" EXTRA=""
    server "$sns" "$PORT_IP" "$TMP/$tag.iperf3-s.txt" iperf3 -s -1 -B "$addr" -p "$PORT_IP" || return 0
    in_ns "$cns" timeout "$BOUND" iperf3 -c "$addr" -p "$PORT_IP" -t "$DURATION" -J >"$out" 2>&1 || true
    stop_servers
    bps=$(jq -r '.end.sum_received.bits_per_second // empty' "$out" 2>/dev/null || true)
    if [[ -n $bps ]]; then
        VAL=$(awk -v b="$bps" 'BEGIN { printf "%.4f", b / 1e9 }')
        EXTRA="retransmits $(jq -r '.end.sum_sent.retransmits // "?"' "$out")"
    else
        err=$(jq -r '.error // empty' "$out" 2>/dev/null || true)
        note "$tag: iperf3 gave no result: ${err:-$(tail -n 2 "$out" | tr '\n' ' ')}"
    fi
}

measure() {  # path rep test tool
    local path=$1 rep=$2 test=$3 tool=$4 cns sns addr tag
    if [[ $path == loopback ]]; then cns="" sns="" addr=127.0.0.1; else cns=$NS_A sns=$NS_B addr=$ADDR_B; fi
    tag="r$rep.$path.$test.$tool"
    load_now
    log "  rep $rep/$REPS $path $test $tool (load ${LOAD// /\/}, ${BUSY}% busy)…"
    case $tool in
        sockperf) m_sockperf "$path" "$cns" "$sns" "$addr" "$tag" ;;
        iperf3) m_iperf3 "$path" "$cns" "$sns" "$addr" "$tag" ;;
        sluice) if [[ $test == rr ]]; then
                    m_sluice "$path" "$cns" "$sns" "$addr" "$tag" "$PROF_RR" rr
                else
                    m_sluice "$path" "$cns" "$sns" "$addr" "$tag" "$PROF_STR" str
                fi ;;
    esac
    local side=ref
    [[ $tool == sluice ]] && side=sl
    if [[ -n $VAL ]]; then
        R[$path,$test,$side]+=" $VAL"
        eval "V_${side}=\$VAL"
    else
        eval "V_${side}=''"
    fi
    local shown=n/a
    if [[ -n $VAL ]]; then
        if [[ $test == rr ]]; then shown="$(fmt "$VAL" "%.0f") tx/s"; else shown="$(fmt "$VAL" "%.2f") Gbit/s"; fi
    fi
    RAW+=("| $rep | $path | $test | $tool | $shown | ${EXTRA:-} | ${LOAD// / / } | ${BUSY}% |")
    log "    → $shown${EXTRA:+ ($EXTRA)}"
}

PATHS=(loopback veth)
log "calibrate: ${PATHS[*]}; ${DURATION}s per measurement, $REPS rep(s); ports $PORT_SP (sockperf), $PORT_IP (iperf3), $PORT_SL (sluice)"
for ((rep = 1; rep <= REPS; rep++)); do
    for path in "${PATHS[@]}"; do
        for test in rr str; do
            if [[ $test == rr ]]; then ref=sockperf; else ref=iperf3; fi
            V_ref="" V_sl=""
            if ((rep % 2)); then order=("$ref" sluice); else order=(sluice "$ref"); fi
            for tool in "${order[@]}"; do measure "$path" "$rep" "$test" "$tool"; done
            if [[ -n $V_ref && -n $V_sl ]] && awk -v b="$V_ref" 'BEGIN { exit !(b > 0) }'; then
                R[$path,$test,ratio]+=" $(awk -v a="$V_sl" -v b="$V_ref" 'BEGIN { printf "%.4f", a / b }')"
            fi
        done
    done
done

# ---------------------------------------------------------------- report
summary() {  # key fmt: sets CELL ("median (min–max)") and MED
    local vals=${R[$1]:-} f=$2 lo hi n
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

report() {
    local p t row ref unit f verdicts=() r lo
    echo "# sluice bench calibration against sockperf and iperf3"
    echo
    echo "- date: $START_DATE"
    echo "- kernel: $KERNEL"
    echo "- CPU: ${CPU_MODEL:-?}, $NCPU CPUs"
    echo "- tools: $V_SOCKPERF; $V_IPERF; $V_SLUICE${GIT_REV:+ (tree at commit $GIT_REV)}, binary $SLUICE_ORIG (sha256 $SLUICE_SUM…)"
    echo "- command: \`$CMDLINE\`"
    echo "- per measurement: ${DURATION} s; repetitions: $REPS; cells: median (min–max) over repetitions"
    echo "- paths: loopback = 127.0.0.1 in the host namespace; veth = client in $NS_A ($ADDR_A/24), server in $NS_B ($ADDR_B/24), one veth pair (${VETH_INFO:-?}, offloads default)"
    echo "- waiting for a quiet machine: $( ((WAIT_IDLE)) && echo "up to ${WAIT_IDLE} s before each measurement (≤10% busy)" || echo "no (--wait-idle 0)")"
    echo "- placement: nothing pinned; tools alternate (reference first in odd repetitions, sluice first in even ones)"
    echo
    for p in "${PATHS[@]}"; do
        echo "## $p"
        echo
        echo "| test | reference tool | reference | sluice bench | sluice / reference |"
        echo "|---|---|--:|--:|--:|"
        for t in rr str; do
            if [[ $t == rr ]]; then
                ref="sockperf pp, 200 B" unit="tx/s" f="%.0f"
            else
                ref="iperf3, 1 stream, 128 KiB writes" unit="Gbit/s" f="%.2f"
            fi
            row="| ${t^^} $unit | $ref"
            summary "$p,$t,ref" "$f"; row+=" | $CELL"
            summary "$p,$t,sl" "$f"; row+=" | $CELL"
            summary "$p,$t,ratio" "%.3f"; row+=" | $CELL |"
            echo "$row"
            if [[ -n $MED ]]; then
                # shellcheck disable=SC2086
                lo=$(printf '%s\n' ${R[$p,$t,ratio]} | sort -g | head -n 1)
                verdicts+=("$p ${t^^}: ratio $(fmt "$MED" "%.3f") (min $(fmt "$lo" "%.3f"))")
                MEDR[$p,$t]=$MED
            fi
        done
        echo
        summary "$p,rtt_ref" "%.1f"; r=$CELL
        summary "$p,p50_ref" "%.1f"; local p50r=$CELL
        summary "$p,mean_sl" "%.1f"; local ms=$CELL
        summary "$p,p50_sl" "%.1f"
        echo "RR round trip, µs: sockperf mean $r, p50 $p50r; sluice bench mean $ms, p50 $CELL."
        echo
    done
    echo "## Reading"
    echo
    local out=() inside=()
    for p in "${PATHS[@]}"; do
        for t in rr str; do
            r=${MEDR[$p,$t]:-}
            [[ -n $r ]] || { out+=("$p ${t^^} (no result)"); continue; }
            if awk -v r="$r" 'BEGIN { exit !(r < 0.9 || r > 1.1) }'; then
                out+=("$p ${t^^} ($(fmt "$r" "%.3f"))")
            else
                inside+=("$p ${t^^} ($(fmt "$r" "%.3f"))")
            fi
        done
    done
    echo "Requirement: sluice bench within 10% of sockperf (RR) and iperf3 (STR), or the difference explained."
    if ((${#inside[@]})); then
        echo "Within 10% (median ratio 0.90–1.10): $(join "${inside[@]}")."
    fi
    if ((${#out[@]})); then
        echo "Outside 10%: $(join "${out[@]}") — these need explaining before sluice bench figures on such a path are trusted."
    else
        echo "No gap beyond 10%: on these paths the modeler is not the bottleneck."
    fi
    echo "Ratios are per repetition (each pair of runs back to back), then the median; a wide min–max means"
    echo "the machine's load changed during the run (see the per-measurement load below)."
    echo
    echo "## Notes"
    echo
    echo "- RR transactions/s for sockperf = 1e6 / average round trip (\"Round trip is X usec\" with --full-rtt); sockperf excludes its 400 ms warm-up from that average. sluice bench: \`tps\` = transactions / measured seconds."
    echo "- STR: iperf3's end.sum_received.bits_per_second (bytes the server received); sluice bench's \`gbit_per_s\` (payload bytes the client wrote, both directions added, here one; the client and server counts are checked to agree)."
    echo "- Profiles (generated; remotehost and duration replaced by --to and --duration):"
    echo
    echo '```xml'
    cat "$PROF_RR"
    echo '```'
    echo
    echo '```xml'
    cat "$PROF_STR"
    echo '```'
    echo
    for n in "${NOTES[@]}"; do echo "- $n"; done
    ((${#NOTES[@]} == 0)) || echo
    echo "## Every measurement"
    echo
    echo "Load: /proc/loadavg (1/5/15 min) and the % of all CPUs busy in a 1 s sample, both taken just before the measurement (our own tools idle)."
    echo
    echo "| rep | path | test | tool | result | detail | loadavg | busy |"
    echo "|--:|---|---|---|--:|---|---|--:|"
    printf '%s\n' "${RAW[@]}"
}

declare -A MEDR=()
if [[ -n $OUT ]]; then
    report | tee "$OUT"
else
    report
fi

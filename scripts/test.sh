#!/usr/bin/env bash
# The whole sluice test suite, as the README's second command and CI run it
# (docs/testing.md says what is in it and how to run a part of it).
#
# Needs root (the system tier's tests build network namespaces, TAP devices and BPF
# programs) and a Debian-like host. Installs the tools the tests drive if any is missing —
# and always under CI=true — then checks formatting and lints and runs every test of both
# tiers (`-- --include-ignored`) with an optimized build (the integration tests move
# hundreds of megabytes through the switch). The tests run in a cgroup of their own: a
# process of theirs still running when they end is named, killed and fails the run. A run
# that changed a file git tracks fails too.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" != 0 ]; then
    echo "scripts/test.sh runs the system tier, which needs root: run it as root, or run \`cargo test\` for the pure tier (docs/testing.md)" >&2
    exit 1
fi

# openvswitch-switch: `sluice study`'s ovs path is tested against the real thing (the
# study starts private OVS daemons; the package's own service is not needed).
# clang + libbpf-dev: the kernel datapath's programs are compiled from C when sluice builds.
# redis-server, redis-tools, socat, nginx, curl, apache2-utils (ab), wrk: real programs on
# the shared-memory fast path and in the studies (the tests start their own nginx on a
# port of their own).
# ethtool: the VXLAN tests fill checksums in software on their veth underlays, as a NIC
# would (a veth leaves them to the receiver, and a user-space tunnel end reads raw bytes).
# python3-prometheus-client: Prometheus's own OpenMetrics parser reads the metrics
# endpoint in the tests (Debian's /usr/bin/python3, whatever python3 is first on PATH).
# tmux: `sluice top`'s live view is drawn in a tmux pane and read back (capture-pane).
# libpcap-dev: sluice links libpcap for `sluice capture`'s filters (libpcap's own compiler).
# qemu-system-x86, linux-image-amd64, busybox-static: the VM tests boot QEMU guests (TCG)
# on vhost-user ports, with Debian's kernel and an initramfs `sluice lab up --vm` builds;
# xz-utils unpacks the kernel for a direct (PVH) boot.
PACKAGES=(iproute2 iputils-ping netcat-openbsd iperf3 sockperf tshark python3 procps openvswitch-switch clang libbpf-dev
    redis-server redis-tools socat nginx curl apache2-utils wrk ethtool python3-prometheus-client tmux libpcap-dev
    qemu-system-x86 linux-image-amd64 busybox-static xz-utils)
TOOLS=(ip ping nc iperf3 sockperf tshark python3 ss ovs-vsctl clang redis-server redis-benchmark socat nginx curl ab wrk
    ethtool tmux qemu-system-x86_64 busybox xz)
# libvirt-daemon-system, libvirt-clients: the libvirt test starts libvirtd and virtlogd and
# defines a domain with virsh on a vhost-user port (the package makes the user libvirt-qemu).
PACKAGES+=(libvirt-daemon-system libvirt-clients)
TOOLS+=(libvirtd virtlogd virsh)
# podman, containernetworking-plugins (host-local in /usr/lib/cni), nftables: the CNI plugin
# is driven as a runtime drives it, then by podman itself; it masquerades with nft.
PACKAGES+=(podman containernetworking-plugins nftables)
TOOLS+=(podman nft)
# dnsmasq-base, nftables: a switch's gateway runs dnsmasq (DHCP, router
# advertisements) and masquerades with nft; the guests in its tests ask for an address with
# busybox's udhcpc (busybox-static's, above: Debian's busybox conflicts with it).
PACKAGES+=(dnsmasq-base nftables)
TOOLS+=(dnsmasq busybox nft)
# postgresql: a fork-per-connection server (postmaster and backends) on the shared-memory
# fast path, driven by its pgbench (the package also starts Debian's own cluster; the
# test starts a server of its own, as nobody, on a port of its own).
PACKAGES+=(postgresql)
# memcached, libmemcached-tools: a threaded event-loop server and its tools (memcslap,
# memccp, memccat) on the shared-memory fast path.
PACKAGES+=(memcached libmemcached-tools)
TOOLS+=(memcached memcslap memccp memccat)
# git: git's daemon hands each connection to other programs (inetd-style) on the
# shared-memory fast path.
PACKAGES+=(git)
TOOLS+=(git)
# openssh-server, openssh-client: sshd re-executes itself per connection after closing
# every other descriptor and sandboxes its pre-authentication child with seccomp — a
# session through it on the shared-memory fast path.
PACKAGES+=(openssh-server openssh-client)
TOOLS+=(sshd ssh ssh-keygen)
# gobgpd, frr: EVPN — each sluice host's switch starts Debian's gobgpd; FRR's bgpd and zebra
# are the route reflector and the Linux EVPN host the tests interoperate with (vtysh reads
# their tables back).
PACKAGES+=(gobgpd frr)
TOOLS+=(gobgpd vtysh)

missing=()
for t in "${TOOLS[@]}"; do command -v "$t" >/dev/null 2>&1 || missing+=("$t"); done
# man-db (groff): the manual pages `sluice man` writes are rendered and checked for groff's
# warnings; dpkg-dev + binutils: scripts/deb.sh builds the Debian package in the tests
# (dpkg-shlibdeps computes its Depends, strip strips its binaries).
PACKAGES+=(man-db dpkg-dev binutils)
for t in man groff dpkg-deb dpkg-shlibdeps strip; do command -v "$t" >/dev/null 2>&1 || missing+=("$t"); done
[ -e /usr/include/bpf/bpf_helpers.h ] || missing+=(libbpf-dev)
[ -e /usr/include/pcap/pcap.h ] || missing+=(libpcap-dev)
/usr/bin/python3 -c 'import prometheus_client' 2>/dev/null || missing+=(python3-prometheus-client)
ls /boot/vmlinuz-* >/dev/null 2>&1 || missing+=(linux-image-amd64)
ls /usr/lib/postgresql/*/bin/pgbench >/dev/null 2>&1 || missing+=(postgresql)
[ -x /usr/lib/cni/host-local ] || missing+=(containernetworking-plugins)
if [ "${CI:-}" = true ] || [ ${#missing[@]} -gt 0 ]; then
    [ ${#missing[@]} -gt 0 ] && echo "installing test tools (missing: ${missing[*]})"
    apt-get update
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${PACKAGES[@]}"
fi

# What git tracks and the run must not change: the tracked files that differ from HEAD,
# each with its content's hash. A checkout that had changes before the run is held to
# them; a clean one (CI's) to none. (safe.directory: root runs the tests in a checkout
# that may be another user's.)
GIT=(git -c safe.directory="$PWD")
in_git=false
if [ -e .git ] && "${GIT[@]}" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    in_git=true
fi
tracked_changes() {
    "${GIT[@]}" diff HEAD --name-only | while IFS= read -r f; do
        if [ -e "$f" ]; then echo "$("${GIT[@]}" hash-object -- "$f") $f"; else echo "deleted $f"; fi
    done
}
$in_git && before="$(tracked_changes)"

# Each step's header says when it began (seconds since the run started): where CI's time goes.
step() { echo "== $1 (at ${SECONDS} s)"; }
step "cargo fmt --check"
cargo fmt --all -- --check

# The tests run in a cgroup v2 of their own (a new one, mkdtemp's name), so that every
# process they start — however it was detached — is found when they end. Without a
# writable cgroup v2 they run in a session of their own instead, which a process that
# calls setsid (a daemon) leaves unseen.
cg_mount="$(awk '$3 == "cgroup2" { print $2; exit }' /proc/self/mounts)"
cg=""
if [ -n "$cg_mount" ] && [ -w "$cg_mount/cgroup.procs" ]; then
    cg="$(mktemp -d "$cg_mount/sluice-test.XXXXXX" 2>/dev/null)" || cg=""
fi
sid_file="$(mktemp)"
# The processes of the tests still running: "PID ARGS" lines.
leftovers() {
    local pids=()
    if [ -n "$cg" ]; then
        mapfile -t pids < <(find "$cg" -name cgroup.procs -exec cat {} +)
    elif [ -s "$sid_file" ]; then
        mapfile -t pids < <(ps -e -o pid=,sid= | awk -v s="$(cat "$sid_file")" '$2 == s { print $1 }')
    fi
    [ ${#pids[@]} -gt 0 ] && ps -o pid=,args= -p "$(IFS=,; echo "${pids[*]}")" || true
}
end_leftovers() {
    local i
    for i in $(seq 50); do
        [ -n "$(leftovers)" ] || return 0
        if [ -n "$cg" ] && [ -e "$cg/cgroup.kill" ]; then
            echo 1 >"$cg/cgroup.kill"
        else
            leftovers | awk '{ print $1 }' | xargs -r kill -KILL 2>/dev/null || true
        fi
        sleep 0.2
    done
}
# On any exit, interrupted or failed too: nothing of the tests' is left running, and
# their cgroup goes.
cleanup() {
    local status=$?
    set +e
    end_leftovers
    if [ -n "$cg" ] && ! rmdir "$cg" 2>/dev/null; then
        echo "warning: cannot remove the tests' cgroup $cg" >&2
    fi
    rm -f "$sid_file"
    exit $status
}
trap cleanup EXIT

# `cargo test --workspace --release -- --include-ignored`, with the test binaries two at a
# time (the ones that load both CPUs or need prompt scheduling alone): scripts/test-lanes.py.
# Beside them, at the scheduler's idle priority, the lints (clippy, warnings denied) and the
# fuzz targets' build: the binaries that run side by side mostly wait on things outside
# them, and these use the CPU they leave (they stop while the binaries that run alone run).
# (ionice: their disk work waits for the tests' too.)
BESIDE="exec ionice -c 3 bash -c 'cargo clippy --locked --workspace --all-targets --release -- -D warnings && bash scripts/fuzz.sh --build-only'"
step "cargo test (release, both tiers), with clippy -D warnings and the fuzz build beside it"
if [ -n "$cg" ]; then
    echo "(in cgroup ${cg#"$cg_mount"})"
    set +e
    (echo "$BASHPID" >"$cg/cgroup.procs" && exec python3 scripts/test-lanes.py --beside "$BESIDE")
    status=$?
    set -e
else
    echo "(no writable cgroup v2 here: the tests run in a session of their own; a daemon that leaves it is not seen)"
    set +e
    setsid --wait bash -c 'echo $$ >"$1"; shift; exec "$@"' _ "$sid_file" \
        python3 scripts/test-lanes.py --beside "$BESIDE"
    status=$?
    set -e
fi
left="$(leftovers)"
if [ -n "$left" ]; then
    end_leftovers
    echo "error: processes the tests started still ran after them (now killed):" >&2
    echo "$left" | sed 's/^ */  /' >&2
    exit 1
fi
[ $status = 0 ] || exit $status

# Every parser that faces the outside, 20 s per target, two at a time (skipped, and said
# so, without a nightly toolchain); the long runs are in docs/results/*-fuzz.md.
step "fuzz (20 s per target, two at a time)"
bash scripts/fuzz.sh --time 20 --jobs 2

if $in_git; then
    step "tracked files unchanged"
    after="$(tracked_changes)"
    if [ "$after" != "$before" ]; then
        mapfile -t changed < <(diff <(echo "$before") <(echo "$after") | sed -n 's/^[<>] [^ ]* //p' | sort -u)
        echo "error: the run changed files git tracks:" >&2
        "${GIT[@]}" status --porcelain --untracked-files=no -- "${changed[@]}" | sed 's/^/  /' >&2
        exit 1
    fi
fi
step "done"

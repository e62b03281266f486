#!/usr/bin/env bash
# The whole sluice test suite, as the README's second command and CI run it.
#
# Needs root (the integration tests build network namespaces and TAP devices) and a
# Debian-like host. Installs the tools the tests drive if any is missing — and always
# under CI=true — then checks formatting and lints and runs every test with an optimized
# build (the integration tests move hundreds of megabytes through the switch).
set -euo pipefail
cd "$(dirname "$0")/.."

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

missing=()
for t in "${TOOLS[@]}"; do command -v "$t" >/dev/null 2>&1 || missing+=("$t"); done
[ -e /usr/include/bpf/bpf_helpers.h ] || missing+=(libbpf-dev)
[ -e /usr/include/pcap/pcap.h ] || missing+=(libpcap-dev)
/usr/bin/python3 -c 'import prometheus_client' 2>/dev/null || missing+=(python3-prometheus-client)
ls /boot/vmlinuz-* >/dev/null 2>&1 || missing+=(linux-image-amd64)
if [ "${CI:-}" = true ] || [ ${#missing[@]} -gt 0 ]; then
    [ ${#missing[@]} -gt 0 ] && echo "installing test tools (missing: ${missing[*]})"
    apt-get update
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${PACKAGES[@]}"
fi
if [ "$(id -u)" != 0 ]; then
    echo "warning: not root: the integration tests will skip themselves" >&2
fi

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy -D warnings"
cargo clippy --locked --workspace --all-targets --release -- -D warnings
echo "== cargo test (release)"
cargo test --locked --workspace --release
# Every parser that faces the outside, 20 s per target (skipped, and said so, without a
# nightly toolchain); the long runs are in docs/results/*-fuzz.md.
echo "== fuzz (20 s per target)"
bash scripts/fuzz.sh --time 20

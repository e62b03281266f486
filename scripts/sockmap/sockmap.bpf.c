// SPDX-License-Identifier: MIT OR Apache-2.0
//
// Kernel sockmap redirection between local TCP sockets, for measurement only
// (scripts/sockmap-measure.py): no part of the product loads this.
//
// Two programs and two maps:
//
// - `add_local` (BPF_PROG_TYPE_SOCK_OPS, attached to a cgroup v2): when a TCP socket of a
//   process in that cgroup becomes established (either end: connect or accept) and both
//   of its addresses are on loopback (127.0.0.0/8), it goes into `sockets`, a sockhash
//   keyed by the 4-tuple as that socket sees it (its own address and port first).
// - `redirect_to_peer` (BPF_PROG_TYPE_SK_MSG, attached to `sockets`): each sendmsg on a
//   socket in `sockets` looks up the peer by the mirrored 4-tuple and, if the peer is
//   there, hands the bytes straight to the peer's receive queue (BPF_F_INGRESS), skipping
//   the TCP/IP stack and the loopback device. A socket whose peer is not in the map (the other end outside
//   the cgroup, or not yet added) sends through the stack as usual.
// - `counters`: what happened, for the measurement's correctness check.
//
// Built by scripts/sockmap/loader.py: clang -target bpf -O2 -g, headers from the uapi
// (linux/bpf.h) and libbpf-dev (bpf/bpf_helpers.h); no vmlinux.h needed.
//
// Only IPv4 on 127.0.0.0/8: enough for a measurement against loopback. A product would
// decide "both ends on this host" from the host's addresses, and handle IPv6.

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#define AF_INET 2

// A TCP connection as one of its ends sees it. Addresses in network byte order (as the
// context gives them), ports in host byte order (normalised, see port_of_remote).
struct sock_key {
	__u32 local_ip4;
	__u32 remote_ip4;
	__u32 local_port;
	__u32 remote_port;
};

struct {
	__uint(type, BPF_MAP_TYPE_SOCKHASH);
	__uint(max_entries, 65536);
	__type(key, struct sock_key);
	__type(value, __u32);
} sockets SEC(".maps");

// Indices into `counters`.
enum {
	SOCKETS_ADDED,      // established sockets put into `sockets`
	SOCKETS_NOT_ADDED,  // bpf_sock_hash_update failed (map full, ...)
	MSGS_REDIRECTED,    // sendmsg calls handed to the peer socket
	BYTES_REDIRECTED,   // their bytes
	MSGS_PASSED,        // sendmsg calls whose peer was not in `sockets`: sent through the stack
	COUNTERS,
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, COUNTERS);
	__type(key, __u32);
	__type(value, __u64);
} counters SEC(".maps");

static __always_inline void count(__u32 index, __u64 n)
{
	__u64 *v = bpf_map_lookup_elem(&counters, &index);

	if (v)
		__sync_fetch_and_add(v, n);
}

static __always_inline int on_loopback(__u32 ip4)
{
	return (bpf_ntohl(ip4) >> 24) == 127;
}

// The context's remote_port holds the 16-bit network-order port; on little-endian hosts
// the kernel has placed it in the upper half of the 32-bit field (the local_port beside
// it is plain host order). Normalise to a host-order port, whichever half holds it.
static __always_inline __u32 port_of_remote(__u32 raw)
{
	__u32 p = bpf_ntohl(raw);

	if (p > 0xffff)
		p = bpf_ntohs((__u16)raw);
	return p;
}

SEC("sockops")
int add_local(struct bpf_sock_ops *ops)
{
	struct sock_key key = {};

	if (ops->op != BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB &&
	    ops->op != BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB)
		return 1;
	if (ops->family != AF_INET || !on_loopback(ops->local_ip4) ||
	    !on_loopback(ops->remote_ip4))
		return 1;

	key.local_ip4 = ops->local_ip4;
	key.remote_ip4 = ops->remote_ip4;
	key.local_port = ops->local_port;
	key.remote_port = port_of_remote(ops->remote_port);
	if (bpf_sock_hash_update(ops, &sockets, &key, BPF_NOEXIST) == 0)
		count(SOCKETS_ADDED, 1);
	else
		count(SOCKETS_NOT_ADDED, 1);
	return 1;
}

SEC("sk_msg")
int redirect_to_peer(struct sk_msg_md *msg)
{
	// The peer sees this connection mirrored: our remote end is its local end.
	struct sock_key peer = {
		.local_ip4 = msg->remote_ip4,
		.remote_ip4 = msg->local_ip4,
		.local_port = port_of_remote(msg->remote_port),
		.remote_port = msg->local_port,
	};
	__u32 size = msg->size;

	// The helper answers SK_DROP when the peer is not in the map; the message then goes
	// through the stack (SK_PASS without a redirect target) rather than being dropped.
	if (bpf_msg_redirect_hash(msg, &sockets, &peer, BPF_F_INGRESS) == SK_PASS) {
		count(MSGS_REDIRECTED, 1);
		count(BYTES_REDIRECTED, size);
	} else {
		count(MSGS_PASSED, 1);
	}
	return SK_PASS;
}

// The kernel refuses GPL-only helpers (bpf_trace_printk, the tracing helpers one reaches
// for when debugging this) to a program whose licence string is not GPL-compatible, and
// it knows compatibility only from this string. The helpers used above are not GPL-only,
// but "Dual MIT/GPL" is a string the kernel accepts as compatible while saying truly that
// this source is also MIT-licensed, so the program stays loadable when such a helper is
// added.
char LICENSE[] SEC("license") = "Dual MIT/GPL";

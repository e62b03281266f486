// SPDX-License-Identifier: MIT OR Apache-2.0
//
// Kernel sockmap redirection between the two ends of a local TCP connection, for
// measurement only (scripts/sockmap-measure.py; docs/results/2026-11-29-sockmap-splice.md):
// no part of the product loads this. Bytes a process sends go straight into the receive
// queue of the socket at the other end, skipping the TCP/IP stack and the loopback device.
//
// - `add_local` (BPF_PROG_TYPE_SOCK_OPS, attached to one or more cgroups v2): when a
//   TCP socket of a process in such a cgroup becomes established (connect or accept), it
//   goes into `sockets`, keyed by the connection as that socket sees it — its network
//   namespace, then its own address and port, then the peer's.
// - `redirect_to_peer` (BPF_PROG_TYPE_SK_MSG, attached to `sockets`): each send on a
//   socket in the map looks for the other end under the mirrored key, in the same network
//   namespace. Found: the bytes go to its receive queue (BPF_F_INGRESS). Not found (the
//   other end is in another namespace, outside the covered cgroups, not local at all, or
//   not established yet): they go through the stack as usual — and so do all this
//   socket's later sends, since bytes redirected after bytes sent through the stack could
//   be read before them (the receiver reads its redirected queue first).
//
// Why the network namespace is in the key: two namespaces can each have a connection with
// the same addresses and ports (127.0.0.1 in two containers); without it one container's
// bytes could reach the other's socket. With it, a connection between two namespaces
// never matches — it crosses their veths and the switch, whose policy must see it.
//
// Built by scripts/sockmap/loader.py: clang -target bpf -O2 -g, headers from the uapi
// (linux/bpf.h) and libbpf-dev (bpf/bpf_helpers.h).
//
// Addresses are kept as IPv6: an IPv4 address as ::ffff:a.b.c.d, which is also how an
// IPv6 socket that talks IPv4 sees it, so such a socket and an IPv4 one match.

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#define AF_INET 2
#define AF_INET6 10

// A TCP connection as one of its ends sees it. Addresses in network byte order, ports in
// host byte order (see port_of_remote).
struct sock_key {
	__u64 netns;
	__u32 local_ip[4];
	__u32 remote_ip[4];
	__u32 local_port;
	__u32 remote_port;
};

struct {
	__uint(type, BPF_MAP_TYPE_SOCKHASH);
	__uint(max_entries, 65536);
	__type(key, struct sock_key);
	__type(value, __u32);
} sockets SEC(".maps");

// Set on a socket that has sent bytes through the stack: it never redirects again.
struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, __u32);
} on_stack SEC(".maps");

// Indices into `counters`; loader.py names them in this order.
enum {
	SOCKETS_ADDED,     // established sockets put into `sockets`
	SOCKETS_NOT_ADDED, // the map refused one (full)
	MSGS_REDIRECTED,   // sends handed to the other end's socket
	BYTES_REDIRECTED,  // their bytes
	MSGS_ON_STACK,     // sends that went through the stack
	PEERS_NOT_FOUND,   // sockets that found no other end (then on the stack for good)
	SOCKETS_SKIPPED,   // established with bytes already moved (TCP Fast Open): not added
	MSGS_DROPPED,      // sends refused: no memory to remember a socket is on the stack
	COUNTERS,
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, COUNTERS);
	__type(key, __u32);
	__type(value, __u64);
} counters SEC(".maps");

static __always_inline void count(__u32 index, __u64 n)
{
	__u64 *v = bpf_map_lookup_elem(&counters, &index);

	if (v)
		*v += n;
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

static __always_inline void mapped(__u32 *to, __u32 ip4)
{
	to[0] = 0;
	to[1] = 0;
	to[2] = bpf_htonl(0xffff);
	to[3] = ip4;
}

// Copies an IPv6 address out of a program's context one 32-bit word at a time, as the
// verifier lets these context fields be read.
#define COPY_IP6(to, from)                \
	do {                              \
		(to)[0] = (from)[0];      \
		(to)[1] = (from)[1];      \
		(to)[2] = (from)[2];      \
		(to)[3] = (from)[3];      \
	} while (0)

SEC("sockops")
int add_local(struct bpf_sock_ops *ops)
{
	struct sock_key key = {};

	if (ops->op != BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB &&
	    ops->op != BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB)
		return 1;
	// A socket that moved bytes before it was established (TCP Fast Open: data in the
	// SYN) stays on the stack: its other end holds those bytes in its receive queue.
	if (ops->data_segs_out || ops->bytes_received) {
		count(SOCKETS_SKIPPED, 1);
		return 1;
	}
	key.netns = bpf_get_netns_cookie(ops);
	if (ops->family == AF_INET) {
		mapped(key.local_ip, ops->local_ip4);
		mapped(key.remote_ip, ops->remote_ip4);
	} else if (ops->family == AF_INET6) {
		COPY_IP6(key.local_ip, ops->local_ip6);
		COPY_IP6(key.remote_ip, ops->remote_ip6);
	} else {
		return 1;
	}
	key.local_port = ops->local_port;
	key.remote_port = port_of_remote(ops->remote_port);
	// BPF_ANY: a key still held by a socket on its way out is this connection's now.
	if (bpf_sock_hash_update(ops, &sockets, &key, BPF_ANY) == 0)
		count(SOCKETS_ADDED, 1);
	else
		count(SOCKETS_NOT_ADDED, 1);
	return 1;
}

SEC("sk_msg")
int redirect_to_peer(struct sk_msg_md *msg)
{
	struct sock_key peer = {};
	__u32 size = msg->size;
	struct bpf_sock *sk = msg->sk;
	__u32 *flag;

	if (!sk)
		return SK_PASS;
	flag = bpf_sk_storage_get(&on_stack, sk, 0, 0);
	if (flag && *flag) {
		count(MSGS_ON_STACK, 1);
		return SK_PASS;
	}
	// The other end sees this connection mirrored: our remote end is its local end.
	peer.netns = bpf_get_netns_cookie(msg);
	if (msg->family == AF_INET) {
		mapped(peer.local_ip, msg->remote_ip4);
		mapped(peer.remote_ip, msg->local_ip4);
	} else if (msg->family == AF_INET6) {
		COPY_IP6(peer.local_ip, msg->remote_ip6);
		COPY_IP6(peer.remote_ip, msg->local_ip6);
	} else {
		return SK_PASS;
	}
	peer.local_port = port_of_remote(msg->remote_port);
	peer.remote_port = msg->local_port;
	// The helper answers SK_DROP when the other end is not in the map: the bytes then go
	// through the stack (SK_PASS without a target), never dropped.
	if (bpf_msg_redirect_hash(msg, &sockets, &peer, BPF_F_INGRESS) == SK_PASS) {
		count(MSGS_REDIRECTED, 1);
		count(BYTES_REDIRECTED, size);
		return SK_PASS;
	}
	flag = bpf_sk_storage_get(&on_stack, sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
	if (!flag) {
		// No memory to remember it: refuse this send rather than risk bytes out of order
		// later. The sender sees an error (EACCES) and knows these bytes were not sent.
		count(MSGS_DROPPED, 1);
		return SK_DROP;
	}
	*flag = 1;
	count(PEERS_NOT_FOUND, 1);
	count(MSGS_ON_STACK, 1);
	return SK_PASS;
}

// The kernel knows a program's licence only from this string, and refuses GPL-only
// helpers to one that is not GPL-compatible. "Dual MIT/GPL" is accepted as compatible and
// says truly that this source is also MIT-licensed.
char LICENSE[] SEC("license") = "Dual MIT/GPL";

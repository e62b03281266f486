// SPDX-License-Identifier: MIT OR Apache-2.0 OR GPL-2.0-only
/*
 * A socket filter on a user-space VXLAN tunnel's UDP socket (SO_ATTACH_BPF): a datagram
 * whose outer source address is not one of the tunnel's endpoints is dropped in the
 * kernel, before it is queued on the socket or wakes the switch, and counted. The port
 * writes its configured remotes into sluice_tunnel_peers and reads sluice_tunnel_refused
 * as its `unknown_endpoint` drops. docs/architecture.md, "Tunnels and the underlay".
 *
 * Each tunnel socket loads its own copy (the maps are not pinned): the filter and its
 * maps live as long as the socket.
 *
 * When run, skb->data is the UDP header; the outer IP header is read at the network
 * header. A datagram whose header cannot be read passes: the port checks its sender again.
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "abi.h" /* the maps' layouts: written by build.rs from crates/ebpf-abi */

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1); /* set to the number of remotes when loaded */
	__type(key, struct sluice_ip_key);
	__type(value, __u32);
} sluice_tunnel_peers SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} sluice_tunnel_refused SEC(".maps");

/* Offsets of the source address in the IPv4 and IPv6 headers. */
#define IP4_SADDR 12
#define IP6_SADDR 8

SEC("socket")
int sluice_tunnel_filter(struct __sk_buff *skb)
{
	struct sluice_ip_key k = {};
	__u32 zero = 0;
	__u64 *refused;

	if (skb->protocol == bpf_htons(ETH_P_IP)) {
		if (bpf_skb_load_bytes_relative(skb, IP4_SADDR, k.addr, 4, BPF_HDR_START_NET))
			return skb->len;
		k.family = 4;
	} else if (skb->protocol == bpf_htons(ETH_P_IPV6)) {
		if (bpf_skb_load_bytes_relative(skb, IP6_SADDR, k.addr, 16, BPF_HDR_START_NET))
			return skb->len;
		k.family = 6;
	} else {
		return skb->len;
	}
	if (bpf_map_lookup_elem(&sluice_tunnel_peers, &k))
		return skb->len;
	refused = bpf_map_lookup_elem(&sluice_tunnel_refused, &zero);
	if (refused)
		(*refused)++;
	return 0;
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";

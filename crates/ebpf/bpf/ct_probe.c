// SPDX-License-Identifier: MIT OR Apache-2.0 OR GPL-2.0-only
/* The kernel's conntrack kfuncs called the way the kernel datapath is to call them:
 * placeholder helper ids that the loader rewrites into kfunc calls (src/kfunc.rs). Loaded
 * to check that this kernel takes them, and run by the tests. For an IPv4 TCP or UDP
 * frame it looks the frame's tuple up in zone 77: found, it returns 2 (the original
 * direction) or 3 (the reply); not found, it remembers the connection (10 s) and returns
 * 1, or 4 when the table is full; 0 for any other frame or error. */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/in.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "conntrack.h"

#define ZONE 77

SEC("classifier")
int sluice_ct_probe(struct __sk_buff *skb)
{
	struct ethhdr eth;
	struct iphdr ip;
	__u16 ports[2];

	if (bpf_skb_load_bytes(skb, 0, &eth, sizeof(eth)) || eth.h_proto != bpf_htons(ETH_P_IP))
		return 0;
	if (bpf_skb_load_bytes(skb, sizeof(eth), &ip, sizeof(ip)) || ip.ihl != 5)
		return 0;
	if (ip.protocol != IPPROTO_TCP && ip.protocol != IPPROTO_UDP)
		return 0;
	if (bpf_skb_load_bytes(skb, sizeof(eth) + sizeof(ip), ports, sizeof(ports)))
		return 0;
	struct bpf_sock_tuple t = {};
	t.ipv4.saddr = ip.saddr;
	t.ipv4.daddr = ip.daddr;
	t.ipv4.sport = ports[0];
	t.ipv4.dport = ports[1];
	struct bpf_ct_opts o = { .netns_id = -1, .l4proto = ip.protocol, .ct_zone_id = ZONE };
	struct nf_conn *ct = bpf_skb_ct_lookup(skb, &t, sizeof(t.ipv4), &o, sizeof(o));
	if (ct) {
		int r = o.dir ? 3 : 2;
		bpf_ct_release(ct);
		return r;
	}
	struct bpf_ct_opts a = { .netns_id = -1, .l4proto = ip.protocol, .ct_zone_id = ZONE };
	struct nf_conn___init *n = bpf_skb_ct_alloc(skb, &t, sizeof(t.ipv4), &a, sizeof(a));
	if (!n)
		return a.error == -12 ? 4 : 0;
	bpf_ct_set_timeout(n, 10000);
	ct = bpf_ct_insert_entry(n);
	if (!ct)
		return 0;
	bpf_ct_release(ct);
	return 1;
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";

// SPDX-License-Identifier: MIT OR Apache-2.0 OR GPL-2.0-only
/* A program the verifier must refuse (it reads packet memory without checking the
 * bounds): the tests load it to see that the refusal reaches the user with the verifier's
 * reason. Never loaded by sluice itself. */
#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>

SEC("classifier")
int sluice_exec(struct __sk_buff *skb)
{
	unsigned char *data = (void *)(long)skb->data;
	return data[20] ? TC_ACT_OK : TC_ACT_SHOT;
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";

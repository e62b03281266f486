// SPDX-License-Identifier: MIT OR Apache-2.0 OR GPL-2.0-only
/* The kernel's conntrack kfuncs, as the kernel datapath's programs call them (exec.c, and
 * the start-up probe ct_probe.c): the kernel's option block and the fields of its entries
 * they read, and each kfunc as a placeholder helper id that the loader rewrites into a
 * kfunc call of the running kernel (KFUNCS in src/kfunc.rs). Include after the BPF headers
 * (struct __sk_buff, struct bpf_sock_tuple). */
#ifndef SLUICE_CONNTRACK_H
#define SLUICE_CONNTRACK_H

struct bpf_ct_opts {
	__s32 netns_id;
	__s32 error;
	__u8 l4proto;
	__u8 dir;
	__u16 ct_zone_id;
	__u8 ct_zone_dir;
	__u8 reserved[3];
};
struct nf_conn {
	unsigned long status;
	__u32 mark;
} __attribute__((preserve_access_index));
struct nf_conn___init {
	struct nf_conn ct;
} __attribute__((preserve_access_index));

static struct nf_conn *(*bpf_skb_ct_lookup)(struct __sk_buff *, struct bpf_sock_tuple *, __u32,
					    struct bpf_ct_opts *, __u32) = (void *)0x7f00;
static struct nf_conn___init *(*bpf_skb_ct_alloc)(struct __sk_buff *, struct bpf_sock_tuple *, __u32,
						  struct bpf_ct_opts *, __u32) = (void *)0x7f01;
static struct nf_conn *(*bpf_ct_insert_entry)(struct nf_conn___init *) = (void *)0x7f02;
static void (*bpf_ct_release)(struct nf_conn *) = (void *)0x7f03;
static void (*bpf_ct_set_timeout)(struct nf_conn___init *, __u32) = (void *)0x7f04;
static int (*bpf_ct_change_timeout)(struct nf_conn *, __u32) = (void *)0x7f05;
static int (*bpf_ct_change_status)(struct nf_conn *, __u32) = (void *)0x7f07;

#endif

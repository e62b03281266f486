// SPDX-License-Identifier: MIT OR Apache-2.0 OR GPL-2.0-only
/*
 * sluice's kernel datapath: one TC ingress program on the switch side of every
 * veth-attached guest and on the uplink. It executes, for frames from known sources (or
 * from sources a full port may not learn) to ports the kernel reaches, the rule the core
 * wrote into the maps — known unicast to its port, the rest flooded — the same rule as
 * `sluice_switch::fastpath::decide`, which tests hold against the core; every other frame
 * goes up to the core through the upcall TAP, tagged with its input port.
 * docs/architecture.md, "The kernel datapath".
 *
 * A second, small program runs at the egress of the switch side of every guest's veth
 * and of the upcall TAP: only frames the switch sent (marked SLUICE_MARK) go on into the
 * guest, or into the TAP's queue (docs/architecture.md, "Frames into guests on the kernel
 * datapath").
 *
 * Offered under GPL-2.0 too only so that the kernel lets it call GPL-only helpers.
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "abi.h" /* the maps' layouts: written by build.rs from crates/ebpf-abi */

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, SLUICE_MAX_PORTS);
	__type(key, __u32);
	__type(value, struct sluice_port);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sluice_ports SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, SLUICE_MAX_PORTS);
	__type(key, __u32);
	__type(value, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sluice_port_of SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 8192); /* set to the switch's MAC table size when loaded */
	__type(key, struct sluice_fib_key);
	__type(value, struct sluice_fib_val);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sluice_fib SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct sluice_config);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sluice_config SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, SLUICE_MAX_PORTS);
	__type(key, __u32);
	__type(value, struct sluice_counters);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sluice_stats SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 8192); /* set to the switch's MAC table size when loaded */
	__type(key, struct sluice_ip_key);
	__type(value, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sluice_owners SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 8192); /* set to the switch's MAC table size when loaded */
	__type(key, struct sluice_neigh_key);
	__type(value, struct sluice_neigh_val);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sluice_neigh SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 64);
	__type(key, __u32);
	__type(value, struct sluice_tunnel);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sluice_tunnels SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384); /* both directions of up to 4094 VLANs on two tunnels */
	__type(key, struct sluice_vni_key);
	__type(value, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sluice_vnis SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096); /* the configured remotes of up to 64 tunnels */
	__type(key, struct sluice_endpoint_key);
	__type(value, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sluice_endpoints SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, struct sluice_remote_key);
	__type(value, struct sluice_remote);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sluice_remotes SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct sluice_switch_counters);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sluice_switch_stats SEC(".maps");

#define ETH_P_8021Q_BE bpf_htons(0x8100)
#define ETH_P_8021AD_BE bpf_htons(0x88a8)
#define SEEN_EVERY_NS 1000000000ULL

static __always_inline int is_group(const __u8 *mac)
{
	return mac[0] & 1;
}

/* (BPF has no memcmp.) */
static __always_inline int mac_eq(const __u8 *a, const __u8 *b)
{
	return a[0] == b[0] && a[1] == b[1] && a[2] == b[2] && a[3] == b[3] && a[4] == b[4] && a[5] == b[5];
}

static __always_inline int vlan_allowed(const struct sluice_port *p, __u16 vid)
{
	return (p->allowed[(vid >> 6) & 63] >> (vid & 63)) & 1;
}

/* The core's `VlanMode::ingress`: the VLAN a frame with `tci` (when `tagged`) joins on
 * port `p`, or -1 when the port does not take it. */
static __always_inline int vlan_in(const struct sluice_port *p, int tagged, __u16 tci)
{
	__u16 vid = tci & 0x0fff;

	if (!(p->flags & PF_TRUNK))
		return (!tagged || vid == 0) ? p->access_vid : -1;
	if (!tagged || vid == 0)
		return p->native_vid ? p->native_vid : -1;
	if (vlan_allowed(p, vid) || p->native_vid == vid)
		return vid;
	return -1;
}

/* The core's `VlanMode::egress`: -1 not a member, 0 untagged, 1 tagged. */
static __always_inline int vlan_out(const struct sluice_port *p, __u16 vid)
{
	if (!(p->flags & PF_TRUNK))
		return p->access_vid == vid ? 0 : -1;
	if (p->native_vid == vid)
		return 0;
	return vlan_allowed(p, vid) ? 1 : -1;
}

/* Hands the frame to the core: the input slot as an outer 802.1ad tag, out of the
 * upcall TAP, marked as the switch's (the TAP's egress program lets nothing else into its
 * queue). A frame that cannot be handed up is dropped, counted as `upcall_lost`. */
static __always_inline int up(struct __sk_buff *skb, __u32 slot, struct sluice_counters *c)
{
	__u32 zero = 0;
	struct sluice_config *cfg = bpf_map_lookup_elem(&sluice_config, &zero);

	if (!cfg || !cfg->upcall_ifindex || bpf_skb_vlan_push(skb, ETH_P_8021AD_BE, slot & 0x0fff)) {
		c->v[C_RX_DROP + D_UPCALL_LOST]++;
		return TC_ACT_SHOT;
	}
	c->v[C_UPCALLS]++;
	skb->mark = SLUICE_MARK;
	return bpf_redirect(cfg->upcall_ifindex, 0);
}

/* Hands a copy of the frame to the core, marked as up() marks it, and lets the original go
 * on to the host's stack, unmarked: group frames arriving on an uplink are the host's as
 * well as the guests'. (The host's copy is not the switch's to count; a copy that cannot go
 * up is the switch's loss.) */
static __always_inline int up_copy(struct __sk_buff *skb, __u32 slot, struct sluice_counters *c)
{
	__u32 zero = 0;
	struct sluice_config *cfg = bpf_map_lookup_elem(&sluice_config, &zero);

	if (!cfg || !cfg->upcall_ifindex || bpf_skb_vlan_push(skb, ETH_P_8021AD_BE, slot & 0x0fff)) {
		c->v[C_RX_DROP + D_UPCALL_LOST]++;
		return TC_ACT_OK;
	}
	__u32 mark = skb->mark;
	skb->mark = SLUICE_MARK;
	if (bpf_clone_redirect(skb, cfg->upcall_ifindex, 0))
		c->v[C_RX_DROP + D_UPCALL_LOST]++;
	else
		c->v[C_UPCALLS]++;
	skb->mark = mark;
	bpf_skb_vlan_pop(skb);
	return TC_ACT_OK;
}

static __always_inline int drop(struct sluice_counters *c, int cause)
{
	c->v[C_RX_DROP + cause]++;
	return TC_ACT_SHOT;
}

/* The mark a frame leaving for port `p` through its device's egress carries: a guest's
 * veth lets only marked frames in; an uplink or a tunnel device has no such filter, and
 * the mark would only leak there. */
static __always_inline __u32 mark_for(const struct sluice_port *p)
{
	return (p->flags & (PF_UPLINK | PF_TUNNEL)) ? 0 : SLUICE_MARK;
}

/* A copy of the frame out of port `p`'s device (its egress), marked as the switch's. */
static __always_inline long clone_to(struct __sk_buff *skb, const struct sluice_port *p)
{
	skb->mark = mark_for(p);
	long r = bpf_clone_redirect(skb, p->ifindex, 0);
	skb->mark = 0;
	return r;
}

/* Whether IPv4 address `a` (network order) may be the port's source. */
static __always_inline int ip4_ok(const struct sluice_port *p, __u32 a)
{
	if (a == 0)
		return 1;
#pragma unroll
	for (int i = 0; i < SLUICE_MAX_IPS; i++)
		if (i < p->n_ip4 && p->ip4[i] == a)
			return 1;
	return 0;
}

static __always_inline int ip6_eq(const __u8 *a, const __u8 *b)
{
	const __u64 *x = (const __u64 *)a, *y = (const __u64 *)b;

	return x[0] == y[0] && x[1] == y[1];
}

static __always_inline int ip6_ok(const struct sluice_port *p, const __u8 *a)
{
	const __u64 *x = (const __u64 *)a;

	if (x[0] == 0 && x[1] == 0)
		return 1;
#pragma unroll
	for (int i = 0; i < SLUICE_MAX_IPS; i++)
		if (i < p->n_ip6 && ip6_eq(p->ip6[i], a))
			return 1;
	return 0;
}

/* IP anti-spoofing: 0 pass, 1 spoofed, 2 up (the core learns this family). */
static __always_inline int check_ips(struct __sk_buff *skb, const struct sluice_port *p, __u16 proto)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;

	if (proto == bpf_htons(ETH_P_IP) || proto == bpf_htons(ETH_P_ARP)) {
		/* IPv4 source at 26, ARP sender address at 28. */
		int at = proto == bpf_htons(ETH_P_IP) ? 26 : 28;
		__u32 a;

		if (p->flags & PF_UP_V4)
			return 2;
		if (data + at + 4 > end)
			return 1;
		__builtin_memcpy(&a, data + at, 4);
		return ip4_ok(p, a) ? 0 : 1;
	}
	if (proto == bpf_htons(ETH_P_IPV6)) {
		__u8 a[16];

		if (p->flags & PF_UP_V6)
			return 2;
		if (data + 38 > end)
			return 1;
		__builtin_memcpy(a, data + 22, 16);
		return ip6_ok(p, a) ? 0 : 1;
	}
	return 0;
}

/* The core's `l3_max`: the IP packet's length, or for a GSO frame the length of its
 * largest segment (headers plus at most gso_size bytes of payload), compared with an
 * output's MTU. -1 when the headers are not where the program can read them (the core
 * decides then). */
static __always_inline long l3_len(struct __sk_buff *skb)
{
	long len = (long)skb->len - ETH_HLEN;
	__u32 gso = skb->gso_size;

	if (!gso)
		return len;
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > end)
		return -1;
	__u8 *ip = data + ETH_HLEN;
	__u32 hl;
	__u8 l4;
	if (eth->h_proto == bpf_htons(ETH_P_IP)) {
		if ((void *)(ip + 20) > end)
			return -1;
		hl = (ip[0] & 15) * 4;
		l4 = ip[9];
		if (hl < 20)
			return -1;
	} else if (eth->h_proto == bpf_htons(ETH_P_IPV6)) {
		if ((void *)(ip + 40) > end)
			return -1;
		hl = 40;
		l4 = ip[6];
	} else {
		return -1;
	}
	if (l4 == IPPROTO_TCP) {
		__u8 *t = ip + hl;
		if ((void *)(t + 13) > end)
			return -1;
		__u32 th = (t[12] >> 4) * 4;
		if (th < 20)
			return -1;
		hl += th;
	} else if (l4 == IPPROTO_UDP) {
		hl += 8;
	} else {
		return -1;
	}
	if (len < hl)
		return -1;
	__u32 payload = len - hl;
	return hl + (payload < gso ? payload : gso);
}

/* Gives the frame the tag an output wants: `otag` tagged with `otci`, else untagged.
 * `*tagged` and `*tci` say what it has now and are updated. Nonzero on failure. */
static __always_inline int retag(struct __sk_buff *skb, int *tagged, __u16 *tci, int otag, __u16 otci)
{
	if (*tagged && (!otag || *tci != otci)) {
		if (bpf_skb_vlan_pop(skb))
			return -1;
		*tagged = 0;
	}
	if (otag && !*tagged) {
		if (bpf_skb_vlan_push(skb, ETH_P_8021Q_BE, otci))
			return -1;
		*tagged = 1;
		*tci = otci;
	}
	return 0;
}

/* Counts a frame sent to an output (tagged: `otag`). */
static __always_inline void count_sent(struct sluice_counters *oc, struct __sk_buff *skb, int otag)
{
	oc->v[C_TX_FRAMES]++;
	oc->v[C_TX_BYTES] += skb->len + (otag ? 4 : 0);
	if (skb->gso_size)
		oc->v[C_TX_GSO]++;
}

/* A copy for mirror slot `m1` (slot + 1; 0: none) of a frame of VLAN `vid` leaving for
 * `oslot` from `slot`: the core's `add_mirrors` — a live kernel member of the VLAN, not the
 * input or the output, never holding anything back. */
static __always_inline void mirror(struct __sk_buff *skb, struct sluice_counters *c, __u32 m1, __u32 slot,
				   __u32 oslot, __u32 other, int vid, __u8 pcp, int *tagged, __u16 *tci, long l3)
{
	if (!m1 || m1 - 1 == slot || m1 - 1 == oslot || m1 == other)
		return;
	__u32 ms = m1 - 1;
	struct sluice_port *m = bpf_map_lookup_elem(&sluice_ports, &ms);
	struct sluice_counters *mc = bpf_map_lookup_elem(&sluice_stats, &ms);
	/* (A mirror the kernel cannot reach makes the ports it watches slow: their frames
	 * never get here. This guards the moment between two map writes.) */
	if (!m || !mc || !m->ifindex || !(m->flags & PF_KERNEL) || (m->flags & (PF_SLOW | PF_TUNNEL)))
		return;
	int mtag = vlan_out(m, vid);
	if (mtag < 0)
		return;
	c->v[C_COPIES]++;
	mc->v[C_TX_OFFERED]++;
	if (l3 > m->mtu) {
		mc->v[C_TX_DROP + D_OVER_MTU]++;
		return;
	}
	if (retag(skb, tagged, tci, mtag, ((__u16)pcp << 13) | (__u16)vid) || clone_to(skb, m)) {
		mc->v[C_TX_DROP + D_TX_ERROR]++;
		return;
	}
	count_sent(mc, skb, mtag);
}

/* Where a frame to a tunnel port goes: its VNI and the remote endpoint its destination
 * was heard from. */
struct tun_dst {
	__u32 vni;
	const struct sluice_tunnel *t;
	const struct sluice_remote *remote;
};

/* The VNI and endpoint for a frame of VLAN `vid` to `dmac` through tunnel port `out`, or 0
 * when the kernel does not know them (a VLAN without a VNI, a station not heard from: the
 * core sends it, to every endpoint). */
static __always_inline int tun_lookup(const struct sluice_port *out, int vid, const __u8 *dmac, struct tun_dst *td)
{
	__u32 ifindex = out->ifindex;
	td->t = bpf_map_lookup_elem(&sluice_tunnels, &ifindex);
	if (!td->t)
		return 0;
	__u32 vni = td->t->vni;
	if (td->t->flags & TUN_PER_VLAN) {
		struct sluice_vni_key vk = { .ifindex = ifindex, .id = vid };
		__u32 *v = bpf_map_lookup_elem(&sluice_vnis, &vk);
		if (!v)
			return 0;
		vni = *v;
	}
	struct sluice_remote_key rk = { .ifindex = ifindex, .vni = vni };
	__builtin_memcpy(rk.mac, dmac, 6);
	td->remote = bpf_map_lookup_elem(&sluice_remotes, &rk);
	td->vni = vni;
	return td->remote != 0;
}

/* Gives a frame for tunnel port `out` its tunnel key (VNI, remote, local address); the
 * device adds the VXLAN, UDP and IP headers. Nonzero on failure. */
static __always_inline int tun_key(struct __sk_buff *skb, const struct tun_dst *td)
{
	const struct sluice_tunnel *t = td->t;
	if (!t || !td->remote)
		return -1;
	struct bpf_tunnel_key k = {};
	__u64 flags;
	k.tunnel_id = td->vni;
	k.tunnel_ttl = t->ttl;
	if (t->flags & TUN_V6) {
		__builtin_memcpy(k.remote_ipv6, td->remote->addr, 16);
		__builtin_memcpy(k.local_ipv6, t->local, 16);
		flags = BPF_F_TUNINFO_IPV6;
	} else {
		__u32 r, l;
		__builtin_memcpy(&r, td->remote->addr, 4);
		__builtin_memcpy(&l, t->local, 4);
		k.remote_ipv4 = bpf_ntohl(r);
		k.local_ipv4 = bpf_ntohl(l);
		/* No outer UDP checksum over IPv4, as the kernel's vxlan sends by default. */
		flags = BPF_F_ZERO_CSUM_TX;
	}
	return bpf_skb_set_tunnel_key(skb, &k, sizeof(k), flags) ? -1 : 0;
}

/* Where a datagram from a tunnel came from: its VNI and outer source (IPv4 in the first
 * 4 bytes of `addr`). */
struct tun_src {
	__u32 vni;
	__u8 addr[16];
};

/* Counts a tunnel's frame as received and dropped for `cause` (the core's stage 1 for a
 * tunnel: `decide::stage1`). */
static __always_inline int tun_refuse(struct __sk_buff *skb, struct sluice_counters *c, __u32 cause)
{
	c->v[C_RX_FRAMES]++;
	c->v[C_RX_BYTES] += skb->len + (skb->vlan_present ? 4 : 0);
	c->v[C_RX_DROP + cause]++;
	return -1;
}

/* A datagram from tunnel port `in` (device `ifindex`), decapsulated by the device: its
 * key says where it came from (`ts`) and its VNI its VLAN (the tag goes on when the port
 * carries a VNI per VLAN). As the core decides it (`decide::stage1`): a sender that is not
 * one of the port's endpoints, when the port accepts its endpoints only, is a received
 * frame dropped `unknown_endpoint`; a VNI the port does not carry, or a frame with a
 * VLAN's tag inside a VLAN's VNI, `vlan_filter` — both before anything is learned from
 * them. -1 when it is refused (counted), 0 when it goes on through the pipeline. */
static __always_inline int tun_in(struct __sk_buff *skb, __u32 ifindex, struct sluice_counters *c,
				  struct tun_src *ts)
{
	struct sluice_tunnel *t = bpf_map_lookup_elem(&sluice_tunnels, &ifindex);
	if (!t) {
		c->v[C_TUN_BAD]++;
		return -1;
	}
	struct bpf_tunnel_key k = {};
	if (bpf_skb_get_tunnel_key(skb, &k, sizeof(k), (t->flags & TUN_V6) ? BPF_F_TUNINFO_IPV6 : 0)) {
		c->v[C_TUN_BAD]++;
		return -1;
	}
	ts->vni = k.tunnel_id;
	if (t->flags & TUN_V6) {
		__builtin_memcpy(ts->addr, k.remote_ipv6, 16);
	} else {
		__u32 a = bpf_htonl(k.remote_ipv4);
		__builtin_memcpy(ts->addr, &a, 4);
	}
	if (t->flags & TUN_REMOTES_ONLY) {
		struct sluice_endpoint_key ek = { .ifindex = ifindex };
		__builtin_memcpy(ek.addr, ts->addr, 16);
		if (!bpf_map_lookup_elem(&sluice_endpoints, &ek))
			return tun_refuse(skb, c, D_UNKNOWN_ENDPOINT);
	}
	__u32 tag = 0;
	if (t->flags & TUN_PER_VLAN) {
		struct sluice_vni_key vk = { .ifindex = ifindex, .id = k.tunnel_id | VNI_IN };
		__u32 *vlan = bpf_map_lookup_elem(&sluice_vnis, &vk);
		if (!vlan)
			return tun_refuse(skb, c, D_VLAN_FILTER);
		tag = *vlan;
	} else if (k.tunnel_id != t->vni) {
		return tun_refuse(skb, c, D_VLAN_FILTER);
	}
	if (!(tag & TUN_TAG))
		return 0;
	/* A VLAN's VNI: the frame crossed untagged, or with a priority tag (its priority is
	 * kept); a VLAN's tag inside is not let in. */
	__u16 pcp = 0;
	if (skb->vlan_present && skb->vlan_proto == ETH_P_8021Q_BE) {
		if (skb->vlan_tci & 0x0fff)
			return tun_refuse(skb, c, D_VLAN_FILTER);
		pcp = skb->vlan_tci & 0xf000;
		if (bpf_skb_vlan_pop(skb)) {
			c->v[C_TUN_BAD]++;
			return -1;
		}
	}
	if (bpf_skb_vlan_push(skb, ETH_P_8021Q_BE, pcp | (tag & 0x0fff))) {
		c->v[C_TUN_BAD]++;
		return -1;
	}
	return 0;
}

/* Notes that station `mac`, which the core has learned behind tunnel port `ifindex`, was
 * just heard from endpoint `ts` (written when new or moved, else stamped at most once a
 * second). Only such stations: where a station the core keeps elsewhere (locked, static,
 * or simply another port's) claims to be is nothing the kernel acts on. */
static __always_inline void tun_heard(__u32 ifindex, const struct tun_src *ts, const __u8 *mac)
{
	struct sluice_remote_key rk = { .ifindex = ifindex, .vni = ts->vni };
	__builtin_memcpy(rk.mac, mac, 6);
	struct sluice_remote r = {};
	__builtin_memcpy(r.addr, ts->addr, 16);
	__u64 now = bpf_ktime_get_ns();
	struct sluice_remote *old = bpf_map_lookup_elem(&sluice_remotes, &rk);
	if (!old || !ip6_eq(old->addr, r.addr) || now - old->seen_ns > SEEN_EVERY_NS) {
		r.seen_ns = now;
		bpf_map_update_elem(&sluice_remotes, &rk, &r, BPF_ANY);
	}
}

/* The frame itself to output `out`: offered, its MTU (against `l3`), the tag it wants
 * (`otag`: tagged with VLAN `vid`), counted, and redirected — with bpf_redirect_peer into a
 * guest's namespace, or bpf_redirect out of an uplink or a veth of the switch's own. */
static __always_inline int deliver(struct __sk_buff *skb, struct sluice_port *out, struct sluice_counters *oc, int vid,
				   __u8 pcp, int *tagged, __u16 *tci, int otag, long l3, const struct tun_dst *td)
{
	oc->v[C_TX_OFFERED]++;
	if (l3 > out->mtu) {
		oc->v[C_TX_DROP + D_OVER_MTU]++;
		return TC_ACT_SHOT;
	}
	if (retag(skb, tagged, tci, otag, ((__u16)pcp << 13) | (__u16)vid)) {
		oc->v[C_TX_DROP + D_TX_ERROR]++;
		return TC_ACT_SHOT;
	}
	if (out->flags & PF_TUNNEL) {
		if (!td || tun_key(skb, td)) {
			oc->v[C_TX_DROP + D_TX_ERROR]++;
			return TC_ACT_SHOT;
		}
		count_sent(oc, skb, otag);
		return bpf_redirect(out->ifindex, 0);
	}
	count_sent(oc, skb, otag);
	if (out->flags & (PF_UPLINK | PF_EGRESS)) {
		/* (bpf_redirect_peer skips the device's egress, and its filter.) */
		skb->mark = mark_for(out);
		return bpf_redirect(out->ifindex, 0);
	}
	return bpf_redirect_peer(out->ifindex, 0);
}

/* The output stage, once the frame's one output is decided: copies for the mirrors of its
 * input and its output, the counters, the output's MTU (the port's, as the core checks it,
 * against `l3`, from l3_len()), the tag the output wants (VLAN `vid`, `otag`: tagged), the
 * redirect. */
static __always_inline int send(struct __sk_buff *skb, struct sluice_counters *c, struct sluice_port *in, __u32 slot,
				struct sluice_port *out, __u32 oslot, struct sluice_counters *oc, int vid, __u8 pcp,
				int tagged, __u16 tci, int otag, long l3, const struct tun_dst *td)
{
	c->v[C_FORWARDED]++;
	c->v[C_COPIES]++;
	__u32 in_m = in->mirror, out_m = out->mirror;
	mirror(skb, c, in_m, slot, oslot, 0, vid, pcp, &tagged, &tci, l3);
	mirror(skb, c, out_m, slot, oslot, in_m, vid, pcp, &tagged, &tci, l3);
	return deliver(skb, out, oc, vid, pcp, &tagged, &tci, otag, l3, td);
}

/* The core's `may_talk`: isolated ports exchange frames with uplinks only. */
static __always_inline int may_talk(__u32 a, __u32 b)
{
	return (!(a & PF_ISOLATED) && !(b & PF_ISOLATED)) || (a & PF_UPLINK) || (b & PF_UPLINK);
}

/* A flood in progress (bpf_loop's callbacks see it through a pointer to the stack). */
struct flood {
	struct __sk_buff *skb;
	__u32 slot;     /* the input */
	__u32 in_flags;
	int vid;
	int tagged;     /* the tag the frame has now (retag() keeps these) */
	__u16 tci;
	__u8 pcp;
	__u8 up;        /* an output the kernel cannot serve: the core floods instead */
	long l3;        /* l3_len(), against each output's MTU */
	__u32 members;  /* the copies offered */
	__u32 last;     /* slot + 1 of the output that gets the frame itself (0: none fits) */
};

/* Slot `i` if the flood reaches it: a live port of the VLAN, not the input, one the input
 * may talk to (the core's `flood`). */
static __always_inline struct sluice_port *flood_member(struct flood *f, __u32 i)
{
	__u32 k = i;
	struct sluice_port *p;

	if (i == f->slot)
		return 0;
	p = bpf_map_lookup_elem(&sluice_ports, &k);
	if (!p || !p->ifindex || vlan_out(p, f->vid) < 0 || !may_talk(f->in_flags, p->flags))
		return 0;
	return p;
}

/* First pass: can the kernel do it all, and which output gets the frame itself. */
static long flood_plan(__u32 i, void *ctx)
{
	struct flood *f = ctx;
	struct sluice_port *p = flood_member(f, i);

	if (!p)
		return 0;
	if (!(p->flags & PF_KERNEL) || (p->flags & (PF_SLOW | PF_TUNNEL)) || p->mirror) {
		f->up = 1;
		return 1;
	}
	f->members++;
	if (f->l3 <= p->mtu)
		f->last = i + 1;
	return 0;
}

/* Second pass: a copy to every member but the last, counted at the output as send() does. */
static long flood_copy(__u32 i, void *ctx)
{
	struct flood *f = ctx;
	__u32 k = i;
	struct sluice_port *p = flood_member(f, i);
	struct sluice_counters *oc = bpf_map_lookup_elem(&sluice_stats, &k);

	if (!p || !oc || i + 1 == f->last)
		return 0;
	oc->v[C_TX_OFFERED]++;
	if (f->l3 > p->mtu) {
		oc->v[C_TX_DROP + D_OVER_MTU]++;
		return 0;
	}
	int otag = vlan_out(p, f->vid);
	if (retag(f->skb, &f->tagged, &f->tci, otag, ((__u16)f->pcp << 13) | (__u16)f->vid) || clone_to(f->skb, p)) {
		oc->v[C_TX_DROP + D_TX_ERROR]++;
		return 0;
	}
	count_sent(oc, f->skb, otag);
	return 0;
}

/* Layer 2 flooding (the core's `flood`) when every port it reaches is the kernel's and no
 * mirror takes part: a clone to each output but the last, which gets the frame. Else, or
 * when the headers are past what l3_len() reads, the frame goes up and the core floods it.
 * `refused`: the source is one the input may not learn (counted once decided here). */
static __always_inline int flood(struct __sk_buff *skb, struct sluice_counters *c, struct sluice_port *in,
				 __u32 slot, int vid, __u8 pcp, int tagged, __u16 tci, int refused)
{
	__u32 zero = 0;
	struct sluice_config *cfg = bpf_map_lookup_elem(&sluice_config, &zero);
	if (!cfg || in->mirror)
		return up(skb, slot, c);
	long l3 = l3_len(skb);
	if (l3 < 0)
		return up(skb, slot, c);
	struct flood f = {
		.skb = skb, .slot = slot, .in_flags = in->flags, .vid = vid, .tagged = tagged, .tci = tci,
		.pcp = pcp, .l3 = l3,
	};
	__u32 n = cfg->n_slots;
	if (n > SLUICE_MAX_PORTS)
		n = SLUICE_MAX_PORTS;
	bpf_loop(n, flood_plan, &f, 0);
	if (f.up)
		return up(skb, slot, c);
	if (refused)
		c->v[C_LEARN_REFUSED]++;
	if (!f.members)
		return drop(c, D_UNKNOWN_PORT);
	c->v[C_FLOODED]++;
	c->v[C_COPIES] += f.members;
	bpf_loop(n, flood_copy, &f, 0);
	if (!f.last)
		return TC_ACT_SHOT; /* every output's MTU is too small: counted there */
	__u32 ls = f.last - 1;
	struct sluice_port *out = bpf_map_lookup_elem(&sluice_ports, &ls);
	struct sluice_counters *oc = bpf_map_lookup_elem(&sluice_stats, &ls);
	if (!out || !oc)
		return TC_ACT_SHOT;
	/* (A member of the VLAN, whose MTU the frame fits: flood_plan chose it.) */
	return deliver(skb, out, oc, vid, pcp, &f.tagged, &f.tci, vlan_out(out, vid), f.l3, 0);
}

/* A search for a port other than `slot` that locks MAC `mac` (its `mac` setting). */
struct locked {
	__u32 slot;
	__u8 mac[6];
	__u8 found;
};

static long locked_at(__u32 i, void *ctx)
{
	struct locked *l = ctx;
	__u32 k = i;

	if (i == l->slot)
		return 0;
	struct sluice_port *p = bpf_map_lookup_elem(&sluice_ports, &k);
	if (p && p->ifindex && (p->flags & PF_MAC) && mac_eq(p->mac, l->mac)) {
		l->found = 1;
		return 1;
	}
	return 0;
}

/* Whether a port other than `slot` locks source `mac` (the core drops a frame claiming it
 * as `spoofed_mac`; the kernel hands such a frame up). Looks at the slots in use. */
static __always_inline int locked_elsewhere(__u32 slot, const __u8 *mac)
{
	__u32 zero = 0;
	struct sluice_config *cfg = bpf_map_lookup_elem(&sluice_config, &zero);
	struct locked l = { .slot = slot };
	__builtin_memcpy(l.mac, mac, 6);
	__u32 n = cfg ? cfg->n_slots : SLUICE_MAX_PORTS;
	if (n > SLUICE_MAX_PORTS)
		n = SLUICE_MAX_PORTS;
	bpf_loop(n, locked_at, &l, 0);
	return l.found;
}

static __always_inline int is_link_local6(const __u8 *a)
{
	return a[0] == 0xfe && (a[1] & 0xc0) == 0x80;
}

/* Layer 3 (the core's `ingress_l3` and `l3_destinations`): address resolution goes up to
 * be answered; an IP packet goes to the guest port owning its destination, or out of the
 * uplink to the LAN neighbour of that address, with its MAC addresses rewritten; what the
 * tables cannot decide (an unknown guest MAC, an unresolved neighbour) goes up. */
static __always_inline int l3(struct __sk_buff *skb, __u32 slot, struct sluice_port *in, struct sluice_counters *c,
			      struct sluice_config *cfg, int vid, __u8 pcp, int tagged, __u16 tci)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > end)
		return drop(c, D_MALFORMED);
	__u16 proto = eth->h_proto;
	if (proto == bpf_htons(ETH_P_ARP))
		return up(skb, slot, c);
	if (proto != bpf_htons(ETH_P_IP) && proto != bpf_htons(ETH_P_IPV6))
		return drop(c, D_NOT_IP);
	struct sluice_ip_key dk = {};
	__u8 src6[16];
	__u32 src4 = 0;
	int v6 = proto == bpf_htons(ETH_P_IPV6);
	if (v6) {
		if (data + 54 > end)
			return drop(c, D_MALFORMED);
		__u8 *ip = data + 14;
		/* Neighbour discovery (ICMPv6 with hop limit 255) is the core's to answer. */
		if (ip[6] == 58 && ip[7] == 255)
			return up(skb, slot, c);
		__builtin_memcpy(src6, ip + 8, 16);
		__builtin_memcpy(dk.addr, ip + 24, 16);
		dk.family = 6;
	} else {
		if (data + 34 > end)
			return drop(c, D_MALFORMED);
		__builtin_memcpy(&src4, data + 26, 4);
		__builtin_memcpy(dk.addr, data + 30, 4);
		dk.family = 4;
	}
	__u8 smac[6], dmac[6];
	__builtin_memcpy(smac, eth->h_source, 6);
	__builtin_memcpy(dmac, eth->h_dest, 6);
	int uplink = in->flags & PF_UPLINK;
	if (!uplink) {
		if (in->flags & PF_IPS) {
			if (v6) {
				if (in->flags & PF_UP_V6)
					return up(skb, slot, c);
				if (!((in->flags & PF_LL_OK) && is_link_local6(src6)) && !ip6_ok(in, src6))
					return drop(c, D_SPOOFED_IP);
			} else {
				if (in->flags & PF_UP_V4)
					return up(skb, slot, c);
				if (!ip4_ok(in, src4))
					return drop(c, D_SPOOFED_IP);
			}
		}
		/* The guest's MAC is the core's to learn. */
		if (!(in->flags & PF_GUEST_MAC) || !mac_eq(smac, in->guest_mac))
			return up(skb, slot, c);
	}
	if (is_group(dmac))
		return up(skb, slot, c);
	/* On the LAN the guests all sit behind the uplink's address. */
	if (uplink && !mac_eq(dmac, in->own_mac))
		return drop(c, D_NO_ROUTE);

	__u32 oslot;
	__u8 next[6];
	struct sluice_port *out;
	__u32 *owner = bpf_map_lookup_elem(&sluice_owners, &dk);
	if (owner) {
		oslot = *owner;
		if (oslot == slot)
			return drop(c, D_SAME_PORT);
		out = bpf_map_lookup_elem(&sluice_ports, &oslot);
		if (!out || !out->ifindex || !(out->flags & PF_KERNEL) || (out->flags & (PF_SLOW | PF_TUNNEL)))
			return up(skb, slot, c);
		if (vlan_out(out, vid) < 0)
			return drop(c, D_VLAN_FILTER);
		if ((in->flags & PF_ISOLATED || out->flags & PF_ISOLATED) && !uplink && !(out->flags & PF_UPLINK))
			return drop(c, D_ISOLATED);
		if (!(out->flags & PF_GUEST_MAC))
			return up(skb, slot, c);
		__builtin_memcpy(next, out->guest_mac, 6);
	} else {
		if (uplink || !cfg->l3_uplink)
			return uplink ? drop(c, D_NO_ROUTE) : up(skb, slot, c);
		oslot = cfg->l3_uplink - 1;
		out = bpf_map_lookup_elem(&sluice_ports, &oslot);
		if (!out || !out->ifindex || !(out->flags & PF_KERNEL) || (out->flags & (PF_SLOW | PF_TUNNEL)) ||
		    vlan_out(out, vid) < 0)
			return up(skb, slot, c);
		struct sluice_neigh_key nk = { .vlan = vid, .family = dk.family };
		__builtin_memcpy(nk.addr, dk.addr, 16);
		struct sluice_neigh_val *n = bpf_map_lookup_elem(&sluice_neigh, &nk);
		if (!n)
			return up(skb, slot, c);
		__builtin_memcpy(next, n->mac, 6);
	}
	struct sluice_counters *oc = bpf_map_lookup_elem(&sluice_stats, &oslot);
	if (!oc)
		return up(skb, slot, c);
	long l3len = l3_len(skb);
	if (l3len < 0)
		return up(skb, slot, c);
	/* Every frame leaves from the switch's address on its side. */
	data = (void *)(long)skb->data;
	end = (void *)(long)skb->data_end;
	eth = data;
	if ((void *)(eth + 1) > end)
		return drop(c, D_MALFORMED);
	__builtin_memcpy(eth->h_dest, next, 6);
	if (out->flags & PF_UPLINK)
		__builtin_memcpy(eth->h_source, out->own_mac, 6);
	else
		__builtin_memcpy(eth->h_source, cfg->router_mac, 6);
	return send(skb, c, in, slot, out, oslot, oc, vid, pcp, tagged, tci, vlan_out(out, vid), l3len, 0);
}

SEC("classifier")
int sluice_ingress(struct __sk_buff *skb)
{
	__u32 ifindex = skb->ifindex;
	__u32 *slotp = bpf_map_lookup_elem(&sluice_port_of, &ifindex);
	if (!slotp)
		return TC_ACT_OK; /* not a sluice port: the stack's */
	__u32 slot = *slotp;
	struct sluice_port *in = bpf_map_lookup_elem(&sluice_ports, &slot);
	struct sluice_counters *c = bpf_map_lookup_elem(&sluice_stats, &slot);
	if (!in || !c)
		return TC_ACT_SHOT;
	/* From a tunnel: the device took the outer headers off and left their key. */
	struct tun_src ts = {};
	if ((in->flags & PF_TUNNEL) && tun_in(skb, ifindex, c, &ts))
		return TC_ACT_SHOT;

	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	/* On an uplink that is also the host's interface: its own frames are the host's. */
	if ((in->flags & PF_OWN_MAC) && (void *)(eth + 1) <= end && mac_eq(eth->h_dest, in->own_mac))
		return TC_ACT_OK;

	int tagged = skb->vlan_present && skb->vlan_proto == ETH_P_8021Q_BE;
	__u16 tci = tagged ? skb->vlan_tci : 0;
	__u32 len = skb->len + (tagged ? 4 : 0);
	c->v[C_RX_FRAMES]++;
	c->v[C_RX_BYTES] += len;
	if (skb->gso_size)
		c->v[C_RX_GSO]++;
	if ((void *)(eth + 1) > end)
		return drop(c, D_MALFORMED);
	/* A GSO frame asking for tiny segments, or too many (a guest's raw socket can): the
	 * core's bound, so that it costs no output, and no kernel that would cut it, thousands
	 * of frames (counted with the headers, which the core leaves out). */
	if (skb->gso_size &&
	    (skb->gso_size < SLUICE_MIN_GSO_SIZE || (skb->len - ETH_HLEN) / skb->gso_size > SLUICE_MAX_GSO_SEGMENTS))
		return drop(c, D_GSO_LIMIT);
	/* Broadcast and multicast from the LAN: the guests' (through the core) and the host's
	 * (Layer 2, where the uplink's device may be the host's interface too). */
	if ((in->flags & PF_OWN_MAC) && is_group(eth->h_dest))
		return up_copy(skb, slot, c);
	if (in->flags & PF_SLOW)
		return up(skb, slot, c);
	/* An outer tag the kernel did not take off, or not 802.1Q: the core reads those. */
	if (skb->vlan_present && !tagged)
		return up(skb, slot, c);
	if (eth->h_proto == ETH_P_8021Q_BE)
		return up(skb, slot, c);
	if (is_group(eth->h_source))
		return drop(c, D_MALFORMED);

	int vid = vlan_in(in, tagged, tci);
	if (vid < 0)
		return drop(c, D_VLAN_FILTER);
	__u8 pcp = tci >> 13;

	if (in->flags & PF_MAC && !mac_eq(eth->h_source, in->mac))
		return drop(c, D_SPOOFED_MAC);
	__u32 zero = 0;
	struct sluice_config *cfg = bpf_map_lookup_elem(&sluice_config, &zero);
	if (cfg && cfg->mode == MODE_L3)
		return l3(skb, slot, in, c, cfg, vid, pcp, tagged, tci);
	if (in->flags & PF_IPS) {
		int r = check_ips(skb, in, eth->h_proto);
		if (r == 1)
			return drop(c, D_SPOOFED_IP);
		if (r == 2)
			return up(skb, slot, c);
		data = (void *)(long)skb->data;
		end = (void *)(long)skb->data_end;
		eth = data;
		if ((void *)(eth + 1) > end)
			return drop(c, D_MALFORMED);
	}

	/* The source must be known on this port — learning and moves are the core's — unless
	 * the port may learn no more (and the source is neither a static entry elsewhere nor
	 * locked to another port): the core would not learn it either, but forward it as it
	 * is. */
	struct sluice_fib_key k = { .vlan = vid };
	__builtin_memcpy(k.mac, eth->h_source, 6);
	struct sluice_fib_val *src = bpf_map_lookup_elem(&sluice_fib, &k);
	int refused = 0;
	if (!src || src->slot != slot) {
		if (!(in->flags & PF_LEARN_FULL) || (src && (src->flags & FIB_STATIC)))
			return up(skb, slot, c);
		if (!(in->flags & PF_MAC) && locked_elsewhere(slot, k.mac))
			return up(skb, slot, c);
		refused = 1;
	} else {
		__u64 now = bpf_ktime_get_ns();
		if (now - src->seen_ns > SEEN_EVERY_NS)
			src->seen_ns = now;
		if (in->flags & PF_TUNNEL)
			tun_heard(ifindex, &ts, k.mac);
	}

	if (is_group(eth->h_dest))
		return flood(skb, c, in, slot, vid, pcp, tagged, tci, refused);
	__builtin_memcpy(k.mac, eth->h_dest, 6);
	struct sluice_fib_val *dst = bpf_map_lookup_elem(&sluice_fib, &k);
	if (!dst)
		return flood(skb, c, in, slot, vid, pcp, tagged, tci, refused);
	__u32 oslot = dst->slot;
	struct sluice_port *out = bpf_map_lookup_elem(&sluice_ports, &oslot);
	struct sluice_counters *oc = bpf_map_lookup_elem(&sluice_stats, &oslot);
	if (oslot != slot && (!out || !oc || !out->ifindex || !(out->flags & PF_KERNEL) || (out->flags & PF_SLOW)))
		return up(skb, slot, c);
	long l3len = l3_len(skb);
	if (l3len < 0)
		return up(skb, slot, c);
	/* A station behind a tunnel whose endpoint the kernel has not heard from (or a VLAN
	 * the tunnel has no VNI for): the core sends the frame, to every endpoint. */
	struct tun_dst td = {};
	if (oslot != slot && out && (out->flags & PF_TUNNEL) && !tun_lookup(out, vid, k.mac, &td))
		return up(skb, slot, c);
	/* Decided here from now on. */
	c->v[C_LEARN_REFUSED] += refused;
	if (oslot == slot || !out || !oc)
		return drop(c, D_SAME_PORT);
	int otag = vlan_out(out, vid);
	if (otag < 0)
		return drop(c, D_VLAN_FILTER);
	if (!may_talk(in->flags, out->flags))
		return drop(c, D_ISOLATED);
	/* A VNI per VLAN carries the VLAN: the frame crosses untagged. */
	if (td.t && (td.t->flags & TUN_PER_VLAN))
		otag = 0;
	return send(skb, c, in, slot, out, oslot, oc, vid, pcp, tagged, tci, otag, l3len, &td);
}

/* At the egress of the switch side of a guest's veth, and of the upcall TAP: what goes on
 * into the guest, or into the TAP's queue for the daemon. Only the switch's own frames
 * carry SLUICE_MARK — the ingress program's clones and redirects to a device's egress and
 * its upcalls, the daemon's packet socket (SO_MARK) — and they pass with the mark cleared;
 * bpf_redirect_peer never comes this way. Anything else is a frame someone in the switch's
 * namespace sent through the interface (a socket bound to it, the kernel's own): dropped,
 * counted at a guest's port as a received frame refused (`egress_refused`), at the upcall
 * TAP in the switch's own counters (so that a flood of them can neither fill the queue the
 * program's upcalls wait in nor reach the daemon). */
SEC("classifier")
int sluice_egress(struct __sk_buff *skb)
{
	if (skb->mark == SLUICE_MARK) {
		skb->mark = 0;
		return TC_ACT_OK;
	}
	__u32 ifindex = skb->ifindex;
	__u32 *slotp = bpf_map_lookup_elem(&sluice_port_of, &ifindex);
	if (slotp) {
		__u32 slot = *slotp;
		struct sluice_counters *c = bpf_map_lookup_elem(&sluice_stats, &slot);
		if (c) {
			c->v[C_RX_FRAMES]++;
			c->v[C_RX_BYTES] += skb->len;
			c->v[C_RX_DROP + D_EGRESS_REFUSED]++;
		}
		return TC_ACT_SHOT;
	}
	__u32 zero = 0;
	struct sluice_config *cfg = bpf_map_lookup_elem(&sluice_config, &zero);
	struct sluice_switch_counters *s = bpf_map_lookup_elem(&sluice_switch_stats, &zero);
	if (cfg && s && cfg->upcall_ifindex == ifindex)
		s->v[S_UPCALL_EGRESS_REFUSED]++;
	return TC_ACT_SHOT;
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";

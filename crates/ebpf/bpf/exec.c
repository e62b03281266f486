// SPDX-License-Identifier: MIT OR Apache-2.0 OR GPL-2.0-only
/*
 * sluice's kernel executor (program `sluice_exec`, TC ingress): it decides nothing. It
 * extracts a frame's key in two stages — parsing, and lookups in tables only the core
 * writes — looks up the verdict the core installed for each, and executes it: a drop, an
 * upcall, or a list of outputs (MTU, tag, MAC rewrite, clone to every output but the last,
 * redirect the last). A key without a verdict of the current generation goes up through
 * the upcall TAP, tagged with its input slot (and, from a tunnel, its origin); the core
 * decides the frame and installs the verdict. What it hears that the core must decide on — a
 * station behind a tunnel where the remote table does not have it — it reports on a ring
 * buffer, writing no forwarding state itself. The layouts are crates/ebpf-abi's (abi.h).
 * docs/architecture.md, "One brain: the kernel executes the core's verdicts".
 *
 * Every loop is bpf_loop over at most SLUICE_MAX_OUTPUTS outputs or SLUICE_MAX_FLOOD_EPS
 * endpoints of a flood into a tunnel, or a fixed number of tries; every read of the frame
 * is bpf_skb_load_bytes of a fixed size at a bounded offset (at most 90 bytes in), so "too
 * short" means the frame is, never that its headers are outside the linear part. What
 * goes up is bounded per input by a token bucket (`upcall_rate`, `upcall_burst` in
 * sluice_exec_cfg): the excess is dropped, counted `upcall_limit`.
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

/* The devices the executor runs on (core-written). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, SLUICE_MAX_PORTS);
	__type(key, __u32);
	__type(value, struct sluice_input);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sluice_inputs SEC(".maps");

/* Stage 1's verdicts (core-written). LRU, as sluice_verdicts. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, struct sluice_admit_key);
	__type(value, struct sluice_admit);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sluice_admits SEC(".maps");

/* Stage 2's verdicts (core-written). LRU: keys a hostile guest sprays (claimed
 * addresses, EtherTypes) push out the least used entries instead of filling the map for
 * good, and entries of older generations age out unused, so the core never walks it;
 * the price is preallocated memory (set at load, see Executor::open). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct sluice_flow_key);
	__type(value, struct sluice_verdict);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sluice_verdicts SEC(".maps");

/* Stations (core-written; the program only stamps seen_ns). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 8192); /* set to the switch's MAC table size when loaded */
	__type(key, struct sluice_fib_key);
	__type(value, struct sluice_fib_val);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sluice_fib SEC(".maps");

/* MAC addresses locked to a port, on every VLAN (core-written). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, SLUICE_MAX_PORTS);
	__type(key, struct sluice_lock_key);
	__type(value, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sluice_locks SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct sluice_exec_config);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sluice_exec_cfg SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, SLUICE_MAX_PORTS);
	__type(key, __u32);
	__type(value, struct sluice_counters);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sluice_stats SEC(".maps");

/* The switch's own counters (S_*): what is nobody's port's. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct sluice_switch_counters);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sluice_switch_stats SEC(".maps");

/* Meters (storm control, rate limits): SLUICE_METERS_PER_SLOT per port slot, their rates
 * the daemon's, their times the program's (struct sluice_meter). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, SLUICE_MAX_PORTS * SLUICE_METERS_PER_SLOT);
	__type(key, __u32);
	__type(value, struct sluice_meter);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sluice_meters SEC(".maps");

/* Each input slot's upcall bucket, as the time (bpf_ktime_get_ns) its next upcall is
 * due at the budget's rate: the program's own state, shared by every CPU. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, SLUICE_MAX_PORTS);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sluice_upcall_budget SEC(".maps");

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

/* Security groups (X_CT): the core's compiled classes, by class set (core-written; a new
 * set for each change of the rules, switched to with the generation). */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 262144);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct sluice_acl_addr_key);
	__type(value, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sluice_acl_v4 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 262144);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct sluice_acl_addr_key);
	__type(value, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sluice_acl_v6 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 262144);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct sluice_acl_port_key);
	__type(value, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sluice_acl_ports SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 64);
	__type(key, __u32);
	__type(value, struct sluice_tunnel);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sluice_tunnels SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096); /* the configured remotes of up to 64 tunnels */
	__type(key, struct sluice_endpoint_key);
	__type(value, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sluice_endpoints SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384); /* set at load: twice the switch's MAC table size, at least this */
	__type(key, struct sluice_remote_key);
	__type(value, struct sluice_remote);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sluice_remotes SEC(".maps");

/* The endpoints a flood into a tunnel goes to, by (device, VNI): the core's flood set
 * (core-written; no entry: floods into that tunnel go up). About 2 MB preallocated. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096); /* 64 tunnels of 64 VNIs */
	__type(key, struct sluice_flood_key);
	__type(value, struct sluice_flood_eps_val);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sluice_flood_eps SEC(".maps");

/* Stations heard behind a tunnel for the core to decide on (struct sluice_heard_event):
 * room for about 1,600 of them; a full ring is counted (C_HEARD_LOST). */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 64 * 1024);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sluice_heard SEC(".maps");

/* IGMP/MLD snooping: registered groups by (VLAN, family, group) -> port set id. The core
 * writes it; the program only looks a group frame's class up (group_class). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct sluice_mdb_key);
	__type(value, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sluice_mdb SEC(".maps");

/* IGMP/MLD snooping's classes of a group frame, core-written (the core's snoop::target):
 * which multicast destinations are snooped, and which messages are the core's. */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 256);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct sluice_group_prefix_key);
	__type(value, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sluice_group_prefixes SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 512);
	__type(key, __u32);
	__type(value, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sluice_group_control SEC(".maps");

#define ETH_P_8021Q_BE bpf_htons(0x8100)
#define ETH_P_8021AD_BE bpf_htons(0x88a8)
#define SEEN_EVERY_NS 1000000000ULL

static __always_inline int is_group(const __u8 *mac)
{
	return mac[0] & 1;
}

/* An IEEE link-local address, 01:80:C2:00:00:00 to 0F (the core's Dest::LinkLocal). */
static __always_inline int is_link_local(const __u8 *mac)
{
	return mac[0] == 0x01 && mac[1] == 0x80 && mac[2] == 0xc2 && mac[3] == 0 && mac[4] == 0 && mac[5] < 16;
}

static __always_inline int is_broadcast(const __u8 *mac)
{
	return (mac[0] & mac[1] & mac[2] & mac[3] & mac[4] & mac[5]) == 0xff;
}

/* (BPF has no memcmp.) */
static __always_inline int mac_eq(const __u8 *a, const __u8 *b)
{
	return a[0] == b[0] && a[1] == b[1] && a[2] == b[2] && a[3] == b[3] && a[4] == b[4] && a[5] == b[5];
}

static __always_inline int addr_eq(const __u8 *a, const __u8 *b)
{
	__u64 a0, a1, b0, b1;
	__builtin_memcpy(&a0, a, 8);
	__builtin_memcpy(&a1, a + 8, 8);
	__builtin_memcpy(&b0, b, 8);
	__builtin_memcpy(&b1, b + 8, 8);
	return a0 == b0 && a1 == b1;
}

static __always_inline int mac_zero(const __u8 *a)
{
	return !(a[0] | a[1] | a[2] | a[3] | a[4] | a[5]);
}

static __always_inline struct sluice_exec_config *config(void)
{
	__u32 zero = 0;
	return bpf_map_lookup_elem(&sluice_exec_cfg, &zero);
}

static __always_inline void count_rx(struct sluice_counters *c, struct __sk_buff *skb)
{
	c->v[C_RX_FRAMES]++;
	c->v[C_RX_BYTES] += skb->len + (skb->vlan_present ? 4 : 0);
	if (skb->gso_size)
		c->v[C_RX_GSO]++;
}

/* Counts a receive drop of cause `cause` (from a verdict: one the program does not know
 * is counted as the core's default, `unknown_port`). */
static __always_inline int drop(struct sluice_counters *c, __u32 cause)
{
	if (cause >= C_TX_DROP - C_RX_DROP)
		cause = D_UNKNOWN_PORT;
	c->v[C_RX_DROP + cause]++;
	return TC_ACT_SHOT;
}

/* A token bucket kept as the generic cell rate algorithm keeps it: one time `tat`, the
 * theoretical time its next unit is due, which a frame costing `cost` ns moves on by that,
 * passing only if the time (no earlier than now) plus its cost is at most `burst_ns` ahead
 * of now. A compare-and-swap updates it, so that CPUs taking the same slot's frames share
 * one bucket; a few tries bound the work (failing all of them, the frame is over). */
static __always_inline int gcra(__u64 *tat, __u64 cost, __u64 burst_ns)
{
	__u64 now = bpf_ktime_get_ns();
	for (int i = 0; i < 4; i++) {
		__u64 old = *(volatile __u64 *)tat;
		__u64 t = old > now ? old : now;
		if (t - now + cost > burst_ns)
			return 0;
		if (__sync_val_compare_and_swap(tat, old, t + cost) == old)
			return 1;
	}
	return 0;
}

/* Whether input `slot` may hand one more frame up: a token bucket of `upcall_burst`
 * upcalls refilled with `upcall_rate` a second (gcra: one interval an upcall, whose time
 * may run ahead of now by at most burst - 1 intervals). */
static __always_inline int within_budget(const struct sluice_exec_config *cfg, __u32 slot)
{
	__u32 rate = cfg->upcall_rate, burst = cfg->upcall_burst;

	if (!rate)
		return 1;
	__u64 *tat = bpf_map_lookup_elem(&sluice_upcall_budget, &slot);
	if (!tat)
		return 0;
	__u64 interval = 1000000000ULL / rate;
	return gcra(tat, interval, interval * (burst ? burst : 1));
}

/* Whether `units` may pass meter `kind` of slot `slot` (struct sluice_meter, the same
 * arithmetic as the upcall budget's), taking them if so. A meter the daemon did not set
 * (unit_ps 0) lets everything pass. */
static __always_inline int meter_take(__u32 slot, __u32 kind, __u64 units)
{
	__u32 at = slot * SLUICE_METERS_PER_SLOT + kind;
	struct sluice_meter *m = bpf_map_lookup_elem(&sluice_meters, &at);
	if (!m || !m->unit_ps)
		return 1;
	return gcra(&m->tat, units * m->unit_ps / 1000, m->burst_ns);
}

/* skb->cb[0] while the program runs: a tunnel's frame's origin (ORIGIN_SET, the VNI, and
 * ORIGIN_ENDPOINT when the sender is one of the port's endpoints), for up() to hand up
 * with it; 0 for any other frame. */
#define ORIGIN_SET (1u << 31)
#define ORIGIN_ENDPOINT (1u << 24)
/* Bits 25 to 27 of skb->cb[0]: the frame's CTS_* (X_CT), which goes up with it in the slot
 * tag (UP_CT_SHIFT), so that the core decides it in the state the kernel found. */
#define ORIGIN_CT_SHIFT 25

/* The slot tag's TCI of a frame going up: for a tunnel's frame, its origin first, in two
 * 802.1Q tags that end up inside the slot's (UP_TUNNEL). -1 when a tag cannot be pushed. */
static __always_inline int up_tag(struct __sk_buff *skb, __u32 slot)
{
	__u32 origin = skb->cb[0];
	__u16 tci = (slot & 0x0fff) | (((origin >> ORIGIN_CT_SHIFT) & 7) << UP_CT_SHIFT);

	if (!(origin & ORIGIN_SET))
		return tci;
	__u16 low = ((origin & 0xff) << 8) | ((origin & ORIGIN_ENDPOINT) ? UP_ENDPOINT : 0);
	if (bpf_skb_vlan_push(skb, ETH_P_8021Q_BE, low) ||
	    bpf_skb_vlan_push(skb, ETH_P_8021Q_BE, (origin >> 8) & 0xffff))
		return -1;
	return tci | UP_TUNNEL;
}

/* Hands the frame to the core: the input slot as an outer 802.1ad tag (the frame's own
 * tag, if any, goes inside; from a tunnel, its origin too: UP_TUNNEL), out of the upcall
 * TAP, marked as the switch's (the TAP's egress program lets nothing else into its
 * queue). A frame that cannot be handed up is dropped, counted
 * as `upcall_lost`; one over its input's budget, as `upcall_limit`. */
static __always_inline int up(struct __sk_buff *skb, __u32 slot, struct sluice_counters *c)
{
	struct sluice_exec_config *cfg = config();

	if (cfg && !within_budget(cfg, slot)) {
		c->v[C_RX_DROP + D_UPCALL_LIMIT]++;
		return TC_ACT_SHOT;
	}
	int tci = cfg && cfg->upcall_ifindex ? up_tag(skb, slot) : -1;
	if (tci < 0 || bpf_skb_vlan_push(skb, ETH_P_8021AD_BE, tci)) {
		c->v[C_RX_DROP + D_UPCALL_LOST]++;
		return TC_ACT_SHOT;
	}
	c->v[C_UPCALLS]++;
	skb->mark = SLUICE_MARK;
	return bpf_redirect(cfg->upcall_ifindex, 0);
}

/* A copy up as up() hands it, and the frame itself on to the host's stack, unmarked and
 * as it arrived. (Only an input that may be the host's
 * interface makes one, and no tunnel is: its copy has no origin to carry.) */
static __always_inline int up_copy(struct __sk_buff *skb, __u32 slot, struct sluice_counters *c)
{
	struct sluice_exec_config *cfg = config();

	if (cfg && !within_budget(cfg, slot)) {
		c->v[C_RX_DROP + D_UPCALL_LIMIT]++;
		return TC_ACT_OK;
	}
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

/* No verdict of the current generation: counted, and up to the core. `host`: the host's
 * stack gets the frame whatever the core decides (IN_HOST, to its address or a group). */
static __always_inline int miss(struct __sk_buff *skb, __u32 slot, struct sluice_counters *c, int host)
{
	c->v[C_MISSES]++;
	return host ? up_copy(skb, slot, c) : up(skb, slot, c);
}

/* Executes a verdict that sends to no output: up, drop or the host's. */
static __always_inline int settle(struct __sk_buff *skb, __u32 slot, struct sluice_counters *c, __u8 action,
				  __u8 cause, __u8 flags)
{
	switch (action) {
	case ACT_DROP:
		drop(c, cause);
		return (flags & V_HOST) ? TC_ACT_OK : TC_ACT_SHOT;
	case ACT_HOST:
		return TC_ACT_OK;
	case ACT_UP:
		return (flags & V_HOST) ? up_copy(skb, slot, c) : up(skb, slot, c);
	default:
		/* An action this program does not know: the core's. */
		return up(skb, slot, c);
	}
}

/* What the frame's Layer 2 headers say. */
struct l2 {
	__u8 dst[6];
	__u8 src[6];
	__u32 off;      /* where the network header starts: 14, or 18 past a tag in the frame */
	__u16 proto;    /* the EtherType after the 802.1Q tag (network order) */
	__u16 vproto;   /* the tag's own type (network order); 0: untagged */
	__u16 tci;      /* the tag's TCI */
	__u8 tag;       /* TAG_* */
};

/* Reads the Ethernet header and the 802.1Q tag, which the kernel took into the skb's
 * metadata, or which is still in the frame (a frame no device untagged, as in
 * BPF_PROG_TEST_RUN). -1 when the frame is shorter than its headers. */
static __always_inline int parse_l2(struct __sk_buff *skb, struct l2 *f)
{
	__u8 h[18];

	if (bpf_skb_load_bytes(skb, 0, h, 14))
		return -1;
	__builtin_memcpy(f->dst, h, 6);
	__builtin_memcpy(f->src, h + 6, 6);
	__builtin_memcpy(&f->proto, h + 12, 2);
	f->off = ETH_HLEN;
	if (skb->vlan_present) {
		f->vproto = skb->vlan_proto;
		f->tci = skb->vlan_tci;
		f->tag = f->vproto == ETH_P_8021Q_BE ? TAG_8021Q : TAG_OTHER;
	} else if (f->proto == ETH_P_8021Q_BE) {
		if (bpf_skb_load_bytes(skb, 14, h + 14, 4))
			return -1;
		f->tag = TAG_8021Q;
		f->vproto = ETH_P_8021Q_BE;
		f->tci = ((__u16)h[14] << 8) | h[15];
		__builtin_memcpy(&f->proto, h + 16, 2);
		f->off = ETH_HLEN + 4;
	}
	/* Another tag next, cut short: popping a tag moves the next into the metadata, which
	 * fails on it (the core's classify drops it too). */
	if ((f->proto == ETH_P_8021Q_BE || f->proto == ETH_P_8021AD_BE) && skb->len < f->off + 4)
		return -1;
	return 0;
}

/* The core's `claimed_source`: the source address an IPv4 or IPv6 packet, or an ARP
 * message, claims, into `k`. */
static __always_inline void claim(struct __sk_buff *skb, const struct l2 *f, struct sluice_flow_key *k)
{
	__u32 at, n;

	if (f->proto == bpf_htons(ETH_P_IP)) {
		at = 12;
		n = 4;
	} else if (f->proto == bpf_htons(ETH_P_ARP)) {
		at = 14;
		n = 4;
	} else if (f->proto == bpf_htons(ETH_P_IPV6)) {
		at = 8;
		n = 16;
	} else {
		return;
	}
	if (n == 4) {
		k->claim = bpf_skb_load_bytes(skb, f->off + at, k->src_ip, 4) ? CLAIM_SHORT : CLAIM_V4;
	} else {
		k->claim = bpf_skb_load_bytes(skb, f->off + at, k->src_ip, 16) ? CLAIM_SHORT : CLAIM_V6;
	}
	if (k->claim == CLAIM_SHORT)
		__builtin_memset(k->src_ip, 0, 16);
}

/* What neighbour discovery reads of an IPv6 frame whose 40-byte header is `h` (the core's
 * `nd_facts`): the next header, whether the hop limit is 255, ICMPv6's type. */
static __always_inline void nd_facts_of(struct __sk_buff *skb, const struct l2 *f, const __u8 *h,
					struct sluice_flow_key *k)
{
	k->proto = h[6];
	if (h[7] == 255)
		k->l3 |= L3X_HOP255;
	__u8 type;
	if (h[6] == 58 /* ICMPv6 */ && !bpf_skb_load_bytes(skb, f->off + 40, &type, 1))
		k->icmp6_type = type;
}

/* X_ND (EVPN's suppression): neighbour discovery's facts of an IPv6 frame. */
static __always_inline void nd_facts(struct __sk_buff *skb, const struct l2 *f, struct sluice_flow_key *k)
{
	__u8 h[40];

	if (f->proto == bpf_htons(ETH_P_IPV6) && !bpf_skb_load_bytes(skb, f->off, h, 40))
		nd_facts_of(skb, f, h, k);
}

/* Layer 3 mode's extras (the core's `l3_extras`): whether the addresses can be read, the
 * owner of the destination address, IPv6's next header, hop limit and ICMPv6 type. */
static __always_inline void l3_extras(struct __sk_buff *skb, const struct l2 *f, struct sluice_flow_key *k)
{
	__u8 h[40];
	struct sluice_ip_key dk = {};

	if (f->proto == bpf_htons(ETH_P_ARP)) {
		/* An ARP request or reply for IPv4 over Ethernet, whole (sluice_wire's parse_neigh). */
		if (bpf_skb_load_bytes(skb, f->off, h, 28))
			return;
		if (h[0] == 0 && h[1] == 1 && h[2] == 0x08 && h[3] == 0 && h[4] == 6 && h[5] == 4 && h[6] == 0 &&
		    (h[7] == 1 || h[7] == 2))
			k->l3 = L3X_READABLE;
		return;
	}
	if (f->proto == bpf_htons(ETH_P_IP)) {
		if (bpf_skb_load_bytes(skb, f->off, h, 20))
			return;
		dk.family = 4;
		__builtin_memcpy(dk.addr, h + 16, 4);
	} else if (f->proto == bpf_htons(ETH_P_IPV6)) {
		if (bpf_skb_load_bytes(skb, f->off, h, 40))
			return;
		dk.family = 6;
		__builtin_memcpy(dk.addr, h + 24, 16);
		nd_facts_of(skb, f, h, k);
	} else {
		return;
	}
	k->l3 |= L3X_READABLE;
	__u32 *owner = bpf_map_lookup_elem(&sluice_owners, &dk);
	if (owner && *owner < SLUICE_MAX_PORTS)
		k->owner = *owner + 1;
}

/* IGMP/MLD snooping (the core's snoop::target and Mdb::class): the class of a group
 * frame's IP destination in `vlan` -- a message the core reads, a group never snooped, a
 * registered group's port set id from sluice_mdb, or unregistered -- by lookups in the
 * tables the core wrote (sluice_group_prefixes, sluice_group_control); no decision. */
static __noinline __u32 group_class(struct __sk_buff *skb, const struct l2 *f, __u16 vlan)
{
	__u8 h[40];
	struct sluice_mdb_key mk = { .vlan = vlan };
	struct sluice_group_prefix_key pk = {};
	__u32 control = 0;

	if (f->proto == bpf_htons(ETH_P_IP)) {
		if (bpf_skb_load_bytes(skb, f->off, h, 20) || (h[0] >> 4) != 4)
			return GCLASS_FLOODED;
		control = h[9];
		mk.family = 4;
		__builtin_memcpy(mk.addr, h + 16, 4);
		pk.prefixlen = 128;
		pk.addr[10] = 0xff;
		pk.addr[11] = 0xff;
		__builtin_memcpy(pk.addr + 12, h + 16, 4);
	} else if (f->proto == bpf_htons(ETH_P_IPV6)) {
		if (bpf_skb_load_bytes(skb, f->off, h, 40))
			return GCLASS_FLOODED;
		/* The ICMPv6 type, if any, after at most one hop-by-hop header. */
		__u8 next = h[6];
		__u32 at = f->off + 40;
		__u8 x[2];
		if (next == 0 && !bpf_skb_load_bytes(skb, at, x, 2)) {
			next = x[0];
			at += ((__u32)x[1] + 1) * 8;
		}
		if (next == 58 && !bpf_skb_load_bytes(skb, at, x, 1))
			control = GCONTROL_ICMP6 + x[0];
		mk.family = 6;
		__builtin_memcpy(mk.addr, h + 24, 16);
		pk.prefixlen = 128;
		__builtin_memcpy(pk.addr, h + 24, 16);
	} else {
		return GCLASS_FLOODED;
	}
	/* Multicast first, then the core's messages, then snooped or not: snoop::target's
	 * order, with its tables. */
	__u32 *prefix = bpf_map_lookup_elem(&sluice_group_prefixes, &pk);
	if (!prefix)
		return GCLASS_FLOODED;
	__u32 *c = control ? bpf_map_lookup_elem(&sluice_group_control, &control) : 0;
	if (c && *c)
		return GCLASS_CONTROL;
	if (*prefix != GPFX_SNOOPED)
		return GCLASS_FLOODED;
	__u32 *set = bpf_map_lookup_elem(&sluice_mdb, &mk);
	return set ? *set : GCLASS_UNREGISTERED;
}

/* The core's `measure` (sluice_wire's gso_max_l3_len): what the frame is held to against
 * an output's MTU — its length past the Ethernet header (and tag), or for a GSO frame the
 * length of its largest segment: its IP and TCP or UDP headers and at most gso_size bytes
 * of the IP packet's payload (which ends where the IP header says, not at the frame's
 * end). -1 for a GSO frame the core will not cut, with the core's checks: a version that
 * is not the EtherType's, an IPv4 header under 20 bytes or a fragment, an IP length past
 * the frame, an IPv6 extension header, TCP or UDP headers past the IP packet, a segment
 * longer than an IP length can say. */
static __always_inline long measure(struct __sk_buff *skb, const struct l2 *f)
{
	long len = (long)skb->len - f->off;
	__u32 gso = skb->gso_size;
	__u8 h[40];
	__u32 hl, end, ip_hl;
	__u8 l4;

	if (!gso)
		return len;
	if (f->proto == bpf_htons(ETH_P_IP)) {
		if (bpf_skb_load_bytes(skb, f->off, h, 20) || (h[0] >> 4) != 4)
			return -1;
		hl = (h[0] & 15) * 4;
		if (hl < 20 || (((__u32)h[6] << 8 | h[7]) & 0x3fff))
			return -1;
		end = (__u32)h[2] << 8 | h[3];
		/* 0: BIG TCP, the frame's length is the packet's. */
		if (!end)
			end = len;
		ip_hl = 0;
		l4 = h[9];
	} else if (f->proto == bpf_htons(ETH_P_IPV6)) {
		if (bpf_skb_load_bytes(skb, f->off, h, 40) || (h[0] >> 4) != 6)
			return -1;
		hl = 40;
		end = (__u32)h[4] << 8 | h[5];
		end = end ? end + 40 : len;
		/* (An IPv6 payload length leaves the fixed header out.) */
		ip_hl = 40;
		l4 = h[6];
	} else {
		return -1;
	}
	if (len < 0 || end > len || hl > end)
		return -1;
	if (l4 == IPPROTO_TCP) {
		__u8 doff;
		if (hl + 20 > end || bpf_skb_load_bytes(skb, f->off + hl + 12, &doff, 1))
			return -1;
		__u32 th = (doff >> 4) * 4;
		if (th < 20 || hl + th > end)
			return -1;
		hl += th;
	} else if (l4 == IPPROTO_UDP) {
		if (hl + 8 > end)
			return -1;
		hl += 8;
	} else {
		/* (Extension headers included: the core cuts none.) */
		return -1;
	}
	__u32 payload = end - hl;
	__u32 largest = payload < gso ? payload : gso;
	if (hl - ip_hl + largest > 65535)
		return -1;
	return hl + largest;
}

/* Gives the frame the tag an output wants: `proto` (network order; 0: untagged) with
 * `want`. `*cur`/`*tci` say what it has now and are kept. Nonzero on failure. */
static __always_inline int retag(struct __sk_buff *skb, __u16 *cur, __u16 *tci, __u16 proto, __u16 want)
{
	if (*cur && (*cur != proto || *tci != want)) {
		if (bpf_skb_vlan_pop(skb))
			return -1;
		*cur = 0;
	}
	if (proto && !*cur) {
		if (bpf_skb_vlan_push(skb, proto, want))
			return -1;
		*cur = proto;
		*tci = want;
	}
	return 0;
}

/* Where tunnel output `o`'s copy of a frame to `dmac` goes: one endpoint (`*remote`: the
 * output's, or where the destination was heard), or for a flood's copy (OF_FLOOD_EPS) to a
 * destination the remote table does not have, every endpoint of the flood set (`*flood`,
 * 1 to SLUICE_MAX_FLOOD_EPS of them) — the core's tunnel port's `targets`. Nonzero when a
 * table lacks the entry. */
static __always_inline int tun_dest(const struct sluice_out *o, const __u8 *dmac, const __u8 **remote,
				    const struct sluice_flood_eps_val **flood)
{
	__u32 ifindex = o->ifindex;

	*remote = o->remote;
	*flood = 0;
	if (o->flags & (OF_REMOTE_DST | OF_FLOOD_EPS)) {
		struct sluice_remote_key rk = { .ifindex = ifindex, .vni = o->vni };
		__builtin_memcpy(rk.mac, dmac, 6);
		struct sluice_remote *r = is_group(dmac) ? 0 : bpf_map_lookup_elem(&sluice_remotes, &rk);
		if (r) {
			*remote = r->addr;
			return 0;
		}
		if (!(o->flags & OF_FLOOD_EPS))
			return -1;
		struct sluice_flood_key fk = { .ifindex = ifindex, .vni = o->vni };
		const struct sluice_flood_eps_val *f = bpf_map_lookup_elem(&sluice_flood_eps, &fk);
		if (!f || !f->n || f->n > SLUICE_MAX_FLOOD_EPS)
			return -1;
		*flood = f;
	}
	return 0;
}

/* The executor's per-CPU scratch space, off its stack (the executor's frame, the sending
 * loop's and a flood's fan-out loop's share 512 bytes): the tunnel key being set, and the
 * state of a flood's copies into a tunnel (fan_one). Nothing in it outlives a call: a
 * clone's transmit never runs the executor again on the same CPU before it returns (every
 * device it reaches queues what it receives). */
struct scratch {
	struct bpf_tunnel_key key;
	__u32 ifindex;  /* the flood's tunnel device */
	__u32 vni;
	__u32 n;        /* its endpoints */
	__u32 last;     /* the last endpoint gets the frame itself */
	__u32 sent;     /* a copy left */
	__s32 ret;      /* bpf_redirect's, for the frame itself */
	__u32 slot;     /* the output's slot, where it is counted */
	__u32 bytes;    /* its length, tag included */
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct scratch);
} sluice_scratch SEC(".maps");

static __always_inline struct scratch *scratch(void)
{
	__u32 zero = 0;
	return bpf_map_lookup_elem(&sluice_scratch, &zero);
}

/* Gives a copy into tunnel `t` its tunnel key: VNI `vni`, endpoint `remote`, the tunnel's
 * local address and TTL. The device adds the outer headers. Nonzero on failure. */
static __always_inline int set_key(struct __sk_buff *skb, const struct sluice_tunnel *t, __u32 vni,
				   const __u8 *remote)
{
	struct scratch *sc = scratch();
	if (!sc)
		return -1;
	struct bpf_tunnel_key *k = &sc->key;
	__u64 flags;
	__builtin_memset(k, 0, sizeof(*k));
	k->tunnel_id = vni;
	k->tunnel_ttl = t->ttl;
	if (t->flags & TUN_V6) {
		__builtin_memcpy(k->remote_ipv6, remote, 16);
		__builtin_memcpy(k->local_ipv6, t->local, 16);
		flags = BPF_F_TUNINFO_IPV6;
	} else {
		__u32 r4, l4;
		__builtin_memcpy(&r4, remote, 4);
		__builtin_memcpy(&l4, t->local, 4);
		k->remote_ipv4 = bpf_ntohl(r4);
		k->local_ipv4 = bpf_ntohl(l4);
		/* No outer UDP checksum over IPv4, as the kernel's vxlan sends by default. */
		flags = BPF_F_ZERO_CSUM_TX;
	}
	return bpf_skb_set_tunnel_key(skb, k, sizeof(*k), flags) ? -1 : 0;
}

/* A MAC address passed to a global function (whose pointer arguments are checked
 * against the size of what they point to). */
struct mac6 {
	__u8 b[6];
};

/* Whether tunnel output `o` can be served for a frame to `d`: the tunnel's settings and
 * the entry its endpoint comes from are there, and a GSO frame goes to one endpoint (the
 * core bounds what a GSO frame may cost a tunnel that sends it to several: its call).
 * 0 if so. (A global function: the verifier checks it once, on its own, and the plan's
 * loop sees only its result.) */
__noinline int tun_ready(struct __sk_buff *skb, const struct sluice_out *o, const struct mac6 *d)
{
	const __u8 *remote;
	const struct sluice_flood_eps_val *flood;

	if (!o || !d)
		return -1;
	__u32 ifindex = o->ifindex;
	if (!bpf_map_lookup_elem(&sluice_tunnels, &ifindex) || tun_dest(o, d->b, &remote, &flood))
		return -1;
	if (flood && flood->n > 1 && skb->gso_size)
		return -1;
	return 0;
}

/* Readies the copy of tunnel output `o` for a frame to `d`: 0 when it goes to one endpoint
 * (its tunnel key set), 1 when it is a flood's copy for every endpoint of the flood set
 * (the scratch space says which tunnel, VNI and how many endpoints: fan_out sends them),
 * -1 when a table lacks the entry. A global function, as tun_ready: the verifier checks it
 * once, on its own, and it keeps its locals off send_out's frame. */
__noinline int tun_out(struct __sk_buff *skb, const struct sluice_out *o, const struct mac6 *d)
{
	const __u8 *remote;
	const struct sluice_flood_eps_val *flood;

	if (!o || !d)
		return -1;
	__u32 ifindex = o->ifindex;
	const struct sluice_tunnel *t = bpf_map_lookup_elem(&sluice_tunnels, &ifindex);
	if (!t || tun_dest(o, d->b, &remote, &flood))
		return -1;
	if (!flood)
		return set_key(skb, t, o->vni, remote) ? -1 : 0;
	struct scratch *sc = scratch();
	if (!sc)
		return -1;
	sc->ifindex = ifindex;
	sc->vni = o->vni;
	sc->n = flood->n < SLUICE_MAX_FLOOD_EPS ? flood->n : SLUICE_MAX_FLOOD_EPS;
	return 1;
}

/* A verdict being executed (bpf_loop's callbacks see it through a pointer to the stack). */
struct run {
	struct __sk_buff *skb;
	const struct sluice_verdict *v;
	long l3;        /* measure(), against each output's MTU */
	__u32 n;        /* outputs */
	__u32 mark;     /* the frame's mark as it arrived */
	__u16 cur;      /* the tag it has now (retag() keeps these) */
	__u16 tci;
	__u16 pcp;      /* its priority, shifted into a TCI's place */
	__u8 host;      /* V_HOST: every output gets a copy, the frame goes on to the host */
	__u8 up;        /* the plan found an output the tables cannot serve */
	__u8 dmac[6];   /* the destination MAC address the frame leaves with */
	__u8 src[6];    /* its source MAC address as it arrived */
	__u8 cur_src[6]; /* and as it is now */
	int ret;        /* what the frame itself came to */
	__u8 fan;       /* the last output is a flood into a tunnel, its copies to be sent */
};

/* The plan, before anything is changed: every tunnel output has its tables' entries. */
static long plan_out(__u32 i, void *ctx)
{
	struct run *r = ctx;

	if (i >= SLUICE_MAX_OUTPUTS)
		return 1;
	const struct sluice_out *o = &r->v->outputs[i];
	if (o->kind == OUT_TUNNEL && tun_ready(r->skb, o, (const struct mac6 *)r->dmac)) {
		r->up = 1;
		return 1;
	}
	return 0;
}

/* Endpoint `i` of a flood into a tunnel (the scratch space says which tunnel, VNI and how
 * many endpoints; bpf_loop's context is the frame): the copy's own tunnel key, then a clone
 * out of the device — whose vxlan transmit (no queue) reads the key before the next one is
 * set — or, the last endpoint of the frame's last output, the frame itself. */
static long fan_one(__u32 i, void *ctx)
{
	struct __sk_buff *skb = *(struct __sk_buff **)ctx;
	struct scratch *sc = scratch();

	if (!sc || i >= sc->n || i >= SLUICE_MAX_FLOOD_EPS)
		return 1;
	__u32 ifindex = sc->ifindex;
	struct sluice_flood_key fk = { .ifindex = ifindex, .vni = sc->vni };
	const struct sluice_tunnel *t = bpf_map_lookup_elem(&sluice_tunnels, &ifindex);
	const struct sluice_flood_eps_val *f = bpf_map_lookup_elem(&sluice_flood_eps, &fk);
	if (!t || !f)
		return 1;
	/* (Masked after a barrier the compiler cannot see through, so that the verifier sees
	 * the index bounded: SLUICE_MAX_FLOOD_EPS is a power of two.) */
	__u32 at = i;
	asm volatile("" : "+r"(at));
	at &= SLUICE_MAX_FLOOD_EPS - 1;
	if (set_key(skb, t, sc->vni, f->addrs[at]))
		return 0;
	/* (set_key used the scratch space's key; the rest of it is this loop's.) */
	sc = scratch();
	if (!sc)
		return 1;
	if (sc->last && i + 1 == sc->n) {
		sc->ret = bpf_redirect(ifindex, 0);
		if (sc->ret != TC_ACT_SHOT)
			sc->sent = 1;
	} else if (!bpf_clone_redirect(skb, ifindex, 0)) {
		sc = scratch();
		if (sc)
			sc->sent = 1;
	}
	return 0;
}

/* Output `i`: offered, measured against its MTU, tagged, rewritten, then cloned to it —
 * or, the last (unless the host takes the frame), given the frame itself; a flood's copy
 * into a tunnel, always the last output, is left to fan_out. Counted at the output
 * (offered, over_mtu, tx_error, sent). */
static long send_out(__u32 i, void *ctx)
{
	struct run *r = ctx;

	if (i >= SLUICE_MAX_OUTPUTS)
		return 1;
	/* (Read in place, not copied: the stack is the executor's and the callback's.) */
	const struct sluice_out *o = &r->v->outputs[i];
	__u32 oslot = o->slot;
	struct sluice_counters *oc = bpf_map_lookup_elem(&sluice_stats, &oslot);
	if (!oc)
		return 0;
	int last = i + 1 == r->n && !r->host;
	oc->v[C_TX_OFFERED]++;
	if (r->l3 > o->mtu) {
		oc->v[C_TX_DROP + D_OVER_MTU]++;
		return 0;
	}
	struct __sk_buff *skb = r->skb;
	__u16 proto = (o->flags & OF_TAG) ? ETH_P_8021Q_BE : 0;
	const __u8 *src = (o->flags & OF_SRC_MAC) ? o->src_mac : r->src;
	int rewrite = !mac_eq(src, r->cur_src);
	/* (A flood's copy into a tunnel is always the last output: convert::output_order.) */
	int fan = o->kind == OUT_TUNNEL ? tun_out(skb, o, (const struct mac6 *)r->dmac) : 0;
	if (fan < 0 || (fan && i + 1 != r->n) ||
	    retag(skb, &r->cur, &r->tci, proto, r->pcp | (o->vid & 0x0fff)) ||
	    (rewrite && bpf_skb_store_bytes(skb, 6, src, 6, 0))) {
		oc->v[C_TX_DROP + D_TX_ERROR]++;
		return 0;
	}
	if (rewrite)
		__builtin_memcpy(r->cur_src, src, 6);
	/* (What the skb holds, not what retag() knows of: a tag kept in the frame is in
	 * skb->len, and popping one can move the next tag of the frame into the metadata.) */
	__u64 bytes = skb->len + (skb->vlan_present ? 4 : 0);
	if (fan) {
		/* A flood into a tunnel: its copies are sent by fan_out, from the executor's own
		 * frame. */
		struct scratch *sc = scratch();
		if (!sc) {
			oc->v[C_TX_DROP + D_TX_ERROR]++;
			return 0;
		}
		sc->last = last;
		sc->slot = oslot;
		sc->bytes = bytes;
		r->fan = 1;
		return 0;
	} else if (last) {
		skb->mark = (o->flags & OF_MARK) ? SLUICE_MARK : 0;
		r->ret = o->kind == OUT_PEER ? bpf_redirect_peer(o->ifindex, 0) : bpf_redirect(o->ifindex, 0);
		if (r->ret == TC_ACT_SHOT) {
			oc->v[C_TX_DROP + D_TX_ERROR]++;
			return 0;
		}
	} else {
		/* (A copy always leaves through the device's egress; only a guest's lets it
		 * in, and only marked.) */
		skb->mark = (o->flags & OF_MARK) ? SLUICE_MARK : 0;
		long e = bpf_clone_redirect(skb, o->ifindex, 0);
		skb->mark = r->mark;
		if (e) {
			oc->v[C_TX_DROP + D_TX_ERROR]++;
			return 0;
		}
	}
	oc->v[C_TX_FRAMES]++;
	oc->v[C_TX_BYTES] += bytes;
	if (skb->gso_size)
		oc->v[C_TX_GSO]++;
	return 0;
}

/* The copies of a flood into a tunnel that send_out prepared (the scratch space says
 * where): one per endpoint of the flood set (fan_one), all one frame the tunnel port was
 * given, as the core counts what it gives its tunnel port. A loop of the executor's own,
 * not one inside send_out's: three frames on the stack would not fit. */
static __always_inline void fan_out(struct run *r)
{
	struct scratch *sc = scratch();
	if (!sc)
		return;
	struct __sk_buff *skb = r->skb;
	sc->sent = 0;
	sc->ret = TC_ACT_SHOT;
	skb->mark = 0;
	bpf_loop(sc->n < SLUICE_MAX_FLOOD_EPS ? sc->n : SLUICE_MAX_FLOOD_EPS, fan_one, &r->skb, 0);
	sc = scratch();
	if (!sc)
		return;
	if (sc->last)
		r->ret = sc->ret;
	else
		skb->mark = r->mark;
	__u32 slot = sc->slot;
	struct sluice_counters *oc = bpf_map_lookup_elem(&sluice_stats, &slot);
	if (!oc)
		return;
	if (!sc->sent) {
		oc->v[C_TX_DROP + D_TX_ERROR]++;
		return;
	}
	oc->v[C_TX_FRAMES]++;
	oc->v[C_TX_BYTES] += sc->bytes;
	if (skb->gso_size)
		oc->v[C_TX_GSO]++;
}

/* Executes a verdict with outputs, for a frame of measure `l3` (see measure()). What the
 * tables cannot serve (a next hop or a remote endpoint not there) goes up before anything
 * is changed or counted. */
static __always_inline int execute(struct __sk_buff *skb, __u32 slot, struct sluice_counters *c, const struct l2 *f,
				   __u16 vlan, const struct sluice_verdict *v, long l3)
{
	__u8 flags = v->flags;
	__u32 n = v->n_out;
	if (n > SLUICE_MAX_OUTPUTS)
		n = SLUICE_MAX_OUTPUTS;
	if (!n) {
		if (flags & V_HOST)
			return TC_ACT_OK;
		return drop(c, D_UNKNOWN_PORT);
	}
	struct run r = {
		.skb = skb, .v = v, .l3 = l3, .n = n, .mark = skb->mark, .ret = TC_ACT_SHOT,
		.host = (flags & V_HOST) != 0,
	};
	r.cur = f->vproto;
	r.tci = f->tci;
	if (f->tag == TAG_8021Q)
		r.pcp = f->tci & 0xe000;
	__builtin_memcpy(r.dmac, f->dst, 6);
	__builtin_memcpy(r.src, f->src, 6);
	__builtin_memcpy(r.cur_src, f->src, 6);
	__u8 nh = v->next_hop;
	if (nh == NH_MAC) {
		__builtin_memcpy(r.dmac, v->next_mac, 6);
	} else if (nh == NH_NEIGH) {
		struct sluice_neigh_key nk = { .vlan = vlan };
		__u32 at, len;
		if (f->proto == bpf_htons(ETH_P_IP)) {
			nk.family = 4;
			at = 16;
			len = 4;
		} else if (f->proto == bpf_htons(ETH_P_IPV6)) {
			nk.family = 6;
			at = 24;
			len = 16;
		} else {
			return up(skb, slot, c);
		}
		if ((len == 4 ? bpf_skb_load_bytes(skb, f->off + at, nk.addr, 4)
			      : bpf_skb_load_bytes(skb, f->off + at, nk.addr, 16)))
			return up(skb, slot, c);
		struct sluice_neigh_val *nv = bpf_map_lookup_elem(&sluice_neigh, &nk);
		if (!nv)
			return up(skb, slot, c);
		__builtin_memcpy(r.dmac, nv->mac, 6);
	}
	bpf_loop(n, plan_out, &r, 0);
	/* (A flood may be the host's too: it keeps its copy, as settle() does.) */
	if (r.up)
		return (flags & V_HOST) ? up_copy(skb, slot, c) : up(skb, slot, c);

	/* Decided and executable: counted, then done. */
	c->v[(flags & V_FLOOD) ? C_FLOODED : C_FORWARDED]++;
	if (flags & V_LEARN_REFUSED)
		c->v[C_LEARN_REFUSED]++;
	c->v[C_COPIES] += n;
	if (nh != NH_NONE && bpf_skb_store_bytes(skb, 0, r.dmac, 6, 0))
		return drop(c, D_TX_ERROR);
	bpf_loop(n, send_out, &r, 0);
	if (r.fan)
		fan_out(&r);
	if (!r.host)
		return r.ret;
	/* The host's frame as it arrived: its tag (in the metadata now), addresses and mark. */
	if (retag(skb, &r.cur, &r.tci, f->vproto, f->tci) || bpf_skb_store_bytes(skb, 0, f->dst, 6, 0) ||
	    bpf_skb_store_bytes(skb, 6, f->src, 6, 0))
		return TC_ACT_SHOT;
	skb->mark = r.mark;
	return TC_ACT_OK;
}

/* Where a frame from a tunnel came from: its VNI and the datagram's sender (IPv4 in the
 * first 4 bytes), read from the tunnel key the device left. */
struct origin {
	__u32 vni;
	__u8 addr[16];
};

/* Writes a report's addresses: station `mac`, sender `addr`. A function of its own, not
 * inlined, so that the report's type is in the object's BTF (no map of the ring's kind can
 * name its records' type), where the layout test finds it. */
static __noinline void heard_addresses(struct sluice_heard_event *e, const __u8 *mac, const __u8 *addr)
{
	__builtin_memcpy(e->mac, mac, 6);
	e->pad2[0] = 0;
	e->pad2[1] = 0;
	__builtin_memcpy(e->addr, addr, 16);
}

/* Station `mac`, which the station table has on tunnel input `slot` (device `ifindex`),
 * heard in VLAN `vlan` from `o`: stamped in sluice_remotes (at most once a second) when
 * that is where the table has it; else reported on sluice_heard, for the core to decide
 * whether to learn it — the program writes no forwarding state. A full ring is counted;
 * the station's next frame reports it again. */
static __always_inline void heard(__u32 ifindex, __u32 slot, __u32 in_flags, __u16 vlan, const struct origin *o,
				  const __u8 *mac, struct sluice_counters *c)
{
	struct sluice_remote_key rk = { .ifindex = ifindex, .vni = o->vni };
	__builtin_memcpy(rk.mac, mac, 6);
	struct sluice_remote *r = bpf_map_lookup_elem(&sluice_remotes, &rk);
	if (r && addr_eq(r->addr, o->addr)) {
		__u64 now = bpf_ktime_get_ns();
		if (now - r->seen_ns > SEEN_EVERY_NS)
			r->seen_ns = now;
		return;
	}
	struct sluice_heard_event *e = bpf_ringbuf_reserve(&sluice_heard, sizeof(*e), 0);
	if (!e) {
		c->v[C_HEARD_LOST]++;
		return;
	}
	e->ifindex = ifindex;
	e->slot = slot;
	e->vni = o->vni;
	e->vlan = vlan;
	e->family = (in_flags & IN_TUNNEL_V6) ? HEARD_V6 : HEARD_V4;
	e->pad = 0;
	heard_addresses(e, mac, o->addr);
	bpf_ringbuf_submit(e, 0);
}

/* The kernel's conntrack, through its kfuncs: placeholder helper ids the loader rewrites
 * into kfunc calls of the running kernel (src/kfunc.rs, KFUNCS). Entries these calls
 * insert are never advanced by netfilter (the frames are redirected at tc), so the
 * executor keeps them as the core's tracker does (crates/switch/src/conntrack.rs): a
 * reply marks the connection replied (SEEN_REPLY|ASSURED, never at the commit, so that a
 * full table can still evict the unreplied), a FIN or RST marks it closing (bit 0 of the
 * mark), and each frame refreshes its timeout — at most once a second (the second of the
 * last refresh in the mark's upper bits), or at once when its state changed. */
#include "conntrack.h"

#define IPS_SEEN_REPLY (1 << 1)
#define IPS_ASSURED (1 << 2)
#define CTM_CLOSING 1u
#define CTM_SECOND_SHIFT 8
#define TCPF_FIN 0x01
#define TCPF_SYN 0x02
#define TCPF_RST 0x04
#define TCPF_ACK 0x10

/* An IP frame's connection, as X_CT reads it. */
struct ct_frame {
	struct bpf_sock_tuple t;
	__u32 tuple_sz; /* 0: not trackable (not TCP or UDP, a later fragment, cut short) */
	__u8 proto;
	__u8 tcp_flags;
	__u8 icmp_type;
	__u8 v6;
	__u16 dport;    /* host order */
	__u8 addrs;     /* both addresses were read */
};

/* Reads what X_CT needs of an IPv4 or IPv6 frame (the core's `read_flow`): addresses,
 * protocol, ports and TCP flags of a first fragment, an ICMP type. -1: not IP, or cut
 * short before the addresses. */
static __always_inline int ct_read(struct __sk_buff *skb, const struct l2 *f, struct ct_frame *cf)
{
	__u8 h[20];
	__u32 l4;
	int first = 1;

	if (f->proto == bpf_htons(ETH_P_IP)) {
		if (bpf_skb_load_bytes(skb, f->off, h, 20) || (h[0] >> 4) != 4)
			return -1;
		__u32 ihl = (h[0] & 0x0f) * 4;
		l4 = f->off + ihl;
		cf->proto = h[9];
		first = ((((__u16)h[6] << 8) | h[7]) & 0x1fff) == 0;
		__builtin_memcpy(&cf->t.ipv4.saddr, &h[12], 4);
		__builtin_memcpy(&cf->t.ipv4.daddr, &h[16], 4);
		cf->v6 = 0;
	} else if (f->proto == bpf_htons(ETH_P_IPV6)) {
		if (bpf_skb_load_bytes(skb, f->off, h, 8) || (h[0] >> 4) != 6)
			return -1;
		/* (The tuple's source and destination follow each other, as in the header.) */
		if (bpf_skb_load_bytes(skb, f->off + 8, cf->t.ipv6.saddr, 32))
			return -1;
		l4 = f->off + 40;
		cf->proto = h[6];
		cf->v6 = 1;
	} else {
		return -1;
	}
	cf->addrs = 1;
	if (!first)
		return 0;
	if (cf->proto == IPPROTO_TCP || cf->proto == IPPROTO_UDP) {
		__u8 p[4];
		if (bpf_skb_load_bytes(skb, l4, p, 4))
			return 0;
		cf->dport = ((__u16)p[2] << 8) | p[3];
		if (cf->proto == IPPROTO_TCP && bpf_skb_load_bytes(skb, l4 + 13, &cf->tcp_flags, 1))
			return 0;
		if (cf->v6) {
			__builtin_memcpy(&cf->t.ipv6.sport, &p[0], 2);
			__builtin_memcpy(&cf->t.ipv6.dport, &p[2], 2);
			cf->tuple_sz = sizeof(cf->t.ipv6);
		} else {
			__builtin_memcpy(&cf->t.ipv4.sport, &p[0], 2);
			__builtin_memcpy(&cf->t.ipv4.dport, &p[2], 2);
			cf->tuple_sz = sizeof(cf->t.ipv4);
		}
	} else if (cf->proto == IPPROTO_ICMP || cf->proto == 58) {
		__u8 t;
		if (!bpf_skb_load_bytes(skb, l4, &t, 1))
			cf->icmp_type = t;
	}
	return 0;
}

/* The timeout (ms) of a connection of `proto` in its state: the core's, which the daemon
 * writes into the configuration (ExecConfig::ct_timeouts). */
static __always_inline __u32 ct_timeout(const struct sluice_exec_config *cfg, __u8 proto, int replied, int closing)
{
	__u32 i = (proto == IPPROTO_TCP ? 4 : 0) | (replied ? 2 : 0) | (closing ? 1 : 0);
	return cfg ? cfg->ct_timeouts[i & 7] : 0;
}

/* The class of address `a` (4 or 16 bytes) in class set `set`. */
static __always_inline __u32 addr_class(const void *a, int v6, __u32 set)
{
	struct sluice_acl_addr_key ak = { .prefixlen = 32 + (v6 ? 128 : 32) };
	__u32 s = bpf_htonl(set);
	__builtin_memcpy(ak.set, &s, 4);
	__u32 *c;
	if (v6) {
		__builtin_memcpy(ak.addr, a, 16);
		c = bpf_map_lookup_elem(&sluice_acl_v6, &ak);
	} else {
		__builtin_memcpy(ak.addr, a, 4);
		c = bpf_map_lookup_elem(&sluice_acl_v4, &ak);
	}
	return c ? *c : 0;
}

/* X_CT: the frame's connection state (looked up in the zone `ct_zone`, and kept: replied,
 * closing, its timeout refreshed) and its classes in the set `acl_set` (the core's
 * `acl_extras`). A separate call, so that its stack is not held while the executor runs. */
static __noinline void ct_extras(struct __sk_buff *skb, const struct l2 *f, struct sluice_flow_key *k)
{
	struct sluice_exec_config *cfg = config();
	__u32 zone = cfg ? cfg->ct_zone : 0, set = cfg ? cfg->acl_set : 0;
	struct ct_frame cf = {};

	if (ct_read(skb, f, &cf))
		return;
	k->ct_proto = cf.proto;
	k->icmp_type = cf.icmp_type;
	if (cf.v6) {
		k->src_class = addr_class(cf.t.ipv6.saddr, 1, set);
		k->dst_class = addr_class(cf.t.ipv6.daddr, 1, set);
	} else {
		k->src_class = addr_class(&cf.t.ipv4.saddr, 0, set);
		k->dst_class = addr_class(&cf.t.ipv4.daddr, 0, set);
	}
	{
		struct sluice_acl_port_key pk = { .prefixlen = 32 + 16 };
		__u32 s = bpf_htonl(set);
		__builtin_memcpy(pk.set, &s, 4);
		pk.port[0] = cf.dport >> 8;
		pk.port[1] = cf.dport & 0xff;
		__u32 *c = bpf_map_lookup_elem(&sluice_acl_ports, &pk);
		k->dport_class = c ? *c : 0;
	}
	__u64 sz = cf.tuple_sz;
	if (!sz)
		return;
	/* (The bound, kept from the compiler, is the verifier's.) */
	asm volatile("" : "+r"(sz));
	if (sz > sizeof(cf.t.ipv6))
		return;
	struct bpf_ct_opts o = { .netns_id = -1, .l4proto = cf.proto, .ct_zone_id = zone };
	struct nf_conn *ct = bpf_skb_ct_lookup(skb, &cf.t, sz, &o, sizeof(o));
	if (!ct) {
		/* (Whether a segment may open a connection is the core's to say, by its flags.) */
		k->ct = CTS_MISS;
		if (cf.proto == IPPROTO_TCP)
			k->ct_flags = cf.tcp_flags & CT_FLAGS;
		skb->cb[0] |= (__u32)CTS_MISS << ORIGIN_CT_SHIFT;
		return;
	}
	int reply = o.dir != 0;
	k->ct = reply ? CTS_REPLY : CTS_ESTABLISHED;
	skb->cb[0] |= (__u32)k->ct << ORIGIN_CT_SHIFT;
	unsigned long status = ct->status;
	__u32 mark = ct->mark;
	int replied = (status & IPS_SEEN_REPLY) != 0;
	int closing = (mark & CTM_CLOSING) != 0;
	int changed = 0;
	if (reply && !replied) {
		bpf_ct_change_status(ct, (__u32)status | IPS_SEEN_REPLY | IPS_ASSURED);
		replied = 1;
		changed = 1;
	}
	if (cf.proto == IPPROTO_TCP && (cf.tcp_flags & (TCPF_FIN | TCPF_RST)) && !closing) {
		closing = 1;
		changed = 1;
	}
	__u32 second = (__u32)(bpf_ktime_get_ns() >> 30) << CTM_SECOND_SHIFT;
	if (changed || (mark & ~0xffu) != second) {
		ct->mark = second | (closing ? CTM_CLOSING : 0);
		bpf_ct_change_timeout(ct, ct_timeout(cfg, cf.proto, replied, closing));
	}
	bpf_ct_release(ct);
}

/* CT_COMMIT: remembers the frame's connection in the zone `ct_zone` (a new one the core's rules
 * let open): 0, or -1 when the table is full. A tuple inserted meanwhile (another CPU's
 * frame of the same connection) is taken as remembered. */
static __noinline int ct_commit(struct __sk_buff *skb, const struct l2 *f)
{
	struct sluice_exec_config *cfg = config();
	__u32 zone = cfg ? cfg->ct_zone : 0;
	struct ct_frame cf = {};

	if (ct_read(skb, f, &cf))
		return 0;
	__u64 sz = cf.tuple_sz;
	if (!sz)
		return 0;
	/* (The bound, kept from the compiler, is the verifier's.) */
	asm volatile("" : "+r"(sz));
	if (sz > sizeof(cf.t.ipv6))
		return 0;
	struct bpf_ct_opts o = { .netns_id = -1, .l4proto = cf.proto, .ct_zone_id = zone };
	struct nf_conn___init *n = bpf_skb_ct_alloc(skb, &cf.t, sz, &o, sizeof(o));
	if (!n)
		return o.error == -12 ? -1 : 0;
	bpf_ct_set_timeout(n, ct_timeout(cfg, cf.proto, 0, 0));
	n->ct.mark = (__u32)(bpf_ktime_get_ns() >> 30) << CTM_SECOND_SHIFT;
	struct nf_conn *ct = bpf_ct_insert_entry(n);
	if (ct)
		bpf_ct_release(ct);
	return 0;
}

/* A tunnel's frame's origin: the key the device left when it took the outer headers off
 * (VNI, sender), into the stage-1 key `ak` and `o`, and skb->cb[0] (up_tag). Nonzero when
 * the frame has no key. Not inlined: its key off the executor's stack, which the sending
 * loops share. */
static __noinline int tunnel_origin(struct __sk_buff *skb, __u32 ifindex, __u32 in_flags,
				    struct sluice_admit_key *ak, struct origin *o)
{
	struct bpf_tunnel_key tk = {};
	struct sluice_endpoint_key ek = { .ifindex = ifindex };
	if (in_flags & IN_TUNNEL_V6) {
		if (bpf_skb_get_tunnel_key(skb, &tk, sizeof(tk), BPF_F_TUNINFO_IPV6))
			return -1;
		__builtin_memcpy(ek.addr, tk.remote_ipv6, 16);
	} else {
		if (bpf_skb_get_tunnel_key(skb, &tk, sizeof(tk), 0))
			return -1;
		__u32 a = bpf_htonl(tk.remote_ipv4);
		__builtin_memcpy(ek.addr, &a, 4);
	}
	o->vni = tk.tunnel_id;
	__builtin_memcpy(o->addr, ek.addr, 16);
	ak->vni = tk.tunnel_id;
	ak->endpoint = bpf_map_lookup_elem(&sluice_endpoints, &ek) != 0;
	skb->cb[0] = ORIGIN_SET | (ak->endpoint ? ORIGIN_ENDPOINT : 0) | (ak->vni & 0xffffff);
	return 0;
}

/* The program's body: sluice_exec, and sluice_exec_tunneled after it gave the frame a
 * tunnel key. */
static __always_inline int exec_frame(struct __sk_buff *skb)
{
	__u32 ifindex = skb->ifindex;
	struct sluice_input *in = bpf_map_lookup_elem(&sluice_inputs, &ifindex);
	if (!in)
		return TC_ACT_OK; /* not a sluice port: the stack's */
	__u32 slot = in->slot;
	__u32 in_flags = in->flags;
	__u8 own[6], guest[6];
	__builtin_memcpy(own, in->own_mac, 6);
	__builtin_memcpy(guest, in->guest_mac, 6);
	struct sluice_counters *c = bpf_map_lookup_elem(&sluice_stats, &slot);
	if (!c || slot >= SLUICE_MAX_PORTS)
		return TC_ACT_SHOT;

	/* Stage 1: the port in, how the frame arrived, and (before admission) whether it is
	 * the host's. */
	struct sluice_admit_key ak = { .slot = slot };
	struct origin o = {};
	skb->cb[0] = 0;
	if ((in_flags & IN_TUNNEL) && tunnel_origin(skb, ifindex, in_flags, &ak, &o)) {
		c->v[C_TUN_BAD]++;
		return TC_ACT_SHOT;
	}
	struct l2 f = {};
	if (parse_l2(skb, &f)) {
		count_rx(c, skb);
		return drop(c, D_MALFORMED);
	}
	ak.tag = f.tag;
	ak.vid = f.tag == TAG_8021Q ? f.tci & 0x0fff : 0;
	if (is_group(f.dst))
		ak.dst = is_link_local(f.dst) ? DST_LINK_LOCAL : is_broadcast(f.dst) ? DST_BROADCAST : DST_GROUP;
	else if ((in_flags & IN_OWN_MAC) && mac_eq(f.dst, own))
		ak.dst = DST_OWN;
	struct sluice_exec_config *cfg = config();
	__u64 gen = cfg ? cfg->generation : 0;
	struct sluice_admit *a = bpf_map_lookup_elem(&sluice_admits, &ak);
	if (a && a->generation == gen && a->action == ACT_HOST)
		return TC_ACT_OK;
	count_rx(c, skb);
	int host = (in_flags & IN_HOST) && ak.dst != DST_UNKNOWN;
	if (is_group(f.src)) {
		/* Not the switch's to forward; the host's all the same, if it is the host's. */
		drop(c, D_MALFORMED);
		return host ? TC_ACT_OK : TC_ACT_SHOT;
	}
	if (!a || a->generation != gen)
		return miss(skb, slot, c, host);
	__u8 action = a->action, cause = a->cause, aflags = a->flags;
	__u16 vlan = a->vlan, mask = a->mask;
	if (action != ACT_FORWARD)
		return settle(skb, slot, c, action, cause, aflags);

	/* Measured, and held to the core's bounds, where the core's classify does it: a GSO
	 * frame the core would not cut is malformed (the host still takes its own); one
	 * asking for tiny segments, or too many (a guest's raw socket can), is over the core's
	 * bound, so that it costs no output, and no kernel that would cut it, thousands of
	 * frames. */
	long l3 = measure(skb, &f);
	__u32 gso = skb->gso_size;
	__u32 bad = 0;
	if (l3 < 0) {
		bad = D_MALFORMED;
	} else if (gso) {
		/* The core's count: the IP packet less the largest segment's headers, in
		 * segments. */
		__u32 payload = (skb->len - f.off) - (l3 - (gso < l3 ? gso : l3));
		if (gso < SLUICE_MIN_GSO_SIZE || (payload + gso - 1) / gso > SLUICE_MAX_GSO_SEGMENTS)
			bad = D_GSO_LIMIT;
	}
	if (bad) {
		drop(c, bad);
		return host ? TC_ACT_OK : TC_ACT_SHOT;
	}

	/* Stage 2: what the forwarding decision reads. */
	struct sluice_flow_key k = {
		.slot = slot, .vlan = vlan, .ethertype = bpf_ntohs(f.proto), .dst = ak.dst,
	};
	if (k.dst == DST_LINK_LOCAL)
		k.dst_slot = f.dst[5];
	if (mask & X_LOCKS) {
		struct sluice_lock_key lk = {};
		__builtin_memcpy(lk.mac, f.src, 6);
		__u32 *owner = bpf_map_lookup_elem(&sluice_locks, &lk);
		if (owner && *owner != slot)
			k.src = SRC_LOCKED;
	}
	struct sluice_fib_key fk = { .vlan = vlan };
	if (mask & X_GUEST) {
		if (k.src == SRC_ABSENT && (in_flags & IN_GUEST) && mac_eq(f.src, guest))
			k.src = SRC_HERE;
	} else if (k.src == SRC_ABSENT) {
		if (mac_zero(f.src)) {
			k.src = SRC_UNLEARNABLE;
		} else {
			__builtin_memcpy(fk.mac, f.src, 6);
			struct sluice_fib_val *s = bpf_map_lookup_elem(&sluice_fib, &fk);
			if (s && s->slot == slot) {
				k.src = SRC_HERE;
				__u64 now = bpf_ktime_get_ns();
				if (now - s->seen_ns > SEEN_EVERY_NS)
					s->seen_ns = now;
			} else if (s && (s->flags & FIB_STATIC)) {
				k.src = SRC_STATIC;
			} else if (mask & X_ROUTED) {
				k.src = SRC_UNLEARNABLE;
			} else if (s) {
				k.src = SRC_ELSEWHERE;
			}
		}
	}
	if (k.dst == DST_UNKNOWN && (mask & X_DST_STATION)) {
		__builtin_memcpy(fk.mac, f.dst, 6);
		struct sluice_fib_val *d = bpf_map_lookup_elem(&sluice_fib, &fk);
		if (d && d->slot < SLUICE_MAX_PORTS) {
			k.dst = DST_STATION;
			k.dst_slot = d->slot;
		}
	}
	if (mask & X_SRC_MAC)
		__builtin_memcpy(k.src_mac, f.src, 6);
	if (mask & X_SRC_IP)
		claim(skb, &f, &k);
	if (mask & X_L3)
		l3_extras(skb, &f, &k);
	if (mask & X_ND)
		nd_facts(skb, &f, &k);
	if ((mask & X_GROUP) && k.dst == DST_GROUP) {
		__u32 g = group_class(skb, &f, vlan);
		__builtin_memcpy(k.group, &g, 4);
	}
	if (mask & X_CT)
		ct_extras(skb, &f, &k);

	struct sluice_verdict *v = bpf_map_lookup_elem(&sluice_verdicts, &k);
	if (!v || v->generation != gen)
		return miss(skb, slot, c, host);
	if (v->flags & V_HITS)
		__sync_fetch_and_add(&v->hits, 1);
	/* Where a tunnel's station is heard from is reported only for a frame the core learns
	 * from (V_TEACHES: it passed the checks that come before learning). */
	if ((in_flags & IN_TUNNEL) && k.src == SRC_HERE && (v->flags & V_TEACHES))
		heard(ifindex, slot, in_flags, vlan, &o, f.src, c);
	/* (`learn_refused` is counted where the frame is settled here, not when it goes up:
	 * the core counts it then.) */
	if (v->action != ACT_FORWARD) {
		if ((v->flags & V_LEARN_REFUSED) && v->action != ACT_UP)
			c->v[C_LEARN_REFUSED]++;
		return settle(skb, slot, c, v->action, v->cause, v->flags);
	}
	/* Storm control: the verdict says which of the input's meters the frame is charged
	 * to; over it, dropped at the input (the host's all the same, if it is the host's). */
	if ((v->flags & (V_STORM_BC | V_STORM_MC)) &&
	    !meter_take(slot, (v->flags & V_STORM_BC) ? METER_STORM_BC : METER_STORM_MC, 1)) {
		drop(c, D_STORM);
		return (v->flags & V_HOST) ? TC_ACT_OK : TC_ACT_SHOT;
	}
	/* Rate-in: a policer (the only queue in front of a guest's transmit is its own),
	 * charged by the frame's bytes on the wire, a GSO frame whole. */
	if ((v->flags & V_METER_IN) && !meter_take(slot, METER_RATE_IN, skb->len + (skb->vlan_present ? 4 : 0))) {
		drop(c, D_RATE_LIMIT);
		return (v->flags & V_HOST) ? TC_ACT_OK : TC_ACT_SHOT;
	}
	/* Security groups: a new connection the rules let open is remembered; the table
	 * full, the frame is dropped (the host's all the same, if it is the host's). */
	if (v->ct == CT_COMMIT && ct_commit(skb, &f)) {
		drop(c, D_CT_FULL);
		return (v->flags & V_HOST) ? TC_ACT_OK : TC_ACT_SHOT;
	}
	return execute(skb, slot, c, &f, vlan, v, l3);
}

SEC("classifier")
int sluice_exec(struct __sk_buff *skb)
{
	return exec_frame(skb);
}

/* The daemon's access to the switch's connections in the kernel's conntrack, for frames
 * the executor does not see: those the core decided after an upcall (the executor never
 * saw that verdict, so it did not commit) and those of ports in user space. The daemon
 * runs these on a frame with BPF_PROG_TEST_RUN (never attached). */

/* X_CT's lookup, as the executor does it (the connection refreshed): the CTS_*. */
SEC("classifier")
int sluice_ct_lookup(struct __sk_buff *skb)
{
	struct l2 f = {};
	struct sluice_flow_key k = {};

	if (parse_l2(skb, &f))
		return CTS_UNTRACKED;
	ct_extras(skb, &f, &k);
	return k.ct;
}

/* CT_COMMIT, as the executor does it: TC_ACT_OK; TC_ACT_SHOT when the table is full. */
SEC("classifier")
int sluice_ct_commit(struct __sk_buff *skb)
{
	struct l2 f = {};

	if (parse_l2(skb, &f))
		return TC_ACT_OK;
	return ct_commit(skb, &f) ? TC_ACT_SHOT : TC_ACT_OK;
}

/* For tests alone (crates/ebpf/tests/exec.rs; never attached): BPF_PROG_TEST_RUN gives a
 * frame no tunnel key, so this program first gives it the key a vxlan device in external
 * mode leaves on what it receives — the VNI `cb[0]`, the sender `cb[1..4]` (the address's
 * bytes in memory order, IPv4 in `cb[1]`), the family of its input's underlay — and then
 * runs sluice_exec's body on it. */
/* Gives the frame the tunnel key the test put in its cb (a call of its own, so that its
 * stack is not held while the executor runs). */
static __noinline int set_test_key(struct __sk_buff *skb)
{
	__u32 ifindex = skb->ifindex;
	struct sluice_input *in = bpf_map_lookup_elem(&sluice_inputs, &ifindex);
	struct bpf_tunnel_key k = {};
	__u64 flags = 0;

	k.tunnel_id = skb->cb[0];
	/* (What the key's reader gets as the remote address is what a sender sets as local.) */
	if (in && (in->flags & IN_TUNNEL_V6)) {
		k.local_ipv6[0] = skb->cb[1];
		k.local_ipv6[1] = skb->cb[2];
		k.local_ipv6[2] = skb->cb[3];
		k.local_ipv6[3] = skb->cb[4];
		flags = BPF_F_TUNINFO_IPV6;
	} else {
		k.local_ipv4 = bpf_ntohl(skb->cb[1]);
	}
	return bpf_skb_set_tunnel_key(skb, &k, sizeof(k), flags) ? -1 : 0;
}

SEC("classifier")
int sluice_exec_tunneled(struct __sk_buff *skb)
{
	if (set_test_key(skb))
		return TC_ACT_SHOT;
	return exec_frame(skb);
}

/* At the egress of the switch side of a guest's veth, and of the upcall TAP: what goes on
 * into the guest, or into the TAP's queue for the daemon. Only the switch's own frames
 * carry SLUICE_MARK — the executor's clones and redirects to a device's egress and its
 * upcalls, the daemon's packet socket (SO_MARK) — and they pass with the mark cleared;
 * bpf_redirect_peer never comes this way. Anything else is a frame someone in the switch's
 * namespace sent through the interface (a socket bound to it, the kernel's own): dropped,
 * counted at a guest's port as a received frame refused (`egress_refused`), at the upcall
 * TAP in the switch's own counters (so that a flood of them can neither fill the queue the
 * upcalls wait in nor reach the daemon). It decides nothing either: a guard on the
 * switch's own devices. */
SEC("classifier")
int sluice_egress(struct __sk_buff *skb)
{
	if (skb->mark == SLUICE_MARK) {
		skb->mark = 0;
		return TC_ACT_OK;
	}
	__u32 ifindex = skb->ifindex;
	struct sluice_input *in = bpf_map_lookup_elem(&sluice_inputs, &ifindex);
	if (in) {
		__u32 slot = in->slot;
		struct sluice_counters *c = bpf_map_lookup_elem(&sluice_stats, &slot);
		if (c) {
			c->v[C_RX_FRAMES]++;
			c->v[C_RX_BYTES] += skb->len;
			c->v[C_RX_DROP + D_EGRESS_REFUSED]++;
		}
		return TC_ACT_SHOT;
	}
	__u32 zero = 0;
	struct sluice_exec_config *cfg = config();
	struct sluice_switch_counters *s = bpf_map_lookup_elem(&sluice_switch_stats, &zero);
	if (cfg && s && cfg->upcall_ifindex == ifindex)
		s->v[S_UPCALL_EGRESS_REFUSED]++;
	return TC_ACT_SHOT;
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";

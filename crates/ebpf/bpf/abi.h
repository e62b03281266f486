/* The maps sluice's kernel datapath shares with its daemon: layouts both sides agree on.
 * crates/ebpf/src/abi.rs mirrors every struct and constant here; a test compares the two
 * through the object's BTF. docs/architecture.md, "The kernel datapath", says what each
 * holds. */
#ifndef SLUICE_ABI_H
#define SLUICE_ABI_H

#include <linux/types.h>

#define SLUICE_MAX_PORTS 1024
#define SLUICE_MAX_IPS 8
/* The core's bounds on a GSO frame (MIN_GSO_SIZE, MAX_GSO_SEGMENTS): smaller segments, or
 * more of them, are dropped as gso_limit. */
#define SLUICE_MIN_GSO_SIZE 48
#define SLUICE_MAX_GSO_SEGMENTS 1024
/* skb->mark of the frames the switch itself sends into a guest's veth (the program's
 * clones and redirects to a device's egress, the daemon's packet sockets with SO_MARK)
 * and of those the program hands up through the upcall TAP: the egress program on both
 * passes those, clearing the mark, and refuses every other frame. Setting a mark takes
 * CAP_NET_ADMIN. */
#define SLUICE_MARK 0x51ce0001u

/* port.flags */
#define PF_KERNEL (1u << 0)   /* the kernel reaches the port; else frames to it go up */
#define PF_UPLINK (1u << 1)   /* leads to the LAN: sent with bpf_redirect, not _peer */
#define PF_ISOLATED (1u << 2) /* exchanges frames with uplinks only */
#define PF_MAC (1u << 3)      /* only `mac` may be a source */
#define PF_IPS (1u << 4)      /* source IP addresses are checked */
#define PF_UP_V4 (1u << 5)    /* IPv4 and ARP frames go up (the core learns the address) */
#define PF_UP_V6 (1u << 6)    /* IPv6 frames go up */
#define PF_SLOW (1u << 7)     /* every frame from or to the port goes up */
#define PF_TRUNK (1u << 8)    /* trunk: `allowed` and `native_vid`; else access `access_vid` */
#define PF_OWN_MAC (1u << 9)  /* `own_mac` is set: frames to it pass to the host (Layer 2) */
#define PF_GUEST_MAC (1u << 10) /* Layer 3: `guest_mac` is known */
#define PF_LL_OK (1u << 11)   /* IPv6 link-local sources pass the IP check (Layer 3) */
#define PF_EGRESS (1u << 12)  /* sent with bpf_redirect (egress) though not an uplink: a veth
			       * whose peer is in the switch's own namespace, which
			       * bpf_redirect_peer cannot reach */
#define PF_LEARN_FULL (1u << 13) /* Layer 2: as many stations learned behind it as it may;
				  * frames from others are forwarded or flooded unlearned */
#define PF_TUNNEL (1u << 14)  /* a VXLAN device in external mode: frames to it are sent with
			       * a tunnel key (sluice_tunnels, sluice_remotes), frames from it
			       * arrive with one; floods and mirror copies to it go up */

struct sluice_port {
	__u32 ifindex; /* 0: slot unused */
	__u32 flags;
	__u16 mtu;
	__u16 access_vid;
	__u16 native_vid; /* trunk: VLAN of untagged frames, 0: none */
	__u8 n_ip4;
	__u8 n_ip6;
	__u8 mac[6];
	__u8 pad[2];
	__u8 own_mac[6]; /* an uplink's device: frames to it are the host's, not the switch's */
	__u8 pad2[2];
	__u8 guest_mac[6]; /* Layer 3: the MAC of the guest behind the port */
	__u8 pad3[2];
	__u32 mirror; /* slot + 1 of the port that gets copies of this port's frames; 0: none */
	__u32 pad4;
	__u32 ip4[SLUICE_MAX_IPS];     /* network order */
	__u8 ip6[SLUICE_MAX_IPS][16];
	__u64 allowed[64]; /* trunk: VLANs carried tagged, bit per VLAN id */
};

struct sluice_fib_key {
	__u16 vlan;
	__u8 mac[6];
};

#define FIB_STATIC (1u << 0)

struct sluice_fib_val {
	__u32 slot;
	__u32 flags;
	__u64 seen_ns; /* bpf_ktime_get_ns() of the last frame from this source forwarded here */
};

#define MODE_L2 0
#define MODE_L3 1

struct sluice_config {
	__u32 upcall_ifindex; /* the upcall TAP; 0: none (frames that would go up are dropped) */
	__u32 l3_uplink;      /* Layer 3: slot + 1 of the uplink off-switch traffic leaves by; 0: none */
	__u8 mode;            /* MODE_L2 or MODE_L3 */
	__u8 router_mac[6];   /* Layer 3: the switch's MAC on the guests' side */
	__u8 pad;
	__u32 n_slots;        /* port slots in use are below this (a flood looks at those) */
};

/* A tunnel port, by its device's ifindex. */
#define TUN_V6 (1u << 0)       /* an IPv6 underlay */
#define TUN_PER_VLAN (1u << 1) /* a VNI per VLAN: frames cross untagged, their VNI says the VLAN */
#define TUN_REMOTES_ONLY (1u << 2) /* only datagrams from the endpoints in sluice_endpoints */
struct sluice_tunnel {
	__u32 flags;
	__u8 ttl;
	__u8 pad[3];
	__u32 vni;      /* without TUN_PER_VLAN: the VNI of every frame */
	__u32 pad2;
	__u8 local[16]; /* the underlay address frames leave from; IPv4 in the first 4 bytes */
};

/* A TUN_PER_VLAN tunnel's VNI of a VLAN (`id` the VLAN id, value the VNI), and the VLAN
 * of a VNI (`id` VNI_IN | the VNI, value TUN_TAG | the VLAN id). */
struct sluice_vni_key {
	__u32 ifindex;
	__u32 id;
};
#define VNI_IN (1u << 31)
#define TUN_TAG (1u << 16)

/* An endpoint a tunnel accepts datagrams from (with TUN_REMOTES_ONLY): its configured
 * remotes. The value is unused (1). */
struct sluice_endpoint_key {
	__u32 ifindex;
	__u8 addr[16]; /* IPv4 in the first 4 bytes */
};

/* A station behind a tunnel: learned from the outer source of the datagrams it sends. */
struct sluice_remote_key {
	__u32 ifindex;
	__u32 vni;
	__u8 mac[6];
	__u8 pad[2];
};

struct sluice_remote {
	__u8 addr[16]; /* the remote endpoint; IPv4 in the first 4 bytes */
	__u64 seen_ns;
};

/* Layer 3: which port owns an address. */
struct sluice_ip_key {
	__u8 family; /* 4 or 6 */
	__u8 pad[3];
	__u8 addr[16]; /* IPv4 in the first 4 bytes */
};

/* Layer 3: a LAN neighbour's MAC, by VLAN and address. */
struct sluice_neigh_key {
	__u16 vlan;
	__u8 family;
	__u8 pad;
	__u8 addr[16];
};

struct sluice_neigh_val {
	__u8 mac[6];
	__u8 pad[2];
};

/* Counters per port slot (per CPU), indexes into sluice_counters.v. Drop causes are the
 * core's, in `DropCause::ALL` order, from C_RX_DROP and C_TX_DROP. */
#define C_RX_FRAMES 0
#define C_RX_BYTES 1
#define C_RX_GSO 2
#define C_FORWARDED 3
#define C_COPIES 4
#define C_UPCALLS 5
#define C_TX_OFFERED 6
#define C_TX_FRAMES 7
#define C_TX_BYTES 8
#define C_TX_GSO 9
#define C_RX_DROP 10
#define C_TX_DROP 28
#define C_FLOODED 46        /* frames flooded by the kernel */
#define C_LEARN_REFUSED 47  /* frames from sources the port may not learn, decided by the kernel */
#define C_TUN_BAD 48        /* datagrams from a tunnel refused: no key, a VNI the port does not carry */
#define C_COUNT 49

#define D_MALFORMED 1
#define D_VLAN_FILTER 2
#define D_OVER_MTU 3
#define D_UNKNOWN_PORT 4
#define D_SAME_PORT 5
#define D_TX_ERROR 6
#define D_ISOLATED 7
#define D_SPOOFED_MAC 8
#define D_SPOOFED_IP 9
#define D_NOT_IP 10
#define D_NO_ROUTE 11
#define D_UPCALL_LOST 13
#define D_GSO_LIMIT 14
#define D_UNKNOWN_ENDPOINT 16
#define D_EGRESS_REFUSED 17

struct sluice_counters {
	__u64 v[C_COUNT];
};

/* The switch's own counters (one entry, per CPU), indexes into sluice_switch_counters.v. */
#define S_UPCALL_EGRESS_REFUSED 0 /* frames others sent out of the upcall TAP, dropped */
#define S_COUNT 1

struct sluice_switch_counters {
	__u64 v[S_COUNT];
};

#endif

/* Prints the layouts of abi.h's structs as Rust constants; build.rs compiles it for the
 * host and runs it, and the crate's tests compare them with its #[repr(C)] mirrors. */
#include <stddef.h>
#include <stdio.h>

#include "abi.h"

#define SIZE(t) printf("pub const SIZE_%s: usize = %zu;\n", #t, sizeof(struct t))
#define OFF(t, f) printf("pub const OFF_%s_%s: usize = %zu;\n", #t, #f, offsetof(struct t, f))

int main(void)
{
	SIZE(sluice_port);
	OFF(sluice_port, ifindex);
	OFF(sluice_port, flags);
	OFF(sluice_port, mtu);
	OFF(sluice_port, access_vid);
	OFF(sluice_port, native_vid);
	OFF(sluice_port, n_ip4);
	OFF(sluice_port, n_ip6);
	OFF(sluice_port, mac);
	OFF(sluice_port, own_mac);
	OFF(sluice_port, guest_mac);
	OFF(sluice_port, mirror);
	OFF(sluice_port, ip4);
	OFF(sluice_port, ip6);
	OFF(sluice_port, allowed);
	SIZE(sluice_fib_key);
	OFF(sluice_fib_key, mac);
	SIZE(sluice_fib_val);
	OFF(sluice_fib_val, flags);
	OFF(sluice_fib_val, seen_ns);
	SIZE(sluice_config);
	OFF(sluice_config, l3_uplink);
	OFF(sluice_config, mode);
	OFF(sluice_config, router_mac);
	OFF(sluice_config, n_slots);
	SIZE(sluice_ip_key);
	OFF(sluice_ip_key, addr);
	SIZE(sluice_neigh_key);
	OFF(sluice_neigh_key, family);
	OFF(sluice_neigh_key, addr);
	SIZE(sluice_neigh_val);
	SIZE(sluice_counters);
	SIZE(sluice_switch_counters);
	SIZE(sluice_tunnel);
	OFF(sluice_tunnel, ttl);
	OFF(sluice_tunnel, vni);
	OFF(sluice_tunnel, local);
	SIZE(sluice_vni_key);
	SIZE(sluice_endpoint_key);
	OFF(sluice_endpoint_key, addr);
	SIZE(sluice_remote_key);
	OFF(sluice_remote_key, mac);
	SIZE(sluice_remote);
	OFF(sluice_remote, seen_ns);
	printf("pub const C_TUN_BAD: usize = %d;\n", C_TUN_BAD);
	printf("pub const PF_TUNNEL: u32 = %u;\n", PF_TUNNEL);
	printf("pub const TUN_V6: u32 = %u;\n", TUN_V6);
	printf("pub const TUN_TAG: u32 = %u;\n", TUN_TAG);
	printf("pub const TUN_PER_VLAN: u32 = %u;\n", TUN_PER_VLAN);
	printf("pub const VNI_IN: u32 = %u;\n", VNI_IN);
	printf("pub const TUN_REMOTES_ONLY: u32 = %u;\n", TUN_REMOTES_ONLY);
	printf("pub const SLUICE_MARK: u32 = %u;\n", SLUICE_MARK);
	printf("pub const C_COUNT: usize = %d;\n", C_COUNT);
	printf("pub const C_RX_DROP: usize = %d;\n", C_RX_DROP);
	printf("pub const C_TX_DROP: usize = %d;\n", C_TX_DROP);
	printf("pub const C_UPCALLS: usize = %d;\n", C_UPCALLS);
	printf("pub const C_TX_GSO: usize = %d;\n", C_TX_GSO);
	printf("pub const C_FLOODED: usize = %d;\n", C_FLOODED);
	printf("pub const C_LEARN_REFUSED: usize = %d;\n", C_LEARN_REFUSED);
	printf("pub const PF_TRUNK: u32 = %u;\n", PF_TRUNK);
	printf("pub const PF_SLOW: u32 = %u;\n", PF_SLOW);
	printf("pub const PF_EGRESS: u32 = %u;\n", PF_EGRESS);
	printf("pub const PF_LEARN_FULL: u32 = %u;\n", PF_LEARN_FULL);
	printf("pub const D_MALFORMED: usize = %d;\n", D_MALFORMED);
	printf("pub const D_VLAN_FILTER: usize = %d;\n", D_VLAN_FILTER);
	printf("pub const D_OVER_MTU: usize = %d;\n", D_OVER_MTU);
	printf("pub const D_UNKNOWN_PORT: usize = %d;\n", D_UNKNOWN_PORT);
	printf("pub const D_SAME_PORT: usize = %d;\n", D_SAME_PORT);
	printf("pub const D_TX_ERROR: usize = %d;\n", D_TX_ERROR);
	printf("pub const D_ISOLATED: usize = %d;\n", D_ISOLATED);
	printf("pub const D_SPOOFED_MAC: usize = %d;\n", D_SPOOFED_MAC);
	printf("pub const D_SPOOFED_IP: usize = %d;\n", D_SPOOFED_IP);
	printf("pub const D_NOT_IP: usize = %d;\n", D_NOT_IP);
	printf("pub const D_NO_ROUTE: usize = %d;\n", D_NO_ROUTE);
	printf("pub const D_UPCALL_LOST: usize = %d;\n", D_UPCALL_LOST);
	printf("pub const D_GSO_LIMIT: usize = %d;\n", D_GSO_LIMIT);
	printf("pub const D_UNKNOWN_ENDPOINT: usize = %d;\n", D_UNKNOWN_ENDPOINT);
	printf("pub const D_EGRESS_REFUSED: usize = %d;\n", D_EGRESS_REFUSED);
	printf("pub const MIN_GSO_SIZE: u16 = %d;\n", SLUICE_MIN_GSO_SIZE);
	printf("pub const MAX_GSO_SEGMENTS: usize = %d;\n", SLUICE_MAX_GSO_SEGMENTS);
	printf("pub const MAX_PORTS: u32 = %d;\n", SLUICE_MAX_PORTS);
	printf("pub const MAX_IPS: usize = %d;\n", SLUICE_MAX_IPS);
	printf("pub const S_UPCALL_EGRESS_REFUSED: usize = %d;\n", S_UPCALL_EGRESS_REFUSED);
	printf("pub const S_COUNT: usize = %d;\n", S_COUNT);
	return 0;
}

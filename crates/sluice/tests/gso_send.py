#!/usr/bin/env python3
"""gso_send.py IFACE DST_MAC SRC_IP DST_IP GSO_SIZE COUNT [RATE]

Sends COUNT IPv4/TCP frames of 1,400 payload bytes out of IFACE through a packet socket
with a virtio-net header asking for TCP segmentation into GSO_SIZE-byte segments (as a
guest with raw-socket rights can), RATE a second if given (else as fast as it can).
Prints "sent N"."""
import socket
import struct
import sys
import time

iface, dst_mac, src_ip, dst_ip = sys.argv[1:5]
gso_size, count = int(sys.argv[5]), int(sys.argv[6])
rate = float(sys.argv[7]) if len(sys.argv) > 7 else 0
PACKET_VNET_HDR = 15
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
s.setsockopt(263, PACKET_VNET_HDR, 1)  # SOL_PACKET
s.bind((iface, 0))
src_mac = open(f"/sys/class/net/{iface}/address").read().strip()
mac = lambda m: bytes(int(x, 16) for x in m.split(":"))
payload = bytes(1400)
tcp_len = 20 + len(payload)
ip_len = 20 + tcp_len
ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, ip_len, 1, 0x4000, 64, 6, 0, socket.inet_aton(src_ip), socket.inet_aton(dst_ip))
# The pseudo-header sum goes in the TCP checksum field (CHECKSUM_PARTIAL).
ph = socket.inet_aton(src_ip) + socket.inet_aton(dst_ip) + struct.pack("!BBH", 0, 6, tcp_len)
total = sum(struct.unpack("!6H", ph))
while total > 0xFFFF:
    total = (total & 0xFFFF) + (total >> 16)
tcp = struct.pack("!HHIIBBHHH", 40000, 9, 1, 0, 5 << 4, 0x18, 65535, total, 0)
frame = mac(dst_mac) + mac(src_mac) + b"\x08\x00" + ip + tcp + payload
# virtio_net_hdr: flags NEEDS_CSUM, gso_type TCPV4, hdr_len, gso_size, csum_start, csum_offset
vnet = struct.pack("<BBHHHH", 1, 1, 54, gso_size, 34, 16)
start = time.monotonic()
n = 0
for _ in range(count):
    s.send(vnet + frame)
    n += 1
    # Paced in batches of 100: sleep until the batch is due.
    if rate and n % 100 == 0:
        ahead = start + n / rate - time.monotonic()
        if ahead > 0:
            time.sleep(ahead)
print("sent", n)

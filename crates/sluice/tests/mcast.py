#!/usr/bin/env python3
"""Multicast helper for the snooping tests (run inside a guest's namespace).

  mcast.py listen IFACE [JOIN_GROUP PORT]
      Counts the UDP datagrams to each IP group that arrive at IFACE (a packet socket:
      what the switch delivered, member or not). With JOIN_GROUP, the kernel joins that
      group on IFACE first (IP_ADD_MEMBERSHIP / IPV6_JOIN_GROUP: its own IGMP/MLD
      reports) and answers queries while it listens. Prints "ready" on stderr once bound;
      stops when stdin closes (the membership ends with the socket: the kernel's leave),
      then prints one JSON object {group: count} on stdout.
  mcast.py send IFACE GROUP PORT N
      Sends N datagrams to GROUP:PORT out of IFACE, 10 ms apart, hop limit 1.
  mcast.py report IFACE GROUP
      Sends one IGMPv2 membership report for GROUP from a raw socket, without joining:
      a membership nobody refreshes (it never answers a query).
  mcast.py stream IFACE GROUP PORT MBITS SECONDS
      Sends 1,400-byte datagrams to GROUP:PORT out of IFACE at MBITS Mbit/s of UDP
      payload (as iperf counts), paced every millisecond, for SECONDS (at most 60); prints
      {"sent": datagrams, "ms": how long it took} on stdout.
  mcast.py join IFACE GROUP PORT
      Joins GROUP on IFACE (the kernel's membership, as listen does) without reading;
      stops when stdin closes and prints {"_rx": frames, "_rx_bytes": bytes} IFACE
      received meanwhile (its counters in /sys/class/net).

listen's JSON also holds "_rx" (IFACE's received frames meanwhile, from its counters),
"_control" (IGMP and ICMPv6 frames: queries, reports, neighbour discovery) and "_other"
(every other frame that is not a UDP datagram to a group).
"""

import ipaddress
import json
import select
import socket
import struct
import sys
import time


def checksum(b):
    if len(b) % 2:
        b += b"\0"
    s = sum(struct.unpack("!%dH" % (len(b) // 2), b))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


def ifindex(iface):
    return socket.if_nametoindex(iface)


def rx(iface):
    with open(f"/sys/class/net/{iface}/statistics/rx_packets") as f:
        frames = int(f.read())
    with open(f"/sys/class/net/{iface}/statistics/rx_bytes") as f:
        return frames, int(f.read())


def join_group(iface, join, port):
    g = ipaddress.ip_address(join)
    if g.version == 4:
        member = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        member.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        member.bind(("", int(port)))
        # struct ip_mreqn: the group, no local address, the interface by index.
        mreq = struct.pack("4s4si", g.packed, b"\0\0\0\0", ifindex(iface))
        member.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, mreq)
    else:
        member = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
        member.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        member.bind(("", int(port)))
        mreq = struct.pack("16sI", g.packed, ifindex(iface))
        member.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_JOIN_GROUP, mreq)
    return member


def listen(iface, join=None, port=None):
    p = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))
    p.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 22)
    p.bind((iface, 0))
    member = join_group(iface, join, port) if join else None
    counts = {"_control": 0, "_other": 0}
    rx0 = rx(iface)
    sys.stderr.write("ready\n")
    sys.stderr.flush()
    deadline = time.time() + 120
    while time.time() < deadline:
        r, _, _ = select.select([p, sys.stdin] + ([member] if member else []), [], [], 0.5)
        if sys.stdin in r and not sys.stdin.buffer.read1(4096):
            break
        if member in r:
            member.recv(65536)
        if p not in r:
            continue
        f, addr = p.recvfrom(65536)
        if addr[2] == socket.PACKET_OUTGOING:
            continue
        et = struct.unpack("!H", f[12:14])[0]
        off = 14
        if et == 0x8100:
            et = struct.unpack("!H", f[16:18])[0]
            off = 18
        dst = None
        if et == 0x0800 and len(f) >= off + 20 and f[off + 9] == 17:
            dst = ipaddress.ip_address(f[off + 16 : off + 20])
        elif et == 0x86DD and len(f) >= off + 40 and f[off + 6] == 17:
            dst = ipaddress.ip_address(f[off + 24 : off + 40])
        if dst is not None and dst.is_multicast:
            counts[str(dst)] = counts.get(str(dst), 0) + 1
        elif (et == 0x0800 and len(f) > off + 9 and f[off + 9] == 2) or (
            et == 0x86DD and len(f) > off + 6 and f[off + 6] in (0, 58)
        ):
            counts["_control"] += 1
        else:
            counts["_other"] += 1
    counts["_rx"] = rx(iface)[0] - rx0[0]
    if member:
        member.close()
    print(json.dumps(counts))


def join(iface, group, port):
    member = join_group(iface, group, port)
    rx0 = rx(iface)
    sys.stderr.write("ready\n")
    sys.stderr.flush()
    deadline = time.time() + 120
    while time.time() < deadline:
        r, _, _ = select.select([sys.stdin], [], [], 0.5)
        if sys.stdin in r and not sys.stdin.buffer.read1(4096):
            break
    rx1 = rx(iface)
    member.close()
    print(json.dumps({"_rx": rx1[0] - rx0[0], "_rx_bytes": rx1[1] - rx0[1]}))


def stream(iface, group, port, mbits, seconds):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, 1)
    mreqn = struct.pack("4s4si", b"\0\0\0\0", b"\0\0\0\0", ifindex(iface))
    s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, mreqn)
    s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP, 0)
    payload = b"s" * 1400
    per_s = float(mbits) * 1e6 / 8 / len(payload)
    seconds = min(float(seconds), 60.0)
    sent = 0
    t0 = time.monotonic()
    while True:
        t = time.monotonic() - t0
        if t >= seconds:
            break
        while sent < per_s * t:
            try:
                s.sendto(payload, (group, int(port)))
            except BlockingIOError:
                break
            sent += 1
        time.sleep(0.001)
    ms = int((time.monotonic() - t0) * 1000)
    print(json.dumps({"sent": sent, "ms": ms}))


def wait_ipv6_source(iface, seconds=10.0):
    """Waits until `iface` has an IPv6 address past duplicate address detection: until
    then the kernel has no source address for a multicast datagram (EADDRNOTAVAIL)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with open("/proc/net/if_inet6") as f:
            for line in f:
                fields = line.split()
                # address, ifindex, prefix length, scope, flags, name; 0x40: tentative,
                # 0x08: DAD failed.
                if fields[5] == iface and int(fields[4], 16) & 0x48 == 0:
                    return
        time.sleep(0.05)
    raise SystemExit(f"{iface} had no IPv6 address past duplicate address detection within {seconds} s")


def send(iface, group, port, n):
    g = ipaddress.ip_address(group)
    if g.version == 6:
        wait_ipv6_source(iface)
    if g.version == 4:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, 1)
        mreqn = struct.pack("4s4si", b"\0\0\0\0", b"\0\0\0\0", ifindex(iface))
        s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, mreqn)
        s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP, 0)
        dst = (group, int(port))
    else:
        s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_MULTICAST_HOPS, 1)
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_MULTICAST_IF, ifindex(iface))
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_MULTICAST_LOOP, 0)
        dst = (group, int(port), 0, ifindex(iface))
    for i in range(int(n)):
        s.sendto(b"sluice-mcast %d" % i, dst)
        time.sleep(0.01)


def report(iface, group):
    s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_IGMP)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, iface.encode())
    s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, 1)
    g = ipaddress.ip_address(group).packed
    m = struct.pack("!BBH4s", 0x16, 0, 0, g)
    m = struct.pack("!BBH4s", 0x16, 0, checksum(m), g)
    s.sendto(m, (group, 0))


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "listen":
        listen(*sys.argv[2:])
    elif cmd == "send":
        send(*sys.argv[2:])
    elif cmd == "report":
        report(*sys.argv[2:])
    elif cmd == "stream":
        stream(*sys.argv[2:])
    elif cmd == "join":
        join(*sys.argv[2:])
    else:
        sys.exit("usage: see the module docstring")

#!/usr/bin/env python3
"""Send and receive raw Ethernet frames on an interface, for sluice's integration tests.

  rawframe.py send IFACE FRAME_HEX [FRAME_HEX...]
  rawframe.py recv IFACE ETHERTYPE SECONDS   -> one line per frame: "<vlan tci or -> <frame hex>"

The kernel strips a received frame's outer 802.1Q tag into metadata; recv reports it from
PACKET_AUXDATA so tests can see which VLAN a frame arrived with. recv prints "ready" on
stderr once the socket is bound, then listens until its standard input says the test has
sent (a line, or its end) and SECONDS more — so a slow start of the sender, on a busy
machine, never eats the window — and at most two minutes in all.
"""
import select
import socket
import struct
import sys
import time

SOL_PACKET = 263
PACKET_AUXDATA = 8
TP_STATUS_VLAN_VALID = 0x10


def send(iface, frames):
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
    s.bind((iface, 0))
    for f in frames:
        s.send(bytes.fromhex(f))


def recv(iface, ethertype, seconds):
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))
    s.setsockopt(SOL_PACKET, PACKET_AUXDATA, 1)
    s.bind((iface, 0))
    print("ready", file=sys.stderr, flush=True)
    end = time.time() + 120
    waiting = [s, sys.stdin]
    while True:
        left = end - time.time()
        if left <= 0:
            break
        r, _, _ = select.select(waiting, [], [], left)
        if not r:
            break
        if sys.stdin in r:
            sys.stdin.readline()
            waiting = [s]
            end = min(end, time.time() + seconds)
            continue
        data, anc, _, addr = s.recvmsg(65536, socket.CMSG_SPACE(32))
        if addr[2] == socket.PACKET_OUTGOING:
            continue
        tci = "-"
        for level, typ, cdata in anc:
            if level == SOL_PACKET and typ == PACKET_AUXDATA and len(cdata) >= 20:
                status, _, _, _, _, vlan_tci, _ = struct.unpack("IIIHHHH", cdata[:20])
                if status & TP_STATUS_VLAN_VALID:
                    tci = str(vlan_tci & 0x0FFF)
        etype = struct.unpack("!H", data[12:14])[0]
        if ethertype == 0 or etype == ethertype:
            print(tci, data.hex(), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "send":
        send(sys.argv[2], sys.argv[3:])
    else:
        recv(sys.argv[2], int(sys.argv[3], 0), float(sys.argv[4]))

#!/usr/bin/env python3
"""A VXLAN endpoint made of one UDP socket, for sluice's tunnel tests: a host on the
underlay that may or may not be among a switch's remotes.

  vxlan_endpoint.py LOCAL SECONDS [--port P] [--every S] [--send TARGET VNI FRAME_HEX]...
                    [--marker TEXT]... [--stop-on-eof]

Binds LOCAL:P (default 4789), prints "ready" on stderr, then for SECONDS (or, with
--stop-on-eof, until its standard input closes, if sooner) sends each --send frame (the
inner Ethernet frame, in hex) to TARGET:P in VNI VNI every S seconds (default 0.1) and
counts the datagrams that arrive (and those arriving after, until none has for 300 ms).
At the end prints one JSON line:
{"sent": N, "received": N, "markers": {TEXT: datagrams whose inner frame contains TEXT}}.
"""
import json
import select
import socket
import struct
import sys
import time


def main(argv):
    local, seconds = argv[0], float(argv[1])
    port, every, sends, markers, stop_on_eof = 4789, 0.1, [], [], False
    i = 2
    while i < len(argv):
        if argv[i] == "--port":
            port = int(argv[i + 1])
            i += 2
        elif argv[i] == "--every":
            every = float(argv[i + 1])
            i += 2
        elif argv[i] == "--send":
            target, vni, frame = argv[i + 1], int(argv[i + 2]), bytes.fromhex(argv[i + 3])
            # RFC 7348: flags with the I bit, 3 reserved bytes, the VNI, a reserved byte.
            sends.append((target, struct.pack("!B3xI", 0x08, vni << 8) + frame))
            i += 4
        elif argv[i] == "--marker":
            markers.append(argv[i + 1])
            i += 2
        elif argv[i] == "--stop-on-eof":
            stop_on_eof = True
            i += 1
        else:
            sys.exit(f"unknown argument {argv[i]!r}")
    family = socket.AF_INET6 if ":" in local else socket.AF_INET
    s = socket.socket(family, socket.SOCK_DGRAM)
    s.bind((local, port))
    print("ready", file=sys.stderr, flush=True)
    counts = {m: 0 for m in markers}
    sent = received = 0

    def take(data):
        nonlocal received
        received += 1
        inner = data[8:]
        for m in markers:
            if m.encode() in inner:
                counts[m] += 1

    end = time.monotonic() + seconds
    due = time.monotonic()
    while True:
        now = time.monotonic()
        if now >= end:
            break
        if sends and now >= due:
            for target, datagram in sends:
                s.sendto(datagram, (target, port))
                sent += 1
            due = now + every
        wait = min(end, due if sends else end) - now
        watched = [s, sys.stdin] if stop_on_eof else [s]
        r, _, _ = select.select(watched, [], [], max(wait, 0))
        if s in r:
            take(s.recv(65535))
        if sys.stdin in r and not sys.stdin.buffer.read1(4096):
            break
    # What is still arriving counts too: until the socket is quiet for 300 ms.
    while select.select([s], [], [], 0.3)[0]:
        take(s.recv(65535))
    print(json.dumps({"sent": sent, "received": received, "markers": counts}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])

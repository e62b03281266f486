#!/usr/bin/env python3
"""paced_send.py HOST PORT FILE BYTES_PER_SECOND

Sends FILE over one TCP connection at a fixed rate (so that a transfer lasts long enough
for something to happen during it), half-closes, and waits for the receiver to close.
Prints "sent N"; any error (a reset) ends it with a traceback and exit status 1."""
import socket
import sys
import time

host, port, path, rate = sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
s = socket.create_connection((host, port), timeout=30)
start, n = time.time(), 0
with open(path, "rb") as f:
    while True:
        b = f.read(65536)
        if not b:
            break
        s.sendall(b)
        n += len(b)
        ahead = n / rate - (time.time() - start)
        if ahead > 0:
            time.sleep(ahead)
s.shutdown(socket.SHUT_WR)
s.recv(1)
print("sent", n)

#!/usr/bin/env python3
"""hostile.py: what a hostile guest sends, for sluice's torture tests (tests/hostile.rs).

  hostile.py torture IFACE COUNT SEED [MAC,MAC...]
      COUNT random and mutated frames, each with a virtio-net header, through a packet
      socket on IFACE: runts, IPv4 with lying lengths, QinQ stacks, frames over the MTU,
      multicast source MACs, random EtherTypes, garbled virtio headers, random bytes. The
      MACs given (other guests') are among the destinations. Deterministic for a SEED.
  hostile.py macflood IFACE COUNT [RATE]
      COUNT frames, each from a new unicast source MAC, to unknown destinations.

RATE paces the flood at that many frames a second (default: as fast as it can), so that a
measurement shows what the switch does with the frames, not what the sender's CPU costs.

Frames go straight to the device (PACKET_QDISC_BYPASS): no queueing discipline drops any
of them unseen. A frame the kernel refuses is counted under its errno: EINVAL, EMSGSIZE
and the like before it enters the interface; ENOBUFS when the device took it and dropped
it (a TAP or veth says so and counts it in its own drops). Bounded: gives up (exit 1)
after 600 s. Prints one JSON line: {"sent": N, "refused": {errno: n}, "kinds": {kind: n}}.
"""
import errno
import json
import random
import socket
import struct
import sys
import time

SOL_PACKET = 263
PACKET_VNET_HDR = 15
PACKET_QDISC_BYPASS = 20
DEADLINE = time.monotonic() + 600


def vnet(flags=0, gso_type=0, hdr_len=0, gso_size=0, csum_start=0, csum_offset=0):
    return struct.pack("<BBHHHH", flags, gso_type, hdr_len, gso_size, csum_start, csum_offset)


def ipv4(rng, payload_len, total=None, ihl=5, proto=None):
    proto = rng.choice([6, 17, 1, 47, 255]) if proto is None else proto
    total = 20 + payload_len if total is None else total
    src = bytes([10, 77, 0, rng.randrange(256)])
    dst = bytes([10, 77, 0, rng.randrange(256)])
    return struct.pack("!BBHHHBBH4s4s", 0x40 | ihl, 0, total & 0xFFFF, 1, 0, 64, proto, 0, src, dst)


class Gen:
    def __init__(self, seed, macs):
        self.rng = random.Random(seed)
        self.macs = macs

    def unicast(self):
        return bytes([0x02] + [self.rng.randrange(256) for _ in range(5)])

    def dst(self):
        r = self.rng.random()
        if r < 0.3 and self.macs:
            return self.rng.choice(self.macs)
        if r < 0.5:
            return b"\xff" * 6
        if r < 0.6:
            return bytes([0x01, 0x00, 0x5E, 0, 0, self.rng.randrange(256)])
        return self.unicast()

    def src(self):
        return self.unicast()

    def rand(self, n):
        return self.rng.randbytes(n)

    def runt(self):
        return vnet() + self.rand(self.rng.randrange(0, 60))

    def bad_length(self):
        body = self.rand(self.rng.randrange(0, 200))
        total = self.rng.choice([0, 1, 19, 20 + len(body) + 1, 65535, self.rng.randrange(65536)])
        ip = ipv4(self.rng, len(body), total=total, ihl=self.rng.choice([0, 4, 5, 6, 15]))
        return vnet() + self.dst() + self.src() + b"\x08\x00" + ip + body

    def qinq(self):
        tags = b"".join(
            struct.pack("!HH", self.rng.choice([0x8100, 0x88A8, 0x9100]), self.rng.randrange(65536))
            for _ in range(self.rng.randrange(1, 13))
        )
        inner = self.rng.choice([b"\x08\x00", b"\x86\xdd", b"\x08\x06", self.rand(2)])
        return vnet() + self.dst() + self.src() + tags + inner + self.rand(self.rng.randrange(0, 120))

    def over_mtu(self):
        n = self.rng.randrange(1515, 9001)
        return vnet() + self.dst() + self.src() + b"\x08\x00" + ipv4(self.rng, n - 34) + bytes(n - 34)

    def multicast_source(self):
        src = bytes([self.rng.randrange(256) | 1]) + self.rand(5)
        return vnet() + self.dst() + src + self.rand(2) + self.rand(self.rng.randrange(46, 300))

    def random_ethertype(self):
        et = self.rng.choice([self.rng.randrange(0x600), self.rng.randrange(65536), 0x0806, 0x86DD, 0x88CC])
        return vnet() + self.dst() + self.src() + struct.pack("!H", et) + self.rand(self.rng.randrange(46, 600))

    def bad_vnet(self):
        # A TCP/IPv4 frame whose virtio header asks for segmentation or a checksum in ways
        # that do not fit it; the kernel refuses some, the switch sees the rest.
        body = self.rand(self.rng.randrange(20, 1400))
        ip = ipv4(self.rng, len(body), proto=6)
        frame = self.dst() + self.src() + b"\x08\x00" + ip + body
        h = vnet(
            flags=self.rng.choice([0, 1, 2, 3, self.rng.randrange(256)]),
            gso_type=self.rng.choice([0, 1, 3, 4, 5, 0x80, 0x81, self.rng.randrange(256)]),
            hdr_len=self.rng.choice([0, 14, 54, self.rng.randrange(65536)]),
            gso_size=self.rng.choice([0, 1, 47, 48, 536, 1448, 65535, self.rng.randrange(65536)]),
            csum_start=self.rng.choice([0, 34, len(frame), self.rng.randrange(65536)]),
            csum_offset=self.rng.choice([6, 16, self.rng.randrange(65536)]),
        )
        return h + frame

    def random_bytes(self):
        return vnet() + self.rand(self.rng.randrange(14, 1514))

    KINDS = ["runt", "bad_length", "qinq", "over_mtu", "multicast_source", "random_ethertype", "bad_vnet", "random_bytes"]

    def make(self, kind):
        return getattr(self, kind)()


class Pace:
    """Sleeps so that frames go out at `rate` a second (no limit when 0)."""

    def __init__(self, rate):
        self.rate, self.start, self.n = rate, time.monotonic(), 0

    def wait(self, n):
        self.n += n
        if self.rate:
            ahead = self.start + self.n / self.rate - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)


def send_all(s, frames, stats):
    """Sends each (kind, bytes) once."""
    if time.monotonic() > DEADLINE:
        print(json.dumps(stats))
        sys.exit("hostile.py: gave up after 600 s")
    for kind, f in frames:
        stats["kinds"][kind] = stats["kinds"].get(kind, 0) + 1
        try:
            s.send(f)
            stats["sent"] += 1
        except OSError as e:
            name = errno.errorcode.get(e.errno, str(e.errno))
            stats["refused"][name] = stats["refused"].get(name, 0) + 1


def main():
    mode, iface, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
    s.setsockopt(SOL_PACKET, PACKET_VNET_HDR, 1)
    s.setsockopt(SOL_PACKET, PACKET_QDISC_BYPASS, 1)
    s.bind((iface, 0))
    stats = {"sent": 0, "refused": {}, "kinds": {}}
    if mode == "torture":
        seed = int(sys.argv[4])
        macs = [bytes(int(x, 16) for x in m.split(":")) for m in sys.argv[5].split(",")] if len(sys.argv) > 5 else []
        g = Gen(seed, macs)
        # A pool of base frames, each sent many times with a few bytes mutated.
        pool = [(k, g.make(k)) for k in Gen.KINDS for _ in range(512)]
        rng = g.rng
        batch = []
        for i in range(count):
            kind, base = pool[rng.randrange(len(pool))]
            f = bytearray(base)
            if len(f) > 12 and rng.random() < 0.5:
                for _ in range(rng.randrange(1, 4)):
                    f[rng.randrange(len(f))] = rng.randrange(256)
            batch.append((kind, bytes(f)))
            if len(batch) == 1024:
                send_all(s, batch, stats)
                batch = []
        send_all(s, batch, stats)
    elif mode == "macflood":
        pace = Pace(float(sys.argv[4]) if len(sys.argv) > 4 else 0)
        frames = []
        for i in range(count):
            src = struct.pack("!BBI", 0x02, 0x66, i)
            dst = struct.pack("!BBI", 0x02, 0x67, i)
            frames.append(("macflood", vnet() + dst + src + b"\x88\xb5" + bytes(46)))
            if len(frames) == 100:
                send_all(s, frames, stats)
                pace.wait(len(frames))
                frames = []
        send_all(s, frames, stats)
    else:
        sys.exit(f"hostile.py: unknown mode {mode}")
    print(json.dumps(stats))


main()

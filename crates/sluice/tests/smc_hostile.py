#!/usr/bin/env python3
"""A hostile local program against sluice's shared-memory fast path (issue 14's tests,
redone for the handshake of issue 16: docs/architecture.md, "Connections at TCP's cost").

It speaks the side door's messages by hand and lays out arenas itself, and tries what a
hostile local user would:

  smc_hostile.py propose RUNDIR PORT CADDR CPORT SADDR HOW
      Claim someone else's connection CADDR:CPORT -> SADDR:PORT at the sluice listener
      on PORT, without holding it:
        cookie:N  announce it under its client socket's own cookie N (anyone in the
                  namespace can read it, with ss), as the library announces its own
                  socket when the server can see it
        same      from a namespace of its own: announce a socket of the very same four
                  addresses made here, and send that socket as the proof
      Prints "sent" once the messages are out, then "refused ERRNO" (the door would not
      open), "declined REASON", "committed" (the server took it), or "undecided" (nothing
      within 5 s).
  smc_hostile.py client RUNDIR ADDR PORT ATTACK
      Be a real client of the sluice listener on ADDR:PORT (same namespace) that cheats:
        unsealed  an arena in a memfd without seals (it could shrink it later)
        sealed    an honest connection; then try to shrink the arena (must be refused)
        bad-prod  an honest connection; then write an out-of-range producer cursor into
                  the ring the server reads
        bad-cons  an honest connection; then write an out-of-range consumer cursor into
                  the ring the server writes into
        late-bell:N
                  an honest connection, written as a writer that is descheduled between
                  publishing and ringing: N messages (a 4-byte length, then the body),
                  each written whole while the server sleeps in a read of the length
                  (more than it reads, so a doorbell epoch, and its futex woken), its
                  doorbell byte sent 5 ms later; prints "<bytes> <sha256>" of the
                  bodies, or "server gone after N messages"
        slow-publish:N
                  an honest connection, written as a writer that is descheduled between
                  its two steps: N messages of 3,000 bytes, each counted whole, its first
                  half published and rung, the rest published 5 ms later (each after the
                  server has read the one before); prints "<bytes> <sha256>" of them all,
                  or "server gone after N messages"
      Prints what happened, one line per step.
  smc_hostile.py decoy RUNDIR ADDR PORT SECONDS
      Register as a sluice listener for ADDR:PORT (run it in another namespace), with a
      side door that takes associations; prints "listening", then "message" for each
      message that reaches the door, and exits after SECONDS.
  smc_hostile.py server RUNDIR ADDR PORT ATTACK SECONDS
      Be a sluice listener on ADDR:PORT (a real TCP listener, registered, with a side
      door) that cheats its clients; every TCP connection is read to EOF and reported as
      "tcp <bytes> <sha256>". Prints "listening" first. ATTACK:
        full-door     the door never accepts, and its backlog is full (connecting to it
                      would wait forever)
        stall         take every announcement, and never decide
        close-bell    take every announcement and close the client's socket pair end at
                      once, without deciding
        garbage-word  take every announcement and write garbage into the slot's word
      Exits after SECONDS.
  smc_hostile.py liar RUNDIR ADDR PORT COUNT BYTES
      COUNT times, one after another: announce our own next connection to ADDR:PORT as a
      client in another namespace would (a proof to follow), connect with plain TCP, send
      BYTES bytes and wait for the server to end the connection, never sending the proof.
      Prints "<bytes> <sha256>" of each connection.
  smc_hostile.py flood RUNDIR PORT COUNT SECONDS
      Announce COUNT connections that never come to the sluice listener on PORT, as
      fast as the door takes them — three descriptors each for the server to hold —
      and print "flooded"; keep the association open for SECONDS.
  smc_hostile.py probe RUNDIR [PID…]
      As an unprivileged user: try to open every door (those listed, and those of the
      PIDs given), to add an entry to every shared directory, and to write or truncate
      every statistics file. Prints "WHAT refused ERRNO" or "WHAT ALLOWED" per try.
"""
import errno
import fcntl
import hashlib
import mmap
import os
import socket
import struct
import sys
import threading
import time

VERSION = 3
REASONS = {1: "no_listener", 2: "door_unreachable", 3: "timeout", 4: "version", 5: "not_our_connection",
           6: "ambiguous", 7: "no_memory", 8: "peer_declined", 9: "protocol", 10: "no_proposal",
           11: "not_allowed", 12: "unproven", 13: "wrong_listener", 14: "bad_segment", 15: "penalized",
           16: "not_accepting", 17: "zerocopy", 18: "taken_as_tcp", 19: "io_uring"}
PROOF_FOLLOWS = 1
SO_COOKIE = 57
F_ADD_SEALS, SEALS = 1033, 0x1 | 0x2 | 0x4

# The ring (sluice_smc::ring): a 256-byte header, lines of 64 bytes.
RING_MAGIC = 0x5352_4543_4955_4C53
RING_VERSION = 6
HEADER = 256
PROD, CONS, STATE = 64, 128, 192
# The slot (sluice_smc::slot): a control page, then the client-to-server ring, then the
# server-to-client ring, each page-aligned.
SLOT_MAGIC = 0x4C53_4543_4955_4C53
CONTROL = 4096
AREA = 65536
RING_REGION = (HEADER + AREA + 4095) // 4096 * 4096
SLOT_LEN = CONTROL + 2 * RING_REGION
CS, SC = CONTROL, CONTROL + RING_REGION
STATES = {0: "free", 1: "proposed", 2: "committed", 3: "declined", 4: "abandoned"}


def key(ip):
    if ip == "0.0.0.0":
        return "any4"
    if ip == "::":
        return "any6"
    return ip.replace(":", "-")


def word(generation, state, reason=0):
    return (generation << 12) | (reason << 4) | state


def arena(sealed=True):
    """A one-slot arena as the library lays it out, the slot proposed: (fd, mapping)."""
    fd = os.memfd_create("hostile", os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, SLOT_LEN)
    if sealed:
        fcntl.fcntl(fd, F_ADD_SEALS, SEALS)
    m = mmap.mmap(fd, SLOT_LEN)
    for at in (CS, SC):
        struct.pack_into("<QII", m, at, RING_MAGIC, RING_VERSION, AREA.bit_length() - 1)
        struct.pack_into("<I", m, at + PROD + 12, AREA.bit_length() - 1)
    struct.pack_into("<QIIII", m, 0, SLOT_MAGIC, word(1, 1), 0, os.getpid(), 0)
    return fd, m


def state(m):
    w = struct.unpack_from("<I", m, 8)[0]
    s = STATES.get(w & 0xF, "garbage")
    return s + (" " + REASONS.get((w >> 4) & 0xFF, "?") if s == "declined" else "")


def announce_msg(cookie, flags=0):
    geometry = struct.pack("<IIIII", 1, AREA, AREA, AREA, AREA)
    body = struct.pack("<QIIIQ", cookie, 0, 1, os.getpid(), flags) + geometry
    return b"SLCL" + bytes([VERSION, 1, 0, 0]) + bytes(16) + body


def proof_msg(cookie):
    return b"SLCL" + bytes([VERSION, 2, 0, 0]) + bytes(16) + struct.pack("<Q", cookie)


def pairs():
    """The two socket pairs of a connection, as the library makes them: (ours, the end
    the server rings us through, the server's descriptor-to-be, the end we ring it
    through)."""
    mine, to_us = socket.socketpair()
    theirs, to_them = socket.socketpair()
    return mine, to_us, theirs, to_them


def cookie_of(sock):
    return struct.unpack("<Q", sock.getsockopt(socket.SOL_SOCKET, SO_COOKIE, 8))[0]


def find_door(rundir, port):
    d = os.path.join(rundir, "smc", "listen")
    for name in sorted(os.listdir(d)):
        if name.rsplit(".", 2)[0].endswith("_%d" % port):
            pid = name.rsplit(".", 1)[1]
            return os.path.join(rundir, "smc", "door", pid + ".sock")
    raise SystemExit("no sluice listener registered for port %d" % port)


def open_door(path):
    door = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    door.connect(path)
    return door


def wait_decision(m, seconds):
    deadline = time.time() + seconds
    while time.time() < deadline:
        s = state(m)
        if s != "proposed":
            return s
        time.sleep(0.005)
    return "undecided"


def propose(rundir, port, caddr, cport, saddr, how):
    keep = []
    if how.startswith("cookie:"):
        cookie, flags, proof = int(how[len("cookie:"):]), 0, None
    else:
        # Our own listener and connection with the victim's four addresses, here.
        l = socket.socket()
        l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        l.bind((saddr, port))
        l.listen()
        c = socket.socket()
        c.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        c.bind((caddr, cport))
        c.connect((saddr, port))
        keep += [l, c]
        cookie, flags, proof = cookie_of(c), PROOF_FOLLOWS, c
    try:
        door = open_door(find_door(rundir, port))
    except OSError as e:
        print("refused", errno.errorcode[e.errno])
        return
    fd, m = arena()
    mine, to_us, theirs, to_them = pairs()
    socket.send_fds(door, [announce_msg(cookie, flags)], [fd, to_us.fileno(), theirs.fileno()])
    if proof is not None:
        socket.send_fds(door, [proof_msg(cookie)], [proof.fileno()])
    print("sent", flush=True)
    print(wait_decision(m, 5), flush=True)


def client(rundir, ip, port, attack):
    fam = socket.AF_INET6 if ":" in ip else socket.AF_INET
    tcp = socket.socket(fam)
    door = open_door(find_door(rundir, port))
    fd, m = arena(sealed=(attack != "unsealed"))
    mine, to_us, theirs, to_them = pairs()
    socket.send_fds(door, [announce_msg(cookie_of(tcp))], [fd, to_us.fileno(), theirs.fileno()])
    to_us.close()
    theirs.close()
    tcp.connect((ip, port))
    decision = wait_decision(m, 5)
    if decision != "committed":
        # Its end of the pair closed: the server would not take the arena.
        mine.setblocking(False)
        try:
            gone = mine.recv(1) == b""
        except BlockingIOError:
            gone = False
        print("pair-closed" if gone else decision, flush=True)
        if attack == "unsealed":
            # What it would have done: shrink the memory under the server's mapping.
            os.ftruncate(fd, 0)
            print("shrunk-own-copy", flush=True)
        tcp.close()
        return
    print("decision commit", flush=True)
    if attack == "sealed":
        try:
            os.ftruncate(fd, 0)
            print("shrink ALLOWED", flush=True)
        except OSError:
            print("shrink refused", flush=True)
    elif attack == "bad-prod":
        cons = struct.unpack_from("<Q", m, CS + CONS)[0]
        struct.pack_into("<Q", m, CS + PROD, (cons + (1 << 40)) % (1 << 64))
        to_them.send(b"\x01")
        print("wrote bad producer cursor", flush=True)
    elif attack.startswith("slow-publish:"):
        slow_publish(m, to_them, int(attack.partition(":")[2]))
    elif attack.startswith("late-bell:"):
        late_bell(m, to_them, int(attack.partition(":")[2]))
    elif attack == "bad-cons":
        # Wait until the server has filled the ring a little, then lie about our cursor.
        for _ in range(500):
            if struct.unpack_from("<Q", m, SC + PROD)[0] > 0:
                break
            time.sleep(0.01)
        prod = struct.unpack_from("<Q", m, SC + PROD)[0]
        struct.pack_into("<Q", m, SC + CONS, (prod + 12345) % (1 << 64))
        # The server's writer may wait behind the filler it sent us: take it.
        to_them.setblocking(False)
        try:
            while to_them.recv(65536):
                pass
        except OSError:
            pass
        print("wrote bad consumer cursor", flush=True)
    # Stay on the connection a moment, so the server meets the damage while we live.
    time.sleep(1.5)
    tcp.close()


AVAIL, BELL = (1 << 27) - 1, 1 << 28


def slow_publish(m, to_them, count):
    """Writes COUNT messages into the ring the server reads as the library's writer does —
    bytes copied, then counted in the state word (a new epoch: BELL), then the producer
    cursor published, then the doorbell rung — but with the second half of each message
    counted with the first and published 5 ms after it, as when the writer loses its CPU
    between counting and publishing. Each message waits until the server has read the
    one before (its cursor caught up, the count back to 0) and is back in its wait; the
    state word is written only then, so no update of the server's is lost."""
    h, total = hashlib.sha256(), 0
    for i in range(count):
        prod = struct.unpack_from("<Q", m, CS + PROD)[0]
        deadline = time.monotonic() + 10
        while (struct.unpack_from("<Q", m, CS + CONS)[0] != prod
               or struct.unpack_from("<I", m, CS + STATE)[0] & AVAIL) and time.monotonic() < deadline:
            time.sleep(0.001)
        time.sleep(0.02)
        msg = bytes((i * 7 + j) % 251 for j in range(3000))
        for j, b in enumerate(msg):
            m[CS + HEADER + (prod + j) % AREA] = b
        w = struct.unpack_from("<I", m, CS + STATE)[0]
        struct.pack_into("<I", m, CS + STATE, (w & ~AVAIL & 0xFFFFFFFF) | BELL | len(msg))
        struct.pack_into("<Q", m, CS + PROD, prod + 1500)
        try:
            to_them.send(b"\x01")
        except BrokenPipeError:
            print(f"server gone after {i} messages", flush=True)
            return
        time.sleep(0.005)
        struct.pack_into("<Q", m, CS + PROD, prod + len(msg))
        h.update(msg)
        total += len(msg)
    print(f"{total} {h.hexdigest()}", flush=True)


SLEEPER = 1 << 30


def futex_wake(m, offset):
    """Wakes whoever sleeps on the 32-bit word at OFFSET of mapping M (FUTEX_WAKE, shared)."""
    import ctypes
    word = ctypes.c_uint32.from_buffer(m, offset)
    try:
        ctypes.CDLL(None, use_errno=True).syscall(202, ctypes.c_void_p(ctypes.addressof(word)), 1, 1 << 30, None,
                                                  None, 0)
    finally:
        del word


def late_bell(m, to_them, count):
    """Writes COUNT messages into the ring the server reads as the library's writer does
    when the reader sleeps in a read smaller than what comes — bytes copied, counted in
    the state word (a new epoch: BELL, the sleeper mark taken), the producer cursor
    published, the futex woken, the doorbell rung — but with the doorbell byte sent 5 ms
    after the rest, as when the writer loses its CPU between its last two steps. Each
    message waits until the server has read the one before and sleeps in its next read."""
    h, total = hashlib.sha256(), 0
    for i in range(count):
        prod = struct.unpack_from("<Q", m, CS + PROD)[0]
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            w = struct.unpack_from("<I", m, CS + STATE)[0]
            if struct.unpack_from("<Q", m, CS + CONS)[0] == prod and w & AVAIL == 0 and w & SLEEPER:
                break
            time.sleep(0.0002)
        body = bytes((i * 13 + j) % 251 for j in range(100 + i % 50))
        msg = len(body).to_bytes(4, "big") + body
        for j, b in enumerate(msg):
            m[CS + HEADER + (prod + j) % AREA] = b
        w = struct.unpack_from("<I", m, CS + STATE)[0]
        struct.pack_into("<I", m, CS + STATE, (w & ~(AVAIL | SLEEPER) & 0xFFFFFFFF) | BELL | len(msg))
        struct.pack_into("<Q", m, CS + PROD, prod + len(msg))
        futex_wake(m, CS + STATE)
        time.sleep(0.005)
        try:
            to_them.send(b"\x01")
        except BrokenPipeError:
            print(f"server gone after {i} messages", flush=True)
            return
        h.update(body)
        total += len(body)
    print(f"{total} {h.hexdigest()}", flush=True)


def register(rundir, ip, port, backlog=16):
    """A listen entry and a side door for this process: (entry, door path, door)."""
    netns = os.stat("/proc/self/ns/net").st_ino
    entry = os.path.join(rundir, "smc", "listen", "%s_%d.%d.%d" % (key(ip), port, netns, os.getpid()))
    with open(entry, "w") as f:
        f.write("r=%d rmax=%d\n" % (AREA, AREA))
    path = os.path.join(rundir, "smc", "door", "%d.sock" % os.getpid())
    door = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    door.bind(path)
    os.chmod(path, 0o666)
    door.listen(backlog)
    return entry, path, door


def messages(door, deadline, on_message):
    """Takes associations and their messages until `deadline`: on_message(what, fds)."""
    conns = []
    door.setblocking(False)
    while time.time() < deadline:
        try:
            c, _ = door.accept()
            c.setblocking(False)
            conns.append(c)
        except BlockingIOError:
            pass
        for c in conns:
            try:
                data, fds, _, _ = socket.recv_fds(c, 256, 8)
            except BlockingIOError:
                continue
            except OSError:
                continue
            if data:
                what = {1: "announce", 2: "proof"}.get(data[5], "kind %d" % data[5]) if data[:4] == b"SLCL" else "garbage"
                on_message(what, fds)
        time.sleep(0.002)


def decoy(rundir, ip, port, seconds):
    l = socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET)
    l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    l.bind((ip, port))
    l.listen()
    entry, path, door = register(rundir, ip, port)
    print("listening", flush=True)
    try:
        messages(door, time.time() + seconds, lambda what, fds: print("message", what, flush=True))
    finally:
        os.unlink(entry)
        os.unlink(path)


def server(rundir, ip, port, attack, seconds):
    l = socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET)
    l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    l.bind((ip, port))
    l.listen(16)

    def sink_all():
        while True:
            c, _ = l.accept()
            h, n = hashlib.sha256(), 0
            while True:
                b = c.recv(65536)
                if not b:
                    break
                h.update(b)
                n += len(b)
            print("tcp %d %s" % (n, h.hexdigest()), flush=True)
            c.close()

    threading.Thread(target=sink_all, daemon=True).start()
    entry, path, door = register(rundir, ip, port, 0 if attack == "full-door" else 16)
    keep = []
    if attack == "full-door":
        # Fill the backlog of 0: one connection nobody accepts.
        f = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        f.connect(path)
        keep.append(f)
    print("listening", flush=True)

    def cheat(what, fds):
        if what != "announce" or len(fds) != 3:
            return
        if attack == "close-bell":
            os.close(fds[1])
        elif attack == "garbage-word":
            m = mmap.mmap(fds[0], 4096)
            struct.pack_into("<I", m, 8, 0xFFFFFFFF)
            keep.append(m)
        keep.extend(fds)
        print("took an announcement", flush=True)

    deadline = time.time() + seconds
    try:
        if attack == "full-door":
            time.sleep(seconds)
        else:
            messages(door, deadline, cheat)
    finally:
        os.unlink(entry)
        os.unlink(path)


def liar(rundir, ip, port, count, nbytes):
    door = open_door(find_door(rundir, port))
    for i in range(count):
        tcp = socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET)
        fd, _ = arena()
        mine, to_us, theirs, to_them = pairs()
        socket.send_fds(door, [announce_msg(cookie_of(tcp), PROOF_FOLLOWS)], [fd, to_us.fileno(), theirs.fileno()])
        os.close(fd)
        to_us.close()
        theirs.close()
        tcp.connect((ip, port))
        data = bytes([i % 256]) * nbytes
        tcp.sendall(data)
        # One at a time: the next is announced once the server is done with this one.
        tcp.shutdown(socket.SHUT_WR)
        tcp.settimeout(30)
        while tcp.recv(65536):
            pass
        tcp.close()
        print("%d %s" % (nbytes, hashlib.sha256(data).hexdigest()), flush=True)


def flood(rundir, port, count, seconds):
    door = open_door(find_door(rundir, port))
    fd, _ = arena()
    for i in range(count):
        mine, to_us, theirs, to_them = pairs()
        # (A proof would follow: the door keeps reading this association as it comes.)
        try:
            socket.send_fds(door, [announce_msg(1000 + i, PROOF_FOLLOWS)], [fd, to_us.fileno(), theirs.fileno()])
        except OSError:
            break
        finally:
            for s in (mine, to_us, theirs, to_them):
                s.close()
    print("flooded", flush=True)
    time.sleep(seconds)


def probe(rundir, pids):
    def attempt(what, fn):
        try:
            fn()
            print("%s ALLOWED" % what)
        except OSError as e:
            print("%s refused %s" % (what, errno.errorcode[e.errno]))

    def listing(sub):
        try:
            return sorted(os.listdir(os.path.join(rundir, "smc", sub)))
        except OSError as e:
            print("list:%s refused %s" % (sub, errno.errorcode[e.errno]))
            return []

    doors = set(listing("door")) | {"%s.sock" % p for p in pids}
    for name in sorted(doors):
        attempt("door:" + name, lambda: open_door(os.path.join(rundir, "smc", "door", name)).close())
    for sub in ("listen", "door", "conn", "stats"):
        p = os.path.join(rundir, "smc", sub, "planted-%d" % os.getpid())
        attempt("create:" + sub, lambda: (open(p, "w").close(), os.unlink(p)))
    # (stats/0, root's programs' file, is tried by name too: a directory another user
    # cannot list must not make the probe try nothing.)
    for name in sorted(set(listing("stats")) | {"0"}):
        p = os.path.join(rundir, "smc", "stats", name)
        attempt("write:stats/" + name, lambda: open(p, "r+b").close())
        attempt("truncate:stats/" + name, lambda: os.truncate(p, 0))


def main():
    a = sys.argv[1:]
    if a[0] == "propose":
        propose(a[1], int(a[2]), a[3], int(a[4]), a[5], a[6])
    elif a[0] == "client":
        client(a[1], a[2], int(a[3]), a[4])
    elif a[0] == "decoy":
        decoy(a[1], a[2], int(a[3]), float(a[4]))
    elif a[0] == "server":
        server(a[1], a[2], int(a[3]), a[4], float(a[5]))
    elif a[0] == "liar":
        liar(a[1], a[2], int(a[3]), int(a[4]), int(a[5]))
    elif a[0] == "flood":
        flood(a[1], int(a[2]), int(a[3]), float(a[4]))
    elif a[0] == "probe":
        probe(a[1], a[2:])
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main()

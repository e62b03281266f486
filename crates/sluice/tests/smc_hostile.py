#!/usr/bin/env python3
"""A hostile local program against sluice's shared-memory fast path (issue 14's tests).

It speaks the side-door handshake by hand (docs/architecture.md, "Capability" and "The
fast path's trust boundary") and tries what a hostile local user would:

  smc_hostile.py propose RUNDIR PORT CADDR CPORT SADDR SOCK
      Propose someone else's live connection CADDR:CPORT -> SADDR:PORT to the sluice
      listener on PORT, without holding it. SOCK is what is passed as the proof:
        none    no socket (the ring and doorbell only)
        other   a TCP socket of the attacker's own, to a listener of its own
        same    a socket with the very same four addresses, made here (run this in
                another network namespace, where 127.0.0.1 is the attacker's own)
      Prints "refused ERRNO" (the door would not open), "declined REASON", "accepted"
      (the server handed over its memory), or "closed".
  smc_hostile.py client RUNDIR ADDR PORT ATTACK
      Be a real client of the sluice listener on ADDR:PORT that cheats after connecting:
        unsealed  offer a ring in a memfd without seals (it could shrink it later)
        sealed    an honest handshake; then try to shrink the ring (must be refused)
        bad-prod  an honest handshake; then write an out-of-range producer cursor into
                  the server's receive ring
        bad-cons  an honest handshake; then write an out-of-range consumer cursor into
                  our own receive ring, which the server writes into
      Prints what happened, one word per step.
  smc_hostile.py decoy RUNDIR ADDR PORT SECONDS
      Register as a sluice listener for ADDR:PORT (run it in another namespace) and
      answer every proposal with ACCEPT; prints "listening", then "proposal" for each
      proposal received, and exits after SECONDS.
  smc_hostile.py server RUNDIR ADDR PORT ATTACK SECONDS
      Be a sluice listener on ADDR:PORT (a real TCP listener, registered, with a side
      door) that cheats its clients; every TCP connection is read to EOF and reported as
      "tcp <bytes> <sha256>". Prints "listening" first. ATTACK:
        full-door    the door never accepts, and its backlog is full (connecting to it
                     would wait forever)
        stall        answer ACCEPT, take the client's CONFIRM, and never decide
        linger-bell  answer ACCEPT with a TCP socket as the doorbell, one whose last
                     close waits for unsent bytes (SO_LINGER) that nobody reads
      Exits after SECONDS.
  smc_hostile.py liar RUNDIR ADDR PORT COUNT BYTES
      COUNT times: announce our own next connection to ADDR:PORT (as a sluice client
      would), connect with plain TCP, send BYTES bytes, never propose. Prints
      "<bytes> <sha256>" of each connection.
  smc_hostile.py announce RUNDIR CPORT SADDR SPORT
      Announce someone else's connection from port CPORT to SADDR:SPORT (write the intent
      file its client would write before connecting), so that the server's accept would
      wait for a handshake that never comes. Prints "announced" or "refused ERRNO".
  smc_hostile.py probe RUNDIR [PID…]
      As an unprivileged user: try to open every door (those listed, and those of the
      PIDs given), to add an entry to every shared directory, and to write or truncate
      every statistics file. Prints "WHAT refused ERRNO" or "WHAT ALLOWED" per try.
"""
import array
import mmap
import os
import socket
import struct
import sys
import time

# SLUICE_HOSTILE_VERSION=1 speaks the handshake of sluice before issue 14 (ring layout 2,
# no TCP socket in the proposal), to show the attacks worked there.
VERSION = int(os.environ.get("SLUICE_HOSTILE_VERSION", "2"))
REASONS = {1: "no_listener", 2: "door_unreachable", 3: "timeout", 4: "version", 5: "not_our_connection",
           6: "ambiguous", 7: "no_memory", 8: "peer_declined", 9: "protocol", 10: "no_proposal",
           11: "not_allowed", 12: "unproven", 13: "wrong_listener", 14: "bad_segment", 15: "penalized",
           16: "not_accepting", 17: "zerocopy"}
RING_MAGIC = 0x5352_4543_4955_4C53
RING_VERSION = 4 if VERSION >= 2 else 2
HEADER = 256
PROD, CONS, STATE = 64, 128, 192
F_ADD_SEALS, SEALS = 1033, 0x1 | 0x2 | 0x4


def key(ip):
    if ip in ("0.0.0.0",):
        return "any4"
    if ip == "::":
        return "any6"
    return ip.replace(":", "-")


def addr(ip, port):
    if ":" in ip:
        return bytes([6]) + struct.pack("<H", port) + socket.inet_pton(socket.AF_INET6, ip)
    return bytes([4]) + struct.pack("<H", port) + b"\0" * 10 + b"\xff\xff" + socket.inet_aton(ip)


def hdr(kind, token):
    return b"SLCL" + bytes([VERSION, kind, 0, 0]) + token


def proposal(token, caddr, cport, saddr, sport, rmem=65536, tmem=65536):
    return (hdr(1, token) + addr(caddr, cport) + addr(saddr, sport)
            + struct.pack("<QIII", os.stat("/proc/self/ns/net").st_ino, os.getpid(), rmem, tmem))


def read_msg(door, timeout=5.0):
    """(what, descriptors, raw datagram)."""
    door.settimeout(timeout)
    try:
        data, fds, _, _ = socket.recv_fds(door, 256, 4)
    except (socket.timeout, OSError):
        return ("closed", [], b"")
    if not data:
        return ("closed", fds, data)
    if len(data) < 24 or data[:4] != b"SLCL":
        return ("garbage", fds, data)
    kind = data[5]
    what = {1: "proposal", 2: "accept", 3: "confirm"}.get(kind)
    if kind == 4:
        what = "declined " + REASONS.get(data[24], str(data[24]))
    return (what or "kind %d" % kind, fds, data)


def ring(size, sealed=True):
    """A receive ring in a memfd, as the library lays it out: (fd, mapping)."""
    fd = os.memfd_create("hostile", os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, HEADER + size)
    if sealed:
        import fcntl
        fcntl.fcntl(fd, F_ADD_SEALS, SEALS)
    m = mmap.mmap(fd, HEADER + size)
    m[0:16] = struct.pack("<QII", RING_MAGIC, RING_VERSION, size.bit_length() - 1)
    if RING_VERSION >= 4:
        # The window: the whole ring (it does not grow).
        struct.pack_into("<I", m, PROD + 12, size.bit_length() - 1)
    return fd, m


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


def propose(rundir, port, caddr, cport, saddr, sock):
    try:
        door = open_door(find_door(rundir, port))
    except OSError as e:
        import errno
        print("refused", errno.errorcode[e.errno])
        return
    rfd, _ = ring(65536)
    mine, theirs = socket.socketpair()
    fds = [rfd, theirs.fileno()]
    keep = []
    if sock == "other":
        l = socket.socket()
        l.bind(("127.0.0.1", 0))
        l.listen()
        c = socket.create_connection(l.getsockname())
        keep += [l, c]
        fds.append(c.fileno())
    elif sock == "same":
        l = socket.socket()
        l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        l.bind((saddr, port))
        l.listen()
        c = socket.socket()
        c.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        c.bind((caddr, cport))
        c.connect((saddr, port))
        keep += [l, c]
        fds.append(c.fileno())
    token = os.urandom(16)
    socket.send_fds(door, [proposal(token, caddr, cport, saddr, port)], fds)
    answer = read_msg(door)
    if answer[0] == "accept":
        print("accepted")
    else:
        print(answer[0])


def client(rundir, ip, port, attack):
    fam = socket.AF_INET6 if ":" in ip else socket.AF_INET
    tcp = socket.socket(fam)
    tcp.bind(("::" if fam == socket.AF_INET6 else "0.0.0.0", 0))
    cport = tcp.getsockname()[1]
    # Announce the proposal as the library does, so the server's accept waits for it.
    intent = os.path.join(rundir, "smc", "intent", "%d_%s_%d" % (cport, key(ip), port))
    with open(intent, "w") as f:
        f.write(str(os.getpid()))
    tcp.connect((ip, port))
    door = open_door(find_door(rundir, port))
    rfd, rmap = ring(65536, sealed=(attack != "unsealed"))
    mine, theirs = socket.socketpair()
    token = os.urandom(16)
    proof = [tcp.fileno()] if VERSION >= 2 else []
    socket.send_fds(door, [proposal(token, ip, cport, ip, port)], [rfd, theirs.fileno()] + proof)
    answer = read_msg(door)
    os.unlink(intent)
    if answer[0] != "accept":
        print(answer[0], flush=True)
        if attack == "unsealed":
            # What it would have done: shrink the memory under the server's mapping.
            os.ftruncate(rfd, 0)
            print("shrunk-own-copy", flush=True)
        tcp.close()
        return
    _, fds, data = answer
    srmem = struct.unpack("<I", data[24:28])[0]
    smap = mmap.mmap(fds[0], HEADER + srmem)
    server_bell = socket.socket(fileno=fds[1])
    socket.send_fds(door, [hdr(3, token)], [])
    decision = read_msg(door, timeout=30)
    print("decision", decision[0], flush=True)
    if decision[0] != "confirm":
        return
    if attack == "unsealed":
        # Taken without its seals: shrink the ring the server writes into.
        os.ftruncate(rfd, 0)
        print("shrank the ring under the server", flush=True)
    elif attack == "sealed":
        try:
            os.ftruncate(rfd, 0)
            print("shrink ALLOWED", flush=True)
        except OSError:
            print("shrink refused", flush=True)
    elif attack == "bad-prod":
        cons = struct.unpack_from("<Q", smap, CONS)[0]
        struct.pack_into("<Q", smap, PROD, (cons + (1 << 40)) % (1 << 64))
        server_bell.send(b"\x01")
        print("wrote bad producer cursor", flush=True)
    elif attack == "bad-cons":
        # Wait until the server has filled our ring a little, then lie about our cursor.
        for _ in range(500):
            if struct.unpack_from("<Q", rmap, PROD)[0] > 0:
                break
            time.sleep(0.01)
        prod = struct.unpack_from("<Q", rmap, PROD)[0]
        struct.pack_into("<Q", rmap, CONS, (prod + 12345) % (1 << 64))
        # The server's writer may wait on its descriptor behind filler: drain it.
        server_bell.setblocking(False)
        try:
            while server_bell.recv(65536):
                pass
        except OSError:
            pass
        print("wrote bad consumer cursor", flush=True)
    # Stay on the connection a moment, so the server meets the damage while we live.
    time.sleep(1.5)
    tcp.close()


def decoy(rundir, ip, port, seconds):
    l = socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET)
    l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    l.bind((ip, port))
    l.listen()
    entry, path, door = register(rundir, ip, port)
    print("listening", flush=True)
    deadline = time.time() + seconds
    try:
        while time.time() < deadline:
            door.settimeout(max(0.01, deadline - time.time()))
            try:
                c, _ = door.accept()
            except socket.timeout:
                break
            what, fds, data = read_msg(c)
            print(what, flush=True)
            if what != "proposal":
                continue
            # Answer as a willing server: ACCEPT with a ring of our own, then commit.
            rfd, _ = ring(65536)
            mine, theirs = socket.socketpair()
            token = data[8:24]
            socket.send_fds(c, [hdr(2, token) + struct.pack("<II", 65536, os.getpid())], [rfd, theirs.fileno()])
            if read_msg(c)[0] == "confirm":
                socket.send_fds(c, [hdr(3, token)], [])
                print("hijacked", len(fds), "descriptors", flush=True)
    finally:
        os.unlink(entry)
        os.unlink(path)


def probe(rundir, pids):
    import errno

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
    for sub in ("listen", "door", "intent", "conn", "stats"):
        p = os.path.join(rundir, "smc", sub, "planted-%d" % os.getpid())
        attempt("create:" + sub, lambda: (open(p, "w").close(), os.unlink(p)))
    for name in listing("stats"):
        p = os.path.join(rundir, "smc", "stats", name)
        attempt("write:stats/" + name, lambda: open(p, "r+b").close())
        attempt("truncate:stats/" + name, lambda: os.truncate(p, 0))


def register(rundir, ip, port, backlog=16):
    """A listen entry and a side door for this process: (entry, door path, door)."""
    netns = os.stat("/proc/self/ns/net").st_ino
    entry = os.path.join(rundir, "smc", "listen", "%s_%d.%d.%d" % (key(ip), port, netns, os.getpid()))
    open(entry, "w").close()
    path = os.path.join(rundir, "smc", "door", "%d.sock" % os.getpid())
    door = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    door.bind(path)
    os.chmod(path, 0o666)
    door.listen(backlog)
    return entry, path, door


def lingering_socket():
    """A TCP socket whose last close waits (SO_LINGER 120 s) for bytes nobody reads."""
    l = socket.socket()
    l.bind(("127.0.0.1", 0))
    l.listen(1)
    c = socket.create_connection(l.getsockname())
    c.setblocking(False)
    try:
        while True:
            c.send(b"x" * 65536)
    except BlockingIOError:
        pass
    c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 120))
    return l, c


def server(rundir, ip, port, attack, seconds):
    import hashlib
    import threading
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
    deadline = time.time() + seconds
    try:
        while time.time() < deadline:
            if attack == "full-door":
                time.sleep(0.05)
                continue
            door.settimeout(max(0.01, deadline - time.time()))
            try:
                c, _ = door.accept()
            except socket.timeout:
                break
            keep.append(c)
            what, fds, data = read_msg(c)
            print(what, flush=True)
            if what != "proposal":
                continue
            token = data[8:24]
            rfd, _ = ring(65536)
            if attack == "linger-bell":
                lst, bell = lingering_socket()
                socket.send_fds(c, [hdr(2, token) + struct.pack("<II", 65536, os.getpid())], [rfd, bell.fileno()])
                # The client now holds the last reference.
                bell.close()
                keep.append(lst)
                print("sent a lingering socket", flush=True)
                continue
            mine, theirs = socket.socketpair()
            keep += [mine, theirs]
            socket.send_fds(c, [hdr(2, token) + struct.pack("<II", 65536, os.getpid())], [rfd, theirs.fileno()])
            print(read_msg(c)[0], "and no decision", flush=True)
    finally:
        os.unlink(entry)
        os.unlink(path)


def liar(rundir, ip, port, count, nbytes):
    import hashlib
    for i in range(count):
        tcp = socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET)
        tcp.bind(("", 0))
        cport = tcp.getsockname()[1]
        write_intent(rundir, cport, ip, port)
        tcp.connect((ip, port))
        data = bytes([i % 256]) * nbytes
        tcp.sendall(data)
        tcp.close()
        print("%d %s" % (nbytes, hashlib.sha256(data).hexdigest()), flush=True)


def write_intent(rundir, cport, saddr, sport):
    path = os.path.join(rundir, "smc", "intent", "%d_%s_%d" % (cport, key(saddr), sport))
    os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW, 0o644))


def announce(rundir, cport, saddr, sport):
    try:
        write_intent(rundir, cport, saddr, sport)
        print("announced", flush=True)
    except OSError as e:
        import errno
        print("refused", errno.errorcode[e.errno])


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
    elif a[0] == "announce":
        announce(a[1], int(a[2]), a[3], int(a[4]))
    elif a[0] == "probe":
        probe(a[1], a[2:])
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""TCP peers for the tests of `sluice smc run` (run under the launcher or not).

  smc_peer.py serve PORT MODE [ADDR]     accept one connection (MODE below), print a result
  smc_peer.py connect ADDR PORT MODE     connect once (MODE below), print a result
  smc_peer.py serve-in-child PORT MODE  listen on a port of its own, fork; the child
                                         listens on PORT and accepts one connection (MODE)
  smc_peer.py serve-forked PORT [ADDR [N]]
                                         listen, fork; the child accepts N connections
                                         (default 1) and sinks each (a pre-forking server)
  smc_peer.py serve-workers PORT K N      listen, fork K children that accept on the listener
                                         with non-blocking accept and poll (as nginx's
                                         workers do) and sink each connection; the parent
                                         ends them after N connections in all
  smc_peer.py fds ADDR PORT             open a connection, then a second one; print "fds
                                         <descriptors the second added> app <its number> low
                                         <descriptors below 64>" (echo-epoll PORT 2 serves it)
  smc_peer.py pipeline ADDR PORT PATH…   one connection, every HTTP GET sent at once
                                         (pipelined), then each response read in turn: print
                                         "<path> <status> <body bytes> <body sha256>" each
  smc_peer.py serve-inetd PORT PROG [ARG…]
                                         accept one connection and hand it to PROG as inetd
                                         does: fork, the connection on the child's standard
                                         input and output, exec; print "child <exit status>"
  smc_peer.py serve-subprocess PORT PROG [ARG…]
                                         as serve-inetd, with Python's subprocess.Popen (the
                                         connection as the child's stdin and stdout, closed
                                         here at once); one subprocess runs before listening
  smc_peer.py serve-zc PORT MODE         as serve, on a listener with SO_ZEROCOPY set
  smc_peer.py serve-seq PORT M1,M2,… [ADDR]
                                         accept one connection per MODE in turn; print
                                         each result, or the error that ended it
  smc_peer.py echo-epoll PORT N [ADDR]   an epoll server echoing N connections, then exit;
                                         counts reads that find nothing after epoll said
                                         readable
  smc_peer.py many ADDR PORT N           open N connections at once, each sends its index
                                         and reads it back; prints "ok N"
  smc_peer.py connect-seq ADDR PORT N MODE
                                         connect N times in turn, one process, each
                                         connection running MODE: print each result

MODE:
  sink             read to EOF, print "<bytes> <sha256>"
  source:BYTES     send BYTES pseudo-random bytes (seeded), print "<bytes> <sha256>"
  source1m:BYTES   as source, in writes of 1 MiB (larger than a buffer's first size)
  small:COUNT      send COUNT 7-byte records one write each, print "<bytes> <sha256>"
  hold:SECONDS     (after sink or source) keep the connection open this long: "sink+hold:2"
  gate:PATH        (before the rest) print "port <local port> cookie <socket cookie>", then
                   wait until PATH exists (at most 60 s): "gate:/tmp/go+source:1000"
  pregate:PATH     (connect; first) bind the socket, print "port … cookie …", wait until
                   PATH exists (at most 60 s), then connect: "pregate:/tmp/go+source:1000"
  forever          send until the peer goes away; print the error's name
  sink-or-error    as sink, but an error ends it: print the error's name
  echo             send every byte back as it comes (blocking writes) until the peer's
                   end; print "echoed <bytes>"
  closerange       close every descriptor above the connection's (os.closerange, which is
                   close_range), then pause 0.3 s: "closerange+source:1000"
  exec-child[:S]   run `sleep S` (default 2) in a child, forked then exec'd, not waited for
  bursts:COUNT     send COUNT bursts of ten 30-byte writes with a pause after each (so
                   the reader falls asleep between them), print "<bytes> <sha256>"
  nibble           read to EOF in blocking reads of 7 or 200 bytes; after each, whenever
                   bytes are waiting, poll must report the socket readable (else print
                   "unreadable" and exit 1); print "<bytes> <sha256>"
  zerocopy:COUNT   (connect) set SO_ZEROCOPY, send COUNT 10,000-byte messages with
                   MSG_ZEROCOPY, read the completions off the error queue; print "zc <sends>
                   <sends covered> <codes>", then "<bytes> <sha256>"
  zcfirst+MODE     (connect; first) set SO_ZEROCOPY before connecting, then MODE
  strict-sink[:poll|:epoll]
                   as sink, non-blocking, reading only after select (poll, epoll) said
                   readable; print "spurious" if such a read found nothing (EAGAIN)
  late:SECONDS     (serve; first) wait this long before accepting: "late:1+source:1000"
  pause:SECONDS    wait this long, then the rest: "pause:0.5+source:1000"
  fork             (connect) fork after connect: the child sends "child\\n" and exits, then
                   the parent sends "parent\\n"; the server's sink sees both
  fork-race:COUNT  (connect) fork after connect; parent and child each send COUNT 64-byte
                   records at the same time, then the connection is shut down
  records          read to EOF as 64-byte records; print "P <n> C <n> bad <n>" (a record
                   is bad unless it is one tag byte repeated, as fork-race writes them)
  sendfile:BYTES   as source, but from a file with sendfile(2): the first half at explicit
                   offsets, the rest from the file's position (offset None)
  splice-in:BYTES  as source, but through a pipe with splice(2) into the socket
  splice-out       as sink, but with splice(2) from the socket into a pipe
  fionread         wait until bytes arrive and stop arriving, print "fionread <FIONREAD>",
                   then as sink
  mmsg:COUNT       send COUNT 100-byte records, eight per sendmmsg(2) call, print
                   "<bytes> <sha256>"
  mmsg-sink        as sink, with recvmmsg(2) into eight 4 KiB buffers (MSG_WAITFORONE)
  vec:COUNT        send COUNT sendmsg(2) calls of five buffers (1 to 60,000 bytes) each,
                   print "<bytes> <sha256>"
  echo-waits:W/W/…
                   echo one message ("N\\n") per waiter W in turn, waiting for it with W:
                   epoll (the connection registered once, level-triggered), epoll1 (one
                   event at most, beside an always-writable pipe), epoll2 (epoll_pwait2),
                   poll, ppoll, select, pselect, or recv (a blocking read) — the libc calls
                   themselves, through ctypes, where Python has no wrapper; print
                   "echoed <count>", "spurious" if a read after a
                   wait found nothing, or "hung at <i> <W>" after 20 s without the message
  pings:COUNT      send COUNT messages ("N\\n"), each after reading the answer to the one
                   before — every other one at once, the rest after 50 ms — and print
                   "answered <count>", or "no answer to <i>" after 30 s
  block-then-select
                   blocking reads of a 4-byte length and its body, then a select that must
                   not say readable (smc_hostile.py's late-bell writes the next message only
                   once this side sleeps in its next read); print "<bytes> <sha256>" of the
                   bodies, or "readable for nothing after <n>"
  trunc:BYTES      (before sink) wait for data, then throw BYTES away with
                   recv(MSG_TRUNC); print "trunc <what recv returned>"
Plain blocking sockets: every byte goes through libc's send/recv, which the preload
library hooks.
"""
import hashlib
import os
import random
import select
import socket
import subprocess
import sys
import time


def family(addr):
    return socket.AF_INET6 if ":" in addr else socket.AF_INET


def sink(c):
    h, n = hashlib.sha256(), 0
    while True:
        b = c.recv(1 << 16)
        if not b:
            break
        h.update(b)
        n += len(b)
    return f"{n} {h.hexdigest()}"


def source(c, total, chunk_size=1 << 16):
    rnd = random.Random(42)
    h, sent = hashlib.sha256(), 0
    while sent < total:
        chunk = rnd.randbytes(min(chunk_size, total - sent))
        c.sendall(chunk)
        h.update(chunk)
        sent += len(chunk)
    return f"{sent} {h.hexdigest()}"


def small(c, count):
    h, sent = hashlib.sha256(), 0
    for i in range(count):
        rec = (i % 10_000_000).to_bytes(4, "big") + b"abc"
        c.sendall(rec)
        h.update(rec)
        sent += 7
    return f"{sent} {h.hexdigest()}"


def bursts(c, count):
    h, sent = hashlib.sha256(), 0
    for i in range(count):
        for j in range(10):
            rec = bytes((i + j + k) % 251 for k in range(30))
            c.sendall(rec)
            h.update(rec)
            sent += len(rec)
        time.sleep(0.0003)
    return f"{sent} {h.hexdigest()}"


def nibble(c):
    h, n, i = hashlib.sha256(), 0, 0
    p = select.poll()
    p.register(c.fileno(), select.POLLIN)
    while True:
        b = c.recv(7 if i % 3 else 200)
        i += 1
        if not b:
            break
        h.update(b)
        n += len(b)
        try:
            waiting = len(c.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)) > 0
        except BlockingIOError:
            waiting = False
        if waiting and not p.poll(2000):
            print(f"unreadable after {n} bytes with bytes waiting", flush=True)
            sys.exit(1)
    return f"{n} {h.hexdigest()}"


def strict_sink(c, waiter="select"):
    """As sink, non-blocking: wait with select (or poll, or epoll), then read; a read
    after the wait said readable must never raise EAGAIN (programs like wrk count that
    as an error)."""
    c.setblocking(False)
    h, total = hashlib.sha256(), 0
    if waiter == "poll":
        p = select.poll()
        p.register(c, select.POLLIN)
        wait = lambda: p.poll(30000)  # noqa: E731
    elif waiter == "epoll":
        e = select.epoll()
        e.register(c, select.EPOLLIN)
        wait = lambda: e.poll(30)  # noqa: E731
    else:
        wait = lambda: select.select([c], [], [], 30)[0]  # noqa: E731
    while True:
        if not wait():
            return "timeout"
        try:
            b = c.recv(8192)
        except BlockingIOError:
            return "spurious"
        if not b:
            return f"{total} {h.hexdigest()}"
        h.update(b)
        total += len(b)


SO_ZEROCOPY, MSG_ZEROCOPY = 60, 0x4000000


def zerocopy_send(c, count):
    """Sets SO_ZEROCOPY, sends COUNT 10,000-byte MSG_ZEROCOPY messages, then reads the
    completions off the error queue (waiting for POLLERR while some are missing, at most
    5 s); prints "zc <sends> <sends the completions covered> <codes seen>", then returns
    the bytes' summary."""
    import struct
    c.setsockopt(socket.SOL_SOCKET, SO_ZEROCOPY, 1)
    rnd = random.Random(7)
    h, total, sends = hashlib.sha256(), 0, 0
    # A zero-copy send's buffer must stay as it is until its completion: every one is
    # kept alive to the end.
    keep = []
    for _ in range(count):
        chunk = rnd.randbytes(10000)
        off = 0
        while off < len(chunk):
            keep.append(memoryview(chunk)[off:])
            n = c.sendmsg([keep[-1]], [], MSG_ZEROCOPY)
            sends += 1
            off += n
        h.update(chunk)
        total += len(chunk)
    covered, codes = 0, set()
    deadline = time.time() + 5
    p = select.poll()
    p.register(c, select.POLLERR)
    while covered < sends and time.time() < deadline:
        try:
            _, anc, flags, _ = c.recvmsg(1, 1024, socket.MSG_ERRQUEUE)
        except BlockingIOError:
            p.poll(100)
            continue
        for level, kind, data in anc:
            _, origin, _, code, _, lo, hi = struct.unpack("=IBBBBII", data[:16])
            if origin == 5:
                covered += hi - lo + 1
                codes.add(code)
    print(f"zc {sends} {covered} {sorted(codes)}", flush=True)
    keep.clear()
    return f"{total} {h.hexdigest()}"


def fork_race(c, count):
    pid = os.fork()
    tag = b"C" if pid == 0 else b"P"
    for _ in range(count):
        c.sendall(tag * 64)
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    c.shutdown(socket.SHUT_WR)
    return "raced"


def records(c):
    buf, seen, bad = b"", {"P": 0, "C": 0}, 0
    while True:
        b = c.recv(1 << 16)
        if not b:
            break
        buf += b
        whole = len(buf) // 64 * 64
        for i in range(0, whole, 64):
            r = buf[i:i + 64]
            t = chr(r[0])
            if r == bytes([r[0]]) * 64 and t in seen:
                seen[t] += 1
            else:
                bad += 1
        buf = buf[whole:]
    return f"P {seen['P']} C {seen['C']} bad {bad + (1 if buf else 0)}"


def random_bytes(total):
    rnd = random.Random(42)
    return rnd.randbytes(total)


def sendfile(c, total):
    import tempfile
    data = random_bytes(total)
    with tempfile.TemporaryFile() as f:
        f.write(data)
        f.flush()
        half, sent = total // 2, 0
        while sent < half:
            sent += os.sendfile(c.fileno(), f.fileno(), sent, min(1 << 20, half - sent))
        f.seek(half)
        while sent < total:
            n = os.sendfile(c.fileno(), f.fileno(), None, min(1 << 20, total - sent))
            if n == 0:
                break
            sent += n
        if f.tell() != total:
            return f"file position {f.tell()}, not {total}"
    return f"{sent} {hashlib.sha256(data[:sent]).hexdigest()}"


def splice_in(c, total):
    import threading
    data = random_bytes(total)
    r, w = os.pipe()

    def feed():
        with os.fdopen(w, "wb") as f:
            f.write(data)

    t = threading.Thread(target=feed)
    t.start()
    sent = 0
    while sent < total:
        n = os.splice(r, c.fileno(), total - sent)
        if n == 0:
            break
        sent += n
    t.join()
    os.close(r)
    return f"{sent} {hashlib.sha256(data[:sent]).hexdigest()}"


def splice_out(c):
    import threading
    r, w = os.pipe()
    result = {}

    def drain():
        h, n = hashlib.sha256(), 0
        with os.fdopen(r, "rb") as f:
            while True:
                b = f.read(1 << 16)
                if not b:
                    break
                h.update(b)
                n += len(b)
        result["out"] = f"{n} {h.hexdigest()}"

    t = threading.Thread(target=drain)
    t.start()
    while os.splice(c.fileno(), w, 1 << 20) > 0:
        pass
    os.close(w)
    t.join()
    return result["out"]


def fionread(c):
    import fcntl
    import struct
    import termios
    select.select([c], [], [], 30)
    last, n = -1, 0
    for _ in range(100):
        n = struct.unpack("i", fcntl.ioctl(c.fileno(), termios.FIONREAD, b"\0\0\0\0"))[0]
        if n == last:
            break
        last = n
        time.sleep(0.05)
    print(f"fionread {n}", flush=True)
    return sink(c)


class _IoVec(__import__("ctypes").Structure):
    import ctypes as _c
    _fields_ = [("base", _c.c_void_p), ("len", _c.c_size_t)]


def _mmsg_types():
    import ctypes as C

    class MsgHdr(C.Structure):
        _fields_ = [("name", C.c_void_p), ("namelen", C.c_uint32), ("iov", C.POINTER(_IoVec)),
                    ("iovlen", C.c_size_t), ("control", C.c_void_p), ("controllen", C.c_size_t),
                    ("flags", C.c_int)]

    class MMsgHdr(C.Structure):
        _fields_ = [("hdr", MsgHdr), ("len", C.c_uint)]

    libc = C.CDLL(None, use_errno=True)
    return C, MMsgHdr, libc


def _messages(C, MMsgHdr, iovs):
    """An mmsghdr array, one iovec each."""
    msgs = (MMsgHdr * len(iovs))()
    for j, iov in enumerate(iovs):
        msgs[j].hdr.iov = C.pointer(iov)
        msgs[j].hdr.iovlen = 1
    return msgs


def mmsg_send(c, count):
    C, MMsgHdr, libc = _mmsg_types()
    h, sent, i = hashlib.sha256(), 0, 0
    while i < count:
        k = min(8, count - i)
        bufs = [C.create_string_buffer(bytes([(i + j) % 251]) * 100, 100) for j in range(k)]
        iovs = [_IoVec(C.cast(b, C.c_void_p), 100) for b in bufs]
        msgs = _messages(C, MMsgHdr, iovs)
        n = libc.sendmmsg(c.fileno(), msgs, k, 0)
        if n <= 0:
            return f"sendmmsg failed: {os.strerror(C.get_errno())}"
        for j in range(n):
            if msgs[j].len != 100:
                return f"short message {msgs[j].len}"
            h.update(bufs[j].raw)
            sent += 100
        i += n
    return f"{sent} {h.hexdigest()}"


def mmsg_sink(c):
    C, MMsgHdr, libc = _mmsg_types()
    bufs = [C.create_string_buffer(4096) for _ in range(8)]
    iovs = [_IoVec(C.cast(b, C.c_void_p), 4096) for b in bufs]
    h, total = hashlib.sha256(), 0
    while True:
        msgs = _messages(C, MMsgHdr, iovs)
        n = libc.recvmmsg(c.fileno(), msgs, 8, 0x10000, None)
        if n < 0:
            return f"recvmmsg failed: {os.strerror(C.get_errno())}"
        ended = False
        for j in range(n):
            if msgs[j].len == 0:
                ended = True
                break
            h.update(bufs[j].raw[:msgs[j].len])
            total += msgs[j].len
        if ended or n == 0:
            return f"{total} {h.hexdigest()}"


def vec_send(c, count):
    h, sent = hashlib.sha256(), 0
    for i in range(count):
        bufs = [bytes([(i + k) % 251]) * size for k, size in enumerate((1, 100, 1000, 4000, 60000))]
        n = c.sendmsg(bufs)
        if n != sum(map(len, bufs)):
            return f"short sendmsg {n}"
        for b in bufs:
            h.update(b)
        sent += n
    return f"{sent} {h.hexdigest()}"


def _libc_waits():
    """ppoll, pselect and epoll_pwait2 as the program's own calls (the global scope, where
    a preloaded library's come first)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)

    class PollFd(ctypes.Structure):
        _fields_ = [("fd", ctypes.c_int), ("events", ctypes.c_short), ("revents", ctypes.c_short)]

    class TimeSpec(ctypes.Structure):
        _fields_ = [("sec", ctypes.c_long), ("nsec", ctypes.c_long)]

    def ppoll(fd, secs):
        p = PollFd(fd, select.POLLIN, 0)
        return libc.ppoll(ctypes.byref(p), 1, ctypes.byref(TimeSpec(secs, 0)), None) > 0

    def pselect(fd, secs):
        bits = (ctypes.c_uint64 * 16)()
        bits[fd // 64] |= 1 << (fd % 64)
        return libc.pselect(fd + 1, bits, None, None, ctypes.byref(TimeSpec(secs, 0)), None) > 0

    def epoll2(epfd, fd, secs):
        import struct
        size = 12 if os.uname().machine == "x86_64" else 16
        buf = ctypes.create_string_buffer(size * 4)
        n = libc.epoll_pwait2(epfd, buf, 4, ctypes.byref(TimeSpec(secs, 0)), None)
        off = 4 if size == 12 else 8
        return any(struct.unpack_from("<I", buf.raw, i * size + off)[0] == fd for i in range(max(n, 0)))

    return ppoll, pselect, epoll2


def echo_waits(c, waiters):
    """Echoes one message per waiter, each waited for with that waiter (see MODE)."""
    ep = select.epoll()
    ep.register(c.fileno(), select.EPOLLIN)
    # An always-ready descriptor in the instance: a one-event wait must still meet the
    # connection's bytes in turn.
    pr, pw = os.pipe()
    done = 0
    buf = b""
    for i, w in enumerate(waiters):
        while b"\n" not in buf:
            c.setblocking(w != "recv")
            if w == "epoll":
                ready = bool(ep.poll(20))
            elif w == "epoll1":
                ep.register(pw, select.EPOLLOUT)
                deadline, ready = time.monotonic() + 20, False
                while not ready and time.monotonic() < deadline:
                    ready = any(fd == c.fileno() for fd, _ in ep.poll(20, 1))
                ep.unregister(pw)
            elif w in ("ppoll", "pselect", "epoll2"):
                ppoll, pselect, epoll2 = _libc_waits()
                if w == "ppoll":
                    ready = ppoll(c.fileno(), 20)
                elif w == "pselect":
                    ready = pselect(c.fileno(), 20)
                else:
                    ready = epoll2(ep.fileno(), c.fileno(), 20)
            elif w == "poll":
                p = select.poll()
                p.register(c.fileno(), select.POLLIN)
                ready = bool(p.poll(20000))
            elif w == "select":
                ready = bool(select.select([c], [], [], 20)[0])
            else:
                c.settimeout(20)
                ready = True
            if not ready:
                print(f"hung at {i} {w}", flush=True)
                return None
            try:
                b = c.recv(4096)
            except BlockingIOError:
                print("spurious", flush=True)
                return None
            except socket.timeout:
                print(f"hung at {i} {w}", flush=True)
                return None
            if not b:
                return f"echoed {done} (end of file)"
            buf += b
        line, _, buf = buf.partition(b"\n")
        c.setblocking(True)
        c.sendall(line + b"\n")
        done += 1
    os.close(pr)
    os.close(pw)
    ep.close()
    return f"echoed {done}"


def pings(c, count):
    """Sends COUNT messages, each after the answer to the one before (see MODE)."""
    c.settimeout(30)
    got = b""
    for i in range(count):
        if i % 2:
            time.sleep(0.05)
        c.sendall(f"{i}\n".encode())
        want = f"{i}\n".encode()
        try:
            while not got.endswith(b"\n"):
                b = c.recv(64)
                if not b:
                    break
                got += b
        except socket.timeout:
            return f"no answer to {i}"
        if got != want:
            return f"no answer to {i}: {got!r}"
        got = b""
    return f"answered {count}"


def recv_exact(c, n):
    b = b""
    while len(b) < n:
        more = c.recv(n - len(b))
        if not more:
            return None
        b += more
    return b


def block_then_select(c):
    """Blocking reads of a 4-byte length and its body, then a select that must not say
    readable: the peer (smc_hostile.py's late-bell) writes the next message only once this
    side sleeps in its next read. Prints "<bytes> <sha256>" of the bodies at the end of
    the stream, or "readable for nothing after <n>"."""
    h, total, n = hashlib.sha256(), 0, 0
    while True:
        head = recv_exact(c, 4)
        if head is None:
            return f"{total} {h.hexdigest()}"
        body = recv_exact(c, int.from_bytes(head, "big"))
        if body is None:
            return f"cut after {n}"
        h.update(body)
        total += len(body)
        n += 1
        if select.select([c], [], [], 0.02)[0]:
            return f"readable for nothing after {n}"


def run_mode(c, mode):
    parts = mode.split("+")
    out = ""
    for p in parts:
        kind, _, arg = p.partition(":")
        if kind == "sink":
            out = sink(c)
        elif kind == "source":
            out = source(c, int(arg))
            c.shutdown(socket.SHUT_WR)
        elif kind == "source1m":
            out = source(c, int(arg), 1 << 20)
            c.shutdown(socket.SHUT_WR)
        elif kind == "small":
            out = small(c, int(arg))
            c.shutdown(socket.SHUT_WR)
        elif kind == "bursts":
            out = bursts(c, int(arg))
            c.shutdown(socket.SHUT_WR)
        elif kind == "fork-race":
            out = fork_race(c, int(arg))
        elif kind == "records":
            out = records(c)
        elif kind == "nibble":
            out = nibble(c)
        elif kind == "zerocopy":
            c.setblocking(True)
            out = zerocopy_send(c, int(arg))
            c.shutdown(socket.SHUT_WR)
        elif kind == "strict-sink":
            out = strict_sink(c, arg or "select")
        elif kind == "pause":
            time.sleep(float(arg))
        elif kind == "sendfile":
            out = sendfile(c, int(arg))
            c.shutdown(socket.SHUT_WR)
        elif kind == "splice-in":
            out = splice_in(c, int(arg))
            c.shutdown(socket.SHUT_WR)
        elif kind == "splice-out":
            out = splice_out(c)
        elif kind == "fionread":
            out = fionread(c)
        elif kind == "mmsg":
            out = mmsg_send(c, int(arg))
            c.shutdown(socket.SHUT_WR)
        elif kind == "mmsg-sink":
            out = mmsg_sink(c)
        elif kind == "trunc":
            select.select([c], [], [], 30)
            time.sleep(0.2)
            print(f"trunc {len(c.recv(int(arg), socket.MSG_TRUNC))}", flush=True)
        elif kind == "vec":
            out = vec_send(c, int(arg))
            c.shutdown(socket.SHUT_WR)
        elif kind == "gate":
            import struct
            cookie = struct.unpack("<Q", c.getsockopt(socket.SOL_SOCKET, 57, 8))[0]  # SO_COOKIE
            print(f"port {c.getsockname()[1]} cookie {cookie}", flush=True)
            deadline = time.time() + 60
            while not os.path.exists(arg) and time.time() < deadline:
                time.sleep(0.02)
        elif kind == "hold":
            print(out, flush=True)
            out = None
            time.sleep(float(arg))
        elif kind == "echo-waits":
            out = echo_waits(c, arg.split("/"))
        elif kind == "pings":
            out = pings(c, int(arg))
        elif kind == "block-then-select":
            out = block_then_select(c)
        elif kind == "sink-or-error":
            try:
                out = sink(c)
            except OSError as e:
                out = type(e).__name__
        elif kind == "echo":
            # Every byte back as it comes, in blocking writes, until the peer's end;
            # prints how many.
            n = 0
            while True:
                b = c.recv(131072)
                if not b:
                    break
                c.sendall(b)
                n += len(b)
            c.shutdown(socket.SHUT_WR)
            out = f"echoed {n}"
        elif kind == "closerange":
            # A daemon's tidy-up: every descriptor above the connection's is closed
            # (close_range). Then a pause, so that the peer is asleep when bytes come.
            os.closerange(c.fileno() + 1, 1 << 20)
            time.sleep(0.3)
        elif kind == "exec-child":
            # Another program in a child (fork, then exec), left running: the connection
            # is close-on-exec, as Python makes every descriptor, so it is not the child's.
            if os.fork() == 0:
                os.execv("/bin/sleep", ["sleep", arg or "2"])
        elif kind == "forever":
            try:
                while True:
                    c.sendall(b"x" * 65536)
            except OSError as e:
                out = type(e).__name__
    if out is not None:
        print(out, flush=True)


def listener(addr, port, backlog=16):
    s = socket.socket(family(addr), socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((addr, port))
    s.listen(backlog)
    print("listening", flush=True)
    return s


def main():
    cmd = sys.argv[1]
    if cmd == "serve":
        port, mode = int(sys.argv[2]), sys.argv[3]
        addr = sys.argv[4] if len(sys.argv) > 4 else "127.0.0.1"
        s = listener(addr, port)
        if mode.startswith("late:"):
            late, _, mode = mode[len("late:"):].partition("+")
            time.sleep(float(late))
        c, _ = s.accept()
        run_mode(c, mode)
    elif cmd == "serve-inetd":
        s = listener("127.0.0.1", int(sys.argv[2]))
        c, _ = s.accept()
        pid = os.fork()
        if pid == 0:
            os.dup2(c.fileno(), 0)
            os.dup2(c.fileno(), 1)
            os.execvp(sys.argv[3], sys.argv[3:])
        c.close()
        _, status = os.waitpid(pid, 0)
        print(f"child {os.waitstatus_to_exitcode(status)}", flush=True)
    elif cmd == "serve-subprocess":
        # As serve-inetd, the way a Python program does it: subprocess (vfork, dup2 onto
        # the child's standard input and output, close_range of the rest, exec).
        # A program run before anything else (its vfork'ed child is the first to use the
        # library in this process), then the connection's: closed here at once, while
        # the child may not have started the program yet.
        subprocess.run(["true"], check=True)
        s = listener("127.0.0.1", int(sys.argv[2]))
        c, _ = s.accept()
        child = subprocess.Popen(sys.argv[3:], stdin=c, stdout=c)
        c.close()
        print(f"child {child.wait()}", flush=True)
    elif cmd == "serve-zc":
        # A listener with SO_ZEROCOPY: its connections are to stay on TCP.
        port, mode = int(sys.argv[2]), sys.argv[3]
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.setsockopt(socket.SOL_SOCKET, SO_ZEROCOPY, 1)
        s.bind(("127.0.0.1", port))
        s.listen(16)
        print("listening", flush=True)
        c, _ = s.accept()
        run_mode(c, mode)
    elif cmd == "serve-seq":
        port, modes = int(sys.argv[2]), sys.argv[3].split(",")
        addr = sys.argv[4] if len(sys.argv) > 4 else "127.0.0.1"
        s = listener(addr, port)
        for mode in modes:
            c, _ = s.accept()
            try:
                run_mode(c, mode)
            except OSError as e:
                print(type(e).__name__, flush=True)
            c.close()
    elif cmd == "serve-in-child":
        # The parent listens first (so its side door runs), then forks; the child listens
        # on PORT itself and accepts one connection there.
        port, mode = int(sys.argv[2]), sys.argv[3]
        first = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        first.bind(("127.0.0.1", 0))
        first.listen(1)
        pid = os.fork()
        if pid == 0:
            s = listener("127.0.0.1", port)
            c, _ = s.accept()
            run_mode(c, mode)
            os._exit(0)
        os.waitpid(pid, 0)
        first.close()
    elif cmd == "serve-forked":
        port = int(sys.argv[2])
        addr = sys.argv[3] if len(sys.argv) > 3 else "127.0.0.1"
        count = int(sys.argv[4]) if len(sys.argv) > 4 else 1
        s = listener(addr, port)
        pid = os.fork()
        if pid == 0:
            for _ in range(count):
                c, _ = s.accept()
                print(sink(c), flush=True)
                c.close()
            os._exit(0)
        os.waitpid(pid, 0)
    elif cmd == "serve-workers":
        port, workers, total = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
        s = listener("127.0.0.1", port, 64)
        s.setblocking(False)
        done_r, done_w = os.pipe()
        kids = []
        for _ in range(workers):
            pid = os.fork()
            if pid == 0:
                os.close(done_r)
                while True:
                    select.select([s], [], [])
                    try:
                        c, _ = s.accept()
                    except BlockingIOError:
                        continue  # another worker took it
                    c.setblocking(True)
                    print(sink(c), flush=True)
                    c.close()
                    os.write(done_w, b"x")
            kids.append(pid)
        os.close(done_w)
        got = 0
        while got < total:
            r, _, _ = select.select([done_r], [], [], 60)
            if not r:
                break
            got += len(os.read(done_r, total - got))
        for pid in kids:
            os.kill(pid, 15)
            os.waitpid(pid, 0)
    elif cmd == "fds":
        addr, port = sys.argv[2], int(sys.argv[3])
        count = lambda: sorted(int(f) for f in os.listdir("/proc/self/fd"))
        first = socket.create_connection((addr, port))
        before = count()
        second = socket.create_connection((addr, port))
        # The handshake's own door socket is closed by the library's reaper thread, a
        # moment later: the fewest seen over a second.
        after = count()
        for _ in range(40):
            time.sleep(0.025)
            now = count()
            after = now if len(now) < len(after) else after
        print(f"fds {len(after) - len(before)} app {second.fileno()} low {sum(1 for f in after if f < 64)}", flush=True)
        first.close()
        second.close()
    elif cmd == "pipeline":
        addr, port, paths = sys.argv[2], int(sys.argv[3]), sys.argv[4:]
        c = socket.create_connection((addr, port))
        c.sendall(b"".join(f"GET {p} HTTP/1.1\r\nHost: sluice\r\n\r\n".encode() for p in paths))
        f = c.makefile("rb")
        for p in paths:
            status = f.readline().split()[1].decode()
            length = 0
            while True:
                line = f.readline()
                if line in (b"\r\n", b""):
                    break
                k, _, v = line.decode().partition(":")
                if k.strip().lower() == "content-length":
                    length = int(v)
            body = f.read(length)
            print(p, status, len(body), hashlib.sha256(body).hexdigest(), flush=True)
        c.close()
    elif cmd == "connect":
        addr, port, mode = sys.argv[2], int(sys.argv[3]), sys.argv[4]
        if mode.startswith("zcfirst+"):
            # SO_ZEROCOPY before connect: the connection is to stay on TCP.
            mode = mode[len("zcfirst+"):]
            c = socket.socket(family(addr), socket.SOCK_STREAM)
            c.setsockopt(socket.SOL_SOCKET, SO_ZEROCOPY, 1)
            c.connect((addr, port))
        elif mode.startswith("pregate:"):
            gate, _, mode = mode[len("pregate:"):].partition("+")
            c = socket.socket(family(addr), socket.SOCK_STREAM)
            c.bind(("", 0))
            run_mode(c, "gate:" + gate)
            c.connect((addr, port))
        else:
            c = socket.create_connection((addr, port))
        if mode == "fork":
            pid = os.fork()
            if pid == 0:
                c.sendall(b"child\n")
                os._exit(0)
            os.waitpid(pid, 0)
            c.sendall(b"parent\n")
            c.shutdown(socket.SHUT_WR)
            print("forked", flush=True)
        else:
            run_mode(c, mode)
    elif cmd == "echo-epoll":
        port, n = int(sys.argv[2]), int(sys.argv[3])
        addr = sys.argv[4] if len(sys.argv) > 4 else "127.0.0.1"
        s = listener(addr, port, 512)
        s.setblocking(False)
        ep = select.epoll()
        ep.register(s.fileno(), select.EPOLLIN)
        conns, done, spurious = {}, 0, 0
        while done < n:
            for fd, ev in ep.poll(10):
                if fd == s.fileno():
                    while True:
                        try:
                            c, _ = s.accept()
                        except BlockingIOError:
                            break
                        c.setblocking(False)
                        conns[c.fileno()] = c
                        ep.register(c.fileno(), select.EPOLLIN)
                else:
                    c = conns[fd]
                    try:
                        b = c.recv(4096)
                    except BlockingIOError:
                        # epoll said readable: a read that finds nothing is a fault.
                        spurious += 1
                        continue
                    if b:
                        c.sendall(b)
                    else:
                        ep.unregister(fd)
                        c.close()
                        del conns[fd]
                        done += 1
        print(f"echoed {done}" + (f" ({spurious} reads found nothing after epoll said readable)" if spurious else ""), flush=True)
    elif cmd == "connect-seq":
        addr, port, n, mode = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
        for _ in range(n):
            c = socket.create_connection((addr, port))
            run_mode(c, mode)
            c.close()
    elif cmd == "many":
        addr, port, n = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
        socks = [socket.create_connection((addr, port)) for _ in range(n)]
        for i, c in enumerate(socks):
            c.sendall(f"{i}\n".encode())
        for i, c in enumerate(socks):
            want = f"{i}\n".encode()
            got = b""
            while len(got) < len(want):
                b = c.recv(64)
                if not b:
                    break
                got += b
            assert got == want, (i, got)
        for c in socks:
            c.close()
        print(f"ok {n}", flush=True)


if __name__ == "__main__":
    main()

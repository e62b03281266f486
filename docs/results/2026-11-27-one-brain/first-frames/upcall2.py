# Per-upcall cost, two builds interleaved frame by frame: labs A and B (kernel datapath,
# 2 guests each) are up at once; for i in 1..N, on A then B: a frame from a new source MAC
# g1 -> g2 (it goes up: learning, in either build), then the same frame again (the kernel's
# alone). Prints, per lab, the median (and quartiles) of the one-way times and of the
# per-pair difference (up - kernel).
import ctypes, os, socket, sys, time, statistics as st
libc = ctypes.CDLL(None, use_errno=True)
def in_ns(name):
    fd = os.open(f"/run/netns/{name}", os.O_RDONLY)
    if libc.setns(fd, 0x40000000) != 0: raise OSError(ctypes.get_errno(), "setns")
    os.close(fd)
def open_lab(lab):
    in_ns(f"sluice-{lab}-g2")
    rx = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x88b5)); rx.bind((f"{lab}-g2", 0)); rx.settimeout(1.0)
    dst = bytes.fromhex(open(f"/sys/class/net/{lab}-g2/address").read().strip().replace(":", ""))
    in_ns(f"sluice-{lab}-g1")
    tx = socket.socket(socket.AF_PACKET, socket.SOCK_RAW); tx.bind((f"{lab}-g1", 0))
    return tx, rx, dst
def one(l, src, tag):
    tx, rx, d = l
    payload = tag.to_bytes(4, "big") + bytes(42)
    t0 = time.perf_counter(); tx.send(d + src + b"\x88\xb5" + payload)
    while True:
        data = rx.recv(2048)
        if data[14:18] == payload[:4]:
            return (time.perf_counter() - t0) * 1e6
labs = sys.argv[1:3]; n = int(sys.argv[3]); rnd = int(sys.argv[4])
L = [open_lab(x) for x in labs]
res = {x: ([], [], []) for x in labs}
for i in range(n):
    for k, lab in enumerate(labs):
        src = bytes([2, 0x77, k, rnd, (i >> 8) & 0xff, i & 0xff])
        u = one(L[k], src, 2 * i); h = one(L[k], src, 2 * i + 1)
        res[lab][0].append(u); res[lab][1].append(h); res[lab][2].append(u - h)
        time.sleep(0.002)
q = lambda v: st.quantiles(v, n=4)
for lab in labs:
    u, h, d = res[lab]
    print(f"{lab}: up {st.median(u):.1f} us (quartiles {q(u)[0]:.1f}-{q(u)[2]:.1f}); kernel {st.median(h):.1f} ({q(h)[0]:.1f}-{q(h)[2]:.1f}); up - kernel {st.median(d):.1f} ({q(d)[0]:.1f}-{q(d)[2]:.1f}); n={n}")

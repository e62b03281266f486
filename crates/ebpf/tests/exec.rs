//! The verdict executor (`sluice_exec`) in a real kernel, run on frames with
//! `BPF_PROG_TEST_RUN` inside a network namespace of the test's own: stations and verdicts
//! written by hand as the core would install them; asserted are the return code, the frame
//! the program leaves, what reaches the devices it clones to (read with a packet socket on
//! each veth's other end, 802.1Q tags included) and every counter. A key without a verdict,
//! or with one of an older generation, is a miss that goes up; an output the frame is too
//! big for is counted and gets nothing; what an input sends up beyond its budget is
//! dropped and counted; a station heard behind a tunnel where the remote table does not
//! have it is reported on the ring buffer, and the core decides whether to learn it.

mod common;
mod packet;

use std::os::fd::{AsRawFd, OwnedFd};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{Bpffs, root};
use sluice_ebpf::abi::{self, c, d};
use sluice_ebpf::exec::{Executor, Ran, RunCtx, Sizes, UpcallBudget, UpcallTags};
use sluice_wire::MacAddr;

/// `TC_ACT_OK`: on to the stack.
const OK: u32 = 0;
/// `TC_ACT_SHOT`: dropped.
const SHOT: u32 = 2;
/// `TC_ACT_REDIRECT`: to the device `bpf_redirect`/`_peer` named (a test run sends nothing).
const REDIRECT: u32 = 7;

const GEN: u64 = 41;
const SIZES: Sizes = Sizes { stations: 64, verdicts: 1024 };

const A: MacAddr = MacAddr([2, 0, 0, 0, 0, 0xa]);
const B: MacAddr = MacAddr([2, 0, 0, 0, 0, 0xb]);
const C: MacAddr = MacAddr([2, 0, 0, 0, 0, 0xc]);
const ROUTER: MacAddr = MacAddr([2, 0, 0, 0, 0, 0xee]);
const UPLINK: MacAddr = MacAddr([2, 0, 0, 0, 0, 0xf0]);
const BROADCAST: MacAddr = MacAddr([0xff; 6]);

/// Runs `f` on a thread of its own in a network namespace of its own, so that the devices
/// it makes (and any name it picks) are its alone; they go with the namespace when the
/// thread ends, whether `f` passed or panicked.
fn in_fresh_netns(f: impl FnOnce() + Send + 'static) {
    let t = std::thread::spawn(move || {
        // SAFETY: unshare(CLONE_NEWNET) moves only the calling thread into a new network
        // namespace; no memory is involved.
        let r = unsafe { libc::unshare(libc::CLONE_NEWNET) };
        assert_eq!(r, 0, "unshare(CLONE_NEWNET): {}", std::io::Error::last_os_error());
        f();
    });
    if let Err(panic) = t.join() {
        std::panic::resume_unwind(panic);
    }
}

fn sh(cmd: &str) -> String {
    let o = Command::new("sh").args(["-c", cmd]).output().unwrap();
    assert!(o.status.success(), "`{cmd}` failed: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

/// A veth pair `NAME`/`NAMEp`, up, with IPv6 off on both ends (so that they send nothing
/// of their own): the ifindexes of `NAME` and of its peer.
fn veth(name: &str) -> (u32, u32) {
    sh(&format!(
        "ip link add {name} type veth peer name {name}p && \
         sysctl -qw net.ipv6.conf.{name}.disable_ipv6=1 net.ipv6.conf.{name}p.disable_ipv6=1 && \
         ip link set {name} up && ip link set {name}p up"
    ));
    let index = |n: &str| -> u32 {
        let line = sh(&format!("ip -o link show dev {n}"));
        line.split(':').next().unwrap().trim().parse().unwrap()
    };
    (index(name), index(&format!("{name}p")))
}

/// A packet socket on one device: the frames arriving there, with their outer tag (which
/// the kernel keeps beside the frame).
struct Sniffer(OwnedFd);

/// A frame a [`Sniffer`] read: its bytes, and its outer tag (TPID, TCI) if it had one.
type Sniffed = (Vec<u8>, Option<(u16, u16)>);

impl Sniffer {
    fn on(ifindex: u32) -> Sniffer {
        let fd = packet::packet_socket();
        // SAFETY: a zeroed sockaddr_ll is a valid value; the fields set are plain integers.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = (libc::ETH_P_ALL as u16).to_be();
        sll.sll_ifindex = ifindex as i32;
        let len = std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t;
        // SAFETY: `sll` is a sockaddr_ll of `len` bytes, alive for the call.
        let r = unsafe { libc::bind(fd.as_raw_fd(), (&raw const sll).cast(), len) };
        assert_eq!(r, 0, "bind: {}", std::io::Error::last_os_error());
        Sniffer(fd)
    }

    /// The next frame arriving (not one the device sends) that `want` accepts, waiting at
    /// most `wait`; `None` if none came.
    fn next(&self, wait: Duration, want: impl Fn(&[u8]) -> bool) -> Option<Sniffed> {
        let end = Instant::now() + wait;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            let mut p = libc::pollfd { fd: self.0.as_raw_fd(), events: libc::POLLIN, revents: 0 };
            // SAFETY: one pollfd, alive for the call.
            let n = unsafe { libc::poll(&mut p, 1, left.as_millis() as libc::c_int) };
            if n <= 0 {
                return None;
            }
            if let Some(((frame, tag), incoming)) = self.read()
                && incoming
                && want(&frame)
            {
                return Some((frame, tag));
            }
        }
    }

    /// One frame, and whether it arrived (not sent).
    fn read(&self) -> Option<(Sniffed, bool)> {
        let p = packet::recv_packet(&self.0).ok()?;
        Some(((p.frame, p.tag), p.pkttype != libc::PACKET_OUTGOING))
    }
}

/// An Ethernet frame, with an 802.1Q tag in it when `tci` is given.
fn frame(dst: MacAddr, src: MacAddr, tci: Option<u16>, ethertype: u16, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(&dst.0);
    f.extend_from_slice(&src.0);
    if let Some(t) = tci {
        f.extend_from_slice(&[0x81, 0x00]);
        f.extend_from_slice(&t.to_be_bytes());
    }
    f.extend_from_slice(&ethertype.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// An IPv4 packet of `len` bytes in all from `src` to `dst`: UDP (17) or TCP (6, a
/// 20-byte header), the rest a pattern.
fn ipv4(src: [u8; 4], dst: [u8; 4], proto: u8, len: usize) -> Vec<u8> {
    let mut p = vec![0x45, 0];
    p.extend_from_slice(&(len as u16).to_be_bytes());
    p.extend_from_slice(&[0, 0, 0x40, 0, 64, proto, 0, 0]);
    p.extend_from_slice(&src);
    p.extend_from_slice(&dst);
    let l4 = if proto == 6 { 20 } else { 8 };
    let mut h = vec![0u8; l4];
    if proto == 6 {
        h[12] = 0x50;
    }
    p.extend_from_slice(&h);
    p.extend((p.len()..len).map(|i| i as u8));
    p
}

/// An ICMPv6 message of type `t` with hop limit `hops`, from `src` to `dst`.
fn icmp6(src: [u8; 16], dst: [u8; 16], t: u8, hops: u8) -> Vec<u8> {
    let mut p = vec![0x60, 0, 0, 0, 0, 24, 58, hops];
    p.extend_from_slice(&src);
    p.extend_from_slice(&dst);
    p.push(t);
    p.extend_from_slice(&[0u8; 23]);
    p
}

fn ip6(last: u8) -> [u8; 16] {
    let mut a = [0u8; 16];
    a[..2].copy_from_slice(&[0xfd, 0]);
    a[15] = last;
    a
}

/// The input on `slot`.
fn input(slot: u32) -> abi::Input {
    abi::Input { slot, ..Default::default() }
}

fn admit_key(slot: u16, tag: u8, vid: u16, dst: u8) -> abi::AdmitKey {
    abi::AdmitKey { slot, vid, tag, dst, ..Default::default() }
}

/// Stage 1: admitted to `vlan`, stage 2 reading what `mask` says.
fn admitted(vlan: u16, mask: u16) -> abi::Admit {
    abi::Admit { generation: GEN, action: abi::ACT_FORWARD, vlan, mask, ..Default::default() }
}

fn flow(slot: u16, vlan: u16, ethertype: u16, src: u8, dst: u8, dst_slot: u16) -> abi::FlowKey {
    abi::FlowKey { slot, vlan, ethertype, src, dst, dst_slot, ..Default::default() }
}

/// An output to device `ifindex`, counted at `slot`, of MTU 1500, untagged.
fn out(ifindex: u32, slot: u16, kind: u8) -> abi::Output {
    abi::Output { ifindex, slot, kind, mtu: 1500, ..Default::default() }
}

fn tagged(o: abi::Output, vid: u16) -> abi::Output {
    abi::Output { flags: o.flags | abi::OF_TAG, vid, ..o }
}

fn from_mac(o: abi::Output, mac: MacAddr) -> abi::Output {
    abi::Output { flags: o.flags | abi::OF_SRC_MAC, src_mac: mac.0, ..o }
}

fn mtu(o: abi::Output, mtu: u16) -> abi::Output {
    abi::Output { mtu, ..o }
}

fn forward(outputs: &[abi::Output]) -> abi::Verdict {
    let mut v = abi::Verdict { generation: GEN, action: abi::ACT_FORWARD, ..Default::default() };
    v.n_out = outputs.len() as u8;
    v.outputs[..outputs.len()].copy_from_slice(outputs);
    v
}

fn verdict(action: u8, cause: u8) -> abi::Verdict {
    abi::Verdict { generation: GEN, action, cause, ..Default::default() }
}

/// Asserts that port slot `slot`'s counters are `nonzero` and zero elsewhere.
#[track_caller]
fn expect(ex: &Executor, slot: u32, nonzero: &[(usize, u64)]) {
    let mut want = [0u64; c::COUNT];
    for &(i, n) in nonzero {
        want[i] = n;
    }
    let got = ex.counters(slot).v;
    let wrong: Vec<String> =
        (0..c::COUNT).filter(|&i| got[i] != want[i]).map(|i| format!("[{i}] is {}, not {}", got[i], want[i])).collect();
    assert!(wrong.is_empty(), "slot {slot}'s counters: {}", wrong.join(", "));
}

fn at(ifindex: u32) -> RunCtx {
    RunCtx { ifindex, ..Default::default() }
}

#[track_caller]
fn run(ex: &Executor, f: &[u8], ctx: &RunCtx) -> Ran {
    ex.run(f, ctx).unwrap()
}

const WAIT: Duration = Duration::from_secs(5);

#[test]
#[ignore = "system tier: needs root (BPF: the executor's programs on veths in a network namespace of its own); scripts/test.sh runs it"]
fn a_verdict_is_executed_and_a_key_without_a_current_one_goes_up() {
    if !root() {
        return;
    }
    in_fresh_netns(|| {
        let pins = Bpffs::new("sluice-exec-test");
        let mut ex = Executor::open(&pins.0, SIZES).unwrap();
        let ((i0, _), (o1, _), (up, _)) = (veth("in0"), veth("out1"), veth("upc"));
        ex.configure(GEN, up).unwrap();
        ex.set_input(i0, &input(0)).unwrap();
        ex.set_station(1, A, 0, false).unwrap();
        ex.set_station(1, B, 1, false).unwrap();
        let f = frame(B, A, None, 0x0800, &ipv4([10, 0, 0, 1], [10, 0, 0, 2], 17, 100));
        let len = f.len() as u64;

        // A device that is no input: the stack's, untouched and uncounted.
        let r = run(&ex, &f, &at(o1));
        assert_eq!((r.code, &r.frame), (OK, &f));
        expect(&ex, 1, &[]);

        // Nothing installed: stage 1 misses; the frame goes up, marked as the switch's
        // (and, from no tunnel, with no origin's tags in it).
        let r = run(&ex, &f, &at(i0));
        assert_eq!((r.code, r.mark, &r.frame), (REDIRECT, abi::SLUICE_MARK, &f));
        expect(&ex, 0, &[(c::RX_FRAMES, 1), (c::RX_BYTES, len), (c::MISSES, 1), (c::UPCALLS, 1)]);

        // Admitted to VLAN 1, but stage 2 has no verdict yet.
        ex.install_admit(&admit_key(0, abi::TAG_NONE, 0, abi::DST_UNKNOWN), &admitted(1, abi::X_DST_STATION)).unwrap();
        assert_eq!(run(&ex, &f, &at(i0)).code, REDIRECT);
        expect(&ex, 0, &[(c::RX_FRAMES, 2), (c::RX_BYTES, 2 * len), (c::MISSES, 2), (c::UPCALLS, 2)]);

        // The core's verdict for (port 0, VLAN 1, IPv4, a source behind port 0, to the
        // station behind port 1): to port 1's device.
        let key = flow(0, 1, 0x0800, abi::SRC_HERE, abi::DST_STATION, 1);
        ex.install(&key, &forward(&[out(o1, 1, abi::OUT_PEER)])).unwrap();
        let r = run(&ex, &f, &at(i0));
        assert_eq!((r.code, &r.frame, r.mark), (REDIRECT, &f, 0));
        let rx3 = [(c::RX_FRAMES, 3), (c::RX_BYTES, 3 * len)];
        expect(&ex, 0, &[rx3[0], rx3[1], (c::MISSES, 2), (c::UPCALLS, 2), (c::FORWARDED, 1), (c::COPIES, 1)]);
        expect(&ex, 1, &[(c::TX_OFFERED, 1), (c::TX_FRAMES, 1), (c::TX_BYTES, len)]);
        assert!(ex.station(1, A).unwrap().seen_ns > 0, "the source's entry was not stamped");
        assert_eq!(ex.station(1, B).unwrap().seen_ns, 0, "a destination is not a source heard from");

        // A source the table does not know makes another key: a miss.
        let unknown = frame(B, C, None, 0x0800, &ipv4([10, 0, 0, 3], [10, 0, 0, 2], 17, 100));
        assert_eq!(run(&ex, &unknown, &at(i0)).code, REDIRECT);
        assert_eq!(ex.counters(0).v[c::MISSES], 3);

        // A new generation: both verdicts are older now, and the frame is a miss again.
        ex.configure(GEN + 1, up).unwrap();
        let r = run(&ex, &f, &at(i0));
        assert_eq!((r.code, r.mark), (REDIRECT, abi::SLUICE_MARK));
        let c0 = ex.counters(0).v;
        assert_eq!((c0[c::MISSES], c0[c::UPCALLS], c0[c::FORWARDED]), (4, 4, 1));
        // Stage 1 installed again: the old stage-2 verdict is still a miss.
        let fresh = abi::Admit { generation: GEN + 1, ..admitted(1, abi::X_DST_STATION) };
        ex.install_admit(&admit_key(0, abi::TAG_NONE, 0, abi::DST_UNKNOWN), &fresh).unwrap();
        assert_eq!(run(&ex, &f, &at(i0)).code, REDIRECT);
        let c0 = ex.counters(0).v;
        assert_eq!((c0[c::MISSES], c0[c::UPCALLS], c0[c::FORWARDED]), (5, 5, 1));
        // Made again in this generation: executed.
        let v = abi::Verdict { generation: GEN + 1, ..forward(&[out(o1, 1, abi::OUT_PEER)]) };
        ex.install(&key, &v).unwrap();
        assert_eq!(run(&ex, &f, &at(i0)).code, REDIRECT);
        let c0 = ex.counters(0).v;
        assert_eq!((c0[c::MISSES], c0[c::UPCALLS], c0[c::FORWARDED]), (5, 5, 2));

        // With no upcall interface a miss is lost, and counted so.
        ex.configure(GEN + 2, 0).unwrap();
        assert_eq!(run(&ex, &f, &at(i0)).code, SHOT);
        let c0 = ex.counters(0).v;
        assert_eq!((c0[c::MISSES], c0[c::UPCALLS], c0[c::RX_DROP + d::UPCALL_LOST]), (6, 5, 1));
        assert_eq!(c0[c::RX_FRAMES], 8);
    });
}

#[test]
#[ignore = "system tier: needs root (BPF: the executor's programs on veths in a network namespace of its own); scripts/test.sh runs it"]
fn every_output_gets_its_tag_and_addresses_and_the_last_gets_the_frame_itself() {
    if !root() {
        return;
    }
    in_fresh_netns(|| {
        let pins = Bpffs::new("sluice-exec-test");
        let mut ex = Executor::open(&pins.0, SIZES).unwrap();
        let ((i0, _), (x1, x1p), (x2, x2p), (x3, _), (up, _)) =
            (veth("in0"), veth("x1"), veth("x2"), veth("x3"), veth("upc"));
        let (s1, s2) = (Sniffer::on(x1p), Sniffer::on(x2p));
        ex.configure(GEN, up).unwrap();
        ex.set_input(i0, &input(0)).unwrap();
        ex.set_station(10, A, 0, false).unwrap();

        // A broadcast arriving tagged for VLAN 10 with priority 5 (the tag in the frame, as
        // no device took it off), flooded: VLAN 20's tag to x1 (a port translating), the
        // switch's address to x2, untagged, and VLAN 10's tag to x3.
        let payload = ipv4([10, 0, 0, 1], [10, 0, 0, 255], 17, 80);
        let f = frame(BROADCAST, A, Some((5 << 13) | 10), 0x0800, &payload);
        let untagged = frame(BROADCAST, A, None, 0x0800, &payload);
        ex.install_admit(&admit_key(0, abi::TAG_8021Q, 10, abi::DST_BROADCAST), &admitted(10, 0)).unwrap();
        let v = abi::Verdict {
            flags: abi::V_FLOOD,
            ..forward(&[
                tagged(out(x1, 1, abi::OUT_PEER), 20),
                from_mac(out(x2, 2, abi::OUT_PEER), ROUTER),
                tagged(out(x3, 3, abi::OUT_EGRESS), 10),
            ])
        };
        ex.install(&flow(0, 10, 0x0800, abi::SRC_HERE, abi::DST_BROADCAST, 0), &v).unwrap();
        let r = run(&ex, &f, &at(i0));
        // The frame itself, to x3: its tag back in the skb's metadata (a test run does not
        // return it), its source as it came.
        assert_eq!((r.code, &r.frame), (REDIRECT, &untagged));
        let ours = |fr: &[u8]| fr.ends_with(&payload);
        let (got, tag) = s1.next(WAIT, ours).expect("x1 got no copy");
        assert_eq!((got, tag), (untagged.clone(), Some((0x8100, (5 << 13) | 20))));
        let (got, tag) = s2.next(WAIT, ours).expect("x2 got no copy");
        assert_eq!((got, tag), (frame(BROADCAST, ROUTER, None, 0x0800, &payload), None));
        let n = untagged.len() as u64;
        expect(&ex, 0, &[(c::RX_FRAMES, 1), (c::RX_BYTES, f.len() as u64), (c::FLOODED, 1), (c::COPIES, 3)]);
        expect(&ex, 1, &[(c::TX_OFFERED, 1), (c::TX_FRAMES, 1), (c::TX_BYTES, n + 4)]);
        expect(&ex, 2, &[(c::TX_OFFERED, 1), (c::TX_FRAMES, 1), (c::TX_BYTES, n)]);
        expect(&ex, 3, &[(c::TX_OFFERED, 1), (c::TX_FRAMES, 1), (c::TX_BYTES, n + 4)]);

        // A routed frame: to the next hop the verdict names, from the switch's address.
        ex.install_admit(&admit_key(0, abi::TAG_NONE, 0, abi::DST_UNKNOWN), &admitted(10, 0)).unwrap();
        let to_router = frame(ROUTER, A, None, 0x0800, &payload);
        let v = abi::Verdict {
            next_hop: abi::NH_MAC,
            next_mac: B.0,
            ..forward(&[from_mac(out(x3, 3, abi::OUT_PEER), ROUTER)])
        };
        ex.install(&flow(0, 10, 0x0800, abi::SRC_HERE, abi::DST_UNKNOWN, 0), &v).unwrap();
        let r = run(&ex, &to_router, &at(i0));
        assert_eq!((r.code, r.frame), (REDIRECT, frame(B, ROUTER, None, 0x0800, &payload)));
        assert_eq!(ex.counters(0).v[c::FORWARDED], 1);
    });
}

#[test]
#[ignore = "system tier: needs root (BPF: the executor's programs on veths in a network namespace of its own); scripts/test.sh runs it"]
fn an_output_the_frame_is_too_big_for_is_counted_and_gets_nothing() {
    if !root() {
        return;
    }
    in_fresh_netns(|| {
        let pins = Bpffs::new("sluice-exec-test");
        let mut ex = Executor::open(&pins.0, SIZES).unwrap();
        let ((i0, _), (x1, x1p), (x2, x2p), (x3, _), (up, _)) =
            (veth("in0"), veth("x1"), veth("x2"), veth("x3"), veth("upc"));
        let (s1, s2) = (Sniffer::on(x1p), Sniffer::on(x2p));
        ex.configure(GEN, up).unwrap();
        ex.set_input(i0, &input(0)).unwrap();
        ex.set_station(1, A, 0, false).unwrap();
        ex.install_admit(&admit_key(0, abi::TAG_NONE, 0, abi::DST_BROADCAST), &admitted(1, 0)).unwrap();
        ex.install_admit(&admit_key(0, abi::TAG_NONE, 0, abi::DST_UNKNOWN), &admitted(1, 0)).unwrap();
        let flood = flow(0, 1, 0x0800, abi::SRC_HERE, abi::DST_BROADCAST, 0);
        let unicast = flow(0, 1, 0x0800, abi::SRC_HERE, abi::DST_UNKNOWN, 0);

        // A 1500-byte packet: x1 (MTU 1400) is offered it and gets nothing; x2 gets its
        // copy, x3 the frame.
        let payload = ipv4([10, 0, 0, 1], [10, 0, 0, 255], 17, 1500);
        let f = frame(BROADCAST, A, None, 0x0800, &payload);
        let outs = [mtu(out(x1, 1, abi::OUT_PEER), 1400), out(x2, 2, abi::OUT_PEER), out(x3, 3, abi::OUT_PEER)];
        ex.install(&flood, &abi::Verdict { flags: abi::V_FLOOD, ..forward(&outs) }).unwrap();
        assert_eq!(run(&ex, &f, &at(i0)).code, REDIRECT);
        let ours = |fr: &[u8]| fr.ends_with(&payload);
        assert!(s2.next(WAIT, ours).is_some(), "x2 got no copy");
        // (Copies leave in output order, x1's before x2's: had x1 got one, it is there.)
        assert!(s1.next(Duration::ZERO, ours).is_none(), "x1 got a frame bigger than its MTU");
        expect(&ex, 1, &[(c::TX_OFFERED, 1), (c::TX_DROP + d::OVER_MTU, 1)]);
        expect(&ex, 2, &[(c::TX_OFFERED, 1), (c::TX_FRAMES, 1), (c::TX_BYTES, f.len() as u64)]);
        expect(&ex, 3, &[(c::TX_OFFERED, 1), (c::TX_FRAMES, 1), (c::TX_BYTES, f.len() as u64)]);
        expect(&ex, 0, &[(c::RX_FRAMES, 1), (c::RX_BYTES, f.len() as u64), (c::FLOODED, 1), (c::COPIES, 3)]);

        // The last output too small: the frame is dropped there.
        let small = [mtu(out(x3, 3, abi::OUT_PEER), 1499)];
        ex.install(&unicast, &forward(&small)).unwrap();
        let f = frame(B, A, None, 0x0800, &payload);
        assert_eq!(run(&ex, &f, &at(i0)).code, SHOT);
        expect(
            &ex,
            3,
            &[(c::TX_OFFERED, 2), (c::TX_FRAMES, 1), (c::TX_BYTES, f.len() as u64), (c::TX_DROP + d::OVER_MTU, 1)],
        );

        // A GSO frame is measured by its largest segment: 3000 bytes of TCP cut at 1000
        // bytes of payload fit an MTU of 1400 (40 + 1000); cut at 1448 they do not.
        ex.install(&unicast, &forward(&[mtu(out(x3, 3, abi::OUT_PEER), 1400)])).unwrap();
        let big = frame(B, A, None, 0x0800, &ipv4([10, 0, 0, 1], [10, 0, 0, 2], 6, 3000));
        let gso = |size| RunCtx { ifindex: i0, gso_size: size, gso_segs: 3, ..Default::default() };
        assert_eq!(run(&ex, &big, &gso(1000)).code, REDIRECT);
        assert_eq!(run(&ex, &big, &gso(1448)).code, SHOT);
        assert_eq!(run(&ex, &big, &at(i0)).code, SHOT, "not GSO: the packet's own length");
        let c3 = ex.counters(3).v;
        assert_eq!((c3[c::TX_OFFERED], c3[c::TX_FRAMES], c3[c::TX_GSO], c3[c::TX_DROP + d::OVER_MTU]), (5, 2, 1, 3));
        // Segments so small they would make thousands of frames: the core's bound.
        assert_eq!(run(&ex, &big, &gso(20)).code, SHOT);
        assert_eq!(ex.counters(0).v[c::RX_DROP + d::GSO_LIMIT], 1);
        assert_eq!(ex.counters(3).v[c::TX_OFFERED], 5);
    });
}

#[test]
#[ignore = "system tier: needs root (BPF: the executor's programs on veths in a network namespace of its own); scripts/test.sh runs it"]
fn layer_3_keys_are_read_as_the_mask_asks_and_next_hops_come_from_the_tables() {
    if !root() {
        return;
    }
    in_fresh_netns(|| {
        let pins = Bpffs::new("sluice-exec-test");
        let mut ex = Executor::open(&pins.0, SIZES).unwrap();
        let ((i0, _), (x1, _), (x2, _), (up, _)) = (veth("in0"), veth("x1"), veth("x2"), veth("upc"));
        ex.configure(GEN, up).unwrap();
        ex.set_input(i0, &input(0)).unwrap();
        ex.set_station(1, A, 0, false).unwrap();
        ex.set_owner("10.0.0.2".parse().unwrap(), 1).unwrap();
        let mask = abi::X_SRC_MAC | abi::X_SRC_IP | abi::X_L3;
        for dst in [abi::DST_UNKNOWN, abi::DST_GROUP] {
            ex.install_admit(&admit_key(0, abi::TAG_NONE, 0, dst), &admitted(1, mask)).unwrap();
        }
        let l3 = |owner: u16, claim: u8, src_ip: &[u8], l3: u8| {
            let mut k = flow(0, 1, 0x0800, abi::SRC_HERE, abi::DST_UNKNOWN, 0);
            k.owner = owner;
            k.claim = claim;
            k.src_ip[..src_ip.len()].copy_from_slice(src_ip);
            k.l3 = l3;
            k.src_mac = A.0;
            k
        };

        // To a guest's address: owned by slot 1 (owner 2 in the key), rewritten to the
        // guest's MAC address and the switch's.
        let p = ipv4([10, 0, 0, 1], [10, 0, 0, 2], 17, 60);
        let to_guest = l3(2, abi::CLAIM_V4, &[10, 0, 0, 1], abi::L3X_READABLE);
        let v = abi::Verdict {
            next_hop: abi::NH_MAC,
            next_mac: B.0,
            ..forward(&[from_mac(out(x1, 1, abi::OUT_PEER), ROUTER)])
        };
        ex.install(&to_guest, &v).unwrap();
        let r = run(&ex, &frame(ROUTER, A, None, 0x0800, &p), &at(i0));
        assert_eq!((r.code, r.frame), (REDIRECT, frame(B, ROUTER, None, 0x0800, &p)));
        assert_eq!(ex.counters(0).v[c::FORWARDED], 1);

        // To the LAN: the neighbour table says the next hop; without its entry the frame
        // goes up to wait for it (an upcall, not a miss).
        let p = ipv4([10, 0, 0, 1], [192, 0, 2, 9], 17, 60);
        let v = abi::Verdict { next_hop: abi::NH_NEIGH, ..forward(&[from_mac(out(x2, 2, abi::OUT_EGRESS), UPLINK)]) };
        ex.install(&l3(0, abi::CLAIM_V4, &[10, 0, 0, 1], abi::L3X_READABLE), &v).unwrap();
        let f = frame(ROUTER, A, None, 0x0800, &p);
        let r = run(&ex, &f, &at(i0));
        assert_eq!((r.code, &r.frame), (REDIRECT, &f));
        let c0 = ex.counters(0).v;
        assert_eq!((c0[c::UPCALLS], c0[c::MISSES], c0[c::FORWARDED]), (1, 0, 1));
        ex.set_neighbour(1, "192.0.2.9".parse().unwrap(), C).unwrap();
        let r = run(&ex, &f, &at(i0));
        assert_eq!((r.code, r.frame), (REDIRECT, frame(C, UPLINK, None, 0x0800, &p)));
        expect(&ex, 2, &[(c::TX_OFFERED, 1), (c::TX_FRAMES, 1), (c::TX_BYTES, f.len() as u64)]);

        // Neighbour discovery: ICMPv6 with its type and hop limit in the key; the verdict
        // sends it up.
        let mut nd = flow(0, 1, 0x86dd, abi::SRC_HERE, abi::DST_GROUP, 0);
        (nd.claim, nd.src_ip, nd.src_mac) = (abi::CLAIM_V6, ip6(1), A.0);
        (nd.l3, nd.proto, nd.icmp6_type) = (abi::L3X_READABLE | abi::L3X_HOP255, 58, 135);
        ex.install(&nd, &verdict(abi::ACT_UP, 0)).unwrap();
        let f = frame(MacAddr([0x33, 0x33, 0xff, 0, 0, 2]), A, None, 0x86dd, &icmp6(ip6(1), ip6(2), 135, 255));
        assert_eq!(run(&ex, &f, &at(i0)).code, REDIRECT);
        let c0 = ex.counters(0).v;
        assert_eq!((c0[c::UPCALLS], c0[c::MISSES]), (2, 0));
        // Another hop limit is another key.
        let f = frame(MacAddr([0x33, 0x33, 0xff, 0, 0, 2]), A, None, 0x86dd, &icmp6(ip6(1), ip6(2), 135, 64));
        assert_eq!(run(&ex, &f, &at(i0)).code, REDIRECT);
        assert_eq!(ex.counters(0).v[c::MISSES], 1);

        // An ARP message cut short: too short to say its sender, unreadable. (A test run
        // refuses IP frames shorter than their header.)
        let mut cut = l3(0, abi::CLAIM_SHORT, &[], 0);
        cut.ethertype = 0x0806;
        ex.install(&cut, &verdict(abi::ACT_DROP, d::MALFORMED as u8)).unwrap();
        let short = frame(ROUTER, A, None, 0x0806, &[0, 1, 8, 0, 6, 4, 0, 1, 2, 0, 0, 0, 0, 0xa, 10, 0]);
        assert_eq!(run(&ex, &short, &at(i0)).code, SHOT);
        let c0 = ex.counters(0).v;
        assert_eq!((c0[c::RX_DROP + d::MALFORMED], c0[c::MISSES]), (1, 1));
    });
}

#[test]
#[ignore = "system tier: needs root (BPF: the executor's programs on veths in a network namespace of its own); scripts/test.sh runs it"]
fn sources_are_answered_from_the_tables_and_the_hosts_frames_reach_it() {
    if !root() {
        return;
    }
    in_fresh_netns(|| {
        let pins = Bpffs::new("sluice-exec-test");
        let mut ex = Executor::open(&pins.0, SIZES).unwrap();
        let ((i0, _), (i4, _), (up, upp)) = (veth("in0"), veth("in4"), veth("upc"));
        let s_up = Sniffer::on(upp);
        ex.configure(GEN, up).unwrap();
        ex.set_input(i0, &input(0)).unwrap();
        ex.install_admit(&admit_key(0, abi::TAG_NONE, 0, abi::DST_UNKNOWN), &admitted(1, abi::X_LOCKS)).unwrap();
        ex.set_station(1, B, 2, true).unwrap();
        ex.set_station(1, C, 2, false).unwrap();
        ex.set_lock(A, Some(3)).unwrap();
        let p = ipv4([10, 0, 0, 1], [10, 0, 0, 2], 17, 60);
        // Each answer for the source is a key of its own; each verdict here drops with a
        // cause of its own, so the counters say which key the frame had.
        let src_keys = [
            (A, abi::SRC_LOCKED, d::SPOOFED_MAC),
            (B, abi::SRC_STATIC, d::VLAN_FILTER),
            (C, abi::SRC_ELSEWHERE, d::ISOLATED),
            (MacAddr([0; 6]), abi::SRC_UNLEARNABLE, d::NOT_IP),
            (MacAddr([2, 0, 0, 0, 0, 0x99]), abi::SRC_ABSENT, d::NO_ROUTE),
        ];
        for (_, src, cause) in src_keys {
            let k = flow(0, 1, 0x0800, src, abi::DST_UNKNOWN, 0);
            ex.install(&k, &verdict(abi::ACT_DROP, cause as u8)).unwrap();
        }
        for (mac, _, cause) in src_keys {
            assert_eq!(run(&ex, &frame(UPLINK, mac, None, 0x0800, &p), &at(i0)).code, SHOT);
            assert_eq!(ex.counters(0).v[c::RX_DROP + cause], 1, "{mac}");
        }
        // Locked to the input itself is no lock: the station table answers (absent).
        ex.set_lock(A, Some(0)).unwrap();
        assert_eq!(run(&ex, &frame(UPLINK, A, None, 0x0800, &p), &at(i0)).code, SHOT);
        assert_eq!(ex.counters(0).v[c::RX_DROP + d::NO_ROUTE], 2);
        assert_eq!(ex.counters(0).v[c::MISSES], 0);

        // An uplink whose device may be the host's interface.
        let host =
            abi::Input { slot: 4, flags: abi::IN_OWN_MAC | abi::IN_HOST, own_mac: UPLINK.0, ..Default::default() };
        ex.set_input(i4, &host).unwrap();
        let host_only = abi::Admit { generation: GEN, action: abi::ACT_HOST, ..Default::default() };
        ex.install_admit(&admit_key(4, abi::TAG_NONE, 0, abi::DST_OWN), &host_only).unwrap();
        // Its own frames are the host's: on to the stack, not the switch's to count.
        let mine = frame(UPLINK, B, None, 0x0800, &p);
        let r = run(&ex, &mine, &at(i4));
        assert_eq!((r.code, r.frame), (OK, mine));
        expect(&ex, 4, &[]);
        // A group frame with no verdict yet: a copy up, tagged with the input's slot, and
        // the frame itself on to the host.
        let group = frame(BROADCAST, B, None, 0x0800, &p);
        let r = run(&ex, &group, &at(i4));
        assert_eq!((r.code, &r.frame), (OK, &group));
        let len = group.len() as u64;
        expect(&ex, 4, &[(c::RX_FRAMES, 1), (c::RX_BYTES, len), (c::MISSES, 1), (c::UPCALLS, 1)]);
        let (got, tag) = s_up.next(WAIT, |fr: &[u8]| fr.ends_with(&p)).expect("no copy went up");
        assert_eq!((got, tag), (group.clone(), Some((0x88a8, 4))));
        // One the port does not admit: counted as dropped, and the host's all the same.
        let drop_for_host = abi::Admit {
            generation: GEN,
            action: abi::ACT_DROP,
            cause: d::VLAN_FILTER as u8,
            flags: abi::V_HOST,
            ..Default::default()
        };
        ex.install_admit(&admit_key(4, abi::TAG_8021Q, 7, abi::DST_BROADCAST), &drop_for_host).unwrap();
        let r = run(&ex, &frame(BROADCAST, B, Some(7), 0x0800, &p), &at(i4));
        assert_eq!(r.code, OK);
        assert_eq!(ex.counters(4).v[c::RX_DROP + d::VLAN_FILTER], 1);
    });
}

#[test]
#[ignore = "system tier: needs root (BPF: the executor's programs on veths in a network namespace of its own); scripts/test.sh runs it"]
fn a_port_that_misses_faster_than_its_budget_loses_the_excess_counted_and_a_trickle_loses_nothing() {
    if !root() {
        return;
    }
    in_fresh_netns(|| {
        let pins = Bpffs::new("sluice-exec-test");
        let mut ex = Executor::open(&pins.0, SIZES).unwrap();
        let ((i0, _), (i1, _), (i4, _), (up, _)) = (veth("in0"), veth("in1"), veth("in4"), veth("upc"));
        ex.configure(GEN, up).unwrap();
        ex.set_input(i0, &input(0)).unwrap();
        let p = ipv4([10, 0, 0, 1], [10, 0, 0, 2], 17, 60);
        // A guest sending from ever new source addresses: with no verdicts installed, every
        // frame is a miss.
        let spray = |n: u8| frame(B, MacAddr([2, 0, 0, 0, 1, n]), None, 0x0800, &p);
        let len = spray(0).len() as u64;

        // A trickle: a budget of one upcall at once, a thousand a second, and frames at
        // least 5 ms apart (a sleep is never shorter): each finds its token back.
        ex.set_upcall_budget(UpcallBudget { rate: 1000, burst: 1 }).unwrap();
        for n in 0..20 {
            std::thread::sleep(Duration::from_millis(5));
            assert_eq!(run(&ex, &spray(n), &at(i0)).code, REDIRECT, "frame {n} of the trickle");
        }
        expect(&ex, 0, &[(c::RX_FRAMES, 20), (c::RX_BYTES, 20 * len), (c::MISSES, 20), (c::UPCALLS, 20)]);

        // A burst: four upcalls at once, one a second. Ten misses in a row: four go up,
        // six are dropped and counted. (Exact when the ten take less than the second a
        // token takes to come back; on a machine too busy for that, the burst is tried
        // again on a fresh input slot.)
        ex.set_upcall_budget(UpcallBudget { rate: 1, burst: 4 }).unwrap();
        let mut exact = None;
        for slot in 1..4u32 {
            ex.set_input(i1, &input(slot)).unwrap();
            let start = Instant::now();
            let codes: Vec<u32> = (0..10).map(|n| run(&ex, &spray(n), &at(i1)).code).collect();
            if start.elapsed() < Duration::from_millis(900) {
                exact = Some((slot, codes));
                break;
            }
        }
        let (slot, codes) = exact.expect("three bursts of ten runs each took a second or more");
        assert_eq!(codes, [[REDIRECT; 4].as_slice(), &[SHOT; 6]].concat());
        let limited = [(c::MISSES, 10), (c::UPCALLS, 4), (c::RX_DROP + d::UPCALL_LIMIT, 6)];
        expect(&ex, slot, &[&[(c::RX_FRAMES, 10), (c::RX_BYTES, 10 * len)], limited.as_slice()].concat());
        // Another input's budget is its own.
        assert_eq!(run(&ex, &spray(0), &at(i0)).code, REDIRECT);
        // A second later the bucket holds one upcall again.
        std::thread::sleep(Duration::from_millis(1100));
        let start = Instant::now();
        let again = [run(&ex, &spray(11), &at(i1)).code, run(&ex, &spray(12), &at(i1)).code];
        if start.elapsed() < Duration::from_millis(900) {
            assert_eq!(again, [REDIRECT, SHOT]);
            assert_eq!(ex.counters(slot).v[c::RX_DROP + d::UPCALL_LIMIT], 7);
        }

        // On an input that may be the host's interface, a copy over the budget is not made
        // and counted; the frame still goes on to the host.
        let host = abi::Input {
            slot: 8,
            flags: abi::IN_OWN_MAC | abi::IN_HOST,
            own_mac: UPLINK.0,
            pad: [0; 2],
            ..Default::default()
        };
        ex.set_input(i4, &host).unwrap();
        let group = frame(BROADCAST, B, None, 0x0800, &p);
        let codes: Vec<u32> = (0..5).map(|_| run(&ex, &group, &at(i4)).code).collect();
        assert_eq!(codes, [OK; 5]);
        let c8 = ex.counters(8).v;
        let over = c8[c::RX_DROP + d::UPCALL_LIMIT];
        assert!(over >= 1 && c8[c::UPCALLS] + over == 5, "{} up, {over} over", c8[c::UPCALLS]);
    });
}

#[test]
#[ignore = "system tier: needs root (BPF: the executor's programs on veths in a network namespace of its own); scripts/test.sh runs it"]
fn a_station_heard_behind_a_tunnel_is_reported_and_learned_only_if_the_core_says_so() {
    use sluice_ebpf::exec::Heard;
    use sluice_ebpf::heard;
    use sluice_switch::mem::mem_port;
    use sluice_switch::tunnel::{TunnelRules, VniMap};
    use sluice_switch::{PortCaps, PortConfig, PortPolicy, Switch, SwitchConfig, Tunneled, VlanMode};
    if !root() {
        return;
    }
    in_fresh_netns(|| {
        let pins = Bpffs::new("sluice-exec-test");
        let mut ex = Executor::open(&pins.0, SIZES).unwrap();
        ex.load_tunneled().unwrap();
        let ((vx, _), (vx6, _), (up, _)) = (veth("vx"), veth("vx6"), veth("upc"));
        ex.configure(GEN, up).unwrap();
        ex.set_upcall_budget(UpcallBudget { rate: 0, burst: 0 }).unwrap();
        let (r1, r2, stranger): (std::net::IpAddr, std::net::IpAddr, std::net::IpAddr) =
            ("192.0.2.1".parse().unwrap(), "192.0.2.2".parse().unwrap(), "192.0.2.66".parse().unwrap());
        // The tunnel is slot 2 in the kernel, with two configured endpoints.
        ex.set_input(vx, &abi::Input { slot: 2, flags: abi::IN_TUNNEL, ..Default::default() }).unwrap();
        for r in [r1, r2] {
            ex.set_endpoint(vx, r).unwrap();
        }
        // The core: the tunnel and a guest.
        let mut sw = Switch::new(SwitchConfig::default()).unwrap();
        let caps = PortCaps { offload: true, lossless_input: false };
        let (tp, th) = mem_port(caps);
        th.set_tunnel(TunnelRules {
            vnis: VniMap::Single(5000),
            remotes_only: true,
            remotes: vec![r1, r2],
            evpn: false,
            announced: vec![],
        });
        let port = |name: &str| PortConfig {
            name: name.into(),
            vlan: VlanMode::Access(1),
            mtu: None,
            policy: PortPolicy::default(),
        };
        let tid = sw.add_port(port("vx"), Box::new(tp)).unwrap();
        let (gp, _gh) = mem_port(caps);
        let gid = sw.add_port(port("guest"), Box::new(gp)).unwrap();
        let port_of = |slot: u32| match slot {
            2 => Some(tid),
            0 => Some(gid),
            _ => None,
        };
        // Stage 1 as the core decides it: VNI 5000 from an endpoint joins VLAN 1, from a
        // stranger it is `unknown_endpoint`, another VNI `vlan_filter`.
        let tunnel_key = |vni: u32, endpoint: u8| abi::AdmitKey {
            slot: 2,
            dst: abi::DST_BROADCAST,
            vni,
            endpoint,
            ..Default::default()
        };
        let dropped = |cause: usize| abi::Admit {
            generation: GEN,
            action: abi::ACT_DROP,
            cause: cause as u8,
            ..Default::default()
        };
        ex.install_admit(&tunnel_key(5000, 1), &admitted(1, 0)).unwrap();
        ex.install_admit(&tunnel_key(5000, 0), &dropped(d::UNKNOWN_ENDPOINT)).unwrap();
        ex.install_admit(&tunnel_key(5001, 1), &dropped(d::VLAN_FILTER)).unwrap();
        let p = ipv4([10, 0, 0, 9], [10, 0, 0, 255], 17, 60);
        let from = |src: MacAddr| frame(BROADCAST, src, None, 0x0800, &p);
        let via = |vni: u32, sender| RunCtx { ifindex: vx, tunnel: Some((vni, sender)), ..Default::default() };
        let s_heard = |mac, sender| Heard { ifindex: vx, slot: 2, vni: 5000, vlan: 1, mac, sender };

        // A new station: its source is no station of the tunnel's yet, so the frame only
        // goes up (the core learns it from there) and nothing is reported. It goes up with
        // its origin, in two tags inside the slot's (the outer tag, in the skb's metadata,
        // is not in a test run's frame): what the core's key needs.
        let r = run(&ex, &from(A), &via(5000, r1));
        assert_eq!(r.code, REDIRECT);
        assert_eq!(ex.take_heard(64), []);
        let tags = UpcallTags::read(2 | abi::UP_TUNNEL, &r.frame[12..]).expect("the origin's tags");
        let origin = Tunneled { vni: 5000, endpoint: true };
        assert_eq!(tags, UpcallTags { slot: 2, tunnel: Some(origin), origin_len: 8, ct: None });
        let f = [&r.frame[..12], &r.frame[12 + tags.origin_len..]].concat();
        assert_eq!(f, from(A), "the frame as it came, once the origin's tags are out");
        sw.ingest_from(0, |buf| {
            buf[..12].fill(0);
            buf[12..12 + f.len()].copy_from_slice(&f);
            Some((tid, f.len(), sluice_switch::Handed { tunnel: tags.tunnel, ct: None }))
        });
        assert_eq!(sw.fib().get(1, A).map(|e| e.port), Some(tid), "the core learned the station");
        ex.set_station(1, A, 2, false).unwrap();
        // Its kind's verdict as the core installs it. A verdict of a kind the core drops
        // before learning (without `V_TEACHES`) reports nothing: the core learns nothing
        // from such a frame.
        let kind = abi::FlowKey {
            slot: 2,
            vlan: 1,
            ethertype: 0x0800,
            src: abi::SRC_HERE,
            dst: abi::DST_BROADCAST,
            ..Default::default()
        };
        let spoofed =
            abi::Verdict { generation: GEN, action: abi::ACT_DROP, cause: d::SPOOFED_IP as u8, ..Default::default() };
        ex.install(&kind, &spoofed).unwrap();
        assert_eq!(run(&ex, &from(A), &via(5000, r1)).code, SHOT);
        assert_eq!(ex.take_heard(64), [], "nothing heard from a frame the core drops before learning");
        let up = abi::Verdict { generation: GEN, action: abi::ACT_UP, flags: abi::V_TEACHES, ..Default::default() };
        ex.install(&kind, &up).unwrap();
        // Its next frames: the station is the tunnel's, its endpoint unknown in the kernel:
        // each is reported (until the core decides), and goes on as its verdict says.
        for _ in 0..2 {
            assert_eq!(run(&ex, &from(A), &via(5000, r1)).code, REDIRECT);
        }
        assert_eq!(ex.counters(2).v[c::MISSES], 1);
        assert_eq!(heard::hand_to_core(&mut ex, &mut sw, port_of, 64), (2, 2));
        assert_eq!(th.take_remotes(), [(5000, A, r1), (5000, A, r1)], "the core's tunnel learned it");
        let r = ex.remote(vx, 5000, A).expect("the kernel's remote table has it");
        assert_eq!((&r.addr[..4], r.seen_ns > 0), (&[192, 0, 2, 1][..], true));
        // Known there now: nothing more to report.
        assert_eq!(run(&ex, &from(A), &via(5000, r1)).code, REDIRECT);
        assert_eq!(ex.take_heard(64), []);
        // From the other endpoint, the station moved: reported, and the core follows it.
        run(&ex, &from(A), &via(5000, r2));
        assert_eq!(ex.take_heard(64), [s_heard(A, r2)]);
        run(&ex, &from(A), &via(5000, r2));
        assert_eq!(heard::hand_to_core(&mut ex, &mut sw, port_of, 64), (1, 1));
        assert_eq!(&ex.remote(vx, 5000, A).unwrap().addr[..4], &[192, 0, 2, 2]);

        // A stranger's frame of a VNI stage 1 has no verdict for yet goes up with its
        // origin (the sender no endpoint; the frame's own tag after the origin's).
        let tagged_f = frame(BROADCAST, A, Some(7), 0x0800, &p);
        let r = run(&ex, &tagged_f, &via(0xabcdef, stranger));
        assert_eq!(r.code, REDIRECT);
        let tags = UpcallTags::read(2 | abi::UP_TUNNEL, &r.frame[12..]).unwrap();
        assert_eq!(tags.tunnel, Some(Tunneled { vni: 0xabcdef, endpoint: false }));
        assert_eq!([&r.frame[..12], &r.frame[20..]].concat(), tagged_f);
        assert_eq!(UpcallTags::read(2, &r.frame[12..]).unwrap().tunnel, None, "no UP_TUNNEL, no origin");
        assert_eq!(UpcallTags::read(2 | abi::UP_TUNNEL, &r.frame[12..17]), None, "cut short");

        // A stranger's frame, and one of another VNI, are dropped by stage 1, counted, and
        // report nothing.
        assert_eq!(run(&ex, &from(A), &via(5000, stranger)).code, SHOT);
        assert_eq!(run(&ex, &from(A), &via(5001, r1)).code, SHOT);
        let c2 = ex.counters(2).v;
        assert_eq!((c2[c::RX_DROP + d::UNKNOWN_ENDPOINT], c2[c::RX_DROP + d::VLAN_FILTER]), (1, 1));
        // A claim on a station the core keeps elsewhere reports nothing either.
        ex.set_station(1, B, 0, false).unwrap();
        run(&ex, &from(B), &via(5000, r1));
        assert_eq!(ex.take_heard(64), []);
        // The kernel's table saying a station is the tunnel's is not the core saying so: a
        // report of one the core never learned there is refused, and nothing is written.
        ex.set_station(1, C, 2, false).unwrap();
        run(&ex, &from(C), &via(5000, r1));
        assert_eq!(heard::hand_to_core(&mut ex, &mut sw, port_of, 64), (1, 0));
        assert_eq!(ex.remote(vx, 5000, C), None);
        assert!(th.take_remotes().iter().all(|r| r.1 != C));

        // An IPv6 underlay: the sender reads as IPv6.
        let r6: std::net::IpAddr = "fd78::2".parse().unwrap();
        let v6 = abi::Input { slot: 2, flags: abi::IN_TUNNEL | abi::IN_TUNNEL_V6, ..Default::default() };
        ex.set_input(vx6, &v6).unwrap();
        ex.set_endpoint(vx6, r6).unwrap();
        run(&ex, &from(A), &RunCtx { ifindex: vx6, tunnel: Some((5000, r6)), ..Default::default() });
        assert_eq!(ex.take_heard(64), [Heard { ifindex: vx6, ..s_heard(A, r6) }]);

        // The ring is bounded: what does not fit is counted, exactly.
        let lost_before = ex.counters(2).v[c::HEARD_LOST];
        let n = 2000;
        for _ in 0..n {
            run(&ex, &from(C), &via(5000, r1));
        }
        let mut read = 0;
        loop {
            let got = ex.take_heard(256).len();
            if got == 0 {
                break;
            }
            read += got;
        }
        let lost = ex.counters(2).v[c::HEARD_LOST] - lost_before;
        assert!(lost > 0 && read > 0, "{read} read, {lost} lost");
        assert_eq!(read as u64 + lost, n, "every report read or counted");
    });
}

#[test]
#[ignore = "system tier: needs root (BPF: the executor's programs on veths in a network namespace of its own); scripts/test.sh runs it"]
fn storm_control_passes_the_burst_then_drops_counted_and_charges_only_what_the_verdict_says() {
    if !root() {
        return;
    }
    in_fresh_netns(|| {
        let pins = Bpffs::new("sluice-exec-test");
        let mut ex = Executor::open(&pins.0, SIZES).unwrap();
        let ((i0, _), (i1, _), (x1, _), (up, _)) = (veth("in0"), veth("in1"), veth("x1"), veth("upc"));
        ex.configure(GEN, up).unwrap();
        let p = ipv4([10, 0, 0, 1], [10, 0, 0, 255], 17, 60);
        let (bc, mc) =
            (frame(BROADCAST, A, None, 0x0800, &p), frame(MacAddr([1, 0, 0x5e, 0, 0, 1]), A, None, 0x0800, &p));
        let uc = frame(B, A, None, 0x0800, &p);
        // One broadcast a second, four at once: the burst passes, the rest is `storm`.
        // (Exact when a burst takes less than the second a token takes to come back; on a
        // machine too busy for that, it is tried again on a fresh slot.)
        let meter = |burst: u64| abi::Meter { unit_ps: 1_000_000_000_000, burst_ns: burst * 1_000_000_000, tat: 0 };
        let mut exact = None;
        for slot in 0..3u16 {
            ex.set_input(i0, &input(u32::from(slot))).unwrap();
            ex.set_meter(slot, abi::METER_STORM_BC, meter(4)).unwrap();
            for dst in [abi::DST_BROADCAST, abi::DST_GROUP, abi::DST_UNKNOWN] {
                ex.install_admit(&admit_key(slot, abi::TAG_NONE, 0, dst), &admitted(1, 0)).unwrap();
            }
            let outs = [out(x1, 9, abi::OUT_PEER)];
            let storm = |f| abi::Verdict { flags: abi::V_FLOOD | f, ..forward(&outs) };
            ex.install(&flow(slot, 1, 0x0800, abi::SRC_ABSENT, abi::DST_BROADCAST, 0), &storm(abi::V_STORM_BC))
                .unwrap();
            // Multicast charged to a meter never set: it passes.
            ex.install(&flow(slot, 1, 0x0800, abi::SRC_ABSENT, abi::DST_GROUP, 0), &storm(abi::V_STORM_MC)).unwrap();
            ex.install(&flow(slot, 1, 0x0800, abi::SRC_ABSENT, abi::DST_UNKNOWN, 0), &forward(&outs)).unwrap();
            let start = Instant::now();
            let codes: Vec<u32> = (0..10).map(|_| run(&ex, &bc, &at(i0)).code).collect();
            if start.elapsed() < Duration::from_millis(900) {
                exact = Some((slot, codes));
                break;
            }
        }
        let (slot, codes) = exact.expect("three bursts of ten runs each took a second or more");
        assert_eq!(codes, [[REDIRECT; 4].as_slice(), &[SHOT; 6]].concat());
        let s = u32::from(slot);
        assert_eq!(ex.counters(s).v[c::RX_DROP + d::STORM], 6);
        assert_eq!((ex.counters(s).v[c::FLOODED], ex.counters(s).v[c::MISSES]), (4, 0));
        // Multicast (its meter unset) and unicast (no flag) are not charged.
        assert!((0..10).all(|_| run(&ex, &mc, &at(i0)).code == REDIRECT));
        assert!((0..10).all(|_| run(&ex, &uc, &at(i0)).code == REDIRECT));
        assert_eq!(ex.counters(s).v[c::RX_DROP + d::STORM], 6);
        // Another slot's meter is its own; setting the same meter again keeps its state,
        // a new one starts full.
        ex.set_input(i1, &input(7)).unwrap();
        ex.install_admit(&admit_key(7, abi::TAG_NONE, 0, abi::DST_BROADCAST), &admitted(1, 0)).unwrap();
        let outs = [out(x1, 9, abi::OUT_PEER)];
        ex.install(
            &flow(7, 1, 0x0800, abi::SRC_ABSENT, abi::DST_BROADCAST, 0),
            &abi::Verdict { flags: abi::V_FLOOD | abi::V_STORM_BC, ..forward(&outs) },
        )
        .unwrap();
        ex.set_meter(7, abi::METER_STORM_BC, meter(2)).unwrap();
        let start = Instant::now();
        let first: Vec<u32> = (0..3).map(|_| run(&ex, &bc, &at(i1)).code).collect();
        ex.set_meter(7, abi::METER_STORM_BC, meter(2)).unwrap();
        let same = run(&ex, &bc, &at(i1)).code;
        ex.set_meter(7, abi::METER_STORM_BC, meter(3)).unwrap();
        let fresh = run(&ex, &bc, &at(i1)).code;
        if start.elapsed() < Duration::from_millis(900) {
            assert_eq!((first, same, fresh), (vec![REDIRECT, REDIRECT, SHOT], SHOT, REDIRECT));
        }
    });
}

#[test]
#[ignore = "system tier: needs root (BPF: the executor's programs on veths in a network namespace of its own); scripts/test.sh runs it"]
fn rate_in_polices_by_bytes_what_the_verdict_charges() {
    if !root() {
        return;
    }
    in_fresh_netns(|| {
        let pins = Bpffs::new("sluice-exec-test");
        let mut ex = Executor::open(&pins.0, SIZES).unwrap();
        let ((i0, _), (x1, _), (up, _)) = (veth("in0"), veth("x1"), veth("upc"));
        ex.configure(GEN, up).unwrap();
        let small = frame(B, A, None, 0x0800, &ipv4([10, 0, 0, 1], [10, 0, 0, 2], 17, 100));
        let big = frame(B, A, None, 0x0800, &ipv4([10, 0, 0, 1], [10, 0, 0, 2], 17, 1000));
        let (s, b) = (small.len() as u64, big.len() as u64);
        // One byte a second: nothing comes back within the test. The bucket holds two big
        // frames and one small one, exactly.
        let bytes = 2 * b + s;
        let m = abi::Meter { unit_ps: 1_000_000_000_000, burst_ns: bytes * 1_000_000_000, tat: 0 };
        ex.set_input(i0, &input(3)).unwrap();
        ex.set_meter(3, abi::METER_RATE_IN, m).unwrap();
        ex.install_admit(&admit_key(3, abi::TAG_NONE, 0, abi::DST_UNKNOWN), &admitted(1, 0)).unwrap();
        let key = flow(3, 1, 0x0800, abi::SRC_ABSENT, abi::DST_UNKNOWN, 0);
        let charged = abi::Verdict { flags: abi::V_METER_IN, ..forward(&[out(x1, 9, abi::OUT_PEER)]) };
        ex.install(&key, &charged).unwrap();
        let codes: Vec<u32> = [&big, &big, &big, &small, &small].iter().map(|f| run(&ex, f, &at(i0)).code).collect();
        assert_eq!(
            codes,
            [REDIRECT, REDIRECT, SHOT, REDIRECT, SHOT],
            "a big frame over what is left waits for nothing"
        );
        let k = ex.counters(3).v;
        assert_eq!((k[c::RX_DROP + d::RATE_LIMIT], k[c::FORWARDED], k[c::MISSES]), (2, 3, 0));
        // The same key without the charge passes: the verdict, not the port, says what is
        // charged.
        ex.install(&key, &forward(&[out(x1, 9, abi::OUT_PEER)])).unwrap();
        assert!((0..5).all(|_| run(&ex, &big, &at(i0)).code == REDIRECT));
        assert_eq!(ex.counters(3).v[c::RX_DROP + d::RATE_LIMIT], 2);
    });
}

/// A UDP datagram (or a TCP segment with `flags`) from `src:sport` to `dst:dport`.
fn l4(src: [u8; 4], dst: [u8; 4], proto: u8, sport: u16, dport: u16, flags: u8) -> Vec<u8> {
    let mut p = ipv4(src, dst, proto, 80);
    p[20..22].copy_from_slice(&sport.to_be_bytes());
    p[22..24].copy_from_slice(&dport.to_be_bytes());
    if proto == 6 {
        p[33] = flags;
    }
    p
}

#[test]
#[ignore = "system tier: needs root (BPF: the executor's programs and the kernel's conntrack in a network namespace of its own); scripts/test.sh runs it"]
fn connections_are_tracked_in_the_kernels_conntrack_as_the_verdict_commits_them() {
    if !root() {
        return;
    }
    in_fresh_netns(|| {
        let pins = Bpffs::new("sluice-exec-test");
        let mut ex = Executor::open(&pins.0, SIZES).unwrap();
        let ((i0, _), (i1, _), (o1, _), (up, _)) = (veth("in0"), veth("in1"), veth("out1"), veth("upc"));
        ex.configure(GEN, up).unwrap();
        ex.set_conntrack(4242, sluice_switch::conntrack::kernel_timeouts_ms()).unwrap();
        ex.set_input(i0, &input(0)).unwrap();
        ex.set_input(i1, &input(1)).unwrap();
        ex.set_station(1, A, 0, false).unwrap();
        ex.set_station(1, B, 1, false).unwrap();
        for slot in [0, 1] {
            ex.install_admit(
                &admit_key(slot, abi::TAG_NONE, 0, abi::DST_UNKNOWN),
                &admitted(1, abi::X_DST_STATION | abi::X_CT),
            )
            .unwrap();
        }
        let (a, b) = ([10, 0, 0, 1], [10, 0, 0, 2]);
        let key = |slot: u16, dst_slot: u16, proto: u8, ct: u8, ct_flags: u8| abi::FlowKey {
            ct,
            ct_flags,
            ct_proto: proto,
            ..flow(slot, 1, 0x0800, abi::SRC_HERE, abi::DST_STATION, dst_slot)
        };
        let pass = forward(&[out(o1, 1, abi::OUT_PEER)]);
        let commit = abi::Verdict { ct: abi::CT_COMMIT, ..pass };
        // Each state its own verdict, told apart by the drop cause it counts.
        // (A miss's key carries a TCP segment's SYN, ACK and RST: the core says which open.)
        for (proto, syn, ack) in [(6, 0x02, 0x10), (17, 0, 0)] {
            ex.install(&key(0, 1, proto, abi::CTS_MISS, syn), &commit).unwrap();
            ex.install(&key(0, 1, proto, abi::CTS_ESTABLISHED, 0), &verdict(abi::ACT_DROP, d::SAME_PORT as u8))
                .unwrap();
            ex.install(&key(1, 0, proto, abi::CTS_REPLY, 0), &verdict(abi::ACT_DROP, d::ISOLATED as u8)).unwrap();
            ex.install(&key(1, 0, proto, abi::CTS_MISS, ack), &verdict(abi::ACT_DROP, d::NOT_IP as u8)).unwrap();
        }
        ex.install(&key(1, 0, 17, abi::CTS_MISS, 0), &verdict(abi::ACT_DROP, d::NO_ROUTE as u8)).unwrap();
        let out = |p: &[u8]| frame(B, A, None, 0x0800, p);
        let back = |p: &[u8]| frame(A, B, None, 0x0800, p);
        // UDP: new (committed), then established; the reply is a reply.
        assert_eq!(run(&ex, &out(&l4(a, b, 17, 5000, 53, 0)), &at(i0)).code, REDIRECT, "new: committed, sent");
        assert_eq!(run(&ex, &out(&l4(a, b, 17, 5000, 53, 0)), &at(i0)).code, SHOT, "established");
        assert_eq!(run(&ex, &back(&l4(b, a, 17, 53, 5000, 0)), &at(i1)).code, SHOT, "reply");
        assert_eq!(run(&ex, &back(&l4(b, a, 17, 53, 5001, 0)), &at(i1)).code, SHOT, "another port: new");
        // TCP: a SYN is new, a segment of no connection invalid; after the SYN's commit the
        // SYN-ACK is a reply.
        assert_eq!(run(&ex, &back(&l4(b, a, 6, 80, 6000, 0x10)), &at(i1)).code, SHOT, "invalid");
        assert_eq!(run(&ex, &out(&l4(a, b, 6, 6000, 80, 0x02)), &at(i0)).code, REDIRECT, "SYN: committed");
        assert_eq!(run(&ex, &back(&l4(b, a, 6, 80, 6000, 0x12)), &at(i1)).code, SHOT, "SYN-ACK: a reply");
        assert_eq!(run(&ex, &out(&l4(a, b, 6, 6000, 80, 0x11)), &at(i0)).code, SHOT, "FIN: established");
        let c0 = ex.counters(0).v;
        let c1 = ex.counters(1).v;
        assert_eq!((c0[c::FORWARDED], c0[c::RX_DROP + d::SAME_PORT], c0[c::MISSES]), (2, 2, 0));
        assert_eq!(
            (c1[c::RX_DROP + d::ISOLATED], c1[c::RX_DROP + d::NO_ROUTE], c1[c::RX_DROP + d::NOT_IP], c1[c::MISSES]),
            (2, 1, 1, 0)
        );
        // The entries are the kernel's, in the zone, and the reply marked them seen (the
        // table of this thread's namespace: /proc/net is the process's).
        let table = std::fs::read_to_string("/proc/thread-self/net/nf_conntrack").expect("nf_conntrack's table");
        let ours: Vec<&str> = table.lines().filter(|l| l.contains("zone=4242")).collect();
        assert_eq!(ours.len(), 2, "{table}");
        assert!(ours.iter().all(|l| !l.contains("UNREPLIED") && l.contains("ASSURED")), "{table}");
        // The daemon's half, for frames the executor does not see: a connection the core
        // committed after an upcall is the executor's too; a lookup finds what it would.
        let ct = ex.conntrack().unwrap();
        let udp = out(&l4(a, b, 17, 7000, 53, 0));
        assert_eq!(ct.lookup(&udp).unwrap(), abi::CTS_MISS);
        assert!(ct.commit(&udp).unwrap());
        assert_eq!(run(&ex, &udp, &at(i0)).code, SHOT, "established: the executor finds the daemon's commit");
        assert_eq!(ct.lookup(&back(&l4(b, a, 17, 53, 7000, 0))).unwrap(), abi::CTS_REPLY);
        // Classes: read in the set in use; a new set, switched to, classifies anew.
        let classed = abi::FlowKey { src_class: 1, dst_class: 1, dport_class: 2, ..key(0, 1, 17, abi::CTS_MISS, 0) };
        ex.install(&classed, &pass).unwrap();
        let ip = |s: &str| s.parse::<std::net::IpAddr>().unwrap();
        assert_eq!(
            ex.write_acl_set(1, [(1, ip("10.0.0.0"), 24)], [(2, 50, 60)]).unwrap(),
            1 + 4,
            "50-51, 52-55, 56-59, 60"
        );
        let fresh = out(&l4(a, b, 17, 7001, 53, 0));
        assert_eq!(run(&ex, &fresh, &at(i0)).code, REDIRECT, "set 0 still in use: no classes, the commit verdict");
        ex.use_acl_set(GEN, 1).unwrap();
        ex.remove_acl_sets_but(1);
        let misses = ex.counters(0).v[c::MISSES];
        assert_eq!(run(&ex, &out(&l4(a, b, 17, 7002, 53, 0)), &at(i0)).code, REDIRECT, "classes 1, 1, 2");
        assert_eq!(ex.counters(0).v[c::MISSES], misses, "found");
        run(&ex, &out(&l4(a, b, 17, 7003, 61, 0)), &at(i0));
        assert_eq!(ex.counters(0).v[c::MISSES], misses + 1, "port 61: class 0, no verdict: up");
        ex.write_acl_set(2, [], []).unwrap();
        ex.use_acl_set(GEN, 2).unwrap();
        ex.remove_acl_sets_but(2);
        assert_eq!(ex.write_acl_set(1, [], []).unwrap(), 0, "set 1 removed");
    });
}

#[test]
#[ignore = "system tier: needs root (BPF: the executor's programs on veths in a network namespace of its own); scripts/test.sh runs it"]
fn a_group_frames_class_is_looked_up_in_the_mdb_and_a_new_set_id_is_a_new_key() {
    if !root() {
        return;
    }
    in_fresh_netns(|| {
        let pins = Bpffs::new("sluice-exec-mdb");
        let mut ex = Executor::open(&pins.0, SIZES).unwrap();
        let ((i0, _), (o1, _), (up, _)) = (veth("in0"), veth("out1"), veth("upc"));
        ex.configure(GEN, up).unwrap();
        ex.set_input(i0, &input(0)).unwrap();
        ex.set_station(1, A, 0, false).unwrap();
        let group = MacAddr([1, 0, 0x5e, 1, 2, 3]);
        ex.install_admit(&admit_key(0, abi::TAG_NONE, 0, abi::DST_GROUP), &admitted(1, abi::X_GROUP)).unwrap();
        let key = |class: u32| abi::FlowKey {
            group: class.to_ne_bytes(),
            ..flow(0, 1, 0x0800, abi::SRC_HERE, abi::DST_GROUP, 0)
        };
        let data = frame(group, A, None, 0x0800, &ipv4([10, 0, 0, 1], [239, 1, 2, 3], 17, 100));
        let igmp = frame(group, A, None, 0x0800, &ipv4([10, 0, 0, 1], [239, 1, 2, 3], 2, 40));
        let mdns =
            frame(MacAddr([1, 0, 0x5e, 0, 0, 0xfb]), A, None, 0x0800, &ipv4([10, 0, 0, 1], [224, 0, 0, 251], 17, 100));
        // One verdict per class, each to port 1: which one a frame finds says its class.
        let classes = [abi::GCLASS_FLOODED, abi::GCLASS_CONTROL, abi::GCLASS_UNREGISTERED, 16, 17];
        for (i, &class) in classes.iter().enumerate() {
            let mut v = forward(&[from_mac(out(o1, 1, abi::OUT_PEER), MacAddr([2, 0, 0, 0, 0x10, i as u8]))]);
            v.generation = GEN;
            ex.install(&key(class), &v).unwrap();
        }
        let class_of = |ex: &Executor, f: &[u8]| {
            let r = run(ex, f, &at(i0));
            assert_eq!(r.code, REDIRECT);
            // (Each class's verdict writes a source address of its own.)
            (r.frame[6..11] == [2, 0, 0, 0, 0x10]).then(|| classes[usize::from(r.frame[11])])
        };
        assert_eq!(class_of(&ex, &data), Some(abi::GCLASS_UNREGISTERED), "not in the mdb");
        assert_eq!(class_of(&ex, &igmp), Some(abi::GCLASS_CONTROL), "IGMP");
        assert_eq!(class_of(&ex, &mdns), Some(abi::GCLASS_FLOODED), "224.0.0.0/24 is never snooped");
        ex.set_group(1, "239.1.2.3".parse().unwrap(), Some(16)).unwrap();
        assert_eq!(class_of(&ex, &data), Some(16), "registered: its set id");
        assert_eq!(class_of(&ex, &igmp), Some(abi::GCLASS_CONTROL), "IGMP stays the core's");
        ex.set_group(1, "239.1.2.3".parse().unwrap(), Some(17)).unwrap();
        assert_eq!(class_of(&ex, &data), Some(17), "a membership change: a new key, no generation bump");
        ex.set_group(2, "239.1.2.3".parse().unwrap(), Some(16)).unwrap();
        assert_eq!(class_of(&ex, &data), Some(17), "by VLAN");
        ex.set_group(1, "239.1.2.3".parse().unwrap(), None).unwrap();
        assert_eq!(class_of(&ex, &data), Some(abi::GCLASS_UNREGISTERED));
        // Without X_GROUP the class is not read: the frame's key has 0.
        ex.install_admit(&admit_key(0, abi::TAG_NONE, 0, abi::DST_GROUP), &admitted(1, 0)).unwrap();
        assert_eq!(class_of(&ex, &data), Some(abi::GCLASS_FLOODED));
    });
}

/// One VXLAN datagram as the underlay carries it (IPv4, no options): its outer destination
/// address, VNI and inner frame; `None` for anything else.
fn vxlan_datagram(wire: &[u8]) -> Option<([u8; 4], u32, Vec<u8>)> {
    let udp = 14 + 20;
    if wire.len() < udp + 16 || wire[12..14] != [0x08, 0x00] || wire[23] != 17 || wire[udp + 2..udp + 4] != [0x12, 0xb5]
    {
        return None;
    }
    let dst = wire[30..34].try_into().ok()?;
    let h = &wire[udp + 8..udp + 16];
    let vni = u32::from_be_bytes([0, h[4], h[5], h[6]]);
    Some((dst, vni, wire[udp + 16..].to_vec()))
}

#[test]
#[ignore = "system tier: needs root (BPF: the executor's programs, a vxlan device and veths in a network namespace of its own); scripts/test.sh runs it"]
fn a_flood_into_a_tunnel_is_one_datagram_per_endpoint_each_with_its_own_key() {
    if !root() {
        return;
    }
    in_fresh_netns(|| {
        let pins = Bpffs::new("sluice-exec-test");
        let mut ex = Executor::open(&pins.0, SIZES).unwrap();
        let ((i0, _), (x1, x1p), (_, unp), (up, _)) = (veth("in0"), veth("x1"), veth("un"), veth("upc"));
        // The underlay: the local address on `un`, three endpoints behind it (static
        // neighbours, so nothing waits for ARP), every datagram read on its peer; a vxlan
        // device in external mode.
        sh("ip addr add 198.51.100.1/24 dev un && \
            ip neigh add 198.51.100.11 lladdr 02:00:00:00:01:11 dev un && \
            ip neigh add 198.51.100.12 lladdr 02:00:00:00:01:12 dev un && \
            ip neigh add 198.51.100.13 lladdr 02:00:00:00:01:13 dev un && \
            ip link add vx type vxlan external dstport 4789 && ip link set vx up");
        let vx: u32 = sh("ip -o link show dev vx").split(':').next().unwrap().trim().parse().unwrap();
        let (wire, s1) = (Sniffer::on(unp), Sniffer::on(x1p));
        ex.configure(GEN, up).unwrap();
        ex.set_upcall_budget(UpcallBudget { rate: 0, burst: 0 }).unwrap();
        ex.set_input(i0, &input(0)).unwrap();
        ex.set_station(10, A, 0, false).unwrap();
        let local: std::net::IpAddr = "198.51.100.1".parse().unwrap();
        ex.set_tunnel(vx, &sluice_ebpf::convert::tunnel(local, 64)).unwrap();
        let eps: Vec<std::net::IpAddr> =
            ["198.51.100.11", "198.51.100.12", "198.51.100.13"].iter().map(|a| a.parse().unwrap()).collect();
        ex.set_flood(vx, 5000, sluice_ebpf::convert::flood_eps(&eps).as_ref()).unwrap();

        // A broadcast flooded to a guest (x1) and into the tunnel in VNI 5000: the
        // tunnel's output last, a copy per endpoint.
        let payload = ipv4([10, 0, 0, 1], [10, 0, 0, 255], 17, 80);
        let f = frame(BROADCAST, A, None, 0x0800, &payload);
        let tunnel = abi::Output { vni: 5000, flags: abi::OF_FLOOD_EPS, ..out(vx, 3, abi::OUT_TUNNEL) };
        let v = abi::Verdict { flags: abi::V_FLOOD, ..forward(&[out(x1, 1, abi::OUT_PEER), tunnel]) };
        let ak = admit_key(0, abi::TAG_NONE, 0, abi::DST_BROADCAST);
        let fk = flow(0, 10, 0x0800, abi::SRC_HERE, abi::DST_BROADCAST, 0);
        ex.install_admit(&ak, &admitted(10, 0)).unwrap();
        ex.install(&fk, &v).unwrap();
        let datagrams = |n: usize| -> Vec<([u8; 4], u32, Vec<u8>)> {
            let mut got = Vec::new();
            while got.len() < n {
                let Some((w, _)) = wire.next(WAIT, |w| vxlan_datagram(w).is_some()) else { break };
                got.push(vxlan_datagram(&w).unwrap());
            }
            got.sort();
            got
        };
        let r = run(&ex, &f, &at(i0));
        // The frame itself goes to the last endpoint (a test run carries no redirect out);
        // the first two get clones, each with its own key.
        assert_eq!(r.code, REDIRECT);
        assert!(s1.next(WAIT, |fr| fr.ends_with(&payload)).is_some(), "the guest got no copy");
        let want = |last: u8| (1..=last).map(|i| ([198, 51, 100, 10 + i], 5000, f.clone())).collect::<Vec<_>>();
        assert_eq!(datagrams(2), want(2), "endpoints .11 and .12, the frame inside");
        expect(&ex, 3, &[(c::TX_OFFERED, 1), (c::TX_FRAMES, 1), (c::TX_BYTES, f.len() as u64)]);

        // With the host taking the frame on, every endpoint gets a clone: three datagrams,
        // to three addresses (the key lives in a per-CPU metadata dst each
        // bpf_skb_set_tunnel_key overwrites; each clone is encapsulated before the next).
        ex.install(&fk, &abi::Verdict { flags: abi::V_FLOOD | abi::V_HOST, ..v }).unwrap();
        let r = run(&ex, &f, &at(i0));
        assert_eq!(r.code, OK);
        assert_eq!(datagrams(3), want(3), "one datagram per endpoint");
        assert!(datagrams(1).is_empty(), "no more than one each");

        // A unicast destination the remote table has: that endpoint alone, as the core's
        // tunnel port sends it.
        let to_b = frame(B, A, None, 0x0800, &payload);
        ex.set_remote(vx, 5000, B, eps[1]).unwrap();
        let ak = admit_key(0, abi::TAG_NONE, 0, abi::DST_UNKNOWN);
        let fk = flow(0, 10, 0x0800, abi::SRC_HERE, abi::DST_UNKNOWN, 0);
        ex.install_admit(&ak, &admitted(10, 0)).unwrap();
        ex.install(&fk, &abi::Verdict { flags: abi::V_FLOOD | abi::V_HOST, ..v }).unwrap();
        run(&ex, &to_b, &at(i0));
        assert_eq!(datagrams(3), vec![([198, 51, 100, 12], 5000, to_b.clone())]);

        // No flood set for the tunnel: up, before anything is sent or counted there.
        let fk = flow(0, 10, 0x0800, abi::SRC_HERE, abi::DST_BROADCAST, 0);
        ex.install(&fk, &v).unwrap();
        ex.set_flood(vx, 5000, None).unwrap();
        let before = ex.counters(3).v;
        let r = run(&ex, &f, &at(i0));
        assert_eq!(r.code, REDIRECT);
        assert_eq!(ex.counters(0).v[c::UPCALLS], 1);
        assert_eq!(ex.counters(3).v, before, "nothing counted at the tunnel");
        assert!(datagrams(1).is_empty(), "nothing sent into it");
    });
}

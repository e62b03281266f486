//! The port driven by a guest without a VM: rust-vmm's frontend over a temporary socket,
//! guest memory in a memfd, queues filled by `sluice_vhost::driver` as a virtio-net driver
//! fills them. Features, frames both ways (whole GSO frames, mergeable buffers), `Full`
//! when the guest posts no buffers, hostile descriptors, a hostile guest's rings (indexes
//! that lie, indirect, zero-length and endless chains, tiny buffers: every call returns, the
//! queue is broken or the chain refused, and counted, at the cost of one walk), the
//! socket's checks, reconnection in both roles.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use sluice_switch::{OutFrame, Port, PortError, TxOutcome};
use sluice_vhost::driver::{DESC_INDIRECT, DESC_NEXT, DESC_WRITE, Driver, MEM_BASE, QUEUE_SIZE, SPARE};
use sluice_vhost::{MAX_CHAIN_DESCRIPTORS, MAX_FRAME_CHAINS, OFFERED_FEATURES, Role, VhostUserPort, open};
use sluice_wire::VNET_HDR_LEN;

const WAIT: Duration = Duration::from_secs(5);

/// This test process's own directory for sockets and files (`mkdtemp`: nobody else can
/// have put anything there), removed at exit.
fn tmp() -> &'static std::path::Path {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        use std::os::unix::ffi::OsStringExt;
        let mut t = std::env::temp_dir().join("sluice-vhost-test.XXXXXX").into_os_string().into_vec();
        t.push(0);
        // SAFETY: `t` is a NUL-terminated template that mkdtemp rewrites in place.
        let p = unsafe { libc::mkdtemp(t.as_mut_ptr().cast()) };
        assert!(!p.is_null(), "mkdtemp: {}", std::io::Error::last_os_error());
        t.pop();
        extern "C" fn remove() {
            if let Some(d) = DIR.get() {
                let _ = std::fs::remove_dir_all(d);
            }
        }
        // SAFETY: registers a plain function without captures; it runs once at exit.
        unsafe { libc::atexit(remove) };
        PathBuf::from(std::ffi::OsString::from_vec(t))
    })
}

fn sock(tag: &str) -> PathBuf {
    tmp().join(format!("{tag}.sock"))
}

/// Waits (bounded) until the port's link is up with the features negotiated and the
/// receive queue set up (the driver does not wait for the device's replies).
fn connected(p: &mut VhostUserPort) {
    let until = Instant::now() + WAIT;
    while !(p.shared().connected() && p.shared().acked() != 0 && p.rx_ready()) {
        assert!(Instant::now() < until, "no connection within 5 s: {}", p.shared().state());
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Receives one frame from the port (bounded wait).
fn recv(p: &mut VhostUserPort, buf: &mut [u8]) -> Result<usize, PortError> {
    let until = Instant::now() + WAIT;
    loop {
        if let Some(n) = p.recv(buf)? {
            return Ok(n);
        }
        assert!(Instant::now() < until, "no frame from the guest within 5 s");
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn frame(len: usize, seed: u8) -> Vec<u8> {
    let mut f: Vec<u8> = (0..len).map(|i| (i as u8).wrapping_mul(7).wrapping_add(seed)).collect();
    f[..6].copy_from_slice(&[0x02, 0, 0, 0, 0, 2]);
    f[6..12].copy_from_slice(&[0x02, 0, 0, 0, 0, 1]);
    f[12..14].copy_from_slice(&[0x08, 0x00]);
    f
}

fn out(f: &[u8]) -> OutFrame<'_> {
    OutFrame { vnet: [0; VNET_HDR_LEN], macs: &f[..12], tag: None, rest: &f[12..] }
}

fn tso_header(hdr_len: u16, mss: u16) -> [u8; 12] {
    let mut v = [0u8; 12];
    v[0] = 1; // NEEDS_CSUM
    v[1] = 1; // TCPV4
    v[2..4].copy_from_slice(&hdr_len.to_le_bytes());
    v[4..6].copy_from_slice(&mss.to_le_bytes());
    v[6..8].copy_from_slice(&34u16.to_le_bytes());
    v[8..10].copy_from_slice(&16u16.to_le_bytes());
    v
}

#[test]
fn frames_cross_both_ways_and_an_empty_receive_queue_is_full() {
    let path = sock("frames");
    let mut p = open("vm0", &path, Role::Server, true).unwrap();
    let mode = std::fs::metadata(&path).map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions())).unwrap();
    assert_eq!(mode & 0o777, 0o600, "the socket is the switch's user's only");
    let mut d = Driver::connect(&path, u64::MAX, WAIT).unwrap();
    assert_eq!(d.features, OFFERED_FEATURES, "every offered feature accepted");
    connected(&mut p);
    assert!(p.shared().state().starts_with("connected: pid"), "{}", p.shared().state());

    // Guest → switch: header and frame arrive as sent.
    let mut buf = vec![0u8; 70_000];
    for (len, seed) in [(60usize, 1u8), (1514, 2), (9000, 3)] {
        let f = frame(len, seed);
        assert!(d.send(&[0; 12], &f).unwrap());
        let n = recv(&mut p, &mut buf).unwrap();
        assert_eq!(&buf[VNET_HDR_LEN..VNET_HDR_LEN + n], &f[..]);
    }
    // A whole GSO frame with its header (a TSO send from the guest).
    let h = tso_header(54, 1448);
    let big = frame(60_000, 4);
    assert!(d.send(&h, &big).unwrap());
    let n = recv(&mut p, &mut buf).unwrap();
    assert_eq!(n, big.len());
    assert_eq!(&buf[..10], &h[..10], "the offload state crosses whole");
    assert!(d.tx_drained(WAIT).unwrap(), "every transmit chain came back used");

    // Switch → guest: nothing posted yet, so Full (the switch keeps the frame).
    let f = frame(1514, 5);
    assert_eq!(p.send(&out(&f)).unwrap(), TxOutcome::Full);
    d.post_rx(8).unwrap();
    assert_eq!(p.send(&out(&f)).unwrap(), TxOutcome::Sent);
    let r = d.recv_wait(WAIT).unwrap().expect("the frame reached the guest");
    assert_eq!(r.frame, f);
    assert_eq!(u16::from_le_bytes([r.header[10], r.header[11]]), 1);
    // A 9000-byte frame spreads over 2048-byte buffers (MRG_RXBUF): num_buffers = 5.
    d.fill_rx().unwrap();
    let jumbo = frame(9000, 6);
    assert_eq!(p.send(&out(&jumbo)).unwrap(), TxOutcome::Sent);
    let r = d.recv_wait(WAIT).unwrap().unwrap();
    assert_eq!(r.frame, jumbo);
    assert_eq!(u16::from_le_bytes([r.header[10], r.header[11]]), 5);
    // A GSO frame goes to the guest whole, header and all.
    let v = tso_header(54, 1448);
    let gso = frame(30_000, 7);
    assert_eq!(p.send(&OutFrame { vnet: v, ..out(&gso) }).unwrap(), TxOutcome::Sent);
    let r = d.recv_wait(WAIT).unwrap().unwrap();
    assert_eq!(r.frame, gso);
    assert_eq!(&r.header[..10], &v[..10]);

    // QEMU goes: the link goes down, frames to it are errors (dropped), not Full.
    drop(d);
    let until = Instant::now() + WAIT;
    while p.shared().connected() {
        assert!(Instant::now() < until, "the disconnect was not seen");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(matches!(p.send(&out(&f)), Err(PortError::Io(_))));
    // QEMU comes back: a new connection, frames flow again.
    let mut d = Driver::connect(&path, u64::MAX, WAIT).unwrap();
    connected(&mut p);
    d.post_rx(4).unwrap();
    let until = Instant::now() + WAIT;
    while p.send(&out(&f)).unwrap() != TxOutcome::Sent {
        assert!(Instant::now() < until, "the second connection never took the frame");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(d.recv_wait(WAIT).unwrap().unwrap().frame, f);
    assert_eq!(p.shared().connections.load(std::sync::atomic::Ordering::Relaxed), 2);
    drop(p);
    assert!(!path.exists(), "the port removed its socket");
}

/// The next frame the guest finds on any of its first `pairs` receive queues, and which.
fn recv_any(d: &mut Driver, pairs: usize) -> (usize, Vec<u8>) {
    let until = Instant::now() + WAIT;
    loop {
        for k in 0..pairs {
            d.select(k);
            if let Some(r) = d.recv().unwrap() {
                return (k, r.frame);
            }
        }
        assert!(Instant::now() < until, "no frame reached the guest within 5 s");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Several queue pairs (VIRTIO_NET_F_MQ, as QEMU's `queues=N,mq=on`): the guest's frames
/// are taken from every transmit queue; the switch's go to the receive queue of their
/// conversation's pair, the same one every time, and only to the pairs the guest enabled
/// (Linux enables one per vCPU; a frame for a pair it left disabled would be lost).
#[test]
fn several_queue_pairs_carry_frames_and_only_enabled_pairs_receive() {
    use vhost::vhost_user::VhostUserFrontend;
    let path = sock("mq");
    let mut p = open("vm2", &path, Role::Server, true).unwrap();
    let mut d = Driver::connect_pairs(&path, u64::MAX, 2, WAIT).unwrap();
    connected(&mut p);
    let until = Instant::now() + WAIT;
    while p.pairs_in_use() != 2 {
        assert!(Instant::now() < until, "the second queue pair was never set up: {}", p.pairs_in_use());
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(p.link_state().unwrap().contains("2 queue pairs"), "{:?}", p.link_state());

    // Guest → switch on each transmit queue.
    let mut buf = vec![0u8; 70_000];
    for k in 0..2 {
        d.select(k);
        let f = frame(1000, k as u8);
        assert!(d.send(&[0; 12], &f).unwrap());
        let n = recv(&mut p, &mut buf).unwrap();
        assert_eq!(&buf[VNET_HDR_LEN..VNET_HDR_LEN + n], &f[..], "the frame sent on pair {k}");
    }

    // Switch → guest: 16 conversations (destination MACs) spread over both pairs, each
    // always on the same one.
    for k in 0..2 {
        d.select(k);
        d.fill_rx().unwrap();
    }
    let conv = |c: u8, seed: u8| {
        let mut f = frame(200, seed);
        f[5] = c;
        f
    };
    let mut pair_of = [0usize; 16];
    for c in 0..16u8 {
        let f = conv(c, 1);
        assert_eq!(p.send(&out(&f)).unwrap(), TxOutcome::Sent);
        let (k, got) = recv_any(&mut d, 2);
        assert_eq!(got, f);
        pair_of[usize::from(c)] = k;
    }
    assert!(pair_of.contains(&0) && pair_of.contains(&1), "conversations on both pairs: {pair_of:?}");
    for c in 0..16u8 {
        let f = conv(c, 2);
        assert_eq!(p.send(&out(&f)).unwrap(), TxOutcome::Sent);
        assert_eq!(recv_any(&mut d, 2), (pair_of[usize::from(c)], f), "conversation {c} changed pairs");
    }

    // The guest goes down to one pair (`ethtool -L eth0 combined 1`: QEMU disables the
    // second): every conversation arrives on the first, none is lost.
    d.frontend().set_vring_enable(2, false).unwrap();
    d.frontend().set_vring_enable(3, false).unwrap();
    let until = Instant::now() + WAIT;
    while p.pairs_in_use() != 1 {
        assert!(Instant::now() < until, "the second pair was never disabled: {}", p.pairs_in_use());
        std::thread::sleep(Duration::from_millis(5));
    }
    for c in 0..16u8 {
        let f = conv(c, 3);
        assert_eq!(p.send(&out(&f)).unwrap(), TxOutcome::Sent);
        assert_eq!(recv_any(&mut d, 2), (0, f), "conversation {c} went to a disabled pair");
    }
    assert_eq!(p.counts().no_link, 0, "nothing was sent to a queue the guest does not use");
}

#[test]
fn a_guest_without_offloads_gets_segments_with_checksums() {
    use virtio_bindings::virtio_net::{VIRTIO_NET_F_GUEST_CSUM, VIRTIO_NET_F_GUEST_TSO4, VIRTIO_NET_F_GUEST_TSO6};
    let path = sock("nooffload");
    let mut p = open("vm1", &path, Role::Server, true).unwrap();
    let mask = !((1u64 << VIRTIO_NET_F_GUEST_CSUM) | (1 << VIRTIO_NET_F_GUEST_TSO4) | (1 << VIRTIO_NET_F_GUEST_TSO6));
    let mut d = Driver::connect(&path, mask, WAIT).unwrap();
    connected(&mut p);
    d.fill_rx().unwrap();
    // A TCP/IPv4 GSO frame of 3 segments.
    let payload = 3000usize;
    let mut f = frame(14 + 20 + 20 + payload, 0);
    let ip = &mut f[14..34];
    ip.fill(0);
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&((20 + 20 + payload) as u16).to_be_bytes());
    ip[8] = 64;
    ip[9] = 6;
    ip[12..16].copy_from_slice(&[10, 0, 0, 1]);
    ip[16..20].copy_from_slice(&[10, 0, 0, 2]);
    let tcp = &mut f[34..54];
    tcp.fill(0);
    tcp[12] = 0x50;
    tcp[13] = 0x18;
    assert_eq!(p.send(&OutFrame { vnet: tso_header(54, 1000), ..out(&f) }).unwrap(), TxOutcome::Sent);
    let mut total = 0;
    for _ in 0..3 {
        let r = d.recv_wait(WAIT).unwrap().expect("a segment");
        assert_eq!(&r.header[..10], &[0u8; 10], "plain frames for a guest without offloads");
        assert!(r.frame.len() <= 54 + 1000);
        let l4 = &r.frame[34..];
        let s = sluice_wire::checksum::pseudo_v4([10, 0, 0, 1], [10, 0, 0, 2], 6, l4.len() as u32);
        assert_eq!(sluice_wire::checksum::fold(sluice_wire::checksum::sum(l4, s)), 0, "the TCP checksum is complete");
        total += r.frame.len() - 54;
    }
    assert_eq!(total, payload);
}

#[test]
fn hostile_descriptors_are_refused_counted_and_harm_nothing() {
    use vm_memory::{Bytes, GuestAddress};
    let path = sock("hostile");
    let mut p = open("vm2", &path, Role::Server, true).unwrap();
    let mut d = Driver::connect(&path, u64::MAX, WAIT).unwrap();
    connected(&mut p);
    let mut buf = vec![0u8; 70_000];
    let spare = MEM_BASE + 0x40_0000;
    // A descriptor pointing outside the guest's memory.
    d.write_desc(true, 200, 0xdead_0000_0000, 1500, 0, 0).unwrap();
    d.offer_tx_chain(200).unwrap();
    let e = recv(&mut p, &mut buf).unwrap_err();
    assert!(e.to_string().contains("outside its memory"), "{e}");
    // A chain that loops on itself ends at the frame's bytes: too long, refused.
    d.write_desc(true, 201, spare, 4096, DESC_NEXT, 201).unwrap();
    d.offer_tx_chain(201).unwrap();
    let e = recv(&mut p, &mut buf).unwrap_err();
    assert!(e.to_string().contains("more than"), "{e}");
    // A write-only descriptor in a transmit chain.
    d.write_desc(true, 202, spare, 100, DESC_WRITE, 0).unwrap();
    d.offer_tx_chain(202).unwrap();
    let e = recv(&mut p, &mut buf).unwrap_err();
    assert!(e.to_string().contains("write-only"), "{e}");
    // A chain shorter than the header.
    d.write_desc(true, 203, spare, 4, 0, 0).unwrap();
    d.offer_tx_chain(203).unwrap();
    let e = recv(&mut p, &mut buf).unwrap_err();
    assert!(e.to_string().contains("shorter"), "{e}");
    assert_eq!(p.counts().bad_tx_chains, 4);
    // Every refused chain went back to the guest.
    assert_eq!(d.tx_used().unwrap(), 4);

    // A read-only receive buffer loses the one frame written into it (posted by hand).
    d.write_desc(false, 0, spare, 2048, 0, 0).unwrap();
    let avail = MEM_BASE + 0x4000;
    d.memory().write_obj(0u16, GuestAddress(avail + 4)).unwrap();
    d.memory().write_obj(1u16, GuestAddress(avail + 2)).unwrap();
    let f = frame(200, 9);
    let until = Instant::now() + WAIT;
    let e = loop {
        match p.send(&out(&f)) {
            Err(e) => break e,
            Ok(TxOutcome::Full) => {
                assert!(Instant::now() < until, "the hand-posted buffer was never seen");
                std::thread::sleep(Duration::from_millis(2));
            }
            Ok(TxOutcome::Sent) => panic!("a read-only buffer took a frame"),
        }
    };
    assert!(e.to_string().contains("read-only"), "{e}");
    assert_eq!(p.counts().bad_rx_buffers, 1);
    // The port still serves a guest that behaves.
    let good = frame(1000, 3);
    assert!(d.send(&[0; 12], &good).unwrap());
    let n = recv(&mut p, &mut buf).unwrap();
    assert_eq!(&buf[VNET_HDR_LEN..VNET_HDR_LEN + n], &good[..]);
}

#[test]
fn a_socket_path_in_use_or_not_a_socket_is_refused_with_what_to_do() {
    let path = sock("inuse");
    let _p = open("vm3", &path, Role::Server, true).unwrap();
    let e = open("vm4", &path, Role::Server, true).err().unwrap();
    assert!(e.to_string().contains("is in use"), "{e}");
    let file = sock("file");
    std::fs::write(&file, b"x").unwrap();
    let e = open("vm5", &file, Role::Server, true).err().unwrap();
    assert!(e.to_string().contains("is not a socket"), "{e}");
    std::fs::remove_file(&file).unwrap();
    let e = open("vm6", std::path::Path::new("/nonexistent-dir/x.sock"), Role::Server, true).err().unwrap();
    assert!(e.to_string().contains("does its directory exist"), "{e}");
}

#[test]
fn in_client_mode_the_port_connects_and_finds_qemu_again() {
    // QEMU's side listens (server=on): here a listener hands each connection to a driver.
    let path = sock("client");
    let _ = std::fs::remove_file(&path);
    let mut p = open("vm7", &path, Role::Client, true).unwrap();
    let listener = vhost::vhost_user::Listener::new(&path, true).unwrap();
    let mut d = Driver::accept(&listener, u64::MAX, WAIT).unwrap();
    connected(&mut p);
    let mut buf = vec![0u8; 70_000];
    let f = frame(700, 1);
    assert!(d.send(&[0; 12], &f).unwrap());
    let n = recv(&mut p, &mut buf).unwrap();
    assert_eq!(&buf[VNET_HDR_LEN..VNET_HDR_LEN + n], &f[..]);
    drop(d);
    // QEMU restarts: the port connects again by itself.
    let mut d = Driver::accept(&listener, u64::MAX, WAIT).unwrap();
    connected(&mut p);
    assert!(d.send(&[0; 12], &f).unwrap());
    let n = recv(&mut p, &mut buf).unwrap();
    assert_eq!(&buf[VNET_HDR_LEN..VNET_HDR_LEN + n], &f[..]);
    drop(p);
    let _ = std::fs::remove_file(&path);
}

/// A connected port and guest for the hostile-ring tests.
fn hostile(tag: &str) -> (VhostUserPort, Driver) {
    let path = sock(tag);
    let mut p = open(tag, &path, Role::Server, true).unwrap();
    let d = Driver::connect(&path, u64::MAX, WAIT).unwrap();
    connected(&mut p);
    (p, d)
}

/// Runs `f` with the port on another thread and gives both back. Fails the test if `f` has
/// not returned within 20 s: the port hangs on what the guest wrote (a bound to detect a
/// hang, not a timing).
fn bounded<T: Send + 'static>(
    p: VhostUserPort,
    f: impl FnOnce(&mut VhostUserPort) -> T + Send + 'static,
) -> (VhostUserPort, T) {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut p = p;
        let r = f(&mut p);
        let _ = tx.send((p, r));
    });
    match rx.recv_timeout(Duration::from_secs(20)) {
        Ok(r) => r,
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            panic!("the port's call has not returned after 20 s: it hangs on the guest's ring")
        }
        Err(e) => panic!("the port's call panicked ({e})"),
    }
}

/// Whether `fd` is readable now.
fn readable(fd: std::os::fd::RawFd) -> bool {
    let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    // SAFETY: one valid pollfd for the duration of the call.
    unsafe { libc::poll(&mut p, 1, 0) == 1 }
}

/// The next frame the guest receives, skipping buffers the port returned empty.
fn recv_frame(d: &mut Driver) -> Vec<u8> {
    let until = Instant::now() + WAIT;
    loop {
        let left = until.saturating_duration_since(Instant::now());
        let r = d.recv_wait(left).unwrap().expect("a frame reached the guest");
        if !r.frame.is_empty() {
            return r.frame;
        }
    }
}

/// Sends `f` until the port takes it (a ring set up again is ready a moment later).
fn send_until_sent(p: &mut VhostUserPort, f: &[u8]) {
    let until = Instant::now() + WAIT;
    loop {
        match p.send(&out(f)) {
            Ok(TxOutcome::Sent) => return,
            r => assert!(Instant::now() < until, "the port never took the frame: {r:?} ({:?})", p.link_state()),
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Waits (bounded) until queue `q` is no longer broken: the frontend set it up again.
fn mended(p: &VhostUserPort, q: usize) {
    let until = Instant::now() + WAIT;
    while p.broken(q).is_some() {
        assert!(Instant::now() < until, "queue {q} still broken after the ring was set up again");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The guest's frame crosses to the switch (transmit queue healthy).
fn crosses_to_switch(p: &mut VhostUserPort, d: &mut Driver, seed: u8) {
    let good = frame(1000, seed);
    assert!(d.send(&[0; 12], &good).unwrap());
    let mut buf = vec![0u8; 70_000];
    let n = recv(p, &mut buf).unwrap();
    assert_eq!(&buf[VNET_HDR_LEN..VNET_HDR_LEN + n], &good[..]);
}

/// The probe's hang: an available index more than the queue's size ahead on the receive
/// ring made the next frame for the guest loop forever. The call returns, the queue is
/// broken (counted once, shown), frames for it are dropped, the transmit queue still
/// works, and setting the ring up again mends it.
#[test]
fn a_receive_index_too_far_ahead_breaks_only_that_queue_until_it_is_set_up_again() {
    let (p, mut d) = hostile("rxidx");
    d.post_rx(8).unwrap();
    let bogus = d.avail_idx(false).wrapping_add(QUEUE_SIZE + 744);
    d.set_avail_idx(false, bogus).unwrap();
    let (mut p, r) = bounded(p, |p| {
        let first = p.send(&out(&frame(1514, 1)));
        let second = p.send(&out(&frame(1514, 2)));
        (first, second)
    });
    for e in [r.0, r.1] {
        let e = e.expect_err("a frame for a broken queue is dropped");
        assert!(e.to_string().contains("receive queue 0"), "{e}");
    }
    let c = p.counts();
    assert_eq!((c.broken_queues, c.to_broken_queue), (1, 2), "{c:?}");
    assert!(p.broken(0).unwrap().contains("ahead"), "{:?}", p.broken(0));
    let state = p.link_state().unwrap();
    assert!(state.contains("receive queue 0 BROKEN") && state.contains("resets its network device"), "{state}");

    crosses_to_switch(&mut p, &mut d, 4);

    // The guest resets its device: QEMU sets the ring up again, and frames reach it.
    d.reset_ring(false).unwrap();
    mended(&p, 0);
    d.post_rx(8).unwrap();
    let f = frame(1514, 5);
    send_until_sent(&mut p, &f);
    assert_eq!(recv_frame(&mut d), f);
    assert_eq!(p.counts().broken_queues, 1);
}

/// The probe's busy loop: an available index too far ahead on the transmit ring made the
/// port wake itself forever. The call returns nothing, the queue is broken, the port's
/// descriptor is quiet, the receive queue still works, and a new set-up mends it.
#[test]
fn a_transmit_index_too_far_ahead_breaks_the_queue_and_the_port_stays_quiet() {
    let (p, mut d) = hostile("txidx");
    let bogus = d.avail_idx(true).wrapping_add(QUEUE_SIZE + 1);
    d.set_avail_idx(true, bogus).unwrap();
    let (mut p, r) = bounded(p, |p| {
        let mut buf = vec![0u8; 70_000];
        (0..3).map(|_| p.recv(&mut buf).map_err(|e| e.to_string())).collect::<Vec<_>>()
    });
    assert!(r.iter().all(|r| matches!(r, Ok(None))), "{r:?}");
    assert!(!readable(p.frames_fd()), "the port keeps waking itself for a broken queue");
    assert_eq!(p.counts().broken_queues, 1);
    assert!(p.link_state().unwrap().contains("transmit queue 0 BROKEN"), "{:?}", p.link_state());
    // The guest's kicks on it are drained and cost nothing more.
    d.kick(true).unwrap();
    let mut buf = vec![0u8; 70_000];
    assert!(matches!(p.recv(&mut buf), Ok(None)));
    assert!(!readable(p.frames_fd()));
    assert_eq!(p.counts().broken_queues, 1, "counted once");

    d.post_rx(4).unwrap();
    let f = frame(700, 6);
    send_until_sent(&mut p, &f);
    assert_eq!(recv_frame(&mut d), f);

    d.reset_ring(true).unwrap();
    mended(&p, 1);
    crosses_to_switch(&mut p, &mut d, 7);
}

/// A descriptor index outside the table (a chain's head, or its `next`) breaks the queue.
#[test]
fn a_descriptor_index_beyond_the_queue_breaks_the_queue() {
    let (p, mut d) = hostile("headidx");
    d.offer_tx_chain(999).unwrap();
    let (mut p, r) = bounded(p, |p| p.recv(&mut vec![0u8; 70_000]).map_err(|e| e.to_string()));
    assert!(matches!(r, Ok(None)), "{r:?}");
    assert!(p.broken(1).unwrap().contains("descriptor 999"), "{:?}", p.broken(1));
    d.reset_ring(true).unwrap();
    mended(&p, 1);
    crosses_to_switch(&mut p, &mut d, 1);

    // On the receive queue, through a descriptor's `next`.
    d.write_desc(false, 0, SPARE, 10, DESC_WRITE | DESC_NEXT, 4000).unwrap();
    d.offer_rx_chain(0).unwrap();
    let (mut p, r) = bounded(p, |p| p.send(&out(&frame(200, 2))).map_err(|e| e.to_string()));
    assert!(r.is_err(), "{r:?}");
    assert!(p.broken(0).unwrap().contains("descriptor 4000"), "{:?}", p.broken(0));
    assert_eq!(p.counts().broken_queues, 2);
    crosses_to_switch(&mut p, &mut d, 3);
}

/// Indirect descriptors are not offered, and a driver that did not accept the feature must
/// not use them (virtio 1.2, 2.7.5.3.1): the first one breaks its queue, and what the guest
/// offers after it costs nothing until the ring is set up again. Never followed (the probe's
/// chain of 65,535 zero-length descriptors behind one).
#[test]
fn an_indirect_descriptor_breaks_its_queue_in_both_directions() {
    use vm_memory::{Bytes, GuestAddress};
    let (p, mut d) = hostile("indirect");
    // A table of 65,535 zero-length descriptors, each chained to the next.
    let n = 65_535u32;
    let mut table = vec![0u8; 16 * n as usize];
    for (i, t) in table.chunks_mut(16).enumerate() {
        t[..8].copy_from_slice(&(SPARE + 0x10_0000).to_le_bytes());
        t[12..14].copy_from_slice(&DESC_NEXT.to_le_bytes());
        t[14..16].copy_from_slice(&(((i + 1) % n as usize) as u16).to_le_bytes());
    }
    d.memory().write_slice(&table, GuestAddress(SPARE)).unwrap();
    d.write_desc(true, 100, SPARE, 16 * n, DESC_INDIRECT, 0).unwrap();
    for _ in 0..50 {
        d.offer_tx_chain(100).unwrap();
    }
    let (mut p, r) = bounded(p, |p| {
        let mut buf = vec![0u8; 70_000];
        (0..50).map(|_| p.recv(&mut buf).map_err(|e| e.to_string())).collect::<Vec<_>>()
    });
    assert!(r.iter().all(|r| matches!(r, Ok(None))), "{r:?}");
    assert!(p.broken(1).unwrap().contains("indirect"), "{:?}", p.broken(1));
    let c = p.counts();
    assert_eq!((c.broken_queues, c.bad_tx_chains), (1, 0), "{c:?}");
    assert_eq!(d.tx_used().unwrap(), 0, "a broken queue is neither read nor written again");
    d.reset_ring(true).unwrap();
    mended(&p, 1);
    crosses_to_switch(&mut p, &mut d, 1);

    // A receive chain behind an indirect descriptor: the queue breaks, the frame is dropped.
    let mut rx_table = [0u8; 16];
    rx_table[..8].copy_from_slice(&(SPARE + 0x10_0000).to_le_bytes());
    rx_table[8..12].copy_from_slice(&2048u32.to_le_bytes());
    rx_table[12..14].copy_from_slice(&DESC_WRITE.to_le_bytes());
    d.memory().write_slice(&rx_table, GuestAddress(SPARE)).unwrap();
    d.write_desc(false, 0, SPARE, 16, DESC_INDIRECT | DESC_WRITE, 0).unwrap();
    d.offer_rx_chain(0).unwrap();
    let (mut p, r) = bounded(p, |p| p.send(&out(&frame(200, 2))).map_err(|e| e.to_string()));
    assert!(r.as_ref().is_err_and(|e| e.contains("receive queue 0") && e.contains("indirect")), "{r:?}");
    assert_eq!((p.counts().broken_queues, p.counts().bad_rx_buffers), (2, 0));
    assert_eq!(d.rx_used().unwrap(), 0);
    assert!(p.link_state().unwrap().contains("receive queue 0 BROKEN"), "{:?}", p.link_state());
    d.reset_ring(false).unwrap();
    mended(&p, 0);
    d.post_rx(4).unwrap();
    let f = frame(300, 3);
    send_until_sent(&mut p, &f);
    assert_eq!(recv_frame(&mut d), f);
}

/// A descriptor of length zero breaks its queue at once, as QEMU and libvhost-user stop a
/// device for one ("zero sized buffers are not allowed"): a loop of them costs the port one
/// descriptor's read, not a chain's bound of them per offer.
#[test]
fn a_zero_length_descriptor_breaks_its_queue_at_once() {
    let (p, mut d) = hostile("zeroloop");
    for i in 0..QUEUE_SIZE {
        d.write_desc(true, i, SPARE, 0, DESC_NEXT, (i + 1) % QUEUE_SIZE).unwrap();
    }
    for _ in 0..100 {
        d.offer_tx_chain(0).unwrap();
    }
    let (mut p, r) = bounded(p, |p| {
        let mut buf = vec![0u8; 70_000];
        (0..100).map(|_| p.recv(&mut buf).map_err(|e| e.to_string())).collect::<Vec<_>>()
    });
    assert!(r.iter().all(|r| matches!(r, Ok(None))), "{r:?}");
    assert!(p.broken(1).unwrap().contains("length 0"), "{:?}", p.broken(1));
    let c = p.counts();
    assert_eq!((c.broken_queues, c.long_chains, c.bad_tx_chains), (1, 0, 0), "{c:?}");
    assert_eq!(d.tx_used().unwrap(), 0);
    // The driver's own slots are descriptors 0..64: write its frame's descriptor anew.
    d.reset_ring(true).unwrap();
    mended(&p, 1);
    crosses_to_switch(&mut p, &mut d, 1);

    // The same loop posted as receive buffers: the queue breaks at the first frame.
    for i in 0..QUEUE_SIZE {
        d.write_desc(false, i, SPARE, 0, DESC_WRITE | DESC_NEXT, (i + 1) % QUEUE_SIZE).unwrap();
    }
    for _ in 0..16 {
        d.offer_rx_chain(0).unwrap();
    }
    let (p, r) =
        bounded(p, |p| (0..3).map(|k| p.send(&out(&frame(200, k))).map_err(|e| e.to_string())).collect::<Vec<_>>());
    assert!(r.iter().all(|r| r.as_ref().is_err_and(|e| e.contains("length 0"))), "{r:?}");
    let c = p.counts();
    assert_eq!((c.broken_queues, c.to_broken_queue, c.long_chains), (2, 3, 0), "{c:?}");
    assert_eq!(d.rx_used().unwrap(), 0);
}

/// A loop of 1-byte descriptors is a chain too long: refused after `MAX_CHAIN_DESCRIPTORS`
/// reads, and nothing is copied out of it or written into it first — here its first
/// descriptor points outside the guest's memory, and the chain is refused for its length,
/// not for that.
#[test]
fn a_chain_too_long_is_refused_before_a_byte_of_it_is_copied() {
    let (p, mut d) = hostile("longloop");
    d.write_desc(true, 0, 0xdead_0000_0000, 1, DESC_NEXT, 1).unwrap();
    for i in 1..QUEUE_SIZE {
        d.write_desc(true, i, SPARE, 1, DESC_NEXT, (i + 1) % QUEUE_SIZE).unwrap();
    }
    d.offer_tx_chain(0).unwrap();
    let (mut p, r) = bounded(p, |p| p.recv(&mut vec![0u8; 70_000]).map_err(|e| e.to_string()));
    assert!(r.as_ref().is_err_and(|e| e.contains(&format!("more than {MAX_CHAIN_DESCRIPTORS} descriptors"))), "{r:?}");
    let c = p.counts();
    assert_eq!((c.long_chains, c.bad_tx_chains, c.broken_queues), (1, 1, 0), "{c:?}");
    assert_eq!(d.tx_used().unwrap(), 1, "the chain went back to the guest");
    d.reset_ring(true).unwrap();
    mended(&p, 1);
    crosses_to_switch(&mut p, &mut d, 1);

    // As receive buffers: the frame is dropped for the chain's length, its chain returned.
    d.write_desc(false, 0, 0xdead_0000_0000, 1, DESC_WRITE | DESC_NEXT, 1).unwrap();
    for i in 1..QUEUE_SIZE {
        d.write_desc(false, i, SPARE, 1, DESC_WRITE | DESC_NEXT, (i + 1) % QUEUE_SIZE).unwrap();
    }
    d.offer_rx_chain(0).unwrap();
    let (p, r) = bounded(p, |p| p.send(&out(&frame(200, 2))).map_err(|e| e.to_string()));
    assert!(r.as_ref().is_err_and(|e| e.contains(&format!("more than {MAX_CHAIN_DESCRIPTORS} descriptors"))), "{r:?}");
    assert_eq!((p.counts().long_chains, p.counts().bad_rx_buffers), (2, 1));
    assert_eq!(d.rx_used().unwrap(), 1);
    assert!(p.broken(0).is_none(), "a chain too long is refused; the queue stays whole");
}

/// With mergeable buffers every receive buffer must hold at least the virtio-net header
/// (virtio 1.2, 5.1.6.3.1): a queue of 1-byte buffers breaks at the first frame, after one
/// buffer's walk — not `MAX_FRAME_CHAINS` of them per frame.
#[test]
fn receive_buffers_smaller_than_the_header_break_the_queue() {
    let (p, mut d) = hostile("tinybufs");
    let posted = 3 * MAX_FRAME_CHAINS as u16 + 8;
    assert_eq!(d.post_rx_sized(posted, 1).unwrap(), posted);
    let (mut p, r) =
        bounded(p, |p| (0..3).map(|k| p.send(&out(&frame(1514, k))).map_err(|e| e.to_string())).collect::<Vec<_>>());
    assert!(r.iter().all(|r| r.as_ref().is_err_and(|e| e.contains("smaller than the 12-byte"))), "{r:?}");
    let c = p.counts();
    assert_eq!((c.broken_queues, c.to_broken_queue, c.small_buffers), (1, 3, 0), "{c:?}");
    assert_eq!(d.rx_used().unwrap(), 0, "no buffer was taken");
    assert!(p.broken(0).unwrap().contains("1-byte receive buffer"), "{:?}", p.broken(0));

    crosses_to_switch(&mut p, &mut d, 6);
    d.reset_ring(false).unwrap();
    mended(&p, 0);
    d.post_rx(8).unwrap();
    let f = frame(1514, 7);
    send_until_sent(&mut p, &f);
    assert_eq!(recv_frame(&mut d), f);
}

/// Buffers of the header's size are allowed, but a 1514-byte frame needs 128 of them: it is
/// dropped after `MAX_FRAME_CHAINS` (its chains returned empty), and while the guest posts
/// no larger buffer, later frames that large are dropped without taking any. A frame that
/// fits still crosses; a queue found short of buffers is full, and is not walked again
/// until the guest moves its available index.
#[test]
fn buffers_too_small_for_a_frame_are_walked_once_not_for_every_frame() {
    use vm_memory::{Bytes, GuestAddress};
    let (p, mut d) = hostile("smallbufs");
    let posted = MAX_FRAME_CHAINS as u16 + 6 + 8;
    assert_eq!(d.post_rx_sized(posted, 12).unwrap(), posted);
    let (p, r) =
        bounded(p, |p| (0..3).map(|k| p.send(&out(&frame(1514, k))).map_err(|e| e.to_string())).collect::<Vec<_>>());
    assert!(r.iter().all(|r| r.as_ref().is_err_and(|e| e.contains("too small"))), "{r:?}");
    assert_eq!(p.counts().small_buffers, 3);
    assert_eq!(d.rx_used().unwrap(), MAX_FRAME_CHAINS as u16, "only the first frame's chains were taken");
    assert!(p.broken(0).is_none());

    // 60 bytes and the header take 6 buffers: the frame crosses.
    let (p, r) = bounded(p, |p| p.send(&out(&frame(60, 4))).map_err(|e| e.to_string()));
    assert_eq!(r, Ok(TxOutcome::Sent));
    assert_eq!(recv_frame(&mut d), frame(60, 4));
    assert_eq!(d.rx_used().unwrap(), MAX_FRAME_CHAINS as u16 + 6);

    // 8 buffers left, a frame needing 18: the queue is full and nothing is taken.
    let (p, r) = bounded(p, |p| p.send(&out(&frame(200, 5))).map_err(|e| e.to_string()));
    assert_eq!(r, Ok(TxOutcome::Full));
    // Kicks without new buffers do not make the port walk the queue again: entries it
    // would read now name no descriptor, and the queue stays whole.
    let avail = MEM_BASE + 0x4000;
    for k in u64::from(MAX_FRAME_CHAINS as u16 + 6)..u64::from(posted) {
        d.memory().write_obj(999u16, GuestAddress(avail + 4 + 2 * k)).unwrap();
    }
    d.kick(false).unwrap();
    let (mut p, r) = bounded(p, |p| p.send(&out(&frame(200, 6))).map_err(|e| e.to_string()));
    assert_eq!(r, Ok(TxOutcome::Full));
    assert!(p.broken(0).is_none(), "the queue was walked again without new buffers");
    assert!(!readable(p.room_fd()), "the kick was drained");

    // Buffers of a real size again (the ring set up anew): frames that large cross.
    d.reset_ring(false).unwrap();
    mended(&p, 0);
    d.post_rx(8).unwrap();
    let f = frame(1514, 7);
    send_until_sent(&mut p, &f);
    assert_eq!(recv_frame(&mut d), f);
}

/// Runs `f` on another thread and gives back what it returns; fails the test if it has not
/// returned within 20 s (a bound to detect a hang, not a timing).
fn within<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(Duration::from_secs(20)) {
        Ok(r) => r,
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => panic!("{what} has not returned after 20 s: a hang"),
        Err(e) => panic!("{what} panicked ({e})"),
    }
}

/// Waits (bounded) until the port has no connection any more.
fn disconnected(p: &VhostUserPort) {
    let until = Instant::now() + WAIT;
    while p.shared().connected() {
        assert!(Instant::now() < until, "the connection was not ended: {:?}", p.link_state());
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The probe's hang: a pipe as a ring's call descriptor filled after 8,192 notifications,
/// and the port's next write into it blocked the datapath. Only eventfds are taken: the
/// message is refused, the connection ended with why, the port's calls keep returning, and
/// a QEMU that behaves connects again.
#[test]
fn a_call_descriptor_that_is_no_eventfd_is_refused_and_never_blocks_the_port() {
    use virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;
    let path = sock("callpipe");
    let mut p = open("vm8", &path, Role::Server, true).unwrap();
    // Without event indexes every chain the port returns signals the guest.
    let mut d = Driver::connect(&path, !(1u64 << VIRTIO_RING_F_EVENT_IDX), WAIT).unwrap();
    connected(&mut p);
    let (_r, w) = std::io::pipe().unwrap();
    // The frontend does not wait for an answer to this message: the refusal shows as the
    // connection's end.
    let _ = d.set_call_fd(true, w.into());
    let (p, d, _) = within("9,000 frames through a pipe as the call descriptor", move || {
        let (mut p, mut d) = (p, d);
        let mut buf = vec![0u8; 70_000];
        let mut sent = 0;
        for i in 0..9000u32 {
            sent += usize::from(d.send(&[0; 12], &frame(60, i as u8)).unwrap_or(false));
            let _ = p.recv(&mut buf);
        }
        (p, d, sent)
    });
    disconnected(&p);
    let why = p.shared().refusal().unwrap_or_default();
    assert!(why.contains("call descriptor of ring 1 is not an eventfd") && why.contains("pipe:["), "{why}");
    assert!(p.link_state().unwrap().contains("ended 1 connections for what the peer sent"), "{:?}", p.link_state());
    drop(d);
    let mut p = p;
    let mut d = Driver::connect(&path, u64::MAX, WAIT).unwrap();
    connected(&mut p);
    crosses_to_switch(&mut p, &mut d, 1);
}

/// The probe's other hang: the peer cleared O_NONBLOCK on its kick eventfd (the same open
/// file as the port's), and the port's next drain of an empty kick blocked. Kicks are read
/// without waiting whatever their flags say, on both kinds of queue.
#[test]
fn kicks_the_peer_made_blocking_never_block_the_port() {
    let (p, mut d) = hostile("kickblock");
    d.make_kick_blocking(true).unwrap();
    d.make_kick_blocking(false).unwrap();
    let (p, r) = bounded(p, |p| {
        let mut buf = vec![0u8; 70_000];
        let rx = (0..3).map(|_| p.recv(&mut buf).map_err(|e| e.to_string())).collect::<Vec<_>>();
        // No receive buffers: Full, after draining the receive queue's kick.
        let tx = (0..3).map(|k| p.send(&out(&frame(100, k))).map_err(|e| e.to_string())).collect::<Vec<_>>();
        (rx, tx)
    });
    assert!(r.0.iter().all(|r| matches!(r, Ok(None))), "{:?}", r.0);
    assert!(r.1.iter().all(|r| matches!(r, Ok(TxOutcome::Full))), "{:?}", r.1);
    // Blocking kicks still wake the port, and frames cross both ways.
    let (p, d) = within("frames with blocking kicks", move || {
        let (mut p, mut d) = (p, d);
        crosses_to_switch(&mut p, &mut d, 2);
        d.post_rx(4).unwrap();
        let f = frame(500, 3);
        send_until_sent(&mut p, &f);
        assert_eq!(recv_frame(&mut d), f);
        (p, d)
    });
    drop((p, d));
}

/// A call eventfd the peer made blocking and filled (it never reads it): the port does not
/// write into it, counts the lost interrupt, and keeps serving.
#[test]
fn a_full_blocking_call_loses_the_interrupt_and_never_blocks_the_port() {
    let (p, mut d) = hostile("callfull");
    d.fill_call(true).unwrap();
    let (p, d) = within("a frame whose call eventfd is full and blocking", move || {
        let (mut p, mut d) = (p, d);
        crosses_to_switch(&mut p, &mut d, 1);
        crosses_to_switch(&mut p, &mut d, 2);
        (p, d)
    });
    assert!(p.counts().lost_calls >= 1, "{:?}", p.counts());
    assert!(p.link_state().unwrap().contains("interrupts lost to a full call eventfd"), "{:?}", p.link_state());
    assert!(p.shared().connected(), "a full call only costs the guest its interrupts");
    drop(d);
}

/// In client mode, a listener that takes each connection and closes it at once (a QEMU
/// restarting, or something that is not QEMU) is not connected to again at once: the port
/// backs off (100 ms doubling to 2 s) — a handful of attempts in 3 s, not thousands.
#[test]
fn in_client_mode_a_listener_that_closes_at_once_is_retried_with_backoff() {
    use std::os::unix::net::UnixListener;
    let path = sock("closer");
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path).unwrap();
    listener.set_nonblocking(true).unwrap();
    let p = open("vm9", &path, Role::Client, true).unwrap();
    let (mut accepted, until) = (0, Instant::now() + Duration::from_secs(3));
    while Instant::now() < until {
        match listener.accept() {
            Ok((s, _)) => {
                accepted += 1;
                drop(s);
            }
            Err(_) => std::thread::sleep(Duration::from_millis(1)),
        }
    }
    assert!((2..=10).contains(&accepted), "{accepted} connections in 3 s");
    drop(p);
    let _ = std::fs::remove_file(&path);
}

/// The socket is made mode 0600 at its creation (under a file-creation mask), never by a
/// change of mode by path afterwards, which would follow a link put in its place: no
/// attribute change is seen on it.
#[test]
fn the_socket_is_created_owner_only_and_never_changed_by_path() {
    let dir = tmp().join("mode");
    std::fs::create_dir_all(&dir).unwrap();
    // SAFETY: no flags; the descriptor is closed below.
    let ino = unsafe { libc::inotify_init1(libc::IN_NONBLOCK) };
    assert!(ino >= 0);
    let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid inotify descriptor and a NUL-terminated path.
    assert!(unsafe { libc::inotify_add_watch(ino, c.as_ptr(), libc::IN_ATTRIB | libc::IN_CREATE) } >= 0);
    let path = dir.join("vm.sock");
    let p = open("vm10", &path, Role::Server, true).unwrap();
    let mode = std::fs::metadata(&path).map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions())).unwrap();
    assert_eq!(mode & 0o777, 0o600);
    let mut buf = [0u8; 4096];
    // SAFETY: `buf` is valid for writes of its length.
    let n = unsafe { libc::read(ino, buf.as_mut_ptr().cast(), buf.len()) };
    let (mut created, mut changed) = (0, 0);
    let mut at = 0usize;
    while n > 0 && at + 16 <= n as usize {
        let mask = u32::from_ne_bytes(buf[at + 4..at + 8].try_into().unwrap());
        let len = u32::from_ne_bytes(buf[at + 12..at + 16].try_into().unwrap()) as usize;
        created += usize::from(mask & libc::IN_CREATE != 0);
        changed += usize::from(mask & libc::IN_ATTRIB != 0);
        at += 16 + len;
    }
    // SAFETY: closing the descriptor opened above.
    unsafe { libc::close(ino) };
    drop(p);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!((created, changed), (1, 0), "the socket's mode was changed by path after it was made");
}

/// With a group for the allowed peers, the socket is made mode 0660 and that group's at its
/// creation (the bind runs with the thread's file-system group id set to it), never changed
/// by path afterwards; a switch that is not root may not take another group and keeps 0600.
#[test]
fn the_socket_is_created_with_the_allowed_group_when_the_switch_may_give_it() {
    use std::os::unix::fs::MetadataExt;
    let dir = tmp().join("group");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("vm.sock");
    let allow = sluice_vhost::Allow { users: vec![], groups: vec![65534], socket_group: Some(65534) };
    let p = sluice_vhost::open_allowing("vm11", &path, Role::Server, true, &allow).unwrap();
    let m = std::fs::symlink_metadata(&path).unwrap();
    // SAFETY: geteuid and getegid have no preconditions.
    let (root, egid) = unsafe { (libc::geteuid() == 0, libc::getegid()) };
    if root {
        assert_eq!((m.mode() & 0o777, m.gid()), (0o660, 65534));
    } else {
        assert_eq!((m.mode() & 0o777, m.gid()), (0o600, egid));
    }
    // The thread that bound it creates files as before.
    let f = dir.join("after");
    std::fs::write(&f, b"").unwrap();
    assert_eq!(std::fs::metadata(&f).unwrap().gid(), egid);
    drop(p);
    let _ = std::fs::remove_dir_all(&dir);
}

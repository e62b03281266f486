//! The port driven by a guest without a VM: rust-vmm's frontend over a temporary socket,
//! guest memory in a memfd, queues filled by `sluice_vhost::driver` as a virtio-net driver
//! fills them. Features, frames both ways (whole GSO frames, mergeable buffers), `Full`
//! when the guest posts no buffers, hostile descriptors, the socket's checks, reconnection
//! in both roles.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use sluice_switch::{OutFrame, Port, PortError, TxOutcome};
use sluice_vhost::driver::{DESC_NEXT, DESC_WRITE, Driver, MEM_BASE};
use sluice_vhost::{OFFERED_FEATURES, Role, VhostUserPort, open};
use sluice_wire::VNET_HDR_LEN;

const WAIT: Duration = Duration::from_secs(5);

fn sock(tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!("sluice-vhost-{tag}-{}.sock", std::process::id()))
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
    // A chain that loops on itself ends at the queue's length: too long, refused.
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
    // A head beyond the queue: an empty chain, refused too.
    d.offer_tx_chain(999).unwrap();
    assert!(recv(&mut p, &mut buf).is_err());
    assert_eq!(p.counts().bad_tx_chains, 5);
    // Every refused chain went back to the guest, but the one whose head is not a
    // descriptor of the queue (there is no such chain to return).
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

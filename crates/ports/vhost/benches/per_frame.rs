//! The per-frame cost of the vhost-user path, without a VM, against a TAP's in the same
//! run (issue 20): `cargo bench -p sluice-vhost --bench per_frame` (as root: it makes a
//! TAP, `sbv<pid>`, and removes it when done).
//!
//! Each path moves frames one way in batches of 32 on one thread, both ends included:
//! - vhost-user, guest → switch: the guest driver queues a frame (kicking only when the
//!   device asked, event index) and the port takes it (`VhostUserPort::recv`);
//! - vhost-user, switch → guest: the port writes it into a posted buffer (`send`) and the
//!   driver takes it from the used ring;
//! - TAP, guest → switch: an AF_PACKET socket sends on the TAP interface (as the kernel's
//!   stack or QEMU's TAP backend hands a frame to the TAP) and the switch reads the TAP
//!   descriptor (one `read`, with a virtio-net header);
//! - TAP, switch → guest: one `write` to the TAP descriptor, and the AF_PACKET socket reads.
//!
//! The numbers are CPU time per frame on this machine (one thread, wall clock ≈ CPU);
//! compare the paths within one run only.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

use sluice_switch::{OutFrame, Port, TxOutcome};
use sluice_vhost::driver::Driver;
use sluice_vhost::{Role, open};
use sluice_wire::VNET_HDR_LEN;

const BATCH: usize = 32;
const RUN: Duration = Duration::from_secs(2);
const ETHERTYPE: u16 = 0x88b5; // local experimental: the kernel's stack ignores it

fn frame(len: usize) -> Vec<u8> {
    let mut f = vec![0x5au8; len];
    f[..6].copy_from_slice(&[0x02, 0, 0, 0, 0, 2]);
    f[6..12].copy_from_slice(&[0x02, 0, 0, 0, 0, 1]);
    f[12..14].copy_from_slice(&ETHERTYPE.to_be_bytes());
    f
}

/// Runs `batch` (which moves BATCH frames) for RUN; nanoseconds per frame.
fn measure(mut batch: impl FnMut()) -> f64 {
    for _ in 0..100 {
        batch();
    }
    let start = Instant::now();
    let mut frames = 0u64;
    while start.elapsed() < RUN {
        batch();
        frames += BATCH as u64;
    }
    start.elapsed().as_nanos() as f64 / frames as f64
}

fn check(r: libc::c_int, what: &str) -> io::Result<libc::c_int> {
    if r < 0 { Err(io::Error::other(format!("{what}: {}", io::Error::last_os_error()))) } else { Ok(r) }
}

/// A TAP with virtio-net headers (as sluice opens its TAPs), up, IPv6 off; and an
/// AF_PACKET socket on it for the other end.
fn tap(name: &str) -> io::Result<(OwnedFd, OwnedFd)> {
    // SAFETY: a NUL-terminated path; the descriptor is owned by the OwnedFd below.
    let fd = check(unsafe { libc::open(c"/dev/net/tun".as_ptr(), libc::O_RDWR | libc::O_NONBLOCK) }, "/dev/net/tun")?;
    // SAFETY: `fd` was just opened and is owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: ifreq is plain data; all zeroes is a valid value.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in ifr.ifr_name.iter_mut().zip(name.bytes()) {
        *d = s as libc::c_char;
    }
    ifr.ifr_ifru.ifru_flags = (libc::IFF_TAP | libc::IFF_NO_PI | libc::IFF_VNET_HDR) as libc::c_short;
    // SAFETY: TUNSETIFF reads and writes one ifreq, valid for the call.
    check(unsafe { libc::ioctl(fd.as_raw_fd(), libc::TUNSETIFF, &mut ifr) }, "TUNSETIFF")?;
    let hdr: libc::c_int = VNET_HDR_LEN as libc::c_int;
    // SAFETY: TUNSETVNETHDRSZ reads one int, valid for the call.
    check(unsafe { libc::ioctl(fd.as_raw_fd(), libc::TUNSETVNETHDRSZ, &hdr) }, "TUNSETVNETHDRSZ")?;
    let sh = |c: &str| std::process::Command::new("sh").args(["-c", c]).status();
    sh(&format!("sysctl -qw net.ipv6.conf.{name}.disable_ipv6=1; ip link set {name} mtu 9000 up"))?;
    let proto = (libc::ETH_P_ALL as u16).to_be() as i32;
    // SAFETY: plain socket call; the descriptor is owned by the OwnedFd below.
    let p = check(unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_NONBLOCK, proto) }, "AF_PACKET")?;
    // SAFETY: `p` was just made and is owned by nothing else.
    let p = unsafe { OwnedFd::from_raw_fd(p) };
    let size: libc::c_int = 8 << 20;
    // SAFETY: SO_RCVBUFFORCE reads one int, valid for the call (root may exceed rmem_max).
    check(
        unsafe {
            libc::setsockopt(
                p.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVBUFFORCE,
                (&size as *const libc::c_int).cast(),
                4,
            )
        },
        "SO_RCVBUFFORCE",
    )?;
    // SAFETY: sockaddr_ll is plain data; all zeroes is a valid value.
    let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    sll.sll_family = libc::AF_PACKET as u16;
    sll.sll_protocol = proto as u16;
    // SAFETY: a NUL-terminated name.
    sll.sll_ifindex = unsafe { libc::if_nametoindex(format!("{name}\0").as_ptr().cast()) } as i32;
    // SAFETY: `sll` is a valid sockaddr_ll for the length given.
    check(
        unsafe {
            libc::bind(p.as_raw_fd(), (&sll as *const libc::sockaddr_ll).cast(), size_of::<libc::sockaddr_ll>() as u32)
        },
        "bind",
    )?;
    Ok((fd, p))
}

fn rw(fd: RawFd, buf: &[u8]) -> isize {
    // SAFETY: `buf` is valid for reads of its length.
    unsafe { libc::write(fd, buf.as_ptr().cast(), buf.len()) }
}

fn rd(fd: RawFd, buf: &mut [u8]) -> isize {
    // SAFETY: `buf` is valid for writes of its length.
    unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) }
}

/// Reads BATCH frames from `fd` (non-blocking), giving up after a second without one.
fn read_batch(fd: RawFd, buf: &mut [u8], what: &str) {
    let mut n = 0;
    let mut last = Instant::now();
    while n < BATCH {
        if rd(fd, buf) > 0 {
            n += 1;
            last = Instant::now();
        } else {
            assert!(last.elapsed() < Duration::from_secs(1), "{what}: a frame was lost ({n} of {BATCH} read)");
        }
    }
}

/// A fresh directory of this process's own (`mkdtemp`).
fn mkdtemp(prefix: &str) -> std::path::PathBuf {
    use std::os::unix::ffi::OsStringExt;
    let mut t = std::env::temp_dir().join(format!("{prefix}.XXXXXX")).into_os_string().into_vec();
    t.push(0);
    // SAFETY: `t` is a NUL-terminated template that mkdtemp rewrites in place.
    let p = unsafe { libc::mkdtemp(t.as_mut_ptr().cast()) };
    assert!(!p.is_null(), "mkdtemp: {}", std::io::Error::last_os_error());
    t.pop();
    std::path::PathBuf::from(std::ffi::OsString::from_vec(t))
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return; // (cargo test --benches lists; nothing to list)
    }
    let dir = mkdtemp("sluice-bench-vhost");
    let path = dir.join("vm.sock");
    let mut port = open("bench", &path, Role::Server, true).expect("opening the vhost-user port");
    let mut d = Driver::connect(&path, u64::MAX, Duration::from_secs(5)).expect("connecting the driver");
    let until = Instant::now() + Duration::from_secs(5);
    while !port.rx_ready() {
        assert!(Instant::now() < until, "the port never saw the driver's queues");
        std::thread::sleep(Duration::from_millis(5));
    }
    let tap_name = format!("sbv{}", std::process::id() % 100_000);
    let taps = tap(&tap_name);
    let mut buf = vec![0u8; 70_000];
    let mut rows = vec![];
    for len in [64usize, 1514, 9014] {
        let f = frame(len);
        let out = OutFrame { vnet: [0; VNET_HDR_LEN], macs: &f[..12], tag: None, rest: &f[12..] };
        let vu_in = measure(|| {
            for _ in 0..BATCH {
                assert!(d.send(&[0; 12], &f).unwrap(), "transmit slots");
            }
            for _ in 0..BATCH {
                port.recv(&mut buf).unwrap().expect("a frame");
            }
        });
        let vu_out = measure(|| {
            d.fill_rx().unwrap();
            for _ in 0..BATCH {
                assert_eq!(port.send(&out).unwrap(), TxOutcome::Sent);
            }
            for _ in 0..BATCH {
                d.recv().unwrap().expect("a frame");
            }
        });
        let (tap_in, tap_out) = match &taps {
            Ok((t, p)) => {
                let mut hdr_frame = vec![0u8; VNET_HDR_LEN];
                hdr_frame.extend_from_slice(&f);
                let (t, p) = (t.as_raw_fd(), p.as_raw_fd());
                let tin = measure(|| {
                    for _ in 0..BATCH {
                        assert!(rw(p, &f) > 0, "AF_PACKET send: {}", io::Error::last_os_error());
                    }
                    read_batch(t, &mut buf, "TAP read");
                });
                let tout = measure(|| {
                    for _ in 0..BATCH {
                        assert!(rw(t, &hdr_frame) > 0, "TAP write: {}", io::Error::last_os_error());
                    }
                    read_batch(p, &mut buf, "AF_PACKET read");
                });
                (Some(tin), Some(tout))
            }
            Err(_) => (None, None),
        };
        rows.push((len, vu_in, vu_out, tap_in, tap_out));
    }
    if let Err(e) = &taps {
        eprintln!("(no TAP to compare with: {e}; run as root)");
    }
    drop(taps);
    drop(port);
    let _ = std::fs::remove_dir_all(&dir);
    println!("| frame (bytes) | path | guest → switch (ns/frame) | switch → guest (ns/frame) |");
    println!("|---:|---|---:|---:|");
    let f = |x: Option<f64>| x.map_or("-".into(), |v| format!("{v:.0}"));
    for (len, vi, vo, ti, to) in &rows {
        println!("| {len} | vhost-user | {vi:.0} | {vo:.0} |");
        println!("| {len} | TAP | {} | {} |", f(*ti), f(*to));
        if let (Some(ti), Some(to)) = (ti, to) {
            println!("| {len} | TAP ÷ vhost-user | {:.2}× | {:.2}× |", ti / vi, to / vo);
        }
    }
}
